"""The endpoint client over real HTTP against a scripted server with fault modes."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from synth.client import (AdaptiveLimit, ChatClient, ChatRequest, CircuitBreaker, CircuitOpenError, EndpointPool,
                          EndpointNotReady, LatencyGradient, MalformedResponse, RequestRejected, TeacherConfig, backoff_delay_s,
                          classify_status, parse_chat_response, request_body)
from synth.fakeserver import FakeOpenAIServer, Fault, echo_responder
from synth.servers import free_port

from .conftest import fast_teacher


def run(coro):
    return asyncio.run(coro)


def req(i: int, **kw) -> ChatRequest:
    return ChatRequest(messages=[{"role": "user", "content": f"question {i}"}], params={"max_tokens": 16}, seed=i, **kw)


async def complete_all(cfg: TeacherConfig, reqs: list[ChatRequest]):
    async with ChatClient(cfg) as c:
        res = await asyncio.gather(*(c.complete(r) for r in reqs))
        return res, c.stats()


def expected(r: ChatRequest) -> str:
    return echo_responder({"messages": r.messages, "seed": r.seed})


# ---- pure logic --------------------------------------------------------------------------------

def test_adaptive_limit_halves_once_per_window_and_grows_slowly():
    lim = AdaptiveLimit(initial=32, minimum=1, maximum=64)
    epoch = lim.epoch
    assert lim.on_throttle(epoch) is True
    assert lim.limit == 16
    # throttles of requests issued before the decrease are echoes of the same event
    assert lim.on_throttle(epoch) is False
    assert lim.limit == 16
    assert lim.on_throttle(lim.epoch) is True and lim.limit == 8
    for _ in range(9):
        lim.on_success()
    assert lim.limit == 9                   # about +1 per window of `limit` successes
    for _ in range(10):
        lim.on_throttle(lim.epoch)
    assert lim.limit == 1                   # never below the minimum


def test_latency_gradient_is_one_within_tolerance_and_falls_with_slower_answers():
    g = LatencyGradient(tolerance=1.5, warmup=4)
    assert [g.observe(0.01) for _ in range(4)] == [1.0] * 4       # the baseline: 10 ms per token
    assert g.observe(0.014) == 1.0                                  # within 1.5x: no queue yet
    assert 0.5 < g.observe(0.02) < 0.8                              # 2x slower: the limit should fall
    assert g.observe(1.0) == 0.5                                    # an outlier halves at most
    long_before = g.long_s
    g.observe(long_before / 4)                                      # the queue drained: baseline follows at once
    assert g.long_s < long_before * 0.96


def test_adaptive_limit_falls_when_latency_per_token_rises_and_grows_only_when_used():
    lim = AdaptiveLimit(initial=16, minimum=1, maximum=64, gradient=LatencyGradient(tolerance=1.5, warmup=4))
    for _ in range(4):
        lim.on_success(latency_s=1.0, n_tokens=100, inflight=16)   # 10 ms per token
    assert lim.limit == 16
    lim.on_success(latency_s=2.0, n_tokens=200, inflight=16)       # longer answer, same speed: grows
    assert lim.value > 16
    for _ in range(10):
        lim.on_success(latency_s=3.0, n_tokens=100, inflight=16)   # 3x slower per token
    assert lim.limit < 10 and lim.n_latency_cuts == 10
    low = lim.value
    lim.on_success(latency_s=1.0, n_tokens=100, inflight=1)        # app-limited: says nothing about more
    assert lim.value == low
    aimd = AdaptiveLimit(initial=16, minimum=1, maximum=64)        # without a gradient: AIMD only
    for _ in range(10):
        aimd.on_success(latency_s=3.0, n_tokens=100, inflight=16)
    assert aimd.limit == 16 and aimd.value > 16


def test_circuit_breaker_trips_cools_down_probes_and_exhausts():
    br = CircuitBreaker(failures_to_trip=3, cooldown_s=10, max_trips=2)
    assert br.allow(0.0)
    assert not br.on_failure(0.0, "e1") and not br.on_failure(0.1, "e2")
    assert br.on_failure(0.2, "e3") and br.state(0.3) == "open" and not br.allow(5.0)
    assert br.state(10.3) == "half-open" and br.allow(10.3)
    br.probe_in_flight = True
    assert not br.allow(10.3)               # one probe at a time
    assert br.on_failure(10.4, "probe failed") and br.exhausted
    assert not br.allow(100.0)
    br2 = CircuitBreaker(failures_to_trip=2, cooldown_s=1, max_trips=3)
    br2.on_failure(0, "x"), br2.on_failure(0, "x")
    br2.on_success()
    assert br2.state(0.5) == "closed" and br2.n_trips == 0


def test_backoff_is_jittered_bounded_and_honours_retry_after():
    rng = random.Random(0)
    delays = [backoff_delay_s(a, 0.5, 8.0, rng) for a in range(10) for _ in range(20)]
    assert all(0 <= d <= 8.0 for d in delays)
    assert len({round(d, 6) for d in delays}) > 100      # jitter, not a fixed schedule
    assert backoff_delay_s(0, 0.5, 30.0, rng, retry_after_s=3.0) >= 3.0


def test_request_body_carries_seed_logprobs_schema_and_token_ids():
    r = ChatRequest(messages=[{"role": "user", "content": "x"}], params={"temperature": 0.6, "top_k": None},
                    seed=7, logprobs=True, top_logprobs=2, json_schema={"type": "object"}, return_token_ids=True)
    b = request_body("m", r)
    assert b["seed"] == 7 and b["logprobs"] is True and b["top_logprobs"] == 2 and "top_k" not in b
    assert b["response_format"]["type"] == "json_schema" and b["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert b["return_token_ids"] and b["return_tokens_as_token_ids"]
    assert request_body("m", r, constrained_output="json_object")["response_format"]["type"] == "json_object"
    assert "response_format" not in request_body("m", r, constrained_output="none")


def test_parse_response_takes_engine_token_ids_and_rejects_garbage():
    data = {"choices": [{"message": {"content": "a b"}, "finish_reason": "length",
                         "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.5},
                                                  {"token": "token_id:9", "logprob": -1.5}]}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
    res = parse_chat_response("u", data)
    assert res.token_ids == [5, 9] and res.logprobs == [-0.5, -1.5] and res.truncated
    data["choices"][0]["token_ids"] = [11, 12]
    assert parse_chat_response("u", data).token_ids == [11, 12]
    data["choices"][0]["logprobs"]["content"][0]["token"] = "a"      # plain strings: no ids invented
    del data["choices"][0]["token_ids"]
    assert parse_chat_response("u", data).token_ids is None
    with pytest.raises(MalformedResponse):
        parse_chat_response("u", {"object": "error"})
    assert classify_status("u", 404, "no model").retryable is False
    assert classify_status("u", 503, "busy").retryable is True


# ---- over HTTP ---------------------------------------------------------------------------------

def test_plain_requests_and_per_request_seeds(fake_server):
    srv = fake_server()
    reqs = [req(i) for i in range(20)]
    res, stats = run(complete_all(TeacherConfig(**fast_teacher([srv.base_url])), reqs))
    assert [r.content for r in res] == [expected(r) for r in reqs]
    assert [b["seed"] for b in sorted(srv.stats.bodies, key=lambda b: b["seed"])] == list(range(20))
    assert stats["n_requests"] == 20 and stats["n_retries"] == 0


@pytest.mark.parametrize("fault", [
    Fault("429", first_n=12), Fault("500", every=3), Fault("503", attempts=[0]), Fault("malformed", attempts=[0]),
    Fault("truncate", attempts=[0]), Fault("drop", every=2), Fault("timeout", attempts=[0], delay_s=3.0),
])
def test_faults_are_retried_nothing_lost_or_duplicated(fake_server, fault):
    srv = fake_server(faults=[fault])
    reqs = [req(i) for i in range(24)]
    cfg = TeacherConfig(**fast_teacher([srv.base_url], timeout_s=0.5, initial_concurrency=8))
    res, stats = run(complete_all(cfg, reqs))
    assert [r.content for r in res] == [expected(r) for r in reqs]
    assert srv.stats.n_faults.get(fault.kind, 0) > 0
    assert stats["n_retries"] >= srv.stats.n_faults[fault.kind] - 1


def test_truncated_stream_is_detected_and_retried(fake_server):
    srv = fake_server(faults=[Fault("truncate", attempts=[0])])
    reqs = [req(i, logprobs=True) for i in range(6)]
    cfg = TeacherConfig(**fast_teacher([srv.base_url], stream=True))
    res, stats = run(complete_all(cfg, reqs))
    assert [r.content for r in res] == [expected(r) for r in reqs]
    assert all(r.logprobs is not None and len(r.logprobs) == len(r.tokens) for r in res)
    assert stats["endpoints"][srv.base_url]["errors"].get("TransportError", 0) == 6


def test_429_burst_halves_concurrency(fake_server):
    srv = fake_server(faults=[Fault("429", first_n=30, retry_after_s=0.01)])
    cfg = TeacherConfig(**fast_teacher([srv.base_url], initial_concurrency=32, max_concurrency=64))
    res, stats = run(complete_all(cfg, [req(i) for i in range(64)]))
    ep = stats["endpoints"][srv.base_url]
    assert len(res) == 64 and ep["limit_decreases"] >= 1 and ep["limit"] < 32


async def complete_counting_failures(cfg: TeacherConfig, reqs: list[ChatRequest]):
    async with ChatClient(cfg) as c:
        res = await asyncio.gather(*(c.complete(r) for r in reqs), return_exceptions=True)
        return res, c.stats()


def test_slow_teacher_adaptive_limit_completes_every_prompt_where_a_fixed_limit_times_out(fake_server):
    """A teacher that never throttles but slows down under load (2 requests at full speed, each
    further one in flight stretches every answer): 48 requests at once take 2.4 s each, past the
    1.5 s timeout; the adaptive limit holds the teacher where answers come back in time."""
    srv = fake_server(latency_s=0.1, parallel=2)
    common = dict(timeout_s=1.5, max_retries=0, breaker_failures=1000)
    fixed = TeacherConfig(**fast_teacher([srv.base_url], initial_concurrency=48, min_concurrency=48,
                                         max_concurrency=48, **common))
    prompts = [req(i) for i in range(48)]
    res, stats = run(complete_counting_failures(fixed, prompts))
    failed = [r for r in res if isinstance(r, BaseException)]
    assert failed and stats["endpoints"][srv.base_url]["timeouts"] == len(failed)
    assert all("timeout_s=1.5" in str(e) for e in failed)

    srv2 = fake_server(latency_s=0.1, parallel=2)
    adaptive = TeacherConfig(**fast_teacher([srv2.base_url], initial_concurrency=4, max_concurrency=48, **common))
    res, stats = run(complete_counting_failures(adaptive, prompts))
    assert [r.content for r in res] == [expected(r) for r in prompts]        # every prompt, none failed
    ep = stats["endpoints"][srv2.base_url]
    assert ep["timeouts"] == 0 and ep["ok"] == 48 and ep["latency_cuts"] > 0
    assert ep["limit"] < 16 and srv2.stats.max_inflight < 16


async def complete_with_slowdown(srv, cfg: TeacherConfig, reqs: list[ChatRequest], after: int):
    """Send every request; once `after` have come back, the teacher gets twice as slow (another
    tenant arrived on its GPU)."""
    async with ChatClient(cfg) as c:
        tasks = [asyncio.create_task(c.complete(r)) for r in reqs]
        for i, fut in enumerate(asyncio.as_completed(tasks), 1):
            try:
                await fut
            except Exception:
                pass
            if i == after:
                srv.latency_s *= 2
        return await asyncio.gather(*tasks, return_exceptions=True), c.stats()


def test_a_teacher_that_slows_down_mid_run_is_followed_down_where_aimd_alone_times_out(fake_server):
    """Started at 24 in flight (answers in 1.2 s, under the 2 s timeout), the teacher then halves
    its speed: the AIMD limit, which only a 429 lowers, keeps 24 in flight and every answer takes
    2.4 s; the latency-aware limit has already come down and stays under the timeout."""
    prompts = [req(i) for i in range(72)]
    outcomes = {}
    for aware in (False, True):
        srv = fake_server(latency_s=0.1, parallel=2)
        cfg = TeacherConfig(**fast_teacher([srv.base_url], initial_concurrency=24, max_concurrency=48, timeout_s=2.0,
                                           max_retries=0, breaker_failures=1000, latency_aware=aware))
        res, stats = run(complete_with_slowdown(srv, cfg, prompts, after=24))
        outcomes[aware] = (sum(isinstance(r, BaseException) for r in res), stats["endpoints"][srv.base_url])
    failed, ep = outcomes[False]
    assert failed > 0 and ep["timeouts"] == failed and ep["limit"] >= 24
    failed, ep = outcomes[True]
    assert failed == 0 and ep["timeouts"] == 0 and ep["ok"] == 72 and ep["limit"] < 24


def test_sustained_failure_trips_breaker_with_clear_error_instead_of_stalling(fake_server):
    srv = fake_server(faults=[Fault("429")])               # every request, forever
    cfg = TeacherConfig(**fast_teacher([srv.base_url], breaker_failures=5, breaker_max_trips=2, max_retries=100))
    t0 = time.monotonic()
    with pytest.raises(CircuitOpenError) as ei:
        run(complete_all(cfg, [req(i) for i in range(10)]))
    assert time.monotonic() - t0 < 30                   # stops, instead of retrying for ever
    msg = str(ei.value)
    assert srv.base_url in msg and "429" in msg and "keeps failing" in msg


def test_requests_queued_behind_a_failing_probe_all_end_when_the_breaker_gives_up(fake_server):
    """Requests waiting for a slot while the half-open probe is out are woken when it fails and
    the breaker gives up: each ends with the breaker's error, none waits for ever (a run of
    prompts that always fail hung this way in CI)."""
    srv = fake_server(faults=[Fault("500")])
    cfg = TeacherConfig(**fast_teacher([srv.base_url], initial_concurrency=1, breaker_failures=1,
                                       breaker_cooldown_s=0.05, breaker_max_trips=2, max_retries=100))

    async def go():
        async with ChatClient(cfg) as c:
            return await asyncio.wait_for(asyncio.gather(*(c.complete(req(i)) for i in range(6)),
                                                         return_exceptions=True), timeout=30)
    out = run(go())
    assert len(out) == 6 and all(isinstance(e, CircuitOpenError) for e in out), out
    assert srv.stats.n_requests == 2                    # the tripping request and the failed probe


def test_a_slot_freed_on_one_server_goes_to_a_request_that_can_use_it(fake_server):
    """Two teachers on two servers share one pool. Requests of the slow teacher queued first do
    not swallow the wake-ups of the fast server's freed slots: the fast teacher's queue drains
    while the slow server's first answer is still being written."""
    slow, fast = fake_server(latency_s=3.0), fake_server()
    pool = EndpointPool()
    done: list[str] = []

    async def one(c: ChatClient, name: str, i: int) -> None:
        await c.complete(req(i))
        done.append(name)

    async def go():
        async with ChatClient(TeacherConfig(**fast_teacher([slow.base_url], initial_concurrency=1)), pool=pool) as a, \
                ChatClient(TeacherConfig(**fast_teacher([fast.base_url], initial_concurrency=1)), pool=pool) as b:
            slow_tasks = [asyncio.create_task(one(a, "slow", i)) for i in range(3)]
            await asyncio.sleep(0.2)                      # the slow teacher's waiters queue first
            await asyncio.wait_for(asyncio.gather(*(one(b, "fast", 10 + i) for i in range(6))), timeout=60)
            await asyncio.gather(*slow_tasks)
    run(go())
    assert done[:6] == ["fast"] * 6 and done.count("slow") == 3, done


