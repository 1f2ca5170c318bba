/* test_backend_cpu_isa.c - the CPU backend's run-time kernels (CPU KERNELS in
   distsgd/backend.h).

   Every kernel this machine supports is forced through DSGD_CPU_ISA (the
   backend reads it at creation) and checked:
   - its name: dsgd_cpu_backend_isa and dsgd_cpu_isa report it; a kernel the
     CPU lacks, an unknown name, "" and no variable give the widest supported
     one; the widest agrees with the flags of /proc/cpuinfo where there is one;
   - against a double-precision GEMM, m, n, k in {1, 5, 17, 64, 131} (and
     k = 300, two KC blocks), and the thin GEMM's shapes (a convolution over
     few channels: C narrow, k small or m one tile; beta 0 too), all four
     transposes, padded leading dimensions,
     alpha = 0.75, beta = -0.5 over a random C: |C - ref| <= (k + 2) eps
     (|alpha| sum |a||b| + |beta c|) per element (eps = FLT_EPSILON, twice
     the rounding bound of a length-k dot product);
   - bit for bit against a float emulation of the documented order: per KC
     block, acc = sum over p in order (fmaf for the FMA kernels, a rounded
     product then a rounded sum for the portable one), then C += alpha acc;
     so the two FMA kernels agree bit for bit with each other, and every
     kernel with itself from run to run (checked too).
   - every element-wise operation (scale, axpy, bias_act_forward and
     act_backward for each activation, bias_backward, optimizer_update for
     each kind, norm_check) bit for bit against its scalar formula written
     out here, at sizes around the kernels' 16-element blocks;
   - maxpool_backward (its windows-apart path is a kernel) bit for bit
     against its definition, on 1 and 3 threads: windows apart and
     overlapping, with gaps, channels 1 to 131, ties, signed zeros, NaN;
   - overlapping ranges refused (the kernels' arrays are restrict).
   The kernels that ran are printed. The emulations, like the kernels, are
   kept from contracting a * b + c into FMA (DSGD__NO_CONTRACT), so this
   holds with -march=native and GNU modes too.
   With DSGD_USE_CBLAS the GEMM's order is OpenBLAS's: only its accuracy is
   checked.
   That is make test-full; make test (the quick tier) runs each GEMM shape
   in fewer transposes and max-pool over fewer shapes (see each test).

   Build: make test (this file compiles the implementation itself: it reads
   the CPU backend's private kernel table).
   distsgd-test: own-implementation */
/* the CPU kernels only: the parts a strategy adds are left out, which
   takes about a third off this file's compile */
#define DSGD_NO_SIMNET
#define DSGD_NO_PS
#define DSGD_NO_COMPRESS
#define DSGD_NO_ELASTIC
#define DSGD_NO_LOCAL
#define DSGD_NO_TF_CONFIG
#define DISTSGD_IMPLEMENTATION /* the kernels' table and private helpers */
#include "harness.h"

#define NKERNELS ((int)(sizeof(dsgd__cpu_kernels) / sizeof(dsgd__cpu_kernels[0])))

/* The table's widest kernel this CPU runs (the default). */
static const char *widest(void) {
    int i;
    for (i = 0; i < NKERNELS; ++i)
        if (dsgd__cpu_kernels[i].supported()) return dsgd__cpu_kernels[i].name;
    return NULL;
}

/* A backend created with DSGD_CPU_ISA = isa (NULL: unset). */
static void create_with(dsgd_ctx *ctx, const char *isa, dsgd_backend_i *be) {
    if (isa)
        assert_int_equal(setenv("DSGD_CPU_ISA", isa, 1), 0);
    else
        assert_int_equal(unsetenv("DSGD_CPU_ISA"), 0);
    TU_OK(ctx, dsgd_cpu_backend_create(ctx, be));
}

/* 1 when /proc/cpuinfo's first "flags" line has the word w, 0 when not, -1
   when there is no such file or line. */
static int cpuinfo_has(const char *w) {
    static char line[8192];
    FILE *f = fopen("/proc/cpuinfo", "r");
    int found = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        char *tok;
        if (strncmp(line, "flags", 5)) continue;
        found = 0;
        for (tok = strtok(line, " \t\n"); tok; tok = strtok(NULL, " \t\n"))
            if (!strcmp(tok, w)) found = 1;
        break;
    }
    fclose(f);
    return found;
}

