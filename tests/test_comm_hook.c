/* test_comm_hook.c - comm hooks (comm_hook.h) in the synchronous strategies
   (dsgd_strategy_desc.comm_hook) and their checkpoints.

   The model is a small MLP, 12 -> 10 tanh -> 4 (softmax cross-entropy,
   174 floats in four variables), trained with momentum on uneven global
   batches.

   What is asserted, and how it is measured:
   - A hook that does the plain all-reduce (dsgd_allreduce_at at the
     bucket's offset) trains the very bits of no hook (memcmp of every
     replica's weights): MIRRORED N = 3 and 4, bucket_bytes 0, 4, 100 and
     600 (one bucket; every variable its own; cuts after the first variable
     that reaches the size), overlap off and on; over simnet (no overlap);
     and MULTI_WORKER_MIRRORED, 2 workers x 2 replicas over one loopback
     hub, with and without overlap, against MIRRORED x 4 without a hook.
   - What the hook sees, recorded per replica and step, against the model's
     own variables: the buckets cut by the rule (computed here from the
     variables; bucket_bytes 0, 4, 100 and 480, which the first variable
     reaches exactly), each holding whole variables in offset order with their
     names, offsets and shapes, the offsets and counts tiling the
     gradient, every bucket once per step (0 up without overlap, down with
     it), the step number, the replica's rank and the replica count.
     ONE_DEVICE and MIRRORED N = 1 never call reduce (create and destroy
     are still called once a replica).
   - A stateful hook (each element rounded to a multiple of 1/64 with an
     error-feedback residual, then the plain all-reduce): 25 steps, save,
     destroy, create a new strategy, restore, 25 steps give the weights and
     every replica's residual of 50 uninterrupted steps bit for bit
     (MIRRORED N = 3, overlap off and on); across workers, 2 x 2 save at
     step 25 (the chief gathers worker 1's residuals), and 2 x 2 and a
     one-process MIRRORED x 4 restore it and end with the bits of
     MIRRORED x 4 uninterrupted.
   - Bad hooks at creation (name NULL, empty, 32 bytes; no reduce;
     state_bytes without load; gradient_path DEVICE; CENTRAL_STORAGE;
     PARAMETER_SERVER) are DSGD_ERR_INVALID_ARGUMENT with a message saying
     so; a create that fails on replica 2 has the states of replicas 0
     and 1 destroyed; workers whose hook names differ fail creation on
     every worker naming the rank.
   - Restore mismatches, each DSGD_ERR_INVALID_ARGUMENT with a message
     saying what differs, the strategy untouched (weights and residuals)
     and usable: another hook name, no section for a hook with state, a
     section into a strategy without a hook, another replica count; a load
     that fails (the replicas loaded before it get their bytes back); a
     stateless hook restores at another replica count.
   - A hook failing on replica 1 at step 2 fails the step with its own
     message (prefixed with the hook, bucket and step), the strategy
     reports failed, and the call returns well before the deadline (the
     transport is aborted), with and without overlap.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>

enum { IN = 12, OUT = 4, NP = IN * 10 + 10 + 10 * OUT + OUT, MAXN = 4, B = 8, STEPS = 50, MAXB = 64 };

static const dsgd_layer_desc LAYERS[2] = {{10, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static float g_x[STEPS][MAXN * B * IN], g_y[STEPS][MAXN * B];

static int count_of(int n, int step) { return step % 3 ? n * B - step % 5 : n * B; }

static void make_data(void) {
    tu_rng r = tu_rng_make(606);
    int s, i;
    for (s = 0; s < STEPS; ++s) {
        tu_fill(&r, g_x[s], (size_t)MAXN * B * IN, -1.0f, 1.0f);
        for (i = 0; i < MAXN * B; ++i) g_y[s][i] = (float)tu_below(&r, OUT);
    }
}

static dsgd_strategy_desc base_desc(dsgd_strategy_kind kind, int n) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = B;
    d.model.seed = 5;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.1f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 20.0;
    d.cpu_threads = 1;
    return d;
}

/* ---------------------------------------------------------------- hooks */

/* What a hook saw on one replica: every call of a step, in order. */
enum { MAXCALLS = 8 };
typedef struct seen {
    int calls[STEPS];                /* reduce calls per step */
    int index[STEPS][MAXCALLS];      /* bucket index, in call order */
    size_t first[STEPS][MAXCALLS], count[STEPS][MAXCALLS];
    const float *base;               /* data - first (the same flat buffer every call) */
    int bad;                         /* a field inconsistent with the rest (why in msg) */
    char msg[256];
} seen;

/* The tests' hook user: one slot per global replica; the state of a
   replica is its slot. */
typedef struct hook_user {
    int ef;                 /* round to 1/64 with error feedback before the all-reduce */
    int fail_replica;       /* reduce fails on this replica ... */
    int fail_step;          /* ... at this step (-1: never) */
    int fail_create;        /* create fails for this replica (-1: never) */
    int load_fails;         /* load rejects on this replica (-1: never) */
    int creates, destroys;  /* under mu */
    pthread_mutex_t mu;
    struct slot {
        struct hook_user *u;
        int replica, num_replicas;
        size_t np;
        float *residual;    /* ef: np floats */
        seen *seen;
    } slot[MAXN];
} hook_user;

