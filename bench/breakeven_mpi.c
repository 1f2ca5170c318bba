/* bench/breakeven_mpi.c - does gradient compression pay on this link? A
   real check of experiments/breakeven.c's prediction.

   Two MPI processes (multi-worker mirrored, one replica each, CPU backend,
   one thread) train the 784-512-512-10 MLP on random data, 64 samples a
   replica, the gradient in one bucket, the library's ring over MPI
   messages, once per method: fp32 (no hook), fp16, PowerSGD rank 2 and
   top-k 1% (dsgd_compress_hook, error feedback). Rounds interleave the
   methods (each round: --steps timed steps of every method in turn, after a
   barrier; the slowest process's time); the median per method over
   --rounds rounds, and its ratio to fp32's, are reported.

   Measured besides: the link, by a ping-pong (one direction) and by an
   exchange (both processes send at once, as the ring's sendrecv does) of
   8 bytes (alpha: half the round trip) and of the gradient's 4 x 669,706
   bytes (bandwidth: bytes over the time less alpha); the compute of a
   step (fp32's step less its exchange, dsgd_step_info); each method's
   codec seconds per step (compress_s of dsgd_strategy_comm_stats); a
   float's reduction (adding two gradient-sized arrays). Then, after
   MPI_Finalize, rank 0 feeds these to experiments/breakeven.h (the same
   code as the experiment) with the measured codec seconds, prints simnet's
   break-even bandwidth and step ratio at the exchange's bandwidth, and
   says on which side of the break-even the link lies and whether the real
   ratio agrees (compressed faster iff bandwidth < break-even); also for
   the rate the library's fp32 ring actually reached (its exchange_s),
   which on a loopback is well below the raw link's.
     RESULT breakeven_mpi label=... method=... ms_per_step=... ratio=... codec_ms=... breakeven_gbit=... predicted_ratio=... agree=yes|no

   Build and run (make bench-breakeven-mpi runs bench/breakeven_mpi.sh: this
   at np 2 over TCP, then again with the loopback throttled by tc):
     mpicc -std=c99 -O3 -march=native -I. bench/breakeven_mpi.c -o build/mpi/breakeven_mpi -lm -lpthread
     mpirun --allow-run-as-root -np 2 --mca btl tcp,self build/mpi/breakeven_mpi
   Options: [--batch B] [--steps S] [--rounds R] [--warmup W]
   [--methods fp32,fp16,powersgd2,topk1%] [--label TEXT]. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("breakeven_mpi: built without MPI (mpi.h not found); `make bench-breakeven-mpi` builds it with mpicc and "
         "runs it");
    return 0;
}
#else
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_MPI_IMPLEMENTATION
#include "../distsgd_mpi.h"

#include <stdlib.h>
#include <string.h>

#include "../experiments/breakeven.h"
#include "bench_util.h"

enum { MAX_ROUNDS = 64, MAX_REPS = 64 };

typedef struct options {
    int batch, steps, rounds, warmup;
    int use[BE_METHODS];
    const char *label;
} options;

static void die(dsgd_ctx *ctx, int rank, const char *what) {
    fprintf(stderr, "breakeven_mpi rank %d: %s: %s\n", rank, what, ctx ? dsgd_ctx_last_error(ctx) : "");
    dsgd_mpi_abort(1);
}

static int parse(int argc, char **argv, options *o) {
    int a, m;
    memset(o, 0, sizeof(*o));
    o->batch = 64;
    o->steps = 4;
    o->rounds = 5;
    o->warmup = 2;
    o->label = "loopback";
    o->use[0] = o->use[be_method_index("fp16")] = o->use[be_method_index("powersgd2")] =
        o->use[be_method_index("topk1%")] = 1;
    for (a = 1; a < argc; ++a) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(argv[a], "--batch") && v) o->batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--steps") && v) o->steps = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--rounds") && v) o->rounds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--warmup") && v) o->warmup = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--label") && v) o->label = argv[++a];
        else if (!strcmp(argv[a], "--methods") && v) {
            char buf[256], *tok, *save = NULL;
            snprintf(buf, sizeof(buf), "%s", argv[++a]);
            memset(o->use, 0, sizeof(o->use));
            o->use[0] = 1; /* the baseline always */
            for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if ((m = be_method_index(tok)) < 0) return 0;
                o->use[m] = 1;
            }
        } else
            return 0;
    }
    return o->batch >= 1 && o->steps >= 1 && o->rounds >= 1 && o->rounds <= MAX_ROUNDS && o->warmup >= 0;
}

