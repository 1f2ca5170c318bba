/* custom_model.c - a model written entirely in user code, trained by the library's strategies.

   The model is softmax regression over the vendored UCI digits (8x8 pixels,
   10 classes): logits = x W + b, with its own forward and backward written
   here in plain C over the host arrays of the CPU backend. The library never
   sees inside it: it lays out the two declared variables ("W" 64x10, "b"
   10) in its flat buffers, shards the batches, all-reduces the gradients,
   runs the optimizer and keeps the metrics.

   The same dsgd_model_desc trains with 4 mirrored replicas and then on
   parameter servers (2 servers, 4 asynchronous workers): the one thing that
   changes is which strategy gets it (`--strategy`).

   Build and run from the repository root:
       make build/examples/custom_model && ./build/examples/custom_model
   Options: --strategy mirrored|ps|both (default both), --epochs N, --data PATH */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { D = 64, K = 10, BATCH = 64 };

/* ---------------------------------------------------------------- the model, in user code */

/* Forward of one sample: z = x W + b; returns its loss and sets *correct. If
   dz is not NULL, dz = scale * (softmax(z) - onehot(y)). */
static double softmax_regression(const float *W, const float *b, const float *x, int y, float scale, float *dz,
                                 int *correct) {
    double z[K], mx, sum = 0.0;
    int i, k, arg = 0;
    for (k = 0; k < K; ++k) z[k] = b[k];
    for (i = 0; i < D; ++i)
        for (k = 0; k < K; ++k) z[k] += (double)x[i] * W[i * K + k];
    mx = z[0];
    for (k = 1; k < K; ++k)
        if (z[k] > mx) mx = z[k], arg = k;
    for (k = 0; k < K; ++k) sum += exp(z[k] - mx);
    if (dz)
        for (k = 0; k < K; ++k) dz[k] = scale * (float)(exp(z[k] - mx) / sum - (k == y));
    *correct = arg == y;
    return log(sum) + mx - z[y];
}

/* compute_gradients: grads = scale * d(sum of the batch's losses)/d(W, b).
   The library has zeroed the gradient buffer (the table does not set
   writes_all_gradients), so this only adds. */
static dsgd_result sr_gradients(void *state, dsgd_model *m, const dsgd_batch *batch, float scale,
                                dsgd_metrics *metrics) {
    const float *p = dsgd_model_host_params(m);
    float *g = dsgd_model_host_grads(m);
    const float *W = p, *b = p + D * K;
    float *dW = g, *db = g + D * K, dz[K];
    int n, i, k, correct;
    (void)state;
    for (n = 0; n < batch->count; ++n) {
        const float *x = batch->x + (size_t)n * D;
        metrics->loss_sum += softmax_regression(W, b, x, (int)batch->y[n], scale, dz, &correct);
        metrics->correct += correct;
        for (i = 0; i < D; ++i)
            for (k = 0; k < K; ++k) dW[i * K + k] += x[i] * dz[k];
        for (k = 0; k < K; ++k) db[k] += dz[k];
    }
    return DSGD_OK;
}

static dsgd_result sr_evaluate(void *state, dsgd_model *m, const dsgd_batch *batch, dsgd_metrics *metrics) {
    const float *p = dsgd_model_host_params(m);
    int n, correct;
    (void)state;
    for (n = 0; n < batch->count; ++n) {
        metrics->loss_sum += softmax_regression(p, p + D * K, batch->x + (size_t)n * D, (int)batch->y[n], 0.0f,
                                                NULL, &correct);
        metrics->correct += correct;
    }
    return DSGD_OK;
}

/* The host arrays exist on the CPU backend (the strategies' default). */
static dsgd_result sr_create(void *user_data, dsgd_model *m, void **state) {
    (void)user_data;
    *state = NULL;
    if (!dsgd_model_host_params(m))
        return dsgd_ctx_set_error(dsgd_model_ctx(m), DSGD_ERR_UNSUPPORTED,
                                  "softmax regression runs on host arrays: use the CPU backend");
    return DSGD_OK;
}

static const dsgd_model_i softmax_regression_model = {
    .name = "softmax_regression",
    .create = sr_create,
    .compute_gradients = sr_gradients,
    .evaluate = sr_evaluate,
};

/* The model's desc: the user model's table and its two variables. */
static dsgd_model_desc model_desc(void) {
    static const dsgd_variable_desc vars[2] = {
        {.name = "W", .rank = 2, .shape = {D, K}}, /* Glorot uniform (AUTO at rank 2) */
        {.name = "b", .rank = 1, .shape = {K}},    /* zeros (AUTO at rank 1) */
    };
    dsgd_model_desc md = {.custom = &softmax_regression_model, .variables = vars, .num_variables = 2,
                          .input_dim = D, .output_dim = K, .max_batch = 512, .seed = 7};
    return md;
}

/* ---------------------------------------------------------------- training */

/* Test accuracy of the weights p, on a fresh model of the same desc. */
static int evaluate(dsgd_ctx *ctx, const float *p, const dsgd_dataset *test, double *acc) {
    dsgd_model_desc md = model_desc();
    dsgd_model *m = NULL;
    dsgd_metrics mt;
    if (dsgd_model_create(ctx, &md, &m) != DSGD_OK || dsgd_model_set_params(m, p, dsgd_model_num_params(m)) != DSGD_OK ||
        !ex_evaluate(m, test, 512, &mt))
        return ex_fail(ctx);
    *acc = mt.correct / mt.count;
    dsgd_model_destroy(m);
    return 0;
}

