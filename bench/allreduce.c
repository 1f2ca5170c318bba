/* bench/allreduce.c - all-reduce over the loopback transport, against the
   machine's memory bandwidth measured in the same run.

   For N ranks (one thread each) and a buffer of S bytes per rank it prints,
   for every algorithm (AUTO included): the median time of one all-reduce,
   algbw = S / t, busbw = algbw * 2(N-1)/N (the nccl-tests definition), and
   the fraction of the in-memory limit. An in-process all-reduce must read
   every rank's input and write every rank's output, at least 2 N S bytes,
   half reads and half writes. The limit is measured in the same run with
   min(N, CPUs) threads at once: memcpy bandwidth (2 bytes moved per byte
   copied: the same read/write mix) and two-array-sum bandwidth (c = a + b,
   3 bytes per element byte: two reads per write, which most machines serve
   faster). frac_copy = (2 N S / t) / memcpy_bw, frac_sum = (2 N S / t) /
   sum_bw, and the machine-readable frac uses the higher of the two limits
   (the stricter). Reductions are SUM over floats, as in bench/allreduce_mpi.c.

   With -f it measures instead what the agreement (the collectives'
   fingerprints, see distsgd/collectives.h) costs: recursive doubling and
   the ring at each N and size, three ways interleaved batch by batch, each
   on its own communicator over the same hub: "none" (the agreement
   skipped, the communicator's benchmark-only no_agree: no desync
   detection), "rounds" (the agreement as its own rounds first: the
   endpoints without sendrecv_upto) and "folded" (the default: the
   agreement's rounds carry the algorithm's first exchanges). It prints
   the median batch of each and the ratios to "none":
     FINGERPRINT n=2 bytes=4096 algo=rd none_us=... rounds_us=... folded_us=... rounds_ratio=... folded_ratio=...

   Usage: allreduce [-n 2,4,8] [-s 4K,64M] [-a auto,ring,...] [-p] [-q] [-f]
     -n  rank counts (default 2,4,8)
     -s  sizes in bytes with K/M suffixes (default 4K 16K 64K 256K 1M 4M 16M 64M)
     -a  algorithms: auto ring hd rb rd direct (default all)
     -p  pin rank r's thread to CPU r % CPUs (Linux)
     -q  quick: fewer repeats
     -f  the fingerprints' cost (above), instead of the algorithms' table
     -S  spin time of a waiting rank in microseconds (default: the loopback's)
     -P  piece size of the pipelined algorithms, e.g. 256K (default: the communicator's)
   Besides the table, every measurement prints one machine-readable line:
     RESULT allreduce n=2 bytes=4096 algo=ring time_us=... algbw_GBps=... busbw_GBps=... frac=...
            frac_memcpy=... frac_sum=...
     MEMBW n=2 threads=2 memcpy_GBps=... sum_GBps=...
   The machine is assumed otherwise idle: on a shared one, run it more than
   once and compare medians. */
#define _GNU_SOURCE /* pthread_setaffinity_np */
/* distsgd-program: own-implementation (it sets a private field of dsgd_comm) */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_N 64
#define MAX_SIZES 32
#define MAX_BATCHES 9

static const struct {
    const char *flag;
    dsgd_allreduce_algo algo;
} ALGOS[] = {{"auto", DSGD_ALLREDUCE_AUTO},
             {"ring", DSGD_ALLREDUCE_RING},
             {"hd", DSGD_ALLREDUCE_HALVING_DOUBLING},
             {"rb", DSGD_ALLREDUCE_REDUCE_BROADCAST},
             {"rd", DSGD_ALLREDUCE_RECURSIVE_DOUBLING},
             {"direct", DSGD_ALLREDUCE_DIRECT}};
#define NUM_ALGOS ((int)(sizeof(ALGOS) / sizeof(ALGOS[0])))

typedef struct plan {
    int n;
    size_t sizes[MAX_SIZES];
    int num_sizes;
    int algo_on[NUM_ALGOS];
    int quick, pin;
    double spin_s; /* < 0: the hub's default */
    size_t piece_bytes; /* 0: the communicator's default */
    long ncpu;
} plan;

