/* bench/overlap_mpi.c - a training step of multi-worker mirrored over MPI
   with the gradient exchange after backward and beside it
   (dsgd_strategy_desc.overlap), in one run.

   Every MPI process is a worker with one replica (CPU backend, --threads
   T, default 1) of the CNN of examples/cnn_fashion_mnist.c (conv 16, pool,
   conv 32, pool, dense 128, dense 10; 207k parameters) or, with --mlp, the
   demo's MLP (784-256-128-10), on random data. The gradient is all-reduced
   in buckets of --bucket BYTES (default 256 KiB) with --algo ring (the
   default: the library's ring over MPI messages) or auto (the native
   MPI_Allreduce hook). Each round makes one strategy without overlap and one
   with it, in turn (off first in even rounds, on first in odd ones), trains
   --warmup steps, then times --steps steps after a barrier (the slowest
   process's time); the median over --rounds rounds is reported. The two strategies train the same bits (the tests check
   that; here the last weights are compared too, and a difference fails
   the run).

   Printed per mode: ms per step, the exchange's seconds per step
   (dsgd_step_info.exchange_s) and the part the step waited for after
   backward (exposed_s), averaged over the timed steps of every round on
   rank 0; hidden = 1 - exposed / exchange; the CPU time every process
   used per step, summed over the processes (cpu_ms: with overlap this
   shows where the CPU goes, as the ranks' polling and TCP's copies
   count); the largest fraction of the step that the others waited for
   one rank in the step's collectives (straggler: the mean over the
   rounds of dsgd_strategy_wait_report's worst_fraction); and the time
   with overlap over the time without. --label TEXT names the link
   (bench/overlap_mpi.sh passes the tc settings).
     RESULT overlap_mpi label=... n=4 model=cnn mode=on ms_per_step=... exchange_ms=... exposed_ms=... hidden=... cpu_ms=... straggler=... vs_off=...

   Build and run (make bench-overlap-mpi: np 4, TCP between the ranks):
     mpicc -std=c99 -O3 -march=native -I. bench/overlap_mpi.c -o build/mpi/overlap_mpi -lm -lpthread
     mpirun --allow-run-as-root --oversubscribe -np 4 --mca btl tcp,self build/mpi/overlap_mpi
   Options: [--mlp] [--batch B] (per replica, default 32) [--bucket BYTES]
   [--algo ring|auto] [--threads T] [--steps S] [--rounds R] [--warmup W]
   [--label TEXT]. bench/overlap_mpi.sh runs it at np 4 and 2 over the
   loopback throttled by tc, as a link between machines. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("overlap_mpi: built without MPI (mpi.h not found); `make bench-overlap-mpi` builds it with mpicc and runs it");
    return 0;
}
#else
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_MPI_IMPLEMENTATION
#include "../distsgd_mpi.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_models.h"
#include "bench_util.h"

enum { MAX_ROUNDS = 64 };

typedef struct options {
    int mlp, batch, threads, steps, rounds, warmup;
    size_t bucket;
    dsgd_allreduce_algo algo;
    const char *label;
} options;

/* This process's CPU seconds so far (every thread's). */
static double cpu_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0) return 0.0;
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(dsgd_ctx *ctx, int rank, const char *what) {
    fprintf(stderr, "overlap_mpi rank %d: %s: %s\n", rank, what, ctx ? dsgd_ctx_last_error(ctx) : "");
    dsgd_mpi_abort(1);
}

static int parse(int argc, char **argv, options *o) {
    int a;
    memset(o, 0, sizeof(*o));
    o->batch = 32;
    o->threads = 1;
    o->steps = 10;
    o->rounds = 5;
    o->warmup = 2;
    o->bucket = (size_t)256 * 1024;
    o->algo = DSGD_ALLREDUCE_RING;
    o->label = "loopback";
    for (a = 1; a < argc; ++a) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(argv[a], "--mlp")) o->mlp = 1;
        else if (!strcmp(argv[a], "--batch") && v) o->batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--threads") && v) o->threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--steps") && v) o->steps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--rounds") && v) o->rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--warmup") && v) o->warmup = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--label") && v) o->label = argv[++a];
        else if (!strcmp(argv[a], "--bucket") && v) o->bucket = (size_t)strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--algo") && v && (!strcmp(v, "ring") || !strcmp(v, "auto"))) {
            o->algo = !strcmp(v, "ring") ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_AUTO;
            ++a;
        } else
            return 0;
    }
    return o->batch >= 1 && o->threads >= 1 && o->steps >= 1 && o->rounds >= 1 && o->rounds <= MAX_ROUNDS &&
           o->warmup >= 0;
}

