/* breakeven.h - the break-even bandwidth of gradient compression on the
   simulated cluster (distsgd/simnet.h): what experiments/breakeven.c
   tabulates and bench/breakeven_mpi.c predicts for the link it measured.

   The model: mirrored training of the 784-512-512-10 MLP (669,706
   parameters) with N replicas on a hub with alpha_s a message, beta s a
   byte, gamma_s a float reduced, and each step's compute charged as a
   constant compute_s (dsgd_simnet_compute). The gradient goes in one
   bucket (bucket_bytes 0), ring all-reduce; fp32 is the strategy's own
   all-reduce (no hook), the others dsgd_compress_hook. The virtual time
   of a step does not depend on the samples, so the replicas compute
   their real gradients on one sample each (be_desc.real_batch): the
   batch the model stands for is in compute_s.

   Codec time: every compressor charges codec floats through the
   endpoint's charge_codec (a compressor 2 count per bucket, a half wire
   (3p - 1) c on each rank of a p-rank ring of blocks of c). Charged: each
   float costs codec_s_per_float (simnet's DSGD_SIMNET_DEFAULT_CODEC_S by
   default: F16C's conversion). Measured: a method with codec_step_s[m] >=
   0 (seconds a replica spends compressing per step, as compress_s in
   dsgd_comm_stats counts them) gets codec_s_per_float = codec_step_s[m] /
   F_m, F_m the floats it charges per step, found by two simnet runs
   (be_codec_floats), so that its steps cost exactly the measured seconds.

   The break-even bandwidth of method m is the bandwidth 1 / beta below
   which m's step is shorter than fp32's: the root of f(beta) = T_m(beta) -
   T_fp32(beta), found by regula falsi (Illinois) on simnet runs, in beta
   between 1 TB/s and 1 MB/s, to 0.1% of beta. Without overlap both steps
   are compute_s plus their exchange, so the break-even does not depend
   on compute_s (it sets only how much is gained).

   Include after distsgd.h with the implementation. */
#ifndef BREAKEVEN_H
#define BREAKEVEN_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define BE_MAYBE_UNUSED __attribute__((unused))
#else
#define BE_MAYBE_UNUSED
#endif

#define BE_IN 784
#define BE_METHODS 8
#define BE_BETA_LO 1e-12 /* 1 TB/s */
#define BE_BETA_HI 1e-6  /* 1 MB/s */

static const dsgd_layer_desc BE_LAYERS[3] = {
    {.units = 512, .activation = DSGD_ACT_RELU}, {.units = 512, .activation = DSGD_ACT_RELU}, {.units = 10}};

typedef struct be_method {
    const char *name;
    int hook; /* 0: fp32, the strategy's own all-reduce */
    dsgd_compress_kind kind;
    double ratio; /* top-k */
    int rank;     /* PowerSGD */
} be_method;

/* fp32, fp16, bf16, top-k 1%, sign, PowerSGD r1, r2, r4 (error feedback,
   the compressors' defaults otherwise). */
static const be_method BE_METHOD[BE_METHODS] = {
    {"fp32", 0, DSGD_COMPRESS_NONE, 0, 0},          {"fp16", 1, DSGD_COMPRESS_FP16, 0, 0},
    {"bf16", 1, DSGD_COMPRESS_BF16, 0, 0},          {"topk1%", 1, DSGD_COMPRESS_TOPK, 0.01, 0},
    {"sign", 1, DSGD_COMPRESS_SIGN, 0, 0},          {"powersgd1", 1, DSGD_COMPRESS_POWERSGD, 0, 1},
    {"powersgd2", 1, DSGD_COMPRESS_POWERSGD, 0, 2}, {"powersgd4", 1, DSGD_COMPRESS_POWERSGD, 0, 4}};

/* The index of the method called name, or -1. */
BE_MAYBE_UNUSED static int be_method_index(const char *name) {
    int m;
    for (m = 0; m < BE_METHODS; ++m)
        if (!strcmp(BE_METHOD[m].name, name)) return m;
    return -1;
}

static dsgd_compress_desc be_compress_desc(const be_method *m) {
    dsgd_compress_desc cd;
    memset(&cd, 0, sizeof(cd));
    cd.kind = m->kind;
    cd.ratio = m->ratio;
    cd.rank = m->rank;
    return cd;
}

struct be_cache;

/* The inputs. */
typedef struct be_desc {
    int workers;              /* N >= 2 */
    int real_batch;           /* samples each replica really computes on (0: 1) */
    double alpha_s;           /* latency of a message */
    double gamma_s_per_float; /* a float reduced */
    double compute_s;         /* a step's compute */
    double codec_s_per_float; /* charged codec (0: DSGD_SIMNET_DEFAULT_CODEC_S) */
    double codec_step_s[BE_METHODS]; /* >= 0: measured seconds per replica and step (codec
                                        floats priced to match); < 0: charged */
    struct be_cache *cache; /* optional (NULL: none): fp32's runs, each run once */
} be_desc;

