"""Fixtures over the package's throwaway PostgreSQL and MariaDB servers (`synth.domains.sql_servers`,
Debian packages `postgresql` and `mariadb-server`, which `make test` installs when missing).

One server per dialect per test session: the session fixtures hold the package's shared server
(`sql_servers.acquire`), so a generator run inside a test, which acquires the same one, starts
nothing. `pg_dsn`/`mysql_dsn` are the servers' superuser DSNs; `pg_min_dsn`/`mysql_min_dsn` are
DSNs of roles with exactly the rights the README asks of a DSN. Without the binaries the fixtures
skip with the reason.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pymysql
import pytest

from synth.domains import sql_servers
from synth.domains.sql_engines import MYSQL_SCRATCH_PRIVILEGES, mysql_params

MIN_ROLE = "sqladmin"          # not synth_*: the scratch roles' prefix


def _server(dialect: str) -> Iterator[str]:
    why = sql_servers.binaries_missing(dialect)
    if why:
        pytest.skip(why)
    with sql_servers.local_server(dialect) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The session's PostgreSQL server: `postgresql://synth@/postgres?host=DIR` (superuser)."""
    yield from _server("postgres")


@pytest.fixture(scope="session")
def mysql_dsn() -> Iterator[str]:
    """The session's MariaDB server: `mysql://root@localhost/?unix_socket=DIR/mysqld.sock` (root)."""
    yield from _server("mysql")


@pytest.fixture(scope="session")
def pg_min_dsn(pg_dsn) -> str:
    """A DSN whose role has the README's minimum: LOGIN CREATEDB CREATEROLE."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {MIN_ROLE} LOGIN CREATEDB CREATEROLE")
    return pg_dsn.replace("synth@", f"{MIN_ROLE}@")


@pytest.fixture(scope="session")
def mysql_min_dsn(mysql_dsn) -> str:
    """A DSN whose user has the README's minimum: CREATE USER, CONNECTION ADMIN, PROCESS, and the
    scratch users' privileges on `synth\\_%` databases WITH GRANT OPTION."""
    conn = pymysql.connect(autocommit=True, **mysql_params(mysql_dsn))
    with conn.cursor() as cur:
        cur.execute(f"CREATE USER '{MIN_ROLE}'@'localhost'")
        cur.execute(f"GRANT CREATE USER, CONNECTION ADMIN, PROCESS ON *.* TO '{MIN_ROLE}'@'localhost'")
        cur.execute(f"GRANT {MYSQL_SCRATCH_PRIVILEGES} ON `synth\\_%`.* TO '{MIN_ROLE}'@'localhost' WITH GRANT OPTION")
    conn.close()
    return mysql_dsn.replace("root@", f"{MIN_ROLE}@")


def scratch_databases_left(pg: str | None = None, mysql: str | None = None) -> list[str]:
    """Databases, roles and users named synth_* still on the servers (each execution drops its own)."""
    left: list[str] = []
    if pg:
        with psycopg.connect(pg, autocommit=True) as conn:
            left += [r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'synth\\_%'")]
            left += ["role " + r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolname LIKE 'synth\\_%'")]
    if mysql:
        conn = pymysql.connect(**mysql_params(mysql))
        with conn.cursor() as cur:
            cur.execute("SHOW DATABASES LIKE 'synth\\_%'")
            left += [r[0] for r in cur.fetchall()]
            cur.execute("SELECT CONCAT('user ', user) FROM mysql.user WHERE user LIKE 'synth\\_%'")
            left += [r[0] for r in cur.fetchall()]
        conn.close()
    return left


@pytest.fixture(scope="session")
def held_sql_servers() -> Iterator[dict[str, str]]:
    """The package's shared servers held for the session where they can start (no skip otherwise),
    so the text-to-SQL generator runs of the tests, which acquire the same ones, start nothing."""
    with ExitStack() as stack:
        yield {d: stack.enter_context(sql_servers.local_server(d)) for d in sql_servers.PACKAGES
               if not sql_servers.binaries_missing(d)}
