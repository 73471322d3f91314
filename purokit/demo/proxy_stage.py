"""Demo stage "proxy": what each data slice is worth, measured with tiny proxy runs (Puro §3.6).

1. Benchmarks from the demo's own data: a few held-out documents per source (the corpus stage's
   eval sets, which no component contains) become bits-per-byte tasks (General / Code / Math by
   source), and held-out math problems become a multiple-choice task over their final numeric
   answers (scored by the gold answer's probability, a likelihood metric fit for tiny proxies).
   Held-out documents are excluded from every slice.
2. A slice plan by Puro's rules, scaled to the demo: quantile slices q00..q75 (from the best end)
   of the scored source, one random slice of each other source.
3. A tiny base model trained briefly on all sources (reused on a rerun), then one continuation per
   slice with the same schedule, each scored by the suite.
4. The profile table, a PCA biplot of the group scores, the within-source threshold and a
   mixture-spec draft.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from purokit.component import Component
from purokit.document import score_columns
from purokit.demo.context import component_dirs, find_tokenizer  # noqa: F401  (find_tokenizer: re-exported)

DOMAIN_GROUPS = (("code", "Code"), ("math", "Math"))
_LAST_NUMBER = re.compile(r"(-?\d[\d,]*(?:\.\d+)?)(?!.*\d)", re.S)


# ---- finding earlier stages' outputs -----------------------------------------------------------

find_components = component_dirs           # the name the tests and older callers use


def domain_group(name: str) -> str:
    low = name.lower()
    for key, group in DOMAIN_GROUPS:
        if key in low:
            return group
    return "General"


# ---- benchmark tasks from the demo's data ------------------------------------------------------

def arithmetic_mc(text: str, n_choices: int = 4) -> dict[str, Any] | None:
    """A multiple-choice item from a math text ending in a number: the text before the last number is
    the query, the number the gold answer, nearby numbers the distractors (seeded by the text)."""
    m = _LAST_NUMBER.search(text)
    if not m or m.start() < 20:
        return None
    raw = m.group(1).replace(",", "")
    try:
        gold = float(raw)
    except ValueError:
        return None
    query = text[:m.start()]
    is_int = gold == int(gold) and "." not in raw
    fmt = (lambda x: str(int(x))) if is_int else (lambda x: f"{x:g}")
    cands = [gold + 1, gold - 1, gold + 10, gold * 2, gold - 10, gold + 2]
    distractors: list[str] = []
    for c in cands:
        s = fmt(c)
        if s == fmt(gold) or s in distractors or (c < 0 <= gold):
            continue
        distractors.append(s)
        if len(distractors) == n_choices - 1:
            break
    if len(distractors) < n_choices - 1:
        return None
    choices = distractors + [fmt(gold)]
    rng = np.random.default_rng(abs(hash_text(text)) % (2 ** 32))
    order = rng.permutation(len(choices))
    choices = [choices[i] for i in order]
    return {"query": query, "choices": choices, "gold": int(np.flatnonzero(order == len(choices) - 1)[0])}


def hash_text(text: str) -> int:
    import hashlib

    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little", signed=True)


def _eval_documents(path: str | Path) -> list[dict[str, Any]]:
    from proxy_eval.tasks import DataSource, read_records

    return [r for r in read_records(DataSource(path=str(path))) if isinstance(r.get("text"), str)]


def build_suite(components: dict[str, Path], out: Path, n_docs: int, seed: int, max_chars: int,
                eval_sources: dict[str, str] | None = None) -> tuple[Any, Path]:
    """Benchmark tasks per source: bits per byte on held-out text (General / Code / Math by source
    name) and, for math, multiple choice over the final answers. Documents come from the corpus
    stage's held-out eval files when it wrote them (never in any component), else they are held out
    of the components here; the ids returned are left out of every slice."""
    from proxy_eval.slices import doc_hash_keys
    from proxy_eval.tasks import DataSource, SuiteConfig, TaskConfig

    out.mkdir(parents=True, exist_ok=True)
    tasks: list[Any] = []
    held_ids: set[str] = set()
    for name, path in sorted(components.items()):
        records = []
        limit = n_docs
        if eval_sources and name in eval_sources:
            records = [r for r in _eval_documents(eval_sources[name]) if len(r["text"].strip()) >= 40]
        if len(records) < max(2, n_docs // 2):       # too few held out upstream: hold some out here
            table = Component.open(path).read(columns=["id", "text"])
            records = [{"id": str(i), "text": t or ""} for i, t in zip(table.column("id").to_pylist(),
                                                                      table.column("text").to_pylist())]
            records = [r for r in records if len(r["text"].strip()) >= 40]
            limit = min(n_docs, max(1, len(records) // 10))      # never more than a tenth of a source
        keys = doc_hash_keys([str(r.get("id", i)) for i, r in enumerate(records)], seed, salt=f"eval:{name}")
        order = [int(i) for i in np.argsort(keys, kind="stable")]
        picked = order[:limit]
        if not picked:
            continue
        held_ids.update(str(records[i].get("id")) for i in picked)
        text_file = out / f"{name}_text.jsonl"
        text_file.write_text("".join(json.dumps({"text": records[i]["text"][:max_chars]}) + "\n" for i in picked))
        tasks.append(TaskConfig(name=f"{name}_bpb", format="bits_per_byte", preset="text", group=domain_group(name),
                                source=DataSource(path=str(text_file))))
        if domain_group(name) == "Math":
            more = order[:limit * 2]
            items = [x for x in (arithmetic_mc(records[i]["text"][:max_chars]) for i in more) if x]
            if len(items) >= 4:
                held_ids.update(str(records[i].get("id")) for i in more)
                mc_file = out / f"{name}_answers.jsonl"
                mc_file.write_text("".join(json.dumps(x) + "\n" for x in items))
                tasks.append(TaskConfig(name=f"{name}_answer", format="multiple_choice", group="Math",
                                        source=DataSource(path=str(mc_file)), template="{query}", forms=["cloze"],
                                        primary="prob_correct"))
    ids_file = out / "heldout_ids.txt"
    ids_file.write_text("\n".join(sorted(held_ids)) + "\n")
    return SuiteConfig(name="demo-proxy", tasks=tasks, batch_size=8), ids_file


def _score_field(path: Path) -> str:
    """The score to slice by: the component's `quality.*` column (the first, by name, if several)."""
    return sorted(score_columns(Component.open(path).columns))[0]


