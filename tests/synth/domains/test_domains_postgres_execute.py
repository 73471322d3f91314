"""Text-to-SQL execution on a real PostgreSQL server (the session's throwaway server, `pg_dsn` in
sql_servers.py; skipped when the Debian package is missing)."""

from __future__ import annotations

import pytest

from synth.domains.postgres_execute import execute_in_postgres, executor_from_env
from synth.domains.sql_validate import DistractorColumn, validate_sql_sample
from tests.synth.domains.sql_servers import scratch_databases_left

DDL = """CREATE TABLE customers (id SERIAL PRIMARY KEY, name VARCHAR(80) NOT NULL, city VARCHAR(40));
CREATE TABLE orders (order_id SERIAL PRIMARY KEY, customer_id INT REFERENCES customers(id), total NUMERIC(10, 2), placed_on DATE);"""
ROWS = """INSERT INTO customers (name, city) VALUES ('Ana', 'Lyon'), ('Bo', 'Oslo');
INSERT INTO orders (customer_id, total, placed_on) VALUES (1, 10.5, '2024-01-03'), (2, 7, '2024-02-01'), (1, 3, '2024-02-09');"""


def test_postgres_runs_what_sqlite_cannot_judge(pg_dsn):
    ok = execute_in_postgres("SELECT DATE_TRUNC('month', placed_on) AS m, COUNT(*) FROM orders GROUP BY m ORDER BY m",
                             DDL, ROWS, pg_dsn)
    assert ok.status == "ok" and ok.n_rows == 2 and ok.columns == ["m", "count"]
    strict = execute_in_postgres("SELECT name, total FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY name",
                                 DDL, ROWS, pg_dsn)
    assert strict.status == "error" and "GROUP BY" in strict.error
    assert execute_in_postgres("SELECT name FROM customers WHERE city = 'X'", DDL, ROWS, pg_dsn).status == "empty"
    assert execute_in_postgres("SELECT pg_sleep(3)", DDL, ROWS, pg_dsn, timeout_s=0.5).status == "timeout"
    bad_rows = execute_in_postgres("SELECT 1", DDL, "INSERT INTO orders (customer_id) VALUES (99);", pg_dsn)
    assert bad_rows.status == "error" and "foreign key" in bad_rows.error
    # every scratch database was dropped: nothing is left behind
    assert scratch_databases_left(pg=pg_dsn) == []


def test_full_validation_uses_the_server_when_configured(pg_dsn, monkeypatch):
    monkeypatch.setenv("SYNTH_TEST_PG_DSN", pg_dsn)
    executor = executor_from_env("SYNTH_TEST_PG_DSN")
    visible = DDL + "\nCREATE TABLE orders_archive (order_id INT, total NUMERIC(10, 2));"
    kw = dict(dialect="postgres", ddl=DDL, rows_sql=ROWS, visible_ddl=visible, distractor_tables=["orders_archive"],
              distractor_columns=[DistractorColumn("orders", "previous_total")])
    q = "SELECT DATE_TRUNC('month', placed_on) AS m, SUM(total) FROM orders GROUP BY m"
    assert validate_sql_sample(query=q, **kw).first_failure.name == "execution"       # SQLite: unsupported
    assert validate_sql_sample(query=q, executor=executor, **kw).ok                    # the real server: fine
    sloppy = "SELECT name, total FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY name"
    # SQLite would let it through; the grouping check rejects it before execution, and so does PostgreSQL
    assert validate_sql_sample(query=sloppy, unsupported="accept", **kw).first_failure.name == "grouping"
    assert not validate_sql_sample(query=sloppy, executor=executor, **kw).ok
    assert executor(sloppy, DDL, ROWS, "postgres").status == "error"
    monkeypatch.delenv("SYNTH_TEST_PG_DSN")
    with pytest.raises(ValueError, match="not set"):
        executor_from_env("SYNTH_TEST_PG_DSN")


def test_sql_generator_executes_postgres_samples_on_the_server(pg_dsn, monkeypatch, script, teacher, run_gen, tmp_path, jsonl):
    monkeypatch.setenv("SYNTH_PG_DSN", pg_dsn)
    script.on("You are designing a realistic", reply=f"```sql\n{DDL}\n```\n```sql\n{ROWS}\n```", name="schema")
    script.on("Write one request that a user", name="task", reply=(
        "Request: Monthly order counts, please.\n```sql\nSELECT DATE_TRUNC('month', placed_on) AS m, COUNT(*) AS n "
        "FROM orders GROUP BY m ORDER BY m\n```"))
    script.on('Criterion "', reply='{"score": 5}', name="critic")
    item = {"id": "pg-1", "prompt": "pg", "dialect": "postgres", "dialect_name": "PostgreSQL", "industry": "retail",
            "topic": "orders", "concept": "time_bucketing", "concept_description": "grouping by month",
            "instruction_style": "imperative", "register": "direct", "politeness": "polite", "category": "text_to_sql"}
    res = run_gen("text_to_sql", teacher.base_url, tmp_path / "run", source={"kind": "inline", "items": [item]})
    (rec,) = jsonl(res.records_path)
    assert rec["meta"]["execution"]["engine"] == "postgres" and rec["meta"]["execution"]["n_rows"] == 2
