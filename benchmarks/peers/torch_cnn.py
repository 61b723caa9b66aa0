#!/usr/bin/env python3
"""Time to accuracy of the demo's CNN: PyTorch (CPU, eager) against flowlet's `demo --model cnn`.

Both figures come from one run of this script on the same machine and data (Debian's
dataset-fashion-mnist), with the same thread count (torch.set_num_threads(N) and
FLOWLET_NUM_THREADS=N, default 2): PyTorch trains the same model (examples/fashion_mnist_cnn.hpp:
conv 5x5 32 same, no bias - batch norm - relu - max pool 2 - conv 5x5 64 same, no bias - batch norm
- relu - max pool 2 - dense 10), the same initialisation scheme (convolutions PyTorch's default uniform(+-1/sqrt(fan_in)), the dense layer
Glorot uniform with zero bias), Adam with the same learning rate and batch size, a new shuffle per
epoch and evaluation on the 10000 test images after every epoch in inference mode; then the
script runs flowlet's demo as a subprocess and reads its CSV. Weights and batch order are not
the same bit for bit (different random streams).

Time to accuracy counts wall seconds from the start of training to the end of the first
evaluation at or above --target, evaluations included, as the demo does.

  build/torch-venv/bin/python benchmarks/peers/torch_cnn.py [--demo build/dev/examples/demo]
      [--epochs 3] [--target 0.91] [--threads 2] [--lr 1e-3] [--batch-size 128] [--skip-flowlet]
      [--stop-at-target] [--json out.json]

The venv comes from benchmarks/peers/setup_torch_venv.sh (CPU PyTorch from its wheel index).
"""
import argparse
import csv
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

DATA = "/usr/share/datasets/fashion-mnist"


def load(split, data_dir):
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def torch_run(args):
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_train, y_train = (torch.from_numpy(a) for a in load("train", args.data))
    x_test, y_test = (torch.from_numpy(a) for a in load("test", args.data))

    model = nn.Sequential(
        nn.Conv2d(1, 32, 5, padding="same", bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding="same", bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 10))
    dense = model[-1]
    nn.init.xavier_uniform_(dense.weight)
    nn.init.zeros_(dense.bias)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    def accuracy():
        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, len(x_test), 2000):
                logits = model(x_test[start:start + 2000])
                correct += (logits.argmax(1) == y_test[start:start + 2000]).sum().item()
        model.train()
        return correct / len(x_test)

    epochs, reached = [], None
    n = len(x_train)
    start = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        epoch_start = time.perf_counter()
        order = torch.randperm(n)
        loss_sum = 0.0
        for first in range(0, n, args.batch_size):
            index = order[first:first + args.batch_size]
            loss = loss_fn(model(x_train[index]), y_train[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(index)
        epoch_seconds = time.perf_counter() - epoch_start
        acc = accuracy()
        if reached is None and acc >= args.target:
            reached = (epoch, time.perf_counter() - start)
        epochs.append({"epoch": epoch, "train_loss": loss_sum / n, "test_accuracy": acc, "seconds": epoch_seconds})
        print(f"  torch   epoch {epoch}: loss {loss_sum / n:.4f}  test accuracy {acc:.4f}  ({epoch_seconds:.1f} s)",
              flush=True)
        if reached and args.stop_at_target:
            break
    return {"version": torch.__version__, "epochs": epochs, "reached": reached}


def flowlet_run(args):
    env = dict(os.environ, FLOWLET_NUM_THREADS=str(args.threads))
    with tempfile.TemporaryDirectory(prefix="torch_cnn_flowlet_") as out:
        command = [args.demo, "--model", "cnn", "--epochs", str(args.epochs), "--lr", str(args.lr), "--batch-size",
                   str(args.batch_size), "--target", str(args.target), "--compare-steps", "0", "--out", out,
                   "--data", args.data] + (["--stop-at-target"] if args.stop_at_target else [])
        print("  " + " ".join(command), flush=True)
        result = subprocess.run(command, env=env, capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"torch_cnn.py: flowlet's demo failed ({result.returncode}):\n{result.stdout[-2000:]}{result.stderr}")
        epochs = []
        with open(os.path.join(out, "fashion_mnist_cnn.csv")) as f:
            for row in csv.DictReader(f):
                epochs.append({"epoch": int(row["epoch"]), "train_loss": float(row["train_loss"]),
                               "test_accuracy": float(row["test_accuracy"]), "seconds": float(row["seconds"])})
        for e in epochs:
            print(f"  flowlet epoch {e['epoch']}: loss {e['train_loss']:.4f}  test accuracy {e['test_accuracy']:.4f}  "
                  f"({e['seconds']:.1f} s)", flush=True)
        match = re.search(r"time to [0-9.]+: epoch (\d+) after ([0-9.]+) s", result.stdout)
        reached = (int(match.group(1)), float(match.group(2))) if match else None
    return {"epochs": epochs, "reached": reached}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--demo", default="build/dev/examples/demo")
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.91)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-flowlet", action="store_true")
    parser.add_argument("--stop-at-target", action="store_true", help="end each run at its first epoch at the target")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()

    try:
        import torch  # noqa: F401
    except ImportError:
        sys.exit("torch_cnn.py: PyTorch peer: not available (run benchmarks/peers/setup_torch_venv.sh, then "
                 "this script with build/torch-venv/bin/python)")

    print(f"CNN on Fashion-MNIST, {args.epochs} epochs, batch {args.batch_size}, Adam lr {args.lr}, "
          f"{args.threads} threads, target {args.target}", flush=True)
    results = {}
    if not args.skip_flowlet:  # first: the demo's figures are the ones this script exists for
        results["flowlet"] = flowlet_run(args)
    results["torch"] = torch_run(args)

    def mean_epoch(r):
        return sum(e["seconds"] for e in r["epochs"]) / len(r["epochs"])

    def reached(r):
        return f"epoch {r['reached'][0]}, {r['reached'][1]:.1f} s" if r["reached"] else "not reached"

    print(f"\n{'':10}{'epoch time':>12}  {'final acc':>9}  time to {args.target}")
    for name, r in results.items():
        print(f"{name:10}{mean_epoch(r):>10.1f} s  {r['epochs'][-1]['test_accuracy']:>9.4f}  {reached(r)}")
    if "flowlet" in results:
        f, t = results["flowlet"], results["torch"]
        print(f"flowlet / torch epoch time: {mean_epoch(f) / mean_epoch(t):.2f}x", end="")
        if f["reached"] and t["reached"]:
            print(f"; time to {args.target}: {f['reached'][1] / t['reached'][1]:.2f}x", end="")
        print()
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    main()
