/* test_cl_strategy.c - the synchronous contract of the mirrored strategy with
   the OpenCL backend (distsgd_cl.h).

   Every test calls skip() when no OpenCL device is found (reported as
   skipped, not passed).

   The model is a small MLP, 20 -> 16 relu -> 8 tanh -> 5 with softmax
   cross-entropy (517 parameters), on the tests' own seeded random data
   (x uniform in [-1, 1), labels 0..4). Each replica's backend comes from a
   backend_factory that calls dsgd_cl_backend_create on one shared
   dsgd_cl_context (its user_data), on device replica % num_devices, or
   on device 0 for the DEVICE gradient path (it sums on one device; several
   devices are test_cl_devices.c's).

   What is asserted:
   - MIRRORED with N replicas x per-replica batch B = 8 on OpenCL trains,
     after 20 steps (8 under make test), the same weights as ONE_DEVICE on the CPU backend with
     batch N*B, at N = 2 and 4, for SGD with momentum and for Adam.
     Error = max_i |opencl_i - cpu_i| / max_i |cpu_i| over all parameters,
     <= 1e-4 for both. (The two differ by float rounding: the OpenCL GEMMs sum
     in another order, tanh and the softmax use OpenCL's exp/tanh, and the
     gradient is a sum of N shard gradients instead of one batch sum.)
   - After every step all replicas hold bitwise identical parameters (they
     all apply the same all-reduced gradient with the same kernels).
   - Every replica's model really runs on an OpenCL backend, on the device
     the round-robin placement names.
   - CENTRAL_STORAGE over OpenCL replicas (N = 3 momentum; N = 2 Adam with
     buffers outside host-shared memory, so the gradients are mapped) meets
     the same contract against ONE_DEVICE on the CPU, <= 1e-4.
   - Both gradient paths: DEVICE (sum_across kernels, no host copy) and
     HOST (mapped buffers, then the loopback all-reduce), N = 2, 4 and 9 (9:
     the device sums in two launches of 8 and 1). AUTO resolves to HOST
     when every backend's buffers are in host-shared memory (PoCL) or the
     replicas are on several devices, to DEVICE otherwise (backends made
     with host_visible = -1, as on a discrete GPU); asserted. With the host's DIRECT algorithm the two paths sum in the same
     order, so they give bitwise identical weights after every step (N = 3
     and 9) where the device's float adds are the host's: its
     CL_DEVICE_SINGLE_FP_CONFIG promises round to nearest, Inf/NaN and
     denormals (the device path sums on the device, the host path on the
     CPU). Elsewhere (a device that flushes denormals) the two paths must
     agree within 1e-6 relative instead. The setup prints what the device
     promises and which mode that check uses. Every other comparison with
     the CPU here is already a tolerance, and the replicas of one strategy
     run the same kernels on the same device, so they stay bit for bit.
   - Comm hooks on OpenCL replicas (N = 3, buffers outside host-shared
     memory): AUTO takes the HOST path, a plain all-reduce hook gives the
     HOST path's bits and bytes, fp16 on the wire keeps the replicas
     identical within 1e-2 of fp32 and saves exactly 2 bytes a float of the
     ring's payload; DEVICE with a hook is refused.
   - Image layers (conv2d, max-pool): a CNN's gradient on OpenCL equals the
     CPU's within 1e-5 relative, and MIRRORED N = 2 on OpenCL trains it as
     ONE_DEVICE on the CPU does, within 1e-4 after 10 steps.
   - The train metrics (loss sum, correct, count) over the 20 steps equal the
     CPU reference's: count exactly, loss within 1e-4 relative, correct
     within 2 samples (a near-tie in the argmax may flip with rounding).

   Cold start: the context is built with tuning off (no cache file is read,
   no warning). At these sizes CLBlast takes its direct GEMM path, one
   routine for all transpose cases, so one CLBlast program is compiled (about
   7 s on PoCL the first time, then cached in POCL_CACHE_DIR).

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"
#include "../distsgd_cl.h"
#include "cl_fp.h"
#include "cl_mlp.h"

#include <signal.h>

enum { MAXN = 9 };

/* Training steps of a run: STEPS under make test-full; 8 in the quick
   tier, after which every run has still moved its weights well past the
   tolerances it is held to. Host waits counted over 10 steps, or 4. */
#define RUN_STEPS TU_PICK(STEPS, 8)
#define WAIT_STEPS TU_PICK(10, 4)

/* ---------------------------------------------------------------- fixture */

static struct {
    int have_cl;
    dsgd_ctx *ctx;
    dsgd_cl_context *cl;
    int factory_calls;
    dsgd_allreduce_algo algorithm; /* of the strategies strat_make makes */
    int host_visible;              /* cl_factory's dsgd_cl_backend_desc.host_visible */
    int one_device;                /* cl_factory puts every replica on device 0 */
    dsgd_nonfinite_policy nonfinite; /* of the strategies strat_make makes */
    unsigned long long fp_config;  /* CL_DEVICE_SINGLE_FP_CONFIG, the AND over
                                      the context's devices */
} G;

/* The device path's sums give the host path's bits where the device
   promises FP_ARITH (tests/cl_fp.h; no divide or sqrt is compared here). */
/* The tolerance elsewhere: the paths then differ only where a sum is a
   denormal (below 1.2e-38) flushed to zero on one side, far below 1e-6 of
   the weights' scale after 20 steps; 1e-6 (about 8 float ulp) still fails a
   summation in another order or a lost replica's gradient. */
