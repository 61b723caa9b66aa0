#!/usr/bin/env python3
"""Chaos tests of restart after faults: kills ranks of a checkpointing MPI job and checks every restore.

Usage: chaos_test.py CASE --job CHAOS_JOB [--mpirun MPIRUN] [--work-dir DIR] [--seed X] [--kills N]

CASE is one of
  mirrored          the job (tests/chaos/chaos_job.cpp) in mirrored mode under `mpirun -np 2`;
  ps                the job as an asynchronous parameter-server job (2 servers, 2 workers);
  mirrored-reshape  saved by 2 processes, resumed by 1;
  ps-reshape        saved with 2 servers, resumed with 3; resumed with another worker count (refused).

mirrored / ps: first the uninterrupted reference run(s); then the job runs under the supervisor's
logic (scripts/supervise.py: an attempt that fails is started again with --resume) while a killer
sends SIGKILL to a random rank of each attempt (a child of mpirun, found through /proc), --kills
times (20). The moment is random: during start-up, a random time after the job restored, just after
a checkpoint's manifest appeared (process 0 is then cleaning up: retention), or the moment a write is in flight (a new `.tmp` file or a new file in a checkpoint directory that has
no manifest yet; while kills are due the job runs with FLOWLET_CHECKPOINT_TEST_WRITE_DELAY_MS so
that writes last long enough to be hit). A kill also comes as soon as the job got two checkpoints
past its share of the steps; when the job still finishes before every kill was made, another round
runs it again from a fresh directory (each round's end is checked). Checked:
  - before every attempt, every complete checkpoint (one with manifest.json) is whole: the manifest
    parses and its own CRC matches, it lists every shard, each shard file's size and CRC-32 match,
    each shard's safetensors data CRC matches and its __metadata__ step equals the manifest's
    (never a mix of two steps), and the pieces tile every tensor;
  - every restore the job logs ("restored step S from DIR") is the newest complete checkpoint that
    existed when the attempt started, and is whole when it is read;
  - older complete checkpoints are whole too (a crash while the retention deletes one must not
    leave a manifest naming missing shards); these are collected and fail the case at its end;
  - an attempt fails only when it was killed;
  - at the end, mirrored: the final parameters equal the reference's (relative tolerance 1e-5) and
    the optimizer's step counter equals the steps; ps: every server optimizer's step counter in the
    final checkpoint equals workers x steps (no update applied twice or lost) and the final loss
    lies within the spread of the uninterrupted runs (widened by 5 % of their mean).
Every launch runs under `timeout`, mpirun with --oversubscribe and the environment of
tests/meson.build (mpi_test_env; missing entries are set here). The seed is printed; --seed replays.
Exit status 0 when every check passed, 1 otherwise (with what failed).
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import supervise  # noqa: E402  (the supervisor's attempt logic, shared)

# tests/meson.build's mpi_test_env, for runs by hand.
MPI_ENV_DEFAULTS = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "FLOWLET_COLLECTIVE_TIMEOUT": "30",
}
WRITE_DELAY_VARIABLE = "FLOWLET_CHECKPOINT_TEST_WRITE_DELAY_MS"
LAUNCH_TIMEOUT_SECONDS = 60  # any one mpirun launch
MANIFEST = "manifest.json"
RESTORED = re.compile(r"^restored step (\d+) from (\S+)")


class ChaosFailure(Exception):
    pass


def log(text):
    print(f"chaos: {text}", flush=True)


# ---------------------------------------------------------------------------------------------
# Reading checkpoints (independently of the C++ reader)

DTYPES = {"F32": ("f", 4), "F64": ("d", 8), "I64": ("q", 8), "I32": ("i", 4), "F16": ("e", 2)}


def read_safetensors(path):
    """(metadata, {name: (dtype, shape, values)}) of a flowlet safetensors file; checks its data CRC."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ChaosFailure(f"{path}: {len(raw)} bytes, shorter than a safetensors header length")
    (header_length,) = struct.unpack("<Q", raw[:8])
    if 8 + header_length > len(raw):
        raise ChaosFailure(f"{path}: header of {header_length} bytes runs past the end ({len(raw)} bytes)")
    try:
        header = json.loads(raw[8:8 + header_length].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ChaosFailure(f"{path}: the header is not JSON: {error}")
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict) or "step" not in metadata or "crc32" not in metadata:
        raise ChaosFailure(f"{path}: no __metadata__ with step and crc32: {metadata!r}")
    data = raw[8 + header_length:]
    if f"{zlib.crc32(data):08x}" != metadata["crc32"]:
        raise ChaosFailure(f"{path}: data CRC-32 {zlib.crc32(data):08x} != recorded {metadata['crc32']}")
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        code, size = DTYPES[entry["dtype"]]
        if not 0 <= begin <= end <= len(data) or (end - begin) % size:
            raise ChaosFailure(f"{path}: tensor {name} has offsets {begin}..{end} outside {len(data)} data bytes")
        count = (end - begin) // size
        tensors[name] = (entry["dtype"], list(entry["shape"]), list(struct.unpack(f"<{count}{code}", data[begin:end])))
    return metadata, tensors


