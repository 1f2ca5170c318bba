/* soak.c - a randomised soak test of loopback training (make soak; a short
   run is part of make test). Not a cmocka test: it is named so that the
   tests/test_*.c glob leaves it out, and is built with ThreadSanitizer into
   build/tsan/soak.

   Each seed is one random configuration, drawn from the seed alone:

     strategy      MIRRORED (3 in 4) or CENTRAL_STORAGE, N = 1..6 replicas
     exchange      every dsgd_allreduce_algo (AUTO included), bucket_bytes
                   0 or a small odd size, piece_bytes 0, tiny, odd or huge
                   (the communicator clamps it), cpu_threads 1..2,
                   timeout_s 2..5
     model         input 3..12, 1..2 hidden layers of 1..16 units (any
                   activation), 2..5 outputs, softmax cross-entropy or MSE
                   (any final activation), max_batch 1..8 per replica
     optimizer     SGD, momentum (Nesterov or not), Adam or AdamW (eps
                   1e-4..1e-3 at N > 1, see make_cfg), sometimes weight
                   decay, gradient clipping or a warmup
     steps         3..8, each a global batch of 1..N * max_batch samples of
                   random data; on about one step in four one value of x is a
                   NaN (it lies in one replica's shard); nonfinite policy
                   SKIP or ERROR
     runs          sometimes a dsgd_strategy_run whose replicas all-reduce
                   small integers (the sum must be exact) between steps;
                   on about one seed in three, a dsgd_strategy_run in which
                   one random replica fails (see below), after a random
                   number of the steps

   What every seed checks:
   - All replicas start from the same weights as a DSGD_STRATEGY_ONE_DEVICE
     reference (same model desc and seed), bit for bit.
   - Every step, the reference trains on the same global batch (its
     max_batch is N times the replicas'). A step without NaN returns DSGD_OK
     with skipped 0 on both, info.step counting the updates applied. A step
     with NaN: under SKIP both return DSGD_OK with skipped 1; under ERROR
     both return DSGD_ERR_NON_FINITE and the strategy is not failed; either
     way every replica's weights are bitwise what they were before.
   - After every step all replicas' parameters (dsgd_strategy_model +
     dsgd_model_get_params) are bitwise identical, and they equal the
     reference's within max |w - ref| <= 1e-4 * max |ref| (float
     reassociation of the sharded gradient sum); at N = 1 bit for bit.
   - A failing run: one replica's fn returns an error of its own (at once
     while the others wait in a barrier; after a barrier of all while the
     others wait in an all-reduce; after a short sleep; from a collective it
     called with an unknown algorithm), or fails alone, or (N > 1) calls an
     all-reduce with a count the others do not pass (DSGD_ERR_DESYNC for
     the replicas that see the mismatch; the strategy's abort stops those
     still agreeing on the call, DSGD_ERR_ABORTED). dsgd_strategy_run must
     return that error (the desync: DSGD_ERR_DESYNC, which at least one
     replica must report), within half the timeout (the strategy aborts its
     transport; the fn's sleep is at most 30 ms), the replicas left waiting
     in a collective must report DSGD_ERR_ABORTED "aborted because replica k
     failed", dsgd_strategy_failed must be set, and train_step and run
     must then return DSGD_ERR_STATE.

   The seeds run in child processes, a batch of them in each; the child
   reports each seed's start and verdict through a pipe. A seed that does
   not finish within --bound seconds (default 30) is killed and counted as a
   hang; a child that dies (a crash, a ThreadSanitizer report, which halts
   it) is blamed on the seed it was running, and a new child goes on with
   the next seed. Each failing seed is printed with its configuration and
   the reason; the last line is "N passed, N failed"; the exit status is 1
   when a seed failed.

   Usage: build/tsan/soak [--seeds N] [--first K] [--bound S] [--batch B]
            N seeds from K (default from 1: 16, the short run of make test,
            or 50 with DSGD_TEST_FULL=1 in the environment, make
            test-full's; tools/run_tests.sh counts them as N tests), S
            seconds each at most (default 30), B seeds per child process
            (default 50)
          build/tsan/soak --seed K     one seed in this process, verbosely

   Build: make soak SOAK_SEEDS=N (default 1000), or make build/tsan/soak
   (compiled without the implementation and linked against the library
   built once per variant, as the tests are). */
#define _POSIX_C_SOURCE 200809L
#include "../distsgd.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Under ThreadSanitizer the first report ends the process, so that a child
   that dies can be blamed on the seed it was running (TSAN_OPTIONS may
   still override it). */
#if defined(__SANITIZE_THREAD__)
#define SOAK_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SOAK_TSAN 1
#endif
#endif
#ifdef SOAK_TSAN
const char *__tsan_default_options(void);
const char *__tsan_default_options(void) { return "halt_on_error=1"; }
#endif

enum { MAX_N = 6, MAX_STEPS = 8, MAX_HIDDEN = 2, MAX_IN = 12, MAX_OUT = 5, MAX_MB = 8 };

#define REL_TOL 1e-4

/* ---------------------------------------------------------------- random */

/* SplitMix64: the soak's own generator, so that a seed's configuration does
   not move when the library's generator changes. */
typedef struct soak_rng {
    uint64_t s;
} soak_rng;

static uint64_t rng_next(soak_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1). */
static double rng_unit(soak_rng *r) { return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0); }

/* Uniform integer in [lo, hi]. */
static int rng_int(soak_rng *r, int lo, int hi) { return lo + (int)(rng_next(r) % (uint64_t)(hi - lo + 1)); }