static void user_init(hook_user *u, int ef) {
    memset(u, 0, sizeof(*u));
    u->ef = ef;
    u->fail_replica = u->fail_step = u->fail_create = u->load_fails = -1;
    pthread_mutex_init(&u->mu, NULL);
}

static void user_free(hook_user *u) {
    int r;
    for (r = 0; r < MAXN; ++r) free(u->slot[r].seen);
    pthread_mutex_destroy(&u->mu);
}

static dsgd_result h_create(void *user, int replica, int num_replicas, size_t num_params, void **state) {
    hook_user *u = (hook_user *)user;
    struct slot *sl = &u->slot[replica];
    if (replica == u->fail_create) return DSGD_ERR_OUT_OF_MEMORY;
    sl->u = u;
    sl->replica = replica;
    sl->num_replicas = num_replicas;
    sl->np = num_params;
    sl->residual = u->ef ? (float *)calloc(num_params, sizeof(float)) : NULL;
    free(sl->seen); /* a strategy before this one's, on the same user */
    sl->seen = (seen *)calloc(1, sizeof(seen));
    if (!sl->seen || (u->ef && !sl->residual)) return DSGD_ERR_OUT_OF_MEMORY;
    pthread_mutex_lock(&u->mu);
    u->creates++;
    pthread_mutex_unlock(&u->mu);
    *state = sl;
    return DSGD_OK;
}

static void h_destroy(void *state) {
    struct slot *sl = (struct slot *)state;
    pthread_mutex_lock(&sl->u->mu);
    sl->u->destroys++;
    pthread_mutex_unlock(&sl->u->mu);
    free(sl->residual);
    sl->residual = NULL; /* seen stays for the checks (user_free) */
}

static void note(seen *w, const dsgd_hook_bucket *b) {
    int step = (int)b->step, c;
    if (step < 0 || step >= STEPS || w->calls[step] >= MAXCALLS) {
        w->bad = 1;
        snprintf(w->msg, sizeof(w->msg), "step %d, or too many calls", step);
        return;
    }
    c = w->calls[step]++;
    w->index[step][c] = b->index;
    w->first[step][c] = b->first;
    w->count[step][c] = b->count;
    if (!w->base) w->base = b->data - b->first;
    if (b->data - b->first != w->base) {
        w->bad = 1;
        snprintf(w->msg, sizeof(w->msg), "bucket %d's data is not in the flat buffer of the others", b->index);
    }
}

static dsgd_result h_reduce(void *state, const dsgd_hook_bucket *b) {
    struct slot *sl = (struct slot *)state;
    hook_user *u = sl->u;
    size_t i;
    note(sl->seen, b);
    if (b->replica != sl->replica || b->num_replicas != sl->num_replicas) {
        sl->seen->bad = 1;
        snprintf(sl->seen->msg, sizeof(sl->seen->msg), "replica %d of %d, created as %d of %d", b->replica,
                 b->num_replicas, sl->replica, sl->num_replicas);
    }
    if (sl->replica == u->fail_replica && (int)b->step == u->fail_step)
        return dsgd_ctx_set_error(dsgd_comm_ctx(b->comm), DSGD_ERR_INVALID_ARGUMENT, "the test hook refuses");
    if (u->ef)
        for (i = 0; i < b->count; ++i) {
            float x = b->data[i] + sl->residual[b->first + i];
            float q = (float)floor(x * 64.0f + 0.5f) / 64.0f;
            sl->residual[b->first + i] = x - q;
            b->data[i] = q;
        }
    return dsgd_allreduce_at(b->comm, b->data, b->count, b->first, DSGD_REDUCE_SUM, b->algorithm, b->timeout_s);
}

static size_t h_state_bytes(void *state) {
    struct slot *sl = (struct slot *)state;
    return sl->np * sizeof(float);
}

static dsgd_result h_save(void *state, void *dst, size_t bytes) {
    struct slot *sl = (struct slot *)state;
    if (bytes != sl->np * sizeof(float)) return DSGD_ERR_INVALID_ARGUMENT;
    memcpy(dst, sl->residual, bytes);
    return DSGD_OK;
}

static dsgd_result h_load(void *state, const void *src, size_t bytes) {
    struct slot *sl = (struct slot *)state;
    if (bytes != sl->np * sizeof(float) || sl->replica == sl->u->load_fails) return DSGD_ERR_INVALID_ARGUMENT;
    memcpy(sl->residual, src, bytes);
    return DSGD_OK;
}

/* The plain all-reduce hook ("allreduce") or the error-feedback one ("ef"). */
static dsgd_comm_hook make_hook(hook_user *u, const char *name) {
    dsgd_comm_hook h;
    memset(&h, 0, sizeof(h));
    h.name = name;
    h.create = h_create;
    h.reduce = h_reduce;
    h.destroy = h_destroy;
    h.user = u;
    if (u->ef) {
        h.state_bytes = h_state_bytes;
        h.save = h_save;
        h.load = h_load;
    }
    return h;
}

