/* test_strategy_central.c - the central-storage strategy (strategy_central.h).

   The model is test_mirrored.c's small MLP (20 -> 16 relu -> 8 tanh -> 5,
   softmax cross-entropy, 517 parameters) on the tests' seeded data.

   What is asserted, and how:
   - Central storage with N replicas x batch B trains the weights of the
     mirrored strategy with the same N and B, and of one_device with batch
     N*B, within float reassociation, after 20 steps, N = 2, 3, 4, for SGD,
     momentum and Adam (one global relative error, max |a - b| / max |b|,
     <= 1e-5, Adam 1e-4, as in test_mirrored.c). At N = 2 each gradient
     element is the sum of two floats, so central storage and mirrored give
     the same bits.
   - After every step all replicas hold bitwise identical parameters; the
     step infos count the steps and follow the learning-rate schedule
     (warmup) as mirrored's do.
   - N = 1 gives one_device's bits; so does a global-norm clip (the clip
     sees the global gradient: central storage with clip_norm equals
     one_device with clip_norm on N*B).
   - Replicas whose backends have no host pointers (the staging path) give
     the bits of the in-place path.
   - Per-variable aggregation (SUM on one variable) equals mirrored's.
   - A NaN in one replica's shard: every replica skips (SKIP: weights and
     optimizer state unchanged, then the same bits as a run without the bad
     batch) or the step fails with DSGD_ERR_NON_FINITE (ERROR).
   - gradient_path DEVICE is refused with a message; the kind's name.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <signal.h>

enum { IN = 20, OUT = 5, NPARAMS = 20 * 16 + 16 + 16 * 8 + 8 + 8 * 5 + 5, MAXN = 4, B = 6, STEPS = 20 };

static const dsgd_layer_desc LAYERS[3] = {
    {16, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

static dsgd_strategy_desc strat_desc(dsgd_strategy_kind kind, int n, int max_batch, dsgd_optimizer_kind opt) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 3;
    d.model.max_batch = max_batch;
    d.model.seed = 20240611u;
    d.optimizer.kind = opt;
    d.optimizer.lr = opt == DSGD_OPT_ADAM ? 0.005f : opt == DSGD_OPT_MOMENTUM ? 0.05f : 0.1f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 10.0;
    return d;
}

static dsgd_strategy *strat_make(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, d, &s));
    assert_non_null(s);
    return s;
}

static void make_batch(tu_rng *r, float *x, float *y, int count) {
    int i;
    tu_fill(r, x, (size_t)count * IN, -1.0f, 1.0f);
    for (i = 0; i < count; ++i) y[i] = (float)tu_below(r, OUT);
}

static void get_params(dsgd_ctx *ctx, dsgd_strategy *s, int replica, float *dst) {
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, replica), dst, NPARAMS));
}

/* The no-host-pointer CPU backend: the gradients go through staging. */
static dsgd_result no_host_ptr_factory(void *user, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_result r = dsgd_cpu_backend_create(ctx, out);
    (void)user;
    (void)replica;
    out->buffer_host_ptr = NULL;
    return r;
}

/* A run of STEPS steps of `kinds` side by side on the same global batches:
   kinds[0] with n replicas x B, the others as given; every strategy's
   weights after the run go to out[k]. Checks the step infos against
   kinds[0]'s and that every strategy's replicas stay identical. */
typedef struct run_case {
    int count;
    dsgd_strategy_desc d[3];
} run_case;

static void run_side_by_side(const run_case *c, float out[][NPARAMS]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s[3];
    int global = c->d[0].num_replicas * B, k, step;
    float *x = tu_floats((size_t)global * IN), y[MAXN * B];
    tu_rng rng = tu_rng_make(4242);
    for (k = 0; k < c->count; ++k) s[k] = strat_make(ctx, &c->d[k]);
    for (step = 0; step < STEPS; ++step) {
        dsgd_step_info info[3];
        make_batch(&rng, x, y, global);
        for (k = 0; k < c->count; ++k) {
            memset(&info[k], 0xff, sizeof(info[k]));
            TU_OK(ctx, dsgd_strategy_train_step(s[k], x, y, global, &info[k]));
            assert_int_equal((int)info[k].step, step);
            assert_int_equal(info[k].skipped, 0);
            assert_true(info[k].lr == info[0].lr);
            tu_assert_replicas_identical(ctx, s[k]);
        }
    }
    for (k = 0; k < c->count; ++k) {
        get_params(ctx, s[k], 0, out[k]);
        dsgd_strategy_destroy(s[k]);
    }
    free(x);
    dsgd_ctx_destroy(ctx);
}

