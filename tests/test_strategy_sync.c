/* test_strategy_sync.c - the mirrored strategy: the synchronous contract, per-variable
   aggregation, distributed variables, metrics, non-finite gradients, failing
   and vanishing replicas, bad arguments.

   The model throughout is a small MLP, 20 -> 16 relu -> 8 tanh -> 5 with
   softmax cross-entropy (517 parameters); the data come from the tests' own
   seeded generator (x uniform in [-1, 1), labels 0..4).

   What is asserted, and how it is measured:
   - The synchronous contract: MIRRORED with N replicas x per-replica batch B
     and MEAN aggregation trains the same weights as ONE_DEVICE with batch N*B,
     after 20 steps (4 under make test), N = 2, 3, 4, for SGD, momentum and
     Adam, for every all-reduce algorithm and with the gradient all-reduced
     in several buckets.
     Error = max_i |mirrored_i - reference_i| / max_i |reference_i| over all
     parameters (one global relative error), <= 1e-5 for SGD and momentum,
     <= 1e-4 for Adam. At N = 2 each gradient element is the sum of exactly two
     floats, so every algorithm and bucketing must give the same bits.
   - After every step all replicas hold bitwise identical parameters; two runs
     with the same seed, N and algorithm give the same bits; a backend without
     host pointers (the strategy's staging path) gives the same bits as the
     in-place path.
   - Uneven global batches (count % N != 0, and count < N so that replicas get
     nothing) follow ONE_DEVICE on the same batches.
   - Model-variable aggregation: the update of a SUM variable is lr * the sum of
     the replicas' mean gradients, ONLY_FIRST_REPLICA is replica 0's mean
     gradient, MEAN is the mean over the global batch; the expected gradients
     come from separate single models run on each shard
     (dsgd_model_get_grads). Element tolerance: |got - want| <= 1e-5 * max|want|
     over the variable + 2^-22 * |parameter| (the rounding of p - lr g).
   - Distributed variables: every (synchronization x aggregation) pair, written
     in replica context with assign and assign_add, against the semantics
     documented in distsgd.h; the rejected combinations.
   - Metrics equal a ONE_DEVICE evaluation of the same weights on the same data.
   - A NaN in one replica's shard: every replica skips the step (policy SKIP,
     and the optimizer state does not move) or returns DSGD_ERR_NON_FINITE
     (policy ERROR); a label out of range on one replica fails the step on all
     with that replica's error; so must a device failure on one replica just
     before the exchange (a backend whose finish fails), not the others'
     timeouts while they wait for it.
   - A replica whose fn fails in dsgd_strategy_run (at once, or after 50 ms)
     while the others wait in an all-reduce with a 10 s deadline (auto, ring,
     recursive doubling; replica 1 or 3 failing): the run returns that
     replica's own result and message,
     within 0.5 s (a hang bound: the others are stopped through the
     transport), and the others' results say "aborted because replica k
     failed". The same for a device failure inside a training step.
   - After a failure that can leave the replicas different (replica 1's
     optimizer update fails at step 2 while the others update, so the
     weights really differ; any failed run, N = 3 and N = 1) every call that
     uses the replicas' state returns DSGD_ERR_STATE naming the step and
     saying to recreate the strategy; a failure agreed on before the update
     (a bad label) leaves it usable.
   - A replica that does not join a collective: the others time out within the
     deadline (0.3 s) plus a margin, or are stopped by the first timeout's
     abort, never hang (a watchdog kills the test), and the strategy is
     unusable afterwards.
   - The pipeline piece size in the strategy desc (256 B, 300 B, and 1 B and
     SIZE_MAX, which are clamped) gives the bits of the default piece size
     for ring, halving-doubling and recursive doubling at N = 3, 4.
   - Bad arguments return their codes with a message.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <signal.h>

enum { IN = 20, OUT = 5, NPARAMS = 20 * 16 + 16 + 16 * 8 + 8 + 8 * 5 + 5, MAXN = 8 };

static const dsgd_layer_desc LAYERS[3] = {
    {16, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

#define MODEL_SEED 20240611u

/* ---------------------------------------------------------------- helpers */

static dsgd_optimizer_desc opt_desc(dsgd_optimizer_kind kind) {
    dsgd_optimizer_desc od;
    memset(&od, 0, sizeof(od));
    od.kind = kind;
    switch (kind) {
    case DSGD_OPT_MOMENTUM: od.lr = 0.05f; od.momentum = 0.9f; break;
    case DSGD_OPT_ADAM: od.lr = 0.005f; break;
    default: od.lr = 0.1f; break;
    }
    return od;
}

static dsgd_strategy_desc strat_desc(dsgd_strategy_kind kind, int n, int max_batch, dsgd_optimizer_kind opt) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 3;
    d.model.max_batch = max_batch;
    d.model.seed = MODEL_SEED;
    d.optimizer = opt_desc(opt);
    d.timeout_s = 10.0; /* a broken exchange fails the test in seconds, not the default 30 s */
    return d;
}

static dsgd_strategy *strat_make(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, d, &s));
    assert_non_null(s);
    assert_int_equal(dsgd_strategy_num_replicas(s), d->num_replicas ? d->num_replicas : 1);
    assert_int_equal((int)dsgd_model_num_params(dsgd_strategy_model(s, 0)), NPARAMS);
    return s;
}

static void make_batch(tu_rng *r, float *x, float *y, int count) {
    int i;
    tu_fill(r, x, (size_t)count * IN, -1.0f, 1.0f);
    for (i = 0; i < count; ++i) y[i] = (float)tu_below(r, OUT);
}

static void get_params(dsgd_ctx *ctx, dsgd_strategy *s, int replica, float *dst) {
    dsgd_model *m = dsgd_strategy_model(s, replica);
    assert_non_null(m);
    TU_OK(ctx, dsgd_model_get_params(m, dst, NPARAMS));
}

static const char *opt_name(dsgd_optimizer_kind k) {
    return k == DSGD_OPT_SGD ? "sgd" : k == DSGD_OPT_MOMENTUM ? "momentum" : k == DSGD_OPT_ADAM ? "adam" : "?";
}

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---------------------------------------------------------------- backends */

/* The CPU backend without buffer_host_ptr, as a GPU backend looks to the
   strategy: the gradient goes through the host staging copy. */
static dsgd_result no_host_ptr_factory(void *user, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_result r = dsgd_cpu_backend_create(ctx, out);
    (void)user;
    (void)replica;
    out->buffer_host_ptr = NULL;
    return r;
}

/* The CPU backend whose `finish` fails on replica 1 while g_fail_armed is
   set (finish is called just before the gradient exchange). finish gets only
   the backend's impl, so the factory remembers which impl is replica 1's. */
static void *g_fail_impl;
static dsgd_ctx *g_fail_ctx;
static int g_fail_armed;

static dsgd_result failing_finish(void *impl) {
    if (g_fail_armed && impl == g_fail_impl)
        return dsgd_ctx_set_error(g_fail_ctx, DSGD_ERR_BACKEND, "injected device failure in finish");
    return DSGD_OK;
}

static dsgd_result failing_factory(void *user, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_result r = dsgd_cpu_backend_create(ctx, out);
    (void)user;
    if (r != DSGD_OK) return r;
    if (replica == 1) {
        g_fail_impl = out->impl;
        g_fail_ctx = ctx;
    }
    out->finish = failing_finish;
    return DSGD_OK;
}

/* The CPU backend whose optimizer_update fails on replica 1 at its update
   number g_opt_fail_at (0-based: that replica's step index) while the other
   replicas update: the replicas' weights then differ. The counter is only
   touched by replica 1's thread during a step and by the test between
   steps (the strategy's dispatch orders the two). */
static void *g_opt_fail_impl;
static dsgd_ctx *g_opt_fail_ctx;
static int g_opt_fail_calls, g_opt_fail_at;
static dsgd_result (*g_cpu_update)(void *impl, const dsgd_opt_update *u, dsgd_ref param, dsgd_ref grad,
                                   dsgd_ref m1, dsgd_ref m2, size_t n);

static dsgd_result failing_update(void *impl, const dsgd_opt_update *u, dsgd_ref param, dsgd_ref grad, dsgd_ref m1,
                                  dsgd_ref m2, size_t n) {
    if (impl == g_opt_fail_impl && g_opt_fail_calls++ == g_opt_fail_at)
        return dsgd_ctx_set_error(g_opt_fail_ctx, DSGD_ERR_BACKEND, "injected optimizer failure");
    return g_cpu_update(impl, u, param, grad, m1, m2, n);
}

static dsgd_result opt_failing_factory(void *user, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_result r = dsgd_cpu_backend_create(ctx, out);
    (void)user;
    if (r != DSGD_OK) return r;
    if (replica == 1) {
        g_opt_fail_impl = out->impl;
        g_opt_fail_ctx = ctx;
    }
    g_cpu_update = out->optimizer_update;
    out->optimizer_update = failing_update;
    return DSGD_OK;
}

/* A factory that cannot make replica 2's backend: creation fails after two
   replicas were built (their cleanup runs under ASan's leak check). */
static dsgd_result broken_factory(void *user, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    (void)user;
    if (replica == 2) return dsgd_ctx_set_error(ctx, DSGD_ERR_BACKEND, "no device for this replica");
    return dsgd_cpu_backend_create(ctx, out);
}

/* ---------------------------------------------------------------- 1-3: the synchronous contract */

/* Steps of a contract run: 20 under make test-full; 4 in the quick tier
   (a wrong mean or a lost replica's gradient fails the tolerance from the
   first step). */
enum { CONTRACT_B = 6 };
#define CONTRACT_STEPS TU_PICK(20, 4)

typedef struct contract_case {
    int n;
    dsgd_optimizer_kind opt;
    dsgd_allreduce_algo algo;
    size_t bucket_bytes;
    int staged; /* replicas' backends without host pointers */
    size_t piece_bytes;
    const dsgd_transport_i *endpoints; /* the user's transport; NULL: the strategy's own */
} contract_case;

/* Trains MIRRORED (c->n x CONTRACT_B) and ONE_DEVICE (batch c->n * CONTRACT_B)
   side by side on the same global batches; checks the replicas stay bitwise
   identical after every step and the step infos; returns the relative error
   of the final weights and copies the mirrored weights to out. */
