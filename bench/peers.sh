#!/usr/bin/env bash
# bench/peers.sh - distsgd beside PyTorch on the demo's task.
#
# Trains the `make demo` MLP on Fashion-MNIST (global batch 256, SGD +
# Nesterov, lr 0.05 * 256 / 128 with half an epoch of warmup, then cosine) with
# distsgd (build/examples/mirrored_mlp, built as `make demo` builds it) and
# with PyTorch on the CPU (bench/peers_torch.py), for N = 1, 2, 4 replicas and
# the models 784-256-128-10 and 784-512-512-10, interleaved over ROUNDS rounds,
# and prints a table of medians: distsgd's samples/s, PyTorch's at its best
# thread setting (which one), their ratio, and both test accuracies.
#
#   distsgd   mirrored_mlp --replicas N --batch 256/N --hidden H1,H2: N
#             replicas, each with the demo's default number of threads
#   PyTorch   N = 1: one process with 1 and with CORES threads
#             N > 1: N processes, DistributedDataParallel over gloo on this
#             host, each with batch 256/N and 1 thread, and CORES/N threads
#             where that is more than 1
#   CORES is nproc (2 here); OPENBLAS_NUM_THREADS=1 throughout.
#
# Environment:
#   ROUNDS=3       rounds (each runs every configuration once)
#   EPOCHS=5       epochs per run, the demo's 5 by default. PyTorch takes
#                  fractions (EPOCHS=0.05 for a smoke test); distsgd's --epochs
#                  takes whole epochs, so it runs max(1, ceil(EPOCHS)). A round
#                  takes about 50 s + 25 s per epoch on 2 idle cores (most of
#                  the 50 s is PyTorch's start-up), so the default 3 rounds of
#                  5 epochs about 9 minutes, plus a one-time PyTorch install
#                  (about 25 s and 1.4 GB here)
#   REPLICAS="1 2 4"  MODELS="256,128 512,512"  CORES=$(nproc)
#   PEERS_VENV=build/peers-venv   where PyTorch is installed (kept, reused)
#   PEERS_TORCH=torch==2.15.0     the pip requirement for PyTorch
#   PEERS_TORCH_INDEX=URL         a pip index to install PyTorch from, tried
#                                 first (none by default: see below)
#   PEERS_SKIP_TORCH=1            run distsgd alone
#   FORCE_ISAS     CPU kernels to run distsgd with again (DSGD_CPU_ISA);
#                  default avx2 on an AVX-512 CPU, else none
#                  (bench/cpu_info.sh). The first line names the CPU and
#                  the kernels; the table adds a pair of columns per forced
#                  ISA.
#   PYTHON=python3                the Python that makes the virtual environment
#   RUN_TIMEOUT=900               seconds one training run may take
#
# Installing PyTorch: no package index is built in. To install torch from
# an index of your choice (for instance one that serves PyTorch's CPU-only
# wheels), pass its address:
#     PEERS_TORCH_INDEX=<index URL> bench/peers.sh
# torch then comes from there when it answers within 5 s, its dependencies
# as pip is configured. Without it, or when that fails, pip installs torch
# as it is configured (its default index, or PIP_INDEX_URL / pip.conf).
# Where that gives the CUDA build (PyPI's Linux x86-64 wheel is
# one), it is installed without its multi-GB nvidia-* dependencies (pip
# --no-deps, then the pure-Python ones), and `peers_torch.py
# --make-cuda-stubs` builds small stand-ins for the CUDA libraries it links
# (see bench/peers_torch.py), which PEERS_CUDA_STUBS makes it load: torch's
# CPU side runs as it is, only its CUDA side is stood in for.
# If the install fails, the script says why and runs distsgd alone.
#
# Logs and raw results: build/peers/ (results.tsv, one line per run).
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
EPOCHS=${EPOCHS:-5}
REPLICAS=${REPLICAS:-1 2 4}
MODELS=${MODELS:-256,128 512,512}
CORES=${CORES:-$(nproc 2>/dev/null || echo 2)}
VENV=${PEERS_VENV:-build/peers-venv}
TORCH_REQ=${PEERS_TORCH:-torch==2.15.0}
TORCH_INDEX=${PEERS_TORCH_INDEX:-}
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-900}
GLOBAL=256
OUT=build/peers
DATA=build/data/fashion-mnist
STUBS=$VENV/cuda-stubs
export OPENBLAS_NUM_THREADS=1

die() { echo "peers.sh: $*" >&2; exit 2; }
case $ROUNDS in '' | *[!0-9]* | 0) die "ROUNDS must be a positive integer, not '$ROUNDS'" ;; esac
case $CORES in '' | *[!0-9]* | 0) die "CORES must be a positive integer, not '$CORES'" ;; esac
# distsgd's whole epochs: ceil(EPOCHS), at least 1
DSGD_EPOCHS=$(awk -v e="$EPOCHS" 'BEGIN { if (e !~ /^([0-9]+\.?[0-9]*|\.[0-9]+)$/ || e + 0 <= 0) exit 1;
    n = int(e); if (n < e) n++; print (n < 1 ? 1 : n) }') || die "EPOCHS must be a positive number, not '$EPOCHS'"
