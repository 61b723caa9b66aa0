#!/usr/bin/env python3
"""Tests of scripts/supervise.py with small shell jobs (no MPI): restarts, what it reports, the
limit, --timeout, signal forwarding, and that no process outlives it (orphans included)."""
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SUPERVISE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "supervise.py")


def supervise(*args, timeout=60):
    return subprocess.run([sys.executable, SUPERVISE, *args], capture_output=True, text=True, timeout=timeout)


def read(path):
    with open(path) as f:
        return f.read()


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class SuperviseTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="supervise-test-")
        self.count = os.path.join(self.dir, "count")

    def job(self, body):
        """A bash job that knows its attempt number as $n (counted in a file)."""
        return ["bash", "-c", f'n=$(( $(cat {self.count} 2>/dev/null || echo 0) + 1 )); echo $n > {self.count}; {body}']

    def test_restarts_until_success_and_reports_each_failure(self):
        result = supervise("--max-restarts", "3", "--", *self.job(
            'echo "attempt $n"; echo "why $n" >&2; '
            'if [ $n = 1 ]; then exit 3; fi; if [ $n = 2 ]; then kill -KILL $$; fi; exit 0'))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.split(), ["attempt", "1", "attempt", "2", "attempt", "3"])
        self.assertIn("supervise: attempt 1 failed: exit status 3 after", result.stderr)
        self.assertIn("  | why 1", result.stderr)
        self.assertIn("supervise: attempt 2 failed: signal SIGKILL after", result.stderr)
        self.assertIn("  | why 2", result.stderr)
        self.assertIn("supervise: attempt 3 succeeded", result.stderr)
        self.assertNotIn("attempt 4", result.stderr)

    def test_gives_up_after_the_limit_with_a_summary(self):
        result = supervise("--max-restarts", "2", "--", *self.job("exit 137"))
        self.assertEqual(result.returncode, 1)
        with open(self.count) as f:
            self.assertEqual(f.read().strip(), "3")  # the first attempt and 2 restarts
        self.assertIn("giving up: 3 attempts failed (2 restarts allowed)", result.stderr)
        self.assertIn("attempt 3: exit status 137 (128 + SIGKILL)", result.stderr)

    def test_zero_restarts_runs_once(self):
        result = supervise("--max-restarts", "0", "--", "false")
        self.assertEqual(result.returncode, 1)
        self.assertIn("giving up: 1 attempts failed", result.stderr)

    def test_timeout_stops_an_attempt_and_restarts(self):
        begin = time.monotonic()
        result = supervise("--max-restarts", "1", "--timeout", "1", "--grace", "1", "--",
                           *self.job('if [ $n = 1 ]; then sleep 30; fi; exit 0'))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("attempt 1 failed: over the timeout", result.stderr)
        self.assertLess(time.monotonic() - begin, 15)

    def test_orphans_of_an_attempt_are_killed(self):
        # The job leaves a process in a session of its own (as mpirun's ranks are in groups of their
        # own) and exits: the supervisor must kill it (child subreaper).
        pid_file = os.path.join(self.dir, "orphan")
        result = supervise("--", "bash", "-c",
                           f"setsid bash -c 'echo $$ > {pid_file}; exec sleep 300' & "
                           f"while [ ! -s {pid_file} ]; do sleep 0.01; done; exit 0")
        self.assertEqual(result.returncode, 0, result.stderr)
        orphan = int(read(pid_file))
        deadline = time.monotonic() + 5
        while alive(orphan) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(alive(orphan), "the orphan of the attempt is still running")

    def test_sigterm_is_forwarded_and_nothing_is_left(self):
        pid_file = os.path.join(self.dir, "pids")
        sup = subprocess.Popen([sys.executable, SUPERVISE, "--max-restarts", "5", "--", "bash", "-c",
                                f"setsid bash -c 'echo $$ >> {pid_file}; exec sleep 300' & "
                                f"bash -c 'echo $$ >> {pid_file}; exec sleep 300' & wait"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (os.path.exists(pid_file) and len(read(pid_file).split()) == 2):
            time.sleep(0.05)
        pids = [int(p) for p in read(pid_file).split()]
        sup.send_signal(signal.SIGTERM)
        _, stderr = sup.communicate(timeout=20)
        self.assertEqual(sup.returncode, 128 + signal.SIGTERM, stderr)
        self.assertIn("stopped by SIGTERM during attempt 1", stderr)
        self.assertNotIn("restarting", stderr)
        for pid in pids:
            self.assertFalse(alive(pid), f"process {pid} outlived the supervisor")

    def test_bad_usage(self):
        for args in ([], ["--", ], ["--max-restarts", "-1", "--", "true"], ["--timeout", "-2", "--", "true"], ["true"]):
            result = supervise(*args)
            self.assertEqual(result.returncode, 2, args)
            self.assertIn("supervise.py", result.stderr)

    def test_missing_program(self):
        result = supervise("--", os.path.join(self.dir, "no-such-program"))
        self.assertEqual(result.returncode, 127)
        self.assertIn("cannot run", result.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
