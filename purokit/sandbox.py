"""Run untrusted Python (a generated solution plus its tests) in an isolated subprocess.

Used by proxy_eval's code benchmarks (pass@1) and by synth's verifiers for generated code. One call,
one verdict:

    verdict = run_python(solution_code, tests="assert add(2, 2) == 4", limits=SandboxLimits(timeout_s=5))
    verdict.status   # "passed" | "failed" | "timeout" | "oom" | "error"

A solution passes only if its tests ran *to their end*: the runner writes a per-run nonce (handed to
it on stdin, unknown to the code until it runs) to a result descriptor after the last test statement
returned, and the verdict is `passed` only when the exit code is 0 *and* that nonce came back. So
`exit()`, `quit(0)`, `raise SystemExit`, `os._exit(0)` and a killed runner all fail, and the tests
run with the builtins as they were before the solution ran (a solution that patches `abs`, `exec`
or `open` cannot make its tests pass or vanish).

Isolation, first layer (kernel; `isolation_status()` says which one is in use):
- bubblewrap (`bwrap`, Debian package `bubblewrap`) puts the interpreter in new mount, PID, network,
  IPC and UTS namespaces: a read-only view of the system directories and of the interpreter's own
  prefixes only (no home directories, no project checkout), a private size-limited tmpfs as the
  working directory and /tmp, a fresh /proc that shows only the sandbox's processes (so no
  `/proc/<ppid>/environ`, no signal reaches the caller), no network route at all, no capabilities,
  `no_new_privs`. When the caller is root the code runs under a uid of its own (from
  1,000,000-1,999,999: `RLIMIT_NPROC` counts per uid, and root is exempt from it);
- `RLIMIT_NPROC` (`max_processes`, threads included) stops fork bombs; `RLIMIT_AS` (memory),
  `RLIMIT_CPU`, `RLIMIT_FSIZE`, no core dumps; a wall-clock timeout;
- the whole process group is killed after every verdict, and the PID namespace ends with its first
  process, so nothing the code started outlives the verdict.
Where bubblewrap is missing or the kernel refuses namespaces, the sandbox falls back loudly: a
`SandboxIsolationWarning` once per process, `Verdict.isolation == "none"` (or `"network"` when
`unshare -n` still works) and `isolation_status()` for the run manifest; `require_namespaces=True`
makes that an error instead.

Second layer (in the interpreter, kept in every mode): an audit hook (PEP 578; code cannot remove
it) refuses sockets, DNS, process creation (`subprocess`, `os.system/exec/spawn/fork/posix_spawn`,
`_posixsubprocess.fork_exec` as `multiprocessing.util.spawnv_passfds` uses it, and `ctypes` look-ups
of `system`, `fork`, `execve`, `kill`, ...), signals to other processes, reading another process's
`/proc/<pid>/environ`, and writing, deleting or renaming anything outside the working directory
and the temp dir.

Verdicts: `passed` (the tests ran to their end), `failed` (an `AssertionError`), `error` (any other
exception, a syntax error, a blocked operation, an exit before the end of the tests), `oom`
(`MemoryError` under the address-space limit, or killed by the kernel), `timeout` (wall clock or CPU
limit). Left to the namespaces, not to this module: code that inspects the runner's own frames or
memory (it runs in the same interpreter, and could find the nonce there).

Results judged outside: `run_python_values(code, expressions)` evaluates each expression after the
code and writes its result on the result descriptor as tagged JSON built from the value's *exact*
type (captured builtins, no method of the value runs); the caller rebuilds plain values
(`from_plain`) and compares them itself. An object whose `__eq__` is always true, an `int` subclass
or a `__class__` property comes back as "not plain" with its type's name, so the code's objects never
take part in a comparison (synth's code checks use it: `synth.domains.code_validate.value_tests`).
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal, Sequence

Status = Literal["passed", "failed", "timeout", "oom", "error"]
STATUSES: tuple[str, ...] = ("passed", "failed", "timeout", "oom", "error")
Isolation = Literal["namespaces", "network", "none"]

# Exit codes the runner uses to report what happened inside the child.
_EXIT_FAILED = 17
_EXIT_ERROR = 18
_EXIT_OOM = 19
_EXIT_EARLY = 20          # SystemExit (exit(), quit(), sys.exit()) before the tests finished

_TAIL_CHARS = 2000
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
_UID_BASE, _UID_SPAN = 1_000_000, 1_000_000
_uid_counter = itertools.count()

# The runner: reads its inputs, drops to the sandbox uid, sets the process limit, installs the
# audit hook, runs the solution and then the tests with pristine builtins, and writes the nonce
# only after the tests returned. Everything it needs later is bound to locals before user code runs.
_RUNNER = r'''
import builtins, os, shutil, sys, traceback
_nonce = sys.stdin.buffer.read()
_null = os.open("/dev/null", os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
_IN = {in_dir!r}
_ALLOW_SUBPROCESS = {allow_subprocess!r}
_WRITE, _EXIT, _FLUSH_OUT, _FLUSH_ERR = os.write, os._exit, sys.stdout.flush, sys.stderr.flush
_EXEC, _COMPILE, _OPEN = exec, compile, open
import json
_TYPE, _DUMPS, _INT_REPR, _FLOAT_REPR, _HEX = type, json.dumps, int.__repr__, float.__repr__, bytes.hex
_DICT_ITEMS, _ISINSTANCE, _LEN = dict.items, isinstance, len
_TAGS = {{list: "list", tuple: "tuple", set: "set", frozenset: "frozenset"}}


class _NotPlain(Exception):
    pass


def _plain(v, depth):
    # a value as tagged JSON-able data, by its exact type: a subclass, or any object of the solution's,
    # is not plain data (no method of the value runs here: exact builtins iterate natively)
    if depth > 100:
        raise _NotPlain("nested deeper than 100")
    t = _TYPE(v)
    if v is None or t is bool:
        return v
    if t is int:
        return ["int", _INT_REPR(v)]
    if t is float:
        return ["float", _FLOAT_REPR(v)]
    if t is str:
        return ["str", v]
    if t is bytes:
        return ["bytes", _HEX(v)]
    if t is complex:
        return ["complex", _FLOAT_REPR(v.real), _FLOAT_REPR(v.imag)]
    if t is dict:
        return ["dict", [[_plain(k, depth + 1), _plain(x, depth + 1)] for k, x in _DICT_ITEMS(v)]]
    if t in _TAGS:
        return [_TAGS[t], [_plain(x, depth + 1) for x in v]]
    raise _NotPlain(t.__qualname__ if _ISINSTANCE(t.__qualname__, str) else "?")


def _emit(key, value):
    # one value of the tests, serialized here and judged by the caller outside the sandbox
    try:
        record = ["value", key, _plain(value, 0)]
    except _NotPlain as e:
        record = ["not plain", key, str(e.args[0])[:80]]
    data = (_DUMPS(record) + "\n").encode()
    while data:
        data = data[_WRITE({result_fd}, data):]
_ASSERTION, _MEMORY, _EXIT_EXC, _ANY = AssertionError, MemoryError, SystemExit, BaseException
_BUILTINS = dict(builtins.__dict__)
for _rel in {inputs!r}:
    _dst = os.path.join(os.getcwd(), _rel)
    os.makedirs(os.path.dirname(_dst), exist_ok=True)
    shutil.copyfile(os.path.join(_IN, _rel), _dst)
with _OPEN("solution.py", encoding="utf-8") as _fh:
    _SOLUTION = _fh.read()
with _OPEN("tests.py", encoding="utf-8") as _fh:
    _TESTS = _fh.read()
_UID, _NPROC = {drop_uid!r}, {max_processes!r}
if _UID is not None:
    os.setgroups([])
    os.setresgid(_UID, _UID, _UID)
    os.setresuid(_UID, _UID, _UID)
if _NPROC is not None:
    import resource
    resource.setrlimit(resource.RLIMIT_NPROC, (_NPROC, _NPROC))

if {audit_hook!r}:
    _PID = os.getpid()
    _ROOTS = tuple(os.path.realpath(p) + os.sep for p in ((os.getcwd(), "/tmp") if {namespaced!r} else (os.getcwd(),)))
    _NET = {{"socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
            "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg"}}
    _SPAWN = {{"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
              "pty.spawn"}}
    _NATIVE_SPAWN = {{"system", "popen", "fork", "vfork", "clone", "clone3", "execv", "execve", "execvp", "execvpe",
                     "execl", "execle", "execlp", "fexecve", "posix_spawn", "posix_spawnp", "kill", "killpg",
                     "tgkill", "ptrace", "syscall", "unshare", "setns"}}
    _MUTATE = {{"os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.replace": (0, 1), "os.truncate": (0,),
               "os.chmod": (0,), "os.chown": (0,), "os.link": (0, 1), "os.symlink": (1,), "os.mkdir": (0,),
               "os.utime": (0,), "shutil.rmtree": (0,), "shutil.move": (0, 1), "os.chflags": (0,)}}
    _WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def _path(p):
        try:
            return None if isinstance(p, int) else os.path.realpath(os.fsdecode(os.fspath(p)))
        except TypeError:
            return None

    def _outside(p):
        return p is not None and p != "/dev/null" and not any((p + os.sep).startswith(r) for r in _ROOTS)

    def _deny(what):
        raise PermissionError(f"sandbox: {{what}} is not allowed")

    def _guard(event, args):
        if event in _NET:
            _deny(event)
        if event == "open":
            p = _path(args[0])
            if p is not None and p.startswith("/proc/") and p.endswith("/environ") and not p.startswith(f"/proc/{{_PID}}/"):
                _deny(f"reading {{p}}")
            if args[2] & _WRITE_FLAGS and _outside(p):
                _deny(f"writing {{p}}")
        elif event in _MUTATE:
            for i in _MUTATE[event]:
                if i < len(args) and _outside(_path(args[i])):
                    _deny(f"{{event}} on {{_path(args[i])}}")
        elif event in ("os.kill", "os.killpg") and args[0] not in (0, _PID):
            _deny(f"{{event}} of another process")
        elif not _ALLOW_SUBPROCESS and (event in _SPAWN or (event == "ctypes.dlsym" and args[1] in _NATIVE_SPAWN)):
            _deny(event if event != "ctypes.dlsym" else f"ctypes {{args[1]}}()")

    sys.addaudithook(_guard)
    if not _ALLOW_SUBPROCESS:
        import _posixsubprocess

        def _no_fork_exec(*args, **kwargs):
            raise PermissionError("sandbox: _posixsubprocess.fork_exec is not allowed")

        _posixsubprocess.fork_exec = _no_fork_exec
sys.path.insert(0, os.getcwd())   # so `files` given to the sandbox are importable

def _main():
    ns = {{"__name__": "__main__", "__builtins__": dict(_BUILTINS)}}
    try:
        solution, tests = _COMPILE(_SOLUTION, "solution.py", "exec"), _COMPILE(_TESTS, "tests.py", "exec")
        _EXEC(solution, ns)
        ns["__builtins__"] = dict(_BUILTINS)      # the tests see the builtins as they were
        ns["__purokit_emit__"] = _emit
        _EXEC(tests, ns)
    except _ASSERTION:
        traceback.print_exc()
        return {failed}
    except _MEMORY:
        # the traceback itself may need memory: keep the message minimal
        _WRITE(2, b"MemoryError\n")
        return {oom}
    except _EXIT_EXC as e:
        _WRITE(2, f"SystemExit({{e.code!r}}) before the tests finished\n".encode())
        return {early}
    except _ANY:
        traceback.print_exc()
        return {error}
    return 0

_rc = _main()
try:
    _FLUSH_OUT()
    _FLUSH_ERR()
except _ANY:
    pass
if _rc == 0:
    _WRITE({result_fd}, _nonce)
_EXIT(_rc)
'''


class SandboxIsolationWarning(UserWarning):
    """Untrusted code runs without kernel namespaces (only rlimits and the audit hook)."""


class SandboxUnavailable(RuntimeError):
    """`require_namespaces=True` but namespaces cannot be used here."""


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits for one sandboxed run."""

    timeout_s: float = 10.0          # wall clock, then the process group is killed
    cpu_s: int | None = None         # RLIMIT_CPU; default: ceil(timeout_s) + 1
    memory_mb: int = 1024            # RLIMIT_AS (address space) of the child
    file_size_mb: int = 16           # RLIMIT_FSIZE: largest file the child may write (stdout included)
    work_mb: int = 64                # size of the private tmpfs work dir (and of /tmp) under namespaces
    max_processes: int = 16          # RLIMIT_NPROC inside the namespaces: processes and threads
    allow_subprocess: bool = False   # let the code start processes (still inside the namespaces)
    network_namespace: bool = True   # no network route (a fresh network namespace)
    audit_hook: bool = True          # the second layer; turned off only to test the first one alone
    require_namespaces: bool = False  # raise SandboxUnavailable instead of falling back