static void test_names_and_fallback(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i be, other;
    const char *best = widest();
    const char *asks[] = {NULL, "", "auto", "sse9", "AVX2"};
    int i;
    (void)state;
    assert_non_null(best);
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    /* each kernel by name: itself where supported, else the widest */
    for (i = 0; i < NKERNELS; ++i) {
        const dsgd__cpu_kernel *k = &dsgd__cpu_kernels[i];
        const char *want = k->supported() ? k->name : best;
        create_with(ctx, k->name, &be);
        assert_string_equal(dsgd_cpu_backend_isa(&be), want);
        assert_string_equal(dsgd_cpu_isa(), want);
        be.destroy(be.impl);
        print_message("kernel %-8s %2d x %2d  %s\n", k->name, k->mr, k->nr,
                      k->supported() ? "supported: tested" : "not supported here: falls back");
    }
    /* unset, empty, and names that are not a kernel's (case matters) */
    for (i = 0; i < (int)(sizeof asks / sizeof asks[0]); ++i) {
        create_with(ctx, asks[i], &be);
        assert_string_equal(dsgd_cpu_backend_isa(&be), best);
        assert_string_equal(dsgd_cpu_isa(), best);
        be.destroy(be.impl);
    }
    /* portable is always there */
    create_with(ctx, "portable", &be);
    assert_string_equal(dsgd_cpu_backend_isa(&be), "portable");
    be.destroy(be.impl);
    /* not a CPU backend */
    assert_null(dsgd_cpu_backend_isa(NULL));
    memset(&other, 0, sizeof other);
    assert_null(dsgd_cpu_backend_isa(&other));
    /* the widest agrees with the CPU's flags */
#if DSGD__X86_DISPATCH
    if (cpuinfo_has("avx512f") == 1)
        assert_string_equal(best, "avx512");
    else if (cpuinfo_has("avx2") == 1 && cpuinfo_has("fma") == 1)
        assert_string_equal(best, "avx2");
    else if (cpuinfo_has("avx2") == 0)
        assert_string_equal(best, "portable");
#else
    assert_string_equal(best, "portable");
#endif
    print_message("default kernel here: %s (/proc/cpuinfo avx2 %d, fma %d, avx512f %d)\n", best,
                  cpuinfo_has("avx2"), cpuinfo_has("fma"), cpuinfo_has("avx512f"));
    unsetenv("DSGD_CPU_ISA");
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- GEMM */

typedef struct problem {
    int m, n, k, ta, tb, lda, ldb, ldc;
    float alpha, beta;
    float *a, *b, *c0; /* inputs; c0 is C before the call */
} problem;

static float av(const problem *p, int i, int q) {
    return p->ta ? p->a[(size_t)q * p->lda + i] : p->a[(size_t)i * p->lda + q];
}
static float bv(const problem *p, int q, int j) {
    return p->tb ? p->b[(size_t)j * p->ldb + q] : p->b[(size_t)q * p->ldb + j];
}

static void problem_init(problem *p, int m, int n, int k, int ta, int tb, uint64_t seed) {
    size_t na, nb, nc, i;
    p->m = m;
    p->n = n;
    p->k = k;
    p->ta = ta;
    p->tb = tb;
    p->lda = (ta ? m : k) + 3; /* padded rows */
    p->ldb = (tb ? k : n) + 2;
    p->ldc = n + 1;
    p->alpha = 0.75f;
    p->beta = -0.5f;
    na = (size_t)(ta ? k : m) * p->lda;
    nb = (size_t)(tb ? n : k) * p->ldb;
    nc = (size_t)m * p->ldc;
    p->a = (float *)malloc(na * sizeof(float));
    p->b = (float *)malloc(nb * sizeof(float));
    p->c0 = (float *)malloc(nc * sizeof(float));
    assert_non_null(p->a);
    assert_non_null(p->b);
    assert_non_null(p->c0);
    for (i = 0; i < na; ++i) p->a[i] = (float)(2.0 * dsgd_rng_uniform(&seed) - 1.0);
    for (i = 0; i < nb; ++i) p->b[i] = (float)(2.0 * dsgd_rng_uniform(&seed) - 1.0);
    for (i = 0; i < nc; ++i) p->c0[i] = (float)(2.0 * dsgd_rng_uniform(&seed) - 1.0);
}

static void problem_free(problem *p) {
    free(p->a);
    free(p->b);
    free(p->c0);
}

/* The backend's C for p (m x ldc floats, padding included). */
static void run_gemm(dsgd_ctx *ctx, dsgd_backend_i *be, const problem *p, float *out) {
    size_t na = (size_t)(p->ta ? p->k : p->m) * p->lda, nb = (size_t)(p->tb ? p->n : p->k) * p->ldb;
    size_t nc = (size_t)p->m * p->ldc;
    dsgd_buffer *ba, *bb, *bc;
    dsgd_ref ra, rb, rc;
    TU_OK(ctx, be->buffer_create(be->impl, na, &ba));
    TU_OK(ctx, be->buffer_create(be->impl, nb, &bb));
    TU_OK(ctx, be->buffer_create(be->impl, nc, &bc));
    ra.buf = ba;
    rb.buf = bb;
    rc.buf = bc;
    ra.off = rb.off = rc.off = 0;
    TU_OK(ctx, be->write(be->impl, ra, p->a, na));
    TU_OK(ctx, be->write(be->impl, rb, p->b, nb));
    TU_OK(ctx, be->write(be->impl, rc, p->c0, nc));
    TU_OK(ctx, be->gemm(be->impl, p->ta, p->tb, p->m, p->n, p->k, p->alpha, ra, p->lda, rb, p->ldb,
                        p->beta, rc, p->ldc));
    TU_OK(ctx, be->read(be->impl, rc, out, nc));
    be->buffer_destroy(be->impl, ba);
    be->buffer_destroy(be->impl, bb);
    be->buffer_destroy(be->impl, bc);
}

#ifdef DSGD_USE_CBLAS /* cblas_sgemm does the GEMM: its order is its own */
#define DSGD__KC 256
#define ORDER_CHECKED 0
#else
#define ORDER_CHECKED 1
#endif

/* Entry (i, j) in the documented order: beta c (or 0), then per KC block
   c += alpha * (that block's products summed in order), fused or not. */
DSGD__NO_CONTRACT_FN static float emulate(const problem *p, int i, int j, int fused) {
    DSGD__NO_CONTRACT
    float c = p->c0[(size_t)i * p->ldc + j], acc, prod;
    int q0, q;
    c = p->beta == 0.0f ? 0.0f : (p->beta == 1.0f ? c : c * p->beta);
    for (q0 = 0; q0 < p->k; q0 += DSGD__KC) {
        acc = 0.0f;
        for (q = q0; q < p->k && q < q0 + DSGD__KC; ++q) {
            if (fused) {
                acc = fmaf(av(p, i, q), bv(p, q, j), acc);
            } else {
                prod = av(p, i, q) * bv(p, q, j);
                acc = acc + prod;
            }
        }
        prod = p->alpha * acc;
        c = c + prod;
    }
    return c;
}

static const int dims[] = {1, 5, 17, 64, 131};
#define NDIMS ((int)(sizeof dims / sizeof dims[0]))

/* The thin GEMM's shapes (C at most 32 wide and k <= 16, or m <= 256;
   backend_cpu_gemm.h), as convolutions make them: im2col (rows, 9) by W
   (9, out) and im2col^T (k k c, rows) by dy (rows, out), with n one
   vector, two, and part of one, a row tile whole or cut, k in one KC block
   and three; and just past each limit (k = 17, m = 257, n = 33). */
static const int thin_shapes[][3] = {{200, 16, 9}, {9, 16, 600},   {50, 32, 9},   {12, 20, 300},
                                     {13, 7, 16},  {6, 16, 700},   {300, 24, 1},  {40, 16, 17},
                                     {144, 32, 600}, {250, 29, 300}, {257, 16, 40}, {20, 33, 300}};
#define NTHIN ((int)(sizeof thin_shapes / sizeof thin_shapes[0]))

/* Runs p on be twice and checks every entry: near the double reference,
   the bits of the emulated order, the same bits run to run. Returns the
   entries checked. */
static long check_problem(dsgd_ctx *ctx, dsgd_backend_i *be, const char *name, int fused, const problem *pp) {
    const problem *p = pp;
    int m = p->m, n = p->n, k = p->k, i, j, q;
    size_t nc = (size_t)m * p->ldc;
    float *got = (float *)malloc(nc * sizeof(float)), *again = (float *)malloc(nc * sizeof(float));
    long checked = 0;
    assert_non_null(got);
    assert_non_null(again);
    run_gemm(ctx, be, p, got);
    run_gemm(ctx, be, p, again);
    assert_memory_equal(got, again, nc * sizeof(float)); /* run to run */
    for (i = 0; i < m; ++i)
        for (j = 0; j < n; ++j) {
            double ref = 0, mag = 0, c0 = p->beta == 0.0f ? 0.0 : p->c0[(size_t)i * p->ldc + j];
            float g = got[(size_t)i * p->ldc + j], e = emulate(p, i, j, fused);
            for (q = 0; q < k; ++q) {
                double x = (double)av(p, i, q) * bv(p, q, j);
                ref += x;
                mag += fabs(x);
            }
            ref = p->alpha * ref + p->beta * c0;
            mag = fabs(p->alpha) * mag + fabs(p->beta * c0);
            if (!(fabs(g - ref) <= (k + 2) * FLT_EPSILON * mag))
                fail_msg("%s %dx%dx%d ta=%d tb=%d beta=%g C[%d,%d] = %.9g, reference %.9g", name, m, n, k, p->ta,
                         p->tb, (double)p->beta, i, j, (double)g, ref);
            if (ORDER_CHECKED && memcmp(&g, &e, sizeof g))
                fail_msg("%s %dx%dx%d ta=%d tb=%d beta=%g C[%d,%d] = %.9g, not the bits of its order (%.9g)", name,
                         m, n, k, p->ta, p->tb, (double)p->beta, i, j, (double)g, (double)e);
            ++checked;
        }
    for (i = 0; i < m; ++i) /* the padding of C's rows untouched */
        for (j = n; j < p->ldc; ++j)
            if (memcmp(&got[(size_t)i * p->ldc + j], &p->c0[(size_t)i * p->ldc + j], sizeof(float)))
                fail_msg("%s %dx%dx%d ta=%d tb=%d wrote C's padding at [%d,%d]", name, m, n, k, p->ta, p->tb, i, j);
    free(got);
    free(again);
    return checked;
}

/* Every supported kernel, every shape and transpose: near the double
   reference, equal to the emulation of its order, equal to itself; the
   thin shapes with beta 0 as well. */
static void test_kernels_gemm(void **state) {
    dsgd_ctx *ctx = NULL;
    int ki, mi, ni, kk, t, si, ran = 0;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        const dsgd__cpu_kernel *kern = &dsgd__cpu_kernels[ki];
        int fused = strcmp(kern->name, "portable") != 0; /* avx2 and avx512 use FMA */
        dsgd_backend_i be;
        long checked = 0;
        if (!kern->supported()) continue;
        create_with(ctx, kern->name, &be);
        assert_string_equal(dsgd_cpu_backend_isa(&be), kern->name);
        for (mi = 0; mi < NDIMS; ++mi)
            for (ni = 0; ni < NDIMS; ++ni)
                for (kk = 0; kk <= NDIMS; ++kk)
                    for (t = 0; t < 4; ++t) {
                        int m = dims[mi], n = dims[ni], k = kk < NDIMS ? dims[kk] : 300;
                        problem p;
                        if (k == 300 && (m > 17 || n > 17)) continue; /* two KC blocks: a few shapes */
                        /* the quick tier: each (m, n, k) in one transpose, in turns (each
                           size meets every transpose); make test-full runs all four */
                        if (!tu_full() && t != (mi + ni + kk) % 4) continue;
                        problem_init(&p, m, n, k, t & 1, t >> 1, 77u + (uint64_t)(m * 1000003 + n * 1009 + k * 7 + t));
                        checked += check_problem(ctx, &be, kern->name, fused, &p);
                        problem_free(&p);
                    }
        for (si = 0; si < NTHIN; ++si)
            for (t = 0; t < 8; ++t) {
                const int *sh = thin_shapes[si];
                problem p;
                /* the quick tier: each shape in two of the four with B not transposed
                   (the thin GEMM's), A transposed in one of them and beta 0 in one:
                   (ta 1, beta -0.5) and (ta 0, beta 0), or (ta 0, beta -0.5) and
                   (ta 1, beta 0), in turns; make test-full runs all eight */
                if (!tu_full() && ((t & 2) || ((t & 1) ^ (t >> 2)) != !(si & 1))) continue;
                problem_init(&p, sh[0], sh[1], sh[2], t & 1, (t >> 1) & 1, 991u + (uint64_t)(si * 8 + t));
                if (t >> 2) p.beta = 0.0f;
                checked += check_problem(ctx, &be, kern->name, fused, &p);
                problem_free(&p);
            }
        be.destroy(be.impl);
        print_message("kernel %-8s %ld entries: reference and bitwise order checks passed\n",
                      kern->name, checked);
        ++ran;
    }
    assert_true(ran >= 1);
    unsetenv("DSGD_CPU_ISA");
    dsgd_ctx_destroy(ctx);
}

