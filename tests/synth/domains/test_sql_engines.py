"""Text-to-SQL on the real engines: PostgreSQL and MariaDB servers started for the session
(sql_servers.py), SQLite in process; limits, one statement per execution, result comparison."""

from __future__ import annotations

import pytest

from synth.domains.sql_engines import (ExecutionResult, StatementRefused, dsn_from_env, execute_on_mysql,
                                       execute_on_postgres, results_match, single_statement)
from synth.domains.sql_validate import DistractorColumn, execute_in_sqlite, execute_isolated, validate_sql_sample
from tests.synth.domains.sql_servers import scratch_databases_left

DDL = {
    "postgres": """CREATE TABLE customers (id SERIAL PRIMARY KEY, name VARCHAR(80) NOT NULL, city VARCHAR(40));
CREATE TABLE orders (order_id SERIAL PRIMARY KEY, customer_id INT REFERENCES customers(id), total NUMERIC(10, 2));""",
    "mysql": """CREATE TABLE customers (id INT AUTO_INCREMENT PRIMARY KEY, name VARCHAR(80) NOT NULL, city VARCHAR(40)) ENGINE=InnoDB;
CREATE TABLE `orders` (order_id INT AUTO_INCREMENT PRIMARY KEY, customer_id INT, total DECIMAL(10, 2),
  FOREIGN KEY (customer_id) REFERENCES customers(id));""",
    "sqlite": """CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT);
CREATE TABLE orders (order_id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), total REAL);""",
}
ROWS = """INSERT INTO customers (name, city) VALUES ('Ana', 'Lyon'), ('Bo', NULL), ('Cy', 'Lyon');
INSERT INTO orders (customer_id, total) VALUES (1, 10.5), (2, 7), (1, 3), (3, 10.50);"""
SLOPPY = "SELECT c.name, o.total FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.name"


@pytest.fixture
def run(pg_dsn, mysql_dsn):
    """run(dialect, query, **kw): the query on its engine (the session's servers, SQLite in process)."""
    def go(dialect: str, query: str, **kw) -> ExecutionResult:
        if dialect == "postgres":
            return execute_on_postgres(query, DDL[dialect], ROWS, pg_dsn, **kw)
        if dialect == "mysql":
            return execute_on_mysql(query, DDL[dialect], ROWS, mysql_dsn, **kw)
        return execute_in_sqlite(query, DDL[dialect], ROWS, dialect, **kw)
    yield go
    assert scratch_databases_left(pg=pg_dsn, mysql=mysql_dsn) == []       # every scratch database dropped


@pytest.mark.parametrize("dialect", ["postgres", "mysql"])
def test_both_servers_reject_a_column_outside_group_by(run, dialect):
    r = run(dialect, SLOPPY)
    assert r.status == "error" and r.engine == dialect, r
    assert "GROUP BY" in r.error.upper() or "group by" in r.error
    ok = run(dialect, "SELECT c.name, SUM(o.total) AS s FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.name")
    assert ok.ok and ok.n_rows == 3


def test_full_validation_rejects_what_both_engines_reject(pg_dsn, mysql_dsn, monkeypatch):
    monkeypatch.setenv("SYNTH_MYSQL_DSN", mysql_dsn)
    monkeypatch.setenv("SYNTH_PG_DSN", pg_dsn)
    for dialect in ("postgres", "mysql"):
        kw = dict(dialect=dialect, dsn=dsn_from_env(dialect), ddl=DDL[dialect], rows_sql=ROWS, visible_ddl=DDL[dialect] + "\nCREATE TABLE orders_archive (order_id INT);",
                  distractor_tables=["orders_archive"], distractor_columns=[DistractorColumn("orders", "previous_total")])
        v = validate_sql_sample(query=SLOPPY, **kw)
        assert not v.ok and v.first_failure.name == "grouping" and "o.total" in v.first_failure.detail, v.to_dict()
        # without the static check, the server itself rejects it
        v = validate_sql_sample(query=SLOPPY, executor=lambda q, d, r, dia: execute_isolated(q, d, r, dia, dsn=kw["dsn"]),
                                **kw)
        assert not v.ok
        good = validate_sql_sample(query="SELECT city, COUNT(*) AS n FROM customers GROUP BY city", **kw)
        assert good.ok and good.execution.engine == dialect and good.execution.n_rows == 2, good.to_dict()
    assert scratch_databases_left(pg=pg_dsn, mysql=mysql_dsn) == []
    # the validator reads no environment: without a DSN it runs in SQLite, whatever is set
    v = validate_sql_sample(query="SELECT city, COUNT(*) AS n FROM customers GROUP BY city", **{**kw, "dsn": None})
    assert v.ok and v.execution.engine == "sqlite"


