/* test_cl_devices.c - mirrored replicas on two OpenCL devices of one context
   never write one buffer from both devices.

   GPU runtimes keep a copy of a multi-device cl_mem per device and move the
   whole buffer to the device that uses it next, so two devices writing
   disjoint blocks of one buffer can lose one's blocks. PoCL's CPU devices
   share host memory and would never show it; this test counts instead. The
   OpenCL backend counts, per backend, the operations that wrote a buffer
   made on another device (dsgd_cl_backend_foreign_writes: write, copy,
   fill, every kernel's output, GEMM's C, a map for writing), and the test
   reads that counter.

   Two devices: main sets POCL_DEVICES="pthread pthread" (unless already
   set) before the first OpenCL call, and the context opens two devices.
   Where the platform gives fewer, every test is skipped with a message
   (reported as skipped, never as passed).

   What is asserted:
   - The checker fires: a backend on device 1 filling, copying into or
     mapping for writing a buffer made on device 0 counts 1 each; the same
     operations on its own buffers, or reading device 0's, count nothing.
     can_access is 1 between backends of one device and 0 across devices;
     sum_across refuses a buffer made on another device.
   - MIRRORED, 2 and 4 replicas placed round-robin on the 2 devices, AUTO:
     the HOST path is chosen even with buffers outside host-shared memory
     (host_visible = -1, where one device would take DEVICE), and after 20
     SGD-with-momentum steps no backend has written a buffer of the other
     device (0 counted). Planting one such write afterwards (replica 1's
     backend fills replica 0's gradient) counts 1.
   - gradient_path DEVICE across the two devices is refused at creation,
     with both devices named in the message.
   - The weights equal, bit for bit, those of the same run with every
     replica on device 0 (DEVICE path with host_visible = -1, and HOST):
     the two devices are the same PoCL device running the same kernels, and
     the HOST path with the DIRECT all-reduce sums in the DEVICE path's
     order (see BACKENDS in backend.h). Different device models would agree
     only to rounding.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"
#include "../distsgd_cl.h"
#include "cl_mlp.h"

enum { MAXN = 4 };

/* ---------------------------------------------------------------- fixture */

static struct {
    int have_two;
    dsgd_ctx *ctx;
    dsgd_cl_context *cl;
    int host_visible; /* the factory's dsgd_cl_backend_desc.host_visible */
    int spread;       /* 1: replica r on device r % 2; 0: all on device 0 */
} G;

static int group_setup(void **state) {
    dsgd_cl_context_desc cd;
    int n = 0;
    (void)state;
    if (dsgd_ctx_create(NULL, &G.ctx) != DSGD_OK) return -1;
    if (dsgd_cl_list_devices(G.ctx, NULL, 0, &n) != DSGD_OK) {
        fprintf(stderr, "test_cl_devices: listing OpenCL devices failed: %s\n", dsgd_ctx_last_error(G.ctx));
        return -1;
    }
    if (n < 2) {
        fprintf(stderr,
                "test_cl_devices: %d OpenCL device(s) (POCL_DEVICES=%s): two are needed, every test is skipped\n", n,
                getenv("POCL_DEVICES") ? getenv("POCL_DEVICES") : "(unset)");
        return 0;
    }
    memset(&cd, 0, sizeof cd);
    cd.tuning = DSGD_CL_TUNING_OFF;
    cd.max_devices = 2;
    if (dsgd_cl_context_create(G.ctx, &cd, &G.cl) != DSGD_OK) {
        fprintf(stderr, "test_cl_devices: %d OpenCL devices but the context failed: %s\n", n,
                dsgd_ctx_last_error(G.ctx));
        return -1;
    }
    if (dsgd_cl_context_num_devices(G.cl) < 2) {
        fprintf(stderr, "test_cl_devices: the context opened %d device(s) of %d (DSGD_CL_DEVICE picks one?): "
                        "every test is skipped\n", dsgd_cl_context_num_devices(G.cl), n);
        return 0;
    }
    G.have_two = 1;
    fprintf(stderr, "test_cl_devices: device 0: %s, device 1: %s\n",
            dsgd_cl_context_device_info(G.cl, 0)->device_name, dsgd_cl_context_device_info(G.cl, 1)->device_name);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    dsgd_cl_context_destroy(G.cl);
    dsgd_ctx_destroy(G.ctx);
    memset(&G, 0, sizeof G);
    return 0;
}

