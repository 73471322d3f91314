"""The README's "synth for production runs" config snippets are real configs: each one validates,
and (the batch and MCP ones) runs against the scripted teacher."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from synth.client import TeacherConfig

README = Path(__file__).resolve().parents[2] / "README.md"


def production_snippets() -> dict[str, dict]:
    """The yaml blocks of the README's production sections, by their section title."""
    text = README.read_text(encoding="utf-8")
    out: dict[str, dict] = {}
    for sec in re.split(r"^##+ ", text, flags=re.M)[1:]:
        title = sec.splitlines()[0]
        if title.startswith("synth for production runs"):
            blocks = re.findall(r"```yaml\n(.*?)```", sec, flags=re.S)
            assert len(blocks) == 1, title
            out[title.split(": ", 1)[1]] = yaml.safe_load(blocks[0])
    return out


def test_slow_teacher_snippet_is_a_valid_latency_aware_teacher():
    snippet = production_snippets()["slow teachers"]
    for name, t in snippet["teachers"].items():
        cfg = TeacherConfig.model_validate(t)
        assert cfg.latency_aware and cfg.initial_concurrency < cfg.max_concurrency, name
