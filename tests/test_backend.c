/* test_backend.c - the CPU reference backend through its vtable.

   Every operation is checked against values computed here on the host:
   - gemm against a naive double-precision triple loop, in all four transpose
     combinations, at odd sizes and sizes around typical cache blocks, with
     padded leading dimensions, offsets, non-trivial alpha/beta, k = 0, and
     beta = 0 over a C preset to NaN. Tolerance: 1e-5 * (|alpha| sum_k |a||b| +
     |beta c|) per element, i.e. float rounding of a length-k dot product.
   - bias_act_forward against the closed forms; act_backward, bias_backward and
     both losses against central finite differences (see each test for step
     and tolerance) and against their closed forms.
   - optimizer_update for each kind against the reference formulas written out
     in the test (PyTorch SGD/momentum, Kingma & Ba Adam, Loshchilov & Hutter
     AdamW).
   - norm_check, and the buffer operations with offsets (neighbours untouched).

   Build: make test (or cc -std=c99 tests/test_backend.c -lcmocka -lm -lpthread). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

/* ---------------------------------------------------------------- fixture */

typedef struct fx {
    dsgd_ctx *ctx;
    dsgd_backend_i be;
} fx;

static int setup(void **state) {
    fx *f = (fx *)calloc(1, sizeof *f);
    if (!f) return -1;
    if (dsgd_ctx_create(NULL, &f->ctx) != DSGD_OK) return -1;
    if (dsgd_cpu_backend_create(f->ctx, &f->be) != DSGD_OK) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = (fx *)*state;
    if (f->be.destroy) f->be.destroy(f->be.impl);
    dsgd_ctx_destroy(f->ctx);
    free(f);
    return 0;
}

static dsgd_ref mkref(dsgd_buffer *b, size_t off) {
    dsgd_ref r;
    r.buf = b;
    r.off = off;
    return r;
}

static dsgd_ref nullref(void) { return mkref(NULL, 0); }

/* A buffer of n floats holding src (if non-NULL) at offset 0. */
static dsgd_buffer *mkbuf(fx *f, size_t n, const float *src) {
    dsgd_buffer *b = NULL;
    TU_OK(f->ctx, f->be.buffer_create(f->be.impl, n ? n : 1, &b));
    assert_non_null(b);
    if (src && n) TU_OK(f->ctx, f->be.write(f->be.impl, mkref(b, 0), src, n));
    return b;
}

static void rd(fx *f, dsgd_buffer *b, size_t off, float *dst, size_t n) {
    TU_OK(f->ctx, f->be.read(f->be.impl, mkref(b, off), dst, n));
}

static void freebuf(fx *f, dsgd_buffer *b) { f->be.buffer_destroy(f->be.impl, b); }

/* ---------------------------------------------------------------- basics */

static void test_backend_basics(void **state) {
    fx *f = (fx *)*state;
    dsgd_buffer *b;
    float *p;
    const float v[3] = {1.5f, -2.0f, 3.25f};
    assert_non_null(f->be.name);
    assert_true(f->be.name[0] != '\0');
    assert_non_null(f->be.gemm);
    assert_non_null(f->be.loss);
    assert_non_null(f->be.optimizer_update);
    /* The CPU backend exposes host pointers; they alias the device data. */
    assert_non_null(f->be.buffer_host_ptr);
    b = mkbuf(f, 8, NULL);
    TU_OK(f->ctx, f->be.write(f->be.impl, mkref(b, 4), v, 3));
    if (f->be.finish) TU_OK(f->ctx, f->be.finish(f->be.impl));
    p = f->be.buffer_host_ptr(f->be.impl, b);
    assert_non_null(p);
    assert_memory_equal(p + 4, v, sizeof v);
    freebuf(f, b);
    TU_ERR(NULL, DSGD_ERR_INVALID_ARGUMENT, dsgd_cpu_backend_create(f->ctx, NULL));
}

/* write/read/copy/fill/scale/axpy at offsets; entries outside the range stay. */
static void test_buffer_ops(void **state) {
    fx *f = (fx *)*state;
    enum { N = 24 };
    const float sentinel = -777.0f;
    float src[5] = {1, 2, 3, 4, 5}, got[N], want[N];
    dsgd_buffer *a = mkbuf(f, N, NULL), *b = mkbuf(f, N, NULL);
    size_t i;

    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(a, 0), sentinel, N));
    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(b, 0), sentinel, N));
    for (i = 0; i < N; ++i) want[i] = sentinel;

    /* write at offset 3 */
    TU_OK(f->ctx, f->be.write(f->be.impl, mkref(a, 3), src, 5));
    for (i = 0; i < 5; ++i) want[3 + i] = src[i];
    rd(f, a, 0, got, N);
    assert_memory_equal(got, want, sizeof got);

    /* read at an offset */
    rd(f, a, 4, got, 3);
    assert_true(got[0] == 2.0f && got[1] == 3.0f && got[2] == 4.0f);

    /* fill at offset 10, 4 entries */
    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(a, 10), 0.5f, 4));
    for (i = 10; i < 14; ++i) want[i] = 0.5f;
    rd(f, a, 0, got, N);
    assert_memory_equal(got, want, sizeof got);

    /* scale [3,8) by -2 */
    TU_OK(f->ctx, f->be.scale(f->be.impl, mkref(a, 3), -2.0f, 5));
    for (i = 3; i < 8; ++i) want[i] *= -2.0f;
    rd(f, a, 0, got, N);
    assert_memory_equal(got, want, sizeof got);

    /* axpy: a[10..14) += 3 * a[3..7) (same buffer, disjoint ranges) */
    TU_OK(f->ctx, f->be.axpy(f->be.impl, mkref(a, 10), 3.0f, mkref(a, 3), 4));
    for (i = 0; i < 4; ++i) want[10 + i] += 3.0f * want[3 + i];
    rd(f, a, 0, got, N);
    for (i = 0; i < N; ++i) TU_NEAR(got[i], want[i], 1e-6 * fabs(want[i]));

    /* copy a[3..8) to b[17..22) */
    TU_OK(f->ctx, f->be.copy(f->be.impl, mkref(b, 17), mkref(a, 3), 5));
    rd(f, b, 0, got, N);
    for (i = 0; i < N; ++i) {
        float w = (i >= 17 && i < 22) ? want[3 + i - 17] : sentinel;
        assert_true(got[i] == w);
    }
    /* copy within one buffer, disjoint */
    TU_OK(f->ctx, f->be.copy(f->be.impl, mkref(a, 18), mkref(a, 10), 4));
    for (i = 0; i < 4; ++i) want[18 + i] = want[10 + i];
    rd(f, a, 0, got, N);
    assert_memory_equal(got, want, sizeof got);

    /* zero-length operations are no-ops */
    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(a, 0), 9.0f, 0));
    TU_OK(f->ctx, f->be.scale(f->be.impl, mkref(a, 0), 9.0f, 0));
    rd(f, a, 0, got, N);
    assert_memory_equal(got, want, sizeof got);

    freebuf(f, a);
    freebuf(f, b);
}

