/* test_model_custom.c - models of your own (dsgd_model_i) under every strategy,
   and batches from a dsgd_batch_fn.

   Two user models are written here:
   - "odd": a 7 -> 13 tanh -> 7-class network in plain C over the host
     pointers, with variables of odd shapes: "w" (7, 13) and "v", a
     97-vector holding the output kernel (13, 7) in its first 91 floats and
     biases for classes 0..5 in the last 6 (class 6 has none). Its gradient
     is checked against central differences in double.
   - "twin": the built-in network (20 -> 16 relu -> 5, softmax
     cross-entropy) written again in user code through the backend's
     operations, in the built-in's order, on scratch buffers of its own.

   What is asserted:
   - Layout: declared order, offsets, counts, shapes, names, aggregations,
     initial values copied, AUTO/ZEROS/drawn inits deterministic per seed.
   - Misuse: a duplicate name, a zero dimension, a bad rank, no
     compute_gradients, layers and custom together, no variables, a name too
     long, a negative dim: DSGD_ERR_INVALID_ARGUMENT with a message; read_output
     and a missing evaluate: DSGD_ERR_UNSUPPORTED.
   - The synchronous contract for "odd": MIRRORED N = 4 x B and
     CENTRAL_STORAGE N = 3 x B equal ONE_DEVICE with N*B within 1e-5 (SGD)
     relative; replicas bitwise identical.
   - "twin" and the built-in network train bitwise-equal weights and metrics
     under MIRRORED N = 2 (the interface adds no arithmetic).
   - A gradient function failing on replica 1: every replica returns an
     error (replica 1 its own, the others naming replica 1), no hang, and the
     strategy stays usable.
   - dsgd_strategy_train_step_fn handing each replica its dsgd_block_range
     slice gives the bits of dsgd_strategy_train_step (uneven, N = 3); a
     failing or oversized batch on one replica fails every replica cleanly;
     a model with input_dim 0 trains only through a batch fn; uneven inputs
     (Join): replicas running out at different steps follow ONE_DEVICE on
     the real samples within 1e-5, and a step with no sample anywhere does
     nothing.
   - A declared SUM aggregation starts the strategy at SUM: its update is
     the sum of the replicas' mean gradients.
   - The parameter servers (SYNC, 2 workers) train "odd" as MIRRORED N = 2
     does, within 1e-5.
   - Metrics a custom model adds on the host survive a checkpoint.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

/* ---------------------------------------------------------------- "odd" */

enum { OIN = 7, OH = 13, OC = 7, OV = 97, ONP = OIN * OH + OV };

typedef struct odd_state {
    int replica;      /* creation order: replica id under a strategy */
    int fail_replica; /* compute_gradients fails there on call fail_call (-1: never) */
    int fail_call;
    int calls;
} odd_state;

typedef struct odd_user {
    int created; /* atomic */
    int fail_replica, fail_call;
} odd_user;

static dsgd_result odd_create(void *user_data, dsgd_model *m, void **state) {
    odd_user *u = (odd_user *)user_data;
    odd_state *s = (odd_state *)calloc(1, sizeof(*s));
    (void)m;
    if (!s) return DSGD_ERR_OUT_OF_MEMORY;
    s->replica = u ? __atomic_fetch_add(&u->created, 1, __ATOMIC_SEQ_CST) : 0;
    s->fail_replica = u ? u->fail_replica : -1;
    s->fail_call = u ? u->fail_call : -1;
    *state = s;
    return DSGD_OK;
}

static void odd_destroy(void *state) { free(state); }

/* Forward of one sample: h (OH), z (OC). */
static void odd_forward(const float *p, const float *x, float *h, double *z) {
    const float *W = p, *V = p + OIN * OH, *c = V + OH * OC;
    int i, j, k;
    for (j = 0; j < OH; ++j) {
        float a = 0.0f;
        for (i = 0; i < OIN; ++i) a += x[i] * W[i * OH + j];
        h[j] = tanhf(a);
    }
    for (k = 0; k < OC; ++k) {
        float s = k < 6 ? c[k] : 0.0f;
        for (j = 0; j < OH; ++j) s += h[j] * V[j * OC + k];
        z[k] = s;
    }
}

/* Loss of one sample from z; p (OC) gets softmax(z); returns whether argmax is y. */
static double odd_loss(const double *z, int y, double *p, int *correct) {
    double mx = z[0], sum = 0.0;
    int k, arg = 0;
    for (k = 1; k < OC; ++k)
        if (z[k] > mx) mx = z[k], arg = k;
    for (k = 0; k < OC; ++k) sum += exp(z[k] - mx);
    for (k = 0; k < OC; ++k) p[k] = exp(z[k] - mx) / sum;
    *correct = arg == y;
    return log(sum) + mx - z[y];
}

