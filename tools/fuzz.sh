#!/usr/bin/env bash
# tools/fuzz.sh SECONDS FUZZER... - run each libFuzzer binary (build/fuzz/fuzz_NAME)
# for SECONDS on its seeds, fuzz/corpus/NAME (read only), and its working
# corpus, build/fuzz/corpus/NAME (what it finds worth keeping), with
# fuzz/NAME.dict when there is one. Prints each target's execution count and
# peak memory. A finding (a crash, a sanitizer report, a leak, an abort from
# the target's own checks) stops that target with libFuzzer's report and the
# input saved as build/fuzz/crash-*; the script then exits 1 after running
# the rest. The last line is "fuzz: N targets, N findings".
# FUZZ_JOBS targets run at once (default: the online CPUs; each fuzzer runs
# one process on one thread); their reports are printed in the order given.
set -uo pipefail

if [ $# -lt 2 ]; then
    echo "usage: tools/fuzz.sh SECONDS FUZZER..." >&2
    exit 2
fi
seconds=$1
shift
root=$(pwd)
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fuzz.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A fuzzer's target name: build/fuzz/fuzz_NAME -> NAME.
target_name() { # bin
    local n
    n=$(basename "$1")
    echo "${n#fuzz_}"
}

# Target number i (its log and exit status in $tmp/i.log, $tmp/i.rc).
run_target() { # i bin
    local name args
    name=$(target_name "$2")
    mkdir -p "$root/build/fuzz/corpus/$name"
    args=(-max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$root/build/fuzz/")
    [ -f "$root/fuzz/$name.dict" ] && args+=(-dict="$root/fuzz/$name.dict")
    "$root/$2" "${args[@]}" "$root/build/fuzz/corpus/$name" "$root/fuzz/corpus/$name" >"$tmp/$1.log" 2>&1
    echo $? >"$tmp/$1.rc"
}

targets=0
running=0
for bin in "$@"; do
    targets=$((targets + 1))
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    run_target "$targets" "$bin" &
    running=$((running + 1))
done
wait

findings=0
i=0
for bin in "$@"; do
    i=$((i + 1))
    name=$(target_name "$bin")
    rc=$(cat "$tmp/$i.rc" 2>/dev/null || echo 1)
    echo "==== $name: $seconds s"
    if [ "$rc" -ne 0 ]; then
        findings=$((findings + 1))
        tail -n 60 "$tmp/$i.log"
        echo "FINDING in $name (exit $rc); the input is in build/fuzz/"
    else
        grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$tmp/$i.log"
    fi
done
echo "fuzz: $targets targets, $findings findings"
[ $findings -eq 0 ]
