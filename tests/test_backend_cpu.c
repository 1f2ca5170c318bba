/* test_backend_cpu.c - the CPU reference backend through its vtable.

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
   - im2col, col2im, maxpool_forward and maxpool_backward bit for bit against
     naive loops written from their definitions, over a grid of shapes (odd
     sizes, c 1 and 3, strides 1-3, pads 0-2, kernels 1x1 to 5x2 and the
     whole padded input, batch 1 and 2) at offsets with the neighbours
     untouched; col2im's adjoint identity <im2col x, g> = <x, col2im g>
     (in double, 1e-6 of the sum of |terms|); max-pool's tie, NaN and
     signed-zero rules on a hand-made image and maxpool_backward against
     central differences (1e-5); a whole conv layer (im2col, gemm, bias,
     relu; col^T dy, bias_backward, col2im(dy W^T)) against central
     differences of a double direct convolution (1e-4); 1 and 4 threads
     and the portable kernels give the same bits; every bad window and
     range is DSGD_ERR_INVALID_ARGUMENT and writes nothing.
   make test (the quick tier) runs each gemm size in two of the four
   transposes; make test-full in all four.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

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
            /* the quick tier: each size in two transposes, in turns (tight in one,
               padded with alpha and beta in the other, below); make test-full
               runs all four, both ways */
            const int quick_tight = (int)(s % 4), quick_padded = (int)((s + 2) % 4);
            if (!tu_full() && t != quick_tight && t != quick_padded) {
                seed += 2;
                continue;
            }
            memset(&g, 0, sizeof g);
            g.ta = t & 1;
            g.tb = (t >> 1) & 1;
            g.m = gemm_sizes[s][0];
            g.n = gemm_sizes[s][1];
            g.k = gemm_sizes[s][2];
            /* plain alpha=1, beta=0 with tight leading dimensions */
            g.alpha = 1.0f;
            g.beta = 0.0f;
            if (tu_full() || t == quick_tight) run_gemm(f, &g, seed);
            ++seed;
            /* non-trivial alpha/beta with padded leading dimensions */
            g.alpha = -0.75f;
            g.beta = 1.25f;
            g.pad_a = 3;
            g.pad_b = 5;
            g.pad_c = 2;
            if (tu_full() || t == quick_padded) run_gemm(f, &g, seed);
            ++seed;
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

