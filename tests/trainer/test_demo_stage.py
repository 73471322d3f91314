"""The demo's trainer stage (ci profile) on shard sets shaped like the mixtures stage's result, and
the README's `python -m trainer` commands run against its output (torchrun's form is exercised by
test_train.py::test_two_ddp_processes_match_one_process)."""

import json
import re
import shlex
from pathlib import Path

import pytest

from purokit.demo.context import DemoContext
from trainer import checkpoint as ckpt
from trainer.__main__ import main as trainer_main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stage(bpe, tmp_path_factory):
    import purokit.demo.trainer_stage as trainer_stage

    root = tmp_path_factory.mktemp("demo")
    ctx = DemoContext(root=root, profile="ci")
    ctx.results["mixtures"] = {
        "sets": {"phase1-uniform": bpe["train"], "phase2-curriculum": bpe["phase2-curriculum"],
                 "phase2-uniform": bpe["phase2-uniform"], "eval": bpe["heldout"]},
        "tokenizer": str(bpe["tokenizer"] / "tokenizer.json"), "seq_len": 32}
    ctx.stage = "trainer"
    result = trainer_stage.run(ctx)
    json.dumps(result)                                   # the demo stores it as JSON
    return root, result, trainer_stage.summary(result)


def test_trainer_stage_trains_three_variants_and_exports_cma(stage):
    root, res, lines = stage
    h = res["held_out_loss"]
    assert set(h) == {"phase1", "UD", "CD", "CDC", "CMA"} and all(0 < v < 10 for v in h.values())
    assert set(res["metrics"]) == {"UD", "CD", "CMA"}
    p1_step = ckpt.read_state(res["phase1"]["checkpoint"]).step
    for variant, run in res["runs"].items():
        recs = [json.loads(l) for l in Path(run["metrics"]).read_text().splitlines()]
        assert recs[0]["step"] == p1_step                   # all three start from the phase-1 checkpoint
        assert Path(run["config"]).is_file()
    cma = ckpt.read_state(res["runs"]["CMA"]["average"])
    assert cma.kind == "average" and len(cma.sources) == 6 and cma.weights_dtype == "bfloat16"
    assert res["export_check"]["class"] == "Qwen3ForCausalLM"
    assert res["export_check"]["max_logit_diff"] < 1e-4
    assert (Path(res["export"]) / "tokenizer_config.json").is_file()
    assert Path(res["plot"]).read_bytes()[:4] == b"\x89PNG"
    assert lines[0].startswith("held-out loss: phase 1")


def readme_trainer_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text.split("## trainer: ", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def test_readme_commands_run_on_the_stage_output(stage, tmp_path, capsys):
    root, res, _ = stage
    commands = readme_trainer_commands()
    assert any(c.startswith("torchrun") for c in commands)
    ran = 0
    for cmd in commands:
        if cmd.startswith("torchrun"):
            continue
        cmd = cmd.replace("runs/demo/", f"{root}/").replace("runs/", f"{tmp_path}/")
        cmd = re.sub(r"--spacing 20\b", "--spacing 1", cmd)  # the README shows the demo profile's spacing
        argv = shlex.split(cmd)
        assert argv[:3] == ["python", "-m", "trainer"], cmd
        assert trainer_main(argv[3:]) == 0, cmd
        ran += 1
    assert ran == sum(not c.startswith("torchrun") for c in commands)       # the torchrun ones: DDP and FSDP2
    assert ckpt.read_state(tmp_path / "cma-avg").kind == "average"
    assert ckpt.read_state(tmp_path / "cma-import" / "step_00000000").model["vocab_size"] == \
        ckpt.read_state(tmp_path / "cma-avg").model["vocab_size"]              # import-hf read the export back
    assert (tmp_path / "cma-hf" / "config.json").is_file() and (tmp_path / "lr.png").is_file()
    p1 = [json.loads(l) for l in (tmp_path / "p1" / "metrics.jsonl").read_text().splitlines()]
    assert "muon/q_proj" in p1[-2]["lr"] or "muon/q_proj" in p1[-1].get("lr", {})
