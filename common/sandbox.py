"""Run untrusted Python (a generated solution plus its tests) in a locked-down subprocess.

Used by proxy_eval's code benchmarks (pass@1) and by synth's verifiers for generated code. One call,
one verdict:

    verdict = run_python(solution_code, tests="assert add(2, 2) == 4", limits=SandboxLimits(timeout_s=5))
    verdict.status   # "passed" | "failed" | "timeout" | "oom" | "error"

What the child gets:
- a fresh temporary directory as its working directory and HOME, removed afterwards;
- a clean environment (no inherited variables, `python -I`: no user site, no PYTHON* variables);
- resource limits (`resource.setrlimit`): address space (memory), CPU seconds, file size, no core
  dumps; plus a wall-clock timeout after which the whole process group is killed;
- no network: a startup prelude installs an audit hook (PEP 578; code cannot remove it) that refuses
  socket creation, connects, DNS lookups and, unless allowed, spawning processes; on top of that the
  child runs in a fresh network namespace (`unshare -n`, or `unshare -rn` as an unprivileged user)
  when the kernel allows it, so even native code has no route out (`Verdict.network_isolated`).

Verdicts: `passed` (solution and tests ran to the end), `failed` (an `AssertionError`: a test
failed), `error` (any other exception, including a syntax error, or a blocked operation), `oom`
(`MemoryError` under the address-space limit, or killed by the kernel), `timeout` (wall clock or CPU
limit). It is a sandbox for honest-but-buggy model output, not a defence against a determined
attacker (use containers or gVisor for that).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, Sequence

Status = Literal["passed", "failed", "timeout", "oom", "error"]
STATUSES: tuple[str, ...] = ("passed", "failed", "timeout", "oom", "error")

# Exit codes the runner uses to report what happened inside the child.
_EXIT_FAILED = 17
_EXIT_ERROR = 18
_EXIT_OOM = 19

_TAIL_CHARS = 2000

# The runner: installs the audit hook, then executes the solution and the tests in one namespace.
# It reads everything from files in its working directory, so no code travels through argv.
_RUNNER = r'''
import sys, traceback
_ALLOW_SUBPROCESS = {allow_subprocess!r}
_BLOCKED = {{"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo",
            "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"}}
_SPAWN = {{"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
          "os.forkpty", "pty.spawn"}}

def _guard(event, args):
    if event in _BLOCKED or (not _ALLOW_SUBPROCESS and event in _SPAWN):
        raise PermissionError(f"sandbox: {{event}} is not allowed")

sys.addaudithook(_guard)
import os
sys.path.insert(0, os.getcwd())   # so `files` given to the sandbox are importable

def _main():
    ns = {{"__name__": "__main__"}}
    try:
        for name in ("solution.py", "tests.py"):
            with open(name, encoding="utf-8") as fh:
                src = fh.read()
            exec(compile(src, name, "exec"), ns)
    except AssertionError:
        traceback.print_exc()
        sys.stderr.flush()
        return {failed}
    except MemoryError:
        # the traceback itself may need memory: keep the message minimal
        sys.stderr.write("MemoryError\n")
        sys.stderr.flush()
        return {oom}
    except SystemExit as e:
        code = e.code
        if code is None or code == 0:
            return 0
        sys.stderr.write(f"SystemExit({{code!r}})\n")
        return {error}
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return {error}
    return 0

sys.stdout.flush()
_rc = _main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(_rc)
'''


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    timeout_s: float = 10.0          # wall clock, then the process group is killed
    cpu_s: int | None = None         # RLIMIT_CPU; default: ceil(timeout_s) + 1
    memory_mb: int = 1024            # RLIMIT_AS (address space) of the child
    file_size_mb: int = 16           # RLIMIT_FSIZE: largest file the child may write (stdout included)
    allow_subprocess: bool = False   # let the code start processes (still without network)
    network_namespace: bool = True   # wrap in `unshare -n` when the kernel allows it


@dataclass
class Verdict:
    status: Status
    returncode: int | None
    duration_s: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    network_isolated: bool = False   # True when a fresh network namespace was used
    detail: str = ""                 # one line saying why (signal, limit hit, ...)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SandboxJob:
    """One unit of work for `run_many`."""

    code: str
    tests: str = ""
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    files: dict[str, str] | None = None


@functools.lru_cache(maxsize=1)
def network_namespace_prefix() -> tuple[str, ...] | None:
    """The `unshare` command that gives a child its own (empty) network namespace here, or None."""
    exe = shutil.which("unshare")
    if exe is None:
        return None
    for prefix in ((exe, "-n"), (exe, "-rn")):
        try:
            r = subprocess.run([*prefix, "true"], capture_output=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return prefix
    return None


def _clean_env(workdir: Path) -> dict[str, str]:
    return {
        "PATH": os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if os.path.isdir(p)),
        "HOME": str(workdir),
        "TMPDIR": str(workdir),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        # keep numeric libraries from spawning a thread per core inside the sandbox
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _set_limits(limits: SandboxLimits) -> None:
    """Runs in the child between fork and exec."""
    mb = 1024 * 1024
    cpu = limits.cpu_s if limits.cpu_s is not None else int(limits.timeout_s) + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb * mb, limits.memory_mb * mb))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_size_mb * mb, limits.file_size_mb * mb))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _tail(path: Path, n_chars: int = _TAIL_CHARS) -> str:
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            if size > n_chars * 4:
                fh.seek(size - n_chars * 4)
            data = fh.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-n_chars:]


def _classify(rc: int | None, timed_out: bool, stderr: str) -> tuple[Status, str]:
    if timed_out:
        return "timeout", "wall-clock limit reached; process group killed"
    if rc == 0:
        return "passed", ""
    if rc == _EXIT_FAILED:
        return "failed", "a test assertion failed"
    if rc == _EXIT_OOM:
        return "oom", "MemoryError under the address-space limit"
    if rc == _EXIT_ERROR:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else "exception"
        return "error", last[:200]
    if rc is not None and rc < 0:
        sig = -rc
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        if sig == signal.SIGXCPU:
            return "timeout", f"CPU limit reached ({name})"
        if sig == signal.SIGKILL:
            return "oom", f"killed by {name} (out of memory)"
        if sig == signal.SIGXFSZ:
            return "error", f"file size limit reached ({name})"
        if sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT) and "MemoryError" in stderr:
            return "oom", f"{name} after MemoryError"
        return "error", f"killed by {name}"
    if "MemoryError" in stderr or "Cannot allocate memory" in stderr:
        return "oom", f"exit code {rc} with an allocation failure"
    return "error", f"exit code {rc}"


def run_python(
    code: str,
    tests: str = "",
    limits: SandboxLimits | None = None,
    files: dict[str, str] | None = None,
    python: str | None = None,
) -> Verdict:
    """Run `code` then `tests` (same namespace) in a sandboxed interpreter; return the verdict.

    `files` are extra text files (relative names) placed in the working directory first.
    `python` defaults to the current interpreter (so the same packages are importable).
    """
    limits = limits or SandboxLimits()
    python = python or sys.executable
    workdir = Path(tempfile.mkdtemp(prefix="purokit-sandbox-"))
    try:
        for rel, text in (files or {}).items():
            target = (workdir / rel).resolve()
            if workdir.resolve() not in target.parents:
                raise ValueError(f"sandbox file {rel!r} escapes the working directory")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        (workdir / "solution.py").write_text(code, encoding="utf-8")
        (workdir / "tests.py").write_text(tests, encoding="utf-8")
        (workdir / "_runner.py").write_text(_RUNNER.format(
            allow_subprocess=limits.allow_subprocess, failed=_EXIT_FAILED, error=_EXIT_ERROR, oom=_EXIT_OOM,
        ), encoding="utf-8")
        argv: list[str] = [python, "-I", "-B", "_runner.py"]
        prefix = network_namespace_prefix() if limits.network_namespace else None
        if prefix:
            argv = [*prefix, *argv]
        out_path, err_path = workdir / "_stdout.txt", workdir / "_stderr.txt"
        t0 = time.perf_counter()
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen(
                argv, cwd=workdir, env=_clean_env(workdir), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True, preexec_fn=functools.partial(_set_limits, limits),
            )
            try:
                rc = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                rc = proc.wait()
        duration = time.perf_counter() - t0
        stdout, stderr = _tail(out_path), _tail(err_path)
        status, detail = _classify(rc, timed_out, stderr)
        return Verdict(status=status, returncode=rc, duration_s=round(duration, 4), stdout_tail=stdout,
                       stderr_tail=stderr, network_isolated=bool(prefix), detail=detail)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_many(jobs: Sequence[SandboxJob], max_workers: int = 2) -> list[Verdict]:
    """Run several jobs concurrently (each in its own process); verdicts in the order of `jobs`."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        futures = [pool.submit(run_python, j.code, j.tests, j.limits, j.files) for j in jobs]
        return [f.result() for f in futures]