/* What one simnet run measured. */
typedef struct be_run {
    double step_s;       /* virtual seconds of a step (steady: steps 2..S) */
    double bytes_sent;   /* per replica and step (agreements included) */
    double compress_s;   /* real seconds compressing, per replica and step */
} be_run;

/* fp32's runs, by their inputs: every method's break-even compares
   against fp32 at the same bandwidths (0, the ends of the search), and
   fp32's run (no hook, no codec charge, virtual time) is a function of its
   inputs, so each is run once. Zero it before use; frozen, it is only
   read (threads may share it then). */
#define BE_CACHE_RUNS 256
typedef struct be_cache {
    int n, frozen;
    struct {
        int workers, real_batch, steps;
        double alpha_s, gamma_s_per_float, compute_s, beta;
        be_run run;
    } e[BE_CACHE_RUNS];
} be_cache;

/* The cache's entry for fp32 under d at beta over steps, or -1. */
static int be_cache_find(const be_desc *d, double beta, int steps) {
    int i;
    for (i = 0; d->cache && i < d->cache->n; ++i)
        if (d->cache->e[i].workers == d->workers && d->cache->e[i].real_batch == d->real_batch &&
            d->cache->e[i].steps == steps && d->cache->e[i].alpha_s == d->alpha_s &&
            d->cache->e[i].gamma_s_per_float == d->gamma_s_per_float && d->cache->e[i].compute_s == d->compute_s &&
            d->cache->e[i].beta == beta)
            return i;
    return -1;
}

static void be_cache_add(const be_desc *d, double beta, int steps, const be_run *run) {
    be_cache *c = d->cache;
    if (!c || c->frozen || c->n >= BE_CACHE_RUNS) return;
    c->e[c->n].workers = d->workers;
    c->e[c->n].real_batch = d->real_batch;
    c->e[c->n].steps = steps;
    c->e[c->n].alpha_s = d->alpha_s;
    c->e[c->n].gamma_s_per_float = d->gamma_s_per_float;
    c->e[c->n].compute_s = d->compute_s;
    c->e[c->n].beta = beta;
    c->e[c->n].run = *run;
    c->n++;
}

typedef struct be_batches {
    const float *x, *y;
    int batch;
    dsgd_simnet *hub;
    long step;
} be_batches;

static dsgd_result be_batch_fn(void *user, int r, int n, dsgd_batch *out) {
    be_batches *b = (be_batches *)user;
    dsgd_result res = dsgd_simnet_compute(b->hub, r, b->step);
    (void)n;
    if (res != DSGD_OK) return res;
    out->x = b->x + (size_t)r * (size_t)b->batch * BE_IN;
    out->y = b->y + (size_t)r * (size_t)b->batch;
    out->count = b->batch;
    return DSGD_OK;
}

/* Method m over a hub of beta s a byte and codec_s_per_float gamma_c
   (DSGD_SIMNET_FREE: free) for `steps` steps (>= 3); fills *out. 0, or -1
   after printing why. */
