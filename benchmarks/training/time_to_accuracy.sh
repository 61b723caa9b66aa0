#!/usr/bin/env bash
# Time to accuracy of `make demo` (MLP 784-256-10, ReLU, Adam lr 1e-3, batch 128, traced, 8 epochs
# of Fashion-MNIST) against its peers, all training the same model with the same hyperparameters,
# a new shuffle every epoch and the same thread count (issue 18, goal 6: flowlet <= 0.7x the
# fastest peer's median training time):
#   flowlet           build/dev/examples/demo (its "training:" line)
#   PyTorch eager     benchmarks/peers/torch_mlp.py --mode eager     (FLOWLET_TORCH_PYTHON)
#   torch.compile     benchmarks/peers/torch_mlp.py --mode compile   (FLOWLET_TORCH_PYTHON)
#   libtorch          build/dev/benchmarks/training/libtorch_mlp (built when meson finds libtorch)
#   tf.function + XLA benchmarks/peers/tf_mlp.py                     (FLOWLET_TF_PYTHON)
# Each system runs as its own process once per round; rounds are interleaved (the order rotates
# every round) so that a load change hits every system alike. Training time is the wall time of
# the training loops, evaluations excluded and the first step of each epoch and of each batch
# shape (where flowlet traces, torch.compile and XLA compile or, after an evaluation, recompile)
# reported apart: 8 of the 3752 steps of 8 epochs, plus one for the smaller last batch. The summary prints each system's median
# over the rounds, its range, its final test accuracy (all reach about 0.88), and flowlet's ratio
# to the fastest peer. A peer that is missing prints "not available" and the script goes on.
#
#   benchmarks/training/time_to_accuracy.sh [--epochs 8] [--rounds 3] [--threads 2]
#       [--build build/dev] [--lock FILE] [--only flowlet,eager,compile,libtorch,xla] [--json FILE]
# --lock FILE: each run takes `flock FILE` (the machine-wide benchmark lock on a shared machine),
# so other benchmarks may run between two runs but never during one.
# Environment: FLOWLET_TORCH_PYTHON (default build/torch-venv/bin/python) and FLOWLET_TF_PYTHON
# (default build/tf-venv/bin/python), made by benchmarks/peers/setup_torch_venv.sh and
# setup_tf_venv.sh; FLOWLET_DATA (default /usr/share/datasets/fashion-mnist); OMP_WAIT_POLICY
# (default PASSIVE) and LIBTORCH_BLAS_THREADS (default 1), see below.
# A short check: --epochs 1 --rounds 1.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
epochs=8 rounds=3 threads=2 build=$root/build/dev lock="" only="flowlet,eager,compile,libtorch,xla" json=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --lock) lock=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "time_to_accuracy.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$epochs" =~ ^[1-9][0-9]*$ && "$rounds" =~ ^[1-9][0-9]*$ && "$threads" =~ ^[1-9][0-9]*$ ]] ||
  { echo "time_to_accuracy.sh: --epochs, --rounds and --threads take positive integers" >&2; exit 2; }

torch_python=${FLOWLET_TORCH_PYTHON:-$root/build/torch-venv/bin/python}
tf_python=${FLOWLET_TF_PYTHON:-$root/build/tf-venv/bin/python}
data=${FLOWLET_DATA:-/usr/share/datasets/fashion-mnist}
demo=$build/examples/demo
libtorch_mlp=$build/benchmarks/training/libtorch_mlp
results=$(mktemp /tmp/time_to_accuracy.XXXXXX)
outdir=$(mktemp -d /tmp/time_to_accuracy_demo.XXXXXX)
trap 'rm -rf "$results" "$outdir"' EXIT

# Every system gets the same thread budget; OpenMP (libtorch, PyTorch) is told it too. OpenMP's
# threads wait passively unless OMP_WAIT_POLICY says otherwise: spinning waits cost libtorch 4x
# (6.9 s against 1.7 s an epoch) when anything else runs on a 2-core machine. libtorch's OpenBLAS
# (Debian's pthread build, which flowlet also links and itself keeps at one thread) gets
# LIBTORCH_BLAS_THREADS threads (default 1: its intra-op threads already split the work).
export FLOWLET_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
libtorch_blas_threads=${LIBTORCH_BLAS_THREADS:-1}

locked() { if [[ -n "$lock" ]]; then flock "$lock" "$@"; else "$@"; fi; }

# Whether a system can run here; prints why not otherwise.
available() {
  case "$1" in
    flowlet) [[ -x "$demo" ]] || { echo "$demo missing (ninja -C $build examples/demo)"; return 1; } ;;
    eager|compile) "$torch_python" -c 'import torch' >/dev/null 2>&1 ||
      { echo "no torch in $torch_python (benchmarks/peers/setup_torch_venv.sh, or set FLOWLET_TORCH_PYTHON)"; return 1; } ;;
    libtorch) [[ -x "$libtorch_mlp" ]] || { echo "$libtorch_mlp missing"; return 1; }
      "$libtorch_mlp" --epochs 0 2>/dev/null | grep -q '"error"' && { echo "built without libtorch"; return 1; } ;;
    xla) "$tf_python" -c 'import tensorflow' >/dev/null 2>&1 ||
      { echo "no tensorflow in $tf_python (benchmarks/peers/setup_tf_venv.sh, or set FLOWLET_TF_PYTHON)"; return 1; } ;;
  esac
  return 0
}

