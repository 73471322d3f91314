"""The scoring-model interface every benchmark is written against, and its adapters.

A scoring model answers three questions, all on text:
- `loglikelihood([(context, continuation)])`: summed log-probability of each continuation given its
  context (multiple choice, likelihood metrics);
- `loglikelihood_rolling([text])`: negative log-likelihood of whole texts, however long (bits per
  byte);
- `generate([prompt], max_new_tokens, stop)`: greedy continuations cut at the first stop string
  (exact match, code).

`CausalLMScorer` implements all three for any causal LM given one function from token ids to
logits, so the trainer's model and a Hugging Face `transformers` model (e.g. the trainer's export,
`Qwen3ForCausalLM`) share every line of tokenization, batching and scoring: equal logits give equal
scores. Batches are right-padded and no attention mask is needed: with causal attention the padding
after a sequence cannot change its logits, so the batch size does not change results (the
lm-evaluation-harness pain point, anchors.md §3.2). Requests are sorted by length with a
deterministic tie-break, and results are returned in request order.
"""

from __future__ import annotations

import abc
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


# ---- tokenizers ------------------------------------------------------------------------------

@runtime_checkable
class TextTokenizer(Protocol):
    """What the scorer needs of a tokenizer: `encode`/`decode` without special tokens, and an
    end-of-text id as `eos_token_id` (or `eos_id`, as `mixtures.tokenizers.Tokenizer` has it)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class HFTokenizer:
    """Wraps a `tokenizers.Tokenizer` or a `transformers` tokenizer. `encode` adds no special
    tokens unless asked; the scorer asks (`add_special_tokens=True`) where lm-eval lets the
    tokenizer add its own (a BOS for Llama-style tokenizers, nothing for GPT-2/Qwen-style ones)."""

    def __init__(self, tok: Any, eos_token: str | None = None, name: str = "", bos_token: str | None = None):
        self._tok = tok
        self.name = name
        self._fast = hasattr(tok, "encode_batch") and not hasattr(tok, "convert_tokens_to_ids")
        self.eos_token_id: int | None = self._id(eos_token, "eos_token_id")
        self.bos_token_id: int | None = self._id(bos_token, "bos_token_id")

    def _id(self, token: str | None, attr: str) -> int | None:
        if token is not None:
            return self._tok.token_to_id(token) if self._fast else self._tok.convert_tokens_to_ids(token)
        if not self._fast:
            return getattr(self._tok, attr, None)
        return None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if self._fast:
            return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size() if self._fast else len(self._tok)


_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<eos>", "<|im_end|>", "<|end_of_text|>")


def load_tokenizer(path: str | os.PathLike, eos_token: str | None = None) -> HFTokenizer:
    """A `tokenizer.json` file, or a directory holding one (what mixtures' train-tokenizer and the
    trainer's HF export write). The end-of-text token is `eos_token`, else the one named in a
    `tokenizer_config.json` beside it, else the first known end-of-text token in the vocabulary."""
    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise FileNotFoundError(f"no tokenizer.json at {path}")
    tok = Tokenizer.from_file(str(file))
    cfg_file = file.parent / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}

    def named(key: str) -> str | None:
        raw = cfg.get(key)
        raw = raw.get("content") if isinstance(raw, dict) else raw
        return raw if raw is not None and tok.token_to_id(raw) is not None else None

    if eos_token is None:
        eos_token = named("eos_token") or next((t for t in _EOS_CANDIDATES if tok.token_to_id(t) is not None), None)
    return HFTokenizer(tok, eos_token=eos_token, name=str(file), bos_token=named("bos_token"))


# ---- the interface ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ContinuationScore:
    logprob: float        # natural log, summed over the continuation's tokens
    n_tokens: int
    is_greedy: bool       # every continuation token was the argmax


@dataclass(frozen=True)
class TextScore:
    nll_nats: float       # summed negative log-likelihood of every token of the text
    n_tokens: int


@runtime_checkable
class ScoringModel(Protocol):
    name: str

    def loglikelihood(self, requests: Sequence[tuple[str, str]], batch_size: int = 8) -> list[ContinuationScore]: ...

    def loglikelihood_rolling(self, texts: Sequence[str], batch_size: int = 8) -> list[TextScore]: ...

    def generate(self, prompts: Sequence[str], max_new_tokens: int, stop: Sequence[str] = (),
                 batch_size: int = 8) -> list[str]: ...


_SPACE = re.compile(r"\s")
TAIL_SLACK = 16        # tokens a text's tail keeps beyond the window, so its cut edge stays outside it
TAIL_CHARS = 8         # first guess of characters per token when cutting a tail (doubled until enough)


def _cut_at_space(text: str, start: int) -> int:
    """The first whitespace at or after `start` (within 4096 characters), else `start`: a cut
    there keeps the pre-tokenizer's words whole."""
    m = _SPACE.search(text, start, min(len(text), start + 4096))
    return m.start() if m else start


def _split_context(context: str, continuation: str) -> tuple[str, str]:
    """Move trailing whitespace of the context onto the continuation (" Paris", not "Paris" after
    "is "), as lm-evaluation-harness does, so both tokenize the way running text would."""
    n = len(context) - len(context.rstrip())
    if n:
        return context[:-n], context[-n:] + continuation
    return context, continuation


class CausalLMScorer(abc.ABC):
    """Tokenization, batching and scoring shared by every causal LM adapter.

    Conditioning is lm-evaluation-harness's: a context is tokenized as the tokenizer does by
    default (so a BOS only where the tokenizer adds one), and the prefix token (the tokenizer's
    BOS, else its end-of-text token) conditions only what has nothing else to condition on: an
    empty context, and the first token of a rolling text. `prefix_contexts=True` prepends the
    prefix token to every context and prompt too (the OLMES / Puro-shard convention: documents
    in the training stream follow an end-of-text token)."""

    def __init__(self, tokenizer: TextTokenizer, max_length: int, name: str = "model",
                 prefix_token_id: int | None = None, device: str | torch.device = "cpu",
                 prefix_contexts: bool = False):
        self.tokenizer = tokenizer
        self.max_length = int(max_length)
        self.name = name
        eos = getattr(tokenizer, "eos_token_id", None)
        if eos is None:
            eos = getattr(tokenizer, "eos_id", None)      # mixtures.tokenizers.Tokenizer
        bos = getattr(tokenizer, "bos_token_id", None)
        pid = next((x for x in (prefix_token_id, bos, eos) if x is not None), None)
        if pid is None:
            raise ValueError("the scorer needs a token to condition on at the start of a text: give prefix_token_id "
                             "or a tokenizer with an end-of-text token")
        self.prefix_token_id = int(pid)
        self.prefix_contexts = bool(prefix_contexts)
        self.eos_token_id: int | None = None if eos is None else int(eos)
        self.device = torch.device(device)

    @abc.abstractmethod
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[batch, time] token ids -> [batch, time, vocab] next-token logits (causal)."""

    # -- helpers --
    def _encode(self, text: str) -> list[int]:
        """Tokens of a text as the tokenizer makes them by default (its own special tokens, if any)."""
        if isinstance(self.tokenizer, HFTokenizer):
            return self.tokenizer.encode(text, add_special_tokens=True)
        return self.tokenizer.encode(text)

    def _tail(self, text: str, keep: int) -> str:
        """A suffix of `text` whose tokens end as the whole text's do over at least `keep` tokens:
        only the last `max_length` tokens of a context reach the model, so a long context is
        tokenized from a tail, cut at whitespace, of at least `keep` + TAIL_SLACK tokens (grown
        until it has them) instead of whole: a 10 MB question then costs what a window does."""
        n = TAIL_CHARS * (keep + TAIL_SLACK)
        while n < len(text):
            tail = text[_cut_at_space(text, len(text) - n):]
            if len(self._encode(tail)) >= keep + TAIL_SLACK:
                return tail
            n *= 4
        return text

    def _context_prefix(self) -> list[int]:
        return [self.prefix_token_id] if self.prefix_contexts else []

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's `_encode_pair`: the continuation is what tokenizing the whole adds to the context."""
        if not context:
            return [self.prefix_token_id], self._encode(continuation)
        context, continuation = _split_context(context, continuation)
        if not continuation:
            raise ValueError(f"empty continuation for context {context[-60:]!r}")
        context = self._tail(context, self.max_length + 1)
        whole = self._encode(context + continuation)
        ctx = self._encode(context)
        return self._context_prefix() + ctx, whole[len(ctx):]

    def _forward_logits(self, rows: list[list[int]]) -> list[torch.Tensor]:
        """Next-token logits (float32) for each row of a right-padded batch, cut to the row's length.
        Callers normalize only the positions they score (a full-vocabulary log-softmax over every
        position would cost as much as the model's last layer)."""
        width = max(self._width(len(r)) for r in rows)
        pad = self.eos_token_id if self.eos_token_id is not None else 0
        batch = torch.full((len(rows), width), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            batch[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        with torch.inference_mode():
            out = self.logits(batch.to(self.device)).float().cpu()
        return [out[i, :len(r)] for i, r in enumerate(rows)]

    PAD_MULTIPLE = 32

    def _width(self, n: int) -> int:
        """The padded width of a row of n tokens: a function of n alone (rounded up to a multiple of
        PAD_MULTIPLE, at most max_length), so a row's logits never depend on its batch mates."""
        return min(max(n, self.max_length), -(-n // self.PAD_MULTIPLE) * self.PAD_MULTIPLE)

    def _batched_order(self, lengths: Sequence[int], batch_size: int) -> list[list[int]]:
        """Batches of rows of one padded width, longest first, ties by index: neither the batch size
        nor the other requests change a row's padded input (float results are then bit-identical
        across batch sizes, as kernels see the same shapes per row)."""
        order = sorted(range(len(lengths)), key=lambda i: (-self._width(lengths[i]), -lengths[i], i))
        bs = max(1, int(batch_size))
        out: list[list[int]] = []
        for i in order:
            if out and len(out[-1]) < bs and self._width(lengths[out[-1][0]]) == self._width(lengths[i]):
                out[-1].append(i)
            else:
                out.append([i])
        return out

    # -- the interface --
    def loglikelihood(self, requests: Sequence[tuple[str, str]], batch_size: int = 8) -> list[ContinuationScore]:
        rows: list[list[int]] = []
        conts: list[list[int]] = []
        for context, continuation in requests:
            ctx, cont = self._encode_pair(context, continuation)
            whole = (ctx + cont)[-(self.max_length + 1):]
            rows.append(whole[:-1])
            conts.append(cont[-len(whole) + 1:] if len(cont) >= len(whole) else cont)
        results: list[ContinuationScore | None] = [None] * len(rows)
        for idx in self._batched_order([len(r) for r in rows], batch_size):
            logits = self._forward_logits([rows[i] for i in idx])
            for i, lg in zip(idx, logits):
                cont = conts[i]
                tail = torch.log_softmax(lg[-len(cont):], dim=-1)
                target = torch.tensor(cont, dtype=torch.long)
                tok_lp = tail.gather(1, target[:, None])[:, 0]
                greedy = bool((tail.argmax(dim=-1) == target).all())
                results[i] = ContinuationScore(float(tok_lp.double().sum()), len(cont), greedy)
        return results  # type: ignore[return-value]

    def loglikelihood_rolling(self, texts: Sequence[str], batch_size: int = 8) -> list[TextScore]:
        """Every token of each text is predicted once (lm-eval's rolling windows): the first window
        is the prefix token and up to `max_length` - 1 tokens; each later window predicts the next
        up to `max_length` tokens from a full window of the tokens before them."""
        windows: list[tuple[int, list[int], int]] = []   # (text index, inputs, number of targets)
        targets_of: list[list[int]] = []
        n_tokens = []
        for t, text in enumerate(texts):
            toks = self._encode(text)
            n_tokens.append(len(toks))
            for inputs, targets in rolling_windows(toks, self.prefix_token_id, self.max_length):
                windows.append((t, inputs, len(targets)))
                targets_of.append(targets)
        nll = [0.0] * len(texts)
        for idx in self._batched_order([len(w[1]) for w in windows], batch_size):
            logits = self._forward_logits([windows[i][1] for i in idx])
            for i, lg in zip(idx, logits):
                t, _, k = windows[i]
                tail = lg[-k:]
                target = torch.tensor(targets_of[i], dtype=torch.long)[:, None]
                tok_lp = tail.gather(1, target)[:, 0] - torch.logsumexp(tail, dim=-1)
                nll[t] -= float(tok_lp.double().sum())
        return [TextScore(nll[t], n_tokens[t]) for t in range(len(texts))]

    def generate(self, prompts: Sequence[str], max_new_tokens: int, stop: Sequence[str] = (),
                 batch_size: int = 8) -> list[str]:
        """Greedy decoding, cut at the first stop string or the end-of-text token. Each step runs the
        whole right-padded batch (no KV cache), so every sequence sees exactly its own tokens."""
        budget = max(1, self.max_length - max_new_tokens)
        encoded = [((self._context_prefix() + self._encode(self._tail(p, budget))) if p else [self.prefix_token_id])
                   [-budget:] for p in prompts]
        outputs: list[str] = [""] * len(prompts)
        for idx in self._batched_order([len(e) for e in encoded], batch_size):
            seqs = {i: list(encoded[i]) for i in idx}
            new: dict[int, list[int]] = {i: [] for i in idx}
            active = list(idx)
            for _ in range(max_new_tokens):
                if not active:
                    break
                logits = self._forward_logits([seqs[i][-self.max_length:] for i in active])
                still = []
                for i, lg in zip(active, logits):
                    tok = int(lg[-1].argmax())
                    if self.eos_token_id is not None and tok == self.eos_token_id:
                        continue
                    seqs[i].append(tok)
                    new[i].append(tok)
                    if stop and any(s in self.tokenizer.decode(new[i]) for s in stop):
                        continue
                    still.append(i)
                active = still
            for i in idx:
                outputs[i] = cut_at_stop(self.tokenizer.decode(new[i]), stop)
        return outputs


def rolling_windows(tokens: list[int], prefix_token: int, max_length: int) -> list[tuple[list[int], list[int]]]:
    """(inputs, targets) covering every token once: lm-eval's `get_rolling_token_windows` with
    context_len 1 and `make_disjoint_window`. The inputs' last len(targets) positions predict the
    targets."""
    if not tokens:
        return []
    first = min(max_length, len(tokens))
    out = [([prefix_token] + tokens[:first - 1], tokens[:first])]
    done = first
    while done < len(tokens):
        k = min(len(tokens) - done, max_length)
        end = done + k
        out.append((tokens[max(0, end - max_length - 1):end - 1], tokens[end - k:end]))
        done = end
    return out


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    cut = len(text)
    for s in stop:
        j = text.find(s)
        if j >= 0:
            cut = min(cut, j)
    return text[:cut]


# ---- adapters --------------------------------------------------------------------------------

class TorchModuleScorer(CausalLMScorer):
    """Any `torch.nn.Module` whose forward maps token ids to logits (the trainer's model).
    `forward` adapts other call conventions: `lambda m, ids: m(ids)["logits"]`."""

    def __init__(self, module: torch.nn.Module, tokenizer: TextTokenizer, max_length: int,
                 forward: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] | None = None, **kw: Any):
        super().__init__(tokenizer, max_length, **kw)
        self.module = module.eval().to(self.device)
        self._forward = forward or (lambda m, ids: m(ids))

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        out = self._forward(self.module, input_ids)
        return out.logits if hasattr(out, "logits") else out


class HFCausalLMScorer(CausalLMScorer):
    """A Hugging Face `transformers` causal LM (for instance the trainer's `Qwen3ForCausalLM` export)."""

    def __init__(self, model: Any, tokenizer: TextTokenizer, max_length: int | None = None, **kw: Any):
        limit = max_length or getattr(model.config, "max_position_embeddings", 2048)
        super().__init__(tokenizer, limit, **kw)
        self.model = model.eval().to(self.device)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32,
                        max_length: int | None = None, **kw: Any) -> "HFCausalLMScorer":
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        kw.setdefault("name", Path(path).name)
        return cls(model, load_tokenizer(path), max_length=max_length, **kw)

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits
