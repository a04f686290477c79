#!/usr/bin/env python3
"""Measures the KV offload tiers through `kvant serve` (numbers for docs/PERFORMANCE.md).

1. multi-turn chat: conversations share a few long system prompts, each turn re-sends the
   whole history; turns are interleaved so a conversation's blocks leave the small device
   pool before its next turn.  Prefix-hit rate (cached prompt tokens / prompt tokens) and
   TTFT p50/p99 with tiers off, a host tier, a small host tier + disk; then kill -9 and a
   restart on the same disk directory, and the same requests again.
2. 0% hit rate: distinct prompts, concurrent clients; throughput tiers off vs host + disk.
3. memory pressure: a device pool a quarter of what the concurrent requests need;
   throughput with the host tier (cost model: swap or recompute) vs recompute only.

usage: .venv/bin/python bench/kv_tiers.py [--bin build/kvant] [--json out.json] [--quick]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import httpx

MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: str, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="kvtier-bench-", suffix=".log", delete=False)
        self.cmd = [binary, "serve", "-m", MODEL, "--port", str(self.port), *args]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                sys.exit(f"server exited: {' '.join(self.cmd)}\n{open(self.log.name).read()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                self.stop(signal.SIGKILL)
                sys.exit("server not healthy")
            time.sleep(0.1)

    def stop(self, sig=signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=120)

    def metrics(self) -> dict:
        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out


def stream(url: str, prompt: list[int], max_tokens: int) -> dict:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, usage, n = None, None, 0
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            j = json.loads(line[6:])
            if j.get("choices"):
                n += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if j.get("usage"):
                usage = j["usage"]
    return {"ttft": ttft, "e2e": time.perf_counter() - t0, "usage": usage, "chunks": n}


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


# ---- 1. multi-turn chat ----

def chat_requests(n_conv: int, n_turns: int, n_sys: int, sys_len: int, user_len: int,
                  reply_len: int) -> list[list[int]]:
    def toks(seed: int, n: int) -> list[int]:
        return [(seed * 7919 + j * 104729) % 40000 + 100 for j in range(n)]
    reqs = []
    for t in range(n_turns):
        for c in range(n_conv):
            p = toks(1000 + c % n_sys, sys_len)
            for k in range(t):
                p += toks(10000 + c * 100 + k, user_len) + toks(50000 + c * 100 + k, reply_len)
            p += toks(10000 + c * 100 + t, user_len)
            reqs.append(p)
    return reqs


def run_chat(srv: Server, reqs: list[list[int]], first: int = 0) -> dict:
    """first > 0: the hit rate and TTFT of the first `first` requests only (tier counters
    still cover the whole run)."""
    res = [stream(srv.url, p, 4) for p in reqs]
    if first:
        res = res[:first]
    prompt = sum(r["usage"]["prompt_tokens"] for r in res)
    cached = sum(r["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) for r in res)
    ttft = [r["ttft"] * 1000 for r in res]
    m = srv.metrics()
    return {"requests": len(res), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": cached / prompt, "ttft_p50_ms": pct(ttft, 0.5),
            "ttft_p99_ms": pct(ttft, 0.99),
            "host_hit_tokens": m.get('kvant_kv_tier_hit_tokens_total{tier="host"}', 0),
            "disk_hit_tokens": m.get('kvant_kv_tier_hit_tokens_total{tier="disk"}', 0),
            "device_hit_tokens": m.get("kvant_prefix_cache_hits_tokens_total", 0),
            "skipped_corrupt": m.get('kvant_kv_tier_skipped_records_total{reason="corrupt"}', 0),
            "wall_s": sum(r["e2e"] for r in res)}


# ---- 2, 3: throughput ----

def run_concurrent(srv: Server, prompts: list[list[int]], max_tokens: int, clients: int) -> dict:
    res, lock, nxt = [], threading.Lock(), [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(prompts):
                return
            r = stream(srv.url, prompts[i], max_tokens)
            with lock:
                res.append(r)

    t0 = time.perf_counter()
    th = [threading.Thread(target=worker) for _ in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.perf_counter() - t0
    gen = sum(r["usage"]["completion_tokens"] for r in res)
    prompt = sum(r["usage"]["prompt_tokens"] for r in res)
    m = srv.metrics()
    return {"wall_s": wall, "gen_tok_s": gen / wall, "total_tok_s": (gen + prompt) / wall,
            "preemptions": m.get("kvant:num_preemptions_total", 0),
            "swaps": m.get('kvant_kv_preemptions_total{decision="swap"}', 0),
            "recomputes": m.get('kvant_kv_preemptions_total{decision="recompute"}', 0),
            "host_hit_tokens": m.get('kvant_kv_tier_hit_tokens_total{tier="host"}', 0),
            "disk_hit_tokens": m.get('kvant_kv_tier_hit_tokens_total{tier="disk"}', 0),
            "tier_engine_s": m.get("kvant_kv_tier_engine_seconds_total", 0),
            "tier_overhead": m.get("kvant_kv_tier_engine_seconds_total", 0) / wall,
            "host_store_bytes": m.get('kvant_kv_tier_store_bytes_total{tier="host"}', 0),
            "disk_store_bytes": m.get('kvant_kv_tier_store_bytes_total{tier="disk"}', 0)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/kvant")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="smaller workloads")
    ap.add_argument("-t", "--threads", default="2")
    ap.add_argument("--parts", default="chat,zero_hit,pressure")
    a = ap.parse_args()
    base = ["-t", a.threads, "-c", "2048"]
    work = tempfile.mkdtemp(prefix="kvtier-bench-", dir="build")
    out = {"threads": a.threads, "model": MODEL}
    q = a.quick

    parts = a.parts.split(",")
    # 1. multi-turn chat: 105 requests whose distinct prompt tokens are ~10x the 16-block
    # (256-token) device pool
    n_conv, n_turns = (4, 3) if q else (21, 5)  # longest prompt 240 tokens: fits the pool
    reqs = chat_requests(n_conv, n_turns, 2, 128, 16, 8)
    pool = ["--kv-blocks", "16"]
    distinct = 2 * 128 + n_conv * (n_turns * 16 + (n_turns - 1) * 8)
    out["chat_shape"] = {"requests": len(reqs), "distinct_prompt_tokens": distinct,
                         "pool_tokens": 256, "working_set_x_pool": distinct / 256}
    print("chat", out["chat_shape"], flush=True)
    configs = {
        "off": [],
        "host": ["--kv-host-memory", "64Mi"],
        "host+disk": ["--kv-host-memory", "2Mi", "--kv-disk-dir", f"{work}/disk",
                      "--kv-disk-size", "256Mi"],
    }
    out["chat"] = {}
    for name, extra in configs.items() if "chat" in parts else []:
        srv = Server(a.bin, *base, *pool, *extra)
        out["chat"][name] = run_chat(srv, reqs)
        srv.stop(signal.SIGKILL if name == "host+disk" else signal.SIGTERM)
        print(name, out["chat"][name], flush=True)
    if "chat" in parts:
        srv = Server(a.bin, *base, *pool, *configs["host+disk"])
        out["chat"]["after kill -9"] = run_chat(srv, reqs, first=min(100, len(reqs)))
        srv.stop()
        print("after kill -9", out["chat"]["after kill -9"], flush=True)

    # 2. 0% hit rate: distinct prompts, 4 clients, the pool overflows (every block demoted)
    n = 12 if q else 24
    uniq = [[(i * 7919 + j * 31 + 7) % 40000 + 100 for j in range(128)] for i in range(n)]
    out["zero_hit"] = {}
    hd0 = ["--kv-host-memory", "2Mi", "--kv-disk-dir", f"{work}/disk0", "--kv-disk-size", "256Mi"]
    for name, extra in [("off", []), ("host+disk", hd0), ("off, again", [])] \
            if "zero_hit" in parts else []:
        srv = Server(a.bin, *base, "--kv-blocks", "48", *extra)
        out["zero_hit"][name] = run_concurrent(srv, uniq, 16, 4)
        srv.stop()
        print("zero hit", name, out["zero_hit"][name], flush=True)

    # 3. memory pressure: 16 clients x (32 prompt + 96 generated) = 128 blocks; pool 32
    n = 16
    pp = [[(i * 104729 + j * 13 + 3) % 40000 + 100 for j in range(32)] for i in range(n)]
    out["pressure"] = {}
    for name, extra in [("recompute only", []), ("host tier, cost model",
                                                 ["--kv-host-memory", "64Mi"])] \
            if "pressure" in parts else []:
        srv = Server(a.bin, *base, "--kv-blocks", "32", "--max-num-seqs", "16", *extra)
        out["pressure"][name] = run_concurrent(srv, pp, 48 if q else 96, n)
        srv.stop()
        print("pressure", name, out["pressure"][name], flush=True)
    shutil.rmtree(work, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
