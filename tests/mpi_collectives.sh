#!/usr/bin/env bash
# tests/mpi_collectives.sh - runs tests/mpi_collectives.c under mpirun (make test-mpi).
#
# Two tiers. With DSGD_TEST_FULL=1 (make test-full, make test-mpi) every run
# below; otherwise (make test) the quick tier: each program and feature
# once, at the smallest np that exercises it. The runs, [full] marking those
# of the full tier alone:
#
#   the suite at each np of $DSGD_MPI_NP (default 2 3 4; quick 2 3: np = 3
#       is the first where a ring has a middle rank), each run under a
#       watchdog (timeout), its summary line counted; the quick tier gives
#       it DSGD_TEST_LARGE=300007 (the full tier's large count is 1000003):
#       still past the default 1 MiB shared-memory window, so DIRECT goes
#       through it in pieces, and past the collectives' 256 KiB pieces;
#   np = 2 --levels: thread levels and MPI initialised by the program;
#   --local K (several endpoints per process, dsgd_mpi_transport_create_local)
#       for each "np:K" of $DSGD_MPI_LOCAL (default 2:2 3:2 2:3; quick:
#       its first, 2:2);
#   --share-deadline at np = 3 ([full] also np = 2 and 4): DIRECT over the
#       shared-memory windows; the last rank sleeps past all-reduce #5's
#       deadline: the others time out naming it, it gets DSGD_ERR_ABORTED
#       at once when it arrives (checked by the program, under its alarm
#       and the timeout here);
#   np = 2 --deadline: rank 0's all-reduce #5 must time out naming rank 1
#       within the deadline + 100 ms (checked by the program), after which it
#       calls dsgd_mpi_abort: the job must end with a non-zero status within
#       5 s of that call (checked here: 3 checks);
#   the small-pieces build (DSGD_MPI_MAX_MESSAGE=4096, so payloads and native
#       all-reduces go in many MPI messages, and DSGD_MPI_SHARE_BYTES=4096,
#       so DIRECT goes through the windows in many pieces), when it exists,
#       at np = 3 (quick: DSGD_TEST_LARGE=100003, a hundred pieces a
#       message), and [full] with --local 2 at np = 3;
#   tests/mpi_workers.c (multi-worker mirrored training), when built, at
#       np:K = 2:2 ([full] also 2:1 3:2 4:1; K replicas per process);
#   tests/mpi_elastic.c (elastic training over MPI), when built: a planned
#       leave at np = 3 (3 -> 2), a grow by MPI_Comm_spawn at np = 2
#       (2 -> 3), and a crash at np = 3 relaunched at np = 2 from its
#       checkpoint by tools/elastic_launch.sh (the launcher under the
#       watchdog); each bit for bit against a reference of its own;
#   tests/mpi_ps.c (parameter servers across processes), when built, at
#       np = 4; tests/mpi_strategy_ps.c (the parameter-server strategy over
#       MPI equals its own loopback, bit for bit) at np = 4; then
#       examples/ps_mpi.c, when built, at np = 4 with a cluster of 5 tasks
#       and [full] with a malformed TF_CONFIG: the job must end non-zero
#       (not by the watchdog), every process printing the same error (3
#       checks each);
#   [full] examples/multi_worker_mlp.c --verify at np = 2 (one epoch;
#       weights bitwise equal to the one-process run), when built and
#       Fashion-MNIST is in $DSGD_FMNIST_DIR (default
#       build/data/fashion-mnist): a real training run, seconds of it;
#       the quick tier's mpi_workers makes the same bitwise comparison;
#   [full] the MPICH builds (mpi_collectives_mpich, mpi_workers_mpich), when
#       they exist: the suite, --local 2 and multi-worker training at np = 2
#       under $DSGD_MPICH_RUN (default mpirun.mpich; MPICH busy-polls, so 2
#       ranks).
# Prints each run's output, the number of its checks that passed and
# failed and its seconds, the checks' total, and last "N passed, N failed"
# counting runs (a run passes when all its checks did and it ended as it
# should): the line tools/run_tests.sh counts this script by, a test per
# run, as cmocka's tests count functions, not assertions. Exit 1 when a run
# failed.
#
# Environment: DSGD_TEST_FULL (1: the full tier), DSGD_MPI_BUILD (default
# build/mpi: mpi_collectives and mpi_collectives_pieces), DSGD_MPIRUN
# (default "mpirun --allow-run-as-root --oversubscribe"), DSGD_MPI_NP,
# DSGD_MPI_LOCAL, DSGD_MPICH_RUN, DSGD_MPI_TIMEOUT (seconds per run,
# default 300), DSGD_TEST_LARGE (the suite's large count, in both tiers).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
build=${DSGD_MPI_BUILD:-build/mpi}
read -r -a mpirun <<<"${DSGD_MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
full=0
[ "${DSGD_TEST_FULL:-}" = 1 ] && full=1
if [ "$full" -eq 1 ]; then
    nps=${DSGD_MPI_NP:-2 3 4}
    locals=${DSGD_MPI_LOCAL:-2:2 3:2 2:3}
