#!/usr/bin/env python3
"""Markdown table from bench/isa-compare.sh's isa-compare.jsonl: kvant and
llama.cpp per ISA and model, and the batched rows (for docs/PERFORMANCE.md).

    python3 bench/isa-report.py OUTDIR/isa-compare.jsonl
"""
import importlib.util
import os
import sys

_spec = importlib.util.spec_from_file_location(
    "report", os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.py"))
_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_report)


def main(path: str) -> int:
    rs = _report.load_rows(path)
    kv = {(r["isa"], os.path.basename(r["model"])): r
          for r in rs if "tool" not in r and "batch" not in r}
    lc = {}
    for r in rs:
        if r.get("tool") == "llama.cpp":
            key = (r["isa"], os.path.basename(r["model_filename"]))
            lc.setdefault(key, {})["pp" if r["n_prompt"] else "tg"] = r["avg_ts"]
    print("| ISA | model | kvant pp512 | llama.cpp pp512 | ratio | kvant tg128 | llama.cpp tg128 |"
          " ratio | kvant tg GB/s | read roofline GB/s | tg % of roofline |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (isa, m), r in kv.items():
        l = lc.get((isa, m), {})
        lpp, ltg = l.get("pp"), l.get("tg")
        f = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
        g = lambda v: f"{v:.1f}" if v else "-"
        print(f"| {isa} | {m} | {r['pp_tps']:.1f} | {g(lpp)} | {f(r['pp_tps'], lpp)} |"
              f" {r['tg_tps']:.1f} | {g(ltg)} | {f(r['tg_tps'], ltg)} | {r['tg_gbps']:.1f} |"
              f" {r.get('roofline_read_gbps', 0):.1f} | {100 * r.get('tg_roofline_frac', 0):.0f}% |")
    print()
    print("| ISA | tool | batch 32 decode tok/s (aggregate) | single stream | x single |")
    print("|---|---|---|---|---|")
    for r in rs:
        if "batch" in r and "tool" not in r:
            one = kv.get((r["isa"], "SmolLM2-135M-Instruct.Q4_1.gguf"), {}).get("tg_tps")
            x = f"{r['decode_tps'] / one:.1f}x" if one else "-"
            print(f"| {r['isa']} | kvant | {r['decode_tps']:.1f} | {one or '-'} | {x} |")
        if r.get("tool") == "llama-batched-bench" and r.get("pl") in (1, 32):
            print(f"| {r['isa']} | llama-batched-bench (npl {r['pl']}) | {r.get('speed_tg', 0):.1f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
