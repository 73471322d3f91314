"""`python -m trainer` commands as the README shows them: params, schedule, train with overrides
(in-process through `main`, the same argparse path the module entry point runs)."""

import json

import yaml

from trainer.__main__ import main as trainer_main

from .conftest import run_config


def test_params_command_prints_the_1_7b_counts(capsys):
    assert trainer_main(["params", "--preset", "1.7b"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 2_031_739_904 and out["muonh"] == 1_409_286_144
    assert out["by_role"]["q_proj"] == 28 * 2048 * 2048


def test_schedule_command_plots_the_gallery_and_a_run(shard_sets, tmp_path, capsys):
    assert trainer_main(["schedule", "--out", str(tmp_path / "gallery.png"), "--steps", "400"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (tmp_path / "gallery.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert res["curves"]["wsd r=1.0 (linear)"]["last"] == 0.0
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump(run_config(tmp_path / "r", shard_sets)))
    assert trainer_main(["schedule", "--config", str(conf), "--out", str(tmp_path / "run.png"),
                         "schedule.decay_ratio=1.0"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["curves"]["base"]["n"] == 8 and res["curves"]["base"]["last"] == 0.0


def test_train_command_with_overrides(shard_sets, tmp_path, capsys):
    conf = tmp_path / "run.yaml"
    conf.write_text(yaml.safe_dump(run_config(tmp_path / "r", shard_sets)))
    assert trainer_main(["train", "--config", str(conf), "train.steps=3", "log.progress=line"]) == 0
    out = capsys.readouterr().out
    assert "step 3/3 | loss" in out
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["step"] == 3 and summary["eval_loss"] > 0
