/* train_cl.c - one training step of the 784-512-512-10 ReLU MLP at batch 256
   on the CPU backend and on the OpenCL backend.

   A step is dsgd_model_compute_gradients + dsgd_optimizer_step (momentum) on
   a plain single model, random data. Variants, in the same run:
     cpu-builtin   the CPU backend with distsgd's own blocked GEMM
     cpu-openblas  the CPU backend with cblas_sgemm (OpenBLAS)
     opencl        the OpenCL backend (the default device; the tuned CLBlast
                   GEMM parameters from the tuning cache when one exists for
                   the device, else CLBlast's defaults: printed as gemm_tuned)
   DSGD_USE_CBLAS switches the CPU backend's GEMM for the whole binary, so
   one binary has either cpu-builtin or cpu-openblas, never both: the
   Makefile builds this file with OpenBLAS when it finds it (DSGD_HAVE_OPENBLAS,
   so cpu-openblas); build without it for cpu-builtin:
     cc -std=c99 -O3 -march=native -I. bench/train_cl.c -o build/bench/train_cl_builtin \
        $(pkg-config --cflags --libs OpenCL clblast) -lm -lpthread

   Rounds of the variants are interleaved (this machine is noisy): one
   warm-up round, then `rounds` timed rounds of `steps` steps each, the
   backend finished at the end of each round; the median per step is reported.
   Also: the time of the three x10 output-layer GEMMs (forward 256x10x512 NN,
   weight gradient 512x10x256 TN, input gradient 256x512x10 NT), each timed
   alone on the backend to completion (gemm_measure of
   tools/cl_gemm_measure.h), and their share of the step.

   Threads: OpenBLAS uses OPENBLAS_NUM_THREADS, PoCL POCL_MAX_PTHREAD_COUNT;
   the built-in GEMM is single-threaded. The target compares the
   OpenCL step with cpu-openblas on the same threads:
     OPENBLAS_NUM_THREADS=2 POCL_MAX_PTHREAD_COUNT=2 build/bench/train_cl
     OPENBLAS_NUM_THREADS=1 POCL_MAX_PTHREAD_COUNT=1 build/bench/train_cl

   Run: make bench, or build/bench/train_cl [rounds [steps]] (POCL_CACHE_DIR
   must name a writable directory; the first run compiles CLBlast's GEMM). */
#define _POSIX_C_SOURCE 200809L
#ifdef DSGD_HAVE_OPENBLAS
#define DSGD_USE_CBLAS
#endif
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "../tools/cl_gemm_measure.h"

#define BATCH 256
#define IN 784

#ifdef DSGD_USE_CBLAS
#define CPU_NAME "cpu-openblas"
#define CPU_KEY "cpu_openblas"
#else
#define CPU_NAME "cpu-builtin"
#define CPU_KEY "cpu_builtin"
#endif

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

static const char *env_or(const char *name, const char *dflt) {
    const char *v = getenv(name);
    return v && *v ? v : dflt;
}

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
    enum { CPU, CL, NV };
    int rounds = argc > 1 ? atoi(argv[1]) : 7, steps = argc > 2 ? atoi(argv[2]) : 10;
    variant v[NV];
    dsgd_ctx *ctx;
    dsgd_cl_context *cl = NULL;
    dsgd_cl_context_desc cd;
    float *x, *y;
    uint64_t st = 99;
    size_t i;
    int r, k, s, tuned, nv = NV;

    if (rounds < 5) rounds = 5;
    if (steps < 1) steps = 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    x = (float *)malloc(sizeof(float) * BATCH * IN);
    y = (float *)malloc(sizeof(float) * BATCH);
    if (!x || !y) return 1;
    for (i = 0; i < (size_t)BATCH * IN; ++i) x[i] = (float)dsgd_rng_uniform(&st);
    for (i = 0; i < BATCH; ++i) y[i] = (float)(dsgd_rng_next(&st) % 10);

    memset(v, 0, sizeof v);
    v[CPU].name = CPU_NAME;
    v[CL].name = "opencl";
    if (dsgd_cpu_backend_create(ctx, &v[CPU].be) != DSGD_OK) die(ctx, "cpu backend");
    memset(&cd, 0, sizeof cd); /* tuning AUTO: the device's cache file if valid */
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK || dsgd_cl_backend_create(ctx, cl, NULL, &v[CL].be) != DSGD_OK) {
        fprintf(stderr, "train_cl: no OpenCL backend (%s): CPU only\n", dsgd_ctx_last_error(ctx));
        nv = 1;
    }
    for (k = 0; k < nv; ++k) variant_init(ctx, &v[k], rounds);
    tuned = cl ? dsgd_cl_context_gemm_tuned(cl, 0) : 0;

    printf("bench/train_cl: MLP 784-512-512-10 relu, batch %d, momentum; %d steps per round, %d rounds "
           "(median, after one warm-up round)\n",
           BATCH, steps, rounds);
    printf("threads: OPENBLAS_NUM_THREADS=%s POCL_MAX_PTHREAD_COUNT=%s", env_or("OPENBLAS_NUM_THREADS", "unset"),
           env_or("POCL_MAX_PTHREAD_COUNT", "unset"));