/* ---------------------------------------------------------------- runs */

/* Trains steps [from, to) on s (n replicas in sync) and checks that every
   replica holds replica 0's weights. */
static void train(dsgd_ctx *ctx, dsgd_strategy *s, int n, int from, int to) {
    int step;
    for (step = from; step < to; ++step) TU_OK(ctx, dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(n, step), NULL));
    tu_assert_replicas_identical(ctx, s);
}

/* A MIRRORED run of `steps` steps with desc d; replica 0's weights in out. */
static void run_mirrored(const dsgd_strategy_desc *d, int steps, float *out) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, d, &s));
    train(ctx, s, d->num_replicas, 0, steps);
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), out, NP));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* The buckets the rule cuts from m's variables (whole variables, a cut
   after the first that reaches bytes; 0: one), into lo[0..nb]. */
static int expected_buckets(dsgd_model *m, size_t bytes, size_t *lo) {
    int i, nb = 0, nv = dsgd_model_num_variables(m);
    size_t p = dsgd_model_num_params(m);
    lo[0] = 0;
    for (i = 0; i < nv; ++i) {
        const dsgd_variable *v = dsgd_model_variable(m, i);
        size_t end = v->offset + v->count;
        if (bytes && (end - lo[nb]) * sizeof(float) >= bytes && end < p) lo[++nb] = end;
    }
    lo[++nb] = p;
    return nb;
}

/* What a replica's hook saw in `steps` steps against the model's buckets:
   each bucket once a step, in order (down with overlap), with its bounds. */
static void check_seen(const seen *w, dsgd_model *m, size_t bytes, int steps, int overlap, int replica) {
    size_t lo[16];
    int nb = expected_buckets(m, bytes, lo), step, c;
    if (w->bad) fail_msg("replica %d: %s", replica, w->msg);
    for (step = 0; step < steps; ++step) {
        if (w->calls[step] != nb) fail_msg("replica %d step %d: %d calls for %d buckets", replica, step, w->calls[step], nb);
        for (c = 0; c < nb; ++c) {
            int k = overlap ? nb - 1 - c : c;
            if (w->index[step][c] != k || w->first[step][c] != lo[k] || w->count[step][c] != lo[k + 1] - lo[k])
                fail_msg("replica %d step %d call %d: bucket %d [%zu, +%zu), want %d [%zu, +%zu)", replica, step, c,
                         w->index[step][c], w->first[step][c], w->count[step][c], k, lo[k], lo[k + 1] - lo[k]);
        }
    }
}

/* ---------------------------------------------------------------- the plain all-reduce: no hook's bits */

static void test_plain_allreduce_bits(void **state) {
    static const size_t buckets[4] = {0, 4, 100, 600};
    float want[NP], got[NP];
    int n, k, ov;
    (void)state;
    tu_watchdog_for("plain all-reduce hook", 300);
    for (n = 3; n <= 4; ++n) {
        dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, n);
        run_mirrored(&d, 6, want);
        for (k = 0; k < 4; ++k)
            for (ov = 0; ov < 2; ++ov) {
                hook_user u;
                dsgd_comm_hook h;
                dsgd_ctx *ctx = tu_ctx();
                dsgd_strategy *s = NULL;
                int r;
                user_init(&u, 0);
                h = make_hook(&u, "allreduce");
                d = base_desc(DSGD_STRATEGY_MIRRORED, n);
                d.bucket_bytes = buckets[k];
                d.overlap = ov;
                d.comm_hook = &h;
                TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
                memset(&h, 0, sizeof(h)); /* the strategy copied the table */
                train(ctx, s, n, 0, 6);
                TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), got, NP));
                if (memcmp(got, want, sizeof(got)) != 0)
                    fail_msg("N=%d bucket_bytes %zu overlap %d: the hook's weights differ (rel err %.3g)", n, buckets[k],
                             ov, tu_rel_err(got, want, NP));
                for (r = 0; r < n; ++r) check_seen(u.slot[r].seen, dsgd_strategy_model(s, r), buckets[k], 6, ov, r);
                assert_int_equal(u.creates, n);
                dsgd_strategy_destroy(s);
                assert_int_equal(u.destroys, n);
                dsgd_ctx_destroy(ctx);
                user_free(&u);
            }
        printf("    N=%d: the plain all-reduce hook = no hook, bit for bit, at bucket_bytes 0/4/100/600, overlap "
               "off and on\n", n);
    }
    tu_watchdog(0);
}

/* Each bucket's variables: whole, in offset order, contiguous from the
   bucket's first float to its last, with the model's names and shapes. */
static dsgd_model *g_vars_model; /* the model they are checked against (replica 0's: the same layout) */
static int g_vars_bad;
static char g_vars_msg[256];
static pthread_mutex_t g_vars_mu = PTHREAD_MUTEX_INITIALIZER;

