/* test_ps.c - the parameter-server engine (distsgd/ps.h and its parts
   ps_server.h and ps_worker.h).

   Servers and workers are ranks of one loopback hub, one pthread each.
     - No lost update, no double update: 2 servers, 4 workers x 1000 ASYNC
       pushes (250 under make test; dsgd_ps_worker_run: exactly that many
       each, and one pull more) of small integer gradients (SGD, lr 1)
       over a transport wrapper that drops 10% of the acknowledgements
       (forcing resends), sends 5% of the pushes twice and delays others;
       the final parameters equal the initial ones minus the sum of every
       pushed gradient exactly, and the servers' duplicates equal the
       injected copies plus the resends.
     - SYNC: after each round every worker pulls the same bits, equal to the
       closed form of the integer pushes.
     - SSP: no pull at clock c returns before every worker started clock
       c - s; what it reads holds every update of clocks <= c - s - 1 and none
       of clocks >= c (each (worker, clock) pushes a signature into a float
       of its own); s = 0 gives SYNC's bits on random float gradients with
       Adam, and both equal dsgd_optimizer_step on a model fed the rank-order
       mean.
     - BACKUP: with a slow worker and b = 1 the stale pushes are dropped,
       counted, never applied (signatures); b = 0 gives SYNC's bits.
     - Summation only (apply ON_WORKERS, BytePS): SYNC with the workers
       applying SGD, Nesterov momentum or Adam gives, at every round and on
       every worker, the bits of SYNC with the servers applying (random float
       gradients); SSP keeps its bound and signatures and BACKUP drops the
       same stale pushes, every worker ending with the same bits; a BACKUP
       straggler that missed 3 steps catches up on their means in order (one
       round each) and holds the others' bits at each version; ASYNC refuses
       it, its servers hold no parameters (read_params is unsupported) and
       need no initial ones. With more servers than variables (a server of
       0 floats) it trains to the servers' bits. Under SSP, a worker that
       finishes while the others still push fetches every mean first: every
       worker ends with the servers' bits and every server can be saved.
     - Staleness statistics: the histogram sums to the applied pushes; one
       worker pulling before each push has staleness 0; pushes without pulls
       have staleness 0, 1, 2.
     - Large messages (rendezvous on the loopback), ASYNC with resends and
       SYNC, end with the exact sums.
     - The loop (dsgd_ps_worker_run): SYNC gives the bits of a hand-written
       pull/push loop, and SSP s = 2 the same bits, each worker pushing
       exactly `steps` times and reading the global step the policy
       promises; BACKUP 3 + 1 over 2 servers with a straggler ends every
       server at exactly the target (servers or workers applying); the
       callbacks run in the loop's order with the worker's clock; a
       callback's error leaves the worker usable and the next run goes on
       to the same target; after_pull stops it; no_finish; bad arguments.
     - Errors: bad descs, no probe, a transport of the wrong size, wrong
       roles, push without pull, calls after finish, a missing worker (the
       server times out naming it, a waiting worker names the server), runs
       that can never finish (SYNC with a worker one clock short, BACKUP
       workers pushing a fixed number of times) stopped by the server at
       once.

   Worker threads never call cmocka's assertions (they longjmp); they record
   results that the main thread checks after joining. A watchdog (alarm)
   ends the program if a test hangs.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void sleep_us(long us) {
    struct timespec ts;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (us % 1000000) * 1000;
    nanosleep(&ts, NULL);
}

static uint64_t seed_of(uint64_t seed, int w, int k) {
    uint64_t s = seed ^ ((uint64_t)(w + 1) << 48) ^ ((uint64_t)(k + 1) << 20);
    dsgd_rng_next(&s);
    return s;
}

/* ---------------------------------------------------------------- a faulty transport */

/* Wraps a worker's loopback endpoint: drops drop_ack of the ACKs it is
   about to receive (taking them off the wire), sends dup_push of the
   pushes twice, and sleeps up to 200 us before another 20% of the pushes.
   Seeded per worker. */
typedef struct faulty {
    dsgd_transport_i in;
    uint64_t rng;
    double drop_ack, dup_push;
    int64_t dups, drops, delays;
    char scratch[4096];
} faulty;

static dsgd_result faulty_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    faulty *f = (faulty *)impl;
    dsgd_result r;
    if (DSGD_PS_TAG_TYPE(tag) == DSGD_PS_MSG_PUSH) {
        double u = dsgd_rng_uniform(&f->rng);
        if (u < f->dup_push) {
            r = f->in.send(f->in.impl, dst, tag, buf, bytes, deadline);
            if (r != DSGD_OK) return r;
            f->dups++;
        } else if (u < f->dup_push + 0.2) {
            sleep_us((long)(dsgd_rng_uniform(&f->rng) * 200));
            f->delays++;
        }
    }
    return f->in.send(f->in.impl, dst, tag, buf, bytes, deadline);
}

static dsgd_result faulty_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    faulty *f = (faulty *)impl;
    return f->in.recv(f->in.impl, src, tag, buf, bytes, deadline);
}

static dsgd_result faulty_probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    faulty *f = (faulty *)impl;
    for (;;) {
        dsgd_result r = f->in.probe(f->in.impl, deadline, src, tag, bytes);
        if (r != DSGD_OK || DSGD_PS_TAG_TYPE(*tag) != DSGD_PS_MSG_ACK || *bytes > sizeof f->scratch ||
            dsgd_rng_uniform(&f->rng) >= f->drop_ack)
            return r;
        r = f->in.recv(f->in.impl, *src, *tag, f->scratch, *bytes, deadline);
        if (r != DSGD_OK) return r;
        f->drops++;
    }
}

static const char *faulty_error(void *impl) {
    faulty *f = (faulty *)impl;
    return f->in.error_message ? f->in.error_message(f->in.impl) : "";
}

static void faulty_wrap(faulty *f, const dsgd_transport_i *in, uint64_t seed, dsgd_transport_i *out) {
    memset(f, 0, sizeof *f);
    f->in = *in;
    f->rng = seed;
    f->drop_ack = 0.10;
    f->dup_push = 0.05;
    memset(out, 0, sizeof *out);
    out->name = "faulty";
    out->impl = f;
    out->rank = in->rank;
    out->size = in->size;
    out->send = faulty_send;
    out->recv = faulty_recv;
    out->probe = faulty_probe;
    out->error_message = faulty_error;
}

/* ---------------------------------------------------------------- the runner */

#define MAXR 8
#define MSG 1024

typedef struct run run;
/* A worker's program between create and finish; returns its first error. */
typedef dsgd_result (*worker_body)(run *R, int w, dsgd_ps_worker *pw);

struct run {
    dsgd_ps_desc d;
    const dsgd_shard_map *map;
    size_t n;
    const float *init;
    float *final; /* n floats: each server writes its ranges (apply
                     ON_WORKERS: worker 0 writes its copy) */
    float *wfinal[MAXR]; /* ON_WORKERS, where set: worker w's copy at the end */
    worker_body body;
    void *user;
    int faulty;
    int skip_worker; /* -1: none; else that worker never starts */
    int body_finishes; /* the body calls finish itself (or never) */
    const char *save;  /* set: each server saves to "<save>.<rank>" after serve */
    uint64_t seed;
    /* results, one slot per rank */
    dsgd_result res[MAXR];
    char msg[MAXR][MSG];
    dsgd_ps_server_stats st[MAXR];
    int64_t hist[MAXR][64];
    dsgd_ps_worker_stats wst[MAXR];
    int64_t dups[MAXR], drops[MAXR];
    int bad[MAXR];          /* violations a worker saw */
    char bad_msg[MAXR][MSG];
};

typedef struct rank_arg {
    run *R;
    int rank;
    dsgd_transport_i t;
} rank_arg;

static void note_bad(run *R, int rank, const char *fmt, ...) {
    va_list ap;
    if (R->bad[rank]++) return;
    va_start(ap, fmt);
    vsnprintf(R->bad_msg[rank], MSG, fmt, ap);
    va_end(ap);
}

static void *server_main(void *arg) {
    rank_arg *a = (rank_arg *)arg;
    run *R = a->R;
    dsgd_ctx *ctx = NULL;
    dsgd_ps_server *s = NULL;
    dsgd_result r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        R->res[a->rank] = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    r = dsgd_ps_server_create(ctx, &a->t, &R->d, R->map, R->init, &s);
    if (r == DSGD_OK) r = dsgd_ps_server_serve(s);
    if (r == DSGD_OK) {
        dsgd_ps_server_stats *st = &R->st[a->rank];
        int b;
        dsgd_ps_server_get_stats(s, st);
        for (b = 0; b < st->staleness_bins && b < 64; ++b) R->hist[a->rank][b] = st->staleness_hist[b];
        st->staleness_hist = NULL;
        if (R->d.apply == DSGD_PS_APPLY_ON_SERVERS) r = dsgd_ps_server_read_params(s, R->final);
        if (r == DSGD_OK && R->save) {
            char path[512];
            snprintf(path, sizeof path, "%s.%d", R->save, a->rank);
            r = dsgd_ps_server_save(s, path);
        }
    }
    R->res[a->rank] = r;
    snprintf(R->msg[a->rank], MSG, "%s", dsgd_ctx_last_error(ctx));
    dsgd_ps_server_destroy(s);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

static void *worker_main(void *arg) {
    rank_arg *a = (rank_arg *)arg;
    run *R = a->R;
    int w = a->rank - R->d.num_servers;
    dsgd_ctx *ctx = NULL;
    dsgd_ps_worker *pw = NULL;
    dsgd_transport_i t = a->t;
    faulty *f = NULL;
    dsgd_result r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        R->res[a->rank] = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    if (R->faulty) {
        f = (faulty *)malloc(sizeof *f);
        faulty_wrap(f, &a->t, seed_of(R->seed, w, -7), &t);
    }
    r = dsgd_ps_worker_create(ctx, &t, &R->d, R->map, &pw);
    if (r == DSGD_OK && R->d.apply == DSGD_PS_APPLY_ON_WORKERS) r = dsgd_ps_worker_set_params(pw, R->init);
    if (r == DSGD_OK) r = R->body(R, w, pw);
    if (r == DSGD_OK && !R->body_finishes) r = dsgd_ps_worker_finish(pw);
    if (r == DSGD_OK && R->d.apply == DSGD_PS_APPLY_ON_WORKERS) {
        if (w == 0) r = dsgd_ps_worker_read_params(pw, R->final);
        if (r == DSGD_OK && R->wfinal[w]) r = dsgd_ps_worker_read_params(pw, R->wfinal[w]);
    }
    dsgd_ps_worker_get_stats(pw, &R->wst[a->rank]);
    if (f) {
        R->dups[a->rank] = f->dups;
        R->drops[a->rank] = f->drops;
    }
    R->res[a->rank] = r;
    snprintf(R->msg[a->rank], MSG, "%s", dsgd_ctx_last_error(ctx));
    dsgd_ps_worker_destroy(pw);
    dsgd_ctx_destroy(ctx);
    free(f);
    return NULL;
}

/* Runs every rank of R on its own thread and joins them. */
static void run_ps(run *R) {
    int P = R->d.num_servers, W = R->d.num_workers, n = P + W, i;
    dsgd_ctx *ctx = NULL;
    dsgd_loopback *hub = NULL;
    pthread_t th[MAXR];
    rank_arg args[MAXR];
    int started[MAXR] = {0};
    assert_true(n <= MAXR);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, n, &hub), DSGD_OK);
    for (i = 0; i < n; ++i) {
        args[i].R = R;
        args[i].rank = i;
        assert_int_equal(dsgd_loopback_endpoint(hub, i, &args[i].t), DSGD_OK);
        R->res[i] = DSGD_OK;
        R->msg[i][0] = '\0';
    }
    for (i = 0; i < n; ++i) {
        if (i >= P && i - P == R->skip_worker) continue;
        assert_int_equal(pthread_create(&th[i], NULL, i < P ? server_main : worker_main, &args[i]), 0);
        started[i] = 1;
    }
    for (i = 0; i < n; ++i)
        if (started[i]) assert_int_equal(pthread_join(th[i], NULL), 0);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

