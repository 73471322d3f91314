"""The demo chain end to end at reduced size (the `ci` profile): every stage runs through its real
package code (spark-submit, materialization, training, a scripted teacher over real HTTP, SFT), the
report shows every section, and a rerun reuses every finished stage."""

import json
import math
import subprocess
import sys


from purokit.demo.report import SECTIONS
from purokit.demo.stages import STAGES


def test_every_stage_finishes_and_says_where_things_are(demo_run):
    out, stdout = demo_run
    for name, _ in STAGES:
        rec = json.loads((out / name / "stage.json").read_text())
        assert rec["profile"] == "ci" and rec["result"], name
    assert "Where everything is:" in stdout and f"Report: {out / 'report.html'}" in stdout
    # one progress line per step, tagged with its stage
    for name, _ in STAGES:
        assert f"{name:>10} |" in stdout, name


def test_results_are_real_numbers(demo_run):
    out, _ = demo_run
    trainer = json.loads((out / "trainer" / "stage.json").read_text())["result"]
    losses = trainer["held_out_loss"]
    assert set(losses) == {"phase1", "UD", "CD", "CDC", "CMA"}
    assert all(math.isfinite(v) and v > 0 for v in losses.values())
    assert trainer["export_check"]["max_logit_diff"] < 1e-3
    sft = json.loads((out / "sft" / "stage.json").read_text())["result"]
    assert sft["records"]["train"] > 0
    assert sft["eval_loss_after"] < sft["eval_loss_before"]


def test_report_has_every_section_with_images(demo_run):
    out, _ = demo_run
    page = (out / "report.html").read_text()
    for key, title, _ in SECTIONS:
        assert f"id='{key}'" in page
    assert "has not run" not in page and "missing image" not in page
    # biplot, 3 composition plots + rank profiles, LR/loss curves
    assert page.count("data:image/png;base64,") >= 6


def test_rerun_reuses_every_finished_stage(demo_run):
    out, _ = demo_run
    proc = subprocess.run([sys.executable, "-m", "purokit.demo", "--profile", "ci", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reused = [ln for ln in proc.stdout.splitlines() if "reused (finished before" in ln]
    assert len(reused) == len(STAGES)
