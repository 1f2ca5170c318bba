/* mirrored_mlp.c - synchronous data parallelism: N mirrored replicas train an
   MLP on Fashion-MNIST (the `make demo` program).

   Each step shards the global batch across the replicas (one thread each),
   computes gradients, all-reduces the flat gradient buffer over the loopback
   transport and applies the same update everywhere, so the replicas stay
   bitwise identical. The learning rate follows the linear scaling rule with
   gradual warmup (Goyal et al. 2017): lr = base_lr * global_batch / 128.

   Run:  make demo                 (CPU backend)
         make demo ARGS="--backend opencl"
   or:   ./build/examples/mirrored_mlp --data DIR [--replicas N] [--batch B]
           [--algo auto|ring|hd|rb|rd|direct] [--epochs E] [--lr BASE_LR]
           [--seed S] [--backend cpu|opencl] [--device SPEC]
           [--gradients auto|host|device] [--hidden H1,H2] [--threads T]
   --threads is each CPU replica's thread count (0, the default: cores / N,
   at least 1; the weights do not depend on it).
   --batch is the per-replica batch (global batch = B x N); --hidden sets the
   two hidden layers' sizes (default 256,128: 784-256-128-10). DIR holds the
   uncompressed Fashion-MNIST IDX files (make demo prepares build/data/fashion-mnist).
   With --backend opencl every replica gets its own OpenCL backend (its own
   command queue) on one shared context; --device takes a device spec of
   distsgd_cl.h ("gpu", "cpu", "N", "P:D"; default: DSGD_CL_DEVICE or the
   first GPU, else the first device), and replicas are placed round-robin on
   the devices the context opened. --gradients chooses how the replicas'
   gradients are summed (dsgd_gradient_path): on the host through the
   transport, or, with OpenCL, by kernels reading every replica's buffer on
   the device; auto takes the device path when the buffers are not in
   host-shared memory (a discrete GPU), the host path otherwise (CPUs, PoCL). */
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <errno.h>
#include <limits.h>
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

/* The strategy's backend factory for --backend opencl: one backend (and
   command queue) per replica, devices taken round-robin. */
static dsgd_result opencl_backend(void *user_data, dsgd_ctx *ctx, int replica, dsgd_backend_i *out) {
    dsgd_cl_context *cl = (dsgd_cl_context *)user_data;
    dsgd_cl_backend_desc bd = {0};
    bd.device = replica % dsgd_cl_context_num_devices(cl);
    return dsgd_cl_backend_create(ctx, cl, &bd, out);
}

static int parse_algo(const char *s, dsgd_allreduce_algo *out) {
    static const struct { const char *name; dsgd_allreduce_algo algo; } table[] = {
        {"auto", DSGD_ALLREDUCE_AUTO}, {"ring", DSGD_ALLREDUCE_RING}, {"hd", DSGD_ALLREDUCE_HALVING_DOUBLING},
        {"rb", DSGD_ALLREDUCE_REDUCE_BROADCAST}, {"rd", DSGD_ALLREDUCE_RECURSIVE_DOUBLING},
        {"direct", DSGD_ALLREDUCE_DIRECT}};
    size_t i;
    for (i = 0; i < sizeof(table) / sizeof(table[0]); ++i)
        if (!strcmp(s, table[i].name)) { *out = table[i].algo; return 1; }
    return 0;
}

static int parse_path(const char *s, dsgd_gradient_path *out) {
    if (!strcmp(s, "auto")) *out = DSGD_GRADIENTS_AUTO;
    else if (!strcmp(s, "host")) *out = DSGD_GRADIENTS_HOST;
    else if (!strcmp(s, "device")) *out = DSGD_GRADIENTS_DEVICE;
    else return 0;
    return 1;
}

/* --hidden H1,H2: two positive decimal integers (no sign, no spaces) into the
   hidden layers' units. */