@pytest.mark.parametrize("dialect", ["postgres", "mysql", "sqlite"])
def test_results_compare_as_sql_compares_result_sets(run, dialect):
    by_name = run(dialect, "SELECT name, city FROM customers ORDER BY name")
    by_desc = run(dialect, "SELECT name, city FROM customers ORDER BY name DESC")
    unordered = run(dialect, "SELECT name, city FROM customers")
    assert results_match(unordered, by_name) is False or by_name.ordered        # the reference orders: order counts
    assert results_match(by_desc, by_name) is False
    assert results_match(by_desc, unordered) and results_match(by_name, unordered)   # a multiset otherwise
    # NULL equals NULL in a result set, but not the empty string or the text 'NULL'
    assert results_match(run(dialect, "SELECT city FROM customers WHERE name = 'Bo'"),
                         run(dialect, "SELECT NULL AS city"))
    assert not results_match(run(dialect, "SELECT '' AS city"), run(dialect, "SELECT NULL AS city"))
    assert not results_match(run(dialect, "SELECT 'NULL' AS city"), run(dialect, "SELECT NULL AS city"))
    # numbers by value: NUMERIC 10.50 = 10.5 = REAL 10.5, on every engine
    totals = run(dialect, "SELECT total FROM orders WHERE total > 10")
    assert totals.n_rows == 2 and totals.rows_preview == [[10.5], [10.5]]


def test_the_same_rows_digest_the_same_on_every_engine(run):
    q = "SELECT c.city, COUNT(*) AS n, SUM(o.total) AS s FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city"
    digests = {d: run(d, q).result_sha256 for d in ("postgres", "mysql", "sqlite")}
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("dialect", ["postgres", "mysql", "sqlite"])
def test_one_statement_per_execution(run, dialect):
    r = run(dialect, "SELECT 1; SELECT 2")
    assert r.status == "refused" and "one statement" in r.error
    assert run(dialect, "SELECT 1;").ok                      # a trailing semicolon is one statement
    assert run(dialect, "PRAGMA table_info(customers)").status == "refused"


@pytest.mark.parametrize("query,loose", [
    (SLOPPY, ["o.total"]),
    ("SELECT name, COUNT(*) FROM customers", ["customers.name"]),
    ("SELECT c.id, c.name, COUNT(*) FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.id", []),
    ("SELECT city, UPPER(city), COUNT(*) FROM customers GROUP BY 1", []),
    ("SELECT c.name, (SELECT MAX(total) FROM orders) AS mx FROM customers c", []),
    ("SELECT customer_id, SUM(total) OVER (PARTITION BY customer_id) FROM orders", []),
    ("SELECT COUNT(*) + 1, MAX(total) - MIN(total) FROM orders", []),
])
def test_grouping_check_matches_what_the_servers_reject(query, loose):
    from synth.domains.sql_validate import schema_mapping, schema_tables, ungrouped_columns
    schema = schema_mapping(schema_tables(DDL["postgres"], "postgres"))
    assert ungrouped_columns(query, "postgres", schema) == loose


def test_pragma_and_attach_are_refused_even_inside_a_query():
    with pytest.raises(StatementRefused):
        single_statement("PRAGMA writable_schema = 1", "sqlite")
    r = execute_in_sqlite("SELECT * FROM pragma_table_info('customers')", DDL["sqlite"], ROWS, "sqlite")
    assert r.status == "refused", r


@pytest.mark.parametrize("dialect,query", [
    ("postgres", "SELECT g FROM generate_series(1, 20000) AS g"),
    ("mysql", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) SELECT a.i FROM n a CROSS JOIN n b"),
    ("sqlite", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000) SELECT i FROM n"),
    ("postgres", "SELECT repeat('x', 5000000) FROM generate_series(1, 4)"),
    ("mysql", "SELECT REPEAT('x', 5000000) FROM customers CROSS JOIN orders"),
    ("sqlite", "SELECT zeroblob(200000000)"),
    ("sqlite", "SELECT length(zeroblob(200000000))"),
])
def test_row_and_byte_limits(run, dialect, query):
    r = run(dialect, query)
    assert r.status == "limit_exceeded", r


def test_zeroblob_cannot_exhaust_the_validators_memory():
    r = execute_isolated("SELECT zeroblob(200000000)", DDL["sqlite"], ROWS, "sqlite", memory_mb=512)
    assert r.status == "limit_exceeded", r
    # even with SQLite's own value limit raised, the worker's memory cap holds
    r = execute_isolated("SELECT zeroblob(200000000) AS a, zeroblob(200000000) AS b", DDL["sqlite"], ROWS, "sqlite",
                         memory_mb=300, max_bytes=900_000_000)
    assert r.status == "limit_exceeded", r


@pytest.mark.parametrize("dialect,query", [("postgres", "SELECT pg_sleep(5)"), ("mysql", "SELECT SLEEP(5)")])
def test_statement_timeouts(run, dialect, query):
    r = run(dialect, query, timeout_s=0.5)
    assert r.status == "timeout", r          # also on MariaDB, whose SLEEP returns 1 when its statement is killed


def test_an_unreachable_server_is_unsupported_not_wrong():
    r = execute_on_postgres("SELECT 1", DDL["postgres"], ROWS, "postgresql://nobody@127.0.0.1:1/x")
    assert r.status == "unsupported" and "connect" in r.error
    r = execute_on_mysql("SELECT 1", DDL["mysql"], ROWS, "mysql://nobody@127.0.0.1:1/")
    assert r.status == "unsupported" and "connect" in r.error
