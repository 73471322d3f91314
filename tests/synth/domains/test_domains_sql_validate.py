"""Text-to-SQL validators on real SQL: what each dialect's check must accept and reject."""

from __future__ import annotations

import random
import sqlite3

import pytest

from synth.domains.sql_validate import (
    DistractorColumn,
    TableDef,
    add_columns_to_create,
    check_query_syntax,
    distractor_leaks,
    execute_in_sqlite,
    inject_distractors,
    load_sqlite,
    propose_distractors,
    schema_mapping,
    schema_tables,
    split_statements,
    validate_sql_sample,
)

DDL = {
    "sqlite": """
CREATE TABLE customers (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  city TEXT,
  signup_date TEXT
);
CREATE TABLE orders (
  order_id INTEGER PRIMARY KEY,
  customer_id INTEGER REFERENCES customers(id),
  total REAL,
  placed_on TEXT
);""",
    "postgres": """
CREATE TABLE customers (
  id SERIAL PRIMARY KEY,
  name VARCHAR(100) NOT NULL,
  city VARCHAR(60),
  signup_date DATE DEFAULT CURRENT_DATE,
  tags TEXT[]
);
CREATE TABLE orders (
  order_id BIGSERIAL PRIMARY KEY,
  customer_id INT REFERENCES customers(id),
  total NUMERIC(12, 2) CHECK (total >= 0),
  placed_on DATE
);""",
    "mysql": """
CREATE TABLE customers (
  id INT AUTO_INCREMENT PRIMARY KEY,
  name VARCHAR(100) NOT NULL COMMENT 'full name',
  city VARCHAR(60) CHARACTER SET utf8mb4,
  signup_date DATE,
  tier ENUM('basic', 'gold') DEFAULT 'basic'
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;
CREATE TABLE `orders` (
  `order_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  customer_id INT,
  total DECIMAL(12, 2),
  placed_on DATE,
  PRIMARY KEY (`order_id`),
  KEY idx_customer (customer_id),
  FOREIGN KEY (customer_id) REFERENCES customers(id)
);""",
}
ROWS = """
INSERT INTO customers (name, city, signup_date) VALUES ('Ana Ruiz', 'Lyon', '2023-01-05'), ('Bo Chen', 'Oslo', '2023-03-10'), ('Cy Diaz', 'Lyon', '2024-02-01');
INSERT INTO orders (customer_id, total, placed_on) VALUES (1, 120.50, '2024-01-03'), (1, 80.00, '2024-02-11'), (2, 15.25, '2024-02-12'), (3, 300.00, '2024-03-01');
"""

VALID = {
    "sqlite": [
        "SELECT c.city, SUM(o.total) AS revenue FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city ORDER BY revenue DESC",
        "SELECT name, total, RANK() OVER (ORDER BY total DESC) AS rnk FROM customers JOIN orders ON orders.customer_id = customers.id",
        "SELECT strftime('%Y-%m', placed_on) AS month, COUNT(*) FROM orders GROUP BY month LIMIT 1, 2",
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT i FROM n",
    ],
    "postgres": [
        "SELECT c.city, SUM(o.total)::numeric(12,2) AS revenue FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city",
        "SELECT name FROM customers WHERE name ILIKE 'a%'",
        "SELECT DISTINCT ON (customer_id) customer_id, total FROM orders ORDER BY customer_id, total DESC",
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 3) SELECT i FROM n",
        "SELECT customer_id, total, SUM(total) OVER (PARTITION BY customer_id ORDER BY placed_on) AS running FROM orders",
        "SELECT name FROM customers ORDER BY signup_date DESC NULLS LAST LIMIT 2 OFFSET 1",
    ],
    "mysql": [
        "SELECT `c`.`city`, SUM(o.total) AS revenue FROM customers c JOIN `orders` o ON o.customer_id = c.id GROUP BY c.city",
        "SELECT DATE_FORMAT(placed_on, '%Y-%m') AS ym, COUNT(*) AS n FROM orders GROUP BY ym",
        "SELECT name FROM customers ORDER BY signup_date DESC LIMIT 1, 2",
        "SELECT customer_id, total, ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY total DESC) AS rn FROM orders",
    ],
}

