"""Jobs through spark-submit: on a multi-process master (executors in their own JVMs and Python
workers, the package shipped with --py-files, model files with addFile), and killed with SIGKILL
mid-write, then rerun."""

import hashlib
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from purokit.component import Component
from kaiyuan.classifier import train_classifier
from kaiyuan.config import RunConfig, TrainClassifierConfig
from kaiyuan.spark.components_io import list_components
from kaiyuan.spark.dedup import run_dedup
from kaiyuan.spark.ingest import run_ingest
from tests.conftest import short_spark_env

from .conftest import planted_corpus, prose, write_jsonl

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _env(**extra):
    env = short_spark_env()                    # these JVMs live seconds: C1 only, serial GC
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env.update(extra)
    return env


def build_py_files(dest: Path) -> Path:
    """The packages a job needs, zipped for --py-files (what a user ships to a cluster)."""
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in ("purokit", "kaiyuan"):
            for f in sorted((REPO / pkg).rglob("*.py")):
                z.write(f, f.relative_to(REPO).as_posix())
    return dest


def python_without_checkout(tmp: Path) -> Path:
    """A Python for the executors that cannot import this checkout's editable install, so the
    job only works if --py-files really delivers the code."""
    shim = tmp / "no_editable.py"
    shim.write_text(
        "import runpy, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]\n"
        "sys.path_hooks[:] = [h for h in sys.path_hooks if 'editable' not in getattr(h, '__module__', '')]\n"
        "sys.path_importer_cache.clear()\n"
        "assert sys.argv[1] == '-m', sys.argv\n"
        "mod = sys.argv[2]\n"
        "sys.argv = [mod] + sys.argv[3:]\n"
        "runpy.run_module(mod, run_name='__main__', alter_sys=True)\n")
    wrapper = tmp / "python-no-checkout"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {shim} \"$@\"\n")
    wrapper.chmod(0o755)
    return wrapper


