/* sync_vs_async.c - synchronous against asynchronous training on Fashion-MNIST,
   one table: mirrored all-reduce, parameter servers with ASYNC, SSP (s = 2),
   SYNC and SYNC with backup workers (N + b), 4 workers each.

   Every row trains the same MLP (784-256-128-10, SGD with momentum) from the
   same initial weights on the same number of samples: E epochs, drawn in
   batches of B per worker. Worker w takes batches w, w + 4, w + 8, ... of
   each epoch's shuffled order (its own shard). Who applies the update:
     mirrored  every replica, the same averaged gradient (all-reduce)
     PS rows   the 2 parameter servers, each for its shards; the workers
               only pull, compute and push (distsgd/ps.h)
   The learning rate follows the linear scaling rule for the batch each
   update averages, with a warmup of half an epoch of updates and a cosine
   decay (Goyal et al. 2017): 4B for mirrored, SYNC and SSP, (4 - b)B for
   backups, B for ASYNC, whose updates are single gradients computed on
   weights that may be some updates old (the staleness columns). SSP's rate
   is also divided by s + 1, the staleness-aware rule of Zhang et al. 2016:
   at the synchronous rate (0.1 with momentum 0.9 here) gradients up to 2
   clocks old make training diverge, as stale gradients add an implicit
   momentum (Mitliagkas et al. 2016).

   --straggler F makes worker 0 F times slower: it sleeps (F - 1) times its
   compute time between computing a gradient and pushing it (for mirrored,
   each step waits (F - 1) times its own duration, as for a replica that
   slow). That shows what each policy does with a slow machine: SYNC waits
   for it, ASYNC takes its stale gradients, backups drop them.

   Columns: wall time, test accuracy, the servers' mean and max staleness,
   and the gradients dropped as stale (BACKUP; counted on server 0).

   Run:  make sync-vs-async               (ARGS="--straggler 4" for a slow worker)
   or:   ./build/examples/sync_vs_async [--data DIR] [--epochs E] [--batch B]
           [--straggler F] [--backups b] [--seed S] [--rows LIST]
   --rows picks rows (default mirrored,async,ssp,sync,backup). DIR holds the uncompressed Fashion-MNIST IDX files (make demo and make
   sync-vs-async prepare build/data/fashion-mnist). Exits non-zero when
   asynchronous training ends below 85% test accuracy. Mirrored and PS sync
   give the same bits run after run; the other rows depend on the order in
   which the threads' pushes arrive. */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WORKERS 4
#define SERVERS 2

static const dsgd_layer_desc LAYERS[3] = {{.units = 256, .activation = DSGD_ACT_RELU},
                                          {.units = 128, .activation = DSGD_ACT_RELU},
                                          {.units = 10}};

typedef struct run_cfg {
    const dsgd_dataset *train, *test;
    int epochs, batch, backups;
    double straggler;
    uint64_t seed;
    float base_lr; /* at batch 128 */
} run_cfg;

typedef struct row {
    const char *name;
    double seconds, accuracy, staleness_mean;
    long long staleness_max, dropped;
} row;

static void sleep_s(double s) {
    struct timespec ts;
    if (s <= 0) return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL);
}

/* The MLP, 784-256-128-10, from the run's seed. */
static dsgd_model_desc model_desc(const run_cfg *cfg, int max_batch) {
    dsgd_model_desc md = {.input_dim = cfg->train->dim, .layers = LAYERS, .num_layers = 3, .max_batch = max_batch,
                          .seed = cfg->seed};
    return md;
}

/* SGD with momentum at the linearly scaled rate for the batch one update
   averages, reached by a linear warmup over the first half epoch of
   updates (Goyal et al. 2017), then a cosine decay to 0 over the run. */
static dsgd_optimizer_desc opt_desc(const run_cfg *cfg, int update_batch) {
    int64_t updates_per_epoch = (int64_t)(cfg->train->n / (size_t)update_batch);
    dsgd_optimizer_desc od = {.kind = DSGD_OPT_MOMENTUM, .momentum = 0.9f,
                              .lr = dsgd_linear_scaled_lr(cfg->base_lr, update_batch, 128),
                              .schedule = {.kind = DSGD_SCHEDULE_COSINE,
                                           .warmup_steps = (int64_t)(cfg->train->n / (size_t)update_batch / 2),
                                           .total_steps = updates_per_epoch * cfg->epochs}};
    return od;
}