static void expect_all_ok(const run *R) {
    int i;
    for (i = 0; i < R->d.num_servers + R->d.num_workers; ++i) {
        if (R->res[i] != DSGD_OK) fail_msg("rank %d: %s: %s", i, dsgd_result_string(R->res[i]), R->msg[i]);
        if (R->bad[i]) fail_msg("rank %d saw %d violations; first: %s", i, R->bad[i], R->bad_msg[i]);
    }
}

/* The histogram sums to the applied pushes, the max lies in it. */
static void expect_staleness_consistent(const run *R, int server) {
    const dsgd_ps_server_stats *st = &R->st[server];
    int64_t sum = 0, top = -1;
    int b;
    for (b = 0; b < st->staleness_bins; ++b) {
        sum += R->hist[server][b];
        if (R->hist[server][b]) top = b;
    }
    assert_true(sum == st->pushes_applied);
    if (st->pushes_applied) {
        assert_true(top == (st->staleness_max < st->staleness_bins - 1 ? st->staleness_max : st->staleness_bins - 1));
        assert_true(st->staleness_mean >= 0.0 && st->staleness_mean <= (double)st->staleness_max);
    }
}

/* A shard map of `count` rank-1 variables of `each` floats, whole variables
   round-robin over P servers. */
static dsgd_shard_map *vector_map(dsgd_ctx *ctx, int P, int count, int each) {
    dsgd_variable vars[64];
    dsgd_shard_map *m = NULL;
    int i;
    assert_true(count <= 64);
    memset(vars, 0, sizeof vars);
    for (i = 0; i < count; ++i) {
        snprintf(vars[i].name, DSGD_MAX_NAME, "v%d", i);
        vars[i].offset = (size_t)i * (size_t)each;
        vars[i].count = (size_t)each;
        vars[i].rank = 1;
        vars[i].shape[0] = each;
    }
    assert_int_equal(dsgd_shard_map_create(ctx, vars, count, P, NULL, &m), DSGD_OK);
    return m;
}

/* A small MLP (4 -> 8 -> 3, 67 parameters in 4 variables), its map over P
   servers with FIXED_SHARDS 2 (rows of each variable on two servers). */
