/* test_cl_backend.c - the OpenCL backend (distsgd_cl.h) against the CPU reference.

   Every test calls skip() when no OpenCL device is found (reported as
   skipped, not passed). Otherwise each operation runs on both backends from
   the same seeded random inputs and the results are compared, at sizes that
   are and are not multiples of the work-group sizes (1, 255, 256, 257, ...)
   and at non-zero offsets; bias_backward also at row counts of one and of
   many 128-row blocks. Tolerances, per operation:
     exact (bit for bit): write/read/copy/fill, scale, axpy, bias_backward,
         act_backward, bias_act_forward with NONE and RELU, every optimizer
         update (the kernels repeat the CPU's float arithmetic in order, with
         FP_CONTRACT off and correctly rounded divide and sqrt);
         im2col, col2im, maxpool_forward and maxpool_backward (copies,
         compares and adds in the CPU's order; signed zeros and NaNs
         included), over the shape grid of tests/test_backend.c and eight
         larger layers, with ties and NaNs in max-pool's input, in both
         launch shapes (GPU and CPU) and with 64-bit indices;
         where the device promises it (CL_DEVICE_SINGLE_FP_CONFIG, see the
         FP config section below): adds and multiplies need round to
         nearest, Inf/NaN and denormals; Adam and AdamW also correctly
         rounded divide and sqrt. A device that does not promise them gets
         the arithmetic comparisons within TOL_REL relative plus TOL_ABS
         instead (copies and compares stay bit for bit), and the setup
         prints which mode each kind of check uses;
     bias_act_forward TANH and SIGMOID: 1e-6 absolute (OpenCL's tanh and exp
         are accurate to a few ulp; values lie in (-1, 1));
     gemm: 1e-5 * (|alpha| sum_k |a||b| + |beta c|) per element (float
         rounding of a length-k dot product in a different order);
     losses: dpred 1e-6 * grad_scale absolute, stats 1e-6 relative when the
         device has fp64 (both backends then accumulate in double), 1e-4 and
         1e-4 relative otherwise;
     norm_check: nonfinite exact, sumsq 1e-12 relative with fp64, 1e-5 with
         float partial sums.
   Also: 20 training steps of two small MLPs on OpenCL and on the CPU (same
   weights within 1e-4 relative), errors that name the failing call, device
   selection by spec and environment, mapped buffers, several backends on one
   context (also from three threads at once, as replicas), and the GEMM tuning cache (missing, corrupt and other-device
   files fall back to CLBlast's defaults with a logged warning; a valid one is
   applied). The valid-cache test runs last: CLBlast's parameter overrides are
   process-wide, and it compiles CLBlast's GEMM once more for them.

   That is make test-full; make test (the quick tier) runs every fifth
   shape of the image grid (and the larger layers) in the two forced launch
   shapes, the whole grid in the device's own.

   Cold start: our kernels and one set of CLBlast GEMM kernels (plus one for
   the tuned parameters) are compiled; PoCL caches them in POCL_CACHE_DIR
   (the Makefile sets build/pocl-cache), so later runs take seconds.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"
#include "../distsgd_cl.h"
#include "cl_fp.h"

#include <pthread.h>

#include <sys/stat.h>

/* ---------------------------------------------------------------- fixture */

/* Seconds a test (or the setup) may take before the watchdog fails the run:
   a cold start compiles CLBlast's GEMM under ASan in well under that. */
#define CL_WATCHDOG_S 300

static struct {
    int have_cl;
    dsgd_ctx *ctx;
    dsgd_cl_context *cl;
    dsgd_backend_i clb, cpu;
    int fp64;
    unsigned long long fp_config; /* CL_DEVICE_SINGLE_FP_CONFIG, the AND over
                                     the context's devices */
} G;

/* ---------------------------------------------------------------- FP config */
/* FP_ARITH, FP_DIVSQRT, fp_bit_exact: tests/cl_fp.h. */

/* The tolerance where the device does not promise those bits. OpenCL 1.2
   allows 2.5 ulp for divide and 3 ulp for sqrt without correct rounding; one
   float ulp is 2^-23 (1.2e-7) relative, so 1e-6 relative (about 8 ulp)
   covers a few such operations compounded over the three optimizer steps
   the tests take. The absolute floor, 1e-7 (an ulp of values near 1, the
   scale of the test's inputs), covers results that cancel towards zero,
   where a relative bound means nothing, and denormals flushed to zero. */
#define TOL_REL 1e-6
#define TOL_ABS 1e-7


static int group_setup(void **state) {
    int n = 0;
    (void)state;
    tu_watchdog_for("test_cl_backend: setup", CL_WATCHDOG_S);
    if (dsgd_ctx_create(NULL, &G.ctx) != DSGD_OK) return -1;
    if (dsgd_cl_list_devices(G.ctx, NULL, 0, &n) != DSGD_OK) {
        fprintf(stderr, "test_cl: listing OpenCL devices failed: %s\n", dsgd_ctx_last_error(G.ctx));
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "test_cl: no OpenCL device found: every test is skipped\n");
        return 0;
    }
    {
        dsgd_cl_context_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.tuning = DSGD_CL_TUNING_OFF; /* hermetic: no user tuning file */
        if (dsgd_cl_context_create(G.ctx, &cd, &G.cl) != DSGD_OK ||
            dsgd_cl_backend_create(G.ctx, G.cl, NULL, &G.clb) != DSGD_OK ||
            dsgd_cpu_backend_create(G.ctx, &G.cpu) != DSGD_OK) {
            fprintf(stderr, "test_cl: %d OpenCL device(s) but the backend failed: %s\n", n,
                    dsgd_ctx_last_error(G.ctx));
            return -1;
        }
    }
    G.fp64 = dsgd_cl_context_fp64(G.cl);
    G.have_cl = 1;
    fprintf(stderr, "test_cl: OpenCL device: %s (%s), fp64 %s\n",
            dsgd_cl_context_device_info(G.cl, 0)->device_name,
            dsgd_cl_context_device_info(G.cl, 0)->platform_name, G.fp64 ? "yes" : "no");
    G.fp_config = fp_config_of(G.cl);
    print_message("    checks against the CPU: copies and compares bit-exact; adds and multiplies %s; "
                  "Adam/AdamW %s (tolerance: %g relative + %g absolute)\n",
                  fp_mode_name(G.fp_config, FP_ARITH), fp_mode_name(G.fp_config, FP_DIVSQRT), TOL_REL, TOL_ABS);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    if (G.clb.destroy) G.clb.destroy(G.clb.impl);
    if (G.cpu.destroy) G.cpu.destroy(G.cpu.impl);
    dsgd_cl_context_destroy(G.cl);
    dsgd_ctx_destroy(G.ctx);
    memset(&G, 0, sizeof G);
    tu_watchdog(0);
    return 0;
}

/* Every test that needs a device calls NEED_CL(): a hang (a deadlocked
   queue, a kernel that never ends) fails the run instead of blocking CI.
   CL_WATCHDOG_S (see the fixture) bounds each test. */
#define NEED_CL()                                              \
    do {                                                       \
        if (!G.have_cl) skip();                                \
        dsgd_ctx_clear_error(G.ctx);                           \
        tu_watchdog_for("test_cl_backend", CL_WATCHDOG_S);     \
    } while (0)

static dsgd_ref R(dsgd_buffer *b, size_t off) {
    dsgd_ref r;
    r.buf = b;
    r.off = off;
    return r;
}

static dsgd_ref NOREF(void) { return R(NULL, 0); }

/* The same buffer on both backends. */
typedef struct pbuf {
    dsgd_buffer *cpu, *cl;
    size_t n;
} pbuf;

static pbuf pb_make(size_t n, const float *init) {
    pbuf p;
    p.n = n;
    TU_OK(G.ctx, G.cpu.buffer_create(G.cpu.impl, n, &p.cpu));
    TU_OK(G.ctx, G.clb.buffer_create(G.clb.impl, n, &p.cl));
    if (init && n) {
        TU_OK(G.ctx, G.cpu.write(G.cpu.impl, R(p.cpu, 0), init, n));
        TU_OK(G.ctx, G.clb.write(G.clb.impl, R(p.cl, 0), init, n));
    }
    return p;
}

static pbuf pb_rand(size_t n, tu_rng *rng, float lo, float hi) {
    float *h = tu_floats(n);
    pbuf p;
    tu_fill(rng, h, n, lo, hi);
    p = pb_make(n, h);
    free(h);
    return p;
}

static void pb_free(pbuf *p) {
    G.cpu.buffer_destroy(G.cpu.impl, p->cpu);
    G.clb.buffer_destroy(G.clb.impl, p->cl);
}

/* Reads both copies; the caller frees *cpu_out and *cl_out. */
static void pb_read(const pbuf *p, float **cpu_out, float **cl_out) {
    *cpu_out = tu_floats(p->n);
    *cl_out = tu_floats(p->n);
    TU_OK(G.ctx, G.cpu.read(G.cpu.impl, R(p->cpu, 0), *cpu_out, p->n));
    TU_OK(G.ctx, G.clb.read(G.clb.impl, R(p->cl, 0), *cl_out, p->n));
}

/* Fails unless |cl - cpu| <= abs_tol + rel_tol * |cpu| everywhere (NaN
   matches NaN; tolerance 0 means bit-for-bit equal values). */
static void expect_close(const float *cl, const float *cpu, size_t n, double abs_tol, double rel_tol,
                         const char *what) {
    size_t i;
    for (i = 0; i < n; ++i) {
        double a = cl[i], b = cpu[i];
        if (isnan(a) && isnan(b)) continue;
        if (abs_tol == 0.0 && rel_tol == 0.0) {
            if (memcmp(&cl[i], &cpu[i], sizeof(float)) != 0 && !(a == 0.0 && b == 0.0))
                fail_msg("%s[%zu]: opencl %.9g, cpu %.9g (want bit-for-bit equal)", what, i, a, b);
        } else if (!(fabs(a - b) <= abs_tol + rel_tol * fabs(b))) {
            fail_msg("%s[%zu]: opencl %.9g, cpu %.9g, |diff| %.3g > %.3g", what, i, a, b, fabs(a - b),
                     abs_tol + rel_tol * fabs(b));
        }
    }
}

static void pb_expect(const pbuf *p, double abs_tol, double rel_tol, const char *what) {
    float *a, *b;
    pb_read(p, &b, &a);
    expect_close(a, b, p->n, abs_tol, rel_tol, what);
    free(a);
    free(b);
}

/* Bit for bit where the device promises every bit of need, else within
   TOL_ABS + TOL_REL * |cpu| (see the FP config section). */
static void pb_expect_fp(const pbuf *p, unsigned long long need, const char *what) {
    if (fp_bit_exact(G.fp_config, need))
        pb_expect(p, 0, 0, what);
    else
        pb_expect(p, TOL_ABS, TOL_REL, what);
}

/* A logger that keeps count and the last message per level. */
typedef struct logcap {
    int count[4];
    char last[4][1024];
} logcap;

static void cap_log(void *ud, dsgd_log_level level, const char *msg) {
    logcap *c = (logcap *)ud;
    if ((int)level < 0 || (int)level > 3) return;
    c->count[level]++;
    snprintf(c->last[level], sizeof c->last[level], "%s", msg);
}

static dsgd_ctx *cap_ctx(logcap *cap) {
    dsgd_ctx_desc d;
    dsgd_ctx *ctx = NULL;
    memset(cap, 0, sizeof *cap);
    memset(&d, 0, sizeof d);
    d.logger.func = cap_log;
    d.logger.user_data = cap;
    TU_OK(NULL, dsgd_ctx_create(&d, &ctx));
    return ctx;
}

#define EXPECT_SUBSTR(hay, needle)                                                  \
    do {                                                                            \
        if (!strstr((hay), (needle))) fail_msg("'%s' not found in: %s", (needle), (hay)); \
    } while (0)

/* ---------------------------------------------------------------- devices */

