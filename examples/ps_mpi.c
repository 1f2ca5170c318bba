/* ps_mpi.c - parameter servers across MPI processes: P servers and W
   workers, each an MPI process, train the demo's MLP (784-256-128-10, SGD
   with Nesterov momentum) on Fashion-MNIST with the parameter-server engine
   (distsgd/ps.h) over distsgd_mpi.h's transport.

   Roles (dsgd_mpi_ps_role_create, distsgd/mpi/ps.h): from TF_CONFIG when it
   is set (ps i is server i, the chief worker 0, worker i worker chiefs + i),
   else the rank layout: the first --servers processes serve, the rest are
   workers. The engine's ranks are servers first, so the endpoint is made
   over the communicator the roles give (processes in the engine's order).
   A bad TF_CONFIG, or a cluster of another size than the job, fails on every
   process with the same message.

   Servers serve until every worker has finished. Each worker runs the
   engine's loop (dsgd_ps_worker_run: pull, the policy's stop rule, compute,
   push) on its own shard of each epoch, as dsgd_cluster_set_dataset cuts
   it (dsgd_sampler_worker_batch): the same sampler seed everywhere,
   batches of --batch, worker w takes batches w, w + W, w + 2W, ...
   (floor(batches / W) each); its gradient is that of the mean loss.
   --policy async (the default) applies every push on arrival; sync
   averages one gradient per worker per step; ssp bounds the lead by
   --staleness s (default 2); these stop after E epochs of pushes. backup
   takes the first W - b gradients of each step (--backups b, default 1)
   and the workers stop on the global step, as TF's do, once it reaches
   the updates of E epochs. The learning
   rate follows the linear scaling rule for the batch one update averages (B
   for async, W B for sync, W B / (s + 1) for ssp, (W - b) B for backup),
   with half an epoch of warmup and a cosine decay, as examples/sync_vs_async.c.
   At the end the workers meet (a barrier of their own), the chief pulls the
   final weights and reports the test accuracy and the servers' counters.

   Run:  make demo-ps-mpi            (np = 4: 2 servers + 2 workers, async)
   or:   mpirun -np P+W build/mpi/ps_mpi [--servers P] [--policy async|sync|ssp|backup]
           [--staleness s] [--backups b] [--data DIR] [--epochs E] [--batch B]
           [--lr BASE_LR] [--seed S]
   (as root: mpirun --allow-run-as-root; beyond the core count:
   --oversubscribe). With TF_CONFIG (mpirun -x TF_CONFIG, one per process
   through a wrapper) --servers is not used. Any failure after the roles
   ends the whole job (dsgd_mpi_abort). Built with plain cc (as `make` builds
   every example) without mpi.h, it only says how to build it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("ps_mpi: built without MPI (mpi.h not found); `make demo-ps-mpi` builds it with mpicc and runs it");
    return 0;
}
#else
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_MPI_IMPLEMENTATION
#include "../distsgd_mpi.h"
#include "common.h"

#include <stdlib.h>
#include <string.h>

static const dsgd_layer_desc LAYERS[3] = {{.units = 256, .activation = DSGD_ACT_RELU},
                                          {.units = 128, .activation = DSGD_ACT_RELU},
                                          {.units = 10}};

typedef struct options {
    const char *dir, *policy_name;
    int batch, epochs, servers, staleness, backups;
    float base_lr;
    uint64_t seed;
    dsgd_ps_policy policy;
} options;

/* What this process's role works with, set up by main and setup(). */
typedef struct job {
    options o;
    dsgd_ctx *ctx;
    dsgd_mpi_ps_role role;
    const char *who;                 /* "server" or "worker", for messages */
    int P, W;                        /* servers, workers */
    size_t per_epoch;                /* batches per worker per epoch */
    int64_t updates_per_epoch;
    dsgd_dataset train, test;
    dsgd_model *m;
    dsgd_shard_map *map;
    float *params, *buf;             /* the initial weights; the parameters pulled */
    size_t np;
    dsgd_ps_desc pd;
    dsgd_transport_i ep;
    MPI_Comm workers_comm;
    dsgd_sampler smp;                /* a worker's shard of each epoch */
    float *x, *y;                    /* a worker's batch */
    double stats[7], t_start, t_train;
} job;