static int be_simulate(const be_desc *d, int m, double beta, double gamma_c, int steps, be_run *out) {
    const be_method *me = &BE_METHOD[m];
    int n = d->workers, batch = d->real_batch > 0 ? d->real_batch : 1, i, rc = -1;
    dsgd_ctx *ctx = NULL;
    dsgd_simnet *hub = NULL;
    dsgd_simnet_desc nd;
    dsgd_strategy_desc sd;
    dsgd_strategy *st = NULL;
    dsgd_transport_i *ep = (dsgd_transport_i *)calloc((size_t)n, sizeof(*ep));
    dsgd_compress_desc cd = be_compress_desc(me);
    dsgd_comm_hook hook = dsgd_compress_hook(&cd);
    dsgd_comm_stats cs;
    be_batches bb;
    float *x = (float *)malloc(sizeof(float) * (size_t)n * (size_t)batch * BE_IN);
    float *y = (float *)malloc(sizeof(float) * (size_t)n * (size_t)batch);
    double t1 = 0, t = 0;
    uint64_t rng = 2019;
    int cached = m == 0 && gamma_c == DSGD_SIMNET_FREE && d->cache ? be_cache_find(d, beta, steps) : -1;
    memset(out, 0, sizeof(*out));
    memset(&bb, 0, sizeof(bb));
    if (cached >= 0) {
        *out = d->cache->e[cached].run;
        free(ep);
        free(x);
        free(y);
        return 0;
    }
    if (!ep || !x || !y || dsgd_ctx_create(NULL, &ctx) != DSGD_OK) goto done;
    for (i = 0; i < n * batch * BE_IN; ++i) x[i] = (float)dsgd_rng_uniform(&rng);
    for (i = 0; i < n * batch; ++i) y[i] = (float)(dsgd_rng_next(&rng) % 10);
    memset(&nd, 0, sizeof(nd));
    nd.ranks = n;
    nd.alpha_s = d->alpha_s;
    nd.beta_s_per_byte = beta;
    nd.gamma_s_per_float = d->gamma_s_per_float;
    nd.codec_s_per_float = gamma_c;
    nd.compute.kind = DSGD_SIMNET_COMPUTE_CONSTANT;
    nd.compute.mean_s = d->compute_s;
    nd.park_between_calls = 1;
    if (dsgd_simnet_create(ctx, &nd, &hub) != DSGD_OK) goto done;
    for (i = 0; i < n; ++i)
        if (dsgd_simnet_endpoint(hub, i, &ep[i]) != DSGD_OK) goto done;
    memset(&sd, 0, sizeof(sd));
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = n;
    sd.model.input_dim = BE_IN;
    sd.model.layers = BE_LAYERS;
    sd.model.num_layers = 3;
    sd.model.max_batch = batch;
    sd.model.seed = 1;
    sd.optimizer.kind = DSGD_OPT_MOMENTUM;
    sd.optimizer.lr = 0.01f;
    sd.optimizer.momentum = 0.9f;
    sd.algorithm = DSGD_ALLREDUCE_RING;
    sd.gradient_path = DSGD_GRADIENTS_HOST;
    sd.comm_hook = me->hook ? &hook : NULL;
    sd.cpu_threads = 1;
    sd.timeout_s = 1e6;
    sd.endpoints = ep;
    if (dsgd_strategy_create(ctx, &sd, &st) != DSGD_OK) goto done;
    bb.x = x, bb.y = y, bb.batch = batch, bb.hub = hub;
    for (bb.step = 0; bb.step < steps; ++bb.step) {
        if (dsgd_strategy_train_step_fn(st, be_batch_fn, &bb, NULL) != DSGD_OK) goto done;
        for (t = 0, i = 0; i < n; ++i) t = fmax(t, dsgd_simnet_time(hub, i));
        if (bb.step == 0) t1 = t; /* the first step may differ (nothing to warm-start from) */
    }
    if (dsgd_strategy_comm_stats(st, &cs) != DSGD_OK) goto done;
    out->step_s = (t - t1) / (steps - 1);
    out->bytes_sent = (double)cs.bytes_sent / ((double)n * steps);
    out->compress_s = cs.compress_s / ((double)n * steps);
    if (m == 0 && gamma_c == DSGD_SIMNET_FREE) be_cache_add(d, beta, steps, out);
    rc = 0;
done:
    if (rc != 0) fprintf(stderr, "breakeven: %s: %s\n", me->name, ctx ? dsgd_ctx_last_error(ctx) : "out of memory");
    dsgd_strategy_destroy(st);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
    free(ep);
    free(x);
    free(y);
    return rc;
}

/* The codec floats method m charges a replica per step: the step's
   growth when each costs 1 ns, at alpha = beta = 0 (so nothing else
   moves). 0 for fp32; -1 on failure. */
static double be_codec_floats(const be_desc *d, int m) {
    be_desc z = *d;
    be_run a, b;
    if (!BE_METHOD[m].hook) return 0;
    z.alpha_s = 0;
    if (be_simulate(&z, m, 0.0, DSGD_SIMNET_FREE, 3, &a) != 0 || be_simulate(&z, m, 0.0, 1e-9, 3, &b) != 0) return -1;
    return floor((b.step_s - a.step_s) / 1e-9 + 0.5);
}

/* Method m's codec_s_per_float under d into *gamma: the measured seconds
   over its floats, else the charged value (fp32: free); *floats the floats
   it charges a replica per step. 0, or -1 on failure. */
static int be_codec_gamma(const be_desc *d, int m, double *gamma, double *floats) {
    *floats = 0;
    *gamma = DSGD_SIMNET_FREE;
    if (!BE_METHOD[m].hook) return 0;
    *floats = be_codec_floats(d, m);
    if (*floats < 0) return -1;
    if (d->codec_step_s[m] >= 0) {
        if (*floats > 0 && d->codec_step_s[m] > 0) *gamma = d->codec_step_s[m] / *floats;
        return 0;
    }
    *gamma = d->codec_s_per_float > 0 ? d->codec_s_per_float : DSGD_SIMNET_DEFAULT_CODEC_S;
    return 0;
}

