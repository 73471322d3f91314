"""Bad input and concurrent writers on a real S3 endpoint (moto on loopback): commit records whose
entries would escape the output or the cache are refused naming the record and the entry, every
missing object is named by URL, and of two writers of one output one wins whole and the other fails
naming the output."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from purokit import storage
from purokit.errors import ContractError
from mixtures import write_token_lists
from mixtures.shards import ShardSet

REPO = Path(__file__).resolve().parents[2]


def _shards(url: str, n_docs: int = 30) -> str:
    docs = [[1 + (i * 7 + j) % 250 for j in range(5 + i % 9)] for i in range(n_docs)]
    write_token_lists(url, docs, seq_len=16, vocab_size=256, eos_id=0, docs_per_shard=20)
    return url


def _record(url: str) -> dict:
    return json.loads(storage.path(storage.join(url, storage.COMMIT_NAME)).read_bytes())


def _rewrite(url: str, record: dict) -> None:
    storage.write_bytes(storage.join(url, storage.COMMIT_NAME), json.dumps(record).encode())


def _delete(url: str) -> None:
    fs, inner = storage.filesystem(url)
    fs.rm(inner, recursive=True)


@pytest.mark.parametrize("entry", ["../../../../../../../{tmp}/escaped", "{tmp}/escaped-abs", "a/../../escaped",
                                   "a//b", "./x", "a\\..\\..\\x"])
def test_a_commit_record_entry_outside_the_output_is_refused(bucket, tmp_path, entry):
    url = _shards(f"{bucket}/sets/x")
    record = _record(url)
    bad = entry.format(tmp=str(tmp_path).lstrip("/") if entry.startswith("..") else tmp_path)
    record["files"][1]["path"] = bad
    _rewrite(url, record)
    for read in (storage.local_copy, ShardSet.open, lambda u: storage.has_committed(u, "manifest.json")):
        with pytest.raises(ContractError) as e:
            read(url)
        assert f"{url}/_commit.json" in str(e.value) and "files[1]" in str(e.value) and repr(bad) in str(e.value)
    assert list(tmp_path.iterdir()) == []                     # nothing written outside the cache


def test_a_commit_record_naming_another_attempt_is_refused(bucket):
    url = _shards(f"{bucket}/sets/x")
    record = _record(url)
    record["attempt"] = "../other"
    _rewrite(url, record)
    with pytest.raises(ContractError, match=r"_commit.json: field 'attempt'.*'\.\./other'"):
        storage.local_copy(url)


def test_staging_stays_inside_the_cache_even_through_a_planted_symlink(bucket, tmp_path):
    """The record is valid, but a directory of the staged copy was replaced by a link out of the
    cache: staging resolves each target and refuses it, naming the record's entry."""
    local = tmp_path / "out"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "x.bin").write_bytes(b"12345")
    url = f"{bucket}/nested"
    storage.publish_dir(local, url)
    staged = storage.local_copy(url)
    assert (staged / "sub" / "x.bin").read_bytes() == b"12345"
    outside = tmp_path / "outside"
    outside.mkdir()
    (staged / "sub" / "x.bin").unlink()
    (staged / "sub").rmdir()
    (staged / "sub").symlink_to(outside)
    with pytest.raises(ContractError, match=r"_commit.json: field 'files\[0\]'.*'sub/x.bin'.*outside"):
        storage.local_copy(url)
    assert list(outside.iterdir()) == []


def _missing_object_cases(bucket):
    """(name, shard-set URL, object whose absence is reported) for each damage."""
    extra = _shards(f"{bucket}/extra")
    record = _record(extra)
    record["files"].append({"path": "shard-00009.bin", "n_bytes": 3, "sha256": "0" * 64})
    _rewrite(extra, record)
    yield "extra entry", extra, f"{extra}/{record['attempt']}/shard-00009.bin"
    attempt = _shards(f"{bucket}/attempt")
    _delete(f"{attempt}/{_record(attempt)['attempt']}")
    yield "missing attempt", attempt, f"{attempt}/{_record(attempt)['attempt']}/"
    idx = _shards(f"{bucket}/idx")
    _delete(f"{idx}/{_record(idx)['attempt']}/shard-00001.idx.parquet")
    yield "deleted index", idx, f"{idx}/{_record(idx)['attempt']}/shard-00001.idx.parquet"
    nomanifest = _shards(f"{bucket}/nomanifest")
    record = _record(nomanifest)
    record["files"] = [f for f in record["files"] if f["path"] != "manifest.json"]
    _rewrite(nomanifest, record)
    yield "record without the manifest", nomanifest, f"{nomanifest}/manifest.json"