static double contract_run(const contract_case *c, float *out) {
    dsgd_ctx *ctx = tu_ctx();
    int n = c->n, global = n * CONTRACT_B, step;
    dsgd_strategy_desc md = strat_desc(DSGD_STRATEGY_MIRRORED, n, CONTRACT_B, c->opt);
    dsgd_strategy_desc rd = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, global, c->opt);
    dsgd_strategy *ms, *rs;
    float *x = tu_floats((size_t)global * IN), y[MAXN * CONTRACT_B];
    float pm[NPARAMS], pr[NPARAMS];
    tu_rng rng = tu_rng_make(4242);
    double err;
    md.algorithm = c->algo;
    md.bucket_bytes = c->bucket_bytes;
    md.piece_bytes = c->piece_bytes;
    md.endpoints = c->endpoints;
    if (c->staged) md.backend_factory = no_host_ptr_factory;
    ms = strat_make(ctx, &md);
    rs = strat_make(ctx, &rd);
    get_params(ctx, ms, 0, pm);
    get_params(ctx, rs, 0, pr);
    assert_memory_equal(pm, pr, sizeof(pm)); /* same seed, same start */
    for (step = 0; step < CONTRACT_STEPS; ++step) {
        dsgd_step_info im, ir;
        memset(&im, 0xff, sizeof(im));
        make_batch(&rng, x, y, global);
        TU_OK(ctx, dsgd_strategy_train_step(ms, x, y, global, &im));
        TU_OK(ctx, dsgd_strategy_train_step(rs, x, y, global, &ir));
        assert_int_equal((int)im.step, step);
        assert_int_equal(im.count, global);
        assert_int_equal(im.skipped, 0);
        assert_true(im.lr == md.optimizer.lr);
        assert_int_equal((int)ir.step, step);
        tu_assert_replicas_identical(ctx, ms);
    }
    get_params(ctx, ms, 0, pm);
    get_params(ctx, rs, 0, pr);
    err = tu_rel_err(pm, pr, NPARAMS);
    printf("    contract N=%d %-8s %-18s bucket %4zu B%s piece %zu B: rel err %.3g\n", n, opt_name(c->opt),
           c->algo == DSGD_ALLREDUCE_AUTO ? "auto" : dsgd_allreduce_algo_name(c->algo), c->bucket_bytes,
           c->staged ? " staged" : "", c->piece_bytes, err);
    if (out) memcpy(out, pm, sizeof(pm));
    dsgd_strategy_destroy(ms);
    dsgd_strategy_destroy(rs);
    dsgd_ctx_destroy(ctx);
    free(x);
    return err;
}

static double contract_tol(dsgd_optimizer_kind k) { return k == DSGD_OPT_ADAM ? 1e-4 : 1e-5; }

static void check_contract(const contract_case *c, float *out) {
    double err = contract_run(c, out);
    if (!(err <= contract_tol(c->opt)))
        fail_msg("N=%d %s algo %d bucket %zu: relative error %.3g > %.0e", c->n, opt_name(c->opt), (int)c->algo,
                 c->bucket_bytes, err, contract_tol(c->opt));
}

static void test_contract_optimizers(void **state) {
    static const dsgd_optimizer_kind opts[3] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM};
    int n, k;
    (void)state;
    for (n = 2; n <= 4; ++n) {
        for (k = 0; k < 3; ++k) {
            contract_case c;
            memset(&c, 0, sizeof(c));
            c.n = n;
            c.opt = opts[k];
            check_contract(&c, NULL);
        }
    }
}

static void test_contract_algorithms_and_buckets(void **state) {
    static const dsgd_allreduce_algo algos[5] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_HALVING_DOUBLING,
                                                 DSGD_ALLREDUCE_REDUCE_BROADCAST,
                                                 DSGD_ALLREDUCE_RECURSIVE_DOUBLING, DSGD_ALLREDUCE_DIRECT};
    /* 256 B = 64 floats: 9 buckets of the 517; 200 B = 50 floats: 11, the last short */
    static const size_t buckets[3] = {0, 256, 200};
    int n, a, b, k;
    float first[NPARAMS], got[NPARAMS];
    (void)state;
    for (n = 3; n <= 4; ++n)
        for (a = 0; a < 5; ++a)
            for (b = 0; b < 3; ++b)
                for (k = 0; k < 2; ++k) {
                    contract_case c;
                    memset(&c, 0, sizeof(c));
                    c.n = n;
                    c.opt = k == 0 ? DSGD_OPT_SGD : DSGD_OPT_ADAM;
                    c.algo = algos[a];
                    c.bucket_bytes = buckets[b];
                    if (b > 0 && k == 1) continue; /* buckets: SGD is enough */
                    check_contract(&c, NULL);
                }
    /* N = 2: every element is a + b, so all algorithms and buckets agree bitwise */
    for (a = 0; a < 5; ++a)
        for (b = 0; b < 3; ++b) {
            contract_case c;
            memset(&c, 0, sizeof(c));
            c.n = 2;
            c.opt = DSGD_OPT_MOMENTUM;
            c.algo = algos[a];
            c.bucket_bytes = buckets[b];
            check_contract(&c, a == 0 && b == 0 ? first : got);
            if ((a || b) && memcmp(first, got, sizeof(got)) != 0)
                fail_msg("N=2: %s with bucket %zu B differs bitwise from ring, one bucket",
                         dsgd_allreduce_algo_name(algos[a]), buckets[b]);
        }
}

/* A backend without host pointers (the staging path) gives the same bits as
   the in-place path. */
static void test_contract_staged(void **state) {
    contract_case c;
    float a[NPARAMS], b[NPARAMS];
    int n;
    (void)state;
    for (n = 2; n <= 4; n += 2) {
        memset(&c, 0, sizeof(c));
        c.n = n;
        c.opt = DSGD_OPT_ADAM;
        c.algo = DSGD_ALLREDUCE_RING;
        c.bucket_bytes = n == 4 ? 256 : 0;
        check_contract(&c, a);
        c.staged = 1;
        check_contract(&c, b);
        if (memcmp(a, b, sizeof(a)) != 0) fail_msg("N=%d: the staged exchange differs from the in-place one", n);
    }
}

static void test_same_seed_bitwise(void **state) {
    contract_case c[2];
    float a[NPARAMS], b[NPARAMS];
    int i;
    (void)state;
    memset(c, 0, sizeof(c));
    c[0].n = 3;
    c[0].opt = DSGD_OPT_ADAM;
    c[0].algo = DSGD_ALLREDUCE_RING;
    c[0].bucket_bytes = 256;
    c[1].n = 4;
    c[1].opt = DSGD_OPT_MOMENTUM;
    c[1].algo = DSGD_ALLREDUCE_HALVING_DOUBLING;
    for (i = 0; i < 2; ++i) {
        contract_run(&c[i], a);
        contract_run(&c[i], b);
        if (memcmp(a, b, sizeof(a)) != 0) fail_msg("case %d: two runs with the same seed differ", i);
    }
}

/* The pipeline piece size set through the strategy desc, and the weights do
   not depend on it: each element is reduced in an order fixed by
   (algorithm, N, count). The 517-float gradient is one piece at the default
   (256 KiB) and up to 9 pieces of 64 floats at 256 B. 1 B and SIZE_MAX are
   clamped (to 256 B and 1 GiB), as documented, not rejected; 300 B is 75
   floats. */
static void test_piece_bytes(void **state) {
    static const size_t pieces[4] = {256, 300, 1, (size_t)-1};
    static const dsgd_allreduce_algo algos[3] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_HALVING_DOUBLING,
                                                 DSGD_ALLREDUCE_RECURSIVE_DOUBLING};
    int n, a, k;
    (void)state;
    for (n = 3; n <= 4; ++n) {
        for (a = 0; a < 3; ++a) {
            contract_case c;
            float want[NPARAMS], got[NPARAMS];
            memset(&c, 0, sizeof(c));
            c.n = n;
            c.opt = DSGD_OPT_ADAM;
            c.algo = algos[a];
            check_contract(&c, want); /* default piece size */
            for (k = 0; k < 4; ++k) {
                c.piece_bytes = pieces[k];
                check_contract(&c, got);
                if (memcmp(got, want, sizeof(got)) != 0)
                    fail_msg("N=%d %s: piece_bytes %zu gives other weights than the default", n,
                             dsgd_allreduce_algo_name(c.algo), pieces[k]);
            }
        }
    }
}

/* The strategy over endpoints the user gives (dsgd_strategy_desc.endpoints):
   a loopback hub of the user's gives the weights of the strategy's own; a
   transport with send and recv only (no sendrecv, no shared memory, no abort)
   gives the same weights for the same algorithm, and AUTO over it keeps the
   synchronous contract; endpoints that are not ranks 0..N-1 of one group of N
   are refused. */
typedef struct user_group {
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_transport_i ep[MAXN];
} user_group;

/* The send/recv-only transport counts its sends, so the test knows the
   strategy used it. */
static long g_user_sends;
static dsgd_result (*g_lb_send)(void *, int, uint64_t, const void *, size_t, double);
static dsgd_result counting_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    __atomic_add_fetch(&g_user_sends, 1L, __ATOMIC_SEQ_CST);
    return g_lb_send(impl, dst, tag, buf, bytes, deadline);
}

static void user_group_make(user_group *g, int n, int minimal) {
    int r;
    g->ctx = tu_ctx();
    TU_OK(g->ctx, dsgd_loopback_create(g->ctx, n, &g->hub));
    for (r = 0; r < n; ++r) {
        TU_OK(g->ctx, dsgd_loopback_endpoint(g->hub, r, &g->ep[r]));
        if (minimal) {
            dsgd_transport_i t;
            memset(&t, 0, sizeof(t));
            t.name = "send/recv only";
            t.impl = g->ep[r].impl;
            t.rank = r;
            t.size = n;
            g_lb_send = g->ep[r].send;
            t.send = counting_send;
            t.recv = g->ep[r].recv;
            g->ep[r] = t;
        }
    }
}

static void user_group_free(user_group *g) {
    dsgd_loopback_destroy(g->hub);
    dsgd_ctx_destroy(g->ctx);
}

static void test_user_endpoints(void **state) {
    static const dsgd_allreduce_algo algos[3] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_HALVING_DOUBLING,
                                                 DSGD_ALLREDUCE_AUTO};
    int n, a, minimal;
    (void)state;
    for (n = 2; n <= 3; ++n) {
        for (a = 0; a < 3; ++a) {
            contract_case c;
            float want[NPARAMS], got[NPARAMS];
            memset(&c, 0, sizeof(c));
            c.n = n;
            c.opt = DSGD_OPT_ADAM;
            c.algo = algos[a];
            check_contract(&c, want); /* the strategy's own loopback */
            for (minimal = 0; minimal <= 1; ++minimal) {
                user_group g;
                user_group_make(&g, n, minimal);
                c.endpoints = g.ep;
                g_user_sends = 0;
                check_contract(&c, got);
                if (minimal) assert_true(g_user_sends >= (long)CONTRACT_STEPS); /* it went through them */
                /* AUTO picks DIRECT where memory is shared and a message-passing
                   algorithm otherwise: bitwise equal only with the same algorithm */
                if ((c.algo != DSGD_ALLREDUCE_AUTO || !minimal) && memcmp(got, want, sizeof(got)) != 0)
                    fail_msg("N=%d %s over the user's %s endpoints: other weights than the strategy's own loopback",
                             n, dsgd_allreduce_algo_name(c.algo), minimal ? "send/recv-only" : "loopback");
                user_group_free(&g);
            }
        }
    }
    {
        user_group g;
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, 3, 4, DSGD_OPT_SGD);
        dsgd_strategy *s = NULL;
        dsgd_transport_i t;
        user_group_make(&g, 3, 0);
        d.endpoints = g.ep;
        t = g.ep[1]; /* ranks swapped */
        g.ep[1] = g.ep[2];
        g.ep[2] = t;
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
        assert_true(contains(dsgd_ctx_last_error(ctx), "endpoints[1] is rank 2 of 3"));
        assert_null(s);
        g.ep[2] = g.ep[1];
        g.ep[1] = t;
        g.ep[2].recv = NULL;
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
        assert_true(contains(dsgd_ctx_last_error(ctx), "without send or recv"));
        d.num_replicas = 2; /* a group of 3 for 2 replicas */
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
        assert_true(contains(dsgd_ctx_last_error(ctx), "endpoints[0] is rank 0 of 3"));
        user_group_free(&g);
        dsgd_ctx_destroy(ctx);
    }
}

