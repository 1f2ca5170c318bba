/* train_cl.c - one training step of the 784-512-512-10 ReLU MLP at batch 256
   on the CPU backend and on the OpenCL backend, every variant on the SAME
   number of threads T.

   A step is dsgd_model_compute_gradients + dsgd_optimizer_step (momentum) on
   a plain single model, random data. Variants, in the same run:
     cpu-builtin   the CPU backend (dsgd_cpu_backend_create_desc, threads = T)
                   with its own GEMM
     cpu-openblas  the same CPU backend (threads = T for the element-wise
                   operations) with cblas_sgemm on T threads as its GEMM,
                   called as a DSGD_USE_CBLAS build calls it; only when built
                   with -DDSGD_HAVE_OPENBLAS (the Makefile adds it, and
                   -lopenblas, when OpenBLAS is installed)
     opencl        the OpenCL backend (the default device; PoCL on T threads;
                   the tuned CLBlast GEMM parameters from the tuning cache
                   when one exists for the device, else CLBlast's defaults:
                   printed as gemm_tuned)

   Threads: one thread count per process, because PoCL reads
   POCL_MAX_PTHREAD_COUNT once, when OpenCL is first used. --threads T sets
   POCL_MAX_PTHREAD_COUNT=T (before any OpenCL call) when it is unset, and
   refuses to run when it is set to another value. Without --threads, T is
   POCL_MAX_PTHREAD_COUNT when set, else the online cores. OpenBLAS gets T
   with openblas_set_num_threads (OPENBLAS_NUM_THREADS is ignored here).
   The output names the kernels OpenBLAS chose (openblas_get_corename;
   Debian 12's OpenBLAS takes Haswell ones on this AVX-512 AMD EPYC,
   OPENBLAS_CORETYPE=SkylakeX its AVX-512 ones, see bench/gemm_cl.c).
   Compare 1 and 2 threads with two runs:
     for t in 1 2; do build/bench/train_cl --threads $t; done
   (make bench sets POCL_MAX_PTHREAD_COUNT=2, so there T = 2.)

   Rounds of the variants are interleaved (this machine is noisy): one
   warm-up round, then `rounds` timed rounds of `steps` steps each, the
   backend finished at the end of each round, a 0.2 s pause after each
   variant's turn (so that OpenBLAS's and PoCL's idle threads stop spinning
   before the next variant needs the cores); the median per step is
   reported. Also: the time of the three x10 output-layer GEMMs (forward
   256x10x512 NN, weight gradient 512x10x256 TN, input gradient 256x512x10
   NT), each timed alone on the backend to completion (gemm_measure of
   tools/cl_gemm_measure.h), and their share of the step. Ratios are step
   times: a variant's ms/step / cpu-builtin's (above 1: slower).

   Run: make bench, or build/bench/train_cl [--threads T] [rounds [steps]]
   (POCL_CACHE_DIR must name a writable directory; the first run compiles
   CLBlast's GEMM). Output: a table, then one line per variant:
     train_cl backend=NAME threads=T ms_per_step=.. samples_per_s=..
              time_vs_cpu_builtin=.. [gemm_tuned=..] out_gemms_ms=.. ... */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../tools/cl_gemm_measure.h"

#ifdef DSGD_HAVE_OPENBLAS
#include <cblas.h>
extern void openblas_set_num_threads(int);
extern int openblas_get_num_threads(void);
extern char *openblas_get_corename(void);
#endif

#define BATCH 256
#define IN 784