def test_every_missing_object_is_named_by_url(bucket):
    for name, url, missing in _missing_object_cases(bucket):
        with pytest.raises(ContractError) as e:
            ShardSet.open(url, verify_hashes=True)
        assert missing in str(e.value), (name, str(e.value))
        assert "specified key does not exist" not in str(e.value)
    for read in (storage.open, storage.parquet_file, storage.parquet_metadata):   # and a plain read
        with pytest.raises(FileNotFoundError, match=f"^{bucket}/gone.parquet: no such object"):
            read(f"{bucket}/gone.parquet")


def _write(url: str, tmp, payload: bytes, n: int = 3) -> None:
    tmp.mkdir()
    for i in range(n):
        (tmp / f"part-{i}.bin").write_bytes(payload * (i + 1))


def test_two_writers_of_one_output_the_first_to_commit_wins_whole(bucket):
    url = f"{bucket}/out"
    with pytest.raises(ContractError) as e:
        with storage.atomic_path(url) as a:
            _write(url, a, b"A")
            with storage.atomic_path(url) as b:               # began while A was writing, commits first
                _write(url, b, b"B", n=2)
    assert str(e.value).startswith(f"{url}: another writer committed this output")
    staged = storage.local_copy(url)
    assert sorted(p.name for p in staged.iterdir()) == ["part-0.bin", "part-1.bin"]
    assert {p.read_bytes()[:1] for p in staged.iterdir()} == {b"B"}
    assert {rel.split("/")[0] for rel, _, _ in storage.list_files(url, hidden=True)} \
        == {storage.COMMIT_NAME, _record(url)["attempt"]}    # the loser's attempt is gone

    # over an existing output too: a writer replaces only the version it began from
    with pytest.raises(ContractError, match="another writer committed"):
        with storage.atomic_path(url) as a:
            _write(url, a, b"C")
            with storage.atomic_path(url) as b:
                _write(url, b, b"D")
    assert {p.read_bytes()[:1] for p in storage.local_copy(url).iterdir()} == {b"D"}
    with storage.atomic_path(url) as c:                        # alone, it replaces the output
        _write(url, c, b"E")
    assert {p.read_bytes()[:1] for p in storage.local_copy(url).iterdir()} == {b"E"}


def test_an_attempt_cleaned_by_another_writer_is_not_committed(bucket):
    url = f"{bucket}/sets/out"
    attempt = storage.new_attempt(url)
    fs, inner = storage.filesystem(attempt)
    known = {}
    for i in range(3):
        fs.pipe_file(f"{inner}/part-{i}.bin", b"x" * (i + 1))
        known[f"part-{i}.bin"] = storage.sha256_file(attempt / f"part-{i}.bin")
        if i == 1:
            storage.clean_stale_tmp(f"{bucket}/sets")        # another writer starting: removes "debris"
    with pytest.raises(ContractError, match=f"^{url}: 2 file\\(s\\) of attempt {attempt.name} vanished"):
        storage.commit(attempt, url, known)
    assert storage.read_commit(url) is None and storage.list_files(url, hidden=True) == []


def test_inspect_verify_of_an_s3_parent_reports_a_set_whose_record_lacks_the_manifest(bucket):
    from mixtures.inspect import inspect_sets

    _shards(f"{bucket}/sets/good")
    orphaned = _shards(f"{bucket}/sets/orphaned")
    record = _record(orphaned)
    record["files"] = [f for f in record["files"] if f["path"] != "manifest.json"]
    _rewrite(orphaned, record)
    lines, _, failures = inspect_sets(f"{bucket}/sets", verify=True)
    assert [f.split(":")[0] for f in failures] == ["orphaned"] and f"{orphaned}/manifest.json: missing" in failures[0]
    assert any(line.startswith("good:") for line in lines)


