#!/usr/bin/env bash
# The GPU check, run on the machine with the GPU (the device tool), in one go and within 8 minutes:
#   1. unpack the carried Debian packages (benchmarks/gpu/fetch_debs.sh, run beforehand on the
#      development machine) into a folder of their own, never into /;
#   2. configure and build flowlet with -Dcuda=enabled against that folder (test_cuda, bench_gpu);
#   3. run test_cuda, test_cuda_copy, test_cuda_graph, test_cuda_conv, the GPU benchmarks and their
#      PyTorch peers (torch_peer.py, torch_peer_conv.py, which prints conv2d's ratios);
#   4. with NCCL: the communicator's GPU test case and bench_nccl_all_reduce (plain and mpirun -np 1);
#   5. write a short report, REPORT.md, and every log under $OUT.
# Each step logs and carries on after a failure, so one run says as much as it can.
#
# Usage (device tool): carry build/gpu-debs, then
#   bash benchmarks/gpu/check.sh
# Locally, OUT defaults to build/gpu-out. FLOWLET_GPU_QUICK=1 shortens the benchmarks;
# FLOWLET_GPU_CONFIGURE_ONLY=1 stops after configuring (to try the script on a machine without a GPU);
# FLOWLET_GPU_CONV_ONLY=1 builds and runs issue 15's steps only (test_cuda_conv, bench_gpu_conv and
# its PyTorch peer), for a short device budget.
set -uo pipefail
set -x

root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$root/build/gpu-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/check.log") 2>&1
started=$(date +%s)
conv_only=${FLOWLET_GPU_CONV_ONLY:-}
elapsed() { echo $(( $(date +%s) - started )); }
report="$OUT/REPORT.md"
: > "$report"
note() { echo "$*" >> "$report"; }
# Runs "$@" with a time limit, its output in $OUT/<name>.log; notes the status in the report.
step() {
  local name=$1 limit=$2
  shift 2
  local t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  note "- $name: exit $status after $(( $(date +%s) - t0 )) s (log: $name.log)"
  return $status
}

note "# flowlet GPU check"
note ""
note "started $(date -u +%FT%TZ) on $(hostname)"
export PATH=/usr/local/cuda/bin:$PATH
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
{
  echo "nvcc: $(nvcc --version 2>&1 | tail -n 2 | head -n 1)"
  echo "c++: $(c++ --version 2>&1 | head -n 1)"
  echo "meson: $(meson --version 2>&1)"
  echo "ninja: $(ninja --version 2>&1)"
  echo "python: $(python3 --version 2>&1)"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -n 1)"
  echo "cores: $(nproc)"
} > "$OUT/machine.txt"
note '```'
cat "$OUT/machine.txt" >> "$report"
note '```'
note ""
note "## steps"

