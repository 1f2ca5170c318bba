/* tools/cl_gemm_measure.h - GEMM shapes and timing for the OpenCL GEMM tuner
   (tools/cl_tune.c) and the OpenCL benchmarks (bench/gemm_cl.c,
   bench/train_cl.c). Developer code, not part of the library: every name is
   static and has no dsgd_ prefix.

   Include it after distsgd.h or distsgd_cl.h (with DISTSGD_IMPLEMENTATION in
   that file): it uses the core's public API only (dsgd_backend_i,
   dsgd_ctx_set_error, dsgd_now, dsgd_rng_uniform), so gemm_measure times any
   backend's gemm, the OpenCL one above all.

   How cl_tune uses it: each candidate's parameters are applied
   (dsgd_cl_apply_gemm_params), then gemm_measure times the GEMMs at the
   tuning shapes (back-to-back GEMMs with one finish per sample, as in a
   training step) and checks their results against a double-precision host
   product; the winner is written with dsgd_cl_save_gemm_params (see GEMM
   TUNING in distsgd/cl/context.h). The benchmarks also take their thread
   count from bench_pocl_threads, which makes PoCL run on as many threads as
   the CPU side they compare it with. */
#ifndef DSGD_TOOLS_CL_GEMM_MEASURE_H
#define DSGD_TOOLS_CL_GEMM_MEASURE_H

#ifndef DISTSGD_H
#error "include distsgd.h or distsgd_cl.h before tools/cl_gemm_measure.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* One GEMM shape: C(m,n) = op(A)(m,k) op(B)(k,n), row-major, dense. */
typedef struct gemm_shape {
    int trans_a, trans_b;
    int m, n, k;
} gemm_shape;

/* The GEMMs of one training step of a dense MLP with layer sizes dims[0] ..
   dims[nd - 1] at batch `batch`, as the model runs them, per layer (in, out):
   forward NN batch x out x in, weight gradient TN in x out x batch, input
   gradient NT batch x in x out (the first layer's too, which the model
   skips: a tuning objective that also covers it). Copies up to cap shapes
   into out (out may be NULL) and returns how many there are, 3 (nd - 1);
   -1 when nd < 2 or a size is below 1. */
static inline int gemm_mlp_shapes(const int *dims, int nd, int batch, gemm_shape *out, int cap) {
    int l, n = 0, j;
    if (nd < 2 || batch < 1) return -1;
    for (l = 0; l < nd; ++l)
        if (dims[l] < 1) return -1;
    for (l = 0; l + 1 < nd; ++l) {
        const int in = dims[l], o = dims[l + 1];
        const int s[3][5] = {{0, 0, batch, o, in}, {1, 0, in, o, batch}, {0, 1, batch, in, o}};
        for (j = 0; j < 3; ++j, ++n) {
            if (!out || n >= cap) continue;
            out[n].trans_a = s[j][0];
            out[n].trans_b = s[j][1];
            out[n].m = s[j][2];
            out[n].n = s[j][3];
            out[n].k = s[j][4];
        }
    }
    return n;
}

/* The 784-512-512-10 MLP at batch 256 (gemm_mlp_shapes): the benches' and
   cl_tune's default, 9 shapes. */
static inline int mlp_gemm_shapes(gemm_shape *out, int cap) {
    static const int dims[4] = {784, 512, 512, 10};
    return gemm_mlp_shapes(dims, 4, 256, out, cap);
}

/* Parses a shape list "NN:256x512x784,TN:784x512x256" (transposes, then
   MxNxK; sizes 1..65536) into out; returns the count, or -1 when the list is
   malformed or holds more than cap shapes. (tools/cl_tune --shapes,
   bench/gemm_cl --shapes) */
static inline int gemm_parse_shapes(const char *s, gemm_shape *out, int cap) {
    int n = 0;
    while (*s) {
        char ta, tb;
        int m, nn, k, used = 0;
        if (n == cap) return -1;
        if (sscanf(s, "%c%c:%dx%dx%d%n", &ta, &tb, &m, &nn, &k, &used) != 5 || (ta != 'N' && ta != 'T') ||
            (tb != 'N' && tb != 'T') || m < 1 || nn < 1 || k < 1 || m > 65536 || nn > 65536 || k > 65536)
            return -1;
        out[n].trans_a = ta == 'T';
        out[n].trans_b = tb == 'T';
        out[n].m = m;
        out[n].n = nn;
        out[n].k = k;
        ++n;
        s += used;
        if (*s == ',') ++s;
        else if (*s) return -1;
    }
    return n;
}