/* Ends the job with the message: a peer may be waiting for this process. */
static void die(dsgd_ctx *ctx, const char *who, int index, const char *what) {
    fprintf(stderr, "ps_mpi: %s %d: %s: %s\n", who, index, what, ctx ? dsgd_ctx_last_error(ctx) : "");
    dsgd_mpi_abort(1);
}

/* Reads the flags into *o; 0 on a bad flag or value. */
static int parse_args(int argc, char **argv, options *o) {
    const char *v;
    int a;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) o->dir = v;
        else if ((v = ex_flag(argc, argv, &a, "--servers"))) o->servers = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--policy"))) o->policy_name = v;
        else if ((v = ex_flag(argc, argv, &a, "--staleness"))) o->staleness = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--backups"))) o->backups = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--batch"))) o->batch = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) o->epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--lr"))) o->base_lr = (float)atof(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) o->seed = strtoull(v, NULL, 10);
        else return 0;
    }
    if (!strcmp(o->policy_name, "async")) o->policy = DSGD_PS_ASYNC;
    else if (!strcmp(o->policy_name, "sync")) o->policy = DSGD_PS_SYNC;
    else if (!strcmp(o->policy_name, "ssp")) o->policy = DSGD_PS_SSP;
    else if (!strcmp(o->policy_name, "backup")) o->policy = DSGD_PS_BACKUP;
    else return 0;
    return o->batch >= 1 && o->epochs >= 1;
}

/* The policy's defaults, the data, the model (the same initial weights on
   every process, from the seed), the shard map and the engine's desc. */
static void setup(job *j) {
    dsgd_ps_policy policy = j->o.policy;
    dsgd_variable vars[8];
    int nv, i, update_batch, backups;
    size_t nb;
    if (j->o.staleness < 0) j->o.staleness = policy == DSGD_PS_SSP ? 2 : 0;
    if (j->o.backups < 0) j->o.backups = policy == DSGD_PS_BACKUP ? 1 : 0;
    if (j->o.backups >= j->W) j->o.backups = j->W - 1;
    backups = j->o.backups;
    /* Every process loads the data (servers need the input size only, but
       the same code keeps every process's model desc equal). */
    if (!ex_load_fashion_mnist(j->ctx, j->o.dir, &j->train, &j->test))
        die(j->ctx, j->who, j->role.index, "loading Fashion-MNIST");
    nb = j->train.n / (size_t)j->o.batch;
    j->per_epoch = nb / (size_t)j->W;
    if (j->per_epoch < 1) die(NULL, j->who, j->role.index, "fewer batches than workers");
    update_batch = policy == DSGD_PS_ASYNC    ? j->o.batch
                   : policy == DSGD_PS_BACKUP ? (j->W - backups) * j->o.batch
                                              : j->W * j->o.batch;
    j->updates_per_epoch = policy == DSGD_PS_ASYNC    ? (int64_t)(j->per_epoch * (size_t)j->W)
                           : policy == DSGD_PS_BACKUP ? (int64_t)j->per_epoch * j->W / (j->W - backups)
                                                      : (int64_t)j->per_epoch;
    dsgd_model_desc md = {.input_dim = (int)j->train.dim, .layers = LAYERS, .num_layers = 3,
                          .max_batch = j->o.batch > 1000 ? j->o.batch : 1000, .seed = j->o.seed};
    if (dsgd_model_create(j->ctx, &md, &j->m) != DSGD_OK) die(j->ctx, j->who, j->role.index, "dsgd_model_create");
    j->np = dsgd_model_num_params(j->m);
    nv = dsgd_model_num_variables(j->m);
    j->params = (float *)malloc(sizeof(float) * j->np);
    j->buf = (float *)malloc(sizeof(float) * j->np);
    if (!j->params || !j->buf || nv > 8) die(NULL, j->who, j->role.index, "out of memory");
    for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(j->m, i);
    if (dsgd_model_get_params(j->m, j->params, j->np) != DSGD_OK)
        die(j->ctx, j->who, j->role.index, "dsgd_model_get_params");
    if (dsgd_shard_map_create(j->ctx, vars, nv, j->P, NULL, &j->map) != DSGD_OK)
        die(j->ctx, j->who, j->role.index, "shard map");
    dsgd_ps_desc pd = {
        .num_servers = j->P,
        .num_workers = j->W,
        .policy = policy,
        .staleness = policy == DSGD_PS_SSP ? j->o.staleness : 0,
        .backup_workers = policy == DSGD_PS_BACKUP ? backups : 0,
        .optimizer = {.kind = DSGD_OPT_MOMENTUM, .nesterov = 1,
                      .lr = dsgd_linear_scaled_lr(j->o.base_lr, update_batch, 128),
                      .schedule = {.kind = DSGD_SCHEDULE_COSINE, .warmup_steps = j->updates_per_epoch / 2,
                                   .total_steps = j->updates_per_epoch * j->o.epochs}},
        .timeout_s = 120.0,
    };
    if (policy == DSGD_PS_SSP) pd.optimizer.lr /= (float)(j->o.staleness + 1); /* staleness-aware rate */
    j->pd = pd;
}