/* ---------------------------------------------------------------- 4: uneven batches */

static void test_uneven_batches(void **state) {
    /* N = 4, max 4 per replica: 10 -> 3,3,2,2; 3 -> 1,1,1,0; 1 -> 1,0,0,0 */
    static const int counts[6] = {10, 3, 1, 9, 16, 7};
    static const dsgd_optimizer_kind opts[2] = {DSGD_OPT_SGD, DSGD_OPT_ADAM};
    int k, i;
    (void)state;
    for (k = 0; k < 2; ++k) {
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy_desc md = strat_desc(DSGD_STRATEGY_MIRRORED, 4, 4, opts[k]);
        dsgd_strategy_desc rd = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 0, 16, opts[k]);
        dsgd_strategy *ms = strat_make(ctx, &md), *rs = strat_make(ctx, &rd);
        float x[16 * IN], y[16], pm[NPARAMS], pr[NPARAMS];
        tu_rng rng = tu_rng_make(99);
        double err, tol = contract_tol(opts[k]);
        for (i = 0; i < 6; ++i) {
            dsgd_step_info info;
            make_batch(&rng, x, y, counts[i]);
            TU_OK(ctx, dsgd_strategy_train_step(ms, x, y, counts[i], &info));
            assert_int_equal(info.count, counts[i]);
            assert_int_equal(info.skipped, 0);
            TU_OK(ctx, dsgd_strategy_train_step(rs, x, y, counts[i], NULL));
            tu_assert_replicas_identical(ctx, ms);
            get_params(ctx, ms, 0, pm);
            get_params(ctx, rs, 0, pr);
            err = tu_rel_err(pm, pr, NPARAMS);
            if (!(err <= tol))
                fail_msg("%s, step %d (count %d on 4 replicas): relative error %.3g > %.0e", opt_name(opts[k]), i,
                         counts[i], err, tol);
        }
        printf("    uneven %s: rel err %.3g after counts 10,3,1,9,16,7\n", opt_name(opts[k]), err);
        dsgd_strategy_destroy(ms);
        dsgd_strategy_destroy(rs);
        dsgd_ctx_destroy(ctx);
    }
}

/* ---------------------------------------------------------------- 5: model-variable aggregation */

/* The mean gradient of each of the n contiguous shards of (x, y, count),
   from a separate single model with the same initial weights. */
static void shard_grads(dsgd_ctx *ctx, int n, const float *x, const float *y, int count, float g[][NPARAMS]) {
    dsgd_model_desc md = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, count, DSGD_OPT_SGD).model;
    int r;
    for (r = 0; r < n; ++r) {
        dsgd_model *m = NULL;
        size_t off, len;
        dsgd_block_range((size_t)count, n, r, &off, &len);
        assert_true(len > 0);
        TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
        TU_OK(ctx, dsgd_model_compute_gradients(m, x + off * IN, y + off, (int)len, 1.0f / (float)len));
        TU_OK(ctx, dsgd_model_get_grads(m, g[r], NPARAMS));
        dsgd_model_destroy(m);
    }
}

/* Checks, variable by variable, that p0 - p1 == lr * want. */
static void check_update(dsgd_strategy *s, const float *p0, const float *p1, float lr, const float *want,
                         const char *label) {
    dsgd_model *m = dsgd_strategy_model(s, 0);
    int v, nv = dsgd_model_num_variables(m);
    for (v = 0; v < nv; ++v) {
        const dsgd_variable *var = dsgd_model_variable(m, v);
        double maxw = 0.0;
        size_t i;
        for (i = var->offset; i < var->offset + var->count; ++i)
            if (fabs(lr * (double)want[i]) > maxw) maxw = fabs(lr * (double)want[i]);
        assert_true(maxw > 0.0);
        for (i = var->offset; i < var->offset + var->count; ++i) {
            double got = (double)p0[i] - (double)p1[i], exp = lr * (double)want[i];
            double tol = 1e-5 * maxw + ldexp(fabs((double)p0[i]), -22);
            if (!(fabs(got - exp) <= tol))
                fail_msg("%s: %s[%zu]: update %.9g, want %.9g (tol %.3g)", label, var->name, i - var->offset, got,
                         exp, tol);
        }
    }
}

static void test_model_variable_aggregation(void **state) {
    enum { N = 3, COUNT = 10 }; /* shards of 4, 3, 3: MEAN differs from the mean of the means */
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, N, 4, DSGD_OPT_SGD);
    dsgd_strategy *s;
    float x[COUNT * IN], y[COUNT], g[N][NPARAMS], want[NPARAMS], p0[NPARAMS], p1[NPARAMS];
    tu_rng rng = tu_rng_make(5);
    const float lr = 1.0f;
    size_t i;
    int r, v, round;
    (void)state;
    d.optimizer.lr = lr;
    make_batch(&rng, x, y, COUNT);
    shard_grads(ctx, N, x, y, COUNT, g);

    /* round 0: dense1/kernel SUM, dense2/bias ONLY_FIRST_REPLICA, the rest MEAN;
       round 1: "*" SUM; round 2: "*" back to MEAN (the default) */
    for (round = 0; round < 3; ++round) {
        s = strat_make(ctx, &d);
        if (round == 0) {
            TU_OK(ctx, dsgd_strategy_set_aggregation(s, "dense1/kernel", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
            TU_OK(ctx, dsgd_strategy_set_aggregation(s, "dense2/bias", DSGD_AGG_ONLY_FIRST_REPLICA,
                                                     DSGD_SYNC_ON_WRITE));
        } else {
            TU_OK(ctx, dsgd_strategy_set_aggregation(s, "*", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
            if (round == 2) TU_OK(ctx, dsgd_strategy_set_aggregation(s, "*", DSGD_AGG_MEAN, DSGD_SYNC_AUTO));
        }
        get_params(ctx, s, 0, p0);
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, COUNT, NULL));
        tu_assert_replicas_identical(ctx, s);
        get_params(ctx, s, 0, p1);
        for (v = 0; v < dsgd_model_num_variables(dsgd_strategy_model(s, 0)); ++v) {
            const dsgd_variable *var = dsgd_model_variable(dsgd_strategy_model(s, 0), v);
            dsgd_aggregation agg = DSGD_AGG_MEAN;
            if (round == 1) agg = DSGD_AGG_SUM;
            if (round == 0 && !strcmp(var->name, "dense1/kernel")) agg = DSGD_AGG_SUM;
            if (round == 0 && !strcmp(var->name, "dense2/bias")) agg = DSGD_AGG_ONLY_FIRST_REPLICA;
            for (i = var->offset; i < var->offset + var->count; ++i) {
                double acc = 0.0;
                for (r = 0; r < N; ++r) {
                    size_t off, len;
                    dsgd_block_range(COUNT, N, r, &off, &len);
                    if (agg == DSGD_AGG_SUM) acc += g[r][i];
                    else if (agg == DSGD_AGG_ONLY_FIRST_REPLICA) acc += r == 0 ? g[r][i] : 0.0;
                    else acc += (double)len / COUNT * g[r][i]; /* the global mean */
                }
                want[i] = (float)acc;
            }
        }
        check_update(s, p0, p1, lr, want, round == 0 ? "mixed" : round == 1 ? "all SUM" : "all MEAN again");
        dsgd_strategy_destroy(s);
    }

    /* rejected: NONE, ON_READ, NONE synchronization, unknown name, NULL name */
    s = strat_make(ctx, &d);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_set_aggregation(s, "dense0/kernel", DSGD_AGG_NONE, DSGD_SYNC_AUTO));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_set_aggregation(s, "dense0/kernel", DSGD_AGG_SUM, DSGD_SYNC_ON_READ));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_set_aggregation(s, "dense0/kernel", DSGD_AGG_SUM, DSGD_SYNC_NONE));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_set_aggregation(s, "dense9/kernel", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
    assert_true(contains(dsgd_ctx_last_error(ctx), "dense9/kernel"));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_set_aggregation(s, NULL, DSGD_AGG_SUM, DSGD_SYNC_AUTO));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT,
           dsgd_strategy_set_aggregation(s, "dense0/kernel", (dsgd_aggregation)9, DSGD_SYNC_AUTO));
    /* the rejections changed nothing: a step is still the plain MEAN step */
    get_params(ctx, s, 0, p0);
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, COUNT, NULL));
    get_params(ctx, s, 0, p1);
    for (i = 0; i < NPARAMS; ++i) {
        double acc = 0.0;
        for (r = 0; r < N; ++r) {
            size_t off, len;
            dsgd_block_range(COUNT, N, r, &off, &len);
            acc += (double)len / COUNT * g[r][i];
        }
        want[i] = (float)acc;
    }
    check_update(s, p0, p1, lr, want, "after rejected calls");
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- 6: distributed variables */

enum { DV_K = 3 };

typedef struct dv_job {
    int id, add;
    dsgd_result res[MAXN];
    float local[MAXN][DV_K]; /* dsgd_replica_read after the write */
} dv_job;

/* Replica r writes (r + 1) * (i + 1) to element i. */
static dsgd_result dv_write(dsgd_replica *rep, void *user) {
    dv_job *j = (dv_job *)user;
    int r = dsgd_replica_id(rep), i;
    float v[DV_K];
    dsgd_result res;
    for (i = 0; i < DV_K; ++i) v[i] = (float)((r + 1) * (i + 1));
    res = j->add ? dsgd_replica_assign_add(rep, j->id, v) : dsgd_replica_assign(rep, j->id, v);
    j->res[r] = res;
    if (dsgd_replica_read(rep, j->id, j->local[r]) != DSGD_OK) j->local[r][0] = -12345.0f;
    return res;
}