static const dsgd_layer_desc g_layers[3] = {{512, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                            {512, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                            {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

/* The three GEMMs that touch the 10-wide output layer. */
static const gemm_shape g_out_shapes[3] = {
    {0, 0, BATCH, 10, 512}, /* forward: h2(256x512) W3(512x10) */
    {1, 0, 512, 10, BATCH}, /* weight gradient: h2^T dy */
    {0, 1, BATCH, 512, 10}, /* input gradient: dy W3^T */
};

static void die(dsgd_ctx *ctx, const char *what) {
    fprintf(stderr, "train_cl: %s: %s\n", what, dsgd_ctx_last_error(ctx));
    exit(1);
}

static void pause_ms(long ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

#ifdef DSGD_HAVE_OPENBLAS
/* cpu-openblas: the CPU backend's gemm member replaced by cblas_sgemm on the
   buffers' host memory, as the CPU backend calls it when built with
   DSGD_USE_CBLAS (beta applied first, then C += alpha op(A) op(B)). */
static float *(*g_host_ptr)(void *impl, dsgd_buffer *buf);

static dsgd_result openblas_gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha, dsgd_ref a, int lda,
                                 dsgd_ref b, int ldb, float beta, dsgd_ref c, int ldc) {
    float *pc;
    if (m <= 0 || n <= 0) return DSGD_OK;
    pc = g_host_ptr(impl, c.buf) + c.off;
    dsgd__gemm_beta(m, n, beta, pc, ldc); /* the library's own beta step (this file has the implementation) */
    if (k > 0 && alpha != 0.0f)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                    g_host_ptr(impl, a.buf) + a.off, lda, g_host_ptr(impl, b.buf) + b.off, ldb, 1.0f, pc, ldc);
    return DSGD_OK;
}
#endif

typedef struct variant {
    const char *name;
    dsgd_backend_i be;
    dsgd_model *m;
    dsgd_optimizer *opt;
    double *t;
    double med;
    double out_gemm_s[3];
} variant;

static void variant_init(dsgd_ctx *ctx, variant *v, int rounds) {
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    memset(&md, 0, sizeof md);
    md.input_dim = IN;
    md.layers = g_layers;
    md.num_layers = 3;
    md.max_batch = BATCH;
    md.seed = 7;
    md.backend = &v->be;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_MOMENTUM;
    od.lr = 0.01f;
    od.momentum = 0.9f;
    if (dsgd_model_create(ctx, &md, &v->m) != DSGD_OK) die(ctx, v->name);
    if (dsgd_optimizer_create(v->m, &od, &v->opt) != DSGD_OK) die(ctx, v->name);
    v->t = (double *)malloc(sizeof(double) * (size_t)rounds);
    if (!v->t) exit(1);
}

static void variant_free(variant *v) {
    dsgd_optimizer_destroy(v->opt);
    dsgd_model_destroy(v->m);
    if (v->be.destroy) v->be.destroy(v->be.impl);
    free(v->t);
}

int main(int argc, char **argv) {
    enum { MAXV = 3 };
    int rounds = 7, steps = 10, threads = 0, npos = 0, ob_threads = 0;
    variant v[MAXV];
    dsgd_ctx *ctx;
    dsgd_cl_context *cl = NULL;
    dsgd_cl_context_desc cd;
    dsgd_cpu_backend_desc bd;
    float *x, *y;
    const char *ob_core = "none";
    uint64_t st = 99;
    size_t i;
    int r, k, s, a, tuned = 0, nv = 0, icl = -1, iob = -1, best = 0;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--threads") && a + 1 < argc) {
            threads = atoi(argv[++a]);
            if (threads < 1) break;
        } else if (argv[a][0] != '-' && npos < 2) {
            if (npos++ == 0) rounds = atoi(argv[a]);
            else steps = atoi(argv[a]);
        } else
            break;
    }
    if (a < argc) {
        fprintf(stderr, "usage: train_cl [--threads T] [rounds [steps]]\n");
        return 1;
    }
    if (rounds < 5) rounds = 5;
    if (steps < 1) steps = 1;
    if ((threads = bench_pocl_threads("train_cl", threads)) < 1) return 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    x = (float *)malloc(sizeof(float) * BATCH * IN);
    y = (float *)malloc(sizeof(float) * BATCH);
    if (!x || !y) return 1;
    for (i = 0; i < (size_t)BATCH * IN; ++i) x[i] = (float)dsgd_rng_uniform(&st);
    for (i = 0; i < BATCH; ++i) y[i] = (float)(dsgd_rng_next(&st) % 10);

    memset(v, 0, sizeof v);
    memset(&bd, 0, sizeof bd);
    bd.threads = threads;
    v[nv].name = "cpu-builtin";
    if (dsgd_cpu_backend_create_desc(ctx, &bd, &v[nv].be) != DSGD_OK) die(ctx, "cpu backend");
    ++nv;
#ifdef DSGD_HAVE_OPENBLAS
    openblas_set_num_threads(threads);
    ob_threads = openblas_get_num_threads();
    ob_core = openblas_get_corename();
    v[nv].name = "cpu-openblas";
    if (dsgd_cpu_backend_create_desc(ctx, &bd, &v[nv].be) != DSGD_OK) die(ctx, "cpu backend");
    g_host_ptr = v[nv].be.buffer_host_ptr;
    v[nv].be.gemm = openblas_gemm;
    iob = nv++;
#endif
    memset(&cd, 0, sizeof cd); /* tuning AUTO: the device's cache file if valid */
    v[nv].name = "opencl";
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK || dsgd_cl_backend_create(ctx, cl, NULL, &v[nv].be) != DSGD_OK) {
        fprintf(stderr, "train_cl: no OpenCL backend (%s): CPU only\n", dsgd_ctx_last_error(ctx));
        memset(&v[nv], 0, sizeof v[nv]);
    } else {
        icl = nv++;
        tuned = dsgd_cl_context_gemm_tuned(cl, 0);
    }
    for (k = 0; k < nv; ++k) variant_init(ctx, &v[k], rounds);

    printf("bench/train_cl: MLP 784-512-512-10 relu, batch %d, momentum; %d steps per round, %d rounds "
           "(median, after one warm-up round)\n",
           BATCH, steps, rounds);
    printf("threads: T=%d for every variant: cpu-builtin %d (%s kernels)", threads, dsgd_cpu_backend_threads(&v[0].be),
           dsgd_cpu_backend_isa(&v[0].be));
    if (iob >= 0)
        printf(", cpu-openblas %d (openblas_get_num_threads() = %d, %s kernels)", dsgd_cpu_backend_threads(&v[iob].be),
               ob_threads, ob_core);
    else
        printf(", cpu-openblas not built in (no -DDSGD_HAVE_OPENBLAS)");
    printf(", opencl POCL_MAX_PTHREAD_COUNT=%s\n", getenv("POCL_MAX_PTHREAD_COUNT"));
    if (iob >= 0 && ob_threads != threads) printf("warning: OpenBLAS runs on %d threads, not %d\n", ob_threads, threads);
    if (icl >= 0)
        printf("OpenCL device: %s (%s, driver %s), %u compute units; gemm_tuned=%d (%s)\n",
               dsgd_cl_context_device_info(cl, 0)->device_name, dsgd_cl_context_device_info(cl, 0)->platform_name,
               dsgd_cl_context_device_info(cl, 0)->driver_version, dsgd_cl_context_device_info(cl, 0)->compute_units,
               tuned, tuned ? "tuning cache applied" : "no valid tuning cache: CLBlast's default parameters");
    fflush(stdout);

    for (r = -1; r < rounds; ++r) { /* round -1 warms up (and compiles) */
        for (k = 0; k < nv; ++k) {
            double t0 = dsgd_now();
            for (s = 0; s < steps; ++s) {
                if (dsgd_model_compute_gradients(v[k].m, x, y, BATCH, 1.0f / BATCH) != DSGD_OK ||
                    dsgd_optimizer_step(v[k].opt) != DSGD_OK)
                    die(ctx, v[k].name);
            }
            if (v[k].be.finish && v[k].be.finish(v[k].be.impl) != DSGD_OK) die(ctx, v[k].name);
            if (r >= 0) v[k].t[r] = (dsgd_now() - t0) / steps;
            pause_ms(200);
        }
    }
    for (k = 0; k < nv; ++k) {
        v[k].med = bench_median(v[k].t, rounds);
        if (gemm_measure(ctx, &v[k].be, g_out_shapes, 3, 2 * rounds + 1, v[k].out_gemm_s, NULL) != DSGD_OK)
            die(ctx, "output-layer GEMMs");
        pause_ms(200);
        if (v[k].med < v[best].med) best = k;
    }

    printf("\nevery variant on %d thread%s; time ratio = ms/step / cpu-builtin's ms/step (above 1: slower)\n", threads,
           threads == 1 ? "" : "s");
    printf("%-14s %8s %10s %11s %14s %14s %8s\n", "backend", "threads", "ms/step", "samples/s", "vs cpu-builtin",
           "x10 GEMMs ms", "share");
    for (k = 0; k < nv; ++k) {
        double og = v[k].out_gemm_s[0] + v[k].out_gemm_s[1] + v[k].out_gemm_s[2];
        printf("%-14s %8d %10.3f %11.0f %13.3fx %14.3f %7.1f%%\n", v[k].name, threads, 1e3 * v[k].med,
               BATCH / v[k].med, v[k].med / v[0].med, 1e3 * og, 100.0 * og / v[k].med);
    }
    for (k = 0; k < nv; ++k) {
        double og = v[k].out_gemm_s[0] + v[k].out_gemm_s[1] + v[k].out_gemm_s[2];
        printf("train_cl backend=%s threads=%d ms_per_step=%.4f samples_per_s=%.1f time_vs_cpu_builtin=%.4f",
               v[k].name, threads, 1e3 * v[k].med, BATCH / v[k].med, v[k].med / v[0].med);
        if (k == 0) printf(" kernels=%s", dsgd_cpu_backend_isa(&v[k].be));
        if (k == iob) printf(" kernels=openblas-%s", ob_core);
        if (k == icl) {
            printf(" gemm_tuned=%d", tuned);
            if (iob >= 0) printf(" time_vs_cpu_openblas=%.4f", v[k].med / v[iob].med);
        }
        printf(" out_gemms_ms=%.4f (fwd %.4f wgrad %.4f igrad %.4f) out_gemms_share=%.4f\n", 1e3 * og,
               1e3 * v[k].out_gemm_s[0], 1e3 * v[k].out_gemm_s[1], 1e3 * v[k].out_gemm_s[2], og / v[k].med);
    }
    if (icl >= 0 && iob >= 0)
        printf("target: opencl step <= 1.5x cpu-openblas on the same threads (%d): %.2fx (%s)\n", threads,
               v[icl].med / v[iob].med, v[icl].med / v[iob].med <= 1.5 ? "met" : "not met");
    printf("fastest step on %d thread%s: %s (%.3f ms)", threads, threads == 1 ? "" : "s", v[best].name,
           1e3 * v[best].med);
    if (icl >= 0 && icl != best)
        printf("; opencl takes %.2fx its time", v[icl].med / v[best].med);
    printf("\n");

    for (k = 0; k < nv; ++k) variant_free(&v[k]);
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    free(x);
    free(y);
    return 0;
}
