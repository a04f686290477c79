#!/usr/bin/env python3
"""bench/batch_sweep.py - continuous batching at several batch sizes, kvant against
llama.cpp's llama-batched-bench on the same GGUF, alternating tool by tool at each size.

    .venv/bin/python bench/batch_sweep.py [-m MODEL ...] [--batches 1,4,16,32,64]
        [-p 128] [-n 64] [-t 2] [--rounds 1] [--max-itl-ms MS]
        [--llama-batched-bench build/peer/build/bin/llama-batched-bench] [--json OUT]

kvant: `kvant bench --batch B -p P -n N -t T --json` (B requests submitted at once
through the engine; prefill tok/s = prompt tokens over the time to the last first token,
decode tok/s = generated tokens after each request's first over the rest).  llama.cpp:
`llama-batched-bench -npp P -ntg N -npl B` (B sequences, prompts processed together, then N
decode steps; S_PP and S_TG t/s).  The int8 roofline column is the rate as a share of the int8
peak kvant measures (`--roofline`, the best of three probes before each model; 2 ops per
matmul parameter and token, attention not counted).  Medians over --rounds.  The peer's
tools, from the tree `make peer-src` unpacks:
    cmake -S build/peer/llama.cpp -B build/peer/build -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF
    cmake --build build/peer/build -j2 --target llama-batched-bench llama-bench llama-server
Run it on a quiet machine: anything else on the cores makes the numbers meaningless.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"


def run_kvant(binary, model, b, p, n, t, itl):
    cmd = [binary, "bench", "-m", model, "--batch", str(b), "-p", str(p), "-n", str(n),
           "-t", str(t), "--json"]
    if itl is not None:
        cmd += ["--max-itl-ms", str(itl)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        sys.exit(f"batch_sweep: {' '.join(cmd)} failed:\n{out.stderr}")
    j = json.loads(out.stdout.strip().splitlines()[-1])
    return {"prefill": j["prefill_tps"], "decode": j["decode_tps"], "params": j["params"],
            "itl_p99": j["itl_ms_p99"], "ttft_p50": j["ttft_ms_p50"], "isa": j["isa"]}


def int8_peak(binary, model, t):
    """The int8 peak (GOP/s, t threads): the best of three `kvant bench --roofline` probes (one
    probe can land while the other core is busy and read half)."""
    best = 0.0
    for _ in range(3):
        out = subprocess.run([binary, "bench", "-m", model, "-p", "16", "-n", "1", "-r", "1",
                              "-t", str(t), "--roofline", "--json"],
                             capture_output=True, text=True, timeout=600)
        if out.returncode == 0:
            j = json.loads(out.stdout.strip().splitlines()[-1])
            best = max(best, j.get("roofline_vnni_gops", 0.0))
    return best


ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|"
                 r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")


def run_peer(binary, model, b, p, n, t):
    ctx = b * (p + n) + 64
    cmd = [binary, "-m", model, "-c", str(ctx), "-b", "2048", "-ub", "512", "-npp", str(p),
           "-ntg", str(n), "-npl", str(b), "-t", str(t)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if out.returncode:
        sys.exit(f"batch_sweep: {' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    for line in out.stdout.splitlines():
        m = ROW.match(line)
        if m and int(m.group(3)) == b:
            return {"prefill": float(m.group(6)), "decode": float(m.group(8))}
    sys.exit(f"batch_sweep: no result row in llama-batched-bench output:\n{out.stdout}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", action="append")
    ap.add_argument("--batches", default="1,4,16,32,64")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--max-itl-ms", type=int, default=None)
    ap.add_argument("--kvant", default=os.environ.get("KVANT_BIN", "build/kvant"))
    ap.add_argument("--llama-batched-bench", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    models = a.model or [DEFAULT_MODEL]
    batches = [int(x) for x in a.batches.split(",")]
    rows = []
    for model in models:
        peak = int8_peak(a.kvant, model, a.t)
        for b in batches:
            ks, ps = [], []
            for _ in range(a.rounds):
                ks.append(run_kvant(a.kvant, model, b, a.p, a.n, a.t, a.max_itl_ms))
                if a.llama_batched_bench:
                    ps.append(run_peer(a.llama_batched_bench, model, b, a.p, a.n, a.t))
            med = lambda xs, k: statistics.median(x[k] for x in xs) if xs else 0.0
            row = {"model": os.path.basename(model), "batch": b, "isa": ks[0]["isa"]}
            for k in ("prefill", "decode", "itl_p99", "ttft_p50"):
                row["kvant_" + k] = med(ks, k)
            ops = 2 * ks[0]["params"] * 1e-9 / peak if peak else 0.0  # per token, of the peak
            row["int8_peak_gops"] = peak
            row["kvant_prefill_frac"] = row["kvant_prefill"] * ops
            row["kvant_decode_frac"] = row["kvant_decode"] * ops
            row["peer_prefill"], row["peer_decode"] = med(ps, "prefill"), med(ps, "decode")
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"ISA {rows[0]['isa']}, {a.t} threads, p {a.p} n {a.n}, medians of {a.rounds} round(s); "
          f"int8 peak {rows[0]['int8_peak_gops']:.0f} GOP/s")
    print("| model | batch | kvant prefill tok/s | % int8 | kvant decode tok/s | % int8 | "
          "x batch 1 | llama.cpp prefill | llama.cpp decode | decode ratio | kvant ITL p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = {}
    for r in rows:
        base.setdefault(r["model"], r["kvant_decode"])
        ratio = r["kvant_decode"] / r["peer_decode"] if r["peer_decode"] else 0.0
        print(f"| {r['model']} | {r['batch']} | {r['kvant_prefill']:.1f} | "
              f"{100 * r['kvant_prefill_frac']:.1f}% | {r['kvant_decode']:.1f} | "
              f"{100 * r['kvant_decode_frac']:.1f}% | "
              f"{r['kvant_decode'] / base[r['model']]:.2f}x | {r['peer_prefill']:.1f} | "
              f"{r['peer_decode']:.1f} | {ratio:.2f}x | {r['kvant_itl_p99']:.1f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