#define MLP_N 67
static const dsgd_layer_desc MLP_LAYERS[2] = {{8, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static dsgd_model *mlp(dsgd_ctx *ctx) {
    dsgd_model_desc md;
    dsgd_model *m = NULL;
    memset(&md, 0, sizeof md);
    md.input_dim = 4;
    md.layers = MLP_LAYERS;
    md.num_layers = 2;
    md.seed = 7;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    return m;
}

static dsgd_shard_map *model_map(dsgd_ctx *ctx, dsgd_model *m, int P) {
    dsgd_variable vars[8];
    dsgd_partitioner part;
    dsgd_shard_map *map = NULL;
    int i, nv = dsgd_model_num_variables(m);
    for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(m, i);
    memset(&part, 0, sizeof part);
    part.kind = DSGD_PARTITIONER_FIXED_SHARDS;
    part.num_shards = 2;
    TU_OK(ctx, dsgd_shard_map_create(ctx, vars, nv, P, &part, &map));
    return map;
}

/* ---------------------------------------------------------------- 1: exactly once */

/* Pushes per worker: 1000 under make test-full; 250 in the quick tier,
   which still drop, duplicate and resend (about 100 acks dropped and 50
   pushes sent twice over the 4 workers). */
#define EX_PUSHES TU_PICK(1000, 250)
#define EX_W 4
typedef struct exact_data {
    int64_t sum[EX_W][128]; /* each worker's sum of its pushes */
} exact_data;

static int small_int(uint64_t *s) { return (int)(dsgd_rng_next(s) % 7) - 3; }

/* The loop is dsgd_ps_worker_run's (ASYNC: EX_PUSHES pushes each); push i
   of worker w is small integers from (seed, w, i), summed as they go. */
typedef struct exact_worker {
    run *R;
    int w;
} exact_worker;

static dsgd_result grad_exact(void *user, int64_t i, const float *params, float *g) {
    exact_worker *e = (exact_worker *)user;
    exact_data *D = (exact_data *)e->R->user;
    uint64_t s = seed_of(e->R->seed, e->w, (int)i);
    size_t j;
    (void)params;
    for (j = 0; j < e->R->n; ++j) {
        int v = small_int(&s);
        g[j] = (float)v;
        D->sum[e->w][j] += v;
    }
    return DSGD_OK;
}

static dsgd_result body_exact(run *R, int w, dsgd_ps_worker *pw) {
    exact_worker e;
    dsgd_ps_run_desc rd;
    e.R = R;
    e.w = w;
    memset(&rd, 0, sizeof rd);
    rd.steps = EX_PUSHES;
    rd.grad = grad_exact;
    rd.user = &e;
    return dsgd_ps_worker_run(pw, &rd); /* and finish */
}

static void test_exactly_once(void **state) {
    dsgd_ctx *ctx;
    dsgd_model *m;
    run *R = (run *)calloc(1, sizeof(run));
    exact_data *D = (exact_data *)calloc(1, sizeof(exact_data));
    float *init, *final;
    int64_t dups = 0, resends = 0, injected = 0, drops = 0, stale = 0;
    size_t j;
    int i, w;
    (void)state;
    tu_watchdog(300);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    R->n = dsgd_model_num_params(m);
    assert_true(R->n <= 128);
    R->map = model_map(ctx, m, 2);
    init = (float *)malloc(R->n * sizeof(float));
    final = (float *)malloc(R->n * sizeof(float));
    for (j = 0; j < R->n; ++j) init[j] = (float)((int)(j * 37 % 101) - 50);
    R->init = init;
    R->final = final;
    R->d.num_servers = 2;
    R->d.num_workers = EX_W;
    R->d.policy = DSGD_PS_ASYNC;
    R->d.optimizer.kind = DSGD_OPT_SGD;
    R->d.optimizer.lr = 1.0f;
    R->d.retry_s = 0.002;
    R->d.staleness_bins = 8;
    R->body = body_exact;
    R->body_finishes = 1;
    R->user = D;
    R->faulty = 1;
    R->skip_worker = -1;
    R->seed = 11;
    run_ps(R);
    expect_all_ok(R);
    for (j = 0; j < R->n; ++j) {
        int64_t want = (int64_t)init[j];
        for (w = 0; w < EX_W; ++w) want -= D->sum[w][j];
        if (final[j] != (float)want) fail_msg("parameter %zu is %g, want %lld (a lost or doubled update)", j, (double)final[j], (long long)want);
    }
    for (i = 0; i < 2; ++i) {
        assert_true(R->st[i].version == EX_W * EX_PUSHES);
        assert_true(R->st[i].pushes_applied == EX_W * EX_PUSHES);
        assert_true(R->st[i].pushes_received == EX_W * EX_PUSHES);
        dups += R->st[i].duplicates;
        expect_staleness_consistent(R, i);
    }
    for (w = 0; w < EX_W; ++w) {
        const dsgd_ps_worker_stats *ws = &R->wst[2 + w];
        assert_true(ws->clock == EX_PUSHES && ws->pulls == EX_PUSHES + 1); /* + the pull the loop stops at */
        resends += ws->push_resends;
        injected += R->dups[2 + w];
        drops += R->drops[2 + w];
        stale += ws->stale_replies;
    }
    print_message("exactly once: %lld duplicates = %lld injected + %lld resends; %lld acks dropped, %lld stale "
                  "replies ignored; staleness mean %.2f max %lld\n", (long long)dups, (long long)injected,
                  (long long)resends, (long long)drops, (long long)stale, R->st[0].staleness_mean,
                  (long long)R->st[0].staleness_max);
    assert_true(injected > 0 && drops > 0 && resends > 0);
    assert_true(dups == injected + resends);
    dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(init);
    free(final);
    free(D);
    free(R);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- 2: SYNC */

#define SY_K 20
#define SY_W 4
typedef struct sync_data {
    float pulls[SY_W][SY_K + 1][128];
    int64_t version[SY_W][SY_K + 1][2];
} sync_data;

static int sync_int(uint64_t seed, int w, int k, size_t j) {
    uint64_t s = seed_of(seed, w, k) ^ (uint64_t)j * 0x9E3779B97F4A7C15ull;
    return (int)(dsgd_rng_next(&s) % 9) - 4;
}

static dsgd_result body_sync(run *R, int w, dsgd_ps_worker *pw) {
    sync_data *D = (sync_data *)R->user;
    float g[128];
    dsgd_result r = DSGD_OK;
    int k, s;
    size_t j;
    for (k = 0; k <= SY_K && r == DSGD_OK; ++k) {
        if ((r = dsgd_ps_worker_pull(pw, D->pulls[w][k])) != DSGD_OK) break;
        for (s = 0; s < R->d.num_servers; ++s) D->version[w][k][s] = dsgd_ps_worker_version(pw, s);
        if (k == SY_K) break;
        if (w == 1) sleep_us(300); /* a slower worker */
        for (j = 0; j < R->n; ++j) g[j] = 4.0f * (float)sync_int(R->seed, w, k, j);
        r = dsgd_ps_worker_push(pw, g);
    }
    return r;
}

static void test_sync_rounds(void **state) {
    dsgd_ctx *ctx;
    dsgd_model *m;
    run *R = (run *)calloc(1, sizeof(run));
    sync_data *D = (sync_data *)calloc(1, sizeof(sync_data));
    float init[128], final[128], want[128];
    size_t j;
    int k, w, i;
    (void)state;
    tu_watchdog(120);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    R->n = dsgd_model_num_params(m);
    R->map = model_map(ctx, m, 2);
    TU_OK(ctx, dsgd_model_get_params(m, init, R->n));
    for (j = 0; j < R->n; ++j) init[j] = (float)(int)(init[j] * 64.0f); /* integers */
    R->init = init;
    R->final = final;
    R->d.num_servers = 2;
    R->d.num_workers = SY_W;
    R->d.policy = DSGD_PS_SYNC;
    R->d.optimizer.lr = 1.0f;
    R->body = body_sync;
    R->user = D;
    R->skip_worker = -1;
    R->seed = 5;
    run_ps(R);
    expect_all_ok(R);
    memcpy(want, init, sizeof want);
    for (k = 0; k <= SY_K; ++k) {
        for (w = 0; w < SY_W; ++w) {
            if (memcmp(D->pulls[w][k], want, R->n * sizeof(float)) != 0)
                fail_msg("round %d: worker %d's pull differs from the closed form", k, w);
            for (i = 0; i < 2; ++i)
                if (D->version[w][k][i] != k) fail_msg("round %d: worker %d read version %lld of server %d", k, w, (long long)D->version[w][k][i], i);
        }
        if (k < SY_K)
            for (j = 0; j < R->n; ++j) {
                int sum = 0;
                for (w = 0; w < SY_W; ++w) sum += sync_int(R->seed, w, k, j);
                want[j] -= (float)sum; /* mean of 4 * a_w is the sum of a_w, exactly */
            }
    }
    assert_memory_equal(final, want, R->n * sizeof(float));
    for (i = 0; i < 2; ++i) {
        assert_true(R->st[i].version == SY_K && R->st[i].pushes_applied == SY_K * SY_W);
        assert_true(R->st[i].staleness_max == 0 && R->hist[i][0] == SY_K * SY_W);
        expect_staleness_consistent(R, i);
    }
    dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(D);
    free(R);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- 3: SSP */

/* Signatures: variable k holds clock k, float k * W + w is worker w's; the
   gradient of worker w at clock k is W there and 0 elsewhere, so the mean
   of clock k subtracts exactly 1 from each of its W floats (SGD, lr 1). */
#define SG_W 4
#define SG_K 16
typedef struct sig_data {
    int started[SG_W]; /* atomic: clocks each worker has started */
    int spread[SG_W];  /* largest clock - fewest clocks started, per worker */
    int ahead[SG_W];   /* largest clock - version read, per worker */
    int fast_read;     /* atomic, BACKUP: the highest version a fast worker read */
    int slow_started;  /* atomic, BACKUP: the straggler has pulled once */
    int accepted[SG_W + 1][SG_K];
    int64_t step[SG_W + 1][SG_K];
    int pushes[SG_W + 1];
    long slow_us;
} sig_data;

static dsgd_result body_ssp(run *R, int w, dsgd_ps_worker *pw) {
    sig_data *D = (sig_data *)R->user;
    int s = R->d.staleness, c, v, k, P = R->d.num_servers;
    float p[SG_W * SG_K], g[SG_W * SG_K];
    dsgd_result r = DSGD_OK;
    for (c = 0; c <= SG_K && r == DSGD_OK; ++c) {
        int lo = SG_K;
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        for (v = 0; v < SG_W; ++v) {
            int st = __atomic_load_n(&D->started[v], __ATOMIC_SEQ_CST);
            if (st < lo) lo = st;
        }
        if (c - lo > s) note_bad(R, P + w, "pull at clock %d returned while a worker had started only %d clocks (s = %d)", c, lo, s);
        if (c - lo > D->spread[w]) D->spread[w] = c - lo;
        for (v = 0; v < P; ++v) {
            int64_t ver = dsgd_ps_worker_version(pw, v);
            if (ver < c - s) note_bad(R, P + w, "a pull at clock %d read version %lld of server %d (s = %d)", c, (long long)ver, v, s);
            if (c - ver > D->ahead[w]) D->ahead[w] = (int)(c - ver);
        }
        for (k = 0; k < SG_K; ++k) {
            int updated = 0;
            for (v = 0; v < SG_W; ++v) {
                float x = p[k * SG_W + v];
                if (x != 0.0f && x != -1.0f) note_bad(R, P + w, "float (%d, %d) is %g", v, k, (double)x);
                updated += x == -1.0f;
            }
            if (updated != 0 && updated != SG_W) note_bad(R, P + w, "clock %d is half applied (%d of %d)", k, updated, SG_W);
            if (k <= c - s - 1 && updated != SG_W) note_bad(R, P + w, "a pull at clock %d lacks clock %d (s = %d)", c, k, s);
            if (k >= c && updated) note_bad(R, P + w, "a pull at clock %d holds clock %d, which it has not pushed", c, k);
        }
        if (c == SG_K) break;
        __atomic_store_n(&D->started[w], c + 1, __ATOMIC_SEQ_CST);
        if (w == 0) sleep_us(D->slow_us);
        memset(g, 0, sizeof g);
        g[c * SG_W + w] = (float)SG_W;
        r = dsgd_ps_worker_push(pw, g);
    }
    return r;
}

static void run_signatures(run *R, sig_data *D, dsgd_ps_policy policy, int s_or_b, int P, dsgd_ps_apply apply,
                           worker_body body, float *final, float (*wfinal)[(SG_W + 1) * SG_K], dsgd_shard_map **map_out) {
    int w;
    dsgd_ctx *ctx;
    static float zeros[(SG_W + 1) * SG_K];
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    memset(R, 0, sizeof *R);
    memset(D, 0, sizeof *D);
    D->slow_us = policy == DSGD_PS_BACKUP ? 0 : 3000; /* BACKUP: the odd pushes of the "straggler" are quick */
    *map_out = vector_map(ctx, P, SG_K, R->d.num_workers = (policy == DSGD_PS_BACKUP ? SG_W + 1 : SG_W));
    R->n = (size_t)SG_K * (size_t)R->d.num_workers;
    R->map = *map_out;
    R->init = zeros;
    R->final = final;
    R->d.num_servers = P;
    R->d.policy = policy;
    if (policy == DSGD_PS_SSP) R->d.staleness = s_or_b;
    if (policy == DSGD_PS_BACKUP) R->d.backup_workers = s_or_b;
    R->d.apply = apply;
    for (w = 0; w < R->d.num_workers && wfinal; ++w) R->wfinal[w] = wfinal[w];
    R->d.optimizer.lr = 1.0f;
    R->body = body;
    R->user = D;
    R->skip_worker = -1;
    run_ps(R);
    dsgd_ctx_destroy(ctx);
}

static void test_ssp_bound(void **state) {
    run *R = (run *)malloc(sizeof(run));
    sig_data *D = (sig_data *)malloc(sizeof(sig_data));
    float final[SG_W * SG_K];
    dsgd_shard_map *map;
    int s, i, w, spread, ahead, mode;
    (void)state;
    tu_watchdog(120);
    for (mode = 0; mode < 2; ++mode)
    for (s = 0; s <= 3; ++s) {
        /* mode 1: the workers apply; a worker's last pull (clock K) may miss the last s clocks */
        if (!tu_full() && s == 2) continue; /* the quick tier: s = 0 (SYNC), 1 and 3; make test-full every s */
        run_signatures(R, D, DSGD_PS_SSP, s, 2, (dsgd_ps_apply)mode, body_ssp, final, NULL, &map);
        expect_all_ok(R);
        for (i = 0; i < SG_W * SG_K; ++i)
            if (final[i] != -1.0f && (mode == 0 || s == 0 || i < (SG_K - s) * SG_W))
                fail_msg("s = %d: float %d is %g after every clock", s, i, (double)final[i]);
        spread = ahead = 0;
        for (w = 0; w < SG_W; ++w) {
            spread = D->spread[w] > spread ? D->spread[w] : spread;
            ahead = D->ahead[w] > ahead ? D->ahead[w] : ahead;
        }
        print_message("SSP s = %d%s: largest clock spread %d, largest clock - version read %d\n", s,
                      mode ? " (workers apply)" : "", spread, ahead);
        assert_true(spread <= s && ahead <= s);
        if (s > 0) assert_true(ahead >= 1); /* the fast workers did run ahead of the slow one */
        for (i = 0; i < 2; ++i) {
            assert_true(R->st[i].version == SG_K);
            assert_true(R->st[i].pushes_applied == SG_K * SG_W);
            assert_true(R->st[i].staleness_max <= s);
            expect_staleness_consistent(R, i);
        }
        dsgd_shard_map_destroy(map);
    }
    free(R);
    free(D);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- 4: BACKUP */

/* As TF's workers stop on the global step: pull, stop once version K is
   reached, else push for the step read. (A worker that pushed a fixed number
   of times could wait for ever on a step the finished others no longer
   complete.) Each push is for a new step, so a worker pushes K times at most. */
static dsgd_result body_backup(run *R, int w, dsgd_ps_worker *pw) {
    sig_data *D = (sig_data *)R->user;
    int W = R->d.num_workers, k;
    float p[(SG_W + 1) * SG_K], g[(SG_W + 1) * SG_K];
    dsgd_result r = DSGD_OK;
    int slow = w == W - 1;
    double give_up = dsgd_now() + 20.0;
    /* the fast workers start once the straggler has pulled, so it pushes */
    while (!slow && !__atomic_load_n(&D->slow_started, __ATOMIC_SEQ_CST) && dsgd_now() < give_up) sleep_us(50);
    for (k = 0; r == DSGD_OK; ++k) {
        int64_t v;
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        v = dsgd_ps_worker_version(pw, 0);
        if (slow) {
            __atomic_store_n(&D->slow_started, 1, __ATOMIC_SEQ_CST);
        } else {
            int cur = __atomic_load_n(&D->fast_read, __ATOMIC_SEQ_CST);
            while (cur < (int)v && !__atomic_compare_exchange_n(&D->fast_read, &cur, (int)v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            }
        }
        if (v >= SG_K) break;
        if (k >= SG_K) {
            note_bad(R, 1 + w, "push %d: more pushes than steps", k);
            break;
        }
        D->step[w][k] = v;
        if (slow && k % 2 == 0) { /* stale for sure: a fast worker has read step v + 1 */
            while (__atomic_load_n(&D->fast_read, __ATOMIC_SEQ_CST) <= v && dsgd_now() < give_up) sleep_us(50);
        } else {
            sleep_us(slow ? D->slow_us : 200); /* computing; the straggler races the others */
        }
        memset(g, 0, sizeof g);
        g[k * W + w] = (float)(W - R->d.backup_workers);
        r = dsgd_ps_worker_push(pw, g);
        D->accepted[w][k] = !dsgd_ps_worker_last_push_dropped(pw, 0);
        D->pushes[w] = k + 1;
    }
    return r;
}

static void test_backup_drops_stale(void **state) {
    run *R = (run *)malloc(sizeof(run));
    sig_data *D = (sig_data *)malloc(sizeof(sig_data));
    float final[(SG_W + 1) * SG_K], wfinal[SG_W + 1][(SG_W + 1) * SG_K];
    dsgd_shard_map *map;
    int64_t accepted, dropped, slow_dropped;
    int W = SG_W + 1, w, k, mode;
    (void)state;
    tu_watchdog(120);
    for (mode = 0; mode < 2; ++mode) { /* mode 1: the workers apply; the straggler catches up on the steps it missed */
    accepted = dropped = slow_dropped = 0;
    run_signatures(R, D, DSGD_PS_BACKUP, 1, 1, (dsgd_ps_apply)mode, body_backup, final, mode ? wfinal : NULL, &map);
    expect_all_ok(R);
    for (w = 0; w < W && mode; ++w)
        if (memcmp(wfinal[w], final, sizeof final) != 0) fail_msg("workers apply: worker %d's copy differs from worker 0's", w);
    if (mode) {
        int64_t calls = 0;
        for (w = 0; w < W; ++w) calls += R->wst[1 + w].pulls;
        print_message("BACKUP, workers apply: %lld pull calls took %lld rounds\n", (long long)calls,
                      (long long)R->st[0].pulls_answered);
    }
    assert_true(R->st[0].version == SG_K);
    for (w = 0; w < W; ++w)
        for (k = 0; k < D->pushes[w]; ++k) {
            float want = D->accepted[w][k] && D->step[w][k] < R->st[0].version ? -1.0f : 0.0f;
            if (final[k * W + w] != want)
                fail_msg("worker %d push %d (step %lld, %s): float is %g, want %g", w, k, (long long)D->step[w][k],
                         D->accepted[w][k] ? "accepted" : "dropped", (double)final[k * W + w], (double)want);
            if (D->accepted[w][k] && D->step[w][k] < R->st[0].version) accepted++;
            if (!D->accepted[w][k]) dropped++;
            if (!D->accepted[w][k] && w == W - 1) slow_dropped++;
        }
    for (w = 0; w < W; ++w)
        for (k = D->pushes[w]; k < SG_K; ++k)
            if (final[k * W + w] != 0.0f) fail_msg("worker %d never made push %d, yet its float is %g", w, k, (double)final[k * W + w]);
    print_message("BACKUP 4 + 1%s: %lld steps, %lld pushes applied, %lld dropped (%lld of the straggler's)\n",
                  mode ? " (workers apply)" : "", (long long)R->st[0].version, (long long)accepted, (long long)dropped,
                  (long long)slow_dropped);
    assert_true(R->st[0].stale_dropped == dropped);
    assert_true(R->wst[1 + W - 1].pushes_dropped == slow_dropped);
    assert_true(R->st[0].pushes_applied == accepted);
    assert_true(accepted == (W - 1) * R->st[0].version);
    assert_true(slow_dropped >= (D->pushes[W - 1] + 1) / 2 && slow_dropped >= 1); /* its even pushes */
    assert_true(R->st[0].staleness_max == 0);
    expect_staleness_consistent(R, 0);
    dsgd_shard_map_destroy(map);
    }
    free(R);
    free(D);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- SSP 0 = SYNC = BACKUP 0 = the optimizer's bits */

#define RB_K 12
#define RB_W 4

static float rand_grad(uint64_t seed, int w, int k, size_t j) {
    uint64_t s = seed_of(seed, w, k) ^ (uint64_t)(j + 1) * 0xD1B54A32D192ED03ull;
    return (float)(dsgd_rng_uniform(&s) * 2.0 - 1.0) * (float)(1 + (j % 3));
}

static dsgd_result body_random(run *R, int w, dsgd_ps_worker *pw) {
    float p[128], g[128];
    dsgd_result r = DSGD_OK;
    size_t j;
    int k;
    for (k = 0; k < RB_K && r == DSGD_OK; ++k) {
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        if (w == 2) sleep_us(200);
        for (j = 0; j < R->n; ++j) g[j] = rand_grad(R->seed, w, k, j);
        r = dsgd_ps_worker_push(pw, g);
    }
    return r;
}

static void run_random(dsgd_ps_policy policy, float *final) {
    dsgd_ctx *ctx;
    dsgd_model *m;
    run *R = (run *)calloc(1, sizeof(run));
    float init[128];
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    R->n = dsgd_model_num_params(m);
    R->map = model_map(ctx, m, 2);
    TU_OK(ctx, dsgd_model_get_params(m, init, R->n));
    R->init = init;
    R->final = final;
    R->d.num_servers = 2;
    R->d.num_workers = RB_W;
    R->d.policy = policy; /* staleness and backup_workers 0 */
    R->d.optimizer.kind = DSGD_OPT_ADAM;
    R->d.optimizer.lr = 0.01f;
    R->d.optimizer.weight_decay = 0.001f;
    R->body = body_random;
    R->skip_worker = -1;
    R->seed = 99;
    run_ps(R);
    expect_all_ok(R);
    assert_true(R->st[0].version == RB_K && R->st[1].version == RB_K);
    dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(R);
}

static void test_zero_bounds_are_sync(void **state) {
    float sync[128], ssp0[128], backup0[128], want[128], mean[128];
    dsgd_ctx *ctx;
    dsgd_model *m;
    dsgd_optimizer *opt;
    dsgd_optimizer_desc od;
    const dsgd_backend_i *be;
    size_t n, j;
    int k, w;
    (void)state;
    tu_watchdog(120);
    run_random(DSGD_PS_SYNC, sync);
    run_random(DSGD_PS_SSP, ssp0);
    run_random(DSGD_PS_BACKUP, backup0);
    /* the reference: the model's own optimizer fed the rank-order mean */
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    n = dsgd_model_num_params(m);
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    od.lr = 0.01f;
    od.weight_decay = 0.001f;
    TU_OK(ctx, dsgd_optimizer_create(m, &od, &opt));
    be = dsgd_model_backend(m);
    for (k = 0; k < RB_K; ++k) {
        for (j = 0; j < n; ++j) {
            mean[j] = rand_grad(99, 0, k, j);
            for (w = 1; w < RB_W; ++w) mean[j] += rand_grad(99, w, k, j);
            mean[j] /= (float)RB_W;
        }
        TU_OK(ctx, be->write(be->impl, dsgd_model_grads(m), mean, n));
        TU_OK(ctx, dsgd_optimizer_step(opt));
    }
    TU_OK(ctx, dsgd_model_get_params(m, want, n));
    assert_memory_equal(sync, want, n * sizeof(float));
    assert_memory_equal(ssp0, sync, n * sizeof(float));
    assert_memory_equal(backup0, sync, n * sizeof(float));
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- 7: the loop (dsgd_ps_worker_run) */

/* A worker's run: the gradients of body_random (rand_grad of (seed, w,
   push)); the callbacks log what they saw and check the loop's order
   (pull, after_pull, stop rule, grad, push, after_push) and its steps. */
#define LP_MAX 64
typedef struct loop_data {
    int64_t steps;                   /* the run's target */
    int slow;                        /* this worker is slow to compute its gradient */
    int64_t pull_step[MAXR][LP_MAX + 2], pull_global[MAXR][LP_MAX + 2];
    int pulls[MAXR], grads[MAXR], pushes[MAXR]; /* calls of each callback */
    int dropped[MAXR];               /* pushes a BACKUP server dropped */
} loop_data;

typedef struct loop_worker {
    run *R;
    int w;
    dsgd_ps_worker *pw;
    const float *pulled; /* the buffer after_pull saw */
} loop_worker;

static dsgd_result loop_pulled(void *user, int64_t step, int64_t global, const float *params, int *stop) {
    loop_worker *lw = (loop_worker *)user;
    loop_data *D = (loop_data *)lw->R->user;
    int w = lw->w, P = lw->R->d.num_servers, i = D->pulls[w]++;
    if (*stop != 0) note_bad(lw->R, P + w, "after_pull: *stop is %d on entry", *stop);
    if (i > LP_MAX + 1 || step != D->pushes[w] || global != dsgd_ps_worker_global_step(lw->pw))
        note_bad(lw->R, P + w, "after_pull %d: step %lld, global %lld after %d pushes", i, (long long)step,
                 (long long)global, D->pushes[w]);
    else {
        D->pull_step[w][i] = step;
        D->pull_global[w][i] = global;
    }
    lw->pulled = params;
    return DSGD_OK;
}

static dsgd_result loop_grad(void *user, int64_t step, const float *params, float *grads) {
    loop_worker *lw = (loop_worker *)user;
    loop_data *D = (loop_data *)lw->R->user;
    int w = lw->w, P = lw->R->d.num_servers;
    size_t j;
    if (step != D->grads[w]++ || step != D->pushes[w] || params != lw->pulled || params == grads || D->pulls[w] != step + 1)
        note_bad(lw->R, P + w, "grad: step %lld after %d pushes and %d pulls", (long long)step, D->pushes[w], D->pulls[w]);
    sleep_us(w == D->slow ? 1500 : 200); /* computing; the straggler races the others */
    for (j = 0; j < lw->R->n; ++j) grads[j] = rand_grad(lw->R->seed, w, (int)step, j);
    return DSGD_OK;
}

static dsgd_result loop_pushed(void *user, int64_t step) {
    loop_worker *lw = (loop_worker *)user;
    loop_data *D = (loop_data *)lw->R->user;
    int w = lw->w, P = lw->R->d.num_servers, s;
    if (step != D->pushes[w]++ || D->grads[w] != step + 1)
        note_bad(lw->R, P + w, "after_push: step %lld after %d gradients", (long long)step, D->grads[w]);
    for (s = 0; s < P; ++s) D->dropped[w] += dsgd_ps_worker_last_push_dropped(lw->pw, s);
    return DSGD_OK;
}

static dsgd_result body_loop(run *R, int w, dsgd_ps_worker *pw) {
    loop_data *D = (loop_data *)R->user;
    loop_worker lw;
    dsgd_ps_run_desc rd;
    memset(&lw, 0, sizeof lw);
    lw.R = R;
    lw.w = w;
    lw.pw = pw;
    memset(&rd, 0, sizeof rd);
    rd.steps = D->steps;
    rd.grad = loop_grad;
    rd.user = &lw;
    rd.after_pull = loop_pulled;
    rd.after_push = loop_pushed;
    return dsgd_ps_worker_run(pw, &rd);
}

/* The MLP's Adam run of run_random, each worker in dsgd_ps_worker_run. */
static void run_loop(run *R, loop_data *D, dsgd_ps_policy policy, int s_or_b, int P, int W, dsgd_ps_apply apply,
                     int64_t steps, float *final, float (*wfinal)[128]) {
    dsgd_ctx *ctx;
    dsgd_model *m;
    float init[128];
    int w;
    memset(R, 0, sizeof *R);
    memset(D, 0, sizeof *D);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    R->n = dsgd_model_num_params(m);
    R->map = model_map(ctx, m, P);
    TU_OK(ctx, dsgd_model_get_params(m, init, R->n));
    R->init = init;
    R->final = final;
    for (w = 0; w < W && wfinal; ++w) R->wfinal[w] = wfinal[w];
    R->d.num_servers = P;
    R->d.num_workers = W;
    R->d.policy = policy;
    if (policy == DSGD_PS_SSP) R->d.staleness = s_or_b;
    if (policy == DSGD_PS_BACKUP) R->d.backup_workers = s_or_b;
    R->d.apply = apply;
    R->d.optimizer.kind = DSGD_OPT_ADAM;
    R->d.optimizer.lr = 0.01f;
    R->d.optimizer.weight_decay = 0.001f;
    R->body = body_loop;
    R->body_finishes = 1;
    R->user = D;
    R->skip_worker = -1;
    R->seed = 99;
    D->steps = steps;
    D->slow = W - 1;
    run_ps(R);
    expect_all_ok(R);
    dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

/* SYNC in the loop: the bits of the hand-written pull/push loop (body_random),
   RB_K pushes per worker, RB_K + 1 pulls (the last one stops), after_pull at
   step k reading global step k; SSP s = 2 in the loop ends with the same
   bits (the gradients do not depend on the weights, and clocks are applied
   in order), every pull within the bound. */
static void test_run_sync_ssp(void **state) {
    run *R = (run *)malloc(sizeof(run));
    loop_data *D = (loop_data *)malloc(sizeof(loop_data));
    float hand[128], sync[128], ssp[128];
    int mode, w, k, s;
    (void)state;
    tu_watchdog(120);
    run_random(DSGD_PS_SYNC, hand);
    for (mode = 0; mode < 2; ++mode) {
        int ssp_run = mode == 1;
        run_loop(R, D, ssp_run ? DSGD_PS_SSP : DSGD_PS_SYNC, ssp_run ? 2 : 0, 2, RB_W, DSGD_PS_APPLY_ON_SERVERS, RB_K,
                 ssp_run ? ssp : sync, NULL);
        for (s = 0; s < 2; ++s) {
            assert_true(R->st[s].version == RB_K && R->st[s].pushes_applied == RB_K * RB_W);
            assert_true(R->st[s].pushes_received == RB_K * RB_W);
        }
        for (w = 0; w < RB_W; ++w) {
            const dsgd_ps_worker_stats *ws = &R->wst[2 + w];
            assert_true(ws->clock == RB_K && ws->pulls == RB_K + 1);
            assert_true(D->pulls[w] == RB_K + 1 && D->grads[w] == RB_K && D->pushes[w] == RB_K);
            for (k = 0; k <= RB_K; ++k) {
                assert_true(D->pull_step[w][k] == k);
                if (ssp_run) {
                    if (D->pull_global[w][k] < k - 2 || D->pull_global[w][k] > k)
                        fail_msg("SSP s = 2: worker %d read global step %lld at clock %d", w,
                                 (long long)D->pull_global[w][k], k);
                } else if (D->pull_global[w][k] != k) {
                    fail_msg("SYNC: worker %d read global step %lld at step %d", w, (long long)D->pull_global[w][k], k);
                }
            }
        }
    }
    assert_memory_equal(sync, hand, R->n * sizeof(float));
    assert_memory_equal(ssp, hand, R->n * sizeof(float));
    free(R);
    free(D);
    tu_watchdog(0);
}

/* BACKUP 3 + 1 over 2 servers in the loop, a slow worker, target 12 (servers
   applying, then workers applying): every server ends at version 12
   exactly, every worker stops reading global step 12 with at most 12 pushes,
   the servers applied 3 gradients per step and dropped the rest; the
   workers applying end with the same copy. */
static void test_run_backup(void **state) {
    run *R = (run *)malloc(sizeof(run));
    loop_data *D = (loop_data *)malloc(sizeof(loop_data));
    float final[128], wfinal[4][128];
    int mode, w, s;
    (void)state;
    tu_watchdog(120);
    for (mode = 0; mode < 2; ++mode) {
        int64_t pushes = 0, dropped = 0;
        run_loop(R, D, DSGD_PS_BACKUP, 1, 2, 4, (dsgd_ps_apply)mode, 12, final, mode ? wfinal : NULL);
        for (w = 0; w < 4; ++w) {
            const dsgd_ps_worker_stats *ws = &R->wst[2 + w];
            int last = D->pulls[w] - 1;
            assert_true(ws->clock == D->pushes[w] && ws->clock <= 12 && D->grads[w] == D->pushes[w]);
            assert_true(last >= 0 && D->pull_global[w][last] == 12);
            for (s = 0; s < last; ++s) assert_true(D->pull_global[w][s] < 12);
            pushes += ws->clock;
            dropped += D->dropped[w];
            if (mode) assert_memory_equal(wfinal[w], wfinal[0], R->n * sizeof(float));
        }
        print_message("BACKUP 3 + 1 in the loop%s: pushes %lld %lld %lld %lld (the last is slow), %lld (push, server) "
                      "drops\n", mode ? " (workers apply)" : "", (long long)R->wst[2].clock, (long long)R->wst[3].clock,
                      (long long)R->wst[4].clock, (long long)R->wst[5].clock, (long long)dropped);
        for (s = 0; s < 2; ++s) {
            assert_true(R->st[s].version == 12);
            assert_true(R->st[s].pushes_applied == 3 * 12);
            assert_true(R->st[s].pushes_received == pushes);
            assert_true(R->st[s].stale_dropped == pushes - 3 * 12);
        }
        assert_true(dropped == 2 * (pushes - 3 * 12)); /* each dropped push, on both servers */
    }
    free(R);
    free(D);
    tu_watchdog(0);
}

/* The run's arguments, a callback's error (the worker stays usable, the
   next run goes on from its clock), a stop from after_pull, no_finish, and
   a run after finish: one ASYNC worker. */
typedef struct edge_data {
    dsgd_ctx *ctx;   /* the worker's, for edge_grad's message */
    int64_t fail_at; /* after_pull fails at this step (-1: never) */
    int64_t stop_at; /* after_pull stops at this step (-1: never) */
    int grad_fails;  /* grad fails with its own message */
    int64_t last_grad;
} edge_data;

static dsgd_result edge_pulled(void *user, int64_t step, int64_t global, const float *params, int *stop) {
    edge_data *E = (edge_data *)user;
    (void)global;
    (void)params;
    if (step == E->fail_at) return DSGD_ERR_ABORTED;
    if (step == E->stop_at) *stop = 1;
    return DSGD_OK;
}

static dsgd_result edge_grad(void *user, int64_t step, const float *params, float *grads) {
    edge_data *E = (edge_data *)user;
    (void)params;
    if (E->grad_fails)
        return dsgd_ctx_set_error(E->ctx, DSGD_ERR_SHAPE, "edge_grad: no gradient at step %lld", (long long)step);
    E->last_grad = step;
    grads[0] = 1.0f; /* the rest: 0 */
    return DSGD_OK;
}

static void test_run_edges(void **state) {
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_transport_i t1;
    dsgd_ps_worker *pw = NULL;
    dsgd_ps_worker_stats ws;
    dsgd_ps_run_desc rd;
    rank_arg server;
    pthread_t th;
    run *R = (run *)calloc(1, sizeof(run));
    edge_data E;
    float init[16] = {0}, final[16], p[16], g[16];
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ps_policy_stops_on_global(DSGD_PS_ASYNC), 0);
    assert_int_equal(dsgd_ps_policy_stops_on_global(DSGD_PS_SSP), 0);
    assert_int_equal(dsgd_ps_policy_stops_on_global(DSGD_PS_SYNC), 0);
    assert_int_equal(dsgd_ps_policy_stops_on_global(DSGD_PS_BACKUP), 1);
    assert_int_equal(dsgd_ps_policy_stops_on_global((dsgd_ps_policy)DSGD_PS_POLICY_COUNT), 0);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    R->map = vector_map(ctx, 1, 2, 8); /* 16 floats */
    R->n = 16;
    R->init = init;
    R->final = final;
    R->d.num_servers = 1;
    R->d.num_workers = 1;
    R->d.optimizer.lr = 1.0f; /* ASYNC, SGD */
    assert_int_equal(dsgd_loopback_create(ctx, 2, &hub), DSGD_OK);
    server.R = R;
    server.rank = 0;
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, &server.t), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 1, &t1), DSGD_OK);
    assert_int_equal(pthread_create(&th, NULL, server_main, &server), 0);
    TU_OK(ctx, dsgd_ps_worker_create(ctx, &t1, &R->d, R->map, &pw));
    memset(&E, 0, sizeof E);
    E.ctx = ctx;
    E.fail_at = E.stop_at = E.last_grad = -1;
    memset(&rd, 0, sizeof rd);
    assert_int_equal(dsgd_ps_worker_run(NULL, &rd), DSGD_ERR_INVALID_ARGUMENT);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_run(pw, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_run(pw, &rd));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "dsgd_ps_worker_run: worker 0: the gradient fn (grad) is NULL"));
    rd.grad = edge_grad;
    rd.user = &E;
    rd.after_pull = edge_pulled;
    rd.steps = -1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_run(pw, &rd));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "steps -1"));
    rd.steps = 10;
    rd.num_floats = 15;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_run(pw, &rd));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "num_floats 15 is below 16"));
    rd.num_floats = 0;
    rd.params = rd.grads = p;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_run(pw, &rd));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "one buffer"));
    rd.params = p;
    rd.grads = g;
    memset(g, 0, sizeof g);
    dsgd_ps_worker_get_stats(pw, &ws);
    assert_true(ws.pulls == 0 && ws.clock == 0); /* the refused runs did nothing */
    /* after_pull fails at step 3: three pushes made, the worker unfinished
       and usable, a message naming the callback and the step */
    E.fail_at = 3;
    TU_ERR(ctx, DSGD_ERR_ABORTED, dsgd_ps_worker_run(pw, &rd));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "dsgd_ps_worker_run: worker 0: after_pull failed at step 3"));
    dsgd_ps_worker_get_stats(pw, &ws);
    assert_true(ws.clock == 3 && ws.pulls == 4 && E.last_grad == 2 && !dsgd_ps_worker_failed(pw));
    /* the gradient fn fails with its own message, which is kept */
    E.fail_at = -1;
    E.grad_fails = 1;
    TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_ps_worker_run(pw, &rd));
    assert_string_equal(dsgd_ctx_last_error(ctx), "edge_grad: no gradient at step 3");
    E.grad_fails = 0;
    /* on from clock 3: after_pull stops it at step 5, unfinished (no_finish) */
    E.stop_at = 5;
    rd.no_finish = 1;
    TU_OK(ctx, dsgd_ps_worker_run(pw, &rd));
    dsgd_ps_worker_get_stats(pw, &ws);
    assert_true(ws.clock == 5 && E.last_grad == 4 && p[0] == -5.0f);
    TU_OK(ctx, dsgd_ps_worker_pull(pw, p));
    assert_true(p[0] == -5.0f && p[1] == 0.0f);
    /* on to the target, 10 pushes of the worker in all (ASYNC), then finish */
    E.stop_at = -1;
    rd.no_finish = 0;
    TU_OK(ctx, dsgd_ps_worker_run(pw, &rd));
    dsgd_ps_worker_get_stats(pw, &ws);
    assert_true(ws.clock == 10 && E.last_grad == 9 && p[0] == -10.0f);
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_run(pw, &rd));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_pull(pw, p));
    assert_int_equal(pthread_join(th, NULL), 0);
    if (R->res[0] != DSGD_OK) fail_msg("server: %s", R->msg[0]);
    assert_true(R->st[0].version == 10 && R->st[0].pushes_applied == 10 && final[0] == -10.0f && final[15] == 0.0f);
    dsgd_ps_worker_destroy(pw);
    dsgd_loopback_destroy(hub);
    dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    dsgd_ctx_destroy(ctx);
    free(R);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- summation only (BytePS) */

