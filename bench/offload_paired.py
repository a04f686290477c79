#!/usr/bin/env python3
"""Weight offload: the planner's prediction against measured speed, and the
stream's bandwidth against the alone read rates, in alternating rounds.

Each round, back to back:
  1. `kvant plan ... --weights-memory W --remeasure --json` per read mode:
     page-cache and O_DIRECT read rates alone, matmul rates, and the
     predicted tok/s per tokens-per-pass bucket (1 for tg, 128 for pp128)
     with the offload placement and fully resident;
  2. `kvant bench -p P -n N -r 1 --json`: fully resident (no budget), and
     with --device-memory D --weights-memory W under each read mode (the
     order rotated per round).
Prints one JSON line per round and, at the end, per configuration the
median and range over rounds of: measured tok/s, measured / predicted, and
(offload) the stream's GB/s of wall time over the tg series divided by the
alone read rate of the same round (page cache for buffered, O_DIRECT for
direct, their sum for both).

    .venv/bin/python bench/offload_paired.py MODEL [--rounds 3] [--weights-memory 600MiB]
        [--device-memory 1GiB] [-t 2] [-p 128] [-n 16] [--io buffered,direct,both]
        [--kvant build/kvant] [--cold]

--cold: while an offload configuration runs, a thread evicts the model
file's pages from the page cache every 50 ms (posix_fadvise DONTNEED on
that file only), so page-cache reads mostly come from the disk: the case of
a model larger than the page cache.  The planner's rates are still the warm
ones; the stream is then compared with the O_DIRECT (disk) rate.  Run it on
an otherwise idle machine when possible; on a shared one use several rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics
import os
import subprocess
import sys
import threading
import time


class Evictor(threading.Thread):
    """Drops path's pages from the page cache every period seconds."""

    def __init__(self, path: str, period: float = 0.05):
        super().__init__(daemon=True)
        self.path, self.period, self.stop = path, period, threading.Event()

    def run(self) -> None:
        fd = os.open(self.path, os.O_RDONLY)
        try:
            while not self.stop.is_set():
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                self.stop.wait(self.period)
        finally:
            os.close(fd)


def run_json(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr}")
    return json.loads(r.stdout)


def load_avg() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def pred_at(plan: dict, tokens: int, key: str) -> float:
    for p in plan["weights_offload"]["predicted"]:
        if p["tokens_per_pass"] == tokens:
            return p[key]
    sys.exit(f"no prediction for {tokens} tokens per pass")


def one_round(a, k: int) -> dict:
    common = ["-m", a.model, "-t", a.threads, "--device-memory", a.device_memory]
    rnd = {"round": k, "load": load_avg(), "plan": {}, "bench": {}}
    for io in a.io:
        plan = run_json([a.kvant, "plan", *common, "--weights-memory", a.weights_memory,
                         "--stream-io", io, "--remeasure", "--json"])
        w = plan["weights_offload"]
        rnd["plan"][io] = {
            "read_bps": w["rates"]["read_bytes_per_s"],
            "direct_bps": w["rates"].get("direct_read_bytes_per_s", 0.0),
            "tg_pred": pred_at(plan, 1, "tok_s"), "pp_pred": pred_at(plan, a.p, "tok_s"),
            "tg_pred_res": pred_at(plan, 1, "resident_tok_s"),
            "pp_pred_res": pred_at(plan, a.p, "resident_tok_s")}
    order = [*a.io] if a.cold else ["resident", *a.io]  # cold: the resident run is no different
    order = order[k % len(order):] + order[:k % len(order)]
    for cfg in order:
        # fully resident: no budget (the model is larger than the offload one)
        extra = ["-m", a.model, "-t", a.threads] if cfg == "resident" else \
            [*common, "--weights-memory", a.weights_memory, "--stream-io", cfg]
        ev = Evictor(a.model) if a.cold and cfg != "resident" else None
        if ev:
            ev.start()
        b = run_json([a.kvant, "bench", *extra, "-p", str(a.p), "-n", str(a.n), "-r", "1",
                      "--json"])
        if ev:
            ev.stop.set()
            ev.join()
        rnd["bench"][cfg] = b
    rnd["load_end"] = load_avg()
    return rnd


def summarize(a, rounds: list[dict]) -> None:
    def med(v):
        return f"{statistics.median(v):.3f} [{min(v):.3f}..{max(v):.3f}]"

    print(f"\n{len(rounds)} rounds; load {med([r['load'] for r in rounds])}")
    io0 = a.io[0]
    for cfg in [*a.io] if a.cold else ["resident", *a.io]:
        for t in ("tg", "pp"):
            meas = [r["bench"][cfg][f"{t}_tps"] for r in rounds]
            key = f"{t}_pred_res" if cfg == "resident" else f"{t}_pred"
            src = io0 if cfg == "resident" else cfg
            ratio = [r["bench"][cfg][f"{t}_tps"] / r["plan"][src][key] for r in rounds]
            print(f"{cfg:9s} {t}: measured tok/s {med(meas)}; measured/predicted {med(ratio)}")
    for io in a.io:
        rs = []
        for r in rounds:
            b, p = r["bench"][io], r["plan"][io]
            wall = b["tg_stream_bytes"] / b["tg_stream_wall_s"]
            alone = {"buffered": p["read_bps"], "direct": p["direct_bps"],
                     "both": p["read_bps"] + p["direct_bps"]}[io]
            if a.cold:  # the page cache is not the tier: the disk is
                alone = p["direct_bps"]
            rs.append((wall / 1e9, p["read_bps"] / 1e9, p["direct_bps"] / 1e9,
                       wall / alone if alone > 0 else 0.0, wall / p["read_bps"]))
        print(f"{io:9s} tg stream GB/s {med([x[0] for x in rs])}; page-cache alone "
              f"{med([x[1] for x in rs])}; direct alone {med([x[2] for x in rs])}; "
              f"stream / alone of its path {med([x[3] for x in rs])}; "
              f"stream / page-cache alone {med([x[4] for x in rs])}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weights-memory", default="600MiB")
    ap.add_argument("--device-memory", default="1GiB")
    ap.add_argument("-t", dest="threads", default="2")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--io", default="buffered,direct,both")
    ap.add_argument("--kvant", default="build/kvant")
    ap.add_argument("--cold", action="store_true")
    a = ap.parse_args()
    a.io = a.io.split(",")
    rounds = []
    for k in range(a.rounds):
        t0 = time.time()
        rounds.append(one_round(a, k))
        rounds[-1]["seconds"] = time.time() - t0
        print(json.dumps(rounds[-1]), flush=True)
    summarize(a, rounds)


if __name__ == "__main__":
    main()
