/* test_strategy_sync_workers.c - DSGD_STRATEGY_MULTI_WORKER_MIRRORED, with the
   workers simulated in one process: one loopback hub of W ranks, one
   strategy per worker, each created and driven from its own thread with its
   contiguous share of the hub's endpoints (as each MPI process would hold
   its local endpoints).

   The model is a small MLP, 12 -> 10 tanh -> 4 (softmax cross-entropy).

   What is asserted:
   - 2 workers x 2 replicas, and 1 + 3 replicas, train after 10 steps of
     uneven global batches (SGD with momentum) the very bits of one
     4-replica MIRRORED strategy over the same algorithm (ring, and AUTO),
     on every replica of every worker; each replica g takes
     dsgd_block_range(count, 4, g) of the global batch.
   - With ranks_per_node 2 (two fake nodes of two replicas), HIERARCHICAL
     and AUTO (which picks it) give the bits of the 4-replica strategy with
     the same layout.
   - dsgd_strategy_train_step_fn across workers (each replica fetches its
     own shard, told its global rank and W) gives the same bits.
   - The metrics, taken collectively on every worker, equal the reference's:
     the count exactly, the loss sum and correct count within 1e-6 relative.
   - A worker created with another seed starts from the chief's weights.
   - A worker with another learning rate fails creation on every worker
     with DSGD_ERR_INVALID_ARGUMENT naming rank 2 (its first rank); nothing
     hangs.
   - A label out of range on one worker fails that step on every replica of
     every worker, cleanly (that worker with its own error, the other with
     DSGD_ERR_ABORTED): both strategies stay usable and in step.
   - Checkpoints across workers (RING, momentum): 2 workers x 2 replicas
     save at step 5 (the chief writes); 2 x 2, 4 x 1 and 1 x 4 restore it
     and train steps 5..9 to the very bits of the run never interrupted
     (the weights on every replica; the metrics too for 2 x 2, within 1e-6
     for the others, which sum them in another order), and 2 x 2 restores
     what 1 x 4 saved to the same bits. 2 workers x 1 replica (another group
     size) restore the step-5 weights exactly and the step-5 metrics
     (summed into global replica 0) within 1e-6. A file missing on one
     worker fails the restore on every worker (that one DSGD_ERR_IO, the
     other naming rank 2), nothing is touched and both train on; a save
     into a missing directory is DSGD_ERR_IO on every worker, the other
     naming rank 0.
   - Misuse: no endpoints, non-contiguous ranks, MIRRORED over a larger
     group, gradient_path DEVICE: DSGD_ERR_INVALID_ARGUMENT.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>
#include <signal.h>

enum { IN = 12, OUT = 4, W = 4, STEPS = 10, MAXB = 16, NP = IN * 10 + 10 + 10 * OUT + OUT };

static const dsgd_layer_desc LAYERS[2] = {{10, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static float g_x[STEPS][W * MAXB * IN], g_y[STEPS][W * MAXB];

static int count_of(int step) { return 22 + 3 * step; }

static int g_ranks_per_node; /* base_desc's ranks_per_node */
static size_t g_bucket_bytes; /* base_desc's bucket_bytes */
static int g_overlap;         /* base_desc's overlap, for the workers (not the reference) */

static void make_data(void) {
    tu_rng r = tu_rng_make(99);
    int s, i;
    for (s = 0; s < STEPS; ++s) {
        tu_fill(&r, g_x[s], (size_t)W * MAXB * IN, -1.0f, 1.0f);
        for (i = 0; i < W * MAXB; ++i) g_y[s][i] = (float)tu_below(&r, OUT);
    }
}

static dsgd_strategy_desc base_desc(dsgd_strategy_kind kind, int n, dsgd_allreduce_algo algo) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.algorithm = algo;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = MAXB;
    d.model.seed = 7;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.1f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 20.0;
    d.cpu_threads = 1;
    d.ranks_per_node = g_ranks_per_node;
    d.bucket_bytes = g_bucket_bytes;
    d.overlap = kind == DSGD_STRATEGY_MULTI_WORKER_MIRRORED && g_overlap;
    return d;
}

