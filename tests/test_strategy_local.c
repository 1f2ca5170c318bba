/* test_strategy_local.c - DSGD_STRATEGY_LOCAL (distsgd/strategy_local.h):
   local SGD, post-local SGD and DiLoCo.

   The model is a small MLP, 6 -> 8 tanh -> 3 (softmax cross-entropy).

   What is asserted:
   - period 1, plain SGD inside, outer AVERAGE, 4 replicas: after 20 steps
     the weights are within the synchronous contract's tolerance (1e-5
     relative, as test_strategy_sync holds mirrored to one_device) of a
     4-replica MIRRORED strategy's; every step averaged (info) and left the
     replicas identical.
   - warmup_steps 6 (post-local SGD), momentum inside: the first 6 steps
     give a MIRRORED strategy's very bits on every replica (uneven global
     batches); then the replicas differ mid-round and are identical again
     after the round's last step, the only step that reports averaged.
   - Outer SGD with outer_lr 1 (NESTEROV with momentum 0) gives AVERAGE's
     weights within one rounding per element (in fact the same bits).
   - A serial reference: three models and AdamW optimizers of their own,
     stepped by hand on their shards, the pseudo-gradients summed in rank
     order (the DIRECT algorithm's order), divided by 3, and the outer
     Nesterov step written out (v = mu v + d; theta0 -= lr (d + mu v)),
     two rounds of 3 steps: every replica's weights within 1 ulp of it
     (and for AVERAGE too).
   - Resume, one table of descs: 250 steps, save, destroy, a fresh
     strategy, restore, 250 more steps (make test: 50 and 50, the long
     warmup 75) equal 500 uninterrupted on every
     replica, bit for bit, and the checkpoints saved at step 500 (every
     replica's weights and inner optimizer state, the round's start, the
     outer momentum) byte for byte: local SGD (AVERAGE, momentum inside,
     H 8, warmup 20; warmup 300, the cut in the warmup), DiLoCo (NESTEROV,
     AdamW inside, H 50: the cut at a round's end; H 50 warmup 10 and H 7:
     inside a round), outer SGD (H 6), and the fp16 and bf16 wires; the
     replicas differ at the cut exactly when it is inside a round, and such
     a checkpoint is refused at another replica count (DSGD_ERR_SHAPE,
     saying why); one saved at a round's boundary is taken there (the
     saved weights everywhere).
   - 2 workers x 2 replicas over one loopback hub (one strategy per
     worker, each on its own thread) train the bits of one 4-replica
     LOCAL strategy (NESTEROV, warmup 2, period 3).
   - Over simnet endpoints (park_between_calls) 4 replicas train the bits
     of the strategy's own loopback, and virtual time moved.
   - A label out of range on one replica mid-round fails the step on every
     replica cleanly (the strategy stays usable, no weight moved); a NaN
     input skips the step on every replica (info.skipped), or under ERROR
     stops them all cleanly; the same with local.agree_in_process.
   - agree_in_process, no failed or skipped step: the bits of the
     agreement over the transport, every replica (plain SGD with AVERAGE,
     momentum after a warmup, DiLoCo), in one process with sliced batches
     and a batch fn, and 2 workers x 2 replicas over one hub (both).
   - Traffic over simnet (alpha 50 us), 8 rounds of H 8, 4 replicas in
     one process: agreed, every step sends the agreement's messages and a
     round's last one the averaging's too; in process, a local step sends
     none and takes no virtual time, a round's last one the averaging's
     alone; same bits. 2 workers x 2 over simnet: 64 steps send 64
     agreements + 8 averagings, and 8 averagings in process.
   - agree_in_process across workers (2 x 2 over one hub, H 4), a bad
     sample at step 5 in worker 1's shard: a NaN under SKIP is skipped on
     worker 1 alone (info.skipped), every step counted on both (info.step,
     info.averaged aligned), one model after the average, the same bits
     twice; a bad label or a NaN under ERROR fails worker 1 at step 5
     (strategy failed) and worker 0 at the averaging, step 7, at once (the
     hub's abort), or over endpoints without abort with DSGD_ERR_TIMEOUT
     naming rank 2 after timeout_s (0.5 s). Workers that differ in the
     option fail creation (DSGD_ERR_INVALID_ARGUMENT).
   - eval_batch evaluates each replica with its own weights on its shard:
     the EVAL metrics equal the sum of each replica's model evaluated alone.
   - Bad descs (negative period or warmup, outer_lr <= 0 or not finite for
     NESTEROV, momentum outside [0, 1), an unknown outer kind, gradient
     path DEVICE, overlap): DSGD_ERR_INVALID_ARGUMENT with a message that
     names the field.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>

enum { IN = 6, HID = 8, OUT = 3, NP = IN * HID + HID + HID * OUT + OUT, B = 5, MAXN = 4, STEPS = 50, LONG = 500, CUT = 250 };

/* The resumes' length and cut: LONG and CUT under make test-full; 100 and
   50 in the quick tier, where each row's cut falls where it does at 250
   (in the warmup, at a round's end, inside a round) and a round or more
   follows it. */
#define RESUME_LONG TU_PICK(LONG, 100)
#define RESUME_CUT TU_PICK(CUT, 50)

static const dsgd_layer_desc LAYERS[2] = {{HID, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static float g_x[LONG][MAXN * B * IN], g_y[LONG][MAXN * B];

static void make_data(void) {
    tu_rng r = tu_rng_make(2023);
    int s, i;
    for (s = 0; s < LONG; ++s) {
        tu_fill(&r, g_x[s], (size_t)MAXN * B * IN, -1.0f, 1.0f);
        for (i = 0; i < MAXN * B; ++i) g_y[s][i] = (float)tu_below(&r, OUT);
    }
}

/* Uneven global batches (some replicas take one sample more). */
static int uneven(int step, int n) { return n * B - (step % 3); }

static dsgd_strategy_desc base_desc(dsgd_strategy_kind kind, int n, dsgd_optimizer_kind opt) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = B;
    d.model.seed = 11;
    d.optimizer.kind = opt;
    d.optimizer.lr = opt == DSGD_OPT_ADAMW || opt == DSGD_OPT_ADAM ? 0.01f : 0.1f;
    d.optimizer.weight_decay = opt == DSGD_OPT_ADAMW ? 0.01f : 0.0f;
    d.timeout_s = 30.0;
    d.cpu_threads = 1;
    return d;
}

static dsgd_strategy_desc local_desc(int n, dsgd_optimizer_kind opt, int period, int64_t warmup, dsgd_outer_kind outer) {
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_LOCAL, n, opt);
    d.local.period = period;
    d.local.warmup_steps = warmup;
    d.local.outer = outer;
    return d;
}

static void get_all(dsgd_ctx *ctx, dsgd_strategy *s, float (*out)[NP]) {
    int r;
    for (r = 0; r < dsgd_strategy_num_replicas(s); ++r) TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, r), out[r], NP));
}

/* Trains steps [from, to) on s with the global batch count(step). */
static void train(dsgd_ctx *ctx, dsgd_strategy *s, int from, int to, int (*count)(int, int)) {
    int step, n = dsgd_strategy_num_replicas_in_sync(s);
    for (step = from; step < to; ++step) TU_OK(ctx, dsgd_strategy_train_step(s, g_x[step], g_y[step], count(step, n), NULL));
}

