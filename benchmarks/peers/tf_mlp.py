#!/usr/bin/env python3
"""The demo's MLP trained by TensorFlow as tf.function + XLA: one peer of the time-to-accuracy script.

The same model, data order policy and hyperparameters as benchmarks/peers/torch_mlp.py (which says
them): 784-256-10 ReLU, Glorot-uniform weights and zero biases, mean sparse softmax cross-entropy,
Adam in Keras's form (flowlet's: m, v, w -= lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps),
eps 1e-7) written with tf ops so that the whole step (forward, gradients, update) is one
tf.function(jit_compile=True); a new shuffle every epoch (tf.random.shuffle of the indices), each
batch gathered by index, the loss read back every step, the test set evaluated after every epoch.

  build/tf-venv/bin/python benchmarks/peers/tf_mlp.py [--epochs 8] [--threads 2] [--batch-size 128]
      [--lr 1e-3] [--seed 1] [--data DIR] [--no-xla]

Prints progress on stderr and ONE JSON line on stdout, with the keys of torch_mlp.py; the first
call of each epoch and of each batch shape (XLA compiles there) is timed apart as first_steps_s.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported

import argparse
import gzip
import json
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"


def load(split, data_dir):
    import numpy as np

    prefix = "train" if split == "train" else "t10k"

    def read(name, offset):
        path = os.path.join(data_dir, name)
        if os.path.exists(path + ".gz"):
            with gzip.open(path + ".gz", "rb") as f:
                return np.frombuffer(f.read(), np.uint8, offset=offset)
        with open(path, "rb") as f:
            return np.frombuffer(f.read(), np.uint8, offset=offset)

    images = read(f"{prefix}-images-idx3-ubyte", 16).reshape(-1, 784)
    labels = read(f"{prefix}-labels-idx1-ubyte", 8)
    return images.astype(np.float32) / 255.0, labels.astype(np.int64)


def run(args):
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    tf.random.set_seed(args.seed)
    x_np, y_np = load("train", args.data)
    xt_np, yt_np = load("test", args.data)
    x_train, y_train = tf.constant(x_np), tf.constant(y_np)
    x_test, y_test = tf.constant(xt_np), tf.constant(yt_np)

    rng = np.random.default_rng(args.seed)

    def glorot(fan_in, fan_out):
        limit = np.sqrt(6.0 / (fan_in + fan_out))
        return tf.Variable(rng.uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32))

    params = [glorot(784, 256), tf.Variable(tf.zeros([256])), glorot(256, 10), tf.Variable(tf.zeros([10]))]
    m = [tf.Variable(tf.zeros_like(p)) for p in params]
    v = [tf.Variable(tf.zeros_like(p)) for p in params]
    t = tf.Variable(0.0)
    lr, b1, b2, eps = args.lr, 0.9, 0.999, 1e-7

    def logits_of(x):
        h = tf.nn.relu(tf.matmul(x, params[0]) + params[1])
        return tf.matmul(h, params[2]) + params[3]

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits_of(x)))
        grads = tape.gradient(loss, params)
        t.assign_add(1.0)
        scale = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
        for p, g, mi, vi in zip(params, grads, m, v):
            mi.assign(b1 * mi + (1.0 - b1) * g)
            vi.assign(b2 * vi + (1.0 - b2) * tf.square(g))
            p.assign_sub(scale * mi / (tf.sqrt(vi) + eps))
        return loss

    def correct(x, y):
        return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits_of(x), 1), y), tf.int64))

    step = tf.function(step, jit_compile=not args.no_xla)
    correct = tf.function(correct, jit_compile=not args.no_xla)

    n = x_np.shape[0]
    seen_shapes = set()
    train_s = first_steps_s = eval_s = 0.0
    epoch_train_s = []
    acc = 0.0
    for epoch in range(1, args.epochs + 1):
        order = tf.random.shuffle(tf.range(n, dtype=tf.int64))
        loss_sum = 0.0
        epoch_start = time.perf_counter()
        first_in_epoch = 0.0
        for first in range(0, n, args.batch_size):
            index = order[first:first + args.batch_size]
            size = min(args.batch_size, n - first)
            timed_apart = size not in seen_shapes or first == 0  # as torch_mlp.py
            begin = time.perf_counter()
            loss = step(tf.gather(x_train, index), tf.gather(y_train, index))
            loss_sum += float(loss) * size
            if timed_apart:
                seen_shapes.add(size)
                first_in_epoch += time.perf_counter() - begin
        seconds = time.perf_counter() - epoch_start - first_in_epoch
        first_steps_s += first_in_epoch
        train_s += seconds
        epoch_train_s.append(round(seconds, 4))
        begin = time.perf_counter()
        acc = float(correct(x_test, y_test)) / xt_np.shape[0]
        eval_s += time.perf_counter() - begin
        print(f"  xla epoch {epoch}: loss {loss_sum / n:.4f}  test accuracy {acc:.4f}  ({seconds:.2f} s)",
              file=sys.stderr, flush=True)
    return {"version": tf.__version__, "threads": args.threads, "epochs": args.epochs, "train_s": round(train_s, 4),
            "first_steps_s": round(first_steps_s, 4), "eval_s": round(eval_s, 4), "accuracy": acc,
            "epoch_train_s": epoch_train_s}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=DATA)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-xla", action="store_true", help="tf.function without jit_compile")
    args = parser.parse_args()
    system = "tf.function" if args.no_xla else "tf.function + XLA"
    try:
        result = run(args)
    except Exception as error:  # noqa: BLE001 - a peer that fails is reported, the script goes on
        print(json.dumps({"system": system, "error": f"{type(error).__name__}: {error}"[:500]}), flush=True)
        sys.exit(1)
    print(json.dumps({"system": system, **result}), flush=True)


if __name__ == "__main__":
    main()
