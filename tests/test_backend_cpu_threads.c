/* test_backend_cpu_threads.c - the CPU backend's operation threads (CPU THREADS in
   distsgd/backend.h) and the strategies' cpu_threads.

   - GEMM: every kernel this machine runs, shapes below and above the split
     threshold (cut along rows and along columns, edge tiles, one KC block
     and several, k = 0; the thin GEMM's), all four transposes, padded leading dimensions,
     beta 0 and -0.5: 2, 3 and 7 threads give the bits of 1 thread, and 1
     thread is within the rounding bound of a double-precision product;
   - conv_gemm (a GEMM whose A is im2col(x), never built): every kernel,
     the CNN's two convolutions, a strided padded window, 40 channels, 5 to
     40 outputs, both products (ta 0 and 1), beta 0 and -0.5: at 1, 2, 3 and
     7 threads (TSan: 16 and 5 outputs, 1 and 3 threads) the bits of im2col
     followed by gemm; bad calls refused;
   - conv_backward_x (col2im(dy W^T), the columns never built): every kernel
     with a thin GEMM, unit and larger strides, 1 to 40 channels, 7 to 300
     filters (two blocks of k), by tiles and by dy's planes (the direct
     path: padding 0 to 2, 2 x 3 windows, one image), dy with zeros, -0 and
     NaN: at 1, 2, 3 and 7
     threads (TSan: 1 and 3) the bits of gemm followed by col2im; bad calls
     refused;
   - every element-wise operation (fill, scale, axpy, bias_act_forward and
     act_backward for each activation, bias_backward, optimizer_update for
     each kind, norm_check's finiteness and sum of squares), at sizes around
     the split threshold: the bits of 1 thread, and fill, scale and axpy
     against their formulas; a NaN or infinity in any task's part is found;
   - bias_backward at 1, 2, 3 and 7 threads and every kernel equals, bit for
     bit, a serial sum in the documented blocked order (blocks of 128 rows);
   - training: mirrored N = 1 at 1, 2 and 3 threads and N = 2 at 1 and 3
     threads give the same bits (momentum and Adam), run after run; N = 2 at
     2 threads keeps the synchronous contract against one_device at batch
     2B; cpu_threads 0 gives dsgd_cpu_count() / N per replica;
   - bad thread counts are refused with a message; backends with a pool that
     are created and destroyed at once, or after one operation, stop cleanly.
   Runs under TSan too (make test), which checks the pool's handoffs.
   That is make test-full. make test (the quick tier) keeps every kernel,
   path and thread count but fewer combinations of each sweep (each test
   says which), and under TSan, where the other builds have checked the
   bits, one thread count against 1 where a sweep has several.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

/* The CPU kernels by their DSGD_CPU_ISA names (CPU THREADS in
   distsgd/backend.h); the ones this CPU does not run fall back and are
   skipped. */
static const char *const g_isas[] = {"avx512", "avx2", "portable"};
#define NKERNELS ((int)(sizeof g_isas / sizeof g_isas[0]))
static const int g_threads[] = {1, 2, 3, 7};
#define NTHREADS ((int)(sizeof g_threads / sizeof g_threads[0]))

static void backend_make(dsgd_ctx *ctx, int threads, dsgd_backend_i *be) {
    dsgd_cpu_backend_desc bd = {0};
    bd.threads = threads;
    TU_OK(ctx, dsgd_cpu_backend_create_desc(ctx, &bd, be));
    assert_int_equal(dsgd_cpu_backend_threads(be), threads);
}

/* 1 when DSGD_CPU_ISA=isa gives a backend that runs that kernel. */
static int isa_runs(dsgd_ctx *ctx, const char *isa) {
    dsgd_backend_i be;
    int runs;
    assert_int_equal(setenv("DSGD_CPU_ISA", isa, 1), 0);
    TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
    runs = strcmp(dsgd_cpu_backend_isa(&be), isa) == 0;
    be.destroy(be.impl);
    unsetenv("DSGD_CPU_ISA");
    return runs;
}

/* buf's floats from off on. */
static dsgd_ref ref_at(dsgd_buffer *buf, size_t off) {
    dsgd_ref r;
    r.buf = buf;
    r.off = off;
    return r;
}

/* A buffer of n floats holding src (n may be 0). */
static dsgd_ref buf_of(dsgd_ctx *ctx, dsgd_backend_i *be, const float *src, size_t n) {
    dsgd_buffer *b = NULL;
    TU_OK(ctx, be->buffer_create(be->impl, n ? n : 1, &b));
    if (n) TU_OK(ctx, be->write(be->impl, ref_at(b, 0), src, n));
    return ref_at(b, 0);
}

static void buf_free(dsgd_backend_i *be, dsgd_ref r) { be->buffer_destroy(be->impl, r.buf); }

static float *rand_floats(tu_rng *rng, size_t n) {
    float *v = (float *)malloc((n ? n : 1) * sizeof(float));
    size_t i;
    assert_non_null(v);
    for (i = 0; i < n; ++i) v[i] = (float)(2.0 * tu_unit(rng) - 1.0);
    return v;
}

/* ---------------------------------------------------------------- GEMM */

typedef struct shape {
    int m, n, k;
} shape;

/* C(m, n) of op(A) op(B) on a backend with `threads` threads; returns the
   m x ldc floats of C. */
