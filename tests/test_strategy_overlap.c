/* test_strategy_overlap.c - the synchronous exchange overlapped with backward
   (dsgd_strategy_desc.overlap, gradient-ready buckets).

   What is asserted, and how it is measured:
   - The same bits: MIRRORED at N = 2, 3, 4, for every all-reduce
     algorithm (make test: every algorithm at N = 3, RING at 2 and 4),
     at three bucket sizes (one bucket; 256 B, which cuts
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
   - Over simnet, two lanes per rank (TWO LANES in strategy_overlap.h):
     N = 4, recursive doubling, 20 us and 1 GB/s links, the MLP
     20 -> 64 -> 64 -> 64 -> 5 with backward_s 50, 300, 500, 200 us from
     the last layer to the first, at one bucket, 4 KiB and 1000 B, and
     with a comm hook that all-reduces its buckets of whole variables at
     4 KiB: every
     rank's step, with overlap and without, takes the closed form's
     virtual time (computed here from the model's variables: the
     buckets' ready times, the communication lane's max(ready, free),
     recursive doubling's alpha-beta cost, phase 2's one-float agreement)
     within 1e-9 s, and the step info's exchange_s, exposed_s and hidden
     seconds are the closed form's; both train a loopback run's bits. The
     rank threads sleep at random around each hand-off (test_jitter_s).
   - A rank killed during its backward (simnet KILL by time, in an
     all-reduce or in its communication lane's wait): the step fails on
     every replica without hanging, the strategy is failed, the killed
     replica's result is DSGD_ERR_ABORTED and says it was killed, naming
     the call it died in (the same in every run).
   - Over a transport with a clock of its own that is not simnet's,
     overlap is refused with DSGD_ERR_UNSUPPORTED and a message that says
     why.

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
   1000 B, each with overlap off and on; after every step (of `steps`)
   every replica of every run holds the weights of the first run's
   replica 0. */
