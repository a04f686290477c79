#!/usr/bin/env python3
"""bench/families.py - kvant and llama.cpp's llama-bench per model family, alternating rounds.

    .venv/bin/python bench/families.py --llama-bench build/peer/build/bin/llama-bench \\
        [--models DIR] [--families gemma3,qwen3,...] [--rounds 3] [-t 2] [--json]

For each family a ~1B-parameter random-weight model in Q4_0 (tests/py/make_family.py
--shape 1b, written once into DIR, default build/bench-models), then per round
`kvant bench -p 512 -n 128 -r 3` and `llama-bench -p 512 -n 128 -r 3` (kvant first in odd
rounds, llama.cpp first in even ones, so drift falls on both).  Prints medians of pp512 and
tg128 tok/s and the ratios kvant / llama.cpp, with the ISA kvant ran.  Run it on a quiet
machine: anything else on the cores makes the numbers meaningless.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = "llama3,mistral,qwen3,gemma2,gemma3,phi3"
REPS = int(os.environ.get("REPS", "3"))


def model_path(d, fam):
    p = os.path.join(d, f"{fam}-Q4_0-1b.gguf")
    if not os.path.exists(p):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "py", "make_family.py"), d, fam,
                        "--wtype", "Q4_0", "--shape", "1b"], check=True)
    if not os.path.exists(p):
        sys.exit(f"families: make_family.py wrote no {p}")
    return p


def kvant(binary, model, t):
    out = subprocess.run([binary, "bench", "-m", model, "-t", str(t), "-p", "512", "-n", "128",
                          "-r", str(REPS), "--json"], capture_output=True, text=True, timeout=3600)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"pp": r["pp_tps"], "tg": r["tg_tps"]}


def llama(binary, model, t):
    out = subprocess.run([binary, "-m", model, "-t", str(t), "-p", "512", "-n", "128", "-r", str(REPS),
                          "-o", "json"], capture_output=True, text=True, timeout=3600)
    if out.returncode:
        return {"error": out.stderr.strip()[-300:]}
    rows = json.loads(out.stdout)
    return {"pp" if r["n_prompt"] else "tg": r["avg_ts"] for r in rows}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--kvant", default=os.path.join(ROOT, "build", "kvant"))
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "bench-models"))
    ap.add_argument("--families", default=FAMILIES)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()
    isa = subprocess.run([o.kvant, "--isa"], capture_output=True, text=True).stdout.strip()
    os.makedirs(o.models, exist_ok=True)
    rows = []
    for fam in o.families.split(","):
        m = model_path(o.models, fam)
        res = {"kvant": [], "llama.cpp": []}
        for k in range(o.rounds):
            order = [("kvant", kvant, o.kvant), ("llama.cpp", llama, o.llama_bench)]
            for name, fn, b in (order if k % 2 == 0 else order[::-1]):
                res[name].append(fn(b, m, o.threads))
        row = {"family": fam, "model": os.path.basename(m), "isa": isa, "threads": o.threads}
        for name, rs in res.items():
            errs = [r["error"] for r in rs if "error" in r]
            if errs:
                row[name + "_error"] = errs[0]
                continue
            for w in ("pp", "tg"):
                row[f"{name}_{w}"] = statistics.median(r[w] for r in rs)
        for w in ("pp", "tg"):
            if f"kvant_{w}" in row and f"llama.cpp_{w}" in row:
                row[f"{w}_ratio"] = row[f"kvant_{w}"] / row[f"llama.cpp_{w}"]
        rows.append(row)
        print(json.dumps(row) if o.json else
              f"{fam} ({isa}, -t {o.threads}): " + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                                          for k, v in row.items() if k not in ("family", "isa", "threads")),
              flush=True)
    if not o.json:
        print("\n| family | ISA | kvant pp512 | llama.cpp pp512 | ratio | kvant tg128 | llama.cpp tg128 | ratio |")
        print("|---|---|---|---|---|---|---|---|")
        g = lambda r, k: f"{r[k]:.1f}" if k in r else "-"
        x = lambda r, k: f"{r[k]:.2f}x" if k in r else "-"
        for r in rows:
            print(f"| {r['family']} | {isa} | {g(r, 'kvant_pp')} | {g(r, 'llama.cpp_pp')} | {x(r, 'pp_ratio')} |"
                  f" {g(r, 'kvant_tg')} | {g(r, 'llama.cpp_tg')} | {x(r, 'tg_ratio')} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
