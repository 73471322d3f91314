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


def test_synth_stage_poses_the_corpus_math_problems(tmp_path, monkeypatch):
    import json

    import zstandard

    from demo.synth_stage import _corpus_math
    src = tmp_path / "sources" / "math"
    src.mkdir(parents=True)
    rows = [{"id": f"m{i}", "text": "...", "problem": f"Ada has {n} coins and finds {n} more. How many?", "answer": str(2 * n)}
            for i, n in enumerate([500, 3, 90, 7, 12])]
    raw = ("".join(json.dumps(r) + "\n" for r in rows) + "{not json\n").encode()
    (src / "problems.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    ev = tmp_path / "eval" / "math.jsonl"
    ev.parent.mkdir()
    ev.write_text(json.dumps({"id": "e1", "problem": "Bo has 2 hats.", "answer": "2"}) + "\n")
    ctx = DemoContext(root=tmp_path / "demo", profile="ci")
    ctx.results["corpus"] = {"sources": {"math": str(src)}, "eval": {"math": str(ev)}}
    problems, evals, origin = _corpus_math(ctx, 3)
    assert [p["id"] for p in problems] == ["m1", "m3", "m4"]          # the smallest operands
    assert problems[0]["reference"] == "6" and evals == [{"id": "e1", "question": "Bo has 2 hats.", "answer": "2"}]
    assert "3 with the smallest operands of 5" in origin