def write_yaml(path: Path, data: dict[str, Any]) -> None:
    import yaml

    from purokit import atomic

    atomic.write_text(path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def component_tokens(path: Path, tokenizer: Any, sample_docs: int = 200) -> int:
    """Tokens of a component: its `n_tokens` column, else an estimate from a seeded sample of
    documents (tokens per byte) times its bytes. Only the rule thresholds use it; the plan counts
    exactly, and slices are sized exactly."""
    comp = Component.open(path)
    if "n_tokens" in comp.columns:
        return int(sum(x or 0 for x in comp.read(columns=["n_tokens"]).column("n_tokens").to_pylist()))
    texts = [t or "" for t in comp.read(columns=["text"]).column("text").to_pylist()]
    n_bytes = [len(t.encode("utf-8")) for t in texts]
    rng = np.random.default_rng(0)
    pick = rng.choice(len(texts), size=min(sample_docs, len(texts)), replace=False)
    s_bytes = sum(n_bytes[i] for i in pick)
    s_tokens = sum(len(x) for x in tokenizer.encode_batch([texts[i] for i in pick]))
    return int(round(sum(n_bytes) * s_tokens / max(1, s_bytes)))


# ---- the stage ---------------------------------------------------------------------------------

def run(ctx) -> dict[str, Any]:
    import torch

    from mixtures.tokenizers import load_tokenizer
    from proxy_eval.decide import suggest_from_plan
    from proxy_eval.pca import biplot, capability_pca
    from proxy_eval.plan import ComponentRef, PlanConfig, make_plan
    from proxy_eval.profiles import read_profile
    from proxy_eval.run import ProxyRunConfig, ProxyRunner
    from proxy_eval.slices import SliceRules
    from purokit import atomic

    torch.set_num_threads(int(ctx.size("proxy_threads", 1)))
    out = ctx.stage_dir()
    components = find_components(ctx.result("kaiyuan"))
    if not components:
        raise RuntimeError("the kaiyuan stage's result names no components")
    tok_path = find_tokenizer(ctx.result("tokenizer"))
    tokenizer = load_tokenizer({"kind": "hf", "path": str(tok_path)})
    tok_spec = {"kind": "hf", "path": str(tok_path)}
    seed = int(ctx.size("proxy_seed", 0))

    ctx.step(f"benchmarks from held-out documents of {len(components)} sources"
             + (" (the corpus stage's eval sets)" if (ctx.results.get("corpus") or {}).get("eval") else ""))
    eval_sources = (ctx.results.get("corpus") or {}).get("eval") or None
    suite, held_ids = build_suite(components, out / "benchmarks", int(ctx.size("proxy_eval_docs", 24)), seed,
                                  int(ctx.size("proxy_eval_chars", 1500)), eval_sources=eval_sources)
    ctx.step("tasks: " + ", ".join(f"{t.name} ({t.group})" for t in suite.tasks))
    # every configuration is also written as the YAML a user would pass to `python -m proxy_eval ...`
    write_yaml(out / "suite.yaml", suite.model_dump(mode="json", exclude_defaults=True))

    scored = {n: p for n, p in components.items() if score_columns(Component.open(p).columns)}
    if not scored:
        raise RuntimeError("no demo source has a quality.<name> score: nothing to take quantile slices of")
    sizes = {n: component_tokens(p, tokenizer) for n, p in components.items()}
    main_source = max(scored, key=lambda n: sizes[n])
    total = sizes[main_source]
    slice_tokens = max(1, total // int(ctx.size("proxy_slice_fraction_inv", 10)))
    # Puro's rules scaled to the demo: the scored source qualifies for quantile slices (4B of >50B in
    # the paper; here a tenth of it), any other source of at least half a slice gets a random slice
    # (in the paper, 5B for a 4B slice), smaller ones none
    rules = SliceRules(slice_tokens=slice_tokens, quantile_min_tokens=total // 2,
                       random_min_tokens=max(1, slice_tokens // 2), seed=seed)
    # quantile slices for the largest scored source only (keeps the demo to 4 + one per other source)
    refs = [ComponentRef(path=str(p), score_field=_score_field(p) if n == main_source else None)
            for n, p in sorted(components.items())]
    ctx.step(f"slice plan: quantile slices of '{main_source}' ({total:,} tokens), {slice_tokens:,} tokens per slice")
    plan_cfg = PlanConfig(components=refs, rules=rules, out=str(out / "plan"), exclude_ids=str(held_ids),
                          count_tokens_with=tok_spec)
    write_yaml(out / "plan.yaml", plan_cfg.model_dump(mode="json", exclude_defaults=True))
    plan = make_plan(plan_cfg)
    for d in plan.decisions:
        ctx.step(f"  {d.component}: {d.rule} ({d.reason})" + (f" -> {', '.join(s.name for s in d.slices)}" if d.slices else ""))

    seq_len = int(ctx.size("proxy_seq_len", 128))
    batch = int(ctx.size("proxy_batch", 8))
    model = {"preset": "tiny", "overrides": {"max_seq_len": max(seq_len, 256)}}
    cfg = ProxyRunConfig(
        out=str(out / "run"), plan=str(out / "plan"), tokenizer=tok_spec, seq_len=seq_len, seed=seed,
        base={"components": [str(p) for _, p in sorted(components.items())], "steps": int(ctx.size("proxy_base_steps", 60)),
              # the base sees a sample of every source (as much as its steps read), none of the slices
              "sample_tokens": int(ctx.size("proxy_base_steps", 60)) * batch * seq_len,
              "global_batch": batch, "micro_batch": batch,
              "trainer": {"model": model, "schedule": {"kind": "constant", "lr": 3e-3, "warmup_steps": 5},
                          # several base checkpoints, so `python -m proxy_eval track` has windows to merge
                          "checkpoint": {"every_steps": max(1, int(ctx.size("proxy_base_steps", 60)) // 6),
                                         "keep_last": 8}}},
        # the same number of steps for every slice; a demo slice is small, so it may be read more than once
        continuation={"steps": int(ctx.size("proxy_steps", 30)), "repeat": True, "global_batch": batch,
                      "micro_batch": batch,
                      "trainer": {"schedule": {"kind": "wsd", "lr": 1e-3, "decay_ratio": 0.5}}},
        suite=str(out / "suite.yaml"), eval_batch_size=8, device="cpu")
    write_yaml(out / "proxy-run.yaml", cfg.model_dump(mode="json", exclude_defaults=True))
    write_yaml(out / "spec-base.yaml", {"tokenizer": tok_spec, "seq_len": seq_len})
    manifest = ProxyRunner(cfg, progress=ctx.step).run()

    profile = read_profile(out / "run" / "profile")
    ctx.step("profile (scores in %: per-byte probability 2^-bpb for text, gold-answer probability for math):")
    for line in profile.table_lines():
        ctx.step("  " + line)

    slices_only = profile.groups.loc[[r for r in profile.groups.index if r != "base"]]
    result: dict[str, Any] = {
        "plan": str(out / "plan"), "run": str(out / "run"), "profile_csv": str(out / "run" / "profile" / "profile.csv"),
        "scored_source": main_source, "slices": [s["slice"] for s in manifest.slices], "steps": manifest.steps,
        "best_slice": str(profile.average.drop("base", errors="ignore").idxmax()),
    }
    if len(slices_only) >= 2:
        res = capability_pca(slices_only.to_numpy(dtype=float), list(slices_only.index), list(slices_only.columns))
        png = biplot(res, out / "biplot.png", title="Demo proxy slices: capability PCA")
        atomic.write_json(out / "pca.json", {"schema": "proxy_eval.pca/1", "level": "groups", **res.to_dict()})
        result["biplot"] = str(png)
        result["explained_variance"] = [round(float(x), 4) for x in res.explained_variance_ratio]
        ctx.step(f"PCA biplot: {png} (explained variance {', '.join(f'{x:.2f}' for x in res.explained_variance_ratio)})")
    sug = suggest_from_plan(profile, out / "plan", base_spec={"tokenizer": tok_spec, "seq_len": seq_len},
                            name="demo-proxy-suggestion")
    atomic.write_text(out / "suggested-mixture.yaml", sug["spec_yaml"])
    atomic.write_json(out / "suggestion.json", {k: v for k, v in sug.items() if k != "spec_yaml"})
    for comp, d in sug["thresholds"].items():
        ctx.step(f"threshold for {comp}: keep the top {100 * d['keep_fraction']:.3g}% ({d['reason']})")
    weights = sug["suggestion"]["weights"]
    ctx.step("suggested weights (draft, review before use): " + ", ".join(f"{c} {w:.2f}" for c, w in sorted(weights.items())))
    result.update({"suggested_mixture": str(out / "suggested-mixture.yaml"), "weights": weights,
                   "keep_fraction": {c: d["keep_fraction"] for c, d in sug["thresholds"].items()},
                   "spec_valid": sug["spec_valid"]})
    return result


def summary(result: dict[str, Any]) -> list[str]:
    lines = [f"profile table: {result['profile_csv']}",
             f"slices of '{result['scored_source']}' and the other sources: {len(result['slices'])} proxy runs of "
             f"{result['steps']} steps; best by average: {result['best_slice']}"]
    if "biplot" in result:
        lines.append(f"PCA biplot: {result['biplot']}")
    lines.append(f"mixture draft: {result['suggested_mixture']}")
    return lines