/* ---------------------------------------------------------------- memory bandwidth */

typedef struct bw_arg {
    size_t floats;
    float *a, *b, *c;
    int kind, reps, cpu;
    double best;
} bw_arg;

static void sum_arrays(float *c, const float *a, const float *b, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

static void pin_to(int cpu) {
#ifdef __linux__
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
#else
    (void)cpu;
#endif
}

static pthread_barrier_t bw_barrier;

static void *bw_thread(void *p) {
    bw_arg *a = (bw_arg *)p;
    int r;
    if (a->cpu >= 0) pin_to(a->cpu);
    a->best = 1e30;
    for (r = 0; r < a->reps; ++r) {
        double t;
        pthread_barrier_wait(&bw_barrier);
        t = dsgd_now();
        if (a->kind == 0) memcpy(a->c, a->a, a->floats * sizeof(float));
        else sum_arrays(a->c, a->a, a->b, a->floats);
        t = dsgd_now() - t;
        if (t < a->best) a->best = t;
    }
    return NULL;
}

/* Aggregate bandwidth (bytes/s) of `threads` threads each copying (kind 0,
   2 bytes per byte) or summing (kind 1, 3 bytes per byte) 128 MiB arrays. */
static double measure_bw(int threads, int kind, int pin, long ncpu) {
    bw_arg args[MAX_N];
    pthread_t th[MAX_N];
    size_t floats = (size_t)32 << 20; /* 128 MiB per array, 4x the L3 of most CPUs */
    double slowest = 0;
    int t;
    pthread_barrier_init(&bw_barrier, NULL, (unsigned)threads);
    for (t = 0; t < threads; ++t) {
        args[t].floats = floats;
        args[t].a = (float *)malloc(floats * sizeof(float));
        args[t].b = (float *)malloc(floats * sizeof(float));
        args[t].c = (float *)malloc(floats * sizeof(float));
        if (!args[t].a || !args[t].b || !args[t].c) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        memset(args[t].a, 0, floats * sizeof(float));
        memset(args[t].b, 0, floats * sizeof(float));
        memset(args[t].c, 0, floats * sizeof(float));
        args[t].kind = kind;
        args[t].reps = 5;
        args[t].cpu = pin ? (int)(t % ncpu) : -1;
        pthread_create(&th[t], NULL, bw_thread, &args[t]);
    }
    for (t = 0; t < threads; ++t) {
        pthread_join(th[t], NULL);
        if (args[t].best > slowest) slowest = args[t].best;
        free(args[t].a);
        free(args[t].b);
        free(args[t].c);
    }
    pthread_barrier_destroy(&bw_barrier);
    return (double)threads * (kind ? 3.0 : 2.0) * (double)(floats * sizeof(float)) / slowest;
}

/* ---------------------------------------------------------------- all-reduce */

typedef struct rank_arg {
    const plan *pl;
    int rank;
    dsgd_comm *comm;
    dsgd_ctx *ctx;
    float *buf;
    /* times[size][algo][batch]: seconds per all-reduce in that batch */
    double times[MAX_SIZES][NUM_ALGOS][MAX_BATCHES];
    int iters[MAX_SIZES], batches[MAX_SIZES];
    int failed;
} rank_arg;

static int iters_for(size_t bytes) {
    size_t it = ((size_t)8 << 20) / bytes; /* ~8 MiB of payload per batch */
    if (it < 1) it = 1;
    if (it > 2000) it = 2000;
    return (int)it;
}

static int batches_for(size_t bytes, int quick) {
    if (quick) return bytes >= ((size_t)16 << 20) ? 2 : 3;
    return bytes >= ((size_t)16 << 20) ? 3 : bytes >= ((size_t)1 << 20) ? 5 : 7;
}

static void *rank_thread(void *p) {
    rank_arg *a = (rank_arg *)p;
    const plan *pl = a->pl;
    int si, ai, b, it;
    if (pl->pin) pin_to((int)(a->rank % pl->ncpu));
    for (si = 0; si < pl->num_sizes; ++si) {
        size_t count = pl->sizes[si] / sizeof(float);
        int iters = iters_for(pl->sizes[si]), batches = batches_for(pl->sizes[si], pl->quick);
        a->iters[si] = iters;
        a->batches[si] = batches;
        for (ai = 0; ai < NUM_ALGOS; ++ai) {
            if (!pl->algo_on[ai]) continue;
            for (b = -1; b < batches; ++b) { /* batch -1 warms up */
                double t0;
                if (dsgd_barrier(a->comm, 0) != DSGD_OK) goto fail;
                t0 = dsgd_now();
                for (it = 0; it < iters; ++it)
                    if (dsgd_allreduce(a->comm, a->buf, count, DSGD_REDUCE_SUM, ALGOS[ai].algo, 0) != DSGD_OK)
                        goto fail;
                if (b >= 0) a->times[si][ai][b] = (dsgd_now() - t0) / iters;
            }
        }
    }
    return NULL;
fail:
    fprintf(stderr, "rank %d: %s\n", a->rank, dsgd_ctx_last_error(a->ctx));
    a->failed = 1;
    return NULL;
}

static void human(size_t bytes, char *dst, size_t cap);

/* A loopback hub of n ranks with the plan's spin; *maxbytes: the largest size. */
static int open_hub(const plan *pl, int n, dsgd_ctx **ctx, dsgd_loopback **hub, size_t *maxbytes) {
    int si;
    *maxbytes = 0;
    for (si = 0; si < pl->num_sizes; ++si)
        if (pl->sizes[si] > *maxbytes) *maxbytes = pl->sizes[si];
    if (dsgd_ctx_create(NULL, ctx) != DSGD_OK || dsgd_loopback_create(*ctx, n, hub) != DSGD_OK) {
        fprintf(stderr, "cannot create the loopback hub\n");
        return 1;
    }
    dsgd_loopback_set_spin(*hub, pl->spin_s);
    return 0;
}

/* ---------------------------------------------------------------- -f: the fingerprints */

enum { FP_NONE, FP_ROUNDS, FP_FOLDED, FP_MODES };
static const char *const FP_NAMES[FP_MODES] = {"none", "rounds", "folded"};
static const dsgd_allreduce_algo FP_ALGOS[2] = {DSGD_ALLREDUCE_RECURSIVE_DOUBLING, DSGD_ALLREDUCE_RING};
static const char *const FP_FLAGS[2] = {"rd", "ring"};

typedef struct fp_arg {
    const plan *pl;
    int rank;
    dsgd_ctx *ctx;
    dsgd_comm *comm[FP_MODES];
    float *buf;
    double times[MAX_SIZES][2][FP_MODES][MAX_BATCHES];
    int batches[MAX_SIZES];
    int failed;
} fp_arg;

static void *fp_thread(void *p) {
    fp_arg *a = (fp_arg *)p;
    const plan *pl = a->pl;
    int si, ai, b, m, it;
    if (pl->pin) pin_to((int)(a->rank % pl->ncpu));
    for (si = 0; si < pl->num_sizes; ++si) {
        size_t count = pl->sizes[si] / sizeof(float);
        int iters = iters_for(pl->sizes[si]), batches = 2 * batches_for(pl->sizes[si], pl->quick) + 1;
        if (batches > MAX_BATCHES) batches = MAX_BATCHES;
        a->batches[si] = batches;
        for (ai = 0; ai < 2; ++ai)
            for (b = -1; b < batches; ++b) /* batch -1 warms up; the modes take turns */
                for (m = 0; m < FP_MODES; ++m) {
                    double t0;
                    if (dsgd_barrier(a->comm[FP_FOLDED], 0) != DSGD_OK) goto fail;
                    t0 = dsgd_now();
                    for (it = 0; it < iters; ++it)
                        if (dsgd_allreduce(a->comm[m], a->buf, count, DSGD_REDUCE_SUM, FP_ALGOS[ai], 0) != DSGD_OK)
                            goto fail;
                    if (b >= 0) a->times[si][ai][m][b] = (dsgd_now() - t0) / iters;
                }
    }
    return NULL;
fail:
    fprintf(stderr, "rank %d: %s\n", a->rank, dsgd_ctx_last_error(a->ctx));
    a->failed = 1;
    return NULL;
}

static int run_fingerprints(plan *pl, int n) {
    static fp_arg args[MAX_N];
    pthread_t th[MAX_N];
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    size_t maxbytes = 0;
    int r, si, ai, m, failed = 0;
    if (open_hub(pl, n, &ctx, &hub, &maxbytes)) return 1;
    for (r = 0; r < n; ++r) {
        dsgd_transport_i t;
        memset(&args[r], 0, sizeof(args[r]));
        args[r].pl = pl;
        args[r].rank = r;
        if (dsgd_ctx_create(NULL, &args[r].ctx) != DSGD_OK || dsgd_loopback_endpoint(hub, r, &t) != DSGD_OK) return 1;
        for (m = 0; m < FP_MODES; ++m) {
            dsgd_transport_i tm = t;
            if (m == FP_ROUNDS) tm.sendrecv_upto = NULL;
            if (dsgd_comm_create(args[r].ctx, &tm, NULL, &args[r].comm[m]) != DSGD_OK) return 1;
        }
        args[r].comm[FP_NONE]->no_agree = 1; /* benchmarks only: no desync detection */
        if (!(args[r].buf = (float *)malloc(maxbytes))) return 1;
        memset(args[r].buf, 0, maxbytes);
    }
    for (r = 0; r < n; ++r) pthread_create(&th[r], NULL, fp_thread, &args[r]);
    for (r = 0; r < n; ++r) {
        pthread_join(th[r], NULL);
        failed |= args[r].failed;
    }
    printf("\nN = %d ranks: the fingerprints' cost (median batch, the slowest rank's; ratio to none)\n", n);
    printf("%8s %-20s %10s %10s %10s %8s %8s\n", "size", "algorithm", "none_us", "rounds_us", "folded_us", "rounds", "folded");
    for (si = 0; si < pl->num_sizes && !failed; ++si)
        for (ai = 0; ai < 2; ++ai) {
            double t[FP_MODES];
            char hs[16];
            int nb = args[0].batches[si], b;
            for (m = 0; m < FP_MODES; ++m) {
                double per_batch[MAX_BATCHES];
                for (b = 0; b < nb; ++b) {
                    per_batch[b] = 0;
                    for (r = 0; r < n; ++r)
                        if (args[r].times[si][ai][m][b] > per_batch[b]) per_batch[b] = args[r].times[si][ai][m][b];
                }
                qsort(per_batch, (size_t)nb, sizeof(double), bench_cmp_double);
                t[m] = per_batch[nb / 2];
            }
            human(pl->sizes[si], hs, sizeof(hs));
            printf("%8s %-20s %10.2f %10.2f %10.2f %7.2fx %7.2fx\n", hs, dsgd_allreduce_algo_name(FP_ALGOS[ai]),
                   t[0] * 1e6, t[1] * 1e6, t[2] * 1e6, t[1] / t[0], t[2] / t[0]);
            printf("FINGERPRINT n=%d bytes=%zu algo=%s %s_us=%.3f %s_us=%.3f %s_us=%.3f rounds_ratio=%.3f "
                   "folded_ratio=%.3f\n", n, pl->sizes[si], FP_FLAGS[ai], FP_NAMES[0], t[0] * 1e6, FP_NAMES[1],
                   t[1] * 1e6, FP_NAMES[2], t[2] * 1e6, t[1] / t[0], t[2] / t[0]);
        }
    fflush(stdout);
    for (r = 0; r < n; ++r) {
        for (m = 0; m < FP_MODES; ++m) dsgd_comm_destroy(args[r].comm[m]);
        dsgd_ctx_destroy(args[r].ctx);
        free(args[r].buf);
    }
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    return failed;
}

static void human(size_t bytes, char *dst, size_t cap) {
    if (bytes >= ((size_t)1 << 20)) snprintf(dst, cap, "%zuM", bytes >> 20);
    else if (bytes >= 1024) snprintf(dst, cap, "%zuK", bytes >> 10);
    else snprintf(dst, cap, "%zu", bytes);
}

static int run_n(plan *pl, int n) {
    static rank_arg args[MAX_N];
    pthread_t th[MAX_N];
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_comm_desc cdesc;
    size_t maxbytes = 0;
    double memcpy_bw, sum_bw, mem_bw;
    int r, si, ai, threads = (int)(n < pl->ncpu ? n : pl->ncpu), failed = 0;

    memcpy_bw = measure_bw(threads, 0, pl->pin, pl->ncpu);
    sum_bw = measure_bw(threads, 1, pl->pin, pl->ncpu);
    mem_bw = memcpy_bw > sum_bw ? memcpy_bw : sum_bw;
    printf("\nN = %d ranks (%d threads on %ld CPUs%s): memory bandwidth with %d threads: memcpy %.2f GB/s, "
           "sum %.2f GB/s; limit used: %.2f GB/s\n",
           n, n, pl->ncpu, pl->pin ? ", pinned" : "", threads, memcpy_bw / 1e9, sum_bw / 1e9, mem_bw / 1e9);
    printf("MEMBW n=%d threads=%d memcpy_GBps=%.3f sum_GBps=%.3f\n", n, threads, memcpy_bw / 1e9, sum_bw / 1e9);

    pl->n = n;
    if (open_hub(pl, n, &ctx, &hub, &maxbytes)) return 1;
    memset(&cdesc, 0, sizeof(cdesc));
    cdesc.piece_bytes = pl->piece_bytes;
    for (r = 0; r < n; ++r) {
        dsgd_transport_i t;
        memset(&args[r], 0, sizeof(args[r]));
        args[r].pl = pl;
        args[r].rank = r;
        if (dsgd_ctx_create(NULL, &args[r].ctx) != DSGD_OK || dsgd_loopback_endpoint(hub, r, &t) != DSGD_OK ||
            dsgd_comm_create(args[r].ctx, &t, &cdesc, &args[r].comm) != DSGD_OK) {
            fprintf(stderr, "cannot create rank %d\n", r);
            return 1;
        }
        args[r].buf = (float *)malloc(maxbytes);
        if (!args[r].buf) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        memset(args[r].buf, 0, maxbytes); /* zeros: sums stay finite and normal */
    }
    for (r = 0; r < n; ++r) pthread_create(&th[r], NULL, rank_thread, &args[r]);
    for (r = 0; r < n; ++r) {
        pthread_join(th[r], NULL);
        failed |= args[r].failed;
    }

    printf("%8s %-18s %-18s %11s %10s %10s %9s %9s\n", "size", "algorithm", "(auto runs)", "time_us", "algbw_GB/s",
           "busbw_GB/s", "frac_copy", "frac_sum");
    for (si = 0; si < pl->num_sizes && !failed; ++si) {
        size_t bytes = pl->sizes[si];
        char hs[16];
        human(bytes, hs, sizeof(hs));
        for (ai = 0; ai < NUM_ALGOS; ++ai) {
            double per_batch[MAX_BATCHES], t, algbw, busbw, frac;
            int b, nb = args[0].batches[si];
            if (!pl->algo_on[ai]) continue;
            /* a batch's time is its slowest rank's; report the median batch */
            for (b = 0; b < nb; ++b) {
                per_batch[b] = 0;
                for (r = 0; r < n; ++r)
                    if (args[r].times[si][ai][b] > per_batch[b]) per_batch[b] = args[r].times[si][ai][b];
            }
            qsort(per_batch, (size_t)nb, sizeof(double), bench_cmp_double);
            t = per_batch[nb / 2];
            algbw = (double)bytes / t;
            busbw = algbw * 2.0 * (n - 1) / n;
            frac = 2.0 * n * (double)bytes / t / mem_bw;
            printf("%8s %-18s %-18s %11.2f %10.3f %10.3f %9.3f %9.3f\n", hs, dsgd_allreduce_algo_name(ALGOS[ai].algo),
                   ALGOS[ai].algo == DSGD_ALLREDUCE_AUTO
                       ? dsgd_allreduce_algo_name(dsgd_allreduce_choose(args[0].comm, bytes / sizeof(float)))
                       : "",
                   t * 1e6, algbw / 1e9, busbw / 1e9, 2.0 * n * (double)bytes / t / memcpy_bw,
                   2.0 * n * (double)bytes / t / sum_bw);
            printf("RESULT allreduce n=%d bytes=%zu algo=%s time_us=%.3f algbw_GBps=%.4f busbw_GBps=%.4f frac=%.4f "
                   "frac_memcpy=%.4f frac_sum=%.4f\n",
                   n, bytes, ALGOS[ai].flag, t * 1e6, algbw / 1e9, busbw / 1e9, frac,
                   2.0 * n * (double)bytes / t / memcpy_bw, 2.0 * n * (double)bytes / t / sum_bw);
        }
    }
    fflush(stdout);
    for (r = 0; r < n; ++r) {
        dsgd_comm_destroy(args[r].comm);
        dsgd_ctx_destroy(args[r].ctx);
        free(args[r].buf);
    }
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    return failed;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    else if (*end == 'G' || *end == 'g') v *= 1024.0 * 1024 * 1024;
    return (size_t)v;
}

int main(int argc, char **argv) {
    static plan pl;
    int ns[16] = {2, 4, 8}, num_n = 3, i, k, status = 0, fingerprints = 0;
    memset(&pl, 0, sizeof(pl));
    pl.ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (pl.ncpu < 1) pl.ncpu = 1;
    for (k = 0; k < 8; ++k) pl.sizes[k] = (size_t)4096 << (2 * k); /* 4K .. 64M */
    pl.num_sizes = 8;
    pl.spin_s = -1;
    for (k = 0; k < NUM_ALGOS; ++k) pl.algo_on[k] = 1;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-q")) pl.quick = 1;
        else if (!strcmp(argv[i], "-f")) fingerprints = 1;
        else if (!strcmp(argv[i], "-S") && i + 1 < argc) pl.spin_s = atof(argv[++i]) * 1e-6;
        else if (!strcmp(argv[i], "-P") && i + 1 < argc) pl.piece_bytes = parse_size(argv[++i]);
        else if (!strcmp(argv[i], "-p")) pl.pin = 1;
        else if (i + 1 < argc && (!strcmp(argv[i], "-n") || !strcmp(argv[i], "-s") || !strcmp(argv[i], "-a"))) {
            char *list = argv[++i], *tok, *save = NULL;
            if (argv[i - 1][1] == 'n') num_n = 0;
            if (argv[i - 1][1] == 's') pl.num_sizes = 0;
            if (argv[i - 1][1] == 'a')
                for (k = 0; k < NUM_ALGOS; ++k) pl.algo_on[k] = 0;
            for (tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (argv[i - 1][1] == 'n' && num_n < 16 && atoi(tok) >= 1 && atoi(tok) <= MAX_N) ns[num_n++] = atoi(tok);
                if (argv[i - 1][1] == 's' && pl.num_sizes < MAX_SIZES && parse_size(tok) >= sizeof(float))
                    pl.sizes[pl.num_sizes++] = parse_size(tok);
                if (argv[i - 1][1] == 'a')
                    for (k = 0; k < NUM_ALGOS; ++k)
                        if (!strcmp(tok, ALGOS[k].flag)) pl.algo_on[k] = 1;
            }
        } else {
            fprintf(stderr, "usage: %s [-n 2,4,8] [-s 4K,64M] [-a auto,ring,hd,rb,rd,direct] [-p] [-q] [-f] [-S us] [-P bytes]\n", argv[0]);
            return 2;
        }
    }
    printf("all-reduce over the loopback transport (float SUM), %ld CPUs\n", pl.ncpu);
    for (i = 0; i < num_n; ++i) status |= fingerprints ? run_fingerprints(&pl, ns[i]) : run_n(&pl, ns[i]);
    return status;
}
