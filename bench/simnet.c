/* bench/simnet.c - how fast the simnet transport simulates, against the
   loopback in the same run.

   1. Events per second (messages plus compute charges), two ways of running
      the ranks:
        threads: each rank on a thread of its own (a hand-off between two
                 threads is a futex wake and a context switch);
        run:     dsgd_simnet_run, the hub runs every rank on the calling
                 thread (fibers where the build has them: a hand-off is a
                 stack switch; threads otherwise, see the mode printed).
      Two workloads:
        shift: each step, dsgd_simnet_compute (exponential) then a sendrecv of
               64 floats to rank r+1 from rank r-1 (two events per rank-step),
               at 16, 256, 4096 and 16384 ranks (threads: up to 4096);
        ring:  each step, dsgd_simnet_compute then a ring all-reduce of 256
               floats (agreement included: every message counts), at 16, 64
               and 256 ranks.
   2. The wall time of one all-reduce step at 4 ranks, simulated (simnet)
      against real (loopback), same algorithm (ring) and buffer (64K floats),
      and each transport's AUTO choice (simnet: message passing; loopback:
      DIRECT over shared memory).
   Medians of repeated runs; the ratio is simnet / loopback.

   Usage: simnet [-q] [-n RANKS,...]   (-q: fewer repeats; -n: the shift
   workload's rank counts)
   Machine-readable lines:
     RESULT simnet_events mode=run workload=shift ranks=256 events_per_s=...
     RESULT simnet_step ranks=4 algo=ring simnet_ms=... loopback_ms=... ratio=... */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define REPS 5
#define MAX_SIZES 8
#define THREADS_MAX_N 4096 /* above this, the thread runs take minutes */

typedef struct bench_run {
    int n, steps, workload; /* 0 shift, 1 ring, 2 one all-reduce per step (wall time) */
    dsgd_simnet *hub;
    dsgd_transport_i *ep;
    dsgd_ctx **ctx;
    dsgd_allreduce_algo algo;
    size_t count;
    int failed;
} bench_run;

typedef struct rank_arg {
    bench_run *b;
    int rank;
} rank_arg;

/* One rank's steps; t is its endpoint. */
static void rank_body(bench_run *b, int rank, const dsgd_transport_i *t) {
    dsgd_comm *c = NULL;
    dsgd_result r = DSGD_OK;
    float out[64], in[64], *buf = NULL;
    int s, failed = 0;
    memset(out, 0, sizeof(out));
    memset(in, 0, sizeof(in));
    if (b->workload != 0 &&
        (!(buf = (float *)calloc(b->count, sizeof(float))) || dsgd_comm_create(b->ctx[rank], t, NULL, &c) != DSGD_OK))
        r = DSGD_ERR_OUT_OF_MEMORY;
    for (s = 0; s < b->steps && r == DSGD_OK; ++s) {
        if (b->hub && b->workload != 2) r = dsgd_simnet_compute(b->hub, rank, s);
        if (r != DSGD_OK) break;
        if (b->workload == 0)
            r = t->sendrecv(t->impl, (rank + 1) % b->n, (uint64_t)s, out, sizeof(out), (rank + b->n - 1) % b->n,
                            (uint64_t)s, in, sizeof(in), t->now(t->impl) + 1e6, &failed);
        else
            r = dsgd_allreduce(c, buf, b->count, DSGD_REDUCE_SUM, b->algo, 0);
    }
    if (r != DSGD_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, dsgd_result_string(r),
                b->workload == 0 ? t->error_message(t->impl) : dsgd_ctx_last_error(b->ctx[rank]));
        b->failed = 1; /* one rank runs at a time (simnet); loopback: any writer says the same */
    }
    dsgd_comm_destroy(c);
    free(buf);
}

static void *rank_thread(void *p) {
    rank_arg *a = (rank_arg *)p;
    rank_body(a->b, a->rank, &a->b->ep[a->rank]);
    if (a->b->hub) dsgd_simnet_leave(a->b->hub, a->rank);
    return NULL;
}

#ifndef BENCH_THREADS_ONLY
static void rank_fiber(dsgd_simnet *hub, int rank, const dsgd_transport_i *ep, void *user) {
    (void)hub;
    rank_body((bench_run *)user, rank, ep);
}
#endif

/* One run; returns its wall seconds, and the simulated events in *events.
   use_run: dsgd_simnet_run instead of a thread per rank. */
