/* bench/conv.c - a convolution layer as im2col + GEMM (IMAGES in
   distsgd/backend.h), forward and backward, on the CPU backend and on the
   OpenCL backend at the SAME thread count T, in the same run.

   Layers: the two convolutions of a small CNN at batch 64,
     conv1  64 x 28 x 28 x 1  -> 32 channels, 3x3, stride 1, pad 1
            (GEMM 50176 x 32 x 9)
     conv2  64 x 14 x 14 x 32 -> 64 channels, 3x3, stride 1, pad 1
            (GEMM 12544 x 64 x 288)
   forward   col = im2col(x); y = col W (gemm NN); y = relu(y + b)
   backward  dy *= relu'(y); dW = col^T dy (gemm TN); db = bias_backward(dy);
             dcol = dy W^T (gemm NT); dx = col2im(dcol)
   (the backward computes dx for conv1 too, which a first layer would skip,
   so both rows time the same work). im2col and col2im are also timed alone.

   GFLOP/s counts the GEMMs' multiply-adds only (2 M N K forward, 4 M N K
   backward) over the whole pass's time, so the copies, the bias and the
   activation lower it: it is the layer's rate, not the GEMM's.

   Threads: --threads T (default: POCL_MAX_PTHREAD_COUNT when set, else the
   online cores). The CPU backend gets T threads (dsgd_cpu_backend_desc);
   PoCL gets POCL_MAX_PTHREAD_COUNT=T, set here before any OpenCL call when
   it is unset (bench_pocl_threads of tools/cl_gemm_measure.h refuses a
   different value). CLBlast uses the device's tuned GEMM parameters when
   tools/cl_tune wrote them (dsgd_cl_context_desc.tuning AUTO), else its
   defaults; the output says which.

   Method: one checked warm-up per pass (OpenCL against the CPU: y, dW and
   dx within 1e-4 of their largest magnitude; this compiles the kernels),
   then REPEATS rounds; in each round every layer and pass gets one sample
   on the CPU, then one on OpenCL. A sample is the mean time of enough
   back-to-back calls to last ~20 ms (OpenCL: enqueued back to back, one
   finish at the end). Reported: the median sample.

   Usage: build/bench/conv [--threads T] [--repeats N] [--device SPEC]
   Run it under `flock /tmp/bench.lock` on a shared machine.
   Output: a table, then one line per layer:
     conv layer=NAME threads=T cpu_fwd_ms=.. cl_fwd_ms=.. cpu_bwd_ms=..
          cl_bwd_ms=.. cpu_fwd_gflops=.. cl_fwd_gflops=.. cpu_bwd_gflops=..
          cl_bwd_gflops=..

   Build: make build/bench/conv (needs OpenCL and CLBlast, as the other
   OpenCL benches). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "distsgd_cl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "../tools/cl_gemm_measure.h"

#define MAXR 101
#define NLAYERS 2

typedef struct layer {
    const char *name;
    dsgd_window wd;
    int oc;
    int m, k;  /* GEMM: m = n oh ow rows, k = kh kw c */
    size_t nx; /* n h w c */
} layer;

/* One backend's buffers for one layer. */
typedef struct side {
    dsgd_backend_i *be;
    dsgd_buffer *x, *col, *w, *b, *y, *dy, *dw, *db, *dcol, *dx;
} side;

enum { P_FWD, P_BWD, P_IM2COL, P_COL2IM, NPASS };
static const char *const pass_name[NPASS] = {"forward", "backward", "im2col", "col2im"};

static dsgd_ref ref0(dsgd_buffer *b) {
    dsgd_ref r;
    r.buf = b;
    r.off = 0;
    return r;
}

static int fail(dsgd_ctx *ctx, const char *what) {
    fprintf(stderr, "conv: %s: %s\n", what, dsgd_ctx_last_error(ctx));
    return 1;
}

static void layer_make(layer *L, const char *name, int n, int h, int w, int c, int oc) {
    memset(L, 0, sizeof *L);
    L->name = name;
    L->wd.n = n;
    L->wd.h = h;
    L->wd.w = w;
    L->wd.c = c;
    L->wd.kh = L->wd.kw = 3;
    L->wd.stride = 1;
    L->wd.pad = 1;
    L->oc = oc;
    L->m = n * h * w; /* 3x3, stride 1, pad 1: oh = h, ow = w */
    L->k = 9 * c;
    L->nx = (size_t)n * h * w * c;
}

static float *rand_floats(uint64_t *rng, size_t n, float scale) {
    float *v = (float *)malloc(n * sizeof(float));
    size_t i;
    if (!v) return NULL;
    for (i = 0; i < n; ++i) v[i] = scale * (float)(2.0 * dsgd_rng_uniform(rng) - 1.0);
    return v;
}