static void test_list_devices(void **state) {
    dsgd_cl_device_info info[8];
    int n = -1, i;
    (void)state;
    NEED_CL();
    TU_OK(G.ctx, dsgd_cl_list_devices(G.ctx, info, 8, &n));
    assert_true(n >= 1);
    for (i = 0; i < n && i < 8; ++i) {
        assert_int_equal(info[i].index, i);
        assert_true(info[i].device_name[0] != '\0');
        assert_true(info[i].platform_name[0] != '\0');
        assert_true(info[i].global_mem_bytes > 0);
        assert_true(info[i].max_work_group_size >= 1);
        assert_true(info[i].type >= DSGD_CL_DEVICE_GPU && info[i].type <= DSGD_CL_DEVICE_ALL);
    }
    /* the context's devices answer as a direct query does */
    {
        cl_device_fp_config fp = 0;
        assert_int_equal(clGetDeviceInfo(dsgd_cl_context_device(G.cl, 0), CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp,
                                         NULL),
                         CL_SUCCESS);
        assert_true(dsgd_cl_context_device_info(G.cl, 0)->single_fp_config == (unsigned long long)fp);
    }
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cl_list_devices(G.ctx, NULL, 0, NULL));
    assert_string_equal(dsgd_cl_device_type_name(DSGD_CL_DEVICE_GPU), "gpu");
    assert_string_equal(dsgd_cl_error_string(-5), "CL_OUT_OF_RESOURCES");
    assert_string_equal(dsgd_cl_error_string(-61), "CL_INVALID_BUFFER_SIZE");
    assert_string_equal(dsgd_cl_error_string(-1016), "CLBlastInvalidLeadDimA");
    assert_string_equal(dsgd_cl_error_string(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
    assert_string_equal(dsgd_cl_error_string(12345), "unknown OpenCL error");
}

/* fp_bit_exact on made-up configs (no device needed): a PoCL-like CPU device
   that promises everything, an Intel-Arc-like GPU without correctly rounded
   divide and sqrt, a device that flushes denormals, a driver that does not
   answer (0), and need 0 (copies), which any device meets. */
static void test_fp_mode_decision(void **state) {
    const unsigned long long all = (unsigned long long)(CL_FP_DENORM | CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST |
                                                        CL_FP_ROUND_TO_ZERO | CL_FP_ROUND_TO_INF | CL_FP_FMA |
                                                        CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT);
    const unsigned long long arc = (unsigned long long)(CL_FP_DENORM | CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST |
                                                        CL_FP_FMA);
    const unsigned long long ftz = (unsigned long long)(CL_FP_INF_NAN | CL_FP_ROUND_TO_NEAREST | CL_FP_FMA |
                                                        CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT);
    (void)state;
    assert_true(fp_bit_exact(all, FP_ARITH));
    assert_true(fp_bit_exact(all, FP_DIVSQRT));
    assert_true(fp_bit_exact(arc, FP_ARITH));
    assert_false(fp_bit_exact(arc, FP_DIVSQRT));
    assert_false(fp_bit_exact(ftz, FP_ARITH));
    assert_false(fp_bit_exact(ftz, FP_DIVSQRT));
    assert_false(fp_bit_exact(0, FP_ARITH));
    assert_false(fp_bit_exact(0, FP_DIVSQRT));
    assert_true(fp_bit_exact(0, 0));
    assert_true(fp_bit_exact(arc, 0));
    /* FMA is never needed: a device without it compares bit for bit */
    assert_true(fp_bit_exact(all & ~(unsigned long long)CL_FP_FMA, FP_DIVSQRT));
    /* round to zero alone is not round to nearest */
    assert_false(fp_bit_exact((unsigned long long)(CL_FP_DENORM | CL_FP_INF_NAN | CL_FP_ROUND_TO_ZERO |
                                                   CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT),
                              FP_ARITH));
    assert_string_equal(fp_mode_name(all, FP_DIVSQRT), "bit-exact");
    assert_string_equal(fp_mode_name(arc, FP_DIVSQRT), "tolerance");
}

/* Opens a context for spec (desc) and returns the result; *name gets the
   device's name on success. */
static dsgd_result open_spec(dsgd_ctx *ctx, const char *spec, char *name, size_t cap) {
    dsgd_cl_context_desc cd;
    dsgd_cl_context *c = NULL;
    dsgd_result r;
    memset(&cd, 0, sizeof cd);
    cd.device = spec;
    cd.tuning = DSGD_CL_TUNING_OFF;
    r = dsgd_cl_context_create(ctx, &cd, &c);
    if (r == DSGD_OK) {
        if (name) snprintf(name, cap, "%s", dsgd_cl_context_device_info(c, 0)->device_name);
        dsgd_cl_context_destroy(c);
    }
    return r;
}

static void test_device_selection(void **state) {
    dsgd_cl_device_info info[16];
    char name[DSGD_CL_MAX_NAME], spec[32];
    int n = 0, i, have_acc = 0;
    (void)state;
    NEED_CL();
    TU_OK(G.ctx, dsgd_cl_list_devices(G.ctx, info, 16, &n));
    if (n > 16) n = 16;
    for (i = 0; i < n; ++i) have_acc |= info[i].type == DSGD_CL_DEVICE_ACCELERATOR;
    /* by list index and by platform:device, the same device */
    TU_OK(G.ctx, open_spec(G.ctx, "0", name, sizeof name));
    assert_string_equal(name, info[0].device_name);
    snprintf(spec, sizeof spec, "%d:%d", info[n - 1].platform_index, info[n - 1].device_index);
    TU_OK(G.ctx, open_spec(G.ctx, spec, name, sizeof name));
    assert_string_equal(name, info[n - 1].device_name);
    /* by type: the first device of that type */
    TU_OK(G.ctx, open_spec(G.ctx, dsgd_cl_device_type_name(info[0].type == DSGD_CL_DEVICE_ALL
                                                               ? DSGD_CL_DEVICE_ALL
                                                               : info[0].type),
                           name, sizeof name));
    /* bad specs */
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, open_spec(G.ctx, "bogus", NULL, 0));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "bogus");
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, open_spec(G.ctx, "0:", NULL, 0));
    TU_ERR(G.ctx, DSGD_ERR_BACKEND, open_spec(G.ctx, "99", NULL, 0));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "no OpenCL device 99");
    TU_ERR(G.ctx, DSGD_ERR_BACKEND, open_spec(G.ctx, "77:0", NULL, 0));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "platform 77");
    if (!have_acc) {
        TU_ERR(G.ctx, DSGD_ERR_BACKEND, open_spec(G.ctx, "accelerator", NULL, 0));
        EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "no OpenCL device of type accelerator");
    }
    /* the environment, read only when desc.device is NULL */
    setenv("DSGD_CL_DEVICE", "99", 1);
    TU_ERR(G.ctx, DSGD_ERR_BACKEND, open_spec(G.ctx, NULL, NULL, 0));
    TU_OK(G.ctx, open_spec(G.ctx, "0", NULL, 0)); /* desc wins over the environment */
    setenv("DSGD_CL_DEVICE", "nonsense", 1);
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, open_spec(G.ctx, NULL, NULL, 0));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "DSGD_CL_DEVICE");
    unsetenv("DSGD_CL_DEVICE");
    snprintf(spec, sizeof spec, "%d", info[0].platform_index);
    setenv("DSGD_CL_PLATFORM", spec, 1);
    TU_OK(G.ctx, open_spec(G.ctx, NULL, NULL, 0));
    setenv("DSGD_CL_PLATFORM", "x", 1);
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, open_spec(G.ctx, NULL, NULL, 0));
    unsetenv("DSGD_CL_PLATFORM");
    if (!have_acc) {
        setenv("DSGD_CL_DEVICE_TYPE", "accelerator", 1);
        TU_ERR(G.ctx, DSGD_ERR_BACKEND, open_spec(G.ctx, NULL, NULL, 0));
        unsetenv("DSGD_CL_DEVICE_TYPE");
    }
}

/* ---------------------------------------------------------------- buffers */

static void test_buffer_ops(void **state) {
    static const size_t sizes[] = {1, 255, 256, 257, 1000};
    tu_rng rng = tu_rng_make(11);
    size_t s;
    (void)state;
    NEED_CL();
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        size_t n = sizes[s], total = 3 * n + 5;
        pbuf a = pb_rand(total, &rng, -2, 2), b = pb_rand(total, &rng, -2, 2);
        float *h = tu_floats(n), *got = tu_floats(n);
        tu_fill(&rng, h, n, -1, 1);
        /* write at an offset, read it back */
        TU_OK(G.ctx, G.clb.write(G.clb.impl, R(a.cl, n + 3), h, n));
        TU_OK(G.ctx, G.cpu.write(G.cpu.impl, R(a.cpu, n + 3), h, n));
        TU_OK(G.ctx, G.clb.read(G.clb.impl, R(a.cl, n + 3), got, n));
        expect_close(got, h, n, 0, 0, "read after write");
        /* copy between buffers, fill, and copies inside one buffer that
           overlap forwards and backwards (memmove semantics) */
        TU_OK(G.ctx, G.clb.copy(G.clb.impl, R(b.cl, 2), R(a.cl, n + 1), n));
        TU_OK(G.ctx, G.cpu.copy(G.cpu.impl, R(b.cpu, 2), R(a.cpu, n + 1), n));
        TU_OK(G.ctx, G.clb.fill(G.clb.impl, R(a.cl, 1), 0.25f, n));
        TU_OK(G.ctx, G.cpu.fill(G.cpu.impl, R(a.cpu, 1), 0.25f, n));
        TU_OK(G.ctx, G.clb.copy(G.clb.impl, R(b.cl, n / 2 + 1), R(b.cl, 0), n + 2));
        TU_OK(G.ctx, G.cpu.copy(G.cpu.impl, R(b.cpu, n / 2 + 1), R(b.cpu, 0), n + 2));
        TU_OK(G.ctx, G.clb.copy(G.clb.impl, R(b.cl, 0), R(b.cl, 1), 2 * n));
        TU_OK(G.ctx, G.cpu.copy(G.cpu.impl, R(b.cpu, 0), R(b.cpu, 1), 2 * n));
        pb_expect(&a, 0, 0, "a");
        pb_expect(&b, 0, 0, "b");
        /* out of range */
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.fill(G.clb.impl, R(a.cl, total - n + 1), 0.0f, n));
        EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "outside a buffer");
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.read(G.clb.impl, R(a.cl, total), got, 1));
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.copy(G.clb.impl, R(a.cl, 0), R(b.cl, 3 * n + 1), 5));
        free(h);
        free(got);
        pb_free(&a);
        pb_free(&b);
    }
    assert_null(G.clb.buffer_host_ptr(G.clb.impl, NULL));
}

static void test_scale_axpy(void **state) {
    static const size_t sizes[] = {1, 7, 255, 256, 257, 4099};
    tu_rng rng = tu_rng_make(12);
    size_t s;
    (void)state;
    NEED_CL();
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        size_t n = sizes[s];
        pbuf x = pb_rand(n + 9, &rng, -3, 3), y = pb_rand(n + 4, &rng, -3, 3);
        TU_OK(G.ctx, G.clb.scale(G.clb.impl, R(x.cl, 9), -0.37f, n));
        TU_OK(G.ctx, G.cpu.scale(G.cpu.impl, R(x.cpu, 9), -0.37f, n));
        TU_OK(G.ctx, G.clb.axpy(G.clb.impl, R(y.cl, 3), 1.0f / 3.0f, R(x.cl, 5), n));
        TU_OK(G.ctx, G.cpu.axpy(G.cpu.impl, R(y.cpu, 3), 1.0f / 3.0f, R(x.cpu, 5), n));
        pb_expect_fp(&x, FP_ARITH, "scale");
        pb_expect_fp(&y, FP_ARITH, "axpy");
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.axpy(G.clb.impl, R(y.cl, 5), 1.0f, R(x.cl, 0), n));
        pb_free(&x);
        pb_free(&y);
    }
}

/* ---------------------------------------------------------------- gemm */

typedef struct gcase {
    int ta, tb, m, n, k, pad;
    float alpha, beta;
} gcase;

/* Runs one GEMM on both backends (A, B, C with padded strides and offsets)
   and compares C with the per-element bound of the file comment. */
static void gemm_case(const gcase *g, tu_rng *rng, int nan_c) {
    int a_rows = g->ta ? g->k : g->m, a_cols = g->ta ? g->m : g->k;
    int b_rows = g->tb ? g->n : g->k, b_cols = g->tb ? g->k : g->n;
    int lda = a_cols + g->pad, ldb = b_cols + g->pad, ldc = g->n + g->pad;
    size_t offa = 3, offb = 5, offc = 7;
    size_t na = offa + (size_t)a_rows * lda, nb = offb + (size_t)b_rows * ldb, nc = offc + (size_t)g->m * ldc;
    float *ha = tu_floats(na), *hb = tu_floats(nb), *hc = tu_floats(nc), *gcpu, *gcl;
    pbuf A, B, C;
    int i, j, p;
    char what[96];
    tu_fill(rng, ha, na, -1, 1);
    tu_fill(rng, hb, nb, -1, 1);
    tu_fill(rng, hc, nc, -1, 1);
    if (nan_c)
        for (i = 0; i < g->m; ++i)
            for (j = 0; j < g->n; ++j) hc[offc + (size_t)i * ldc + j] = NAN;
    A = pb_make(na, ha);
    B = pb_make(nb, hb);
    C = pb_make(nc, hc);
    TU_OK(G.ctx, G.clb.gemm(G.clb.impl, g->ta, g->tb, g->m, g->n, g->k, g->alpha, R(A.cl, offa), lda, R(B.cl, offb),
                            ldb, g->beta, R(C.cl, offc), ldc));
    TU_OK(G.ctx, G.cpu.gemm(G.cpu.impl, g->ta, g->tb, g->m, g->n, g->k, g->alpha, R(A.cpu, offa), lda,
                            R(B.cpu, offb), ldb, g->beta, R(C.cpu, offc), ldc));
    pb_read(&C, &gcpu, &gcl);
    snprintf(what, sizeof what, "gemm %s%s %dx%dx%d pad %d C", g->ta ? "T" : "N", g->tb ? "T" : "N", g->m, g->n,
             g->k, g->pad);
    for (i = 0; i < g->m; ++i) {
        for (j = 0; j < g->n; ++j) {
            size_t ci = offc + (size_t)i * ldc + j;
            double mag = 0.0, cold = nan_c ? 0.0 : hc[ci];
            for (p = 0; p < g->k; ++p) {
                double av = g->ta ? ha[offa + (size_t)p * lda + i] : ha[offa + (size_t)i * lda + p];
                double bv = g->tb ? hb[offb + (size_t)j * ldb + p] : hb[offb + (size_t)p * ldb + j];
                mag += fabs(av * bv);
            }
            mag = fabs(g->alpha) * mag + (g->beta != 0.0f ? fabs(g->beta * cold) : 0.0);
            if (isnan(gcl[ci])) fail_msg("%s[%d,%d] is NaN", what, i, j);
            if (!(fabs((double)gcl[ci] - gcpu[ci]) <= 1e-5 * mag + 1e-30))
                fail_msg("%s[%d,%d]: opencl %.9g, cpu %.9g, bound %.3g", what, i, j, gcl[ci], gcpu[ci], 1e-5 * mag);
        }
    }
    /* padding and the space around C untouched */
    for (i = 0; i < (int)nc; ++i) {
        size_t ui = (size_t)i;
        int inside = ui >= offc && (int)((ui - offc) % ldc) < g->n && ui < offc + (size_t)g->m * ldc;
        if (!inside && memcmp(&gcl[ui], &hc[ui], sizeof(float)) != 0)
            fail_msg("%s: element %d outside C changed", what, i);
    }
    free(gcpu);
    free(gcl);
    free(ha);
    free(hb);
    free(hc);
    pb_free(&A);
    pb_free(&B);
    pb_free(&C);
}

static void test_gemm(void **state) {
    static const gcase cases[] = {
        {0, 0, 37, 53, 29, 3, 0.7f, 0.3f}, {0, 1, 37, 53, 29, 3, 0.7f, 0.3f}, {1, 0, 37, 53, 29, 3, 0.7f, 0.3f},
        {1, 1, 37, 53, 29, 3, 0.7f, 0.3f}, {0, 0, 1, 1, 1, 0, 1.0f, 0.0f},     {0, 0, 1, 300, 7, 0, -1.0f, 1.0f},
        {0, 0, 32, 20, 16, 0, 1.0f, 0.0f}, {1, 0, 20, 16, 32, 0, 1.0f, 0.0f},  {0, 1, 32, 20, 16, 0, 1.0f, 0.0f},
        /* large enough for CLBlast's padded (indirect) path, not multiples of its tiles */
        {0, 0, 129, 257, 300, 0, 1.0f, 0.0f}, {1, 0, 300, 129, 257, 1, 0.5f, 1.0f},
        {0, 1, 257, 300, 129, 0, 1.0f, 0.0f}};
    tu_rng rng = tu_rng_make(13);
    size_t i;
    (void)state;
    NEED_CL();
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) gemm_case(&cases[i], &rng, 0);
}

/* Thin TN GEMMs over a long k (a convolution's weight gradient), on a
   backend made with DSGD_CL_GEMM_SPLIT_K=1 (split along k: parts of 64
   rows or more and a short last one, added in order; the default on GPUs) and =0
   (CLBlast): both within the bound, a NaN C with beta 0 overwritten. */
