/* test_strategy_elastic.c - elastic synchronous training (strategy_elastic.h):
   the group shrinks past a replica that failed before the update.

   The model is a small MLP, 12 -> 10 tanh -> 4 (softmax cross-entropy),
   trained with Adam (whose state and step count must carry over).

   What is asserted:
   - MIRRORED, 8 replicas over the strategy's own loopback: replica 5's
     batch function fails at step 50 (make test: 5 of 8); that call
     returns DSGD_OK having shrunk to 7 (info.world 7, info.resized 1;
     on_resize called once with 8, 7 and the survivors 0,1,2,3,4,6,7),
     and after steps 50..59 every
     survivor holds the very bits of the scripted run: 8 replicas to step
     50, saved, restored into a 7-replica strategy, steps 50..59. Replica
     3 and 6 failing together at step 4 with min_replicas 2 (8 -> 6) match
     the same script with 6; so do 2 -> 1 (replica 0 failing, no
     communicator left) and 4 -> 3 with overlap (the scripts without).
   - MULTI_WORKER_MIRRORED, 2 workers x 2 replicas over one loopback hub
     (RING): global replica 1 fails at step 5, both workers shrink (3
     replicas in sync, 1 and 2 here, the survivors 0, 2, 3 renumbered
     0, 1, 2) and train steps 5..9 to the bits of a
     4-replica MIRRORED run saved at step 5 and restored into 3 replicas.
   - A global dsgd_sampler loop over an epoch in which replica 2 fails
     (its batch function; over simnet, its rank killed): every sample of
     the dataset is trained on exactly once (on_resize forgets the failed
     attempt's shards).
   - Over simnet (MIRRORED over the hub's endpoints, RING, threads
     jittered at every hand-off): rank 5 of 8 killed at step 50 (make
     test: 5 of 8; min_replicas 4); the survivors time out in the step's
     first collective, settle, shrink to 7 and retry: the failed
     step takes a 7-replica step, the spoiled attempt's compute and one
     deadline (to 1 ms) more in virtual time, and the weights after step
     59 are the bits of the script (8 to 50, saved, restored into 7,
     RING). A stall of 1.5 deadlines at step 4 (4 replicas) drops the
     stalled replica (warning naming it, 4 -> 3); one of 10 deadlines
     fails the step naming it, without a hang (links of 0 latency, so
     that the replicas' deadlines coincide). Two shrinks over one hub
     (rank 0, replica 0 on the strategy's thread, killed at step 3; ranks
     3 and 6 at once at step 7): 8 -> 7 -> 5 with the bits of the script
     8 -> 7 -> 5. A batch function's failure (4 -> 3, the dropped
     replica's rank leaves the hub), then a kill (3 -> 2). Over a
     loopback hub you give (real time, deadline 0.2 s), a batch function
     sleeping 0.3 s: its replica is dropped as late (4 -> 3). Below
     min_replicas (4 of 4, one killed):
     DSGD_ERR_ABORTED naming it and the survivors.
   - dsgd_step_info.dropped names each dropped replica (its rank as the
     step began) and why: failed (its batch function), gone (killed),
     late (stalled past the deadline).
   - Over simnet, rank 2 of 4 killed by time at 30 points through step
     0's collectives (every 10 us; make test: one point of each outcome),
     each twice with jittered threads: no
     hang, the same outcome both times, replica 2 dropped as gone (4 -> 3)
     or the step failed (killed in the exchange).
   - A death in the settle, by virtual time: 5 replicas over simnet, rank
     1 killed at its compute of step 3 and rank 3 killed by time 2.4 us
     before its deadline (while ranks 0 and 2 settle, rank 2 within one
     latency of the death) or 5 us after it (in its own settle). The
     endpoints are wrapped to force the threads into both orders (rank 3's
     thread says it is gone before, or after, the others start their
     settle), then run with jittered threads: the dropped list (1 and 3
     gone, 5 -> 3 in one shrink), every rank's clock, the trace bytes and
     the weights are the same in every run, and the weights are the
     script's (5 to step 3, saved, restored into 3). With min_replicas 4
     the death in the settle fails the step with DSGD_ERR_ABORTED naming
     replicas 1 and 3.
   - Rejoin over simnet: rank 1 of 8 killed at step 50 (8 -> 7), spare
     rank 8 (dsgd_simnet_spare: the settle does not wait for it) admitted
     at the group's clock and grown in at step 100 (7 -> 8), to step 150
     (make test: 14, 28 and 45):
     each sampler epoch (9 steps over 203 samples) trains every sample
     once, and the weights are the bits of 8 to step 50, saved, restored
     into 7, to step 100, saved, restored into 8, to step 150.
   - Seeded fault schedules over simnet (kill, stall, slow, drop; 40 under
     make test-full, 12 under make test, DSGD_FAULT_SCHEDULES=N and
     DSGD_FAULT_FIRST=K for the soak):
     every step against a model of the contract (result, world, the
     dropped list and reasons, or the failure's message naming the
     replica or the rank whose message was dropped), a watchdog per
     schedule.
   - Below min_replicas (4 replicas, min 3, replicas 1 and 2 failing at
     once): DSGD_ERR_ABORTED after grace_s (0.3 s, and well before the
     collectives' deadline) naming the survivors 0 and 3 and min_replicas
     3; the strategy has failed (DSGD_ERR_STATE next).
   - A class index out of range (a failure about the batch) does not
     shrink: DSGD_ERR_INVALID_ARGUMENT, the group stays whole and trains on.
   - Misuse: elastic with central_storage, a negative min_replicas or
     grace_s, min_replicas above the replicas: DSGD_ERR_INVALID_ARGUMENT.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>
#include <time.h>

enum { IN = 12, OUT = 4, MAXB = 16, NP = IN * 10 + 10 + 10 * OUT + OUT, GB = 48, NS = 8 };

static const dsgd_layer_desc LAYERS[2] = {{10, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

/* NS distinct global batches of GB samples; step t uses batch t % NS */
static float g_x[NS][GB * IN], g_y[NS][GB];

static int setup(void **state) {
    tu_rng r = tu_rng_make(42);
    int s, i;
    (void)state;
    for (s = 0; s < NS; ++s) {
        tu_fill(&r, g_x[s], (size_t)GB * IN, -1.0f, 1.0f);
        for (i = 0; i < GB; ++i) g_y[s][i] = (float)tu_below(&r, OUT);
    }
    return 0;
}

static int g_overlap; /* the elastic runs' overlap (not the scripts') */
static dsgd_allreduce_algo g_algo; /* every run's (AUTO but over simnet) */
static int g_count = GB; /* feed_fn's global batch, <= GB */

static dsgd_strategy_desc base_desc(dsgd_strategy_kind kind, int n) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = MAXB;
    d.model.seed = 7;
    d.optimizer.kind = DSGD_OPT_ADAM;
    d.optimizer.lr = 0.01f;
    d.timeout_s = 20.0;
    d.cpu_threads = 1;
    d.algorithm = g_algo;
    return d;
}

/* The batch function: replica g of W takes dsgd_block_range(GB, W, g) of
   step `step`'s global batch; replica fail_a or fail_b fails at fail_step
   while the group has fail_world replicas. */
typedef struct feed {
    int step;
    int fail_step, fail_world, fail_a, fail_b;
    int label_step, label_replica; /* a class index 99 there (-1: none) */
    float ybuf[GB];
} feed;

static dsgd_result feed_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    feed *f = (feed *)user;
    size_t off = 0, len = 0;
    const float *y = g_y[f->step % NS];
    if (f->step == f->fail_step && num_replicas == f->fail_world && (replica == f->fail_a || replica == f->fail_b))
        return DSGD_ERR_BACKEND;
    dsgd_block_range((size_t)g_count, num_replicas, replica, &off, &len);
    if (f->step == f->label_step && replica == f->label_replica && len > 0) {
        memcpy(f->ybuf + off, y + off, sizeof(float) * len);
        f->ybuf[off] = 99.0f;
        y = f->ybuf;
    }
    out->count = (int)len;
    out->x = g_x[f->step % NS] + off * IN;
    out->y = y + off;
    return DSGD_OK;
}

static feed no_failure(void) {
    feed f;
    memset(&f, 0, sizeof(f));
    f.fail_step = f.label_step = -1;
    f.fail_a = f.fail_b = f.label_replica = -1;
    return f;
}

typedef struct resize_log {
    int calls, old_world, new_world, survivors[DSGD_MAX_REPLICAS];
} resize_log;

static void on_resize(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s) {
    resize_log *l = (resize_log *)user;
    ++l->calls;
    l->old_world = old_world;
    l->new_world = new_world;
    memcpy(l->survivors, survivors, sizeof(int) * (size_t)new_world);
    (void)s;
}

static void params_of(dsgd_strategy *s, int replica, float *p) {
    assert_int_equal(dsgd_model_get_params(dsgd_strategy_model(s, replica), p, NP), DSGD_OK);
}

/* The script: n replicas to step k, saved, restored into m, to step end. */
static void scripted(dsgd_ctx *ctx, int n, int k, int m, int end, float *out) {
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, n);
    dsgd_strategy *s;
    feed f = no_failure();
    char dir[64], path[128];
    tu_mkdtemp(dir);
    snprintf(path, sizeof(path), "%s/ck", dir);
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (f.step = 0; f.step < k; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
    TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
    dsgd_strategy_destroy(s);
    d.num_replicas = m;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
    for (; f.step < end; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
    params_of(s, 0, out);
    dsgd_strategy_destroy(s);
    tu_rmdir(dir);
}

/* n replicas, fail_a (and fail_b) fail at step k; end steps in all. */
static void shrink_case(int n, int k, int fail_a, int fail_b, int min_replicas, int end) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, n);
    dsgd_strategy *s;
    dsgd_step_info info;
    resize_log log;
    feed f = no_failure();
    float want[NP], got[NP];
    int i, j, m = n - 1 - (fail_b >= 0);
    memset(&log, 0, sizeof(log));
    d.elastic.min_replicas = min_replicas;
    d.overlap = g_overlap;
    d.bucket_bytes = g_overlap ? 256 : 0;
    d.elastic.on_resize = on_resize;
    d.elastic.user = &log;
    f.fail_step = k;
    f.fail_world = n;
    f.fail_a = fail_a;
    f.fail_b = fail_b;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (f.step = 0; f.step < end; ++f.step) {
        memset(&info, 0, sizeof(info));
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, &info));
        assert_int_equal(info.resized, f.step == k);
        assert_int_equal(info.world, f.step < k ? n : m);
        assert_int_equal(info.dropped, f.step == k ? n - m : 0);
        if (f.step == k) { /* their batch functions failed: in rank order */
            assert_int_equal(info.dropped_rank[0], fail_b >= 0 && fail_b < fail_a ? fail_b : fail_a);
            assert_int_equal(info.dropped_why[0], DSGD_DROP_FAILED);
            if (fail_b >= 0) assert_int_equal(info.dropped_rank[1], fail_b > fail_a ? fail_b : fail_a);
        }
        assert_int_equal(info.count, g_count);
        assert_int_equal(info.step, f.step);
    }
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.old_world, n);
    assert_int_equal(log.new_world, m);
    for (i = 0, j = 0; i < n; ++i) /* the survivors, in their old order */
        if (i != fail_a && i != fail_b) assert_int_equal(log.survivors[j++], i);
    assert_int_equal(j, m);
    assert_int_equal(dsgd_strategy_num_replicas(s), m);
    assert_int_equal(dsgd_strategy_num_replicas_in_sync(s), m);
    assert_false(dsgd_strategy_failed(s));
    tu_assert_replicas_identical(ctx, s);
    params_of(s, 0, got);
    dsgd_strategy_destroy(s);
    scripted(ctx, n, k, m, end, want);
    assert_memory_equal(got, want, sizeof(want));
    dsgd_ctx_destroy(ctx);
}

