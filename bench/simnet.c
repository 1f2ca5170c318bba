/* bench/simnet.c - how fast the simnet transport simulates, against the
   loopback in the same run.

   1. Events per second (messages plus compute charges) at 16, 64 and 256
      ranks, two workloads, each rank on a thread of its own:
        shift: each step, dsgd_simnet_compute (exponential) then a sendrecv of
               64 floats to rank r+1 from rank r-1 (two events per rank-step);
        ring:  each step, dsgd_simnet_compute then a ring all-reduce of 256
               floats (agreement included: every message counts).
      One simulated event is one hand-off between threads at most, so this
      is mostly the cost of waking a thread (a futex) on this machine.
   2. The wall time of one all-reduce step at 4 ranks, simulated (simnet)
      against real (loopback), same algorithm (ring) and buffer (64K floats),
      and each transport's AUTO choice (simnet: message passing; loopback:
      DIRECT over shared memory).
   Medians of repeated runs; the ratio is simnet / loopback.

   Usage: simnet [-q]   (-q: fewer repeats)
   Machine-readable lines:
     RESULT simnet_events workload=shift ranks=64 events_per_s=...
     RESULT simnet_step ranks=4 algo=ring simnet_ms=... loopback_ms=... ratio=... */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define MAX_N 256
#define REPS 5

typedef struct bench_run {
    int n, steps, workload; /* 0 shift, 1 ring, 2 one all-reduce per step (wall time) */
    dsgd_simnet *hub;
    dsgd_transport_i ep[MAX_N];
    dsgd_ctx *ctx[MAX_N];
    dsgd_allreduce_algo algo;
    size_t count;
    int failed;
} bench_run;

typedef struct rank_arg {
    bench_run *b;
    int rank;
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = (rank_arg *)p;
    bench_run *b = a->b;
    const dsgd_transport_i *t = &b->ep[a->rank];
    dsgd_comm *c = NULL;
    dsgd_result r = DSGD_OK;
    float *buf = (float *)calloc(b->count + 64, sizeof(float));
    float in[64];
    int s, failed = 0;
    memset(in, 0, sizeof(in));
    if (!buf || dsgd_comm_create(b->ctx[a->rank], t, NULL, &c) != DSGD_OK) r = DSGD_ERR_OUT_OF_MEMORY;
    for (s = 0; s < b->steps && r == DSGD_OK; ++s) {
        if (b->hub && b->workload != 2) r = dsgd_simnet_compute(b->hub, a->rank, s);
        if (r != DSGD_OK) break;
        if (b->workload == 0)
            r = t->sendrecv(t->impl, (a->rank + 1) % b->n, (uint64_t)s, buf, 64 * sizeof(float),
                            (a->rank + b->n - 1) % b->n, (uint64_t)s, in, sizeof(in),
                            (t->now ? t->now(t->impl) : dsgd_now()) + 1e6, &failed);
        else
            r = dsgd_allreduce(c, buf, b->count, DSGD_REDUCE_SUM, b->algo, 0);
    }
    if (r != DSGD_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", a->rank, dsgd_result_string(r), dsgd_ctx_last_error(b->ctx[a->rank]));
        __atomic_store_n(&b->failed, 1, __ATOMIC_SEQ_CST);
    }
    dsgd_comm_destroy(c);
    free(buf);
    if (b->hub) dsgd_simnet_leave(b->hub, a->rank);
    return NULL;
}

