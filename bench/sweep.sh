#!/bin/sh
# bench/sweep.sh - the measurements behind docs/PERFORMANCE.md.
# Usage: bench/sweep.sh [KVANT_BIN] [OUTDIR]   (models from bench/make_tinyllama.py)
# Writes one JSON line per run to OUTDIR/results.jsonl.
BIN=${1:-build/kvant}
OUT=${2:-build/bench}
REPS=${REPS:-2}
mkdir -p "$OUT"
for t in Q4_0 Q4_1 Q8_0 Q4_K; do
    "$BIN" bench -m "$OUT/tinyllama-1.1b-$t.gguf" -p 512 -n 128 -r "$REPS" --roofline --json \
        >> "$OUT/results.jsonl"
done
"$BIN" bench -p 512 -n 128 -r 5 --roofline --json >> "$OUT/results.jsonl"
for b in 1 8 32 64; do
    "$BIN" bench -p 128 -n 64 --batch "$b" --json >> "$OUT/results.jsonl"
done