/* bias_backward: db(n) = column sums of dy(m,n), overwriting db, in the
   documented blocked order (checked bit for bit). It is the exact gradient of sum_ij dy_ij (y_ij + b_j) with respect to b; a linear map,
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

    /* The documented order, bit for bit: blocks of 128 rows, each block's
       column sum from 0.0f in row order, the block sums from 0.0f in block
       order (M2 rows: four whole blocks and a short one). */
    {
        enum { M2 = 555, N2 = 19 };
        float *big = (float *)malloc(sizeof(float) * M2 * N2), want[N2], got[N2];
        dsgd_buffer *bbig, *bdb2;
        int lo;
        assert_non_null(big);
        tu_fill(&r, big, M2 * N2, -1.0f, 1.0f);
        for (j = 0; j < N2; ++j) {
            float s = 0.0f;
            for (lo = 0; lo < M2; lo += 128) {
                float part = 0.0f;
                for (i = lo; i < M2 && i < lo + 128; ++i) part = part + big[i * N2 + j];
                s = s + part;
            }
            want[j] = s;
        }
        bbig = mkbuf(f, M2 * N2, big);
        bdb2 = mkbuf(f, N2, NULL);
        TU_OK(f->ctx, f->be.bias_backward(f->be.impl, mkref(bdb2, 0), mkref(bbig, 0), M2, N2));
        rd(f, bdb2, 0, got, N2);
        assert_memory_equal(got, want, sizeof want);
        freebuf(f, bbig);
        freebuf(f, bdb2);
        free(big);
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

/* ---------------------------------------------------------------- images */
/* im2col, col2im and max-pool (IMAGES in backend.h) against naive loops
   written from the documented definitions, over a grid of shapes. The
   operations only copy, compare and add in the documented order, so every
   comparison but the adjoint identity and the finite differences is bit
   for bit. */

typedef struct img_shape {
    dsgd_window wd;
    int oh, ow;
    size_t nx, ncol, ny; /* n h w c, (n oh ow)(kh kw c), n oh ow c */
} img_shape;

/* Fills s from wd; 0 when the window does not fit the padded input. */
static int img_shape_make(img_shape *s, dsgd_window wd) {
    memset(s, 0, sizeof *s);
    s->wd = wd;
    if (wd.kh > wd.h + 2 * wd.pad || wd.kw > wd.w + 2 * wd.pad) return 0;
    s->oh = (wd.h + 2 * wd.pad - wd.kh) / wd.stride + 1;
    s->ow = (wd.w + 2 * wd.pad - wd.kw) / wd.stride + 1;
    s->nx = (size_t)wd.n * wd.h * wd.w * wd.c;
    s->ncol = (size_t)wd.n * s->oh * s->ow * wd.kh * wd.kw * wd.c;
    s->ny = (size_t)wd.n * s->oh * s->ow * wd.c;
    return 1;
}

static dsgd_window mkwin(int n, int h, int w, int c, int kh, int kw, int stride, int pad) {
    dsgd_window wd;
    wd.n = n;
    wd.h = h;
    wd.w = w;
    wd.c = c;
    wd.kh = kh;
    wd.kw = kw;
    wd.stride = stride;
    wd.pad = pad;
    return wd;
}

static size_t xi(const dsgd_window *wd, int i, int y, int x, int ch) {
    return (((size_t)i * wd->h + y) * wd->w + x) * wd->c + ch;
}

/* im2col from its definition: one element at a time. */
static void ref_im2col(const img_shape *s, const float *x, float *col) {
    const dsgd_window *wd = &s->wd;
    int i, oy, ox, ky, kx, ch;
    size_t e = 0;
    for (i = 0; i < wd->n; ++i)
        for (oy = 0; oy < s->oh; ++oy)
            for (ox = 0; ox < s->ow; ++ox)
                for (ky = 0; ky < wd->kh; ++ky)
                    for (kx = 0; kx < wd->kw; ++kx)
                        for (ch = 0; ch < wd->c; ++ch, ++e) {
                            int iy = oy * wd->stride - wd->pad + ky, ix = ox * wd->stride - wd->pad + kx;
                            col[e] = iy >= 0 && iy < wd->h && ix >= 0 && ix < wd->w ? x[xi(wd, i, iy, ix, ch)] : 0.0f;
                        }
}

/* col2im from its definition: every dx element sums, from 0.0f and (ky, kx)
   ascending, the col entries of the (oy, ox) that read it (searched by
   brute force over every output position). */
static void ref_col2im(const img_shape *s, const float *col, float *dx) {
    const dsgd_window *wd = &s->wd;
    const size_t k = (size_t)wd->kh * wd->kw * wd->c;
    int i, iy, ix, ch, ky, kx, oy, ox;
    for (i = 0; i < wd->n; ++i)
        for (iy = 0; iy < wd->h; ++iy)
            for (ix = 0; ix < wd->w; ++ix)
                for (ch = 0; ch < wd->c; ++ch) {
                    float acc = 0.0f;
                    for (ky = 0; ky < wd->kh; ++ky)
                        for (kx = 0; kx < wd->kw; ++kx)
                            for (oy = 0; oy < s->oh; ++oy)
                                for (ox = 0; ox < s->ow; ++ox)
                                    if (oy * wd->stride - wd->pad + ky == iy && ox * wd->stride - wd->pad + kx == ix)
                                        acc += col[(((size_t)i * s->oh + oy) * s->ow + ox) * k +
                                                   ((size_t)ky * wd->kw + kx) * wd->c + ch];
                    dx[xi(wd, i, iy, ix, ch)] = acc;
                }
}

/* The index in x of the element of window (i, oy, ox) at (ky, kx), channel ch. */
static size_t win_at(const dsgd_window *wd, int i, int oy, int ox, int ky, int kx, int ch) {
    return xi(wd, i, oy * wd->stride + ky, ox * wd->stride + kx, ch);
}

/* max-pool forward: the first maximum, a NaN as soon as one appears. */
static void ref_pool_fwd(const img_shape *s, const float *x, float *y) {
    const dsgd_window *wd = &s->wd;
    int i, oy, ox, ch, ky, kx;
    size_t e = 0;
    for (i = 0; i < wd->n; ++i)
        for (oy = 0; oy < s->oh; ++oy)
            for (ox = 0; ox < s->ow; ++ox)
                for (ch = 0; ch < wd->c; ++ch, ++e) {
                    float m = x[win_at(wd, i, oy, ox, 0, 0, ch)];
                    for (ky = 0; ky < wd->kh; ++ky)
                        for (kx = 0; kx < wd->kw; ++kx) {
                            float v = x[win_at(wd, i, oy, ox, ky, kx, ch)];
                            if (isnan(m)) continue;
                            if (isnan(v) || v > m) m = v;
                        }
                    y[e] = m;
                }
}

/* max-pool backward: dx = 0, then each window (oy, ox) ascending adds its
   dy to its first element equal to y (the first NaN for a NaN y). */
static void ref_pool_bwd(const img_shape *s, const float *x, const float *y, const float *dy, float *dx) {
    const dsgd_window *wd = &s->wd;
    int i, oy, ox, ch, ky, kx, done;
    size_t e = 0;
    for (e = 0; e < s->nx; ++e) dx[e] = 0.0f;
    e = 0;
    for (i = 0; i < wd->n; ++i)
        for (oy = 0; oy < s->oh; ++oy)
            for (ox = 0; ox < s->ow; ++ox)
                for (ch = 0; ch < wd->c; ++ch, ++e)
                    for (ky = 0, done = 0; ky < wd->kh && !done; ++ky)
                        for (kx = 0; kx < wd->kw && !done; ++kx) {
                            size_t at = win_at(wd, i, oy, ox, ky, kx, ch);
                            if (isnan(y[e]) ? isnan(x[at]) : x[at] == y[e]) {
                                dx[at] += dy[e];
                                done = 1;
                            }
                        }
}

/* The shapes of the grid: odd sizes, c 1 and 3, strides 1 to 3, pads 0 to
   2 (pool: 0 only), kernels 1x1, 2x2, 3x3, 5x2, and the window equal to the
   padded input. Calls fn for each that fits; returns how many did. */
typedef void (*img_case_fn)(void *ud, const img_shape *s);
static int img_grid(int pool, img_case_fn fn, void *ud) {
    static const int hw[][2] = {{1, 1}, {4, 4}, {5, 7}, {9, 6}};
    static const int ks[][2] = {{1, 1}, {2, 2}, {3, 3}, {5, 2}, {0, 0}}; /* 0: the padded input's size */
    int a, b, c, st, p, n, cases = 0;
    for (a = 0; a < 4; ++a)
        for (b = 0; b < 5; ++b)
            for (c = 1; c <= 3; c += 2)
                for (st = 1; st <= 3; ++st)
                    for (p = 0; p <= (pool ? 0 : 2); ++p)
                        for (n = 1; n <= 2; ++n) {
                            img_shape s;
                            int kh = ks[b][0] ? ks[b][0] : hw[a][0] + 2 * p, kw = ks[b][1] ? ks[b][1] : hw[a][1] + 2 * p;
                            if (!img_shape_make(&s, mkwin(n, hw[a][0], hw[a][1], c, kh, kw, st, p))) continue;
                            fn(ud, &s);
                            ++cases;
                        }
    return cases;
}

#define IMG_OFF 5   /* every range starts this far into its buffer */
#define IMG_GUARD 7 /* and is followed by this many sentinels */
static const float img_sentinel = -12345.0f;

/* A buffer of IMG_OFF + n + IMG_GUARD floats: sentinels around v (or
   around sentinels when v is NULL). */
static dsgd_buffer *img_buf(fx *f, const float *v, size_t n) {
    dsgd_buffer *b = mkbuf(f, IMG_OFF + n + IMG_GUARD, NULL);
    TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(b, 0), img_sentinel, IMG_OFF + n + IMG_GUARD));
    if (v) TU_OK(f->ctx, f->be.write(f->be.impl, mkref(b, IMG_OFF), v, n));
    return b;
}