/* ---------------------------------------------------------------- gemm */

typedef struct gemm_case {
    int ta, tb, m, n, k;
    int pad_a, pad_b, pad_c; /* extra columns in the stored matrices */
    float alpha, beta;
    int nan_c; /* preset C to NaN (only with beta == 0) */
} gemm_case;

static void run_gemm(fx *f, const gemm_case *g, uint64_t seed) {
    /* Stored shapes (row-major): A is (m,k) or, transposed, (k,m); B is (k,n) or (n,k). */
    const int ar = g->ta ? g->k : g->m, ac = g->ta ? g->m : g->k;
    const int br = g->tb ? g->n : g->k, bc = g->tb ? g->k : g->n;
    const int lda = ac + g->pad_a, ldb = bc + g->pad_b, ldc = g->n + g->pad_c;
    const size_t offa = 3, offb = 5, offc = 7; /* the matrices start inside their buffers */
    const size_t na = offa + (size_t)ar * lda, nb = offb + (size_t)br * ldb,
                 nc = offc + (size_t)g->m * ldc;
    const float sentinel = 4242.0f;
    float *ha = tu_floats(na), *hb = tu_floats(nb), *hc = tu_floats(nc), *out = tu_floats(nc);
    dsgd_buffer *ba, *bb, *bc_;
    tu_rng r = tu_rng_make(seed);
    int i, j, p;
    size_t q;

    tu_fill(&r, ha, na, -1.0f, 1.0f);
    tu_fill(&r, hb, nb, -1.0f, 1.0f);
    tu_fill(&r, hc, nc, -1.0f, 1.0f);
    /* Padding columns of C and the prefix carry a sentinel that must survive. */
    for (q = 0; q < offc; ++q) hc[q] = sentinel;
    for (i = 0; i < g->m; ++i)
        for (j = g->n; j < ldc; ++j) hc[offc + (size_t)i * ldc + j] = sentinel;
    if (g->nan_c)
        for (i = 0; i < g->m; ++i)
            for (j = 0; j < g->n; ++j) hc[offc + (size_t)i * ldc + j] = NAN;

    ba = mkbuf(f, na, ha);
    bb = mkbuf(f, nb, hb);
    bc_ = mkbuf(f, nc, hc);
    TU_OK(f->ctx, f->be.gemm(f->be.impl, g->ta, g->tb, g->m, g->n, g->k, g->alpha,
                             mkref(ba, offa), lda, mkref(bb, offb), ldb, g->beta,
                             mkref(bc_, offc), ldc));
    rd(f, bc_, 0, out, nc);

    for (q = 0; q < offc; ++q) assert_true(out[q] == sentinel);
    for (i = 0; i < g->m; ++i) {
        for (j = 0; j < ldc; ++j) {
            size_t ci = offc + (size_t)i * ldc + j;
            double s = 0.0, sabs = 0.0, want, tol;
            if (j >= g->n) {
                if (out[ci] != sentinel)
                    fail_msg("gemm ta=%d tb=%d %dx%dx%d wrote padding C[%d][%d]", g->ta, g->tb,
                             g->m, g->n, g->k, i, j);
                continue;
            }
            for (p = 0; p < g->k; ++p) {
                double av = g->ta ? ha[offa + (size_t)p * lda + i] : ha[offa + (size_t)i * lda + p];
                double bv = g->tb ? hb[offb + (size_t)j * ldb + p] : hb[offb + (size_t)p * ldb + j];
                s += av * bv;
                sabs += fabs(av * bv);
            }
            want = (double)g->alpha * s;
            tol = 1e-5 * fabs((double)g->alpha) * sabs + 1e-30;
            if (g->beta != 0.0f) {
                want += (double)g->beta * hc[ci];
                tol += 1e-5 * fabs((double)g->beta * hc[ci]);
            }
            if (!(fabs(out[ci] - want) <= tol))
                fail_msg("gemm ta=%d tb=%d m=%d n=%d k=%d lda=%d ldb=%d ldc=%d alpha=%g "
                         "beta=%g: C[%d][%d] = %.9g, want %.9g (tol %.3g)",
                         g->ta, g->tb, g->m, g->n, g->k, lda, ldb, ldc, g->alpha, g->beta, i,
                         j, out[ci], want, tol);
        }
    }
    /* A and B are inputs only. */
    free(out);
    out = tu_floats(na > nb ? na : nb);
    rd(f, ba, 0, out, na);
    assert_memory_equal(out, ha, na * sizeof(float));
    rd(f, bb, 0, out, nb);
    assert_memory_equal(out, hb, nb * sizeof(float));

    freebuf(f, ba);
    freebuf(f, bb);
    freebuf(f, bc_);
    free(ha);
    free(hb);
    free(hc);
    free(out);
}

/* Sizes: trivial, odd, and around the block sizes a cache-blocked GEMM is
   likely to use (powers of two and one either side). */
static const int gemm_sizes[][3] = {
    {1, 1, 1},      {37, 29, 41},   {2, 3, 1},     {64, 64, 64},   {63, 65, 127},
    {65, 129, 63},  {128, 1, 257},  {1, 130, 67},  {129, 33, 256}, {200, 17, 300},
    {16, 256, 8},   {300, 270, 5},  {257, 129, 520}, {7, 511, 33},  {33, 9, 1025},
    {5, 17, 3},     {4, 16, 258},   {3, 2051, 17},   {131, 15, 255},
};