static int even(int step, int n) {
    (void)step;
    return n * B;
}

/* ULPs between two finite floats of the same sign (or both near 0). */
static long ulps(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0) ia = INT32_MIN - ia;
    if (ib < 0) ib = INT32_MIN - ib;
    return labs((long)ia - (long)ib);
}

static long max_ulps(const float *a, const float *b, size_t n) {
    long m = 0;
    size_t i;
    for (i = 0; i < n; ++i)
        if (ulps(a[i], b[i]) > m) m = ulps(a[i], b[i]);
    return m;
}

/* ---------------------------------------------------------------- tests */

static void test_period1_like_mirrored(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc dm = base_desc(DSGD_STRATEGY_MIRRORED, 4, DSGD_OPT_SGD);
    dsgd_strategy_desc dl = local_desc(4, DSGD_OPT_SGD, 1, 0, DSGD_OUTER_AVERAGE);
    dsgd_strategy *m = NULL, *l = NULL;
    float pm[MAXN][NP], pl[MAXN][NP], p0[NP];
    double err;
    int step;
    (void)state;
    TU_OK(ctx, dsgd_strategy_create(ctx, &dm, &m));
    TU_OK(ctx, dsgd_strategy_create(ctx, &dl, &l));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(l, 0), p0, NP));
    for (step = 0; step < 20; ++step) {
        dsgd_step_info info;
        TU_OK(ctx, dsgd_strategy_train_step(m, g_x[step], g_y[step], 4 * B, NULL));
        TU_OK(ctx, dsgd_strategy_train_step(l, g_x[step], g_y[step], 4 * B, &info));
        assert_int_equal(info.averaged, 1);
        assert_int_equal(info.step, step);
        tu_assert_replicas_identical(ctx, l);
    }
    get_all(ctx, m, pm);
    get_all(ctx, l, pl);
    err = tu_rel_err(pl[0], pm[0], NP);
    assert_true(err <= 1e-5);
    assert_true(tu_rel_err(pl[0], p0, NP) > 1e-2); /* it trained */
    print_message("    period 1, SGD, AVERAGE x4 vs mirrored x4 after 20 steps: rel err %.3g\n", err);
    dsgd_strategy_destroy(m);
    dsgd_strategy_destroy(l);
    dsgd_ctx_destroy(ctx);
}

static void test_warmup_is_mirrored(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc dm = base_desc(DSGD_STRATEGY_MIRRORED, 3, DSGD_OPT_MOMENTUM);
    dsgd_strategy_desc dl = local_desc(3, DSGD_OPT_MOMENTUM, 4, 6, DSGD_OUTER_AVERAGE);
    dsgd_strategy *m = NULL, *l = NULL;
    float pm[MAXN][NP], pl[MAXN][NP];
    int step, r;
    (void)state;
    TU_OK(ctx, dsgd_strategy_create(ctx, &dm, &m));
    TU_OK(ctx, dsgd_strategy_create(ctx, &dl, &l));
    for (step = 0; step < 10; ++step) {
        dsgd_step_info info;
        TU_OK(ctx, dsgd_strategy_train_step(l, g_x[step], g_y[step], uneven(step, 3), &info));
        assert_int_equal(info.averaged, step == 9); /* t - 6 = 3 = period - 1 */
        if (step < 6) {
            TU_OK(ctx, dsgd_strategy_train_step(m, g_x[step], g_y[step], uneven(step, 3), NULL));
            get_all(ctx, m, pm);
            get_all(ctx, l, pl);
            for (r = 0; r < 3; ++r) assert_memory_equal(pl[r], pm[0], sizeof(pm[0]));
        }
        if (step == 7) {
            get_all(ctx, l, pl);
            assert_true(memcmp(pl[0], pl[1], sizeof(pl[0])) != 0); /* mid-round: alone */
        }
    }
    tu_assert_replicas_identical(ctx, l);
    print_message("    warmup 6 of local x3 = mirrored x3 bit for bit; one averaging at step 9\n");
    dsgd_strategy_destroy(m);
    dsgd_strategy_destroy(l);
    dsgd_ctx_destroy(ctx);
}

static void run_local(const dsgd_strategy_desc *d, int steps, float (*out)[NP]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, d, &s));
    train(ctx, s, 0, steps, uneven);
    get_all(ctx, s, out);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_outer_sgd_is_average(void **state) {
    dsgd_strategy_desc da = local_desc(3, DSGD_OPT_MOMENTUM, 4, 0, DSGD_OUTER_AVERAGE);
    dsgd_strategy_desc ds = local_desc(3, DSGD_OPT_MOMENTUM, 4, 0, DSGD_OUTER_SGD);
    float pa[MAXN][NP], ps[MAXN][NP];
    long u;
    (void)state;
    ds.local.outer_lr = 1.0f;
    run_local(&da, 12, pa);
    run_local(&ds, 12, ps);
    u = max_ulps(pa[0], ps[0], NP);
    assert_true(u <= 1);
    print_message("    outer SGD lr 1 vs AVERAGE: at most %ld ulp apart%s\n", u,
                  memcmp(pa[0], ps[0], sizeof(pa[0])) ? "" : " (the same bits)");
}

/* The serial reference: W models with their own optimizers, stepped on
   their shards; at each round's end the pseudo-gradients summed in rank
   order, divided by W, and the outer step by hand. */
static void serial_reference(int w, int period, int rounds, dsgd_outer_kind outer, float lr, float mu,
                             float (*out)[NP]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_ONE_DEVICE, 1, DSGD_OPT_ADAMW);
    dsgd_model *m[MAXN];
    dsgd_optimizer *o[MAXN];
    float theta0[NP], v[NP], delta[NP], th[NP];
    int r, step, k;
    size_t i;
    memset(v, 0, sizeof(v));
    for (r = 0; r < w; ++r) {
        TU_OK(ctx, dsgd_model_create(ctx, &d.model, &m[r]));
        TU_OK(ctx, dsgd_optimizer_create(m[r], &d.optimizer, &o[r]));
    }
    TU_OK(ctx, dsgd_model_get_params(m[0], theta0, NP));
    for (step = 0; step < period * rounds; ++step) {
        int count = uneven(step, w);
        for (r = 0; r < w; ++r) {
            size_t off = 0, len = 0;
            dsgd_batch b;
            dsgd_block_range((size_t)count, w, r, &off, &len);
            memset(&b, 0, sizeof(b));
            b.x = g_x[step] + off * IN;
            b.y = g_y[step] + off;
            b.count = (int)len;
            TU_OK(ctx, dsgd_model_gradients(m[r], &b, 1.0f / (float)len));
            TU_OK(ctx, dsgd_optimizer_step(o[r]));
        }
        if (step % period != period - 1) continue;
        memset(delta, 0, sizeof(delta));
        for (r = 0; r < w; ++r) { /* rank order */
            TU_OK(ctx, dsgd_model_get_params(m[r], th, NP));
            for (i = 0; i < NP; ++i) {
                float dr = theta0[i] - th[i];
                delta[i] = r == 0 ? dr : delta[i] + dr;
            }
        }
        for (i = 0; i < NP; ++i) {
            volatile float dm = delta[i] / (float)w, vi, step_i;
            if (outer == DSGD_OUTER_AVERAGE) {
                theta0[i] = theta0[i] - dm;
                continue;
            }
            vi = mu * v[i];
            vi = vi + dm;
            v[i] = vi;
            step_i = mu * vi;
            step_i = dm + step_i;
            step_i = lr * step_i;
            theta0[i] = theta0[i] - step_i;
        }
        for (r = 0; r < w; ++r) TU_OK(ctx, dsgd_model_set_params(m[r], theta0, NP));
    }
    for (r = 0; r < w; ++r) {
        TU_OK(ctx, dsgd_model_get_params(m[r], out[r], NP));
        dsgd_optimizer_destroy(o[r]);
        dsgd_model_destroy(m[r]);
    }
    (void)k;
    dsgd_ctx_destroy(ctx);
}