static dsgd_result odd_metrics_of(dsgd_model *m, const dsgd_batch *b, float scale, dsgd_metrics *mt, int grads) {
    const float *p = dsgd_model_host_params(m);
    float *g = dsgd_model_host_grads(m);
    int n, i, j, k;
    if (!p || !g) return dsgd_ctx_set_error(dsgd_model_ctx(m), DSGD_ERR_UNSUPPORTED, "odd: needs host pointers");
    for (n = 0; n < b->count; ++n) {
        const float *x = b->x + (size_t)n * OIN;
        int y = (int)b->y[n], correct;
        float h[OH], dz[OC], dh[OH];
        double z[OC], sm[OC];
        if (y < 0 || y >= OC) return dsgd_ctx_set_error(dsgd_model_ctx(m), DSGD_ERR_INVALID_ARGUMENT, "odd: label %d", y);
        odd_forward(p, x, h, z);
        mt->loss_sum += odd_loss(z, y, sm, &correct);
        mt->correct += correct;
        if (!grads) continue;
        for (k = 0; k < OC; ++k) dz[k] = scale * (float)(sm[k] - (k == y));
        for (j = 0; j < OH; ++j) {
            float s = 0.0f;
            for (k = 0; k < OC; ++k) {
                g[OIN * OH + j * OC + k] += h[j] * dz[k];
                s += dz[k] * p[OIN * OH + j * OC + k];
            }
            dh[j] = s * (1.0f - h[j] * h[j]);
        }
        for (k = 0; k < 6; ++k) g[OIN * OH + OH * OC + k] += dz[k];
        for (i = 0; i < OIN; ++i)
            for (j = 0; j < OH; ++j) g[i * OH + j] += x[i] * dh[j];
    }
    return DSGD_OK;
}

static dsgd_result odd_gradients(void *state, dsgd_model *m, const dsgd_batch *b, float scale, dsgd_metrics *mt) {
    odd_state *s = (odd_state *)state;
    if (s->replica == s->fail_replica && s->calls++ == s->fail_call)
        return dsgd_ctx_set_error(dsgd_model_ctx(m), DSGD_ERR_BACKEND, "odd: failing on purpose on replica %d",
                                  s->replica);
    return odd_metrics_of(m, b, scale, mt, 1);
}

static dsgd_result odd_evaluate(void *state, dsgd_model *m, const dsgd_batch *b, dsgd_metrics *mt) {
    (void)state;
    return odd_metrics_of(m, b, 0.0f, mt, 0);
}

static const dsgd_model_i odd_model = {"odd", odd_create, odd_destroy, odd_gradients, odd_evaluate, 0};

static dsgd_variable_desc odd_vars[2];

static dsgd_model_desc odd_desc(odd_user *u) {
    dsgd_model_desc d;
    memset(&d, 0, sizeof(d));
    memset(odd_vars, 0, sizeof(odd_vars));
    odd_vars[0].name = "w";
    odd_vars[0].rank = 2;
    odd_vars[0].shape[0] = OIN;
    odd_vars[0].shape[1] = OH;
    odd_vars[1].name = "v";
    odd_vars[1].rank = 1;
    odd_vars[1].shape[0] = OV;
    odd_vars[1].init = DSGD_INIT_GLOROT_UNIFORM; /* rank 1 AUTO would be zeros */
    d.custom = &odd_model;
    d.user_data = u;
    d.variables = odd_vars;
    d.num_variables = 2;
    d.input_dim = OIN;
    d.output_dim = OC;
    d.max_batch = 64;
    d.seed = 11;
    return d;
}

static void odd_data(uint64_t seed, float *x, float *y, int count) {
    tu_rng r = tu_rng_make(seed);
    int i;
    tu_fill(&r, x, (size_t)count * OIN, -1.0f, 1.0f);
    for (i = 0; i < count; ++i) y[i] = (float)tu_below(&r, OC);
}

/* ---------------------------------------------------------------- layout and misuse */

static void test_layout(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = odd_desc(NULL);
    dsgd_variable_desc vars[4];
    float init3[3 * 5 * 2 * 2], *p, *p2;
    dsgd_model *m = NULL, *m2 = NULL;
    int i;
    (void)state;
    memset(vars, 0, sizeof(vars));
    vars[0].name = "a"; vars[0].rank = 2; vars[0].shape[0] = 7; vars[0].shape[1] = 13;
    vars[1].name = "b"; vars[1].rank = 1; vars[1].shape[0] = 97;
    vars[1].aggregation = DSGD_AGG_SUM;
    vars[2].name = "k"; vars[2].rank = 4; vars[2].shape[0] = 3; vars[2].shape[1] = 5;
    vars[2].shape[2] = 2; vars[2].shape[3] = 2;
    for (i = 0; i < 60; ++i) init3[i] = (float)i - 7.5f;
    vars[2].initial = init3;
    vars[3].name = "z"; vars[3].rank = 2; vars[3].shape[0] = 2; vars[3].shape[1] = 3;
    vars[3].init = DSGD_INIT_ZEROS;
    d.variables = vars;
    d.num_variables = 4;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    assert_int_equal(dsgd_model_num_variables(m), 4);
    assert_int_equal((int)dsgd_model_num_params(m), 91 + 97 + 60 + 6);
    assert_int_equal((int)dsgd_model_variable(m, 1)->offset, 91);
    assert_int_equal((int)dsgd_model_variable(m, 2)->offset, 188);
    assert_int_equal((int)dsgd_model_variable(m, 3)->offset, 248);
    assert_int_equal(dsgd_model_variable(m, 2)->rank, 4);
    assert_int_equal(dsgd_model_variable(m, 2)->shape[3], 2);
    assert_int_equal((int)dsgd_model_variable(m, 0)->aggregation, (int)DSGD_AGG_MEAN);
    assert_int_equal((int)dsgd_model_variable(m, 1)->aggregation, (int)DSGD_AGG_SUM);
    assert_int_equal(dsgd_model_find_variable(m, "k"), 2);
    assert_int_equal(dsgd_model_find_variable(m, "nope"), -1);
    assert_string_equal(dsgd_model_name(m), "odd");
    assert_int_equal(dsgd_model_input_dim(m), OIN);
    assert_int_equal(dsgd_model_target_dim(m), 1);
    assert_int_equal(dsgd_model_output_dim(m), OC);
    assert_non_null(dsgd_model_state(m));
    p = dsgd_model_host_params(m);
    assert_non_null(p);
    assert_memory_equal(p + 188, init3, sizeof(init3));
    for (i = 0; i < 97; ++i) assert_true(p[91 + i] == 0.0f); /* rank 1, AUTO: zeros */
    for (i = 0; i < 6; ++i) assert_true(p[248 + i] == 0.0f);
    {   /* Glorot uniform bound sqrt(6 / (7 + 13)), not all equal */
        double bound = sqrt(6.0 / 20.0), lo = 1, hi = -1;
        for (i = 0; i < 91; ++i) {
            assert_true(fabs(p[i]) <= bound);
            lo = fmin(lo, p[i]);
            hi = fmax(hi, p[i]);
        }
        assert_true(hi - lo > bound);
    }
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m2)); /* same seed: same bits */
    p2 = dsgd_model_host_params(m2);
    assert_memory_equal(p, p2, dsgd_model_num_params(m) * sizeof(float));
    dsgd_model_destroy(m2);
    d.seed = 12;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m2));
    assert_true(memcmp(p, dsgd_model_host_params(m2), 91 * sizeof(float)) != 0);
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_model_read_output(m2, p2, 1));
    dsgd_model_destroy(m2);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

