"""SQL execution on real engines for the text-to-SQL validators (Nemotron 3 Super §3.1.1; spec
§2.10 "against a real server when one is configured").

PostgreSQL samples run on a PostgreSQL server (psycopg), MySQL samples on a MySQL or MariaDB
server (PyMySQL, with MySQL 8's default `sql_mode`, so `ONLY_FULL_GROUP_BY` rejects a
non-aggregated column outside GROUP BY as MySQL does); SQLite samples stay in SQLite
(`sql_validate.execute_in_sqlite`). Each execution:

- takes exactly one statement (`single_statement`: a second statement is refused, not dropped;
  PRAGMA, ATTACH, LOAD_EXTENSION and the like are refused), and a schema of CREATE/ALTER/COMMENT
  statements and rows of INSERT statements (`sample_script`);
- runs in a database of its own, created for it and dropped afterwards (`synth_<random>`), as a
  role (PostgreSQL) or user (MySQL/MariaDB) of the same name created for it, with rights on that
  database only, and dropped afterwards: the DSN's role is administrative only, so a sample cannot
  run programs, read or write server files, create roles or stop other sessions, whatever the DSN;
- loads the schema and rows within `load_timeout_s` and runs the query within `timeout_s`, both
  enforced from the administrative connection (`Deadline`: cancel, then terminate the session),
  which a sample's `SET statement_timeout = 0` cannot lift; fetches at most `max_rows` rows and
  `max_bytes` bytes (streamed with a server-side cursor): past either, the verdict is `limit_exceeded`.

Results compare as SQL compares result sets: as multisets of rows (order-insensitive) unless the
query orders them (a top-level ORDER BY), with NULL equal to NULL (as DISTINCT, UNION and EXCEPT
treat it) and numbers compared by value (`10.50` = `10.5` = 10.5). `results_match` is that rule.

Where the servers are: a DSN per dialect, from the environment (never from a config file, so no
password lands in a run directory): `SYNTH_PG_DSN=postgresql://user:pw@host:5432/db` and
`SYNTH_MYSQL_DSN=mysql://user:pw@host:3306/db` (also `mariadb://`; `?unix_socket=/path` for a
socket); without them, `sql_servers` starts throwaway local servers. The rights a DSN needs:
PostgreSQL `LOGIN CREATEDB CREATEROLE`; MySQL/MariaDB `CREATE USER`, `CONNECTION ADMIN` (MySQL:
`CONNECTION_ADMIN`), `PROCESS` and MYSQL_SCRATCH_PRIVILEGES on `synth\\_%`.* WITH GRANT OPTION.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import json
import math
import os
import secrets
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
import pymysql
import pymysql.converters
import pymysql.cursors
import sqlglot
from psycopg import conninfo as pg_conninfo
from psycopg import errors as pg_errors
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

MAX_ROWS = 10_000
MAX_BYTES = 16 * 1024 * 1024
LOAD_TIMEOUT_S = 30.0          # for loading the schema and sample rows
GRACE_S = 2.0                  # from cancelling a statement past its limit to terminating its session
DSN_ENV = {"postgres": "SYNTH_PG_DSN", "mysql": "SYNTH_MYSQL_DSN"}
# MySQL 8.0's default sql_mode: what a MySQL sample must satisfy, on MariaDB too.
MYSQL8_SQL_MODE = ("ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,"
                   "NO_ENGINE_SUBSTITUTION")
# First words of statements no validator runs: engine settings, files, extensions, other databases.
REFUSED_STATEMENTS = frozenset({"PRAGMA", "ATTACH", "DETACH", "LOAD", "COPY", "VACUUM", "GRANT", "REVOKE", "USE",
                                "SET", "RESET", "CALL", "DO", "HANDLER", "LOCK", "UNLOCK", "SHUTDOWN", "KILL"})


@dataclass
class ExecutionResult:
    """What running a query gave. `status`: ok | empty | error | unsupported | timeout |
    limit_exceeded | refused. `result_sha256` is over the rows as a multiset, `ordered_sha256`
    over them in the order returned; `ordered` says whether the query orders its rows."""

    status: str
    engine: str
    n_rows: int = 0
    columns: list[str] = field(default_factory=list)
    rows_preview: list[list[Any]] = field(default_factory=list)
    result_sha256: str = ""
    error: str = ""
    ordered: bool = False
    ordered_sha256: str = ""
    server: str = ""             # the server that judged it ("PostgreSQL 15.18", "10.11.19-MariaDB"); "" for SQLite

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class LimitExceeded(Exception):
    """A result set past `max_rows` rows or `max_bytes` bytes."""


class StatementRefused(ValueError):
    """Not exactly one statement, or a statement no validator runs."""


# ---- statements -------------------------------------------------------------------------------------

def split_sql(sql: str, dialect: str) -> list[str]:
    """The statements of a script as written (the text between top-level semicolons)."""
    tokens = sqlglot.tokenize(sql, read=dialect)
    out: list[str] = []
    start = 0
    for t in tokens:
        if t.token_type == TokenType.SEMICOLON:
            piece = sql[start:t.start].strip()
            if piece:
                out.append(piece)
            start = t.end + 1
    tail = sql[start:].strip()
    if tail:
        out.append(tail)
    return out


def single_statement(sql: str, dialect: str) -> str:
    """The one statement of `sql`; `StatementRefused` for none, several, or a refused kind."""
    try:
        statements = split_sql(sql, dialect)
    except SqlglotError as e:
        raise StatementRefused(f"does not tokenize: {e}") from None
    if len(statements) != 1:
        raise StatementRefused(f"one statement per execution, found {len(statements)}")
    first = statements[0].split(None, 1)[0].upper().strip("(")
    if first in REFUSED_STATEMENTS:
        raise StatementRefused(f"{first} statements are not executed")
    return statements[0]


SCHEMA_STATEMENTS = ("CREATE", "ALTER", "COMMENT")      # what a sample's schema holds (parse_schema_answer keeps these)
ROWS_STATEMENTS = ("INSERT",)


def sample_script(ddl: str, rows_sql: str, dialect: str) -> list[str]:
    """The statements of a sample's schema then rows; `StatementRefused` for one of another kind
    (a SET, SELECT, COPY or DO among the rows runs nothing the sample needs)."""
    out = []
    for part, script, allowed in (("schema", ddl, SCHEMA_STATEMENTS), ("rows", rows_sql, ROWS_STATEMENTS)):
        try:
            statements = split_sql(script, dialect)
        except SqlglotError as e:
            raise StatementRefused(f"the {part} do not tokenize: {e}") from None
        for st in statements:
            first = st.split(None, 1)[0].upper().strip("(")
            if first not in allowed:
                raise StatementRefused(f"{first} statements are not run in a sample's {part} (only {', '.join(allowed)}): "
                                       f"{' '.join(st.split())[:80]!r}")
        out += statements
    return out


def is_ordered(query: str, dialect: str) -> bool:
    """The query orders its result (a top-level ORDER BY), so row order is part of its answer."""
    try:
        tree = sqlglot.parse_one(query, read=dialect)
    except SqlglotError:
        return False
    return isinstance(tree, exp.Query) and tree.args.get("order") is not None


# ---- results -----------------------------------------------------------------------------------------

def canonical_value(v: Any) -> Any:
    """A JSON value that is equal for equal SQL values across engines: NULL -> None, numbers by
    value (integral -> int, else 12 significant digits), dates ISO, bytes hex."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, (float, decimal.Decimal)):
        f = float(v)
        if not math.isfinite(f):
            return str(f)
        if f.is_integer() and abs(f) < 2 ** 53:
            return int(f)
        return float(f"{f:.12g}")
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return "0x" + bytes(v).hex()
    return str(v)


