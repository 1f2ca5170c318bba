/* mpi_strategy_ps.c - the parameter-server strategy (strategy_ps.h) across
   MPI processes: one program, unchanged, over its own loopback and under
   mpirun -np 4.

   Not a cmocka test: it is built with mpicc and run by
   tests/mpi_collectives.sh (make test-mpi) at np = 4. train() is the
   program: it creates a DSGD_STRATEGY_PARAMETER_SERVER strategy (2
   servers, SYNC, momentum) over the endpoints it is given, runs STEPS
   train steps on the same global batches on every process, and reads its
   replicas' weights. Under MPI each process gives it its one endpoint of
   a transport over the rank layout's communicator (the first 2 processes
   serve: their strategy holds no replica, refuses to train, and its
   destroy waits for the workers); each worker process then runs train()
   again with no endpoints (2 replicas and 2 servers on a loopback of the
   strategy's own) and checks that its replica's weights are bit for bit
   those of the same replica there, and that they moved. Then again, with
   every process saving at step STEPS / 2 (servers too: each rank writes
   its file, worker 0's process the strategy's) and a new strategy over a
   new transport restoring it and training on: the same bits. Process 0 prints
   "N passed, N failed" after an MPI_Allreduce of the counts. A watchdog
   (alarm) ends a process that hangs. */
#define _POSIX_C_SOURCE 200809L
#include "../distsgd_mpi.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { SERVERS = 2, WORKERS = 2, IN = 12, OUT = 4, B = 8, STEPS = 10, NPARAMS = IN * 16 + 16 + 16 * OUT + OUT };

