/* multi_worker_mlp.c - multi-worker synchronous training over MPI: every MPI
   process is a worker holding --local K replicas (threads; default 1) of the
   demo's MLP (784-256-128-10), and the replicas of all workers all-reduce
   their gradients each step (DSGD_STRATEGY_MULTI_WORKER_MIRRORED over
   distsgd_mpi.h's transport: K endpoints per process,
   dsgd_mpi_transport_create_local).

   Every worker builds the same epoch order (a dsgd_sampler with the same
   seed), and each replica fetches only its own shard of each global batch
   through a batch function (dsgd_strategy_train_step_fn), so with W workers
   the run sees the samples of a W-replica mirrored strategy in one process.
   Creation checks that every worker describes the same model, optimizer and
   strategy, and the chief (rank 0) broadcasts its weights. Only the chief
   prints. A failure ends the whole job (dsgd_mpi_abort): MPI cannot take back
   a collective that some worker never joins.

   Run:  make demo-mpi                         (np = 2)
   or:   mpirun -np 2 build/mpi/multi_worker_mlp --data DIR [--local K]
           [--batch B] [--epochs E] [--lr BASE_LR] [--seed S]
           [--algo auto|ring|hd|rb|rd|hier] [--verify]
   --verify: the chief then trains the same run in one process (a MIRRORED
   strategy of K x P replicas over the loopback, the same explicit
   algorithm; ring when --algo is auto, whose choice differs between MPI
   and the loopback) and checks that its weights are bitwise equal (exit
   status 4 when not).
   (as root: mpirun --allow-run-as-root; beyond the core count:
   --oversubscribe). --batch is per replica; the global batch is B x K x P
   for P processes.
   Built with plain cc (as `make` builds every example) without mpi.h, it
   only says how to build it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("multi_worker_mlp: built without MPI (mpi.h not found); `make demo-mpi` builds it with mpicc and runs it");
    return 0;
}
#else
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_MPI_IMPLEMENTATION
#include "../distsgd_mpi.h"
#include "common.h"

#include <stdlib.h>
#include <string.h>

/* Ends the job with the message: the other workers cannot be told otherwise. */
static void die(dsgd_ctx *ctx, int rank, const char *what) {
    fprintf(stderr, "worker %d: %s: %s\n", rank, what, ctx ? dsgd_ctx_last_error(ctx) : "");
    dsgd_mpi_abort(1);
}

enum { MAX_LOCAL = 16 };

static int parse_algo(const char *s, dsgd_allreduce_algo *out) {
    static const struct { const char *name; dsgd_allreduce_algo algo; } table[] = {
        {"auto", DSGD_ALLREDUCE_AUTO}, {"ring", DSGD_ALLREDUCE_RING}, {"hd", DSGD_ALLREDUCE_HALVING_DOUBLING},
        {"rb", DSGD_ALLREDUCE_REDUCE_BROADCAST}, {"rd", DSGD_ALLREDUCE_RECURSIVE_DOUBLING},
        {"hier", DSGD_ALLREDUCE_HIERARCHICAL}};
    size_t i;
    for (i = 0; i < sizeof(table) / sizeof(table[0]); ++i)
        if (!strcmp(s, table[i].name)) {
            *out = table[i].algo;
            return 1;
        }
    return 0;
}

/* What each replica's batch function reads: this step's global batch (the
   sampler's indices) and each local replica's own gather buffers. */
typedef struct shard_src {
    const dsgd_dataset *ds;
    const size_t *idx; /* the global batch's sample indices */
    size_t count;
    int first;         /* the global rank of this worker's first replica */
    float *x[MAX_LOCAL], *y[MAX_LOCAL];
} shard_src;

/* Replica `replica` (global) of W takes dsgd_block_range of the global
   batch, into its own buffers (replicas call this concurrently). */
static dsgd_result shard_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    shard_src *s = (shard_src *)user;
    int k = replica - s->first;
    size_t off = 0, len = 0;
    dsgd_block_range(s->count, num_replicas, replica, &off, &len);
    dsgd_dataset_gather(s->ds, s->idx + off, len, s->x[k], s->y[k]);
    out->x = s->x[k];
    out->y = s->y[k];
    out->count = (int)len;
    return DSGD_OK;
}

typedef struct options {
    const char *dir;
    int batch, epochs, local, verify;
    float base_lr;
    uint64_t seed;
    dsgd_allreduce_algo algo;
} options;

/* Reads the flags into *o and checks them against the job's `replicas`
   (local x workers, once --local is known); 0, or main's status 2 after the
   chief said what is wrong. */