static void test_shrink_8_to_7_bitwise(void **state) {
    (void)state;
    tu_watchdog(120);
    /* the quick tier fails at step 5 of 8 (Adam's state and step count
       carried over all the same); make test-full at step 50 of 60 */
    shrink_case(8, TU_PICK(50, 5), 5, -1, 4, TU_PICK(60, 8));
    tu_watchdog(0);
}

static void test_two_fail_at_once(void **state) {
    (void)state;
    tu_watchdog(60);
    shrink_case(8, 4, 3, 6, 2, 8);
    tu_watchdog(0);
}

/* Replica 0 (the one on the strategy's thread) fails: 2 -> 1, no
   communicator left; and 4 -> 3 with the exchange beside backward
   (overlap's threads torn down and made again). */
static void test_small_groups(void **state) {
    (void)state;
    tu_watchdog(60);
    g_count = 16; /* one replica's max_batch */
    shrink_case(2, 2, 0, -1, 1, 5);
    g_count = GB;
    g_overlap = 1;
    shrink_case(4, 3, 1, -1, 2, 7);
    g_overlap = 0;
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- workers */

enum { WK = 2, WN = 2, WSTEPS = 10, WFAIL = 5 };

typedef struct worker {
    dsgd_transport_i eps[WN];
    int index;
    feed f;
    resize_log log;
    dsgd_result res[WSTEPS];
    int world[WSTEPS], resized[WSTEPS], n_after;
    float params[WN][NP];
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    dsgd_ctx *ctx = NULL;
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, WN);
    dsgd_strategy *s = NULL;
    int i;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return NULL;
    d.endpoints = w->eps;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.elastic.min_replicas = 2;
    d.elastic.on_resize = on_resize;
    d.elastic.user = &w->log;
    if (dsgd_strategy_create(ctx, &d, &s) == DSGD_OK) {
        for (w->f.step = 0; w->f.step < WSTEPS; ++w->f.step) {
            dsgd_step_info info;
            memset(&info, 0, sizeof(info));
            w->res[w->f.step] = dsgd_strategy_train_step_fn(s, feed_fn, &w->f, &info);
            w->world[w->f.step] = info.world;
            w->resized[w->f.step] = info.resized;
        }
        w->n_after = dsgd_strategy_num_replicas(s);
        for (i = 0; i < w->n_after; ++i) dsgd_model_get_params(dsgd_strategy_model(s, i), w->params[i], NP);
    } else {
        w->res[0] = DSGD_ERR_STATE;
    }
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

static void test_multi_worker_shrink(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub;
    worker w[WK];
    pthread_t th[WK];
    float want[NP];
    int i, k, r;
    (void)state;
    tu_watchdog(60);
    TU_OK(ctx, dsgd_loopback_create(ctx, WK * WN, &hub));
    memset(w, 0, sizeof(w));
    for (i = 0; i < WK; ++i) {
        w[i].index = i;
        w[i].f = no_failure();
        w[i].f.fail_step = WFAIL;
        w[i].f.fail_world = WK * WN;
        w[i].f.fail_a = 1;
        for (r = 0; r < WN; ++r) TU_OK(ctx, dsgd_loopback_endpoint(hub, i * WN + r, &w[i].eps[r]));
    }
    for (i = 0; i < WK; ++i) assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    for (i = 0; i < WK; ++i) pthread_join(th[i], NULL);
    {   /* the script over MIRRORED with RING */
        dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 4);
        dsgd_strategy *s;
        feed f = no_failure();
        char dir[64], path[128];
        tu_mkdtemp(dir);
        snprintf(path, sizeof(path), "%s/ck", dir);
        d.algorithm = DSGD_ALLREDUCE_RING;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        for (f.step = 0; f.step < WFAIL; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
        TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
        dsgd_strategy_destroy(s);
        d.num_replicas = 3;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
        for (; f.step < WSTEPS; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
        params_of(s, 0, want);
        dsgd_strategy_destroy(s);
        tu_rmdir(dir);
    }
    for (i = 0; i < WK; ++i) {
        for (k = 0; k < WSTEPS; ++k) {
            if (w[i].res[k] != DSGD_OK) fail_msg("worker %d step %d: %s", i, k, dsgd_result_string(w[i].res[k]));
            assert_int_equal(w[i].world[k], k < WFAIL ? 4 : 3);
            assert_int_equal(w[i].resized[k], k == WFAIL);
        }
        assert_int_equal(w[i].log.calls, 1);
        assert_int_equal(w[i].log.new_world, 3);
        assert_int_equal(w[i].log.survivors[0], 0);
        assert_int_equal(w[i].log.survivors[1], 2);
        assert_int_equal(w[i].log.survivors[2], 3);
        assert_int_equal(w[i].n_after, i == 0 ? 1 : 2);
        for (r = 0; r < w[i].n_after; ++r) assert_memory_equal(w[i].params[r], want, sizeof(want));
    }
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- the sampler */

static dsgd_simnet *sn_hub(dsgd_ctx *ctx, int ranks, const dsgd_simnet_fault *faults, int nf);
static double g_alpha = 1e-5; /* the hubs' latency */
static double g_jitter;       /* their test_jitter_s */
static int g_trace;           /* their trace */
#define SN_T 0.5

enum { DS = 203, SB = 24 };

typedef struct epoch_feed {
    const size_t *idx;
    int count, step, fail_step;
    float x[SB * IN], y[SB];
    int hits[DS]; /* this step's samples, by index */
    dsgd_simnet *hub; /* over simnet: each step's compute, charged to */
    int rank_of[4];   /* replica -> rank */
} epoch_feed;

static dsgd_result epoch_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    epoch_feed *e = (epoch_feed *)user;
    size_t off = 0, len = 0, i;
    dsgd_result r = e->hub ? dsgd_simnet_compute(e->hub, e->rank_of[replica], e->step) : DSGD_OK;
    if (r != DSGD_OK) return r;
    if (e->step == e->fail_step && num_replicas == 4 && replica == 2) return DSGD_ERR_SYSTEM;
    dsgd_block_range((size_t)e->count, num_replicas, replica, &off, &len);
    for (i = off; i < off + len; ++i) ++e->hits[e->idx[i]]; /* disjoint per replica */
    out->count = (int)len;
    out->x = e->x + off * IN;
    out->y = e->y + off;
    return DSGD_OK;
}

static void forget_attempt(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s) {
    epoch_feed *e = (epoch_feed *)user;
    int i;
    (void)old_world; (void)s;
    for (i = 0; i < new_world; ++i) e->rank_of[i] = e->rank_of[survivors[i]];
    memset(e->hits, 0, sizeof(e->hits)); /* the step is retried */
}

/* Replica 2 of 4 fails at step 3 of the epoch: its batch function
   (simnet 0), or its rank is killed (simnet 1). */
static void sampler_epoch(int simnet) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 4);
    dsgd_strategy *s;
    dsgd_sampler smp;
    dsgd_simnet_fault kill;
    dsgd_transport_i ep[4];
    static epoch_feed e;
    static float dx[DS * IN], dy[DS];
    int total[DS], i, resized = 0;
    size_t k, j;
    tu_rng r = tu_rng_make(5);
    tu_fill(&r, dx, (size_t)DS * IN, -1.0f, 1.0f);
    for (i = 0; i < DS; ++i) dy[i] = (float)tu_below(&r, OUT);
    memset(&e, 0, sizeof(e));
    memset(total, 0, sizeof(total));
    for (i = 0; i < 4; ++i) e.rank_of[i] = i;
    e.fail_step = simnet ? -1 : 3;
    if (simnet) {
        memset(&kill, 0, sizeof(kill));
        kill.kind = DSGD_SIMNET_FAULT_KILL;
        kill.rank = 2;
        kill.step = 3;
        e.hub = sn_hub(ctx, 4, &kill, 1);
        for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_simnet_endpoint(e.hub, i, &ep[i]));
        d.endpoints = ep;
        d.gradient_path = DSGD_GRADIENTS_HOST;
        d.timeout_s = SN_T;
    }
    d.elastic.min_replicas = 2;
    d.elastic.on_resize = forget_attempt;
    d.elastic.user = &e;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    TU_OK(ctx, dsgd_sampler_init(ctx, &smp, DS, SB, 11, 1, 0));
    while ((k = dsgd_sampler_next(&smp, &e.idx)) > 0) {
        dsgd_step_info info;
        for (j = 0; j < k; ++j) {
            memcpy(e.x + j * IN, dx + e.idx[j] * IN, sizeof(float) * IN);
            e.y[j] = dy[e.idx[j]];
        }
        e.count = (int)k;
        memset(e.hits, 0, sizeof(e.hits));
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, epoch_fn, &e, &info));
        assert_int_equal(info.count, (int)k);
        resized += info.resized;
        for (i = 0; i < DS; ++i) total[i] += e.hits[i];
        ++e.step;
    }
    assert_int_equal(resized, 1);
    assert_int_equal(dsgd_strategy_num_replicas(s), 3);
    for (i = 0; i < DS; ++i)
        if (total[i] != 1) fail_msg("sample %d was trained on %d times in the epoch", i, total[i]);
    dsgd_sampler_free(&smp);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(e.hub);
    dsgd_ctx_destroy(ctx);
}

