#!/usr/bin/env python3
"""Runs an MPI job that must fail: passes when it ends non-zero within the limit.

Usage: mpi_expect_failure.py LIMIT_SECONDS MPIRUN NP PROGRAM [ARGS...]

Fails (exit 1) when the job succeeds, or when it is still running after LIMIT_SECONDS (it is then
killed: a hang is the failure this guards against). Prints the job's output and the time it took.
"""
import os
import signal
import subprocess
import sys
import time


def main():
    if len(sys.argv) < 5:
        print(__doc__)
        return 2
    limit = float(sys.argv[1])
    command = [sys.argv[2], "--oversubscribe", "-np", sys.argv[3]] + sys.argv[4:]
    begin = time.monotonic()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        print(output.decode(errors="replace"))
        print(f"FAIL: {' '.join(command)} still ran after {limit:g} s (a hang)")
        return 1
    took = time.monotonic() - begin
    print(output.decode(errors="replace"))
    if job.returncode == 0:
        print(f"FAIL: {' '.join(command)} succeeded (exit 0 after {took:.1f} s); it must fail")
        return 1
    print(f"ok: {' '.join(command)} failed with exit status {job.returncode} after {took:.1f} s (limit {limit:g} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
