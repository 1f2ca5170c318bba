/* test_coordinator.c - the cluster coordinator (distsgd/coordinator.h) over the
   parameter-server engine.

   The model is a small MLP (20 -> 16 relu -> 8 tanh -> 5, softmax
   cross-entropy, 517 parameters) on the tests' seeded data; closures train
   on batch i of a fixed list, chosen by their own argument.

   What is asserted, and how:
   - ASYNC with one worker and the variables on two servers trains, closure
     after closure, the bits of one model trained with dsgd_optimizer_step on
     the same batches (SGD and momentum): the servers apply the optimizer's
     own code to their shards.
   - SYNC with two workers, each step's closures pinned one per worker
     (dsgd_cluster_schedule_on), trains the mirrored strategy's weights with
     2 replicas on the same global batches, within float reassociation
     (1e-5 relative).
   - Summation only (apply ON_WORKERS): SYNC with 3 pinned workers gives
     the bits of the servers applying (SGD and momentum); BACKUP 2 + 1 with
     free scheduling trains (pushes accepted = 2 per step); ASYNC refuses it.
   - Every scheduled closure runs exactly once (a counter per closure) with
     4 workers; each server applied one push per closure (its counters), and
     its staleness histogram sums to its applied pushes.
   - A closure that fails: join returns its code and a message naming the
     closure and its worker, fetch returns it too, the others succeed, and
     the cluster goes on. A failure not yet surfaced comes back from the
     next schedule instead, which then queues nothing.
   - A worker killed between closures: every closure still runs exactly once,
     on the others. A worker that kills itself inside a closure (before its
     push): that closure runs again elsewhere (at least once: here twice),
     join succeeds, one worker fewer is alive. With no worker left, join and
     schedule fail instead of waiting.
   - dsgd_cluster_workers_alive after a clean shutdown still counts the
     workers that were neither lost nor failed (a closure's error does not
     make its worker failed), under both ways of applying the update.
   - A server that dies (its endpoint starts failing after some messages):
     join returns an error that names that server, within the deadline;
     the workers it stopped no longer count as alive.
   - Per-worker datasets: 3 workers drawing 2 epochs of a 100-sample dataset
     in batches of 8 each see 4 batches an epoch, disjoint across workers (96
     distinct samples an epoch), another permutation in epoch 1, the same
     shards for the same seed and others for another seed.
   - Convergence: async with 2 servers and 4 workers (momentum 0.5) trains the
     vendored UCI digits (1500 train, 297 test, a 64-32-10 MLP, 12 epochs of
     batches of 16 per worker) to >= 90% test accuracy, every push applied.
     (examples/sync_vs_async.c checks >= 85% on Fashion-MNIST.)
   - Bad arguments and calls out of order return their codes.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <signal.h>
#include <time.h>

enum { IN = 20, OUT = 5, NPARAMS = 20 * 16 + 16 + 16 * 8 + 8 + 8 * 5 + 5, B = 8, NBATCH = 64 };

static const dsgd_layer_desc LAYERS[3] = {
    {16, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

static float g_x[NBATCH][B * IN], g_y[NBATCH][B];

static void make_data(void) {
    tu_rng r = tu_rng_make(31337);
    int b, i;
    for (b = 0; b < NBATCH; ++b) {
        tu_fill(&r, g_x[b], B * IN, -1.0f, 1.0f);
        for (i = 0; i < B; ++i) g_y[b][i] = (float)tu_below(&r, OUT);
    }
}

static dsgd_model_desc model_desc(void) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof(md));
    md.input_dim = IN;
    md.layers = LAYERS;
    md.num_layers = 3;
    md.max_batch = B;
    md.seed = 424242u;
    return md;
}

static dsgd_optimizer_desc opt_desc(dsgd_optimizer_kind k) {
    dsgd_optimizer_desc od;
    memset(&od, 0, sizeof(od));
    od.kind = k;
    od.lr = k == DSGD_OPT_MOMENTUM ? 0.05f : 0.1f;
    od.momentum = 0.9f;
    return od;
}

static dsgd_cluster_desc cluster_desc(int P, int W, dsgd_ps_policy policy, dsgd_optimizer_kind opt) {
    dsgd_cluster_desc d;
    memset(&d, 0, sizeof(d));
    d.ps.num_servers = P;
    d.ps.num_workers = W;
    d.ps.policy = policy;
    d.ps.optimizer = opt_desc(opt);
    d.ps.timeout_s = 10.0;
    d.model = model_desc();
    return d;
}

static dsgd_cluster *cluster_make(dsgd_ctx *ctx, const dsgd_cluster_desc *d) {
    dsgd_cluster *c = NULL;
    TU_OK(ctx, dsgd_cluster_create(ctx, d, &c));
    assert_non_null(c);
    assert_int_equal((int)dsgd_cluster_num_params(c), NPARAMS);
    return c;
}

/* ---------------------------------------------------------------- closures */

