"""What a demo stage gets: its directory, the size profile, earlier stages' results, a progress line."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Sizes per profile. "demo" is what `make demo` runs (<= 15 min on 2 cores); "ci" is the reduced
# chain the end-to-end test runs. Stages read their own keys with `ctx.size(key)`.
PROFILES: dict[str, dict[str, Any]] = {
    "demo": {
        # corpus + kaiyuan stages: raw text per source (about 14 MB), then ingest, dedup and scoring
        "corpus_code_mb": 6.0, "corpus_prose_mb": 6.0, "corpus_math_problems": 10000,
        # tokenizer and mixtures stages: BPE vocab and sample, buckets K, window length, transition share
        "tokenizer_vocab": 4096, "tokenizer_docs": 4000, "mixtures_buckets": 16, "mixtures_seq_len": 256,
        "mixtures_transition_fraction": 0.1, "mixtures_holdout": 0.02,
        # proxy stage (proxy_eval): tiny base, one continuation per slice, benchmarks from held-out docs
        "proxy_base_steps": 60, "proxy_steps": 30, "proxy_eval_docs": 24, "proxy_seq_len": 128, "proxy_batch": 8,
        # synth stage: the vLLM teacher, problems x samples per mode
        "synth_teacher": "vllm", "synth_problems": 40, "synth_samples": 4,
        # synth_domains stage: text-to-SQL buckets and tool-use tasks against the same teacher
        "synth_domains_sql_n": 8, "synth_domains_tool_n": 8,
        # trainer stage: tiny preset; phase 1, then UD/CD (decay) and CMA (decay to 80%, constant, 6-average)
        "trainer_phase1_steps": 400, "trainer_phase2_steps": 200, "trainer_continue_steps": 100,
        "trainer_avg_spacing": 20, "trainer_global_batch": 8, "trainer_eval_sequences": 48, "trainer_eval_every": 80,
    },
    "ci": {
        "corpus_code_mb": 0.5, "corpus_prose_mb": 0.5, "corpus_math_problems": 500,
        "tokenizer_vocab": 1024, "tokenizer_docs": 1000, "mixtures_buckets": 4, "mixtures_seq_len": 64,
        "proxy_base_steps": 6, "proxy_steps": 3, "proxy_eval_docs": 6, "proxy_seq_len": 64, "proxy_batch": 4,
        "proxy_eval_chars": 600,
        "synth_teacher": "scripted", "synth_problems": 12, "synth_samples": 2, "synth_eval_problems": 50,
        "synth_domains_sql_n": 3, "synth_domains_tool_n": 3,
        "trainer_phase1_steps": 8, "trainer_phase2_steps": 6, "trainer_continue_steps": 5,
        "trainer_avg_spacing": 1, "trainer_global_batch": 4, "trainer_eval_sequences": 8, "trainer_eval_every": 4,
    },
}


@dataclass
class DemoContext:
    root: Path
    profile: str = "demo"
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    python: str = sys.executable
    _t0: float = field(default_factory=time.perf_counter)
    stage: str = ""

    def stage_dir(self, name: str | None = None) -> Path:
        d = self.root / (name or self.stage)
        d.mkdir(parents=True, exist_ok=True)
        return d

    def size(self, key: str, default: Any = None) -> Any:
        return PROFILES.get(self.profile, {}).get(key, default)

    def result(self, stage: str) -> dict[str, Any]:
        if stage not in self.results:
            raise RuntimeError(f"demo stage '{self.stage}' needs the result of stage '{stage}', which has not run")
        return self.results[stage]

    def step(self, message: str) -> None:
        """One line of progress per step."""
        print(f"[{time.perf_counter() - self._t0:7.1f}s] {self.stage:>10} | {message}", flush=True)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for subprocesses (spark-submit, torchrun, servers): offline and using this venv."""
        env = dict(os.environ)
        bindir = str(Path(self.python).parent)
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        env.setdefault("PYSPARK_PYTHON", self.python)
        env.setdefault("PYSPARK_DRIVER_PYTHON", self.python)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("HF_DATASETS_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.update(extra)
        return env


# ---- finding earlier stages' outputs in their results -----------------------------------------

def result_paths(result: Any) -> list[Path]:
    """Every string in a stage result (nested dicts and lists) that names an existing path."""
    out: list[Path] = []

    def visit(v: Any) -> None:
        if isinstance(v, dict):
            for x in v.values():
                visit(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)
        elif isinstance(v, str) and v and len(v) < 4096 and "\n" not in v:
            p = Path(v)
            if p.exists():
                out.append(p)

    visit(result)
    return out


def _is_component(p: Path) -> bool:
    import json

    from purokit.manifest import MANIFEST_NAME

    try:
        return json.loads((p / MANIFEST_NAME).read_text()).get("schema") == "component/1"
    except (OSError, json.JSONDecodeError):
        return False


def component_dirs(result: Any) -> dict[str, Path]:
    """Component directories named anywhere in a stage result (a component directory, or a
    directory of them), by component name; the first mention of a name wins."""
    from purokit.component import Component

    found: dict[str, Path] = {}
    for p in result_paths(result):
        if not p.is_dir():
            continue
        for cand in [p] if _is_component(p) else sorted(c for c in p.iterdir() if c.is_dir()):
            if _is_component(cand):
                found.setdefault(Component.open(cand).name, cand)
    return found


def find_tokenizer(result: Any) -> Path:
    """The tokenizer.json a stage made (its result names the file or its directory)."""
    for p in result_paths(result):
        if p.is_file() and p.name == "tokenizer.json":
            return p
        if p.is_dir() and (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
    raise RuntimeError(f"the stage's result names no tokenizer.json: {result}")
