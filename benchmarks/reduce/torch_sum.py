#!/usr/bin/env python3
"""PyTorch (Python) torch.sum and torch.mean over 16M f32 (0.1 each), for bench_reduce.

bench_reduce runs this when FLOWLET_TORCH_PYTHON names an interpreter with torch (for example
/work/venvs/torch/bin/python) and prints its figures beside libtorch's; for information only (a
separate process, so not interleaved with flowlet). Paced as bench_reduce paces its contenders
(benchmarks/paced_rounds.hpp): before each sample the process goes quiet (PyTorch's OpenMP worker
spins on after its calls), then 20 ms of untimed calls, then a sample of about 30 ms; the two ops
alternate for --rounds rounds. torch's thread settings are the user's except the thread count.

  python benchmarks/reduce/torch_sum.py --threads 2 [--rounds 12]

Prints one line per op: `op GBPS P10 P90 VERSION` (GB/s counting 64 MiB read per call).
"""
import argparse
import statistics
import time

import torch

COUNT = 1 << 24
BYTES = COUNT * 4


def wait_until_quiet(step=0.002, idle_fraction=0.1, limit=0.3):
    start = time.perf_counter()
    while time.perf_counter() - start < limit:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        time.sleep(step)
        if time.process_time() - cpu0 < idle_fraction * (time.perf_counter() - wall0):
            return


def sample(fn, calls):
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    x = torch.full((COUNT,), 0.1, dtype=torch.float32)
    ops = {"sum": lambda: torch.sum(x), "mean": lambda: torch.mean(x)}
    calls = {}
    for name, fn in ops.items():  # calibrate to ~30 ms samples
        wait_until_quiet()
        fn()
        calls[name] = max(1, round(0.030 / sample(fn, 1)))
    times = {name: [] for name in ops}
    with torch.no_grad():
        for r in range(args.rounds):
            for name in (list(ops) if r % 2 == 0 else list(reversed(ops))):
                fn = ops[name]
                wait_until_quiet()
                warm_until = time.perf_counter() + 0.020
                fn()
                while time.perf_counter() < warm_until:
                    fn()
                times[name].append(sample(fn, calls[name]))
    for name, t in times.items():
        rates = sorted(BYTES / s / 1e9 for s in t)
        q = statistics.quantiles(rates, n=10) if len(rates) > 1 else rates * 9
        print(f"{name} {statistics.median(rates):.2f} {q[0]:.2f} {q[-1]:.2f} {torch.__version__}")


if __name__ == "__main__":
    main()
