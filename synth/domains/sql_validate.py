"""Validators for text-to-SQL records (Nemotron 3 Super §3.1.1 "Text-to-SQL"; spec §2.10).

A record is a schema (DDL) with sample rows, a natural-language request and a gold query, in one
of three dialects. What is checked, all as pure functions:

1. `parse_statements` / `check_query_syntax`: the query parses with sqlglot *in its own dialect*,
   is exactly one read-only query, and passes `dialect_lint`, which catches syntax sqlglot accepts
   leniently but the real engine rejects (`::` casts outside PostgreSQL, `LIMIT a, b` in
   PostgreSQL, `DISTINCT ON` outside PostgreSQL, ...).
2. Execution (`execute_sample`, run by `validate_sql_sample` in a worker process under memory,
   row and byte limits, `execute_isolated`): on the dialect's real server when one is configured
   (PostgreSQL, MySQL/MariaDB: `sql_engines`, a fresh database per query), else in an in-memory
   SQLite database (other dialects mapped onto SQLite's type affinities and transpiled with
   sqlglot). A query that uses a function SQLite lacks (PostGIS, DATE_TRUNC) is "unsupported"
   there, not "wrong": only a real server can judge it.
3. `distractor_leaks`: the gold query, qualified against the schema the model sees (real tables
   plus injected distractors), references no distractor table or column (`SELECT *` over a table
   with a distractor column counts as a reference). The execution in (2) runs on the schema
   *without* distractors, which is a second, independent proof.

SQLite execution is sandboxed the way an in-process database allows: one statement (a second one
is refused, not dropped), an authorizer refuses ATTACH (no file access) and PRAGMA, a progress
handler stops a query after `timeout_s` (a runaway recursive CTE), no value may exceed 16 MB
(`SELECT zeroblob(200000000)` fails at once), and at most 10,000 rows and 16 MB are fetched
(`limit_exceeded` past either). Result sets compare order-insensitively unless the query orders
them, NULL equal to NULL (`sql_engines.results_match`).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, OptimizeError, ParseError, SqlglotError, TokenError
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, traverse_scope
from sqlglot.tokens import TokenType

from synth.domains.sql_engines import (MAX_BYTES, MAX_ROWS, SERVER_EXECUTORS, ExecutionResult, LimitExceeded, RowBudget,
                                       StatementRefused, drop_scratch, fetch_limited, finish, scratch_name, single_statement,
                                       split_sql)

# sqlglot warns on statements it keeps as opaque commands (CREATE EXTENSION ...); those are
# reported in `sqlite_script`'s notes instead.
logging.getLogger("sqlglot").setLevel(logging.ERROR)

DIALECTS = ("sqlite", "postgres", "mysql")
# How users name the dialects (the paper's names) -> sqlglot's names.
DIALECT_ALIASES = {"sqlite": "sqlite", "postgres": "postgres", "postgresql": "postgres", "mysql": "mysql"}

# Words none of the three engines accepts as an unquoted alias (checked against SQLite, whose
# parser is the most forgiving; all are reserved in MySQL 8 and PostgreSQL). sqlglot sometimes
# parses `FROM t GROUP` as the table alias "GROUP"; the real engines raise a syntax error.
RESERVED_ALIASES = frozenset({
    "SELECT", "FROM", "WHERE", "GROUP", "ORDER", "HAVING", "LIMIT", "UNION", "JOIN", "ON", "AND", "OR",
    "NOT", "AS", "CASE", "WHEN", "THEN", "ELSE", "INTO", "VALUES", "TABLE", "DISTINCT", "INTERSECT", "EXCEPT",
})
# ... and, as table aliases, the join keywords too
RESERVED_TABLE_ALIASES = RESERVED_ALIASES | {"INNER", "LEFT", "RIGHT", "OUTER", "CROSS"}


def canonical_dialect(dialect: str) -> str:
    try:
        return DIALECT_ALIASES[dialect.lower()]
    except KeyError:
        raise ValueError(f"unknown SQL dialect {dialect!r}; expected one of {sorted(DIALECT_ALIASES)}") from None


# ---------------------------------------------------------------------------------------------
# Verdicts
# ---------------------------------------------------------------------------------------------

@dataclass
class Check:
    """One named check: passed or not, and why."""

    name: str
    ok: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# 1. Syntax in the dialect
# ---------------------------------------------------------------------------------------------

def short_error(e: Exception) -> str:
    text = str(e).replace("\x1b[4m", "").replace("\x1b[0m", "")
    return " ".join(text.split())[:300]


def parse_statements(sql: str, dialect: str) -> list[exp.Expression]:
    """All statements in `sql`, parsed strictly in `dialect`; raises `ParseError`/`TokenError`."""
    dialect = canonical_dialect(dialect)
    return [s for s in sqlglot.parse(sql, read=dialect, error_level=ErrorLevel.RAISE) if s is not None]


# MySQL 8.0's CAST/CONVERT target types (its manual, "Cast Functions and Operators"); MariaDB also
# takes INT/INTEGER/VARCHAR there, so a MySQL sample run on MariaDB is held to MySQL's list here.
MYSQL8_CAST_TYPES = frozenset({"BINARY", "CHAR", "DATE", "DATETIME", "DECIMAL", "DOUBLE", "FLOAT", "JSON", "NCHAR",
                               "REAL", "SIGNED", "UNSIGNED", "TIME", "YEAR"})


# Functions MariaDB (which runs MySQL samples) has and MySQL 8.0 lacks: a MySQL sample calling one is
# refused here, since MariaDB would run it.
MARIADB_ONLY_FUNCTIONS = frozenset({"NVL", "NVL2", "MEDIAN", "PERCENTILE_CONT", "PERCENTILE_DISC", "TO_CHAR", "ADD_MONTHS",
                                    "SYS_GUID", "DECODE_ORACLE", "LENGTHB", "CHR", "NATURAL_SORT_KEY", "SFORMAT",
                                    "JSON_QUERY", "JSON_EXISTS", "JSON_EQUALS", "JSON_NORMALIZE", "JSON_DETAILED",
                                    "JSON_LOOSE", "JSON_COMPACT"})


def mysql8_function_problems(tokens: list[Any]) -> list[str]:
    """Calls of MARIADB_ONLY_FUNCTIONS (MySQL 8.0 rejects them; MariaDB would not)."""
    return sorted({f"{t.text.upper()}() is MariaDB's, not a MySQL 8.0 function" for t, nxt in zip(tokens, tokens[1:])
                   if t.text.upper() in MARIADB_ONLY_FUNCTIONS and nxt.token_type == TokenType.L_PAREN})


def mysql8_cast_problems(tokens: list[Any]) -> list[str]:
    """CAST(x AS t) / CONVERT(x, t) whose type t MySQL 8.0 does not accept (e.g. INTEGER: it needs SIGNED)."""
    problems = []
    for i, tok in enumerate(tokens[:-1]):
        func = tok.text.upper()
        if func not in ("CAST", "CONVERT") or tokens[i + 1].token_type != TokenType.L_PAREN:
            continue
        depth, sep = 0, TokenType.ALIAS if func == "CAST" else TokenType.COMMA
        for j in range(i + 1, len(tokens) - 1):
            depth += {TokenType.L_PAREN: 1, TokenType.R_PAREN: -1}.get(tokens[j].token_type, 0)
            if depth == 0:
                break
            if depth == 1 and tokens[j].token_type == sep:
                target = tokens[j + 1].text.upper().split()[0] if tokens[j + 1].text.strip() else ""
                if target not in MYSQL8_CAST_TYPES:
                    problems.append(f"{func}(... {'AS ' if func == 'CAST' else ', '}{tokens[j + 1].text}) is not MySQL 8.0 "
                                    f"(its cast types: SIGNED, UNSIGNED, DECIMAL, CHAR, DATE, ...)")
                break
    return problems


def dialect_lint(sql: str, dialect: str) -> list[str]:
    """Syntax that sqlglot parses in `dialect` but the dialect's real engine rejects.

    sqlglot is a transpiler, so its parsers are deliberately lenient (each accepts most other
    dialects' syntax). These rules name the common cases a teacher model mixes up.
    """
    dialect = canonical_dialect(dialect)
    problems: list[str] = []
    try:
        tokens = sqlglot.tokenize(sql, read=dialect)
    except TokenError as e:
        return [f"does not tokenize: {short_error(e)}"]
    types = [t.token_type for t in tokens]
    texts = [t.text.upper() for t in tokens]
    if dialect != "postgres":
        if TokenType.DCOLON in types:
            problems.append(f"'::' casts are PostgreSQL syntax, not {dialect}")
        if TokenType.ILIKE in types:
            problems.append(f"ILIKE is PostgreSQL syntax, not {dialect}")
        for i, t in enumerate(types[:-1]):
            if t == TokenType.DISTINCT and types[i + 1] == TokenType.ON:
                problems.append(f"DISTINCT ON is PostgreSQL syntax, not {dialect}")
    if dialect == "postgres":
        for i in range(len(types) - 3):
            if types[i] == TokenType.LIMIT and types[i + 2] == TokenType.COMMA:
                problems.append("'LIMIT offset, count' is MySQL/SQLite syntax; PostgreSQL needs LIMIT .. OFFSET ..")
        if any(x in ("REGEXP", "RLIKE") for x in texts):
            problems.append("REGEXP/RLIKE are not PostgreSQL operators (use ~)")
    if dialect in ("mysql", "sqlite"):
        if TokenType.FETCH in types:
            problems.append(f"FETCH FIRST is not supported by {dialect} (use LIMIT)")
    if dialect == "mysql":
        for i, t in enumerate(types[:-1]):
            if texts[i] == "NULLS" and texts[i + 1] in ("FIRST", "LAST"):
                problems.append("NULLS FIRST/LAST is not supported by MySQL")
                break
        problems += mysql8_cast_problems(tokens) + mysql8_function_problems(tokens)
    try:
        statements = parse_statements(sql, dialect)
    except (ParseError, TokenError):
        return problems
    for st in statements:
        # PostgreSQL accepts any keyword as a column label after AS; table aliases and the other
        # engines' column aliases must not be reserved words
        kinds = (exp.TableAlias,) if dialect == "postgres" else (exp.TableAlias, exp.Alias)
        for alias in st.find_all(*kinds):
            ident = alias.args.get("alias") if isinstance(alias, exp.Alias) else alias.this
            reserved = RESERVED_TABLE_ALIASES if isinstance(alias, exp.TableAlias) else RESERVED_ALIASES
            if isinstance(ident, exp.Identifier) and not ident.quoted and ident.name.upper() in reserved:
                problems.append(f"reserved word {ident.name!r} used as an unquoted alias")
        try:
            st.sql(dialect=dialect, unsupported_level=ErrorLevel.RAISE)
        except SqlglotError as e:
            problems.append(f"not expressible in {dialect}: {short_error(e)}")
    return sorted(set(problems))


def check_query_syntax(sql: str, dialect: str) -> Check:
    """The gold query parses in its dialect, is one read-only query, and passes `dialect_lint`."""
    try:
        statements = parse_statements(sql, dialect)
    except (ParseError, TokenError) as e:
        return Check("syntax", False, f"does not parse as {canonical_dialect(dialect)}: {short_error(e)}")
    if len(statements) != 1:
        return Check("syntax", False, f"expected exactly one statement, found {len(statements)}")
    if not isinstance(statements[0], exp.Query):
        return Check("syntax", False, f"expected a read-only query (SELECT/WITH/UNION), found {statements[0].key.upper()}")
    lint = dialect_lint(sql, dialect)
    if lint:
        return Check("syntax", False, "; ".join(lint))
    return Check("syntax", True)


# ---------------------------------------------------------------------------------------------
# Schema: tables and columns of a DDL script
# ---------------------------------------------------------------------------------------------

@dataclass
class TableDef:
    name: str
    columns: list[tuple[str, str]]      # (column, declared type in the source dialect)

    def column_names(self) -> list[str]:
        return [c for c, _ in self.columns]


def _table_name(create: exp.Create) -> str:
    target = create.this
    table = target.this if isinstance(target, exp.Schema) else target
    return table.name if isinstance(table, exp.Table) else str(table)


def schema_tables(ddl: str, dialect: str) -> list[TableDef]:
    """Tables and columns declared by the CREATE TABLE statements of `ddl`, in order."""
    tables: list[TableDef] = []
    for st in parse_statements(ddl, dialect):
        if isinstance(st, exp.Create) and (st.args.get("kind") or "").upper() == "TABLE" and isinstance(st.this, exp.Schema):
            cols = [(cd.name, cd.args["kind"].sql(dialect=canonical_dialect(dialect)) if cd.args.get("kind") else "")
                    for cd in st.this.expressions if isinstance(cd, exp.ColumnDef)]
            tables.append(TableDef(_table_name(st), cols))
    return tables


def schema_mapping(tables: Iterable[TableDef]) -> dict[str, dict[str, str]]:
    """The {table: {column: type}} mapping sqlglot's qualifier wants (lower-cased names)."""
    return {t.name.lower(): {c.lower(): (typ or "TEXT") for c, typ in t.columns} for t in tables}


# ---------------------------------------------------------------------------------------------
# 2. Execution in SQLite
# ---------------------------------------------------------------------------------------------

_INTEGER_TYPES = {"BOOLEAN", "BIT", "SERIAL", "BIGSERIAL", "SMALLSERIAL", "YEAR"}
_REAL_TYPES = {"FLOAT", "DOUBLE", "REAL"}
_NUMERIC_TYPES = {"DECIMAL", "NUMERIC", "MONEY", "SMALLMONEY", "BIGDECIMAL", "UDECIMAL", "DECIMAL32", "DECIMAL64", "DECIMAL128"}
_BLOB_TYPES = {"BINARY", "VARBINARY", "BLOB", "LONGBLOB", "MEDIUMBLOB", "TINYBLOB", "IMAGE"}


def sqlite_affinity(data_type: exp.DataType | None) -> str:
    """The SQLite type affinity for a declared column type of any dialect (SQLite §3.1 rules)."""
    if data_type is None:
        return "TEXT"
    name = data_type.this.name if hasattr(data_type.this, "name") else str(data_type.this)
    name = name.upper()
    if "INT" in name or name in _INTEGER_TYPES:
        return "INTEGER"
    if name in _REAL_TYPES:
        return "REAL"
    if name in _NUMERIC_TYPES:
        return "NUMERIC"
    if name in _BLOB_TYPES or name.endswith("BLOB"):
        return "BLOB"
    return "TEXT"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def create_table_for_sqlite(create: exp.Create, dialect: str) -> str:
    """Rewrite one CREATE TABLE of any dialect as SQLite DDL that keeps what shapes the data.

    Kept: column names, affinities, NOT NULL, PRIMARY KEY (an integer primary key becomes SQLite's
    auto-assigned `INTEGER PRIMARY KEY`, which is what SERIAL and AUTO_INCREMENT mean), UNIQUE,
    defaults that SQLite can evaluate. Dropped: engine options, charsets, collations, comments,
    indexes, foreign keys (SQLite does not enforce them by default) and CHECK constraints.
    """
    schema = create.this
    parts: list[str] = []
    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            affinity = sqlite_affinity(item.args.get("kind"))
            words = [_quote(item.name), affinity]
            for c in item.args.get("constraints") or []:
                kind = c.args.get("kind") if isinstance(c, exp.ColumnConstraint) else c
                if isinstance(kind, exp.PrimaryKeyColumnConstraint):
                    words.append("PRIMARY KEY")
                elif isinstance(kind, exp.NotNullColumnConstraint) and not kind.args.get("allow_null"):
                    words.append("NOT NULL")
                elif isinstance(kind, exp.UniqueColumnConstraint):
                    words.append("UNIQUE")
                elif isinstance(kind, exp.DefaultColumnConstraint):
                    try:
                        default_sql = kind.this.sql(dialect="sqlite", unsupported_level=ErrorLevel.RAISE)
                    except SqlglotError:
                        continue
                    if isinstance(kind.this, (exp.Literal, exp.Boolean, exp.Null, exp.Neg)) or default_sql.upper() in (
                            "CURRENT_TIMESTAMP", "CURRENT_DATE", "CURRENT_TIME"):
                        words.append(f"DEFAULT {default_sql}" if isinstance(kind.this, (exp.Literal, exp.Boolean, exp.Null, exp.Neg))
                                     else f"DEFAULT ({default_sql})")
            parts.append(" ".join(words))
        elif isinstance(item, exp.PrimaryKey):
            cols = [e.name for e in item.expressions]
            parts.append("PRIMARY KEY (" + ", ".join(_quote(c) for c in cols) + ")")
        elif isinstance(item, exp.UniqueColumnConstraint) and isinstance(item.this, exp.Schema):
            cols = [e.name for e in item.this.expressions]
            if cols:
                parts.append("UNIQUE (" + ", ".join(_quote(c) for c in cols) + ")")
        elif isinstance(item, exp.Constraint):
            for sub in item.expressions:
                if isinstance(sub, exp.PrimaryKey):
                    parts.append("PRIMARY KEY (" + ", ".join(_quote(e.name) for e in sub.expressions) + ")")
    return f"CREATE TABLE {_quote(_table_name(create))} (" + ", ".join(parts) + ")"


def sqlite_script(ddl: str, rows_sql: str, dialect: str) -> tuple[list[str], list[str]]:
    """(statements to run, notes on skipped statements) for loading a schema and rows into SQLite."""
    dialect = canonical_dialect(dialect)
    out: list[str] = []
    notes: list[str] = []
    for st in parse_statements(ddl, dialect):
        if isinstance(st, exp.Create) and (st.args.get("kind") or "").upper() == "TABLE" and isinstance(st.this, exp.Schema):
            out.append(create_table_for_sqlite(st, dialect))
        elif isinstance(st, exp.Create) and (st.args.get("kind") or "").upper() == "VIEW":
            out.append(st.sql(dialect="sqlite"))
        else:
            notes.append(f"skipped {st.key.upper()} (not needed to run queries in SQLite): {st.sql(dialect=dialect)[:60]}")
    for st in parse_statements(rows_sql, dialect) if rows_sql.strip() else []:
        if not isinstance(st, exp.Insert):
            raise ValueError(f"sample rows must be INSERT statements, found {st.key.upper()}: {st.sql(dialect=dialect)[:80]}")
        out.append(st.sql(dialect="sqlite"))
    return out, notes


_DENIED = {sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH, sqlite3.SQLITE_PRAGMA}


def _deny_attach(action: int, *args: Any) -> int:
    """The authorizer: no ATTACH/DETACH (no file access), no PRAGMA (no engine settings)."""
    return sqlite3.SQLITE_DENY if action in _DENIED else sqlite3.SQLITE_OK


def load_sqlite(ddl: str, rows_sql: str, dialect: str, timeout_s: float = 5.0,
                max_value_bytes: int = MAX_BYTES) -> sqlite3.Connection:
    """An in-memory database holding `ddl` and `rows_sql`; raises ValueError naming the statement
    that failed. No value may exceed `max_value_bytes` (`SELECT zeroblob(200000000)` fails fast)."""
    statements, _ = sqlite_script(ddl, rows_sql, dialect)
    con = sqlite3.connect(":memory:")
    con.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value_bytes)
    con.set_authorizer(_deny_attach)
    deadline = time.monotonic() + timeout_s
    con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
    for s in statements:
        try:
            con.execute(s)
        except sqlite3.Error as e:
            con.close()
            raise ValueError(f"{e} in: {s[:160]}") from None
    con.commit()
    return con


