"""Client throughput: can `synth.client.ChatClient` keep >= 1,000 requests/s at 256 concurrent
requests, so that the client is never the bottleneck of a teacher fleet?

The server is `synth.fakeserver` in its own process, answering at once (no model); client and
server share this machine's cores, so the figure is a lower bound for the client alone. Measured
side by side in the same run:
  raw-aiohttp   aiohttp with a semaphore and nothing else (the floor of our HTTP layer)
  client        ChatClient.complete (endpoint choice, AIMD, breaker bookkeeping, parsing)
  client+cache  CachedBackend over it (SQLite cache writes, content hashing), as the engine uses it
  httpx         httpx.AsyncClient with a semaphore (why aiohttp was chosen)

    .venv/bin/python benchmarks/synth_client.py [--requests 20000] [--concurrency 256]
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

from synth.backends import CachedBackend, HttpBackend  # noqa: E402
from synth.cache import ResponseCache  # noqa: E402
from synth.client import ChatClient, ChatRequest, TeacherConfig  # noqa: E402


def start_server() -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([sys.executable, "-m", "synth.fakeserver", "--port", "0"], cwd=REPO,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    line = p.stdout.readline()
    return p, line.split()[-1]


def reqs(n: int, salt: str) -> list[ChatRequest]:
    return [ChatRequest(messages=[{"role": "user", "content": f"{salt} question {i}"}], params={"max_tokens": 8},
                        seed=i) for i in range(n)]


async def bench_client(url: str, n: int, conc: int, cached: bool) -> float:
    cfg = TeacherConfig(model="fake-teacher", endpoints=[url], initial_concurrency=conc, max_concurrency=conc)
    if cached:
        tmp = tempfile.mkdtemp()
        backend = CachedBackend(HttpBackend(cfg), ResponseCache(Path(tmp) / "c.sqlite"))
        call = backend.complete
        await backend.start()
    else:
        client = ChatClient(cfg)
        call = client.complete
    rs = reqs(n, f"c{cached}{time.time()}")
    await asyncio.gather(*(call(r) for r in rs[:500]))                  # warm connections
    t0 = time.perf_counter()
    await asyncio.gather(*(call(r) for r in rs[500:]))
    dt = time.perf_counter() - t0
    if cached:
        backend.cache.close()
        await backend.close()
    else:
        await client.close()
    return (n - 500) / dt


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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--httpx-requests", type=int, default=3000)
    args = ap.parse_args()
    proc, url = start_server()
    load_before = os.getloadavg()
    try:
        res = {
            "raw_aiohttp_rps": asyncio.run(bench_raw_aiohttp(url, args.requests, args.concurrency)),
            "client_rps": asyncio.run(bench_client(url, args.requests, args.concurrency, cached=False)),
            "client_cache_rps": asyncio.run(bench_client(url, args.requests, args.concurrency, cached=True)),
            "httpx_rps": asyncio.run(bench_httpx(url, args.httpx_requests, args.concurrency)),
        }
    finally:
        proc.terminate()
        proc.wait(10)
    res.update(requests=args.requests, concurrency=args.concurrency, cores=os.cpu_count(),
               loadavg_1m_before=round(load_before[0], 2), loadavg_1m_after=round(os.getloadavg()[0], 2))
    res["client_vs_raw"] = res["client_rps"] / res["raw_aiohttp_rps"]
    out = REPO / "benchmarks" / "_work"
    out.mkdir(parents=True, exist_ok=True)
    (out / "synth_client.json").write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
