#!/bin/sh
# bench/isa-compare.sh - kvant against llama.cpp on each x86 ISA, in one
# session, on the same files and thread count, runs interleaved so both
# see the same machine noise.  The rows of docs/PERFORMANCE.md's ISA table.
#
# Usage: bench/isa-compare.sh OUTDIR ISA=LLAMA_BENCH_DIR [ISA=DIR ...]
#   ISA: avx2 | avx512 (kvant runs with KVANT_ISA=ISA; skipped when the CPU
#   lacks it); DIR: a llama.cpp build for that ISA made outside this
#   repository, holding llama-bench and llama-batched-bench.
# Models: OUTDIR/tinyllama-1.1b-{Q4_0,Q8_0}.gguf (bench/make_tinyllama.py)
# and the default model.  Writes OUTDIR/isa-compare.jsonl: kvant lines are
# `kvant bench --json` tagged with "isa"; llama.cpp lines are llama-bench's
# jsonl tagged with "isa" and "tool": "llama.cpp".
BIN=${KVANT_BIN:-build/kvant}
OUT=${1:?usage: bench/isa-compare.sh OUTDIR ISA=LLAMA_DIR ...}
shift
REPS=${REPS:-3}
T=${THREADS:-2}
J="$OUT/isa-compare.jsonl"
: > "$J"
for spec in "$@"; do
    isa=${spec%%=*}
    lc=${spec#*=}
    if ! KVANT_ISA=$isa "$BIN" --help >/dev/null 2>&1; then
        echo "isa-compare: this CPU lacks $isa: skipped"
        continue
    fi
    for m in "$OUT/tinyllama-1.1b-Q4_0.gguf" "$OUT/tinyllama-1.1b-Q8_0.gguf" \
             models/SmolLM2-135M-Instruct.Q4_1.gguf; do
        KVANT_ISA=$isa "$BIN" bench -m "$m" -p 512 -n 128 -r "$REPS" -t "$T" --roofline --json |
            sed "s/^{/{\"isa\": \"$isa\", /" >> "$J"
        echo >> "$J"
        "$lc/llama-bench" -m "$m" -p 512 -n 128 -r "$REPS" -t "$T" -o jsonl 2>/dev/null |
            sed "s/^{/{\"isa\": \"$isa\", \"tool\": \"llama.cpp\", /" >> "$J"
    done
    # 32 concurrent sequences, prompt 128, 64 generated each
    KVANT_ISA=$isa "$BIN" bench -p 128 -n 64 --batch 32 -t "$T" --json |
        sed "s/^{/{\"isa\": \"$isa\", /" >> "$J"
    echo >> "$J"
    "$lc/llama-batched-bench" -m models/SmolLM2-135M-Instruct.Q4_1.gguf -c 8192 -b 2048 \
        -ub 512 -npp 128 -ntg 64 -npl 1,32 -t "$T" --output-format jsonl 2>/dev/null |
        sed "s/^{/{\"isa\": \"$isa\", \"tool\": \"llama-batched-bench\", /" >> "$J"
done
echo "isa-compare: wrote $J"
