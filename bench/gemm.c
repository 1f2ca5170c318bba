/* bench/gemm.c - GFLOP/s of the CPU backend's GEMM at the MLP's shapes.

   The shapes are those of a 784-512-10 MLP at batch 256 (m x n x k, row-major,
   C = op(A) op(B)):
     fc1 forward   Y  = X W      256 x 512 x 784   NN
     fc1 backward  dW = X^T dY   784 x 512 x 256   TN
                   dX = dY W^T   256 x 784 x 512   NT
     fc2 forward   256 x 10 x 512 NN, backward 512 x 10 x 256 TN, 256 x 512 x 10 NT

   Each shape: one warm-up call, then the median of REPEATS timed samples (each
   sample averages enough calls to last ~20 ms). When built with
   -DDSGD_HAVE_OPENBLAS (the Makefile adds it, and -lopenblas, when OpenBLAS is
   installed), cblas_sgemm is timed at the same shapes in the same run and the
   ratio ours/OpenBLAS printed; its result is compared with ours first (max
   |ours - openblas| / max |openblas|). OpenBLAS runs on OPENBLAS_NUM_THREADS
   threads (default 1, matching our single-threaded GEMM). Every run also
   spot-checks 64 entries per shape against a double-precision dot product.

   The CPU backend picks its GEMM micro-kernel at run time (the widest the CPU
   has; DSGD_CPU_ISA=portable|avx2|avx512 asks for one), and the first line and
   every result line say which ran.

   Usage: build/bench/gemm [REPEATS]      (make bench; default REPEATS = 7)
   Output: a table, then one line per shape:
     gemm shape=MxNxK trans=NN ours_gflops=... openblas_gflops=... ratio=... kernel=... */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#ifdef DSGD_HAVE_OPENBLAS
#include <cblas.h>
extern void openblas_set_num_threads(int);
#endif

typedef struct shape {
    int m, n, k, ta, tb;
    const char *what;
} shape;

static const shape shapes[] = {
    {256, 512, 784, 0, 0, "fc1 forward  Y = X W"},
    {784, 512, 256, 1, 0, "fc1 backward dW = X^T dY"},
    {256, 784, 512, 0, 1, "fc1 backward dX = dY W^T"},
    {256, 10, 512, 0, 0, "fc2 forward  Y = X W"},
    {512, 10, 256, 1, 0, "fc2 backward dW = X^T dY"},
    {256, 512, 10, 0, 1, "fc2 backward dX = dY W^T"},
};

#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static void die(dsgd_ctx *ctx, const char *what, dsgd_result r) {
    fprintf(stderr, "gemm bench: %s failed: %s: %s\n", what, dsgd_result_string(r),
            ctx ? dsgd_ctx_last_error(ctx) : "");
    exit(1);
}

typedef struct run_ctx {
    dsgd_ctx *ctx;
    dsgd_backend_i be;
    const shape *s;
    dsgd_ref a, b, c;
    const float *ha, *hb;
    float *hc;
    int lda, ldb, ldc;
} run_ctx;

static void call_ours(run_ctx *r) {
    dsgd_result res = r->be.gemm(r->be.impl, r->s->ta, r->s->tb, r->s->m, r->s->n, r->s->k, 1.0f,
                                 r->a, r->lda, r->b, r->ldb, 0.0f, r->c, r->ldc);
    if (res == DSGD_OK && r->be.finish) res = r->be.finish(r->be.impl);
    if (res != DSGD_OK) die(r->ctx, "backend gemm", res);
}

#ifdef DSGD_HAVE_OPENBLAS
static void call_openblas(run_ctx *r) {
    cblas_sgemm(CblasRowMajor, r->s->ta ? CblasTrans : CblasNoTrans,
                r->s->tb ? CblasTrans : CblasNoTrans, r->s->m, r->s->n, r->s->k, 1.0f, r->ha,
                r->lda, r->hb, r->ldb, 0.0f, r->hc, r->ldc);
}
#endif

/* Median seconds per call of fn over `repeats` samples, after one warm-up. */
static double time_median(void (*fn)(run_ctx *), run_ctx *r, int repeats) {
    double t0, once, samples[64];
    int inner = 1, i, j;
    fn(r); /* warm-up */
    t0 = dsgd_now();
    fn(r);
    once = dsgd_now() - t0;
    if (once < 0.02) inner = (int)(0.02 / (once > 1e-7 ? once : 1e-7)) + 1;
    if (inner > 10000) inner = 10000;
    for (i = 0; i < repeats; ++i) {
        t0 = dsgd_now();
        for (j = 0; j < inner; ++j) fn(r);
        samples[i] = (dsgd_now() - t0) / inner;
    }
    qsort(samples, (size_t)repeats, sizeof samples[0], bench_cmp_double);
    return samples[repeats / 2];
}