/* A server serves until every worker has finished; its counters into stats. */
static void run_server(job *j) {
    dsgd_ps_server *s = NULL;
    dsgd_ps_server_stats st;
    if (dsgd_ps_server_create(j->ctx, &j->ep, &j->pd, j->map, j->params, &s) != DSGD_OK)
        die(j->ctx, j->who, j->role.index, "create");
    if (dsgd_ps_server_serve(s) != DSGD_OK) die(j->ctx, j->who, j->role.index, "serve");
    dsgd_ps_server_get_stats(s, &st);
    j->stats[0] = (double)st.version;
    j->stats[1] = (double)st.pushes_received;
    j->stats[2] = (double)st.pushes_applied;
    j->stats[3] = (double)st.duplicates;
    j->stats[4] = (double)st.stale_dropped;
    j->stats[5] = st.staleness_mean;
    j->stats[6] = (double)st.staleness_max;
    dsgd_ps_server_destroy(s);
}

/* The gradient fn of dsgd_ps_worker_run: the mean loss's gradient on this
   worker's batch `step` of its shard, at the pulled params. */
static dsgd_result worker_grad(void *user, int64_t step, const float *params, float *grads) {
    job *j = (job *)user;
    const size_t *idx = NULL;
    size_t n = dsgd_sampler_worker_batch(&j->smp, j->role.index, j->W, (uint64_t)step, &idx);
    dsgd_result r = dsgd_dataset_gather(&j->train, idx, n, j->x, j->y);
    if (r == DSGD_OK) r = dsgd_model_set_params(j->m, params, j->np);
    if (r == DSGD_OK) r = dsgd_model_compute_gradients(j->m, j->x, j->y, (int)n, 1.0f / (float)n);
    if (r == DSGD_OK) r = dsgd_model_get_grads(j->m, grads, j->np);
    return r;
}

/* After each push: the chief says when it has pushed an epoch's batches. */
static dsgd_result worker_pushed(void *user, int64_t step) {
    job *j = (job *)user;
    if (j->role.is_chief && (step + 1) % (int64_t)j->per_epoch == 0) {
        printf("ps_mpi: chief: epoch %lld done, %.1f s\n", (long long)((step + 1) / (int64_t)j->per_epoch),
               dsgd_now() - j->t_start);
        fflush(stdout);
    }
    return DSGD_OK;
}

