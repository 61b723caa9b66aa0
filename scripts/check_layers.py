#!/usr/bin/env python3
"""Lists every #include in src/ that points up a layer (docs/ARCHITECTURE.md, "Layers").

Usage: scripts/check_layers.py  (from anywhere; exit status 1 when it finds one not in KNOWN)

Each source file and each included header belongs to one layer, found by the longest matching
path prefix below; a file may include headers of its own layer and of lower ones. Public headers
(flowlet/...) count as the layer that implements them.
"""
import pathlib
import re
import sys

# Lowest first. A layer may include itself and everything above it in this list.
LAYERS = [
    ("core", ["src/core/", "flowlet/core/", "flowlet/xtensor.hpp", "flowlet/device_scope.hpp"]),
    ("runtime", ["src/runtime/", "src/collective/communicator.", "src/collective/replica_context.",
                 "src/collective/transport/", "flowlet/collective.hpp", "src/ps/wire/", "src/ps/transport/",
                 "src/ps/sharding.hpp", "src/ps/worker/", "flowlet/ps_options.hpp"]),
    ("kernels", ["src/kernels/"]),
    ("ops", ["src/ops/", "flowlet/op.hpp", "flowlet/dispatch.hpp", "flowlet/ops/", "src/registry.cpp"]),
    ("recording", ["src/dispatch.cpp", "src/autodiff/", "flowlet/autodiff.hpp", "src/trace/tracer.",
                   "src/trace/graph", "flowlet/graph.hpp", "flowlet/eager_scope.hpp", "src/trace/source_trace.", "src/trace/json_text.hpp"]),
    ("state", ["src/state/", "flowlet/variable.hpp", "flowlet/random.hpp", "src/queue/", "flowlet/queue.hpp", "src/collective/ops/",
               "src/ps/ops/"]),
    ("backends and passes", ["src/cuda/", "src/trace/passes/", "src/collective/nccl/"]),
    ("exec", ["src/exec/", "flowlet/run_info.hpp"]),
    ("front end", ["src/trace/function.cpp", "src/trace/signature.", "src/trace/polymorphism.", "src/trace/timeline.",
                   "flowlet/trace.hpp"]),
    ("libraries", ["src/optim/", "flowlet/optim.hpp", "flowlet/layers.hpp", "src/checkpoint/",
                   "flowlet/checkpoint.hpp", "src/data/", "flowlet/data/", "flowlet/flowlet.hpp",
                   "src/collective/mirrored/", "flowlet/mirrored.hpp", "src/ps/server/", "src/ps/strategy/",
                   "flowlet/parameter_server.hpp", "src/ps/simulator/", "flowlet/ps_simulator.hpp",
                   "src/ps/checkpoint/", "flowlet/distributed_checkpoint.hpp",
                   "src/interop/", "flowlet/dlpack.hpp"]),
]

# Upward includes with a known fix that another change owns: listed, but not failing the check.
KNOWN = set()  # none at present

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def layer_of(path):
    best = None
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if path.startswith(prefix) and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix))
    return None if best is None else best[0]


def header_path(include):
    # Internal headers are included relative to src/ ("core/check.hpp"); public ones as "flowlet/...".
    return include if include.startswith("flowlet/") else "src/" + include


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    upward = []
    known = []
    for source in sorted((root / "src").rglob("*")):
        if source.suffix not in {".cpp", ".hpp", ".cu", ".cuh"}:
            continue
        relative = source.relative_to(root).as_posix()
        own = layer_of(relative)
        if own is None:
            upward.append(f"{relative}: belongs to no layer (add it to scripts/check_layers.py)")
            continue
        for line_number, line in enumerate(source.read_text().splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            included = header_path(match.group(1))
            theirs = layer_of(included)
            if theirs is not None and theirs > own:
                text = f"{relative}:{line_number}: {line.strip()}  ({LAYERS[own][0]} -> {LAYERS[theirs][0]})"
                (known if (relative, match.group(1)) in KNOWN else upward).append(text)
    for text in known:
        print(f"known: {text}")
    for text in upward:
        print(f"upward: {text}")
    print(f"{len(upward)} upward includes, {len(known)} known")
    return 1 if upward else 0


if __name__ == "__main__":
    sys.exit(main())