else
    nps=${DSGD_MPI_NP:-2 3}
    read -r locals _ <<<"${DSGD_MPI_LOCAL:-2:2}"
    # the suite's large count (tests/mpi_collectives.c reads it), unless given
    large=${DSGD_TEST_LARGE:-300007}
    large_pieces=${DSGD_TEST_LARGE:-100003}
fi
read -r -a mpichrun <<<"${DSGD_MPICH_RUN:-mpirun.mpich}"
limit=${DSGD_MPI_TIMEOUT:-300}
bin=$build/mpi_collectives
pieces=$build/mpi_collectives_pieces
mpich=$build/mpi_collectives_mpich
workers=$build/mpi_workers
psbin=$build/mpi_ps
psstrat=$build/mpi_strategy_ps
psdemo=$build/ps_mpi
log=$(mktemp "${TMPDIR:-/tmp}/mpi_collectives.XXXXXX")
trap 'rm -f "$log"' EXIT
passed=0 failed=0         # checks
runs_passed=0 runs_failed=0

# tally NAME P F: adds a run's checks and the run.
tally() {
    passed=$((passed + $2))
    failed=$((failed + $3))
    if [ "$3" -eq 0 ]; then runs_passed=$((runs_passed + 1)); else runs_failed=$((runs_failed + 1)); fi
}

if [ ! -x "$bin" ]; then
    echo "mpi_collectives.sh: $bin not built (make test-mpi builds it)"
    echo "0 passed, 1 failed"
    exit 1
fi

now() { date +%s.%N; }
# since T: the seconds from T to now, to a tenth
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
began=$(now)
if [ "$full" -eq 1 ]; then
    echo "mpi_collectives.sh: the full tier (DSGD_TEST_FULL=1): every run"
else
    echo "mpi_collectives.sh: the quick tier: each program and feature once (DSGD_TEST_FULL=1 runs them all)"
fi

# run NAME ARGS...: one mpirun, streamed and logged; its own summary line is
# counted, and a non-zero exit without a reported failure counts as one.
# (run_with: the same with another mpirun, its words in the array named $1.)
run() {
    run_with mpirun "$@"
}

run_with() {
    local -n launcher=$1
    local name=$2 start rc p f own
    shift 2
    echo "==== $name"
    start=$(now)
    timeout --kill-after=10 "$limit" "${launcher[@]}" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    own=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
    p=0 f=0
    if [ -n "$own" ]; then read -r p _ f _ <<<"$own"; fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
        echo "mpi_collectives.sh: $name: exit status $rc ($([ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && echo "timed out after ${limit}s" || echo "no failure reported")), counted as 1 failed"
    fi
    if [ -z "$own" ] && [ "$f" -eq 0 ]; then
        f=1
        echo "mpi_collectives.sh: $name: no summary line, counted as 1 failed"
    fi
    tally "$name" "$p" "$f"
    echo "---- $name: $p checks passed, $f failed, exit $rc, $(since "$start") s"
}

for np in $nps; do
    if [ "$full" -eq 1 ]; then
        run "np=$np" -np "$np" "$bin"
    else
        DSGD_TEST_LARGE=$large run "np=$np" -np "$np" "$bin"
    fi
