"""purokit.sandbox: the verdicts a code benchmark and a code verifier rely on."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from purokit import sandbox
from purokit.sandbox import (SandboxJob, SandboxLimits, isolation_status, network_namespace_prefix, run_many,
                            run_python)

FAST = SandboxLimits(timeout_s=5, memory_mb=512)


def test_correct_solution_passes():
    v = run_python("def add(a, b):\n    return a + b\n", tests="assert add(2, 3) == 5\nprint('ok')", limits=FAST)
    assert v.status == "passed", v
    assert v.returncode == 0
    assert "ok" in v.stdout_tail


def test_wrong_solution_fails_with_assertion_in_stderr():
    v = run_python("def add(a, b):\n    return a - b\n", tests="assert add(2, 3) == 5", limits=FAST)
    assert v.status == "failed"
    assert "AssertionError" in v.stderr_tail


def test_syntax_error_and_exception_are_errors():
    v = run_python("def add(a, b)\n    return a + b\n", tests="assert add(1, 1) == 2", limits=FAST)
    assert v.status == "error"
    assert "SyntaxError" in v.stderr_tail
    v = run_python("def f():\n    return 1 / 0\n", tests="f()", limits=FAST)
    assert v.status == "error" and "ZeroDivisionError" in v.detail


def test_infinite_loop_times_out():
    v = run_python("while True:\n    pass\n", limits=SandboxLimits(timeout_s=1.5, memory_mb=256))
    assert v.status == "timeout", v
    assert v.duration_s < 10


def test_sleeping_forever_times_out_on_wall_clock():
    v = run_python("import time\ntime.sleep(60)\n", limits=SandboxLimits(timeout_s=1.0, memory_mb=256))
    assert v.status == "timeout"
    assert "wall-clock" in v.detail


def test_memory_hog_is_killed():
    v = run_python("x = bytearray(2 * 1024 ** 3)\n", limits=SandboxLimits(timeout_s=5, memory_mb=256))
    assert v.status == "oom", v
    v = run_python("xs = []\nwhile True:\n    xs.append('x' * 10_000_000)\n",
                   limits=SandboxLimits(timeout_s=10, memory_mb=256))
    assert v.status == "oom", v


def test_network_is_blocked():
    code = (
        "import socket\n"
        "s = socket.create_connection(('1.1.1.1', 80), timeout=2)\n"
    )
    v = run_python(code, limits=FAST)
    assert v.status == "error"
    assert "sandbox" in v.stderr_tail or "Network is unreachable" in v.stderr_tail
    v = run_python("import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)\n", limits=FAST)
    assert v.status == "error"


def test_network_namespace_blocks_even_native_code():
    if network_namespace_prefix() is None:
        pytest.skip("no unprivileged network namespaces on this kernel")
    # a child process (allowed here) that bypasses the audit hook still has no network
    code = (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-c', 'import socket; socket.create_connection((\"1.1.1.1\", 80), timeout=2)'],"
        " capture_output=True, text=True)\n"
        "assert r.returncode != 0, r\n"
        "assert 'unreachable' in r.stderr.lower() or 'errno' in r.stderr.lower(), r.stderr\n"
    )
    v = run_python(code, limits=SandboxLimits(timeout_s=10, memory_mb=1024, allow_subprocess=True))
    assert v.status == "passed", v
    assert v.network_isolated


def test_subprocess_blocked_by_default():
    v = run_python("import os\nos.system('echo hi')\n", limits=FAST)
    assert v.status == "error"
    assert "not allowed" in v.stderr_tail


def test_clean_env_and_fresh_directory():
    code = (
        "import os\n"
        "assert 'SECRET_TOKEN' not in os.environ\n"
        "assert set(os.listdir('.')) <= {'solution.py', 'tests.py', '_runner.py', '_stdout.txt', '_stderr.txt'}\n"
        "open('scratch.txt', 'w').write('x')\n"
        "print(os.getcwd())\n"
    )
    import os
    os.environ["SECRET_TOKEN"] = "do-not-leak"
    try:
        v1 = run_python(code, limits=FAST)
        v2 = run_python(code, limits=FAST)
    finally:
        del os.environ["SECRET_TOKEN"]
    assert v1.status == v2.status == "passed", (v1, v2)
    d1, d2 = v1.stdout_tail.strip(), v2.stdout_tail.strip()
    assert d1 != d2
    assert not os.path.exists(d1)   # removed afterwards


def test_extra_files_are_importable_and_cannot_escape():
    v = run_python("from helper import K\n", tests="assert K == 7", files={"helper.py": "K = 7\n"}, limits=FAST)
    assert v.status == "passed", v
    with pytest.raises(ValueError):
        run_python("pass", files={"../evil.py": "x"}, limits=FAST)


@pytest.mark.parametrize("exit_call", [
    "exit()", "quit(0)", "raise SystemExit", "import sys\nsys.exit(0)", "import sys\nsys.exit(3)",
    "import os\nos._exit(0)", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)"])
def test_exits_before_the_tests_end_fail(exit_call):
    # the solution stops the run before its (failing) tests: it must not pass
    v = run_python("def add(a, b):\n    return a - b\n" + exit_call + "\n", tests="assert add(2, 3) == 5", limits=FAST)
    assert not v.passed and v.status in ("error", "oom"), v     # a SIGKILL reads as the kernel's OOM kill
    assert "before the tests" in v.detail or "SIGKILL" in v.detail
    # the same exits inside the tests fail too
    v = run_python("def add(a, b):\n    return a + b\n", tests="assert add(2, 3) == 5\n" + exit_call + "\nassert add(1, 1) == 2",
                   limits=FAST)
    assert not v.passed and v.status in ("error", "oom"), v


@pytest.mark.parametrize("patch", [
    "import builtins\nbuiltins.exec = lambda *a, **k: None",
    "import builtins\nbuiltins.compile = lambda *a, **k: compile('pass', 'x', 'exec')",
    "import builtins\nbuiltins.open = lambda *a, **k: __import__('io').StringIO('')",
    "__builtins__['abs'] = lambda x: 0",
    "import builtins\nbuiltins.abs = lambda x: 0",
    "import builtins\nbuiltins.AssertionError = KeyError",
])
def test_patched_builtins_do_not_make_tests_pass(patch):
    v = run_python("def half(x):\n    return x\n" + patch + "\n", tests="assert abs(half(4) - 2) < 1e-9", limits=FAST)
    assert v.status == "failed", v


def test_run_many_keeps_order():
    jobs = [SandboxJob(code=f"x = {i}", tests=f"assert x == {i if i % 2 == 0 else -1}", limits=FAST) for i in range(4)]
    verdicts = run_many(jobs, max_workers=2)
    assert [v.status for v in verdicts] == ["passed", "failed", "passed", "failed"]


# ---- the escapes of issue 21: each blocked by the namespaces alone and by the audit hook alone --------

NS = pytest.mark.skipif(isolation_status()["mode"] != "namespaces",
                        reason=f"no kernel namespaces here: {isolation_status()['reason']} (install bubblewrap)")
LAYERS = [pytest.param(SandboxLimits(timeout_s=5, memory_mb=512), id="both-layers"),
          pytest.param(SandboxLimits(timeout_s=5, memory_mb=512, audit_hook=False), id="namespaces-only", marks=NS)]


def _strays(marker: str) -> list[int]:
    """Host processes whose command line carries `marker`, after a short grace for the kernel to reap."""
    deadline = time.monotonic() + 2.0
    while True:
        found = []
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    if marker.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                        found.append(int(d))
                except OSError:
                    pass
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.mark.parametrize("limits", LAYERS)
def test_files_outside_the_work_dir_cannot_be_written_or_deleted(limits, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.chmod(tmp_path, 0o777)
    os.chmod(victim, 0o666)
    target = tmp_path / "planted.txt"
    for code in (f"open({str(target)!r}, 'w').write('x')", f"import os\nos.remove({str(victim)!r})",
                 f"import shutil\nshutil.rmtree({str(tmp_path)!r})", f"open({str(victim)!r}, 'a').write('x')",
                 "open('/usr/planted.txt', 'w').write('x')"):
        v = run_python(code, limits=limits)
        assert v.status == "error", (code, v)
    assert victim.read_text() == "keep" and not target.exists() and not Path("/usr/planted.txt").exists()
    # inside the work dir (and /tmp) writing is fine
    assert run_python("open('scratch.txt', 'w').write('x')\nimport os\nos.remove('scratch.txt')", limits=limits).passed


@pytest.mark.parametrize("limits", LAYERS)
def test_the_callers_environment_cannot_be_read_through_proc(limits, monkeypatch):
    monkeypatch.setenv("PUROKIT_SECRET", "s3cr3t-value")
    code = (
        "import os\n"
        "seen = []\n"
        f"for pid in {{os.getppid(), 1, {os.getpid()}, {os.getppid()}}}:\n"
        "    try:\n"
        "        seen.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError as e:\n"
        "        print('refused', pid, e)\n"
        "print(b's3cr3t' in b''.join(seen))\n"
        "assert b's3cr3t' not in b''.join(seen)\n"
    )
    v = run_python(code, limits=limits)
    assert "s3cr3t" not in v.stdout_tail + v.stderr_tail
    assert v.status == "passed", v


@pytest.mark.parametrize("limits", LAYERS)
def test_ctypes_system_and_fork_do_not_escape(limits, tmp_path):
    os.chmod(tmp_path, 0o777)
    planted = tmp_path / "by-system.txt"
    v = run_python(f"import ctypes\nctypes.CDLL(None).system(b'touch {planted}')", limits=limits)
    assert not planted.exists(), v
    code = ("import ctypes, os\n"
            "libc = ctypes.CDLL(None)\n"
            "if libc.fork() == 0:\n"
            "    libc.execv(b'/bin/sleep', (ctypes.c_char_p * 3)(b'sleep', b'97.31', None))\n"
            "    os._exit(0)\n")
    v = run_python(code, limits=limits)
    if limits.audit_hook:
        assert v.status == "error" and "not allowed" in v.stderr_tail, v
    assert _strays("97.31") == []


@pytest.mark.parametrize("limits", LAYERS)
def test_spawnv_passfds_does_not_escape(limits):
    code = ("import multiprocessing.util as u\n"
            "u.spawnv_passfds('/bin/sleep', ['sleep', '97.32'], ())\n")
    v = run_python(code, limits=limits)
    if limits.audit_hook:
        assert v.status == "error" and "not allowed" in v.stderr_tail, v
    assert _strays("97.32") == []


@NS
def test_a_fork_bomb_hits_the_process_limit():
    code = ("import os, time\n"
            "n = 0\n"
            "for _ in range(30):\n"
            "    if os.fork() == 0:\n"
            "        time.sleep(30)\n"
            "        os._exit(0)\n"
            "    n += 1\n"
            "print('forked', n)\n")
    v = run_python(code, limits=SandboxLimits(timeout_s=5, memory_mb=512, allow_subprocess=True, max_processes=16))
    assert v.status == "error" and "Resource temporarily unavailable" in v.stderr_tail, v
    assert "forked 30" not in v.stdout_tail
    v = run_python(code, limits=FAST)     # the audit hook refuses the first fork
    assert v.status == "error" and "not allowed" in v.stderr_tail


@NS
def test_no_child_outlives_the_verdict():
    code = ("import subprocess, os\n"
            "subprocess.Popen(['sleep', '97.33'], start_new_session=True)\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    os.execv('/bin/sleep', ['sleep', '97.34'])\n")
    v = run_python(code, tests="assert True", limits=SandboxLimits(timeout_s=5, memory_mb=512, allow_subprocess=True))
    assert v.passed, v
    assert v.duration_s < 60         # the verdict did not wait for the children (they sleep 97 s)
    assert _strays("97.33") == [] and _strays("97.34") == []


@NS
def test_proc_shows_only_the_sandbox_and_the_root_is_read_only():
    code = ("import os\n"
            "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "assert len(pids) <= 3, pids\n"
            "assert not os.path.exists(os.path.expanduser('~root/.bashrc')) or os.getuid() != 0\n"
            "for d in ('/usr', '/etc', '/'):\n"
            "    try:\n"
            "        open(os.path.join(d, 'x'), 'w')\n"
            "    except OSError:\n"
            "        continue\n"
            "    raise SystemError(d + ' is writable')\n")
    v = run_python(code, limits=SandboxLimits(timeout_s=5, memory_mb=512, audit_hook=False))
    assert v.passed, v
    assert v.isolation == "namespaces" and v.network_isolated


@pytest.mark.parametrize("hook", [True, pytest.param(False, marks=NS)])
def test_killing_the_caller_does_not_reach_it(hook):
    # run in a helper process, so that a failure kills the helper, not the test session
    code = (f"import os, signal\nfor pid in (os.getppid(), {os.getpid()}):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print(e)\n")
    helper = ("import sys\nfrom purokit.sandbox import SandboxLimits, run_python\n"
              f"v = run_python({code!r}, limits=SandboxLimits(timeout_s=5, memory_mb=512, audit_hook={hook}))\n"
              "print('helper alive', v.status)\n")
    r = subprocess.run([sys.executable, "-c", helper], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and "helper alive" in r.stdout, (r.returncode, r.stdout, r.stderr)


def test_fallback_without_namespaces_is_loud_and_the_hook_still_holds(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "_namespaces_problem", lambda python: "bwrap missing (simulated)")
    sandbox._warn_fallback.cache_clear()
    with pytest.warns(sandbox.SandboxIsolationWarning, match="simulated"):
        v = run_python("x = 1", tests="assert x == 1", limits=FAST)
    assert v.passed and v.isolation in ("network", "none")
    assert isolation_status()["reason"] == "bwrap missing (simulated)"
    target = tmp_path / "planted.txt"
    v = run_python(f"open({str(target)!r}, 'w').write('x')", limits=FAST)
    assert v.status == "error" and not target.exists()
    assert run_python("exit()", tests="assert False", limits=FAST).status == "error"
    with pytest.raises(sandbox.SandboxUnavailable, match="simulated"):
        run_python("pass", limits=SandboxLimits(require_namespaces=True))


def test_fallback_runs_in_its_work_directory_and_cannot_reach_the_verdict_files(monkeypatch):
    """Without namespaces the code starts in the work directory, as bubblewrap's --chdir puts it: it sees only its
    own files, and the folders beside it (the inputs, and out/ with the result file) are outside the audit hook's
    writable root."""
    monkeypatch.setattr(sandbox, "_namespaces_problem", lambda python: "bwrap missing (simulated)")
    sandbox._warn_fallback.cache_clear()
    listing = "import os\nprint(sorted(os.listdir('.')))\n"
    with pytest.warns(sandbox.SandboxIsolationWarning):
        v = run_python(listing, limits=FAST)
    assert v.passed, v
    assert set(eval(v.stdout_tail.strip())) <= {"solution.py", "tests.py", "_runner.py", "_stdout.txt", "_stderr.txt"}
    v = run_python("open('../out/result', 'wb').write(b'x')", limits=FAST)
    assert v.status == "error", v


# ---- the value channel: results cross the boundary as plain data ---------------------------------

def test_values_come_back_as_exact_plain_data():
    from purokit.sandbox import run_python_values
    code = "def f():\n    return {'a': [1, 2.5, (3, b'x')], 's': {1, 2}, 'n': None, 'c': 1+2j, 'big': 2**100, 't': True}\n"
    verdict, values = run_python_values(code, ["f()", "'x' * 3"], SandboxLimits(timeout_s=20))
    assert verdict.passed, verdict
    assert values[0].plain and values[0].value == {"a": [1, 2.5, (3, b"x")], "s": {1, 2}, "n": None, "c": 1 + 2j,
                                                   "big": 2 ** 100, "t": True}
    assert type(values[0].value["a"][2]) is tuple and type(values[0].value["t"]) is bool
    assert values[1].value == "xxx"


def test_objects_of_the_code_are_not_plain_data():
    from purokit.sandbox import run_python_values
    code = ("class Eq:\n    def __eq__(self, o): return True\n"
            "class I(int):\n    pass\n"
            "class Spoof:\n    __class__ = property(lambda self: int)\n")
    verdict, values = run_python_values(code, ["Eq()", "I(3)", "Spoof()", "[1, I(2)]"], SandboxLimits(timeout_s=20))
    assert verdict.passed, verdict
    assert [(v.plain, v.type_name) for v in values] == [(False, "Eq"), (False, "I"), (False, "Spoof"), (False, "I")]


def test_records_forged_on_the_value_channel_are_an_error():
    from purokit.sandbox import run_python_values
    code = ("import os\n"
            "for fd in range(3, 64):\n"
            "    try:\n"
            "        os.write(fd, b'[\"value\", 0, [\"int\", \"3\"]]\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            "def f():\n    return 4\n")
    verdict, values = run_python_values(code, ["f()"], SandboxLimits(timeout_s=20))
    assert values is None and verdict.status == "error" and "value channel" in verdict.detail, verdict