static int parse_hidden(const char *s, dsgd_layer_desc *layers) {
    long h[2];
    char *end;
    int i;
    for (i = 0; i < 2; ++i) {
        if (*s < '0' || *s > '9') return 0;
        errno = 0;
        h[i] = strtol(s, &end, 10);
        if (errno || h[i] < 1 || h[i] > INT_MAX || *end != (i == 0 ? ',' : '\0')) return 0;
        s = end + 1;
    }
    layers[0].units = (int)h[0];
    layers[1].units = (int)h[1];
    return 1;
}

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist", *backend = "cpu", *device = NULL;
    dsgd_cl_context *cl = NULL;
    int replicas = 4, batch = 64, epochs = 5, threads = 0, cpu_threads, a, e, global;
    float base_lr = 0.05f;
    uint64_t seed = 1;
    dsgd_allreduce_algo algo = DSGD_ALLREDUCE_AUTO;
    dsgd_gradient_path path = DSGD_GRADIENTS_AUTO;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_layer_desc layers[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                 {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_strategy_desc sd = {0};
    dsgd_strategy *strategy = NULL;
    dsgd_sampler sampler;
    float *xb, *yb;
    double t_start;
    size_t nb, eval_chunk;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--replicas") && a + 1 < argc) replicas = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--batch") && a + 1 < argc) batch = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--lr") && a + 1 < argc) base_lr = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--algo") && a + 1 < argc && parse_algo(argv[a + 1], &algo)) ++a;
        else if (!strcmp(argv[a], "--backend") && a + 1 < argc &&
                 (!strcmp(argv[a + 1], "cpu") || !strcmp(argv[a + 1], "opencl"))) backend = argv[++a];
        else if (!strcmp(argv[a], "--device") && a + 1 < argc) device = argv[++a];
        else if (!strcmp(argv[a], "--gradients") && a + 1 < argc && parse_path(argv[a + 1], &path)) ++a;
        else if (!strcmp(argv[a], "--threads") && a + 1 < argc) threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--hidden") && a + 1 < argc) {
            if (!parse_hidden(argv[++a], layers)) {
                fprintf(stderr, "%s: --hidden takes two positive integers H1,H2 (e.g. 256,128), not \"%s\"\n",
                        argv[0], argv[a]);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s [--data DIR] [--replicas N] [--batch B] [--algo auto|ring|hd|rb|rd|direct] "
                            "[--epochs E] [--lr BASE_LR] [--seed S] [--backend cpu|opencl] [--device SPEC] "
                            "[--gradients auto|host|device] [--hidden H1,H2] [--threads T]\n",
                    argv[0]);
            return 2;
        }
    }
    if (replicas < 1 || batch < 1 || epochs < 1) { fprintf(stderr, "replicas, batch and epochs must be >= 1\n"); return 2; }
    global = batch * replicas;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!load(ctx, dir, "train", &train) || !load(ctx, dir, "t10k", &test)) return fail(ctx);
    if (dsgd_sampler_init(ctx, &sampler, train.n, (size_t)global, seed, 1, 1) != DSGD_OK) return fail(ctx);
    nb = dsgd_sampler_num_batches(&sampler);

    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = replicas;
    sd.algorithm = algo;
    sd.gradient_path = path;
    sd.cpu_threads = threads;
    sd.model.input_dim = train.dim;
    sd.model.layers = layers;
    sd.model.num_layers = 3;
    sd.model.max_batch = batch > 1000 ? batch : 1000; /* evaluation uses 1000-sample shards */
    sd.model.seed = seed;
    sd.optimizer.kind = DSGD_OPT_MOMENTUM;
    sd.optimizer.nesterov = 1;
    sd.optimizer.lr = dsgd_linear_scaled_lr(base_lr, global, 128);
    sd.optimizer.schedule.kind = DSGD_SCHEDULE_COSINE;
    sd.optimizer.schedule.warmup_steps = (int64_t)nb / 2;
    sd.optimizer.schedule.total_steps = (int64_t)nb * epochs;
    eval_chunk = (size_t)replicas * (size_t)sd.model.max_batch;
    if (!strcmp(backend, "opencl")) {
        dsgd_cl_context_desc cd = {0};
        int d;
        cd.device = device;
        cd.max_devices = replicas;
        if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK) return fail(ctx);
        for (d = 0; d < dsgd_cl_context_num_devices(cl); ++d)
            printf("OpenCL device %d: %s (%s GEMM parameters)\n", d, dsgd_cl_context_device_info(cl, d)->device_name,
                   dsgd_cl_context_gemm_tuned(cl, d) ? "tuned" : "stock CLBlast");
        sd.backend_factory = opencl_backend;
        sd.backend_user_data = cl;
    }
    if (dsgd_strategy_create(ctx, &sd, &strategy) != DSGD_OK) return fail(ctx);
    /* the CPU backends chose their kernels as dsgd_cpu_isa() says (DSGD_CPU_ISA overrides) */
    cpu_threads = dsgd_cpu_backend_threads(dsgd_model_backend(dsgd_strategy_model(strategy, 0)));
    printf("Fashion-MNIST: %zu training, %zu test images; %d mirrored replicas x batch %d = global batch %d",
           train.n, test.n, replicas, batch, global);
    if (!strcmp(backend, "cpu"))
        printf("; CPU kernels %s%s, %d thread%s per replica", dsgd_cpu_isa(),
#ifdef DSGD_USE_CBLAS
               " with cblas_sgemm's GEMM (make demo BLAS=openblas)",
#else
               "",
#endif
               cpu_threads, cpu_threads == 1 ? "" : "s");
    printf("\n");
    printf("model %d-%d-%d-10 (%zu parameters) on the %s backend, SGD+Nesterov, lr %.4g (linear scaling of "
           "%.3g at 128), warmup %lld steps + cosine, gradients summed on the %s (all-reduce %s)\n",
           train.dim, layers[0].units, layers[1].units, dsgd_model_num_params(dsgd_strategy_model(strategy, 0)), backend,
           (double)sd.optimizer.lr, (double)base_lr,
           (long long)sd.optimizer.schedule.warmup_steps,
           dsgd_strategy_gradient_path(strategy) == DSGD_GRADIENTS_DEVICE ? "device" : "host",
           dsgd_strategy_gradient_path(strategy) == DSGD_GRADIENTS_DEVICE ? "unused" : dsgd_allreduce_algo_name(algo));

    xb = (float *)malloc(sizeof(float) * (size_t)global * train.dim);
    yb = (float *)malloc(sizeof(float) * (size_t)global);
    if (!xb || !yb) return 1;
    t_start = dsgd_now();
    for (e = 0; e < epochs; ++e) {
        size_t b, i;
        double t0 = dsgd_now(), dt, eta;
        dsgd_metrics tr, te;
        int skipped = 0;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            const size_t *idx;
            size_t n = dsgd_sampler_batch(&sampler, b, &idx);
            dsgd_step_info info;
            dsgd_dataset_gather(&train, idx, n, xb, yb);
            if (dsgd_strategy_train_step(strategy, xb, yb, (int)n, &info) != DSGD_OK) return fail(ctx);
            skipped += info.skipped;
        }
        dt = dsgd_now() - t0;
        for (i = 0; i < test.n; i += eval_chunk) { /* sharded too: at most max_batch per replica */
            size_t n = test.n - i < eval_chunk ? test.n - i : eval_chunk;
            if (dsgd_strategy_eval_batch(strategy, test.x + i * test.dim, test.y + i, (int)n) != DSGD_OK) return fail(ctx);
        }
        if (dsgd_strategy_take_metrics(strategy, DSGD_METRICS_TRAIN, &tr) != DSGD_OK ||
            dsgd_strategy_take_metrics(strategy, DSGD_METRICS_EVAL, &te) != DSGD_OK)
            return fail(ctx);
        eta = (dsgd_now() - t_start) / (e + 1) * (epochs - e - 1);
        printf("epoch %d/%d  loss %.4f  train acc %.4f  test acc %.4f  %.0f samples/s  ETA %.0f s%s\n", e + 1, epochs,
               tr.loss_sum / tr.count, tr.correct / tr.count, te.correct / te.count, tr.count / dt, eta,
               skipped ? "  (steps skipped: non-finite gradients)" : "");
        fflush(stdout);
        if (e == epochs - 1)
            printf("final test accuracy %.4f (%s 85%%) with %d replicas in %.1f s\n", te.correct / te.count,
                   te.correct / te.count >= 0.85 ? ">=" : "BELOW", replicas, dsgd_now() - t_start);
    }
    free(xb);
    free(yb);
    dsgd_sampler_free(&sampler);
    dsgd_strategy_destroy(strategy);
    dsgd_cl_context_destroy(cl); /* after the replicas' backends */
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return 0;
}