static void check_bits(int n, dsgd_allreduce_algo algo, int steps, double *secs) {
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
    for (step = 0; step < steps; ++step) {
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

/* The quick tier runs every algorithm at N = 3 (the folds of the
   power-of-two algorithms, uneven ring blocks) and RING at N = 2 and 4,
   3 steps each (both batch sizes, momentum carried); make test-full every
   algorithm at N = 2, 3 and 4, STEPS steps each. */
static void test_same_bits(void **state) {
    int n, a, cases = 0, steps = TU_PICK(STEPS, 3);
    double secs[2] = {0.0, 0.0};
    (void)state;
    tu_watchdog(300);
    for (n = 2; n <= MAXN; ++n)
        for (a = 0; a < DSGD_ALLREDUCE_COUNT; ++a) {
            if (!tu_full() && n != 3 && a != DSGD_ALLREDUCE_RING) continue;
            check_bits(n, (dsgd_allreduce_algo)a, steps, secs);
            ++cases;
        }
    print_message("    %d cases (N x algorithm, %d steps each): bucket sizes 0, 256 and 1000 B, overlap "
                  "on and off, all bit for bit; with overlap %.1f ms of exchange, %.1f ms waited for after "
                  "backward\n", cases, steps, 1e3 * secs[0], 1e3 * secs[1]);
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
    two_run(2, 0, 1, TU_PICK(0.2, 0.05), off, &saw_off); /* the quick tier waits 50 ms a step for a send */
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

/* ---------------------------------------------------------------- over simnet: two lanes */

/* The network and the backward of the simnet runs: N = 4 ranks, 20 us
   latency, 1 GB/s, the all-reduce recursive doubling (its cost does not
   depend on how the all-reduce's map cuts a bucket into blocks), and the
   MLP 20 -> 64 relu -> 64 relu -> 64 tanh -> 5, whose backward takes
   LAYER_S[l] for layer l (3/4 before its kernel is reported, 1/4 before
   its bias). Layer 1 is slow enough that the communication lane idles
   waiting for its buckets, layer 0 fast enough that the buckets wait for
   the lane. */
#define SN_N 4
#define SN_ALPHA 20e-6
#define SN_BETA 1e-9
enum { SN_LAYERS = 4, SN_VARS = 2 * SN_LAYERS, SN_STEPS = 4 };
static const double LAYER_S[SN_LAYERS] = {200e-6, 500e-6, 300e-6, 50e-6};
static const dsgd_layer_desc DEEP[SN_LAYERS] = {
    {64, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {64, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {64, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

static dsgd_strategy_desc deep_desc(size_t bucket_bytes, int overlap) {
    dsgd_strategy_desc d = mlp_desc(SN_N, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, bucket_bytes, overlap);
    d.model.layers = DEEP;
    d.model.num_layers = SN_LAYERS;
    return d;
}

/* backward_s: variable 2l is layer l's kernel, 2l + 1 its bias */
static void backward_costs(double *c) {
    int l;
    for (l = 0; l < SN_LAYERS; ++l) {
        c[2 * l] = 0.75 * LAYER_S[l];
        c[2 * l + 1] = 0.25 * LAYER_S[l];
    }
}

/* A recursive-doubling all-reduce of n floats on SN_N ranks over simnet
   (no sendrecv_upto there, so the agreement runs on its own first): lg
   rounds of the 144-byte fingerprint range, then lg rounds of the n
   floats, each alpha + bytes * beta (reductions on its own memory are
   free), lg = log2 SN_N. */
static double rd_cost(size_t n) {
    double lg = 0;
    int p;
    for (p = 1; p < SN_N; p <<= 1) lg += 1;
    return lg * (SN_ALPHA + 144.0 * SN_BETA) + lg * (SN_ALPHA + 4.0 * (double)n * SN_BETA);
}

typedef struct lanes {
    double compute;  /* the compute lane's backward */
    double exchange; /* the sum of the buckets' all-reduces */
    double exposed;  /* how long the communication lane ran past the compute lane */
    double step;     /* the step: both lanes, then phase 2's one-float agreement */
    double step_off; /* the same step without overlap: backward, agreement, exchange */
} lanes;

/* The two-lane closed form of one step, from the model's variables (m),
   the backward costs (c) and the bucket size, computed here without the
   strategy: the built-in network reports its layers last first, kernel
   then bias, so variable v is final at R(v), the costs of the variables
   reported up to v; bucket k is ready at the latest R(v) of the variables
   it holds and goes once it and every later bucket are ready (G_k =
   max(ready_k, G_k+1)); the communication lane starts it at max(G_k, the
   end of the bucket before), and it takes rd_cost of its floats. Bucket k
   is [bo[k], bo[k + 1]), nb buckets. */
static lanes two_lanes(const dsgd_model *m, const double *c, const size_t *bo, int nb) {
    double R[SN_VARS], t = 0, go = 0, free_at = 0;
    lanes o;
    int l, v, k;
    memset(&o, 0, sizeof(o));
    for (l = SN_LAYERS - 1; l >= 0; --l)
        for (v = 2 * l; v <= 2 * l + 1; ++v) R[v] = t += c[v];
    o.compute = t;
    for (k = nb - 1; k >= 0; --k) {
        size_t lo = bo[k], hi = bo[k + 1];
        double ready = 0, start;
        for (v = 0; v < SN_VARS; ++v) {
            const dsgd_variable *var = dsgd_model_variable(m, v);
            if (var->offset < hi && var->offset + var->count > lo && R[v] > ready) ready = R[v];
        }
        go = ready > go ? ready : go;
        start = go > free_at ? go : free_at;
        free_at = start + rd_cost(hi - lo);
        o.exchange += rd_cost(hi - lo);
    }
    o.exposed = free_at > o.compute ? free_at - o.compute : 0.0;
    o.step = (free_at > o.compute ? free_at : o.compute) + rd_cost(1); /* phase 2: AUTO takes RD for 1 float */
    o.step_off = o.compute + rd_cost(1) + o.exchange;
    return o;
}

/* The buckets of bucket_bytes into bo (nb + 1 bounds; returns nb): cut
   every bucket_bytes from the start (0: one bucket), or, with a comm
   hook, after the first variable (in offset order) that brings the
   bucket to bucket_bytes, as COMM HOOKS in comm_hook.h says. */
static int buckets_of(const dsgd_model *m, size_t bucket_bytes, int hook, size_t *bo) {
    size_t p = dsgd_model_num_params(m), bucket = bucket_bytes / sizeof(float);
    int nb = 0, v;
    bo[0] = 0;
    if (hook) {
        for (v = 0; v < SN_VARS; ++v) {
            const dsgd_variable *var = dsgd_model_variable(m, v);
            size_t end = var->offset + var->count;
            if (bucket_bytes && (end - bo[nb]) * sizeof(float) >= bucket_bytes && end < p) bo[++nb] = end;
        }
        bo[++nb] = p;
        return nb;
    }
    if (bucket == 0 || bucket > p) bucket = p;
    while (bo[nb] < p) {
        bo[nb + 1] = bo[nb] + bucket < p ? bo[nb] + bucket : p;
        ++nb;
    }
    return nb;
}

/* A comm hook that all-reduces its bucket as the strategy would: the
   same bits and, over simnet, the same time. */
static dsgd_result plain_reduce(void *state, const dsgd_hook_bucket *b) {
    (void)state;
    return dsgd_allreduce_at(b->comm, b->data, b->count, b->first, DSGD_REDUCE_SUM, b->algorithm, b->timeout_s);
}

static const dsgd_comm_hook PLAIN_HOOK = {.name = "plain", .reduce = plain_reduce};

#define NEAR(got, want) (fabs((got) - (want)) <= 1e-9)

/* A mirrored strategy over a fresh hub of SN_N ranks charging backward
   layer by layer (*hub, eps: the caller's, destroyed after the strategy). */
static dsgd_strategy *make_sim(dsgd_ctx *ctx, size_t bucket_bytes, int hook, int overlap, dsgd_simnet **hub,
                               dsgd_transport_i *eps) {
    dsgd_simnet_desc sd;
    dsgd_strategy_desc d = deep_desc(bucket_bytes, overlap);
    double c[SN_VARS];
    int i;
    backward_costs(c);
    memset(&sd, 0, sizeof(sd));
    sd.ranks = SN_N;
    sd.alpha_s = SN_ALPHA;
    sd.beta_s_per_byte = SN_BETA;
    sd.backward_s = c;
    sd.num_backward_s = SN_VARS;
    sd.park_between_calls = 1;
    sd.test_jitter_s = 50e-6; /* rank threads sleep at random around each hand-off: the times must not change */
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, hub));
    for (i = 0; i < SN_N; ++i) TU_OK(ctx, dsgd_simnet_endpoint(*hub, i, &eps[i]));
    d.endpoints = eps;
    if (hook) d.comm_hook = &PLAIN_HOOK;
    return make(ctx, &d);
}

/* Over simnet, at three bucket sizes (one bucket; 4 KiB, ten buckets;
   1000 B) and with a comm hook at 4 KiB (four buckets of whole
   variables), SN_STEPS steps with overlap on and off: every rank's step takes
   the two-lane closed form's time (on) and backward + agreement +
   exchange (off), within 1e-9 s; the step info's exchange_s, exposed_s
   and hidden communication (exchange_s - exposed_s) are the closed form's;
   and both train the bits of a loopback run without overlap, on every
   replica after every step. The hubs' threads sleep at random around each
   hand-off (test_jitter_s), so the replica's thread and its communication
   thread interleave differently run to run. */
static void test_simnet_two_lanes(void **state) {
    static const size_t buckets[4] = {0, 4096, 1000, 4096};
    static const int hooked[4] = {0, 0, 0, 1};
    double c[SN_VARS], hidden_total = 0, exposed_total = 0;
    int b, step, k, r, nb, checked = 0;
    const int steps = TU_PICK(SN_STEPS, 2); /* the quick tier: both batch sizes; make test-full 4 steps */
    (void)state;
    tu_watchdog(240);
    backward_costs(c);
    for (b = 0; b < 4; ++b) {
        dsgd_ctx *ctx = tu_ctx();
        dsgd_simnet *hub[2] = {NULL, NULL};
        dsgd_transport_i eps[2][SN_N];
        dsgd_strategy *s[3];
        dsgd_strategy_desc ld = deep_desc(buckets[b], 0);
        size_t np, bo[64];
        lanes want;
        char what[160], cfg[64];
        snprintf(cfg, sizeof cfg, "bucket %zu B%s", buckets[b], hooked[b] ? " (comm hook)" : "");
        s[0] = make(ctx, &ld); /* the loopback, without overlap nor hook: the reference bits */
        s[1] = make_sim(ctx, buckets[b], hooked[b], 1, &hub[0], eps[0]);
        s[2] = make_sim(ctx, buckets[b], hooked[b], 0, &hub[1], eps[1]);
        np = dsgd_model_num_params(dsgd_strategy_model(s[0], 0));
        nb = buckets_of(dsgd_strategy_model(s[1], 0), buckets[b], hooked[b], bo);
        want = two_lanes(dsgd_strategy_model(s[1], 0), c, bo, nb);
        for (step = 0; step < steps; ++step) {
            for (k = 0; k < 3; ++k) {
                dsgd_step_info in;
                double t0[SN_N];
                dsgd_simnet *h = k ? hub[k - 1] : NULL;
                for (r = 0; h && r < SN_N; ++r) t0[r] = dsgd_simnet_time(h, r);
                TU_OK(ctx, dsgd_strategy_train_step(s[k], g_x[step], g_y[step], count_of(SN_N, step), &in));
                for (r = 0; h && r < SN_N; ++r) {
                    double got = dsgd_simnet_time(h, r) - t0[r], w = k == 1 ? want.step : want.step_off;
                    if (!NEAR(got, w))
                        fail_msg("%s, overlap %s, step %d, rank %d: the step took %.12g s, the closed form %.12g s",
                                 cfg, k == 1 ? "on" : "off", step, r, got, w);
                    ++checked;
                }
                if (!h) continue;
                if (!NEAR(in.exchange_s, want.exchange) ||
                    !NEAR(in.exposed_s, k == 1 ? want.exposed : want.exchange) ||
                    !NEAR(in.exchange_s - in.exposed_s, k == 1 ? want.exchange - want.exposed : 0.0))
                    fail_msg("%s, overlap %s, step %d: exchange %.12g s, exposed %.12g s; the closed form "
                             "%.12g and %.12g s", cfg, k == 1 ? "on" : "off", step, in.exchange_s,
                             in.exposed_s, want.exchange, k == 1 ? want.exposed : want.exchange);
                if (k == 1) {
                    hidden_total += in.exchange_s - in.exposed_s;
                    exposed_total += in.exposed_s;
                }
            }
            for (k = 1; k < 3; ++k) {
                snprintf(what, sizeof what, "simnet, %s, overlap %s, against the loopback without overlap", cfg,
                         k == 1 ? "on" : "off");
                same_weights(ctx, s[k], s[0], np, what, step);
            }
        }
        /* the closed form has both kinds of bucket where there are several:
           some communication hidden, some not */
        if (buckets[b]) assert_true(want.exposed > 0.0 && want.exchange - want.exposed > 0.0);
        print_message("    %s, %d buckets: step %.1f us with overlap (backward %.1f, exchange %.1f, of which %.1f "
                      "exposed), %.1f us without\n", cfg, nb, 1e6 * want.step, 1e6 * want.compute,
                      1e6 * want.exchange, 1e6 * want.exposed, 1e6 * want.step_off);
        for (k = 0; k < 3; ++k) dsgd_strategy_destroy(s[k]);
        dsgd_simnet_destroy(hub[0]);
        dsgd_simnet_destroy(hub[1]);
        dsgd_ctx_destroy(ctx);
    }
    print_message("    %d rank steps against the closed forms; with overlap %.1f us of communication hidden, "
                  "%.1f us exposed\n", checked, 1e6 * hidden_total, 1e6 * exposed_total);
    tu_watchdog(0);
}

/* A rank killed inside its backward at time `when` (a simnet KILL): the
   step fails instead of hanging, the strategy is failed, and the killed
   replica's result is DSGD_ERR_ABORTED with a message that names the call
   it died in (`where`) and says it was killed. */
static void killed_in_backward(double when, const char *where) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_desc sd;
    dsgd_simnet_fault f;
    dsgd_simnet *hub = NULL;
    dsgd_transport_i eps[SN_N];
    dsgd_strategy_desc d = deep_desc(4096, 1);
    dsgd_strategy *s;
    double c[SN_VARS];
    const char *msg = NULL;
    int i;
    backward_costs(c);
    memset(&sd, 0, sizeof(sd));
    memset(&f, 0, sizeof(f));
    f.kind = DSGD_SIMNET_FAULT_KILL;
    f.rank = 2;
    f.step = -1;
    f.time = when;
    sd.ranks = SN_N;
    sd.alpha_s = SN_ALPHA;
    sd.beta_s_per_byte = SN_BETA;
    sd.backward_s = c;
    sd.num_backward_s = SN_VARS;
    sd.faults = &f;
    sd.num_faults = 1;
    sd.park_between_calls = 1;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    for (i = 0; i < SN_N; ++i) TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &eps[i]));
    d.endpoints = eps;
    d.timeout_s = 1.0; /* virtual */
    s = make(ctx, &d);
    assert_int_not_equal(dsgd_strategy_train_step(s, g_x[0], g_y[0], SN_N * B, NULL), DSGD_OK);
    assert_true(dsgd_strategy_failed(s));
    assert_int_equal(dsgd_strategy_replica_result(s, 2, &msg), DSGD_ERR_ABORTED);
    if (!strstr(msg, where) || !strstr(msg, "this rank was killed"))
        fail_msg("killed at %g s: want \"%s\" and the kill in replica 2's message: %s", when, where, msg);
    print_message("    killed at %g us: %s\n", 1e6 * when, msg);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

/* At 4 KiB the communication lane all-reduces layer 2's four buckets from
   350 to about 702 us, then waits for layer 1's at 850 us: a kill at
   400 us hits the first all-reduce, one at 780 us the lane's advance to
   layer 1's ready time. A rank killed by time dies at that time in the
   same call in every run (simnet first takes what reaches it before the
   kill), so the call is asserted, in 3 runs each (make test-full; 1 in
   the quick tier). */
static void test_simnet_killed_in_backward(void **state) {
    int k;
    (void)state;
    tu_watchdog(60);
    for (k = 0; k < TU_PICK(3, 1); ++k) {
        killed_in_backward(400e-6, "dsgd_allreduce #1 ");
        killed_in_backward(780e-6, "communication lane could not advance");
    }
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- refused */

/* A transport with a clock of its own that is not simnet's (simnet's
   endpoints behind a wrapper that keeps the clock) cannot be run as two
   lanes: overlap is refused with DSGD_ERR_UNSUPPORTED and a message that
   says why. */
typedef struct clocked {
    dsgd_transport_i inner;
} clocked;

static dsgd_result k_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    clocked *c = (clocked *)impl;
    return c->inner.send(c->inner.impl, dst, tag, buf, bytes, deadline);
}

static dsgd_result k_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    clocked *c = (clocked *)impl;
    return c->inner.recv(c->inner.impl, src, tag, buf, bytes, deadline);
}

static double k_now(void *impl) {
    clocked *c = (clocked *)impl;
    return c->inner.now(c->inner.impl);
}

static void test_other_clock_refused(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_desc sd;
    dsgd_simnet *hub = NULL;
    dsgd_transport_i eps[2];
    clocked w[2];
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
    for (i = 0; i < 2; ++i) {
        TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &w[i].inner));
        memset(&eps[i], 0, sizeof(eps[i]));
        eps[i].name = "clocked";
        eps[i].impl = &w[i];
        eps[i].rank = i;
        eps[i].size = 2;
        eps[i].send = k_send;
        eps[i].recv = k_recv;
        eps[i].now = k_now;
    }
    d.endpoints = eps;
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    if (!strstr(dsgd_ctx_last_error(ctx), "'clocked', which keeps its own clock"))
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
        cmocka_unit_test(test_simnet_two_lanes),
        cmocka_unit_test(test_simnet_killed_in_backward),
        cmocka_unit_test(test_other_clock_refused),
    };
    return cmocka_run_group_tests_name("overlap", tests, setup, NULL);
}
