"""`train-classifier`: a supervised fastText quality classifier from labelled text, DCLM / PreSelect
style (positives = text like what we want more of, negatives = ordinary or poor text).

The held-out split is chosen by a seeded hash of each text, so it does not depend on input
order; the larger class is downsampled (seeded) when `balance` is on; training uses one thread
and a recorded seed, so the same inputs and config give a byte-identical model. Next to the model
goes its card, `<model>.json` (schema `fasttext-classifier/1`): labels, parameters, held-out
metrics, input fingerprints. `score` reads the card to know the positive label.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import xxhash

from purokit import atomic
from purokit.component import Component
from purokit.errors import ContractError
from purokit.hashing import config_hash, sha256_file
from purokit.log import get_logger
from purokit.manifest import InputFingerprint, RunManifest, fingerprints
from kaiyuan import readers
from kaiyuan.annotators.fasttext_models import load_fasttext, model_card_path, one_line, positive_probabilities
from kaiyuan.config import LabelledInput, TrainClassifierConfig
from kaiyuan.spark.components_io import component_fingerprint

log = get_logger("kaiyuan.classifier")

CARD_SCHEMA = "fasttext-classifier/1"


class ClassifierCard(RunManifest):
    SCHEMA = CARD_SCHEMA
    name: str
    model_file: str
    model_sha256: str
    model_n_bytes: int
    positive_label: str
    negative_label: str
    metrics: dict[str, float]


# ---- metrics (pure) ------------------------------------------------------------------------

def binary_metrics(y_true: Sequence[int], p: Sequence[float], threshold: float = 0.5) -> dict[str, float]:
    """Precision, recall, F1 and accuracy of `p >= threshold` against 0/1 labels, plus ROC AUC."""
    y = np.asarray(y_true, dtype=bool)
    pred = np.asarray(p, dtype=float) >= threshold
    tp = int(np.sum(pred & y))
    fp = int(np.sum(pred & ~y))
    fn = int(np.sum(~pred & y))
    tn = int(np.sum(~pred & ~y))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "accuracy": round((tp + tn) / max(1, len(y)), 4), "roc_auc": round(roc_auc(y, p), 4),
            "threshold": threshold, "n": int(len(y)), "n_positive": int(y.sum())}


def roc_auc(y_true: Sequence[int], p: Sequence[float]) -> float:
    """Area under the ROC curve = P(score of a random positive > a random negative), ties half."""
    y = np.asarray(y_true, dtype=bool)
    s = np.asarray(p, dtype=float)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s), dtype=float)
    sorted_s = s[order]
    i = 0
    while i < len(s):                      # average ranks over ties
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def unit_hash(text: str, seed: int) -> float:
    """A uniform number in [0, 1) from the text and a seed (the held-out split and sampling key)."""
    return xxhash.xxh64_intdigest(text, seed=seed) / 2**64


def split_heldout(texts: list[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    train, held = [], []
    for t in texts:
        (held if unit_hash(t, seed) < fraction else train).append(t)
    return train, held


def downsample(texts: list[str], n: int, seed: int) -> list[str]:
    """The n texts with the smallest seeded hash (independent of input order)."""
    if len(texts) <= n:
        return texts
    return sorted(texts, key=lambda t: (unit_hash(t, seed + 1), t))[:n]


def fasttext_line(label: str, text: str, max_chars: int) -> str:
    return f"{label} {one_line([text[:max_chars]])[0]}"


# ---- I/O -----------------------------------------------------------------------------------

def _input_texts(spec: LabelledInput) -> tuple[list[str], list[InputFingerprint]]:
    texts: list[str] = []
    fps: list[InputFingerprint] = []
    if spec.format == "component":
        for p in spec.paths:
            c = Component.open(p)
            fps.append(component_fingerprint(c))
            for batch in c.iter_batches([spec.text_field]):
                texts.extend(t for t in batch.column(0).to_pylist() if t)
    else:
        files = readers.discover_files(spec.paths, spec.format)
        fps.extend(fingerprints([f.path for f in files]))
        texts.extend(readers.iter_texts(files, readers.ReadOptions(text_field=spec.text_field)))
    if spec.max_docs:
        texts = texts[: spec.max_docs]
    return texts, fps


def _load(specs: list[LabelledInput]) -> tuple[list[str], list[InputFingerprint]]:
    texts, fps = [], []
    for s in specs:
        t, f = _input_texts(s)
        texts.extend(t)
        fps.extend(f)
    return texts, fps


def _train_worker(train_file: str, params: dict, quantize: int, out: str) -> None:
    import fasttext

    model = fasttext.train_supervised(
        input=train_file, dim=params["dim"], epoch=params["epoch"], lr=params["lr"], wordNgrams=params["word_ngrams"],
        minCount=params["min_count"], bucket=params["bucket"], minn=params["minn"], maxn=params["maxn"],
        loss=params["loss"], thread=params["thread"], seed=params["seed"], verbose=0)
    if quantize:
        # keep the `quantize` most useful words and n-grams, retrain them, product-quantize (.ftz)
        model.quantize(input=train_file, cutoff=quantize, retrain=True, qnorm=True)
    model.save_model(out)


def train_in_fresh_process(train_file: str, params: dict, quantize: int, out: str) -> None:
    """Run fastText training in a new interpreter. The fastText library keeps state between
    trainings in one process (with fasttext-numpy2-wheel 0.9.2 a second `train_supervised` in the
    same process can give a different model, or "Encountered NaN"); a fresh process gives the
    same model for the same data and seed every time."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        pool.submit(_train_worker, train_file, params, quantize, out).result()