def file_crc32(path):
    crc = 0
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                return crc
            crc = zlib.crc32(chunk, crc)


class Checkpoint:
    """A complete checkpoint read back and checked in full."""

    def __init__(self, path):
        self.path = path
        manifest_path = os.path.join(path, MANIFEST)
        with open(manifest_path, "rb") as f:
            text = f.read().decode("utf-8")
        self.manifest = manifest = json.loads(text)
        recorded = manifest.get("manifest_crc32")
        zeroed = text.replace(f'"manifest_crc32":"{recorded}"', '"manifest_crc32":"00000000"', 1)
        zeroed = zeroed.replace(f'"manifest_crc32": "{recorded}"', '"manifest_crc32": "00000000"', 1)
        if f"{zlib.crc32(zeroed.encode()):08x}" != recorded:
            raise ChaosFailure(f"{manifest_path}: manifest CRC-32 {zlib.crc32(zeroed.encode()):08x} != {recorded}")
        if manifest.get("format") != "flowlet-distributed-checkpoint":
            raise ChaosFailure(f"{manifest_path}: format {manifest.get('format')!r}")
        self.step = int(manifest["step"])
        shards = {}
        for shard in manifest["shards"]:
            file = os.path.join(path, shard["file"])
            if not os.path.isfile(file):
                raise ChaosFailure(f"{manifest_path}: shard {shard['name']} file {shard['file']} is missing")
            size = os.path.getsize(file)
            if size != shard["bytes"]:
                raise ChaosFailure(f"{file}: {size} bytes, the manifest says {shard['bytes']}")
            if f"{file_crc32(file):08x}" != shard["crc32"]:
                raise ChaosFailure(f"{file}: CRC-32 {file_crc32(file):08x}, the manifest says {shard['crc32']}")
            metadata, tensors = read_safetensors(file)
            if int(metadata["step"]) != self.step:
                raise ChaosFailure(f"{file}: shard of step {metadata['step']} in the checkpoint of step "
                                   f"{self.step} (a mix of two steps)")
            shards[shard["name"]] = tensors
        listed = {s["file"] for s in manifest["shards"]}
        self.stray_files = sorted(n for n in os.listdir(path) if n != MANIFEST and n not in listed)
        # Every tensor assembled from its pieces, which must tile its rows.
        self.tensors = {}
        for record in manifest["tensors"]:
            shape = record["shape"]
            rows = shape[0] if shape else 1
            values, next_row = [], 0
            for piece in sorted(record["pieces"], key=lambda p: p["rows"][0]):
                begin, end = piece["rows"]
                if begin != next_row:
                    raise ChaosFailure(f"{manifest_path}: tensor {record['name']} pieces leave rows {next_row}..{begin}")
                if piece["shard"] not in shards or piece["entry"] not in shards[piece["shard"]]:
                    raise ChaosFailure(f"{manifest_path}: tensor {record['name']} names {piece['shard']}:{piece['entry']}, "
                                       "which is not in the shard")
                values.extend(shards[piece["shard"]][piece["entry"]][2])
                next_row = end
            if next_row != rows:
                raise ChaosFailure(f"{manifest_path}: tensor {record['name']} pieces cover {next_row} of {rows} rows")
            self.tensors[record["name"]] = values
        self.metadata = manifest.get("metadata", {})
        self.processes = manifest.get("processes")


def complete_checkpoints(directory):
    """[(step, path)] of the directories holding a manifest, lowest step first (superseded ones excluded)."""
    found = []
    if not os.path.isdir(directory):
        return found
    for name in os.listdir(directory):
        match = re.fullmatch(r"ckpt-(\d+)", name)
        if match and os.path.isfile(os.path.join(directory, name, MANIFEST)):
            found.append((int(match.group(1)), os.path.join(directory, name)))
    return sorted(found)