static void test_matches_mirrored_and_one_device(void **state) {
    static const dsgd_optimizer_kind opts[3] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM};
    float w[3][NPARAMS];
    int n, k;
    (void)state;
    tu_watchdog(120);
    for (n = 2; n <= MAXN; ++n)
        for (k = 0; k < 3; ++k) {
            run_case c;
            double tol = opts[k] == DSGD_OPT_ADAM ? 1e-4 : 1e-5, em, e1;
            c.count = 3;
            c.d[0] = strat_desc(DSGD_STRATEGY_CENTRAL_STORAGE, n, B, opts[k]);
            c.d[1] = strat_desc(DSGD_STRATEGY_MIRRORED, n, B, opts[k]);
            c.d[2] = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, n * B, opts[k]);
            c.d[0].optimizer.schedule.warmup_steps = 5; /* the lr follows the schedule */
            c.d[0].optimizer.schedule.warmup_start_lr = 0.001f;
            c.d[1].optimizer = c.d[2].optimizer = c.d[0].optimizer;
            run_side_by_side(&c, w);
            em = tu_rel_err(w[0], w[1], NPARAMS);
            e1 = tu_rel_err(w[0], w[2], NPARAMS);
            printf("    N=%d opt %d: central vs mirrored %.3g, vs one_device %.3g\n", n, (int)opts[k], em, e1);
            if (!(em <= tol) || !(e1 <= tol)) fail_msg("N=%d opt %d: relative errors %.3g, %.3g > %.0e", n, (int)opts[k], em, e1, tol);
            if (n == 2 && memcmp(w[0], w[1], sizeof(w[0])) != 0) fail_msg("N=2 opt %d: central and mirrored differ in bits", (int)opts[k]);
        }
    tu_watchdog(0);
}

static void test_bitwise_cases(void **state) {
    float w[3][NPARAMS];
    run_case c;
    (void)state;
    tu_watchdog(120);
    /* N = 1: one_device's bits */
    c.count = 2;
    c.d[0] = strat_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 1, B, DSGD_OPT_ADAM);
    c.d[1] = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, B, DSGD_OPT_ADAM);
    run_side_by_side(&c, w);
    assert_memory_equal(w[0], w[1], sizeof(w[0]));
    /* the clip sees the global gradient: N = 3 with clip_norm against
       itself without host pointers (staging), and close to one_device */
    c.count = 3;
    c.d[0] = strat_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 3, B, DSGD_OPT_MOMENTUM);
    c.d[0].optimizer.clip_norm = 0.05f;
    c.d[1] = c.d[0];
    c.d[1].backend_factory = no_host_ptr_factory;
    c.d[2] = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, 3 * B, DSGD_OPT_MOMENTUM);
    c.d[2].optimizer.clip_norm = 0.05f;
    run_side_by_side(&c, w);
    assert_memory_equal(w[0], w[1], sizeof(w[0]));
    TU_NEAR(tu_rel_err(w[0], w[2], NPARAMS), 0.0, 1e-5);
    tu_watchdog(0);
}