def _row_json(row: Iterable[Any]) -> str:
    return json.dumps([canonical_value(v) for v in row], sort_keys=True, default=str)


def result_digests(columns: list[str], rows: list[tuple]) -> tuple[str, str]:
    """(multiset digest, ordered digest) of a result: the column count and the canonical rows."""
    lines = [_row_json(r) for r in rows]
    head = f"{len(columns)}\n"
    return (hashlib.sha256((head + "\n".join(sorted(lines))).encode()).hexdigest(),
            hashlib.sha256((head + "\n".join(lines)).encode()).hexdigest())


def results_match(got: ExecutionResult, want: ExecutionResult) -> bool:
    """`got` returns what `want` (the reference) returns: the same multiset of rows, and in the
    same order when the reference orders its rows."""
    if got.status not in ("ok", "empty") or want.status not in ("ok", "empty"):
        return False
    return got.result_sha256 == want.result_sha256 and (not want.ordered or got.ordered_sha256 == want.ordered_sha256)


class RowBudget:
    """Counts fetched rows and (approximate) bytes; `add` raises LimitExceeded past either limit."""

    def __init__(self, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES):
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self.rows, self.bytes = 0, 0

    def add(self, row: Iterable[Any]) -> None:
        self.rows += 1
        self.bytes += sum(len(v) if isinstance(v, (str, bytes, bytearray)) else 8 for v in row)
        if self.rows > self.max_rows:
            raise LimitExceeded(f"more than {self.max_rows} rows")
        if self.bytes > self.max_bytes:
            raise LimitExceeded(f"more than {self.max_bytes} bytes of results")


