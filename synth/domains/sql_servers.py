"""Throwaway PostgreSQL and MariaDB servers for text-to-SQL execution when no server is configured
(no `SYNTH_PG_DSN` / `SYNTH_MYSQL_DSN`): the generator judges PostgreSQL and MySQL samples on the
real engines whenever the Debian packages `postgresql` and `mariadb-server` are installed.

Each server runs in a temporary directory of its own (data directory, socket, log), mode 0700,
listens on a Unix socket in that directory only (no TCP port: nothing else on the machine can
reach it), runs as the packages' unprivileged users when we are root (initdb and mariadbd refuse
root), and is stopped and its directory removed when its last user releases it. `acquire` and
`release` share one server per dialect within a process (a run holds it for its duration; a test
session holds it for all its tests), and `local_server` is the context manager over them.

Only `binaries_missing(dialect)` answering None means a server can be started; otherwise the
caller falls back to SQLite (`sql_validate.execute_in_sqlite`) and says so.
"""

from __future__ import annotations

import atexit
import glob
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

from purokit.log import get_logger

log = get_logger("synth.sql_servers")

START_TIMEOUT_S = 120.0
PACKAGES = {"postgres": "postgresql", "mysql": "mariadb-server"}


class ServerUnavailable(RuntimeError):
    """A local server cannot be started here (binaries or their user missing, or it failed)."""


def postgres_bindir() -> str | None:
    """The newest installed PostgreSQL server's bin directory (Debian layout), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


def mariadb_binaries() -> tuple[str, str] | None:
    """(server, install-db) of an installed MariaDB, or None."""
    server = shutil.which("mariadbd") or shutil.which("mysqld") or next(
        (p for p in ("/usr/sbin/mariadbd", "/usr/sbin/mysqld") if os.path.exists(p)), None)
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    return (server, install) if server and install else None


def _os_user(dialect: str) -> str:
    return {"postgres": "postgres", "mysql": "mysql"}[dialect]


def binaries_missing(dialect: str) -> str | None:
    """Why no local server of `dialect` ('postgres' | 'mysql') can start here, or None if one can."""
    if dialect not in PACKAGES:
        return f"no local server for dialect {dialect!r}"
    have = postgres_bindir() if dialect == "postgres" else mariadb_binaries()
    if not have:
        return f"the {PACKAGES[dialect]} server binaries are not installed (Debian package {PACKAGES[dialect]}; make system-packages)"
    if os.geteuid() == 0 and (shutil.which("runuser") is None
                              or subprocess.run(["id", _os_user(dialect)], capture_output=True).returncode != 0):
        return f"running as root without a {_os_user(dialect)!r} user to own the server (install {PACKAGES[dialect]})"
    return None


@dataclass
class LocalServer:
    """A running throwaway server: its DSN (an administrative, superuser one) and how to stop it."""

    dialect: str
    dsn: str
    root: str
    _stop: Callable[[], None] = field(repr=False)

    def stop(self) -> None:
        try:
            self._stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def _private_dir(prefix: str, owner: str) -> tuple[str, list[str]]:
    """A 0700 temporary directory owned by the server's user, and the command prefix that runs as it."""
    root = tempfile.mkdtemp(prefix=prefix)
    if os.geteuid() != 0:
        return root, []
    shutil.chown(root, owner, owner)
    return root, ["runuser", "-u", owner, "--"]