def latest_step(directory):
    complete = complete_checkpoints(directory)
    return complete[-1][0] if complete else -1


def pending_files(directory):
    """What saves in progress have written so far: every entry of a checkpoint directory without a
    manifest above the newest complete one ("ckpt-000045/", "ckpt-000045/<file>") and every `.tmp`
    file anywhere. (Directories below the newest complete one lose their manifest only while the
    retention deletes them: no write.) A crash leaves such files behind too; the killer subtracts
    those it saw when the attempt started and when it restored."""
    found, incomplete = set(), []
    try:
        entries = list(os.scandir(directory))
        newest = -1
        for entry in entries:
            if ".tmp" in entry.name:
                found.add(entry.name)
            elif entry.is_dir() and re.fullmatch(r"ckpt-\d+", entry.name):
                names = os.listdir(entry.path)
                step = int(entry.name[5:])
                if MANIFEST in names:
                    newest = max(newest, step)
                    found.update(f"{entry.name}/{n}" for n in names if ".tmp" in n)
                else:
                    incomplete.append((step, entry.name, names))
        for step, name, names in incomplete:
            if step > newest:
                found.add(name + "/")
                found.update(f"{name}/{n}" for n in names)
    except OSError:
        pass  # a directory deleted or renamed while we looked
    return found


def read_out(path):
    """The job's --out file: {name: values}."""
    _, tensors = read_safetensors(path)
    return {name: values for name, (_, _, values) in tensors.items()}


# ---------------------------------------------------------------------------------------------
# Launching

class Runner:
    def __init__(self, options):
        self.options = options
        self.env = dict(os.environ)
        for key, value in MPI_ENV_DEFAULTS.items():
            self.env.setdefault(key, value)

    def command(self, processes, job_args):
        return ["timeout", "-s", "KILL", str(LAUNCH_TIMEOUT_SECONDS), self.options.mpirun, "--oversubscribe",
                "-np", str(processes), self.options.job] + [str(a) for a in job_args]

    def run(self, processes, job_args, expect_success=True, env=None):
        """One launch to its end; returns (returncode, stdout, stderr, seconds)."""
        begin = time.monotonic()
        result = subprocess.run(self.command(processes, job_args), env=env or self.env, capture_output=True, text=True)
        seconds = time.monotonic() - begin
        if expect_success and result.returncode != 0:
            raise ChaosFailure(f"{' '.join(self.command(processes, job_args))} failed "
                               f"({supervise.describe_returncode(result.returncode)}):\n{result.stdout}{result.stderr}")
        return result.returncode, result.stdout, result.stderr, seconds


