#!/usr/bin/env bash
# `make bench`'s op rows through flowlet-bench: matmul, elementwise, reductions, softmax, and the
# convolution and pooling shapes of issue 15 once those ops are registered. Each run's JSON goes to
# OUT_DIR/<name>.json (Google Benchmark's format: tools/compare.py reads it).
# Usage: tools/flowlet_bench/op_benchmarks.sh BUILD_DIR [OUT_DIR]
set -uo pipefail
build=${1:?usage: op_benchmarks.sh BUILD_DIR [OUT_DIR]}
out=${2:-$build/flowlet-bench}
bench=$build/tools/flowlet_bench/flowlet-bench
if [[ ! -x "$bench" ]]; then
  echo "op_benchmarks: $bench not built (libbenchmark-dev missing?)" >&2
  exit 1
fi
mkdir -p "$out"
status=0
run() {
  local name=$1
  shift
  echo "--- flowlet-bench $*"
  "$bench" "$@" --benchmark_out="$out/$name.json" --benchmark_out_format=json || status=1
}
has_op() { "$bench" --list | grep -Eq "^$1 +[a-z0-9,]*f32"; }

run matmul matmul --shapes NxN,NxN --sweep 128:1024:x2
run add add --shapes N,N --sweep 65536:16777216:x16
run exp exp --shapes N --sweep 65536:16777216:x16
run sum sum --shapes 1024x4096 --attr axes=1
run softmax softmax --shapes 512x1024
# ResNet-like convolutions (issue 15): 3x3 with padding 1, and a 1x1.
if has_op conv2d; then
  run conv2d_3x3 conv2d --shapes "32x64x56x56,64x64x3x3;32x128x28x28,128x128x3x3" --attr padding=1
  run conv2d_1x1 conv2d --shapes 32x256x14x14,256x256x1x1
fi
if has_op max_pool2d; then run max_pool2d max_pool2d --shapes 32x64x56x56 --attr kernel=2; fi
if has_op avg_pool2d; then run avg_pool2d avg_pool2d --shapes 32x64x56x56 --attr kernel=2; fi
echo "op_benchmarks: JSON in $out"
exit "$status"
