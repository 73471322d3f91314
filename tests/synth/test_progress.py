"""Progress of long runs: prompts done, live tokens/s, an ETA, and each endpoint's concurrency,
through the one reporter of every command (purokit.progress): a bar on a terminal or
`prompt <done>/<total> | <figures>` lines to a log (the demo's stages)."""

from __future__ import annotations

import re

from synth.engine import format_eta, progress_message, run
from synth.pipeline import GeneratorConfig

from .conftest import pairs_config


def test_eta_and_progress_line():
    assert [format_eta(s) for s in (None, 45, 725, 12000)] == ["?", "45s", "12m05s", "3h20m"]
    line = progress_message(10, 40, 3000, 60.0, errors=2, limits={"127.0.0.1:8000": 6}, accepted=15, generated=20)
    assert line == "50 tok/s, ETA 3m00s, accept 75%, 2 failed, concurrency 127.0.0.1:8000=6"
    # no prompt finished yet: the tokens still show the teacher working, the ETA is unknown
    assert progress_message(0, 40, 120, 10.0) == "12 tok/s, ETA ?"


def test_a_run_reports_progress_lines_while_it_runs_and_when_it_ends(fake_server, tmp_path):
    srv = fake_server("arithmetic", latency_s=0.05)
    cfg = pairs_config(srv.base_url, n_prompts=6, n=2)
    cfg["output"]["progress_every_s"] = 0.05
    lines: list[str] = []
    res = run(GeneratorConfig.model_validate(cfg), tmp_path / "r", progress=lines.append)
    assert res.manifest.status == "complete"
    pattern = re.compile(r"^prompt (\d)/6 \| (\d+) tok/s, ETA (\S+)(?:, accept \d+%)?, concurrency 127\.0\.0\.1:\d+=\d+$")
    parsed = [pattern.match(x) for x in lines]
    assert all(parsed), lines
    assert len(lines) >= 2                             # the heartbeat, then the closing line
    last = parsed[-1]
    assert last.group(1) == "6" and int(last.group(2)) > 0 and last.group(3) == "0s"
    done = [int(m.group(1)) for m in parsed]
    assert done == sorted(done)
