/* test_strategy_overlap.c - the synchronous exchange overlapped with backward
   (dsgd_strategy_desc.overlap, gradient-ready buckets).

   What is asserted, and how it is measured:
   - The same bits: MIRRORED at N = 2, 3, 4, for every all-reduce
     algorithm, at three bucket sizes (one bucket; 256 B, which cuts
     variables; 1000 B), with momentum, uneven global batches and mixed
     aggregations (a SUM and an ONLY_FIRST_REPLICA variable, so that buckets
     are scaled in pieces), the six runs (three bucket sizes, overlap on and
     off) train the very same bits, on every replica after every step
     (memcmp). The model is the built-in MLP 20 -> 160 relu -> 8 tanh -> 5
     (4693 floats, more than four of the all-reduce's 1024-float chunks, so
     the ring's blocks span several buckets), which reports its layers as
     backward goes down.
   - The exchange really runs during backward: a custom model of two
     variables reports its second ready, then waits until its replica's
     transport has sent a message (a wrapping transport counts sends)
     before it writes the first. With overlap on the send comes within
     10 s; with overlap off none comes in 0.2 s (the exchange waits for
     backward), which is what the counter must show. Both runs give the
     same bits.
   - A custom model that never reports (every variable final at its end)
     gives the same bits too.
   - A failure inside one replica's backward, after it reported a variable:
     every replica returns (that one's own error, the others
     DSGD_ERR_ABORTED), nothing is updated anywhere, the strategy stays
     usable, and the next steps train the bits of the run without overlap
     under the same failure.
   - A non-finite gradient on one replica: the step is skipped on every
     replica (weights unchanged, the same as without overlap).
   - The step info: exchange_s > 0 and exposed_s >= 0, both finite; without
     overlap exposed_s == exchange_s.
   - Over a transport with its own clock (simnet) overlap is refused with
     DSGD_ERR_UNSUPPORTED and a message that says why.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <time.h>

enum { IN = 20, OUT = 5, NPARAMS = 20 * 160 + 160 + 160 * 8 + 8 + 8 * 5 + 5, MAXN = 4, B = 8, STEPS = 6 };

static const dsgd_layer_desc LAYERS[3] = {
    {160, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

static float g_x[STEPS][MAXN * B * IN], g_y[STEPS][MAXN * B];

static int count_of(int n, int step) { return step % 2 ? n * B - 3 : n * B; }

static void make_data(void) {
    tu_rng rng = tu_rng_make(4242);
    int step, i;
    for (step = 0; step < STEPS; ++step) {
        tu_fill(&rng, g_x[step], (size_t)MAXN * B * IN, -1.0f, 1.0f);
        for (i = 0; i < MAXN * B; ++i) g_y[step][i] = (float)tu_below(&rng, OUT);
    }
}

static dsgd_strategy_desc mlp_desc(int n, dsgd_allreduce_algo algo, size_t bucket_bytes, int overlap) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_STRATEGY_MIRRORED;
    d.num_replicas = n;
    d.algorithm = algo;
    d.bucket_bytes = bucket_bytes;
    d.overlap = overlap;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 3;
    d.model.max_batch = B;
    d.model.seed = 99;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.05f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 20.0;
    d.cpu_threads = 1;
    return d;
}

static dsgd_strategy *make(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    dsgd_strategy *s = NULL;
    TU_OK(ctx, dsgd_strategy_create(ctx, d, &s));
    return s;
}

/* Every replica of a holds b's replica 0's weights, bit for bit. */
static void same_weights(dsgd_ctx *ctx, dsgd_strategy *a, dsgd_strategy *b, size_t np, const char *what, int step) {
    float *want = tu_floats(np), *got = tu_floats(np);
    int r;
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(b, 0), want, np));
    for (r = 0; r < dsgd_strategy_num_replicas(a); ++r) {
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(a, r), got, np));
        if (memcmp(got, want, np * sizeof(float)) != 0)
            fail_msg("%s, step %d, replica %d: the weights differ (rel err %.3g)",
                     what, step, r, tu_rel_err(got, want, np));
    }
    free(want);
    free(got);
}

