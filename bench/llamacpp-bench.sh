#!/bin/sh
# bench/llamacpp-bench.sh LLAMA_BENCH [OUTDIR] - runs an existing llama-bench
# binary (built by you, outside this repository) on the same GGUF files and
# thread count as bench/sweep.sh, for the side-by-side table in
# docs/PERFORMANCE.md.  Writes OUTDIR/llamacpp.jsonl.
LB=${1:?usage: bench/llamacpp-bench.sh path/to/llama-bench [OUTDIR]}
OUT=${2:-build/bench}
REPS=${REPS:-3}
: > "$OUT/llamacpp.jsonl"
for m in "$OUT"/tinyllama-1.1b-Q4_0.gguf "$OUT"/tinyllama-1.1b-Q4_1.gguf \
         "$OUT"/tinyllama-1.1b-Q8_0.gguf "$OUT"/tinyllama-1.1b-Q4_K.gguf \
         models/SmolLM2-135M-Instruct.Q4_1.gguf; do
    "$LB" -m "$m" -p 512 -n 128 -r "$REPS" -t 2 -o jsonl >> "$OUT/llamacpp.jsonl" 2>/dev/null
done