static void test_serial_reference(void **state) {
    static const dsgd_outer_kind kinds[2] = {DSGD_OUTER_NESTEROV, DSGD_OUTER_AVERAGE};
    float want[MAXN][NP], got[MAXN][NP], p0[NP];
    int k, r;
    (void)state;
    for (k = 0; k < 2; ++k) {
        dsgd_strategy_desc d = local_desc(3, DSGD_OPT_ADAMW, 3, 0, kinds[k]);
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        long u = 0;
        d.algorithm = DSGD_ALLREDUCE_DIRECT; /* the rank-order sum */
        serial_reference(3, 3, 2, kinds[k], 0.7f, 0.9f, want);
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), p0, NP));
        train(ctx, s, 0, 6, uneven);
        get_all(ctx, s, got);
        for (r = 0; r < 3; ++r) {
            long ur = max_ulps(got[r], want[r], NP);
            if (ur > 1) fail_msg("%s: replica %d is %ld ulp from the serial reference", kinds[k] ? "NESTEROV" : "AVERAGE", r, ur);
            if (ur > u) u = ur;
        }
        assert_true(tu_rel_err(got[0], p0, NP) > 1e-3);
        print_message("    %s, AdamW inside, 3 replicas, 2 rounds of 3: within %ld ulp of the serial reference\n",
                      kinds[k] ? "NESTEROV" : "AVERAGE", u);
        dsgd_strategy_destroy(s);
        dsgd_ctx_destroy(ctx);
    }
}

/* One resume row: a desc, whose cut (RESUME_CUT) may fall in the warmup,
   at a round's boundary or inside a round. */
typedef struct resume_row {
    const char *name;
    int n, period;
    int64_t warmup;
    dsgd_optimizer_kind inner;
    dsgd_outer_kind outer;
    dsgd_wire wire;
    int64_t warmup_quick; /* the quick tier's warmup where it differs (0: warmup) */
} resume_row;

static int64_t row_warmup(const resume_row *c) {
    return tu_full() || !c->warmup_quick ? c->warmup : c->warmup_quick;
}

static dsgd_strategy_desc row_desc(const resume_row *c) {
    dsgd_strategy_desc d = local_desc(c->n, c->inner, c->period, row_warmup(c), c->outer);
    d.algorithm = DSGD_ALLREDUCE_RING; /* the half wires' algorithm; the workers' too */
    d.local.wire = c->wire;
    return d;
}

/* Creates d's strategy, restores `restore` (NULL: none), trains steps
   [from, to), saves to `save` (NULL: none); every replica's weights out. */
static void resume_run(const dsgd_strategy_desc *d, int from, int to, const char *restore, const char *save,
                       float (*out)[NP]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, d, &s));
    if (restore) TU_OK(ctx, dsgd_strategy_restore(s, restore, NULL));
    train(ctx, s, from, to, uneven);
    if (save) TU_OK(ctx, dsgd_strategy_save(s, save, NULL));
    get_all(ctx, s, out);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* Fails unless the checkpoints at a and b hold the same bytes. */
static void same_files(const char *a, const char *b, const char *what) {
    size_t la, lb;
    unsigned char *fa = tu_read_file(a, &la), *fb = tu_read_file(b, &lb);
    if (la != lb || memcmp(fa, fb, la) != 0)
        fail_msg("%s: the state at step %d differs after the resume (checkpoints of %zu and %zu bytes)", what,
                 RESUME_LONG, la, lb);
    free(fa);
    free(fb);
}

/* RESUME_LONG steps, or RESUME_CUT + save + destroy + a fresh strategy +
   restore + the rest: every replica's weights bit for bit, and the
   checkpoints saved at the end (every replica's weights, inner optimizer
   state and last norm, the round's start, the outer momentum, the step)
   byte for byte. A cut inside a round is refused at another replica
   count. */
static void resume_case(const resume_row *c, const char *dir) {
    static float want[MAXN][NP], got[MAXN][NP], mid[MAXN][NP];
    dsgd_strategy_desc d = row_desc(c);
    char full[128], cut[128], resumed[128];
    const int cut_at = RESUME_CUT, long_at = RESUME_LONG;
    const int64_t warmup = row_warmup(c);
    int r, n = c->n, inside = cut_at >= warmup && (cut_at - warmup) % c->period != 0;
    snprintf(full, sizeof full, "%s/full.ckpt", dir);
    snprintf(cut, sizeof cut, "%s/cut.ckpt", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.ckpt", dir);
    resume_run(&d, 0, long_at, NULL, full, want);
    resume_run(&d, 0, cut_at, NULL, cut, mid);
    resume_run(&d, cut_at, long_at, cut, resumed, got);
    for (r = 0; r < n; ++r)
        if (memcmp(got[r], want[r], sizeof(got[r])) != 0)
            fail_msg("%s: replica %d after the resume differs (rel err %.3g)", c->name, r,
                     tu_rel_err(got[r], want[r], NP));
    same_files(full, resumed, c->name);
    /* inside a round the replicas differ: each one's own state was needed */
    if (inside != (memcmp(mid[0], mid[n - 1], sizeof(mid[0])) != 0))
        fail_msg("%s: at the cut the replicas %s, yet the cut is %s a round", c->name, inside ? "agree" : "differ",
                 inside ? "inside" : "not inside");
    if (inside) { /* into another replica count: refused, saying why */
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        d.num_replicas = n == 2 ? 3 : 2;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_strategy_restore(s, cut, NULL));
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "middle of a round"));
        assert_int_equal(dsgd_strategy_failed(s), 0);
        dsgd_strategy_destroy(s);
        dsgd_ctx_destroy(ctx);
    }
    print_message("    %-46s x%d: %d + save/restore + %d = %d (cut %s), bit for bit\n", c->name, n, cut_at,
                  long_at - cut_at, long_at, warmup > cut_at ? "in the warmup" : inside ? "inside a round" : "at a round's end");
}

