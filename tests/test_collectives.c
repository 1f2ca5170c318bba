/* test_collectives.c - the loopback transport and the collectives.

   Every collective and reduce op for N = 1..8 ranks (one pthread each) at
   counts {0, 1, N-1, N+1, 1000003}, checked against a serial double-precision
   computation from the same seeded per-rank inputs; all ranks bitwise
   identical; same bits run after run and whatever the piece size; a transport
   with only send/recv gives the same bits as the loopback's zero-copy path;
   a rank that never calls makes every other rank time out within the
   deadline, with a message naming it and the sequence number; abort wakes
   waiters; bad arguments are rejected; ranks that disagree on a call (count
   +-1, +- one piece, 0; op, root, algorithm, collective) all get
   DSGD_ERR_DESYNC at once with no buffer touched, on every algorithm.
   The loopback transport's own probe is tested in test_loopback.c.

   Worker threads never call cmocka's assertions (they longjmp); they record
   results that the main thread checks after joining. A watchdog (alarm)
   ends the program if a test hangs.

   make test runs each distinct case once (tests/harness.h's tu_full): the
   reduce ops take turns over the counts and algorithms instead of running
   at all of them, the sweeps keep their corners, the large count is
   100003, and the deadline tests run their cases side by side; make
   test-full (DSGD_TEST_FULL=1) runs everything. Each thinned loop says
   what it keeps.

   Environment: DSGD_TEST_LARGE=<count> replaces the large count (default
   1000003 in make test-full, 100003 in make test and under ThreadSanitizer,
   which is ~10x slower).

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll_ref.h"

#define MAXN 8
#define NUM_ALGOS 6
static const dsgd_allreduce_algo ALGOS[NUM_ALGOS] = {
    DSGD_ALLREDUCE_AUTO, DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_HALVING_DOUBLING,
    DSGD_ALLREDUCE_REDUCE_BROADCAST, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, DSGD_ALLREDUCE_DIRECT};
static const dsgd_reduce_op OPS[4] = {DSGD_REDUCE_SUM, DSGD_REDUCE_MEAN, DSGD_REDUCE_MAX, DSGD_REDUCE_MIN};

/* The large count. make test takes ThreadSanitizer's 100003 in every
   build: blocks still over the loopback's 64 KiB eager limit at N = 3 and
   5 (rendezvous messages), and many 16 KiB pieces where a test asks for
   them. */
static size_t large_count(void) {
    const char *e = getenv("DSGD_TEST_LARGE");
    if (e && atol(e) > 0) return (size_t)atol(e);
    return TU_TSAN ? 100003 : TU_PICK(1000003, 100003);
}

/* Whether reduce-scatter, all-gather and broadcast take the large count at
   N ranks: always, but under ThreadSanitizer in make test only at N = 2, 3
   and 4 (its cost grows with N; the small counts still run at every N). */
static int large_at(int n) { return tu_full() || !TU_TSAN || (n >= 2 && n <= 4); }

/* ---------------------------------------------------------------- inputs */

/* Input of rank r at element i: uniform in (-scale, scale), the scale
   varying with r and i so that sums mix magnitudes. */
static float input_value(uint64_t seed, int r, size_t i) {
    static const double scale[4] = {1.0, 100.0, 0.01, 3.0};
    uint64_t s = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)(r + 1) << 40) ^ (uint64_t)i;
    double u = dsgd_rng_uniform(&s);
    return (float)((2.0 * u - 1.0) * scale[((size_t)r + i) & 3]);
}

static void fill_inputs(float *buf, uint64_t seed, int r, size_t count) {
    size_t i;
    for (i = 0; i < count; ++i) buf[i] = input_value(seed, r, i);
}

/* The reference over every rank's input_value (tests/coll_ref.h). */
static void ref_compute(ref *rf, uint64_t seed, int n, size_t count) {
    size_t i;
    int r;
    assert_true(ref_init(rf, count));
    for (i = 0; i < count; ++i)
        for (r = 0; r < n; ++r) ref_add(rf, r, i, input_value(seed, r, i));
}

/* Checks got[lo..hi) against the reference; returns 0 or prints the first
   mismatch and returns 1. */
static int verify(const float *got, const ref *rf, dsgd_reduce_op op, int n, size_t lo, size_t hi,
                  const char *what) {
    double want = 0, tol = 0;
    size_t i = ref_mismatch(got, rf, op, n, lo, hi, &want, &tol);
    if (i == hi) return 0;
    print_error("%s: element %zu = %.9g, want %.9g (tol %.3g), N=%d op=%s\n", what, i, (double)got[i], want, tol, n,
                dsgd_reduce_op_name(op));
    return 1;
}

/* ---------------------------------------------------------------- groups */

typedef struct group {
    int n;
    dsgd_ctx *main_ctx;
    dsgd_loopback *hub;
    dsgd_ctx *ctx[MAXN];
    dsgd_comm *comm[MAXN];
    dsgd_transport_i ep[MAXN];
} group;