static void test_aggregation(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *a, *b;
    dsgd_strategy_desc da = strat_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 2, B, DSGD_OPT_SGD);
    dsgd_strategy_desc db = strat_desc(DSGD_STRATEGY_MIRRORED, 2, B, DSGD_OPT_SGD);
    float x[2 * B * IN], y[2 * B], pa[NPARAMS], pb[NPARAMS];
    tu_rng rng = tu_rng_make(77);
    int step;
    (void)state;
    tu_watchdog(60);
    a = strat_make(ctx, &da);
    b = strat_make(ctx, &db);
    TU_OK(ctx, dsgd_strategy_set_aggregation(a, "dense1/kernel", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
    TU_OK(ctx, dsgd_strategy_set_aggregation(b, "dense1/kernel", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
    TU_OK(ctx, dsgd_strategy_set_aggregation(a, "dense2/bias", DSGD_AGG_ONLY_FIRST_REPLICA, DSGD_SYNC_AUTO));
    TU_OK(ctx, dsgd_strategy_set_aggregation(b, "dense2/bias", DSGD_AGG_ONLY_FIRST_REPLICA, DSGD_SYNC_AUTO));
    for (step = 0; step < 5; ++step) {
        make_batch(&rng, x, y, 2 * B);
        TU_OK(ctx, dsgd_strategy_train_step(a, x, y, 2 * B, NULL));
        TU_OK(ctx, dsgd_strategy_train_step(b, x, y, 2 * B, NULL));
    }
    get_params(ctx, a, 1, pa);
    get_params(ctx, b, 1, pb);
    assert_memory_equal(pa, pb, sizeof(pa)); /* N = 2: two floats per element, any order */
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_nonfinite(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 3, 4, DSGD_OPT_ADAM);
    dsgd_strategy *a, *b;
    float x1[12 * IN], y1[12], x2[12 * IN], y2[12], xbad[12 * IN], before[NPARAMS], after[NPARAMS], pb[NPARAMS];
    dsgd_step_info info;
    tu_rng rng = tu_rng_make(8);
    (void)state;
    tu_watchdog(60);
    make_batch(&rng, x1, y1, 12);
    make_batch(&rng, x2, y2, 12);
    memcpy(xbad, x2, sizeof(xbad));
    xbad[9 * IN + 3] = NAN; /* sample 9: replica 2's shard */
    a = strat_make(ctx, &d);
    b = strat_make(ctx, &d);
    TU_OK(ctx, dsgd_strategy_train_step(a, x1, y1, 12, NULL));
    get_params(ctx, a, 0, before);
    TU_OK(ctx, dsgd_strategy_train_step(a, xbad, y2, 12, &info));
    assert_int_equal(info.skipped, 1);
    get_params(ctx, a, 2, after);
    assert_memory_equal(before, after, sizeof(before));
    TU_OK(ctx, dsgd_strategy_train_step(a, x2, y2, 12, &info));
    assert_int_equal((int)info.step, 1);
    TU_OK(ctx, dsgd_strategy_train_step(b, x1, y1, 12, NULL));
    TU_OK(ctx, dsgd_strategy_train_step(b, x2, y2, 12, NULL));
    get_params(ctx, a, 1, after);
    get_params(ctx, b, 1, pb);
    assert_memory_equal(after, pb, sizeof(pb)); /* the skip moved no Adam moment */
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);
    d.nonfinite = DSGD_NONFINITE_ERROR;
    a = strat_make(ctx, &d);
    TU_ERR(ctx, DSGD_ERR_NON_FINITE, dsgd_strategy_train_step(a, xbad, y2, 12, NULL));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "replica 2"));
    assert_int_equal(dsgd_strategy_failed(a), 0); /* agreed before the update: still usable */
    TU_OK(ctx, dsgd_strategy_train_step(a, x1, y1, 12, NULL));
    dsgd_strategy_destroy(a);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_desc_and_name(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 2, B, DSGD_OPT_SGD);
    dsgd_strategy *s = NULL;
    (void)state;
    d.gradient_path = DSGD_GRADIENTS_DEVICE;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "central_storage sums the gradients on the host"));
    assert_string_equal(dsgd_strategy_kind_name(DSGD_STRATEGY_CENTRAL_STORAGE), "central_storage");
    d.gradient_path = DSGD_GRADIENTS_AUTO;
    s = strat_make(ctx, &d);
    assert_int_equal(dsgd_strategy_gradient_path(s), DSGD_GRADIENTS_HOST);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_mirrored_and_one_device),
        cmocka_unit_test(test_bitwise_cases),
        cmocka_unit_test(test_aggregation),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_desc_and_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