static void test_misuse(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d;
    dsgd_variable_desc v[2];
    dsgd_model_i noeval = odd_model, nograd = odd_model;
    dsgd_layer_desc layer = {4, DSGD_ACT_NONE, DSGD_INIT_AUTO};
    dsgd_model *m = NULL;
    float x[OIN] = {0}, y[1] = {0};
    int k;
    (void)state;
    for (k = 0; k < 11; ++k) {
        d = odd_desc(NULL);
        memcpy(v, odd_vars, sizeof(v));
        d.variables = v;
        switch (k) {
        case 0: v[1].name = "w"; break;                        /* duplicate */
        case 1: v[0].shape[1] = 0; break;                      /* zero-size */
        case 2: v[0].rank = 0; break;
        case 3: v[0].rank = DSGD_MAX_RANK + 1; break;
        case 4: nograd.compute_gradients = NULL; d.custom = &nograd; break;
        case 5: d.layers = &layer; d.num_layers = 1; break;    /* both */
        case 6: d.num_variables = 0; break;
        case 7: v[0].name = "a_name_that_is_far_too_long_for_the_limit"; break;
        case 8: v[1].name = NULL; break;
        case 9: d.target_dim = -1; break;
        default: v[1].aggregation = (dsgd_aggregation)9; break;
        }
        dsgd_ctx_clear_error(ctx);
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &d, &m));
        assert_null(m);
        if (k == 0) assert_non_null(strstr(dsgd_ctx_last_error(ctx), "both named 'w'"));
    }
    d = odd_desc(NULL);
    noeval.evaluate = NULL;
    d.custom = &noeval;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_model_eval_batch(m, x, y, 1));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, x, y, 65, 1.0f));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_gradients(m, NULL, 1.0f));
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- "odd"'s gradient */

static double odd_loss_at(const float *p, const float *x, const float *y, int count) {
    double sum = 0.0, z[OC], sm[OC];
    float h[OH];
    int n, c;
    for (n = 0; n < count; ++n) {
        odd_forward(p, x + (size_t)n * OIN, h, z);
        sum += odd_loss(z, (int)y[n], sm, &c);
    }
    return sum;
}

static void test_odd_gradient_fd(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = odd_desc(NULL);
    dsgd_model *m = NULL;
    float x[5 * OIN], y[5], g[ONP], *p;
    int i;
    (void)state;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    odd_data(3, x, y, 5);
    TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 5, 0.5f));
    TU_OK(ctx, dsgd_model_get_grads(m, g, ONP));
    p = dsgd_model_host_params(m);
    for (i = 0; i < ONP; ++i) {
        float keep = p[i];
        double h = 1e-2, lp, lm, fd;
        p[i] = keep + (float)h;
        lp = odd_loss_at(p, x, y, 5);
        p[i] = keep - (float)h;
        lm = odd_loss_at(p, x, y, 5);
        p[i] = keep;
        fd = 0.5 * (lp - lm) / (2.0 * h);
        TU_NEAR(g[i], fd, 2e-3 + 2e-2 * fabs(fd));
    }
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- the synchronous contract */

