"""Text-to-SQL generator (Nemotron 3 Super §3.1.1; spec §2.10; Data Designer's text-to-SQL).

Per sampled bucket (dialect x industry x topic x SQL concept x instruction style x register x
politeness), the steps of `text_to_sql.yaml`:

  sql_schema      the teacher writes the schema (DDL) and sample rows (INSERTs) in the dialect;
                  kept if the DDL parses in the dialect, declares enough tables and the rows load
  sql_task        the teacher writes the request (in the sampled style, register, politeness)
                  and the gold query
  sql_syntax      the query parses in its dialect (sqlglot) and passes the dialect lint
  sql_resolve     every table and column it names exists in the schema
  sql_distractors related-but-irrelevant tables and columns are injected into the schema the
                  model will see; the query provably references none of them
  sql_execute     the query runs on the schema and rows (SQLite, transpiled for other dialects,
                  or a configured PostgreSQL server) and returns rows
  sql_critic x5   LLM critics, one rubric each (correctness, schema use, naturalness, concept
                  fidelity, relevance), each a stage with its own acceptance
  format_sql      one record per surviving sample, carrying dialect, bucket, schema, distractors
                  and every verdict

Each stage counts what it kept, so the run manifest shows the acceptance of every stage.
"""

from __future__ import annotations

import abc
import asyncio
import os
import random
import re
from typing import Any, Iterator

from pydantic import Field
from sqlglot.errors import OptimizeError, ParseError, TokenError

from purokit.config import StrictModel
from purokit.log import get_logger
from purokit.hashing import stable_id
from purokit.records import Verification
from synth.checkpool import CheckTimeout
from synth.domains import sql_servers
from synth.domains import sql_validate as sv
from synth.domains.seeds import load_sql_taxonomy
from synth.domains.sql_engines import results_match
from synth.pipeline import Ask, Candidate, Row, Step, register_source, register_step, render, sampling_config
from synth.steps import JudgeParams, RubricCfg, score_rubric
from synth.verify import Outcome, register_verifier

DIALECT_NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL", "mysql": "MySQL"}
log = get_logger("synth.text_to_sql")


# ---- source ----------------------------------------------------------------------------------

def sample_buckets(seed: int, n: int, taxonomy: Any, dialects: list[str]) -> list[dict[str, Any]]:
    """`n` independent draws of (dialect, industry, topic, concept, style, register, politeness)."""
    rng = random.Random(seed)
    industries = sorted(taxonomy.industries)
    out = []
    for i in range(n):
        dialect = sv.canonical_dialect(rng.choice(dialects))
        industry = rng.choice(industries)
        topic = rng.choice(taxonomy.industries[industry])
        concept = rng.choice(taxonomy.concepts)
        style = rng.choice(taxonomy.instruction_styles)
        register = rng.choice(taxonomy.registers)
        politeness = rng.choice(taxonomy.politeness)
        out.append({
            "id": f"sql-{seed}-{i}-" + stable_id(dialect, industry, topic, concept.id, style, register, politeness, n_hex=8),
            "prompt": f"{DIALECT_NAMES[dialect]} | {industry} / {topic} | {concept.id} | {style}, {register}, politeness {politeness}",
            "dialect": dialect, "dialect_name": DIALECT_NAMES[dialect], "industry": industry, "topic": topic,
            "concept": concept.id, "concept_description": concept.description, "instruction_style": style,
            "register": register, "politeness": politeness, "category": "text_to_sql",
        })
    return out


@register_source("sql_buckets")
def sql_bucket_source(seed: int, n: int = 100, taxonomy: str = "sql_taxonomy.yaml",
                      dialects: list[str] | None = None) -> Iterator[dict[str, Any]]:
    """`n` sampled buckets from a taxonomy file (the shipped one by default)."""
    yield from sample_buckets(seed, n, load_sql_taxonomy(taxonomy), dialects or ["sqlite", "postgres", "mysql"])


# ---- teacher answers -----------------------------------------------------------------------------