def execute_in_sqlite(query: str, ddl: str, rows_sql: str, dialect: str, *, min_rows: int = 1,
                      timeout_s: float = 5.0, max_rows: int = MAX_ROWS, preview_rows: int = 5,
                      max_bytes: int = MAX_BYTES) -> ExecutionResult:
    """Run `query` (in `dialect`; exactly one statement, PRAGMA refused) against `ddl` + `rows_sql`
    loaded into in-memory SQLite, fetching at most `max_rows` rows and `max_bytes` bytes.

    Status `unsupported` means the query is valid-looking but uses what SQLite cannot run (a
    function SQLite lacks after transpilation); it is not evidence either way. `limit_exceeded`:
    a result past the row or byte limit, or a value past SQLite's length limit.
    """
    dialect = canonical_dialect(dialect)
    try:
        query = single_statement(query, dialect)
    except StatementRefused as e:
        return ExecutionResult("refused", "sqlite", error=str(e))
    try:
        con = load_sqlite(ddl, rows_sql, dialect, timeout_s=timeout_s, max_value_bytes=max_bytes)
    except (ValueError, ParseError, TokenError) as e:
        return ExecutionResult("error", "sqlite", error=f"schema or rows do not load: {short_error(e)}")
    try:
        try:
            sqlite_sql = sqlglot.transpile(query, read=dialect, write="sqlite", unsupported_level=ErrorLevel.RAISE)[0]
        except SqlglotError as e:
            return ExecutionResult("unsupported", "sqlite", error=f"cannot transpile to SQLite: {short_error(e)}")
        deadline = time.monotonic() + timeout_s
        con.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 10_000)
        try:
            cur = con.execute(sqlite_sql)
            rows = fetch_limited(cur, RowBudget(max_rows, max_bytes))
        except LimitExceeded as e:
            return ExecutionResult("limit_exceeded", "sqlite", error=str(e))
        except sqlite3.OperationalError as e:
            msg = str(e)
            if msg == "interrupted":
                return ExecutionResult("timeout", "sqlite", error=f"stopped after {timeout_s}s")
            if dialect != "sqlite" and msg.startswith("no such function"):
                return ExecutionResult("unsupported", "sqlite", error=f"{msg} (a {dialect} function SQLite lacks)")
            return ExecutionResult("error", "sqlite", error=msg)
        except sqlite3.DataError as e:
            return ExecutionResult("limit_exceeded", "sqlite", error=f"{e} (a value over {max_bytes} bytes)")
        except sqlite3.DatabaseError as e:
            status = "refused" if "not authorized" in str(e) else "error"
            return ExecutionResult(status, "sqlite", error=str(e))
        except sqlite3.Error as e:
            return ExecutionResult("error", "sqlite", error=str(e))
        columns = [d[0] for d in cur.description or []]
        return finish("sqlite", query, dialect, columns, rows, min_rows, preview_rows)
    finally:
        con.close()


