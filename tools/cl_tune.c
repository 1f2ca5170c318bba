/* tools/cl_tune.c - tunes CLBlast's single-precision GEMM for one OpenCL
   device and writes the winner to distsgd's per-device tuning cache, which
   dsgd_cl_context_create applies at start-up (see GEMM TUNING in
   distsgd/cl/context.h).

   The search, within a time budget:
     1. baseline: CLBlast's stock parameters as they are;
     2. screening: Xgemm (the "indirect" GEMM kernel) candidates from an
        ordered list, each in its own child process with every GEMM forced
        onto the indirect path: first register-tiled GEMMK=1 kernels made
        for the device's preferred float vector width (when it is 4 or more,
        as on CPUs: PoCL reports 16 with AVX-512), then a fixed list of
        GEMMK=1 kernels with float8 along M, then GEMMK=0 kernels, with and
        without local memory, which suit GPUs;
     3. finals: the best few candidates and the all-direct configuration
        (CLBlast's single-kernel GEMM, stock parameters) measured round-robin
        in one process, so that a noisy machine treats them alike; then the
        threshold XGEMM_MIN_INDIRECT_SIZE (GEMMs with m*n*k below its cube use
        the direct kernel) that minimises the summed time is chosen from the
        per-shape times;
     4. the winner once more, exactly as the backend will run it.
   Every run checks its results against a double-precision host product, at
   the tuning shapes and at three awkward ones (no size a multiple of any
   tile, in each transpose case a model uses); a candidate that computes a
   wrong value, fails, crashes or hangs is discarded. Candidates run in child
   processes (this program with --eval), so a crash in the driver or in
   CLBlast costs only that candidate. The screening stops when the budget is
   spent; the finals and the final check still run (about 10-30 s). On PoCL
   each new candidate compiles CLBlast's GEMM kernels (~7-10 s, then cached
   by PoCL in POCL_CACHE_DIR), which is what bounds the search.

   Timing: a sample is the mean time of back-to-back GEMMs of one shape
   (about 10 ms of them, one finish at the end), as in a training step;
   see gemm_measure in tools/cl_gemm_measure.h.

   Objective: the sum over the shapes of the median time of one GEMM, i.e.
   one training step's GEMM time when the shapes are a model's. Default
   shapes: the 784-512-512-10 MLP at batch 256 (mlp_gemm_shapes).

   Usage:
     cl_tune [--device SPEC] [--time SECONDS] [--repeats N] [--out PATH]
             [--shapes LIST] [--max-candidates N] [--dry-run]
       --device SPEC     as in distsgd_cl.h (default: $DSGD_CL_DEVICE, ...)
       --time SECONDS    screening budget (default 180)
       --repeats N       timed runs per shape and measurement (default 5)
       --out PATH        cache file or directory (default: where the backend
                         looks for this device)
       --shapes LIST     e.g. NN:256x512x784,TN:784x512x256,NT:256x784x512
       --mlp DIMS        the GEMMs of a dense model with these layer sizes,
                         e.g. 784,256,128,10 (the demo's), at --batch B
                         (default 256; a replica's batch); instead of --shapes
       --max-candidates  screen at most N candidates
       --dry-run         search and report, write nothing
   Build: make tools (build/tools/cl_tune). Run it by its path: it starts
   itself for every candidate. Example:
     POCL_MAX_PTHREAD_COUNT=2 build/tools/cl_tune --time 240
   Exit status: 0 when a file was written (or a dry run finished), 1 on
   error, 2 when nothing beat the stock parameters (nothing written). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"
#include "cl_gemm_measure.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SHAPES 32
#define MAX_CANDIDATES 64
#define MAX_FINALISTS 4
#define ROUNDS 5
#define ERR_TOL 1e-4 /* largest |C - ref| / sum_k |a||b| accepted (float dot products: ~k * 2^-24) */
#define ALL_DIRECT 100000

/* Awkward shapes every run must also get right. */
static const gemm_shape check_shapes[] = {
    {0, 0, 129, 257, 300}, {1, 0, 300, 129, 257}, {0, 1, 257, 300, 129}};
#define NCHECK ((int)(sizeof check_shapes / sizeof check_shapes[0]))

static void stderr_log(void *ud, dsgd_log_level level, const char *msg) {
    (void)ud;
    if (level <= DSGD_LOG_WARN) fprintf(stderr, "cl_tune: %s: %s\n", level == DSGD_LOG_ERROR ? "error" : "warning", msg);
}