static void test_resume(void **state) {
    static const resume_row rows[] = {
        {"local SGD: AVERAGE, momentum, H 8, warmup 20", 4, 8, 20, DSGD_OPT_MOMENTUM, DSGD_OUTER_AVERAGE, DSGD_WIRE_F32,
         0},
        {"local SGD: AVERAGE, momentum, H 8, long warmup", 3, 8, 300, DSGD_OPT_MOMENTUM, DSGD_OUTER_AVERAGE,
         DSGD_WIRE_F32, 75},
        {"DiLoCo: NESTEROV, AdamW, H 50", 4, 50, 0, DSGD_OPT_ADAMW, DSGD_OUTER_NESTEROV, DSGD_WIRE_F32, 0},
        {"DiLoCo: NESTEROV, AdamW, H 50, warmup 10", 4, 50, 10, DSGD_OPT_ADAMW, DSGD_OUTER_NESTEROV, DSGD_WIRE_F32, 0},
        {"DiLoCo: NESTEROV, AdamW, H 7", 3, 7, 0, DSGD_OPT_ADAMW, DSGD_OUTER_NESTEROV, DSGD_WIRE_F32, 0},
        {"outer SGD, momentum, H 6, warmup 5", 2, 6, 5, DSGD_OPT_MOMENTUM, DSGD_OUTER_SGD, DSGD_WIRE_F32, 0},
        {"DiLoCo, H 7, fp16 wire", 4, 7, 0, DSGD_OPT_ADAMW, DSGD_OUTER_NESTEROV, DSGD_WIRE_F16, 0},
        {"local SGD, H 8, warmup 20, bf16 wire", 4, 8, 20, DSGD_OPT_MOMENTUM, DSGD_OUTER_AVERAGE, DSGD_WIRE_BF16,
         0},
    };
    char dir[64];
    size_t k;
    (void)state;
    tu_watchdog_for("LOCAL's resume", 600);
    tu_mkdtemp(dir);
    for (k = 0; k < sizeof(rows) / sizeof(rows[0]); ++k) resume_case(&rows[k], dir);
    tu_rmdir_files(dir);
    tu_watchdog(0);
}

/* Saved at a round's boundary (t = 16, period 8): another count takes it. */
static void test_restore_at_boundary(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = local_desc(3, DSGD_OPT_ADAMW, 8, 0, DSGD_OUTER_NESTEROV);
    dsgd_strategy *s = NULL;
    float saved[MAXN][NP], got[MAXN][NP];
    char dir[64], path[128];
    (void)state;
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/local.ckpt", dir);
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    train(ctx, s, 0, 16, uneven);
    TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
    get_all(ctx, s, saved);
    dsgd_strategy_destroy(s);
    d.num_replicas = 2;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
    get_all(ctx, s, got);
    assert_memory_equal(got[0], saved[0], sizeof(got[0]));
    assert_memory_equal(got[1], saved[0], sizeof(got[0]));
    train(ctx, s, 16, 20, uneven);
    dsgd_strategy_destroy(s);
    tu_rmdir_files(dir);
    rmdir(dir);
    dsgd_ctx_destroy(ctx);
}

/* A batch fn: replica r's dsgd_block_range shard of the step's uneven
   global batch, as the sliced call gives it. */
static dsgd_result shard_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    int step = *(const int *)user;
    size_t lo, len;
    dsgd_block_range((size_t)uneven(step, num_replicas), num_replicas, replica, &lo, &len);
    out->x = g_x[step] + lo * IN;
    out->y = g_y[step] + lo;
    out->count = (int)len;
    return DSGD_OK;
}

/* ---------------------------------------------------------------- workers */

typedef struct worker {
    dsgd_transport_i *eps;
    dsgd_strategy_desc d;
    int start, stop;              /* the steps [start, stop) */
    const char *restore, *save;   /* before them, after them (NULL: none) */
    dsgd_result res;
    char msg[512];
    float params[MAXN][NP];
    /* a bad sample at bad_step in global replica 3's shard (its last):
       bad_what 1 a NaN input, 2 a label out of range; 0 none */
    int bad_step, bad_what;
    dsgd_step_info info[STEPS]; /* steps < STEPS */
    int fail_at;                /* the step that failed (-1: none) */
    double fail_s;              /* how long it took */
    int failed;                 /* dsgd_strategy_failed after it */
    int flip_agree;             /* non-zero: the other local.agree_in_process */
    int use_fn;                 /* non-zero: dsgd_strategy_train_step_fn with shard_fn */
    float bx[MAXN * B * IN], by[MAXN * B];
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    int step, r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return NULL;
    w->d.endpoints = w->eps;
    if (w->flip_agree) w->d.local.agree_in_process = !w->d.local.agree_in_process;
    w->fail_at = -1;
    w->res = dsgd_strategy_create(ctx, &w->d, &s);
    if (w->res == DSGD_OK && w->restore) w->res = dsgd_strategy_restore(s, w->restore, NULL);
    for (step = w->start; step < w->stop && w->res == DSGD_OK; ++step) {
        const float *px = g_x[step], *py = g_y[step];
        int count = uneven(step, 4);
        double t0 = dsgd_now();
        if (w->bad_what && step == w->bad_step) {
            memcpy(w->bx, g_x[step], sizeof(w->bx));
            memcpy(w->by, g_y[step], sizeof(w->by));
            if (w->bad_what == 1) w->bx[(count - 1) * IN] = NAN;
            else w->by[count - 1] = 99.0f;
            px = w->bx;
            py = w->by;
        }
        if (w->use_fn) w->res = dsgd_strategy_train_step_fn(s, shard_fn, &step, step < STEPS ? &w->info[step] : NULL);
        else w->res = dsgd_strategy_train_step(s, px, py, count, step < STEPS ? &w->info[step] : NULL);
        if (w->res != DSGD_OK) {
            w->fail_at = step;
            w->fail_s = dsgd_now() - t0;
            w->failed = dsgd_strategy_failed(s);
        }
    }
    if (w->res == DSGD_OK && w->save) w->res = dsgd_strategy_save(s, w->save, NULL);
    snprintf(w->msg, sizeof(w->msg), "%s", dsgd_ctx_last_error(ctx));
    for (r = 0; s && r < dsgd_strategy_num_replicas(s); ++r)
        dsgd_model_get_params(dsgd_strategy_model(s, r), w->params[r], NP);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

/* Two workers of two replicas over one hub, each worker's strategy on a
   thread of its own, training w->start .. w->stop of d. */
static void run_workers_on(const dsgd_strategy_desc *d, worker *ws, dsgd_transport_i *eps) {
    pthread_t th[2];
    int i;
    for (i = 0; i < 2; ++i) {
        ws[i].d = *d;
        ws[i].d.num_replicas = 2;
        ws[i].eps = eps + 2 * i;
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &ws[i]), 0);
    }
    for (i = 0; i < 2; ++i) pthread_join(th[i], NULL);
}

