/* distsgd/cl/tuning.h - the GEMM tuner: shapes and measurement (the parameters and their cache are in context.h)
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   GEMM TUNING

     CLBlast's stock GEMM parameters are tuned for known GPUs; on other devices
     (PoCL on a CPU above all) they can be several times slower than good ones.
     tools/cl_tune searches CLBlast's Xgemm parameters (register-tiled
     candidates made for the device's float vector width,
     dsgd_cl_device_info.vector_width, among them) and the size below which
     CLBlast's single-kernel "direct" GEMM is used (XGEMM_MIN_INDIRECT_SIZE),
     at the shapes a model uses, within a time bound. It times candidates
     with dsgd_cl_gemm_measure (back-to-back GEMMs with one finish per
     sample, as in a training step), checks every candidate's results, and
     writes the winner to a per-device cache file:

         $DSGD_CL_TUNE_CACHE            a file, or a directory (ends with '/'
                                        or exists as one)
         else $XDG_CACHE_HOME/distsgd/  else ~/.cache/distsgd/
         file: clblast-gemm-<device>-<hash of platform, device, driver>.txt

     dsgd_cl_context_desc.tune_cache overrides the environment. At context
     creation each device's file is read and applied with
     CLBlastOverrideParameters. A file that is missing, unreadable, corrupt or
     made for another device (platform name, device name and driver version are
     compared) leaves CLBlast's defaults in place and logs a DSGD_LOG_WARN
     message saying why; desc.tuning = DSGD_CL_TUNING_OFF skips the file
     (no warning). Overrides are process-wide per device (CLBlast keeps them
     in a global table and has no call to undo them), so once a context has
     applied tuned parameters, later contexts on that device in the same
     process use them too.

   COLD START (PoCL)

     CLBlast compiles its GEMM kernels on the first call with a given set of
     parameters: about 7 s per routine on PoCL, then ~40 ms from PoCL's
     on-disk kernel cache. POCL_CACHE_DIR must name a writable directory, or
     PoCL drops the device silently (POCL_DEBUG=err says why); our own kernels
     are built once per context and cached by PoCL the same way. Each tuning
     candidate is a new compile, which is what bounds the tuner's speed.
*/
#ifndef DSGD_CL__PART_TUNING_DECL
#define DSGD_CL__PART_TUNING_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- GEMM tuning */

/* One GEMM shape: C(m,n) = op(A)(m,k) op(B)(k,n), row-major, dense. */
typedef struct dsgd_cl_gemm_shape {
    int trans_a, trans_b;
    int m, n, k;
} dsgd_cl_gemm_shape;

/* The GEMMs of one training step of the 784-512-512-10 MLP at batch 256, plus
   the first layer's input gradient (256x784x512 NT): forward NN, weight
   gradient TN, input gradient NT per layer. Copies up to cap shapes into out
   (out may be NULL) and returns how many there are (9).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cl_mlp_gemm_shapes(dsgd_cl_gemm_shape *out, int cap);

/* Times b's gemm at each shape: one warm-up call (which compiles), one
   timed call that sizes the samples, then `repeats` samples, each the mean
   time per call of back-to-back calls with one finish at the end, as many
   as last about 10 ms (at most 1000), as in a training step whose queue
   stays full; median_s[i] gets the median sample, in seconds per call.
   When max_rel_err is non-NULL the warm-up result is checked against a
   double-precision host product on seeded random inputs and *max_rel_err is
   the largest |C - ref| / sum_k |a||b| over all shapes (NaN when any
   entry is NaN). b may be any backend.
   Errors: DSGD_ERR_INVALID_ARGUMENT (b, shapes or median_s NULL, num_shapes
   or repeats < 1, a shape with m, n or k < 1) and DSGD_ERR_OUT_OF_MEMORY,
   recorded on ctx; backend errors, recorded on b's context.
   Thread safety: b's thread. */
DSGD_API dsgd_result dsgd_cl_gemm_measure(dsgd_ctx *ctx, const dsgd_backend_i *b,
                                          const dsgd_cl_gemm_shape *shapes, int num_shapes,
                                          int repeats, double *median_s, double *max_rel_err);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_CL__PART_TUNING_DECL */

#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_TUNING_IMPL)
#define DSGD_CL__PART_TUNING_IMPL

