#!/usr/bin/env python3
"""Tensor and pipeline parallelism on this machine: one process against --tp 2 and --pp 2
(one thread per rank, the same 2 threads in total), over shared memory and over the TCP
transport forced (--mca btl tcp,self, standing in for two hosts).

For each configuration, in one run (ratios are only meaningful within a run):
  * `kvant bench -p P -n N --json`: pp and tg tokens/s (median of --reps), rank 0's bytes
    sent per prompt token and per decoded token, and the share of rank 0's step time spent in
    communication;
  * `kvant plan --tp/--pp --json`: each rank's weight bytes and KV bytes per token against
    one process (target: at most 1/N of one process + 5%).

  * with --batch B (default 16): B requests through the engine (`bench --batch`), prefill
    and decode tokens/s against one process.

usage: bench/parallel.py [--model M] [--p 64] [--n 32] [--reps 5] [--batch 16] [--out FILE]
Needs OpenMPI (`make deps`).  Prints a markdown table; --out writes the raw numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

ENV = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}


def run_json(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=3600)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvant", default="build/kvant")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--p", type=int, default=64)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device-memory", default="4GiB")
    ap.add_argument("--batch", type=int, default=16,
                    help="also B requests through the engine (bench --batch); 0: skip")
    ap.add_argument("--out")
    a = ap.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("mpirun not found: run `make deps`")
    bench = [a.kvant, "bench", "-m", a.model, "-p", str(a.p), "-n", str(a.n), "-r",
             str(a.reps), "--json", "--device-memory", a.device_memory]
    configs = [("one process, 2 threads", [], ["-t", "2"], None),
               ("--tp 2, shared memory", ["--tp", "2"], ["-t", "1"], "vader,self"),
               ("--tp 2, TCP", ["--tp", "2"], ["-t", "1"], "tcp,self"),
               ("--pp 2, shared memory", ["--pp", "2"], ["-t", "1"], "vader,self"),
               ("--pp 2, TCP", ["--pp", "2"], ["-t", "1"], "tcp,self")]
    plan = {}
    for flag in ("--tp", "--pp"):
        plan[flag] = run_json([a.kvant, "plan", "-m", a.model, flag, "2", "--json",
                               "--device-memory", a.device_memory])
    one_plan = run_json([a.kvant, "plan", "-m", a.model, "--json", "--device-memory",
                         a.device_memory])["plans"][0]["plan"]
    rows, batch_rows = [], []
    for name, par, threads, btl in configs:
        mpi = [mpirun, "-np", "2", "--oversubscribe", "--mca", "btl", btl] if par else []
        rows.append({"config": name, **run_json(mpi + bench + threads + par)})
        if a.batch:
            cmd = [a.kvant, "bench", "-m", a.model, "-p", str(a.p), "-n", str(a.n), "--batch",
                   str(a.batch), "--json", "--device-memory", a.device_memory]
            batch_rows.append({"config": name, **run_json(mpi + cmd + threads + par)})
    base = rows[0]
    print(f"model {a.model}, ISA {base['isa']}, pp{a.p} / tg{a.n}, median of {a.reps}\n")
    print("| configuration | pp tok/s | tg tok/s | pp vs one | tg vs one | bytes/prompt token "
          "| bytes/decoded token | comm share pp / tg |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['config']} | {r['pp_tps']:.1f} | {r['tg_tps']:.1f} | "
              f"{r['pp_tps'] / base['pp_tps']:.2f}x | {r['tg_tps'] / base['tg_tps']:.2f}x | "
              f"{r.get('pp_comm_bytes_per_token', 0):.0f} | "
              f"{r.get('tg_comm_bytes_per_token', 0):.0f} | "
              f"{100 * r.get('pp_comm_share', 0):.0f}% / {100 * r.get('tg_comm_share', 0):.0f}% |")
    if batch_rows:
        b0 = batch_rows[0]
        print(f"\n{a.batch} requests of p{a.p} / n{a.n} through the engine (bench --batch)\n")
        print("| configuration | prefill tok/s | decode tok/s | prefill vs one | decode vs one |")
        print("|---|---|---|---|---|")
        for r in batch_rows:
            print(f"| {r['config']} | {r['prefill_tps']:.1f} | {r['decode_tps']:.1f} | "
                  f"{r['prefill_tps'] / b0['prefill_tps']:.2f}x | "
                  f"{r['decode_tps'] / b0['decode_tps']:.2f}x |")
    full_w = plan["--tp"]["one_process_weights_bytes"]
    kv1 = one_plan["kv_bytes_per_token"]
    print("\n| split | rank | weights | share of one process | KV bytes/token | share |")
    print("|---|---|---|---|---|---|")
    for flag, pj in plan.items():
        for rk in pj["ranks"]:
            print(f"| {flag} 2 | {rk['rank']} | {rk['weights_bytes'] / 2**20:.2f} MiB | "
                  f"{100 * rk['weights_share']:.1f}% | {rk['kv_bytes_per_token']} | "
                  f"{100 * rk['kv_bytes_per_token'] / kv1:.1f}% |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"bench": rows, "batch": batch_rows, "plan": plan, "one_plan": one_plan},
                      f, indent=1)


if __name__ == "__main__":
    main()
