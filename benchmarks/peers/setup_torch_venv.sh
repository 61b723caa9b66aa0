#!/usr/bin/env bash
# Creates (once) the virtual environment that holds CPU PyTorch for the benchmarks' PyTorch peer
# (benchmarks/peers/torch_cnn.py). PyTorch is never a dependency of the library or the tests: it
# lives only in this venv, which only the benchmarks use (the C++ benchmarks use Debian's libtorch).
# Usage: benchmarks/peers/setup_torch_venv.sh [VENV_DIR]   (default: build/torch-venv under the source root)
# Environment: PYTHON (default python3) is the interpreter the venv is made from; TORCH_INDEX_URL
# (default: PyPI, whose Linux wheel also pulls NVIDIA's CUDA runtime wheels, about 3 GB, which the
# CPU runs here never load) where pip looks for torch; a CPU-only wheel index is much smaller.
# Always exits 0 when PyTorch cannot be installed (index unreachable, no wheel for this Python):
# torch_cnn.py then says "PyTorch peer: not available".
set -uo pipefail

TORCH_VERSION=2.5.1   # CPU wheels exist for CPython 3.9 to 3.13
TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://pypi.org/simple}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${1:-$root/build/torch-venv}
python=${PYTHON:-python3}

say() { echo "setup_torch_venv: $*" >&2; }
give_up() { say "$*; the PyTorch peer is not available"; exit 0; }

command -v "$python" >/dev/null 2>&1 || give_up "no $python"

# Already set up with the pinned version: nothing to do.
if [[ -x "$venv/bin/python" ]] &&
   installed=$("$venv/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null) &&
   [[ "$installed" == "$TORCH_VERSION" ]]; then
  exit 0
fi

# Debian's python3 has the venv module but not ensurepip until python3-venv is installed.
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  bash "$root/scripts/install_deps.sh" --optional python3-venv
  "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 || give_up "$python cannot make a venv (python3-venv missing)"
fi

if [[ ! -x "$venv/bin/python" ]]; then
  say "creating $venv"
  rm -rf "$venv"  # a half-made venv (no bin/python) from an interrupted run is made again
  "$python" -m venv "$venv" || { rm -rf "$venv"; give_up "python3 -m venv $venv failed"; }
fi

say "installing torch==$TORCH_VERSION into $venv from $TORCH_INDEX_URL (up to 3 GB the first time)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 30 --retries 2 \
       --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION" numpy; then
  give_up "pip could not install torch==$TORCH_VERSION from $TORCH_INDEX_URL"
fi
if ! version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null); then
  give_up "torch installed but does not import in $venv"
fi
say "PyTorch $version ready in $venv"
exit 0