def job_ranks(root_pid, job_path):
    """{pid: rank} of the job's processes under `root_pid` (timeout -> mpirun -> ranks)."""
    name = os.path.basename(job_path)[:15]  # /proc/<pid>/comm holds 15 characters
    ranks = {}
    for pid in supervise.descendants_of(root_pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            ranks[pid] = int(environ.get(b"OMPI_COMM_WORLD_RANK", b"-1"))
        except (OSError, ValueError):
            continue
    return ranks


# ---------------------------------------------------------------------------------------------
# The killer

class Kill:
    """One planned kill of one attempt and what happened."""

    def __init__(self, kind, delay):
        self.kind = kind          # startup | random | write
        self.delay = delay
        self.sent = False
        self.reason = ""          # what triggered it: the plan, a write seen, the progress cap
        self.rank = None
        self.at = 0.0             # seconds after the attempt started
        self.in_write = []        # .tmp files present at the moment of the kill
        self.latest_step = -1     # newest complete checkpoint at the moment of the kill


class Killer:
    def __init__(self, runner, checkpoint_dir, rng, cap_step):
        self.runner = runner
        self.dir = checkpoint_dir
        self.rng = rng
        self.cap_step = cap_step
        self.restored = threading.Event()
        # .tmp files already there when the attempt started or restored: a crash's leftovers, not
        # writes of this attempt (the next complete save deletes them).
        self.leftovers = pending_files(checkpoint_dir)
        self.thread = None
        self.done = threading.Event()

    def start(self, kill, child, began):
        self.thread = threading.Thread(target=self._run, args=(kill, child, began), daemon=True)
        self.thread.start()

    def _wait(self, child, seconds, began, kill, watch_writes=False):
        """Sleeps up to `seconds` polling; returns the reason to kill early, None at the deadline, or
        'ended' when the attempt ended."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if child.poll() is not None or self.done.is_set():
                return "ended"
            if latest_step(self.dir) >= self.cap_step:
                return "progress cap"
            if watch_writes and self.new_writes():
                return "write seen"
            time.sleep(0.001 if watch_writes else 0.005)
        return None

    def _run(self, kill, child, began):
        reason = None
        if kill.kind == "startup":
            reason = self._wait(child, kill.delay, began, kill) or "planned"
        else:
            # After the job has restored (or found nothing to restore).
            while not self.restored.is_set():
                if child.poll() is not None or self.done.is_set():
                    return
                time.sleep(0.002)
            if latest_step(self.dir) >= self.cap_step:
                reason = "progress cap"
            elif kill.kind == "commit":
                # Right after a manifest appears: process 0 is then cleaning up (superseded,
                # retention, leftovers), the moment a deletion can be cut short.
                reason = self._wait_commit(child) or "no commit seen in 20 s"
            elif kill.kind == "random":
                reason = self._wait(child, kill.delay, began, kill) or "planned"
            else:
                reason = self._wait(child, 20.0, began, kill, watch_writes=True) or "no write seen in 20 s"
                if reason == "write seen" and kill.delay > 0:
                    # Somewhere inside the write: a shard's delay, between shards and manifest, ...
                    reason = self._wait(child, kill.delay, began, kill) or "write seen"
        if reason == "ended":
            return
        ranks = job_ranks(child.pid, self.runner.options.job)
        while not ranks:  # an early start-up kill: mpirun has not started the ranks yet
            if child.poll() is not None or self.done.is_set():
                return
            time.sleep(0.002)
            ranks = job_ranks(child.pid, self.runner.options.job)
        pid = self.rng.choice(sorted(ranks))
        if kill.kind == "commit" and reason == "commit seen":
            pid = next((p for p, r in ranks.items() if r == 0), pid)  # process 0 cleans up
        kill.in_write = self.new_writes()
        kill.latest_step = latest_step(self.dir)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        kill.sent, kill.reason, kill.rank, kill.at = True, reason, ranks[pid], time.monotonic() - began

    def _wait_commit(self, child):
        baseline = latest_step(self.dir)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if child.poll() is not None or self.done.is_set():
                return "ended"
            if latest_step(self.dir) > baseline:
                return "commit seen"
            time.sleep(0.0005)
        return None

    def new_writes(self):
        return sorted(pending_files(self.dir) - self.leftovers)

    def mark_restored(self):
        self.leftovers |= pending_files(self.dir)
        self.restored.set()

    def stop(self):
        self.done.set()
        if self.thread is not None:
            self.thread.join(timeout=10)


# ---------------------------------------------------------------------------------------------
# Chaos runs

def validate_all(directory, defects):
    """Every complete checkpoint, read and checked; returns the whole ones, lowest step first.

    The newest must be whole (restore_latest() picks it): ChaosFailure otherwise. An older one
    that is not whole is recorded in `defects` (path -> why) and the run goes on, so that one run
    reports every such checkpoint; the case fails at its end."""
    whole = []
    complete = complete_checkpoints(directory)
    for i, (_, path) in enumerate(complete):
        try:
            whole.append(Checkpoint(path))
        except (ChaosFailure, OSError, ValueError, KeyError) as error:
            if i == len(complete) - 1:
                raise ChaosFailure(f"the newest complete checkpoint is not whole: {error}")
            defects.setdefault(path, str(error))
    return whole


def chaos_run(runner, processes, job_args, work, kills_wanted, rng, steps, check_end, slack):
    """The job under the supervisor's logic until `kills_wanted` kills were made; returns the statistics.

    job_args(checkpoint_dir, out) gives the job's arguments. A round runs the job from a fresh
    checkpoint directory until an attempt succeeds; check_end(out, checkpoint_dir) then checks its end
    state and says what it found. When a round ends before every kill was made (on a loaded machine
    the killer can fall behind the progress cap), another round follows."""
    stats = {"kills": 0, "in_write": 0, "attempts": 0, "restores": 0, "kinds": {}, "incomplete_seen": 0,
             "restored_steps": [], "rounds": 0, "verdicts": []}
    began = time.monotonic()
    while stats["kills"] < kills_wanted:
        stats["rounds"] += 1
        if stats["rounds"] > 5:
            raise ChaosFailure(f"{stats['kills']} of {kills_wanted} kills in 5 rounds")
        ckpt = fresh_dir(os.path.join(work, f"chaos-{stats['rounds']}"))
        out = os.path.join(work, f"chaos-{stats['rounds']}.safetensors")
        chaos_round(runner, processes, job_args(ckpt, out), ckpt, stats, kills_wanted, rng, steps, slack)
        verdict = check_end(out, ckpt)
        log(f"round {stats['rounds']} ended after {stats['kills']} kills in all: {verdict}")
        stats["verdicts"].append(verdict)
    stats["seconds"] = time.monotonic() - began
    return stats


def chaos_round(runner, processes, job_args, checkpoint_dir, stats, kills_wanted, rng, steps, slack):
    """Attempts of the job from `checkpoint_dir` until one succeeds, each killed while kills are due."""
    delayed = dict(runner.env)
    delayed[WRITE_DELAY_VARIABLE] = str(runner.options.write_delay_ms)
    restores = stats["restored_steps"]
    defects = {}
    max_attempts = kills_wanted + 6
    for number in range(1, max_attempts + 1):
        checkpoints = validate_all(checkpoint_dir, defects)
        expected = checkpoints[-1] if checkpoints else None
        stats["incomplete_seen"] += sum(
            1 for n in (os.listdir(checkpoint_dir) if os.path.isdir(checkpoint_dir) else [])
            if re.fullmatch(r"ckpt-\d+", n) and not os.path.isfile(os.path.join(checkpoint_dir, n, MANIFEST)))
        killing = stats["kills"] < kills_wanted
        # Progress cap: kill k comes at the latest when the job reached (k + 1) / (kills + 1) of its
        # steps plus `slack` (at once after the restore when it is already there), so that it mostly
        # cannot finish early; when it does, another round makes the remaining kills.
        cap = min(steps - 1, steps * (stats["kills"] + 1) // (kills_wanted + 1) + slack) if killing else steps + 1
        killer = Killer(runner, checkpoint_dir, rng, cap)
        kill = None
        if killing:
            kind = rng.choices(["startup", "random", "write", "commit"], weights=[0.1, 0.35, 0.4, 0.15])[0]
            delay = {"startup": rng.uniform(0.0, 0.8), "random": rng.uniform(0.0, 0.4), "commit": 0.0,
                     "write": rng.choice([0.0, rng.uniform(0.0, 2.0 * runner.options.write_delay_ms / 1000)])}[kind]
            kill = Kill(kind, delay)
        restore_lines = []

        def on_line(line, killer=killer, restore_lines=restore_lines):
            if line.startswith("restored step ") or line.startswith("no checkpoint in "):
                restore_lines.append(line)
                # Check the restored checkpoint now, while it is surely on disk.
                match = RESTORED.match(line)
                if match:
                    try:
                        Checkpoint(match.group(2))
                    except (ChaosFailure, OSError, ValueError, KeyError) as error:
                        restore_lines.append(f"INVALID: {error}")
                killer.mark_restored()

        def on_start(attempt, child, killer=killer, kill=kill):
            if kill is not None:
                killer.start(kill, child, time.monotonic())

        supervisor = supervise.Supervisor(runner.command(processes, job_args), timeout=LAUNCH_TIMEOUT_SECONDS,
                                          log=lambda text: None, stdout_line=on_line, on_start=on_start,
                                          # Writes are slowed only while kills are due (to be hit).
                                          env=delayed if killing else runner.env,
                                          echo_stderr=False)
        attempt = supervisor.run_attempt(number)
        killer.stop()
        stats["attempts"] += 1
        # The restore this attempt made: the newest complete checkpoint before it started.
        for line in restore_lines:
            if line.startswith("INVALID"):
                raise ChaosFailure(f"attempt {number} restored a checkpoint that is not whole: {line}")
        if restore_lines:
            match = RESTORED.match(restore_lines[0])
            if expected is None and match:
                raise ChaosFailure(f"attempt {number}: '{restore_lines[0]}' but no complete checkpoint existed")
            if expected is not None:
                if not match or int(match.group(1)) != expected.step or \
                        os.path.realpath(match.group(2)) != os.path.realpath(expected.path):
                    raise ChaosFailure(f"attempt {number}: '{restore_lines[0]}' but the newest complete "
                                       f"checkpoint was step {expected.step} at {expected.path}")
                stats["restores"] += 1
                restores.append(expected.step)
        sent = kill is not None and kill.sent
        if sent:
            stats["kills"] += 1
            stats["kinds"][kill.reason] = stats["kinds"].get(kill.reason, 0) + 1
            if kill.in_write:
                stats["in_write"] += 1
            log(f"kill {stats['kills']}/{kills_wanted}: attempt {number}, SIGKILL rank {kill.rank} at {kill.at:.2f} s "
                f"({kill.kind}: {kill.reason}); latest complete step {kill.latest_step}; "
                f"inside a write: {'yes ' + ','.join(kill.in_write[:2]) if kill.in_write else 'no'}; "
                f"attempt ended {attempt.status()} after {attempt.seconds:.2f} s")
        if attempt.succeeded:
            validate_all(checkpoint_dir, defects)
            if defects:
                raise ChaosFailure("older checkpoints had a manifest but were not whole (a crash while the "
                                   "retention deleted them, or worse):\n" +
                                   "\n".join(f"  {path}: {why}" for path, why in sorted(defects.items())))
            return
        if not sent:
            raise ChaosFailure(f"attempt {number} failed without being killed ({attempt.status()} after "
                               f"{attempt.seconds:.1f} s):\n" + "\n".join(attempt.stderr_tail))
    raise ChaosFailure(f"no attempt succeeded in {max_attempts}")


def fresh_dir(path):
    if os.path.exists(path):
        shutil.rmtree(path)
    os.makedirs(path)
    return path


def tree_digest(directory):
    """{relative path: CRC-32} of every file under `directory`."""
    digest = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            digest[os.path.relpath(path, directory)] = file_crc32(path)
    return digest


def compare_close(got, want, what, rtol=1e-5):
    """Every element within rtol of the reference, relative to the larger of the element and the
    tensor's root mean square (an element near zero is compared at the tensor's scale, where float
    reassociation puts its error). Returns the largest difference relative to that scale."""
    worst = 0.0
    for name, values in want.items():
        if name not in got or len(got[name]) != len(values):
            raise ChaosFailure(f"{what}: tensor {name} missing or of another size")
        rms = (sum(v * v for v in values) / max(len(values), 1)) ** 0.5
        for a, b in zip(got[name], values):
            scale = max(abs(b), rms, 1e-30)
            if abs(a - b) > rtol * scale:
                raise ChaosFailure(f"{what}: {name} differs: {a!r} against {b!r} (relative tolerance {rtol}, "
                                   f"scale {scale:.3g})")
            worst = max(worst, abs(a - b) / scale)
    return worst


def counters(checkpoint):
    """The parameter servers' optimizer step counters in a checkpoint: {tensor: [per piece]}."""
    return {name: values for name, values in checkpoint.tensors.items() if name.endswith("/iterations")}


