"""train-classifier: deterministic fastText training, held-out metrics, the model card, and the
metrics' pure functions."""

import itertools
import random

import numpy as np
import pytest

from purokit.errors import ContractError
from kaiyuan.classifier import binary_metrics, read_card, roc_auc, split_heldout, train_classifier
from kaiyuan.config import TrainClassifierConfig

from .conftest import prose, write_jsonl


def test_roc_auc_equals_pairwise_definition():
    rng = random.Random(0)
    y = [rng.random() < 0.4 for _ in range(200)]
    p = [round(rng.random(), 1) for _ in range(200)]          # many ties
    pos = [s for s, t in zip(p, y) if t]
    neg = [s for s, t in zip(p, y) if not t]
    pairs = [(1.0 if a > b else 0.5 if a == b else 0.0) for a, b in itertools.product(pos, neg)]
    assert roc_auc(y, p) == pytest.approx(np.mean(pairs))


def test_binary_metrics():
    m = binary_metrics([1, 1, 0, 0, 1], [0.9, 0.4, 0.6, 0.1, 0.8])
    assert (m["precision"], m["recall"], m["accuracy"]) == (pytest.approx(2 / 3, abs=1e-4), pytest.approx(2 / 3, abs=1e-4), 0.6)


def test_heldout_split_is_seeded_and_order_free():
    texts = [f"text {i}" for i in range(1000)]
    a = split_heldout(texts, 0.2, seed=3)
    b = split_heldout(list(reversed(texts)), 0.2, seed=3)
    assert sorted(a[1]) == sorted(b[1])
    assert 150 < len(a[1]) < 250
    assert sorted(split_heldout(texts, 0.2, seed=4)[1]) != sorted(a[1])


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    d = tmp_path_factory.mktemp("labelled")
    rng = random.Random(0)
    good = [{"text": prose(rng, 120)} for _ in range(400)]
    junk = []
    for _ in range(400):
        words = prose(rng, 120).replace(".", "").lower().split()
        rng.shuffle(words)
        junk.append({"text": " | ".join(" ".join(words[i:i + 4]) for i in range(0, len(words), 4)) + " $$ @@ ##"})
    write_jsonl(d / "good.jsonl", good)
    write_jsonl(d / "junk.jsonl", junk)
    return d


def _cfg(d, out, **kw):
    return TrainClassifierConfig.model_validate({
        "name": "demo_quality", "output": str(out),
        "positives": [{"paths": [str(d / "good.jsonl")]}], "negatives": [{"paths": [str(d / "junk.jsonl")]}],
        "heldout_fraction": 0.2, "fasttext": {"epoch": 5, "dim": 16}, **kw})


def test_training_is_deterministic_and_the_card_records_metrics(labelled, tmp_path):
    a = train_classifier(_cfg(labelled, tmp_path / "a" / "m.bin"))
    b = train_classifier(_cfg(labelled, tmp_path / "b" / "m.bin"))
    assert (tmp_path / "a" / "m.bin").read_bytes() == (tmp_path / "b" / "m.bin").read_bytes()
    assert a.model_sha256 == b.model_sha256
    assert a.metrics["precision"] > 0.95 and a.metrics["recall"] > 0.95 and a.metrics["roc_auc"] > 0.98
    assert a.counts["positive_texts"] == a.counts["negative_texts"] == 400
    assert a.counts["train_positive"] == a.counts["train_negative"]         # balanced
    assert a.model_n_bytes < 60e6                              # a sensible size (bucket 200k, dim 16)
    card = read_card(str(tmp_path / "a" / "m.bin"))
    assert card.positive_label == "__label__hq" and card.config_hash == a.config_hash
    again = train_classifier(_cfg(labelled, tmp_path / "a" / "m.bin"))
    assert again.created_at == a.created_at                    # up to date: skipped
    (tmp_path / "a" / "m.bin.json").write_text('{"schema": "other/1"}')
    with pytest.raises(ContractError, match="fasttext-classifier/1"):
        read_card(str(tmp_path / "a" / "m.bin"))


def test_quantized_model_is_small_and_still_separates(labelled, tmp_path):
    card = train_classifier(_cfg(labelled, tmp_path / "q.ftz", quantize=True))
    assert card.model_n_bytes < 1e6
    assert card.metrics["roc_auc"] > 0.95
