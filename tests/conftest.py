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


# `make test` runs the suite on 2 pytest-xdist workers with `--dist loadscope`, whose scopes are these
# groups: a module's tests stay on one worker (its module fixtures, a Spark session or a server, start
# once), and whole packages whose session fixtures are costly form one group: the demo tests (the
# README commands write into the ci-size demo run the chain tests read), the trainer's shard sets and
# trained run, proxy_eval's and mixtures' prepared runs, synth's PostgreSQL and MariaDB servers.
# (A scheduler of our own: `--dist loadgroup`'s xdist_group marks do not take effect under pytest 9.)
PACKAGE_GROUPS = ("tests/demo/", "tests/trainer/", "tests/proxy_eval/", "tests/mixtures/", "tests/synth/domains/")


def xdist_group_of(nodeid: str) -> str:
    """The group of a test: its package for PACKAGE_GROUPS, else its module."""
    module = nodeid.split("::", 1)[0]
    return next((prefix.rstrip("/") for prefix in PACKAGE_GROUPS if module.startswith(prefix)), module)


@pytest.hookimpl(optionalhook=True)           # a hook of pytest-xdist: unknown without it
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid)

    return GroupScheduling(config, log)