/* ---------------------------------------------------------------- a worker */

typedef struct worker {
    dsgd_transport_i *eps; /* its endpoints */
    int n;
    dsgd_strategy_desc d;
    int use_fn;
    int bad_label_step;    /* -1: none; else this worker's first sample gets label 99 at that step */
    /* results */
    dsgd_result create_res, step_res[STEPS];
    char create_msg[1024];
    float params[4][NP];   /* every local replica's */
    dsgd_metrics train;
    dsgd_result metrics_res;
    /* checkpoints: restore before training (restore_path), train steps
       [first_step, last_step), save before step save_at (save_path) */
    const char *restore_path, *save_path;
    int first_step, last_step, save_at;
    dsgd_result restore_res, save_res;
    char restore_msg[1024], save_msg[1024];
    float restored[NP], saved[NP]; /* replica 0's weights after the restore, at the save */
    /* dsgd_strategy_wait_report after the steps (report 1), global rank
       slow + 1 sleeping in the batch fn (0: none) */
    int report, slow;
    dsgd_result report_res;
    dsgd_wait_report rep;
    double frac[W];
} worker;

/* Each replica's own shard (dsgd_batch_fn), from its global rank. */
typedef struct fn_data {
    int step;
    int slow; /* global rank + 1 that sleeps 20 ms (0: none) */
} fn_data;

static dsgd_result shard_fn(void *user, int replica, int n, dsgd_batch *out) {
    const fn_data *f = (const fn_data *)user;
    size_t off = 0, len = 0;
    dsgd_block_range((size_t)count_of(f->step), n, replica, &off, &len);
    out->x = g_x[f->step] + off * IN;
    out->y = g_y[f->step] + off;
    out->count = (int)len;
    if (replica + 1 == f->slow) {
        struct timespec ts = {0, 20000000L};
        nanosleep(&ts, NULL);
    }
    return DSGD_OK;
}

static void worker_save(worker *w, dsgd_strategy *s, dsgd_ctx *ctx) {
    w->save_res = dsgd_strategy_save(s, w->save_path, NULL);
    snprintf(w->save_msg, sizeof(w->save_msg), "%s", dsgd_ctx_last_error(ctx));
    dsgd_model_get_params(dsgd_strategy_model(s, 0), w->saved, NP);
}

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    int step, r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return NULL;
    w->d.endpoints = w->eps;
    w->create_res = dsgd_strategy_create(ctx, &w->d, &s);
    snprintf(w->create_msg, sizeof(w->create_msg), "%s", dsgd_ctx_last_error(ctx));
    if (w->create_res != DSGD_OK) {
        dsgd_ctx_destroy(ctx);
        return NULL;
    }
    if (w->restore_path) {
        w->restore_res = dsgd_strategy_restore(s, w->restore_path, NULL);
        snprintf(w->restore_msg, sizeof(w->restore_msg), "%s", dsgd_ctx_last_error(ctx));
        dsgd_model_get_params(dsgd_strategy_model(s, 0), w->restored, NP);
    }
    for (step = w->first_step; step < w->last_step; ++step) {
        float y[W * MAXB];
        if (w->save_path && step == w->save_at) worker_save(w, s, ctx);
        memcpy(y, g_y[step], sizeof(y));
        if (step == w->bad_label_step) y[0] = 99.0f; /* sample 0: replica 0's shard (worker 0) */
        if (w->use_fn) {
            fn_data f;
            f.step = step;
            f.slow = w->slow;
            w->step_res[step] = dsgd_strategy_train_step_fn(s, shard_fn, &f, NULL);
        } else {
            w->step_res[step] = dsgd_strategy_train_step(s, g_x[step], y, count_of(step), NULL);
        }
    }
    if (w->save_path && w->save_at == w->last_step) worker_save(w, s, ctx);
    if (w->report) w->report_res = dsgd_strategy_wait_report(s, &w->rep, w->frac, W);
    w->metrics_res = dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &w->train);
    for (r = 0; r < dsgd_strategy_num_replicas(s); ++r)
        dsgd_model_get_params(dsgd_strategy_model(s, r), w->params[r], NP);
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

