"""`python -m proxy_eval run`: proxy continuation runs over the planned slices (Puro §3.6).

Every slice continues training the *same* base checkpoint with the *same* schedule (trainer), on a
uniform shard set made from the slice (mixtures), and is then scored by the benchmark suite; the
score vector is the slice's capability profile.

    <out>/base/                    the fixed base: checkpoint (given, or trained once here) + its scores
    <out>/slices/<slice>/shards/   the slice as a uniform shard set (mixtures.materialize_slice)
    <out>/slices/<slice>/train/    the continuation run (trainer; resumes itself after a kill)
    <out>/slices/<slice>/eval/     results.json + samples/<task>.jsonl
    <out>/slices/<slice>/manifest.json   SliceRunManifest: written last; its presence = slice done
    <out>/profile/                 profile.parquet / profile.csv / groups.csv / ranks.csv
    <out>/manifest.json            ProxyRunManifest for the whole run

Resumable at two levels: a slice with a complete manifest for the same configuration and inputs is
never rerun; an unfinished slice reuses its finished shard set and resumes its training from the
trainer's last checkpoint. With several GPUs, slices run in parallel, one per GPU (a worker
subprocess per slice with `CUDA_VISIBLE_DEVICES` set); on CPU they run one after another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from pydantic import Field, model_validator

from purokit import atomic
from purokit.component import Component
from purokit.config import StrictModel, deep_merge, load_yaml, validate
from purokit.errors import ContractError
from purokit.hashing import config_hash
from purokit.log import get_logger
from purokit.manifest import MANIFEST_NAME, RunManifest, find_complete, fingerprints
from mixtures import ShardSet
from mixtures.materialize import materialize, materialize_slice
from mixtures.spec import ComponentSpec, MixtureSpec, PhaseShare, PhaseSpec, RetainAll, Seeds
from mixtures.tokenizers import load_tokenizer
from proxy_eval.contracts import BaseResults, BaseSample, RunKey
from proxy_eval.evaluate import SuiteResult, evaluate_suite, load_suite
from proxy_eval.loading import open_scorer
from proxy_eval.plan import SlicePlan, read_id_list, sample_component
from proxy_eval.profiles import build_profile
from proxy_eval.tasks import SuiteConfig
from trainer import checkpoint as ckpt
from trainer.config import RunConfig, load_run_config
from trainer import train as trainer_train

log = get_logger(__name__)


class BaseSection(StrictModel):
    """The fixed base checkpoint: an existing trainer checkpoint, or one trained once here from a
    uniform mixture of `components` (natural token proportions)."""

    checkpoint: str | None = None
    components: list[str] = Field(default_factory=list)
    # train on a seeded sample of this many tokens per component, disjoint from every planned slice
    # and from the plan's excluded (eval) documents, instead of on whole components: the base has not
    # seen the data the proxies measure, and only the sample is tokenized
    sample_tokens: int | None = Field(None, gt=0)
    steps: int = Field(50, gt=0)
    global_batch: int = Field(8, gt=0)
    micro_batch: int = Field(8, gt=0)
    trainer: dict[str, Any] = Field(default_factory=dict)   # extra trainer RunConfig fields (model, schedule, optim, ...)

    @model_validator(mode="after")
    def _one(self) -> "BaseSection":
        if self.checkpoint is None and not self.components:
            raise ValueError("base needs a checkpoint or components to train one from")
        return self


class ContinuationSection(StrictModel):
    """The one schedule every slice gets. steps 'auto': as many as the smallest slice allows in one
    pass (no slice is repeated), capped by max_steps. `repeat: true` lets a slice smaller than
    `steps` x tokens per step be read for more than one epoch (toy corpora; the paper's 4B-token
    slices are read once)."""

    steps: int | Literal["auto"] = "auto"
    max_steps: int | None = Field(None, gt=0)
    repeat: bool = False
    global_batch: int = Field(8, gt=0)
    micro_batch: int = Field(8, gt=0)
    trainer: dict[str, Any] = Field(default_factory=dict)   # schedule, optim, precision, model overrides: identical for all

    @model_validator(mode="after")
    def _steps(self) -> "ContinuationSection":
        if self.repeat and self.steps == "auto":
            raise ValueError("repeat: true needs a fixed number of steps (auto means one pass of the smallest slice)")
        return self


class ProxyRunConfig(StrictModel):
    out: str = "runs/proxy/run"
    plan: str                                     # a `proxy_eval plan` output directory
    tokenizer: dict[str, Any] | str               # mixtures tokenizer block (or a tokenizer.json path)
    seq_len: int = Field(256, gt=0)
    seed: int = 0
    base: BaseSection
    continuation: ContinuationSection = Field(default_factory=ContinuationSection)
    suite: SuiteConfig | str                      # inline, or a YAML path
    eval_batch_size: int | None = None
    slices: list[str] | None = None               # a subset of the plan's slices (default: all)
    parallel: int | Literal["auto"] = "auto"      # concurrent slices: auto = one per GPU, 1 on CPU
    evaluate_base: bool = True
    device: str = "auto"

    def tokenizer_spec(self) -> dict[str, Any]:
        return {"kind": "hf", "path": self.tokenizer} if isinstance(self.tokenizer, str) else dict(self.tokenizer)

    def suite_config(self) -> SuiteConfig:
        if isinstance(self.suite, SuiteConfig):
            return self.suite
        return validate(SuiteConfig, load_yaml(self.suite), self.suite)


class SliceRunManifest(RunManifest):
    SCHEMA = "proxy_eval.slice_run/1"
    slice: str
    component: str
    shard_set: str
    checkpoint: str
    n_train_tokens: int
    results: list[dict[str, Any]]                 # per task: metric, value, stderr, n, group


class ProxyRunManifest(RunManifest):
    SCHEMA = "proxy_eval.run/1"
    base_checkpoint: str
    steps: int
    slices: list[dict[str, Any]]
    profile: dict[str, str] = Field(default_factory=dict)


# ---- pure helpers ------------------------------------------------------------------------------

def single_component_spec(name: str, components: dict[str, str], tokenizer: dict[str, Any], seq_len: int,
                          seed: int, phase: str) -> MixtureSpec:
    """A `mixture/1` spec: the given components with everything retained, in natural token
    proportions, one uniform (seeded global shuffle) phase."""
    return MixtureSpec(
        name=name, tokenizer=tokenizer, seq_len=seq_len, seeds=Seeds(uniform=seed, bucket_shuffle=seed, budget=seed),
        components=[ComponentSpec(name=c, path=str(p), retention=RetainAll(), order_seed=seed)
                    for c, p in components.items()],
        phases=[PhaseSpec(name=phase, orders=["uniform"], components={c: PhaseShare() for c in components})])


def auto_steps(n_tokens: dict[str, int], tokens_per_step: int, max_steps: int | None) -> int:
    """Steps every slice can take in one pass: the smallest slice decides (a window needs one token
    more than its length)."""
    smallest = min(n_tokens.values())
    steps = (smallest - 1) // tokens_per_step
    if max_steps is not None:
        steps = min(steps, max_steps)
    if steps < 1:
        raise ContractError("<slices>", f"the smallest slice has {smallest} tokens, fewer than one step of "
                            f"{tokens_per_step}; lower continuation.global_batch or seq_len, or plan larger slices")
    return steps


def resolve_parallel(parallel: int | str, n_gpus: int) -> int:
    if parallel == "auto":
        return max(1, n_gpus)
    return max(1, int(parallel))


# ---- the shell --------------------------------------------------------------------------------

def materialize_shards(spec: MixtureSpec, out_dir: Path, progress: Callable[[str], None]) -> Path:
    """Uniform shard set of a spec (reused when complete for the same spec and inputs)."""
    results = materialize(spec, out_dir, progress=progress)
    (name,) = results
    return out_dir / name


def trainer_config(run_dir: Path, shards: Path, steps: int, global_batch: int, micro_batch: int, seed: int,
                   extra: dict[str, Any], tokenizer: dict[str, Any], init_from: str | None, device: str) -> RunConfig:
    """The trainer's RunConfig for a base or continuation run: these fields, then `extra` (the
    config's `trainer:` section) merged over them with the trainer's own deep merge."""
    data: dict[str, Any] = {
        "run_dir": str(run_dir), "seed": seed, "device": device,
        "data": {"train": str(shards)},
        "train": {"steps": steps, "global_batch": global_batch, "micro_batch": micro_batch},
        "checkpoint": {"every_steps": 0, "at_end": True, "keep_last": 1},
        "eval": {"every_steps": 0, "at_end": False},
        "log": {"progress": "none"},
    }
    if tokenizer.get("path"):
        data["data"]["tokenizer"] = tokenizer["path"]
    if init_from is not None:
        data["init_from"] = {"path": init_from, "load_optimizer": False, "reset_step": True}
    return load_run_config(None, data=deep_merge(data, extra))


RUN_KEY = "proxy-run-key.json"


def claim_run_dir(run_dir: Path, key: str, progress: Callable[[str], None]) -> None:
    """Make `run_dir` a trainer run directory for exactly this configuration and data: a directory
    left by another configuration (or by an older version, without a key) is removed, so the
    trainer never resumes a run of different data or settings; one with the same key is resumed."""
    marker = run_dir / RUN_KEY
    if run_dir.exists():
        found = RunKey.read_current(marker)
        if found is not None and found.key == key:
            return
        progress(f"{run_dir}: made for another configuration or data; starting it again")
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    RunKey(key=key).write(marker)


class ProxyRunner:
    """Runs (or resumes) one proxy experiment described by a `ProxyRunConfig`."""

    def __init__(self, config: ProxyRunConfig, progress: Callable[[str], None] | None = None):
        self.config = config
        self.out = Path(config.out)
        self.progress = progress or (lambda m: log.info(m))
        self.plan_dir = Path(config.plan)
        self.plan = SlicePlan.load(self.plan_dir)
        self.suite = config.suite_config()
        self.tokenizer = config.tokenizer_spec()
        names = [s.name for s in self.plan.slices]
        wanted = config.slices or names
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            raise ContractError(self.plan_dir / MANIFEST_NAME, f"unknown slices {unknown}; planned: {names}",
                                field="slices")
        self.slices = [s for s in self.plan.slices if s.name in set(wanted)]

    # -- base --
    def base_checkpoint(self) -> Path:
        b = self.config.base
        if b.checkpoint is not None:
            return ckpt.resolve_checkpoint(b.checkpoint)
        base_dir = self.out / "base"
        comps = {Component.open(p).name: p for p in b.components}
        if b.sample_tokens is not None:
            comps = self.base_samples(comps, b.sample_tokens)
        spec = single_component_spec("proxy-base", comps, self.tokenizer, self.config.seq_len, self.config.seed, "base")
        self.progress(f"base: shard set from {len(comps)} component(s)")
        shards = materialize_shards(spec, base_dir / "shards", self.progress)
        run_dir = base_dir / "train"
        key = config_hash({"base": b.model_dump(mode="json"), "seq_len": self.config.seq_len, "seed": self.config.seed,
                           "tokenizer": self.tokenizer, "data": ShardSet.open(shards).manifest.set_digest})
        claim_run_dir(run_dir, key, self.progress)
        done = ckpt.latest_checkpoint(run_dir / "checkpoints")
        if done is not None and ckpt.read_state(done).step >= b.steps:
            return done
        self.progress(f"base: training {b.steps} steps")
        cfg = trainer_config(run_dir, shards, b.steps, b.global_batch, b.micro_batch, self.config.seed,
                             deep_merge({"data": {"loop": True}}, b.trainer), self.tokenizer, None, self.config.device)
        trainer_train.train(cfg)
        return ckpt.resolve_checkpoint(run_dir)

    def base_samples(self, comps: dict[str, str], budget: int) -> dict[str, str]:
        """Per component, a seeded sample disjoint from the plan's slices and excluded documents
        (written once; reused while the plan is the same)."""
        root = self.out / "base" / "sample"
        key = config_hash({"plan": self.plan.config_hash, "budget": budget, "seed": self.config.seed,
                           "components": comps, "tokenizer": self.tokenizer})
        marker = root / "sample.json"
        out = {name: str(root / name) for name in comps}
        found = BaseSample.read_current(marker)
        if found is not None and found.key == key:
            return out
        exclude: set[str] = set()
        for s in self.plan.slices:
            if s.path:
                d = self.plan.slice_dir(self.plan_dir, s.name)
                exclude |= {str(x) for x in Component.open(d).read(columns=["id"]).column("id").to_pylist()}
        if self.plan.config.get("exclude_ids"):
            exclude |= read_id_list(self.plan.config["exclude_ids"])
        tok = load_tokenizer(self.tokenizer)
        for name, path in comps.items():
            sample_component(Component.open(path), budget, root / name, self.config.seed, exclude, tok, name=name)
        BaseSample(key=key, budget_tokens=budget, excluded_docs=len(exclude)).write(marker)
        self.progress(f"base: samples of {budget:,} tokens from {len(comps)} component(s), "
                      f"disjoint from {len(exclude):,} slice/eval documents")
        return out

    # -- slices --
    def slice_dir(self, name: str) -> Path:
        return self.out / "slices" / name

    def materialize_slice(self, name: str) -> Path:
        """The slice component as a uniformly ordered shard set (mixtures.materialize_slice; reused
        when complete for the same spec and inputs)."""
        out = self.slice_dir(name) / "shards"
        materialize_slice(self.plan.slice_dir(self.plan_dir, name), out, tokenizer=self.tokenizer,
                          seq_len=self.config.seq_len, seed=self.config.seed, progress=self.progress)
        return out

    def slice_config(self, name: str, base: Path, steps: int) -> dict[str, Any]:
        """Everything that determines a slice's result (its hash decides reuse)."""
        c = self.config
        return {"slice": name, "base_checkpoint": str(base), "steps": steps, "seq_len": c.seq_len, "seed": c.seed,
                "tokenizer": self.tokenizer, "continuation": c.continuation.model_dump(mode="json"),
                "suite": self.suite.model_dump(mode="json"), "eval_batch_size": c.eval_batch_size}

    def slice_inputs(self, name: str, base: Path) -> list:
        return fingerprints([self.plan.slice_dir(self.plan_dir, name) / MANIFEST_NAME, base / "state.json"])

    def finished(self, name: str, base: Path, steps: int) -> SliceRunManifest | None:
        return find_complete(self.slice_dir(name), SliceRunManifest, self.slice_config(name, base, steps),
                             self.slice_inputs(name, base))

    def run_slice(self, name: str, base: Path, steps: int) -> SliceRunManifest:
        """Train and evaluate one slice (resuming whatever part is done)."""
        done = self.finished(name, base, steps)
        if done is not None:
            self.progress(f"{name}: finished before, reused")
            return done
        t0 = time.perf_counter()
        d = self.slice_dir(name)
        shards = self.materialize_slice(name)
        cont = self.config.continuation
        run_dir = d / "train"
        key = config_hash({"config": self.slice_config(name, base, steps),
                           "inputs": [(i.path, i.digest) for i in self.slice_inputs(name, base)]})
        claim_run_dir(run_dir, key, self.progress)
        last = ckpt.latest_checkpoint(run_dir / "checkpoints")
        if last is None or ckpt.read_state(last).step < steps:
            self.progress(f"{name}: continuing the base for {steps} steps")
            extra = deep_merge({"data": {"loop": True}}, cont.trainer) if cont.repeat else cont.trainer
            cfg = trainer_config(run_dir, shards, steps, cont.global_batch, cont.micro_batch, self.config.seed,
                                 extra, self.tokenizer, str(base), self.config.device)
            trainer_train.train(cfg)
            last = ckpt.latest_checkpoint(run_dir / "checkpoints")
        t_train = time.perf_counter() - t0
        self.progress(f"{name}: evaluating")
        result = self.evaluate(last, name, d / "eval")
        n_tokens = ShardSet.open(shards).manifest.n_tokens
        plan_slice = next(s for s in self.slices if s.name == name)
        manifest = SliceRunManifest(
            job="proxy_eval.run.slice", config=self.slice_config(name, base, steps), inputs=self.slice_inputs(name, base),
            counts={"steps": steps, "n_tasks": len(result.results),
                    "epochs": round(steps * cont.global_batch * self.config.seq_len / max(1, int(n_tokens)), 4)},
            timings_s={"train": round(t_train, 3), "total": round(time.perf_counter() - t0, 3)},
            outputs=["eval/results.json"], slice=name, component=plan_slice.component, shard_set=str(shards),
            checkpoint=str(last), n_train_tokens=int(n_tokens), results=result.rows())
        manifest.write(d)
        return manifest

    def evaluate(self, checkpoint: Path, name: str, out: Path) -> SuiteResult:
        device = "cuda" if self.config.device in ("auto", "cuda") and _cuda_count() > 0 else "cpu"
        scorer = open_scorer(checkpoint, tokenizer=self.tokenizer, device=device, name=name,
                             max_length=self.suite.max_length)
        result = evaluate_suite(scorer, self.suite, tasks=self._tasks(), batch_size=self.config.eval_batch_size)
        result.write(out)
        return result

    def _tasks(self):
        if not hasattr(self, "_loaded"):
            self._loaded = load_suite(self.suite)
        return self._loaded

    def base_results(self, base: Path) -> list[dict[str, Any]]:
        path = self.out / "base" / "eval" / "results.json"
        key = config_hash({"base": [(i.path, i.digest) for i in fingerprints([base / "state.json", base / "model.safetensors"])],
                           "suite": self.suite.model_dump(mode="json"), "eval_batch_size": self.config.eval_batch_size})
        found = BaseResults.read_current(path)
        if found is not None and found.key == key:
            return found.rows
        self.progress("base: evaluating the base checkpoint")
        result = self.evaluate(base, "base", self.out / "base" / "eval" / "suite")
        rows = result.rows()
        BaseResults(key=key, rows=rows).write(path)
        return rows

    # -- the whole run --
    def steps_for(self, shard_sets: dict[str, Path]) -> int:
        cont = self.config.continuation
        if cont.steps != "auto":
            return int(cont.steps)
        n = {k: ShardSet.open(p).manifest.n_tokens for k, p in shard_sets.items()}
        return auto_steps(n, cont.global_batch * self.config.seq_len, cont.max_steps)

    def run(self) -> ProxyRunManifest:
        t0 = time.perf_counter()
        self.out.mkdir(parents=True, exist_ok=True)
        base = self.base_checkpoint()
        shard_sets = {}
        for s in self.slices:
            self.progress(f"{s.name}: shard set")
            shard_sets[s.name] = self.materialize_slice(s.name)
        steps = self.steps_for(shard_sets)
        n_workers = resolve_parallel(self.config.parallel, _cuda_count())
        todo = [s.name for s in self.slices if self.finished(s.name, base, steps) is None]
        self.progress(f"{len(self.slices)} slice(s), {len(self.slices) - len(todo)} finished before, "
                      f"{steps} steps each, {n_workers} at a time")
        if n_workers > 1 and len(todo) > 1:
            run_in_workers(self.config, todo, n_workers, steps, self.progress)
        else:
            for name in todo:
                self.run_slice(name, base, steps)
        rows = []
        summaries = []
        for s in self.slices:
            m = self.finished(s.name, base, steps)
            if m is None:
                raise RuntimeError(f"slice {s.name} did not finish (see {self.slice_dir(s.name)})")
            rows += [{**r, "slice": s.name} for r in m.results]
            summaries.append({"slice": s.name, "component": s.component, "kind": s.kind, "percentile": s.percentile,
                              "n_train_tokens": m.n_train_tokens, "checkpoint": m.checkpoint,
                              "results": f"slices/{s.name}/eval/results.json"})
        if self.config.evaluate_base:
            rows += [{**r, "slice": "base"} for r in self.base_results(base)]
        profile = build_profile(rows, {t.name: self.suite.group_of(t.name) for t in self.suite.tasks})
        paths = profile.write(self.out / "profile")
        manifest = ProxyRunManifest(
            job="proxy_eval.run", config=self.config.model_dump(mode="json"),
            inputs=fingerprints([self.plan_dir / MANIFEST_NAME, base / "state.json"]),
            counts={"slices": len(self.slices), "rerun": len(todo), "steps": steps},
            timings_s={"total": round(time.perf_counter() - t0, 3)}, outputs=list(paths.values()),
            base_checkpoint=str(base), steps=steps, slices=summaries,
            profile={k: str(Path(v).relative_to(self.out)) for k, v in paths.items()})
        manifest.write(self.out)
        return manifest


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def run_in_workers(config: ProxyRunConfig, names: list[str], n_workers: int, steps: int,
                   progress: Callable[[str], None]) -> None:
    """One subprocess per slice, `n_workers` at a time, each pinned to one GPU."""
    out = Path(config.out)
    cfg_path = out / "run-config.json"
    atomic.write_json(cfg_path, config.model_dump(mode="json"))
    free = list(range(n_workers))
    lock = threading.Lock()

    def work(name: str) -> int:
        with lock:
            gpu = free.pop(0)
        try:
            env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
            log_path = out / "slices" / name / "worker.log"
            log_path.parent.mkdir(parents=True, exist_ok=True)
            progress(f"{name}: worker on GPU {gpu}")
            with open(log_path, "ab") as fh:
                rc = subprocess.call([sys.executable, "-m", "proxy_eval", "run-slice", "--config", str(cfg_path),
                                      "--slice", name, "--steps", str(steps)], env=env, stdout=fh,
                                     stderr=subprocess.STDOUT)
            if rc != 0:
                progress(f"{name}: worker failed (exit {rc}); see {log_path}")
            return rc
        finally:
            with lock:
                free.append(gpu)

    with ThreadPoolExecutor(max_workers=n_workers) as pool:
        codes = list(pool.map(work, names))
    failed = [n for n, rc in zip(names, codes) if rc != 0]
    if failed:
        raise RuntimeError(f"slice workers failed: {failed}")


def run_one_slice(config: ProxyRunConfig, name: str, steps: int | None = None) -> SliceRunManifest:
    """The worker's entry point (`python -m proxy_eval run-slice`); `steps` as resolved by the parent."""
    runner = ProxyRunner(config)
    base = runner.base_checkpoint()
    if steps is None:
        steps = runner.steps_for({s.name: runner.materialize_slice(s.name) for s in runner.slices})
    return runner.run_slice(name, base, steps)
