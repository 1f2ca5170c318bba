/* bench/cnn.c - the CNN of examples/cnn_fashion_mnist.c, one step on the CPU
   backend and on the OpenCL backend; and the model interface's overhead at
   N = 1.

   1. CNN step time. One model (N = 1), batch 64, 28x28x1 NHWC:
        conv 3x3 pad 1 x16 relu, max-pool 2, conv 3x3 pad 1 x32 relu,
        max-pool 2, dense 128 relu, dense 10 (softmax cross-entropy)
      A step is dsgd_model_compute_gradients + dsgd_optimizer_step (SGD,
      momentum 0.9), random data. Variants, interleaved in the same run:
        cpu      the CPU backend, threads = T
        opencl   the OpenCL backend on the default device (PoCL here, on T
                 threads through POCL_MAX_PTHREAD_COUNT; the tuned CLBlast
                 GEMM when the tuning cache has the device); skipped, with a
                 line saying so, when there is no OpenCL device
      One warm-up round, then `rounds` timed rounds of `steps` steps (the
      backend finished at the end of each), a 0.2 s pause after each turn so
      that the other variant's idle threads stop spinning; the median per
      step. GFLOP/s counts the step's GEMMs, 2 m n k each, from the layer
      shapes: forward, weight gradient and (except for layer 0) input
      gradient of every conv and dense layer.
      Then a profile of each backend: its operations wrapped by timers (the
      OpenCL one finishes the queue after each operation, so its sum is a
      little above its step), per operation and per GEMM shape.
   2. The interface's overhead at N = 1. The demo's MLP 784-256-128-10 at
      batch 64 through a ONE_DEVICE strategy's dsgd_strategy_train_step
      (momentum), CPU backend on T threads, three strategies in the same run:
        builtin-a, builtin-b   the built-in network, twice
        custom                 the same network as a dsgd_model_i written
                               here in user code over the backend's
                               operations (general over a dense layer list;
                               test_custom_model.c's "twin" idea), starting
                               from builtin's initial values
      Interleaved rounds (the order rotates every round), per-round ratios
      against builtin-a. The noise is builtin-b / builtin-a: the spread of
      two identical strategies' ratio over the same rounds. custom is within
      noise when its median per-round ratio lies inside builtin-b's
      interquartile range of per-round ratios. All three see the same
      batches, so their parameters must end bitwise equal (checked).

   Threads: T for every variant; --threads T, else POCL_MAX_PTHREAD_COUNT
   when set, else the online cores (bench_pocl_threads: PoCL reads its
   thread count once, so T is one per process).

   Run: build/bench/cnn [--threads T] [--rounds R] [--steps S]
        [--mlp-rounds R] [--mlp-steps S] [--cpu-only]   (bench/cnn.sh runs
   it beside PyTorch, and again with DSGD_CPU_ISA=avx2 --cpu-only on an
   AVX-512 machine). --cpu-only: the CPU backend's rows alone (no OpenCL,
   no interface overhead). POCL_CACHE_DIR must name a writable directory.
   The first line names the CPU and the CPU backend's kernels
   (dsgd_cpu_isa; DSGD_CPU_ISA forces them). The last lines are
   machine-readable:
     RESULT cnn backend=NAME threads=T ms_per_step=.. samples_per_s=.. gflops=.. time_vs_cpu=.. isa=..
     RESULT mlp_overhead threads=T builtin_ms=.. custom_ms=.. ratio=.. noise_lo=.. noise_hi=.. within_noise=.. */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_models.h"
#include "bench_util.h"
#include "../tools/cl_gemm_measure.h"

#define BATCH 64

static void die(dsgd_ctx *ctx, const char *what) {
    fprintf(stderr, "cnn: %s: %s\n", what, dsgd_ctx_last_error(ctx));
    exit(1);
}

static void pause_ms(long ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "cnn: out of memory\n");
        exit(1);
    }
    return p;
}

static dsgd_model_desc cnn_desc(const dsgd_backend_i *be) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof md);
    md.image_layers = g_image;
    md.num_image_layers = 4;
    md.input_shape[0] = g_shape[0];
    md.input_shape[1] = g_shape[1];
    md.input_shape[2] = g_shape[2];
    md.layers = g_cnn_dense;
    md.num_layers = 2;
    md.max_batch = BATCH;
    md.seed = 7;
    md.backend = be;
    return md;
}

/* The GEMM flops of one training step (forward + backward) of the CNN at
   batch B: 2 m n k per GEMM; forward and weight gradient for every conv and
   dense layer, the input gradient for every layer but the network's first
   (the built-in network skips dx of layer 0). conv_out: the conv layers'
   share. */
