"""Run a PostgreSQL text-to-SQL sample on a real PostgreSQL server (spec §2.10: "against a real
PostgreSQL server when one is configured"), for what SQLite cannot judge (PostGIS, DATE_TRUNC,
arrays, strict GROUP BY).

It drives the standard `psql` client (no Python driver needed): one session that creates a
throw-away schema, loads the DDL and rows, runs the query with a statement timeout, prints the
result as CSV, and rolls everything back, so the server is left as it was. The DSN comes from an
environment variable (never from a config file), e.g. `SYNTH_PG_DSN=postgresql://user@host/db`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
from typing import Any, Callable

from synth.domains.sql_validate import ExecutionResult

_MARK = "__synth_result__"


def psql_script(ddl: str, rows_sql: str, query: str, schema: str, timeout_s: float) -> str:
    return "\n".join([
        "\\set ON_ERROR_STOP on",
        "\\o /dev/null",
        "BEGIN;",
        f"CREATE SCHEMA {schema};",
        f"SET LOCAL search_path TO {schema}, public;",
        f"SET LOCAL statement_timeout = {int(timeout_s * 1000)};",
        ddl.strip().rstrip(";") + ";",
        (rows_sql.strip().rstrip(";") + ";") if rows_sql.strip() else "",
        "\\o",
        f"\\echo {_MARK}",
        query.strip().rstrip(";") + ";",
        "ROLLBACK;",
    ]) + "\n"


def execute_in_postgres(query: str, ddl: str, rows_sql: str, dsn: str, *, min_rows: int = 1, timeout_s: float = 5.0,
                        preview_rows: int = 5, psql: str | None = None) -> ExecutionResult:
    """Load `ddl` + `rows_sql` into a fresh schema of the server at `dsn`, run `query`, roll back."""
    exe = psql or shutil.which("psql")
    if exe is None:
        return ExecutionResult("unsupported", "postgres", error="psql client not found")
    schema = "synth_" + hashlib.sha256(f"{ddl}{rows_sql}{query}".encode()).hexdigest()[:12]
    script = psql_script(ddl, rows_sql, query, schema, timeout_s)
    try:
        proc = subprocess.run([exe, "-X", "-q", "--csv", "-d", dsn], input=script, capture_output=True, text=True,
                              timeout=timeout_s + 30, env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
    except subprocess.TimeoutExpired:
        return ExecutionResult("timeout", "postgres", error=f"psql did not finish within {timeout_s + 30}s")
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["psql failed"])
        msg = next((line for line in err if "ERROR" in line or "FATAL" in line), err[-1])
        status = "timeout" if "statement timeout" in msg else "error"
        if "connection" in msg.lower() and "ERROR" not in msg:
            status = "unsupported"
        return ExecutionResult(status, "postgres", error=msg.strip()[:300])
    out = proc.stdout.split(_MARK, 1)[-1].lstrip("\n")
    table = list(csv.reader(io.StringIO(out)))
    columns, rows = (table[0], table[1:]) if table else ([], [])
    status = "ok" if len(rows) >= min_rows else "empty"
    digest = hashlib.sha256(json.dumps({"columns": columns, "rows": rows}, sort_keys=True).encode()).hexdigest()
    return ExecutionResult(status, "postgres", n_rows=len(rows), columns=columns, rows_preview=rows[:preview_rows],
                           result_sha256=digest,
                           error="" if status == "ok" else f"returned {len(rows)} rows, need at least {min_rows}")


def executor_from_env(env_var: str, **kw: Any) -> Callable[[str, str, str, str], ExecutionResult]:
    """An executor for `validate_sql_sample` using the DSN in `env_var`; ValueError if it is unset."""
    dsn = os.environ.get(env_var)
    if not dsn:
        raise ValueError(f"sql_execute: postgres_dsn_env is {env_var!r}, but that environment variable is not set")

    def run(query: str, ddl: str, rows_sql: str, dialect: str) -> ExecutionResult:
        return execute_in_postgres(query, ddl, rows_sql, dsn, **kw)

    return run
