#!/usr/bin/env bash
# run-fuzz.sh SECONDS - runs each fuzz target for SECONDS (default 60):
# fuzz_gguf on a scratch copy of tests/data/fuzz-seeds, fuzz_tokenizer on a
# few seed texts, fuzz_kvtier (KV disk records) from an empty corpus,
# fuzz_jinja (chat templates) on tests/data/fuzz-seeds-jinja, fuzz_grammar
# (GBNF / JSON Schema / regex / choice; first byte = kind) on
# tests/data/fuzz-seeds-grammar.  Builds nothing: `make fuzz` (which `make fuzz-run` calls
# first) builds them.  Exits non-zero if a target found a crash, leak or
# timeout; reproducers are copied to build-fuzz/crashes/.  KVANT_FUZZ_JOBS
# targets run at once (default 2).
set -u
secs=${1:-60}
status=0
run_target() {
  local name=$1 seeds=$2 maxlen=$3
  local bin=build-fuzz/$name
  if [ ! -x "$bin" ]; then
    echo "run-fuzz: $bin missing; run 'make fuzz' first" >&2
    return 2
  fi
  local work
  work=$(mktemp -d "${TMPDIR:-/tmp}/kvant-fuzz.XXXXXX")
  mkdir -p "$work/corpus" "$work/artifacts"
  if [ -d "$seeds" ]; then cp "$seeds"/* "$work/corpus/" 2>/dev/null; fi
  echo "run-fuzz: $name for ${secs}s, $(ls "$work/corpus" | wc -l) seeds"
  "$bin" "$work/corpus" -max_total_time="$secs" -max_len="$maxlen" -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$work/artifacts/" \
    >"$work/log" 2>&1
  local rc=$?
  tail -n 12 "$work/log"
  if [ $rc -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
    mkdir -p build-fuzz/crashes
    cp "$work/artifacts"/* build-fuzz/crashes/ 2>/dev/null
    echo "run-fuzz: $name FAILED (exit $rc); reproducers in build-fuzz/crashes/" >&2
    rm -rf "$work"
    return 1
  fi
  rm -rf "$work"
  echo "run-fuzz: $name ok, no crash in ${secs}s"
}
# Two targets at a time (a machine has at least two cores; each target is one
# process): each writes its own log, printed whole once it ends, in order.
jobs=${KVANT_FUZZ_JOBS:-2}
logs=$(mktemp -d "${TMPDIR:-/tmp}/kvant-fuzz-logs.XXXXXX")
targets=(
  "fuzz_gguf tests/data/fuzz-seeds 65536"
  "fuzz_tokenizer tests/data/fuzz-seeds-text 4096"
  "fuzz_kvtier none 1024"
  "fuzz_jinja tests/data/fuzz-seeds-jinja 16384"
  "fuzz_grammar tests/data/fuzz-seeds-grammar 8192"
)
pids=()
for i in "${!targets[@]}"; do
  # shellcheck disable=SC2086
  run_target ${targets[$i]} >"$logs/$i" 2>&1 &
  pids[$i]=$!
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
done
for i in "${!targets[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "$logs/$i"
done
rm -rf "$logs"
exit $status