static dsgd_result vars_check_reduce(void *state, const dsgd_hook_bucket *b) {
    size_t at = b->first;
    int i, k, nv = dsgd_model_num_variables(g_vars_model), bad = 0;
    char why[256] = "";
    for (i = 0; i < b->num_vars && !bad; ++i) {
        const dsgd_variable *v = b->vars[i], *want = NULL;
        for (k = 0; k < nv; ++k)
            if (!strcmp(dsgd_model_variable(g_vars_model, k)->name, v->name)) want = dsgd_model_variable(g_vars_model, k);
        if (!want || want->offset != v->offset || want->count != v->count || want->rank != v->rank ||
            memcmp(want->shape, v->shape, sizeof(int) * (size_t)v->rank) != 0 || v->offset != at) {
            bad = 1;
            snprintf(why, sizeof(why), "bucket %d: variable %d '%s' at %zu (expected at %zu) not the model's", b->index,
                     i, v->name, v->offset, at);
        }
        at = v->offset + v->count;
    }
    if (!bad && at != b->first + b->count) {
        bad = 1;
        snprintf(why, sizeof(why), "bucket %d: its variables end at %zu, the bucket at %zu", b->index, at,
                 b->first + b->count);
    }
    if (bad) {
        pthread_mutex_lock(&g_vars_mu);
        if (!g_vars_bad) snprintf(g_vars_msg, sizeof(g_vars_msg), "%s", why);
        g_vars_bad = 1;
        pthread_mutex_unlock(&g_vars_mu);
    }
    return h_reduce(state, b);
}

static void test_hook_sees_variables(void **state) {
    static const size_t buckets[4] = {0, 4, 100, 480}; /* 480: exactly the first variable */
    int k, ov, n;
    (void)state;
    tu_watchdog_for("the hook's view", 120);
    for (k = 0; k < 4; ++k)
        for (ov = 0; ov < 2; ++ov) {
            hook_user u;
            dsgd_comm_hook h;
            dsgd_ctx *ctx = tu_ctx();
            dsgd_strategy *s = NULL;
            dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 2);
            user_init(&u, 0);
            h = make_hook(&u, "vars");
            h.reduce = vars_check_reduce;
            d.bucket_bytes = buckets[k];
            d.overlap = ov;
            d.comm_hook = &h;
            TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
            g_vars_model = dsgd_strategy_model(s, 0);
            g_vars_bad = 0;
            train(ctx, s, 2, 0, 3);
            if (g_vars_bad) fail_msg("bucket_bytes %zu overlap %d: %s", buckets[k], ov, g_vars_msg);
            check_seen(u.slot[1].seen, dsgd_strategy_model(s, 1), buckets[k], 3, ov, 1);
            dsgd_strategy_destroy(s);
            dsgd_ctx_destroy(ctx);
            user_free(&u);
        }
    /* one replica in sync: create and destroy, never reduce */
    for (n = 0; n < 2; ++n) {
        hook_user u;
        dsgd_comm_hook h;
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        dsgd_strategy_desc d = base_desc(n ? DSGD_STRATEGY_MIRRORED : DSGD_STRATEGY_ONE_DEVICE, 1);
        user_init(&u, 0);
        h = make_hook(&u, "never");
        d.comm_hook = &h;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 1, 0, 2);
        assert_int_equal(u.creates, 1);
        assert_int_equal(u.slot[0].seen->calls[0] + u.slot[0].seen->calls[1], 0);
        dsgd_strategy_destroy(s);
        assert_int_equal(u.destroys, 1);
        dsgd_ctx_destroy(ctx);
        user_free(&u);
    }
    tu_watchdog(0);
}

/* Over simnet (no overlap), the plain hook trains the loopback's bits
   without a hook. */
static void test_simnet(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_desc sd;
    dsgd_simnet *hub = NULL;
    dsgd_transport_i eps[3];
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 3);
    dsgd_strategy *s = NULL;
    hook_user u;
    dsgd_comm_hook h;
    float want[NP], got[NP];
    int i;
    (void)state;
    tu_watchdog_for("simnet", 120);
    d.bucket_bytes = 100;
    run_mirrored(&d, 4, want);
    memset(&sd, 0, sizeof(sd));
    sd.ranks = 3;
    sd.alpha_s = 1e-6;
    sd.beta_s_per_byte = 1e-9;
    sd.park_between_calls = 1;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    for (i = 0; i < 3; ++i) TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &eps[i]));
    user_init(&u, 0);
    h = make_hook(&u, "allreduce");
    d.endpoints = eps;
    d.comm_hook = &h;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    train(ctx, s, 3, 0, 4);
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), got, NP));
    assert_memory_equal(got, want, sizeof(got));
    check_seen(u.slot[2].seen, dsgd_strategy_model(s, 2), 100, 4, 0, 2);
    dsgd_strategy_destroy(s);
    assert_true(dsgd_simnet_time(hub, 0) > 0.0);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
    user_free(&u);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- the stateful hook across a checkpoint */