static void info_sane(const dsgd_step_info *in, int overlap) {
    assert_true(isfinite(in->exchange_s) && in->exchange_s > 0.0);
    assert_true(isfinite(in->exposed_s) && in->exposed_s >= 0.0);
    if (!overlap) assert_true(in->exposed_s == in->exchange_s);
}

/* ---------------------------------------------------------------- the same bits */

/* Six runs of one algorithm at N: bucket sizes 0 (one bucket), 256 and
   1000 B, each with overlap off and on; after every step every replica of
   every run holds the weights of the first run's replica 0. */
static void check_bits(int n, dsgd_allreduce_algo algo, double *secs) {
    static const size_t buckets[3] = {0, 256, 1000};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s[6];
    char what[128];
    int step, k;
    for (k = 0; k < 6; ++k) {
        dsgd_strategy_desc d = mlp_desc(n, algo, buckets[k / 2], k % 2);
        s[k] = make(ctx, &d);
        TU_OK(ctx, dsgd_strategy_set_aggregation(s[k], "dense1/kernel", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
        TU_OK(ctx, dsgd_strategy_set_aggregation(s[k], "dense2/bias", DSGD_AGG_ONLY_FIRST_REPLICA, DSGD_SYNC_AUTO));
    }
    for (step = 0; step < STEPS; ++step) {
        for (k = 0; k < 6; ++k) {
            dsgd_step_info in;
            TU_OK(ctx, dsgd_strategy_train_step(s[k], g_x[step], g_y[step], count_of(n, step), &in));
            info_sane(&in, k % 2);
            if (k % 2) {
                secs[0] += in.exchange_s;
                secs[1] += in.exposed_s;
            }
        }
        for (k = 0; k < 6; ++k) {
            snprintf(what, sizeof what, "N=%d %s bucket %zu B overlap %s against one bucket without overlap", n,
                     dsgd_allreduce_algo_name(algo), buckets[k / 2], k % 2 ? "on" : "off");
            same_weights(ctx, s[k], s[0], NPARAMS, what, step); /* the replicas agree too */
        }
    }
    for (k = 0; k < 6; ++k) dsgd_strategy_destroy(s[k]);
    dsgd_ctx_destroy(ctx);
}

static void test_same_bits(void **state) {
    int n, a, cases = 0;
    double secs[2] = {0.0, 0.0};
    (void)state;
    tu_watchdog(300);
    for (n = 2; n <= MAXN; ++n)
        for (a = 0; a < DSGD_ALLREDUCE_COUNT; ++a, ++cases) check_bits(n, (dsgd_allreduce_algo)a, secs);
    print_message("    %d cases (N 2..4 x every algorithm, %d steps each): bucket sizes 0, 256 and 1000 B, overlap "
                  "on and off, all bit for bit; with overlap %.1f ms of exchange, %.1f ms waited for after "
                  "backward\n", cases, STEPS, 1e3 * secs[0], 1e3 * secs[1]);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- a transport that counts sends */

typedef struct counting {
    dsgd_transport_i inner;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int sends;
} counting;

static dsgd_result c_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    counting *c = (counting *)impl;
    pthread_mutex_lock(&c->mu);
    c->sends++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return c->inner.send(c->inner.impl, dst, tag, buf, bytes, deadline);
}

static dsgd_result c_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    counting *c = (counting *)impl;
    return c->inner.recv(c->inner.impl, src, tag, buf, bytes, deadline);
}

static void c_abort(void *impl) {
    counting *c = (counting *)impl;
    c->inner.abort(c->inner.impl);
}

/* Waits up to seconds for a send through c; whether one came. */
static int c_wait_send(counting *c, double seconds) {
    struct timespec until;
    int got;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)seconds;
    until.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&c->mu);
    while (c->sends == 0 && pthread_cond_timedwait(&c->cv, &c->mu, &until) == 0) {
    }
    got = c->sends > 0;
    pthread_mutex_unlock(&c->mu);
    return got;
}