static void test_distributed_variables(void **state) {
    static const dsgd_synchronization syncs[2] = {DSGD_SYNC_ON_WRITE, DSGD_SYNC_ON_READ};
    static const dsgd_aggregation aggs[4] = {DSGD_AGG_SUM, DSGD_AGG_MEAN, DSGD_AGG_ONLY_FIRST_REPLICA, DSGD_AGG_NONE};
    static const int ns[3] = {1, 3, 4};
    const float init[DV_K] = {10.0f, 20.0f, 30.0f};
    int ni;
    (void)state;
    for (ni = 0; ni < 3; ++ni) {
        int n = ns[ni], si, ai, add, r, i;
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy_desc d = strat_desc(n == 1 ? DSGD_STRATEGY_ONE_DEVICE : DSGD_STRATEGY_MIRRORED, n, 4,
                                          DSGD_OPT_SGD);
        dsgd_strategy *s = strat_make(ctx, &d);
        double sum_w = n * (n + 1) / 2.0; /* sum over replicas of (r + 1) */
        for (si = 0; si < 2; ++si)
            for (ai = 0; ai < 4; ++ai)
                for (add = 0; add < 2; ++add) {
                    dsgd_dvar_desc vd;
                    dv_job job;
                    char name[64];
                    int id = -1;
                    float got[DV_K];
                    dsgd_result rr;
                    memset(&vd, 0, sizeof(vd));
                    snprintf(name, sizeof(name), "v/%s/%s/%s", dsgd_synchronization_name(syncs[si]),
                             dsgd_aggregation_name(aggs[ai]), add ? "add" : "assign");
                    vd.name = name;
                    vd.count = DV_K;
                    vd.synchronization = syncs[si];
                    vd.aggregation = aggs[ai];
                    vd.initial_value = init;
                    if (syncs[si] == DSGD_SYNC_ON_READ && aggs[ai] == DSGD_AGG_NONE) {
                        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
                        assert_int_equal(dsgd_strategy_find_variable(s, name), -1);
                        continue;
                    }
                    TU_OK(ctx, dsgd_strategy_create_variable(s, &vd, &id));
                    assert_int_equal(dsgd_strategy_find_variable(s, name), id);
                    /* every copy starts at the initial value */
                    for (r = 0; r < n; ++r) {
                        TU_OK(ctx, dsgd_strategy_read_local(s, id, r, got));
                        for (i = 0; i < DV_K; ++i) TU_NEAR(got[i], init[i], 0.0);
                    }
                    memset(&job, 0, sizeof(job));
                    job.id = id;
                    job.add = add;
                    rr = dsgd_strategy_run(s, dv_write, &job);
                    if (syncs[si] == DSGD_SYNC_ON_WRITE && aggs[ai] == DSGD_AGG_NONE) {
                        /* rejected on every replica, nothing written (each
                           replica read its copy back in replica context) */
                        if (rr != DSGD_ERR_INVALID_ARGUMENT) fail_msg("%s: run -> %d", name, (int)rr);
                        assert_true(dsgd_ctx_last_error(ctx)[0] != '\0');
                        for (r = 0; r < n; ++r) {
                            assert_int_equal(job.res[r], DSGD_ERR_INVALID_ARGUMENT);
                            for (i = 0; i < DV_K; ++i) TU_NEAR(job.local[r][i], init[i], 0.0);
                        }
                        /* a failed run fails the strategy, whatever the cause */
                        assert_true(dsgd_strategy_failed(s));
                        TU_ERR(ctx, DSGD_ERR_STATE, dsgd_strategy_read_local(s, id, 0, got));
                        dsgd_strategy_destroy(s);
                        s = strat_make(ctx, &d);
                        /* in cross-replica context it may be assigned */
                        TU_OK(ctx, dsgd_strategy_create_variable(s, &vd, &id));
                        for (i = 0; i < DV_K; ++i) got[i] = -init[i];
                        TU_OK(ctx, dsgd_strategy_assign_variable(s, id, got));
                        for (r = 0; r < n; ++r) {
                            TU_OK(ctx, dsgd_strategy_read_local(s, id, r, got));
                            for (i = 0; i < DV_K; ++i) TU_NEAR(got[i], -init[i], 0.0);
                        }
                        continue;
                    }
                    if (rr != DSGD_OK) fail_msg("%s: run -> %s: %s", name, dsgd_result_string(rr), dsgd_ctx_last_error(ctx));
                    for (r = 0; r < n; ++r) {
                        assert_int_equal(job.res[r], DSGD_OK);
                        TU_OK(ctx, dsgd_strategy_read_local(s, id, r, got));
                        for (i = 0; i < DV_K; ++i) {
                            double w, base = add ? init[i] : 0.0;
                            if (syncs[si] == DSGD_SYNC_ON_READ) {
                                w = base + (r + 1) * (i + 1); /* own copy only */
                            } else if (aggs[ai] == DSGD_AGG_SUM) {
                                w = base + sum_w * (i + 1);
                            } else if (aggs[ai] == DSGD_AGG_MEAN) {
                                w = base + sum_w / n * (i + 1);
                            } else {
                                w = base + 1.0 * (i + 1); /* replica 0's */
                            }
                            if (!(fabs(got[i] - w) <= 1e-5 * fabs(w)))
                                fail_msg("N=%d %s: replica %d element %d holds %g, want %g", n, name, r, i,
                                         (double)got[i], w);
                            if (!(job.local[r][i] == got[i]))
                                fail_msg("N=%d %s: replica %d read %g in replica context, %g from outside", n, name,
                                         r, (double)job.local[r][i], (double)got[i]);
                        }
                    }
                    TU_OK(ctx, dsgd_strategy_read_variable(s, id, got));
                    for (i = 0; i < DV_K; ++i) {
                        double w, base = add ? init[i] : 0.0;
                        if (syncs[si] == DSGD_SYNC_ON_WRITE)
                            w = base + (aggs[ai] == DSGD_AGG_SUM ? sum_w : aggs[ai] == DSGD_AGG_MEAN ? sum_w / n : 1.0) *
                                           (i + 1);
                        else if (aggs[ai] == DSGD_AGG_SUM)
                            w = n * base + sum_w * (i + 1); /* the sum of the copies */
                        else if (aggs[ai] == DSGD_AGG_MEAN)
                            w = base + sum_w / n * (i + 1);
                        else
                            w = base + 1.0 * (i + 1); /* replica 0's copy */
                        if (!(fabs(got[i] - w) <= 1e-5 * fabs(w)))
                            fail_msg("N=%d %s: cross-replica read of element %d gives %g, want %g", n, name, i,
                                     (double)got[i], w);
                    }
                }

        /* cross-replica assign: ON_READ SUM stores value / N per copy and reads back value */
        {
            dsgd_dvar_desc vd;
            const float val[DV_K] = {3.0f, 6.0f, -9.0f};
            float got[DV_K];
            int id, k;
            for (k = 0; k < 4; ++k) {
                char name[32];
                memset(&vd, 0, sizeof(vd));
                snprintf(name, sizeof(name), "xassign/%d", k);
                vd.name = name;
                vd.count = DV_K;
                vd.synchronization = k < 3 ? DSGD_SYNC_ON_READ : DSGD_SYNC_ON_WRITE;
                vd.aggregation = k == 0 ? DSGD_AGG_SUM : k == 1 ? DSGD_AGG_MEAN : k == 2 ? DSGD_AGG_ONLY_FIRST_REPLICA
                                                                                            : DSGD_AGG_SUM;
                TU_OK(ctx, dsgd_strategy_create_variable(s, &vd, &id));
                TU_OK(ctx, dsgd_strategy_assign_variable(s, id, val));
                for (r = 0; r < n; ++r) {
                    TU_OK(ctx, dsgd_strategy_read_local(s, id, r, got));
                    for (i = 0; i < DV_K; ++i) TU_NEAR(got[i], k == 0 ? val[i] / n : val[i], 1e-6);
                }
                TU_OK(ctx, dsgd_strategy_read_variable(s, id, got));
                for (i = 0; i < DV_K; ++i) TU_NEAR(got[i], val[i], 1e-5);
            }
        }

        /* rejected creations, each with a message */
        {
            dsgd_dvar_desc vd;
            int id = -7, before = dsgd_strategy_find_variable(s, "xassign/0");
            memset(&vd, 0, sizeof(vd));
            vd.name = "bad";
            vd.count = 2;
            vd.aggregation = DSGD_AGG_SUM;
            vd.synchronization = DSGD_SYNC_NONE;
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.synchronization = DSGD_SYNC_ON_READ;
            vd.trainable = 1;
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.trainable = 0;
            vd.aggregation = DSGD_AGG_NONE;
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.aggregation = (dsgd_aggregation)17;
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.aggregation = DSGD_AGG_SUM;
            vd.synchronization = (dsgd_synchronization)-1;
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.synchronization = DSGD_SYNC_ON_READ;
            vd.count = 0;
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.count = 2;
            vd.name = "";
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            vd.name = "xassign/0"; /* duplicate */
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            assert_true(contains(dsgd_ctx_last_error(ctx), "xassign/0"));
            vd.name = "metrics/train/count"; /* the library's own */
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, NULL, &id));
            vd.name = "fine";
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, NULL));
            assert_int_equal(dsgd_strategy_find_variable(s, "bad"), -1);
            assert_int_equal(dsgd_strategy_find_variable(s, "xassign/0"), before);
            /* a trainable ON_WRITE variable is fine */
            vd.name = "fine";
            vd.synchronization = DSGD_SYNC_AUTO;
            vd.trainable = 1;
            TU_OK(ctx, dsgd_strategy_create_variable(s, &vd, &id));
            assert_int_equal(dsgd_strategy_find_variable(s, "fine"), id);
            /* names: DSGD_MAX_VARIABLE_NAME bytes are kept whole and found;
               one more is rejected, never cut (a cut name was not found
               again, and a second create of it succeeded) */
            {
                char longname[DSGD_MAX_VARIABLE_NAME + 2];
                memset(longname, 'v', sizeof(longname));
                longname[DSGD_MAX_VARIABLE_NAME + 1] = '\0';
                vd.name = longname;
                TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
                assert_true(contains(dsgd_ctx_last_error(ctx), "64 bytes; at most 63"));
                assert_int_equal(dsgd_strategy_find_variable(s, longname), -1);
                longname[DSGD_MAX_VARIABLE_NAME] = '\0';
                assert_int_equal(dsgd_strategy_find_variable(s, longname), -1);
                TU_OK(ctx, dsgd_strategy_create_variable(s, &vd, &id));
                assert_int_equal(dsgd_strategy_find_variable(s, longname), id);
                TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create_variable(s, &vd, &id));
                assert_true(contains(dsgd_ctx_last_error(ctx), "exists"));
            }
        }
        dsgd_strategy_destroy(s);
        dsgd_ctx_destroy(ctx);
    }
}

/* ---------------------------------------------------------------- 7: metrics */

