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

#include <stdlib.h>
#include <string.h>

/* Ends the job with the message: the other workers cannot be told otherwise. */
static void die(dsgd_ctx *ctx, int rank, const char *what) {
    fprintf(stderr, "worker %d: %s: %s\n", rank, what, ctx ? dsgd_ctx_last_error(ctx) : "");
    dsgd_mpi_abort(1);
}

static int load(dsgd_ctx *ctx, const char *dir, const char *prefix, dsgd_dataset *ds) {
    char img[1024], lab[1024];
    snprintf(img, sizeof(img), "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(lab, sizeof(lab), "%s/%s-labels-idx1-ubyte", dir, prefix);
    return dsgd_dataset_load_idx(ctx, img, lab, 10, ds) == DSGD_OK;
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

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist";
    int batch = 64, epochs = 3, local = 1, a, e, k, rank = 0, workers = 1, replicas, global, verify = 0;
    dsgd_allreduce_algo algo = DSGD_ALLREDUCE_AUTO;
    float base_lr = 0.05f;
    uint64_t seed = 1;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_transport_i eps[MAX_LOCAL];
    dsgd_layer_desc layers[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    dsgd_sampler sampler;
    shard_src src;
    size_t nb;
    double t_start;

    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) die(ctx, rank, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &workers);
    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc) batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--local") && a + 1 < argc) local = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--algo") && a + 1 < argc && parse_algo(argv[a + 1], &algo)) ++a;
        else if (!strcmp(argv[a], "--verify")) verify = 1;
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--lr") && a + 1 < argc) base_lr = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else {
            if (rank == 0)
                fprintf(stderr, "usage: mpirun -np P %s [--data DIR] [--local K] [--batch B] [--epochs E] "
                                "[--lr BASE_LR] [--seed S] [--algo auto|ring|hd|rb|rd|hier] [--verify]\n", argv[0]);
            MPI_Finalize();
            return 2;
        }
    }
    if (batch < 1 || epochs < 1 || local < 1 || local > MAX_LOCAL) {
        if (rank == 0) fprintf(stderr, "batch and epochs must be >= 1, --local 1..%d\n", MAX_LOCAL);
        MPI_Finalize();
        return 2;
    }
    replicas = local * workers;
    global = batch * replicas;
    if (verify && algo == DSGD_ALLREDUCE_AUTO) algo = DSGD_ALLREDUCE_RING;
    if (verify && replicas > MAX_LOCAL) {
        if (rank == 0) fprintf(stderr, "--verify runs all %d replicas in one process: at most %d\n", replicas, MAX_LOCAL);
        MPI_Finalize();
        return 2;
    }
    if (!load(ctx, dir, "train", &train) || !load(ctx, dir, "t10k", &test)) die(ctx, rank, "loading Fashion-MNIST");
    if (dsgd_sampler_init(ctx, &sampler, train.n, (size_t)global, seed, 1, 1) != DSGD_OK) die(ctx, rank, "sampler");
    nb = dsgd_sampler_num_batches(&sampler);
    /* K endpoints: ranks rank*K .. rank*K+K-1 of K*P (collective: every
       process passes the same K, or every one fails) */
    if (dsgd_mpi_transport_create_local(ctx, NULL, local, eps) != DSGD_OK) die(ctx, rank, "dsgd_mpi_transport_create_local");

    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MULTI_WORKER_MIRRORED;
    sd.num_replicas = local;  /* this worker's; the group's is the endpoints' size */
    sd.endpoints = eps;
    sd.model.input_dim = (int)train.dim;
    sd.model.layers = layers;
    sd.model.num_layers = 3;
    sd.model.max_batch = batch > 1000 ? batch : 1000; /* evaluation shards of up to 1000 */
    sd.model.seed = seed;
    sd.optimizer.kind = DSGD_OPT_MOMENTUM;
    sd.optimizer.nesterov = 1;
    sd.optimizer.lr = dsgd_linear_scaled_lr(base_lr, global, 128);
    sd.optimizer.schedule.kind = DSGD_SCHEDULE_COSINE;
    sd.optimizer.schedule.warmup_steps = (int64_t)nb / 2;
    sd.optimizer.schedule.total_steps = (int64_t)nb * epochs;
    sd.timeout_s = 60.0;
    sd.algorithm = algo;
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) die(ctx, rank, "dsgd_strategy_create");
    if (rank == 0)
        printf("Fashion-MNIST: %zu training, %zu test images; %d workers x %d replica%s x batch %d = global batch %d; "
               "MLP 784-256-128-10, lr %.4g\n", train.n, test.n, workers, local, local == 1 ? "" : "s", batch, global,
               (double)sd.optimizer.lr);

    memset(&src, 0, sizeof(src));
    src.ds = &train;
    src.first = rank * local;
    for (k = 0; k < local; ++k) {
        src.x[k] = (float *)malloc(sizeof(float) * (size_t)batch * train.dim);
        src.y[k] = (float *)malloc(sizeof(float) * (size_t)batch);
        if (!src.x[k] || !src.y[k]) die(NULL, rank, "out of memory");
    }
    t_start = dsgd_now();
    for (e = 0; e < epochs; ++e) {
        size_t b, i, chunk = (size_t)replicas * 1000;
        double t0 = dsgd_now();
        dsgd_metrics tr, te;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            src.count = dsgd_sampler_batch(&sampler, b, &src.idx);
            if (dsgd_strategy_train_step_fn(s, shard_fn, &src, NULL) != DSGD_OK) die(ctx, rank, "train step");
        }
        for (i = 0; i < test.n; i += chunk) { /* every worker evaluates its shards: a collective too */
            size_t n = test.n - i < chunk ? test.n - i : chunk;
            if (dsgd_strategy_eval_batch(s, test.x + i * test.dim, test.y + i, (int)n) != DSGD_OK) die(ctx, rank, "eval");
        }
        if (dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &tr) != DSGD_OK ||
            dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &te) != DSGD_OK)
            die(ctx, rank, "metrics");
        if (rank == 0)
            printf("epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s\n", e + 1, epochs,
                   tr.loss_sum / tr.count, tr.correct / tr.count, te.correct / te.count, tr.count / (dsgd_now() - t0));
        if (rank == 0 && e == epochs - 1)
            printf("final test accuracy %.4f with %d workers x %d replica%s in %.1f s\n", te.correct / te.count, workers,
                   local, local == 1 ? "" : "s", dsgd_now() - t_start);
        fflush(stdout);
    }
    if (verify && rank == 0) {
        /* the same run in one process: K x P replicas over the loopback */
        float *mine = (float *)malloc(sizeof(float) * dsgd_model_num_params(dsgd_strategy_model(s, 0)));
        float *ref = (float *)malloc(sizeof(float) * dsgd_model_num_params(dsgd_strategy_model(s, 0)));
        size_t np = dsgd_model_num_params(dsgd_strategy_model(s, 0));
        dsgd_strategy_desc rd = sd;
        dsgd_strategy *one = NULL;
        shard_src rs = src;
        if (!mine || !ref) die(NULL, rank, "out of memory");
        rd.kind = DSGD_STRATEGY_MIRRORED;
        rd.num_replicas = replicas;
        rd.endpoints = NULL;
        rs.first = 0;
        for (k = 0; k < replicas; ++k) {
            rs.x[k] = (float *)malloc(sizeof(float) * (size_t)batch * train.dim);
            rs.y[k] = (float *)malloc(sizeof(float) * (size_t)batch);
            if (!rs.x[k] || !rs.y[k]) die(NULL, rank, "out of memory");
        }
        if (dsgd_strategy_create(ctx, &rd, &one) != DSGD_OK) die(ctx, rank, "--verify: the one-process strategy");
        for (e = 0; e < epochs; ++e) {
            size_t b;
            dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
            for (b = 0; b < nb; ++b) {
                rs.count = dsgd_sampler_batch(&sampler, b, &rs.idx);
                if (dsgd_strategy_train_step_fn(one, shard_fn, &rs, NULL) != DSGD_OK) die(ctx, rank, "--verify step");
            }
        }
        dsgd_model_get_params(dsgd_strategy_model(s, 0), mine, np);
        dsgd_model_get_params(dsgd_strategy_model(one, 0), ref, np);
        printf("verify: %s to the one-process run with %d replicas (%s)\n",
               memcmp(mine, ref, np * sizeof(float)) ? "weights DIFFER" : "weights bitwise equal", replicas,
               dsgd_allreduce_algo_name(algo));
        if (memcmp(mine, ref, np * sizeof(float))) verify = 4;
        for (k = 0; k < replicas; ++k) {
            free(rs.x[k]);
            free(rs.y[k]);
        }
        dsgd_strategy_destroy(one);
        free(mine);
        free(ref);
    }
    for (k = 0; k < local; ++k) {
        free(src.x[k]);
        free(src.y[k]);
    }
    dsgd_strategy_destroy(s);
    for (k = 0; k < local; ++k) eps[k].destroy(eps[k].impl); /* every one: the last frees the communicator */
    dsgd_sampler_free(&sampler);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return verify == 4 ? 4 : 0;
}
#endif
