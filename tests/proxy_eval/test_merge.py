"""Merge-based evaluation tracking (seed-nemotron3 §1.10): coefficients, merging, tracking a run."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from proxy_eval.merge import best_per_point, merge_coefficients
from trainer.average import weighted_average


def test_minus_sqrt_coefficients_hand_checked():
    c = merge_coefficients(4, "1-sqrt")
    a = [1 - math.sqrt(x) for x in (0.125, 0.375, 0.625, 0.875)]          # decay at each update's midpoint
    assert c == pytest.approx([1 - a[0], a[0] - a[1], a[1] - a[2], a[2] - a[3], a[3]])
    assert c.sum() == pytest.approx(1.0) and c[-1] > 0                       # the newest checkpoint counts
    assert merge_coefficients(1, "1-sqrt") == pytest.approx([math.sqrt(0.5), 1 - math.sqrt(0.5)])


@pytest.mark.parametrize("shape", ["1-sqrt", "linear", "cosine", "constant", "equal"])
@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_coefficients_sum_to_one(shape, k):
    c = merge_coefficients(k, shape)
    assert len(c) == k + 1 and c.sum() == pytest.approx(1.0) and (c >= -1e-12).all()


def test_special_shapes():
    assert merge_coefficients(3, "constant").tolist() == [0.0, 0.0, 0.0, 1.0]
    assert merge_coefficients(2, "linear") == pytest.approx([1 / 4, 1 / 2, 1 / 4])
    assert merge_coefficients(3, "equal") == pytest.approx([0.25] * 4)
    with pytest.raises(ValueError):
        merge_coefficients(2, "exp")


def test_merge_is_linear_and_identity_on_equal_checkpoints():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor([1.0])}
    m = weighted_average([a, b], [0.25, 0.75], dtype=torch.float32)
    assert m["w"].tolist() == [2.5, 5.0] and m["b"].tolist() == [0.75]
    same = weighted_average([a, a, a], merge_coefficients(2), dtype=torch.float32)
    assert torch.equal(same["w"], a["w"])
    with pytest.raises(ValueError):
        weighted_average([a, {"x": torch.zeros(1)}], [0.5, 0.5])


def test_track_a_trainer_run(tmp_path, tokenizer, tokenizer_dir):
    from proxy_eval.__main__ import main
    from trainer.config import load_run_config
    from trainer.train import train
    from tests.proxy_eval.test_tasks import _suite

    run = tmp_path / "run"
    cfg = load_run_config(None, data={
        "run_dir": str(run), "model": {"preset": "tiny", "overrides": {"d_model": 32, "n_layers": 1, "n_heads": 2,
                                                                       "n_kv_heads": 1, "head_dim": 16, "d_ff": 64,
                                                                       "max_seq_len": 128}},
        "data": {"synthetic": {"vocab_size": tokenizer.vocab_size, "seq_len": 32}},
        "train": {"steps": 4, "global_batch": 2, "micro_batch": 2},
        "checkpoint": {"every_steps": 1, "keep_last": 10}, "eval": {"at_end": False}, "log": {"progress": "none"}})
    train(cfg)
    suite = _suite(tmp_path)
    (tmp_path / "suite.json").write_text(json.dumps(suite.model_dump(mode="json")))
    import yaml

    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite.model_dump(mode="json")))
    assert main(["track", "--run", str(run), "--suite", str(tmp_path / "suite.yaml"), "--out", str(tmp_path / "t"),
                 "--windows", "1,3", "--tokenizer", str(tokenizer_dir)]) == 0
    res = json.loads((tmp_path / "t" / "track.json").read_text())
    windows = [(p["window"], p["steps"]) for p in res["points"]]
    assert windows == [(0, [4]), (1, [3, 4]), (3, [1, 2, 3, 4])]
    assert res["points"][2]["coefficients"] == pytest.approx(merge_coefficients(3).tolist())
    assert res["best"]["4"]["window"] in (1, 3)
    # merges change the model: their scores differ from the raw checkpoint's
    avgs = [p["average"] for p in res["points"]]
    assert len(set(np.round(avgs, 9))) > 1
    assert best_per_point([]) == {}
