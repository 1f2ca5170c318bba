/* mpi_elastic.c - elastic multi-worker training over MPI (distsgd/mpi/elastic.h),
   run by tests/mpi_collectives.sh under mpirun and a watchdog. One replica
   per process, Adam (two slots and a step count that the bias correction
   reads), the ring, a global batch of 20 + step samples sliced over the
   group, 8 steps. Each mode checks the final weights bit for bit against a
   reference it computes itself in one process: a MIRRORED strategy of W
   replicas over its own loopback to step k, saved, restored into W'
   replicas, trained on.

     --leave   (np 3) the last process raises SIGTERM before step 3; its
               handler sets a flag that it passes to dsgd_mpi_elastic_step;
               it leaves (left = 1 at step 3), the others go on as 2;
               on_resize is called once, (3, 2, {0, 1}); reference 3 -> 2
               (before it, bad calls of dsgd_strategy_regroup and the
               dsgd_mpi_elastic_* functions fail with the right code and
               change nothing; recover is DSGD_ERR_UNSUPPORTED without ULFM)
     --grow    (np 2) before step 3 the group spawns one more process of
               this program (dsgd_mpi_elastic_spawn), which joins
               (dsgd_mpi_elastic_join) and receives the step to start at as
               the state; on_resize (2, 3, {0, 1, -1}) on each, the joiner's
               (1, 3, ...); reference 2 -> 3
     --launch PATH  (under tools/elastic_launch.sh, np 3) saves a
               checkpoint to PATH after every step, with the step and the
               group's size as user bytes; on the first launch
               (DSGD_ELASTIC_RESTART 0) the last process kills itself
               (SIGKILL) before step 5, which ends the job; the launcher
               relaunches at np 2, which restores PATH and trains to the
               end; the run that finishes must be a relaunch; reference
               3 -> 2 at the checkpoint's step
   Rank 0 of the final group prints "N passed, N failed" for it; a leaver
   prints its failed checks and exits 1 when one failed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("mpi_elastic: built without MPI (mpi.h not found); make test-mpi builds it with mpicc");
    return 0;
}
#else
#include "../distsgd_mpi.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { IN = 12, OUT = 4, STEPS = 8, AT = 3, CRASH = 5, MAXB = 16, MAXW = 4, NP = IN * 10 + 10 + 10 * OUT + OUT };

static const dsgd_layer_desc LAYERS[2] = {{10, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static float g_x[STEPS][MAXW * MAXB * IN], g_y[STEPS][MAXW * MAXB];
static int g_rank, g_pass, g_fail;
static volatile sig_atomic_t g_leave;

#define CHECK(cond, ...)                                                          \
    do {                                                                          \
        if (cond) {                                                               \
            ++g_pass;                                                             \
        } else {                                                                  \
            ++g_fail;                                                             \
            fprintf(stderr, "mpi_elastic: process %d: line %d: ", g_rank, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

static int count_of(int step) { return 20 + step; }

static void make_data(void) {
    uint64_t st = 4321;
    int s, i;
    for (s = 0; s < STEPS; ++s) {
        for (i = 0; i < MAXW * MAXB * IN; ++i) g_x[s][i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
        for (i = 0; i < MAXW * MAXB; ++i) g_y[s][i] = (float)(dsgd_rng_next(&st) % OUT);
    }
}

/* on_resize's calls: how many, the last sizes and survivors. */
typedef struct resize_log {
    int calls, old_world, new_world, survivors[MAXW];
} resize_log;

static void on_resize(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s) {
    resize_log *r = (resize_log *)user;
    int i;
    (void)s;
    r->calls++;
    r->old_world = old_world;
    r->new_world = new_world;
    for (i = 0; i < new_world && i < MAXW; ++i) r->survivors[i] = survivors[i];
}

