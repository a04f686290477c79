#!/usr/bin/env bash
# run-fuzz.sh SECONDS - runs the GGUF fuzz target for SECONDS (default 60)
# on a scratch copy of tests/data/fuzz-seeds.  Builds nothing: `make fuzz`
# (which `make fuzz-run` calls first) builds build-fuzz/fuzz_gguf.
# Exits non-zero if the fuzzer found a crash, leak or timeout; the
# reproducer is copied to build-fuzz/crashes/.
set -u
secs=${1:-60}
bin=build-fuzz/fuzz_gguf
seeds=tests/data/fuzz-seeds
if [ ! -x "$bin" ]; then
  echo "run-fuzz: $bin missing; run 'make fuzz' first" >&2
  exit 2
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/kvant-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$work/artifacts"
if [ -d "$seeds" ]; then cp "$seeds"/* "$work/corpus/" 2>/dev/null; fi
echo "run-fuzz: $bin for ${secs}s, $(ls "$work/corpus" | wc -l) seeds"
"$bin" "$work/corpus" -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
  >"$work/log" 2>&1
rc=$?
tail -n 25 "$work/log"
if [ $rc -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
  mkdir -p build-fuzz/crashes
  cp "$work/artifacts"/* build-fuzz/crashes/ 2>/dev/null
  echo "run-fuzz: FAILED (exit $rc); reproducers in build-fuzz/crashes/:" >&2
  ls build-fuzz/crashes >&2
  exit 1
fi
echo "run-fuzz: ok, no crash in ${secs}s"
