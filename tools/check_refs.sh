#!/usr/bin/env bash
# tools/check_refs.sh - the files a user reads speak only of the product.
# Run from the repository root, no arguments. Three checks, each printing the
# lines that break it:
#   1. no ticket numbers ("issue N") and no ../shared paths in the library
#      (distsgd/, the maps distsgd*.h, single_include/), README.md or docs/;
#   2. no paths to the repository's tests/, bench/, examples/, experiments/
#      or tools/ files or programs in the library (its comments and messages name public
#      functions and documented programs, not source files);
#   3. no package-index address (pypi.org, download.pytorch.org,
#      files.pythonhosted.org, --index-url with a URL) in any tracked file:
#      an index is something the user passes, never a built-in default.
# Prints "check-refs: ok" or "check-refs: N problems", then "P passed, F
# failed" (one per check). Exit status 0 when every check passes, else 1.
set -u
cd "$(dirname "$0")/.." || exit 2

passed=0
failed=0
problems=0

# The paths among $@ that exist (docs/ may not yet).
existing() {
    local p
    for p in "$@"; do
        if [ -e "$p" ]; then printf '%s\n' "$p"; fi
    done
}

# check NAME: reads grep -n style hits on stdin and counts them.
check() {
    local name=$1 hits n
    hits=$(cat)
    if [ -z "$hits" ]; then
        passed=$((passed + 1))
        echo "ok    $name"
    else
        n=$(printf '%s\n' "$hits" | wc -l)
        problems=$((problems + n))
        failed=$((failed + 1))
        echo "FAIL  $name ($n line(s)):"
        printf '%s\n' "$hits" | sed 's/^/  /'
    fi
}

mapfile -t lib < <(existing distsgd distsgd.h distsgd_cl.h distsgd_mpi.h single_include)
mapfile -t docs < <(existing distsgd distsgd.h distsgd_cl.h distsgd_mpi.h single_include README.md docs)

# 1. ticket numbers and ../shared
hits_tickets() {
    if [ ${#docs[@]} -gt 0 ]; then
        grep -rnIE 'issue [0-9]|\.\./shared' -- "${docs[@]}"
    fi
}
check "no 'issue N' or ../shared in the library, README.md, docs/" < <(hits_tickets)

# 2. repository paths in the library: a file or program under tests/,
#    bench/, examples/, experiments/ or tools/ (tests/x.c, bench/allreduce,
#    build/examples/list_devices_cl alike)
hits_paths() {
    if [ ${#lib[@]} -gt 0 ]; then
        grep -rnIE '(^|[^A-Za-z0-9_.])(tests|bench|examples|experiments|tools)/[A-Za-z0-9_]' \
            -- "${lib[@]}"
    fi
}
check "no tests/, bench/, examples/, experiments/, tools/ paths in the library" < <(hits_paths)

# 3. package-index addresses in tracked files (this script names them; a
#    tracked file missing from the work tree is skipped)
hits_index() {
    git ls-files -z -- . ':!tools/check_refs.sh' |
        xargs -0 -r grep -snIE 'pypi\.org|download\.pytorch\.org|files\.pythonhosted\.org|--index-url[= ]+["'\'']?https?://' --
}
check "no package-index address in tracked files" < <(hits_index)

if [ "$problems" -eq 0 ]; then
    echo "check-refs: ok"
else
    echo "check-refs: $problems problems"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
