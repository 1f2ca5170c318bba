/* mpi_collectives.c - the MPI transport (distsgd_mpi.h), run under mpirun.

   Not a cmocka test (not tests/test_*.c): it is built with mpicc and run
   with mpirun by tests/mpi_collectives.sh (make test-mpi), which also
   checks how the deadline mode ends. Every rank generates every rank's
   inputs from (seed, rank), so each process computes the serial
   double-precision reference itself, and runs each collective twice: over
   the MPI transport (one process per rank) and over an in-process loopback
   group of as many threads, comparing its own rank's result bit for bit.

   Modes:
     (none)       for this np: dsgd_allreduce with RING, HALVING_DOUBLING,
                  REDUCE_BROADCAST, RECURSIVE_DOUBLING, AUTO (on an
                  endpoint with no_share, so that it runs the transport's
                  native hook, MPI_Allreduce on a helper thread; and again
                  on an endpoint with blocking_allreduce, MPI_Allreduce on
                  the calling thread, which must give the helper's bits)
                  and DIRECT (over the MPI-3 shared-memory windows; AUTO's
                  pick on one node), reduce_scatter,
                  allgather, broadcast from every root and barrier, with
                  every op (SUM, MEAN, MAX, MIN) at counts {0, 1, N-1, N+1,
                  1000003}: against the reference (SUM and MEAN within
                  (N + 2) * FLT_EPSILON * sum|x|, as tests/test_collectives.c;
                  MAX, MIN and the data movers exact), the same bits on
                  every rank, and the same bits as over the loopback for
                  every explicit algorithm; NaN propagation of MAX and MIN
                  (native hook included, both ways); the agreement over MPI (ranks
                  passing different counts all get DSGD_ERR_DESYNC and go
                  on); the transport itself: a tag or size mismatch gives
                  DSGD_ERR_DESYNC on the receiver at once, probe reports
                  every message with its tag and size in order per source,
                  a header taken by probe stays for the next recv, timeouts
                  of probe and recv leave the endpoint usable, a 40 ms
                  wait for a late message takes under a fifth of it in
                  CPU time, abort (from
                  another thread) ends a wait at once; the shared-memory
                  window: there on one node, absent with no_share (DIRECT is
                  DSGD_ERR_UNSUPPORTED), another share_bytes on one process
                  fails creation on every process, share refuses a buffer
                  that is not the window.
     --levels     MPI initialised by the program with MPI_THREAD_FUNNELED:
                  dsgd_mpi_transport_create before MPI_Init is DSGD_ERR_STATE;
                  dsgd_mpi_init accepts the program's MPI and reports its
                  level; the default (MPI_THREAD_SERIALIZED) is refused with
                  DSGD_ERR_UNSUPPORTED naming both levels; asking for
                  FUNNELED works; a bad level is DSGD_ERR_INVALID_ARGUMENT;
                  blocking_allreduce on FUNNELED has the native hook, and
                  its MEAN is exact;
                  two endpoints per process (dsgd_mpi_transport_create_local)
                  on FUNNELED are DSGD_ERR_UNSUPPORTED naming
                  MPI_THREAD_MULTIPLE.
     --local K    K endpoints per process (dsgd_mpi_transport_create_local),
                  a group of N = K * np ranks (K * np <= 8), each process
                  running K threads with an endpoint and a dsgd_comm each:
                  the last process passing K + 1 fails on every process
                  naming both counts (*out zeroed); count 0 and count 40000
                  (past MPI_TAG_UB) are refused; count 1 has the native
                  all-reduce; then every collective, op and algorithm at
                  counts {0, 1, N-1, N+1, 7919, 100003} on all K threads at
                  once, each endpoint's result against the reference, the
                  same bits across the group and, for explicit algorithms,
                  as the loopback twin of N ranks; probe on group ranks 0
                  and 1 (both in process 0 when K >= 2) at once: each gets
                  only its own messages, in order per source, nothing left;
                  a timeout names group ranks; abort on endpoint 0 ends
                  endpoint K-1's wait (process 0).
     --share-deadline  four DIRECT all-reduces over the windows, then the
                  last rank sleeps 1.5 s before #5: the others must get
                  DSGD_ERR_TIMEOUT naming it and "#5" within the deadline
                  (0.5 s) + 100 ms, and the late rank DSGD_ERR_ABORTED at
                  once (a peer withdrew its window), not at its own
                  deadline; the job then ends normally.
     --deadline   (np = 2) four all-reduces (AUTO: the native hook, on an
                  endpoint with no_share), then rank 1 sleeps past the
                  deadline of all-reduce #5: rank 0 must get DSGD_ERR_TIMEOUT
                  naming rank 1 and "#5" within the deadline + 100 ms, prints
                  "aborting at T" (CLOCK_REALTIME) and calls dsgd_mpi_abort;
                  the script checks that the job ends non-zero within 5 s.

   Every rank counts its checks and prints its failures ("rank R: FAIL
   ..."); rank 0 prints, after an MPI_Reduce of the counts, the line
   "N passed, N failed". The exit status is non-zero when anything failed.
   A watchdog (alarm) ends a process that hangs.

   Environment: DSGD_TEST_LARGE=<count> replaces the large count (1000003). */
#define _POSIX_C_SOURCE 200809L
#include "../distsgd_mpi.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll_ref.h"

#define TIMEOUT_S 60.0
/* DIRECT last: one endpoint per process only (--local leaves it out) */
#define NUM_ALGOS 6
#define NUM_LOCAL_ALGOS 5
static const dsgd_allreduce_algo ALGOS[NUM_ALGOS] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_HALVING_DOUBLING,
                                                     DSGD_ALLREDUCE_REDUCE_BROADCAST,
                                                     DSGD_ALLREDUCE_RECURSIVE_DOUBLING, DSGD_ALLREDUCE_AUTO,
                                                     DSGD_ALLREDUCE_DIRECT};
static const dsgd_reduce_op OPS[4] = {DSGD_REDUCE_SUM, DSGD_REDUCE_MEAN, DSGD_REDUCE_MAX, DSGD_REDUCE_MIN};

static int g_rank, g_size;
static long g_passed, g_failed;
static pthread_mutex_t g_check_lock = PTHREAD_MUTEX_INITIALIZER; /* --local checks from several threads */

/* ---------------------------------------------------------------- checks */

static int check(int ok, const char *fmt, ...) {
    pthread_mutex_lock(&g_check_lock);
    if (ok) {
        g_passed++;
    } else {
        va_list ap;
        g_failed++;
        printf("rank %d: FAIL ", g_rank);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        fflush(stdout);
    }
    pthread_mutex_unlock(&g_check_lock);
    return ok;
}

static void on_alarm(int sig) {
    static const char msg[] = "mpi_collectives: watchdog expired, a call hung\n";
    (void)sig;
    if (write(2, msg, sizeof(msg) - 1) < 0) _exit(98);
    _exit(99);
}

static size_t large_count(void) {
    const char *e = getenv("DSGD_TEST_LARGE");
    if (e && atol(e) > 0) return (size_t)atol(e);
    return 1000003;
}

/* Sums the counts over the ranks; rank 0 prints the summary. Returns the
   exit status (the same on every rank). */
static int summary(void) {
    long mine[2], all[2];
    mine[0] = g_passed;
    mine[1] = g_failed;
    fflush(stdout);
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) {
        printf("%ld passed, %ld failed\n", all[0], all[1]);
        fflush(stdout);
    }
    return all[1] ? 1 : 0;
}

/* ---------------------------------------------------------------- inputs */

/* Input of rank r at element i: uniform in (-scale, scale), the scale varying
   with r and i so that sums mix magnitudes (as tests/test_collectives.c). */
static float input_value(uint64_t seed, int r, size_t i) {
    static const double scale[4] = {1.0, 100.0, 0.01, 3.0};
    uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(r + 1) << 40) ^ (uint64_t)i;
    double u = dsgd_rng_uniform(&s);
    return (float)((2.0 * u - 1.0) * scale[((size_t)r + i) & 3]);
}