/* Reads the n floats of an img_buf and checks its sentinels. */
static void img_read(fx *f, dsgd_buffer *b, float *dst, size_t n, const char *what) {
    float *all = tu_floats(IMG_OFF + n + IMG_GUARD);
    size_t i;
    rd(f, b, 0, all, IMG_OFF + n + IMG_GUARD);
    for (i = 0; i < IMG_OFF + n + IMG_GUARD; ++i)
        if ((i < IMG_OFF || i >= IMG_OFF + n) && all[i] != img_sentinel)
            fail_msg("%s: float %zu outside the range was written (%g)", what, i, (double)all[i]);
    memcpy(dst, all + IMG_OFF, n * sizeof(float));
    free(all);
}

static void expect_bits(const float *got, const float *want, size_t n, const img_shape *s, const char *what) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
            fail_msg("%s n=%d h=%d w=%d c=%d k=%dx%d stride=%d pad=%d: [%zu] = %.9g, want %.9g", what, s->wd.n,
                     s->wd.h, s->wd.w, s->wd.c, s->wd.kh, s->wd.kw, s->wd.stride, s->wd.pad, i, (double)got[i],
                     (double)want[i]);
}

typedef struct img_ud {
    fx *f;
    tu_rng rng;
} img_ud;

static void im2col_case(void *arg, const img_shape *s) {
    img_ud *u = (img_ud *)arg;
    fx *f = u->f;
    float *x = tu_floats(s->nx), *g = tu_floats(s->ncol), *col = tu_floats(s->ncol), *want = tu_floats(s->ncol),
          *dx = tu_floats(s->nx), *wdx = tu_floats(s->nx);
    dsgd_buffer *bx, *bcol, *bg, *bdx;
    double lhs = 0.0, rhs = 0.0, mag = 0.0;
    size_t i;
    tu_fill(&u->rng, x, s->nx, -1.0f, 1.0f);
    tu_fill(&u->rng, g, s->ncol, -1.0f, 1.0f);
    bx = img_buf(f, x, s->nx);
    bcol = img_buf(f, NULL, s->ncol);
    bg = img_buf(f, g, s->ncol);
    bdx = img_buf(f, NULL, s->nx);
    TU_OK(f->ctx, f->be.im2col(f->be.impl, &s->wd, mkref(bx, IMG_OFF), mkref(bcol, IMG_OFF)));
    img_read(f, bcol, col, s->ncol, "im2col");
    ref_im2col(s, x, want);
    expect_bits(col, want, s->ncol, s, "im2col");
    TU_OK(f->ctx, f->be.col2im(f->be.impl, &s->wd, mkref(bg, IMG_OFF), mkref(bdx, IMG_OFF)));
    img_read(f, bdx, dx, s->nx, "col2im");
    ref_col2im(s, g, wdx);
    expect_bits(dx, wdx, s->nx, s, "col2im");
    /* the adjoint: <im2col(x), g> = <x, col2im(g)> */
    for (i = 0; i < s->ncol; ++i) {
        lhs += (double)col[i] * g[i];
        mag += fabs((double)col[i] * g[i]);
    }
    for (i = 0; i < s->nx; ++i) rhs += (double)x[i] * dx[i];
    if (!(fabs(lhs - rhs) <= 1e-6 * mag + 1e-12))
        fail_msg("adjoint h=%d w=%d c=%d k=%dx%d s=%d p=%d: <im2col x, g> = %.12g, <x, col2im g> = %.12g",
                 s->wd.h, s->wd.w, s->wd.c, s->wd.kh, s->wd.kw, s->wd.stride, s->wd.pad, lhs, rhs);
    freebuf(f, bx);
    freebuf(f, bcol);
    freebuf(f, bg);
    freebuf(f, bdx);
    free(x);
    free(g);
    free(col);
    free(want);
    free(dx);
    free(wdx);
}

static void test_im2col_col2im_grid(void **state) {
    img_ud u;
    int cases;
    u.f = (fx *)*state;
    u.rng = tu_rng_make(1401);
    cases = img_grid(0, im2col_case, &u);
    assert_true(cases > 400);
}

/* x with distinct values (no ties): a shuffled ramp of step 1/64. */
static void distinct_fill(tu_rng *rng, float *x, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) x[i] = (float)((double)i / 64.0 - (double)n / 128.0);
    for (i = n; i > 1; --i) {
        size_t j = tu_below(rng, i);
        float t = x[i - 1];
        x[i - 1] = x[j];
        x[j] = t;
    }
}

/* Values with many ties (from {-1, -0, 0, 1, 2}) and, with nan set, a NaN
   on about one element in 11. */
static void tie_fill(tu_rng *rng, float *x, size_t n, int nan) {
    static const float vals[5] = {-1.0f, -0.0f, 0.0f, 1.0f, 2.0f};
    size_t i;
    for (i = 0; i < n; ++i) x[i] = nan && tu_below(rng, 11) == 0 ? NAN : vals[tu_below(rng, 5)];
}