static void odd_strategy_params(dsgd_strategy_kind kind, int n, int steps, float *out) {
    enum { B = 6 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    float x[4 * B * OIN], y[4 * B];
    int step;
    memset(&sd, 0, sizeof(sd));
    sd.kind = kind;
    sd.num_replicas = n;
    sd.model = odd_desc(NULL);
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.2f;
    sd.cpu_threads = 1;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    for (step = 0; step < steps; ++step) {
        odd_data(100 + (uint64_t)step, x, y, 4 * B);
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 4 * B, NULL));
        tu_assert_replicas_identical(ctx, s);
    }
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), out, ONP));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_contract(void **state) {
    float ref[ONP], mir[ONP], cen[ONP], init[ONP];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = odd_desc(NULL);
    dsgd_model *m = NULL;
    double e1, e2;
    (void)state;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    TU_OK(ctx, dsgd_model_get_params(m, init, ONP));
    dsgd_model_destroy(m);
    odd_strategy_params(DSGD_STRATEGY_ONE_DEVICE, 1, 15, ref);
    odd_strategy_params(DSGD_STRATEGY_MIRRORED, 4, 15, mir);
    odd_strategy_params(DSGD_STRATEGY_CENTRAL_STORAGE, 3, 15, cen);
    e1 = tu_rel_err(mir, ref, ONP);
    e2 = tu_rel_err(cen, ref, ONP);
    printf("    odd model: mirrored N=4 rel err %.3g, central storage N=3 %.3g; moved %.3g\n", e1, e2,
           tu_rel_err(ref, init, ONP));
    assert_true(e1 <= 1e-5);
    assert_true(e2 <= 1e-5);
    assert_true(tu_rel_err(ref, init, ONP) > 1e-2); /* it trained */
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- "twin": the built-in, in user code */

enum { TIN = 20, TH = 16, TOUT = 5, TMAXB = 32 };

typedef struct twin_state {
    const dsgd_backend_i *be;
    dsgd_buffer *acts;  /* x (TMAXB, TIN), h (TMAXB, TH), z (TMAXB, TOUT) */
    dsgd_buffer *delta; /* dz (TMAXB, TOUT) then dh (TMAXB, TH) */
    dsgd_buffer *targets;
} twin_state;

static const size_t TX = 0, THO = TMAXB * TIN, TZ = TMAXB * (TIN + TH);

static void twin_destroy(void *state) {
    twin_state *t = (twin_state *)state;
    if (t->acts) t->be->buffer_destroy(t->be->impl, t->acts);
    if (t->delta) t->be->buffer_destroy(t->be->impl, t->delta);
    if (t->targets) t->be->buffer_destroy(t->be->impl, t->targets);
    free(t);
}

static dsgd_result twin_create(void *user_data, dsgd_model *m, void **state) {
    twin_state *t = (twin_state *)calloc(1, sizeof(*t));
    dsgd_result r;
    (void)user_data;
    if (!t) return DSGD_ERR_OUT_OF_MEMORY;
    t->be = dsgd_model_backend(m);
    if ((r = t->be->buffer_create(t->be->impl, TMAXB * (TIN + TH + TOUT), &t->acts)) != DSGD_OK ||
        (r = t->be->buffer_create(t->be->impl, TMAXB * (TOUT + TH), &t->delta)) != DSGD_OK ||
        (r = t->be->buffer_create(t->be->impl, TMAXB, &t->targets)) != DSGD_OK) {
        twin_destroy(t);
        return r;
    }
    *state = t;
    return DSGD_OK;
}

static dsgd_ref R(dsgd_buffer *b, size_t off) {
    dsgd_ref r;
    r.buf = b;
    r.off = off;
    return r;
}

/* The built-in's forward: h = relu(x W0 + b0), z = h W1 + b1. */
static dsgd_result twin_forward(twin_state *t, dsgd_model *m, const dsgd_batch *b) {
    const dsgd_backend_i *be = t->be;
    dsgd_buffer *P = dsgd_model_params(m).buf;
    int M = b->count;
    dsgd_result r;
    if ((r = be->write(be->impl, R(t->acts, TX), b->x, (size_t)M * TIN)) != DSGD_OK) return r;
    if (b->y && (r = be->write(be->impl, R(t->targets, 0), b->y, (size_t)M)) != DSGD_OK) return r;
    if ((r = be->gemm(be->impl, 0, 0, M, TH, TIN, 1.0f, R(t->acts, TX), TIN, R(P, 0), TH, 0.0f, R(t->acts, THO), TH)) ||
        (r = be->bias_act_forward(be->impl, DSGD_ACT_RELU, R(t->acts, THO), R(P, TIN * TH), M, TH)) ||
        (r = be->gemm(be->impl, 0, 0, M, TOUT, TH, 1.0f, R(t->acts, THO), TH, R(P, TIN * TH + TH), TOUT, 0.0f,
                      R(t->acts, TZ), TOUT)))
        return r;
    return be->bias_act_forward(be->impl, DSGD_ACT_NONE, R(t->acts, TZ), R(P, TIN * TH + TH + TH * TOUT), M, TOUT);
}

static dsgd_result twin_gradients(void *state, dsgd_model *m, const dsgd_batch *b, float scale, dsgd_metrics *mt) {
    twin_state *t = (twin_state *)state;
    const dsgd_backend_i *be = t->be;
    dsgd_buffer *P = dsgd_model_params(m).buf, *G = dsgd_model_grads(m).buf;
    size_t w1 = TIN * TH + TH, b1 = w1 + TH * TOUT;
    int M = b->count;
    dsgd_result r;
    (void)mt;
    if ((r = twin_forward(t, m, b)) != DSGD_OK) return r;
    if ((r = be->loss(be->impl, DSGD_LOSS_SOFTMAX_XENT, M, TOUT, R(t->acts, TZ), R(t->targets, 0), scale,
                      R(t->delta, 0), dsgd_model_stats(m, DSGD_METRICS_TRAIN))))
        return r;
    /* layer 1: dW1 = h^T dz, db1, dh = dz W1^T */
    if ((r = be->gemm(be->impl, 1, 0, TH, TOUT, M, 1.0f, R(t->acts, THO), TH, R(t->delta, 0), TOUT, 0.0f, R(G, w1), TOUT)) ||
        (r = be->bias_backward(be->impl, R(G, b1), R(t->delta, 0), M, TOUT)) ||
        (r = be->gemm(be->impl, 0, 1, M, TH, TOUT, 1.0f, R(t->delta, 0), TOUT, R(P, w1), TOUT, 0.0f,
                      R(t->delta, TMAXB * TOUT), TH)))
        return r;
    /* layer 0 */
    if ((r = be->act_backward(be->impl, DSGD_ACT_RELU, R(t->delta, TMAXB * TOUT), R(t->acts, THO), (size_t)M * TH)) ||
        (r = be->gemm(be->impl, 1, 0, TIN, TH, M, 1.0f, R(t->acts, TX), TIN, R(t->delta, TMAXB * TOUT), TH, 0.0f,
                      R(G, 0), TH)))
        return r;
    return be->bias_backward(be->impl, R(G, TIN * TH), R(t->delta, TMAXB * TOUT), M, TH);
}

static dsgd_result twin_evaluate(void *state, dsgd_model *m, const dsgd_batch *b, dsgd_metrics *mt) {
    twin_state *t = (twin_state *)state;
    dsgd_result r = twin_forward(t, m, b);
    dsgd_ref none;
    (void)mt;
    none.buf = NULL;
    none.off = 0;
    if (r != DSGD_OK || !b->y) return r;
    return t->be->loss(t->be->impl, DSGD_LOSS_SOFTMAX_XENT, b->count, TOUT, R(t->acts, TZ), R(t->targets, 0), 0.0f,
                       none, dsgd_model_stats(m, DSGD_METRICS_EVAL));
}

static const dsgd_model_i twin_model = {"twin", twin_create, twin_destroy, twin_gradients, twin_evaluate, 0};

static const dsgd_layer_desc twin_layers[2] = {{TH, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {TOUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static dsgd_model_desc builtin_desc(void) {
    dsgd_model_desc d;
    memset(&d, 0, sizeof(d));
    d.input_dim = TIN;
    d.layers = twin_layers;
    d.num_layers = 2;
    d.max_batch = TMAXB;
    d.seed = 5;
    return d;
}

static void twin_data(uint64_t seed, float *x, float *y, int count) {
    tu_rng r = tu_rng_make(seed);
    int i;
    tu_fill(&r, x, (size_t)count * TIN, -1.0f, 1.0f);
    for (i = 0; i < count; ++i) y[i] = (float)tu_below(&r, TOUT);
}

/* Trains a MIRRORED N=2 strategy of d for 12 steps (Adam); params and metrics out. */
static void train_twin(const dsgd_model_desc *d, float *params, size_t np, dsgd_metrics *train, dsgd_metrics *eval) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    float x[40 * TIN], y[40];
    int step;
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 2;
    sd.model = *d;
    sd.optimizer.kind = DSGD_OPT_ADAM;
    sd.optimizer.lr = 0.01f;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    for (step = 0; step < 12; ++step) {
        twin_data(700 + (uint64_t)step, x, y, 40);
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 37 + step % 4, NULL));
    }
    TU_OK(ctx, dsgd_strategy_eval_batch(s, x, y, 40));
    TU_OK(ctx, dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, train));
    TU_OK(ctx, dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, eval));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), params, np));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_twin_bitwise(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc bd = builtin_desc(), td;
    dsgd_variable_desc v[4];
    dsgd_model *m = NULL;
    dsgd_metrics bt, be, tt, te;
    size_t np;
    float *init, *pb, *pt;
    int i;
    (void)state;
    TU_OK(ctx, dsgd_model_create(ctx, &bd, &m));
    np = dsgd_model_num_params(m);
    init = tu_floats(np);
    pb = tu_floats(np);
    pt = tu_floats(np);
    TU_OK(ctx, dsgd_model_get_params(m, init, np));
    memset(v, 0, sizeof(v));
    for (i = 0; i < 4; ++i) {
        const dsgd_variable *bv = dsgd_model_variable(m, i);
        v[i].name = bv->name;
        v[i].rank = bv->rank;
        v[i].shape[0] = bv->shape[0];
        v[i].shape[1] = bv->shape[1];
        v[i].initial = init + bv->offset;
    }
    memset(&td, 0, sizeof(td));
    td.custom = &twin_model;
    td.variables = v;
    td.num_variables = 4;
    td.input_dim = TIN;
    td.max_batch = TMAXB;
    train_twin(&bd, pb, np, &bt, &be);
    train_twin(&td, pt, np, &tt, &te);
    assert_memory_equal(pb, pt, np * sizeof(float));
    assert_true(bt.loss_sum == tt.loss_sum && bt.correct == tt.correct && bt.count == tt.count);
    assert_true(be.loss_sum == te.loss_sum && be.correct == te.correct && be.count == te.count);
    assert_true(bt.count == 12 * 37 + 3 * (0 + 1 + 2 + 3)); /* 37, 38, 39, 40 three times */
    assert_true(memcmp(pb, init, np * sizeof(float)) != 0);
    printf("    twin == built-in, bit for bit: %zu params, train loss %.6f over %.0f samples\n", np,
           bt.loss_sum / bt.count, bt.count);
    free(init);
    free(pb);
    free(pt);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- failures */

static void test_gradient_fails_on_one_replica(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    odd_user u = {0, 1, 2}; /* replica 1 fails on its third call */
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    float x[12 * OIN], y[12];
    const char *msg;
    int step, r;
    dsgd_result res;
    (void)state;
    tu_watchdog(60);
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 3;
    sd.model = odd_desc(&u);
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.1f;
    sd.timeout_s = 20.0;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    odd_data(9, x, y, 12);
    for (step = 0; step < 2; ++step) TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 12, NULL));
    {
        double t0 = dsgd_now();
        res = dsgd_strategy_train_step(s, x, y, 12, NULL);
        assert_true(dsgd_now() - t0 < 5.0); /* nobody waited for a deadline */
    }
    assert_int_equal(res, DSGD_ERR_BACKEND);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "failing on purpose on replica 1"));
    for (r = 0; r < 3; ++r) {
        dsgd_result rr = dsgd_strategy_replica_result(s, r, &msg);
        if (r == 1) {
            assert_int_equal(rr, DSGD_ERR_BACKEND);
        } else {
            assert_int_equal(rr, DSGD_ERR_ABORTED);
            assert_non_null(strstr(msg, "replica 1 failed"));
        }
    }
    assert_false(dsgd_strategy_failed(s)); /* agreed before the update: clean */
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 12, NULL));
    tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- batch functions */