# 1. The Debian packages, unpacked into a sysroot of their own.
debs=$root/build/gpu-debs
sysroot=$root/build/gpu-sysroot
rm -rf "$sysroot"
mkdir -p "$sysroot"
unpack_deb() {  # dpkg -x, or (no dpkg) ar + tar, or (neither) Python
  if command -v dpkg > /dev/null; then
    dpkg -x "$1" "$sysroot"
  else
    python3 - "$1" "$sysroot" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
data = open(deb, "rb").read()
assert data[:8] == b"!<arch>\n", deb
pos = 8
while pos < len(data):
    name = data[pos:pos + 16].decode().strip().rstrip("/")
    size = int(data[pos + 48:pos + 58].decode().strip())
    body = data[pos + 60:pos + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(dest)
    pos += 60 + size + (size % 2)
PY
  fi
}
unpacked=0
for deb in "$debs"/*.deb; do
  [[ -e $deb ]] || break
  unpack_deb "$deb" && unpacked=$((unpacked + 1))
done
note "- unpacked $unpacked .deb files from build/gpu-debs into build/gpu-sysroot"
if (( unpacked == 0 )); then
  note "  no .deb files: run benchmarks/gpu/fetch_debs.sh on the development machine and carry build/gpu-debs"
fi

multiarch=$sysroot/usr/lib/x86_64-linux-gnu
# pkg-config reads the packages' .pc files (their paths start at /usr: the sysroot prefixes them).
export PKG_CONFIG_SYSROOT_DIR=$sysroot
export PKG_CONFIG_LIBDIR=$multiarch/pkgconfig:$multiarch/openblas-pthread/pkgconfig:$sysroot/usr/share/pkgconfig:$sysroot/usr/lib/pkgconfig
if ! command -v pkg-config > /dev/null; then
  export PKG_CONFIG=$sysroot/usr/bin/pkgconf
  export LD_LIBRARY_PATH=$multiarch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "- no pkg-config on this machine: using the carried pkgconf"
fi
# Run time: fmt, OpenBLAS (its alternatives symlinks are not set up by dpkg -x), gfortran.
export LD_LIBRARY_PATH=$multiarch:$multiarch/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# doctest ships no .pc file; the build then looks for its header on the include path.
export CPATH=$sysroot/usr/include${CPATH:+:$CPATH}
export LIBRARY_PATH=$multiarch:$multiarch/openblas-pthread${LIBRARY_PATH:+:$LIBRARY_PATH}
${PKG_CONFIG:-pkg-config} --cflags --libs fmt openblas xtensor zlib > "$OUT/pkg-config.txt" 2>&1 || true

# cuDNN (issue 15's convolutions): the CUDA toolkit's own when it has one, else the nvidia-cudnn
# wheel of this machine's PyTorch. A wheel ships libcudnn.so.9 without the unversioned link the
# linker looks for, so build/gpu-cudnn gets links to its headers and libraries, passed as -Dcudnn_dir.
cudnn_args=()
if ls /usr/local/cuda/lib64/libcudnn.so > /dev/null 2>&1 || ls /usr/local/cuda/targets/x86_64-linux/lib/libcudnn.so > /dev/null 2>&1; then
  note "- cuDNN: the CUDA toolkit's ($(ls /usr/local/cuda/include/cudnn_version.h 2>/dev/null || echo 'no cudnn_version.h'))"
else
  wheel=$(python3 -c "import nvidia.cudnn, os; print(os.path.dirname(nvidia.cudnn.__file__) if nvidia.cudnn.__file__ else list(nvidia.cudnn.__path__)[0])" 2>/dev/null)
  if [[ -n $wheel && -e $wheel/include/cudnn.h ]]; then
    cudnn=$root/build/gpu-cudnn
    rm -rf "$cudnn"
    mkdir -p "$cudnn/lib"
    ln -s "$wheel/include" "$cudnn/include"
    for lib in "$wheel"/lib/libcudnn*.so*; do
      ln -s "$lib" "$cudnn/lib/$(basename "$lib")"
    done
    [[ -e $cudnn/lib/libcudnn.so ]] || ln -s "$(ls "$wheel"/lib/libcudnn.so.* | head -n 1)" "$cudnn/lib/libcudnn.so"
    export LD_LIBRARY_PATH=$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    cudnn_args=(-Dcudnn_dir="$cudnn")
    note "- cuDNN: PyTorch's wheel at $wheel ($(grep -E '^#define CUDNN_(MAJOR|MINOR|PATCHLEVEL)' "$wheel/include/cudnn_version.h" | awk '{print $3}' | paste -sd.))"
  else
    note "- cuDNN: none found (no libcudnn.so under /usr/local/cuda, no nvidia.cudnn Python package); the configure step will say so"
  fi
fi

# 2. Configure and build (only what the check runs).
build=$root/build/gpu
rm -rf "$build"
if step configure 40 meson setup "$build" "$root" -Dcuda=enabled -Dbenchmarks=enabled -Dnative=true \
    --buildtype=release "${cudnn_args[@]}"; then
  if [[ -n ${FLOWLET_GPU_CONFIGURE_ONLY:-} ]]; then
    note "- stopped after configuring (FLOWLET_GPU_CONFIGURE_ONLY)"
    cat "$report"
    exit 0
  fi
  jobs=$(nproc)
  if [[ -n $conv_only ]]; then
    step build 180 ninja -C "$build" -j "$jobs" tests/test_cuda_conv benchmarks/gpu/bench_gpu_conv
  else
    step build 180 ninja -C "$build" -j "$jobs" tests/test_cuda tests/test_cuda_copy tests/test_cuda_graph \
      tests/test_cuda_conv benchmarks/gpu/bench_gpu benchmarks/gpu/bench_gpu_conv
  fi
  built=$?
else
  built=1
  tail -n 40 "$OUT/configure.log" >> "$report"
fi
if (( built != 0 )) && [[ -f $OUT/build.log ]]; then
  note '```'
  grep -E "error|Error" "$OUT/build.log" | head -n 20 >> "$report"
  note '```'
fi

# 3. Tests, the benchmark, the PyTorch peer.
# Limits keep the whole check within 8 minutes of device time even when every step runs long.
for check in test_cuda:60 test_cuda_copy:40 test_cuda_graph:20; do
  [[ -n $conv_only ]] && break  # FLOWLET_GPU_CONV_ONLY: issue 15 only
  name=${check%%:*}
  if [[ -x $build/tests/$name ]]; then
    step "$name" "${check##*:}" "$build/tests/$name" --duration=true
    note '```'
    grep -E "test cases:|assertions:|ERROR|FATAL|CHECK" "$OUT/$name.log" | head -n 30 >> "$report"
    note '```'
  fi
done
# Issue 15: the GPU table of convolutions, pooling, normalization and dropout. On failure the
# report gets each failing check with its context (op, case, dtype) and the values that differ.
if [[ -x $build/tests/test_cuda_conv ]]; then
  step test_cuda_conv 90 "$build/tests/test_cuda_conv" --duration=true
  note '```'
  grep -E "test cases:|assertions:|skipped" "$OUT/test_cuda_conv.log" | head -n 5 >> "$report"
  grep -E -A8 "ERROR|FATAL" "$OUT/test_cuda_conv.log" | grep -vE "^(--|=+)$" | cut -c1-400 | head -n 60 >> "$report"
  note '```'
fi
if [[ -z $conv_only && -x $build/benchmarks/gpu/bench_gpu ]]; then
  step bench_gpu 80 "$build/benchmarks/gpu/bench_gpu"
  note '```'
  grep -E "^(gemm|add|copy|eager|traced|mlp|note|error)" "$OUT/bench_gpu.log" >> "$report"
  note '```'
fi
if [[ -n $conv_only ]]; then
  note "- torch_peer: skipped (FLOWLET_GPU_CONV_ONLY)"
elif python3 -c "import torch" > /dev/null 2>&1; then
  step torch_peer 50 python3 "$root/benchmarks/gpu/torch_peer.py"
  note '```'
  grep -E "^(torch|note|error)" "$OUT/torch_peer.log" >> "$report"
  note '```'
else
  note "- torch_peer: no PyTorch on this machine"
fi
# Issue 15: conv2d (cuDNN), max pooling and batch norm against PyTorch; the peer prints the ratios.
if [[ -x $build/benchmarks/gpu/bench_gpu_conv ]]; then
  step bench_gpu_conv 90 env FLOWLET_CUDNN_LOG=1 "$build/benchmarks/gpu/bench_gpu_conv"
  note '```'
  grep -E "^(gpu-conv|note|error)" "$OUT/bench_gpu_conv.log" >> "$report"
  note '```'
  note "cuDNN's choices (algo numbers: cudnn_ops.h's cudnnConvolution*Algo_t; math 0 default, 1 tensor op, 3 FMA):"
  note '```'
  grep -E "^cudnn:" "$OUT/bench_gpu_conv.log" | cut -c1-300 | head -n 60 >> "$report"
  note '```'
  if python3 -c "import torch" > /dev/null 2>&1; then
    step torch_peer_conv 90 python3 "$root/benchmarks/gpu/torch_peer_conv.py" --flowlet "$OUT/bench_gpu_conv.log"
    note '```'
    grep -E "^(ratio|note|error)" "$OUT/torch_peer_conv.log" >> "$report"
    note '```'
  fi
fi

# 4. Collectives on the GPU (issue 12): the NCCL backend's test case and a 1-rank NCCL all_reduce
# against a raw ncclAllReduce, run plainly and (when Open MPI is installed here) as mpirun -np 1.
# Built only when the configure step found NCCL (nccl.h and libnccl next to CUDA).
if [[ -z $conv_only ]] && grep -q "NCCL *: *True" "$OUT/configure.log" 2> /dev/null; then
  if step build_nccl 120 ninja -C "$build" -j "$(nproc)" tests/test_communicator \
      benchmarks/collective/bench_nccl_all_reduce; then
    step test_communicator_gpu 60 "$build/tests/test_communicator" --test-case="GPU participants*"
    note '```'
    grep -E "test cases:|assertions:|ERROR|FATAL|skipped" "$OUT/test_communicator_gpu.log" | head -n 20 >> "$report"
    note '```'
    step bench_nccl 60 "$build/benchmarks/collective/bench_nccl_all_reduce"
    note '```'
    grep -E "^(nccl|error)" "$OUT/bench_nccl.log" >> "$report"
    note '```'
    if command -v mpirun > /dev/null; then
      step bench_nccl_mpirun 60 env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        mpirun --oversubscribe -np 1 "$build/benchmarks/collective/bench_nccl_all_reduce"
      note '```'
      grep -E "^(nccl|error)" "$OUT/bench_nccl_mpirun.log" >> "$report"
      note '```'
    else
      note "- bench_nccl_mpirun: no mpirun on this machine"
    fi
  fi
else
  note "- nccl: not built (configure found no NCCL; see configure.log)"
fi

note ""
note "total $(elapsed) s"
cat "$report"
exit 0