static double cnn_gemm_flops(int B, double *conv_out) {
    int h = g_shape[0], w = g_shape[1], c = g_shape[2], i, first = 1, in;
    double total = 0.0, conv = 0.0;
    for (i = 0; i < 4; ++i) {
        const dsgd_image_layer_desc *L = &g_image[i];
        int conv2d = L->kind == DSGD_IMAGE_CONV2D;
        int stride = L->stride ? L->stride : (conv2d ? 1 : L->kernel), pad = conv2d ? L->padding : 0;
        int oh = (h + 2 * pad - L->kernel) / stride + 1, ow = (w + 2 * pad - L->kernel) / stride + 1;
        if (conv2d) {
            double g = 2.0 * B * oh * ow * (double)(L->kernel * L->kernel * c) * L->filters;
            conv += g * (first ? 2 : 3);
            c = L->filters;
        }
        h = oh;
        w = ow;
        first = 0;
    }
    total = conv;
    in = h * w * c;
    for (i = 0; i < 2; ++i) {
        total += 2.0 * B * in * (double)g_cnn_dense[i].units * (first ? 2 : 3);
        first = 0;
        in = g_cnn_dense[i].units;
    }
    if (conv_out) *conv_out = conv;
    return total;
}

/* ---------------------------------------------------------------- profile: a backend's operations timed */

enum { OP_GEMM, OP_CONV_GEMM, OP_CONV_DX, OP_IM2COL, OP_COL2IM, OP_POOL_F, OP_POOL_B, OP_BIAS_ACT, OP_ACT_B, OP_BIAS_B, OP_LOSS,
       OP_OPT, OP_WRITE, OP_COUNT };
static const char *const g_op_names[OP_COUNT] = {"gemm", "conv_gemm", "conv_backward_x", "im2col", "col2im", "maxpool_forward",
                                                 "maxpool_backward", "bias_act_forward", "act_backward",
                                                 "bias_backward", "loss", "optimizer_update", "write (upload)"};

typedef struct gemm_rec {
    int ta, tb, m, n, k; /* tb -1: conv_gemm (A = im2col(x)) */
    double t;
    long calls;
} gemm_rec;

/* One profiled backend at a time (a bench; globals are fine here). */
static dsgd_backend_i g_orig;
static int g_sync;
static double g_op_t[OP_COUNT];
static long g_op_n[OP_COUNT];
static gemm_rec g_gemms[32];
static int g_ngemm;

static double prof_end(int op, double t0, dsgd_result *r) {
    double dt;
    if (*r == DSGD_OK && g_sync && g_orig.finish) *r = g_orig.finish(g_orig.impl);
    dt = dsgd_now() - t0;
    g_op_t[op] += dt;
    g_op_n[op]++;
    return dt;
}

static void gemm_record(int ta, int tb, int m, int n, int k, double dt) {
    int i;
    for (i = 0; i < g_ngemm; ++i)
        if (g_gemms[i].ta == ta && g_gemms[i].tb == tb && g_gemms[i].m == m && g_gemms[i].n == n && g_gemms[i].k == k)
            break;
    if (i == g_ngemm && g_ngemm < 32) {
        memset(&g_gemms[i], 0, sizeof g_gemms[i]);
        g_gemms[i].ta = ta;
        g_gemms[i].tb = tb;
        g_gemms[i].m = m;
        g_gemms[i].n = n;
        g_gemms[i].k = k;
        ++g_ngemm;
    }
    if (i < g_ngemm) {
        g_gemms[i].t += dt;
        g_gemms[i].calls++;
    }
}
static dsgd_result p_gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha, dsgd_ref a, int lda, dsgd_ref b,
                          int ldb, float beta, dsgd_ref c, int ldc) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.gemm(impl, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    gemm_record(ta, tb, m, n, k, prof_end(OP_GEMM, t0, &r));
    return r;
}
static dsgd_result p_conv_gemm(void *impl, const dsgd_window *wd, int ta, int n, float alpha, dsgd_ref x, dsgd_ref b,
                               int ldb, float beta, dsgd_ref c, int ldc) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.conv_gemm(impl, wd, ta, n, alpha, x, b, ldb, beta, c, ldc);
    const int rows = wd->n * ((wd->h + 2 * wd->pad - wd->kh) / wd->stride + 1) *
                     ((wd->w + 2 * wd->pad - wd->kw) / wd->stride + 1), kk = wd->kh * wd->kw * wd->c;
    gemm_record(ta, -1, ta ? kk : rows, n, ta ? rows : kk, prof_end(OP_CONV_GEMM, t0, &r));
    return r;
}
static dsgd_result p_conv_dx(void *impl, const dsgd_window *wd, int f, dsgd_ref dy, dsgd_ref w, dsgd_ref dx) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.conv_backward_x(impl, wd, f, dy, w, dx);
    prof_end(OP_CONV_DX, t0, &r);
    return r;
}
static dsgd_result p_im2col(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref col) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.im2col(impl, wd, x, col);
    prof_end(OP_IM2COL, t0, &r);
    return r;
}
static dsgd_result p_col2im(void *impl, const dsgd_window *wd, dsgd_ref col, dsgd_ref dx) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.col2im(impl, wd, col, dx);
    prof_end(OP_COL2IM, t0, &r);
    return r;
}
static dsgd_result p_pool_f(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.maxpool_forward(impl, wd, x, y);
    prof_end(OP_POOL_F, t0, &r);
    return r;
}
static dsgd_result p_pool_b(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y, dsgd_ref dy, dsgd_ref dx) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.maxpool_backward(impl, wd, x, y, dy, dx);
    prof_end(OP_POOL_B, t0, &r);
    return r;
}
static dsgd_result p_bias_act(void *impl, dsgd_activation act, dsgd_ref y, dsgd_ref bias, int m, int n) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.bias_act_forward(impl, act, y, bias, m, n);
    prof_end(OP_BIAS_ACT, t0, &r);
    return r;
}
static dsgd_result p_act_b(void *impl, dsgd_activation act, dsgd_ref dy, dsgd_ref y, size_t n) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.act_backward(impl, act, dy, y, n);
    prof_end(OP_ACT_B, t0, &r);
    return r;
}
static dsgd_result p_bias_b(void *impl, dsgd_ref db, dsgd_ref dy, int m, int n) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.bias_backward(impl, db, dy, m, n);
    prof_end(OP_BIAS_B, t0, &r);
    return r;
}
static dsgd_result p_loss(void *impl, dsgd_loss loss, int m, int c, dsgd_ref pred, dsgd_ref target, float grad_scale,
                          dsgd_ref dpred, dsgd_ref stats) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.loss(impl, loss, m, c, pred, target, grad_scale, dpred, stats);
    prof_end(OP_LOSS, t0, &r);
    return r;
}
static dsgd_result p_opt(void *impl, const dsgd_opt_update *u, dsgd_ref param, dsgd_ref grad, dsgd_ref m1, dsgd_ref m2,
                         size_t n) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.optimizer_update(impl, u, param, grad, m1, m2, n);
    prof_end(OP_OPT, t0, &r);
    return r;
}
static dsgd_result p_write(void *impl, dsgd_ref dst, const float *src, size_t count) {
    double t0 = dsgd_now();
    dsgd_result r = g_orig.write(impl, dst, src, count);
    prof_end(OP_WRITE, t0, &r);
    return r;
}

