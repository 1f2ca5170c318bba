/* bench/gemm_cl.c - GFLOP/s of the OpenCL backend's GEMM (CLBlast) at the MLP
   shapes, with CLBlast's stock parameters and with the device's tuned ones,
   beside OpenBLAS on 1 and 2 threads, all in the same run.

   Shapes: the GEMMs of one training step of the 784-512-512-10 MLP at batch
   256 (mlp_gemm_shapes of tools/cl_gemm_measure.h: forward NN, weight
   gradient TN, input gradient NT per layer, plus the first layer's input
   gradient).

   Order matters: CLBlast's parameter overrides cannot be undone within a
   process, so the stock parameters are timed first, then the tuned file is
   applied (its path as the backend resolves it: --tune-cache, else
   $DSGD_CL_TUNE_CACHE, else the user cache directory; tools/cl_tune writes
   it). Each phase starts with one checked warm-up call per shape (which
   compiles on first use; the result is compared with a double-precision
   host product), then REPEATS rounds. In each round every shape gets one
   sample on OpenCL, then one on OpenBLAS with 1 thread, then one with 2
   (cblas_sgemm, when built with -DDSGD_HAVE_OPENBLAS, as the Makefile does
   when OpenBLAS is installed), then a 0.2 s pause so that OpenBLAS's worker
   threads stop spinning before PoCL's threads need the cores again. A
   sample is the mean time of enough back-to-back calls of one shape to last
   ~20 ms (OpenCL: enqueued back to back, one clFinish at the end, as in a
   training step whose queue stays full). Interleaving by rounds makes a
   noisy, shared machine slow all columns alike. Reported: the median sample
   per shape; OpenBLAS's over both phases.

   Usage: build/bench/gemm_cl [--repeats N] [--device SPEC] [--tune-cache PATH]
   Output: a table, then one machine-readable line per shape:
     gemm_cl shape=MxNxK trans=NN stock_gflops=.. tuned_gflops=.. openblas1_gflops=..
             openblas2_gflops=.. tuned_vs_openblas1=.. tuned_vs_openblas2=..
   and a "gemm_cl total" line over the sum of the times (one step's GEMMs). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../tools/cl_gemm_measure.h"

#ifdef DSGD_HAVE_OPENBLAS
#include <cblas.h>
extern void openblas_set_num_threads(int);
#endif

#define MAXS 16

static double flops(const gemm_shape *s) { return 2.0 * s->m * s->n * s->k; }

typedef struct bufs {
    float *a, *b, *c; /* host copies, for OpenBLAS */
} bufs;

/* One phase: `repeats` rounds over the shapes, each shape once on the OpenCL
   backend and (when available) once on OpenBLAS with 1 and 2 threads.
   cl[i][r], o1[i][r0 + r], o2[i][r0 + r] get the seconds. */
static int calls_for(double seconds_per_call) {
    double n = 0.02 / (seconds_per_call > 1e-7 ? seconds_per_call : 1e-7);
    return n < 1 ? 1 : n > 2000 ? 2000 : (int)n;
}

