#!/usr/bin/env bash
# Tensor and pipeline parallelism under AddressSanitizer + UBSan with real
# MPI ranks: BUILD/kvant (built with MPI=1 and the sanitizers, `make asan`)
# runs --tp 2, --pp 2 and --tp 2 --pp 2 forward passes (the last also with
# KVANT_TP_HOST_STAGING=1, the device backends' exchange) and a --tp 2 server
# answering a request.  Fails on any sanitizer error and on any leak whose
# stack holds one of kvant's own frames (src/...); the plain 4-rank run is
# checked for sanitizer errors only (below).  OpenMPI's own one-time
# allocations (its plugins are unloaded before the leak check, so their
# frames have no names) are not kvant's and are reported as a count only.
set -u
build=${1:-build-asan-mpi}
bin="$build/kvant"
model=${KVANT_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
supp="$work/lsan.supp"
printf 'leak:libmpi\nleak:libopen-pal\nleak:libopen-rte\nleak:libhwloc\nleak:libevent\nleak:libpmix\n' > "$supp"
san="-x ASAN_OPTIONS=detect_leaks=1 -x LSAN_OPTIONS=suppressions=$supp:exitcode=0 -x UBSAN_OPTIONS=print_stacktrace=1"
python3 -c "import random; random.seed(3); print(' '.join(str(random.randrange(49152)) for _ in range(40)))" > "$work/ids.txt"
fail=0

check_log() { # name log rc [leaks: 0 when the run had no leak check]
  local name=$1 log=$2 rc=$3 leaks=${4:-1}
  if [ "$rc" -ne 0 ]; then echo "asan-mpi: $name exited $rc"; tail -20 "$log"; fail=1; return; fi
  if grep -q "ERROR: AddressSanitizer\|runtime error:" "$log"; then
    echo "asan-mpi: $name: sanitizer error"; grep -A20 "ERROR: AddressSanitizer\|runtime error:" "$log" | head -60; fail=1; return
  fi
  # a leak with one of kvant's frames: "in fn src/dir/file.c:line" (not the sanitizer's own)
  if python3 - "$log" > "$work/mine.txt" <<'PY'
import re, sys
blocks = re.split(r"\n(?=(?:Direct|Indirect) leak of)", open(sys.argv[1], errors="replace").read())
mine = [b for b in blocks if "leak of" in b and any(
    re.search(r" src/[a-z]+/", l) and "libsanitizer" not in l for l in b.splitlines())]
print("\n\n".join(b[:2000] for b in mine))
sys.exit(0 if mine else 1)
PY
  then
    echo "asan-mpi: $name: kvant leaks memory:"; head -60 "$work/mine.txt"; fail=1; return
  fi
  local other
  if [ "$leaks" -eq 0 ]; then echo "asan-mpi: $name: clean"; return; fi
  other=$(grep -c "leak of" "$log")
  echo "asan-mpi: $name: clean (${other} one-time OpenMPI allocations not freed at exit)"
}

# "4s": the same with the device backends' staged exchange (src/par/tp_dev.c).
# "4n": the plain 4-rank run without the leak check.  On 4 ranks OpenMPI leaves
# ~8,700 allocations of its unloaded plugins; LeakSanitizer re-reads
# /proc/self/maps for each unknown frame, ~50 s of kernel time a run on two
# cores.  The staged 4-rank run keeps the leak check (it runs the same split,
# layers and exchange, plus the staging buffers); the 2-rank runs keep theirs.
for cfg in "2:--tp 2" "2:--pp 2" "4n:--tp 2 --pp 2" "4s:--tp 2 --pp 2"; do
  np=${cfg%%:*}; opts=${cfg#*:}; stg=""; sanx=$san; lab=""; leaks=1
  case $np in
    *s) np=${np%s}; stg="-x KVANT_TP_HOST_STAGING=1"; lab=" (staged)" ;;
    *n) np=${np%n}; sanx=${san/detect_leaks=1/detect_leaks=0}; lab=" (no leak check)"; leaks=0 ;;
  esac
  log="$work/logits-$np${stg:+s}.log"
  # shellcheck disable=SC2086
  timeout 600 mpirun -np "$np" --oversubscribe $sanx $stg "$bin" logits -m "$model" -t 1 -b 16 \
    --tokens-file "$work/ids.txt" --out "$work/l.f32" $opts > "$log" 2>&1
  check_log "logits $opts$lab" "$log" $? "$leaks"
done

# the engine path: a --tp 2 server answers one request, then rank 0 drains on SIGTERM
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log="$work/serve.log"
# shellcheck disable=SC2086
timeout 600 mpirun -np 2 --oversubscribe $san "$bin" serve -m "$model" -t 1 --tp 2 --port "$port" \
  --device-memory 1GiB -c 512 --max-num-seqs 4 --max-num-batched-tokens 256 > "$log" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  kill -0 $job 2>/dev/null || break
  sleep 0.2
done
curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}' > "$work/resp.json"
grep -q '"text"' "$work/resp.json" || { echo "asan-mpi: serve --tp 2 gave no completion"; cat "$work/resp.json"; fail=1; }
for p in $(pgrep -f "$bin serve"); do
  if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0"; then kill -TERM "$p"; fi
done
wait $job
check_log "serve --tp 2" "$log" $?
[ "$fail" -eq 0 ] && echo "asan-mpi: passed"
exit $fail