def test_pipeline_on_a_local_cluster_ships_code_and_models(tmp_path):
    rng = random.Random(0)
    good = [{"text": prose(rng, 80)} for _ in range(150)]
    bad = [{"text": " ".join(w[::-1] for w in prose(rng, 80).split()) + " ## $$"} for _ in range(150)]
    write_jsonl(tmp_path / "pos.jsonl", good)
    write_jsonl(tmp_path / "neg.jsonl", bad)
    model = tmp_path / "models" / "toy.bin"
    train_classifier(TrainClassifierConfig.model_validate({
        "name": "toy", "output": str(model), "positives": [{"paths": [str(tmp_path / "pos.jsonl")]}],
        "negatives": [{"paths": [str(tmp_path / "neg.jsonl")]}], "fasttext": {"dim": 8, "epoch": 3}}))
    records, clusters = planted_corpus(5, 60, 6, prefix="c")
    write_jsonl(tmp_path / "src" / "a.jsonl", records)
    cfg = {
        "output": str(tmp_path / "out"),
        "sources": [{"name": "web", "paths": [str(tmp_path / "src")], "id_field": "id"}],
        "score": {"rows_per_partition": 20, "annotators": [
            {"type": "lid"}, {"type": "fasttext", "name": "toy", "model": str(model)}]},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    zip_path = build_py_files(tmp_path / "purokit-pkgs.zip")
    no_checkout = python_without_checkout(tmp_path)
    cmd = ["spark-submit", "--master", "local-cluster[2,1,1024]", "--py-files", str(zip_path),
           "--conf", f"spark.pyspark.python={no_checkout}", "--conf", f"spark.pyspark.driver.python={sys.executable}",
           "--conf", "spark.ui.enabled=false",
           "--conf", "spark.sql.shuffle.partitions=4",
           str(REPO / "kaiyuan" / "jobs" / "pipeline.py"), "--config", str(tmp_path / "run.yaml")]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "local-cluster[2,1,1024]" in proc.stdout          # spark-submit merges the driver's stderr into stdout
    scored = Component.open(tmp_path / "out" / "score" / "web", verify_hashes=True)
    assert scored.manifest.n_docs == len(records) - sum(len(c) - 1 for c in clusters)
    rows = scored.read(["id", "text", "quality.toy", "lang"]).to_pylist()
    from kaiyuan.annotators.fasttext_models import load_fasttext, positive_probabilities

    direct = positive_probabilities(load_fasttext(str(model)), [r["text"] for r in rows], "__label__hq")
    assert [r["quality.toy"] for r in rows] == pytest.approx(direct, abs=1e-6)
    assert {r["lang"] for r in rows} >= {"en"}
    assert "web" in proc.stdout and "score" in proc.stdout            # the summary table


def _hashes(d: Path):
    return {p.relative_to(d).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*.parquet"))}


def test_sigkill_mid_write_then_rerun_gives_the_uninterrupted_result(spark, tmp_path):
    records, _ = planted_corpus(7, 1500, 100, prefix="k")
    write_jsonl(tmp_path / "src" / "k.jsonl", records)
    more, _ = planted_corpus(8, 300, 20, prefix="m")
    write_jsonl(tmp_path / "src2" / "m.jsonl", more)
    sources = [{"name": "big", "paths": [str(tmp_path / "src")], "id_field": "id"},
               {"name": "small", "paths": [str(tmp_path / "src2")], "id_field": "id"}]
    base = RunConfig.model_validate({"output": str(tmp_path / "base"), "sources": sources,
                                     "dedup": {"target_file_mb": 0.5}})
    run_ingest(spark, base)
    reference = RunConfig.model_validate({**base.model_dump(), "output": str(tmp_path / "reference"),
                                          "dedup": {**base.dedup.model_dump(), "input_dir": str(base.stage_dir("ingest"))}})
    run_dedup(spark, reference)
    cfg = {"output": str(tmp_path / "killed"), "sources": sources,
           "dedup": {"target_file_mb": 0.5, "input_dir": str(base.stage_dir("ingest"))}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    cmd = ["spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.sql.parquet.compression.codec=zstd",
           str(REPO / "kaiyuan" / "jobs" / "dedup.py"), "--config", str(tmp_path / "run.yaml")]
    stage = tmp_path / "killed" / "dedup"
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=tmp_path)
    killed_while_writing = False
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            partial = [p for p in stage.glob(".tmp-*") if p.is_dir() and any(p.rglob("*"))] if stage.is_dir() else []
            if partial:
                os.killpg(proc.pid, signal.SIGKILL)        # the driver, its JVM and its Python workers
                killed_while_writing = True
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert killed_while_writing, "the job finished before it could be killed mid-write"
    # a later stage sees complete components only: none, or a finished one, never a partial one
    visible = list_components(stage)
    for name, c in visible.items():
        assert _hashes(c.directory) == _hashes(reference.stage_dir("dedup") / name)
    assert len(visible) < 2
    assert any(p.name.startswith(".tmp-") for p in stage.iterdir())
    rerun = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    for name in ("big", "small"):
        got = Component.open(stage / name, verify_hashes=True)
        want = Component.open(reference.stage_dir("dedup") / name)
        assert _hashes(got.directory) == _hashes(want.directory)
        assert got.columns == want.columns
        assert got.manifest.counts == want.manifest.counts
        removed = pq.read_table(got.directory / "_removed").to_pylist()
        assert removed == pq.read_table(want.directory / "_removed").to_pylist()
    assert not [p for p in stage.iterdir() if p.name.startswith(".tmp-")]


def test_python_m_kaiyuan_with_overrides_and_summary(spark, tmp_path):
    records, clusters = planted_corpus(3, 40, 4, prefix="x")
    write_jsonl(tmp_path / "src" / "x.jsonl", records)
    cfg = {"output": str(tmp_path / "out"), "spark": {"master": "local[2]", "driver_memory": "1g"},
           "sources": [{"name": "x", "paths": [str(tmp_path / "src")], "id_field": "id"}]}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    run_ingest(spark, RunConfig.model_validate(cfg))
    bad = subprocess.run([sys.executable, "-m", "kaiyuan", "dedup", "--config", str(tmp_path / "run.yaml"),
                          "dedup.scope=planet"], env=_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "dedup.scope" in bad.stderr
    cmd = [sys.executable, "-m", "kaiyuan", "dedup", "--config", str(tmp_path / "run.yaml"), f"output={tmp_path / 'g'}",
           "dedup.scope=global", f"dedup.input_dir={tmp_path / 'out' / 'ingest'}"]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = Component.open(tmp_path / "g" / "dedup" / "x")
    assert c.manifest.n_docs == len(records) - sum(len(cl) - 1 for cl in clusters)
    assert c.manifest.config["dedup"]["scope"] == "global"
    summary = subprocess.run([sys.executable, "-m", "kaiyuan", "summary", str(tmp_path / "g")], env=_env(),
                             capture_output=True, text=True, timeout=120)
    line = next(ln for ln in summary.stdout.splitlines() if ln.startswith("x ") and " dedup " in ln)
    assert line.split()[2:4] == [str(len(records)), str(c.manifest.n_docs)]