typedef struct slices {
    const float *x, *y;
    int count;
    int fail_on;      /* replica whose fn fails (-1: none) */
    int oversize_on;  /* replica that gets max_batch + 1 samples (-1: none) */
    int empty;        /* every replica gets nothing */
    int feature_dim;
} slices;

static dsgd_result slice_fn(void *user, int replica, int n, dsgd_batch *out) {
    slices *s = (slices *)user;
    size_t off = 0, len = 0;
    if (replica == s->fail_on) return DSGD_ERR_IO;
    dsgd_block_range((size_t)s->count, n, replica, &off, &len);
    out->x = s->x + off * (size_t)s->feature_dim;
    out->y = s->y + off;
    out->count = s->empty ? 0 : replica == s->oversize_on ? 1000 : (int)len;
    return DSGD_OK;
}

static void test_batch_fn_matches_slicing(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *a = NULL, *b = NULL;
    dsgd_step_info ia, ib;
    dsgd_metrics ma, mb;
    float x[40 * TIN], y[40], pa[600], pb[600];
    size_t np;
    slices sl;
    int step;
    (void)state;
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 3;
    sd.model = builtin_desc();
    sd.optimizer.kind = DSGD_OPT_MOMENTUM;
    sd.optimizer.lr = 0.05f;
    sd.optimizer.momentum = 0.9f;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &a));
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &b));
    np = dsgd_model_num_params(dsgd_strategy_model(a, 0));
    assert_true(np <= 600);
    memset(&sl, 0, sizeof(sl));
    sl.fail_on = sl.oversize_on = -1;
    sl.feature_dim = TIN;
    for (step = 0; step < 8; ++step) {
        twin_data(50 + (uint64_t)step, x, y, 40);
        sl.x = x;
        sl.y = y;
        sl.count = 31 + step; /* uneven over 3 */
        TU_OK(ctx, dsgd_strategy_train_step(a, x, y, sl.count, &ia));
        TU_OK(ctx, dsgd_strategy_train_step_fn(b, slice_fn, &sl, &ib));
        assert_int_equal(ia.count, ib.count);
        assert_int_equal(ib.count, sl.count);
    }
    TU_OK(ctx, dsgd_strategy_eval_batch(a, x, y, 40));
    sl.count = 40;
    TU_OK(ctx, dsgd_strategy_eval_fn(b, slice_fn, &sl));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(a, 0), pa, np));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(b, 0), pb, np));
    assert_memory_equal(pa, pb, np * sizeof(float));
    TU_OK(ctx, dsgd_strategy_take_metrics(a, DSGD_METRICS_EVAL, &ma));
    TU_OK(ctx, dsgd_strategy_take_metrics(b, DSGD_METRICS_EVAL, &mb));
    assert_true(ma.loss_sum == mb.loss_sum && ma.count == mb.count && mb.count == 40);

    /* failures on one replica: clean, every replica returns, b still trains */
    sl.count = 30;
    sl.fail_on = 2;
    TU_ERR(ctx, DSGD_ERR_IO, dsgd_strategy_train_step_fn(b, slice_fn, &sl, NULL));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "replica 2"));
    assert_false(dsgd_strategy_failed(b));
    sl.fail_on = -1;
    sl.oversize_on = 1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step_fn(b, slice_fn, &sl, NULL));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "replica 1 a batch of 1000"));
    sl.oversize_on = -1;
    sl.empty = 1; /* the end of the data everywhere: nothing happens */
    TU_OK(ctx, dsgd_strategy_train_step_fn(b, slice_fn, &sl, &ib));
    assert_int_equal(ib.count, 0);
    assert_int_equal((int)ib.step, 8);
    sl.empty = 0;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step_fn(b, NULL, &sl, NULL));
    assert_false(dsgd_strategy_failed(b));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(b, 0), pb, np));
    assert_memory_equal(pa, pb, np * sizeof(float)); /* nothing moved */
    TU_OK(ctx, dsgd_strategy_train_step_fn(b, slice_fn, &sl, NULL));
    tu_assert_replicas_identical(ctx, b);
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);
    dsgd_ctx_destroy(ctx);
}

