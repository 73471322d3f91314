"""The benchmark task registry: four formats, documents from local files or `datasets`, prompts.

A task is a typed config (`TaskConfig`): where its documents are, which *preset* maps the raw
records to the format's canonical fields, the prompt template, few-shot settings and the format's
knobs. A suite (`SuiteConfig`) lists tasks, maps them to capability groups (General, Math, Code,
Chinese, ...; Puro §3.6.1) and fixes the batch size and seeds.

Formats and their canonical document fields:

| format            | fields                                   | primary metric                           |
|-------------------|------------------------------------------|------------------------------------------|
| `multiple_choice` | query, choices (list), gold (int)        | OLMES best of cloze / lettered forms     |
| `generate`        | question, answer, solution (few-shot)    | exact match of the extracted answer      |
| `code`            | prompt, test, entry_point, solution      | pass@1 in `purokit.sandbox`               |
| `bits_per_byte`   | text                                     | bits per byte (lower is better)          |

Presets convert well-known layouts (ARC, HellaSwag, PIQA, BoolQ, MMLU, GSM8K, MATH, HumanEval,
MBPP) and `canonical` takes the fields by name (renamed with `fields`). Loading needs no network:
jsonl (optionally .gz/.zst), parquet, or a directory written by `datasets.save_to_disk`; a hub name
works only where the hub is reachable.
"""

from __future__ import annotations

import gzip
import io
import random
import re
import string
import zlib
from pathlib import Path
from typing import IO, Any, Callable, Iterator, Literal

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from pydantic import BaseModel, ConfigDict, Field, model_validator

from purokit.config import StrictModel, iter_jsonl, repeated
from purokit.errors import ContractError
from purokit.log import get_logger
from proxy_eval import layouts as L
from proxy_eval.extract import gsm8k_gold, last_boxed
from proxy_eval.layouts import RecordError

Format = Literal["multiple_choice", "generate", "code", "bits_per_byte"]
log = get_logger(__name__)
LETTERS = string.ascii_uppercase


class DataSource(StrictModel):
    path: str
    kind: Literal["auto", "jsonl", "parquet", "hf_disk", "hf_hub"] = "auto"
    split: str | None = None          # for a DatasetDict / hub dataset
    name: str | None = None           # hub config name
    limit: int | None = None          # first N records (after reading, before few-shot removal)


class TaskConfig(StrictModel):
    name: str
    format: Format
    group: str = "General"
    source: DataSource
    preset: str = "canonical"
    fields: dict[str, str] = Field(default_factory=dict)   # canonical field -> raw field (canonical preset)
    template: str | None = None        # prompt; `{query}` / `{question}` / `{prompt}`; preset default if None
    letters_template: str | None = None
    num_fewshot: int = 0
    fewshot_source: DataSource | None = None   # default: drawn from the task's own documents (then excluded)
    fewshot_seed: int = 1234
    # `seeded`: a seeded sample; `first_n`: the first examples in file order (lm-eval's `first_n`
    # sampler, what its MMLU, CMMLU and C-Eval tasks use on their dev split)
    fewshot_sampler: Literal["seeded", "first_n"] = "seeded"
    limit: int | None = None           # evaluate the first N documents (after few-shot removal)
    # a record that does not fit its layout: `error` names file, record and field; `skip` leaves it
    # out, counted in the results (`detail.skipped_records`) and logged
    bad_records: Literal["error", "skip"] = "error"
    # multiple choice
    # default: the preset's (both for the cloze-able harness tasks; cloze alone where the harness
    # prompt already lists lettered options, as `mmlu`, or for partial scoring, as `winogrande`)
    forms: list[Literal["cloze", "letters"]] | None = None
    # a line before the few-shot examples and the question (lm-eval's `description`); presets whose
    # records name a subject (MMLU, MMLU-Pro) set it per record unless this is given
    description: str | None = None
    # acc_norm: log-likelihood per character of the choice (lm-eval); acc_bytes: per UTF-8 byte
    cloze_metric: Literal["acc", "acc_norm", "acc_bytes", "prob_correct"] = "acc_norm"
    letters_metric: Literal["acc", "prob_correct"] = "acc"
    # `olmes`: the better of the forms per model; `prob_correct`: the cloze form's gold probability,
    # a likelihood metric for tiny proxies whose accuracies sit at chance
    primary: Literal["olmes", "cloze", "letters", "prob_correct"] = "olmes"
    # generate / code
    max_new_tokens: int = 256
    stop: list[str] | None = None
    # code
    timeout_s: float = 10.0
    memory_mb: int = 1024
    code_workers: int = 2

    @model_validator(mode="after")
    def _check(self) -> "TaskConfig":
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; known: {', '.join(sorted(PRESETS))}")
        want = PRESETS[self.preset].format
        if want is not None and want != self.format:
            raise ValueError(f"preset {self.preset!r} is for format {want!r}, the task says {self.format!r}")
        if self.format == "multiple_choice" and self.forms is not None and not self.forms:
            raise ValueError("a multiple_choice task needs at least one form")
        return self

    @property
    def higher_is_better(self) -> bool:
        return self.format != "bits_per_byte"

    @property
    def primary_metric(self) -> str:
        return {"multiple_choice": "score", "generate": "exact_match", "code": "pass@1",
                "bits_per_byte": "bits_per_byte"}[self.format]