/* MIRRORED n with the ef hook: steps [0, stop) (save to path at the end
   when path), or restore path then steps [start, STEPS). Weights and every
   replica's residual out. */
static void ef_run(int n, int overlap, int start, int stop, const char *save, const char *restore, float *params,
                   float residual[MAXN][NP]) {
    hook_user u;
    dsgd_comm_hook h;
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, n);
    int r;
    user_init(&u, 1);
    h = make_hook(&u, "ef");
    d.bucket_bytes = 100;
    d.overlap = overlap;
    d.comm_hook = &h;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    if (restore) TU_OK(ctx, dsgd_strategy_restore(s, restore, NULL));
    train(ctx, s, n, start, stop);
    if (save) TU_OK(ctx, dsgd_strategy_save(s, save, NULL));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), params, NP));
    for (r = 0; r < n; ++r) memcpy(residual[r], u.slot[r].residual, sizeof(float) * NP);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    user_free(&u);
}

static void test_stateful_checkpoint(void **state) {
    static float want_res[MAXN][NP], got_res[MAXN][NP], mid_res[MAXN][NP];
    float want[NP], got[NP], mid[NP];
    char dir[64], path[128];
    int ov, r;
    (void)state;
    tu_watchdog_for("the stateful hook's checkpoint", 300);
    tu_mkdtemp(dir);
    snprintf(path, sizeof(path), "%s/ef.ckpt", dir);
    for (ov = 0; ov < 2; ++ov) {
        double resid = 0.0;
        ef_run(3, ov, 0, STEPS, NULL, NULL, want, want_res);
        ef_run(3, ov, 0, STEPS / 2, path, NULL, mid, mid_res);
        ef_run(3, ov, STEPS / 2, STEPS, NULL, path, got, got_res);
        if (memcmp(got, want, sizeof(got)) != 0)
            fail_msg("overlap %d: 25 + 25 steps through a checkpoint differ from 50 (rel err %.3g)", ov,
                     tu_rel_err(got, want, NP));
        for (r = 0; r < 3; ++r) {
            if (memcmp(got_res[r], want_res[r], sizeof(float) * NP) != 0)
                fail_msg("overlap %d: replica %d's residual differs after the restore", ov, r);
            resid += fabs(mid_res[r][0]) + fabs(mid_res[r][NP - 1]);
        }
        assert_true(resid > 0.0); /* the residuals were not all zero at the save */
    }
    printf("    MIRRORED x3, error feedback to 1/64: 25 + save/restore + 25 steps = 50 steps, weights and residuals "
           "bit for bit (overlap off and on)\n");
    tu_rmdir_files(dir);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- across workers */

typedef struct worker {
    dsgd_transport_i *eps;
    dsgd_strategy_desc d;
    hook_user *u;            /* shared by the workers: slots by global replica */
    const char *hook_name;
    const char *save, *restore;
    int start, stop;
    dsgd_result create_res, res;
    char msg[1024];
    float params[2][NP];
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    dsgd_comm_hook h;
    int step, r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return NULL;
    w->d.endpoints = w->eps;
    if (w->hook_name) {
        h = make_hook(w->u, w->hook_name);
        w->d.comm_hook = &h;
    }
    w->create_res = dsgd_strategy_create(ctx, &w->d, &s);
    snprintf(w->msg, sizeof(w->msg), "%s", dsgd_ctx_last_error(ctx));
    if (w->create_res != DSGD_OK) {
        dsgd_ctx_destroy(ctx);
        return NULL;
    }
    w->res = w->restore ? dsgd_strategy_restore(s, w->restore, NULL) : DSGD_OK;
    for (step = w->start; step < w->stop && w->res == DSGD_OK; ++step)
        w->res = dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(MAXN, step), NULL);
    if (w->res == DSGD_OK && w->save) w->res = dsgd_strategy_save(s, w->save, NULL);
    if (w->res != DSGD_OK) snprintf(w->msg, sizeof(w->msg), "%s", dsgd_ctx_last_error(ctx));
    for (r = 0; r < dsgd_strategy_num_replicas(s); ++r) dsgd_model_get_params(dsgd_strategy_model(s, r), w->params[r], NP);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

/* Two workers of two replicas over one loopback hub. */
static void run_workers(worker *ws) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[MAXN];
    pthread_t th[2];
    int i;
    TU_OK(ctx, dsgd_loopback_create(ctx, MAXN, &hub));
    for (i = 0; i < MAXN; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    for (i = 0; i < 2; ++i) {
        ws[i].eps = eps + 2 * i;
        ws[i].d.num_replicas = 2;
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &ws[i]), 0);
    }
    for (i = 0; i < 2; ++i) pthread_join(th[i], NULL);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

static void init_workers(worker *ws, hook_user *u, const char *name, int overlap, int start, int stop) {
    int i;
    memset(ws, 0, 2 * sizeof(worker));
    for (i = 0; i < 2; ++i) {
        ws[i].d = base_desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 2);
        ws[i].d.bucket_bytes = 100;
        ws[i].d.overlap = overlap;
        ws[i].u = u;
        ws[i].hook_name = name;
        ws[i].start = start;
        ws[i].stop = stop;
    }
}