static void pool_case(void *arg, const img_shape *s) {
    img_ud *u = (img_ud *)arg;
    fx *f = u->f;
    float *x = tu_floats(s->nx), *y = tu_floats(s->ny), *wy = tu_floats(s->ny), *dy = tu_floats(s->ny),
          *dx = tu_floats(s->nx), *wdx = tu_floats(s->nx);
    int kind;
    for (kind = 0; kind < 3; ++kind) { /* distinct values, ties, ties and NaN */
        dsgd_buffer *bx, *by, *bdy, *bdx;
        if (kind == 0)
            distinct_fill(&u->rng, x, s->nx);
        else
            tie_fill(&u->rng, x, s->nx, kind == 2);
        tu_fill(&u->rng, dy, s->ny, -1.0f, 1.0f);
        bx = img_buf(f, x, s->nx);
        by = img_buf(f, NULL, s->ny);
        bdy = img_buf(f, dy, s->ny);
        bdx = img_buf(f, NULL, s->nx);
        TU_OK(f->ctx, f->be.maxpool_forward(f->be.impl, &s->wd, mkref(bx, IMG_OFF), mkref(by, IMG_OFF)));
        img_read(f, by, y, s->ny, "maxpool_forward");
        ref_pool_fwd(s, x, wy);
        expect_bits(y, wy, s->ny, s, "maxpool_forward");
        TU_OK(f->ctx, f->be.maxpool_backward(f->be.impl, &s->wd, mkref(bx, IMG_OFF), mkref(by, IMG_OFF),
                                             mkref(bdy, IMG_OFF), mkref(bdx, IMG_OFF)));
        img_read(f, bdx, dx, s->nx, "maxpool_backward");
        ref_pool_bwd(s, x, y, dy, wdx);
        expect_bits(dx, wdx, s->nx, s, "maxpool_backward");
        freebuf(f, bx);
        freebuf(f, by);
        freebuf(f, bdy);
        freebuf(f, bdx);
    }
    free(x);
    free(y);
    free(wy);
    free(dy);
    free(dx);
    free(wdx);
}

static void test_maxpool_grid(void **state) {
    img_ud u;
    int cases;
    u.f = (fx *)*state;
    u.rng = tu_rng_make(1402);
    cases = img_grid(1, pool_case, &u);
    assert_true(cases > 150);
}

/* The rules spelled out on one small image: ties go to the first maximum,
   a NaN to the first NaN, overlapping windows add in (oy, ox) order. */
static void test_maxpool_ties_nan(void **state) {
    fx *f = (fx *)*state;
    /* 1 x 3 x 3 x 1, 2x2 windows at stride 1: four overlapping windows */
    const float x[9] = {1, 3, 3,  /* */
                        3, 2, 0,  /* */
                        NAN, 1, NAN};
    const float dy[4] = {0.5f, 0.25f, 2.0f, 4.0f};
    float y[4], dx[9];
    dsgd_window wd = mkwin(1, 3, 3, 1, 2, 2, 1, 0);
    dsgd_buffer *bx = mkbuf(f, 9, x), *by = mkbuf(f, 4, NULL), *bdy = mkbuf(f, 4, dy), *bdx = mkbuf(f, 9, NULL);
    TU_OK(f->ctx, f->be.maxpool_forward(f->be.impl, &wd, mkref(bx, 0), mkref(by, 0)));
    rd(f, by, 0, y, 4);
    /* windows: (0,0) {1,3,3,2} -> 3; (0,1) {3,3,2,0} -> 3; (1,0) {3,2,NaN,1} -> NaN; (1,1) {2,0,1,NaN} -> NaN */
    assert_true(y[0] == 3.0f && y[1] == 3.0f && isnan(y[2]) && isnan(y[3]));
    TU_OK(f->ctx, f->be.maxpool_backward(f->be.impl, &wd, mkref(bx, 0), mkref(by, 0), mkref(bdy, 0), mkref(bdx, 0)));
    rd(f, bdx, 0, dx, 9);
    /* (0,0) picks x[0,1] (its first 3, not x[1,0]); (0,1) picks x[0,1] too
       (its first element): 0.5 + 0.25; (1,0) picks the NaN at x[2,0];
       (1,1) the NaN at x[2,2] */
    {
        const float want[9] = {0, 0.75f, 0, 0, 0, 0, 2.0f, 0, 4.0f};
        int i;
        for (i = 0; i < 9; ++i)
            if (dx[i] != want[i] || signbit(dx[i])) fail_msg("dx[%d] = %g, want %g", i, (double)dx[i], (double)want[i]);
    }
    /* signed zeros: -0 then +0 gives -0 (the first maximum); +0 then -0 gives +0 */
    {
        const float z[4] = {-0.0f, 0.0f, 0.0f, -0.0f}, one = 1.0f;
        float zy[2], zdx[4];
        dsgd_window wz = mkwin(1, 1, 4, 1, 1, 2, 2, 0);
        dsgd_buffer *bz = mkbuf(f, 4, z), *bzy = mkbuf(f, 2, NULL), *bone = mkbuf(f, 2, NULL), *bzdx = mkbuf(f, 4, NULL);
        TU_OK(f->ctx, f->be.fill(f->be.impl, mkref(bone, 0), one, 2));
        TU_OK(f->ctx, f->be.maxpool_forward(f->be.impl, &wz, mkref(bz, 0), mkref(bzy, 0)));
        rd(f, bzy, 0, zy, 2);
        assert_true(zy[0] == 0.0f && signbit(zy[0]) && zy[1] == 0.0f && !signbit(zy[1]));
        TU_OK(f->ctx, f->be.maxpool_backward(f->be.impl, &wz, mkref(bz, 0), mkref(bzy, 0), mkref(bone, 0),
                                             mkref(bzdx, 0)));
        rd(f, bzdx, 0, zdx, 4);
        assert_true(zdx[0] == 1.0f && zdx[1] == 0.0f && zdx[2] == 1.0f && zdx[3] == 0.0f);
        freebuf(f, bz);
        freebuf(f, bzy);
        freebuf(f, bone);
        freebuf(f, bzdx);
    }
    freebuf(f, bx);
    freebuf(f, by);
    freebuf(f, bdy);
    freebuf(f, bdx);
}

/* loss = sum(maxpool(x) * r) in double, through the backend's forward. */
static double pool_loss(fx *f, const dsgd_window *wd, dsgd_buffer *bx, dsgd_buffer *by, const float *r, size_t ny) {
    float *y = tu_floats(ny);
    double l = 0.0;
    size_t i;
    TU_OK(f->ctx, f->be.maxpool_forward(f->be.impl, wd, mkref(bx, 0), mkref(by, 0)));
    rd(f, by, 0, y, ny);
    for (i = 0; i < ny; ++i) l += (double)y[i] * r[i];
    free(y);
    return l;
}

