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

   Servers serve until every worker has finished. Each worker draws its own
   shard of each epoch as dsgd_cluster_set_dataset does: the same sampler
   seed everywhere, batches of --batch, worker w takes batches w, w + W,
   w + 2W, ... (floor(batches / W) each); per batch it pulls, computes the
   gradient of the mean loss, pushes. --policy async (the default) applies
   every push on arrival; sync averages one gradient per worker per step;
   ssp bounds the lead by --staleness s (default 2); backup takes the first
   W - b gradients of each step (--backups b, default 1) and the workers
   stop on the servers' version, as TF's do on the global step. The learning
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

#include <stdlib.h>
#include <string.h>

static const dsgd_layer_desc LAYERS[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                          {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                          {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

/* Ends the job with the message: a peer may be waiting for this process. */
static void die(dsgd_ctx *ctx, const char *who, int index, const char *what) {
    fprintf(stderr, "ps_mpi: %s %d: %s: %s\n", who, index, what, ctx ? dsgd_ctx_last_error(ctx) : "");
    dsgd_mpi_abort(1);
}

static int load(dsgd_ctx *ctx, const char *dir, const char *prefix, dsgd_dataset *ds) {
    char img[1024], lab[1024];
    snprintf(img, sizeof(img), "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(lab, sizeof(lab), "%s/%s-labels-idx1-ubyte", dir, prefix);
    return dsgd_dataset_load_idx(ctx, img, lab, 10, ds) == DSGD_OK;
}

static dsgd_model_desc model_desc(int input_dim, int max_batch, uint64_t seed) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof(md));
    md.input_dim = input_dim;
    md.layers = LAYERS;
    md.num_layers = 3;
    md.max_batch = max_batch;
    md.seed = seed;
    return md;
}

/* The smallest version among the servers this worker last read. */
static int64_t min_version(const dsgd_ps_worker *pw, int servers) {
    int64_t v = dsgd_ps_worker_version(pw, 0);
    int s;
    for (s = 1; s < servers; ++s)
        if (dsgd_ps_worker_version(pw, s) < v) v = dsgd_ps_worker_version(pw, s);
    return v;
}

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist", *policy_name = "async";
    int batch = 64, epochs = 3, servers = 2, staleness = -1, backups = -1, a, proc = 0, nprocs = 1;
    float base_lr = 0.05f;
    uint64_t seed = 1;
    dsgd_ctx *ctx = NULL;
    dsgd_mpi_ps_role role;
    dsgd_mpi_desc mdsc;
    dsgd_transport_i ep;
    dsgd_ps_desc pd;
    dsgd_ps_policy policy = DSGD_PS_ASYNC;
    dsgd_dataset train, test;
    dsgd_model *m = NULL;
    dsgd_variable vars[8];
    dsgd_shard_map *map = NULL;
    MPI_Comm workers_comm = MPI_COMM_NULL;
    const char *who;
    float *params = NULL, *buf = NULL;
    size_t np, nb, per_epoch;
    int nv, i, update_batch, P, W;
    int64_t updates_per_epoch;
    double stats[7] = {0}, *all_stats = NULL, t_start = 0, t_train = 0;
    long long pushes_done = 0;

    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) die(ctx, "process", 0, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &proc);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--servers") && a + 1 < argc) servers = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--policy") && a + 1 < argc) policy_name = argv[++a];
        else if (!strcmp(argv[a], "--staleness") && a + 1 < argc) staleness = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--backups") && a + 1 < argc) backups = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc) batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--lr") && a + 1 < argc) base_lr = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else break;
    }
    if (!strcmp(policy_name, "async")) policy = DSGD_PS_ASYNC;
    else if (!strcmp(policy_name, "sync")) policy = DSGD_PS_SYNC;
    else if (!strcmp(policy_name, "ssp")) policy = DSGD_PS_SSP;
    else if (!strcmp(policy_name, "backup")) policy = DSGD_PS_BACKUP;
    else a = -1;
    if (a != argc || batch < 1 || epochs < 1) {
        if (proc == 0)
            fprintf(stderr, "usage: mpirun -np P+W %s [--servers P] [--policy async|sync|ssp|backup] [--staleness s] "
                            "[--backups b] [--data DIR] [--epochs E] [--batch B] [--lr BASE_LR] [--seed S]\n",
                    argv[0]);
        MPI_Finalize();
        return 2;
    }

    /* Who is what: every process gets the same verdict, so on an error all
       of them stop here, and nothing is pending: MPI_Finalize is safe. */
    if (dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, servers, &role) != DSGD_OK) {
        fprintf(stderr, "ps_mpi (process %d): %s\n", proc, dsgd_ctx_last_error(ctx));
        MPI_Finalize();
        return 1;
    }
    P = role.num_servers;
    W = role.num_workers;
    who = role.is_server ? "server" : "worker";
    if (staleness < 0) staleness = policy == DSGD_PS_SSP ? 2 : 0;
    if (backups < 0) backups = policy == DSGD_PS_BACKUP ? 1 : 0;
    if (backups >= W) backups = W - 1;

    /* Every process loads the data (servers need the input size only, but
       the same code keeps every process's model desc equal). */
    if (!load(ctx, dir, "train", &train) || !load(ctx, dir, "t10k", &test)) die(ctx, who, role.index, "loading Fashion-MNIST");
    nb = train.n / (size_t)batch;
    per_epoch = nb / (size_t)W; /* batches per worker per epoch */
    if (per_epoch < 1) die(NULL, who, role.index, "fewer batches than workers");
    update_batch = policy == DSGD_PS_ASYNC ? batch : policy == DSGD_PS_BACKUP ? (W - backups) * batch : W * batch;
    updates_per_epoch = policy == DSGD_PS_ASYNC ? (int64_t)(per_epoch * (size_t)W) : (int64_t)per_epoch *
                                                                                         (policy == DSGD_PS_BACKUP ? W : 1) /
                                                                                         (policy == DSGD_PS_BACKUP ? W - backups : 1);

    /* The model (the same initial weights on every process, from the seed),
       the shard map and the engine's desc. */
    {
        dsgd_model_desc md = model_desc((int)train.dim, batch > 1000 ? batch : 1000, seed);
        if (dsgd_model_create(ctx, &md, &m) != DSGD_OK) die(ctx, who, role.index, "dsgd_model_create");
    }
    np = dsgd_model_num_params(m);
    nv = dsgd_model_num_variables(m);
    params = (float *)malloc(sizeof(float) * np);
    buf = (float *)malloc(sizeof(float) * np);
    if (!params || !buf || nv > 8) die(NULL, who, role.index, "out of memory");
    for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(m, i);
    if (dsgd_model_get_params(m, params, np) != DSGD_OK) die(ctx, who, role.index, "dsgd_model_get_params");
    if (dsgd_shard_map_create(ctx, vars, nv, P, NULL, &map) != DSGD_OK) die(ctx, who, role.index, "shard map");
    memset(&pd, 0, sizeof(pd));
    pd.num_servers = P;
    pd.num_workers = W;
    pd.policy = policy;
    pd.staleness = policy == DSGD_PS_SSP ? staleness : 0;
    pd.backup_workers = policy == DSGD_PS_BACKUP ? backups : 0;
    pd.optimizer.kind = DSGD_OPT_MOMENTUM;
    pd.optimizer.nesterov = 1;
    pd.optimizer.lr = dsgd_linear_scaled_lr(base_lr, update_batch, 128);
    if (policy == DSGD_PS_SSP) pd.optimizer.lr /= (float)(staleness + 1); /* staleness-aware rate */
    pd.optimizer.schedule.kind = DSGD_SCHEDULE_COSINE;
    pd.optimizer.schedule.warmup_steps = updates_per_epoch / 2;
    pd.optimizer.schedule.total_steps = updates_per_epoch * epochs;
    pd.timeout_s = 120.0;

    /* The endpoint over the engine-ordered communicator; the workers' own
       communicator for the final barrier. */
    memset(&mdsc, 0, sizeof(mdsc));
    mdsc.comm = role.comm;
    if (dsgd_mpi_transport_create(ctx, &mdsc, &ep) != DSGD_OK) die(ctx, who, role.index, "dsgd_mpi_transport_create");
    MPI_Comm_split(role.comm, role.is_server ? 0 : 1, role.rank, &workers_comm);
    if (role.is_chief)
        printf("ps_mpi: %d servers + %d workers (%s), policy %s (s = %d, b = %d), Fashion-MNIST %zu training / %zu test images, "
               "batch %d per worker, %zu batches per worker per epoch, %d epochs, lr %.4g\n",
               P, W, role.from_tf_config ? "TF_CONFIG" : "rank layout", dsgd_ps_policy_name(policy), pd.staleness,
               pd.backup_workers,
               train.n, test.n, batch, per_epoch, epochs, (double)pd.optimizer.lr);
    fflush(stdout);
    MPI_Barrier(role.comm);
    t_start = dsgd_now();

    if (role.is_server) {
        dsgd_ps_server *s = NULL;
        dsgd_ps_server_stats st;
        if (dsgd_ps_server_create(ctx, &ep, &pd, map, params, &s) != DSGD_OK) die(ctx, who, role.index, "create");
        if (dsgd_ps_server_serve(s) != DSGD_OK) die(ctx, who, role.index, "serve");
        dsgd_ps_server_get_stats(s, &st);
        stats[0] = (double)st.version;
        stats[1] = (double)st.pushes_received;
        stats[2] = (double)st.pushes_applied;
        stats[3] = (double)st.duplicates;
        stats[4] = (double)st.stale_dropped;
        stats[5] = st.staleness_mean;
        stats[6] = (double)st.staleness_max;
        dsgd_ps_server_destroy(s);
    } else {
        dsgd_ps_worker *pw = NULL;
        dsgd_sampler smp;
        float *x = (float *)malloc(sizeof(float) * (size_t)batch * train.dim), *y = (float *)malloc(sizeof(float) * (size_t)batch);
        int64_t k, steps = (int64_t)per_epoch * epochs, target = updates_per_epoch * epochs;
        if (!x || !y) die(NULL, who, role.index, "out of memory");
        if (dsgd_sampler_init(ctx, &smp, train.n, (size_t)batch, seed, 1, 1) != DSGD_OK) die(ctx, who, role.index, "sampler");
        if (dsgd_ps_worker_create(ctx, &ep, &pd, map, &pw) != DSGD_OK) die(ctx, who, role.index, "create");
        /* BACKUP stops on the version (pull; stop at the target; else push),
           the others after the same number of pushes on every worker. */
        for (k = 0; policy == DSGD_PS_BACKUP || k < steps; ++k) {
            const size_t *idx = NULL;
            size_t n, e = (size_t)(k / (int64_t)per_epoch), b = (size_t)(k % (int64_t)per_epoch);
            if (dsgd_ps_worker_pull(pw, buf) != DSGD_OK) die(ctx, who, role.index, "pull");
            if (policy == DSGD_PS_BACKUP && min_version(pw, P) >= target) break;
            if (smp.epoch != (uint64_t)e) dsgd_sampler_set_epoch(&smp, (uint64_t)e);
            n = dsgd_sampler_batch(&smp, (size_t)role.index + b * (size_t)W, &idx);
            dsgd_dataset_gather(&train, idx, n, x, y);
            if (dsgd_model_set_params(m, buf, np) != DSGD_OK ||
                dsgd_model_compute_gradients(m, x, y, (int)n, 1.0f / (float)n) != DSGD_OK ||
                dsgd_model_get_grads(m, buf, np) != DSGD_OK)
                die(ctx, who, role.index, "gradient");
            if (dsgd_ps_worker_push(pw, buf) != DSGD_OK) die(ctx, who, role.index, "push");
            pushes_done++;
            if (role.is_chief && b + 1 == per_epoch) {
                printf("ps_mpi: chief: epoch %zu done, %.1f s\n", e + 1, dsgd_now() - t_start);
                fflush(stdout);
            }
        }
        /* The chief pulls once every worker's pushes are in. */
        if (!role.is_chief && dsgd_ps_worker_finish(pw) != DSGD_OK) die(ctx, who, role.index, "finish");
        MPI_Barrier(workers_comm);
        if (role.is_chief) {
            t_train = dsgd_now() - t_start;
            memcpy(buf, params, sizeof(float) * np); /* floats no shard holds (none here) keep their values */
            if (dsgd_ps_worker_pull(pw, buf) != DSGD_OK) die(ctx, who, role.index, "final pull");
            if (dsgd_ps_worker_finish(pw) != DSGD_OK) die(ctx, who, role.index, "finish");
        }
        stats[0] = (double)pushes_done;
        dsgd_ps_worker_destroy(pw);
        dsgd_sampler_free(&smp);
        free(x);
        free(y);
    }

    /* The servers' counters and the workers' pushes, to the chief (rank P). */
    if (role.is_chief) all_stats = (double *)malloc(sizeof(double) * 7 * (size_t)(P + W));
    MPI_Gather(stats, 7, MPI_DOUBLE, all_stats, 7, MPI_DOUBLE, P, role.comm);
    if (role.is_chief && all_stats) {
        dsgd_metrics mt;
        double pushes = 0;
        size_t off;
        if (dsgd_model_set_params(m, buf, np) != DSGD_OK) die(ctx, who, role.index, "set_params");
        for (off = 0; off < test.n; off += 1000) {
            size_t n = test.n - off < 1000 ? test.n - off : 1000;
            if (dsgd_model_eval_batch(m, test.x + off * test.dim, test.y + off, (int)n) != DSGD_OK) die(ctx, who, 0, "eval");
        }
        dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt);
        for (i = 0; i < P; ++i)
            printf("ps_mpi: server %d: version %.0f, pushes %.0f (applied %.0f, duplicates %.0f, stale dropped %.0f), "
                   "staleness mean %.2f max %.0f\n",
                   i, all_stats[7 * i], all_stats[7 * i + 1], all_stats[7 * i + 2], all_stats[7 * i + 3],
                   all_stats[7 * i + 4], all_stats[7 * i + 5], all_stats[7 * i + 6]);
        for (i = 0; i < W; ++i) pushes += all_stats[7 * (P + i)];
        printf("ps_mpi: %s, %d servers + %d workers: final test accuracy %.4f, %.0f pushes in %.1f s "
               "(%.0f samples/s)\n", dsgd_ps_policy_name(policy), P, W, mt.correct / mt.count, pushes, t_train,
               pushes * batch / t_train);
        fflush(stdout);
    }
    free(all_stats);
    free(params);
    free(buf);
    ep.destroy(ep.impl);
    MPI_Comm_free(&workers_comm);
    dsgd_mpi_ps_role_free(&role);
    dsgd_shard_map_destroy(map);
    dsgd_model_destroy(m);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
#endif