static void test_sampler_epoch(void **state) {
    (void)state;
    tu_watchdog(60);
    sampler_epoch(0);
    sampler_epoch(1);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- simnet */

/* The simulated cluster: compute SN_C s a step, deadline SN_T (virtual
   seconds). */
#define SN_C 0.01

static dsgd_simnet *sn_hub(dsgd_ctx *ctx, int ranks, const dsgd_simnet_fault *faults, int nf) {
    dsgd_simnet_desc sd;
    dsgd_simnet *hub;
    memset(&sd, 0, sizeof(sd));
    sd.ranks = ranks;
    sd.alpha_s = g_alpha;
    sd.test_jitter_s = g_jitter;
    sd.trace = g_trace;
    sd.beta_s_per_byte = 1e-9;
    sd.park_between_calls = 1;
    sd.compute.kind = DSGD_SIMNET_COMPUTE_CONSTANT;
    sd.compute.mean_s = SN_C;
    sd.faults = faults;
    sd.num_faults = nf;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    return hub;
}

/* The batch function over simnet: the step's compute charged to the
   replica's rank of the hub (rank_of follows the shrinks), then feed_fn. */
typedef struct sn_feed {
    dsgd_simnet *hub;
    feed f;
    int rank_of[DSGD_MAX_REPLICAS];
    resize_log log;
} sn_feed;

static dsgd_result sn_feed_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    sn_feed *sf = (sn_feed *)user;
    dsgd_result r = dsgd_simnet_compute(sf->hub, sf->rank_of[replica], sf->f.step);
    return r != DSGD_OK ? r : feed_fn(&sf->f, replica, num_replicas, out);
}

static void sn_resize(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s) {
    sn_feed *sf = (sn_feed *)user;
    int map[DSGD_MAX_REPLICAS], i;
    for (i = 0; i < new_world; ++i) map[i] = sf->rank_of[survivors[i]];
    memcpy(sf->rank_of, map, sizeof(int) * (size_t)new_world);
    on_resize(&sf->log, old_world, new_world, survivors, s);
}

/* The latest clock of the replicas' ranks (every rank parked between
   steps). */
static double sn_time(const sn_feed *sf, int n) {
    double t = 0.0;
    int i;
    for (i = 0; i < n; ++i)
        if (dsgd_simnet_time(sf->hub, sf->rank_of[i]) > t) t = dsgd_simnet_time(sf->hub, sf->rank_of[i]);
    return t;
}

/* MIRRORED over a simnet hub of n ranks with the faults; min_replicas m;
   steps 0..end-1, the strategy kept in *out (sf->hub in *hub). */
static dsgd_strategy *sn_strategy(dsgd_ctx *ctx, int n, int m, sn_feed *sf, const dsgd_simnet_fault *faults, int nf) {
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, n);
    dsgd_transport_i ep[DSGD_MAX_REPLICAS];
    dsgd_strategy *s;
    int i;
    memset(sf, 0, sizeof(*sf));
    sf->f = no_failure();
    sf->hub = sn_hub(ctx, n, faults, nf);
    for (i = 0; i < n; ++i) {
        TU_OK(ctx, dsgd_simnet_endpoint(sf->hub, i, &ep[i]));
        sf->rank_of[i] = i;
    }
    d.endpoints = ep;
    d.gradient_path = DSGD_GRADIENTS_HOST;
    d.timeout_s = SN_T;
    d.elastic.min_replicas = m;
    d.elastic.on_resize = sn_resize;
    d.elastic.user = sf;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    return s;
}

/* The case: rank 5 of 8 killed at step SK (its compute); the
   survivors time out in the step's first collective, settle, shrink to 7
   and retry the step, losing one deadline and the spoiled attempt's
   compute; the weights are those of 8 replicas to SK, saved, restored into
   7 (the same RING). The quick tier kills at step 5 of 8 (a step before
   and after the kill to time, the same path); make test-full at 50 of 60. */
enum { SK = 50, SEND = 60 };

static void test_simnet_kill_8_to_7(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_fault kill;
    static sn_feed sf;
    dsgd_strategy *s;
    dsgd_step_info info;
    float want[NP], got[NP];
    double t0, dt[SEND];
    const int sk = TU_PICK(SK, 5), send = TU_PICK(SEND, 8);
    int i, j;
    (void)state;
    tu_watchdog(120);
    g_algo = DSGD_ALLREDUCE_RING;
    g_jitter = 2e-5; /* threads sleeping at random around each hand-off: the same times and bits */
    memset(&kill, 0, sizeof(kill));
    kill.kind = DSGD_SIMNET_FAULT_KILL;
    kill.rank = 5;
    kill.step = sk;
    s = sn_strategy(ctx, 8, 4, &sf, &kill, 1);
    g_jitter = 0.0;
    for (sf.f.step = 0; sf.f.step < send; ++sf.f.step) {
        t0 = sn_time(&sf, dsgd_strategy_num_replicas(s));
        memset(&info, 0, sizeof(info));
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, &info));
        dt[sf.f.step] = sn_time(&sf, dsgd_strategy_num_replicas(s)) - t0;
        assert_int_equal(info.resized, sf.f.step == sk);
        assert_int_equal(info.world, sf.f.step < sk ? 8 : 7);
        assert_int_equal(info.step, sf.f.step);
        assert_int_equal(info.dropped, sf.f.step == sk);
        if (sf.f.step == sk) { /* its rank was killed: gone */
            assert_int_equal(info.dropped_rank[0], 5);
            assert_int_equal(info.dropped_why[0], DSGD_DROP_GONE);
        }
    }
    print_message("    simnet: a step takes %.6f s (8 replicas), %.6f s (7); the failed one %.6f s (deadline %.2f s)\n",
                  dt[sk - 1], dt[sk + 1], dt[sk], SN_T);
    /* within one deadline: the failed step is a 7-replica step, the
       spoiled attempt's compute and at most one timeout_s (and the
       settle's few messages) more */
    assert_true(dt[sk] - dt[sk + 1] - SN_C >= SN_T);
    assert_true(dt[sk] - dt[sk + 1] - SN_C <= SN_T + 1e-3);
    assert_int_equal(sf.log.calls, 1);
    assert_int_equal(sf.log.new_world, 7);
    for (i = 0, j = 0; i < 8; ++i)
        if (i != 5) assert_int_equal(sf.log.survivors[j++], i);
    assert_false(dsgd_strategy_failed(s));
    tu_assert_replicas_identical(ctx, s);
    params_of(s, 0, got);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    scripted(ctx, 8, sk, 7, send, want);
    assert_memory_equal(got, want, sizeof(want));
    g_algo = DSGD_ALLREDUCE_AUTO;
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Rank 2 of 4 killed by time (a simnet KILL with step -1) at SN_C + k x
   10 us, k = 0..29 (every 30 us under TSan): inside step 0's collectives,
   in a wait for another rank. Each time twice, the threads jittered: no
   hang (the gone replica leaves the transport in its settle, so the
   others' deadlines are not held back by its death), the same outcome
   both times (the step's result, world, dropped list, the failure's
   message, and the group's clock after a step that succeeded: the death
   falls where the virtual times say), and each outcome is a shrink to 3
   dropping replica 2 as gone (in step 0, or in step 1 where the kill
   comes after step 0's last wait) or a failed strategy (a kill in the
   exchange, after the agreement); some kill shrinks. */
static void kill_in_coll_once(double when, char *out, size_t cap) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_fault kill;
    static sn_feed sf;
    dsgd_strategy *s;
    dsgd_step_info info;
    size_t len = 0;
    int world = 4;
    memset(&kill, 0, sizeof(kill));
    kill.kind = DSGD_SIMNET_FAULT_KILL;
    kill.rank = 2;
    kill.step = -1;
    kill.time = when;
    g_algo = DSGD_ALLREDUCE_RING;
    g_jitter = 2e-5;
    s = sn_strategy(ctx, 4, 2, &sf, &kill, 1);
    g_jitter = 0.0;
    out[0] = '\0';
    for (sf.f.step = 0; sf.f.step < 3 && len < cap; ++sf.f.step) {
        dsgd_result r;
        memset(&info, 0, sizeof(info));
        r = dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, &info);
        len += (size_t)snprintf(out + len, cap - len, "[%d %s w%d d%d", (int)sf.f.step, dsgd_result_string(r), info.world,
                                info.dropped);
        if (info.dropped == 1 && len < cap)
            len += (size_t)snprintf(out + len, cap - len, " %d %s", info.dropped_rank[0],
                                    dsgd_drop_reason_name(info.dropped_why[0]));
        if (len < cap) /* the clock: a failure aborts the transport, which stops the others wherever they are */
            len += r == DSGD_OK ? (size_t)snprintf(out + len, cap - len, " t %.9g]", sn_time(&sf, info.world))
                                : (size_t)snprintf(out + len, cap - len, "]");
        if (r != DSGD_OK) {
            assert_true(dsgd_strategy_failed(s));
            if (len < cap) len += (size_t)snprintf(out + len, cap - len, " %s", dsgd_ctx_last_error(ctx));
            break;
        }
        if (info.dropped ? info.dropped != 1 || info.world != 3 || world != 4 || info.dropped_rank[0] != 2 ||
                               info.dropped_why[0] != DSGD_DROP_GONE
                         : info.world != world)
            fail_msg("killed at %.9g s: want replica 2 dropped as gone once (4 -> 3): %s", when, out);
        world = info.world;
    }
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    g_algo = DSGD_ALLREDUCE_AUTO;
    dsgd_ctx_destroy(ctx);
}

/* The quick tier's points: one of each outcome the sweep gives (replica 2
   gone in step 0 at k 0..2 and, later in the ring, 3..6; the step failed
   as ranks disagree at 7, on a deadline at 8, killed in the exchange at
   9..15; gone in step 1 from 16 on); under TSan, where make test-full
   runs every third point, those of them it runs. make test-full runs
   every point. */
static const int KC_QUICK[] = {0, 3, 7, 8, 9, 16, 29}, KC_QUICK_TSAN[] = {0, 3, 9, 18};

static void test_simnet_killed_in_collective(void **state) {
    static char a[2048], b[2048];
    char hang[64];
    const int *quick = TU_TSAN ? KC_QUICK_TSAN : KC_QUICK;
    const int nquick = TU_TSAN ? (int)(sizeof(KC_QUICK_TSAN) / sizeof(int)) : (int)(sizeof(KC_QUICK) / sizeof(int));
    int i, shrinks = 0, failures = 0;
    (void)state;
    for (i = 0; i < TU_PICK(TU_TSAN ? 10 : 30, nquick); ++i) {
        int k = tu_full() ? i * (TU_TSAN ? 3 : 1) : quick[i];
        double when = SN_C + k * 10e-6;
        snprintf(hang, sizeof(hang), "rank 2 killed at %.9g s", when);
        tu_watchdog_for(hang, 60);
        kill_in_coll_once(when, a, sizeof(a));
        kill_in_coll_once(when, b, sizeof(b));
        if (strcmp(a, b)) fail_msg("killed at %.9g s, two runs:\n  %s\n  %s", when, a, b);
        if (strstr(a, " 2 gone")) ++shrinks;
        else ++failures;
    }
    tu_watchdog(0);
    assert_true(shrinks > 0);
    print_message("    rank 2 killed in step 0's collectives: %d times gone and dropped (4 -> 3), %d times the step "
                  "failed, each the same twice\n", shrinks, failures);
}