static void test_gemm_split_k(void **state) {
    static const gcase cases[] = {
        {1, 0, 9, 16, 5000, 3, 0.7f, 0.3f}, {1, 0, 144, 32, 3000, 0, 1.0f, 0.0f}, {1, 0, 1, 1, 2048, 1, -1.0f, 1.0f}};
    static const gcase nan_case = {1, 0, 9, 16, 4096, 0, 1.0f, 0.0f};
    static const char *const modes[] = {"1", "0"};
    tu_rng rng = tu_rng_make(16);
    dsgd_backend_i saved, other;
    size_t i, mode;
    (void)state;
    NEED_CL();
    for (mode = 0; mode < 2; ++mode) {
        assert_int_equal(setenv("DSGD_CL_GEMM_SPLIT_K", modes[mode], 1), 0);
        TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, G.cl, NULL, &other));
        unsetenv("DSGD_CL_GEMM_SPLIT_K");
        saved = G.clb;
        G.clb = other;
        for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) gemm_case(&cases[i], &rng, 0);
        gemm_case(&nan_case, &rng, 1);
        G.clb = saved;
        other.destroy(other.impl);
    }
}

static void test_gemm_edge_cases(void **state) {
    static const gcase nan_cases[] = {{0, 0, 37, 53, 29, 2, 1.0f, 0.0f}, {0, 1, 129, 257, 300, 0, 1.0f, 0.0f}};
    gcase k0 = {0, 0, 5, 7, 0, 2, 1.0f, 0.5f};
    tu_rng rng = tu_rng_make(14);
    pbuf A;
    size_t i;
    (void)state;
    NEED_CL();
    /* beta == 0 overwrites C: NaN there does not propagate */
    for (i = 0; i < sizeof nan_cases / sizeof nan_cases[0]; ++i) gemm_case(&nan_cases[i], &rng, 1);
    /* k == 0: C = beta C */
    gemm_case(&k0, &rng, 0);
    k0.beta = 0.0f;
    gemm_case(&k0, &rng, 1);
    /* bad sizes and ranges are argument errors, as on the CPU */
    A = pb_rand(100, &rng, -1, 1);
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT,
           G.clb.gemm(G.clb.impl, 0, 0, 5, 5, 5, 1.0f, R(A.cl, 0), 4, R(A.cl, 0), 5, 0.0f, R(A.cl, 0), 5));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "bad sizes");
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT,
           G.clb.gemm(G.clb.impl, 0, 0, 10, 10, 10, 1.0f, R(A.cl, 0), 10, R(A.cl, 0), 10, 0.0f, R(A.cl, 1), 10));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "gemm C");
    pb_free(&A);
}

/* ---------------------------------------------------------------- activations */

static void test_bias_act_forward(void **state) {
    static const int shapes[][2] = {{1, 1}, {3, 7}, {17, 300}, {5, 257}};
    tu_rng rng = tu_rng_make(15);
    int s, act, with_bias;
    (void)state;
    NEED_CL();
    for (s = 0; s < 4; ++s) {
        int m = shapes[s][0], n = shapes[s][1];
        for (act = DSGD_ACT_NONE; act <= DSGD_ACT_SIGMOID; ++act) {
            for (with_bias = 0; with_bias < 2; ++with_bias) {
                pbuf y = pb_rand((size_t)m * n + 4, &rng, -4, 4), b = pb_rand((size_t)n + 2, &rng, -1, 1);
                double tol = (act == DSGD_ACT_TANH || act == DSGD_ACT_SIGMOID) ? 1e-6 : 0.0;
                char what[64];
                TU_OK(G.ctx, G.clb.bias_act_forward(G.clb.impl, (dsgd_activation)act, R(y.cl, 4),
                                                    with_bias ? R(b.cl, 2) : NOREF(), m, n));
                TU_OK(G.ctx, G.cpu.bias_act_forward(G.cpu.impl, (dsgd_activation)act, R(y.cpu, 4),
                                                    with_bias ? R(b.cpu, 2) : NOREF(), m, n));
                snprintf(what, sizeof what, "bias_act_forward act %d bias %d %dx%d", act, with_bias, m, n);
                if (tol == 0.0)
                    pb_expect_fp(&y, FP_ARITH, what);
                else
                    pb_expect(&y, tol, 0, what);
                pb_free(&y);
                pb_free(&b);
            }
        }
    }
    {
        pbuf y = pb_rand(10, &rng, -1, 1);
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT,
               G.clb.bias_act_forward(G.clb.impl, (dsgd_activation)9, R(y.cl, 0), NOREF(), 2, 5));
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT,
               G.clb.bias_act_forward(G.clb.impl, DSGD_ACT_RELU, R(y.cl, 0), R(y.cl, 8), 2, 5));
        pb_free(&y);
    }
}

static void test_act_backward(void **state) {
    static const size_t sizes[] = {1, 255, 257, 3000};
    tu_rng rng = tu_rng_make(16);
    size_t s;
    int act;
    (void)state;
    NEED_CL();
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        size_t n = sizes[s];
        for (act = DSGD_ACT_NONE; act <= DSGD_ACT_SIGMOID; ++act) {
            pbuf dy = pb_rand(n + 1, &rng, -2, 2), y = pb_rand(n + 3, &rng, -1, 1);
            char what[64];
            TU_OK(G.ctx, G.clb.act_backward(G.clb.impl, (dsgd_activation)act, R(dy.cl, 1), R(y.cl, 3), n));
            TU_OK(G.ctx, G.cpu.act_backward(G.cpu.impl, (dsgd_activation)act, R(dy.cpu, 1), R(y.cpu, 3), n));
            snprintf(what, sizeof what, "act_backward act %d n %zu", act, n);
            pb_expect_fp(&dy, FP_ARITH, what);
            pb_free(&dy);
            pb_free(&y);
        }
    }
}

/* bias_backward adds in blocks of 128 rows (PRECISION in kernels.h): one
   block (m <= 128, the rows in order), exactly one, several with a short
   last one, and enough blocks for several work-groups of partials; n from 1
   to a few hundred (across one work-group of columns and beyond). */
static void test_bias_backward(void **state) {
    static const int shapes[][2] = {{1, 1},    {300, 7},  {33, 513}, {256, 10}, {0, 5},    {128, 3},
                                    {129, 1},  {1000, 1}, {777, 3},  {4099, 32}, {2500, 257}, {640, 300},
                                    {8193, 2}, {50, 255}};
    tu_rng rng = tu_rng_make(17);
    int s;
    (void)state;
    NEED_CL();
    for (s = 0; s < (int)(sizeof shapes / sizeof shapes[0]); ++s) {
        int m = shapes[s][0], n = shapes[s][1];
        pbuf db = pb_rand((size_t)n + 2, &rng, -1, 1), dy = pb_rand((size_t)m * n + 1, &rng, -1, 1);
        char what[64];
        TU_OK(G.ctx, G.clb.bias_backward(G.clb.impl, R(db.cl, 2), R(dy.cl, 1), m, n));
        TU_OK(G.ctx, G.cpu.bias_backward(G.cpu.impl, R(db.cpu, 2), R(dy.cpu, 1), m, n));
        snprintf(what, sizeof what, "bias_backward m %d n %d", m, n);
        pb_expect_fp(&db, FP_ARITH, what);
        pb_free(&db);
        pb_free(&dy);
    }
}

/* ---------------------------------------------------------------- images */
/* im2col, col2im, maxpool_forward and maxpool_backward: the OpenCL kernels
   give the CPU backend's bits (signed zeros and NaNs included) over a grid
   of shapes, at offsets, with ties and NaNs in max-pool's input. */

static dsgd_window img_win(int n, int h, int w, int c, int kh, int kw, int stride, int pad) {
    dsgd_window wd;
    wd.n = n;
    wd.h = h;
    wd.w = w;
    wd.c = c;
    wd.kh = kh;
    wd.kw = kw;
    wd.stride = stride;
    wd.pad = pad;
    return wd;
}

/* Reads both copies of p and fails unless they are equal bit for bit, or,
   where the device does not promise every bit of need (see the FP config
   section; need 0 for copies and compares), within the tolerance. */
static void pb_expect_bits(const pbuf *p, const dsgd_window *wd, unsigned long long need, const char *what) {
    float *a, *b;
    size_t i;
    pb_read(p, &b, &a);
    if (!fp_bit_exact(G.fp_config, need)) {
        char w[160];
        snprintf(w, sizeof w, "%s n=%d h=%d w=%d c=%d k=%dx%d stride=%d pad=%d", what, wd->n, wd->h, wd->w, wd->c,
                 wd->kh, wd->kw, wd->stride, wd->pad);
        expect_close(a, b, p->n, TOL_ABS, TOL_REL, w);
    } else {
        for (i = 0; i < p->n; ++i)
            if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
                fail_msg("%s n=%d h=%d w=%d c=%d k=%dx%d stride=%d pad=%d: [%zu] opencl %.9g, cpu %.9g", what,
                         wd->n, wd->h, wd->w, wd->c, wd->kh, wd->kw, wd->stride, wd->pad, i, (double)a[i],
                         (double)b[i]);
    }
    free(a);
    free(b);
}

/* Values with ties (from {-1, -0, 0, 1, 2}) and a NaN on about one in 11,
   or (ties 0) uniform in [-1, 1). */
static pbuf img_rand(size_t n, tu_rng *rng, int ties) {
    static const float vals[5] = {-1.0f, -0.0f, 0.0f, 1.0f, 2.0f};
    float *h = tu_floats(n);
    size_t i;
    pbuf p;
    for (i = 0; i < n; ++i)
        h[i] = !ties ? tu_uniform(rng, -1.0f, 1.0f) : tu_below(rng, 11) == 0 ? NAN : vals[tu_below(rng, 5)];
    p = pb_make(n, h);
    free(h);
    return p;
}

/* One shape on both backends: every operation the window allows (pad 0:
   max-pool too), inputs at offset 3, outputs at offset 2. */
static void img_case(const dsgd_window *wd, tu_rng *rng) {
    const int pool = wd->pad == 0;
    const int oh = (wd->h + 2 * wd->pad - wd->kh) / wd->stride + 1, ow = (wd->w + 2 * wd->pad - wd->kw) / wd->stride + 1;
    const size_t nx = (size_t)wd->n * wd->h * wd->w * wd->c, ny = (size_t)wd->n * oh * ow * wd->c,
                 ncol = ny * (size_t)wd->kh * wd->kw;
    pbuf x = img_rand(nx + 3, rng, 1), g = img_rand(ncol + 3, rng, 0), col = pb_make(ncol + 2, NULL),
         dx = pb_make(nx + 2, NULL);
    TU_OK(G.ctx, G.clb.im2col(G.clb.impl, wd, R(x.cl, 3), R(col.cl, 2)));
    TU_OK(G.ctx, G.cpu.im2col(G.cpu.impl, wd, R(x.cpu, 3), R(col.cpu, 2)));
    pb_expect_bits(&col, wd, 0, "im2col");
    TU_OK(G.ctx, G.clb.col2im(G.clb.impl, wd, R(g.cl, 3), R(dx.cl, 2)));
    TU_OK(G.ctx, G.cpu.col2im(G.cpu.impl, wd, R(g.cpu, 3), R(dx.cpu, 2)));
    pb_expect_bits(&dx, wd, FP_ARITH, "col2im");
    if (pool) {
        pbuf y = pb_make(ny + 2, NULL), dy = img_rand(ny + 3, rng, 0), pdx = pb_make(nx + 2, NULL);
        TU_OK(G.ctx, G.clb.maxpool_forward(G.clb.impl, wd, R(x.cl, 3), R(y.cl, 2)));
        TU_OK(G.ctx, G.cpu.maxpool_forward(G.cpu.impl, wd, R(x.cpu, 3), R(y.cpu, 2)));
        pb_expect_bits(&y, wd, 0, "maxpool_forward");
        TU_OK(G.ctx, G.clb.maxpool_backward(G.clb.impl, wd, R(x.cl, 3), R(y.cl, 2), R(dy.cl, 3), R(pdx.cl, 2)));
        TU_OK(G.ctx, G.cpu.maxpool_backward(G.cpu.impl, wd, R(x.cpu, 3), R(y.cpu, 2), R(dy.cpu, 3), R(pdx.cpu, 2)));
        pb_expect_bits(&pdx, wd, FP_ARITH, "maxpool_backward");
        pb_free(&y);
        pb_free(&dy);
        pb_free(&pdx);
    }
    pb_free(&x);
    pb_free(&g);
    pb_free(&col);
    pb_free(&dx);
}

/* The grid of tests/test_backend.c: odd sizes, c 1 and 3, strides 1-3,
   pads 0-2, kernels 1x1, 2x2, 3x3, 5x2 and the whole padded input, batch 1
   and 2; five larger layers (work-item counts beyond one work-group); and
   channels (and im2col's kw c) that fill no power-of-two work-group width,
   some beyond one work-group (67, 257, 300 and 3 x 300). full 0: the
   larger layers and every fifth shape of the grid. */
static void img_grid(tu_rng *rng, int full) {
    static const int hw[][2] = {{1, 1}, {4, 4}, {5, 7}, {9, 6}};
    static const int ks[][2] = {{1, 1}, {2, 2}, {3, 3}, {5, 2}, {0, 0}};
    static const int big[][8] = {{4, 28, 28, 1, 3, 3, 1, 1},   {3, 14, 14, 32, 3, 3, 1, 1}, {3, 14, 13, 32, 2, 2, 2, 0},
                                 {2, 15, 11, 5, 3, 2, 1, 0},   {2, 28, 28, 4, 2, 2, 2, 0},  {2, 7, 6, 300, 3, 3, 1, 1},
                                 {3, 9, 8, 67, 2, 3, 2, 0},    {2, 6, 5, 257, 2, 2, 2, 0}};
    int a, b, c, st, p, n, cases = 0, seen = 0, i;
    for (a = 0; a < 4; ++a)
        for (b = 0; b < 5; ++b)
            for (c = 1; c <= 3; c += 2)
                for (st = 1; st <= 3; ++st)
                    for (p = 0; p <= 2; ++p)
                        for (n = 1; n <= 2; ++n) {
                            int kh = ks[b][0] ? ks[b][0] : hw[a][0] + 2 * p, kw = ks[b][1] ? ks[b][1] : hw[a][1] + 2 * p;
                            dsgd_window wd = img_win(n, hw[a][0], hw[a][1], c, kh, kw, st, p);
                            if (kh > hw[a][0] + 2 * p || kw > hw[a][1] + 2 * p) continue;
                            if (full || seen++ % 5 == 0) {
                                img_case(&wd, rng);
                                ++cases;
                            }
                        }
    assert_true(cases > (full ? 400 : 80));
    for (i = 0; i < (int)(sizeof big / sizeof big[0]); ++i) {
        const int *v = big[i];
        dsgd_window wd = img_win(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
        img_case(&wd, rng);
    }
}

static void test_image_ops(void **state) {
    tu_rng rng = tu_rng_make(1406);
    (void)state;
    NEED_CL();
    img_grid(&rng, 1);
}

/* img_grid on a backend made with the test hooks (BACKENDS in
   distsgd/cl/backend.h) DSGD_CL_IMAGE_INDEX_BITS=bits and
   DSGD_CL_IMAGE_SPREAD=spread. */
static void img_grid_with(const char *bits, const char *spread, int full) {
    dsgd_backend_i saved, other;
    tu_rng rng = tu_rng_make(1407);
    assert_int_equal(setenv("DSGD_CL_IMAGE_INDEX_BITS", bits, 1), 0);
    assert_int_equal(setenv("DSGD_CL_IMAGE_SPREAD", spread, 1), 0);
    TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, G.cl, NULL, &other));
    unsetenv("DSGD_CL_IMAGE_INDEX_BITS");
    unsetenv("DSGD_CL_IMAGE_SPREAD");
    saved = G.clb;
    G.clb = other;
    img_grid(&rng, full);
    G.clb = saved;
    other.destroy(other.impl);
}