/* be with its compute operations timed (be is kept in g_orig; the copy
   shares its impl). */
static dsgd_backend_i prof_wrap(const dsgd_backend_i *be, int sync) {
    dsgd_backend_i p = *be;
    g_orig = *be;
    g_sync = sync;
    p.destroy = NULL; /* the original is destroyed by its owner */
    p.gemm = p_gemm;
    if (be->conv_gemm) p.conv_gemm = p_conv_gemm;
    if (be->conv_backward_x) p.conv_backward_x = p_conv_dx;
    p.im2col = p_im2col;
    p.col2im = p_col2im;
    p.maxpool_forward = p_pool_f;
    p.maxpool_backward = p_pool_b;
    p.bias_act_forward = p_bias_act;
    p.act_backward = p_act_b;
    p.bias_backward = p_bias_b;
    p.loss = p_loss;
    p.optimizer_update = p_opt;
    p.write = p_write;
    return p;
}

/* Profiles `steps` CNN steps on be (after 3 untimed ones) and prints where
   the time goes. */
static void profile(dsgd_ctx *ctx, const char *name, const dsgd_backend_i *be, int sync, const float *x, const float *y,
                    int steps, double step_median) {
    dsgd_backend_i p = prof_wrap(be, sync);
    dsgd_model_desc md = cnn_desc(&p);
    dsgd_optimizer_desc od;
    dsgd_model *m = NULL;
    dsgd_optimizer *o = NULL;
    double t0 = 0.0, total, sum = 0.0;
    int s, i;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_MOMENTUM;
    od.lr = 0.01f;
    od.momentum = 0.9f;
    if (dsgd_model_create(ctx, &md, &m) != DSGD_OK || dsgd_optimizer_create(m, &od, &o) != DSGD_OK)
        die(ctx, "profile");
    for (s = -3; s < steps; ++s) {
        if (s == 0) {
            if (p.finish && p.finish(p.impl) != DSGD_OK) die(ctx, name);
            memset(g_op_t, 0, sizeof g_op_t);
            memset(g_op_n, 0, sizeof g_op_n);
            g_ngemm = 0;
            t0 = dsgd_now();
        }
        if (dsgd_model_compute_gradients(m, x, y, BATCH, 1.0f / BATCH) != DSGD_OK || dsgd_optimizer_step(o) != DSGD_OK)
            die(ctx, name);
    }
    if (p.finish && p.finish(p.impl) != DSGD_OK) die(ctx, name);
    total = (dsgd_now() - t0) / steps;
    printf("\nprofile %s: %d steps, %.3f ms/step with the timers (timed step: %.3f ms)%s\n", name, steps, 1e3 * total,
           1e3 * step_median, sync ? "; the queue finished after every operation" : "");
    printf("  %-18s %6s %10s %7s\n", "operation", "calls", "ms/step", "share");
    for (i = 0; i < OP_COUNT; ++i) {
        if (!g_op_n[i]) continue;
        sum += g_op_t[i];
        printf("  %-18s %6ld %10.3f %6.1f%%\n", g_op_names[i], g_op_n[i] / steps, 1e3 * g_op_t[i] / steps,
               100.0 * g_op_t[i] / steps / total);
    }
    printf("  %-18s %6s %10.3f %6.1f%%\n", "rest", "", 1e3 * (total - sum / steps),
           100.0 * (total - sum / steps) / total);
    printf("  GEMMs by shape (C(m,n) = op(A)(m,k) op(B)(k,n)):\n");
    for (i = 0; i < g_ngemm; ++i) {
        const gemm_rec *g = &g_gemms[i];
        double ms = 1e3 * g->t / steps, fl = 2.0 * g->m * g->n * (double)g->k * (double)g->calls / steps;
        printf("    %s%s m=%-6d n=%-4d k=%-6d %8.3f ms/step %7.1f GFLOP/s%s\n", g->ta ? "T" : "N", g->tb > 0 ? "T" : "N",
               g->m, g->n, g->k, ms, fl / (ms * 1e-3) * 1e-9, g->tb < 0 ? "  (conv_gemm: A = im2col)" : "");
    }
    dsgd_optimizer_destroy(o);
    dsgd_model_destroy(m);
}