for n in $REPLICAS; do
    case $n in '' | *[!0-9]* | 0) die "REPLICAS must list positive integers, not '$n'" ;; esac
    [ $((GLOBAL % n)) -eq 0 ] || die "the global batch $GLOBAL does not split evenly over $n replicas"
done
for m in $MODELS; do
    [[ $m =~ ^[1-9][0-9]*,[1-9][0-9]*$ ]] || die "MODELS must list H1,H2 pairs of positive integers, not '$m'"
done

mkdir -p "$OUT"
. bench/cpu_info.sh
FORCED=$(cpu_forced_isas)
cpu_banner bench-peers "$FORCED"

# ---------------------------------------------------------------- distsgd

echo "== distsgd: Debian packages, Fashion-MNIST and the demo (as make demo builds it)"
sh tools/deps.sh demo
make --no-print-directory build/examples/mirrored_mlp \
    $DATA/train-images-idx3-ubyte $DATA/train-labels-idx1-ubyte \
    $DATA/t10k-images-idx3-ubyte $DATA/t10k-labels-idx1-ubyte

# ---------------------------------------------------------------- PyTorch

# install_torch, torch_setup: shared with bench/cnn.sh
. bench/torch_install.sh
torch_setup

# ---------------------------------------------------------------- runs

results=$OUT/results.tsv
# threads 0: the program's default (distsgd's rows)
printf 'round\timpl\tmodel\tN\tprocs\tthreads\tsamples_per_s\ttest_acc\n' >"$results"

# The PyTorch settings "procs threads" for N replicas.
torch_settings() {
    local n=$1 t=$((CORES / $1))
    echo "$n 1"
    if [ "$t" -gt 1 ]; then echo "$n $t"; fi
}

run_dsgd() { # round model N [isa: forced with DSGD_CPU_ISA; none: the default kernels]
    local r=$1 m=$2 n=$3 isa=${4:-} log impl=distsgd
    log="$OUT/r$1-dsgd-${2/,/x}-n$3${isa:+-$isa}.log"
    [ -z "$isa" ] || impl="distsgd-$isa"
    if env ${isa:+DSGD_CPU_ISA=$isa} timeout "$RUN_TIMEOUT" build/examples/mirrored_mlp --data "$DATA" \
        --replicas "$n" --batch $((GLOBAL / n)) --hidden "$m" --epochs "$DSGD_EPOCHS" >"$log" 2>&1; then
        # samples/s over the whole run: the harmonic mean of the epochs' rates
        # (equal sample counts); the test accuracy of the last epoch
        awk -v r="$r" -v m="$m" -v n="$n" -v impl="$impl" '
            / samples\/s / { for (i = 1; i < NF; ++i) if ($(i + 1) == "samples/s") { inv += 1 / $i; k++ } }
            /^final test accuracy / { acc = $4 }
            END { if (k && acc != "") printf "%s\t%s\t%s\t%s\t1\t0\t%.1f\t%s\n", r, impl, m, n, k / inv, acc;
                  else exit 1 }' "$log" >>"$results" || echo "  $impl N=$n $m: no result in $log" >&2
        tail -n 1 "$log" | sed "s/^/  $impl: /"
    else
        echo "  $impl N=$n $m FAILED (exit $?): see $log" >&2
    fi
}

run_torch() { # round model N procs threads
    local r=$1 m=$2 n=$3 p=$4 t=$5 log line
    log="$OUT/r$1-torch-${2/,/x}-n$3-t$5.log"
    if timeout "$RUN_TIMEOUT" env "${torch_env[@]}" "$VENV/bin/python" bench/peers_torch.py --data "$DATA" \
        --procs "$p" --threads "$t" --hidden "$m" --epochs "$EPOCHS" --global-batch "$GLOBAL" >"$log" 2>&1; then
        line=$(grep '^RESULT torch ' "$log" | tail -n 1 || true)
        if [ -n "$line" ]; then
            awk -v r="$r" -v m="$m" -v n="$n" -v p="$p" -v t="$t" '{
                for (i = 1; i <= NF; ++i) { split($i, kv, "="); v[kv[1]] = kv[2] }
                printf "%s\ttorch\t%s\t%s\t%s\t%s\t%s\t%s\n", r, m, n, p, t, v["samples_per_s"], v["test_acc"] }' \
                <<<"$line" >>"$results"
            echo "  torch: $line"
        else
            echo "  torch N=$n $m ${p}x$t: no RESULT line in $log" >&2
        fi
    else
        echo "  torch N=$n $m ${p}x$t FAILED (exit $?): see $log" >&2
    fi
}

load_start=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
echo "== $ROUNDS round(s); distsgd $DSGD_EPOCHS epoch(s) per run, PyTorch $EPOCHS; global batch $GLOBAL;" \
    "OPENBLAS_NUM_THREADS=1; $CORES cores"
