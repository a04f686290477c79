#!/usr/bin/env python3
"""bench/observe_cost.py - what watching kvant costs (docs/SERVER.md, "Observability cost").

  throughput URL [--streams 32] [--tokens 128] [--rounds 3]
      Runs a --streams-concurrent streaming benchmark against a running `kvant serve`,
      alternately without and with a dashboard-like poller (GET /v1/memory at 1 Hz and
      GET /v1/memory/blocks at 10 Hz), --rounds times each; prints generated tokens/s.
  blockmap URL [--streams 64] [--seconds 20]
      Loads the server with --streams streams while polling /v1/memory/blocks at 10 Hz;
      prints the pool size, runs, response bytes and latency (p50/p99/max).
  pollcpu URL --pid PID [--seconds 20]
      The server's CPU time per second with and without the dashboard-like poller, on an
      otherwise idle server: what polling takes from the machine.
  rss URL [--streams 32] [--touch-prompts 4 --touch-len 2000]
      Runs --streams streams (after --touch-prompts long prompts) for --seconds, then compares /v1/memory's named bytes with the
      process's resident memory (touch the whole pool first: docs/SERVER.md).

Uses only the standard library and httpx (tests/requirements.txt).  --json prints one object.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

import httpx


def stream_worker(url: str, prompt, tokens: int, counts: list, i: int, stop: threading.Event):
    body = {"prompt": prompt, "max_tokens": tokens, "stream": True, "ignore_eos": True,
            "temperature": 0}
    with httpx.Client(timeout=600) as c:
        while not stop.is_set():
            with c.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        counts[i] += 1


def run_streams(url, n, tokens, seconds, prompt_of):
    counts = [0] * n
    stop = threading.Event()
    ts = [threading.Thread(target=stream_worker, args=(url, prompt_of(i), tokens, counts, i, stop),
                           daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    time.sleep(min(5.0, seconds / 4))  # warm up: every stream admitted
    c0, t0 = sum(counts), time.time()
    time.sleep(seconds)
    c1, t1 = sum(counts), time.time()
    stop.set()
    for t in ts:
        t.join()
    return (c1 - c0) / (t1 - t0)


def poller(url, stop, sizes, lat, hz_blocks=10.0, hz_mem=1.0):
    with httpx.Client(timeout=30) as c:
        nb, nm = time.time(), time.time()
        while not stop.is_set():
            now = time.time()
            if now >= nb:
                t = time.perf_counter()
                r = c.get(url + "/v1/memory/blocks")
                lat.append(time.perf_counter() - t)
                sizes.append((len(r.content), len(r.json()["runs"]) // 4))
                nb += 1.0 / hz_blocks
            if hz_mem and now >= nm:
                c.get(url + "/v1/memory")
                nm += 1.0 / hz_mem
            time.sleep(max(0.0, min(nb, nm) - time.time()))


def cmd_throughput(a):
    res = {"without": [], "with": []}
    for _ in range(a.rounds):
        for mode in ("without", "with"):
            stop, sizes, lat = threading.Event(), [], []
            p = None
            if mode == "with":
                p = threading.Thread(target=poller, args=(a.url, stop, sizes, lat), daemon=True)
                p.start()
            tps = run_streams(a.url, a.streams, a.tokens, a.seconds,
                              lambda i: f"Stream {i}: tell me about the sea.")
            stop.set()
            if p:
                p.join()
            res[mode].append(tps)
            print(f"{mode} poller: {tps:.1f} tokens/s", file=sys.stderr, flush=True)
    wo, wi = statistics.mean(res["without"]), statistics.mean(res["with"])
    return {"streams": a.streams, "tokens_per_s_without": res["without"],
            "tokens_per_s_with": res["with"], "mean_without": wo, "mean_with": wi,
            "cost_pct": 100 * (wo - wi) / wo}


def proc_cpu_s(pid: int) -> float:
    """utime + stime of process pid, in seconds (/proc/PID/stat)."""
    import os
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cmd_pollcpu(a):
    """The server's CPU time per second of polling, on an otherwise idle server: the whole
    server-side cost of a dashboard (HTTP, the engine's snapshot, JSON encoding)."""
    out = {}
    for mode in ("idle", "polled"):
        stop, sizes, lat = threading.Event(), [], []
        p = None
        c0, t0 = proc_cpu_s(a.pid), time.time()
        if mode == "polled":
            p = threading.Thread(target=poller, args=(a.url, stop, sizes, lat), daemon=True)
            p.start()
        time.sleep(a.seconds)
        stop.set()
        if p:
            p.join()
        c1, t1 = proc_cpu_s(a.pid), time.time()
        out[mode] = {"server_cpu_s": c1 - c0, "wall_s": t1 - t0, "polls": len(lat),
                     "cpu_ms_per_s": 1000 * (c1 - c0) / (t1 - t0)}
    extra = out["polled"]["cpu_ms_per_s"] - out["idle"]["cpu_ms_per_s"]
    import os
    out["polling_cpu_ms_per_s"] = extra
    out["share_of_machine_pct"] = extra / 10.0 / (os.cpu_count() or 1)
    return out


def cmd_blockmap(a):
    stop, sizes, lat = threading.Event(), [], []
    p = threading.Thread(target=poller, args=(a.url, stop, sizes, lat, 10.0, 0.0), daemon=True)
    p.start()
    tps = run_streams(a.url, a.streams, a.tokens, a.seconds, lambda i: [(i * 37 + j) % 200 + 1
                                                                       for j in range(8 + i % 57)])
    stop.set()
    p.join()
    bm = httpx.get(a.url + "/v1/memory/blocks", timeout=30).json()
    lat_ms = sorted(x * 1000 for x in lat)
    return {"n_blocks": bm["n_blocks"], "polls": len(lat), "tokens_per_s": tps,
            "runs_max": max(s[1] for s in sizes), "bytes_max": max(s[0] for s in sizes),
            "bytes_median": statistics.median(s[0] for s in sizes),
            "latency_ms_p50": lat_ms[len(lat_ms) // 2],
            "latency_ms_p99": lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))],
            "latency_ms_max": lat_ms[-1]}