# `python -m mixtures materialize`, held at its upload until the other writer has come as far, and
# the second to arrive held until the first has committed: two writers whose work overlaps.
RACER = """
import sys, time
from pathlib import Path
from purokit import storage
from mixtures.__main__ import main
turns, me, other, first = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "first"
publish = storage.publish_dir
def wait_for(name):
    deadline = time.monotonic() + 120
    while not (turns / name).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
def publish_in_turn(*a, **k):
    (turns / (me + ".ready")).touch()
    wait_for(other + ".ready")
    if not first:
        wait_for(other + ".done")
    try:
        return publish(*a, **k)
    finally:
        (turns / (me + ".done")).touch()
storage.publish_dir = publish_in_turn
sys.exit(main(sys.argv[5:]))
"""


def _race_inputs(tmp_path):
    import yaml

    from mixtures.tokenizers import train_bpe
    from tests.mixtures.conftest import make_component

    web = make_component(tmp_path / "components", "web", 300, seed=1)
    train_bpe([f"web alpha beta gamma {i}" for i in range(200)], 300, tmp_path / "tok", name="race")
    specs = []
    for writer, seed in (("a", 2), ("b", 3)):                 # the writers' shards differ
        spec = {"name": "race", "tokenizer": {"kind": "hf", "path": str(tmp_path / "tok" / "tokenizer.json")},
                "seq_len": 32, "bucket_count": 1, "seeds": {"uniform": seed},
                "components": [{"name": "web", "path": str(web), "score_field": "edu"}],
                "phases": [{"name": "p", "orders": ["uniform"], "components": {"web": 1.0}}]}
        (tmp_path / f"{writer}.yaml").write_text(yaml.safe_dump(spec))
        specs.append(tmp_path / f"{writer}.yaml")
    return specs


def test_two_materialize_runs_into_one_s3_output_one_wins_whole(bucket, tmp_path):
    """Two machines (two caches) write one output a second apart: the first to commit wins whole,
    the other exits 2 naming the output; on one machine the second is refused at once."""
    out = f"{bucket}/sets"
    specs = _race_inputs(tmp_path)
    (tmp_path / "turns").mkdir()
    procs = []
    for writer, other, spec in (("a", "b", specs[0]), ("b", "a", specs[1])):
        env = dict(os.environ, PYTHONPATH=str(REPO), **{storage.CACHE_ENV: str(tmp_path / f"cache-{writer}")})
        procs.append(subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path / "turns"), writer, other,
                                       "first" if writer == "a" else "second", "materialize", "--spec", str(spec),
                                       "--out", out], env=env, cwd=REPO, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
        time.sleep(1)
    (rc_a, _, err_a), (rc_b, _, err_b) = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    assert rc_a == 0, err_a
    assert rc_b == 2 and "Traceback" not in err_b
    assert err_b.strip().splitlines()[-1].startswith(f"python -m mixtures: error: {out}/p-uniform: another writer committed this output "
                                                     "while attempt _attempt-")
    won = ShardSet.open(f"{out}/p-uniform", verify_hashes=True).manifest
    assert won.config["spec"]["seeds"]["uniform"] == 2                # writer a's set, every file of it
    assert {rel.split("/")[0] for rel, _, _ in storage.list_files(f"{out}/p-uniform", hidden=True)} \
        == {storage.COMMIT_NAME, _record(f"{out}/p-uniform")["attempt"]}

    with storage.writer_lock(out):                            # a writer of this machine is at work
        rc, _, err = _materialize(specs[1], out)
    assert rc == 2 and err.strip().splitlines()[-1].startswith(
        f"python -m mixtures: error: {out}: another process on this machine is writing this output")
    rc, printed, err = _materialize(specs[0], out)          # alone again: the winner's set is reused
    assert rc == 0 and "p-uniform: complete from an earlier run (same spec and inputs), reused" in printed, err


def _materialize(spec, out):
    proc = subprocess.run([sys.executable, "-m", "mixtures", "materialize", "--spec", str(spec), "--out", out],
                          env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout, proc.stderr