/* Runs workers with `split` local replicas each over one hub of their sum
   (W, or fewer). */
static void run_workers(worker *ws, const int *split, int nw) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[W];
    pthread_t th[W];
    int i, first = 0, total = 0;
    for (i = 0; i < nw; ++i) total += split[i];
    assert_true(total >= 1 && total <= W);
    TU_OK(ctx, dsgd_loopback_create(ctx, total, &hub));
    for (i = 0; i < total; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    for (i = 0; i < nw; ++i) {
        ws[i].eps = eps + first;
        ws[i].n = split[i];
        ws[i].d.num_replicas = split[i];
        first += split[i];
    }
    for (i = 0; i < nw; ++i) assert_int_equal(pthread_create(&th[i], NULL, worker_main, &ws[i]), 0);
    for (i = 0; i < nw; ++i) pthread_join(th[i], NULL);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

/* The reference: one MIRRORED strategy of W replicas. */
static void reference(dsgd_allreduce_algo algo, float *params, dsgd_metrics *train) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = base_desc(DSGD_STRATEGY_MIRRORED, W, algo);
    dsgd_strategy *s = NULL;
    int step;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (step = 0; step < STEPS; ++step) TU_OK(ctx, dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(step), NULL));
    TU_OK(ctx, dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, train));
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), params, NP));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void arm(void) {
    tu_watchdog_for("a multi-worker test", 120);
}

static void init_workers(worker *ws, int nw, dsgd_allreduce_algo algo, int use_fn) {
    int i;
    memset(ws, 0, sizeof(worker) * (size_t)nw);
    for (i = 0; i < nw; ++i) {
        ws[i].d = base_desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 1, algo);
        ws[i].use_fn = use_fn;
        ws[i].bad_label_step = -1;
        ws[i].last_step = STEPS;
    }
}

static void check_bitwise(dsgd_allreduce_algo algo, const int *split, int nw, int use_fn) {
    worker ws[W];
    float ref[NP];
    dsgd_metrics mt;
    int i, r, step;
    init_workers(ws, nw, algo, use_fn);
    reference(algo, ref, &mt);
    run_workers(ws, split, nw);
    for (i = 0; i < nw; ++i) {
        if (ws[i].create_res != DSGD_OK) fail_msg("worker %d: %s", i, ws[i].create_msg);
        for (step = 0; step < STEPS; ++step) assert_int_equal(ws[i].step_res[step], DSGD_OK);
        assert_int_equal(ws[i].metrics_res, DSGD_OK);
        for (r = 0; r < split[i]; ++r)
            if (memcmp(ws[i].params[r], ref, sizeof(ref)) != 0)
                fail_msg("worker %d replica %d differs from the 4-replica mirrored run (rel err %.3g)", i, r,
                         tu_rel_err(ws[i].params[r], ref, NP));
        assert_true(ws[i].train.count == mt.count);
        TU_NEAR(ws[i].train.loss_sum, mt.loss_sum, 1e-6 * mt.loss_sum);
        TU_NEAR(ws[i].train.correct, mt.correct, 1e-6 * mt.correct + 1e-9);
    }
    printf("    %d workers (%d", nw, split[0]);
    for (i = 1; i < nw; ++i) printf(" + %d", split[i]);
    printf(" replicas), %s%s: bitwise equal to mirrored x4; %.0f samples, loss %.5f\n", dsgd_allreduce_algo_name(algo),
           use_fn ? ", batch fn" : "", mt.count, mt.loss_sum / mt.count);
}

/* ---------------------------------------------------------------- tests */

/* dsgd_strategy_wait_report across workers (2 x 2, global rank 3 sleeping
   20 ms in its batch fn): a collective after which both workers hold the
   same report, bit for bit, naming rank 3, though worker 0 holds none of
   its waits. */
