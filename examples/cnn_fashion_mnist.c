/* cnn_fashion_mnist.c - a small CNN trained by 4 mirrored replicas on Fashion-MNIST.

   The network is the built-in one with image layers (NHWC, 28x28x1):
       conv 3x3 pad 1 x16 relu, max-pool 2   (28x28 -> 14x14)
       conv 3x3 pad 1 x32 relu, max-pool 2   (14x14 -> 7x7)
       dense 128 relu, dense 10              (the flatten is nothing)
   Each convolution is im2col + the backend's GEMM. The replicas shard each
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

static dsgd_result opencl_backend(void *user_data, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_cl_context *cl = (dsgd_cl_context *)user_data;
    dsgd_cl_backend_desc bd;
    memset(&bd, 0, sizeof(bd));
    bd.device = replica % dsgd_cl_context_num_devices(cl);
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
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    dsgd_sampler sampler;
    size_t nb, eval_chunk;
    float *xb, *yb;
    double t_start;
    memset(&sd, 0, sizeof(sd));
    if (dsgd_sampler_init(ctx, &sampler, train_set->n, (size_t)global, o->seed, 1, 1) != DSGD_OK) return fail(ctx);
    nb = dsgd_sampler_num_batches(&sampler);
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = o->replicas;
    sd.cpu_threads = o->threads;
    sd.model = *md;
    sd.optimizer.kind = DSGD_OPT_MOMENTUM;
    sd.optimizer.nesterov = 1;
    sd.optimizer.momentum = 0.9f;
    sd.optimizer.lr = dsgd_linear_scaled_lr(o->base_lr, global, 128);
    sd.optimizer.schedule.kind = DSGD_SCHEDULE_COSINE;
    sd.optimizer.schedule.warmup_steps = (int64_t)nb / 2;
    sd.optimizer.schedule.total_steps = (int64_t)nb * o->epochs;
    if (o->cl) {
        sd.backend_factory = opencl_backend;
        sd.backend_user_data = o->cl;
    }
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) return fail(ctx);
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
            if (dsgd_strategy_train_step(s, xb, yb, (int)n, NULL) != DSGD_OK) return fail(ctx);
        }
        for (i = 0; i < test->n; i += eval_chunk) {
            size_t n = test->n - i < eval_chunk ? test->n - i : eval_chunk;
            if (dsgd_strategy_eval_batch(s, test->x + i * test->dim, test->y + i, (int)n) != DSGD_OK) return fail(ctx);
        }
        if (dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &tr) != DSGD_OK ||
            dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &te) != DSGD_OK)
            return fail(ctx);
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

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist", *backend = "cpu";
    static const dsgd_image_layer_desc image[4] = {
        {DSGD_IMAGE_CONV2D, 16, 3, 1, 1, DSGD_ACT_RELU, DSGD_INIT_AUTO},
        {DSGD_IMAGE_MAXPOOL, 0, 2, 0, 0, DSGD_ACT_NONE, DSGD_INIT_AUTO},
        {DSGD_IMAGE_CONV2D, 32, 3, 1, 1, DSGD_ACT_RELU, DSGD_INIT_AUTO},
        {DSGD_IMAGE_MAXPOOL, 0, 2, 0, 0, DSGD_ACT_NONE, DSGD_INIT_AUTO},
    };
    static const dsgd_layer_desc cnn_dense[2] = {{128, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    static const dsgd_layer_desc mlp[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                           {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                           {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    run_opts o;
    run_result rc, rm;
    dsgd_model_desc cnn, dense;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train_set, test;
    int a, with_mlp = 1, status = 0;
    long subset = 0;
    memset(&o, 0, sizeof(o));
    o.replicas = 4;
    o.batch = 32;
    o.epochs = 6;
    o.base_lr = 0.05f;
    o.seed = 1;
    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--replicas") && a + 1 < argc) o.replicas = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc) o.batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) o.epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--lr") && a + 1 < argc) o.base_lr = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) o.seed = strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--threads") && a + 1 < argc) o.threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--no-mlp")) with_mlp = 0;
        else if (!strcmp(argv[a], "--subset") && a + 1 < argc) subset = atol(argv[++a]);
        else if (!strcmp(argv[a], "--backend") && a + 1 < argc &&
                 (!strcmp(argv[a + 1], "cpu") || !strcmp(argv[a + 1], "opencl"))) backend = argv[++a];
        else {
            fprintf(stderr, "usage: %s [--data DIR] [--replicas N] [--batch B] [--epochs E] [--lr BASE_LR] "
                            "[--seed S] [--backend cpu|opencl] [--threads T] [--no-mlp]\n", argv[0]);
            return 2;
        }
    }
    if (o.replicas < 1 || o.batch < 1 || o.epochs < 1 || o.threads < 0 || subset < 0) {
        fprintf(stderr, "replicas, batch and epochs must be >= 1, threads and subset >= 0\n");
        return 2;
    }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!load(ctx, dir, "train", &train_set) || !load(ctx, dir, "t10k", &test)) return fail(ctx);
    if (subset > 0 && (size_t)subset < train_set.n) train_set.n = (size_t)subset; /* the first N images */
    if (!strcmp(backend, "opencl")) {
        dsgd_cl_context_desc cd;
        memset(&cd, 0, sizeof(cd));
        cd.max_devices = o.replicas;
        if (dsgd_cl_context_create(ctx, &cd, &o.cl) != DSGD_OK) return fail(ctx);
        printf("OpenCL device 0: %s\n", dsgd_cl_context_device_info(o.cl, 0)->device_name);
    }
    memset(&cnn, 0, sizeof(cnn));
    cnn.image_layers = image;
    cnn.num_image_layers = 4;
    cnn.input_shape[0] = 28;
    cnn.input_shape[1] = 28;
    cnn.input_shape[2] = 1;
    cnn.layers = cnn_dense;
    cnn.num_layers = 2;
    cnn.max_batch = o.batch > 250 ? o.batch : 250; /* evaluation shards of 250 per replica */
    cnn.seed = o.seed;
    dense = cnn;
    dense.image_layers = NULL;
    dense.num_image_layers = 0;
    memset(dense.input_shape, 0, sizeof(dense.input_shape));
    dense.input_dim = (int)train_set.dim;
    dense.layers = mlp;
    dense.num_layers = 3;
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