/* Both launch shapes (a row's floats over work-items, the GPU's; one
   work-item's loop, the CPU's), whichever the device would choose: the
   whole grid in each (the quick tier: every fifth shape of it and the
   larger layers, as test_image_ops_64bit_index; test_image_ops runs the
   whole grid in the device's own shape). */
static void test_image_ops_both_shapes(void **state) {
    (void)state;
    NEED_CL();
    img_grid_with("32", "1", tu_full());
    img_grid_with("32", "0", tu_full());
}

/* The image kernels with 64-bit indices (the 32-bit ones serve every
   buffer a test can make), in both shapes: the same bits. */
static void test_image_ops_64bit_index(void **state) {
    (void)state;
    NEED_CL();
    img_grid_with("64", "1", 0);
    img_grid_with("64", "0", 0);
}

/* Bad windows and ranges: DSGD_ERR_INVALID_ARGUMENT with a message, as on
   the CPU backend, and nothing enqueued. */
static void test_image_errors(void **state) {
    dsgd_window ok = img_win(2, 5, 4, 3, 3, 3, 1, 1), pool = img_win(2, 5, 4, 3, 2, 2, 2, 0), bad;
    const size_t nx = 2 * 5 * 4 * 3, ncol = 2 * 5 * 4 * 27, ny = 2 * 2 * 2 * 3;
    pbuf x, col, y, dx, small;
    dsgd_buffer *cpu_buf = NULL;
    (void)state;
    NEED_CL();
    x = pb_make(nx, NULL);
    col = pb_make(ncol, NULL);
    y = pb_make(ny, NULL);
    dx = pb_make(nx, NULL);
    small = pb_make(4, NULL);
    TU_OK(G.ctx, G.clb.fill(G.clb.impl, R(col.cl, 0), 7.0f, ncol));
    TU_OK(G.ctx, G.clb.fill(G.clb.impl, R(dx.cl, 0), 7.0f, nx));
    TU_OK(G.ctx, G.clb.fill(G.clb.impl, R(y.cl, 0), 7.0f, ny));
#define CL_BAD(expr) TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, (dsgd_ctx_clear_error(G.ctx), (expr)))
#define BADWIN(field, value) (bad = ok, bad.field = (value), &bad)
    CL_BAD(G.clb.im2col(G.clb.impl, NULL, R(x.cl, 0), R(col.cl, 0)));
    CL_BAD(G.clb.im2col(G.clb.impl, BADWIN(n, 0), R(x.cl, 0), R(col.cl, 0)));
    CL_BAD(G.clb.im2col(G.clb.impl, BADWIN(h, -2), R(x.cl, 0), R(col.cl, 0)));
    CL_BAD(G.clb.im2col(G.clb.impl, BADWIN(c, 0), R(x.cl, 0), R(col.cl, 0)));
    CL_BAD(G.clb.im2col(G.clb.impl, BADWIN(kw, 0), R(x.cl, 0), R(col.cl, 0)));
    CL_BAD(G.clb.col2im(G.clb.impl, BADWIN(stride, 0), R(col.cl, 0), R(dx.cl, 0)));
    CL_BAD(G.clb.col2im(G.clb.impl, BADWIN(pad, -1), R(col.cl, 0), R(dx.cl, 0)));
    CL_BAD(G.clb.col2im(G.clb.impl, BADWIN(kh, 8), R(col.cl, 0), R(dx.cl, 0))); /* > 5 + 2 */
    bad = ok;
    bad.n = bad.h = bad.w = bad.c = INT_MAX;
    CL_BAD(G.clb.im2col(G.clb.impl, &bad, R(x.cl, 0), R(col.cl, 0)));
    bad = ok; /* a padded side past INT_MAX, with tiny sizes */
    bad.pad = bad.stride = 2000000000;
    bad.kh = bad.kw = 1;
    CL_BAD(G.clb.im2col(G.clb.impl, &bad, R(x.cl, 0), R(col.cl, 0)));
    bad = pool;
    bad.pad = 1;
    CL_BAD(G.clb.maxpool_forward(G.clb.impl, &bad, R(x.cl, 0), R(y.cl, 0)));
    CL_BAD(G.clb.maxpool_backward(G.clb.impl, &bad, R(x.cl, 0), R(y.cl, 0), R(y.cl, 0), R(dx.cl, 0)));
    bad = pool;
    bad.kw = 5;
    CL_BAD(G.clb.maxpool_forward(G.clb.impl, &bad, R(x.cl, 0), R(y.cl, 0)));
    /* ranges past the end, overlaps, a NULL buffer, another backend's buffer */
    CL_BAD(G.clb.im2col(G.clb.impl, &ok, R(x.cl, 1), R(col.cl, 0)));
    CL_BAD(G.clb.im2col(G.clb.impl, &ok, R(x.cl, 0), R(col.cl, 1)));
    CL_BAD(G.clb.im2col(G.clb.impl, &ok, R(NULL, 0), R(col.cl, 0)));
    CL_BAD(G.clb.col2im(G.clb.impl, &ok, R(small.cl, 0), R(dx.cl, 0)));
    CL_BAD(G.clb.col2im(G.clb.impl, &ok, R(col.cl, 0), R(col.cl, 10)));
    CL_BAD(G.clb.maxpool_forward(G.clb.impl, &pool, R(x.cl, 0), R(small.cl, 0)));
    CL_BAD(G.clb.maxpool_forward(G.clb.impl, &pool, R(x.cl, 0), R(x.cl, 4)));
    CL_BAD(G.clb.maxpool_backward(G.clb.impl, &pool, R(x.cl, 0), R(small.cl, 0), R(y.cl, 0), R(dx.cl, 0)));
    CL_BAD(G.clb.maxpool_backward(G.clb.impl, &pool, R(x.cl, 0), R(y.cl, 0), R(y.cl, 1), R(dx.cl, 0)));
    CL_BAD(G.clb.maxpool_backward(G.clb.impl, &pool, R(x.cl, 0), R(y.cl, 0), R(y.cl, 0), R(y.cl, 0)));
    CL_BAD(G.clb.maxpool_backward(G.clb.impl, &pool, R(x.cl, 0), R(y.cl, 0), R(y.cl, 0), R(x.cl, 0)));
    TU_OK(G.ctx, G.cpu.buffer_create(G.cpu.impl, ncol, &cpu_buf));
    CL_BAD(G.clb.im2col(G.clb.impl, &ok, R(x.cl, 0), R(cpu_buf, 0)));
    G.cpu.buffer_destroy(G.cpu.impl, cpu_buf);
#undef BADWIN
#undef CL_BAD
    /* nothing was written */
    {
        float *h = tu_floats(ncol);
        size_t i;
        TU_OK(G.ctx, G.clb.read(G.clb.impl, R(col.cl, 0), h, ncol));
        for (i = 0; i < ncol; ++i)
            if (h[i] != 7.0f) fail_msg("col[%zu] written by a refused call", i);
        TU_OK(G.ctx, G.clb.read(G.clb.impl, R(dx.cl, 0), h, nx));
        for (i = 0; i < nx; ++i)
            if (h[i] != 7.0f) fail_msg("dx[%zu] written by a refused call", i);
        TU_OK(G.ctx, G.clb.read(G.clb.impl, R(y.cl, 0), h, ny));
        for (i = 0; i < ny; ++i)
            if (h[i] != 7.0f) fail_msg("y[%zu] written by a refused call", i);
        free(h);
    }
    pb_free(&x);
    pb_free(&col);
    pb_free(&y);
    pb_free(&dx);
    pb_free(&small);
}

/* ---------------------------------------------------------------- losses */

static void loss_case(dsgd_loss loss, int m, int c, int want_grad, tu_rng *rng) {
    size_t nt = loss == DSGD_LOSS_MSE ? (size_t)m * c : (size_t)m;
    float *ht = tu_floats(nt + 1), stats0[4] = {1.5f, 2.0f, 0.0f, 0.0f}, sc[4], sl[4];
    pbuf pred = pb_rand((size_t)m * c + 1, rng, -5, 5), tgt, dpred, stats;
    float gs = 1.0f / (float)m;
    double stol = G.fp64 ? 1e-6 : 1e-4, dtol = (G.fp64 ? 1e-6 : 1e-4) * gs;
    size_t i;
    char what[64];
    ht[0] = 0.0f;
    for (i = 0; i < nt; ++i)
        ht[i + 1] = loss == DSGD_LOSS_MSE ? tu_uniform(rng, -2, 2) : (float)tu_below(rng, (size_t)c);
    tgt = pb_make(nt + 1, ht);
    dpred = pb_rand((size_t)m * c + 2, rng, -1, 1);
    stats = pb_make(4, stats0);
    TU_OK(G.ctx, G.clb.loss(G.clb.impl, loss, m, c, R(pred.cl, 1), R(tgt.cl, 1), gs,
                            want_grad ? R(dpred.cl, 2) : NOREF(), R(stats.cl, 1)));
    TU_OK(G.ctx, G.cpu.loss(G.cpu.impl, loss, m, c, R(pred.cpu, 1), R(tgt.cpu, 1), gs,
                            want_grad ? R(dpred.cpu, 2) : NOREF(), R(stats.cpu, 1)));
    snprintf(what, sizeof what, "loss %d m %d c %d dpred", (int)loss, m, c);
    pb_expect(&dpred, dtol, 0, what);
    TU_OK(G.ctx, G.cpu.read(G.cpu.impl, R(stats.cpu, 0), sc, 4));
    TU_OK(G.ctx, G.clb.read(G.clb.impl, R(stats.cl, 0), sl, 4));
    assert_true(sc[0] == sl[0] && sc[3] == sl[3]); /* outside the range: untouched */
    TU_NEAR(sl[1], sc[1], stol * fabs(sc[1]));
    assert_true(sl[2] == sc[2]); /* correct count: an exact small integer */
    if (c > 1 || loss == DSGD_LOSS_MSE) assert_true(sc[1] > stats0[1]); /* losses were added (one class: 0) */
    free(ht);
    pb_free(&pred);
    pb_free(&tgt);
    pb_free(&dpred);
    pb_free(&stats);
}

static void test_loss_softmax_xent(void **state) {
    static const int shapes[][2] = {{1, 1}, {1, 10}, {37, 10}, {300, 37}, {257, 3}};
    tu_rng rng = tu_rng_make(18);
    int s;
    (void)state;
    NEED_CL();
    for (s = 0; s < 5; ++s) {
        loss_case(DSGD_LOSS_SOFTMAX_XENT, shapes[s][0], shapes[s][1], 1, &rng);
        loss_case(DSGD_LOSS_SOFTMAX_XENT, shapes[s][0], shapes[s][1], 0, &rng);
    }
}

static void test_loss_mse(void **state) {
    static const int shapes[][2] = {{1, 1}, {37, 10}, {300, 37}, {257, 3}};
    tu_rng rng = tu_rng_make(19);
    int s;
    (void)state;
    NEED_CL();
    for (s = 0; s < 4; ++s) {
        loss_case(DSGD_LOSS_MSE, shapes[s][0], shapes[s][1], 1, &rng);
        loss_case(DSGD_LOSS_MSE, shapes[s][0], shapes[s][1], 0, &rng);
    }
}

static void test_loss_bad_class(void **state) {
    static const float bad[] = {10.0f, -1.0f, 2.5f, NAN};
    tu_rng rng = tu_rng_make(20);
    float st[2] = {3.0f, 4.0f}, got[2];
    size_t b;
    (void)state;
    NEED_CL();
    for (b = 0; b < sizeof bad / sizeof bad[0]; ++b) {
        float ht[40];
        pbuf pred = pb_rand(40 * 10, &rng, -1, 1), tgt, stats = pb_make(2, st);
        int i;
        for (i = 0; i < 40; ++i) ht[i] = (float)(i % 10);
        ht[17] = bad[b];
        tgt = pb_make(40, ht);
        /* the check's answer comes back without waiting: the loss returns,
           the next call that waits (here finish, or a read, a map, the next
           loss) reports it with the class, the sample and the loss's shape */
        TU_OK(G.ctx, G.clb.loss(G.clb.impl, DSGD_LOSS_SOFTMAX_XENT, 40, 10, R(pred.cl, 0), R(tgt.cl, 0), 1.0f,
                                NOREF(), R(stats.cl, 0)));
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.finish(G.clb.impl));
        EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "of sample 17 is not an integer in [0, 10)");
        EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "(1 bad sample of 40;");
        {
            char cls[32];
            snprintf(cls, sizeof cls, "class %g of", (double)bad[b]);
            EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), cls);
        }
        TU_OK(G.ctx, G.clb.finish(G.clb.impl)); /* reported once */
        /* or by the next loss, once the answer is in (a clFinish of the
           backend's queue behind its back), before that loss does anything */
        TU_OK(G.ctx, G.clb.loss(G.clb.impl, DSGD_LOSS_SOFTMAX_XENT, 40, 10, R(pred.cl, 0), R(tgt.cl, 0), 1.0f,
                                NOREF(), R(stats.cl, 0)));
        assert_int_equal(clFinish(dsgd_cl_backend_queue(&G.clb)), CL_SUCCESS);
        TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT,
               G.clb.loss(G.clb.impl, DSGD_LOSS_MSE, 4, 10, R(pred.cl, 0), R(pred.cl, 40), 1.0f, NOREF(),
                          R(stats.cl, 0)));
        EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "of sample 17 is not an integer in [0, 10)");
        TU_OK(G.ctx, G.clb.read(G.clb.impl, R(stats.cl, 0), got, 2));
        assert_true(got[0] == st[0] && got[1] == st[1]); /* stats unchanged */
        pb_free(&pred);
        pb_free(&tgt);
        pb_free(&stats);
    }
}

/* ---------------------------------------------------------------- optimizers */

