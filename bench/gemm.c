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

   Every shape runs on 1 thread and on THREADS (default: the online cores):
   ours through a backend of that many threads (dsgd_cpu_backend_desc), and
   OpenBLAS with openblas_set_num_threads; OPENBLAS_NUM_THREADS is ignored
   here. The machine's FMA peak at each thread count is measured in the same
   run (independent FMAs of the kernel's width in 12 accumulators on every
   thread, x86-64 only) and each GEMM is also given as a fraction of it.

   Usage: build/bench/gemm [REPEATS [THREADS]]   (make bench; default REPEATS = 7)
   Output: a table per thread count, then one line per shape and count:
     gemm shape=MxNxK trans=NN threads=T ours_gflops=... openblas_gflops=... ratio=...
       peak_gflops=... ours_of_peak=... kernel=... */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#include <pthread.h>

#ifdef DSGD_HAVE_OPENBLAS
#include <cblas.h>
extern void openblas_set_num_threads(int);
#endif

/* ---- the FMA peak: 12 independent accumulators per thread (more than the
   FMA latency times the FMA ports of current x86 cores), run on every
   thread at once; GFLOP/s counts a multiply-add as 2 */
#define PEAK_ITERS 20000000L
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_PEAK 1
#define PEAK_BODY(VEC, SET1, FMA, ADD)                                                   \
    VEC a = SET1(1.0001f), b = SET1(0.9999f), c[12];                                     \
    long i;                                                                              \
    int j;                                                                               \
    for (j = 0; j < 12; ++j) c[j] = SET1((float)j);                                      \
    for (i = 0; i < iters; ++i) {                                                        \
        c[0] = FMA(a, c[0], b); c[1] = FMA(a, c[1], b); c[2] = FMA(a, c[2], b);          \
        c[3] = FMA(a, c[3], b); c[4] = FMA(a, c[4], b); c[5] = FMA(a, c[5], b);          \
        c[6] = FMA(a, c[6], b); c[7] = FMA(a, c[7], b); c[8] = FMA(a, c[8], b);          \
        c[9] = FMA(a, c[9], b); c[10] = FMA(a, c[10], b); c[11] = FMA(a, c[11], b);      \
    }                                                                                    \
    for (j = 1; j < 12; ++j) c[0] = ADD(c[0], c[j]);                                     \
    memcpy(&out, &c[0], sizeof out)
__attribute__((target("avx512f"))) static float peak_avx512(long iters) {
    float out;
    PEAK_BODY(__m512, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_add_ps);
    return out;
}
__attribute__((target("avx2,fma"))) static float peak_avx2(long iters) {
    float out;
    PEAK_BODY(__m256, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_add_ps);
    return out;
}
#else
#define HAVE_PEAK 0
#endif

typedef struct peak_arg {
    const char *kernel;
    double secs;
    float sink;
} peak_arg;

static void *peak_thread(void *p) {
    peak_arg *a = (peak_arg *)p;
    double t0 = dsgd_now();
#if HAVE_PEAK
    a->sink = !strcmp(a->kernel, "avx512") ? peak_avx512(PEAK_ITERS) : peak_avx2(PEAK_ITERS);
#endif
    a->secs = dsgd_now() - t0;
    return NULL;
}

/* GFLOP/s of `threads` threads each running the FMA loop of `kernel`
   (avx512 or avx2), the best of 3; 0 where there is none to run. */
static double fma_peak(const char *kernel, int threads) {
    peak_arg args[256];
    pthread_t th[256];
    double best = 0;
    int rep, t, lanes = !strcmp(kernel, "avx512") ? 16 : !strcmp(kernel, "avx2") ? 8 : 0;
    if (!HAVE_PEAK || !lanes || threads > 256) return 0;
    for (rep = 0; rep < 3; ++rep) {
        double worst = 0, gf;
        for (t = 0; t < threads; ++t) {
            args[t].kernel = kernel;
            if (t && pthread_create(&th[t], NULL, peak_thread, &args[t]) != 0) return 0;
        }
        peak_thread(&args[0]);
        for (t = 1; t < threads; ++t) pthread_join(th[t], NULL);
        for (t = 0; t < threads; ++t)
            if (args[t].secs > worst) worst = args[t].secs;
        gf = (double)threads * PEAK_ITERS * 12.0 * lanes * 2.0 / worst * 1e-9;
        if (gf > best) best = gf;
    }
    return best;
}

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

#define MAX_CONFIGS 2