/* SYNC with the workers applying (apply ON_WORKERS: servers only sum)
   against the servers applying, on random float gradients: every worker's
   pull of every round, and every worker's copy at the end, are bitwise the
   servers' parameters, for SGD, Nesterov momentum and Adam (the same mean,
   the same update code). */
#define SO_K 10
#define SO_W 4
typedef struct so_data {
    float pulls[SO_W][SO_K + 1][128];
} so_data;

static dsgd_result body_so(run *R, int w, dsgd_ps_worker *pw) {
    so_data *D = (so_data *)R->user;
    float g[128];
    dsgd_result r = DSGD_OK;
    size_t j;
    int k, s;
    for (k = 0; k <= SO_K && r == DSGD_OK; ++k) {
        if ((r = dsgd_ps_worker_pull(pw, D->pulls[w][k])) != DSGD_OK) break;
        for (s = 0; s < R->d.num_servers; ++s)
            if (dsgd_ps_worker_version(pw, s) != k)
                note_bad(R, R->d.num_servers + w, "round %d: version %lld of server %d", k,
                         (long long)dsgd_ps_worker_version(pw, s), s);
        if (k == SO_K) break;
        if (w == 2) sleep_us(200); /* a slower worker */
        for (j = 0; j < R->n; ++j) g[j] = rand_grad(R->seed, w, k, j);
        r = dsgd_ps_worker_push(pw, g);
    }
    return r;
}

