"""Client throughput: can `synth.client.ChatClient` keep >= 1,000 requests/s at 256 concurrent
requests, so that the client is never the bottleneck of a teacher fleet?

The server is `synth.fakeserver` in its own process, answering at once (no model); client and
server share this machine's cores, so the figure is a lower bound for the client alone. Measured
side by side in the same run:
  raw-aiohttp   aiohttp with a semaphore and nothing else (the floor of our HTTP layer)
  client        ChatClient.complete (endpoint choice, AIMD, breaker bookkeeping, parsing)
  client+cache  CachedBackend over it (SQLite cache writes, content hashing), as the engine uses it
  +verify       the same, and every answer verified in the check pool (`synth.checkpool`: the math
                grader in a worker process under a time limit, as the engine's verify step runs it:
                the 8 samples of a prompt in one call; the workers' CPU counts on the client's side)
  httpx         httpx.AsyncClient with a semaphore (why aiohttp was chosen)

Wall-clock rates depend on what else runs on the machine (other engineers' jobs share these 2
cores), so the CPU time each side spends per request is measured too (client: process_time of
this process; server: utime+stime of its process from /proc): `projected_2core_rps` =
min(1/client, 1/server, 2/(client + server)) CPU seconds per request is the rate the pair
sustains on 2 cores of its own (each side is one single-threaded process).

    .venv/bin/python benchmarks/synth_client.py [--requests 20000] [--concurrency 256]

`--slow-teacher`: a teacher that never throttles but slows down under load (the fake server with
`--parallel P --latency-ms L`: P requests answered in L ms, each one beyond stretches every
answer, so throughput is flat above P and latency grows with what is in flight), as vLLM on a
loaded CPU behaves. The same requests, side by side in one run, with
  fixed         initial = min = max concurrency (what the demo ran with: 32)
  aimd          the limit before the latency rule: AIMD on 429 only, started at the same 32
  adaptive      AIMD + latency gradient + slow-answer halving, started at the same 32
  adaptive-low  the same, started at 4 (how the demo now starts)
each reporting prompts completed, timeouts, completion tokens/s and the final limit.

    .venv/bin/python benchmarks/synth_client.py --slow-teacher [--requests 400]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._results import save  # noqa: E402

from synth.backends import CachedBackend, HttpBackend  # noqa: E402
from synth.cache import ResponseCache  # noqa: E402
from synth.checkpool import check_pool  # noqa: E402
from synth.client import ChatClient, ChatRequest, TeacherConfig  # noqa: E402
from synth.steps import verify_each  # noqa: E402
from synth.verify import verify_math  # noqa: E402


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def workers_cpu_s() -> float:
    pool = check_pool()
    return sum(proc_cpu_s(w.proc.pid) for w in pool._idle)


def measured(fn, pid: int, n: int) -> dict[str, float]:
    c0, s0 = time.process_time() + workers_cpu_s(), proc_cpu_s(pid)
    rps = fn()
    c1, s1 = time.process_time() + workers_cpu_s(), proc_cpu_s(pid)
    # the warm-up requests are inside the CPU window: count them (n includes them)
    client_us, server_us = (c1 - c0) / n * 1e6, (s1 - s0) / n * 1e6
    return {"wall_rps": round(rps, 1), "client_cpu_us_per_req": round(client_us, 1),
            "server_cpu_us_per_req": round(server_us, 1),
            # each side is one single-threaded process: bounded by its own core and by the pair's two
            "projected_2core_rps": round(min(1e6 / client_us, 1e6 / server_us, 2e6 / (client_us + server_us)), 1)
            if client_us > 0 and server_us > 0 else 0.0}


def start_server(*extra: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", "synth.fakeserver", "--port", "0", *extra], cwd=REPO,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    return p, line.split()[-1]


def reqs(n: int, salt: str) -> list[ChatRequest]:
    return [ChatRequest(messages=[{"role": "user", "content": f"{salt} question {i}"}], params={"max_tokens": 8},
                        seed=i) for i in range(n)]


async def bench_client(url: str, n: int, conc: int, cached: bool, verify: bool = False) -> float:
    cfg = TeacherConfig(model="fake-teacher", endpoints=[url], initial_concurrency=conc, max_concurrency=conc)
    if cached:
        tmp = tempfile.mkdtemp()
        backend = CachedBackend(HttpBackend(cfg), ResponseCache(Path(tmp) / "c.sqlite"))
        call = backend.complete
        await backend.start()
    else:
        client = ChatClient(cfg)
        call = client.complete
    rs = reqs(n, f"c{cached}{verify}{time.time()}")
    if verify:
        pool, answer = check_pool(), call

        async def prompt(group: list[ChatRequest]) -> None:   # the verify step: a prompt's samples graded off the loop
            res = await asyncio.gather(*(answer(r) for r in group))
            await pool.run(verify_each, verify_math, [r.content for r in res], "4", {}, timeout_s=20)

        async def run_all(part: list[ChatRequest]) -> None:
            await asyncio.gather(*(prompt(part[i:i + 8]) for i in range(0, len(part), 8)))
    else:
        async def run_all(part: list[ChatRequest]) -> None:
            await asyncio.gather(*(call(r) for r in part))

    await run_all(rs[:504])                                   # warm connections (and check workers)
    t0 = time.perf_counter()
    await run_all(rs[504:])
    dt = time.perf_counter() - t0
    if cached:
        backend.cache.close()
        await backend.close()
    else:
        await client.close()
    return (n - 504) / dt


async def bench_raw_aiohttp(url: str, n: int, conc: int) -> float:
    sem = asyncio.Semaphore(conc)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as s:
        async def one(i: int) -> None:
            body = json.dumps({"model": "fake-teacher", "messages": [{"role": "user", "content": f"r {i}"}],
                               "max_tokens": 8, "seed": i})
            async with sem:
                async with s.post(f"{url}/chat/completions", data=body, headers={"content-type": "application/json"}) as r:
                    json.loads(await r.read())
        await asyncio.gather(*(one(i) for i in range(500)))
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(500, n)))
        return (n - 500) / (time.perf_counter() - t0)


async def bench_httpx(url: str, n: int, conc: int) -> float:
    import httpx
    sem = asyncio.Semaphore(conc)
    async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=conc), timeout=60) as c:
        async def one(i: int) -> None:
            async with sem:
                (await c.post("/chat/completions", json={"model": "fake-teacher", "max_tokens": 8, "seed": i,
                                                         "messages": [{"role": "user", "content": f"h {i}"}]})).json()
        await asyncio.gather(*(one(i) for i in range(300)))
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(300, n)))
        return (n - 300) / (time.perf_counter() - t0)


SLOW_VARIANTS = {
    "fixed": dict(initial_concurrency=32, min_concurrency=32, max_concurrency=32, latency_aware=False),
    "aimd": dict(initial_concurrency=32, max_concurrency=64, latency_aware=False),
    "adaptive": dict(initial_concurrency=32, max_concurrency=64),
    "adaptive_low": dict(initial_concurrency=4, max_concurrency=64),
}


async def bench_slow_variant(url: str, n: int, variant: dict[str, object], timeout_s: float) -> dict[str, object]:
    cfg = TeacherConfig(model="fake-teacher", endpoints=[url], timeout_s=timeout_s, max_retries=2,
                        backoff_base_s=0.05, backoff_max_s=0.5, breaker_failures=10_000, **variant)  # type: ignore[arg-type]
    async with ChatClient(cfg) as client:
        t0 = time.perf_counter()
        res = await asyncio.gather(*(client.complete(r) for r in reqs(n, f"slow{time.time()}")), return_exceptions=True)
        wall = time.perf_counter() - t0
        st = client.stats()
    ep = st["endpoints"][url]
    ok = [r for r in res if not isinstance(r, BaseException)]
    return {"prompts": n, "completed": len(ok), "failed": n - len(ok), "timeouts": ep["timeouts"],
            "wall_s": round(wall, 2), "completed_per_s": round(len(ok) / wall, 2),
            "completion_tok_per_s": round(sum(r.completion_tokens for r in ok) / wall, 1),
            "mean_latency_s": round(sum(r.latency_s for r in ok) / max(1, len(ok)), 3),
            "final_limit": ep["limit"], "latency_cuts": ep["latency_cuts"], "limit_halvings": ep["limit_decreases"]}


def slow_teacher(n: int, latency_ms: float, parallel: int, timeout_s: float) -> int:
    res: dict[str, object] = {"requests": n, "latency_ms": latency_ms, "parallel": parallel, "timeout_s": timeout_s,
                              "cores": os.cpu_count(), "loadavg_1m_before": round(os.getloadavg()[0], 2)}
    for name, variant in SLOW_VARIANTS.items():
        proc, url = start_server("--latency-ms", str(latency_ms), "--parallel", str(parallel))   # a fresh teacher each
        try:
            res[name] = asyncio.run(bench_slow_variant(url, n, variant, timeout_s))
        finally:
            proc.terminate()
            proc.wait(10)
        print(name, res[name], flush=True)
    res["loadavg_1m_after"] = round(os.getloadavg()[0], 2)
    save("synth_client_slow_teacher", res)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--httpx-requests", type=int, default=3000)
    ap.add_argument("--slow-teacher", action="store_true", help="adaptive against fixed limits on a teacher that slows under load")
    ap.add_argument("--latency-ms", type=float, default=250.0, help="--slow-teacher: answer time at up to --parallel in flight")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--timeout-s", type=float, default=2.0)
    args = ap.parse_args()
    if args.slow_teacher:
        return slow_teacher(args.requests if args.requests != 20000 else 400, args.latency_ms, args.parallel, args.timeout_s)
    proc, url = start_server()
    load_before = os.getloadavg()
    try:
        n, c, pid = args.requests, args.concurrency, proc.pid
        res: dict[str, object] = {
            "raw_aiohttp": measured(lambda: asyncio.run(bench_raw_aiohttp(url, n, c)), pid, n),
            "client": measured(lambda: asyncio.run(bench_client(url, n, c, cached=False)), pid, n),
            "client_cache": measured(lambda: asyncio.run(bench_client(url, n, c, cached=True)), pid, n),
            "client_cache_verify": measured(lambda: asyncio.run(bench_client(url, n, c, cached=True, verify=True)), pid, n),
            "httpx": measured(lambda: asyncio.run(bench_httpx(url, args.httpx_requests, c)), pid, args.httpx_requests),
        }
    finally:
        proc.terminate()
        proc.wait(10)
    res.update(requests=args.requests, concurrency=args.concurrency, cores=os.cpu_count(),
               loadavg_1m_before=round(load_before[0], 2), loadavg_1m_after=round(os.getloadavg()[0], 2))
    res["client_vs_raw_wall"] = round(res["client"]["wall_rps"] / res["raw_aiohttp"]["wall_rps"], 3)  # type: ignore[index]
    save("synth_client", res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