static float *gemm_on(dsgd_ctx *ctx, const char *isa, int threads, const shape *s, int ta, int tb, float beta,
                      const float *a, int lda, const float *b, int ldb, const float *c0, int ldc) {
    dsgd_backend_i be;
    dsgd_ref ra, rb, rc;
    size_t na = (size_t)(ta ? s->k : s->m) * lda, nb = (size_t)(tb ? s->n : s->k) * ldb, nc = (size_t)s->m * ldc;
    float *out = (float *)malloc(nc * sizeof(float));
    assert_non_null(out);
    assert_int_equal(setenv("DSGD_CPU_ISA", isa, 1), 0);
    backend_make(ctx, threads, &be);
    assert_string_equal(dsgd_cpu_backend_isa(&be), isa);
    ra = buf_of(ctx, &be, a, na);
    rb = buf_of(ctx, &be, b, nb);
    rc = buf_of(ctx, &be, c0, nc);
    TU_OK(ctx, be.gemm(be.impl, ta, tb, s->m, s->n, s->k, 0.75f, ra, lda, rb, ldb, beta, rc, ldc));
    TU_OK(ctx, be.read(be.impl, rc, out, nc));
    buf_free(&be, ra);
    buf_free(&be, rb);
    buf_free(&be, rc);
    be.destroy(be.impl);
    return out;
}

/* Whether the quick tier (make test) runs shape si in transpose t and beta
   bi: the shapes of more than 10^7 multiply-adds in one of the eight
   combinations, the others in all four transposes with beta 0 and -0.5
   taking turns. Under TSan (beta -0.5 only), where a run costs mostly the
   pool's start and the other builds check the bits: one transpose per
   shape, in turns that still reach every path (the threads' GEMM by rows
   and by columns over two KC blocks, the thin one by tiles and by blocks
   of k, the independent blocks), and none of the large shapes. make
   test-full runs every combination. */
static int gemm_quick_keeps(int si, const shape *s, int t, int bi) {
    const int big = (double)s->m * s->n * s->k > 1e7;
    if (tu_full()) return 1;
    if (TU_TSAN) return !big && t == (si + 1) % 4;
    if (big) return t == si % 4 && bi == (si & 1);
    return bi == ((t + si) & 1);
}

static void test_gemm_threads(void **state) {
    /* above 2^17 multiply-adds the GEMM is cut: 256x256x784 (rows, the MLP's
       first layer), 784x256x64 (rows), 40x700x300 (columns, two KC blocks),
       5x5000x40 (columns of a short C), 600x1x300 (one column), 131x131x0
       (beta only), the thin GEMM's 3001x16x9 and 2000x32x9 (tiles of rows,
       a cut one last), 9x16x5000 (one tile, twenty KC blocks: the
       threads take blocks of k, added in order by the caller) and
       144x32x3000 (tiles of rows over twelve blocks), a convolution's;
       below it 17x33x64 and 64x10x128 */
    static const shape shapes[] = {{256, 256, 784}, {784, 256, 64}, {40, 700, 300}, {5, 5000, 40},
                                   {600, 1, 300},   {131, 131, 0},  {3001, 16, 9},  {2000, 32, 9},
                                   {9, 16, 5000},   {144, 32, 3000}, {17, 33, 64},  {64, 10, 128}};
    dsgd_ctx *ctx = NULL;
    tu_rng rng = tu_rng_make(11);
    int ki, si, t, ti, bi, kernels = 0;
    long checked = 0;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        const char *isa = g_isas[ki];
        if (!isa_runs(ctx, isa)) continue;
        ++kernels;
        for (si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); ++si)
            for (t = 0; t < 4; ++t)
                for (bi = TU_TSAN; bi < 2; ++bi) { /* TSan: beta -0.5 only */
                    const shape *s = &shapes[si];
                    int ta = t & 1, tb = t >> 1, i, j, q;
                    int lda = (ta ? s->m : s->k) + 3, ldb = (tb ? s->k : s->n) + 1, ldc = s->n + 2;
                    float beta = bi ? -0.5f : 0.0f, *a, *b, *c0, *one;
                    if (!gemm_quick_keeps(si, s, t, bi)) continue;
                    a = rand_floats(&rng, (size_t)(ta ? s->k : s->m) * lda);
                    b = rand_floats(&rng, (size_t)(tb ? s->n : s->k) * ldb);
                    c0 = rand_floats(&rng, (size_t)s->m * ldc);
                    one = gemm_on(ctx, isa, 1, s, ta, tb, beta, a, lda, b, ldb, c0, ldc);
                    /* the one-thread result against double: on a few in make test-full, on
                       every one the quick tier keeps */
                    if (t == 0 || si < 3 || !tu_full())
                        for (i = 0; i < s->m; i += 7)
                            for (j = 0; j < s->n; j += 5) {
                                double ref = 0, mag = 0, x;
                                for (q = 0; q < s->k; ++q) {
                                    x = (double)(ta ? a[(size_t)q * lda + i] : a[(size_t)i * lda + q]) *
                                        (tb ? b[(size_t)j * ldb + q] : b[(size_t)q * ldb + j]);
                                    ref += x;
                                    mag += fabs(x);
                                }
                                ref = 0.75 * ref + beta * c0[(size_t)i * ldc + j];
                                mag = 0.75 * mag + fabs(beta * c0[(size_t)i * ldc + j]);
                                if (!(fabs(one[(size_t)i * ldc + j] - ref) <= (s->k + 2) * FLT_EPSILON * mag))
                                    fail_msg("%s %dx%dx%d ta=%d tb=%d C[%d,%d] = %.9g, reference %.9g", isa, s->m,
                                             s->n, s->k, ta, tb, i, j, (double)one[(size_t)i * ldc + j], ref);
                            }
                    for (ti = 1; ti < NTHREADS; ti += TU_TSAN ? 2 : 1) { /* TSan: 2 and 7 threads */
                        float *got = gemm_on(ctx, isa, g_threads[ti], s, ta, tb, beta, a, lda, b, ldb, c0, ldc);
                        for (i = 0; i < s->m; ++i)
                            for (j = 0; j < ldc; ++j)
                                if (memcmp(&got[(size_t)i * ldc + j], &one[(size_t)i * ldc + j], sizeof(float)))
                                    fail_msg("%s %dx%dx%d ta=%d tb=%d beta=%g: %d threads give C[%d,%d] = %.9g, "
                                             "1 thread %.9g", isa, s->m, s->n, s->k, ta, tb, (double)beta,
                                             g_threads[ti], i, j, (double)got[(size_t)i * ldc + j],
                                             (double)one[(size_t)i * ldc + j]);
                        checked += (long)s->m * ldc;
                        free(got);
                    }
                    free(one);
                    free(a);
                    free(b);
                    free(c0);
                }
    }
    unsetenv("DSGD_CPU_ISA");
    print_message("%d kernels, %ld entries of C equal at %s threads\n", kernels, checked, TU_TSAN ? "2 and 7" : "2, 3 and 7");
    assert_true(kernels >= 1);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- conv_gemm */