/* A death in the settle, decided by virtual time. Five replicas over
   simnet (RING, trace on): rank 1 killed at its compute of step 3, rank 3
   killed by time in that step 2.4 us before or 5 us after its own
   deadline (its clock after that compute, from a run without the second
   kill, plus SN_T). At -2.4 us rank 3 dies in its collective after ranks
   0 and 2 timed out and while they settle (rank 2 within one latency of
   the death, and rank 4, whose collective fails on rank 2's mark, after
   it: whether rank 3's thread has said that it is gone when they start
   their settle was a race of the threads); at +5 us it dies in its own
   settle. The replicas' endpoints are wrapped (ds_ep) to force the
   threads' order: DS_GONE_FIRST holds each rank whose collective fails
   within one latency of the death (or later) until rank 3's thread has
   left the transport; DS_GONE_LAST holds rank 3's thread, once a call
   of its failed with DSGD_ERR_ABORTED (killed), until ranks 0, 2 and 4
   have each called again after their collective failed. Each run
   asserts that it forced the order it was told. */
enum { DS_N = 5, DS_STEP = 3, DS_END = 6, DS_VICTIM = 3 };
enum { DS_FREE = 0, DS_GONE_FIRST, DS_GONE_LAST };

typedef struct ds_hub ds_hub;
typedef struct ds_ep {
    dsgd_transport_i base; /* the simnet endpoint */
    ds_hub *hub;
    int rank;
} ds_ep;
struct ds_hub {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int mode;
    double from;              /* DS_GONE_FIRST: a failure at or after this clock waits */
    int left;                 /* the victim's thread left the transport */
    int killed;               /* a call of the victim's failed with DSGD_ERR_ABORTED */
    int failed[DS_N], after[DS_N];
    int held, forced;         /* waits begun, and ended by their condition (not by the 5 s cap) */
    ds_ep ep[DS_N];
};

/* Waits (mu held) until done(h), at most 5 s of real time. */
static void ds_hold(ds_hub *h, int (*done)(const ds_hub *)) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    ++h->held;
    while (!done(h))
        if (pthread_cond_timedwait(&h->cv, &h->mu, &until) != 0) return;
    ++h->forced;
}
static int ds_victim_left(const ds_hub *h) { return h->left; }
static int ds_others_went_on(const ds_hub *h) { return h->after[0] && h->after[2] && h->after[4]; }

static void ds_before(ds_ep *e) {
    ds_hub *h = e->hub;
    pthread_mutex_lock(&h->mu);
    if (h->failed[e->rank] && !h->after[e->rank]) {
        h->after[e->rank] = 1;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
}

static dsgd_result ds_after(ds_ep *e, dsgd_result r) {
    ds_hub *h = e->hub;
    double t = e->base.now(e->base.impl);
    if (r == DSGD_OK) return r;
    pthread_mutex_lock(&h->mu);
    if (!h->failed[e->rank]) {
        h->failed[e->rank] = 1;
        if (h->mode == DS_GONE_FIRST && e->rank != DS_VICTIM && t >= h->from) ds_hold(h, ds_victim_left);
    }
    if (e->rank == DS_VICTIM && r == DSGD_ERR_ABORTED && !h->killed) {
        h->killed = 1;
        if (h->mode == DS_GONE_LAST) ds_hold(h, ds_others_went_on);
    }
    pthread_mutex_unlock(&h->mu);
    return r;
}

#define DS_SELF ((ds_ep *)impl)
#define DS_B (DS_SELF->base)
static dsgd_result ds_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    ds_before(DS_SELF);
    return ds_after(DS_SELF, DS_B.send(DS_B.impl, dst, tag, buf, bytes, deadline));
}
static dsgd_result ds_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    ds_before(DS_SELF);
    return ds_after(DS_SELF, DS_B.recv(DS_B.impl, src, tag, buf, bytes, deadline));
}
static dsgd_result ds_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                               uint64_t rtag, void *rbuf, size_t rbytes, double deadline, int *failed_peer) {
    ds_before(DS_SELF);
    return ds_after(DS_SELF, DS_B.sendrecv(DS_B.impl, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, deadline,
                                           failed_peer));
}
static dsgd_result ds_sendrecv_reduce(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                      uint64_t rtag, float *rbuf, size_t rcount, dsgd_reduce_op op, double deadline,
                                      int *failed_peer) {
    ds_before(DS_SELF);
    return ds_after(DS_SELF, DS_B.sendrecv_reduce(DS_B.impl, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcount, op,
                                                  deadline, failed_peer));
}
static dsgd_result ds_probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    ds_before(DS_SELF);
    return ds_after(DS_SELF, DS_B.probe(DS_B.impl, deadline, src, tag, bytes));
}
static dsgd_result ds_probe_from(void *impl, int src, double deadline, uint64_t *tag, size_t *bytes, int *gone) {
    ds_before(DS_SELF);
    return ds_after(DS_SELF, DS_B.probe_from(DS_B.impl, src, deadline, tag, bytes, gone));
}
static void ds_leave(void *impl) {
    ds_hub *h = DS_SELF->hub;
    ds_before(DS_SELF);
    DS_B.leave(DS_B.impl);
    pthread_mutex_lock(&h->mu);
    if (DS_SELF->rank == DS_VICTIM) h->left = 1;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}
static void ds_abort(void *impl) { DS_B.abort(DS_B.impl); }
static double ds_now(void *impl) { return DS_B.now(DS_B.impl); }
static const char *ds_error_message(void *impl) { return DS_B.error_message(DS_B.impl); }
static void ds_set_progress(void *impl, uint64_t seq) { DS_B.set_progress(DS_B.impl, seq); }
static uint64_t ds_peer_progress(void *impl, int peer) { return DS_B.peer_progress(DS_B.impl, peer); }
static dsgd_result ds_charge_apply(void *impl, size_t floats) { return DS_B.charge_apply(DS_B.impl, floats); }
static dsgd_result ds_charge_codec(void *impl, size_t floats) { return DS_B.charge_codec(DS_B.impl, floats); }

/* e's endpoint as the strategy sees it: every member of simnet's, through e. */
static void ds_endpoint(ds_ep *e, dsgd_transport_i *out) {
    const dsgd_transport_i *b = &e->base;
    memset(out, 0, sizeof(*out));
    out->name = "forced";
    out->impl = e;
    out->rank = b->rank;
    out->size = b->size;
    out->send = ds_send;
    out->recv = ds_recv;
    out->sendrecv = b->sendrecv ? ds_sendrecv : NULL;
    out->sendrecv_reduce = b->sendrecv_reduce ? ds_sendrecv_reduce : NULL;
    out->probe = b->probe ? ds_probe : NULL;
    out->probe_from = b->probe_from ? ds_probe_from : NULL;
    out->leave = b->leave ? ds_leave : NULL;
    out->abort = b->abort ? ds_abort : NULL;
    out->now = b->now ? ds_now : NULL;
    out->error_message = b->error_message ? ds_error_message : NULL;
    out->set_progress = b->set_progress ? ds_set_progress : NULL;
    out->peer_progress = b->peer_progress ? ds_peer_progress : NULL;
    out->charge_apply = b->charge_apply ? ds_charge_apply : NULL;
    out->charge_codec = b->charge_codec ? ds_charge_codec : NULL;
}

/* The batch function: sn_feed_fn, and the victim's clock after its first
   compute of DS_STEP (it enters the step's first collective then). */
static double g_ds_entered = -1.0;
static dsgd_result ds_feed_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    sn_feed *sf = (sn_feed *)user;
    int rank = sf->rank_of[replica];
    dsgd_result r = dsgd_simnet_compute(sf->hub, rank, sf->f.step);
    if (r != DSGD_OK) return r;
    if (rank == DS_VICTIM && sf->f.step == DS_STEP && g_ds_entered < 0) g_ds_entered = dsgd_simnet_time(sf->hub, rank);
    return feed_fn(&sf->f, replica, num_replicas, out);
}

/* One run: steps 0..DS_END-1, rank 3 killed at `when` (< 0: not), min_replicas
   m. Fills out (the dropped list, each rank's final clock, the weights;
   for a failed step its message) and *trace (the trace's bytes, malloc'd). */
typedef struct ds_run {
    char text[1024];
    float w[NP];
    double t0; /* rank 0's final clock */
    int forced, held;
} ds_run;

static void ds_once(double when, int mode, int m, ds_run *out, char **trace, size_t *trace_len) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_fault f[2];
    static sn_feed sf;
    static ds_hub h;
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, DS_N);
    dsgd_transport_i ep[DS_N];
    dsgd_strategy *s;
    dsgd_step_info info;
    size_t len = 0;
    FILE *fp;
    int i, k;
    memset(f, 0, sizeof(f));
    f[0].kind = f[1].kind = DSGD_SIMNET_FAULT_KILL;
    f[0].rank = 1;
    f[0].step = DS_STEP;
    f[1].rank = DS_VICTIM;
    f[1].step = -1;
    f[1].time = when;
    memset(&h, 0, sizeof(h));
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    h.mode = mode;
    h.from = when - g_alpha;
    memset(&sf, 0, sizeof(sf));
    sf.f = no_failure();
    g_trace = 1;
    sf.hub = sn_hub(ctx, DS_N, f, when < 0 ? 1 : 2);
    g_trace = 0;
    for (i = 0; i < DS_N; ++i) {
        TU_OK(ctx, dsgd_simnet_endpoint(sf.hub, i, &h.ep[i].base));
        h.ep[i].hub = &h;
        h.ep[i].rank = i;
        ds_endpoint(&h.ep[i], &ep[i]);
        sf.rank_of[i] = i;
    }
    d.endpoints = ep;
    d.gradient_path = DSGD_GRADIENTS_HOST;
    d.timeout_s = SN_T;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.elastic.min_replicas = m;
    d.elastic.on_resize = sn_resize;
    d.elastic.user = &sf;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    out->text[0] = '\0';
    for (sf.f.step = 0; sf.f.step < DS_END; ++sf.f.step) {
        dsgd_result r;
        memset(&info, 0, sizeof(info));
        r = dsgd_strategy_train_step_fn(s, ds_feed_fn, &sf, &info);
        for (k = 0; k < info.dropped && len < sizeof(out->text); ++k)
            len += (size_t)snprintf(out->text + len, sizeof(out->text) - len, "step %d: %d %s (world %d); ",
                                    (int)sf.f.step, info.dropped_rank[k], dsgd_drop_reason_name(info.dropped_why[k]),
                                    info.world);
        if (r != DSGD_OK) {
            if (len < sizeof(out->text))
                len += (size_t)snprintf(out->text + len, sizeof(out->text) - len, "step %d: %s: %s", (int)sf.f.step,
                                        dsgd_result_string(r), dsgd_ctx_last_error(ctx));
            break;
        }
    }
    for (i = 0; i < DS_N && len < sizeof(out->text); ++i) /* the clocks: every rank's, the dead ones' too */
        len += (size_t)snprintf(out->text + len, sizeof(out->text) - len, "%s%.9f", i ? " " : "| clocks ",
                                dsgd_simnet_time(sf.hub, i));
    out->t0 = dsgd_simnet_time(sf.hub, 0);
    memset(out->w, 0, sizeof(out->w));
    if (!dsgd_strategy_failed(s)) {
        tu_assert_replicas_identical(ctx, s);
        params_of(s, 0, out->w);
    }
    dsgd_strategy_destroy(s);
    *trace = NULL;
    *trace_len = 0;
    assert_non_null(fp = open_memstream(trace, trace_len));
    TU_OK(ctx, dsgd_simnet_write_trace(sf.hub, fp));
    fclose(fp);
    dsgd_simnet_destroy(sf.hub);
    out->forced = h.forced;
    out->held = h.held;
    pthread_cond_destroy(&h.cv);
    pthread_mutex_destroy(&h.mu);
    dsgd_ctx_destroy(ctx);
}