/* minimal: strip the endpoints to send/recv, as a plain transport would be. */
static void group_init(group *g, int n, const dsgd_comm_desc *desc, int minimal) {
    int r;
    memset(g, 0, sizeof(*g));
    g->n = n;
    assert_int_equal(dsgd_ctx_create(NULL, &g->main_ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(g->main_ctx, n, &g->hub), DSGD_OK);
    for (r = 0; r < n; ++r) {
        char label[32];
        dsgd_ctx_desc cd;
        memset(&cd, 0, sizeof(cd));
        snprintf(label, sizeof(label), "replica %d", r);
        cd.label = label;
        assert_int_equal(dsgd_ctx_create(&cd, &g->ctx[r]), DSGD_OK);
        assert_int_equal(dsgd_loopback_endpoint(g->hub, r, &g->ep[r]), DSGD_OK);
        if (minimal) {
            g->ep[r].sendrecv = NULL;
            g->ep[r].sendrecv_reduce = NULL;
            g->ep[r].sendrecv_upto = NULL;
            g->ep[r].set_progress = NULL;
            g->ep[r].peer_progress = NULL;
            g->ep[r].share = NULL;
            g->ep[r].unshare = NULL;
        }
        assert_int_equal(dsgd_comm_create(g->ctx[r], &g->ep[r], desc, &g->comm[r]), DSGD_OK);
    }
}

static void group_free(group *g) {
    int r;
    for (r = 0; r < g->n; ++r) {
        dsgd_comm_destroy(g->comm[r]);
        dsgd_ctx_destroy(g->ctx[r]);
    }
    dsgd_loopback_destroy(g->hub);
    dsgd_ctx_destroy(g->main_ctx);
}

enum { J_ALLREDUCE, J_REDUCE_SCATTER, J_ALLGATHER, J_BROADCAST, J_BARRIER, J_BARRIER_COUNT };

typedef struct job {
    int kind;
    dsgd_reduce_op op;
    dsgd_allreduce_algo algo;
    int root;
    double timeout;
    int skip_rank;        /* this rank never calls; -1: none */
    size_t count[MAXN];   /* per rank; normally all equal */
    int rounds;           /* J_BARRIER_COUNT */
    int late_rank;        /* this rank starts late_s seconds late; -1: none */
    double late_s;
    int *counter;         /* J_BARRIER_COUNT: shared */
    const struct job *alt; /* rank alt_rank runs this job instead (NULL: none) */
    int alt_rank;
    size_t bucket, upto;   /* J_ALLREDUCE: buckets of this many floats up to element upto, then one
                              bucket of the rest, each with dsgd_allreduce_at (0: one plain call) */
    dsgd_wire wire;        /* J_ALLREDUCE: not F32: dsgd_allreduce_wire, also for the buckets */
} job;

typedef struct worker {
    group *g;
    int rank;
    const job *jb;
    float *buf;
    dsgd_result res;
    double elapsed;
    char msg[1024];
    int barrier_bad; /* J_BARRIER_COUNT: rounds where the count was short */
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    const job *jb = w->jb->alt && w->rank == w->jb->alt_rank ? w->jb->alt : w->jb;
    dsgd_comm *c = w->g->comm[w->rank];
    double t0 = dsgd_now();
    int k;
    w->res = DSGD_OK;
    w->msg[0] = '\0';
    if (w->rank == jb->skip_rank) return NULL;
    if (w->rank == jb->late_rank) {
        struct timespec ts;
        ts.tv_sec = (time_t)jb->late_s;
        ts.tv_nsec = (long)((jb->late_s - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
        t0 = dsgd_now();
    }
    switch (jb->kind) {
    case J_ALLREDUCE:
        if (jb->bucket) {
            size_t o, len, count = jb->count[w->rank];
            for (o = 0; o < count && w->res == DSGD_OK; o += len) {
                len = o < jb->upto ? (jb->bucket < jb->upto - o ? jb->bucket : jb->upto - o) : count - o;
                w->res = jb->wire ? dsgd_allreduce_wire(c, w->buf + o, len, o, jb->op, jb->algo, jb->wire, jb->timeout)
                                  : dsgd_allreduce_at(c, w->buf + o, len, o, jb->op, jb->algo, jb->timeout);
            }
            break;
        }
        if (jb->wire)
            w->res = dsgd_allreduce_wire(c, w->buf, jb->count[w->rank], 0, jb->op, jb->algo, jb->wire, jb->timeout);
        else
            w->res = dsgd_allreduce(c, w->buf, jb->count[w->rank], jb->op, jb->algo, jb->timeout);
        break;
    case J_REDUCE_SCATTER:
        w->res = dsgd_reduce_scatter(c, w->buf, jb->count[w->rank], jb->op, jb->timeout);
        break;
    case J_ALLGATHER: w->res = dsgd_allgather(c, w->buf, jb->count[w->rank], jb->timeout); break;
    case J_BROADCAST: w->res = dsgd_broadcast(c, w->buf, jb->count[w->rank], jb->root, jb->timeout); break;
    case J_BARRIER: w->res = dsgd_barrier(c, jb->timeout); break;
    case J_BARRIER_COUNT:
        for (k = 0; k < jb->rounds && w->res == DSGD_OK; ++k) {
            __atomic_add_fetch(jb->counter, 1, __ATOMIC_SEQ_CST);
            w->res = dsgd_barrier(c, jb->timeout);
            if (__atomic_load_n(jb->counter, __ATOMIC_SEQ_CST) < (k + 1) * w->g->n) w->barrier_bad++;
        }
        break;
    default: break;
    }
    w->elapsed = dsgd_now() - t0;
    if (w->res != DSGD_OK) snprintf(w->msg, sizeof(w->msg), "%s", dsgd_ctx_last_error(w->g->ctx[w->rank]));
    return NULL;
}

/* Starts jb on every rank of g, rank r on bufs[r], one thread per rank
   (th[r]); join_job waits for them. */
static void start_job(group *g, const job *jb, float **bufs, worker *w, pthread_t *th) {
    int r;
    for (r = 0; r < g->n; ++r) {
        memset(&w[r], 0, sizeof(w[r]));
        w[r].g = g;
        w[r].rank = r;
        w[r].jb = jb;
        w[r].buf = bufs ? bufs[r] : NULL;
        assert_int_equal(pthread_create(&th[r], NULL, worker_main, &w[r]), 0);
    }
}

static void join_job(group *g, pthread_t *th) {
    int r;
    for (r = 0; r < g->n; ++r) assert_int_equal(pthread_join(th[r], NULL), 0);
}

/* Runs jb on every rank of g, rank r on bufs[r], one thread per rank. */
static void run_job(group *g, const job *jb, float **bufs, worker *w) {
    pthread_t th[MAXN];
    start_job(g, jb, bufs, w, th);
    join_job(g, th);
}

static void job_init(job *jb, int kind, size_t count) {
    int r;
    memset(jb, 0, sizeof(*jb));
    jb->kind = kind;
    jb->skip_rank = -1;
    jb->late_rank = -1;
    for (r = 0; r < MAXN; ++r) jb->count[r] = count;
}

static void assert_all_ok(group *g, worker *w, const char *what) {
    int r;
    for (r = 0; r < g->n; ++r) {
        if (w[r].res != DSGD_OK) print_error("%s: rank %d: %s\n", what, r, w[r].msg);
        assert_int_equal(w[r].res, DSGD_OK);
    }
}

static void assert_ranks_identical(group *g, float **bufs, size_t count, const char *what) {
    int r;
    for (r = 1; r < g->n; ++r) {
        if (count && memcmp(bufs[0], bufs[r], count * sizeof(float)) != 0) {
            print_error("%s: rank %d differs from rank 0 (N=%d, count %zu)\n", what, r, g->n, count);
            fail();
        }
    }
}

/* The first i < count where a[i] and b[i] differ in their bits, or count
   (one memcmp of the whole first: the sanitizers intercept every call). */
static size_t first_diff(const float *a, const float *b, size_t count) {
    size_t i;
    if (!count || memcmp(a, b, count * sizeof(float)) == 0) return count;
    for (i = 0; i < count && memcmp(&a[i], &b[i], sizeof(float)) == 0; ++i) {}
    return i;
}

static float **alloc_bufs(int n, size_t count) {
    float **b = (float **)calloc((size_t)n, sizeof(float *));
    int r;
    assert_non_null(b);
    for (r = 0; r < n; ++r) {
        b[r] = (float *)malloc((count + 1) * sizeof(float));
        assert_non_null(b[r]);
    }
    return b;
}

static void free_bufs(float **b, int n) {
    int r;
    for (r = 0; r < n; ++r) free(b[r]);
    free(b);
}

/* One all-reduce on g with the given inputs; checks success, the values and
   that all ranks hold the same bits. Leaves the result in bufs. */
static void check_allreduce(group *g, float **bufs, const ref *rf, uint64_t seed, size_t count,
                            dsgd_reduce_op op, dsgd_allreduce_algo algo) {
    job jb;
    worker w[MAXN];
    char what[128];
    int r;
    snprintf(what, sizeof(what), "allreduce N=%d count=%zu op=%s algo=%s", g->n, count, dsgd_reduce_op_name(op),
             dsgd_allreduce_algo_name(algo));
    for (r = 0; r < g->n; ++r) fill_inputs(bufs[r], seed, r, count);
    job_init(&jb, J_ALLREDUCE, count);
    jb.op = op;
    jb.algo = algo;
    run_job(g, &jb, bufs, w);
    assert_all_ok(g, w, what);
    if (verify(bufs[0], rf, op, g->n, 0, count, what)) fail();
    assert_ranks_identical(g, bufs, count, what);
}

/* ---------------------------------------------------------------- tests */

static void small_counts(int n, size_t *counts, int *num) {
    int k = 0;
    counts[k++] = 0;
    counts[k++] = 1;
    if (n > 2) counts[k++] = (size_t)n - 1;
    counts[k++] = (size_t)n + 1;
    counts[k++] = 1000; /* several blocks, one eager message each */
    *num = k;
}

/* Every op and algorithm at small counts, for N = 1..8. */
static void test_allreduce_small(void **state) {
    int n;
    (void)state;
    tu_watchdog(120);
    for (n = 1; n <= MAXN; ++n) {
        group g;
        size_t counts[8];
        int nc, ci, oi, ai, calls = 0;
        group_init(&g, n, NULL, 0);
        small_counts(n, counts, &nc);
        for (ci = 0; ci < nc; ++ci) {
            ref rf;
            float **bufs = alloc_bufs(n, counts[ci]);
            uint64_t seed = 100 + (uint64_t)n * 10 + (uint64_t)ci;
            ref_compute(&rf, seed, n, counts[ci]);
            for (oi = 0; oi < 4; ++oi)
                for (ai = 0; ai < NUM_ALGOS; ++ai) {
                    /* make test: one op per algorithm and count, turning with
                       both, so that each N still has every op with every
                       algorithm and at every count; make test-full runs all */
                    if (!tu_full() && oi != (ai + ci) % 4) continue;
                    check_allreduce(&g, bufs, &rf, seed, counts[ci], OPS[oi], ALGOS[ai]);
                    ++calls;
                }
            ref_free(&rf);
            free_bufs(bufs, n);
        }
        /* every rank counted the same collectives */
        for (oi = 0; oi < n; ++oi) assert_int_equal(dsgd_comm_seq(g.comm[oi]), (uint64_t)calls);
        group_free(&g);
    }
    tu_watchdog(0);
}

/* The large count with every algorithm: SUM, and one other op per N (each
   op is covered at a count not divisible by N). Small pieces for some N so
   that many pieces and both eager and rendezvous messages are exercised. */
static void test_allreduce_large(void **state) {
    size_t count = large_count();
    int n;
    (void)state;
    tu_watchdog(300);
    for (n = 1; n <= MAXN; ++n) {
        group g;
        dsgd_comm_desc desc;
        ref rf;
        float **bufs;
        uint64_t seed = 7000 + (uint64_t)n;
        int ai;
        dsgd_reduce_op other = OPS[1 + n % 3];
        /* make test: N = 2, 3, 4, 5 and 8 (even and odd, their pieces and
           every op; N = 1 returns at once, test_single_rank has it); under
           TSan N = 2 (16 KiB pieces, MIN) and 3 (rendezvous messages, MEAN);
           make test-full every N */
        if (!tu_full() && (n == 1 || (TU_TSAN ? n > 3 : n == 6 || n == 7))) continue;
        bufs = alloc_bufs(n, count);
        memset(&desc, 0, sizeof(desc));
        desc.piece_bytes = n % 2 ? 0 : 16 * 1024;
        group_init(&g, n, &desc, 0);
        ref_compute(&rf, seed, n, count);
        for (ai = 0; ai < NUM_ALGOS; ++ai) {
            check_allreduce(&g, bufs, &rf, seed, count, DSGD_REDUCE_SUM, ALGOS[ai]);
            check_allreduce(&g, bufs, &rf, seed, count, other, ALGOS[ai]);
        }
        ref_free(&rf);
        free_bufs(bufs, n);
        group_free(&g);
    }
    tu_watchdog(0);
}

/* Same inputs twice give the same bits; the piece size does not change the
   bits; a transport with only send/recv (no zero-copy, no sendrecv) gives
   the same bits as the loopback's own paths. */
static void test_allreduce_deterministic(void **state) {
    static const int ns[3] = {3, 4, 5};
    /* make test: 100003 (at N = 3 a block is one 256 KiB piece against 33
       of 4 KiB, still a rendezvous message); make test-full 300007 */
    size_t count = TU_TSAN ? 50003 : TU_PICK(300007, 100003);
    int ni;
    (void)state;
    tu_watchdog(300);
    /* make test: N = 3 and 4 (odd and even), under TSan N = 3; make
       test-full adds 5 (and 4 under TSan) */
    for (ni = 0; ni < TU_PICK(3, TU_TSAN ? 1 : 2); ++ni) {
        int n = ns[ni], ai, oi, r;
        group big, small, minimal;
        dsgd_comm_desc dsmall;
        ref rf;
        uint64_t seed = 31337 + (uint64_t)n;
        float **a = alloc_bufs(n, count), **b = alloc_bufs(n, count);
        memset(&dsmall, 0, sizeof(dsmall));
        dsmall.piece_bytes = 4096;
        group_init(&big, n, NULL, 0);
        group_init(&small, n, &dsmall, 0);
        group_init(&minimal, n, NULL, 1);
        ref_compute(&rf, seed, n, count);
        for (ai = 1; ai < NUM_ALGOS; ++ai) {
            for (oi = 0; oi < 2; ++oi) {
                dsgd_reduce_op op = OPS[oi];
                char what[96];
                if (!tu_full() && oi != ai % 2) continue; /* make test: SUM or MEAN, turning with the algorithm */
                snprintf(what, sizeof(what), "N=%d %s %s", n, dsgd_allreduce_algo_name(ALGOS[ai]),
                         dsgd_reduce_op_name(op));
                check_allreduce(&big, a, &rf, seed, count, op, ALGOS[ai]);
                check_allreduce(&big, b, &rf, seed, count, op, ALGOS[ai]);
                if (memcmp(a[0], b[0], count * sizeof(float)) != 0) {
                    print_error("%s: two runs differ\n", what);
                    fail();
                }
                check_allreduce(&small, b, &rf, seed, count, op, ALGOS[ai]);
                if (memcmp(a[0], b[0], count * sizeof(float)) != 0) {
                    print_error("%s: 4 KiB pieces give other bits than 256 KiB pieces\n", what);
                    fail();
                }
                if (ALGOS[ai] == DSGD_ALLREDUCE_DIRECT) continue; /* needs shared memory */
                check_allreduce(&minimal, b, &rf, seed, count, op, ALGOS[ai]);
                if (memcmp(a[0], b[0], count * sizeof(float)) != 0) {
                    print_error("%s: the send/recv-only transport gives other bits\n", what);
                    fail();
                }
            }
        }
        /* the minimal transport also handles small counts and the other collectives */
        for (r = 0; r < 2; ++r) {
            size_t c2 = r ? 1 : (size_t)n + 1;
            ref r2;
            ref_compute(&r2, seed + 1, n, c2);
            for (ai = 0; ai < NUM_ALGOS; ++ai)
                if (ALGOS[ai] != DSGD_ALLREDUCE_DIRECT)
                    check_allreduce(&minimal, a, &r2, seed + 1, c2, DSGD_REDUCE_MAX, ALGOS[ai]);
            ref_free(&r2);
        }
        /* DIRECT without the shared-memory hooks: unsupported, said so, no hang */
        {
            job jb;
            worker w[MAXN];
            job_init(&jb, J_ALLREDUCE, count);
            jb.algo = DSGD_ALLREDUCE_DIRECT;
            run_job(&minimal, &jb, a, w);
            for (r = 0; r < n; ++r) {
                assert_int_equal(w[r].res, DSGD_ERR_UNSUPPORTED);
                assert_non_null(strstr(w[r].msg, "cannot share memory"));
            }
        }
        ref_free(&rf);
        free_bufs(a, n);
        free_bufs(b, n);
        group_free(&big);
        group_free(&small);
        group_free(&minimal);
    }
    tu_watchdog(0);
}

/* Reduce-scatter: each rank's block (first count % N ranks one longer) holds
   the reduction; at the large count its bits equal the ring all-reduce's. */
static void test_reduce_scatter(void **state) {
    int n;
    (void)state;
    tu_watchdog(300);
    for (n = 1; n <= MAXN; ++n) {
        group g;
        size_t counts[8], big = large_count();
        int nc, ci, oi, r;
        group_init(&g, n, NULL, 0);
        small_counts(n, counts, &nc);
        if (large_at(n)) counts[nc++] = big;
        for (ci = 0; ci < nc; ++ci) {
            size_t count = counts[ci];
            ref rf;
            float **bufs = alloc_bufs(n, count);
            uint64_t seed = 500 + (uint64_t)n * 10 + (uint64_t)ci;
            ref_compute(&rf, seed, n, count);
            for (oi = 0; oi < 4; ++oi) {
                job jb;
                worker w[MAXN];
                char what[96];
                dsgd_reduce_op op = OPS[oi];
                if (count == big && oi > 1) break; /* SUM and MEAN at the large count */
                /* make test: one op per count, turning with the count and N (every op at
                   every N), and SUM or MEAN at the large count; make test-full runs all */
                if (!tu_full() && oi != (count == big ? n % 2 : (ci + n) % 4)) continue;
                snprintf(what, sizeof(what), "reduce_scatter N=%d count=%zu op=%s", n, count, dsgd_reduce_op_name(op));
                for (r = 0; r < n; ++r) fill_inputs(bufs[r], seed, r, count);
                job_init(&jb, J_REDUCE_SCATTER, count);
                jb.op = op;
                run_job(&g, &jb, bufs, w);
                assert_all_ok(&g, w, what);
                for (r = 0; r < n; ++r) {
                    size_t off, len;
                    dsgd_block_range(count, n, r, &off, &len);
                    assert_int_equal(len, count / (size_t)n + ((size_t)r < count % (size_t)n));
                    if (verify(bufs[r], &rf, op, n, off, off + len, what)) fail();
                }
                if (count == big) { /* the bits of the ring's order (tests/coll_ref.h) */
                    float **in = alloc_bufs(n, count), *want = (float *)malloc((count + 1) * sizeof(float));
                    assert_non_null(want);
                    for (r = 0; r < n; ++r) fill_inputs(in[r], seed, r, count);
                    ref_exact(want, (const float *const *)in, n, count, 0, op, REF_REDUCE_SCATTER, 0);
                    for (r = 0; r < n; ++r) {
                        size_t off, len;
                        dsgd_block_range(count, n, r, &off, &len);
                        if (len && memcmp(want + off, bufs[r] + off, len * sizeof(float)) != 0) {
                            print_error("%s: rank %d's block differs from the ring's order\n", what, r);
                            fail();
                        }
                    }
                    free(want);
                    free_bufs(in, n);
                }
            }
            ref_free(&rf);
            free_bufs(bufs, n);
        }
        group_free(&g);
    }
    tu_watchdog(0);
}

/* All-gather: rank r contributes its block; everyone ends with all blocks. */
static void test_allgather(void **state) {
    int n;
    (void)state;
    tu_watchdog(300);
    for (n = 1; n <= MAXN; ++n) {
        group g;
        size_t counts[8];
        int nc, ci, r;
        group_init(&g, n, NULL, 0);
        small_counts(n, counts, &nc);
        if (large_at(n)) counts[nc++] = large_count();
        for (ci = 0; ci < nc; ++ci) {
            size_t count = counts[ci], i;
            float **bufs = alloc_bufs(n, count);
            job jb;
            worker w[MAXN];
            char what[96];
            snprintf(what, sizeof(what), "allgather N=%d count=%zu", n, count);
            for (r = 0; r < n; ++r) {
                size_t off, len;
                dsgd_block_range(count, n, r, &off, &len);
                for (i = 0; i < count; ++i) bufs[r][i] = -12345.0f; /* not this rank's data */
                for (i = off; i < off + len; ++i) bufs[r][i] = input_value(900, r, i);
            }
            job_init(&jb, J_ALLGATHER, count);
            run_job(&g, &jb, bufs, w);
            assert_all_ok(&g, w, what);
            for (r = 0; r < n; ++r) {
                int b;
                for (b = 0; b < n; ++b) {
                    size_t off, len;
                    dsgd_block_range(count, n, b, &off, &len);
                    for (i = off; i < off + len; ++i) {
                        if (bufs[r][i] != input_value(900, b, i)) {
                            print_error("%s: rank %d element %zu of block %d wrong\n", what, r, i, b);
                            fail();
                        }
                    }
                }
            }
            free_bufs(bufs, n);
        }
        group_free(&g);
    }
    tu_watchdog(0);
}

/* Broadcast from every root at small counts, and from the last rank at the
   large count. */
static void test_broadcast(void **state) {
    int n;
    (void)state;
    tu_watchdog(300);
    for (n = 1; n <= MAXN; ++n) {
        group g;
        size_t counts[8];
        int nc, ci, r, root;
        group_init(&g, n, NULL, 0);
        small_counts(n, counts, &nc);
        if (large_at(n)) counts[nc++] = large_count();
        for (ci = 0; ci < nc; ++ci) {
            size_t count = counts[ci], i;
            float **bufs = alloc_bufs(n, count);
            for (root = ci == nc - 1 && large_at(n) ? n - 1 : 0; root < n; ++root) {
                job jb;
                worker w[MAXN];
                char what[96];
                /* make test: the first, a middle and the last root; make
                   test-full every root */
                if (!tu_full() && root != 0 && root != n / 2 && root != n - 1) continue;
                snprintf(what, sizeof(what), "broadcast N=%d count=%zu root=%d", n, count, root);
                for (r = 0; r < n; ++r)
                    for (i = 0; i < count; ++i) bufs[r][i] = r == root ? input_value(77, root, i) : -1.0f;
                job_init(&jb, J_BROADCAST, count);
                jb.root = root;
                run_job(&g, &jb, bufs, w);
                assert_all_ok(&g, w, what);
                for (r = 0; r < n; ++r) {
                    for (i = 0; i < count; ++i) {
                        if (bufs[r][i] != input_value(77, root, i)) {
                            print_error("%s: rank %d element %zu wrong\n", what, r, i);
                            fail();
                        }
                    }
                }
            }
            free_bufs(bufs, n);
        }
        group_free(&g);
    }
    tu_watchdog(0);
}

/* Barrier: after round k's barrier every rank has counted round k. */
static void test_barrier(void **state) {
    int n;
    (void)state;
    tu_watchdog(120);
    for (n = 1; n <= MAXN; ++n) {
        group g;
        job jb;
        worker w[MAXN];
        int counter = 0, r;
        group_init(&g, n, NULL, 0);
        job_init(&jb, J_BARRIER_COUNT, 0);
        jb.rounds = 50;
        jb.counter = &counter;
        run_job(&g, &jb, NULL, w);
        assert_all_ok(&g, w, "barrier");
        for (r = 0; r < n; ++r) assert_int_equal(w[r].barrier_bad, 0);
        assert_int_equal(counter, 50 * n);
        for (r = 0; r < n; ++r) assert_int_equal(dsgd_comm_seq(g.comm[r]), 50);
        group_free(&g);
    }
    tu_watchdog(0);
}

/* MAX and MIN propagate a NaN from any rank, identically on every rank. */
static void test_nan_propagates(void **state) {
    int ai, oi, r;
    size_t count = 1000, i;
    group g;
    float **bufs;
    (void)state;
    tu_watchdog(60);
    group_init(&g, 3, NULL, 0);
    bufs = alloc_bufs(3, count);
    for (oi = 2; oi < 4; ++oi) {
        for (ai = 0; ai < NUM_ALGOS; ++ai) {
            job jb;
            worker w[MAXN];
            for (r = 0; r < 3; ++r) fill_inputs(bufs[r], 5, r, count);
            bufs[1][17] = NAN;
            bufs[2][999] = NAN;
            job_init(&jb, J_ALLREDUCE, count);
            jb.op = OPS[oi];
            jb.algo = ALGOS[ai];
            run_job(&g, &jb, bufs, w);
            assert_all_ok(&g, w, "nan");
            for (r = 0; r < 3; ++r) {
                assert_true(isnan(bufs[r][17]));
                assert_true(isnan(bufs[r][999]));
                for (i = 18; i < 999; ++i) assert_false(isnan(bufs[r][i]));
            }
            assert_ranks_identical(&g, bufs, count, "nan");
        }
    }
    free_bufs(bufs, 3);
    group_free(&g);
    tu_watchdog(0);
}

/* A job in flight on a group of its own: what a deadline test starts, then
   joins and checks. make test starts all of a test's cases side by side
   (each on its own hub with its own deadline, so none waits for another)
   and checks them when they are done; make test-full runs them one after
   another. */
typedef struct inflight {
    int n, skip, kind, minimal;
    dsgd_allreduce_algo algo;
    size_t count;
    group g;
    job jb;
    worker w[MAXN];
    pthread_t th[MAXN];
    float **bufs;
} inflight;

/* Cases in flight at once: all of them in make test, one in make test-full. */
static int inflight_batch(int cases) { return TU_PICK(1, cases); }

/* A rank that never calls: every other rank returns DSGD_ERR_TIMEOUT within
   the deadline plus a margin, with a message naming the missing rank and the
   collective's sequence number; the communicator is unusable afterwards.
   timeout_start runs collective #1 and starts #2 without f->skip;
   timeout_check waits for it and checks. */
static void timeout_start(inflight *f) {
    int n = f->n, r;
    f->bufs = alloc_bufs(n, f->count);
    group_init(&f->g, n, NULL, f->minimal);
    /* collective #1 succeeds, so the failing one is #2 */
    job_init(&f->jb, J_BARRIER, 0);
    run_job(&f->g, &f->jb, NULL, f->w);
    assert_all_ok(&f->g, f->w, "barrier before the timeout");
    job_init(&f->jb, f->kind, f->count);
    f->jb.algo = f->algo;
    f->jb.op = DSGD_REDUCE_SUM;
    f->jb.timeout = 0.3;
    f->jb.skip_rank = f->skip;
    for (r = 0; r < n; ++r) fill_inputs(f->bufs[r], 3, r, f->count);
    start_job(&f->g, &f->jb, f->bufs, f->w, f->th);
}

static void timeout_check(inflight *f) {
    int n = f->n, skip = f->skip, minimal = f->minimal, r;
    worker *w = f->w;
    group *g = &f->g;
    char want_rank[32];
    join_job(g, f->th);
    snprintf(want_rank, sizeof(want_rank), "rank %d", skip);
    for (r = 0; r < n; ++r) {
        if (r == skip) continue;
        if (w[r].res != DSGD_ERR_TIMEOUT || w[r].elapsed >= 2.0 || (!minimal && !strstr(w[r].msg, want_rank)) ||
            !strstr(w[r].msg, "#2") || !strstr(w[r].msg, "timed out"))
            print_error("timeout N=%d skip=%d kind=%d algo=%s: rank %d res %d after %.3f s: '%s'\n", n, skip, f->kind,
                        dsgd_allreduce_algo_name(f->algo), r, (int)w[r].res, w[r].elapsed, w[r].msg);
        assert_int_equal(w[r].res, DSGD_ERR_TIMEOUT);
        assert_true(w[r].elapsed >= 0.29);
        assert_true(w[r].elapsed < 2.0);
        assert_non_null(strstr(w[r].msg, "timed out"));
        assert_non_null(strstr(w[r].msg, "#2"));
        /* the loopback names the missing rank even to ranks that waited for
           another one; a send/recv-only transport names the rank waited for */
        if (!minimal) assert_non_null(strstr(w[r].msg, want_rank));
        assert_int_equal(dsgd_comm_seq(g->comm[r]), 2);
        assert_true(dsgd_comm_broken(g->comm[r]));
        /* unusable afterwards, and says so */
        assert_int_equal(dsgd_barrier(g->comm[r], 0.1), DSGD_ERR_STATE);
        assert_non_null(strstr(dsgd_ctx_last_error(g->ctx[r]), "#2"));
    }
    free_bufs(f->bufs, n);
    group_free(g);
}

static void timeout_set(inflight *f, int n, int skip, int kind, dsgd_allreduce_algo algo, size_t count, int minimal) {
    f->n = n;
    f->skip = skip;
    f->kind = kind;
    f->algo = algo;
    f->count = count;
    f->minimal = minimal;
}

static void test_timeout_missing_rank(void **state) {
    enum { CASES = 2 * NUM_ALGOS + 9 };
    size_t large = TU_TSAN ? 100003 : 300007;
    inflight *f = (inflight *)calloc(CASES, sizeof(inflight));
    int ai, i, k, batch = inflight_batch(CASES);
    (void)state;
    assert_non_null(f);
    tu_watchdog(120);
    for (ai = 0; ai < NUM_ALGOS; ++ai) {
        timeout_set(&f[2 * ai], 4, 3, J_ALLREDUCE, ALGOS[ai], 1000, 0);
        timeout_set(&f[2 * ai + 1], 5, 0, J_ALLREDUCE, ALGOS[ai], 1000, 0);
    }
    i = 2 * NUM_ALGOS;
    /* rendezvous messages posted when the deadline passes are withdrawn */
    timeout_set(&f[i++], 4, 3, J_ALLREDUCE, DSGD_ALLREDUCE_RING, large, 0);
    timeout_set(&f[i++], 3, 1, J_ALLREDUCE, DSGD_ALLREDUCE_HALVING_DOUBLING, large, 0);
    timeout_set(&f[i++], 2, 1, J_ALLREDUCE, DSGD_ALLREDUCE_RING, large, 0);
    timeout_set(&f[i++], 4, 2, J_REDUCE_SCATTER, DSGD_ALLREDUCE_AUTO, 1000, 0);
    timeout_set(&f[i++], 4, 2, J_ALLGATHER, DSGD_ALLREDUCE_AUTO, 1000, 0);
    timeout_set(&f[i++], 4, 0, J_BROADCAST, DSGD_ALLREDUCE_AUTO, 1000, 0);
    timeout_set(&f[i++], 6, 4, J_BARRIER, DSGD_ALLREDUCE_AUTO, 0, 0);
    /* through the send/recv-only path */
    timeout_set(&f[i++], 4, 3, J_ALLREDUCE, DSGD_ALLREDUCE_RING, large, 1);
    timeout_set(&f[i++], 2, 0, J_ALLREDUCE, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, 1000, 1);
    assert_int_equal(i, CASES);
    for (i = 0; i < CASES; i += batch) {
        for (k = i; k < i + batch && k < CASES; ++k) timeout_start(&f[k]);
        for (k = i; k < i + batch && k < CASES; ++k) timeout_check(&f[k]);
    }
    free(f);
    tu_watchdog(0);
}

/* A rank that arrives after the others gave up: everyone times out and, for
   DIRECT, nobody's buffer is touched (a withdrawn buffer is never written).
   late_start starts the collective with rank 2 late; late_check waits for
   it and checks. */
#define LATE_COUNT 50000

static void late_start(inflight *f) {
    int r;
    f->n = 3;
    f->bufs = alloc_bufs(3, LATE_COUNT);
    group_init(&f->g, 3, NULL, 0);
    job_init(&f->jb, J_ALLREDUCE, LATE_COUNT);
    f->jb.algo = f->algo;
    f->jb.timeout = 0.2;
    f->jb.late_rank = 2;
    f->jb.late_s = 0.5;
    for (r = 0; r < 3; ++r) fill_inputs(f->bufs[r], 11, r, LATE_COUNT);
    start_job(&f->g, &f->jb, f->bufs, f->w, f->th);
}

static void late_check(inflight *f) {
    worker *w = f->w;
    size_t i;
    int r;
    join_job(&f->g, f->th);
    for (r = 0; r < 3; ++r) {
        /* the punctual ranks time out; the late one times out too, or
           finds a message its sender withdrew when it gave up */
        int ok = r < 2 ? w[r].res == DSGD_ERR_TIMEOUT : (w[r].res == DSGD_ERR_TIMEOUT || w[r].res == DSGD_ERR_ABORTED);
        if (!ok)
            print_error("late %s: rank %d res %d '%s'\n", dsgd_allreduce_algo_name(f->algo), r, (int)w[r].res,
                        w[r].msg);
        assert_true(ok);
        assert_true(w[r].elapsed < 2.0);
        assert_non_null(strstr(w[r].msg, "allreduce #1"));
    }
    if (f->algo == DSGD_ALLREDUCE_DIRECT)
        for (r = 0; r < 3; ++r)
            for (i = 0; i < LATE_COUNT; ++i) assert_true(f->bufs[r][i] == input_value(11, r, i));
    free_bufs(f->bufs, 3);
    group_free(&f->g);
}

static void test_late_rank(void **state) {
    enum { CASES = NUM_ALGOS - 1 };
    inflight *f = (inflight *)calloc(CASES, sizeof(inflight));
    int i, k, batch = inflight_batch(CASES);
    (void)state;
    assert_non_null(f);
    tu_watchdog(60);
    for (i = 0; i < CASES; ++i) f[i].algo = ALGOS[i + 1]; /* every algorithm but AUTO */
    for (i = 0; i < CASES; i += batch) {
        for (k = i; k < i + batch && k < CASES; ++k) late_start(&f[k]);
        for (k = i; k < i + batch && k < CASES; ++k) late_check(&f[k]);
    }
    free(f);
    tu_watchdog(0);
}

/* Ranks that disagree on a collective (count, op, root, algorithm, kind):
   every rank returns DSGD_ERR_DESYNC long before the deadline, with a
   message naming two ranks and what they passed; no buffer is read or
   written; and the communicator still works for the next collective. */
#define MM_CAP 1200 /* floats per buffer, beyond every count used */
static double g_mm_slowest; /* the slowest rank's DSGD_ERR_DESYNC so far, s */
static int g_mm_cases;

/* Runs jb (with its alt) on n ranks whose comms use 256-byte pieces; checks
   the verdict on every rank, that every message contains want1 and want2,
   that no buffer changed, then that a matching allreduce succeeds. */
static void mismatch_case(int n, const job *jb, const char *want1, const char *want2, int minimal) {
    group g;
    job ok;
    worker w[MAXN];
    dsgd_comm_desc desc;
    float **bufs = alloc_bufs(n, MM_CAP);
    int r;
    size_t i;
    memset(&desc, 0, sizeof(desc));
    desc.piece_bytes = 256;
    group_init(&g, n, &desc, minimal);
    for (r = 0; r < n; ++r) fill_inputs(bufs[r], 21, r, MM_CAP);
    run_job(&g, jb, bufs, w);
    for (r = 0; r < n; ++r) {
        int good = w[r].res == DSGD_ERR_DESYNC && w[r].elapsed < 3.0 && strstr(w[r].msg, want1) &&
                   strstr(w[r].msg, want2) && strstr(w[r].msg, "disagree");
        if (!good)
            print_error("mismatch N=%d kind=%d algo=%s count0=%zu alt rank %d: rank %d res %d after %.3f s: '%s' "
                        "(want '%s', '%s')\n",
                        n, jb->kind, dsgd_allreduce_algo_name(jb->algo), jb->count[0], jb->alt_rank, r,
                        (int)w[r].res, w[r].elapsed, w[r].msg, want1, want2);
        assert_true(good);
        if (w[r].elapsed > g_mm_slowest) g_mm_slowest = w[r].elapsed;
        assert_false(dsgd_comm_broken(g.comm[r])); /* same seq: the disagreement leaves it usable */
        for (i = 0; i < MM_CAP; ++i)
            if (bufs[r][i] != input_value(21, r, i)) fail_msg("rank %d: element %zu was touched", r, i);
    }
    job_init(&ok, J_ALLREDUCE, 300);
    ok.algo = jb->algo;
    ok.timeout = 20.0;
    run_job(&g, &ok, bufs, w);
    assert_all_ok(&g, w, "allreduce after a disagreement");
    assert_ranks_identical(&g, bufs, 300, "allreduce after a disagreement");
    free_bufs(bufs, n);
    group_free(&g);
}

/* Makes every rank of jb's alternative pass count. */
static void set_counts(job *jb, size_t count) {
    int r;
    for (r = 0; r < MAXN; ++r) jb->count[r] = count;
}

/* Count variants of the issue: one rank passes count +-1, +- one piece (64
   floats at 256-byte pieces) or 0, on every kind and algorithm, N = 2..4. */
static void test_mismatched_counts(void **state) {
    static const long delta[] = {+1, -1, +64, -64, -1000};
    int n, ki, di;
    (void)state;
    tu_watchdog(300);
    for (n = 2; n <= 4; ++n) {
        for (ki = 0; ki < NUM_ALGOS + 3; ++ki) {
            for (di = 0; di < 5; ++di) {
                job jb, alt;
                char w1[64], w2[64];
                int kind;
                /* make test: one N per kind and delta, turning with both (every
                   pair of the three still meets); make test-full runs all */
                if (!tu_full() && n != 2 + (ki + di) % 3) continue;
                kind = ki < NUM_ALGOS ? J_ALLREDUCE : J_REDUCE_SCATTER + (ki - NUM_ALGOS);
                job_init(&jb, kind, 1000);
                jb.algo = ki < NUM_ALGOS ? ALGOS[ki] : DSGD_ALLREDUCE_AUTO;
                jb.op = DSGD_REDUCE_SUM;
                jb.root = n - 1;
                jb.timeout = 20.0;
                alt = jb;
                set_counts(&alt, (size_t)(1000 + delta[di]));
                jb.alt = &alt;
                jb.alt_rank = (di + ki) % n; /* vary which rank is off */
                snprintf(w1, sizeof(w1), "rank %d passed count %ld", jb.alt_rank, 1000 + delta[di]);
                snprintf(w2, sizeof(w2), "passed count 1000");
                mismatch_case(n, &jb, w1, w2, 0);
                ++g_mm_cases;
            }
        }
    }
    printf("    %d cases: every rank had DSGD_ERR_DESYNC, the slowest after %.1f ms\n", g_mm_cases,
           g_mm_slowest * 1e3);
    tu_watchdog(0);
}

/* The cases the outside test pass found, and disagreements other than the
   count. */
static void test_mismatched_calls(void **state) {
    job jb, alt;
    (void)state;
    tu_watchdog(120);
    /* DIRECT (AUTO on the loopback): 1000 against 2000 read past a buffer;
       300/300/299 left the last element unreduced */
    job_init(&jb, J_ALLREDUCE, 1000);
    jb.timeout = 20.0;
    alt = jb;
    set_counts(&alt, 1100);
    jb.alt = &alt;
    jb.alt_rank = 1;
    mismatch_case(2, &jb, "rank 1 passed count 1100", "rank 0 passed count 1000", 0);
    set_counts(&alt, 299);
    set_counts(&jb, 300);
    jb.alt_rank = 2;
    mismatch_case(3, &jb, "rank 2 passed count 299", "rank 0 passed count 300", 0);
    /* the send/recv-only path, and AUTO choosing by count without sharing */
    jb.algo = alt.algo = DSGD_ALLREDUCE_RING;
    mismatch_case(3, &jb, "rank 2 passed count 299", "rank 0 passed count 300", 1);
    jb.algo = alt.algo = DSGD_ALLREDUCE_AUTO;
    mismatch_case(4, &jb, "rank 2 passed count 299", "rank 0 passed count 300", 1);
    /* counts a whole number of pieces apart (128 against 256 floats at
       256-byte pieces): the ring and the ring all-gather returned OK on the
       smaller rank with half its block wrong */
    job_init(&jb, J_ALLREDUCE, 256);
    jb.algo = DSGD_ALLREDUCE_RING;
    jb.timeout = 20.0;
    alt = jb;
    set_counts(&alt, 128);
    jb.alt = &alt;
    jb.alt_rank = 0;
    mismatch_case(2, &jb, "rank 0 passed count 128", "rank 1 passed count 256", 0);
    jb.kind = alt.kind = J_ALLGATHER;
    mismatch_case(2, &jb, "rank 0 passed count 128", "rank 1 passed count 256", 0);
    job_init(&jb, J_ALLREDUCE, 300);
    jb.timeout = 20.0;
    alt = jb;
    jb.alt = &alt;
    jb.alt_rank = 2;
    /* another op */
    set_counts(&alt, 300);
    alt.op = DSGD_REDUCE_MAX;
    mismatch_case(3, &jb, "rank 2 passed op max", "rank 0 passed op sum", 0);
    jb.algo = alt.algo = DSGD_ALLREDUCE_HALVING_DOUBLING;
    mismatch_case(4, &jb, "rank 2 passed op max", "rank 0 passed op sum", 0);
    /* another algorithm */
    alt.op = jb.op;
    alt.algo = DSGD_ALLREDUCE_RING;
    mismatch_case(4, &jb, "rank 2 passed algorithm ring", "rank 0 passed algorithm halving_doubling", 0);
    /* another root */
    job_init(&jb, J_BROADCAST, 500);
    jb.timeout = 20.0;
    alt = jb;
    alt.root = 2;
    jb.alt = &alt;
    jb.alt_rank = 1;
    mismatch_case(3, &jb, "rank 0 passed root 0", "rank 1 passed root 2", 0);
    /* another collective */
    job_init(&alt, J_ALLGATHER, 500);
    alt.timeout = 20.0;
    mismatch_case(3, &jb, "rank 1 is in allgather", "rank 0 is in broadcast", 0);
    job_init(&alt, J_BARRIER, 0);
    alt.timeout = 20.0;
    mismatch_case(2, &jb, "rank 1 is in barrier", "rank 0 is in broadcast", 1);
    tu_watchdog(0);
}

/* dsgd_loopback_abort wakes every waiter long before its deadline. */
static void abort_case(dsgd_allreduce_algo algo, int through_endpoint) {
    group g;
    job jb;
    worker w[MAXN];
    float **bufs = alloc_bufs(3, 100000);
    pthread_t th[2];
    int r;
    group_init(&g, 3, NULL, 0);
    job_init(&jb, J_ALLREDUCE, 100000);
    jb.algo = algo;
    jb.timeout = 20.0;
    for (r = 0; r < 2; ++r) {
        memset(&w[r], 0, sizeof(w[r]));
        w[r].g = &g;
        w[r].rank = r;
        w[r].jb = &jb;
        w[r].buf = bufs[r];
        fill_inputs(bufs[r], 2, r, 100000);
        assert_int_equal(pthread_create(&th[r], NULL, worker_main, &w[r]), 0);
    }
    {
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_false(dsgd_loopback_aborted(g.hub));
    if (through_endpoint) {
        assert_non_null(g.ep[2].abort); /* the transport interface's abort, as a strategy calls it */
        g.ep[2].abort(g.ep[2].impl);
    } else {
        dsgd_loopback_abort(g.hub);
    }
    assert_true(dsgd_loopback_aborted(g.hub));
    for (r = 0; r < 2; ++r) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (r = 0; r < 2; ++r) {
        if (w[r].res != DSGD_ERR_ABORTED || !strstr(w[r].msg, "abort"))
            print_error("abort %s: rank %d res %d: '%s'\n", dsgd_allreduce_algo_name(algo), r, (int)w[r].res,
                        w[r].msg);
        assert_int_equal(w[r].res, DSGD_ERR_ABORTED);
        assert_true(w[r].elapsed < 5.0);
        assert_non_null(strstr(w[r].msg, "abort"));
    }
    /* later calls fail at once */
    assert_int_equal(dsgd_barrier(g.comm[2], 5.0), DSGD_ERR_ABORTED);
    free_bufs(bufs, 3);
    group_free(&g);
}

static void test_abort_wakes_waiters(void **state) {
    (void)state;
    tu_watchdog(60);
    /* make test: each algorithm and each way to abort once (the ring through
       the hub, DIRECT through the endpoint); make test-full every pair */
    abort_case(DSGD_ALLREDUCE_RING, 0);
    if (tu_full()) abort_case(DSGD_ALLREDUCE_DIRECT, 0);
    if (tu_full()) abort_case(DSGD_ALLREDUCE_RING, 1);
    abort_case(DSGD_ALLREDUCE_DIRECT, 1);
    tu_watchdog(0);
}

/* A native allreduce hook replaces AUTO, after the ranks agreed on the call;
   explicit algorithms still run the library's code; a native failure is
   reported with the sequence number. */
static int native_calls;
static dsgd_result fake_native(void *impl, float *buf, size_t count, dsgd_reduce_op op, double deadline) {
    size_t i;
    (void)impl;
    (void)op;
    (void)deadline;
    __atomic_add_fetch(&native_calls, 1, __ATOMIC_SEQ_CST);
    if (count == 7) return DSGD_ERR_TIMEOUT;
    for (i = 0; i < count; ++i) buf[i] = 42.0f;
    return DSGD_OK;
}

static void test_native_hook(void **state) {
    group g;
    job jb;
    worker w[MAXN];
    float **bufs = alloc_bufs(2, 16);
    int r;
    (void)state;
    tu_watchdog(60);
    for (r = 0; r < 2; ++r) memset(bufs[r], 0, 16 * sizeof(float));
    group_init(&g, 2, NULL, 0);
    for (r = 0; r < 2; ++r) {
        dsgd_comm_destroy(g.comm[r]);
        g.ep[r].allreduce = fake_native;
        assert_int_equal(dsgd_comm_create(g.ctx[r], &g.ep[r], NULL, &g.comm[r]), DSGD_OK);
    }
    assert_int_equal(dsgd_allreduce_choose(g.comm[0], 8), DSGD_ALLREDUCE_AUTO);
    native_calls = 0;
    job_init(&jb, J_ALLREDUCE, 8);
    run_job(&g, &jb, bufs, w);
    assert_all_ok(&g, w, "native");
    assert_int_equal(native_calls, 2);
    for (r = 0; r < 2; ++r) assert_true(bufs[r][0] == 42.0f && bufs[r][7] == 42.0f && bufs[r][8] == 0.0f);
    /* an explicit algorithm does not use the hook */
    jb.algo = DSGD_ALLREDUCE_RING;
    for (r = 0; r < 2; ++r) bufs[r][0] = (float)(r + 1);
    run_job(&g, &jb, bufs, w);
    assert_all_ok(&g, w, "ring beside a native hook");
    assert_int_equal(native_calls, 2);
    assert_true(bufs[0][0] == 3.0f && bufs[1][0] == 3.0f && bufs[1][7] == 84.0f);
    /* different counts: the hook is never called with them */
    jb.algo = DSGD_ALLREDUCE_AUTO;
    jb.count[1] = 9;
    run_job(&g, &jb, bufs, w);
    for (r = 0; r < 2; ++r) {
        assert_int_equal(w[r].res, DSGD_ERR_DESYNC);
        assert_non_null(strstr(w[r].msg, "allreduce #3 (native)"));
        assert_non_null(strstr(w[r].msg, "rank 1 passed count 9"));
    }
    assert_int_equal(native_calls, 2);
    /* a failure of the hook */
    job_init(&jb, J_ALLREDUCE, 7);
    run_job(&g, &jb, bufs, w);
    for (r = 0; r < 2; ++r) {
        assert_int_equal(w[r].res, DSGD_ERR_TIMEOUT);
        assert_non_null(strstr(w[r].msg, "allreduce #4 (native)"));
    }
    assert_int_equal(native_calls, 4);
    free_bufs(bufs, 2);
    group_free(&g);
    tu_watchdog(0);
}

/* N = 1: every collective returns at once with the input unchanged (MEAN
   divides by 1). */
static void test_single_rank(void **state) {
    group g;
    float buf[5] = {1.5f, -2.0f, 3.25f, 0.0f, 1e30f}, orig[5];
    int ai, oi;
    (void)state;
    memcpy(orig, buf, sizeof(buf));
    group_init(&g, 1, NULL, 0);
    for (ai = 0; ai < NUM_ALGOS; ++ai)
        for (oi = 0; oi < 4; ++oi)
            assert_int_equal(dsgd_allreduce(g.comm[0], buf, 5, OPS[oi], ALGOS[ai], 0), DSGD_OK);
    assert_int_equal(dsgd_reduce_scatter(g.comm[0], buf, 5, DSGD_REDUCE_MEAN, 0), DSGD_OK);
    assert_int_equal(dsgd_allgather(g.comm[0], buf, 5, 0), DSGD_OK);
    assert_int_equal(dsgd_broadcast(g.comm[0], buf, 5, 0, 0), DSGD_OK);
    assert_int_equal(dsgd_barrier(g.comm[0], 0), DSGD_OK);
    assert_memory_equal(buf, orig, sizeof(buf));
    assert_int_equal(dsgd_comm_rank(g.comm[0]), 0);
    assert_int_equal(dsgd_comm_size(g.comm[0]), 1);
    assert_int_equal(dsgd_comm_seq(g.comm[0]), NUM_ALGOS * 4 + 4);
    assert_ptr_equal(dsgd_comm_ctx(g.comm[0]), g.ctx[0]);
    group_free(&g);
}

static void test_block_range(void **state) {
    size_t off, len, total;
    int n, b;
    (void)state;
    dsgd_block_range(10, 4, 0, &off, &len);
    assert_true(off == 0 && len == 3);
    dsgd_block_range(10, 4, 1, &off, &len);
    assert_true(off == 3 && len == 3);
    dsgd_block_range(10, 4, 2, &off, &len);
    assert_true(off == 6 && len == 2);
    dsgd_block_range(10, 4, 3, &off, &len);
    assert_true(off == 8 && len == 2);
    dsgd_block_range(10, 4, 4, &off, &len);
    assert_true(off == 0 && len == 0);
    dsgd_block_range(10, 0, 0, &off, &len);
    assert_true(off == 0 && len == 0);
    for (n = 1; n <= 9; ++n) {
        size_t expect_off = 0;
        total = 0;
        for (b = 0; b < n; ++b) {
            dsgd_block_range(1000003, n, b, &off, &len);
            assert_int_equal(off, expect_off);
            expect_off += len;
            total += len;
        }
        assert_int_equal(total, 1000003);
    }
}

/* Bad arguments: the error code, a message, and no sequence number spent. */
static void test_bad_arguments(void **state) {
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_transport_i t, bad;
    dsgd_comm *c;
    dsgd_comm_desc desc;
    float buf[4] = {0};
    (void)state;
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);

    hub = (dsgd_loopback *)&buf; /* must be overwritten */
    assert_int_equal(dsgd_loopback_create(ctx, 0, &hub), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(hub);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "0 ranks"));
    assert_int_equal(dsgd_loopback_create(ctx, -3, &hub), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_loopback_create(ctx, 2, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_loopback_create(NULL, 2, &hub), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_loopback_create(ctx, 2, &hub), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 2, &t), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "rank 2"));
    assert_int_equal(dsgd_loopback_endpoint(hub, -1, &t), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_loopback_endpoint(NULL, 0, &t), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, &t), DSGD_OK);
    assert_int_equal(t.rank, 0);
    assert_int_equal(t.size, 2);
    assert_string_equal(t.name, "loopback");

    /* transport-level checks */
    assert_int_equal(t.send(t.impl, 0, 1, buf, 4, dsgd_now() + 1), DSGD_ERR_INVALID_ARGUMENT); /* to itself */
    assert_int_equal(t.recv(t.impl, 5, 1, buf, 4, dsgd_now() + 1), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(t.error_message(t.impl), "invalid peer"));

    /* comm_create */
    assert_int_equal(dsgd_comm_create(ctx, NULL, NULL, &c), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_comm_create(ctx, &t, NULL, NULL), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_comm_create(NULL, &t, NULL, &c), DSGD_ERR_INVALID_ARGUMENT);
    bad = t;
    bad.size = 0;
    assert_int_equal(dsgd_comm_create(ctx, &bad, NULL, &c), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "size 0"));
    bad = t;
    bad.rank = 2;
    assert_int_equal(dsgd_comm_create(ctx, &bad, NULL, &c), DSGD_ERR_INVALID_ARGUMENT);
    bad = t;
    bad.recv = NULL;
    assert_int_equal(dsgd_comm_create(ctx, &bad, NULL, &c), DSGD_ERR_INVALID_ARGUMENT);
    memset(&desc, 0, sizeof(desc));
    desc.timeout_s = -1;
    assert_int_equal(dsgd_comm_create(ctx, &t, &desc, &c), DSGD_ERR_INVALID_ARGUMENT);
    desc.timeout_s = NAN;
    assert_int_equal(dsgd_comm_create(ctx, &t, &desc, &c), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(c);

    desc.timeout_s = 0.05;
    assert_int_equal(dsgd_comm_create(ctx, &t, &desc, &c), DSGD_OK);
    /* collectives */
    assert_int_equal(dsgd_allreduce(NULL, buf, 4, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allreduce(c, NULL, 4, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "buf is NULL"));
    assert_int_equal(dsgd_allreduce(c, buf, 4, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, -1.0), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "timeout"));
    assert_int_equal(dsgd_allreduce(c, buf, 4, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, NAN), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allreduce(c, buf, 4, (dsgd_reduce_op)9, DSGD_ALLREDUCE_AUTO, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allreduce(c, buf, 4, (dsgd_reduce_op)-1, DSGD_ALLREDUCE_AUTO, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allreduce(c, buf, 4, DSGD_REDUCE_SUM, (dsgd_allreduce_algo)17, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "unknown algorithm"));
    assert_int_equal(dsgd_reduce_scatter(c, NULL, 4, DSGD_REDUCE_SUM, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_reduce_scatter(NULL, buf, 4, DSGD_REDUCE_SUM, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allgather(c, NULL, 4, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allgather(c, buf, 4, -0.5), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_broadcast(c, buf, 4, 2, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "root 2"));
    assert_int_equal(dsgd_broadcast(c, buf, 4, -1, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_barrier(c, -2), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_barrier(NULL, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_comm_seq(c), 0); /* nothing started */
    /* the default timeout from the desc applies (0.05 s, no peer) */
    {
        double t0 = dsgd_now();
        assert_int_equal(dsgd_barrier(c, 0), DSGD_ERR_TIMEOUT);
        assert_true(dsgd_now() - t0 < 1.0);
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "barrier #1: rank 0 timed out waiting for rank 1 after 0.05 s"));
    }
    /* count 0 with a NULL buffer passes the checks and starts a collective,
       which still agrees with the peers (here: none comes, so it times out) */
    dsgd_comm_destroy(c);
    assert_int_equal(dsgd_comm_create(ctx, &t, &desc, &c), DSGD_OK);
    assert_int_equal(dsgd_allreduce(c, NULL, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING, 0), DSGD_ERR_TIMEOUT);
    assert_int_equal(dsgd_comm_seq(c), 1);
    assert_null(dsgd_comm_ctx(NULL));
    assert_int_equal(dsgd_comm_size(NULL), 0);
    assert_string_equal(dsgd_reduce_op_name(DSGD_REDUCE_MEAN), "mean");
    assert_string_equal(dsgd_allreduce_algo_name(DSGD_ALLREDUCE_HALVING_DOUBLING), "halving_doubling");
    dsgd_comm_destroy(c);
    dsgd_comm_destroy(NULL);
    dsgd_loopback_abort(NULL);
    dsgd_loopback_destroy(hub);
    dsgd_loopback_destroy(NULL);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- the fold */

/* A loopback endpoint that counts its transfers (wrapping another). */
typedef struct counting {
    dsgd_transport_i in;
    int calls; /* send, recv, sendrecv, sendrecv_reduce and sendrecv_upto calls */
} counting;

static dsgd_result cnt_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    counting *k = (counting *)impl;
    k->calls++;
    return k->in.send(k->in.impl, dst, tag, buf, bytes, deadline);
}
static dsgd_result cnt_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    counting *k = (counting *)impl;
    k->calls++;
    return k->in.recv(k->in.impl, src, tag, buf, bytes, deadline);
}
static dsgd_result cnt_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                uint64_t rtag, void *rbuf, size_t rbytes, double deadline, int *failed) {
    counting *k = (counting *)impl;
    k->calls++;
    return k->in.sendrecv(k->in.impl, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, deadline, failed);
}
static dsgd_result cnt_sendrecv_reduce(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                       uint64_t rtag, float *rbuf, size_t rcount, dsgd_reduce_op op, double deadline,
                                       int *failed) {
    counting *k = (counting *)impl;
    k->calls++;
    return k->in.sendrecv_reduce(k->in.impl, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcount, op, deadline, failed);
}
static dsgd_result cnt_sendrecv_upto(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                     uint64_t rtag, void *rbuf, size_t rcap, size_t *rbytes, double deadline,
                                     int *failed) {
    counting *k = (counting *)impl;
    k->calls++;
    return k->in.sendrecv_upto(k->in.impl, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcap, rbytes, deadline, failed);
}

/* Wraps every endpoint of g in ks (upto: keep sendrecv_upto) and
   re-creates the communicators over them. */
static void wrap_counting(group *g, counting *ks, int upto) {
    int r;
    for (r = 0; r < g->n; ++r) {
        dsgd_transport_i *t = &g->ep[r];
        dsgd_comm_destroy(g->comm[r]);
        ks[r].in = *t;
        ks[r].calls = 0;
        t->impl = &ks[r];
        t->send = cnt_send;
        t->recv = cnt_recv;
        t->sendrecv = cnt_sendrecv;
        t->sendrecv_reduce = cnt_sendrecv_reduce;
        t->sendrecv_upto = upto ? cnt_sendrecv_upto : NULL;
        t->share = NULL;
        t->unshare = NULL;
        t->abort = NULL;
        t->error_message = NULL;
        t->set_progress = NULL;
        t->peer_progress = NULL;
        t->probe = NULL;
        assert_int_equal(dsgd_comm_create(g->ctx[r], t, NULL, &g->comm[r]), DSGD_OK);
    }
}

/* The agreement carries the first exchanges (see collectives_agree.h >>fold):
   - every collective that folds (ring and recursive doubling all-reduce,
     reduce-scatter, all-gather), at N = 2..5 and 8 (2, 3 and 8 under the
     sanitizers), counts 0, 1, N - 1,
     N + 1, 1000, 4096, 4097 and 100003 and every op, gives on every rank
     the bits of the same collective over send and recv only (no fold), and
     the serial reference;
   - the transfers per rank, counted by a wrapping transport, for 1000
     floats: the ring at N = 2 makes 2 (its own 2 steps, the first carrying
     the fingerprints), recursive doubling 1 at N = 2 and 2 at N = 4 (its
     own log2 N); the ring at N = 3 makes 5 (2 agreement rounds, the first
     carrying its first step, then its other 3), at N = 4 it makes 8 (the
     butterfly's partners are not the ring's: no fold). Without
     sendrecv_upto: 3, 2, 4, 6 and 8.
   - a broadcast of 1000 floats rides the agreement whole: 2 transfers per
     rank at N = 4 and 3 at N = 5 (ceil(log2 N)), every rank ending with
     the root's data (test_broadcast checks every root and count);
   - endpoints with and without sendrecv_upto in one group: DSGD_ERR_DESYNC
     on both ranks within 5 s (the agreement's messages differ). */
static void test_fold(void **state) {
    static const int ns[] = {2, 3, 4, 5, 8};
    static const int kinds[] = {J_ALLREDUCE, J_ALLREDUCE, J_REDUCE_SCATTER, J_ALLGATHER};
    static const dsgd_allreduce_algo algos[] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_RECURSIVE_DOUBLING,
                                                DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_RING};
    int ni, ki, ci, oi, r;
    (void)state;
    tu_watchdog(300);
    for (ni = 0; ni < (int)(sizeof(ns) / sizeof(ns[0])); ++ni) {
        int n = ns[ni];
        size_t counts[8];
        group g, m;
        /* under the sanitizers (slower many times) N = 2, 3 and 8: folded
           and not, odd and a power of two */
        if ((TU_TSAN || TU_ASAN) && (n == 4 || n == 5)) continue;
        if (TU_TSAN && !tu_full() && n == 8) continue; /* make test under TSan: N = 2 and 3 */
        counts[0] = 0;
        counts[1] = 1;
        counts[2] = (size_t)n - 1;
        counts[3] = (size_t)n + 1;
        counts[4] = 1000;
        counts[5] = 4096;
        counts[6] = 4097;
        counts[7] = 100003;
        group_init(&g, n, NULL, 0);
        group_init(&m, n, NULL, 1);
        for (ki = 0; ki < 4; ++ki)
            for (ci = 0; ci < 8; ++ci)
                for (oi = 0; oi < (kinds[ki] == J_ALLGATHER ? 1 : 4); ++oi) {
                    size_t count = counts[ci];
                    /* make test: one op per count, turning with the count and
                       the collective (each still meets every op); make
                       test-full runs every op at every count */
                    if (!tu_full() && kinds[ki] != J_ALLGATHER && oi != (ci + ki) % 4) continue;
                    float **a = alloc_bufs(n, count), **b = alloc_bufs(n, count);
                    job jb;
                    worker w[MAXN];
                    job_init(&jb, kinds[ki], count);
                    jb.op = OPS[oi];
                    jb.algo = algos[ki];
                    jb.timeout = 20.0;
                    for (r = 0; r < n; ++r) {
                        fill_inputs(a[r], 77 + (uint64_t)ci, r, count);
                        fill_inputs(b[r], 77 + (uint64_t)ci, r, count);
                    }
                    run_job(&g, &jb, a, w);
                    assert_all_ok(&g, w, "folded");
                    run_job(&m, &jb, b, w);
                    assert_all_ok(&m, w, "send/recv only");
                    for (r = 0; r < n; ++r)
                        if (count && memcmp(a[r], b[r], count * sizeof(float)) != 0)
                            fail_msg("N=%d kind %d %s count %zu op %s: rank %d's bits differ from send/recv only", n,
                                     kinds[ki], dsgd_allreduce_algo_name(algos[ki]), count,
                                     dsgd_reduce_op_name(OPS[oi]), r);
                    if (kinds[ki] == J_ALLREDUCE && count) {
                        ref rf;
                        ref_compute(&rf, 77 + (uint64_t)ci, n, count);
                        if (verify(a[0], &rf, OPS[oi], n, 0, count, "folded allreduce")) fail();
                        ref_free(&rf);
                    }
                    free_bufs(a, n);
                    free_bufs(b, n);
                }
        group_free(&g);
        group_free(&m);
    }
    {   /* a group whose endpoints differ in sendrecv_upto: DSGD_ERR_DESYNC on both, no hang */
        group g;
        job jb;
        worker w[MAXN];
        float **a = alloc_bufs(2, 10);
        group_init(&g, 2, NULL, 0);
        dsgd_comm_destroy(g.comm[1]);
        g.ep[1].sendrecv_upto = NULL;
        assert_int_equal(dsgd_comm_create(g.ctx[1], &g.ep[1], NULL, &g.comm[1]), DSGD_OK);
        job_init(&jb, J_ALLREDUCE, 10);
        jb.op = DSGD_REDUCE_SUM;
        jb.algo = DSGD_ALLREDUCE_RECURSIVE_DOUBLING;
        jb.timeout = 20.0;
        for (r = 0; r < 2; ++r) fill_inputs(a[r], 9, r, 10);
        run_job(&g, &jb, a, w);
        for (r = 0; r < 2; ++r) {
            if (w[r].res != DSGD_ERR_DESYNC || w[r].elapsed > 5.0)
                fail_msg("mixed sendrecv_upto: rank %d: %s after %.2f s: %s", r, dsgd_result_string(w[r].res),
                         w[r].elapsed, w[r].msg);
        }
        printf("    endpoints with and without sendrecv_upto: %s\n", w[0].msg);
        free_bufs(a, 2);
        group_free(&g);
    }
    {   /* transfers per rank */
        /* bcast: a broadcast from rank 1 instead (plain: -1, each rank's own count of tree steps) */
        static const struct { int n; dsgd_allreduce_algo algo; int bcast, folded, plain; } cases[] = {
            {2, DSGD_ALLREDUCE_RING, 0, 2, 3}, {2, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, 0, 1, 2},
            {4, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, 0, 2, 4}, {3, DSGD_ALLREDUCE_RING, 0, 5, 6},
            {4, DSGD_ALLREDUCE_RING, 0, 8, 8}, {4, DSGD_ALLREDUCE_AUTO, 1, 2, -1}, {5, DSGD_ALLREDUCE_AUTO, 1, 3, -1}};
        int i, up;
        for (i = 0; i < (int)(sizeof(cases) / sizeof(cases[0])); ++i)
            for (up = 0; up < 2; ++up) {
                int n = cases[i].n;
                counting ks[MAXN];
                /* 4000 floats: four chunks of the all-reduce's map, a block per rank at N <= 4 */
                float **a = alloc_bufs(n, 4000);
                group g;
                job jb;
                worker w[MAXN];
                group_init(&g, n, NULL, 0);
                wrap_counting(&g, ks, up);
                const char *name = cases[i].bcast ? "broadcast" : dsgd_allreduce_algo_name(cases[i].algo);
                job_init(&jb, cases[i].bcast ? J_BROADCAST : J_ALLREDUCE, 4000);
                jb.op = DSGD_REDUCE_SUM;
                jb.algo = cases[i].algo;
                jb.root = 1;
                jb.timeout = 20.0;
                for (r = 0; r < n; ++r) fill_inputs(a[r], 5, r, 1000);
                run_job(&g, &jb, a, w);
                assert_all_ok(&g, w, "counted");
                for (r = 0; r < n; ++r) {
                    int want = up ? cases[i].folded : cases[i].plain;
                    if (want >= 0 && ks[r].calls != want)
                        fail_msg("N=%d %s, %s: rank %d made %d transfers, expected %d", n, name,
                                 up ? "sendrecv_upto" : "no sendrecv_upto", r, ks[r].calls, want);
                    if (cases[i].bcast && memcmp(a[r], a[1], 4000 * sizeof(float)) != 0)
                        fail_msg("N=%d broadcast: rank %d does not hold rank 1's data", n, r);
                }
                if (up && cases[i].plain >= 0)
                    printf("    N=%d %s, 4000 floats: %d transfers per rank with the fold, %d without\n", n, name,
                           cases[i].folded, cases[i].plain);
                else if (up)
                    printf("    N=%d %s, 4000 floats: %d transfers per rank with the fold (its agreement's "
                           "rounds)\n", n, name, cases[i].folded);
                free_bufs(a, n);
                group_free(&g);
            }
    }
}

/* The same bits at every bucket size: a 10,000-float vector all-reduced in
   one call and cut into buckets of 1 (its first 300 elements), 7 (its
   first 2,100), 100, 1000 and 4099 floats, each bucket with
   dsgd_allreduce_at at its offset, give bitwise-equal results, for every
   algorithm at N = 2..5 and 8 (HIERARCHICAL with 2 ranks per node at even
   N), SUM and MAX (inputs with +0 and -0, whose MAX depends on the
   operand order); at N = 3 also over plain send/recv (under TSan N = 3
   and 4 only). The ring's and the
   hierarchical all-reduce's bits are those of the serial reference of
   their order (tests/coll_ref.h). */
static void test_allreduce_buckets(void **state) {
    static const int NS[] = {2, 3, 4, 5, 8};
    static const size_t BUCKETS[][2] = {{1, 300}, {7, 2100}, {100, 10000}, {1000, 10000}, {4099, 10000}};
    /* make test: the same bucket sizes, 8 of each of the small ones (then
       the rest in one); make test-full 300 of 1 and of 7 and 100 of 100 */
    static const size_t QUICK_BUCKETS[][2] = {{1, 8}, {7, 56}, {100, 800}, {1000, 10000}, {4099, 10000}};
    const size_t(*buckets)[2] = tu_full() ? BUCKETS : QUICK_BUCKETS;
    static const dsgd_allreduce_algo ALG[] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_HALVING_DOUBLING,
                                              DSGD_ALLREDUCE_REDUCE_BROADCAST, DSGD_ALLREDUCE_RECURSIVE_DOUBLING,
                                              DSGD_ALLREDUCE_DIRECT, DSGD_ALLREDUCE_HIERARCHICAL};
    const size_t count = 10000;
    int ni, variant;
    (void)state;
    tu_watchdog(600);
    for (ni = 0; ni < (int)(sizeof(NS) / sizeof(NS[0])); ++ni)
        for (variant = 0; variant < 2; ++variant) {
            int n = NS[ni], ai, oi, r;
            group g;
            dsgd_comm_desc d;
            float **in, **whole, **cut, *want;
            if (variant && n != 3) continue;
            if (TU_TSAN && n != 3 && n != 4) continue; /* the threads' view, not the whole matrix (plain runs it) */
            in = alloc_bufs(n, count);
            whole = alloc_bufs(n, count);
            cut = alloc_bufs(n, count);
            want = (float *)malloc(count * sizeof(float));
            assert_non_null(want);
            memset(&d, 0, sizeof(d));
            d.ranks_per_node = n % 2 == 0 && n > 2 ? 2 : 0;
            group_init(&g, n, &d, variant);
            for (oi = 0; oi < 2; ++oi) {
                dsgd_reduce_op op = oi ? DSGD_REDUCE_MAX : DSGD_REDUCE_SUM;
                size_t i;
                for (r = 0; r < n; ++r) {
                    fill_inputs(in[r], 700 + (uint64_t)n, r, count);
                    if (op == DSGD_REDUCE_MAX) /* signed zeros: rank r's element i is -0 or +0 on a hash */
                        for (i = 0; i < count; i += 3) in[r][i] = ((i * 2654435761u + (size_t)r * 40503u) >> 7) & 1 ? 0.0f : -0.0f;
                }
                for (ai = 0; ai < (int)(sizeof(ALG) / sizeof(ALG[0])); ++ai) {
                    dsgd_allreduce_algo algo = ALG[ai];
                    job jb;
                    worker w[MAXN];
                    char what[160];
                    int bi;
                    if (variant && algo == DSGD_ALLREDUCE_DIRECT) continue; /* needs share */
                    snprintf(what, sizeof(what), "buckets N=%d%s %s %s", n, variant ? " (send/recv)" : "",
                             dsgd_allreduce_algo_name(algo), dsgd_reduce_op_name(op));
                    for (r = 0; r < n; ++r) memcpy(whole[r], in[r], count * sizeof(float));
                    job_init(&jb, J_ALLREDUCE, count);
                    jb.op = op;
                    jb.algo = algo;
                    jb.timeout = 60;
                    run_job(&g, &jb, whole, w);
                    assert_all_ok(&g, w, what);
                    assert_ranks_identical(&g, whole, count, what);
                    if (algo == DSGD_ALLREDUCE_RING || algo == DSGD_ALLREDUCE_HIERARCHICAL) {
                        ref_exact(want, (const float *const *)in, n, count, 0, op,
                                  algo == DSGD_ALLREDUCE_RING ? REF_RING : REF_HIERARCHICAL,
                                  d.ranks_per_node ? d.ranks_per_node : n);
                        i = first_diff(want, whole[0], count);
                        if (i < count) {
                            print_error("%s: element %zu = %.9g, the order's reference gives %.9g\n", what, i,
                                        (double)whole[0][i], (double)want[i]);
                            fail();
                        }
                    }
                    for (bi = 0; bi < (int)(sizeof(BUCKETS) / sizeof(BUCKETS[0])); ++bi) {
                        for (r = 0; r < n; ++r) memcpy(cut[r], in[r], count * sizeof(float));
                        jb.bucket = buckets[bi][0];
                        jb.upto = buckets[bi][1];
                        run_job(&g, &jb, cut, w);
                        assert_all_ok(&g, w, what);
                        for (r = 0; r < n; ++r) {
                            i = first_diff(cut[r], whole[0], count);
                            if (i < count) {
                                print_error("%s: buckets of %zu: rank %d element %zu = %.9g, one call gives %.9g\n",
                                            what, buckets[bi][0], r, i, (double)cut[r][i], (double)whole[0][i]);
                                fail();
                            }
                        }
                    }
                }
            }
            group_free(&g);
            free(want);
            free_bufs(in, n);
            free_bufs(whole, n);
            free_bufs(cut, n);
        }
    tu_watchdog(0);
}

/* AUTO's documented choices. */
static void test_auto_choice(void **state) {
    group g2, g3, m2, m3;
    (void)state;
    group_init(&g2, 2, NULL, 0);
    group_init(&g3, 3, NULL, 0);
    group_init(&m2, 2, NULL, 1);
    group_init(&m3, 3, NULL, 1);
    /* the loopback shares memory */
    assert_int_equal(dsgd_allreduce_choose(g2.comm[0], 1024), DSGD_ALLREDUCE_DIRECT);
    assert_int_equal(dsgd_allreduce_choose(g3.comm[0], 16 * 1024 * 1024), DSGD_ALLREDUCE_DIRECT);
    /* message passing only */
    assert_int_equal(dsgd_allreduce_choose(m2.comm[0], 1024), DSGD_ALLREDUCE_RECURSIVE_DOUBLING);
    assert_int_equal(dsgd_allreduce_choose(m2.comm[0], 16 * 1024), DSGD_ALLREDUCE_RECURSIVE_DOUBLING);
    assert_int_equal(dsgd_allreduce_choose(m2.comm[0], 64 * 1024), DSGD_ALLREDUCE_HALVING_DOUBLING);
    assert_int_equal(dsgd_allreduce_choose(m2.comm[0], 16 * 1024 * 1024), DSGD_ALLREDUCE_RING);
    assert_int_equal(dsgd_allreduce_choose(m3.comm[0], 64 * 1024), DSGD_ALLREDUCE_RING);
    group_free(&g2);
    group_free(&g3);
    group_free(&m2);
    group_free(&m3);
}

/* Re-creates g's communicators over its endpoints with the transport's
   node layout (dsgd_transport_i.ranks_per_node) L, a native hook when
   native, and desc. */
static void regroup(group *g, int L, int native, const dsgd_comm_desc *desc) {
    int r;
    for (r = 0; r < g->n; ++r) {
        dsgd_comm_destroy(g->comm[r]);
        g->ep[r].ranks_per_node = L;
        g->ep[r].allreduce = native ? fake_native : NULL;
        assert_int_equal(dsgd_comm_create(g->ctx[r], &g->ep[r], desc, &g->comm[r]), DSGD_OK);
    }
}

/* The transport's node layout: a communicator created with ranks_per_node
   0 takes it, so AUTO picks HIERARCHICAL (before a native hook) and runs
   it, with its bits; a layout that does not divide the size, or the whole
   group, is one node; the desc's layout wins over the transport's. */
static void test_transport_layout(void **state) {
    enum { N = 4, COUNT = 1001 };
    group g, h;
    dsgd_comm_desc d;
    job jb;
    worker w[MAXN];
    float **a = alloc_bufs(N, COUNT), **b = alloc_bufs(N, COUNT);
    int r;
    (void)state;
    tu_watchdog(60);
    memset(&d, 0, sizeof(d));
    group_init(&g, N, NULL, 0);
    regroup(&g, 2, 0, NULL);
    assert_int_equal(dsgd_allreduce_choose(g.comm[0], 1024), DSGD_ALLREDUCE_HIERARCHICAL);
    regroup(&g, 2, 1, NULL);
    assert_int_equal(dsgd_allreduce_choose(g.comm[0], 1024), DSGD_ALLREDUCE_HIERARCHICAL);
    regroup(&g, 3, 1, NULL); /* does not divide 4: one node */
    assert_int_equal(dsgd_allreduce_choose(g.comm[0], 1024), DSGD_ALLREDUCE_AUTO);
    regroup(&g, N, 0, NULL); /* every rank on one node */
    assert_int_equal(dsgd_allreduce_choose(g.comm[0], 1024), DSGD_ALLREDUCE_DIRECT);
    d.ranks_per_node = N;    /* the desc wins */
    regroup(&g, 2, 0, &d);
    assert_int_equal(dsgd_allreduce_choose(g.comm[0], 1024), DSGD_ALLREDUCE_DIRECT);
    /* AUTO over the transport's layout = HIERARCHICAL over the desc's, bit for bit */
    regroup(&g, 2, 0, NULL);
    d.ranks_per_node = 2;
    group_init(&h, N, &d, 0);
    job_init(&jb, J_ALLREDUCE, COUNT);
    jb.op = DSGD_REDUCE_MEAN;
    jb.timeout = 10.0;
    for (r = 0; r < N; ++r) {
        fill_inputs(a[r], 31, r, COUNT);
        fill_inputs(b[r], 31, r, COUNT);
    }
    jb.algo = DSGD_ALLREDUCE_AUTO;
    run_job(&g, &jb, a, w);
    assert_all_ok(&g, w, "AUTO over the transport's layout");
    jb.algo = DSGD_ALLREDUCE_HIERARCHICAL;
    run_job(&h, &jb, b, w);
    assert_all_ok(&h, w, "HIERARCHICAL over the desc's layout");
    for (r = 0; r < N; ++r) assert_memory_equal(a[r], b[r], COUNT * sizeof(float));
    {   /* and it is the mean: against a serial double sum */
        float **in = alloc_bufs(N, COUNT);
        size_t i;
        for (r = 0; r < N; ++r) fill_inputs(in[r], 31, r, COUNT);
        for (i = 0; i < COUNT; ++i) {
            double m = 0.0;
            for (r = 0; r < N; ++r) m += in[r][i];
            m /= N;
            if (fabs(a[0][i] - m) > 1e-6 * (1.0 + fabs(m))) fail_msg("element %zu: %.9g, mean %.9g", i, a[0][i], m);
        }
        free_bufs(in, N);
    }
    free_bufs(a, N);
    free_bufs(b, N);
    group_free(&g);
    group_free(&h);
}

/* HIERARCHICAL: L ranks per node (dsgd_comm_desc.ranks_per_node) and M
   nodes, every op at small and odd counts, against the reference and the
   same bits on every rank; AUTO picks it; one node or one rank per node is
   RING, bit for bit; a layout that does not divide the size is refused; a
   rank with another layout is DSGD_ERR_DESYNC on every rank. */
static void test_hierarchical(void **state) {
    static const int layouts[][2] = {{4, 2}, {6, 2}, {6, 3}, {8, 2}, {8, 4}, {4, 1}, {4, 4}};
    size_t counts[6];
    int li, ci, oi, r;
    (void)state;
    tu_watchdog(240);
    for (li = 0; li < (int)(sizeof(layouts) / sizeof(layouts[0])); ++li) {
        int n = layouts[li][0], L = layouts[li][1];
        group g, ring;
        dsgd_comm_desc d;
        /* make test under TSan: the layouts at N = 4 and 6 (two and three
           nodes, 256-byte pieces, send/recv only, one level); make
           test-full also the two at N = 8 */
        if (TU_TSAN && !tu_full() && n == 8) continue;
        memset(&d, 0, sizeof(d));
        d.ranks_per_node = L;
        d.piece_bytes = li % 2 ? 256 : 0; /* many pieces for some */
        group_init(&g, n, &d, li == 2);
        d.ranks_per_node = 0;
        group_init(&ring, n, &d, 0);
        assert_int_equal(dsgd_allreduce_choose(g.comm[0], 1 << 20),
                         L > 1 && L < n ? DSGD_ALLREDUCE_HIERARCHICAL
                                        : (li == 2 ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_DIRECT));
        counts[0] = 0;
        counts[1] = 1;
        counts[2] = (size_t)n - 1;
        counts[3] = (size_t)n + 1;
        counts[4] = 1000;
        counts[5] = 100003;
        for (ci = 0; ci < 6; ++ci) {
            /* make test: 100003 only at the default piece size (rendezvous
               messages); at 256-byte pieces 1000 already makes many pieces */
            if (!tu_full() && ci == 5 && d.piece_bytes) continue;
            ref rf;
            float **bufs = alloc_bufs(n, counts[ci]), **rb = alloc_bufs(n, counts[ci]);
            uint64_t seed = 900 + (uint64_t)li * 10 + (uint64_t)ci;
            ref_compute(&rf, seed, n, counts[ci]);
            for (oi = 0; oi < 4; ++oi) {
                /* make test: one op per count, turning with the count and
                   the layout (each layout meets every op); make test-full
                   runs every op at every count */
                if (!tu_full() && oi != (ci + li) % 4) continue;
                check_allreduce(&g, bufs, &rf, seed, counts[ci], OPS[oi], DSGD_ALLREDUCE_HIERARCHICAL);
                if (L == 1 || L == n) { /* one level: the ring's bits */
                    check_allreduce(&ring, rb, &rf, seed, counts[ci], OPS[oi], DSGD_ALLREDUCE_RING);
                    for (r = 0; r < n; ++r)
                        if (counts[ci] && memcmp(bufs[r], rb[r], counts[ci] * sizeof(float)) != 0)
                            fail_msg("hierarchical N=%d L=%d count %zu op %s: rank %d differs from RING", n, L,
                                     counts[ci], dsgd_reduce_op_name(OPS[oi]), r);
                }
            }
            ref_free(&rf);
            free_bufs(bufs, n);
            free_bufs(rb, n);
        }
        group_free(&g);
        group_free(&ring);
    }
    {   /* layouts refused, and a rank with another layout */
        dsgd_ctx *ctx = NULL;
        dsgd_loopback *hub = NULL;
        dsgd_transport_i ep;
        dsgd_comm *c = NULL;
        dsgd_comm_desc d;
        group g;
        job jb;
        worker w[MAXN];
        float **bufs = alloc_bufs(4, 16);
        assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
        assert_int_equal(dsgd_loopback_create(ctx, 4, &hub), DSGD_OK);
        assert_int_equal(dsgd_loopback_endpoint(hub, 0, &ep), DSGD_OK);
        memset(&d, 0, sizeof(d));
        d.ranks_per_node = 3;
        assert_int_equal(dsgd_comm_create(ctx, &ep, &d, &c), DSGD_ERR_INVALID_ARGUMENT);
        d.ranks_per_node = -1;
        assert_int_equal(dsgd_comm_create(ctx, &ep, &d, &c), DSGD_ERR_INVALID_ARGUMENT);
        dsgd_loopback_destroy(hub);
        dsgd_ctx_destroy(ctx);
        d.ranks_per_node = 2;
        group_init(&g, 4, &d, 0);
        dsgd_comm_destroy(g.comm[3]);
        d.ranks_per_node = 4;
        assert_int_equal(dsgd_comm_create(g.ctx[3], &g.ep[3], &d, &g.comm[3]), DSGD_OK);
        job_init(&jb, J_ALLREDUCE, 16);
        jb.op = DSGD_REDUCE_SUM;
        jb.algo = DSGD_ALLREDUCE_RING;
        jb.timeout = 10.0;
        for (r = 0; r < 4; ++r) fill_inputs(bufs[r], 5, r, 16);
        run_job(&g, &jb, bufs, w);
        for (r = 0; r < 4; ++r) {
            assert_int_equal(w[r].res, DSGD_ERR_DESYNC);
            assert_non_null(strstr(w[r].msg, "ranks per node"));
            assert_true(w[r].elapsed < 5.0);
        }
        free_bufs(bufs, 4);
        group_free(&g);
    }
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- the half wire */

/* The bound of dsgd_allreduce_wire's header for one element: A = sum |x_i|
   over the n ranks, k the scale. */
static double wire_bound(dsgd_wire wire, int n, double A, int k) {
    double u = wire == DSGD_WIRE_F16 ? 0x1p-11 : 0x1p-8, eta = wire == DSGD_WIRE_F16 ? 0x1p-25 : 0x1p-134;
    double c = pow(1.0 + u, n) * pow(1.0 + 0x1p-24, n - 1);
    return (c - 1.0) * A + 2.0 * c * n * eta * ldexp(1.0, -k) + 0x1p-149;
}

/* Checks bufs[0..n) after a wire all-reduce of in[0..n): every rank the
   same bits, every element within the bound of its exact (double) sum;
   returns the largest error over the bound seen (<= 1). */
static double check_wire(float *const *bufs, float *const *in, int n, size_t count, dsgd_wire wire,
                         const char *what) {
    double M = 0, worst = 0;
    size_t i;
    int r, k;
    for (r = 0; r < n; ++r)
        for (i = 0; i < count; ++i)
            if (isfinite(in[r][i]) && fabs((double)in[r][i]) > M) M = fabs((double)in[r][i]);
    k = dsgd_wire_scale((float)M, n);
    for (r = 1; r < n; ++r)
        if (count && memcmp(bufs[0], bufs[r], count * sizeof(float)) != 0)
            fail_msg("%s: rank %d differs from rank 0", what, r);
    for (i = 0; i < count; ++i) {
        double S = 0, A = 0, b, err;
        for (r = 0; r < n; ++r) {
            S += (double)in[r][i];
            A += fabs((double)in[r][i]);
        }
        b = wire_bound(wire, n, A, k);
        err = fabs((double)bufs[0][i] - S);
        if (!(err <= b))
            fail_msg("%s: element %zu = %.9g, exact %.9g: error %.3g over the bound %.3g (N=%d, k=%d)", what, i,
                     (double)bufs[0][i], S, err, b, n, k);
        if (b > 0 && err / b > worst) worst = err / b;
    }
    return worst;
}

/* Random data at N = 2..8, both half wires, AUTO and RING, over the
   loopback at the default piece size and at 256-byte pieces (the ring
   in pieces), and over send/recv only: within the header's bound of the
   exact sum, the same bits on every rank, the same bits whatever the
   piece size and transport; the worst error relative to the bound is
   printed (a bound that is far from tight would show). The loopback's
   AUTO is DIRECT in fp32: with a wire it is the ring (the same bits as
   RING). */
static void test_wire_bound(void **state) {
    const size_t count = TU_TSAN ? 3001 : 20011;
    int n, wi, variant, r;
    (void)state;
    tu_watchdog(600);
    for (n = 2; n <= MAXN; ++n) {
        float **in, **out, **ref0;
        if (TU_TSAN && n != 3 && n != 4) continue;
        if (!tu_full() && (n == 6 || n == 7)) continue; /* make test: N = 2 to 5 and 8 */
        in = alloc_bufs(n, count);
        out = alloc_bufs(n, count);
        ref0 = alloc_bufs(n, count);
        for (r = 0; r < n; ++r) fill_inputs(in[r], 900 + (uint64_t)n, r, count);
        for (wi = 1; wi < (int)DSGD_WIRE_COUNT; ++wi) {
            double worst = 0;
            for (variant = 0; variant < 4; ++variant) {
                dsgd_comm_desc d;
                group g;
                job jb;
                worker w[MAXN];
                char what[160];
                memset(&d, 0, sizeof(d));
                if (variant == 2) d.piece_bytes = 256;
                group_init(&g, n, &d, variant == 3);
                snprintf(what, sizeof(what), "wire %s N=%d %s", dsgd_wire_name((dsgd_wire)wi), n,
                         variant == 0 ? "AUTO" : variant == 1 ? "RING" : variant == 2 ? "RING, 256-byte pieces"
                                                                                     : "RING over send/recv");
                for (r = 0; r < n; ++r) memcpy(out[r], in[r], count * sizeof(float));
                job_init(&jb, J_ALLREDUCE, count);
                jb.op = DSGD_REDUCE_SUM;
                jb.algo = variant ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_AUTO;
                jb.wire = (dsgd_wire)wi;
                jb.timeout = 60;
                run_job(&g, &jb, out, w);
                assert_all_ok(&g, w, what);
                worst = fmax(worst, check_wire(out, in, n, count, (dsgd_wire)wi, what));
                if (variant == 0)
                    for (r = 0; r < n; ++r) memcpy(ref0[r], out[r], count * sizeof(float));
                else if (memcmp(ref0[0], out[0], count * sizeof(float)) != 0)
                    fail_msg("%s: other bits than AUTO at the default piece size", what);
                group_free(&g);
            }
            print_message("wire %s N=%d: worst error %.2f of the bound\n", dsgd_wire_name((dsgd_wire)wi), n, worst);
        }
        free_bufs(in, n);
        free_bufs(out, n);
        free_bufs(ref0, n);
    }
    tu_watchdog(0);
}

/* Cutting into buckets (dsgd_allreduce_wire's first) and the transport do
   not change the bits where every bucket gets the same scale: inputs with
   magnitudes in [1, 2) (every bucket's largest exponent is 0), of both
   signs, so that partial sums cancel to small values; buckets of 1, 7, 100
   and 4099 floats, at N = 3, 4, 5, and a ring of 256-byte pieces. */
static void test_wire_buckets(void **state) {
    static const int NS[] = {3, 4, 5};
    static const size_t BUCKETS[][2] = {{1, 300}, {7, 2100}, {100, 10000}, {4099, 10000}};
    /* make test: the same bucket sizes, 8 of each of the small ones (then
       the rest in one); make test-full 300 of 1 and of 7 and 100 of 100 */
    static const size_t QUICK_BUCKETS[][2] = {{1, 8}, {7, 56}, {100, 800}, {4099, 10000}};
    const size_t(*buckets)[2] = tu_full() ? BUCKETS : QUICK_BUCKETS;
    const size_t count = 10000;
    int ni, wi, bi, r, pieces;
    (void)state;
    tu_watchdog(600);
    for (ni = 0; ni < 3; ++ni) {
        int n = NS[ni];
        float **in = alloc_bufs(n, count), **whole = alloc_bufs(n, count), **cut = alloc_bufs(n, count);
        size_t i;
        if (TU_TSAN && n != 3) {
            free_bufs(in, n);
            free_bufs(whole, n);
            free_bufs(cut, n);
            continue;
        }
        for (r = 0; r < n; ++r)
            for (i = 0; i < count; ++i) {
                float v = input_value(77, r, i);
                in[r][i] = (v < 0 ? -1.0f : 1.0f) * (1.0f + (float)fmod(fabs((double)v) * 7.31, 1.0));
            }
        for (wi = 1; wi < (int)DSGD_WIRE_COUNT; ++wi)
            for (pieces = 0; pieces < 2; ++pieces) {
                dsgd_comm_desc d;
                group g;
                job jb;
                worker w[MAXN];
                char what[128];
                memset(&d, 0, sizeof(d));
                d.piece_bytes = pieces ? 256 : 0;
                group_init(&g, n, &d, 0);
                snprintf(what, sizeof(what), "wire %s buckets N=%d%s", dsgd_wire_name((dsgd_wire)wi), n,
                         pieces ? " (256-byte pieces)" : "");
                for (r = 0; r < n; ++r) memcpy(whole[r], in[r], count * sizeof(float));
                job_init(&jb, J_ALLREDUCE, count);
                jb.op = DSGD_REDUCE_SUM;
                jb.algo = DSGD_ALLREDUCE_RING;
                jb.wire = (dsgd_wire)wi;
                jb.timeout = 60;
                run_job(&g, &jb, whole, w);
                assert_all_ok(&g, w, what);
                check_wire(whole, in, n, count, (dsgd_wire)wi, what);
                for (bi = 0; bi < 4; ++bi) {
                    for (r = 0; r < n; ++r) memcpy(cut[r], in[r], count * sizeof(float));
                    jb.bucket = buckets[bi][0];
                    jb.upto = buckets[bi][1];
                    run_job(&g, &jb, cut, w);
                    assert_all_ok(&g, w, what);
                    for (r = 0; r < n; ++r)
                        if ((i = first_diff(cut[r], whole[0], count)) < count)
                            fail_msg("%s: buckets of %zu: rank %d element %zu = %.9g, one call gives %.9g", what,
                                     buckets[bi][0], r, i, (double)cut[r][i], (double)whole[0][i]);
                }
                group_free(&g);
            }
        free_bufs(in, n);
        free_bufs(whole, n);
        free_bufs(cut, n);
    }
    tu_watchdog(0);
}

/* 6e4 and 1e-6 in one bucket on every rank (and their negatives, and a
   zero) at N = 8: without the scale fp16 would overflow (8 x 6e4 > 65504)
   and a plain fp16 would flush the small ones' sum; with it, no Inf, no
   zero where the sum is not zero, within the bound, on both wires. */
static void test_wire_extremes(void **state) {
    const int n = 8;
    const size_t count = 2048;
    int wi, r;
    (void)state;
    tu_watchdog(120);
    for (wi = 1; wi < (int)DSGD_WIRE_COUNT; ++wi) {
        float **in = alloc_bufs(n, count), **out = alloc_bufs(n, count);
        group g;
        job jb;
        worker w[MAXN];
        size_t i;
        char what[64];
        snprintf(what, sizeof(what), "wire %s extremes", dsgd_wire_name((dsgd_wire)wi));
        for (r = 0; r < n; ++r)
            for (i = 0; i < count; ++i) {
                static const float vals[5] = {6e4f, 1e-6f, -6e4f, -1e-6f, 0.0f};
                in[r][i] = i < 5 ? vals[i] : vals[(i + (size_t)r) % 2] * (1.0f + (float)(i % 13) / 16.0f);
                out[r][i] = in[r][i];
            }
        group_init(&g, n, NULL, 0);
        job_init(&jb, J_ALLREDUCE, count);
        jb.op = DSGD_REDUCE_SUM;
        jb.wire = (dsgd_wire)wi;
        jb.timeout = 60;
        run_job(&g, &jb, out, w);
        assert_all_ok(&g, w, what);
        check_wire(out, in, n, count, (dsgd_wire)wi, what);
        for (i = 0; i < count; ++i) {
            double S = 0;
            for (r = 0; r < n; ++r) S += (double)in[r][i];
            if (isinf(out[0][i])) fail_msg("%s: element %zu is Inf (exact %.9g)", what, i, S);
            if (S != 0 && out[0][i] == 0.0f) fail_msg("%s: element %zu is 0 (exact %.9g)", what, i, S);
        }
        print_message("%s: 8 x 6e4 -> %.9g, 8 x 1e-6 -> %.9g\n", what, (double)out[0][0], (double)out[0][1]);
        group_free(&g);
        free_bufs(in, n);
        free_bufs(out, n);
    }
    tu_watchdog(0);
}

static int ceil_log2i(int n) {
    int k = 0;
    while ((1 << k) < n) ++k;
    return k;
}

/* dsgd_comm_stats' bytes against the closed forms of its header, per
   rank, for count = N x 2048 floats (every block 2048): the ring in fp32,
   the ring on the f16 and bf16 wires (half the payload; bytes_uncompressed
   the fp32 payload), DIRECT, over the loopback (the agreement's rounds
   over sendrecv_upto: 152 bytes) and over send/recv only (144), at N = 2,
   3, 4, 5, 8; the counts add up over calls and reset; compress_s is 0 in
   fp32 and positive on a wire; comm_s positive; dsgd_comm_stats_add adds
   every field. */
static void test_wire_stats(void **state) {
    static const int NS[] = {2, 3, 4, 5, 8};
    int ni, minimal, r;
    (void)state;
    tu_watchdog(300);
    for (ni = 0; ni < 5; ++ni)
        for (minimal = 0; minimal < 2; ++minimal) {
            int n = NS[ni], a;
            size_t count = (size_t)n * 2048, payload4 = 2 * (size_t)(n - 1) * 4 * 2048;
            uint64_t G = minimal ? 144 : 152, agree = (uint64_t)ceil_log2i(n) * G;
            float **bufs = alloc_bufs(n, count);
            group g;
            if (TU_TSAN && n != 3 && n != 4) {
                free_bufs(bufs, n);
                continue;
            }
            group_init(&g, n, NULL, minimal);
            for (a = 0; a < 4; ++a) { /* ring f32, ring f16, ring bf16, DIRECT */
                job jb;
                worker w[MAXN];
                uint64_t want_sent, want_unc;
                char what[96];
                if (a == 3 && minimal) continue; /* DIRECT needs share */
                snprintf(what, sizeof(what), "stats N=%d%s %s", n, minimal ? " (send/recv)" : "",
                         a == 0 ? "ring" : a == 1 ? "ring f16" : a == 2 ? "ring bf16" : "direct");
                for (r = 0; r < n; ++r) {
                    fill_inputs(bufs[r], 5, r, count);
                    dsgd_comm_reset_stats(g.comm[r]);
                }
                job_init(&jb, J_ALLREDUCE, count);
                jb.op = DSGD_REDUCE_SUM;
                jb.algo = a == 3 ? DSGD_ALLREDUCE_DIRECT : DSGD_ALLREDUCE_RING;
                jb.wire = a == 1 ? DSGD_WIRE_F16 : a == 2 ? DSGD_WIRE_BF16 : DSGD_WIRE_F32;
                jb.timeout = 60;
                run_job(&g, &jb, bufs, w);
                run_job(&g, &jb, bufs, w); /* twice: the counts add up */
                assert_all_ok(&g, w, what);
                if (a == 3) {
                    want_sent = want_unc = (uint64_t)(n - 1) * 64 + payload4;
                } else if (a == 0) {
                    want_sent = want_unc = agree + payload4;
                } else {
                    want_sent = agree + payload4 / 2;
                    want_unc = agree + payload4;
                }
                for (r = 0; r < n; ++r) {
                    dsgd_comm_stats st;
                    dsgd_comm_get_stats(g.comm[r], &st);
                    if (st.bytes_sent != 2 * want_sent || st.bytes_uncompressed != 2 * want_unc)
                        fail_msg("%s: rank %d sent %llu bytes (%llu as fp32), the closed form %llu (%llu)", what, r,
                                 (unsigned long long)st.bytes_sent, (unsigned long long)st.bytes_uncompressed,
                                 (unsigned long long)(2 * want_sent), (unsigned long long)(2 * want_unc));
                    assert_true(st.comm_s > 0);
                    if (a == 1 || a == 2) assert_true(st.compress_s > 0);
                    else assert_true(st.compress_s == 0);
                }
            }
            {
                dsgd_comm_stats st, add = {100, 300, 0.25, 0.5};
                dsgd_comm_reset_stats(g.comm[0]);
                dsgd_comm_get_stats(g.comm[0], &st);
                assert_true(st.bytes_sent == 0 && st.bytes_uncompressed == 0 && st.compress_s == 0 && st.comm_s == 0);
                dsgd_comm_stats_add(g.comm[0], &add);
                dsgd_comm_stats_add(g.comm[0], &add);
                dsgd_comm_stats_add(g.comm[0], NULL);
                dsgd_comm_get_stats(g.comm[0], &st);
                assert_true(st.bytes_sent == 200 && st.bytes_uncompressed == 600 && st.compress_s == 0.5 &&
                            st.comm_s == 1.0);
                dsgd_comm_get_stats(NULL, &st);
                assert_true(st.bytes_sent == 0 && st.comm_s == 0);
                dsgd_comm_get_stats(g.comm[0], NULL);
                dsgd_comm_reset_stats(NULL);
                dsgd_comm_stats_add(NULL, &add);
            }
            group_free(&g);
            free_bufs(bufs, n);
        }
    tu_watchdog(0);
}

/* A half wire's refusals (before the collective starts: dsgd_comm_seq
   unchanged) and a disagreement on the wire (DSGD_ERR_DESYNC on every
   rank, naming it, no buffer touched); one rank returns at once,
   unchanged; dsgd_wire_name and dsgd_wire_scale. */
static void test_wire_errors(void **state) {
    group g;
    job jb, alt;
    worker w[MAXN];
    float **bufs = alloc_bufs(3, 100), buf1[4] = {1.5f, 2.5f, -3.0f, 1e-9f}, keep[4];
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_transport_i ep;
    dsgd_comm *c1;
    int r;
    size_t i;
    (void)state;
    tu_watchdog(60);
    group_init(&g, 3, NULL, 0);
    assert_int_equal(dsgd_allreduce_wire(g.comm[0], bufs[0], 100, 0, DSGD_REDUCE_MAX, DSGD_ALLREDUCE_RING,
                                         DSGD_WIRE_F16, 0), DSGD_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsgd_ctx_last_error(g.ctx[0]), "sums only"));
    assert_int_equal(dsgd_allreduce_wire(g.comm[0], bufs[0], 100, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_DIRECT,
                                         DSGD_WIRE_BF16, 0), DSGD_ERR_UNSUPPORTED);
    assert_non_null(strstr(dsgd_ctx_last_error(g.ctx[0]), "runs on the ring"));
    assert_int_equal(dsgd_allreduce_wire(g.comm[0], bufs[0], 100, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING,
                                         (dsgd_wire)7, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allreduce_wire(g.comm[0], NULL, 100, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING,
                                         DSGD_WIRE_F16, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_allreduce_wire(NULL, bufs[0], 100, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING,
                                         DSGD_WIRE_F16, 0), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_comm_seq(g.comm[0]), 0);
    /* rank 2 on another wire */
    for (r = 0; r < 3; ++r)
        for (i = 0; i < 100; ++i) bufs[r][i] = (float)(r * 100 + (int)i);
    job_init(&jb, J_ALLREDUCE, 100);
    jb.op = DSGD_REDUCE_SUM;
    jb.algo = DSGD_ALLREDUCE_RING;
    jb.wire = DSGD_WIRE_F16;
    jb.timeout = 10;
    alt = jb;
    alt.wire = DSGD_WIRE_BF16;
    jb.alt = &alt;
    jb.alt_rank = 2;
    run_job(&g, &jb, bufs, w);
    for (r = 0; r < 3; ++r) {
        assert_int_equal(w[r].res, DSGD_ERR_DESYNC);
        assert_non_null(strstr(w[r].msg, "bf16 wire"));
        for (i = 0; i < 100; ++i) assert_true(bufs[r][i] == (float)(r * 100 + (int)i));
    }
    alt.wire = DSGD_WIRE_F32; /* fp32 against a wire: another algorithm, as the fingerprint says */
    run_job(&g, &jb, bufs, w);
    for (r = 0; r < 3; ++r) assert_int_equal(w[r].res, DSGD_ERR_DESYNC);
    group_free(&g);
    free_bufs(bufs, 3);
    /* one rank */
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(ctx, 1, &hub), DSGD_OK);
    assert_int_equal(dsgd_loopback_endpoint(hub, 0, &ep), DSGD_OK);
    assert_int_equal(dsgd_comm_create(ctx, &ep, NULL, &c1), DSGD_OK);
    memcpy(keep, buf1, sizeof(keep));
    assert_int_equal(dsgd_allreduce_wire(c1, buf1, 4, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, DSGD_WIRE_F16, 0),
                     DSGD_OK);
    assert_memory_equal(buf1, keep, sizeof(keep));
    assert_int_equal(dsgd_comm_seq(c1), 1);
    dsgd_comm_destroy(c1);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    /* names and the scale */
    assert_string_equal(dsgd_wire_name(DSGD_WIRE_F32), "f32");
    assert_string_equal(dsgd_wire_name(DSGD_WIRE_F16), "f16");
    assert_string_equal(dsgd_wire_name(DSGD_WIRE_BF16), "bf16");
    assert_string_equal(dsgd_wire_name((dsgd_wire)9), "unknown");
    assert_int_equal(dsgd_wire_scale(1.0f, 1), 14);     /* [1, 2): below 2^15 */
    assert_int_equal(dsgd_wire_scale(1.99f, 8), 11);    /* 8 of them below 2^15 */
    assert_int_equal(dsgd_wire_scale(6e4f, 8), -4);     /* 2^15 <= 6e4 < 2^16 */
    assert_int_equal(dsgd_wire_scale(0.0f, 2), 126);    /* clamped */
    assert_int_equal(dsgd_wire_scale(3e38f, 2), -114);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- waits */
/* Who made whom wait (dsgd_comm_get_waits), over simnet's virtual clock:
   rank s enters each collective X = 0.25 s after the others
   (dsgd_simnet_advance). With free links every rank j != s has waited
   exactly X for s and 0 for everyone else, whatever the collective's
   pattern (the agreement passes the lateness on through its messengers),
   and s waited for nobody. With costly links the other waits stay within
   the collective's own time T0 (the same collective without the
   straggler, every rank's longest), and the wait on s within T0 of X. */

#define WT_KINDS 9
static const char *const WT_NAMES[WT_KINDS] = {"ring",      "recursive doubling", "halving-doubling",
                                              "reduce-broadcast", "barrier", "broadcast", "allgather",
                                              "reduce-scatter", "auto (1 float)"};

typedef struct wt_run {
    int n, late, kind;
    double late_s;
    double waits[MAXN][MAXN];
    double took[MAXN]; /* the collective's virtual time on each rank */
    dsgd_result res[MAXN];
    char msg[MAXN][256];
} wt_run;

static void wt_rank(dsgd_simnet *hub, int rank, const dsgd_transport_i *ep, void *user) {
    static const dsgd_allreduce_algo algo[4] = {DSGD_ALLREDUCE_RING, DSGD_ALLREDUCE_RECURSIVE_DOUBLING,
                                                DSGD_ALLREDUCE_HALVING_DOUBLING, DSGD_ALLREDUCE_REDUCE_BROADCAST};
    wt_run *w = (wt_run *)user;
    dsgd_ctx *ctx = NULL;
    dsgd_comm *c = NULL;
    float buf[1000];
    size_t count = 1000;
    double t0;
    dsgd_result r = dsgd_ctx_create(NULL, &ctx);
    int i;
    for (i = 0; i < 1000; ++i) buf[i] = (float)(rank + i);
    if (r == DSGD_OK) r = dsgd_comm_create(ctx, ep, NULL, &c);
    if (r == DSGD_OK && rank == w->late) r = dsgd_simnet_advance(hub, rank, w->late_s);
    t0 = ep->now(ep->impl);
    if (r == DSGD_OK) {
        if (w->kind < 4) r = dsgd_allreduce(c, buf, count, DSGD_REDUCE_SUM, algo[w->kind], 0.0);
        else if (w->kind == 4) r = dsgd_barrier(c, 0.0);
        else if (w->kind == 5) r = dsgd_broadcast(c, buf, count, 1 % w->n, 0.0);
        else if (w->kind == 6) r = dsgd_allgather(c, buf, count, 0.0);
        else if (w->kind == 7) r = dsgd_reduce_scatter(c, buf, count, DSGD_REDUCE_SUM, 0.0);
        else r = dsgd_allreduce(c, buf, 1, DSGD_REDUCE_MAX, DSGD_ALLREDUCE_AUTO, 0.0);
    }
    w->took[rank] = ep->now(ep->impl) - t0;
    if (r == DSGD_OK) r = dsgd_comm_get_waits(c, w->waits[rank], MAXN);
    w->res[rank] = r;
    snprintf(w->msg[rank], sizeof(w->msg[rank]), "%s", r == DSGD_OK ? "" : dsgd_ctx_last_error(ctx));
    dsgd_comm_destroy(c);
    dsgd_ctx_destroy(ctx);
}

static void wt_go(wt_run *w, int n, int late, int kind, double late_s, int costly) {
    dsgd_ctx *ctx;
    dsgd_simnet *hub;
    dsgd_simnet_desc d;
    int r;
    memset(w, 0, sizeof(*w));
    w->n = n;
    w->late = late;
    w->kind = kind;
    w->late_s = late_s;
    memset(&d, 0, sizeof(d));
    d.ranks = n;
    if (costly) {
        d.alpha_s = 1e-4;
        d.beta_s_per_byte = 1e-9;
        d.gamma_s_per_float = 1e-10;
    }
    assert_int_equal(dsgd_ctx_create(NULL, &ctx), DSGD_OK);
    TU_OK(ctx, dsgd_simnet_create(ctx, &d, &hub));
    TU_OK(ctx, dsgd_simnet_run(hub, wt_rank, w));
    for (r = 0; r < n; ++r)
        if (w->res[r] != DSGD_OK) fail_msg("%s N=%d: rank %d: %s", WT_NAMES[kind], n, r, w->msg[r]);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
}

static void test_waits_simnet(void **state) {
    static const int Ns[5] = {2, 3, 4, 5, 8};
    const double X = 0.25;
    int ni, kind, costly;
    (void)state;
    tu_watchdog(120);
    for (costly = 0; costly < 2; ++costly) {
        for (ni = 0; ni < 5; ++ni) {
            int n = Ns[ni], li;
            /* make test under TSan: N = 2, 3 and 4; make test-full also 5 and 8 */
            if (TU_TSAN && !tu_full() && n > 4) continue;
            for (kind = 0; kind < WT_KINDS; ++kind) {
                wt_run base, w;
                double t0 = 0;
                int j, k;
                if (kind == 2 && (n & (n - 1))) continue; /* halving-doubling folds first; any N works, but keep it short */
                wt_go(&base, n, -1, kind, 0.0, costly);
                for (j = 0; j < n; ++j) t0 = base.took[j] > t0 ? base.took[j] : t0;
                if (!costly) assert_true(t0 == 0.0); /* free links: the collective takes no time */
                for (li = 0; li < 3; ++li) {
                    int late = li == 0 ? 0 : li == 1 ? n - 1 : n / 2;
                    wt_go(&w, n, late, kind, X, costly);
                    for (j = 0; j < n; ++j) {
                        double others = 0;
                        assert_true(w.waits[j][j] == 0.0);
                        for (k = 0; k < n; ++k)
                            if (k != late && k != j) others += w.waits[j][k];
                        if (j == late) {
                            others += 0; /* the straggler waited for nobody but message times */
                            if (others > t0 + 1e-12)
                                fail_msg("%s N=%d late %d: the straggler waited %.9g s (T0 %.9g)", WT_NAMES[kind], n,
                                         late, others, t0);
                            continue;
                        }
                        if (fabs(w.waits[j][late] - X) > t0 + 1e-9)
                            fail_msg("%s N=%d late %d%s: rank %d waited %.12g s for it, want %.12g (+- %.3g)",
                                     WT_NAMES[kind], n, late, costly ? " (costly links)" : "", j, w.waits[j][late], X,
                                     t0);
                        if (others > t0 + 1e-12)
                            fail_msg("%s N=%d late %d%s: rank %d waited %.9g s for the others (T0 %.9g)",
                                     WT_NAMES[kind], n, late, costly ? " (costly links)" : "", j, others, t0);
                    }
                }
            }
        }
    }
    tu_watchdog(0);
}

/* The same in real time over the loopback (DIRECT, the ring and the
   barrier over sendrecv_upto): rank 2 sleeps 60 ms before the collective;
   every other rank's largest wait is on it and at least 40 ms. Then
   dsgd_comm_reset_stats zeros the waits, and bad arguments are refused. */
static void test_waits_loopback(void **state) {
    static const dsgd_allreduce_algo algos[3] = {DSGD_ALLREDUCE_DIRECT, DSGD_ALLREDUCE_RING,
                                                 DSGD_ALLREDUCE_RECURSIVE_DOUBLING};
    size_t count = 5000;
    int ai, r, k;
    double waits[MAXN];
    (void)state;
    tu_watchdog(60);
    for (ai = 0; ai < 4; ++ai) {
        group g;
        job jb;
        worker w[MAXN];
        float **bufs = alloc_bufs(4, count);
        group_init(&g, 4, NULL, 0);
        job_init(&jb, ai < 3 ? J_ALLREDUCE : J_BARRIER, count);
        jb.algo = ai < 3 ? algos[ai] : DSGD_ALLREDUCE_AUTO;
        jb.late_rank = 2;
        jb.late_s = 0.2; /* far above a busy machine's stalls: at 0.06 s, rank 0 once stalled as long */
        for (r = 0; r < 4; ++r) fill_inputs(bufs[r], 5, r, count);
        run_job(&g, &jb, bufs, w);
        assert_all_ok(&g, w, "late rank");
        for (r = 0; r < 4; ++r) {
            int most = -1;
            assert_int_equal(dsgd_comm_get_waits(g.comm[r], waits, MAXN), DSGD_OK);
            assert_true(waits[r] == 0.0);
            for (k = 0; k < 4; ++k)
                if (k != r && (most < 0 || waits[k] > waits[most])) most = k;
            if (r == 2) continue;
            if (most != 2 || waits[2] < 0.15)
                fail_msg("%s: rank %d waited %.4f s for rank 2 (most for rank %d, %.4f s)",
                         ai < 3 ? dsgd_allreduce_algo_name(algos[ai]) : "barrier", r, waits[2], most, waits[most]);
        }
        dsgd_comm_reset_stats(g.comm[0]);
        assert_int_equal(dsgd_comm_get_waits(g.comm[0], waits, 4), DSGD_OK);
        for (k = 0; k < 4; ++k) assert_true(waits[k] == 0.0);
        assert_int_equal(dsgd_comm_get_waits(NULL, waits, 4), DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsgd_comm_get_waits(g.comm[0], NULL, 4), DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsgd_comm_get_waits(g.comm[0], waits, 3), DSGD_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(dsgd_ctx_last_error(g.ctx[0]), "dsgd_comm_get_waits"));
        free_bufs(bufs, 4);
        group_free(&g);
    }
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_range),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_single_rank),
        cmocka_unit_test(test_fold),
        cmocka_unit_test(test_auto_choice),
        cmocka_unit_test(test_transport_layout),
        cmocka_unit_test(test_native_hook),
        cmocka_unit_test(test_allreduce_small),
        cmocka_unit_test(test_allreduce_large),
        cmocka_unit_test(test_allreduce_deterministic),
        cmocka_unit_test(test_hierarchical),
        cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_allreduce_buckets),
        cmocka_unit_test(test_allgather),
        cmocka_unit_test(test_broadcast),
        cmocka_unit_test(test_barrier),
        cmocka_unit_test(test_nan_propagates),
        cmocka_unit_test(test_mismatched_counts),
        cmocka_unit_test(test_mismatched_calls),
        cmocka_unit_test(test_late_rank),
        cmocka_unit_test(test_abort_wakes_waiters),
        cmocka_unit_test(test_timeout_missing_rank),
        cmocka_unit_test(test_wire_errors),
        cmocka_unit_test(test_wire_stats),
        cmocka_unit_test(test_wire_extremes),
        cmocka_unit_test(test_wire_buckets),
        cmocka_unit_test(test_wire_bound),
        cmocka_unit_test(test_waits_simnet),
        cmocka_unit_test(test_waits_loopback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
