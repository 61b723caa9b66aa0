#!/usr/bin/env python3
"""flowlet-bench's behaviour (never its timings): --help, --list, a tiny sweep whose JSON rows,
names and counters are checked (bytes and FLOPs per call recomputed here from the shapes), the
roofline cache, attributes, and the errors (exit status 2 with the op's own message).

usage: test_flowlet_bench.py path/to/flowlet-bench
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

EXE = sys.argv[1]
failures = []
checks = 0


def check(condition, what):
    global checks
    checks += 1
    if not condition:
        failures.append(what)
        print("FAIL:", what)


def run(*args, env=None):
    proc = subprocess.run([EXE, *args], capture_output=True, text=True, env=env, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def rows(stdout):
    data = json.loads(stdout)
    return data["context"], {b["name"]: b for b in data["benchmarks"]}


def seconds(row):
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    return row["real_time"] * units[row["time_unit"]]


def near(a, b, tolerance=0.02):
    return abs(a - b) <= tolerance * max(abs(a), abs(b))


with tempfile.TemporaryDirectory() as cache:
    env = dict(os.environ, XDG_CACHE_HOME=cache, FLOWLET_NUM_THREADS="2")
    quick = ["--benchmark_min_time=0.001", "--benchmark_format=json"]

    # --help documents the options.
    code, out, _ = run("--help", env=env)
    check(code == 0, "--help exits 0")
    for flag in ["--shapes", "--sweep", "--dtype", "--device", "--attr", "--modes", "--list", "--recalibrate"]:
        check(flag in out, f"--help mentions {flag}")

    # --list: one line per op with the probed dtypes and devices; unsupported ops say why.
    code, out, _ = run("--list", env=env)
    check(code == 0, "--list exits 0")
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    check("matmul" in lines and "f32,f64" in lines["matmul"] and "cpu" in lines["matmul"], "--list: matmul f32,f64 on cpu")
    check("add" in lines and "i32" in lines["add"], "--list: add takes i32")
    check("softmax" in lines and "i32" not in lines["softmax"].split()[1], "--list: softmax does not list i32")
    check("print" in lines and "not benchmarkable" in lines["print"], "--list: print is not benchmarkable, with a reason")
    check(len(lines) >= 40, f"--list shows every op ({len(lines)} lines)")

    # A tiny sweep: three sizes x the modes, each row with its counters.
    code, out, err = run("add", "--shapes", "N,N", "--sweep", "4:16:x2", *quick, env=env)
    check(code == 0, f"sweep exits 0 ({err.strip()[-300:]})")
    context, by_name = rows(out)
    check(float(context["roofline_bandwidth_GBps"]) > 0 and float(context["roofline_f32_GFLOPs"]) > 0,
          "context carries the roofline")
    check(context["roofline_source"] == "measured now", "first run measures the roofline")
    check(os.path.exists(os.path.join(cache, "flowlet", "roofline.json")), "the roofline is cached")
    modes = ["eager", "traced", "fused"] + (["torch"] if "libtorch 1" in context["peer"] else [])
    for n in [4, 8, 16]:
        for mode in modes:
            name = f"add/f32/cpu:0/{n},{n}/{mode}/real_time"
            check(name in by_name, f"row {name}")
            if name not in by_name:
                continue
            row = by_name[name]
            t = seconds(row)
            check(near(row["bytes_per_second"] * t, 3 * n * 4), f"{name}: bytes per call = 3 x {n} x 4")
            check(near(row["flops"] * t, n), f"{name}: one FLOP per element")
            check(row["roofline_pct"] > 0, f"{name}: roofline_pct")
    check(len(by_name) == 3 * len(modes), f"{len(by_name)} rows, expected {3 * len(modes)}")

    # The second run reads the cache; --modes picks rows; matmul's FLOPs are 2 M N K.
    code, out, err = run("matmul", "--shapes", "8x4,4x3;2x2,2x2", "--modes", "eager", *quick, env=env)
    check(code == 0, f"matmul exits 0 ({err.strip()[-300:]})")
    context, by_name = rows(out)
    check(context["roofline_source"].startswith("cache "), "second run reads the cached roofline")
    check(sorted(by_name) == ["matmul/f32/cpu:0/2x2,2x2/eager/real_time", "matmul/f32/cpu:0/8x4,4x3/eager/real_time"],
          f"--modes eager gives only eager rows: {sorted(by_name)}")
    row = by_name.get("matmul/f32/cpu:0/8x4,4x3/eager/real_time")
    if row:
        check(near(row["flops"] * seconds(row), 2 * 8 * 3 * 4), "matmul FLOPs = 2 M N K")
        check(near(row["bytes_per_second"] * seconds(row), (32 + 12 + 24) * 4), "matmul bytes = inputs + output")

    # Attributes reach the op and the row name; f64 rows.
    code, out, err = run("sum", "--shapes", "4x8", "--attr", "axes=1", "--dtype", "f64", "--modes", "eager,fused", *quick, env=env)
    check(code == 0, f"sum --attr axes=1 exits 0 ({err.strip()[-300:]})")
    if code == 0:
        _, by_name = rows(out)
        check("sum[axes=1]/f64/cpu:0/4x8/fused/real_time" in by_name, f"attribute in the row name: {sorted(by_name)}")

    # Issue 15's ops, once registered: attributes reach conv2d (padding and stride change the
    # output, so the bytes and FLOPs per call) and the pools.
    if "conv2d" in lines and "f32" in lines["conv2d"]:
        code, out, err = run("conv2d", "--shapes", "1x2x5x5,3x2x3x3", "--attr", "padding=1", "--modes", "eager,fused",
                             *quick, env=env)
        check(code == 0, f"conv2d exits 0 ({err.strip()[-300:]})")
        if code == 0:
            _, by_name = rows(out)
            row = by_name.get("conv2d[padding=1]/f32/cpu:0/1x2x5x5,3x2x3x3/eager/real_time")
            check(row is not None, f"conv2d row: {sorted(by_name)}")
            if row:  # output [1, 3, 5, 5]: 75 elements, each 2 x 2 x 3 x 3 FLOPs
                check(near(row["flops"] * seconds(row), 2 * 75 * 2 * 9), "conv2d FLOPs with padding 1")
                check(near(row["bytes_per_second"] * seconds(row), (50 + 54 + 75) * 4), "conv2d bytes with padding 1")
        code, out, err = run("conv2d", "--shapes", "1x2x5x5,3x2x3x3", "--attr", "padding=1", "--attr", "stride=2",
                             "--modes", "eager", *quick, env=env)
        if code == 0:
            _, by_name = rows(out)
            row = next(iter(by_name.values()))
            check(near(row["flops"] * seconds(row), 2 * 27 * 2 * 9), "conv2d FLOPs with stride 2 (output 3x3)")
        else:
            check(False, f"conv2d stride 2 exits 0 ({err.strip()[-300:]})")
        code, out, err = run("conv2d", "--shapes", "1x2x6x6,3x2x4x4", "--attr", "padding=same", "--attr", "stride=2",
                             "--modes", "eager", *quick, env=env)
        check(code == 0, f"conv2d padding=same exits 0 ({err.strip()[-300:]})")
        if code == 0:  # "same" with stride 2: output 3x3, whatever the kernel
            row = next(iter(rows(out)[1].values()))
            check(near(row["flops"] * seconds(row), 2 * 27 * 2 * 16), "conv2d padding=same stride 2: output 3x3")
    if "max_pool2d" in lines and "f32" in lines["max_pool2d"]:
        code, out, err = run("max_pool2d", "--shapes", "1x1x4x4", "--attr", "kernel=2", "--modes", "eager", *quick, env=env)
        check(code == 0, f"max_pool2d exits 0 ({err.strip()[-300:]})")
        if code == 0:
            _, by_name = rows(out)
            row = next(iter(by_name.values()))
            check(near(row["bytes_per_second"] * seconds(row), (16 + 4) * 4), "max_pool2d kernel 2: 16 in, 4 out")

    # Errors: exit status 2 and a message naming the problem (the op's own for bad shapes/dtypes).
    error_cases = [
        (["nosuchop", "--shapes", "2"], ["unknown op 'nosuchop'", "--list"]),
        (["matmul", "--shapes", "2x3,4x5"], ["matmul:", "[2, 3]", "[4, 5]"]),
        (["matmul", "--shapes", "2x3,3x2", "--dtype", "f7"], ["unknown dtype 'f7'"]),
        (["softmax", "--shapes", "2x3", "--dtype", "i32"], ["softmax", "i32"]),
        (["matmul", "--shapes", "2xa,3x2"], ["expected an integer", "2xa"]),
        (["add", "--shapes", "N,N"], ["no --sweep"]),
        (["add", "--shapes", "2,2", "--sweep", "4:2:x2"], ["--sweep"]),
        (["sum", "--shapes", "2x2", "--attr", "axis=1"], ["axis", "takes: axes, keepdims"]),
        (["print", "--shapes", "2"], ["print cannot be benchmarked"]),
        (["add", "--shapes", "2,2", "--modes", "slow"], ["unknown mode 'slow'"]),
        (["matmul"], ["needs --shapes"]),
    ]
    # Each run loads libtorch (about a second): run them side by side.
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: run(*case[0], env=env), error_cases))
    for (args, parts), (code, out, err) in zip(error_cases, results):
        check(code == 2, f"{args}: exit status 2, got {code}")
        for part in parts:
            check(part in err, f"{args}: stderr names '{part}': {err.strip()}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print(f"flowlet-bench: all {checks} checks passed")