/* The victim's deadline in step DS_STEP: its clock entering the step's
   first collective (a run without its kill) plus SN_T; *t0: rank 0's
   final clock in that run. */
static double ds_deadline(double *t0) {
    static ds_run r;
    char *trace;
    size_t len;
    g_ds_entered = -1.0;
    ds_once(-1.0, DS_FREE, 2, &r, &trace, &len);
    free(trace);
    *t0 = r.t0;
    return g_ds_entered + SN_T;
}

/* The second death costs no deadline: rank 0 ends within 0.1 ms of the run
   where only rank 1 dies (5 -> 4). */
static void ds_no_extra_deadline(const ds_run *r, double t0) {
    if (!(r->t0 <= t0 + 1e-4))
        fail_msg("rank 0 ends at %.9f s, %.6f s after the run without the second death (%.9f s)", r->t0, r->t0 - t0,
                 t0);
}

/* Runs (the two forced orders, then jittered threads), each compared with
   the first (into *first): the dropped list (or the failure), every
   rank's clock, the trace's bytes and the weights. */
static void ds_compare(double when, int m, int jittered, ds_run *first) {
    static ds_run r;
    static const int modes[2] = {DS_GONE_FIRST, DS_GONE_LAST};
    char *t0 = NULL, *t = NULL;
    size_t n0 = 0, n = 0;
    int i;
    for (i = 0; i < 2 + jittered; ++i) {
        ds_run *cur = i == 0 ? first : &r;
        g_jitter = i < 2 ? 0.0 : 2e-5;
        ds_once(when, i < 2 ? modes[i] : DS_FREE, m, cur, i == 0 ? &t0 : &t, i == 0 ? &n0 : &n);
        g_jitter = 0.0;
        if (i < 2 && (cur->held == 0 || cur->forced != cur->held))
            fail_msg("killed at %.9g s, %s: the order was not forced (%d of %d holds ended by their condition)", when,
                     i == 0 ? "gone first" : "gone last", cur->forced, cur->held);
        if (i == 0) continue;
        if (strcmp(first->text, r.text))
            fail_msg("killed at %.9g s, run %d (%s) differs from the first (gone first):\n  %s\n  %s", when, i,
                     i == 1 ? "gone last" : "jittered", first->text, r.text);
        if (n != n0 || memcmp(t, t0, n)) fail_msg("killed at %.9g s: run %d's trace differs from the first's", when, i);
        assert_memory_equal(r.w, first->w, sizeof(r.w));
        free(t);
        t = NULL;
    }
    free(t0);
}

static void test_simnet_death_in_settle_by_virtual_time(void **state) {
    static ds_run first;
    static float want[NP];
    dsgd_ctx *ctx = tu_ctx();
    double d3, t0;
    (void)state;
    tu_watchdog(120);
    d3 = ds_deadline(&t0);
    /* jittered runs: the quick tier 2 (TSan 1), make test-full 8 (TSan 2) */
    ds_compare(d3 - 2.4e-6, 2, TU_PICK(TU_TSAN ? 2 : 8, TU_TSAN ? 1 : 2), &first);
    ds_no_extra_deadline(&first, t0);
    print_message("    rank 3 killed 2.4 us before its deadline, threads forced both ways and jittered: %s\n", first.text);
    if (!strstr(first.text, "step 3: 1 gone (world 3); step 3: 3 gone (world 3); "))
        fail_msg("want replicas 1 and 3 dropped as gone at step 3: %s", first.text);
    g_algo = DSGD_ALLREDUCE_RING; /* the script: 5 replicas to step 3, saved, restored into 3 */
    scripted(ctx, DS_N, DS_STEP, 3, DS_END, want);
    g_algo = DSGD_ALLREDUCE_AUTO;
    assert_memory_equal(first.w, want, sizeof(want));
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Rank 3 killed by time 5 us after its own deadline, in its settle: the
   step shrinks past it (5 -> 3, both dropped as gone), the same in every
   run; with min_replicas 4 the step fails with DSGD_ERR_ABORTED naming
   replicas 1 and 3. */
static void test_simnet_death_in_own_settle(void **state) {
    static ds_run first, failed;
    static float want[NP];
    dsgd_ctx *ctx = tu_ctx();
    char *trace;
    size_t len;
    double d3, t0;
    (void)state;
    tu_watchdog(120);
    d3 = ds_deadline(&t0);
    ds_once(d3 + 5e-6, DS_FREE, 2, &first, &trace, &len);
    free(trace);
    if (!strstr(first.text, "step 3: 1 gone (world 3); step 3: 3 gone (world 3); "))
        fail_msg("want replicas 1 and 3 dropped as gone at step 3: %s", first.text);
    ds_no_extra_deadline(&first, t0);
    ds_compare(d3 + 5e-6, 2, TU_PICK(TU_TSAN ? 1 : 4, 1), &first); /* jittered runs; make test-full 4 */
    print_message("    rank 3 killed 5 us after its deadline, in its settle: %s\n", first.text);
    if (!strstr(first.text, "step 3: 1 gone (world 3); step 3: 3 gone (world 3); "))
        fail_msg("want replicas 1 and 3 dropped as gone at step 3: %s", first.text);
    g_algo = DSGD_ALLREDUCE_RING;
    scripted(ctx, DS_N, DS_STEP, 3, DS_END, want);
    g_algo = DSGD_ALLREDUCE_AUTO;
    assert_memory_equal(first.w, want, sizeof(want));
    ds_once(d3 + 5e-6, DS_FREE, 4, &failed, &trace, &len); /* below min_replicas */
    free(trace);
    if (!strstr(failed.text, "step 3: the group was aborted: "))
        fail_msg("want DSGD_ERR_ABORTED at step 3: %s", failed.text);
    if (!strstr(failed.text, "replica(s) 1, 3 failed; 3 of 5 replicas survive"))
        fail_msg("want the failure to name replicas 1 and 3: %s", failed.text);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* The WARN lines the strategy logs (from any replica's thread). */
typedef struct warn_log {
    pthread_mutex_t mu;
    char text[1024];
} warn_log;

static void log_warn(void *user, dsgd_log_level level, const char *message) {
    warn_log *w = (warn_log *)user;
    if (level != DSGD_LOG_WARN) return;
    pthread_mutex_lock(&w->mu);
    snprintf(w->text + strlen(w->text), sizeof(w->text) - strlen(w->text), "%s\n", message);
    pthread_mutex_unlock(&w->mu);
}

/* Rank 3 of 4 stalls at step 4 for `stall` virtual seconds: 1.5 deadlines
   is a failure (it entered the step's first collective when the others
   had given up on it): the others drop it and go on (4 -> 3, named in the
   warning); 10 deadlines is longer than the settle waits for it: the step
   fails naming it (no hang), the strategy has failed. */
static void stall_case(double stall) {
    static warn_log w;
    dsgd_ctx_desc cd;
    dsgd_ctx *ctx;
    dsgd_simnet_fault f;
    static sn_feed sf;
    dsgd_strategy *s;
    dsgd_step_info info;
    int shrink = stall < 2.0 * SN_T;
    memset(&w, 0, sizeof(w));
    assert_int_equal(pthread_mutex_init(&w.mu, NULL), 0);
    memset(&cd, 0, sizeof(cd));
    cd.logger.func = log_warn;
    cd.logger.user_data = &w;
    assert_int_equal(dsgd_ctx_create(&cd, &ctx), DSGD_OK);
    memset(&f, 0, sizeof(f));
    f.kind = DSGD_SIMNET_FAULT_STALL;
    f.rank = 3;
    f.step = 4;
    f.seconds = stall;
    s = sn_strategy(ctx, 4, 2, &sf, &f, 1);
    for (sf.f.step = 0; sf.f.step < 4; ++sf.f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, NULL));
    if (shrink) {
        for (; sf.f.step < 8; ++sf.f.step) {
            TU_OK(ctx, dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, &info));
            assert_int_equal(info.resized, sf.f.step == 4);
            assert_int_equal(info.world, 3);
            assert_int_equal(info.dropped, sf.f.step == 4);
            if (sf.f.step == 4) { /* entered after the others gave up on it: late */
                assert_int_equal(info.dropped_rank[0], 3);
                assert_int_equal(info.dropped_why[0], DSGD_DROP_LATE);
                assert_string_equal(dsgd_drop_reason_name(info.dropped_why[0]), "late");
            }
        }
        assert_int_equal(sf.log.calls, 1);
        assert_int_equal(sf.log.survivors[0], 0);
        assert_int_equal(sf.log.survivors[1], 1);
        assert_int_equal(sf.log.survivors[2], 2);
        if (!strstr(w.text, "replica(s) 3 failed") || !strstr(w.text, "4 -> 3")) fail_msg("warnings: %s", w.text);
        print_message("    a stall of %g s: %s", stall, w.text);
        tu_assert_replicas_identical(ctx, s);
    } else {
        const char *msg;
        assert_int_not_equal(dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, NULL), DSGD_OK);
        msg = dsgd_ctx_last_error(ctx);
        if (!strstr(msg, "from replica(s) 3 within")) fail_msg("message: %s", msg);
        print_message("    a stall of %g s: %s\n", stall, msg);
        assert_true(dsgd_strategy_failed(s));
        assert_int_equal(sf.log.calls, 0);
    }
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    dsgd_ctx_destroy(ctx);
    pthread_mutex_destroy(&w.mu);
}

static void test_simnet_stall(void **state) {
    (void)state;
    tu_watchdog(60);
    g_alpha = 0.0; /* equal deadlines: a settle parked in the wrong place would hold the others back */
    stall_case(1.5 * SN_T);
    stall_case(10.0 * SN_T);
    g_alpha = 1e-5;
    tu_watchdog(0);
}

/* The script of several shrinks: worlds[0] replicas to step at[0], saved,
   restored into worlds[1], to at[1], ..., worlds[stages - 1] to end. */
