"""The demo's tokenizer and mixtures stages on stand-in kaiyuan components (the ci profile)."""

from purokit.demo.context import DemoContext
from mixtures.reader import EvalReader, ShardReader
from mixtures.tokenizers import load_tokenizer

from .conftest import make_component


def test_tokenizer_and_mixtures_stages(tmp_path, capsys):
    import purokit.demo.mixtures_stage as mixtures_stage
    import purokit.demo.tokenizer_stage as tokenizer_stage

    comps = tmp_path / "kaiyuan" / "score"
    make_component(comps, "web", 900, seed=1, score="edu")
    make_component(comps, "math", 300, seed=2, score="math_hq", max_words=40)
    make_component(comps, "code", 300, seed=3, score=None, max_words=40)
    ctx = DemoContext(root=tmp_path / "demo", profile="ci")
    ctx.results["kaiyuan"] = {"components": str(comps)}
    ctx.stage = "tokenizer"
    tok = tokenizer_stage.run(ctx)
    ctx.results["tokenizer"] = tok
    assert tok["vocab_size"] <= 1024 and load_tokenizer(tok["tokenizer"]).identity.digest == tok["digest"]
    ctx.stage = "mixtures"
    res = mixtures_stage.run(ctx)
    assert sorted(res["sets"]) == ["eval", "phase1-uniform", "phase2-curriculum", "phase2-uniform"]
    assert res["n_tokens"]["phase2-curriculum"] == res["n_tokens"]["phase2-uniform"]
    first, last = res["curriculum_mean_rank_first_last"]
    assert first < 0.3 < 0.7 < last
    assert res["transition"]["replay_tokens"] > 0
    out = capsys.readouterr().out
    assert "phase2-curriculum: pretrain curriculum" in out and "mean rank" in out
    for p in res["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the sets read back through the reader with the stage's tokenizer
    r = ShardReader(res["sets"]["phase2-curriculum"], global_batch_size=2, tokenizer=load_tokenizer(tok["tokenizer"]))
    assert next(r)["input_ids"].shape == (2, 64)
    assert len(EvalReader(res["sets"]["eval"], batch_size=2)) > 0
    assert any(line.startswith("shard set phase2-uniform") for line in mixtures_stage.summary(res))