/* Largest error of 64 sampled entries of c against a double dot product,
   relative to sum |a||b| of that entry. */
static double spot_check(const run_ctx *r, const float *c) {
    const shape *s = r->s;
    uint64_t st = 12345;
    double worst = 0;
    int t, p;
    for (t = 0; t < 64; ++t) {
        int i = (int)(dsgd_rng_next(&st) % (uint64_t)s->m), j = (int)(dsgd_rng_next(&st) % (uint64_t)s->n);
        double acc = 0, mag = 0, e;
        for (p = 0; p < s->k; ++p) {
            double av = s->ta ? r->ha[(size_t)p * r->lda + i] : r->ha[(size_t)i * r->lda + p];
            double bv = s->tb ? r->hb[(size_t)j * r->ldb + p] : r->hb[(size_t)p * r->ldb + j];
            acc += av * bv;
            mag += fabs(av * bv);
        }
        e = fabs(c[(size_t)i * r->ldc + j] - acc) / (mag > 0 ? mag : 1);
        if (e > worst) worst = e;
    }
    return worst;
}

/* The CPU backend's kernel name ("?" for another backend). */
static const char *cpu_kernel(const dsgd_backend_i *be) {
    const char *k = dsgd_cpu_backend_isa(be);
    return k ? k : "?";
}