static void test_metrics(void **state) {
    enum { N = 3, STEPS = 3, COUNT = 20, EVALS = 2 };
    static const int eval_counts[EVALS] = {24, 5};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc md = strat_desc(DSGD_STRATEGY_MIRRORED, N, 8, DSGD_OPT_MOMENTUM);
    dsgd_strategy_desc rd = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, 24, DSGD_OPT_SGD);
    dsgd_strategy *ms, *rs;
    float x[24 * IN], y[24], p[NPARAMS];
    dsgd_metrics got, want;
    tu_rng rng = tu_rng_make(31337);
    int i, slot;
    (void)state;
    ms = strat_make(ctx, &md);
    rs = strat_make(ctx, &rd);
    assert_true(dsgd_strategy_find_variable(ms, "metrics/train/loss_sum") >= 0);
    assert_true(dsgd_strategy_find_variable(ms, "metrics/eval/count") >= 0);
    /* training metrics are taken at the weights before each step */
    for (i = 0; i < STEPS; ++i) {
        make_batch(&rng, x, y, COUNT);
        get_params(ctx, ms, 0, p);
        TU_OK(ctx, dsgd_model_set_params(dsgd_strategy_model(rs, 0), p, NPARAMS));
        TU_OK(ctx, dsgd_strategy_eval_batch(rs, x, y, COUNT));
        TU_OK(ctx, dsgd_strategy_train_step(ms, x, y, COUNT, NULL));
    }
    TU_OK(ctx, dsgd_strategy_take_metrics(ms, DSGD_METRICS_TRAIN, &got));
    TU_OK(ctx, dsgd_strategy_take_metrics(rs, DSGD_METRICS_EVAL, &want));
    printf("    train metrics: loss_sum %.6f (reference %.6f), correct %g (%g), count %g\n", got.loss_sum,
           want.loss_sum, got.correct, want.correct, got.count);
    TU_NEAR(got.count, STEPS * COUNT, 0.0);
    TU_NEAR(want.count, STEPS * COUNT, 0.0);
    TU_NEAR(got.correct, want.correct, 0.0);
    TU_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);
    assert_true(want.loss_sum > 0.0);

    /* evaluation at the final weights */
    get_params(ctx, ms, 0, p);
    TU_OK(ctx, dsgd_model_set_params(dsgd_strategy_model(rs, 0), p, NPARAMS));
    for (i = 0; i < EVALS; ++i) {
        make_batch(&rng, x, y, eval_counts[i]);
        TU_OK(ctx, dsgd_strategy_eval_batch(ms, x, y, eval_counts[i]));
        TU_OK(ctx, dsgd_strategy_eval_batch(rs, x, y, eval_counts[i]));
        TU_OK(ctx, dsgd_strategy_eval_batch(ms, x, NULL, eval_counts[i])); /* no targets: no metrics */
    }
    TU_OK(ctx, dsgd_strategy_take_metrics(ms, DSGD_METRICS_EVAL, &got));
    TU_OK(ctx, dsgd_strategy_take_metrics(rs, DSGD_METRICS_EVAL, &want));
    printf("    eval metrics:  loss_sum %.6f (reference %.6f), correct %g (%g), count %g\n", got.loss_sum,
           want.loss_sum, got.correct, want.correct, got.count);
    TU_NEAR(got.count, 24 + 5, 0.0);
    TU_NEAR(got.correct, want.correct, 0.0);
    TU_NEAR(got.loss_sum, want.loss_sum, 1e-5 * want.loss_sum);

    /* taking resets both slots' counters */
    for (slot = 0; slot < 2; ++slot) {
        TU_OK(ctx, dsgd_strategy_take_metrics(ms, (dsgd_metrics_slot)slot, &got));
        TU_NEAR(got.count, 0.0, 0.0);
        TU_NEAR(got.loss_sum, 0.0, 0.0);
        TU_NEAR(got.correct, 0.0, 0.0);
    }
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_take_metrics(ms, (dsgd_metrics_slot)2, &got));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_take_metrics(ms, DSGD_METRICS_TRAIN, NULL));
    dsgd_strategy_destroy(ms);
    dsgd_strategy_destroy(rs);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- 8: non-finite and failing replicas */

enum { NF_N = 4, NF_B = 4, NF_COUNT = NF_N * NF_B };

/* Replica 2's shard of a 16-sample batch on 4 replicas is rows 8..11. */
static void poison_replica(float *x, int count, int n, int replica) {
    size_t off, len, i;
    dsgd_block_range((size_t)count, n, replica, &off, &len);
    for (i = off * IN; i < (off + len) * IN; ++i) x[i] = NAN;
}

static void all_params(dsgd_ctx *ctx, dsgd_strategy *s, float p[][NPARAMS]) {
    int r;
    for (r = 0; r < dsgd_strategy_num_replicas(s); ++r) get_params(ctx, s, r, p[r]);
}

static void test_nonfinite_skip(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, NF_N, NF_B, DSGD_OPT_ADAM);
    dsgd_strategy *a, *b;
    float x1[NF_COUNT * IN], y1[NF_COUNT], x2[NF_COUNT * IN], y2[NF_COUNT], xbad[NF_COUNT * IN];
    float before[NF_N][NPARAMS], after[NF_N][NPARAMS], pa[NPARAMS], pb[NPARAMS];
    dsgd_step_info info;
    tu_rng rng = tu_rng_make(8);
    (void)state;
    d.nonfinite = DSGD_NONFINITE_SKIP;
    make_batch(&rng, x1, y1, NF_COUNT);
    make_batch(&rng, x2, y2, NF_COUNT);
    memcpy(xbad, x2, sizeof(xbad));
    poison_replica(xbad, NF_COUNT, NF_N, 2);
    a = strat_make(ctx, &d);
    b = strat_make(ctx, &d);

    /* a: clean, poisoned (skipped), clean; b: clean, clean */
    TU_OK(ctx, dsgd_strategy_train_step(a, x1, y1, NF_COUNT, &info));
    assert_int_equal(info.skipped, 0);
    all_params(ctx, a, before);
    memset(&info, 0, sizeof(info));
    TU_OK(ctx, dsgd_strategy_train_step(a, xbad, y2, NF_COUNT, &info));
    assert_int_equal(info.skipped, 1);
    assert_int_equal((int)info.step, 1);
    all_params(ctx, a, after);
    assert_memory_equal(before, after, sizeof(before)); /* every replica unchanged, bitwise */
    TU_OK(ctx, dsgd_strategy_train_step(a, x2, y2, NF_COUNT, &info));
    assert_int_equal(info.skipped, 0);
    assert_int_equal((int)info.step, 1); /* the skipped step did not advance the optimizer */

    TU_OK(ctx, dsgd_strategy_train_step(b, x1, y1, NF_COUNT, NULL));
    TU_OK(ctx, dsgd_strategy_train_step(b, x2, y2, NF_COUNT, NULL));
    /* Adam's moments and step count were untouched by the skip: same bits as b */
    get_params(ctx, a, 0, pa);
    get_params(ctx, b, 0, pb);
    assert_memory_equal(pa, pb, sizeof(pa));
    tu_assert_replicas_identical(ctx, a);
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);

    /* ONE_DEVICE follows the same policy without a transport */
    d = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, NF_COUNT, DSGD_OPT_ADAM);
    a = strat_make(ctx, &d);
    get_params(ctx, a, 0, pa);
    TU_OK(ctx, dsgd_strategy_train_step(a, xbad, y2, NF_COUNT, &info));
    assert_int_equal(info.skipped, 1);
    assert_int_equal((int)info.step, 0);
    get_params(ctx, a, 0, pb);
    assert_memory_equal(pa, pb, sizeof(pa));
    d.nonfinite = DSGD_NONFINITE_ERROR;
    b = strat_make(ctx, &d);
    TU_ERR(ctx, DSGD_ERR_NON_FINITE, dsgd_strategy_train_step(b, xbad, y2, NF_COUNT, &info));
    dsgd_strategy_destroy(a);
    dsgd_strategy_destroy(b);
    dsgd_ctx_destroy(ctx);
}

static void test_nonfinite_error(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, NF_N, NF_B, DSGD_OPT_MOMENTUM);
    dsgd_strategy *s;
    float x[NF_COUNT * IN], y[NF_COUNT], before[NF_N][NPARAMS], after[NF_N][NPARAMS];
    dsgd_step_info info;
    tu_rng rng = tu_rng_make(9);
    (void)state;
    d.nonfinite = DSGD_NONFINITE_ERROR;
    s = strat_make(ctx, &d);
    make_batch(&rng, x, y, NF_COUNT);
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, NF_COUNT, NULL));
    all_params(ctx, s, before);
    poison_replica(x, NF_COUNT, NF_N, 2);
    TU_ERR(ctx, DSGD_ERR_NON_FINITE, dsgd_strategy_train_step(s, x, y, NF_COUNT, &info));
    printf("    policy ERROR: %s\n", dsgd_ctx_last_error(ctx));
    assert_true(contains(dsgd_ctx_last_error(ctx), "replica 2"));
    all_params(ctx, s, after);
    assert_memory_equal(before, after, sizeof(before));
    /* the strategy goes on: a clean step works and advances the optimizer once */
    make_batch(&rng, x, y, NF_COUNT);
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, NF_COUNT, &info));
    assert_int_equal((int)info.step, 1);
    assert_int_equal(info.skipped, 0);
    tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_replica_fails_alone(void **state) {
    enum { N = 3, COUNT = 9 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, N, 4, DSGD_OPT_SGD);
    dsgd_strategy *s;
    float x[COUNT * IN], y[COUNT], before[N][NPARAMS], after[N][NPARAMS];
    size_t off, len;
    dsgd_step_info info;
    tu_rng rng = tu_rng_make(10);
    (void)state;
    s = strat_make(ctx, &d);
    make_batch(&rng, x, y, COUNT);
    dsgd_block_range(COUNT, N, 1, &off, &len);
    y[off + 1] = 7.0f; /* class 7 of 5, only in replica 1's shard */
    all_params(ctx, s, before);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, x, y, COUNT, &info));
    printf("    bad label: %s\n", dsgd_ctx_last_error(ctx));
    assert_true(contains(dsgd_ctx_last_error(ctx), "replica 1"));
    assert_false(dsgd_strategy_failed(s)); /* agreed before the update: nothing changed */
    assert_int_equal(dsgd_strategy_replica_result(s, 1, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_replica_result(s, 0, NULL), DSGD_ERR_ABORTED); /* "abandoned" */
    all_params(ctx, s, after);
    assert_memory_equal(before, after, sizeof(before));
    /* not a transport failure: the next good step trains */
    y[off + 1] = 2.0f;
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, COUNT, &info));
    assert_int_equal((int)info.step, 0);
    tu_assert_replicas_identical(ctx, s);
    all_params(ctx, s, after);
    assert_true(memcmp(before[0], after[0], sizeof(after[0])) != 0);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* A replica whose device fails after the replicas agreed to step (in the
   backend's finish, just before the gradient exchange). The step must fail
   with that replica's error, naming it, as dsgd_strategy_train_step
   documents ("the first failing replica's error (its message names it)"),
   not with the other replicas' timeouts while they wait for it. */
static void test_replica_backend_fails_in_exchange(void **state) {
    enum { N = 4, COUNT = 16 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, N, 4, DSGD_OPT_SGD);
    dsgd_strategy *s;
    float x[COUNT * IN], y[COUNT];
    tu_rng rng = tu_rng_make(12);
    dsgd_result rr, res[N];
    double t0, elapsed;
    char msg[1024], rmsgs[N][1024];
    int r, failed;
    (void)state;
    d.timeout_s = 1.0;
    d.backend_factory = failing_factory;
    g_fail_armed = 0;
    s = strat_make(ctx, &d);
    make_batch(&rng, x, y, COUNT);
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, COUNT, NULL));
    g_fail_armed = 1;
    t0 = dsgd_now();
    rr = dsgd_strategy_train_step(s, x, y, COUNT, NULL);
    g_fail_armed = 0;
    elapsed = dsgd_now() - t0;
    snprintf(msg, sizeof(msg), "%s", dsgd_ctx_last_error(ctx));
    printf("    device failure on replica 1: %s after %.4f s: %s\n", dsgd_result_string(rr), elapsed, msg);
    /* the others were in the exchange: stopped through the transport at
       once, not at their 1 s deadline, and they say why */
    for (r = 0; r < N; ++r) {
        const char *rmsg = NULL;
        res[r] = dsgd_strategy_replica_result(s, r, &rmsg);
        snprintf(rmsgs[r], sizeof(rmsgs[r]), "%s", rmsg);
        printf("      replica %d: %s: %s\n", r, dsgd_result_string(res[r]), rmsgs[r]);
    }
    failed = dsgd_strategy_failed(s);
    dsgd_strategy_destroy(s); /* before the asserts, so a failure reports no leaks */
    dsgd_ctx_destroy(ctx);
    assert_int_not_equal(rr, DSGD_OK);
    if (rr != DSGD_ERR_BACKEND || !contains(msg, "replica 1") || !contains(msg, "injected device failure"))
        fail_msg("want DSGD_ERR_BACKEND from replica 1 (\"injected device failure\"), got %s: %s",
                 dsgd_result_string(rr), msg);
    assert_true(elapsed < 0.5);
    assert_true(failed);
    for (r = 0; r < N; ++r) {
        if (r == 1) {
            assert_int_equal(res[r], DSGD_ERR_BACKEND);
            continue;
        }
        assert_int_equal(res[r], DSGD_ERR_ABORTED);
        if (!contains(rmsgs[r], "aborted because replica 1 failed")) fail_msg("replica %d: %s", r, rmsgs[r]);
    }
}