/* conv_gemm's C (rows ldc apart, m of them) on a backend of `threads`
   threads, or with `via_col` im2col into a buffer and then gemm (what
   conv_gemm must equal bit for bit). */
static float *conv_gemm_on(dsgd_ctx *ctx, const char *isa, int threads, int via_col, const dsgd_window *wd, int ta,
                           int n, float beta, const float *x, size_t nx, const float *b, int ldb, const float *c0,
                           int ldc, int *m_out) {
    dsgd_backend_i be;
    dsgd_ref rx, rb, rc, rcol;
    const int oh = (wd->h + 2 * wd->pad - wd->kh) / wd->stride + 1, ow = (wd->w + 2 * wd->pad - wd->kw) / wd->stride + 1;
    const int rows = wd->n * oh * ow, kk = wd->kh * wd->kw * wd->c, m = ta ? kk : rows, k = ta ? rows : kk;
    size_t nc = (size_t)m * ldc;
    float *out = (float *)malloc(nc * sizeof(float));
    assert_non_null(out);
    assert_int_equal(setenv("DSGD_CPU_ISA", isa, 1), 0);
    backend_make(ctx, threads, &be);
    assert_string_equal(dsgd_cpu_backend_isa(&be), isa);
    assert_non_null(be.conv_gemm);
    rx = buf_of(ctx, &be, x, nx);
    rb = buf_of(ctx, &be, b, (size_t)k * ldb);
    rc = buf_of(ctx, &be, c0, nc);
    if (via_col) {
        rcol.buf = NULL;
        rcol.off = 0;
        TU_OK(ctx, be.buffer_create(be.impl, (size_t)rows * kk, &rcol.buf));
        TU_OK(ctx, be.im2col(be.impl, wd, rx, rcol));
        TU_OK(ctx, be.gemm(be.impl, ta, 0, m, n, k, 0.75f, rcol, kk, rb, ldb, beta, rc, ldc));
        buf_free(&be, rcol);
    } else {
        TU_OK(ctx, be.conv_gemm(be.impl, wd, ta, n, 0.75f, rx, rb, ldb, beta, rc, ldc));
    }
    TU_OK(ctx, be.read(be.impl, rc, out, nc));
    buf_free(&be, rx);
    buf_free(&be, rb);
    buf_free(&be, rc);
    be.destroy(be.impl);
    *m_out = m;
    return out;
}