static void test_gemm_all_transposes(void **state) {
    fx *f = (fx *)*state;
    size_t s;
    int t;
    uint64_t seed = 1;
    for (t = 0; t < 4; ++t) {
        for (s = 0; s < sizeof gemm_sizes / sizeof gemm_sizes[0]; ++s) {
            gemm_case g;
            memset(&g, 0, sizeof g);
            g.ta = t & 1;
            g.tb = (t >> 1) & 1;
            g.m = gemm_sizes[s][0];
            g.n = gemm_sizes[s][1];
            g.k = gemm_sizes[s][2];
            /* plain alpha=1, beta=0 with tight leading dimensions */
            g.alpha = 1.0f;
            g.beta = 0.0f;
            run_gemm(f, &g, seed++);
            /* non-trivial alpha/beta with padded leading dimensions */
            g.alpha = -0.75f;
            g.beta = 1.25f;
            g.pad_a = 3;
            g.pad_b = 5;
            g.pad_c = 2;
            run_gemm(f, &g, seed++);
        }
    }
}

/* beta == 0 overwrites C: NaN preset in C must not reach the result. */
static void test_gemm_beta_zero_ignores_nan(void **state) {
    fx *f = (fx *)*state;
    int t;
    for (t = 0; t < 4; ++t) {
        gemm_case g;
        memset(&g, 0, sizeof g);
        g.ta = t & 1;
        g.tb = t >> 1;
        g.m = 19;
        g.n = 23;
        g.k = 70;
        g.pad_c = 1;
        g.alpha = 0.5f;
        g.beta = 0.0f;
        g.nan_c = 1;
        run_gemm(f, &g, 100 + (uint64_t)t);
    }
}

/* k == 0: op(A) op(B) is the zero matrix, so C = beta * C (and C = 0 when
   beta == 0, even over NaN). */
static void test_gemm_k_zero(void **state) {
    fx *f = (fx *)*state;
    gemm_case g;
    memset(&g, 0, sizeof g);
    g.m = 5;
    g.n = 4;
    g.k = 0;
    g.alpha = 2.0f;
    g.beta = 0.5f;
    g.pad_a = 1; /* lda >= 1 */
    g.pad_b = 0;
    run_gemm(f, &g, 7);
    g.beta = 0.0f;
    g.nan_c = 1;
    run_gemm(f, &g, 8);
    g.tb = 1;
    g.ta = 1;
    g.pad_b = 1;
    g.beta = 3.0f;
    g.nan_c = 0;
    run_gemm(f, &g, 9);
}

/* ---------------------------------------------------------------- activations */

static double act_ref(dsgd_activation a, double z) {
    switch (a) {
    case DSGD_ACT_RELU: return z > 0 ? z : 0;
    case DSGD_ACT_TANH: return tanh(z);
    case DSGD_ACT_SIGMOID: return 1.0 / (1.0 + exp(-z));
    default: return z;
    }
}

static const dsgd_activation all_acts[4] = {DSGD_ACT_NONE, DSGD_ACT_RELU, DSGD_ACT_TANH,
                                            DSGD_ACT_SIGMOID};

/* y = act(y + bias) row by row; bias with buf NULL means no bias. */
static void test_bias_act_forward(void **state) {
    fx *f = (fx *)*state;
    enum { M = 9, N = 13, OFF = 5 };
    float y0[OFF + M * N], bias[2 + N], out[OFF + M * N];
    int a, with_bias, i, j;
    tu_rng r = tu_rng_make(11);
    for (a = 0; a < 4; ++a) {
        for (with_bias = 0; with_bias < 2; ++with_bias) {
            dsgd_buffer *by, *bb;
            tu_fill(&r, y0, OFF + M * N, -4.0f, 4.0f);
            tu_fill(&r, bias, 2 + N, -1.0f, 1.0f);
            by = mkbuf(f, OFF + M * N, y0);
            bb = mkbuf(f, 2 + N, bias);
            TU_OK(f->ctx, f->be.bias_act_forward(f->be.impl, all_acts[a], mkref(by, OFF),
                                                 with_bias ? mkref(bb, 2) : nullref(), M, N));
            rd(f, by, 0, out, OFF + M * N);
            for (i = 0; i < OFF; ++i) assert_true(out[i] == y0[i]);
            for (i = 0; i < M; ++i) {
                for (j = 0; j < N; ++j) {
                    double z = (double)y0[OFF + i * N + j] + (with_bias ? bias[2 + j] : 0.0f);
                    double want = act_ref(all_acts[a], (float)z);
                    /* float evaluation of exp/tanh: a few ulp of the output */
                    if (!(fabs(out[OFF + i * N + j] - want) <= 1e-6 + 1e-6 * fabs(want)))
                        fail_msg("bias_act_forward act=%d bias=%d [%d][%d]: z=%g got %.9g want "
                                 "%.9g",
                                 a, with_bias, i, j, z, out[OFF + i * N + j], want);
                }
            }
            freebuf(f, by);
            freebuf(f, bb);
        }
    }
}

/* act_backward: dy *= act'(z), written in terms of y = act(z). Checked
   against central differences of the closed-form activation in double
   (step 1e-5: truncation ~1e-10, rounding ~1e-11), tolerance 1e-5 absolute
   plus 1e-5 relative, which covers y being rounded to float before the
   derivative is formed from it. The y fed in comes from bias_act_forward on
   the device. ReLU inputs are kept away from the kink (|z| > 0.05). */