/* The FMA kernels (AVX2's 6 x 16 tiles, AVX-512's 12 x 32) give the same
   bits: the order does not depend on the tile. Skipped unless both run. */
static void test_fma_kernels_agree(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i b2, b5;
    problem p;
    float *c2, *c5;
    size_t nc;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    create_with(ctx, "avx2", &b2);
    create_with(ctx, "avx512", &b5);
    if (!ORDER_CHECKED || strcmp(dsgd_cpu_backend_isa(&b2), "avx2") || strcmp(dsgd_cpu_backend_isa(&b5), "avx512")) {
        print_message("avx2 and avx512 do not both run here: skipped\n");
    } else {
        problem_init(&p, 131, 77, 600, 1, 0, 4242);
        nc = (size_t)p.m * p.ldc;
        c2 = (float *)malloc(nc * sizeof(float));
        c5 = (float *)malloc(nc * sizeof(float));
        assert_non_null(c2);
        assert_non_null(c5);
        run_gemm(ctx, &b2, &p, c2);
        run_gemm(ctx, &b5, &p, c5);
        assert_memory_equal(c2, c5, nc * sizeof(float));
        free(c2);
        free(c5);
        problem_free(&p);
    }
    b2.destroy(b2.impl);
    b5.destroy(b5.impl);
    unsetenv("DSGD_CPU_ISA");
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- element-wise */

/* A buffer of n floats holding src (n may be 0). */
static dsgd_buffer *mkbuf(dsgd_ctx *ctx, dsgd_backend_i *be, const float *src, size_t n) {
    dsgd_buffer *b = NULL;
    dsgd_ref r;
    TU_OK(ctx, be->buffer_create(be->impl, n ? n : 1, &b));
    r.buf = b;
    r.off = 0;
    if (n) TU_OK(ctx, be->write(be->impl, r, src, n));
    return b;
}

static dsgd_ref whole(dsgd_buffer *b) {
    dsgd_ref r;
    r.buf = b;
    r.off = 0;
    return r;
}

static void fill_random(float *x, size_t n, uint64_t seed) {
    size_t i;
    for (i = 0; i < n; ++i) x[i] = (float)(2.0 * dsgd_rng_uniform(&seed) - 1.0);
}

/* Fails unless got and want hold the same bits. */
static void same_bits(const char *kern, const char *what, size_t n, const float *got, const float *want) {
    size_t i;
    for (i = 0; i < n; ++i)
        if (memcmp(got + i, want + i, sizeof(float)))
            fail_msg("%s %s n=%zu [%zu] = %.9g, scalar %.9g", kern, what, n, i, (double)got[i], (double)want[i]);
}

/* Every element-wise operation of every supported kernel, at sizes around
   the 16-element blocks, gives the bits of the scalar formula (written out
   here as the backend states it). */
DSGD__NO_CONTRACT_FN static void test_kernels_elementwise(void **state) {
    DSGD__NO_CONTRACT
    static const size_t sizes[] = {1, 5, 16, 17, 131, 1003};
    dsgd_ctx *ctx = NULL;
    int ki, si, a, kind;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        const dsgd__cpu_kernel *kern = &dsgd__cpu_kernels[ki];
        dsgd_backend_i be;
        if (!kern->supported()) continue;
        create_with(ctx, kern->name, &be);
        for (si = 0; si < (int)(sizeof sizes / sizeof sizes[0]); ++si) {
            size_t n = sizes[si], i;
            float *x = (float *)malloc(n * sizeof(float)), *y = (float *)malloc(n * sizeof(float));
            float *m1 = (float *)malloc(n * sizeof(float)), *m2 = (float *)malloc(n * sizeof(float));
            float *want = (float *)malloc(4 * n * sizeof(float)), *got = (float *)malloc(4 * n * sizeof(float));
            dsgd_buffer *bx, *by, *b1, *b2;
            assert_true(x && y && m1 && m2 && want && got);
            fill_random(x, n, 11 + n);
            fill_random(y, n, 12 + n);
            fill_random(m1, n, 13 + n);
            for (i = 0; i < n; ++i) m2[i] = fabsf(y[i]) * 0.5f; /* a second moment is >= 0 */
            bx = mkbuf(ctx, &be, x, n);
            by = mkbuf(ctx, &be, y, n);
            /* scale, axpy */
            TU_OK(ctx, be.scale(be.impl, whole(bx), -1.37f, n));
            TU_OK(ctx, be.read(be.impl, whole(bx), got, n));
            for (i = 0; i < n; ++i) want[i] = x[i] * -1.37f;
            same_bits(kern->name, "scale", n, got, want);
            TU_OK(ctx, be.write(be.impl, whole(bx), x, n));
            TU_OK(ctx, be.axpy(be.impl, whole(by), 0.61f, whole(bx), n));
            TU_OK(ctx, be.read(be.impl, whole(by), got, n));
            for (i = 0; i < n; ++i) {
                float t = 0.61f * x[i];
                want[i] = y[i] + t;
            }
            same_bits(kern->name, "axpy", n, got, want);
            /* act_backward: dy = y, derivative at x (as the activation's output) */
            for (a = DSGD_ACT_NONE; a <= DSGD_ACT_SIGMOID; ++a) {
                TU_OK(ctx, be.write(be.impl, whole(by), y, n));
                TU_OK(ctx, be.act_backward(be.impl, (dsgd_activation)a, whole(by), whole(bx), n));
                TU_OK(ctx, be.read(be.impl, whole(by), got, n));
                for (i = 0; i < n; ++i) {
                    float d = y[i], t;
                    if (a == DSGD_ACT_RELU) d = x[i] > 0.0f ? d : 0.0f;
                    if (a == DSGD_ACT_TANH) { t = x[i] * x[i]; t = 1.0f - t; d = d * t; }
                    if (a == DSGD_ACT_SIGMOID) { t = 1.0f - x[i]; t = x[i] * t; d = d * t; }
                    want[i] = d;
                }
                same_bits(kern->name, "act_backward", n, got, want);
            }
            /* bias_act_forward on a 3 x n matrix, with and without bias */
            {
                float *mat = (float *)malloc(3 * n * sizeof(float));
                dsgd_buffer *bm;
                dsgd_ref nobias;
                int r, withb;
                assert_non_null(mat);
                fill_random(mat, 3 * n, 14 + n);
                bm = mkbuf(ctx, &be, mat, 3 * n);
                nobias.buf = NULL;
                nobias.off = 0;
                for (withb = 0; withb < 2; ++withb)
                    for (a = DSGD_ACT_NONE; a <= DSGD_ACT_SIGMOID; ++a) {
                        TU_OK(ctx, be.write(be.impl, whole(bm), mat, 3 * n));
                        TU_OK(ctx, be.bias_act_forward(be.impl, (dsgd_activation)a, whole(bm),
                                                       withb ? whole(bx) : nobias, 3, (int)n));
                        TU_OK(ctx, be.read(be.impl, whole(bm), got, 3 * n));
                        for (r = 0; r < 3; ++r)
                            for (i = 0; i < n; ++i) {
                                float v = mat[r * n + i];
                                if (withb) v = v + x[i];
                                want[r * n + i] = dsgd__act((dsgd_activation)a, v);
                            }
                        same_bits(kern->name, "bias_act_forward", 3 * n, got, want);
                    }
                /* bias_backward: column sums of the 3 x n matrix, rows in order */
                TU_OK(ctx, be.write(be.impl, whole(bm), mat, 3 * n));
                TU_OK(ctx, be.bias_backward(be.impl, whole(bx), whole(bm), 3, (int)n));
                TU_OK(ctx, be.read(be.impl, whole(bx), got, n));
                for (i = 0; i < n; ++i) {
                    float sum = 0.0f;
                    for (r = 0; r < 3; ++r) sum = sum + mat[r * n + i];
                    want[i] = sum;
                }
                same_bits(kern->name, "bias_backward", n, got, want);
                be.buffer_destroy(be.impl, bm);
                free(mat);
            }
            /* optimizer_update: every kind, Nesterov both ways */
            b1 = mkbuf(ctx, &be, m1, n);
            b2 = mkbuf(ctx, &be, m2, n);
            for (kind = 0; kind < 5; ++kind) {
                dsgd_opt_update u;
                memset(&u, 0, sizeof u);
                u.kind = kind < 3 ? (kind == 0 ? DSGD_OPT_SGD : DSGD_OPT_MOMENTUM)
                                  : (kind == 3 ? DSGD_OPT_ADAM : DSGD_OPT_ADAMW);
                u.nesterov = kind == 2;
                u.lr = 0.03f;
                u.momentum = 0.9f;
                u.beta1 = 0.9f;
                u.beta2 = 0.999f;
                u.eps = 1e-8f;
                u.weight_decay = 0.01f;
                u.bias_correction1 = 0.19f;
                u.bias_correction2 = 0.0199f;
                u.grad_scale = 0.7f;
                TU_OK(ctx, be.write(be.impl, whole(bx), x, n));
                TU_OK(ctx, be.write(be.impl, whole(by), y, n));
                TU_OK(ctx, be.write(be.impl, whole(b1), m1, n));
                TU_OK(ctx, be.write(be.impl, whole(b2), m2, n));
                TU_OK(ctx, be.optimizer_update(be.impl, &u, whole(bx), whole(by), whole(b1), whole(b2), n));
                TU_OK(ctx, be.read(be.impl, whole(bx), got, n));
                TU_OK(ctx, be.read(be.impl, whole(b1), got + n, n));
                TU_OK(ctx, be.read(be.impl, whole(b2), got + 2 * n, n));
                for (i = 0; i < n; ++i) { /* the backend's formulas, one rounding per operation */
                    float p = x[i], g = y[i], v1 = m1[i], v2 = m2[i], gi, t;
                    if (u.kind == DSGD_OPT_SGD) {
                        gi = g * u.grad_scale; t = u.weight_decay * p; gi = gi + t;
                        t = u.lr * gi; p = p - t;
                    } else if (u.kind == DSGD_OPT_MOMENTUM) {
                        gi = g * u.grad_scale; t = u.weight_decay * p; gi = gi + t;
                        t = u.momentum * v1; v1 = t + gi;
                        if (u.nesterov) { t = u.momentum * v1; t = gi + t; } else t = v1;
                        t = u.lr * t; p = p - t;
                    } else {
                        int dec = u.kind == DSGD_OPT_ADAMW;
                        float mh, vh;
                        gi = g * u.grad_scale; t = dec ? 0.0f : u.weight_decay * p; gi = gi + t;
                        t = (1.0f - u.beta1) * gi; v1 = u.beta1 * v1 + t;
                        t = (1.0f - u.beta2) * gi; t = t * gi; v2 = u.beta2 * v2 + t;
                        mh = v1 / u.bias_correction1;
                        vh = v2 / u.bias_correction2;
                        t = sqrtf(vh) + u.eps; t = mh / t;
                        t = t + (dec ? u.weight_decay * p : 0.0f);
                        t = u.lr * t; p = p - t;
                    }
                    want[i] = p;
                    want[n + i] = u.kind == DSGD_OPT_SGD ? m1[i] : v1;
                    want[2 * n + i] = u.kind == DSGD_OPT_ADAM || u.kind == DSGD_OPT_ADAMW ? v2 : m2[i];
                }
                same_bits(kern->name, "optimizer_update", 3 * n, got, want);
            }
            /* norm_check: finite, then one infinity and one NaN */
            {
                size_t bad = 99;
                double ss = 0;
                TU_OK(ctx, be.write(be.impl, whole(bx), x, n));
                TU_OK(ctx, be.norm_check(be.impl, whole(bx), n, NULL, &bad));
                assert_int_equal(bad, 0);
                x[n - 1] = INFINITY;
                x[n / 2] = NAN;
                TU_OK(ctx, be.write(be.impl, whole(bx), x, n));
                TU_OK(ctx, be.norm_check(be.impl, whole(bx), n, NULL, &bad));
                assert_int_equal(bad, n == 1 ? 1 : 2);
                TU_OK(ctx, be.norm_check(be.impl, whole(bx), n, &ss, &bad));
                assert_int_equal(bad, n == 1 ? 1 : 2);
            }
            be.buffer_destroy(be.impl, bx);
            be.buffer_destroy(be.impl, by);
            be.buffer_destroy(be.impl, b1);
            be.buffer_destroy(be.impl, b2);
            free(x);
            free(y);
            free(m1);
            free(m2);
            free(want);
            free(got);
        }
        be.destroy(be.impl);
        print_message("kernel %-8s element-wise operations: scalar bits\n", kern->name);
    }
    unsetenv("DSGD_CPU_ISA");
    dsgd_ctx_destroy(ctx);
}

