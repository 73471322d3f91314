"""Run a PostgreSQL text-to-SQL sample on a real PostgreSQL server (spec §2.10: "against a real
PostgreSQL server when one is configured"), for what SQLite cannot judge (PostGIS, DATE_TRUNC,
arrays, strict GROUP BY).

The work is `sql_engines.execute_on_postgres` (psycopg; a fresh database per query, dropped
afterwards; one statement; statement timeout; row and byte limits). The DSN comes from an
environment variable (never from a config file), e.g. `SYNTH_PG_DSN=postgresql://user@host/db`;
`executor_from_env` runs each sample in the memory-capped worker process of
`sql_validate.execute_isolated`.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from synth.domains.sql_engines import MAX_BYTES, MAX_ROWS, ExecutionResult, execute_on_postgres
from synth.domains.sql_validate import execute_isolated


def execute_in_postgres(query: str, ddl: str, rows_sql: str, dsn: str, *, min_rows: int = 1, timeout_s: float = 5.0,
                        preview_rows: int = 5, max_rows: int = MAX_ROWS, max_bytes: int = MAX_BYTES) -> ExecutionResult:
    """Load `ddl` + `rows_sql` into a fresh database of the server at `dsn`, run `query`, drop it."""
    return execute_on_postgres(query, ddl, rows_sql, dsn, min_rows=min_rows, timeout_s=timeout_s,
                               preview_rows=preview_rows, max_rows=max_rows, max_bytes=max_bytes)


def executor_from_env(env_var: str, **kw: Any) -> Callable[[str, str, str, str], ExecutionResult]:
    """An executor for `validate_sql_sample` using the DSN in `env_var`; ValueError if it is unset."""
    dsn = os.environ.get(env_var)
    if not dsn:
        raise ValueError(f"sql_execute: postgres_dsn_env is {env_var!r}, but that environment variable is not set")

    def run(query: str, ddl: str, rows_sql: str, dialect: str) -> ExecutionResult:
        return execute_isolated(query, ddl, rows_sql, "postgres", dsn=dsn, **kw)

    return run
