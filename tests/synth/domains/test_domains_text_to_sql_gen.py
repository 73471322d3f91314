"""The text-to-SQL generator end to end on the engine against a scripted teacher over real HTTP:
one accepted sample per dialect, and each rejection path (schema, task format, syntax,
resolution, distractor leak, execution, a critic) named in the quarantine and the manifest."""

from __future__ import annotations

import json

import pytest

from synth.domains.text_to_sql import DIALECT_NAMES, parse_schema_answer, parse_task_answer, sample_buckets
from synth.domains.seeds import load_sql_taxonomy

DDL = {
    "sqlite": "CREATE TABLE customers (\n  id INTEGER PRIMARY KEY,\n  name TEXT NOT NULL,\n  city TEXT\n);\n"
              "CREATE TABLE orders (\n  order_id INTEGER PRIMARY KEY,\n  customer_id INTEGER REFERENCES customers(id),\n  total REAL\n);",
    "postgres": "CREATE TABLE customers (\n  id SERIAL PRIMARY KEY,\n  name VARCHAR(80) NOT NULL,\n  city VARCHAR(40)\n);\n"
                "CREATE TABLE orders (\n  order_id SERIAL PRIMARY KEY,\n  customer_id INT REFERENCES customers(id),\n  total NUMERIC(10, 2)\n);",
    "mysql": "CREATE TABLE customers (\n  id INT AUTO_INCREMENT PRIMARY KEY,\n  name VARCHAR(80) NOT NULL,\n  city VARCHAR(40)\n) ENGINE=InnoDB;\n"
             "CREATE TABLE `orders` (\n  order_id INT AUTO_INCREMENT PRIMARY KEY,\n  customer_id INT,\n  total DECIMAL(10, 2)\n);",
}
ROWS = ("INSERT INTO customers (name, city) VALUES ('Ana', 'Lyon'), ('Bo', 'Oslo'), ('Cy', 'Lyon');\n"
        "INSERT INTO orders (customer_id, total) VALUES (1, 10.5), (1, 20), (2, 7.25), (3, 40);")
GOOD_SQL = {
    "sqlite": "SELECT c.city, SUM(o.total) AS revenue FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city",
    "postgres": "SELECT c.city, SUM(o.total)::numeric(10,2) AS revenue FROM customers c JOIN orders o ON o.customer_id = c.id GROUP BY c.city",
    "mysql": "SELECT `c`.`city`, SUM(o.total) AS revenue FROM customers c JOIN `orders` o ON o.customer_id = c.id GROUP BY c.city",
}
TASKS = {   # topic -> (dialect, task answer)
    "t-good-sqlite": ("sqlite", f"Request: What is the revenue per city?\n```sql\n{GOOD_SQL['sqlite']}\n```"),
    "t-good-postgres": ("postgres", f"Request: Please list revenue by city.\n```sql\n{GOOD_SQL['postgres']};\n```"),
    "t-good-mysql": ("mysql", f"request: revenue per city, thanks\n```mysql\n{GOOD_SQL['mysql']}\n```"),
    "t-bad-schema": ("sqlite", "unused"),
    "t-no-request": ("sqlite", f"```sql\n{GOOD_SQL['sqlite']}\n```"),
    "t-syntax": ("sqlite", "Request: Totals as integers.\n```sql\nSELECT total::int FROM orders\n```"),
    "t-resolve": ("sqlite", "Request: Customer emails.\n```sql\nSELECT email FROM customers\n```"),
    "t-leak": ("sqlite", "Request: Everything about orders and buyers.\n```sql\nSELECT * FROM customers c JOIN orders o ON o.customer_id = c.id\n```"),
    "t-empty": ("sqlite", "Request: Customers in Atlantis.\n```sql\nSELECT name FROM customers WHERE city = 'Atlantis'\n```"),
    "t-critic": ("sqlite", f"Request: revenue per city (critic-bait)\n```sql\n{GOOD_SQL['sqlite']}\n```"),
}
EXPECTED_REJECT_STEP = {"t-bad-schema": "schema", "t-no-request": "task", "t-syntax": "syntax", "t-resolve": "resolution",
                        "t-leak": "distractors", "t-empty": "execution", "t-critic": "critic:naturalness"}