/* Test accuracy of the flat weights p, on a model of the coordinator's. */
static int evaluate(dsgd_ctx *ctx, const run_cfg *cfg, const float *p, double *acc) {
    dsgd_model_desc md = model_desc(cfg, 1000);
    dsgd_model *m = NULL;
    dsgd_metrics mt;
    if (dsgd_model_create(ctx, &md, &m) != DSGD_OK) return 0;
    if (dsgd_model_set_params(m, p, dsgd_model_num_params(m)) != DSGD_OK) return 0;
    if (!ex_evaluate(m, cfg->test, 1000, &mt)) return 0;
    *acc = mt.correct / mt.count;
    dsgd_model_destroy(m);
    return 1;
}

/* ---------------------------------------------------------------- mirrored */

static int run_mirrored(dsgd_ctx *ctx, const run_cfg *cfg, row *out) {
    dsgd_strategy *s = NULL;
    dsgd_sampler smp;
    int global = WORKERS * cfg->batch, e;
    float *x = (float *)malloc(sizeof(float) * (size_t)global * cfg->train->dim), *y = (float *)malloc(sizeof(float) * (size_t)global);
    float *p;
    double t0;
    size_t b, nb;
    dsgd_strategy_desc sd = {.kind = DSGD_STRATEGY_MIRRORED, .num_replicas = WORKERS,
                             .model = model_desc(cfg, cfg->batch), .optimizer = opt_desc(cfg, global)};
    if (!x || !y || dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) return 0;
    if (dsgd_sampler_init(ctx, &smp, cfg->train->n, (size_t)global, cfg->seed, 1, 1) != DSGD_OK) return 0;
    nb = dsgd_sampler_num_batches(&smp);
    t0 = dsgd_now();
    for (e = 0; e < cfg->epochs; ++e) {
        dsgd_sampler_set_epoch(&smp, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            const size_t *idx = NULL;
            size_t n = dsgd_sampler_batch(&smp, b, &idx);
            double ts = dsgd_now();
            dsgd_dataset_gather(cfg->train, idx, n, x, y);
            if (dsgd_strategy_train_step(s, x, y, (int)n, NULL) != DSGD_OK) return 0;
            if (cfg->straggler > 1.0) sleep_s((cfg->straggler - 1.0) * (dsgd_now() - ts));
        }
    }
    out->seconds = dsgd_now() - t0;
    p = (float *)malloc(sizeof(float) * dsgd_model_num_params(dsgd_strategy_model(s, 0)));
    if (!p || dsgd_model_get_params(dsgd_strategy_model(s, 0), p, dsgd_model_num_params(dsgd_strategy_model(s, 0))) != DSGD_OK ||
        !evaluate(ctx, cfg, p, &out->accuracy))
        return 0;
    free(p);
    free(x);
    free(y);
    dsgd_sampler_free(&smp);
    dsgd_strategy_destroy(s);
    return 1;
}

/* ---------------------------------------------------------------- parameter servers */

/* What the closures share: the settings, and each worker's gradient buffer
   for the straggler's own step (touched only on that worker's thread). */
typedef struct ps_job {
    const run_cfg *cfg;
    float *buf[WORKERS];
} ps_job;

/* One step of the worker on the next batch of its shard of the data
   (dsgd_cluster_set_dataset: worker w takes batches w, w + 4, ... of each
   epoch). A straggler does the step itself, sleeping between its gradient
   and its push, so the gradient arrives late. */
static dsgd_result ps_step(dsgd_cluster_worker *cw, void *user) {
    ps_job *j = (ps_job *)user;
    int w = dsgd_cluster_worker_id(cw), n = 0;
    const float *x, *y;
    dsgd_model *m = dsgd_cluster_worker_model(cw);
    dsgd_ps_worker *pw = dsgd_cluster_worker_ps(cw);
    dsgd_result r;
    size_t p;
    double t0;
    if ((r = dsgd_cluster_worker_next_batch(cw, &x, &y, &n, NULL)) != DSGD_OK) return r;
    if (w != 0 || j->cfg->straggler <= 1.0) return dsgd_cluster_worker_train_step(cw, x, y, n);
    p = dsgd_model_num_params(m);
    t0 = dsgd_now();
    if ((r = dsgd_ps_worker_pull(pw, j->buf[w])) != DSGD_OK) return r;
    if ((r = dsgd_model_set_params(m, j->buf[w], p)) != DSGD_OK) return r;
    if ((r = dsgd_model_compute_gradients(m, x, y, n, 1.0f / (float)n)) != DSGD_OK) return r;
    if ((r = dsgd_model_get_grads(m, j->buf[w], p)) != DSGD_OK) return r;
    sleep_s((j->cfg->straggler - 1.0) * (dsgd_now() - t0));
    return dsgd_ps_worker_push(pw, j->buf[w]);
}

