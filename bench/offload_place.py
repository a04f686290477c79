#!/usr/bin/env python3
"""Weight offload: which layers stream (--weights-place tail | spread | auto) against fully
resident, in alternating rounds of `kvant bench` (the order rotated each round).

    .venv/bin/python bench/offload_place.py [MODEL] [--device-memory 51MiB] [--rounds 5]
        [-t 2] [-p 64] [-n 64] [--kvant build/kvant]

Prints one JSON line per run and, per configuration, the median tg/pp tok/s and the ratio
to resident and to tail.  Indicative only on a shared machine: run it alone.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess

CONFIGS = ["resident", "tail", "spread", "auto"]


def run(args, cfg: str) -> dict:
    cmd = [args.kvant, "bench", "-m", args.model, "-t", args.t, "-p", str(args.p), "-n",
           str(args.n), "-r", "1", "--json"]
    if cfg != "resident":
        cmd += ["--device-memory", args.device_memory]
        if cfg != "auto":
            cmd += ["--weights-place", cfg]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)}: {r.stderr}")
    out = json.loads(r.stdout)
    line = [x for x in r.stderr.splitlines() if "offload streams" in x]
    return {"config": cfg, "tg_tps": out["tg_tps"], "pp_tps": out["pp_tps"],
            "isa": out["isa"], "order": line[0] if line else ""}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--device-memory", default="51MiB")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", default="2")
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("--kvant", default="build/kvant")
    args = ap.parse_args()
    res: dict[str, list[dict]] = {c: [] for c in CONFIGS}
    for k in range(args.rounds):
        for cfg in CONFIGS[k % len(CONFIGS):] + CONFIGS[:k % len(CONFIGS)]:
            r = run(args, cfg)
            print(json.dumps(r), flush=True)
            res[cfg].append(r)
    med = {c: {m: statistics.median(x[m] for x in v) for m in ("tg_tps", "pp_tps")}
           for c, v in res.items()}
    isa = res["resident"][0]["isa"]
    for c in CONFIGS:
        print(f"{c:9s} tg {med[c]['tg_tps']:8.2f} tok/s ({med[c]['tg_tps'] / med['resident']['tg_tps']:.3f}x "
              f"resident, {med[c]['tg_tps'] / med['tail']['tg_tps']:.3f}x tail)  pp "
              f"{med[c]['pp_tps']:8.2f} tok/s ({med[c]['pp_tps'] / med['tail']['pp_tps']:.3f}x tail)  "
              f"[{isa}, median of {args.rounds}]")


if __name__ == "__main__":
    main()