static void test_act_backward_fd(void **state) {
    fx *f = (fx *)*state;
    enum { M = 6, N = 11, OFF = 3 };
    float z[M * N], g[OFF + M * N], y[M * N], out[OFF + M * N];
    int a, i;
    tu_rng r = tu_rng_make(12);
    for (a = 0; a < 4; ++a) {
        dsgd_buffer *by, *bg;
        for (i = 0; i < M * N; ++i) {
            do z[i] = tu_uniform(&r, -3.0f, 3.0f);
            while (fabsf(z[i]) < 0.05f);
        }
        tu_fill(&r, g, OFF + M * N, -2.0f, 2.0f);
        by = mkbuf(f, M * N, z);
        bg = mkbuf(f, OFF + M * N, g);
        TU_OK(f->ctx, f->be.bias_act_forward(f->be.impl, all_acts[a], mkref(by, 0), nullref(),
                                             M, N));
        rd(f, by, 0, y, M * N);
        TU_OK(f->ctx, f->be.act_backward(f->be.impl, all_acts[a], mkref(bg, OFF), mkref(by, 0),
                                         (size_t)M * N));
        rd(f, bg, 0, out, OFF + M * N);
        for (i = 0; i < OFF; ++i) assert_true(out[i] == g[i]);
        for (i = 0; i < M * N; ++i) {
            const double h = 1e-5;
            double d = (act_ref(all_acts[a], (double)z[i] + h) -
                        act_ref(all_acts[a], (double)z[i] - h)) /
                       (2 * h);
            double want = g[OFF + i] * d;
            if (!(fabs(out[OFF + i] - want) <= 1e-5 + 1e-5 * fabs(want)))
                fail_msg("act_backward act=%d i=%d z=%g y=%g dy=%g: got %.9g, want %.9g", a, i,
                         z[i], y[i], g[OFF + i], out[OFF + i], want);
        }
        /* y is an input only */
        rd(f, by, 0, out, M * N);
        assert_memory_equal(out, y, sizeof y);
        freebuf(f, by);
        freebuf(f, bg);
    }
}

/* bias_backward: db(n) = column sums of dy(m,n), overwriting db. It is the
   exact gradient of sum_ij dy_ij (y_ij + b_j) with respect to b; a linear map,
   so it is checked against the double sum (tolerance: float rounding of an
   m-term sum) and, once, against a central difference through the device's
   own forward (bias add with act NONE). */
static void test_bias_backward(void **state) {
    fx *f = (fx *)*state;
    enum { M = 37, N = 10, OFF = 4 };
    float dy[M * N], db[OFF + N], out[OFF + N];
    int i, j;
    tu_rng r = tu_rng_make(13);
    dsgd_buffer *bdy, *bdb;
    tu_fill(&r, dy, M * N, -1.0f, 1.0f);
    for (j = 0; j < OFF + N; ++j) db[j] = 99.0f; /* garbage that must be overwritten */
    bdy = mkbuf(f, M * N, dy);
    bdb = mkbuf(f, OFF + N, db);
    TU_OK(f->ctx, f->be.bias_backward(f->be.impl, mkref(bdb, OFF), mkref(bdy, 0), M, N));
    rd(f, bdb, 0, out, OFF + N);
    for (j = 0; j < OFF; ++j) assert_true(out[j] == 99.0f);
    for (j = 0; j < N; ++j) {
        double s = 0, sabs = 0;
        for (i = 0; i < M; ++i) {
            s += dy[i * N + j];
            sabs += fabs(dy[i * N + j]);
        }
        TU_NEAR(out[OFF + j], s, 1e-6 * sabs);
    }

    /* Finite difference of L(b) = sum_ij dy_ij * (x_ij + b_j) computed by the
       device (bias_act_forward with NONE), in double on the host for the sum.
       Step 1e-2 on a value of order 1: rounding of x+b ~6e-8 per entry, over
       M entries ~ 2e-6/2e-2 = 1e-4 worst case; L is linear so no truncation. */
    {
        float x[M * N], yp[M * N], ym[M * N], b[N];
        const float h = 1e-2f;
        dsgd_buffer *bx, *bb;
        tu_fill(&r, x, M * N, -1.0f, 1.0f);
        tu_fill(&r, b, N, -0.5f, 0.5f);
        bx = mkbuf(f, M * N, NULL);
        bb = mkbuf(f, N, NULL);
        for (j = 0; j < N; ++j) {
            double lp = 0, lm = 0, fd;
            float bj = b[j];
            b[j] = bj + h;
            TU_OK(f->ctx, f->be.write(f->be.impl, mkref(bx, 0), x, M * N));
            TU_OK(f->ctx, f->be.write(f->be.impl, mkref(bb, 0), b, N));
            TU_OK(f->ctx, f->be.bias_act_forward(f->be.impl, DSGD_ACT_NONE, mkref(bx, 0),
                                                 mkref(bb, 0), M, N));
            rd(f, bx, 0, yp, M * N);
            b[j] = bj - h;
            TU_OK(f->ctx, f->be.write(f->be.impl, mkref(bx, 0), x, M * N));
            TU_OK(f->ctx, f->be.write(f->be.impl, mkref(bb, 0), b, N));
            TU_OK(f->ctx, f->be.bias_act_forward(f->be.impl, DSGD_ACT_NONE, mkref(bx, 0),
                                                 mkref(bb, 0), M, N));
            rd(f, bx, 0, ym, M * N);
            b[j] = bj;
            for (i = 0; i < M * N; ++i) {
                lp += (double)dy[i] * yp[i];
                lm += (double)dy[i] * ym[i];
            }
            /* (bj+h)-(bj-h) is not exactly 2h in float; use the real spread */
            fd = (lp - lm) / ((double)(bj + h) - (double)(bj - h));
            TU_NEAR(out[OFF + j], fd, 1e-3);
        }
        freebuf(f, bx);
        freebuf(f, bb);
    }
    freebuf(f, bdy);
    freebuf(f, bdb);
}

/* ---------------------------------------------------------------- losses */

/* Per-sample losses in double. */
static double xent_ref(const float *p, int c, int cls) {
    double mx = p[0], s = 0;
    int j;
    for (j = 1; j < c; ++j)
        if (p[j] > mx) mx = p[j];
    for (j = 0; j < c; ++j) s += exp((double)p[j] - mx);
    return mx + log(s) - p[cls];
}

static double mse_ref(const float *p, const float *t, int c) {
    double s = 0;
    int j;
    for (j = 0; j < c; ++j) s += ((double)p[j] - t[j]) * ((double)p[j] - t[j]);
    return s / c;
}

static int argmax(const float *p, int c) {
    int j, b = 0;
    for (j = 1; j < c; ++j)
        if (p[j] > p[b]) b = j;
    return b;
}

/* Runs the device loss on rows [row, row+m) with stats starting at {0,0};
   returns stats[0]. dp may be NULL. */