/* maxpool_backward from its definition (backend.h): dx = 0.0f, then every
   window, (oy, ox) ascending, adds its dy to its first (ky, kx) element
   equal to y (the first NaN for a NaN y). */
static void ref_pool_back(const dsgd_window *wd, const float *x, const float *y, const float *dy, float *dx) {
    const int oh = (wd->h - wd->kh) / wd->stride + 1, ow = (wd->w - wd->kw) / wd->stride + 1;
    int i, oy, ox, ch, ky, kx, done;
    size_t e;
    for (e = 0; e < (size_t)wd->n * wd->h * wd->w * wd->c; ++e) dx[e] = 0.0f;
    for (i = 0, e = 0; i < wd->n; ++i)
        for (oy = 0; oy < oh; ++oy)
            for (ox = 0; ox < ow; ++ox)
                for (ch = 0; ch < wd->c; ++ch, ++e)
                    for (ky = 0, done = 0; ky < wd->kh && !done; ++ky)
                        for (kx = 0; kx < wd->kw && !done; ++kx) {
                            size_t at = (((size_t)i * wd->h + (size_t)(oy * wd->stride + ky)) * wd->w +
                                         (size_t)(ox * wd->stride + kx)) * wd->c + (size_t)ch;
                            if (isnan(y[e]) ? isnan(x[at]) : x[at] == y[e]) {
                                dx[at] += dy[e];
                                done = 1;
                            }
                        }
}