def test_wrong_model_is_rejected_at_once(fake_server):
    srv = fake_server()
    cfg = TeacherConfig(**fast_teacher([srv.base_url], model="no-such-model"))
    with pytest.raises(RequestRejected) as ei:
        run(complete_all(cfg, [req(0)]))
    assert "404" in str(ei.value) and srv.stats.n_requests == 1


def test_load_spreads_over_endpoints_and_survives_a_dead_one(fake_server):
    a, b = fake_server(latency_s=0.01), fake_server(latency_s=0.01)
    dead = f"http://127.0.0.1:{free_port()}/v1"
    cfg = TeacherConfig(**fast_teacher([a.base_url, b.base_url, dead], breaker_failures=3, initial_concurrency=4))
    reqs = [req(i) for i in range(60)]
    res, stats = run(complete_all(cfg, reqs))
    assert [r.content for r in res] == [expected(r) for r in reqs]
    assert a.stats.n_requests >= 15 and b.stats.n_requests >= 15
    assert stats["endpoints"][dead]["breaker_trips"] >= 1


def test_readiness_waits_for_a_starting_server_and_times_out_with_the_reason():
    port = free_port()
    srv = FakeOpenAIServer(port=port)
    timer = threading.Timer(1.0, srv.start)
    timer.start()
    try:
        cfg = TeacherConfig(**fast_teacher([f"http://127.0.0.1:{port}/v1"]))

        async def go():
            async with ChatClient(cfg) as c:
                t0 = time.monotonic()
                ready = await c.wait_ready(timeout_s=10, poll_s=0.1)
                return ready, time.monotonic() - t0
        ready, waited = run(go())
        assert ready == [f"http://127.0.0.1:{port}/v1"] and 0.5 < waited < 30
    finally:
        timer.join()
        srv.stop()

    cfg = TeacherConfig(**fast_teacher([f"http://127.0.0.1:{free_port()}/v1"]))

    async def never():
        async with ChatClient(cfg) as c:
            await c.wait_ready(timeout_s=0.6, poll_s=0.1)
    t0 = time.monotonic()
    with pytest.raises(EndpointNotReady) as ei:
        run(never())
    assert time.monotonic() - t0 < 30 and "not ready after 0.6 s" in str(ei.value)


def test_readiness_names_a_model_the_server_does_not_serve(fake_server):
    srv = fake_server()
    cfg = TeacherConfig(**fast_teacher([srv.base_url], model="other"))

    async def go():
        async with ChatClient(cfg) as c:
            await c.wait_ready(timeout_s=0.3, poll_s=0.1)
    with pytest.raises(EndpointNotReady, match="served: fake-teacher"):
        run(go())


def test_logprobs_and_token_ids_round_trip(fake_server):
    srv = fake_server()
    res, _ = run(complete_all(TeacherConfig(**fast_teacher([srv.base_url])),
                              [req(1, logprobs=True, return_token_ids=True)]))
    r = res[0]
    assert r.token_ids is not None and len(r.token_ids) == len(r.logprobs) == r.completion_tokens
    assert all(v <= 0 for v in r.logprobs)
    assert srv.stats.bodies[0]["return_token_ids"] is True
