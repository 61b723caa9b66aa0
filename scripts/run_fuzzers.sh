#!/usr/bin/env bash
# Runs every libFuzzer target built in BUILD_DIR/tests/fuzz (fuzz_<name>) for SECONDS each, seeded
# from tests/fuzz/corpus/<name>; inputs it finds go to BUILD_DIR/fuzz-corpus/<name>, crashes to
# BUILD_DIR/fuzz-findings/<name>/. Prints one line per target with the executions it reached.
# Usage: scripts/run_fuzzers.sh BUILD_DIR [SECONDS] [EXTRA LIBFUZZER FLAGS...]
set -euo pipefail

build=${1:?usage: scripts/run_fuzzers.sh BUILD_DIR [SECONDS] [FLAGS...]}
seconds=${2:-30}
shift $(( $# >= 2 ? 2 : 1 ))
root=$(cd "$(dirname "$0")/.." && pwd)

shopt -s nullglob
targets=("$build"/tests/fuzz/fuzz_*)
if [[ ${#targets[@]} -eq 0 ]]; then
  echo "run_fuzzers: no fuzz_* executables in $build/tests/fuzz; configure with -Dfuzz=enabled (make fuzz)" >&2
  exit 1
fi

# ASan: a leak or an error is a finding; UBSan: stop at the first report instead of printing on.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=0
for target in "${targets[@]}"; do
  [[ -x $target && -f $target ]] || continue
  name=$(basename "$target")
  name=${name#fuzz_}
  seeds=$root/tests/fuzz/corpus/$name
  corpus=$build/fuzz-corpus/$name
  findings=$build/fuzz-findings/$name
  log=$build/fuzz-logs/$name.log
  mkdir -p "$corpus" "$findings" "$(dirname "$log")"
  # libFuzzer adds what it finds to the first folder only, so the committed seeds stay as they are.
  folders=("$corpus")
  if [[ -d $seeds ]]; then folders+=("$seeds"); else echo "run_fuzzers: warning: no seeds in $seeds" >&2; fi
  status=0
  "$target" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/" "$@" "${folders[@]}" \
    >"$log" 2>&1 || status=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  if [[ $status -eq 0 ]]; then
    echo "fuzz $name: ${runs:-?} executions in ${seconds} s, no finding"
  else
    failed=1
    echo "fuzz $name: FINDING (exit $status) after ${runs:-?} executions; log $log, inputs in $findings" >&2
    grep -m 5 -E 'ERROR|runtime error|SUMMARY|deadly signal|leak' "$log" >&2 || true
  fi
done
exit $failed