static const dsgd_layer_desc LAYERS[2] = {{16, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static void on_alarm(int sig) {
    static const char msg[] = "mpi_strategy_ps: watchdog expired, a call hung\n";
    (void)sig;
    if (write(2, msg, sizeof(msg) - 1) < 0) _exit(3);
    _exit(3);
}

/* The global batches, the same on every process. */
static void make_batches(float *xs, float *ys) {
    uint64_t s = 1234;
    int i;
    for (i = 0; i < STEPS * WORKERS * B * IN; ++i) xs[i] = (float)(dsgd_rng_uniform(&s) * 2.0 - 1.0);
    for (i = 0; i < STEPS * WORKERS * B; ++i) ys[i] = (float)(dsgd_rng_next(&s) % OUT);
}

/* The program: the strategy over eps (count endpoints of this process; NULL:
   count replicas on its own transport), restored from `restore` if given,
   steps [from, to), then saved to `save` if given; each replica's weights
   into out. Returns the replicas, or -1 after printing the error. */
static int train(dsgd_ctx *ctx, const dsgd_transport_i *eps, int count, const float *xs, const float *ys, int from,
                 int to, const char *restore, const char *save, float (*out)[NPARAMS], int *refused) {
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    dsgd_result r;
    int step, n = -1, i;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_STRATEGY_PARAMETER_SERVER;
    d.num_replicas = count;
    d.endpoints = eps;
    d.model.input_dim = IN;
    d.model.layers = LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = B;
    d.model.seed = 77;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.05f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 60.0;
    d.ps.num_servers = SERVERS;
    d.ps.policy = DSGD_PS_SYNC;
    r = dsgd_strategy_create(ctx, &d, &s);
    if (r == DSGD_OK && restore) r = dsgd_strategy_restore(s, restore, NULL); /* every process, servers too */
    if (r == DSGD_OK) {
        n = dsgd_strategy_num_replicas(s);
        for (step = from; step < to && r == DSGD_OK; ++step) {
            r = dsgd_strategy_train_step(s, xs + (size_t)step * WORKERS * B * IN, ys + (size_t)step * WORKERS * B,
                                         WORKERS * B, NULL);
            if (n == 0) { /* only servers here */
                *refused = r;
                r = DSGD_OK;
            }
        }
        if (r == DSGD_OK && save) r = dsgd_strategy_save(s, save, NULL);
        for (i = 0; i < n && r == DSGD_OK; ++i) r = dsgd_model_get_params(dsgd_strategy_model(s, i), out[i], NPARAMS);
    }
    if (r != DSGD_OK) {
        printf("mpi_strategy_ps: %s\n", dsgd_ctx_last_error(ctx));
        n = -1;
    }
    dsgd_strategy_destroy(s); /* the servers' processes wait here for the workers */
    return n;
}

int main(int argc, char **argv) {
    static float xs[STEPS * WORKERS * B * IN], ys[STEPS * WORKERS * B], got[1][NPARAMS], want[WORKERS][NPARAMS],
        init[NPARAMS];
    long counts[2] = {0, 0}, all[2];
    dsgd_ctx *ctx = NULL;
    dsgd_mpi_ps_role role;
    dsgd_mpi_desc md;
    dsgd_transport_i ep;
    char dir[64] = "/tmp/dsgd_mpi_ps_XXXXXX", path[96], file[128];
    int provided = 0, rank = 0, size = 0, n, n2, refused = DSGD_OK, run, i;
    (void)argc;
    (void)argv;
    signal(SIGALRM, on_alarm);
    alarm(240);
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != SERVERS + WORKERS || provided < MPI_THREAD_MULTIPLE || dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        if (rank == 0) printf("mpi_strategy_ps: needs np = %d and MPI_THREAD_MULTIPLE\n0 passed, 1 failed\n", SERVERS + WORKERS);
        MPI_Finalize();
        return 1;
    }
    make_batches(xs, ys);
    if (dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, SERVERS, &role) != DSGD_OK) dsgd_mpi_abort(1);
    memset(&md, 0, sizeof(md));
    md.comm = role.comm;
    if (rank == 0 && !mkdtemp(dir)) dsgd_mpi_abort(1);
    MPI_Bcast(dir, (int)sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(path, sizeof path, "%s/ps.ckpt", dir);
    /* run 0: the whole run; run 1: saved at STEPS / 2 by every process,
       then a new strategy over a new transport restores it and goes on */
    for (run = 0; run < 2; ++run) {
        if (dsgd_mpi_transport_create(ctx, &md, &ep) != DSGD_OK) dsgd_mpi_abort(1);
        n = train(ctx, &ep, 1, xs, ys, 0, run ? STEPS / 2 : STEPS, NULL, run ? path : NULL, got, &refused);
        ep.destroy(ep.impl);
        n2 = n;
        if (run) {
            if (dsgd_mpi_transport_create(ctx, &md, &ep) != DSGD_OK) dsgd_mpi_abort(1);
            n2 = train(ctx, &ep, 1, xs, ys, STEPS / 2, STEPS, path, NULL, got, &refused);
            ep.destroy(ep.impl);
        }
        if (role.is_server) {
            int ok = n == 0 && n2 == 0 && refused == DSGD_ERR_STATE;
            counts[ok ? 0 : 1]++;
            if (!ok)
                printf("process %d: FAIL server %d: %d replicas, train step %s\n", rank, role.index, n,
                       dsgd_result_string((dsgd_result)refused));
        } else {
            dsgd_model_desc mdesc;
            dsgd_model *m = NULL;
            int ok = n == 1 && n2 == 1 && train(ctx, NULL, WORKERS, xs, ys, 0, STEPS, NULL, NULL, want, &refused) == WORKERS;
            memset(&mdesc, 0, sizeof(mdesc));
            mdesc.input_dim = IN;
            mdesc.layers = LAYERS;
            mdesc.num_layers = 2;
            mdesc.seed = 77;
            ok = ok && dsgd_model_create(ctx, &mdesc, &m) == DSGD_OK && dsgd_model_get_params(m, init, NPARAMS) == DSGD_OK;
            dsgd_model_destroy(m);
            ok = ok && memcmp(got[0], want[role.index], sizeof(got[0])) == 0 && memcmp(got[0], init, sizeof(init)) != 0;
            counts[ok ? 0 : 1]++;
            printf("  worker %d (process %d): SYNC over MPI%s %s its own loopback's replica %d, bit for bit\n",
                   role.index, rank, run ? ", saved at the middle and restored by a new run," : "",
                   ok ? "equals" : "DIFFERS FROM", role.index);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) { /* the strategy's file and each rank's */
        static const char *const names[5] = {"", ".ps-server-0", ".ps-server-1", ".ps-worker-0", ".ps-worker-1"};
        for (i = 0; i < 5; ++i) {
            snprintf(file, sizeof file, "%s%s", path, names[i]);
            if (remove(file) != 0) {
                printf("process 0: FAIL %s was not written\n", file);
                counts[1]++;
            }
        }
        rmdir(dir);
    }
    dsgd_mpi_ps_role_free(&role);
    MPI_Allreduce(counts, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%ld passed, %ld failed\n", all[0], all[1]);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return all[1] ? 1 : 0;
}
