"""The one command layer (purokit/cli.py) as a user meets it: every `python -m <package>` command
exits 2 with ONE stderr line naming the file and the field on a bad config, and naming the file on
a missing input; a bug keeps its traceback. Real subprocesses, failing at config load (no Spark
session, no model), so each costs an interpreter start."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _run(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, argv)], capture_output=True, text=True, cwd=cwd, timeout=300)


def _one_line_error(proc: subprocess.CompletedProcess, *names: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


def _write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_kaiyuan_bad_config_and_missing_config(tmp_path):
    bad = _write(tmp_path / "run.yaml", {"output": "out", "spark": {"shuffle_partitions": "many"}})
    _one_line_error(_run("-m", "kaiyuan", "pipeline", "--config", bad, cwd=tmp_path), "run.yaml", "spark.shuffle_partitions")
    _one_line_error(_run("-m", "kaiyuan", "dedup", "--config", tmp_path / "absent.yaml", cwd=tmp_path),
                    "absent.yaml", "not found")
    _one_line_error(_run("-m", "kaiyuan", "summary", tmp_path / "no-run", cwd=tmp_path), "no-run")


def test_mixtures_bad_spec_field_and_missing_spec(tmp_path):
    spec = {"name": "m", "tokenizer": {"kind": "hf", "path": "tok.json"}, "seq_len": "long",
            "components": [{"name": "web", "path": "web"}], "phases": [{"name": "p1", "components": {"web": 1.0}}]}
    line = _one_line_error(_run("-m", "mixtures", "validate", "--spec", _write(tmp_path / "mix.yaml", spec), cwd=tmp_path),
                           "mix.yaml", "seq_len")
    assert "'long'" in line
    _one_line_error(_run("-m", "mixtures", "materialize", "--spec", tmp_path / "absent.yaml", "--out", tmp_path / "o",
                         cwd=tmp_path), "absent.yaml")


def test_synth_unknown_generator_field_and_missing_generator_file(tmp_path):
    gen = yaml.safe_load((REPO / "synth/generators/reasoning_pairs.yaml").read_text())
    gen["temprature"] = 0.7                        # misspelt: refused, not ignored
    bad = _write(tmp_path / "gen.yaml", gen)
    _one_line_error(_run("-m", "synth", bad, "--out", tmp_path / "o", cwd=tmp_path), "gen.yaml", "temprature")
    _one_line_error(_run("-m", "synth", tmp_path / "absent.yaml", "--out", tmp_path / "o", cwd=tmp_path), "absent.yaml")
    assert not (tmp_path / "o").exists()


def test_proxy_eval_bad_plan_field_and_missing_csv(tmp_path):
    bad = _write(tmp_path / "plan.yaml", {"components": [], "rows_per_file": "lots"})
    _one_line_error(_run("-m", "proxy_eval", "plan", "--config", bad, cwd=tmp_path), "plan.yaml", "rows_per_file")
    _one_line_error(_run("-m", "proxy_eval", "fit", "cost", "--csv", tmp_path / "costs.csv", cwd=tmp_path), "costs.csv")


def test_trainer_bad_run_field_bad_override_and_missing_config(tmp_path):
    run = {"run_dir": "r", "data": {"synthetic": {"vocab_size": 64}}, "train": {"steps": "ten", "global_batch": 2}}
    bad = _write(tmp_path / "run.yaml", run)
    _one_line_error(_run("-m", "trainer", "train", "--config", bad, cwd=tmp_path), "run.yaml", "train.steps")
    _one_line_error(_run("-m", "trainer", "train", "--config", bad, "train.steps", cwd=tmp_path),
                    "override 'train.steps'", "key.sub=value")
    _one_line_error(_run("-m", "trainer", "train", "--config", tmp_path / "absent.yaml", cwd=tmp_path), "absent.yaml")
    _one_line_error(_run("-m", "trainer", "average", "--checkpoints", tmp_path / "no-run", "--out", tmp_path / "avg",
                         cwd=tmp_path), "no-run")


def test_a_bug_keeps_its_traceback(tmp_path):
    """A command that raises a non-user error (here a RuntimeError in the summary) is a bug: the
    traceback is printed, the exit code is Python's 1, not the one-line exit 2."""
    script = textwrap.dedent("""
        import sys
        from kaiyuan import report
        def broken(*a, **k):
            raise RuntimeError("a bug in the summary")
        report.collect = broken
        from kaiyuan.__main__ import main
        sys.exit(main(["summary", "runs/x"]))
    """)
    (tmp_path / "runs" / "x").mkdir(parents=True)
    proc = _run("-c", script, cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "RuntimeError: a bug in the summary" in proc.stderr
    assert "error: a bug" not in proc.stderr


def test_user_error_lines_name_file_and_field():
    from pydantic import BaseModel, ValidationError

    from purokit.cli import user_error
    from purokit.config import load_config, StrictModel

    class Inner(StrictModel):
        n: int = 1

    class Outer(StrictModel):
        inner: Inner = Inner()

    with pytest.raises(ValidationError) as e:
        Outer.model_validate({"inner": {"n": "x"}})
    assert user_error(e.value) == "Outer: field 'inner.n': Input should be a valid integer, unable to parse string as an integer"
    with pytest.raises(Exception) as e:
        load_config(Outer, None, ["inner.n"])
    assert user_error(e.value) == "override 'inner.n' is not of the form key.sub=value"
    assert issubclass(type(e.value), ValueError) and not isinstance(e.value, BaseModel)
    with pytest.raises(FileNotFoundError) as e:
        open("/nonexistent/input.jsonl")
    assert user_error(e.value) == "/nonexistent/input.jsonl: no such file or directory"