static int parse_args(int argc, char **argv, int rank, int workers, options *o) {
    const char *v;
    int a;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) o->dir = v;
        else if ((v = ex_flag(argc, argv, &a, "--batch"))) o->batch = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--local"))) o->local = atoi(v);
        else if (!strcmp(argv[a], "--algo") && a + 1 < argc && parse_algo(argv[a + 1], &o->algo)) ++a;
        else if (!strcmp(argv[a], "--verify")) o->verify = 1;
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) o->epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--lr"))) o->base_lr = (float)atof(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) o->seed = strtoull(v, NULL, 10);
        else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np P %s [--data DIR] [--local K] [--batch B] [--epochs E] "
                                "[--lr BASE_LR] [--seed S] [--algo auto|ring|hd|rb|rd|hier] [--verify]\n", argv[0]);
            return 2;
        }
    }
    if (o->batch < 1 || o->epochs < 1 || o->local < 1 || o->local > MAX_LOCAL) {
        if (rank == 0) fprintf(stderr, "batch and epochs must be >= 1, --local 1..%d\n", MAX_LOCAL);
        return 2;
    }
    if (o->verify && o->algo == DSGD_ALLREDUCE_AUTO) o->algo = DSGD_ALLREDUCE_RING;
    if (o->verify && o->local * workers > MAX_LOCAL) {
        if (rank == 0)
            fprintf(stderr, "--verify runs all %d replicas in one process: at most %d\n", o->local * workers, MAX_LOCAL);
        return 2;
    }
    return 0;
}

/* Gather buffers of `batch` samples for replicas 0..n-1 of src. */
static void alloc_shards(shard_src *src, int n, int batch, int dim, int rank) {
    int k;
    for (k = 0; k < n; ++k) {
        src->x[k] = (float *)malloc(sizeof(float) * (size_t)batch * (size_t)dim);
        src->y[k] = (float *)malloc(sizeof(float) * (size_t)batch);
        if (!src->x[k] || !src->y[k]) die(NULL, rank, "out of memory");
    }
}

/* Frees alloc_shards' buffers. */
static void free_shards(shard_src *src, int n) {
    int k;
    for (k = 0; k < n; ++k) {
        free(src->x[k]);
        free(src->y[k]);
    }
}

/* Epoch e: every global batch of the sampler, each replica fetching its shard. */
static int train_epoch(dsgd_strategy *s, dsgd_sampler *sampler, shard_src *src, int e) {
    size_t b, nb = dsgd_sampler_num_batches(sampler);
    dsgd_sampler_set_epoch(sampler, (uint64_t)e);
    for (b = 0; b < nb; ++b) {
        src->count = dsgd_sampler_batch(sampler, b, &src->idx);
        if (dsgd_strategy_train_step_fn(s, shard_fn, src, NULL) != DSGD_OK) return 0;
    }
    return 1;
}

/* The test set in chunks of `chunk` (every worker evaluates its shards: a
   collective too), then the training and evaluation metrics. */
static void evaluate(dsgd_ctx *ctx, int rank, dsgd_strategy *s, const dsgd_dataset *test, size_t chunk,
                     dsgd_metrics *tr, dsgd_metrics *te) {
    size_t i;
    for (i = 0; i < test->n; i += chunk) {
        size_t n = test->n - i < chunk ? test->n - i : chunk;
        if (dsgd_strategy_eval_batch(s, test->x + i * test->dim, test->y + i, (int)n) != DSGD_OK) die(ctx, rank, "eval");
    }
    if (dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, tr) != DSGD_OK ||
        dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, te) != DSGD_OK)
        die(ctx, rank, "metrics");
}

/* --verify, on the chief: the same run in one process (K x P replicas of a
   MIRRORED strategy over the loopback); prints whether its weights equal
   s's bit for bit. Returns 0, or 4 when they differ. */
static int verify_one_process(dsgd_ctx *ctx, dsgd_strategy *s, const dsgd_strategy_desc *sd, const shard_src *src,
                              dsgd_sampler *sampler, const options *o, int replicas) {
    size_t np = dsgd_model_num_params(dsgd_strategy_model(s, 0));
    float *mine = (float *)malloc(sizeof(float) * np), *ref = (float *)malloc(sizeof(float) * np);
    dsgd_strategy_desc rd = *sd;
    dsgd_strategy *one = NULL;
    shard_src rs = *src;
    int e, differ;
    if (!mine || !ref) die(NULL, 0, "out of memory");
    rd.kind = DSGD_STRATEGY_MIRRORED;
    rd.num_replicas = replicas;
    rd.endpoints = NULL;
    rs.first = 0;
    alloc_shards(&rs, replicas, o->batch, (int)src->ds->dim, 0);
    if (dsgd_strategy_create(ctx, &rd, &one) != DSGD_OK) die(ctx, 0, "--verify: the one-process strategy");
    for (e = 0; e < o->epochs; ++e)
        if (!train_epoch(one, sampler, &rs, e)) die(ctx, 0, "--verify step");
    dsgd_model_get_params(dsgd_strategy_model(s, 0), mine, np);
    dsgd_model_get_params(dsgd_strategy_model(one, 0), ref, np);
    differ = memcmp(mine, ref, np * sizeof(float)) != 0;
    printf("verify: %s to the one-process run with %d replicas (%s)\n",
           differ ? "weights DIFFER" : "weights bitwise equal", replicas, dsgd_allreduce_algo_name(o->algo));
    free_shards(&rs, replicas);
    dsgd_strategy_destroy(one);
    free(mine);
    free(ref);
    return differ ? 4 : 0;
}

