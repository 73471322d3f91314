"""The Spark engine (kaiyuan/spark/materialize.py, run by kaiyuan/jobs/materialize.py) writes byte-identical shard sets to the local path."""

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from mixtures.materialize import materialize
from mixtures.shards import ShardManifest, ShardSet
from mixtures.spec import parse_spec

from .conftest import make_component
from .test_materialize import spec_dict

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[2]").appName("mixtures-test")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
         .config("spark.driver.memory", "2g").config("spark.ui.showConsoleProgress", "false").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def _same_sets(a: Path, b: Path, names, ignore=()):
    for name in names:
        files = sorted(p.name for p in (a / name).iterdir() if p.name != "run.json")
        assert files == sorted(p.name for p in (b / name).iterdir() if p.name != "run.json"), name
        for f in files:
            if f == "manifest.json":
                ma, mb = ShardManifest.read(a / name), ShardManifest.read(b / name)
                da, db = ma.to_json_dict(), mb.to_json_dict()
                for k in ignore + (("manifest_digest",) if ignore else ()):   # the digest covers every field
                    da.pop(k, None), db.pop(k, None)
                assert da == db, name
                continue
            assert (a / name / f).read_bytes() == (b / name / f).read_bytes(), (name, f)


def test_spark_and_local_paths_agree_byte_for_byte(spark, tmp_path, components, tokenizer_json):
    """The CI-sized check: a scored top-fraction component, a lower-is-better one and an unscored
    one, a phase-2 curriculum with a transition from phase 1."""
    from kaiyuan.spark.materialize import run

    d = spec_dict(components, tokenizer_json, holdout={"fraction": 0.03}, shard_tokens=6000)
    d["components"][0]["retention"] = {"rule": "top_fraction", "fraction": 0.8}
    d["phases"][0]["components"] = {"web": 0.8, "code": 0.2}
    d["phases"][1]["orders"] = ["curriculum"]
    spec = parse_spec(d)
    local = materialize(spec, tmp_path / "local", progress=lambda m: None)
    spark_sets = run(spark, spec, tmp_path / "spark", progress=lambda m: None)
    assert sorted(local) == sorted(spark_sets) == ["eval", "p1-uniform", "p2-curriculum"]
    assert local["p2-curriculum"].extra["transition"]["replay_tokens"] > 0
    _same_sets(tmp_path / "local", tmp_path / "spark", sorted(local))


@pytest.mark.slow
def test_spark_and_local_paths_write_byte_identical_shards(spark, tmp_path, components, tokenizer_json):
    """Every feature: dup_count-aware and uniform repetition, random-token and top-fraction
    retention, token budgets, uniform and curriculum streams, the eval set, several parts per bucket."""
    from kaiyuan.spark.materialize import run

    # a fourth component exercises dup_count-aware repetition and a random-token retention rule
    dup = pa.array([4 if i % 2 == 0 else 1 for i in range(150)], type=pa.int64())   # supply: ~2.5x its tokens
    extra = make_component(tmp_path / "c", "dups", 150, seed=8, score=None, extra={"dup_count": dup})
    d = spec_dict(components, tokenizer_json)
    d["components"].append({"name": "dups", "path": str(extra), "repeat": "dup_count", "order_seed": 3})
    d["components"][0]["retention"] = {"rule": "top_fraction", "fraction": 0.8}
    d["components"][2]["retention"] = {"rule": "random_tokens", "n_tokens": 9000, "seed": 2}
    d["components"][2]["repeat"] = "uniform"
    d["phases"][0]["components"] = {"web": 0.6, "math": 0.1, "code": 0.1, "dups": 0.2}
    d["phases"][1]["components"]["code"] = {"n_tokens": 12_000}
    d["shard_tokens"] = 4000
    spec = parse_spec(d)
    local = materialize(spec, tmp_path / "local", progress=lambda m: None)
    spark_sets = run(spark, spec, tmp_path / "spark", progress=lambda m: None)
    assert sorted(local) == sorted(spark_sets)
    m = local["p1-uniform"]
    assert any(c.details.get("phase", {}).get("n_repeated_docs", 0) > 0 for c in m.components)
    assert any(s.name.endswith("-001") for s in local["p2-curriculum"].shards)   # several parts per bucket
    _same_sets(tmp_path / "local", tmp_path / "spark", sorted(local))
    ShardSet.open(tmp_path / "spark" / "p2-curriculum", verify_hashes=True)


