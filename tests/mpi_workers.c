/* mpi_workers.c - DSGD_STRATEGY_MULTI_WORKER_MIRRORED across MPI processes
   (run by tests/mpi_collectives.sh under mpirun; --local K replicas per
   process, default 1).

   Every process builds the same data, then:
   - trains 8 steps of uneven global batches (SGD with momentum, ring
     all-reduce) as K replicas of a group of K x P over
     dsgd_mpi_transport_create_local, and checks every local replica's
     weights against a MIRRORED strategy of K x P replicas over an in-process
     loopback hub that it runs itself: the same bits are expected (the ring
     reduces in the same order over MPI as over the loopback);
   - the TRAIN metrics, taken collectively: the count exactly, the loss sum
     within 1e-6 relative of the reference's;
   - the same through dsgd_strategy_train_step_fn (each replica fetching its
     own shard): the same bits;
   - both again with the exchange beside backward (overlap) in 25-float
     buckets: the same bits;
   - uneven inputs: replica g has 5 + 3g samples, handed 4 at a time; the
     step with no sample anywhere returns info.count 0 on every process;
   - the synchronous contract across processes: K x P replicas x B equal
     ONE_DEVICE with K x P x B after 20 steps, within 1e-5 (SGD) and 1e-4
     (Adam) relative;
   - hierarchical over fake nodes (ranks_per_node 2, at W = 4): equal to the
     ring within 1e-5 relative, and the same bits run to run;
   - checkpoints: trained 4 steps, saved (the chief writes, every process
     calls), trained 4 more: the weights are still the reference's; a new
     multi-worker strategy restores the file on every process and trains
     the last 4 steps to the same bits and the same metrics (exactly), and
     so does a one-process MIRRORED strategy of K x P replicas restoring
     the same file (its metrics within 1e-6: it sums them in another
     order);
   - DSGD_STRATEGY_LOCAL (NESTEROV, warmup 1, period 3): every replica
     holds the bits of its global rank in a one-process LOCAL strategy of
     K x P replicas, also after a checkpoint saved mid-round at step 5 and
     restored by a new multi-worker strategy;
   - a process describing another optimizer (process 1's learning rate)
     makes creation fail on every process with DSGD_ERR_INVALID_ARGUMENT
     naming rank K, its first rank.
   Prints each failed check, then "N passed, N failed" (rank 0 sums every
   process's counts). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("mpi_workers: built without MPI (mpi.h not found); make test-mpi builds it with mpicc");
    return 0;
}
#else
#include "../distsgd_mpi.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { IN = 12, OUT = 4, STEPS = 8, MAXB = 16, MAXW = 16, NP = IN * 10 + 10 + 10 * OUT + OUT };

static const dsgd_layer_desc LAYERS[2] = {{10, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static float g_x[STEPS][MAXW * MAXB * IN], g_y[STEPS][MAXW * MAXB];
static int g_rank, g_pass, g_fail;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            ++g_pass;                                                           \
        } else {                                                                \
            ++g_fail;                                                           \
            fprintf(stderr, "mpi_workers: process %d: line %d: ", g_rank, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fputc('\n', stderr);                                                \
        }                                                                       \
    } while (0)

static int count_of(int step, int w) { return 3 * w + step + 1; }

static void make_data(void) {
    uint64_t st = 1234;
    int s, i;
    for (s = 0; s < STEPS; ++s) {
        for (i = 0; i < MAXW * MAXB * IN; ++i) g_x[s][i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
        for (i = 0; i < MAXW * MAXB; ++i) g_y[s][i] = (float)(dsgd_rng_next(&st) % OUT);
    }
}

/* desc's exchange beside backward and its buckets (for the multi-worker
   strategies; the reference keeps one bucket, after backward) */
static int g_overlap;
static size_t g_bucket_bytes;