/* maxpool_backward is the gradient of maxpool_forward: central differences
   of sum(y r) on inputs without ties (values 1/64 apart, steps of 1/512, so
   no window changes its maximum), for disjoint and overlapping windows. */
static void test_maxpool_backward_fd(void **state) {
    fx *f = (fx *)*state;
    static const int cfg[][4] = {{2, 2, 2, 0}, {3, 3, 1, 0}, {3, 2, 2, 0}, {2, 3, 3, 0}};
    tu_rng rng = tu_rng_make(1403);
    int t;
    for (t = 0; t < 4; ++t) {
        img_shape s;
        float *x, *r, *dx;
        dsgd_buffer *bx, *by, *br, *bdx;
        size_t i;
        const double h = 1.0 / 512.0;
        assert_true(img_shape_make(&s, mkwin(2, 7, 6, 3, cfg[t][0], cfg[t][1], cfg[t][2], cfg[t][3])));
        x = tu_floats(s.nx);
        r = tu_floats(s.ny);
        dx = tu_floats(s.nx);
        distinct_fill(&rng, x, s.nx);
        tu_fill(&rng, r, s.ny, -1.0f, 1.0f);
        bx = mkbuf(f, s.nx, x);
        by = mkbuf(f, s.ny, NULL);
        br = mkbuf(f, s.ny, r);
        bdx = mkbuf(f, s.nx, NULL);
        TU_OK(f->ctx, f->be.maxpool_forward(f->be.impl, &s.wd, mkref(bx, 0), mkref(by, 0)));
        TU_OK(f->ctx, f->be.maxpool_backward(f->be.impl, &s.wd, mkref(bx, 0), mkref(by, 0), mkref(br, 0), mkref(bdx, 0)));
        rd(f, bdx, 0, dx, s.nx);
        for (i = 0; i < s.nx; ++i) {
            float *p = f->be.buffer_host_ptr(f->be.impl, bx) + i, v = *p;
            double lp, lm;
            *p = (float)(v + h);
            lp = pool_loss(f, &s.wd, bx, by, r, s.ny);
            *p = (float)(v - h);
            lm = pool_loss(f, &s.wd, bx, by, r, s.ny);
            *p = v;
            TU_NEAR(dx[i], (lp - lm) / (2.0 * h), 1e-5);
        }
        freebuf(f, bx);
        freebuf(f, by);
        freebuf(f, br);
        freebuf(f, bdx);
        free(x);
        free(r);
        free(dx);
    }
}

/* A whole conv layer through the ops, y = relu(im2col(x) W + b), loss =
   sum(y r): dW = col^T dy, db = bias_backward(dy), dx = col2im(dy W^T)
   (dy = r relu'(y)) against central differences of a double-precision
   direct convolution. */
typedef struct conv_case {
    img_shape s;
    int oc;
    const double *x, *w, *b, *r; /* x (n,h,w,c), W (kh kw c, oc), b (oc), r (n oh ow, oc) */
} conv_case;

static double conv_loss(const conv_case *cc) {
    const dsgd_window *wd = &cc->s.wd;
    const int oc = cc->oc;
    double loss = 0.0;
    int i, oy, ox, o, ky, kx, ch;
    for (i = 0; i < wd->n; ++i)
        for (oy = 0; oy < cc->s.oh; ++oy)
            for (ox = 0; ox < cc->s.ow; ++ox)
                for (o = 0; o < oc; ++o) {
                    double z = cc->b[o];
                    size_t row = ((size_t)i * cc->s.oh + oy) * cc->s.ow + ox;
                    for (ky = 0; ky < wd->kh; ++ky)
                        for (kx = 0; kx < wd->kw; ++kx)
                            for (ch = 0; ch < wd->c; ++ch) {
                                int iy = oy * wd->stride - wd->pad + ky, ix = ox * wd->stride - wd->pad + kx;
                                if (iy < 0 || iy >= wd->h || ix < 0 || ix >= wd->w) continue;
                                z += cc->x[xi(wd, i, iy, ix, ch)] * cc->w[(((size_t)ky * wd->kw + kx) * wd->c + ch) * oc + o];
                            }
                    loss += (z > 0.0 ? z : 0.0) * cc->r[row * oc + o];
                }
    return loss;
}

