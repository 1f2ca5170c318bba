/* gradient_compression.c - the gradient exchanged in fewer bytes: a
   compression comm hook (distsgd/compress.h) on a mirrored strategy, and
   what it costs in accuracy.

   Trains the Fashion-MNIST MLP (784-256-128-10) with 4 mirrored replicas
   for 5 epochs, once per way of exchanging the gradient, from the same
   seed and the same batches:
     fp32         the strategy's own all-reduce (no hook)
     fp16, bf16   half the bytes on the wire, sums in fp32 at every hop,
                  one power-of-two scale agreed by all (no overflow, no
                  flush to zero)
     topk         1% of each variable's entries, with error feedback, and
                  without it (topk-noef) for comparison, and after a first
                  epoch all-reduced densely (topk-warm: start_iter, Deep
                  Gradient Compression's warm-up)
     topk-mc, topk-sw, topk-dgc
                  top-k 1% with Deep Gradient Compression's momentum
                  correction (the hook keeps the Nesterov momentum, the
                  optimizer is plain SGD), its sparsity warm-up over the
                  first epoch (1/4, 1/16, 1/64 kept, then 1%), both
     sign         one bit a float and a scale per variable, error feedback
     powersgd     rank 2, error feedback, warm start
   and prints each one's test accuracy, the bytes a replica sent per step
   (dsgd_strategy_comm_stats: what the transport carried, agreements
   included), how many times fewer than the fp32 run's, and the seconds
   spent compressing (all replicas together).

   Run:  ./build/examples/gradient_compression --data DIR [--epochs E]
           [--replicas N] [--only NAME] [--no-times]
   --no-times leaves out the compression seconds (the one column that
   differs from run to run).
   DIR holds the uncompressed Fashion-MNIST IDX files (make demo prepares
   build/data/fashion-mnist). */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define USAGE "--data DIR [--epochs E] [--replicas N] [--only NAME] [--no-times]"

typedef struct method {
    const char *name;
    int hook; /* 0: no hook (the all-reduce) */
    dsgd_compress_desc cd; /* with momentum correction the optimizer is plain SGD */
} method;

/* One run: accuracy into *acc, the comm stats into *cs; 1 when it ran. */
static int run(dsgd_ctx *ctx, const method *m, const dsgd_dataset *train, const dsgd_dataset *test, int replicas,
               int epochs, double *acc, dsgd_comm_stats *cs, long *steps) {
    static const dsgd_layer_desc layers[3] = {
        {.units = 256, .activation = DSGD_ACT_RELU}, {.units = 128, .activation = DSGD_ACT_RELU}, {.units = 10}};
    const int batch = 32, global = batch * replicas;
    dsgd_comm_hook hook = m->hook ? dsgd_compress_hook(&m->cd) : (dsgd_comm_hook){0};
    dsgd_strategy_desc sd = {
        .kind = DSGD_STRATEGY_MIRRORED,
        .num_replicas = replicas,
        .model = {.input_dim = train->dim, .layers = layers, .num_layers = 3, .max_batch = batch, .seed = 1},
        .optimizer = {.kind = DSGD_OPT_MOMENTUM, .momentum = 0.9f, .nesterov = 1,
                      .lr = dsgd_linear_scaled_lr(0.05f, global, 128)},
        .algorithm = DSGD_ALLREDUCE_RING, /* message passing, so the wire is what the transport carries */
        .comm_hook = m->hook ? &hook : NULL,
        .cpu_threads = 1,
    };
    dsgd_strategy *s = NULL;
    dsgd_sampler smp;
    if (m->cd.momentum > 0.0f) sd.optimizer.kind = DSGD_OPT_SGD; /* the hook keeps the momentum */
    dsgd_metrics te;
    float *xb = (float *)malloc(sizeof(float) * (size_t)global * train->dim), *yb = (float *)malloc(sizeof(float) * (size_t)global);
    size_t k, i;
    const size_t *idx;
    int ok = 0;
    *steps = 0;
    if (!xb || !yb || dsgd_sampler_init(ctx, &smp, train->n, (size_t)global, 7, 1, 1) != DSGD_OK) goto done;
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) goto done_smp;
    for (; smp.epoch < (uint64_t)epochs; dsgd_sampler_set_epoch(&smp, smp.epoch + 1))
        while ((k = dsgd_sampler_next(&smp, &idx)) > 0) {
            for (i = 0; i < k; ++i) {
                memcpy(xb + i * train->dim, train->x + idx[i] * train->dim, sizeof(float) * train->dim);
                yb[i] = train->y[idx[i]];
            }
            if (dsgd_strategy_train_step(s, xb, yb, (int)k, NULL) != DSGD_OK) goto done_s;
            ++*steps;
        }
    if (dsgd_strategy_comm_stats(s, cs) != DSGD_OK) goto done_s;
    if (!ex_evaluate(dsgd_strategy_model(s, 0), test, batch, &te)) goto done_s;
    *acc = te.correct / te.count;
    ok = 1;