/* ---------------------------------------------------------------- a custom model that reports */

enum { PA = 40, PB = 24, CNP = PA + PB };

typedef struct two_user {
    counting *counters;  /* per replica; NULL: no wait */
    double wait_s;       /* how long compute_gradients waits for a send */
    int report;          /* report variable 1 before writing variable 0 */
    int fail_marker;     /* a batch whose first x is this fails after the report */
    int created;         /* atomic */
    int saw_send[MAXN];  /* per replica and call: a send came while it waited */
} two_user;

typedef struct two_state {
    two_user *u;
    int replica;
} two_state;

static dsgd_result two_create(void *user_data, dsgd_model *m, void **state) {
    two_user *u = (two_user *)user_data;
    two_state *s = (two_state *)calloc(1, sizeof(*s));
    (void)m;
    if (!s) return DSGD_ERR_OUT_OF_MEMORY;
    s->u = u;
    s->replica = __atomic_fetch_add(&u->created, 1, __ATOMIC_SEQ_CST);
    *state = s;
    return DSGD_OK;
}

static void two_destroy(void *state) { free(state); }

/* A made-up smooth gradient: g = scale * sum over samples of x[(i + 3j) %
   IN] * (p_i - y/OUT), per element i of a variable (j its index). */
static void two_grad(const float *p, float *g, int len, int j, const dsgd_batch *b, float scale) {
    int i, s;
    for (i = 0; i < len; ++i) {
        float acc = 0.0f;
        for (s = 0; s < b->count; ++s) acc += b->x[(size_t)s * IN + (size_t)((i + 3 * j) % IN)] * (p[i] - b->y[s] / OUT);
        g[i] = scale * acc;
    }
}

static dsgd_result two_gradients(void *state, dsgd_model *m, const dsgd_batch *b, float scale, dsgd_metrics *mt) {
    two_state *st = (two_state *)state;
    two_user *u = st->u;
    const float *p = dsgd_model_host_params(m);
    float *g = dsgd_model_host_grads(m);
    dsgd_result r;
    (void)mt;
    two_grad(p + PA, g + PA, PB, 1, b, scale);
    if (u->report) {
        if ((r = dsgd_model_variable_ready(m, 1)) != DSGD_OK) return r;
        if (u->counters) u->saw_send[st->replica] = c_wait_send(&u->counters[st->replica], u->wait_s);
    }
    if (b->count > 0 && b->x[0] == (float)u->fail_marker)
        return dsgd_ctx_set_error(dsgd_model_ctx(m), DSGD_ERR_INVALID_ARGUMENT, "two: the marked batch");
    two_grad(p, g, PA, 0, b, scale);
    return DSGD_OK;
}

static const dsgd_model_i TWO = {"two", two_create, two_destroy, two_gradients, NULL, 1};

static dsgd_strategy_desc two_desc(int n, two_user *u, int overlap, const dsgd_transport_i *eps) {
    static dsgd_variable_desc vars[2];
    dsgd_strategy_desc d;
    memset(vars, 0, sizeof vars);
    vars[0].name = "a";
    vars[0].rank = 1;
    vars[0].shape[0] = PA;
    vars[1].name = "b";
    vars[1].rank = 1;
    vars[1].shape[0] = PB;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_STRATEGY_MIRRORED;
    d.num_replicas = n;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.bucket_bytes = PB * sizeof(float); /* buckets [0, 24), [24, 48), [48, 64): the last is b's */
    d.overlap = overlap;
    d.model.input_dim = IN;
    d.model.max_batch = B;
    d.model.seed = 5;
    d.model.custom = &TWO;
    d.model.user_data = u;
    d.model.variables = vars;
    d.model.num_variables = 2;
    d.optimizer.kind = DSGD_OPT_SGD;
    d.optimizer.lr = 0.1f;
    d.timeout_s = 20.0;
    d.cpu_threads = 1;
    d.endpoints = eps;
    return d;
}