/* Uneven inputs (Join): replica r has its own n_r samples and hands
   min(B, left) each step, 0 once done; the others go on, MEAN divides by
   the real samples, and the step with no sample anywhere does nothing. The
   weights follow ONE_DEVICE on each step's real samples (replica order). */
enum { JB = 8 };
static const int join_n[3] = {40, 25, 9};

typedef struct join_src {
    const float *x[3], *y[3];
    int step;
} join_src;

static int join_len(int r, int step) {
    int left = join_n[r] - step * JB;
    return left <= 0 ? 0 : left < JB ? left : JB;
}

static dsgd_result join_fn(void *user, int replica, int n, dsgd_batch *out) {
    const join_src *j = (const join_src *)user;
    (void)n;
    out->count = join_len(replica, j->step);
    out->x = j->x[replica] + (size_t)j->step * JB * OIN;
    out->y = j->y[replica] + (size_t)j->step * JB;
    return DSGD_OK;
}

static void test_join_uneven(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL, *ref = NULL;
    dsgd_step_info info;
    float xs[3][40 * OIN], ys[3][40], xb[3 * JB * OIN], yb[3 * JB], pa[ONP], pb[ONP];
    join_src src;
    int r, steps = 0;
    double e;
    (void)state;
    for (r = 0; r < 3; ++r) {
        odd_data(500 + (uint64_t)r, xs[r], ys[r], 40);
        src.x[r] = xs[r];
        src.y[r] = ys[r];
    }
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 3;
    sd.model = odd_desc(NULL);
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.2f;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    sd.kind = DSGD_STRATEGY_ONE_DEVICE;
    sd.num_replicas = 1;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &ref));
    for (src.step = 0;; ++src.step) {
        int count = 0;
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, join_fn, &src, &info));
        for (r = 0; r < 3; ++r) {
            int len = join_len(r, src.step);
            memcpy(xb + (size_t)count * OIN, xs[r] + (size_t)src.step * JB * OIN, sizeof(float) * (size_t)len * OIN);
            memcpy(yb + count, ys[r] + (size_t)src.step * JB, sizeof(float) * (size_t)len);
            count += len;
        }
        assert_int_equal(info.count, count);
        if (count == 0) break;
        TU_OK(ctx, dsgd_strategy_train_step(ref, xb, yb, count, NULL));
        ++steps;
    }
    assert_int_equal(steps, 5); /* ceil(40 / 8): the longest replica decides */
    assert_int_equal((int)info.step, 5); /* the empty step applied nothing */
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), pa, ONP));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(ref, 0), pb, ONP));
    e = tu_rel_err(pa, pb, ONP);
    printf("    join: replicas with 40, 25, 9 samples, %d steps, vs one_device on the real samples: rel err %.3g\n",
           steps, e);
    assert_true(e <= 1e-5);
    tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_strategy_destroy(ref);
    dsgd_ctx_destroy(ctx);
}

