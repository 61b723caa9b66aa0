#!/usr/bin/env bash
# Packaging test: installs a built flowlet into a temporary DESTDIR, then compiles and runs
# tests/packaging/consumer/main.cpp with the flags from the installed flowlet.pc.
# Usage: check_pkgconfig.sh FLOWLET_BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: check_pkgconfig.sh FLOWLET_BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/flowlet-pkgconfig.XXXXXX")
trap 'rm -rf "$work"' EXIT
fail() { echo "check_pkgconfig: FAILED: $*" >&2; exit 1; }

dest="$work/root"
meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >"$work/install.log" 2>&1 ||
  { tail -n 40 "$work/install.log" >&2; fail "meson install into $dest"; }
pc=$(find "$dest" -name flowlet.pc -path '*/pkgconfig/*' | head -n 1)
[[ -n "$pc" ]] || fail "meson install did not install flowlet.pc"
prefix=$(sed -n 's/^prefix=//p' "$pc")
[[ -n "$prefix" ]] || fail "$pc has no prefix= line"

pkgconf() { PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}" \
  pkg-config --define-variable=prefix="$dest$prefix" "$@" flowlet; }
flags=$(pkgconf --cflags --libs) || fail "pkg-config --cflags --libs flowlet"
libdirs=$(pkgconf --libs-only-L | sed 's/-L//g; s/ \+/:/g; s/:$//')
# A sanitized flowlet (make asan, make tsan) needs a sanitized program to link against it.
sanitize=$(python3 -c 'import json, sys
v = next((o["value"] for o in json.load(open(sys.argv[1])) if o["name"] == "b_sanitize"), "none")
print(",".join(v) or "none" if isinstance(v, list) else v)' \
  "$build/meson-info/intro-buildoptions.json")
[[ "$sanitize" == none ]] || flags="-fsanitize=$sanitize $flags"

# shellcheck disable=SC2086  # flags are a word list
g++ -std=c++20 -O1 "$here/consumer/main.cpp" -o "$work/consumer" $flags 2>"$work/compile.log" ||
  { tail -n 60 "$work/compile.log" >&2; fail "g++ with pkg-config flags: $flags"; }
output=$(LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/consumer") ||
  fail "the consumer exited with $?; output: $output"
echo "$output"
[[ "$output" == *4* && "$output" == *6* ]] || fail "expected the values 4 and 6 in the output"
echo "check_pkgconfig: ok"