/* n counting endpoints over a loopback hub of n ranks (send, recv and abort
   only: the collectives then pair their sends and receives themselves). */
static void counting_make(dsgd_ctx *ctx, int n, dsgd_loopback **hub, counting *cs, dsgd_transport_i *eps) {
    int i;
    TU_OK(ctx, dsgd_loopback_create(ctx, n, hub));
    for (i = 0; i < n; ++i) {
        memset(&cs[i], 0, sizeof(cs[i]));
        TU_OK(ctx, dsgd_loopback_endpoint(*hub, i, &cs[i].inner));
        pthread_mutex_init(&cs[i].mu, NULL);
        pthread_cond_init(&cs[i].cv, NULL);
        memset(&eps[i], 0, sizeof(eps[i]));
        eps[i].name = "counting";
        eps[i].impl = &cs[i];
        eps[i].rank = i;
        eps[i].size = n;
        eps[i].send = c_send;
        eps[i].recv = c_recv;
        eps[i].abort = c_abort;
    }
}

static void counting_free(int n, dsgd_loopback *hub, counting *cs) {
    int i;
    for (i = 0; i < n; ++i) {
        pthread_cond_destroy(&cs[i].cv);
        pthread_mutex_destroy(&cs[i].mu);
    }
    dsgd_loopback_destroy(hub);
}

/* Trains 3 steps of the two-variable model over counting endpoints: each
   replica's compute_gradients waits (wait_s) for its rank to send after
   reporting b; *saw: replicas that saw a send, summed over the steps. */
static void two_run(int n, int overlap, int report, double wait_s, float *params, int *saw) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    counting cs[MAXN];
    dsgd_transport_i eps[MAXN];
    two_user u;
    dsgd_strategy_desc d;
    dsgd_strategy *s;
    int step, r;
    memset(&u, 0, sizeof(u));
    u.counters = cs;
    u.wait_s = wait_s;
    u.report = report;
    u.fail_marker = 12345;
    counting_make(ctx, n, &hub, cs, eps);
    d = two_desc(n, &u, overlap, eps);
    s = make(ctx, &d);
    *saw = 0;
    for (step = 0; step < 3; ++step) {
        for (r = 0; r < n; ++r) {
            pthread_mutex_lock(&cs[r].mu);
            cs[r].sends = 0;
            pthread_mutex_unlock(&cs[r].mu);
        }
        TU_OK(ctx, dsgd_strategy_train_step(s, g_x[step], g_y[step], n * B, NULL));
        for (r = 0; r < n; ++r) *saw += u.saw_send[r];
    }
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), params, CNP));
    dsgd_strategy_destroy(s);
    counting_free(n, hub, cs);
    dsgd_ctx_destroy(ctx);
}

static void test_exchange_during_backward(void **state) {
    float on[CNP], off[CNP], silent[CNP];
    int saw_on, saw_off, saw_silent;
    (void)state;
    tu_watchdog(120);
    two_run(2, 1, 1, 10.0, on, &saw_on);
    two_run(2, 0, 1, 0.2, off, &saw_off);
    two_run(2, 1, 0, 0.0, silent, &saw_silent);
    print_message("    sends seen inside backward, 2 replicas x 3 steps: %d with overlap, %d without\n", saw_on, saw_off);
    assert_int_equal(saw_on, 2 * 3);
    assert_int_equal(saw_off, 0);
    assert_memory_equal(on, off, sizeof on);
    assert_memory_equal(silent, off, sizeof off); /* nothing reported: every bucket at the end */
}

/* ---------------------------------------------------------------- failures and NaN */

/* Steps 0..3 of the two-variable model, N = 3, where replica 1's batch of
   step 1 is marked: its backward fails after it reported b. */
