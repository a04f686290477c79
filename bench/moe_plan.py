#!/usr/bin/env python3
"""bench/moe_plan.py - `kvant plan --weights-memory` on a mixture of experts against what
`kvant bench` measures: the expert cache's decode hit rate and tg tok/s at the planned budget
and at the other budgets plan predicts from its calibration trace, on OLMoE-1B-7B's shape
(bench/moe_offload.py writes the models).

    .venv/bin/python bench/moe_plan.py [--models build/bench-models] [--frac 0.4]
        [--rows 1,2,3] [-n 256] [-t 2] [--rounds 2]

Per model (the random one and the one whose routers favour a quarter of the experts): `kvant
plan --json` at --frac of the file (calibration: its own 256 random tokens), then `kvant bench -p
0 -n N --json` (bench's random tokens, another seed) at the planned budget and at the weights
memory of plan's predicted rows --rows (1: a tenth of the experts, 2: two tenths, ...),
alternating for --rounds rounds; medians printed with the ratio predicted / measured.  Run it
alone on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_offload import KVANT, base_model, hot_model  # noqa: E402


def run(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode:
        sys.exit(f"moe_plan: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return json.loads(r.stdout)


def bench(model: str, budget: int, a) -> tuple[float, float, int]:
    b = run([KVANT, "bench", "-m", model, "-t", str(a.t), "-p", "0", "-n", str(a.n), "-r", "1",
             "--weights-memory", str(budget), "--json"])
    return b["tg_expert_hits"] / (b["tg_expert_hits"] + b["tg_expert_misses"]), b["tg_tps"], \
        b["expert_slots"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.path.join(os.path.dirname(KVANT), "bench-models"))
    ap.add_argument("--frac", type=float, default=0.4)
    ap.add_argument("--rows", default="1,2,3")
    ap.add_argument("--scale", type=float, default=1.6)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.models, exist_ok=True)
    print("model             weights MiB  slots  kind       hit pred  hit meas  ratio  tok/s pred"
          "  tok/s meas  ratio")
    for model in (base_model(a.models), hot_model(a.models, a.scale)):
        budget = int(os.path.getsize(model) * a.frac)
        res: dict[int, dict[str, list[float]]] = {}
        for _ in range(a.rounds):
            p = run([KVANT, "plan", "-m", model, "-t", str(a.t), "--weights-memory", str(budget),
                     "--json"])["weights_offload"]
            rows = [(p["decode"], budget, "planned")]
            rows += [(p["predicted"][int(k) - 1], None, "predicted") for k in a.rows.split(",")]
            for row, wm, kind in rows:
                r = res.setdefault(row["slots"], {"kind": kind, "wm": row["weights_memory"],
                                                  "ph": [], "pt": [], "mh": [], "mt": []})
                hit, tps, slots = bench(model, wm or row["weights_memory"], a)
                assert slots == row["slots"], (slots, row)
                r["ph"].append(row["hit_rate"])
                r["pt"].append(row["tok_s"])
                r["mh"].append(hit)
                r["mt"].append(tps)
        for slots, r in sorted(res.items(), reverse=True):
            h0, h1 = statistics.median(r["ph"]), statistics.median(r["mh"])
            t0, t1 = statistics.median(r["pt"]), statistics.median(r["mt"])
            print(f"{os.path.basename(model)[:17]:17} {r['wm'] / 2**20:11.0f}  {slots:5d}  "
                  f"{r['kind']:9}  {100 * h0:7.1f}%  {100 * h1:7.1f}%  {h0 / h1:5.2f}  {t0:10.2f}"
                  f"  {t1:10.2f}  {t0 / t1:5.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