/* ---------------------------------------------------------------- the MLP as a model of your own */

/* A dense network (relu/none layers, softmax cross-entropy) in user code,
   over the backend's operations, in the order the built-in network runs
   them, so that it trains the same bits. user_data: a umlp_cfg. */
#define UMLP_MAX 8

typedef struct umlp_cfg {
    int input_dim;
    const dsgd_layer_desc *layers;
    int num_layers;
} umlp_cfg;

typedef struct umlp_state {
    const dsgd_backend_i *be;
    const umlp_cfg *cfg;
    int dims[UMLP_MAX + 1];
    size_t act_off[UMLP_MAX + 1]; /* acts: x, then each layer's output, (maxb, dims[l]) */
    size_t half;                  /* delta: two halves of (maxb, widest layer) */
    size_t W[UMLP_MAX], B[UMLP_MAX];
    dsgd_buffer *acts, *delta, *targets;
} umlp_state;

static dsgd_ref R(dsgd_buffer *b, size_t off) {
    dsgd_ref r;
    r.buf = b;
    r.off = off;
    return r;
}

static void umlp_destroy(void *state) {
    umlp_state *t = (umlp_state *)state;
    if (t->acts) t->be->buffer_destroy(t->be->impl, t->acts);
    if (t->delta) t->be->buffer_destroy(t->be->impl, t->delta);
    if (t->targets) t->be->buffer_destroy(t->be->impl, t->targets);
    free(t);
}