INVALID = {
    "sqlite": [
        ("SELEC name FROM customers", "parse"),
        ("SELECT name FROM customers WHERE", "parse"),
        ("SELECT total::int FROM orders", "'::'"),
        ("SELECT name FROM customers WHERE name ILIKE 'a%'", "ILIKE"),
        ("SELECT name FROM customers FETCH FIRST 2 ROWS ONLY", "FETCH"),
        ("SELECT name FROM customers GROUP", "reserved word"),
        ("DELETE FROM customers", "read-only"),
        ("SELECT 1; SELECT 2", "exactly one"),
    ],
    "postgres": [
        ("SELECT `name` FROM customers", "parse"),
        ("SELECT name FROM customers LIMIT 1, 2", "LIMIT offset, count"),
        ("SELECT name FROM customers WHERE name REGEXP '^A'", "REGEXP"),
        ("SELECT name FROM customers WHERE name = 'a", "parse"),
    ],
    "mysql": [
        ("SELECT total::int FROM orders", "'::'"),
        ("SELECT DISTINCT ON (customer_id) customer_id FROM orders", "DISTINCT ON"),
        ("SELECT name FROM customers ORDER BY name NULLS LAST", "NULLS FIRST/LAST"),
        ("SELECT name FROM customers FETCH FIRST 2 ROWS ONLY", "FETCH"),
        ("SELECT TOP 2 name FROM customers", "parse"),
        # MariaDB runs MySQL samples: what it accepts and MySQL 8.0 does not is refused here
        ("SELECT CAST(total AS INTEGER) AS t FROM orders", "CAST(... AS INTEGER) is not MySQL 8.0"),
        ("SELECT CONVERT(total, INT) AS t FROM orders", "CONVERT(... , INT) is not MySQL 8.0"),
        ("SELECT NVL(name, 'x') AS n FROM customers", "NVL() is MariaDB's"),
        ("SELECT MEDIAN(total) OVER () AS m FROM orders", "MEDIAN() is MariaDB's"),
    ],
}


@pytest.mark.parametrize("dialect,query", [(d, q) for d, qs in VALID.items() for q in qs])
def test_valid_queries_parse_and_execute_in_their_dialect(dialect, query):
    assert check_query_syntax(query, dialect).ok, check_query_syntax(query, dialect)
    result = execute_in_sqlite(query, DDL[dialect], ROWS, dialect)
    assert result.status == "ok", result
    assert result.n_rows >= 1 and result.columns


def test_keyword_aliases_follow_each_engine():
    # PostgreSQL takes any keyword as a column label after AS; END is not reserved in MySQL or SQLite
    assert check_query_syntax("SELECT COUNT(*) AS from FROM orders", "postgres").ok
    assert check_query_syntax("SELECT COUNT(*) AS end FROM orders", "mysql").ok
    assert not check_query_syntax("SELECT COUNT(*) AS from FROM orders", "mysql").ok
    assert not check_query_syntax("SELECT o.total FROM orders left", "sqlite").ok


@pytest.mark.parametrize("dialect,query,why", [(d, q, w) for d, qs in INVALID.items() for q, w in qs])
def test_invalid_queries_are_rejected_with_a_reason(dialect, query, why):
    check = check_query_syntax(query, dialect)
    assert not check.ok
    assert why in check.detail


def test_schemas_of_every_dialect_load_into_sqlite_with_their_rows():
    for dialect, ddl in DDL.items():
        tables = schema_tables(ddl, dialect)
        assert [t.name for t in tables] == ["customers", "orders"]
        con = load_sqlite(ddl, ROWS, dialect)
        assert con.execute("SELECT COUNT(*) FROM orders").fetchone() == (4,)
        # integer primary keys were auto-assigned, so joins on them work
        assert con.execute("SELECT MAX(id) FROM customers").fetchone() == (3,)


