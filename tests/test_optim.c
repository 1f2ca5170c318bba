/* test_optim.c - optimizers, gradient clipping and learning-rate schedules.

   A one-layer linear model (3 inputs, 2 outputs, MSE) computes gradients on a
   fixed batch; they are read back with dsgd_model_get_grads, checked against
   the host's closed form, and the same update rule is applied on the host in
   double. After each of 3 steps the model's parameters must match. The rules,
   as written in ref_step() below:
     SGD (PyTorch torch.optim.SGD, dampening 0):   g' = g + wd p;  p -= lr g'
     momentum (PyTorch):    v = mu v + g';  p -= lr v;  Nesterov: p -= lr (g' + mu v)
     Adam (Kingma & Ba 2015; wd as L2 in the gradient, like PyTorch Adam):
         m = b1 m + (1-b1) g';  v = b2 v + (1-b2) g'^2;
         p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
     AdamW (Loshchilov & Hutter 2019, decoupled): g' = g, then
         p -= lr (wd p + (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps))
   with t the 1-based step.

   Clipping by global norm: scale = clip / norm when norm > clip (norm is the
   L2 norm of the whole gradient, computed here in double), applied before the
   rule; a NaN/Inf gradient with clipping on is DSGD_ERR_NON_FINITE and leaves
   the parameters as they were.

   Learning-rate schedule, step t counted from 0 (the value used by the t-th
   call of dsgd_optimizer_step):
     warmup (t < W):    lr_t = start + (lr - start) * t / W
     CONSTANT:          lr_t = lr
     COSINE:            lr_t = final + (lr - final) * (1 + cos(pi * u)) / 2,
                        u = min(1, (t - W) / (total - W))
     STEP:              lr_t = lr * gamma^floor((t - W) / step_size)
   Linear scaling rule (Goyal et al. 2017): base_lr * global / base.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

#define PI_ 3.14159265358979323846

enum { IN = 3, OUT = 2, B = 4, NP = IN * OUT + OUT };

/* ---------------------------------------------------------------- fixture */

typedef struct lin {
    dsgd_ctx *ctx;
    dsgd_model *m;
    float x[B * IN], y[B * OUT];
    float p0[NP];
} lin;