static void run_workers(const dsgd_strategy_desc *d, worker *ws) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[4];
    int i;
    TU_OK(ctx, dsgd_loopback_create(ctx, 4, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    run_workers_on(d, ws, eps);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

/* Every worker's replicas hold the bits of want (a LOCAL x4's). */
static void check_workers(const worker *ws, float (*want)[NP], const char *what) {
    int i, r;
    for (i = 0; i < 2; ++i) {
        if (ws[i].res != DSGD_OK) fail_msg("%s: worker %d: %s", what, i, ws[i].msg);
        for (r = 0; r < 2; ++r)
            if (memcmp(ws[i].params[r], want[2 * i + r], sizeof(want[0])) != 0)
                fail_msg("%s: worker %d replica %d differs from local x4 (rel err %.3g)", what, i, r,
                         tu_rel_err(ws[i].params[r], want[2 * i + r], NP));
    }
}

static void set_steps(worker *ws, int start, int stop, const char *restore, const char *save) {
    int i;
    memset(ws, 0, 2 * sizeof(worker));
    for (i = 0; i < 2; ++i) {
        ws[i].start = start;
        ws[i].stop = stop;
        ws[i].restore = restore;
        ws[i].save = save;
    }
}

static void test_two_workers(void **state) {
    static float want[MAXN][NP];
    dsgd_strategy_desc d = local_desc(4, DSGD_OPT_ADAMW, 3, 2, DSGD_OUTER_NESTEROV);
    worker ws[2];
    char dir[64], full[128], cut[128], resumed[128];
    int i;
    (void)state;
    tu_watchdog(300);
    d.algorithm = DSGD_ALLREDUCE_RING;
    run_local(&d, 10, want);
    set_steps(ws, 0, 10, NULL, NULL);
    run_workers(&d, ws);
    check_workers(ws, want, "10 steps");
    print_message("    2 workers x 2 replicas over one hub = local x4, every replica bit for bit\n");
    /* resumed across workers: DiLoCo, H 7, cut inside a round; the chief's
       checkpoint is the one-process strategy's, byte for byte */
    d.local.period = 7;
    d.local.warmup_steps = 0;
    tu_mkdtemp(dir);
    snprintf(full, sizeof full, "%s/full.ckpt", dir);
    snprintf(cut, sizeof cut, "%s/cut.ckpt", dir);
    snprintf(resumed, sizeof resumed, "%s/resumed.ckpt", dir);
    resume_run(&d, 0, RESUME_LONG, NULL, full, want);
    set_steps(ws, 0, RESUME_CUT, NULL, cut);
    run_workers(&d, ws);
    for (i = 0; i < 2; ++i)
        if (ws[i].res != DSGD_OK) fail_msg("the save across workers: worker %d: %s", i, ws[i].msg);
    set_steps(ws, RESUME_CUT, RESUME_LONG, cut, resumed);
    run_workers(&d, ws);
    check_workers(ws, want, "resumed across workers");
    same_files(full, resumed, "resumed across workers");
    print_message("    2 x 2, DiLoCo H 7: %d + save/restore across workers + %d = local x4's %d, checkpoint too\n",
                  RESUME_CUT, RESUME_LONG - RESUME_CUT, RESUME_LONG);
    tu_rmdir_files(dir);
    tu_watchdog(0);
}

/* A hub of 4 ranks parked between calls (alpha, 1 GB/s), its endpoints
   into eps. */
static dsgd_simnet *simnet4(dsgd_ctx *ctx, double alpha_s, dsgd_transport_i *eps) {
    dsgd_simnet_desc sd;
    dsgd_simnet *hub = NULL;
    int i;
    memset(&sd, 0, sizeof(sd));
    sd.ranks = 4;
    sd.alpha_s = alpha_s;
    sd.beta_s_per_byte = 1e-9;
    sd.park_between_calls = 1;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &eps[i]));
    return hub;
}

static void test_simnet(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = local_desc(4, DSGD_OPT_MOMENTUM, 3, 1, DSGD_OUTER_NESTEROV);
    dsgd_simnet *hub = NULL;
    dsgd_transport_i eps[4];
    dsgd_strategy *s = NULL;
    float want[MAXN][NP], got[MAXN][NP];
    int i;
    (void)state;
    tu_watchdog(120);
    d.algorithm = DSGD_ALLREDUCE_RING;
    run_local(&d, 10, want);
    hub = simnet4(ctx, 20e-6, eps);
    d.endpoints = eps;
    d.timeout_s = 1e6;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    train(ctx, s, 0, 10, uneven);
    get_all(ctx, s, got);
    for (i = 0; i < 4; ++i) assert_memory_equal(got[i], want[i], sizeof(got[i]));
    dsgd_strategy_destroy(s);
    for (i = 0; i < 4; ++i) assert_true(dsgd_simnet_time(hub, i) > 0.0);
    print_message("    over simnet (4 replicas, %.3f ms virtual) = its own loopback's bits\n", 1e3 * dsgd_simnet_time(hub, 0));
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- agreement in process */

/* Plain SGD (AVERAGE), momentum after a warmup (AVERAGE), DiLoCo (AdamW
   inside, NESTEROV). */
static dsgd_strategy_desc quiet_row(int k, const char **name) {
    static const char *names[3] = {"SGD, AVERAGE, H 4", "momentum, AVERAGE, H 5, warmup 3", "DiLoCo: AdamW, NESTEROV, H 8"};
    *name = names[k];
    if (k == 0) return local_desc(4, DSGD_OPT_SGD, 4, 0, DSGD_OUTER_AVERAGE);
    if (k == 1) return local_desc(4, DSGD_OPT_MOMENTUM, 5, 3, DSGD_OUTER_AVERAGE);
    return local_desc(4, DSGD_OPT_ADAMW, 8, 0, DSGD_OUTER_NESTEROV);
}

/* With no failed or skipped step the agreement in process changes no bit:
   in one process (sliced batches and a batch fn), and 2 workers x 2
   replicas over one hub. */
static void test_in_process_bits(void **state) {
    static float want[MAXN][NP], got[MAXN][NP];
    worker ws[2];
    int k, r, step;
    (void)state;
    tu_watchdog(300);
    for (k = 0; k < 3; ++k) {
        const char *name;
        dsgd_strategy_desc d = quiet_row(k, &name);
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        run_local(&d, 26, want);
        d.local.agree_in_process = 1;
        run_local(&d, 26, got);
        for (r = 0; r < 4; ++r)
            if (memcmp(got[r], want[r], sizeof(got[r])) != 0)
                fail_msg("%s: replica %d with the agreement in process differs (rel err %.3g)", name, r,
                         tu_rel_err(got[r], want[r], NP));
        assert_true(memcmp(want[0], want[1], sizeof(want[0])) != 0); /* step 26 is inside a round */
        set_steps(ws, 0, 26, NULL, NULL);
        run_workers(&d, ws);
        check_workers(ws, want, name);
        set_steps(ws, 0, 26, NULL, NULL); /* a batch fn across workers: its count still all-reduced */
        ws[0].use_fn = ws[1].use_fn = 1;
        run_workers(&d, ws);
        check_workers(ws, want, name);
        /* a batch fn (its count summed in memory) */
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        for (step = 0; step < 26; ++step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, shard_fn, &step, NULL));
        get_all(ctx, s, got);
        for (r = 0; r < 4; ++r) assert_memory_equal(got[r], want[r], sizeof(got[r]));
        dsgd_strategy_destroy(s);
        dsgd_ctx_destroy(ctx);
        print_message("    %s: agreement in process = over the transport, bit for bit (x4, batch fn, 2 x 2 and with a batch fn)\n", name);
    }
    tu_watchdog(0);
}

/* Over simnet (alpha 50 us, 1 ns a byte), 4 replicas of one process on
   the hub's endpoints, H 8, 8 rounds: the messages and the virtual time
   of each step (msgs[t], vt[t]), the weights. */