static void test_wait_report_across_workers(void **state) {
    static const int split[2] = {2, 2};
    worker ws[2];
    int i;
    (void)state;
    arm();
    init_workers(ws, 2, DSGD_ALLREDUCE_AUTO, 1);
    for (i = 0; i < 2; ++i) {
        ws[i].report = 1;
        ws[i].slow = 4;
    }
    run_workers(ws, split, 2);
    for (i = 0; i < 2; ++i) {
        if (ws[i].create_res != DSGD_OK) fail_msg("worker %d: %s", i, ws[i].create_msg);
        assert_int_equal(ws[i].report_res, DSGD_OK);
        assert_int_equal(ws[i].rep.steps, STEPS);
        assert_int_equal(ws[i].rep.worst, 3);
        assert_true(ws[i].frac[3] > 0.3 && ws[i].frac[3] < 1.0);
    }
    assert_memory_equal(ws[0].frac, ws[1].frac, sizeof(ws[0].frac));
    assert_memory_equal(&ws[0].rep, &ws[1].rep, sizeof(ws[0].rep));
    printf("    2 workers x 2: rank %d made the others wait %.3f of the step (%.4f s)\n", ws[0].rep.worst,
           ws[0].rep.worst_fraction, ws[0].rep.step_s);
}

static void test_bitwise_like_mirrored(void **state) {
    static const int two_two[2] = {2, 2}, one_three[2] = {1, 3}, ones[4] = {1, 1, 1, 1};
    (void)state;
    arm();
    check_bitwise(DSGD_ALLREDUCE_RING, two_two, 2, 0);
    check_bitwise(DSGD_ALLREDUCE_AUTO, two_two, 2, 0);
    check_bitwise(DSGD_ALLREDUCE_HALVING_DOUBLING, one_three, 2, 0);
    check_bitwise(DSGD_ALLREDUCE_RING, ones, 4, 0);
    check_bitwise(DSGD_ALLREDUCE_RING, two_two, 2, 1);
    g_ranks_per_node = 2; /* two "nodes" of two: AUTO picks HIERARCHICAL */
    check_bitwise(DSGD_ALLREDUCE_HIERARCHICAL, two_two, 2, 0);
    check_bitwise(DSGD_ALLREDUCE_AUTO, one_three, 2, 0);
    g_ranks_per_node = 0;
    tu_watchdog(0);
}

/* Overlap (the exchange beside backward) across workers: every algorithm
   at three bucket sizes, 2 workers x 2 replicas, and 1 + 3 with the batch
   fn, give the bits of the 4-replica MIRRORED run without overlap. The
   quick tier runs each algorithm at one bucket size (in turn: every size
   with two or three of them) and 1 + 3 at every size; make test-full
   every algorithm at every size. */
static void test_overlap_like_mirrored(void **state) {
    static const int two_two[2] = {2, 2}, one_three[2] = {1, 3};
    static const size_t buckets[3] = {0, 64, 200};
    int a, k;
    (void)state;
    arm();
    g_overlap = 1;
    for (k = 0; k < 3; ++k) {
        g_bucket_bytes = buckets[k];
        printf("    overlap, bucket_bytes %zu:\n", buckets[k]);
        for (a = 0; a < DSGD_ALLREDUCE_COUNT; ++a)
            if (tu_full() || a % 3 == k) check_bitwise((dsgd_allreduce_algo)a, two_two, 2, 0);
        check_bitwise(DSGD_ALLREDUCE_RING, one_three, 2, 1);
    }
    g_overlap = 0;
    g_bucket_bytes = 0;
    tu_watchdog(0);
}

static void test_chief_weights(void **state) {
    static const int two_two[2] = {2, 2};
    worker ws[2];
    float ref[NP];
    dsgd_metrics mt;
    int r;
    (void)state;
    arm();
    init_workers(ws, 2, DSGD_ALLREDUCE_RING, 0);
    ws[1].d.model.seed = 12345; /* the chief's weights win */
    reference(DSGD_ALLREDUCE_RING, ref, &mt);
    run_workers(ws, two_two, 2);
    for (r = 0; r < 2; ++r) {
        assert_int_equal(ws[r].create_res, DSGD_OK);
        assert_memory_equal(ws[1].params[r], ref, sizeof(ref));
    }
    tu_watchdog(0);
}