def item(topic: str, dialect: str) -> dict:
    return {"id": topic, "prompt": topic, "dialect": dialect, "dialect_name": DIALECT_NAMES[dialect],
            "industry": "retail e-commerce", "topic": topic, "concept": "group_by",
            "concept_description": "GROUP BY with aggregates", "instruction_style": "interrogative",
            "register": "formal", "politeness": "polite", "category": "text_to_sql"}


def schema_reply(text: str, req: dict) -> str:
    topic = next(t for t in TASKS if f"about {t}" in text)
    if topic == "t-bad-schema":
        return "```sql\nCREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT,\n```\n```sql\nINSERT INTO customers VALUES (1, 'a');\n```"
    dialect = TASKS[topic][0]
    return f"Here you go.\n```sql\n{DDL[dialect]}\n```\n\n```sql\n{ROWS}\n```"


def task_reply(text: str, req: dict) -> str:
    topic = next(t for t in TASKS if f"about {t}" in text)
    return TASKS[topic][1]


@pytest.fixture
def sql_script(script, held_sql_servers):
    script.on("You are designing a realistic", reply=schema_reply, name="schema")
    script.on("Write one request that a user", reply=task_reply, name="task")
    script.on('Criterion "naturalness"', "critic-bait", reply='{"score": 2, "reason": "stilted"}', name="critic-low")
    script.on("Criterion \"", reply=lambda t, r: json.dumps({"score": 5, "reason": "fine"}), name="critic")
    return script


def run_sql(run_gen, teacher, out):
    items = [item(t, d) for t, (d, _) in TASKS.items()]
    return run_gen("text_to_sql", teacher.base_url, out, source={"kind": "inline", "items": items})


def test_sql_generator_accepts_good_samples_and_names_every_rejection(sql_script, teacher, run_gen, tmp_path, jsonl):
    res = run_sql(run_gen, teacher, tmp_path / "run")
    assert sql_script.unmatched == []
    records = jsonl(res.records_path)
    assert sorted(r["prompt_id"] for r in records) == ["t-good-mysql", "t-good-postgres", "t-good-sqlite"]
    for r in records:
        meta = r["meta"]
        assert r["generator"] == "text_to_sql" and r["category"] == "text_to_sql"
        assert meta["dialect"] in ("sqlite", "postgres", "mysql") and meta["sql_concept_bucket"] == "group_by"
        assert meta["distractor_tables"] and meta["distractor_columns"]
        for t in meta["distractor_tables"]:
            assert t in meta["schema_ddl"] and t not in meta["sql"]
        assert [c["name"] for c in meta["checks"]] == ["syntax", "resolution", "distractors", "execution"]
        assert all(c["ok"] for c in meta["checks"])
        assert meta["execution"]["n_rows"] == 2 and meta["execution"]["status"] == "ok"
        assert [c["name"] for c in meta["critic_scores"]] == ["correctness", "schema_use", "naturalness", "concept_fidelity", "relevance"]
        assert r["messages"][0]["role"] == "user" and meta["schema_ddl"].strip() in r["messages"][0]["content"]
        assert r["messages"][1]["content"].startswith("```sql\n")
    rejects = jsonl(res.out_dir / "rejects.jsonl")
    by_prompt = {}
    for rj in rejects:
        by_prompt.setdefault(rj["prompt_id"], []).append(rj["step"])
    for topic, step in EXPECTED_REJECT_STEP.items():
        assert by_prompt.get(topic) == [step], (topic, by_prompt.get(topic), rejects)
    leak = next(rj for rj in rejects if rj["prompt_id"] == "t-leak")
    assert "references column" in leak["reason"]
    steps = res.manifest.steps
    assert (steps["schema"]["in"], steps["schema"]["out"]) == (10, 9)
    assert (steps["execution"]["in"], steps["execution"]["out"]) == (5, 4)
    assert steps["critic:naturalness"]["acceptance"] == pytest.approx(3 / 4)
    assert steps["format"]["out"] == 3
    assert sql_script.hits["critic-low"] == 1


