"""Shared fixtures: a scripted OpenAI-compatible server on localhost (real HTTP, see
synth.fakeserver) and small generator configs that point at it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from synth.fakeserver import FakeOpenAIServer, Fault


@pytest.fixture
def fake_server() -> Iterator[Any]:
    started: list[FakeOpenAIServer] = []

    def make(responder: Any = "echo", faults: list[Fault] | None = None, **kw: Any) -> FakeOpenAIServer:
        srv = FakeOpenAIServer(responder, faults, **kw).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def fast_teacher(urls: list[str], **kw: Any) -> dict[str, Any]:
    """Teacher settings that keep fault tests quick (short backoff and cooldown)."""
    base = {"model": "fake-teacher", "endpoints": urls, "engine": "fake", "backoff_base_s": 0.005,
            "backoff_max_s": 0.05, "breaker_cooldown_s": 0.3, "ready_timeout_s": 5, "timeout_s": 5}
    base.update(kw)
    return base


def pairs_config(url: str, n_prompts: int = 12, n: int = 3, **extra: Any) -> dict[str, Any]:
    cfg = {
        "generator": "pairs_test", "seed": 11, "category": "math", "license": "cc-by-4.0",
        "teachers": {"reasoning": fast_teacher([url]), "instruct": fast_teacher([url])},
        "source": {"kind": "arithmetic_word_problems", "n": n_prompts},
        "steps": [
            {"kind": "generate", "field": "reasoning", "teacher": "reasoning", "mode": "on", "n": n,
             "params": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 128}},
            {"kind": "filter", "field": "reasoning"},
            {"kind": "parse_reasoning", "field": "reasoning"},
            {"kind": "generate", "field": "direct", "teacher": "instruct", "mode": False, "n": n,
             "params": {"temperature": 0.6, "top_p": 0.95, "max_tokens": 64}},
            {"kind": "parse_reasoning", "field": "direct"},
            {"kind": "verify", "fields": ["reasoning", "direct"], "method": "math", "fallback": "majority_vote"},
            {"kind": "pair", "on_field": "reasoning", "off_field": "direct", "bulk_off": True},
        ],
        "post": [{"kind": "clean"}],
        "output": {"formats": ["jsonl"]},
    }
    cfg.update(extra)
    return cfg


def spawn_synth(cfg: dict[str, Any], tmp_path: Path, out: Path) -> tuple[subprocess.Popen[bytes], list[str]]:
    """`python -m synth <cfg> --out OUT` started in the background (a test kills it mid-run), and
    its command line, to run it again."""
    cfg_path = tmp_path / "gen.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "synth", str(cfg_path), "--out", str(out), "--no-progress"]
    repo = Path(__file__).resolve().parents[2]
    return subprocess.Popen(cmd, cwd=repo, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), cmd
