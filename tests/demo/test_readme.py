"""Every command the README shows is run by a test or by the demo.

The commands that work on what `make demo` leaves behind run here, as written and in README order,
in a directory where `runs/demo` is the ci-size demo run (and `runs/pairs` its synth run, the
input the README's synth examples assume). The rest (a live teacher, a GPU, YARN, the suite
itself) name the test that runs them, and that test must exist and run them."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import short_spark_env
from tests.demo.readme_commands import README, readme_commands

REPO = README.parent

# run elsewhere: key -> (file that runs it, text that file must contain)
ELSEWHERE = {
    "make demo": ("tests/demo/conftest.py", '"-m", "purokit.demo"'),      # the same orchestrator, ci sizes
    "make test": (".ci/run", "make test"),
    "spark-submit kaiyuan/jobs/pipeline.py": ("tests/kaiyuan/test_submit.py", "jobs\" / \"pipeline.py"),
    "shell cd": ("tests/kaiyuan/test_submit.py", "zipped for --py-files"),   # packing the code for YARN
    "spark-submit kaiyuan/jobs/materialize.py": ("tests/mixtures/test_spark_materialize.py", "materialize.py"),
    "python -m synth reasoning_pairs": ("tests/synth/test_cli.py", "reasoning_pairs"),
    "python -m synth rl_difficulty": ("tests/synth/test_vllm_server.py", "rl_difficulty"),
    "python -m synth serve": ("tests/synth/test_vllm_server.py", '"serve", "vllm"'),
    "python -m synth.fakeserver --responder": ("tests/synth/test_readme_scripted.py", "def scripted_teacher"),
    "shell lm_eval": ("tests/proxy_eval/test_harness_model.py", '"--model", "purokit"'),   # harness tasks: hub data
    **{f"python -m synth {g}": ("tests/synth/domains/test_domains_cli.py", "def test_readme_commands_run")
       for g in ("text_to_sql", "tool_use", "tool_use_conversational", "code_concepts", "finance", "mcq")},
}
# what the demo profile's sizes become at ci size (fewer checkpoints, a smaller batch)
CI_SIZES = {"--spacing 20": "--spacing 1", "train.micro_batch=4": "train.micro_batch=2"}
# a command whose input a later README section makes: run right after that one
AFTER = {"python -m mixtures sft": "python -m synth export"}        # sft.yaml reads runs/pairs-export
# values the README states in a comment beside the command, checked against its output
STATED = {"python -m trainer params": ["2,031,739,904", "1,409,286,144"]}


def _runs_here(key: str) -> bool:
    return key not in ELSEWHERE


def _workspace(root: Path, demo_out: Path) -> Path:
    ws = root / "ws"
    (ws / "runs").mkdir(parents=True)
    (ws / "runs" / "demo").symlink_to(demo_out)
    (ws / "runs" / "pairs").symlink_to(demo_out / "synth" / "run")
    (ws / "evals").mkdir()
    shutil.copy(demo_out / "synth" / "eval_problems.jsonl", ws / "evals" / "test.jsonl")
    # sft.yaml as the README spells it out beside the command
    text = README.read_text(encoding="utf-8")
    (ws / "sft.yaml").write_text(re.search(r"`sft\.yaml`: `(\{.*?\})`", text, re.S).group(1) + "\n")
    return ws


def test_every_readme_command_is_run_by_a_test_or_the_demo():
    cmds = readme_commands()
    assert len(cmds) > 30 and any(c.key == "python -m mixtures materialize" for c in cmds)
    keys = {c.key for c in cmds}
    assert set(ELSEWHERE) <= keys, f"no longer in the README: {set(ELSEWHERE) - keys}"
    for key, (path, needle) in ELSEWHERE.items():
        assert needle in (REPO / path).read_text(), f"{path} no longer runs {key!r}"
    # everything else runs in the next test
    assert sum(_runs_here(k) for k in keys) >= 25


def test_readme_commands_run_as_written_on_the_demo_run(demo_run, tmp_path):
    out, _ = demo_run
    ws = _workspace(tmp_path, out)
    env = short_spark_env(dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                               HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1"))
    ran, failed = [], []
    cmds = [c for c in readme_commands() if _runs_here(c.key)]
    for late, first in AFTER.items():
        moved = [c for c in cmds if c.key == late]
        cmds = [c for c in cmds if c.key != late]
        at = max(i for i, c in enumerate(cmds) if c.key == first) + 1
        cmds[at:at] = moved
    for cmd in cmds:
        text = cmd.text
        for demo_size, ci_size in CI_SIZES.items():
            text = text.replace(demo_size, ci_size)
        proc = subprocess.run(["bash", "-c", text], cwd=ws, env=env, capture_output=True, text=True, timeout=600)
        ran.append(cmd.key)
        if proc.returncode != 0:
            failed.append(f"README line {cmd.line}: {text}\n  rc={proc.returncode}\n{proc.stderr[-1500:]}")
        for value in STATED.get(cmd.key, []):
            if value not in proc.stdout and value.replace(",", "") not in proc.stdout:
                failed.append(f"README line {cmd.line}: {value} is not in the output:\n{proc.stdout[-1500:]}")
    assert not failed, "\n\n".join(failed)
    # the commands did what the README says they do
    assert {"python -m kaiyuan pipeline", "python -m mixtures sft", "torchrun -m trainer train",
            "python -m proxy_eval suggest", "python -m synth export"} <= set(ran)
    runs = ws / "runs"
    for made in ("tok/tokenizer.json", "shards/phase2-curriculum/manifest.json", "shards/plots", "sft/manifest.json",
                 "pairs-export/train.jsonl", "pairs-clean/records.jsonl", "cma-avg", "cma-hf/config.json", "lr.png",
                 "global/dedup", "p1/summary.json", "p1-ddp/summary.json"):
        assert (runs / made).exists(), made
    assert (ws / "runs" / "demo" / "proxy" / "mixture-draft.yaml").is_file()


@pytest.mark.parametrize("text,key", [
    ("python -m trainer params --preset 1.7b", "python -m trainer params"),
    ("SYNTH_PG_DSN=postgresql://u@h/db python -m synth text_to_sql --out x", "python -m synth text_to_sql"),
    ("torchrun --standalone --nproc_per_node 2 -m trainer train --config c.yaml", "torchrun -m trainer train"),
    ("spark-submit --master yarn --archives venv.tar.gz#venv kaiyuan/jobs/pipeline.py --config c", "spark-submit kaiyuan/jobs/pipeline.py"),
    ("printf 'a\\n' > costs.csv", "shell printf"),
    ("(cd /path/to/purokit && zip -qr /tmp/p.zip purokit)", "shell cd"),
])
def test_command_keys(text, key):
    from tests.demo.readme_commands import command_key

    assert command_key(text) == key