static void test_conv_layer_fd(void **state) {
    fx *f = (fx *)*state;
    static const int cfg[][6] = {/* h, w, c, k, stride, pad */ {6, 5, 3, 3, 1, 1}, {7, 8, 2, 3, 2, 1}, {5, 5, 1, 5, 2, 2}};
    tu_rng rng = tu_rng_make(1404);
    int t;
    for (t = 0; t < 3; ++t) {
        conv_case cc;
        const int oc = 4;
        size_t M, K, i;
        float *xf, *wf, *bf, *rf, *dW, *db, *dx, *y;
        double *xd, *wdd, *bd, *rd_;
        dsgd_buffer *bx, *bcol, *bw, *bb, *by, *br, *bdW, *bdb, *bdcol, *bdx;
        const double h = 1e-6;
        assert_true(img_shape_make(&cc.s, mkwin(2, cfg[t][0], cfg[t][1], cfg[t][2], cfg[t][3], cfg[t][3], cfg[t][4], cfg[t][5])));
        cc.oc = oc;
        M = (size_t)cc.s.wd.n * cc.s.oh * cc.s.ow;
        K = (size_t)cc.s.wd.kh * cc.s.wd.kw * cc.s.wd.c;
        xf = tu_floats(cc.s.nx);
        wf = tu_floats(K * oc);
        bf = tu_floats(oc);
        rf = tu_floats(M * oc);
        dW = tu_floats(K * oc);
        db = tu_floats(oc);
        dx = tu_floats(cc.s.nx);
        y = tu_floats(M * oc);
        tu_fill(&rng, xf, cc.s.nx, -1.0f, 1.0f);
        tu_fill(&rng, wf, K * oc, -0.5f, 0.5f);
        tu_fill(&rng, bf, oc, -0.2f, 0.2f);
        tu_fill(&rng, rf, M * oc, -1.0f, 1.0f);
        xd = (double *)tu_alloc(cc.s.nx * sizeof(double));
        wdd = (double *)tu_alloc(K * oc * sizeof(double));
        bd = (double *)tu_alloc(oc * sizeof(double));
        rd_ = (double *)tu_alloc(M * oc * sizeof(double));
        for (i = 0; i < cc.s.nx; ++i) xd[i] = xf[i];
        for (i = 0; i < K * oc; ++i) wdd[i] = wf[i];
        for (i = 0; i < (size_t)oc; ++i) bd[i] = bf[i];
        for (i = 0; i < M * oc; ++i) rd_[i] = rf[i];
        cc.x = xd;
        cc.w = wdd;
        cc.b = bd;
        cc.r = rd_;
        /* forward: col = im2col(x); y = relu(col W + b) */
        bx = mkbuf(f, cc.s.nx, xf);
        bcol = mkbuf(f, M * K, NULL);
        bw = mkbuf(f, K * oc, wf);
        bb = mkbuf(f, oc, bf);
        by = mkbuf(f, M * oc, NULL);
        br = mkbuf(f, M * oc, rf);
        bdW = mkbuf(f, K * oc, NULL);
        bdb = mkbuf(f, oc, NULL);
        bdcol = mkbuf(f, M * K, NULL);
        bdx = mkbuf(f, cc.s.nx, NULL);
        TU_OK(f->ctx, f->be.im2col(f->be.impl, &cc.s.wd, mkref(bx, 0), mkref(bcol, 0)));
        TU_OK(f->ctx, f->be.gemm(f->be.impl, 0, 0, (int)M, oc, (int)K, 1.0f, mkref(bcol, 0), (int)K, mkref(bw, 0), oc,
                                 0.0f, mkref(by, 0), oc));
        TU_OK(f->ctx, f->be.bias_act_forward(f->be.impl, DSGD_ACT_RELU, mkref(by, 0), mkref(bb, 0), (int)M, oc));
        /* the forward agrees with the direct convolution */
        rd(f, by, 0, y, M * oc);
        {
            double l = 0.0;
            for (i = 0; i < M * oc; ++i) l += (double)y[i] * rf[i];
            TU_NEAR(l, conv_loss(&cc), 1e-4);
        }
        /* backward: dy = r relu'(y) (in br), dW = col^T dy, db, dcol = dy W^T, dx = col2im(dcol) */
        TU_OK(f->ctx, f->be.act_backward(f->be.impl, DSGD_ACT_RELU, mkref(br, 0), mkref(by, 0), M * oc));
        TU_OK(f->ctx, f->be.gemm(f->be.impl, 1, 0, (int)K, oc, (int)M, 1.0f, mkref(bcol, 0), (int)K, mkref(br, 0), oc,
                                 0.0f, mkref(bdW, 0), oc));
        TU_OK(f->ctx, f->be.bias_backward(f->be.impl, mkref(bdb, 0), mkref(br, 0), (int)M, oc));
        TU_OK(f->ctx, f->be.gemm(f->be.impl, 0, 1, (int)M, (int)K, oc, 1.0f, mkref(br, 0), oc, mkref(bw, 0), oc, 0.0f,
                                 mkref(bdcol, 0), (int)K));
        TU_OK(f->ctx, f->be.col2im(f->be.impl, &cc.s.wd, mkref(bdcol, 0), mkref(bdx, 0)));
        rd(f, bdW, 0, dW, K * oc);
        rd(f, bdb, 0, db, oc);
        rd(f, bdx, 0, dx, cc.s.nx);
#define CONV_FD(arr, idx, got)                                   \
    do {                                                         \
        double v_ = (arr)[idx], lp_, lm_;                        \
        (arr)[idx] = v_ + h;                                     \
        lp_ = conv_loss(&cc);                                    \
        (arr)[idx] = v_ - h;                                     \
        lm_ = conv_loss(&cc);                                    \
        (arr)[idx] = v_;                                         \
        TU_NEAR((got), (lp_ - lm_) / (2.0 * h), 1e-4);           \
    } while (0)
        for (i = 0; i < cc.s.nx; ++i) CONV_FD(xd, i, dx[i]);
        for (i = 0; i < K * oc; ++i) CONV_FD(wdd, i, dW[i]);
        for (i = 0; i < (size_t)oc; ++i) CONV_FD(bd, i, db[i]);
#undef CONV_FD
        freebuf(f, bx);
        freebuf(f, bcol);
        freebuf(f, bw);
        freebuf(f, bb);
        freebuf(f, by);
        freebuf(f, br);
        freebuf(f, bdW);
        freebuf(f, bdb);
        freebuf(f, bdcol);
        freebuf(f, bdx);
        free(xf);
        free(wf);
        free(bf);
        free(rf);
        free(dW);
        free(db);
        free(dx);
        free(y);
        free(xd);
        free(wdd);
        free(bd);
        free(rd_);
    }
}

/* The four operations at sizes the pool cuts (batch 8 of 28 x 28 x 8, an
   image of 121 x 97 x 3 alone, cut inside the image, and one channel with a
   3-wide window, im2col's own path: 28 x 28 x 1 and 121 x 97 x 1 at stride
   2, pad 2) give the same bits
   with 1 and 4 threads and with the portable kernels (DSGD_CPU_ISA=
   portable); im2col and max-pool equal the naive loops there too, and
   col2im keeps the adjoint identity. */
