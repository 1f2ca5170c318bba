#!/usr/bin/env bash
# tools/run_tests.sh BINARY... - run cmocka test binaries and sum their results.
#
# Runs the binaries from the current directory, TEST_JOBS at a time (default:
# the number of CPUs; scripts, *.sh, run alone), shows each one's output when
# it is done, in the order given, and reads
# cmocka's summary lines ("[  PASSED  ] N test(s).", "[  FAILED  ] N test(s),
# listed below:", "[  SKIPPED ] N test(s), listed below:") to count tests across
# all binaries. A binary that exits non-zero (a crash, a sanitizer report, a
# timeout) without reporting any failed test counts as one failed test, so a
# problem after cmocka's summary (e.g. a leak found at exit) is not lost.
# A binary that prints no cmocka summary but ends its output with a line
# "N passed, N failed" (tests/soak.c: one per seed) is counted by that line.
# make test runs each binary as a make target of its own (--one BINARY
# RESULT: the counts into RESULT, the output into RESULT.out), so that make
# -j runs them beside the other checks, then prints them all in order with
# the summary (--report RESULT...; a missing RESULT counts as a failure).
# The last line printed is always "N passed, N failed" (", N skipped" when any
# test was skipped). Exit status: 0 when nothing failed, 1 otherwise.
#
# Environment:
#   TEST_TIMEOUT   seconds each binary may run (default 600), then it is killed
#   TEST_JOBS      binaries run at once (default: the number of CPUs)
#   TEST_START     a start time (date +%s): its wall time is printed before
#                  the summary (make test sets it)
#   ASAN_OPTIONS   default detect_leaks=1 (the Makefile sets it)
#   UBSAN_OPTIONS  default print_stacktrace=1
#   TSAN_OPTIONS   default halt_on_error=1 (the Makefile sets it)
#   LSAN_OPTIONS   tools/lsan.supp, when that file exists, is added as
#                  suppressions (for leaks inside third-party libraries)
set -uo pipefail

usage="usage: tools/run_tests.sh BINARY... | --one BINARY RESULT | --report RESULT..."
if [ $# -eq 0 ]; then
    echo "$usage" >&2
    exit 2
fi

timeout_s=${TEST_TIMEOUT:-600}

# cmocka prints progress on stdout and its summaries on stderr; line-buffering
# both keeps them in order. stdbuf works by LD_PRELOAD, which ASan would
# otherwise refuse because its runtime is then not first in the library list.
stdbuf_cmd=()
if command -v stdbuf >/dev/null 2>&1; then
    stdbuf_cmd=(stdbuf -oL -eL)
fi

export CMOCKA_MESSAGE_OUTPUT=STDOUT
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
if [ ${#stdbuf_cmd[@]} -gt 0 ]; then
    ASAN_OPTIONS="verify_asan_link_order=0:$ASAN_OPTIONS"
fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}"
tools_dir=$(cd "$(dirname "$0")" && pwd)
if [ -f "$tools_dir/lsan.supp" ]; then
    export LSAN_OPTIONS="suppressions=$tools_dir/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/run_tests.XXXXXX")
trap 'rm -rf "$work"' EXIT

total_pass=0
total_fail=0
total_skip=0
failed_bins=()

# Sums the N of every line of log $2 matching "[  WORD  ] N test(s)".
sum_tag() {
    sed -n "s/^\[ *$1 *\] \([0-9][0-9]*\) test(s).*/\1/p" "$2" |
        awk '{ s += $1 } END { print s + 0 }'
}

# Runs one binary with its output in log $2.
run_one() {
    "${stdbuf_cmd[@]}" timeout --kill-after=10 "$timeout_s" "$1" >"$2" 2>&1
}

# run_bin BIN RES: runs BIN, its output into RES.out; then its counts, "bin
# pass fail skip rc elapsed why", into RES (written last: its presence says
# the binary is done).
run_bin() {
    local bin=$1 res=$2 out="$2.out" start rc pass fail skip own why=""
    local cmd=("${stdbuf_cmd[@]}")
    start=$(date +%s)
    if [ ! -x "$bin" ]; then
        echo "run_tests.sh: $bin: not an executable file" >"$out"
        echo "$bin 0 1 0 127 0 missing" >"$res"
        return
    fi
    run_one "$bin" "$out"
    rc=$?
    # Old TSan runtimes abort on kernels with high mmap randomisation; run
    # again with address-space randomisation off when setarch allows it.
    if [ $rc -ne 0 ] && grep -q "ThreadSanitizer: unexpected memory mapping" "$out" &&
        setarch "$(uname -m)" -R true 2>/dev/null; then
        stdbuf_cmd=(setarch "$(uname -m)" -R "${cmd[@]}")
        run_one "$bin" "$out.again"
        rc=$?
        { echo "(ThreadSanitizer needs ASLR off on this kernel: ran again under setarch -R)"; cat "$out.again"; } >"$out"
    fi
    pass=$(sum_tag PASSED "$out")
    fail=$(sum_tag FAILED "$out")
    skip=$(sum_tag SKIPPED "$out")
    if [ "$pass" -eq 0 ] && [ "$fail" -eq 0 ] && [ "$skip" -eq 0 ]; then
        own=$(tail -n 1 "$out" | sed -n 's/^\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$/\1 \2/p')
        if [ -n "$own" ]; then
            read -r pass fail <<<"$own"
        fi
    fi
    if [ $rc -ne 0 ] && [ "$fail" -eq 0 ]; then
        fail=1
        case $rc in
        124 | 137) why="timed out after ${timeout_s}s" ;;
        *) if [ $rc -gt 128 ]; then why="killed by signal $((rc - 128))"; else why="exit status $rc"; fi ;;
        esac
        echo "run_tests.sh: $bin: $why, counted as 1 failed test" >>"$out"
    fi
    echo "$bin $pass $fail $skip $rc $(($(date +%s) - start)) $why" >"$res.tmp" && mv "$res.tmp" "$res"
}

