#!/bin/sh
# bench/breakeven_mpi.sh - bench/breakeven_mpi.c at np 2 over TCP on this
# machine's loopback, then again with the MPI processes' TCP traffic
# throttled to $RATE (default 200mbit) by tc, so that both sides of the
# break-even are seen.
#
# The throttle: an htb qdisc on lo sends packets from or to the ports
# OpenMPI's TCP transport is told to use (49984..50047: btl_tcp_port_min_v4,
# btl_tcp_port_range_v4) through a class of $RATE, everything else through
# a class of 100gbit, so other programs on the loopback are not slowed (the
# rate is shared by both directions: lo is one device). It
# needs root (CAP_NET_ADMIN); without, the throttled run is skipped with a
# note. The qdisc is removed on exit, also on failure or interrupt (trap).
# Runs take /tmp/bench.lock (flock), so timed runs of others do not overlap.
#
#   sh bench/breakeven_mpi.sh            (make bench-breakeven-mpi builds first)
#   RATE=100mbit ARGS="--rounds 7" sh bench/breakeven_mpi.sh
set -eu
BUILD=${BUILD:-build}
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}
RATE=${RATE:-200mbit}
ARGS=${ARGS:-}
BIN=$BUILD/mpi/breakeven_mpi
PORTS="--mca btl_tcp_port_min_v4 49984 --mca btl_tcp_port_range_v4 64"

run() { # label, then the bench's own flags
    label=$1
    shift
    # shellcheck disable=SC2086
    timeout 300 $MPIRUN -np 2 --mca btl tcp,self $PORTS "$BIN" --label "$label" "$@" $ARGS
}

exec 9>/tmp/bench.lock
flock 9
run loopback

unthrottle() { tc qdisc del dev lo root 2>/dev/null || true; }
if ! command -v tc >/dev/null 2>&1; then
    echo "breakeven_mpi.sh: tc not found (iproute2): the throttled run is skipped"
    exit 0
fi
if tc qdisc show dev lo | grep -qv 'noqueue'; then
    echo "breakeven_mpi.sh: lo already has a qdisc ($(tc qdisc show dev lo | head -1)): left alone, throttled run skipped"
    exit 0
fi
trap unthrottle EXIT
trap 'unthrottle; exit 130' INT TERM
if ! { tc qdisc add dev lo root handle 1: htb default 2 &&
    tc class add dev lo parent 1: classid 1:1 htb rate "$RATE" burst 512kb cburst 512kb &&
    tc class add dev lo parent 1: classid 1:2 htb rate 100gbit &&
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dport 49984 0xffc0 flowid 1:1 &&
    tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip sport 49984 0xffc0 flowid 1:1; } 2>/dev/null; then
    echo "breakeven_mpi.sh: tc could not throttle lo here (no CAP_NET_ADMIN, or no sch_htb/cls_u32): the throttled run is skipped"
    exit 0
fi
run "lo-$RATE"
