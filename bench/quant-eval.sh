#!/bin/sh
# bench/quant-eval.sh - the quantization quality table of docs/QUANTIZATION.md.
# Usage: bench/quant-eval.sh [KVANT_BIN] [OUTDIR] [CHUNKS]
# Base = the default model's dequantized weights (F32).  Calibration text:
# tests/data/english.txt; evaluation text: tests/data/english-eval.txt
# (22.9k tokens, disjoint from the calibration text); ctx 512, 2 threads.
# One JSON object per configuration in OUTDIR/quant.jsonl.
set -e
BIN=${1:-build/kvant}
OUT=${2:-build/quant}
CHUNKS=${3:-0}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
EVAL=tests/data/english-eval.txt
CALIB=tests/data/english.txt
mkdir -p "$OUT"
rm -f "$OUT/quant.jsonl"
[ -f "$OUT/base-f32.gguf" ] || "$BIN" quantize "$MODEL" "$OUT/base-f32.gguf" --type f32 >/dev/null
"$BIN" quantize "$OUT/base-f32.gguf" "$OUT/q8_0.gguf" --type q8_0 --json > "$OUT/q8_0.json"
"$BIN" quantize "$OUT/base-f32.gguf" "$OUT/q4_0.gguf" --type q4_0 --json > "$OUT/q4_0.json"
"$BIN" quantize "$OUT/base-f32.gguf" "$OUT/q4_0c.gguf" --type q4_0 --calib "$CALIB" -t 2 --json > "$OUT/q4_0c.json"
"$BIN" quantize "$OUT/base-f32.gguf" "$OUT/q4_1.gguf" --type q4_1 --json > "$OUT/q4_1.json"
"$BIN" quantize "$OUT/base-f32.gguf" "$OUT/q4_1c.gguf" --type q4_1 --calib "$CALIB" -t 2 --json > "$OUT/q4_1c.json"
"$BIN" quantize "$OUT/base-f32.gguf" "$OUT/q4km.gguf" --recipe q4_k_m --json > "$OUT/q4km.json"
kl() { # label model [extra args]
    label=$1; m=$2; shift 2
    chunks=""
    [ "$CHUNKS" -gt 0 ] && chunks="--chunks $CHUNKS"
    "$BIN" perplexity -m "$m" --kl-base "$OUT/base-f32.gguf" -f "$EVAL" -c 512 -t 2 $chunks --exact --kv-dtype f32 "$@" --json \
        | sed "s/^{/{\"config\": \"$label\", /" >> "$OUT/quant.jsonl"
    echo >> "$OUT/quant.jsonl"
}
kl "Q8_0 RTN" "$OUT/q8_0.gguf"
kl "Q4_0 RTN" "$OUT/q4_0.gguf"
kl "Q4_0 calibrated" "$OUT/q4_0c.gguf"
kl "Q4_1 RTN" "$OUT/q4_1.gguf"
kl "Q4_1 calibrated" "$OUT/q4_1c.gguf"
kl "q4_k_m recipe" "$OUT/q4km.gguf"
kl "KV q8_0" "$OUT/base-f32.gguf" --kv-dtype q8_0
kl "KV f16" "$OUT/base-f32.gguf" --kv-dtype f16
kl "KV q4_0" "$OUT/base-f32.gguf" --kv-dtype q4_0
kl "weights q8_0 at load" "$OUT/base-f32.gguf" --weights-dtype q8_0