class SuiteConfig(StrictModel):
    """A benchmark suite. `groups` (task -> group) overrides each task's `group`."""

    name: str = "suite"
    tasks: list[TaskConfig]
    groups: dict[str, str] = Field(default_factory=dict)
    batch_size: int = Field(8, ge=1)
    seed: int = 1234
    max_length: int | None = None       # cap on the model's context; default: the model's own

    @model_validator(mode="after")
    def _check(self) -> "SuiteConfig":
        names = [t.name for t in self.tasks]
        dup = repeated(names)
        if dup:
            raise ValueError(f"duplicate task names: {dup}")
        unknown = sorted(set(self.groups) - set(names))
        if unknown:
            raise ValueError(f"groups names tasks that are not in the suite: {unknown}")
        return self

    def group_of(self, task: str) -> str:
        if task in self.groups:
            return self.groups[task]
        return next(t.group for t in self.tasks if t.name == task)


# ---- reading records -------------------------------------------------------------------------

def _open_binary(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")
    if path.suffix == ".zst":
        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True))
    return open(path, "rb")


def _text_lines(fh: IO[bytes], path: Path) -> Iterator[str]:
    """Each line as text; a byte that is not UTF-8 names the file, the line and the byte (a UTF-16
    file is told by its byte-order mark); a UTF-8 byte-order mark is dropped."""
    for i, raw in enumerate(fh, 1):
        if i == 1:
            if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise ContractError(path, "is UTF-16 text (byte-order mark); convert it to UTF-8")
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ContractError(f"{path}:{i}", f"not UTF-8: byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the "
                                "line; convert the file to UTF-8") from None


def _read_jsonl(path: Path) -> list[tuple[str, dict[str, Any]]]:
    if not path.is_file():
        raise ContractError(path, "not found")
    records: list[tuple[str, dict[str, Any]]] = []
    try:
        with _open_binary(path) as fh:
            for line, rec in iter_jsonl(_text_lines(fh, path), path, where="{path}:{line}"):
                if not isinstance(rec, dict):
                    raise ContractError(f"{path}:{line}", "expected a JSON object per line")
                records.append((f"{path} record {len(records)} (line {line})", rec))
    except (EOFError, OSError, zlib.error, zstandard.ZstdError) as e:
        done = f"after record {len(records) - 1}" if records else "before the first record"
        raise ContractError(path, f"cannot be read {done}: {str(e) or type(e).__name__} (a cut or damaged "
                            "file?)") from None
    return records


def read_records(source: DataSource) -> list[dict[str, Any]]:
    """Raw records in file order. Malformed jsonl lines fail loudly with file and line."""
    return [rec for _, rec in read_located_records(source)]


