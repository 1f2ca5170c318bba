/* test_opt_outs.c - a build with every part left out (LEAVING PARTS OUT in
   distsgd.h: DSGD_NO_SIMNET, _PS, _COMPRESS, _ELASTIC, _LOCAL, _TF_CONFIG).

   - The README's program (mirrored, 2 replicas, 2 -> 8 tanh -> 2, Adam lr
     0.05, 300 steps of XOR at global batch 4) still learns XOR (accuracy
     1), and its first 5 steps give, bit for bit, a serial reference's
     weights: the synchronous step of strategy_sync.h by hand (each shard's
     gradient scaled by 1 / global count on a model of its own, the two
     summed in rank order, one optimizer step); at 2 replicas each element
     is one float addition, so any all-reduce gives these bits. The
     replicas stay bitwise identical.
   - The kinds left out, parameter_server and local, are refused with
     DSGD_ERR_UNSUPPORTED, out NULL and a message naming the kind and its
     define; they keep their names.
   - A desc asking for elastic training is refused the same way, naming
     DSGD_NO_ELASTIC; with min_replicas 0 it is accepted and trains.
   - A kept part end to end: a strategy checkpoint saved after 5 steps and
     restored into a fresh strategy gives the saved weights bit for bit,
     and one more step on each gives the same bits (the optimizer state
     came along).

   Build: make test (this file compiles the implementation itself, with the
   parts left out).
   distsgd-test: own-implementation */
#define DSGD_NO_SIMNET
#define DSGD_NO_PS
#define DSGD_NO_COMPRESS
#define DSGD_NO_ELASTIC
#define DSGD_NO_LOCAL
#define DSGD_NO_TF_CONFIG
#define DISTSGD_IMPLEMENTATION
#include "harness.h"

enum { NP = 2 * 8 + 8 + 8 * 2 + 2, REF_STEPS = 5 };

static const float X[8] = {0, 0, 0, 1, 1, 0, 1, 1}, Y[4] = {0, 1, 1, 0};
static const dsgd_layer_desc LAYERS[2] = {{8, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

/* The README's strategy desc, of another kind if asked. */
static dsgd_strategy_desc xor_desc(dsgd_strategy_kind kind) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = 2;
    d.model.input_dim = 2;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = 4;
    d.model.seed = 1;
    d.optimizer.kind = DSGD_OPT_ADAM;
    d.optimizer.lr = 0.05f;
    d.timeout_s = 10.0;
    return d;
}

static dsgd_strategy *xor_strategy(dsgd_ctx *ctx) {
    dsgd_strategy_desc d = xor_desc(DSGD_STRATEGY_MIRRORED);
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(s);
    assert_int_equal((int)dsgd_model_num_params(dsgd_strategy_model(s, 0)), NP);
    return s;
}

static void get_params(dsgd_ctx *ctx, dsgd_strategy *s, float *dst) {
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), dst, NP));
}

