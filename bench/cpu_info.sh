# bench/cpu_info.sh - the CPU's name and the CPU backend's kernels, for the
# first line of the benches that compare distsgd with PyTorch
# (bench/peers.sh, bench/cnn.sh). Sourced, not run.
#
#   cpu_model       /proc/cpuinfo's first "model name" (else "unknown CPU")
#   cpu_native_isa  the kernels the CPU backend picks here by default
#                   (dsgd_cpu_isa without DSGD_CPU_ISA), from the CPU's
#                   flags: avx512 (avx512f), avx2 (avx2 and fma), else
#                   portable; the runs print what they used
#   cpu_banner NAME FORCED   the first line of bench NAME's output: the CPU,
#                   the default kernels and the forced ones
#   cpu_forced_isas the kernels the benches also run with DSGD_CPU_ISA:
#                   avx2 on an AVX-512 CPU, so that one machine shows both;
#                   FORCE_ISAS overrides ("" for none)

cpu_model() {
    local m
    m=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^[[:space:]]*//')
    echo "${m:-unknown CPU}"
}

cpu_native_isa() {
    local flags
    flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2-) "
    if [[ $flags == *" avx512f "* ]]; then echo avx512
    elif [[ $flags == *" avx2 "* && $flags == *" fma "* ]]; then echo avx2
    else echo portable
    fi
}

cpu_forced_isas() {
    if [ -n "${FORCE_ISAS+set}" ]; then echo "$FORCE_ISAS"
    elif [ "$(cpu_native_isa)" = avx512 ]; then echo avx2
    fi
}

cpu_banner() {
    echo "$1: CPU $(cpu_model); CPU backend kernels $(cpu_native_isa)${2:+, and forced to $2 (DSGD_CPU_ISA)}"
}