def read_located_records(source: DataSource) -> list[tuple[str, dict[str, Any]]]:
    """(where, raw record) in file order: `where` names the file and the record (and its line in
    a jsonl file). Unreadable files, bytes and lines fail naming the file (and line)."""
    path = Path(source.path)
    kind = source.kind
    if kind == "auto":
        name = path.name.lower()
        if path.is_dir():
            kind = "hf_disk"
        elif re.search(r"\.jsonl?(\.gz|\.zst)?$", name):
            kind = "jsonl"
        elif name.endswith(".parquet"):
            kind = "parquet"
        elif not path.exists():
            kind = "hf_hub"
        else:
            raise ContractError(path, "cannot tell the format (expected .jsonl[.gz|.zst], .parquet, or a "
                                "datasets directory); set source.kind")
    records: list[dict[str, Any]]
    if kind == "jsonl":
        located = _read_jsonl(path)
        return located[:source.limit] if source.limit is not None else located
    if kind == "parquet":
        try:
            records = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as e:
            raise ContractError(path, f"not a readable parquet file ({e})") from None
    else:
        if kind == "hf_disk":
            try:
                ds = datasets.load_from_disk(str(path))
            except (FileNotFoundError, ValueError) as e:
                raise ContractError(path, f"not a `datasets.save_to_disk` directory ({e})") from None
        else:
            ds = datasets.load_dataset(source.path, source.name, split=source.split)
        if isinstance(ds, datasets.DatasetDict):
            if source.split is None:
                raise ContractError(path, f"is a DatasetDict with splits {list(ds)}; set source.split")
            ds = ds[source.split]
        records = [dict(r) for r in ds]
    if source.limit is not None:
        records = records[:source.limit]
    return [(f"{path} record {i}", rec) for i, rec in enumerate(records)]


# ---- presets: raw record -> canonical document --------------------------------------------------
#
# The lm-evaluation-harness presets reproduce the harness's task definitions (lm_eval/tasks/*.yaml
# and their utils.py, v0.4): the same fields of the public dataset layouts, label conventions,
# preprocessing, prompt (`doc_to_text`), choices (`doc_to_choice`), target delimiter and
# description line. A test scores each against lm_eval itself (tests/proxy_eval/test_lm_eval_parity.py).

class Preset(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)
    format: Format | None
    convert: Callable[[dict[str, Any], dict[str, str]], dict[str, Any]]
    template: str = ""
    letters_template: str = "Question: {query}\n{options}Answer:"
    stop: list[str] = Field(default_factory=list)
    program: Literal["prompt+completion", "completion"] = "prompt+completion"
    forms: list[Literal["cloze", "letters"]] = Field(default_factory=lambda: ["cloze", "letters"])
    target_delimiter: str = " "        # between the prompt and a choice / target (lm-eval's default)
    # generate: how the answer is read from a generation and compared; None = Puro's postprocessor
    # (proxy_eval.extract); else the harness filter (regex, first match) and exact_match options
    answer_regex: str | None = None
    match_ignore: list[str] = Field(default_factory=list)
    match_ignore_case: bool = False
    match_ignore_punctuation: bool = False


def _get(rec: dict[str, Any], fields: dict[str, str], key: str, default: Any = ...) -> Any:
    raw = fields.get(key, key)
    node: Any = rec
    for part in raw.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        else:
            if default is not ...:
                return default
            raise RecordError(raw, f"missing (for {key!r}; the record has {sorted(rec)[:12]})")
    return node


def _gold_index(gold: Any, choices: list[str], field: str = "gold", base: int = 0) -> int:
    """A canonical record's gold answer as a 0-based choice index: an int or digit string (`base`
    1 for 1-based layouts such as SIQA's), a letter, or the choice text itself; never a boolean."""
    if isinstance(gold, bool) or not isinstance(gold, (int, str)):
        raise RecordError(field, f"expected a choice index, letter or text, found {L.kind_of(gold)}")
    g = str(gold).strip()
    if g.lstrip("-").isdigit():
        i = int(g) - base
    elif len(g) == 1 and g.upper() in LETTERS[:len(choices)]:
        i = LETTERS.index(g.upper())
    elif g in choices:
        i = choices.index(g)
    else:
        raise RecordError(field, f"cannot map gold answer {gold!r:.40} onto {len(choices)} choices")
    if not 0 <= i < len(choices):
        raise RecordError(field, f"gold {gold!r} is outside the {len(choices)} choices")
    return i


