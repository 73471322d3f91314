"""Issue 38: with no SYNTH_PG_DSN / SYNTH_MYSQL_DSN (the README's command as written), the text-to-SQL
generator judges PostgreSQL and MySQL samples on real servers it starts itself (here the session's
shared ones, `held_sql_servers`), rejecting what those engines reject and SQLite accepts; only
without the server binaries does it fall back to SQLite, warning once and saying so in every record
and in the manifest."""

from __future__ import annotations

import logging

import pytest

from synth.domains import sql_servers
from tests.synth.domains.test_domains_text_to_sql_gen import DDL, ROWS, item

WRONG = {   # topic -> (dialect, query the real engine rejects)
    "pg-ungrouped-select": ("postgres", "SELECT c.city, c.name, COUNT(*) AS n FROM customers c GROUP BY c.city"),
    "pg-ungrouped-having": ("postgres", "SELECT city, COUNT(*) AS n FROM customers GROUP BY city HAVING name <> ''"),
    "pg-text-vs-integer": ("postgres", "SELECT name FROM customers WHERE id = 'abc'"),
    "pg-sum-varchar": ("postgres", "SELECT SUM(name) AS s FROM customers"),
    "pg-ifnull": ("postgres", "SELECT IFNULL(city, 'none') AS city FROM customers"),
    "pg-group-concat": ("postgres", "SELECT GROUP_CONCAT(name) AS names FROM customers"),
    "pg-alias-in-having": ("postgres", "SELECT city, COUNT(*) AS n FROM customers GROUP BY city HAVING n > 1"),
    "pg-distinct-foreign-order": ("postgres", "SELECT DISTINCT city FROM customers ORDER BY name"),
    "pg-scalar-subquery-two-rows": ("postgres", "SELECT name, (SELECT o.total FROM orders o WHERE o.customer_id = c.id) AS t "
                                                "FROM customers c"),
    "my-cast-integer": ("mysql", "SELECT CAST(total AS INTEGER) AS t FROM orders"),
    "my-between-symmetric": ("mysql", "SELECT name FROM customers WHERE id BETWEEN SYMMETRIC 3 AND 1"),
    "my-bad-date": ("mysql", "SELECT order_id FROM orders WHERE DATE '2024-13-45' < '2025-01-01'"),
}
GOOD = {
    "pg-good": ("postgres", "SELECT c.city, SUM(o.total) AS revenue FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city"),
    "my-good": ("mysql", "SELECT c.city, SUM(o.total) AS revenue FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city"),
}
# what SQLite, transpiled, wrongly accepts among them (the fallback's known blind spots)
SQLITE_ACCEPTS = ["pg-ifnull", "pg-sum-varchar"]


@pytest.fixture
def no_dsn(monkeypatch):
    monkeypatch.delenv("SYNTH_PG_DSN", raising=False)
    monkeypatch.delenv("SYNTH_MYSQL_DSN", raising=False)


def _run(script, run_gen, teacher, out, topics):
    tasks = {**WRONG, **GOOD}

    def topic(text: str) -> str:
        return next(t for t in sorted(topics, key=len, reverse=True) if f"about {t}" in text)

    script.on("You are designing a realistic", name="schema",
              reply=lambda text, req: f"```sql\n{DDL[tasks[topic(text)][0]]}\n```\n```sql\n{ROWS}\n```")
    script.on("Write one request that a user", name="task",
              reply=lambda text, req: f"Request: the answer, please.\n```sql\n{tasks[topic(text)][1]}\n```")
    script.on('Criterion "', reply='{"score": 5, "reason": "fine"}', name="critic")
    items = [item(t, tasks[t][0]) for t in topics]
    return run_gen("text_to_sql", teacher.base_url, out, source={"kind": "inline", "items": items})


def test_default_path_judges_on_the_real_engines(no_dsn, held_sql_servers, script, teacher, run_gen, tmp_path, jsonl):
    if set(held_sql_servers) != {"postgres", "mysql"}:
        pytest.skip("the PostgreSQL and MariaDB server binaries are needed (make system-packages)")
    res = _run(script, run_gen, teacher, tmp_path / "run", [*WRONG, *GOOD])
    records = jsonl(res.records_path)
    assert sorted(r["prompt_id"] for r in records) == sorted(GOOD)
    engines = {r["prompt_id"]: (r["meta"]["execution"]["engine"], r["meta"]["execution"]["server"]) for r in records}
    assert engines["pg-good"][0] == "postgres" and engines["pg-good"][1].startswith("PostgreSQL ")
    assert engines["my-good"][0] == "mysql" and "MariaDB" in engines["my-good"][1]
    rejected = {rj["prompt_id"]: rj for rj in jsonl(res.out_dir / "rejects.jsonl")}
    assert sorted(rejected) == sorted(WRONG)
    for topic in SQLITE_ACCEPTS:       # SQLite accepts these: only the real engine turns them away
        assert rejected[topic]["step"] == "execution" and "error" in rejected[topic]["reason"], rejected[topic]
    assert "CAST" in rejected["my-cast-integer"]["reason"] and "MySQL 8.0" in rejected["my-cast-integer"]["reason"]
    assert "Incorrect DATE value" in rejected["my-bad-date"]["reason"]
    steps = res.manifest.steps             # the manifest says which engine judged how many samples
    assert "execution.engine:sqlite" not in steps
    assert steps["execution.engine:postgres"]["out"] == 1 and steps["execution.engine:mariadb"]["out"] == 1
    assert steps["execution.engine:postgres"]["in"] + steps["execution.engine:mariadb"]["in"] == steps["execution"]["in"]


def test_without_binaries_it_falls_back_to_sqlite_and_says_so(no_dsn, monkeypatch, script, teacher, run_gen, tmp_path,
                                                              jsonl, caplog):
    monkeypatch.setattr(sql_servers, "binaries_missing", lambda dialect: f"no {dialect} binaries here")
    with caplog.at_level(logging.WARNING):
        res = _run(script, run_gen, teacher, tmp_path / "run", ["pg-good", "my-good", *SQLITE_ACCEPTS])
    warnings = [r.getMessage() for r in caplog.records if "judged in SQLite" in r.getMessage()]
    assert len(warnings) == 1 and "PostgreSQL and MySQL" in warnings[0] and "SYNTH_PG_DSN" in warnings[0], warnings
    records = jsonl(res.records_path)
    assert sorted(r["prompt_id"] for r in records) == sorted(["pg-good", "my-good", *SQLITE_ACCEPTS])   # SQLite's verdicts
    assert {r["meta"]["execution"]["engine"] for r in records} == {"sqlite"}
    assert res.manifest.steps["execution.engine:sqlite"]["in"] == 4