def fetch_limited(cursor: Any, budget: RowBudget, batch: int = 256) -> list[tuple]:
    rows: list[tuple] = []
    while True:
        chunk = cursor.fetchmany(batch)
        if not chunk:
            return rows
        for r in chunk:
            budget.add(r)
            rows.append(tuple(r))


def finish(engine: str, query: str, dialect: str, columns: list[str], rows: list[tuple], min_rows: int,
           preview_rows: int = 5) -> ExecutionResult:
    """The ExecutionResult of rows fetched within the limits."""
    multiset, ordered = result_digests(columns, rows)
    status = "ok" if len(rows) >= min_rows else "empty"
    return ExecutionResult(status, engine, n_rows=len(rows), columns=columns,
                           rows_preview=[[canonical_value(v) for v in r] for r in rows[:preview_rows]],
                           result_sha256=multiset, ordered=is_ordered(query, dialect), ordered_sha256=ordered,
                           error="" if status == "ok" else f"returned {len(rows)} rows, need at least {min_rows}")


def _short(e: BaseException) -> str:
    return " ".join(str(e).split())[:300]


def scratch_name() -> str:
    return "synth_" + secrets.token_hex(6)


class Deadline:
    """A time limit the sample cannot lift: past `seconds`, `cancel()` runs (from the administrative
    connection, outside the sample's session), then `terminate()` if the statement is still running
    `grace_s` later. A sample's `SET statement_timeout = 0` only lifts the server's own limit."""

    def __init__(self, seconds: float, cancel: Callable[[], Any], terminate: Callable[[], Any], grace_s: float = GRACE_S):
        self.seconds = seconds
        self.fired = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(cancel, terminate, grace_s), daemon=True)

    def _watch(self, cancel: Callable[[], Any], terminate: Callable[[], Any], grace_s: float) -> None:
        if self._done.wait(self.seconds):
            return
        self.fired = True
        for action in (cancel, terminate):
            try:
                action()
            except Exception:        # the session may already be gone; the next action or the drop follows
                pass
            if self._done.wait(grace_s):
                return

    def __enter__(self) -> "Deadline":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()


def _stopped(engine: str, what: str, seconds: float) -> ExecutionResult:
    return ExecutionResult("timeout", engine, error=f"{what} stopped at the {seconds:g}s limit (cancelled from outside the session)")


def _load_failed(engine: str, load: Deadline, error: str) -> ExecutionResult:
    """Loading the schema and rows raised `error`: a timeout when its deadline had fired, else an error."""
    if load.fired:
        return _stopped(engine, "loading the schema and rows", load.seconds)
    return ExecutionResult("error", engine, error=f"schema or rows do not load: {error}")


# ---- PostgreSQL ----------------------------------------------------------------------------------------
# The DSN's role is administrative only: per execution it creates a LOGIN role with no other right
# (no superuser, CREATEDB, CREATEROLE, REPLICATION, BYPASSRLS; member of nothing, so none of
# pg_read_server_files, pg_write_server_files, pg_execute_server_program, pg_signal_backend) and a
# database that role owns; the schema, rows and query run as that role; the DSN's role is made a
# member of it (to create its database and to cancel or terminate its backend) and drops both.

def _pg_create_scratch(admin: psycopg.Connection, name: str, password: str) -> None:
    admin.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{password}' NOSUPERUSER NOCREATEDB NOCREATEROLE "
                  f"NOREPLICATION NOBYPASSRLS CONNECTION LIMIT 1".encode())
    admin.execute(f'GRANT "{name}" TO CURRENT_USER'.encode())
    admin.execute(f'CREATE DATABASE "{name}" OWNER "{name}"'.encode())
    admin.execute(f'REVOKE ALL ON DATABASE "{name}" FROM PUBLIC'.encode())