def execute_sample(query: str, ddl: str, rows_sql: str, dialect: str, *, dsn: str | None = None, min_rows: int = 1,
                   timeout_s: float = 5.0, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES,
                   scratch: str | None = None) -> ExecutionResult:
    """Run a sample where its dialect runs: on the server at `dsn` (PostgreSQL or MySQL/MariaDB; in a
    scratch database and as a scratch role named `scratch`), else in SQLite; a non-SQLite query that
    resolved but fails in SQLite is `unsupported` there."""
    dialect = canonical_dialect(dialect)
    kw = dict(min_rows=min_rows, timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes)
    if dsn and dialect in SERVER_EXECUTORS:
        return SERVER_EXECUTORS[dialect](query, ddl, rows_sql, dsn, scratch=scratch, **kw)
    result = execute_in_sqlite(query, ddl, rows_sql, dialect, **kw)
    if dialect != "sqlite" and result.status == "error" and not result.error.startswith("schema or rows"):
        result.status = "unsupported"
        result.error = f"{result.error} (after transpiling {dialect} to SQLite; the query resolves against the schema)"
    return result


def _worker_limits(memory_mb: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _drop_after_worker(engine: str, dsn: str | None, scratch: str | None) -> None:
    """A worker that died before its own cleanup leaves its scratch database and role: drop them."""
    if dsn and scratch:
        try:
            drop_scratch(engine, dsn, scratch)
        except Exception as e:          # the verdict stands; the leftover is named in the log
            logging.getLogger(__name__).warning("could not drop scratch %s on the %s server: %s", scratch, engine, e)


def execute_isolated(query: str, ddl: str, rows_sql: str, dialect: str, *, dsn: str | None = None, min_rows: int = 1,
                     timeout_s: float = 5.0, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES,
                     memory_mb: int = 1024) -> ExecutionResult:
    """`execute_sample` in a worker process (`python -m synth.domains.sql_validate`) whose address
    space is capped at `memory_mb`: a result or value too large for it is `limit_exceeded`, a
    worker past the time limit is killed (`timeout`). The validator's own memory is never at risk."""
    on_server = bool(dsn) and canonical_dialect(dialect) in SERVER_EXECUTORS
    scratch = scratch_name() if on_server else None
    spec = dict(query=query, ddl=ddl, rows_sql=rows_sql, dialect=dialect, dsn=dsn, min_rows=min_rows,
                timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes, scratch=scratch)
    engine = canonical_dialect(dialect) if on_server else "sqlite"
    wall_s = timeout_s + 60          # loading the schema, connecting, creating and dropping the database
    try:
        proc = subprocess.run([sys.executable, "-m", "synth.domains.sql_validate"], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=wall_s, env={**os.environ, "PYTHONHASHSEED": "0"},
                              preexec_fn=lambda: _worker_limits(memory_mb))
    except subprocess.TimeoutExpired:
        _drop_after_worker(engine, dsn, scratch)
        return ExecutionResult("timeout", engine, error=f"the execution worker did not finish within {wall_s}s")
    if proc.returncode != 0:
        _drop_after_worker(engine, dsn, scratch)
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        if proc.returncode < 0 or "MemoryError" in proc.stderr or "Cannot allocate" in proc.stderr:
            return ExecutionResult("limit_exceeded", engine, error=f"the execution worker ran out of its {memory_mb} MB ({tail[:120]})")
        return ExecutionResult("error", engine, error=f"the execution worker failed: {tail[:200]}")
    return ExecutionResult(**json.loads(proc.stdout))


# ---------------------------------------------------------------------------------------------
# 3. Distractors: injection and the proof that the gold query ignores them
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DistractorColumn:
    table: str
    column: str
    type: str = "TEXT"


def _source_table(scope: Scope, alias: str) -> exp.Table | None:
    """The base table a column qualifier names, looking through enclosing scopes (correlation)."""
    s: Scope | None = scope
    while s is not None:
        src = s.sources.get(alias)
        if src is not None:
            return src if isinstance(src, exp.Table) else None
        s = s.parent
    return None


def query_references(query: str, dialect: str, schema: dict[str, dict[str, str]]) -> tuple[set[str], set[tuple[str, str]]]:
    """(tables, (table, column) pairs) the query reads, resolved against `schema` (lower-case names).

    `SELECT *` is expanded against the schema, so it references every column of the table. Raises
    `OptimizeError` when a column cannot be resolved (the query does not fit the schema).
    """
    dialect = canonical_dialect(dialect)
    expr = sqlglot.parse_one(query, read=dialect)
    cte_names = {c.alias_or_name.lower() for c in expr.find_all(exp.CTE)}
    tables = {t.name.lower() for t in expr.find_all(exp.Table) if t.name and t.name.lower() not in cte_names}
    qualified = qualify(expr.copy(), schema=schema, dialect=dialect, validate_qualify_columns=True,
                        expand_stars=True, quote_identifiers=False, identify=False)
    columns: set[tuple[str, str]] = set()
    for scope in traverse_scope(qualified):
        for col in scope.columns:
            if not col.table:
                continue
            src = _source_table(scope, col.table)
            if src is not None:
                columns.add((src.name.lower(), col.name.lower()))
    return tables, columns


def _owner_select(node: exp.Expression) -> exp.Select | None:
    """The nearest SELECT around `node`."""
    p = node.parent
    while p is not None and not isinstance(p, exp.Select):
        p = p.parent
    return p


def _in_aggregate(node: exp.Expression, stop: exp.Expression) -> bool:
    """`node` sits inside an aggregate (not a window function) below `stop`."""
    p = node.parent
    while p is not None:
        if isinstance(p, exp.AggFunc) and not isinstance(p.parent, exp.Window):
            return True
        if p is stop:
            return False
        p = p.parent
    return False


def ungrouped_columns(query: str, dialect: str, schema: dict[str, dict[str, str]]) -> list[str]:
    """Selected columns that are neither grouped nor aggregated, in a query that groups or
    aggregates: what PostgreSQL and MySQL's ONLY_FULL_GROUP_BY reject ("column must appear in the
    GROUP BY clause or be used in an aggregate function") and SQLite runs. Conservative: a column
    of a table that has any grouped column is let through (it may depend on that table's key)."""
    dialect = canonical_dialect(dialect)
    tree = qualify(sqlglot.parse_one(query, read=dialect), schema=schema, dialect=dialect,
                   validate_qualify_columns=False, quote_identifiers=False, identify=False)
    found: list[str] = []
    for select in tree.find_all(exp.Select):
        group = select.args.get("group")
        projections = [e.unalias() for e in select.expressions]
        aggregated = any(_owner_select(c) is select and not isinstance(c.parent, exp.Window)
                         for e in projections for c in e.find_all(exp.AggFunc))
        if group is None and not aggregated:
            continue
        keys = list(group.expressions) if group is not None else []
        grouped = {k.sql() for k in keys}
        for k in keys:                               # GROUP BY 1: the first projection
            if isinstance(k, exp.Literal) and k.is_int and 0 < int(k.name) <= len(projections):
                grouped.add(projections[int(k.name) - 1].sql())
        grouped_tables = {c.table for k in keys for c in k.find_all(exp.Column)}
        for e in projections:
            if e.sql() in grouped:
                continue
            for col in e.find_all(exp.Column):
                if _owner_select(col) is not select or _in_aggregate(col, e) or col.sql() in grouped:
                    continue
                if col.table and col.table in grouped_tables:
                    continue
                found.append(col.sql())
    return sorted(set(found))


def distractor_leaks(query: str, dialect: str, visible_schema: dict[str, dict[str, str]],
                     distractor_tables: Iterable[str], distractor_columns: Iterable[DistractorColumn]) -> list[str]:
    """Every distractor the gold query references; empty means it provably ignores them all.

    `visible_schema` is what the model is shown (real tables + distractors). A query that does not
    resolve against it is reported as a leak too: its references cannot be proved clean.
    """
    d_tables = {t.lower() for t in distractor_tables}
    d_cols = {(c.table.lower(), c.column.lower()) for c in distractor_columns}
    try:
        tables, columns = query_references(query, dialect, visible_schema)
    except (OptimizeError, ParseError, TokenError) as e:
        return [f"query does not resolve against the schema: {short_error(e)}"]
    leaks = [f"table {t}" for t in sorted(tables & d_tables)]
    leaks += [f"column {t}.{c}" for t, c in sorted(columns) if (t, c) in d_cols or t in d_tables]
    return leaks


def _singular(name: str) -> str:
    if name.endswith("ies") and len(name) > 4:
        return name[:-3] + "y"
    if name.endswith("ses") or name.endswith("xes"):
        return name[:-2]
    if name.endswith("s") and not name.endswith("ss") and len(name) > 3:
        return name[:-1]
    return name


def propose_distractors(tables: list[TableDef], rng: Any, n_tables: int = 2, n_columns: int = 2,
                        pool_tables: list[dict[str, Any]] | None = None,
                        pool_columns: list[dict[str, str]] | None = None) -> tuple[list[TableDef], list[DistractorColumn]]:
    """Related-but-irrelevant tables and columns for a schema (Data Designer's distractor idea).

    Candidates are deliberately confusable: an `<table>_archive` copy of a real table, a
    `<table>_audit` log keyed to it, tables from `pool_tables`; columns such as `previous_<col>`
    or `legacy_<table>_code` from `pool_columns`. No candidate collides with a real name.
    `rng` is a `random.Random` (the caller records its seed).
    """
    real_tables = {t.name.lower() for t in tables}
    candidates_t: list[TableDef] = []
    for t in tables:
        candidates_t.append(TableDef(f"{t.name}_archive", list(t.columns)))
        candidates_t.append(TableDef(f"{t.name}_audit", [
            ("audit_id", "INTEGER"), (f"{_singular(t.name)}_id", "INTEGER"), ("changed_at", "TIMESTAMP"),
            ("changed_by", "VARCHAR(64)"), ("change_type", "VARCHAR(16)")]))
    for spec in pool_tables or []:
        candidates_t.append(TableDef(spec["name"], [(c["name"], c.get("type", "TEXT")) for c in spec["columns"]]))
    candidates_t = [t for t in candidates_t if t.name.lower() not in real_tables]
    picked_t: list[TableDef] = []
    seen: set[str] = set()
    for t in rng.sample(candidates_t, k=len(candidates_t)):
        if len(picked_t) >= n_tables:
            break
        if t.name.lower() not in seen:
            picked_t.append(t)
            seen.add(t.name.lower())

    candidates_c: list[DistractorColumn] = []
    for t in tables:
        existing = {c.lower() for c in t.column_names()}
        names: list[tuple[str, str]] = [(f"legacy_{_singular(t.name)}_code", "VARCHAR(32)")]
        for col, typ in t.columns[1:]:
            names.append((f"previous_{col}", typ or "TEXT"))
        for spec in pool_columns or []:
            names.append((spec["name"], spec.get("type", "TEXT")))
        for name, typ in names:
            if name.lower() not in existing:
                candidates_c.append(DistractorColumn(t.name, name, typ))
    picked_c: list[DistractorColumn] = []
    seen_c: set[tuple[str, str]] = set()
    for c in rng.sample(candidates_c, k=len(candidates_c)):
        if len(picked_c) >= n_columns:
            break
        key = (c.table.lower(), c.column.lower())
        if key not in seen_c:
            picked_c.append(c)
            seen_c.add(key)
    return picked_t, picked_c


def split_statements(sql: str, dialect: str) -> list[str]:
    """The statements of a script as they were written (text between top-level semicolons)."""
    return split_sql(sql, canonical_dialect(dialect))


_TABLE_CONSTRAINT_STARTS = {"CONSTRAINT", "PRIMARY", "PRIMARY KEY", "FOREIGN", "FOREIGN KEY", "UNIQUE", "KEY", "INDEX",
                            "CHECK", "EXCLUDE", "FULLTEXT", "SPATIAL"}


def add_columns_to_create(statement: str, dialect: str, column_defs: list[str]) -> str:
    """Insert column definitions into one CREATE TABLE statement's text after its last column
    (before table-level constraints), leaving everything the author wrote unchanged."""
    tokens = sqlglot.tokenize(statement, read=canonical_dialect(dialect))
    depth = 0
    open_pos = None
    segments: list[tuple[int, int]] = []     # (start, end) char spans of top-level items
    seg_start = None
    for t in tokens:
        if t.token_type == TokenType.L_PAREN:
            depth += 1
            if depth == 1 and open_pos is None:
                open_pos = t.end + 1
                seg_start = open_pos
                continue
        elif t.token_type == TokenType.R_PAREN:
            depth -= 1
            if depth == 0 and open_pos is not None:
                segments.append((seg_start, t.start))
                break
        elif t.token_type == TokenType.COMMA and depth == 1:
            segments.append((seg_start, t.start))
            seg_start = t.end + 1
    if not segments:
        raise ValueError(f"not a CREATE TABLE with a column list: {statement[:80]}")
    last_col_end = None
    for a, b in segments:
        head = statement[a:b].strip().upper()
        if not any(head.startswith(k) for k in _TABLE_CONSTRAINT_STARTS):
            last_col_end = b
    if last_col_end is None:
        raise ValueError(f"CREATE TABLE has no columns: {statement[:80]}")
    # keep the author's layout: one definition per line if they wrote it that way
    a, _ = segments[0]
    lead = statement[a:segments[0][1]]
    sep = ",\n" + (lead[: len(lead) - len(lead.lstrip())].lstrip("\n") or "  ") if "\n" in statement[a:last_col_end] else ", "
    insert = "".join(sep + d for d in column_defs)
    return statement[:last_col_end].rstrip() + insert + statement[last_col_end:]


def inject_distractors(ddl: str, dialect: str, tables: list[TableDef], columns: list[DistractorColumn],
                       rng: Any) -> str:
    """The schema context the model sees: `ddl` with distractor columns added to their tables and
    distractor tables shuffled in among the real ones (so position gives nothing away). The
    author's statements are kept verbatim apart from the added columns."""
    dialect = canonical_dialect(dialect)
    by_table: dict[str, list[DistractorColumn]] = {}
    for c in columns:
        by_table.setdefault(c.table.lower(), []).append(c)
    creates: list[str] = []
    others: list[str] = []
    for text in split_statements(ddl, dialect):
        st = sqlglot.parse_one(text, read=dialect)
        if isinstance(st, exp.Create) and isinstance(st.this, exp.Schema):
            extra = by_table.get(_table_name(st).lower(), [])
            if extra:
                text = add_columns_to_create(text, dialect, [f"{_quote_ident(c.column, dialect)} {c.type}" for c in extra])
            creates.append(text)
        else:
            others.append(text)
    for t in tables:
        cols = ",\n  ".join(f"{_quote_ident(c, dialect)} {typ or 'TEXT'}" for c, typ in t.columns)
        creates.insert(rng.randint(0, len(creates)), f"CREATE TABLE {_quote_ident(t.name, dialect)} (\n  {cols}\n)")
    return "".join(s + ";\n\n" for s in others + creates).rstrip() + "\n"


def _quote_ident(name: str, dialect: str) -> str:
    return exp.to_identifier(name).sql(dialect=dialect)


# ---------------------------------------------------------------------------------------------
# All checks for one record
# ---------------------------------------------------------------------------------------------

@dataclass
class SqlVerdict:
    """The programmatic verdict on one text-to-SQL sample. `ok` iff every check passed."""

    checks: list[Check]
    execution: ExecutionResult | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks],
                "execution": self.execution.to_dict() if self.execution else None}