static void test_optimizer_update(void **state) {
    static const size_t sizes[] = {1, 1000, 4099};
    tu_rng rng = tu_rng_make(21);
    size_t s;
    int kind, nesterov, step;
    (void)state;
    NEED_CL();
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        size_t n = sizes[s];
        for (kind = DSGD_OPT_SGD; kind <= DSGD_OPT_ADAMW; ++kind) {
            for (nesterov = 0; nesterov <= (kind == DSGD_OPT_MOMENTUM); ++nesterov) {
                pbuf p = pb_rand(n + 1, &rng, -1, 1), g = pb_rand(n + 2, &rng, -1, 1);
                pbuf m1 = pb_make(n + 3, NULL), m2 = pb_make(n, NULL);
                int needs1 = kind != DSGD_OPT_SGD, needs2 = kind >= DSGD_OPT_ADAM;
                char what[64];
                for (step = 1; step <= 3; ++step) {
                    dsgd_opt_update u;
                    memset(&u, 0, sizeof u);
                    u.kind = (dsgd_optimizer_kind)kind;
                    u.lr = 0.01f * (float)step;
                    u.momentum = 0.9f;
                    u.nesterov = nesterov;
                    u.beta1 = 0.9f;
                    u.beta2 = 0.999f;
                    u.eps = 1e-8f;
                    u.weight_decay = 0.01f;
                    u.bias_correction1 = 1.0f - powf(0.9f, (float)step);
                    u.bias_correction2 = 1.0f - powf(0.999f, (float)step);
                    u.grad_scale = 0.5f;
                    TU_OK(G.ctx, G.clb.optimizer_update(G.clb.impl, &u, R(p.cl, 1), R(g.cl, 2),
                                                        needs1 ? R(m1.cl, 3) : NOREF(), needs2 ? R(m2.cl, 0) : NOREF(),
                                                        n));
                    TU_OK(G.ctx, G.cpu.optimizer_update(G.cpu.impl, &u, R(p.cpu, 1), R(g.cpu, 2),
                                                        needs1 ? R(m1.cpu, 3) : NOREF(),
                                                        needs2 ? R(m2.cpu, 0) : NOREF(), n));
                }
                /* SGD and momentum only add and multiply; Adam and AdamW
                   also divide and take a square root */
                snprintf(what, sizeof what, "optimizer kind %d nesterov %d n %zu", kind, nesterov, n);
                pb_expect_fp(&p, kind >= DSGD_OPT_ADAM ? FP_DIVSQRT : FP_ARITH, what);
                pb_expect_fp(&m1, FP_ARITH, "m1");
                pb_expect_fp(&m2, FP_ARITH, "m2");
                pb_free(&p);
                pb_free(&g);
                pb_free(&m1);
                pb_free(&m2);
            }
        }
    }
}

static void test_norm_check(void **state) {
    static const size_t sizes[] = {1, 1000, 4097, 100003};
    tu_rng rng = tu_rng_make(22);
    size_t s;
    (void)state;
    NEED_CL();
    for (s = 0; s < sizeof sizes / sizeof sizes[0]; ++s) {
        size_t n = sizes[s], bad_cpu = 0, bad_cl = 0, i, k;
        float *h = tu_floats(n + 5);
        double ss_cpu = 0, ss_cl = 0;
        pbuf x;
        tu_fill(&rng, h, n + 5, -3, 3);
        for (k = 0; k < 3 && n > 10; ++k) h[5 + tu_below(&rng, n)] = k == 0 ? NAN : (k == 1 ? INFINITY : -INFINITY);
        x = pb_make(n + 5, h);
        TU_OK(G.ctx, G.clb.norm_check(G.clb.impl, R(x.cl, 5), n, &ss_cl, &bad_cl));
        TU_OK(G.ctx, G.cpu.norm_check(G.cpu.impl, R(x.cpu, 5), n, &ss_cpu, &bad_cpu));
        assert_int_equal(bad_cl, bad_cpu);
        TU_NEAR(ss_cl, ss_cpu, (G.fp64 ? 1e-12 : 1e-5) * ss_cpu);
        /* deterministic: the same bits again */
        {
            double again = 0;
            size_t bad2 = 0;
            TU_OK(G.ctx, G.clb.norm_check(G.clb.impl, R(x.cl, 5), n, &again, &bad2));
            assert_true(memcmp(&again, &ss_cl, sizeof again) == 0);
        }
        for (i = 0; i < 1; ++i) (void)i;
        free(h);
        pb_free(&x);
    }
}

/* ---------------------------------------------------------------- mapping, queues */

static void test_map_unmap(void **state) {
    tu_rng rng = tu_rng_make(23);
    dsgd_buffer *buf;
    float *p, h[300], got[300];
    size_t i;
    (void)state;
    NEED_CL();
    assert_true(dsgd_cl_is_backend(&G.clb));
    assert_false(dsgd_cl_is_backend(&G.cpu));
    assert_non_null(dsgd_cl_backend_queue(&G.clb));
    assert_null(dsgd_cl_backend_queue(&G.cpu));
    TU_OK(G.ctx, G.clb.buffer_create(G.clb.impl, 300, &buf));
    assert_non_null(dsgd_cl_buffer_mem(buf));
    {
        dsgd_buffer *cpu_buf;
        TU_OK(G.ctx, G.cpu.buffer_create(G.cpu.impl, 4, &cpu_buf));
        assert_null(dsgd_cl_buffer_mem(cpu_buf)); /* another backend's buffer */
        G.cpu.buffer_destroy(G.cpu.impl, cpu_buf);
    }
    tu_fill(&rng, h, 300, -1, 1);
    /* the host writes through a mapping; kernels see it after unmap */
    TU_OK(G.ctx, dsgd_cl_map(&G.clb, R(buf, 50), 200, DSGD_CL_MAP_WRITE, &p));
    for (i = 0; i < 200; ++i) p[i] = h[i];
    TU_OK(G.ctx, dsgd_cl_unmap(&G.clb, R(buf, 50), p));
    TU_OK(G.ctx, G.clb.scale(G.clb.impl, R(buf, 50), 2.0f, 200));
    /* and reads a kernel's result through one */
    TU_OK(G.ctx, dsgd_cl_map(&G.clb, R(buf, 0), 300, DSGD_CL_MAP_READ, &p));
    for (i = 0; i < 300; ++i) got[i] = p[i];
    TU_OK(G.ctx, dsgd_cl_unmap(&G.clb, R(buf, 0), p));
    for (i = 0; i < 300; ++i) assert_true(got[i] == (i >= 50 && i < 250 ? 2.0f * h[i - 50] : 0.0f));
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cl_map(&G.clb, R(buf, 200), 101, DSGD_CL_MAP_READ, &p));
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cl_map(&G.clb, R(buf, 0), 1, 0, &p));
    assert_int_equal(dsgd_cl_map(&G.cpu, R(buf, 0), 1, DSGD_CL_MAP_READ, &p), DSGD_ERR_INVALID_ARGUMENT);
    G.clb.buffer_destroy(G.clb.impl, buf);
}

/* The vtable's map/unmap (what the strategies use) and the device-side
   reduction across buffers: sum_across against a serial float sum in index
   order, bit for bit, for 3 and 11 buffers (11: two launches of up to 8),
   on a sub-range, with the entries outside [lo, hi) untouched. */
static void test_map_and_sum_across(void **state) {
    enum { NB = 11, CNT = 1037, OFF = 5, LO = 3, HI = 1001 };
    tu_rng rng = tu_rng_make(29);
    dsgd_buffer *bufs[NB];
    dsgd_ref refs[NB];
    static float h[NB][CNT];
    float got[CNT], *p;
    int nb, j;
    size_t i;
    const int exact = fp_bit_exact(G.fp_config, FP_ARITH); /* float adds */
    (void)state;
    NEED_CL();
    assert_non_null(G.clb.map);
    assert_non_null(G.clb.unmap);
    assert_true(G.clb.can_access(G.clb.impl, &G.clb));
    assert_false(G.clb.can_access(G.clb.impl, &G.cpu));
    assert_null(G.cpu.sum_across);
    /* another backend on the same device: reachable both ways (two devices:
       test_cl_devices.c) */
    {
        dsgd_cl_backend_desc bd;
        dsgd_backend_i other;
        memset(&bd, 0, sizeof bd);
        bd.device = dsgd_cl_context_num_devices(G.cl) - 1;
        TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, G.cl, &bd, &other));
        assert_int_equal(G.clb.can_access(G.clb.impl, &other), bd.device == 0);
        assert_int_equal(other.can_access(other.impl, &G.clb), bd.device == 0);
        assert_true(other.can_access(other.impl, &other));
        assert_non_null(
            strstr(other.device_name(other.impl), dsgd_cl_context_device_info(G.cl, bd.device)->device_name));
        other.destroy(other.impl);
    }
    for (j = 0; j < NB; ++j) {
        TU_OK(G.ctx, G.clb.buffer_create(G.clb.impl, OFF + CNT, &bufs[j]));
        refs[j] = R(bufs[j], OFF);
    }
    for (nb = 3; nb <= NB; nb += NB - 3) {
        for (j = 0; j < nb; ++j) {
            tu_fill(&rng, h[j], CNT, -1, 1);
            /* written through the vtable's mapping */
            TU_OK(G.ctx, G.clb.map(G.clb.impl, refs[j], CNT, &p));
            memcpy(p, h[j], sizeof h[j]);
            TU_OK(G.ctx, G.clb.unmap(G.clb.impl, refs[j], p));
        }
        TU_OK(G.ctx, G.clb.sum_across(G.clb.impl, refs, nb, LO, HI));
        for (j = 0; j < nb; ++j) {
            TU_OK(G.ctx, G.clb.read(G.clb.impl, refs[j], got, CNT));
            for (i = 0; i < CNT; ++i) {
                float want = h[j][i];
                if (i >= LO && i < HI) {
                    int k;
                    want = h[0][i];
                    for (k = 1; k < nb; ++k) want = want + h[k][i];
                }
                if (exact ? memcmp(&got[i], &want, sizeof want) != 0
                          : !(fabs((double)got[i] - want) <= TOL_ABS + TOL_REL * fabs((double)want)))
                    fail_msg("%d buffers: buffer %d entry %zu is %.9g, want %.9g (%s)", nb, j, i, (double)got[i],
                             (double)want, exact ? "bit for bit" : "within the tolerance");
            }
        }
    }
    /* bad ranges and buffers */
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.sum_across(G.clb.impl, refs, 2, 0, CNT + 1));
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.sum_across(G.clb.impl, refs, 2, 9, 8));
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.sum_across(G.clb.impl, refs, 0, 0, 1));
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, G.clb.map(G.clb.impl, refs[0], CNT + 1, &p));
    for (j = 0; j < NB; ++j) G.clb.buffer_destroy(G.clb.impl, bufs[j]);
}

/* Two backends (two queues) on one context, as two replicas on one device. */
static void test_backends_share_context(void **state) {
    dsgd_backend_i b2;
    dsgd_cl_backend_desc bd;
    dsgd_ctx *ctx2 = tu_ctx();
    dsgd_buffer *x1, *x2;
    float h[1000], g1[1000], g2[1000];
    size_t i;
    (void)state;
    if (!G.have_cl) {
        dsgd_ctx_destroy(ctx2);
        skip();
    }
    tu_watchdog_for("test_cl_backend", CL_WATCHDOG_S);
    memset(&bd, 0, sizeof bd);
    bd.device = dsgd_cl_context_num_devices(G.cl); /* one past the end */
    TU_ERR(ctx2, DSGD_ERR_INVALID_ARGUMENT, dsgd_cl_backend_create(ctx2, G.cl, &bd, &b2));
    EXPECT_SUBSTR(dsgd_ctx_last_error(ctx2), "outside the context");
    bd.device = 1 % dsgd_cl_context_num_devices(G.cl); /* round-robin placement of replica 1 */
    TU_OK(ctx2, dsgd_cl_backend_create(ctx2, G.cl, &bd, &b2));
    /* AUTO: one queue per device on PoCL's pthread driver (see QUEUES), one
       per backend elsewhere; PoCL's basic driver deadlocks on a shared one */
    {
        const dsgd_cl_device_info *d0 = dsgd_cl_context_device_info(G.cl, 0);
        int pthread_drv;
        assert_non_null(d0);
        pthread_drv = strstr(d0->platform_name, "Portable Computing Language") != NULL &&
                      strncmp(d0->device_name, "pthread-", 8) == 0;
        assert_int_equal(dsgd_cl_context_queues(G.cl),
                         pthread_drv ? DSGD_CL_QUEUES_PER_DEVICE : DSGD_CL_QUEUES_PER_BACKEND);
        if (strncmp(d0->device_name, "basic-", 6) == 0)
            assert_int_equal(dsgd_cl_context_queues(G.cl), DSGD_CL_QUEUES_PER_BACKEND);
    }
    assert_int_equal(dsgd_cl_backend_queue(&b2) == dsgd_cl_backend_queue(&G.clb),
                     dsgd_cl_context_queues(G.cl) == DSGD_CL_QUEUES_PER_DEVICE && bd.device == 0);
    assert_true(dsgd_cl_backend_context(&b2) == G.cl);
    for (i = 0; i < 1000; ++i) h[i] = (float)i;
    TU_OK(G.ctx, G.clb.buffer_create(G.clb.impl, 1000, &x1));
    TU_OK(ctx2, b2.buffer_create(b2.impl, 1000, &x2));
    TU_OK(G.ctx, G.clb.write(G.clb.impl, R(x1, 0), h, 1000));
    TU_OK(ctx2, b2.write(b2.impl, R(x2, 0), h, 1000));
    for (i = 0; i < 5; ++i) {
        TU_OK(G.ctx, G.clb.scale(G.clb.impl, R(x1, 0), 2.0f, 1000));
        TU_OK(ctx2, b2.axpy(b2.impl, R(x2, 0), 1.0f, R(x2, 0), 1000));
    }
    TU_OK(G.ctx, G.clb.read(G.clb.impl, R(x1, 0), g1, 1000));
    TU_OK(ctx2, b2.read(b2.impl, R(x2, 0), g2, 1000));
    for (i = 0; i < 1000; ++i) {
        assert_true(g1[i] == 32.0f * h[i]);
        assert_true(g2[i] == 32.0f * h[i]);
    }
    G.clb.buffer_destroy(G.clb.impl, x1);
    b2.buffer_destroy(b2.impl, x2);
    b2.destroy(b2.impl);
    dsgd_ctx_destroy(ctx2);
}

/* AUTO's rule over made-up device descriptions (no device needed): a
   shared queue for PoCL's pthread driver (and its PoCL 4 name, cpu), a
   queue per backend for PoCL's basic driver, whose shared queue deadlocks
   with replicas on threads, and for every other platform. */