def test_sql_generator_resumes_from_its_journal_and_is_deterministic(sql_script, teacher, run_gen, tmp_path):
    first = run_sql(run_gen, teacher, tmp_path / "a")
    n_requests = sum(sql_script.hits.values())
    again = run_sql(run_gen, teacher, tmp_path / "a")          # same directory: everything journaled
    assert sum(sql_script.hits.values()) == n_requests
    assert again.records_path.read_bytes() == first.records_path.read_bytes()
    other = run_sql(run_gen, teacher, tmp_path / "b")          # fresh directory: same bytes
    assert other.records_path.read_bytes() == first.records_path.read_bytes()


def test_bucket_sampling_covers_the_axes_deterministically():
    tax = load_sql_taxonomy()
    a = sample_buckets(3, 200, tax, ["sqlite", "postgresql", "mysql"])
    assert a == sample_buckets(3, 200, tax, ["sqlite", "postgresql", "mysql"])
    assert {x["dialect"] for x in a} == {"sqlite", "postgres", "mysql"}
    assert len({x["concept"] for x in a}) > 30 and len({x["industry"] for x in a}) > 20
    assert all(x["topic"] in tax.industries[x["industry"]] for x in a)
    assert len({x["id"] for x in a}) == 200


def test_teacher_answer_parsing():
    ddl, rows = parse_schema_answer(f"```sql\n{DDL['postgres']}\n{ROWS}\n```", "postgres")
    assert ddl.count("CREATE TABLE") == 2 and rows.count("INSERT") == 2
    with pytest.raises(ValueError, match="no INSERT"):
        parse_schema_answer(f"```sql\n{DDL['sqlite']}\n```", "sqlite")
    with pytest.raises(ValueError, match="no ```sql block"):
        parse_schema_answer("CREATE TABLE x (a INT);", "sqlite")
    assert parse_task_answer("Request: How many?\n```sql\nSELECT 1;\n```") == ("How many?", "SELECT 1")
    with pytest.raises(ValueError, match="no 'Request:'"):
        parse_task_answer("```sql\nSELECT 1\n```")


def test_sql_verifier_for_pass_rate_compares_order_only_when_the_reference_orders():
    from synth.domains.text_to_sql import verify_sql

    row = {"dialect": "sqlite", "ddl": "CREATE TABLE t (id INTEGER, name TEXT);",
           "rows_sql": "INSERT INTO t VALUES (1, 'b'), (2, 'a'), (3, NULL);"}
    unordered = "SELECT name FROM t"
    assert verify_sql("```sql\nSELECT name FROM t ORDER BY id DESC\n```", unordered, row).passed   # same multiset
    ordered = "SELECT name FROM t ORDER BY id"
    assert verify_sql("SELECT name FROM t ORDER BY id", ordered, row).passed
    assert not verify_sql("SELECT name FROM t ORDER BY id DESC", ordered, row).passed           # order asked, differs
    assert not verify_sql("SELECT name FROM t WHERE name IS NOT NULL", unordered, row).passed    # NULL row missing


def test_sql_execute_takes_each_dialects_server_from_its_own_variable(monkeypatch):
    from synth.domains.text_to_sql import SqlExecute

    step = SqlExecute.__new__(SqlExecute)
    step.cfg = SqlExecute.Config()
    monkeypatch.setenv("SYNTH_PG_DSN", "postgresql://pg@127.0.0.1/x")
    monkeypatch.setenv("SYNTH_MYSQL_DSN", "mysql://my@127.0.0.1/x")
    assert step.configured_dsn("postgres").startswith("postgresql://")
    assert step.configured_dsn("mysql").startswith("mysql://")
    assert step.configured_dsn("sqlite") is None
    monkeypatch.delenv("SYNTH_MYSQL_DSN")
    assert step.configured_dsn("mysql") is None
