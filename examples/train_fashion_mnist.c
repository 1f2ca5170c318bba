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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(dsgd_ctx *ctx) {
    fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
    return 1;
}

static int load(dsgd_ctx *ctx, const char *dir, const char *prefix, dsgd_dataset *ds) {
    char img[1024], lab[1024];
    snprintf(img, sizeof(img), "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(lab, sizeof(lab), "%s/%s-labels-idx1-ubyte", dir, prefix);
    return dsgd_dataset_load_idx(ctx, img, lab, 10, ds) == DSGD_OK;
}

/* Accuracy and mean loss of the model on a whole dataset. */
static int evaluate(dsgd_model *m, const dsgd_dataset *ds, int batch, dsgd_metrics *out) {
    size_t i;
    for (i = 0; i < ds->n; i += (size_t)batch) {
        int n = (int)(ds->n - i < (size_t)batch ? ds->n - i : (size_t)batch);
        if (dsgd_model_eval_batch(m, ds->x + i * ds->dim, ds->y + i, n) != DSGD_OK) return 0;
    }
    return dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, out) == DSGD_OK;
}

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist";
    int epochs = 5, batch = 128, a, e;
    float lr = 0.05f;
    uint64_t seed = 1;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_layer_desc layers[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_model_desc md = {0};
    dsgd_optimizer_desc od = {0};
    dsgd_model *model = NULL;
    dsgd_optimizer *opt = NULL;
    dsgd_sampler sampler;
    float *xb, *yb;
    double t_start;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc) batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--lr") && a + 1 < argc) lr = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--data DIR] [--epochs N] [--batch B] [--lr LR] [--seed S]\n", argv[0]);
            return 2;
        }
    }
    if (epochs < 1 || batch < 1) { fprintf(stderr, "epochs and batch must be >= 1\n"); return 2; }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!load(ctx, dir, "train", &train) || !load(ctx, dir, "t10k", &test)) return fail(ctx);
    printf("Fashion-MNIST: %zu training and %zu test images of %d pixels\n", train.n, test.n, train.dim);

    md.input_dim = train.dim;
    md.layers = layers;
    md.num_layers = 3;
    md.max_batch = batch > 1000 ? batch : 1000;
    md.seed = seed;
    od.kind = DSGD_OPT_MOMENTUM;
    od.nesterov = 1;
    od.lr = lr;
    od.schedule.kind = DSGD_SCHEDULE_COSINE;
    if (dsgd_sampler_init(ctx, &sampler, train.n, (size_t)batch, seed, 1, 1) != DSGD_OK) return fail(ctx);
    od.schedule.warmup_steps = (int64_t)dsgd_sampler_num_batches(&sampler) / 2;
    od.schedule.total_steps = (int64_t)dsgd_sampler_num_batches(&sampler) * epochs;
    if (dsgd_model_create(ctx, &md, &model) != DSGD_OK || dsgd_optimizer_create(model, &od, &opt) != DSGD_OK)
        return fail(ctx);
    printf("model 784-256-128-10 (%zu parameters), batch %d, SGD+Nesterov lr %.3g, warmup + cosine, %d epochs\n",
           dsgd_model_num_params(model), batch, (double)lr, epochs);

    xb = (float *)malloc(sizeof(float) * (size_t)batch * train.dim);
    yb = (float *)malloc(sizeof(float) * (size_t)batch);
    if (!xb || !yb) return 1;
    t_start = dsgd_now();
    for (e = 0; e < epochs; ++e) {
        size_t b, nb = dsgd_sampler_num_batches(&sampler);
        double t0 = dsgd_now(), dt, eta;
        dsgd_metrics tr, te;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            const size_t *idx;
            size_t n = dsgd_sampler_batch(&sampler, b, &idx);
            dsgd_dataset_gather(&train, idx, n, xb, yb);
            if (dsgd_model_compute_gradients(model, xb, yb, (int)n, 1.0f / (float)n) != DSGD_OK ||
                dsgd_optimizer_step(opt) != DSGD_OK)
                return fail(ctx);
        }
        dt = dsgd_now() - t0;
        if (dsgd_model_take_metrics(model, DSGD_METRICS_TRAIN, &tr) != DSGD_OK || !evaluate(model, &test, 1000, &te))
            return fail(ctx);
        eta = (dsgd_now() - t_start) / (e + 1) * (epochs - e - 1);
        printf("epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s  ETA %.0f s\n", e + 1, epochs,
               tr.loss_sum / tr.count, tr.correct / tr.count, te.correct / te.count, tr.count / dt, eta);
        fflush(stdout);
        if (e == epochs - 1)
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