static dsgd_strategy_desc desc(dsgd_strategy_kind kind, int n, const dsgd_transport_i *eps, resize_log *log) {
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
    d.model.seed = 11;
    d.optimizer.kind = DSGD_OPT_ADAM;
    d.optimizer.lr = 0.01f;
    d.timeout_s = 30.0;
    d.cpu_threads = 1;
    d.elastic.on_resize = log ? on_resize : NULL;
    d.elastic.user = log;
    return d;
}

static void train(dsgd_ctx *ctx, dsgd_strategy *s, int step, const char *what) {
    CHECK(dsgd_strategy_train_step(s, g_x[step], g_y[step], count_of(step), NULL) == DSGD_OK, "%s step %d: %s", what,
          step, dsgd_ctx_last_error(ctx));
}

/* The reference, in this process: MIRRORED w0 replicas to step k, saved,
   restored into w1 replicas, trained to STEPS; replica 0's weights out. */
static int reference(dsgd_ctx *ctx, int w0, int k, int w1, float *out) {
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MIRRORED, w0, NULL, NULL);
    dsgd_strategy *s = NULL;
    char dir[64] = "/tmp/dsgd_mpi_elastic_XXXXXX", path[96];
    int step, ok = 0;
    if (!mkdtemp(dir)) {
        CHECK(0, "reference: mkdtemp failed");
        return 0;
    }
    snprintf(path, sizeof(path), "%s/ref.ckpt", dir);
    if (dsgd_strategy_create(ctx, &d, &s) == DSGD_OK) {
        for (step = 0; step < k; ++step) train(ctx, s, step, "reference");
        CHECK(dsgd_strategy_save(s, path, NULL) == DSGD_OK, "reference save: %s", dsgd_ctx_last_error(ctx));
        dsgd_strategy_destroy(s);
        d.num_replicas = w1;
        if (dsgd_strategy_create(ctx, &d, &s) == DSGD_OK) {
            ok = dsgd_strategy_restore(s, path, NULL) == DSGD_OK;
            CHECK(ok, "reference restore: %s", dsgd_ctx_last_error(ctx));
            for (step = k; step < STEPS && ok; ++step) train(ctx, s, step, "reference");
            dsgd_model_get_params(dsgd_strategy_model(s, 0), out, NP);
            dsgd_strategy_destroy(s);
        }
    }
    if (!s) CHECK(0, "reference create: %s", dsgd_ctx_last_error(ctx));
    remove(path);
    rmdir(dir);
    return ok;
}

static void compare(dsgd_ctx *ctx, dsgd_strategy *s, int w0, int k, int w1, const char *what) {
    float p[NP], ref[NP];
    CHECK(dsgd_strategy_num_replicas_in_sync(s) == w1, "%s: %d replicas in sync, want %d", what,
          dsgd_strategy_num_replicas_in_sync(s), w1);
    if (!reference(ctx, w0, k, w1, ref)) return;
    dsgd_model_get_params(dsgd_strategy_model(s, 0), p, NP);
    CHECK(!memcmp(p, ref, sizeof(p)), "%s: the weights differ from %d replicas to step %d, saved, restored into %d",
          what, w0, k, w1);
}

/* Rank 0 of comm prints the sum of comm's counts. */
static void summary(MPI_Comm comm, const char *what) {
    int sums[2], all[2], r = 0;
    sums[0] = g_pass;
    sums[1] = g_fail;
    MPI_Comm_rank(comm, &r);
    MPI_Reduce(sums, all, 2, MPI_INT, MPI_SUM, 0, comm);
    if (r == 0) printf("mpi_elastic: %s: %d checks\n%d passed, %d failed\n", what, all[0] + all[1], all[0], all[1]);
}

/* Bad calls change nothing (the training after them is checked bit for
   bit): every error here is found before the group is touched. */