static void run_so(dsgd_ps_apply apply, const dsgd_optimizer_desc *od, so_data *D, float *final, float (*wfinal)[128]) {
    dsgd_ctx *ctx;
    dsgd_model *m;
    run *R = (run *)calloc(1, sizeof(run));
    float init[128];
    int i, w;
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    R->n = dsgd_model_num_params(m);
    R->map = model_map(ctx, m, 2);
    TU_OK(ctx, dsgd_model_get_params(m, init, R->n));
    R->init = init;
    R->final = final;
    for (w = 0; w < SO_W && wfinal; ++w) R->wfinal[w] = wfinal[w];
    R->d.num_servers = 2;
    R->d.num_workers = SO_W;
    R->d.policy = DSGD_PS_SYNC;
    R->d.apply = apply;
    R->d.optimizer = *od;
    R->body = body_so;
    R->user = D;
    R->skip_worker = -1;
    R->seed = 123;
    run_ps(R);
    expect_all_ok(R);
    for (i = 0; i < 2; ++i) {
        assert_true(R->st[i].version == SO_K && R->st[i].pushes_applied == SO_K * SO_W);
        assert_true(R->st[i].staleness_max == 0);
        expect_staleness_consistent(R, i);
    }
    assert_true(memcmp(final, init, R->n * sizeof(float)) != 0); /* it did train */
    dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(R);
}

