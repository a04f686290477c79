"""Hostile and broken clients cost the others little (docs/SERVER.md "Limits").

Each test runs one kind of abuse against a server with short limits, measures the time to first
token (TTFT) of ordinary streaming requests meanwhile, and checks that it stays within 2x of the
unloaded value (medians over several requests, plus an absolute allowance of ABS_SLACK_S for a
noisy 2-core machine), that the limit's counter moved, and that the server is idle again after.

  - slowloris: headers trickled a byte at a time from more connections than --max-connections
    (--header-timeout closes them; at the limit the longest-waiting one, once it has waited 1 s,
    is closed for a new one);
  - a body trickled a byte at a time (--body-timeout);
  - hundreds of idle connections, over --max-connections (idle eviction);
  - a body at --max-body, back to back, and one over it (413);
  - a streaming client that never reads (kernel buffers fill, then --stream-backlog cancels
    the request; a stream that makes no progress is cut after --timeout).
Numbers go to build/test-results/hostile.json.  Marked `alone`: `make pytest` runs these after
the other tests, by themselves, since a test on the other xdist worker takes one of the two
cores and moves the TTFT they measure (a slow-body TTFT of 836 ms against 119 ms unloaded, seen
once with two workers).
"""
from __future__ import annotations

import json
import resource
import socket
import statistics
import threading
import time

import httpx
import pytest

from server_util import KvantServer

pytestmark = pytest.mark.alone

ABS_SLACK_S = 0.25
N_TTFT = 5
MAX_CONN = 32
LIMIT_ARGS = ["--max-connections", str(MAX_CONN), "--header-timeout", "2", "--body-timeout", "2",
              "--timeout", "4", "--stream-backlog", "64", "--max-body", "262144",
              "--send-buffer", "65536"]
RESULTS: dict = {}


