#!/usr/bin/env bash
# tests/consumers.sh - builds distsgd the ways its users do, out of tree:
#   (0) README.md's minimal program is tests/consumer/main.c (the text of the
#       README's block, after the marker comment, is main.c from its #define
#       on), and it builds and runs vendored: main.c beside a copy of
#       single_include/distsgd.h named distsgd.h, with nothing else;
#   (a) `make install PREFIX=/usr DESTDIR=<tmp>/stage`, then tests/consumer/main.c
#       (the README's minimal program) with `pkg-config --cflags --libs distsgd`
#       pointed at the staged .pc (PKG_CONFIG_SYSROOT_DIR + PKG_CONFIG_PATH),
#       checking that the staged header is the one compiled, and running it;
#   (b) if pkg-config finds OpenCL and clblast: tests/consumer/main_cl.c the same
#       way with distsgd-opencl (lists the devices; none needed);
#   (c) `make uninstall` with the same PREFIX/DESTDIR leaves no file of ours and
#       keeps the files that were there before;
#   (d) if cmake is installed: tests/consumer/CMakeLists.txt with the repository
#       as add_subdirectory() and as FetchContent, built and run.
# One line per check, then "N passed, N failed"; exits 1 on any failure.
# Run from anywhere: bash tests/consumers.sh (or make test-consumers).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CC=${CC:-cc}
CFLAGS_STRICT="-std=c99 -Wall -Wextra -Wpedantic -Werror -O0" # packaging, not the optimiser: -O0 builds 3x faster
tmp=$(mktemp -d "${TMPDIR:-/tmp}/distsgd-consumers.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/stage
passed=0
failed=0
log=$tmp/log

ok() { echo "ok    $1"; passed=$((passed + 1)); }
bad() {
    echo "FAIL  $1"
    if [ -s "$log" ]; then sed 's/^/      | /' "$log" | tail -n 25; fi
    failed=$((failed + 1))
}
skip() { echo "skip  $1"; }
# check NAME COMMAND...: runs COMMAND with its output in $log.
check() {
    local name=$1; shift
    if "$@" >"$log" 2>&1; then ok "$name"; else bad "$name"; fi
}

version=$(sed -n 's/^#define DISTSGD_VERSION_STRING "\(.*\)".*/\1/p' "$root/distsgd.h")

# make with the install rules: the Makefile once it includes tools/install.mk,
# else the fragment beside it.
if grep -q '^[[:space:]]*-\{0,1\}include[[:space:]].*tools/install\.mk' "$root/Makefile"; then
    mk=(make --no-print-directory -C "$root")
else
    mk=(make --no-print-directory -C "$root" -f Makefile -f tools/install.mk)
fi
unset MAKEFLAGS MFLAGS MAKELEVEL || true

# ---------------------------------------------------------------- (0) README, vendored
readme_program() {
    local marker='<!-- minimal program: tests/consumer/main.c'
    awk -v m="$marker" 'index($0, m) == 1 { found = 1; next }
        found == 1 && /^```c$/ { found = 2; next }
        found == 2 && /^```$/ { exit }
        found == 2 { print }' "$root/README.md" >"$tmp/readme.c"
    [ -s "$tmp/readme.c" ] || { echo "README.md has no block after '$marker'"; return 1; }
    sed -n '/^#define DISTSGD_IMPLEMENTATION/,$p' "$root/tests/consumer/main.c" | diff "$tmp/readme.c" -
}
check "README.md's minimal program is tests/consumer/main.c" readme_program

vendored() {
    mkdir -p "$tmp/vendored" && cp "$root/tests/consumer/main.c" "$tmp/vendored/" &&
        cp "$root/single_include/distsgd.h" "$tmp/vendored/distsgd.h" || return 1
    # shellcheck disable=SC2086  # word splitting of CC and the flags is wanted
    (cd "$tmp/vendored" && $CC $CFLAGS_STRICT -I. main.c -o consumer -lm -lpthread) || return 1
    run_consumer "$tmp/vendored/consumer" "accuracy 1.00"
}

run_consumer() { # PROGRAM EXPECTED-LINE...
    local prog=$1 out; shift
    out=$("$prog") || { echo "$prog failed: $out"; return 1; }
    echo "$out"
    local want
    for want in "distsgd $version" "$@"; do
        grep -qxF "$want" <<<"$out" || { echo "no line '$want'"; return 1; }
    done
}
check "the minimal program on single_include/distsgd.h alone, vendored, prints 'accuracy 1.00'" vendored

# Files that must survive uninstall (someone else's header and .pc).
mkdir -p "$stage/usr/include" "$stage/usr/lib/pkgconfig"
echo '/* not ours */' > "$stage/usr/include/other.h"
echo 'Name: other' > "$stage/usr/lib/pkgconfig/other.pc"
find "$stage" -type f | sort > "$tmp/before"

# ---------------------------------------------------------------- (a) install + pkg-config
check "make install PREFIX=/usr DESTDIR=\$tmp/stage" "${mk[@]}" install PREFIX=/usr DESTDIR="$stage"

expect_files() {
    local f missing=""
    for f in usr/include/distsgd.h usr/include/distsgd_cl.h \
             usr/lib/pkgconfig/distsgd.pc usr/lib/pkgconfig/distsgd-opencl.pc; do
        [ -f "$stage/$f" ] || missing="$missing $f"
    done
    if [ -f "$root/single_include/distsgd.h" ] && [ ! -f "$stage/usr/include/distsgd/single/distsgd.h" ]; then
        missing="$missing usr/include/distsgd/single/distsgd.h"
    fi
    [ -z "$missing" ] || { echo "missing:$missing"; return 1; }
    cmp "$root/distsgd.h" "$stage/usr/include/distsgd.h" || return 1
    cmp "$root/distsgd_cl.h" "$stage/usr/include/distsgd_cl.h" || return 1
    for f in "$root"/distsgd/*.h "$root"/distsgd/cl/*.h; do
        cmp "$f" "$stage/usr/include/${f#"$root"/}" || return 1
    done
    ! grep -q "$stage" "$stage"/usr/lib/pkgconfig/distsgd*.pc || { echo "DESTDIR written into a .pc"; return 1; }
}
check "installed headers and .pc files (DESTDIR not in the .pc)" expect_files

export PKG_CONFIG_SYSROOT_DIR=$stage
export PKG_CONFIG_PATH=$stage/usr/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}

pc_version() {
    local v
    v=$(pkg-config --modversion distsgd)
    [ "$v" = "$version" ] || { echo "pkg-config --modversion distsgd: '$v', header: '$version'"; return 1; }
    pkg-config --validate distsgd 2>/dev/null || pkg-config --exists --print-errors distsgd
}
check "pkg-config --modversion distsgd = $version" pc_version

pc_flags() {
    local f
    f=$(pkg-config --cflags --libs distsgd)
    echo "flags: $f"
    case " $f " in *" -I$stage/usr/include "*) ;; *) echo "no -I$stage/usr/include"; return 1 ;; esac
    case " $f " in *" -lm "*) ;; *) echo "no -lm"; return 1 ;; esac
    case " $f " in *" -lpthread "*) ;; *) echo "no -lpthread"; return 1 ;; esac
}
check "pkg-config --cflags --libs distsgd gives the staged include dir, -lm, -lpthread" pc_flags

# Out of tree: the source alone in a folder of its own, so that only -I finds
# the header; -MD records which header was compiled.
mkdir -p "$tmp/pc"
cp "$root/tests/consumer/main.c" "$root/tests/consumer/main_cl.c" "$tmp/pc/"
build_pc() { # SRC OUT PACKAGE HEADER
    # shellcheck disable=SC2046,SC2086  # word splitting of CC, CFLAGS and pkg-config output is wanted
    (cd "$tmp/pc" && $CC $CFLAGS_STRICT $(pkg-config --cflags "$3") -MD -MF "$2.d" "$1" \
        -o "$2" $(pkg-config --libs "$3")) || return 1
    grep -q "$stage/usr/include/$4" "$tmp/pc/$2.d" || { echo "did not compile $stage/usr/include/$4:"; cat "$tmp/pc/$2.d"; return 1; }
    if grep -q "$root/" "$tmp/pc/$2.d"; then echo "compiled a header of the repository:"; cat "$tmp/pc/$2.d"; return 1; fi
}
check "consumer builds via pkg-config against the staged distsgd.h ($CC -std=c99 -Werror)" \
    build_pc main.c consumer distsgd distsgd.h

check "pkg-config consumer prints 'accuracy 1.00'" run_consumer "$tmp/pc/consumer" "accuracy 1.00"

# ---------------------------------------------------------------- (b) OpenCL
(unset PKG_CONFIG_SYSROOT_DIR; pkg-config --exists OpenCL clblast) && have_cl=1 || have_cl=0
if [ "$have_cl" = 1 ]; then
    # shellcheck disable=SC2016  # $1 is expanded by the inner bash
    check "pkg-config --modversion distsgd-opencl = $version" \
        bash -c '[ "$(pkg-config --modversion distsgd-opencl)" = "$1" ]' _ "$version"
    check "OpenCL consumer builds via pkg-config distsgd-opencl against the staged distsgd_cl.h" \
        build_pc main_cl.c consumer_cl distsgd-opencl distsgd_cl.h
    run_cl() {
        local out
        out=$(POCL_MAX_PTHREAD_COUNT=2 "$tmp/pc/consumer_cl") || { echo "$out"; return 1; }
        echo "$out"
        grep -qxF "distsgd $version" <<<"$out" && grep -qE '^opencl devices [0-9]+$' <<<"$out"
    }
    check "OpenCL consumer lists devices ($(POCL_MAX_PTHREAD_COUNT=2 "$tmp/pc/consumer_cl" 2>/dev/null | sed -n 's/^opencl //p'))" run_cl
else
    skip "OpenCL consumer via pkg-config (pkg-config finds no OpenCL and clblast)"
fi
unset PKG_CONFIG_SYSROOT_DIR
export PKG_CONFIG_PATH=${PKG_CONFIG_PATH#"$stage/usr/lib/pkgconfig"}
PKG_CONFIG_PATH=${PKG_CONFIG_PATH#:}

# ---------------------------------------------------------------- (c) uninstall
check "make uninstall PREFIX=/usr DESTDIR=\$tmp/stage" "${mk[@]}" uninstall PREFIX=/usr DESTDIR="$stage"
left_behind() {
    find "$stage" -type f | sort > "$tmp/after"
    diff "$tmp/before" "$tmp/after" || { echo "files differ from before install (< before, > after)"; return 1; }
    [ ! -e "$stage/usr/include/distsgd" ] || { echo "include/distsgd left behind"; return 1; }
}
check "uninstall removes every installed file and nothing else" left_behind

# ---------------------------------------------------------------- (d) CMake
if command -v cmake >/dev/null 2>&1; then
    for mode in add_subdirectory FetchContent; do
        b=$tmp/cmake-$mode
        fc=OFF; [ "$mode" = FetchContent ] && fc=ON
        check "cmake ($mode) configures tests/consumer" \
            cmake -G "Unix Makefiles" -S "$root/tests/consumer" -B "$b" -DDISTSGD_DIR="$root" -DDISTSGD_FETCHCONTENT=$fc \
                -DCMAKE_C_COMPILER="$CC" -DCMAKE_C_FLAGS="-Wall -Wextra -Wpedantic -Werror -O0"
        check "cmake ($mode) builds the consumer" cmake --build "$b" -j 2
        check "cmake ($mode) consumer prints 'accuracy 1.00'" run_consumer "$b/consumer" "accuracy 1.00"
        if [ "$have_cl" = 1 ]; then
            run_cmake_cl() {
                [ -x "$1/consumer_cl" ] || { echo "distsgd::opencl was not defined"; return 1; }
                POCL_MAX_PTHREAD_COUNT=2 "$1/consumer_cl" | grep -E '^opencl devices [0-9]+$'
            }
            check "cmake ($mode) distsgd::opencl consumer lists devices" run_cmake_cl "$b"
        fi
    done
    only_consumer_targets() {
        local help extra
        help=$(cmake --build "$1" --target help) || return 1
        extra=$(grep -E '^\.\.\. ' <<<"$help" | grep -vE '^\.\.\. (all|clean|depend|edit_cache|rebuild_cache|consumer|consumer_cl|main(_cl)?\.[ois])( |$)' || true)
        [ -z "$extra" ] || { echo "unexpected targets:"; echo "$extra"; return 1; }
        grep -qE '^\.\.\. consumer( |$)' <<<"$help"
    }
    check "CMakeLists.txt adds no target of its own (builds nothing of the project)" \
        only_consumer_targets "$tmp/cmake-add_subdirectory"
else
    skip "CMake consumer (cmake not installed)"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