static dsgd_result noop_fn(dsgd_replica *rep, void *user);

/* ---------------------------------------------------------------- a failing replica stops the others */

typedef struct fail_job {
    int failing; /* this replica fails after delay_s; the others enter an all-reduce */
    double delay_s;
    dsgd_allreduce_algo algo;
    dsgd_result res[MAXN];
    double elapsed[MAXN];
    double end[MAXN]; /* dsgd_now() when the replica's fn returned */
} fail_job;

static dsgd_result fail_fast_fn(dsgd_replica *rep, void *user) {
    fail_job *j = (fail_job *)user;
    int r = dsgd_replica_id(rep), i;
    float buf[300];
    double t0 = dsgd_now();
    if (r == j->failing) {
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)(j->delay_s * 1e9);
        if (j->delay_s > 0) nanosleep(&ts, NULL); /* the others are asleep in the all-reduce by then */
        j->res[r] = dsgd_ctx_set_error(dsgd_replica_ctx(rep), DSGD_ERR_SHAPE, "injected failure of its own code");
    } else {
        for (i = 0; i < 300; ++i) buf[i] = (float)(r + i);
        j->res[r] = dsgd_allreduce(dsgd_replica_comm(rep), buf, 300, DSGD_REDUCE_SUM, j->algo, 10.0);
    }
    j->end[r] = dsgd_now();
    j->elapsed[r] = j->end[r] - t0;
    return j->res[r];
}

/* Replica k's fn fails (at once, or after 50 ms, when the others are
   asleep in the collective) while the others wait in an all-reduce with a
   10 s deadline. The run must return replica k's own error (not replica 0's
   failed collective) and the others must be stopped at once through the
   transport, not wait out their deadline. 0.5 s is a hang bound, not a
   benchmark; the printed lag is how long after the failure each returned. */
static void test_run_failure_stops_peers(void **state) {
    enum { N = 4 };
    static const dsgd_allreduce_algo algos[3] = {DSGD_ALLREDUCE_AUTO, DSGD_ALLREDUCE_RING,
                                                 DSGD_ALLREDUCE_RECURSIVE_DOUBLING};
    static const int failing[2] = {1, 3};
    int a, r, k;
    (void)state;
    for (k = 0; k < 4; ++k) {
        for (a = 0; a < 3; ++a) {
            int fi = k % 2;
            /* the quick tier: each (failing replica, delay) once, the
               algorithms in turn (each at least once); make test-full
               every pair */
            if (!tu_full() && a != k % 3) continue;
            dsgd_ctx *ctx = tu_ctx();
            dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, N, 4, DSGD_OPT_SGD);
            dsgd_strategy *s;
            fail_job job;
            dsgd_result rr;
            double t0, elapsed;
            char msg[1024], want[64];
            d.timeout_s = 10.0;
            s = strat_make(ctx, &d);
            memset(&job, 0, sizeof(job));
            job.failing = failing[fi];
            job.delay_s = k < 2 ? 0.0 : 0.05;
            job.algo = algos[a];
            tu_watchdog_for("test_run_failure_stops_peers", 60);
            t0 = dsgd_now();
            rr = dsgd_strategy_run(s, fail_fast_fn, &job);
            elapsed = dsgd_now() - t0;
            snprintf(msg, sizeof(msg), "%s", dsgd_ctx_last_error(ctx));
            printf("    replica %d fails after %.2f s, others in %s: run -> %s after %.4f s: %s\n", job.failing,
                   job.delay_s, job.algo == DSGD_ALLREDUCE_AUTO ? "auto" : dsgd_allreduce_algo_name(job.algo),
                   dsgd_result_string(rr), elapsed, msg);
            for (r = 0; r < N; ++r)
                printf("      replica %d: fn -> %s after %.4f s (%.2f ms after the failure)\n", r,
                       dsgd_result_string(job.res[r]), job.elapsed[r], 1e3 * (job.end[r] - job.end[job.failing]));
            if (rr != DSGD_ERR_SHAPE)
                fail_msg("run -> %s, want replica %d's own DSGD_ERR_SHAPE: %s", dsgd_result_string(rr), job.failing,
                         msg);
            snprintf(want, sizeof(want), "replica %d: injected failure", job.failing);
            if (!contains(msg, want)) fail_msg("the strategy's message is not replica %d's: %s", job.failing, msg);
            if (!(elapsed < job.delay_s + 0.5))
                fail_msg("the run took %.3f s: the peers waited for their deadline", elapsed);
            for (r = 0; r < N; ++r) {
                const char *rmsg = NULL;
                dsgd_result rres = dsgd_strategy_replica_result(s, r, &rmsg);
                if (r == job.failing) {
                    assert_int_equal(rres, DSGD_ERR_SHAPE);
                    assert_true(contains(rmsg, want));
                    continue;
                }
                assert_int_equal(job.res[r], DSGD_ERR_ABORTED); /* the transport was aborted */
                assert_true(job.end[r] - job.end[job.failing] < 0.5);
                /* and the strategy says why */
                snprintf(want, sizeof(want), "aborted because replica %d failed", job.failing);
                assert_int_equal(rres, DSGD_ERR_ABORTED);
                if (!contains(rmsg, want)) fail_msg("replica %d's result says: %s", r, rmsg);
                snprintf(want, sizeof(want), "replica %d: injected failure", job.failing);
            }
            assert_true(dsgd_strategy_failed(s));
            dsgd_strategy_destroy(s);
            dsgd_ctx_destroy(ctx);
        }
    }
}

/* The rule after a failure that can leave the replicas different: every call
   that uses the replicas' state refuses with DSGD_ERR_STATE and says at
   which step the strategy failed, until it is recreated. */
static void assert_strategy_refuses(dsgd_ctx *ctx, dsgd_strategy *s, const char *step_text) {
    float x[4 * IN], y[4], v[1] = {1.0f};
    dsgd_metrics mt;
    dsgd_dvar_desc vd;
    int id = -1, mid = dsgd_strategy_find_variable(s, "metrics/train/count");
    tu_rng rng = tu_rng_make(77);
    make_batch(&rng, x, y, 4);
    memset(&vd, 0, sizeof(vd));
    vd.name = "created after the failure";
    vd.count = 1;
    assert_true(mid >= 0);
#define REFUSES(expr)                                                                                 \
    do {                                                                                              \
        TU_ERR(ctx, DSGD_ERR_STATE, expr);                                                            \
        if (!contains(dsgd_ctx_last_error(ctx), step_text) || !contains(dsgd_ctx_last_error(ctx), "recreate")) \
            fail_msg("%s: message does not name %s and say to recreate: %s", #expr, step_text,       \
                     dsgd_ctx_last_error(ctx));                                                       \
    } while (0)
    REFUSES(dsgd_strategy_eval_batch(s, x, y, 4));
    REFUSES(dsgd_strategy_run(s, noop_fn, NULL));
    REFUSES(dsgd_strategy_train_step(s, x, y, 4, NULL));
    REFUSES(dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &mt));
    REFUSES(dsgd_strategy_read_variable(s, mid, v));
    REFUSES(dsgd_strategy_read_local(s, mid, 0, v));
    REFUSES(dsgd_strategy_assign_variable(s, mid, v));
    REFUSES(dsgd_strategy_create_variable(s, &vd, &id));
    REFUSES(dsgd_strategy_set_aggregation(s, "*", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
#undef REFUSES
    assert_int_equal(id, -1);
    assert_int_equal(dsgd_strategy_find_variable(s, "created after the failure"), -1);
}

/* Replica 1's optimizer update fails at step 2 after the exchange, while the
   others update: the replicas now hold different weights, and nothing may
   run on them any more. */
static void test_optimizer_failure_fails_strategy(void **state) {
    enum { N = 3, COUNT = 12 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, N, 4, DSGD_OPT_MOMENTUM);
    dsgd_strategy *s;
    float x[COUNT * IN], y[COUNT], p[N][NPARAMS];
    tu_rng rng = tu_rng_make(31);
    dsgd_step_info info;
    dsgd_result rr;
    int step;
    (void)state;
    d.backend_factory = opt_failing_factory;
    g_opt_fail_calls = 0;
    g_opt_fail_at = 2;
    s = strat_make(ctx, &d);
    for (step = 0; step < 2; ++step) {
        make_batch(&rng, x, y, COUNT);
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, COUNT, &info));
        tu_assert_replicas_identical(ctx, s);
    }
    make_batch(&rng, x, y, COUNT);
    rr = dsgd_strategy_train_step(s, x, y, COUNT, &info);
    printf("    optimizer failure on replica 1 at step 2: %s: %s\n", dsgd_result_string(rr), dsgd_ctx_last_error(ctx));
    assert_int_equal(rr, DSGD_ERR_BACKEND);
    assert_int_equal((int)info.step, 2);
    assert_true(contains(dsgd_ctx_last_error(ctx), "replica 1: injected optimizer failure"));
    assert_true(dsgd_strategy_failed(s));
    for (step = 0; step < N; ++step)
        assert_int_equal(dsgd_strategy_replica_result(s, step, NULL), step == 1 ? DSGD_ERR_BACKEND : DSGD_OK);
    /* the others updated, replica 1 did not: the weights really differ */
    all_params(ctx, s, p);
    assert_memory_equal(p[0], p[2], sizeof(p[0]));
    assert_true(memcmp(p[0], p[1], sizeof(p[0])) != 0);
    assert_strategy_refuses(ctx, s, "step 2");
    printf("    afterwards: %s\n", dsgd_ctx_last_error(ctx));
    assert_strategy_refuses(ctx, s, "step 2"); /* and it stays so */
    dsgd_strategy_destroy(s);
    /* a new strategy over the same factory trains again */
    g_opt_fail_calls = 0;
    g_opt_fail_at = -1;
    s = strat_make(ctx, &d);
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, COUNT, &info));
    tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