static void test_sum_only_matches_servers(void **state) {
    so_data *on_servers = (so_data *)calloc(1, sizeof(so_data)), *on_workers = (so_data *)calloc(1, sizeof(so_data));
    float fs[128], fw[128], wf[SO_W][128];
    dsgd_optimizer_desc od[3];
    int o, w, k;
    (void)state;
    tu_watchdog(120);
    memset(od, 0, sizeof od);
    od[0].kind = DSGD_OPT_SGD;
    od[0].lr = 0.1f;
    od[1].kind = DSGD_OPT_MOMENTUM;
    od[1].lr = 0.05f;
    od[1].momentum = 0.9f;
    od[1].nesterov = 1;
    od[1].weight_decay = 0.001f;
    od[2].kind = DSGD_OPT_ADAM;
    od[2].lr = 0.01f;
    od[2].weight_decay = 0.001f;
    for (o = 0; o < 3; ++o) {
        run_so(DSGD_PS_APPLY_ON_SERVERS, &od[o], on_servers, fs, NULL);
        run_so(DSGD_PS_APPLY_ON_WORKERS, &od[o], on_workers, fw, wf);
        for (w = 0; w < SO_W; ++w) {
            for (k = 0; k <= SO_K; ++k)
                if (memcmp(on_workers->pulls[w][k], on_servers->pulls[w][k], MLP_N * sizeof(float)) != 0)
                    fail_msg("optimizer %d, round %d: worker %d's copy differs from the servers' parameters", o, k, w);
            if (memcmp(wf[w], fs, MLP_N * sizeof(float)) != 0)
                fail_msg("optimizer %d: worker %d's final copy differs from the servers' parameters", o, w);
        }
        assert_memory_equal(fw, fs, MLP_N * sizeof(float));
    }
    free(on_servers);
    free(on_workers);
    tu_watchdog(0);
}

/* Summation only with more servers than variables (3 servers, 2
   variables): server 2 holds no floats and publishes means of 0 floats,
   which the workers tell from "nothing new" by their step. SYNC trains to
   the bits of the same cluster with the servers applying. */
static void test_sum_only_empty_server(void **state) {
    dsgd_ctx *ctx;
    dsgd_shard_map *map;
    run *R = (run *)calloc(1, sizeof(run));
    float init[32], fs[32], fw[32];
    int apply, i;
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    map = vector_map(ctx, 3, 2, 16);
    assert_int_equal(dsgd_shard_map_server_floats(map, 2), 0);
    for (i = 0; i < 32; ++i) init[i] = 0.01f * (float)i;
    for (apply = 0; apply < 2; ++apply) {
        memset(R, 0, sizeof *R);
        R->n = 32;
        R->map = map;
        R->init = init;
        R->final = apply ? fw : fs;
        R->d.num_servers = 3;
        R->d.num_workers = 2;
        R->d.policy = DSGD_PS_SYNC;
        R->d.apply = apply ? DSGD_PS_APPLY_ON_WORKERS : DSGD_PS_APPLY_ON_SERVERS;
        R->d.optimizer.kind = DSGD_OPT_MOMENTUM;
        R->d.optimizer.lr = 0.1f;
        R->d.optimizer.momentum = 0.9f;
        R->body = body_random;
        R->skip_worker = -1;
        R->seed = 5;
        run_ps(R);
        expect_all_ok(R);
        for (i = 0; i < 3; ++i) assert_int_equal(R->st[i].version, RB_K);
    }
    assert_memory_equal(fw, fs, sizeof fs);
    assert_true(memcmp(fs, init, sizeof fs) != 0); /* it trained */
    dsgd_shard_map_destroy(map);
    dsgd_ctx_destroy(ctx);
    free(R);
    tu_watchdog(0);
}

/* Summation only under SSP (s = 2), a worker finishing early: worker 0
   runs all its clocks while the others hold back their last 3 until it is
   finishing, then pull after their last push. dsgd_ps_worker_finish
   fetches every mean first, so every worker ends with the bits of the
   servers applying, and each server can be saved after serve (before,
   worker 0 finished without the last means, which the servers then let
   go, and the save failed with DSGD_ERR_STATE). */
#define SE_K 8
typedef struct se_data {
    int finishing; /* atomic: worker 0 entered finish */
} se_data;

static dsgd_result body_ssp_end(run *R, int w, dsgd_ps_worker *pw) {
    se_data *D = (se_data *)R->user;
    float p[128], g[128];
    double give_up = dsgd_now() + 20.0;
    dsgd_result r = DSGD_OK;
    size_t j;
    int k;
    for (k = 0; k < SE_K && r == DSGD_OK; ++k) {
        if (w != 0 && k == SE_K - 3)
            while (!__atomic_load_n(&D->finishing, __ATOMIC_SEQ_CST) && dsgd_now() < give_up) sleep_us(100);
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        for (j = 0; j < R->n; ++j) g[j] = rand_grad(R->seed, w, k, j);
        r = dsgd_ps_worker_push(pw, g);
    }
    if (r == DSGD_OK && w != 0) r = dsgd_ps_worker_pull(pw, p);
    if (w == 0) __atomic_store_n(&D->finishing, 1, __ATOMIC_SEQ_CST);
    if (r == DSGD_OK) r = dsgd_ps_worker_finish(pw);
    return r;
}

static void test_sum_only_ssp_finish(void **state) {
    char dir[] = "/tmp/dsgd_test_XXXXXX", prefix[64];
    dsgd_ctx *ctx;
    dsgd_model *m;
    run *R = (run *)calloc(1, sizeof(run));
    se_data D;
    float init[128], fs[128], fw[128], wf[3][128];
    int apply, w, i;
    (void)state;
    tu_watchdog(60);
    assert_non_null(mkdtemp(dir));
    snprintf(prefix, sizeof prefix, "%s/end", dir);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    m = mlp(ctx);
    for (apply = 0; apply < 2; ++apply) {
        memset(R, 0, sizeof *R);
        memset(&D, 0, sizeof D);
        R->n = dsgd_model_num_params(m);
        R->map = model_map(ctx, m, 2);
        TU_OK(ctx, dsgd_model_get_params(m, init, R->n));
        R->init = init;
        R->final = apply ? fw : fs;
        for (w = 0; w < 3 && apply; ++w) R->wfinal[w] = wf[w];
        R->d.num_servers = 2;
        R->d.num_workers = 3;
        R->d.policy = DSGD_PS_SSP;
        R->d.staleness = 2;
        R->d.apply = apply ? DSGD_PS_APPLY_ON_WORKERS : DSGD_PS_APPLY_ON_SERVERS;
        R->d.optimizer.kind = DSGD_OPT_ADAM;
        R->d.optimizer.lr = 0.01f;
        R->body = body_ssp_end;
        R->user = &D;
        R->skip_worker = -1;
        R->body_finishes = 1;
        R->seed = 17;
        R->save = prefix;
        run_ps(R);
        expect_all_ok(R);
        for (i = 0; i < 2; ++i) assert_int_equal(R->st[i].version, SE_K);
        dsgd_shard_map_destroy((dsgd_shard_map *)R->map);
    }
    for (w = 0; w < 3; ++w)
        if (memcmp(wf[w], fs, MLP_N * sizeof(float)) != 0) fail_msg("worker %d's final copy differs", w);
    for (i = 0; i < 2; ++i) {
        snprintf(prefix, sizeof prefix, "%s/end.%d", dir, i);
        assert_int_equal(unlink(prefix), 0);
    }
    assert_int_equal(rmdir(dir), 0);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(R);
    tu_watchdog(0);
}

/* BACKUP 2 + 1 with the workers applying: the straggler pulls once, waits
   until the others have made 3 steps, pushes (dropped as stale), and its
   next pull catches up on the 3 means it missed, one round each, in order.
   At every version every worker holds the same bits (momentum, so the
   order matters), and at the end too. */
#define CU_K 8
#define CU_W 3
typedef struct cu_data {
    float at[CU_W][CU_K + 1][16];
    int seen[CU_W][CU_K + 1];
    int fast_read;   /* atomic: the highest version a fast worker read */
    int slow_started; /* atomic: the straggler has pulled once */
    int first_dropped;
} cu_data;

