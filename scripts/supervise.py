#!/usr/bin/env python3
"""Restarts a failed job, up to a limit, and says each time what failed.

Usage: supervise.py [--max-restarts N] [--timeout S] [--grace S] -- COMMAND [ARGS...]

Runs COMMAND (typically `mpirun -np 4 prog --resume --checkpoint-dir DIR ...`, a program that
restores its latest complete checkpoint when it starts). An attempt fails when it exits non-zero,
is killed by a signal or runs longer than --timeout seconds (0: no limit). After a failure the
supervisor prints the attempt number, the exit status or signal, how long it ran and the last lines
of its stderr, and starts COMMAND again, at most N times (default 3). Exit status: 0 as soon as an
attempt succeeds; otherwise 1 after a summary of every attempt (2 for bad usage; 128 + signal when
the supervisor itself was stopped by SIGINT or SIGTERM).

Failure detection is MPI's: a rank that dies ends the mpirun job, which exits non-zero. The
supervisor never leaves processes behind: each attempt runs in a process group of its own; SIGINT
and SIGTERM sent to the supervisor are forwarded to that group; and the supervisor makes itself the
"child subreaper" (Linux prctl), so processes the attempt left orphaned (ranks of an mpirun that
was killed) are re-parented to it and killed and reaped when the attempt ends.

chaos_test.py imports this file: run_attempt() and supervise() take hooks to watch the output and
to kill ranks while an attempt runs.
"""
import argparse
import collections
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

STDERR_TAIL_LINES = 15
PR_SET_CHILD_SUBREAPER = 36


class Attempt:
    """What one run of the command did."""

    def __init__(self, number):
        self.number = number
        self.returncode = None
        self.seconds = 0.0
        self.timed_out = False
        self.stderr_tail = []

    @property
    def succeeded(self):
        return self.returncode == 0 and not self.timed_out

    def status(self):
        """The exit status in words: 'exit status 1', 'signal SIGKILL', 'exit status 137 (128 + SIGKILL)'."""
        if self.timed_out:
            return f"over the timeout (then {describe_returncode(self.returncode)})"
        return describe_returncode(self.returncode)


def describe_returncode(code):
    if code is None:
        return "no exit status"
    if code < 0:
        return f"signal {signal_name(-code)}"
    if code > 128 and code - 128 < signal.NSIG:
        # A shell or mpirun reports a process killed by signal s as 128 + s.
        return f"exit status {code} (128 + {signal_name(code - 128)})"
    return f"exit status {code}"


def signal_name(number):
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def become_subreaper():
    """Orphaned descendants of our children are re-parented to us instead of init (Linux >= 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(pid):
    """The pids of the live processes whose parent is `pid` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        # pid (comm) state ppid ...: comm may hold spaces and parentheses; the last ')' ends it.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) >= 2 and fields[0] != "Z" and int(fields[1]) == pid:
            found.append(int(entry))
    return found


def descendants_of(pid):
    """Every live descendant of `pid`, parents before children."""
    result, frontier = [], [pid]
    while frontier:
        nxt = []
        for parent in frontier:
            nxt.extend(children_of(parent))
        result.extend(nxt)
        frontier = nxt
    return result