static void simnet_rounds(int in_process, uint64_t *msgs, double *vt, float (*out)[NP]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = local_desc(4, DSGD_OPT_MOMENTUM, 8, 0, DSGD_OUTER_AVERAGE);
    dsgd_simnet *hub = NULL;
    dsgd_simnet_stats st;
    dsgd_transport_i eps[4];
    dsgd_strategy *s = NULL;
    uint64_t before;
    double t0;
    int step;
    hub = simnet4(ctx, 50e-6, eps);
    d.endpoints = eps;
    d.timeout_s = 1e6;
    d.local.agree_in_process = in_process;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (step = 0; step < 64; ++step) {
        dsgd_simnet_get_stats(hub, &st);
        before = st.messages;
        t0 = dsgd_simnet_time(hub, 0);
        TU_OK(ctx, dsgd_strategy_train_step(s, g_x[step], g_y[step], uneven(step, 4), NULL));
        dsgd_simnet_get_stats(hub, &st);
        msgs[step] = st.messages - before;
        vt[step] = dsgd_simnet_time(hub, 0) - t0;
    }
    get_all(ctx, s, out);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

/* 2 workers x 2 replicas over simnet (as simnet_rounds), `steps` steps:
   the messages and virtual time in all (creation included). */
static void simnet_workers(int in_process, int steps, uint64_t *msgs, double *vt, worker *ws) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = local_desc(4, DSGD_OPT_MOMENTUM, 8, 0, DSGD_OUTER_AVERAGE);
    dsgd_simnet *hub = NULL;
    dsgd_simnet_stats st;
    dsgd_transport_i eps[4];
    int i;
    hub = simnet4(ctx, 50e-6, eps);
    d.timeout_s = 1e6;
    d.local.agree_in_process = in_process;
    set_steps(ws, 0, steps, NULL, NULL);
    run_workers_on(&d, ws, eps);
    for (i = 0; i < 2; ++i)
        if (ws[i].res != DSGD_OK) fail_msg("over simnet: worker %d: %s", i, ws[i].msg);
    dsgd_simnet_get_stats(hub, &st);
    *msgs = st.messages;
    *vt = dsgd_simnet_time(hub, 0);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

/* The traffic: 8 rounds of H 8 over simnet. With the agreement in
   process a local step sends no message and takes no virtual time; a
   round's last step sends the averaging's messages alone (the agreed
   run's last step less one agreement); the same bits. Across workers
   (2 x 2) the totals add up the same way. */
static void test_in_process_traffic(void **state) {
    static uint64_t m1[64], m0[64];
    static double v1[64], v0[64];
    static float p1[MAXN][NP], p0[MAXN][NP];
    static worker ws[2];
    uint64_t agree, sync, w1, w0, c1, c0;
    double t1 = 0.0, t0 = 0.0, wt1, wt0, ct1, ct0;
    int step, r;
    (void)state;
    tu_watchdog(300);
    simnet_rounds(0, m1, v1, p1);
    simnet_rounds(1, m0, v0, p0);
    for (r = 0; r < 4; ++r) assert_memory_equal(p0[r], p1[r], sizeof(p0[r]));
    agree = m1[0];
    sync = m1[7] - agree;
    assert_true(agree > 0 && sync > 0);
    for (step = 0; step < 64; ++step) {
        int last = step % 8 == 7;
        t1 += v1[step];
        t0 += v0[step];
        if (m1[step] != (last ? agree + sync : agree))
            fail_msg("agreed: step %d sent %llu messages, not %llu", step, (unsigned long long)m1[step],
                     (unsigned long long)(last ? agree + sync : agree));
        if (m0[step] != (last ? sync : 0))
            fail_msg("in process: step %d sent %llu messages, not %llu", step, (unsigned long long)m0[step],
                     (unsigned long long)(last ? sync : 0));
        if (!last) assert_true(v0[step] == 0.0 && v1[step] > 0.0);
    }
    assert_true(t0 < t1);
    print_message("    simnet x4 (alpha 50 us), 8 rounds of H 8: agreed %llu messages, %.3f ms virtual; in process "
                  "%llu, %.3f ms (%.1f%%); %llu a step's agreement, %llu an averaging\n",
                  (unsigned long long)(7 * 8 * agree + 8 * (agree + sync)), 1e3 * t1,
                  (unsigned long long)(8 * sync), 1e3 * t0, 100.0 * t0 / t1, (unsigned long long)agree,
                  (unsigned long long)sync);
    /* across workers: 64 steps less creation's traffic (0 steps) */
    simnet_workers(0, 0, &c1, &ct1, ws);
    simnet_workers(1, 0, &c0, &ct0, ws);
    simnet_workers(0, 64, &w1, &wt1, ws);
    check_workers(ws, p1, "agreed over simnet, 2 x 2");
    simnet_workers(1, 64, &w0, &wt0, ws);
    check_workers(ws, p1, "in process over simnet, 2 x 2");
    assert_true(c0 == c1);
    if (w1 - c1 != 64 * agree + 8 * sync || w0 - c0 != 8 * sync)
        fail_msg("2 x 2 over simnet: %llu and %llu messages in 64 steps, not %llu and %llu",
                 (unsigned long long)(w1 - c1), (unsigned long long)(w0 - c0),
                 (unsigned long long)(64 * agree + 8 * sync), (unsigned long long)(8 * sync));
    assert_true(wt0 - ct0 < wt1 - ct1);
    print_message("    simnet 2 workers x 2: 64 steps agreed %.3f ms virtual, in process %.3f ms (%.1f%%)\n",
                  1e3 * (wt1 - ct1), 1e3 * (wt0 - ct0), 100.0 * (wt0 - ct0) / (wt1 - ct1));
    tu_watchdog(0);
}

/* Across workers (2 x 2 over one hub, H 4, the agreement in process), a
   bad sample at step 5 (a round's second step) in global replica 3's
   shard (worker 1's): a NaN under SKIP is skipped by worker 1 alone, the
   step counted everywhere, the rounds aligned, the averaging taken; a bad
   label, or a NaN under ERROR, fails worker 1's step and its strategy, and
   worker 0 learns it at the round's averaging (step 7) and fails there,
   promptly, never hanging. */
static void test_in_process_across_workers(void **state) {
    static float want[MAXN][NP];
    static worker ws[2], again[2];
    dsgd_strategy_desc d = local_desc(4, DSGD_OPT_MOMENTUM, 4, 0, DSGD_OUTER_AVERAGE);
    int i, step, k;
    (void)state;
    tu_watchdog(300);
    d.local.agree_in_process = 1;
    d.timeout_s = 2.0;
    run_local(&d, 12, want);
    for (k = 0; k < 2; ++k) {
        worker *w = k ? again : ws;
        set_steps(w, 0, 12, NULL, NULL);
        w[1].bad_step = 5;
        w[1].bad_what = 1;
        run_workers(&d, w);
        for (i = 0; i < 2; ++i) {
            if (w[i].res != DSGD_OK) fail_msg("NaN under SKIP: worker %d: %s", i, w[i].msg);
            for (step = 0; step < 12; ++step) {
                assert_int_equal(w[i].info[step].step, step);           /* the counts never part */
                assert_int_equal(w[i].info[step].averaged, step % 4 == 3); /* nor the rounds */
                assert_int_equal(w[i].info[step].skipped, i == 1 && step == 5);
            }
        }
    }
    for (i = 0; i < 2; ++i) /* the same bits again, and one model after the average */
        for (step = 0; step < 2; ++step) {
            assert_memory_equal(ws[i].params[step], again[i].params[step], sizeof(want[0]));
            assert_memory_equal(ws[i].params[step], ws[0].params[0], sizeof(want[0]));
        }
    assert_true(tu_rel_err(ws[0].params[0], want[0], NP) > 1e-6); /* worker 1's skip is in the average */
    assert_true(tu_rel_err(ws[0].params[0], want[0], NP) < 1e-1);
    print_message("    2 x 2, NaN on worker 1 at step 5 (SKIP): skipped there alone, counted, rounds aligned, "
                  "rel err %.3g from the clean run\n", tu_rel_err(ws[0].params[0], want[0], NP));
    for (k = 0; k < 2; ++k) {
        d.nonfinite = k ? DSGD_NONFINITE_ERROR : DSGD_NONFINITE_SKIP;
        set_steps(ws, 0, 12, NULL, NULL);
        ws[1].bad_step = 5;
        ws[1].bad_what = k ? 1 : 2;
        run_workers(&d, ws);
        if (ws[1].fail_at != 5 || ws[1].res != (k ? DSGD_ERR_NON_FINITE : DSGD_ERR_INVALID_ARGUMENT) || !ws[1].failed)
            fail_msg("%s: worker 1 failed at %d (%s), strategy failed %d", k ? "NaN under ERROR" : "a bad label",
                     ws[1].fail_at, ws[1].msg, ws[1].failed);
        if (ws[0].fail_at != 7 || ws[0].res == DSGD_OK || !ws[0].failed || ws[0].fail_s > d.timeout_s + 0.5)
            fail_msg("%s: worker 0 failed at %d after %.3f s (%s), strategy failed %d", k ? "NaN under ERROR" : "a bad label",
                     ws[0].fail_at, ws[0].fail_s, ws[0].msg, ws[0].failed);
        print_message("    2 x 2, %s on worker 1 at step 5: it fails there (%s); worker 0 at the averaging, step 7, "
                      "in %.3f s (%s)\n", k ? "NaN under ERROR" : "a bad label", dsgd_result_string(ws[1].res),
                      ws[0].fail_s, ws[0].msg);
    }
    /* over endpoints whose abort reaches nobody (as MPI's): worker 0
       fails at the averaging at its deadline, timeout_s, naming a rank
       of worker 1 */
    {
        dsgd_ctx *ctx = tu_ctx();
        dsgd_loopback *hub = NULL;
        dsgd_transport_i eps[4];
        TU_OK(ctx, dsgd_loopback_create(ctx, 4, &hub));
        for (i = 0; i < 4; ++i) {
            TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
            eps[i].abort = NULL;
        }
        d.nonfinite = DSGD_NONFINITE_SKIP;
        d.timeout_s = 0.5;
        set_steps(ws, 0, 12, NULL, NULL);
        ws[1].bad_step = 5;
        ws[1].bad_what = 2;
        run_workers_on(&d, ws, eps);
        if (ws[1].fail_at != 5 || ws[1].res != DSGD_ERR_INVALID_ARGUMENT || !ws[1].failed)
            fail_msg("no abort: worker 1 failed at %d (%s)", ws[1].fail_at, ws[1].msg);
        if (ws[0].fail_at != 7 || ws[0].res != DSGD_ERR_TIMEOUT || !ws[0].failed || ws[0].fail_s < 0.4 ||
            ws[0].fail_s > d.timeout_s + 0.5 || !strstr(ws[0].msg, "rank 2"))
            fail_msg("no abort: worker 0 failed at %d after %.3f s (%s), strategy failed %d", ws[0].fail_at,
                     ws[0].fail_s, ws[0].msg, ws[0].failed);
        print_message("    no abort across workers: worker 0 fails at step 7 after %.3f s, timeout_s %.1f (%s)\n",
                      ws[0].fail_s, d.timeout_s, ws[0].msg);
        dsgd_loopback_destroy(hub);
        dsgd_ctx_destroy(ctx);
    }
    /* the workers must agree on the option: creation fails on both */
    set_steps(ws, 0, 1, NULL, NULL);
    ws[1].flip_agree = 1;
    run_workers(&d, ws);
    for (i = 0; i < 2; ++i)
        if (ws[i].res != DSGD_ERR_INVALID_ARGUMENT) fail_msg("agree_in_process differs: worker %d: %s", i, ws[i].msg);
    tu_watchdog(0);
}

/* In one process the agreement is the same in memory (agree 1) as over
   the transport (agree 0). */
static void test_failures(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = local_desc(3, DSGD_OPT_MOMENTUM, 4, 0, DSGD_OUTER_AVERAGE);
    dsgd_strategy *s = NULL;
    float before[MAXN][NP], after[MAXN][NP], y[MAXN * B], x[MAXN * B * IN];
    dsgd_step_info info;
    int r, agree;
    (void)state;
    for (agree = 0; agree < 2; ++agree) {
        d.local.agree_in_process = agree;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 0, 2, even);
        get_all(ctx, s, before);
        memcpy(y, g_y[2], sizeof(y));
        y[2 * B] = 99.0f; /* replica 2's first sample */
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, g_x[2], y, 3 * B, NULL));
        assert_int_equal(dsgd_strategy_failed(s), 0);
        get_all(ctx, s, after);
        for (r = 0; r < 3; ++r) assert_memory_equal(after[r], before[r], sizeof(after[r]));
        memcpy(x, g_x[2], sizeof(x));
        x[B * IN] = NAN; /* replica 1's first sample */
        TU_OK(ctx, dsgd_strategy_train_step(s, x, g_y[2], 3 * B, &info));
        assert_int_equal(info.skipped, 1);
        get_all(ctx, s, after);
        for (r = 0; r < 3; ++r) assert_memory_equal(after[r], before[r], sizeof(after[r]));
        TU_OK(ctx, dsgd_strategy_train_step(s, g_x[2], g_y[2], 3 * B, &info));
        assert_int_equal(info.skipped, 0);
        assert_int_equal(info.step, 2);
        dsgd_strategy_destroy(s);
        s = NULL;
        /* under ERROR: every replica stops, nothing moved, still usable */
        d.nonfinite = DSGD_NONFINITE_ERROR;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 0, 2, even);
        get_all(ctx, s, before);
        TU_ERR(ctx, DSGD_ERR_NON_FINITE, dsgd_strategy_train_step(s, x, g_y[2], 3 * B, NULL));
        assert_int_equal(dsgd_strategy_failed(s), 0);
        get_all(ctx, s, after);
        for (r = 0; r < 3; ++r) assert_memory_equal(after[r], before[r], sizeof(after[r]));
        TU_OK(ctx, dsgd_strategy_train_step(s, g_x[2], g_y[2], 3 * B, &info));
        assert_int_equal(info.step, 2);
        dsgd_strategy_destroy(s);
        s = NULL;
        d.nonfinite = DSGD_NONFINITE_SKIP;
    }
    dsgd_ctx_destroy(ctx);
}