static void misuse(dsgd_ctx *ctx, dsgd_mpi_elastic *el, dsgd_strategy *s) {
    const dsgd_transport_i *ep = dsgd_mpi_elastic_endpoint(el);
    dsgd_strategy_desc d = desc(DSGD_STRATEGY_MIRRORED, 2, NULL, NULL);
    dsgd_strategy *m = NULL, *none = NULL;
    dsgd_mpi_elastic *none_el = NULL;
    int ranks[MAXW] = {0, 1, 2, 3}, left = 0;
    dsgd_result res;
    CHECK(dsgd_strategy_regroup(NULL, ep, ranks) == DSGD_ERR_INVALID_ARGUMENT, "regroup(NULL)");
    CHECK(dsgd_strategy_regroup(s, NULL, ranks) == DSGD_ERR_INVALID_ARGUMENT, "regroup without endpoints");
    ranks[0] = -1;
    res = dsgd_strategy_regroup(s, ep, ranks);
    CHECK(res == DSGD_ERR_INVALID_ARGUMENT && strstr(dsgd_ctx_last_error(ctx), "old_ranks[0] is -1"),
          "regroup with a joiner at rank 0: %s (%s)", dsgd_result_string(res), dsgd_ctx_last_error(ctx));
    ranks[0] = 0;
    ranks[1] = 0;
    CHECK(dsgd_strategy_regroup(s, ep, ranks) == DSGD_ERR_INVALID_ARGUMENT, "regroup with a rank twice");
    ranks[1] = 1;
    if (g_rank > 0) {
        ranks[g_rank] = g_rank - 1; /* its own old rank given wrong */
        res = dsgd_strategy_regroup(s, ep, ranks);
        CHECK(res == DSGD_ERR_INVALID_ARGUMENT && strstr(dsgd_ctx_last_error(ctx), "was rank"),
              "regroup with a wrong old rank: %s (%s)", dsgd_result_string(res), dsgd_ctx_last_error(ctx));
        ranks[g_rank] = g_rank;
    }
    if (dsgd_strategy_create(ctx, &d, &m) == DSGD_OK) {
        CHECK(dsgd_strategy_regroup(m, ep, ranks) == DSGD_ERR_INVALID_ARGUMENT, "regroup of a mirrored strategy");
        dsgd_strategy_destroy(m);
    }
    CHECK(dsgd_mpi_elastic_step(el, NULL, 0, &left) == DSGD_ERR_INVALID_ARGUMENT, "step without a strategy");
    CHECK(dsgd_mpi_elastic_spawn(el, s, "x", NULL, 0, NULL, 0) == DSGD_ERR_INVALID_ARGUMENT, "spawn of 0");
    d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 1, NULL, NULL);
    res = dsgd_mpi_elastic_join(ctx, NULL, &d, NULL, 0, &none_el, &none);
    CHECK(res == DSGD_ERR_STATE && !none_el && !none, "join in a process nobody spawned: %s",
          dsgd_result_string(res));
#if defined(MPIX_ERR_PROC_FAILED)
    (void)ep;
#else
    CHECK(dsgd_mpi_elastic_recover(el, NULL) == DSGD_ERR_UNSUPPORTED, "recover without ULFM: %s",
          dsgd_ctx_last_error(ctx));
#endif
}

static void on_term(int sig) {
    (void)sig;
    g_leave = 1;
}