static dsgd_strategy_desc desc(dsgd_strategy_kind kind, int n, const dsgd_transport_i *eps) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.num_replicas = n;
    d.endpoints = eps;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = MAXB;
    d.model.seed = 7;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.1f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 60.0;
    d.cpu_threads = 1;
    if (kind == DSGD_STRATEGY_MULTI_WORKER_MIRRORED) {
        d.overlap = g_overlap;
        d.bucket_bytes = g_bucket_bytes;
    }
    return d;
}

typedef struct fn_data {
    int step, w;
} fn_data;

static dsgd_result shard_fn(void *user, int replica, int n, dsgd_batch *out) {
    const fn_data *f = (const fn_data *)user;
    size_t off = 0, len = 0;
    dsgd_block_range((size_t)count_of(f->step, f->w), n, replica, &off, &len);
    out->x = g_x[f->step] + off * IN;
    out->y = g_y[f->step] + off;
    out->count = (int)len;
    return DSGD_OK;
}

/* Uneven: replica g has 5 + 3g samples of step 0's data, 4 per step. */
static dsgd_result join_fn(void *user, int replica, int n, dsgd_batch *out) {
    const fn_data *f = (const fn_data *)user;
    int left = 5 + 3 * replica - 4 * f->step;
    (void)n;
    out->count = left <= 0 ? 0 : left < 4 ? left : 4;
    out->x = g_x[0] + ((size_t)replica * 3 + (size_t)f->step * 4) * IN; /* overlapping: only data */
    out->y = g_y[0] + (size_t)replica * 3 + (size_t)f->step * 4;
    return DSGD_OK;
}

/* The reference: MIRRORED with w replicas over a loopback hub, ring. */
static void reference(dsgd_ctx *ctx, int w, float *params, dsgd_metrics *mt) {
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MIRRORED, w, NULL);
    dsgd_strategy *s = NULL;
    int step;
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        CHECK(0, "reference: %s", dsgd_ctx_last_error(ctx));
        return;
    }
    for (step = 0; step < STEPS; ++step)
        CHECK(dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(step, w), NULL) == DSGD_OK, "reference step %d: %s",
              step, dsgd_ctx_last_error(ctx));
    dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, mt);
    dsgd_model_get_params(dsgd_strategy_model(s, 0), params, NP);
    dsgd_strategy_destroy(s);
}

/* Trains the multi-worker strategy (sliced, or through shard_fn) and
   compares every local replica with ref. */
static void train_and_compare(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k, int w, const float *ref,
                              const dsgd_metrics *rmt, int use_fn) {
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, k, eps);
    dsgd_strategy *s = NULL;
    dsgd_metrics mt;
    float p[NP];
    int step, r;
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        CHECK(0, "create: %s", dsgd_ctx_last_error(ctx));
        return;
    }
    CHECK(dsgd_strategy_num_replicas_in_sync(s) == w, "in sync %d, want %d", dsgd_strategy_num_replicas_in_sync(s), w);
    for (step = 0; step < STEPS; ++step) {
        dsgd_result res;
        if (use_fn) {
            fn_data f;
            f.step = step;
            f.w = w;
            res = dsgd_strategy_train_step_fn(s, shard_fn, &f, NULL);
        } else {
            res = dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(step, w), NULL);
        }
        CHECK(res == DSGD_OK, "step %d: %s", step, dsgd_ctx_last_error(ctx));
    }
    CHECK(dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &mt) == DSGD_OK, "metrics: %s", dsgd_ctx_last_error(ctx));
    CHECK(mt.count == rmt->count, "metrics count %.0f, want %.0f", mt.count, rmt->count);
    CHECK(fabs(mt.loss_sum - rmt->loss_sum) <= 1e-6 * rmt->loss_sum, "loss sum %.9g, want %.9g", mt.loss_sum,
          rmt->loss_sum);
    for (r = 0; r < k; ++r) {
        dsgd_model_get_params(dsgd_strategy_model(s, r), p, NP);
        CHECK(!memcmp(p, ref, sizeof(p)), "%s: local replica %d's weights differ from the %d-replica loopback run",
              use_fn ? "batch fn" : "sliced", r, w);
    }
    dsgd_strategy_destroy(s);
}