static int run_ps(dsgd_ctx *ctx, const run_cfg *cfg, dsgd_ps_policy policy, int staleness, int backups, row *out) {
    dsgd_cluster *c = NULL;
    ps_job j = {.cfg = cfg};
    dsgd_ps_server_stats st;
    int64_t steps, k;
    int w, s, accepted = WORKERS - backups;
    double t0, wsum = 0;
    float *p;
    dsgd_cluster_desc d = {
        .ps = {.num_servers = SERVERS, .num_workers = WORKERS, .policy = policy, .staleness = staleness,
               .backup_workers = backups,
               .optimizer = opt_desc(cfg, policy == DSGD_PS_ASYNC ? cfg->batch : accepted * cfg->batch),
               .timeout_s = 120.0},
        .model = model_desc(cfg, cfg->batch),
    };
    if (policy == DSGD_PS_SSP) d.ps.optimizer.lr /= (float)(staleness + 1); /* staleness-aware rate */
    if (dsgd_cluster_create(ctx, &d, &c) != DSGD_OK) return 0;
    if (dsgd_cluster_set_dataset(c, cfg->train, cfg->batch, cfg->seed) != DSGD_OK) return 0;
    for (w = 0; w < WORKERS; ++w)
        if (!(j.buf[w] = (float *)malloc(sizeof(float) * dsgd_cluster_num_params(c)))) return 0;
    steps = (int64_t)(cfg->train->n / (size_t)cfg->batch / WORKERS) * cfg->epochs; /* per worker */
    t0 = dsgd_now();
    /* SYNC and SSP need one push per worker per step: pin each worker's
       closures; ASYNC and BACKUP take whichever worker is free. */
    for (k = 0; k < steps; ++k)
        for (w = 0; w < WORKERS; ++w) {
            dsgd_result r = policy == DSGD_PS_SYNC || policy == DSGD_PS_SSP
                                ? dsgd_cluster_schedule_on(c, w, ps_step, &j, NULL)
                                : dsgd_cluster_schedule(c, ps_step, &j, NULL);
            if (r != DSGD_OK) return 0;
        }
    if (dsgd_cluster_shutdown(c) != DSGD_OK) return 0;
    out->seconds = dsgd_now() - t0;
    p = (float *)malloc(sizeof(float) * dsgd_cluster_num_params(c));
    if (!p || dsgd_cluster_read_params(c, p) != DSGD_OK || !evaluate(ctx, cfg, p, &out->accuracy)) return 0;
    out->staleness_mean = 0;
    out->staleness_max = 0;
    for (s = 0; s < SERVERS; ++s) {
        dsgd_cluster_server_stats(c, s, &st);
        out->staleness_mean += st.staleness_mean * (double)st.pushes_applied;
        wsum += (double)st.pushes_applied;
        if (st.staleness_max > out->staleness_max) out->staleness_max = st.staleness_max;
        if (s == 0) out->dropped = st.stale_dropped;
    }
    out->staleness_mean = wsum > 0 ? out->staleness_mean / wsum : 0;
    free(p);
    for (w = 0; w < WORKERS; ++w) free(j.buf[w]);
    dsgd_cluster_destroy(c);
    return 1;
}

/* Whether the comma-separated list holds word (whole items only). */
static int has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, word, n)) return 1;
        p += len;
        if (*p == ',') ++p;
    }
    return 0;
}

static const char *const ROW_KEYS[5] = {"mirrored", "async", "ssp", "sync", "backup"};

/* Reads the flags into *cfg, *dir and run[] (which rows --rows picks); 0,
   or main's status 2 after saying what is wrong. */