static int leave_mode(dsgd_ctx *ctx, int procs) {
    struct sigaction sa;
    dsgd_mpi_elastic *el = NULL;
    dsgd_strategy *s = NULL;
    dsgd_strategy_desc d;
    resize_log log;
    int step, left = 0, leaver = g_rank == procs - 1;
    memset(&log, 0, sizeof(log));
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_term;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    if (dsgd_mpi_elastic_create(ctx, NULL, 30.0, &el) != DSGD_OK) {
        fprintf(stderr, "mpi_elastic: %s\n", dsgd_ctx_last_error(ctx));
        dsgd_mpi_abort(1);
    }
    d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 1, dsgd_mpi_elastic_endpoint(el), &log);
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        fprintf(stderr, "mpi_elastic: %s\n", dsgd_ctx_last_error(ctx));
        dsgd_mpi_abort(1);
    }
    misuse(ctx, el, s);
    for (step = 0; step < STEPS; ++step) {
        if (leaver && step == AT) raise(SIGTERM); /* the preemption notice */
        if (dsgd_mpi_elastic_step(el, s, g_leave, &left) != DSGD_OK) {
            fprintf(stderr, "mpi_elastic: process %d: %s\n", g_rank, dsgd_ctx_last_error(ctx));
            dsgd_mpi_abort(1);
        }
        if (left) break;
        train(ctx, s, step, "leave");
    }
    CHECK(left == leaver, "left %d at step %d, want %d", left, step, leaver);
    if (left) {
        CHECK(step == AT, "left at step %d, want %d", step, AT);
        CHECK(log.calls == 0, "the leaver's on_resize was called %d times", log.calls);
        dsgd_strategy_destroy(s);
        dsgd_mpi_elastic_destroy(el);
        printf("mpi_elastic: process %d left at step %d (%d checks failed)\n", g_rank, step, g_fail);
        return g_fail ? 1 : 0;
    }
    CHECK(log.calls == 1 && log.old_world == procs && log.new_world == procs - 1 && log.survivors[0] == 0 &&
              log.survivors[procs - 2] == procs - 2,
          "on_resize: %d calls, last %d -> %d", log.calls, log.old_world, log.new_world);
    compare(ctx, s, procs, AT, procs - 1, "leave");
    dsgd_strategy_destroy(s);
    summary(dsgd_mpi_elastic_comm(el), "leave");
    dsgd_mpi_elastic_destroy(el);
    return g_fail ? 1 : 0;
}

static int grow_mode(dsgd_ctx *ctx, const char *self, int procs) {
    dsgd_mpi_elastic *el = NULL;
    dsgd_strategy *s = NULL;
    dsgd_strategy_desc d;
    MPI_Comm parent = MPI_COMM_NULL;
    resize_log log;
    char *args[] = {(char *)"--grow", NULL};
    int step = 0, w = procs, joiner, i;
    memset(&log, 0, sizeof(log));
    MPI_Comm_get_parent(&parent);
    joiner = parent != MPI_COMM_NULL;
    d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 1, NULL, &log);
    if (joiner) {
        if (dsgd_mpi_elastic_join(ctx, NULL, &d, &step, sizeof(step), &el, &s) != DSGD_OK) {
            fprintf(stderr, "mpi_elastic: joiner: %s\n", dsgd_ctx_last_error(ctx));
            dsgd_mpi_abort(1);
        }
        MPI_Comm_rank(dsgd_mpi_elastic_comm(el), &g_rank);
        MPI_Comm_size(dsgd_mpi_elastic_comm(el), &w);
        CHECK(step == AT, "the joiner starts at step %d, want %d", step, AT);
        CHECK(log.calls == 1 && log.old_world == 1 && log.new_world == w && log.survivors[w - 1] == -1,
              "the joiner's on_resize: %d calls, last %d -> %d", log.calls, log.old_world, log.new_world);
        w -= 1; /* the group it joined */
    } else {
        if (dsgd_mpi_elastic_create(ctx, NULL, 30.0, &el) != DSGD_OK) {
            fprintf(stderr, "mpi_elastic: %s\n", dsgd_ctx_last_error(ctx));
            dsgd_mpi_abort(1);
        }
        d.endpoints = dsgd_mpi_elastic_endpoint(el);
        if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
            fprintf(stderr, "mpi_elastic: %s\n", dsgd_ctx_last_error(ctx));
            dsgd_mpi_abort(1);
        }
    }
    for (; step < STEPS; ++step) {
        if (!joiner && step == AT) {
            int at = step;
            if (dsgd_mpi_elastic_spawn(el, s, self, args, 1, &at, sizeof(at)) != DSGD_OK) {
                fprintf(stderr, "mpi_elastic: process %d: %s\n", g_rank, dsgd_ctx_last_error(ctx));
                dsgd_mpi_abort(1);
            }
            CHECK(log.calls == 1 && log.old_world == w && log.new_world == w + 1 && log.survivors[w] == -1,
                  "on_resize: %d calls, last %d -> %d", log.calls, log.old_world, log.new_world);
            for (i = 0; i < w; ++i) CHECK(log.survivors[i] == i, "on_resize: survivors[%d] = %d", i, log.survivors[i]);
        }
        train(ctx, s, step, joiner ? "joiner" : "grow");
    }
    compare(ctx, s, w, AT, w + 1, joiner ? "grow (the joiner)" : "grow");
    dsgd_strategy_destroy(s);
    summary(dsgd_mpi_elastic_comm(el), "grow");
    dsgd_mpi_elastic_destroy(el);
    return g_fail ? 1 : 0;
}