static void join(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k, int w) {
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, k, eps);
    dsgd_strategy *s = NULL;
    dsgd_step_info info;
    fn_data f;
    int longest = 5 + 3 * (w - 1), steps = (longest + 3) / 4, total = 0, g;
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        CHECK(0, "join create: %s", dsgd_ctx_last_error(ctx));
        return;
    }
    for (f.step = 0, f.w = w;; ++f.step) {
        int want = 0;
        for (g = 0; g < w; ++g) {
            int left = 5 + 3 * g - 4 * f.step;
            want += left <= 0 ? 0 : left < 4 ? left : 4;
        }
        if (dsgd_strategy_train_step_fn(s, join_fn, &f, &info) != DSGD_OK) {
            CHECK(0, "join step %d: %s", f.step, dsgd_ctx_last_error(ctx));
            break;
        }
        CHECK(info.count == want, "join step %d: global count %d, want %d", f.step, info.count, want);
        total += info.count;
        if (info.count == 0 || f.step > steps) break;
    }
    CHECK(f.step == steps, "join: ended after %d steps, want %d", f.step, steps);
    CHECK(info.step == steps, "join: %lld optimizer steps, want %d", (long long)info.step, steps);
    for (g = 0; g < w; ++g) total -= 5 + 3 * g;
    CHECK(total == 0, "join: %d samples unaccounted for", total);
    dsgd_strategy_destroy(s);
}

/* Trains `steps` steps of the fixed batches (count_of) with strategy kind
   over eps (NULL: in-process ONE_DEVICE); params of replica 0 out. */
static int train_kind(dsgd_ctx *ctx, dsgd_strategy_kind kind, const dsgd_transport_i *eps, int k, int w,
                      dsgd_optimizer_kind opt, dsgd_allreduce_algo algo, int rpn, int steps, float *out) {
    dsgd_strategy_desc d = desc(kind, kind == DSGD_STRATEGY_ONE_DEVICE ? 1 : k, eps);
    dsgd_strategy *s = NULL;
    int step, ok = 1;
    d.optimizer.kind = opt;
    if (opt == DSGD_OPT_ADAM) d.optimizer.lr = 0.01f;
    d.algorithm = algo;
    d.ranks_per_node = rpn;
    if (kind == DSGD_STRATEGY_ONE_DEVICE) d.model.max_batch = MAXW * MAXB; /* the whole global batch */
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        CHECK(0, "train_kind create: %s", dsgd_ctx_last_error(ctx));
        return 0;
    }
    for (step = 0; step < steps && ok; ++step) {
        ok = dsgd_strategy_train_step(s, g_x[step % STEPS], g_y[step % STEPS], count_of(step % STEPS, w), NULL) ==
             DSGD_OK;
        CHECK(ok, "train_kind step %d: %s", step, dsgd_ctx_last_error(ctx));
    }
    dsgd_model_get_params(dsgd_strategy_model(s, 0), out, NP);
    dsgd_strategy_destroy(s);
    return ok;
}

static double rel_err(const float *a, const float *b) {
    double md = 0, mw = 0;
    int i;
    for (i = 0; i < NP; ++i) {
        double d = fabs((double)a[i] - b[i]);
        if (d != d) return INFINITY;
        if (d > md) md = d;
        if (fabs((double)b[i]) > mw) mw = fabs((double)b[i]);
    }
    return mw > 0 ? md / mw : md;
}