static void scripted_chain(dsgd_ctx *ctx, const int *worlds, const int *at, int stages, int end, float *out) {
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, worlds[0]);
    dsgd_strategy *s;
    feed f = no_failure();
    char dir[64], path[128];
    int k;
    tu_mkdtemp(dir);
    snprintf(path, sizeof(path), "%s/ck", dir);
    f.step = 0;
    for (k = 0; k < stages; ++k) {
        int stop = k + 1 < stages ? at[k] : end;
        d.num_replicas = worlds[k];
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        if (k > 0) TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
        for (; f.step < stop; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
        if (k + 1 < stages) TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
        else params_of(s, 0, out);
        dsgd_strategy_destroy(s);
    }
    tu_rmdir(dir);
}

/* Two shrinks over one hub: rank 0 (replica 0, on the strategy's thread)
   killed at step 3, ranks 3 and 6 at once at step 7 (then replicas 2 and
   5 of 7: the settle maps the survivors' ranks to the hub's): 8 -> 7 -> 5,
   the bits of the script 8 -> 7 -> 5. */
static void test_simnet_two_shrinks(void **state) {
    static const int worlds[3] = {8, 7, 5}, at[2] = {3, 7};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_fault kill[3];
    static sn_feed sf;
    dsgd_strategy *s;
    dsgd_step_info info;
    float want[NP], got[NP];
    int i;
    (void)state;
    tu_watchdog(60);
    g_algo = DSGD_ALLREDUCE_RING;
    memset(kill, 0, sizeof(kill));
    for (i = 0; i < 3; ++i) {
        kill[i].kind = DSGD_SIMNET_FAULT_KILL;
        kill[i].rank = i == 0 ? 0 : i == 1 ? 3 : 6;
        kill[i].step = i == 0 ? 3 : 7;
    }
    s = sn_strategy(ctx, 8, 4, &sf, kill, 3);
    for (sf.f.step = 0; sf.f.step < 10; ++sf.f.step) {
        memset(&info, 0, sizeof(info));
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, &info));
        assert_int_equal(info.resized, sf.f.step == 3 || sf.f.step == 7);
        assert_int_equal(info.world, sf.f.step < 3 ? 8 : sf.f.step < 7 ? 7 : 5);
        assert_int_equal(info.dropped, sf.f.step == 3 ? 1 : sf.f.step == 7 ? 2 : 0);
        if (sf.f.step == 7) { /* hub ranks 3 and 6: replicas 2 and 5 of the 7 the step began with */
            assert_int_equal(info.dropped_rank[0], 2);
            assert_int_equal(info.dropped_rank[1], 5);
            assert_int_equal(info.dropped_why[1], DSGD_DROP_GONE);
        }
    }
    assert_int_equal(sf.log.calls, 2);
    assert_int_equal(sf.log.new_world, 5);
    /* the second shrink's survivors, as replicas of 7: 0 1 3 4 6 (hub ranks 1 2 4 5 7) */
    assert_int_equal(sf.log.survivors[2], 3);
    assert_int_equal(sf.log.survivors[4], 6);
    for (i = 0; i < 5; ++i) assert_int_equal(sf.rank_of[i], i < 2 ? i + 1 : i == 2 ? 4 : i == 3 ? 5 : 7);
    tu_assert_replicas_identical(ctx, s);
    params_of(s, 0, got);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    scripted_chain(ctx, worlds, at, 3, 10, want);
    assert_memory_equal(got, want, sizeof(want));
    g_algo = DSGD_ALLREDUCE_AUTO;
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Over simnet, replica 1's batch function fails at step 2 (4 -> 3: the
   agreed shrink; its rank, alive, leaves the hub, or its parked rank
   would hold back every later deadline), then rank 3 is killed at step 5
   (3 -> 2: the settle, whose deadlines fire). */
static void test_simnet_fn_failure_then_kill(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_fault kill;
    static sn_feed sf;
    dsgd_strategy *s;
    dsgd_step_info info;
    (void)state;
    tu_watchdog(60);
    memset(&kill, 0, sizeof(kill));
    kill.kind = DSGD_SIMNET_FAULT_KILL;
    kill.rank = 3;
    kill.step = 5;
    g_count = 32; /* 2 x max_batch */
    s = sn_strategy(ctx, 4, 2, &sf, &kill, 1);
    sf.f.fail_step = 2;
    sf.f.fail_world = 4;
    sf.f.fail_a = 1;
    for (sf.f.step = 0; sf.f.step < 8; ++sf.f.step) {
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, &info));
        assert_int_equal(info.world, sf.f.step < 2 ? 4 : sf.f.step < 5 ? 3 : 2);
        assert_int_equal(info.resized, sf.f.step == 2 || sf.f.step == 5);
    }
    assert_int_equal(sf.rank_of[0], 0);
    assert_int_equal(sf.rank_of[1], 2);
    tu_assert_replicas_identical(ctx, s);
    g_count = GB;
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* The same over a loopback hub you give (real time): replica 2's batch
   function sleeps 0.3 s at step 3 with a deadline of 0.2 s; the others
   time out, settle and drop it as late (4 -> 3), and train on. */
typedef struct sleepy {
    feed f;
    int sleeper, sleep_step;
} sleepy;

static dsgd_result sleepy_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    sleepy *z = (sleepy *)user;
    if (z->f.step == z->sleep_step && num_replicas == 4 && replica == z->sleeper) {
        struct timespec ts = {0, 300000000L};
        nanosleep(&ts, NULL);
    }
    return feed_fn(&z->f, replica, num_replicas, out);
}

static void test_loopback_late(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 4);
    dsgd_loopback *hub;
    dsgd_transport_i ep[4];
    dsgd_strategy *s;
    dsgd_step_info info;
    resize_log log;
    sleepy z;
    int i;
    (void)state;
    tu_watchdog(60);
    TU_OK(ctx, dsgd_loopback_create(ctx, 4, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &ep[i]));
    memset(&log, 0, sizeof(log));
    memset(&z, 0, sizeof(z));
    z.f = no_failure();
    z.sleeper = 2;
    z.sleep_step = 3;
    d.endpoints = ep;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.timeout_s = 0.2;
    d.elastic.min_replicas = 2;
    d.elastic.on_resize = on_resize;
    d.elastic.user = &log;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (z.f.step = 0; z.f.step < 6; ++z.f.step) {
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, sleepy_fn, &z, &info));
        assert_int_equal(info.world, z.f.step < 3 ? 4 : 3);
        assert_int_equal(info.resized, z.f.step == 3);
    }
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.survivors[2], 3);
    tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Below min_replicas over simnet: 4 replicas, min 4, rank 1 killed at
   step 2: DSGD_ERR_ABORTED naming it and the survivors, the strategy
   failed. */
static void test_simnet_below_min(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_fault kill;
    static sn_feed sf;
    dsgd_strategy *s;
    const char *msg;
    (void)state;
    tu_watchdog(60);
    memset(&kill, 0, sizeof(kill));
    kill.kind = DSGD_SIMNET_FAULT_KILL;
    kill.rank = 1;
    kill.step = 2;
    s = sn_strategy(ctx, 4, 4, &sf, &kill, 1);
    for (sf.f.step = 0; sf.f.step < 2; ++sf.f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, NULL));
    assert_int_equal(dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, NULL), DSGD_ERR_ABORTED);
    msg = dsgd_ctx_last_error(ctx);
    if (!strstr(msg, "replica(s) 1 failed") || !strstr(msg, "ranks 0, 2, 3") || !strstr(msg, "min_replicas 4"))
        fail_msg("message: %s", msg);
    assert_true(dsgd_strategy_failed(s));
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ------------------------------------------------------------------ grow */

/* A plain grow over a loopback hub of 6 ranks you give: 4 replicas over
   ranks 0..3 to step 5, then ranks 4 and 5 admitted (the state by
   broadcast from rank 0), 6 replicas to step 10: the bits of 4 to step 5,
   saved, restored into 6 (the same RING). on_resize: 4 -> 6, survivors
   0 1 2 3 -1 -1. */
static void test_grow_loopback_4_to_6(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d;
    dsgd_loopback *hub;
    dsgd_transport_i ep[6];
    dsgd_strategy *s;
    dsgd_step_info info;
    resize_log log;
    feed f = no_failure();
    float want[NP], got[NP];
    int i;
    (void)state;
    tu_watchdog(60);
    g_algo = DSGD_ALLREDUCE_RING;
    d = base_desc(DSGD_STRATEGY_MIRRORED, 4);
    TU_OK(ctx, dsgd_loopback_create(ctx, 6, &hub));
    for (i = 0; i < 6; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &ep[i]));
    memset(&log, 0, sizeof(log));
    d.endpoints = ep;
    d.elastic.min_replicas = 2;
    d.elastic.on_resize = on_resize;
    d.elastic.user = &log;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (f.step = 0; f.step < 10; ++f.step) {
        if (f.step == 5) {
            TU_OK(ctx, dsgd_strategy_grow(s, ep + 4, 2));
            assert_int_equal(dsgd_strategy_num_replicas_in_sync(s), 6);
            tu_assert_replicas_identical(ctx, s);
        }
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, &info));
        assert_int_equal(info.world, f.step < 5 ? 4 : 6);
        assert_int_equal(info.step, f.step);
    }
    assert_int_equal(log.calls, 1);
    assert_int_equal(log.old_world, 4);
    assert_int_equal(log.new_world, 6);
    for (i = 0; i < 6; ++i) assert_int_equal(log.survivors[i], i < 4 ? i : -1);
    /* misuse: a rank in use, NULL joiners over endpoints you gave */
    assert_int_equal(dsgd_strategy_grow(s, ep + 1, 1), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_strategy_grow(s, NULL, 1), DSGD_ERR_INVALID_ARGUMENT);
    assert_false(dsgd_strategy_failed(s));
    tu_assert_replicas_identical(ctx, s);
    params_of(s, 0, got);
    dsgd_strategy_destroy(s);
    dsgd_loopback_destroy(hub);
    scripted(ctx, 4, 5, 6, 10, want);
    assert_memory_equal(got, want, sizeof(want));
    g_algo = DSGD_ALLREDUCE_AUTO;
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ------------------------------------------------------- rejoin after a kill */

/* The rejoin over simnet: 8 replicas over ranks 0..7 of a hub of
   9, rank 8 a spare (dsgd_simnet_spare: it holds back no deadline, so the
   settle after the kill goes on without it); rank 1 killed at step
   RJ_KILL (8 -> 7), rank 8 admitted at the group's clock and grown in at
   step RJ_GROW (7 -> 8), to RJ_END. The data: epochs of a dsgd_sampler
   over DS samples (SB a step, the last step of an epoch partial), the same
   schedule in every run. Asserted: every epoch's samples, counted over the
   replicas' shards of the steps that were made, are the dataset exactly
   once; the weights are the bits of the script 8 to RJ_KILL, saved,
   restored into 7, to RJ_GROW, saved, restored into 8, to RJ_END. The
   quick tier kills at step 14 and grows at 28 (both inside an epoch, as
   50 and 100 are), to 45: 5 epochs; make test-full to 150, 16 epochs. */