static void test_description_mismatch(void **state) {
    static const int two_two[2] = {2, 2};
    worker ws[2];
    double t0 = dsgd_now();
    int i;
    (void)state;
    arm();
    init_workers(ws, 2, DSGD_ALLREDUCE_RING, 0);
    ws[1].d.optimizer.lr = 0.2f;
    run_workers(ws, two_two, 2);
    for (i = 0; i < 2; ++i) {
        assert_int_equal(ws[i].create_res, DSGD_ERR_INVALID_ARGUMENT);
        if (!strstr(ws[i].create_msg, "rank 2 describes another model, optimizer or strategy"))
            fail_msg("worker %d: %s", i, ws[i].create_msg);
    }
    assert_true(dsgd_now() - t0 < 10.0); /* no deadline waited out */
    printf("    mismatch: %s\n", ws[0].create_msg);
    tu_watchdog(0);
}

static void test_agreed_failure(void **state) {
    static const int two_two[2] = {2, 2};
    worker ws[2];
    int i, step;
    (void)state;
    arm();
    init_workers(ws, 2, DSGD_ALLREDUCE_RING, 0);
    ws[0].bad_label_step = 3;
    ws[1].bad_label_step = 3; /* the same global batch on every worker */
    run_workers(ws, two_two, 2);
    for (i = 0; i < 2; ++i) {
        for (step = 0; step < STEPS; ++step)
            assert_int_equal(ws[i].step_res[step], step != 3 ? DSGD_OK
                                                   : i == 0 ? DSGD_ERR_INVALID_ARGUMENT /* its own */
                                                            : DSGD_ERR_ABORTED); /* "replica 0 failed" */
        assert_memory_equal(ws[i].params[0], ws[0].params[0], sizeof(ws[0].params[0]));
        assert_memory_equal(ws[i].params[1], ws[0].params[0], sizeof(ws[0].params[0]));
    }
    tu_watchdog(0);
}

static void test_misuse(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[W], gap[2];
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    int i;
    (void)state;
    TU_OK(ctx, dsgd_loopback_create(ctx, W, &hub));
    for (i = 0; i < W; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    d = base_desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 2, DSGD_ALLREDUCE_RING);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s)); /* no endpoints */
    gap[0] = eps[0];
    gap[1] = eps[2];
    d.endpoints = gap;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "endpoints[1] is rank 2 of 4; replica 1 needs rank 1 of 4"));
    d.endpoints = eps;
    d.gradient_path = DSGD_GRADIENTS_DEVICE;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    d = base_desc(DSGD_STRATEGY_MIRRORED, 2, DSGD_ALLREDUCE_RING);
    d.endpoints = eps;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "MULTI_WORKER_MIRRORED"));
    /* a single worker holding the whole group */
    d = base_desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 4, DSGD_ALLREDUCE_RING);
    d.endpoints = eps;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    assert_int_equal(dsgd_strategy_num_replicas_in_sync(s), 4);
    TU_OK(ctx, dsgd_strategy_train_step(s, g_x[0], g_y[0], count_of(0), NULL));
    dsgd_strategy_destroy(s);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

/* ------------------------------------------------------- checkpoints */

/* Workers of `split`, RING, training steps [from, STEPS). */
static void ck_init(worker *ws, const int *split, int nw, int from) {
    int i;
    (void)split;
    init_workers(ws, nw, DSGD_ALLREDUCE_RING, 0);
    for (i = 0; i < nw; ++i) ws[i].first_step = from;
}

