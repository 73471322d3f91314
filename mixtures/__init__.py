"""mixtures: mixture specs, rank-aligned curriculum buckets, static token shards and their reader.

The trainer reads tokens only through `ShardReader` / `EvalReader` (mixtures.reader). Spark is
optional to this package and never imported at module level.
"""

from mixtures.reader import EvalReader, ShardReader
from mixtures.shards import (ShardError, ShardManifest, ShardSet, TokenizerIdentity, TokenizerMismatch,
                             write_token_lists)

__all__ = ["EvalReader", "ShardReader", "ShardError", "ShardManifest", "ShardSet", "TokenizerIdentity",
           "TokenizerMismatch", "write_token_lists"]