/* One maxpool_backward case on backend be: x from a few values (ties,
   signed zeros, and NaN where nan), y from maxpool_forward, dy random with
   some -0.0f; dx bit for bit against ref_pool_back. Returns the floats
   checked. */
static size_t pool_back_case(dsgd_ctx *ctx, dsgd_backend_i *be, const dsgd_window *wd, int nan, tu_rng *rng) {
    static const float vals[6] = {-1.0f, -0.0f, 0.0f, 0.5f, 1.0f, 2.0f};
    const int oh = (wd->h - wd->kh) / wd->stride + 1, ow = (wd->w - wd->kw) / wd->stride + 1;
    const size_t nx = (size_t)wd->n * wd->h * wd->w * wd->c, ny = (size_t)wd->n * oh * ow * wd->c;
    float *x = tu_floats(nx), *y = tu_floats(ny), *dy = tu_floats(ny), *dx = tu_floats(nx), *want = tu_floats(nx);
    dsgd_buffer *bx, *by, *bdy, *bdx;
    size_t e;
    for (e = 0; e < nx; ++e) x[e] = nan && tu_below(rng, 13) == 0 ? NAN : vals[tu_below(rng, 6)];
    for (e = 0; e < ny; ++e) dy[e] = tu_below(rng, 9) == 0 ? -0.0f : tu_uniform(rng, -1.0f, 1.0f);
    for (e = 0; e < nx; ++e) dx[e] = 99.0f; /* dx is overwritten, whatever it held */
    bx = mkbuf(ctx, be, x, nx);
    by = mkbuf(ctx, be, dy, ny); /* overwritten by maxpool_forward */
    bdy = mkbuf(ctx, be, dy, ny);
    bdx = mkbuf(ctx, be, dx, nx);
    TU_OK(ctx, be->maxpool_forward(be->impl, wd, whole(bx), whole(by)));
    TU_OK(ctx, be->read(be->impl, whole(by), y, ny));
    TU_OK(ctx, be->maxpool_backward(be->impl, wd, whole(bx), whole(by), whole(bdy), whole(bdx)));
    TU_OK(ctx, be->read(be->impl, whole(bdx), dx, nx));
    ref_pool_back(wd, x, y, dy, want);
    for (e = 0; e < nx; ++e)
        if (memcmp(&dx[e], &want[e], sizeof(float)) != 0)
            fail_msg("%s maxpool_backward n=%d h=%d w=%d c=%d k=%dx%d stride=%d nan=%d: dx[%zu] = %a, want %a",
                     dsgd_cpu_backend_isa(be), wd->n, wd->h, wd->w, wd->c, wd->kh, wd->kw, wd->stride, nan, e,
                     (double)dx[e], (double)want[e]);
    be->buffer_destroy(be->impl, bx);
    be->buffer_destroy(be->impl, by);
    be->buffer_destroy(be->impl, bdy);
    be->buffer_destroy(be->impl, bdx);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(want);
    return nx;
}