static void lin_make(lin *L, uint64_t seed) {
    static const dsgd_layer_desc layer[1] = {{OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_model_desc md;
    tu_rng r = tu_rng_make(seed);
    memset(L, 0, sizeof *L);
    L->ctx = tu_ctx();
    memset(&md, 0, sizeof md);
    md.input_dim = IN;
    md.layers = layer;
    md.num_layers = 1;
    md.loss = DSGD_LOSS_MSE;
    md.max_batch = B;
    TU_OK(L->ctx, dsgd_model_create(L->ctx, &md, &L->m));
    assert_int_equal(dsgd_model_num_params(L->m), NP);
    tu_fill(&r, L->x, B * IN, -1.0f, 1.0f);
    tu_fill(&r, L->y, B * OUT, -1.0f, 1.0f);
    tu_fill(&r, L->p0, NP, -0.5f, 0.5f);
    TU_OK(L->ctx, dsgd_model_set_params(L->m, L->p0, NP));
}

static void lin_free(lin *L) {
    dsgd_model_destroy(L->m);
    dsgd_ctx_destroy(L->ctx);
}

/* The gradient of scale * sum_s (1/OUT) sum_j (x_s W + b - y_s)_j^2 at p, in
   double: dW[i][j] = sum_s x_si d_sj, db[j] = sum_s d_sj, d = scale 2/OUT (pred - y). */
static void host_grad(const lin *L, const float *p, double scale, double *g) {
    int s, i, j;
    for (i = 0; i < NP; ++i) g[i] = 0;
    for (s = 0; s < B; ++s) {
        for (j = 0; j < OUT; ++j) {
            double pred = p[IN * OUT + j], d;
            for (i = 0; i < IN; ++i) pred += (double)L->x[s * IN + i] * p[i * OUT + j];
            d = scale * 2.0 / OUT * (pred - L->y[s * OUT + j]);
            for (i = 0; i < IN; ++i) g[i * OUT + j] += L->x[s * IN + i] * d;
            g[IN * OUT + j] += d;
        }
    }
}

/* Computes the batch-mean gradient on the device, checks it against the host
   formula and returns it in g. */
static void lin_grad(lin *L, float *g) {
    float p[NP];
    double hg[NP];
    int i;
    TU_OK(L->ctx, dsgd_model_compute_gradients(L->m, L->x, L->y, B, 1.0f / B));
    TU_OK(L->ctx, dsgd_model_get_grads(L->m, g, NP));
    TU_OK(L->ctx, dsgd_model_get_params(L->m, p, NP));
    host_grad(L, p, 1.0 / B, hg);
    for (i = 0; i < NP; ++i) TU_NEAR(g[i], hg[i], 1e-6 + 1e-5 * fabs(hg[i]));
}

/* ---------------------------------------------------------------- reference */

typedef struct ref_state {
    double p[NP], m[NP], v[NP];
    int t; /* steps taken */
} ref_state;

/* The effective hyper-parameters of a desc (zero means default). */
typedef struct hyper {
    dsgd_optimizer_kind kind;
    double lr, mu, b1, b2, eps, wd;
    int nesterov;
} hyper;

static double ref_lr(const dsgd_lr_schedule *s, double lr, int64_t t);

/* One step of the reference rule with gradient g scaled by gs (clipping). */
static void ref_step(ref_state *st, const hyper *h, const dsgd_lr_schedule *sched, const float *g,
                     double gs) {
    double lr = ref_lr(sched, h->lr, st->t);
    int i;
    st->t++;
    for (i = 0; i < NP; ++i) {
        double gg = gs * g[i], step;
        switch (h->kind) {
        case DSGD_OPT_SGD:
            st->p[i] -= lr * (gg + h->wd * st->p[i]);
            break;
        case DSGD_OPT_MOMENTUM:
            gg += h->wd * st->p[i];
            st->m[i] = h->mu * st->m[i] + gg;
            st->p[i] -= lr * (h->nesterov ? gg + h->mu * st->m[i] : st->m[i]);
            break;
        case DSGD_OPT_ADAM:
        case DSGD_OPT_ADAMW:
            if (h->kind == DSGD_OPT_ADAM) gg += h->wd * st->p[i];
            st->m[i] = h->b1 * st->m[i] + (1 - h->b1) * gg;
            st->v[i] = h->b2 * st->v[i] + (1 - h->b2) * gg * gg;
            step = (st->m[i] / (1 - pow(h->b1, st->t))) /
                   (sqrt(st->v[i] / (1 - pow(h->b2, st->t))) + h->eps);
            if (h->kind == DSGD_OPT_ADAMW) step += h->wd * st->p[i];
            st->p[i] -= lr * step;
            break;
        }
    }
}

/* The closed forms of the schedule, in double. */
static double ref_lr(const dsgd_lr_schedule *s, double lr, int64_t t) {
    int64_t w = s->warmup_steps;
    if (t < w) return s->warmup_start_lr + (lr - s->warmup_start_lr) * (double)t / (double)w;
    switch (s->kind) {
    case DSGD_SCHEDULE_COSINE: {
        double u = (double)(t - w) / (double)(s->total_steps - w);
        if (u > 1) u = 1;
        return s->final_lr + (lr - s->final_lr) * 0.5 * (1 + cos(PI_ * u));
    }
    case DSGD_SCHEDULE_STEP:
        return lr * pow(s->gamma == 0.0f ? 0.1 : s->gamma, (double)((t - w) / s->step_size));
    default:
        return lr;
    }
}

static void check_params(lin *L, const ref_state *st, const char *label) {
    float p[NP];
    int i;
    TU_OK(L->ctx, dsgd_model_get_params(L->m, p, NP));
    for (i = 0; i < NP; ++i)
        if (!(fabs(p[i] - st->p[i]) <= 2e-6 + 1e-5 * fabs(st->p[i])))
            fail_msg("%s, after step %d: param[%d] = %.9g, want %.9g", label, st->t, i, p[i],
                     st->p[i]);
}

/* The optimizer's slots, read through dsgd_optimizer_read_slot, against the
   reference's m and v: whole, and a window from an offset. */
static void check_slots(lin *L, dsgd_optimizer *opt, const hyper *h, const ref_state *st, const char *label) {
    static const char *const names[3][2] = {{NULL, NULL}, {"momentum", NULL}, {"m", "v"}};
    int kind = h->kind == DSGD_OPT_SGD ? 0 : h->kind == DSGD_OPT_MOMENTUM ? 1 : 2, slot, i;
    float got[NP];
    assert_int_equal(dsgd_optimizer_num_slots(opt), kind);
    for (slot = 0; slot < kind; ++slot) {
        const double *want = slot == 0 ? st->m : st->v;
        assert_string_equal(dsgd_optimizer_slot_name(opt, slot), names[kind][slot]);
        TU_OK(L->ctx, dsgd_optimizer_read_slot(opt, slot, 0, NP, got));
        for (i = 0; i < NP; ++i)
            if (!(fabs(got[i] - want[i]) <= 1e-7 + 1e-5 * fabs(want[i])))
                fail_msg("%s, after step %d: slot %s[%d] = %.9g, want %.9g", label, st->t, names[kind][slot], i,
                         got[i], want[i]);
        TU_OK(L->ctx, dsgd_optimizer_read_slot(opt, slot, 2, NP - 3, got));
        for (i = 0; i < NP - 3; ++i) TU_NEAR(got[i], want[i + 2], 1e-7 + 1e-5 * fabs(want[i + 2]));
    }
    assert_null(dsgd_optimizer_slot_name(opt, kind));
    assert_null(dsgd_optimizer_slot_name(opt, -1));
    TU_ERR(L->ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_optimizer_read_slot(opt, kind, 0, 1, got));
    if (kind > 0) {
        TU_ERR(L->ctx, DSGD_ERR_SHAPE, dsgd_optimizer_read_slot(opt, 0, 1, NP, got));
        TU_ERR(L->ctx, DSGD_ERR_SHAPE, dsgd_optimizer_read_slot(opt, 0, (size_t)-1, 2, got));
        TU_ERR(L->ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_optimizer_read_slot(opt, 0, 0, 1, NULL));
        TU_OK(L->ctx, dsgd_optimizer_read_slot(opt, 0, NP, 0, NULL));
    }
}

/* Runs `steps` optimizer steps on the linear model with desc od, mirroring
   them on the host with the effective hyper-parameters h. */
static void run_rule(const dsgd_optimizer_desc *od, const hyper *h, int steps, const char *label) {
    lin L;
    dsgd_optimizer *opt = NULL;
    ref_state st;
    float g[NP];
    int i, t;
    lin_make(&L, 42);
    memset(&st, 0, sizeof st);
    for (i = 0; i < NP; ++i) st.p[i] = L.p0[i];
    TU_OK(L.ctx, dsgd_optimizer_create(L.m, od, &opt));
    assert_int_equal(dsgd_optimizer_steps(opt), 0);
    assert_ptr_equal(dsgd_optimizer_model(opt), L.m);
    check_slots(&L, opt, h, &st, label); /* zero before the first step */
    for (t = 0; t < steps; ++t) {
        /* the rate the next step applies: the schedule's at step t (h: the effective lr) */
        assert_true(dsgd_optimizer_lr(opt) == dsgd_lr_at(&od->schedule, (float)h->lr, t));
        lin_grad(&L, g);
        TU_OK(L.ctx, dsgd_optimizer_step(opt));
        ref_step(&st, h, &od->schedule, g, 1.0);
        check_params(&L, &st, label);
        check_slots(&L, opt, h, &st, label);
        assert_int_equal(dsgd_optimizer_steps(opt), t + 1);
    }
    dsgd_optimizer_destroy(opt);
    lin_free(&L);
}

static hyper hyper_of(const dsgd_optimizer_desc *od) {
    hyper h;
    h.kind = od->kind;
    h.lr = od->lr;
    h.mu = od->momentum;
    h.nesterov = od->nesterov;
    h.b1 = od->beta1;
    h.b2 = od->beta2;
    h.eps = od->eps;
    h.wd = od->weight_decay;
    return h;
}

/* ---------------------------------------------------------------- rules */

static void test_sgd(void **state) {
    dsgd_optimizer_desc od;
    hyper h;
    (void)state;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_SGD;
    od.lr = 0.3f;
    h = hyper_of(&od);
    run_rule(&od, &h, 3, "sgd");
    od.weight_decay = 0.05f;
    h = hyper_of(&od);
    run_rule(&od, &h, 3, "sgd + weight decay");
    /* all defaults: SGD with lr 0.01 */
    memset(&od, 0, sizeof od);
    h = hyper_of(&od);
    h.lr = 0.01;
    run_rule(&od, &h, 3, "sgd defaults");
}

static void test_momentum(void **state) {
    dsgd_optimizer_desc od;
    hyper h;
    (void)state;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_MOMENTUM;
    od.lr = 0.2f;
    od.momentum = 0.7f;
    od.weight_decay = 0.02f;
    h = hyper_of(&od);
    run_rule(&od, &h, 3, "momentum");
    od.nesterov = 1;
    h = hyper_of(&od);
    run_rule(&od, &h, 3, "nesterov");
    /* momentum 0 in the desc means the default 0.9 */
    od.momentum = 0.0f;
    od.nesterov = 0;
    od.weight_decay = 0.0f;
    h = hyper_of(&od);
    h.mu = 0.9;
    run_rule(&od, &h, 3, "momentum default 0.9");
}

static void test_adam(void **state) {
    dsgd_optimizer_desc od;
    hyper h;
    (void)state;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    od.lr = 0.05f;
    od.beta1 = 0.8f;
    od.beta2 = 0.95f;
    od.eps = 1e-3f; /* large enough that its placement matters */
    od.weight_decay = 0.1f;
    h = hyper_of(&od);
    run_rule(&od, &h, 3, "adam + L2");
    od.kind = DSGD_OPT_ADAMW;
    h = hyper_of(&od);
    run_rule(&od, &h, 3, "adamw");
    /* defaults: lr 0.01, betas 0.9/0.999, eps 1e-8 */
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    h = hyper_of(&od);
    h.lr = 0.01;
    h.b1 = 0.9;
    h.b2 = 0.999;
    h.eps = 1e-8;
    run_rule(&od, &h, 3, "adam defaults");
    od.kind = DSGD_OPT_ADAMW;
    od.weight_decay = 0.01f;
    h.kind = DSGD_OPT_ADAMW;
    h.wd = 0.01;
    run_rule(&od, &h, 3, "adamw defaults");
}

/* The optimizer uses the schedule: warmup from 0 means the first step does
   not move the parameters at all. */
static void test_optimizer_uses_schedule(void **state) {
    dsgd_optimizer_desc od;
    hyper h;
    lin L;
    dsgd_optimizer *opt = NULL;
    float g[NP], p[NP];
    (void)state;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_SGD;
    od.lr = 0.4f;
    od.schedule.kind = DSGD_SCHEDULE_CONSTANT;
    od.schedule.warmup_steps = 2;
    h = hyper_of(&od);
    run_rule(&od, &h, 4, "sgd with warmup");
    od.kind = DSGD_OPT_MOMENTUM;
    od.momentum = 0.5f;
    od.schedule.kind = DSGD_SCHEDULE_STEP;
    od.schedule.warmup_steps = 1;
    od.schedule.warmup_start_lr = 0.1f;
    od.schedule.step_size = 2;
    od.schedule.gamma = 0.5f;
    h = hyper_of(&od);
    run_rule(&od, &h, 5, "momentum with step schedule");

    lin_make(&L, 43);
    memset(&od, 0, sizeof od);
    od.lr = 1.0f;
    od.schedule.warmup_steps = 10;
    TU_OK(L.ctx, dsgd_optimizer_create(L.m, &od, &opt));
    lin_grad(&L, g);
    TU_OK(L.ctx, dsgd_optimizer_step(opt));
    TU_OK(L.ctx, dsgd_model_get_params(L.m, p, NP));
    assert_memory_equal(p, L.p0, sizeof p);
    dsgd_optimizer_destroy(opt);
    lin_free(&L);
}

/* ---------------------------------------------------------------- clipping */

static void write_grads(lin *L, const float *g) {
    const dsgd_backend_i *be = dsgd_model_backend(L->m);
    TU_OK(L->ctx, be->write(be->impl, dsgd_model_grads(L->m), g, NP));
}

static void test_clip_global_norm(void **state) {
    static const dsgd_optimizer_kind kinds[2] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM};
    int k;
    (void)state;
    for (k = 0; k < 2; ++k) {
        lin L;
        dsgd_optimizer_desc od;
        dsgd_optimizer *opt = NULL;
        ref_state st;
        hyper h;
        float g[NP];
        double norm, gs;
        int i, t;
        tu_rng r = tu_rng_make(7);
        lin_make(&L, 44);
        memset(&od, 0, sizeof od);
        od.kind = kinds[k];
        od.lr = 0.1f;
        od.momentum = 0.9f;
        od.clip_norm = 1.5f;
        h = hyper_of(&od);
        memset(&st, 0, sizeof st);
        for (i = 0; i < NP; ++i) st.p[i] = L.p0[i];
        TU_OK(L.ctx, dsgd_optimizer_create(L.m, &od, &opt));
        TU_NEAR(dsgd_optimizer_last_grad_norm(opt), 0, 0);
        /* steps 0, 2: norm above the threshold; step 1: below (no scaling);
           step 3: the model's own gradient */
        for (t = 0; t < 4; ++t) {
            if (t < 3) {
                tu_fill(&r, g, NP, -2.0f, 2.0f);
                if (t == 1)
                    for (i = 0; i < NP; ++i) g[i] *= 0.05f;
                write_grads(&L, g);
            } else {
                lin_grad(&L, g);
            }
            norm = 0;
            for (i = 0; i < NP; ++i) norm += (double)g[i] * g[i];
            norm = sqrt(norm);
            if (t == 0 || t == 2) assert_true(norm > 1.5);
            if (t == 1) assert_true(norm < 1.5);
            gs = norm > od.clip_norm ? od.clip_norm / norm : 1.0;
            TU_OK(L.ctx, dsgd_optimizer_step(opt));
            TU_NEAR(dsgd_optimizer_last_grad_norm(opt), norm, 1e-6 * norm);
            ref_step(&st, &h, &od.schedule, g, gs);
            check_params(&L, &st, kinds[k] == DSGD_OPT_SGD ? "clipped sgd" : "clipped momentum");
        }
        dsgd_optimizer_destroy(opt);
        lin_free(&L);
    }
}

/* With clipping on, a NaN or Inf gradient is rejected before anything moves. */
static void test_clip_non_finite(void **state) {
    static const float bad[3] = {NAN, INFINITY, -INFINITY};
    int k;
    (void)state;
    for (k = 0; k < 3; ++k) {
        lin L;
        dsgd_optimizer_desc od;
        dsgd_optimizer *opt = NULL;
        float g[NP], p[NP], p1[NP];
        int i;
        lin_make(&L, 45);
        memset(&od, 0, sizeof od);
        od.kind = DSGD_OPT_ADAM;
        od.lr = 0.1f;
        od.clip_norm = 1.0f;
        TU_OK(L.ctx, dsgd_optimizer_create(L.m, &od, &opt));
        /* one good step first, so there is optimizer state to protect */
        lin_grad(&L, g);
        TU_OK(L.ctx, dsgd_optimizer_step(opt));
        TU_OK(L.ctx, dsgd_model_get_params(L.m, p1, NP));
        for (i = 0; i < NP; ++i) g[i] = 0.1f * (float)(i + 1);
        g[3] = bad[k];
        write_grads(&L, g);
        dsgd_ctx_clear_error(L.ctx);
        TU_ERR(L.ctx, DSGD_ERR_NON_FINITE, dsgd_optimizer_step(opt));
        TU_OK(L.ctx, dsgd_model_get_params(L.m, p, NP));
        assert_memory_equal(p, p1, sizeof p);
        assert_int_equal(dsgd_optimizer_steps(opt), 1);
        /* a later good gradient is applied as the second Adam step */
        for (i = 0; i < NP; ++i) g[i] = 0.01f;
        write_grads(&L, g);
        TU_OK(L.ctx, dsgd_optimizer_step(opt));
        assert_int_equal(dsgd_optimizer_steps(opt), 2);
        TU_OK(L.ctx, dsgd_model_get_params(L.m, p, NP));
        for (i = 0; i < NP; ++i) assert_true(isfinite(p[i]));
        assert_memory_not_equal(p, p1, sizeof p);
        dsgd_optimizer_destroy(opt);
        lin_free(&L);
    }
}

/* ---------------------------------------------------------------- schedules */

static void check_lr(const dsgd_lr_schedule *s, float lr, int64_t t, double want) {
    float got = dsgd_lr_at(s, lr, t);
    if (!(fabs(got - want) <= 1e-6 * fabs(want) + 1e-9))
        fail_msg("schedule kind %d warmup %lld: lr_at(t=%lld) = %.9g, want %.9g", (int)s->kind,
                 (long long)s->warmup_steps, (long long)t, got, want);
}

static void test_lr_schedules(void **state) {
    dsgd_lr_schedule s;
    int64_t t;
    (void)state;

    /* CONSTANT, no warmup */
    memset(&s, 0, sizeof s);
    check_lr(&s, 0.1f, 0, 0.1f);
    check_lr(&s, 0.1f, 7, 0.1f);
    check_lr(&s, 0.1f, 1000000, 0.1f);

    /* CONSTANT, warmup 10 steps from 0 to 0.1 */
    s.warmup_steps = 10;
    check_lr(&s, 0.1f, 0, 0.0);
    check_lr(&s, 0.1f, 1, 0.01);
    check_lr(&s, 0.1f, 5, 0.05);
    check_lr(&s, 0.1f, 9, 0.09);
    check_lr(&s, 0.1f, 10, 0.1f);
    check_lr(&s, 0.1f, 11, 0.1f);
    check_lr(&s, 0.1f, 500, 0.1f);
    /* ... from 0.02 */
    s.warmup_start_lr = 0.02f;
    check_lr(&s, 0.1f, 0, 0.02f);
    check_lr(&s, 0.1f, 5, 0.02 + (0.1 - 0.02) * 0.5);
    check_lr(&s, 0.1f, 10, 0.1f);

    /* COSINE from 0.1 to 0.001 over 100 steps, no warmup */
    memset(&s, 0, sizeof s);
    s.kind = DSGD_SCHEDULE_COSINE;
    s.total_steps = 100;
    s.final_lr = 0.001f;
    check_lr(&s, 0.1f, 0, 0.1f);
    check_lr(&s, 0.1f, 25, 0.001 + 0.099 * 0.5 * (1 + cos(PI_ * 0.25)));
    check_lr(&s, 0.1f, 50, 0.001 + 0.099 * 0.5);
    check_lr(&s, 0.1f, 99, 0.001 + 0.099 * 0.5 * (1 + cos(PI_ * 0.99)));
    check_lr(&s, 0.1f, 100, 0.001f);
    check_lr(&s, 0.1f, 250, 0.001f);
    /* final_lr default 0 */
    s.final_lr = 0.0f;
    check_lr(&s, 0.1f, 50, 0.05);
    check_lr(&s, 0.1f, 100, 0.0);
    /* with warmup: 10 warmup steps, then the cosine over the remaining 90 */
    s.warmup_steps = 10;
    s.final_lr = 0.001f;
    check_lr(&s, 0.1f, 0, 0.0);
    check_lr(&s, 0.1f, 5, 0.05);
    check_lr(&s, 0.1f, 10, 0.1f);
    check_lr(&s, 0.1f, 55, 0.001 + 0.099 * 0.5);
    check_lr(&s, 0.1f, 100, 0.001f);
    for (t = 0; t <= 120; ++t) check_lr(&s, 0.1f, t, ref_lr(&s, 0.1, t));

    /* STEP: lr * gamma^floor(t / step_size) */
    memset(&s, 0, sizeof s);
    s.kind = DSGD_SCHEDULE_STEP;
    s.step_size = 30;
    s.gamma = 0.5f;
    check_lr(&s, 0.2f, 0, 0.2f);
    check_lr(&s, 0.2f, 29, 0.2f);
    check_lr(&s, 0.2f, 30, 0.1f);
    check_lr(&s, 0.2f, 59, 0.1f);
    check_lr(&s, 0.2f, 60, 0.05f);
    check_lr(&s, 0.2f, 95, 0.025f);
    /* gamma default 0.1 */
    s.gamma = 0.0f;
    check_lr(&s, 0.2f, 30, 0.02);
    check_lr(&s, 0.2f, 61, 0.002);
    /* with warmup: decays count from the end of the warmup */
    s.gamma = 0.5f;
    s.warmup_steps = 5;
    check_lr(&s, 0.2f, 0, 0.0);
    check_lr(&s, 0.2f, 4, 0.16);
    check_lr(&s, 0.2f, 5, 0.2f);
    check_lr(&s, 0.2f, 34, 0.2f);
    check_lr(&s, 0.2f, 35, 0.1f);
    check_lr(&s, 0.2f, 65, 0.05f);
}

static void test_linear_scaling(void **state) {
    (void)state;
    TU_NEAR(dsgd_linear_scaled_lr(0.1f, 1024, 256), 0.4, 1e-7);
    TU_NEAR(dsgd_linear_scaled_lr(0.1f, 256, 256), 0.1, 1e-8);
    TU_NEAR(dsgd_linear_scaled_lr(0.05f, 128, 256), 0.025, 1e-8);
    TU_NEAR(dsgd_linear_scaled_lr(0.001f, 8192, 32), 0.256, 1e-7);
}

/* ---------------------------------------------------------------- errors */

static void expect_bad(lin *L, const dsgd_optimizer_desc *od, const char *what) {
    dsgd_optimizer *opt = NULL;
    dsgd_result r;
    dsgd_ctx_clear_error(L->ctx);
    r = dsgd_optimizer_create(L->m, od, &opt);
    if (r != DSGD_ERR_INVALID_ARGUMENT)
        fail_msg("%s: dsgd_optimizer_create -> %s, want invalid argument", what,
                 dsgd_result_string(r));
    if (dsgd_ctx_last_error(L->ctx)[0] == '\0') fail_msg("%s: no error message", what);
    assert_null(opt);
}

static void test_invalid_descs(void **state) {
    lin L;
    dsgd_optimizer_desc od;
    dsgd_optimizer *opt = NULL;
    (void)state;
    lin_make(&L, 46);

    memset(&od, 0, sizeof od);
    od.lr = -0.1f;
    expect_bad(&L, &od, "negative lr");
    memset(&od, 0, sizeof od);
    od.kind = (dsgd_optimizer_kind)42;
    expect_bad(&L, &od, "unknown kind");
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_MOMENTUM;
    od.momentum = -0.5f;
    expect_bad(&L, &od, "negative momentum");
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    od.beta1 = 1.0f;
    expect_bad(&L, &od, "beta1 = 1");
    od.beta1 = -0.1f;
    expect_bad(&L, &od, "beta1 < 0");
    od.beta1 = 0.9f;
    od.beta2 = 1.5f;
    expect_bad(&L, &od, "beta2 > 1");
    od.beta2 = 0.999f;
    od.eps = -1e-8f;
    expect_bad(&L, &od, "negative eps");
    memset(&od, 0, sizeof od);
    od.weight_decay = -0.01f;
    expect_bad(&L, &od, "negative weight decay");
    memset(&od, 0, sizeof od);
    od.clip_norm = -1.0f;
    expect_bad(&L, &od, "negative clip norm");
    memset(&od, 0, sizeof od);
    od.lr = NAN;
    expect_bad(&L, &od, "NaN lr");
    memset(&od, 0, sizeof od);
    od.schedule.kind = DSGD_SCHEDULE_STEP; /* step_size must be > 0 */
    expect_bad(&L, &od, "STEP with step_size 0");
    memset(&od, 0, sizeof od);
    od.schedule.warmup_steps = -1;
    expect_bad(&L, &od, "negative warmup");
    memset(&od, 0, sizeof od);
    od.schedule.kind = (dsgd_schedule_kind)9;
    expect_bad(&L, &od, "unknown schedule");

    /* NULL arguments */
    memset(&od, 0, sizeof od);
    assert_int_equal(dsgd_optimizer_create(L.m, &od, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_optimizer_create(NULL, &od, &opt), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(opt);
    /* a good one still works, and destroy(NULL) is fine */
    TU_OK(L.ctx, dsgd_optimizer_create(L.m, &od, &opt));
    TU_NEAR(dsgd_optimizer_lr(opt), 0.01f, 0); /* the default lr */
    dsgd_optimizer_destroy(opt);
    dsgd_optimizer_destroy(NULL);
    /* the getters of no optimizer */
    assert_true(dsgd_optimizer_lr(NULL) == 0.0f);
    assert_null(dsgd_optimizer_model(NULL));
    lin_free(&L);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sgd),
        cmocka_unit_test(test_momentum),
        cmocka_unit_test(test_adam),
        cmocka_unit_test(test_optimizer_uses_schedule),
        cmocka_unit_test(test_clip_global_norm),
        cmocka_unit_test(test_clip_non_finite),
        cmocka_unit_test(test_lr_schedules),
        cmocka_unit_test(test_linear_scaling),
        cmocka_unit_test(test_invalid_descs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