/* One run; returns its wall seconds, and the simulated events in *events. */
static double bench_once(int n, int workload, int steps, int simulated, dsgd_allreduce_algo algo, size_t count,
                         uint64_t *events) {
    static pthread_t th[MAX_N];
    static rank_arg args[MAX_N];
    dsgd_ctx *main_ctx;
    dsgd_loopback *lb = NULL;
    bench_run *b = (bench_run *)calloc(1, sizeof(bench_run));
    double t0, t1;
    int i;
    if (!b || dsgd_ctx_create(NULL, &main_ctx) != DSGD_OK) exit(1);
    b->n = n;
    b->steps = steps;
    b->workload = workload;
    b->algo = algo;
    b->count = count;
    if (simulated) {
        dsgd_simnet_desc d;
        memset(&d, 0, sizeof(d));
        d.ranks = n;
        d.alpha_s = 5e-6;
        d.beta_s_per_byte = 1e-10;
        d.gamma_s_per_float = 1e-10;
        d.compute.kind = DSGD_SIMNET_COMPUTE_EXPONENTIAL;
        d.compute.mean_s = 1e-3;
        d.compute.seed = 1;
        if (dsgd_simnet_create(main_ctx, &d, &b->hub) != DSGD_OK) exit(1);
    } else if (dsgd_loopback_create(main_ctx, n, &lb) != DSGD_OK) {
        exit(1);
    }
    for (i = 0; i < n; ++i) {
        if (dsgd_ctx_create(NULL, &b->ctx[i]) != DSGD_OK) exit(1);
        if (simulated) dsgd_simnet_endpoint(b->hub, i, &b->ep[i]);
        else dsgd_loopback_endpoint(lb, i, &b->ep[i]);
    }
    t0 = dsgd_now();
    for (i = 0; i < n; ++i) {
        args[i].b = b;
        args[i].rank = i;
        if (pthread_create(&th[i], NULL, rank_main, &args[i]) != 0) {
            fprintf(stderr, "cannot start thread %d\n", i);
            exit(1);
        }
    }
    for (i = 0; i < n; ++i) pthread_join(th[i], NULL);
    t1 = dsgd_now();
    if (b->failed) exit(1);
    if (events) {
        dsgd_simnet_stats st;
        memset(&st, 0, sizeof(st));
        dsgd_simnet_get_stats(b->hub, &st);
        *events = st.messages + st.computes;
    }
    for (i = 0; i < n; ++i) dsgd_ctx_destroy(b->ctx[i]);
    dsgd_simnet_destroy(b->hub);
    dsgd_loopback_destroy(lb);
    dsgd_ctx_destroy(main_ctx);
    free(b);
    return t1 - t0;
}

int main(int argc, char **argv) {
    static const int ranks[3] = {16, 64, 256};
    static const char *const wname[2] = {"shift", "ring"};
    int reps = REPS, i, w, k;
    if (argc > 1 && !strcmp(argv[1], "-q")) reps = 3;
    printf("simulated events per second (messages + compute charges), median of %d runs\n", reps);
    printf("%-8s %6s %10s %10s %14s\n", "workload", "ranks", "events", "wall_s", "events_per_s");
    for (w = 0; w < 2; ++w) {
        for (i = 0; i < 3; ++i) {
            int n = ranks[i];
            /* about 100k events a run */
            int steps = w == 0 ? 100000 / (2 * n) : 100000 / (n * (2 * (n - 1) + 9) + n) + 1;
            double rate[REPS], med;
            uint64_t ev = 0;
            for (k = 0; k < reps; ++k) {
                double s = bench_once(n, w, steps, 1, DSGD_ALLREDUCE_RING, 256, &ev);
                rate[k] = (double)ev / s;
            }
            med = bench_median(rate, reps);
            printf("%-8s %6d %10llu %10.3f %14.0f\n", wname[w], n, (unsigned long long)ev, (double)ev / med, med);
            printf("RESULT simnet_events workload=%s ranks=%d events_per_s=%.0f\n", wname[w], n, med);
        }
    }
    printf("\none all-reduce step of 65536 floats at 4 ranks: wall time, median of %d runs of 50 steps\n", reps);
    printf("%-8s %12s %12s %8s\n", "algo", "simnet_ms", "loopback_ms", "ratio");
    for (w = 0; w < 2; ++w) {
        dsgd_allreduce_algo algo = w == 0 ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_AUTO;
        double s[REPS], l[REPS], ms, ml;
        for (k = 0; k < reps; ++k) {
            s[k] = bench_once(4, 2, 50, 1, algo, 65536, NULL) / 50 * 1e3;
            l[k] = bench_once(4, 2, 50, 0, algo, 65536, NULL) / 50 * 1e3;
        }
        ms = bench_median(s, reps);
        ml = bench_median(l, reps);
        printf("%-8s %12.3f %12.3f %8.2f\n", w == 0 ? "ring" : "auto", ms, ml, ms / ml);
        printf("RESULT simnet_step ranks=4 algo=%s simnet_ms=%.4f loopback_ms=%.4f ratio=%.3f\n",
               w == 0 ? "ring" : "auto", ms, ml, ms / ml);
    }
    return 0;
}
