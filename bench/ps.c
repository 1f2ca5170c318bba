/* bench/ps.c - parameter-server throughput against mirrored, in one run.

   The 784-256-128-10 MLP (Fashion-MNIST shapes, random data), batch 64 per
   worker, SGD with momentum. For P = 1, 2, 4 servers x W = 2, 4 workers and
   the ASYNC and SYNC policies (distsgd/ps.h, driven by the cluster
   coordinator, every thread in this process over the loopback transport):
   pushes/s (gradients applied per second, every server counted once) and
   samples/s, beside the mirrored strategy with N = W replicas at the same
   per-replica batch. Rounds of every configuration are interleaved and
   medians printed, since this machine is noisy.

   Then the servers' apply: one optimizer update (SGD, then momentum) of a
   server's share of the parameters against one axpy of the same floats on
   the same CPU backend. Both are memory-bound passes: SGD moves the bytes
   axpy moves (ratio near 1), momentum also reads and writes its slot (5
   streams against 3: about 1.7).

   Threads: P + W (or N) threads on this machine's cores, oversubscribed
   beyond them; say so with the numbers.

   Run: make bench  (or ./build/bench/ps [rounds] [steps]) */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"

#define BATCH 64

static dsgd_layer_desc g_layers[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                      {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                      {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static float *g_x, *g_y;

static void die(dsgd_ctx *ctx) {
    fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
    exit(1);
}

static dsgd_model_desc model_desc(void) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof(md));
    md.input_dim = 784;
    md.layers = g_layers;
    md.num_layers = 3;
    md.max_batch = BATCH;
    md.seed = 7;
    return md;
}

static dsgd_optimizer_desc opt_desc(void) {
    dsgd_optimizer_desc od;
    memset(&od, 0, sizeof(od));
    od.kind = DSGD_OPT_MOMENTUM;
    od.lr = 0.01f;
    od.momentum = 0.9f;
    return od;
}

static dsgd_result step_closure(dsgd_cluster_worker *w, void *user) {
    (void)user;
    return dsgd_cluster_worker_train_step(w, g_x, g_y, BATCH);
}

/* Seconds for `steps` steps of every worker of a fresh cluster. */
static double time_ps(dsgd_ctx *ctx, int P, int W, dsgd_ps_policy policy, int steps) {
    dsgd_cluster_desc d;
    dsgd_cluster *c = NULL;
    double t0, t;
    int k, w;
    memset(&d, 0, sizeof(d));
    d.ps.num_servers = P;
    d.ps.num_workers = W;
    d.ps.policy = policy;
    d.ps.optimizer = opt_desc();
    d.ps.timeout_s = 120.0;
    d.model = model_desc();
    if (dsgd_cluster_create(ctx, &d, &c) != DSGD_OK) die(ctx);
    t0 = dsgd_now();
    for (k = 0; k < steps; ++k)
        for (w = 0; w < W; ++w)
            if ((policy == DSGD_PS_SYNC ? dsgd_cluster_schedule_on(c, w, step_closure, NULL, NULL)
                                        : dsgd_cluster_schedule(c, step_closure, NULL, NULL)) != DSGD_OK)
                die(ctx);
    if (dsgd_cluster_join(c) != DSGD_OK) die(ctx);
    t = dsgd_now() - t0;
    if (dsgd_cluster_shutdown(c) != DSGD_OK) die(ctx);
    dsgd_cluster_destroy(c);
    return t;
}

/* Seconds for `steps` mirrored steps of N replicas x BATCH. */
static double time_mirrored(dsgd_ctx *ctx, int N, int steps) {
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    double t0;
    int k;
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = N;
    sd.model = model_desc();
    sd.optimizer = opt_desc();
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) die(ctx);
    t0 = dsgd_now();
    for (k = 0; k < steps; ++k)
        if (dsgd_strategy_train_step(s, g_x, g_y, N * BATCH, NULL) != DSGD_OK) die(ctx);
    t0 = dsgd_now() - t0;
    dsgd_strategy_destroy(s);
    return t0;
}

static dsgd_ref ref(dsgd_buffer *b) {
    dsgd_ref r;
    r.buf = b;
    r.off = 0;
    return r;
}

/* Median seconds of one optimizer update (SGD or momentum) and of one axpy
   over n floats on a CPU backend (what a server holding n floats runs per
   applied push). */
static void time_apply(dsgd_ctx *ctx, dsgd_optimizer_kind kind, size_t n, int reps, double *update_s,
                       double *axpy_s) {
    dsgd_backend_i be;
    dsgd_buffer *p = NULL, *g = NULL, *m = NULL;
    dsgd_opt_update u;
    double *tu = (double *)malloc(sizeof(double) * (size_t)reps), *ta = (double *)malloc(sizeof(double) * (size_t)reps);
    int r;
    if (!tu || !ta || dsgd_cpu_backend_create(ctx, &be) != DSGD_OK) die(ctx);
    if (be.buffer_create(be.impl, n, &p) != DSGD_OK || be.buffer_create(be.impl, n, &g) != DSGD_OK ||
        be.buffer_create(be.impl, n, &m) != DSGD_OK)
        die(ctx);
    be.fill(be.impl, ref(p), 1.0f, n);
    be.fill(be.impl, ref(g), 0.5f, n);
    be.fill(be.impl, ref(m), 0.0f, n);
    memset(&u, 0, sizeof(u));
    u.kind = kind;
    u.lr = 1e-6f;
    u.momentum = 0.9f;
    u.grad_scale = 1.0f;
    for (r = -2; r < reps; ++r) { /* two warm-ups */
        double t0 = dsgd_now();
        if (be.optimizer_update(be.impl, &u, ref(p), ref(g), ref(m), ref(NULL), n) !=
            DSGD_OK)
            die(ctx);
        if (r >= 0) tu[r] = dsgd_now() - t0;
        t0 = dsgd_now();
        if (be.axpy(be.impl, ref(p), 1e-6f, ref(g), n) != DSGD_OK) die(ctx);
        if (r >= 0) ta[r] = dsgd_now() - t0;
    }
    *update_s = bench_median(tu, reps);
    *axpy_s = bench_median(ta, reps);
    be.buffer_destroy(be.impl, p);
    be.buffer_destroy(be.impl, g);
    be.buffer_destroy(be.impl, m);
    be.destroy(be.impl);
    free(tu);
    free(ta);
}

