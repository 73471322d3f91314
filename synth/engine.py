"""The generation engine: runs a generator's steps over its prompts, concurrently, resumably.

Output directory:
    journal.jsonl   append-only, one line per finished prompt (records, rejections, counts,
                    usage); its first line is a header with the config hash
    cache.sqlite    request/response cache (synth.cache)
    records.jsonl   the dataset (contract 6), sorted by prompt order then record order, after the
                    post steps (clean, curriculum); byte-identical for the same inputs, config, seeds
    rejects.jsonl   every rejected prompt/candidate with the step and the reason (quarantine)
    removals.jsonl  what post steps removed and why (decontamination report)
    manifest.json   teachers, parameters, counts and acceptance per step, token usage, throughput,
                    errors (a `synth-run/1` RunManifest)

Resume: a killed run leaves the journal with whole lines plus at most one torn last line; the next
run truncates the torn tail, skips prompts already journaled, and replays cached requests. Every
prompt is journaled with a single write of one line, so after SIGKILL and resume there is no lost
and no duplicated record. The final files are rebuilt from the journal, not appended to.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from purokit import atomic
from purokit.sandbox import isolation_status
from purokit.config import load_config
from purokit.errors import ContractError
from purokit.hashing import canonical_json, config_hash
from purokit.log import get_logger
from purokit.progress import Reporter, progress_text
from purokit.manifest import RunManifest
from purokit.records import SynthRecord, validate_record
from synth.backends import make_backend
from synth.cache import ResponseCache
from synth.client import CircuitOpenError, Clock, EndpointPool, RequestRejected, TeacherConfig
from synth.decontam import EvalIndex, build_eval_index
from synth.export import export_records
from synth.pipeline import POST_STEPS, STEPS, GeneratorConfig, PostStep, Row, RowError, Step
from synth.sources import load_rows

import synth.steps

log = get_logger("synth.engine")
BUILTIN_STEPS = synth.steps          # imported for its registrations

JOURNAL_SCHEMA = "synth-journal/1"
RUN_SCHEMA = "synth-run/1"


class SynthRunManifest(RunManifest):
    SCHEMA = RUN_SCHEMA
    generator: str
    teachers: dict[str, dict[str, Any]] = {}
    steps: dict[str, dict[str, Any]] = {}
    post: dict[str, dict[str, Any]] = {}
    usage: dict[str, Any] = {}
    throughput: dict[str, float] = {}
    errors: dict[str, Any] = {}
    run_identity: str = ""              # config hash without endpoints/concurrency (what resume matches)
    sandbox: dict[str, str] = {}        # the isolation generated code ran under (purokit.sandbox)


# Where a teacher is served and how hard the client pushes do not change any answer (requests are
# content-keyed and seeded), so they are not part of the run identity: a run resumes against a
# restarted server on another port, or with more endpoints.
OPERATIONAL_TEACHER_KEYS = ("endpoints", "api_key_env", "initial_concurrency", "min_concurrency", "max_concurrency",
                            "timeout_s", "max_retries", "backoff_base_s", "backoff_max_s", "breaker_failures",
                            "breaker_cooldown_s", "breaker_max_trips", "ready_timeout_s", "stream", "retry_after_max_s",
                            "latency_aware", "latency_tolerance", "slow_answer_fraction", "batch_completion_window",
                            "batch_collect_s", "batch_max_requests", "batch_poll_s", "batch_poll_max_s", "batch_failed")
OPERATIONAL_OUTPUT_KEYS = ("max_inflight_rows", "max_error_rows", "check_workers", "progress_every_s")


def run_identity(cfg_dump: dict[str, Any]) -> str:
    """Hash of the config minus operational settings: what the journal must match to resume."""
    d = json.loads(json.dumps(cfg_dump))
    for t in d.get("teachers", {}).values():
        for k in OPERATIONAL_TEACHER_KEYS:
            t.pop(k, None)
    for k in OPERATIONAL_OUTPUT_KEYS:
        d.get("output", {}).pop(k, None)
    return config_hash(d)


class RunEnv:
    """What steps see of the run: the config, the seed, teacher backends, shared indexes."""

    def __init__(self, generator: GeneratorConfig, cache: ResponseCache | None, llm_factory: Any = None,
                 clock: Clock | None = None):
        self.generator = generator
        self.endpoints = EndpointPool(clock)      # one limiter, breaker and Retry-After window per URL
        self.seed = generator.seed
        self._backends: dict[str, Any] = {}
        self._cache = cache
        self._llm_factory = llm_factory
        self._eval: dict[str, EvalIndex] = {}
        self._served: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._resources: dict[str, Any] = {}

    def backend(self, role: str) -> Any:
        if role not in self._backends:
            if role not in self.generator.teachers:
                raise ValueError(f"generator '{self.generator.generator}' has no teacher '{role}' "
                                 f"(teachers: {', '.join(self.generator.teachers) or 'none'})")
            self._backends[role] = make_backend(self.generator.teachers[role], self._cache, seed=self.seed,
                                                llm_factory=self._llm_factory, pool=self.endpoints)
        return self._backends[role]

    async def endpoint_info(self, role: str) -> dict[str, Any]:
        """What the teacher `role`'s endpoint reports about how it serves (once per role)."""
        if role not in self._served:
            self._served[role] = asyncio.ensure_future(self.backend(role).served_info())
        return await asyncio.shield(self._served[role])

    def eval_index(self, specs: list[dict[str, Any]], n: int) -> EvalIndex:
        key = canonical_json([specs, n])
        if key not in self._eval:
            self._eval[key] = build_eval_index(specs, n)
        return self._eval[key]

    def resource(self, key: str, make: Callable[[], Any]) -> Any:
        """A run-wide object shared by the steps (an MCP server connection), made on first use;
        closed (`aclose()`) when the run ends."""
        if key not in self._resources:
            self._resources[key] = make()
        return self._resources[key]

    async def close(self) -> None:
        for b in self._backends.values():
            await b.close()
        for r in self._resources.values():
            await r.aclose()

    def any_answered(self) -> bool:
        """Whether any endpoint of this run has answered a request (or the cache has)."""
        return any(st.n_ok for st in self.endpoints.states.values()) or \
            any(getattr(b, "n_cached", 0) for b in self._backends.values())

    def backend_stats(self) -> dict[str, Any]:
        return {role: b.stats() for role, b in self._backends.items()}

    def completion_tokens(self) -> int:
        """Completion tokens the teachers have answered so far in this run (not from the cache)."""
        return sum(int(s.get("completion_tokens", 0)) for s in self.backend_stats().values())

    def endpoint_limits(self) -> dict[str, int]:
        """The concurrency each endpoint is allowed now (host:port -> limit)."""
        return {url.split("//", 1)[-1].removesuffix("/v1"): st.limit.limit for url, st in self.endpoints.states.items()}


