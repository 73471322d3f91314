"""The Spark materialization engine on an object store (moto's S3 server on loopback): components
read from s3://, the token spill and the shard files written to s3:// by the executors through the
commit protocol, `inspect --verify` on the result, and the same shard bytes as the local engine on
local copies of the components. The slow test runs the documented `spark-submit
kaiyuan/jobs/materialize.py` on local-cluster, SIGKILLs the driver mid-write and reruns it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from purokit import storage
from mixtures.inspect import inspect_sets
from mixtures.materialize import materialize
from mixtures.shards import ShardManifest
from mixtures.spec import parse_spec
from tests.conftest import short_spark_env, sigkill_when
from tests.mixtures.conftest import make_component

REPO = Path(__file__).resolve().parents[2]
SETS = ["eval", "p1-uniform", "p2-curriculum"]


@pytest.fixture(scope="module")
def local_components(tmp_path_factory):
    """Two small components on local disk and a byte-level BPE trained on them."""
    from purokit.component import Component
    from mixtures.tokenizers import train_bpe

    root = tmp_path_factory.mktemp("components")
    comps = {"web": make_component(root, "web", 300, seed=1, score="edu", files=3),
             "code": make_component(root, "code", 120, seed=3, score=None)}
    texts = (t for c in comps.values() for t in Component.open(c).read(["text"]).column("text").to_pylist())
    train_bpe(texts, 400, root / "tok", name="test-bpe")
    return comps, root / "tok" / "tokenizer.json"


def _spec(paths: dict[str, str], tokenizer_json) -> dict:
    return {"name": "s3-spark", "tokenizer": {"kind": "hf", "path": str(tokenizer_json)}, "seq_len": 32,
            "bucket_count": 3, "shard_tokens": 3000, "holdout": {"fraction": 0.05},
            "seeds": {"bucket_shuffle": 1, "uniform": 2, "replay": 3, "budget": 4, "holdout": 5},
            "components": [{"name": "web", "path": paths["web"], "score_field": "edu", "order_seed": 7},
                           {"name": "code", "path": paths["code"], "order_seed": 9}],
            "phases": [{"name": "p1", "components": {"web": 0.7, "code": 0.3}},
                       {"name": "p2", "orders": ["curriculum"], "transition_tokens": 2000,
                        "components": {"web": {}, "code": {}}}]}


def _on_s3(bucket: str, local_components) -> tuple[dict, dict]:
    """(spec on s3 components, spec on the local copies)."""
    comps, tok = local_components
    for name, d in comps.items():
        storage.publish_dir(d, f"{bucket}/components/{name}")      # committed, as kaiyuan's jobs write them
    return (_spec({n: f"{bucket}/components/{n}" for n in comps}, tok), _spec({n: str(d) for n, d in comps.items()}, tok))


def _shard_hashes(set_dir) -> dict[str, str]:
    """sha256 of every shard file (tokens, index) of a committed set (local or on a store): all but
    the manifest (it names the components' paths) and run.json (timings)."""
    root = storage.committed(set_dir)
    assert root is not None, f"{set_dir} is not committed"
    return {rel: storage.sha256_file(storage.join(root, rel)) for rel, _, _ in storage.list_files(root)
            if rel not in ("manifest.json", "run.json")}


def _same_as_local(url: str, local: Path) -> None:
    for name in SETS:
        got, want = _shard_hashes(f"{url}/{name}"), _shard_hashes(local / name)
        assert got == want and len(got) >= 2, name
        assert ShardManifest.read(f"{url}/{name}").set_digest == ShardManifest.read(local / name).set_digest


def test_spark_engine_reads_and_writes_s3_like_the_local_engine(s3_spark, bucket, local_components, tmp_path):
    from kaiyuan.spark.materialize import run

    on_s3, local = _on_s3(bucket, local_components)
    materialize(parse_spec(local), tmp_path / "local", progress=lambda m: None)
    got = run(s3_spark, parse_spec(on_s3), f"{bucket}/shards", progress=lambda m: None)
    assert sorted(got) == SETS
    _same_as_local(f"{bucket}/shards", tmp_path / "local")
    lines, _, failures = inspect_sets(f"{bucket}/shards", verify=True)
    assert not failures and sum("every file matches its sha256" in x for x in lines) == len(SETS)
    fs, inner = storage.filesystem(f"{bucket}/shards")
    left = [p for p in fs.find(inner) if "/.work-" in p]
    assert not left, f"the token spill should be removed after the run: {left[:3]}"


def _uncommitted_attempt(fs, inner: str) -> str | None:
    """A set under `inner` with attempt objects and no commit record yet, if any."""
    for name in SETS:
        keys = fs.find(f"{inner}/{name}")
        if any("/_attempt-" in k for k in keys) and not any(k.endswith("/_commit.json") for k in keys):
            return name
    return None


@pytest.mark.slow
def test_spark_submit_on_s3_killed_mid_write_then_rerun(s3_server, bucket, local_components, tmp_path):
    """`spark-submit kaiyuan/jobs/materialize.py` on local-cluster[2,1,1024], s3 -> s3: SIGKILL of
    the driver while a set's attempt is being written leaves that set invisible; the rerun
    completes it, with the local engine's shard bytes."""
    on_s3, local = _on_s3(bucket, local_components)
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(on_s3))
    materialize(parse_spec(local), tmp_path / "local", progress=lambda m: None)
    spark_submit = str(Path(sys.executable).parent / "spark-submit")
    cmd = [spark_submit, "--master", "local-cluster[2,1,1024]", "--driver-memory", "1g",
           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
           str(REPO / "kaiyuan/jobs/materialize.py"), "--spec", str(tmp_path / "mix.yaml"),
           "--out", f"{bucket}/shards", "--checkpoint-dir", str(tmp_path / "ckpt")]
    env = short_spark_env({**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                           "SPARK_LOCAL_IP": "127.0.0.1"})
    fs, inner = storage.filesystem(f"{bucket}/shards")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=tmp_path)
    killed = sigkill_when(proc, lambda: _uncommitted_attempt(fs, inner))
    assert killed, "the job finished before a set could be caught mid-write"
    fs.invalidate_cache()
    assert storage.committed(f"{bucket}/shards/{killed}") is None, "a killed attempt must stay invisible"
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    _same_as_local(f"{bucket}/shards", tmp_path / "local")
    fs.invalidate_cache()
    attempts = {k.split("/_attempt-")[1].split("/")[0] for k in fs.find(inner) if "/_attempt-" in k}
    assert len(attempts) == len(SETS), "uncommitted attempts are removed by the rerun's commits"
    verify = subprocess.run([sys.executable, "-m", "mixtures", "inspect", f"{bucket}/shards", "--verify"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert verify.stdout.count("every file matches its sha256") == len(SETS)

