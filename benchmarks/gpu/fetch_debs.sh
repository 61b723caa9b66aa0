#!/usr/bin/env bash
# Downloads (without installing) the Debian packages flowlet builds against, for the GPU machine,
# which has nvcc, meson, ninja and python3 but none of them and no network. benchmarks/gpu/check.sh
# unpacks them there with `dpkg -x` into a folder of its own.
# Usage (here, on the development machine): benchmarks/gpu/fetch_debs.sh [folder, default build/gpu-debs]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/build/gpu-debs}
mkdir -p "$dest"
cd "$dest"
packages=(
  libfmt-dev libfmt9                                                # fmt (headers, shared library)
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5 libquadmath0
  xtensor-dev libxtensor-dev xtl-dev                                # header-only
  doctest-dev                                                       # header-only
  zlib1g-dev zlib1g
  pkgconf pkgconf-bin libpkgconf3                                   # in case the GPU machine lacks pkg-config
)
# apt-get download fetches exactly these versions (no dependencies), whatever is installed here.
apt-get download "${packages[@]}"
ls -la "$dest"
du -sh "$dest"