static void img_all_ops(dsgd_ctx *ctx, dsgd_backend_i *be, const img_shape *s, const img_shape *ps, const float *x,
                        const float *g, const float *dy, float *out) {
    dsgd_buffer *bx, *bcol, *bg, *bdx, *by, *bdy, *bpdx;
    TU_OK(ctx, be->buffer_create(be->impl, s->nx, &bx));
    TU_OK(ctx, be->buffer_create(be->impl, s->ncol, &bcol));
    TU_OK(ctx, be->buffer_create(be->impl, s->ncol, &bg));
    TU_OK(ctx, be->buffer_create(be->impl, s->nx, &bdx));
    TU_OK(ctx, be->buffer_create(be->impl, ps->ny, &by));
    TU_OK(ctx, be->buffer_create(be->impl, ps->ny, &bdy));
    TU_OK(ctx, be->buffer_create(be->impl, ps->nx, &bpdx));
    TU_OK(ctx, be->write(be->impl, mkref(bx, 0), x, s->nx));
    TU_OK(ctx, be->write(be->impl, mkref(bg, 0), g, s->ncol));
    TU_OK(ctx, be->write(be->impl, mkref(bdy, 0), dy, ps->ny));
    TU_OK(ctx, be->im2col(be->impl, &s->wd, mkref(bx, 0), mkref(bcol, 0)));
    TU_OK(ctx, be->col2im(be->impl, &s->wd, mkref(bg, 0), mkref(bdx, 0)));
    TU_OK(ctx, be->maxpool_forward(be->impl, &ps->wd, mkref(bx, 0), mkref(by, 0)));
    TU_OK(ctx, be->maxpool_backward(be->impl, &ps->wd, mkref(bx, 0), mkref(by, 0), mkref(bdy, 0), mkref(bpdx, 0)));
    TU_OK(ctx, be->read(be->impl, mkref(bcol, 0), out, s->ncol));
    TU_OK(ctx, be->read(be->impl, mkref(bdx, 0), out + s->ncol, s->nx));
    TU_OK(ctx, be->read(be->impl, mkref(by, 0), out + s->ncol + s->nx, ps->ny));
    TU_OK(ctx, be->read(be->impl, mkref(bpdx, 0), out + s->ncol + s->nx + ps->ny, ps->nx));
    be->buffer_destroy(be->impl, bx);
    be->buffer_destroy(be->impl, bcol);
    be->buffer_destroy(be->impl, bg);
    be->buffer_destroy(be->impl, bdx);
    be->buffer_destroy(be->impl, by);
    be->buffer_destroy(be->impl, bdy);
    be->buffer_destroy(be->impl, bpdx);
}

static void test_image_ops_threads(void **state) {
    fx *f = (fx *)*state;
    static const int shapes[][8] = {/* n h w c kh kw stride pad; pool kh kw stride */
                                    {8, 28, 28, 8, 3, 3, 1, 1},
                                    {1, 121, 97, 3, 5, 2, 2, 2},
                                    {8, 28, 28, 1, 3, 3, 1, 1},
                                    {1, 121, 97, 1, 4, 3, 2, 2}};
    static const int pools[][3] = {{2, 2, 2}, {3, 2, 1}, {2, 2, 2}, {3, 3, 2}};
    tu_rng rng = tu_rng_make(1405);
    int t, v;
    for (t = 0; t < (int)(sizeof shapes / sizeof shapes[0]); ++t) {
        const int *q = shapes[t];
        img_shape s, ps;
        size_t total;
        float *x, *g, *dy, *out[3];
        assert_true(img_shape_make(&s, mkwin(q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7])));
        assert_true(img_shape_make(&ps, mkwin(q[0], q[1], q[2], q[3], pools[t][0], pools[t][1], pools[t][2], 0)));
        total = s.ncol + s.nx + ps.ny + ps.nx;
        x = tu_floats(s.nx);
        g = tu_floats(s.ncol);
        dy = tu_floats(ps.ny);
        tie_fill(&rng, x, s.nx, 1);
        tu_fill(&rng, g, s.ncol, -1.0f, 1.0f);
        tu_fill(&rng, dy, ps.ny, -1.0f, 1.0f);
        for (v = 0; v < 3; ++v) { /* 1 thread; 4 threads; 2 threads, portable kernels */
            dsgd_cpu_backend_desc bd;
            dsgd_backend_i be;
            memset(&bd, 0, sizeof bd);
            bd.threads = v == 0 ? 1 : v == 1 ? 4 : 2;
            if (v == 2) setenv("DSGD_CPU_ISA", "portable", 1);
            TU_OK(f->ctx, dsgd_cpu_backend_create_desc(f->ctx, &bd, &be));
            if (v == 2) {
                unsetenv("DSGD_CPU_ISA");
                assert_string_equal(dsgd_cpu_backend_isa(&be), "portable");
            }
            out[v] = tu_floats(total);
            img_all_ops(f->ctx, &be, &s, &ps, x, g, dy, out[v]);
            be.destroy(be.impl);
        }
        {
            float *want = tu_floats(s.ncol > ps.nx ? s.ncol : ps.nx);
            double lhs = 0.0, rhs = 0.0, mag = 0.0;
            size_t i;
            ref_im2col(&s, x, want);
            expect_bits(out[1], want, s.ncol, &s, "im2col");
            ref_pool_fwd(&ps, x, want);
            expect_bits(out[1] + s.ncol + s.nx, want, ps.ny, &ps, "maxpool_forward");
            ref_pool_bwd(&ps, x, out[1] + s.ncol + s.nx, dy, want);
            expect_bits(out[1] + s.ncol + s.nx + ps.ny, want, ps.nx, &ps, "maxpool_backward");
            for (i = 0; i < s.ncol; ++i) /* x's NaNs left out on both sides */
                if (!isnan(out[1][i])) {
                    lhs += (double)out[1][i] * g[i];
                    mag += fabs((double)out[1][i] * g[i]);
                }
            for (i = 0; i < s.nx; ++i)
                if (!isnan(x[i])) rhs += (double)x[i] * out[1][s.ncol + i];
            if (!(fabs(lhs - rhs) <= 1e-6 * mag)) fail_msg("shape %d: adjoint %.12g vs %.12g", t, lhs, rhs);
            free(want);
        }
        if (memcmp(out[0], out[1], total * sizeof(float)) != 0) fail_msg("shape %d: 4 threads differ from 1", t);
        if (memcmp(out[0], out[2], total * sizeof(float)) != 0) fail_msg("shape %d: the portable kernels differ", t);
        for (v = 0; v < 3; ++v) free(out[v]);
        free(x);
        free(g);
        free(dy);
    }
}

/* Every bad window and every bad range is DSGD_ERR_INVALID_ARGUMENT with a
   message, and writes nothing. */
