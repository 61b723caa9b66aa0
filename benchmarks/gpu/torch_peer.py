"""PyTorch peer for bench_gpu.cpp: the same GEMMs, a + b on 256M f32, the small-op overhead and the
MLP training step, timed the same way (best of several loops, each ending in a synchronize). Run by
check.sh."""
import os
import time

import torch

QUICK = "FLOWLET_GPU_QUICK" in os.environ
dev = torch.device("cuda:0")


def best_seconds_per_call(iterations, body, repeats=5):
    for _ in range(2):
        body()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(2 if QUICK else repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            body()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - start) / iterations)
    return best


def gemm(label, dtype, tf32):
    n = 4096
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    t = best_seconds_per_call(5 if QUICK else 20, lambda: torch.matmul(a, b))
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"torch gemm {label} {n}^3: {2 * n ** 3 / t / 1e12:.1f} TFLOPS")


def add():
    n = (1 << 26) if QUICK else (256 << 20)
    a = torch.ones(n, device=dev)
    b = torch.full((n,), 2.0, device=dev)
    t = best_seconds_per_call(3 if QUICK else 10, lambda: a + b)
    dst = torch.empty_like(a)
    c = best_seconds_per_call(3 if QUICK else 10, lambda: dst.copy_(a))
    print(f"torch add f32 {n >> 20}M: {t * 1e3:.3f} ms, {3 * n * 4 / t / 1e9:.0f} GB/s; "
          f"copy d2d {2 * n * 4 / c / 1e9:.0f} GB/s")


def chain(x, y):
    for _ in range(5):
        x = torch.relu(x * y + y)
    return x


def overhead():
    iterations = 2000 if QUICK else 20000
    a = torch.ones(256, device=dev)
    b = torch.ones(256, device=dev)
    one = best_seconds_per_call(iterations, lambda: a + b)
    print(f"torch eager add 256 f32: {one * 1e6:.2f} us per op")
    eager = best_seconds_per_call(iterations // 15, lambda: chain(a, b))
    print(f"torch eager chain of 15 small ops: {eager * 1e6:.1f} us ({eager * 1e6 / 15:.2f} us per op)")
    try:
        g = torch.cuda.CUDAGraph()
        static_a, static_b = a.clone(), b.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                chain(static_a, static_b)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            chain(static_a, static_b)
        graph = best_seconds_per_call(iterations // 15, g.replay)
        print(f"torch cuda-graph chain of 15 small ops: {graph * 1e6:.1f} us ({eager / graph:.2f}x eager)")
    except Exception as e:  # report, do not stop the other figures
        print(f"error torch cuda graph: {e}")


def mlp(batch):
    """The MLP step of benchmarks/mlp_step.hpp: 784-256-10, ReLU, mean cross-entropy, SGD lr 0.01 on
    x = randn([batch, 784]) and labels arange(batch) % 10 (the weights are torch's own draw: only the
    time is compared). Eager, then the whole step captured as one CUDA graph (PyTorch's
    whole-network capture recipe), which is what flowlet's traced step is set beside."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(batch, 784, device=dev)
    labels = torch.arange(batch, device=dev) % 10
    iterations = 20 if QUICK else 200

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), labels)
        loss.backward()
        opt.step()
        return loss

    eager = best_seconds_per_call(iterations, step)
    print(f"torch mlp step batch {batch}: eager {eager * 1e6:.1f} us")
    try:
        side = torch.cuda.Stream()  # warm-up on a side stream, as the recipe asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)  # backward then allocates .grad from the graph's pool
        with torch.cuda.graph(g):
            static_loss = loss_fn(model(x), labels)
            static_loss.backward()
            opt.step()
        graph = best_seconds_per_call(iterations, g.replay)
        print(f"torch mlp step batch {batch}: cuda-graph {graph * 1e6:.1f} us ({eager / graph:.2f}x eager)")
    except Exception as e:  # report, do not stop the other figures
        print(f"error torch mlp cuda graph batch {batch}: {e}")


if __name__ == "__main__":
    print(f"torch version {torch.__version__}, cuda {torch.version.cuda}, {torch.cuda.get_device_name(0)}")
    for label, dtype, tf32 in [("f32", torch.float32, False), ("tf32", torch.float32, True), ("bf16", torch.bfloat16, False)]:
        try:
            gemm(label, dtype, tf32)
        except Exception as e:
            print(f"error torch gemm {label}: {e}")
    for section in (add, overhead):
        try:
            section()
        except Exception as e:
            print(f"error torch {section.__name__}: {e}")
    for batch in (64, 1024):
        try:
            mlp(batch)
        except Exception as e:
            print(f"error torch mlp batch {batch}: {e}")
