/* bench/gemm_cl.c - GFLOP/s of the OpenCL backend's GEMM (CLBlast) at the MLP
   shapes, with CLBlast's stock parameters and with the device's tuned ones,
   beside the two CPU GEMMs at the SAME thread count T, all in the same run:
   OpenBLAS's cblas_sgemm on T threads and the CPU backend's built-in GEMM
   on T threads (dsgd_cpu_backend_create_desc, threads = T).

   Threads: one thread count per process. PoCL reads POCL_MAX_PTHREAD_COUNT
   once, when OpenCL is first used, so T cannot change within a process:
   --threads T sets POCL_MAX_PTHREAD_COUNT=T (before any OpenCL call) when it
   is unset, and refuses to run when it is set to another value (that would
   compare unequal thread counts). Without --threads, T is
   POCL_MAX_PTHREAD_COUNT when set, else the online cores (PoCL's own
   default). OpenBLAS gets T with openblas_set_num_threads
   (OPENBLAS_NUM_THREADS is ignored here), the built-in GEMM a CPU backend
   of T threads. Every output line names T. To compare 1 and 2 threads, run
   it twice:
     for t in 1 2; do build/bench/gemm_cl --threads $t; done
   (POCL_MAX_PTHREAD_COUNT unset, POCL_CACHE_DIR writable; make bench sets
   POCL_MAX_PTHREAD_COUNT=2, so there T = 2.)

   Shapes: the GEMMs of one training step of the 784-512-512-10 MLP at batch
   256 (mlp_gemm_shapes of tools/cl_gemm_measure.h: forward NN, weight
   gradient TN, input gradient NT per layer, plus the first layer's input
   gradient).

   Order matters: CLBlast's parameter overrides cannot be undone within a
   process, so the stock parameters are timed first, then the tuned file is
   applied (its path as the backend resolves it: --tune-cache, else
   $DSGD_CL_TUNE_CACHE, else the user cache directory; tools/cl_tune writes
   it). Each phase starts with one checked warm-up call per shape on OpenCL
   (which compiles on first use; the result is compared with a
   double-precision host product), and the built-in GEMM's warm-up call is
   checked the same way once. Then REPEATS rounds. In each round every shape
   gets one sample on OpenCL, then one on OpenBLAS (cblas_sgemm, when built
   with -DDSGD_HAVE_OPENBLAS, as the Makefile does when OpenBLAS is
   installed), then one on the built-in GEMM, with a 50 ms pause between the
   three and 0.2 s after the round, so that one library's idle threads have
   stopped spinning before the next needs the cores. A sample is the mean
   time of enough back-to-back calls of one shape to last ~20 ms (OpenCL:
   enqueued back to back, one clFinish at the end, as in a training step
   whose queue stays full). Interleaving by rounds makes a noisy, shared
   machine slow all columns alike. Reported: the median sample per shape;
   the CPU GEMMs' over both phases.

   The OpenBLAS column names the kernels OpenBLAS chose at run time
   (openblas_get_corename): Debian 12's OpenBLAS 0.3.21 takes its Haswell
   (AVX2) kernels on this AVX-512 AMD EPYC; OPENBLAS_CORETYPE=SkylakeX in
   the environment makes it use its AVX-512 ones, about twice as fast here.

   Ratios are speed ratios at equal threads: OpenCL GFLOP/s / the CPU GEMM's
   GFLOP/s (= CPU time / OpenCL time); below 1 the OpenCL GEMM is slower.

   --shapes LIST times other shapes instead (tools/cl_tune's syntax, e.g.
   NN:4096x4096x4096 for a fraction of a GPU's peak; a large GEMM's check
   compares spread rows of C, see gemm_check_row_step).

   Usage: build/bench/gemm_cl [--threads T] [--repeats N] [--device SPEC]
                              [--tune-cache PATH] [--shapes LIST]
   Output: a table, then one machine-readable line per shape:
     gemm_cl threads=T shape=MxNxK trans=NN stock_gflops=.. tuned_gflops=..
             openblas_gflops=.. builtin_gflops=.. tuned_vs_openblas=..
             tuned_vs_builtin=..
   and a "gemm_cl total threads=T" line over the sum of the times (one
   step's GEMMs). A value is 0 where its column did not run (no tuning
   cache; built without OpenBLAS). */
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
extern int openblas_get_num_threads(void);
extern char *openblas_get_corename(void);
#endif

#define MAXS 16
#define MAXR 64

static double flops(const gemm_shape *s) { return 2.0 * s->m * s->n * s->k; }

