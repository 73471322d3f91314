"""Proxy runs end to end on real components: mixtures shards, trainer continuations, the suite,
the profile; resumable (a finished slice is never rerun)."""

from __future__ import annotations

import json
import random

import pytest

from proxy_eval.plan import ComponentRef, PlanConfig, make_plan
from proxy_eval.run import ProxyRunConfig, ProxyRunner, auto_steps, resolve_parallel
from proxy_eval.slices import SliceRules
from proxy_eval.tasks import DataSource, SuiteConfig, TaskConfig
from tests.proxy_eval.helpers import write_component

WORDS = "the cat sat on a mat and dog ran to log with red blue green big small".split()
CODE = ["def f(x):\n    return x + 1\n", "for i in range(3):\n    print(i)\n", "import os\nx = [1, 2, 3]\n"]


def _prose(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("proxyrun")
    rng = random.Random(0)
    web_texts = [_prose(rng, rng.randint(10, 40)) for _ in range(300)]
    web = write_component(root / "components", "web", web_texts, scores=[rng.random() for _ in web_texts])
    code = write_component(root / "components", "code", [rng.choice(CODE) * rng.randint(1, 4) for _ in range(200)])
    web_tokens = sum(max(1, len(t.split())) for t in web_texts)
    rules = SliceRules(slice_tokens=web_tokens // 5, quantile_min_tokens=web_tokens // 2, random_min_tokens=100,
                       percentiles=[0, 50])
    plan_dir = root / "plan"
    make_plan(PlanConfig(components=[ComponentRef(path=str(web)), ComponentRef(path=str(code))], rules=rules,
                         out=str(plan_dir)))
    held = root / "heldout.jsonl"
    held.write_text("".join(json.dumps({"text": _prose(rng, 30)}) + "\n" for _ in range(4)))
    mc = root / "mc.jsonl"
    mc.write_text("".join(json.dumps({"query": f"the {w} sat on the", "choices": ["mat", "log", "range(3)"], "gold": 0})
                          + "\n" for w in WORDS[:5]))
    suite = SuiteConfig(tasks=[
        TaskConfig(name="prose_bpb", format="bits_per_byte", preset="text", group="General",
                   source=DataSource(path=str(held))),
        TaskConfig(name="mc", format="multiple_choice", group="Reasoning", source=DataSource(path=str(mc)),
                   forms=["cloze"], primary="prob_correct"),
    ])
    tiny = {"model": {"preset": "tiny", "overrides": {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
                                                        "head_dim": 16, "d_ff": 64}},
            "schedule": {"kind": "constant", "lr": 3e-3}}
    cfg = ProxyRunConfig(
        out=str(root / "run"), plan=str(plan_dir), tokenizer={"kind": "hf", "path": str(tokenizer_dir / "tokenizer.json")},
        seq_len=32, base={"components": [str(web), str(code)], "steps": 2, "global_batch": 2, "micro_batch": 2,
                          "sample_tokens": 500, "trainer": tiny},
        continuation={"steps": "auto", "max_steps": 2, "global_batch": 2, "micro_batch": 2,
                      "trainer": {"schedule": {"kind": "constant", "lr": 1e-3}}},
        suite=suite, eval_batch_size=4)
    return cfg


def test_proxy_run_trains_evaluates_profiles_and_resumes(setup, monkeypatch):
    import trainer.train as tt

    calls = []
    real_train = tt.train
    monkeypatch.setattr(tt, "train", lambda cfg: calls.append(cfg.run_dir) or real_train(cfg))
    manifest = ProxyRunner(setup).run()
    assert [s["slice"] for s in manifest.slices] == ["web.q00-from-best", "web.q50-from-best", "code.random"]
    assert manifest.steps == 2
    assert len(calls) == 4           # the base once, then one continuation per slice
    out = setup.out
    from proxy_eval.profiles import read_profile

    prof = read_profile(f"{out}/profile")
    assert set(prof.scores.index) == {"base", "web.q00-from-best", "web.q50-from-best", "code.random"}
    assert set(prof.groups.columns) == {"General", "Reasoning"}
    # continuing on different data gives different models
    bpb = prof.scores["prose_bpb"]
    assert bpb["code.random"] != bpb["web.q00-from-best"]
    # every continuation started from the same base and ran the same steps
    from trainer import checkpoint as ckpt

    for s in manifest.slices:
        st = ckpt.read_state(s["checkpoint"])
        assert st.step == 2 and st.config["init_from"]["path"] == manifest.base_checkpoint

    # the base trained on samples disjoint from every slice
    from purokit.component import Component

    sample_ids = set()
    for name in ("web", "code"):
        comp = Component.open(f"{out}/base/sample/{name}")
        assert 500 <= comp.manifest.n_tokens < 500 + 200
        sample_ids |= set(comp.read(columns=["id"]).column("id").to_pylist())
    for s in manifest.slices:
        slice_ids = set(Component.open(f"{setup.plan}/slices/{s['slice']}").read(columns=["id"]).column("id").to_pylist())
        assert not slice_ids & sample_ids

    # a rerun does no work at all
    calls.clear()
    again = ProxyRunner(setup).run()
    assert calls == [] and again.counts["rerun"] == 0
    # a slice whose manifest is gone (killed before it finished) is the only one rerun
    from pathlib import Path

    keep = Path(out, "slices", "web.q00-from-best", "eval", "results.json").stat().st_mtime_ns
    Path(out, "slices", "code.random", "manifest.json").unlink()
    third = ProxyRunner(setup).run()
    assert third.counts["rerun"] == 1
    assert Path(out, "slices", "web.q00-from-best", "eval", "results.json").stat().st_mtime_ns == keep
    # its training had finished, so it was not retrained either: only re-evaluated
    assert calls == []


def test_pure_helpers():
    assert auto_steps({"a": 1000, "b": 641}, 64, None) == 10
    assert auto_steps({"a": 1000}, 64, 3) == 3
    with pytest.raises(Exception, match="fewer than one step"):
        auto_steps({"a": 10}, 64, None)
    assert resolve_parallel("auto", 0) == 1 and resolve_parallel("auto", 4) == 4 and resolve_parallel(2, 8) == 2


def test_cli_profile_pca_suggest_on_the_run(setup, tmp_path, capsys):
    from proxy_eval.__main__ import main

    ProxyRunner(setup).run()          # reused from the test above when run in order
    out = setup.out
    assert main(["profile", "--results", f"a={out}/slices/web.q00-from-best/eval",
                 f"b={out}/slices/code.random/eval/results.json", "--out", str(tmp_path / "prof")]) == 0
    assert "slice" in capsys.readouterr().out
    assert (tmp_path / "prof" / "profile.csv").is_file()
    assert main(["pca", "--profile", f"{out}/profile", "--out", str(tmp_path / "pca"), "--level", "tasks"]) == 0
    pca = json.loads((tmp_path / "pca" / "pca.json").read_text())
    assert sum(pca["explained_variance_ratio"]) == pytest.approx(1.0) and "base" not in pca["rows"]
    assert (tmp_path / "pca" / "biplot.png").stat().st_size > 1000
    base = tmp_path / "base.yaml"
    base.write_text(f"tokenizer: {{kind: hf, path: {setup.tokenizer['path']}}}\nseq_len: 32\n")
    assert main(["suggest", "--profile", f"{out}/profile", "--plan", setup.plan, "--out", str(tmp_path / "mix.yaml"),
                 "--emphasis", "General=1", "--base-spec", str(base), "--tolerance", "100"]) == 0
    report = json.loads((tmp_path / "mix.json").read_text())
    assert report["spec_valid"] is True, report["spec_problem"]
    assert set(report["suggestion"]["weights"]) == {"web", "code"}
    assert report["thresholds"]["web"]["paying"] == ["web.q00-from-best", "web.q50-from-best"]
    from mixtures.spec import load_spec

    spec = load_spec(tmp_path / "mix.yaml")
    assert {c.name for c in spec.components} == {"web", "code"}


def test_cli_eval_on_a_checkpoint(setup, tmp_path):
    from proxy_eval.__main__ import main

    manifest = ProxyRunner(setup).run()
    suite = tmp_path / "suite.yaml"
    import yaml

    suite.write_text(yaml.safe_dump(setup.suite.model_dump(mode="json")))
    ckpt = manifest.slices[0]["checkpoint"]
    assert main(["eval", "--model", ckpt, "--suite", str(suite), "--out", str(tmp_path / "ev"),
                 "--tokenizer", setup.tokenizer["path"]]) == 0
    res = json.loads((tmp_path / "ev" / "results.json").read_text())
    ref = json.loads(open(f"{setup.out}/slices/{manifest.slices[0]['slice']}/eval/results.json").read())
    assert [t["value"] for t in res["tasks"]] == pytest.approx([t["value"] for t in ref["tasks"]], abs=1e-9)


def test_parallel_workers_give_the_same_profile(setup, tmp_path):
    """The multi-GPU path (one worker process per slice, CUDA_VISIBLE_DEVICES per worker) run on CPU
    with two workers: same results as the in-process run."""
    first = ProxyRunner(setup).run()
    cfg = setup.model_copy(update={"out": str(tmp_path / "par"), "parallel": 2, "evaluate_base": False,
                                   "slices": ["web.q00-from-best", "code.random"],
                                   "base": setup.base.model_copy(update={"checkpoint": first.base_checkpoint})})
    second = ProxyRunner(cfg).run()
    assert second.counts["rerun"] == 2
    for s in ("web.q00-from-best", "code.random"):
        a = json.loads(open(f"{setup.out}/slices/{s}/eval/results.json").read())["tasks"]
        b = json.loads(open(f"{cfg.out}/slices/{s}/eval/results.json").read())["tasks"]
        assert [t["value"] for t in a] == pytest.approx([t["value"] for t in b], abs=1e-6)
        assert (tmp_path / "par" / "slices" / s / "worker.log").is_file()


def test_changed_settings_retrain_instead_of_resuming_stale_runs(setup, monkeypatch):
    """A slice whose continuation settings changed is retrained from the base (its old trainer run
    is not resumed); the base, unchanged, is reused."""
    import trainer.train as tt

    ProxyRunner(setup).run()
    calls = []
    real_train = tt.train
    monkeypatch.setattr(tt, "train", lambda cfg: calls.append(cfg.run_dir) or real_train(cfg))
    cont = setup.continuation.model_copy(update={"trainer": {"schedule": {"kind": "constant", "lr": 5e-4}}})
    changed = setup.model_copy(update={"continuation": cont, "evaluate_base": False})
    m = ProxyRunner(changed).run()
    assert m.counts["rerun"] == 3
    assert sorted(calls) == sorted(f"{setup.out}/slices/{s}/train" for s in
                                   ("web.q00-from-best", "web.q50-from-best", "code.random"))
    from trainer import checkpoint as ckpt

    st = ckpt.read_state(m.slices[0]["checkpoint"])
    assert st.config["schedule"]["lr"] == 5e-4 and st.step == m.steps


def test_a_retrained_base_is_evaluated_again(setup):
    cfg = setup.model_copy(update={"base": setup.base.model_copy(update={"steps": 3})})
    before = json.loads(open(f"{setup.out}/base/eval/results.json").read())["rows"]
    ProxyRunner(cfg).run()
    after = json.loads(open(f"{setup.out}/base/eval/results.json").read())["rows"]
    assert [r["value"] for r in before] != [r["value"] for r in after]