int main(int argc, char **argv) {
    options o = {.dir = "build/data/fashion-mnist", .batch = 64, .epochs = 3, .local = 1, .base_lr = 0.05f,
                 .seed = 1, .algo = DSGD_ALLREDUCE_AUTO};
    int e, k, rank = 0, workers = 1, replicas, global, status;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_transport_i eps[MAX_LOCAL];
    dsgd_layer_desc layers[3] = {{.units = 256, .activation = DSGD_ACT_RELU},
                                 {.units = 128, .activation = DSGD_ACT_RELU},
                                 {.units = 10}};
    dsgd_strategy *s = NULL;
    dsgd_sampler sampler;
    double t_start;

    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) die(ctx, rank, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &workers);
    if ((status = parse_args(argc, argv, rank, workers, &o))) {
        MPI_Finalize();
        return status;
    }
    replicas = o.local * workers;
    global = o.batch * replicas;
    if (!ex_load_fashion_mnist(ctx, o.dir, &train, &test)) die(ctx, rank, "loading Fashion-MNIST");
    if (dsgd_sampler_init(ctx, &sampler, train.n, (size_t)global, o.seed, 1, 1) != DSGD_OK) die(ctx, rank, "sampler");
    int64_t nb = (int64_t)dsgd_sampler_num_batches(&sampler);
    /* K endpoints: ranks rank*K .. rank*K+K-1 of K*P (collective: every
       process passes the same K, or every one fails) */
    if (dsgd_mpi_transport_create_local(ctx, NULL, o.local, eps) != DSGD_OK)
        die(ctx, rank, "dsgd_mpi_transport_create_local");
    dsgd_strategy_desc sd = {
        .kind = DSGD_STRATEGY_MULTI_WORKER_MIRRORED,
        .num_replicas = o.local, /* this worker's; the group's is the endpoints' size */
        .endpoints = eps,
        .model = {.input_dim = (int)train.dim, .layers = layers, .num_layers = 3,
                  .max_batch = o.batch > 1000 ? o.batch : 1000, /* evaluation shards of up to 1000 */
                  .seed = o.seed},
        .optimizer = {.kind = DSGD_OPT_MOMENTUM, .nesterov = 1, .lr = dsgd_linear_scaled_lr(o.base_lr, global, 128),
                      .schedule = {.kind = DSGD_SCHEDULE_COSINE, .warmup_steps = nb / 2, .total_steps = nb * o.epochs}},
        .timeout_s = 60.0,
        .algorithm = o.algo,
    };
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) die(ctx, rank, "dsgd_strategy_create");
    if (rank == 0)
        printf("Fashion-MNIST: %zu training, %zu test images; %d workers x %d replica%s x batch %d = global batch %d; "
               "MLP 784-256-128-10, lr %.4g\n", train.n, test.n, workers, o.local, o.local == 1 ? "" : "s", o.batch,
               global, (double)sd.optimizer.lr);

    shard_src src = {.ds = &train, .first = rank * o.local};
    alloc_shards(&src, o.local, o.batch, (int)train.dim, rank);
    t_start = dsgd_now();
    for (e = 0; e < o.epochs; ++e) {
        double t0 = dsgd_now();
        dsgd_metrics tr, te;
        if (!train_epoch(s, &sampler, &src, e)) die(ctx, rank, "train step");
        evaluate(ctx, rank, s, &test, (size_t)replicas * 1000, &tr, &te);
        if (rank == 0)
            printf("epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s\n", e + 1, o.epochs,
                   tr.loss_sum / tr.count, tr.correct / tr.count, te.correct / te.count, tr.count / (dsgd_now() - t0));
        if (rank == 0 && e == o.epochs - 1)
            printf("final test accuracy %.4f with %d workers x %d replica%s in %.1f s\n", te.correct / te.count,
                   workers, o.local, o.local == 1 ? "" : "s", dsgd_now() - t_start);
        fflush(stdout);
    }
    status = o.verify && rank == 0 ? verify_one_process(ctx, s, &sd, &src, &sampler, &o, replicas) : 0;
    free_shards(&src, o.local);
    dsgd_strategy_destroy(s);
    for (k = 0; k < o.local; ++k) eps[k].destroy(eps[k].impl); /* every one: the last frees the communicator */
    dsgd_sampler_free(&sampler);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return status;
}
#endif