def _pg_drop_scratch(admin: psycopg.Connection, name: str) -> None:
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
    admin.execute(f'DROP ROLE IF EXISTS "{name}"'.encode())


def _pg_server(admin: psycopg.Connection) -> str:
    v = admin.info.server_version
    return f"PostgreSQL {v // 10000}.{v % 10000}" if v >= 100000 else f"PostgreSQL {v}"


def execute_on_postgres(query: str, ddl: str, rows_sql: str, dsn: str, *, min_rows: int = 1, timeout_s: float = 5.0,
                        max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES, preview_rows: int = 5,
                        scratch: str | None = None, load_timeout_s: float = LOAD_TIMEOUT_S) -> ExecutionResult:
    """Load `ddl` + `rows_sql` into a fresh database of the server at `dsn`, as a fresh role that owns
    it and has no other right, run `query` (one statement, streamed through a server-side cursor)
    under a `Deadline`, then drop the database and the role, whatever happened. `scratch` names
    them (default: a random `synth_<hex>`)."""
    try:
        query = single_statement(query, "postgres")
        script = sample_script(ddl, rows_sql, "postgres")
    except StatementRefused as e:
        return ExecutionResult("refused", "postgres", error=str(e))
    name, password = scratch or scratch_name(), secrets.token_hex(16)
    try:
        admin = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        return ExecutionResult("unsupported", "postgres", error=f"cannot connect to the PostgreSQL server: {_short(e)}")
    try:
        try:
            try:
                _pg_create_scratch(admin, name, password)
            except psycopg.Error as e:
                return ExecutionResult("unsupported", "postgres", error=f"the DSN's role cannot create a scratch role and "
                                       f"database (it needs LOGIN CREATEDB CREATEROLE): {_short(e)}")
            sample_dsn = pg_conninfo.make_conninfo(dsn, dbname=name, user=name, password=password)
            result = _run_postgres(query, script, sample_dsn, admin, min_rows, (load_timeout_s, timeout_s),
                                   RowBudget(max_rows, max_bytes), preview_rows)
            result.server = _pg_server(admin)
            return result
        finally:
            _pg_drop_scratch(admin, name)
    except psycopg.Error as e:
        return ExecutionResult("error", "postgres", error=f"scratch database: {_short(e)}")
    finally:
        admin.close()


def _run_postgres(query: str, script: list[str], dsn: str, admin: psycopg.Connection, min_rows: int,
                  limits_s: tuple[float, float], budget: RowBudget, preview_rows: int) -> ExecutionResult:
    load_s, timeout_s = limits_s
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        pid = conn.info.backend_pid

        def deadline(seconds: float) -> Deadline:
            return Deadline(seconds, lambda: admin.execute("SELECT pg_cancel_backend(%s)", [pid]),
                            lambda: admin.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]))

        load = deadline(load_s)
        try:
            with load, conn.cursor() as cur:
                cur.execute(f"SET statement_timeout = {int(load.seconds * 1000)}".encode())
                for st in script:
                    cur.execute(st.encode())
            conn.commit()
        except psycopg.Error as e:
            return _load_failed("postgres", load, _short(e))
        run = deadline(timeout_s)
        try:
            with run:
                with conn.cursor() as cur:
                    cur.execute(f"SET statement_timeout = {max(1, int(timeout_s * 1000))}".encode())
                with conn.cursor(name="synth_result") as cur:
                    cur.execute(query.encode())
                    rows = fetch_limited(cur, budget)
                    columns = [d.name for d in cur.description or []]
        except LimitExceeded as e:
            return ExecutionResult("limit_exceeded", "postgres", error=str(e))
        except psycopg.Error as e:
            if run.fired or isinstance(e, pg_errors.QueryCanceled):
                return _stopped("postgres", "the query", timeout_s)
            return ExecutionResult("error", "postgres", error=_short(e))
        finally:
            if not conn.closed:
                conn.rollback()
    if run.fired:
        return _stopped("postgres", "the query", timeout_s)
    return finish("postgres", query, "postgres", columns, rows, min_rows, preview_rows)


