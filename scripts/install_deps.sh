#!/usr/bin/env bash
# Installs the given Debian packages with apt, only those not installed yet; silent when all are there.
# Usage: scripts/install_deps.sh [--optional] PACKAGE...
#   --optional: packages after it may fail to install; a warning is printed and the script succeeds.
set -euo pipefail

optional=0
if [[ "${1:-}" == "--optional" ]]; then optional=1; shift; fi

missing=()
for pkg in "$@"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "install_deps: missing packages: ${missing[*]}; run as root or install sudo" >&2
    exit 1
  fi
fi

echo "install_deps: installing ${missing[*]}" >&2
if "${sudo[@]}" apt-get update -qq &&
   "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
     apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null; then
  exit 0
fi
if [[ $optional -eq 1 ]]; then
  echo "install_deps: warning: could not install optional packages: ${missing[*]}; continuing without them" >&2
  exit 0
fi
echo "install_deps: apt-get could not install: ${missing[*]}" >&2
exit 1