static dsgd_result side_make(side *s, dsgd_backend_i *be, const layer *L, const float *x, const float *w,
                             const float *b, const float *r) {
    const size_t mk = (size_t)L->m * L->k, mn = (size_t)L->m * L->oc, kn = (size_t)L->k * L->oc;
    dsgd_result e = DSGD_OK;
    memset(s, 0, sizeof *s);
    s->be = be;
#define MK(f, n) \
    if (e == DSGD_OK) e = be->buffer_create(be->impl, (n), &s->f)
    MK(x, L->nx);
    MK(col, mk);
    MK(w, kn);
    MK(b, (size_t)L->oc);
    MK(y, mn);
    MK(dy, mn);
    MK(dw, kn);
    MK(db, (size_t)L->oc);
    MK(dcol, mk);
    MK(dx, L->nx);
#undef MK
    if (e == DSGD_OK) e = be->write(be->impl, ref0(s->x), x, L->nx);
    if (e == DSGD_OK) e = be->write(be->impl, ref0(s->w), w, kn);
    if (e == DSGD_OK) e = be->write(be->impl, ref0(s->b), b, (size_t)L->oc);
    if (e == DSGD_OK) e = be->write(be->impl, ref0(s->dy), r, mn);
    return e;
}

static void side_free(side *s) {
    dsgd_buffer **all[10];
    int i;
    all[0] = &s->x, all[1] = &s->col, all[2] = &s->w, all[3] = &s->b, all[4] = &s->y;
    all[5] = &s->dy, all[6] = &s->dw, all[7] = &s->db, all[8] = &s->dcol, all[9] = &s->dx;
    for (i = 0; i < 10; ++i)
        if (*all[i]) s->be->buffer_destroy(s->be->impl, *all[i]);
}

/* One pass (enqueued; not finished). */
static dsgd_result run_pass(side *s, const layer *L, int pass) {
    dsgd_backend_i *be = s->be;
    void *im = be->impl;
    dsgd_result e = DSGD_OK;
    switch (pass) {
    case P_FWD:
        e = be->im2col(im, &L->wd, ref0(s->x), ref0(s->col));
        if (e == DSGD_OK)
            e = be->gemm(im, 0, 0, L->m, L->oc, L->k, 1.0f, ref0(s->col), L->k, ref0(s->w), L->oc, 0.0f, ref0(s->y),
                         L->oc);
        if (e == DSGD_OK) e = be->bias_act_forward(im, DSGD_ACT_RELU, ref0(s->y), ref0(s->b), L->m, L->oc);
        break;
    case P_BWD:
        e = be->act_backward(im, DSGD_ACT_RELU, ref0(s->dy), ref0(s->y), (size_t)L->m * L->oc);
        if (e == DSGD_OK)
            e = be->gemm(im, 1, 0, L->k, L->oc, L->m, 1.0f, ref0(s->col), L->k, ref0(s->dy), L->oc, 0.0f, ref0(s->dw),
                         L->oc);
        if (e == DSGD_OK) e = be->bias_backward(im, ref0(s->db), ref0(s->dy), L->m, L->oc);
        if (e == DSGD_OK)
            e = be->gemm(im, 0, 1, L->m, L->k, L->oc, 1.0f, ref0(s->dy), L->oc, ref0(s->w), L->oc, 0.0f,
                         ref0(s->dcol), L->k);
        if (e == DSGD_OK) e = be->col2im(im, &L->wd, ref0(s->dcol), ref0(s->dx));
        break;
    case P_IM2COL: e = be->im2col(im, &L->wd, ref0(s->x), ref0(s->col)); break;
    default: e = be->col2im(im, &L->wd, ref0(s->dcol), ref0(s->dx)); break;
    }
    return e;
}

/* Mean seconds of `inner` back-to-back passes, finished; < 0 on error. */
static double sample(side *s, const layer *L, int pass, int inner) {
    double t0 = dsgd_now();
    int i;
    for (i = 0; i < inner; ++i)
        if (run_pass(s, L, pass) != DSGD_OK) return -1.0;
    if (s->be->finish && s->be->finish(s->be->impl) != DSGD_OK) return -1.0;
    return (dsgd_now() - t0) / inner;
}

static int calls_for(double one) {
    double n = 0.02 / (one > 1e-7 ? one : 1e-7);
    return n < 1 ? 1 : n > 10000 ? 10000 : (int)n;
}

static void pause_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)ms * 1000000L;
    nanosleep(&ts, NULL);
}

