"""The demo's proxy stage on components and a tokenizer built here (the shapes the kaiyuan and
tokenizer stages hand over), at the ci size."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from purokit.demo.proxy_stage import arithmetic_mc, find_components, find_tokenizer, run, summary
from tests.proxy_eval.helpers import write_component

WORDS = ("the river flows past old stone bridges while children read books about distant stars and "
         "quiet valleys where farmers grow wheat").split()


def _corpus(root: Path, rng: random.Random) -> dict[str, Path]:
    prose = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 90))) + "." for _ in range(260)]
    # quality correlates with length, like an educational-value score would with substance
    prose_scores = [len(t) / 600 + rng.random() * 0.2 for t in prose]
    code = [f"def f{i}(x):\n    y = x * {i % 7}\n    return y + {i % 5}\n\nprint(f{i}({i}))\n" for i in range(400)]
    math = []
    for i in range(160):
        a, b = rng.randint(2, 40), rng.randint(2, 40)
        math.append(f"Problem {i}: Sam has {a} marbles and finds {b} more. How many marbles does Sam have now? "
                    f"Sam has {a} + {b} = {a + b} marbles. The answer is {a + b}")
    return {
        "prose": write_component(root, "prose", prose, scores=prose_scores, score_name="edu"),
        "code": write_component(root, "code", code),
        "math": write_component(root, "math", math),
    }


def test_arithmetic_mc_items():
    item = arithmetic_mc("Tom has 3 apples and buys 4 more. How many apples? The answer is 7")
    assert item["query"].endswith("The answer is ") and item["choices"][item["gold"]] == "7"
    assert len(set(item["choices"])) == 4 and all(not c.startswith("-") for c in item["choices"])
    assert arithmetic_mc("no number here at all, really none") is None
    assert arithmetic_mc("Tom has 3 apples and buys 4 more. How many apples? The answer is 7") == item


def test_find_outputs_of_earlier_stages(tmp_path):
    comps = _corpus(tmp_path / "components", random.Random(0))
    assert set(find_components({"components": {k: str(v) for k, v in comps.items()}})) == {"prose", "code", "math"}
    assert set(find_components({"out": str(tmp_path / "components")})) == {"prose", "code", "math"}
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    assert find_tokenizer({"dir": str(tmp_path / "tok")}) == tmp_path / "tok" / "tokenizer.json"
    with pytest.raises(RuntimeError):
        find_tokenizer({"nothing": 1})


def test_demo_proxy_stage_ci_size(tmp_path, capsys):
    from purokit.demo.context import DemoContext
    from mixtures.tokenizers import train_bpe

    rng = random.Random(1)
    comps = _corpus(tmp_path / "kaiyuan" / "components", rng)
    from purokit.component import Component

    texts = [t for p in comps.values() for t in Component.open(p).read(columns=["text"]).column("text").to_pylist()]
    tok = train_bpe(texts, 600, tmp_path / "tokenizer")
    ctx = DemoContext(root=tmp_path / "demo", profile="ci")
    ctx.results["kaiyuan"] = {"components": {k: str(v) for k, v in comps.items()}}
    ctx.results["tokenizer"] = {"tokenizer": str(tmp_path / "tokenizer" / "tokenizer.json")}
    assert tok.vocab_size <= 600
    ctx.stage = "proxy"
    result = run(ctx)
    json.dumps(result)                                   # JSON-serializable, as the orchestrator needs
    printed = capsys.readouterr().out
    assert "profile" in printed and "prose.q00-from-best" in printed
    assert result["scored_source"] == "prose"
    assert [s for s in result["slices"] if s.startswith("prose.")] == [
        "prose.q00-from-best", "prose.q25-from-best", "prose.q50-from-best", "prose.q75-from-best"]
    assert {"code.random", "math.random"} <= set(result["slices"])
    assert Path(result["biplot"]).stat().st_size > 1000
    assert result["spec_valid"] is True
    assert abs(sum(result["weights"].values()) - 1) < 1e-9
    tasks = json.loads((Path(result["run"]) / "slices" / "code.random" / "eval" / "results.json").read_text())["tasks"]
    assert {t["task"] for t in tasks} == {"prose_bpb", "code_bpb", "math_bpb", "math_answer"}
    assert all(s for s in summary(result))

    # the README's proxy_eval commands on the stage's output
    from proxy_eval.__main__ import main

    d = tmp_path / "demo" / "proxy"
    capsys.readouterr()
    assert main(["plan", "--config", str(d / "plan.yaml")]) == 0                      # complete: reused
    assert main(["run", "--config", str(d / "proxy-run.yaml")]) == 0                  # every slice reused
    assert "rank" in capsys.readouterr().out
    assert main(["pca", "--profile", str(d / "run" / "profile"), "--out", str(d / "pca")]) == 0
    assert main(["suggest", "--profile", str(d / "run" / "profile"), "--plan", str(d / "plan"),
                 "--emphasis", "Math=2,Code=1,General=1", "--base-spec", str(d / "spec-base.yaml"),
                 "--out", str(d / "mixture-draft.yaml")]) == 0
    assert json.loads((d / "mixture-draft.json").read_text())["spec_valid"] is True
    from mixtures.__main__ import main as mixtures_main

    assert mixtures_main(["validate", "--spec", str(d / "mixture-draft.yaml")]) == 0
    assert main(["eval", "--model", str(d / "run" / "base" / "train"), "--suite", str(d / "suite.yaml"),
                 "--out", str(d / "eval-base")]) == 0
    assert main(["track", "--run", str(d / "run" / "base" / "train"), "--suite", str(d / "suite.yaml"),
                 "--windows", "2,4", "--out", str(d / "track")]) == 0
    track = json.loads((d / "track" / "track.json").read_text())
    assert [p["window"] for p in track["points"]] == [0, 2, 4]


def test_benchmarks_from_the_corpus_stage_eval_sets(tmp_path):
    from purokit.demo.proxy_stage import build_suite
    from proxy_eval.tasks import load_task

    comps = _corpus(tmp_path / "components", random.Random(3))
    ev = tmp_path / "eval"
    ev.mkdir()
    (ev / "math.jsonl").write_text("".join(json.dumps({
        "id": f"m{i}", "problem": f"Ava has {i} coins and finds 3 more. How many coins?",
        "text": f"Problem: Ava has {i} coins and finds 3 more. How many coins?\n\nSolution: {i} + 3 = {i + 3}. "
                f"The answer is {i + 3}.", "answer": str(i + 3)}) + "\n" for i in range(10)))
    (ev / "prose.jsonl").write_text("".join(json.dumps({"id": f"p{i}", "text": "quiet valleys " * 20}) + "\n"
                                            for i in range(10)))
    suite, ids_file = build_suite(comps, tmp_path / "b", n_docs=6, seed=0, max_chars=500,
                                  eval_sources={"math": str(ev / "math.jsonl"), "prose": str(ev / "prose.jsonl")})
    names = {t.name: t for t in suite.tasks}
    assert set(names) == {"code_bpb", "math_bpb", "math_answer", "prose_bpb"}
    mc = load_task(names["math_answer"])
    assert len(mc.docs) == 10
    for d in mc.docs:
        gold = d["choices"][d["gold"]]
        assert d["query"].endswith("The answer is ") and d["query"].split("= ")[-1].startswith(gold)
    held = set(ids_file.read_text().split())
    assert {f"m{i}" for i in range(10)} <= held
    assert not any(h.startswith("prose-") for h in held)           # prose came from its eval set
    assert sum(1 for h in held if h.startswith("code-")) == 6      # no eval set for code: held out of the component