/* A closure's argument: which batch, and a run counter. */
typedef struct job {
    int batch;
    int runs;       /* atomic */
    int fail;       /* return this code instead of training (0: train) */
    int kill_self;  /* on its first run, kill its own worker before the step */
    int stop_at;    /* > 0: no step once the global step its worker last read reached it (BACKUP's stop rule) */
    dsgd_cluster *c;
    int worker;     /* atomic: the last worker that ran it */
} job;

static dsgd_result train_closure(dsgd_cluster_worker *w, void *user) {
    job *j = (job *)user;
    int run = __atomic_add_fetch(&j->runs, 1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&j->worker, dsgd_cluster_worker_id(w), __ATOMIC_SEQ_CST);
    if (j->fail)
        return dsgd_ctx_set_error(dsgd_cluster_worker_ctx(w), (dsgd_result)j->fail, "job %d failed on purpose",
                                  j->batch);
    if (j->kill_self && run == 1) dsgd_cluster_kill_worker(j->c, dsgd_cluster_worker_id(w));
    if (j->stop_at && dsgd_ps_worker_global_step(dsgd_cluster_worker_ps(w)) >= j->stop_at) return DSGD_OK;
    return dsgd_cluster_worker_train_step(w, g_x[j->batch % NBATCH], g_y[j->batch % NBATCH], B);
}

static void read_params(dsgd_ctx *ctx, dsgd_cluster *c, float *p) {
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    TU_OK(ctx, dsgd_cluster_read_params(c, p));
}

/* ---------------------------------------------------------------- tests */

static void test_async_one_worker_bitwise(void **state) {
    static const dsgd_optimizer_kind opts[2] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM};
    dsgd_ctx *ctx = tu_ctx();
    int k, i;
    (void)state;
    tu_watchdog(60);
    for (k = 0; k < 2; ++k) {
        dsgd_cluster_desc d = cluster_desc(2, 1, DSGD_PS_ASYNC, opts[k]);
        dsgd_model_desc md = model_desc();
        dsgd_optimizer_desc od = opt_desc(opts[k]);
        dsgd_model *m = NULL;
        dsgd_optimizer *o = NULL;
        dsgd_cluster *c;
        job jobs[20];
        float pc[NPARAMS], pm[NPARAMS];
        d.partitioner.kind = DSGD_PARTITIONER_FIXED_SHARDS; /* rows of each variable on both servers */
        d.partitioner.num_shards = 2;
        c = cluster_make(ctx, &d);
        memset(jobs, 0, sizeof(jobs));
        for (i = 0; i < 20; ++i) {
            jobs[i].batch = i;
            TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
        }
        TU_OK(ctx, dsgd_cluster_join(c));
        read_params(ctx, c, pc);
        TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
        TU_OK(ctx, dsgd_optimizer_create(m, &od, &o));
        for (i = 0; i < 20; ++i) {
            TU_OK(ctx, dsgd_model_compute_gradients(m, g_x[i], g_y[i], B, 1.0f / B));
            TU_OK(ctx, dsgd_optimizer_step(o));
        }
        TU_OK(ctx, dsgd_model_get_params(m, pm, NPARAMS));
        assert_memory_equal(pc, pm, sizeof(pc));
        {   /* and they trained: far from a fresh model's weights */
            dsgd_model *fresh = NULL;
            float p0[NPARAMS];
            TU_OK(ctx, dsgd_model_create(ctx, &md, &fresh));
            TU_OK(ctx, dsgd_model_get_params(fresh, p0, NPARAMS));
            assert_true(tu_rel_err(pc, p0, NPARAMS) > 1e-2);
            dsgd_model_destroy(fresh);
        }
        dsgd_optimizer_destroy(o);
        dsgd_model_destroy(m);
        dsgd_cluster_destroy(c);
    }
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_sync_pinned_matches_mirrored(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc d = cluster_desc(2, 2, DSGD_PS_SYNC, DSGD_OPT_MOMENTUM);
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    dsgd_cluster *c;
    job jobs[2 * 10];
    float pc[NPARAMS], pm[NPARAMS], x[2 * B * IN], y[2 * B];
    int step, w;
    double err;
    (void)state;
    tu_watchdog(60);
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    for (step = 0; step < 10; ++step)
        for (w = 0; w < 2; ++w) {
            jobs[2 * step + w].batch = 2 * step + w;
            TU_OK(ctx, dsgd_cluster_schedule_on(c, w, train_closure, &jobs[2 * step + w], NULL));
        }
    TU_OK(ctx, dsgd_cluster_join(c));
    for (step = 0; step < 20; ++step) assert_int_equal(jobs[step].worker, step % 2);
    read_params(ctx, c, pc);
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 2;
    sd.model = model_desc();
    sd.optimizer = opt_desc(DSGD_OPT_MOMENTUM);
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    for (step = 0; step < 10; ++step) {
        memcpy(x, g_x[2 * step], sizeof(g_x[0]));
        memcpy(x + B * IN, g_x[2 * step + 1], sizeof(g_x[0]));
        memcpy(y, g_y[2 * step], sizeof(g_y[0]));
        memcpy(y + B, g_y[2 * step + 1], sizeof(g_y[0]));
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 2 * B, NULL));
    }
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), pm, NPARAMS));
    err = tu_rel_err(pc, pm, NPARAMS);
    printf("    SYNC 2 workers vs mirrored N=2: rel err %.3g\n", err);
    assert_true(err <= 1e-5);
    dsgd_strategy_destroy(s);
    dsgd_cluster_destroy(c);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Summation only (desc.ps.apply ON_WORKERS): the servers only sum, each
   worker applies the optimizer to its own copy. SYNC with pinned closures
   gives the bits of the servers applying (SGD and momentum); BACKUP 2 + 1
   with free scheduling trains and its dropped pushes are counted. */
