#!/usr/bin/env python3
"""Markdown tables from bench/sweep.sh's results.jsonl (for docs/PERFORMANCE.md).

    python3 bench/report.py build/bench/results.jsonl
"""
import json
import os
import sys


def load_rows(path: str) -> list:
    """The JSON objects of a results file, one per line (or run together)."""
    text = open(path).read().replace("}{", "}\n{")
    return [json.loads(l) for l in text.splitlines() if l.strip().startswith("{")]


def main(path: str) -> int:
    rows = load_rows(path)
    single = [r for r in rows if "batch" not in r]
    batch = [r for r in rows if "batch" in r]
    print("| model | matmul | MB/token | pp512 tok/s | pp GFLOP/s | tg128 tok/s (min..max) | tg GB/s |"
          " read roofline GB/s (1t / all) | tg % of roofline (all threads) | FMA GFLOP/s (1t / all) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in single:
        rl = r.get("roofline_read_gbps", 0)
        print(f"| {os.path.basename(r['model'])} | {r.get('path', 'exact')} | {r['model_bytes'] / 1e6:.0f} | {r['pp_tps']:.1f} |"
              f" {r['pp_gflops']:.1f} | {r['tg_tps']:.2f} ({r['tg_tps_min']:.2f}..{r['tg_tps_max']:.2f}) |"
              f" {r['tg_gbps']:.2f} | {r.get('roofline_read_gbps_1t', 0):.1f} / {rl:.1f} |"
              f" {100 * r.get('tg_roofline_frac', 0):.0f}% |"
              f" {r.get('roofline_fma_gflops_1t', 0):.0f} / {r.get('roofline_fma_gflops', 0):.0f} |")
    if batch:
        b1 = next((r["decode_tps"] for r in batch if r["batch"] == 1), None)
        print()
        print("| batch | workload | matmul | prefill tok/s | decode tok/s | x batch 1 | TTFT p50/p99 ms |"
              " ITL p50/p99 ms | kv blocks peak | kv waste |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in batch:
            x = f"{r['decode_tps'] / b1:.1f}x" if b1 else "-"
            wl = f"p {r['p']} n {r['n']}" + (" mixed" if r.get("mixed") else "")
            print(f"| {r['batch']} | {wl} | {r.get('path', 'exact')} | {r['prefill_tps']:.1f} |"
                  f" {r['decode_tps']:.1f} | {x} |"
                  f" {r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} |"
                  f" {r['itl_ms_p50']:.1f} / {r['itl_ms_p99']:.1f} | {r['kv_blocks_peak']} |"
                  f" {100 * r['kv_waste']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/bench/results.jsonl"))
