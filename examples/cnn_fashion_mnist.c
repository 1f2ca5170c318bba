/* cnn_fashion_mnist.c - a small CNN trained by 4 mirrored replicas on Fashion-MNIST.

   The network is the built-in one with image layers (NHWC, 28x28x1):
       conv 3x3 pad 1 x16 relu, max-pool 2   (28x28 -> 14x14)
       conv 3x3 pad 1 x32 relu, max-pool 2   (14x14 -> 7x7)
       dense 128 relu, dense 10              (the flatten is nothing)
   Each convolution is im2col + the backend's GEMM (the CPU backend's GEMM
   builds im2col block by block as it packs it). The replicas shard each
   global batch, all-reduce the flat gradient and apply the same update
   (SGD + Nesterov, linear scaling with warmup, cosine decay), as in
   mirrored_mlp.c. After the CNN it trains the demo's MLP (784-256-128-10)
   for the same epochs and prints both times and accuracies (--no-mlp skips
   it).

   Run:  make demo DEMO=cnn_fashion_mnist
   or:   ./build/examples/cnn_fashion_mnist --data DIR [--replicas N] [--batch B]
           [--epochs E] [--lr BASE_LR] [--seed S] [--backend cpu|opencl]
           [--threads T] [--no-mlp] [--subset N]
   DIR holds the uncompressed Fashion-MNIST IDX files (make demo prepares
   build/data/fashion-mnist). --batch is per replica. --subset N trains on
   the first N training images only (a quick run). The exit status is 3
   when a full run (no --subset) ends below 91% test accuracy. */
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The strategy's backend factory for --backend opencl: one backend (and
   command queue) per replica, devices taken round-robin. */
static dsgd_result opencl_backend(void *user_data, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_cl_context *cl = (dsgd_cl_context *)user_data;
    dsgd_cl_backend_desc bd = {.device = replica % dsgd_cl_context_num_devices(cl)};
    return dsgd_cl_backend_create(ctx, cl, &bd, out);
}

typedef struct run_opts {
    int replicas, batch, epochs, threads;
    float base_lr;
    uint64_t seed;
    dsgd_cl_context *cl; /* NULL: the CPU backend */
} run_opts;

typedef struct run_result {
    double seconds, test_acc;
    size_t params;
} run_result;

/* Trains the model md with the options; prints each epoch. */
static int train(dsgd_ctx *ctx, const char *name, const dsgd_model_desc *md, const run_opts *o,
                 const dsgd_dataset *train_set, const dsgd_dataset *test, run_result *out) {
    int global = o->batch * o->replicas, e;
    dsgd_strategy *s = NULL;
    dsgd_sampler sampler;
    size_t nb, eval_chunk;
    float *xb, *yb;
    double t_start;
    if (dsgd_sampler_init(ctx, &sampler, train_set->n, (size_t)global, o->seed, 1, 1) != DSGD_OK) return ex_fail(ctx);
    nb = dsgd_sampler_num_batches(&sampler);
    dsgd_strategy_desc sd = {
        .kind = DSGD_STRATEGY_MIRRORED,
        .num_replicas = o->replicas,
        .cpu_threads = o->threads,
        .model = *md,
        .optimizer = {.kind = DSGD_OPT_MOMENTUM, .nesterov = 1, .momentum = 0.9f,
                      .lr = dsgd_linear_scaled_lr(o->base_lr, global, 128),
                      .schedule = {.kind = DSGD_SCHEDULE_COSINE, .warmup_steps = (int64_t)nb / 2,
                                   .total_steps = (int64_t)nb * o->epochs}},
        .backend_factory = o->cl ? opencl_backend : NULL, /* NULL: a CPU backend per replica */
        .backend_user_data = o->cl,
    };
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) return ex_fail(ctx);
    out->params = dsgd_model_num_params(dsgd_strategy_model(s, 0));
    eval_chunk = (size_t)o->replicas * (size_t)md->max_batch;
    xb = (float *)malloc(sizeof(float) * (size_t)global * train_set->dim);
    yb = (float *)malloc(sizeof(float) * (size_t)global);
    if (!xb || !yb) return 1;
    printf("%s: %zu parameters, %d mirrored replicas x batch %d, lr %.4g\n", name, out->params, o->replicas, o->batch,
           (double)sd.optimizer.lr);
    t_start = dsgd_now();
    for (e = 0; e < o->epochs; ++e) {
        size_t b, i;
        double t0 = dsgd_now();
        dsgd_metrics tr, te;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            const size_t *idx = NULL;
            size_t n = dsgd_sampler_batch(&sampler, b, &idx);
            dsgd_dataset_gather(train_set, idx, n, xb, yb);
            if (dsgd_strategy_train_step(s, xb, yb, (int)n, NULL) != DSGD_OK) return ex_fail(ctx);
        }
        for (i = 0; i < test->n; i += eval_chunk) {
            size_t n = test->n - i < eval_chunk ? test->n - i : eval_chunk;
            if (dsgd_strategy_eval_batch(s, test->x + i * test->dim, test->y + i, (int)n) != DSGD_OK) return ex_fail(ctx);
        }
        if (dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &tr) != DSGD_OK ||
            dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &te) != DSGD_OK)
            return ex_fail(ctx);
        printf("  %s epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s\n", name, e + 1, o->epochs,
               tr.loss_sum / tr.count, tr.correct / tr.count, te.correct / te.count, tr.count / (dsgd_now() - t0));
        fflush(stdout);
        out->test_acc = te.correct / te.count;
    }
    out->seconds = dsgd_now() - t_start;
    free(xb);
    free(yb);
    dsgd_sampler_free(&sampler);
    dsgd_strategy_destroy(s);
    return 0;
}