static int rng_chance(soak_rng *r, double p) { return rng_unit(r) < p; }

/* ---------------------------------------------------------------- configuration */

/* How the failing dsgd_strategy_run fails (replica f is the one that fails). */
typedef enum fail_mode {
    FAIL_NONE = 0,
    FAIL_AT_ONCE,      /* f returns its error at once; the others enter a barrier */
    FAIL_AFTER_BARRIER, /* a barrier of all; then f fails, the others all-reduce */
    FAIL_AFTER_SLEEP,  /* the others all-reduce; f sleeps 1..30 ms, then fails */
    FAIL_BAD_ARGUMENT, /* the others all-reduce; f calls one with an unknown algorithm
                          (DSGD_ERR_INVALID_ARGUMENT, its own) and returns that */
    FAIL_ALONE,        /* f fails; the others return DSGD_OK without a collective */
    FAIL_DESYNC,       /* f all-reduces one float more than the others: every
                          replica gets DSGD_ERR_DESYNC (N > 1) */
    FAIL_MODES
} fail_mode;

static const char *const fail_mode_names[FAIL_MODES] = {"none",        "at_once", "after_barrier", "after_sleep",
                                                         "bad_argument", "alone",   "desync"};

typedef struct soak_cfg {
    uint64_t seed;
    dsgd_strategy_kind kind;
    int n;
    dsgd_allreduce_algo algo;
    size_t bucket_bytes, piece_bytes;
    int cpu_threads;
    double timeout_s;
    dsgd_nonfinite_policy policy;
    /* model */
    int input_dim, num_layers, max_batch;
    dsgd_layer_desc layers[MAX_HIDDEN + 1];
    dsgd_loss loss;
    uint64_t model_seed;
    dsgd_optimizer_desc opt;
    /* the steps */
    int steps;
    int count[MAX_STEPS];
    int nan_at[MAX_STEPS];   /* index into x of the NaN, -1: none */
    int good_run[MAX_STEPS]; /* a successful dsgd_strategy_run before this step */
    uint64_t data_seed;
    /* the failing run */
    fail_mode fail;
    int fail_after;  /* steps trained before it */
    int fail_replica;
    dsgd_result fail_code;
    int fail_sleep_ms;
    dsgd_allreduce_algo fail_algo; /* the others' all-reduce */
} soak_cfg;

static int target_dim(const soak_cfg *c) {
    return c->loss == DSGD_LOSS_MSE ? c->layers[c->num_layers - 1].units : 1;
}

static soak_cfg make_cfg(uint64_t seed) {
    static const dsgd_result codes[4] = {DSGD_ERR_BACKEND, DSGD_ERR_IO, DSGD_ERR_INVALID_ARGUMENT,
                                         DSGD_ERR_OUT_OF_MEMORY};
    soak_cfg c;
    soak_rng r;
    int i, hidden;
    memset(&c, 0, sizeof(c));
    r.s = seed * 0x2545F4914F6CDD1Dull + 0x5DEECE66Dull;
    c.seed = seed;
    c.kind = rng_chance(&r, 0.25) ? DSGD_STRATEGY_CENTRAL_STORAGE : DSGD_STRATEGY_MIRRORED;
    c.n = rng_int(&r, 1, MAX_N);
    c.algo = (dsgd_allreduce_algo)rng_int(&r, 0, DSGD_ALLREDUCE_COUNT - 1);
    switch (rng_int(&r, 0, 3)) {
    case 0: case 1: c.bucket_bytes = 0; break;
    case 2: c.bucket_bytes = (size_t)(2 * rng_int(&r, 0, 20) + 1); break; /* 1..41: 0..10 floats */
    default: c.bucket_bytes = (size_t)(2 * rng_int(&r, 20, 600) + 1); break;
    }
    switch (rng_int(&r, 0, 4)) {
    case 0: case 1: c.piece_bytes = 0; break;
    case 2: c.piece_bytes = (size_t)rng_int(&r, 1, 300); break; /* clamped to 256 */
    case 3: c.piece_bytes = (size_t)(2 * rng_int(&r, 128, 4000) + 1); break;
    default: c.piece_bytes = SIZE_MAX; break; /* clamped to 1 GiB */
    }
    c.cpu_threads = rng_int(&r, 1, 2);
    c.timeout_s = 2.0 + 3.0 * rng_unit(&r);
    c.policy = rng_chance(&r, 0.5) ? DSGD_NONFINITE_ERROR : DSGD_NONFINITE_SKIP;

    c.input_dim = rng_int(&r, 3, MAX_IN);
    hidden = rng_int(&r, 1, MAX_HIDDEN);
    c.num_layers = hidden + 1;
    c.loss = rng_chance(&r, 0.5) ? DSGD_LOSS_MSE : DSGD_LOSS_SOFTMAX_XENT;
    for (i = 0; i < hidden; ++i) {
        c.layers[i].units = rng_int(&r, 1, 16);
        c.layers[i].activation = (dsgd_activation)rng_int(&r, 0, 3);
        c.layers[i].init = (dsgd_init)rng_int(&r, 0, 4);
    }
    c.layers[hidden].units = rng_int(&r, 2, MAX_OUT);
    c.layers[hidden].activation = c.loss == DSGD_LOSS_MSE ? (dsgd_activation)rng_int(&r, 0, 3) : DSGD_ACT_NONE;
    c.layers[hidden].init = (dsgd_init)rng_int(&r, 0, 4);
    c.max_batch = rng_int(&r, 1, MAX_MB);
    c.model_seed = rng_next(&r);

    c.opt.kind = (dsgd_optimizer_kind)rng_int(&r, 0, DSGD_OPT_COUNT - 1);
    switch (c.opt.kind) {
    case DSGD_OPT_SGD: c.opt.lr = (float)(0.01 + 0.19 * rng_unit(&r)); break;
    case DSGD_OPT_MOMENTUM:
        c.opt.lr = (float)(0.01 + 0.09 * rng_unit(&r));
        c.opt.momentum = (float)(0.5 + 0.45 * rng_unit(&r));
        c.opt.nesterov = rng_int(&r, 0, 1);
        break;
    default: c.opt.lr = (float)(0.0005 + 0.0045 * rng_unit(&r)); break;
    }
    if (rng_chance(&r, 0.25)) c.opt.weight_decay = (float)(0.001 + 0.01 * rng_unit(&r));
    if (rng_chance(&r, 0.25)) c.opt.clip_norm = (float)(0.1 + 2.0 * rng_unit(&r));
    if (rng_chance(&r, 0.25)) c.opt.schedule.warmup_steps = rng_int(&r, 1, 3);

    c.steps = rng_int(&r, 3, MAX_STEPS);
    for (i = 0; i < c.steps; ++i) {
        c.count[i] = rng_int(&r, 1, c.n * c.max_batch);
        c.nan_at[i] = rng_chance(&r, 0.25) ? rng_int(&r, 0, c.count[i] * c.input_dim - 1) : -1;
        c.good_run[i] = rng_chance(&r, 0.15);
    }
    c.data_seed = rng_next(&r);

    if (rng_chance(&r, 0.35)) {
        c.fail = (fail_mode)rng_int(&r, FAIL_AT_ONCE, FAIL_MODES - 1);
        if (c.n == 1 && c.fail == FAIL_DESYNC) c.fail = FAIL_ALONE; /* nobody to disagree with */
        c.fail_after = rng_int(&r, 0, c.steps);
        c.fail_replica = rng_int(&r, 0, c.n - 1);
        c.fail_code = codes[rng_int(&r, 0, 3)];
        c.fail_sleep_ms = rng_int(&r, 1, 30);
        c.fail_algo = (dsgd_allreduce_algo)rng_int(&r, 0, DSGD_ALLREDUCE_COUNT - 1);
    }
    /* Adam's update g / (sqrt(v) + eps) turns a gradient that is zero but
       for rounding (a dead network's uniform softmax, its bias gradient
       1/5 - 3/15) into a step of lr whose sign is the rounding's, which the
       sharded sum and one_device's need not share: with N > 1, eps is
       1e-4..1e-3, so that such noise moves a weight by at most ~1e-3 lr.
       At N = 1 the comparison is bitwise and eps keeps its default. */
    if ((c.opt.kind == DSGD_OPT_ADAM || c.opt.kind == DSGD_OPT_ADAMW) && c.n > 1)
        c.opt.eps = (float)(1e-4 + 9e-4 * rng_unit(&r));
    return c;
}