static int phase(dsgd_ctx *ctx, const dsgd_backend_i *be, const gemm_shape *s, int ns, int repeats,
                 const double *warm, dsgd_buffer *ba, dsgd_buffer *bb, dsgd_buffer *bc, bufs *h, double (*cl)[64],
                 double (*o1)[128], double (*o2)[128], int r0) {
    int r, i, c, inner_ob[MAXS][2];
    for (i = 0; i < ns; ++i) inner_ob[i][0] = inner_ob[i][1] = 1;
#ifdef DSGD_HAVE_OPENBLAS
    {
        int th; /* one untimed call each sizes OpenBLAS's samples */
        for (th = 1; th <= 2; ++th) {
            openblas_set_num_threads(th);
            for (i = 0; i < ns; ++i) {
                int lda = s[i].trans_a ? s[i].m : s[i].k, ldb = s[i].trans_b ? s[i].k : s[i].n;
                double t0 = dsgd_now();
                cblas_sgemm(CblasRowMajor, s[i].trans_a ? CblasTrans : CblasNoTrans,
                            s[i].trans_b ? CblasTrans : CblasNoTrans, s[i].m, s[i].n, s[i].k, 1.0f, h->a, lda, h->b,
                            ldb, 0.0f, h->c, s[i].n);
                inner_ob[i][th - 1] = calls_for(dsgd_now() - t0);
            }
        }
    }
#endif
    for (r = 0; r < repeats; ++r) {
        struct timespec pause;
        for (i = 0; i < ns; ++i) {
            int lda = s[i].trans_a ? s[i].m : s[i].k, ldb = s[i].trans_b ? s[i].k : s[i].n, inner = calls_for(warm[i]);
            dsgd_ref ra, rb, rc;
            double t0;
            ra.buf = ba;
            rb.buf = bb;
            rc.buf = bc;
            ra.off = rb.off = rc.off = 0;
            t0 = dsgd_now();
            for (c = 0; c < inner; ++c) {
                if (be->gemm(be->impl, s[i].trans_a, s[i].trans_b, s[i].m, s[i].n, s[i].k, 1.0f, ra, lda, rb, ldb,
                             0.0f, rc, s[i].n) != DSGD_OK) {
                    fprintf(stderr, "gemm_cl: %s\n", dsgd_ctx_last_error(ctx));
                    return 0;
                }
            }
            if (be->finish(be->impl) != DSGD_OK) {
                fprintf(stderr, "gemm_cl: %s\n", dsgd_ctx_last_error(ctx));
                return 0;
            }
            cl[i][r] = (dsgd_now() - t0) / inner;
        }
#ifdef DSGD_HAVE_OPENBLAS
        {
            int th;
            for (th = 1; th <= 2; ++th) {
                openblas_set_num_threads(th);
                for (i = 0; i < ns; ++i) {
                    int lda = s[i].trans_a ? s[i].m : s[i].k, ldb = s[i].trans_b ? s[i].k : s[i].n;
                    int inner = inner_ob[i][th - 1];
                    double t0 = dsgd_now();
                    for (c = 0; c < inner; ++c)
                        cblas_sgemm(CblasRowMajor, s[i].trans_a ? CblasTrans : CblasNoTrans,
                                    s[i].trans_b ? CblasTrans : CblasNoTrans, s[i].m, s[i].n, s[i].k, 1.0f, h->a,
                                    lda, h->b, ldb, 0.0f, h->c, s[i].n);
                    (th == 1 ? o1 : o2)[i][r0 + r] = (dsgd_now() - t0) / inner;
                }
            }
        }
#else
        (void)h;
        (void)inner_ob;
        for (i = 0; i < ns; ++i) o1[i][r0 + r] = o2[i][r0 + r] = 0;
#endif
        pause.tv_sec = 0;
        pause.tv_nsec = 200000000L;
        nanosleep(&pause, NULL);
    }
    return 1;
}

static void print_log(void *ud, dsgd_log_level level, const char *msg) {
    (void)ud;
    if (level <= DSGD_LOG_INFO) fprintf(stderr, "gemm_cl: %s\n", msg);
}

