"""`backend: batch` over the OpenAI Batch API protocol (the fake server's /v1/files and
/v1/batches, the official openai client): the same records as an online run, resume by batch id
after SIGKILL, and expired and failed lines sent online or reported per prompt."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from synth.batch import batch_line, line_failure, line_outcomes, poll_delays
from synth.client import ChatRequest
from synth.engine import run
from synth.fakeserver import Fault
from synth.pipeline import GeneratorConfig

from .conftest import pairs_config, spawn_synth

FAST_BATCH = {"batch_collect_s": 0.2, "batch_poll_s": 0.02, "batch_poll_max_s": 0.1}


def gen(d: dict) -> GeneratorConfig:
    return GeneratorConfig.model_validate(d)


def batch_config(url: str, n_prompts: int = 8, **teacher: object) -> dict:
    cfg = pairs_config(url, n_prompts=n_prompts, n=2)
    for t in cfg["teachers"].values():
        t.update(backend="batch", **FAST_BATCH, **teacher)
    return cfg


def one_stage_config(url: str, n_prompts: int, **teacher: object) -> dict:
    """One generate step: one batch for the whole run."""
    cfg = batch_config(url, n_prompts, **teacher)
    cfg["steps"] = cfg["steps"][:1]
    cfg["teachers"] = {"reasoning": cfg["teachers"]["reasoning"]}
    return cfg


def online(cfg: dict) -> dict:
    cfg = json.loads(json.dumps(cfg))
    for t in cfg["teachers"].values():
        t["backend"] = "openai"
    return cfg


# ---- pure pieces ------------------------------------------------------------------------------

def test_batch_line_carries_the_online_body_and_outcomes_name_their_failure():
    req = ChatRequest(messages=[{"role": "user", "content": "2+2?"}], params={"max_tokens": 8}, seed=3)
    line = json.loads(batch_line("k1", "m", req))
    assert line == {"custom_id": "k1", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": "m", "messages": req.messages, "max_tokens": 8, "seed": 3}}
    ok = {"custom_id": "a", "response": {"status_code": 200, "body": {}}, "error": None}
    bad = {"custom_id": "b", "response": {"status_code": 500, "body": {"error": {"message": "boom"}}}, "error": None}
    gone = {"custom_id": "c", "response": None, "error": {"code": "batch_expired", "message": "window"}}
    lines = line_outcomes(json.dumps(ok) + "\n", json.dumps(bad) + "\n" + json.dumps(gone) + "\n")
    batch = {"id": "batch_1", "status": "failed", "errors": {"data": [{"code": "invalid_json_line", "message": "x",
                                                                          "line": 2}]}}
    assert line_failure(lines["a"], batch) is None
    assert line_failure(lines["b"], batch) == "HTTP 500: boom"
    assert line_failure(lines["c"], batch) == "batch_expired: window"
    assert line_failure(None, batch) == "batch batch_1 ended failed without this line (invalid_json_line: x (line 2))"
    d = poll_delays(1.0, 5.0)
    assert [next(d) for _ in range(5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


# ---- over the protocol ------------------------------------------------------------------------

def test_batch_run_equals_online_run_record_for_record(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    cfg = batch_config(srv.base_url)
    res = run(gen(cfg), tmp_path / "batch", progress=False)
    assert res.manifest.status == "complete" and res.n_records > 0
    n_chat = srv.stats.n_requests - srv.stats.n_batch_lines
    assert n_chat == 0                                    # every answer came through a batch
    created = [b for s in res.manifest.usage["this_run"].values() for b in s["batches_created"]]
    assert sorted(created) == sorted(srv.batch.batches) and len(created) == 2     # one per stage (role)
    assert all(b["status"] == "completed" for b in srv.batch.batches.values())
    ref = run(gen(online(cfg)), tmp_path / "online", progress=False)
    assert (tmp_path / "batch" / "records.jsonl").read_bytes() == (tmp_path / "online" / "records.jsonl").read_bytes()
    assert res.manifest.usage["completion_tokens"] == ref.manifest.usage["completion_tokens"]
    # the answers are in the cache: a rerun from it needs no batch
    run(gen(cfg), tmp_path / "batch", fresh=True, progress=False)
    assert len(srv.batch.batches) == 2


def test_killed_between_submission_and_completion_resumes_by_batch_id(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    srv.batch.hold = True                                 # batches stay in_progress
    cfg = one_stage_config(srv.base_url, n_prompts=6)
    out = tmp_path / "killed"
    proc, _ = spawn_synth(cfg, tmp_path, out)
    journal = out / "batches.jsonl"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60 and not (journal.exists() and journal.read_text().endswith("\n")):
        time.sleep(0.05)
    while time.monotonic() - t0 < 60 and not any(b["status"] == "in_progress" for b in srv.batch.batches.values()):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    (bid,) = srv.batch.batches
    assert json.loads(journal.read_text())["batch_id"] == bid
    assert not (out / "records.jsonl").exists()
    srv.batch.hold = False
    res = run(gen(cfg), out, progress=False)
    assert res.manifest.status == "complete"
    assert list(srv.batch.batches) == [bid]               # resumed by id, no second batch
    stats = res.manifest.usage["this_run"]["reasoning"]
    assert stats["batches_resumed"] == [bid] and stats["batches_created"] == []
    run(gen(online(cfg)), tmp_path / "online", progress=False)
    assert (out / "records.jsonl").read_bytes() == (tmp_path / "online" / "records.jsonl").read_bytes()


def test_expired_and_failed_lines_are_sent_online(fake_server, tmp_path):
    srv = fake_server("arithmetic", faults=[Fault("500", first_n=2)])      # the first 2 lines fail
    srv.batch.expire_after = 4                            # the window ends after 4 lines
    cfg = one_stage_config(srv.base_url, n_prompts=6)
    res = run(gen(cfg), tmp_path / "r", progress=False)
    assert res.manifest.status == "complete"
    (batch,) = srv.batch.batches.values()
    assert batch["status"] == "expired" and batch["request_counts"] == {"total": 12, "completed": 2, "failed": 10}
    errors = [json.loads(x) for x in srv.batch.contents[batch["error_file_id"]].decode().splitlines()]
    assert sorted(str(e["error"]["code"] if e["error"] else e["response"]["status_code"]) for e in errors) == \
        ["500", "500"] + ["batch_expired"] * 8
    stats = res.manifest.usage["this_run"]["reasoning"]
    assert stats["failed_lines"] == stats["sent_online"] == 10 and stats["batched"] == 2
    assert srv.stats.n_requests - srv.stats.n_batch_lines == stats["sent_online"]
    run(gen(online(cfg)), tmp_path / "online", progress=False)
    assert (tmp_path / "r" / "records.jsonl").read_bytes() == (tmp_path / "online" / "records.jsonl").read_bytes()


def test_failed_lines_reported_per_prompt_then_a_rerun_batches_only_them(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    srv.batch.expire_after = 6
    cfg = one_stage_config(srv.base_url, n_prompts=6, batch_failed="report")
    res = run(gen(cfg), tmp_path / "r", progress=False)
    assert res.manifest.status == "partial"
    examples = res.manifest.errors["examples"]
    assert res.manifest.errors["prompts_failed"] >= 3 and all("batch_expired" in e for e in examples)
    assert srv.stats.n_requests == srv.stats.n_batch_lines       # nothing went online
    srv.batch.expire_after = None
    res = run(gen(cfg), tmp_path / "r", progress=False)
    assert res.manifest.status == "complete"
    first, second = srv.batch.batches.values()
    assert second["request_counts"]["total"] == 12 - first["request_counts"]["completed"]


def test_a_batch_api_that_cannot_be_reached_stops_the_run_with_the_reason(tmp_path):
    from synth.client import RequestRejected
    from synth.servers import free_port

    cfg = one_stage_config(f"http://127.0.0.1:{free_port()}/v1", n_prompts=2, max_retries=0)
    with pytest.raises(RequestRejected, match="submitting a batch of 4 requests failed: APIConnectionError"):
        run(gen(cfg), tmp_path / "r", progress=False)
