#!/usr/bin/env bash
# bench/cnn.sh - the CNN's step time: distsgd on the CPU backend and on
# OpenCL (PoCL), beside PyTorch on the CPU.
#
# Runs build/bench/cnn (the CNN of examples/cnn_fashion_mnist.c at batch 64,
# N = 1, on the CPU backend and on the OpenCL backend, T threads each; then
# the model interface's overhead at N = 1, see bench/cnn.c), then
# bench/cnn_torch.py (the same CNN in PyTorch, torch.set_num_threads 1 and
# CORES) from the virtual environment bench/peers.sh uses, installing
# PyTorch there as peers.sh does when it is absent (bench/torch_install.sh),
# and prints one table: ms/step, samples/s and the time against distsgd's
# CPU backend.
#
# Environment:
#   CORES=$(nproc)   T for distsgd (CPU backend threads and
#                    POCL_MAX_PTHREAD_COUNT) and PyTorch's many-thread setting
#   ROUNDS=7 STEPS=10   timed rounds and steps per round, both programs
#   MLP_ROUNDS=31 MLP_STEPS=20   the interface-overhead part of bench/cnn
#   FORCE_ISAS     CPU kernels to run bench/cnn's CPU rows with again
#                  (DSGD_CPU_ISA); default avx2 on an AVX-512 CPU, else none
#                  (bench/cpu_info.sh). The first line names the CPU and
#                  the kernels.
#   PEERS_SKIP_TORCH=1, PEERS_VENV, PEERS_TORCH, PEERS_TORCH_INDEX,
#   PYTHON: as for bench/peers.sh
# No package index is built in: PyTorch is installed as pip is configured
# unless you name an index, e.g. PEERS_TORCH_INDEX=<index URL> bench/cnn.sh
# (see bench/peers.sh's header).
# OPENBLAS_NUM_THREADS=1 throughout. Where others benchmark on the same
# machine, take their lock: flock /tmp/bench.lock make bench-cnn.
# Logs: build/cnn/.
set -euo pipefail
cd "$(dirname "$0")/.."

CORES=${CORES:-$(nproc 2>/dev/null || echo 2)}
ROUNDS=${ROUNDS:-7}
STEPS=${STEPS:-10}
MLP_ROUNDS=${MLP_ROUNDS:-31}
MLP_STEPS=${MLP_STEPS:-20}
VENV=${PEERS_VENV:-build/peers-venv}
TORCH_REQ=${PEERS_TORCH:-torch==2.15.0}
TORCH_INDEX=${PEERS_TORCH_INDEX:-}
PYTHON=${PYTHON:-python3}
OUT=build/cnn
STUBS=$VENV/cuda-stubs
export OPENBLAS_NUM_THREADS=1

die() { echo "cnn.sh: $*" >&2; exit 2; }
for v in CORES ROUNDS STEPS MLP_ROUNDS MLP_STEPS; do
    case ${!v} in '' | *[!0-9]* | 0) die "$v must be a positive integer, not '${!v}'" ;; esac
done
mkdir -p "$OUT" build/pocl-cache
. bench/cpu_info.sh
FORCED=$(cpu_forced_isas)
cpu_banner bench-cnn "$FORCED"

echo "== distsgd: build/bench/cnn"
make --no-print-directory build/bench/cnn
load_start=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
POCL_CACHE_DIR=${POCL_CACHE_DIR:-$PWD/build/pocl-cache} build/bench/cnn --threads "$CORES" --rounds "$ROUNDS" \
    --steps "$STEPS" --mlp-rounds "$MLP_ROUNDS" --mlp-steps "$MLP_STEPS" | tee "$OUT/distsgd.log"
for isa in $FORCED; do
    echo "== distsgd: build/bench/cnn --cpu-only with DSGD_CPU_ISA=$isa"
    DSGD_CPU_ISA=$isa POCL_CACHE_DIR=${POCL_CACHE_DIR:-$PWD/build/pocl-cache} build/bench/cnn --threads "$CORES" \
        --rounds "$ROUNDS" --steps "$STEPS" --cpu-only | tee "$OUT/distsgd-$isa.log"
done