# ---- MySQL / MariaDB -------------------------------------------------------------------------------------
# The same for MySQL and MariaDB: a user per execution, on the host the DSN's user connects from, with
# privileges on its scratch database only (MYSQL_SCRATCH_PRIVILEGES: no FILE, PROCESS, SUPER, CREATE
# USER, GRANT OPTION or any other global privilege); the DSN's user kills its statement and session.

MYSQL_SCRATCH_PRIVILEGES = ("SELECT, INSERT, UPDATE, DELETE, CREATE, DROP, INDEX, ALTER, REFERENCES, CREATE TEMPORARY TABLES, "
                            "CREATE VIEW, SHOW VIEW, TRIGGER")


def mysql_params(dsn: str) -> dict[str, Any]:
    """PyMySQL connection arguments from `mysql://user:pw@host:port/db?unix_socket=/path`."""
    u = urlsplit(dsn)
    if u.scheme not in ("mysql", "mariadb"):
        raise ValueError(f"not a MySQL DSN (mysql://user:pw@host:port/db): {dsn.split('@')[-1]!r}")
    q = {k: v[-1] for k, v in parse_qs(u.query).items()}
    params: dict[str, Any] = {"host": u.hostname or "127.0.0.1", "port": u.port or 3306, "user": unquote(u.username or "root"),
                              "password": unquote(u.password or ""), "charset": "utf8mb4", "connect_timeout": 10}
    if q.get("unix_socket"):
        params["unix_socket"] = q["unix_socket"]
    return params


def _mysql_error(e: pymysql.MySQLError) -> tuple[int, str]:
    code = e.args[0] if e.args and isinstance(e.args[0], int) else 0
    return code, _short(e.args[1] if len(e.args) > 1 else e)


def _mysql_account(admin: Any, name: str) -> str:
    """'name'@'host', host being where the DSN's user connects from (so the sample's user connects the same way)."""
    with admin.cursor() as cur:
        cur.execute("SELECT SUBSTRING_INDEX(USER(), '@', -1)")
        host = cur.fetchone()[0]
    return f"'{name}'@'{pymysql.converters.escape_string(host)}'"


def _mysql_create_scratch(admin: Any, name: str, account: str, password: str) -> None:
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        cur.execute(f"CREATE USER {account} IDENTIFIED BY '{password}' WITH MAX_USER_CONNECTIONS 1")
        cur.execute(f"GRANT {MYSQL_SCRATCH_PRIVILEGES} ON `{name.replace('_', chr(92) + '_')}`.* TO {account}")


def _mysql_kill(admin: Any, what: str, thread_id: int) -> None:
    with admin.cursor() as cur:
        cur.execute(f"KILL {what} {int(thread_id)}")


def _mysql_drop_scratch(admin: Any, name: str, account: str) -> None:
    with admin.cursor() as cur:
        cur.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s", (name,))
        for (thread_id,) in cur.fetchall():
            try:
                _mysql_kill(admin, "CONNECTION", thread_id)
            except pymysql.MySQLError:
                pass                  # gone meanwhile
        cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        cur.execute(f"DROP USER IF EXISTS {account}")


def execute_on_mysql(query: str, ddl: str, rows_sql: str, dsn: str, *, min_rows: int = 1, timeout_s: float = 5.0,
                     max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES, preview_rows: int = 5,
                     scratch: str | None = None, load_timeout_s: float = LOAD_TIMEOUT_S) -> ExecutionResult:
    """Load `ddl` + `rows_sql` into a fresh database of the MySQL/MariaDB server at `dsn`, as a fresh
    user with privileges on that database only, run `query` (one statement, unbuffered) under MySQL
    8's sql_mode and a `Deadline`, then drop the database and the user, whatever happened."""
    try:
        query = single_statement(query, "mysql")
        script = sample_script(ddl, rows_sql, "mysql")
        params = mysql_params(dsn)
    except (StatementRefused, ValueError) as e:
        return ExecutionResult("refused", "mysql", error=str(e))
    name, password = scratch or scratch_name(), secrets.token_hex(16)
    try:
        admin = pymysql.connect(autocommit=True, **params)
    except pymysql.MySQLError as e:
        return ExecutionResult("unsupported", "mysql", error=f"cannot connect to the MySQL server: {_mysql_error(e)[1]}")
    try:
        account = _mysql_account(admin, name)
        try:
            try:
                _mysql_create_scratch(admin, name, account, password)
            except pymysql.MySQLError as e:
                return ExecutionResult("unsupported", "mysql", error=f"the DSN's user cannot create a scratch user and "
                                       f"database (see the README for its privileges): {_mysql_error(e)[1]}")
            sample = {**params, "user": name, "password": password, "database": name, "read_timeout": int(timeout_s) + 30}
            result = _run_mysql(query, script, sample, admin, min_rows, (load_timeout_s, timeout_s),
                                RowBudget(max_rows, max_bytes), preview_rows)
            result.server = admin.get_server_info().removeprefix("5.5.5-")    # MariaDB's replication prefix
            return result
        finally:
            _mysql_drop_scratch(admin, name, account)
    except pymysql.MySQLError as e:
        return ExecutionResult("error", "mysql", error=f"scratch database: {_mysql_error(e)[1]}")
    finally:
        admin.close()


