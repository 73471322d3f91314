"""proxy_eval's scorer as an lm-evaluation-harness model: `lm_eval --model purokit --model_args checkpoint=DIR`.

`PurokitLM` opens a trainer checkpoint (or run / checkpoints directory: the latest) or a Hugging Face
model directory with `open_scorer` and answers the harness's three request types with
`CausalLMScorer`: `loglikelihood` (summed log-probability, is-greedy), `loglikelihood_rolling`
(log-likelihood of the whole text) and `generate_until` (greedy; `until` stop strings plus the
end-of-text token, `max_gen_toks`). Scores are the scorer's, so they do not depend on the batch size.

The harness finds the model by name through its registry: `purokit` is declared in the
`lm_eval.models` entry-point group (pyproject.toml), which lm-eval's registry scans for plugins;
for lm-eval releases whose registry does not scan it yet, `proxy_eval.lm_eval_plugin` adds the
entry points at the moment the registry is imported (see there).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from tqdm import tqdm

from proxy_eval.loading import open_scorer
from proxy_eval.models import CausalLMScorer

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_GEN_TOKS = 256
CHUNK_BATCHES = 16    # requests go to the scorer in chunks of this many batches (a progress step each)


def parse_batch_size(value: Any) -> int:
    """The harness's `--batch_size`: an integer, or 'auto' / 'auto:N' (scores do not depend on the
    batch size here, so 'auto' takes the default instead of probing memory)."""
    if value is None or (isinstance(value, str) and value.startswith("auto")):
        return DEFAULT_BATCH_SIZE
    size = int(value)
    if size < 1:
        raise ValueError(f"batch_size must be at least 1, got {value!r}")
    return size


def generation_settings(gen_kwargs: dict, eos_text: str | None, default_max: int) -> tuple[tuple[str, ...], int]:
    """(stop strings, max new tokens) of a `generate_until` request, read as the harness's HF model
    reads them (its `normalize_gen_kwargs`, `handle_stop_sequences`: the end-of-text string is a
    stop too). Sampling is refused: this model decodes greedily."""
    kwargs = normalize_gen_kwargs(dict(gen_kwargs), default_max)
    if kwargs.get("do_sample"):
        raise ValueError(f"purokit decodes greedily; the task asks for sampling ({gen_kwargs})")
    until = handle_stop_sequences(kwargs.get("until"), eos=eos_text)
    return tuple(until), int(kwargs["max_gen_toks"])


@register_model("purokit")
class PurokitLM(LM):
    """`--model_args checkpoint=DIR[,tokenizer=PATH,max_length=N,prefix_contexts=True,max_gen_toks=N]`;
    `--batch_size` and `--device` (default: cuda where there is one) as for any harness model."""

    def __init__(self, checkpoint: str | None = None, pretrained: str | None = None, tokenizer: str | None = None,
                 device: str | None = None, batch_size: Any = DEFAULT_BATCH_SIZE, max_length: int | None = None,
                 prefix_contexts: bool = False, max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, max_batch_size: Any = None):
        super().__init__()
        path = checkpoint or pretrained
        if not path:
            raise ValueError("purokit needs --model_args checkpoint=DIR (a trainer checkpoint or an HF model directory)")
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.scorer: CausalLMScorer = open_scorer(path, tokenizer=tokenizer, device=device,
                                                  max_length=max_length, prefix_contexts=bool(prefix_contexts))
        self.batch_size = parse_batch_size(batch_size)
        self.max_gen_toks = int(max_gen_toks)
        self.path = str(path)

    @property
    def tokenizer_name(self) -> str:
        return getattr(self.scorer.tokenizer, "name", "") or self.path

    def _chunks(self, n: int, what: str) -> Iterable[range]:
        """Index ranges of the requests, one progress step each as it is scored."""
        step = self.batch_size * CHUNK_BATCHES
        return tqdm([range(i, min(n, i + step)) for i in range(0, n, step)], desc=f"purokit {what}",
                    disable=n <= step)

    def loglikelihood(self, requests: Sequence[Any]) -> list[tuple[float, bool]]:
        pairs = [tuple(r.args) for r in requests]
        out: list[tuple[float, bool]] = []
        for part in self._chunks(len(pairs), "loglikelihood"):
            scores = self.scorer.loglikelihood([pairs[i] for i in part], batch_size=self.batch_size)
            for i, s in zip(part, scores):
                out.append((s.logprob, s.is_greedy))
                self.cache_hook.add_partial("loglikelihood", pairs[i], out[-1])
        return out

    def loglikelihood_rolling(self, requests: Sequence[Any]) -> list[float]:
        texts = [r.args[0] for r in requests]
        out: list[float] = []
        for part in self._chunks(len(texts), "loglikelihood_rolling"):
            scores = self.scorer.loglikelihood_rolling([texts[i] for i in part], batch_size=self.batch_size)
            for i, s in zip(part, scores):
                out.append(-s.nll_nats)
                self.cache_hook.add_partial("loglikelihood_rolling", (texts[i],), out[-1])
        return out

    def generate_until(self, requests: Sequence[Any]) -> list[str]:
        """Requests grouped by their (stop strings, max new tokens), each group decoded greedily."""
        eos = self.scorer.eos_token_id
        eos_text = self.scorer.tokenizer.decode([eos]) if eos is not None else None
        groups: dict[tuple[tuple[str, ...], int], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(generation_settings(r.args[1], eos_text, self.max_gen_toks), []).append(i)
        out: list[str] = [""] * len(requests)
        for (stop, max_new), idx in groups.items():
            for part in self._chunks(len(idx), "generate_until"):
                chosen = [idx[j] for j in part]
                texts = self.scorer.generate([requests[i].args[0] for i in chosen], max_new, stop=stop,
                                             batch_size=self.batch_size)
                for i, text in zip(chosen, texts):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", tuple(requests[i].args), text)
        return out