/* Half the median round trip of `bytes` between ranks 0 and 1: a ping-pong
   (both = 0) or both sending at once (both = 1). Ranks above 1 idle. */
static double link_time(int rank, size_t bytes, int both, int reps) {
    char *buf = (char *)calloc(bytes, 1), *in = (char *)calloc(bytes, 1);
    double t[MAX_REPS];
    int i;
    if (!buf || !in) die(NULL, rank, "out of memory");
    for (i = -2; i < reps; ++i) { /* two warm-ups */
        double t0;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        if (rank <= 1) {
            int peer = 1 - rank;
            if (both) {
                MPI_Sendrecv(buf, (int)bytes, MPI_BYTE, peer, 7, in, (int)bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
                MPI_Sendrecv(buf, (int)bytes, MPI_BYTE, peer, 8, in, (int)bytes, MPI_BYTE, peer, 8, MPI_COMM_WORLD,
                             MPI_STATUS_IGNORE);
            } else if (rank == 0) {
                MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 7, MPI_COMM_WORLD);
                MPI_Recv(in, (int)bytes, MPI_BYTE, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(in, (int)bytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 8, MPI_COMM_WORLD);
            }
        }
        if (i >= 0) t[i] = 0.5 * (MPI_Wtime() - t0);
    }
    free(buf);
    free(in);
    {
        double med = bench_median(t, reps), out;
        MPI_Allreduce(&med, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return out;
    }
}

/* Seconds per float of out += in over n floats (median of 7). */
static double reduce_time(size_t n) {
    float *a = (float *)calloc(n, sizeof(float)), *b = (float *)calloc(n, sizeof(float));
    double t[7];
    size_t i;
    int r;
    if (!a || !b) return 0;
    for (r = 0; r < 7; ++r) {
        double t0 = dsgd_now();
        for (i = 0; i < n; ++i) a[i] += b[i] + (float)r;
        t[r] = (dsgd_now() - t0) / (double)n;
    }
    t[0] += 0 * a[n / 2];
    free(a);
    free(b);
    return bench_median(t, 7);
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx = NULL;
    dsgd_transport_i ep;
    options o;
    int rank = 0, np = 1, round, m, step, i, k;
    static double ms[BE_METHODS][MAX_ROUNDS], comp[MAX_ROUNDS * 16], exch[MAX_ROUNDS * 16];
    double med[BE_METHODS], codec[BE_METHODS], alpha, alpha2, t_pp, t_ex, bw_pp, bw_ex, bw_lib, gamma, compute;
    int ncomp = 0;
    dsgd_strategy *st[BE_METHODS];
    dsgd_compress_desc cd[BE_METHODS];
    dsgd_comm_hook hook[BE_METHODS];
    float *x, *y;
    size_t nparams = 0;
    uint64_t rng = 12345;
    char cpu[256];
    memset(st, 0, sizeof(st));
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) die(ctx, 0, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (!parse(argc, argv, &o) || np < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: mpirun -np 2 %s [--batch B] [--steps S] [--rounds R<=%d] [--warmup W] "
                            "[--methods fp32,fp16,powersgd2,topk1%%,...] [--label TEXT]\n", argv[0], MAX_ROUNDS);
        MPI_Finalize();
        return 2;
    }
    if (dsgd_mpi_transport_create(ctx, NULL, &ep) != DSGD_OK) die(ctx, rank, "dsgd_mpi_transport_create");
    x = (float *)malloc(sizeof(float) * BE_IN * (size_t)o.batch * (size_t)np);
    y = (float *)malloc(sizeof(float) * (size_t)o.batch * (size_t)np);
    if (!x || !y) die(NULL, rank, "out of memory");
    for (i = 0; i < BE_IN * o.batch * np; ++i) x[i] = (float)dsgd_rng_uniform(&rng);
    for (i = 0; i < o.batch * np; ++i) y[i] = (float)(int)(10.0 * dsgd_rng_uniform(&rng));
    /* the strategies, one per method, each warmed up */
    for (m = 0; m < BE_METHODS; ++m) {
        dsgd_strategy_desc d;
        if (!o.use[m]) continue;
        memset(&d, 0, sizeof(d));
        cd[m] = be_compress_desc(&BE_METHOD[m]);
        hook[m] = dsgd_compress_hook(&cd[m]);
        d.kind = DSGD_STRATEGY_MULTI_WORKER_MIRRORED;
        d.num_replicas = 1;
        d.endpoints = &ep;
        d.algorithm = DSGD_ALLREDUCE_RING;
        d.comm_hook = BE_METHOD[m].hook ? &hook[m] : NULL;
        d.cpu_threads = 1;
        d.timeout_s = 120.0;
        d.optimizer.kind = DSGD_OPT_MOMENTUM;
        d.optimizer.lr = 0.01f;
        d.optimizer.momentum = 0.9f;
        d.model.input_dim = BE_IN;
        d.model.layers = BE_LAYERS;
        d.model.num_layers = 3;
        d.model.max_batch = o.batch;
        d.model.seed = 11;
        if (dsgd_strategy_create(ctx, &d, &st[m]) != DSGD_OK) die(ctx, rank, "dsgd_strategy_create");
        nparams = dsgd_model_num_params(dsgd_strategy_model(st[m], 0));
        for (step = 0; step < o.warmup; ++step)
            if (dsgd_strategy_train_step(st[m], x, y, o.batch * np, NULL) != DSGD_OK) die(ctx, rank, "warm-up step");
    }
    /* the link: 8 bytes and the gradient's bytes, one way and both at once */
    alpha = link_time(rank, 8, 0, 21);
    t_pp = link_time(rank, 4 * nparams, 0, 9);
    alpha2 = link_time(rank, 8, 1, 21);
    t_ex = link_time(rank, 4 * nparams, 1, 9);
    bw_pp = (double)(4 * nparams) / (t_pp - alpha);
    bw_ex = (double)(4 * nparams) / (t_ex - alpha2);
    /* interleaved rounds */
    memset(codec, 0, sizeof(codec));
    for (round = 0; round < o.rounds; ++round)
        for (m = 0; m < BE_METHODS; ++m) {
            dsgd_comm_stats c0, c1;
            double t, slowest;
            if (!o.use[m]) continue;
            dsgd_strategy_comm_stats(st[m], &c0);
            MPI_Barrier(MPI_COMM_WORLD);
            t = dsgd_now();
            for (step = 0; step < o.steps; ++step) {
                dsgd_step_info in;
                double t1 = dsgd_now();
                if (dsgd_strategy_train_step(st[m], x, y, o.batch * np, &in) != DSGD_OK) die(ctx, rank, "step");
                if (m == 0 && ncomp < MAX_ROUNDS * 16) {
                    exch[ncomp] = in.exchange_s;
                    comp[ncomp++] = dsgd_now() - t1 - in.exchange_s;
                }
            }
            t = dsgd_now() - t;
            MPI_Allreduce(&t, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            ms[m][round] = 1e3 * slowest / o.steps;
            dsgd_strategy_comm_stats(st[m], &c1);
            codec[m] += (c1.compress_s - c0.compress_s) / ((double)o.rounds * o.steps);
        }
    /* every rank's codec seconds, averaged; rank 0's compute */
    MPI_Allreduce(MPI_IN_PLACE, codec, BE_METHODS, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    for (m = 0; m < BE_METHODS; ++m) {
        codec[m] /= np;
        med[m] = o.use[m] ? bench_median(ms[m], o.rounds) : 0;
        dsgd_strategy_destroy(st[m]);
    }
    compute = bench_median(comp, ncomp);
    /* the rate the library's fp32 ring achieved: 2 (N - 1) / N of the gradient's bytes each way */
    bw_lib = 2.0 * (np - 1) / np * 4.0 * (double)nparams / bench_median(exch, ncomp);
    if (ep.destroy) ep.destroy(ep.impl);
    MPI_Finalize();
    free(x);
    free(y);
    if (rank != 0) {
        dsgd_ctx_destroy(ctx);
        return 0;
    }
    gamma = reduce_time(nparams);
    bench_cpu_model(cpu, sizeof(cpu));
    printf("breakeven_mpi [%s]: %d processes, MLP 784-512-512-10 (%zu parameters), batch %d, ring over MPI, "
           "one bucket; %s; medians of %d interleaved rounds of %d steps\n",
           o.label, np, nparams, o.batch, cpu, o.rounds, o.steps);
    printf("link: alpha %.1f us (ping-pong) / %.1f us (both ways); %zu bytes: %.1f MB/s one way, %.1f MB/s each way "
           "when both send (%.3g / %.3g Gbit/s)\n",
           1e6 * alpha, 1e6 * alpha2, 4 * nparams, 1e-6 * bw_pp, 1e-6 * bw_ex, 8e-9 * bw_pp, 8e-9 * bw_ex);
    printf("compute %.2f ms a step (fp32 step less its exchange); reduction %.3g ns a float; the fp32 ring's "
           "exchange ran at %.1f MB/s each way (%.3g Gbit/s)\n",
           1e3 * compute, 1e9 * gamma, 1e-6 * bw_lib, 8e-9 * bw_lib);
    {
        be_desc d;
        double fp32_pred;
        memset(&d, 0, sizeof(d));
        d.workers = np;
        d.alpha_s = alpha2;
        d.compute_s = compute;
        d.gamma_s_per_float = gamma;
        for (m = 0; m < BE_METHODS; ++m) d.codec_step_s[m] = o.use[m] ? codec[m] : -1;
        fp32_pred = be_step_time(&d, 0, bw_ex);
        printf("%-10s %10s %8s %10s %16s %10s %10s %s\n", "method", "ms/step", "ratio", "codec ms", "break-even",
               "sim ms", "sim ratio", "faster? real / predicted at the link's rate, at the ring's");
        printf("%-10s %10.2f %8.3f %10s %16s %10.2f %10s\n", "fp32", med[0], 1.0, "-", "-", 1e3 * fp32_pred, "1.000");
        for (m = 1; m < BE_METHODS; ++m) {
            be_result r;
            char buf[64];
            double pred;
            int real_faster, pred_faster, lib_faster;
            if (!o.use[m]) continue;
            if (be_breakeven(&d, m, &r) != 0) return 1;
            pred = be_step_time(&d, m, bw_ex);
            real_faster = med[m] < med[0];
            pred_faster = bw_ex < 1.0 / r.beta || isinf(r.beta);
            lib_faster = bw_lib < 1.0 / r.beta || isinf(r.beta);
            if (r.beta == 0) pred_faster = lib_faster = 0;
            printf("%-10s %10.2f %8.3f %10.3f %16s %10.2f %10.3f %s / %s (%s), %s (%s)\n", BE_METHOD[m].name, med[m],
                   med[m] / med[0], 1e3 * codec[m], be_format(r.beta, buf, sizeof(buf)), 1e3 * pred, pred / fp32_pred,
                   real_faster ? "yes" : "no", pred_faster ? "yes" : "no",
                   real_faster == pred_faster ? "agree" : "DISAGREE", lib_faster ? "yes" : "no",
                   real_faster == lib_faster ? "agree" : "DISAGREE");
            k = real_faster == pred_faster;
            printf("RESULT breakeven_mpi label=%s method=%s ms_per_step=%.3f ratio=%.3f codec_ms=%.3f "
                   "breakeven_gbit=%.4g link_gbit=%.4g ring_gbit=%.4g predicted_ratio=%.3f agree=%s agree_ring=%s\n",
                   o.label, BE_METHOD[m].name, med[m], med[m] / med[0], 1e3 * codec[m],
                   r.beta == 0 ? 0.0 : isinf(r.beta) ? -1.0 : 8e-9 / r.beta, 8e-9 * bw_ex, 8e-9 * bw_lib, pred / fp32_pred,
                   k ? "yes" : "no", real_faster == lib_faster ? "yes" : "no");
            fflush(stdout);
        }
    }
    dsgd_ctx_destroy(ctx);
    return 0;
}
#endif