static void run_pinned(dsgd_ctx *ctx, dsgd_ps_apply apply, dsgd_optimizer_kind opt, float *pc) {
    enum { W = 3, STEPS = 8 };
    dsgd_cluster_desc d = cluster_desc(2, W, DSGD_PS_SYNC, opt);
    dsgd_cluster *c;
    dsgd_ps_server_stats st;
    job jobs[W * STEPS];
    int step, w;
    d.ps.apply = apply;
    d.partitioner.kind = DSGD_PARTITIONER_FIXED_SHARDS;
    d.partitioner.num_shards = 2;
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    for (step = 0; step < STEPS; ++step)
        for (w = 0; w < W; ++w) {
            jobs[W * step + w].batch = W * step + w;
            TU_OK(ctx, dsgd_cluster_schedule_on(c, w, train_closure, &jobs[W * step + w], NULL));
        }
    TU_OK(ctx, dsgd_cluster_join(c));
    read_params(ctx, c, pc);
    for (w = 0; w < 2; ++w) {
        dsgd_cluster_server_stats(c, w, &st);
        assert_true(st.version == STEPS && st.pushes_applied == W * STEPS);
    }
    dsgd_cluster_destroy(c);
}

static void test_sum_only(void **state) {
    static const dsgd_optimizer_kind opts[2] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md = model_desc();
    dsgd_model *fresh = NULL;
    float on_servers[NPARAMS], on_workers[NPARAMS], p0[NPARAMS];
    int k, i;
    (void)state;
    tu_watchdog(60);
    TU_OK(ctx, dsgd_model_create(ctx, &md, &fresh));
    TU_OK(ctx, dsgd_model_get_params(fresh, p0, NPARAMS));
    for (k = 0; k < 2; ++k) {
        run_pinned(ctx, DSGD_PS_APPLY_ON_SERVERS, opts[k], on_servers);
        run_pinned(ctx, DSGD_PS_APPLY_ON_WORKERS, opts[k], on_workers);
        assert_memory_equal(on_workers, on_servers, sizeof(on_servers));
        assert_true(tu_rel_err(on_workers, p0, NPARAMS) > 1e-2); /* trained */
    }
    {   /* BACKUP 2 + 1, any worker takes any closure; closures stop on the
           global step (a fixed number of them may leave a closure waiting
           for a step that the others, done, never complete) */
        dsgd_cluster_desc d = cluster_desc(1, 3, DSGD_PS_BACKUP, DSGD_OPT_MOMENTUM);
        dsgd_cluster *c;
        dsgd_ps_server_stats st;
        job jobs[90];
        d.ps.backup_workers = 1;
        d.ps.apply = DSGD_PS_APPLY_ON_WORKERS;
        c = cluster_make(ctx, &d);
        memset(jobs, 0, sizeof(jobs));
        for (i = 0; i < 90; ++i) {
            jobs[i].batch = i;
            jobs[i].stop_at = 10;
            TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
        }
        TU_OK(ctx, dsgd_cluster_join(c));
        read_params(ctx, c, on_workers);
        dsgd_cluster_server_stats(c, 0, &st);
        printf("    BACKUP 2 + 1, workers apply: %lld steps, %lld pushes applied, %lld dropped\n", (long long)st.version,
               (long long)st.pushes_applied, (long long)st.stale_dropped);
        assert_true(st.pushes_applied + st.stale_dropped <= 90 && st.pushes_applied == 2 * st.version);
        assert_true(st.version >= 10);
        assert_true(tu_rel_err(on_workers, p0, NPARAMS) > 1e-2);
        for (i = 0; i < 90; ++i) assert_int_equal(jobs[i].runs, 1);
        dsgd_cluster_destroy(c);
    }
    {   /* ASYNC refuses it */
        dsgd_cluster_desc d = cluster_desc(1, 2, DSGD_PS_ASYNC, DSGD_OPT_SGD);
        dsgd_cluster *c = NULL;
        d.ps.apply = DSGD_PS_APPLY_ON_WORKERS;
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_create(ctx, &d, &c));
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "no step whose sum to publish"));
        assert_null(c);
    }
    dsgd_model_destroy(fresh);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_every_closure_once(void **state) {
    enum { N = 200 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc d = cluster_desc(2, 4, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_cluster *c;
    static job jobs[N];
    int i, s, b;
    (void)state;
    tu_watchdog(120);
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    for (i = 0; i < N; ++i) {
        int64_t h;
        jobs[i].batch = i;
        TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], &h));
        assert_int_equal((int)h, i);
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    for (i = 0; i < N; ++i) assert_int_equal(jobs[i].runs, 1);
    TU_OK(ctx, dsgd_cluster_fetch(c, N - 1));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    for (s = 0; s < 2; ++s) {
        dsgd_ps_server_stats st;
        int64_t sum = 0;
        dsgd_cluster_server_stats(c, s, &st);
        assert_int_equal((int)st.pushes_applied, N);
        assert_int_equal((int)st.version, N);
        for (b = 0; b < st.staleness_bins; ++b) sum += st.staleness_hist[b];
        assert_int_equal((int)sum, N);
        printf("    server %d: %lld pushes, staleness mean %.2f max %lld\n", s, (long long)st.pushes_applied,
               st.staleness_mean, (long long)st.staleness_max);
    }
    dsgd_cluster_destroy(c);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_failing_closure(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc d = cluster_desc(1, 2, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_cluster *c;
    job jobs[14];
    int i;
    (void)state;
    tu_watchdog(60);
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    for (i = 0; i < 10; ++i) {
        jobs[i].batch = i;
        jobs[i].fail = i == 5 ? (int)DSGD_ERR_SHAPE : 0;
        TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
    }
    TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_cluster_join(c));
    printf("    join: %s\n", dsgd_ctx_last_error(ctx));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "closure #5 on worker"));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "job 5 failed on purpose"));
    TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_cluster_fetch(c, 5));
    TU_OK(ctx, dsgd_cluster_fetch(c, 4));
    for (i = 0; i < 10; ++i) assert_int_equal(jobs[i].runs, 1);
    /* a failure not yet surfaced comes back from the next schedule, which
       then queues nothing; once surfaced it is not returned again */
    jobs[10].batch = 10;
    jobs[10].fail = (int)DSGD_ERR_BACKEND;
    TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[10], NULL));
    TU_ERR(ctx, DSGD_ERR_BACKEND, dsgd_cluster_fetch(c, 10));
    {
        int64_t h = 99;
        TU_ERR(ctx, DSGD_ERR_BACKEND, dsgd_cluster_schedule(c, train_closure, &jobs[11], &h));
        assert_int_equal((int)h, -1);
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "dsgd_cluster_schedule: closure #10 on worker"));
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    assert_int_equal(jobs[11].runs, 0);
    /* the cluster goes on, and a later join reports only later failures */
    for (i = 12; i < 14; ++i) {
        jobs[i].batch = i;
        TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    assert_int_equal(dsgd_cluster_workers_alive(c), 2);
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    dsgd_cluster_destroy(c);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_lost_workers(void **state) {
    enum { N = 40 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc d = cluster_desc(2, 3, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_cluster *c;
    static job jobs[N];
    int i;
    (void)state;
    tu_watchdog(120);
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    /* between closures: worker 1 is lost after the first 10 */
    for (i = 0; i < 10; ++i) {
        jobs[i].batch = i;
        TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    TU_OK(ctx, dsgd_cluster_kill_worker(c, 1));
    for (i = 10; i < 30; ++i) {
        jobs[i].batch = i;
        TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    for (i = 0; i < 30; ++i) assert_int_equal(jobs[i].runs, 1);
    for (i = 10; i < 30; ++i) assert_true(jobs[i].worker != 1);
    assert_int_equal(dsgd_cluster_workers_alive(c), 2);
    /* inside a closure, before its push: it runs again on the other worker */
    for (i = 30; i < N; ++i) {
        jobs[i].batch = i;
        jobs[i].c = c;
        jobs[i].kill_self = i == 33;
        TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
    }
    TU_OK(ctx, dsgd_cluster_join(c));
    for (i = 30; i < N; ++i) assert_int_equal(jobs[i].runs, i == 33 ? 2 : 1);
    assert_int_equal(dsgd_cluster_workers_alive(c), 1);
    TU_OK(ctx, dsgd_cluster_fetch(c, 33));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    dsgd_cluster_destroy(c);

    /* no worker left: schedule and join fail, nothing waits */
    d = cluster_desc(1, 1, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    jobs[0].c = c;
    jobs[0].kill_self = 1;
    TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[0], NULL));
    TU_ERR(ctx, DSGD_ERR_ABORTED, dsgd_cluster_join(c));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "no worker is left"));
    TU_ERR(ctx, DSGD_ERR_ABORTED, dsgd_cluster_fetch(c, 0));
    TU_ERR(ctx, DSGD_ERR_ABORTED, dsgd_cluster_schedule(c, train_closure, &jobs[1], NULL));
    dsgd_cluster_destroy(c);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* A transport whose server-1 endpoint dies after a number of probes: every
   later probe fails, as if the machine had gone. */
typedef struct dying {
    dsgd_transport_i inner;
    int probes_left;
} dying;

static dsgd_result dying_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    dying *d = (dying *)impl;
    return d->inner.send(d->inner.impl, dst, tag, buf, bytes, deadline);
}

static dsgd_result dying_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    dying *d = (dying *)impl;
    return d->inner.recv(d->inner.impl, src, tag, buf, bytes, deadline);
}

static dsgd_result dying_probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    dying *d = (dying *)impl;
    if (d->probes_left-- <= 0) {
        *src = -1;
        return DSGD_ERR_ABORTED;
    }
    return d->inner.probe(d->inner.impl, deadline, src, tag, bytes);
}

