"""Crash safety: `kill -9` of `kvant serve` in the middle of load leaves nothing that breaks the
next start.  The restart on the same port and the same --kv-disk-dir comes up healthy at once (no
stale socket or lock: the listening socket is reused, the directory's flock died with the
process), keeps its disk tier (the lock is taken again), deletes torn temporaries, serves the
prompts it had written to disk before the crash with the same answers as a fresh server, and
exits 0 on SIGTERM.  An ordinary server without tiers restarts the same way."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from server_util import KvantServer, free_port

ROOT = Path(__file__).resolve().parent.parent.parent
POOL = ["--kv-blocks", "16"]  # small: prompts are evicted to disk during the load
PROMPT_LEN = 96


def prompt(i: int) -> list[int]:
    return [(i * 104729 + j * 37 + 5) % 40000 + 100 for j in range(PROMPT_LEN)]


def complete(url: str, i: int) -> dict:
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt(i), "max_tokens": 4,
                                                  "temperature": 0, "ignore_eos": True},
                   timeout=120)
    assert r.status_code == 200, r.text
    j = r.json()
    return {"text": j["choices"][0]["text"],
            "cached": j["usage"]["prompt_tokens_details"]["cached_tokens"]}


def load(url: str, stop: threading.Event, done: list) -> None:
    """Streams requests until the server dies (errors expected then)."""
    i = 100
    while not stop.is_set():
        try:
            with httpx.stream("POST", url + "/v1/completions",
                              json={"prompt": prompt(i), "max_tokens": 24, "stream": True,
                                    "ignore_eos": True}, timeout=30) as r:
                for _ in r.iter_lines():
                    pass
            done.append(i)
        except httpx.HTTPError:
            time.sleep(0.05)
        i += 1


def kill_under_load(srv: KvantServer, n_clients: int = 4, after_s: float = 3.0) -> int:
    stop = threading.Event()
    done: list = []
    ts = [threading.Thread(target=load, args=(srv.url, stop, done), daemon=True)
          for _ in range(n_clients)]
    for t in ts:
        t.start()
    time.sleep(after_s)
    # kill at a moment with requests in the engine (a single sample can fall
    # between two short requests): poll briefly for one
    deadline, running = time.monotonic() + 10.0, 0.0
    while time.monotonic() < deadline:
        running = srv.metrics()["kvant_num_requests_running"]
        if running >= 1:
            break
        time.sleep(0.02)
    srv.stop(signal.SIGKILL)
    stop.set()
    for t in ts:
        t.join(60)
    assert running >= 1, "the kill did not happen under load"
    return len(done)


def test_kill9_under_load_then_restart_same_port_and_disk_dir(kvant_bin, default_model,
                                                              tier_dir):
    port = free_port()
    args = [*POOL, "--kv-disk-dir", str(tier_dir), "--kv-disk-size", "64M"]
    fresh = KvantServer(kvant_bin, default_model, *POOL)
    try:
        want = [complete(fresh.url, i) for i in range(4)]
    finally:
        assert fresh.stop() == 0
    srv = KvantServer(kvant_bin, default_model, *args, port=port)
    first = [complete(srv.url, i) for i in range(4)]  # then evicted to disk by the load
    kill_under_load(srv)
    # a torn write left behind by a crash at the wrong moment
    (tier_dir / (".tmp." + "ab" * 32 + ".kvb")).write_bytes(b"partial")
    t0 = time.time()
    srv2 = KvantServer(kvant_bin, default_model, *args, port=port, health_timeout=30)
    restart_s = time.time() - t0
    try:
        again = [complete(srv2.url, i) for i in range(4)]
        m = srv2.metrics()
    finally:
        rc = srv2.stop()
    assert rc == 0, srv2.log_text()
    assert srv2.port == port
    assert [g["text"] for g in first] == [w["text"] for w in want]
    assert [g["text"] for g in again] == [w["text"] for w in want]
    assert m["kvant_kv_tier_disk_enabled"] == 1, "the restart lost its disk tier (stale lock?)"
    assert m["kvant_kv_tier_hit_tokens_total{tier=disk}"] > 0
    assert sum(g["cached"] for g in again) > 0
    assert not any(n.startswith(".tmp.") for n in os.listdir(tier_dir)), os.listdir(tier_dir)
    print(f"restart after kill -9 under load: healthy in {restart_s:.1f} s on port {port}")


def test_kill9_under_load_then_restart_same_port(kvant_bin, default_model):
    port = free_port()
    srv = KvantServer(kvant_bin, default_model, port=port)
    kill_under_load(srv, n_clients=8, after_s=2.0)
    srv2 = KvantServer(kvant_bin, default_model, port=port, health_timeout=30)
    try:
        assert complete(srv2.url, 1)["text"]
        m = srv2.metrics()
        assert m["kvant_num_requests_running"] == 0 and m["kvant_kv_blocks_used"] == 0
    finally:
        assert srv2.stop() == 0
