#!/usr/bin/env bash
# Runs every BUILD_DIR/benchmarks/*/bench_* twice: with the environment as it is, and with
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset. Usage: scripts/run_benchmarks.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: run_benchmarks.sh BUILD_DIR}

benches=()
for f in "$build"/benchmarks/*/bench_*; do
  [[ -f "$f" && -x "$f" ]] && benches+=("$f")
done
if [[ ${#benches[@]} -eq 0 ]]; then
  echo "run_benchmarks: no executables match $build/benchmarks/*/bench_*" >&2
  exit 1
fi

status=0
run_all() {
  for bench in "${benches[@]}"; do
    echo "--- $bench"
    "$@" "$bench" || { echo "run_benchmarks: $bench failed (exit $?)" >&2; status=1; }
  done
}

echo "=== benchmarks, environment as it is:" \
  "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE-(unset)} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE-(unset)}"
run_all env
echo "=== benchmarks, OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset"
run_all env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE
exit "$status"