def case_mirrored(runner, options, rng, work):
    steps, every = options.steps or 200, 5
    base = ["--mode", "mirrored", "--steps", steps, "--every-steps", every, "--seed", options.seed, "--keep", options.keep]
    ref_out = os.path.join(work, "reference.safetensors")
    *_, seconds = runner.run(2, base + ["--checkpoint-dir", fresh_dir(os.path.join(work, "reference")), "--out", ref_out])
    log(f"reference: {steps} steps uninterrupted in {seconds:.2f} s")
    reference = read_out(ref_out)
    params = {k: v for k, v in reference.items() if k not in ("final_loss", "optimizer_iterations")}

    def check_end(out, ckpt):
        got = read_out(out)
        worst = compare_close(got, params, "final parameters against the uninterrupted run")
        if got["optimizer_iterations"] != [steps]:
            raise ChaosFailure(f"the optimizer's step counter is {got['optimizer_iterations']}, not {steps}")
        return f"final parameters equal the reference (largest relative difference {worst:.3g}); step counter {steps}"

    stats = chaos_run(runner, 2, lambda ckpt, out: base + ["--checkpoint-dir", ckpt, "--resume", "--out", out], work,
                      options.kills, rng, steps, check_end, slack=2 * every)
    return stats, "; ".join(stats["verdicts"])