static void test_auto_queues_rule(void **state) {
    static const struct {
        const char *platform, *device;
        dsgd_cl_queues want;
    } cases[] = {
        {"Portable Computing Language", "pthread-skylake-avx512-AMD EPYC", DSGD_CL_QUEUES_PER_DEVICE},
        {"Portable Computing Language", "cpu-haswell-Intel(R) Core(TM) i7", DSGD_CL_QUEUES_PER_DEVICE},
        {"Portable Computing Language", "basic-skylake-avx512-AMD EPYC", DSGD_CL_QUEUES_PER_BACKEND},
        {"Portable Computing Language", "basic-pthread-lookalike", DSGD_CL_QUEUES_PER_BACKEND},
        {"Portable Computing Language", "NVIDIA GeForce RTX 3080", DSGD_CL_QUEUES_PER_BACKEND},
        {"NVIDIA CUDA", "pthread-named GPU", DSGD_CL_QUEUES_PER_BACKEND},
        {"AMD Accelerated Parallel Processing", "gfx1030", DSGD_CL_QUEUES_PER_BACKEND},
    };
    dsgd_cl_device_info info;
    size_t i;
    (void)state;
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
        memset(&info, 0, sizeof info);
        snprintf(info.platform_name, sizeof info.platform_name, "%s", cases[i].platform);
        snprintf(info.device_name, sizeof info.device_name, "%s", cases[i].device);
        if (dsgd_cl_auto_queues(&info) != cases[i].want)
            fail_msg("%s / %s: AUTO gave %d, want %d", cases[i].platform, cases[i].device,
                     (int)dsgd_cl_auto_queues(&info), (int)cases[i].want);
    }
    assert_int_equal(dsgd_cl_auto_queues(NULL), DSGD_CL_QUEUES_PER_BACKEND);
}

/* The default device's rule over made-up device lists (no device needed):
   a discrete GPU before an integrated one listed first, then more compute
   units, then a higher clock, then list order; with no GPU the first
   device of any type. */
typedef struct default_dev {
    dsgd_cl_device_type type;
    int unified;
    unsigned cu, mhz;
} default_dev;

static int pick_default(const default_dev *d, int n) {
    dsgd_cl_device_info info[8];
    int i;
    assert_true(n <= 8);
    for (i = 0; i < n; ++i) {
        memset(&info[i], 0, sizeof info[i]);
        info[i].index = i;
        info[i].type = d[i].type;
        info[i].unified_memory = d[i].unified;
        info[i].compute_units = d[i].cu;
        info[i].max_clock_mhz = d[i].mhz;
    }
    return dsgd_cl_default_device(info, n);
}

static void test_default_device_rule(void **state) {
    /* an integrated GPU listed first (even with more compute units), a discrete one second */
    static const default_dev igpu_first[] = {{DSGD_CL_DEVICE_GPU, 1, 96, 1300}, {DSGD_CL_DEVICE_GPU, 0, 40, 1700}};
    /* two discrete GPUs: the one with more compute units, wherever it is */
    static const default_dev two_discrete[] = {
        {DSGD_CL_DEVICE_CPU, 1, 64, 3000}, {DSGD_CL_DEVICE_GPU, 0, 28, 1900}, {DSGD_CL_DEVICE_GPU, 0, 82, 1700}};
    /* equal compute units: the higher clock; equal clock too: the first */
    static const default_dev clock_tie[] = {{DSGD_CL_DEVICE_GPU, 0, 60, 1500}, {DSGD_CL_DEVICE_GPU, 0, 60, 1800}};
    static const default_dev full_tie[] = {
        {DSGD_CL_DEVICE_GPU, 1, 24, 1100}, {DSGD_CL_DEVICE_GPU, 0, 60, 1800}, {DSGD_CL_DEVICE_GPU, 0, 60, 1800}};
    /* only CPUs: the first, whatever its compute units */
    static const default_dev cpus[] = {{DSGD_CL_DEVICE_CPU, 1, 4, 2000}, {DSGD_CL_DEVICE_CPU, 1, 64, 3500}};
    /* accelerators and CPUs, no GPU: the first device of any type */
    static const default_dev no_gpu[] = {
        {DSGD_CL_DEVICE_ACCELERATOR, 0, 8, 500}, {DSGD_CL_DEVICE_CPU, 1, 64, 3500}, {DSGD_CL_DEVICE_ACCELERATOR, 0, 80, 900}};
    /* a mix: an integrated GPU is still a GPU, ahead of accelerators and CPUs */
    static const default_dev mix[] = {{DSGD_CL_DEVICE_ACCELERATOR, 0, 80, 900},
                                      {DSGD_CL_DEVICE_CPU, 1, 64, 3500},
                                      {DSGD_CL_DEVICE_GPU, 1, 24, 1100},
                                      {DSGD_CL_DEVICE_ALL, 0, 99, 9999}};
    /* an accelerator, an integrated GPU, then two discrete GPUs */
    static const default_dev mix2[] = {{DSGD_CL_DEVICE_ACCELERATOR, 0, 80, 900},
                                       {DSGD_CL_DEVICE_GPU, 1, 96, 1300},
                                       {DSGD_CL_DEVICE_GPU, 0, 20, 1500},
                                       {DSGD_CL_DEVICE_GPU, 0, 36, 1400}};
    dsgd_cl_device_info one;
    (void)state;
    assert_int_equal(pick_default(igpu_first, 2), 1);
    assert_int_equal(pick_default(two_discrete, 3), 2);
    assert_int_equal(pick_default(clock_tie, 2), 1);
    assert_int_equal(pick_default(full_tie, 3), 1);
    assert_int_equal(pick_default(cpus, 2), 0);
    assert_int_equal(pick_default(no_gpu, 3), 0);
    assert_int_equal(pick_default(mix, 4), 2);
    assert_int_equal(pick_default(mix2, 4), 3);
    /* the list's prefix: without the last discrete GPU, the other one */
    assert_int_equal(pick_default(mix2, 3), 2);
    /* without the discrete GPUs, the integrated one */
    assert_int_equal(pick_default(mix2, 2), 1);
    memset(&one, 0, sizeof one);
    one.type = DSGD_CL_DEVICE_CPU;
    assert_int_equal(dsgd_cl_default_device(&one, 1), 0);
    assert_int_equal(dsgd_cl_default_device(&one, 0), -1);
    assert_int_equal(dsgd_cl_default_device(NULL, 3), -1);
}

/* The queue policy asked for explicitly: PER_BACKEND gives two backends on
   one device two queues, PER_DEVICE one, shared, and a backend that asks
   for profiling always gets its own. Work on a shared queue from either
   backend completes (destroying one backend leaves the other's queue). */
static void test_queue_policies(void **state) {
    dsgd_cl_context_desc cd;
    dsgd_cl_context *c;
    dsgd_backend_i b1, b2, bp;
    dsgd_cl_backend_desc prof;
    dsgd_buffer *x;
    float h[64], got[64];
    int mode, i;
    (void)state;
    NEED_CL();
    memset(&prof, 0, sizeof prof);
    prof.profiling = 1;
    for (i = 0; i < 64; ++i) h[i] = (float)i;
    for (mode = DSGD_CL_QUEUES_PER_BACKEND; mode <= DSGD_CL_QUEUES_PER_DEVICE; ++mode) {
        memset(&cd, 0, sizeof cd);
        cd.tuning = DSGD_CL_TUNING_OFF;
        cd.queues = (dsgd_cl_queues)mode;
        TU_OK(G.ctx, dsgd_cl_context_create(G.ctx, &cd, &c));
        assert_int_equal(dsgd_cl_context_queues(c), mode);
        TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, c, NULL, &b1));
        TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, c, NULL, &b2));
        TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, c, &prof, &bp));
        assert_int_equal(dsgd_cl_backend_queue(&b1) == dsgd_cl_backend_queue(&b2), mode == DSGD_CL_QUEUES_PER_DEVICE);
        assert_true(dsgd_cl_backend_queue(&bp) != dsgd_cl_backend_queue(&b1));
        b1.destroy(b1.impl);
        TU_OK(G.ctx, b2.buffer_create(b2.impl, 64, &x));
        TU_OK(G.ctx, b2.write(b2.impl, R(x, 0), h, 64));
        TU_OK(G.ctx, b2.scale(b2.impl, R(x, 0), 3.0f, 64));
        TU_OK(G.ctx, b2.read(b2.impl, R(x, 0), got, 64));
        for (i = 0; i < 64; ++i) assert_true(got[i] == 3.0f * h[i]);
        b2.buffer_destroy(b2.impl, x);
        b2.destroy(b2.impl);
        bp.destroy(bp.impl);
        dsgd_cl_context_destroy(c);
    }
}

/* ---------------------------------------------------------------- training */

/* Trains the same model on the CPU backend and on OpenCL for 20 steps and
   compares every weight: |cl - cpu| <= 1e-4 * max(|cpu|, mean |cpu|). */
static void train_pair(const dsgd_layer_desc *layers, int nl, dsgd_loss loss, const dsgd_optimizer_desc *od,
                       int batch) {
    enum { IN = 20, STEPS = 20 };
    dsgd_model_desc md;
    dsgd_model *mc = NULL, *ml = NULL;
    dsgd_optimizer *oc = NULL, *ol = NULL;
    dsgd_metrics tc, tl;
    tu_rng rng = tu_rng_make(24);
    int out = layers[nl - 1].units, tdim = loss == DSGD_LOSS_MSE ? out : 1, step, i;
    float *x = tu_floats((size_t)batch * IN), *y = tu_floats((size_t)batch * tdim), *pc, *pl;
    size_t np, k;
    double mean = 0, worst = 0;
    memset(&md, 0, sizeof md);
    md.input_dim = IN;
    md.layers = layers;
    md.num_layers = nl;
    md.loss = loss;
    md.max_batch = batch;
    md.seed = 42;
    md.backend = &G.cpu;
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &md, &mc));
    md.backend = &G.clb;
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &md, &ml));
    TU_OK(G.ctx, dsgd_optimizer_create(mc, od, &oc));
    TU_OK(G.ctx, dsgd_optimizer_create(ml, od, &ol));
    np = dsgd_model_num_params(mc);
    assert_int_equal(np, dsgd_model_num_params(ml));
    for (step = 0; step < STEPS; ++step) {
        tu_fill(&rng, x, (size_t)batch * IN, -1, 1);
        for (i = 0; i < batch; ++i) {
            if (loss == DSGD_LOSS_MSE) {
                int j;
                for (j = 0; j < out; ++j) y[i * out + j] = 0.5f * x[i * IN + j] - 0.25f * x[i * IN + j + 1];
            } else {
                y[i] = (float)((x[i * IN] > 0) + 2 * (x[i * IN + 1] > 0)) * (float)(out > 3) +
                       (float)(out <= 3 ? (x[i * IN] > 0) : 0);
            }
        }
        TU_OK(G.ctx, dsgd_model_compute_gradients(mc, x, y, batch, 1.0f / batch));
        TU_OK(G.ctx, dsgd_model_compute_gradients(ml, x, y, batch, 1.0f / batch));
        TU_OK(G.ctx, dsgd_optimizer_step(oc));
        TU_OK(G.ctx, dsgd_optimizer_step(ol));
    }
    pc = tu_floats(np);
    pl = tu_floats(np);
    TU_OK(G.ctx, dsgd_model_get_params(mc, pc, np));
    TU_OK(G.ctx, dsgd_model_get_params(ml, pl, np));
    for (k = 0; k < np; ++k) mean += fabs(pc[k]) / (double)np;
    for (k = 0; k < np; ++k) {
        double scale = fabs(pc[k]) > mean ? fabs(pc[k]) : mean, e = fabs((double)pl[k] - pc[k]) / scale;
        if (!(e <= 1e-4)) fail_msg("weight %zu after %d steps: opencl %.9g, cpu %.9g (rel %.3g)", k, STEPS, pl[k], pc[k], e);
        if (e > worst) worst = e;
    }
    /* the weights moved, so the comparison means something */
    {
        dsgd_model *m0 = NULL;
        float *p0 = tu_floats(np);
        double moved = 0;
        md.backend = &G.cpu;
        TU_OK(G.ctx, dsgd_model_create(G.ctx, &md, &m0));
        TU_OK(G.ctx, dsgd_model_get_params(m0, p0, np));
        for (k = 0; k < np; ++k) moved += fabs((double)p0[k] - pc[k]);
        assert_true(moved / (double)np > 1e-3);
        dsgd_model_destroy(m0);
        free(p0);
    }
    TU_OK(G.ctx, dsgd_model_take_metrics(mc, DSGD_METRICS_TRAIN, &tc));
    TU_OK(G.ctx, dsgd_model_take_metrics(ml, DSGD_METRICS_TRAIN, &tl));
    TU_NEAR(tl.loss_sum, tc.loss_sum, 1e-4 * tc.loss_sum);
    TU_NEAR(tl.count, tc.count, 0);
    print_message("    %d steps: worst relative weight difference %.3g over %zu weights\n", STEPS, worst, np);
    free(x);
    free(y);
    free(pc);
    free(pl);
    dsgd_optimizer_destroy(oc);
    dsgd_optimizer_destroy(ol);
    dsgd_model_destroy(mc);
    dsgd_model_destroy(ml);
}

/* A checkpoint moves a model between backends: an OpenCL model's state
   saved and restored into a CPU model (and back) is the same bits. */
static void test_checkpoint_across_backends(void **state) {
    dsgd_layer_desc layers[2] = {{16, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_model *ml = NULL, *mc = NULL, *ml2 = NULL;
    dsgd_optimizer *ol = NULL, *oc = NULL, *ol2 = NULL;
    tu_rng rng = tu_rng_make(8);
    float x[8 * 5], y[8], *a, *b;
    char dir[64], path[128];
    size_t np;
    int step, k, i;
    (void)state;
    NEED_CL();
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/cl.ckpt", dir);
    memset(&md, 0, sizeof md);
    memset(&od, 0, sizeof od);
    md.input_dim = 5;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 8;
    md.seed = 3;
    od.kind = DSGD_OPT_ADAM;
    md.backend = &G.clb;
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &md, &ml));
    TU_OK(G.ctx, dsgd_optimizer_create(ml, &od, &ol));
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &md, &ml2));
    TU_OK(G.ctx, dsgd_optimizer_create(ml2, &od, &ol2));
    md.backend = &G.cpu;
    md.seed = 4; /* other weights, which the restore replaces */
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &md, &mc));
    TU_OK(G.ctx, dsgd_optimizer_create(mc, &od, &oc));
    for (step = 0; step < 5; ++step) {
        tu_fill(&rng, x, sizeof x / sizeof x[0], -1, 1);
        for (i = 0; i < 8; ++i) y[i] = (float)tu_below(&rng, 3);
        TU_OK(G.ctx, dsgd_model_compute_gradients(ml, x, y, 8, 0.125f));
        TU_OK(G.ctx, dsgd_optimizer_step(ol));
    }
    TU_OK(G.ctx, dsgd_model_save(ml, ol, path, NULL));
    TU_OK(G.ctx, dsgd_model_restore(mc, oc, path, NULL));
    assert_int_equal(dsgd_optimizer_steps(oc), 5);
    np = dsgd_model_num_params(ml);
    a = tu_floats(np);
    b = tu_floats(np);
    TU_OK(G.ctx, dsgd_model_get_params(ml, a, np));
    TU_OK(G.ctx, dsgd_model_get_params(mc, b, np));
    assert_memory_equal(a, b, np * sizeof(float));
    for (k = 0; k < 2; ++k) {
        TU_OK(G.ctx, dsgd_optimizer_read_slot(ol, k, 0, np, a));
        TU_OK(G.ctx, dsgd_optimizer_read_slot(oc, k, 0, np, b));
        assert_memory_equal(a, b, np * sizeof(float));
    }
    /* and back: the CPU model's checkpoint into a fresh OpenCL model */
    TU_OK(G.ctx, dsgd_model_save(mc, oc, path, NULL));
    TU_OK(G.ctx, dsgd_model_restore(ml2, ol2, path, NULL));
    TU_OK(G.ctx, dsgd_model_get_params(ml2, a, np));
    TU_OK(G.ctx, dsgd_model_get_params(mc, b, np));
    assert_memory_equal(a, b, np * sizeof(float));
    unlink(path);
    rmdir(dir);
    free(a);
    free(b);
    dsgd_optimizer_destroy(ol);
    dsgd_optimizer_destroy(ol2);
    dsgd_optimizer_destroy(oc);
    dsgd_model_destroy(ml);
    dsgd_model_destroy(ml2);
    dsgd_model_destroy(mc);
}