_SQL_BLOCK_RE = re.compile(r"```[ \t]*(?:sql|mysql|postgresql|postgres|sqlite)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_REQUEST_RE = re.compile(r"(?is)\**request\**\s*:\s*(.+?)\s*(?:```|\Z)")


def sql_blocks(text: str) -> list[str]:
    return [b.strip() for b in _SQL_BLOCK_RE.findall(text) if b.strip()]


def parse_schema_answer(text: str, dialect: str) -> tuple[str, str]:
    """(DDL, INSERTs) from a teacher's answer: CREATE statements and INSERT statements, wherever
    in its SQL blocks they are. Raises ValueError(reason)."""
    blocks = sql_blocks(text)
    if not blocks:
        raise ValueError("no ```sql block")
    ddl, rows = [], []
    for block in blocks:
        try:
            pieces = sv.split_statements(block, dialect)
        except TokenError as e:
            raise ValueError(f"does not tokenize as {dialect}: {str(e)[:120]}") from None
        for st in pieces:
            head = st.lstrip().upper()
            if head.startswith("INSERT"):
                rows.append(st)
            elif head.startswith(("CREATE", "ALTER", "COMMENT")):
                ddl.append(st)
    if not ddl:
        raise ValueError("no CREATE TABLE statements")
    if not rows:
        raise ValueError("no INSERT statements with sample rows")
    return ";\n\n".join(ddl) + ";\n", ";\n".join(rows) + ";\n"


def parse_task_answer(text: str) -> tuple[str, str]:
    """(request, query) from `Request: ...` followed by a ```sql block. Raises ValueError(reason)."""
    m = _REQUEST_RE.search(text)
    request = m.group(1).strip().strip('"') if m else ""
    blocks = sql_blocks(text)
    if not request:
        raise ValueError("no 'Request:' line")
    if not blocks:
        raise ValueError("no ```sql block with the query")
    query = blocks[-1].rstrip().rstrip(";").strip()
    return request, query


# ---- steps -----------------------------------------------------------------------------------

SCHEMA_PROMPT = """You are designing a realistic {dialect_name} database for a company in the {industry} industry, about {topic}.

Write:
1. The schema: {min_tables} to {max_tables} CREATE TABLE statements in {dialect_name} syntax, with primary keys, foreign keys and sensible column types.
2. Sample rows: INSERT statements with 3 to 6 rows for every table, consistent with the foreign keys.

Put the CREATE TABLE statements in one ```sql block and the INSERT statements in a second ```sql block. Write nothing else."""

TASK_PROMPT = """Here is a {dialect_name} database about {topic} ({industry}):

```sql
{schema_ddl}
```

Its sample rows:

```sql
{rows_sql}
```

Write one request that a user of this database could make, whose answer needs {concept_description}, and the {dialect_name} query that answers it.
- The request is in the {instruction_style} instruction style, with a {register} register and politeness "{politeness}".
- The query is valid {dialect_name}, read-only (SELECT or WITH), uses only tables and columns of the schema, and returns at least one row on the sample rows.

Answer in exactly this form:
Request: <the request>
```sql
<the query>
```"""

CRITIC_PROMPT = """You are reviewing one example of a text-to-SQL training set.

Database schema ({dialect_name}); it may contain tables and columns the request does not need:
```sql
{visible_ddl}
```

Request: {request}

SQL query:
```sql
{sql}
```

The query ran on sample data and returned {n_rows} rows, for example: {rows_preview}

Criterion "{rubric_name}": {rubric_description}

Rate the example on this criterion from 1 (bad) to 5 (excellent). Reply with a JSON object: {{"score": <1-5>, "reason": "<one sentence>"}}"""

DEFAULT_RUBRICS = [
    RubricCfg(name="correctness", description="The query returns exactly what the request asks for (right filters, joins, grouping, ordering)."),
    RubricCfg(name="schema_use", description="The query uses the schema correctly: joins on the keys that relate the tables, compares columns of matching types."),
    RubricCfg(name="naturalness", description="The request reads like something a real user would write, in the stated style, register and politeness, without naming SQL syntax."),
    RubricCfg(name="concept_fidelity", description="Answering the request genuinely needs the SQL concept: {concept_description}."),
    RubricCfg(name="relevance", description="The query touches only what the request needs: no unneeded tables, joins or columns."),
]


@register_step("sql_schema")
class SqlSchema(Step):
    """The teacher writes DDL and sample rows; keep them if they parse and load."""

    class Config(sampling_config("teacher", SCHEMA_PROMPT, temperature=0.7, max_tokens=1500)):
        min_tables: int = 2
        max_tables: int = 4

    async def apply(self, row: Row) -> None:
        fields = dict(row.fields, min_tables=self.cfg.min_tables, max_tables=self.cfg.max_tables)
        cands = await self.sample(row, "schema", Ask(fields, ("schema",)))
        await self.keep(row, cands, lambda c: self.usable(c, row.fields["dialect"]))

    def usable(self, c: Candidate, dialect: str) -> str | None:
        why = None
        try:
            ddl, rows_sql = parse_schema_answer(c.text, dialect)
            tables = sv.schema_tables(ddl, dialect)
            if len(tables) < self.cfg.min_tables:
                why = f"{len(tables)} tables, need at least {self.cfg.min_tables}"
            else:
                sv.load_sqlite(ddl, rows_sql, dialect).close()
                c.parsed.update(ddl=ddl, rows_sql=rows_sql, tables=[t.name for t in tables])
        except (ValueError, ParseError, TokenError) as e:
            why = f"schema or rows unusable: {str(e)[:300]}"
        if c.result is not None and c.result.finish_reason == "length":
            why = "truncated at max_tokens"
        return why


@register_step("sql_task")
class SqlTask(Step):
    """The teacher writes the request and the gold query for the surviving schema."""

    Config = sampling_config("teacher", TASK_PROMPT, temperature=0.7, max_tokens=700)

    async def apply(self, row: Row) -> None:
        s = self.first_alive(row, "schema")
        if s is None:
            return
        fields = dict(row.fields, schema_ddl=s.parsed["ddl"].strip(), rows_sql=s.parsed["rows_sql"].strip())
        parsed = dict(ddl=s.parsed["ddl"], rows_sql=s.parsed["rows_sql"], schema_teacher=s.teacher, checks=[])
        cands = await self.sample(row, "task", Ask(fields, ("task",), parsed))
        await self.keep(row, cands, self.parse)

    @staticmethod
    def parse(c: Candidate) -> str | None:
        try:
            c.parsed["request"], c.parsed["sql"] = parse_task_answer(c.text)
        except ValueError as e:
            return str(e)
        return None


class _SqlCheck(Step):
    """Base of the programmatic checks: one check per step, on the alive `task` candidates."""

    @abc.abstractmethod
    async def verdict(self, row: Row, c: Candidate) -> sv.Check:
        """The verdict of this stage on one sample."""

    async def apply(self, row: Row) -> None:
        async def passes(c: Candidate) -> str | None:
            chk = await self.verdict(row, c)
            c.parsed["checks"].append(chk.to_dict())
            return None if chk.ok else chk.detail

        await self.keep(row, "task", passes)


@register_step("sql_syntax")
class SqlSyntax(_SqlCheck):
    class Config(StrictModel):
        pass

    async def verdict(self, row: Row, c: Candidate) -> sv.Check:
        return sv.check_query_syntax(c.parsed["sql"], row.fields["dialect"])


@register_step("sql_resolve")
class SqlResolve(_SqlCheck):
    class Config(StrictModel):
        pass

    async def verdict(self, row: Row, c: Candidate) -> sv.Check:
        dialect = row.fields["dialect"]
        try:
            tables = sv.schema_tables(c.parsed["ddl"], dialect)
            sv.query_references(c.parsed["sql"], dialect, sv.schema_mapping(tables))
        except (OptimizeError, ParseError, TokenError, ValueError) as e:
            return sv.Check("resolution", False, f"the query does not fit the schema: {sv.short_error(e)}")
        return sv.Check("resolution", True)


@register_step("sql_distractors")
class SqlDistractors(_SqlCheck):
    """Inject distractor tables/columns (seeded per row) and prove the gold query ignores them."""

    class Config(StrictModel):
        n_tables: int = 2
        n_columns: int = 2
        pool_tables: list[dict[str, Any]] = Field(default_factory=list)
        pool_columns: list[dict[str, str]] = Field(default_factory=list)

    async def verdict(self, row: Row, c: Candidate) -> sv.Check:
        dialect = row.fields["dialect"]
        rng = random.Random(self.request_seed(row, "distractors"))
        tables = sv.schema_tables(c.parsed["ddl"], dialect)
        d_tables, d_cols = sv.propose_distractors(tables, rng, self.cfg.n_tables, self.cfg.n_columns,
                                                  self.cfg.pool_tables, self.cfg.pool_columns)
        if not d_tables and not d_cols:
            return sv.Check("distractors", False, "no distractor could be proposed for this schema")
        visible = sv.inject_distractors(c.parsed["ddl"], dialect, d_tables, d_cols, rng)
        c.parsed.update(visible_ddl=visible, distractor_tables=[t.name for t in d_tables],
                        distractor_columns=[{"table": d.table, "column": d.column, "type": d.type} for d in d_cols])
        leaks = sv.distractor_leaks(c.parsed["sql"], dialect, sv.schema_mapping(sv.schema_tables(visible, dialect)),
                                    [t.name for t in d_tables], d_cols)
        if leaks:
            return sv.Check("distractors", False, "the gold query references " + ", ".join(leaks))
        return sv.Check("distractors", True, f"{len(d_tables)} tables and {len(d_cols)} columns injected, none referenced")


def execute_sample(dialect: str, parsed: dict[str, Any], min_rows: int, timeout_s: float, unsupported: str,
                   dsn: str | None) -> tuple[sv.Check, dict[str, Any] | None]:
    """(execution check, execution result) of a sample's gold query (run in the check pool; a
    PostgreSQL or MySQL sample runs on the server at `dsn` when one is given)."""
    verdict = sv.validate_sql_sample(
        dialect=dialect, ddl=parsed["ddl"], rows_sql=parsed["rows_sql"], query=parsed["sql"],
        visible_ddl=parsed["visible_ddl"], distractor_tables=parsed["distractor_tables"],
        distractor_columns=[sv.DistractorColumn(**d) for d in parsed["distractor_columns"]],
        min_rows=min_rows, timeout_s=timeout_s, unsupported=unsupported, dsn=dsn)
    execution = verdict.execution.to_dict() if verdict.execution else None
    ran = next((ch for ch in verdict.checks if ch.name == "execution"), None)
    if ran is None:        # an earlier check failed inside the full validation: report it
        first = verdict.first_failure
        return sv.Check("execution", False, f"{first.name}: {first.detail}" if first else "not executed"), execution
    return ran, execution


@register_step("sql_execute")
class SqlExecute(_SqlCheck):
    """Run the gold query on the schema without distractors (a second proof that it ignores them), on
    the dialect's real engine: the server a DSN variable names, else a throwaway server this run
    starts (`sql_servers`, held until the run ends), else, with neither, SQLite (warned once at start;
    the record's `execution.engine` says `sqlite`). The manifest counts each engine's samples
    (`<step>.engine:<postgres|mariadb|mysql|sqlite>`)."""

    class Config(StrictModel):
        min_rows: int = 1
        timeout_s: float = 5.0
        unsupported: str = "reject"          # reject | accept: a query SQLite cannot judge
        # environment variables holding a DSN per dialect: when one is set, that dialect's samples run
        # on that real server; when not, on a throwaway local server (or SQLite without the binaries)
        postgres_dsn_env: str | None = "SYNTH_PG_DSN"
        mysql_dsn_env: str | None = "SYNTH_MYSQL_DSN"

    def __init__(self, name: str, cfg: Any, env: Any):
        super().__init__(name, cfg, env)
        self._held: dict[str, str] = {}               # dialect -> DSN of the local server this run holds
        self._fallback: set[str] = set()              # dialects judged in SQLite for this run
        self._lock = asyncio.Lock()
        missing = {d: why for d in sql_servers.PACKAGES if not self.configured_dsn(d)
                   and (why := sql_servers.binaries_missing(d))}
        if missing:
            self._fallback.update(missing)
            log.warning("%s: %s samples will be judged in SQLite, not on their engine (no %s set, and %s); "
                        "records say execution.engine: sqlite", self.name, " and ".join(DIALECT_NAMES[d] for d in missing),
                        " or ".join(v for d in missing if (v := self._dsn_var(d))), "; ".join(missing.values()))

    def _dsn_var(self, dialect: str) -> str | None:
        return {"postgres": self.cfg.postgres_dsn_env, "mysql": self.cfg.mysql_dsn_env}.get(dialect)

    def configured_dsn(self, dialect: str) -> str | None:
        """The DSN the environment names for `dialect`, or None."""
        var = self._dsn_var(dialect)
        return (os.environ.get(var) or None) if var else None

    async def dsn(self, dialect: str) -> str | None:
        """Where `dialect`'s samples run: the configured server, else this run's local one (started on
        first use), else None (SQLite)."""
        configured = self.configured_dsn(dialect)
        if configured or dialect not in sql_servers.PACKAGES or dialect in self._fallback:
            return configured
        async with self._lock:
            if dialect not in self._held and dialect not in self._fallback:
                try:
                    self._held[dialect] = await asyncio.to_thread(sql_servers.acquire, dialect)
                except sql_servers.ServerUnavailable as e:
                    log.warning("%s: %s samples will be judged in SQLite: %s", self.name, DIALECT_NAMES[dialect], e)
                    self._fallback.add(dialect)
        return self._held.get(dialect)

    def close(self) -> None:
        for dialect in self._held:
            sql_servers.release(dialect)
        self._held.clear()

    async def verdict(self, row: Row, c: Candidate) -> sv.Check:
        dsn = await self.dsn(row.fields["dialect"])
        try:
            chk, c.parsed["execution"] = await self.check(
                execute_sample, row.fields["dialect"], c.parsed, self.cfg.min_rows, self.cfg.timeout_s,
                self.cfg.unsupported, dsn, timeout_s=self.cfg.timeout_s + 30)
        except CheckTimeout as e:
            c.parsed["execution"] = {"status": "timeout", "error": str(e)}
            chk = sv.Check("execution", False, f"timeout: {e}")
        engine = judging_engine(c.parsed["execution"], row.fields["dialect"] if dsn else "sqlite")
        self.count(row, 1, int(chk.ok), stage=f"engine:{engine}")
        return chk


def judging_engine(execution: dict[str, Any] | None, planned: str) -> str:
    """postgres | mariadb | mysql | sqlite: what judged a sample (its execution result's engine and
    server; `planned` when it has none)."""
    ex = execution or {}
    engine = ex.get("engine") or planned
    return "mariadb" if engine == "mysql" and "mariadb" in str(ex.get("server", "")).lower() else engine


@register_step("sql_critic")
class SqlCritic(Step):
    """One LLM critic rubric over the surviving samples (Nemotron 3: five LLM-as-a-critic judges)."""

    class Config(StrictModel):
        rubric: RubricCfg
        judge: JudgeParams = Field(default_factory=JudgeParams)
        template: str = CRITIC_PROMPT

    async def apply(self, row: Row) -> None:
        await self.keep(row, "task", lambda c: self.critique(row, c))

    async def critique(self, row: Row, c: Candidate) -> str | None:
        ex = c.parsed.get("execution") or {}
        fields = dict(row.fields, visible_ddl=c.parsed["visible_ddl"].strip(), request=c.parsed["request"],
                      sql=c.parsed["sql"], n_rows=ex.get("n_rows", 0), rows_preview=ex.get("rows_preview", [])[:3],
                      rubric_name=self.cfg.rubric.name,
                      rubric_description=render(self.cfg.rubric.description, row.fields))
        verdict = await score_rubric(self, row, self.cfg.judge, self.cfg.rubric, render(self.cfg.template, fields), c.index)
        c.parsed.setdefault("critics", []).append(verdict)
        if verdict["pass"]:
            return None
        return (f"critic {self.cfg.rubric.name}: score {verdict['score']} < {self.cfg.rubric.min_score}"
                if verdict["score"] is not None else f"critic {self.cfg.rubric.name}: {verdict['reason']}")


USER_TEMPLATE = """Database ({dialect_name}):
```sql
{visible_ddl}
```

{request}"""


@register_step("format_sql")
class FormatSql(Step):
    """One SFT record per surviving sample: the schema context and request -> the gold query."""

    class Config(StrictModel):
        user_template: str = USER_TEMPLATE

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, "task")
        for c in alive:
            user = render(self.cfg.user_template, dict(row.fields, visible_ddl=c.parsed["visible_ddl"].strip(),
                                                         request=c.parsed["request"]))
            assistant = f"```sql\n{c.parsed['sql']}\n```"
            critics = c.parsed.get("critics", [])
            meta = {
                "dialect": row.fields["dialect"], "industry": row.fields["industry"], "topic": row.fields["topic"],
                "sql_concept_bucket": row.fields["concept"], "instruction_style": row.fields["instruction_style"],
                "register": row.fields["register"], "politeness": row.fields["politeness"],
                "prompt": c.parsed["request"], "sql": c.parsed["sql"], "schema_ddl": c.parsed["visible_ddl"],
                "schema_core_ddl": c.parsed["ddl"], "sample_rows_sql": c.parsed["rows_sql"],
                "distractor_tables": c.parsed["distractor_tables"], "distractor_columns": c.parsed["distractor_columns"],
                "checks": c.parsed["checks"], "execution": c.parsed.get("execution"), "critic_scores": critics,
                "schema_teacher": c.parsed.get("schema_teacher"),
            }
            scores = [v["score"] for v in critics if v["score"] is not None]
            verification = Verification(method="sql_execution+critics", verdict=True,
                                        score=min(scores) if scores else None,
                                        rule=f"syntax,resolution,distractors,execution,{len(critics)} critics",
                                        detail=f"{(c.parsed.get('execution') or {}).get('n_rows', 0)} rows")
            self.record(row, ("sql", c.index), [
                {"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
                teacher=c.teacher, verification=verification, meta=meta, category="text_to_sql")
        self.count(row, len(alive), len(alive))



def default_critic_steps() -> list[dict[str, Any]]:
    """The five critic stages as YAML step entries (what `text_to_sql.yaml` lists)."""
    return [{"kind": "sql_critic", "name": f"critic:{r.name}", "rubric": r.model_dump()} for r in DEFAULT_RUBRICS]


@register_verifier("sql")
def verify_sql(response: str, reference: Any, row: dict[str, Any]) -> Outcome:
    """An SQL sample is right when its query (the last ```sql block, else the whole reply) returns
    the same result set as the reference query on the row's schema and rows (`ddl`, `rows_sql`,
    `dialect`), so text-to-SQL prompts can feed `pass_rate`."""
    blocks = sql_blocks(response)
    query = (blocks[-1] if blocks else response).strip()
    dialect = row.get("dialect", "sqlite")
    got = sv.execute_in_sqlite(query, row["ddl"], row["rows_sql"], dialect, min_rows=0)
    if not got.ok and got.status != "empty":
        return Outcome(False, 0.0, f"query {got.status}: {got.error}"[:300], query)
    want = sv.execute_in_sqlite(str(reference), row["ddl"], row["rows_sql"], dialect, min_rows=0)
    ok = want.status in ("ok", "empty") and results_match(got, want)       # ORDER BY decides if order counts
    return Outcome(ok, float(ok), "" if ok else f"result differs from the reference ({got.n_rows} vs {want.n_rows} rows)", query)