static void test_conv_gemm_threads(void **state) {
    /* the CNN's two convolutions (1 channel: the thin GEMM both ways, one
       tile of 9 rows for the weight gradient; 16 channels: the threads'
       GEMM forward, thin rows for the weight gradient), a window neither
       square nor unit-strided with padding past the image, and 40 channels
       (k 360: two KC blocks forward, a weight gradient of 360 rows on the
       blocked GEMM), each with 16, 32, 5 and 40 outputs */
    static const dsgd_window wins[] = {{4, 28, 28, 1, 3, 3, 1, 1}, {3, 14, 14, 16, 3, 3, 1, 1},
                                       {2, 9, 7, 3, 4, 3, 2, 2},   {2, 6, 6, 40, 3, 3, 1, 0}};
    static const int outs[] = {16, 32, 5, 40};
    dsgd_ctx *ctx = NULL;
    tu_rng rng = tu_rng_make(23);
    int ki, wi, oi, ta, bi, ti, kernels = 0;
    long checked = 0;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        const char *isa = g_isas[ki];
        if (!isa_runs(ctx, isa)) continue;
        ++kernels;
        for (wi = 0; wi < (int)(sizeof wins / sizeof wins[0]); ++wi)
            for (oi = 0; oi < (int)(sizeof outs / sizeof outs[0]); oi += TU_TSAN ? 2 : 1) /* TSan: 16 and 5 */
                for (ta = 0; ta < 2; ++ta)
                    for (bi = 0; bi < 2; ++bi) {
                        const dsgd_window *wd = &wins[wi];
                        const int n = outs[oi], ldb = n + 1, ldc = n + 2;
                        const int rows = wd->n * ((wd->h + 2 * wd->pad - wd->kh) / wd->stride + 1) *
                                         ((wd->w + 2 * wd->pad - wd->kw) / wd->stride + 1);
                        const int kk = wd->kh * wd->kw * wd->c, m = ta ? kk : rows, k = ta ? rows : kk;
                        const size_t nx = (size_t)wd->n * wd->h * wd->w * wd->c;
                        float beta = bi ? -0.5f : 0.0f, *x, *b, *c0, *want, *got;
                        int mm, i;
                        /* the quick tier: each window with a thin and a wider C (16 and 40
                           outputs, or 32 and 5; TSan: 16 or 5, in turns), beta 0 and -0.5
                           taking turns; make test-full runs every combination */
                        if (!tu_full() && (bi != ((wi + oi + ta) & 1) ||
                                           (TU_TSAN ? oi != 2 * (wi % 2)
                                                    : (oi == 0 || oi == 3) != (wi % 2 == 0))))
                            continue;
                        x = rand_floats(&rng, nx);
                        b = rand_floats(&rng, (size_t)k * ldb);
                        c0 = rand_floats(&rng, (size_t)m * ldc);
                        want = conv_gemm_on(ctx, isa, 1, 1, wd, ta, n, beta, x, nx, b, ldb, c0, ldc, &mm);
                        for (ti = 0; ti < NTHREADS; ti += TU_TSAN ? 2 : 1) { /* TSan: 1 and 3 threads */
                            got = conv_gemm_on(ctx, isa, g_threads[ti], 0, wd, ta, n, beta, x, nx, b, ldb, c0, ldc,
                                               &mm);
                            for (i = 0; i < m * ldc; ++i)
                                if (memcmp(&got[i], &want[i], sizeof(float)))
                                    fail_msg("%s window %d n=%d ta=%d beta=%g, %d threads: C[%d,%d] = %.9g, im2col + "
                                             "gemm %.9g", isa, wi, n, ta, (double)beta, g_threads[ti], i / ldc,
                                             i % ldc, (double)got[i], (double)want[i]);
                            checked += (long)m * ldc;
                            free(got);
                        }
                        free(want);
                        free(x);
                        free(b);
                        free(c0);
                    }
    }
    unsetenv("DSGD_CPU_ISA");
    print_message("%d kernels, %ld entries of C equal to im2col + gemm at %s threads\n", kernels, checked,
                  TU_TSAN ? "1 and 3" : "1, 2, 3 and 7");
    assert_true(kernels >= 1);
    { /* refused with nothing written: a bad window, ta 2, C over x, B too short */
        dsgd_backend_i be;
        dsgd_window wd = {1, 4, 4, 1, 3, 3, 1, 0}, bad = wd;
        float xs[16] = {0}, sevens[4] = {7.0f, 7.0f, 7.0f, 7.0f}, got = 0.0f;
        dsgd_ref rx, rb, rc;
        backend_make(ctx, 2, &be);
        rx = buf_of(ctx, &be, xs, 16);
        rb = buf_of(ctx, &be, xs, 9);
        rc = buf_of(ctx, &be, sevens, 4);
        bad.kh = 5;
        assert_int_equal(be.conv_gemm(be.impl, &bad, 0, 1, 1.0f, rx, rb, 1, 0.0f, rc, 1), DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(be.conv_gemm(be.impl, &wd, 2, 1, 1.0f, rx, rb, 1, 0.0f, rc, 1), DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(be.conv_gemm(be.impl, &wd, 0, 1, 1.0f, rx, rb, 1, 0.0f, rx, 1), DSGD_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "overlaps"));
        assert_int_equal(be.conv_gemm(be.impl, &wd, 0, 2, 1.0f, rx, rb, 2, 0.0f, rc, 2), DSGD_ERR_INVALID_ARGUMENT);
        TU_OK(ctx, be.read(be.impl, rc, &got, 1));
        assert_true(got == 7.0f);
        buf_free(&be, rx);
        buf_free(&be, rb);
        buf_free(&be, rc);
        be.destroy(be.impl);
    }
    dsgd_ctx_destroy(ctx);
}

/* conv_backward_x's dx on a backend of `threads` threads, or with
   `via_col` gemm into a buffer and then col2im (what it must equal bit for
   bit). */
static float *conv_dx_on(dsgd_ctx *ctx, const char *isa, int threads, int via_col, const dsgd_window *wd, int f,
                         const float *dy, size_t ndy, const float *w, size_t nw, size_t nx) {
    dsgd_backend_i be;
    dsgd_ref rdy, rw, rdx, rcol;
    const int kk = wd->kh * wd->kw * wd->c, rows = (int)(ndy / (size_t)f);
    float *out = (float *)malloc(nx * sizeof(float)), *junk = (float *)malloc(nx * sizeof(float));
    size_t i;
    assert_non_null(out);
    assert_non_null(junk);
    for (i = 0; i < nx; ++i) junk[i] = NAN; /* dx is overwritten: nothing of it may be read */
    assert_int_equal(setenv("DSGD_CPU_ISA", isa, 1), 0);
    backend_make(ctx, threads, &be);
    assert_string_equal(dsgd_cpu_backend_isa(&be), isa);
    rdy = buf_of(ctx, &be, dy, ndy);
    rw = buf_of(ctx, &be, w, nw);
    rdx = buf_of(ctx, &be, junk, nx);
    if (via_col) {
        rcol.buf = NULL;
        rcol.off = 0;
        TU_OK(ctx, be.buffer_create(be.impl, (size_t)rows * kk, &rcol.buf));
        TU_OK(ctx, be.gemm(be.impl, 0, 1, rows, kk, f, 1.0f, rdy, f, rw, f, 0.0f, rcol, kk));
        TU_OK(ctx, be.col2im(be.impl, wd, rcol, rdx));
        buf_free(&be, rcol);
    } else {
        assert_non_null(be.conv_backward_x);
        TU_OK(ctx, be.conv_backward_x(be.impl, wd, f, rdy, rw, rdx));
    }
    TU_OK(ctx, be.read(be.impl, rdx, out, nx));
    buf_free(&be, rdy);
    buf_free(&be, rw);
    buf_free(&be, rdx);
    be.destroy(be.impl);
    free(junk);
    return out;
}

