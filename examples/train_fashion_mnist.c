/* train_fashion_mnist.c - one replica, an MLP on Fashion-MNIST.

   The single-replica training loop on a real dataset: IDX loading, a
   784-256-128-10 ReLU MLP, SGD with Nesterov momentum, a warmup-then-cosine
   learning-rate schedule, and a progress line per epoch.

   Run: make demo DEMO=train_fashion_mnist   (decompresses Debian's
        dataset-fashion-mnist into build/data/fashion-mnist first)
   or:  ./build/examples/train_fashion_mnist --data DIR [--epochs N]
        [--batch B] [--lr LR] [--seed S]
   DIR holds train-images-idx3-ubyte, train-labels-idx1-ubyte,
   t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (uncompressed). */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct options {
    const char *dir;
    int epochs, batch;
    float lr;
    uint64_t seed;
} options;

/* Reads the flags into *o; 0 on a bad flag. */
static int parse_args(int argc, char **argv, options *o) {
    const char *v;
    int a;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) o->dir = v;
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) o->epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--batch"))) o->batch = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--lr"))) o->lr = (float)atof(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) o->seed = strtoull(v, NULL, 10);
        else return 0;
    }
    return 1;
}

/* One epoch of the sampler's batches: gradient of the mean loss, then a step. */
static int train_epoch(dsgd_model *model, dsgd_optimizer *opt, dsgd_sampler *sampler, const dsgd_dataset *train,
                       float *xb, float *yb) {
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
    options o = {.dir = "build/data/fashion-mnist", .epochs = 5, .batch = 128, .lr = 0.05f, .seed = 1};
    int e;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_layer_desc layers[3] = {{.units = 256, .activation = DSGD_ACT_RELU},
                                 {.units = 128, .activation = DSGD_ACT_RELU},
                                 {.units = 10}};
    dsgd_model *model = NULL;
    dsgd_optimizer *opt = NULL;
    dsgd_sampler sampler;
    float *xb, *yb;
    double t_start;

    if (!parse_args(argc, argv, &o)) return ex_usage(argv[0], "[--data DIR] [--epochs N] [--batch B] [--lr LR] [--seed S]");
    if (o.epochs < 1 || o.batch < 1) { fprintf(stderr, "epochs and batch must be >= 1\n"); return 2; }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_fashion_mnist(ctx, o.dir, &train, &test)) return ex_fail(ctx);
    printf("Fashion-MNIST: %zu training and %zu test images of %d pixels\n", train.n, test.n, train.dim);

    if (dsgd_sampler_init(ctx, &sampler, train.n, (size_t)o.batch, o.seed, 1, 1) != DSGD_OK) return ex_fail(ctx);
    dsgd_model_desc md = {.input_dim = train.dim, .layers = layers, .num_layers = 3,
                          .max_batch = o.batch > 1000 ? o.batch : 1000, .seed = o.seed};
    int64_t nb = (int64_t)dsgd_sampler_num_batches(&sampler);
    dsgd_optimizer_desc od = {.kind = DSGD_OPT_MOMENTUM, .nesterov = 1, .lr = o.lr,
                              .schedule = {.kind = DSGD_SCHEDULE_COSINE, .warmup_steps = nb / 2,
                                           .total_steps = nb * o.epochs}};
    if (dsgd_model_create(ctx, &md, &model) != DSGD_OK || dsgd_optimizer_create(model, &od, &opt) != DSGD_OK)
        return ex_fail(ctx);
    printf("model 784-256-128-10 (%zu parameters), batch %d, SGD+Nesterov lr %.3g, warmup + cosine, %d epochs\n",
           dsgd_model_num_params(model), o.batch, (double)o.lr, o.epochs);

    xb = (float *)malloc(sizeof(float) * (size_t)o.batch * train.dim);
    yb = (float *)malloc(sizeof(float) * (size_t)o.batch);
    if (!xb || !yb) return 1;
    t_start = dsgd_now();
    for (e = 0; e < o.epochs; ++e) {
        double t0 = dsgd_now(), dt, eta;
        dsgd_metrics tr, te;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        if (!train_epoch(model, opt, &sampler, &train, xb, yb)) return ex_fail(ctx);
        dt = dsgd_now() - t0;
        if (dsgd_model_take_metrics(model, DSGD_METRICS_TRAIN, &tr) != DSGD_OK || !ex_evaluate(model, &test, 1000, &te))
            return ex_fail(ctx);
        eta = (dsgd_now() - t_start) / (e + 1) * (o.epochs - e - 1);
        printf("epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s  ETA %.0f s\n", e + 1, o.epochs,
               tr.loss_sum / tr.count, tr.correct / tr.count, te.correct / te.count, tr.count / dt, eta);
        fflush(stdout);
        if (e == o.epochs - 1)
            printf("final test accuracy %.4f (%s 85%%) in %.1f s\n", te.correct / te.count,
                   te.correct / te.count >= 0.85 ? ">=" : "BELOW", dsgd_now() - t_start);
    }
    free(xb);
    free(yb);
    dsgd_sampler_free(&sampler);
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(model);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return 0;
}