# install_torch, torch_setup: shared with bench/peers.sh
. bench/torch_install.sh
torch_setup
torch_line=""
if [ "$torch_ok" = 1 ]; then
    echo "== PyTorch: bench/cnn_torch.py --threads '1 $CORES'"
    if env "${torch_env[@]}" "$VENV/bin/python" -B bench/cnn_torch.py --threads "1 $CORES" --rounds "$ROUNDS" \
        --steps "$STEPS" | tee "$OUT/torch.log"; then
        torch_line=$(grep '^RESULT torch_cnn ' "$OUT/torch.log" | tail -n 1 || true)
    fi
    [ -n "$torch_line" ] || echo "PyTorch ran but gave no RESULT line (see $OUT/torch.log); distsgd's numbers alone"
fi
load_end=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')

forced_logs=()
for isa in $FORCED; do forced_logs+=("$OUT/distsgd-$isa.log"); done
"$PYTHON" - "$OUT/distsgd.log" "$torch_line" "$CORES" "$load_start" "$load_end" "$torch_ok" "${forced_logs[@]}" <<'EOF'
import sys
log, torch_line, cores, load0, load1, torch_ok = sys.argv[1:7]
kv = lambda line: dict(f.split("=", 1) for f in line.split()[2:] if "=" in f)
rows, mlp = [], None
for path in [log] + sys.argv[7:]:
    forced = path != log
    for line in open(path):
        if line.startswith("RESULT cnn "):
            d = kv(line)
            if d.get("skipped") == "1":
                rows.append(("distsgd OpenCL (PoCL)", "-", None))
            elif d["backend"] == "cpu":
                rows.append(("distsgd CPU backend (%s%s)" % (d.get("isa", "?"), ", forced" if forced else ""),
                             d["threads"], float(d["ms_per_step"])))
            else:
                rows.append(("distsgd OpenCL (PoCL)", d["threads"], float(d["ms_per_step"])))
        elif line.startswith("RESULT mlp_overhead ") and not forced:
            mlp = kv(line)
if torch_line:
    t = kv(torch_line)
    for th in sorted({int(k[1:-3]) for k in t if k.startswith("t") and k.endswith("_ms")}):
        rows.append(("PyTorch %s CPU" % t.get("torch", ""), str(th), float(t["t%d_ms" % th])))
else:
    rows.append(("PyTorch", "-", None))
cpu = next((ms for name, _, ms in rows if name.startswith("distsgd CPU")), None)
print()
print("CNN step (28x28x1, conv3x3x16-pool-conv3x3x32-pool-dense128-dense10), batch 64, N = 1, SGD momentum;")
print("medians; OPENBLAS_NUM_THREADS=1; distsgd on %s threads (CPU backend threads, POCL_MAX_PTHREAD_COUNT);"
      " 'time / distsgd CPU' against the first CPU row (the kernels picked by default)" % cores)
print()
out = [("", "threads", "ms/step", "samples/s", "time / distsgd CPU")]
for name, th, ms in rows:
    out.append((name, th, "%.3f" % ms if ms else "skipped" if th == "-" else "-", "%.0f" % (64e3 / ms) if ms else "-",
                "%.2fx" % (ms / cpu) if ms and cpu else "-"))
w = [max(len(r[i]) for r in out) for i in range(5)]
for i, r in enumerate(out):
    print("  ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(r)))
    if i == 0:
        print("  ".join("-" * x for x in w))
if not torch_line:
    print("(PyTorch not run: %s)" % ("see above" if torch_ok == "1" else "not installed or skipped, see above"))
if mlp:
    print()
    print("interface overhead at N = 1 (MLP 784-256-128-10, batch 64, ONE_DEVICE, CPU on %s threads): custom / built-in"
          " %s (median per-round ratio); noise (built-in / built-in) %s, interquartile range [%s, %s]: %s; weights"
          " bitwise equal: %s" % (mlp["threads"], mlp["ratio"], mlp["noise_ratio"], mlp["noise_lo"], mlp["noise_hi"],
                                  "within noise" if mlp["within_noise"] == "1" else "NOT within noise",
                                  "yes" if mlp["bitwise_equal"] == "1" else "NO"))
print("1-minute load average %s before, %s after (other work on the machine skews the timings)" % (load0, load1))
EOF