int main(int argc, char **argv) {
    enum { NP = 3, NW = 2, NPOL = 2, NC = NP * NW * NPOL + NW };
    static const int Ps[NP] = {1, 2, 4}, Ws[NW] = {2, 4};
    static const dsgd_ps_policy pols[NPOL] = {DSGD_PS_ASYNC, DSGD_PS_SYNC};
    int rounds = argc > 1 ? atoi(argv[1]) : 3, steps = argc > 2 ? atoi(argv[2]) : 30, r, i, pi, wi, qi;
    double *t[NC], med[NC];
    dsgd_ctx *ctx;
    uint64_t st = 5;
    size_t k, nparams = 0;
    if (rounds < 1) rounds = 1;
    if (steps < 1) steps = 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    g_x = (float *)malloc(sizeof(float) * BATCH * 4 * 784);
    g_y = (float *)malloc(sizeof(float) * BATCH * 4);
    if (!g_x || !g_y) return 1;
    for (k = 0; k < (size_t)BATCH * 4 * 784; ++k) g_x[k] = (float)dsgd_rng_uniform(&st);
    for (k = 0; k < (size_t)BATCH * 4; ++k) g_y[k] = (float)(dsgd_rng_next(&st) % 10);
    for (i = 0; i < NC; ++i) t[i] = (double *)malloc(sizeof(double) * (size_t)rounds);
    printf("bench/ps: MLP 784-256-128-10, batch %d per worker, momentum; %d steps per worker, %d rounds (median); "
           "threads: P + W servers and workers (or N replicas) on this machine's cores\n", BATCH, steps, rounds);
    for (r = 0; r < rounds; ++r) {
        i = 0;
        for (pi = 0; pi < NP; ++pi)
            for (wi = 0; wi < NW; ++wi)
                for (qi = 0; qi < NPOL; ++qi) t[i++][r] = time_ps(ctx, Ps[pi], Ws[wi], pols[qi], steps);
        for (wi = 0; wi < NW; ++wi) t[i++][r] = time_mirrored(ctx, Ws[wi], steps);
    }
    for (i = 0; i < NC; ++i) med[i] = bench_median(t[i], rounds);
    printf("%-28s %12s %12s %14s\n", "configuration", "pushes/s", "samples/s", "vs mirrored");
    i = 0;
    for (pi = 0; pi < NP; ++pi)
        for (wi = 0; wi < NW; ++wi)
            for (qi = 0; qi < NPOL; ++qi, ++i) {
                double pushes = (double)Ws[wi] * steps / med[i], mir = (double)Ws[wi] * steps * BATCH /
                                                                      med[NP * NW * NPOL + wi];
                char name[64];
                snprintf(name, sizeof(name), "PS %s P=%d W=%d", dsgd_ps_policy_name(pols[qi]), Ps[pi], Ws[wi]);
                printf("%-28s %12.0f %12.0f %13.3fx\n", name, pushes, pushes * BATCH, pushes * BATCH / mir);
                printf("ps config=\"%s\" pushes_per_s=%.1f samples_per_s=%.1f ratio_vs_mirrored=%.4f\n", name, pushes,
                       pushes * BATCH, pushes * BATCH / mir);
            }
    for (wi = 0; wi < NW; ++wi, ++i) {
        double sps = (double)Ws[wi] * steps * BATCH / med[i];
        printf("%-28s %12s %12.0f %13.3fx\n", Ws[wi] == 2 ? "mirrored N=2" : "mirrored N=4", "-", sps, 1.0);
        printf("ps config=\"mirrored N=%d\" samples_per_s=%.1f ratio_vs_mirrored=1.0000\n", Ws[wi], sps);
    }
    {
        dsgd_model_desc md = model_desc();
        dsgd_model *m = NULL;
        if (dsgd_model_create(ctx, &md, &m) != DSGD_OK) die(ctx);
        nparams = dsgd_model_num_params(m);
        dsgd_model_destroy(m);
    }
    for (pi = 0; pi < NP; ++pi) {
        static const dsgd_optimizer_kind kinds[2] = {DSGD_OPT_SGD, DSGD_OPT_MOMENTUM};
        int ki;
        for (ki = 0; ki < 2; ++ki) {
            double us, as;
            size_t n = nparams / (size_t)Ps[pi];
            const char *kn = kinds[ki] == DSGD_OPT_SGD ? "sgd" : "momentum";
            time_apply(ctx, kinds[ki], n, 41, &us, &as);
            printf("server apply, P=%d (%zu floats): %s update %.1f us, axpy %.1f us, ratio %.2f\n", Ps[pi], n, kn,
                   1e6 * us, 1e6 * as, us / as);
            printf("ps apply servers=%d floats=%zu optimizer=%s update_us=%.2f axpy_us=%.2f ratio=%.4f\n", Ps[pi], n, kn,
                   1e6 * us, 1e6 * as, us / as);
        }
    }
    for (i = 0; i < NC; ++i) free(t[i]);
    free(g_x);
    free(g_y);
    dsgd_ctx_destroy(ctx);
    return 0;
}