static void test_eval_per_replica(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = local_desc(3, DSGD_OPT_MOMENTUM, 4, 0, DSGD_OUTER_AVERAGE);
    dsgd_strategy *s = NULL;
    dsgd_model *m = NULL;
    dsgd_metrics got, one;
    float params[NP];
    double loss = 0.0, correct = 0.0;
    int r;
    (void)state;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    TU_OK(ctx, dsgd_model_create(ctx, &d.model, &m));
    train(ctx, s, 0, 2, even); /* mid-round: the replicas differ */
    TU_OK(ctx, dsgd_strategy_eval_batch(s, g_x[9], g_y[9], 3 * B));
    TU_OK(ctx, dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &got));
    for (r = 0; r < 3; ++r) {
        dsgd_batch b;
        memset(&b, 0, sizeof(b));
        b.x = g_x[9] + (size_t)r * B * IN;
        b.y = g_y[9] + (size_t)r * B;
        b.count = B;
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, r), params, NP));
        TU_OK(ctx, dsgd_model_set_params(m, params, NP));
        TU_OK(ctx, dsgd_model_evaluate(m, &b));
        TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &one));
        loss += one.loss_sum;
        correct += one.correct;
    }
    TU_NEAR(got.count, 3 * B, 0.0);
    TU_NEAR(got.correct, correct, 0.0);
    TU_NEAR(got.loss_sum, loss, 1e-6 * loss);
    dsgd_model_destroy(m);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* The pseudo-gradient on a half wire: the ring carries 2 bytes a
   parameter where fp32 carries 4, so with everything else equal (the
   same steps, agreements and algorithm) the replicas' bytes differ by
   exactly averagings x 2 (N - 1) x 2 x NP (each of the N blocks goes
   round the ring N - 1 times in each half, whatever the blocks' sizes);
   dsgd_strategy_comm_stats is the sum of the replicas' communicators
   (read here through dsgd_replica_comm), and the weights stay within the
   wire's rounding of fp32's. */
typedef struct stats_sum {
    dsgd_comm_stats sum;
    pthread_mutex_t mu;
} stats_sum;

static dsgd_result add_stats(dsgd_replica *r, void *user) {
    stats_sum *ss = (stats_sum *)user;
    dsgd_comm_stats c;
    dsgd_comm_get_stats(dsgd_replica_comm(r), &c);
    pthread_mutex_lock(&ss->mu);
    ss->sum.bytes_sent += c.bytes_sent;
    ss->sum.bytes_uncompressed += c.bytes_uncompressed;
    pthread_mutex_unlock(&ss->mu);
    return DSGD_OK;
}

static void test_wire(void **state) {
    static const dsgd_wire wires[3] = {DSGD_WIRE_F32, DSGD_WIRE_F16, DSGD_WIRE_BF16};
    const int n = 4, steps = 12, period = 4;
    float p[3][MAXN][NP];
    dsgd_comm_stats st[3];
    int k;
    size_t i;
    (void)state;
    for (k = 0; k < 3; ++k) {
        dsgd_strategy_desc d = local_desc(n, DSGD_OPT_SGD, period, 0, DSGD_OUTER_AVERAGE);
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        stats_sum ss;
        d.algorithm = DSGD_ALLREDUCE_RING;
        d.local.wire = wires[k];
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 0, steps, even);
        get_all(ctx, s, p[k]);
        TU_OK(ctx, dsgd_strategy_comm_stats(s, &st[k]));
        memset(&ss, 0, sizeof(ss));
        pthread_mutex_init(&ss.mu, NULL);
        TU_OK(ctx, dsgd_strategy_run(s, add_stats, &ss));
        pthread_mutex_destroy(&ss.mu);
        assert_true(ss.sum.bytes_sent == st[k].bytes_sent && ss.sum.bytes_uncompressed == st[k].bytes_uncompressed);
        dsgd_strategy_destroy(s);
        dsgd_ctx_destroy(ctx);
    }
    assert_true(st[0].bytes_sent == st[0].bytes_uncompressed);
    for (k = 1; k < 3; ++k) {
        uint64_t half = (uint64_t)(steps / period) * 2u * (uint64_t)(n - 1) * 2u * NP;
        print_message("    %s: %llu bytes sent, fp32 %llu (%llu less)\n", dsgd_wire_name(wires[k]),
                      (unsigned long long)st[k].bytes_sent, (unsigned long long)st[0].bytes_sent,
                      (unsigned long long)(st[0].bytes_sent - st[k].bytes_sent));
        assert_true(st[0].bytes_sent - st[k].bytes_sent == half);
        assert_true(st[k].bytes_uncompressed - st[k].bytes_sent == half);
        assert_true(memcmp(p[0][0], p[k][0], sizeof(p[0][0])) != 0); /* the wire did round */
        for (i = 0; i < NP; ++i)
            if (fabsf(p[k][0][i] - p[0][0][i]) > 0.02f * (fabsf(p[0][0][i]) + 0.1f))
                fail_msg("%s [%zu]: %g, fp32 %g", dsgd_wire_name(wires[k]), i, (double)p[k][0][i], (double)p[0][0][i]);
        assert_memory_equal(p[k][0], p[k][n - 1], sizeof(p[k][0])); /* averaged: one model */
    }
}