#define PATHS_TOL 1e-6


static int group_setup(void **state) {
    int n = 0;
    (void)state;
    if (dsgd_ctx_create(NULL, &G.ctx) != DSGD_OK) return -1;
    if (dsgd_cl_list_devices(G.ctx, NULL, 0, &n) != DSGD_OK) {
        fprintf(stderr, "test_cl_strategy: listing OpenCL devices failed: %s\n", dsgd_ctx_last_error(G.ctx));
        return -1;
    }
    if (n == 0) {
        fprintf(stderr, "test_cl_strategy: no OpenCL device found: every test is skipped\n");
        return 0;
    }
    {
        dsgd_cl_context_desc cd;
        memset(&cd, 0, sizeof cd);
        cd.tuning = DSGD_CL_TUNING_OFF; /* hermetic: no user tuning file, no warning */
        cd.max_devices = MAXN;          /* round-robin over several devices where there are */
        if (dsgd_cl_context_create(G.ctx, &cd, &G.cl) != DSGD_OK) {
            fprintf(stderr, "test_cl_strategy: %d OpenCL device(s) but the context failed: %s\n", n,
                    dsgd_ctx_last_error(G.ctx));
            return -1;
        }
    }
    G.have_cl = 1;
    fprintf(stderr, "test_cl_strategy: %d device(s) in the context, device 0: %s (%s)\n",
            dsgd_cl_context_num_devices(G.cl), dsgd_cl_context_device_info(G.cl, 0)->device_name,
            dsgd_cl_context_device_info(G.cl, 0)->platform_name);
    G.fp_config = fp_config_of(G.cl);
    print_message("    device path vs host path: %s (tolerance: %g relative); OpenCL vs CPU: within the stated "
                  "tolerances\n", fp_mode_name(G.fp_config, FP_ARITH), PATHS_TOL);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    dsgd_cl_context_destroy(G.cl);
    dsgd_ctx_destroy(G.ctx);
    memset(&G, 0, sizeof G);
    return 0;
}

/* Every test needs a device; a hang in a collective fails the run instead of
   blocking CI. */
#define NEED_CL()                                 \
    do {                                          \
        if (!G.have_cl) skip();                   \
        dsgd_ctx_clear_error(G.ctx);              \
        tu_watchdog_for("test_cl_strategy", 300); \
    } while (0)

/* The strategy's backend_factory: replica r on device r % num_devices of the
   shared context passed as user_data (device 0 with G.one_device: the
   DEVICE path sums on one device). Called on the creating thread. */
static dsgd_result cl_factory(void *user_data, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_cl_context *c = (dsgd_cl_context *)user_data;
    dsgd_cl_backend_desc bd;
    memset(&bd, 0, sizeof bd);
    bd.device = G.one_device ? 0 : replica % dsgd_cl_context_num_devices(c);
    bd.host_visible = G.host_visible;
    G.factory_calls++;
    return dsgd_cl_backend_create(ctx, c, &bd, out);
}

/* ---------------------------------------------------------------- helpers */

static dsgd_optimizer_desc opt_desc(dsgd_optimizer_kind kind) {
    dsgd_optimizer_desc od;
    memset(&od, 0, sizeof od);
    od.kind = kind;
    if (kind == DSGD_OPT_MOMENTUM) {
        od.lr = 0.05f;
        od.momentum = 0.9f;
    } else {
        od.lr = 0.005f;
    }
    return od;
}

static dsgd_strategy *strat_make(dsgd_strategy_kind kind, int n, int max_batch, dsgd_optimizer_kind opt,
                                 int opencl, dsgd_gradient_path path) {
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.num_replicas = n;
    cl_mlp_model(&d.model, max_batch);
    d.optimizer = opt_desc(opt);
    d.timeout_s = 60.0; /* first use may compile kernels */
    d.gradient_path = path;
    d.algorithm = G.algorithm;
    d.nonfinite = G.nonfinite;
    if (opencl) {
        d.backend_factory = cl_factory;
        d.backend_user_data = G.cl;
    }
    TU_OK(G.ctx, dsgd_strategy_create(G.ctx, &d, &s));
    assert_non_null(s);
    assert_int_equal((int)dsgd_model_num_params(dsgd_strategy_model(s, 0)), NPARAMS);
    return s;
}

static void get_params(dsgd_strategy *s, int replica, float *dst) {
    dsgd_model *m = dsgd_strategy_model(s, replica);
    assert_non_null(m);
    TU_OK(G.ctx, dsgd_model_get_params(m, dst, NPARAMS));
}

static void assert_replicas_identical(dsgd_strategy *s, int n, int step) {
    float p0[NPARAMS], pr[NPARAMS];
    int r;
    get_params(s, 0, p0);
    for (r = 1; r < n; ++r) {
        get_params(s, r, pr);
        if (memcmp(p0, pr, sizeof p0) != 0)
            fail_msg("after step %d replica %d's parameters differ from replica 0's", step, r);
    }
}

/* RUN_STEPS steps of `kind` (MIRRORED, or CENTRAL_STORAGE, whose path is always
   HOST) with n replicas on OpenCL, gradients summed by `path`, against
   ONE_DEVICE(batch n*B) on the CPU. */