def _mysql_statement_timeout(cur: Any, seconds: float) -> None:
    try:
        cur.execute(f"SET SESSION max_statement_time = {seconds:.3f}")          # MariaDB
    except pymysql.MySQLError:
        cur.execute(f"SET SESSION max_execution_time = {int(seconds * 1000)}")  # MySQL (SELECT only)


def _run_mysql(query: str, script: list[str], params: dict[str, Any], admin: Any, min_rows: int,
               limits_s: tuple[float, float], budget: RowBudget, preview_rows: int) -> ExecutionResult:
    load_s, timeout_s = limits_s
    conn = pymysql.connect(autocommit=True, **params)
    tid = conn.thread_id()

    def deadline(seconds: float) -> Deadline:
        return Deadline(seconds, lambda: _mysql_kill(admin, "QUERY", tid), lambda: _mysql_kill(admin, "CONNECTION", tid))

    try:
        load = deadline(load_s)
        try:
            with load, conn.cursor() as cur:
                cur.execute(f"SET SESSION sql_mode = '{MYSQL8_SQL_MODE}'")
                _mysql_statement_timeout(cur, load.seconds)
                for st in script:
                    cur.execute(st)
                _mysql_statement_timeout(cur, timeout_s)
        except pymysql.MySQLError as e:
            return _load_failed("mysql", load, _mysql_error(e)[1])
        run = deadline(timeout_s)
        try:
            with run, conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(query)
                columns = [d[0] for d in cur.description or []]
                rows = fetch_limited(cur, budget)
        except LimitExceeded as e:
            return ExecutionResult("limit_exceeded", "mysql", error=str(e))
        except pymysql.MySQLError as e:
            code, msg = _mysql_error(e)
            if run.fired or code in (1969, 3024) or "max_statement_time" in msg:      # MariaDB, MySQL: statement timeout
                return _stopped("mysql", "the query", timeout_s)
            return ExecutionResult("error", "mysql", error=msg)
    finally:
        try:
            conn.close()
        except pymysql.MySQLError:
            pass
    if run.fired:                 # MariaDB's SLEEP() returns 1 when its statement is killed
        return _stopped("mysql", "the query", timeout_s)
    return finish("mysql", query, "mysql", columns, rows, min_rows, preview_rows)


def drop_scratch(dialect: str, dsn: str, name: str) -> None:
    """Drop the scratch database and role/user `name` of an execution whose process died before its
    own cleanup (idempotent; stops their sessions first)."""
    if dialect == "postgres":
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as admin:
            _pg_drop_scratch(admin, name)
        return
    admin = pymysql.connect(autocommit=True, **mysql_params(dsn))
    try:
        _mysql_drop_scratch(admin, name, _mysql_account(admin, name))
    finally:
        admin.close()


# ---- which server ----------------------------------------------------------------------------------------

SERVER_EXECUTORS: dict[str, Callable[..., ExecutionResult]] = {"postgres": execute_on_postgres, "mysql": execute_on_mysql}


def dsn_from_env(dialect: str) -> str | None:
    """The DSN of the server configured for `dialect` (SYNTH_PG_DSN, SYNTH_MYSQL_DSN), or None."""
    var = DSN_ENV.get(dialect)
    return (os.environ.get(var) or None) if var else None