/* in[r]: rank r's inputs; the reference over all of them (tests/coll_ref.h). */
static void ref_compute(ref *rf, float **in, int n, size_t count) {
    size_t i;
    int r;
    if (!ref_init(rf, count)) {
        fprintf(stderr, "out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (i = 0; i < count; ++i)
        for (r = 0; r < n; ++r) ref_add(rf, r, i, in[r][i]);
}

/* got[lo..hi) against the reference. Returns 1 when all match, else
   describes the first mismatch in why. */
static int verify(const float *got, const ref *rf, dsgd_reduce_op op, int n, size_t lo, size_t hi, char *why,
                  size_t cap) {
    double want = 0, tol = 0;
    size_t i = ref_mismatch(got, rf, op, n, lo, hi, &want, &tol);
    if (i == hi) return 1;
    snprintf(why, cap, "element %zu = %.9g, want %.9g (tol %.3g)", i, (double)got[i], want, tol);
    return 0;
}

/* FNV-1a of the bytes; the same on every rank when the buffers are bitwise equal. */
static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = 1469598103934665603ull;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* 1 when buf[0..count) has the same bits on every rank (collective on the world). */
static int same_on_all_ranks(const float *buf, size_t count) {
    uint64_t h = hash_bytes(buf, count * sizeof(float)), lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* ---------------------------------------------------------------- the loopback twin */

enum { J_ALLREDUCE, J_REDUCE_SCATTER, J_ALLGATHER, J_BROADCAST };

typedef struct job {
    int kind;
    dsgd_allreduce_algo algo;
    dsgd_reduce_op op;
    int root;
    size_t count;
} job;

/* N loopback ranks in this process, one thread each per collective. */
typedef struct twin {
    int n;
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_ctx *rctx[8];
    dsgd_comm *comm[8];
    dsgd_transport_i ep[8];
    float *buf[8];
    float **in;
    job j;
    dsgd_result res[8];
} twin;

typedef struct twin_arg {
    twin *t;
    int r;
} twin_arg;

static void twin_init(twin *t, int n) {
    int r;
    memset(t, 0, sizeof(*t));
    t->n = n;
    if (n > 8 || dsgd_ctx_create(NULL, &t->ctx) != DSGD_OK || dsgd_loopback_create(t->ctx, n, &t->hub) != DSGD_OK) {
        fprintf(stderr, "rank %d: cannot create the loopback twin\n", g_rank);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    for (r = 0; r < n; ++r) {
        if (dsgd_ctx_create(NULL, &t->rctx[r]) != DSGD_OK || dsgd_loopback_endpoint(t->hub, r, &t->ep[r]) != DSGD_OK ||
            dsgd_comm_create(t->rctx[r], &t->ep[r], NULL, &t->comm[r]) != DSGD_OK) {
            fprintf(stderr, "rank %d: cannot create the loopback twin's rank %d\n", g_rank, r);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
}

static void twin_free(twin *t) {
    int r;
    for (r = 0; r < t->n; ++r) {
        dsgd_comm_destroy(t->comm[r]);
        dsgd_ctx_destroy(t->rctx[r]);
        free(t->buf[r]);
    }
    dsgd_loopback_destroy(t->hub);
    dsgd_ctx_destroy(t->ctx);
}

static dsgd_result run_job(dsgd_comm *comm, const job *j, float *buf) {
    switch (j->kind) {
    case J_ALLREDUCE: return dsgd_allreduce(comm, buf, j->count, j->op, j->algo, TIMEOUT_S);
    case J_REDUCE_SCATTER: return dsgd_reduce_scatter(comm, buf, j->count, j->op, TIMEOUT_S);
    case J_ALLGATHER: return dsgd_allgather(comm, buf, j->count, TIMEOUT_S);
    default: return dsgd_broadcast(comm, buf, j->count, j->root, TIMEOUT_S);
    }
}

static void *twin_thread(void *p) {
    twin_arg *a = (twin_arg *)p;
    twin *t = a->t;
    memcpy(t->buf[a->r], t->in[a->r], t->j.count * sizeof(float));
    t->res[a->r] = run_job(t->comm[a->r], &t->j, t->buf[a->r]);
    return NULL;
}

/* Runs j on the loopback twin with the inputs in[]; 1 when every rank succeeded. */
static int twin_run(twin *t, const job *j, float **in) {
    pthread_t th[8];
    twin_arg args[8];
    int r, ok = 1;
    t->j = *j;
    t->in = in;
    for (r = 0; r < t->n; ++r) {
        args[r].t = t;
        args[r].r = r;
        if (pthread_create(&th[r], NULL, twin_thread, &args[r]) != 0) {
            fprintf(stderr, "rank %d: pthread_create failed\n", g_rank);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    for (r = 0; r < t->n; ++r) pthread_join(th[r], NULL);
    for (r = 0; r < t->n; ++r) {
        if (t->res[r] != DSGD_OK) {
            printf("rank %d: loopback rank %d: %s\n", g_rank, r, dsgd_ctx_last_error(t->rctx[r]));
            ok = 0;
        }
    }
    return ok;
}

/* ---------------------------------------------------------------- the collectives */

static const char *job_name(const job *j, char *buf, size_t cap) {
    switch (j->kind) {
    case J_ALLREDUCE:
        snprintf(buf, cap, "allreduce %s %s count %zu", dsgd_allreduce_algo_name(j->algo), dsgd_reduce_op_name(j->op),
                 j->count);
        break;
    case J_REDUCE_SCATTER:
        snprintf(buf, cap, "reduce_scatter %s count %zu", dsgd_reduce_op_name(j->op), j->count);
        break;
    case J_ALLGATHER: snprintf(buf, cap, "allgather count %zu", j->count); break;
    default: snprintf(buf, cap, "broadcast root %d count %zu", j->root, j->count); break;
    }
    return buf;
}

/* Whether rank `rank`'s buf holds what collective j should leave there
   (in: every rank's input); *off, *len: the range checked for a
   reduce-scatter (its block), else the whole buffer. why: the first
   difference. */
static int result_ok(const job *j, const float *buf, float **in, const ref *rf, int n, int rank, size_t *off,
                     size_t *len, char *why, size_t cap) {
    size_t count = j->count, b;
    int k;
    why[0] = '\0';
    *off = 0;
    *len = count;
    switch (j->kind) {
    case J_ALLREDUCE: return verify(buf, rf, j->op, n, 0, count, why, cap);
    case J_REDUCE_SCATTER:
        dsgd_block_range(count, n, rank, off, len);
        return verify(buf, rf, j->op, n, *off, *off + *len, why, cap);
    case J_ALLGATHER:
        for (k = 0; k < n; ++k) {
            size_t o, l;
            dsgd_block_range(count, n, k, &o, &l);
            for (b = o; b < o + l; ++b)
                if (memcmp(&buf[b], &in[k][b], sizeof(float)) != 0) {
                    snprintf(why, cap, "element %zu is not rank %d's input", b, k);
                    return 0;
                }
        }
        return 1;
    default:
        if (memcmp(buf, in[j->root], count * sizeof(float)) == 0) return 1;
        snprintf(why, cap, "not root %d's buffer", j->root);
        return 0;
    }
}

/* One collective over MPI, checked against the reference, across ranks and
   (explicit algorithms, and the collectives that have only one) against the
   loopback twin. */
static void one_case(dsgd_comm *comm, twin *tw, const job *j, float **in, const ref *rf, float *buf) {
    char name[128], why[160];
    size_t count = j->count, off = 0, len = count, b;
    dsgd_result r;
    int n = g_size, ok = 1, compare_twin;
    job_name(j, name, sizeof(name));
    memcpy(buf, in[g_rank], count * sizeof(float));
    r = run_job(comm, j, buf);
    if (!check(r == DSGD_OK, "np=%d %s: %s", n, name, dsgd_ctx_last_error(dsgd_comm_ctx(comm)))) return;
    ok = result_ok(j, buf, in, rf, n, g_rank, &off, &len, why, sizeof(why));
    check(ok, "np=%d %s: %s", n, name, why);
    if (j->kind != J_REDUCE_SCATTER) check(same_on_all_ranks(buf, count), "np=%d %s: ranks differ in bits", n, name);
    compare_twin = !(j->kind == J_ALLREDUCE && j->algo == DSGD_ALLREDUCE_AUTO);
    if (compare_twin && check(twin_run(tw, j, in), "np=%d %s: the loopback run failed", n, name)) {
        const float *mine = tw->buf[g_rank];
        size_t first = j->kind == J_REDUCE_SCATTER ? off : 0, m = j->kind == J_REDUCE_SCATTER ? len : count;
        size_t diff = m;
        for (b = 0; b < m; ++b)
            if (memcmp(&mine[first + b], &buf[first + b], sizeof(float)) != 0) {
                diff = b;
                break;
            }
        check(diff == m, "np=%d %s: element %zu differs from the loopback's bits (%.9g vs %.9g)", n, name, first + diff,
              diff < m ? (double)buf[first + diff] : 0.0, diff < m ? (double)mine[first + diff] : 0.0);
    }
}

/* hook: a communicator over an endpoint without the window (no_share),
   where AUTO runs the native hook; blk: the same over an endpoint with
   blocking_allreduce (MPI_Allreduce on the calling thread), whose results
   must be the helper's bits; comm's AUTO goes through the windows. */
static void test_collectives(dsgd_comm *comm, dsgd_comm *hook, dsgd_comm *blk, twin *tw) {
    size_t counts[5], count;
    int n = g_size, ci, a, o, k;
    counts[0] = 0;
    counts[1] = 1;
    counts[2] = (size_t)n - 1;
    counts[3] = (size_t)n + 1;
    counts[4] = large_count();
    /* every rank is on this machine: AUTO goes through the shared-memory windows */
    check(dsgd_allreduce_choose(comm, 1000) == DSGD_ALLREDUCE_DIRECT &&
              dsgd_allreduce_choose(comm, (size_t)16 << 20) == DSGD_ALLREDUCE_DIRECT,
          "np=%d: AUTO does not pick DIRECT on one node", n);
    for (ci = 0; ci < 5; ++ci) {
        float *in[8], *buf, *held;
        ref rf;
        job j;
        double t0 = dsgd_now();
        long failed0 = g_failed;
        size_t i;
        count = counts[ci];
        for (k = 0; k < n; ++k) {
            in[k] = (float *)malloc((count + 1) * sizeof(float));
            free(tw->buf[k]);
            tw->buf[k] = (float *)malloc((count + 1) * sizeof(float));
            if (!in[k] || !tw->buf[k]) MPI_Abort(MPI_COMM_WORLD, 2);
            for (i = 0; i < count; ++i) in[k][i] = input_value(1234 + (uint64_t)ci, k, i);
        }
        buf = (float *)malloc((count + 1) * sizeof(float));
        held = (float *)malloc((count + 1) * sizeof(float));
        if (!buf || !held) MPI_Abort(MPI_COMM_WORLD, 2);
        ref_compute(&rf, in, n, count);
        memset(&j, 0, sizeof(j));
        j.count = count;
        j.kind = J_ALLREDUCE;
        for (a = 0; a < NUM_ALGOS; ++a)
            for (o = 0; o < 4; ++o) {
                j.algo = ALGOS[a];
                j.op = OPS[o];
                one_case(j.algo == DSGD_ALLREDUCE_AUTO ? hook : comm, tw, &j, in, &rf, buf);
                if (j.algo != DSGD_ALLREDUCE_AUTO) continue;
                memcpy(held, buf, count * sizeof(float));
                one_case(blk, tw, &j, in, &rf, buf);
                check(memcmp(held, buf, count * sizeof(float)) == 0,
                      "np=%d blocking_allreduce %s count %zu: not the helper's bits", n, dsgd_reduce_op_name(j.op),
                      count);
            }
        j.kind = J_REDUCE_SCATTER;
        for (o = 0; o < 4; ++o) {
            j.op = OPS[o];
            one_case(comm, tw, &j, in, &rf, buf);
        }
        j.kind = J_ALLGATHER;
        one_case(comm, tw, &j, in, &rf, buf);
        j.kind = J_BROADCAST;
        for (k = 0; k < n; ++k) {
            j.root = k;
            one_case(comm, tw, &j, in, &rf, buf);
        }
        check(dsgd_barrier(comm, TIMEOUT_S) == DSGD_OK, "np=%d barrier: %s", n,
              dsgd_ctx_last_error(dsgd_comm_ctx(comm)));
        if (g_rank == 0) {
            printf("np=%d count %zu: every algorithm, op and collective %s (%.2f s)\n", n, count,
                   g_failed == failed0 ? "ok" : "FAILED on rank 0", dsgd_now() - t0);
            fflush(stdout);
        }
        ref_free(&rf);
        free(buf);
        free(held);
        for (k = 0; k < n; ++k) free(in[k]);
    }
}

/* MAX and MIN propagate NaNs: rank k puts a NaN with payload k + 1 at
   element 3 + 5k, and rank 0 a second one at the last element. */
static void test_nan(dsgd_comm *comm, dsgd_comm *hook, dsgd_comm *blk, twin *tw) {
    enum { COUNT = 41 };
    float *in[8], buf[COUNT];
    int n = g_size, k, a, o;
    size_t i;
    for (k = 0; k < n; ++k) {
        uint32_t bits = 0x7FC00000u | (uint32_t)(k + 1);
        in[k] = (float *)malloc(COUNT * sizeof(float));
        free(tw->buf[k]);
        tw->buf[k] = (float *)malloc(COUNT * sizeof(float));
        if (!in[k] || !tw->buf[k]) MPI_Abort(MPI_COMM_WORLD, 2);
        for (i = 0; i < COUNT; ++i) in[k][i] = input_value(99, k, i);
        memcpy(&in[k][3 + 5 * k], &bits, sizeof(bits));
        if (k == 0) memcpy(&in[k][COUNT - 1], &bits, sizeof(bits));
    }
    for (a = 0; a <= NUM_ALGOS; ++a) /* NUM_ALGOS: AUTO on blk */
        for (o = 2; o < 4; ++o) {
            job j;
            int ok = 1;
            dsgd_comm *on = a == NUM_ALGOS ? blk : ALGOS[a] == DSGD_ALLREDUCE_AUTO ? hook : comm;
            memset(&j, 0, sizeof(j));
            j.kind = J_ALLREDUCE;
            j.algo = a == NUM_ALGOS ? DSGD_ALLREDUCE_AUTO : ALGOS[a];
            j.op = OPS[o];
            j.count = COUNT;
            memcpy(buf, in[g_rank], sizeof(buf));
            if (!check(run_job(on, &j, buf) == DSGD_OK, "np=%d NaN %s%s %s: %s", n, dsgd_allreduce_algo_name(j.algo),
                       on == blk ? " (blocking)" : "", dsgd_reduce_op_name(j.op), dsgd_ctx_last_error(dsgd_comm_ctx(on))))
                continue;
            for (i = 0; i < COUNT; ++i) {
                int want_nan = i == COUNT - 1 || (i >= 3 && (i - 3) % 5 == 0 && (int)((i - 3) / 5) < n);
                float want = in[0][i];
                if (!want_nan)
                    for (k = 1; k < n; ++k)
                        want = o == 2 ? (in[k][i] > want ? in[k][i] : want) : (in[k][i] < want ? in[k][i] : want);
                if (want_nan ? !isnan(buf[i]) : memcmp(&buf[i], &want, sizeof(float)) != 0) ok = 0;
            }
            check(ok, "np=%d NaN %s%s %s: NaNs not propagated (or other elements wrong)", n,
                  dsgd_allreduce_algo_name(j.algo), on == blk ? " (blocking)" : "", dsgd_reduce_op_name(j.op));
            check(same_on_all_ranks(buf, COUNT), "np=%d NaN %s %s: ranks differ in bits", n,
                  dsgd_allreduce_algo_name(j.algo), dsgd_reduce_op_name(j.op));
            if (j.algo != DSGD_ALLREDUCE_AUTO && check(twin_run(tw, &j, in), "np=%d NaN: loopback failed", n))
                check(memcmp(tw->buf[g_rank], buf, sizeof(buf)) == 0, "np=%d NaN %s %s: bits differ from the loopback's",
                      n, dsgd_allreduce_algo_name(j.algo), dsgd_reduce_op_name(j.op));
        }
    for (k = 0; k < n; ++k) free(in[k]);
}

/* Ranks that pass different counts all get DSGD_ERR_DESYNC from the
   agreement (over MPI messages), and the communicator goes on. */
static void test_agreement(dsgd_comm *comm) {
    float buf[64];
    size_t count = g_rank == g_size - 1 ? 41 : 40;
    dsgd_result r;
    int i;
    for (i = 0; i < 64; ++i) buf[i] = (float)i;
    r = dsgd_allreduce(comm, buf, count, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING, TIMEOUT_S);
    check(r == DSGD_ERR_DESYNC && strstr(dsgd_ctx_last_error(dsgd_comm_ctx(comm)), "count 41"),
          "agreement: got %s: %s", dsgd_result_string(r), dsgd_ctx_last_error(dsgd_comm_ctx(comm)));
    check(buf[10] == 10.0f, "agreement: the buffer was touched");
    r = dsgd_allreduce(comm, buf, 40, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, TIMEOUT_S);
    check(r == DSGD_OK && buf[10] == 10.0f * (float)g_size, "agreement: the communicator did not go on: %s",
          dsgd_ctx_last_error(dsgd_comm_ctx(comm)));
}

/* ---------------------------------------------------------------- the transport */

static void make_transport(dsgd_ctx *ctx, dsgd_transport_i *t) {
    dsgd_mpi_desc d;
    memset(&d, 0, sizeof(d));
    if (dsgd_mpi_transport_create(ctx, &d, t) != DSGD_OK) {
        printf("rank %d: dsgd_mpi_transport_create: %s\n", g_rank, dsgd_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static void fill(unsigned char *b, size_t n, int salt) {
    size_t i;
    for (i = 0; i < n; ++i) b[i] = (unsigned char)(i * 7 + (size_t)salt);
}

/* Tag and size mismatches between ranks 0 and 1, each on a fresh transport. */
static void test_mismatch(dsgd_ctx *ctx) {
    unsigned char out[64], got[64], want[64];
    dsgd_transport_i t;
    dsgd_result r;
    double t0, el;
    int src = -1;
    uint64_t tag = 0;
    size_t bytes = 0;
    /* a tag mismatch: the receiver returns at once */
    make_transport(ctx, &t);
    fill(out, 16, 1);
    if (g_rank == 0) check(t.send(t.impl, 1, 0x1111, out, 16, dsgd_now() + 10) == DSGD_OK, "mismatch: send");
    if (g_rank == 1) {
        t0 = dsgd_now();
        r = t.recv(t.impl, 0, 0x2222, got, 16, t0 + 10);
        el = dsgd_now() - t0;
        check(r == DSGD_ERR_DESYNC && el < 1.0, "tag mismatch: %s after %.3f s: %s", dsgd_result_string(r), el,
              t.error_message(t.impl));
        check(strstr(t.error_message(t.impl), "mpi rank 1: the message from rank 0 has tag") != NULL &&
                  strstr(t.error_message(t.impl), "0000000000001111, expected 0000000000002222") != NULL,
              "tag mismatch message: %s", t.error_message(t.impl));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t.destroy(t.impl);
    /* a size mismatch */
    make_transport(ctx, &t);
    fill(out, 32, 2);
    if (g_rank == 0) check(t.send(t.impl, 1, 0x3333, out, 32, dsgd_now() + 10) == DSGD_OK, "mismatch: send");
    if (g_rank == 1) {
        t0 = dsgd_now();
        r = t.recv(t.impl, 0, 0x3333, got, 16, t0 + 10);
        el = dsgd_now() - t0;
        check(r == DSGD_ERR_DESYNC && el < 1.0, "size mismatch: %s after %.3f s", dsgd_result_string(r), el);
        check(strstr(t.error_message(t.impl), "has 32 bytes, expected 16") != NULL, "size mismatch message: %s",
              t.error_message(t.impl));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t.destroy(t.impl);
    /* after probe, a mismatch leaves the message for the right recv */
    make_transport(ctx, &t);
    fill(out, 24, 3);
    if (g_rank == 0) check(t.send(t.impl, 1, 0x4444, out, 24, dsgd_now() + 10) == DSGD_OK, "mismatch: send");
    if (g_rank == 1) {
        r = t.probe(t.impl, dsgd_now() + 10, &src, &tag, &bytes);
        check(r == DSGD_OK && src == 0 && tag == 0x4444 && bytes == 24, "probe: %s src %d tag %llx bytes %zu",
              dsgd_result_string(r), src, (unsigned long long)tag, bytes);
        r = t.recv(t.impl, 0, 0x5555, got, 24, dsgd_now() + 10);
        check(r == DSGD_ERR_DESYNC, "probed mismatch: %s", dsgd_result_string(r));
        r = t.recv(t.impl, 0, 0x4444, got, 24, dsgd_now() + 10);
        fill(want, 24, 3);
        check(r == DSGD_OK && memcmp(got, want, 24) == 0, "the probed message after a mismatch: %s: %s",
              dsgd_result_string(r), t.error_message(t.impl));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t.destroy(t.impl);
#if DSGD_MPI_MAX_MESSAGE < 8192
    /* A payload of several MPI messages is received after its header: on a
       size mismatch nothing of it is taken, and the right recv gets it. */
    {
        enum { BIG = 10000 };
        unsigned char *big = (unsigned char *)malloc(BIG), *bgot = (unsigned char *)malloc(BIG);
        if (!big || !bgot) MPI_Abort(MPI_COMM_WORLD, 2);
        make_transport(ctx, &t);
        fill(big, BIG, 4);
        if (g_rank == 0) check(t.send(t.impl, 1, 0x7777, big, BIG, dsgd_now() + 10) == DSGD_OK, "big send");
        if (g_rank == 1) {
            r = t.recv(t.impl, 0, 0x7777, bgot, BIG - 4, dsgd_now() + 10);
            check(r == DSGD_ERR_DESYNC, "big size mismatch: %s", dsgd_result_string(r));
            r = t.recv(t.impl, 0, 0x7777, bgot, BIG, dsgd_now() + 10);
            check(r == DSGD_OK && memcmp(big, bgot, BIG) == 0, "the big message after a mismatch: %s: %s",
                  dsgd_result_string(r), t.error_message(t.impl));
        }
        MPI_Barrier(MPI_COMM_WORLD);
        t.destroy(t.impl);
        free(big);
        free(bgot);
    }
#endif
}

typedef struct aborter {
    dsgd_transport_i *t;
    double after;
} aborter;

static void *abort_later(void *p) {
    aborter *a = (aborter *)p;
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)(a->after * 1e9);
    nanosleep(&ts, NULL);
    a->t->abort(a->t->impl);
    return NULL;
}

/* probe: every rank but 0 sends 3 messages to rank 0, which probes and
   receives them all; timeouts of probe and recv leave the endpoint usable;
   abort from another thread ends a wait. */
static void test_probe_and_waits(dsgd_ctx *ctx) {
    dsgd_transport_i t;
    unsigned char out[64], got[64], want[64];
    int k, m, n = g_size;
    dsgd_result r;
    double t0, el;
    make_transport(ctx, &t);
    if (g_rank != 0) {
        for (m = 0; m < 3; ++m) {
            fill(out, (size_t)(8 * (m + 1)), g_rank * 10 + m);
            check(t.send(t.impl, 0, ((uint64_t)g_rank << 40) | (uint64_t)m, out, (size_t)(8 * (m + 1)),
                         dsgd_now() + 10) == DSGD_OK,
                  "probe: send %d", m);
        }
    } else {
        int next[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ok = 1;
        for (k = 0; k < 3 * (n - 1); ++k) {
            int src = -1;
            uint64_t tag = 0;
            size_t bytes = 0;
            r = t.probe(t.impl, dsgd_now() + 10, &src, &tag, &bytes);
            if (!check(r == DSGD_OK && src > 0 && src < n, "probe %d: %s: %s", k, dsgd_result_string(r),
                       t.error_message(t.impl)))
                break;
            m = next[src]++;
            ok &= tag == (((uint64_t)src << 40) | (uint64_t)m) && bytes == (size_t)(8 * (m + 1));
            r = t.recv(t.impl, src, tag, got, bytes, dsgd_now() + 10);
            fill(want, bytes, src * 10 + m);
            ok &= r == DSGD_OK && memcmp(got, want, bytes) == 0;
        }
        check(ok, "probe: messages out of order per source, or wrong");
        t0 = dsgd_now();
        {
            int src = 7;
            uint64_t tag;
            size_t bytes;
            r = t.probe(t.impl, t0 + 0.05, &src, &tag, &bytes);
            el = dsgd_now() - t0;
            check(r == DSGD_ERR_TIMEOUT && src == -1 && el < 0.5, "probe with nothing to receive: %s after %.3f s",
                  dsgd_result_string(r), el);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* a recv that times out leaves the endpoint usable */
    if (g_rank == 1) {
        t0 = dsgd_now();
        r = t.recv(t.impl, 0, 77, got, 16, t0 + 0.1);
        el = dsgd_now() - t0;
        check(r == DSGD_ERR_TIMEOUT && el < 0.5 && strstr(t.error_message(t.impl), "waiting for rank 0"),
              "recv timeout: %s after %.3f s: %s", dsgd_result_string(r), el, t.error_message(t.impl));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    fill(out, 16, 5);
    if (g_rank == 0) check(t.send(t.impl, 1, 77, out, 16, dsgd_now() + 10) == DSGD_OK, "send after a timeout");
    if (g_rank == 1) {
        r = t.recv(t.impl, 0, 77, got, 16, dsgd_now() + 10);
        check(r == DSGD_OK && memcmp(got, out, 16) == 0, "recv after a timeout: %s: %s", dsgd_result_string(r),
              t.error_message(t.impl));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* a long wait leaves the CPU: rank 0 sends 40 ms late, and rank 1's
       thread spends under a fifth of that on the CPU (it yields for 400
       us, then sleeps between polls; polling for 10 ms before sleeping,
       as it once did, is a quarter) */
    if (g_rank == 0) {
        struct timespec ts;
        ts.tv_sec = 0;
        ts.tv_nsec = 40000000;
        nanosleep(&ts, NULL);
        check(t.send(t.impl, 1, 80, out, 16, dsgd_now() + 10) == DSGD_OK, "late send");
    }
    if (g_rank == 1) {
        struct timespec c0, c1;
        double cpu;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        t0 = dsgd_now();
        r = t.recv(t.impl, 0, 80, got, 16, t0 + 10);
        el = dsgd_now() - t0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        check(r == DSGD_OK && memcmp(got, out, 16) == 0 && cpu < 0.2 * el,
              "a wait of %.1f ms for a late message: %s, %.2f ms of CPU (under a fifth expected)", el * 1e3,
              dsgd_result_string(r), cpu * 1e3);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    /* abort from another thread ends a wait, and every later call */
    if (g_rank == 1) {
        aborter a;
        pthread_t th;
        a.t = &t;
        a.after = 0.1;
        pthread_create(&th, NULL, abort_later, &a);
        t0 = dsgd_now();
        r = t.recv(t.impl, 0, 78, got, 16, t0 + 10);
        el = dsgd_now() - t0;
        pthread_join(th, NULL);
        check(r == DSGD_ERR_ABORTED && el < 1.0, "abort: %s after %.3f s", dsgd_result_string(r), el);
        r = t.send(t.impl, 0, 79, out, 16, dsgd_now() + 10);
        check(r == DSGD_ERR_ABORTED, "a send after abort: %s", dsgd_result_string(r));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t.destroy(t.impl);
}

/* ---------------------------------------------------------------- several endpoints per process */

/* --local K: K endpoints per process (dsgd_mpi_transport_create_local), a
   group of N = K * np ranks, group rank p * K + j on process p's thread j. */
typedef struct local_group {
    int k, n;                 /* endpoints per process, group size */
    dsgd_transport_i ep[8];
    dsgd_ctx *ctx[8];
    dsgd_comm *comm[8];
    float *buf[8];            /* endpoint j's buffer */
    float **in;               /* every group rank's inputs */
    job j;
    dsgd_result res[8];
} local_group;

typedef struct local_arg {
    local_group *g;
    int j;
} local_arg;

static void *local_thread(void *p) {
    local_arg *a = (local_arg *)p;
    local_group *g = a->g;
    int r = g->ep[a->j].rank;
    if (g->j.count) memcpy(g->buf[a->j], g->in[r], g->j.count * sizeof(float));
    g->res[a->j] = run_job(g->comm[a->j], &g->j, g->buf[a->j]);
    return NULL;
}

/* Runs fn(arg_j) on K threads, one per endpoint, and joins them. */
static void local_spawn(local_group *g, void *(*fn)(void *), void *args, size_t arg_size) {
    pthread_t th[8];
    int j;
    for (j = 0; j < g->k; ++j)
        if (pthread_create(&th[j], NULL, fn, (char *)args + (size_t)j * arg_size) != 0) {
            fprintf(stderr, "rank %d: pthread_create failed\n", g_rank);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    for (j = 0; j < g->k; ++j) pthread_join(th[j], NULL);
}

/* One collective on the K endpoints of every process at once, checked for
   each endpoint against the reference, across the whole group, and (an
   explicit algorithm, or a collective with one algorithm) against the
   loopback twin of N ranks. */
static void local_case(local_group *g, twin *tw, const job *jb, float **in, const ref *rf) {
    char name[128], why[160];
    local_arg args[8];
    size_t count = jb->count, b;
    int n = g->n, j, ok, all_ran = 1, twin_ok = 0;
    uint64_t h = 0, lo = 0, hi = 0;
    job_name(jb, name, sizeof(name));
    g->j = *jb;
    g->in = in;
    for (j = 0; j < g->k; ++j) {
        args[j].g = g;
        args[j].j = j;
    }
    local_spawn(g, local_thread, args, sizeof(args[0]));
    if (!(jb->kind == J_ALLREDUCE && jb->algo == DSGD_ALLREDUCE_AUTO))
        twin_ok = check(twin_run(tw, jb, in), "K=%d N=%d %s: the loopback run failed", g->k, n, name);
    for (j = 0; j < g->k; ++j) {
        int r = g->ep[j].rank;
        size_t off = 0, len = count;
        const float *buf = g->buf[j];
        if (!check(g->res[j] == DSGD_OK, "K=%d N=%d %s: group rank %d: %s", g->k, n, name, r,
                   dsgd_ctx_last_error(g->ctx[j]))) {
            all_ran = 0;
            continue;
        }
        ok = result_ok(jb, buf, in, rf, n, r, &off, &len, why, sizeof(why));
        check(ok, "K=%d N=%d %s: group rank %d: %s", g->k, n, name, r, why);
        if (j == 0) h = hash_bytes(buf, count * sizeof(float));
        else if (jb->kind != J_REDUCE_SCATTER)
            check(hash_bytes(buf, count * sizeof(float)) == h, "K=%d N=%d %s: group ranks %d and %d differ in bits",
                  g->k, n, name, g->ep[0].rank, r);
        if (twin_ok) {
            const float *mine = tw->buf[r];
            size_t m = jb->kind == J_REDUCE_SCATTER ? len : count, diff = m;
            for (b = 0; b < m; ++b)
                if (memcmp(&mine[off + b], &buf[off + b], sizeof(float)) != 0) {
                    diff = b;
                    break;
                }
            check(diff == m, "K=%d N=%d %s: group rank %d: element %zu differs from the loopback's bits (%.9g vs %.9g)",
                  g->k, n, name, r, off + diff, diff < m ? (double)buf[off + diff] : 0.0,
                  diff < m ? (double)mine[off + diff] : 0.0);
        }
    }
    if (jb->kind != J_REDUCE_SCATTER) { /* the same bits in every process (collective on the world) */
        if (!all_ran) h = (uint64_t)g_rank + 1;
        MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
        check(lo == hi, "K=%d N=%d %s: processes differ in bits", g->k, n, name);
    }
}

static void local_collectives(local_group *g, twin *tw) {
    size_t counts[6], count;
    int n = g->n, ci, a, o, k;
    counts[0] = 0;
    counts[1] = 1;
    counts[2] = (size_t)n - 1;
    counts[3] = (size_t)n + 1;
    counts[4] = 7919;   /* primes: no block size divides them */
    counts[5] = 100003;
    for (ci = 0; ci < 6; ++ci) {
        float *in[8];
        ref rf;
        job jb;
        double t0 = dsgd_now();
        long failed0 = g_failed;
        size_t i;
        count = counts[ci];
        for (k = 0; k < n; ++k) {
            in[k] = (float *)malloc((count + 1) * sizeof(float));
            free(tw->buf[k]);
            tw->buf[k] = (float *)malloc((count + 1) * sizeof(float));
            if (!in[k] || !tw->buf[k]) MPI_Abort(MPI_COMM_WORLD, 2);
            for (i = 0; i < count; ++i) in[k][i] = input_value(4321 + (uint64_t)ci, k, i);
        }
        for (k = 0; k < g->k; ++k) {
            free(g->buf[k]);
            g->buf[k] = (float *)malloc((count + 1) * sizeof(float));
            if (!g->buf[k]) MPI_Abort(MPI_COMM_WORLD, 2);
        }
        ref_compute(&rf, in, n, count);
        memset(&jb, 0, sizeof(jb));
        jb.count = count;
        jb.kind = J_ALLREDUCE;
        for (a = 0; a < NUM_LOCAL_ALGOS; ++a)
            for (o = 0; o < 4; ++o) {
                jb.algo = ALGOS[a];
                jb.op = OPS[o];
                local_case(g, tw, &jb, in, &rf);
            }
        jb.kind = J_REDUCE_SCATTER;
        for (o = 0; o < 4; ++o) {
            jb.op = OPS[o];
            local_case(g, tw, &jb, in, &rf);
        }
        jb.kind = J_ALLGATHER;
        local_case(g, tw, &jb, in, &rf);
        jb.kind = J_BROADCAST;
        for (k = 0; k < n; ++k) {
            jb.root = k;
            local_case(g, tw, &jb, in, &rf);
        }
        if (g_rank == 0) {
            printf("K=%d N=%d count %zu: every algorithm, op and collective %s (%.2f s)\n", g->k, n, count,
                   g_failed == failed0 ? "ok" : "FAILED on rank 0", dsgd_now() - t0);
            fflush(stdout);
        }
        ref_free(&rf);
        for (k = 0; k < n; ++k) free(in[k]);
    }
}

/* probe across endpoints: group ranks 0 and 1 (both in process 0 when K >=
   2) receive 3 messages from every other group rank, tags naming source,
   destination and sequence, probing any source concurrently; neither may
   see the other's messages, each source's come in order, and a last probe
   finds nothing. */
static void *probe_thread(void *p) {
    local_arg *a = (local_arg *)p;
    local_group *g = a->g;
    dsgd_transport_i *t = &g->ep[a->j];
    unsigned char out[64], got[64], want[64];
    int me = t->rank, n = g->n, dst, m, k;
    dsgd_result r;
    for (dst = 0; dst < 2 && dst < n; ++dst) {
        if (dst == me) continue;
        for (m = 0; m < 3; ++m) {
            size_t bytes = (size_t)(8 * (m + 1));
            fill(out, bytes, me * 10 + dst * 3 + m);
            r = t->send(t->impl, dst, ((uint64_t)me << 40) | ((uint64_t)dst << 32) | (uint64_t)m, out, bytes,
                        dsgd_now() + 20);
            check(r == DSGD_OK, "K=%d probe: group rank %d: send %d to %d: %s: %s", g->k, me, m, dst,
                  dsgd_result_string(r), t->error_message(t->impl));
        }
    }
    if (me < 2) {
        int next[8] = {0, 0, 0, 0, 0, 0, 0, 0}, ok = 1, src;
        uint64_t tag;
        size_t bytes;
        for (k = 0; k < 3 * (n - 1); ++k) {
            src = -1;
            r = t->probe(t->impl, dsgd_now() + 20, &src, &tag, &bytes);
            if (!check(r == DSGD_OK && src >= 0 && src < n && src != me, "K=%d probe %d on group rank %d: %s src %d: %s",
                       g->k, k, me, dsgd_result_string(r), src, t->error_message(t->impl))) {
                ok = 0;
                break;
            }
            m = next[src]++;
            if (tag != (((uint64_t)src << 40) | ((uint64_t)me << 32) | (uint64_t)m) || bytes != (size_t)(8 * (m + 1))) {
                printf("rank %d: group rank %d probed tag %016llx bytes %zu from %d, expected message %d\n", g_rank, me,
                       (unsigned long long)tag, bytes, src, m);
                ok = 0;
            }
            r = t->recv(t->impl, src, tag, got, bytes, dsgd_now() + 20);
            fill(want, bytes, src * 10 + me * 3 + m);
            ok &= r == DSGD_OK && memcmp(got, want, bytes) == 0;
        }
        check(ok, "K=%d probe on group rank %d: messages wrong, out of order or not addressed to it", g->k, me);
        src = 7;
        r = t->probe(t->impl, dsgd_now() + 0.05, &src, &tag, &bytes);
        check(r == DSGD_ERR_TIMEOUT && src == -1, "K=%d probe on group rank %d: a message left over: %s src %d",
              g->k, me, dsgd_result_string(r), src);
    }
    return NULL;
}

static int count_substr(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

static int mode_local(dsgd_ctx *ctx, int K) {
    local_group g;
    local_arg args[8];
    dsgd_transport_i bad[8], *huge;
    twin tw;
    dsgd_result r;
    char want[64], want2[64];
    double t0 = dsgd_now();
    int j, n = K * g_size, mine;
    memset(&g, 0, sizeof(g));
    g.k = K;
    g.n = n;
    if (K < 1 || n > 8) {
        if (g_rank == 0) fprintf(stderr, "mpi_collectives: --local K needs 1 <= K and K * np <= 8\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    /* the last process passes K + 1: every process fails, naming both counts */
    mine = g_rank == g_size - 1 ? K + 1 : K;
    memset(bad, 0x5A, sizeof(bad));
    r = dsgd_mpi_transport_create_local(ctx, NULL, mine, bad);
    snprintf(want, sizeof(want), "passes count %d, rank", mine == K ? K + 1 : K);
    snprintf(want2, sizeof(want2), "(this process) passes count %d", mine);
    check(r == DSGD_ERR_INVALID_ARGUMENT &&
              count_substr(dsgd_ctx_last_error(ctx), "every process must pass the same count") &&
              count_substr(dsgd_ctx_last_error(ctx), want) && count_substr(dsgd_ctx_last_error(ctx), want2),
          "K=%d: mismatched counts: %s: %s", K, dsgd_result_string(r), dsgd_ctx_last_error(ctx));
    check(bad[0].send == NULL && bad[K - 1].impl == NULL, "K=%d: mismatched counts: out not zeroed", K);
    if (g_rank == 0) printf("K=%d: mismatched counts: %s\n", K, dsgd_ctx_last_error(ctx));
    /* count 0 everywhere */
    r = dsgd_mpi_transport_create_local(ctx, NULL, 0, bad);
    check(r == DSGD_ERR_INVALID_ARGUMENT, "K=%d: count 0: %s", K, dsgd_result_string(r));
    /* too many endpoints for MPI_TAG_UB */
    huge = (dsgd_transport_i *)malloc(40000 * sizeof(*huge));
    if (!huge) MPI_Abort(MPI_COMM_WORLD, 2);
    r = dsgd_mpi_transport_create_local(ctx, NULL, 40000, huge);
    check(r == DSGD_ERR_UNSUPPORTED && count_substr(dsgd_ctx_last_error(ctx), "MPI_TAG_UB"),
          "K=%d: count 40000: %s: %s", K, dsgd_result_string(r), dsgd_ctx_last_error(ctx));
    if (g_rank == 0) printf("K=%d: count 40000: %s\n", K, dsgd_ctx_last_error(ctx));
    free(huge);
    /* count 1 through create_local: the native all-reduce is there */
    r = dsgd_mpi_transport_create_local(ctx, NULL, 1, bad);
    if (check(r == DSGD_OK && bad[0].allreduce != NULL && bad[0].rank == g_rank && bad[0].size == g_size,
              "K=%d: count 1: %s: %s", K, dsgd_result_string(r), dsgd_ctx_last_error(ctx))) {
        float x = 2.0f;
        check(bad[0].allreduce(bad[0].impl, &x, 1, DSGD_REDUCE_SUM, dsgd_now() + TIMEOUT_S) == DSGD_OK &&
                  x == 2.0f * (float)g_size,
              "K=%d: count 1: native all-reduce", K);
        bad[0].destroy(bad[0].impl);
    }
    /* the group */
    r = dsgd_mpi_transport_create_local(ctx, NULL, K, g.ep);
    if (!check(r == DSGD_OK, "K=%d: dsgd_mpi_transport_create_local: %s", K, dsgd_ctx_last_error(ctx)))
        MPI_Abort(MPI_COMM_WORLD, 2);
    for (j = 0; j < K; ++j) {
        check(g.ep[j].rank == g_rank * K + j && g.ep[j].size == n && strcmp(g.ep[j].name, "mpi") == 0 &&
                  (K == 1) == (g.ep[j].allreduce != NULL) && (K == 1) == (g.ep[j].share != NULL) &&
                  (K == 1) == (g.ep[j].share_window != NULL),
              "K=%d: endpoint %d: rank %d size %d (the native hook and the window only with K = 1)", K, j,
              g.ep[j].rank, g.ep[j].size);
        /* every process on this one machine: one node of n ranks */
        check(g.ep[j].ranks_per_node == n, "K=%d: endpoint %d: ranks_per_node %d, expected %d (one node)", K, j,
              g.ep[j].ranks_per_node, n);
        if (dsgd_ctx_create(NULL, &g.ctx[j]) != DSGD_OK || dsgd_comm_create(g.ctx[j], &g.ep[j], NULL, &g.comm[j]) != DSGD_OK)
            MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (K > 1)
        check(dsgd_allreduce_choose(g.comm[0], 1000) != DSGD_ALLREDUCE_AUTO, "K=%d: AUTO picks a native hook", K);
    twin_init(&tw, n);
    local_collectives(&g, &tw);
    twin_free(&tw);
    /* probe across endpoints */
    for (j = 0; j < K; ++j) {
        args[j].g = &g;
        args[j].j = j;
    }
    local_spawn(&g, probe_thread, args, sizeof(args[0]));
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) printf("K=%d N=%d: probe across endpoints done\n", K, n);
    /* a deadline names group ranks */
    if (g_rank == 0) {
        unsigned char b[16];
        dsgd_transport_i *t = &g.ep[K - 1];
        char w[96];
        r = t->recv(t->impl, n - 1, 5, b, sizeof(b), dsgd_now() + 0.05);
        snprintf(w, sizeof(w), "mpi rank %d: the deadline passed while waiting for rank %d", K - 1, n - 1);
        check(r == DSGD_ERR_TIMEOUT && count_substr(t->error_message(t->impl), w), "K=%d: timeout message: %s", K,
              t->error_message(t->impl));
    }
    /* abort on endpoint 0 ends endpoint K-1's wait (process 0 only) */
    if (g_rank == 0 && K > 1) {
        aborter a;
        pthread_t th;
        unsigned char b[16];
        double el, ta;
        a.t = &g.ep[0];
        a.after = 0.1;
        pthread_create(&th, NULL, abort_later, &a);
        ta = dsgd_now();
        r = g.ep[K - 1].recv(g.ep[K - 1].impl, n - 1, 6, b, sizeof(b), ta + 10);
        el = dsgd_now() - ta;
        pthread_join(th, NULL);
        check(r == DSGD_ERR_ABORTED && el < 1.0, "K=%d: abort on endpoint 0 ends endpoint %d's wait: %s after %.3f s",
              K, K - 1, dsgd_result_string(r), el);
        r = g.ep[0].send(g.ep[0].impl, n - 1, 7, b, sizeof(b), dsgd_now() + 10);
        check(r == DSGD_ERR_ABORTED, "K=%d: a send after abort: %s", K, dsgd_result_string(r));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    for (j = 0; j < K; ++j) {
        dsgd_comm_destroy(g.comm[j]);
        dsgd_ctx_destroy(g.ctx[j]);
        free(g.buf[j]);
    }
    for (j = K - 1; j >= 0; --j) g.ep[j].destroy(g.ep[j].impl); /* the last one frees the duplicate */
    if (g_rank == 0) printf("K=%d N=%d: done in %.2f s\n", K, n, dsgd_now() - t0);
    return summary();
}

/* ---------------------------------------------------------------- shared memory */

/* Every rank is on this machine, so the endpoint has a shared-memory
   window; no_share leaves it out (DIRECT is then DSGD_ERR_UNSUPPORTED); a
   process with another window size fails creation on every process, naming
   both sizes; share refuses a buffer that is not the window. */
static void test_share_setup(dsgd_ctx *ctx) {
    dsgd_transport_i t;
    dsgd_mpi_desc d;
    dsgd_comm *comm = NULL;
    dsgd_result r;
    size_t bytes = 0;
    float x[4] = {1, 2, 3, 4};
    void *peers[8];
    int failed = 0;
    make_transport(ctx, &t);
    check(t.share && t.unshare && t.share_window && t.share_window(t.impl, &bytes) != NULL &&
              bytes == DSGD_MPI_SHARE_BYTES,
          "share: the endpoint on one node has a window of %d bytes (got %zu)", DSGD_MPI_SHARE_BYTES, bytes);
    r = t.share(t.impl, 1, x, peers, dsgd_now() + 1.0, &failed);
    check(r == DSGD_ERR_INVALID_ARGUMENT && strstr(t.error_message(t.impl), "share_window"),
          "share: a buffer other than the window: %s: %s", dsgd_result_string(r), t.error_message(t.impl));
    t.destroy(t.impl);
    memset(&d, 0, sizeof(d));
    d.no_share = 1;
    r = dsgd_mpi_transport_create(ctx, &d, &t);
    if (check(r == DSGD_OK && !t.share && !t.unshare && !t.share_window, "share: no_share: %s",
              dsgd_ctx_last_error(ctx))) {
        if (dsgd_comm_create(ctx, &t, NULL, &comm) != DSGD_OK) MPI_Abort(MPI_COMM_WORLD, 2);
        r = dsgd_allreduce(comm, x, 4, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_DIRECT, TIMEOUT_S);
        check(r == DSGD_ERR_UNSUPPORTED, "share: DIRECT with no_share: %s", dsgd_result_string(r));
        check(dsgd_allreduce_choose(comm, 1000) == DSGD_ALLREDUCE_AUTO, "share: AUTO with no_share is not the hook");
        dsgd_comm_destroy(comm);
        t.destroy(t.impl);
    }
    memset(&d, 0, sizeof(d));
    if (g_rank == g_size - 1) d.share_bytes = 8192;
    r = dsgd_mpi_transport_create(ctx, &d, &t);
    check(r == DSGD_ERR_INVALID_ARGUMENT && strstr(dsgd_ctx_last_error(ctx), "8192") &&
              strstr(dsgd_ctx_last_error(ctx), "share_bytes") && t.impl == NULL,
          "share: another window size on rank %d: %s: %s", g_size - 1, dsgd_result_string(r),
          dsgd_ctx_last_error(ctx));
    if (r == DSGD_OK) t.destroy(t.impl);
}

/* --share-deadline: DIRECT over the windows, four all-reduces, then the
   last rank sleeps 1.5 s before all-reduce #5: the others must get
   DSGD_ERR_TIMEOUT naming it and #5 within the deadline (0.5 s) + 100 ms;
   the sleeper, arriving late, must get DSGD_ERR_ABORTED at once (a rank
   withdrew its window), not wait out its own deadline (5 s). Then the job
   ends normally (the windows are not freed). */
static int mode_share_deadline(dsgd_ctx *ctx) {
    dsgd_transport_i t;
    dsgd_comm *comm = NULL;
    float buf[1000];
    char want[32];
    int i, k, late = g_size - 1;
    double t0, el;
    dsgd_result r;
    const char *msg;
    alarm(60);
    make_transport(ctx, &t);
    if (!check(t.share != NULL, "share deadline: no window") || dsgd_comm_create(ctx, &t, NULL, &comm) != DSGD_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    for (k = 1; k <= 4; ++k) {
        for (i = 0; i < 1000; ++i) buf[i] = 1.0f;
        check(dsgd_allreduce(comm, buf, 1000, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_DIRECT, TIMEOUT_S) == DSGD_OK &&
                  buf[999] == (float)g_size,
              "share deadline: all-reduce #%d: %s", k, dsgd_ctx_last_error(ctx));
    }
    if (g_rank == late) {
        struct timespec ts;
        ts.tv_sec = 1;
        ts.tv_nsec = 500000000L;
        nanosleep(&ts, NULL);
    }
    t0 = dsgd_now();
    r = dsgd_allreduce(comm, buf, 1000, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_DIRECT, g_rank == late ? 5.0 : 0.5);
    el = dsgd_now() - t0;
    msg = dsgd_ctx_last_error(ctx);
    if (g_rank != late) {
        snprintf(want, sizeof(want), "rank %d", late);
        check(r == DSGD_ERR_TIMEOUT, "share deadline: all-reduce #5 returned %s", dsgd_result_string(r));
        check(strstr(msg, want) != NULL && strstr(msg, "#5") != NULL, "share deadline: message: %s", msg);
        /* at np > 2 a rank may learn of the timeout from a peer that timed out a moment earlier */
        check(el >= 0.45 && el <= 0.6, "share deadline: returned after %.3f s (deadline 0.5 s)", el);
    } else {
        check(r == DSGD_ERR_ABORTED && strstr(msg, "withdrew") != NULL,
              "share deadline: the late rank got %s: %s", dsgd_result_string(r), msg);
        check(el < 0.1, "share deadline: the late rank returned after %.3f s (its deadline 5 s)", el);
    }
    printf("rank %d: %s after %.3f s: %s\n", g_rank, dsgd_result_string(r), el, msg);
    r = dsgd_allreduce(comm, buf, 1000, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_DIRECT, 1.0);
    check(r == DSGD_ERR_STATE, "share deadline: the broken communicator: %s", dsgd_result_string(r));
    dsgd_comm_destroy(comm);
    t.destroy(t.impl); /* does not free the withdrawn window (MPI_Win_free would wait for every rank) */
    return summary();
}

/* ---------------------------------------------------------------- modes */

static int mode_suite(dsgd_ctx *ctx) {
    dsgd_transport_i t, th, tb;
    dsgd_mpi_desc d;
    dsgd_comm *comm = NULL, *hook = NULL, *blk = NULL;
    twin tw;
    double t0 = dsgd_now();
    make_transport(ctx, &t);
    memset(&d, 0, sizeof(d));
    d.no_share = 1;
    if (dsgd_mpi_transport_create(ctx, &d, &th) != DSGD_OK || dsgd_comm_create(ctx, &th, NULL, &hook) != DSGD_OK) {
        printf("rank %d: the no_share endpoint: %s\n", g_rank, dsgd_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    d.blocking_allreduce = 1;
    if (dsgd_mpi_transport_create(ctx, &d, &tb) != DSGD_OK || dsgd_comm_create(ctx, &tb, NULL, &blk) != DSGD_OK) {
        printf("rank %d: the blocking_allreduce endpoint: %s\n", g_rank, dsgd_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    check(dsgd_allreduce_choose(blk, 1000) == DSGD_ALLREDUCE_AUTO,
          "np=%d: AUTO on the blocking_allreduce endpoint is not the hook", g_size);
    check(dsgd_allreduce_choose(hook, 1000) == DSGD_ALLREDUCE_AUTO, "np=%d: AUTO without a window is not the hook",
          g_size);
    check(t.rank == g_rank && t.size == g_size && strcmp(t.name, "mpi") == 0, "the endpoint's rank and size");
    if (dsgd_comm_create(ctx, &t, NULL, &comm) != DSGD_OK) {
        printf("rank %d: dsgd_comm_create: %s\n", g_rank, dsgd_ctx_last_error(ctx));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    twin_init(&tw, g_size);
    test_collectives(comm, hook, blk, &tw);
    test_nan(comm, hook, blk, &tw);
    test_agreement(comm);
    twin_free(&tw);
    dsgd_comm_destroy(hook);
    th.destroy(th.impl);
    dsgd_comm_destroy(blk);
    tb.destroy(tb.impl);
    dsgd_comm_destroy(comm);
    t.destroy(t.impl);
    test_mismatch(ctx);
    test_probe_and_waits(ctx);
    test_share_setup(ctx);
    if (g_rank == 0) printf("np=%d: done in %.2f s\n", g_size, dsgd_now() - t0);
    return summary();
}

static int mode_deadline(dsgd_ctx *ctx) {
    dsgd_transport_i t;
    dsgd_mpi_desc d;
    dsgd_comm *comm = NULL;
    float buf[1000];
    int i, k;
    /* no window, so that AUTO runs the native hook (MPI_Allreduce on its
       helper thread): MPI cannot cancel it, hence dsgd_mpi_abort */
    memset(&d, 0, sizeof(d));
    d.no_share = 1;
    if (dsgd_mpi_transport_create(ctx, &d, &t) != DSGD_OK ||
        dsgd_comm_create(ctx, &t, NULL, &comm) != DSGD_OK ||
        !check(dsgd_allreduce_choose(comm, 1000) == DSGD_ALLREDUCE_AUTO, "deadline: AUTO is not the native hook"))
        MPI_Abort(MPI_COMM_WORLD, 2);
    for (k = 1; k <= 4; ++k) {
        for (i = 0; i < 1000; ++i) buf[i] = 1.0f;
        check(dsgd_allreduce(comm, buf, 1000, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, TIMEOUT_S) == DSGD_OK &&
                  buf[999] == (float)g_size,
              "deadline: all-reduce #%d: %s", k, dsgd_ctx_last_error(ctx));
    }
    if (g_rank == 1) {
        fflush(stdout);
        sleep(30); /* past the deadline: the job ends before this returns */
    }
    if (g_rank == 0) {
        struct timespec now;
        double t0 = dsgd_now(), el;
        dsgd_result r = dsgd_allreduce(comm, buf, 1000, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, 0.5);
        const char *msg = dsgd_ctx_last_error(ctx);
        el = dsgd_now() - t0;
        check(r == DSGD_ERR_TIMEOUT, "deadline: all-reduce #5 returned %s", dsgd_result_string(r));
        check(strstr(msg, "rank 1") != NULL && strstr(msg, "#5") != NULL, "deadline: message: %s", msg);
        check(el >= 0.5 && el <= 0.6, "deadline: returned after %.3f s (deadline 0.5 s)", el);
        printf("deadline check %s: %s (returned after %.3f s)\n", g_failed ? "FAILED" : "passed", msg, el);
        printf("%ld passed, %ld failed\n", g_passed, g_failed);
        clock_gettime(CLOCK_REALTIME, &now);
        printf("aborting at %.3f\n", (double)now.tv_sec + (double)now.tv_nsec * 1e-9);
        dsgd_mpi_abort(g_failed ? 4 : 3);
    }
    return 1; /* not reached at np = 2 */
}

/* MPI's name of a thread level, as the library's messages spell it. */
static const char *level_name(int level) {
    if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
    if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
    if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
    return "MPI_THREAD_MULTIPLE";
}

static int mode_levels(dsgd_ctx *ctx, int *argc, char ***argv) {
    dsgd_transport_i t;
    dsgd_mpi_desc d;
    dsgd_result r;
    int provided = -1, reported = -1;
    memset(&d, 0, sizeof(d));
    r = dsgd_mpi_transport_create(ctx, &d, &t);
    check(r == DSGD_ERR_STATE && strstr(dsgd_ctx_last_error(ctx), "not initialised"),
          "levels: create before MPI_Init: %s: %s", dsgd_result_string(r), dsgd_ctx_last_error(ctx));
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    r = dsgd_mpi_init(ctx, argc, argv, &reported);
    check(r == DSGD_OK && reported == provided, "levels: dsgd_mpi_init on an initialised MPI: %s, level %d vs %d",
          dsgd_result_string(r), reported, provided);
    if (provided == MPI_THREAD_FUNNELED) {
        r = dsgd_mpi_transport_create(ctx, &d, &t);
        check(r == DSGD_ERR_UNSUPPORTED && strstr(dsgd_ctx_last_error(ctx), "MPI provides MPI_THREAD_FUNNELED") &&
                  strstr(dsgd_ctx_last_error(ctx), "needs MPI_THREAD_SERIALIZED"),
              "levels: default level on FUNNELED: %s: %s", dsgd_result_string(r), dsgd_ctx_last_error(ctx));
        check(t.send == NULL, "levels: *out not zeroed on failure");
    } else if (g_rank == 0) {
        printf("levels: MPI provided level %d for FUNNELED; the refusal is not checked\n", provided);
    }
    if (provided < MPI_THREAD_MULTIPLE) {
        /* two endpoints per process need MPI_THREAD_MULTIPLE, whatever the program asks */
        dsgd_transport_i two[2];
        d.thread_level = MPI_THREAD_FUNNELED;
        memset(two, 0x5A, sizeof(two));
        r = dsgd_mpi_transport_create_local(ctx, &d, 2, two);
        check(r == DSGD_ERR_UNSUPPORTED && strstr(dsgd_ctx_last_error(ctx), level_name(provided)) &&
                  strstr(dsgd_ctx_last_error(ctx), "need MPI_THREAD_MULTIPLE") && two[1].impl == NULL,
              "levels: 2 endpoints per process on level %d: %s: %s", provided, dsgd_result_string(r),
              dsgd_ctx_last_error(ctx));
        d.thread_level = 0;
    }
    d.thread_level = 99;
    r = dsgd_mpi_transport_create(ctx, &d, &t);
    check(r == DSGD_ERR_INVALID_ARGUMENT, "levels: thread_level 99: %s", dsgd_result_string(r));
    d.thread_level = MPI_THREAD_FUNNELED;
    r = dsgd_mpi_transport_create(ctx, &d, &t);
    if (check(r == DSGD_OK, "levels: FUNNELED asked: %s: %s", dsgd_result_string(r), dsgd_ctx_last_error(ctx))) {
        float x = 1.0f;
        dsgd_comm *comm = NULL;
        check(dsgd_comm_create(ctx, &t, NULL, &comm) == DSGD_OK &&
                  dsgd_allreduce(comm, &x, 1, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, TIMEOUT_S) == DSGD_OK &&
                  x == (float)g_size,
              "levels: an all-reduce on FUNNELED: %s", dsgd_ctx_last_error(ctx));
        dsgd_comm_destroy(comm);
        t.destroy(t.impl);
    }
    /* blocking_allreduce calls MPI_Allreduce on the caller's thread: the
       native hook at any level (below MULTIPLE it is MPI_Iallreduce else) */
    d.no_share = 1;
    d.blocking_allreduce = 1;
    r = dsgd_mpi_transport_create(ctx, &d, &t);
    if (check(r == DSGD_OK && t.allreduce != NULL, "levels: blocking_allreduce on FUNNELED: %s: %s",
              dsgd_result_string(r), dsgd_ctx_last_error(ctx))) {
        float v[1001];
        int k, ok = 1;
        for (k = 0; k < 1001; ++k) v[k] = (float)(k + g_rank);
        r = t.allreduce(t.impl, v, 1001, DSGD_REDUCE_MEAN, dsgd_now() + TIMEOUT_S);
        /* the mean of k, k + 1, ..., k + size - 1: exact in float here */
        for (k = 0; k < 1001; ++k) ok &= v[k] == (float)k + (float)(g_size - 1) / 2.0f;
        check(r == DSGD_OK && ok, "levels: blocking_allreduce MEAN on FUNNELED: %s: %s", dsgd_result_string(r),
              t.error_message(t.impl));
        t.destroy(t.impl);
    }
    return summary();
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx = NULL;
    int rc, provided = -1, levels = 0, deadline = 0, share_deadline = 0, local = 0, i;
    for (i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--levels") == 0) levels = 1;
        else if (strcmp(argv[i], "--deadline") == 0) deadline = 1;
        else if (strcmp(argv[i], "--share-deadline") == 0) share_deadline = 1;
        else if (strcmp(argv[i], "--local") == 0 && i + 1 < argc) local = atoi(argv[++i]);
    }
    signal(SIGALRM, on_alarm);
    alarm(500);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 2;
    if (levels) {
        rc = mode_levels(ctx, &argc, &argv);
    } else {
        if (dsgd_mpi_init(ctx, &argc, &argv, &provided) != DSGD_OK) {
            fprintf(stderr, "dsgd_mpi_init: %s\n", dsgd_ctx_last_error(ctx));
            return 2;
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &g_size);
        if (g_size > 8) {
            if (g_rank == 0) fprintf(stderr, "mpi_collectives: at most 8 ranks\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        check(provided == MPI_THREAD_MULTIPLE, "dsgd_mpi_init provided level %d", provided);
        rc = deadline ? mode_deadline(ctx)
             : share_deadline ? mode_share_deadline(ctx)
             : local ? mode_local(ctx, local) : mode_suite(ctx);
    }
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return rc;
}
