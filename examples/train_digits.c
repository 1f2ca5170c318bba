/* train_digits.c - one replica, the CPU backend, the vendored UCI digits.

   Shows the smallest complete training loop of distsgd: load a CSV, split it,
   build a 64-64-10 MLP, train it with Adam, report test accuracy.

   Build and run from the repository root:
       make build/examples/train_digits && ./build/examples/train_digits
   Options: --data PATH (default examples/data/digits.csv), --epochs N, --seed S */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    const char *path = "examples/data/digits.csv";
    int epochs = 30, a, e;
    uint64_t seed = 42;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset all, train, test;
    dsgd_csv_desc csv = {0};
    dsgd_layer_desc layers[2] = {{64, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_model_desc md = {0};
    dsgd_optimizer_desc od = {0};
    dsgd_model *model = NULL;
    dsgd_optimizer *opt = NULL;
    dsgd_sampler sampler;
    float xb[32 * 64], yb[32];
    double t0;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) path = argv[++a];
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else { fprintf(stderr, "usage: %s [--data PATH] [--epochs N] [--seed S]\n", argv[0]); return 2; }
    }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;

    csv.num_classes = 10;
    csv.feature_scale = 1.0f / 16.0f; /* pixels are 0..16 */
    if (dsgd_dataset_load_csv(ctx, path, &csv, &all) != DSGD_OK ||
        dsgd_dataset_split(ctx, &all, 1400, seed, &train, &test) != DSGD_OK) {
        fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    dsgd_dataset_free(&all);

    md.input_dim = 64;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 512;
    md.seed = seed;
    od.kind = DSGD_OPT_ADAM;
    od.lr = 3e-3f;
    if (dsgd_model_create(ctx, &md, &model) != DSGD_OK || dsgd_optimizer_create(model, &od, &opt) != DSGD_OK ||
        dsgd_sampler_init(ctx, &sampler, train.n, 32, seed, 1, 0) != DSGD_OK) {
        fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }

    t0 = dsgd_now();
    for (e = 0; e < epochs; ++e) {
        size_t b, nb = dsgd_sampler_num_batches(&sampler), i;
        dsgd_metrics tr, te;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            const size_t *idx;
            size_t n = dsgd_sampler_batch(&sampler, b, &idx);
            dsgd_dataset_gather(&train, idx, n, xb, yb);
            if (dsgd_model_compute_gradients(model, xb, yb, (int)n, 1.0f / (float)n) != DSGD_OK ||
                dsgd_optimizer_step(opt) != DSGD_OK) {
                fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
                return 1;
            }
        }
        dsgd_model_take_metrics(model, DSGD_METRICS_TRAIN, &tr);
        for (i = 0; i < test.n; i += 512) {
            int n = (int)(test.n - i < 512 ? test.n - i : 512);
            dsgd_model_eval_batch(model, test.x + i * test.dim, test.y + i, n);
        }
        dsgd_model_take_metrics(model, DSGD_METRICS_EVAL, &te);
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