/* K x P replicas x B against ONE_DEVICE x (K P B), 20 steps. */
static void contract(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k, int w) {
    static const dsgd_optimizer_kind opts[2] = {DSGD_OPT_SGD, DSGD_OPT_ADAM};
    float a[NP], b[NP];
    int i;
    for (i = 0; i < 2; ++i) {
        double e, tol = opts[i] == DSGD_OPT_ADAM ? 1e-4 : 1e-5;
        if (!train_kind(ctx, DSGD_STRATEGY_MULTI_WORKER_MIRRORED, eps, k, w, opts[i], DSGD_ALLREDUCE_AUTO, 0, 20, a))
            continue;
        if (!train_kind(ctx, DSGD_STRATEGY_ONE_DEVICE, NULL, 1, w, opts[i], DSGD_ALLREDUCE_AUTO, 0, 20, b)) continue;
        e = rel_err(a, b);
        CHECK(e <= tol, "contract %s: %d replicas vs one_device: rel err %.3g > %.0e",
              opts[i] == DSGD_OPT_ADAM ? "adam" : "sgd", w, e, tol);
        if (g_rank == 0) printf("mpi_workers: contract %s, %d replicas across processes vs one_device: rel err %.3g\n",
                                opts[i] == DSGD_OPT_ADAM ? "adam" : "sgd", w, e);
    }
}

/* Two fake nodes of two (W = 4): hierarchical within 1e-5 of the ring, and
   the same bits twice. */
static void hierarchical(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k, int w) {
    float h1[NP], h2[NP], r[NP];
    double e;
    if (w != 4) return;
    if (!train_kind(ctx, DSGD_STRATEGY_MULTI_WORKER_MIRRORED, eps, k, w, DSGD_OPT_MOMENTUM,
                    DSGD_ALLREDUCE_HIERARCHICAL, 2, STEPS, h1) ||
        !train_kind(ctx, DSGD_STRATEGY_MULTI_WORKER_MIRRORED, eps, k, w, DSGD_OPT_MOMENTUM,
                    DSGD_ALLREDUCE_HIERARCHICAL, 2, STEPS, h2) ||
        !train_kind(ctx, DSGD_STRATEGY_MULTI_WORKER_MIRRORED, eps, k, w, DSGD_OPT_MOMENTUM, DSGD_ALLREDUCE_RING, 0,
                    STEPS, r))
        return;
    CHECK(!memcmp(h1, h2, sizeof(h1)), "hierarchical: two runs differ");
    e = rel_err(h1, r);
    CHECK(e <= 1e-5, "hierarchical vs ring: rel err %.3g", e);
    if (g_rank == 0) printf("mpi_workers: hierarchical (2 nodes of 2) vs ring: rel err %.3g, run to run identical\n", e);
}

/* Steps [from, to) of the sliced training. */
static void train_steps(dsgd_ctx *ctx, dsgd_strategy *s, int from, int to, int w, const char *what) {
    int step;
    for (step = from; step < to; ++step)
        CHECK(dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(step, w), NULL) == DSGD_OK, "%s step %d: %s",
              what, step, dsgd_ctx_last_error(ctx));
}

/* Every local replica of s holds ref, bit for bit, and its metrics are mt
   (NULL: not checked) within tol relative (0: bit for bit). */
static void expect_bits(dsgd_ctx *ctx, dsgd_strategy *s, const float *ref, const dsgd_metrics *mt, double tol,
                        const char *what, dsgd_metrics *out) {
    dsgd_metrics m;
    float p[NP];
    int r;
    CHECK(dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &m) == DSGD_OK, "%s metrics: %s", what,
          dsgd_ctx_last_error(ctx));
    if (mt)
        CHECK(tol > 0 ? m.count == mt->count && fabs(m.loss_sum - mt->loss_sum) <= tol * mt->loss_sum &&
                            fabs(m.correct - mt->correct) <= tol * mt->correct
                      : !memcmp(&m, mt, sizeof(m)),
              "%s: metrics %.9g %.9g %.0f, want %.9g %.9g %.0f", what, m.loss_sum,
              m.correct, m.count, mt->loss_sum, mt->correct, mt->count);
    if (out) *out = m;
    for (r = 0; r < dsgd_strategy_num_replicas(s); ++r) {
        dsgd_model_get_params(dsgd_strategy_model(s, r), p, NP);
        CHECK(!memcmp(p, ref, sizeof(p)), "%s: local replica %d's weights differ from the reference", what, r);
    }
}

/* Saved at step 4 by every process (the chief writes), restored by a new
   multi-worker strategy on every process and by a one-process MIRRORED one. */