for ((r = 1; r <= ROUNDS; ++r)); do
    for m in $MODELS; do
        for n in $REPLICAS; do
            echo "-- round $r/$ROUNDS, model 784-${m/,/-}-10, N=$n"
            run_dsgd "$r" "$m" "$n"
            for isa in $FORCED; do run_dsgd "$r" "$m" "$n" "$isa"; done
            if [ "$torch_ok" = 1 ]; then
                while read -r p t; do run_torch "$r" "$m" "$n" "$p" "$t"; done < <(torch_settings "$n")
            fi
        done
    done
done

# ---------------------------------------------------------------- table

torch_version=""
if [ "$torch_ok" = 1 ]; then
    torch_version=$(grep -h -m1 -o '^torch [^,]*' "$OUT"/r*-torch-*.log 2>/dev/null | head -n 1 || true)
fi
if [ "$torch_ok" = 1 ] && [ -d "$STUBS" ]; then
    torch_version="$torch_version (a CUDA build, its CUDA libraries stood in for)"
fi
load_end=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
"$PYTHON" - "$results" "$ROUNDS" "$DSGD_EPOCHS" "$EPOCHS" "$CORES" "$torch_ok" "$torch_version" "$load_start" \
    "$load_end" "$(cpu_model)" "$(cpu_native_isa)" $FORCED <<'EOF'
import statistics, sys
path, rounds, dsgd_epochs, torch_epochs, cores, torch_ok, torch_version, load0, load1, cpu, native = sys.argv[1:12]
forced = sys.argv[12:]
rows = [line.rstrip("\n").split("\t") for line in open(path)][1:]
runs = {}  # (impl, model, N, procs, threads) -> [(samples/s, acc)]
for r, impl, model, n, procs, threads, sps, acc in rows:
    runs.setdefault((impl, model, int(n), int(procs), int(threads)), []).append((float(sps), float(acc)))
med = {k: (statistics.median(s for s, _ in v), statistics.median(a for _, a in v), len(v)) for k, v in runs.items()}
keys = sorted({(k[1], k[2]) for k in med}, key=lambda k: ([int(x) for x in k[0].split(",")], k[1]))

print()
print("distsgd beside PyTorch (CPU): Fashion-MNIST, global batch 256, SGD+Nesterov, lr 0.1 with warmup + cosine;")
print("CPU %s; distsgd's CPU kernels %s%s" % (cpu, native,
      "".join("; also forced to %s (DSGD_CPU_ISA), the '%s' columns" % (i, i) for i in forced)))
print("medians of %s round(s); distsgd %s epoch(s) per run, PyTorch %s; OPENBLAS_NUM_THREADS=1, %s cores"
      % (rounds, dsgd_epochs, torch_epochs, cores))
print("threads: distsgd = N replicas with mirrored_mlp's default threads each; PyTorch 'PxT' = P processes"
      " (DDP over gloo when P > 1) x T threads (torch.set_num_threads), the best of those tried%s"
      % ("; " + torch_version if torch_version else ""))
print()
hdr = ("model", "N", "distsgd samples/s", "PyTorch samples/s", "best PxT", "distsgd/PyTorch", "distsgd acc", "PyTorch acc")
hdr += tuple(c for i in forced for c in ("%s samples/s" % i, "%s/PyTorch" % i))
out = [hdr]
for model, n in keys:
    d = med.get(("distsgd", model, n, 1, 0))
    tk = [(v, k) for k, v in med.items() if k[0] == "torch" and k[1] == model and k[2] == n]
    best = max(tk, key=lambda x: x[0][0]) if tk else None
    row = ("784-%s-10" % model.replace(",", "-"), str(n),
           "%.0f" % d[0] if d else "-",
           "%.0f" % best[0][0] if best else "-",
           "%dx%d" % (best[1][3], best[1][4]) if best else "-",
           "%.2f" % (d[0] / best[0][0]) if d and best else "-",
           "%.4f" % d[1] if d else "-",
           "%.4f" % best[0][1] if best else "-")
    for i in forced:
        f = med.get(("distsgd-" + i, model, n, 1, 0))
        row += ("%.0f" % f[0] if f else "-", "%.2f" % (f[0] / best[0][0]) if f and best else "-")
    out.append(row)
w = [max(len(r[i]) for r in out) for i in range(len(hdr))]
for i, r in enumerate(out):
    print("  ".join(c.rjust(w[j]) if j else c.ljust(w[j]) for j, c in enumerate(r)))
    if i == 0:
        print("  ".join("-" * x for x in w))
if torch_ok == "1":
    print()
    print("every PyTorch setting (median samples/s, test acc):")
    for model, n in keys:
        tk = sorted((k, v) for k, v in med.items() if k[0] == "torch" and k[1] == model and k[2] == n)
        print("  784-%s-10 N=%d: %s" % (model.replace(",", "-"), n,
              "; ".join("%dx%d %.0f, %.4f" % (k[3], k[4], v[0], v[1]) for k, v in tk) or "no result"))
else:
    print()
    print("(PyTorch not run)")
print()
print("samples/s: distsgd over its whole training loop (its per-epoch rates), PyTorch over the training steps")
print("after the first 5; neither counts start-up, data loading or evaluation. Raw results: %s" % path)
print("1-minute load average %s before the runs, %s after: anything else running skews the timings, the"
      " multi-threaded settings most" % (load0, load1))
EOF
