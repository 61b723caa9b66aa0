#!/usr/bin/env python3
"""The demo's --model cnn in a short run (meson test 'example demo cnn'): trains 1 epoch of a few
steps, then --resume to epoch 2 on the same folder, and checks what a user sees: the model line,
the progress bar, per-epoch test accuracy, "resumed from epoch 1", the CSV (one row per epoch run,
the accuracy above chance), the SVG, the checkpoint folder, and that an unknown --model is refused
with a message naming it.

Usage: demo_cnn_check.py DEMO [--data DIR]
"""
import csv
import os
import subprocess
import sys
import tempfile

# Per run; `make asan` / `make tsan` scale it (FLOWLET_TEST_TIME_SCALE) as they scale meson's timeouts.
LIMIT_SECONDS = 120 * float(os.environ.get("FLOWLET_TEST_TIME_SCALE", "1"))


def run(command, expect_success=True):
    result = subprocess.run(command, capture_output=True, text=True, timeout=LIMIT_SECONDS)
    print(f"$ {' '.join(command)}   # exit {result.returncode}")
    print(result.stdout + result.stderr)
    if expect_success and result.returncode != 0:
        sys.exit(f"FAIL: exited {result.returncode}")
    if not expect_success and result.returncode == 0:
        sys.exit("FAIL: succeeded; it should have been refused")
    return result.stdout + result.stderr


def expect(condition, what):
    if not condition:
        sys.exit(f"FAIL: {what}")


def main():
    demo = sys.argv[1]
    extra = sys.argv[2:]
    with tempfile.TemporaryDirectory(prefix="demo_cnn_") as out:
        short = [demo, "--model", "cnn", "--max-steps", "12", "--test-examples", "2000", "--compare-steps", "2",
                 "--out", out] + extra
        first = run(short + ["--epochs", "1"])
        expect("model: CNN" in first, "the model line names the CNN")
        expect("step time over 2 steps (2 interleaved rounds of 1, median): eager" in first, "the eager/traced comparison ran")
        expect("epoch 1/1 [" in first and "1536/60000" in first, "the progress bar shows the 12 steps run")
        expect("test accuracy" in first, "an evaluation after the epoch")
        expect(os.path.isdir(os.path.join(out, "checkpoints")), "a checkpoint folder")
        second = run(short + ["--epochs", "2", "--resume"])
        expect("resumed from epoch 1" in second, "--resume continues after epoch 1")
        with open(os.path.join(out, "fashion_mnist_cnn.csv")) as f:
            rows = list(csv.DictReader(f))
        expect([r["epoch"] for r in rows] == ["2"], f"the resumed run wrote epoch 2 only; got {rows}")
        accuracy = float(rows[0]["test_accuracy"])
        expect(accuracy > 0.4, f"24 steps of Adam lift test accuracy well above chance (0.1); got {accuracy}")
        expect(os.path.getsize(os.path.join(out, "fashion_mnist_cnn.svg")) > 0, "the SVG chart")
        refused = run([demo, "--model", "resnet", "--out", out] + extra, expect_success=False)
        expect("--model takes mlp or cnn; got 'resnet'" in refused, "an unknown model is refused by name")
    print("OK")


if __name__ == "__main__":
    main()
