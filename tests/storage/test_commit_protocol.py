"""The commit protocol on a real S3 endpoint (moto on loopback): a writer SIGKILLed mid-write leaves
nothing a reader can see, the committed version stays readable, and a rerun commits and removes the
dead attempt; plus the storage layer's local/URL equivalences."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from purokit import atomic, storage
from purokit.errors import ContractError
from mixtures.shards import ShardSet

REPO = Path(__file__).resolve().parents[2]

# A child that writes a shard set to `url` and SIGKILLs itself at `kill_at`: after the first file of
# the attempt is uploaded ("part"), or with every file uploaded and the commit record not yet
# written ("record").
WRITER = """
import os, signal, sys
from purokit import storage
from mixtures import write_token_lists

url, kill_at, n_docs = sys.argv[1], sys.argv[2], int(sys.argv[3])
fs, _ = storage.filesystem(url)
put = fs.put_file
def put_then_die(*a, **k):
    put(*a, **k)
    if kill_at == "part":
        os.kill(os.getpid(), signal.SIGKILL)
fs.put_file = put_then_die
commit = storage.commit
def die_before_record(*a, **k):
    if kill_at == "record":
        os.kill(os.getpid(), signal.SIGKILL)
    return commit(*a, **k)
storage.commit = die_before_record
docs = [[1 + (i * 7 + j) % 250 for j in range(5 + i % 9)] for i in range(n_docs)]
write_token_lists(url, docs, seq_len=16, vocab_size=256, eos_id=0, docs_per_shard=20)
"""


def _write(url: str, kill_at: str, n_docs: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", WRITER, url, kill_at, str(n_docs)], env=env, cwd=REPO,
                          capture_output=True, timeout=120).returncode


def _attempts(url: str) -> set[str]:
    return {rel.split("/")[0] for rel, _, _ in storage.list_files(url, hidden=True)
            if rel.startswith(storage.ATTEMPT_PREFIX)}


@pytest.mark.parametrize("kill_at", ["part", "record"])
def test_sigkill_mid_write_then_rerun_leaves_only_the_commit(bucket, kill_at):
    url = f"{bucket}/sets/train"
    assert _write(url, kill_at, 60) == -signal.SIGKILL
    assert _attempts(url)                                   # the dead attempt's objects are there ...
    assert not storage.has_committed(url, "manifest.json")  # ... and invisible to every reader
    with pytest.raises(ContractError, match="nothing committed"):
        ShardSet.open(url)
    assert _write(url, "never", 60) == 0
    first = ShardSet.open(url, verify_hashes=True)
    assert first.manifest.n_docs == 60
    assert _attempts(url) == {json.loads(storage.path(f"{url}/{storage.COMMIT_NAME}").read_text())["attempt"]}

    # a killed overwrite leaves the committed version whole; the rerun replaces it
    assert _write(url, kill_at, 80) == -signal.SIGKILL
    assert ShardSet.open(url, verify_hashes=True).manifest.n_docs == 60
    assert len(_attempts(url)) == 2
    atomic.clean_stale_tmp(f"{bucket}/sets")                # what a job does on start
    assert len(_attempts(url)) == 1
    assert _write(url, "never", 80) == 0
    assert ShardSet.open(url, verify_hashes=True).manifest.n_docs == 80 and len(_attempts(url)) == 1


def test_a_tampered_object_is_refused_when_staged(bucket):
    url = f"{bucket}/sets/x"
    assert _write(url, "never", 30) == 0
    record = json.loads(storage.path(f"{url}/{storage.COMMIT_NAME}").read_text())
    shard = next(f["path"] for f in record["files"] if f["path"].endswith(".bin"))
    target = f"{url}/{record['attempt']}/{shard}"
    data = bytearray(storage.path(target).read_bytes())
    data[0] ^= 1
    storage.write_bytes(target, bytes(data))
    with pytest.raises(ContractError, match="sha256"):
        storage.local_copy(url)


def test_local_paths_keep_posix_behaviour(tmp_path):
    assert storage.path(tmp_path) == tmp_path and type(storage.path(str(tmp_path))) is type(tmp_path)
    assert storage.committed(tmp_path / "none") is None and storage.local_copy(tmp_path) == tmp_path
    attempt = storage.new_attempt(tmp_path / "out")
    assert attempt.parent == tmp_path and attempt.name.startswith(storage.TMP_PREFIX)
    attempt.mkdir()
    (attempt / "a.txt").write_text("x")
    storage.commit(attempt, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]            # renamed, no commit record
    assert (tmp_path / "out" / "a.txt").read_text() == "x" and storage.has_committed(tmp_path / "out", "a.txt")


def test_urls_join_list_and_glob(bucket):
    storage.write_bytes(f"{bucket}/d/a/x.jsonl", b"1\n")
    storage.write_bytes(f"{bucket}/d/b.jsonl", b"22\n")
    storage.write_bytes(f"{bucket}/d/_skip/c.jsonl", b"3\n")
    assert storage.join(bucket, "d", "b.jsonl") == f"{bucket}/d/b.jsonl"
    assert [(rel, n) for rel, n, _ in storage.list_files(f"{bucket}/d")] == [("a/x.jsonl", 2), ("b.jsonl", 3)]
    assert storage.glob(f"{bucket}/d/*.jsonl") == [f"{bucket}/d/b.jsonl"]
    with storage.open(f"{bucket}/d/b.jsonl") as fh:
        assert fh.readline(1) == b"2" and fh.tell() == 1