/* Reads the flags into *o and the others; 0, or main's status 2 after
   saying what is wrong. */
static int parse_args(int argc, char **argv, run_opts *o, const char **dir, const char **backend, int *with_mlp,
                      long *subset) {
    const char *v;
    int a;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) *dir = v;
        else if ((v = ex_flag(argc, argv, &a, "--replicas"))) o->replicas = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--batch"))) o->batch = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) o->epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--lr"))) o->base_lr = (float)atof(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) o->seed = strtoull(v, NULL, 10);
        else if ((v = ex_flag(argc, argv, &a, "--threads"))) o->threads = atoi(v);
        else if (!strcmp(argv[a], "--no-mlp")) *with_mlp = 0;
        else if ((v = ex_flag(argc, argv, &a, "--subset"))) *subset = atol(v);
        else if (!strcmp(argv[a], "--backend") && a + 1 < argc &&
                 (!strcmp(argv[a + 1], "cpu") || !strcmp(argv[a + 1], "opencl"))) *backend = argv[++a];
        else
            return ex_usage(argv[0], "[--data DIR] [--replicas N] [--batch B] [--epochs E] [--lr BASE_LR] "
                                     "[--seed S] [--backend cpu|opencl] [--threads T] [--no-mlp]");
    }
    if (o->replicas < 1 || o->batch < 1 || o->epochs < 1 || o->threads < 0 || *subset < 0) {
        fprintf(stderr, "replicas, batch and epochs must be >= 1, threads and subset >= 0\n");
        return 2;
    }
    return 0;
}

/* --backend opencl: a context on up to N devices, into o->cl. 0, or 1 after the error. */
static int open_opencl(dsgd_ctx *ctx, run_opts *o) {
    dsgd_cl_context_desc cd = {.max_devices = o->replicas};
    if (dsgd_cl_context_create(ctx, &cd, &o->cl) != DSGD_OK) return ex_fail(ctx);
    printf("OpenCL device 0: %s\n", dsgd_cl_context_device_info(o->cl, 0)->device_name);
    return 0;
}

/* The CNN's layers on 28x28x1 images; the demo's MLP (784-256-128-10) beside it. */
static const dsgd_image_layer_desc IMAGE_LAYERS[4] = {
    {.kind = DSGD_IMAGE_CONV2D, .filters = 16, .kernel = 3, .stride = 1, .padding = 1, .activation = DSGD_ACT_RELU},
    {.kind = DSGD_IMAGE_MAXPOOL, .kernel = 2},
    {.kind = DSGD_IMAGE_CONV2D, .filters = 32, .kernel = 3, .stride = 1, .padding = 1, .activation = DSGD_ACT_RELU},
    {.kind = DSGD_IMAGE_MAXPOOL, .kernel = 2},
};
static const dsgd_layer_desc CNN_DENSE[2] = {{.units = 128, .activation = DSGD_ACT_RELU}, {.units = 10}};
static const dsgd_layer_desc MLP[3] = {{.units = 256, .activation = DSGD_ACT_RELU},
                                       {.units = 128, .activation = DSGD_ACT_RELU},
                                       {.units = 10}};

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist", *backend = "cpu";
    run_opts o = {.replicas = 4, .batch = 32, .epochs = 6, .base_lr = 0.05f, .seed = 1};
    run_result rc, rm;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train_set, test;
    int with_mlp = 1, status;
    long subset = 0;
    if ((status = parse_args(argc, argv, &o, &dir, &backend, &with_mlp, &subset))) return status;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_fashion_mnist(ctx, dir, &train_set, &test)) return ex_fail(ctx);
    if (subset > 0 && (size_t)subset < train_set.n) train_set.n = (size_t)subset; /* the first N images */
    if (!strcmp(backend, "opencl") && open_opencl(ctx, &o)) return 1;
    dsgd_model_desc cnn = {
        .image_layers = IMAGE_LAYERS,
        .num_image_layers = 4,
        .input_shape = {28, 28, 1},
        .layers = CNN_DENSE,
        .num_layers = 2,
        .max_batch = o.batch > 250 ? o.batch : 250, /* evaluation shards of 250 per replica */
        .seed = o.seed,
    };
    dsgd_model_desc dense = {.input_dim = (int)train_set.dim, .layers = MLP, .num_layers = 3,
                             .max_batch = cnn.max_batch, .seed = o.seed};
    printf("Fashion-MNIST: %zu training, %zu test images, %s backend%s\n", train_set.n, test.n, backend,
           strcmp(backend, "cpu") ? "" : " (CPU kernels as dsgd_cpu_isa() says)");
    if (train(ctx, "cnn", &cnn, &o, &train_set, &test, &rc)) return 1;
    printf("CNN: test accuracy %.4f (%s 91%%) after %d epochs in %.1f s\n", rc.test_acc,
           rc.test_acc >= 0.91 ? ">=" : "BELOW", o.epochs, rc.seconds);
    if (with_mlp) {
        if (train(ctx, "mlp", &dense, &o, &train_set, &test, &rm)) return 1;
        printf("MLP: test accuracy %.4f after %d epochs in %.1f s\n", rm.test_acc, o.epochs, rm.seconds);
        printf("CNN vs MLP: %+.2f points of test accuracy for %.1fx the time (%zu vs %zu parameters)\n",
               100.0 * (rc.test_acc - rm.test_acc), rc.seconds / rm.seconds, rc.params, rm.params);
    }
    status = subset == 0 && rc.test_acc < 0.91 ? 3 : 0; /* the full run's promise */
    dsgd_cl_context_destroy(o.cl);
    dsgd_dataset_free(&train_set);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return status;
}