/* A model whose batches are not rows: input_dim 0, the batch's data is a
   struct of its own ("odd" reading through it). */
typedef struct odd_rows {
    const float *x, *y;
} odd_rows;

static dsgd_result rows_gradients(void *state, dsgd_model *m, const dsgd_batch *b, float scale, dsgd_metrics *mt) {
    const odd_rows *rows = (const odd_rows *)b->data;
    dsgd_batch inner = *b;
    (void)state;
    inner.x = rows->x;
    inner.y = rows->y;
    return odd_metrics_of(m, &inner, scale, mt, 1);
}

static const dsgd_model_i rows_model = {"rows", NULL, NULL, rows_gradients, NULL, 0};

typedef struct rows_src {
    const float *x, *y;
    odd_rows rows[4];
} rows_src;

static dsgd_result rows_fn(void *user, int replica, int n, dsgd_batch *out) {
    rows_src *src = (rows_src *)user;
    size_t off = 0, len = 0;
    dsgd_block_range(24, n, replica, &off, &len);
    src->rows[replica].x = src->x + off * OIN; /* each replica writes its own slot */
    src->rows[replica].y = src->y + off;
    out->data = &src->rows[replica];
    out->count = (int)len;
    return DSGD_OK;
}

static void test_model_without_rows(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *a = NULL, *b = NULL;
    float x[24 * OIN], y[24], pa[ONP], pb[ONP];
    rows_src src;
    int step;
    (void)state;
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 4;
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.2f;
    sd.model = odd_desc(NULL);
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &a));
    sd.model.custom = &rows_model;
    sd.model.input_dim = 0;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &b));
    for (step = 0; step < 6; ++step) {
        odd_data(300 + (uint64_t)step, x, y, 24);
        src.x = x;
        src.y = y;
        TU_OK(ctx, dsgd_strategy_train_step(a, x, y, 24, NULL));
        TU_OK(ctx, dsgd_strategy_train_step_fn(b, rows_fn, &src, NULL));
    }
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(a, 0), pa, ONP));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(b, 0), pb, ONP));
    assert_memory_equal(pa, pb, sizeof(pa));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(b, x, y, 24, NULL));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "dsgd_batch_fn"));
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_strategy_eval_fn(b, rows_fn, &src)); /* no evaluate */
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- declared aggregation */