static void check_workers(const worker *ws, const float *want, const char *what) {
    int i, r;
    for (i = 0; i < 2; ++i) {
        if (ws[i].create_res != DSGD_OK || ws[i].res != DSGD_OK) fail_msg("%s: worker %d: %s", what, i, ws[i].msg);
        for (r = 0; r < 2; ++r)
            if (memcmp(ws[i].params[r], want, sizeof(float) * NP) != 0)
                fail_msg("%s: worker %d replica %d differs from MIRRORED x4 (rel err %.3g)", what, i, r,
                         tu_rel_err(ws[i].params[r], want, NP));
    }
}

static void test_workers(void **state) {
    static float want_res[MAXN][NP], res[MAXN][NP];
    worker ws[2];
    hook_user u;
    float want[NP], got[NP];
    char dir[64], path[128];
    int ov, r;
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model *m = NULL; /* the layout, for the buckets the hook must see */
    dsgd_strategy_desc md = base_desc(DSGD_STRATEGY_MIRRORED, 1);
    (void)state;
    tu_watchdog_for("comm hooks across workers", 300);
    TU_OK(ctx, dsgd_model_create(ctx, &md.model, &m));
    /* the plain hook: MIRRORED x4's bits without a hook */
    for (ov = 0; ov < 2; ++ov) {
        dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, MAXN);
        d.bucket_bytes = 100;
        run_mirrored(&d, 6, want);
        user_init(&u, 0);
        init_workers(ws, &u, "allreduce", ov, 0, 6);
        run_workers(ws);
        check_workers(ws, want, ov ? "plain hook, overlap" : "plain hook");
        for (r = 0; r < MAXN; ++r) check_seen(u.slot[r].seen, m, 100, 6, ov, r);
        assert_int_equal(u.creates, MAXN);
        assert_int_equal(u.destroys, MAXN);
        user_free(&u);
    }
    /* the stateful hook through a checkpoint the chief writes */
    tu_mkdtemp(dir);
    snprintf(path, sizeof(path), "%s/ef.ckpt", dir);
    ef_run(MAXN, 0, 0, STEPS, NULL, NULL, want, want_res);
    user_init(&u, 1);
    init_workers(ws, &u, "ef", 1, 0, STEPS / 2);
    ws[0].save = ws[1].save = path;
    run_workers(ws);
    for (r = 0; r < 2; ++r)
        if (ws[r].res != DSGD_OK) fail_msg("worker %d: %s", r, ws[r].msg);
    user_free(&u);
    user_init(&u, 1);
    init_workers(ws, &u, "ef", 0, STEPS / 2, STEPS);
    ws[0].restore = ws[1].restore = path;
    run_workers(ws);
    check_workers(ws, want, "ef hook, 2 x 2 saved at 25, 2 x 2 restored");
    user_free(&u);
    ef_run(MAXN, 0, STEPS / 2, STEPS, NULL, path, got, res); /* one process of 4 from the workers' file */
    assert_memory_equal(got, want, sizeof(got));
    for (r = 0; r < MAXN; ++r)
        if (memcmp(res[r], want_res[r], sizeof(float) * NP) != 0) fail_msg("replica %d's residual differs", r);
    printf("    2 workers x 2: the plain hook = MIRRORED x4 (overlap off, on); the ef hook saved across workers at "
           "step 25, restored by 2 x 2 and by 1 x 4: the 50-step bits, residuals too\n");
    tu_rmdir_files(dir);
    /* workers that disagree on the hook fail creation on every worker */
    for (ov = 0; ov < 2; ++ov) {
        int i;
        user_init(&u, 0);
        init_workers(ws, &u, "allreduce", 0, 0, 1);
        ws[1].hook_name = ov ? NULL : "other";
        run_workers(ws);
        for (i = 0; i < 2; ++i) {
            assert_int_equal(ws[i].create_res, DSGD_ERR_INVALID_ARGUMENT);
            if (!strstr(ws[i].msg, "rank 2 describes another model, optimizer or strategy"))
                fail_msg("worker %d: %s", i, ws[i].msg);
        }
        user_free(&u);
    }
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- refusals */

static void expect_create_fails(const dsgd_strategy_desc *d, const char *needle) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, d, &s));
    assert_null(s);
    if (!strstr(dsgd_ctx_last_error(ctx), needle)) fail_msg("want \"%s\" in: %s", needle, dsgd_ctx_last_error(ctx));
    dsgd_ctx_destroy(ctx);
}

