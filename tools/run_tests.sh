#!/usr/bin/env bash
# tools/run_tests.sh BINARY... - run cmocka test binaries and sum their results.
#
# Runs each binary from the current directory, shows its output, and reads
# cmocka's summary lines ("[  PASSED  ] N test(s).", "[  FAILED  ] N test(s),
# listed below:", "[  SKIPPED ] N test(s), listed below:") to count tests across
# all binaries. A binary that exits non-zero (a crash, a sanitizer report, a
# timeout) without reporting any failed test counts as one failed test, so a
# problem after cmocka's summary (e.g. a leak found at exit) is not lost.
# A binary that prints no cmocka summary but ends its output with a line
# "N passed, N failed" (tests/soak.c: one per seed) is counted by that line.
# The last line printed is always "N passed, N failed" (", N skipped" when any
# test was skipped). Exit status: 0 when nothing failed, 1 otherwise.
#
# Environment:
#   TEST_TIMEOUT   seconds each binary may run (default 600), then it is killed
#   ASAN_OPTIONS   default detect_leaks=1 (the Makefile sets it)
#   UBSAN_OPTIONS  default print_stacktrace=1
#   TSAN_OPTIONS   default halt_on_error=1 (the Makefile sets it)
#   LSAN_OPTIONS   tools/lsan.supp, when that file exists, is added as
#                  suppressions (for leaks inside third-party libraries)
set -uo pipefail

if [ $# -eq 0 ]; then
    echo "usage: tools/run_tests.sh BINARY..." >&2
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

log=$(mktemp "${TMPDIR:-/tmp}/run_tests.XXXXXX")
trap 'rm -f "$log"' EXIT

total_pass=0
total_fail=0
total_skip=0
failed_bins=()

# Sums the N of every line of the log matching "[  WORD  ] N test(s)".
sum_tag() {
    sed -n "s/^\[ *$1 *\] \([0-9][0-9]*\) test(s).*/\1/p" "$log" |
        awk '{ s += $1 } END { print s + 0 }'
}

# Runs one binary, streaming its output and keeping a copy in $log.
run_one() {
    "${stdbuf_cmd[@]}" timeout --kill-after=10 "$timeout_s" "$1" 2>&1 | tee "$log"
    return "${PIPESTATUS[0]}"
}

for bin in "$@"; do
    echo "==== $bin"
    if [ ! -x "$bin" ]; then
        echo "run_tests.sh: $bin: not an executable file"
        total_fail=$((total_fail + 1))
        failed_bins+=("$bin (missing)")
        continue
    fi
    start=$(date +%s)
    run_one "$bin"
    rc=$?
    # Old TSan runtimes abort on kernels with high mmap randomisation; run
    # again with address-space randomisation off when setarch allows it.
    if [ $rc -ne 0 ] && grep -q "ThreadSanitizer: unexpected memory mapping" "$log" &&
        setarch "$(uname -m)" -R true 2>/dev/null; then
        echo "(ThreadSanitizer needs ASLR off on this kernel: running again under setarch -R)"
        stdbuf_cmd=(setarch "$(uname -m)" -R "${stdbuf_cmd[@]}")
        run_one "$bin"
        rc=$?
    fi
    pass=$(sum_tag PASSED)
    fail=$(sum_tag FAILED)
    skip=$(sum_tag SKIPPED)
    if [ "$pass" -eq 0 ] && [ "$fail" -eq 0 ] && [ "$skip" -eq 0 ]; then
        own=$(tail -n 1 "$log" | sed -n 's/^\([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$/\1 \2/p')
        if [ -n "$own" ]; then
            read -r pass fail <<<"$own"
        fi
    fi
    elapsed=$(($(date +%s) - start))
    why=""
    if [ $rc -ne 0 ] && [ "$fail" -eq 0 ]; then
        fail=1
        case $rc in
        124 | 137) why="timed out after ${timeout_s}s" ;;
        *) if [ $rc -gt 128 ]; then why="killed by signal $((rc - 128))"; else why="exit status $rc"; fi ;;
        esac
        echo "run_tests.sh: $bin: $why, counted as 1 failed test"
    fi
    if [ "$fail" -gt 0 ]; then
        failed_bins+=("$bin${why:+ ($why)}")
    fi
    echo "---- $bin: $pass passed, $fail failed, $skip skipped, exit $rc, ${elapsed}s"
    total_pass=$((total_pass + pass))
    total_fail=$((total_fail + fail))
    total_skip=$((total_skip + skip))
done

echo
echo "==== $# test binaries"
for b in "${failed_bins[@]+"${failed_bins[@]}"}"; do
    echo "FAILED: $b"
done
summary="$total_pass passed, $total_fail failed"
if [ "$total_skip" -gt 0 ]; then
    summary="$summary, $total_skip skipped"
fi
echo "$summary"
[ "$total_fail" -eq 0 ]
