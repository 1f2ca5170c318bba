/* test_compress.c - the gradient compressors of distsgd/compress.h.

   The hook is called directly, one pthread per replica over a loopback hub,
   on hand-built buckets (a 16 x 12 matrix, a 12-vector, a 10 x 3 x 4 tensor):
     - error feedback: with integer gradients, sum_t C_t + e_T = sum_t g_t
       exactly, for top-k, sign and PowerSGD with one replica (C the
       bucket the hook returns, e_T its saved residual), and with four for
       top-k and sign, C each replica's own part from a serial reference;
     - top-k and sign at four replicas equal, bit for bit, a serial
       reference (each replica's part, summed in rank order);
     - PowerSGD at four replicas: the bucket is the sum of the replicas'
       parts (M - e) within 1e-5, the vector exactly;
     - PowerSGD reproduces an exactly rank-r matrix (and a sum of rank-r
       matrices sharing their column space) within 1e-5 in one step, and
       a matrix of rank below r (rank 1 at r = 2, 3, 4; rank 2 at r = 3,
       4; 1, 2 and 4 replicas; with and without warm start) within 1e-5
       at every step, and
       with warm start converges to the best rank-1 error on a fixed matrix;
     - dsgd_compress_bytes against the bytes a counting transport saw, and
       PowerSGD's rows and columns (1 x m, n x 1) left plain at any rate;
     - bad descs refused with messages, by dsgd_compress_check and by a
       mirrored strategy given their hook (the same words, after the
       hook's name); save then load continues bit for
       bit; all replicas hold the same bits;
     - Deep Gradient Compression's settings for top-k: momentum correction
       in closed form (m = 1/2, a constant gradient: what is sent, u_T and
       v_T) and against a serial reference bit for bit at two replicas
       (sum_t C_t + v_T = sum_t a_t exactly), the sparsity warm-up's exact
       k at every step, their bad descs, and a resume bit for bit.
   Worker threads never assert; the main thread checks after joining.
   Through a MIRRORED strategy (a 12 -> 10 tanh -> 4 MLP, momentum, 2 and 4
   replicas): 250 steps, dsgd_strategy_save, destroy, a fresh strategy of
   the same desc, dsgd_strategy_restore, 250 more give the weights of 500
   uninterrupted steps on every replica bit for bit, and the checkpoints
   saved at step 500 (weights, optimizer slots and step, every replica's
   residual and Q memories) byte for byte: no hook, fp16, bf16, top-k
   (per variable; global), sign, PowerSGD rank 2 with warm start, all with
   error feedback, and start_iter 100 and 300 (the dense warm-up ends
   before the cut, after it). Each hook trains other bits than no hook,
   and a stateful hook's checkpoint is larger than no hook's. That is make
   test-full; make test (the quick tier) trains 25 + 25 of 50 steps, with
   start_iter 10 and 30.

   Build: make test (compiled without the implementation, linked against
   the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#define MAXN 4
#define NV 3
#define COUNT (192 + 12 + 120)

/* ---------------------------------------------------------------- a counting transport */

/* The loopback endpoint with only send, recv and sendrecv, counting the
   bytes this rank hands over. */
typedef struct counting {
    dsgd_transport_i inner;
    size_t sent;
} counting;

static dsgd_result cnt_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    counting *c = (counting *)impl;
    c->sent += bytes;
    return c->inner.send(c->inner.impl, dst, tag, buf, bytes, deadline);
}

static dsgd_result cnt_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    counting *c = (counting *)impl;
    return c->inner.recv(c->inner.impl, src, tag, buf, bytes, deadline);
}

static dsgd_result cnt_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                uint64_t rtag, void *rbuf, size_t rbytes, double deadline, int *failed_peer) {
    counting *c = (counting *)impl;
    if (dst >= 0) c->sent += sbytes;
    return c->inner.sendrecv(c->inner.impl, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, deadline, failed_peer);
}

/* ---------------------------------------------------------------- groups */

typedef struct group {
    int n;
    dsgd_ctx *main_ctx;
    dsgd_loopback *hub;
    dsgd_ctx *ctx[MAXN];
    dsgd_comm *comm[MAXN];
    dsgd_transport_i ep[MAXN];
    counting cnt[MAXN];
} group;