/* >>tuning ------------------------------------------------------------------ */

DSGD_API int dsgd_cl_mlp_gemm_shapes(dsgd_cl_gemm_shape *out, int cap) {
    /* trans_a, trans_b, m, n, k */
    static const int s[9][5] = {{0, 0, 256, 512, 784}, {1, 0, 784, 512, 256}, {0, 1, 256, 784, 512},
                                {0, 0, 256, 512, 512}, {1, 0, 512, 512, 256}, {0, 1, 256, 512, 512},
                                {0, 0, 256, 10, 512},  {1, 0, 512, 10, 256},  {0, 1, 256, 512, 10}};
    int i;
    for (i = 0; out && i < 9 && i < cap; ++i) {
        out[i].trans_a = s[i][0];
        out[i].trans_b = s[i][1];
        out[i].m = s[i][2];
        out[i].n = s[i][3];
        out[i].k = s[i][4];
    }
    return 9;
}

static int dsgd_cl__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define DSGD_CL__SAMPLE_S 0.01 /* seconds of back-to-back GEMMs per timed sample */

DSGD_API dsgd_result dsgd_cl_gemm_measure(dsgd_ctx *ctx, const dsgd_backend_i *be, const dsgd_cl_gemm_shape *shapes,
                                          int num_shapes, int repeats, double *median_s, double *max_rel_err) {
    size_t amax = 0, bmax = 0, cmax = 0, i;
    dsgd_buffer *ba = NULL, *bb = NULL, *bc = NULL;
    float *ha = NULL, *hb = NULL, *hc = NULL;
    double *times = NULL, worst = 0.0;
    dsgd_result r = DSGD_OK;
    uint64_t rng = 12345;
    int s, t, calls;
    if (!be || !shapes || num_shapes < 1 || repeats < 1 || !median_s)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_gemm_measure: bad arguments");
    for (s = 0; s < num_shapes; ++s) {
        const dsgd_cl_gemm_shape *g = &shapes[s];
        if (g->m < 1 || g->n < 1 || g->k < 1)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_gemm_measure: shape %d is empty", s);
        if ((size_t)g->m * g->k > amax) amax = (size_t)g->m * g->k;
        if ((size_t)g->k * g->n > bmax) bmax = (size_t)g->k * g->n;
        if ((size_t)g->m * g->n > cmax) cmax = (size_t)g->m * g->n;
    }
    ha = (float *)DSGD_MALLOC(amax * sizeof(float));
    hb = (float *)DSGD_MALLOC(bmax * sizeof(float));
    hc = (float *)DSGD_MALLOC(cmax * sizeof(float));
    times = (double *)DSGD_MALLOC((size_t)repeats * sizeof(double));
    if (!ha || !hb || !hc || !times) {
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_gemm_measure");
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
        const dsgd_cl_gemm_shape *g = &shapes[s];
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
            int row, col, p;
            if ((r = be->read(be->impl, rc, hc, (size_t)g->m * g->n)) != DSGD_OK) goto done;
            for (row = 0; row < g->m; ++row) {
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
           that a sample lasts about DSGD_CL__SAMPLE_S. */
        {
            double t0 = dsgd_now(), one;
            r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc, g->n);
            if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
            if (r != DSGD_OK) goto done;
            one = dsgd_now() - t0;
            calls = one >= DSGD_CL__SAMPLE_S ? 1 : (int)(DSGD_CL__SAMPLE_S / (one > 1e-6 ? one : 1e-6));
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
        qsort(times, (size_t)repeats, sizeof(double), dsgd_cl__cmp_double);
        median_s[s] = repeats % 2 ? times[repeats / 2] : 0.5 * (times[repeats / 2 - 1] + times[repeats / 2]);
    }
    if (max_rel_err) *max_rel_err = worst;
done:
    if (ba) be->buffer_destroy(be->impl, ba);
    if (bb) be->buffer_destroy(be->impl, bb);
    if (bc) be->buffer_destroy(be->impl, bc);
    DSGD_FREE(ha);
    DSGD_FREE(hb);
    DSGD_FREE(hc);
    DSGD_FREE(times);
    return r;
}

#endif /* DSGD_CL__PART_TUNING_IMPL */
