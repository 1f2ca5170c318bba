#!/bin/sh
# bench/overlap_mpi.sh - bench/overlap_mpi.c (a multi-worker step with the
# gradient exchange after backward and beside it) over TCP on this
# machine's loopback throttled by tc, so that the link, not the CPU, bounds
# the exchange, as between machines: np 4, then np 2 for comparison,
# $REPEATS times in turn (each run: the bench's medians of interleaved
# off/on rounds, $ROUNDS of them, default 9), then a SUMMARY line per np and
# link with the spread over the runs.
#
# The throttle: an htb qdisc on lo sends packets from or to the ports
# OpenMPI's TCP transport is told to use (49984..50047: btl_tcp_port_min_v4,
# btl_tcp_port_range_v4) through a class of np x $LINK, everything else
# through a class of 100gbit, so other programs on the loopback are not
# slowed. lo is
# one device, so the class is shared by every rank and both directions; in
# the ring every rank sends as much as every other at the same time, so a
# class of np x LINK gives each rank about LINK, as a NIC of LINK per
# machine would (one direction; a NIC sends and receives at once). LINKS
# lists the links to run in turn; "none" is the loopback as it is (the
# class then at 100gbit), for comparison on the same machine at the same
# time. No delay
# is added (netem is often missing; at 0.2-0.4 MB a message the rate
# dominates a LAN's latency). It needs root (CAP_NET_ADMIN): without, or where lo already has a qdisc, the script
# says so and stops. The qdisc is removed on exit, also on failure or
# interrupt (trap). Runs take /tmp/bench.lock (flock), so timed runs of
# others do not overlap.
#
#   sh bench/overlap_mpi.sh              (make bench-overlap-mpi builds first)
#   LINKS="500mbit none" NPS="4" REPEATS=5 ARGS="--bucket 131072" sh bench/overlap_mpi.sh
#   LINKS=none sh bench/overlap_mpi.sh   (the loopback as it is; no tc needed)
# MCA="--mca mpi_yield_when_idle 1" adds MPI settings to every run. NICE=-10
# runs the ranks at that nice level (root), nearer a machine of their own
# where other work shares the CPUs; it slows that work meanwhile.
set -eu
BUILD=${BUILD:-build}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
LINKS=${LINKS:-1gbit}
NPS=${NPS:-4 2}
REPEATS=${REPEATS:-3}
ROUNDS=${ROUNDS:-9}
ARGS=${ARGS:-}
MCA=${MCA:-}
NICE=${NICE:-0}
BIN=$BUILD/mpi/overlap_mpi
PORTS="--mca btl_tcp_port_min_v4 49984 --mca btl_tcp_port_range_v4 64"
OUT=$(mktemp)

THROTTLE=
for l in $LINKS; do [ "$l" = none ] || THROTTLE=yes; done

unthrottle() { tc qdisc del dev lo root 2>/dev/null || true; }
cleanup() {
    [ -z "$THROTTLE" ] || unthrottle
    rm -f "$OUT" "$OUT.run"
}

# link x np as tc writes a rate: the number times np, the unit kept.
class_rate() { # link np
    [ "$1" != none ] || { echo 100gbit; return; }
    echo "$1" | awk -v n="$2" '{ match($0, /^[0-9.]+/); printf "%g%s", n * substr($0, 1, RLENGTH), substr($0, RLENGTH + 1) }'
}

exec 9>/tmp/bench.lock
flock 9
echo "overlap_mpi.sh: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(nproc) CPUs online, load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$THROTTLE" ]; then
    if ! command -v tc >/dev/null 2>&1; then
        echo "overlap_mpi.sh: tc not found (iproute2): cannot throttle; LINKS=none runs the loopback as it is"
        exit 1
    fi
    if tc qdisc show dev lo | grep -qv 'noqueue'; then
        echo "overlap_mpi.sh: lo already has a qdisc ($(tc qdisc show dev lo | head -1)): left alone, nothing run"
        exit 1
    fi
fi
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM
if [ -n "$THROTTLE" ]; then
    if ! { tc qdisc add dev lo root handle 1: htb default 2 &&
        tc class add dev lo parent 1: classid 1:1 htb rate 100gbit burst 256kb cburst 256kb quantum 200000 &&
        tc class add dev lo parent 1: classid 1:2 htb rate 100gbit quantum 200000 &&
        tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dport 49984 0xffc0 flowid 1:1 &&
        tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport 49984 0xffc0 flowid 1:1; } 2>/dev/null; then
        echo "overlap_mpi.sh: tc could not throttle lo here (no CAP_NET_ADMIN, or no sch_htb/cls_u32)"
        exit 1
    fi
fi

r=1
while [ "$r" -le "$REPEATS" ]; do
    for np in $NPS; do
      for link in $LINKS; do
        label=loopback
        if [ -n "$THROTTLE" ]; then
            tc class change dev lo parent 1: classid 1:1 htb rate "$(class_rate "$link" "$np")" burst 256kb \
                cburst 256kb quantum 200000
            [ "$link" = none ] || label="lo-$link-per-rank"
            [ "$r" -gt 1 ] || echo "overlap_mpi.sh: np $np, $label: lo's MPI ports through $(tc class show dev lo classid 1:1)"
        fi
        echo "==== run $r, np $np, $label, nice $NICE $MCA $ARGS"
        rc=0
        # shellcheck disable=SC2086
        timeout 300 nice -n "$NICE" $MPIRUN -np "$np" --mca btl tcp,self $PORTS $MCA "$BIN" --label "$label" --rounds "$ROUNDS" $ARGS >"$OUT.run" 2>&1 || rc=$?
        cat "$OUT.run"
        cat "$OUT.run" >>"$OUT"
        if [ "$rc" -ne 0 ]; then
            echo "overlap_mpi.sh: np $np failed (exit $rc)"
            exit "$rc"
        fi
      done
    done
    r=$((r + 1))
done

# The spread over the runs: per np and link, the range of each run's on/off ratio,
# hidden fraction and exchange with overlap.
awk '/^RESULT overlap_mpi/ {
        for (i = 3; i <= NF; ++i) { split($i, kv, "="); f[kv[1]] = kv[2] }
        g = "label=" f["label"] " n=" f["n"]
        if (f["mode"] != "on") { off[g] = f["ms_per_step"]; offx[g] = f["exchange_ms"]; offc[g] = f["cpu_ms"]; next }
        k = ++runs[g]
        v[g, k] = f["vs_off"]; h[g, k] = f["hidden"]; x[g, k] = f["exchange_ms"]; c[g, k] = f["cpu_ms"]
        on[g, k] = f["ms_per_step"]; of[g, k] = off[g]; ox[g, k] = offx[g]; oc[g, k] = offc[g]
    }
    function range(a, g, k,    i, lo, hi) {
        lo = hi = a[g, 1]
        for (i = 2; i <= k; ++i) { if (a[g, i] + 0 < lo + 0) lo = a[g, i]; if (a[g, i] + 0 > hi + 0) hi = a[g, i] }
        return lo == hi ? lo : lo "-" hi
    }
    END {
        for (g in runs)
            printf "SUMMARY overlap_mpi %s runs=%d off_ms=%s on_ms=%s vs_off=%s hidden=%s exchange_off_ms=%s " \
                   "exchange_on_ms=%s cpu_off_ms=%s cpu_on_ms=%s\n",
                g, runs[g], range(of, g, runs[g]), range(on, g, runs[g]), range(v, g, runs[g]), range(h, g, runs[g]),
                range(ox, g, runs[g]), range(x, g, runs[g]), range(oc, g, runs[g]), range(c, g, runs[g])
    }' "$OUT" | sort