static void group_init(group *g, int n, int counted) {
    int r;
    memset(g, 0, sizeof(*g));
    g->n = n;
    assert_int_equal(dsgd_ctx_create(NULL, &g->main_ctx), DSGD_OK);
    assert_int_equal(dsgd_loopback_create(g->main_ctx, n, &g->hub), DSGD_OK);
    for (r = 0; r < n; ++r) {
        assert_int_equal(dsgd_ctx_create(NULL, &g->ctx[r]), DSGD_OK);
        assert_int_equal(dsgd_loopback_endpoint(g->hub, r, &g->ep[r]), DSGD_OK);
        if (counted) {
            dsgd_transport_i t;
            g->cnt[r].inner = g->ep[r];
            memset(&t, 0, sizeof(t));
            t.name = "counting";
            t.impl = &g->cnt[r];
            t.rank = r;
            t.size = n;
            t.send = cnt_send;
            t.recv = cnt_recv;
            t.sendrecv = cnt_sendrecv;
            g->ep[r] = t;
        }
        assert_int_equal(dsgd_comm_create(g->ctx[r], &g->ep[r], NULL, &g->comm[r]), DSGD_OK);
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

/* ---------------------------------------------------------------- the model */

static dsgd_variable g_vars[NV];
static const dsgd_variable *g_vp[NV];

static void make_var(int i, const char *name, size_t offset, int rank, int s0, int s1, int s2) {
    dsgd_variable *v = &g_vars[i];
    memset(v, 0, sizeof(*v));
    snprintf(v->name, sizeof(v->name), "%s", name);
    v->offset = offset;
    v->rank = rank;
    v->shape[0] = s0;
    v->shape[1] = s1;
    v->shape[2] = s2;
    v->count = (size_t)s0 * (size_t)(rank > 1 ? s1 : 1) * (size_t)(rank > 2 ? s2 : 1);
    v->aggregation = DSGD_AGG_SUM;
    g_vp[i] = v;
}

static void model_init(void) {
    make_var(0, "dense0/kernel", 0, 2, 16, 12, 0);
    make_var(1, "dense0/bias", 192, 1, 12, 0, 0);
    make_var(2, "conv0/kernel", 204, 3, 10, 3, 4);
}

/* ---------------------------------------------------------------- runs */

typedef void (*grad_fn)(int rank, int step, float *g, size_t count);

/* Integers in [-8, 8]; step 0 of kernel 0 carries a sign word that is a
   signalling NaN's bits (0xFFBFFFFF: all negative but element 22), so the
   all-gather must carry it bit for bit. */
static void grad_int(int rank, int step, float *g, size_t count) {
    tu_rng rng = tu_rng_make(1000u * (uint64_t)step + (uint64_t)rank + 7u);
    size_t i;
    for (i = 0; i < count; ++i) g[i] = (float)((int)tu_below(&rng, 17) - 8);
    if (step == 0)
        for (i = 0; i < 32; ++i) g[i] = i == 22 ? 8.0f : -8.0f;
}

typedef struct run {
    const dsgd_compress_desc *desc;
    int n, steps;
    int counted;
    dsgd_allreduce_algo algo;
    grad_fn grad;
    int64_t step0;                /* the first step's number */
    const unsigned char *load[MAXN]; /* state to load first (NULL: none) */
    size_t load_bytes[MAXN];
    /* per replica, per step t: [t * COUNT, (t + 1) * COUNT) */
    float *out[MAXN], *gin[MAXN], *res[MAXN]; /* res: residual after the step (0 without) */
    unsigned char *saved[MAXN];   /* the state after the last step */
    size_t saved_bytes[MAXN];
    size_t sent[MAXN];            /* counted bytes of the steps */
    dsgd_result rc[MAXN];
    char msg[MAXN][512];
    group *g;
} run;

typedef struct worker {
    run *rn;
    int rank;
} worker;

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    run *rn = w->rn;
    int r = w->rank, t;
    dsgd_comm_hook h = dsgd_compress_hook(rn->desc);
    void *st = NULL;
    float data[COUNT];
    size_t sb;
    dsgd_result res = h.create(h.user, r, rn->n, COUNT, &st);
    if (res == DSGD_OK && rn->load[r]) res = h.load(st, rn->load[r], rn->load_bytes[r]);
    sb = res == DSGD_OK ? h.state_bytes(st) : 0;
    for (t = 0; t < rn->steps && res == DSGD_OK; ++t) {
        dsgd_hook_bucket b;
        size_t before = rn->counted ? rn->g->cnt[r].sent : 0;
        rn->grad(r, (int)rn->step0 + t, data, COUNT);
        memcpy(rn->gin[r] + (size_t)t * COUNT, data, sizeof(data));
        memset(&b, 0, sizeof(b));
        b.data = data;
        b.count = COUNT;
        b.first = 0;
        b.index = 0;
        b.num_buckets = 1;
        b.vars = g_vp;
        b.num_vars = NV;
        b.step = rn->step0 + t;
        b.replica = r;
        b.num_replicas = rn->n;
        b.comm = rn->g->comm[r];
        b.algorithm = rn->algo;
        res = h.reduce(st, &b);
        if (rn->counted) rn->sent[r] += rn->g->cnt[r].sent - before;
        memcpy(rn->out[r] + (size_t)t * COUNT, data, sizeof(data));
        memset(rn->res[r] + (size_t)t * COUNT, 0, sizeof(data));
        if (res == DSGD_OK && sb) {
            unsigned char *buf = (unsigned char *)malloc(sb);
            res = buf ? h.save(st, buf, sb) : DSGD_ERR_OUT_OF_MEMORY;
            if (res == DSGD_OK && !rn->desc->no_error_feedback)
                memcpy(rn->res[r] + (size_t)t * COUNT, buf + 24, sizeof(data));
            free(buf);
        }
    }
    if (res == DSGD_OK && sb) {
        rn->saved[r] = (unsigned char *)malloc(sb);
        rn->saved_bytes[r] = sb;
        if (rn->saved[r]) res = h.save(st, rn->saved[r], sb);
    }
    rn->rc[r] = res;
    if (res != DSGD_OK) snprintf(rn->msg[r], sizeof(rn->msg[r]), "%s", dsgd_ctx_last_error(rn->g->ctx[r]));
    if (st) h.destroy(st);
    return NULL;
}

static void run_init(run *rn, const dsgd_compress_desc *d, int n, int steps, grad_fn grad) {
    int r;
    memset(rn, 0, sizeof(*rn));
    rn->desc = d;
    rn->n = n;
    rn->steps = steps;
    rn->grad = grad;
    rn->algo = DSGD_ALLREDUCE_AUTO;
    for (r = 0; r < n; ++r) {
        rn->out[r] = tu_floats((size_t)steps * COUNT);
        rn->gin[r] = tu_floats((size_t)steps * COUNT);
        rn->res[r] = tu_floats((size_t)steps * COUNT);
    }
}

static void run_free(run *rn) {
    int r;
    for (r = 0; r < rn->n; ++r) {
        free(rn->out[r]);
        free(rn->gin[r]);
        free(rn->res[r]);
        free(rn->saved[r]);
    }
}

static void run_go(run *rn) {
    group g;
    pthread_t th[MAXN];
    worker w[MAXN];
    int r;
    group_init(&g, rn->n, rn->counted);
    rn->g = &g;
    for (r = 0; r < rn->n; ++r) {
        w[r].rn = rn;
        w[r].rank = r;
        assert_int_equal(pthread_create(&th[r], NULL, worker_main, &w[r]), 0);
    }
    for (r = 0; r < rn->n; ++r) assert_int_equal(pthread_join(th[r], NULL), 0);
    rn->g = NULL;
    group_free(&g);
    for (r = 0; r < rn->n; ++r)
        if (rn->rc[r] != DSGD_OK) fail_msg("replica %d: %s: %s", r, dsgd_result_string(rn->rc[r]), rn->msg[r]);
    for (r = 1; r < rn->n; ++r)
        assert_memory_equal(rn->out[0], rn->out[r], (size_t)rn->steps * COUNT * sizeof(float));
}

/* ---------------------------------------------------------------- references */

/* What the hook computes for M = g + e (the residual of the step before). */
static void ref_m(const run *rn, int r, int t, float *M) {
    size_t i;
    for (i = 0; i < COUNT; ++i) M[i] = rn->gin[r][(size_t)t * COUNT + i] + (t ? rn->res[r][(size_t)(t - 1) * COUNT + i] : 0.0f);
}

static size_t ref_k(double ratio, size_t n) {
    size_t k = (size_t)ceil(ratio * (double)n - 1e-9);
    return k < 1 ? 1 : (k > n ? n : k);
}

static const float *g_cmp_m;
static int cmp_mag(const void *a, const void *b) {
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    float x = fabsf(g_cmp_m[i]), y = fabsf(g_cmp_m[j]);
    if (x != y) return x > y ? -1 : 1;
    return i < j ? -1 : 1;
}

/* This replica's top-k part: C (zero but the kept entries). */
static void ref_topk(const dsgd_compress_desc *d, const float *M, float *C) {
    size_t idx[COUNT], i, lo, hi;
    int v;
    memset(C, 0, COUNT * sizeof(float));
    for (v = 0; v < (d->global ? 1 : NV); ++v) {
        size_t k;
        lo = d->global ? 0 : g_vars[v].offset;
        hi = d->global ? COUNT : lo + g_vars[v].count;
        for (i = lo; i < hi; ++i) idx[i - lo] = i;
        g_cmp_m = M;
        qsort(idx, hi - lo, sizeof(size_t), cmp_mag);
        k = ref_k(d->ratio, hi - lo);
        for (i = 0; i < k; ++i) C[idx[i]] = M[idx[i]];
    }
}

/* 8 significant bits, to nearest, ties to even. */
static float ref_round8(float x) {
    int e;
    if (x == 0.0f) return x;
    frexpf(x, &e); /* x = f 2^e, 0.5 <= f < 1: the 8 bits end at 2^(e - 8) */
    return ldexpf(nearbyintf(ldexpf(x, 8 - e)), e - 8);
}

static void ref_sign(const float *M, float *C) {
    int v;
    size_t i;
    for (v = 0; v < NV; ++v) {
        const dsgd_variable *var = &g_vars[v];
        double l1 = 0.0;
        float s;
        for (i = 0; i < var->count; ++i) l1 += fabs((double)M[var->offset + i]);
        s = ref_round8((float)(l1 / (double)var->count));
        for (i = 0; i < var->count; ++i) C[var->offset + i] = signbit(M[var->offset + i]) ? -s : s;
    }
}

/* sum_t C_t + e_T == sum_t g_t, exactly (in double, which holds these sums
   exactly), C_t of replica r given per step in C (steps x COUNT). */
static void check_identity(const run *rn, int r, const float *C, const char *what) {
    size_t i;
    int t;
    for (i = 0; i < COUNT; ++i) {
        double lhs = rn->res[r][(size_t)(rn->steps - 1) * COUNT + i], rhs = 0.0;
        for (t = 0; t < rn->steps; ++t) {
            lhs += C[(size_t)t * COUNT + i];
            rhs += rn->gin[r][(size_t)t * COUNT + i];
        }
        if (lhs != rhs)
            fail_msg("%s: replica %d element %zu: sum C + e_T = %.17g, sum g = %.17g", what, r, i, lhs, rhs);
    }
}

/* ---------------------------------------------------------------- tests */

#define STEPS 12

static void ef_one_replica(dsgd_compress_kind kind, int global) {
    dsgd_compress_desc d;
    run rn;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.ratio = 0.1;
    d.global = global;
    run_init(&rn, &d, 1, STEPS, grad_int);
    run_go(&rn);
    check_identity(&rn, 0, rn.out[0], dsgd_compress_kind_name(kind));
    run_free(&rn);
}

static void test_ef_identity_one_replica(void **state) {
    (void)state;
    ef_one_replica(DSGD_COMPRESS_TOPK, 0);
    ef_one_replica(DSGD_COMPRESS_TOPK, 1);
    ef_one_replica(DSGD_COMPRESS_SIGN, 0);
    ef_one_replica(DSGD_COMPRESS_POWERSGD, 0);
}

/* Four replicas: each replica's part from the serial reference, e = M - C
   bit for bit, the identity per replica, and the bucket = the parts summed
   in rank order, bit for bit. */
static void ef_four(dsgd_compress_kind kind, int global) {
    dsgd_compress_desc d;
    run rn;
    float M[COUNT], sum[COUNT];
    float *C[MAXN];
    int r, t;
    size_t i;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.ratio = 0.05;
    d.global = global;
    run_init(&rn, &d, 4, STEPS, grad_int);
    run_go(&rn);
    for (r = 0; r < 4; ++r) C[r] = tu_floats((size_t)STEPS * COUNT);
    for (t = 0; t < STEPS; ++t) {
        memset(sum, 0, sizeof(sum));
        for (r = 0; r < 4; ++r) {
            float *c = C[r] + (size_t)t * COUNT;
            ref_m(&rn, r, t, M);
            if (kind == DSGD_COMPRESS_TOPK) ref_topk(&d, M, c);
            else ref_sign(M, c);
            for (i = 0; i < COUNT; ++i) {
                float e = M[i] - c[i];
                if (memcmp(&e, &rn.res[r][(size_t)t * COUNT + i], 4) != 0)
                    fail_msg("%s step %d replica %d element %zu: residual %g, M - C = %g", dsgd_compress_kind_name(kind),
                             t, r, i, (double)rn.res[r][(size_t)t * COUNT + i], (double)e);
                if (kind == DSGD_COMPRESS_TOPK ? c[i] != 0.0f : 1) sum[i] += c[i];
            }
        }
        assert_memory_equal(sum, rn.out[0] + (size_t)t * COUNT, sizeof(sum));
    }
    for (r = 0; r < 4; ++r) {
        check_identity(&rn, r, C[r], dsgd_compress_kind_name(kind));
        free(C[r]);
    }
    run_free(&rn);
}

static void test_topk_sign_four_replicas(void **state) {
    (void)state;
    ef_four(DSGD_COMPRESS_TOPK, 0);
    ef_four(DSGD_COMPRESS_TOPK, 1);
    ef_four(DSGD_COMPRESS_SIGN, 0);
}

/* PowerSGD at four replicas: the bucket is the sum of the replicas' parts
   C_r = M_r - e_r within 1e-5 of its largest entry; the vector is summed
   exactly (integers) and keeps no residual. */
static void test_powersgd_four_replicas(void **state) {
    dsgd_compress_desc d;
    run rn;
    float M[COUNT], sum[COUNT];
    int r, t;
    size_t i;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_POWERSGD;
    run_init(&rn, &d, 4, STEPS, grad_int);
    run_go(&rn);
    for (t = 0; t < STEPS; ++t) {
        const float *out = rn.out[0] + (size_t)t * COUNT;
        double mx = 0.0, md = 0.0;
        memset(sum, 0, sizeof(sum));
        for (r = 0; r < 4; ++r) {
            ref_m(&rn, r, t, M);
            for (i = 0; i < COUNT; ++i) sum[i] += M[i] - rn.res[r][(size_t)t * COUNT + i];
            for (i = 192; i < 204; ++i) assert_true(rn.res[r][(size_t)t * COUNT + i] == 0.0f);
        }
        for (i = 192; i < 204; ++i) assert_true(out[i] == sum[i]);
        for (i = 0; i < COUNT; ++i) {
            if (fabs((double)out[i]) > mx) mx = fabs((double)out[i]);
            if (fabs((double)out[i] - (double)sum[i]) > md) md = fabs((double)out[i] - (double)sum[i]);
        }
        if (!(md <= 1e-5 * mx)) fail_msg("step %d: |bucket - sum of parts| %g, largest entry %g", t, md, mx);
    }
    run_free(&rn);
}

/* M_r = A D_r B^T (rank 4; D_r diagonal, so the sum is rank 4 too) for the
   two matrices; the vector random. */
static float g_A[16 * 4], g_B[12 * 4], g_A2[10 * 4], g_B2[12 * 4];
static int g_same; /* 1: D_r = I on every replica */

static void grad_lowrank(int rank, int step, float *g, size_t count) {
    size_t i, k;
    int j;
    tu_rng rng = tu_rng_make(77u + (uint64_t)rank);
    (void)step;
    for (i = 0; i < count; ++i) g[i] = tu_uniform(&rng, -1.0f, 1.0f);
    for (i = 0; i < 16; ++i)
        for (k = 0; k < 12; ++k) {
            double s = 0.0;
            for (j = 0; j < 4; ++j) s += (double)g_A[i * 4 + j] * (g_same ? 1.0 : 1.0 + rank + j) * g_B[k * 4 + j];
            g[i * 12 + k] = (float)s;
        }
    for (i = 0; i < 10; ++i)
        for (k = 0; k < 12; ++k) {
            double s = 0.0;
            for (j = 0; j < 4; ++j) s += (double)g_A2[i * 4 + j] * (g_same ? 1.0 : 2.0 - 0.25 * rank + j) * g_B2[k * 4 + j];
            g[204 + i * 12 + k] = (float)s;
        }
}

static void lowrank_case(int n, int same) {
    dsgd_compress_desc d;
    run rn;
    float want[COUNT];
    int r;
    size_t i;
    tu_rng rng = tu_rng_make(5);
    tu_fill(&rng, g_A, 16 * 4, -1.0f, 1.0f);
    tu_fill(&rng, g_B, 12 * 4, -1.0f, 1.0f);
    tu_fill(&rng, g_A2, 10 * 4, -1.0f, 1.0f);
    tu_fill(&rng, g_B2, 12 * 4, -1.0f, 1.0f);
    g_same = same;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_POWERSGD;
    d.rank = 4;
    d.min_compression_rate = 1.0; /* 10 x 12 at rank 4: 1.36 */
    d.no_warm_start = 1;
    d.no_error_feedback = 1;
    run_init(&rn, &d, n, 1, grad_lowrank);
    run_go(&rn);
    memset(want, 0, sizeof(want));
    for (r = 0; r < n; ++r)
        for (i = 0; i < COUNT; ++i) want[i] += rn.gin[r][i];
    {
        double e1 = tu_rel_err(rn.out[0], want, 192), e2 = tu_rel_err(rn.out[0] + 204, want + 204, 120);
        if (!(e1 <= 1e-5 && e2 <= 1e-5)) fail_msg("N %d same %d: relative errors %g, %g", n, same, e1, e2);
    }
    for (i = 192; i < 204; ++i) assert_true(fabsf(rn.out[0][i] - want[i]) <= 1e-6f);
    run_free(&rn);
    /* The check can fail: rank 2 cannot hold a rank-4 matrix. */
    d.rank = 2;
    d.min_compression_rate = 1.0;
    run_init(&rn, &d, n, 1, grad_lowrank);
    run_go(&rn);
    assert_true(tu_rel_err(rn.out[0], want, 192) > 1e-3);
    run_free(&rn);
}

static void test_powersgd_low_rank(void **state) {
    (void)state;
    lowrank_case(1, 1);
    lowrank_case(4, 1);
    lowrank_case(4, 0);
}

/* Below the rank: each replica's matrices are A D_r,t B^T of rank g_rho
   (D diagonal and positive, changing with the step), so their sum is of
   rank g_rho too; at any rank r above it the best rank-r approximation is
   the matrix itself, and the hook must return the sum within float
   rounding, at every step, with and without warm start (with warm start
   the Q memory of such a matrix carries columns orthogonal to its range).
   Without the second Gram-Schmidt pass the columns past rho were the
   projections' rounding, normalised to unit length but not orthogonal to
   the others: 0.1-1.2 off. */
static int g_rho;
static double g_worst; /* the largest relative error seen */
static float g_U[16 * 2], g_V[12 * 2], g_U2[10 * 2], g_V2[12 * 2];

static void grad_rankdef(int rank, int step, float *g, size_t count) {
    size_t i, k;
    int j;
    tu_rng rng = tu_rng_make(91u + (uint64_t)rank + 100u * (uint64_t)step);
    for (i = 0; i < count; ++i) g[i] = tu_uniform(&rng, -1.0f, 1.0f);
    for (i = 0; i < 16; ++i)
        for (k = 0; k < 12; ++k) {
            double s = 0.0;
            for (j = 0; j < g_rho; ++j) s += (double)g_U[i * 2 + j] * (1.0 + 0.5 * rank + j + 0.25 * step) * g_V[k * 2 + j];
            g[i * 12 + k] = (float)s;
        }
    for (i = 0; i < 10; ++i)
        for (k = 0; k < 12; ++k) {
            double s = 0.0;
            for (j = 0; j < g_rho; ++j) s += (double)g_U2[i * 2 + j] * (3.0 - 0.5 * rank - j + 0.5 * step) * g_V2[k * 2 + j];
            g[204 + i * 12 + k] = (float)s;
        }
}

static void rankdef_case(int rho, int r, int n, int warm) {
    dsgd_compress_desc d;
    run rn;
    int t, q;
    size_t i;
    g_rho = rho;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_POWERSGD;
    d.rank = r;
    d.min_compression_rate = 1.0; /* 10 x 12 at rank 4: 1.36 */
    d.no_warm_start = !warm;
    d.no_error_feedback = 1;
    run_init(&rn, &d, n, 4, grad_rankdef);
    run_go(&rn);
    for (t = 0; t < 4; ++t) {
        float want[COUNT];
        const float *out = rn.out[0] + (size_t)t * COUNT;
        double e1, e2;
        memset(want, 0, sizeof(want));
        for (q = 0; q < n; ++q)
            for (i = 0; i < COUNT; ++i) want[i] += rn.gin[q][(size_t)t * COUNT + i];
        e1 = tu_rel_err(out, want, 192);
        e2 = tu_rel_err(out + 204, want + 204, 120);
        g_worst = fmax(g_worst, fmax(e1, e2));
        if (!(e1 <= 1e-5 && e2 <= 1e-5))
            fail_msg("rank %d matrices at PowerSGD rank %d, N %d, warm %d, step %d: relative errors %g, %g", rho, r, n,
                     warm, t, e1, e2);
    }
    run_free(&rn);
}

static void test_powersgd_below_rank(void **state) {
    static const int cases[][2] = {{1, 2}, {1, 3}, {1, 4}, {2, 3}, {2, 4}}; /* {rho, r} */
    static const int ns[] = {1, 2, 4};
    size_t c, k;
    int warm;
    tu_rng rng = tu_rng_make(23);
    (void)state;
    tu_fill(&rng, g_U, 16 * 2, -1.0f, 1.0f);
    tu_fill(&rng, g_V, 12 * 2, -1.0f, 1.0f);
    tu_fill(&rng, g_U2, 10 * 2, -1.0f, 1.0f);
    tu_fill(&rng, g_V2, 12 * 2, -1.0f, 1.0f);
    for (c = 0; c < sizeof(cases) / sizeof(cases[0]); ++c)
        for (k = 0; k < 3; ++k)
            for (warm = 0; warm < 2; ++warm) rankdef_case(cases[c][0], cases[c][1], ns[k], warm);
    print_message("PowerSGD below the matrices' rank: largest relative error %g (bound 1e-5)\n", g_worst);
}

/* Warm start is power iteration: on a fixed (full-rank) matrix at rank 1,
   without error feedback, the error ||M - C||_F never grows from step to
   step and reaches the best rank-1 error (sqrt(||M||^2 - s1^2), s1 from a
   double-precision power iteration) within 1e-3; drawing Q afresh every
   step stays further away. */
static float g_fixed[COUNT];
static void grad_fixed(int rank, int step, float *g, size_t count) {
    (void)rank;
    (void)step;
    memcpy(g, g_fixed, count * sizeof(float));
}

static double rank1_err(const float *out, const float *M) {
    double s = 0.0;
    size_t i;
    for (i = 0; i < 192; ++i) s += ((double)out[i] - M[i]) * ((double)out[i] - M[i]);
    return sqrt(s);
}

static void test_powersgd_warm_start(void **state) {
    dsgd_compress_desc d;
    run warm, fresh;
    double v[12], u[16], s1 = 0.0, fro = 0.0, best, prev = INFINITY;
    int it, t;
    size_t i, k;
    tu_rng rng = tu_rng_make(11);
    (void)state;
    tu_fill(&rng, g_fixed, COUNT, -1.0f, 1.0f);
    for (k = 0; k < 12; ++k) v[k] = 1.0;
    for (it = 0; it < 2000; ++it) { /* v <- M^T M v, normalised */
        double n2 = 0.0;
        for (i = 0; i < 16; ++i) {
            u[i] = 0.0;
            for (k = 0; k < 12; ++k) u[i] += g_fixed[i * 12 + k] * v[k];
        }
        for (k = 0; k < 12; ++k) {
            v[k] = 0.0;
            for (i = 0; i < 16; ++i) v[k] += g_fixed[i * 12 + k] * u[i];
            n2 += v[k] * v[k];
        }
        for (k = 0; k < 12; ++k) v[k] /= sqrt(n2);
    }
    for (i = 0; i < 16; ++i) {
        double x = 0.0;
        for (k = 0; k < 12; ++k) x += g_fixed[i * 12 + k] * v[k];
        s1 += x * x;
    }
    for (i = 0; i < 192; ++i) fro += (double)g_fixed[i] * g_fixed[i];
    best = sqrt(fro - s1);
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_POWERSGD;
    d.rank = 1;
    d.no_error_feedback = 1;
    run_init(&warm, &d, 1, 30, grad_fixed);
    run_go(&warm);
    for (t = 0; t < 30; ++t) {
        double e = rank1_err(warm.out[0] + (size_t)t * COUNT, g_fixed);
        if (!(e <= prev * (1.0 + 1e-6))) fail_msg("step %d: error %g grew from %g", t, e, prev);
        prev = e;
    }
    if (!(prev <= best * (1.0 + 1e-3))) fail_msg("warm start: error %g, the best rank-1 error %g", prev, best);
    d.no_warm_start = 1;
    run_init(&fresh, &d, 1, 30, grad_fixed);
    run_go(&fresh);
    assert_true(rank1_err(fresh.out[0] + 29 * COUNT, g_fixed) > best * 1.01);
    run_free(&fresh);
    run_free(&warm);
}

/* The bytes a counting transport saw: (N - 1) times the message for the
   all-gathers, log2 N times for recursive doubling at N = 4, plus one
   agreement (measured with a barrier) per collective. */
typedef struct barg {
    dsgd_comm *c;
    dsgd_result rc;
} barg;

static void *barrier_main(void *arg) {
    barg *a = (barg *)arg;
    a->rc = dsgd_barrier(a->c, 0.0);
    return NULL;
}

static size_t agreement_bytes(int n) {
    group g;
    pthread_t th[MAXN];
    barg a[MAXN];
    size_t got;
    int r;
    group_init(&g, n, 1);
    for (r = 0; r < n; ++r) {
        a[r].c = g.comm[r];
        assert_int_equal(pthread_create(&th[r], NULL, barrier_main, &a[r]), 0);
    }
    for (r = 0; r < n; ++r) assert_int_equal(pthread_join(th[r], NULL), 0);
    for (r = 0; r < n; ++r) assert_int_equal(a[r].rc, DSGD_OK);
    got = g.cnt[0].sent;
    for (r = 1; r < n; ++r) assert_int_equal(g.cnt[r].sent, got);
    group_free(&g);
    return got;
}

static void bytes_case(dsgd_compress_kind kind, int global, dsgd_allreduce_algo algo, size_t factor,
                       int collectives, size_t want_message, size_t agree) {
    dsgd_compress_desc d;
    dsgd_hook_bucket b;
    run rn;
    size_t message;
    int r;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.ratio = 0.1;
    d.global = global;
    memset(&b, 0, sizeof(b));
    b.count = COUNT;
    b.vars = g_vp;
    b.num_vars = NV;
    b.num_replicas = 4;
    message = dsgd_compress_bytes(&d, &b);
    assert_int_equal(message, want_message);
    run_init(&rn, &d, 4, 1, grad_int);
    rn.counted = 1;
    rn.algo = algo;
    run_go(&rn);
    for (r = 0; r < 4; ++r)
        if (rn.sent[r] != factor * message + (size_t)collectives * agree)
            fail_msg("%s: replica %d sent %zu bytes; %zu x %zu + %d x %zu = %zu", dsgd_compress_kind_name(kind), r,
                     rn.sent[r], factor, message, collectives, agree, factor * message + (size_t)collectives * agree);
    run_free(&rn);
}

static void test_bytes(void **state) {
    size_t agree = agreement_bytes(4);
    (void)state;
    assert_true(agree > 0);
    /* top-k at 0.1: ceil(19.2) = 20, 2 (1.2 -> 2), 12: 34 pairs; global ceil(32.4) = 33 */
    bytes_case(DSGD_COMPRESS_TOPK, 0, DSGD_ALLREDUCE_AUTO, 3, 1, 8 * (20 + 2 + 12), agree);
    bytes_case(DSGD_COMPRESS_TOPK, 1, DSGD_ALLREDUCE_AUTO, 3, 1, 8 * 33, agree);
    /* sign: (1 + 6) + (1 + 1) + (1 + 4) words */
    bytes_case(DSGD_COMPRESS_SIGN, 0, DSGD_ALLREDUCE_AUTO, 3, 1, 4 * (7 + 2 + 5), agree);
    /* PowerSGD rank 2: 2 (16 + 12) + 12 + 2 (10 + 12) floats; P, the bias, Q */
    bytes_case(DSGD_COMPRESS_POWERSGD, 0, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, 2, 3, 4 * (56 + 12 + 44), agree);
    bytes_case(DSGD_COMPRESS_NONE, 0, DSGD_ALLREDUCE_RECURSIVE_DOUBLING, 2, 1, 4 * COUNT, agree);
    {   /* a row (1 x 8) and a column (8 x 1) are never compressed, whatever min_compression_rate (8 / 9 here
           reaches 0.5): rank 1 sends n + m floats for their n m; a 4 x 4 at rank 1 is: 4 (8 + 8 + (4 + 4)) */
        dsgd_variable v[3];
        const dsgd_variable *vp[3] = {&v[0], &v[1], &v[2]};
        dsgd_compress_desc d;
        dsgd_hook_bucket b;
        int i;
        memset(v, 0, sizeof(v));
        for (i = 0; i < 3; ++i) {
            v[i].rank = 2;
            v[i].shape[0] = i == 0 ? 1 : i == 1 ? 8 : 4;
            v[i].shape[1] = i == 0 ? 8 : i == 1 ? 1 : 4;
            v[i].count = (size_t)v[i].shape[0] * (size_t)v[i].shape[1];
            v[i].offset = (size_t)i * 8;
        }
        memset(&d, 0, sizeof(d));
        d.kind = DSGD_COMPRESS_POWERSGD;
        d.rank = 1;
        d.min_compression_rate = 0.5;
        memset(&b, 0, sizeof(b));
        b.count = 32;
        b.vars = vp;
        b.num_vars = 3;
        b.num_replicas = 4;
        assert_int_equal(dsgd_compress_bytes(&d, &b), 4 * (8 + 8 + 8));
    }
}

/* ---------------------------------------------------------------- descs and state */

/* A mirrored strategy given the hook of a bad desc refuses it, and its
   message says what dsgd_compress_check says, after the hook's name. */
static void strategy_refuses(const dsgd_compress_desc *cd, const char *want) {
    static const dsgd_layer_desc layers[1] = {{4, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy *s = NULL;
    dsgd_strategy_desc d;
    dsgd_comm_hook h = dsgd_compress_hook(cd);
    char head[64];
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_STRATEGY_MIRRORED;
    d.num_replicas = 2;
    d.model.input_dim = 3;
    d.model.layers = layers;
    d.model.num_layers = 1;
    d.model.max_batch = 2;
    d.optimizer.kind = DSGD_OPT_SGD;
    d.optimizer.lr = 0.1f;
    d.cpu_threads = 1;
    d.comm_hook = &h;
    assert_int_equal(dsgd_strategy_create(ctx, &d, &s), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(s);
    snprintf(head, sizeof(head), "dsgd_strategy_create: comm hook '%s': dsgd_compress: ", h.name);
    if (!strstr(dsgd_ctx_last_error(ctx), head) || !strstr(dsgd_ctx_last_error(ctx), want))
        fail_msg("strategy message \"%s\" lacks \"%s\" or \"%s\"", dsgd_ctx_last_error(ctx), head, want);
    dsgd_ctx_destroy(ctx);
}

static void bad_desc(const dsgd_compress_desc *d, const char *want) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_comm_hook h = dsgd_compress_hook(d);
    void *st = (void *)&st;
    assert_int_equal(dsgd_compress_check(ctx, d), DSGD_ERR_INVALID_ARGUMENT);
    if (!strstr(dsgd_ctx_last_error(ctx), want)) fail_msg("message \"%s\" lacks \"%s\"", dsgd_ctx_last_error(ctx), want);
    assert_int_equal(h.create(h.user, 0, 1, 10, &st), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(st);
    dsgd_ctx_destroy(ctx);
    strategy_refuses(d, want);
}

static void test_bad_desc(void **state) {
    dsgd_compress_desc d;
    dsgd_ctx *ctx = tu_ctx();
    (void)state;
    bad_desc(NULL, "desc is NULL");
    memset(&d, 0, sizeof(d));
    d.kind = (dsgd_compress_kind)9;
    bad_desc(&d, "unknown kind 9");
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    d.ratio = 1.5;
    bad_desc(&d, "ratio 1.5 is outside (0, 1]");
    d.ratio = -0.1;
    bad_desc(&d, "ratio -0.1");
    d.ratio = NAN;
    bad_desc(&d, "ratio nan");
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_POWERSGD;
    d.rank = -1;
    bad_desc(&d, "rank -1 is outside 1..1024");
    d.rank = 1025;
    bad_desc(&d, "rank 1025");
    d.rank = 0;
    d.start_iter = -3;
    bad_desc(&d, "start_iter -3 is negative");
    d.start_iter = 0;
    d.min_compression_rate = -1.0;
    bad_desc(&d, "min_compression_rate -1");
    d.min_compression_rate = INFINITY;
    bad_desc(&d, "min_compression_rate inf");
    d.min_compression_rate = 0.0;
    assert_int_equal(dsgd_compress_check(ctx, &d), DSGD_OK);
    assert_int_equal(dsgd_compress_check(NULL, &d), DSGD_ERR_INVALID_ARGUMENT);
    assert_string_equal(dsgd_compress_kind_name(DSGD_COMPRESS_SIGN), "sign");
    assert_string_equal(dsgd_compress_kind_name((dsgd_compress_kind)-1), "unknown");
    assert_string_equal(dsgd_compress_hook(&d).name, "compress_powersgd");
    dsgd_ctx_destroy(ctx);
}

/* A bucket whose variables do not cover it, and one outside num_params. */
static void test_bad_bucket(void **state) {
    dsgd_compress_desc d;
    group g;
    dsgd_comm_hook h;
    dsgd_hook_bucket b;
    void *st = NULL;
    float data[COUNT];
    (void)state;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_SIGN;
    h = dsgd_compress_hook(&d);
    group_init(&g, 1, 0);
    assert_int_equal(h.create(h.user, 0, 1, COUNT, &st), DSGD_OK);
    memset(data, 0, sizeof(data));
    memset(&b, 0, sizeof(b));
    b.data = data;
    b.count = COUNT - 1;
    b.vars = g_vp;
    b.num_vars = NV;
    b.num_replicas = 1;
    b.comm = g.comm[0];
    assert_int_equal(h.reduce(st, &b), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(g.ctx[0]), "conv0/kernel"));
    b.count = COUNT;
    b.first = 1;
    assert_int_equal(h.reduce(st, &b), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(g.ctx[0]), "not inside the 324 parameters"));
    b.first = 0;
    b.num_replicas = 2;
    assert_int_equal(h.reduce(st, &b), DSGD_ERR_INVALID_ARGUMENT);
    b.num_replicas = 1;
    assert_int_equal(h.reduce(st, &b), DSGD_OK);
    /* a load of the wrong size or another kind's state */
    {
        size_t sb = h.state_bytes(st);
        unsigned char *buf = (unsigned char *)tu_alloc(sb);
        assert_int_equal(sb, 24 + 4 * COUNT);
        assert_int_equal(h.save(st, buf, sb), DSGD_OK);
        assert_int_equal(h.load(st, buf, sb - 1), DSGD_ERR_INVALID_ARGUMENT);
        buf[8] ^= 3; /* the kind */
        assert_int_equal(h.load(st, buf, sb), DSGD_ERR_INVALID_ARGUMENT);
        free(buf);
    }
    h.destroy(st);
    /* NONE keeps nothing */
    d.kind = DSGD_COMPRESS_NONE;
    assert_int_equal(h.create(h.user, 0, 1, COUNT, &st), DSGD_OK);
    assert_int_equal(h.state_bytes(st), 0);
    h.destroy(st);
    group_free(&g);
}

/* Save after 5 steps, load into fresh states, run 7 more: the bits of the
   uninterrupted 12-step run. */
static void resume_case(dsgd_compress_kind kind, int n) {
    dsgd_compress_desc d;
    run full, first, rest;
    int r;
    memset(&d, 0, sizeof(d));
    d.kind = kind;
    d.ratio = 0.1;
    run_init(&full, &d, n, STEPS, grad_int);
    run_go(&full);
    run_init(&first, &d, n, 5, grad_int);
    run_go(&first);
    run_init(&rest, &d, n, STEPS - 5, grad_int);
    rest.step0 = 5;
    for (r = 0; r < n; ++r) {
        assert_non_null(first.saved[r]);
        rest.load[r] = first.saved[r];
        rest.load_bytes[r] = first.saved_bytes[r];
    }
    run_go(&rest);
    for (r = 0; r < n; ++r) {
        assert_memory_equal(full.out[r] + 5 * COUNT, rest.out[r], (size_t)(STEPS - 5) * COUNT * sizeof(float));
        assert_int_equal(full.saved_bytes[r], rest.saved_bytes[r]);
        assert_memory_equal(full.saved[r], rest.saved[r], full.saved_bytes[r]);
    }
    /* and the same bits run after run */
    run_free(&rest);
    run_init(&rest, &d, n, STEPS, grad_int);
    run_go(&rest);
    for (r = 0; r < n; ++r) assert_memory_equal(full.out[r], rest.out[r], (size_t)STEPS * COUNT * sizeof(float));
    run_free(&rest);
    run_free(&first);
    run_free(&full);
}

static void test_save_load_resume(void **state) {
    (void)state;
    resume_case(DSGD_COMPRESS_TOPK, 2);
    resume_case(DSGD_COMPRESS_SIGN, 2);
    resume_case(DSGD_COMPRESS_POWERSGD, 1);
    resume_case(DSGD_COMPRESS_POWERSGD, 3);
}

/* Error feedback off: the residual stays zero and nothing is saved for
   top-k; PowerSGD without warm start saves nothing either. Before
   start_iter PowerSGD is the plain sum. */
static void test_options(void **state) {
    dsgd_compress_desc d;
    run rn;
    float want[COUNT];
    int r;
    size_t i;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    d.no_error_feedback = 1;
    run_init(&rn, &d, 2, 2, grad_int);
    run_go(&rn);
    assert_null(rn.saved[0]);
    run_free(&rn);
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_POWERSGD;
    d.start_iter = 1;
    run_init(&rn, &d, 2, 2, grad_int);
    run_go(&rn);
    memset(want, 0, sizeof(want));
    for (r = 0; r < 2; ++r)
        for (i = 0; i < COUNT; ++i) want[i] += rn.gin[r][i];
    assert_memory_equal(want, rn.out[0], sizeof(want)); /* step 0: plain, exact on integers */
    for (i = 0; i < COUNT; ++i) assert_true(rn.res[0][i] == 0.0f);
    assert_false(memcmp(rn.res[0] + COUNT, rn.res[0], COUNT * sizeof(float)) == 0); /* step 1 compressed */
    run_free(&rn);
    /* start_iter is a dense warm-up for top-k and sign too */
    for (r = 0; r < 2; ++r) {
        memset(&d, 0, sizeof(d));
        d.kind = r ? DSGD_COMPRESS_SIGN : DSGD_COMPRESS_TOPK;
        d.start_iter = 1;
        run_init(&rn, &d, 2, 2, grad_int);
        run_go(&rn);
        memset(want, 0, sizeof(want));
        for (i = 0; i < COUNT; ++i) want[i] = rn.gin[0][i] + rn.gin[1][i];
        assert_memory_equal(want, rn.out[0], sizeof(want)); /* step 0: plain */
        for (i = 0; i < COUNT; ++i) assert_true(rn.res[0][i] == 0.0f);
        assert_false(memcmp(rn.res[0] + COUNT, rn.res[0], COUNT * sizeof(float)) == 0); /* step 1 compressed */
        run_free(&rn);
    }
}

/* ---------------------------------------------------------------- fp16 and bf16 */

/* The half wires through the hook: the bits of dsgd_allreduce_wire on the
   same inputs (the hook adds nothing), no residual saved, and each value
   within the wire's bound of the exact sum (collectives.h). */
/* Gradients that neither wire holds exactly: uniform in (-1, 1) times a
   power of two that varies by element (2^-6 .. 2^6). */
static void grad_real(int rank, int step, float *g, size_t count) {
    tu_rng rng = tu_rng_make(5000u * (uint64_t)step + (uint64_t)rank + 11u);
    size_t i;
    for (i = 0; i < count; ++i) g[i] = ldexpf((float)(2.0 * tu_unit(&rng) - 1.0), (int)(i % 13) - 6);
}

typedef struct wire_arg {
    group *g;
    int rank, steps;
    dsgd_wire wire;
    float *out; /* [steps][COUNT] */
    dsgd_result rc;
} wire_arg;

static void *wire_main(void *p) {
    wire_arg *a = (wire_arg *)p;
    int t;
    for (t = 0; t < a->steps && a->rc == DSGD_OK; ++t) {
        float *x = a->out + (size_t)t * COUNT;
        grad_real(a->rank, t, x, COUNT);
        a->rc = dsgd_allreduce_wire(a->g->comm[a->rank], x, COUNT, 0, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, a->wire,
                                    0.0);
    }
    return NULL;
}

static void test_half_wires(void **state) {
    static const dsgd_compress_kind kinds[2] = {DSGD_COMPRESS_FP16, DSGD_COMPRESS_BF16};
    static const dsgd_wire wires[2] = {DSGD_WIRE_F16, DSGD_WIRE_BF16};
    static const double unit[2] = {1.0 / 2048, 1.0 / 256};
    int k, r, t, n = 4, steps = 3;
    size_t i;
    (void)state;
    for (k = 0; k < 2; ++k) {
        dsgd_compress_desc d;
        run rn;
        group g;
        pthread_t th[MAXN];
        wire_arg a[MAXN];
        memset(&d, 0, sizeof(d));
        d.kind = kinds[k];
        assert_string_equal(dsgd_compress_kind_name(kinds[k]), k ? "bf16" : "fp16");
        run_init(&rn, &d, n, steps, grad_real);
        run_go(&rn);
        assert_null(rn.saved[0]); /* no residual: nothing to save */
        group_init(&g, n, 0);
        for (r = 0; r < n; ++r) {
            memset(&a[r], 0, sizeof(a[r]));
            a[r].g = &g;
            a[r].rank = r;
            a[r].steps = steps;
            a[r].wire = wires[k];
            a[r].out = tu_floats((size_t)steps * COUNT);
            assert_int_equal(pthread_create(&th[r], NULL, wire_main, &a[r]), 0);
        }
        for (r = 0; r < n; ++r) assert_int_equal(pthread_join(th[r], NULL), 0);
        for (r = 0; r < n; ++r) assert_int_equal(a[r].rc, DSGD_OK);
        assert_memory_equal(rn.out[0], a[0].out, (size_t)steps * COUNT * sizeof(float));
        for (t = 0; t < steps; ++t)
            for (i = 0; i < COUNT; ++i) { /* N roundings of u each, generously (no underflow here) */
                double exact = 0, mag = 0;
                for (r = 0; r < n; ++r) {
                    exact += rn.gin[r][(size_t)t * COUNT + i];
                    mag += fabs(rn.gin[r][(size_t)t * COUNT + i]);
                }
                if (fabs(rn.out[0][(size_t)t * COUNT + i] - exact) > 2.0 * n * unit[k] * mag)
                    fail_msg("%s step %d [%zu]: %g, exact %g", k ? "bf16" : "fp16", t, i,
                             (double)rn.out[0][(size_t)t * COUNT + i], exact);
            }
        for (r = 0; r < n; ++r) free(a[r].out);
        group_free(&g);
        run_free(&rn);
    }
}

/* ---------------------------------------------------------------- resume through a strategy */

/* A MIRRORED strategy trains a 12 -> 10 tanh -> 4 MLP (174 floats; at rank
   2 PowerSGD compresses the 12 x 10 kernel and reduces the rest plainly)
   with momentum, the hook on its gradient, on uneven global batches. */
enum {
    RS_IN = 12, RS_HID = 10, RS_OUT = 4, RS_NP = RS_IN * RS_HID + RS_HID + RS_HID * RS_OUT + RS_OUT, RS_B = 6,
    RS_STEPS = 500, RS_CUT = 250
};

static const dsgd_layer_desc RS_LAYERS[2] = {{RS_HID, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                             {RS_OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static float g_rx[RS_STEPS][MAXN * RS_B * RS_IN], g_ry[RS_STEPS][MAXN * RS_B];

static void rs_data(void) {
    tu_rng r = tu_rng_make(4242);
    int t, i;
    for (t = 0; t < RS_STEPS; ++t) {
        tu_fill(&r, g_rx[t], (size_t)MAXN * RS_B * RS_IN, -1.0f, 1.0f);
        for (i = 0; i < MAXN * RS_B; ++i) g_ry[t][i] = (float)tu_below(&r, RS_OUT);
    }
}

static int rs_count(int n, int step) { return step % 3 ? n * RS_B - step % 5 : n * RS_B; }

/* One row: a compressor (or none: no hook at all, the baseline) at n
   replicas. */
typedef struct rs_case {
    const char *name;
    int n;
    int hook;                 /* 0: no comm hook */
    int stateful;             /* the hook saves a state (a residual, Q memories) */
    int workers;              /* 1 (n 4): the cut and the resumed run as 2
                                 workers x 2 replicas (the chief saves),
                                 against MIRRORED x 4 and an uninterrupted
                                 2 x 2's checkpoint */
    dsgd_compress_desc cd;
} rs_case;

/* Creates c's strategy (MIRRORED of c->n replicas; with eps a
   MULTI_WORKER_MIRRORED worker of 2 over eps[0..1]), restores `restore`
   (NULL: none), trains steps [from, to), saves to `save` (NULL: none);
   every replica's weights out. Asserts nothing (workers call it): the
   first error's message in msg. */
static dsgd_result rs_strategy(const rs_case *c, dsgd_transport_i *eps, int from, int to, const char *restore,
                               const char *save, float (*params)[RS_NP], char *msg, size_t cap) {
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    dsgd_strategy_desc d;
    dsgd_comm_hook h = dsgd_compress_hook(&c->cd);
    dsgd_result res;
    int t, r;
    if ((res = dsgd_ctx_create(NULL, &ctx)) != DSGD_OK) return res;
    memset(&d, 0, sizeof(d));
    d.kind = eps ? DSGD_STRATEGY_MULTI_WORKER_MIRRORED : DSGD_STRATEGY_MIRRORED;
    d.num_replicas = eps ? 2 : c->n;
    d.endpoints = eps;
    d.algorithm = DSGD_ALLREDUCE_RING;
    d.model.input_dim = RS_IN;
    d.model.layers = RS_LAYERS;
    d.model.num_layers = 2;
    d.model.max_batch = RS_B;
    d.model.seed = 9;
    d.optimizer.kind = DSGD_OPT_MOMENTUM;
    d.optimizer.lr = 0.05f;
    d.optimizer.momentum = 0.9f;
    d.timeout_s = 30.0;
    d.cpu_threads = 1;
    d.comm_hook = c->hook ? &h : NULL;
    res = dsgd_strategy_create(ctx, &d, &s);
    if (res == DSGD_OK && restore) res = dsgd_strategy_restore(s, restore, NULL);
    for (t = from; t < to && res == DSGD_OK; ++t)
        res = dsgd_strategy_train_step(s, g_rx[t], g_ry[t], rs_count(c->n, t), NULL);
    if (res == DSGD_OK && save) res = dsgd_strategy_save(s, save, NULL);
    for (r = 0; res == DSGD_OK && r < dsgd_strategy_num_replicas(s); ++r)
        res = dsgd_model_get_params(dsgd_strategy_model(s, r), params[r], RS_NP);
    if (res != DSGD_OK) snprintf(msg, cap, "%s", dsgd_ctx_last_error(ctx));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return res;
}

static void rs_run(const rs_case *c, int from, int to, const char *restore, const char *save, float (*params)[RS_NP]) {
    char msg[512] = "";
    dsgd_result res = rs_strategy(c, NULL, from, to, restore, save, params, msg, sizeof(msg));
    if (res != DSGD_OK) fail_msg("%s: %s: %s", c->name, dsgd_result_string(res), msg);
}

/* 2 workers x 2 replicas over one loopback hub, each on a thread: c (n 4)
   trained over [from, to) as rs_run does; worker i's replicas into
   params[2 i], params[2 i + 1]. */
typedef struct rs_worker {
    const rs_case *c;
    dsgd_transport_i *eps;
    int from, to;
    const char *restore, *save;
    float (*params)[RS_NP];
    dsgd_result res;
    char msg[512];
} rs_worker;

static void *rs_worker_main(void *arg) {
    rs_worker *w = (rs_worker *)arg;
    w->res = rs_strategy(w->c, w->eps, w->from, w->to, w->restore, w->save, w->params, w->msg, sizeof(w->msg));
    return NULL;
}

static void rs_workers(const rs_case *c, int from, int to, const char *restore, const char *save,
                       float (*params)[RS_NP]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[4];
    pthread_t th[2];
    rs_worker w[2];
    int i;
    TU_OK(ctx, dsgd_loopback_create(ctx, 4, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    for (i = 0; i < 2; ++i) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].c = c;
        w[i].eps = eps + 2 * i;
        w[i].from = from;
        w[i].to = to;
        w[i].restore = restore;
        w[i].save = save;
        w[i].params = params + 2 * i;
        assert_int_equal(pthread_create(&th[i], NULL, rs_worker_main, &w[i]), 0);
    }
    for (i = 0; i < 2; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    for (i = 0; i < 2; ++i)
        if (w[i].res != DSGD_OK) fail_msg("%s, worker %d: %s: %s", c->name, i, dsgd_result_string(w[i].res), w[i].msg);
}

/* `steps` steps (RS_STEPS, 500), or `cut_at` (250) + save + destroy + a fresh
   strategy + restore + the rest: every replica's weights bit for bit, and
   the two checkpoints saved at the end (weights, optimizer slots and step,
   every replica's hook state, metrics) byte for byte. Returns replica 0's
   final weights in want0 and the size of the checkpoint at the cut. */
static size_t rs_case_check(const rs_case *c, const char *dir, int steps, int cut_at, float *want0) {
    static float want[MAXN][RS_NP], got[MAXN][RS_NP], mid[MAXN][RS_NP];
    char full[128], cut[128], resumed[128];
    unsigned char *a, *b;
    size_t la, lb, lc;
    int r;
    snprintf(full, sizeof(full), "%s/full.ckpt", dir);
    snprintf(cut, sizeof(cut), "%s/cut.ckpt", dir);
    snprintf(resumed, sizeof(resumed), "%s/resumed.ckpt", dir);
    if (c->workers) {
        rs_run(c, 0, steps, NULL, NULL, want);
        rs_workers(c, 0, steps, NULL, full, mid);
        for (r = 0; r < c->n; ++r)
            if (memcmp(mid[r], want[r], sizeof(mid[r])) != 0) fail_msg("%s: 2 x 2 differs from MIRRORED x 4", c->name);
        rs_workers(c, 0, cut_at, NULL, cut, mid);
        rs_workers(c, cut_at, steps, cut, resumed, got);
    } else {
        rs_run(c, 0, steps, NULL, full, want);
        rs_run(c, 0, cut_at, NULL, cut, mid);
        rs_run(c, cut_at, steps, cut, resumed, got);
    }
    for (r = 0; r < c->n; ++r)
        if (memcmp(got[r], want[r], sizeof(got[r])) != 0)
            fail_msg("%s: replica %d: %d + %d steps through a checkpoint differ from %d (rel err %.3g)", c->name, r,
                     cut_at, steps - cut_at, steps, tu_rel_err(got[r], want[r], RS_NP));
    a = tu_read_file(full, &la);
    b = tu_read_file(resumed, &lb);
    if (la != lb || memcmp(a, b, la) != 0)
        fail_msg("%s: the state at step %d differs after the resume (checkpoints of %zu and %zu bytes)", c->name,
                 steps, la, lb);
    free(a);
    free(b);
    free(tu_read_file(cut, &lc));
    memcpy(want0, want[0], sizeof(want[0]));
    return lc;
}

static void test_strategy_resume(void **state) {
    /* start_iter 100 crosses the dense warm-up's end before the cut, 300 after it */
    static const rs_case cases[] = {
        {"no hook", 2, 0, 0, 0, {.kind = DSGD_COMPRESS_NONE}},
        {"no hook, N 4", 4, 0, 0, 0, {.kind = DSGD_COMPRESS_NONE}},
        {"fp16", 4, 1, 0, 0, {.kind = DSGD_COMPRESS_FP16}},
        {"bf16", 2, 1, 0, 0, {.kind = DSGD_COMPRESS_BF16}},
        {"top-k 5% EF", 2, 1, 1, 0, {.kind = DSGD_COMPRESS_TOPK, .ratio = 0.05}},
        {"top-k 5% EF global, N 4", 4, 1, 1, 0, {.kind = DSGD_COMPRESS_TOPK, .ratio = 0.05, .global = 1}},
        {"top-k 5% EF, start_iter 100", 2, 1, 1, 0, {.kind = DSGD_COMPRESS_TOPK, .ratio = 0.05, .start_iter = 100}},
        {"top-k 5% EF, start_iter 300", 2, 1, 1, 0, {.kind = DSGD_COMPRESS_TOPK, .ratio = 0.05, .start_iter = 300}},
        {"sign EF", 2, 1, 1, 0, {.kind = DSGD_COMPRESS_SIGN}},
        {"sign EF, start_iter 300, N 4", 4, 1, 1, 0, {.kind = DSGD_COMPRESS_SIGN, .start_iter = 300}},
        {"PowerSGD rank 2 EF warm", 2, 1, 1, 0, {.kind = DSGD_COMPRESS_POWERSGD, .rank = 2}},
        {"PowerSGD rank 2 EF warm, N 4", 4, 1, 1, 0, {.kind = DSGD_COMPRESS_POWERSGD, .rank = 2}},
        {"PowerSGD rank 2 EF warm, start_iter 100", 2, 1, 1, 0,
         {.kind = DSGD_COMPRESS_POWERSGD, .rank = 2, .start_iter = 100}},
        {"PowerSGD rank 2 EF warm, start_iter 300", 2, 1, 1, 0,
         {.kind = DSGD_COMPRESS_POWERSGD, .rank = 2, .start_iter = 300}},
        {"PowerSGD rank 2 EF warm, 2 workers x 2", 4, 1, 1, 1, {.kind = DSGD_COMPRESS_POWERSGD, .rank = 2}},
        {"top-k 5% EF, start_iter 100, 2 workers x 2", 4, 1, 1, 1,
         {.kind = DSGD_COMPRESS_TOPK, .ratio = 0.05, .start_iter = 100}},
    };
    /* the quick tier: 50 steps cut at 25, start_iter scaled to 10 and 30
       (still before the cut and after it); make test-full: 500 cut at 250 */
    const int steps = TU_PICK(RS_STEPS, 50), cut_at = TU_PICK(RS_CUT, 25);
    float base[2][RS_NP], w[RS_NP];
    size_t base_cut[2] = {0, 0}, k;
    char dir[64];
    (void)state;
    tu_watchdog_for("resume through a strategy", 600);
    tu_mkdtemp(dir);
    rs_data();
    for (k = 0; k < sizeof(cases) / sizeof(cases[0]); ++k) {
        rs_case scaled = cases[k];
        const rs_case *c = &scaled;
        int bi = c->n == 4;
        size_t lc;
        scaled.cd.start_iter = cases[k].cd.start_iter * steps / RS_STEPS;
        lc = rs_case_check(c, dir, steps, cut_at, w);
        if (!c->hook) {
            memcpy(base[bi], w, sizeof(w));
            base_cut[bi] = lc;
        } else if (memcmp(w, base[bi], sizeof(w)) == 0 && base_cut[bi]) {
            fail_msg("%s: trained the bits of no hook: it compressed nothing", c->name);
        }
        if (c->stateful && base_cut[bi] && lc <= base_cut[bi])
            fail_msg("%s: the checkpoint at the cut holds no hook state (%zu bytes, %zu without a hook)", c->name,
                     lc, base_cut[bi]);
        printf("    %-44s N %d: %d + save/restore + %d = %d steps, weights and checkpoint bit for bit\n", c->name,
               c->n, cut_at, steps - cut_at, steps);
        if (scaled.cd.start_iter != cases[k].cd.start_iter)
            printf("    %-44s (start_iter %lld in this tier)\n", "", (long long)scaled.cd.start_iter);
    }
    tu_rmdir_files(dir);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- Deep Gradient Compression */

/* The first entry of each variable 1000 (times rank + 1), the others
   small integers 1..3 with a sign, the same every step. */
static void grad_dgc(int rank, int step, float *g, size_t count) {
    size_t i;
    int v;
    (void)step;
    for (i = 0; i < count; ++i) g[i] = (float)((int)(i % 3) + 1) * (i % 2 ? -1.0f : 1.0f) * (float)(rank + 1);
    for (v = 0; v < NV; ++v) g[g_vars[v].offset] = 1000.0f * (float)(rank + 1);
}

/* Momentum correction in closed form, m = 1/2, k = 1 per variable: the
   first entry of each variable (the largest) is sent every step, so its
   u and v are zeroed (factor masking) and it sends a_t = g (heavy ball)
   or g + m g (Nesterov); every other entry is never sent: u_T = g (2 -
   2^(1 - T)), and v_T = sum_t a_t = g (2T - 2 + 2^(1 - T)) (heavy ball)
   or T g + m g (2T - 2 + 2^(1 - T)) (Nesterov). Before start_iter (2)
   the hook all-reduces the optimizer's momentum step (u, or g + m u) and
   leaves v at zero. */
static void test_dgc_momentum_closed_form(void **state) {
    int nesterov, n, r, t, v;
    size_t i;
    (void)state;
    for (nesterov = 0; nesterov < 2; ++nesterov)
        for (n = 1; n <= 2; ++n) {
            dsgd_compress_desc d;
            run rn;
            const int T = 8, warm = 2;
            memset(&d, 0, sizeof(d));
            d.kind = DSGD_COMPRESS_TOPK;
            d.ratio = 0.005; /* ceil(0.96), ceil(0.06), ceil(0.6): 1 each */
            d.momentum = 0.5f;
            d.nesterov = nesterov;
            d.start_iter = warm;
            run_init(&rn, &d, n, warm + T, grad_dgc);
            run_go(&rn);
            for (r = 0; r < n; ++r) assert_int_equal(rn.saved_bytes[r], 24 + 2 * COUNT * sizeof(float));
            /* the dense steps: the sum over the replicas of u_t (or g + m u_t), u_1 = g, u_2 = 1.5 g */
            for (t = 0; t < warm; ++t)
                for (i = 0; i < COUNT; ++i) {
                    double want = 0.0, u = t ? 1.5 : 1.0;
                    for (r = 0; r < n; ++r) want += rn.gin[r][i] * (nesterov ? 1.0 + 0.5 * u : u);
                    if ((double)rn.out[0][(size_t)t * COUNT + i] != want)
                        fail_msg("nesterov %d N %d dense step %d [%zu]: %g, want %g", nesterov, n, t, i,
                                 (double)rn.out[0][(size_t)t * COUNT + i], want);
                    assert_true(rn.res[0][(size_t)t * COUNT + i] == 0.0f);
                }
            /* the sparse steps: the first entries only, u and v zeroed there */
            for (t = warm; t < warm + T; ++t)
                for (i = 0; i < COUNT; ++i) {
                    int first = 0;
                    double want = 0.0;
                    for (v = 0; v < NV; ++v) first |= i == g_vars[v].offset;
                    /* u entering the first sparse step is 1.75 g (three steps of u = u / 2 + g) */
                    if (first)
                        for (r = 0; r < n; ++r)
                            want += rn.gin[r][i] * (t == warm ? (nesterov ? 1.0 + 0.5 * 1.75 : 1.75)
                                                              : (nesterov ? 1.5 : 1.0));
                    if ((double)rn.out[0][(size_t)t * COUNT + i] != want)
                        fail_msg("nesterov %d N %d step %d [%zu]: %g, want %g", nesterov, n, t, i,
                                 (double)rn.out[0][(size_t)t * COUNT + i], want);
                }
            for (r = 0; r < n; ++r) {
                const float *vT = (const float *)(rn.saved[r] + 24), *uT = vT + COUNT;
                for (i = 0; i < COUNT; ++i) {
                    /* never sent: u_s = g (2 - 2^(1 - s)) after s steps in all, and v sums
                       a_s over the sparse steps s = warm + 1 .. warm + T */
                    double g = rn.gin[r][i], tail = ldexp(1.0, 1 - warm) - ldexp(1.0, 1 - warm - T);
                    double uw = g * (2.0 - ldexp(1.0, 1 - warm - T)), vw = g * (2.0 * T - tail);
                    int first = 0;
                    for (v = 0; v < NV; ++v) first |= i == g_vars[v].offset;
                    if (nesterov) vw = T * g + 0.5 * vw;
                    if (first) uw = vw = 0.0; /* sent: masked */
                    if ((double)uT[i] != uw || (double)vT[i] != vw)
                        fail_msg("nesterov %d N %d replica %d [%zu]: u %g v %g, want %g %g", nesterov, n, r, i,
                                 (double)uT[i], (double)vT[i], uw, vw);
                }
            }
            run_free(&rn);
        }
}

/* Momentum correction at two replicas on random integers (m = 1/2, which
   keeps them exact), Nesterov and not, per variable and global: each
   replica's u, v and part C from a serial reference (u = m u + g, a = u
   or g + m u, M = v + a, C = top-k of M, v = M - C, u zeroed where C
   sent), the bucket the parts summed in rank order, bit for bit, and
   sum_t C_t + v_T = sum_t a_t exactly. */
static void test_dgc_momentum_reference(void **state) {
    int nesterov, global, r, t;
    size_t i;
    (void)state;
    for (nesterov = 0; nesterov < 2; ++nesterov)
        for (global = 0; global < 2; ++global) {
            dsgd_compress_desc d;
            run rn;
            float u[MAXN][COUNT], v[MAXN][COUNT], M[COUNT], C[COUNT], sum[COUNT];
            double sa[MAXN][COUNT], sc[MAXN][COUNT];
            memset(&d, 0, sizeof(d));
            d.kind = DSGD_COMPRESS_TOPK;
            d.ratio = 0.05;
            d.global = global;
            d.momentum = 0.5f;
            d.nesterov = nesterov;
            run_init(&rn, &d, 2, STEPS, grad_int);
            run_go(&rn);
            memset(u, 0, sizeof(u));
            memset(v, 0, sizeof(v));
            memset(sa, 0, sizeof(sa));
            memset(sc, 0, sizeof(sc));
            for (t = 0; t < STEPS; ++t) {
                memset(sum, 0, sizeof(sum));
                for (r = 0; r < 2; ++r) {
                    for (i = 0; i < COUNT; ++i) {
                        float g = rn.gin[r][(size_t)t * COUNT + i], a;
                        u[r][i] = 0.5f * u[r][i] + g;
                        a = nesterov ? g + 0.5f * u[r][i] : u[r][i];
                        sa[r][i] += a;
                        M[i] = v[r][i] + a;
                    }
                    ref_topk(&d, M, C);
                    for (i = 0; i < COUNT; ++i) {
                        v[r][i] = M[i] - C[i];
                        if (C[i] != 0.0f) {
                            v[r][i] = 0.0f;
                            u[r][i] = 0.0f;
                            sum[i] += C[i];
                        }
                        sc[r][i] += C[i];
                    }
                    if (memcmp(v[r], rn.res[r] + (size_t)t * COUNT, sizeof(v[r])) != 0)
                        fail_msg("nesterov %d global %d step %d replica %d: the residual v differs", nesterov,
                                 global, t, r);
                }
                assert_memory_equal(sum, rn.out[0] + (size_t)t * COUNT, sizeof(sum));
            }
            for (r = 0; r < 2; ++r) {
                assert_memory_equal(u[r], rn.saved[r] + 24 + COUNT * sizeof(float), sizeof(u[r]));
                for (i = 0; i < COUNT; ++i)
                    if (sc[r][i] + (double)v[r][i] != sa[r][i])
                        fail_msg("replica %d [%zu]: sum C + v_T = %.17g, sum a = %.17g", r, i,
                                 sc[r][i] + (double)v[r][i], sa[r][i]);
            }
            run_free(&rn);
        }
}

/* Positive integers 1..8: M = g + e never has a zero, so top-k sends
   exactly k nonzeros per variable. */
static void grad_pos(int rank, int step, float *g, size_t count) {
    tu_rng rng = tu_rng_make(3000u * (uint64_t)step + (uint64_t)rank + 5u);
    size_t i;
    for (i = 0; i < count; ++i) g[i] = (float)(1 + (int)tu_below(&rng, 8));
}

/* The sparsity warm-up: ratio 0.01, start_iter 2, warmup_steps 10, so S =
   3 stages (1/4, 1/16, 1/64 are above 0.01) over the steps 2..11, at 2 + [0,
   3), [3, 6), [6, 10), then 0.01; dense before 2. Each step sends exactly
   k = ceil(f n) entries of each variable (counted in the bucket at one
   replica) and dsgd_compress_bytes says 8 K. With ratio 0.001 over one
   variable of 100000 floats the stages keep 25000, 6250, 1563, 391 (DGC's
   75%, 93.75%, 98.4375%, 99.6% sparsity), then 100. */
static void test_dgc_sparsity_warmup(void **state) {
    static const double frac[16] = {1, 1, 0.25, 0.25, 0.25, 0.0625, 0.0625, 0.0625,
                                    1.0 / 64, 1.0 / 64, 1.0 / 64, 1.0 / 64, 0.01, 0.01, 0.01, 0.01};
    dsgd_compress_desc d;
    dsgd_hook_bucket b;
    dsgd_variable big;
    const dsgd_variable *bp = &big;
    run rn;
    int t, v;
    size_t i;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    d.ratio = 0.01;
    d.start_iter = 2;
    d.warmup_steps = 10;
    run_init(&rn, &d, 1, 16, grad_pos);
    run_go(&rn);
    memset(&b, 0, sizeof(b));
    b.count = COUNT;
    b.vars = g_vp;
    b.num_vars = NV;
    b.num_replicas = 1;
    for (t = 0; t < 16; ++t) {
        size_t K = 0;
        for (v = 0; v < NV; ++v) {
            size_t k = t < 2 ? g_vars[v].count : ref_k(frac[t], g_vars[v].count), nz = 0;
            for (i = 0; i < g_vars[v].count; ++i) nz += rn.out[0][(size_t)t * COUNT + g_vars[v].offset + i] != 0.0f;
            if (nz != k) fail_msg("step %d %s: %zu entries sent, want %zu", t, g_vars[v].name, nz, k);
            K += k;
        }
        b.step = t;
        assert_int_equal(dsgd_compress_bytes(&d, &b), t < 2 ? 4 * COUNT : 8 * K);
    }
    run_free(&rn);
    /* DGC's own schedule */
    memset(&big, 0, sizeof(big));
    snprintf(big.name, sizeof(big.name), "big");
    big.rank = 1;
    big.shape[0] = 100000;
    big.count = 100000;
    b.count = 100000;
    b.vars = &bp;
    b.num_vars = 1;
    d.ratio = 0.001;
    d.start_iter = 0;
    d.warmup_steps = 400; /* S = 4: 100 steps a stage */
    {
        static const size_t want[6] = {25000, 6250, 1563, 391, 100, 100};
        for (t = 0; t < 6; ++t) {
            b.step = 100 * t + (t % 2 ? 99 : 0); /* a stage's first step or last */
            assert_int_equal(dsgd_compress_bytes(&d, &b), 8 * want[t]);
        }
    }
    /* warmup_steps not a multiple of S: stage j starts at floor(j W / S), W = 10, S = 4: 0, 2, 5, 7 */
    d.warmup_steps = 10;
    {
        static const size_t want[11] = {25000, 25000, 6250, 6250, 6250, 1563, 1563, 391, 391, 391, 100};
        for (t = 0; t < 11; ++t) {
            b.step = t;
            assert_int_equal(dsgd_compress_bytes(&d, &b), 8 * want[t]);
        }
    }
}

/* The new settings refused where they do not apply; a momentum-corrected
   run saved after 5 steps and resumed continues bit for bit. */
static void test_dgc_desc_and_resume(void **state) {
    dsgd_compress_desc d;
    run full, first, rest;
    int r;
    (void)state;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    d.momentum = 1.0f;
    bad_desc(&d, "momentum 1 is outside [0, 1)");
    d.momentum = -0.5f;
    bad_desc(&d, "momentum -0.5");
    d.momentum = NAN;
    bad_desc(&d, "momentum nan");
    d.momentum = 0.9f;
    d.no_error_feedback = 1;
    bad_desc(&d, "needs kind topk with error feedback");
    d.no_error_feedback = 0;
    d.kind = DSGD_COMPRESS_SIGN;
    bad_desc(&d, "needs kind topk with error feedback");
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    d.warmup_steps = -1;
    bad_desc(&d, "warmup_steps -1 is negative");
    d.kind = DSGD_COMPRESS_POWERSGD;
    d.warmup_steps = 5;
    bad_desc(&d, "warmup_steps 5 is for kind topk only");
    /* the hook says it applies momentum (the strategy then takes plain
       SGD only) exactly when momentum correction is on */
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    assert_int_equal(dsgd_compress_hook(&d).owns_momentum, 0);
    d.momentum = 0.9f;
    assert_int_equal(dsgd_compress_hook(&d).owns_momentum, 1);
    /* resume */
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_COMPRESS_TOPK;
    d.ratio = 0.1;
    d.momentum = 0.9f;
    d.nesterov = 1;
    d.start_iter = 1;
    d.warmup_steps = 6;
    run_init(&full, &d, 2, STEPS, grad_int);
    run_go(&full);
    run_init(&first, &d, 2, 5, grad_int);
    run_go(&first);
    run_init(&rest, &d, 2, STEPS - 5, grad_int);
    rest.step0 = 5;
    for (r = 0; r < 2; ++r) {
        assert_int_equal(first.saved_bytes[r], 24 + 2 * COUNT * sizeof(float));
        rest.load[r] = first.saved[r];
        rest.load_bytes[r] = first.saved_bytes[r];
    }
    run_go(&rest);
    for (r = 0; r < 2; ++r) {
        assert_memory_equal(full.out[r] + 5 * COUNT, rest.out[r], (size_t)(STEPS - 5) * COUNT * sizeof(float));
        assert_memory_equal(full.saved[r], rest.saved[r], full.saved_bytes[r]);
    }
    run_free(&rest);
    run_free(&first);
    run_free(&full);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ef_identity_one_replica),
        cmocka_unit_test(test_topk_sign_four_replicas),
        cmocka_unit_test(test_powersgd_four_replicas),
        cmocka_unit_test(test_powersgd_low_rank),
        cmocka_unit_test(test_powersgd_below_rank),
        cmocka_unit_test(test_powersgd_warm_start),
        cmocka_unit_test(test_bytes),
        cmocka_unit_test(test_bad_desc),
        cmocka_unit_test(test_bad_bucket),
        cmocka_unit_test(test_save_load_resume),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_half_wires),
        cmocka_unit_test(test_strategy_resume),
        cmocka_unit_test(test_dgc_momentum_closed_form),
        cmocka_unit_test(test_dgc_momentum_reference),
        cmocka_unit_test(test_dgc_sparsity_warmup),
        cmocka_unit_test(test_dgc_desc_and_resume),
    };
    model_init();
    tu_watchdog(120);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