def _wait_until(ready: Callable[[], bool], what: str, log_path: str, timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    tail = open(log_path, errors="replace").read()[-2000:] if os.path.exists(log_path) else ""
    raise ServerUnavailable(f"{what} did not become ready within {timeout_s:.0f}s; its log ends:\n{tail}")


def start_postgres() -> LocalServer:
    """A PostgreSQL server on a Unix socket in a private directory; DSN `postgresql://synth@/postgres?host=DIR`
    (superuser `synth`, trust authentication: only the directory's owner and root can reach the socket)."""
    why = binaries_missing("postgres")
    if why:
        raise ServerUnavailable(why)
    bindir = postgres_bindir()
    root, as_user = _private_dir("synth-pg-", "postgres")
    data, log_path = os.path.join(root, "data"), os.path.join(root, "server.log")
    try:
        subprocess.run([*as_user, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "synth", "--no-sync"],
                       check=True, capture_output=True, timeout=START_TIMEOUT_S)
        # the server must not inherit our pipes (run() would wait for them to close): it logs to a file
        subprocess.run([*as_user, f"{bindir}/pg_ctl", "-D", data, "-l", log_path, "-o",
                        f"-k {root} -c listen_addresses='' -c fsync=off -c shared_buffers=16MB",
                        "-w", "-t", str(int(START_TIMEOUT_S)), "start"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=START_TIMEOUT_S + 10)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        tail = open(log_path, errors="replace").read()[-1500:] if os.path.exists(log_path) else ""
        shutil.rmtree(root, ignore_errors=True)
        raise ServerUnavailable(f"PostgreSQL did not start: {e} {getattr(e, 'stderr', b'') or b''!r} {tail}") from None

    def stop() -> None:
        subprocess.run([*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    return LocalServer("postgres", f"postgresql://synth@/postgres?host={root}", root, stop)


def start_mariadb() -> LocalServer:
    """A MariaDB server with grant tables, networking off, on a socket in a private directory; DSN
    `mysql://root@localhost/?unix_socket=DIR/mysqld.sock` (root without password: only the directory's
    owner and root can reach the socket)."""
    why = binaries_missing("mysql")
    if why:
        raise ServerUnavailable(why)
    server_bin, install = mariadb_binaries()  # type: ignore[misc]
    root, _ = _private_dir("synth-mariadb-", "mysql")
    user = ["--user=mysql"] if os.geteuid() == 0 else []
    data, sock, log_path = os.path.join(root, "data"), os.path.join(root, "mysqld.sock"), os.path.join(root, "err.log")
    no_files = os.path.join(root, "no-files")           # secure_file_priv: file I/O only here (it stays empty)
    os.mkdir(no_files, 0o700)
    if user:
        shutil.chown(no_files, "mysql", "mysql")
    try:
        subprocess.run([install, "--no-defaults", f"--datadir={data}", *user, "--skip-test-db",
                        "--auth-root-authentication-method=normal"], check=True, capture_output=True, timeout=START_TIMEOUT_S)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(root, ignore_errors=True)
        raise ServerUnavailable(f"mariadb-install-db failed: {e} {getattr(e, 'stderr', b'') or b''!r}") from None
    proc = subprocess.Popen([server_bin, "--no-defaults", f"--datadir={data}", *user, "--skip-networking",
                             f"--socket={sock}", f"--pid-file={root}/mysqld.pid", f"--log-error={log_path}",
                             "--skip-log-bin", "--performance-schema=OFF", "--innodb-buffer-pool-size=16M",
                             "--innodb-log-file-size=8M", "--skip-name-resolve", f"--secure-file-priv={no_files}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def ready() -> bool:
        import pymysql

        if proc.poll() is not None:
            raise ServerUnavailable(f"mariadbd exited with {proc.returncode}: {open(log_path, errors='replace').read()[-2000:]}")
        try:
            pymysql.connect(unix_socket=sock, user="root", connect_timeout=2).close()
            return True
        except pymysql.MySQLError:
            return False

    try:
        _wait_until(ready, "mariadbd", log_path)
    except BaseException:
        stop()
        shutil.rmtree(root, ignore_errors=True)
        raise
    return LocalServer("mysql", f"mysql://root@localhost/?unix_socket={sock}", root, stop)


STARTERS: dict[str, Callable[[], LocalServer]] = {"postgres": start_postgres, "mysql": start_mariadb}


class _Shared:
    """One server per dialect per process, counted: the first `acquire` starts it, the last `release` stops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[str, LocalServer] = {}
        self._users: dict[str, int] = {}

    def acquire(self, dialect: str) -> str:
        with self._lock:
            if dialect not in self._servers:
                log.info("starting a throwaway %s server for text-to-SQL execution", PACKAGES.get(dialect, dialect))
                self._servers[dialect] = STARTERS[dialect]()
            self._users[dialect] = self._users.get(dialect, 0) + 1
            return self._servers[dialect].dsn

    def release(self, dialect: str) -> None:
        with self._lock:
            self._users[dialect] = self._users.get(dialect, 0) - 1
            if self._users[dialect] <= 0 and dialect in self._servers:
                self._servers.pop(dialect).stop()
                self._users.pop(dialect)

    def running(self) -> dict[str, str]:
        with self._lock:
            return {d: s.dsn for d, s in self._servers.items()}

    def stop_all(self) -> None:
        """Stop what is still running (at interpreter exit: a holder that never released)."""
        with self._lock:
            for server in self._servers.values():
                server.stop()
            self._servers.clear()
            self._users.clear()


_SHARED = _Shared()
atexit.register(_SHARED.stop_all)
acquire = _SHARED.acquire
release = _SHARED.release
running = _SHARED.running


@contextmanager
def local_server(dialect: str) -> Iterator[str]:
    """The DSN of this process's throwaway server of `dialect` (started if none runs), held for the block."""
    dsn = acquire(dialect)
    try:
        yield dsn
    finally:
        release(dialect)
