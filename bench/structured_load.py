#!/usr/bin/env python3
"""Constrained decoding under concurrency: C concurrent chat requests with a JSON-schema
response_format against the same C requests unconstrained, in alternating rounds on one
server; aggregate generated tokens per second (sum of usage.completion_tokens over the
round's wall time), medians over --rounds, and the ratio (issue target: >= 0.9).

The unconstrained requests get the same max_tokens; the constrained ones may end earlier
(the grammar accepts), which is why tokens/s and not wall time is compared.  The server's
kvant_grammar_mask_seconds histogram is read from /metrics at the end (mask time per token).

usage: bench/structured_load.py [--model M] [--concurrency 32] [--max-tokens 64]
                                [--rounds 3] [--threads 2] [--json]
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

MODEL_NAME = [""]  # the served name: the file's stem

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "maxLength": 32},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "active"],
    "additionalProperties": False,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvant_isa(kvant: str) -> str | None:
    """The CPU kernels' instruction set the binary chose on this machine."""
    r = subprocess.run([kvant, "--isa"], capture_output=True, text=True, check=False)
    return r.stdout.strip() or None


def one(url: str, i: int, max_tokens: int, constrained: bool) -> int:
    body = {"model": MODEL_NAME[0], "max_tokens": max_tokens, "temperature": 0.7, "seed": i,
            "messages": [{"role": "user", "content": f"Describe user number {i} as JSON."}]}
    if constrained:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "user", "schema": SCHEMA}}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


def round_tps(url: str, c: int, max_tokens: int, constrained: bool, base: int) -> float:
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(c) as ex:
        toks = sum(ex.map(lambda i: one(url, base + i, max_tokens, constrained), range(c)))
    return toks / (time.perf_counter() - t0)


def mask_seconds(url: str) -> tuple[float, float]:
    s = n = 0.0
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("kvant_grammar_mask_seconds_sum"):
            s += float(line.split()[-1])
        elif line.startswith("kvant_grammar_mask_seconds_count"):
            n += float(line.split()[-1])
    return s, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvant", default="build/kvant")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    MODEL_NAME[0] = os.path.basename(a.model).removesuffix(".gguf")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="kvant-structured-", suffix=".log", delete=False)
    srv = subprocess.Popen([a.kvant, "serve", "-m", a.model, "--port", str(port), "-t",
                            str(a.threads), "--max-num-seqs", str(a.concurrency)],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if srv.poll() is not None:
                sys.exit(f"kvant serve exited {srv.returncode}; log {log.name}")
            time.sleep(0.1)
        one(url, 0, 8, True)  # warm-up: compiles and caches the grammar
        free, cons = [], []
        for r in range(a.rounds):  # alternating
            free.append(round_tps(url, a.concurrency, a.max_tokens, False, 1000 * r))
            cons.append(round_tps(url, a.concurrency, a.max_tokens, True, 1000 * r))
        ms, mn = mask_seconds(url)
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    out = {"concurrency": a.concurrency, "max_tokens": a.max_tokens, "rounds": a.rounds,
           "threads": a.threads, "free_tok_s": free, "constrained_tok_s": cons,
           "free_median": statistics.median(free), "constrained_median": statistics.median(cons),
           "ratio": statistics.median(cons) / statistics.median(free),
           "mask_us_mean": 1e6 * ms / mn if mn else None, "isa": kvant_isa(a.kvant)}
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{a.concurrency} concurrent, max_tokens {a.max_tokens}, {a.rounds} rounds: "
              f"free {out['free_median']:.1f} tok/s, JSON schema {out['constrained_median']:.1f}"
              f" tok/s, ratio {out['ratio']:.2f}; mask mean "
              f"{out['mask_us_mean'] or 0:.1f} us/token; isa {out['isa']}")


if __name__ == "__main__":
    main()