# ---- journal ------------------------------------------------------------------------------------

def _journal_line(row: Row) -> str:
    return json.dumps({
        "index": row.index, "id": row.id, "dropped": row.dropped,
        "records": [r.model_dump(mode="json", by_alias=True) for r in row.records],
        "rejects": row.rejects, "step_counts": row.step_counts, "usage": row.usage,
    }, ensure_ascii=False, sort_keys=True, separators=(",", ":")) + "\n"


def read_journal(path: Path, cfg_hash: str) -> dict[str, dict[str, Any]]:
    """Finished prompts by id. Truncates a torn last line (a kill mid-write) in place."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        log.warning("journal %s: dropping a torn last line of %d bytes (the previous run was killed mid-write)",
                    path, len(data) - end)
        with open(path, "r+b") as fh:
            fh.truncate(end)
        data = data[:end]
    lines = data.decode("utf-8").splitlines()
    if not lines:
        return {}
    header = json.loads(lines[0])
    if header.get("schema") != JOURNAL_SCHEMA:
        raise ContractError(path, f"schema is {header.get('schema')!r}, expected {JOURNAL_SCHEMA!r}", field="schema")
    if header.get("config_hash") != cfg_hash:
        raise ContractError(path, "this output directory holds a run of a different generator config "
                            f"(journal {header.get('config_hash', '')[:12]}, now {cfg_hash[:12]}); use another --out, "
                            "or --fresh to restart here (the request cache is kept)")
    done: dict[str, dict[str, Any]] = {}
    for i, line in enumerate(lines[1:], 2):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise ContractError(f"{path} line {i}", f"not valid JSON ({e})") from None
        done[entry["id"]] = entry
    return done


class Journal:
    def __init__(self, path: Path, cfg_hash: str):
        self.path = path
        new = not path.exists() or path.stat().st_size == 0
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if new:
            self._write(json.dumps({"schema": JOURNAL_SCHEMA, "config_hash": cfg_hash}) + "\n")

    def _write(self, line: str) -> None:
        data = line.encode("utf-8")
        n = os.write(self._fd, data)          # one write per line: O_APPEND keeps lines whole
        if n != len(data):
            raise OSError(f"short write to {self.path}: {n} of {len(data)} bytes")

    def append(self, row: Row) -> None:
        self._write(_journal_line(row))

    def sync(self) -> None:
        os.fsync(self._fd)

    def close(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)


# ---- progress -----------------------------------------------------------------------------------

def format_eta(seconds: float | None) -> str:
    """'?' before the first prompt finishes, then '45s', '12m05s', '3h20m'."""
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_message(done: int, total: int, completion_tokens: int, elapsed_s: float, errors: int = 0,
                     limits: dict[str, int] | None = None, accepted: int = 0, generated: int = 0) -> str:
    """The figures beside the prompt count: completion tokens/s since the start (live: counted per
    answer, so a run whose prompts take long still shows the teacher working), the ETA from the
    prompt rate so far, the share of candidates accepted, and the concurrency each endpoint is
    allowed now."""
    rate = completion_tokens / elapsed_s if elapsed_s > 0 else 0.0
    eta = elapsed_s / done * (total - done) if done else None
    line = f"{rate:.0f} tok/s, ETA {format_eta(eta)}"
    if generated:
        line += f", accept {accepted / generated:.0%}"
    if errors:
        line += f", {errors} failed"
    if limits:
        line += ", concurrency " + " ".join(f"{u}={n}" for u, n in limits.items())
    return line


ProgressReport = Callable[[str], None]


@dataclass
class Progress:
    """The run's counters, shown through the one `purokit.progress.Reporter`: a bar on a terminal,
    a `prompt <done>/<total> | <figures>` line every `every_s` seconds (to `report` when given, e.g.
    a pipeline's log), or nothing; `tick` refreshes the live token count even while no prompt
    finishes."""
    total: int
    done: int = 0
    records: int = 0
    generated: int = 0
    accepted: int = 0
    completion_tokens: int = 0           # live, from the backends (tick)
    errors: int = 0
    t0: float = field(default_factory=time.perf_counter)
    enabled: bool = True
    report: ProgressReport | None = None
    every_s: float = 30.0
    limits: dict[str, int] = field(default_factory=dict)
    _reporter: Any = None

    def __post_init__(self) -> None:
        mode = "none" if not self.enabled else ("line" if self.report is not None else "auto")
        self._reporter = Reporter(self.total, unit="prompt", mode=mode, every_s=self.every_s, write=self.report)

    @property
    def enabled_line(self) -> bool:
        return self._reporter.mode == "line"

    def message(self) -> str:
        return progress_message(self.done, self.total, self.completion_tokens, time.perf_counter() - self.t0,
                                self.errors, self.limits, self.accepted, self.generated)

    def update(self, row: Row) -> None:
        self.done += 1
        self.records += len(row.records)
        self.generated += sum(len(v) for v in row.candidates.values())
        self.accepted += sum(1 for v in row.candidates.values() for c in v if c.alive)
        if not self.enabled_line:                    # the bar moves per prompt; lines come from the heartbeat
            self._reporter.update(self.done, self.message())

    def tick(self, completion_tokens: int, limits: dict[str, int]) -> None:
        self.completion_tokens, self.limits = completion_tokens, limits
        self._reporter.update(self.done, self.message())

    async def heartbeat(self, env: "RunEnv") -> None:
        """Tick every `every_s` seconds (the bar: every 2 s) until cancelled."""
        if not self.enabled:
            return
        while True:
            await asyncio.sleep(self.every_s if self.enabled_line else 2.0)
            self.tick(env.completion_tokens(), env.endpoint_limits())

    def close(self, env: "RunEnv | None" = None) -> None:
        if env is not None and self.enabled:
            self.completion_tokens, self.limits = env.completion_tokens(), env.endpoint_limits()
            if self.enabled_line:                                        # the closing line
                self._reporter.note(progress_text("prompt", self.done, self.total, self.message()))
            else:
                self._reporter.update(self.done, self.message())
        self._reporter.close()


# ---- the run ------------------------------------------------------------------------------------

@dataclass
class RunResult:
    out_dir: Path
    manifest: SynthRunManifest
    records_path: Path
    n_records: int


def load_generator(spec: str | os.PathLike, overrides: list[str] | None = None) -> GeneratorConfig:
    """A generator by name (synth/generators/<name>.yaml, then synth/domains/<name>.yaml) or path."""
    p = Path(spec)
    if not p.suffix:
        here = Path(__file__).resolve().parent
        for cand in (here / "generators" / f"{spec}.yaml", here / "domains" / f"{spec}.yaml"):
            if cand.is_file():
                p = cand
                break
        else:
            known = sorted(x.stem for d in ("generators", "domains") for x in (here / d).glob("*.yaml"))
            raise ContractError(spec, f"no generator named '{spec}'; built in: {', '.join(known)} (or give a YAML path)")
    cfg = load_config(GeneratorConfig, p, overrides)
    import_plugins(cfg)
    return cfg


def import_plugins(cfg: GeneratorConfig) -> None:
    """Import the config's `imports:` modules, which register its custom sources, steps and
    verifiers; before prompts are loaded, since a generator's source may be one of them."""
    for mod in cfg.imports:
        importlib.import_module(mod)


def build_steps(cfg: GeneratorConfig, env: RunEnv) -> tuple[list[Step], list[PostStep]]:
    import_plugins(cfg)
    steps: list[Step] = []
    posts: list[PostStep] = []
    names: set[str] = set()
    for where, raw_list, registry, out in (("steps", cfg.steps, STEPS, steps), ("post", cfg.post, POST_STEPS, posts)):
        for i, raw in enumerate(raw_list):
            kind = raw.get("kind")
            if kind not in registry:
                raise ValueError(f"{where}[{i}]: unknown kind {kind!r}; registered: {', '.join(sorted(registry))}")
            cls = registry[kind]
            name = raw.get("name") or (f"{kind}:{raw['field']}" if "field" in raw else kind)
            if name in names:
                name = f"{name}#{i}"
            names.add(name)
            out.append(cls(name, cls.parse_config(raw, f"{where}[{i}] '{name}'"), env))  # type: ignore[arg-type]
    return steps, posts


async def _process(row: Row, steps: list[Step]) -> Row:
    for step in steps:
        await step.apply(row)
        if row.dropped:
            break
    return row


def _row_from_fields(index: int, fields: dict[str, Any]) -> Row:
    return Row(index=index, id=str(fields["id"]), fields=dict(fields))


def journal_identity(path: Path) -> str | None:
    """The run identity a journal was written for (None when there is no journal)."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        return json.loads(first).get("config_hash")
    except json.JSONDecodeError:
        return None


def _prompts(cfg: GeneratorConfig, out: Path, chash: str, fresh: bool, restart_if_changed: bool
             ) -> tuple[list[Row], dict[str, Any], list[Row]]:
    """(all rows in source order, source counts, rows still to run) after reading the journal."""
    journal_path = out / "journal.jsonl"
    if restart_if_changed and journal_identity(journal_path) not in (None, chash):
        log.warning("%s holds a run of another config: restarting it (cached answers are reused)", out)
        fresh = True
    if fresh and journal_path.exists():
        journal_path.unlink()
    import_plugins(cfg)
    rows_fields, source_counts = load_rows(cfg.source, cfg.seed, cfg.limit)
    rows = [_row_from_fields(i, f) for i, f in enumerate(rows_fields)]
    done = read_journal(journal_path, chash)
    unknown = set(done) - {r.id for r in rows}
    if unknown and restart_if_changed:
        log.warning("%s: %d finished prompts are not in the source any more: restarting", out, len(unknown))
        journal_path.unlink()
        done, unknown = {}, set()
    if unknown:
        raise ContractError(journal_path, f"{len(unknown)} journaled prompts are not in the source any more "
                            f"(e.g. {sorted(unknown)[0]}); the input changed: use --fresh")
    log.info("generator %s: %d prompts, %d already done, %d to go -> %s",
             cfg.generator, len(rows), len(done), len(rows) - len(done), out)
    return rows, source_counts, [r for r in rows if r.id not in done]


@dataclass
class _Generated:
    errors: list[str]
    n_finished: int
    seconds: float
    stats: dict[str, Any]


async def _generate(cfg: GeneratorConfig, journal: Journal, pending: list[Row], env: RunEnv, steps: list[Step],
                    progress: "bool | ProgressReport", stop_after_rows: int | None) -> _Generated:
    """Run the pending rows through the steps concurrently, journaling each finished one. A prompt
    that fails (retries spent, a request rejected for its content, an open breaker) is counted,
    not journaled; a request rejected before any answer, or too many failures, stops the run."""
    prog = Progress(total=len(pending), enabled=bool(progress), report=progress if callable(progress) else None,
                    every_s=cfg.output.progress_every_s)
    errors: list[str] = []
    fatal: BaseException | None = None
    sem = asyncio.Semaphore(cfg.output.max_inflight_rows)
    n_finished = 0
    t0 = time.perf_counter()

    async def one(row: Row) -> None:
        nonlocal n_finished, fatal
        async with sem:
            if fatal is not None or (stop_after_rows is not None and n_finished >= stop_after_rows):
                return
            try:
                await _process(row, steps)
            except (RowError, CircuitOpenError, RequestRejected) as e:
                if isinstance(e, RequestRejected) and not env.any_answered():
                    fatal = e            # rejected before anything was answered: the config is wrong, stop
                    return
                # this prompt failed for this run: not journaled, so the next run retries it
                errors.append(f"prompt {row.id}: {e}" if not isinstance(e, RowError) else str(e))
                prog.errors += 1
                if cfg.output.max_error_rows is not None and len(errors) > cfg.output.max_error_rows:
                    fatal = RuntimeError(f"{len(errors)} prompts failed for good (max_error_rows="
                                         f"{cfg.output.max_error_rows}); first: {errors[0]}")
                return
            journal.append(row)
            n_finished += 1
            prog.update(row)

    beat = asyncio.create_task(prog.heartbeat(env))
    try:
        tasks = [asyncio.create_task(one(r)) for r in pending]
        while tasks:
            finished, pending_tasks = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for t in finished:
                t.result()
            tasks = list(pending_tasks)
            if fatal is not None:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                break
    finally:
        beat.cancel()
        prog.close(env)
        stats = env.backend_stats()
    if fatal is not None:
        raise fatal
    return _Generated(errors, n_finished, time.perf_counter() - t0, stats)


@dataclass
class _Outputs:
    ordered: list[dict[str, Any]]            # journal entries in prompt order
    records: list[SynthRecord]
    rejects: list[dict[str, Any]]
    removals: list[dict[str, Any]]
    post_summary: dict[str, dict[str, Any]]
    files: list[str]
    complete: bool


def _rebuild(cfg: GeneratorConfig, out: Path, chash: str, rows: list[Row], posts: list[PostStep]) -> _Outputs:
    """The run's files from the journal, sorted by prompt order (deterministic); the post steps and
    the outputs only when every prompt is done."""
    journal_path = out / "journal.jsonl"
    entries = read_journal(journal_path, chash)
    order = {r.id: r.index for r in rows}
    ordered = sorted(entries.values(), key=lambda e: order[e["id"]])
    records = [validate_record(d, journal_path) for e in ordered for d in e["records"]]
    rejects = [rj for e in ordered for rj in e["rejects"]]
    removals: list[dict[str, Any]] = []
    post_summary: dict[str, dict[str, Any]] = {}
    complete = len(entries) == len(rows)
    if not complete:
        return _Outputs(ordered, records, rejects, removals, post_summary, [], False)
    for p in posts:
        n_before = len(records)
        records, removed = p.apply(records)
        removals += removed
        post_summary[p.name] = {"in": n_before, "out": len(records), **getattr(p, "summary", {})}
    atomic.write_text(out / "records.jsonl", "".join(r.to_json_line() for r in records))
    atomic.write_text(out / "rejects.jsonl", "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rejects))
    atomic.write_text(out / "removals.jsonl", "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in removals))
    export_manifest = export_records(records, out / "export", cfg.output.formats)
    files = ["records.jsonl", "rejects.jsonl", "removals.jsonl"] + [f"export/{f}" for f in export_manifest["files"]]
    return _Outputs(ordered, records, rejects, removals, post_summary, files, True)


def tally(entries: list[dict[str, Any]], steps: list[Step]) -> tuple[dict[str, dict[str, Any]], dict[str, int], dict[str, int]]:
    """(per-step in/out/acceptance, token usage, prompts dropped per step) over journal entries."""
    step_counts: dict[str, dict[str, Any]] = {s.name: {"kind": s.kind, "in": 0, "out": 0} for s in steps}
    usage = {"requests": 0, "cached": 0, "prompt_tokens": 0, "completion_tokens": 0}
    n_dropped: dict[str, int] = {}
    for e in entries:
        for name, (a, b) in e["step_counts"].items():
            sc = step_counts.setdefault(name, {"kind": "?", "in": 0, "out": 0})
            sc["in"] += a
            sc["out"] += b
        for k in usage:
            usage[k] += e["usage"].get(k, 0)
        if e["dropped"]:
            step = e["dropped"].split(":", 1)[0]
            n_dropped[step] = n_dropped.get(step, 0) + 1
    for sc in step_counts.values():
        sc["acceptance"] = round(sc["out"] / sc["in"], 4) if sc["in"] else None
    return step_counts, usage, n_dropped


async def run_async(cfg: GeneratorConfig, out_dir: str | os.PathLike, *, fresh: bool = False,
                    restart_if_changed: bool = False, progress: "bool | ProgressReport" = True, llm_factory: Any = None,
                    stop_after_rows: int | None = None, clock: Clock | None = None) -> RunResult:
    """Run (or resume) `cfg` into `out_dir`. `fresh` forgets finished prompts; `restart_if_changed`
    does so only when the directory holds a run of another config (a pipeline stage that reruns
    after its config changed), instead of refusing. The request cache is kept either way."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic.clean_stale_tmp(out)
    cfg_dump = cfg.model_dump(mode="json")
    chash = run_identity(cfg_dump)
    t_start = time.perf_counter()
    rows, source_counts, pending = _prompts(cfg, out, chash, fresh, restart_if_changed)
    cache = ResponseCache(out / "cache.sqlite")
    env = RunEnv(cfg, cache, llm_factory=llm_factory, clock=clock)
    steps, posts = build_steps(cfg, env)
    journal = Journal(out / "journal.jsonl", chash)
    try:
        gen = await _generate(cfg, journal, pending, env, steps, progress, stop_after_rows)
    finally:
        journal.close()
        cache.close()
        await env.close()
        for step in steps:
            step.close()
    outputs = _rebuild(cfg, out, chash, rows, posts)
    step_counts, usage, n_dropped = tally(outputs.ordered, steps)
    records = outputs.records
    by_kind: dict[str, int] = {}
    for r in records:
        by_kind[r.kind] = by_kind.get(r.kind, 0) + 1
    gen_s = gen.seconds
    live_completion = sum(s.get("completion_tokens", 0) for s in gen.stats.values())
    pending_ids = {r.id for r in pending}
    new_records = sum(len(e["records"]) for e in outputs.ordered if e["id"] in pending_ids)
    manifest = SynthRunManifest(
        job=f"synth {cfg.generator}", generator=cfg.generator, status="complete" if outputs.complete else "partial",
        config=cfg_dump, config_hash=config_hash(cfg_dump), run_identity=chash,
        teachers={k: v.describe() for k, v in cfg.teachers.items()},
        steps=step_counts, post=outputs.post_summary,
        counts={"prompts": len(rows), "prompts_done": len(outputs.ordered), "prompts_dropped": n_dropped,
                "records": len(records), "records_by_kind": by_kind, "rejects": len(outputs.rejects),
                "removed_by_post": len(outputs.removals), "strict_pairs": sum(1 for r in records if r.pair_role == "on"),
                **source_counts},
        usage={**usage, "this_run": gen.stats},
        throughput={"wall_s": round(time.perf_counter() - t_start, 3), "generate_s": round(gen_s, 3),
                    "prompts_per_s": round(gen.n_finished / gen_s, 3) if gen_s > 0 else 0.0,
                    "records_per_s": round(new_records / gen_s, 3) if gen_s > 0 else 0.0,
                    "completion_tokens_per_s": round(live_completion / gen_s, 3) if gen_s > 0 else 0.0},
        errors={"prompts_failed": len(gen.errors), "examples": gen.errors[:5]},
        outputs=outputs.files, sandbox=isolation_status(),
    )
    if outputs.complete:
        manifest.write(out)
    else:
        atomic.write_json(out / "manifest.partial.json", manifest.to_json_dict())
    return RunResult(out, manifest, out / "records.jsonl", len(records))


def run(cfg: GeneratorConfig, out_dir: str | os.PathLike, **kw: Any) -> RunResult:
    return asyncio.run(run_async(cfg, out_dir, **kw))


def apply_teacher_overrides(cfg: GeneratorConfig, endpoints: list[str] | None, model: str | None,
                            backend: str | None, roles: list[str] | None = None) -> GeneratorConfig:
    """`--endpoint/--model/--backend` apply to every teacher (or the listed roles): the usual case
    of one model serving every role."""
    if not (endpoints or model or backend):
        return cfg
    teachers = {}
    for role, t in cfg.teachers.items():
        if roles and role not in roles:
            teachers[role] = t
            continue
        upd: dict[str, Any] = {}
        if endpoints:
            upd["endpoints"] = list(endpoints)
        if model:
            upd["model"] = model
        if backend:
            upd["backend"] = backend
        teachers[role] = TeacherConfig.model_validate({**t.model_dump(), **upd})
    return cfg.model_copy(update={"teachers": teachers})