static int calls_for(double seconds_per_call) {
    double n = 0.02 / (seconds_per_call > 1e-7 ? seconds_per_call : 1e-7);
    return n < 1 ? 1 : n > 2000 ? 2000 : (int)n;
}

static void pause_ms(long ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

/* A backend with its own A, B, C buffers holding the shared inputs. */
typedef struct side {
    dsgd_backend_i be;
    dsgd_buffer *a, *b, *c;
} side;

typedef struct host {
    float *a, *b, *c; /* host copies, for OpenBLAS */
    size_t amax, bmax, cmax;
} host;

static int side_init(const host *h, side *sd) {
    dsgd_ref ref;
    ref.off = 0;
    if (sd->be.buffer_create(sd->be.impl, h->amax, &sd->a) != DSGD_OK ||
        sd->be.buffer_create(sd->be.impl, h->bmax, &sd->b) != DSGD_OK ||
        sd->be.buffer_create(sd->be.impl, h->cmax, &sd->c) != DSGD_OK)
        return 0;
    ref.buf = sd->a;
    if (sd->be.write(sd->be.impl, ref, h->a, h->amax) != DSGD_OK) return 0;
    ref.buf = sd->b;
    return sd->be.write(sd->be.impl, ref, h->b, h->bmax) == DSGD_OK;
}

static void side_free(side *sd) {
    if (sd->a) sd->be.buffer_destroy(sd->be.impl, sd->a);
    if (sd->b) sd->be.buffer_destroy(sd->be.impl, sd->b);
    if (sd->c) sd->be.buffer_destroy(sd->be.impl, sd->c);
    if (sd->be.destroy) sd->be.destroy(sd->be.impl);
}

/* Seconds per call of `inner` back-to-back calls of shape s on backend sd,
   finished at the end; < 0 on error. */
static double time_backend(dsgd_ctx *ctx, const side *sd, const gemm_shape *s, int inner) {
    int lda = s->trans_a ? s->m : s->k, ldb = s->trans_b ? s->k : s->n, c;
    dsgd_ref ra, rb, rc;
    double t0;
    ra.buf = sd->a;
    rb.buf = sd->b;
    rc.buf = sd->c;
    ra.off = rb.off = rc.off = 0;
    t0 = dsgd_now();
    for (c = 0; c < inner; ++c) {
        if (sd->be.gemm(sd->be.impl, s->trans_a, s->trans_b, s->m, s->n, s->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc,
                        s->n) != DSGD_OK) {
            fprintf(stderr, "gemm_cl: %s: %s\n", sd->be.name, dsgd_ctx_last_error(ctx));
            return -1;
        }
    }
    if (sd->be.finish && sd->be.finish(sd->be.impl) != DSGD_OK) {
        fprintf(stderr, "gemm_cl: %s: %s\n", sd->be.name, dsgd_ctx_last_error(ctx));
        return -1;
    }
    return (dsgd_now() - t0) / inner;
}

#ifdef DSGD_HAVE_OPENBLAS
static void openblas_call(const host *h, const gemm_shape *s) {
    int lda = s->trans_a ? s->m : s->k, ldb = s->trans_b ? s->k : s->n;
    cblas_sgemm(CblasRowMajor, s->trans_a ? CblasTrans : CblasNoTrans, s->trans_b ? CblasTrans : CblasNoTrans, s->m,
                s->n, s->k, 1.0f, h->a, lda, h->b, ldb, 0.0f, h->c, s->n);
}
#endif

/* One phase: `repeats` rounds over the shapes, each shape once on the OpenCL
   backend, on OpenBLAS (when available) and on the built-in CPU GEMM, all
   on the process's T threads. cl[i][r], ob[i][r0 + r], bi[i][r0 + r] get
   the seconds per call. */
static int phase(dsgd_ctx *ctx, const side *cl, const side *cpu, const host *h, const gemm_shape *s, int ns,
                 int repeats, const double *warm_cl, const double *warm_bi, double (*tcl)[MAXR],
                 double (*ob)[2 * MAXR], double (*bi)[2 * MAXR], int r0) {
    int r, i, inner_ob[MAXS];
    for (i = 0; i < ns; ++i) inner_ob[i] = 1;
#ifdef DSGD_HAVE_OPENBLAS
    for (i = 0; i < ns; ++i) { /* one untimed call each sizes OpenBLAS's samples */
        double t0 = dsgd_now();
        openblas_call(h, &s[i]);
        inner_ob[i] = calls_for(dsgd_now() - t0);
    }
#endif
    for (r = 0; r < repeats; ++r) {
        for (i = 0; i < ns; ++i)
            if ((tcl[i][r] = time_backend(ctx, cl, &s[i], calls_for(warm_cl[i]))) < 0) return 0;
        pause_ms(50);
#ifdef DSGD_HAVE_OPENBLAS
        for (i = 0; i < ns; ++i) {
            int c;
            double t0 = dsgd_now();
            for (c = 0; c < inner_ob[i]; ++c) openblas_call(h, &s[i]);
            ob[i][r0 + r] = (dsgd_now() - t0) / inner_ob[i];
        }
        pause_ms(50);
#else
        (void)h;
        (void)inner_ob;
        for (i = 0; i < ns; ++i) ob[i][r0 + r] = 0;
#endif
        for (i = 0; i < ns; ++i)
            if ((bi[i][r0 + r] = time_backend(ctx, cpu, &s[i], calls_for(warm_bi[i]))) < 0) return 0;
        pause_ms(200);
    }
    return 1;
}

static void print_log(void *ud, dsgd_log_level level, const char *msg) {
    (void)ud;
    if (level <= DSGD_LOG_INFO) fprintf(stderr, "gemm_cl: %s\n", msg);
}

int main(int argc, char **argv) {
    const char *device = NULL, *tune_cache = NULL, *shapes_s = NULL;
    int repeats = 15, ns, i, have_tuned = 0, have_ob = 0, threads = 0, ob_threads = 0;
    gemm_shape s[MAXS];
    static double tcl[MAXS][MAXR], tcl2[MAXS][MAXR], tob[MAXS][2 * MAXR], tbi[MAXS][2 * MAXR];
    double stock[MAXS], tuned[MAXS], ob[MAXS], bi[MAXS], warm[MAXS], warm_bi[MAXS], err = 0, err2 = 0, err_bi = 0;
    double tot_stock = 0, tot_tuned = 0, tot_ob = 0, tot_bi = 0, tot_fl = 0, small_tuned = 0;
    dsgd_ctx_desc cdsc;
    dsgd_ctx *ctx;
    dsgd_cl_context_desc cd;
    dsgd_cl_context *cl;
    dsgd_cpu_backend_desc bd;
    dsgd_cl_gemm_params p;
    side scl, scpu;
    host h;
    uint64_t rng = 7;
    size_t k;
    char path[1100];
    const dsgd_cl_device_info *info;
    const char *ob_core = "none";

    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) {
            threads = atoi(argv[i + 1]);
            if (threads < 1) break;
        } else if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--tune-cache")) tune_cache = argv[i + 1];
        else if (!strcmp(argv[i], "--shapes")) shapes_s = argv[i + 1];
        else break;
    }
    ns = shapes_s ? gemm_parse_shapes(shapes_s, s, MAXS) : mlp_gemm_shapes(s, MAXS);
    if (i < argc || repeats < 1 || repeats > MAXR || ns < 1) {
        fprintf(stderr,
                "usage: gemm_cl [--threads T] [--repeats N (1..%d)] [--device SPEC] [--tune-cache PATH]\n"
                "               [--shapes LIST (at most %d, e.g. NN:4096x4096x4096,TN:784x512x256)]\n",
                MAXR, MAXS);
        return 1;
    }
    if ((threads = bench_pocl_threads("gemm_cl", threads)) < 1) return 1;
    memset(&scl, 0, sizeof scl);
    memset(&scpu, 0, sizeof scpu);
    memset(&cdsc, 0, sizeof cdsc);
    cdsc.logger.func = print_log;
    if (dsgd_ctx_create(&cdsc, &ctx) != DSGD_OK) return 1;
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    cd.tuning = DSGD_CL_TUNING_OFF; /* stock first */
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK || dsgd_cl_backend_create(ctx, cl, NULL, &scl.be) != DSGD_OK) {
        printf("gemm_cl: skipped: %s\n", dsgd_ctx_last_error(ctx));
        return 0;
    }
    memset(&bd, 0, sizeof bd);
    bd.threads = threads;
    if (dsgd_cpu_backend_create_desc(ctx, &bd, &scpu.be) != DSGD_OK) {
        fprintf(stderr, "gemm_cl: cpu backend: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
#ifdef DSGD_HAVE_OPENBLAS
    openblas_set_num_threads(threads);
    ob_threads = openblas_get_num_threads();
    ob_core = openblas_get_corename();
    have_ob = 1;
#endif
    info = dsgd_cl_context_device_info(cl, 0);
    printf("device: %s (%s, driver %s), %u compute units\n", info->device_name, info->platform_name,
           info->driver_version, info->compute_units);
    printf("threads: T=%d for every column: PoCL POCL_MAX_PTHREAD_COUNT=%s, ", threads,
           getenv("POCL_MAX_PTHREAD_COUNT"));
    if (have_ob) printf("OpenBLAS openblas_get_num_threads()=%d (%s kernels), ", ob_threads, ob_core);
    else printf("OpenBLAS not built in, ");
    printf("built-in CPU GEMM %d threads (%s kernels); %d interleaved rounds, medians\n",
           dsgd_cpu_backend_threads(&scpu.be), dsgd_cpu_backend_isa(&scpu.be), repeats);
    if (have_ob && ob_threads != threads)
        printf("warning: OpenBLAS runs on %d threads, not %d\n", ob_threads, threads);

    /* inputs: the same random matrices on the device, in the CPU backend and on the host */
    memset(&h, 0, sizeof h);
    for (i = 0; i < ns; ++i) {
        if ((size_t)s[i].m * s[i].k > h.amax) h.amax = (size_t)s[i].m * s[i].k;
        if ((size_t)s[i].k * s[i].n > h.bmax) h.bmax = (size_t)s[i].k * s[i].n;
        if ((size_t)s[i].m * s[i].n > h.cmax) h.cmax = (size_t)s[i].m * s[i].n;
    }
    h.a = (float *)malloc(h.amax * sizeof(float));
    h.b = (float *)malloc(h.bmax * sizeof(float));
    h.c = (float *)malloc(h.cmax * sizeof(float));
    if (!h.a || !h.b || !h.c) return 1;
    for (k = 0; k < h.amax; ++k) h.a[k] = (float)(dsgd_rng_uniform(&rng) * 2 - 1);
    for (k = 0; k < h.bmax; ++k) h.b[k] = (float)(dsgd_rng_uniform(&rng) * 2 - 1);
    if (!side_init(&h, &scl) || !side_init(&h, &scpu)) {
        fprintf(stderr, "gemm_cl: buffers: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }

    /* the built-in GEMM: checked warm-up, sample sizes */
    if (gemm_measure(ctx, &scpu.be, s, ns, 1, warm_bi, &err_bi) != DSGD_OK) {
        fprintf(stderr, "gemm_cl: built-in: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    /* phase 1: stock */
    if (gemm_measure(ctx, &scl.be, s, ns, 1, warm, &err) != DSGD_OK ||
        !phase(ctx, &scl, &scpu, &h, s, ns, repeats, warm, warm_bi, tcl, tob, tbi, 0)) {
        fprintf(stderr, "gemm_cl: stock: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    /* phase 2: tuned */
    if (dsgd_cl_tune_cache_path(cl, 0, tune_cache, path, sizeof path) == DSGD_OK &&
        dsgd_cl_load_gemm_params(ctx, cl, 0, path, &p) == DSGD_OK) {
        if (dsgd_cl_apply_gemm_params(ctx, cl, 0, &p) != DSGD_OK ||
            gemm_measure(ctx, &scl.be, s, ns, 1, warm, &err2) != DSGD_OK ||
            !phase(ctx, &scl, &scpu, &h, s, ns, repeats, warm, warm_bi, tcl2, tob, tbi, repeats)) {
            fprintf(stderr, "gemm_cl: tuned: %s\n", dsgd_ctx_last_error(ctx));
            return 1;
        }
        have_tuned = 1;
        printf("tuned parameters: %s\n", path);
    } else {
        printf("tuned parameters: none (%s); run tools/cl_tune\n", dsgd_ctx_last_error(ctx));
    }
    if (err > 1e-4 || err2 > 1e-4 || err_bi > 1e-4) {
        fprintf(stderr, "gemm_cl: wrong results (max relative error OpenCL stock %.3g, tuned %.3g, built-in %.3g)\n",
                err, err2, err_bi);
        return 1;
    }
    printf("checked against a double-precision product: max relative error OpenCL stock %.2g, tuned %.2g, "
           "built-in %.2g\n",
           err, err2, err_bi);
    for (i = 0; i < ns; ++i) {
        int nc = have_tuned ? 2 * repeats : repeats;
        stock[i] = bench_median(tcl[i], repeats);
        tuned[i] = have_tuned ? bench_median(tcl2[i], repeats) : 0;
        ob[i] = bench_median(tob[i], nc);
        bi[i] = bench_median(tbi[i], nc);
    }

    printf("\nGFLOP/s, every column on %d thread%s; ratios: OpenCL tuned GFLOP/s / the CPU GEMM's (<1: OpenCL "
           "slower)\n",
           threads, threads == 1 ? "" : "s");
    printf("%-18s %9s %9s %9s %9s %11s %11s\n", "shape", "cl stock", "cl tuned", "openblas", "built-in",
           "tuned/oblas", "tuned/built");
    for (i = 0; i < ns; ++i) {
        char nm[48];
        double f = flops(&s[i]);
        snprintf(nm, sizeof nm, "%c%c %dx%dx%d", s[i].trans_a ? 'T' : 'N', s[i].trans_b ? 'T' : 'N', s[i].m,
                 s[i].n, s[i].k);
        printf("%-18s %9.1f %9.1f %9.1f %9.1f %11.2f %11.2f\n", nm, f / stock[i] * 1e-9,
               have_tuned ? f / tuned[i] * 1e-9 : 0.0, have_ob ? f / ob[i] * 1e-9 : 0.0, f / bi[i] * 1e-9,
               have_tuned && have_ob ? ob[i] / tuned[i] : 0.0, have_tuned ? bi[i] / tuned[i] : 0.0);
        tot_fl += f;
        tot_stock += stock[i];
        tot_tuned += tuned[i];
        tot_ob += ob[i];
        tot_bi += bi[i];
        if (s[i].m < 16 || s[i].n < 16 || s[i].k < 16) small_tuned += have_tuned ? tuned[i] : stock[i];
    }
    printf("%-18s %9.1f %9.1f %9.1f %9.1f %11.2f %11.2f\n", "all (sum of times)", tot_fl / tot_stock * 1e-9,
           have_tuned ? tot_fl / tot_tuned * 1e-9 : 0.0, have_ob ? tot_fl / tot_ob * 1e-9 : 0.0,
           tot_fl / tot_bi * 1e-9, have_tuned && have_ob ? tot_ob / tot_tuned : 0.0,
           have_tuned ? tot_bi / tot_tuned : 0.0);
    printf("%s on %d thread%s each: OpenCL stock %.2f ms, tuned %.2f ms; OpenBLAS %.2f ms; built-in "
           "%.2f ms; GEMMs with a side under 16 take %.1f%% of the OpenCL GEMM time\n\n",
           shapes_s ? "the shapes' GEMMs" : "one step's GEMMs", threads, threads == 1 ? "" : "s", tot_stock * 1e3,
           tot_tuned * 1e3, tot_ob * 1e3, tot_bi * 1e3, 100.0 * small_tuned / (have_tuned ? tot_tuned : tot_stock));
    for (i = 0; i < ns; ++i) {
        double f = flops(&s[i]);
        printf("gemm_cl threads=%d shape=%dx%dx%d trans=%c%c stock_gflops=%.2f tuned_gflops=%.2f "
               "openblas_gflops=%.2f builtin_gflops=%.2f tuned_vs_openblas=%.3f tuned_vs_builtin=%.3f\n",
               threads, s[i].m, s[i].n, s[i].k, s[i].trans_a ? 'T' : 'N', s[i].trans_b ? 'T' : 'N',
               f / stock[i] * 1e-9, have_tuned ? f / tuned[i] * 1e-9 : 0.0, have_ob ? f / ob[i] * 1e-9 : 0.0,
               f / bi[i] * 1e-9, have_tuned && have_ob ? ob[i] / tuned[i] : 0.0, have_tuned ? bi[i] / tuned[i] : 0.0);
    }
    printf("gemm_cl total threads=%d stock_ms=%.3f tuned_ms=%.3f openblas_ms=%.3f builtin_ms=%.3f "
           "tuned_vs_openblas=%.3f tuned_vs_builtin=%.3f pocl_threads=%d openblas_threads=%d builtin_threads=%d "
           "openblas_kernels=%s builtin_kernels=%s\n",
           threads, tot_stock * 1e3, tot_tuned * 1e3, tot_ob * 1e3, tot_bi * 1e3,
           have_tuned && have_ob ? tot_ob / tot_tuned : 0.0, have_tuned ? tot_bi / tot_tuned : 0.0, threads,
           ob_threads, dsgd_cpu_backend_threads(&scpu.be), ob_core, dsgd_cpu_backend_isa(&scpu.be));
    side_free(&scl);
    side_free(&scpu);
    free(h.a);
    free(h.b);
    free(h.c);
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    return 0;
}