/* After a clean shutdown the workers that were neither lost nor failed
   still count: 4 workers, one killed, one whose closure fails (its engine
   is fine) leave 3, with the servers applying and with the workers. */
static void test_workers_alive_after_shutdown(void **state) {
    enum { W = 4, N = 40 };
    static const dsgd_ps_apply applies[2] = {DSGD_PS_APPLY_ON_SERVERS, DSGD_PS_APPLY_ON_WORKERS};
    dsgd_ctx *ctx = tu_ctx();
    static job jobs[N];
    int a, i;
    (void)state;
    tu_watchdog(120);
    for (a = 0; a < 2; ++a) {
        dsgd_cluster_desc d = cluster_desc(2, W, DSGD_PS_BACKUP, DSGD_OPT_SGD);
        dsgd_cluster *c;
        float p[NPARAMS];
        d.ps.apply = applies[a];
        d.ps.backup_workers = 1; /* 3 pushes a step: the killed worker's step is not waited for */
        c = cluster_make(ctx, &d);
        memset(jobs, 0, sizeof(jobs));
        assert_int_equal(dsgd_cluster_workers_alive(c), W);
        for (i = 0; i < N; ++i) { /* closures stop on the global step, BACKUP's rule */
            jobs[i].batch = i;
            jobs[i].stop_at = 3;
            TU_OK(ctx, dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL));
        }
        TU_OK(ctx, dsgd_cluster_join(c));
        TU_OK(ctx, dsgd_cluster_kill_worker(c, 2));
        assert_int_equal(dsgd_cluster_workers_alive(c), W - 1);
        jobs[0].fail = (int)DSGD_ERR_SHAPE; /* a closure's error: its worker goes on */
        TU_OK(ctx, dsgd_cluster_schedule_on(c, 0, train_closure, &jobs[0], NULL));
        TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_cluster_join(c));
        assert_int_equal(dsgd_cluster_workers_alive(c), W - 1);
        TU_OK(ctx, dsgd_cluster_shutdown(c));
        assert_int_equal(dsgd_cluster_workers_alive(c), W - 1);
        TU_OK(ctx, dsgd_cluster_read_params(c, p));
        assert_int_equal(dsgd_cluster_workers_alive(c), W - 1);
        dsgd_cluster_destroy(c);
    }
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_server_dies(void **state) {
    enum { P = 2, W = 2, N = 40 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc d = cluster_desc(P, W, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[P + W];
    dying dy;
    dsgd_cluster *c;
    static job jobs[N];
    double t0;
    int i;
    (void)state;
    tu_watchdog(60);
    TU_OK(ctx, dsgd_loopback_create(ctx, P + W, &hub));
    for (i = 0; i < P + W; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    dy.inner = eps[1];
    dy.probes_left = 12;
    eps[1].impl = &dy;
    eps[1].send = dying_send;
    eps[1].recv = dying_recv;
    eps[1].probe = dying_probe;
    eps[1].sendrecv = NULL;
    eps[1].sendrecv_reduce = NULL;
    eps[1].sendrecv_upto = NULL;
    eps[1].share = NULL;
    eps[1].unshare = NULL;
    eps[1].error_message = NULL;
    d.endpoints = eps;
    c = cluster_make(ctx, &d);
    memset(jobs, 0, sizeof(jobs));
    t0 = dsgd_now();
    for (i = 0; i < N; ++i) {
        jobs[i].batch = i;
        if (dsgd_cluster_schedule(c, train_closure, &jobs[i], NULL) != DSGD_OK) break;
    }
    assert_true(dsgd_cluster_join(c) != DSGD_OK);
    printf("    join after %.3f s: %s\n", dsgd_now() - t0, dsgd_ctx_last_error(ctx));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "server 1 failed"));
    assert_true(dsgd_now() - t0 < 5.0);
    TU_ERR(ctx, DSGD_ERR_ABORTED, dsgd_cluster_schedule(c, train_closure, &jobs[0], NULL));
    assert_true(dsgd_cluster_shutdown(c) != DSGD_OK);
    assert_int_equal(dsgd_cluster_workers_alive(c), 0);
    dsgd_cluster_destroy(c);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Per-worker datasets: sample i has x[0] = i. Each closure records the
   samples of its worker's next batch. */
enum { DS_N = 100, DS_B = 8, DS_W = 3, DS_PER = (DS_N / DS_B) / DS_W };
static int g_seen[2][DS_W][DS_PER][DS_B]; /* [epoch][worker][k][sample] */
static int g_next_k[DS_W];

static dsgd_result shard_closure(dsgd_cluster_worker *w, void *user) {
    const float *x, *y;
    int count = 0, i, id = dsgd_cluster_worker_id(w), k = g_next_k[id]++;
    uint64_t epoch = 99;
    dsgd_result r = dsgd_cluster_worker_next_batch(w, &x, &y, &count, &epoch);
    (void)user;
    if (r != DSGD_OK) return r;
    if (count != DS_B || epoch != (uint64_t)(k / DS_PER) || epoch > 1)
        return dsgd_ctx_set_error(dsgd_cluster_worker_ctx(w), DSGD_ERR_STATE, "batch %d: count %d epoch %llu", k, count,
                                  (unsigned long long)epoch);
    for (i = 0; i < count; ++i) g_seen[epoch][id][k % DS_PER][i] = (int)x[i * IN];
    return dsgd_cluster_worker_train_step(w, x, y, count);
}

static void shard_run(dsgd_ctx *ctx, const dsgd_dataset *ds, uint64_t seed) {
    dsgd_cluster_desc d = cluster_desc(1, DS_W, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_cluster *c = cluster_make(ctx, &d);
    int w, k;
    memset(g_seen, 0xff, sizeof(g_seen));
    memset(g_next_k, 0, sizeof(g_next_k));
    TU_OK(ctx, dsgd_cluster_set_dataset(c, ds, DS_B, seed));
    for (k = 0; k < 2 * DS_PER; ++k)
        for (w = 0; w < DS_W; ++w) TU_OK(ctx, dsgd_cluster_schedule_on(c, w, shard_closure, NULL, NULL));
    TU_OK(ctx, dsgd_cluster_join(c));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    dsgd_cluster_destroy(c);
}

static void test_per_worker_dataset(void **state) {
    static int first[2][DS_W][DS_PER][DS_B];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_dataset ds, empty;
    dsgd_cluster_desc d = cluster_desc(1, DS_W, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_cluster *c;
    const float *x, *y;
    int count, e, i, hits[DS_N], same_order = 1;
    tu_rng r = tu_rng_make(5);
    (void)state;
    tu_watchdog(60);
    TU_OK(ctx, dsgd_dataset_alloc(ctx, DS_N, IN, 1, OUT, &ds));
    for (i = 0; i < DS_N; ++i) {
        tu_fill(&r, ds.x + (size_t)i * IN, IN, -1.0f, 1.0f);
        ds.x[(size_t)i * IN] = (float)i;
        ds.y[i] = (float)(i % OUT);
    }
    shard_run(ctx, &ds, 77);
    memcpy(first, g_seen, sizeof(first));
    for (e = 0; e < 2; ++e) { /* each epoch: 12 batches of 8, 4 per worker, disjoint, 96 distinct samples */
        const int *seen = &g_seen[e][0][0][0];
        memset(hits, 0, sizeof(hits));
        for (i = 0; i < DS_W * DS_PER * DS_B; ++i) {
            assert_true(seen[i] >= 0 && seen[i] < DS_N);
            hits[seen[i]]++;
        }
        count = 0;
        for (i = 0; i < DS_N; ++i) {
            assert_true(hits[i] <= 1);
            count += hits[i];
        }
        assert_int_equal(count, DS_W * DS_PER * DS_B);
    }
    for (i = 0; i < DS_W * DS_PER * DS_B; ++i) same_order &= (&g_seen[0][0][0][0])[i] == (&g_seen[1][0][0][0])[i];
    assert_false(same_order); /* epoch 1 is another permutation */
    shard_run(ctx, &ds, 77); /* the same seed: the same shards */
    assert_memory_equal(first, g_seen, sizeof(first));
    shard_run(ctx, &ds, 78);
    assert_true(memcmp(first, g_seen, sizeof(first)) != 0);

    c = cluster_make(ctx, &d);
    memset(&empty, 0, sizeof(empty));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_set_dataset(c, &empty, DS_B, 1));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_set_dataset(c, &ds, B + 1, 1)); /* above max_batch */
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_set_dataset(c, &ds, 0, 1));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_cluster_set_dataset(c, &ds, DS_B, 1));
    dsgd_cluster_destroy(c);
    assert_int_equal(dsgd_cluster_worker_next_batch(NULL, &x, &y, &count, NULL), DSGD_ERR_INVALID_ARGUMENT);
    dsgd_dataset_free(&ds);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* Convergence: async parameter servers train the vendored UCI digits. */
static dsgd_result digits_closure(dsgd_cluster_worker *w, void *user) {
    const float *x, *y;
    int n = 0;
    dsgd_result r = dsgd_cluster_worker_next_batch(w, &x, &y, &n, NULL);
    (void)user;
    return r != DSGD_OK ? r : dsgd_cluster_worker_train_step(w, x, y, n);
}

static void test_async_converges_on_digits(void **state) {
    static const dsgd_layer_desc layers[2] = {{32, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    enum { EPOCHS = 12, BATCH = 16, W = 4 };
    dsgd_ctx *ctx = tu_ctx();
    dsgd_csv_desc cd;
    dsgd_dataset all, train, test;
    dsgd_cluster_desc d = cluster_desc(2, W, DSGD_PS_ASYNC, DSGD_OPT_MOMENTUM);
    dsgd_cluster *c;
    dsgd_model *m = NULL;
    dsgd_metrics mt;
    dsgd_ps_server_stats st;
    float *p;
    char path[256];
    size_t k, closures;
    double acc;
    (void)state;
    tu_watchdog(120);
    if (!tu_find_repo_file("examples/data/digits.csv", path, sizeof path))
        fail_msg("examples/data/digits.csv not found (run from the repository root)");
    memset(&cd, 0, sizeof(cd));
    cd.feature_scale = 1.0f / 16.0f;
    TU_OK(ctx, dsgd_dataset_load_csv(ctx, path, &cd, &all));
    TU_OK(ctx, dsgd_dataset_split(ctx, &all, 1500, 3, &train, &test));
    d.model.input_dim = 64;
    d.model.layers = layers;
    d.model.num_layers = 2;
    d.model.max_batch = 300;
    /* momentum 0.5: asynchrony adds implicit momentum (Mitliagkas et al.
       2016), and with 0.9 some thread schedules (TSan's) end at 0.81 */
    d.ps.optimizer.lr = 0.1f;
    d.ps.optimizer.momentum = 0.5f;
    c = NULL;
    TU_OK(ctx, dsgd_cluster_create(ctx, &d, &c));
    TU_OK(ctx, dsgd_cluster_set_dataset(c, &train, BATCH, 11));
    closures = (size_t)EPOCHS * (train.n / BATCH / W) * W;
    for (k = 0; k < closures; ++k) TU_OK(ctx, dsgd_cluster_schedule(c, digits_closure, NULL, NULL));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    p = tu_floats(dsgd_cluster_num_params(c));
    TU_OK(ctx, dsgd_cluster_read_params(c, p));
    dsgd_cluster_server_stats(c, 0, &st);
    d.model.backend = NULL;
    TU_OK(ctx, dsgd_model_create(ctx, &d.model, &m));
    TU_OK(ctx, dsgd_model_set_params(m, p, dsgd_model_num_params(m)));
    TU_OK(ctx, dsgd_model_eval_batch(m, test.x, test.y, (int)test.n));
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt));
    acc = mt.correct / mt.count;
    printf("    async PS, 2 servers x 4 workers, %zu pushes: digits test accuracy %.4f (staleness mean %.2f, max %lld)\n",
           closures, acc, st.staleness_mean, (long long)st.staleness_max);
    assert_int_equal((int)st.pushes_applied, (int)closures);
    assert_true(acc >= 0.90);
    free(p);
    dsgd_model_destroy(m);
    dsgd_cluster_destroy(c);
    dsgd_dataset_free(&all);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

static void test_bad_arguments(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc d = cluster_desc(0, 2, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    dsgd_cluster *c = NULL;
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[3];
    float p[NPARAMS];
    int i;
    job j;
    (void)state;
    tu_watchdog(60);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_create(ctx, &d, &c));
    assert_null(c);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "0 servers"));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_create(ctx, NULL, &c));
    assert_int_equal(dsgd_cluster_create(NULL, &d, &c), DSGD_ERR_INVALID_ARGUMENT);
    d = cluster_desc(1, 2, DSGD_PS_ASYNC, DSGD_OPT_SGD);
    TU_OK(ctx, dsgd_loopback_create(ctx, 3, &hub));
    for (i = 0; i < 3; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    eps[2].probe = NULL;
    d.endpoints = eps;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_create(ctx, &d, &c));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "endpoints[2]"));
    d.endpoints = NULL;
    d.ps.optimizer.clip_norm = 1.0f; /* the engine's rule */
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_create(ctx, &d, &c));
    d.ps.optimizer.clip_norm = 0.0f;
    c = cluster_make(ctx, &d);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_schedule(c, NULL, NULL, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_schedule_on(c, 2, train_closure, &j, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_schedule_on(c, -1, train_closure, &j, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_fetch(c, 0));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cluster_kill_worker(c, 5));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_cluster_read_params(c, p));
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_cluster_shutdown(c));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_cluster_schedule(c, train_closure, &j, NULL));
    TU_OK(ctx, dsgd_cluster_read_params(c, p));
    dsgd_cluster_destroy(c);
    dsgd_cluster_destroy(NULL);
    assert_int_equal(dsgd_cluster_join(NULL), DSGD_ERR_INVALID_ARGUMENT);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_async_one_worker_bitwise),
        cmocka_unit_test(test_sync_pinned_matches_mirrored),
        cmocka_unit_test(test_sum_only),
        cmocka_unit_test(test_every_closure_once),
        cmocka_unit_test(test_failing_closure),
        cmocka_unit_test(test_lost_workers),
        cmocka_unit_test(test_workers_alive_after_shutdown),
        cmocka_unit_test(test_server_dies),
        cmocka_unit_test(test_per_worker_dataset),
        cmocka_unit_test(test_async_converges_on_digits),
        cmocka_unit_test(test_bad_arguments),
    };
    make_data();
    return cmocka_run_group_tests(tests, NULL, NULL);
}