static void test_image_bad_args(void **state) {
    fx *f = (fx *)*state;
    dsgd_window ok = mkwin(2, 5, 4, 3, 3, 3, 1, 1), pok = mkwin(2, 5, 4, 3, 2, 2, 2, 0);
    img_shape s, ps;
    dsgd_buffer *bx, *bcol, *by, *bdx, *small;
    float *probe;
    size_t i, big;
    int which;
    assert_true(img_shape_make(&s, ok));
    assert_true(img_shape_make(&ps, pok));
    big = s.ncol + 64;
    bx = img_buf(f, NULL, s.nx);
    bcol = img_buf(f, NULL, big);
    by = img_buf(f, NULL, big);
    bdx = img_buf(f, NULL, s.nx);
    small = mkbuf(f, 4, NULL);
    /* bad windows, for every operation */
    for (which = 0; which < 4; ++which) {
        dsgd_window bad[16];
        int nb = 0, j;
        const dsgd_window base = which < 2 ? ok : pok;
#define BAD(field, value) (bad[nb] = base, bad[nb].field = (value), ++nb)
        BAD(n, 0);
        BAD(h, -1);
        BAD(w, 0);
        BAD(c, 0);
        BAD(kh, 0);
        BAD(kw, -3);
        BAD(stride, 0);
        BAD(pad, -1);
        BAD(kh, which < 2 ? 8 : 6); /* taller than the padded input (5 + 2) */
        BAD(kw, which < 2 ? 7 : 5);
        BAD(n, INT_MAX); /* sizes that overflow size_t */
        bad[nb - 1].h = INT_MAX;
        bad[nb - 1].w = INT_MAX;
        bad[nb - 1].c = INT_MAX;
        if (which < 2) { /* a padded side past INT_MAX, with tiny sizes */
            BAD(pad, 2000000000);
            bad[nb - 1].stride = 2000000000;
            bad[nb - 1].kh = bad[nb - 1].kw = 1;
        }
        if (which >= 2) BAD(pad, 1); /* max-pool takes no padding */
#undef BAD
        for (j = 0; j < nb; ++j) {
            dsgd_result r;
            dsgd_ctx_clear_error(f->ctx);
            switch (which) {
            case 0: r = f->be.im2col(f->be.impl, &bad[j], mkref(bx, IMG_OFF), mkref(bcol, IMG_OFF)); break;
            case 1: r = f->be.col2im(f->be.impl, &bad[j], mkref(bcol, IMG_OFF), mkref(bdx, IMG_OFF)); break;
            case 2: r = f->be.maxpool_forward(f->be.impl, &bad[j], mkref(bx, IMG_OFF), mkref(by, IMG_OFF)); break;
            default:
                r = f->be.maxpool_backward(f->be.impl, &bad[j], mkref(bx, IMG_OFF), mkref(by, IMG_OFF),
                                           mkref(by, IMG_OFF), mkref(bdx, IMG_OFF));
                break;
            }
            if (r != DSGD_ERR_INVALID_ARGUMENT)
                fail_msg("op %d, bad window %d: %s, want DSGD_ERR_INVALID_ARGUMENT", which, j, dsgd_result_string(r));
            if (dsgd_ctx_last_error(f->ctx)[0] == '\0') fail_msg("op %d, bad window %d: no message", which, j);
        }
    }
    /* a NULL window */
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.im2col(f->be.impl, NULL, mkref(bx, IMG_OFF), mkref(bcol, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_backward(f->be.impl, NULL, mkref(bx, 0), mkref(by, 0),
                                                                     mkref(by, 0), mkref(bdx, 0)));
    /* ranges: one float past the end, a NULL buffer, outputs overlapping inputs */
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.im2col(f->be.impl, &ok, mkref(bx, IMG_OFF + IMG_GUARD + 1), mkref(bcol, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.im2col(f->be.impl, &ok, mkref(bx, IMG_OFF), mkref(small, 0)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.im2col(f->be.impl, &ok, mkref(NULL, 0), mkref(bcol, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.im2col(f->be.impl, &ok, mkref(bcol, 0), mkref(bcol, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.col2im(f->be.impl, &ok, mkref(small, 0), mkref(bdx, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.col2im(f->be.impl, &ok, mkref(bcol, IMG_OFF), mkref(bdx, IMG_OFF + IMG_GUARD + 1)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.col2im(f->be.impl, &ok, mkref(bcol, 0), mkref(bcol, s.ncol)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_forward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(small, 1)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_forward(f->be.impl, &pok, mkref(small, 0), mkref(by, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_forward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(bx, IMG_OFF + 3)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_backward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(small, 0),
                                                                     mkref(by, IMG_OFF), mkref(bdx, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_backward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(by, IMG_OFF),
                                                                     mkref(small, 0), mkref(bdx, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_backward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(by, IMG_OFF),
                                                                     mkref(by, IMG_OFF), mkref(small, 0)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_backward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(by, IMG_OFF),
                                                                     mkref(by, IMG_OFF), mkref(by, IMG_OFF)));
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, f->be.maxpool_backward(f->be.impl, &pok, mkref(bx, IMG_OFF), mkref(by, IMG_OFF),
                                                                     mkref(by, IMG_OFF), mkref(bx, IMG_OFF + 1)));
    /* nothing was written: every buffer still holds its sentinels */
    probe = tu_floats(big);
    img_read(f, bx, probe, s.nx, "bad-argument x");
    img_read(f, bcol, probe, big, "bad-argument col");
    img_read(f, by, probe, big, "bad-argument y");
    img_read(f, bdx, probe, s.nx, "bad-argument dx");
    for (i = 0; i < s.nx; ++i)
        if (probe[i] != img_sentinel) fail_msg("dx[%zu] was written", i);
    free(probe);
    freebuf(f, bx);
    freebuf(f, bcol);
    freebuf(f, by);
    freebuf(f, bdx);
    freebuf(f, small);
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
        cmocka_unit_test_setup_teardown(test_im2col_col2im_grid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxpool_grid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxpool_ties_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_maxpool_backward_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_layer_fd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_image_ops_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_image_bad_args, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