static void ck_expect_ok(const worker *ws, int nw, int restored, int saved) {
    int i, step;
    for (i = 0; i < nw; ++i) {
        if (ws[i].create_res != DSGD_OK) fail_msg("worker %d: %s", i, ws[i].create_msg);
        if (restored && ws[i].restore_res != DSGD_OK) fail_msg("worker %d restore: %s", i, ws[i].restore_msg);
        if (saved && ws[i].save_res != DSGD_OK) fail_msg("worker %d save: %s", i, ws[i].save_msg);
        for (step = ws[i].first_step; step < ws[i].last_step; ++step) assert_int_equal(ws[i].step_res[step], DSGD_OK);
        assert_int_equal(ws[i].metrics_res, DSGD_OK);
    }
}

/* Every replica of every worker holds `want`, bit for bit, and the metrics
   are `mt`: bit for bit in the saving run's layout (exact), else within
   1e-6 (another layout sums them in another order). */
static void ck_expect_bits(const worker *ws, const int *split, int nw, const float *want, const dsgd_metrics *mt,
                           int exact, const char *what) {
    int i, r;
    for (i = 0; i < nw; ++i) {
        for (r = 0; r < split[i]; ++r)
            if (memcmp(ws[i].params[r], want, sizeof(float) * NP) != 0)
                fail_msg("%s: worker %d replica %d differs from the run never interrupted (rel err %.3g)", what, i, r,
                         tu_rel_err(ws[i].params[r], want, NP));
        if (exact ? memcmp(&ws[i].train, mt, sizeof(*mt)) != 0
                  : ws[i].train.count != mt->count || fabs(ws[i].train.loss_sum - mt->loss_sum) > 1e-6 * mt->loss_sum ||
                        fabs(ws[i].train.correct - mt->correct) > 1e-6 * mt->correct)
            fail_msg("%s: worker %d metrics %.9g %.9g %.9g, want %.9g %.9g %.9g", what, i, ws[i].train.loss_sum,
                     ws[i].train.correct, ws[i].train.count, mt->loss_sum, mt->correct, mt->count);
    }
    printf("    %s: bitwise equal to the run never interrupted\n", what);
}

/* Workers of `split` restore path and train steps 5..9: `want` and `mt` expected (see ck_expect_bits). */
static void ck_resume(worker *b, const int *split, int nw, const char *path, const float *want,
                      const dsgd_metrics *mt, int exact, const char *what) {
    int i;
    ck_init(b, split, nw, 5);
    for (i = 0; i < nw; ++i) b[i].restore_path = path;
    run_workers(b, split, nw);
    ck_expect_ok(b, nw, 1, 0);
    ck_expect_bits(b, split, nw, want, mt, exact, what);
}

