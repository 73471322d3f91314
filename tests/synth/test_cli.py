"""The README's commands: `python -m synth list | <generator> | export | clean`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def synth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "synth", *args], cwd=REPO, capture_output=True, text=True, timeout=180)


def test_cli_list_run_export_clean(fake_server, tmp_path):
    out = synth("list")
    assert out.returncode == 0 and "reasoning_pairs" in out.stdout and "arithmetic_word_problems" in out.stdout
    srv = fake_server("arithmetic", model="teacher")
    run_dir = tmp_path / "pairs"
    out = synth("reasoning_pairs", "--out", str(run_dir), "--endpoint", srv.base_url, "--model", "teacher",
                "source.n=6", "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "acceptance" in out.stdout and "verify" in out.stdout
    assert (run_dir / "export" / "dataset").is_dir()            # the built-in writes jsonl, parquet, datasets
    out = synth("export", str(run_dir), "--formats", "jsonl,parquet", "--out", str(tmp_path / "ex"))
    assert out.returncode == 0 and (tmp_path / "ex" / "train.parquet").is_file()
    first = json.loads((run_dir / "records.jsonl").read_text().splitlines()[0])
    ev = tmp_path / "eval.jsonl"
    ev.write_text(json.dumps({"question": first["messages"][1]["content"]}) + "\n")
    out = synth("clean", str(run_dir / "records.jsonl"), "--out", str(tmp_path / "clean"), "--eval", f"{ev}:question")
    assert out.returncode == 0, out.stderr[-2000:]
    removals = [json.loads(x) for x in (tmp_path / "clean" / "removals.jsonl").read_text().splitlines()]
    assert removals and all(r["reason"] == "ngram_overlap" for r in removals)
    out = synth("no_such_generator", "--out", str(tmp_path / "x"))
    assert out.returncode != 0 and "no generator named" in out.stderr