#define NEED_TWO()                               \
    do {                                         \
        if (!G.have_two) skip();                 \
        dsgd_ctx_clear_error(G.ctx);             \
        tu_watchdog_for("test_cl_devices", 300); \
    } while (0)

/* The write counter of an OpenCL backend. */
static unsigned long foreign_writes(const dsgd_backend_i *be) {
    assert_true(dsgd_cl_is_backend(be));
    return dsgd_cl_backend_foreign_writes(be);
}

static dsgd_backend_i backend_on(int device) {
    dsgd_cl_backend_desc bd;
    dsgd_backend_i be;
    memset(&bd, 0, sizeof bd);
    bd.device = device;
    TU_OK(G.ctx, dsgd_cl_backend_create(G.ctx, G.cl, &bd, &be));
    return be;
}

/* ---------------------------------------------------------------- the checker */

static void test_checker_fires(void **state) {
    enum { N = 64 };
    dsgd_backend_i b0, b0b, b1;
    dsgd_buffer *a0 = NULL, *a1 = NULL;
    dsgd_ref r0, r1, refs[2];
    float host[N], *p = NULL;
    int i;
    (void)state;
    NEED_TWO();
    b0 = backend_on(0);
    b0b = backend_on(0);
    b1 = backend_on(1);
    TU_OK(G.ctx, b0.buffer_create(b0.impl, N, &a0));
    TU_OK(G.ctx, b1.buffer_create(b1.impl, N, &a1));
    r0.buf = a0;
    r0.off = 0;
    r1.buf = a1;
    r1.off = 0;

    /* reach: one device yes, across devices no */
    assert_true(b0.can_access(b0.impl, &b0));
    assert_true(b0.can_access(b0.impl, &b0b));
    assert_true(b0b.can_access(b0b.impl, &b0));
    assert_false(b0.can_access(b0.impl, &b1));
    assert_false(b1.can_access(b1.impl, &b0));
    assert_non_null(strstr(b0.device_name(b0.impl), "(device 0 of its context)"));
    assert_non_null(strstr(b1.device_name(b1.impl), "(device 1 of its context)"));

    /* own buffers, and reading the other device's: nothing counted */
    for (i = 0; i < N; ++i) host[i] = (float)i;
    TU_OK(G.ctx, b0.write(b0.impl, r0, host, N));
    TU_OK(G.ctx, b1.fill(b1.impl, r1, 2.0f, N));
    TU_OK(G.ctx, b1.copy(b1.impl, r1, r0, N)); /* reads device 0's buffer */
    TU_OK(G.ctx, b0b.scale(b0b.impl, r0, 0.5f, N));
    TU_OK(G.ctx, b1.finish(b1.impl));
    TU_OK(G.ctx, b0.finish(b0.impl));
    TU_OK(G.ctx, b0b.finish(b0b.impl));
    assert_int_equal(foreign_writes(&b0), 0);
    assert_int_equal(foreign_writes(&b0b), 0);
    assert_int_equal(foreign_writes(&b1), 0);

    /* planted: device 1 writes device 0's buffer, three ways */
    TU_OK(G.ctx, b1.fill(b1.impl, r0, 1.0f, N));
    assert_int_equal(foreign_writes(&b1), 1);
    TU_OK(G.ctx, b1.copy(b1.impl, r0, r1, N));
    assert_int_equal(foreign_writes(&b1), 2);
    TU_OK(G.ctx, b1.map(b1.impl, r0, N, &p));
    TU_OK(G.ctx, b1.unmap(b1.impl, r0, p));
    assert_int_equal(foreign_writes(&b1), 3);
    TU_OK(G.ctx, b1.finish(b1.impl));
    assert_int_equal(foreign_writes(&b0), 0);

    /* sum_across reaches one device's buffers only */
    refs[0] = r1;
    refs[1] = r0;
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, b1.sum_across(b1.impl, refs, 2, 0, N));
    assert_non_null(strstr(dsgd_ctx_last_error(G.ctx), "(device 0)"));
    assert_int_equal(foreign_writes(&b1), 3);
    dsgd_ctx_clear_error(G.ctx);
    refs[0] = r0;
    TU_OK(G.ctx, b0.sum_across(b0.impl, refs, 1, 0, N));
    TU_OK(G.ctx, b0.finish(b0.impl));

    b0.buffer_destroy(b0.impl, a0);
    b1.buffer_destroy(b1.impl, a1);
    b0.destroy(b0.impl);
    b0b.destroy(b0b.impl);
    b1.destroy(b1.impl);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- mirrored */

