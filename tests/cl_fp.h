/* cl_fp.h - what the OpenCL tests' bit-for-bit comparisons with the CPU
   backend need from a device's CL_DEVICE_SINGLE_FP_CONFIG (see BITS in
   distsgd/cl/backend.h), shared by test_cl_backend.c and
   test_cl_strategy.c (include it after harness.h and distsgd_cl.h).

   FP_ARITH: float adds and multiplies round as the host's do and keep
   denormals (scale, axpy, the activations' backward pass, bias_backward,
   col2im, maxpool_backward, sum_across, SGD and momentum, the sums of the
   gradient paths). FP_DIVSQRT: also divide and sqrt correctly rounded
   (Adam, AdamW). CL_FP_FMA is not needed: the kernels are built with
   FP_CONTRACT OFF and call no fma or mad. Copies and compares need nothing
   (need 0). */
#ifndef DSGD_TESTS_CL_FP_H
#define DSGD_TESTS_CL_FP_H

#define FP_ARITH ((unsigned long long)(CL_FP_ROUND_TO_NEAREST | CL_FP_INF_NAN | CL_FP_DENORM))
#define FP_DIVSQRT (FP_ARITH | (unsigned long long)CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT)

/* 1 when a device whose CL_DEVICE_SINGLE_FP_CONFIG is config promises every
   bit of need (compare bit for bit), 0 otherwise (compare within the test's
   stated tolerance). A pure function of its arguments (test_cl_backend.c
   tests it on made-up configs). */
static int fp_bit_exact(unsigned long long config, unsigned long long need) { return (config & need) == need; }

static const char *fp_mode_name(unsigned long long config, unsigned long long need) {
    return fp_bit_exact(config, need) ? "bit-exact" : "tolerance";
}

/* The AND of every device's config in cl, printed bit by bit. */
static unsigned long long fp_config_of(const dsgd_cl_context *cl) {
    unsigned long long config = ~0ull;
    int i;
    for (i = 0; i < dsgd_cl_context_num_devices(cl); ++i) config &= dsgd_cl_context_device_info(cl, i)->single_fp_config;
    print_message("    device single FP config 0x%llx: round to nearest %s, Inf/NaN %s, denormals %s, "
                  "correctly rounded divide/sqrt %s, FMA %s\n",
                  config, (config & CL_FP_ROUND_TO_NEAREST) ? "yes" : "no", (config & CL_FP_INF_NAN) ? "yes" : "no",
                  (config & CL_FP_DENORM) ? "yes" : "no",
                  (config & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) ? "yes" : "no", (config & CL_FP_FMA) ? "yes" : "no");
    return config;
}

#endif /* DSGD_TESTS_CL_FP_H */
