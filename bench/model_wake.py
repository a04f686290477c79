#!/usr/bin/env python3
"""Measures model wake and load times through `kvant serve` (numbers for docs/SERVER.md).

One server with the registry (-m NAME=PATH --load NAME); for each of N rounds:
  level 1: POST /sleep {"level":1}, POST /wake   (engine rebuilt, model still mapped)
  level 2: POST /sleep {"level":2}, POST /wake   (model re-read: mmap, header, tokenizer)
  load:    POST /unload, POST /load              (the same work as level 2, counted as a load)
  cold:    POST /unload, the file dropped from the page cache (posix_fadvise DONTNEED), POST
           /load: a full load from disk
The server-side time of each wake/load is the change of the model's wake_seconds /
load_seconds sum in /v1/models; the client-side time is the POST's round trip.  A greedy
request after every wake checks the model answers the same.

usage: .venv/bin/python bench/model_wake.py [--bin build/kvant] [--model PATH] [-n 30]
       [--threads 2] [--ctx 2048] [--json out.json] [-- more serve options, e.g. --no-pack]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/kvant")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("-n", type=int, default=30)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--json")
    ap.add_argument("--ctx", default="2048")
    ap.add_argument("extra", nargs="*", help="more `kvant serve` options (after --)")
    a = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="kvant-wake-", suffix=".log", delete=False)
    proc = subprocess.Popen([a.bin, "serve", "--port", str(port), "-t", a.threads, "-c", a.ctx,
                             "-m", f"m={a.model}", "--load", "m", *a.extra], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        c = httpx.Client(timeout=120)

        def info():
            return c.get(url + "/v1/models").json()["data"][0]

        def answer():
            r = c.post(url + "/v1/completions", json={"model": "m", "prompt": "The capital of France is",
                                                      "max_tokens": 8, "temperature": 0})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        ref = answer()
        res = {"level1": [], "level2": [], "load": [], "cold": []}
        client = {k: [] for k in res}
        for _ in range(a.n):
            for kind in ("level1", "level2", "load", "cold"):
                if kind in ("load", "cold"):
                    assert c.post(url + "/v1/models/m/unload").status_code == 200
                    key, act = "load_seconds", "load"
                    if kind == "cold":
                        fd = os.open(a.model, os.O_RDONLY)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        os.close(fd)
                else:
                    r = c.post(url + "/v1/models/m/sleep", json={"level": int(kind[-1])})
                    assert r.status_code == 200, r.text
                    key, act = "wake_seconds", "wake"
                before = info()[key]["sum_seconds"]
                t0 = time.perf_counter()
                r = c.post(url + f"/v1/models/m/{act}")
                client[kind].append(time.perf_counter() - t0)
                assert r.status_code == 200 and r.json()["state"] == "loaded", r.text
                res[kind].append(r.json()[key]["sum_seconds"] - before)
                assert answer() == ref
        out = {"model": a.model, "threads": int(a.threads), "ctx": int(a.ctx), "rounds": a.n,
               "extra": a.extra}
        for k in res:
            out[k] = {"p50_s": pct(res[k], 50), "p99_s": pct(res[k], 99),
                      "mean_s": statistics.mean(res[k]), "client_p50_s": pct(client[k], 50),
                      "client_p99_s": pct(client[k], 99)}
            print(f"{k:7s} server p50 {out[k]['p50_s']*1000:7.1f} ms  p99 {out[k]['p99_s']*1000:7.1f} ms"
                  f"   client p50 {out[k]['client_p50_s']*1000:7.1f} ms  p99 "
                  f"{out[k]['client_p99_s']*1000:7.1f} ms")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
        return 0
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log.name)


if __name__ == "__main__":
    sys.exit(main())
