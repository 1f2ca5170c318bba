#!/usr/bin/env bash
# tools/fuzz.sh SECONDS FUZZER... - run each libFuzzer binary (build/fuzz/fuzz_NAME)
# for SECONDS on its seeds, fuzz/corpus/NAME (read only), and its working
# corpus, build/fuzz/corpus/NAME (what it finds worth keeping), with
# fuzz/NAME.dict when there is one. Prints each target's execution count and
# peak memory. A finding (a crash, a sanitizer report, a leak, an abort from
# the target's own checks) stops that target with libFuzzer's report and the
# input saved as build/fuzz/crash-*; the script then exits 1 after running
# the rest. The last line is "fuzz: N targets, N findings".
set -uo pipefail

if [ $# -lt 2 ]; then
    echo "usage: tools/fuzz.sh SECONDS FUZZER..." >&2
    exit 2
fi
seconds=$1
shift
root=$(pwd)
findings=0
targets=0
for bin in "$@"; do
    name=$(basename "$bin")
    name=${name#fuzz_}
    targets=$((targets + 1))
    mkdir -p "$root/build/fuzz/corpus/$name"
    args=(-max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$root/build/fuzz/")
    [ -f "$root/fuzz/$name.dict" ] && args+=(-dict="$root/fuzz/$name.dict")
    log=$(mktemp "${TMPDIR:-/tmp}/fuzz.XXXXXX")
    echo "==== $name: $seconds s"
    "$root/$bin" "${args[@]}" "$root/build/fuzz/corpus/$name" "$root/fuzz/corpus/$name" >"$log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then
        findings=$((findings + 1))
        tail -n 60 "$log"
        echo "FINDING in $name (exit $rc); the input is in build/fuzz/"
    else
        grep -E '^(Done|stat::number_of_executed_units|stat::peak_rss_mb)' "$log"
    fi
    rm -f "$log"
done
echo "fuzz: $targets targets, $findings findings"
[ $findings -eq 0 ]