/* A worker runs the engine's loop; then the workers meet and the chief,
   which ran without finishing, pulls the final weights into buf. Its
   pushes into stats[0]. The target: E epochs of pushes, or under BACKUP
   (the workers stop on the global step) E epochs of updates. */
static void run_worker(job *j) {
    dsgd_ps_worker *pw = NULL;
    dsgd_ps_worker_stats st;
    int64_t target = (dsgd_ps_policy_stops_on_global(j->o.policy) ? j->updates_per_epoch : (int64_t)j->per_epoch) *
                     j->o.epochs;
    dsgd_ps_run_desc run = {.steps = target, .grad = worker_grad, .user = j, .num_floats = j->np,
                            .params = j->buf, .after_push = worker_pushed, .no_finish = j->role.is_chief};
    j->x = (float *)malloc(sizeof(float) * (size_t)j->o.batch * j->train.dim);
    j->y = (float *)malloc(sizeof(float) * (size_t)j->o.batch);
    if (!j->x || !j->y) die(NULL, j->who, j->role.index, "out of memory");
    if (dsgd_sampler_init(j->ctx, &j->smp, j->train.n, (size_t)j->o.batch, j->o.seed, 1, 1) != DSGD_OK)
        die(j->ctx, j->who, j->role.index, "sampler");
    if (dsgd_ps_worker_create(j->ctx, &j->ep, &j->pd, j->map, &pw) != DSGD_OK)
        die(j->ctx, j->who, j->role.index, "create");
    memcpy(j->buf, j->params, sizeof(float) * j->np); /* floats no shard holds (none here) keep their values */
    if (dsgd_ps_worker_run(pw, &run) != DSGD_OK) die(j->ctx, j->who, j->role.index, "run");
    dsgd_ps_worker_get_stats(pw, &st);
    j->stats[0] = (double)st.clock;
    /* The chief pulls once every worker's pushes are in. */
    MPI_Barrier(j->workers_comm);
    if (j->role.is_chief) {
        j->t_train = dsgd_now() - j->t_start;
        if (dsgd_ps_worker_pull(pw, j->buf) != DSGD_OK) die(j->ctx, j->who, j->role.index, "final pull");
        if (dsgd_ps_worker_finish(pw) != DSGD_OK) die(j->ctx, j->who, j->role.index, "finish");
    }
    dsgd_ps_worker_destroy(pw);
    dsgd_sampler_free(&j->smp);
    free(j->x);
    free(j->y);
}

/* The chief: the final weights' test accuracy, every server's counters
   (all_stats: 7 per process, servers first) and the workers' pushes. */
static void report(job *j, const double *all_stats) {
    dsgd_metrics mt;
    double pushes = 0;
    int i;
    if (dsgd_model_set_params(j->m, j->buf, j->np) != DSGD_OK) die(j->ctx, j->who, j->role.index, "set_params");
    if (!ex_evaluate(j->m, &j->test, 1000, &mt)) die(j->ctx, j->who, 0, "eval");
    for (i = 0; i < j->P; ++i)
        printf("ps_mpi: server %d: version %.0f, pushes %.0f (applied %.0f, duplicates %.0f, stale dropped %.0f), "
               "staleness mean %.2f max %.0f\n",
               i, all_stats[7 * i], all_stats[7 * i + 1], all_stats[7 * i + 2], all_stats[7 * i + 3],
               all_stats[7 * i + 4], all_stats[7 * i + 5], all_stats[7 * i + 6]);
    for (i = 0; i < j->W; ++i) pushes += all_stats[7 * (j->P + i)];
    printf("ps_mpi: %s, %d servers + %d workers: final test accuracy %.4f, %.0f pushes in %.1f s "
           "(%.0f samples/s)\n", dsgd_ps_policy_name(j->o.policy), j->P, j->W, mt.correct / mt.count, pushes,
           j->t_train, pushes * j->o.batch / j->t_train);
    fflush(stdout);
}