int main(int argc, char **argv) {
    int repeats = 7, si, ci, nconf, conf[MAX_CONFIGS];
    dsgd_ctx *ctx = NULL;
    dsgd_backend_i be[MAX_CONFIGS];
    dsgd_result res;
    double ours_gf[MAX_CONFIGS][NSHAPES], blas_gf[MAX_CONFIGS][NSHAPES], peak[MAX_CONFIGS];
    double relerr[MAX_CONFIGS][NSHAPES], spot[MAX_CONFIGS][NSHAPES];
    int have_blas = 0, failed = 0;
    const char *kernel;

    conf[0] = 1;
    conf[1] = dsgd_cpu_count();
    if (argc > 1) {
        repeats = atoi(argv[1]);
        if (repeats < 5) repeats = 5;
        if (repeats > 64) repeats = 64;
    }
    if (argc > 2 && atoi(argv[2]) >= 1) conf[1] = atoi(argv[2]) > 256 ? 256 : atoi(argv[2]);
    nconf = conf[1] > 1 ? 2 : 1;
#ifdef DSGD_HAVE_OPENBLAS
    have_blas = 1;
#endif
    if ((res = dsgd_ctx_create(NULL, &ctx)) != DSGD_OK) die(NULL, "dsgd_ctx_create", res);
    for (ci = 0; ci < nconf; ++ci) {
        dsgd_cpu_backend_desc bd = {0};
        bd.threads = conf[ci];
        if ((res = dsgd_cpu_backend_create_desc(ctx, &bd, &be[ci])) != DSGD_OK)
            die(ctx, "dsgd_cpu_backend_create_desc", res);
    }
    kernel = cpu_kernel(&be[0]);

    printf("distsgd %s GEMM bench: backend '%s'%s%s; %d repeats (median); 1 and %d threads\n",
           DISTSGD_VERSION_STRING, be[0].name,
#ifdef DSGD_USE_CBLAS
           " (DSGD_USE_CBLAS: routed to cblas_sgemm)", "",
#else
           " (blocked GEMM), micro-kernel ", kernel,
#endif
           repeats, conf[nconf - 1]);
    if (getenv("DSGD_CPU_ISA"))
        printf("DSGD_CPU_ISA=%s (a kernel the CPU lacks gives its widest)\n", getenv("DSGD_CPU_ISA"));
    if (have_blas)
        printf("OpenBLAS cblas_sgemm at the same thread counts (openblas_set_num_threads)\n");
    else
        printf("OpenBLAS: not built in (no -DDSGD_HAVE_OPENBLAS); no comparison\n");
    for (ci = 0; ci < nconf; ++ci) {
        peak[ci] = fma_peak(kernel, conf[ci]);
        if (peak[ci] > 0)
            printf("FMA peak, %s, %d thread%s: %.1f GFLOP/s\n", kernel, conf[ci], conf[ci] == 1 ? "" : "s",
                   peak[ci]);
        else
            printf("FMA peak: not measured for the %s kernel\n", kernel);
    }

    for (si = 0; si < NSHAPES; ++si) {
        const shape *s = &shapes[si];
        const int ar = s->ta ? s->k : s->m, ac = s->ta ? s->m : s->k;
        const int br = s->tb ? s->n : s->k, bc = s->tb ? s->k : s->n;
        const size_t na = (size_t)ar * ac, nb = (size_t)br * bc, nc = (size_t)s->m * s->n;
        float *ha = (float *)malloc(na * sizeof(float)), *hb = (float *)malloc(nb * sizeof(float));
        float *hc = (float *)malloc(nc * sizeof(float)), *ours = (float *)malloc(nc * sizeof(float));
        uint64_t st = 1000 + (uint64_t)si;
        size_t i;
        double flops = 2.0 * s->m * s->n * s->k, t;

        if (!ha || !hb || !hc || !ours) die(NULL, "malloc", DSGD_ERR_OUT_OF_MEMORY);
        for (i = 0; i < na; ++i) ha[i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
        for (i = 0; i < nb; ++i) hb[i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
        for (ci = 0; ci < nconf; ++ci) {
            dsgd_backend_i *b = &be[ci];
            dsgd_buffer *ba = NULL, *bb = NULL, *bcb = NULL;
            run_ctx r;
            if ((res = b->buffer_create(b->impl, na, &ba)) != DSGD_OK ||
                (res = b->buffer_create(b->impl, nb, &bb)) != DSGD_OK ||
                (res = b->buffer_create(b->impl, nc, &bcb)) != DSGD_OK)
                die(ctx, "buffer_create", res);
            memset(&r, 0, sizeof r);
            r.ctx = ctx;
            r.be = *b;
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
            if ((res = b->write(b->impl, r.a, ha, na)) != DSGD_OK || (res = b->write(b->impl, r.b, hb, nb)) != DSGD_OK)
                die(ctx, "write", res);
#ifdef DSGD_HAVE_OPENBLAS
            openblas_set_num_threads(conf[ci]);
#endif
            /* correctness first */
            call_ours(&r);
            if ((res = b->read(b->impl, r.c, ours, nc)) != DSGD_OK) die(ctx, "read", res);
            spot[ci][si] = spot_check(&r, ours);
            relerr[ci][si] = -1;
#ifdef DSGD_HAVE_OPENBLAS
            {
                double md = 0, mx = 0;
                call_openblas(&r);
                for (i = 0; i < nc; ++i) {
                    double d = fabs((double)ours[i] - hc[i]);
                    if (d > md) md = d;
                    if (fabs(hc[i]) > mx) mx = fabs(hc[i]);
                }
                relerr[ci][si] = md / (mx > 0 ? mx : 1);
            }
#endif
            if (spot[ci][si] > 1e-5 || relerr[ci][si] > 1e-4) {
                fprintf(stderr, "gemm bench: %dx%dx%d %c%c, %d threads: wrong result (spot error %.3g, vs OpenBLAS %.3g)\n",
                        s->m, s->n, s->k, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', conf[ci], spot[ci][si],
                        relerr[ci][si]);
                failed = 1;
            }
            t = time_median(call_ours, &r, repeats);
            ours_gf[ci][si] = flops / t * 1e-9;
            blas_gf[ci][si] = 0;
#ifdef DSGD_HAVE_OPENBLAS
            t = time_median(call_openblas, &r, repeats);
            blas_gf[ci][si] = flops / t * 1e-9;
#endif
            b->buffer_destroy(b->impl, ba);
            b->buffer_destroy(b->impl, bb);
            b->buffer_destroy(b->impl, bcb);
        }
        free(ha);
        free(hb);
        free(hc);
        free(ours);
    }

    for (ci = 0; ci < nconf; ++ci) {
        double fl = 0, tours = 0, tblas = 0;
        printf("\n%d thread%s:\n%-26s %-15s %-5s %12s %10s %14s %13s %11s\n", conf[ci], conf[ci] == 1 ? "" : "s",
               "operation", "m x n x k", "trans", "ours GFLOP/s", "of peak", "OpenBLAS GF/s", "ours/OpenBLAS",
               "max rel err");
        for (si = 0; si < NSHAPES; ++si) {
            const shape *s = &shapes[si];
            char dims[32], tr[3], pk[16];
            double f = 2.0 * s->m * s->n * s->k;
            snprintf(dims, sizeof dims, "%dx%dx%d", s->m, s->n, s->k);
            tr[0] = s->ta ? 'T' : 'N';
            tr[1] = s->tb ? 'T' : 'N';
            tr[2] = 0;
            snprintf(pk, sizeof pk, peak[ci] > 0 ? "%.2f" : "-", ours_gf[ci][si] / peak[ci]);
            fl += f;
            tours += f / ours_gf[ci][si];
            tblas += have_blas ? f / blas_gf[ci][si] : 0;
            if (have_blas)
                printf("%-26s %-15s %-5s %12.2f %10s %14.2f %13.3f %11.2e\n", s->what, dims, tr, ours_gf[ci][si],
                       pk, blas_gf[ci][si], ours_gf[ci][si] / blas_gf[ci][si], relerr[ci][si]);
            else
                printf("%-26s %-15s %-5s %12.2f %10s %14s %13s %11.2e\n", s->what, dims, tr, ours_gf[ci][si], pk,
                       "-", "-", spot[ci][si]);
        }
        /* the six shapes as one step's GEMMs: total flops over total time */
        printf("%-26s %-15s %-5s %12.2f %10.2f %14.2f %13.3f\n", "all six (one step's GEMMs)", "", "", fl / tours,
               peak[ci] > 0 ? fl / tours / peak[ci] : 0.0, have_blas ? fl / tblas : 0.0,
               have_blas ? tblas / tours : 0.0);
    }
    printf("\n");
    for (ci = 0; ci < nconf; ++ci)
        for (si = 0; si < NSHAPES; ++si) {
            const shape *s = &shapes[si];
            printf("gemm shape=%dx%dx%d trans=%c%c threads=%d ours_gflops=%.3f ", s->m, s->n, s->k,
                   s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', conf[ci], ours_gf[ci][si]);
            if (have_blas)
                printf("openblas_gflops=%.3f ratio=%.4f max_rel_err=%.3e ", blas_gf[ci][si],
                       ours_gf[ci][si] / blas_gf[ci][si], relerr[ci][si]);
            else
                printf("openblas_gflops=na ratio=na max_rel_err=%.3e ", spot[ci][si]);
            printf("peak_gflops=%.1f ours_of_peak=%.3f kernel=%s\n", peak[ci],
                   peak[ci] > 0 ? ours_gf[ci][si] / peak[ci] : 0.0, kernel);
        }

    for (ci = 0; ci < nconf; ++ci) be[ci].destroy(be[ci].impl);
    dsgd_ctx_destroy(ctx);
    return failed;
}