static inline int gemm_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The rows of C that the check compares with the host product: every row
   up to 2^27 multiply-adds (a model's shapes), else rows this far apart,
   the first and the spread between included, so that a 4096^3 GEMM is
   checked in about a second (on every column, 8 of its rows). */
static inline int gemm_check_row_step(const gemm_shape *g) {
    double work = (double)g->m * g->n * g->k, step = work / (double)(1 << 27);
    return step <= 1.0 ? 1 : step >= g->m ? g->m : (int)step;
}

#define GEMM_SAMPLE_S 0.01 /* seconds of back-to-back GEMMs per timed sample */

/* Times be's gemm at each shape: one warm-up call (which compiles), one
   timed call that sizes the samples, then `repeats` samples, each the mean
   time per call of back-to-back calls with one finish at the end, as many
   as last about GEMM_SAMPLE_S (at most 1000), as in a training step whose
   queue stays full; median_s[i] gets the median sample, in seconds per call.
   When max_rel_err is non-NULL the warm-up result is checked against a
   double-precision host product (every row, or spread rows of a large GEMM:
   gemm_check_row_step) on seeded random inputs and *max_rel_err is
   the largest |C - ref| / sum_k |a||b| over all shapes (NaN when any
   entry is NaN). be may be any backend.
   Errors: DSGD_ERR_INVALID_ARGUMENT (be, shapes or median_s NULL, num_shapes
   or repeats < 1, a shape with m, n or k < 1) and DSGD_ERR_OUT_OF_MEMORY,
   recorded on ctx as "gemm_measure: ..."; backend errors, recorded on be's
   context. */
static inline dsgd_result gemm_measure(dsgd_ctx *ctx, const dsgd_backend_i *be, const gemm_shape *shapes,
                                       int num_shapes, int repeats, double *median_s, double *max_rel_err) {
    size_t amax = 0, bmax = 0, cmax = 0, i;
    dsgd_buffer *ba = NULL, *bb = NULL, *bc = NULL;
    float *ha = NULL, *hb = NULL, *hc = NULL;
    double *times = NULL, worst = 0.0;
    dsgd_result r = DSGD_OK;
    uint64_t rng = 12345;
    int s, t, calls;
    if (!be || !shapes || num_shapes < 1 || repeats < 1 || !median_s)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "gemm_measure: bad arguments");
    for (s = 0; s < num_shapes; ++s) {
        const gemm_shape *g = &shapes[s];
        if (g->m < 1 || g->n < 1 || g->k < 1)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "gemm_measure: shape %d is empty", s);
        if ((size_t)g->m * g->k > amax) amax = (size_t)g->m * g->k;
        if ((size_t)g->k * g->n > bmax) bmax = (size_t)g->k * g->n;
        if ((size_t)g->m * g->n > cmax) cmax = (size_t)g->m * g->n;
    }
    ha = (float *)malloc(amax * sizeof(float));
    hb = (float *)malloc(bmax * sizeof(float));
    hc = (float *)malloc(cmax * sizeof(float));
    times = (double *)malloc((size_t)repeats * sizeof(double));
    if (!ha || !hb || !hc || !times) {
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "gemm_measure");
        goto done;
    }
    for (i = 0; i < amax; ++i) ha[i] = (float)(dsgd_rng_uniform(&rng) * 2.0 - 1.0);
    for (i = 0; i < bmax; ++i) hb[i] = (float)(dsgd_rng_uniform(&rng) * 2.0 - 1.0);
    if ((r = be->buffer_create(be->impl, amax, &ba)) != DSGD_OK ||
        (r = be->buffer_create(be->impl, bmax, &bb)) != DSGD_OK ||
        (r = be->buffer_create(be->impl, cmax, &bc)) != DSGD_OK)
        goto done;
    {
        dsgd_ref ra, rb;
        ra.buf = ba;
        ra.off = 0;
        rb.buf = bb;
        rb.off = 0;
        if ((r = be->write(be->impl, ra, ha, amax)) != DSGD_OK || (r = be->write(be->impl, rb, hb, bmax)) != DSGD_OK)
            goto done;
    }
    for (s = 0; s < num_shapes; ++s) {
        const gemm_shape *g = &shapes[s];
        int lda = g->trans_a ? g->m : g->k, ldb = g->trans_b ? g->k : g->n;
        dsgd_ref ra, rb, rc;
        ra.buf = ba;
        ra.off = 0;
        rb.buf = bb;
        rb.off = 0;
        rc.buf = bc;
        rc.off = 0;
        /* warm-up (compiles), then check it */
        r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc, g->n);
        if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
        if (r != DSGD_OK) goto done;
        if (max_rel_err) {
            int row, col, p, row_step = gemm_check_row_step(g);
            if ((r = be->read(be->impl, rc, hc, (size_t)g->m * g->n)) != DSGD_OK) goto done;
            for (row = 0; row < g->m; row += row_step) {
                for (col = 0; col < g->n; ++col) {
                    double acc = 0.0, mag = 0.0, e;
                    for (p = 0; p < g->k; ++p) {
                        double av = g->trans_a ? ha[(size_t)p * lda + row] : ha[(size_t)row * lda + p];
                        double bv = g->trans_b ? hb[(size_t)col * ldb + p] : hb[(size_t)p * ldb + col];
                        acc += av * bv;
                        mag += fabs(av * bv);
                    }
                    e = fabs((double)hc[(size_t)row * g->n + col] - acc) / (mag > 1e-30 ? mag : 1e-30);
                    if (worst == worst && !(e <= worst)) worst = e; /* a NaN becomes, and stays, the worst */
                }
            }
        }
        /* A sample is the mean of `calls` back-to-back calls with one finish
           at the end, as in a training step whose queue stays full; timing
           single calls to completion would add the device's wake-up and
           dispatch latency to every call (on PoCL, more than the variation
           between good candidates). calls is sized from one timed call so
           that a sample lasts about GEMM_SAMPLE_S. */
        {
            double t0 = dsgd_now(), one;
            r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc, g->n);
            if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
            if (r != DSGD_OK) goto done;
            one = dsgd_now() - t0;
            calls = one >= GEMM_SAMPLE_S ? 1 : (int)(GEMM_SAMPLE_S / (one > 1e-6 ? one : 1e-6));
            if (calls > 1000) calls = 1000;
        }
        for (t = 0; t < repeats; ++t) {
            double t0 = dsgd_now();
            int c;
            for (c = 0; c < calls && r == DSGD_OK; ++c)
                r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc,
                             g->n);
            if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
            if (r != DSGD_OK) goto done;
            times[t] = (dsgd_now() - t0) / calls;
        }
        qsort(times, (size_t)repeats, sizeof(double), gemm_cmp_double);
        median_s[s] = repeats % 2 ? times[repeats / 2] : 0.5 * (times[repeats / 2 - 1] + times[repeats / 2]);
    }
    if (max_rel_err) *max_rel_err = worst;
