#!/bin/sh
# bench/sweep.sh - the measurements behind docs/PERFORMANCE.md.
# Usage: bench/sweep.sh [KVANT_BIN] [OUTDIR]   (models from bench/make_tinyllama.py)
# Writes one JSON line per run to OUTDIR/results.jsonl; each line is tagged
# with the matmul path ("exact" or "act-q8") in the "path" field.
BIN=${1:-build/kvant}
OUT=${2:-build/bench}
REPS=${REPS:-3}
mkdir -p "$OUT"
run() { # path, args...
    path=$1; shift
    "$BIN" bench "$@" --json | sed "s/^{/{\"path\": \"$path\", /" >> "$OUT/results.jsonl"
    echo >> "$OUT/results.jsonl"
}
for t in Q4_0 Q4_1 Q8_0 Q4_K; do
    run exact -m "$OUT/tinyllama-1.1b-$t.gguf" -p 512 -n 128 -r "$REPS" --roofline -t 2
    run act-q8 -m "$OUT/tinyllama-1.1b-$t.gguf" -p 512 -n 128 -r "$REPS" --roofline -t 2 --act-q8
done
run exact -p 512 -n 128 -r 5 --roofline -t 2
run act-q8 -p 512 -n 128 -r 5 --roofline -t 2 --act-q8
for b in 1 8 32 64; do
    run exact -p 128 -n 64 --batch "$b" -t 2
done
run act-q8 -p 128 -n 64 --batch 32 -t 2 --act-q8
run exact -p 256 -n 96 --batch 32 --mixed -t 2
