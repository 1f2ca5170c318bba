/* train_digits.c - one replica, the CPU backend, the vendored UCI digits.

   Shows the smallest complete training loop of distsgd: load a CSV, split it,
   build a 64-64-10 MLP, train it with Adam, report test accuracy.

   Build and run from the repository root:
       make build/examples/train_digits && ./build/examples/train_digits
   Options: --data PATH (default examples/data/digits.csv), --epochs N, --seed S */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads the flags into *path, *epochs and *seed; 0 on a bad flag. */
static int parse_args(int argc, char **argv, const char **path, int *epochs, uint64_t *seed) {
    const char *v;
    int a;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) *path = v;
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) *epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) *seed = strtoull(v, NULL, 10);
        else return 0;
    }
    return 1;
}

/* One epoch of shuffled batches of 32: gradient, then Adam's step. */
static int train_epoch(dsgd_model *model, dsgd_optimizer *opt, dsgd_sampler *sampler, const dsgd_dataset *train) {
    float xb[32 * 64], yb[32];
    size_t b, nb = dsgd_sampler_num_batches(sampler);
    for (b = 0; b < nb; ++b) {
        const size_t *idx = NULL;
        size_t n = dsgd_sampler_batch(sampler, b, &idx);
        dsgd_dataset_gather(train, idx, n, xb, yb);
        if (dsgd_model_compute_gradients(model, xb, yb, (int)n, 1.0f / (float)n) != DSGD_OK ||
            dsgd_optimizer_step(opt) != DSGD_OK)
            return 0;
    }
    return 1;
}

int main(int argc, char **argv) {
    const char *path = "examples/data/digits.csv";
    int epochs = 30, e;
    uint64_t seed = 42;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_layer_desc layers[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};
    dsgd_model *model = NULL;
    dsgd_optimizer *opt = NULL;
    dsgd_sampler sampler;
    double t0;

    if (!parse_args(argc, argv, &path, &epochs, &seed))
        return ex_usage(argv[0], "[--data PATH] [--epochs N] [--seed S]");
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_digits(ctx, path, seed, &train, &test)) return ex_fail(ctx);

    dsgd_model_desc md = {.input_dim = 64, .layers = layers, .num_layers = 2, .max_batch = 512, .seed = seed};
    dsgd_optimizer_desc od = {.kind = DSGD_OPT_ADAM, .lr = 3e-3f};
    if (dsgd_model_create(ctx, &md, &model) != DSGD_OK || dsgd_optimizer_create(model, &od, &opt) != DSGD_OK ||
        dsgd_sampler_init(ctx, &sampler, train.n, 32, seed, 1, 0) != DSGD_OK)
        return ex_fail(ctx);

    t0 = dsgd_now();
    for (e = 0; e < epochs; ++e) {
        dsgd_metrics tr, te;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        if (!train_epoch(model, opt, &sampler, &train)) return ex_fail(ctx);
        dsgd_model_take_metrics(model, DSGD_METRICS_TRAIN, &tr);
        ex_evaluate(model, &test, 512, &te);
        if (e % 5 == 4 || e == epochs - 1)
            printf("epoch %2d  loss %.4f  train acc %.4f  test acc %.4f\n", e + 1, tr.loss_sum / tr.count,
                   tr.correct / tr.count, te.correct / te.count);
        if (e == epochs - 1) printf("test accuracy %.4f after %d epochs in %.2f s\n", te.correct / te.count, epochs,
                                    dsgd_now() - t0);
    }
    dsgd_sampler_free(&sampler);
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(model);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return 0;
}
