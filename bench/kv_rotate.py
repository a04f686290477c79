#!/usr/bin/env python3
"""Rotated 4-bit KV (--kv-rotate): perplexity, KL and decode speed per KV type.

For f16, q8_0, q8_0 + rotate, q4_0 and q4_0 + rotate KV on one model:
  * perplexity of tests/data/english-eval.txt (`kvant perplexity`, chunks of --ctx tokens,
    llama-perplexity's convention);
  * mean KL(f16 KV || this KV) and top-1 agreement of the next-token distributions over the
    first --kl-tokens tokens of the same text (`kvant logits`, one pass of them);
  * decode tok/s (`kvant bench -p 512 -n 128`), in alternating rounds, median of --rounds.
The perplexity increase of q4_0 + rotate over f16 against plain q4_0's is the issue's
target (at most half).

usage: bench/kv_rotate.py [-m MODEL] [--ctx 512] [--kl-tokens 1024] [--rounds 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests/data/english-eval.txt"
CONFIGS = {"f16": ["--kv-dtype", "f16"], "q8_0": ["--kv-dtype", "q8_0"],
           "q8_0+rotate": ["--kv-dtype", "q8_0", "--kv-rotate"],
           "q4_0": ["--kv-dtype", "q4_0"], "q4_0+rotate": ["--kv-dtype", "q4_0", "--kv-rotate"]}


def run(cmd: list[str]) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return p.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--kvant", default="build/kvant")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--kl-tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="2")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    base = [a.kvant]
    common = ["-m", a.model, "-t", a.threads]
    ids = json.loads(run(base + ["tokenize", "-m", a.model, "-p", TEXT.read_text(), "--json"]))
    ids = [t["id"] if isinstance(t, dict) else t for t in
           (ids if isinstance(ids, list) else ids["tokens"])][:a.kl_tokens]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tok = Path(tmp) / "ids.txt"
        tok.write_text(" ".join(map(str, ids)))
        logits = {}
        for name, extra in CONFIGS.items():
            ppl = json.loads(run(base + ["perplexity", *common, "-f", str(TEXT), "-c",
                                         str(a.ctx), "--json", *extra]))["ppl"]
            out = Path(tmp) / f"{name}.bin"
            run(base + ["logits", *common, "--tokens-file", str(tok), "--out", str(out),
                        "-b", str(len(ids)), *extra])
            logits[name] = np.fromfile(out, np.float32).reshape(len(ids), -1).astype(np.float64)
            rows[name] = {"ppl": ppl}
        ref = logits["f16"]
        lp_ref = ref - np.log(np.exp(ref - ref.max(1, keepdims=True)).sum(1, keepdims=True)) \
            - ref.max(1, keepdims=True)
        for name, lg in logits.items():
            lp = lg - np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1, keepdims=True)) \
                - lg.max(1, keepdims=True)
            rows[name]["kl"] = float((np.exp(lp_ref) * (lp_ref - lp)).sum(1).mean())
            rows[name]["top1"] = float((ref.argmax(1) == lg.argmax(1)).mean())
        tg = {n: [] for n in CONFIGS}
        for _ in range(a.rounds):  # alternating
            for name, extra in CONFIGS.items():
                r = json.loads(run(base + ["bench", *common, "-p", "512", "-n", "128", "-r", "1",
                                           "--json", *extra]))
                tg[name].append(r["tg_tps"] if "tg_tps" in r else r["tg"]["tok_s"])
        for name in CONFIGS:
            rows[name]["tg_tps"] = statistics.median(tg[name])
    f16 = rows["f16"]["ppl"]
    for r in rows.values():
        r["ppl_increase"] = r["ppl"] / f16 - 1
    inc_plain, inc_rot = rows["q4_0"]["ppl_increase"], rows["q4_0+rotate"]["ppl_increase"]
    isa = run([a.kvant, "--isa"]).strip()
    out = {"model": a.model, "ctx": a.ctx, "kl_tokens": len(ids), "isa": isa, "rows": rows,
           "rotated_increase_share": inc_rot / inc_plain if inc_plain > 0 else None,
           "rotated_tg_ratio": rows["q4_0+rotate"]["tg_tps"] / rows["q4_0"]["tg_tps"]}
    if a.json:
        print(json.dumps(out, indent=1))
        return
    print(f"{a.model}, isa {isa}, ppl over {TEXT.name} (ctx {a.ctx}), KL over {len(ids)} tokens")
    print("kv            ppl   +ppl    KL(f16||kv)  top-1   tg tok/s")
    for name, r in rows.items():
        print(f"{name:12} {r['ppl']:6.3f} {100 * r['ppl_increase']:+6.2f}%  {r['kl']:.5f}"
              f"     {r['top1']:.4f}  {r['tg_tps']:.1f}")
    print(f"rotated q4_0's increase is {out['rotated_increase_share']:.2f} of plain q4_0's; "
          f"decode {out['rotated_tg_ratio']:.3f}x plain q4_0")


if __name__ == "__main__":
    main()
