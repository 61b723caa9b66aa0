#!/usr/bin/env bash
# Creates (once) the virtual environment that holds TensorFlow 2, the benchmarks' TensorFlow peer
# (benchmarks/peers/tf_peer.py). TensorFlow is never a dependency of the library or the tests: it
# lives only in this venv, which only the benchmarks use.
# Usage: benchmarks/peers/setup_tf_venv.sh [VENV_DIR]   (default: build/tf-venv under the source root)
# Environment: PYTHON (default python3) is the interpreter the venv is made from.
# Always exits 0 when TensorFlow cannot be installed (PyPI unreachable, no wheel for this Python):
# the benchmarks then print "TensorFlow peer: not available".
set -uo pipefail

TF_VERSION=2.20.0    # tensorflow-cpu wheels exist for CPython 3.9 to 3.13
NUMPY_SPEC='numpy>=1.26,<2.3'

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
venv=${1:-$root/build/tf-venv}
python=${PYTHON:-python3}

say() { echo "setup_tf_venv: $*" >&2; }
give_up() { say "$*; benchmarks run without the TensorFlow peer"; exit 0; }

command -v "$python" >/dev/null 2>&1 || give_up "no $python"

# Already set up with the pinned version: nothing to do.
if [[ -x "$venv/bin/python" ]] &&
   installed=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))' 2>/dev/null) &&
   [[ "$installed" == "$TF_VERSION" ]]; then
  exit 0
fi

# Debian's python3 has the venv module but not ensurepip until python3-venv is installed.
if ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  bash "$root/scripts/install_deps.sh" --optional python3-venv
  "$python" -c 'import venv, ensurepip' >/dev/null 2>&1 || give_up "$python cannot make a venv (python3-venv missing)"
fi

if [[ ! -x "$venv/bin/python" ]]; then
  say "creating $venv"
  # A half-made venv (no bin/python) from an interrupted run is made again from scratch.
  rm -rf "$venv"
  "$python" -m venv "$venv" || { rm -rf "$venv"; give_up "python3 -m venv $venv failed"; }
fi

say "installing tensorflow-cpu==$TF_VERSION into $venv (about 250 MB the first time)"
if ! "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --timeout 30 --retries 2 \
       "tensorflow-cpu==$TF_VERSION" "$NUMPY_SPEC"; then
  give_up "pip could not install tensorflow-cpu==$TF_VERSION (PyPI unreachable, or no wheel for $("$venv/bin/python" --version 2>&1))"
fi
if ! version=$("$venv/bin/python" -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf; print(tf.__version__)' 2>/dev/null); then
  give_up "tensorflow-cpu installed but does not import in $venv"
fi
say "TensorFlow $version ready in $venv"
exit 0
