"""Suite-wide settings: offline hubs, Spark workers that use this interpreter, and the groups of the
parallel run."""

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
if os.environ.get("PYTEST_XDIST_WORKER"):
    # one compute thread per xdist worker (and its subprocesses): with two workers on two cores,
    # OpenMP's second thread waits for a core the other worker holds, and every small torch op then
    # costs milliseconds (tests/trainer/test_fp8.py: 54 s with 2 threads on a busy machine, 8 s with 1)
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
_bindir = os.path.dirname(sys.executable)
if _bindir not in os.environ.get("PATH", "").split(os.pathsep):
    # spark-submit, torchrun and friends live beside the interpreter
    os.environ["PATH"] = _bindir + os.pathsep + os.environ.get("PATH", "")


SPARK_SUBMIT_CONF_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spark-submit-conf")


def short_spark_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's) for a subprocess that runs a short Spark application: its JVMs
    take the JIT and GC options of tests/spark-submit-conf/ (C1 only, serial GC: half the CPU) unless
    SPARK_CONF_DIR is set already."""
    out = dict(os.environ if env is None else env)
    out.setdefault("SPARK_CONF_DIR", SPARK_SUBMIT_CONF_DIR)
    return out


def sigkill_when(proc, ready, timeout_s: float = 600, poll_s: float = 0.05):
    """Poll `ready()` while `proc` (started with start_new_session=True) runs; when it returns
    something true, SIGKILL the process group (the driver, its JVMs and Python workers) and
    return that value. None if `proc` ended or `timeout_s` passed first; the group is killed and
    reaped either way."""
    import signal
    import time

    got = None
    try:
        deadline = time.time() + timeout_s
        while time.time() < deadline and proc.poll() is None:
            got = ready()
            if got:
                os.killpg(proc.pid, signal.SIGKILL)
                break
            time.sleep(poll_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    return got


# `make test` runs the suite on 2 pytest-xdist workers with `--dist loadscope`, whose scopes are these
# groups: a module's tests stay on one worker (its module fixtures, a Spark session or a server, start
# once), and whole packages whose session fixtures are costly form one group: the demo tests (the
# README commands write into the ci-size demo run the chain tests read), the trainer's shard sets and
# trained run, proxy_eval's and mixtures' prepared runs, synth's PostgreSQL and MariaDB servers.
# (A scheduler of our own: `--dist loadgroup`'s xdist_group marks do not take effect under pytest 9.)
PACKAGE_GROUPS = ("tests/demo/", "tests/trainer/", "tests/proxy_eval/", "tests/mixtures/", "tests/synth/domains/")


# The workers take the groups longest first (the longest-processing-time rule), so that no long group starts
# near the end while the other worker runs out of work. Seconds a group took in `make test` on 2 cores
# (2026-12-01, before the Spark JIT settings); only the order they give matters. A group not listed counts
# as 0.5 s a test: xdist's own order (most tests first) sent the demo group (12 tests, 555 s) to a worker at
# minute 6 and kaiyuan's spark-submit module (3 tests, 370 s) at minute 13, and the run ended 100 s apart.
GROUP_SECONDS = {
    "tests/demo": 555, "tests/kaiyuan/test_submit.py": 370, "tests/trainer": 290, "tests/mixtures": 220,
    "tests/kaiyuan/test_spark_jobs.py": 135, "tests/synth/domains": 127, "tests/proxy_eval": 108,
    "tests/storage/test_s3_pipeline.py": 82, "tests/synth/test_readme_scripted.py": 73,
    "tests/synth/test_engine.py": 72, "tests/synth/test_cli.py": 47, "tests/storage/test_commit_protocol.py": 35,
    "tests/synth/test_engine_issue14.py": 34, "tests/kaiyuan/test_classifier.py": 28,
}


def xdist_group_of(nodeid: str) -> str:
    """The group of a test: its package for PACKAGE_GROUPS, else its module."""
    module = nodeid.split("::", 1)[0]
    return next((prefix.rstrip("/") for prefix in PACKAGE_GROUPS if module.startswith(prefix)), module)


def group_seconds(group: str, n_tests: int) -> float:
    """The expected time of a group: measured (GROUP_SECONDS) or 0.5 s a test."""
    return GROUP_SECONDS.get(group, 0.5 * n_tests)


@pytest.hookimpl(optionalhook=True)           # a hook of pytest-xdist: unknown without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        _ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

        def _assign_work_unit(self, node) -> None:
            # the queue is complete before the first assignment: order it longest first, once
            if not self._ordered:
                queue = sorted(self.workqueue.items(), key=lambda kv: -group_seconds(kv[0], len(kv[1])))
                self.workqueue.clear()
                self.workqueue.update(queue)
                self._ordered = True
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)