/* max |a - b| / max |b| over n floats read from both sides' buffers. */
static double compare(dsgd_ctx *ctx, side *cpu, side *cl, dsgd_buffer *bc, dsgd_buffer *bl, size_t n, int *bad) {
    float *a = (float *)malloc(n * sizeof(float)), *b = (float *)malloc(n * sizeof(float));
    double md = 0.0, mb = 0.0;
    size_t i;
    if (!a || !b || cpu->be->read(cpu->be->impl, ref0(bc), b, n) != DSGD_OK ||
        cl->be->read(cl->be->impl, ref0(bl), a, n) != DSGD_OK) {
        fail(ctx, "read");
        *bad = 1;
    } else {
        for (i = 0; i < n; ++i) {
            double d = fabs((double)a[i] - b[i]);
            if (!(d <= md)) md = d;
            if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
        }
    }
    free(a);
    free(b);
    return mb > 0 ? md / mb : md;
}

int main(int argc, char **argv) {
    const char *device = NULL;
    int repeats = 15, threads = 0, i, l, p, r, bad = 0;
    layer L[NLAYERS];
    side cpu[NLAYERS], cl[NLAYERS];
    static double t[NLAYERS][NPASS][2][MAXR];
    double med[NLAYERS][NPASS][2];
    int inner[NLAYERS][NPASS][2];
    dsgd_ctx *ctx = NULL;
    dsgd_cl_context_desc cd;
    dsgd_cl_context *clc = NULL;
    dsgd_cpu_backend_desc bd;
    dsgd_backend_i becpu, becl;
    uint64_t rng = 14;
    const dsgd_cl_device_info *info;

    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--repeats"))
            repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) {
            threads = atoi(argv[i + 1]);
            if (threads < 1) break;
        } else if (!strcmp(argv[i], "--device"))
            device = argv[i + 1];
        else
            break;
    }
    if (i < argc || repeats < 1 || repeats > MAXR) {
        fprintf(stderr, "usage: conv [--threads T] [--repeats N (1..%d)] [--device SPEC]\n", MAXR);
        return 1;
    }
    if ((threads = bench_pocl_threads("conv", threads)) < 1) return 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    memset(&bd, 0, sizeof bd);
    bd.threads = threads;
    if (dsgd_cpu_backend_create_desc(ctx, &bd, &becpu) != DSGD_OK) return fail(ctx, "cpu backend");
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    if (dsgd_cl_context_create(ctx, &cd, &clc) != DSGD_OK || dsgd_cl_backend_create(ctx, clc, NULL, &becl) != DSGD_OK) {
        printf("conv: skipped: %s\n", dsgd_ctx_last_error(ctx));
        becpu.destroy(becpu.impl);
        dsgd_ctx_destroy(ctx);
        return 0;
    }
    info = dsgd_cl_context_device_info(clc, 0);
    layer_make(&L[0], "conv1", 64, 28, 28, 1, 32);
    layer_make(&L[1], "conv2", 64, 14, 14, 32, 64);
    for (l = 0; l < NLAYERS; ++l) {
        const size_t kn = (size_t)L[l].k * L[l].oc;
        float *x = rand_floats(&rng, L[l].nx, 1.0f), *w = rand_floats(&rng, kn, 1.0f / sqrtf((float)L[l].k)),
              *b = rand_floats(&rng, (size_t)L[l].oc, 0.1f), *g = rand_floats(&rng, (size_t)L[l].m * L[l].oc, 1.0f);
        if (!x || !w || !b || !g) return fail(ctx, "out of memory");
        if (side_make(&cpu[l], &becpu, &L[l], x, w, b, g) != DSGD_OK) return fail(ctx, "cpu buffers");
        if (side_make(&cl[l], &becl, &L[l], x, w, b, g) != DSGD_OK) return fail(ctx, "opencl buffers");
        free(x);
        free(w);
        free(b);
        free(g);
    }

    printf("conv: im2col + GEMM convolution layers, batch 64, forward and backward\n");
    printf("threads: T=%d: the CPU backend's (kernels %s), PoCL POCL_MAX_PTHREAD_COUNT=%s\n", threads,
           dsgd_cpu_backend_isa(&becpu), getenv("POCL_MAX_PTHREAD_COUNT"));
    printf("opencl: %s (%s), CLBlast GEMM %s\n", info->device_name, info->platform_name,
           dsgd_cl_context_gemm_tuned(clc, 0) ? "with this device's tuned parameters" : "with its default parameters");

    /* warm-up: every pass once on each side, checked, and the calls per sample */
    for (l = 0; l < NLAYERS; ++l) {
        double ey, edw, edx;
        for (p = 0; p < NPASS; ++p)
            for (i = 0; i < 2; ++i) {
                side *s = i ? &cl[l] : &cpu[l];
                double one = sample(s, &L[l], p, 1);
                if (one < 0) return fail(ctx, pass_name[p]);
                inner[l][p][i] = calls_for(sample(s, &L[l], p, 1));
            }
        /* the last passes run were col2im of dcol: rerun both passes for the check */
        for (i = 0; i < 2; ++i) {
            side *s = i ? &cl[l] : &cpu[l];
            if (run_pass(s, &L[l], P_FWD) != DSGD_OK || run_pass(s, &L[l], P_BWD) != DSGD_OK) return fail(ctx, "check");
        }
        ey = compare(ctx, &cpu[l], &cl[l], cpu[l].y, cl[l].y, (size_t)L[l].m * L[l].oc, &bad);
        edw = compare(ctx, &cpu[l], &cl[l], cpu[l].dw, cl[l].dw, (size_t)L[l].k * L[l].oc, &bad);
        edx = compare(ctx, &cpu[l], &cl[l], cpu[l].dx, cl[l].dx, L[l].nx, &bad);
        printf("check %s: opencl vs cpu, max |diff| / max |cpu|: y %.2g, dW %.2g, dx %.2g\n", L[l].name, ey, edw,
               edx);
        if (!(ey <= 1e-4 && edw <= 1e-4 && edx <= 1e-4)) {
            fprintf(stderr, "conv: %s: OpenCL and CPU disagree\n", L[l].name);
            bad = 1;
        }
    }
    if (bad) return 1;

    for (r = 0; r < repeats; ++r) {
        for (l = 0; l < NLAYERS; ++l)
            for (p = 0; p < NPASS; ++p)
                for (i = 0; i < 2; ++i) {
                    t[l][p][i][r] = sample(i ? &cl[l] : &cpu[l], &L[l], p, inner[l][p][i]);
                    if (t[l][p][i][r] < 0) return fail(ctx, pass_name[p]);
                    pause_ms(20); /* one side's spinning threads stop before the other's run */
                }
        pause_ms(100);
    }

    printf("\n%-6s %-9s %12s %12s %10s %10s %9s\n", "layer", "pass", "cpu ms", "opencl ms", "cpu GF/s", "cl GF/s",
           "cl/cpu");
    for (l = 0; l < NLAYERS; ++l) {
        const double mnk = 2.0 * L[l].m * L[l].oc * L[l].k;
        for (p = 0; p < NPASS; ++p) {
            const double fl = p == P_FWD ? mnk : p == P_BWD ? 2.0 * mnk : 0.0;
            for (i = 0; i < 2; ++i) med[l][p][i] = bench_median(t[l][p][i], repeats);
            if (fl > 0)
                printf("%-6s %-9s %12.3f %12.3f %10.1f %10.1f %8.2fx\n", L[l].name, pass_name[p], 1e3 * med[l][p][0],
                       1e3 * med[l][p][1], fl / med[l][p][0] * 1e-9, fl / med[l][p][1] * 1e-9,
                       med[l][p][0] / med[l][p][1]);
            else
                printf("%-6s %-9s %12.3f %12.3f %10s %10s %8.2fx\n", L[l].name, pass_name[p], 1e3 * med[l][p][0],
                       1e3 * med[l][p][1], "-", "-", med[l][p][0] / med[l][p][1]);
        }
    }
    printf("(cl/cpu: the OpenCL backend's speed over the CPU backend's, at T=%d each; GF/s: the GEMMs' flops over "
           "the pass's time; medians of %d samples)\n\n",
           threads, repeats);
    for (l = 0; l < NLAYERS; ++l) {
        const double mnk = 2.0 * L[l].m * L[l].oc * L[l].k;
        printf("conv layer=%s threads=%d cpu_fwd_ms=%.4f cl_fwd_ms=%.4f cpu_bwd_ms=%.4f cl_bwd_ms=%.4f "
               "cpu_fwd_gflops=%.2f cl_fwd_gflops=%.2f cpu_bwd_gflops=%.2f cl_bwd_gflops=%.2f\n",
               L[l].name, threads, 1e3 * med[l][P_FWD][0], 1e3 * med[l][P_FWD][1], 1e3 * med[l][P_BWD][0],
               1e3 * med[l][P_BWD][1], mnk / med[l][P_FWD][0] * 1e-9, mnk / med[l][P_FWD][1] * 1e-9,
               2 * mnk / med[l][P_BWD][0] * 1e-9, 2 * mnk / med[l][P_BWD][1] * 1e-9);
    }
    for (l = 0; l < NLAYERS; ++l) {
        side_free(&cpu[l]);
        side_free(&cl[l]);
    }
    becl.destroy(becl.impl);
    becpu.destroy(becpu.impl);
    dsgd_cl_context_destroy(clc);
    dsgd_ctx_destroy(ctx);
    return 0;
}