static void checkpoint(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k, int w, const float *ref) {
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, k, eps);
    dsgd_strategy *s = NULL;
    dsgd_metrics mt;
    char dir[64] = "/tmp/dsgd_mpi_workers_XXXXXX", path[96];
    if (g_rank == 0 && !mkdtemp(dir)) dir[0] = '\0';
    MPI_Bcast(dir, (int)sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!dir[0]) {
        CHECK(0, "checkpoint: mkdtemp failed");
        return;
    }
    snprintf(path, sizeof(path), "%s/mw.ckpt", dir);
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        CHECK(0, "checkpoint create: %s", dsgd_ctx_last_error(ctx));
        return;
    }
    train_steps(ctx, s, 0, 4, w, "saving run");
    CHECK(dsgd_strategy_save(s, path, NULL) == DSGD_OK, "save: %s", dsgd_ctx_last_error(ctx));
    train_steps(ctx, s, 4, STEPS, w, "saving run");
    expect_bits(ctx, s, ref, NULL, 0.0, "the saving run", &mt);
    dsgd_strategy_destroy(s);
    if (dsgd_strategy_create(ctx, &d, &s) == DSGD_OK) {
        CHECK(dsgd_strategy_restore(s, path, NULL) == DSGD_OK, "restore: %s", dsgd_ctx_last_error(ctx));
        train_steps(ctx, s, 4, STEPS, w, "restored run");
        expect_bits(ctx, s, ref, &mt, 0.0, "multi-worker restored", NULL);
        dsgd_strategy_destroy(s);
    } else {
        CHECK(0, "checkpoint create: %s", dsgd_ctx_last_error(ctx));
    }
    d = desc(DSGD_STRATEGY_MIRRORED, w, NULL);
    if (dsgd_strategy_create(ctx, &d, &s) == DSGD_OK) {
        CHECK(dsgd_strategy_restore(s, path, NULL) == DSGD_OK, "one-process restore: %s", dsgd_ctx_last_error(ctx));
        train_steps(ctx, s, 4, STEPS, w, "one-process restored run");
        expect_bits(ctx, s, ref, &mt, 1e-6, "one process restored", NULL);
        dsgd_strategy_destroy(s);
    } else {
        CHECK(0, "mirrored create: %s", dsgd_ctx_last_error(ctx));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        remove(path);
        rmdir(dir);
    }
}

/* DSGD_STRATEGY_LOCAL across processes (NESTEROV outside, momentum
   inside, warmup 1, period 3): every local replica g holds the weights of
   replica g of a one-process LOCAL strategy of w replicas over a loopback
   hub, bit for bit; and through a checkpoint saved mid-round at step 5
   (every process calls, the chief writes) and restored by a new
   multi-worker strategy, the same bits at step 8. */
static void local_sgd(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k, int w) {
    static float refs[MAXW][NP];
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_LOCAL, w, NULL);
    dsgd_strategy *s = NULL;
    char dir[64] = "/tmp/dsgd_mpi_local_XXXXXX", path[96];
    float p[NP];
    int r, pass;
    d.local.period = 3;
    d.local.warmup_steps = 1;
    d.local.outer = DSGD_OUTER_NESTEROV;
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        CHECK(0, "local reference: %s", dsgd_ctx_last_error(ctx));
        return;
    }
    train_steps(ctx, s, 0, STEPS, w, "local reference");
    for (r = 0; r < w; ++r) dsgd_model_get_params(dsgd_strategy_model(s, r), refs[r], NP);
    dsgd_strategy_destroy(s);
    if (g_rank == 0 && !mkdtemp(dir)) dir[0] = '\0';
    MPI_Bcast(dir, (int)sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof(path), "%s/local.ckpt", dir);
    d.num_replicas = k;
    d.endpoints = eps;
    for (pass = 0; pass < 2 && dir[0]; ++pass) {
        if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
            CHECK(0, "local create: %s", dsgd_ctx_last_error(ctx));
            return;
        }
        if (pass == 0) {
            train_steps(ctx, s, 0, 5, w, "local");
            CHECK(dsgd_strategy_save(s, path, NULL) == DSGD_OK, "local save: %s", dsgd_ctx_last_error(ctx));
        } else {
            CHECK(dsgd_strategy_restore(s, path, NULL) == DSGD_OK, "local restore: %s", dsgd_ctx_last_error(ctx));
        }
        train_steps(ctx, s, 5, STEPS, w, pass ? "local restored" : "local");
        for (r = 0; r < k; ++r) {
            dsgd_model_get_params(dsgd_strategy_model(s, r), p, NP);
            CHECK(!memcmp(p, refs[g_rank * k + r], sizeof(p)), "local%s: replica %d (global %d) differs from the "
                  "one-process run", pass ? " restored" : "", r, g_rank * k + r);
        }
        dsgd_strategy_destroy(s);
    }
    CHECK(dir[0] != '\0', "local: mkdtemp failed");
    if (g_rank == 0) printf("mpi_workers: local (NESTEROV, period 3) across processes: checked against the one-process run\n");
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0 && dir[0]) {
        remove(path);
        rmdir(dir);
    }
}