# Prints the finished binaries' outputs and counts, in the order of ress.
printed=0
ress=()
flush() {
    local pass fail skip rc elapsed why bin res
    while [ $printed -lt ${#ress[@]} ] && [ -f "${ress[printed]}" ]; do
        res=${ress[printed]}
        read -r bin pass fail skip rc elapsed why <"$res"
        echo "==== $bin"
        cat "$res.out"
        if [ "$fail" -gt 0 ]; then
            failed_bins+=("$bin${why:+ ($why)}")
        fi
        echo "---- $bin: $pass passed, $fail failed, $skip skipped, exit $rc, ${elapsed}s"
        total_pass=$((total_pass + pass))
        total_fail=$((total_fail + fail))
        total_skip=$((total_skip + skip))
        printed=$((printed + 1))
    done
}

case $1 in
--one) # make test runs each binary as a target of its own (make -j schedules them)
    [ $# -eq 3 ] || { echo "$usage" >&2; exit 2; }
    rm -f "$3" "$3.out"
    run_bin "$2" "$3"
    exit 0 ;;
--report)
    shift
    ress=("$@") ;;
*)  # TEST_JOBS binaries at once; a script (*.sh: the MPI suite, which starts
    # processes of its own) runs alone.
    jobs_max=${TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
    bins=("$@")
    for ((i = 0; i < ${#bins[@]}; ++i)); do
        ress[i]="$work/$i.res"
    done
    for ((i = 0; i < ${#bins[@]}; ++i)); do
        bin=${bins[i]}
        if [[ $bin == *.sh ]]; then
            wait
            flush
            run_bin "$bin" "${ress[i]}"
        else
            while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do
                wait -n
                flush
            done
            run_bin "$bin" "${ress[i]}" &
        fi
        flush
    done
    wait ;;
esac
# a result that is missing (its binary was never run) counts as a failure
for ((i = 0; i < ${#ress[@]}; ++i)); do
    if [ ! -f "${ress[i]}" ]; then
        echo "run_tests.sh: ${ress[i]}: no result: the binary was not run" >"$work/missing.$i.res.out"
        echo "${ress[i]} 0 1 0 0 0 no result" >"$work/missing.$i.res"
        ress[i]="$work/missing.$i.res"
    fi
done
flush

echo
echo "==== ${#ress[@]} test binaries"
for b in "${failed_bins[@]+"${failed_bins[@]}"}"; do
    echo "FAILED: $b"
done
if [ -n "${TEST_START:-}" ]; then
    wall=$(($(date +%s) - TEST_START))
    echo "wall time: $((wall / 60)) min $((wall % 60)) s (from the start of the make target)"
fi
summary="$total_pass passed, $total_fail failed"
if [ "$total_skip" -gt 0 ]; then
    summary="$summary, $total_skip skipped"
fi
echo "$summary"
[ "$total_fail" -eq 0 ]