def validate_sql_sample(*, dialect: str, ddl: str, rows_sql: str, query: str, visible_ddl: str,
                        distractor_tables: list[str], distractor_columns: list[DistractorColumn],
                        min_rows: int = 1, timeout_s: float = 5.0, unsupported: str = "reject",
                        min_distractors: int = 1, executor: Any = None, dsn: str | None = None,
                        max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES, memory_mb: int = 1024) -> SqlVerdict:
    """Every programmatic check of Nemotron 3 §2.10 on one sample, in order, stopping at the first
    failure (later checks would only repeat it):

    syntax (dialect parse + lint) -> schema (the DDL declares tables; the visible DDL parses) ->
    resolution (every table and column the query names exists in the *clean* schema) -> grouping
    (PostgreSQL, MySQL: no selected column outside GROUP BY and aggregates, `ungrouped_columns`) ->
    distractors (at least `min_distractors` injected, none referenced) -> execution (rows come back).

    Execution runs in a worker process under memory, row and byte limits (`execute_isolated`):
    on the dialect's real server when `dsn` names one (`postgresql://...` or `mysql://...`; the
    caller reads it, e.g. `sql_engines.dsn_from_env(dialect)`: this function reads no
    environment), else in SQLite. `executor(query, ddl, rows_sql, dialect) -> ExecutionResult`
    replaces that choice. For a non-SQLite dialect run in SQLite, a failure of a query that
    resolved cleanly is `unsupported` (SQLite cannot judge it), and `unsupported` decides:
    "reject" (default: nothing unverified is kept) or "accept".
    """
    dialect = canonical_dialect(dialect)
    checks: list[Check] = []

    def done(execution: ExecutionResult | None = None) -> SqlVerdict:
        return SqlVerdict(checks, execution)

    syntax = check_query_syntax(query, dialect)
    checks.append(syntax)
    if not syntax.ok:
        return done()
    try:
        clean_tables = schema_tables(ddl, dialect)
        visible_tables = schema_tables(visible_ddl, dialect)
    except (ParseError, TokenError) as e:
        checks.append(Check("schema", False, f"DDL does not parse as {dialect}: {short_error(e)}"))
        return done()
    if not clean_tables:
        checks.append(Check("schema", False, "the DDL declares no table"))
        return done()
    checks.append(Check("schema", True, f"{len(clean_tables)} tables"))
    try:
        query_references(query, dialect, schema_mapping(clean_tables))
        checks.append(Check("resolution", True))
        if dialect in ("postgres", "mysql"):
            loose = ungrouped_columns(query, dialect, schema_mapping(clean_tables))
            checks.append(Check("grouping", not loose, f"{', '.join(loose)} must appear in GROUP BY or be aggregated "
                                                       f"({dialect} rejects it)" if loose else ""))
            if loose:
                return done()
    except (OptimizeError, ParseError, TokenError) as e:
        checks.append(Check("resolution", False, f"the query does not fit the schema: {short_error(e)}"))
        return done()
    n_distractors = len(distractor_tables) + len(distractor_columns)
    leaks = distractor_leaks(query, dialect, schema_mapping(visible_tables), distractor_tables, distractor_columns)
    if n_distractors < min_distractors:
        checks.append(Check("distractors", False, f"{n_distractors} distractors injected, need {min_distractors}"))
        return done()
    checks.append(Check("distractors", not leaks, "references " + ", ".join(leaks) if leaks else f"{n_distractors} injected, none referenced"))
    if leaks:
        return done()
    if executor is not None:
        result = executor(query, ddl, rows_sql, dialect)
    else:
        result = execute_isolated(query, ddl, rows_sql, dialect, dsn=dsn, min_rows=min_rows,
                                  timeout_s=timeout_s, max_rows=max_rows, max_bytes=max_bytes, memory_mb=memory_mb)
    if result.status == "unsupported":
        ok = unsupported == "accept"
        checks.append(Check("execution", ok, f"not executable here: {result.error}"))
    else:
        checks.append(Check("execution", result.ok, f"{result.n_rows} rows" if result.ok else f"{result.status}: {result.error}"))
    return done(result)


def _worker_main() -> None:
    """The execution worker: one `execute_sample` spec (JSON) on stdin, its result (JSON) on stdout."""
    spec = json.loads(sys.stdin.read())
    sys.stdout.write(json.dumps(execute_sample(**spec).to_dict(), default=str))


if __name__ == "__main__":
    _worker_main()