static void contract_kind(dsgd_strategy_kind kind, int n, dsgd_optimizer_kind opt, double tol,
                          dsgd_gradient_path path) {
    enum { GB = MAXN * B };
    static float x[GB * IN], y[GB];
    float pm[NPARAMS], pr[NPARAMS];
    tu_rng rng = tu_rng_make(1000u + (unsigned)n * 10u + (unsigned)opt);
    dsgd_strategy *ms, *ref;
    dsgd_metrics mm, mr;
    int step, i, r, calls0 = G.factory_calls;
    double err;

    int devices = dsgd_cl_context_num_devices(G.cl);

    G.one_device = path == DSGD_GRADIENTS_DEVICE; /* where there are several */
    if (G.one_device) devices = 1;
    ms = strat_make(kind, n, B, opt, 1, path);
    if (kind == DSGD_STRATEGY_CENTRAL_STORAGE) {
        path = DSGD_GRADIENTS_HOST;
    } else if (path == DSGD_GRADIENTS_AUTO) {
        /* every backend is on the one context: AUTO takes the device path
           when all are on one device and some buffers are not in
           host-shared memory */
        int shared = 1;
        for (r = 0; r < n; ++r) {
            const dsgd_backend_i *be = dsgd_model_backend(dsgd_strategy_model(ms, r));
            shared &= be->host_shared(be->impl);
        }
        assert_int_equal(shared, G.host_visible >= 0 && dsgd_cl_context_device_info(G.cl, 0)->unified_memory);
        path = shared || n == 1 || devices > 1 ? DSGD_GRADIENTS_HOST : DSGD_GRADIENTS_DEVICE;
    }
    assert_int_equal(dsgd_strategy_gradient_path(ms), path);
    ref = strat_make(DSGD_STRATEGY_ONE_DEVICE, 0, n * B, opt, 0, DSGD_GRADIENTS_AUTO);
    assert_int_equal(G.factory_calls - calls0, n);
    for (r = 0; r < n; ++r) {
        const dsgd_backend_i *be = dsgd_model_backend(dsgd_strategy_model(ms, r));
        assert_non_null(be);
        assert_true(dsgd_cl_is_backend(be));
        assert_ptr_equal(dsgd_cl_backend_context(be), G.cl);
        assert_true(dsgd_cl_backend_device(be) == dsgd_cl_context_device(G.cl, r % devices));
    }
    assert_false(dsgd_cl_is_backend(dsgd_model_backend(dsgd_strategy_model(ref, 0))));

    /* same start */
    get_params(ms, 0, pm);
    get_params(ref, 0, pr);
    assert_memory_equal(pm, pr, sizeof pm);
    assert_replicas_identical(ms, n, 0);

    for (step = 1; step <= RUN_STEPS; ++step) {
        dsgd_step_info im, ir;
        tu_fill(&rng, x, (size_t)(n * B) * IN, -1.0f, 1.0f);
        for (i = 0; i < n * B; ++i) y[i] = (float)tu_below(&rng, OUT);
        TU_OK(G.ctx, dsgd_strategy_train_step(ms, x, y, n * B, &im));
        TU_OK(G.ctx, dsgd_strategy_train_step(ref, x, y, n * B, &ir));
        assert_int_equal(im.skipped, 0);
        assert_int_equal(ir.skipped, 0);
        assert_int_equal(im.count, n * B);
        assert_replicas_identical(ms, n, step);
    }

    get_params(ms, 0, pm);
    get_params(ref, 0, pr);
    err = tu_rel_err(pm, pr, NPARAMS);
    fprintf(stderr, "test_cl_strategy: %s N=%d %s, %s gradients: max|opencl-cpu|/max|cpu| = %.3g (tol %.0e)\n",
            dsgd_strategy_kind_name(kind), n, opt == DSGD_OPT_ADAM ? "adam" : "momentum",
            dsgd_gradient_path_name(dsgd_strategy_gradient_path(ms)), err, tol);
    if (!(err <= tol)) fail_msg("N=%d: relative error %.3g > %.0e", n, err, tol);
    /* the weights did move (so the comparison is not of two initial states) */
    {
        float p0[NPARAMS];
        dsgd_strategy *fresh = strat_make(DSGD_STRATEGY_ONE_DEVICE, 0, B, opt, 0, DSGD_GRADIENTS_AUTO);
        get_params(fresh, 0, p0);
        assert_true(tu_rel_err(pr, p0, NPARAMS) > 100.0 * tol);
        dsgd_strategy_destroy(fresh);
    }

    TU_OK(G.ctx, dsgd_strategy_take_metrics(ms, DSGD_METRICS_TRAIN, &mm));
    TU_OK(G.ctx, dsgd_strategy_take_metrics(ref, DSGD_METRICS_TRAIN, &mr));
    assert_true(mm.count == (double)(RUN_STEPS * n * B));
    assert_true(mr.count == mm.count);
    TU_NEAR(mm.loss_sum, mr.loss_sum, 1e-4 * fabs(mr.loss_sum));
    TU_NEAR(mm.correct, mr.correct, 2.0);

    dsgd_strategy_destroy(ms);
    dsgd_strategy_destroy(ref);
    G.one_device = 0;
    tu_watchdog(0);
}

static void contract(int n, dsgd_optimizer_kind opt, double tol, dsgd_gradient_path path) {
    contract_kind(DSGD_STRATEGY_MIRRORED, n, opt, tol, path);
}

/* ---------------------------------------------------------------- tests */

static void test_contract_momentum_n2(void **state) {
    (void)state;
    NEED_CL();
    contract(2, DSGD_OPT_MOMENTUM, 1e-4, DSGD_GRADIENTS_AUTO);
}

