#!/usr/bin/env python3
"""The demo's MLP trained by PyTorch (eager or torch.compile): one peer of the time-to-accuracy script.

Trains what `make demo` trains (examples/fashion_mnist_mlp.hpp): 784-256-10 with ReLU, both layers
Glorot-uniform weights and zero biases, mean softmax cross-entropy, Adam (lr 1e-3, betas 0.9 and
0.999, eps 1e-7 as flowlet's default), batch 128 with a smaller last batch, a new shuffle of the
60000 training images every epoch (torch.randperm), each batch gathered by index, the batch loss
read back every step (the demo's progress bar does the same), the 10000 test images evaluated
after every epoch. Run by benchmarks/training/time_to_accuracy.sh; by hand:

  build/torch-venv/bin/python benchmarks/peers/torch_mlp.py --mode eager|compile [--epochs 8]
      [--threads 2] [--batch-size 128] [--lr 1e-3] [--seed 1] [--data DIR]

Prints progress on stderr and ONE JSON line on stdout:
  {"system", "version", "threads", "epochs", "train_s", "first_steps_s", "eval_s", "accuracy",
   "epoch_train_s": [...]}
train_s: wall seconds of the training loops, evaluations excluded and the first step of each epoch
and of each batch shape excluded (torch.compile compiles or recompiles there; eager is timed the
same way); those first steps are first_steps_s. On failure (no torch, compile error) it prints {"system": ..., "error": ...}, exits 1.
"""
import argparse
import gzip
import json
import os
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"


def load(split, data_dir):
    import numpy as np

    prefix = "train" if split == "train" else "t10k"

    def read(name, offset):
        path = os.path.join(data_dir, name)
        opener = gzip.open if os.path.exists(path + ".gz") else open
        with opener(path + ".gz" if os.path.exists(path + ".gz") else path, "rb") as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)

    images = read(f"{prefix}-images-idx3-ubyte", 16).reshape(-1, 784)
    labels = read(f"{prefix}-labels-idx1-ubyte", 8)
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def run(args):
    import torch
    from torch import nn

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_train, y_train = (torch.from_numpy(a) for a in load("train", args.data))
    x_test, y_test = (torch.from_numpy(a) for a in load("test", args.data))

    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
    for layer in (model[0], model[2]):
        nn.init.xavier_uniform_(layer.weight)
        nn.init.zeros_(layer.bias)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    forward = torch.compile(model, dynamic=False) if args.mode == "compile" else model

    def step(x, y):
        loss = loss_fn(forward(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.item()

    def accuracy():
        with torch.no_grad():
            correct = (forward(x_test).argmax(1) == y_test).sum().item()
        return correct / len(x_test)

    n = len(x_train)
    seen_shapes = set()
    train_s = first_steps_s = eval_s = 0.0
    epoch_train_s = []
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        order = torch.randperm(n)
        loss_sum = 0.0
        epoch_start = time.perf_counter()
        first_in_epoch = 0.0
        for first in range(0, n, args.batch_size):
            index = order[first:first + args.batch_size]
            # Timed apart: the first step of a batch shape (torch.compile compiles there) and of an
            # epoch (it recompiles after the evaluation); eager is timed the same way.
            if len(index) not in seen_shapes or first == 0:
                seen_shapes.add(len(index))
                t = time.perf_counter()
                loss_sum += step(x_train[index], y_train[index]) * len(index)
                first_in_epoch += time.perf_counter() - t
                continue
            loss_sum += step(x_train[index], y_train[index]) * len(index)
        seconds = time.perf_counter() - epoch_start - first_in_epoch
        first_steps_s += first_in_epoch
        train_s += seconds
        epoch_train_s.append(round(seconds, 4))
        t = time.perf_counter()
        acc = accuracy()
        eval_s += time.perf_counter() - t
        print(f"  {args.mode} epoch {epoch}: loss {loss_sum / n:.4f}  test accuracy {acc:.4f}  ({seconds:.2f} s)",
              file=sys.stderr, flush=True)
    return {"version": torch.__version__, "threads": torch.get_num_threads(), "epochs": args.epochs,
            "train_s": round(train_s, 4), "first_steps_s": round(first_steps_s, 4), "eval_s": round(eval_s, 4),
            "accuracy": acc, "epoch_train_s": epoch_train_s}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mode", choices=["eager", "compile"], default="eager")
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    system = "PyTorch eager" if args.mode == "eager" else "torch.compile"
    try:
        result = run(args)
    except Exception as error:  # noqa: BLE001 - a peer that fails is reported, the script goes on
        print(json.dumps({"system": system, "error": f"{type(error).__name__}: {error}"[:500]}), flush=True)
        sys.exit(1)
    print(json.dumps({"system": system, **result}), flush=True)


if __name__ == "__main__":
    main()
