/* mirrored_cl.c - a mirrored training step on OpenCL backends, by the path
   the gradients take between replicas.

   N replicas (one thread and one OpenCL backend, i.e. one command queue,
   each; all on one shared context) train the 784-512-512-10 ReLU MLP,
   per-replica batch 128, momentum, random data. Variants, same run:
     device      DSGD_GRADIENTS_DEVICE: each replica sums its block of every
                 replica's gradient buffer with a kernel (sum_across), two
                 barriers, no host copy
     host-map    DSGD_GRADIENTS_HOST: each replica maps its gradient buffer
                 (zero-copy where the device shares host memory, as PoCL's
                 does) and the loopback all-reduces it in place (AUTO: DIRECT)
     host-stage  DSGD_GRADIENTS_HOST with the backend's map hidden: read the
                 gradient into a host staging buffer, all-reduce, write it back
                 (what a backend without map or host pointers costs; the
                 baseline of the ratios)
   Rounds of the variants are interleaved (the machine is noisy): one
   warm-up round, then `rounds` timed rounds of `steps` steps; the median
   per step is reported with its ratio to host-stage.

   On PoCL the "device" is the host's own cores, so the device path saves
   copies and synchronisation, not a bus crossing; on a discrete GPU the
   host paths also cross PCIe twice per step.

   Run: make bench, or build/bench/mirrored_cl [replicas [rounds [steps]]]
   (default 2 7 10; POCL_CACHE_DIR must name a writable directory).
   Output: a table, then one machine-readable line per variant:
     mirrored_cl variant=device replicas=2 ms_per_step=.. samples_per_s=.. vs_host_stage=.. */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define BATCH 128 /* per replica */
#define IN 784

static const dsgd_layer_desc g_layers[3] = {{512, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                            {512, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                            {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

typedef struct factory_arg {
    dsgd_cl_context *cl;
    int hide_map; /* host-stage: the strategy sees a backend without map */
} factory_arg;

static dsgd_result factory(void *user, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    const factory_arg *a = (const factory_arg *)user;
    dsgd_cl_backend_desc bd;
    dsgd_result r;
    memset(&bd, 0, sizeof bd);
    bd.device = replica % dsgd_cl_context_num_devices(a->cl);
    r = dsgd_cl_backend_create(ctx, a->cl, &bd, out);
    if (r == DSGD_OK && a->hide_map) out->map = NULL, out->unmap = NULL;
    return r;
}

enum { DEVICE, HOST_MAP, HOST_STAGE, NV };

int main(int argc, char **argv) {
    static const char *const names[NV] = {"device", "host-map", "host-stage"};
    int n = argc > 1 ? atoi(argv[1]) : 2, rounds = argc > 2 ? atoi(argv[2]) : 7, steps = argc > 3 ? atoi(argv[3]) : 10;
    dsgd_ctx *ctx;
    dsgd_cl_context *cl = NULL;
    dsgd_cl_context_desc cd;
    dsgd_strategy *st[NV];
    factory_arg fa[NV];
    double *t[NV], med[NV];
    float *x, *y;
    uint64_t rng = 5;
    size_t i, gb;
    int k, r, s;

    if (n < 2 || n > 64) n = 2;
    if (rounds < 3) rounds = 3;
    if (steps < 1) steps = 1;
    gb = (size_t)n * BATCH;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    memset(&cd, 0, sizeof cd); /* tuning AUTO: the device's cache file if valid */
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK) {
        printf("mirrored_cl: no OpenCL device (%s): nothing to measure\n", dsgd_ctx_last_error(ctx));
        dsgd_ctx_destroy(ctx);
        return 0;
    }
    x = (float *)malloc(sizeof(float) * gb * IN);
    y = (float *)malloc(sizeof(float) * gb);
    if (!x || !y) return 1;
    for (i = 0; i < gb * IN; ++i) x[i] = (float)dsgd_rng_uniform(&rng);
    for (i = 0; i < gb; ++i) y[i] = (float)(dsgd_rng_next(&rng) % 10);

    for (k = 0; k < NV; ++k) {
        dsgd_strategy_desc d;
        memset(&d, 0, sizeof d);
        d.kind = DSGD_STRATEGY_MIRRORED;
        d.num_replicas = n;
        d.model.input_dim = IN;
        d.model.layers = g_layers;
        d.model.num_layers = 3;
        d.model.max_batch = BATCH;
        d.model.seed = 7;
        d.optimizer.kind = DSGD_OPT_MOMENTUM;
        d.optimizer.lr = 0.01f;
        d.optimizer.momentum = 0.9f;
        d.gradient_path = k == DEVICE ? DSGD_GRADIENTS_DEVICE : DSGD_GRADIENTS_HOST;
        d.timeout_s = 120.0; /* the first step compiles */
        fa[k].cl = cl;
        fa[k].hide_map = k == HOST_STAGE;
        d.backend_factory = factory;
        d.backend_user_data = &fa[k];
        if (dsgd_strategy_create(ctx, &d, &st[k]) != DSGD_OK) {
            fprintf(stderr, "mirrored_cl: %s: %s\n", names[k], dsgd_ctx_last_error(ctx));
            return 1;
        }
        t[k] = (double *)malloc(sizeof(double) * (size_t)rounds);
        if (!t[k]) return 1;
    }
    printf("bench/mirrored_cl: %d replicas on %s (%s), MLP 784-512-512-10, batch %d per replica; %d rounds of %d "
           "steps (median, after a warm-up round); POCL_MAX_PTHREAD_COUNT=%s gemm_tuned=%d\n",
           n, dsgd_cl_context_device_info(cl, 0)->device_name, dsgd_cl_context_device_info(cl, 0)->platform_name,
           BATCH, rounds, steps, getenv("POCL_MAX_PTHREAD_COUNT") ? getenv("POCL_MAX_PTHREAD_COUNT") : "unset",
           dsgd_cl_context_gemm_tuned(cl, 0));
    fflush(stdout);
    for (r = -1; r < rounds; ++r) {
        for (k = 0; k < NV; ++k) {
            double t0 = dsgd_now();
            for (s = 0; s < steps; ++s) {
                if (dsgd_strategy_train_step(st[k], x, y, (int)gb, NULL) != DSGD_OK) {
                    fprintf(stderr, "mirrored_cl: %s: %s\n", names[k], dsgd_ctx_last_error(ctx));
                    return 1;
                }
            }
            if (r >= 0) t[k][r] = (dsgd_now() - t0) / steps;
        }
    }
    for (k = 0; k < NV; ++k) med[k] = bench_median(t[k], rounds);
    printf("%-12s %10s %11s %14s\n", "gradients", "ms/step", "samples/s", "vs host-stage");
    for (k = 0; k < NV; ++k)
        printf("%-12s %10.3f %11.0f %13.3fx\n", names[k], 1e3 * med[k], (double)gb / med[k], med[k] / med[HOST_STAGE]);
    for (k = 0; k < NV; ++k)
        printf("mirrored_cl variant=%s replicas=%d ms_per_step=%.4f samples_per_s=%.1f vs_host_stage=%.4f\n", names[k],
               n, 1e3 * med[k], (double)gb / med[k], med[k] / med[HOST_STAGE]);
    for (k = 0; k < NV; ++k) {
        dsgd_strategy_destroy(st[k]);
        free(t[k]);
    }
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    free(x);
    free(y);
    return 0;
}
