"""Departed clients cost nothing: requests whose clients closed their connections (streaming
or not, waiting or running) are cancelled within about one engine step and their KV blocks
are returned at once.

The server runs with 4 sequence slots, so of 200 streaming requests 4 run and the rest
wait; the test closes every socket at once and then polls /metrics: running + waiting
(`kvant_num_requests_running` + `kvant_num_requests_waiting`) must reach 0 and
`kvant_kv_blocks_used` (blocks referenced by a request; prefix-cached blocks with no
reference are `kvant_kv_blocks_cached` and may stay) must be back to 0 within 1 s.
"""
from __future__ import annotations

import json
import resource
import socket
import time

import httpx

from server_util import KvantServer

N_STREAM = 200
N_BLOCKING = 50
DEADLINE_S = 1.0
SLOTS = 4  # short steps: a running request gets a token event more often than every 100 ms


def _raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _open(port: int, i: int, stream: bool) -> socket.socket:
    body = json.dumps({"prompt": f"Request {i}: tell me a very long story about the sea.",
                       "max_tokens": 1500, "temperature": 0, "stream": stream,
                       "ignore_eos": True}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    return s


def _in_flight(m: dict) -> float:
    return m["kvant_num_requests_running"] + m["kvant_num_requests_waiting"]


def _wait_for(srv: KvantServer, pred, timeout: float) -> tuple[dict, float]:
    t0 = time.monotonic()
    while True:
        m = srv.metrics()
        if pred(m) or time.monotonic() - t0 > timeout:
            return m, time.monotonic() - t0
        time.sleep(0.02)


def _drop_all(srv: KvantServer, n: int, stream: bool, read_some: bool):
    socks = [_open(srv.port, i, stream) for i in range(n)]
    steps0 = srv.metrics()["kvant_engine_steps_total"]
    # every slot running (and producing tokens: a few steps on), the rest waiting
    m, _ = _wait_for(srv, lambda m: _in_flight(m) >= n and m["kvant_num_requests_running"] >= SLOTS
                     and m["kvant_engine_steps_total"] >= steps0 + 4, 60)
    assert _in_flight(m) >= n, f"only {_in_flight(m)} of {n} requests in flight"
    assert m["kvant_num_requests_waiting"] > 0, "the test wants waiting requests too"
    assert m["kvant_kv_blocks_used"] > 0, m
    if read_some:
        for s in socks[:20]:
            s.settimeout(0.05)
            try:
                s.recv(256)
            except OSError:
                pass
    for s in socks:
        s.close()
    m, dt = _wait_for(srv, lambda m: _in_flight(m) == 0 and m["kvant_kv_blocks_used"] == 0, 10)
    assert _in_flight(m) == 0 and m["kvant_kv_blocks_used"] == 0, (
        f"{m['kvant_num_requests_running']} running, {m['kvant_num_requests_waiting']} "
        f"waiting, {m['kvant_kv_blocks_used']} KV blocks used 10 s after the clients left")
    assert dt < DEADLINE_S, f"took {dt:.2f} s to cancel {n} departed requests"


def test_departed_clients_cancelled_at_once(kvant_bin, default_model):
    srv = KvantServer(kvant_bin, default_model, "--max-num-seqs", str(SLOTS),
                      "--max-waiting", "1024", "--max-connections", "600",
                      "--max-num-batched-tokens", "256", preexec_fn=_raise_nofile)
    try:
        # the first steps after a start are slow (pages faulted in): warm up first
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 8},
                       timeout=60)
        assert r.status_code == 200, r.text
        _drop_all(srv, N_STREAM, stream=True, read_some=True)
        _drop_all(srv, N_BLOCKING, stream=False, read_some=False)
        m = srv.metrics()
        aborted = m.get("kvant_request_success_total{finished_reason=abort}", 0)
        assert aborted >= N_STREAM + N_BLOCKING, m
        # the server still serves
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4},
                       timeout=60)
        assert r.status_code == 200, r.text
    finally:
        rc = srv.stop()
    assert rc == 0, srv.log_text()