static void test_checkpoint_across_workers(void **state) {
    static const int two_two[2] = {2, 2}, ones[4] = {1, 1, 1, 1}, four[1] = {4}, one_one[2] = {1, 1};
    char dir[64], path[128], path4[128], bad[160];
    worker a[2], b[4], m5[2];
    dsgd_metrics mt;
    int i;
    (void)state;
    arm();
    tu_mkdtemp(dir);
    snprintf(path, sizeof(path), "%s/w.ckpt", dir);
    snprintf(path4, sizeof(path4), "%s/one.ckpt", dir);
    /* A: 2 x 2 train 0..9, saving before step 5 */
    ck_init(a, two_two, 2, 0);
    for (i = 0; i < 2; ++i) {
        a[i].save_path = path;
        a[i].save_at = 5;
    }
    run_workers(a, two_two, 2);
    ck_expect_ok(a, 2, 0, 1);
    mt = a[0].train;
    assert_memory_equal(&a[1].train, &mt, sizeof(mt));
    /* 2 x 2, 4 x 1 and 1 x 4 restore and train 5..9 */
    ck_resume(b, two_two, 2, path, a[0].params[0], &mt, 1, "2 x 2 saved, 2 x 2 restored");
    ck_resume(b, ones, 4, path, a[0].params[0], &mt, 0, "2 x 2 saved, 4 x 1 restored");
    ck_resume(b, four, 1, path, a[0].params[0], &mt, 0, "2 x 2 saved, 1 x 4 restored");
    /* 1 x 4 saves (one process), 2 x 2 restores */
    ck_init(b, four, 1, 0);
    b[0].save_path = path4;
    b[0].save_at = 5;
    run_workers(b, four, 1);
    ck_expect_ok(b, 1, 0, 1);
    assert_memory_equal(b[0].saved, a[0].saved, sizeof(a[0].saved));
    ck_resume(b, two_two, 2, path4, a[0].params[0], &mt, 1, "1 x 4 saved, 2 x 2 restored");
    /* another group size: 2 x 1 restore the weights exactly, the metrics summed */
    ck_init(m5, two_two, 2, 0);
    for (i = 0; i < 2; ++i) m5[i].last_step = 5;
    run_workers(m5, two_two, 2);
    ck_expect_ok(m5, 2, 0, 0);
    ck_init(b, one_one, 2, 5);
    for (i = 0; i < 2; ++i) {
        b[i].restore_path = path;
        b[i].last_step = 5; /* no steps: take the restored metrics */
    }
    run_workers(b, one_one, 2);
    ck_expect_ok(b, 2, 1, 0);
    for (i = 0; i < 2; ++i) {
        assert_memory_equal(b[i].restored, a[0].saved, sizeof(a[0].saved));
        assert_true(b[i].train.count == m5[0].train.count);
        TU_NEAR(b[i].train.loss_sum, m5[0].train.loss_sum, 1e-6 * m5[0].train.loss_sum);
        TU_NEAR(b[i].train.correct, m5[0].train.correct, 1e-6 * m5[0].train.correct + 1e-9);
    }
    printf("    2 x 2 saved, 2 x 1 restored: step-5 weights exact, metrics %.0f samples\n", b[0].train.count);
    /* a file missing on worker 1: every worker fails, nothing touched, both train on */
    snprintf(bad, sizeof(bad), "%s/missing.ckpt", dir);
    ck_init(b, two_two, 2, 0);
    b[0].restore_path = path;
    b[1].restore_path = bad;
    b[0].last_step = b[1].last_step = 2;
    run_workers(b, two_two, 2);
    assert_int_equal(b[0].restore_res, DSGD_ERR_IO);
    assert_int_equal(b[1].restore_res, DSGD_ERR_IO);
    if (!strstr(b[0].restore_msg, "rank 2 failed checking the checkpoint")) fail_msg("worker 0: %s", b[0].restore_msg);
    if (!strstr(b[1].restore_msg, "missing.ckpt")) fail_msg("worker 1: %s", b[1].restore_msg);
    for (i = 0; i < 2; ++i) assert_memory_equal(b[i].restored, b[0].restored, sizeof(b[0].restored));
    assert_memory_not_equal(b[0].restored, a[0].saved, sizeof(a[0].saved)); /* untouched: the initial weights */
    ck_expect_ok(b, 2, 0, 0);
    printf("    missing on one worker: %s\n", b[0].restore_msg);
    /* a save into a missing directory: every worker fails */
    snprintf(bad, sizeof(bad), "%s/no/such/dir.ckpt", dir);
    ck_init(b, two_two, 2, 0);
    for (i = 0; i < 2; ++i) {
        b[i].save_path = bad;
        b[i].save_at = 1;
        b[i].last_step = 2;
    }
    run_workers(b, two_two, 2);
    for (i = 0; i < 2; ++i) assert_int_equal(b[i].save_res, DSGD_ERR_IO);
    if (!strstr(b[1].save_msg, "rank 0 failed writing the checkpoint")) fail_msg("worker 1: %s", b[1].save_msg);
    ck_expect_ok(b, 2, 0, 0);
    tu_rmdir_files(dir);
    tu_watchdog(0);
}

static int setup(void **state) {
    (void)state;
    make_data();
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitwise_like_mirrored),
        cmocka_unit_test(test_wait_report_across_workers),
        cmocka_unit_test(test_overlap_like_mirrored),
        cmocka_unit_test(test_chief_weights),
        cmocka_unit_test(test_description_mismatch),
        cmocka_unit_test(test_agreed_failure),
        cmocka_unit_test(test_checkpoint_across_workers),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