static void test_conv_backward_x_threads(void **state) {
    /* the CNN's second convolution (16 channels, 32 filters), stride 2 with
       padding (pixels no window reaches, and pixels some (ky, kx) miss), 40
       channels (two strips of the avx2 thin kernel), 300 filters (two KC
       blocks per col entry), and 1 channel; dy with zeros, -0 and a NaN.
       Stride 1 with at most 256 filters takes the direct path (dy's planes
       read as the thin kernel's A) where there are at least as many images
       as tasks: the first window there at 1 to 3 threads and by tiles at 7;
       a 2 x 3 window without padding over a 7 x 9 image, a padding of 2
       (outputs past the image, no left or top border) with a NaN, and one
       image (by tiles past one thread) */
    static const dsgd_window wins[] = {{3, 14, 14, 16, 3, 3, 1, 1}, {2, 9, 7, 3, 2, 3, 3, 1},
                                       {2, 6, 6, 40, 3, 3, 1, 1},   {2, 5, 5, 5, 3, 3, 1, 1},
                                       {2, 8, 8, 1, 3, 3, 1, 1},    {3, 7, 9, 5, 2, 3, 1, 0},
                                       {2, 5, 6, 3, 3, 3, 1, 2},    {1, 11, 13, 20, 3, 3, 1, 1}};
    static const int filters[] = {32, 7, 16, 300, 16, 9, 20, 33};
    dsgd_ctx *ctx = NULL;
    tu_rng rng = tu_rng_make(29);
    int ki, wi, ti, kernels = 0;
    long checked = 0;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        const char *isa = g_isas[ki];
        if (!isa_runs(ctx, isa) || !strcmp(isa, "portable")) continue; /* portable: no thin kernel, no op */
        ++kernels;
        for (wi = 0; wi < (int)(sizeof wins / sizeof wins[0]); ++wi) {
            const dsgd_window *wd = &wins[wi];
            const int f = filters[wi], kk = wd->kh * wd->kw * wd->c;
            const int rows = wd->n * ((wd->h + 2 * wd->pad - wd->kh) / wd->stride + 1) *
                             ((wd->w + 2 * wd->pad - wd->kw) / wd->stride + 1);
            const size_t ndy = (size_t)rows * f, nw = (size_t)kk * f, nx = (size_t)wd->n * wd->h * wd->w * wd->c;
            float *dy = rand_floats(&rng, ndy), *w = rand_floats(&rng, nw), *want, *got;
            size_t i;
            for (i = 0; i < ndy; i += 11) dy[i] = i % 2 ? -0.0f : 0.0f;
            if (wi == 1 || wi == 6) dy[5] = NAN;
            want = conv_dx_on(ctx, isa, 1, 1, wd, f, dy, ndy, w, nw, nx);
            for (ti = 0; ti < NTHREADS; ti += TU_TSAN ? 2 : 1) { /* TSan: 1 and 3 threads */
                got = conv_dx_on(ctx, isa, g_threads[ti], 0, wd, f, dy, ndy, w, nw, nx);
                for (i = 0; i < nx; ++i)
                    if (memcmp(&got[i], &want[i], sizeof(float)))
                        fail_msg("%s window %d f=%d, %d threads: dx[%zu] = %.9g, gemm + col2im %.9g", isa, wi, f,
                                 g_threads[ti], i, (double)got[i], (double)want[i]);
                checked += (long)nx;
                free(got);
            }
            free(want);
            free(dy);
            free(w);
        }
    }
    unsetenv("DSGD_CPU_ISA");
    print_message("%d kernels, %ld elements of dx equal to gemm + col2im at 1, 2, 3 and 7 threads\n", kernels,
                  checked);
    { /* the portable kernels have no thin GEMM, so no conv_backward_x */
        dsgd_backend_i be;
        assert_int_equal(setenv("DSGD_CPU_ISA", "portable", 1), 0);
        TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
        unsetenv("DSGD_CPU_ISA");
        if (!strcmp(dsgd_cpu_backend_isa(&be), "portable")) assert_null(be.conv_backward_x);
        be.destroy(be.impl);
    }
    if (kernels) { /* refused with nothing written: f 0, dx over dy */
        dsgd_backend_i be;
        dsgd_window wd = {1, 4, 4, 1, 3, 3, 1, 1};
        float buf[64], got = 0.0f;
        dsgd_ref r;
        memset(buf, 0, sizeof buf);
        buf[0] = 7.0f;
        TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
        r = buf_of(ctx, &be, buf, 64);
        assert_int_equal(be.conv_backward_x(be.impl, &wd, 0, r, r, ref_at(r.buf, 40)), DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(be.conv_backward_x(be.impl, &wd, 1, r, ref_at(r.buf, 16), ref_at(r.buf, 8)),
                         DSGD_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "overlaps"));
        TU_OK(ctx, be.read(be.impl, r, &got, 1));
        assert_true(got == 7.0f);
        buf_free(&be, r);
        be.destroy(be.impl);
    }
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- element-wise */

/* Every element-wise operation on n floats (and an m x n matrix with m =
   rows) with `threads` threads; the outputs, concatenated, in *out. */
static size_t elementwise_on(dsgd_ctx *ctx, int threads, size_t n, int rows, uint64_t seed, float **out) {
    static const dsgd_activation acts[] = {DSGD_ACT_NONE, DSGD_ACT_RELU, DSGD_ACT_TANH, DSGD_ACT_SIGMOID};
    static const dsgd_optimizer_kind kinds[] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM, DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM,
                                                DSGD_OPT_ADAMW};
    dsgd_backend_i be;
    tu_rng rng = tu_rng_make(seed);
    size_t mat = (size_t)rows * n, total = 0, cap = 40 * n + 12 * mat + 64, i;
    float *res = (float *)malloc(cap * sizeof(float));
    float *x = rand_floats(&rng, n), *y = rand_floats(&rng, n), *ym = rand_floats(&rng, mat);
    float *bias = rand_floats(&rng, n), *m1 = rand_floats(&rng, n), *m2 = rand_floats(&rng, n);
    dsgd_ref rx, ry, rm, rb, r1, r2;
    int a, k, pos;
    assert_non_null(res);
    for (i = 0; i < n; ++i) m2[i] = fabsf(m2[i]); /* a second moment */
    backend_make(ctx, threads, &be);
    rx = buf_of(ctx, &be, x, n);
    ry = buf_of(ctx, &be, y, n);
    rm = buf_of(ctx, &be, ym, mat);
    rb = buf_of(ctx, &be, bias, n);
    r1 = buf_of(ctx, &be, m1, n);
    r2 = buf_of(ctx, &be, m2, n);