/* A run whose fn fails on one replica (here before any collective, the others
   returning OK): the hub is aborted, so the communicators cannot be used
   again, and the replicas' state is whatever fn left. The strategy refuses
   every later call, with one replica as with several. */
static dsgd_result fail_on_1_fn(dsgd_replica *rep, void *user) {
    (void)user;
    if (dsgd_replica_id(rep) != 1 % dsgd_replica_count(rep)) return DSGD_OK;
    return dsgd_ctx_set_error(dsgd_replica_ctx(rep), DSGD_ERR_SHAPE, "injected failure in fn");
}

static void test_failed_run_fails_strategy(void **state) {
    static const int ns[2] = {3, 1};
    int i;
    (void)state;
    for (i = 0; i < 2; ++i) {
        dsgd_ctx *ctx = tu_ctx();
        dsgd_strategy_desc d = strat_desc(ns[i] == 1 ? DSGD_STRATEGY_ONE_DEVICE : DSGD_STRATEGY_MIRRORED, ns[i], 4,
                                          DSGD_OPT_SGD);
        dsgd_strategy *s = strat_make(ctx, &d);
        float x[4 * IN], y[4];
        tu_rng rng = tu_rng_make(5);
        make_batch(&rng, x, y, 4);
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 4, NULL));
        assert_false(dsgd_strategy_failed(s));
        TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_strategy_run(s, fail_on_1_fn, NULL));
        assert_true(contains(dsgd_ctx_last_error(ctx), "injected failure in fn"));
        assert_true(dsgd_strategy_failed(s));
        assert_strategy_refuses(ctx, s, "step 1");
        printf("    N=%d after a failed run: %s\n", ns[i], dsgd_ctx_last_error(ctx));
        dsgd_strategy_destroy(s);
        dsgd_ctx_destroy(ctx);
    }
}

/* ---------------------------------------------------------------- 9: a replica that stops taking part */

typedef struct absent_job {
    int absent;
    dsgd_result res[MAXN];
    double elapsed[MAXN];
    char msg[MAXN][1024];
} absent_job;

static dsgd_result absent_fn(dsgd_replica *rep, void *user) {
    absent_job *j = (absent_job *)user;
    int r = dsgd_replica_id(rep);
    float buf[64];
    double t0;
    int i;
    if (r == j->absent) return DSGD_OK; /* never joins */
    for (i = 0; i < 64; ++i) buf[i] = (float)r;
    t0 = dsgd_now();
    j->res[r] = dsgd_allreduce(dsgd_replica_comm(rep), buf, 64, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, 0.0);
    j->elapsed[r] = dsgd_now() - t0;
    snprintf(j->msg[r], sizeof(j->msg[r]), "%s", dsgd_ctx_last_error(dsgd_replica_ctx(rep)));
    return j->res[r];
}

static void test_absent_replica_times_out(void **state) {
    enum { N = 4 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, N, 4, DSGD_OPT_SGD);
    dsgd_strategy *s;
    absent_job job;
    dsgd_result rr;
    double t0, elapsed;
    float x[N * IN], y[N];
    const char *msg, *hash;
    int r;
    (void)state;
    d.timeout_s = 0.3;
    s = strat_make(ctx, &d);
    memset(&job, 0, sizeof(job));
    job.absent = 3;
    tu_watchdog_for("test_absent_replica_times_out", 20);
    t0 = dsgd_now();
    rr = dsgd_strategy_run(s, absent_fn, &job);
    elapsed = dsgd_now() - t0;
    tu_watchdog_for("test_absent_replica_times_out (after the run)", 240);
    msg = dsgd_ctx_last_error(ctx);
    printf("    absent replica 3: run -> %s after %.3f s: %s\n", dsgd_result_string(rr), elapsed, msg);
    for (r = 0; r < N - 1; ++r)
        printf("      replica %d: %s after %.3f s: %s\n", r, dsgd_result_string(job.res[r]), job.elapsed[r], job.msg[r]);
    assert_int_equal(rr, DSGD_ERR_TIMEOUT);
    assert_true(elapsed < 3.0);
    /* the first replica to time out aborts the transport: each of the others
       either timed out too, at the same deadline, or was stopped by that
       abort, and then says so */
    {
        int timeouts = 0;
        for (r = 0; r < N - 1; ++r) {
            const char *rmsg = NULL;
            dsgd_result rres = dsgd_strategy_replica_result(s, r, &rmsg);
            printf("      replica %d's result: %s: %s\n", r, dsgd_result_string(rres), rmsg);
            assert_true(job.elapsed[r] < 3.0);
            assert_true(contains(job.msg[r], "waiting for"));
            if (job.res[r] == DSGD_ERR_TIMEOUT) {
                ++timeouts;
                assert_int_equal(rres, DSGD_ERR_TIMEOUT);
                assert_true(contains(rmsg, "timed out waiting for rank"));
            } else {
                assert_int_equal(job.res[r], DSGD_ERR_ABORTED);
                assert_int_equal(rres, DSGD_ERR_ABORTED);
                assert_true(contains(rmsg, "aborted because replica "));
            }
        }
        assert_true(timeouts >= 1);
        assert_int_equal(dsgd_strategy_replica_result(s, 3, NULL), DSGD_OK); /* the absent one returned OK */
    }
    /* the message names the collective's sequence number (#1, the first on
       this communicator) and a rank */
    hash = strstr(msg, "#1");
    assert_non_null(hash);
    assert_false(hash[2] >= '0' && hash[2] <= '9');
    assert_true(contains(msg, "rank "));

    /* the strategy is unusable afterwards, and says so */
    assert_true(dsgd_strategy_failed(s));
    make_batch(&(tu_rng){3}, x, y, N);
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_strategy_train_step(s, x, y, N, NULL));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_strategy_eval_batch(s, x, y, N));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_strategy_run(s, absent_fn, &job));
    tu_watchdog_for("dsgd_strategy_destroy after a timeout", 20);
    dsgd_strategy_destroy(s);
    tu_watchdog_for("test_absent_replica_times_out (after destroy)", 240);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- 10: bad arguments */

static dsgd_result noop_fn(dsgd_replica *rep, void *user) {
    (void)rep;
    (void)user;
    return DSGD_OK;
}

