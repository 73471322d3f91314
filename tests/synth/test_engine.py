"""The engine end to end over real HTTP: pairs, determinism, cache, resume after SIGKILL,
decontamination before generation, RL records, the step API, the in-process vLLM adapter."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from purokit.errors import ContractError
from synth.backends import CachedBackend, VllmBackend, result_from_vllm_output, vllm_sampling_kwargs
from synth.cache import ResponseCache
from synth.client import ChatRequest, TeacherConfig
from synth.engine import run, run_async
from synth.export import load_export
from synth.fakeserver import Fault
from synth.pipeline import GeneratorConfig, Row, Step, register_step
from synth.servers import free_port
from purokit.records import SYSTEM_OFF, SYSTEM_ON, read_records

from .conftest import fast_teacher, pairs_config, spawn_synth

REPO = Path(__file__).resolve().parents[2]


def gen(d: dict) -> GeneratorConfig:
    return GeneratorConfig.model_validate(d)


def test_reasoning_pairs_end_to_end(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    res = run(gen(pairs_config(srv.base_url, n_prompts=12)), tmp_path / "run", progress=False)
    recs = list(read_records(res.records_path))
    assert recs and res.manifest.status == "complete"
    pairs = Counter(r.pair_id for r in recs if r.pair_id)
    assert pairs and set(pairs.values()) == {2}                    # each strict pair exactly twice
    for r in recs:
        assert r.system in (SYSTEM_ON, SYSTEM_OFF) and r.messages[0].content == r.system
        text = r.messages[-1].content
        if r.reasoning == "on":
            assert text.count("<think>") == 1 and text.count("</think>") == 1 and text.split("</think>")[1].strip()
        else:
            assert "<think>" not in text and "</think>" not in text
        assert r.verification.verdict and r.verification.method == "math"
        assert r.teacher.temperature == 0.6 and r.teacher.top_p == 0.95 and r.teacher.seed is not None
    on_pair = {r.pair_id: r for r in recs if r.pair_role == "on"}
    off_pair = {r.pair_id: r for r in recs if r.pair_role == "off"}
    assert set(on_pair) == set(off_pair)
    assert all(on_pair[p].messages[1] == off_pair[p].messages[1] for p in on_pair)     # same prompt
    m = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert m["schema"] == "synth-run/1" and m["steps"]["verify"]["in"] >= m["steps"]["verify"]["out"] > 0
    assert 0 < m["steps"]["verify"]["acceptance"] < 1                 # the fake teacher is wrong sometimes
    rejects = [json.loads(x) for x in (tmp_path / "run" / "rejects.jsonl").read_text().splitlines()]
    assert any("!= reference" in r["reason"] for r in rejects)


def test_same_inputs_give_byte_identical_records_and_reruns_are_free(fake_server, tmp_path):
    a = fake_server("arithmetic")
    b = fake_server("arithmetic", faults=[Fault("500", every=4), Fault("drop", every=9)], latency_s=0.002)
    cfg_a = pairs_config(a.base_url, n_prompts=10)
    cfg_b = pairs_config(b.base_url, n_prompts=10)
    for t in cfg_b["teachers"].values():
        t["initial_concurrency"] = 2                                      # different interleaving
    run(gen(cfg_a), tmp_path / "a", progress=False)
    run(gen(cfg_b), tmp_path / "b", progress=False)
    assert (tmp_path / "a" / "records.jsonl").read_bytes() == (tmp_path / "b" / "records.jsonl").read_bytes()
    n_before = a.stats.n_requests
    res = run(gen(cfg_a), tmp_path / "a", progress=False)                # finished: nothing to do
    (tmp_path / "a" / "journal.jsonl").unlink()
    res = run(gen(cfg_a), tmp_path / "a", progress=False)                # journal gone: all from the cache
    assert a.stats.n_requests == n_before and res.manifest.usage["cached"] == res.manifest.usage["requests"]
    assert (tmp_path / "a" / "records.jsonl").read_bytes() == (tmp_path / "b" / "records.jsonl").read_bytes()


def test_a_different_config_in_the_same_directory_is_refused(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    run(gen(pairs_config(srv.base_url, n_prompts=3)), tmp_path / "r", progress=False)
    cfg = pairs_config(srv.base_url, n_prompts=3, seed=99)
    with pytest.raises(ContractError, match="different generator config"):
        run(gen(cfg), tmp_path / "r", progress=False)
    run(gen(cfg), tmp_path / "r", fresh=True, progress=False)


def test_contaminated_prompts_never_reach_a_teacher(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    names = ["Tom", "Ana", "Raj", "Lea", "Kim", "Bo"]
    things = ["apples", "kites", "shells", "cards", "beads", "rocks"]
    places = ["basket", "garage", "bucket", "drawer", "jar", "box"]
    prompts = [{"id": f"q{i}", "prompt": f"{names[i]} keeps {i} red {things[i]} and {i + 3} green {things[i]} in a "
                f"{places[i]} near the {places[i - 1]}. How many {things[i]} does {names[i]} keep in the {places[i]}?",
                "reference": str(2 * i + 3)} for i in range(6)]
    evals = tmp_path / "eval.jsonl"
    evals.write_text(json.dumps({"question": prompts[2]["prompt"].upper()}) + "\n"
                     + json.dumps({"question": prompts[4]["prompt"]}) + "\n")
    cfg = pairs_config(srv.base_url, source={"kind": "inline", "items": prompts})
    cfg["steps"].insert(0, {"kind": "decontaminate", "evals": [{"name": "evalset", "path": str(evals)}]})
    res = run(gen(cfg), tmp_path / "r", progress=False)
    sent = {m["content"] for b in srv.stats.bodies for m in b["messages"] if m["role"] == "user"}
    assert prompts[2]["prompt"] not in sent and prompts[4]["prompt"] not in sent and prompts[0]["prompt"] in sent
    assert res.manifest.counts["prompts_dropped"] == {"decontaminate": 2}
    rejects = [json.loads(x) for x in (tmp_path / "r" / "rejects.jsonl").read_text().splitlines()]
    assert sum("contaminated: 13-gram overlap with evalset" in r["reason"] for r in rejects) == 2


def test_majority_vote_supplies_the_reference_when_none_exists(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    items = [{"id": "m0", "prompt": "Ada has 5 coins and finds 6 more. How many coins?"}]
    cfg = pairs_config(srv.base_url, n=5, source={"kind": "inline", "items": items})
    res = run(gen(cfg), tmp_path / "r", progress=False)
    recs = list(read_records(res.records_path))
    assert recs and all(r.answer_source == "majority_vote" and r.meta["reference"] == "11" for r in recs)
    assert all(r.verification.rule == "majority_vote" for r in recs)


def test_kill_9_mid_run_then_resume_loses_and_duplicates_nothing(fake_server, tmp_path):
    srv = fake_server("arithmetic", latency_s=0.02)
    cfg = pairs_config(srv.base_url, n_prompts=40, n=2)
    for t in cfg["teachers"].values():
        t["initial_concurrency"] = 2
        t["max_concurrency"] = 2
    cfg["output"]["max_inflight_rows"] = 4
    out = tmp_path / "killed"
    proc, cmd = spawn_synth(cfg, tmp_path, out)
    journal = out / "journal.jsonl"
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        if journal.exists() and journal.read_text().count("\n") >= 8:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    n_done = journal.read_text().count("\n") - 1
    assert 0 < n_done < 40, "the kill must land mid-run"
    resumed = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ids = [json.loads(x)["id"] for x in journal.read_text().splitlines()[1:]]
    assert len(ids) == len(set(ids)) == 40
    recs = [json.loads(x)["id"] for x in (out / "records.jsonl").read_text().splitlines()]
    assert len(recs) == len(set(recs))
    run(gen(cfg), tmp_path / "clean", progress=False)
    assert (out / "records.jsonl").read_bytes() == (tmp_path / "clean" / "records.jsonl").read_bytes()


def test_torn_journal_line_is_truncated_on_resume(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    cfg = pairs_config(srv.base_url, n_prompts=5)
    run(gen(cfg), tmp_path / "r", progress=False)
    j = tmp_path / "r" / "journal.jsonl"
    lines = j.read_text().splitlines(keepends=True)
    j.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])      # a kill mid-write
    run(gen(cfg), tmp_path / "r", progress=False)
    assert len(j.read_text().splitlines()) == 6


def test_rl_difficulty_records_carry_rollouts_and_curriculum(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    cfg = {
        "generator": "rl_test", "seed": 3, "teachers": {"policy": fast_teacher([srv.base_url], precision="bf16")},
        "source": {"kind": "arithmetic_word_problems", "n": 20},
        "steps": [
            {"kind": "generate", "field": "s", "teacher": "policy", "n": 8, "logprobs": True, "return_token_ids": True,
             "params": {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}},
            {"kind": "verify", "fields": ["s"], "method": "math"},
            {"kind": "pass_rate", "field": "s", "max_pass_rate": 0.75},
            {"kind": "format_rl", "field": "s", "max_context": 2048},
        ],
        "post": [{"kind": "curriculum", "order": "easy_to_hard"}],
        "output": {"formats": ["jsonl", "datasets"]},
    }
    res = run(gen(cfg), tmp_path / "rl", progress=False)
    recs = list(read_records(res.records_path))
    prompts = [r for r in recs if r.kind == "rl_prompt"]
    rollouts = [r for r in recs if r.kind == "rl_rollout"]
    assert prompts and all(r.pass_rate < 0.75 and r.n_samples == 8 and r.estimator == "fake-teacher" for r in prompts)
    rates = [r.pass_rate for r in prompts]
    assert rates == sorted(rates, reverse=True) and [r.curriculum_rank for r in prompts] == list(range(len(prompts)))
    assert len(rollouts) == 8 * len(prompts)
    for r in rollouts:
        ro = r.rollout
        assert ro.token_ids_source == "engine" and len(ro.completion_token_ids) == len(ro.rollout_logprobs) > 0
        assert ro.policy == "fake-teacher" and ro.temperature == 1.0 and ro.precision == "bf16"
        assert ro.logprobs_mode == "raw_logprobs" and not ro.logprobs_after_sampling_transforms
        assert r.reward in (0.0, 1.0)
    dropped = res.manifest.counts["prompts_dropped"].get("pass_rate", 0)
    assert dropped + len(prompts) == 20
    dd = load_export(tmp_path / "rl" / "export")
    assert set(dd) == {"rl_prompts", "rl_rollouts"} and len(dd["rl_rollouts"]) == len(rollouts)


@register_step("test_shout")
class Shout(Step):
    """A custom step the way a domain generator adds one."""

    class Config(Step.Config):
        field: str
        banned: str = "7"

    async def apply(self, row: Row) -> None:
        alive = self.alive(row, self.cfg.field)
        for c in alive:
            if self.cfg.banned in c.text:
                self.reject(row, c, f"mentions {self.cfg.banned}")
        self.count(row, len(alive), len(self.alive(row, self.cfg.field)))


def test_custom_steps_plug_in_with_counts_and_quarantine(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    cfg = {"generator": "custom", "teachers": {"t": fast_teacher([srv.base_url])},
           "source": {"kind": "arithmetic_word_problems", "n": 10},
           "steps": [{"kind": "generate", "field": "a", "teacher": "t", "mode": "off", "n": 2},
                     {"kind": "test_shout", "field": "a"}, {"kind": "format_sft", "field": "a"}]}
    res = run(gen(cfg), tmp_path / "c", progress=False)
    sc = res.manifest.steps["test_shout:a"]
    assert sc["in"] == 20 and 0 < sc["out"] < 20
    assert all("7" not in r.messages[-1].content for r in read_records(res.records_path))
    with pytest.raises(ValueError, match="unknown kind 'nope'"):
        run(gen(dict(cfg, steps=[{"kind": "nope"}])), tmp_path / "d", progress=False)
    with pytest.raises(ValueError, match="field 'n'"):
        run(gen(dict(cfg, steps=[{"kind": "generate", "field": "a", "teacher": "t", "n": "many"}])),
            tmp_path / "e", progress=False)


# ---- in-process vLLM adapter (vLLM itself cannot run on this CPU-only machine) ----------------

class _Logprob(SimpleNamespace):
    pass


class StandInLLM:
    """Mimics `vllm.LLM.chat`: returns RequestOutput-shaped objects."""

    def __init__(self):
        self.calls: list[int] = []
        self.chat_kw: list[dict] = []

    def chat(self, messages, sampling_params, use_tqdm=False, **chat_kw):
        self.calls.append(len(messages))
        self.chat_kw.append(chat_kw)
        outs = []
        for msgs, sp in zip(messages, sampling_params):
            ids = [100 + sp["seed"] % 7, 200]
            lps = [{ids[0]: _Logprob(logprob=-0.5, decoded_token="4")}, {ids[1]: _Logprob(logprob=-0.1, decoded_token=".")}] \
                if "logprobs" in sp else None
            comp = SimpleNamespace(text=f"answer {sp['seed']}", token_ids=ids, logprobs=lps, finish_reason="stop")
            outs.append(SimpleNamespace(outputs=[comp], prompt_token_ids=[1, 2, 3]))
        return outs


def test_vllm_backend_adapter_batches_and_maps_outputs(tmp_path):
    llm = StandInLLM()
    cfg = TeacherConfig(model="m", backend="vllm", engine="vllm")
    backend = CachedBackend(VllmBackend(cfg, llm_factory=lambda: (llm, dict)), ResponseCache(tmp_path / "c.sqlite"))
    reqs = [ChatRequest(messages=[{"role": "user", "content": "q"}], params={"temperature": 1.0, "max_tokens": 8},
                        seed=i, logprobs=True) for i in range(10)]

    async def go():
        out = await asyncio.gather(*(backend.complete(r) for r in reqs))
        again = await backend.complete(reqs[0])
        await backend.close()
        return out, again
    out, again = asyncio.run(go())
    assert [r.content for r in out] == [f"answer {i}" for i in range(10)]
    assert sum(llm.calls) == 10 and len(llm.calls) < 10                  # batched, not one call per request
    assert out[3].token_ids == [103, 200] and out[3].logprobs == [-0.5, -0.1] and out[3].prompt_token_ids == [1, 2, 3]
    assert again.cached and again.token_ids == [100, 200]
    assert all(kw == {} for kw in llm.chat_kw)

    pre = ChatRequest(messages=[{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>\n"}],
                      params={"continue_final_message": True, "add_generation_prompt": False}, seed=50)
    plain = ChatRequest(messages=[{"role": "user", "content": "q"}], seed=51)
    llm2 = StandInLLM()
    b2 = VllmBackend(cfg, llm_factory=lambda: (llm2, dict))

    async def mixed():
        await b2.start()
        out = await asyncio.gather(b2.complete(pre), b2.complete(plain))
        await b2.close()
        return out
    asyncio.run(mixed())
    assert sorted(map(sorted, llm2.chat_kw)) == [[], ["add_generation_prompt", "continue_final_message"]]
    assert vllm_sampling_kwargs(reqs[0]) == {"temperature": 1.0, "max_tokens": 8, "seed": 0, "logprobs": 0}
    res = result_from_vllm_output(SimpleNamespace(outputs=[SimpleNamespace(text="x", token_ids=[5], logprobs=None,
                                                                            finish_reason="length")]), "m", False)
    assert res.truncated and res.logprobs is None and res.token_ids == [5]


def test_vllm_backend_without_vllm_says_how_to_get_it(tmp_path):
    try:
        import vllm  # noqa: F401
        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    backend = VllmBackend(TeacherConfig(model="m", backend="vllm"))
    with pytest.raises(RuntimeError, match="purokit\\[vllm\\]"):
        asyncio.run(backend.start())


def test_judge_admits_and_rejects_and_records_its_rule(fake_server, tmp_path):
    """Without a reference: a judge endpoint decides (LN §3.2 reward/judge filtering)."""
    def responder(req):
        text = req["messages"][-1]["content"]
        if text.startswith("You are grading"):
            ok = "Candidate answer:\nPARIS" in text
            assert req["response_format"]["type"] == "json_schema"          # constrained verdicts
            return json.dumps({"verdict": ok})
        return "PARIS" if req["seed"] % 2 else "LYON"
    srv = fake_server(responder)
    cfg = {"generator": "judged", "teachers": {"t": fast_teacher([srv.base_url]), "judge": fast_teacher([srv.base_url])},
           "source": {"kind": "inline", "items": [{"id": "q", "prompt": "Capital of France?"}]},
           "steps": [{"kind": "generate", "field": "a", "teacher": "t", "mode": "off", "n": 6},
                     {"kind": "verify", "fields": ["a"], "fallback": "judge", "judge": {"teacher": "judge"}},
                     {"kind": "format_sft", "field": "a"}]}
    res = run(gen(cfg), tmp_path / "j", progress=False)
    recs = list(read_records(res.records_path))
    assert recs and all(r.messages[-1].content == "PARIS" for r in recs)
    assert all(r.verification.method == "judge" and r.verification.rule == "judge:fake-teacher" for r in recs)
    assert res.manifest.steps["verify"]["in"] == 6 and res.manifest.steps["verify"]["out"] == len(recs) < 6


def test_off_mode_teacher_is_routed_by_category(fake_server, tmp_path):
    """LN testable 3: general-domain prompts go to the general teacher, others to the default."""
    general, other = fake_server(model="general-70b"), fake_server(model="instruct-70b")
    items = [{"id": "g", "prompt": "Write a haiku about rain.", "category": "general"},
             {"id": "m", "prompt": "What is 2 + 2?", "category": "math"}]
    cfg = {"generator": "routed", "source": {"kind": "inline", "items": items},
           "teachers": {"general": fast_teacher([general.base_url], model="general-70b"),
                        "instruct": fast_teacher([other.base_url], model="instruct-70b")},
           "steps": [{"kind": "generate", "field": "d", "mode": "off", "n": 1,
                      "teacher": {"general": "general", "default": "instruct"}},
                     {"kind": "format_sft", "field": "d"}]}
    res = run(gen(cfg), tmp_path / "r", progress=False)
    by_prompt = {r.prompt_id: r.teacher for r in read_records(res.records_path)}
    assert by_prompt["g"].model == "general-70b" and by_prompt["g"].role == "general"
    assert by_prompt["m"].model == "instruct-70b" and by_prompt["m"].role == "instruct"
    assert general.stats.n_requests == 1 and other.stats.n_requests == 1


def test_a_prompt_that_keeps_failing_is_retried_by_the_next_run(fake_server, tmp_path):
    items = [{"id": f"p{i}", "prompt": f"Ada has {i} coins and finds 2 more. How many coins?", "reference": str(i + 2)}
             for i in range(6)]
    bad = fake_server("arithmetic", faults=[Fault("500", contains="has 3 coins")])
    cfg = pairs_config(bad.base_url, n=1, source={"kind": "inline", "items": items})
    for t in cfg["teachers"].values():
        t["max_retries"] = 2
    res = run(gen(cfg), tmp_path / "r", progress=False)
    assert res.manifest.status == "partial" and res.manifest.errors["prompts_failed"] == 1
    assert "p3" in res.manifest.errors["examples"][0] and "HTTP 500" in res.manifest.errors["examples"][0]
    assert not (tmp_path / "r" / "records.jsonl").exists() and (tmp_path / "r" / "manifest.partial.json").exists()
    # the endpoint recovers elsewhere (a restarted server on another port): the same directory
    # resumes, and only the failed prompt is asked again
    good = fake_server("arithmetic")
    cfg2 = json.loads(json.dumps(cfg))
    for t in cfg2["teachers"].values():
        t["endpoints"] = [good.base_url]
        t["initial_concurrency"] = 3
    res2 = run(gen(cfg2), tmp_path / "r", progress=False)
    assert res2.manifest.status == "complete" and good.stats.n_requests == 2          # p3: on + off
    run(gen(cfg2), tmp_path / "clean", progress=False)
    assert (tmp_path / "r" / "records.jsonl").read_bytes() == (tmp_path / "clean" / "records.jsonl").read_bytes()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_run_against_faulty_endpoints_ends_and_its_resume_loses_and_duplicates_nothing(fake_server, tmp_path, seed):
    """Chaos: two teachers on three servers that throttle, fail, drop, truncate and garble at
    seed-chosen rates, plus a dead endpoint, with breakers that trip and give up quickly. The run
    ends (it hung once on a breaker that gave up while requests queued behind its probe), every
    prompt is done or counted failed, and resumed against healthy servers the directory holds
    exactly the records of a clean run."""
    rng = random.Random(seed)

    def faults() -> list[Fault]:
        return [Fault("500", contains="poison"), Fault("500", fraction=rng.uniform(0.05, 0.2)),
                Fault("429", every=rng.randint(4, 9), retry_after_s=rng.choice([None, 0.05])),
                Fault("drop", every=rng.randint(7, 13)), Fault("truncate", every=rng.randint(7, 17)),
                Fault("malformed", every=rng.randint(11, 19)), Fault("timeout", every=rng.randint(13, 29), delay_s=1.5)]
    a, b, c = (fake_server("arithmetic", faults=faults()) for _ in range(3))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    knobs = dict(max_retries=rng.randint(0, 2), breaker_failures=rng.randint(2, 5), breaker_cooldown_s=0.05,
                 breaker_max_trips=3, timeout_s=1.0, initial_concurrency=rng.randint(1, 4))
    items = [{"id": f"p{i}", "prompt": f"Ada has {i} coins and finds 2 more. How many coins?", "reference": str(i + 2)}
             for i in range(16)]
    items[3]["prompt"] = "poison: " + items[3]["prompt"]
    cfg = {"generator": "chaos", "seed": seed, "category": "math",
           "teachers": {"solver": fast_teacher([a.base_url, b.base_url, dead], stream=True, **knobs),
                        "checker": fast_teacher([c.base_url], **knobs)},
           "source": {"kind": "inline", "items": items},
           "steps": [{"kind": "generate", "field": "a", "teacher": "solver", "mode": "off", "n": 2},
                     {"kind": "generate", "field": "b", "teacher": "checker", "mode": "off", "n": 1},
                     {"kind": "verify", "fields": ["a", "b"], "method": "math"},
                     {"kind": "format_sft", "field": "a"}],
           "output": {"formats": ["jsonl"], "max_inflight_rows": rng.randint(2, 6)}}

    async def bounded(cfg_dict: dict, out: Path):
        return await asyncio.wait_for(run_async(gen(cfg_dict), out, progress=False), timeout=60)
    res = asyncio.run(bounded(cfg, tmp_path / "r"))
    counts, errors = res.manifest.counts, res.manifest.errors or {}
    assert counts["prompts_done"] + errors.get("prompts_failed", 0) == 16, (counts, errors)
    assert res.manifest.status == ("complete" if counts["prompts_done"] == 16 else "partial")
    assert errors.get("prompts_failed", 0) >= 1                                 # the poisoned prompt at least
    good = fake_server("arithmetic")
    healthy = json.loads(json.dumps(cfg))
    for t in healthy["teachers"].values():
        t["endpoints"] = [good.base_url]
    resumed = asyncio.run(bounded(healthy, tmp_path / "r"))
    assert resumed.manifest.status == "complete" and resumed.manifest.counts["prompts_done"] == 16
    clean = asyncio.run(bounded(healthy, tmp_path / "clean"))
    assert clean.manifest.status == "complete"
    got = (tmp_path / "r" / "records.jsonl").read_bytes()
    assert got == (tmp_path / "clean" / "records.jsonl").read_bytes()
    ids = [json.loads(line)["id"] for line in got.splitlines()]
    assert len(ids) == len(set(ids)) >= 16


def test_assistant_prefill_is_continued_and_recorded(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    cfg = pairs_config(srv.base_url, n_prompts=12)
    cfg["steps"][0]["prefill"] = "<think>\n"
    res = run(gen(cfg), tmp_path / "p", progress=False)
    on = [b for b in srv.stats.bodies if b["messages"][0]["content"] == "detailed thinking on"]
    assert on and all(b["continue_final_message"] and b["add_generation_prompt"] is False
                      and b["messages"][-1] == {"role": "assistant", "content": "<think>\n"} for b in on)
    recs = [r for r in read_records(res.records_path) if r.reasoning == "on"]
    assert recs and all(r.messages[-1].content.startswith("<think>\n") and r.messages[-1].content.count("<think>") == 1
                        for r in recs)


def test_restart_if_changed_restarts_a_changed_config_and_keeps_the_cache(fake_server, tmp_path):
    srv = fake_server("arithmetic")
    run(gen(pairs_config(srv.base_url, n_prompts=4)), tmp_path / "r", progress=False)
    n = srv.stats.n_requests
    changed = pairs_config(srv.base_url, n_prompts=4)
    changed["post"] = []                                   # another config, same requests
    res = run(gen(changed), tmp_path / "r", progress=False, restart_if_changed=True)
    assert res.manifest.status == "complete" and srv.stats.n_requests == n       # all answers from the cache