done
run "np=2 --levels" -np 2 "$bin" --levels
for pk in $locals; do
    run "np=${pk%%:*} --local ${pk##*:}" -np "${pk%%:*}" "$bin" --local "${pk##*:}"
done
# DIRECT over the shared-memory windows with a rank that never arrives.
share_nps=3
[ "$full" -eq 1 ] && share_nps="2 3 4"
for np in $share_nps; do
    run "np=$np --share-deadline" -np "$np" "$bin" --share-deadline
done

# The deadline: the program's own checks (rank 0's timeout), then how the job ends.
echo "==== np=2 --deadline"
start=$(now)
timeout --kill-after=10 60 "${mpirun[@]}" -np 2 "$bin" --deadline 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
end=$(now)
own=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -n 1)
p=0 f=0
if [ -n "$own" ]; then read -r p _ f _ <<<"$own"; else f=1; echo "mpi_collectives.sh: --deadline: rank 0 reported nothing"; fi
stamp=$(sed -n 's/^aborting at \([0-9.]*\)$/\1/p' "$log" | tail -n 1)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then
    p=$((p + 1))
else
    f=$((f + 1))
    echo "mpi_collectives.sh: --deadline: the job ended with status $rc, expected non-zero (not a watchdog kill)"
fi
if [ -n "$stamp" ]; then
    p=$((p + 1))
    gap=$(awk -v a="$stamp" -v b="$end" 'BEGIN { printf "%.2f", b - a }')
    if awk -v g="$gap" 'BEGIN { exit !(g <= 5.0) }'; then
        p=$((p + 1))
        echo "mpi_collectives.sh: --deadline: the job ended ${gap} s after dsgd_mpi_abort, status $rc"
    else
        f=$((f + 1))
        echo "mpi_collectives.sh: --deadline: the job ended ${gap} s after dsgd_mpi_abort (limit 5 s)"
    fi
else
    f=$((f + 2))
    echo "mpi_collectives.sh: --deadline: no 'aborting at' line from rank 0"
fi
tally deadline "$p" "$f"
echo "---- np=2 --deadline: $p checks passed, $f failed, exit $rc, $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s"

# Multi-worker mirrored across processes (tests/mpi_workers.c), np:K as --local.
if [ -x "$workers" ]; then
    worker_pks=2:2
    [ "$full" -eq 1 ] && worker_pks="2:1 2:2 3:2 4:1"
    for pk in $worker_pks; do
        run "mpi_workers np=${pk%%:*} --local ${pk##*:}" -np "${pk%%:*}" "$workers" --local "${pk##*:}"
    done
fi

# Elastic training over MPI (tests/mpi_elastic.c): leave, grow, a crash relaunched.
elastic=$build/mpi_elastic
if [ -x "$elastic" ]; then
    run "mpi_elastic np=3 --leave" -np 3 "$elastic" --leave
    run "mpi_elastic np=2 --grow" -np 2 "$elastic" --grow
    edir=$(mktemp -d "${TMPDIR:-/tmp}/mpi_elastic.XXXXXX")
    # shellcheck disable=SC2034 # run_with's launcher, by name
    relaunch=(sh tools/elastic_launch.sh -n 3 -m 2 -r 1 -l "${mpirun[*]}")
    run_with relaunch "mpi_elastic elastic_launch np=3 crash -> np=2" "$elastic" --launch "$edir/ckpt"
    rm -rf "$edir"
fi

# Parameter servers across processes (tests/mpi_ps.c, 2 servers + 2 workers).
if [ -x "$psbin" ]; then
    run "mpi_ps np=4" -np 4 "$psbin"
fi
# The parameter-server strategy across processes (tests/mpi_strategy_ps.c).
if [ -x "$psstrat" ]; then
    run "mpi_strategy_ps np=4" -np 4 "$psstrat"
fi