/* maxpool_backward under every supported kernel, on 1 and 3 threads,
   against its definition: windows apart (the kernels' pool_back: 2x2
   stride 2, 3x3 stride 3, gaps between windows and past the last) and
   overlapping (stride < the window), channels 1 to 131 (pool_back takes
   64 at a time), heights and widths odd and even, ties and NaN; the large
   shapes are cut across the threads inside a band of windows. */
static void test_kernels_maxpool_backward(void **state) {
    static const int win[][3] = {{2, 2, 2}, {3, 3, 3}, {2, 2, 3}, {1, 2, 3}, {1, 1, 1}, {3, 2, 3}, {3, 3, 2}, {2, 2, 1}};
    static const int chans[] = {1, 3, 16, 17, 32, 64, 70, 131};
    static const int big[][4] = {{1, 27, 29, 70}, {2, 28, 28, 16}, {1, 41, 33, 32}}; /* n h w c */
    dsgd_ctx *ctx = NULL;
    int ki, t, ran = 0;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    for (ki = 0; ki < NKERNELS; ++ki) {
        const dsgd__cpu_kernel *kern = &dsgd__cpu_kernels[ki];
        if (!kern->supported()) continue;
        for (t = 1; t <= 3; t += 2) {
            dsgd_cpu_backend_desc bd;
            dsgd_backend_i be;
            tu_rng rng = tu_rng_make(4242u + (uint64_t)ki * 10u + (uint64_t)t);
            size_t checked = 0;
            int k, w;
            memset(&bd, 0, sizeof bd);
            bd.threads = t;
            assert_int_equal(setenv("DSGD_CPU_ISA", kern->name, 1), 0);
            TU_OK(ctx, dsgd_cpu_backend_create_desc(ctx, &bd, &be));
            assert_string_equal(dsgd_cpu_backend_isa(&be), kern->name);
            /* the quick tier: 20 random small shapes and each large one in half the
               windows (in turns); make test-full: 60 and every window */
            for (k = 0; k < TU_PICK(60, 20); ++k) { /* random small shapes */
                dsgd_window wd;
                const int *wi = win[tu_below(&rng, sizeof win / sizeof win[0])];
                memset(&wd, 0, sizeof wd);
                wd.n = 1 + (int)tu_below(&rng, 3);
                wd.kh = wi[0];
                wd.kw = wi[1];
                wd.stride = wi[2];
                wd.h = wd.kh + (int)tu_below(&rng, 10);
                wd.w = wd.kw + (int)tu_below(&rng, 10);
                wd.c = chans[tu_below(&rng, sizeof chans / sizeof chans[0])];
                checked += pool_back_case(ctx, &be, &wd, k & 1, &rng);
            }
            for (k = 0; k < (int)(sizeof big / sizeof big[0]); ++k)
                for (w = 0; w < (int)(sizeof win / sizeof win[0]); ++w) {
                    dsgd_window wd;
                    if (!tu_full() && (w + k) % 2) continue;
                    memset(&wd, 0, sizeof wd);
                    wd.n = big[k][0];
                    wd.h = big[k][1];
                    wd.w = big[k][2];
                    wd.c = big[k][3];
                    wd.kh = win[w][0];
                    wd.kw = win[w][1];
                    wd.stride = win[w][2];
                    checked += pool_back_case(ctx, &be, &wd, w & 1, &rng);
                }
            be.destroy(be.impl);
            print_message("kernel %-8s threads %d: maxpool_backward, %zu floats bit for bit\n", kern->name, t,
                          checked);
            ++ran;
        }
    }
    assert_true(ran >= 2);
    unsetenv("DSGD_CPU_ISA");
    dsgd_ctx_destroy(ctx);
}

