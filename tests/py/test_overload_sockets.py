"""Many more clients than --max-connections, as a benchmark opens them (guidellm's 512 against
the limit): every request gets an HTTP answer, 200 or 503 with Retry-After and an OpenAI-shaped
body, and no client sees a closed socket, neither on its first request nor on the next one over
its keep-alive connection (a connection between two requests of a busy client is never evicted
for a newcomer).  Scaled down to the 2-core machine: 3 x --max-connections clients, each its
own keep-alive connection, 2 requests each, all at once.  A second run at the default limit
checks that 192 concurrent clients are all served (no 503 at all)."""
from __future__ import annotations

import asyncio
import collections
import ssl

import httpx
import pytest

from server_util import KvantServer

MODEL = "SmolLM2-135M-Instruct.Q4_1"
MAX_CONN = 32


async def clients(url: str, n: int, rounds: int) -> tuple[collections.Counter, list]:
    ctx = ssl.create_default_context()  # one context for all (each client would build its own)
    seen: collections.Counter = collections.Counter()
    bad: list = []

    async def one(i: int):
        async with httpx.AsyncClient(base_url=url, timeout=300, verify=ctx,
                                     limits=httpx.Limits(max_connections=1)) as c:
            for k in range(rounds):
                body = {"model": MODEL, "prompt": f"Count {i} {k}:", "max_tokens": 2,
                        "temperature": 0}
                try:
                    r = await c.post("/v1/completions", json=body)
                except httpx.HTTPError as e:
                    seen["transport:" + type(e).__name__] += 1
                    continue
                seen[r.status_code] += 1
                if r.status_code == 503:
                    e = r.json()["error"]
                    if (r.headers.get("retry-after") != "1" or e["code"] != "server_overloaded"
                            or set(e) != {"message", "type", "param", "code"}):
                        bad.append((r.headers, r.text))
                elif r.status_code != 200:
                    bad.append((r.status_code, r.text))

    await asyncio.gather(*(one(i) for i in range(n)))
    return seen, bad


@pytest.fixture
def nofile():
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_three_times_max_connections_no_closed_socket(kvant_bin, default_model, nofile):
    s = KvantServer(kvant_bin, default_model, "--max-connections", str(MAX_CONN))
    try:
        before = s.metrics()
        n, rounds = 3 * MAX_CONN, 2
        seen, bad = asyncio.run(clients(s.url, n, rounds))
        m = s.wait_idle(before["kvant_kv_blocks_used"])
    finally:
        assert s.stop() == 0, s.log_text()
    transport = {k: v for k, v in seen.items() if isinstance(k, str)}
    assert not transport, f"closed sockets instead of answers: {dict(seen)}"
    assert not bad, bad[:3]
    assert seen[200] + seen[503] == n * rounds, dict(seen)
    assert seen[200] >= MAX_CONN and seen[503] > 0, dict(seen)
    d = {k: m[f"kvant_{k}"] - before[f"kvant_{k}"]
         for k in ("http_overload_responses_total", "http_connections_refused_total",
                   "http_idle_evictions_total")}
    assert d["http_overload_responses_total"] == seen[503], (d, dict(seen))
    assert d["http_connections_refused_total"] == 0, d
    assert d["http_idle_evictions_total"] == 0, d  # no client was idle for 1 s


def test_default_limit_serves_everyone(kvant_bin, default_model, nofile):
    s = KvantServer(kvant_bin, default_model)
    try:
        before = s.metrics()
        n = 192
        seen, bad = asyncio.run(clients(s.url, n, 1))
        m = s.wait_idle(before["kvant_kv_blocks_used"])
    finally:
        assert s.stop() == 0, s.log_text()
    assert dict(seen) == {200: n}, dict(seen)
    assert not bad
    assert m["kvant_request_success_total{finished_reason=length}"] - \
        before["kvant_request_success_total{finished_reason=length}"] == n