static double dev_loss(fx *f, dsgd_loss kind, int m, int c, const float *pred,
                       const float *target, int tdim, float scale, float *dp, float *stats_out) {
    dsgd_buffer *bp = mkbuf(f, (size_t)m * c, pred);
    dsgd_buffer *bt = mkbuf(f, (size_t)m * tdim, target);
    dsgd_buffer *bd = dp ? mkbuf(f, (size_t)m * c, NULL) : NULL;
    dsgd_buffer *bs = mkbuf(f, 2, NULL);
    float st[2];
    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(bs, 0), 0.0f, 2));
    TU_OK(f->ctx, f->be.loss(f->be.impl, kind, m, c, mkref(bp, 0), mkref(bt, 0), scale,
                             bd ? mkref(bd, 0) : nullref(), mkref(bs, 0)));
    rd(f, bs, 0, st, 2);
    if (dp) rd(f, bd, 0, dp, (size_t)m * c);
    if (stats_out) memcpy(stats_out, st, sizeof st);
    freebuf(f, bp);
    freebuf(f, bt);
    if (bd) freebuf(f, bd);
    freebuf(f, bs);
    return st[0];
}

/* Softmax cross-entropy: stats against the closed form; dpred against the
   closed form grad_scale * (softmax - onehot) and against central differences
   of the device's own loss value (one sample at a time, so the float sum
   stays small). FD step 1e-2 on floats: truncation h^2/6 * |f'''| < 2e-5,
   rounding ~ 4 ulp(loss ~ 3) / 2h ~ 5e-5; tolerance 3e-4 absolute. */
static void test_loss_softmax_xent(void **state) {
    fx *f = (fx *)*state;
    enum { M = 8, C = 5, OFF = 2 };
    float pred[M * C], tgt[OFF + M], dp[M * C], st[2], stats0[2] = {1.5f, 2.0f};
    const float scale = 0.37f;
    double want_loss = 0;
    int i, j, want_correct = 0;
    tu_rng r = tu_rng_make(21);
    dsgd_buffer *bp, *bt, *bd, *bs;

    tu_fill(&r, pred, M * C, -3.0f, 3.0f);
    for (i = 0; i < OFF; ++i) tgt[i] = -5.0f; /* out of range, must not be read */
    for (i = 0; i < M; ++i) {
        int am = argmax(pred + i * C, C);
        int cls = (i % 2) ? am : (am + 1 + i % (C - 1)) % C;
        tgt[OFF + i] = (float)cls;
        want_correct += cls == am;
        want_loss += xent_ref(pred + i * C, C, cls);
    }
    assert_int_equal(want_correct, M / 2);

    bp = mkbuf(f, M * C, pred);
    bt = mkbuf(f, OFF + M, tgt);
    bd = mkbuf(f, M * C, NULL);
    bs = mkbuf(f, 3, NULL);
    /* stats accumulate (+=) at their offset */
    TU_OK(f->ctx, f->be.write(f->be.impl, mkref(bs, 1), stats0, 2));
    TU_OK(f->ctx, f->be.loss(f->be.impl, DSGD_LOSS_SOFTMAX_XENT, M, C, mkref(bp, 0),
                             mkref(bt, OFF), scale, mkref(bd, 0), mkref(bs, 1)));
    rd(f, bs, 1, st, 2);
    TU_NEAR(st[0], 1.5 + want_loss, 1e-5 * (1.5 + want_loss));
    TU_NEAR(st[1], 2.0 + want_correct, 0);
    rd(f, bd, 0, dp, M * C);
    for (i = 0; i < M; ++i) {
        double mx = pred[i * C], s = 0;
        for (j = 0; j < C; ++j) mx = pred[i * C + j] > mx ? pred[i * C + j] : mx;
        for (j = 0; j < C; ++j) s += exp(pred[i * C + j] - mx);
        for (j = 0; j < C; ++j) {
            double sm = exp(pred[i * C + j] - mx) / s;
            double want = scale * (sm - (j == (int)tgt[OFF + i] ? 1.0 : 0.0));
            TU_NEAR(dp[i * C + j], want, 1e-6);
        }
    }
    /* central differences of the device loss, per sample */
    for (i = 0; i < M; ++i) {
        float row[C];
        for (j = 0; j < C; ++j) {
            const float h = 1e-2f;
            double lp, lm, fd;
            float pj;
            memcpy(row, pred + i * C, sizeof row);
            pj = row[j];
            row[j] = pj + h;
            lp = dev_loss(f, DSGD_LOSS_SOFTMAX_XENT, 1, C, row, &tgt[OFF + i], 1, 1.0f, NULL, NULL);
            row[j] = pj - h;
            lm = dev_loss(f, DSGD_LOSS_SOFTMAX_XENT, 1, C, row, &tgt[OFF + i], 1, 1.0f, NULL, NULL);
            fd = scale * (lp - lm) / ((double)(pj + h) - (double)(pj - h));
            if (!(fabs(dp[i * C + j] - fd) <= 3e-4))
                fail_msg("xent dpred[%d][%d] = %.7g, finite difference %.7g", i, j,
                         dp[i * C + j], fd);
        }
    }
    /* dpred.buf NULL: statistics only */
    {
        float st2[2];
        double l = dev_loss(f, DSGD_LOSS_SOFTMAX_XENT, M, C, pred, tgt + OFF, 1, scale, NULL, st2);
        TU_NEAR(l, want_loss, 1e-5 * want_loss);
        TU_NEAR(st2[1], want_correct, 0);
    }
    /* numerically stable for large logits: finite loss and gradient */
    {
        float big[3] = {1000.0f, -1000.0f, 999.0f}, t1 = 2.0f, d3[3], s3[2];
        double l = dev_loss(f, DSGD_LOSS_SOFTMAX_XENT, 1, 3, big, &t1, 1, 1.0f, d3, s3);
        /* float rounding near 1000 is 6e-5, so allow 2e-4 */
        TU_NEAR(l, log(1.0 + exp(-1.0)) + 1.0, 2e-4);
        assert_true(isfinite(d3[0]) && isfinite(d3[1]) && isfinite(d3[2]));
        TU_NEAR(d3[2], 1.0 / (1.0 + exp(1.0)) - 1.0, 1e-6);
    }
    freebuf(f, bp);
    freebuf(f, bt);
    freebuf(f, bd);
    freebuf(f, bs);
}

