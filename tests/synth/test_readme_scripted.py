"""Every generator command of the README's synth sections, as written, against the scripted fake
teacher the README shows (`python -m synth.fakeserver --responder scripted --script
synth/scripts/teacher.yaml`): each exits 0 with accepted records, so a new user can try every
generator without a model."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo.readme_commands import readme_commands

REPO = Path(__file__).resolve().parents[2]
GENERATOR = re.compile(r"python -m synth(\.domains)? (?!list|export|clean|serve)\w+")


SLOW = ("code_concepts", "text_to_sql")      # 250 sandboxed solutions; 20 schemas executed (a minute or more each)


def generator_commands() -> list[str]:
    return [c.text for c in readme_commands() if GENERATOR.match(c.text) and not c.text.startswith("SYNTH_PG_DSN")]


def _param(command: str):
    name = command.split()[3]
    return pytest.param(command, id=" ".join(command.split()[2:4]), marks=[pytest.mark.slow] if name in SLOW else [])


def test_the_readme_shows_how_to_script_the_fake_teacher():
    starts = [c.text for c in readme_commands() if c.text.startswith("python -m synth.fakeserver")]
    assert starts and "--responder scripted --script synth/scripts/teacher.yaml" in starts[0]
    assert len(generator_commands()) == 8


@pytest.fixture(scope="module")
def scripted_teacher(tmp_path_factory):
    start = next(c.text for c in readme_commands() if c.text.startswith("python -m synth.fakeserver"))
    argv = shlex.split(start)
    argv[argv.index("--port") + 1] = "0"
    proc = subprocess.Popen([sys.executable, *argv[1:]], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert "--responder" in argv and argv[argv.index("--responder") + 1] == "scripted"
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield line.split()[-1]
    proc.terminate()
    proc.wait(10)


@pytest.mark.parametrize("command", [_param(c) for c in generator_commands()])
def test_readme_generator_command_makes_accepted_records(command, scripted_teacher, tmp_path):
    text = command.replace("$URL", scripted_teacher).replace("http://127.0.0.1:8000/v1", scripted_teacher)
    argv = shlex.split(text)
    out = tmp_path / "out"
    argv[argv.index("--out") + 1] = str(out)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    proc = subprocess.run([sys.executable, *argv[1:], "--no-progress"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["counts"]["records"] > 0, manifest["counts"]