def train_classifier(cfg: TrainClassifierConfig, force: bool = False) -> ClassifierCard:
    out = Path(cfg.output)
    card_path = model_card_path(str(out))
    config = cfg.model_dump(mode="json")
    pos, pos_fp = _load(cfg.positives)
    neg, neg_fp = _load(cfg.negatives)
    inputs = pos_fp + neg_fp
    if not force and card_path.is_file() and out.is_file():
        try:
            card = ClassifierCard.read(card_path)
            same_inputs = sorted((i.path, i.digest) for i in card.inputs) == sorted((i.path, i.digest) for i in inputs)
            if card.config_hash == config_hash(config) and same_inputs and sha256_file(out) == card.model_sha256:
                log.info("train-classifier %s: %s is up to date, skipped", cfg.name, out)
                return card
        except ContractError:
            pass
    if not pos or not neg:
        raise ValueError(f"train-classifier {cfg.name}: {len(pos)} positive and {len(neg)} negative texts; need both")
    pos_train, pos_held = split_heldout(pos, cfg.heldout_fraction, cfg.seed)
    neg_train, neg_held = split_heldout(neg, cfg.heldout_fraction, cfg.seed)
    if cfg.balance:
        n = min(len(pos_train), len(neg_train))
        pos_train, neg_train = downsample(pos_train, n, cfg.seed), downsample(neg_train, n, cfg.seed)
    lines = ([fasttext_line(cfg.positive_label, t, cfg.max_chars) for t in pos_train]
             + [fasttext_line(cfg.negative_label, t, cfg.max_chars) for t in neg_train])
    lines.sort(key=lambda s: (unit_hash(s, cfg.seed + 2), s))      # a seeded shuffle
    log.info("train-classifier %s: %d positive / %d negative training texts, %d / %d held out",
             cfg.name, len(pos_train), len(neg_train), len(pos_held), len(neg_held))
    p = cfg.fasttext
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kaiyuan-ft-") as tmp:
        train_file = os.path.join(tmp, "train.txt")
        with open(train_file, "w", encoding="utf-8") as fh:
            fh.write("\n".join(lines) + "\n")
        with atomic.atomic_path(out) as tmp_model:
            train_in_fresh_process(train_file, p.model_dump(), cfg.quantize_cutoff if cfg.quantize else 0, str(tmp_model))
    model = load_fasttext(str(out))
    held = pos_held + neg_held
    y = [1] * len(pos_held) + [0] * len(neg_held)
    probs = positive_probabilities(model, held, cfg.positive_label) if held else []
    metrics = binary_metrics(y, probs) if held else {}
    card = ClassifierCard(
        job="kaiyuan.train-classifier", name=cfg.name, config=config, inputs=inputs,
        counts={"positive_texts": len(pos), "negative_texts": len(neg),
                "train_positive": len(pos_train), "train_negative": len(neg_train),
                "heldout_positive": len(pos_held), "heldout_negative": len(neg_held)},
        model_file=out.name, model_sha256=sha256_file(out), model_n_bytes=out.stat().st_size,
        positive_label=cfg.positive_label, negative_label=cfg.negative_label, metrics=metrics,
        outputs=[out.name])
    atomic.write_json(card_path, card.to_json_dict())
    log.info("train-classifier %s: held-out precision %.3f recall %.3f F1 %.3f AUC %.3f (n=%d); model %s (%.1f MB)",
             cfg.name, metrics.get("precision", 0), metrics.get("recall", 0), metrics.get("f1", 0),
             metrics.get("roc_auc", 0), metrics.get("n", 0), out, out.stat().st_size / 1e6)
    return card


def read_card(model_path: str) -> ClassifierCard:
    """The validated card of a model trained here (ContractError naming the file otherwise)."""
    return ClassifierCard.read(model_card_path(model_path))


def describe_metrics(card: ClassifierCard) -> list[str]:
    m = card.metrics
    return [f"held-out precision {m.get('precision', 0):.3f}  recall {m.get('recall', 0):.3f}  "
            f"F1 {m.get('f1', 0):.3f}  accuracy {m.get('accuracy', 0):.3f}  ROC AUC {m.get('roc_auc', 0):.3f}  "
            f"(n={m.get('n', 0)}, threshold {m.get('threshold', 0.5)})",
            f"model {card.model_file}: {card.model_n_bytes / 1e6:.2f} MB, labels {card.positive_label} / {card.negative_label}"]