/* One row of the result. */
typedef struct be_result {
    double floats;      /* codec floats a replica charges per step */
    double gamma_c;     /* the codec_s_per_float used */
    double codec_s;     /* codec seconds per replica and step in the model (gamma_c x floats) */
    double bytes_sent;  /* per replica and step */
    double overhead_s;  /* T_m - T_fp32 at infinite bandwidth (beta = 0) */
    double beta;        /* the break-even's s per byte; 0: never faster (above 1 MB/s);
                           HUGE_VAL: faster at every bandwidth up to 1 TB/s */
    int runs;           /* simnet runs it took */
} be_result;

/* f(beta) = T_m(beta) - T_fp32(beta). */
static int be_diff(const be_desc *d, int m, double gamma_c, double beta, double *f, be_run *rm, be_result *r) {
    be_run a, b;
    if (be_simulate(d, m, beta, gamma_c, 3, &a) != 0 || be_simulate(d, 0, beta, DSGD_SIMNET_FREE, 3, &b) != 0)
        return -1;
    r->runs += 2;
    *f = a.step_s - b.step_s;
    if (rm) *rm = a;
    return 0;
}

/* Method m's break-even under d into *r. 0, or -1 after printing why. */
static int be_breakeven(const be_desc *d, int m, be_result *r) {
    double lo = BE_BETA_LO, hi = BE_BETA_HI, flo, fhi, f0;
    int side = 0, it;
    be_run run;
    memset(r, 0, sizeof(*r));
    if (be_codec_gamma(d, m, &r->gamma_c, &r->floats) != 0) return -1;
    if (be_diff(d, m, r->gamma_c, 0.0, &f0, &run, r) != 0) return -1;
    r->overhead_s = f0;
    r->bytes_sent = run.bytes_sent;
    r->codec_s = r->gamma_c > 0 ? r->gamma_c * r->floats : 0;
    if (be_diff(d, m, r->gamma_c, lo, &flo, NULL, r) != 0 || be_diff(d, m, r->gamma_c, hi, &fhi, NULL, r) != 0)
        return -1;
    if (flo < 0) { /* faster even at 1 TB/s */
        r->beta = HUGE_VAL;
        return 0;
    }
    if (fhi >= 0) { /* not faster even at 1 MB/s */
        r->beta = 0;
        return 0;
    }
    /* f(lo) >= 0 > f(hi). Regula falsi (Illinois), each guess c checked by
       simnet at c (1 -+ 0.05%): where f is linear in beta the first guess
       is the root and both sides confirm it. */
    for (it = 0; it < 40 && hi - lo > 1e-3 * lo; ++it) {
        double c = (lo * fhi - hi * flo) / (fhi - flo), a, b, fa, fb;
        if (!(c > lo && c < hi)) c = 0.5 * (lo + hi);
        a = fmax(lo, c * (1 - 5e-4)), b = fmin(hi, c * (1 + 5e-4));
        if (be_diff(d, m, r->gamma_c, a, &fa, NULL, r) != 0 || be_diff(d, m, r->gamma_c, b, &fb, NULL, r) != 0)
            return -1;
        if (fa >= 0 && fb < 0) {
            lo = a, hi = b;
            break;
        }
        if (fb >= 0) { /* not faster yet at b: the root is above */
            lo = b, flo = fb;
            if (side == -1) fhi *= 0.5;
            side = -1;
        } else {
            hi = a, fhi = fa;
            if (side == 1) flo *= 0.5;
            side = 1;
        }
    }
    r->beta = 0.5 * (lo + hi);
    return 0;
}

/* Step time of method m at bandwidth bytes_per_s under d (the codec as
   be_codec_gamma prices it). -1 on failure. */
BE_MAYBE_UNUSED static double be_step_time(const be_desc *d, int m, double bytes_per_s) {
    double floats, g;
    be_run run;
    if (be_codec_gamma(d, m, &g, &floats) != 0) return -1;
    if (be_simulate(d, m, 1.0 / bytes_per_s, g, 3, &run) != 0) return -1;
    return run.step_s;
}

/* The break-even as text: "12.3 Gbit/s", "never", "always". */
static const char *be_format(double beta, char *buf, size_t n) {
    if (beta == 0) snprintf(buf, n, "never (< 1 MB/s)");
    else if (isinf(beta)) snprintf(buf, n, "always (> 1 TB/s)");
    else if (1.0 / beta >= 1.25e8) snprintf(buf, n, "%.3g Gbit/s", 8e-9 / beta);
    else snprintf(buf, n, "%.3g Mbit/s", 8e-6 / beta);
    return buf;
}

#endif /* BREAKEVEN_H */