int main(int argc, char **argv) {
    job j = {.o = {.dir = "build/data/fashion-mnist", .policy_name = "async", .batch = 64, .epochs = 3,
                   .servers = 2, .staleness = -1, .backups = -1, .base_lr = 0.05f, .seed = 1},
             .workers_comm = MPI_COMM_NULL};
    double *all_stats = NULL;
    int proc = 0;

    if (dsgd_ctx_create(NULL, &j.ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(j.ctx, &argc, &argv, NULL) != DSGD_OK) die(j.ctx, "process", 0, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &proc);
    if (!parse_args(argc, argv, &j.o)) {
        if (proc == 0)
            fprintf(stderr, "usage: mpirun -np P+W %s [--servers P] [--policy async|sync|ssp|backup] [--staleness s] "
                            "[--backups b] [--data DIR] [--epochs E] [--batch B] [--lr BASE_LR] [--seed S]\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }
    /* Who is what: every process gets the same verdict, so on an error all
       of them stop here, and nothing is pending: MPI_Finalize is safe. */
    if (dsgd_mpi_ps_role_create(j.ctx, MPI_COMM_WORLD, j.o.servers, &j.role) != DSGD_OK) {
        fprintf(stderr, "ps_mpi (process %d): %s\n", proc, dsgd_ctx_last_error(j.ctx));
        MPI_Finalize();
        return 1;
    }
    j.P = j.role.num_servers;
    j.W = j.role.num_workers;
    j.who = j.role.is_server ? "server" : "worker";
    setup(&j);

    /* The endpoint over the engine-ordered communicator; the workers' own
       communicator for the final barrier. */
    dsgd_mpi_desc mdsc = {.comm = j.role.comm};
    if (dsgd_mpi_transport_create(j.ctx, &mdsc, &j.ep) != DSGD_OK)
        die(j.ctx, j.who, j.role.index, "dsgd_mpi_transport_create");
    MPI_Comm_split(j.role.comm, j.role.is_server ? 0 : 1, j.role.rank, &j.workers_comm);
    if (j.role.is_chief)
        printf("ps_mpi: %d servers + %d workers (%s), policy %s (s = %d, b = %d), Fashion-MNIST %zu training / %zu test "
               "images, batch %d per worker, %zu batches per worker per epoch, %d epochs, lr %.4g\n",
               j.P, j.W, j.role.from_tf_config ? "TF_CONFIG" : "rank layout", dsgd_ps_policy_name(j.o.policy),
               j.pd.staleness, j.pd.backup_workers, j.train.n, j.test.n, j.o.batch, j.per_epoch, j.o.epochs,
               (double)j.pd.optimizer.lr);
    fflush(stdout);
    MPI_Barrier(j.role.comm);
    j.t_start = dsgd_now();
    if (j.role.is_server) run_server(&j);
    else run_worker(&j);

    /* The servers' counters and the workers' pushes, to the chief (rank P). */
    if (j.role.is_chief) all_stats = (double *)malloc(sizeof(double) * 7 * (size_t)(j.P + j.W));
    MPI_Gather(j.stats, 7, MPI_DOUBLE, all_stats, 7, MPI_DOUBLE, j.P, j.role.comm);
    if (j.role.is_chief && all_stats) report(&j, all_stats);
    free(all_stats);
    free(j.params);
    free(j.buf);
    j.ep.destroy(j.ep.impl);
    MPI_Comm_free(&j.workers_comm);
    dsgd_mpi_ps_role_free(&j.role);
    dsgd_shard_map_destroy(j.map);
    dsgd_model_destroy(j.m);
    dsgd_dataset_free(&j.train);
    dsgd_dataset_free(&j.test);
    dsgd_ctx_destroy(j.ctx);
    MPI_Finalize();
    return 0;
}
#endif
