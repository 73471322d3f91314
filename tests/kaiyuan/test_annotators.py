"""Annotators outside Spark: each one's columns against its library called directly."""

import random

import pytest

from kaiyuan.annotators import build, local_resolver
from kaiyuan.config import DatatroveFilterConfig, LanguageIdConfig, MinHashConfig, ScoreConfig, TokenCountConfig

from .conftest import prose


def test_c4_badwords_from_a_local_list_equals_datatrove(tmp_path, monkeypatch):
    import huggingface_hub.utils._cache_assets as assets
    from datatrove.data import Document
    from datatrove.pipeline.filters import C4BadWordsFilter
    from datatrove.pipeline.filters.base_filter import get_filter_result

    monkeypatch.setattr(assets, "HF_ASSETS_CACHE", str(tmp_path / "assets"))     # keep the user's cache untouched
    words = tmp_path / "badwords.txt"
    words.write_text("zorkmid\nfrobnicate\n")
    cfg = DatatroveFilterConfig(type="datatrove", filter="c4_badwords", words_file=str(words))
    ann = build(cfg)
    assert ann.files() == [str(words)]
    ann.setup(local_resolver)
    texts = ["a perfectly clean sentence.", "Never FROBNICATE the widget.", "zorkmids are fine", "a zorkmid here"]
    got = ann.annotate(texts)
    ref = C4BadWordsFilter()                       # datatrove's own filter, reading the seeded list
    want = [get_filter_result(ref.filter(Document(text=t, id=str(i)))) for i, t in enumerate(texts)]
    assert got["filter.c4_badwords"] == [w[0] for w in want] == [True, False, True, False]
    assert got["filter.c4_badwords.reason"] == [None, "document_removed_with_badwords", None, "document_removed_with_badwords"]


def test_c4_badwords_without_a_list_is_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="downloads its word list"):
        DatatroveFilterConfig(type="datatrove", filter="c4_badwords")


def test_language_id_filter_and_reasons():
    ann = build(LanguageIdConfig(type="lid", languages=["en"], min_score=0.5))
    ann.setup(local_resolver)
    rng = random.Random(0)
    out = ann.annotate([prose(rng, 60), "Der schnelle braune Fuchs springt über den faulen Hund und läuft weiter."])
    assert out["lang"] == ["en", "de"]
    assert out["filter.lang"] == [True, False]
    assert out["filter.lang.reason"][1] == "language de"


def test_token_count_with_a_local_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([prose(random.Random(1), 200)], trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]"]))
    tok.save(str(tmp_path / "tokenizer.json"))
    ann = build(TokenCountConfig(type="token_count", tokenizer=str(tmp_path / "tokenizer.json")))
    ann.setup(local_resolver)
    texts = ["hello world", "the state of the people"]
    assert ann.annotate(texts)["n_tokens"] == [len(tok.encode(t).ids) for t in texts]


def test_default_annotators_and_threshold_config():
    types = [(a.type, getattr(a, "filter", None)) for a in ScoreConfig().annotators]
    assert types == [("lid", None), ("datatrove", "gopher_quality"), ("datatrove", "gopher_repetition"),
                     ("datatrove", "c4_quality"), ("datatrove", "fineweb_quality")]
    assert MinHashConfig(bands=14, rows=8).resolved(0.7) == (14, 8, 112)          # explicit bands x rows win
    assert MinHashConfig(num_perm=128, false_positive_weight=0.5).resolved(0.8) == (9, 13, 128)   # datasketch picks the same