done:
    if (ba) be->buffer_destroy(be->impl, ba);
    if (bb) be->buffer_destroy(be->impl, bb);
    if (bc) be->buffer_destroy(be->impl, bc);
    free(ha);
    free(hb);
    free(hc);
    free(times);
    return r;
}

/* The OpenCL benches' thread count: `requested`, or POCL_MAX_PTHREAD_COUNT,
   or dsgd_cpu_count(); PoCL reads POCL_MAX_PTHREAD_COUNT once per process,
   so this sets it (before any OpenCL call) and refuses a different value
   already set, so that PoCL runs on as many threads as the CPU side it is
   compared with. Returns 0, after a message naming `prog`, on error.
   (bench/gemm_cl, bench/train_cl) */
static inline int bench_pocl_threads(const char *prog, int requested) {
    const char *env = getenv("POCL_MAX_PTHREAD_COUNT");
    int pocl = env && *env ? atoi(env) : 0;
    char buf[16];
    if (env && *env && pocl < 1) {
        fprintf(stderr, "%s: POCL_MAX_PTHREAD_COUNT=%s is not a thread count\n", prog, env);
        return 0;
    }
    if (requested < 1) requested = pocl ? pocl : dsgd_cpu_count();
    if (pocl && pocl != requested) {
        fprintf(stderr,
                "%s: --threads %d but POCL_MAX_PTHREAD_COUNT=%d: PoCL would run on other threads than the CPU "
                "side; unset it (the bench then sets it) or make them equal\n",
                prog, requested, pocl);
        return 0;
    }
    snprintf(buf, sizeof buf, "%d", requested);
    if (setenv("POCL_MAX_PTHREAD_COUNT", buf, 1) != 0) return 0;
    return requested;
}

#endif /* DSGD_TOOLS_CL_GEMM_MEASURE_H */