def case_ps(runner, options, rng, work):
    steps, every, servers, workers = options.steps or 60, 3, 2, 2
    base = ["--mode", "ps", "--servers", servers, "--steps", steps, "--every-steps", every, "--seed", options.seed,
            "--keep", options.keep]
    losses = []
    for i in range(3):
        out = os.path.join(work, f"reference-{i}.safetensors")
        *_, seconds = runner.run(servers + workers,
                                 base + ["--checkpoint-dir", fresh_dir(os.path.join(work, f"reference-{i}")), "--out", out])
        losses.append(read_out(out)["final_loss"][0])
        log(f"reference {i}: {steps} steps per worker uninterrupted in {seconds:.2f} s, loss {losses[-1]:.6f}")
    low, high = min(losses), max(losses)
    margin = (high - low) + 0.05 * sum(losses) / len(losses)

    def check_end(out, ckpt):
        final = Checkpoint(complete_checkpoints(ckpt)[-1][1])
        found = counters(final)
        if final.step != steps or not found:
            raise ChaosFailure(f"{final.path}: step {final.step} (not {steps}) or no optimizer step counters")
        for name, values in found.items():
            if any(v != workers * steps for v in values):
                raise ChaosFailure(f"{final.path}: {name} = {values}, not workers x steps = {workers * steps} "
                                   "on every piece")
        loss = read_out(out)["final_loss"][0]
        if not low - margin <= loss <= high + margin:
            raise ChaosFailure(f"final loss {loss:.6f} outside the uninterrupted runs' {low:.6f}..{high:.6f} "
                               f"(widened by {margin:.6f})")
        return (f"{len(found)} step counters all {workers * steps}; final loss {loss:.6f} within "
                f"{low:.6f}..{high:.6f} +- {margin:.6f}")

    stats = chaos_run(runner, servers + workers,
                      lambda ckpt, out: base + ["--checkpoint-dir", ckpt, "--resume", "--out", out], work,
                      options.kills, rng, steps, check_end, slack=2 * every)
    return stats, "; ".join(stats["verdicts"])