static void fail_run(int overlap, float *params) {
    static float x[4][MAXN * B * IN];
    dsgd_ctx *ctx = tu_ctx();
    two_user u;
    dsgd_strategy_desc d;
    dsgd_strategy *s;
    dsgd_result res;
    float before[CNP], after[CNP];
    int step, r;
    const int n = 3;
    memset(&u, 0, sizeof(u));
    u.report = 1;
    u.fail_marker = 12345;
    d = two_desc(n, &u, overlap, NULL);
    s = make(ctx, &d);
    for (step = 0; step < 4; ++step) {
        memcpy(x[step], g_x[step], sizeof x[step]);
        if (step == 1) x[step][(size_t)1 * B * IN] = 12345.0f; /* replica 1's first sample */
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 2), before, CNP));
        res = dsgd_strategy_train_step(s, x[step], g_y[step], n * B, NULL);
        if (step != 1) {
            TU_OK(ctx, res);
            continue;
        }
        assert_int_equal(res, DSGD_ERR_INVALID_ARGUMENT);
        if (!strstr(dsgd_ctx_last_error(ctx), "two: the marked batch"))
            fail_msg("overlap %d: the failure's message: %s", overlap, dsgd_ctx_last_error(ctx));
        for (r = 0; r < n; ++r) {
            TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, r), after, CNP));
            assert_memory_equal(after, before, sizeof after); /* nothing updated */
        }
    }
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), params, CNP));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_failure_in_backward(void **state) {
    float on[CNP], off[CNP];
    (void)state;
    tu_watchdog(120);
    fail_run(0, off);
    fail_run(1, on);
    assert_memory_equal(on, off, sizeof on);
}

static void test_nonfinite_skips(void **state) {
    static float x[MAXN * B * IN];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d0 = mlp_desc(3, DSGD_ALLREDUCE_RING, 256, 0), d1 = mlp_desc(3, DSGD_ALLREDUCE_RING, 256, 1);
    dsgd_strategy *off = make(ctx, &d0), *on = make(ctx, &d1);
    float before[NPARAMS], after[NPARAMS];
    int step, k;
    (void)state;
    tu_watchdog(120);
    for (step = 0; step < 4; ++step) {
        memcpy(x, g_x[step], sizeof x);
        if (step == 2) x[2 * B * IN + 3] = NAN; /* replica 2's shard */
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(on, 0), before, NPARAMS));
        for (k = 0; k < 2; ++k) {
            dsgd_step_info in;
            TU_OK(ctx, dsgd_strategy_train_step(k ? on : off, x, g_y[step], 3 * B, &in));
            assert_int_equal(in.skipped, step == 2);
        }
        if (step == 2) {
            TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(on, 1), after, NPARAMS));
            assert_memory_equal(after, before, sizeof after);
        }
        same_weights(ctx, on, off, NPARAMS, "NaN on replica 2", step);
    }
    dsgd_strategy_destroy(on);
    dsgd_strategy_destroy(off);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- refused */

static void test_simnet_refused(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_desc sd;
    dsgd_simnet *hub = NULL;
    dsgd_transport_i eps[2];
    dsgd_strategy_desc d = mlp_desc(2, DSGD_ALLREDUCE_RING, 0, 1);
    dsgd_strategy *s = NULL;
    int i;
    (void)state;
    tu_watchdog(60);
    memset(&sd, 0, sizeof(sd));
    sd.ranks = 2;
    sd.alpha_s = 1e-6;
    sd.beta_s_per_byte = 1e-9;
    sd.park_between_calls = 1;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    for (i = 0; i < 2; ++i) TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &eps[i]));
    d.endpoints = eps;
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    if (!strstr(dsgd_ctx_last_error(ctx), "its own clock"))
        fail_msg("the refusal's message: %s", dsgd_ctx_last_error(ctx));
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

static int setup(void **state) {
    (void)state;
    make_data();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_bits),
        cmocka_unit_test(test_exchange_during_backward),
        cmocka_unit_test(test_failure_in_backward),
        cmocka_unit_test(test_nonfinite_skips),
        cmocka_unit_test(test_simnet_refused),
    };
    return cmocka_run_group_tests_name("overlap", tests, setup, NULL);
}
