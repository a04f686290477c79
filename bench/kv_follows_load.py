#!/usr/bin/env python3
"""KV memory that follows the load (numbers for docs/SERVER.md): how many sequences model
`a` runs at once, and how fast, while model `b` holds half the budget and after `b`
unloads (same budget, `a`'s KV pool grown into `b`'s memory), then `b` back (`a` shrinks).

Two names for one file (-m a=PATH -m b=PATH), a budget of exactly both footprints; N
requests to `a` at once, each a distinct prompt (no shared prefix) of about 360 tokens
plus MAXTOK greedy tokens, once to warm up and then measured.  /metrics is sampled every 20 ms for the running sequences;
the answers of both rounds must be equal (greedy, batch invariant).

usage: .venv/bin/python bench/kv_follows_load.py [--bin build/kvant] [--model PATH]
       [-n 12] [--max-tokens 128] [--threads 2] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default="build/kvant")
ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
ap.add_argument("-n", type=int, default=12)
ap.add_argument("--max-tokens", type=int, default=128)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--json")
args = ap.parse_args()
BIN, M, N, MAXTOK = args.bin, args.model, args.n, args.max_tokens
COMMON = ["-t", str(args.threads), "-c", "1024", "--max-num-seqs", "16",
          "--max-num-batched-tokens", "512"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 30

def start(*args):
    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="kvm-", suffix=".log", delete=False)
    p = subprocess.Popen([BIN, "serve", "--port", str(port), *COMMON, *args], stdout=log,
                         stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return p, url, log.name
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(open(log.name).read())

def stop(p):
    p.send_signal(signal.SIGTERM); p.wait(60)

def models(url):
    return {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]}

def metric(url, name):
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0

def burst(url, c):
    peak, stop_ev, runs = [0], threading.Event(), []
    def sampler():
        while not stop_ev.is_set():
            v = metric(url, "kvant_num_requests_running")
            runs.append(v)
            peak[0] = max(peak[0], v)
            time.sleep(0.02)
    pre0 = metric(url, "kvant_num_preemptions_total")
    th = threading.Thread(target=sampler); th.start()
    t0 = time.time()
    def body(i):  # distinct from the first token: no prefix is shared
        return {"model": "a", "prompt": f"{i} {PROMPT}", "max_tokens": MAXTOK,
                "temperature": 0, "ignore_eos": True}
    with ThreadPoolExecutor(N) as ex:
        rs = list(ex.map(lambda i: c.post(url + "/v1/completions", json=body(i), timeout=600),
                         range(N)))
    dt = time.time() - t0
    stop_ev.set(); th.join()
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200]
    texts = [r.json()["choices"][0]["text"] for r in rs]
    ptok = rs[0].json()["usage"]["prompt_tokens"]
    return {"peak_running": peak[0], "mean_running": round(sum(runs) / max(len(runs), 1), 2), "preemptions": metric(url, "kvant_num_preemptions_total") - pre0,
            "seconds": round(dt, 2), "tok_s": round(N * MAXTOK / dt, 1), "prompt_tokens": ptok,
            "texts": texts}

p, url, log = start("-m", f"a={M}", "-m", f"b={M}")
need = models(url)["a"]["need_bytes"]; stop(p)
budget = 2 * need
p, url, log = start("-m", f"a={M}", "-m", f"b={M}", "--device-memory", str(budget),
                    "--memory-utilization", "1")
out = {"budget": budget, "need": need}
try:
    with httpx.Client(limits=httpx.Limits(max_connections=32)) as c:
        for m in ("b", "a"):
            r = c.post(url + "/v1/completions", json={"model": m, "prompt": "hi", "max_tokens": 1}, timeout=120)
            assert r.status_code == 200, r.text
        burst(url, c)  # warm-up: the first burst after a load is several times slower
        ms = models(url)
        out["before"] = {"kv_blocks": ms["a"]["kv_blocks_total"], **burst(url, c)}
        r = c.post(url + "/v1/models/b/unload", timeout=120); assert r.status_code == 200
        ms = models(url)
        out["after"] = {"kv_blocks": ms["a"]["kv_blocks_total"], **burst(url, c)}
        r = c.post(url + "/v1/completions", json={"model": "b", "prompt": "hi", "max_tokens": 1}, timeout=120)
        ms = models(url)
        out["b_back"] = {"a_kv_blocks": ms["a"]["kv_blocks_total"], "b_state": ms["b"]["state"],
                         "a_evictions": ms["a"]["evictions"]}
finally:
    stop(p)
out["same_texts"] = out["before"].pop("texts") == out["after"].pop("texts")
print(json.dumps(out, indent=1))
print(open(log).read()[-3000:])
if args.json:
    with open(args.json, "w") as f:
        json.dump(out, f, indent=1)
