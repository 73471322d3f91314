"""The CLI commands that need no model: plan and fit (run/eval/profile/pca/suggest are exercised in
test_run.py on a real proxy run)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from proxy_eval.__main__ import main
from proxy_eval.fits import cost_law
from tests.proxy_eval.helpers import synthetic_scored_component


def test_cli_plan(tmp_path, capsys):
    web = synthetic_scored_component(tmp_path / "c", "web", n_docs=400)
    cfg = tmp_path / "plan.yaml"
    cfg.write_text(f"components:\n  - path: {web}\n    score_field: hq\nout: {tmp_path / 'plan'}\n"
                   "rules: {slice_tokens: 2000, quantile_min_tokens: 10000, random_min_tokens: 1000}\n")
    assert main(["plan", "--config", str(cfg), "rules.percentiles=[0, 50]"]) == 0
    out = capsys.readouterr().out
    assert "web: quantile" in out and "web.q50-from-best" in out
    assert (tmp_path / "plan" / "slices" / "web.q00-from-best" / "manifest.json").is_file()


def _write_csv(path, header, rows):
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows)


def test_cli_fit_cost_and_power(tmp_path, capsys):
    costs = [3.0, 4.4, 6.89, 9.0, 12.0]
    _write_csv(tmp_path / "cost.csv", ["cost", "score"], [(c, float(cost_law(c, 53.86, 1.019))) for c in costs])
    assert main(["fit", "cost", "--csv", str(tmp_path / "cost.csv"), "--invert", "57.17", "57.81",
                 "--out", str(tmp_path / "cost.json")]) == 0
    res = json.loads((tmp_path / "cost.json").read_text())
    assert res["inversions"]["57.17"] == pytest.approx(11.36, abs=0.05)
    assert res["inversions"]["57.81"] == pytest.approx(16.55, abs=0.05)
    C = np.logspace(17, 20, 6)
    _write_csv(tmp_path / "pl.csv", ["compute", "loss"], [(c, 1e3 * c ** -0.15 + 2.0) for c in C])
    capsys.readouterr()
    assert main(["fit", "power", "--csv", str(tmp_path / "pl.csv")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["b"] == pytest.approx(-0.15, rel=1e-4) and res["c"] == pytest.approx(2.0, rel=1e-4)


def test_cli_fit_mpl_with_heldout(tmp_path):
    from proxy_eval.fits import mpl_loss
    from tests.proxy_eval.test_analysis import TRUE, _sched

    rows = []
    for kind in ("constant", "cosine", "step", "wsd"):
        lr = _sched(kind, 400)
        loss = mpl_loss(lr, TRUE)
        rows += [(kind, i + 1, lr[i], loss[i] if i % 10 == 9 else "") for i in range(400)]
    _write_csv(tmp_path / "mpl.csv", ["curve", "step", "lr", "loss"], rows)
    assert main(["fit", "mpl", "--csv", str(tmp_path / "mpl.csv"), "--heldout", "wsd", "--out", str(tmp_path / "m.json")]) == 0
    res = json.loads((tmp_path / "m.json").read_text())
    assert res["heldout_rmse"]["wsd"] < 1e-3
    assert res["params"]["alpha"] == pytest.approx(TRUE.alpha, rel=1e-2)


def test_readme_cost_law_example(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "costs.csv").write_text("cost,score\n4.4,55.6\n6.89,55.99\n9.0,56.7\n12.0,57.2\n")
    assert main(["fit", "cost", "--csv", "costs.csv", "--invert", "57.17", "57.81"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["c0"] == 1.84 and 0 < res["b"] < 3 and res["rmse"] < 0.5
    assert res["inversions"]["57.17"] < res["inversions"]["57.81"]
