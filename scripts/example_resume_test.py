#!/usr/bin/env python3
"""Checks that the examples resume from their checkpoints: a run stopped part-way, then --resume on
the same directory, must say where it resumed and end where an uninterrupted run ends.

Usage: example_resume_test.py mirrored PROGRAM [--mpirun MPIRUN]
       example_resume_test.py ps PROGRAM [--mpirun MPIRUN]

mirrored (examples/mirrored_fashion_mnist): an uninterrupted run of 2 epochs x 6 steps gives the
reference model checksum; a run stopped after 8 global steps with a checkpoint every 3 steps (and
--keep 2) must leave exactly the checkpoints of steps 6 and 8; --resume must say "resumed from
checkpoint .../ckpt-000008 at step 8 (epoch 2, batch 2)" and end with the reference checksum (same
shape: equal up to the last printed digit; on 1 replica instead of 2, within float reassociation).
A resume with another batch size is refused, and --resume on an empty directory starts fresh. With
--mpirun the stopped run is `mpirun -np 2` and the resumes run in one process (saved by 2, resumed on 1).

ps (examples/ps_embedding, a small vocabulary whose table is still split, synchronous steps): an
uninterrupted run of 30 steps per worker gives the reference test accuracy and AUC; 20 steps per
worker in chunks of 10 leave the checkpoints of steps 40 and 80 (4 workers); --resume with 3
servers instead of 2 and --steps 30 must say "at step 80 (next step of workers 0..3: 20, 20, 20,
20)", finish the 40 remaining worker steps, test like the reference (AUC within 0.002, accuracy
within 0.003) and leave checkpoint 120. A resume with 3 workers is refused with the library's
message ("written by a job of 4 workers; this job has 3"). With --mpirun: the first run is
`mpirun -np 6` (2 servers + 4 workers), the resume `mpirun -np 7 --servers 3`, the refused one
`mpirun -np 5`.

Every run has a time limit (a hang fails the test). Exit 0 when every check passed.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# Per run; `make asan` / `make tsan` scale it (FLOWLET_TEST_TIME_SCALE) as they scale meson's timeouts.
LIMIT_SECONDS = 60 * float(os.environ.get("FLOWLET_TEST_TIME_SCALE", "1"))
failures = []


def run(command, expect_success=True):
    """Runs `command` in its own process group; returns (exit status, output). A hang is a failure."""
    begin = time.monotonic()
    job = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = job.communicate(timeout=LIMIT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        output = output.decode(errors="replace")
        print(output)
        sys.exit(f"FAIL: {' '.join(command)} still ran after {LIMIT_SECONDS} s (a hang)")
    output = output.decode(errors="replace")
    print(f"$ {' '.join(command)}   # exit {job.returncode}, {time.monotonic() - begin:.1f} s")
    print(output)
    if expect_success and job.returncode != 0:
        sys.exit(f"FAIL: {' '.join(command)} exited {job.returncode}")
    if not expect_success and job.returncode == 0:
        failures.append(f"{' '.join(command)} succeeded; it should have been refused")
    return job.returncode, output


def check(condition, what):
    print(("ok: " if condition else "FAIL: ") + what)
    if not condition:
        failures.append(what)


def complete_checkpoints(directory):
    """The steps of the complete checkpoints in `directory` (those with a manifest)."""
    steps = []
    for name in os.listdir(directory):
        match = re.fullmatch(r"ckpt-(\d+)", name)
        if match and os.path.isfile(os.path.join(directory, name, "manifest.json")):
            steps.append(int(match.group(1)))
    return sorted(steps)


def checksum(output):
    match = re.search(r"model checksum (\S+) after (\d+) global steps", output)
    if not match:
        sys.exit("FAIL: no 'model checksum' line in the output")
    return float(match.group(1)), int(match.group(2))


def launcher(mpirun, processes):
    return [] if mpirun is None or processes is None else [mpirun, "--oversubscribe", "-np", str(processes)]


def mirrored(program, mpirun, work):
    common = ["--epochs", "2", "--steps", "6"]
    # Under mpirun one replica per process (2 in all); in one process 2 logical devices.
    first = launcher(mpirun, 2) + [program] + common + ([] if mpirun else ["--replicas", "2"])
    resume_here = [program] + common + ["--replicas", "2"]

    reference = os.path.join(work, "reference")
    _, output = run([program] + common + ["--replicas", "2", "--checkpoint-dir", reference])
    reference_sum, reference_steps = checksum(output)
    check(reference_steps == 12, f"the uninterrupted run took 12 global steps (got {reference_steps})")

    stopped = os.path.join(work, "stopped")
    run(first + ["--max-steps", "8", "--checkpoint-dir", stopped, "--checkpoint-every-steps", "3", "--keep", "2"])
    check(complete_checkpoints(stopped) == [6, 8],
          f"the stopped run left the checkpoints of steps 6 and 8 (got {complete_checkpoints(stopped)})")
    other_shape = os.path.join(work, "other-shape")
    shutil.copytree(stopped, other_shape)

    _, output = run(resume_here + ["--checkpoint-dir", stopped, "--resume"])
    saved_by = 2 if mpirun else 1
    expected = (f"resumed from checkpoint {os.path.join(stopped, 'ckpt-000008')} at step 8 (epoch 2, batch 2), "
                f"saved by {saved_by} process(es)")
    check(expected in output, f"the resumed run says '{expected}'")
    resumed_sum, resumed_steps = checksum(output)
    check(resumed_steps == 12, f"the resumed run ended after 12 global steps (got {resumed_steps})")
    # Under mpirun the first 8 steps ran on 2 processes (the same replicas, the same sums), so the
    # result is the same up to float reassociation at most.
    tolerance = 1e-5 if mpirun else 1e-8
    check(abs(resumed_sum - reference_sum) <= tolerance * abs(reference_sum),
          f"the resumed model equals the uninterrupted one: checksum {resumed_sum!r} vs {reference_sum!r}")

    _, output = run([program] + common + ["--replicas", "1", "--checkpoint-dir", other_shape, "--resume"])
    check("at step 8 (epoch 2, batch 2)" in output, "1 replica resumes the checkpoint of 2 at step 8")
    other_sum, other_steps = checksum(output)
    check(other_steps == 12 and abs(other_sum - reference_sum) <= 1e-4 * abs(reference_sum),
          "on 1 replica the model ends within float reassociation of the reference: "
          f"{other_sum!r} vs {reference_sum!r}")

    status, output = run(resume_here + ["--batch-size", "64", "--checkpoint-dir", stopped, "--resume"],
                         expect_success=False)
    check(status != 0 and "was saved with batch size 128" in output, "a resume with another batch size is refused")

    _, output = run(resume_here + ["--checkpoint-dir", os.path.join(work, "empty"), "--resume", "--max-steps", "2"])
    check("starting fresh" in output, "--resume without a checkpoint starts fresh and says so")


def test_figures(output):
    match = re.search(r"test set of \d+: accuracy (\S+) .*AUC (\S+) ", output)
    if not match:
        sys.exit("FAIL: no 'test set' line in the output")
    return float(match.group(1)), float(match.group(2))


def ps(program, mpirun, work):
    # Synchronous steps, so that an uninterrupted run is a reference to compare with (each step
    # averages every worker's gradient: the same up to the order of the sum).
    tiny = ["--vocab", "20000", "--batch-size", "128", "--mode", "sync"]  # 80,000 rows: split
    directory = os.path.join(work, "ps")
    in_process_workers = [] if mpirun else ["--workers", "4"]
    _, output = run(launcher(mpirun, 6) + [program] + tiny + in_process_workers + ["--steps", "30"])
    reference_accuracy, reference_auc = test_figures(output)
    run(launcher(mpirun, 6) + [program] + tiny + in_process_workers +
        ["--steps", "20", "--checkpoint-dir", directory, "--checkpoint-every-steps", "10"])
    check(complete_checkpoints(directory) == [40, 80],
          f"20 steps x 4 workers in chunks of 10 left checkpoints 40 and 80 (got {complete_checkpoints(directory)})")
    refused_copy = os.path.join(work, "ps-refused")
    shutil.copytree(directory, refused_copy)

    _, output = run(launcher(mpirun, 7) + [program] + tiny + in_process_workers +
                    ["--servers", "3", "--steps", "30", "--checkpoint-dir", directory, "--resume"])
    expected = (f"resumed from checkpoint {os.path.join(directory, 'ckpt-000080')} at step 80 "
                "(next step of workers 0..3: 20, 20, 20, 20)")
    check(expected in output, f"the resumed run says '{expected}'")
    check(re.search(r"^40 worker steps in", output, re.M) is not None, "the resumed run took the 40 remaining steps")
    check(complete_checkpoints(directory)[-1:] == [120],
          f"the resumed run's last checkpoint is 120 (got {complete_checkpoints(directory)})")
    # Without the servers' Adagrad accumulators (or with a model from another step) the AUC moves by
    # about 0.007 here; float reassociation moves it by far less.
    accuracy, auc = test_figures(output)
    check(abs(auc - reference_auc) <= 0.002 and abs(accuracy - reference_accuracy) <= 0.003,
          f"the resumed model tests like the uninterrupted one: accuracy {accuracy} vs {reference_accuracy}, "
          f"AUC {auc} vs {reference_auc}")

    status, output = run(launcher(mpirun, 5) + [program] + tiny + (["--workers", "3"] if not mpirun else []) +
                         ["--steps", "30", "--checkpoint-dir", refused_copy, "--resume"], expect_success=False)
    check(status != 0 and "written by a job of 4 workers; this job has 3" in output,
          "a resume with 3 workers instead of 4 is refused, the message says why")
    check(complete_checkpoints(refused_copy) == [40, 80], "the refused resume left the checkpoints alone")


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("mirrored", "ps"):
        print(__doc__)
        return 2
    kind, program = sys.argv[1], os.path.abspath(sys.argv[2])
    mpirun = None
    if len(sys.argv) == 5 and sys.argv[3] == "--mpirun":
        mpirun = sys.argv[4]
    elif len(sys.argv) != 3:
        print(__doc__)
        return 2
    with tempfile.TemporaryDirectory(prefix=f"flowlet-resume-{kind}-") as work:
        (mirrored if kind == "mirrored" else ps)(program, mpirun, work)
    if failures:
        print(f"FAIL: {len(failures)} check(s) failed:\n  " + "\n  ".join(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