static void format_shapes(const gemm_shape *s, int n, char *buf, size_t cap) {
    int i;
    size_t used = 0;
    buf[0] = '\0';
    for (i = 0; i < n && used < cap; ++i) {
        int w = snprintf(buf + used, cap - used, "%s%c%c:%dx%dx%d", i ? "," : "", s[i].trans_a ? 'T' : 'N',
                         s[i].trans_b ? 'T' : 'N', s[i].m, s[i].n, s[i].k);
        if (w < 0) break;
        used += (size_t)w;
    }
}

/* A candidate: Xgemm parameters (or stock) and a threshold (or stock). */
typedef struct cand {
    int xgemm_stock;
    size_t xgemm[DSGD_CL_XGEMM_NPARAMS];
    int threshold_stock;
    size_t threshold;
} cand;

/* "X/T": X is "stock" or 16 comma-separated values, T "stock" or a number. */
static int parse_cand(const char *s, cand *c) {
    int i;
    char *end;
    memset(c, 0, sizeof *c);
    if (!strncmp(s, "stock/", 6)) {
        c->xgemm_stock = 1;
        s += 6;
    } else {
        for (i = 0; i < DSGD_CL_XGEMM_NPARAMS; ++i) {
            unsigned long v = strtoul(s, &end, 10);
            if (end == s || v > 4096) return 0;
            c->xgemm[i] = (size_t)v;
            s = end;
            if (*s != (i < DSGD_CL_XGEMM_NPARAMS - 1 ? ',' : '/')) return 0;
            ++s;
        }
    }
    if (!strcmp(s, "stock")) {
        c->threshold_stock = 1;
        return 1;
    }
    c->threshold = (size_t)strtoul(s, &end, 10);
    return end != s && *end == '\0' && c->threshold <= ALL_DIRECT;
}

static void format_cand(const cand *c, char *buf, size_t cap) {
    size_t used = 0;
    int i;
    buf[0] = '\0';
    if (c->xgemm_stock) {
        used = (size_t)snprintf(buf, cap, "stock/");
    } else {
        for (i = 0; i < DSGD_CL_XGEMM_NPARAMS && used < cap; ++i)
            used += (size_t)snprintf(buf + used, cap - used, "%lu%c", (unsigned long)c->xgemm[i],
                                     i < DSGD_CL_XGEMM_NPARAMS - 1 ? ',' : '/');
    }
    if (used < cap) {
        if (c->threshold_stock) snprintf(buf + used, cap - used, "stock");
        else snprintf(buf + used, cap - used, "%lu", (unsigned long)c->threshold);
    }
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* ---------------------------------------------------------------- child */

/* --eval: for ROUNDS rounds (1 when there is one candidate), applies each
   candidate in turn and times the shapes; the first round also checks the
   results. Prints one line per candidate: "EVAL i ok MAXERR T1 .. Tn" (per
   shape, the median over rounds of the per-round medians) or "EVAL i fail
   MESSAGE". A stock candidate must come first (overrides cannot be undone). */
static int eval_main(int argc, char **argv) {
    const char *device = NULL, *shapes_s = NULL;
    int repeats = 5, i, n, nc = 0, rounds, r, c;
    gemm_shape shapes[MAX_SHAPES];
    cand cands[MAX_FINALISTS + 2];
    static double t[MAX_FINALISTS + 2][ROUNDS][MAX_SHAPES];
    double err[MAX_FINALISTS + 2], tmp[MAX_SHAPES], ctimes[NCHECK];
    dsgd_ctx *ctx;
    dsgd_cl_context *cl = NULL;
    dsgd_cl_context_desc cd;
    dsgd_backend_i be;
    for (i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--device")) device = argv[i + 1];
        else if (!strcmp(argv[i], "--shapes")) shapes_s = argv[i + 1];
        else if (!strcmp(argv[i], "--repeats")) repeats = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cand") && nc < MAX_FINALISTS + 2) {
            if (!parse_cand(argv[i + 1], &cands[nc++])) {
                printf("EVAL 0 fail bad candidate '%s'\n", argv[i + 1]);
                return 1;
            }
        }
    }
    n = shapes_s ? gemm_parse_shapes(shapes_s, shapes, MAX_SHAPES) : -1;
    if (n < 1 || repeats < 1 || nc < 1) {
        printf("EVAL 0 fail bad --eval arguments\n");
        return 1;
    }
    rounds = nc > 1 ? ROUNDS : 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    cd.tuning = DSGD_CL_TUNING_OFF;
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK || dsgd_cl_backend_create(ctx, cl, NULL, &be) != DSGD_OK) {
        printf("EVAL 0 fail %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    for (r = 0; r < rounds; ++r) {
        for (c = 0; c < nc; ++c) {
            dsgd_cl_gemm_params p;
            double e1 = 0, e2 = 0;
            memset(&p, 0, sizeof p);
            if (!cands[c].xgemm_stock) {
                p.xgemm_set = 1;
                memcpy(p.xgemm, cands[c].xgemm, sizeof p.xgemm);
            }
            if (!cands[c].threshold_stock) {
                p.min_indirect_set = 1;
                p.min_indirect = cands[c].threshold;
            }
            if (dsgd_cl_apply_gemm_params(ctx, cl, 0, &p) != DSGD_OK ||
                (r == 0 && gemm_measure(ctx, &be, check_shapes, NCHECK, 1, ctimes, &e1) != DSGD_OK) ||
                gemm_measure(ctx, &be, shapes, n, repeats, t[c][r], r == 0 ? &e2 : NULL) != DSGD_OK) {
                printf("EVAL %d fail %s\n", c, dsgd_ctx_last_error(ctx));
                return 1;
            }
            if (r == 0) err[c] = (e1 > e2 || e1 != e1) ? e1 : e2;
        }
    }
    for (c = 0; c < nc; ++c) {
        printf("EVAL %d ok %.3g", c, err[c]);
        for (i = 0; i < n; ++i) {
            for (r = 0; r < rounds; ++r) tmp[r] = t[c][r][i];
            qsort(tmp, (size_t)rounds, sizeof(double), cmp_double);
            printf(" %.9g", tmp[rounds / 2]);
        }
        printf("\n");
    }
    fflush(stdout);
    be.destroy(be.impl);
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    return 0;
}