enum { RJ_KILL = 50, RJ_GROW = 100, RJ_END = 150 };

static float g_rj_x[RJ_END][SB * IN], g_rj_y[RJ_END][SB];
static size_t g_rj_idx[RJ_END][SB];
static int g_rj_count[RJ_END], g_rj_last[RJ_END]; /* a step's samples; 1 on an epoch's last step */

static void rj_schedule(dsgd_ctx *ctx, int end) {
    static float dx[DS * IN], dy[DS];
    dsgd_sampler smp;
    const size_t *idx;
    tu_rng r = tu_rng_make(5);
    int t = 0, i;
    size_t b, k, nb;
    tu_fill(&r, dx, (size_t)DS * IN, -1.0f, 1.0f);
    for (i = 0; i < DS; ++i) dy[i] = (float)tu_below(&r, OUT);
    TU_OK(ctx, dsgd_sampler_init(ctx, &smp, DS, SB, 11, 1, 0));
    nb = dsgd_sampler_num_batches(&smp);
    for (; t < end; dsgd_sampler_set_epoch(&smp, smp.epoch + 1))
        for (b = 0; b < nb && t < end; ++b, ++t) {
            g_rj_count[t] = (int)dsgd_sampler_batch(&smp, b, &idx);
            g_rj_last[t] = b + 1 == nb;
            for (k = 0; k < (size_t)g_rj_count[t]; ++k) {
                g_rj_idx[t][k] = idx[k];
                memcpy(g_rj_x[t] + k * IN, dx + idx[k] * IN, sizeof(float) * IN);
                g_rj_y[t][k] = dy[idx[k]];
            }
        }
    dsgd_sampler_free(&smp);
}

typedef struct rj_feed {
    dsgd_simnet *hub; /* NULL: the script */
    int step, spare;  /* the next spare rank to grow in */
    int rank_of[DSGD_MAX_REPLICAS];
    int hits[DS];     /* this step's samples, by index */
    resize_log log;
} rj_feed;

static dsgd_result rj_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    rj_feed *f = (rj_feed *)user;
    size_t off = 0, len = 0, i;
    dsgd_result r = f->hub ? dsgd_simnet_compute(f->hub, f->rank_of[replica], f->step) : DSGD_OK;
    if (r != DSGD_OK) return r;
    dsgd_block_range((size_t)g_rj_count[f->step], num_replicas, replica, &off, &len);
    for (i = off; i < off + len; ++i) ++f->hits[g_rj_idx[f->step][i]]; /* disjoint per replica */
    out->count = (int)len;
    out->x = g_rj_x[f->step] + off * IN;
    out->y = g_rj_y[f->step] + off;
    return DSGD_OK;
}

/* Survivors keep their ranks; a joiner (-1) takes the next spare. The
   step is made again (shrink) or not yet (grow): its count starts over. */
static void rj_resize(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s) {
    rj_feed *f = (rj_feed *)user;
    int map[DSGD_MAX_REPLICAS], i;
    for (i = 0; i < new_world; ++i) map[i] = survivors[i] >= 0 ? f->rank_of[survivors[i]] : f->spare++;
    memcpy(f->rank_of, map, sizeof(int) * (size_t)new_world);
    memset(f->hits, 0, sizeof(f->hits));
    on_resize(&f->log, old_world, new_world, survivors, s);
}

/* The script: worlds[k] replicas from at[k - 1] to at[k] (own loopback,
   RING), saved and restored between stages. */
static void rj_script(dsgd_ctx *ctx, const int *worlds, const int *at, int stages, float *out) {
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, worlds[0]);
    dsgd_strategy *s;
    static rj_feed f;
    char dir[64], path[128];
    int k;
    memset(&f, 0, sizeof(f));
    tu_mkdtemp(dir);
    snprintf(path, sizeof(path), "%s/ck", dir);
    for (k = 0; k < stages; ++k) {
        d.num_replicas = worlds[k];
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        if (k > 0) TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
        for (; f.step < at[k]; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, rj_fn, &f, NULL));
        if (k + 1 < stages) TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
        else params_of(s, 0, out);
        dsgd_strategy_destroy(s);
    }
    tu_rmdir(dir);
}

