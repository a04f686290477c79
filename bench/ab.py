#!/usr/bin/env python3
"""bench/ab.py - two kvant builds on the same workloads, in alternating
rounds, medians and ratios (B / A): "is B as fast as A?".

    .venv/bin/python bench/ab.py BIN_A BIN_B [--rounds 3] [-m MODEL ...]

Per model and round, each binary runs (A then B, then B then A in the next
round, so drift between runs falls on both): `kvant bench -p 512 -n 128 -r 3
-t 2` (single stream: pp512 and tg128) and `kvant bench --batch 32 -p 128
-n 64 -t 2` (continuous batching: prefill and aggregate decode).  Prints
one table; --json prints the rows.  Run it on a quiet machine: anything
else on the cores makes the numbers meaningless.
"""
import argparse
import json
import statistics
import subprocess
import sys

DEFAULT_MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
WORKLOADS = [
    ("single", ["-p", "512", "-n", "128", "-r", "3"], ["pp_tps", "tg_tps"]),
    ("batch32", ["--batch", "32", "-p", "128", "-n", "64"], ["prefill_tps", "decode_tps"]),
]


def run(binary, model, args, threads):
    cmd = [binary, "bench", "-m", model, "-t", str(threads), "--json"] + args
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode:
        sys.exit("ab: %s failed (%d): %s" % (" ".join(cmd), out.returncode, out.stderr.strip()))
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-m", "--model", action="append")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--workloads", default="single,batch32",
                    help="comma-separated: single (pp512, tg128), batch32 (32 x (128 + 64))")
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()
    models = o.model or [DEFAULT_MODEL]
    wanted = o.workloads.split(",")
    workloads = [w for w in WORKLOADS if w[0] in wanted]
    if len(workloads) != len(wanted):
        sys.exit("ab: --workloads: known are %s" % ", ".join(w[0] for w in WORKLOADS))
    vals = {}  # (model, workload, metric, which) -> [values]
    isa = None
    for rnd in range(o.rounds):
        order = [("A", o.a), ("B", o.b)] if rnd % 2 == 0 else [("B", o.b), ("A", o.a)]
        for model in models:
            for name, args, metrics in workloads:
                for which, binary in order:
                    r = run(binary, model, args, o.threads)
                    isa = r.get("isa", isa)
                    for m in metrics:
                        vals.setdefault((model, name, m, which), []).append(r[m])
    rows = []
    for model in models:
        for name, _, metrics in workloads:
            for m in metrics:
                a = vals[(model, name, m, "A")]
                b = vals[(model, name, m, "B")]
                ma, mb = statistics.median(a), statistics.median(b)
                rows.append({"model": model, "workload": name, "metric": m, "a": a, "b": b,
                             "median_a": ma, "median_b": mb, "ratio": mb / ma if ma else None})
    if o.json:
        print(json.dumps({"isa": isa, "threads": o.threads, "rounds": o.rounds, "rows": rows}))
        return 0
    print("ISA %s, %d threads, %d alternating rounds; tok/s medians, B / A" % (isa, o.threads, o.rounds))
    print("%-40s %-8s %-12s %9s %9s %7s" % ("model", "workload", "metric", "A", "B", "B/A"))
    for r in rows:
        print("%-40s %-8s %-12s %9.2f %9.2f %7.3f" % (r["model"].split("/")[-1], r["workload"],
              r["metric"], r["median_a"], r["median_b"], r["ratio"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