#define TAKE(ref, count)                                                      \
    do {                                                                      \
        TU_OK(ctx, be.read(be.impl, (ref), res + total, (count)));            \
        total += (count);                                                     \
    } while (0)
    TU_OK(ctx, be.scale(be.impl, rx, -1.25f, n));
    TAKE(rx, n);
    for (i = 0; i < n; ++i) assert_true(res[i] == x[i] * -1.25f);
    TU_OK(ctx, be.axpy(be.impl, rx, 0.5f, ry, n)); /* x = -1.25 x0 + 0.5 y */
    TAKE(rx, n);
    for (i = 0; i < n; ++i) assert_true(res[n + i] == res[i] + 0.5f * y[i]);
    for (a = 0; a < 4; ++a) {
        TU_OK(ctx, be.write(be.impl, rm, ym, mat));
        TU_OK(ctx, be.bias_act_forward(be.impl, acts[a], rm, a & 1 ? rb : ref_at(NULL, 0), rows, (int)n));
        TAKE(rm, mat);
        TU_OK(ctx, be.act_backward(be.impl, acts[a], rx, ry, n));
        TAKE(rx, n);
    }
    TU_OK(ctx, be.bias_backward(be.impl, rb, rm, rows, (int)n));
    TAKE(rb, n);
    for (k = 0; k < 5; ++k) {
        dsgd_opt_update u;
        memset(&u, 0, sizeof(u));
        u.kind = kinds[k];
        u.lr = 0.01f, u.momentum = 0.9f, u.nesterov = k == 2, u.beta1 = 0.9f, u.beta2 = 0.999f, u.eps = 1e-8f;
        u.weight_decay = 0.01f, u.bias_correction1 = 0.1f, u.bias_correction2 = 0.001f, u.grad_scale = 0.5f;
        TU_OK(ctx, be.optimizer_update(be.impl, &u, rx, ry, r1, r2, n));
        TAKE(rx, n);
        TAKE(r1, n);
        TAKE(r2, n);
    }
    /* finiteness: none, then one NaN or infinity at the start, the middle, the end */
    for (pos = -1; pos < 3; ++pos) {
        size_t at = pos == 0 ? 0 : pos == 1 ? n / 2 : n - 1, bad = 99;
        double sumsq = -1.0;
        float v = pos == 1 ? INFINITY : NAN, keep = 0.0f;
        if (pos >= 0) {
            TU_OK(ctx, be.read(be.impl, ref_at(ry.buf, at), &keep, 1));
            TU_OK(ctx, be.write(be.impl, ref_at(ry.buf, at), &v, 1));
        }
        TU_OK(ctx, be.norm_check(be.impl, ry, n, NULL, &bad));
        assert_int_equal(bad, pos >= 0 ? 1 : 0);
        TU_OK(ctx, be.norm_check(be.impl, ry, n, &sumsq, &bad));
        assert_int_equal(bad, pos >= 0 ? 1 : 0);
        res[total++] = (float)sumsq;
        if (pos >= 0) TU_OK(ctx, be.write(be.impl, ref_at(ry.buf, at), &keep, 1));
    }
    TU_OK(ctx, be.fill(be.impl, rx, 3.5f, n));
    TAKE(rx, n);
    for (i = 0; i < n; ++i) assert_true(res[total - n + i] == 3.5f);
#undef TAKE
    assert_true(total <= cap);
    buf_free(&be, rx);
    buf_free(&be, ry);
    buf_free(&be, rm);
    buf_free(&be, rb);
    buf_free(&be, r1);
    buf_free(&be, r2);
    be.destroy(be.impl);
    free(x);
    free(y);
    free(ym);
    free(bias);
    free(m1);
    free(m2);
    *out = res;
    return total;
}

static void test_elementwise_threads(void **state) {
    /* 32768 floats is where an operation starts to split; 300 x 257 and
       40 x 2500 matrices split by rows (bias_act) and columns (bias_backward).
       The quick tier (make test) leaves out 32769 (100003 splits unevenly
       too). Under TSan, where the other builds have checked the bits and the
       pool's handoffs are the point, it compares 1 thread with one other
       count, tsan_quick, and leaves out the sizes marked 0: 32767 (one
       thread at any count) and 100003 (the matrices split into as many
       tasks). make test-full runs every size at every count. */
    static const struct { size_t n; int rows, tsan_quick; } sizes[] = {
        {1, 3, 7},      {17, 5, 2},      {32767, 1, 0},  {32768, 2, 2},
        {32769, 1, 0},  {100003, 1, 0},  {257, 300, 3},  {2500, 40, 7}};
    dsgd_ctx *ctx = NULL;
    int si, ti;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); ++si) {
        float *one, *got;
        size_t n1, n2, i;
        if (!tu_full() && (sizes[si].n == 32769 || (TU_TSAN && !sizes[si].tsan_quick))) continue;
        n1 = elementwise_on(ctx, 1, sizes[si].n, sizes[si].rows, 5 + (uint64_t)si, &one);
        for (ti = 1; ti < NTHREADS; ++ti) {
            if (!tu_full() && TU_TSAN && g_threads[ti] != sizes[si].tsan_quick) continue;
            n2 = elementwise_on(ctx, g_threads[ti], sizes[si].n, sizes[si].rows, 5 + (uint64_t)si, &got);
            assert_int_equal(n1, n2);
            for (i = 0; i < n1; ++i)
                if (memcmp(&one[i], &got[i], sizeof(float)))
                    fail_msg("n=%zu rows=%d: output %zu is %.9g with %d threads, %.9g with 1", sizes[si].n,
                             sizes[si].rows, i, (double)got[i], g_threads[ti], (double)one[i]);
            free(got);
        }
        free(one);
    }
    dsgd_ctx_destroy(ctx);
}