static void test_contract_momentum_n4(void **state) {
    (void)state;
    NEED_CL();
    contract(4, DSGD_OPT_MOMENTUM, 1e-4, DSGD_GRADIENTS_DEVICE);
}

static void test_contract_momentum_n4_host(void **state) {
    (void)state;
    NEED_CL();
    contract(4, DSGD_OPT_MOMENTUM, 1e-4, DSGD_GRADIENTS_HOST);
}

/* Buffers outside host-shared memory (as on a discrete GPU): AUTO is DEVICE. */
/* One replica: the non-finite verdict stays on the device (ONE_DEVICE's
   and MIRRORED N = 1's step waits for nothing); Adam's bias corrections
   follow the step count, which the verdict may take back. */
static void test_contract_adam_n1(void **state) {
    (void)state;
    NEED_CL();
    contract(1, DSGD_OPT_ADAM, 1e-4, DSGD_GRADIENTS_AUTO);
}

static void test_contract_adam_n2(void **state) {
    (void)state;
    NEED_CL();
    G.host_visible = -1;
    contract(2, DSGD_OPT_ADAM, 1e-4, DSGD_GRADIENTS_AUTO);
    G.host_visible = 0;
}

static void test_contract_adam_n4(void **state) {
    (void)state;
    NEED_CL();
    contract(4, DSGD_OPT_ADAM, 1e-4, DSGD_GRADIENTS_DEVICE);
}

/* Central storage over OpenCL replicas: the gradients come to the host
   through host pointers or mapping (buffers outside host-shared memory). */
static void test_central_storage_momentum_n3(void **state) {
    (void)state;
    NEED_CL();
    contract_kind(DSGD_STRATEGY_CENTRAL_STORAGE, 3, DSGD_OPT_MOMENTUM, 1e-4, DSGD_GRADIENTS_AUTO);
}

static void test_central_storage_adam_n2_mapped(void **state) {
    (void)state;
    NEED_CL();
    G.host_visible = -1;
    contract_kind(DSGD_STRATEGY_CENTRAL_STORAGE, 2, DSGD_OPT_ADAM, 1e-4, DSGD_GRADIENTS_AUTO);
    G.host_visible = 0;
}

/* More replicas than one device-side launch sums (8). */
static void test_contract_momentum_n9(void **state) {
    (void)state;
    NEED_CL();
    contract(9, DSGD_OPT_MOMENTUM, 1e-4, DSGD_GRADIENTS_DEVICE);
}

/* The device path sums block r of every replica's gradient in rank order,
   as the host's DIRECT all-reduce does, so the two paths give the same
   bits, step after step (N = 3, and N = 9 where the device sums in two
   launches). */
static void paths_bitwise(int n) {
    enum { GB = MAXN * B };
    static float x[GB * IN], y[GB];
    float pd[NPARAMS], ph[NPARAMS], p0[NPARAMS];
    tu_rng rng = tu_rng_make(77u + (unsigned)n);
    dsgd_strategy *dev, *host;
    int step, i;
    const int exact = fp_bit_exact(G.fp_config, FP_ARITH); /* float adds on the device and on the host */
    G.algorithm = DSGD_ALLREDUCE_DIRECT; /* the host path's order of summation */
    G.one_device = 1;                    /* the device path sums on one device */
    dev = strat_make(DSGD_STRATEGY_MIRRORED, n, B, DSGD_OPT_MOMENTUM, 1, DSGD_GRADIENTS_DEVICE);
    G.one_device = 0;
    host = strat_make(DSGD_STRATEGY_MIRRORED, n, B, DSGD_OPT_MOMENTUM, 1, DSGD_GRADIENTS_HOST);
    assert_int_equal(dsgd_strategy_gradient_path(dev), DSGD_GRADIENTS_DEVICE);
    assert_int_equal(dsgd_strategy_gradient_path(host), DSGD_GRADIENTS_HOST);
    get_params(dev, 0, p0);
    for (step = 1; step <= RUN_STEPS; ++step) {
        tu_fill(&rng, x, (size_t)(n * B) * IN, -1.0f, 1.0f);
        for (i = 0; i < n * B; ++i) y[i] = (float)tu_below(&rng, OUT);
        TU_OK(G.ctx, dsgd_strategy_train_step(dev, x, y, n * B, NULL));
        TU_OK(G.ctx, dsgd_strategy_train_step(host, x, y, n * B, NULL));
        assert_replicas_identical(dev, n, step);
        get_params(dev, n - 1, pd);
        get_params(host, n - 1, ph);
        if (exact ? memcmp(pd, ph, sizeof pd) != 0 : !(tu_rel_err(pd, ph, NPARAMS) <= PATHS_TOL))
            fail_msg("N=%d step %d: device and host paths differ (max rel %.3g, want %s)", n, step,
                     tu_rel_err(pd, ph, NPARAMS), exact ? "the same bits" : "<= 1e-6");
    }
    assert_true(tu_rel_err(pd, p0, NPARAMS) > 1e-3); /* they trained */
    dsgd_strategy_destroy(dev);
    dsgd_strategy_destroy(host);
    G.algorithm = DSGD_ALLREDUCE_AUTO;
    tu_watchdog(0);
}

static void test_paths_bitwise_equal(void **state) {
    (void)state;
    NEED_CL();
    paths_bitwise(3);
    paths_bitwise(9);
}

/* ---------------------------------------------------------------- comm hooks */

