#!/usr/bin/env bash
# prune_table.sh - the memory-vs-quality table of docs/PRUNING.md.
#
# For each configuration: `kvant prune` (calibration on CALIB), then
# `kvant perplexity --kl-base` against the unpruned model on EVAL (disjoint
# from CALIB) and `kvant bench` decode speed.  One JSON object per line on
# stdout: {"name", "args", "prune": {...}, "kl": {...}, "tg_tps", "isa"}.
#
#   scripts/prune_table.sh [MODEL] > build/prune_table.jsonl
# Environment: KVANT (build/kvant), CALIB (tests/data/english.txt), EVAL
# (tests/data/english-eval.txt), CHUNKS (8 chunks of 512 tokens), THREADS
# (2), OUT (a temporary folder for the pruned files), CONFIGS (names below).
set -euo pipefail
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
KVANT=${KVANT:-build/kvant}
CALIB=${CALIB:-tests/data/english.txt}
EVAL=${EVAL:-tests/data/english-eval.txt}
CHUNKS=${CHUNKS:-8}
THREADS=${THREADS:-2}
OUT=${OUT:-$(mktemp -d)}

declare -A CFG=(
  [depth-10]="--drop-layers 3"
  [depth-t90]="--target-params 0.9 --method depth"
  [depth-t80]="--target-params 0.8 --method depth"
  [depth-t70]="--target-params 0.7 --method depth"
  [width-t90]="--target-params 0.9 --method width"
  [width-t80]="--target-params 0.8 --method width"
  [width-t70]="--target-params 0.7 --method width"
  [width-t80-uniform]="--target-params 0.8 --method width --ffn-uniform"
  [both-t90]="--target-params 0.9 --method both"
  [both-t80]="--target-params 0.8 --method both"
  [both-t70]="--target-params 0.7 --method both"
  [heads-2of3]="--heads-keep 0.67"
  [width-t90-refit]="--target-params 0.9 --method width --refit"
  [width-t80-refit]="--target-params 0.8 --method width --refit"
  [width-t76-refit]="--target-params 0.76 --method width --refit"
  [width-t70-refit]="--target-params 0.7 --method width --refit"
  [both-t80-refit]="--target-params 0.8 --method both --refit"
  [heads-2of3-refit]="--heads-keep 0.67 --refit"
  [heads-2of3-uniform]="--heads-keep 0.67 --heads-uniform"
  [heads-2of3-uniform-refit]="--heads-keep 0.67 --heads-uniform --refit"
  [heads-80]="--heads-keep 0.8"
  [heads-80-refit]="--heads-keep 0.8 --refit"
  [heads-90-refit]="--heads-keep 0.9 --refit"
  [heads-80+ffn70-refit]="--heads-keep 0.8 --ffn-keep 0.7 --refit"
  [heads-80+ffn66-refit]="--heads-keep 0.8 --ffn-keep 0.66 --refit"
)
CONFIGS=${CONFIGS:-"depth-10 depth-t90 depth-t80 depth-t70 width-t90 width-t80 width-t70 width-t80-uniform both-t90 both-t80 both-t70 heads-2of3 width-t90-refit width-t80-refit width-t76-refit width-t70-refit both-t80-refit heads-2of3-refit heads-2of3-uniform heads-80 heads-80-refit heads-90-refit heads-2of3-uniform-refit heads-80+ffn70-refit heads-80+ffn66-refit"}

measure() { # name file prune_json args
  local kl tg
  kl=$("$KVANT" perplexity -m "$2" --kl-base "$MODEL" -f "$EVAL" --chunks "$CHUNKS" \
       -t "$THREADS" --json 2>/dev/null | tail -1)
  tg=$("$KVANT" bench -m "$2" -p 16 -n 64 -r 3 -t "$THREADS" --json 2>/dev/null | tail -1)
  printf '{"name": "%s", "args": "%s", "prune": %s, "kl": %s, "bench": %s}\n' \
    "$1" "$4" "$3" "$kl" "$tg"
}

tg=$("$KVANT" bench -m "$MODEL" -p 16 -n 64 -r 3 -t "$THREADS" --json 2>/dev/null | tail -1)
printf '{"name": "base", "bench": %s}\n' "$tg"
for name in $CONFIGS; do
  args=${CFG[$name]}
  # shellcheck disable=SC2086
  pj=$("$KVANT" prune "$MODEL" "$OUT/$name.gguf" --calib "$CALIB" -t "$THREADS" --json $args \
       2>/dev/null | tail -1)
  measure "$name" "$OUT/$name.gguf" "$pj" "$args"
  if [ "$name" = "${QUANT_AFTER:-width-t80}" ]; then
    # prune, then quantize the pruned model (calibrated q4_0)
    "$KVANT" quantize "$OUT/$name.gguf" "$OUT/$name.q4_0.gguf" --type q4_0 --calib "$CALIB" \
      -t "$THREADS" --json >/dev/null 2>&1
    measure "$name+q4_0" "$OUT/$name.q4_0.gguf" "$pj" "$args; quantize --type q4_0 --calib"
  fi
  rm -f "$OUT/$name.gguf" "$OUT/$name.q4_0.gguf"
done