static void test_train_20_steps_xent_adam(void **state) {
    dsgd_layer_desc layers[3] = {{48, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {32, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                 {4, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_optimizer_desc od;
    (void)state;
    NEED_CL();
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    od.lr = 0.01f;
    od.weight_decay = 1e-4f;
    train_pair(layers, 3, DSGD_LOSS_SOFTMAX_XENT, &od, 37);
}

static void test_train_20_steps_mse_momentum_clip(void **state) {
    dsgd_layer_desc layers[2] = {{300, DSGD_ACT_SIGMOID, DSGD_INIT_AUTO}, {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_optimizer_desc od;
    (void)state;
    NEED_CL();
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_MOMENTUM;
    od.nesterov = 1;
    od.lr = 0.05f;
    od.clip_norm = 0.5f; /* exercises norm_check every step */
    train_pair(layers, 2, DSGD_LOSS_MSE, &od, 64);
}

/* Replicas on threads: each thread has its own dsgd_ctx and backend (own
   queue) on the shared context and trains the same model on the same data;
   every replica must end with the same weights, bit for bit (the kernels and
   CLBlast are deterministic, and sharing a context must not mix them up). */
typedef struct replica {
    dsgd_cl_context *cl;
    int device;
    float *params;
    size_t np;
    dsgd_result r;
    char err[1100];
} replica;

static void *replica_main(void *arg) {
    replica *rep = (replica *)arg;
    dsgd_layer_desc layers[2] = {{64, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {5, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_cl_backend_desc bd;
    dsgd_backend_i be;
    dsgd_ctx *ctx = NULL;
    dsgd_model *m = NULL;
    dsgd_optimizer *opt = NULL;
    tu_rng rng = tu_rng_make(26);
    float x[40 * 30], y[40];
    int step, i;
    memset(&be, 0, sizeof be);
    rep->r = dsgd_ctx_create(NULL, &ctx);
    if (rep->r != DSGD_OK) return NULL;
    memset(&bd, 0, sizeof bd);
    bd.device = rep->device;
    memset(&md, 0, sizeof md);
    md.input_dim = 30;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 40;
    md.seed = 5;
    md.backend = &be;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAMW;
    od.lr = 0.01f;
    od.weight_decay = 0.01f;
    if ((rep->r = dsgd_cl_backend_create(ctx, rep->cl, &bd, &be)) == DSGD_OK &&
        (rep->r = dsgd_model_create(ctx, &md, &m)) == DSGD_OK &&
        (rep->r = dsgd_optimizer_create(m, &od, &opt)) == DSGD_OK) {
        for (step = 0; step < 10 && rep->r == DSGD_OK; ++step) {
            tu_fill(&rng, x, 40 * 30, -1, 1);
            for (i = 0; i < 40; ++i) y[i] = (float)(i % 5);
            rep->r = dsgd_model_compute_gradients(m, x, y, 40, 1.0f / 40);
            if (rep->r == DSGD_OK) rep->r = dsgd_optimizer_step(opt);
        }
        rep->np = dsgd_model_num_params(m);
        rep->params = (float *)malloc(rep->np * sizeof(float));
        if (rep->r == DSGD_OK && rep->params) rep->r = dsgd_model_get_params(m, rep->params, rep->np);
    }
    if (rep->r != DSGD_OK) snprintf(rep->err, sizeof rep->err, "%s", dsgd_ctx_last_error(ctx));
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(m);
    if (be.destroy) be.destroy(be.impl);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

static void test_replicas_on_threads(void **state) {
    enum { N = 3 };
    replica reps[N];
    pthread_t th[N];
    int i;
    (void)state;
    NEED_CL();
    memset(reps, 0, sizeof reps);
    for (i = 0; i < N; ++i) {
        reps[i].cl = G.cl;
        reps[i].device = i % dsgd_cl_context_num_devices(G.cl); /* round-robin placement */
        assert_int_equal(pthread_create(&th[i], NULL, replica_main, &reps[i]), 0);
    }
    for (i = 0; i < N; ++i) pthread_join(th[i], NULL);
    for (i = 0; i < N; ++i) {
        if (reps[i].r != DSGD_OK) fail_msg("replica %d: %s: %s", i, dsgd_result_string(reps[i].r), reps[i].err);
        assert_non_null(reps[i].params);
    }
    for (i = 1; i < N; ++i) {
        assert_int_equal(reps[i].np, reps[0].np);
        if (memcmp(reps[i].params, reps[0].params, reps[0].np * sizeof(float)) != 0)
            fail_msg("replica %d's weights differ from replica 0's", i);
    }
    for (i = 0; i < N; ++i) free(reps[i].params);
}

/* ---------------------------------------------------------------- errors */

static void test_errors_name_the_call(void **state) {
    dsgd_buffer *buf = NULL;
    dsgd_cl_context_desc cd;
    dsgd_cl_context *c = NULL;
    logcap cap;
    dsgd_ctx *ctx;
    (void)state;
    NEED_CL();
    /* an absurd buffer: the device refuses it, the message names the call */
    TU_ERR(G.ctx, DSGD_ERR_OUT_OF_MEMORY, G.clb.buffer_create(G.clb.impl, (size_t)1 << 42, &buf));
    assert_null(buf);
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "clCreateBuffer(4398046511104 floats): CL_");
    TU_ERR(G.ctx, DSGD_ERR_OUT_OF_MEMORY, G.clb.buffer_create(G.clb.impl, (size_t)-1, &buf));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "overflow");
    /* a kernel build failure carries the build log */
    ctx = cap_ctx(&cap);
    memset(&cd, 0, sizeof cd);
    cd.tuning = DSGD_CL_TUNING_OFF;
    cd.build_options = "-DDSGD_CL_SELFTEST_BUILD_ERROR";
    TU_ERR(ctx, DSGD_ERR_BACKEND, dsgd_cl_context_create(ctx, &cd, &c));
    assert_null(c);
    EXPECT_SUBSTR(dsgd_ctx_last_error(ctx), "clBuildProgram(distsgd kernels");
    EXPECT_SUBSTR(dsgd_ctx_last_error(ctx), "CL_BUILD_PROGRAM_FAILURE (-11)");
    EXPECT_SUBSTR(dsgd_ctx_last_error(ctx), "deliberate build failure");
    assert_true(cap.count[DSGD_LOG_ERROR] >= 2); /* the full log, then the error */
    /* unknown build option: a different OpenCL error, also named */
    cd.build_options = "-no-such-option-xyz";
    assert_true(dsgd_cl_context_create(ctx, &cd, &c) != DSGD_OK);
    EXPECT_SUBSTR(dsgd_ctx_last_error(ctx), "clBuildProgram(");
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- tuning cache */

/* Known-valid Xgemm parameters (found by tools/cl_tune on PoCL). */
static dsgd_cl_gemm_params sample_params(void) {
    /* the kind of set tools/cl_tune picks on PoCL with AVX-512: a 16x16 tile
       per work-item, float16 along M, scalars of B */
    static const size_t x[DSGD_CL_XGEMM_NPARAMS] = {1, 1, 1, 1, 1, 1, 16, 1, 1, 16, 0, 0, 0, 0, 16, 1};
    dsgd_cl_gemm_params p;
    memset(&p, 0, sizeof p);
    p.xgemm_set = 1;
    memcpy(p.xgemm, x, sizeof x);
    p.min_indirect_set = 1;
    p.min_indirect = 64;
    return p;
}

/* A valid set no device can hold: one work-item per group, but two
   1024 x 1024 float tiles in local memory (8 MiB; PoCL offers 1 MiB, GPUs
   32-64 KiB). */
static dsgd_cl_gemm_params huge_local_params(void) {
    static const size_t x[DSGD_CL_XGEMM_NPARAMS] = {0, 1, 1024, 1, 1, 1, 1024, 1, 1, 1024, 1, 1, 0, 0, 1, 1};
    dsgd_cl_gemm_params p;
    memset(&p, 0, sizeof p);
    p.xgemm_set = 1;
    memcpy(p.xgemm, x, sizeof x);
    return p;
}

/* Tuned parameters against made-up device limits (no device needed). */
static void test_gemm_params_fit_limits(void **state) {
    dsgd_cl_device_info big, small, narrow, tiny_local, unknown;
    dsgd_cl_gemm_params tuned = sample_params(), x_only = sample_params(), wide, direct, huge = huge_local_params();
    char why[256];
    (void)state;
    memset(&big, 0, sizeof big);
    big.max_work_group_size = 4096;
    big.max_work_item_sizes[0] = big.max_work_item_sizes[1] = big.max_work_item_sizes[2] = 4096;
    big.local_mem_bytes = 1 << 20;
    small = big; /* PoCL with POCL_MAX_WORK_GROUP_SIZE=64 */
    small.max_work_group_size = 64;
    small.max_work_item_sizes[0] = small.max_work_item_sizes[1] = small.max_work_item_sizes[2] = 64;
    narrow = big; /* 256 per group, but 8 along the second dimension */
    narrow.max_work_group_size = 256;
    narrow.max_work_item_sizes[1] = 8;
    tiny_local = big;
    tiny_local.local_mem_bytes = 16384;
    memset(&unknown, 0, sizeof unknown); /* a driver that answered nothing */
    x_only.min_indirect_set = 0;
    assert_true(dsgd_cl_gemm_params_valid(&tuned));
    assert_true(dsgd_cl_gemm_params_valid(&huge));

    /* the sample set (1 x 1 Xgemm groups, min_indirect 64) fits a big device */
    assert_int_equal(dsgd_cl_gemm_params_fit(&tuned, &big, why, sizeof why), 1);
    assert_string_equal(why, "");
    /* its min_indirect sends GEMMs to CLBlast's 16 x 16 helper kernels:
       256 > 64 */
    assert_int_equal(dsgd_cl_gemm_params_fit(&tuned, &small, why, sizeof why), 0);
    EXPECT_SUBSTR(why, "16 x 16 work-items exceeds the device's 64");
    EXPECT_SUBSTR(why, "indirect");
    assert_int_equal(dsgd_cl_gemm_params_fit(&tuned, &narrow, why, sizeof why), 0);
    EXPECT_SUBSTR(why, "exceeds the device's 4096 x 8 per dimension");
    /* Xgemm alone (1 x 1 work-items, no local memory) fits all of them */
    assert_int_equal(dsgd_cl_gemm_params_fit(&x_only, &small, NULL, 0), 1);
    assert_int_equal(dsgd_cl_gemm_params_fit(&x_only, &narrow, NULL, 0), 1);
    assert_int_equal(dsgd_cl_gemm_params_fit(&x_only, &tiny_local, NULL, 0), 1);

    /* Xgemm work-group MDIMC x NDIMC = 16 x 16 (CLBlast's stock shape) */
    memset(&wide, 0, sizeof wide);
    {
        static const size_t x[DSGD_CL_XGEMM_NPARAMS] = {0, 1, 32, 2, 16, 16, 64, 16, 16, 64, 1, 1, 0, 0, 2, 2};
        wide.xgemm_set = 1;
        memcpy(wide.xgemm, x, sizeof x);
    }
    assert_true(dsgd_cl_gemm_params_valid(&wide));
    assert_int_equal(dsgd_cl_gemm_params_fit(&wide, &big, NULL, 0), 1);
    assert_int_equal(dsgd_cl_gemm_params_fit(&wide, &small, why, sizeof why), 0);
    assert_string_equal(why, "Xgemm's work-group of 16 x 16 work-items exceeds the device's 64");
    /* local memory: SA and SB tiles, 32 x 64 floats each = 16384 bytes */
    assert_int_equal(dsgd_cl_gemm_params_fit(&wide, &tiny_local, NULL, 0), 1);
    tiny_local.local_mem_bytes = 16383;
    assert_int_equal(dsgd_cl_gemm_params_fit(&wide, &tiny_local, why, sizeof why), 0);
    assert_string_equal(why, "Xgemm needs 16384 bytes of local memory, the device has 16383");
    assert_int_equal(dsgd_cl_gemm_params_fit(&huge, &big, why, sizeof why), 0);
    assert_string_equal(why, "Xgemm needs 8388608 bytes of local memory, the device has 1048576");

    /* XgemmDirect: KWID MDIMAD MDIMCD NDIMBD NDIMCD PADA PADB VWMD VWND WGD,
       8 x 16 work-items, 32 x 33 + 32 x 33 floats of local memory */
    memset(&direct, 0, sizeof direct);
    {
        static const size_t d[DSGD_CL_DIRECT_NPARAMS] = {2, 8, 8, 16, 16, 1, 1, 1, 1, 32};
        direct.direct_set = 1;
        memcpy(direct.direct, d, sizeof d);
    }
    assert_true(dsgd_cl_gemm_params_valid(&direct));
    assert_int_equal(dsgd_cl_gemm_params_fit(&direct, &big, NULL, 0), 1);
    assert_int_equal(dsgd_cl_gemm_params_fit(&direct, &small, why, sizeof why), 0);
    assert_string_equal(why, "XgemmDirect's work-group of 8 x 16 work-items exceeds the device's 64");
    tiny_local.local_mem_bytes = 32 * 33 * 2 * 4 - 1;
    assert_int_equal(dsgd_cl_gemm_params_fit(&direct, &tiny_local, why, sizeof why), 0);
    assert_string_equal(why, "XgemmDirect needs 8448 bytes of local memory, the device has 8447");

    /* limits of 0 are unknown: not checked */
    assert_int_equal(dsgd_cl_gemm_params_fit(&huge, &unknown, NULL, 0), 1);
    assert_int_equal(dsgd_cl_gemm_params_fit(&tuned, &unknown, NULL, 0), 1);
    /* a short buffer is truncated, NUL-terminated */
    assert_int_equal(dsgd_cl_gemm_params_fit(&wide, &small, why, 8), 0);
    assert_string_equal(why, "Xgemm's");
    assert_int_equal(dsgd_cl_gemm_params_fit(NULL, &big, NULL, 0), 0);
    assert_int_equal(dsgd_cl_gemm_params_fit(&tuned, NULL, NULL, 0), 0);
}

/* Creates a context with tuning AUTO reading `path`; returns it. */
static dsgd_cl_context *open_with_cache(dsgd_ctx *ctx, const char *path) {
    dsgd_cl_context_desc cd;
    dsgd_cl_context *c = NULL;
    memset(&cd, 0, sizeof cd);
    cd.tune_cache = path;
    TU_OK(ctx, dsgd_cl_context_create(ctx, &cd, &c));
    return c;
}

static void test_tune_cache_path(void **state) {
    char dir[64], path[1100], want[1100];
    const dsgd_cl_device_info *info;
    (void)state;
    NEED_CL();
    tu_mkdtemp(dir);
    info = dsgd_cl_context_device_info(G.cl, 0);
    /* an explicit file is used as is; a directory gets the per-device name */
    TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, "/x/y.txt", path, sizeof path));
    assert_string_equal(path, "/x/y.txt");
    TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, dir, path, sizeof path));
    snprintf(want, sizeof want, "%s/clblast-gemm-", dir);
    assert_true(strncmp(path, want, strlen(want)) == 0);
    assert_non_null(strstr(path, ".txt"));
    (void)info;
    /* the environment is the fallback, the desc wins */
    setenv("DSGD_CL_TUNE_CACHE", "/from/env.txt", 1);
    TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, NULL, path, sizeof path));
    assert_string_equal(path, "/from/env.txt");
    TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, "/from/desc.txt", path, sizeof path));
    assert_string_equal(path, "/from/desc.txt");
    unsetenv("DSGD_CL_TUNE_CACHE");
    setenv("XDG_CACHE_HOME", dir, 1);
    TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, NULL, path, sizeof path));
    snprintf(want, sizeof want, "%s/distsgd/clblast-gemm-", dir);
    assert_true(strncmp(path, want, strlen(want)) == 0);
    unsetenv("XDG_CACHE_HOME");
    assert_int_equal(dsgd_cl_tune_cache_path(G.cl, 0, dir, path, 8), DSGD_ERR_INVALID_ARGUMENT);
    tu_rmdir(dir);
}