int main(int argc, char **argv) {
    int repeats = 7, si, threads = 1;
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i be;
    dsgd_result res;
    double ours_gf[NSHAPES], blas_gf[NSHAPES], relerr[NSHAPES], spot[NSHAPES];
    int have_blas = 0, failed = 0;

    if (argc > 1) {
        repeats = atoi(argv[1]);
        if (repeats < 5) repeats = 5;
        if (repeats > 64) repeats = 64;
    }
#ifdef DSGD_HAVE_OPENBLAS
    have_blas = 1;
    {
        const char *e = getenv("OPENBLAS_NUM_THREADS");
        if (e && atoi(e) > 0) threads = atoi(e);
        openblas_set_num_threads(threads);
    }
#endif
    if ((res = dsgd_ctx_create(NULL, &ctx)) != DSGD_OK) die(NULL, "dsgd_ctx_create", res);
    if ((res = dsgd_cpu_backend_create(ctx, &be)) != DSGD_OK) die(ctx, "dsgd_cpu_backend_create", res);

    printf("distsgd %s GEMM bench: backend '%s'%s%s, single-threaded; %d repeats (median)\n",
           DISTSGD_VERSION_STRING, be.name,
#ifdef DSGD_USE_CBLAS
           " (DSGD_USE_CBLAS: routed to cblas_sgemm)", "",
#else
           " (blocked GEMM), micro-kernel ", cpu_kernel(&be),
#endif
           repeats);
    if (getenv("DSGD_CPU_ISA"))
        printf("DSGD_CPU_ISA=%s (a kernel the CPU lacks gives its widest)\n", getenv("DSGD_CPU_ISA"));
    if (have_blas)
        printf("OpenBLAS cblas_sgemm on %d thread%s (OPENBLAS_NUM_THREADS)\n", threads,
               threads == 1 ? "" : "s");
    else
        printf("OpenBLAS: not built in (no -DDSGD_HAVE_OPENBLAS); no comparison\n");

    for (si = 0; si < NSHAPES; ++si) {
        const shape *s = &shapes[si];
        const int ar = s->ta ? s->k : s->m, ac = s->ta ? s->m : s->k;
        const int br = s->tb ? s->n : s->k, bc = s->tb ? s->k : s->n;
        const size_t na = (size_t)ar * ac, nb = (size_t)br * bc, nc = (size_t)s->m * s->n;
        float *ha = (float *)malloc(na * sizeof(float)), *hb = (float *)malloc(nb * sizeof(float));
        float *hc = (float *)malloc(nc * sizeof(float)), *ours = (float *)malloc(nc * sizeof(float));
        dsgd_buffer *ba = NULL, *bb = NULL, *bcb = NULL;
        run_ctx r;
        uint64_t st = 1000 + (uint64_t)si;
        size_t i;
        double flops = 2.0 * s->m * s->n * s->k, t;

        if (!ha || !hb || !hc || !ours) die(NULL, "malloc", DSGD_ERR_OUT_OF_MEMORY);
        for (i = 0; i < na; ++i) ha[i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
        for (i = 0; i < nb; ++i) hb[i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
        if ((res = be.buffer_create(be.impl, na, &ba)) != DSGD_OK ||
            (res = be.buffer_create(be.impl, nb, &bb)) != DSGD_OK ||
            (res = be.buffer_create(be.impl, nc, &bcb)) != DSGD_OK)
            die(ctx, "buffer_create", res);
        memset(&r, 0, sizeof r);
        r.ctx = ctx;
        r.be = be;
        r.s = s;
        r.a.buf = ba;
        r.b.buf = bb;
        r.c.buf = bcb;
        r.ha = ha;
        r.hb = hb;
        r.hc = hc;
        r.lda = ac;
        r.ldb = bc;
        r.ldc = s->n;
        if ((res = be.write(be.impl, r.a, ha, na)) != DSGD_OK ||
            (res = be.write(be.impl, r.b, hb, nb)) != DSGD_OK)
            die(ctx, "write", res);

        /* correctness first */
        call_ours(&r);
        if ((res = be.read(be.impl, r.c, ours, nc)) != DSGD_OK) die(ctx, "read", res);
        spot[si] = spot_check(&r, ours);
        relerr[si] = -1;
#ifdef DSGD_HAVE_OPENBLAS
        {
            double md = 0, mx = 0;
            call_openblas(&r);
            for (i = 0; i < nc; ++i) {
                double d = fabs((double)ours[i] - hc[i]);
                if (d > md) md = d;
                if (fabs(hc[i]) > mx) mx = fabs(hc[i]);
            }
            relerr[si] = md / (mx > 0 ? mx : 1);
        }
#endif
        if (spot[si] > 1e-5 || relerr[si] > 1e-4) {
            fprintf(stderr, "gemm bench: %dx%dx%d %c%c: wrong result (spot error %.3g, vs OpenBLAS %.3g)\n",
                    s->m, s->n, s->k, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', spot[si], relerr[si]);
            failed = 1;
        }

        t = time_median(call_ours, &r, repeats);
        ours_gf[si] = flops / t * 1e-9;
        blas_gf[si] = 0;
#ifdef DSGD_HAVE_OPENBLAS
        t = time_median(call_openblas, &r, repeats);
        blas_gf[si] = flops / t * 1e-9;
#endif
        be.buffer_destroy(be.impl, ba);
        be.buffer_destroy(be.impl, bb);
        be.buffer_destroy(be.impl, bcb);
        free(ha);
        free(hb);
        free(hc);
        free(ours);
    }

    printf("\n%-26s %-15s %-5s %12s %14s %13s %11s\n", "operation", "m x n x k", "trans",
           "ours GFLOP/s", "OpenBLAS GF/s", "ours/OpenBLAS", "max rel err");
    for (si = 0; si < NSHAPES; ++si) {
        const shape *s = &shapes[si];
        char dims[32], tr[3];
        snprintf(dims, sizeof dims, "%dx%dx%d", s->m, s->n, s->k);
        tr[0] = s->ta ? 'T' : 'N';
        tr[1] = s->tb ? 'T' : 'N';
        tr[2] = 0;
        if (have_blas)
            printf("%-26s %-15s %-5s %12.2f %14.2f %13.3f %11.2e\n", s->what, dims, tr, ours_gf[si],
                   blas_gf[si], ours_gf[si] / blas_gf[si], relerr[si]);
        else
            printf("%-26s %-15s %-5s %12.2f %14s %13s %11.2e\n", s->what, dims, tr, ours_gf[si], "-",
                   "-", spot[si]);
    }
    printf("\n");
    for (si = 0; si < NSHAPES; ++si) {
        const shape *s = &shapes[si];
        if (have_blas)
            printf("gemm shape=%dx%dx%d trans=%c%c ours_gflops=%.3f openblas_gflops=%.3f "
                   "ratio=%.4f max_rel_err=%.3e threads=%d kernel=%s\n",
                   s->m, s->n, s->k, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', ours_gf[si], blas_gf[si],
                   ours_gf[si] / blas_gf[si], relerr[si], threads, cpu_kernel(&be));
        else
            printf("gemm shape=%dx%dx%d trans=%c%c ours_gflops=%.3f openblas_gflops=na ratio=na "
                   "max_rel_err=%.3e threads=1 kernel=%s\n",
                   s->m, s->n, s->k, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', ours_gf[si], spot[si],
                   cpu_kernel(&be));
    }

    if (be.destroy) be.destroy(be.impl);
    dsgd_ctx_destroy(ctx);
    return failed;
}