/* A hook that does the plain all-reduce: the strategy's own exchange. */
static dsgd_result plain_reduce(void *state, const dsgd_hook_bucket *b) {
    (void)state;
    return dsgd_allreduce_at(b->comm, b->data, b->count, b->first, DSGD_REDUCE_SUM, b->algorithm, b->timeout_s);
}

/* MIRRORED with n OpenCL replicas whose buffers are outside host-shared
   memory (as on a discrete GPU), the ring, `hook` (NULL: none) and `path`. */
static dsgd_strategy_desc hook_desc(int n, const dsgd_comm_hook *hook, dsgd_gradient_path path) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DSGD_STRATEGY_MIRRORED;
    d.num_replicas = n;
    cl_mlp_model(&d.model, B);
    d.optimizer = opt_desc(DSGD_OPT_MOMENTUM);
    d.timeout_s = 60.0;
    d.algorithm = DSGD_ALLREDUCE_RING; /* messages, so the transport counts the wire */
    d.gradient_path = path;
    d.comm_hook = hook;
    d.backend_factory = cl_factory;
    d.backend_user_data = G.cl;
    return d;
}

/* RUN_STEPS steps of hook_desc(n, hook, path), the path taken asserted (AUTO:
   DEVICE for such buffers, unless a hook needs host buckets); replica 0's
   weights into w (the initial ones into w0 when not NULL), the strategy's
   comm stats into *cs; the replicas checked identical after every step. */
static void hook_run(int n, const dsgd_comm_hook *hook, dsgd_gradient_path path, float *w0, float *w,
                     dsgd_comm_stats *cs) {
    enum { GB = MAXN * B };
    static float x[GB * IN], y[GB];
    tu_rng rng = tu_rng_make(91u);
    dsgd_strategy_desc d = hook_desc(n, hook, path);
    dsgd_strategy *s = NULL;
    int step, i;
    G.host_visible = -1;
    TU_OK(G.ctx, dsgd_strategy_create(G.ctx, &d, &s));
    assert_int_equal(dsgd_strategy_gradient_path(s),
                     path != DSGD_GRADIENTS_AUTO ? path : hook ? DSGD_GRADIENTS_HOST : DSGD_GRADIENTS_DEVICE);
    if (w0) get_params(s, 0, w0);
    for (step = 1; step <= RUN_STEPS; ++step) {
        tu_fill(&rng, x, (size_t)(n * B) * IN, -1.0f, 1.0f);
        for (i = 0; i < n * B; ++i) y[i] = (float)tu_below(&rng, OUT);
        TU_OK(G.ctx, dsgd_strategy_train_step(s, x, y, n * B, NULL));
        assert_replicas_identical(s, n, step);
    }
    get_params(s, 0, w);
    TU_OK(G.ctx, dsgd_strategy_comm_stats(s, cs));
    dsgd_strategy_destroy(s);
    G.host_visible = 0;
}

/* Comm hooks on OpenCL replicas: AUTO takes the HOST path (a hook sees
   host buckets) where it would take DEVICE; a hook doing the plain
   all-reduce gives the bits and the bytes of the HOST path without a hook;
   fp16 on the wire keeps the replicas identical, stays within 1e-2 of fp32
   after RUN_STEPS steps, and sends the same messages with half the payload:
   its uncompressed count equals fp32's bytes, and it saves 2 bytes on each
   of the ring's 2 (n-1) NPARAMS floats a step (all replicas together); an
   explicit DEVICE path with a hook is refused. */