/* MSE: per-sample loss (1/c) sum_j (p_j - t_j)^2, dpred = grad_scale * 2/c (p - t).
   Correct when argmax(pred) == argmax(target). FD as for cross-entropy
   (the loss is quadratic, so only rounding: tolerance 3e-4). */
static void test_loss_mse(void **state) {
    fx *f = (fx *)*state;
    enum { M = 7, C = 4 };
    float pred[M * C], tgt[M * C], dp[M * C], st[2];
    const float scale = 0.25f;
    double want_loss = 0, l;
    int i, j, want_correct = 0;
    tu_rng r = tu_rng_make(22);
    tu_fill(&r, pred, M * C, -2.0f, 2.0f);
    tu_fill(&r, tgt, M * C, -2.0f, 2.0f);
    for (i = 0; i < M; ++i) {
        int ap = argmax(pred + i * C, C), at = argmax(tgt + i * C, C);
        if (i % 3 == 0 && ap != at) { /* make some rows agree */
            float tmp = tgt[i * C + ap];
            tgt[i * C + ap] = tgt[i * C + at];
            tgt[i * C + at] = tmp;
            at = ap;
        }
        want_correct += ap == at;
        want_loss += mse_ref(pred + i * C, tgt + i * C, C);
    }
    assert_true(want_correct >= 3 && want_correct < M);
    l = dev_loss(f, DSGD_LOSS_MSE, M, C, pred, tgt, C, scale, dp, st);
    TU_NEAR(l, want_loss, 1e-5 * want_loss);
    TU_NEAR(st[1], want_correct, 0);
    for (i = 0; i < M * C; ++i)
        TU_NEAR(dp[i], scale * 2.0 / C * ((double)pred[i] - tgt[i]), 1e-6);
    for (i = 0; i < M; ++i) {
        float row[C];
        for (j = 0; j < C; ++j) {
            const float h = 1e-2f;
            double lp, lm, fd;
            float pj;
            memcpy(row, pred + i * C, sizeof row);
            pj = row[j];
            row[j] = pj + h;
            lp = dev_loss(f, DSGD_LOSS_MSE, 1, C, row, tgt + i * C, C, 1.0f, NULL, NULL);
            row[j] = pj - h;
            lm = dev_loss(f, DSGD_LOSS_MSE, 1, C, row, tgt + i * C, C, 1.0f, NULL, NULL);
            fd = scale * (lp - lm) / ((double)(pj + h) - (double)(pj - h));
            if (!(fabs(dp[i * C + j] - fd) <= 3e-4))
                fail_msg("mse dpred[%d][%d] = %.7g, finite difference %.7g", i, j,
                         dp[i * C + j], fd);
        }
    }
}

/* A class index outside [0, c) is DSGD_ERR_INVALID_ARGUMENT, with a message. */
static void test_loss_bad_class(void **state) {
    fx *f = (fx *)*state;
    float pred[6] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f};
    const float bad[3] = {3.0f, -1.0f, 1000.0f};
    int i;
    for (i = 0; i < 3; ++i) {
        float tgt[2];
        dsgd_buffer *bp = mkbuf(f, 6, pred), *bt, *bd = mkbuf(f, 6, NULL), *bs = mkbuf(f, 2, NULL);
        tgt[0] = 1.0f;
        tgt[1] = bad[i];
        bt = mkbuf(f, 2, tgt);
        TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(bs, 0), 0.0f, 2));
        dsgd_ctx_clear_error(f->ctx);
        TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT,
               f->be.loss(f->be.impl, DSGD_LOSS_SOFTMAX_XENT, 2, 3, mkref(bp, 0), mkref(bt, 0),
                          1.0f, mkref(bd, 0), mkref(bs, 0)));
        assert_int_equal(dsgd_ctx_last_result(f->ctx), DSGD_ERR_INVALID_ARGUMENT);
        freebuf(f, bp);
        freebuf(f, bt);
        freebuf(f, bd);
        freebuf(f, bs);
    }
    dsgd_ctx_clear_error(f->ctx);
    assert_string_equal(dsgd_ctx_last_error(f->ctx), "");
    assert_int_equal(dsgd_ctx_last_result(f->ctx), DSGD_OK);
}

/* ---------------------------------------------------------------- optimizer */

/* The reference rules, in double, on one element. g is the raw gradient.
   SGD (PyTorch torch.optim.SGD, dampening 0):
       g' = s*g + wd*p;  p -= lr*g'
   Momentum (PyTorch):  v = mu*v + g';  p -= lr*v   (Nesterov: p -= lr*(g' + mu*v))
   Adam (Kingma & Ba 2015, L2 weight decay as in PyTorch Adam):
       g' = s*g + wd*p;  m = b1*m + (1-b1)*g';  v = b2*v + (1-b2)*g'^2
       p -= lr * (m/bc1) / (sqrt(v/bc2) + eps)
   AdamW (Loshchilov & Hutter 2019, decoupled):
       g' = s*g;  m, v as Adam;  p -= lr * (wd*p + (m/bc1) / (sqrt(v/bc2) + eps)) */
static void ref_update(const dsgd_opt_update *u, double *p, double g, double *m1, double *m2) {
    double gs = (double)u->grad_scale * g;
    switch (u->kind) {
    case DSGD_OPT_SGD:
        *p -= u->lr * (gs + u->weight_decay * *p);
        break;
    case DSGD_OPT_MOMENTUM: {
        double gg = gs + u->weight_decay * *p;
        *m1 = u->momentum * *m1 + gg;
        if (u->nesterov)
            *p -= u->lr * (gg + u->momentum * *m1);
        else
            *p -= u->lr * *m1;
        break;
    }
    case DSGD_OPT_ADAM:
    case DSGD_OPT_ADAMW: {
        double gg = gs + (u->kind == DSGD_OPT_ADAM ? u->weight_decay * *p : 0.0);
        double mh, vh, step;
        *m1 = u->beta1 * *m1 + (1.0 - u->beta1) * gg;
        *m2 = u->beta2 * *m2 + (1.0 - u->beta2) * gg * gg;
        mh = *m1 / u->bias_correction1;
        vh = *m2 / u->bias_correction2;
        step = mh / (sqrt(vh) + u->eps);
        if (u->kind == DSGD_OPT_ADAMW) step += u->weight_decay * *p;
        *p -= u->lr * step;
        break;
    }
    }
}