/* bias_backward's documented order (distsgd/backend.h): the rows in blocks
   of 128, each block's column sum from 0.0f in row order, then the block
   sums from 0.0f in block order. */
static void bias_backward_ref(const float *dy, int m, int n, float *db) {
    int i, j, lo;
    for (j = 0; j < n; ++j) {
        float s = 0.0f;
        for (lo = 0; lo < m; lo += 128) {
            float part = 0.0f;
            for (i = lo; i < m && i < lo + 128; ++i) part = part + dy[(size_t)i * n + j];
            s = s + part;
        }
        db[j] = s;
    }
}

/* bias_backward equals the serial blocked sum bit for bit at every thread
   count and kernel: one block, a whole number of blocks, a short last one,
   and shapes large enough to split across threads. */
static void test_bias_backward_order(void **state) {
    static const int shapes[][2] = {{37, 10}, {128, 5}, {129, 3}, {1000, 1}, {300, 257}, {5000, 40}, {2049, 300}};
    dsgd_ctx *ctx = NULL;
    int si, ti, ki;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        if (!isa_runs(ctx, g_isas[ki])) continue;
        for (si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); ++si) {
            const int m = shapes[si][0], n = shapes[si][1];
            tu_rng rng = tu_rng_make(40 + (uint64_t)si);
            float *dy = rand_floats(&rng, (size_t)m * n), *want = rand_floats(&rng, (size_t)n),
                  *got = rand_floats(&rng, (size_t)n);
            int j;
            bias_backward_ref(dy, m, n, want);
            /* the quick tier under TSan: 1 and 3 threads (the other builds check
               the bits at every count); make test-full: 1, 2, 3 and 7 */
            for (ti = 0; ti < NTHREADS; ti += TU_TSAN && !tu_full() ? 2 : 1) {
                dsgd_backend_i be;
                dsgd_ref rdy, rdb;
                assert_int_equal(setenv("DSGD_CPU_ISA", g_isas[ki], 1), 0);
                backend_make(ctx, g_threads[ti], &be);
                unsetenv("DSGD_CPU_ISA");
                rdy = buf_of(ctx, &be, dy, (size_t)m * n);
                rdb = buf_of(ctx, &be, got, (size_t)n);
                TU_OK(ctx, be.bias_backward(be.impl, rdb, rdy, m, n));
                TU_OK(ctx, be.read(be.impl, rdb, got, (size_t)n));
                for (j = 0; j < n; ++j)
                    if (memcmp(&got[j], &want[j], sizeof(float)))
                        fail_msg("%s, %d threads, m=%d n=%d: db[%d] is %.9g, the blocked order gives %.9g",
                                 g_isas[ki], g_threads[ti], m, n, j, (double)got[j], (double)want[j]);
                buf_free(&be, rdy);
                buf_free(&be, rdb);
                be.destroy(be.impl);
            }
            free(dy);
            free(want);
            free(got);
        }
    }
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- training */

static dsgd_layer_desc g_layers[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                      {128, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                      {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
#define IN 300
#define GB 128 /* global batch */

/* Trains `steps` steps of `kind` with N replicas of `threads` threads (0:
   the default) and returns the parameters (*np of them). */
static float *train(dsgd_strategy_kind kind, int n, int threads, dsgd_optimizer_kind opt, int steps, size_t *np,
                    int *threads_seen) {
    dsgd_ctx *ctx = NULL;
    dsgd_strategy_desc sd;
    dsgd_strategy *st = NULL;
    tu_rng rng = tu_rng_make(21);
    float *x = rand_floats(&rng, (size_t)GB * IN), y[GB], *p;
    int i;
    for (i = 0; i < GB; ++i) y[i] = (float)(tu_next(&rng) % 10);
    memset(&sd, 0, sizeof(sd));
    sd.kind = kind;
    sd.num_replicas = n;
    sd.cpu_threads = threads;
    sd.model.input_dim = IN;
    sd.model.layers = g_layers;
    sd.model.num_layers = 3;
    sd.model.max_batch = GB;
    sd.model.seed = 9;
    sd.optimizer.kind = opt;
    sd.optimizer.lr = opt == DSGD_OPT_ADAM ? 0.001f : 0.05f;
    sd.optimizer.momentum = 0.9f;
    sd.optimizer.weight_decay = 1e-4f;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &st));
    *threads_seen = dsgd_cpu_backend_threads(dsgd_model_backend(dsgd_strategy_model(st, 0)));
    for (i = 0; i < steps; ++i) TU_OK(ctx, dsgd_strategy_train_step(st, x, y, GB, NULL));
    *np = dsgd_model_num_params(dsgd_strategy_model(st, 0));
    p = (float *)malloc(*np * sizeof(float));
    assert_non_null(p);
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(st, 0), p, *np));
    dsgd_strategy_destroy(st);
    dsgd_ctx_destroy(ctx);
    free(x);
    return p;
}