static dsgd_result factory(void *user_data, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_cl_backend_desc bd;
    (void)user_data;
    memset(&bd, 0, sizeof bd);
    bd.device = G.spread ? replica % 2 : 0;
    bd.host_visible = G.host_visible;
    return dsgd_cl_backend_create(ctx, G.cl, &bd, out);
}

static dsgd_strategy_desc mirrored_desc(int n, dsgd_gradient_path path) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof d);
    d.kind = DSGD_STRATEGY_MIRRORED;
    d.num_replicas = n;
    cl_mlp_model(&d.model, B);
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.05f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 60.0;
    d.gradient_path = path;
    d.algorithm = DSGD_ALLREDUCE_DIRECT; /* the DEVICE path's order of summation */
    d.backend_factory = factory;
    return d;
}

static const dsgd_backend_i *replica_backend(dsgd_strategy *s, int r) {
    return dsgd_model_backend(dsgd_strategy_model(s, r));
}

static unsigned long total_foreign_writes(dsgd_strategy *s, int n) {
    unsigned long t = 0;
    int r;
    for (r = 0; r < n; ++r) t += foreign_writes(replica_backend(s, r));
    return t;
}

/* STEPS steps of n replicas, spread over the two devices or all on device
   0, gradients by `path`; the final parameters of replica 0 into out. The
   replicas agree bitwise after every step. Returns the path taken. */
static dsgd_gradient_path train(int n, int spread, int host_visible, dsgd_gradient_path path, float *out,
                                unsigned long *foreign) {
    enum { GB = MAXN * B };
    static float x[GB * IN], y[GB];
    float pr[NPARAMS];
    dsgd_strategy_desc d = mirrored_desc(n, path);
    dsgd_strategy *s = NULL;
    tu_rng rng = tu_rng_make(4242u + (unsigned)n);
    dsgd_gradient_path took;
    int step, i, r;
    G.spread = spread;
    G.host_visible = host_visible;
    TU_OK(G.ctx, dsgd_strategy_create(G.ctx, &d, &s));
    took = dsgd_strategy_gradient_path(s);
    for (r = 0; r < n; ++r) {
        assert_true(dsgd_cl_backend_device(replica_backend(s, r)) ==
                    dsgd_cl_context_device(G.cl, spread ? r % 2 : 0));
    }
    for (step = 1; step <= STEPS; ++step) {
        tu_fill(&rng, x, (size_t)(n * B) * IN, -1.0f, 1.0f);
        for (i = 0; i < n * B; ++i) y[i] = (float)tu_below(&rng, OUT);
        TU_OK(G.ctx, dsgd_strategy_train_step(s, x, y, n * B, NULL));
        TU_OK(G.ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), out, NPARAMS));
        for (r = 1; r < n; ++r) {
            TU_OK(G.ctx, dsgd_model_get_params(dsgd_strategy_model(s, r), pr, NPARAMS));
            if (memcmp(out, pr, sizeof pr) != 0) fail_msg("N=%d step %d: replica %d differs from 0", n, step, r);
        }
    }
    *foreign = total_foreign_writes(s, n);
    if (spread && *foreign == 0) {
        /* planted: replica 1 (device 1) writes replica 0's gradient (device 0) */
        const dsgd_backend_i *b1 = replica_backend(s, 1);
        TU_OK(G.ctx, b1->fill(b1->impl, dsgd_model_grads(dsgd_strategy_model(s, 0)), 0.0f, 1));
        TU_OK(G.ctx, b1->finish(b1->impl));
        assert_int_equal(total_foreign_writes(s, n), 1);
    }
    dsgd_strategy_destroy(s);
    return took;
}

