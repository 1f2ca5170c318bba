#!/usr/bin/env bash
# Compile matrix for distsgd's headers, run from any directory:
#   single_include/distsgd.h with gcc/clang -std=c99,c11 and g++/clang++
#   -std=c++11,c++17, warnings fatal:
#       one TU with the implementation (built, linked and run);
#       DISTSGD_STATIC + DISTSGD_IMPLEMENTATION in one TU;
#       two TUs, one with the implementation, linked together and run;
#   distsgd.h (make check-header compiles it with every compiler and
#   standard): DISTSGD_STATIC and two TUs with gcc and g++;
#   single include only: a TU with DISTSGD_WITH_OPENCL + DISTSGD_CL_IMPLEMENTATION
#   (skipped when pkg-config has no OpenCL/clblast), a check that without
#   DISTSGD_WITH_OPENCL it pulls in no OpenCL header; the same for MPI
#   (DISTSGD_WITH_MPI + DISTSGD_MPI_IMPLEMENTATION as C99 and C++11, the MPI
#   implementation and the core's in two TUs, linked; skipped when <mpi.h> is
#   not found with mpicc's or pkg-config's flags; without DISTSGD_WITH_MPI no
#   MPI header); every examples/NAME.c and experiments/NAME.c
#   built against it alone (the OpenCL ones with DISTSGD_WITH_OPENCL) must print
#   what it prints on the repository's headers, timings aside (both builds at
#   -O2, the implementation compiled once for each in a file of its own and
#   the program's own #define of it dropped); the Fashion-MNIST ones run one
#   epoch on build/data/fashion-mnist (unpacked by make when Debian's
#   dataset-fashion-mnist is installed). An example is skipped, with a "skip"
#   line, when pkg-config has no OpenCL/clblast or its data is missing.
#   With DSGD_CPU_NO_DISPATCH (portable CPU kernels only, the aarch64 path):
#   the single include as C and C++, and tests/test_backend_cpu_isa.c as C.
#   The opt-outs (distsgd.h's LEAVING PARTS OUT): the single include's
#   implementation with each DSGD_NO_* alone (DSGD_NO_TF_CONFIG with
#   DSGD_NO_PS) compiles (-c) as C99 (gcc), with all six as C++11 (g++);
#   DSGD_NO_TF_CONFIG alone is refused by its #error; with all six,
#   tests/consumer/main.c (as C99 and C++20) and a program that prints the
#   bits of parameters trained by two mirrored replicas print what they print
#   without, and the MPI add-on's implementation compiles and links (C99).
# The cases that compile, link and run a small program do it at -O0 (the
# warning gate for the optimiser's warnings is the -O2 build of make all and
# make test's library objects). Cases run MATRIX_JOBS at a time (default:
# the number of CPUs); their lines are printed in order at the end.
# Prints one line per configuration and "N passed, N failed"; exit 1 on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/distsgd-matrix.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

WARN="-Wall -Wextra -Wpedantic -Werror"
JOBS=${MATRIX_JOBS:-$(nproc 2>/dev/null || echo 2)}
LIBS="-lm -lpthread"
CCS=${MATRIX_CC:-"gcc clang"}
CXXS=${MATRIX_CXX:-"g++ clang++"}
# OpenCL and CLBlast flags from pkg-config; HAVE_CL is empty when it has none.
HAVE_CL="" CL_CFLAGS="" CL_LIBS=""
if pkg-config --exists OpenCL clblast 2>/dev/null; then
    HAVE_CL=yes
    CL_CFLAGS=$(pkg-config --cflags OpenCL clblast)
    CL_LIBS=$(pkg-config --libs OpenCL clblast)
fi
# MPI's flags (OpenMPI's wrapper, else pkg-config's mpi or mpich); HAVE_MPI is
# empty unless <mpi.h> compiles with them.
HAVE_MPI="" MPI_CFLAGS="" MPI_LIBS=""
if MPI_CFLAGS=$(mpicc --showme:compile 2>/dev/null) && MPI_LIBS=$(mpicc --showme:link 2>/dev/null); then
    :
elif MPI_CFLAGS=$(pkg-config --cflags mpi 2>/dev/null) && MPI_LIBS=$(pkg-config --libs mpi 2>/dev/null); then
    :
elif MPI_CFLAGS=$(pkg-config --cflags mpich 2>/dev/null) && MPI_LIBS=$(pkg-config --libs mpich 2>/dev/null); then
    :
else
    MPI_CFLAGS="" MPI_LIBS=""
fi
# shellcheck disable=SC2086
if printf '#include <mpi.h>\n' | gcc -E -x c - $MPI_CFLAGS >/dev/null 2>&1; then HAVE_MPI=yes; fi
passed=0
failed=0