static int parse_args(int argc, char **argv, run_cfg *cfg, const char **dir, int run[5]) {
    const char *only = "mirrored,async,ssp,sync,backup", *v, *p;
    int a, i, picked = 0, items = 0;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) *dir = v;
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) cfg->epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--batch"))) cfg->batch = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--straggler"))) cfg->straggler = atof(v);
        else if ((v = ex_flag(argc, argv, &a, "--backups"))) cfg->backups = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) cfg->seed = strtoull(v, NULL, 10);
        else if ((v = ex_flag(argc, argv, &a, "--rows"))) only = v;
        else
            return ex_usage(argv[0], "[--data DIR] [--epochs E] [--batch B] [--straggler F] [--backups b] [--seed S] "
                                     "[--rows mirrored,async,ssp,sync,backup]");
    }
    if (cfg->epochs < 1 || cfg->batch < 1 || !(cfg->straggler >= 1.0) || cfg->backups < 0 || cfg->backups >= WORKERS) {
        fprintf(stderr, "need epochs >= 1, batch >= 1, straggler >= 1 and 0 <= backups < %d\n", WORKERS);
        return 2;
    }
    for (i = 0; i < 5; ++i) picked += run[i] = has_word(only, ROW_KEYS[i]);
    for (p = only; *p; ++items) { /* every item must name a row */
        p += strcspn(p, ",");
        if (*p == ',') ++p;
    }
    if (picked == 0 || picked != items) {
        fprintf(stderr, "--rows takes a comma-separated list of mirrored, async, ssp, sync, backup\n");
        return 2;
    }
    return 0;
}

/* Trains row i (0 mirrored, 1 async, 2 SSP, 3 sync, 4 backups) into *out. */
static int run_row(dsgd_ctx *ctx, const run_cfg *cfg, int i, row *out) {
    switch (i) {
    case 0: return run_mirrored(ctx, cfg, out);
    case 1: return run_ps(ctx, cfg, DSGD_PS_ASYNC, 0, 0, out);
    case 2: return run_ps(ctx, cfg, DSGD_PS_SSP, 2, 0, out);
    case 3: return run_ps(ctx, cfg, DSGD_PS_SYNC, 0, 0, out);
    default: return run_ps(ctx, cfg, DSGD_PS_BACKUP, 0, cfg->backups, out);
    }
}

/* The markdown table of the rows that ran. */
static void print_table(const row rows[5], const int run[5]) {
    int i;
    printf("\n| %-24s | %8s | %9s | %15s | %14s | %7s |\n", "row", "wall s", "test acc", "staleness mean", "staleness max",
           "dropped");
    printf("|%s|%s|%s|%s|%s|%s|\n", "--------------------------", "----------", "-----------", "-----------------",
           "----------------", "---------");
    for (i = 0; i < 5; ++i)
        if (run[i])
            printf("| %-24s | %8.1f | %9.4f | %15.2f | %14lld | %7lld |\n", rows[i].name, rows[i].seconds,
                   rows[i].accuracy, rows[i].staleness_mean, rows[i].staleness_max, rows[i].dropped);
}

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist";
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    run_cfg cfg = {.epochs = 5, .batch = 64, .backups = 1, .straggler = 1.0, .seed = 1, .base_lr = 0.05f};
    char backup_name[32];
    row rows[5] = {{.name = "mirrored (all-reduce)"}, {.name = "PS async"}, {.name = "PS SSP s=2"},
                   {.name = "PS sync"}, {.name = backup_name}};
    int i, ok = 1, run[5], status = parse_args(argc, argv, &cfg, &dir, run);
    double async_acc = 0;
    if (status) return status;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_fashion_mnist(ctx, dir, &train, &test)) return ex_fail(ctx);
    cfg.train = &train;
    cfg.test = &test;
    printf("Fashion-MNIST, MLP 784-256-128-10, %d workers x batch %d, %d epochs, SGD momentum 0.9, base lr %.3g at 128%s\n",
           WORKERS, cfg.batch, cfg.epochs, (double)cfg.base_lr, cfg.straggler > 1.0 ? "" : "; no straggler");
    if (cfg.straggler > 1.0) printf("worker 0 is %.1fx slower (a straggler)\n", cfg.straggler);
    snprintf(backup_name, sizeof(backup_name), "PS sync, backups %d+%d", WORKERS - cfg.backups, cfg.backups);
    for (i = 0; i < 5 && ok; ++i) {
        if (!run[i]) continue;
        ok = run_row(ctx, &cfg, i, &rows[i]);
        if (ok) {
            printf("  done: %-24s %7.1f s  test acc %.4f\n", rows[i].name, rows[i].seconds, rows[i].accuracy);
            fflush(stdout);
        }
    }
    if (!ok) return ex_fail(ctx);
    async_acc = rows[1].accuracy;
    print_table(rows, run);
    if (run[1]) printf("\nasync PS test accuracy %.4f (%s 85%%)\n", async_acc, async_acc >= 0.85 ? ">=" : "BELOW");
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return !run[1] || async_acc >= 0.85 ? 0 : 1;
}