static dsgd_result umlp_create(void *user_data, dsgd_model *m, void **state) {
    const umlp_cfg *cfg = (const umlp_cfg *)user_data;
    umlp_state *t = (umlp_state *)calloc(1, sizeof *t);
    size_t maxb = (size_t)dsgd_model_max_batch(m), widest = 0;
    dsgd_result r;
    int l;
    if (!t) return DSGD_ERR_OUT_OF_MEMORY;
    if (cfg->num_layers > UMLP_MAX) {
        free(t);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    t->be = dsgd_model_backend(m);
    t->cfg = cfg;
    t->dims[0] = cfg->input_dim;
    t->act_off[0] = 0;
    for (l = 0; l < cfg->num_layers; ++l) {
        t->dims[l + 1] = cfg->layers[l].units;
        t->act_off[l + 1] = t->act_off[l] + maxb * (size_t)t->dims[l];
        if ((size_t)t->dims[l + 1] > widest) widest = (size_t)t->dims[l + 1];
        t->W[l] = dsgd_model_variable(m, 2 * l)->offset;
        t->B[l] = dsgd_model_variable(m, 2 * l + 1)->offset;
    }
    t->half = maxb * widest;
    if ((r = t->be->buffer_create(t->be->impl, t->act_off[cfg->num_layers] + maxb * (size_t)t->dims[cfg->num_layers],
                                  &t->acts)) != DSGD_OK ||
        (r = t->be->buffer_create(t->be->impl, 2 * t->half, &t->delta)) != DSGD_OK ||
        (r = t->be->buffer_create(t->be->impl, maxb, &t->targets)) != DSGD_OK) {
        umlp_destroy(t);
        return r;
    }
    *state = t;
    return DSGD_OK;
}

/* acts[l+1] (M, out) = act(acts[l] (M, in) W (in, out) + b), layer by layer */
static dsgd_result umlp_forward(umlp_state *t, dsgd_model *m, const dsgd_batch *b) {
    const dsgd_backend_i *be = t->be;
    dsgd_buffer *P = dsgd_model_params(m).buf;
    int M = b->count, l;
    dsgd_result r;
    if ((r = be->write(be->impl, R(t->acts, 0), b->x, (size_t)M * t->dims[0])) != DSGD_OK) return r;
    if (b->y && (r = be->write(be->impl, R(t->targets, 0), b->y, (size_t)M)) != DSGD_OK) return r;
    for (l = 0; l < t->cfg->num_layers; ++l) {
        int in = t->dims[l], out = t->dims[l + 1];
        if ((r = be->gemm(be->impl, 0, 0, M, out, in, 1.0f, R(t->acts, t->act_off[l]), in, R(P, t->W[l]), out, 0.0f,
                          R(t->acts, t->act_off[l + 1]), out)) != DSGD_OK ||
            (r = be->bias_act_forward(be->impl, t->cfg->layers[l].activation, R(t->acts, t->act_off[l + 1]),
                                      R(P, t->B[l]), M, out)) != DSGD_OK)
            return r;
    }
    return DSGD_OK;
}

static dsgd_result umlp_gradients(void *state, dsgd_model *m, const dsgd_batch *b, float scale, dsgd_metrics *mt) {
    umlp_state *t = (umlp_state *)state;
    const dsgd_backend_i *be = t->be;
    dsgd_buffer *P = dsgd_model_params(m).buf, *G = dsgd_model_grads(m).buf;
    int M = b->count, L = t->cfg->num_layers, l, cur = 0;
    dsgd_result r;
    (void)mt; /* the loss operation accumulates the metrics on the device */
    if ((r = umlp_forward(t, m, b)) != DSGD_OK) return r;
    if ((r = be->loss(be->impl, DSGD_LOSS_SOFTMAX_XENT, M, t->dims[L], R(t->acts, t->act_off[L]), R(t->targets, 0),
                      scale, R(t->delta, 0), dsgd_model_stats(m, DSGD_METRICS_TRAIN))) != DSGD_OK)
        return r;
    for (l = L - 1; l >= 0; --l) {
        int in = t->dims[l], out = t->dims[l + 1];
        dsgd_ref dy = R(t->delta, (size_t)cur * t->half), dx = R(t->delta, (size_t)(1 - cur) * t->half);
        if (t->cfg->layers[l].activation != DSGD_ACT_NONE &&
            (r = be->act_backward(be->impl, t->cfg->layers[l].activation, dy, R(t->acts, t->act_off[l + 1]),
                                  (size_t)M * out)) != DSGD_OK)
            return r;
        /* dW = x^T dy, db = column sums of dy, dx = dy W^T (not for layer 0) */
        if ((r = be->gemm(be->impl, 1, 0, in, out, M, 1.0f, R(t->acts, t->act_off[l]), in, dy, out, 0.0f,
                          R(G, t->W[l]), out)) != DSGD_OK ||
            (r = be->bias_backward(be->impl, R(G, t->B[l]), dy, M, out)) != DSGD_OK)
            return r;
        if (l > 0 && (r = be->gemm(be->impl, 0, 1, M, in, out, 1.0f, dy, out, R(P, t->W[l]), out, 0.0f, dx, in)) != DSGD_OK)
            return r;
        cur = 1 - cur;
    }
    return DSGD_OK;
}

static dsgd_result umlp_evaluate(void *state, dsgd_model *m, const dsgd_batch *b, dsgd_metrics *mt) {
    umlp_state *t = (umlp_state *)state;
    int L = t->cfg->num_layers;
    dsgd_result r = umlp_forward(t, m, b);
    (void)mt;
    if (r != DSGD_OK || !b->y) return r;
    return t->be->loss(t->be->impl, DSGD_LOSS_SOFTMAX_XENT, b->count, t->dims[L], R(t->acts, t->act_off[L]),
                       R(t->targets, 0), 0.0f, R(NULL, 0), dsgd_model_stats(m, DSGD_METRICS_EVAL));
}

/* writes_all_gradients: every dW and db is written, as the built-in's */
static const dsgd_model_i umlp_model = {"user_mlp", umlp_create, umlp_destroy, umlp_gradients, umlp_evaluate, 1};

static dsgd_strategy *one_device(dsgd_ctx *ctx, const dsgd_model_desc *md, int threads) {
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    memset(&sd, 0, sizeof sd);
    sd.kind = DSGD_STRATEGY_ONE_DEVICE;
    sd.num_replicas = 1;
    sd.cpu_threads = threads;
    sd.model = *md;
    sd.optimizer.kind = DSGD_OPT_MOMENTUM;
    sd.optimizer.lr = 0.01f;
    sd.optimizer.momentum = 0.9f;
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) die(ctx, "one_device strategy");
    return s;
}

static double quantile(const double *sorted, int n, double q) {
    double p = q * (n - 1);
    int i = (int)p;
    if (i >= n - 1) return sorted[n - 1];
    return sorted[i] + (p - i) * (sorted[i + 1] - sorted[i]);
}