static const char *act_name(dsgd_activation a) {
    static const char *const names[4] = {"none", "relu", "tanh", "sigmoid"};
    return (int)a >= 0 && (int)a < 4 ? names[a] : "?";
}

static const char *opt_name(dsgd_optimizer_kind k) {
    static const char *const names[DSGD_OPT_COUNT] = {"sgd", "momentum", "adam", "adamw"};
    return (int)k >= 0 && (int)k < DSGD_OPT_COUNT ? names[k] : "?";
}

/* The configuration in a few lines, each indented by two spaces. */
static void describe(const soak_cfg *c, FILE *f) {
    int i;
    fprintf(f, "  %s N=%d algo=%s bucket_bytes=%zu piece_bytes=%zu cpu_threads=%d timeout_s=%.2f nonfinite=%s\n",
            dsgd_strategy_kind_name(c->kind), c->n, dsgd_allreduce_algo_name(c->algo), c->bucket_bytes,
            c->piece_bytes, c->cpu_threads, c->timeout_s, c->policy == DSGD_NONFINITE_SKIP ? "skip" : "error");
    fprintf(f, "  model %d", c->input_dim);
    for (i = 0; i < c->num_layers; ++i)
        fprintf(f, " -> %d %s (init %d)", c->layers[i].units, act_name(c->layers[i].activation),
                (int)c->layers[i].init);
    fprintf(f, ", %s, max_batch %d, seed %llu\n", c->loss == DSGD_LOSS_MSE ? "mse" : "softmax_xent", c->max_batch,
            (unsigned long long)c->model_seed);
    fprintf(f, "  optimizer %s lr=%g momentum=%g nesterov=%d eps=%g weight_decay=%g clip_norm=%g warmup=%lld\n",
            opt_name(c->opt.kind), (double)c->opt.lr, (double)c->opt.momentum, c->opt.nesterov, (double)c->opt.eps,
            (double)c->opt.weight_decay, (double)c->opt.clip_norm, (long long)c->opt.schedule.warmup_steps);
    fprintf(f, "  steps:");
    for (i = 0; i < c->steps; ++i)
        fprintf(f, " %s%d%s", c->good_run[i] ? "run+" : "", c->count[i], c->nan_at[i] >= 0 ? "(nan)" : "");
    fprintf(f, "\n");
    if (c->fail != FAIL_NONE)
        fprintf(f, "  failing run after step %d: replica %d, %s, %s (sleep %d ms, others' algo %s)\n", c->fail_after,
                c->fail_replica, fail_mode_names[c->fail], dsgd_result_string(c->fail_code), c->fail_sleep_ms,
                dsgd_allreduce_algo_name(c->fail_algo));
}