static dsgd_result body_catchup(run *R, int w, dsgd_ps_worker *pw) {
    cu_data *D = (cu_data *)R->user;
    float p[16], g[16];
    dsgd_result r = DSGD_OK;
    double give_up = dsgd_now() + 20.0;
    int k;
    size_t j;
    /* the others start once the straggler has pulled version 0 */
    while (w != CU_W - 1 && !__atomic_load_n(&D->slow_started, __ATOMIC_SEQ_CST) && dsgd_now() < give_up) sleep_us(50);
    for (k = 0; r == DSGD_OK; ++k) {
        int64_t v;
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        v = dsgd_ps_worker_version(pw, 0);
        if (w == CU_W - 1) __atomic_store_n(&D->slow_started, 1, __ATOMIC_SEQ_CST);
        if (v < 0 || v > CU_K) {
            note_bad(R, 1 + w, "version %lld beyond %d", (long long)v, CU_K);
            break;
        }
        memcpy(D->at[w][v], p, sizeof p);
        D->seen[w][v] = 1;
        if (w != CU_W - 1) {
            int cur = __atomic_load_n(&D->fast_read, __ATOMIC_SEQ_CST);
            while (cur < (int)v && !__atomic_compare_exchange_n(&D->fast_read, &cur, (int)v, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            }
        }
        if (v >= CU_K) break;
        if (w == CU_W - 1 && k == 0) /* the straggler */
            while (__atomic_load_n(&D->fast_read, __ATOMIC_SEQ_CST) < 3 && dsgd_now() < give_up) sleep_us(100);
        for (j = 0; j < R->n; ++j) g[j] = rand_grad(R->seed, w, (int)v, j);
        r = dsgd_ps_worker_push(pw, g);
        if (w == CU_W - 1 && k == 0) D->first_dropped = dsgd_ps_worker_last_push_dropped(pw, 0);
    }
    return r;
}

static void test_sum_only_catch_up(void **state) {
    dsgd_ctx *ctx;
    dsgd_shard_map *map;
    run *R = (run *)calloc(1, sizeof(run));
    cu_data *D = (cu_data *)calloc(1, sizeof(cu_data));
    float init[16], final[16], wfinal[CU_W][16];
    int64_t calls = 0;
    size_t j;
    int w, v;
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    map = vector_map(ctx, 1, 4, 4);
    for (j = 0; j < 16; ++j) init[j] = (float)j * 0.25f - 1.0f;
    R->n = 16;
    R->map = map;
    R->init = init;
    R->final = final;
    for (w = 0; w < CU_W; ++w) R->wfinal[w] = wfinal[w];
    R->d.num_servers = 1;
    R->d.num_workers = CU_W;
    R->d.policy = DSGD_PS_BACKUP;
    R->d.backup_workers = 1;
    R->d.apply = DSGD_PS_APPLY_ON_WORKERS;
    R->d.optimizer.kind = DSGD_OPT_MOMENTUM;
    R->d.optimizer.lr = 0.1f;
    R->body = body_catchup;
    R->user = D;
    R->skip_worker = -1;
    R->seed = 17;
    run_ps(R);
    expect_all_ok(R);
    assert_true(R->st[0].version == CU_K);
    assert_true(D->first_dropped == 1 && R->st[0].stale_dropped >= 1);
    for (w = 0; w < CU_W; ++w) calls += R->wst[1 + w].pulls;
    print_message("catch-up: %lld pull calls took %lld rounds; %lld pushes dropped\n", (long long)calls,
                  (long long)R->st[0].pulls_answered, (long long)R->st[0].stale_dropped);
    assert_true(R->st[0].pulls_answered >= calls + 2); /* the straggler fetched 3 means in one call */
    /* A step from v to v + 1 takes two fresh pushes made at v, so at least
       two workers read every version before the last, and every worker reads
       the last (so at least CU_K + CU_W - 1 copies are compared); compare
       each copy with the first worker's that read it. Which workers they are
       depends on the scheduling. */
    for (v = 0; v <= CU_K; ++v) {
        int first = -1, readers = 0;
        for (w = 0; w < CU_W; ++w) {
            if (!D->seen[w][v]) continue;
            readers++;
            if (first < 0) first = w;
            else if (memcmp(D->at[w][v], D->at[first][v], sizeof D->at[0][v]) != 0)
                fail_msg("version %d: worker %d's copy differs from worker %d's", v, w, first);
        }
        if (readers < (v < CU_K ? 2 : CU_W)) fail_msg("version %d was read by %d workers", v, readers);
    }
    assert_true(D->seen[CU_W - 1][0] && !D->seen[CU_W - 1][1] && !D->seen[CU_W - 1][2]); /* skipped, not missed */
    for (w = 0; w < CU_W; ++w) assert_memory_equal(wfinal[w], final, sizeof final);
    assert_memory_equal(final, D->at[0][CU_K], sizeof final);
    dsgd_shard_map_destroy(map);
    dsgd_ctx_destroy(ctx);
    free(D);
    free(R);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- 5: staleness */

static dsgd_result body_one(run *R, int w, dsgd_ps_worker *pw) {
    float p[16], g[16];
    dsgd_result r = DSGD_OK;
    int k;
    size_t j;
    (void)w;
    for (j = 0; j < R->n; ++j) g[j] = 1.0f;
    for (k = 0; k < 50 && r == DSGD_OK; ++k) {
        if (R->seed == 0 || k == 0) r = dsgd_ps_worker_pull(pw, p); /* seed 1: pull only once */
        if (r == DSGD_OK) r = dsgd_ps_worker_push(pw, g);
        if (R->seed == 1 && k == 2) break;
    }
    return r;
}

static void test_staleness_stats(void **state) {
    dsgd_ctx *ctx;
    dsgd_shard_map *map;
    run *R = (run *)calloc(1, sizeof(run));
    float init[16] = {0}, final[16];
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    map = vector_map(ctx, 2, 4, 4);
    R->n = 16;
    R->map = map;
    R->init = init;
    R->final = final;
    R->d.num_servers = 2;
    R->d.num_workers = 1;
    R->body = body_one;
    R->skip_worker = -1;
    R->d.optimizer.lr = 1.0f;
    /* one ASYNC worker that pulls before each push: staleness 0 throughout */
    R->seed = 0;
    run_ps(R);
    expect_all_ok(R);
    assert_true(R->st[0].pushes_applied == 50 && R->hist[0][0] == 50 && R->st[0].staleness_max == 0);
    assert_true(R->st[0].staleness_mean == 0.0);
    expect_staleness_consistent(R, 0);
    assert_true(final[0] == -50.0f && final[15] == -50.0f);
    /* one pull, then three pushes computed on version 0: staleness 0, 1, 2;
       with 2 bins the last one holds 1 and 2 */
    memset(R->hist, 0, sizeof R->hist);
    R->seed = 1;
    R->d.staleness_bins = 2;
    run_ps(R);
    expect_all_ok(R);
    assert_true(R->st[1].pushes_applied == 3 && R->st[1].staleness_max == 2 && R->st[1].staleness_mean == 1.0);
    assert_true(R->st[1].staleness_bins == 2 && R->hist[1][0] == 1 && R->hist[1][1] == 2);
    expect_staleness_consistent(R, 1);
    dsgd_shard_map_destroy(map);
    dsgd_ctx_destroy(ctx);
    free(R);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- large messages */

/* Slices above the loopback's 64 KiB eager limit go by rendezvous (the
   sender waits for its receiver): ASYNC over the faulty transport with a
   1 ms retry (resends of large pushes in flight) and SYNC both finish, with
   the exact sums. */
#define LG_VARS 3
#define LG_EACH 40000
#define LG_K TU_PICK(12, 4) /* pushes per worker: every one is large; make test-full 12 */
static float large_grad(int w, int k, size_t j) { return 4.0f * (float)(w + 1) * (float)((int)((j + (size_t)k) % 5) - 2); }

static dsgd_result body_large(run *R, int w, dsgd_ps_worker *pw) {
    float *p = (float *)malloc(R->n * sizeof(float)), *g = (float *)malloc(R->n * sizeof(float));
    dsgd_result r = DSGD_OK;
    size_t j;
    int k;
    for (k = 0; k < LG_K && r == DSGD_OK; ++k) {
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        for (j = 0; j < R->n; ++j) g[j] = large_grad(w, k, j);
        r = dsgd_ps_worker_push(pw, g);
    }
    free(p);
    free(g);
    return r;
}

static void test_large_messages(void **state) {
    dsgd_ctx *ctx;
    dsgd_shard_map *map;
    run *R = (run *)calloc(1, sizeof(run));
    size_t n = (size_t)LG_VARS * LG_EACH, j;
    float *init = (float *)malloc(n * sizeof(float)), *final = (float *)malloc(n * sizeof(float));
    int pass, w, k;
    (void)state;
    tu_watchdog(300);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    map = vector_map(ctx, 2, LG_VARS, LG_EACH);
    for (j = 0; j < n; ++j) init[j] = (float)(int)(j % 1000);
    for (pass = 0; pass < 2; ++pass) {
        memset(R, 0, sizeof *R);
        R->n = n;
        R->map = map;
        R->init = init;
        R->final = final;
        R->d.num_servers = 2;
        R->d.num_workers = 4;
        R->d.policy = pass == 0 ? DSGD_PS_ASYNC : DSGD_PS_SYNC;
        R->d.optimizer.lr = 1.0f;
        R->d.retry_s = 0.001;
        R->faulty = pass == 0;
        R->body = body_large;
        R->skip_worker = -1;
        R->seed = 3;
        run_ps(R);
        expect_all_ok(R);
        for (j = 0; j < n; ++j) {
            float want = init[j];
            for (k = 0; k < LG_K; ++k) {
                float step = 0.0f;
                for (w = 0; w < 4; ++w) step += large_grad(w, k, j);
                want -= pass == 0 ? step : step / 4.0f;
            }
            if (final[j] != want) fail_msg("%s: parameter %zu is %g, want %g", dsgd_ps_policy_name(R->d.policy), j, (double)final[j], (double)want);
        }
        print_message("large %s: %lld + %lld duplicates, %lld push resends\n", dsgd_ps_policy_name(R->d.policy),
                      (long long)R->st[0].duplicates, (long long)R->st[1].duplicates,
                      (long long)(R->wst[2].push_resends + R->wst[3].push_resends + R->wst[4].push_resends + R->wst[5].push_resends));
    }
    dsgd_shard_map_destroy(map);
    dsgd_ctx_destroy(ctx);
    free(init);
    free(final);
    free(R);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- 6: errors */

static void test_bad_arguments(void **state) {
    dsgd_ctx *ctx;
    dsgd_loopback *hub, *hub3;
    dsgd_transport_i t0, t1, t3, noprobe;
    dsgd_shard_map *map, *map3;
    dsgd_ps_desc d, bad;
    dsgd_ps_server *s = NULL;
    dsgd_ps_worker *w = NULL;
    float init[8] = {0}, buf[8];
    dsgd_ps_server_stats st;
    dsgd_ps_worker_stats ws;
    (void)state;
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, 2, &hub), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, 3, &hub3), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, &t0), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 1, &t1), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub3, 0, &t3), DSGD_OK);
    map = vector_map(ctx, 1, 2, 4);
    map3 = vector_map(ctx, 3, 2, 4);
    memset(&d, 0, sizeof d);
    d.num_servers = 1;
    d.num_workers = 1;

    assert_string_equal(dsgd_ps_policy_name(DSGD_PS_ASYNC), "ASYNC");
    assert_string_equal(dsgd_ps_policy_name(DSGD_PS_SSP), "SSP");
    assert_string_equal(dsgd_ps_policy_name(DSGD_PS_SYNC), "SYNC");
    assert_string_equal(dsgd_ps_policy_name(DSGD_PS_BACKUP), "BACKUP");
    assert_string_equal(dsgd_ps_policy_name((dsgd_ps_policy)DSGD_PS_POLICY_COUNT), "?");

    assert_int_equal(dsgd_ps_server_create(NULL, &t0, &d, map, init, &s), DSGD_ERR_INVALID_ARGUMENT);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t0, &d, map, init, NULL));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, NULL, &d, map, init, &s));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t0, NULL, map, init, &s));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t0, &d, NULL, init, &s));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t0, &d, map, NULL, &s));
#define BAD_DESC(field_change, text)                                                         \
    do {                                                                                     \
        bad = d;                                                                             \
        field_change;                                                                        \
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t0, &bad, map, init, &s)); \
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), text));                              \
        assert_null(s);                                                                      \
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_create(ctx, &t1, &bad, map, &w)); \
        assert_null(w);                                                                      \
    } while (0)
    BAD_DESC(bad.num_servers = 0, "num_servers");
    BAD_DESC(bad.num_workers = -1, "num_workers");
    BAD_DESC(bad.policy = (dsgd_ps_policy)7, "unknown policy");
    BAD_DESC(bad.staleness = 1, "staleness");
    BAD_DESC((bad.policy = DSGD_PS_SSP, bad.staleness = -1), "staleness");
    BAD_DESC((bad.policy = DSGD_PS_SSP, bad.staleness = DSGD_PS_MAX_STALENESS + 1), "staleness");
    BAD_DESC(bad.backup_workers = 1, "backup_workers");
    BAD_DESC((bad.policy = DSGD_PS_BACKUP, bad.backup_workers = 1), "backup_workers"); /* b must be < W = 1 */
    BAD_DESC(bad.optimizer.clip_norm = 1.0f, "clip_norm");
    BAD_DESC(bad.optimizer.lr = -1.0f, "lr");
    BAD_DESC(bad.optimizer.kind = (dsgd_optimizer_kind)9, "optimizer kind");
    BAD_DESC(bad.timeout_s = -1.0, "timeout_s");
    BAD_DESC(bad.timeout_s = NAN, "timeout_s");
    BAD_DESC(bad.retry_s = -0.5, "retry_s");
    BAD_DESC(bad.staleness_bins = -2, "staleness_bins");
    BAD_DESC(bad.num_workers = 2, "ranks"); /* the transport has 2 ranks, 1 + 2 are needed */
    BAD_DESC(bad.apply = DSGD_PS_APPLY_ON_WORKERS, "ASYNC applies each push alone, so there is no step whose sum to publish");
    BAD_DESC((bad.policy = DSGD_PS_SYNC, bad.apply = (dsgd_ps_apply)2), "unknown apply");