/* 4 mirrored replicas train the user model with Adam; prints the test accuracy. */
static int train_mirrored(dsgd_ctx *ctx, const dsgd_dataset *train, const dsgd_dataset *test, int epochs) {
    dsgd_strategy_desc sd = {
        .kind = DSGD_STRATEGY_MIRRORED,
        .num_replicas = 4,
        .model = model_desc(), /* the user model: nothing else in the desc knows about it */
        .optimizer = {.kind = DSGD_OPT_ADAM, .lr = 1e-2f},
    };
    dsgd_strategy *s = NULL;
    dsgd_sampler sampler;
    float x[BATCH * D], y[BATCH], p[D * K + K];
    double t0 = dsgd_now(), acc;
    int e;
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK || dsgd_sampler_init(ctx, &sampler, train->n, BATCH, 1, 1, 0) != DSGD_OK)
        return ex_fail(ctx);
    for (e = 0; e < epochs; ++e) {
        size_t b, nb = dsgd_sampler_num_batches(&sampler);
        dsgd_metrics tr;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)e);
        for (b = 0; b < nb; ++b) {
            const size_t *idx = NULL;
            size_t n = dsgd_sampler_batch(&sampler, b, &idx);
            dsgd_dataset_gather(train, idx, n, x, y);
            if (dsgd_strategy_train_step(s, x, y, (int)n, NULL) != DSGD_OK) return ex_fail(ctx);
        }
        if (dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &tr) != DSGD_OK) return ex_fail(ctx);
        if (e % 5 == 4 || e == epochs - 1)
            printf("  mirrored x4  epoch %2d  train loss %.4f  train acc %.4f\n", e + 1, tr.loss_sum / tr.count,
                   tr.correct / tr.count);
    }
    if (dsgd_model_get_params(dsgd_strategy_model(s, 0), p, D * K + K) != DSGD_OK) return ex_fail(ctx);
    if (evaluate(ctx, p, test, &acc)) return 1;
    printf("mirrored, 4 replicas: test accuracy %.4f after %d epochs in %.2f s\n", acc, epochs, dsgd_now() - t0);
    dsgd_sampler_free(&sampler);
    dsgd_strategy_destroy(s);
    return 0;
}

/* One worker step on the parameter servers: its next batch, then pull,
   gradient of the user model, push. */
static dsgd_result ps_step(dsgd_cluster_worker *w, void *user) {
    const float *x, *y;
    int n;
    dsgd_result r;
    (void)user;
    if ((r = dsgd_cluster_worker_next_batch(w, &x, &y, &n, NULL)) != DSGD_OK) return r;
    return dsgd_cluster_worker_train_step(w, x, y, n);
}

/* The same model on 2 parameter servers and 4 asynchronous workers. */
static int train_ps(dsgd_ctx *ctx, const dsgd_dataset *train, const dsgd_dataset *test, int epochs) {
    dsgd_cluster_desc cd = {
        .ps = {.num_servers = 2, .num_workers = 4, .policy = DSGD_PS_ASYNC,
               .optimizer = {.kind = DSGD_OPT_ADAM, .lr = 1e-2f}},
        .model = model_desc(), /* the same user model */
    };
    dsgd_cluster *c = NULL;
    float p[D * K + K];
    double t0 = dsgd_now(), acc;
    int steps = epochs * (int)(train->n / BATCH), i;
    if (dsgd_cluster_create(ctx, &cd, &c) != DSGD_OK || dsgd_cluster_set_dataset(c, train, BATCH, 1) != DSGD_OK)
        return ex_fail(ctx);
    for (i = 0; i < steps; ++i)
        if (dsgd_cluster_schedule(c, ps_step, NULL, NULL) != DSGD_OK) return ex_fail(ctx);
    if (dsgd_cluster_join(c) != DSGD_OK || dsgd_cluster_shutdown(c) != DSGD_OK || dsgd_cluster_read_params(c, p) != DSGD_OK)
        return ex_fail(ctx);
    if (evaluate(ctx, p, test, &acc)) return 1;
    printf("parameter servers, 2 servers + 4 async workers: test accuracy %.4f after %d pushes in %.2f s\n", acc,
           steps, dsgd_now() - t0);
    dsgd_cluster_destroy(c);
    return 0;
}

int main(int argc, char **argv) {
    const char *path = "examples/data/digits.csv", *strategy = "both";
    int epochs = 30, a, rc = 0;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    const char *v;
    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) path = v;
        else if ((v = ex_flag(argc, argv, &a, "--epochs"))) epochs = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--strategy"))) strategy = v;
        else return ex_usage(argv[0], "[--strategy mirrored|ps|both] [--epochs N] [--data PATH]");
    }
    if (epochs < 1 || (strcmp(strategy, "mirrored") && strcmp(strategy, "ps") && strcmp(strategy, "both"))) {
        fprintf(stderr, "error: --epochs must be >= 1 and --strategy one of mirrored, ps, both\n");
        return 2;
    }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_digits(ctx, path, 42, &train, &test)) return ex_fail(ctx); /* pixels 0..16, scaled to 0..1 */
    printf("softmax regression in user code (%s), %zu training and %zu test digits\n",
           softmax_regression_model.name, train.n, test.n);
    if (strcmp(strategy, "ps")) rc = train_mirrored(ctx, &train, &test, epochs);
    if (!rc && strcmp(strategy, "mirrored")) rc = train_ps(ctx, &train, &test, epochs);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return rc;
}
