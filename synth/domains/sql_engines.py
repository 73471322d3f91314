"""SQL execution on real engines for the text-to-SQL validators (Nemotron 3 Super §3.1.1; spec
§2.10 "against a real server when one is configured").

PostgreSQL samples run on a PostgreSQL server (psycopg), MySQL samples on a MySQL or MariaDB
server (PyMySQL, with MySQL 8's default `sql_mode`, so `ONLY_FULL_GROUP_BY` rejects a
non-aggregated column outside GROUP BY as MySQL does); SQLite samples stay in SQLite
(`sql_validate.execute_in_sqlite`). Each execution:

- takes exactly one statement (`single_statement`: a second statement is refused, not dropped;
  PRAGMA, ATTACH, LOAD_EXTENSION and the like are refused);
- runs in a database of its own, created for it and dropped afterwards (`synth_<random>`), so the
  server is left as it was and concurrent executions never meet;
- loads the schema and rows under a statement timeout of `LOAD_TIMEOUT_S`, runs the query under
  its own, and fetches at most `max_rows` rows and `max_bytes` bytes
  (streamed with a server-side cursor): past either, the verdict is `limit_exceeded`.

Results compare as SQL compares result sets: as multisets of rows (order-insensitive) unless the
query orders them (a top-level ORDER BY), with NULL equal to NULL (as DISTINCT, UNION and EXCEPT
treat it) and numbers compared by value (`10.50` = `10.5` = 10.5). `results_match` is that rule.

Where the servers are: a DSN per dialect, from the environment (never from a config file, so no
password lands in a run directory): `SYNTH_PG_DSN=postgresql://user:pw@host:5432/db` and
`SYNTH_MYSQL_DSN=mysql://user:pw@host:3306/db` (also `mariadb://`; `?unix_socket=/path` for a
socket). The user needs the right to create and drop databases.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import hashlib
import json
import math
import os
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable
from urllib.parse import parse_qs, unquote, urlsplit

import psycopg
import pymysql
import pymysql.cursors
import sqlglot
from psycopg import conninfo as pg_conninfo
from psycopg import errors as pg_errors
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.tokens import TokenType

MAX_ROWS = 10_000
MAX_BYTES = 16 * 1024 * 1024
LOAD_TIMEOUT_S = 30.0          # per statement of the schema and sample rows
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


def _scratch_name() -> str:
    return "synth_" + secrets.token_hex(6)


# ---- PostgreSQL ----------------------------------------------------------------------------------------

def execute_on_postgres(query: str, ddl: str, rows_sql: str, dsn: str, *, min_rows: int = 1, timeout_s: float = 5.0,
                        max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES, preview_rows: int = 5) -> ExecutionResult:
    """Load `ddl` + `rows_sql` into a fresh database of the server at `dsn`, run `query` (one
    statement, streamed through a server-side cursor), drop the database."""
    try:
        query = single_statement(query, "postgres")
    except StatementRefused as e:
        return ExecutionResult("refused", "postgres", error=str(e))
    name = _scratch_name()
    try:
        admin = psycopg.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.Error as e:
        return ExecutionResult("unsupported", "postgres", error=f"cannot connect to the PostgreSQL server: {_short(e)}")
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            return _run_postgres(query, ddl, rows_sql, pg_conninfo.make_conninfo(dsn, dbname=name),
                                 min_rows, timeout_s, RowBudget(max_rows, max_bytes), preview_rows)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    except psycopg.Error as e:
        return ExecutionResult("error", "postgres", error=f"scratch database: {_short(e)}")
    finally:
        admin.close()


def _run_postgres(query: str, ddl: str, rows_sql: str, dsn: str, min_rows: int, timeout_s: float, budget: RowBudget,
                  preview_rows: int) -> ExecutionResult:
    with psycopg.connect(dsn, connect_timeout=10) as conn:
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET statement_timeout = {int(max(timeout_s, LOAD_TIMEOUT_S) * 1000)}".encode())
                for st in split_sql(ddl, "postgres") + split_sql(rows_sql, "postgres"):
                    cur.execute(st.encode())
            conn.commit()
        except psycopg.Error as e:
            return ExecutionResult("error", "postgres", error=f"schema or rows do not load: {_short(e)}")
        try:
            with conn.cursor() as cur:
                cur.execute(f"SET statement_timeout = {max(1, int(timeout_s * 1000))}".encode())
            with conn.cursor(name="synth_result") as cur:
                cur.execute(query.encode())
                rows = fetch_limited(cur, budget)
                columns = [d.name for d in cur.description or []]
        except pg_errors.QueryCanceled:
            return ExecutionResult("timeout", "postgres", error=f"statement timeout after {timeout_s}s")
        except LimitExceeded as e:
            return ExecutionResult("limit_exceeded", "postgres", error=str(e))
        except psycopg.Error as e:
            return ExecutionResult("error", "postgres", error=_short(e))
        finally:
            conn.rollback()
    return finish("postgres", query, "postgres", columns, rows, min_rows, preview_rows)


# ---- MySQL / MariaDB -------------------------------------------------------------------------------------

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


def execute_on_mysql(query: str, ddl: str, rows_sql: str, dsn: str, *, min_rows: int = 1, timeout_s: float = 5.0,
                     max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES, preview_rows: int = 5) -> ExecutionResult:
    """Load `ddl` + `rows_sql` into a fresh database of the MySQL/MariaDB server at `dsn`, run
    `query` (one statement, unbuffered) under MySQL 8's sql_mode, drop the database."""
    try:
        query = single_statement(query, "mysql")
        params = mysql_params(dsn)
    except (StatementRefused, ValueError) as e:
        return ExecutionResult("refused", "mysql", error=str(e))
    name = _scratch_name()
    try:
        admin = pymysql.connect(autocommit=True, **params)
    except pymysql.MySQLError as e:
        return ExecutionResult("unsupported", "mysql", error=f"cannot connect to the MySQL server: {_mysql_error(e)[1]}")
    try:
        with admin.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        try:
            return _run_mysql(query, ddl, rows_sql, {**params, "database": name, "read_timeout": int(timeout_s) + 30},
                              min_rows, timeout_s, RowBudget(max_rows, max_bytes), preview_rows)
        finally:
            with admin.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
    except pymysql.MySQLError as e:
        return ExecutionResult("error", "mysql", error=f"scratch database: {_mysql_error(e)[1]}")
    finally:
        admin.close()


