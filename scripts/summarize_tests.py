#!/usr/bin/env python3
"""Sums doctest test cases over a Meson test log; prints one line "N passed, M failed".

Usage: summarize_tests.py BUILD_DIR/meson-logs/testlog.txt

Each Meson test that prints doctest summary lines ("[doctest] test cases: ...")
contributes their passed/failed counts. A test that printed none (a script, or an
executable that died before its summary) counts as one test case, passed or failed
by its Meson result. A doctest executable whose counts show no failure but that Meson
failed anyway (a sanitizer report at exit, a timeout) has one passed case moved to
failed. Skipped Meson tests (exit status 77) are not counted.
Exits 0 only when at least one test case was counted and none failed.
"""
import re
import sys

BLOCK = re.compile(r"^=+ (\d+)/(\d+) =+$", re.M)
DOCTEST = re.compile(
    r"\[doctest\] test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed")
FAILURE = re.compile(r"^\s*(\d+)/\d+ .*\s(FAIL|TIMEOUT|UNEXPECTEDPASS|ERROR|INTERRUPT)\s")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def summarize(text):
    text = ANSI.sub("", text)
    body, sep, failures_part = text.rpartition("\nSummary of Failures:\n")
    if not sep:
        body, failures_part = text, ""
    failed_tests = {m.group(1) for m in map(FAILURE.match, failures_part.splitlines()) if m}
    passed = failed = 0
    heads = list(BLOCK.finditer(body))
    for i, head in enumerate(heads):
        block = body[head.end():heads[i + 1].start() if i + 1 < len(heads) else len(body)]
        meson_failed = head.group(1) in failed_tests
        counts = [tuple(map(int, m.groups()[1:])) for m in DOCTEST.finditer(block)]
        if counts:
            p = sum(c[0] for c in counts)
            f = sum(c[1] for c in counts)
            if meson_failed and f == 0:
                p, f = max(p - 1, 0), 1
            passed, failed = passed + p, failed + f
        elif meson_failed:
            failed += 1
        elif re.search(r"^result:\s+exit status 77$", block, re.M):
            continue
        else:
            passed += 1
    return passed, failed


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: summarize_tests.py TESTLOG_TXT")
    try:
        with open(sys.argv[1], encoding="utf-8", errors="replace") as log:
            passed, failed = summarize(log.read())
    except OSError as err:
        print(f"summarize_tests: cannot read the test log: {err}", file=sys.stderr)
        passed, failed = 0, 0
    if passed + failed == 0:
        print("summarize_tests: no test cases were counted", file=sys.stderr, flush=True)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
