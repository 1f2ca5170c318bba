/* train.c - training throughput of the mirrored strategy.

   Prints samples/s of the 784-256-128-10 MLP (Fashion-MNIST shapes, random
   data) with the mirrored strategy at N = 1, 2, 4 replicas and central
   storage at N = 2, 4, at a global batch of 256, and the cost of the strategy's path at N = 1 (ONE_DEVICE and
   MIRRORED with one replica) against a bare single-model loop
   (dsgd_model_compute_gradients + dsgd_optimizer_step). Rounds of each
   variant are interleaved and medians reported, since this machine is noisy.

   Run: make bench  (or ./build/bench/train [rounds]) */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdio.h>
#include <stdlib.h>

#include "bench_util.h"

#define GLOBAL 256
#define STEPS 20

static dsgd_layer_desc g_layers[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                      {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                      {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static dsgd_model_desc model_desc(void) {
    dsgd_model_desc md = {0};
    md.input_dim = 784;
    md.layers = g_layers;
    md.num_layers = 3;
    md.max_batch = GLOBAL;
    md.seed = 7;
    return md;
}

static dsgd_optimizer_desc opt_desc(void) {
    dsgd_optimizer_desc od = {0};
    od.kind = DSGD_OPT_MOMENTUM;
    od.lr = 0.01f;
    return od;
}

static void die(dsgd_ctx *ctx) {
    fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
    exit(1);
}

int main(int argc, char **argv) {
    enum { BARE, ONE_DEVICE, MIRRORED1, MIRRORED2, MIRRORED4, CENTRAL2, CENTRAL4, NV };
    static const char *names[NV] = {"bare loop (N=1)", "one_device (N=1)", "mirrored N=1", "mirrored N=2",
                                    "mirrored N=4",    "central N=2",      "central N=4"};
    int rounds = argc > 1 ? atoi(argv[1]) : 7, r, v, s;
    double *t[NV], med[NV];
    float *x, *y;
    uint64_t st = 99;
    dsgd_ctx *ctx;
    dsgd_model *bare;
    dsgd_optimizer *opt;
    dsgd_strategy *strat[NV] = {0};
    dsgd_model_desc md = model_desc();
    dsgd_optimizer_desc od = opt_desc();
    size_t i;

    if (rounds < 1) rounds = 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    x = (float *)malloc(sizeof(float) * GLOBAL * 784);
    y = (float *)malloc(sizeof(float) * GLOBAL);
    for (i = 0; i < (size_t)GLOBAL * 784; ++i) x[i] = (float)dsgd_rng_uniform(&st);
    for (i = 0; i < GLOBAL; ++i) y[i] = (float)(dsgd_rng_next(&st) % 10);
    if (dsgd_model_create(ctx, &md, &bare) != DSGD_OK || dsgd_optimizer_create(bare, &od, &opt) != DSGD_OK) die(ctx);
    for (v = ONE_DEVICE; v < NV; ++v) {
        dsgd_strategy_desc sd = {0};
        sd.kind = v == ONE_DEVICE ? DSGD_STRATEGY_ONE_DEVICE
                  : v >= CENTRAL2 ? DSGD_STRATEGY_CENTRAL_STORAGE
                                  : DSGD_STRATEGY_MIRRORED;
        sd.num_replicas = v == MIRRORED2 || v == CENTRAL2 ? 2 : v == MIRRORED4 || v == CENTRAL4 ? 4 : 1;
        sd.model = md;
        sd.model.max_batch = GLOBAL / sd.num_replicas;
        sd.optimizer = od;
        if (dsgd_strategy_create(ctx, &sd, &strat[v]) != DSGD_OK) die(ctx);
    }
    for (v = 0; v < NV; ++v) t[v] = (double *)malloc(sizeof(double) * (size_t)rounds);

    printf("bench/train: MLP 784-256-128-10, global batch %d, %d steps per round, %d rounds (median)\n", GLOBAL,
           STEPS, rounds);
    printf("threads: one per replica; OPENBLAS_NUM_THREADS=%s POCL_MAX_PTHREAD_COUNT=%s; CPU backend GEMM: %s\n",
           getenv("OPENBLAS_NUM_THREADS") ? getenv("OPENBLAS_NUM_THREADS") : "unset",
           getenv("POCL_MAX_PTHREAD_COUNT") ? getenv("POCL_MAX_PTHREAD_COUNT") : "unset",
#ifdef DSGD_USE_CBLAS
           "cblas"
#else
           "built-in blocked"
#endif
    );
    for (r = -1; r < rounds; ++r) { /* round -1 warms up */
        for (v = 0; v < NV; ++v) {
            double t0 = dsgd_now();
            for (s = 0; s < STEPS; ++s) {
                if (v == BARE) {
                    if (dsgd_model_compute_gradients(bare, x, y, GLOBAL, 1.0f / GLOBAL) != DSGD_OK ||
                        dsgd_optimizer_step(opt) != DSGD_OK)
                        die(ctx);
                } else if (dsgd_strategy_train_step(strat[v], x, y, GLOBAL, NULL) != DSGD_OK) {
                    die(ctx);
                }
            }
            if (r >= 0) t[v][r] = (dsgd_now() - t0) / STEPS;
        }
    }
    printf("%-20s %12s %12s %10s\n", "variant", "ms/step", "samples/s", "vs bare");
    for (v = 0; v < NV; ++v) med[v] = bench_median(t[v], rounds);
    for (v = 0; v < NV; ++v)
        printf("%-20s %12.3f %12.0f %9.3fx\n", names[v], 1e3 * med[v], GLOBAL / med[v], med[v] / med[BARE]);
    for (v = 0; v < NV; ++v)
        printf("train variant=\"%s\" ms_per_step=%.4f samples_per_s=%.1f ratio_vs_bare=%.4f\n", names[v], 1e3 * med[v],
               GLOBAL / med[v], med[v] / med[BARE]);
    printf("N=1 overhead of the mirrored path: %+.2f%% (one_device %+.2f%%); target <= 3%%\n",
           100.0 * (med[MIRRORED1] / med[BARE] - 1.0), 100.0 * (med[ONE_DEVICE] / med[BARE] - 1.0));
    for (v = 0; v < NV; ++v) {
        free(t[v]);
        dsgd_strategy_destroy(strat[v]);
    }
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(bare);
    free(x);
    free(y);
    dsgd_ctx_destroy(ctx);
    return 0;
}
