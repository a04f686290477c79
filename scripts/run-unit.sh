#!/usr/bin/env bash
# Runs every unit test binary in BUILD/tests.  Exit code 0 = pass,
# 77 = skipped (reported as skipped with the test's reason, never as passed),
# anything else = fail.  KVANT_TEST_RUNNER, when set, prefixes each binary
# (e.g. "qemu-aarch64 -L /usr/aarch64-linux-gnu" for a cross build);
# KVANT_ISA passes through to the tests (kernels/dtype.h).  KVANT_TEST_TIMEOUT
# (seconds), when set, fails a test that runs longer (a hang under emulation
# fails the run instead of stalling it).
set -u
runner=${KVANT_TEST_RUNNER:-}
label=${KVANT_ISA:+ (KVANT_ISA=$KVANT_ISA)}
build=${1:-build}
fail=0; n=0; skip=0
for t in "$build"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$((n+1))
  ${KVANT_TEST_TIMEOUT:+timeout "$KVANT_TEST_TIMEOUT"} $runner "$t"; rc=$?
  if [ "$rc" -eq 124 ] && [ -n "${KVANT_TEST_TIMEOUT:-}" ]; then
    echo "TIMEOUT: $t ran past ${KVANT_TEST_TIMEOUT}s"
  fi
  if [ "$rc" -eq 77 ]; then skip=$((skip+1)); echo "SKIPPED: $t"
  elif [ "$rc" -ne 0 ]; then echo "FAILED: $t"; fail=$((fail+1)); fi
done
if [ "$n" -eq 0 ]; then echo "no unit tests found"; exit 1; fi
echo "unit tests$label: $n run, $((n-fail-skip)) passed, $skip skipped, $fail failed"
[ "$fail" -eq 0 ]