@dataclass
class Verdict:
    status: Status
    returncode: int | None
    duration_s: float
    stdout_tail: str = ""
    stderr_tail: str = ""
    network_isolated: bool = False   # True when a fresh network namespace was used
    detail: str = ""                 # one line saying why (signal, limit hit, ...)
    isolation: Isolation = "none"    # namespaces (bubblewrap) | network (unshare -n only) | none

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


# ---- what this machine offers -----------------------------------------------------------------

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


@functools.lru_cache(maxsize=8)
def interpreter_paths(python: str) -> tuple[str, ...]:
    """The directories `python -I` reads (prefixes, sys.path, the executable's real location),
    reduced to the outermost ones outside the system directories: what the sandbox mounts."""
    out = subprocess.run([python, "-I", "-c", "import sys, json; print(json.dumps([sys.prefix, sys.base_prefix, "
                          "sys.exec_prefix, sys.base_exec_prefix, *sys.path]))"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    found = {os.path.dirname(os.path.abspath(python)), os.path.dirname(os.path.realpath(python))}
    for p in json.loads(out):
        p = os.path.abspath(p) if p else ""
        while p and not os.path.isdir(p):          # a zip on sys.path: its directory
            p = os.path.dirname(p) if os.path.dirname(p) != p else ""
        if p:
            found.update({p, os.path.realpath(p)})
    found = {p for p in found if p != "/" and not any(p == s or p.startswith(s + "/") for s in _SYSTEM_DIRS)}
    return tuple(sorted(p for p in found if not any(p.startswith(q + "/") for q in found)))


def _dirs_for(dst: str, made: set[str]) -> list[str]:
    """`--dir` arguments creating the parents of `dst` (world-traversable) not made yet."""
    parts = Path(dst).parts[1:-1]
    argv: list[str] = []
    for d in ("/" + "/".join(parts[: i + 1]) for i in range(len(parts))):
        if d not in made:
            made.add(d)
            argv += ["--perms", "0755", "--dir", d]
    return argv


def bwrap_argv(python: str, in_dir: str, work_dir: str, limits: SandboxLimits) -> list[str]:
    """The bubblewrap command line for one run (the command itself follows `--`): the system
    directories and the interpreter's prefixes read-only, fresh /proc and /dev, a tmpfs /tmp,
    the inputs read-only, a tmpfs work dir at `work_dir`."""
    exe = shutil.which("bwrap")
    assert exe is not None
    size = str(limits.work_mb << 20)
    argv = [exe, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--hostname", "sandbox", "--cap-drop", "ALL"]
    if limits.network_namespace:
        argv.append("--unshare-net")
    if os.geteuid() == 0:       # the runner switches to the sandbox uid, then holds no capability
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/tmp"]
    made = {"/tmp"}
    for src in interpreter_paths(python):
        argv += [*_dirs_for(src, made), "--ro-bind", src, src]
    argv += [*_dirs_for(in_dir, made), "--ro-bind", in_dir, in_dir,
             *_dirs_for(work_dir, made), "--size", size, "--perms", "0777", "--tmpfs", work_dir, "--chdir", work_dir, "--"]
    return argv


# What the probe runs: the same uid switch the runner makes when the caller is root.
_PROBE = "import os; u = {uid!r}\nif u is not None: os.setgroups([]); os.setresgid(u, u, u); os.setresuid(u, u, u)"


@functools.lru_cache(maxsize=8)
def _namespaces_problem(python: str) -> str | None:
    """Why bubblewrap cannot run `python` here (None when it can): probed once per interpreter."""
    if shutil.which("bwrap") is None:
        return "bubblewrap (`bwrap`, Debian package bubblewrap) is not installed"
    tmp = tempfile.mkdtemp(prefix="purokit-sandbox-probe-")
    try:
        os.chmod(tmp, 0o755)
        os.mkdir(os.path.join(tmp, "in"))
        argv = bwrap_argv(python, os.path.join(tmp, "in"), os.path.join(tmp, "work"), SandboxLimits())
        uid = _UID_BASE if os.geteuid() == 0 else None
        r = subprocess.run([*argv, python, "-I", "-c", _PROBE.format(uid=uid)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            return f"bwrap failed: {(r.stderr.strip().splitlines() or ['exit code ' + str(r.returncode)])[-1]}"
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f"bwrap failed: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def isolation_status(python: str | None = None) -> dict:
    """What isolation `run_python` gives here, for a run manifest: {"mode", "tool", "reason"}."""
    python = python or sys.executable
    problem = _namespaces_problem(python)
    if problem is None:
        return {"mode": "namespaces", "tool": "bwrap", "reason": ""}
    mode = "network" if network_namespace_prefix() else "none"
    return {"mode": mode, "tool": "unshare -n" if mode == "network" else "", "reason": problem}


@functools.lru_cache(maxsize=8)
def _warn_fallback(reason: str) -> None:
    warnings.warn(f"purokit.sandbox: no kernel namespaces ({reason}); untrusted code runs with rlimits and the audit "
                  "hook only (install bubblewrap for mount/PID/network isolation)", SandboxIsolationWarning, stacklevel=3)


# ---- one run ------------------------------------------------------------------------------------

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


def _signal_name(sig: int) -> str:
    return signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)


def classify(rc: int | None, timed_out: bool, stderr: str, finished: bool, namespaced: bool = False) -> tuple[Status, str]:
    """(status, detail) from the child's exit code, whether the wall clock ran out, its stderr, and
    whether the runner reported the tests finished (the nonce came back). bubblewrap reports a
    child killed by signal N as exit code 128 + N."""
    if timed_out:
        return "timeout", "wall-clock limit reached; process group killed"
    if rc == 0:
        if finished:
            return "passed", ""
        return "error", "exited with code 0 before the tests ran to their end (os._exit or a killed runner)"
    if rc == _EXIT_FAILED:
        return "failed", "a test assertion failed"
    if rc == _EXIT_OOM:
        return "oom", "MemoryError under the address-space limit"
    if rc == _EXIT_EARLY:
        return "error", "the code exited (SystemExit) before the tests ran to their end"
    if rc == _EXIT_ERROR:
        last = stderr.strip().splitlines()[-1] if stderr.strip() else "exception"
        return "error", last[:200]
    sig = -rc if rc is not None and rc < 0 else (rc - 128 if namespaced and rc is not None and 128 < rc < 160 else 0)
    if sig:
        name = _signal_name(sig)
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


def _write_inputs(in_dir: Path, code: str, tests: str, files: dict[str, str] | None) -> list[str]:
    """Write the solution, tests and extra files under `in_dir`; their relative names."""
    names = []
    for rel, text in {**(files or {}), "solution.py": code, "tests.py": tests}.items():
        target = (in_dir / rel).resolve()
        if in_dir.resolve() not in target.parents:
            raise ValueError(f"sandbox file {rel!r} escapes the working directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        names.append(str(target.relative_to(in_dir.resolve())))
    return names


def _sandbox_uid() -> int | None:
    """A uid of its own for one run when the caller is root (root is exempt from RLIMIT_NPROC,
    which counts per uid); None otherwise (bubblewrap's user namespace separates the count)."""
    if os.geteuid() != 0:
        return None
    return _UID_BASE + (os.getpid() * 7919 + next(_uid_counter)) % _UID_SPAN


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Wait for `proc` to exit without reaping it (its pid, and so its process group id, stays
    reserved until `proc.wait()`); True when the wall clock ran out first."""
    fd = os.pidfd_open(proc.pid)
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
        return not ready
    finally:
        os.close(fd)


def run_python(
    code: str,
    tests: str = "",
    limits: SandboxLimits | None = None,
    files: dict[str, str] | None = None,
    python: str | None = None,
) -> Verdict:
    """Run `code` then `tests` (same namespace) in the sandbox; return the verdict.

    `files` are extra text files (relative names) placed in the working directory first.
    `python` defaults to the current interpreter (so the same installed packages are importable).
    """
    return _run(code, tests, limits, files, python)[0]


@dataclass(frozen=True)
class PlainValue:
    """A value computed in the sandbox, as it crossed the boundary: `value` is rebuilt here from plain
    data (exact builtin types only), so no object of the sandboxed code can take part in a comparison;
    `plain` is False (and `value` None) when the sandbox produced something else, `type_name` says what."""

    index: int
    plain: bool
    value: object = None
    type_name: str = ""


class PlainDataError(ValueError):
    """A record of the sandbox's value channel that is not what the runner writes."""


def from_plain(tagged: object, depth: int = 0) -> object:
    """The value of one tagged record of the runner's `_plain` (see `_RUNNER`): exact builtins only."""
    if depth > 101:
        raise PlainDataError("nested deeper than 100")
    if tagged is None or isinstance(tagged, bool):
        return tagged
    if not (isinstance(tagged, list) and tagged and isinstance(tagged[0], str)):
        raise PlainDataError(f"not a tagged value: {str(tagged)[:80]}")
    tag, *rest = tagged
    if tag == "int":
        return int(rest[0])
    if tag == "float":
        return float(rest[0])
    if tag == "str":
        return str(rest[0])
    if tag == "bytes":
        return bytes.fromhex(rest[0])
    if tag == "complex":
        return complex(float(rest[0]), float(rest[1]))
    if tag == "dict":
        return {from_plain(k, depth + 1): from_plain(v, depth + 1) for k, v in rest[0]}
    kinds = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    if tag in kinds:
        return kinds[tag](from_plain(x, depth + 1) for x in rest[0])
    raise PlainDataError(f"unknown tag {tag!r}")


def _value_records(data: bytes, n_expected: int) -> list[PlainValue]:
    """The value channel's records, in order; PlainDataError when they are not the n expected ones."""
    values: list[PlainValue] = []
    for line in data.splitlines():
        try:
            kind, index, payload = json.loads(line)
            value = from_plain(payload) if kind == "value" else None
        except (ValueError, TypeError, KeyError, RecursionError) as e:
            raise PlainDataError(f"unreadable value record: {e}") from None
        if kind not in ("value", "not plain") or index != len(values):
            raise PlainDataError(f"value record {len(values)} is out of order")
        values.append(PlainValue(index, kind == "value", value, "" if kind == "value" else str(payload)))
    if len(values) != n_expected:
        raise PlainDataError(f"{len(values)} value records, expected {n_expected}")
    return values


def run_python_values(
    code: str,
    expressions: Sequence[str],
    limits: SandboxLimits | None = None,
    files: dict[str, str] | None = None,
    python: str | None = None,
) -> tuple[Verdict, list[PlainValue] | None]:
    """Run `code`, then evaluate each of `expressions` (Python source) in its namespace, with the
    builtins as they were before `code` ran; return the verdict and, when it passed, the values as
    plain data (`PlainValue`), to be judged by the caller outside the sandbox. A value that is not
    exact builtin data (a subclass of int, an object with its own `__eq__`) comes back with
    `plain=False`: the sandboxed code never decides how its results compare."""
    program = "".join(f"__purokit_emit__({i}, ({src}\n))\n" for i, src in enumerate(expressions))
    verdict, data = _run(code, program, limits, files, python)
    if not verdict.passed:
        return verdict, None
    try:
        return verdict, _value_records(data, len(expressions))
    except PlainDataError as e:
        return replace(verdict, status="error", detail=f"value channel: {e}"), None


def _run(code: str, tests: str, limits: SandboxLimits | None, files: dict[str, str] | None,
         python: str | None) -> tuple[Verdict, bytes]:
    """run_python's body: the verdict and what the runner wrote on its value channel."""
    limits = limits or SandboxLimits()
    python = python or sys.executable
    problem = _namespaces_problem(python)
    if problem is not None:
        if limits.require_namespaces:
            raise SandboxUnavailable(f"purokit.sandbox: namespaces required but unavailable: {problem}")
        _warn_fallback(problem)
    root = Path(tempfile.mkdtemp(prefix="purokit-sandbox-"))
    try:
        os.chmod(root, 0o755)        # the sandbox uid reads the inputs
        in_dir, work_dir, out_dir = root / "in", root / "work", root / "out"
        in_dir.mkdir()
        out_dir.mkdir(mode=0o700)
        inputs = _write_inputs(in_dir, code, tests, files)
        namespaced = problem is None
        argv: list[str] = [python, "-I", "-B", str(in_dir / "_runner.py")]
        if namespaced:
            argv = [*bwrap_argv(python, str(in_dir), str(work_dir), limits), *argv]
            isolation: Isolation = "namespaces"
        else:
            work_dir.mkdir()
            prefix = network_namespace_prefix() if limits.network_namespace else None
            argv = [*prefix, *argv] if prefix else argv
            isolation = "network" if prefix else "none"
        nonce = secrets.token_hex(16).encode()
        out_path, err_path, result_path = out_dir / "stdout.txt", out_dir / "stderr.txt", out_dir / "result"
        with open(out_path, "wb") as out, open(err_path, "wb") as err, open(result_path, "wb") as result:
            (in_dir / "_runner.py").write_text(_RUNNER.format(
                in_dir=str(in_dir), inputs=inputs, allow_subprocess=limits.allow_subprocess,
                audit_hook=limits.audit_hook, namespaced=namespaced, drop_uid=_sandbox_uid() if namespaced else None,
                max_processes=limits.max_processes if namespaced else None, result_fd=result.fileno(),
                failed=_EXIT_FAILED, error=_EXIT_ERROR, oom=_EXIT_OOM, early=_EXIT_EARLY), encoding="utf-8")
            t0 = time.perf_counter()
            proc = subprocess.Popen(
                # the work dir is the cwd in both modes (bubblewrap: `--chdir`): without namespaces the code, its
                # copied inputs and the audit hook's writable root must not be the folder that holds in/ and out/
                argv, cwd=root if namespaced else work_dir, env=_clean_env(work_dir), stdin=subprocess.PIPE,
                stdout=out, stderr=err,
                start_new_session=True, pass_fds=(result.fileno(),), preexec_fn=functools.partial(_set_limits, limits),
            )
            try:
                proc.stdin.write(nonce)
                proc.stdin.close()
            except BrokenPipeError:
                pass
            timed_out = _wait(proc, limits.timeout_s)
            try:
                os.killpg(proc.pid, signal.SIGKILL)     # the whole group, after every verdict
            except ProcessLookupError:
                pass
            rc = proc.wait()
        duration = time.perf_counter() - t0
        stdout, stderr = _tail(out_path), _tail(err_path)
        written = result_path.read_bytes()
        finished = written.endswith(nonce)      # the value channel's records, then the nonce
        status, detail = classify(rc, timed_out, stderr, finished, namespaced)
        return Verdict(status=status, returncode=rc, duration_s=round(duration, 4), stdout_tail=stdout,
                       stderr_tail=stderr, network_isolated=isolation != "none" and limits.network_namespace,
                       detail=detail, isolation=isolation), written[: -len(nonce)] if finished else b""
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_many(jobs: Sequence[SandboxJob], max_workers: int = 2) -> list[Verdict]:
    """Run several jobs concurrently (each in its own process); verdicts in the order of `jobs`."""
    if not jobs:
        return []
    with ThreadPoolExecutor(max_workers=max(1, max_workers)) as pool:
        futures = [pool.submit(run_python, j.code, j.tests, j.limits, j.files) for j in jobs]
        return [f.result() for f in futures]