#ifdef DSGD_USE_CBLAS
    printf(" (openblas_get_num_threads() = %d)", openblas_get_num_threads());
#endif
    printf("\nCPU backend GEMM in this binary: %s\n",
#ifdef DSGD_USE_CBLAS
           "OpenBLAS cblas_sgemm (built with DSGD_USE_CBLAS: the built-in GEMM variant is not in this binary)"
#else
           "built-in blocked GEMM (built without OpenBLAS: no cpu-openblas variant in this binary)"
#endif
    );
    if (cl)
        printf("OpenCL device: %s (%s, driver %s); gemm_tuned=%d (%s)\n",
               dsgd_cl_context_device_info(cl, 0)->device_name, dsgd_cl_context_device_info(cl, 0)->platform_name,
               dsgd_cl_context_device_info(cl, 0)->driver_version, tuned,
               tuned ? "tuning cache applied" : "no valid tuning cache: CLBlast's default parameters");
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
        }
    }
    for (k = 0; k < nv; ++k) {
        v[k].med = bench_median(v[k].t, rounds);
        if (gemm_measure(ctx, &v[k].be, g_out_shapes, 3, 2 * rounds + 1, v[k].out_gemm_s, NULL) != DSGD_OK)
            die(ctx, "output-layer GEMMs");
    }

    printf("%-14s %10s %11s %12s %16s %12s\n", "backend", "ms/step", "samples/s", "vs " CPU_NAME, "x10 GEMMs ms", "share");
    for (k = 0; k < nv; ++k) {
        double og = v[k].out_gemm_s[0] + v[k].out_gemm_s[1] + v[k].out_gemm_s[2];
        printf("%-14s %10.3f %11.0f %11.3fx %16.3f %11.1f%%\n", v[k].name, 1e3 * v[k].med, BATCH / v[k].med,
               v[k].med / v[CPU].med, 1e3 * og, 100.0 * og / v[k].med);
    }
    for (k = 0; k < nv; ++k) {
        double og = v[k].out_gemm_s[0] + v[k].out_gemm_s[1] + v[k].out_gemm_s[2];
        printf("train_cl backend=%s ms_per_step=%.4f samples_per_s=%.1f", v[k].name, 1e3 * v[k].med,
               BATCH / v[k].med);
        if (k == CL) printf(" gemm_tuned=%d ratio_vs_%s=%.4f", tuned, CPU_KEY, v[k].med / v[CPU].med);
        printf(" out_gemms_ms=%.4f (fwd %.4f wgrad %.4f igrad %.4f) out_gemms_share=%.4f threads_openblas=%s "
               "threads_pocl=%s\n",
               1e3 * og, 1e3 * v[k].out_gemm_s[0], 1e3 * v[k].out_gemm_s[1], 1e3 * v[k].out_gemm_s[2],
               og / v[k].med, env_or("OPENBLAS_NUM_THREADS", "unset"), env_or("POCL_MAX_PTHREAD_COUNT", "unset"));
    }
#ifdef DSGD_USE_CBLAS
    if (nv == NV)
        printf("target: opencl step <= 1.5x cpu-openblas on the same threads: %.2fx (%s)\n", v[CL].med / v[CPU].med,
               v[CL].med / v[CPU].med <= 1.5 ? "met" : "not met");
#endif

    for (k = 0; k < nv; ++k) variant_free(&v[k]);
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    free(x);
    free(y);
    return 0;
}