static void check_update(fx *f, const dsgd_opt_update *u, const char *label) {
    enum { N = 29, OFF = 3 };
    float p[OFF + N + 2], g[N], m1[N + 1], m2[N + 1], out[OFF + N + 2], o1[N + 1], o2[N + 1];
    double rp[N], r1[N], r2[N];
    int i, t, needs1 = u->kind != DSGD_OPT_SGD, needs2 = u->kind >= DSGD_OPT_ADAM;
    tu_rng r = tu_rng_make(31 + (uint64_t)u->kind * 7 + (uint64_t)u->nesterov);
    dsgd_buffer *bp, *bg, *b1, *b2;
    tu_fill(&r, p, OFF + N + 2, -1.0f, 1.0f);
    tu_fill(&r, m1, N + 1, -0.2f, 0.2f);
    tu_fill(&r, m2, N + 1, 0.0f, 0.05f); /* a second moment is non-negative */
    for (i = 0; i < N; ++i) {
        rp[i] = p[OFF + i];
        r1[i] = m1[1 + i];
        r2[i] = m2[1 + i];
    }
    bp = mkbuf(f, OFF + N + 2, p);
    bg = mkbuf(f, N, NULL);
    b1 = mkbuf(f, N + 1, m1);
    b2 = mkbuf(f, N + 1, m2);
    /* three steps with fresh gradients; state carried by the device */
    for (t = 0; t < 3; ++t) {
        tu_fill(&r, g, N, -1.0f, 1.0f);
        TU_OK(f->ctx, f->be.write(f->be.impl, mkref(bg, 0), g, N));
        TU_OK(f->ctx, f->be.optimizer_update(f->be.impl, u, mkref(bp, OFF), mkref(bg, 0),
                                             needs1 ? mkref(b1, 1) : nullref(),
                                             needs2 ? mkref(b2, 1) : nullref(), N));
        for (i = 0; i < N; ++i) ref_update(u, &rp[i], g[i], &r1[i], &r2[i]);
    }
    rd(f, bp, 0, out, OFF + N + 2);
    rd(f, b1, 0, o1, N + 1);
    rd(f, b2, 0, o2, N + 1);
    for (i = 0; i < OFF; ++i) assert_true(out[i] == p[i]);
    assert_true(out[OFF + N] == p[OFF + N] && out[OFF + N + 1] == p[OFF + N + 1]);
    /* Tolerance: float arithmetic over three steps on O(1) values. */
    for (i = 0; i < N; ++i) {
        if (!(fabs(out[OFF + i] - rp[i]) <= 2e-6 + 2e-6 * fabs(rp[i])))
            fail_msg("%s: param[%d] = %.9g, want %.9g", label, i, out[OFF + i], rp[i]);
        if (needs1 && !(fabs(o1[1 + i] - r1[i]) <= 2e-6 + 2e-6 * fabs(r1[i])))
            fail_msg("%s: m1[%d] = %.9g, want %.9g", label, i, o1[1 + i], r1[i]);
        if (needs2 && !(fabs(o2[1 + i] - r2[i]) <= 1e-7 + 2e-6 * fabs(r2[i])))
            fail_msg("%s: m2[%d] = %.9g, want %.9g", label, i, o2[1 + i], r2[i]);
    }
    if (needs1) assert_true(o1[0] == m1[0]);
    if (needs2) assert_true(o2[0] == m2[0]);
    /* the gradient is an input only */
    rd(f, bg, 0, out, N);
    assert_memory_equal(out, g, sizeof g);
    freebuf(f, bp);
    freebuf(f, bg);
    freebuf(f, b1);
    freebuf(f, b2);
}

static void test_optimizer_update(void **state) {
    fx *f = (fx *)*state;
    dsgd_opt_update u;

    memset(&u, 0, sizeof u);
    u.kind = DSGD_OPT_SGD;
    u.lr = 0.1f;
    u.grad_scale = 1.0f;
    check_update(f, &u, "sgd");
    u.weight_decay = 0.05f;
    u.grad_scale = 0.5f;
    check_update(f, &u, "sgd wd scale");

    memset(&u, 0, sizeof u);
    u.kind = DSGD_OPT_MOMENTUM;
    u.lr = 0.05f;
    u.momentum = 0.9f;
    u.weight_decay = 0.01f;
    u.grad_scale = 0.75f;
    check_update(f, &u, "momentum");
    u.nesterov = 1;
    check_update(f, &u, "nesterov");

    /* eps = 1e-3 is large enough that putting it inside the square root, or
       applying it before the bias correction, would be caught. */
    memset(&u, 0, sizeof u);
    u.kind = DSGD_OPT_ADAM;
    u.lr = 0.01f;
    u.beta1 = 0.8f;
    u.beta2 = 0.95f;
    u.eps = 1e-3f;
    u.weight_decay = 0.1f;
    u.bias_correction1 = 1.0f - 0.8f * 0.8f;     /* as at t = 2 */
    u.bias_correction2 = 1.0f - 0.95f * 0.95f;
    u.grad_scale = 0.6f;
    check_update(f, &u, "adam");
    u.kind = DSGD_OPT_ADAMW;
    check_update(f, &u, "adamw");
    u.weight_decay = 0.0f;
    u.grad_scale = 1.0f;
    u.bias_correction1 = 0.1f; /* t = 1 with the default betas */
    u.bias_correction2 = 0.001f;
    u.beta1 = 0.9f;
    u.beta2 = 0.999f;
    u.eps = 1e-8f;
    check_update(f, &u, "adamw defaults");
}

/* norm_check: sum of squares of the finite entries (double) and the number of
   NaN/Inf entries, at an offset. */
