#!/usr/bin/env bash
# Builds and tests one configured Meson build dir, then prints the one "N passed, M failed" line.
# Usage: scripts/run_tests.sh BUILD_DIR TIMEOUT_MULTIPLIER
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1 multiplier=$2

meson compile -C "$build"
rm -f "$build/meson-logs/testlog.txt"
status=0
meson test -C "$build" --print-errorlogs --timeout-multiplier "$multiplier" || status=$?
python3 scripts/summarize_tests.py "$build/meson-logs/testlog.txt" || { [[ $status -ne 0 ]] || status=1; }
exit "$status"