static void test_tune_cache_roundtrip_and_corrupt(void **state) {
    static const char *const corrupt[] = {
        "", /* empty */
        "\x01\x02garbage\xff\n",
        "distsgd-clblast-gemm-cache 1\nplatform P\ndevice D\ndriver V\n", /* no end */
        "distsgd-clblast-gemm-cache 1\nplatform P\ndevice D\ndriver V\nXgemm GEMMK=1\nend\n",
        "distsgd-clblast-gemm-cache 1\nplatform P\ndevice D\ndriver V\nsomething else\nend\n",
        "distsgd-clblast-gemm-cache 2\nend\n"};
    char dir[64], path[1100], text[2048];
    dsgd_cl_gemm_params p = sample_params(), q;
    const dsgd_cl_device_info *info;
    size_t i;
    (void)state;
    NEED_CL();
    info = dsgd_cl_context_device_info(G.cl, 0);
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/sub/dir/cache.txt", dir);
    TU_OK(G.ctx, dsgd_cl_save_gemm_params(G.ctx, G.cl, 0, path, &p, "test note"));
    TU_OK(G.ctx, dsgd_cl_load_gemm_params(G.ctx, G.cl, 0, path, &q));
    assert_true(q.xgemm_set && !q.direct_set && q.min_indirect_set && q.min_indirect == 64);
    assert_memory_equal(q.xgemm, p.xgemm, sizeof p.xgemm);
    /* corrupt files: DSGD_ERR_FORMAT naming file and line */
    for (i = 0; i < sizeof corrupt / sizeof corrupt[0]; ++i) {
        char name[32];
        snprintf(name, sizeof name, "bad%zu.txt", i);
        tu_write_file(dir, name, corrupt[i], strlen(corrupt[i]), path, sizeof path);
        TU_ERR(G.ctx, DSGD_ERR_FORMAT, dsgd_cl_load_gemm_params(G.ctx, G.cl, 0, path, &q));
        EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), path);
    }
    /* parameters that break CLBlast's rules (MWG not a multiple of MDIMC*VWM) */
    snprintf(text, sizeof text,
             "distsgd-clblast-gemm-cache 1\nplatform %s\ndevice %s\ndriver %s\n"
             "Xgemm GEMMK=1 KREG=4 KWG=1 KWI=1 MDIMA=1 MDIMC=1 MWG=4 NDIMB=1 NDIMC=1 NWG=4 SA=0 SB=0 STRM=0 STRN=0 "
             "VWM=8 VWN=4\nend\n",
             info->platform_name, info->device_name, info->driver_version);
    tu_write_file(dir, "rules.txt", text, strlen(text), path, sizeof path);
    TU_ERR(G.ctx, DSGD_ERR_FORMAT, dsgd_cl_load_gemm_params(G.ctx, G.cl, 0, path, &q));
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "divisibility");
    /* missing */
    snprintf(path, sizeof path, "%s/none.txt", dir);
    TU_ERR(G.ctx, DSGD_ERR_IO, dsgd_cl_load_gemm_params(G.ctx, G.cl, 0, path, &q));
    /* a FIFO with no writer: an error at once (fopen blocked here forever) */
    snprintf(path, sizeof path, "%s/fifo", dir);
    assert_int_equal(mkfifo(path, 0600), 0);
    tu_watchdog_for("test_cl_backend: opening a FIFO", 10);
    TU_ERR(G.ctx, DSGD_ERR_IO, dsgd_cl_load_gemm_params(G.ctx, G.cl, 0, path, &q));
    tu_watchdog_for("test_cl_backend", CL_WATCHDOG_S);
    EXPECT_SUBSTR(dsgd_ctx_last_error(G.ctx), "not a regular file");
    unlink(path);
    tu_rmdir(dir); /* best effort: sub/dir stays behind in /tmp */
}

/* Missing, corrupt, other-device files and parameters beyond the device's
   limits: a WARN naming the reason, CLBlast's defaults stay (gemm_tuned 0),
   and the context works. */
static void test_tune_cache_fallbacks_warn(void **state) {
    char dir[64], path[1100], text[2048];
    const dsgd_cl_device_info *info;
    logcap cap;
    dsgd_ctx *ctx;
    dsgd_cl_context *c;
    (void)state;
    NEED_CL();
    info = dsgd_cl_context_device_info(G.cl, 0);
    tu_mkdtemp(dir);
    ctx = cap_ctx(&cap);

    snprintf(path, sizeof path, "%s/missing.txt", dir);
    c = open_with_cache(ctx, path);
    assert_int_equal(cap.count[DSGD_LOG_WARN], 1);
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "GEMM tuning cache missing");
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], path);
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "using CLBlast's default GEMM parameters");
    assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 0);
    assert_int_equal(dsgd_ctx_last_result(ctx), DSGD_OK); /* a warning, not an error */
    dsgd_cl_context_destroy(c);

    tu_write_file(dir, "corrupt.txt", "distsgd-clblast-gemm-cache 1\nXgemm MWG=\n", 41, path, sizeof path);
    c = open_with_cache(ctx, path);
    assert_int_equal(cap.count[DSGD_LOG_WARN], 2);
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "GEMM tuning cache corrupt");
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "corrupt.txt:2");
    assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 0);
    dsgd_cl_context_destroy(c);

    snprintf(text, sizeof text,
             "distsgd-clblast-gemm-cache 1\nplatform %s\ndevice Some Other GPU 9000\ndriver %s\n"
             "Xgemm GEMMK=1 KREG=8 KWG=1 KWI=1 MDIMA=1 MDIMC=1 MWG=16 NDIMB=2 NDIMC=2 NWG=16 SA=0 SB=0 STRM=0 STRN=0 "
             "VWM=8 VWN=8\nend\n",
             info->platform_name, info->driver_version);
    tu_write_file(dir, "other.txt", text, strlen(text), path, sizeof path);
    c = open_with_cache(ctx, path);
    assert_int_equal(cap.count[DSGD_LOG_WARN], 3);
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "for another device");
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "Some Other GPU 9000");
    assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 0);
    dsgd_cl_context_destroy(c);

    /* the same device with another driver version is another device too */
    snprintf(text, sizeof text,
             "distsgd-clblast-gemm-cache 1\nplatform %s\ndevice %s\ndriver %s-older\nend\n",
             info->platform_name, info->device_name, info->driver_version);
    tu_write_file(dir, "driver.txt", text, strlen(text), path, sizeof path);
    c = open_with_cache(ctx, path);
    assert_int_equal(cap.count[DSGD_LOG_WARN], 4);
    EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "for another device");
    dsgd_cl_context_destroy(c);

    /* made for this device, valid, but beyond its local memory: refused
       before anything is applied, by the cache and by an explicit apply */
    {
        dsgd_cl_gemm_params huge = huge_local_params();
        char file[1100];
        TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, dir, file, sizeof file));
        TU_OK(G.ctx, dsgd_cl_save_gemm_params(G.ctx, G.cl, 0, file, &huge, NULL));
        c = open_with_cache(ctx, dir);
        assert_int_equal(cap.count[DSGD_LOG_WARN], 5);
        EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "does not fit the device's limits");
        EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "Xgemm needs 8388608 bytes of local memory");
        EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "using CLBlast's default GEMM parameters");
        assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 0);
        assert_int_equal(dsgd_ctx_last_result(ctx), DSGD_OK);
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cl_apply_gemm_params(ctx, c, 0, &huge));
        EXPECT_SUBSTR(dsgd_ctx_last_error(ctx), "do not fit");
        assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 0);
        dsgd_cl_context_destroy(c);
        unlink(file);
    }

    /* TUNING_OFF reads nothing and says nothing */
    {
        dsgd_cl_context_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.tuning = DSGD_CL_TUNING_OFF;
        cd.tune_cache = path;
        TU_OK(ctx, dsgd_cl_context_create(ctx, &cd, &c));
        assert_int_equal(cap.count[DSGD_LOG_WARN], 5);
        dsgd_cl_context_destroy(c);
    }
    dsgd_ctx_destroy(ctx);
    tu_rmdir(dir);
}

/* Runs last (see the file comment): a valid file is applied, and GEMM is
   still right with the tuned parameters. */
static void test_tune_cache_valid_applied(void **state) {
    static const gcase cases[] = {{0, 0, 37, 53, 29, 3, 0.7f, 0.3f},
                                  {0, 0, 129, 257, 300, 0, 1.0f, 0.0f},
                                  {1, 0, 300, 129, 257, 1, 0.5f, 1.0f},
                                  {0, 1, 257, 300, 129, 0, 1.0f, 0.0f},
                                  {1, 1, 45, 67, 33, 2, 1.0f, 0.5f}};
    char dir[64], path[1100], why[256];
    dsgd_cl_gemm_params p = sample_params();
    tu_rng rng = tu_rng_make(25);
    logcap cap;
    dsgd_ctx *ctx;
    dsgd_cl_context *c;
    size_t i;
    (void)state;
    NEED_CL();
    tu_mkdtemp(dir);
    ctx = cap_ctx(&cap);
    TU_OK(G.ctx, dsgd_cl_tune_cache_path(G.cl, 0, dir, path, sizeof path));
    TU_OK(G.ctx, dsgd_cl_save_gemm_params(G.ctx, G.cl, 0, path, &p, NULL));
    c = open_with_cache(ctx, dir); /* a directory: the per-device file inside */
    if (dsgd_cl_gemm_params_fit(&p, dsgd_cl_context_device_info(G.cl, 0), why, sizeof why)) {
        assert_int_equal(cap.count[DSGD_LOG_WARN], 0);
        EXPECT_SUBSTR(cap.last[DSGD_LOG_INFO], "applied tuned CLBlast GEMM parameters");
        assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 1);
    } else {
        /* a device with fewer than 256 work-items per group (PoCL with
           POCL_MAX_WORK_GROUP_SIZE=64): min_indirect would send these GEMMs
           to CLBlast's indirect path, whose helper kernels do not fit
           (CL_INVALID_WORK_GROUP_SIZE); CLBlast's defaults stay */
        assert_true(dsgd_cl_context_device_info(G.cl, 0)->max_work_group_size < 256);
        EXPECT_SUBSTR(why, "indirect");
        assert_int_equal(cap.count[DSGD_LOG_WARN], 1);
        EXPECT_SUBSTR(cap.last[DSGD_LOG_WARN], "does not fit the device's limits");
        assert_int_equal(dsgd_cl_context_gemm_tuned(c, 0), 0);
    }
    dsgd_cl_context_destroy(c);
    dsgd_ctx_destroy(ctx);
    /* the overrides are per device for the whole process: G's backend now
       runs them too (or, where they did not fit, CLBlast's defaults) */
    for (i = 0; i < sizeof cases / sizeof cases[0]; ++i) gemm_case(&cases[i], &rng, 0);
    tu_rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp_mode_decision),
        cmocka_unit_test(test_list_devices),
        cmocka_unit_test(test_device_selection),
        cmocka_unit_test(test_buffer_ops),
        cmocka_unit_test(test_scale_axpy),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_gemm_edge_cases),
        cmocka_unit_test(test_gemm_split_k),
        cmocka_unit_test(test_bias_act_forward),
        cmocka_unit_test(test_act_backward),
        cmocka_unit_test(test_bias_backward),
        cmocka_unit_test(test_image_ops),
        cmocka_unit_test(test_image_ops_both_shapes),
        cmocka_unit_test(test_image_ops_64bit_index),
        cmocka_unit_test(test_image_errors),
        cmocka_unit_test(test_loss_softmax_xent),
        cmocka_unit_test(test_loss_mse),
        cmocka_unit_test(test_loss_bad_class),
        cmocka_unit_test(test_optimizer_update),
        cmocka_unit_test(test_checkpoint_across_backends),
        cmocka_unit_test(test_norm_check),
        cmocka_unit_test(test_map_unmap),
        cmocka_unit_test(test_map_and_sum_across),
        cmocka_unit_test(test_auto_queues_rule),
        cmocka_unit_test(test_default_device_rule),
        cmocka_unit_test(test_queue_policies),
        cmocka_unit_test(test_backends_share_context),
        cmocka_unit_test(test_train_20_steps_xent_adam),
        cmocka_unit_test(test_train_20_steps_mse_momentum_clip),
        cmocka_unit_test(test_replicas_on_threads),
        cmocka_unit_test(test_errors_name_the_call),
        cmocka_unit_test(test_gemm_params_fit_limits),
        cmocka_unit_test(test_tune_cache_path),
        cmocka_unit_test(test_tune_cache_roundtrip_and_corrupt),
        cmocka_unit_test(test_tune_cache_fallbacks_warn),
        cmocka_unit_test(test_tune_cache_valid_applied), /* last: process-wide overrides */
    };
    return cmocka_run_group_tests_name("opencl backend", tests, group_setup, group_teardown);
}