@pytest.mark.slow
def test_spark_submit_command_line(tmp_path, components, tokenizer_json):
    """The documented command: spark-submit kaiyuan/jobs/materialize.py --spec ... --out ..."""
    import yaml

    d = spec_dict(components, tokenizer_json, holdout=None)
    d["phases"] = [{"name": "p", "orders": ["curriculum"], "components": {"math": {}, "code": {}}}]
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump(d))
    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent))
    assert spark_submit, "spark-submit should be beside the interpreter"
    proc = subprocess.run([spark_submit, "--master", "local[2]", "--driver-memory", "1g",
                           "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=4",
                           str(REPO / "kaiyuan/jobs/materialize.py"), "--spec", str(tmp_path / "mix.yaml"),
                           "--out", str(tmp_path / "out"), "--checkpoint-dir", str(tmp_path / "ckpt")],
                          capture_output=True, text=True, timeout=900)   # a loaded shared machine
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "p-curriculum:" in proc.stdout
    assert any((tmp_path / "ckpt").rglob("rdd-*")), "the plan's checkpoints are reliable ones in --checkpoint-dir"
    local = materialize(parse_spec(d), tmp_path / "local", progress=lambda m: None)
    # another process: the git commit may have moved in between (others commit to this tree)
    _same_sets(tmp_path / "local", tmp_path / "out", sorted(local), ignore=("code_version",))


def _jobs(spark, group, fn):
    """Run fn() under a Spark job group; the number of Spark jobs it started."""
    sc = spark.sparkContext
    sc.setJobGroup(group, group)
    try:
        fn()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_spark_repetition_rounds_do_not_grow_with_the_largest_dup_count(spark, tmp_path, tokenizer_json):
    """Capped dup_count repetition costs the same Spark jobs for dup_count 3 as for 5,000 (one
    aggregation and one sort per phase, not a round per copy), and matches the local path."""
    from kaiyuan.spark.materialize import run

    jobs = {}
    for top in (3, 5000):
        dup = pa.array([top if i % 3 == 0 else 1 for i in range(90)], type=pa.int64())
        comp = make_component(tmp_path / f"c{top}", "dups", 90, seed=8, extra={"dup_count": dup})
        d = spec_dict({"web": comp, "math": comp, "code": comp}, tokenizer_json, holdout=None, bucket_count=4)
        d["components"] = [{"name": "dups", "path": str(comp), "score_field": "edu", "repeat": "dup_count"}]
        d["phases"] = [{"name": "p", "orders": ["curriculum"], "components": {"dups": {}}}]
        total = materialize(parse_spec(d), tmp_path / f"n{top}", progress=lambda m: None)["p-curriculum"].n_tokens
        d["phases"][0]["components"]["dups"] = {"n_tokens": int(1.3 * total)}
        spec = parse_spec(d)
        local = materialize(spec, tmp_path / f"local{top}", progress=lambda m: None)
        jobs[top] = _jobs(spark, f"dups-{top}", lambda: run(spark, spec, tmp_path / f"spark{top}",
                                                            checkpoint_dir=tmp_path / "ckpt", progress=lambda m: None))
        assert local["p-curriculum"].components[0].details["phase"]["n_repeated_docs"] > 0
        _same_sets(tmp_path / f"local{top}", tmp_path / f"spark{top}", ["p-curriculum"])
    assert jobs[3] == jobs[5000] > 0
    assert any((tmp_path / "ckpt").rglob("rdd-*")), "reliable checkpoints were written to checkpoint_dir"
