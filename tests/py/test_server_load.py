"""Load and shutdown behaviour of `kvant serve`: 64 concurrent streaming clients (a quarter
disconnect at random points) all others complete correctly and the server returns to idle
(running = 0, KV used = baseline); SIGTERM during a stream drains: the stream completes,
/health answers 503 meanwhile on an open connection, and the process exits 0.
Numbers (requests/s, client-side TTFT/ITL medians) go to build/test-results/server_load.json."""
from __future__ import annotations

import http.client
import json
import random
import signal
import statistics
import threading
import time

import httpx

from server_util import KvantServer, server  # noqa: F401  (fixture)

N_CLIENTS = 64
MAX_TOKENS = 8


def stream_one(url, i, disconnect_after, out):
    body = {"prompt": f"Request {i}: write a short poem about the number {i}.",
            "max_tokens": MAX_TOKENS, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}, "temperature": 0.7, "seed": i}
    t0 = time.perf_counter()
    rec = {"i": i, "disconnect": disconnect_after is not None, "chunks": 0, "done": False,
           "finish": [], "usage": None, "times": [], "error": None, "text": ""}
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            rec["status"] = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    rec["done"] = True
                    break
                j = json.loads(data)
                if "error" in j:
                    rec["error"] = j["error"]
                    continue
                if j["choices"]:
                    c = j["choices"][0]
                    rec["times"].append(time.perf_counter() - t0)
                    rec["text"] += c["text"]
                    if c["finish_reason"]:
                        rec["finish"].append(c["finish_reason"])
                    rec["chunks"] += 1
                if j.get("usage"):
                    rec["usage"] = j["usage"]
                if disconnect_after is not None and rec["chunks"] >= disconnect_after:
                    break  # leaving the context manager closes the socket
    except Exception as e:  # recorded and asserted below
        rec["error"] = repr(e)
    rec["elapsed"] = time.perf_counter() - t0
    out[i] = rec


def test_concurrent_streams_with_disconnects(server, record_result):
    m0 = server.metrics()
    kv0 = m0["kvant_kv_blocks_used"]
    rng = random.Random(1234)
    quitters = set(rng.sample(range(N_CLIENTS), N_CLIENTS // 4))
    out = {}
    threads = [threading.Thread(target=stream_one,
                                args=(server.url, i, rng.randint(0, MAX_TOKENS - 2) if i in quitters else None, out))
               for i in range(N_CLIENTS)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    wall = time.perf_counter() - t0
    assert len(out) == N_CLIENTS
    ok = [r for r in out.values() if not r["disconnect"]]
    for r in ok:
        assert r["error"] is None and r["status"] == 200, r
        assert r["done"], r
        assert r["finish"] == ["length"], r
        assert r["usage"]["completion_tokens"] == MAX_TOKENS, r
        assert r["text"], r
    m1 = server.wait_idle(kv0, timeout=20)
    assert m1["kvant_num_requests_running"] == 0
    assert m1["kvant_num_requests_waiting"] == 0
    assert m1["kvant_kv_blocks_used"] == kv0
    done = m1["kvant_request_success_total{finished_reason=length}"] - \
        m0["kvant_request_success_total{finished_reason=length}"]
    assert done >= len(ok)
    ttft = [r["times"][0] for r in ok if r["times"]]
    itl = [b - a for r in ok for a, b in zip(r["times"], r["times"][1:-1])]
    res = {"clients": N_CLIENTS, "disconnecting": len(quitters), "max_tokens": MAX_TOKENS,
           "wall_s": round(wall, 3), "requests_per_s": round(len(ok) / wall, 2),
           "ttft_median_s": round(statistics.median(ttft), 4),
           "itl_median_s": round(statistics.median(itl), 4) if itl else None,
           "aborted_server_side": m1["kvant_request_success_total{finished_reason=abort}"]
           - m0["kvant_request_success_total{finished_reason=abort}"]}
    record_result("server_load", res)
    print(res)


def test_sigterm_drains(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--drain-timeout", "60")
    keep = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)  # opened before SIGTERM
    keep.request("GET", "/health")
    r0 = keep.getresponse()
    r0.read()
    assert r0.status == 200
    keep.request("GET", "/ready")
    r0 = keep.getresponse()
    assert r0.status == 200 and json.loads(r0.read())["status"] == "ready"
    out = {}
    body = {"prompt": "Once upon a time", "max_tokens": 48, "stream": True, "ignore_eos": True}
    got_first = threading.Event()

    def run():
        rec = {"done": False, "finish": None, "n": 0}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    rec["done"] = True
                elif line.startswith("data: "):
                    j = json.loads(line[6:])
                    rec["n"] += 1
                    got_first.set()
                    if j.get("choices") and j["choices"][0]["finish_reason"]:
                        rec["finish"] = j["choices"][0]["finish_reason"]
                    if "error" in j:
                        rec["error"] = j["error"]
        out["rec"] = rec

    t = threading.Thread(target=run)
    t.start()
    assert got_first.wait(60)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    keep.request("GET", "/health")
    r1 = keep.getresponse()
    health_body = json.loads(r1.read())
    keep.request("GET", "/ready")  # readiness turns false at once (Kubernetes)
    r2 = keep.getresponse()
    ready_body = json.loads(r2.read())
    t.join(120)
    rc = s.proc.wait(timeout=60)
    assert r1.status == 503 and health_body["status"] == "draining", (r1.status, health_body)
    assert r2.status == 503 and ready_body["status"] == "draining", (r2.status, ready_body)
    rec = out["rec"]
    assert rec["done"] and rec["finish"] == "length" and "error" not in rec, rec
    assert rec["n"] == 48 + 1  # 48 token chunks + the finish chunk
    assert rc == 0, s.log_text()
    # no longer accepting
    try:
        httpx.get(s.url + "/health", timeout=2)
        raise AssertionError("server still accepting after exit")
    except httpx.HTTPError:
        pass


def test_drain_timeout_cancels(kvant_bin, default_model):
    s = KvantServer(kvant_bin, default_model, "--drain-timeout", "0.5")
    out = {}
    body = {"prompt": "Once upon a time", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    started = threading.Event()

    def run():
        lines = []
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)
                    started.set()
        out["lines"] = lines

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(60)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    rc = s.proc.wait(timeout=30)
    t.join(30)
    assert rc == 0, s.log_text()
    assert time.time() - t0 < 10
    lines = out["lines"]
    assert lines[-1] == "data: [DONE]"
    assert "error" in json.loads(lines[-2][6:]), lines[-2]
