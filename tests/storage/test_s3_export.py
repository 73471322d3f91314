"""`python -m mixtures export` against a real S3 endpoint (moto on loopback): a shard set on s3 exported
to s3 through the commit protocol, read back (staged, sha256-checked) by Megatron-Core's
IndexedDataset and by `datasets`, token for token the set's stream; an existing export is refused."""

import numpy as np
import pytest

from purokit import storage
from mixtures import write_token_lists
from mixtures.__main__ import main
from mixtures.export import ExportRecord
from mixtures.shards import ShardSet


def test_export_s3_to_s3(bucket, capsys):
    rng = np.random.default_rng(3)
    docs = [rng.integers(2, 500, size=int(n)) for n in rng.integers(1, 60, size=120)]
    src = f"{bucket}/shards/p-curriculum"
    write_token_lists(src, docs, seq_len=16, vocab_size=500, eos_id=1, docs_per_shard=50)
    stream = np.concatenate([np.append(d, 1) for d in docs])

    for fmt in ("megatron", "hf"):
        assert main(["export", src, "--format", fmt, "--out", f"{bucket}/exports/{fmt}"]) == 0
        assert storage.read_commit(f"{bucket}/exports/{fmt}") is not None       # committed, not half-written
        assert ExportRecord.read(f"{bucket}/exports/{fmt}").set_digest == ShardSet.open(src).manifest.set_digest

    staged = storage.local_copy(f"{bucket}/exports/hf")
    import datasets
    rows = datasets.load_from_disk(str(staged))["input_ids"]
    np.testing.assert_array_equal(np.concatenate(rows), stream)

    idx_mod = pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                  reason="megatron-core (the `test` extra) is not installed")
    ds = idx_mod.IndexedDataset(str(storage.local_copy(f"{bucket}/exports/megatron") / "p-curriculum"))
    np.testing.assert_array_equal(np.concatenate(ds[0:len(ds)]), stream)

    capsys.readouterr()
    assert main(["export", src, "--format", "hf", "--out", f"{bucket}/exports/hf"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{bucket}/exports/hf" in err and "already exists" in err
