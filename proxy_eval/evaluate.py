"""Run a benchmark suite against a scoring model: one `TaskResult` per task, with standard errors
and the per-document samples (what was asked, what the model did, how it was scored)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from purokit import atomic
from purokit.log import get_logger
from purokit.sandbox import SandboxJob, SandboxLimits, run_many
from proxy_eval.contracts import SuiteResults
from proxy_eval.extract import answers_match, extract_answer, harness_exact_match, regex_first
from proxy_eval.metrics import Estimate, bits_per_byte, mc_item_scores, mean_estimate, olmes_best, ratio_estimate
from proxy_eval.models import ScoringModel, cut_at_stop
from proxy_eval.tasks import (LETTERS, LoadedTask, SuiteConfig, code_program, code_prompt, generate_prompt,
                              load_task, mc_requests)

log = get_logger(__name__)


@dataclass
class TaskResult:
    task: str
    format: str
    group: str
    metric: str                      # the primary metric's name
    value: float
    stderr: float
    n: int
    higher_is_better: bool
    metrics: dict[str, Estimate] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)   # e.g. the OLMES form chosen, sandbox statuses
    samples: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"task": self.task, "format": self.format, "group": self.group, "metric": self.metric,
                "value": self.value, "stderr": self.stderr, "n": self.n, "higher_is_better": self.higher_is_better,
                "metrics": {k: v.to_dict() for k, v in self.metrics.items()}, "detail": self.detail}


def _mc(model: ScoringModel, task: LoadedTask, batch_size: int) -> TaskResult:
    cfg = task.config
    metrics: dict[str, Estimate] = {}
    per_doc: list[dict[str, Any]] = [{"doc_id": d["doc_id"], "gold": d["gold"]} for d in task.docs]
    forms = task.forms
    for form in forms:
        reqs, spans = [], []
        for d in task.docs:
            r = mc_requests(task, d, form)
            spans.append((len(reqs), len(r)))
            reqs.extend(r)
        scores = model.loglikelihood(reqs, batch_size=batch_size)
        items: dict[str, list[float]] = {}
        for d, s, (start, k) in zip(task.docs, per_doc, spans):
            lls = [scores[start + j].logprob for j in range(k)]
            shown = d["choices"] if form == "cloze" else [LETTERS[j] for j in range(k)]
            item = mc_item_scores(lls, [len(c) for c in shown], d["gold"], [len(c.encode("utf-8")) for c in shown])
            if form == "letters":     # one-letter continuations: the normalized forms are acc
                del item["acc_norm"], item["acc_bytes"]
            for m, v in item.items():
                items.setdefault(m, []).append(v)
            s[form] = {"loglikelihoods": lls, **item}
        for m, vals in items.items():
            metrics[f"{form}.{m}"] = mean_estimate(vals)
    detail: dict[str, Any] = {}
    if cfg.primary == "olmes":
        candidates = {}
        if "cloze" in forms:
            candidates["cloze"] = metrics[f"cloze.{cfg.cloze_metric}"]
        if "letters" in forms:
            candidates["letters"] = metrics[f"letters.{cfg.letters_metric}"]
        form, best = olmes_best(candidates)
        detail["olmes_form"] = form
        metric = f"{form}.{cfg.cloze_metric if form == 'cloze' else cfg.letters_metric}"
    elif cfg.primary == "prob_correct":
        metric, best = "cloze.prob_correct", metrics["cloze.prob_correct"]
    else:
        m = cfg.cloze_metric if cfg.primary == "cloze" else cfg.letters_metric
        metric, best = f"{cfg.primary}.{m}", metrics[f"{cfg.primary}.{m}"]
    metrics["score"] = best
    detail["score_metric"] = metric
    return TaskResult(cfg.name, cfg.format, cfg.group, "score", best.value, best.stderr, best.n, True,
                      metrics, detail, per_doc)


def _generate(model: ScoringModel, task: LoadedTask, batch_size: int) -> TaskResult:
    cfg = task.config
    preset = task.preset
    prompts = [generate_prompt(task, d) for d in task.docs]
    outs = [cut_at_stop(o, task.stop) for o in model.generate(prompts, cfg.max_new_tokens, task.stop,
                                                              batch_size=batch_size)]
    hits, samples = [], []
    for d, out in zip(task.docs, outs):
        if preset.answer_regex is None:      # Puro's postprocessor
            pred = extract_answer(out)
            ok = answers_match(pred, d["answer"])
        else:                                # the harness's filter and exact_match
            pred = regex_first(out, preset.answer_regex)
            ok = harness_exact_match(pred, d["answer"], preset.match_ignore, preset.match_ignore_case,
                                     preset.match_ignore_punctuation)
        hits.append(float(ok))
        samples.append({"doc_id": d["doc_id"], "generation": out, "extracted": pred, "gold": d["answer"], "match": ok})
    est = mean_estimate(hits)
    return TaskResult(cfg.name, cfg.format, cfg.group, "exact_match", est.value, est.stderr, est.n, True,
                      {"exact_match": est}, {}, samples)


_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)(?:```|$)", re.S)


def sanitize_code(completion: str) -> str:
    """Keep the code of a markdown-fenced answer (chat-style models); plain completions pass as is."""
    m = _FENCE.search(completion)
    return m.group(1) if m else completion


def _code(model: ScoringModel, task: LoadedTask, batch_size: int) -> TaskResult:
    cfg = task.config
    prompts = [code_prompt(task, d) for d in task.docs]
    outs = [sanitize_code(cut_at_stop(o, task.stop))
            for o in model.generate(prompts, cfg.max_new_tokens, task.stop, batch_size=batch_size)]
    limits = SandboxLimits(timeout_s=cfg.timeout_s, memory_mb=cfg.memory_mb)
    jobs = [SandboxJob(code=code_program(task, d, out), tests=d["test"], limits=limits) for d, out in zip(task.docs, outs)]
    verdicts = run_many(jobs, max_workers=cfg.code_workers)
    passed = [float(v.passed) for v in verdicts]
    statuses: dict[str, int] = {}
    samples = []
    for d, out, v in zip(task.docs, outs, verdicts):
        statuses[v.status] = statuses.get(v.status, 0) + 1
        samples.append({"doc_id": d["doc_id"], "completion": out, "status": v.status, "detail": v.detail,
                        "stderr_tail": v.stderr_tail[-500:]})
    est = mean_estimate(passed)   # greedy: one sample per problem, so pass@1 is the pass rate
    return TaskResult(cfg.name, cfg.format, cfg.group, "pass@1", est.value, est.stderr, est.n, True,
                      {"pass@1": est}, {"statuses": statuses}, samples)


def _bpb(model: ScoringModel, task: LoadedTask, batch_size: int) -> TaskResult:
    cfg = task.config
    texts = [d["text"] for d in task.docs]
    scores = model.loglikelihood_rolling(texts, batch_size=batch_size)
    nbytes = [len(t.encode("utf-8")) for t in texts]
    est = bits_per_byte([s.nll_nats for s in scores], nbytes)
    per_token = ratio_estimate([s.nll_nats for s in scores], [s.n_tokens for s in scores])
    samples = [{"doc_id": d["doc_id"], "nll_nats": s.nll_nats, "n_tokens": s.n_tokens, "n_bytes": b}
               for d, s, b in zip(task.docs, scores, nbytes)]
    return TaskResult(cfg.name, cfg.format, cfg.group, "bits_per_byte", est.value, est.stderr, est.n, False,
                      {"bits_per_byte": est, "nll_per_token": per_token}, {}, samples)


_RUNNERS = {"multiple_choice": _mc, "generate": _generate, "code": _code, "bits_per_byte": _bpb}


def evaluate_task(model: ScoringModel, task: LoadedTask, batch_size: int = 8, group: str | None = None) -> TaskResult:
    t0 = time.perf_counter()
    result = _RUNNERS[task.config.format](model, task, batch_size)
    if group is not None:
        result.group = group
    if task.skipped:
        result.detail["skipped_records"] = len(task.skipped)
    result.elapsed_s = time.perf_counter() - t0
    return result


@dataclass
class SuiteResult:
    suite: str
    model: str
    batch_size: int
    results: list[TaskResult]

    def rows(self) -> list[dict[str, Any]]:
        """Long-format rows (one per task) for profile tables."""
        return [{"model": self.model, "task": r.task, "group": r.group, "format": r.format, "metric": r.metric,
                 "value": r.value, "stderr": r.stderr, "n": r.n, "higher_is_better": r.higher_is_better}
                for r in self.results]

    def write(self, directory: str | Path) -> None:
        """`results.json` (summaries) and `samples/<task>.jsonl` (per-document records), atomically.
        No timings go in: the same model and suite give byte-identical files."""
        directory = Path(directory)
        for r in self.results:
            lines = "".join(json.dumps(s, sort_keys=True, ensure_ascii=False, default=str) + "\n" for s in r.samples)
            atomic.write_text(directory / "samples" / f"{r.task}.jsonl", lines)
        SuiteResults(suite=self.suite, model=self.model, batch_size=self.batch_size,
                     tasks=[r.summary() for r in self.results]).write(directory / "results.json")


def load_suite(suite: SuiteConfig) -> list[LoadedTask]:
    return [load_task(t) for t in suite.tasks]


def evaluate_suite(model: ScoringModel, suite: SuiteConfig, tasks: list[LoadedTask] | None = None,
                   batch_size: int | None = None) -> SuiteResult:
    tasks = tasks if tasks is not None else load_suite(suite)
    bs = batch_size or suite.batch_size
    results = []
    for task in tasks:
        r = evaluate_task(model, task, bs, group=suite.group_of(task.config.name))
        log.info("%s: %s %s = %.4f ± %.4f (n=%d, %.1fs)", model.name, r.task, r.metric, r.value, r.stderr, r.n, r.elapsed_s)
        results.append(r)
    return SuiteResult(suite.name, model.name, bs, results)