def test_broken_rows_and_schemas_are_errors():
    bad_rows = "INSERT INTO customers (name, nickname) VALUES ('x', 'y');"
    r = execute_in_sqlite("SELECT name FROM customers", DDL["sqlite"], bad_rows, "sqlite")
    assert r.status == "error" and "nickname" in r.error
    r = execute_in_sqlite("SELECT name FROM customers", DDL["sqlite"], "DROP TABLE customers;", "sqlite")
    assert r.status == "error" and "INSERT" in r.error
    # NOT NULL is kept, so a row that breaks it fails
    r = execute_in_sqlite("SELECT name FROM customers", DDL["postgres"], "INSERT INTO customers (city) VALUES ('Rome');", "postgres")
    assert r.status == "error" and "NOT NULL" in r.error


def test_execution_limits_empty_results_runaway_queries_and_file_access():
    r = execute_in_sqlite("SELECT name FROM customers WHERE city = 'Atlantis'", DDL["sqlite"], ROWS, "sqlite")
    assert r.status == "empty"
    runaway = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT COUNT(*) FROM n"
    r = execute_in_sqlite(runaway, DDL["sqlite"], ROWS, "sqlite", timeout_s=0.3)
    assert r.status == "timeout"
    con = load_sqlite(DDL["sqlite"], ROWS, "sqlite")
    with pytest.raises(sqlite3.DatabaseError):
        con.execute("ATTACH DATABASE '/tmp/synth-should-not-exist.db' AS x")


def test_unknown_sqlite_functions_are_unsupported_only_for_other_dialects():
    q = "SELECT ST_AsText(ST_MakePoint(1, 2)) AS p FROM customers"
    assert execute_in_sqlite(q, DDL["postgres"], ROWS, "postgres").status == "unsupported"
    assert execute_in_sqlite("SELECT no_such_fn(name) FROM customers", DDL["sqlite"], ROWS, "sqlite").status == "error"


# ---- distractors ---------------------------------------------------------------------------

def _distracted(dialect: str, seed: int = 0):
    tables = schema_tables(DDL[dialect], dialect)
    d_tables = [TableDef("customers_archive", tables[0].columns), TableDef("loyalty_accounts", [("account_id", "INT"), ("points", "INT")])]
    d_cols = [DistractorColumn("orders", "previous_total", "DECIMAL(12, 2)"), DistractorColumn("customers", "legacy_customer_code", "VARCHAR(32)")]
    visible = inject_distractors(DDL[dialect], dialect, d_tables, d_cols, random.Random(seed))
    return visible, d_tables, d_cols


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_injected_schema_keeps_the_real_ddl_and_adds_every_distractor(dialect):
    visible, d_tables, d_cols = _distracted(dialect)
    names = {t.name: t for t in schema_tables(visible, dialect)}
    assert set(names) == {"customers", "orders", "customers_archive", "loyalty_accounts"}
    assert "previous_total" in names["orders"].column_names()
    assert "legacy_customer_code" in names["customers"].column_names()
    # real columns unchanged and in order, distractor after them
    assert names["orders"].column_names()[:4] == ["order_id", "customer_id", "total", "placed_on"]
    # deterministic for a seed
    assert visible == _distracted(dialect, seed=0)[0]
    # the visible DDL still loads (it is what a model would run its query against)
    load_sqlite(visible, "", dialect).close()


def test_add_columns_keeps_table_constraints_last():
    stmt = split_statements(DDL["mysql"], "mysql")[1]
    out = add_columns_to_create(stmt, "mysql", ["`note` TEXT"])
    assert out.index("`note` TEXT") < out.index("PRIMARY KEY (`order_id`)")
    assert out.replace(",\n  `note` TEXT", "") == stmt


