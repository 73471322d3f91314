"""Throwaway PostgreSQL and MariaDB servers for the text-to-SQL tests (Debian packages
`postgresql` and `mariadb-server`, which `make test` installs when missing).

Each fixture starts one server per test session in a temporary data directory, listening on
127.0.0.1 on a free port, as the packages' own unprivileged users when the tests run as root
(initdb and mariadbd refuse root), and stops it and removes the directory afterwards. Without the
binaries the fixtures skip with the reason.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import psycopg
import pymysql
import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(name: str) -> list[str]:
    """The prefix that runs a command as `name` when we are root (else nothing); skips without it."""
    if os.geteuid() != 0:
        return []
    if shutil.which("runuser") is None or subprocess.run(["id", name], capture_output=True).returncode != 0:
        pytest.skip(f"running as root without a {name!r} user to own the server (install the Debian package)")
    return ["runuser", "-u", name, "--"]


def _wait_until(ready, what: str, log: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.2)
    tail = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
    raise RuntimeError(f"{what} did not become ready within {timeout_s}s; log:\n{tail}")


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """A PostgreSQL server: `postgresql://synth@127.0.0.1:PORT/postgres` (trust auth, superuser)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.skip("PostgreSQL server binaries not installed (Debian package postgresql; `make test` installs it)")
    bindir = os.path.dirname(found[-1])
    as_user = _as_user("postgres")
    tmp = tempfile.mkdtemp(prefix="synth-pg-")
    os.chmod(tmp, 0o777)
    data, port, log = os.path.join(tmp, "data"), free_port(), os.path.join(tmp, "server.log")
    subprocess.run([*as_user, f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "synth", "--no-sync"],
                   check=True, capture_output=True)
    # the server must not inherit our pipes (run() would wait for them to close): log to a file
    subprocess.run([*as_user, f"{bindir}/pg_ctl", "-D", data, "-l", log, "-o",
                    f"-k {tmp} -p {port} -c listen_addresses=127.0.0.1 -c fsync=off -c shared_buffers=16MB",
                    "-w", "-t", "90", "start"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    try:
        yield f"postgresql://synth@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def mysql_dsn() -> Iterator[str]:
    """A MariaDB server: `mysql://root@127.0.0.1:PORT/` (grant tables skipped: a throwaway server)."""
    mariadbd = shutil.which("mariadbd") or shutil.which("mysqld") or ("/usr/sbin/mariadbd" if os.path.exists("/usr/sbin/mariadbd") else None)
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if mariadbd is None or install is None:
        pytest.skip("MariaDB server binaries not installed (Debian package mariadb-server; `make test` installs it)")
    user = ["--user=mysql"] if os.geteuid() == 0 else []
    if user:
        _as_user("mysql")                       # skips when the package's user is missing
    tmp = tempfile.mkdtemp(prefix="synth-mariadb-")
    os.chmod(tmp, 0o777)
    data, port, sock, log = os.path.join(tmp, "data"), free_port(), os.path.join(tmp, "mysqld.sock"), os.path.join(tmp, "err.log")
    subprocess.run([install, "--no-defaults", f"--datadir={data}", *user, "--skip-test-db",
                    "--auth-root-authentication-method=normal"], check=True, capture_output=True, timeout=180)
    server = subprocess.Popen([mariadbd, "--no-defaults", f"--datadir={data}", *user, f"--port={port}",
                               "--bind-address=127.0.0.1", f"--socket={sock}", f"--pid-file={tmp}/mysqld.pid",
                               f"--log-error={log}", "--skip-grant-tables", "--skip-log-bin", "--performance-schema=OFF",
                               "--innodb-buffer-pool-size=16M", "--innodb-log-file-size=8M", "--skip-name-resolve"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def ready() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"mariadbd exited with {server.returncode}: {open(log, errors='replace').read()[-2000:]}")
        try:
            pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2).close()
            return True
        except pymysql.MySQLError:
            return False

    try:
        _wait_until(ready, "mariadbd", log)
        yield f"mysql://root@127.0.0.1:{port}/"
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def scratch_databases_left(pg: str | None = None, mysql: str | None = None) -> list[str]:
    """Databases named synth_* still on the servers (each execution must drop its own)."""
    left: list[str] = []
    if pg:
        with psycopg.connect(pg, autocommit=True) as conn:
            left += [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'synth\\_%'")]
    if mysql:
        port = int(mysql.rsplit(":", 1)[1].strip("/"))
        conn = pymysql.connect(host="127.0.0.1", port=port, user="root")
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE 'synth\\_%'")
            left += [r[0] for r in cur.fetchall()]
        conn.close()
    return left
