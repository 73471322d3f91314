"""The demo's synth stage with the scripted teacher (the vLLM path runs in `make demo`)."""

from __future__ import annotations

from pathlib import Path

from demo.context import PROFILES, DemoContext
from synth.export import load_export


def test_synth_stage_exports_pairs_and_reports_the_teacher(tmp_path, monkeypatch):
    monkeypatch.setitem(PROFILES, "synth-test", dict(PROFILES["ci"], synth_teacher="scripted"))
    import demo.synth_stage as stage
    ctx = DemoContext(root=tmp_path, profile="synth-test")
    ctx.stage = "synth"
    res = stage.run(ctx)
    dd = load_export(res["export_dir"])
    assert len(dd["train"]) == res["n_records"] > 0 and res["n_strict_pairs"] > 0
    assert Path(res["dataset"]).is_dir()
    assert set(dd["train"]["system"]) == {"detailed thinking on", "detailed thinking off"}
    assert res["prompts_dropped"].get("decontaminate", 0) >= 1          # the planted benchmark leak
    assert res["teacher"]["stopped"] and res["teacher"]["base_url"].startswith("http://127.0.0.1:")
    v = res["acceptance"]["verify"]
    assert 0 < v["out"] < v["in"]
    assert any("strict reasoning on/off pairs" in line for line in stage.summary(res))
