"""The demo's synth stage with the scripted teacher (the vLLM path runs in `make demo`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from purokit.demo.context import PROFILES, DemoContext
from synth.export import load_export


def test_synth_stage_exports_pairs_and_reports_the_teacher(tmp_path, monkeypatch):
    monkeypatch.setitem(PROFILES, "synth-test", dict(PROFILES["ci"], synth_teacher="scripted"))
    import purokit.demo.synth_stage as stage
    ctx = DemoContext(root=tmp_path, profile="synth-test")
    ctx.stage = "synth"
    res = stage.run(ctx)
    dd = load_export(res["export_dir"])
    assert len(dd["train"]) == res["n_records"] > 0 and res["n_strict_pairs"] > 0
    assert Path(res["dataset"]).is_dir()
    assert set(dd["train"]["system"]) == {"detailed thinking on", "detailed thinking off"}
    assert res["prompts_dropped"].get("decontaminate", 0) >= 1          # the planted benchmark leak
    assert res["teacher"]["base_url"].startswith("http://127.0.0.1:") and "lifetime" in res["teacher"]
    stage.release_teacher(ctx)
    v = res["acceptance"]["verify"]
    assert 0 < v["out"] < v["in"]
    assert any("strict reasoning on/off pairs" in line for line in stage.summary(res))


def test_synth_stage_poses_the_corpus_math_problems(tmp_path, monkeypatch):
    import json

    import zstandard

    from purokit.demo.synth_stage import _corpus_math
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


# ---- the teacher's lifetime across the synth and synth_domains stages -------------------------------

def test_one_teacher_serves_both_stages_and_is_stopped_after_the_second(tmp_path, monkeypatch):
    from synth.servers import probe_models
    import purokit.demo.synth_domains_stage as domains
    import purokit.demo.synth_stage as stage

    monkeypatch.setitem(PROFILES, "synth-test", dict(PROFILES["ci"], synth_teacher="scripted", synth_problems=4,
                                                     synth_domains_sql_n=1, synth_domains_tool_n=1))
    ctx = DemoContext(root=tmp_path, profile="synth-test")
    ctx.stage = "synth"
    ctx.results["synth"] = stage.run(ctx)
    url = ctx.results["synth"]["teacher"]["base_url"]
    assert probe_models(url) == ["teacher"]                     # still serving after the synth stage
    ctx.stage = "synth_domains"
    res = domains.run(ctx)
    assert res["teacher"]["base_url"] == url                    # the same teacher, not a restart
    assert probe_models(url) is None                            # stopped by its last user
    stage.cleanup(ctx)                                          # nothing left to stop: a no-op


def test_a_failing_synth_stage_stops_its_teacher(tmp_path, monkeypatch):
    from synth.servers import probe_models
    import purokit.demo.synth_stage as stage
    import synth.engine

    monkeypatch.setitem(PROFILES, "synth-test", dict(PROFILES["ci"], synth_teacher="scripted", synth_problems=4))
    seen = []

    def interrupted(cfg, out, **kw):
        seen.append(cfg.teachers["reasoning"].endpoints[0])
        raise KeyboardInterrupt
    monkeypatch.setattr(synth.engine, "run", interrupted)
    ctx = DemoContext(root=tmp_path, profile="synth-test")
    ctx.stage = "synth"
    with pytest.raises(KeyboardInterrupt):
        stage.run(ctx)
    assert seen and probe_models(seen[0]) is None and str(ctx.root) not in stage._LEASES


def test_the_orchestrator_stops_the_teacher_when_the_run_ends(tmp_path, monkeypatch):
    """`python -m purokit.demo --only synth`: no synth_domains stage takes the teacher over, so the
    orchestrator's end-of-run cleanup stops it; a later run with the synth stage reused starts
    it again from the recorded description for the domain stage."""
    import json

    from purokit.demo.__main__ import run_demo
    from synth.servers import probe_models
    import purokit.demo.synth_stage as stage

    monkeypatch.setitem(PROFILES, "synth-test", dict(PROFILES["ci"], synth_teacher="scripted", synth_problems=4,
                                                     synth_domains_sql_n=1, synth_domains_tool_n=1))
    run_demo(tmp_path, "synth-test", only={"synth"})
    teacher = json.loads((tmp_path / "synth" / "stage.json").read_text())["result"]["teacher"]
    assert probe_models(teacher["base_url"]) is None and not stage._LEASES
    ctx = run_demo(tmp_path, "synth-test", only={"synth_domains"})
    assert "synth_domains" in ctx.results and not stage._LEASES
    assert ctx.results["synth_domains"]["teacher"]["base_url"] != teacher["base_url"]


def test_sigterm_while_a_teacher_runs_unwinds_like_ctrl_c(tmp_path):
    import os
    import signal

    import purokit.demo.synth_stage as stage

    class Handle:
        stopped = False

        def stop(self):
            Handle.stopped = True

    ctx = DemoContext(root=tmp_path, profile="ci")
    ctx.stage = "synth"
    before = signal.getsignal(signal.SIGTERM)
    stage._lease(ctx, Handle(), "http://127.0.0.1:9/v1", "test")
    try:
        with pytest.raises(SystemExit) as ei:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0.1) if hasattr(signal, "sigtimedwait") else None
        assert ei.value.code == 128 + signal.SIGTERM
    finally:
        stage.cleanup(ctx)
    assert Handle.stopped and signal.getsignal(signal.SIGTERM) == before


@pytest.mark.slow
def test_one_vllm_teacher_serves_both_stages(tmp_path, monkeypatch):
    """The real teacher (vLLM from .venv-vllm, `make teacher-env`): started once by the synth
    stage, taken over by synth_domains, its process gone afterwards."""
    import time

    from synth import servers
    import purokit.demo.synth_domains_stage as domains
    import purokit.demo.synth_stage as stage

    spec = servers.default_spec("vllm", served_name="teacher")
    if not (Path(spec.python).exists() and Path(spec.model).exists()):
        pytest.skip("no .venv-vllm with the converted teacher (make teacher-env)")
    monkeypatch.setitem(PROFILES, "synth-test", dict(PROFILES["ci"], synth_teacher="vllm", synth_problems=4,
                                                     synth_domains_sql_n=2, synth_domains_tool_n=2))
    ctx = DemoContext(root=tmp_path, profile="synth-test")
    ctx.stage = "synth"
    ctx.results["synth"] = stage.run(ctx)
    teacher = ctx.results["synth"]["teacher"]
    lease = stage._LEASES[str(tmp_path)]
    ctx.stage = "synth_domains"
    t0 = time.perf_counter()
    base_url, _ = stage.shared_teacher(ctx, tmp_path / "logs")
    assert base_url == teacher["base_url"] and time.perf_counter() - t0 < 5      # no second start
    res = domains.run(ctx)
    assert res["teacher"]["base_url"] == teacher["base_url"]
    assert not lease.handle.alive() and servers.probe_models(teacher["base_url"]) is None
    assert res["tool_use"]["acceptance"]["query"]["in"] == 2
