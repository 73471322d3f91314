"""datatrove's quality filters, run unchanged inside Spark as annotators.

Gopher quality, Gopher repetition, C4 quality and FineWeb quality need nothing from the network
(datatrove's English word tokenizer is `spacy.blank("en")`). C4 bad-words downloads its word list
at run time, so here it must be given a local list (`words_file`); the list is placed where
datatrove's own downloader would have cached it, and datatrove's code runs as is. Without
`words_file` the config is rejected with a message saying so (kaiyuan.config).

Each document gets `filter.<name>` (True = datatrove would keep it) and `filter.<name>.reason`
(datatrove's drop reason, null when kept). A filter that raises on a document gives null and
the reason "error: <exception>", which the score job counts.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Callable

import pyarrow as pa

from purokit.document import filter_column, filter_reason_column
from kaiyuan.annotators import Annotator, check_file, register

FILTER_CLASSES = {
    "gopher_quality": ("datatrove.pipeline.filters", "GopherQualityFilter"),
    "gopher_repetition": ("datatrove.pipeline.filters", "GopherRepetitionFilter"),
    "c4_quality": ("datatrove.pipeline.filters", "C4QualityFilter"),
    "fineweb_quality": ("datatrove.pipeline.filters", "FineWebQualityFilter"),
    "c4_badwords": ("datatrove.pipeline.filters", "C4BadWordsFilter"),
}


def make_filter(name: str, kwargs: dict[str, Any], language: str = "en"):
    import importlib

    module, cls_name = FILTER_CLASSES[name]
    cls = getattr(importlib.import_module(module), cls_name)
    kw = dict(kwargs)
    if name in ("gopher_quality", "gopher_repetition", "c4_quality", "fineweb_quality"):
        kw.setdefault("language", language)
    if name == "c4_badwords":
        kw.setdefault("default_language", language)
    return cls(**kw)


def seed_badwords_cache(words_file: str, language: str) -> str:
    """Put a local bad-words list where datatrove's C4BadWordsFilter looks for its download
    (HF assets cache, with the `.completed` marker its downloader writes)."""
    from datatrove.io import cached_assets_path
    from datatrove.pipeline.filters import c4_filters
    from fsspec.core import strip_protocol

    url = c4_filters._EN_BADWORDS_URL if language == "en" else c4_filters._BADWORDS_URL + language
    directory = cached_assets_path(library_name="datatrove", namespace="filters", subfolder="c4_badwords")
    target = os.path.join(directory, strip_protocol(url).replace("/", "_"))
    tmp = f"{target}.kaiyuan-{os.getpid()}"
    shutil.copyfile(words_file, tmp)
    os.replace(tmp, target)
    open(f"{target}.completed", "a").close()
    return target


@register("datatrove")
class DatatroveFilter(Annotator):
    def __init__(self, config):
        super().__init__(config)
        self.name = config.column
        self._filter = None

    def output_fields(self) -> list[pa.Field]:
        return [pa.field(filter_column(self.name), pa.bool_()), pa.field(filter_reason_column(self.name), pa.string())]

    def files(self) -> list[str]:
        if self.config.filter == "c4_badwords":
            return [check_file(self.config.words_file, "c4_badwords words_file")]
        return []

    def setup(self, resolve: Callable[[str], str]) -> None:
        if self.config.filter == "c4_badwords":
            seed_badwords_cache(resolve(self.config.words_file), self.config.language)
        self._filter = make_filter(self.config.filter, self.config.kwargs, self.config.language)

    def annotate(self, texts: list[str]) -> dict[str, list]:
        from datatrove.data import Document
        from datatrove.pipeline.filters.base_filter import get_filter_result

        passed: list = []
        reasons: list = []
        for i, text in enumerate(texts):
            try:
                ok, reason = get_filter_result(self._filter.filter(Document(text=text, id=str(i), metadata={})))
            except Exception as e:  # a filter bug on one odd document must not kill the job
                passed.append(None)
                reasons.append(f"error: {type(e).__name__}: {str(e)[:200]}")
                continue
            passed.append(bool(ok))
            reasons.append(None if ok else (reason or "filtered"))
        return {filter_column(self.name): passed, filter_reason_column(self.name): reasons}