static void test_readme_program(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = xor_desc(DSGD_STRATEGY_MIRRORED);
    dsgd_strategy *s = xor_strategy(ctx);
    dsgd_model *m[2];
    dsgd_optimizer *o;
    float p[NP], want[NP], g1[NP], *g0;
    dsgd_step_info info;
    dsgd_metrics mt;
    int step, r;
    size_t i;
    (void)state;
    for (r = 0; r < 2; ++r) TU_OK(ctx, dsgd_model_create(ctx, &d.model, &m[r]));
    TU_OK(ctx, dsgd_optimizer_create(m[0], &d.optimizer, &o));
    TU_OK(ctx, dsgd_model_get_params(m[0], want, NP));
    get_params(ctx, s, p);
    assert_memory_equal(p, want, sizeof(p)); /* same seed, same start */
    for (step = 0; step < 300; ++step) {
        TU_OK(ctx, dsgd_strategy_train_step(s, X, Y, 4, &info));
        assert_int_equal(info.skipped, 0);
        if (step >= REF_STEPS) continue;
        /* the reference: replica r's shard is samples 2r and 2r + 1 */
        TU_OK(ctx, dsgd_model_set_params(m[1], want, NP));
        for (r = 0; r < 2; ++r) TU_OK(ctx, dsgd_model_compute_gradients(m[r], X + 4 * r, Y + 2 * r, 2, 0.25f));
        TU_OK(ctx, dsgd_model_get_grads(m[1], g1, NP));
        g0 = dsgd_model_host_grads(m[0]);
        assert_non_null(g0);
        for (i = 0; i < NP; ++i) g0[i] += g1[i];
        TU_OK(ctx, dsgd_optimizer_step(o));
        TU_OK(ctx, dsgd_model_get_params(m[0], want, NP));
        get_params(ctx, s, p);
        if (memcmp(p, want, sizeof(p)) != 0)
            fail_msg("step %d: the mirrored weights differ from the serial reference's (rel err %.3g)", step,
                     tu_rel_err(p, want, NP));
        tu_assert_replicas_identical(ctx, s);
    }
    TU_OK(ctx, dsgd_strategy_eval_batch(s, X, Y, 4));
    TU_OK(ctx, dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &mt));
    assert_true(mt.count == 4.0);
    if (!(mt.correct / mt.count == 1.0)) fail_msg("accuracy %.2f after 300 steps, want 1", mt.correct / mt.count);
    dsgd_optimizer_destroy(o);
    for (r = 0; r < 2; ++r) dsgd_model_destroy(m[r]);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_kinds_left_out(void **state) {
    static const dsgd_strategy_kind kinds[2] = {DSGD_STRATEGY_PARAMETER_SERVER, DSGD_STRATEGY_LOCAL};
    static const char *const names[2] = {"parameter_server", "local"}, *const defines[2] = {"DSGD_NO_PS is defined",
                                                                                           "DSGD_NO_LOCAL is defined"};
    dsgd_ctx *ctx = tu_ctx();
    int k;
    (void)state;
    for (k = 0; k < 2; ++k) {
        dsgd_strategy_desc d = xor_desc(kinds[k]);
        dsgd_strategy *s = NULL;
        char kind[64];
        const char *msg;
        assert_string_equal(dsgd_strategy_kind_name(kinds[k]), names[k]);
        TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_strategy_create(ctx, &d, &s));
        assert_null(s);
        msg = dsgd_ctx_last_error(ctx);
        snprintf(kind, sizeof kind, "the %s kind was left out", names[k]);
        if (!strstr(msg, kind) || !strstr(msg, defines[k]))
            fail_msg("%s: message \"%s\" names not the kind and its define", names[k], msg);
    }
    dsgd_ctx_destroy(ctx);
}

static void test_elastic_left_out(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = xor_desc(DSGD_STRATEGY_MIRRORED);
    dsgd_strategy *s = NULL;
    const char *msg;
    (void)state;
    d.elastic.min_replicas = 1;
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    msg = dsgd_ctx_last_error(ctx);
    if (!strstr(msg, "elastic training was left out") || !strstr(msg, "DSGD_NO_ELASTIC is defined"))
        fail_msg("message \"%s\" names not elastic training and DSGD_NO_ELASTIC", msg);
    d.elastic.min_replicas = 0;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(s);
    TU_OK(ctx, dsgd_strategy_train_step(s, X, Y, 4, NULL));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_checkpoint_kept(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *a = xor_strategy(ctx), *b = xor_strategy(ctx);
    float pa[NP], pb[NP];
    char dir[64], path[128];
    int step;
    (void)state;
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/xor.ckpt", dir);
    for (step = 0; step < REF_STEPS; ++step) TU_OK(ctx, dsgd_strategy_train_step(a, X, Y, 4, NULL));
    TU_OK(ctx, dsgd_strategy_save(a, path, NULL));
    get_params(ctx, a, pa);
    get_params(ctx, b, pb);
    assert_true(memcmp(pa, pb, sizeof(pa)) != 0); /* the restore has something to do */
    TU_OK(ctx, dsgd_strategy_restore(b, path, NULL));
    get_params(ctx, b, pb);
    assert_memory_equal(pa, pb, sizeof(pa));
    tu_assert_replicas_identical(ctx, b);
    TU_OK(ctx, dsgd_strategy_train_step(a, X, Y, 4, NULL));
    TU_OK(ctx, dsgd_strategy_train_step(b, X, Y, 4, NULL));
    get_params(ctx, a, pa);
    get_params(ctx, b, pb);
    assert_memory_equal(pa, pb, sizeof(pa));
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);
    dsgd_ctx_destroy(ctx);
    tu_rmdir_files(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_readme_program),
        cmocka_unit_test(test_kinds_left_out),
        cmocka_unit_test(test_elastic_left_out),
        cmocka_unit_test(test_checkpoint_kept),
    };
    tu_watchdog(60); /* a hang fails the run instead of blocking it */
    return cmocka_run_group_tests(tests, NULL, NULL);
}
