#!/usr/bin/env python3
"""bench/moe_offload.py - experts placed by memory (--weights-memory on a mixture of experts)
against the resident model, on OLMoE-1B-7B's shape.

    .venv/bin/python bench/moe_offload.py [--models build/bench-models] [--scale 1.6]
        [--frac 0.4] [-n 128] [-t 2]

Writes (once) the random OLMoE-shaped Q4_0 model (tests/py/make_family.py --shape 7b) and a
copy whose routers favour a quarter of the experts: in every layer the router rows of experts
0..15 (of 64) are multiplied by --scale, so their logits spread wider and they win the top-8
more often (the share they take is measured, printed as "most used quarter").  For each file:
`kvant bench -p 0 -n N` resident and with --weights-memory at --frac of the file's size,
reporting tg tok/s, the cache's hit rate and the peak RSS (/usr/bin/time), the budget beside
it.  Run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

import numpy as np
from gguf import GGUFReader

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KVANT = os.path.join(ROOT, "build", "kvant")


def base_model(d: str) -> str:
    p = os.path.join(d, "olmoe-Q4_0-7b.gguf")
    if not os.path.exists(p):
        subprocess.run([sys.executable, os.path.join(ROOT, "tests", "py", "make_family.py"), d,
                        "olmoe", "--wtype", "Q4_0", "--shape", "7b"], check=True)
    return p


def hot_model(d: str, scale: float) -> str:
    """A copy whose routers' rows 0..n_expert/4 are multiplied by scale."""
    src = base_model(d)
    p = os.path.join(d, f"olmoe-Q4_0-7b-hot{scale:g}.gguf")
    if os.path.exists(p):
        return p
    shutil.copyfile(src, p + ".tmp")
    r = GGUFReader(p + ".tmp")
    offs = [(t.data_offset, t.shape) for t in r.tensors if t.name.endswith("ffn_gate_inp.weight")]
    del r
    mm = np.memmap(p + ".tmp", mode="r+", dtype=np.uint8)
    for off, shape in offs:
        n_embd, n_expert = int(shape[0]), int(shape[1])
        w = np.ndarray((n_expert, n_embd), dtype=np.float32, buffer=mm, offset=off)
        w[: n_expert // 4] *= scale
    mm.flush()
    del mm
    os.replace(p + ".tmp", p)
    return p


def bench(model: str, n: int, t: int, budget: int | None) -> dict:
    cmd = ["/usr/bin/time", "-f", "maxrss_kb %M", KVANT, "bench", "-m", model, "-t", str(t),
           "-p", "0", "-n", str(n), "-r", "1"]
    if budget:
        cmd += ["--weights-memory", str(budget)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if r.returncode:
        sys.exit(f"moe_offload: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    out = {"tg": float(re.search(r"^tg\d+\s+([\d.]+)", r.stdout, re.M).group(1)),
           "rss_mib": int(re.search(r"maxrss_kb (\d+)", r.stderr).group(1)) / 1024}
    m = re.search(r"hit rate ([\d.]+)%.*?took ([\d.]+)% of the uses", r.stdout)
    if m:
        out["hit_rate"], out["hot_share"] = float(m.group(1)), float(m.group(2))
    m = re.search(r"experts placed by memory: (\d+) of (\d+)", r.stderr)
    if m:
        out["slots"] = f"{m.group(1)}/{m.group(2)}"
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "bench-models"))
    ap.add_argument("--scale", type=float, default=1.6)
    ap.add_argument("--frac", type=float, default=0.4)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=2)
    a = ap.parse_args()
    os.makedirs(a.models, exist_ok=True)
    for model in (base_model(a.models), hot_model(a.models, a.scale)):
        size = os.path.getsize(model)
        budget = int(size * a.frac)
        res = bench(model, a.n, a.t, None)
        off = bench(model, a.n, a.t, budget)
        print(f"{os.path.basename(model)}: resident tg {res['tg']:.2f} tok/s, RSS {res['rss_mib']:.0f} "
              f"MiB; --weights-memory {budget / 2**20:.0f} MiB ({a.frac:.0%} of {size / 2**20:.0f}): "
              f"tg {off['tg']:.2f} tok/s ({off['tg'] / res['tg']:.2f}x), slots {off.get('slots')}, "
              f"hit rate {off.get('hit_rate')}%, most used quarter {off.get('hot_share')}% of uses, "
              f"RSS {off['rss_mib']:.0f} MiB (budget + {off['rss_mib'] - budget / 2**20:.0f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