static void test_bad_hooks(void **state) {
    hook_user u;
    dsgd_comm_hook h;
    dsgd_strategy_desc d;
    dsgd_ctx *ctx;
    dsgd_strategy *s = NULL;
    (void)state;
    tu_watchdog_for("bad hooks", 60);
    user_init(&u, 1);
    d = base_desc(DSGD_STRATEGY_MIRRORED, 2);
    d.comm_hook = &h;
    h = make_hook(&u, NULL);
    expect_create_fails(&d, "comm_hook.name is NULL");
    h = make_hook(&u, "");
    expect_create_fails(&d, "comm_hook.name is empty");
    h = make_hook(&u, "abcdefghijklmnopqrstuvwxyz012345"); /* 32 bytes */
    expect_create_fails(&d, "comm_hook.name is too long");
    h = make_hook(&u, "abcdefghijklmnopqrstuvwxyz01234"); /* 31: fine */
    ctx = tu_ctx();
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    h = make_hook(&u, "ef");
    h.reduce = NULL;
    expect_create_fails(&d, "comm hook 'ef' has no reduce");
    h = make_hook(&u, "ef");
    h.load = NULL;
    expect_create_fails(&d, "comm hook 'ef' has state_bytes but no load");
    h = make_hook(&u, "ef");
    d.gradient_path = DSGD_GRADIENTS_DEVICE;
    expect_create_fails(&d, "not with gradient_path DEVICE");
    d = base_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 2);
    d.comm_hook = &h;
    expect_create_fails(&d, "HOST path, not central_storage");
    d = base_desc(DSGD_STRATEGY_PARAMETER_SERVER, 2);
    d.comm_hook = &h;
    expect_create_fails(&d, "HOST path, not parameter_server");
    /* a hook that applies momentum itself takes plain SGD only */
    d = base_desc(DSGD_STRATEGY_MIRRORED, 2);
    d.comm_hook = &h;
    h.owns_momentum = 1;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    expect_create_fails(&d, "comm hook 'ef' applies momentum itself (momentum correction), so the optimizer must be "
                            "DSGD_OPT_SGD, not DSGD_OPT_MOMENTUM");
    d.optimizer.kind = DSGD_OPT_ADAMW;
    expect_create_fails(&d, "must be DSGD_OPT_SGD, not DSGD_OPT_ADAMW");
    d.optimizer.kind = DSGD_OPT_SGD;
    ctx = tu_ctx();
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    user_free(&u);
    /* create fails on replica 2: the states made are destroyed */
    user_init(&u, 1);
    u.fail_create = 2;
    h = make_hook(&u, "ef");
    d = base_desc(DSGD_STRATEGY_MIRRORED, 3);
    d.comm_hook = &h;
    ctx = tu_ctx();
    TU_ERR(ctx, DSGD_ERR_OUT_OF_MEMORY, dsgd_strategy_create(ctx, &d, &s));
    if (!strstr(dsgd_ctx_last_error(ctx), "comm hook 'ef' could not create replica 2's state"))
        fail_msg("%s", dsgd_ctx_last_error(ctx));
    assert_int_equal(u.creates, 2);
    assert_int_equal(u.destroys, 2);
    dsgd_ctx_destroy(ctx);
    user_free(&u);
    tu_watchdog(0);
}

/* Restores path into a fresh MIRRORED n with hook (NULL: none; its user u)
   and expects needle; the strategy is untouched and trains on. */
