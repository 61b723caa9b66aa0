#!/usr/bin/env bash
# Packaging test: builds tests/packaging/consumer with flowlet as a Meson subproject and runs it.
# Usage: check_subproject.sh FLOWLET_SOURCE_ROOT
set -euo pipefail
src=$(cd "${1:?usage: check_subproject.sh FLOWLET_SOURCE_ROOT}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/flowlet-subproject.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "check_subproject: FAILED: $*" >&2; exit 1; }

cp -r "$here/consumer/." "$work/"
mkdir "$work/subprojects"
ln -s "$src" "$work/subprojects/flowlet"

# force-fallback: use the subproject even when a flowlet.pc is installed on this machine.
# What this checks is consumption (the dependency, headers, link), not speed or CUDA: the main
# build already compiles every source optimized and with CUDA, so this one builds unoptimized and
# without CUDA (cold, on 2 cores: 1 min 52 s instead of 2 min 55 s without CUDA, about twice that with).
meson setup "$work/build" "$work" --buildtype=debug --force-fallback-for=flowlet -Dflowlet:cuda=disabled \
  >"$work/setup.log" 2>&1 || { tail -n 40 "$work/setup.log" >&2; fail "meson setup of the consumer"; }
meson compile -C "$work/build" consumer >"$work/compile.log" 2>&1 ||
  { tail -n 60 "$work/compile.log" >&2; fail "building the consumer against subprojects/flowlet"; }
output=$("$work/build/consumer") || fail "the consumer exited with $?; output: $output"
echo "$output"
[[ "$output" == *4* && "$output" == *6* ]] || fail "expected the values 4 and 6 in the output"
echo "check_subproject: ok"
