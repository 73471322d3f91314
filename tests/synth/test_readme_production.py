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


def test_batch_snippet_runs_a_generator_through_the_batch_api(fake_server, tmp_path, monkeypatch):
    from synth.engine import run
    from synth.pipeline import GeneratorConfig

    from .conftest import pairs_config

    snippet = production_snippets()["the OpenAI Batch API"]
    srv = fake_server("arithmetic", model="gpt-4o-mini")
    cfg = pairs_config(srv.base_url, n_prompts=6, n=2)
    teacher = dict(snippet["teachers"]["teacher"], endpoints=[srv.base_url], api_key_env="PUROKIT_TEST_KEY",
                   batch_collect_s=0.2, batch_poll_s=0.02)     # the waits, shortened for a test
    cfg["teachers"] = {"reasoning": teacher, "instruct": teacher}
    cfg["output"].update(snippet["output"])
    monkeypatch.setenv("PUROKIT_TEST_KEY", "sk-test")
    res = run(GeneratorConfig.model_validate(cfg), tmp_path / "r", progress=False)
    assert res.manifest.status == "complete" and res.n_records > 0
    assert srv.stats.n_batch_lines == srv.stats.n_requests > 0 and len(srv.batch.batches) == 2


def test_mcp_snippet_is_a_valid_tool_task_source():
    from synth.domains.mcp_tools import ToolsConfig
    from synth.engine import load_generator

    snippet = production_snippets()["MCP tools"]
    cfg = load_generator("tool_use")
    assert snippet["source"]["kind"] == cfg.source["kind"]
    tools = ToolsConfig.model_validate(snippet["source"]["tools"])
    assert tools.mcp.command and tools.mcp.timeout_s == 30 and tools.mcp.concurrent_calls == 1
