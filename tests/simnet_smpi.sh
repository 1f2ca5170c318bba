#!/bin/sh
# tests/simnet_smpi.sh - the simnet transport's all-reduce times against
# SimGrid's SMPI: ring (p = 3, 4, 5, 8, 16) and halving-doubling
# (p = 4, 8, 16) at counts 1009, 65536 and 1000003, within 1%.
#
# Both sides model the same network: every pair of ranks 2 us apart
# (SMPI: a cluster whose private links have 1 us latency each, a backbone
# with none), 10 GB/s (beta 1e-10 s per byte), full duplex (SPLITDUPLEX
# private links, a FATPIPE backbone), reductions free. SMPI runs with the
# constant-rate model CM02, cross-traffic off, its latency and bandwidth
# correction factors 1, the TCP window bound off, and the time of the
# program's own code not simulated. The SMPI program (tests/simnet_smpi.c
# built with smpicc) sends the messages collectives.h sends: the
# agreement's rounds, then the algorithm's steps with dsgd_block_range's
# blocks.
#
# Without smpicc and smpirun (Debian: apt-get install libsimgrid-dev simgrid)
# it prints "skipped" and a cmocka-style SKIPPED line, and exits 0: nothing
# was compared. Output ends with cmocka-style summary lines, so
# tools/run_tests.sh counts it. Run from the repository root:
#     sh tests/simnet_smpi.sh [build-dir]     (default build/smpi)
set -u
out=${1:-build/smpi}
if ! command -v smpicc >/dev/null 2>&1 || ! command -v smpirun >/dev/null 2>&1; then
    echo "simnet_smpi: skipped: SMPI (smpicc, smpirun) is not installed (apt-get install libsimgrid-dev simgrid)"
    echo "[  SKIPPED ] 1 test(s), listed below:"
    echo "[  SKIPPED ] simnet_smpi"
    exit 0
fi
mkdir -p "$out"
cc=${CC:-cc}
$cc -std=c99 -O2 -I. tests/simnet_smpi.c -o "$out/simnet_side" -lm -lpthread || exit 1
smpicc -O2 -DSIMNET_SMPI_SIDE tests/simnet_smpi.c -o "$out/smpi_side" 2>/dev/null || exit 1
cat > "$out/platform.xml" <<'XML'
<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<platform version="4.1">
  <cluster id="c" prefix="node-" suffix="" radical="0-15" speed="1Gf" bw="10GBps" lat="1us"
           bb_bw="1000000GBps" bb_lat="0us" sharing_policy="SPLITDUPLEX" bb_sharing_policy="FATPIPE"/>
</platform>
XML
seq -f "node-%g" 0 15 > "$out/hosts"
cfg="--cfg=network/model:CM02 --cfg=network/crosstraffic:0 --cfg=network/TCP-gamma:0 \
--cfg=smpi/bw-factor:1 --cfg=smpi/lat-factor:1 --cfg=smpi/simulate-computation:no"
passed=0
failed=0
failures=""
check() { # algo p n
    sim=$("$out/simnet_side" "$1" "$2" "$3") || { echo "simnet side failed: $1 p=$2 n=$3"; return 1; }
    agree=$(echo "$sim" | awk '/^AGREE/ {print $2}')
    ts=$(echo "$sim" | awk '/^SIMNET/ {print $5}')
    tm=$(smpirun -np "$2" -platform "$out/platform.xml" -hostfile "$out/hosts" $cfg \
        "$out/smpi_side" "$1" "$3" "$agree" 2>/dev/null | awk '/^SMPI/ {print $5}')
    [ -n "$tm" ] || { echo "SMPI side failed: $1 p=$2 n=$3"; return 1; }
    awk -v a="$ts" -v b="$tm" -v what="$1 p=$2 n=$3" 'BEGIN {
        d = (a - b) / b; if (d < 0) d = -d;
        printf "%-34s simnet %.9f s  SMPI %.9f s  diff %.3f%%\n", what, a, b, 100 * d;
        exit d <= 0.01 ? 0 : 1 }'
}
for n in 1009 65536 1000003; do
    for p in 3 4 5 8 16; do
        if check ring $p $n; then passed=$((passed + 1)); else failed=$((failed + 1)); failures="$failures ring/$p/$n"; fi
    done
    for p in 4 8 16; do
        if check halving_doubling $p $n; then passed=$((passed + 1)); else failed=$((failed + 1)); failures="$failures hd/$p/$n"; fi
    done
done
echo "[  PASSED  ] $passed test(s)."
if [ "$failed" -gt 0 ]; then
    echo "[  FAILED  ] $failed test(s), listed below:"
    for f in $failures; do echo "[  FAILED  ] $f"; done
    exit 1
fi
exit 0
