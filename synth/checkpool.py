"""Checks (verifiers, validators, sandboxes) off the event loop, each call under a time limit.

A verifier is a pure function, but a pure function can still run for ever: `sympy.simplify` on
`9^{9^{9}}`, a regex on a pathological reply, an SQL query that never ends. On the event loop
one such call stalls every request of the run, and a thread cannot be stopped. So every check
runs in a worker process; a call that outlives its limit kills its worker (a fresh one takes its
place) and raises `CheckTimeout`, which steps count as a rejection with verdict `timeout`.

Workers are `python -m synth.checkpool` processes talking over a socket pair (not
multiprocessing's spawn or forkserver, which re-import the caller's main script: a user's
unguarded script would run again in every worker); they never inherit the engine's sockets or
threads. The processes outlive a run and are reused by the next one in the same interpreter; a
worker whose parent dies reads EOF and exits. A check is `fn(*args)` with `fn` importable by name (a module-level function) and its
arguments and result picklable.
"""

from __future__ import annotations

import asyncio
import atexit
import importlib
import os
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any, Callable

from purokit.log import get_logger

log = get_logger("synth.checkpool")


class CheckTimeout(RuntimeError):
    """A check ran past its time limit (its worker was killed)."""


class CheckCrashed(RuntimeError):
    """A check's worker died (segfault, out of memory) before answering."""


def _worker(conn: Any) -> None:
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return
        try:
            out = ("ok", fn(*args))
        except Exception as e:          # the check's own error goes back to the caller
            out = ("err", e)
        try:
            conn.send(out)
        except Exception as e:          # unpicklable result or error
            conn.send(("err", RuntimeError(f"check {getattr(fn, '__name__', fn)} returned something unpicklable: {e!r}")))


IMPORT_TIMEOUT_S = 300.0


def _load(module: str) -> None:
    importlib.import_module(module)


class _Worker:
    def __init__(self) -> None:
        self.modules: set[str] = {"synth.verify"}
        ours, theirs = socket.socketpair()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen([sys.executable, "-m", "synth.checkpool", str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env)
        theirs.close()
        self.conn = Connection(ours.detach())
        # the worker says when its imports are done, so a call's time limit never pays for them
        if not self.conn.poll(120) or self.conn.recv() != "ready":
            self.kill()
            raise CheckCrashed("a check worker did not start within 120 s")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(5)
        self.conn.close()


class CheckPool:
    """`await pool.run(fn, *args, timeout_s=10)`: fn(*args) in a worker process."""

    def __init__(self, workers: int | None = None):
        self.size = workers or max(1, min(4, os.cpu_count() or 1))
        self._idle: list[_Worker] = []
        self._n_started = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._free: asyncio.Semaphore | None = None
        self._lock = threading.Lock()
        self.n_calls = 0
        self.n_timeouts = 0

    def _bind(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._free is None:      # a new asyncio.run: new loop primitives
            self._loop = loop
            self._free = asyncio.Semaphore(self.size)
        return self._free

    def _take(self) -> _Worker:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Worker()

    async def run(self, fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
        free = self._bind()
        async with free:
            w = self._take() if self._idle else await asyncio.to_thread(self._take)
            for mod in {fn.__module__} | {a.__module__ for a in args if callable(a) and hasattr(a, "__module__")}:
                if mod not in w.modules:
                    # a worker's first call into a module imports it; that is not the check's time
                    await self._call(w, _load, (mod,), IMPORT_TIMEOUT_S)
                    w.modules.add(mod)
            kind, value = await self._call(w, fn, args, timeout_s)
            with self._lock:
                self._idle.append(w)
        if kind == "err":
            raise value
        return value

    async def _call(self, w: _Worker, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> tuple[str, Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()

        def readable() -> None:
            loop.remove_reader(w.conn.fileno())
            try:
                msg = w.conn.recv()
            except (EOFError, OSError) as e:
                if not fut.done():
                    fut.set_exception(CheckCrashed(f"check {getattr(fn, '__name__', fn)}: worker died ({e!r})"))
                return
            if not fut.done():
                fut.set_result(msg)

        self.n_calls += 1
        try:
            w.conn.send((fn, args))
            loop.add_reader(w.conn.fileno(), readable)
            return await asyncio.wait_for(fut, timeout_s)
        except (asyncio.TimeoutError, CheckCrashed, asyncio.CancelledError) as e:
            try:
                loop.remove_reader(w.conn.fileno())
            except (OSError, ValueError):
                pass
            await asyncio.to_thread(w.kill)
            if isinstance(e, asyncio.TimeoutError):
                self.n_timeouts += 1
                raise CheckTimeout(f"{getattr(fn, '__name__', fn)} ran past {timeout_s:g} s") from None
            raise

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()


_POOL: CheckPool | None = None


def check_pool(workers: int | None = None) -> CheckPool:
    """The process-wide pool (started on first use, reused by every run of this interpreter)."""
    global _POOL
    if _POOL is None or (workers is not None and workers != _POOL.size):
        if _POOL is not None:
            _POOL.close()
        _POOL = CheckPool(workers)
    return _POOL


@atexit.register
def _close() -> None:
    if _POOL is not None:
        _POOL.close()


PRELOAD = ("synth.verify",)          # the built-in verifiers, the common case


def worker_main(fd: int) -> None:
    """A worker (`python -m synth.checkpool FD`): loads `PRELOAD`, says ready, serves calls."""
    conn = Connection(fd)
    for mod in PRELOAD:
        importlib.import_module(mod)
    conn.send("ready")
    _worker(conn)


if __name__ == "__main__":
    worker_main(int(sys.argv[1]))