static double bench_once(int n, int workload, int steps, int simulated, int use_run, dsgd_allreduce_algo algo,
                         size_t count, uint64_t *events) {
    pthread_t *th = (pthread_t *)calloc((size_t)n, sizeof(pthread_t));
    rank_arg *args = (rank_arg *)calloc((size_t)n, sizeof(rank_arg));
    dsgd_ctx *main_ctx;
    dsgd_loopback *lb = NULL;
    bench_run *b = (bench_run *)calloc(1, sizeof(bench_run));
    pthread_attr_t attr;
    double t0, t1;
    int i;
    if (!th || !args || !b || dsgd_ctx_create(NULL, &main_ctx) != DSGD_OK) exit(1);
    b->n = n;
    b->steps = steps;
    b->workload = workload;
    b->algo = algo;
    b->count = count;
    b->ep = (dsgd_transport_i *)calloc((size_t)n, sizeof(dsgd_transport_i));
    b->ctx = (dsgd_ctx **)calloc((size_t)n, sizeof(dsgd_ctx *));
    if (!b->ep || !b->ctx) exit(1);
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
        if (dsgd_simnet_create(main_ctx, &d, &b->hub) != DSGD_OK) {
            fprintf(stderr, "%s\n", dsgd_ctx_last_error(main_ctx));
            exit(1);
        }
    } else if (dsgd_loopback_create(main_ctx, n, &lb) != DSGD_OK) {
        exit(1);
    }
    for (i = 0; i < n; ++i) {
        if (workload != 0 && dsgd_ctx_create(NULL, &b->ctx[i]) != DSGD_OK) exit(1);
        if (simulated) dsgd_simnet_endpoint(b->hub, i, &b->ep[i]);
        else dsgd_loopback_endpoint(lb, i, &b->ep[i]);
    }
    t0 = dsgd_now();
    if (use_run) {
#ifndef BENCH_THREADS_ONLY
        if (dsgd_simnet_run(b->hub, rank_fiber, b) != DSGD_OK) {
            fprintf(stderr, "dsgd_simnet_run: %s\n", dsgd_ctx_last_error(main_ctx));
            exit(1);
        }
#endif
    } else {
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        for (i = 0; i < n; ++i) {
            args[i].b = b;
            args[i].rank = i;
            if (pthread_create(&th[i], &attr, rank_thread, &args[i]) != 0) {
                fprintf(stderr, "cannot start thread %d\n", i);
                exit(1);
            }
        }
        for (i = 0; i < n; ++i) pthread_join(th[i], NULL);
        pthread_attr_destroy(&attr);
    }
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
    free(b->ep);
    free(b->ctx);
    free(b);
    free(th);
    free(args);
    return t1 - t0;
}

/* Events per second: the median of reps runs of about `target` events. */
static void events_row(const char *mode, int use_run, int w, int n, int reps) {
    static const char *const wname[2] = {"shift", "ring"};
    /* shift: 2 events a rank-step; ring: n (2 (n - 1) + 9) + n a step */
    long target = use_run ? 400000 : 100000;
    int steps = w == 0 ? (int)(target / (2L * n)) : (int)(target / ((long)n * (2 * (n - 1) + 9) + n)) + 1;
    double rate[REPS], wall[REPS], med;
    uint64_t ev = 0;
    int k;
    if (steps < 2) steps = 2;
    for (k = 0; k < reps; ++k) {
        wall[k] = bench_once(n, w, steps, 1, use_run, DSGD_ALLREDUCE_RING, 256, &ev);
        rate[k] = (double)ev / wall[k];
    }
    med = bench_median(rate, reps);
    printf("%-8s %-8s %6d %10llu %10.3f %14.0f\n", mode, wname[w], n, (unsigned long long)ev, (double)ev / med, med);
    printf("RESULT simnet_events mode=%s workload=%s ranks=%d events_per_s=%.0f\n", mode, wname[w], n, med);
    fflush(stdout);
}

int main(int argc, char **argv) {
    static const int ring_ranks[3] = {16, 64, 256};
    int sizes[MAX_SIZES] = {16, 256, 4096, 16384}, nsizes = 4;
    int reps = REPS, i, w, k, m;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-q")) {
            reps = 3;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            char *s = argv[++i];
            for (nsizes = 0; nsizes < MAX_SIZES && *s; ++nsizes) {
                sizes[nsizes] = (int)strtol(s, &s, 10);
                if (*s == ',') ++s;
            }
        } else {
            fprintf(stderr, "usage: %s [-q] [-n RANKS,...]\n", argv[0]);
            return 2;
        }
    }
#ifndef BENCH_THREADS_ONLY
    printf("dsgd_simnet_run runs the ranks as: %s\n", dsgd_simnet_run_mode());
#endif
    printf("simulated events per second (messages + compute charges), median of %d runs\n", reps);
    printf("%-8s %-8s %6s %10s %10s %14s\n", "mode", "workload", "ranks", "events", "wall_s", "events_per_s");
    for (m = 0; m < 2; ++m) {
        const char *mode = m == 0 ? "threads" : "run";
#ifdef BENCH_THREADS_ONLY
        if (m == 1) break;
#endif
        for (w = 0; w < 2; ++w) {
            for (i = 0; i < (w == 0 ? nsizes : 3); ++i) {
                int n = w == 0 ? sizes[i] : ring_ranks[i];
                if (m == 0 && n > THREADS_MAX_N) continue;
                events_row(mode, m, w, n, reps);
            }
        }
    }
    printf("\none all-reduce step of 65536 floats at 4 ranks: wall time, median of %d runs of 50 steps\n", reps);
    printf("%-8s %12s %12s %8s\n", "algo", "simnet_ms", "loopback_ms", "ratio");
    for (w = 0; w < 2; ++w) {
        dsgd_allreduce_algo algo = w == 0 ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_AUTO;
        double s[REPS], l[REPS], ms, ml;
        for (k = 0; k < reps; ++k) {
            s[k] = bench_once(4, 2, 50, 1, 0, algo, 65536, NULL) / 50 * 1e3;
            l[k] = bench_once(4, 2, 50, 0, 0, algo, 65536, NULL) / 50 * 1e3;
        }
        ms = bench_median(s, reps);
        ml = bench_median(l, reps);
        printf("%-8s %12.3f %12.3f %8.2f\n", w == 0 ? "ring" : "auto", ms, ml, ms / ml);
        printf("RESULT simnet_step ranks=4 algo=%s simnet_ms=%.4f loopback_ms=%.4f ratio=%.3f\n",
               w == 0 ? "ring" : "auto", ms, ml, ms / ml);
    }
    return 0;
}