def _canonical(rec: dict[str, Any], fields: dict[str, str], base: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("query", "choices", "gold", "question", "answer", "solution", "prompt", "test", "entry_point", "text"):
        val = _get(rec, fields, key, None)
        if val is not None:
            out[key] = val
    if "choices" in out:
        out["choices"] = L.text_list(rec, fields.get("choices", "choices"), value=out["choices"])
        out["gold"] = _gold_index(out.get("gold"), out["choices"], fields.get("gold", "gold"), base=base)
    if "answer" in out:
        if isinstance(out["answer"], (dict, list, bool)):
            raise RecordError(fields.get("answer", "answer"), f"expected text, found {L.kind_of(out['answer'])}")
        out["answer"] = str(out["answer"])
        out.setdefault("solution", out["answer"])
    return out


def _canonical_1based(rec, fields):
    return _canonical(rec, fields, base=1)


def letter_options(choices: list[str], indent: str = " ") -> str:
    """` A. x\n B. y\n` (the OLMES letters form), or with indent "" the harness's `A. x\nB. y\n`."""
    return "".join(f"{indent}{LETTERS[i]}. {c}\n" for i, c in enumerate(choices))


def _arc(rec, fields):
    block = L.field(rec, "choices")
    if not isinstance(block, dict):
        raise RecordError("choices", f"expected an object with text and label lists, found {L.kind_of(block)}")
    choices = L.text_list(block, "choices.text", value=block.get("text"))
    labels = L.text_list(block, "choices.label", value=block.get("label"), at_least=len(choices))
    if len(labels) != len(choices):
        raise RecordError("choices.label", f"{len(labels)} labels for {len(choices)} choices")
    return {"query": L.text(rec, "question"), "choices": choices, "gold": L.label(rec, "answerKey", labels)}


def hellaswag_preprocess(text: str) -> str:
    """lm-eval's hellaswag `preprocess`: WikiHow's `[title]` becomes a sentence break, other
    bracketed artifacts go, double spaces collapse."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _string(rec, key: str, default: str = "") -> str:
    """An optional string field (may be empty); null or absent is `default`."""
    value = rec.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise RecordError(key, f"expected a string, found {L.kind_of(value)}")
    return value


def _hellaswag(rec, fields):
    if "ctx_a" in rec:
        ctx = L.text(rec, "ctx_a") + " " + _string(rec, "ctx_b").capitalize()
    else:
        ctx = L.text(rec, "ctx")
    if _string(rec, "activity_label"):
        ctx = rec["activity_label"] + ": " + ctx
    endings = L.text_list(rec, "endings")
    return {"query": hellaswag_preprocess(ctx), "choices": [hellaswag_preprocess(e) for e in endings],
            "gold": L.index(rec, "label", len(endings), digit_string=True)}


def _piqa(rec, fields):
    return {"query": L.text(rec, "goal"), "choices": [L.text(rec, "sol1"), L.text(rec, "sol2")],
            "gold": L.index(rec, "label", 2)}


def _siqa(rec, fields):
    """Social IQa (`lighteval/siqa`, lm-eval `social_iqa`): labels are 1-based ("1".."3")."""
    choices = [L.text(rec, k) for k in ("answerA", "answerB", "answerC")]
    return {"query": f"{L.text(rec, 'context')} {L.text(rec, 'question')}", "choices": choices,
            "gold": L.index(rec, "label", 3, base=1, digit_string=True)}


def _winogrande(rec, fields):
    """WinoGrande partial scoring (lm-eval `winogrande`): each option fills the blank and is its own
    context; the shared continuation is the sentence after the blank."""
    sentence = L.text(rec, "sentence")
    i = sentence.find("_")
    if i < 0:
        raise RecordError("sentence", "has no '_' blank for the options to fill")
    contexts = [sentence[:i] + L.text(rec, "option1"), sentence[:i] + L.text(rec, "option2")]
    return {"query": sentence, "choices": contexts, "continuation": sentence[i + 1:].strip(),
            "gold": L.label(rec, "answer", ["1", "2"])}


def _boolq(rec, fields):
    """BoolQ in the `super_glue/boolq` layout (`label` 0 = no, 1 = yes, what lm-eval reads) or
    google/boolq's (`answer` true/false)."""
    if "label" in rec:
        gold = L.index(rec, "label", 2)
    elif isinstance(L.field(rec, "answer"), bool):
        gold = int(rec["answer"])
    else:
        raise RecordError("answer", f"expected true or false, found {L.kind_of(rec['answer'])}")
    return {"query": f"{L.text(rec, 'passage')}\nQuestion: {L.text(rec, 'question')}?", "choices": ["no", "yes"],
            "gold": gold}


def _subject(rec) -> str:
    return str(rec.get("subject", "")).replace("_", " ")


def _mmlu_fields(rec) -> tuple[str, list[str], int]:
    """MMLU's layout (`cais/mmlu`): question, a list of choices, answer as the 0-based index."""
    choices = L.text_list(rec, "choices")
    return L.text(rec, "question").strip(), choices, L.index(rec, "answer", len(choices))


def _mmlu_continuation(rec, fields):
    """lm-eval `mmlu_<subject>_continuation`: cloze over the choice texts, with the subject line."""
    query, choices, gold = _mmlu_fields(rec)
    out = {"query": query, "choices": choices, "gold": gold}
    if rec.get("subject"):
        out["description"] = f"The following are questions (with answers) about {_subject(rec)}.\n\n"
    return out


def _mmlu(rec, fields):
    """lm-eval `mmlu_<subject>`: the options listed in the prompt, the letters A-D as the choices."""
    query, texts, gold = _mmlu_fields(rec)
    out = {"query": query, "options": letter_options(texts, indent=""), "choices": list(LETTERS[:len(texts)]),
           "gold": gold}
    if rec.get("subject"):
        out["description"] = f"The following are multiple choice questions (with answers) about {_subject(rec)}.\n\n"
    return out


def _lettered_zh(question: str, answer: str):
    def convert(rec, fields):
        texts = [L.text_or_number(rec, k) for k in "ABCD"]
        return {"query": L.text(rec, question).strip(), "options": letter_options(texts, indent=""),
                "choices": list("ABCD"), "gold": L.label(rec, answer, list("ABCD"))}
    return convert


def _mmlu_pro(rec, fields):
    """lm-eval `mmlu_pro_<category>` (generative, chain of thought): `format_cot_example` of the
    harness's utils.py; the answer is the letter after "the answer is"."""
    options = L.text_list(rec, "options")[:10]
    opts = "".join(f"{LETTERS[i]}. {o.strip()}\n" for i, o in enumerate(options))
    cot = _string(rec, "cot_content").replace("A: Let's think step by step. ", "")
    answer = LETTERS[L.label(rec, "answer", list(LETTERS[:len(options)]))]
    out = {"question": "Question:\n" + L.text(rec, "question") + "\nOptions:\n" + opts
           + "Answer: Let's think step by step.", "answer": answer, "solution": cot}
    if _string(rec, "category"):
        out["description"] = (f"The following are multiple choice questions (with answers) about {rec['category']}. "
                              "Think step by step and then finish your answer with \"the answer is (X)\" where X is "
                              "the correct letter choice.\n")
    return out


def _bbh(rec, fields):
    target = L.text(rec, "target")
    return {"question": L.text(rec, "input"), "answer": target, "solution": target}


def _gsm8k(rec, fields):
    solution = L.text(rec, "answer")
    if "####" not in solution or not gsm8k_gold(solution).strip():
        raise RecordError("answer", "has no '#### <answer>' line, the GSM8K layout's final answer")
    return {"question": L.text(rec, "question"), "answer": gsm8k_gold(solution), "solution": solution}


def _math(rec, fields):
    solution = L.text(rec, "solution")
    boxed = last_boxed(solution)
    if boxed and boxed.strip():
        answer = boxed
    elif rec.get("answer") is not None:
        answer = L.text_or_number(rec, "answer")
    else:
        raise RecordError("solution", "has neither a \\boxed{...} answer nor an `answer` field")
    return {"question": L.text(rec, "problem"), "answer": answer, "solution": solution}


def _humaneval(rec, fields):
    entry = L.text(rec, "entry_point")
    return {"prompt": L.text(rec, "prompt"), "test": L.text(rec, "test") + f"\n\ncheck({entry})\n",
            "entry_point": entry, "solution": _string(rec, "canonical_solution")}


def _mbpp(rec, fields):
    text = L.text(rec, "prompt") if rec.get("prompt") is not None else L.text(rec, "text")
    tests = L.text_list(rec, "test_list", at_least=1)
    imports = L.text_list(rec, "test_imports", at_least=0) if rec.get("test_imports") is not None else []
    prompt = (f"You are an expert Python programmer, and here is your task: {text} "
              f"Your code should pass these tests:\n\n" + "\n".join(tests) + "\n[BEGIN]\n")
    return {"prompt": prompt, "test": "\n".join(imports + tests) + "\n", "entry_point": None,
            "solution": _string(rec, "code")}


def _text(rec, fields):
    value = _get(rec, fields, "text")
    if not isinstance(value, str):
        raise RecordError(fields.get("text", "text"), f"expected text, found {L.kind_of(value)}")
    return {"text": L.check_text(fields.get("text", "text"), value)}


_CLOZE = ["cloze"]
PRESETS: dict[str, Preset] = {
    "canonical": Preset(format=None, convert=_canonical, template=""),
    "canonical_1based": Preset(format=None, convert=_canonical_1based, template=""),
    # lm-evaluation-harness task definitions
    "arc": Preset(format="multiple_choice", convert=_arc, template="Question: {query}\nAnswer:"),
    "hellaswag": Preset(format="multiple_choice", convert=_hellaswag, template="{query}",
                        letters_template="{query}\n{options}Answer:"),
    "piqa": Preset(format="multiple_choice", convert=_piqa, template="Question: {query}\nAnswer:"),
    "siqa": Preset(format="multiple_choice", convert=_siqa, template="Q: {query}\nA:",
                   letters_template="Q: {query}\n{options}A:"),
    "winogrande": Preset(format="multiple_choice", convert=_winogrande, template="{query}", forms=_CLOZE),
    "boolq": Preset(format="multiple_choice", convert=_boolq, template="{query}\nAnswer:",
                    letters_template="{query}\n{options}Answer:"),
    "mmlu": Preset(format="multiple_choice", convert=_mmlu, template="{query}\n{options}Answer:", forms=_CLOZE),
    "mmlu_continuation": Preset(format="multiple_choice", convert=_mmlu_continuation,
                                template="Question: {query}\nAnswer:"),
    "cmmlu": Preset(format="multiple_choice", convert=_lettered_zh("Question", "Answer"),
                    template="{query}\n{options}答案：", forms=_CLOZE),
    "ceval": Preset(format="multiple_choice", convert=_lettered_zh("question", "answer"),
                    template="{query}\n{options}答案：", forms=_CLOZE),
    "mmlu_pro": Preset(format="generate", convert=_mmlu_pro, template="{question}", stop=["Question:"],
                       answer_regex=r"answer is \(?([ABCDEFGHIJ])\)?", match_ignore_case=True,
                       match_ignore_punctuation=True),
    "bbh": Preset(format="generate", convert=_bbh, template="Q: {question}\nA:", stop=["</s>", "Q:", "<|im_end|>"],
                  answer_regex="", match_ignore=[r"\.$", ",", "\n", "\\\\", '"'], match_ignore_case=True),
    "gsm8k": Preset(format="generate", convert=_gsm8k, template="Question: {question}\nAnswer:",
                    stop=["Question:", "</s>", "<|im_end|>"]),
    "math": Preset(format="generate", convert=_math, template="Problem: {question}\nAnswer:", stop=["Problem:"]),
    "humaneval": Preset(format="code", convert=_humaneval, template="{prompt}",
                        stop=["\nclass", "\ndef", "\n#", "\nif", "\nprint"]),
    "mbpp": Preset(format="code", convert=_mbpp, template="{prompt}", stop=["[DONE]"], program="completion",
                   target_delimiter=""),
    "text": Preset(format="bits_per_byte", convert=_text),
}
_DEFAULT_TEMPLATES = {"multiple_choice": "Question: {query}\nAnswer:", "generate": "Question: {question}\nAnswer:",
                      "code": "{prompt}", "bits_per_byte": ""}
_DEFAULT_STOPS = {"generate": ["\n\nQuestion:", "Question:", "\n\n\n"], "code": ["\nclass ", "\ndef ", "\nif __name__", "\nprint("]}
_REQUIRED = {"multiple_choice": ("query", "choices", "gold"), "generate": ("question", "answer"),
             "code": ("prompt", "test"), "bits_per_byte": ("text",)}


def check_document(doc: dict[str, Any], fmt: str) -> None:
    """A converted document against its format: the required fields there, texts non-empty and
    encodable, at least two choices, the gold index among them."""
    missing = [k for k in _REQUIRED[fmt] if k not in doc]
    if missing:
        raise RecordError(missing[0], f"the {fmt} format needs fields {missing} (map them with `fields`)")
    for key, value in doc.items():
        if key in _REQUIRED[fmt] and key not in ("choices", "gold"):
            if not isinstance(value, str):
                raise RecordError(key, f"expected text, found {L.kind_of(value)}")
            L.check_text(key, value)
        elif isinstance(value, str) and value:
            L.check_text(key, value)
    if fmt == "multiple_choice":
        L.text_list(doc, "choices")
        gold = doc["gold"]
        if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(doc["choices"]):
            raise RecordError("gold", f"gold index {gold!r} outside {len(doc['choices'])} choices")


def to_documents(task: TaskConfig, located: list[tuple[str, dict[str, Any]]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each record converted by the task's preset and checked against its layout and format:
    (documents, skipped). A bad record is an error naming the file, record and field, or, with
    `bad_records: skip`, left out and described in `skipped`."""
    preset = PRESETS[task.preset]
    docs, skipped = [], []
    for i, (where, rec) in enumerate(located):
        try:
            doc = preset.convert(rec, task.fields)
            check_document(doc, task.format)
        except RecordError as e:
            error = ContractError(where, f"task {task.name!r} (preset {task.preset}): {e}", field=e.field)
            if task.bad_records == "error":
                raise error from None
            skipped.append(str(error))
            continue
        except (KeyError, ValueError, TypeError) as e:
            raise ContractError(where, f"task {task.name!r} (preset {task.preset}): {e}") from None
        doc["doc_id"] = i
        docs.append(doc)
    return docs, skipped


class LoadedTask(BaseModel):
    """A task ready to run: evaluation documents and the fixed few-shot examples."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    config: TaskConfig
    docs: list[dict[str, Any]]
    fewshot: list[dict[str, Any]]
    skipped: list[str] = Field(default_factory=list)     # bad records left out (`bad_records: skip`)

    @property
    def preset(self) -> Preset:
        return PRESETS[self.config.preset]

    @property
    def template(self) -> str:
        return self.config.template or self.preset.template or _DEFAULT_TEMPLATES[self.config.format]

    @property
    def forms(self) -> list[str]:
        return list(self.config.forms if self.config.forms is not None else self.preset.forms)

    @property
    def stop(self) -> list[str]:
        if self.config.stop is not None:
            return self.config.stop
        return self.preset.stop or _DEFAULT_STOPS.get(self.config.format, [])

    def description(self, doc: dict[str, Any]) -> str:
        if self.config.description is not None:
            return self.config.description
        return str(doc.get("description", ""))


def load_task(task: TaskConfig) -> LoadedTask:
    """Documents plus a fixed, seeded set of few-shot examples. When the examples come from the
    task's own documents they are removed from the evaluation set."""
    docs, skipped = to_documents(task, read_located_records(task.source))
    fewshot: list[dict[str, Any]] = []
    if task.num_fewshot > 0:
        rng = random.Random(task.fewshot_seed)
        first_n = task.fewshot_sampler == "first_n"
        if task.fewshot_source is not None:
            pool, skipped_shots = to_documents(task, read_located_records(task.fewshot_source))
            skipped += skipped_shots
            k = min(task.num_fewshot, len(pool))
            fewshot = pool[:k] if first_n else rng.sample(pool, k)
        else:
            k = min(task.num_fewshot, max(0, len(docs) - 1))
            picked = list(range(k)) if first_n else sorted(rng.sample(range(len(docs)), k))
            fewshot = [docs[i] for i in picked]
            chosen = set(picked)
            docs = [d for i, d in enumerate(docs) if i not in chosen]
    if task.limit is not None:
        docs = docs[:task.limit]
    if not docs:
        raise ContractError(task.source.path, f"task {task.name!r} has no documents to evaluate"
                            + (f" ({len(skipped)} bad records skipped)" if skipped else ""))
    if skipped:
        log.warning("task %s: skipped %d bad records; the first: %s", task.name, len(skipped), skipped[0])
    return LoadedTask(config=task, docs=docs, fewshot=fewshot, skipped=skipped)


# ---- prompts ---------------------------------------------------------------------------------

def render(template: str, doc: dict[str, Any]) -> str:
    """A prompt template filled from the document's fields (`{query}`, `{options}`, `{passage}`...)."""
    try:
        return template.format_map(doc)
    except KeyError as e:
        raise ContractError(f"document {doc.get('doc_id')}", f"the template names {e} but the document has only "
                            f"{sorted(doc)}") from None


FEWSHOT_DELIMITER = "\n\n"   # between examples (lm-eval's default)


def mc_requests(task: LoadedTask, doc: dict[str, Any], form: str) -> list[tuple[str, str]]:
    """(context, continuation) per choice, as lm-eval builds them: description + few-shot
    examples + prompt, and the target delimiter + choice. Cloze: the preset's prompt and each
    choice; partial scoring (a document with a `continuation`, WinoGrande): each choice is a
    context and the continuation is shared; letters: the options listed and the letter scored."""
    delim = task.preset.target_delimiter

    def prompt(d: dict[str, Any]) -> str:
        if form == "cloze":
            return render(task.template, d)
        lt = task.config.letters_template or task.preset.letters_template
        return render(lt, {**d, "options": letter_options(d["choices"])})

    def pairs(d: dict[str, Any]) -> list[tuple[str, str]]:
        if form == "cloze" and "continuation" in d:
            return [(c, delim + d["continuation"]) for c in d["choices"]]
        answers = d["choices"] if form == "cloze" else [LETTERS[i] for i in range(len(d["choices"]))]
        return [(prompt(d), delim + a) for a in answers]

    shots = "".join("".join(pairs(s)[s["gold"]]) + FEWSHOT_DELIMITER for s in task.fewshot)
    head = task.description(doc) + shots
    return [(head + ctx, cont) for ctx, cont in pairs(doc)]


def generate_prompt(task: LoadedTask, doc: dict[str, Any]) -> str:
    shots = "".join(render(task.template, s) + task.preset.target_delimiter + s.get("solution", s["answer"]).strip()
                    + FEWSHOT_DELIMITER for s in task.fewshot)
    return task.description(doc) + shots + render(task.template, doc)


def code_prompt(task: LoadedTask, doc: dict[str, Any]) -> str:
    shots = "".join(render(task.template, s) + s.get("solution", "") + FEWSHOT_DELIMITER for s in task.fewshot)
    return task.description(doc) + shots + render(task.template, doc)


def code_program(task: LoadedTask, doc: dict[str, Any], completion: str) -> str:
    if task.preset.program == "completion":
        return completion
    return doc["prompt"] + completion