static void two_devices(int n) {
    float spread[NPARAMS], one_dev[NPARAMS], one_host[NPARAMS];
    unsigned long fw = 0;
    int hv;
    /* the references: every replica on device 0, DEVICE and HOST paths */
    assert_int_equal(train(n, 0, -1, DSGD_GRADIENTS_AUTO, one_dev, &fw), DSGD_GRADIENTS_DEVICE);
    assert_int_equal(fw, 0);
    assert_int_equal(train(n, 0, 0, DSGD_GRADIENTS_HOST, one_host, &fw), DSGD_GRADIENTS_HOST);
    assert_int_equal(fw, 0);
    assert_memory_equal(one_dev, one_host, sizeof one_dev);
    for (hv = -1; hv <= 0; ++hv) {
        /* AUTO over two devices: HOST, even where one device would take DEVICE */
        assert_int_equal(train(n, 1, hv, DSGD_GRADIENTS_AUTO, spread, &fw), DSGD_GRADIENTS_HOST);
        if (fw != 0) fail_msg("N=%d host_visible %d: %lu writes to a buffer of the other device", n, hv, fw);
        if (memcmp(spread, one_dev, sizeof spread) != 0)
            fail_msg("N=%d host_visible %d: two devices trained other weights than one (max rel %.3g)", n, hv,
                     tu_rel_err(spread, one_dev, NPARAMS));
    }
    fprintf(stderr, "test_cl_devices: N=%d on 2 devices: HOST path, 0 foreign writes, weights bitwise equal\n", n);
    tu_watchdog(0);
}

static void test_mirrored_two_devices_n2(void **state) {
    (void)state;
    NEED_TWO();
    two_devices(2);
}

static void test_mirrored_two_devices_n4(void **state) {
    (void)state;
    NEED_TWO();
    two_devices(4);
}

/* DEVICE across two devices is refused, naming both. */
static void test_device_path_refused(void **state) {
    dsgd_strategy_desc d = mirrored_desc(2, DSGD_GRADIENTS_DEVICE);
    dsgd_strategy *s = NULL;
    const char *msg;
    (void)state;
    NEED_TWO();
    G.spread = 1;
    G.host_visible = -1;
    TU_ERR(G.ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(G.ctx, &d, &s));
    assert_null(s);
    msg = dsgd_ctx_last_error(G.ctx);
    fprintf(stderr, "test_cl_devices: DEVICE refused: %s\n", msg);
    assert_non_null(strstr(msg, "gradient_path DEVICE"));
    assert_non_null(strstr(msg, "(device 0 of its context)"));
    assert_non_null(strstr(msg, "(device 1 of its context)"));
    assert_non_null(strstr(msg, dsgd_cl_context_device_info(G.cl, 1)->device_name));
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_fires),
        cmocka_unit_test(test_device_path_refused),
        cmocka_unit_test(test_mirrored_two_devices_n2),
        cmocka_unit_test(test_mirrored_two_devices_n4),
    };
    /* two PoCL CPU devices (elsewhere the platform's own devices), before
       the first OpenCL call; a user's setting stands */
    setenv("POCL_DEVICES", "pthread pthread", 0);
    return cmocka_run_group_tests_name("opencl mirrored on two devices", tests, group_setup, group_teardown);
}
