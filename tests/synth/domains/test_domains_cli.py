"""Every domain generator's YAML loads, names only registered steps, and runs from the command
line (`python -m synth <generator> --endpoint URL --model NAME --out DIR`; `python -m synth.domains`
is an alias)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from synth.domains import GENERATOR_MODULES


@pytest.mark.parametrize("name", sorted(GENERATOR_MODULES))
def test_generator_configs_load_and_build(name):
    from synth.engine import RunEnv, build_steps, load_generator
    from synth.pipeline import SOURCES

    cfg = load_generator(name)          # its `imports:` register the domain's sources and steps
    assert cfg.generator == name and cfg.imports == [GENERATOR_MODULES[name]]
    assert cfg.source["kind"] in SOURCES
    steps, posts = build_steps(cfg, RunEnv(cfg, None))
    assert steps and posts
    roles = {s.cfg.teacher for s in steps if hasattr(s.cfg, "teacher")}
    assert roles <= set(cfg.teachers), (roles, cfg.teachers)


def test_cli_runs_a_domain_generator_over_http(script, teacher, tmp_path):
    script.on("You are designing a realistic", reply="```sql\nCREATE TABLE t (id INTEGER PRIMARY KEY);\n```", name="schema")
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "synth", "text_to_sql", "--endpoint", teacher.base_url, "--model", "teacher",
         "--out", str(out), "--no-progress", "source.n=2", "source.dialects=[sqlite]"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "text_to_sql: 0 records from 2 prompts" in proc.stdout
    assert "schema" in proc.stdout and "acceptance 0.0%" in proc.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["steps"]["schema"] == {"kind": "sql_schema", "in": 2, "out": 0, "acceptance": 0.0}
    rejects = [json.loads(x) for x in (out / "rejects.jsonl").read_text().splitlines()]
    assert [r["reason"] for r in rejects] == ["schema or rows unusable: no INSERT statements with sample rows"] * 2
    assert script.hits["schema"] == 2


def _readme_commands() -> list[str]:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    section = text.split("### synth domain generators", 1)[1]
    return [line.strip() for line in section.splitlines() if line.startswith("python -m synth ")]


@pytest.mark.parametrize("command", _readme_commands())
def test_readme_commands_run(command, script, teacher, tmp_path):
    """Each README command, as written, against a teacher that knows nothing: exit 0, a manifest,
    and every prompt's fate accounted for."""
    import shlex

    argv = shlex.split(command.replace("$URL", teacher.base_url))
    out = tmp_path / "out"
    argv[argv.index("--out") + 1] = str(out)
    proc = subprocess.run([sys.executable, *argv[1:], "--no-progress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["counts"]["prompts"] > 0
    assert manifest["counts"]["records"] == 0        # "I do not know." passes no validator
    assert (out / "rejects.jsonl").read_text().strip() or manifest["counts"]["prompts_dropped"]


def test_synth_domains_is_an_alias_of_synth():
    """Scripts that still say `python -m synth.domains` get `python -m synth` (its help and commands)."""
    proc = subprocess.run([sys.executable, "-m", "synth.domains", "list"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "domains/text_to_sql.yaml" in proc.stdout and "verifiers:" in proc.stdout