done_s:
    dsgd_strategy_destroy(s);
done_smp:
    dsgd_sampler_free(&smp);
done:
    free(xb);
    free(yb);
    return ok;
}

int main(int argc, char **argv) {
    const char *dir = NULL, *only = NULL, *v;
    int epochs = 5, replicas = 4, a, i, ran = 0, times = 1;
    dsgd_ctx *ctx;
    dsgd_dataset train, test;
    double base = -1, base_bytes = 0;
    method ms[12];
    memset(ms, 0, sizeof(ms));
    ms[0].name = "fp32";
    ms[1].name = "fp16", ms[1].hook = 1, ms[1].cd.kind = DSGD_COMPRESS_FP16;
    ms[2].name = "bf16", ms[2].hook = 1, ms[2].cd.kind = DSGD_COMPRESS_BF16;
    ms[3].name = "topk", ms[3].hook = 1, ms[3].cd.kind = DSGD_COMPRESS_TOPK;
    ms[4].name = "topk-noef", ms[4].hook = 1, ms[4].cd.kind = DSGD_COMPRESS_TOPK, ms[4].cd.no_error_feedback = 1;
    ms[5].name = "sign", ms[5].hook = 1, ms[5].cd.kind = DSGD_COMPRESS_SIGN;
    ms[6].name = "powersgd", ms[6].hook = 1, ms[6].cd.kind = DSGD_COMPRESS_POWERSGD;
    ms[7].name = "topk-warm", ms[7].hook = 1, ms[7].cd.kind = DSGD_COMPRESS_TOPK; /* start_iter: below */
    /* Deep Gradient Compression: momentum correction (the hook's momentum,
       the optimizer plain SGD), sparsity warm-up over the first epoch, both */
    ms[8].name = "topk-mc", ms[8].hook = 1, ms[8].cd.kind = DSGD_COMPRESS_TOPK;
    ms[8].cd.momentum = 0.9f, ms[8].cd.nesterov = 1;
    ms[9].name = "topk-sw", ms[9].hook = 1, ms[9].cd.kind = DSGD_COMPRESS_TOPK; /* warmup_steps: below */
    ms[10] = ms[8], ms[10].name = "topk-dgc";
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) dir = v;
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--replicas"))) replicas = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--only"))) only = v;
        else if (!strcmp(argv[a], "--no-times")) times = 0;
        else return ex_usage(argv[0], USAGE);
    }
    if (!dir || epochs < 1 || replicas < 2) return ex_usage(argv[0], USAGE);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_fashion_mnist(ctx, dir, &train, &test)) return ex_fail(ctx);
    printf("Fashion-MNIST MLP 784-256-128-10, %d mirrored replicas x 32 samples, %d epochs, ring all-reduce\n",
           replicas, epochs);
    printf("%-10s %9s %8s %16s %12s %11s\n", "method", "accuracy", "vs fp32", "bytes/step sent", "fewer than",
           times ? "compress s" : "");
    ms[7].cd.start_iter = (int64_t)(train.n / (size_t)(32 * replicas)); /* one epoch dense */
    ms[9].cd.warmup_steps = ms[10].cd.warmup_steps = ms[7].cd.start_iter; /* one epoch of rising sparsity */
    for (i = 0; i < 11; ++i) {
        double acc = 0;
        long steps = 0;
        dsgd_comm_stats cs;
        if (only && strcmp(only, ms[i].name) != 0) continue;
        if (!run(ctx, &ms[i], &train, &test, replicas, epochs, &acc, &cs, &steps)) return ex_fail(ctx);
        if (i == 0) {
            base = acc;
            base_bytes = (double)cs.bytes_sent;
        }
        printf("%-10s %8.2f%% ", ms[i].name, 100 * acc);
        if (base >= 0) printf("%+7.2f", 100 * (acc - base)); /* against the fp32 row, when it ran */
        else printf("%7s", "-");
        printf(" %16.0f", (double)cs.bytes_sent / (double)steps / replicas);
        if (base_bytes > 0 && cs.bytes_sent) printf(" %11.1fx", base_bytes / (double)cs.bytes_sent);
        else printf(" %12s", "-");
        if (times) printf(" %11.2f", cs.compress_s);
        printf("\n");
        fflush(stdout);
        ++ran;
    }
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    if (!ran) return ex_usage(argv[0], "--only fp32|fp16|bf16|topk|topk-noef|sign|powersgd|topk-warm|topk-mc|topk-sw|topk-dgc");
    return 0;
}