# ps_fail NAME TF_CONFIG TEXT: examples/ps_mpi.c at np = 4 with that
# TF_CONFIG must end non-zero, not by the watchdog, with every process
# printing its role error, which holds TEXT.
ps_fail() {
    local name=$1 start rc p=0 f=0 lines
    echo "==== $name"
    start=$(now)
    TF_CONFIG=$2 timeout --kill-after=10 60 "${mpirun[@]}" -x TF_CONFIG -np 4 "$psdemo" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then p=$((p + 1)); else
        f=$((f + 1)); echo "mpi_collectives.sh: $name: exit status $rc, expected non-zero (not a watchdog kill)"; fi
    lines=$(grep -c '^ps_mpi (process [0-3]): dsgd_mpi_ps_role_create: ' "$log")
    if [ "$lines" -eq 4 ]; then p=$((p + 1)); else
        f=$((f + 1)); echo "mpi_collectives.sh: $name: $lines processes reported the role error, expected 4"; fi
    if [ "$(grep '^ps_mpi (process [0-3]): ' "$log" | grep -c -F "$3")" -eq 4 ]; then p=$((p + 1)); else
        f=$((f + 1)); echo "mpi_collectives.sh: $name: not every process's message holds \"$3\""; fi
    tally "$name" "$p" "$f"
    echo "---- $name: $p checks passed, $f failed, exit $rc, $(since "$start") s"
}
if [ -x "$psdemo" ]; then
    [ "$full" -eq 1 ] && ps_fail "ps_mpi np=4 malformed TF_CONFIG" '{"cluster": {"ps": ["a:1"]' "malformed JSON"
    ps_fail "ps_mpi np=4 TF_CONFIG of 5 tasks" \
        '{"cluster": {"worker": ["a:1", "b:1", "c:1"], "ps": ["d:1", "e:1"]}, "task": {"type": "worker", "index": 0}}' \
        "= 5 tasks, but the job has 4 processes"
fi

# The example across processes: its weights must equal the one-process
# run's, bit for bit (--verify), when it was built and the data are there.
mlp=$build/multi_worker_mlp
fmnist=${DSGD_FMNIST_DIR:-build/data/fashion-mnist}
if [ "$full" -eq 0 ]; then
    echo "==== multi_worker_mlp np=2 --verify: skipped (the full tier's)"
elif [ -x "$mlp" ] && [ -f "$fmnist/train-images-idx3-ubyte" ]; then
    echo "==== multi_worker_mlp np=2 --verify"
    start=$(now)
    timeout --kill-after=10 "$limit" "${mpirun[@]}" -np 2 "$mlp" --data "$fmnist" --epochs 1 --verify 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ] && grep -q '^verify: weights bitwise equal' "$log"; then tally mlp 1 0; else
        echo "mpi_collectives.sh: multi_worker_mlp --verify: exit $rc, no 'weights bitwise equal' line"; tally mlp 0 1; fi
    echo "---- multi_worker_mlp np=2 --verify: exit $rc, $(since "$start") s"
else
    echo "==== multi_worker_mlp np=2 --verify: skipped ($mlp or $fmnist/train-images-idx3-ubyte missing)"
fi

if [ -x "$pieces" ] && [ "$full" -eq 1 ]; then
    run "np=3 DSGD_MPI_MAX_MESSAGE=4096" -np 3 "$pieces"
    run "np=3 --local 2 DSGD_MPI_MAX_MESSAGE=4096" -np 3 "$pieces" --local 2
elif [ -x "$pieces" ]; then
    DSGD_TEST_LARGE=$large_pieces run "np=3 DSGD_MPI_MAX_MESSAGE=4096" -np 3 "$pieces"
fi

# MPICH busy-polls (two ranks take both cores for seconds): the full tier's.
if [ "$full" -eq 0 ]; then
    echo "==== MPICH: skipped (the full tier's)"
elif [ -x "$mpich" ]; then
    run_with mpichrun "MPICH np=2" -np 2 "$mpich"
    run_with mpichrun "MPICH np=2 --local 2" -np 2 "$mpich" --local 2
fi
if [ "$full" -eq 1 ] && [ -x "$build/mpi_workers_mpich" ]; then
    run_with mpichrun "MPICH mpi_workers np=2" -np 2 "$build/mpi_workers_mpich"
fi

echo "mpi_collectives.sh: $passed checks passed, $failed failed, in $((runs_passed + runs_failed)) runs, $(since "$began") s"
echo "$runs_passed passed, $runs_failed failed"
[ "$runs_failed" -eq 0 ]