/* The element-wise kernels take restrict arrays: overlapping ranges are
   refused (y += alpha y is allowed). */
static void test_overlap_refused(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i be;
    dsgd_buffer *b;
    dsgd_ref r0, r1;
    dsgd_opt_update u;
    float v[40], got[40];
    int i;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
    for (i = 0; i < 40; ++i) v[i] = (float)i;
    b = mkbuf(ctx, &be, v, 40);
    r0 = whole(b);
    r1 = r0;
    r1.off = 10;
    assert_int_equal(be.act_backward(be.impl, DSGD_ACT_RELU, r0, r1, 20), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "overlap"));
    assert_int_equal(be.axpy(be.impl, r0, 1.0f, r1, 20), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(be.bias_backward(be.impl, r1, r0, 2, 10), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(be.bias_act_forward(be.impl, DSGD_ACT_RELU, r0, r1, 2, 10), DSGD_ERR_INVALID_ARGUMENT);
    memset(&u, 0, sizeof u);
    u.kind = DSGD_OPT_SGD;
    u.lr = 0.1f;
    u.grad_scale = 1.0f;
    assert_int_equal(be.optimizer_update(be.impl, &u, r0, r1, r0, r0, 20), DSGD_ERR_INVALID_ARGUMENT);
    /* disjoint halves are fine, and y += 2 y */
    TU_OK(ctx, be.act_backward(be.impl, DSGD_ACT_RELU, r0, r1, 10));
    TU_OK(ctx, be.axpy(be.impl, r1, 2.0f, r1, 30));
    TU_OK(ctx, be.read(be.impl, r1, got, 30));
    for (i = 0; i < 30; ++i) assert_true(got[i] == 3.0f * (float)(i + 10));
    be.buffer_destroy(be.impl, b);
    be.destroy(be.impl);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_fallback),
        cmocka_unit_test(test_kernels_gemm),
        cmocka_unit_test(test_fma_kernels_agree),
        cmocka_unit_test(test_kernels_elementwise),
        cmocka_unit_test(test_kernels_maxpool_backward),
        cmocka_unit_test(test_overlap_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