/* Part 2; prints its table and RESULT line. */
static void mlp_overhead(dsgd_ctx *ctx, int threads, int rounds, int steps) {
    enum { NV = 3 };
    static const char *const names[NV] = {"builtin-a", "builtin-b", "custom"};
    umlp_cfg cfg;
    dsgd_model_desc bd, cd;
    dsgd_variable_desc vars[2 * UMLP_MAX];
    char vnames[2 * UMLP_MAX][DSGD_MAX_NAME];
    dsgd_strategy *s[NV];
    dsgd_model *m0 = NULL;
    float *init, *x, *y, *pa, *pc;
    double *t[NV], *rb, *rc, med[NV], qb[3], qc[3];
    size_t np, i;
    uint64_t st = 1234;
    int r, k, v, nvars, equal_b, equal_c, within;

    memset(&bd, 0, sizeof bd);
    bd.input_dim = MLP_IN;
    bd.layers = g_mlp;
    bd.num_layers = 3;
    bd.max_batch = BATCH;
    bd.seed = 11;
    /* the built-in's initial values, for the custom model's variables */
    if (dsgd_model_create(ctx, &bd, &m0) != DSGD_OK) die(ctx, "built-in MLP");
    np = dsgd_model_num_params(m0);
    nvars = dsgd_model_num_variables(m0);
    init = (float *)xmalloc(sizeof(float) * np);
    if (dsgd_model_get_params(m0, init, np) != DSGD_OK) die(ctx, "get params");
    memset(vars, 0, sizeof vars);
    for (v = 0; v < nvars; ++v) {
        const dsgd_variable *bv = dsgd_model_variable(m0, v);
        memcpy(vnames[v], bv->name, DSGD_MAX_NAME);
        vars[v].name = vnames[v];
        vars[v].rank = bv->rank;
        vars[v].shape[0] = bv->shape[0];
        vars[v].shape[1] = bv->shape[1];
        vars[v].initial = init + bv->offset;
    }
    dsgd_model_destroy(m0);
    cfg.input_dim = MLP_IN;
    cfg.layers = g_mlp;
    cfg.num_layers = 3;
    memset(&cd, 0, sizeof cd);
    cd.custom = &umlp_model;
    cd.user_data = &cfg;
    cd.variables = vars;
    cd.num_variables = nvars;
    cd.input_dim = MLP_IN;
    cd.output_dim = 10;
    cd.max_batch = BATCH;

    s[0] = one_device(ctx, &bd, threads);
    s[1] = one_device(ctx, &bd, threads);
    s[2] = one_device(ctx, &cd, threads);
    x = (float *)xmalloc(sizeof(float) * BATCH * MLP_IN);
    y = (float *)xmalloc(sizeof(float) * BATCH);
    for (i = 0; i < (size_t)BATCH * MLP_IN; ++i) x[i] = (float)dsgd_rng_uniform(&st);
    for (i = 0; i < BATCH; ++i) y[i] = (float)(dsgd_rng_next(&st) % 10);
    for (k = 0; k < NV; ++k) t[k] = (double *)xmalloc(sizeof(double) * (size_t)rounds);
    rb = (double *)xmalloc(sizeof(double) * (size_t)rounds);
    rc = (double *)xmalloc(sizeof(double) * (size_t)rounds);

    printf("\n== the interface's overhead at N = 1: MLP 784-256-128-10 relu, batch %d, ONE_DEVICE "
           "dsgd_strategy_train_step, momentum, CPU backend on %d thread%s\n",
           BATCH, threads, threads == 1 ? "" : "s");
    printf("%d rounds of %d steps after one warm-up round; the order of the three rotates every round\n", rounds, steps);
    fflush(stdout);
    for (r = -1; r < rounds; ++r) {
        for (v = 0; v < NV; ++v) {
            double t0;
            int step;
            k = (v + (r < 0 ? 0 : r)) % NV;
            t0 = dsgd_now();
            for (step = 0; step < steps; ++step)
                if (dsgd_strategy_train_step(s[k], x, y, BATCH, NULL) != DSGD_OK) die(ctx, names[k]);
            if (r >= 0) t[k][r] = (dsgd_now() - t0) / steps;
        }
        if (r >= 0) {
            rb[r] = t[1][r] / t[0][r];
            rc[r] = t[2][r] / t[0][r];
        }
    }
    /* the same batches from the same initial values: the same bits */
    pa = (float *)xmalloc(sizeof(float) * np);
    pc = (float *)xmalloc(sizeof(float) * np);
    if (dsgd_model_get_params(dsgd_strategy_model(s[0], 0), pa, np) != DSGD_OK) die(ctx, "params");
    if (dsgd_model_get_params(dsgd_strategy_model(s[1], 0), pc, np) != DSGD_OK) die(ctx, "params");
    equal_b = !memcmp(pa, pc, sizeof(float) * np);
    if (dsgd_model_get_params(dsgd_strategy_model(s[2], 0), pc, np) != DSGD_OK) die(ctx, "params");
    equal_c = !memcmp(pa, pc, sizeof(float) * np);

    for (k = 0; k < NV; ++k) med[k] = bench_median(t[k], rounds);
    bench_median(rb, rounds); /* sorts */
    bench_median(rc, rounds);
    qb[0] = quantile(rb, rounds, 0.25);
    qb[1] = quantile(rb, rounds, 0.5);
    qb[2] = quantile(rb, rounds, 0.75);
    qc[0] = quantile(rc, rounds, 0.25);
    qc[1] = quantile(rc, rounds, 0.5);
    qc[2] = quantile(rc, rounds, 0.75);
    within = qc[1] >= qb[0] && qc[1] <= qb[2];
    printf("%-10s %10s %11s %26s\n", "model", "ms/step", "samples/s", "per-round ratio to a: p25 / median / p75");
    for (k = 0; k < NV; ++k) {
        printf("%-10s %10.4f %11.0f", names[k], 1e3 * med[k], BATCH / med[k]);
        if (k == 1) printf("   %.4f / %.4f / %.4f  (the noise)", qb[0], qb[1], qb[2]);
        if (k == 2) printf("   %.4f / %.4f / %.4f", qc[0], qc[1], qc[2]);
        printf("\n");
    }
    printf("custom / built-in: %.4f (median per-round ratio; ratio of medians %.4f); built-in / built-in: %.4f, "
           "interquartile range [%.4f, %.4f]: %s\n",
           qc[1], med[2] / med[0], qb[1], qb[0], qb[2], within ? "within noise" : "NOT within noise");
    printf("parameters after %d steps: builtin-b %s builtin-a, custom %s builtin-a\n", (rounds + 1) * steps,
           equal_b ? "==" : "!=", equal_c ? "== (bit for bit)" : "!= (NOT bitwise equal)");
    printf("RESULT mlp_overhead threads=%d builtin_ms=%.4f builtin_b_ms=%.4f custom_ms=%.4f ratio=%.4f noise_ratio=%.4f "
           "noise_lo=%.4f noise_hi=%.4f within_noise=%d bitwise_equal=%d\n",
           threads, 1e3 * med[0], 1e3 * med[1], 1e3 * med[2], qc[1], qb[1], qb[0], qb[2], within, equal_c);
    for (k = 0; k < NV; ++k) {
        dsgd_strategy_destroy(s[k]);
        free(t[k]);
    }
    free(rb);
    free(rc);
    free(pa);
    free(pc);
    free(init);
    free(x);
    free(y);
}