static void test_declared_sum(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    dsgd_model_desc md = odd_desc(NULL);
    dsgd_variable_desc v[2];
    dsgd_model *m = NULL;
    float x[10 * OIN], y[10], p0[ONP], p1[ONP], g[ONP], want[ONP];
    int r, i;
    (void)state;
    memcpy(v, odd_vars, sizeof(v));
    v[1].aggregation = DSGD_AGG_SUM;
    md.variables = v;
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 2;
    sd.model = md;
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.5f;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    odd_data(77, x, y, 10);
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), p0, ONP));
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 10, NULL));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), p1, ONP));
    /* expected: w MEAN over 10 samples, v the sum of the two shards' means (5 each) */
    memset(want, 0, sizeof(want));
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    for (r = 0; r < 2; ++r) {
        TU_OK(ctx, dsgd_model_compute_gradients(m, x + r * 5 * OIN, y + r * 5, 5, 1.0f));
        TU_OK(ctx, dsgd_model_get_grads(m, g, ONP));
        for (i = 0; i < ONP; ++i) want[i] += g[i] * (i < OIN * OH ? 0.1f : 0.2f);
    }
    for (i = 0; i < ONP; ++i) TU_NEAR(p0[i] - p1[i], 0.5 * want[i], 1e-5 + 1e-6 * fabs(p0[i]));
    dsgd_model_destroy(m);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- parameter servers */

typedef struct ps_job {
    int step;
} ps_job;

static float g_px[20][8 * OIN], g_py[20][8];

static dsgd_result ps_closure(dsgd_cluster_worker *w, void *user) {
    const ps_job *j = (const ps_job *)user;
    int b = 2 * j->step + dsgd_cluster_worker_id(w);
    return dsgd_cluster_worker_train_step(w, g_px[b], g_py[b], 8);
}

static void test_parameter_servers(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc cd;
    dsgd_cluster *c = NULL;
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    ps_job jobs[10];
    float pc[ONP], pm[ONP], x[16 * OIN], y[16];
    int step, w;
    double err;
    (void)state;
    tu_watchdog(60);
    for (step = 0; step < 20; ++step) odd_data(900 + (uint64_t)step, g_px[step], g_py[step], 8);
    memset(&cd, 0, sizeof(cd));
    cd.ps.num_servers = 2;
    cd.ps.num_workers = 2;
    cd.ps.policy = DSGD_PS_SYNC;
    cd.ps.optimizer.kind = DSGD_OPT_SGD;
    cd.ps.optimizer.lr = 0.2f;
    cd.ps.timeout_s = 10.0;
    cd.model = odd_desc(NULL);
    TU_OK(ctx, dsgd_cluster_create(ctx, &cd, &c));
    for (step = 0; step < 10; ++step) {
        jobs[step].step = step;
        for (w = 0; w < 2; ++w) TU_OK(ctx, dsgd_cluster_schedule_on(c, w, ps_closure, &jobs[step], NULL));
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    TU_OK(ctx, dsgd_cluster_read_params(c, pc));
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 2;
    sd.model = odd_desc(NULL);
    sd.optimizer = cd.ps.optimizer;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    for (step = 0; step < 10; ++step) {
        memcpy(x, g_px[2 * step], sizeof(g_px[0]));
        memcpy(x + 8 * OIN, g_px[2 * step + 1], sizeof(g_px[0]));
        memcpy(y, g_py[2 * step], sizeof(g_py[0]));
        memcpy(y + 8, g_py[2 * step + 1], sizeof(g_py[0]));
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 16, NULL));
    }
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), pm, ONP));
    err = tu_rel_err(pc, pm, ONP);
    printf("    odd model, SYNC parameter servers (2 + 2) vs mirrored N=2: rel err %.3g\n", err);
    assert_true(err <= 1e-5);
    dsgd_strategy_destroy(s);
    dsgd_cluster_destroy(c);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- metrics and checkpoints */

static void test_host_metrics_checkpoint(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = odd_desc(NULL);
    dsgd_model *m = NULL, *m2 = NULL;
    dsgd_metrics a, b;
    float x[9 * OIN], y[9];
    char dir[] = "/tmp/dsgd_custom_XXXXXX", path[64];
    double want;
    (void)state;
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/ck", dir);
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m2));
    odd_data(5, x, y, 9);
    want = odd_loss_at(dsgd_model_host_params(m), x, y, 9);
    TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 9, 1.0f / 9));
    TU_OK(ctx, dsgd_model_eval_batch(m, x, y, 4));
    TU_OK(ctx, dsgd_model_save(m, NULL, path, NULL));
    TU_OK(ctx, dsgd_model_restore(m2, NULL, path, NULL));
    TU_OK(ctx, dsgd_model_take_metrics(m2, DSGD_METRICS_TRAIN, &a));
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_TRAIN, &b));
    TU_NEAR(a.loss_sum, want, 1e-4 * want);
    assert_true(a.count == 9 && b.count == 9 && a.loss_sum == b.loss_sum && a.correct == b.correct);
    TU_OK(ctx, dsgd_model_take_metrics(m2, DSGD_METRICS_EVAL, &a));
    assert_true(a.count == 4);
    TU_OK(ctx, dsgd_model_take_metrics(m2, DSGD_METRICS_TRAIN, &a)); /* reset */
    assert_true(a.count == 0 && a.loss_sum == 0.0);
    dsgd_model_destroy(m);
    dsgd_model_destroy(m2);
    tu_rmdir_files(dir);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_misuse),
        cmocka_unit_test(test_odd_gradient_fd),
        cmocka_unit_test(test_contract),
        cmocka_unit_test(test_twin_bitwise),
        cmocka_unit_test(test_gradient_fails_on_one_replica),
        cmocka_unit_test(test_batch_fn_matches_slicing),
        cmocka_unit_test(test_model_without_rows),
        cmocka_unit_test(test_join_uneven),
        cmocka_unit_test(test_declared_sum),
        cmocka_unit_test(test_parameter_servers),
        cmocka_unit_test(test_host_metrics_checkpoint),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