/* ---------------------------------------------------------------- parent */

typedef struct result {
    int ok;
    double err;
    double t[MAX_SHAPES];
    double total;
    char why[256];
} result;

/* Runs this program with --eval for the candidates in one child (killed
   after timeout_s) and parses its lines into res[0 .. nc). */
static void run_child(const char *self, const char *device, const char *shapes_s, int nshapes, int repeats,
                      const cand *cands, int nc, double timeout_s, result *res) {
    int fds[2], status = 0, i, c;
    pid_t pid;
    char buf[16384], rep[16], cs[MAX_FINALISTS + 2][256], why[256];
    size_t used = 0;
    double t0 = dsgd_now();
    memset(res, 0, (size_t)nc * sizeof *res);
    why[0] = '\0';
    snprintf(rep, sizeof rep, "%d", repeats);
    for (c = 0; c < nc; ++c) format_cand(&cands[c], cs[c], sizeof cs[c]);
    if (pipe(fds) != 0) {
        snprintf(why, sizeof why, "pipe: %s", strerror(errno));
        goto fail;
    }
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        snprintf(why, sizeof why, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        goto fail;
    }
    if (pid == 0) {
        const char *args[12 + 2 * (MAX_FINALISTS + 2)];
        int k = 0;
        dup2(fds[1], 1);
        close(fds[0]);
        close(fds[1]);
        args[k++] = self;
        args[k++] = "--eval";
        if (device) {
            args[k++] = "--device";
            args[k++] = device;
        }
        args[k++] = "--shapes";
        args[k++] = shapes_s;
        args[k++] = "--repeats";
        args[k++] = rep;
        for (c = 0; c < nc; ++c) {
            args[k++] = "--cand";
            args[k++] = cs[c];
        }
        args[k] = NULL;
        execv(self, (char *const *)args);
        _exit(127);
    }
    close(fds[1]);
    for (;;) {
        fd_set set;
        struct timeval tv;
        double left = timeout_s - (dsgd_now() - t0);
        ssize_t got;
        if (left <= 0) {
            kill(pid, SIGKILL);
            snprintf(why, sizeof why, "timed out after %.0f s", timeout_s);
            break;
        }
        FD_ZERO(&set);
        FD_SET(fds[0], &set);
        tv.tv_sec = (long)left;
        tv.tv_usec = (long)((left - (double)(long)left) * 1e6);
        if (select(fds[0] + 1, &set, NULL, NULL, &tv) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (!FD_ISSET(fds[0], &set)) continue;
        if (used >= sizeof buf - 1) break;
        got = read(fds[0], buf + used, sizeof buf - 1 - used);
        if (got <= 0) break;
        used += (size_t)got;
    }
    buf[used] = '\0';
    close(fds[0]);
    waitpid(pid, &status, 0);
    if (!why[0] && WIFSIGNALED(status)) snprintf(why, sizeof why, "crashed (signal %d)", WTERMSIG(status));
    for (c = 0; c < nc; ++c) {
        char tag[32], *line;
        snprintf(tag, sizeof tag, "EVAL %d ", c);
        line = strstr(buf, tag);
        if (!line) {
            /* a failure line for an earlier candidate explains the rest */
            char *f = strstr(buf, "EVAL ");
            if (f && strstr(f, " fail ")) {
                char *nl = strchr(f, '\n');
                if (nl) *nl = '\0';
                snprintf(res[c].why, sizeof res[c].why, "%s", strstr(f, " fail ") + 6);
            } else {
                snprintf(res[c].why, sizeof res[c].why, "%s", why[0] ? why : "no result");
            }
            continue;
        }
        line += strlen(tag);
        if (strncmp(line, "ok ", 3) != 0) {
            char *nl = strchr(line, '\n');
            if (nl) *nl = '\0';
            snprintf(res[c].why, sizeof res[c].why, "%s", line + 5);
            continue;
        }
        line += 3;
        res[c].err = strtod(line, &line);
        for (i = 0; i < nshapes; ++i) {
            res[c].t[i] = strtod(line, &line);
            res[c].total += res[c].t[i];
        }
        if (!(res[c].err <= ERR_TOL)) {
            snprintf(res[c].why, sizeof res[c].why, "wrong results (max relative error %.3g)", res[c].err);
            continue;
        }
        res[c].ok = 1;
    }
    return;
fail:
    for (c = 0; c < nc; ++c) snprintf(res[c].why, sizeof res[c].why, "%s", why);
}

/* The ordered Xgemm candidates (GEMMK KREG KWG KWI MDIMA MDIMC MWG NDIMB NDIMC
   NWG SA SB STRM STRN VWM VWN), validity-checked and fitted to the device's
   limits (dsgd_cl_gemm_params_fit, as screened: everything indirect). The
   first ones are made for the device's preferred float vector width w
   (info->vector_width, 16 on PoCL with AVX-512):
   when w >= 4, register-tiled GEMMK=1 kernels whose work-item keeps a
   16x16 or 32x32 tile of C and updates it with one w-wide vector of A and
   w scalars of B per k (an outer product, as CPU BLAS micro-kernels do);
   measured on PoCL (AVX-512, 2 threads) the 16x16-tile one ran the MLP's
   GEMMs at 1.2-1.4x OpenBLAS on one thread, where the best of the fixed
   list below reached 0.6-0.9x. Small tiles also divide more model sizes
   (784 = 49 x 16), so CLBlast pads less. */
static int make_candidates(cand *out, int cap, const dsgd_cl_device_info *info) {
    static const size_t wide[][DSGD_CL_XGEMM_NPARAMS] = {
        /* VWM is replaced by the device's width */
        {1, 1, 1, 1, 1, 1, 16, 1, 1, 16, 0, 0, 0, 0, 0, 1},
        {1, 1, 1, 1, 2, 2, 32, 2, 2, 32, 0, 0, 0, 0, 0, 1},
        {1, 1, 1, 1, 4, 4, 64, 4, 4, 64, 0, 0, 0, 0, 0, 1},
        {1, 2, 1, 1, 1, 1, 16, 1, 1, 16, 0, 0, 0, 0, 0, 1},
        {1, 1, 1, 1, 1, 1, 32, 1, 1, 32, 0, 0, 0, 0, 0, 1},
        {1, 1, 1, 1, 8, 8, 128, 8, 8, 128, 0, 0, 0, 0, 0, 1},
        {1, 8, 1, 1, 2, 2, 64, 2, 2, 64, 0, 0, 0, 0, 0, 8},
    };
    static const size_t seeds[][DSGD_CL_XGEMM_NPARAMS] = {
        /* GEMMK=1, few work-items per group, float8 along M: a work-item
           computes a 16x4 .. 16x16 tile (square work-group tiles: see
           dsgd_cl_gemm_params_valid) */
        {1, 1, 1, 1, 1, 1, 16, 4, 4, 16, 0, 0, 0, 0, 8, 1},
        {1, 4, 1, 1, 1, 1, 16, 4, 4, 16, 0, 0, 0, 0, 8, 4},
        {1, 2, 1, 1, 1, 1, 16, 4, 4, 16, 0, 0, 0, 0, 8, 2},
        {1, 8, 1, 1, 1, 1, 16, 4, 4, 16, 0, 0, 0, 0, 8, 4},
        {1, 1, 1, 1, 2, 2, 16, 2, 2, 16, 0, 0, 0, 0, 8, 1},
        {1, 4, 1, 1, 2, 2, 32, 8, 8, 32, 0, 0, 0, 0, 8, 4},
        {1, 8, 1, 1, 1, 1, 16, 2, 2, 16, 0, 0, 0, 0, 8, 8},
        {1, 8, 1, 1, 2, 2, 16, 2, 2, 16, 0, 0, 0, 0, 8, 8},
        {1, 8, 1, 1, 2, 2, 32, 4, 4, 32, 0, 0, 0, 0, 8, 8},
        {1, 8, 1, 1, 1, 1, 16, 1, 1, 16, 0, 0, 0, 0, 8, 8},
        {1, 8, 1, 1, 2, 2, 32, 8, 8, 32, 0, 0, 0, 0, 8, 4},
        {1, 4, 1, 1, 1, 1, 32, 8, 8, 32, 0, 0, 0, 0, 8, 4},
        {1, 8, 1, 1, 4, 4, 32, 4, 4, 32, 0, 0, 0, 0, 8, 8},
        {1, 4, 1, 1, 2, 2, 16, 4, 4, 16, 0, 0, 0, 0, 8, 4},
        {1, 4, 1, 1, 4, 4, 32, 4, 4, 32, 0, 0, 0, 0, 4, 4},
        {1, 2, 1, 1, 8, 8, 32, 8, 8, 32, 0, 0, 0, 0, 2, 2},
        /* GEMMK=0 without local memory */
        {0, 1, 16, 2, 1, 1, 32, 1, 1, 8, 0, 0, 0, 0, 8, 4},
        {0, 1, 32, 2, 8, 8, 64, 8, 8, 64, 0, 0, 0, 0, 4, 4},
        /* GEMMK=0 with local memory, GPU-style (CLBlast's own tuner's space) */
        {0, 1, 32, 2, 16, 16, 64, 16, 16, 64, 1, 1, 0, 0, 2, 2},
        {0, 1, 16, 2, 8, 8, 64, 8, 8, 64, 1, 1, 0, 0, 4, 4},
        {0, 1, 32, 2, 16, 8, 64, 16, 8, 64, 1, 1, 1, 1, 2, 4},
        {0, 1, 32, 2, 32, 16, 128, 32, 16, 128, 1, 1, 0, 0, 4, 4},
        {0, 1, 16, 2, 8, 16, 128, 8, 16, 128, 1, 1, 1, 0, 8, 4},
        {0, 1, 32, 2, 16, 16, 32, 16, 16, 32, 1, 1, 0, 0, 1, 1},
    };
    int n = 0, i, nw = (int)(sizeof wide / sizeof wide[0]), total = nw + (int)(sizeof seeds / sizeof seeds[0]);
    unsigned w = info->vector_width;
    size_t vw = w >= 16 ? 16 : w >= 8 ? 8 : w >= 4 ? 4 : 0;
    for (i = 0; i < total && n < cap; ++i) {
        dsgd_cl_gemm_params p;
        int j, dup = 0;
        memset(&p, 0, sizeof p);
        p.xgemm_set = 1;
        if (i < nw) {
            if (!vw) continue;
            memcpy(p.xgemm, wide[i], sizeof p.xgemm);
            p.xgemm[14] = vw;
        } else {
            memcpy(p.xgemm, seeds[i - nw], sizeof p.xgemm);
        }
        if (!dsgd_cl_gemm_params_valid(&p)) continue;
        p.min_indirect_set = 1; /* as screened: everything indirect */
        p.min_indirect = 1;
        if (!dsgd_cl_gemm_params_fit(&p, info, NULL, 0)) continue; /* the device's work-group or local memory limits */
        for (j = 0; j < n; ++j) dup |= !memcmp(out[j].xgemm, p.xgemm, sizeof p.xgemm);
        if (dup) continue;
        memset(&out[n], 0, sizeof out[n]);
        memcpy(out[n].xgemm, p.xgemm, sizeof p.xgemm);
        out[n].threshold = 1; /* screening: everything indirect */
        ++n;
    }
    return n;
}

static double gflops(const gemm_shape *s, int n, const double *t) {
    double flop = 0, sec = 0;
    int i;
    for (i = 0; i < n; ++i) {
        flop += 2.0 * s[i].m * s[i].n * s[i].k;
        sec += t[i];
    }
    return sec > 0 ? flop / sec * 1e-9 : 0;
}

/* The threshold t minimising the sum over shapes of (mnk < t^3 ? direct : indirect). */
static size_t best_threshold(const gemm_shape *s, int n, const double *direct, const double *indirect,
                             double *total_out) {
    size_t cand_t[MAX_SHAPES + 1], best_t = 1;
    double best = 1e300;
    int i, c, nc = 0;
    cand_t[nc++] = 1;
    for (i = 0; i < n; ++i) cand_t[nc++] = (size_t)floor(cbrt((double)s[i].m * s[i].n * s[i].k)) + 1;
    for (c = 0; c < nc; ++c) {
        double tot = 0, t3 = (double)cand_t[c] * cand_t[c] * cand_t[c];
        for (i = 0; i < n; ++i) tot += ((double)s[i].m * s[i].n * s[i].k < t3) ? direct[i] : indirect[i];
        if (tot < best * (1 - 1e-9) || (tot <= best * (1 + 1e-9) && cand_t[c] < best_t)) {
            best = tot;
            best_t = cand_t[c];
        }
    }
    *total_out = best;
    return best_t;
}

static void print_row(const char *label, const gemm_shape *s, int ns, const result *r) {
    if (r->ok)
        printf("%-46s %8.2f ms %7.1f GFLOP/s\n", label, r->total * 1e3, gflops(s, ns, r->t));
    else
        printf("%-46s discarded: %s\n", label, r->why);
    fflush(stdout);
}

static void usage(void) {
    fprintf(stderr, "usage: cl_tune [--device SPEC] [--time SECONDS] [--repeats N] [--out PATH]\n"
                    "               [--shapes NN:256x512x784,... | --mlp 784,256,128,10 [--batch B]]\n"
                    "               [--max-candidates N] [--dry-run]\n");
}

int main(int argc, char **argv) {
    const char *device = NULL, *out = NULL, *shapes_arg = NULL, *mlp_arg = NULL, *self = argv[0];
    double budget = 180, start = dsgd_now();
    int repeats = 5, dry = 0, maxc = MAX_CANDIDATES, ns, nc, i, c, nf = 0, best_f = -1, batch = 256;
    gemm_shape shapes[MAX_SHAPES];
    char shapes_s[2048], path[1100], label[256], note[3072];
    cand cands[MAX_CANDIDATES], fin_c[MAX_FINALISTS + 1], win, stock_c;
    static result screen[MAX_CANDIDATES];
    result stock, fin_r[MAX_FINALISTS + 1], final_r;
    size_t best_t = 1;
    double best_total = 1e300;
    dsgd_ctx *ctx;
    dsgd_ctx_desc cdsc;
    dsgd_cl_context *cl = NULL;
    dsgd_cl_context_desc cd;
    const dsgd_cl_device_info *info;

    if (argc > 1 && !strcmp(argv[1], "--eval")) return eval_main(argc, argv);
    for (i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--dry-run")) {
            dry = 1;
            continue;
        }
        if (!v) {
            usage();
            return 1;
        }
        if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--time")) budget = atof(v);
        else if (!strcmp(a, "--repeats")) repeats = atoi(v);
        else if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--shapes")) shapes_arg = v;
        else if (!strcmp(a, "--mlp")) mlp_arg = v;
        else if (!strcmp(a, "--batch")) batch = atoi(v);
        else if (!strcmp(a, "--max-candidates")) maxc = atoi(v);
        else {
            usage();
            return 1;
        }
        ++i;
    }
    if (!(budget > 0) || repeats < 1 || repeats > 1000 || maxc < 1) {
        usage();
        return 1;
    }
    if (mlp_arg) {
        int dims[MAX_SHAPES], nd = 0;
        const char *p = mlp_arg;
        char *end;
        while (*p && nd < MAX_SHAPES) {
            long d = strtol(p, &end, 10);
            if (end == p || d < 1 || d > 65536 || (*end && *end != ',')) break;
            dims[nd++] = (int)d;
            p = *end ? end + 1 : end;
        }
        ns = *p || shapes_arg ? -1 : gemm_mlp_shapes(dims, nd, batch, shapes, MAX_SHAPES);
        if (ns < 1 || ns > MAX_SHAPES || batch > 65536) {
            fprintf(stderr, "cl_tune: bad --mlp '%s' or --batch %d (want e.g. --mlp 784,256,128,10 --batch 64, "
                            "at most %d layers, not with --shapes)\n", mlp_arg, batch, MAX_SHAPES / 3);
            return 1;
        }
    } else if (shapes_arg) {
        ns = gemm_parse_shapes(shapes_arg, shapes, MAX_SHAPES);
        if (ns < 1) {
            fprintf(stderr, "cl_tune: bad --shapes '%s' (want e.g. NN:256x512x784,TN:784x512x256)\n", shapes_arg);
            return 1;
        }
    } else {
        ns = mlp_gemm_shapes(shapes, MAX_SHAPES);
    }
    format_shapes(shapes, ns, shapes_s, sizeof shapes_s);
    if (strchr(self, '/') == NULL) {
        fprintf(stderr, "cl_tune: run it by a path (e.g. build/tools/cl_tune): it starts itself per candidate\n");
        return 1;
    }

    memset(&cdsc, 0, sizeof cdsc);
    cdsc.logger.func = stderr_log;
    if (dsgd_ctx_create(&cdsc, &ctx) != DSGD_OK) return 1;
    memset(&cd, 0, sizeof cd);
    cd.device = device;
    cd.tuning = DSGD_CL_TUNING_OFF;
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK) {
        fprintf(stderr, "cl_tune: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    info = dsgd_cl_context_device_info(cl, 0);
    if (dsgd_cl_tune_cache_path(cl, 0, out, path, sizeof path) != DSGD_OK) {
        fprintf(stderr, "cl_tune: no cache location (give --out, or set DSGD_CL_TUNE_CACHE or HOME)\n");
        return 1;
    }
    printf("device:   %s (%s, driver %s)\n", info->device_name, info->platform_name, info->driver_version);
    printf("shapes:   %s\n", shapes_s);
    printf("budget:   %.0f s screening, %d timed runs per shape; POCL_MAX_PTHREAD_COUNT=%s\n", budget, repeats,
           getenv("POCL_MAX_PTHREAD_COUNT") ? getenv("POCL_MAX_PTHREAD_COUNT") : "(unset)");
    printf("cache:    %s%s\n\n", path, dry ? " (dry run: not written)" : "");

    /* 1. the baseline */
    memset(&stock_c, 0, sizeof stock_c);
    stock_c.xgemm_stock = stock_c.threshold_stock = 1;
    run_child(self, device, shapes_s, ns, repeats, &stock_c, 1, 900, &stock);
    print_row("stock", shapes, ns, &stock);
    if (!stock.ok) return 1;

    /* 2. screening, one child per candidate, everything indirect */
    nc = make_candidates(cands, MAX_CANDIDATES, info);
    if (nc > maxc) nc = maxc;
    for (c = 0; c < nc; ++c) {
        double left = budget - (dsgd_now() - start);
        if (left < 10) {
            printf("screening budget spent: %d of %d candidates tried\n", c, nc);
            nc = c;
            break;
        }
        run_child(self, device, shapes_s, ns, repeats, &cands[c], 1, left < 120 ? 120 : left, &screen[c]);
        format_cand(&cands[c], label, sizeof label);
        print_row(label, shapes, ns, &screen[c]);
    }

    /* 3. finals: the all-direct configuration (stock XgemmDirect; its Xgemm
       values, unused, are the first finalist's, so that switching between
       rounds needs no new compile), then the best screened candidates,
       round-robin in one process */
    nf = 1;
    for (i = 0; i < MAX_FINALISTS; ++i) {
        int pick = -1;
        for (c = 0; c < nc; ++c) {
            int taken = 0, j;
            if (!screen[c].ok) continue;
            for (j = 1; j < nf; ++j) taken |= !memcmp(fin_c[j].xgemm, cands[c].xgemm, sizeof cands[c].xgemm);
            if (!taken && (pick < 0 || screen[c].total < screen[pick].total)) pick = c;
        }
        if (pick < 0) break;
        fin_c[nf++] = cands[pick];
    }
    if (nf == 1) {
        printf("\nno candidate worked; CLBlast's defaults stay\n");
        return 2;
    }
    fin_c[0] = fin_c[1];
    fin_c[0].threshold = ALL_DIRECT;
    printf("\nfinals (%d rounds, round-robin in one process):\n", ROUNDS);
    run_child(self, device, shapes_s, ns, repeats, fin_c, nf, 900, fin_r);
    print_row("all GEMMs direct (stock XgemmDirect)", shapes, ns, &fin_r[0]);
    for (i = 1; i < nf; ++i) {
        double tot;
        size_t t;
        format_cand(&fin_c[i], label, sizeof label);
        print_row(label, shapes, ns, &fin_r[i]);
        if (!fin_r[i].ok) continue;
        t = best_threshold(shapes, ns, fin_r[0].ok ? fin_r[0].t : fin_r[i].t, fin_r[i].t, &tot);
        printf("%-46s %8.2f ms with XGEMM_MIN_INDIRECT_SIZE %lu\n", "", tot * 1e3, (unsigned long)t);
        if (tot < best_total) {
            best_total = tot;
            best_f = i;
            best_t = t;
        }
    }
    if (best_f < 0) {
        printf("\nno finalist worked; CLBlast's defaults stay\n");
        return 2;
    }

    /* 4. the winner as the backend will run it */
    win = fin_c[best_f];
    win.threshold = best_t;
    format_cand(&win, label, sizeof label);
    run_child(self, device, shapes_s, ns, repeats, &win, 1, 900, &final_r);
    printf("\nwinner: %s (Xgemm parameters / XGEMM_MIN_INDIRECT_SIZE)\n", label);
    if (!final_r.ok) {
        printf("the final check failed: %s; nothing written\n", final_r.why);
        return 1;
    }
    printf("%-22s %12s %12s %10s %8s\n", "shape", "stock GF/s", "tuned GF/s", "tuned ms", "speedup");
    for (i = 0; i < ns; ++i) {
        char nm[64];
        double fl = 2.0 * shapes[i].m * shapes[i].n * shapes[i].k;
        snprintf(nm, sizeof nm, "%c%c %dx%dx%d", shapes[i].trans_a ? 'T' : 'N', shapes[i].trans_b ? 'T' : 'N',
                 shapes[i].m, shapes[i].n, shapes[i].k);
        printf("%-22s %12.1f %12.1f %10.3f %8.2f\n", nm, fl / stock.t[i] * 1e-9, fl / final_r.t[i] * 1e-9,
               final_r.t[i] * 1e3, stock.t[i] / final_r.t[i]);
    }
    printf("%-22s %12.1f %12.1f %10.3f %8.2f\n", "all (sum of times)", gflops(shapes, ns, stock.t),
           gflops(shapes, ns, final_r.t), final_r.total * 1e3, stock.total / final_r.total);
    printf("search took %.0f s\n", dsgd_now() - start);
    if (final_r.total >= stock.total) {
        printf("the stock parameters are as fast: nothing written\n");
        return 2;
    }
    if (!dry) {
        dsgd_cl_gemm_params p;
        memset(&p, 0, sizeof p);
        p.xgemm_set = 1;
        memcpy(p.xgemm, win.xgemm, sizeof p.xgemm);
        p.min_indirect_set = 1;
        p.min_indirect = best_t;
        snprintf(note, sizeof note, "shapes %s: %.1f GFLOP/s tuned, %.1f stock (sum of median times)", shapes_s,
                 gflops(shapes, ns, final_r.t), gflops(shapes, ns, stock.t));
        if (dsgd_cl_save_gemm_params(ctx, cl, 0, path, &p, note) != DSGD_OK) {
            fprintf(stderr, "cl_tune: %s\n", dsgd_ctx_last_error(ctx));
            return 1;
        }
        printf("wrote %s\n", path);
    }
    dsgd_cl_context_destroy(cl);
    dsgd_ctx_destroy(ctx);
    return 0;
}