#undef BAD_DESC
    /* roles and the map */
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t1, &d, map, init, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "not a server"));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_create(ctx, &t0, &d, map, &w));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "not a worker"));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t0, &d, map3, init, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "shard map"));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_create(ctx, &t3, &d, map, init, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "3 ranks"));
    noprobe = t0;
    noprobe.probe = NULL;
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_ps_server_create(ctx, &noprobe, &d, map, init, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "probe"));
    noprobe = t1;
    noprobe.probe = NULL;
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_ps_worker_create(ctx, &noprobe, &d, map, &w));

    /* NULL objects */
    assert_int_equal(dsgd_ps_server_serve(NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_ps_server_read_params(NULL, buf), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_ps_worker_pull(NULL, buf), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_ps_worker_push(NULL, buf), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_ps_worker_finish(NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_ps_worker_version(NULL, 0), -1);
    assert_int_equal(dsgd_ps_worker_last_push_dropped(NULL, 0), 0);
    dsgd_ps_server_get_stats(NULL, &st);
    assert_true(st.version == 0 && st.staleness_hist == NULL);
    dsgd_ps_worker_get_stats(NULL, &ws);
    assert_true(ws.clock == 0);
    dsgd_ps_server_destroy(NULL);
    dsgd_ps_worker_destroy(NULL);

    /* SYNC needs a pull before each push; nothing works after finish */
    d.policy = DSGD_PS_SYNC;
    TU_OK(ctx, dsgd_ps_worker_create(ctx, &t1, &d, map, &w));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_pull(w, NULL));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_push(w, buf));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "needs a pull before each push"));
    assert_int_equal(dsgd_ps_worker_version(w, 0), 0);
    assert_int_equal(dsgd_ps_worker_version(w, 1), -1);
    assert_int_equal(dsgd_ps_worker_failed(w), 0); /* misuse is refused, it does not break the worker */
    assert_int_equal(dsgd_ps_worker_failed(NULL), 0);
    TU_OK(ctx, dsgd_ps_worker_finish(w));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_pull(w, buf));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_finish(w));
    dsgd_ps_worker_destroy(w);
    /* a server whose worker already finished serves at once, then refuses a second serve */
    TU_OK(ctx, dsgd_ps_server_create(ctx, &t0, &d, map, init, &s));
    TU_OK(ctx, dsgd_ps_server_serve(s));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_server_serve(s));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_read_params(s, NULL));
    dsgd_ps_server_destroy(s);
    /* only the workers hold parameters when they apply: set before the first pull, read from a worker */
    TU_OK(ctx, dsgd_ps_worker_create(ctx, &t1, &d, map, &w));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_set_params(w, init));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "the servers hold the parameters"));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_read_params(w, buf));
    dsgd_ps_worker_destroy(w);
    d.apply = DSGD_PS_APPLY_ON_WORKERS;
    TU_OK(ctx, dsgd_ps_server_create(ctx, &t0, &d, map, NULL, &s)); /* no initial parameters needed */
    TU_ERR(ctx, DSGD_ERR_UNSUPPORTED, dsgd_ps_server_read_params(s, buf));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "holds no parameters"));
    dsgd_ps_server_destroy(s);
    TU_OK(ctx, dsgd_ps_worker_create(ctx, &t1, &d, map, &w));
    TU_ERR(ctx, DSGD_ERR_STATE, dsgd_ps_worker_pull(w, buf));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "dsgd_ps_worker_set_params before the first pull"));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_set_params(w, NULL));
    TU_OK(ctx, dsgd_ps_worker_set_params(w, init));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_read_params(w, NULL));
    TU_OK(ctx, dsgd_ps_worker_read_params(w, buf));
    assert_memory_equal(buf, init, sizeof buf);
    dsgd_ps_worker_destroy(w);
    assert_int_equal(dsgd_ps_worker_set_params(NULL, init), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_ps_worker_read_params(NULL, buf), DSGD_ERR_INVALID_ARGUMENT);

    dsgd_shard_map_destroy(map);
    dsgd_shard_map_destroy(map3);
    dsgd_loopback_destroy(hub);
    dsgd_loopback_destroy(hub3);
    dsgd_ctx_destroy(ctx);
}

static dsgd_result body_pull_push_pull(run *R, int w, dsgd_ps_worker *pw) {
    float p[16], g[16] = {0};
    dsgd_result r;
    (void)R;
    (void)w;
    if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) return r;
    if ((r = dsgd_ps_worker_push(pw, g)) != DSGD_OK) return r;
    return dsgd_ps_worker_pull(pw, p); /* SYNC: waits for the missing worker's push */
}

static void test_missing_worker(void **state) {
    dsgd_ctx *ctx;
    dsgd_shard_map *map;
    run *R = (run *)calloc(1, sizeof(run));
    float init[16] = {0}, final[16];
    double t0, waited;
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    map = vector_map(ctx, 1, 2, 8);
    R->n = 16;
    R->map = map;
    R->init = init;
    R->final = final;
    R->d.num_servers = 1;
    R->d.num_workers = 2;
    R->d.policy = DSGD_PS_SYNC;
    R->d.timeout_s = 0.5;
    R->body = body_pull_push_pull;
    R->skip_worker = 1; /* rank 2 never starts */
    t0 = dsgd_now();
    run_ps(R);
    waited = dsgd_now() - t0;
    assert_int_equal(R->res[0], DSGD_ERR_TIMEOUT);
    if (!strstr(R->msg[0], "dsgd_ps_server_serve: server 0: no message from worker 1 (rank 2) within 0.5 s"))
        fail_msg("server message: %s", R->msg[0]);
    assert_int_equal(R->res[1], DSGD_ERR_TIMEOUT);
    if (!strstr(R->msg[1], "dsgd_ps_worker_pull: worker 0: no parameters from server 0 within 0.5 s"))
        fail_msg("worker message: %s", R->msg[1]);
    assert_true(waited >= 0.5 && waited < (TU_TSAN ? 20.0 : 5.0));
    dsgd_shard_map_destroy(map);
    dsgd_ctx_destroy(ctx);
    free(R);
    tu_watchdog(0);
}

/* Runs that can never finish are stopped by the server at once: SYNC where
   a worker finished one clock early, and BACKUP workers that push a fixed
   number of times (the straggler's last step can never be completed). */
typedef struct stuck_data {
    int finished; /* atomic: workers that called finish */
} stuck_data;

static dsgd_result body_stuck(run *R, int w, dsgd_ps_worker *pw) {
    stuck_data *D = (stuck_data *)R->user;
    int W = R->d.num_workers, k, pushes = w == 0 ? 1 : 2;
    float p[16], g[16] = {0};
    dsgd_result r = DSGD_OK;
    double give_up = dsgd_now() + 20.0;
    if (R->d.policy == DSGD_PS_BACKUP) {
        pushes = 1;
        if (w == W - 1) /* the straggler starts once the others have finished */
            while (__atomic_load_n(&D->finished, __ATOMIC_SEQ_CST) < W - 1 && dsgd_now() < give_up) sleep_us(100);
    }
    for (k = 0; k <= pushes && r == DSGD_OK; ++k) {
        if (k == pushes && !(R->d.policy == DSGD_PS_SYNC ? w != 0 : w == W - 1)) break;
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK || k == pushes) break;
        r = dsgd_ps_worker_push(pw, g);
    }
    if (r == DSGD_OK && w != W - 1 && (R->d.policy == DSGD_PS_BACKUP || w == 0)) {
        r = dsgd_ps_worker_finish(pw);
        __atomic_add_fetch(&D->finished, 1, __ATOMIC_SEQ_CST);
    }
    return r;
}

static void test_stuck_runs_fail_fast(void **state) {
    dsgd_ctx *ctx;
    dsgd_shard_map *map;
    run *R = (run *)calloc(1, sizeof(run));
    stuck_data D;
    float init[16] = {0}, final[16];
    int pass;
    (void)state;
    tu_watchdog(60);
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    map = vector_map(ctx, 1, 2, 8);
    for (pass = 0; pass < 2; ++pass) {
        memset(R, 0, sizeof *R);
        memset(&D, 0, sizeof D);
        R->n = 16;
        R->map = map;
        R->init = init;
        R->final = final;
        R->d.num_servers = 1;
        R->d.num_workers = pass == 0 ? 2 : 3;
        R->d.policy = pass == 0 ? DSGD_PS_SYNC : DSGD_PS_BACKUP;
        R->d.backup_workers = pass == 0 ? 0 : 1;
        R->d.timeout_s = 0.5;
        R->body = body_stuck;
        R->user = &D;
        R->skip_worker = -1;
        R->body_finishes = 1;
        run_ps(R);
        print_message("%s: %s\n", dsgd_ps_policy_name(R->d.policy), R->msg[0]);
        assert_int_equal(R->res[0], DSGD_ERR_DESYNC);
        if (pass == 0) {
            assert_non_null(strstr(R->msg[0], "dsgd_ps_server_serve: server 0: worker 1 waits for version 2, which can "
                                              "never come: clock 1 needs a push of worker 0, which finished after 1 pushes"));
            assert_int_equal(R->res[1], DSGD_OK);          /* finished after 1 push */
            assert_int_equal(R->res[2], DSGD_ERR_TIMEOUT); /* waited for clock 1 */
        } else {
            assert_non_null(strstr(R->msg[0], "dsgd_ps_server_serve: server 0: worker 2 waits for version 2, which can "
                                              "never come: clock 1 has 1 of 2 gradients and 0 workers can still push"));
            assert_int_equal(R->res[1], DSGD_OK);
            assert_int_equal(R->res[2], DSGD_OK);
            assert_int_equal(R->res[3], DSGD_ERR_TIMEOUT); /* the straggler */
        }
    }
    dsgd_shard_map_destroy(map);
    dsgd_ctx_destroy(ctx);
    free(R);
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_staleness_stats),
        cmocka_unit_test(test_missing_worker),
        cmocka_unit_test(test_stuck_runs_fail_fast),
        cmocka_unit_test(test_sync_rounds),
        cmocka_unit_test(test_zero_bounds_are_sync),
        cmocka_unit_test(test_run_sync_ssp),
        cmocka_unit_test(test_run_backup),
        cmocka_unit_test(test_run_edges),
        cmocka_unit_test(test_sum_only_matches_servers),
        cmocka_unit_test(test_sum_only_catch_up),
        cmocka_unit_test(test_sum_only_empty_server),
        cmocka_unit_test(test_sum_only_ssp_finish),
        cmocka_unit_test(test_ssp_bound),
        cmocka_unit_test(test_backup_drops_stale),
        cmocka_unit_test(test_exactly_once),
        cmocka_unit_test(test_large_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