static void test_norm_check(void **state) {
    fx *f = (fx *)*state;
    enum { N = 1001, OFF = 6 };
    float *x = tu_floats(OFF + N);
    double s = 0, sumsq = -1;
    size_t nonfinite = 99, i;
    tu_rng r = tu_rng_make(41);
    dsgd_buffer *b;
    tu_fill(&r, x, OFF + N, -3.0f, 3.0f);
    x[0] = NAN; /* before the range: not counted */
    x[OFF + 10] = NAN;
    x[OFF + 500] = INFINITY;
    x[OFF + N - 1] = -INFINITY;
    for (i = 0; i < N; ++i)
        if (isfinite(x[OFF + i])) s += (double)x[OFF + i] * x[OFF + i];
    b = mkbuf(f, OFF + N, x);
    TU_OK(f->ctx, f->be.norm_check(f->be.impl, mkref(b, OFF), N, &sumsq, &nonfinite));
    /* summed in double (squares may be rounded to float: 6e-8 relative) */
    TU_NEAR(sumsq, s, 2e-7 * s);
    assert_int_equal(nonfinite, 3);
    /* all finite, small range */
    TU_OK(f->ctx, f->be.norm_check(f->be.impl, mkref(b, OFF + 1), 3, &sumsq, &nonfinite));
    TU_NEAR(sumsq,
            (double)x[OFF + 1] * x[OFF + 1] + (double)x[OFF + 2] * x[OFF + 2] +
                (double)x[OFF + 3] * x[OFF + 3],
            1e-6 * sumsq);
    assert_int_equal(nonfinite, 0);
    TU_OK(f->ctx, f->be.norm_check(f->be.impl, mkref(b, OFF), 0, &sumsq, &nonfinite));
    TU_NEAR(sumsq, 0, 0);
    assert_int_equal(nonfinite, 0);
    /* finiteness only (sumsq NULL: the fast path), with and without bad values */
    nonfinite = 99;
    TU_OK(f->ctx, f->be.norm_check(f->be.impl, mkref(b, OFF), N, NULL, &nonfinite));
    assert_int_equal(nonfinite, 3);
    nonfinite = 99;
    TU_OK(f->ctx, f->be.norm_check(f->be.impl, mkref(b, OFF + 11), 400, NULL, &nonfinite));
    assert_int_equal(nonfinite, 0);
    nonfinite = 99;
    TU_OK(f->ctx, f->be.norm_check(f->be.impl, mkref(b, OFF + N - 1), 1, NULL, &nonfinite));
    assert_int_equal(nonfinite, 1);
    freebuf(f, b);
    free(x);
}

/* Out-of-range requests are refused with a message, and nothing outside
   the buffers is touched (the ASan build checks the latter). */
static void test_bounds_checked(void **state) {
    fx *f = (fx *)*state;
    float src[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dst[8];
    dsgd_buffer *a = mkbuf(f, 8, src), *b = mkbuf(f, 4, NULL), *c = mkbuf(f, 8, NULL);
    int i;
#define EXPECT_REFUSED(expr)                                                              \
    do {                                                                                  \
        dsgd_result r_;                                                                   \
        dsgd_ctx_clear_error(f->ctx);                                                     \
        r_ = (expr);                                                                      \
        if (r_ == DSGD_OK) fail_msg("%s succeeded", #expr);                               \
        if (dsgd_ctx_last_error(f->ctx)[0] == '\0') fail_msg("%s: no message", #expr);   \
    } while (0)
    EXPECT_REFUSED(f->be.write(f->be.impl, mkref(a, 4), src, 5));
    EXPECT_REFUSED(f->be.read(f->be.impl, mkref(a, 9), dst, 1));
    EXPECT_REFUSED(f->be.copy(f->be.impl, mkref(b, 0), mkref(a, 0), 5));
    EXPECT_REFUSED(f->be.fill(f->be.impl, mkref(b, 1), 0.0f, 4));
    EXPECT_REFUSED(f->be.axpy(f->be.impl, mkref(b, 0), 1.0f, mkref(a, 6), 4));
    /* C(2,4) = A(2,4) B(4,4) needs 16 floats of B; b has 4. C must be left
       as it was (not zeroed for beta = 0 before the check). */
    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(c, 0), 5.0f, 8));
    EXPECT_REFUSED(f->be.gemm(f->be.impl, 0, 0, 2, 4, 4, 1.0f, mkref(a, 0), 4, mkref(b, 0), 4, 0.0f,
                              mkref(c, 0), 4));
    EXPECT_REFUSED(f->be.gemm(f->be.impl, 1, 1, 2, 4, 4, 1.0f, mkref(a, 2), 2, mkref(a, 0), 4, 0.0f,
                              mkref(c, 0), 4));
    /* lda smaller than the row length */
    EXPECT_REFUSED(f->be.gemm(f->be.impl, 0, 0, 1, 1, 4, 1.0f, mkref(a, 0), 3, mkref(a, 0), 1, 0.0f,
                              mkref(c, 0), 1));
    rd(f, c, 0, dst, 8);
    for (i = 0; i < 8; ++i)
        if (dst[i] != 5.0f) fail_msg("refused gemm changed C[%d] to %g", i, dst[i]);
    EXPECT_REFUSED(f->be.bias_act_forward(f->be.impl, DSGD_ACT_RELU, mkref(b, 0), nullref(), 2, 3));
    {
        /* Adam without its second-moment buffer */
        dsgd_opt_update u;
        memset(&u, 0, sizeof u);
        u.kind = DSGD_OPT_ADAM;
        u.lr = 0.1f;
        u.beta1 = 0.9f;
        u.beta2 = 0.999f;
        u.eps = 1e-8f;
        u.bias_correction1 = u.bias_correction2 = 1.0f;
        u.grad_scale = 1.0f;
        EXPECT_REFUSED(f->be.optimizer_update(f->be.impl, &u, mkref(b, 0), mkref(a, 0),
                                              mkref(a, 4), nullref(), 4));
    }
#undef EXPECT_REFUSED
    /* the data is intact */
    rd(f, a, 0, dst, 8);
    assert_memory_equal(dst, src, sizeof src);
    freebuf(f, a);
    freebuf(f, b);
    freebuf(f, c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_backend_basics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_buffer_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gemm_all_transposes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gemm_beta_zero_ignores_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gemm_k_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bias_act_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_act_backward_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bias_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_softmax_xent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_mse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_bad_class, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optimizer_update, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bounds_checked, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