static dsgd_strategy_desc desc_of(const options *o, const dsgd_transport_i *ep, int overlap) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_STRATEGY_MULTI_WORKER_MIRRORED;
    d.num_replicas = 1;
    d.endpoints = ep;
    d.algorithm = o->algo;
    d.bucket_bytes = o->bucket;
    d.overlap = overlap;
    d.cpu_threads = o->threads;
    d.timeout_s = 60.0;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.01f;
    d.optimizer.momentum = 0.9f;
    d.model.max_batch = o->batch;
    d.model.seed = 11;
    if (o->mlp) {
        d.model.input_dim = MLP_IN;
        d.model.layers = g_mlp;
        d.model.num_layers = 3;
    } else {
        d.model.image_layers = g_image;
        d.model.num_image_layers = 4;
        d.model.input_shape[0] = g_shape[0];
        d.model.input_shape[1] = g_shape[1];
        d.model.input_shape[2] = g_shape[2];
        d.model.layers = g_cnn_dense;
        d.model.num_layers = 2;
    }
    return d;
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx = NULL;
    dsgd_transport_i ep;
    options o;
    int rank = 0, np = 1, round, mode, k, step, i;
    double ms[2][MAX_ROUNDS], exch[2] = {0, 0}, expo[2] = {0, 0}, cpu[2] = {0, 0}, waited[2] = {0, 0}, med[2];
    dsgd_wait_report wr;
    char cpu_model[128];
    float *x, *y, *w[2] = {NULL, NULL};
    size_t nparams = 0;
    uint64_t rng = 12345;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) die(ctx, 0, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (!parse(argc, argv, &o)) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np P %s [--mlp] [--batch B] [--bucket BYTES] [--algo ring|auto] "
                            "[--threads T] [--steps S] [--rounds R<=%d] [--warmup W] [--label TEXT]\n",
                    argv[0], MAX_ROUNDS);
        MPI_Finalize();
        return 2;
    }
    if (dsgd_mpi_transport_create(ctx, NULL, &ep) != DSGD_OK) die(ctx, rank, "dsgd_mpi_transport_create");
    x = (float *)malloc(sizeof(float) * (size_t)MLP_IN * (size_t)o.batch * (size_t)np);
    y = (float *)malloc(sizeof(float) * (size_t)o.batch * (size_t)np);
    if (!x || !y) die(NULL, rank, "out of memory");
    for (i = 0; i < MLP_IN * o.batch * np; ++i) x[i] = (float)dsgd_rng_uniform(&rng);
    for (i = 0; i < o.batch * np; ++i) y[i] = (float)(int)(10.0 * dsgd_rng_uniform(&rng));
    for (round = 0; round < o.rounds; ++round) {
        for (k = 0; k < 2; ++k) {
            /* off then on in even rounds, on then off in odd ones, so
               that neither always follows the other */
            int mode = round % 2 ? 1 - k : k;
            dsgd_strategy_desc d = desc_of(&o, &ep, mode);
            dsgd_strategy *s = NULL;
            double t, c, slowest, used;
            if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK) die(ctx, rank, "dsgd_strategy_create");
            for (step = 0; step < o.warmup; ++step)
                if (dsgd_strategy_train_step(s, x, y, o.batch * np, NULL) != DSGD_OK) die(ctx, rank, "warm-up step");
            /* starts the straggler report's window (a collective) */
            if (dsgd_strategy_wait_report(s, &wr, NULL, 0) != DSGD_OK) die(ctx, rank, "wait report");
            MPI_Barrier(MPI_COMM_WORLD);
            t = dsgd_now();
            c = cpu_now();
            for (step = 0; step < o.steps; ++step) {
                dsgd_step_info in;
                if (dsgd_strategy_train_step(s, x, y, o.batch * np, &in) != DSGD_OK) die(ctx, rank, "step");
                exch[mode] += in.exchange_s;
                expo[mode] += in.exposed_s;
            }
            t = dsgd_now() - t;
            c = cpu_now() - c;
            MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            MPI_Allreduce(&c, &used, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
            cpu[mode] += used;
            if (dsgd_strategy_wait_report(s, &wr, NULL, 0) != DSGD_OK) die(ctx, rank, "wait report");
            waited[mode] += wr.worst >= 0 ? wr.worst_fraction : 0.0;
            ms[mode][round] = 1e3 * slowest / o.steps;
            if (round == o.rounds - 1) {
                dsgd_model *m = dsgd_strategy_model(s, 0);
                nparams = dsgd_model_num_params(m);
                w[mode] = (float *)malloc(sizeof(float) * nparams);
                if (!w[mode] || dsgd_model_get_params(m, w[mode], nparams) != DSGD_OK) die(ctx, rank, "weights");
            }
            dsgd_strategy_destroy(s);
        }
    }
    if (memcmp(w[0], w[1], sizeof(float) * nparams) != 0) die(NULL, rank, "overlap on and off trained different bits");
    if (rank == 0) {
        double n = (double)o.rounds * o.steps;
        med[0] = bench_median(ms[0], o.rounds);
        med[1] = bench_median(ms[1], o.rounds);
        bench_cpu_model(cpu_model, sizeof cpu_model);
        printf("overlap_mpi: %s; cpu: %s, %d online, CPU backend kernels: %s\n", o.label, cpu_model,
               (int)sysconf(_SC_NPROCESSORS_ONLN), dsgd_cpu_isa());
        printf("overlap_mpi: %d processes, %s (%zu parameters), batch %d per replica, buckets of %zu bytes, %s, "
               "%d thread(s) each; medians of %d rounds of %d steps; the same bits with and without overlap\n",
               np, o.mlp ? "mlp 784-256-128-10" : "cnn", nparams, o.batch, o.bucket,
               dsgd_allreduce_algo_name(o.algo), o.threads, o.rounds, o.steps);
        for (mode = 0; mode < 2; ++mode)
            printf("RESULT overlap_mpi label=%s n=%d model=%s mode=%s ms_per_step=%.3f exchange_ms=%.3f "
                   "exposed_ms=%.3f hidden=%.2f cpu_ms=%.2f straggler=%.2f vs_off=%.3f\n",
                   o.label, np, o.mlp ? "mlp" : "cnn", mode ? "on" : "off", med[mode], 1e3 * exch[mode] / n,
                   1e3 * expo[mode] / n, exch[mode] > 0 ? 1.0 - expo[mode] / exch[mode] : 0.0,
                   1e3 * cpu[mode] / n, waited[mode] / o.rounds, med[mode] / med[0]);
    }
    free(w[0]);
    free(w[1]);
    free(x);
    free(y);
    if (ep.destroy) ep.destroy(ep.impl);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
#endif
