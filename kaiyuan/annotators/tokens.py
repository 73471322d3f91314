"""Token counts (`n_tokens`) with a local tokenizer.json (Hugging Face `tokenizers`).

Only when the score config names a tokenizer; otherwise `n_tokens` is left out and the mixtures
package counts tokens with its own tokenizer when it materializes shards.
"""

from __future__ import annotations

from typing import Callable

import pyarrow as pa

from kaiyuan.annotators import Annotator, cached, check_file, register


def load_tokenizer(path: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(path)


@register("token_count")
class TokenCounter(Annotator):
    def output_fields(self) -> list[pa.Field]:
        return [pa.field("n_tokens", pa.int64())]

    def files(self) -> list[str]:
        return [check_file(self.config.tokenizer, "token_count tokenizer")]

    def setup(self, resolve: Callable[[str], str]) -> None:
        self._tok = cached("tokenizer", resolve(self.config.tokenizer), load_tokenizer)

    def annotate(self, texts: list[str]) -> dict[str, list]:
        encs = self._tok.encode_batch(texts, add_special_tokens=self.config.add_special_tokens)
        return {"n_tokens": [len(e.ids) for e in encs]}