static void test_bad_arguments(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    float x[8 * IN], y[8], buf[4];
    dsgd_metrics mt;
    tu_rng rng = tu_rng_make(1);
    (void)state;
    make_batch(&rng, x, y, 8);

    /* replica counts */
    d = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 0, 4, DSGD_OPT_SGD);
    s = strat_make(ctx, &d);
    assert_int_equal(dsgd_strategy_num_replicas(s), 1);
    assert_non_null(dsgd_strategy_model(s, 0));
    assert_null(dsgd_strategy_model(s, 1));
    assert_null(dsgd_strategy_model(s, -1));
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 4, NULL));
    dsgd_strategy_destroy(s);
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 0, 4, DSGD_OPT_SGD);
    s = strat_make(ctx, &d); /* default: one replica */
    assert_int_equal(dsgd_strategy_num_replicas(s), 1);
    dsgd_strategy_destroy(s);
    {
        static const int bad_n[3] = {-1, 300, 257};
        int i;
        for (i = 0; i < 3; ++i) {
            d = strat_desc(DSGD_STRATEGY_MIRRORED, bad_n[i], 4, DSGD_OPT_SGD);
            s = (dsgd_strategy *)&d; /* must be overwritten with NULL */
            TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
            assert_null(s);
        }
    }
    d = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 2, 4, DSGD_OPT_SGD);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_true(contains(dsgd_ctx_last_error(ctx), "dsgd_strategy_create: one_device takes 1 replica, not 2"));
    d = strat_desc((dsgd_strategy_kind)7, 2, 4, DSGD_OPT_SGD);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_true(contains(dsgd_ctx_last_error(ctx), "unknown strategy kind 7"));
    assert_string_equal(dsgd_strategy_kind_name(DSGD_STRATEGY_ONE_DEVICE), "one_device");
    assert_string_equal(dsgd_strategy_kind_name(DSGD_STRATEGY_MIRRORED), "mirrored");
    assert_string_equal(dsgd_strategy_kind_name((dsgd_strategy_kind)DSGD_STRATEGY_COUNT), "unknown");
    assert_string_equal(dsgd_strategy_kind_name((dsgd_strategy_kind)-1), "unknown");
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    d.nonfinite = (dsgd_nonfinite_policy)5;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    d.timeout_s = -1.0;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d.timeout_s = NAN;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    d.algorithm = (dsgd_allreduce_algo)42;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    d.gradient_path = (dsgd_gradient_path)9;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    /* CPU backends have no device-side reduction: DEVICE is refused, AUTO is HOST */
    d.gradient_path = DSGD_GRADIENTS_DEVICE;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    assert_true(contains(dsgd_ctx_last_error(ctx), "gradient_path DEVICE"));
    /* one replica exchanges nothing: DEVICE is accepted and resolves to HOST */
    d.num_replicas = 1;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    assert_int_equal(dsgd_strategy_gradient_path(s), DSGD_GRADIENTS_HOST);
    dsgd_strategy_destroy(s);
    d.num_replicas = 2;
    d.gradient_path = DSGD_GRADIENTS_AUTO;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    assert_int_equal(dsgd_strategy_gradient_path(s), DSGD_GRADIENTS_HOST);
    assert_string_equal(dsgd_gradient_path_name(dsgd_strategy_gradient_path(s)), "host");
    dsgd_strategy_destroy(s);
    s = NULL;
    /* a bad model or optimizer desc: the replica's error reaches ctx */
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    d.model.input_dim = 0;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    assert_true(contains(dsgd_ctx_last_error(ctx), "replica 0"));
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    d.optimizer.lr = -1.0f;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 4, 4, DSGD_OPT_SGD);
    d.backend_factory = broken_factory;
    TU_ERR(ctx, DSGD_ERR_BACKEND, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    assert_true(contains(dsgd_ctx_last_error(ctx), "replica 2"));
    assert_true(contains(dsgd_ctx_last_error(ctx), "no device"));
    /* NULL desc and out */
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, NULL, &s));
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, NULL));

    /* batches: count 1..N * max_batch, x and y non-NULL */
    d = strat_desc(DSGD_STRATEGY_MIRRORED, 2, 4, DSGD_OPT_SGD);
    s = strat_make(ctx, &d);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, x, y, 0, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, x, y, -3, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, x, y, 9, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, NULL, y, 4, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, x, NULL, 4, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_eval_batch(s, x, y, 9));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_eval_batch(s, NULL, y, 4));
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 8, NULL)); /* the largest is fine */
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_run(s, NULL, NULL));
    TU_OK(ctx, dsgd_strategy_run(s, noop_fn, NULL));
    {
        const char *m = NULL;
        assert_int_equal(dsgd_strategy_replica_result(s, 1, &m), DSGD_OK);
        assert_string_equal(m, "");
        m = NULL;
        assert_int_equal(dsgd_strategy_replica_result(s, 2, &m), DSGD_ERR_INVALID_ARGUMENT);
        assert_string_equal(m, "");
        assert_int_equal(dsgd_strategy_replica_result(s, -1, NULL), DSGD_ERR_INVALID_ARGUMENT);
        assert_false(dsgd_strategy_failed(s));
    }
    assert_null(dsgd_strategy_model(s, 2));
    assert_null(dsgd_strategy_model(s, -1));
    {
        float p[NPARAMS + 1];
        TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_model_get_params(dsgd_strategy_model(s, 1), p, NPARAMS - 1));
        TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_model_set_params(dsgd_strategy_model(s, 1), p, NPARAMS + 1));
    }
    /* variables: bad ids, NULL buffers, replica out of range */
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_read_variable(s, 999, buf));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_read_variable(s, -1, buf));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_read_variable(s, 0, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_read_local(s, 0, 2, buf));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_read_local(s, 0, -1, buf));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_assign_variable(s, 999, buf));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, NULL));
    assert_int_equal(dsgd_strategy_find_variable(s, NULL), -1);
    assert_int_equal(dsgd_strategy_find_variable(s, "no such"), -1);
    dsgd_strategy_destroy(s);

    /* NULL strategy */
    assert_int_equal(dsgd_strategy_train_step(NULL, x, y, 4, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_eval_batch(NULL, x, y, 4), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_run(NULL, noop_fn, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_take_metrics(NULL, DSGD_METRICS_TRAIN, &mt), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_set_aggregation(NULL, "*", DSGD_AGG_SUM, DSGD_SYNC_AUTO), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_read_variable(NULL, 0, buf), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_num_replicas(NULL), 0);
    assert_int_equal(dsgd_strategy_failed(NULL), 0);
    assert_int_equal(dsgd_strategy_replica_result(NULL, 0, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(dsgd_strategy_model(NULL, 0));
    assert_int_equal(dsgd_replica_assign(NULL, 0, buf), DSGD_ERR_INVALID_ARGUMENT);
    dsgd_strategy_destroy(NULL);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- main */

static int watch_setup(void **state) {
    (void)state;
    tu_watchdog_for("a test (global watchdog)", 240);
    return 0;
}

static int watch_teardown(void **state) {
    (void)state;
    tu_watchdog(0);
    return 0;
}

/* ---------------------------------------------------------------- who made the others wait */
/* dsgd_strategy_wait_report. Over simnet (virtual time, free links, parked
   replicas): 4 mirrored replicas whose batch fn charges the compute model
   (CONSTANT 10 ms, rank_factor 3 for rank 3), so every step lasts 30 ms
   and ranks 0..2 wait 20 ms for rank 3 in its first collective: rank 3
   made the others wait exactly 2/3 of the step, the others 0. A SLOW
   fault (x 2 on rank 3 from step 5) makes the next window's steps 60 ms,
   of which the others wait 50 ms: 5/6. Over the loopback (real time) a
   replica that sleeps 25 ms in its batch fn is named, loosely. */
typedef struct wr_data {
    dsgd_simnet *hub;
    int step;
    int sleeper;   /* loopback: this replica sleeps (-1: none) */
    const float *x, *y;
    int per;       /* samples per replica */
} wr_data;

static dsgd_result wr_batch(void *user, int replica, int n, dsgd_batch *out) {
    wr_data *w = (wr_data *)user;
    (void)n;
    out->x = w->x + (size_t)replica * (size_t)w->per * IN;
    out->y = w->y + (size_t)replica * (size_t)w->per;
    out->count = w->per;
    if (w->hub) return dsgd_simnet_compute(w->hub, replica, w->step);
    if (replica == w->sleeper) {
        struct timespec ts = {0, 25000000L};
        nanosleep(&ts, NULL);
    }
    return DSGD_OK;
}

static void wr_steps(dsgd_ctx *ctx, dsgd_strategy *s, wr_data *w, int from, int to) {
    for (w->step = from; w->step < to; ++w->step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, wr_batch, w, NULL));
}

static void test_wait_report_simnet(void **state) {
    static const double factor[4] = {1, 1, 1, 3};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_desc sd;
    dsgd_simnet_fault slow;
    dsgd_simnet *hub;
    dsgd_transport_i ep[4];
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, 4, 4, DSGD_OPT_SGD);
    dsgd_strategy *s;
    dsgd_wait_report rep;
    double frac[4];
    float x[16 * IN], y[16];
    tu_rng rng = tu_rng_make(31);
    wr_data w;
    int i;
    (void)state;
    make_batch(&rng, x, y, 16);
    memset(&sd, 0, sizeof(sd));
    sd.ranks = 4;
    sd.park_between_calls = 1;
    sd.compute.kind = DSGD_SIMNET_COMPUTE_CONSTANT;
    sd.compute.mean_s = 0.01;
    sd.compute.rank_factor = factor;
    memset(&slow, 0, sizeof(slow));
    slow.kind = DSGD_SIMNET_FAULT_SLOW;
    slow.rank = 3;
    slow.step = 5;
    slow.factor = 2.0;
    sd.faults = &slow;
    sd.num_faults = 1;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &ep[i]));
    d.endpoints = ep;
    d.gradient_path = DSGD_GRADIENTS_HOST;
    s = strat_make(ctx, &d);
    memset(&w, 0, sizeof(w));
    w.hub = hub;
    w.sleeper = -1;
    w.x = x;
    w.y = y;
    w.per = 4;
    wr_steps(ctx, s, &w, 0, 5);
    TU_OK(ctx, dsgd_strategy_wait_report(s, &rep, frac, 4));
    print_message("    simnet: rank %d made the others wait %.6f of the step (%.6f s, %lld steps); fractions %.3g %.3g %.3g %.3g\n",
                  rep.worst, rep.worst_fraction, rep.step_s, (long long)rep.steps, frac[0], frac[1], frac[2], frac[3]);
    assert_int_equal(rep.steps, 5);
    assert_int_equal(rep.worst, 3);
    TU_NEAR(rep.step_s, 0.03, 1e-12);
    TU_NEAR(frac[3], 2.0 / 3.0, 1e-9);
    assert_true(rep.worst_fraction == frac[3]);
    for (i = 0; i < 3; ++i) TU_NEAR(frac[i], 0.0, 1e-12);
    /* the next window: rank 3 slowed x2 from step 5 (60 ms) */
    wr_steps(ctx, s, &w, 5, 8);
    TU_OK(ctx, dsgd_strategy_wait_report(s, &rep, frac, 4));
    assert_int_equal(rep.steps, 3);
    assert_int_equal(rep.worst, 3);
    TU_NEAR(rep.step_s, 0.06, 1e-12);
    TU_NEAR(frac[3], 5.0 / 6.0, 1e-9);
    for (i = 0; i < 3; ++i) TU_NEAR(frac[i], 0.0, 1e-12);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

static void test_wait_report_loopback(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = strat_desc(DSGD_STRATEGY_MIRRORED, 3, 4, DSGD_OPT_SGD);
    dsgd_strategy *s = strat_make(ctx, &d), *one;
    dsgd_wait_report rep;
    double frac[3];
    float x[12 * IN], y[12];
    tu_rng rng = tu_rng_make(32);
    wr_data w;
    (void)state;
    make_batch(&rng, x, y, 12);
    memset(&w, 0, sizeof(w));
    w.sleeper = 2;
    w.x = x;
    w.y = y;
    w.per = 4;
    TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 12, NULL)); /* before the window: reported with it */
    TU_OK(ctx, dsgd_strategy_wait_report(s, &rep, NULL, 0)); /* opens a fresh window */
    wr_steps(ctx, s, &w, 0, 4);
    TU_OK(ctx, dsgd_strategy_wait_report(s, &rep, frac, 3));
    print_message("    loopback: rank %d made the others wait %.3f of the step (%.4f s); fractions %.3f %.3f %.3f\n",
                  rep.worst, rep.worst_fraction, rep.step_s, frac[0], frac[1], frac[2]);
    assert_int_equal(rep.steps, 4);
    assert_int_equal(rep.worst, 2);
    assert_true(rep.step_s >= 0.025);
    assert_true(frac[2] > 0.3 && frac[2] < 1.0);
    /* an empty window, then bad arguments */
    TU_OK(ctx, dsgd_strategy_wait_report(s, &rep, frac, 3));
    assert_int_equal(rep.steps, 0);
    assert_int_equal(rep.worst, -1);
    assert_true(frac[0] == 0.0 && frac[2] == 0.0);
    assert_int_equal(dsgd_strategy_wait_report(NULL, &rep, NULL, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_wait_report(s, NULL, NULL, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_wait_report(s, &rep, frac, 2), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "dsgd_strategy_wait_report"));
    dsgd_strategy_destroy(s);
    /* one replica: nobody to wait for */
    d = strat_desc(DSGD_STRATEGY_ONE_DEVICE, 1, 12, DSGD_OPT_SGD);
    one = strat_make(ctx, &d);
    TU_OK(ctx, dsgd_strategy_train_step(one, x, y, 12, NULL));
    TU_OK(ctx, dsgd_strategy_wait_report(one, &rep, frac, 1));
    assert_int_equal(rep.worst, -1);
    assert_true(frac[0] == 0.0);
    dsgd_strategy_destroy(one);
    dsgd_ctx_destroy(ctx);
}

#define T(f) cmocka_unit_test_setup_teardown(f, watch_setup, watch_teardown)

int main(void) {
    const struct CMUnitTest tests[] = {
        T(test_contract_optimizers),
        T(test_contract_algorithms_and_buckets),
        T(test_contract_staged),
        T(test_piece_bytes),
        T(test_user_endpoints),
        T(test_same_seed_bitwise),
        T(test_uneven_batches),
        T(test_model_variable_aggregation),
        T(test_distributed_variables),
        T(test_metrics),
        T(test_nonfinite_skip),
        T(test_nonfinite_error),
        T(test_replica_fails_alone),
        T(test_replica_backend_fails_in_exchange),
        T(test_run_failure_stops_peers),
        T(test_optimizer_failure_fails_strategy),
        T(test_failed_run_fails_strategy),
        T(test_absent_replica_times_out),
        T(test_bad_arguments),
        T(test_wait_report_simnet),
        T(test_wait_report_loopback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