# One training run of a system; prints its JSON line (or one with "error").
run_one() {
  case "$1" in
    flowlet)
      local log
      log=$(locked "$demo" --epochs "$epochs" --compare-steps 0 --out "$outdir" --data "$data" 2>&1 | tr '\r' '\n')
      python3 - "$log" <<'EOF'
import json, re, sys
log = sys.argv[1]
t = re.search(r"training: ([0-9.]+) s without evaluations and first steps; first step of each epoch and batch shape ([0-9.]+) s; "
              r"evaluations ([0-9.]+) s", log)
a = re.search(r"final: test_accuracy=([0-9.]+) epochs=(\d+)", log)
if not (t and a):
    print(json.dumps({"system": "flowlet", "error": "no training line in the demo's output: " + log[-300:]}))
else:
    print(json.dumps({"system": "flowlet", "train_s": float(t.group(1)), "first_steps_s": float(t.group(2)),
                      "eval_s": float(t.group(3)), "accuracy": float(a.group(1)), "epochs": int(a.group(2))}))
EOF
      ;;
    eager|compile) locked "$torch_python" "$root/benchmarks/peers/torch_mlp.py" --mode "$1" --epochs "$epochs" \
                     --threads "$threads" --data "$data" 2>/dev/null | tail -n 1 ;;
    libtorch) OPENBLAS_NUM_THREADS=$libtorch_blas_threads locked "$libtorch_mlp" --epochs "$epochs" --threads "$threads" --data "$data" 2>/dev/null | tail -n 1 ;;
    xla) locked "$tf_python" "$root/benchmarks/peers/tf_mlp.py" --epochs "$epochs" --threads "$threads" \
           --data "$data" 2>/dev/null | tail -n 1 ;;
  esac
}

echo "time to accuracy: MLP 784-256-10, Adam lr 1e-3, batch 128, $epochs epochs, $threads threads, $rounds rounds"
echo "machine: $(nproc) cores; $(uptime | sed 's/^ *//')"
echo "settings: FLOWLET_NUM_THREADS=$threads OMP_NUM_THREADS=$threads OMP_WAIT_POLICY=$OMP_WAIT_POLICY" \
     "libtorch OPENBLAS_NUM_THREADS=$libtorch_blas_threads"
systems=()
IFS=, read -r -a wanted <<<"$only"
for s in "${wanted[@]}"; do
  case "$s" in flowlet|eager|compile|libtorch|xla) ;; *) echo "time_to_accuracy.sh: --only: unknown system $s" >&2; exit 2 ;; esac
  if why=$(available "$s"); then systems+=("$s"); else echo "  $s: not available ($why)"; fi
done
[[ ${#systems[@]} -gt 0 ]] || { echo "nothing to run"; exit 0; }

for ((round = 0; round < rounds; ++round)); do
  count=${#systems[@]}
  for ((k = 0; k < count; ++k)); do
    s=${systems[$(((k + round) % count))]}  # the order rotates every round
    line=$(run_one "$s")
    [[ -n "$line" ]] || line="{\"system\": \"$s\", \"error\": \"no output\"}"
    echo "  round $((round + 1)) $s: $line"
    echo "$s $line" >>"$results"
  done
done
echo "after: $(uptime | sed 's/^ *//')"

python3 - "$results" "$json" <<'EOF'
import json, statistics, sys
names = {"flowlet": "flowlet traced", "eager": "PyTorch eager", "compile": "torch.compile", "libtorch": "libtorch",
         "xla": "tf.function + XLA"}
runs = {}
for line in open(sys.argv[1]):
    key, _, payload = line.partition(" ")
    runs.setdefault(key, []).append(json.loads(payload))
summary = {}
print(f"{'system':<20}{'median s':>10}{'range s':>16}{'first steps s':>15}{'accuracy':>10}  runs")
for key, rs in runs.items():
    ok = [r for r in rs if "error" not in r]
    if not ok:
        print(f"{names[key]:<20}  failed: {rs[-1].get('error')}")
        continue
    times = [r["train_s"] for r in ok]
    median = statistics.median(times)
    summary[key] = {"system": names[key], "median_train_s": median, "train_s": times,
                    "first_steps_s": statistics.median(r["first_steps_s"] for r in ok),
                    "accuracy": [r["accuracy"] for r in ok], "version": ok[0].get("version")}
    print(f"{names[key]:<20}{median:>10.2f}{f'{min(times):.2f}-{max(times):.2f}':>16}"
          f"{summary[key]['first_steps_s']:>15.2f}{statistics.median(summary[key]['accuracy']):>10.4f}  {len(ok)}"
          + (f" ({len(rs) - len(ok)} failed)" if len(ok) < len(rs) else ""))
peers = {k: v for k, v in summary.items() if k != "flowlet"}
if "flowlet" in summary and peers:
    fastest = min(peers, key=lambda k: peers[k]["median_train_s"])
    ratio = summary["flowlet"]["median_train_s"] / peers[fastest]["median_train_s"]
    verdict = "met" if ratio <= 0.7 else "MISSED"
    print(f"flowlet / fastest peer ({names[fastest]}): {ratio:.2f} (target <= 0.70: {verdict})")
    summary["ratio_to_fastest_peer"] = ratio
if sys.argv[2]:
    json.dump(summary, open(sys.argv[2], "w"), indent=1)
EOF
