#!/usr/bin/env python3
"""bench/hybrid_chat.py - multi-turn chat on a hybrid model through `kvant serve`: prefix-cache
hits and time to first token per turn, against a dense model, and after a restart from the
disk tier.

    .venv/bin/python bench/hybrid_chat.py --model build/bench-models/granite-h-Q4_0-1b.gguf \\
        --dense build/bench-models/llama3-Q4_0-1b.gguf [--turns 8] [--new 128] [--asst 32] \\
        [--convs 3] [-t 2] [--json]

A conversation: turn 1's prompt is asst + new random token ids (a system prompt and the first
user message); each later turn's prompt is the previous one plus `asst` ids (the assistant's
reply as the client sends it back) plus `new` ids (the next user message), so every turn
brings asst + new tokens the cache cannot have.
Each turn is one /v1/completions request with max_tokens 1: its latency is the time to the
first token (prefill of what the cache misses, plus one sampled token), its usage the cached
tokens.  `convs` conversations with different ids per model, turns interleaved across them
so that no turn follows its own conversation's previous turn directly.  Printed: per turn
the median TTFT and the cached share, for the hybrid, the dense model and the hybrid
without a prefix cache (no tiers for these three); the hybrid's hit rate against the dense
one's; TTFT at the last turn over turn 1; then a hybrid server with a --kv-disk-dir runs
conversation 0, is stopped and started again on the same directory, and the last turn of
conversation 0 is sent again (cached tokens, TTFT).
Run it on a quiet machine.
"""
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
import time
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary, model, threads, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="hybrid-chat-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([binary, "serve", "-m", model, "--port", str(self.port),
                                      "-t", str(threads), *args], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"kvant serve exited: {open(self.log.name).read()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        with urllib.request.urlopen(self.url + "/v1/models") as r:
            self.name = json.load(r)["data"][0]["id"]

    def complete(self, prompt):
        body = json.dumps({"model": self.name, "prompt": prompt, "max_tokens": 1,
                           "temperature": 0}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=600) as r:
            out = json.load(r)
        return time.perf_counter() - t0, out["usage"]["prompt_tokens_details"]["cached_tokens"]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=300)


def conversations(n_convs, turns, new, asst, vocab):
    convs = []
    for c in range(n_convs):
        rng = np.random.default_rng(1000 + c)
        p, ps = [], []
        for t in range(turns):
            p = p + rng.integers(3, vocab, size=asst + new).tolist()
            ps.append(list(p))
        convs.append(ps)
    return convs


def run(server, convs):
    """ttft[turn] and cached[turn] lists over conversations, turns interleaved."""
    turns = len(convs[0])
    ttft = [[] for _ in range(turns)]
    cached = [[] for _ in range(turns)]
    for t in range(turns):
        for conv in convs:
            dt, hit = server.complete(conv[t])
            ttft[t].append(dt)
            cached[t].append(hit)
    return ttft, cached


def summary(ttft, cached, convs):
    rows = []
    for t in range(len(ttft)):
        n = sum(len(c[t]) for c in convs)
        rows.append({"turn": t + 1, "prompt": len(convs[0][t]), "ttft_p50": statistics.median(ttft[t]),
                     "cached": sum(cached[t]), "tokens": n})
    hit = sum(r["cached"] for r in rows) / sum(r["tokens"] for r in rows)
    return rows, hit


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--dense", required=True)
    ap.add_argument("--kvant", default=os.path.join(ROOT, "build", "kvant"))
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--asst", type=int, default=32)
    ap.add_argument("--convs", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    convs = conversations(a.convs, a.turns, a.new, a.asst, 30000)
    ctx = str(max(4096, len(convs[0][-1]) + 64))
    res = {}
    disk = tempfile.mkdtemp(prefix="hybrid-chat-kv-")
    hyb_args = ["-c", ctx, "--kv-disk-dir", disk]
    for label, model, extra in (("hybrid", a.model, ["-c", ctx]), ("dense", a.dense, ["-c", ctx]),
                                ("hybrid_no_cache", a.model, ["-c", ctx, "--no-prefix-cache"])):
        srv = Server(a.kvant, model, a.threads, *extra)
        try:
            ttft, cached = run(srv, convs)
        finally:
            srv.stop()
        rows, hit = summary(ttft, cached, convs)
        res[label] = {"rows": rows, "hit_rate": hit}
    srv = Server(a.kvant, a.model, a.threads, *hyb_args)
    try:
        run(srv, convs[:1])
    finally:
        srv.stop()
    srv = Server(a.kvant, a.model, a.threads, *hyb_args)  # the same disk tier: a restart
    try:
        dt, hit = srv.complete(convs[0][-1])
    finally:
        srv.stop()
    shutil.rmtree(disk, ignore_errors=True)
    res["restart"] = {"ttft": dt, "cached": hit, "prompt": len(convs[0][-1])}
    h, d = res["hybrid"], res["dense"]
    res["hit_vs_dense"] = h["hit_rate"] / d["hit_rate"] if d["hit_rate"] else 0.0
    res["ttft_last_over_first"] = h["rows"][-1]["ttft_p50"] / h["rows"][0]["ttft_p50"]
    if a.json:
        print(json.dumps(res))
        return
    print(f"hybrid {a.model}, dense {a.dense}, {a.convs} conversations x {a.turns} turns "
          f"(+{a.asst} assistant +{a.new} user ids each), -t {a.threads}")
    print(f"{'turn':>4} {'prompt':>6} | {'hybrid ttft':>11} {'cached':>6} | {'dense ttft':>10} "
          f"{'cached':>6} | {'no cache ttft':>13}")
    for hr, dr, nr in zip(h["rows"], d["rows"], res["hybrid_no_cache"]["rows"]):
        print(f"{hr['turn']:>4} {hr['prompt']:>6} | {hr['ttft_p50']:>11.3f} {hr['cached'] / hr['tokens']:>6.1%}"
              f" | {dr['ttft_p50']:>10.3f} {dr['cached'] / dr['tokens']:>6.1%} | {nr['ttft_p50']:>13.3f}")
    print(f"hit rate: hybrid {h['hit_rate']:.1%}, dense {d['hit_rate']:.1%} "
          f"({res['hit_vs_dense']:.2f}x); TTFT turn {a.turns} / turn 1: "
          f"{res['ttft_last_over_first']:.2f}x (no cache: "
          f"{res['hybrid_no_cache']['rows'][-1]['ttft_p50'] / res['hybrid_no_cache']['rows'][0]['ttft_p50']:.2f}x)")
    r = res["restart"]
    print(f"after a restart from the disk tier: {r['cached']} of {r['prompt']} prompt tokens cached, "
          f"TTFT {r['ttft']:.3f} s")


if __name__ == "__main__":
    main()