def ttft_once(url: str, i: int) -> float:
    body = {"prompt": f"Question {i}: name a colour.", "max_tokens": 2, "stream": True,
            "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200, r.status_code
        for line in r.iter_lines():
            if line.startswith("data: ") and '"text"' in line:
                return time.perf_counter() - t0
    raise AssertionError("no token streamed")


def ttft_median(url: str, n: int = N_TTFT) -> float:
    return statistics.median(ttft_once(url, i) for i in range(n))


@pytest.fixture(scope="module")
def hs(kvant_bin, default_model):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    s = KvantServer(kvant_bin, default_model, *LIMIT_ARGS)
    ttft_once(s.url, 0)  # first request warms the caches
    s.unloaded = ttft_median(s.url)
    RESULTS["unloaded_ttft_s"] = s.unloaded
    yield s
    rc = s.stop()
    from conftest import ROOT
    out = ROOT / "build" / "test-results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "hostile.json").write_text(json.dumps(RESULTS, indent=1, sort_keys=True) + "\n")
    assert rc == 0, s.log_text()


def check_ttft(hs, name: str, loaded: float) -> None:
    RESULTS.setdefault(name, {}).update({"ttft_s": loaded, "unloaded_ttft_s": hs.unloaded,
                                         "ratio": loaded / hs.unloaded})
    print(f"{name}: TTFT {loaded * 1000:.0f} ms vs {hs.unloaded * 1000:.0f} ms unloaded "
          f"({loaded / hs.unloaded:.2f}x)")
    assert loaded <= 2 * hs.unloaded + ABS_SLACK_S, (name, loaded, hs.unloaded)


def wait_counter(hs, name: str, at_least: float, timeout: float = 10.0) -> float:
    t_end = time.time() + timeout
    while True:
        v = hs.metrics()[name]
        if v >= at_least or time.time() > t_end:
            return v
        time.sleep(0.1)


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(4096) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


class Trickler:
    """n connections that send `head` then one byte of `tail` every `every` seconds."""

    def __init__(self, port: int, n: int, head: bytes, tail: bytes, every: float = 0.3):
        self.socks: list[socket.socket] = []
        self.closed = 0
        self.stop = threading.Event()
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(head)
            self.socks.append(s)
        self.tail, self.every = tail, every
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()

    def run(self):
        k = 0
        while not self.stop.is_set():
            for s in list(self.socks):
                try:
                    s.send(self.tail[k % len(self.tail):k % len(self.tail) + 1])
                except OSError:
                    self.socks.remove(s)
                    self.closed += 1
                    s.close()
            k += 1
            self.stop.wait(self.every)

    def finish(self) -> int:
        self.stop.set()
        self.t.join()
        n = self.closed + sum(closed_by_peer(s) for s in self.socks)
        for s in self.socks:
            s.close()
        return n


def test_slowloris_headers(hs):
    before = hs.metrics()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    tr = Trickler(hs.port, 2 * MAX_CONN, head, b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n")
    time.sleep(1.2)  # evictable after 1 s without a complete request
    loaded = ttft_median(hs.url)
    time.sleep(2.0)  # past --header-timeout
    closed = tr.finish()
    m = hs.metrics()
    cut = (m["kvant_http_header_timeouts_total"] - before["kvant_http_header_timeouts_total"]
           + m["kvant_http_idle_evictions_total"] - before["kvant_http_idle_evictions_total"])
    RESULTS["slowloris_headers"] = {"connections": 2 * MAX_CONN, "closed": closed, "cut": cut}
    assert closed == 2 * MAX_CONN, f"only {closed} of {2 * MAX_CONN} trickling connections closed"
    assert cut >= MAX_CONN, m
    check_ttft(hs, "slowloris_headers", loaded)


def test_slow_body(hs):
    before = hs.metrics()["kvant_http_body_timeouts_total"]
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n")
    tr = Trickler(hs.port, MAX_CONN // 2, head, b'{"prompt": "' + b"a" * 64)
    time.sleep(0.5)
    loaded = ttft_median(hs.url)
    time.sleep(2.5)
    closed = tr.finish()
    after = wait_counter(hs, "kvant_http_body_timeouts_total", before + MAX_CONN // 2)
    assert closed == MAX_CONN // 2, closed
    assert after - before >= MAX_CONN // 2, (before, after)
    check_ttft(hs, "slow_body", loaded)


def closed_now(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_many_idle_connections(hs):
    before = hs.metrics()
    n = 600
    socks = []
    for _ in range(n):
        try:
            socks.append(socket.create_connection(("127.0.0.1", hs.port)))
        except OSError:  # refused at accept: every slot open (2 x --max-connections + 64)
            pass
    time.sleep(1.2)  # evictable after 1 s without a request
    loaded = ttft_median(hs.url)
    m = hs.metrics()
    open_now = m["kvant_http_connections_open"]
    closed = sum(closed_now(s) for s in socks) + n - len(socks)
    for s in socks:
        s.close()
    d = {k: m[f"kvant_http_{k}_total"] - before[f"kvant_http_{k}_total"]
         for k in ("idle_evictions", "header_timeouts", "connections_refused")}
    RESULTS["idle_connections"] = {"opened": n, "closed_by_server": closed,
                                   "open_at_once": open_now, **d}
    # at most --max-connections stay open (+ the slack of connections being closed)
    assert closed >= n - MAX_CONN - 64, (closed, d)
    assert open_now <= 2 * MAX_CONN + 64, open_now
    assert d["idle_evictions"] >= MAX_CONN, d
    check_ttft(hs, "idle_connections", loaded)


def test_bodies_at_the_size_limit(hs):
    before = hs.metrics()
    limit = 262144
    # valid JSON of exactly the limit: a prompt far over the context
    pad = limit - len(b'{"prompt": "", "max_tokens": 1}')
    at_limit = b'{"prompt": "' + b"tea " * (pad // 4) + b"t" * (pad % 4) + b'", "max_tokens": 1}'
    assert len(at_limit) == limit
    over = at_limit + b" "
    stop = threading.Event()
    counts = {"at": 0, "over": 0, "bad": []}

    def request(body: bytes) -> bytes:
        return (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                + body)

    reqs = ((request(at_limit), "at", b" 400 "), (request(over), "over", b" 413 "))

    def flood():  # raw sockets: the client's own CPU stays small next to the server's
        while not stop.is_set():
            for raw, key, want in reqs:
                with socket.create_connection(("127.0.0.1", hs.port)) as c:
                    c.sendall(raw)
                    resp = b""
                    while True:
                        chunk = c.recv(65536)
                        if not chunk:
                            break
                        resp += chunk
                counts[key] += 1
                if want not in resp.split(b"\r\n", 1)[0] + b" ":
                    counts["bad"].append((key, resp[:300]))
                elif key == "at" and b"whatever its tokens" not in resp:
                    counts["bad"].append((key, "tokenized instead of refused by length",
                                          resp[:300]))
                stop.wait(0.005)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    t0 = time.time()
    time.sleep(0.5)
    loaded = ttft_median(hs.url)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    m = hs.metrics()
    RESULTS["max_body_flood"] = {"at_limit": counts["at"], "over_limit": counts["over"],
                                 "seconds": elapsed}
    assert not counts["bad"], counts["bad"][:3]
    assert counts["at"] >= 3 and counts["over"] >= 3, counts
    assert (m["kvant_http_body_too_large_total"] - before["kvant_http_body_too_large_total"]
            == counts["over"])
    check_ttft(hs, "max_body_flood", loaded)


def test_stream_client_that_never_reads(hs):
    before = hs.metrics()
    body = json.dumps({"prompt": "Write a long story.", "max_tokens": 900, "stream": True,
                       "ignore_eos": True, "n": 4, "logprobs": 5}).encode()
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    socks = []
    for _ in range(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", hs.port))
        s.sendall(req)
        socks.append(s)  # and never read
    t0 = time.time()
    name_b, name_w = "kvant_stream_backlog_cancels_total", "kvant_http_write_timeouts_total"
    t_end = time.time() + 60
    while time.time() < t_end:
        m = hs.metrics()
        cut = m[name_b] - before[name_b] + m[name_w] - before[name_w]
        if cut >= 2 and m["kvant_num_requests_running"] == 0:
            break
        time.sleep(0.2)
    t_cut = time.time() - t0
    # the clients still hold their sockets, unread: the others are served as before
    loaded = ttft_median(hs.url) if cut >= 2 else float("inf")
    for s in socks:
        s.close()
    RESULTS["never_reading_stream"] = {"backlog_cancels": m[name_b] - before[name_b],
                                       "write_timeouts": m[name_w] - before[name_w],
                                       "seconds_to_cancel": t_cut}
    assert cut >= 2, m
    assert m["kvant_num_requests_running"] == 0
    # the HTTP side counts the abort once the connection is gone (closed here)
    name_a = "kvant_request_success_total{finished_reason=abort}"
    assert wait_counter(hs, name_a, before[name_a] + 2) >= before[name_a] + 2
    check_ttft(hs, "never_reading_stream", loaded)


def test_max_tokens_at_the_context_limit_from_many_connections(hs):
    """16 connections each ask for max_tokens up to the context limit, streaming: ordinary
    requests keep their TTFT within 2x (the scheduler runs a new short prompt before the
    running decodes: docs/RELIABILITY.md), the server stays healthy, and everything is released
    when those clients leave."""
    ctx = httpx.get(hs.url + "/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    stop = threading.Event()
    started = []

    def hog(i):
        body = {"prompt": f"Story {i}:", "max_tokens": ctx - 16, "stream": True,
                "ignore_eos": True}
        with httpx.stream("POST", hs.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for _ in r.iter_lines():
                if not started or started[-1] != i:
                    started.append(i)
                if stop.is_set():
                    break

    ts = [threading.Thread(target=hog, args=(i,), daemon=True) for i in range(16)]
    for t in ts:
        t.start()
    time.sleep(3.0)
    running = hs.metrics()["kvant_num_requests_running"]
    loaded = ttft_median(hs.url, 3)
    healthy = httpx.get(hs.url + "/health", timeout=5).status_code
    stop.set()
    for t in ts:
        t.join(60)
    m = hs.wait_idle(0.0, timeout=30)
    RESULTS["context_limit_hogs"] = {"connections": 16, "max_tokens": ctx - 16,
                                     "running_when_measured": running}
    print(f"context_limit_hogs: {running:.0f} sequences running")
    assert running >= 16
    assert healthy == 200
    check_ttft(hs, "context_limit_hogs", loaded)
    assert m["kvant_num_requests_running"] == 0 and m["kvant_kv_blocks_used"] == 0, m


def test_idle_after_abuse(hs):
    m = hs.wait_idle(0.0, timeout=20)
    assert m["kvant_num_requests_running"] == 0 and m["kvant_kv_blocks_used"] == 0, m
    assert httpx.get(hs.url + "/health", timeout=5).status_code == 200