static void test_training_threads(void **state) {
    static const struct { int n, threads; } runs[] = {{1, 2}, {1, 3}, {1, 2}}; /* the last: run to run */
    dsgd_optimizer_kind opts[2] = {DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM};
    /* the quick tier: 2 steps (the second uses the optimizer's slots), and
       run to run with momentum only; under TSan, which looks for races (the
       other builds check the bits), 1 step of Adam. make test-full: 6 steps
       of both, every run. */
    const int steps = TU_PICK(6, TU_TSAN ? 1 : 2);
    int o, r, seen;
    (void)state;
    for (o = TU_TSAN && !tu_full() ? 1 : 0; o < 2; ++o) {
        size_t np, np2;
        float *one = train(DSGD_STRATEGY_MIRRORED, 1, 1, opts[o], steps, &np, &seen), *got, *two;
        assert_int_equal(seen, 1);
        for (r = 0; r < (int)(sizeof runs / sizeof runs[0]); ++r) {
            if (!tu_full() && o == 1 && r == 2) continue;
            got = train(DSGD_STRATEGY_MIRRORED, runs[r].n, runs[r].threads, opts[o], steps, &np2, &seen);
            assert_int_equal(seen, runs[r].threads);
            assert_int_equal(np, np2);
            assert_memory_equal(one, got, np * sizeof(float));
            free(got);
        }
        /* N = 2: 3 threads each (oversubscribed here, still the same bits) against 1 */
        two = train(DSGD_STRATEGY_MIRRORED, 2, 1, opts[o], steps, &np2, &seen);
        got = train(DSGD_STRATEGY_MIRRORED, 2, 3, opts[o], steps, &np2, &seen);
        assert_int_equal(seen, 3);
        assert_memory_equal(two, got, np * sizeof(float));
        free(got);
        /* and central storage at 2 threads */
        got = train(DSGD_STRATEGY_CENTRAL_STORAGE, 2, 2, opts[o], steps, &np2, &seen);
        free(two);
        two = train(DSGD_STRATEGY_CENTRAL_STORAGE, 2, 1, opts[o], steps, &np2, &seen);
        assert_memory_equal(two, got, np * sizeof(float));
        free(got);
        free(two);
        free(one);
    }
}

/* The synchronous contract with threads on: mirrored N = 2 x B at 2 threads
   each against one_device at 2B and 3 threads, 5 steps (2 in the quick
   tier). */
static void test_contract_threads(void **state) {
    size_t np, i;
    int seen;
    float *mir = train(DSGD_STRATEGY_MIRRORED, 2, 2, DSGD_OPT_MOMENTUM, TU_PICK(5, 2), &np, &seen);
    float *one = train(DSGD_STRATEGY_ONE_DEVICE, 1, 3, DSGD_OPT_MOMENTUM, TU_PICK(5, 2), &np, &seen);
    double worst = 0, d;
    (void)state;
    for (i = 0; i < np; ++i) {
        d = fabs((double)mir[i] - one[i]) / (1.0 + fabs((double)one[i]));
        if (d > worst) worst = d;
    }
    print_message("mirrored 2 x 64 (2 threads each) against one_device 128 (3 threads): max rel diff %.3g\n", worst);
    assert_true(worst < 1e-5);
    free(mir);
    free(one);
}

/* cpu_threads 0: dsgd_cpu_count() / N each, at least 1. */
static void test_default_threads(void **state) {
    int n, seen;
    size_t np;
    (void)state;
    for (n = 1; n <= 3; ++n) {
        float *p = train(DSGD_STRATEGY_MIRRORED, n, 0, DSGD_OPT_SGD, 1, &np, &seen);
        assert_int_equal(seen, dsgd_cpu_count() / n > 1 ? dsgd_cpu_count() / n : 1);
        free(p);
    }
}

/* ---------------------------------------------------------------- misuse */

static void test_bad_threads(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i be;
    dsgd_cpu_backend_desc bd = {0};
    dsgd_strategy_desc sd;
    dsgd_strategy *st = NULL;
    dsgd_ref r;
    float v[3] = {1, 2, 3};
    int i;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    bd.threads = -1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cpu_backend_create_desc(ctx, &bd, &be));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "-1 threads"));
    bd.threads = DSGD_CPU_MAX_THREADS + 1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cpu_backend_create_desc(ctx, &bd, &be));
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_cpu_backend_create_desc(ctx, &bd, NULL));
    assert_int_equal(dsgd_cpu_backend_threads(NULL), 0);
    assert_true(dsgd_cpu_count() >= 1);
    /* a pool created and destroyed at once, and after one small and one split operation */
    for (i = 0; i < 20; ++i) {
        bd.threads = 2 + i % 5;
        TU_OK(ctx, dsgd_cpu_backend_create_desc(ctx, &bd, &be));
        if (i % 2) {
            r = buf_of(ctx, &be, v, 3);
            TU_OK(ctx, be.scale(be.impl, r, 2.0f, 3));
            buf_free(&be, r);
            TU_OK(ctx, be.buffer_create(be.impl, 100000, &r.buf));
            TU_OK(ctx, be.fill(be.impl, ref_at(r.buf, 0), 1.0f, 100000));
            buf_free(&be, ref_at(r.buf, 0));
        }
        be.destroy(be.impl);
    }
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 2;
    sd.model.input_dim = 4;
    sd.model.layers = g_layers;
    sd.model.num_layers = 3;
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.1f;
    sd.cpu_threads = -2;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &sd, &st));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "CPU threads"));
    sd.cpu_threads = DSGD_CPU_MAX_THREADS + 1;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &sd, &st));
    assert_null(st);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_threads),
        cmocka_unit_test(test_conv_gemm_threads),
        cmocka_unit_test(test_conv_backward_x_threads),
        cmocka_unit_test(test_elementwise_threads),
        cmocka_unit_test(test_bias_backward_order),
        cmocka_unit_test(test_training_threads),
        cmocka_unit_test(test_contract_threads),
        cmocka_unit_test(test_default_threads),
        cmocka_unit_test(test_bad_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