def cmd_rss(a):
    stop = threading.Event()
    counts = [0] * a.streams
    ts = [threading.Thread(target=stream_worker, args=(a.url, f"Story {i}: " * 4, a.tokens, counts, i,
                                                       stop), daemon=True) for i in range(a.streams)]
    for t in ts:
        t.start()
    if a.touch_prompts:  # long token-id prompts that fill the pool (then held by the cache)
        def touch(i):
            ids = [(i * 7919 + j * 104729) % 40000 + 100 for j in range(a.touch_len)]
            httpx.post(a.url + "/v1/completions", json={"prompt": ids, "max_tokens": 1},
                       timeout=600)
        tt = [threading.Thread(target=touch, args=(i,)) for i in range(a.touch_prompts)]
        for t in tt:
            t.start()
        for t in tt:
            t.join()
    time.sleep(a.seconds)
    m = httpx.get(a.url + "/v1/memory", timeout=30).json()
    stop.set()
    pr = m["process"]
    named = {k: v["current"] for k, v in m["categories"].items()}
    return {"rss_bytes": pr["rss_bytes"], "rss_anon_bytes": pr["rss_anon_bytes"],
            "rss_file_bytes": pr["rss_file_bytes"], "named_bytes": named,
            "named_total": sum(named.values()), "host_heap_bytes": pr["host_heap_bytes"],
            "kv_used_blocks": m["kv"]["used"], "kv_blocks": m["kv"]["blocks"],
            "named_over_rss": sum(named.values()) / pr["rss_bytes"],
            # CPU backend: the manager's KV/activation/workspace buffers are host malloc, so
            # the heap outside the manager is the heap less them (weights are mmap'd)
            "host_heap_outside_manager": pr["host_heap_bytes"] - (m["used"] - named["weights"]),
            "named_and_heap_over_rss": (sum(named.values()) + pr["host_heap_bytes"]
                                        - (m["used"] - named["weights"])) / pr["rss_bytes"],
            # what /v1/memory names itself: the manager, the engine's host buffers, code
            "engine_host_bytes": pr.get("engine_host_bytes"), "code_bytes": pr.get("code_bytes"),
            "process_named_bytes": pr.get("named_bytes"), "named_share": pr.get("named_share")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["throughput", "blockmap", "rss", "pollcpu"])
    ap.add_argument("--pid", type=int, help="pollcpu: the server's process id")
    ap.add_argument("url")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--touch-prompts", type=int, default=0,
                    help="rss: first send this many prompts of --touch-len token ids")
    ap.add_argument("--touch-len", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    out = {"throughput": cmd_throughput, "blockmap": cmd_blockmap, "rss": cmd_rss,
           "pollcpu": cmd_pollcpu}[a.mode](a)
    print(json.dumps(out) if a.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