static void test_simnet_kill_then_rejoin(void **state) {
    static const int worlds[3] = {8, 7, 8};
    const int at[3] = {TU_PICK(RJ_KILL, 14), TU_PICK(RJ_GROW, 28), TU_PICK(RJ_END, 45)};
    const int rj_kill = at[0], rj_grow = at[1], rj_end = at[2];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d;
    dsgd_simnet_fault kill;
    dsgd_transport_i ep[9];
    static rj_feed f;
    dsgd_strategy *s;
    dsgd_step_info info;
    float want[NP], got[NP];
    int total[DS], i, epochs = 0;
    double t_admit = 0.0;
    (void)state;
    tu_watchdog(120);
    rj_schedule(ctx, rj_end);
    g_algo = DSGD_ALLREDUCE_RING;
    memset(&kill, 0, sizeof(kill));
    kill.kind = DSGD_SIMNET_FAULT_KILL;
    kill.rank = 1;
    kill.step = rj_kill;
    memset(&f, 0, sizeof(f));
    f.hub = sn_hub(ctx, 9, &kill, 1);
    TU_OK(ctx, dsgd_simnet_spare(f.hub, 8)); /* before anything runs */
    for (i = 0; i < 9; ++i) TU_OK(ctx, dsgd_simnet_endpoint(f.hub, i, &ep[i]));
    for (i = 0; i < 8; ++i) f.rank_of[i] = i;
    f.spare = 8;
    d = base_desc(DSGD_STRATEGY_MIRRORED, 8);
    d.endpoints = ep;
    d.gradient_path = DSGD_GRADIENTS_HOST;
    d.timeout_s = SN_T;
    d.elastic.min_replicas = 4;
    d.elastic.on_resize = rj_resize;
    d.elastic.user = &f;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    memset(total, 0, sizeof(total));
    for (f.step = 0; f.step < rj_end; ++f.step) {
        int n = dsgd_strategy_num_replicas(s);
        if (f.step == rj_grow) { /* rank 8 joins where the group is */
            for (i = 0; i < n; ++i)
                if (dsgd_simnet_time(f.hub, f.rank_of[i]) > t_admit) t_admit = dsgd_simnet_time(f.hub, f.rank_of[i]);
            TU_OK(ctx, dsgd_simnet_admit(f.hub, 8, t_admit));
            TU_OK(ctx, dsgd_strategy_grow(s, &ep[8], 1));
            assert_int_equal(dsgd_strategy_num_replicas_in_sync(s), 8);
            tu_assert_replicas_identical(ctx, s);
        }
        memset(f.hits, 0, sizeof(f.hits));
        memset(&info, 0, sizeof(info));
        TU_OK(ctx, dsgd_strategy_train_step_fn(s, rj_fn, &f, &info));
        assert_int_equal(info.count, g_rj_count[f.step]);
        assert_int_equal(info.world, f.step < rj_kill ? 8 : f.step < rj_grow ? 7 : 8);
        assert_int_equal(info.resized, f.step == rj_kill);
        for (i = 0; i < DS; ++i) total[i] += f.hits[i];
        if (g_rj_last[f.step]) { /* the epoch is over: each sample once */
            for (i = 0; i < DS; ++i)
                if (total[i] != 1) fail_msg("epoch %d: sample %d was trained on %d times", epochs, i, total[i]);
            memset(total, 0, sizeof(total));
            ++epochs;
        }
    }
    print_message("    rejoin: rank 8 admitted at %.6f s virtual; %d whole epochs counted\n", t_admit, epochs);
    assert_true(epochs >= TU_PICK(16, 5));
    assert_int_equal(f.log.calls, 2);
    assert_int_equal(f.log.old_world, 7);
    assert_int_equal(f.log.new_world, 8);
    for (i = 0; i < 8; ++i) assert_int_equal(f.rank_of[i], i == 7 ? 8 : i < 1 ? i : i + 1);
    assert_false(dsgd_strategy_failed(s));
    tu_assert_replicas_identical(ctx, s);
    params_of(s, 0, got);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(f.hub);
    rj_script(ctx, worlds, at, 3, want);
    assert_memory_equal(got, want, sizeof(want));
    g_algo = DSGD_ALLREDUCE_AUTO;
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ------------------------------------------------------- fault schedules */

/* Seeded fault schedules over simnet (MIRRORED over the hub's endpoints,
   elastic, min_replicas 2): each seed draws 3..6 replicas, RING or AUTO,
   and 1..3 faults at distinct steps 1..FS_STEPS - 1 on random ranks:
   KILL; STALL of 0.2 deadlines (harmless), 1.5 (late: dropped) or 10
   (longer than the settle waits: the step fails); SLOW by 1.5..4 (at most
   once per rank: compute stays far below the deadline); DROP of the next
   message a rank sends. A model of the contract says what each step must
   do: a KILL drops the rank's replica (gone), a late STALL drops it
   (late), each below min_replicas fails the step with DSGD_ERR_ABORTED
   naming it; a long STALL fails the step naming the stalled replica; a
   DROP fails the step naming the rank whose message was lost; a fault on
   a rank no longer in the group does nothing. Asserted every step: the
   result, info.world, info.resized and info.dropped (each dropped
   replica's rank as the step began and dsgd_drop_reason), or the error's
   message; no hang (a watchdog per schedule). DSGD_FAULT_SCHEDULES=N runs
   N schedules instead of FS_DEFAULT (make test-full; the soak: 1000 under
   TSan), or FS_QUICK in the quick tier (seeds 1..12 draw every kind of
   fault, 3 to 6 replicas, RING and AUTO); DSGD_FAULT_FIRST=K starts at
   seed K. */
enum { FS_STEPS = 10, FS_DEFAULT = 40, FS_QUICK = 12 };

typedef struct fs_cfg {
    int n, nf;
    dsgd_allreduce_algo algo;
    dsgd_simnet_fault f[3];
} fs_cfg;

static void fs_draw(unsigned seed, fs_cfg *c) {
    tu_rng r = tu_rng_make(1000u + seed);
    int used[FS_STEPS], slowed[8], i, k;
    static const double stalls[3] = {0.2, 1.5, 10.0};
    memset(c, 0, sizeof(*c));
    memset(used, 0, sizeof(used));
    memset(slowed, 0, sizeof(slowed));
    c->n = 3 + (int)tu_below(&r, 4);
    c->algo = tu_below(&r, 2) ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_AUTO;
    c->nf = 1 + (int)tu_below(&r, 3);
    for (i = 0; i < c->nf; ++i) {
        dsgd_simnet_fault *f = &c->f[i];
        do f->step = 1 + (long)tu_below(&r, FS_STEPS - 1);
        while (used[f->step]);
        used[f->step] = 1;
        f->rank = (int)tu_below(&r, (unsigned)c->n);
        f->peer = -1;
        k = (int)tu_below(&r, 4);
        if (k == 2 && slowed[f->rank]) k = 0;
        f->kind = k == 0 ? DSGD_SIMNET_FAULT_KILL : k == 1 ? DSGD_SIMNET_FAULT_STALL
                  : k == 2 ? DSGD_SIMNET_FAULT_SLOW : DSGD_SIMNET_FAULT_DROP;
        if (k == 1) f->seconds = stalls[tu_below(&r, 3)] * SN_T;
        if (k == 2) {
            f->factor = (double)tu_uniform(&r, 1.5f, 4.0f);
            slowed[f->rank] = 1;
        }
        f->count = 1;
    }
}

static void fs_describe(const fs_cfg *c, char *buf, size_t cap) {
    static const char *const kinds[] = {"", "kill", "stall", "slow", "drop", "delay"};
    int i, k = snprintf(buf, cap, "%d replicas, %s:", c->n, c->algo == DSGD_ALLREDUCE_RING ? "ring" : "auto");
    for (i = 0; i < c->nf && k > 0 && (size_t)k < cap; ++i)
        k += snprintf(buf + k, cap - (size_t)k, " %s rank %d step %ld (%g s, x%g)", kinds[c->f[i].kind], c->f[i].rank,
                      c->f[i].step, c->f[i].seconds, c->f[i].factor);
}

/* One schedule: fails the test naming the seed and its faults. */
static void fs_run(unsigned seed, int *shrinks, int *failures) {
    dsgd_ctx *ctx = tu_ctx();
    fs_cfg c;
    static sn_feed sf;
    dsgd_strategy *s;
    static dsgd_step_info info;
    char desc[256], what[320], hang[100];
    int members[8], nm, step, i, j;
    fs_draw(seed, &c);
    fs_describe(&c, desc, sizeof(desc));
    snprintf(what, sizeof(what), "fault schedule seed %u: %s", seed, desc);
    snprintf(hang, sizeof(hang), "fault schedule seed %u (DSGD_FAULT_FIRST=%u DSGD_FAULT_SCHEDULES=1)", seed, seed);
    tu_watchdog_for(hang, 30);
    g_algo = c.algo;
    g_count = 32; /* 2 x max_batch: the group may shrink to min_replicas 2 */
    s = sn_strategy(ctx, c.n, 2, &sf, c.f, c.nf);
    for (nm = 0; nm < c.n; ++nm) members[nm] = nm;
    for (step = 0; step < FS_STEPS; ++step) {
        int drop[8], why[8], nd = 0, fail = 0, culprit = -1, kind = 0;
        dsgd_result res;
        for (i = 0; i < c.nf; ++i) { /* the model: what this step's faults do to the group */
            const dsgd_simnet_fault *f = &c.f[i];
            int at = -1;
            for (j = 0; j < nm; ++j)
                if (members[j] == f->rank) at = j;
            if (f->step != step || at < 0) continue;
            if (f->kind == DSGD_SIMNET_FAULT_KILL || (f->kind == DSGD_SIMNET_FAULT_STALL && f->seconds > SN_T &&
                                                      f->seconds < 2.0 * SN_T)) {
                drop[nd] = at;
                why[nd++] = f->kind == DSGD_SIMNET_FAULT_KILL ? DSGD_DROP_GONE : DSGD_DROP_LATE;
            } else if (f->kind == DSGD_SIMNET_FAULT_STALL && f->seconds > SN_T) {
                fail = 1, culprit = at, kind = 's';
            } else if (f->kind == DSGD_SIMNET_FAULT_DROP && nm > 1) {
                fail = 1, culprit = f->rank, kind = 'd';
            }
        }
        if (nd > 0 && nm - nd < 2) fail = 1, culprit = drop[0], kind = 'm';
        sf.f.step = step;
        memset(&info, 0, sizeof(info));
        res = dsgd_strategy_train_step_fn(s, sn_feed_fn, &sf, &info);
        if (fail) {
            const char *msg = dsgd_ctx_last_error(ctx);
            char want[64];
            if (res == DSGD_OK) fail_msg("%s: step %d succeeded, want a failure", what, step);
            if (kind == 's') snprintf(want, sizeof(want), "from replica(s) %d within", culprit);
            else if (kind == 'm') snprintf(want, sizeof(want), "replica(s) %d", culprit);
            else snprintf(want, sizeof(want), "a message from rank %d was dropped", culprit);
            if (!strstr(msg, want)) fail_msg("%s: step %d: want \"%s\" in: %s", what, step, want, msg);
            if (kind == 'm' && res != DSGD_ERR_ABORTED) fail_msg("%s: step %d: %s", what, step, dsgd_result_string(res));
            assert_true(dsgd_strategy_failed(s));
            ++*failures;
            break;
        }
        if (res != DSGD_OK) fail_msg("%s: step %d: %s: %s", what, step, dsgd_result_string(res), dsgd_ctx_last_error(ctx));
        if (info.world != nm - nd || info.resized != (nd > 0) || info.dropped != nd)
            fail_msg("%s: step %d: world %d resized %d dropped %d, want %d %d %d", what, step, info.world,
                     info.resized, info.dropped, nm - nd, nd > 0, nd);
        for (i = 0; i < nd; ++i) { /* the model lists them in the order of the faults; the step in rank order */
            int found = 0;
            for (j = 0; j < nd; ++j)
                found |= info.dropped_rank[j] == drop[i] && (int)info.dropped_why[j] == why[i];
            if (!found) fail_msg("%s: step %d: replica %d (%s) is not in the step's dropped list", what, step, drop[i],
                                 dsgd_drop_reason_name((dsgd_drop_reason)why[i]));
        }
        for (i = 0, j = 0; i < nm; ++i) { /* the survivors keep their order */
            int gone = 0, k;
            for (k = 0; k < nd; ++k) gone |= drop[k] == i;
            if (!gone) members[j++] = members[i];
        }
        nm = j;
        *shrinks += nd > 0;
        for (i = 0; i < nm; ++i) assert_int_equal(sf.rank_of[i], members[i]);
    }
    if (!dsgd_strategy_failed(s)) tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(sf.hub);
    g_count = GB;
    g_algo = DSGD_ALLREDUCE_AUTO;
    dsgd_ctx_destroy(ctx);
}

static void test_simnet_fault_schedules(void **state) {
    const char *env = getenv("DSGD_FAULT_SCHEDULES"), *first_env = getenv("DSGD_FAULT_FIRST");
    unsigned n = env ? (unsigned)strtoul(env, NULL, 10) : (unsigned)TU_PICK(FS_DEFAULT, FS_QUICK);
    unsigned first = first_env ? (unsigned)strtoul(first_env, NULL, 10) : 1, k;
    int shrinks = 0, failures = 0;
    double t0 = dsgd_now();
    (void)state;
    for (k = first; k < first + n; ++k) fs_run(k, &shrinks, &failures);
    tu_watchdog(0);
    print_message("    %u fault schedules (seeds %u..%u): %d shrinks, %d steps failed as the model says, %.1f s\n", n,
                  first, first + n - 1, shrinks, failures, dsgd_now() - t0);
}

/* ---------------------------------------------------------------- the limits */

static void test_below_min_replicas(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 4);
    dsgd_strategy *s;
    feed f = no_failure();
    double t0, dt;
    const char *msg;
    (void)state;
    tu_watchdog(60);
    d.elastic.min_replicas = 3;
    d.elastic.grace_s = 0.3;
    f.fail_step = 2;
    f.fail_world = 4;
    f.fail_a = 1;
    f.fail_b = 2;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (f.step = 0; f.step < 2; ++f.step) TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
    t0 = dsgd_now();
    assert_int_equal(dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL), DSGD_ERR_ABORTED);
    dt = dsgd_now() - t0;
    msg = dsgd_ctx_last_error(ctx);
    if (!strstr(msg, "min_replicas 3") || !strstr(msg, "ranks 0, 3") || !strstr(msg, "replica(s) 1, 2"))
        fail_msg("message: %s", msg);
    assert_true(dt >= 0.3);
    assert_true(dt < 10.0);
    assert_true(dsgd_strategy_failed(s));
    ++f.step;
    assert_int_equal(dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL), DSGD_ERR_STATE);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_batch_error_does_not_shrink(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, 4);
    dsgd_strategy *s;
    feed f = no_failure();
    dsgd_step_info info;
    (void)state;
    tu_watchdog(60);
    d.elastic.min_replicas = 1;
    f.label_step = 1;
    f.label_replica = 2;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL));
    f.step = 1;
    assert_int_equal(dsgd_strategy_train_step_fn(s, feed_fn, &f, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_false(dsgd_strategy_failed(s));
    assert_int_equal(dsgd_strategy_num_replicas(s), 4);
    f.step = 2;
    TU_OK(ctx, dsgd_strategy_train_step_fn(s, feed_fn, &f, &info));
    assert_int_equal(info.world, 4);
    assert_int_equal(info.resized, 0);
    tu_assert_replicas_identical(ctx, s);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_misuse(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_CENTRAL_STORAGE, 2);
    dsgd_strategy *s = NULL;
    (void)state;
    d.elastic.min_replicas = 1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d = base_desc(DSGD_STRATEGY_MIRRORED, 2);
    d.elastic.min_replicas = -1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d.elastic.min_replicas = 1;
    d.elastic.grace_s = -1.0;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d.elastic.grace_s = 0.0;
    d.elastic.min_replicas = 3;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_null(s);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_8_to_7_bitwise),
        cmocka_unit_test(test_two_fail_at_once),
        cmocka_unit_test(test_small_groups),
        cmocka_unit_test(test_multi_worker_shrink),
        cmocka_unit_test(test_sampler_epoch),
        cmocka_unit_test(test_simnet_kill_8_to_7),
        cmocka_unit_test(test_simnet_killed_in_collective),
        cmocka_unit_test(test_simnet_death_in_settle_by_virtual_time),
        cmocka_unit_test(test_simnet_death_in_own_settle),
        cmocka_unit_test(test_simnet_stall),
        cmocka_unit_test(test_simnet_two_shrinks),
        cmocka_unit_test(test_simnet_fn_failure_then_kill),
        cmocka_unit_test(test_simnet_below_min),
        cmocka_unit_test(test_loopback_late),
        cmocka_unit_test(test_below_min_replicas),
        cmocka_unit_test(test_batch_error_does_not_shrink),
        cmocka_unit_test(test_grow_loopback_4_to_6),
        cmocka_unit_test(test_simnet_kill_then_rejoin),
        cmocka_unit_test(test_simnet_fault_schedules),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
