/* test_cpu_isa.c - the CPU backend's run-time GEMM kernels (CPU KERNELS in
   distsgd/backend.h).

   Every kernel this machine supports is forced through DSGD_CPU_ISA (the
   backend reads it at creation) and checked:
   - its name: dsgd_cpu_backend_isa and dsgd_cpu_isa report it; a kernel the
     CPU lacks, an unknown name, "" and no variable give the widest supported
     one; the widest agrees with the flags of /proc/cpuinfo where there is one;
   - against a double-precision GEMM, m, n, k in {1, 5, 17, 64, 131} (and
     k = 300, two KC blocks), all four transposes, padded leading dimensions,
     alpha = 0.75, beta = -0.5 over a random C: |C - ref| <= (k + 2) eps
     (|alpha| sum |a||b| + |beta c|) per element (eps = FLT_EPSILON, twice
     the rounding bound of a length-k dot product);
   - bit for bit against a float emulation of the documented order: per KC
     block, acc = sum over p in order (fmaf for the FMA kernels, a rounded
     product then a rounded sum for the portable one), then C += alpha acc;
     so the two FMA kernels agree bit for bit with each other, and every
     kernel with itself from run to run (checked too).
   The kernels that ran are printed. The emulation assumes a build that does
   not contract a * b + c (the Makefile's -std=c99; see DSGD__NO_CONTRACT).

   Build: make test (or cc -std=c99 tests/test_cpu_isa.c -lcmocka -lm -lpthread). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#ifndef DSGD_USE_CBLAS

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

/* Entry (i, j) in the documented order: beta c (or 0), then per KC block
   c += alpha * (that block's products summed in order), fused or not. */
static float emulate(const problem *p, int i, int j, int fused) {
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

/* Every supported kernel, every shape and transpose: near the double
   reference, equal to the emulation of its order, equal to itself. */
static void test_kernels_gemm(void **state) {
    dsgd_ctx *ctx = NULL;
    int ki, mi, ni, kk, t, ran = 0;
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
                        int m = dims[mi], n = dims[ni], k = kk < NDIMS ? dims[kk] : 300, i, j, q;
                        problem p;
                        float *got, *again;
                        size_t nc = (size_t)m * (n + 1);
                        if (k == 300 && (m > 17 || n > 17)) continue; /* two KC blocks: a few shapes */
                        problem_init(&p, m, n, k, t & 1, t >> 1, 77u + (uint64_t)(m * 1000003 + n * 1009 + k * 7 + t));
                        got = (float *)malloc(nc * sizeof(float));
                        again = (float *)malloc(nc * sizeof(float));
                        assert_non_null(got);
                        assert_non_null(again);
                        run_gemm(ctx, &be, &p, got);
                        run_gemm(ctx, &be, &p, again);
                        assert_memory_equal(got, again, nc * sizeof(float)); /* run to run */
                        for (i = 0; i < m; ++i)
                            for (j = 0; j < n; ++j) {
                                double ref = 0, mag = 0, c0 = p.c0[(size_t)i * p.ldc + j];
                                float g = got[(size_t)i * p.ldc + j], e = emulate(&p, i, j, fused);
                                for (q = 0; q < k; ++q) {
                                    double x = (double)av(&p, i, q) * bv(&p, q, j);
                                    ref += x;
                                    mag += fabs(x);
                                }
                                ref = p.alpha * ref + p.beta * c0;
                                mag = fabs(p.alpha) * mag + fabs(p.beta * c0);
                                if (!(fabs(g - ref) <= (k + 2) * FLT_EPSILON * mag))
                                    fail_msg("%s %dx%dx%d ta=%d tb=%d C[%d,%d] = %.9g, reference %.9g",
                                             kern->name, m, n, k, p.ta, p.tb, i, j, (double)g, ref);
                                if (memcmp(&g, &e, sizeof g))
                                    fail_msg("%s %dx%dx%d ta=%d tb=%d C[%d,%d] = %.9g, not the bits of "
                                             "its order (%.9g)", kern->name, m, n, k, p.ta, p.tb, i, j,
                                             (double)g, (double)e);
                                ++checked;
                            }
                        free(got);
                        free(again);
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
    if (strcmp(dsgd_cpu_backend_isa(&b2), "avx2") || strcmp(dsgd_cpu_backend_isa(&b5), "avx512")) {
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

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_fallback),
        cmocka_unit_test(test_kernels_gemm),
        cmocka_unit_test(test_fma_kernels_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* DSGD_USE_CBLAS: no built-in kernels; the backend says "cblas" */

static void test_cblas_name(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i be;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
    assert_string_equal(dsgd_cpu_backend_isa(&be), "cblas");
    assert_string_equal(dsgd_cpu_isa(), "cblas");
    be.destroy(be.impl);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_cblas_name)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#endif