def case_mirrored_reshape(runner, options, rng, work):
    steps, every = options.steps or 60, 5
    base = ["--mode", "mirrored", "--every-steps", every, "--seed", options.seed]
    ref_out = os.path.join(work, "reference.safetensors")
    runner.run(2, base + ["--steps", steps, "--checkpoint-dir", fresh_dir(os.path.join(work, "reference")), "--out", ref_out])
    ckpt = fresh_dir(os.path.join(work, "reshape"))
    half = steps // 2
    runner.run(2, base + ["--steps", half, "--checkpoint-dir", ckpt])
    saved = Checkpoint(complete_checkpoints(ckpt)[-1][1])
    if saved.step != half or saved.processes != 2:
        raise ChaosFailure(f"{saved.path}: step {saved.step} by {saved.processes} processes, not {half} by 2")
    dump, out = os.path.join(work, "restored.safetensors"), os.path.join(work, "resumed.safetensors")
    _, stdout, _, _ = runner.run(1, base + ["--steps", steps, "--checkpoint-dir", ckpt, "--resume",
                                            "--dump-restored", dump, "--out", out])
    if f"restored step {half} from " not in stdout:
        raise ChaosFailure(f"the 1-process run did not restore step {half}:\n{stdout}")
    restored = read_out(dump)
    for name, values in restored.items():
        if saved.tensors.get(name) != values:
            raise ChaosFailure(f"{name} after the restore on 1 process differs from the checkpoint of 2")
    reference = read_out(ref_out)
    params = {k: v for k, v in reference.items() if k not in ("final_loss", "optimizer_iterations")}
    worst = compare_close(read_out(out), params, "saved by 2, resumed by 1, against 2 uninterrupted")
    return {}, (f"saved by 2 processes at step {half}, resumed by 1: restored values equal the checkpoint's; "
                f"final parameters equal the 2-process reference (largest relative difference {worst:.3g})")