# run_case NAME LOGFILE CMD...: starts CMD in the background (at most JOBS
# at once) with its output in a log of its own (LOGFILE is unused: kept so
# the calls read as before); finish_cases waits for them all and prints "ok
# NAME" or "FAIL NAME" and the log, in the order the cases were started. CMD
# runs under `if`, where set -e is off, so the helper functions below return
# on each failing step explicitly. Each case writes files of its own names.
ncases=0
CASE_NAMES=()
run_case() {
    local name=$1 i=$ncases
    shift 2
    CASE_NAMES[i]=$name
    ncases=$((ncases + 1))
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    (
        t0=$SECONDS
        if "$@" >"$TMP/case.$i.log" 2>&1; then r=ok; else r=FAIL; fi
        echo "$r $((SECONDS - t0))" >"$TMP/case.$i.rc"
    ) &
}
# a line now, for the skips (printed as they are found)
finish_cases() {
    local i
    wait || true
    local r s
    for ((i = 0; i < ncases; ++i)); do
        r=FAIL s=?
        if [ -f "$TMP/case.$i.rc" ]; then read -r r s <"$TMP/case.$i.rc"; fi
        if [ "$r" = ok ]; then
            printf 'ok    %s (%s s)\n' "${CASE_NAMES[i]}" "$s"
            passed=$((passed + 1))
        else
            printf 'FAIL  %s (%s s)\n' "${CASE_NAMES[i]}" "$s"
            sed 's/^/      /' "$TMP/case.$i.log" | head -n 30
            failed=$((failed + 1))
        fi
    done
}

# ---------------------------------------------------------------- test sources
# Written as C that is also valid C++ (no designated initializers, casts on
# void*), so the same files compile as .c and .cpp.

cat >"$TMP/use.inc" <<'SRC'
/* Trains a 2-8-2 MLP on XOR for a few Adam steps; returns 0 when every call
   succeeds and the parameter count is the closed form 2*8+8 + 8*2+2 = 42. */
static int use_api(void) {
    float x[8] = {0, 0, 0, 1, 1, 0, 1, 1}, y[4] = {0, 1, 1, 0};
    dsgd_layer_desc layers[2];
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_ctx *ctx = NULL;
    dsgd_model *m = NULL;
    dsgd_optimizer *opt = NULL;
    dsgd_metrics mt;
    int step, rc = 1;
    memset(layers, 0, sizeof layers);
    memset(&md, 0, sizeof md);
    memset(&od, 0, sizeof od);
    layers[0].units = 8; layers[0].activation = DSGD_ACT_TANH;
    layers[1].units = 2; layers[1].activation = DSGD_ACT_NONE;
    md.input_dim = 2; md.layers = layers; md.num_layers = 2; md.max_batch = 4; md.seed = 1;
    od.kind = DSGD_OPT_ADAM; od.lr = 0.05f;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_model_create(ctx, &md, &m) != DSGD_OK) goto done;
    if (dsgd_optimizer_create(m, &od, &opt) != DSGD_OK) goto done;
    if (dsgd_model_num_params(m) != 42) goto done;
    for (step = 0; step < 5; ++step) {
        if (dsgd_model_compute_gradients(m, x, y, 4, 1.0f / 4) != DSGD_OK) goto done;
        if (dsgd_optimizer_step(opt) != DSGD_OK) goto done;
    }
    if (dsgd_optimizer_steps(opt) != 5) goto done;
    if (dsgd_model_eval_batch(m, x, y, 4) != DSGD_OK) goto done;
    if (dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt) != DSGD_OK) goto done;
    if (mt.count != 4.0) goto done;
    rc = 0;
done:
    if (rc) fprintf(stderr, "use_api: %s\n", dsgd_ctx_last_error(ctx));
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    return rc;
}
SRC

# one.c: a single TU with the implementation. HEADER is substituted per variant.
write_sources() { # DIR HEADER
    local d=$1 h=$2
    mkdir -p "$d"
    cat >"$d/one.c" <<SRC
#define DISTSGD_IMPLEMENTATION
#include "$h"
#include <stdio.h>
#include <string.h>
#include "$TMP/use.inc"
int main(void) { return use_api(); }
SRC
    cat >"$d/static.c" <<SRC
#define DISTSGD_STATIC
#define DISTSGD_IMPLEMENTATION
#include "$h"
#include <stdio.h>
#include <string.h>
#include "$TMP/use.inc"
int main(void) { return use_api(); }
SRC
    cat >"$d/impl.c" <<SRC
#define DISTSGD_IMPLEMENTATION
#include "$h"
#include <stdio.h>
#include <string.h>
#include "$TMP/use.inc"
int run_in_impl_tu(void);
int run_in_impl_tu(void) { return use_api(); }
SRC
    cat >"$d/main.c" <<SRC
#include "$h"
#include <stdio.h>
#include <string.h>
#include "$TMP/use.inc"
int run_in_impl_tu(void);
int main(void) {
    if (strcmp(dsgd_result_string(DSGD_OK), dsgd_result_string(DSGD_OK)) != 0) return 1;
    return run_in_impl_tu() | use_api();
}
SRC
    local f
    for f in one static impl main; do cp "$d/$f.c" "$d/$f.cpp"; done
}