static void mismatch(dsgd_ctx *ctx, const dsgd_transport_i *eps, int k) {
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, k, eps);
    dsgd_strategy *s = NULL;
    char want[64];
    dsgd_result res;
    if (g_rank == 1) d.optimizer.lr = 0.2f;
    res = dsgd_strategy_create(ctx, &d, &s);
    snprintf(want, sizeof(want), "rank %d describes another", k);
    CHECK(res == DSGD_ERR_INVALID_ARGUMENT, "mismatch: created with %s", dsgd_result_string(res));
    CHECK(strstr(dsgd_ctx_last_error(ctx), want) != NULL, "mismatch: message \"%s\" lacks \"%s\"",
          dsgd_ctx_last_error(ctx), want);
    if (res == DSGD_OK) dsgd_strategy_destroy(s);
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx = NULL;
    dsgd_transport_i eps[MAXW];
    dsgd_metrics rmt;
    float ref[NP];
    int k = 1, procs = 1, w, i, sums[2], all[2];
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK || dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &procs);
    for (i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "--local") && i + 1 < argc) k = atoi(argv[++i]);
    w = k * procs;
    if (k < 1 || w > MAXW) {
        if (g_rank == 0) fprintf(stderr, "mpi_workers: --local K with 1 <= K x np <= %d\n", MAXW);
        MPI_Finalize();
        return 2;
    }
    make_data();
    if (dsgd_mpi_transport_create_local(ctx, NULL, k, eps) != DSGD_OK) {
        fprintf(stderr, "mpi_workers: process %d: %s\n", g_rank, dsgd_ctx_last_error(ctx));
        dsgd_mpi_abort(1);
    }
    reference(ctx, w, ref, &rmt);
    train_and_compare(ctx, eps, k, w, ref, &rmt, 0);
    train_and_compare(ctx, eps, k, w, ref, &rmt, 1);
    g_overlap = 1; /* the exchange beside backward, in 25-float buckets: the same bits */
    g_bucket_bytes = 100;
    train_and_compare(ctx, eps, k, w, ref, &rmt, 0);
    train_and_compare(ctx, eps, k, w, ref, &rmt, 1);
    g_overlap = 0;
    g_bucket_bytes = 0;
    join(ctx, eps, k, w);
    contract(ctx, eps, k, w);
    hierarchical(ctx, eps, k, w);
    checkpoint(ctx, eps, k, w, ref);
    local_sgd(ctx, eps, k, w);
    if (procs > 1) mismatch(ctx, eps, k);
    for (i = 0; i < k; ++i) eps[i].destroy(eps[i].impl);
    sums[0] = g_pass;
    sums[1] = g_fail;
    MPI_Reduce(sums, all, 2, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
    if (g_rank == 0) printf("mpi_workers: np %d x %d local: %d checks\n%d passed, %d failed\n", procs, k, all[0] + all[1],
                            all[0], all[1]);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return g_fail ? 1 : 0;
}
#endif
