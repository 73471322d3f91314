"""The reasoning-pairs generator against the real local teacher: records/s and tokens/s.

Runs the same generator config twice, side by side in one invocation:
  vllm     SmolLM2-135M-Instruct behind vLLM's CPU OpenAI server (.venv-vllm, `make vllm-env`)
  scripted the same generator against synth.fakeserver (answers at once): the engine's own ceiling
and reports prompts/s, records/s and completion tokens/s for each, plus the server start time.
Both runs start from an empty cache.

    .venv/bin/python benchmarks/synth_teacher.py [--problems 32] [--samples 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._results import save  # noqa: E402

from synth.engine import load_generator, run  # noqa: E402
from synth.fakeserver import FakeOpenAIServer  # noqa: E402
from synth.pipeline import GeneratorConfig  # noqa: E402
from synth.servers import default_spec, start_server  # noqa: E402


def config(url: str, n_problems: int, n_samples: int, engine: str) -> GeneratorConfig:
    data = load_generator("reasoning_pairs", [f"source.n={n_problems}"]).model_dump(mode="json")
    for step in data["steps"]:
        if step["kind"] == "generate":
            step["n"] = n_samples
            step["params"] = dict(step["params"], temperature=0.3, max_tokens=160 if step["mode"] == "on" else 64)
            if step["mode"] == "on":
                step["prefill"] = "<think>\n"          # as the demo stage
    for t in data["teachers"].values():
        t.update(endpoints=[url], model="teacher", engine=engine, initial_concurrency=32, max_concurrency=64)
    data["output"]["formats"] = ["jsonl"]
    return GeneratorConfig.model_validate(data)


def measure(cfg: GeneratorConfig, out: Path) -> dict[str, float]:
    t0 = time.perf_counter()
    res = run(cfg, out, progress=False)
    wall = time.perf_counter() - t0
    m = res.manifest
    return {"wall_s": round(wall, 2), "prompts": m.counts["prompts"], "requests": m.usage["requests"],
            "records": m.counts["records"], "strict_pairs": m.counts["strict_pairs"],
            "completion_tokens": m.usage["completion_tokens"],
            "prompts_per_s": round(m.counts["prompts"] / wall, 3), "records_per_s": round(m.counts["records"] / wall, 3),
            "requests_per_s": round(m.usage["requests"] / wall, 2),
            "completion_tokens_per_s": round(m.usage["completion_tokens"] / wall, 1),
            "verify_acceptance": m.steps["verify"]["acceptance"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=32)
    ap.add_argument("--samples", type=int, default=4)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="synth-teacher-bench-"))
    result: dict[str, object] = {"problems": args.problems, "samples_per_mode": args.samples,
                                 "cores": os.cpu_count(), "loadavg_1m_before": round(os.getloadavg()[0], 2)}
    try:
        t0 = time.perf_counter()
        with start_server(default_spec("vllm"), log_dir=tmp / "logs") as srv:
            result["vllm_ready_s"] = round(time.perf_counter() - t0, 1)
            result["vllm"] = measure(config(srv.base_url, args.problems, args.samples, "vllm"), tmp / "vllm")
        with FakeOpenAIServer("arithmetic", model="teacher", record_bodies=False) as fake:
            result["scripted"] = measure(config(fake.base_url, args.problems, args.samples, "scripted"), tmp / "fake")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    save("synth_teacher", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
