#!/bin/sh
# tools/deps.sh MODE - check (and, as root, install) the Debian packages that a
# make target needs. MODE is one of:
#   test   compilers (gcc, g++, clang with its sanitizer runtimes), cmocka,
#          pkg-config, the OpenCL stack the OpenCL backend is tested on
#          (the ICD loader and headers, PoCL, CLBlast, clinfo), OpenMPI, which
#          the MPI transport is tested on; Fashion-MNIST, which the compile
#          matrix's example runs train on
#   demo   what building the examples needs, plus Debian's dataset-fashion-mnist
#          and gnuplot-nox (make sim draws its PNGs with it)
#   bench  the compilers plus OpenBLAS, which bench/ compares against
#   mpi    the compilers plus OpenMPI, for `make bench-mpi` and `make test-mpi`
#
# When every package is installed it only runs dpkg-query (fast, no network).
# When some are missing:
#   - as root with apt-get: runs `apt-get update` once, then installs exactly
#     the missing packages with --no-install-recommends;
#   - otherwise: prints the command to run and exits 1.
# On a system without dpkg-query (not Debian) it prints the package names as a
# hint and exits 0, leaving the build to fail if something is really missing.
# DSGD_SKIP_DEPS=1 skips the check entirely.
set -eu

usage() {
    echo "usage: tools/deps.sh test|demo|bench|mpi" >&2
    exit 2
}

[ $# -eq 1 ] || usage

# What each mode needs. libclang-rt-dev holds clang's sanitizer runtimes (only a
# recommendation of clang, so --no-install-recommends would leave it out).
compile_pkgs="build-essential pkg-config"
opencl_pkgs="ocl-icd-opencl-dev opencl-headers pocl-opencl-icd libclblast-dev"
case "$1" in
test)  pkgs="$compile_pkgs clang libclang-rt-dev libcmocka-dev $opencl_pkgs clinfo libopenmpi-dev openmpi-bin cmake python3 dataset-fashion-mnist" ;;
demo)  pkgs="$compile_pkgs $opencl_pkgs dataset-fashion-mnist gnuplot-nox" ;;
bench) pkgs="$compile_pkgs libopenblas-dev" ;;
mpi)   pkgs="$compile_pkgs libopenmpi-dev openmpi-bin mpich libmpich-dev" ;;
*)     usage ;;
esac

if [ "${DSGD_SKIP_DEPS:-0}" = 1 ]; then
    exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
    echo "deps.sh: dpkg-query not found (not a Debian system?); not checking." >&2
    echo "deps.sh: '$1' expects the equivalents of these Debian packages: $pkgs" >&2
    exit 0
fi

missing=""
for p in $pkgs; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
    *" installed") ;;
    *) missing="$missing $p" ;;
    esac
done
missing=${missing# }

if [ -z "$missing" ]; then
    exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps.sh ($1): installing missing Debian packages: $missing"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    # shellcheck disable=SC2086 # word splitting of the package list is wanted
    apt-get install -y --no-install-recommends $missing </dev/null
    echo "deps.sh ($1): installed: $missing"
    exit 0
fi

echo "missing Debian packages: $missing" >&2
echo "run: sudo apt-get install -y $missing" >&2
exit 1