static void expect_restore_fails(const char *path, int n, hook_user *u, const char *name, dsgd_result want,
                                 const char *needle) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    dsgd_comm_hook h;
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, n);
    float before[NP], after[NP];
    static float res[MAXN][NP];
    int r;
    if (name) {
        h = make_hook(u, name);
        d.comm_hook = &h;
    }
    d.bucket_bytes = 100;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    train(ctx, s, n, 0, 2); /* residuals not zero */
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), before, NP));
    for (r = 0; name && u->ef && r < n; ++r) memcpy(res[r], u->slot[r].residual, sizeof(float) * NP);
    TU_ERR(ctx, want, dsgd_strategy_restore(s, path, NULL));
    if (!strstr(dsgd_ctx_last_error(ctx), needle)) fail_msg("want \"%s\" in: %s", needle, dsgd_ctx_last_error(ctx));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), after, NP));
    assert_memory_equal(after, before, sizeof(after));
    for (r = 0; name && u->ef && r < n; ++r)
        if (memcmp(res[r], u->slot[r].residual, sizeof(float) * NP) != 0) fail_msg("replica %d's residual changed", r);
    assert_false(dsgd_strategy_failed(s));
    train(ctx, s, n, 2, 3);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_restore_mismatch(void **state) {
    static float res[MAXN][NP];
    hook_user u;
    float p[NP];
    char dir[64], with_ef[128], without[128], plain[128], needle[128];
    (void)state;
    tu_watchdog_for("restore mismatches", 120);
    tu_mkdtemp(dir);
    snprintf(with_ef, sizeof(with_ef), "%s/ef.ckpt", dir);
    snprintf(without, sizeof(without), "%s/none.ckpt", dir);
    snprintf(plain, sizeof(plain), "%s/plain.ckpt", dir);
    ef_run(3, 0, 0, 3, with_ef, NULL, p, res);
    {
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 3);
        dsgd_comm_hook h;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 3, 0, 2);
        TU_OK(ctx, dsgd_strategy_save(s, without, NULL));
        dsgd_strategy_destroy(s);
        user_init(&u, 0);
        h = make_hook(&u, "allreduce");
        d.comm_hook = &h;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 3, 0, 2);
        TU_OK(ctx, dsgd_strategy_save(s, plain, NULL));
        dsgd_strategy_destroy(s);
        user_free(&u);
        dsgd_ctx_destroy(ctx);
    }
    user_init(&u, 1);
    expect_restore_fails(with_ef, 3, &u, "ef2", DSGD_ERR_INVALID_ARGUMENT,
                         "holds the state of comm hook 'ef', the strategy's hook is 'ef2'");
    user_free(&u);
    user_init(&u, 1);
    expect_restore_fails(without, 3, &u, "ef", DSGD_ERR_INVALID_ARGUMENT, "has no state of comm hook 'ef'");
    user_free(&u);
    user_init(&u, 1);
    expect_restore_fails(plain, 3, &u, "ef", DSGD_ERR_INVALID_ARGUMENT, "has no state of comm hook 'ef'");
    user_free(&u);
    expect_restore_fails(with_ef, 3, NULL, NULL, DSGD_ERR_INVALID_ARGUMENT,
                         "holds the state of comm hook 'ef'; the strategy has no comm hook");
    user_init(&u, 1);
    expect_restore_fails(with_ef, 2, &u, "ef", DSGD_ERR_INVALID_ARGUMENT,
                         "comm hook 'ef''s state of 3 replicas, the strategy has 2 in sync");
    user_free(&u);
    user_init(&u, 1);
    u.load_fails = 1; /* replica 0 loads, 1 refuses: 0 gets its own bytes back */
    snprintf(needle, sizeof(needle), "comm hook 'ef' could not load replica 1's state (%zu bytes)", NP * sizeof(float));
    expect_restore_fails(with_ef, 3, &u, "ef", DSGD_ERR_INVALID_ARGUMENT, needle);
    user_free(&u);
    /* stateless: no section, any replica count; the checkpoint of no hook too */
    {
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 2);
        dsgd_comm_hook h;
        float want[NP], got[NP];
        user_init(&u, 0);
        h = make_hook(&u, "allreduce");
        d.comm_hook = &h;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        TU_OK(ctx, dsgd_strategy_restore(s, plain, NULL));
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 1), got, NP));
        dsgd_strategy_destroy(s);
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        TU_OK(ctx, dsgd_strategy_restore(s, without, NULL));
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 1), want, NP));
        dsgd_strategy_destroy(s);
        assert_memory_equal(got, want, sizeof(got)); /* the same 2 steps of 3 replicas, with and without the hook */
        user_free(&u);
        dsgd_ctx_destroy(ctx);
    }
    tu_rmdir_files(dir);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- a failing hook */

static void test_failing_hook(void **state) {
    int ov;
    (void)state;
    tu_watchdog_for("a failing hook", 120);
    for (ov = 0; ov < 2; ++ov) {
        hook_user u;
        dsgd_comm_hook h;
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy *s = NULL;
        dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 3);
        double t;
        dsgd_result res;
        user_init(&u, 0);
        u.fail_replica = 1;
        u.fail_step = 2;
        h = make_hook(&u, "failing");
        d.bucket_bytes = 100;
        d.overlap = ov;
        d.timeout_s = 8.0;
        d.comm_hook = &h;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train(ctx, s, 3, 0, 2);
        t = dsgd_now();
        res = dsgd_strategy_train_step(s, g_x[2], g_y[2], count_of(3, 2), NULL);
        t = dsgd_now() - t;
        assert_int_equal(res, DSGD_ERR_INVALID_ARGUMENT);
        if (!strstr(dsgd_ctx_last_error(ctx), "step 2: comm hook 'failing' failed on bucket") ||
            !strstr(dsgd_ctx_last_error(ctx), "the test hook refuses"))
            fail_msg("overlap %d: %s", ov, dsgd_ctx_last_error(ctx));
        assert_true(dsgd_strategy_failed(s));
        assert_true(t < 4.0); /* aborted, not the 8 s deadline */
        printf("    overlap %d: the failing hook fails the step in %.3f s: %s\n", ov, t, dsgd_ctx_last_error(ctx));
        TU_ERR(ctx, DSGD_ERR_STATE, dsgd_strategy_train_step(s, g_x[3], g_y[3], count_of(3, 3), NULL));
        dsgd_strategy_destroy(s);
        assert_int_equal(u.destroys, 3);
        dsgd_ctx_destroy(ctx);
        user_free(&u);
    }
    tu_watchdog(0);
}

static int setup(void **state) {
    (void)state;
    make_data();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plain_allreduce_bits),
        cmocka_unit_test(test_hook_sees_variables),
        cmocka_unit_test(test_simnet),
        cmocka_unit_test(test_stateful_checkpoint),
        cmocka_unit_test(test_workers),
        cmocka_unit_test(test_bad_hooks),
        cmocka_unit_test(test_restore_mismatch),
        cmocka_unit_test(test_failing_hook),
    };
    return cmocka_run_group_tests_name("comm_hook", tests, setup, NULL);
}