static void expect_refused(dsgd_strategy_desc d, const char *needle) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    if (!strstr(dsgd_ctx_last_error(ctx), needle)) fail_msg("'%s' lacks '%s'", dsgd_ctx_last_error(ctx), needle);
    dsgd_ctx_destroy(ctx);
}

static void test_bad_descs(void **state) {
    dsgd_strategy_desc d = local_desc(2, DSGD_OPT_SGD, 4, 0, DSGD_OUTER_NESTEROV), e;
    (void)state;
    e = d, e.local.period = -1, expect_refused(e, "local.period");
    e = d, e.local.warmup_steps = -2, expect_refused(e, "local.warmup_steps");
    e = d, e.local.outer_lr = -0.5f, expect_refused(e, "local.outer_lr");
    e = d, e.local.outer_lr = INFINITY, expect_refused(e, "local.outer_lr");
    e = d, e.local.outer_lr = NAN, expect_refused(e, "local.outer_lr");
    e = d, e.local.outer = DSGD_OUTER_SGD, e.local.outer_lr = -1.0f, expect_refused(e, "local.outer_lr");
    e = d, e.local.outer_momentum = 1.0f, expect_refused(e, "local.outer_momentum");
    e = d, e.local.outer_momentum = -0.1f, expect_refused(e, "local.outer_momentum");
    e = d, e.local.outer = (dsgd_outer_kind)7, expect_refused(e, "local.outer");
    e = d, e.gradient_path = DSGD_GRADIENTS_DEVICE, expect_refused(e, "HOST path");
    e = d, e.overlap = 1, expect_refused(e, "overlap");
    e = d, e.local.wire = (dsgd_wire)9, expect_refused(e, "local.wire");
    e = d, e.local.wire = DSGD_WIRE_F16, e.algorithm = DSGD_ALLREDUCE_HALVING_DOUBLING, expect_refused(e, "RING");
    assert_string_equal(dsgd_strategy_kind_name(DSGD_STRATEGY_LOCAL), "local");
}

static int setup(void **state) {
    (void)state;
    make_data();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_period1_like_mirrored),
        cmocka_unit_test(test_warmup_is_mirrored),
        cmocka_unit_test(test_outer_sgd_is_average),
        cmocka_unit_test(test_serial_reference),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_restore_at_boundary),
        cmocka_unit_test(test_two_workers),
        cmocka_unit_test(test_simnet),
        cmocka_unit_test(test_in_process_bits),
        cmocka_unit_test(test_in_process_traffic),
        cmocka_unit_test(test_in_process_across_workers),
        cmocka_unit_test(test_failures),
        cmocka_unit_test(test_eval_per_replica),
        cmocka_unit_test(test_wire),
        cmocka_unit_test(test_bad_descs),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