/* ---------------------------------------------------------------- one seed */

typedef struct soak_state {
    const soak_cfg *c;
    int verbose;
    char why[1024]; /* the first failed check */
    dsgd_ctx *ctx, *ref_ctx;
    dsgd_strategy *s, *ref;
    size_t p;
    float *w[MAX_N], *w_before[MAX_N], *w_ref;
} soak_state;

static int fail_check(soak_state *st, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Records the first failed check; returns 1 so that callers can write
   `return fail_check(...)`. */
static int fail_check(soak_state *st, const char *fmt, ...) {
    va_list ap;
    if (st->why[0]) return 1;
    va_start(ap, fmt);
    vsnprintf(st->why, sizeof(st->why), fmt, ap);
    va_end(ap);
    return 1;
}

static void vlog(const soak_state *st, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void vlog(const soak_state *st, const char *fmt, ...) {
    va_list ap;
    if (!st->verbose) return;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    fflush(stdout);
}

/* Reads every replica's parameters into dst[r] and the reference's into
   ref (when not NULL). */
static int read_params(soak_state *st, float **dst, float *ref) {
    int r;
    for (r = 0; r < st->c->n; ++r) {
        dsgd_result res = dsgd_model_get_params(dsgd_strategy_model(st->s, r), dst[r], st->p);
        if (res != DSGD_OK)
            return fail_check(st, "dsgd_model_get_params(replica %d) -> %s: %s", r, dsgd_result_string(res),
                              dsgd_ctx_last_error(st->ctx));
    }
    if (ref) {
        dsgd_result res = dsgd_model_get_params(dsgd_strategy_model(st->ref, 0), ref, st->p);
        if (res != DSGD_OK)
            return fail_check(st, "dsgd_model_get_params(reference) -> %s", dsgd_result_string(res));
    }
    return 0;
}

/* Every replica's w bitwise equal to replica 0's (and to `want`, when not
   NULL). */
static int check_identical(soak_state *st, const char *when, float *const *want) {
    int r;
    size_t i;
    for (r = 0; r < st->c->n; ++r) {
        const float *a = st->w[r], *b = want ? want[r] : st->w[0];
        if (memcmp(a, b, st->p * sizeof(float)) == 0) continue;
        for (i = 0; i < st->p && memcmp(&a[i], &b[i], sizeof(float)) == 0; ++i) {
        }
        return fail_check(st, "%s: replica %d's parameter %zu is %.9g, %s %.9g", when, r, i, (double)a[i],
                          want ? "it was" : "replica 0 has", (double)b[i]);
    }
    return 0;
}

/* Replica 0 against the reference: bitwise at N = 1, else within REL_TOL
   of max |ref|. */
static int check_reference(soak_state *st, const char *when) {
    double maxdiff = 0.0, maxref = 0.0;
    size_t i, worst = 0;
    for (i = 0; i < st->p; ++i) {
        double d = fabs((double)st->w[0][i] - (double)st->w_ref[i]);
        if (!(d <= maxdiff)) { /* NaN included */
            maxdiff = d;
            worst = i;
        }
        if (fabs((double)st->w_ref[i]) > maxref) maxref = fabs((double)st->w_ref[i]);
    }
    if (st->c->n == 1 && memcmp(st->w[0], st->w_ref, st->p * sizeof(float)) != 0) {
        for (i = 0; i < st->p && memcmp(&st->w[0][i], &st->w_ref[i], sizeof(float)) == 0; ++i) {
        }
        return fail_check(st, "%s: N = 1 but parameter %zu is %.9g, one_device has %.9g (want the same bits)",
                          when, i, (double)st->w[0][i], (double)st->w_ref[i]);
    }
    vlog(st, "    vs one_device: max |diff| %.3g, max |ref| %.3g, relative %.3g\n", maxdiff, maxref,
         maxref > 0 ? maxdiff / maxref : maxdiff);
    if (!(maxdiff <= REL_TOL * (maxref > 1e-3 ? maxref : 1e-3)))
        return fail_check(st, "%s: parameter %zu is %.9g, one_device has %.9g (max |diff| %.3g > %g * max |ref| %.3g)",
                          when, worst, (double)st->w[0][worst], (double)st->w_ref[worst], maxdiff, REL_TOL, maxref);
    return 0;
}

/* ---- the runs */

/* A run that must succeed: every replica all-reduces (rank + 1) * (i + 1),
   exact in floats, with the seed's algorithm, then barriers. */
static dsgd_result good_fn(dsgd_replica *rep, void *user) {
    const soak_cfg *c = (const soak_cfg *)user;
    dsgd_comm *comm = dsgd_replica_comm(rep);
    int rank = dsgd_replica_id(rep), n = dsgd_replica_count(rep), i;
    float buf[37];
    dsgd_result res;
    if (!comm) return DSGD_OK;
    for (i = 0; i < 37; ++i) buf[i] = (float)((rank + 1) * (i + 1));
    if ((res = dsgd_allreduce(comm, buf, 37, DSGD_REDUCE_SUM, c->algo, 0.0)) != DSGD_OK) return res;
    for (i = 0; i < 37; ++i)
        if (buf[i] != (float)(n * (n + 1) / 2 * (i + 1)))
            return dsgd_ctx_set_error(dsgd_replica_ctx(rep), DSGD_ERR_STATE,
                                      "soak: all-reduce element %d is %g, want %d", i, (double)buf[i],
                                      n * (n + 1) / 2 * (i + 1));
    return dsgd_barrier(comm, 0.0);
}

static void sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* The failing run (see fail_mode). */
static dsgd_result fail_fn(dsgd_replica *rep, void *user) {
    const soak_cfg *c = (const soak_cfg *)user;
    dsgd_comm *comm = dsgd_replica_comm(rep);
    dsgd_ctx *ctx = dsgd_replica_ctx(rep);
    int rank = dsgd_replica_id(rep), me = rank == c->fail_replica;
    float buf[29];
    dsgd_result res;
    memset(buf, 0, sizeof(buf));
    if (c->fail == FAIL_AFTER_BARRIER && comm && (res = dsgd_barrier(comm, 0.0)) != DSGD_OK) return res;
    if (!me) {
        if (!comm || c->fail == FAIL_ALONE) return DSGD_OK;
        if (c->fail == FAIL_AT_ONCE) return dsgd_barrier(comm, 0.0);
        return dsgd_allreduce(comm, buf, 29, DSGD_REDUCE_SUM, c->fail_algo, 0.0);
    }
    switch (c->fail) {
    case FAIL_AFTER_SLEEP: sleep_ms(c->fail_sleep_ms); break;
    case FAIL_BAD_ARGUMENT:
        if (comm) return dsgd_allreduce(comm, buf, 29, DSGD_REDUCE_SUM, (dsgd_allreduce_algo)99, 0.0);
        break;
    case FAIL_DESYNC: return dsgd_allreduce(comm, buf, 28, DSGD_REDUCE_SUM, c->fail_algo, 0.0);
    default: break;
    }
    return dsgd_ctx_set_error(ctx, c->fail_code, "soak: replica %d fails on purpose (%s)", rank,
                              fail_mode_names[c->fail]);
}

/* The failing run and what must follow it. */
static int check_failing_run(soak_state *st) {
    const soak_cfg *c = st->c;
    dsgd_result want = c->fail_code, res;
    int r, others_aborted = 0, desyncs = 0;
    double t0, dt;
    float x[MAX_IN], y[MAX_OUT];
    if (c->fail == FAIL_BAD_ARGUMENT && c->n > 1) want = DSGD_ERR_INVALID_ARGUMENT;
    if (c->fail == FAIL_DESYNC) want = DSGD_ERR_DESYNC;
    if (c->n > 1 && (c->fail == FAIL_AT_ONCE || c->fail == FAIL_AFTER_BARRIER || c->fail == FAIL_AFTER_SLEEP ||
                     c->fail == FAIL_BAD_ARGUMENT))
        others_aborted = 1;
    t0 = dsgd_now();
    res = dsgd_strategy_run(st->s, fail_fn, (void *)c);
    dt = dsgd_now() - t0;
    vlog(st, "  failing run: %s in %.3f s: %s\n", dsgd_result_string(res), dt, dsgd_ctx_last_error(st->ctx));
    if (res != want)
        return fail_check(st, "failing run returned %s, want %s (replica %d's): %s", dsgd_result_string(res),
                          dsgd_result_string(want), c->fail_replica, dsgd_ctx_last_error(st->ctx));
    if (dt > 0.5 * c->timeout_s)
        return fail_check(st, "failing run took %.3f s, more than half the %.2f s timeout (no abort?)", dt,
                          c->timeout_s);
    if (want == c->fail_code && !(c->fail == FAIL_BAD_ARGUMENT && c->n > 1) && !strstr(dsgd_ctx_last_error(st->ctx), "fails on purpose"))
        return fail_check(st, "failing run: the strategy's message is not replica %d's: %s", c->fail_replica,
                          dsgd_ctx_last_error(st->ctx));
    for (r = 0; r < c->n; ++r) {
        const char *msg = "";
        dsgd_result rr = dsgd_strategy_replica_result(st->s, r, &msg);
        char expect[64];
        if (c->fail == FAIL_DESYNC) {
            /* the first replica to see the mismatch returns it, and the
               strategy aborts the transport: a replica still agreeing on
               the call is aborted instead */
            if (rr == DSGD_ERR_DESYNC) {
                ++desyncs;
                continue;
            }
            if (rr != DSGD_ERR_ABORTED || !strstr(msg, "aborted because replica"))
                return fail_check(st, "failing run (desync): replica %d's result is %s, want %s or %s: %s", r,
                                  dsgd_result_string(rr), dsgd_result_string(DSGD_ERR_DESYNC),
                                  dsgd_result_string(DSGD_ERR_ABORTED), msg);
            continue;
        }
        if (r == c->fail_replica) {
            if (rr != want)
                return fail_check(st, "failing run: replica %d's own result is %s, want %s: %s", r,
                                  dsgd_result_string(rr), dsgd_result_string(want), msg);
            continue;
        }
        if (!others_aborted) {
            if (rr != DSGD_OK)
                return fail_check(st, "failing run: replica %d did nothing but got %s: %s", r,
                                  dsgd_result_string(rr), msg);
            continue;
        }
        snprintf(expect, sizeof(expect), "aborted because replica %d failed", c->fail_replica);
        if (rr != DSGD_ERR_ABORTED || !strstr(msg, expect))
            return fail_check(st, "failing run: replica %d, left waiting in a collective, got %s \"%s\"; want %s "
                                  "\"%s ...\"", r, dsgd_result_string(rr), msg,
                              dsgd_result_string(DSGD_ERR_ABORTED), expect);
    }
    if (c->fail == FAIL_DESYNC && desyncs == 0)
        return fail_check(st, "failing run (desync): no replica returned %s", dsgd_result_string(DSGD_ERR_DESYNC));
    if (!dsgd_strategy_failed(st->s)) return fail_check(st, "after a failing run dsgd_strategy_failed is 0");
    memset(x, 0, sizeof(x));
    memset(y, 0, sizeof(y));
    res = dsgd_strategy_train_step(st->s, x, y, 1, NULL);
    if (res != DSGD_ERR_STATE)
        return fail_check(st, "train_step after a failing run returned %s, want %s", dsgd_result_string(res),
                          dsgd_result_string(DSGD_ERR_STATE));
    res = dsgd_strategy_run(st->s, good_fn, (void *)c);
    if (res != DSGD_ERR_STATE)
        return fail_check(st, "run after a failing run returned %s, want %s", dsgd_result_string(res),
                          dsgd_result_string(DSGD_ERR_STATE));
    return 0;
}

/* ---- the steps */

static int train(soak_state *st) {
    const soak_cfg *c = st->c;
    soak_rng rng;
    int t, tdim = target_dim(c), applied = 0, k;
    float x[MAX_N * MAX_MB * MAX_IN], y[MAX_N * MAX_MB * MAX_OUT];
    char when[64];
    rng.s = c->data_seed;
    for (t = 0; t < c->steps; ++t) {
        int cnt = c->count[t], nan = c->nan_at[t] >= 0;
        dsgd_step_info info, rinfo;
        dsgd_result res, rres;
        if (c->fail != FAIL_NONE && t == c->fail_after) return check_failing_run(st);
        for (k = 0; k < cnt * c->input_dim; ++k) x[k] = (float)(2.0 * rng_unit(&rng) - 1.0);
        for (k = 0; k < cnt * tdim; ++k)
            y[k] = c->loss == DSGD_LOSS_MSE ? (float)(2.0 * rng_unit(&rng) - 1.0)
                                            : (float)rng_int(&rng, 0, c->layers[c->num_layers - 1].units - 1);
        if (nan) x[c->nan_at[t]] = (float)NAN;
        snprintf(when, sizeof(when), "step %d (count %d%s)", t, cnt, nan ? ", NaN in x" : "");
        if (c->good_run[t]) {
            res = dsgd_strategy_run(st->s, good_fn, (void *)c);
            if (res != DSGD_OK)
                return fail_check(st, "%s: a run of all-reduces before it returned %s: %s", when,
                                  dsgd_result_string(res), dsgd_ctx_last_error(st->ctx));
        }
        if (nan && read_params(st, st->w_before, NULL)) return 1;
        memset(&info, 0, sizeof(info));
        memset(&rinfo, 0, sizeof(rinfo));
        res = dsgd_strategy_train_step(st->s, x, y, cnt, &info);
        rres = dsgd_strategy_train_step(st->ref, x, y, cnt, &rinfo);
        vlog(st, "  %s: %s skipped=%d step=%lld lr=%g; one_device %s skipped=%d\n", when, dsgd_result_string(res),
             info.skipped, (long long)info.step, (double)info.lr, dsgd_result_string(rres), rinfo.skipped);
        if (nan && c->policy == DSGD_NONFINITE_ERROR) {
            if (res != DSGD_ERR_NON_FINITE)
                return fail_check(st, "%s, policy ERROR: returned %s, want %s: %s", when, dsgd_result_string(res),
                                  dsgd_result_string(DSGD_ERR_NON_FINITE), dsgd_ctx_last_error(st->ctx));
            if (dsgd_strategy_failed(st->s))
                return fail_check(st, "%s, policy ERROR: the strategy failed (it must stay usable)", when);
            if (rres != DSGD_ERR_NON_FINITE)
                return fail_check(st, "%s, policy ERROR: one_device returned %s: %s", when, dsgd_result_string(rres),
                                  dsgd_ctx_last_error(st->ref_ctx));
        } else {
            if (res != DSGD_OK)
                return fail_check(st, "%s: returned %s: %s", when, dsgd_result_string(res),
                                  dsgd_ctx_last_error(st->ctx));
            if (rres != DSGD_OK)
                return fail_check(st, "%s: one_device returned %s: %s", when, dsgd_result_string(rres),
                                  dsgd_ctx_last_error(st->ref_ctx));
            if (info.skipped != nan || rinfo.skipped != nan)
                return fail_check(st, "%s: skipped %d (one_device %d), want %d", when, info.skipped, rinfo.skipped,
                                  nan);
            if (info.step != applied || info.count != cnt)
                return fail_check(st, "%s: info.step %lld, info.count %d; want %d, %d", when, (long long)info.step,
                                  info.count, applied, cnt);
            if (info.lr != rinfo.lr)
                return fail_check(st, "%s: lr %.9g, one_device %.9g", when, (double)info.lr, (double)rinfo.lr);
            if (!nan) ++applied;
        }
        if (read_params(st, st->w, st->w_ref)) return 1;
        if (nan && check_identical(st, when, st->w_before)) return 1;
        if (check_identical(st, when, NULL)) return 1;
        if (check_reference(st, when)) return 1;
    }
    if (c->fail != FAIL_NONE && c->fail_after == c->steps) return check_failing_run(st);
    return 0;
}

static dsgd_result create(const soak_cfg *c, dsgd_ctx *ctx, int reference, dsgd_strategy **out) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = reference ? DSGD_STRATEGY_ONE_DEVICE : c->kind;
    d.num_replicas = reference ? 1 : c->n;
    d.model.input_dim = c->input_dim;
    d.model.layers = c->layers;
    d.model.num_layers = c->num_layers;
    d.model.loss = c->loss;
    d.model.max_batch = reference ? c->n * c->max_batch : c->max_batch;
    d.model.seed = c->model_seed;
    d.optimizer = c->opt;
    d.algorithm = c->algo;
    d.bucket_bytes = c->bucket_bytes;
    d.piece_bytes = c->piece_bytes;
    d.nonfinite = c->policy;
    d.timeout_s = c->timeout_s;
    d.cpu_threads = reference ? 1 : c->cpu_threads;
    return dsgd_strategy_create(ctx, &d, out);
}

/* Runs one seed; 0 when every check passed, else 1 with the reason in why. */
static int run_seed(uint64_t seed, int verbose, char *why, size_t cap) {
    soak_cfg c = make_cfg(seed);
    soak_state st;
    int r, bad = 0;
    dsgd_result res;
    memset(&st, 0, sizeof(st));
    st.c = &c;
    st.verbose = verbose;
    if (verbose) {
        printf("seed %llu:\n", (unsigned long long)seed);
        describe(&c, stdout);
        fflush(stdout);
    }
    if (dsgd_ctx_create(NULL, &st.ctx) != DSGD_OK || dsgd_ctx_create(NULL, &st.ref_ctx) != DSGD_OK) {
        bad = fail_check(&st, "dsgd_ctx_create failed");
        goto done;
    }
    if ((res = create(&c, st.ctx, 0, &st.s)) != DSGD_OK) {
        bad = fail_check(&st, "dsgd_strategy_create -> %s: %s", dsgd_result_string(res), dsgd_ctx_last_error(st.ctx));
        goto done;
    }
    if ((res = create(&c, st.ref_ctx, 1, &st.ref)) != DSGD_OK) {
        bad = fail_check(&st, "dsgd_strategy_create (one_device) -> %s: %s", dsgd_result_string(res),
                         dsgd_ctx_last_error(st.ref_ctx));
        goto done;
    }
    st.p = dsgd_model_num_params(dsgd_strategy_model(st.s, 0));
    if (st.p != dsgd_model_num_params(dsgd_strategy_model(st.ref, 0))) {
        bad = fail_check(&st, "%zu parameters, one_device has %zu", st.p,
                         dsgd_model_num_params(dsgd_strategy_model(st.ref, 0)));
        goto done;
    }
    for (r = 0; r < c.n; ++r) {
        st.w[r] = (float *)malloc(st.p * sizeof(float));
        st.w_before[r] = (float *)malloc(st.p * sizeof(float));
        if (!st.w[r] || !st.w_before[r]) {
            bad = fail_check(&st, "out of memory");
            goto done;
        }
    }
    if (!(st.w_ref = (float *)malloc(st.p * sizeof(float)))) {
        bad = fail_check(&st, "out of memory");
        goto done;
    }
    vlog(&st, "  %zu parameters\n", st.p);
    bad = read_params(&st, st.w, st.w_ref) || check_identical(&st, "at creation", NULL);
    if (!bad && memcmp(st.w[0], st.w_ref, st.p * sizeof(float)) != 0)
        bad = fail_check(&st, "at creation: replica 0's weights differ from one_device's (same desc and seed)");
    if (!bad) bad = train(&st);
done:
    dsgd_strategy_destroy(st.s);
    dsgd_strategy_destroy(st.ref);
    dsgd_ctx_destroy(st.ctx);
    dsgd_ctx_destroy(st.ref_ctx);
    for (r = 0; r < MAX_N; ++r) {
        free(st.w[r]);
        free(st.w_before[r]);
    }
    free(st.w_ref);
    snprintf(why, cap, "%s", st.why);
    return bad != 0 || st.why[0] != '\0';
}

static void print_failure(uint64_t seed, const char *why) {
    soak_cfg c = make_cfg(seed);
    printf("FAIL seed %llu: %s\n", (unsigned long long)seed, why);
    describe(&c, stdout);
    printf("  rerun: build/tsan/soak --seed %llu\n", (unsigned long long)seed);
    fflush(stdout);
}

/* ---------------------------------------------------------------- the children */

/* What a child tells its parent: a seed started ('S') or ended ('P' passed,
   'F' failed, already printed). */
typedef struct soak_msg {
    uint64_t seed;
    char what;
} soak_msg;

static void send_msg(int fd, uint64_t seed, char what) {
    soak_msg m;
    memset(&m, 0, sizeof(m));
    m.seed = seed;
    m.what = what;
    if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m)) _exit(3);
}