/* What the checkpoint carries beside the strategy. */
typedef struct launch_meta {
    int step, world;
} launch_meta;

static int launch_mode(dsgd_ctx *ctx, const char *path, int procs) {
    dsgd_transport_i ep;
    dsgd_strategy *s = NULL;
    dsgd_strategy_desc d;
    dsgd_checkpoint_extra extra;
    launch_meta meta;
    const char *env = getenv("DSGD_ELASTIC_RESTART");
    int restart = env ? atoi(env) : 0, step = 0, resumed = access(path, R_OK) == 0, ok;
    memset(&extra, 0, sizeof(extra));
    extra.user = &meta;
    extra.user_bytes = sizeof(meta);
    meta.step = 0;
    meta.world = procs;
    if (dsgd_mpi_transport_create(ctx, NULL, &ep) != DSGD_OK) {
        fprintf(stderr, "mpi_elastic: %s\n", dsgd_ctx_last_error(ctx));
        dsgd_mpi_abort(1);
    }
    d = desc(DSGD_STRATEGY_MULTI_WORKER_MIRRORED, 1, &ep, NULL);
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) {
        fprintf(stderr, "mpi_elastic: %s\n", dsgd_ctx_last_error(ctx));
        dsgd_mpi_abort(1);
    }
    CHECK(resumed == (restart > 0), "launch %d: the checkpoint %s", restart, resumed ? "exists" : "is missing");
    if (resumed) {
        ok = dsgd_strategy_restore(s, path, &extra) == DSGD_OK;
        CHECK(ok, "restore: %s", dsgd_ctx_last_error(ctx));
        step = ok ? meta.step : STEPS;
        if (g_rank == 0) printf("mpi_elastic: launch %d at np %d: resumed from step %d of np %d\n", restart, procs,
                                meta.step, meta.world);
    }
    for (; step < STEPS; ++step) {
        launch_meta now;
        if (restart == 0 && step == CRASH && g_rank == procs - 1) {
            printf("mpi_elastic: process %d crashes before step %d\n", g_rank, step);
            fflush(stdout);
            raise(SIGKILL);
        }
        train(ctx, s, step, "launch");
        now.step = step + 1;
        now.world = procs;
        extra.user = &now;
        CHECK(dsgd_strategy_save(s, path, &extra) == DSGD_OK, "save: %s", dsgd_ctx_last_error(ctx));
        extra.user = &meta;
    }
    CHECK(resumed, "the run that finished was not a relaunch from the checkpoint");
    if (resumed) compare(ctx, s, meta.world, meta.step, procs, "launch");
    dsgd_strategy_destroy(s);
    ep.destroy(ep.impl);
    summary(MPI_COMM_WORLD, "launch");
    return g_fail ? 1 : 0;
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx = NULL;
    int procs = 1, rc = 2;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK || dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &procs);
    make_data();
    if (argc >= 2 && !strcmp(argv[1], "--leave") && procs >= 2 && procs <= MAXW) rc = leave_mode(ctx, procs);
    else if (argc >= 2 && !strcmp(argv[1], "--grow") && procs < MAXW) rc = grow_mode(ctx, argv[0], procs);
    else if (argc >= 3 && !strcmp(argv[1], "--launch") && procs <= MAXW) rc = launch_mode(ctx, argv[2], procs);
    else if (g_rank == 0)
        fprintf(stderr, "usage: mpirun -np 2..%d mpi_elastic --leave | --grow | --launch PATH\n", MAXW);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return rc;
}
#endif