/* ---------------------------------------------------------------- main */

typedef struct variant {
    const char *name;
    dsgd_backend_i be;
    dsgd_model *m;
    dsgd_optimizer *opt;
    double *t;
    double med;
} variant;

int main(int argc, char **argv) {
    enum { MAXV = 2 };
    int rounds = 7, steps = 10, mlp_rounds = 31, mlp_steps = 20, threads = 0, a, r, k, s, nv = 0, icl = -1;
    int prof_steps = 10, cpu_only = 0;
    char cpu_model[128];
    variant v[MAXV];
    dsgd_ctx *ctx;
    dsgd_cl_context *cl = NULL;
    dsgd_cl_context_desc ccd;
    dsgd_cpu_backend_desc bd;
    float *x, *y;
    uint64_t st = 99;
    size_t i, in = (size_t)g_shape[0] * g_shape[1] * g_shape[2];
    double flops, conv_flops;

    for (a = 1; a < argc; a += 2) { /* --flag value pairs, and --cpu-only */
        int *dst = NULL;
        if (!strcmp(argv[a], "--cpu-only")) {
            cpu_only = 1;
            --a;
            continue;
        }
        if (!strcmp(argv[a], "--threads")) dst = &threads;
        else if (!strcmp(argv[a], "--rounds")) dst = &rounds;
        else if (!strcmp(argv[a], "--steps")) dst = &steps;
        else if (!strcmp(argv[a], "--mlp-rounds")) dst = &mlp_rounds;
        else if (!strcmp(argv[a], "--mlp-steps")) dst = &mlp_steps;
        if (!dst || a + 1 >= argc || (*dst = atoi(argv[a + 1])) < 1) break;
    }
    if (a < argc) {
        fprintf(stderr, "usage: cnn [--threads T] [--rounds R] [--steps S] [--mlp-rounds R] [--mlp-steps S] "
                        "(each >= 1) [--cpu-only]\n");
        return 1;
    }
    if (rounds < 3) rounds = 3;
    if (mlp_rounds < 3) mlp_rounds = 3;
    bench_cpu_model(cpu_model, sizeof cpu_model);
    printf("cpu: %s; CPU backend kernels: %s%s\n", cpu_model, dsgd_cpu_isa(),
           getenv("DSGD_CPU_ISA") ? " (DSGD_CPU_ISA)" : "");
    if ((threads = bench_pocl_threads("cnn", threads)) < 1) return 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    x = (float *)xmalloc(sizeof(float) * BATCH * in);
    y = (float *)xmalloc(sizeof(float) * BATCH);
    for (i = 0; i < BATCH * in; ++i) x[i] = (float)dsgd_rng_uniform(&st);
    for (i = 0; i < BATCH; ++i) y[i] = (float)(dsgd_rng_next(&st) % 10);
    flops = cnn_gemm_flops(BATCH, &conv_flops);

    memset(v, 0, sizeof v);
    memset(&bd, 0, sizeof bd);
    bd.threads = threads;
    v[nv].name = "cpu";
    if (dsgd_cpu_backend_create_desc(ctx, &bd, &v[nv].be) != DSGD_OK) die(ctx, "cpu backend");
    ++nv;
    memset(&ccd, 0, sizeof ccd); /* tuning AUTO: the device's cache file if valid */
    if (cpu_only) {
        printf("OpenCL: not run (--cpu-only)\n");
    } else if (dsgd_cl_context_create(ctx, &ccd, &cl) != DSGD_OK ||
               dsgd_cl_backend_create(ctx, cl, NULL, &v[nv].be) != DSGD_OK) {
        printf("OpenCL: no device (%s): the OpenCL rows are skipped\n", dsgd_ctx_last_error(ctx));
        memset(&v[nv], 0, sizeof v[nv]);
    } else {
        v[nv].name = "opencl";
        icl = nv++;
    }
    for (k = 0; k < nv; ++k) {
        dsgd_model_desc md = cnn_desc(&v[k].be);
        dsgd_optimizer_desc od;
        memset(&od, 0, sizeof od);
        od.kind = DSGD_OPT_MOMENTUM;
        od.lr = 0.01f;
        od.momentum = 0.9f;
        if (dsgd_model_create(ctx, &md, &v[k].m) != DSGD_OK) die(ctx, v[k].name);
        if (dsgd_optimizer_create(v[k].m, &od, &v[k].opt) != DSGD_OK) die(ctx, v[k].name);
        v[k].t = (double *)xmalloc(sizeof(double) * (size_t)rounds);
    }

    printf("bench/cnn: CNN 28x28x1 conv3x3x16 relu, pool2, conv3x3x32 relu, pool2, dense 128 relu, dense 10; "
           "batch %d, N = 1, compute_gradients + optimizer_step (momentum); %zu parameters\n",
           BATCH, dsgd_model_num_params(v[0].m));
    printf("%d rounds of %d steps after one warm-up round (median per step); GEMM work %.1f MFLOP/step "
           "(convs %.1f)\n",
           rounds, steps, flops * 1e-6, conv_flops * 1e-6);
    printf("threads: T=%d: cpu backend %d (%s kernels), opencl POCL_MAX_PTHREAD_COUNT=%s\n", threads,
           dsgd_cpu_backend_threads(&v[0].be), dsgd_cpu_backend_isa(&v[0].be), getenv("POCL_MAX_PTHREAD_COUNT"));
    if (icl >= 0) {
        const dsgd_cl_device_info *di = dsgd_cl_context_device_info(cl, 0);
        int tuned = dsgd_cl_context_gemm_tuned(cl, 0);
        printf("OpenCL device: %s (%s, driver %s), %u compute units; gemm_tuned=%d\n", di->device_name,
               di->platform_name, di->driver_version, di->compute_units, tuned);
    }
    fflush(stdout);

    for (r = -1; r < rounds; ++r) { /* round -1 warms up (and compiles the kernels) */
        for (k = 0; k < nv; ++k) {
            double t0 = dsgd_now();
            for (s = 0; s < steps; ++s)
                if (dsgd_model_compute_gradients(v[k].m, x, y, BATCH, 1.0f / BATCH) != DSGD_OK ||
                    dsgd_optimizer_step(v[k].opt) != DSGD_OK)
                    die(ctx, v[k].name);
            if (v[k].be.finish && v[k].be.finish(v[k].be.impl) != DSGD_OK) die(ctx, v[k].name);
            if (r >= 0) v[k].t[r] = (dsgd_now() - t0) / steps;
            if (nv > 1) pause_ms(200);
        }
    }
    for (k = 0; k < nv; ++k) v[k].med = bench_median(v[k].t, rounds);

    printf("\n%-8s %8s %10s %11s %9s %14s\n", "backend", "threads", "ms/step", "samples/s", "GFLOP/s", "time / cpu's");
    for (k = 0; k < nv; ++k)
        printf("%-8s %8d %10.3f %11.0f %9.2f %13.3fx\n", v[k].name, threads, 1e3 * v[k].med, BATCH / v[k].med,
               flops / v[k].med * 1e-9, v[k].med / v[0].med);
    if (icl < 0) printf("opencl   skipped: no OpenCL device\n");
    else printf("OpenCL / CPU: %.3fx the CPU's step time (same run, same threads)\n", v[icl].med / v[0].med);
    fflush(stdout);

    /* where the time goes */
    for (k = 0; k < nv; ++k) {
        profile(ctx, v[k].name, &v[k].be, k == icl, x, y, prof_steps, v[k].med);
        pause_ms(200);
    }
    fflush(stdout);

    if (!cpu_only) mlp_overhead(ctx, threads, mlp_rounds, mlp_steps);

    printf("\n");
    for (k = 0; k < nv; ++k)
        printf("RESULT cnn backend=%s threads=%d ms_per_step=%.4f samples_per_s=%.1f gflops=%.3f time_vs_cpu=%.4f "
               "isa=%s\n",
               v[k].name, threads, 1e3 * v[k].med, BATCH / v[k].med, flops / v[k].med * 1e-9, v[k].med / v[0].med,
               k == icl ? "-" : dsgd_cpu_isa());
    if (icl < 0 && !cpu_only) printf("RESULT cnn backend=opencl skipped=1\n");

    for (k = 0; k < nv; ++k) {
        dsgd_optimizer_destroy(v[k].opt);
        dsgd_model_destroy(v[k].m);
        if (v[k].be.destroy) v[k].be.destroy(v[k].be.impl);
        free(v[k].t);
    }
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    free(x);
    free(y);
    return 0;
}