@pytest.mark.parametrize("dialect", ["sqlite", "postgres", "mysql"])
def test_a_distractor_leak_is_rejected(dialect):
    visible, d_tables, d_cols = _distracted(dialect)
    schema = schema_mapping(schema_tables(visible, dialect))
    names = [t.name for t in d_tables]
    clean = "SELECT c.name, SUM(o.total) AS s FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.name"
    assert distractor_leaks(clean, dialect, schema, names, d_cols) == []
    assert distractor_leaks("SELECT COUNT(*) FROM customers_archive", dialect, schema, names, d_cols) == ["table customers_archive"]
    assert distractor_leaks("SELECT previous_total FROM orders", dialect, schema, names, d_cols) == ["column orders.previous_total"]
    # correlated subquery reaching a distractor column of the outer table
    q = "SELECT o.order_id FROM orders o WHERE EXISTS (SELECT 1 FROM customers c WHERE c.id = o.customer_id AND c.legacy_customer_code = 'X')"
    assert distractor_leaks(q, dialect, schema, names, d_cols) == ["column customers.legacy_customer_code"]
    # SELECT * returns the distractor column too
    assert "column customers.legacy_customer_code" in distractor_leaks("SELECT * FROM customers", dialect, schema, names, d_cols)


def test_full_validation_accepts_a_good_sample_and_names_each_failure():
    dialect = "postgres"
    visible, d_tables, d_cols = _distracted(dialect)
    kw = dict(dialect=dialect, ddl=DDL[dialect], rows_sql=ROWS, visible_ddl=visible,
              distractor_tables=[t.name for t in d_tables], distractor_columns=d_cols)
    good = validate_sql_sample(query="SELECT c.city, COUNT(*) AS n FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city", **kw)
    assert good.ok, good.to_dict()
    assert good.execution.n_rows == 2
    cases = {
        "SELECT name FROM customers LIMIT 1, 2": "syntax",
        "SELECT nickname FROM customers": "resolution",
        "SELECT previous_total FROM orders": "resolution",       # not in the real schema either
        "SELECT name FROM customers_archive": "resolution",
        "SELECT name FROM customers WHERE city = 'Atlantis'": "execution",
        "SELECT ST_X(ST_MakePoint(1, 2)) FROM customers": "execution",
    }
    for query, failing in cases.items():
        v = validate_sql_sample(query=query, **kw)
        assert not v.ok and v.first_failure.name == failing, (query, v.to_dict())
    lenient = validate_sql_sample(query="SELECT ST_X(ST_MakePoint(1, 2)) FROM customers", unsupported="accept", **kw)
    assert lenient.ok
    no_distractors = validate_sql_sample(query="SELECT name FROM customers", **{**kw, "distractor_tables": [], "distractor_columns": []})
    assert no_distractors.first_failure.name == "distractors"


def test_sqlite_string_fallback_does_not_hide_a_wrong_column():
    # SQLite turns an unknown double-quoted identifier into a string literal and runs happily;
    # resolution against the schema still rejects it.
    q = 'SELECT "nickname" FROM customers'
    assert execute_in_sqlite(q, DDL["sqlite"], ROWS, "sqlite").status == "ok"
    visible, d_tables, d_cols = _distracted("sqlite")
    v = validate_sql_sample(dialect="sqlite", ddl=DDL["sqlite"], rows_sql=ROWS, query=q, visible_ddl=visible,
                            distractor_tables=[t.name for t in d_tables], distractor_columns=d_cols)
    assert v.first_failure.name == "resolution"


def test_proposed_distractors_are_related_and_never_collide():
    tables = schema_tables(DDL["sqlite"], "sqlite")
    pool = [{"name": "orders", "columns": [{"name": "x"}]}, {"name": "shipping_zones", "columns": [{"name": "zone_id", "type": "INTEGER"}]}]
    for seed in range(20):
        d_tables, d_cols = propose_distractors(tables, random.Random(seed), n_tables=3, n_columns=3, pool_tables=pool)
        assert len(d_tables) == 3 and len(d_cols) == 3
        assert not {t.name for t in d_tables} & {"customers", "orders"}
        for c in d_cols:
            real = next(t for t in tables if t.name == c.table)
            assert c.column not in real.column_names()
    assert propose_distractors(tables, random.Random(7)) == propose_distractors(tables, random.Random(7))