static void child(int fd, uint64_t first, uint64_t end) {
    uint64_t seed;
    char why[1024];
    for (seed = first; seed < end; ++seed) {
        int bad;
        send_msg(fd, seed, 'S');
        bad = run_seed(seed, 0, why, sizeof(why));
        if (bad) print_failure(seed, why);
        send_msg(fd, seed, bad ? 'F' : 'P');
    }
    fflush(stdout);
    exit(0); /* not _exit: ThreadSanitizer's end-of-process check runs */
}

static void describe_status(int status, char *buf, size_t cap) {
    if (WIFSIGNALED(status))
        snprintf(buf, cap, "killed by signal %d (%s)", WTERMSIG(status),
                 WTERMSIG(status) == SIGABRT ? "an assertion?" : "a crash");
    else if (WIFEXITED(status) && WEXITSTATUS(status) == 66)
        snprintf(buf, cap, "exit status 66 (a ThreadSanitizer report, printed above)");
    else if (WIFEXITED(status))
        snprintf(buf, cap, "exit status %d", WEXITSTATUS(status));
    else
        snprintf(buf, cap, "status %d", status);
}

/* Runs seeds [first, end) in children of `batch` seeds each; adds to *pass
   and *fail. */
static void run_seeds(uint64_t first, uint64_t end, int batch, double bound, int *pass, int *fail) {
    uint64_t next = first, shown = first;
    double t_start = dsgd_now();
    while (next < end) {
        uint64_t stop = next + (uint64_t)batch < end ? next + (uint64_t)batch : end, current = 0;
        int fds[2], started = 0, status = 0, killed = 0;
        double deadline = 0.0;
        char buf[sizeof(soak_msg) * 16];
        size_t have = 0;
        pid_t pid;
        if (pipe(fds) != 0) {
            perror("soak: pipe");
            exit(2);
        }
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0) {
            perror("soak: fork");
            exit(2);
        }
        if (pid == 0) {
            close(fds[0]);
            child(fds[1], next, stop);
        }
        close(fds[1]);
        for (;;) {
            struct pollfd pfd;
            int wait_ms = -1, pr;
            ssize_t got;
            if (started) {
                double left = deadline - dsgd_now();
                wait_ms = left > 0 ? (int)(left * 1000.0) + 1 : 0;
            }
            pfd.fd = fds[0];
            pfd.events = POLLIN;
            pfd.revents = 0;
            pr = poll(&pfd, 1, wait_ms);
            if (pr < 0 && errno == EINTR) continue;
            if (pr == 0) { /* the seed ran past its bound */
                kill(pid, SIGKILL);
                killed = 1;
                break;
            }
            got = read(fds[0], buf + have, sizeof(buf) - have);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) break; /* the child is gone */
            have += (size_t)got;
            while (have >= sizeof(soak_msg)) {
                soak_msg m;
                memcpy(&m, buf, sizeof(m));
                memmove(buf, buf + sizeof(m), have - sizeof(m));
                have -= sizeof(m);
                if (m.what == 'S') {
                    started = 1;
                    current = m.seed;
                    deadline = dsgd_now() + bound;
                } else {
                    started = 0;
                    if (m.what == 'P') ++*pass;
                    else ++*fail;
                    next = m.seed + 1;
                }
            }
        }
        close(fds[0]);
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        if (started || (next < stop && !killed)) {
            char why[256], how[128];
            uint64_t blamed = started ? current : next;
            if (killed)
                snprintf(why, sizeof(why), "hang: did not finish within %.0f s (watchdog killed it)", bound);
            else {
                describe_status(status, how, sizeof(how));
                snprintf(why, sizeof(why), "the child process died during this seed: %s", how);
            }
            print_failure(blamed, why);
            ++*fail;
            next = blamed + 1;
        }
        if (next - shown >= 100 || next >= end) {
            printf("soak: %llu/%llu seeds, %d failed, %.1f s\n", (unsigned long long)(next - first),
                   (unsigned long long)(end - first), *fail, dsgd_now() - t_start);
            fflush(stdout);
            shown = next;
        }
    }
}