def case_ps_reshape(runner, options, rng, work):
    steps, every = options.steps or 20, 2
    half = steps // 2
    base = ["--mode", "ps", "--every-steps", every, "--seed", options.seed]
    ckpt = fresh_dir(os.path.join(work, "reshape"))
    runner.run(4, base + ["--servers", 2, "--steps", half, "--checkpoint-dir", ckpt])
    saved = Checkpoint(complete_checkpoints(ckpt)[-1][1])
    refused_dir = os.path.join(work, "refused")
    if os.path.exists(refused_dir):
        shutil.rmtree(refused_dir)
    shutil.copytree(ckpt, refused_dir)
    # 2 servers -> 3 servers, 2 workers: continues, the restored values are the saved ones.
    dump, out = os.path.join(work, "restored.safetensors"), os.path.join(work, "resumed.safetensors")
    _, stdout, _, _ = runner.run(5, base + ["--servers", 3, "--steps", steps, "--checkpoint-dir", ckpt, "--resume",
                                            "--dump-restored", dump, "--out", out])
    if f"restored step {half} from " not in stdout:
        raise ChaosFailure(f"the 3-server run did not restore step {half}:\n{stdout}")
    restored = read_out(dump)
    for name, values in restored.items():
        if saved.tensors.get(name) != values:
            raise ChaosFailure(f"{name} after the restore on 3 servers differs from the checkpoint of 2")
    final = Checkpoint(complete_checkpoints(ckpt)[-1][1])
    if final.step != steps:
        raise ChaosFailure(f"{final.path}: the resumed run ended at step {final.step}, not {steps}")
    for name, values in counters(final).items():
        if any(v != 2 * steps for v in values):
            raise ChaosFailure(f"{final.path}: {name} = {values} after 2 -> 3 servers, not {2 * steps}")
    # Another worker count: refused with a clear message, the checkpoint untouched.
    before = tree_digest(refused_dir)
    code, stdout, stderr, _ = runner.run(4, base + ["--servers", 1, "--steps", steps, "--checkpoint-dir", refused_dir,
                                                    "--resume"], expect_success=False)
    message = next((line for line in stderr.splitlines() if "error" in line), "")
    if code == 0 or "worker" not in message.lower() or message.startswith("chaos_job: error") and \
            "chaos_job: checkpoint" in message:
        raise ChaosFailure(f"resuming 2 workers' checkpoint with 3 workers: exit {code}, message {message!r}\n{stderr}")
    after = tree_digest(refused_dir)
    if after != before:
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        raise ChaosFailure(f"the refused restore changed the checkpoint directory: {changed}")
    return {}, (f"2 -> 3 servers: restored values equal the saved ones, finished at step {steps} with counters "
                f"{2 * steps}; 2 -> 3 workers refused: {message.strip()}")


CASES = {"mirrored": case_mirrored, "ps": case_ps, "mirrored-reshape": case_mirrored_reshape,
         "ps-reshape": case_ps_reshape}


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--job", required=True, help="the chaos_job executable")
    parser.add_argument("--mpirun", default=shutil.which("mpirun") or "mpirun")
    parser.add_argument("--work-dir", default=None, help="where checkpoints go (default: a new temporary directory)")
    parser.add_argument("--seed", type=int, default=None, help="replays a run (default: from the clock)")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=0, help="override the case's steps")
    parser.add_argument("--keep", type=int, default=3, help="the job's max_to_keep (retention deletes older ones)")
    parser.add_argument("--write-delay-ms", type=int, default=40,
                        help=f"{WRITE_DELAY_VARIABLE} during chaos runs (how long a write lasts at least)")
    options = parser.parse_args(argv)
    if options.seed is None:
        options.seed = int(time.time() * 1000) % 1_000_000
    options.job = os.path.abspath(options.job)
    if not os.access(options.job, os.X_OK):
        parser.error(f"--job {options.job} is not an executable")
    work = options.work_dir or os.path.join("/tmp", f"flowlet-chaos-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    log(f"case {options.case}, seed {options.seed} (replay: --seed {options.seed}), work directory {work}")
    supervise.become_subreaper()
    rng = random.Random(options.seed)
    began = time.monotonic()
    try:
        stats, verdict = CASES[options.case](Runner(options), options, rng, work)
    except ChaosFailure as error:
        log(f"FAIL ({options.case}, seed {options.seed}): {error}")
        return 1
    took = time.monotonic() - began
    if stats:
        log(f"{stats['kills']} kills ({stats['in_write']} inside a checkpoint write; triggers {stats['kinds']}), "
            f"{stats['rounds']} rounds, {stats['attempts']} attempts, {stats['restores']} restores checked (steps {stats['restored_steps']}), "
            f"{stats['incomplete_seen']} incomplete checkpoint directories seen between attempts; "
            f"chaos phase {stats['seconds']:.1f} s")
    log(f"ok ({options.case}, seed {options.seed}, {took:.1f} s): {verdict}")
    if options.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
