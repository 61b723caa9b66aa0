"""PyTorch peer of bench_gpu_conv.cpp: the same convolutions (cuDNN, cudnn.benchmark on, TF32 only
on the tf32 lines, as flowlet), max pooling and batch normalization, timed the same way (best of
several loops, each ending in a synchronize). With --flowlet LOG (bench_gpu_conv's output) it also
prints one "ratio" line per figure: flowlet's speed over PyTorch's (time_torch / time_flowlet;
the issue's target for conv2d is >= 0.9). Run by check.sh."""
import argparse
import os
import re
import time

import torch
import torch.nn.functional as F

QUICK = "FLOWLET_GPU_QUICK" in os.environ
dev = torch.device("cuda:0")
torch.backends.cudnn.benchmark = True

SHAPES = [  # name, n, c, h, w, o, k, stride, pad: bench_gpu_conv.cpp's kShapes
    ("32x64x56x56 3x3 64", 32, 64, 56, 56, 64, 3, 1, 1),
    ("32x128x28x28 3x3 128", 32, 128, 28, 28, 128, 3, 1, 1),
    ("32x256x56x56 1x1 64", 32, 256, 56, 56, 64, 1, 1, 0),
    ("32x64x56x56 1x1 256", 32, 64, 56, 56, 256, 1, 1, 0),
    ("32x128x56x56 3x3 128 stride 2", 32, 128, 56, 56, 128, 3, 2, 1),
    ("32x3x224x224 7x7 64 stride 2", 32, 3, 224, 224, 64, 7, 2, 3),
]


def best_ms_per_call(iterations, body):
    for _ in range(3):
        body()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(2 if QUICK else 5):
        start = time.perf_counter()
        for _ in range(iterations):
            body()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) * 1e3 / iterations)
    return best


def conv(name, n, c, h, w, o, k, stride, pad, label, dtype, tf32):
    torch.backends.cudnn.allow_tf32 = tf32
    x = torch.randn(n, c, h, w, device=dev, dtype=dtype, requires_grad=True)
    wt = torch.randn(o, c, k, k, device=dev, dtype=dtype, requires_grad=True)
    iterations = 3 if QUICK else 10
    with torch.no_grad():
        forward = best_ms_per_call(iterations, lambda: F.conv2d(x, wt, stride=stride, padding=pad))

    def both():
        F.conv2d(x, wt, stride=stride, padding=pad).sum().backward()
        x.grad = None
        wt.grad = None

    backward = best_ms_per_call(iterations, both)
    torch.backends.cudnn.allow_tf32 = False
    return {f"{name} {label}": (forward, backward)}


def pool_norm():
    out = {}
    x = torch.randn(32, 64, 112, 112, device=dev, requires_grad=True)
    with torch.no_grad():
        forward = best_ms_per_call(10, lambda: F.max_pool2d(x, 3, 2, 1))

    def pool_both():
        F.max_pool2d(x, 3, 2, 1).sum().backward()
        x.grad = None

    out["max_pool2d 32x64x112x112 3x3 stride 2 f32"] = (forward, best_ms_per_call(10, pool_both))
    x = torch.randn(32, 64, 56, 56, device=dev, requires_grad=True)
    gamma = torch.ones(64, device=dev, requires_grad=True)
    beta = torch.zeros(64, device=dev, requires_grad=True)
    with torch.no_grad():
        forward = best_ms_per_call(10, lambda: F.batch_norm(x, None, None, gamma, beta, training=True))

    def norm_both():
        F.batch_norm(x, None, None, gamma, beta, training=True).sum().backward()
        x.grad = gamma.grad = beta.grad = None

    out["batch_norm 32x64x56x56 f32"] = (forward, best_ms_per_call(10, norm_both))
    return out


def flowlet_times(path):
    times = {}
    pattern = re.compile(r"^gpu-conv (.+?): forward ([0-9.]+) ms.*forward\+backward ([0-9.]+) ms")
    with open(path) as log:
        for line in log:
            m = pattern.match(line.strip())
            if m:
                times[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--flowlet", help="bench_gpu_conv's output, for the ratio lines")
    args = parser.parse_args()
    print(f"note torch-conv: torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}")
    torch_times = {}
    for shape in SHAPES:
        for label, dtype, tf32 in (("f32", torch.float32, False), ("tf32", torch.float32, True),
                                   ("bf16", torch.bfloat16, False)):
            try:
                torch_times.update(conv(*shape, label, dtype, tf32))
            except Exception as e:  # noqa: BLE001 - report and go on
                print(f"error torch-conv {shape[0]} {label}: {e}")
    try:
        torch_times.update(pool_norm())
    except Exception as e:  # noqa: BLE001
        print(f"error torch-conv pool/norm: {e}")
    for name, (forward, both) in torch_times.items():
        print(f"torch-conv {name}: forward {forward:.3f} ms, forward+backward {both:.3f} ms")
    if args.flowlet:
        mine = flowlet_times(args.flowlet)
        for name, (forward, both) in torch_times.items():
            if name not in mine:
                print(f"ratio {name}: no flowlet figure")
                continue
            f_forward, f_both = mine[name]
            verdict = "ok" if min(forward / f_forward, both / f_both) >= 0.9 else "BELOW 0.9"
            print(f"ratio {name}: flowlet speed / torch forward {forward / f_forward:.2f}x, "
                  f"forward+backward {both / f_both:.2f}x ({verdict})")


if __name__ == "__main__":
    main()