def kill_leftovers(extra_pids=()):
    """SIGKILLs and reaps every process re-parented to us (and `extra_pids`), until none is left."""
    me = os.getpid()
    for _ in range(50):
        pids = set(descendants_of(me)) | {p for p in extra_pids if pid_alive(p)}
        # Our own helper threads are no processes; only real children are listed. Popen objects
        # still running (none here: the attempt ended) would be listed too.
        if not pids:
            return
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            try:
                reaped, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if reaped == 0:
                time.sleep(0.02)
        extra_pids = ()


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class Supervisor:
    """Runs attempts of one command; forwards SIGINT/SIGTERM to the running attempt's group."""

    def __init__(self, command, timeout=0.0, grace=5.0, log=None, stdout_line=None, on_start=None, env=None,
                 echo_stderr=True):
        self.command = list(command)
        self.echo_stderr = echo_stderr  # False: stderr is only kept for the failure report
        self.env = env  # the attempts' environment (None: ours)
        self.timeout = timeout
        self.grace = grace
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.stdout_line = stdout_line  # called with each stdout line (then the line is echoed)
        self.on_start = on_start        # called with (attempt, Popen) once the attempt runs
        self.stopped_by = None          # the signal that stopped the supervisor
        self._child = None
        self._lock = threading.Lock()
        become_subreaper()

    def install_signal_handlers(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._forward)

    def _forward(self, number, _frame):
        self.stopped_by = number
        with self._lock:
            child = self._child
        if child is not None and child.poll() is None:
            try:
                os.killpg(child.pid, number)
            except ProcessLookupError:
                pass

    def run_attempt(self, number):
        attempt = Attempt(number)
        tail = collections.deque(maxlen=STDERR_TAIL_LINES)
        begin = time.monotonic()
        child = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, env=self.env)
        with self._lock:
            self._child = child

        def pump_stdout():
            for raw in child.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                if self.stdout_line is not None:
                    self.stdout_line(line)
                print(line, flush=True)

        def pump_stderr():
            for raw in child.stderr:
                line = raw.decode(errors="replace").rstrip("\n")
                tail.append(line)
                if self.echo_stderr:
                    print(line, file=sys.stderr, flush=True)

        pumps = [threading.Thread(target=pump_stdout, daemon=True), threading.Thread(target=pump_stderr, daemon=True)]
        for p in pumps:
            p.start()
        if self.on_start is not None:
            self.on_start(attempt, child)
        try:
            child.wait(timeout=self.timeout if self.timeout > 0 else None)
        except subprocess.TimeoutExpired:
            attempt.timed_out = True
            self._stop_group(child)
        if self.stopped_by is not None and child.poll() is None:
            self._stop_group(child)
        attempt.returncode = child.wait()
        attempt.seconds = time.monotonic() - begin
        with self._lock:
            self._child = None
        # Ranks that outlived their mpirun, anything still in the attempt's group: gone before the
        # next attempt starts (they would hold the checkpoint directory and the CPU).
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        kill_leftovers()
        for p in pumps:
            p.join(timeout=5)
        attempt.stderr_tail = list(tail)
        return attempt

    def _stop_group(self, child):
        """SIGTERM to the attempt's group, then SIGKILL after the grace period."""
        for sig, wait in ((signal.SIGTERM, self.grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(child.pid, sig)
            except ProcessLookupError:
                return
            try:
                child.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def supervise(self, max_restarts):
        """Runs until an attempt succeeds or max_restarts restarts failed too. Returns (code, attempts)."""
        attempts = []
        for number in range(1, max_restarts + 2):
            if number > 1:
                self.log(f"supervise: restarting ({number - 1} of at most {max_restarts} restarts): "
                         f"{' '.join(self.command)}")
            attempt = self.run_attempt(number)
            attempts.append(attempt)
            if self.stopped_by is not None:
                self.log(f"supervise: stopped by {signal_name(self.stopped_by)} during attempt {number} "
                         f"({attempt.status()} after {attempt.seconds:.1f} s)")
                return 128 + self.stopped_by, attempts
            if attempt.succeeded:
                if number > 1:
                    self.log(f"supervise: attempt {number} succeeded after {attempt.seconds:.1f} s "
                             f"({number - 1} restarts)")
                return 0, attempts
            self.log(self.describe_failure(attempt))
        self.log(self.summary(attempts, max_restarts))
        return 1, attempts

    def describe_failure(self, attempt):
        lines = [f"supervise: attempt {attempt.number} failed: {attempt.status()} after {attempt.seconds:.1f} s"]
        if attempt.stderr_tail:
            lines.append(f"supervise: the last {len(attempt.stderr_tail)} lines of its stderr:")
            lines.extend("  | " + line for line in attempt.stderr_tail)
        else:
            lines.append("supervise: it wrote nothing to stderr")
        return "\n".join(lines)

    def summary(self, attempts, max_restarts):
        lines = [f"supervise: giving up: {len(attempts)} attempts failed ({max_restarts} restarts allowed): "
                 f"{' '.join(self.command)}"]
        for a in attempts:
            lines.append(f"  attempt {a.number}: {a.status()} after {a.seconds:.1f} s")
        return "\n".join(lines)


def parse_arguments(argv):
    parser = argparse.ArgumentParser(
        prog="supervise.py", usage="supervise.py [--max-restarts N] [--timeout S] [--grace S] -- COMMAND [ARGS...]",
        description="Runs COMMAND again after each failure, up to --max-restarts times.")
    parser.add_argument("--max-restarts", type=int, default=3, help="restarts after the first attempt (>= 0)")
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds an attempt may run (0: no limit)")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when an attempt is stopped")
    if "--" not in argv:
        parser.error("missing '--' before the command")
    split = argv.index("--")
    options = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        parser.error("no command after '--'")
    if options.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0; got {options.max_restarts}")
    if options.timeout < 0 or options.grace < 0:
        parser.error(f"--timeout and --grace must be >= 0; got {options.timeout:g} and {options.grace:g}")
    return options, command


def main(argv):
    options, command = parse_arguments(argv)
    supervisor = Supervisor(command, timeout=options.timeout, grace=options.grace)
    supervisor.install_signal_handlers()
    try:
        code, _ = supervisor.supervise(options.max_restarts)
    except FileNotFoundError as error:
        print(f"supervise: cannot run {command[0]!r}: {error}", file=sys.stderr)
        return 127
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
