"""common.sandbox: the verdicts a code benchmark and a code verifier rely on."""

import pytest

from common.sandbox import SandboxJob, SandboxLimits, network_namespace_prefix, run_many, run_python

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


def test_sys_exit_zero_passes_nonzero_errors():
    assert run_python("import sys\nsys.exit(0)\n", limits=FAST).status == "passed"
    assert run_python("import sys\nsys.exit(3)\n", limits=FAST).status == "error"


def test_run_many_keeps_order():
    jobs = [SandboxJob(code=f"x = {i}", tests=f"assert x == {i if i % 2 == 0 else -1}", limits=FAST) for i in range(4)]
    verdicts = run_many(jobs, max_workers=2)
    assert [v.status for v in verdicts] == ["passed", "failed", "passed", "failed"]