def _mysql_statement_timeout(cur: Any, seconds: float) -> None:
    try:
        cur.execute(f"SET SESSION max_statement_time = {seconds:.3f}")          # MariaDB
    except pymysql.MySQLError:
        cur.execute(f"SET SESSION max_execution_time = {int(seconds * 1000)}")  # MySQL (SELECT only)


def _run_mysql(query: str, ddl: str, rows_sql: str, params: dict[str, Any], min_rows: int, timeout_s: float,
               budget: RowBudget, preview_rows: int) -> ExecutionResult:
    conn = pymysql.connect(autocommit=True, **params)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SET SESSION sql_mode = '{MYSQL8_SQL_MODE}'")
            _mysql_statement_timeout(cur, max(timeout_s, LOAD_TIMEOUT_S))
            try:
                for st in split_sql(ddl, "mysql") + split_sql(rows_sql, "mysql"):
                    cur.execute(st)
            except pymysql.MySQLError as e:
                return ExecutionResult("error", "mysql", error=f"schema or rows do not load: {_mysql_error(e)[1]}")
            _mysql_statement_timeout(cur, timeout_s)
        try:
            with conn.cursor(pymysql.cursors.SSCursor) as cur:
                cur.execute(query)
                columns = [d[0] for d in cur.description or []]
                rows = fetch_limited(cur, budget)
        except LimitExceeded as e:
            return ExecutionResult("limit_exceeded", "mysql", error=str(e))
        except pymysql.MySQLError as e:
            code, msg = _mysql_error(e)
            if code in (1969, 3024) or "max_statement_time" in msg:      # MariaDB, MySQL: statement timeout
                return ExecutionResult("timeout", "mysql", error=f"statement timeout after {timeout_s}s")
            return ExecutionResult("error", "mysql", error=msg)
    finally:
        conn.close()
    return finish("mysql", query, "mysql", columns, rows, min_rows, preview_rows)


# ---- which server ----------------------------------------------------------------------------------------

SERVER_EXECUTORS: dict[str, Callable[..., ExecutionResult]] = {"postgres": execute_on_postgres, "mysql": execute_on_mysql}


def dsn_from_env(dialect: str) -> str | None:
    """The DSN of the server configured for `dialect` (SYNTH_PG_DSN, SYNTH_MYSQL_DSN), or None."""
    var = DSN_ENV.get(dialect)
    return (os.environ.get(var) or None) if var else None
