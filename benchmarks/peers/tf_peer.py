#!/usr/bin/env python3
"""TensorFlow 2 as a benchmark peer, run by the C++ benchmarks as a subprocess (benchmarks/tf_peer.hpp).

Usage: tf_peer.py CASE [--threads N] [--batch B] [--n N] [--samples S] [--optimizer sgd|adam]

Prints exactly ONE JSON object (one line, flat: numbers and strings) on stdout and nothing else;
TensorFlow's own output goes to stderr. Times are seconds per call: the median over samples, with
p10 and p90, measured like benchmarks/harness.hpp (each sample a batch of calls lasting about
20 ms, 15 samples), but with a longer warm-up (at least 200 ms and two calls), because
TensorFlow's first eager calls stay slower for a while. On failure it prints
{"case": CASE, "error": "..."} and exits 1.

Cases (the C++ side mirrors each exactly):
  mlp_step --batch B   one training step of an MLP 784-256-10: x [B,784] f32 standard normal
                       (numpy default_rng(0)), labels i % 10 (int64);
                       h = relu(x @ w1 + b1); logits = h @ w2 + b2;
                       loss = mean(sparse_softmax_cross_entropy(labels, logits));
                       gradients with tf.GradientTape; SGD lr 0.01 as var.assign_sub(0.01 * g), or
                       with --optimizer adam Keras' Adam (lr 1e-3, beta_1 0.9, beta_2 0.999,
                       epsilon 1e-7: Keras' defaults), one optimizer per mode, built before timing.
                       w1 [784,256], w2 [256,10] Glorot-uniform (numpy default_rng(1) and (2),
                       limit sqrt(6 / (fan_in + fan_out))), biases zero.
                       Keys: batch, optimizer, eager_*, function_*, xla_* (when XLA works),
                       loss_first_step (the loss of the first step from the initial weights).
  chain --n N          8 elementwise ops on an f32 vector of N elements (default 16M = 16 * 2**20),
                       x = numpy default_rng(0) standard normal:
                         t = x * 1.5
                         t = t + 0.5
                         t = tanh(t)
                         t = t * t
                         t = t - 0.25
                         t = exp(t)
                         t = t * 0.5
                         t = maximum(t, 0.1)
                       Keys: n, eager_*, function_*, xla_* (when XLA works), checksum (sum of the
                       result in f64, from the eager run).
  tiny_chain --n 1000  N chained `t = t + 1.0` on a 1-element f32 tensor under tf.function (TF's
                       per-node executor overhead). Grappler is switched off for this function
                       (its constant push-down would fold the chain into one add); the default,
                       folded figure is reported beside it as function_grappler_s.
                       Keys: n, function_*, per_op_s = function_s / n, function_grappler_s.
  versions             {"tensorflow": ..., "python": ..., "numpy": ...}

Where * is s, p10, p90 and iters (calls per sample). Every case also reports threads and samples.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow is imported

import argparse
import json
import math
import platform
import sys
import time

# Keep stdout for the one JSON line: anything else written to file descriptor 1 (by Python or by
# TensorFlow's C++ runtime) goes to stderr instead.
_json_out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr


def emit(record):
    _json_out.write(json.dumps(record, allow_nan=False) + "\n")
    _json_out.flush()


# ---- timing, as benchmarks/harness.hpp ----

SAMPLES = 15
SAMPLE_SECONDS = 0.020
WARMUP_SECONDS = 0.200  # the harness uses 50 ms; TF's first eager calls fill caches for longer


def _batch_seconds(fn, iterations):
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return time.perf_counter() - start


def _percentile(sorted_values, fraction):
    position = fraction * (len(sorted_values) - 1)
    low = int(math.floor(position))
    high = min(low + 1, len(sorted_values) - 1)
    weight = position - low
    return sorted_values[low] * (1 - weight) + sorted_values[high] * weight


def measure(fn, samples):
    """Median, p10, p90 of seconds per call, and calls per sample."""
    start = time.perf_counter()
    calls = 0
    while True:
        fn()
        calls += 1
        if calls >= 2 and time.perf_counter() - start >= WARMUP_SECONDS:
            break
    iterations = 1
    elapsed = _batch_seconds(fn, iterations)
    while elapsed < SAMPLE_SECONDS * 0.25:
        grow = SAMPLE_SECONDS * 0.5 / elapsed if elapsed > 0 else 100.0
        iterations = max(iterations * 2, int(iterations * min(grow, 100.0)))
        elapsed = _batch_seconds(fn, iterations)
    iterations = max(1, round(iterations * SAMPLE_SECONDS / elapsed))
    per_call = sorted(_batch_seconds(fn, iterations) / iterations for _ in range(samples))
    return {
        "s": _percentile(per_call, 0.5),
        "p10": _percentile(per_call, 0.1),
        "p90": _percentile(per_call, 0.9),
        "iters": iterations,
    }


def add_figures(record, prefix, figures):
    for key, value in figures.items():
        record[f"{prefix}_{key}"] = value


def try_xla(record, make_fn, errors):
    """Times make_fn() (a jit_compile=True function) when XLA works on this build; else notes why."""
    try:
        fn = make_fn()
        fn()  # compiles
        add_figures(record, "xla", measure(fn, record["samples"]))
    except Exception as error:  # XLA missing or failing: the key is left out
        errors.append(f"xla: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")


# ---- cases ----

def case_mlp_step(tf, np, args, record):
    batch = args.batch
    in_features, hidden, classes, lr = 784, 256, 10, 0.01
    record["batch"] = batch

    def glorot(seed, fan_in, fan_out):
        limit = math.sqrt(6.0 / (fan_in + fan_out))
        return np.random.default_rng(seed).uniform(-limit, limit, (fan_in, fan_out)).astype(np.float32)

    initial = [glorot(1, in_features, hidden), np.zeros(hidden, np.float32),
               glorot(2, hidden, classes), np.zeros(classes, np.float32)]
    params = [tf.Variable(value) for value in initial]
    x = tf.constant(np.random.default_rng(0).standard_normal((batch, in_features)).astype(np.float32))
    y = tf.constant(np.arange(batch, dtype=np.int64) % classes)

    record["optimizer"] = args.optimizer

    def make_step():
        # Each mode gets its own optimizer, its slots made before the first (traced) call.
        adam = None
        if args.optimizer == "adam":
            adam = tf.keras.optimizers.Adam(learning_rate=1e-3)
            adam.build(params)

        def step():
            w1, b1, w2, b2 = params
            with tf.GradientTape() as tape:
                h = tf.nn.relu(tf.matmul(x, w1) + b1)
                logits = tf.matmul(h, w2) + b2
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            grads = tape.gradient(loss, params)
            if adam is not None:
                adam.apply_gradients(zip(grads, params))
            else:
                for var, grad in zip(params, grads):
                    var.assign_sub(lr * grad)
            return loss

        return step

    def reset():
        for var, value in zip(params, initial):
            var.assign(value)

    step = make_step()
    record["loss_first_step"] = float(step().numpy())
    reset()
    add_figures(record, "eager", measure(step, record["samples"]))

    reset()
    function_step = tf.function(make_step())
    function_step()  # traces
    add_figures(record, "function", measure(function_step, record["samples"]))

    errors = []
    reset()
    try_xla(record, lambda: tf.function(make_step(), jit_compile=True), errors)
    if errors:
        record["xla_error"] = "; ".join(errors)


def case_chain(tf, np, args, record):
    n = args.n if args.n is not None else 16 * 2**20
    record["n"] = n
    x = tf.constant(np.random.default_rng(0).standard_normal(n).astype(np.float32))

    # The 8 ops; see the module docstring (the C++ side mirrors this list).
    def chain():
        t = x * 1.5
        t = t + 0.5
        t = tf.tanh(t)
        t = t * t
        t = t - 0.25
        t = tf.exp(t)
        t = t * 0.5
        t = tf.maximum(t, 0.1)
        return t

    record["checksum"] = float(np.sum(chain().numpy(), dtype=np.float64))
    add_figures(record, "eager", measure(chain, record["samples"]))
    function_chain = tf.function(chain)
    function_chain()  # traces
    add_figures(record, "function", measure(function_chain, record["samples"]))
    errors = []
    try_xla(record, lambda: tf.function(chain, jit_compile=True), errors)
    if errors:
        record["xla_error"] = "; ".join(errors)


def case_tiny_chain(tf, np, args, record):
    n = args.n if args.n is not None else 1000
    record["n"] = n
    x = tf.constant([0.0], dtype=tf.float32)

    def chain():
        t = x
        for _ in range(n):
            t = t + 1.0
        return t

    folded = tf.function(chain)
    folded()  # traces (Grappler on, the default)
    add_figures(record, "function_grappler", measure(folded, record["samples"]))

    # One node per add: switch Grappler off for the tracing and running of this function.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    unfolded = tf.function(chain)
    result = float(unfolded().numpy()[0])
    if result != float(n):
        raise RuntimeError(f"tiny_chain computed {result}, expected {n}")
    add_figures(record, "function", measure(unfolded, record["samples"]))
    record["per_op_s"] = record["function_s"] / n


def main():
    parser = argparse.ArgumentParser(description="TensorFlow 2 benchmark peer; prints one JSON line.")
    parser.add_argument("case", choices=["mlp_step", "chain", "tiny_chain", "versions"])
    parser.add_argument("--threads", type=int, default=1, help="intra-op and inter-op threads (default 1)")
    parser.add_argument("--batch", type=int, default=64, help="mlp_step batch size (default 64)")
    parser.add_argument("--n", type=int, default=None,
                        help="elements for chain (default 16M), ops for tiny_chain (default 1000)")
    parser.add_argument("--samples", type=int, default=SAMPLES, help=f"timed samples (default {SAMPLES})")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd",
                        help="mlp_step's optimizer (default sgd: lr 0.01; adam: Keras' Adam, lr 1e-3)")
    args = parser.parse_args()

    record = {"case": args.case}
    try:
        import numpy as np
        import tensorflow as tf

        if args.case == "versions":
            emit({"case": "versions", "tensorflow": tf.__version__, "python": platform.python_version(),
                  "numpy": np.__version__})
            return 0
        # Must happen before TensorFlow runs its first op.
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
        record["threads"] = args.threads
        record["samples"] = args.samples
        {"mlp_step": case_mlp_step, "chain": case_chain, "tiny_chain": case_tiny_chain}[args.case](
            tf, np, args, record)
    except Exception as error:
        message = str(error).splitlines()[0] if str(error) else ""
        emit({"case": args.case, "error": f"{type(error).__name__}: {message}"})
        return 1
    emit(record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
