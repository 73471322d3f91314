"""The demo stage "synth_domains" runs both generators against the synth stage's teacher (here the
scripted one, as in the `ci` profile without .venv-vllm) and reports acceptance per stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from purokit.demo.context import DemoContext


def test_stage_runs_sql_and_tool_use_and_reports_every_stage(tmp_path):
    import purokit.demo.synth_domains_stage as stage

    ctx = DemoContext(root=tmp_path, profile="ci")
    ctx.stage = "synth_domains"
    ctx.results["synth"] = {"teacher": {"kind": "scripted", "base_url": "http://127.0.0.1:9/v1", "model": "teacher",
                                        "spec": None, "engine": "purokit-fakeserver"}}
    result = stage.run(ctx)
    json.dumps(result)                                   # a stage result is JSON
    for name, first in (("text_to_sql", "schema"), ("tool_use", "query")):
        r = result[name]
        assert Path(r["records"]).is_file() and Path(r["manifest"]).is_file() and Path(r["rejects"]).is_file()
        assert Path(r["export_dir"]).is_dir()
        assert r["n_prompts"] == 3
        assert r["acceptance"][first]["in"] == 3
        # the scripted arithmetic teacher writes no SQL: everything is rejected at the first stage, with a reason
        rejects = [json.loads(x) for x in Path(r["rejects"]).read_text().splitlines()]
        if name == "text_to_sql":
            assert r["n_records"] == 0 and {x["step"] for x in rejects} == {"schema"}
    lines = stage.summary(result)
    assert any("text_to_sql" in x for x in lines) and any("tool_use" in x for x in lines)


@pytest.mark.slow
def test_stage_against_the_real_local_teacher(tmp_path):
    """The same stage against SmolLM2-135M-Instruct behind vLLM's own server (needs .venv-vllm:
    `make teacher-env`): the whole protocol path is real, and the validators reject what is wrong."""
    from synth import servers
    import purokit.demo.synth_domains_stage as stage

    spec = servers.default_spec("vllm", served_name="teacher")
    if not (Path(spec.python).exists() and Path(spec.model).exists()):
        pytest.skip("no .venv-vllm with the converted teacher (make teacher-env)")
    ctx = DemoContext(root=tmp_path, profile="ci")
    ctx.stage = "synth_domains"
    ctx.results["synth"] = {"teacher": {"kind": "vllm", "base_url": "http://127.0.0.1:9/v1", "model": "teacher",
                                        "spec": spec.to_json(), "engine": "vllm"}}
    result = stage.run(ctx)
    for name, first in (("text_to_sql", "schema"), ("tool_use", "query")):
        r = result[name]
        assert r["completion_tokens"] > 0 and r["acceptance"][first]["in"] == r["n_prompts"]
        # every prompt has a fate: a record, or a rejection with its stage and reason
        rejected = {json.loads(x)["prompt_id"] for x in Path(r["rejects"]).read_text().splitlines()}
        kept = {json.loads(x)["prompt_id"] for x in Path(r["records"]).read_text().splitlines()}
        removed = {json.loads(x)["prompt_id"] for x in (Path(r["records"]).parent / "removals.jsonl").read_text().splitlines()}
        assert len(rejected | kept | removed) == r["n_prompts"]