static void test_comm_hooks_on_opencl(void **state) {
    const int n = 3;
    float w_host[NPARAMS], w_plain[NPARAMS], w_half[NPARAMS], p0[NPARAMS];
    dsgd_comm_stats c_host, c_plain, c_half;
    dsgd_comm_hook plain, half;
    dsgd_compress_desc cd;
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    (void)state;
    NEED_CL();
    memset(&plain, 0, sizeof plain);
    plain.name = "plain";
    plain.reduce = plain_reduce;
    memset(&cd, 0, sizeof cd);
    cd.kind = DSGD_COMPRESS_FP16;
    half = dsgd_compress_hook(&cd);
    hook_run(n, NULL, DSGD_GRADIENTS_HOST, p0, w_host, &c_host);
    hook_run(n, &plain, DSGD_GRADIENTS_AUTO, NULL, w_plain, &c_plain);
    if (memcmp(w_host, w_plain, sizeof w_host) != 0)
        fail_msg("a plain all-reduce hook differs from the HOST path without one (max rel %.3g)",
                 tu_rel_err(w_plain, w_host, NPARAMS));
    assert_true(c_plain.bytes_sent == c_host.bytes_sent);
    hook_run(n, &half, DSGD_GRADIENTS_AUTO, NULL, w_half, &c_half);
    assert_true(tu_rel_err(w_host, p0, NPARAMS) > 1e-3); /* it trained */
    if (!(tu_rel_err(w_half, w_host, NPARAMS) <= 1e-2))
        fail_msg("fp16 wire: %.3g from fp32 after %d steps", tu_rel_err(w_half, w_host, NPARAMS), RUN_STEPS);
    if (c_half.bytes_uncompressed != c_host.bytes_sent ||
        c_half.bytes_uncompressed - c_half.bytes_sent != (uint64_t)(2 * 2 * (n - 1)) * NPARAMS * RUN_STEPS)
        fail_msg("fp16 wire: %llu bytes sent, %llu uncompressed; fp32: %llu", (unsigned long long)c_half.bytes_sent,
                 (unsigned long long)c_half.bytes_uncompressed, (unsigned long long)c_host.bytes_sent);
    d = hook_desc(2, &half, DSGD_GRADIENTS_DEVICE);
    assert_int_equal(dsgd_strategy_create(G.ctx, &d, &s), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(s);
    assert_non_null(strstr(dsgd_ctx_last_error(G.ctx), "DEVICE"));
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- host waits */

/* The times the host waited for a device (dsgd_cl_backend_host_waits,
   summed over the replicas' backends) in `steps` training steps of `kind`
   with n replicas, after 3 steps of warm-up (the staging ring's first use,
   CLBlast's kernels). Between steps the test lets the devices catch up
   (clFinish on each backend's queue, behind the backends' backs), so that
   what is counted is what a step waits for of its own accord, not the
   backpressure of a device slower than the host (PoCL's). */
static unsigned long waits_in_steps(dsgd_strategy_kind kind, int n, dsgd_gradient_path path, int steps,
                                    unsigned long *gemm_first, unsigned long *gemm_steady) {
    enum { GB = MAXN * B };
    static float x[GB * IN], y[GB];
    tu_rng rng = tu_rng_make(55u + (unsigned)n);
    unsigned long before = 0, after = 0, ex_before = 0, ex_after = 0;
    dsgd_strategy *s;
    int step, i, r, reps = n ? n : 1; /* ONE_DEVICE: n 0, one replica */
    G.one_device = 1;
    s = strat_make(kind, n, B, DSGD_OPT_MOMENTUM, 1, path);
    G.one_device = 0;
    for (step = 0; step < 3 + steps; ++step) {
        if (step == 3)
            for (r = 0; r < reps; ++r) {
                before += dsgd_cl_backend_host_waits(dsgd_model_backend(dsgd_strategy_model(s, r)));
                ex_before += dsgd_cl_backend_gemm_exclusive(dsgd_model_backend(dsgd_strategy_model(s, r)));
            }
        tu_fill(&rng, x, (size_t)(reps * B) * IN, -1.0f, 1.0f);
        for (i = 0; i < reps * B; ++i) y[i] = (float)tu_below(&rng, OUT);
        TU_OK(G.ctx, dsgd_strategy_train_step(s, x, y, reps * B, NULL));
        for (r = 0; r < reps; ++r)
            assert_int_equal(clFinish(dsgd_cl_backend_queue(dsgd_model_backend(dsgd_strategy_model(s, r)))),
                             CL_SUCCESS);
    }
    for (r = 0; r < reps; ++r) {
        after += dsgd_cl_backend_host_waits(dsgd_model_backend(dsgd_strategy_model(s, r)));
        ex_after += dsgd_cl_backend_gemm_exclusive(dsgd_model_backend(dsgd_strategy_model(s, r)));
    }
    dsgd_strategy_destroy(s);
    *gemm_first = ex_before;
    *gemm_steady = ex_after - ex_before;
    return after - before;
}

/* A steady-state step waits for nothing on one device and on the DEVICE
   path: the inputs are staged, the loss's class check and the step's
   non-finite verdict are read back without waiting (the verdict gates the
   update on the device and is taken at the next step), and marks order
   the replicas' queues. The HOST path waits twice per replica: for
   norm_check's non-finite count, which the replicas agree on over the
   transport, and for its map of the gradient. And after the warm-up no
   replica's GEMM takes CLBlast's process-wide lock exclusively: the
   replicas' threads enqueue their GEMMs without waiting for each other. */
static void test_host_waits_per_step(void **state) {
    static const struct {
        dsgd_strategy_kind kind;
        int n;
        dsgd_gradient_path path;
        const char *name;
    } runs[] = {{DSGD_STRATEGY_ONE_DEVICE, 0, DSGD_GRADIENTS_AUTO, "one_device"},
                {DSGD_STRATEGY_MIRRORED, 2, DSGD_GRADIENTS_DEVICE, "mirrored DEVICE N=2"},
                {DSGD_STRATEGY_MIRRORED, 3, DSGD_GRADIENTS_DEVICE, "mirrored DEVICE N=3"},
                {DSGD_STRATEGY_MIRRORED, 2, DSGD_GRADIENTS_HOST, "mirrored HOST N=2"}};
    int i;
    (void)state;
    NEED_CL();
    for (i = 0; i < (int)(sizeof runs / sizeof runs[0]); ++i) {
        unsigned long first, steady, waits;
        waits = waits_in_steps(runs[i].kind, runs[i].n, runs[i].path, WAIT_STEPS, &first, &steady);
        fprintf(stderr, "test_cl_strategy: %s: %lu host waits in %d steps; GEMMs under CLBlast's exclusive lock: %lu "
                        "in the first 3 steps, %lu after\n", runs[i].name, waits, WAIT_STEPS, first, steady);
        /* the HOST path's two waits per replica-step, nothing else */
        assert_int_equal(waits, runs[i].path == DSGD_GRADIENTS_HOST
                                    ? 2ul * (unsigned long)runs[i].n * (unsigned long)WAIT_STEPS : 0ul);
        /* every backend is new: its shapes' first calls were exclusive, and
           no call after them */
        assert_true(first > 0);
        assert_int_equal(steady, 0);
    }
    tu_watchdog(0);
}

/* THE VERDICT ON THE DEVICE: MIRRORED N = 2 on the DEVICE path (the
   verdict kept on the device, taken at the next step or, when info is
   asked for, at the end of its own) against the HOST path (agreed on the
   host before the update), both summing in the DIRECT order, over 6 steps
   whose third has a NaN input: under SKIP the same weights after every
   step (bit for bit where the device promises it), the same skipped flag
   where info is asked for, the same step counts; under ERROR the DEVICE
   path reports the third step's verdict at the fourth step (its info was
   not asked for) and the HOST path at the third, with the same weights. */
static void verdict_run(dsgd_nonfinite_policy policy) {
    enum { N = 2, GB = N * B, STEPS6 = 6 };
    static float x[GB * IN], y[GB];
    float pd[NPARAMS], ph[NPARAMS];
    tu_rng rng = tu_rng_make(91u + (unsigned)policy);
    dsgd_strategy *dev, *host;
    int step, i;
    const int exact = fp_bit_exact(G.fp_config, FP_ARITH);
    G.algorithm = DSGD_ALLREDUCE_DIRECT;
    G.nonfinite = policy;
    G.one_device = 1;
    dev = strat_make(DSGD_STRATEGY_MIRRORED, N, B, DSGD_OPT_MOMENTUM, 1, DSGD_GRADIENTS_DEVICE);
    G.one_device = 0;
    host = strat_make(DSGD_STRATEGY_MIRRORED, N, B, DSGD_OPT_MOMENTUM, 1, DSGD_GRADIENTS_HOST);
    for (step = 1; step <= STEPS6; ++step) {
        dsgd_step_info id, ih;
        dsgd_result rd, rh;
        tu_fill(&rng, x, (size_t)GB * IN, -1.0f, 1.0f);
        for (i = 0; i < GB; ++i) y[i] = (float)tu_below(&rng, OUT);
        if (step == 3) x[5 * IN + 7] = NAN; /* replica 0's shard */
        memset(&id, 0, sizeof id);
        rd = dsgd_strategy_train_step(dev, x, y, GB, step == 3 ? NULL : &id);
        if (policy == DSGD_NONFINITE_ERROR && step == 4) { /* the third step's verdict */
            assert_int_equal(rd, DSGD_ERR_NON_FINITE);
            if (!strstr(dsgd_ctx_last_error(G.ctx), "kept on the device, taken at the next step"))
                fail_msg("the late verdict's message: %s", dsgd_ctx_last_error(G.ctx));
            get_params(dev, 1, pd); /* as after the second step, like the host path's */
            assert_true(exact ? memcmp(pd, ph, sizeof pd) == 0 : tu_rel_err(pd, ph, NPARAMS) <= PATHS_TOL);
            break;
        }
        if (policy == DSGD_NONFINITE_SKIP && step == 3) {
            /* a checkpoint with the verdict pending saves the step count
               the verdict gives (2, not 3), which the restore brings back */
            char dir[64], path[96];
            tu_mkdtemp(dir);
            snprintf(path, sizeof path, "%s/v.ckpt", dir);
            TU_OK(G.ctx, dsgd_strategy_save(dev, path, NULL));
            TU_OK(G.ctx, dsgd_strategy_restore(dev, path, NULL));
            tu_rmdir_files(dir);
        }
        rh = dsgd_strategy_train_step(host, x, y, GB, &ih);
        if (policy == DSGD_NONFINITE_ERROR && step == 3) {
            assert_int_equal(rh, DSGD_ERR_NON_FINITE);
            assert_int_equal(rd, DSGD_OK); /* its verdict comes with the next step */
            get_params(host, 1, ph);
            continue;
        }
        TU_OK(G.ctx, rd);
        TU_OK(G.ctx, rh);
        assert_int_equal(ih.skipped, step == 3);
        if (step != 3) {
            assert_int_equal(id.skipped, 0);
            assert_true(id.step == ih.step); /* the third step taken back at the fourth */
            assert_true(id.step == step - 1 - (step > 3));
            assert_true(id.lr == ih.lr);
        }
        get_params(dev, N - 1, pd);
        get_params(host, N - 1, ph);
        if (exact ? memcmp(pd, ph, sizeof pd) != 0 : !(tu_rel_err(pd, ph, NPARAMS) <= PATHS_TOL))
            fail_msg("policy %d step %d: the verdict on the device and on the host give different weights (max rel "
                     "%.3g)", (int)policy, step, tu_rel_err(pd, ph, NPARAMS));
    }
    dsgd_strategy_destroy(dev);
    dsgd_strategy_destroy(host);
    G.algorithm = DSGD_ALLREDUCE_AUTO;
    G.nonfinite = DSGD_NONFINITE_SKIP;
    tu_watchdog(0);
}

static void test_verdict_on_device(void **state) {
    (void)state;
    NEED_CL();
    verdict_run(DSGD_NONFINITE_SKIP);
    verdict_run(DSGD_NONFINITE_ERROR);
}

/* ---------------------------------------------------------------- image layers */

/* A small CNN on 8x8x1 images: conv 3x3 pad 1 x4 relu, max-pool 2, conv 3x3
   stride 2 x3 tanh, dense 5. Its gradient on one OpenCL model equals the
   CPU model's within 1e-5 relative (the GEMMs sum in other orders; im2col,
   col2im and max-pool give the same bits), and MIRRORED N = 2 on OpenCL
   trains, after 10 steps, the weights of ONE_DEVICE on the CPU within 1e-4. */
static const dsgd_image_layer_desc CNN_IMAGE[3] = {
    {DSGD_IMAGE_CONV2D, 4, 3, 1, 1, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {DSGD_IMAGE_MAXPOOL, 0, 2, 0, 0, DSGD_ACT_NONE, DSGD_INIT_AUTO},
    {DSGD_IMAGE_CONV2D, 3, 3, 2, 1, DSGD_ACT_TANH, DSGD_INIT_AUTO},
};
static const dsgd_layer_desc CNN_DENSE[1] = {{OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static dsgd_model_desc cnn_desc(void) {
    dsgd_model_desc d;
    memset(&d, 0, sizeof d);
    d.image_layers = CNN_IMAGE;
    d.num_image_layers = 3;
    d.input_shape[0] = 8;
    d.input_shape[1] = 8;
    d.input_shape[2] = 1;
    d.layers = CNN_DENSE;
    d.num_layers = 1;
    d.max_batch = 16;
    d.seed = MODEL_SEED;
    return d;
}

static void cnn_data(uint64_t seed, float *x, float *y, int n) {
    tu_rng r = tu_rng_make(seed);
    int i;
    tu_fill(&r, x, (size_t)n * 64, -1.0f, 1.0f);
    for (i = 0; i < n; ++i) y[i] = (float)tu_below(&r, OUT);
}

static void test_cnn_gradient_cl_vs_cpu(void **state) {
    dsgd_model_desc d = cnn_desc();
    dsgd_backend_i be;
    dsgd_model *cpu = NULL, *cl = NULL;
    float x[16 * 64], y[16], gc[512], gl[512];
    size_t np;
    double e;
    (void)state;
    NEED_CL();
    TU_OK(G.ctx, cl_factory(G.cl, G.ctx, 0, &be));
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &d, &cpu));
    d.backend = &be;
    TU_OK(G.ctx, dsgd_model_create(G.ctx, &d, &cl));
    np = dsgd_model_num_params(cpu);
    assert_true(np <= 512);
    cnn_data(5, x, y, 16);
    TU_OK(G.ctx, dsgd_model_compute_gradients(cpu, x, y, 16, 1.0f / 16));
    TU_OK(G.ctx, dsgd_model_compute_gradients(cl, x, y, 16, 1.0f / 16));
    TU_OK(G.ctx, dsgd_model_get_grads(cpu, gc, np));
    TU_OK(G.ctx, dsgd_model_get_grads(cl, gl, np));
    e = tu_rel_err(gl, gc, np);
    printf("    CNN gradient, OpenCL vs CPU: rel err %.3g over %zu parameters\n", e, np);
    assert_true(e <= 1e-5);
    dsgd_model_destroy(cl);
    dsgd_model_destroy(cpu);
    be.destroy(be.impl);
    tu_watchdog(0);
}

static void test_cnn_mirrored_cl(void **state) {
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL, *ref = NULL;
    float x[16 * 64], y[16], pc[512], pl[512];
    size_t np;
    int step;
    double e;
    (void)state;
    NEED_CL();
    memset(&d, 0, sizeof d);
    d.kind = DSGD_STRATEGY_ONE_DEVICE;
    d.model = cnn_desc();
    d.optimizer = opt_desc(DSGD_OPT_MOMENTUM);
    TU_OK(G.ctx, dsgd_strategy_create(G.ctx, &d, &ref));
    d.kind = DSGD_STRATEGY_MIRRORED;
    d.num_replicas = 2;
    d.backend_factory = cl_factory;
    d.backend_user_data = G.cl;
    TU_OK(G.ctx, dsgd_strategy_create(G.ctx, &d, &s));
    np = dsgd_model_num_params(dsgd_strategy_model(s, 0));
    for (step = 0; step < 10; ++step) {
        cnn_data(60 + (uint64_t)step, x, y, 16);
        TU_OK(G.ctx, dsgd_strategy_train_step(ref, x, y, 16, NULL));
        TU_OK(G.ctx, dsgd_strategy_train_step(s, x, y, 16, NULL));
        tu_assert_replicas_identical(G.ctx, s);
    }
    TU_OK(G.ctx, dsgd_model_get_params(dsgd_strategy_model(ref, 0), pc, np));
    TU_OK(G.ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), pl, np));
    e = tu_rel_err(pl, pc, np);
    printf("    CNN mirrored N=2 on OpenCL vs one_device on the CPU: rel err %.3g\n", e);
    assert_true(e <= 1e-4);
    dsgd_strategy_destroy(s);
    dsgd_strategy_destroy(ref);
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cnn_gradient_cl_vs_cpu),
        cmocka_unit_test(test_cnn_mirrored_cl),
        cmocka_unit_test(test_contract_momentum_n2),
        cmocka_unit_test(test_contract_momentum_n4),
        cmocka_unit_test(test_contract_adam_n1),
        cmocka_unit_test(test_contract_adam_n2),
        cmocka_unit_test(test_contract_adam_n4),
        cmocka_unit_test(test_contract_momentum_n4_host),
        cmocka_unit_test(test_contract_momentum_n9),
        cmocka_unit_test(test_paths_bitwise_equal),
        cmocka_unit_test(test_host_waits_per_step),
        cmocka_unit_test(test_comm_hooks_on_opencl),
        cmocka_unit_test(test_verdict_on_device),
        cmocka_unit_test(test_central_storage_momentum_n3),
        cmocka_unit_test(test_central_storage_adam_n2_mapped),
    };
    return cmocka_run_group_tests_name("opencl mirrored strategy", tests, group_setup, group_teardown);
}