# build_run DIR OUT COMPILER STD SRC...: compile SRCs, link, run.
build_run() {
    local d=$1 out=$2 cc=$3 std=$4
    shift 4
    "$cc" -std="$std" $WARN -O0 "$@" -o "$d/$out" $LIBS && "$d/$out"
}

HEADERS_UNDER_TEST="$ROOT/distsgd.h $ROOT/single_include/distsgd.h"
for H in $HEADERS_UNDER_TEST; do
    [ -f "$H" ] || { printf 'FAIL  %s missing (run make amalgamate)\n' "$H"; failed=$((failed + 1)); continue; }
    tag=${H#"$ROOT"/}
    d="$TMP/$(echo "$tag" | tr '/.' '__')"
    write_sources "$d" "$H"
    # The repository's headers with the first C and C++ compiler only: make
    # check-header compiles them with every compiler and standard, and the
    # single include, generated from them (make check-amalgamation), runs
    # the whole matrix below.
    ccs=$CCS cxxs=$CXXS
    if [ "$H" != "$ROOT/single_include/distsgd.h" ]; then ccs=${CCS%% *} cxxs=${CXXS%% *}; fi
    for cc in $ccs; do
        if [ "$H" = "$ROOT/single_include/distsgd.h" ]; then
            for std in c99 c11; do
                run_case "$tag $cc -std=$std" "$d/log" build_run "$d" "one.$cc.$std" "$cc" "$std" "$d/one.c"
            done
        fi
        run_case "$tag $cc -std=c99 DISTSGD_STATIC" "$d/log" build_run "$d" "static.$cc" "$cc" c99 "$d/static.c"
        run_case "$tag $cc -std=c99 two TUs" "$d/log" build_run "$d" "two.$cc" "$cc" c99 "$d/impl.c" "$d/main.c"
    done
    for cxx in $cxxs; do
        if [ "$H" = "$ROOT/single_include/distsgd.h" ]; then
            for std in c++11 c++17; do
                run_case "$tag $cxx -std=$std" "$d/log" build_run "$d" "one.$cxx.$std" "$cxx" "$std" "$d/one.cpp"
            done
        fi
        run_case "$tag $cxx -std=c++11 DISTSGD_STATIC" "$d/log" build_run "$d" "static.$cxx" "$cxx" c++11 "$d/static.cpp"
        run_case "$tag $cxx -std=c++11 two TUs" "$d/log" build_run "$d" "two.$cxx" "$cxx" c++11 "$d/impl.cpp" "$d/main.cpp"
    done
done

SI="$ROOT/single_include/distsgd.h"
if [ -f "$SI" ]; then
    # Without DISTSGD_WITH_OPENCL the single include must not reach any OpenCL header.
    no_cl() {
        printf '#define DISTSGD_IMPLEMENTATION\n#include "%s"\n' "$SI" >"$TMP/nocl.c"
        gcc -std=c99 -E -H "$TMP/nocl.c" -o /dev/null 2>"$TMP/nocl.inc" || { cat "$TMP/nocl.inc"; return 1; }
        grep -q 'stddef.h' "$TMP/nocl.inc" || { echo "gcc -H listed no headers"; return 1; }
        if grep -E '(CL/|OpenCL/|clblast)' "$TMP/nocl.inc"; then return 1; fi
    }
    run_case "single_include/distsgd.h without DISTSGD_WITH_OPENCL includes no OpenCL header" "$TMP/log" no_cl

    # The CPU backend with its portable kernels only (DSGD_CPU_NO_DISPATCH),
    # the path of aarch64 and other targets: the library API as C and C++,
    # and the kernel tests as C.
    for cc in $CCS; do
        run_case "single_include/distsgd.h $cc -std=c99 DSGD_CPU_NO_DISPATCH" "$TMP/log" \
            build_run "$d" "nodispatch.$cc" "$cc" c99 -DDSGD_CPU_NO_DISPATCH "$d/one.c"
        run_case "tests/test_backend_cpu_isa.c $cc -std=c99 DSGD_CPU_NO_DISPATCH" "$TMP/log" \
            build_run "$TMP" "test_cpu_isa.$cc" "$cc" c99 -D_POSIX_C_SOURCE=200809L -DDSGD_CPU_NO_DISPATCH \
            -I"$ROOT" "$ROOT/tests/test_backend_cpu_isa.c" -lcmocka
    done
    for cxx in $CXXS; do
        run_case "single_include/distsgd.h $cxx -std=c++11 DSGD_CPU_NO_DISPATCH" "$TMP/log" \
            build_run "$d" "nodispatch.$cxx" "$cxx" c++11 -DDSGD_CPU_NO_DISPATCH "$d/one.cpp"
    done

    if [ -n "$HAVE_CL" ]; then
        cat >"$TMP/cl.c" <<SRC
#define DISTSGD_WITH_OPENCL
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "$SI"
#include <string.h>
int main(void) {
    /* no device needed: names only */
    return strcmp(dsgd_cl_device_type_name(DSGD_CL_DEVICE_GPU), "") == 0 ||
           dsgd_cl_error_string(0) == NULL || dsgd_result_string(DSGD_OK) == NULL;
}
SRC
        cp "$TMP/cl.c" "$TMP/cl.cpp"
        run_case "single_include/distsgd.h gcc -std=c99 DISTSGD_WITH_OPENCL" "$TMP/log" \
            gcc -std=c99 $WARN -O0 $CL_CFLAGS "$TMP/cl.c" -o "$TMP/cl_c" $CL_LIBS $LIBS
        run_case "single_include/distsgd.h g++ -std=c++11 DISTSGD_WITH_OPENCL" "$TMP/log" \
            g++ -std=c++11 $WARN -O0 $CL_CFLAGS "$TMP/cl.cpp" -o "$TMP/cl_cxx" $CL_LIBS $LIBS
        # The add-on's implementation in a file of its own, the core's in
        # another (as distsgd_cl.h's USING IT allows): both compile without a
        # warning (the shared private helpers are there, unused ones quiet)
        # and link.
        for hdr in "$ROOT/distsgd_cl.h" "$SI"; do
            h=$(basename "$(dirname "$hdr")")
            printf '#define DISTSGD_WITH_OPENCL\n#define DISTSGD_CL_IMPLEMENTATION\n#include "%s"\n' "$hdr" \
                >"$TMP/cl_only.$h.c"
            printf '#define DISTSGD_WITH_OPENCL\n#define DISTSGD_IMPLEMENTATION\n#include "%s"\n%s\n' "$hdr" \
                'int main(void) { return dsgd_cl_error_string(0) == NULL || dsgd_result_string(DSGD_OK) == NULL; }' \
                >"$TMP/core_main.$h.c"
            for cc in gcc clang; do
                run_case "${hdr#"$ROOT"/} $cc -std=c99: OpenCL implementation and core implementation in two TUs" \
                    "$TMP/log" $cc -std=c99 $WARN -O0 $CL_CFLAGS "$TMP/cl_only.$h.c" "$TMP/core_main.$h.c" \
                    -o "$TMP/cl_two.$h.$cc" $CL_LIBS $LIBS
            done
        done
    else
        echo "skip  single_include/distsgd.h DISTSGD_WITH_OPENCL (pkg-config finds no OpenCL clblast)"
    fi

    # The MPI add-on: without DISTSGD_WITH_MPI the single include reaches no
    # MPI header; with it, it compiles as C and C++ and links (not run: that
    # needs mpirun, which make test-mpi does), and so does the add-on's
    # implementation in a TU of its own beside the core's.
    no_mpi() {
        printf '#define DISTSGD_IMPLEMENTATION\n#include "%s"\n' "$SI" >"$TMP/nompi.c"
        gcc -std=c99 -E -H "$TMP/nompi.c" -o /dev/null 2>"$TMP/nompi.inc" || { cat "$TMP/nompi.inc"; return 1; }
        grep -q 'stddef.h' "$TMP/nompi.inc" || { echo "gcc -H listed no headers"; return 1; }
        if grep -E '(/mpi\.h|mpich|openmpi)' "$TMP/nompi.inc"; then return 1; fi
    }
    run_case "single_include/distsgd.h without DISTSGD_WITH_MPI includes no MPI header" "$TMP/log" no_mpi
    if [ -n "$HAVE_MPI" ]; then
        cat >"$TMP/mpi.c" <<SRC
#define DISTSGD_WITH_MPI
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_MPI_IMPLEMENTATION
#include "$SI"
#include <string.h>
int main(int argc, char **argv) {
    dsgd_mpi_desc d;
    dsgd_transport_i t;
    memset(&d, 0, sizeof d);
    (void)argv;
    if (argc > 99) { /* never: links the API without running MPI */
        if (dsgd_mpi_transport_create(NULL, &d, &t) != DSGD_OK) dsgd_mpi_abort(1);
        return dsgd_mpi_init(NULL, &argc, &argv, NULL) == DSGD_OK;
    }
    return dsgd_result_string(DSGD_OK) == NULL;
}
SRC
        cp "$TMP/mpi.c" "$TMP/mpi.cpp"
        # shellcheck disable=SC2086
        run_case "single_include/distsgd.h gcc -std=c99 DISTSGD_WITH_MPI" "$TMP/log" \
            gcc -std=c99 $WARN -O0 $MPI_CFLAGS "$TMP/mpi.c" -o "$TMP/mpi_c" $MPI_LIBS $LIBS
        # shellcheck disable=SC2086
        run_case "single_include/distsgd.h g++ -std=c++11 DISTSGD_WITH_MPI" "$TMP/log" \
            g++ -std=c++11 $WARN -O0 $MPI_CFLAGS "$TMP/mpi.cpp" -o "$TMP/mpi_cxx" $MPI_LIBS $LIBS
        for hdr in "$ROOT/distsgd_mpi.h" "$SI"; do
            h=$(basename "$(dirname "$hdr")")
            printf '#define DISTSGD_WITH_MPI\n#define DISTSGD_MPI_IMPLEMENTATION\n#include "%s"\n' "$hdr" \
                >"$TMP/mpi_only.$h.c"
            printf '#define DISTSGD_WITH_MPI\n#define DISTSGD_IMPLEMENTATION\n#include "%s"\n%s\n' "$hdr" \
                'int main(int argc, char **argv) { (void)argv; if (argc > 99) dsgd_mpi_abort(1); return dsgd_result_string(DSGD_OK) == NULL; }' \
                >"$TMP/mpi_core_main.$h.c"
            for cc in gcc clang; do
                # shellcheck disable=SC2086
                run_case "${hdr#"$ROOT"/} $cc -std=c99: MPI implementation and core implementation in two TUs" \
                    "$TMP/log" $cc -std=c99 $WARN -O0 $MPI_CFLAGS "$TMP/mpi_only.$h.c" "$TMP/mpi_core_main.$h.c" \
                    -o "$TMP/mpi_two.$h.$cc" $MPI_LIBS $LIBS
            done
        done
    else
        echo "skip  single_include/distsgd.h DISTSGD_WITH_MPI (no <mpi.h> with mpicc's or pkg-config's flags)"
    fi

    # Every example built against the single include alone must print what its
    # reference build/examples/NAME prints. Run-dependent numbers are normalised
    # (elapsed seconds, ETA, samples/s) and nothing else: training is
    # deterministic, so losses and accuracies must match digit for digit.
    normalise() {
        sed -E -e 's/in [0-9.]+ s/in T s/g' -e 's/ETA [0-9.]+ s/ETA T s/g' -e 's|[0-9.]+ samples/s|N samples/s|g' \
            -e 's/^(  done: .{24}) +[0-9.]+ s /\1 T s /' -e 's/^(\| [^|]*\| +)[0-9.]+ \|/\1T |/'
    }
    # Both builds of a program link the implementation compiled once, at -O2,
    # in an object of its own: the repository's headers' (ref) and the single
    # include's (single), the core and the OpenCL add-on apart.
    impl_obj() { # OUT HEADER DEFINES...
        local out=$1 hdr=$2
        shift 2
        # shellcheck disable=SC2086
        gcc -std=c99 $WARN -O2 -g "$@" $CL_CFLAGS -x c -c "$hdr" -o "$out"
    }
    mkdir -p "$TMP/obj"
    run_case "repository headers: the implementation as an object of its own (-O2)" "$TMP/log" \
        impl_obj "$TMP/obj/ref.o" "$ROOT/distsgd.h" -DDISTSGD_IMPLEMENTATION
    run_case "single_include/distsgd.h: the implementation as an object of its own (-O2)" "$TMP/log" \
        impl_obj "$TMP/obj/single.o" "$SI" -DDISTSGD_IMPLEMENTATION
    if [ -n "$HAVE_CL" ]; then
        run_case "distsgd_cl.h: the OpenCL implementation as an object of its own (-O2)" "$TMP/log" \
            impl_obj "$TMP/obj/ref_cl.o" "$ROOT/distsgd_cl.h" -DDISTSGD_CL_IMPLEMENTATION
        run_case "single_include/distsgd.h: the OpenCL implementation as an object of its own (-O2)" "$TMP/log" \
            impl_obj "$TMP/obj/single_cl.o" "$SI" -DDISTSGD_WITH_OPENCL -DDISTSGD_CL_IMPLEMENTATION
    fi
    wait || true
    # same_output DIR NAME [ARGS...]: DIR/NAME.c without its #defines of the
    # implementation macros, its #include of ../distsgd.h or ../distsgd_cl.h
    # rewritten to the repository's header (ref) and to the single include
    # (single, with DISTSGD_WITH_OPENCL for the latter), each linked with its
    # objects; both run with ARGS, their stdout diffed.
    same_output() {
        local dir=$1 ex=$2 cl=() objs_ref=("$TMP/obj/ref.o") objs_single=("$TMP/obj/single.o")
        shift 2
        local src="$dir/$ex.c" out="$TMP/$ex" strip='/^#define DISTSGD_(CL_)?IMPLEMENTATION/d'
        sed -E -e "$strip" -e 's|^#include "\.\./(distsgd(_cl)?\.h)"|#include "'"$ROOT"'/\1"|' "$src" >"$out.ref.c" || return 1
        sed -E -e "$strip" -e 's|^#include "\.\./distsgd(_cl)?\.h"|#include "'"$SI"'"|' "$src" >"$out.single.c" || return 1
        grep -q "^#include \"$SI\"" "$out.single.c" || { echo "include line not rewritten"; return 1; }
        # shellcheck disable=SC2206
        if is_cl_example "$src"; then
            cl=(-DDISTSGD_WITH_OPENCL $CL_CFLAGS $CL_LIBS)
            objs_ref+=("$TMP/obj/ref_cl.o") objs_single+=("$TMP/obj/single_cl.o")
        fi
        local inc=(-I"$ROOT/$dir" -I"$ROOT/examples")
        gcc -std=c99 $WARN -O2 -g "${inc[@]}" "$out.ref.c" "${objs_ref[@]}" -o "$out.ref" ${cl[@]+"${cl[@]}"} $LIBS || return 1
        gcc -std=c99 $WARN -O2 -g "${inc[@]}" "$out.single.c" "${objs_single[@]}" -o "$out.single" ${cl[@]+"${cl[@]}"} $LIBS || return 1
        "$out.ref" "$@" | normalise >"$out.ref.txt" || return 1
        "$out.single" "$@" | normalise >"$out.single.txt" || return 1
        [ -s "$out.ref.txt" ] || { echo "$src printed nothing"; return 1; }
        diff "$out.ref.txt" "$out.single.txt"
    }
    is_cl_example() { grep -q '^#include "\.\./distsgd_cl\.h"' "$1"; }
    # Fashion-MNIST where `make demo` unpacks it; make unpacks it here too when
    # Debian's dataset-fashion-mnist is installed.
    FMNIST=build/data/fashion-mnist
    fmnist_ready() {
        make --no-print-directory -s -C "$ROOT" "$FMNIST/train-images-idx3-ubyte" "$FMNIST/train-labels-idx1-ubyte" \
            "$FMNIST/t10k-images-idx3-ubyte" "$FMNIST/t10k-labels-idx1-ubyte" >/dev/null 2>&1
    }
    mkdir -p build/pocl-cache
    export POCL_CACHE_DIR="$ROOT/build/pocl-cache" POCL_MAX_PTHREAD_COUNT=2
    fmnist_ok=
    if fmnist_ready; then fmnist_ok=yes; fi
    for src in examples/*.c experiments/*.c; do
        ex=$(basename "$src" .c) dir=$(dirname "$src")
        # Flags for a run of a few seconds on two cores (the others run as they
        # are), and the data it needs.
        args=() data=
        case $ex in
        train_fashion_mnist | mirrored_mlp) data=$FMNIST args=(--data "$FMNIST" --epochs 1) ;;
        sync_vs_async) data=$FMNIST args=(--data "$FMNIST" --epochs 1 --rows mirrored,sync) ;; # the rows with fixed bits
        cnn_fashion_mnist) data=$FMNIST args=(--data "$FMNIST" --epochs 1 --subset 3000 --no-mlp) ;;
        custom_model) args=(--strategy mirrored) ;; # asynchronous servers have no fixed bits
        elastic) args=(--steps 24 --kill-step 8 --grow-step 16) ;; # simnet: the same bits and virtual times every run
        sync_vs_async_sim) args=(--out "$TMP/sim.$ex") ;; # simnet: the same bits every run
        backup_workers) args=(--out "$TMP/sim.$ex" --seeds 1) ;;
        linear_scaling) data=$FMNIST args=(--data "$FMNIST" --out "$TMP/sim.$ex" --epochs 1 --warmup-epochs 1) ;;
        crossover) args=(--out "$TMP/sim.$ex" --smoke) ;;
        breakeven) args=(--out "$TMP/sim.$ex" --smoke) ;; # charged codec costs: the same bits every run
        comm_policies) data=$FMNIST args=(--data "$FMNIST" --out "$TMP/sim.$ex" --smoke --jobs 1) ;;
        gradient_compression) data=$FMNIST args=(--data "$FMNIST" --epochs 1 --only topk --no-times) ;;
        esac
        if grep -q '^#include "\.\./distsgd_mpi\.h"' "$src"; then
            echo "skip  $src on single_include/distsgd.h (an MPI program: make test-mpi runs it under mpirun)"
            continue
        fi
        name="$src on single_include/distsgd.h"
        if is_cl_example "$src"; then
            name="$name with DISTSGD_WITH_OPENCL"
            [ -n "$HAVE_CL" ] || { echo "skip  $name (pkg-config finds no OpenCL clblast)"; continue; }
        fi
        [ ${#args[@]} -eq 0 ] || name="$name ${args[*]}"
        if [ -n "$data" ] && [ -z "$fmnist_ok" ]; then
            echo "skip  $name (no Fashion-MNIST in $data: make demo, or install dataset-fashion-mnist)"
            continue
        fi
        run_case "$name: same output" "$TMP/log" same_output "$dir" "$ex" ${args[@]+"${args[@]}"}
    done

    # The opt-outs (LEAVING PARTS OUT in distsgd.h), started after the
    # examples so that they run beside their tail. The implementation
    # compiles (-c) without a warning; DSGD_NO_TF_CONFIG needs DSGD_NO_PS
    # (alone it is refused).
    NO_ALL="-DDSGD_NO_SIMNET -DDSGD_NO_PS -DDSGD_NO_COMPRESS -DDSGD_NO_ELASTIC -DDSGD_NO_LOCAL -DDSGD_NO_TF_CONFIG"
    printf '#define DISTSGD_IMPLEMENTATION\n#include "%s"\n' "$SI" >"$TMP/optout.c"
    cp "$TMP/optout.c" "$TMP/optout.cpp"
    # consumer_same: tests/consumer/main.c (the README's program) with all six
    # as C99 and as C++20 (designated initializers) prints what it prints as
    # C99 without them: the version and "accuracy 1.00".
    consumer_same() {
        local o="$TMP/consumer" f
        cp "$ROOT/tests/consumer/main.c" "$o.c" && cp "$o.c" "$o.cpp" || return 1
        # shellcheck disable=SC2086
        gcc -std=c99 $WARN -O0 -I"$ROOT/single_include" "$o.c" -o "$o.ref" $LIBS || return 1
        # shellcheck disable=SC2086
        gcc -std=c99 $WARN -O0 -I"$ROOT/single_include" $NO_ALL "$o.c" -o "$o.c99" $LIBS || return 1
        # shellcheck disable=SC2086
        g++ -std=c++20 $WARN -O0 -I"$ROOT/single_include" $NO_ALL "$o.cpp" -o "$o.cxx20" $LIBS || return 1
        "$o.ref" >"$o.ref.txt" || return 1
        grep -qx 'accuracy 1.00' "$o.ref.txt" || { cat "$o.ref.txt"; return 1; }
        for f in c99 cxx20; do
            "$o.$f" >"$o.$f.txt" || return 1
            diff "$o.ref.txt" "$o.$f.txt" || return 1
        done
    }
    # same_bits: two replicas of a mirrored strategy train on XOR; the
    # program prints a CRC-32C of the parameters and each one's bits, the
    # same with all six opt-outs as without (both gcc -std=c99 -O0).
    cat >"$TMP/bits.c" <<SRC
#define DISTSGD_IMPLEMENTATION
#include "$SI"
#include <stdio.h>
#include <string.h>
int main(void) {
    float x[8] = {0, 0, 0, 1, 1, 0, 1, 1}, y[4] = {0, 1, 1, 0}, p[2][42];
    dsgd_layer_desc layers[2];
    dsgd_strategy_desc sd;
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    dsgd_step_info info;
    uint32_t bits;
    int step, r, i, ok;
    memset(layers, 0, sizeof layers);
    memset(&sd, 0, sizeof sd);
    layers[0].units = 8; layers[0].activation = DSGD_ACT_TANH;
    layers[1].units = 2; layers[1].activation = DSGD_ACT_NONE;
    sd.kind = DSGD_STRATEGY_MIRRORED; sd.num_replicas = 2;
    sd.model.input_dim = 2; sd.model.layers = layers; sd.model.num_layers = 2;
    sd.model.max_batch = 4; sd.model.seed = 7;
    sd.optimizer.kind = DSGD_OPT_ADAM; sd.optimizer.lr = 0.05f;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    ok = dsgd_strategy_create(ctx, &sd, &s) == DSGD_OK;
    for (step = 0; ok && step < 50; ++step) ok = dsgd_strategy_train_step(s, x, y, 4, &info) == DSGD_OK;
    for (r = 0; ok && r < 2; ++r) /* mirrored: both replicas hold the same bits */
        ok = dsgd_model_num_params(dsgd_strategy_model(s, r)) == 42 &&
             dsgd_model_get_params(dsgd_strategy_model(s, r), p[r], 42) == DSGD_OK;
    ok = ok && memcmp(p[0], p[1], sizeof p[0]) == 0;
    if (ok) {
        printf("crc32c %08lx\n", (unsigned long)dsgd_crc32c(0, p[0], sizeof p[0]));
        for (i = 0; i < 42; ++i) {
            memcpy(&bits, &p[0][i], sizeof bits);
            printf("%2d %08lx\n", i, (unsigned long)bits);
        }
    } else fprintf(stderr, "same_bits: %s\n", dsgd_ctx_last_error(ctx));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
SRC
    same_bits() {
        local o="$TMP/bits"
        # shellcheck disable=SC2086
        gcc -std=c99 $WARN -O0 "$o.c" -o "$o.ref" $LIBS || return 1
        # shellcheck disable=SC2086
        gcc -std=c99 $WARN -O0 $NO_ALL "$o.c" -o "$o.no" $LIBS || return 1
        "$o.ref" >"$o.ref.txt" && "$o.no" >"$o.no.txt" || return 1
        grep -q '^crc32c ' "$o.ref.txt" || { cat "$o.ref.txt"; return 1; }
        diff "$o.ref.txt" "$o.no.txt"
    }
    # refused: DSGD_NO_TF_CONFIG without DSGD_NO_PS stops at the #error that
    # names DSGD_NO_PS, as C and as C++ (-Wfatal-errors: at the first error).
    refused() {
        local c
        for c in "gcc -std=c99 $TMP/optout.c" "g++ -std=c++11 $TMP/optout.cpp"; do
            # shellcheck disable=SC2086
            if $c $WARN -O0 -Wfatal-errors -DDSGD_NO_TF_CONFIG -c -o "$TMP/refused.o" >"$TMP/refused.txt" 2>&1; then
                echo "${c%% *}: compiled; DSGD_NO_TF_CONFIG without DSGD_NO_PS must be refused"
                return 1
            fi
            grep -q 'DSGD_NO_PS' "$TMP/refused.txt" || { cat "$TMP/refused.txt"; return 1; }
        done
    }
    run_case "tests/consumer/main.c on single_include/distsgd.h with all six opt-outs, gcc -std=c99 and g++ -std=c++20: same output as without" \
        "$TMP/log" consumer_same
    run_case "mirrored XOR parameters on single_include/distsgd.h with all six opt-outs, gcc -std=c99: same bits as without" \
        "$TMP/log" same_bits
    if [ -n "$HAVE_MPI" ]; then
        # shellcheck disable=SC2086
        run_case "single_include/distsgd.h gcc -std=c99 DISTSGD_WITH_MPI with all six opt-outs" "$TMP/log" \
            gcc -std=c99 $WARN -O0 $MPI_CFLAGS $NO_ALL "$TMP/mpi.c" -o "$TMP/mpi_optout" $MPI_LIBS $LIBS
    fi
    # Each alone as C99; all six as C++11 (the C99 build of all six is
    # consumer_same's and same_bits').
    k=0
    for no in "-DDSGD_NO_SIMNET" "-DDSGD_NO_PS" "-DDSGD_NO_COMPRESS" "-DDSGD_NO_ELASTIC" "-DDSGD_NO_LOCAL" \
        "-DDSGD_NO_PS -DDSGD_NO_TF_CONFIG"; do
        # shellcheck disable=SC2086
        run_case "single_include/distsgd.h gcc -std=c99 -c ${no//-D/}" "$TMP/log" \
            gcc -std=c99 $WARN -O0 $no -c "$TMP/optout.c" -o "$TMP/optout.$k.o"
        k=$((k + 1))
    done
    # shellcheck disable=SC2086
    run_case "single_include/distsgd.h g++ -std=c++11 -c with all six opt-outs" "$TMP/log" \
        g++ -std=c++11 $WARN -O0 $NO_ALL -c "$TMP/optout.cpp" -o "$TMP/optout.cxx.o"
    run_case "single_include/distsgd.h DSGD_NO_TF_CONFIG without DSGD_NO_PS: refused by its #error" "$TMP/log" refused
fi

finish_cases
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