int main(int argc, char **argv) {
    const char *device = NULL, *tune_cache = NULL;
    int repeats = 15, ns, i, have_tuned = 0, have_ob = 0;
    gemm_shape s[MAXS];
    static double tcl[MAXS][64], tcl2[MAXS][64], to1[MAXS][128], to2[MAXS][128];
    double stock[MAXS], tuned[MAXS], ob1[MAXS], ob2[MAXS], warm[MAXS], err = 0, err2 = 0;
    double tot_stock = 0, tot_tuned = 0, tot_ob1 = 0, tot_ob2 = 0, tot_fl = 0, small_tuned = 0;
    size_t amax = 0, bmax = 0, cmax = 0, k;
    dsgd_ctx_desc cdsc;
    dsgd_ctx *ctx;
    dsgd_cl_context_desc cd;
    dsgd_cl_context *cl;
    dsgd_backend_i be;
    dsgd_cl_gemm_params p;
    dsgd_buffer *ba, *bb, *bc;
    dsgd_ref ref;
    bufs h;
    uint64_t rng = 7;
    char path[1100];
    const dsgd_cl_device_info *info;
    const char *threads = getenv("POCL_MAX_PTHREAD_COUNT");

    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--tune-cache")) tune_cache = argv[i + 1];
        else break;
    }
    if (i < argc || repeats < 1 || repeats > 64) {
        fprintf(stderr, "usage: gemm_cl [--repeats N (1..64)] [--device SPEC] [--tune-cache PATH]\n");
        return 1;
    }
    ns = mlp_gemm_shapes(s, MAXS);
    memset(&cdsc, 0, sizeof cdsc);
    cdsc.logger.func = print_log;
    if (dsgd_ctx_create(&cdsc, &ctx) != DSGD_OK) return 1;
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    cd.tuning = DSGD_CL_TUNING_OFF; /* stock first */
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK || dsgd_cl_backend_create(ctx, cl, NULL, &be) != DSGD_OK) {
        printf("gemm_cl: skipped: %s\n", dsgd_ctx_last_error(ctx));
        return 0;
    }
    info = dsgd_cl_context_device_info(cl, 0);
    printf("device: %s (%s, driver %s), %u compute units\n", info->device_name, info->platform_name,
           info->driver_version, info->compute_units);
    printf("POCL_MAX_PTHREAD_COUNT=%s; OpenBLAS on 1 and 2 threads; %d interleaved rounds, medians\n",
           threads ? threads : "(unset)", repeats);

    /* inputs: the same random matrices on the device and on the host */
    for (i = 0; i < ns; ++i) {
        if ((size_t)s[i].m * s[i].k > amax) amax = (size_t)s[i].m * s[i].k;
        if ((size_t)s[i].k * s[i].n > bmax) bmax = (size_t)s[i].k * s[i].n;
        if ((size_t)s[i].m * s[i].n > cmax) cmax = (size_t)s[i].m * s[i].n;
    }
    h.a = (float *)malloc(amax * sizeof(float));
    h.b = (float *)malloc(bmax * sizeof(float));
    h.c = (float *)malloc(cmax * sizeof(float));
    if (!h.a || !h.b || !h.c) return 1;
    for (k = 0; k < amax; ++k) h.a[k] = (float)(dsgd_rng_uniform(&rng) * 2 - 1);
    for (k = 0; k < bmax; ++k) h.b[k] = (float)(dsgd_rng_uniform(&rng) * 2 - 1);
    ref.off = 0;
    if (be.buffer_create(be.impl, amax, &ba) != DSGD_OK || be.buffer_create(be.impl, bmax, &bb) != DSGD_OK ||
        be.buffer_create(be.impl, cmax, &bc) != DSGD_OK)
        return 1;
    ref.buf = ba;
    if (be.write(be.impl, ref, h.a, amax) != DSGD_OK) return 1;
    ref.buf = bb;
    if (be.write(be.impl, ref, h.b, bmax) != DSGD_OK) return 1;

    /* phase 1: stock */
    if (gemm_measure(ctx, &be, s, ns, 1, warm, &err) != DSGD_OK ||
        !phase(ctx, &be, s, ns, repeats, warm, ba, bb, bc, &h, tcl, to1, to2, 0)) {
        fprintf(stderr, "gemm_cl: stock: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    /* phase 2: tuned */
    if (dsgd_cl_tune_cache_path(cl, 0, tune_cache, path, sizeof path) == DSGD_OK &&
        dsgd_cl_load_gemm_params(ctx, cl, 0, path, &p) == DSGD_OK) {
        if (dsgd_cl_apply_gemm_params(ctx, cl, 0, &p) != DSGD_OK ||
            gemm_measure(ctx, &be, s, ns, 1, warm, &err2) != DSGD_OK ||
            !phase(ctx, &be, s, ns, repeats, warm, ba, bb, bc, &h, tcl2, to1, to2, repeats)) {
            fprintf(stderr, "gemm_cl: tuned: %s\n", dsgd_ctx_last_error(ctx));
            return 1;
        }
        have_tuned = 1;
        printf("tuned parameters: %s\n", path);
    } else {
        printf("tuned parameters: none (%s); run tools/cl_tune\n", dsgd_ctx_last_error(ctx));
    }
    if (err > 1e-4 || err2 > 1e-4) {
        fprintf(stderr, "gemm_cl: wrong results (max relative error stock %.3g, tuned %.3g)\n", err, err2);
        return 1;
    }
#ifdef DSGD_HAVE_OPENBLAS
    have_ob = 1;
#endif
    for (i = 0; i < ns; ++i) {
        int nob = have_tuned ? 2 * repeats : repeats;
        stock[i] = bench_median(tcl[i], repeats);
        tuned[i] = have_tuned ? bench_median(tcl2[i], repeats) : 0;
        ob1[i] = bench_median(to1[i], nob);
        ob2[i] = bench_median(to2[i], nob);
    }

    printf("\n%-18s %10s %10s %10s %10s %9s %9s\n", "shape (GFLOP/s)", "cl stock", "cl tuned", "oblas 1t",
           "oblas 2t", "tuned/1t", "tuned/2t");
    for (i = 0; i < ns; ++i) {
        char nm[48];
        double f = flops(&s[i]);
        snprintf(nm, sizeof nm, "%c%c %dx%dx%d", s[i].trans_a ? 'T' : 'N', s[i].trans_b ? 'T' : 'N', s[i].m,
                 s[i].n, s[i].k);
        printf("%-18s %10.1f %10.1f %10.1f %10.1f %9.2f %9.2f\n", nm, f / stock[i] * 1e-9,
               have_tuned ? f / tuned[i] * 1e-9 : 0.0, have_ob ? f / ob1[i] * 1e-9 : 0.0,
               have_ob ? f / ob2[i] * 1e-9 : 0.0, have_tuned && have_ob ? ob1[i] / tuned[i] : 0.0,
               have_tuned && have_ob ? ob2[i] / tuned[i] : 0.0);
        tot_fl += f;
        tot_stock += stock[i];
        tot_tuned += tuned[i];
        tot_ob1 += ob1[i];
        tot_ob2 += ob2[i];
        if (s[i].m < 16 || s[i].n < 16 || s[i].k < 16) small_tuned += have_tuned ? tuned[i] : stock[i];
    }
    printf("%-18s %10.1f %10.1f %10.1f %10.1f %9.2f %9.2f\n", "all (sum of times)", tot_fl / tot_stock * 1e-9,
           have_tuned ? tot_fl / tot_tuned * 1e-9 : 0.0, have_ob ? tot_fl / tot_ob1 * 1e-9 : 0.0,
           have_ob ? tot_fl / tot_ob2 * 1e-9 : 0.0, have_tuned && have_ob ? tot_ob1 / tot_tuned : 0.0,
           have_tuned && have_ob ? tot_ob2 / tot_tuned : 0.0);
    printf("one step's GEMMs: OpenCL stock %.2f ms, tuned %.2f ms; OpenBLAS 1 thread %.2f ms, 2 threads %.2f ms; "
           "the x10 layer's GEMMs take %.1f%% of the OpenCL GEMM time\n\n",
           tot_stock * 1e3, tot_tuned * 1e3, tot_ob1 * 1e3, tot_ob2 * 1e3,
           100.0 * small_tuned / (have_tuned ? tot_tuned : tot_stock));
    for (i = 0; i < ns; ++i) {
        double f = flops(&s[i]);
        printf("gemm_cl shape=%dx%dx%d trans=%c%c stock_gflops=%.2f tuned_gflops=%.2f openblas1_gflops=%.2f "
               "openblas2_gflops=%.2f tuned_vs_openblas1=%.3f tuned_vs_openblas2=%.3f\n",
               s[i].m, s[i].n, s[i].k, s[i].trans_a ? 'T' : 'N', s[i].trans_b ? 'T' : 'N', f / stock[i] * 1e-9,
               have_tuned ? f / tuned[i] * 1e-9 : 0.0, have_ob ? f / ob1[i] * 1e-9 : 0.0,
               have_ob ? f / ob2[i] * 1e-9 : 0.0, have_tuned && have_ob ? ob1[i] / tuned[i] : 0.0,
               have_tuned && have_ob ? ob2[i] / tuned[i] : 0.0);
    }
    printf("gemm_cl total stock_ms=%.3f tuned_ms=%.3f openblas1_ms=%.3f openblas2_ms=%.3f pocl_threads=%s\n",
           tot_stock * 1e3, tot_tuned * 1e3, tot_ob1 * 1e3, tot_ob2 * 1e3, threads ? threads : "unset");
    be.buffer_destroy(be.impl, ba);
    be.buffer_destroy(be.impl, bb);
    be.buffer_destroy(be.impl, bc);
    free(h.a);
    free(h.b);
    free(h.c);
    be.destroy(be.impl);
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    return 0;
}