/* ---------------------------------------------------------------- main */

static void alarm_fire(int sig) {
    static const char msg[] = "\nsoak: the seed hung (watchdog)\n0 passed, 1 failed\n";
    (void)sig;
    if (write(1, msg, sizeof(msg) - 1) < 0) _exit(1);
    _exit(1);
}

static void usage(void) {
    fprintf(stderr, "usage: soak [--seeds N] [--first K] [--bound S] [--batch B]\n"
                    "       soak --seed K   (one seed, in this process, verbosely)\n"
                    "  N defaults to 16, or to 50 with DSGD_TEST_FULL=1 in the environment\n");
    exit(2);
}

/* make test-full sets DSGD_TEST_FULL=1 (tests/harness.h's tu_full): its
   default run is 50 seeds, make test's 16. */
static int test_full(void) {
    const char *e = getenv("DSGD_TEST_FULL");
    return e && e[0] == '1' && e[1] == '\0';
}

static int parse_num(const char *s, double lo, double hi, double *out) {
    char *end;
    double v;
    if (!s) return 0;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) return 0;
    *out = v;
    return 1;
}

int main(int argc, char **argv) {
    double seeds = test_full() ? 50 : 16, first = 1, bound = 30, batch = 50, one = -1;
    int i, pass = 0, fail = 0;
    for (i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        double *dst = !strcmp(a, "--seeds") ? &seeds : !strcmp(a, "--first") ? &first
                    : !strcmp(a, "--bound") ? &bound : !strcmp(a, "--batch") ? &batch
                    : !strcmp(a, "--seed") ? &one : NULL;
        if (!dst || !parse_num(v, dst == &bound ? 1 : 0, 1e15, dst)) usage();
    }
    if (batch < 1) batch = 1;
    if (one >= 0) {
        char why[1024];
        struct sigaction sa;
        int bad;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = alarm_fire;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGALRM, &sa, NULL);
        alarm((unsigned)bound);
        bad = run_seed((uint64_t)one, 1, why, sizeof(why));
        alarm(0);
        if (bad) print_failure((uint64_t)one, why);
        else printf("seed %llu passed\n", (unsigned long long)one);
        printf("%d passed, %d failed\n", !bad, bad);
        return bad;
    }
    printf("soak: seeds %llu..%llu, %.0f s bound per seed\n", (unsigned long long)first,
           (unsigned long long)(first + seeds - 1), bound);
    run_seeds((uint64_t)first, (uint64_t)first + (uint64_t)seeds, (int)batch, bound, &pass, &fail);
    printf("%d passed, %d failed\n", pass, fail);
    return fail ? 1 : 0;
}
