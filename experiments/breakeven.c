/* breakeven.c - below which link bandwidth does gradient compression pay?
   On the simulated cluster (distsgd/simnet.h): mirrored training of the
   784-512-512-10 MLP, N replicas of 64 samples, ring all-reduce, the
   gradient in one bucket; for each compressor (fp16, bf16, top-k 1%,
   sign, PowerSGD rank 1, 2, 4, error feedback on) the bandwidth below
   which its step is shorter than fp32's in virtual time, found by regula
   falsi on simnet runs (experiments/breakeven.h says how).

   Inputs (defaults in brackets):
     --alpha S      a message's latency [50e-6: the other experiments' fast network]
     --compute-s S  a step's compute [0.010: 6 x 64 x 669,706 = 257 MFLOP at
                    about 25 GFLOP/s]; without overlap it cancels out of the
                    break-even and sets only the ratios
     --gamma S      a float reduced [1e-10]
     --codec-s S    the codec's charge per float, for every compressor
                    [simnet's DSGD_SIMNET_DEFAULT_CODEC_S, 0.25 ns: F16C's
                    conversion]: "charged" in the table
     --codec measured   instead, each compressor's real seconds per replica
                    and step on this machine (compress_s of dsgd_comm_stats
                    over 4 steps of a 2-replica run with 64 real samples
                    each), priced into its charged floats: "measured"
     --codec-step-s NAME=S[,NAME=S...]   the same with seconds you measured
                    (names as in the table)
     --workers N    only N [2 and 8]
     --jobs J       methods searched at a time [2]; the output does not
                    depend on it (fp32's runs are shared: be_desc.cache)
   Prints the table, writes breakeven.csv to --out [build/sim]. --smoke: N
   = 2, fp16, top-k and PowerSGD r2 only (the build's checks: the same
   output every run). Charged
   costs give the same bytes every run; measured ones are this machine's.

   Run:  make sim    (with the other experiments)
   or:   ./build/experiments/breakeven [--out DIR] [--alpha S] [--compute-s S]
           [--gamma S] [--codec-s S] [--codec measured] [--codec-step-s LIST]
           [--workers N] [--jobs J] [--smoke] */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "breakeven.h"

#include <errno.h>
#include <pthread.h>
#include <sys/stat.h>

#define USAGE                                                                                                          \
    "[--out DIR] [--alpha S] [--compute-s S] [--gamma S] [--codec-s S] [--codec measured] "                            \
    "[--codec-step-s NAME=S,...] [--workers N] [--jobs J] [--smoke]"

/* Parses NAME=S[,NAME=S...] into d->codec_step_s; 0, or -1. */
static int parse_step_s(const char *list, be_desc *d) {
    char buf[512], *tok, *save = NULL;
    snprintf(buf, sizeof(buf), "%s", list);
    for (tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        int m;
        if (!eq) return -1;
        *eq = '\0';
        if ((m = be_method_index(tok)) < 0 || !BE_METHOD[m].hook) return -1;
        d->codec_step_s[m] = atof(eq + 1);
        if (!(d->codec_step_s[m] >= 0)) return -1;
    }
    return 0;
}

/* One method's row at one N: what a thread of run_methods fills. */
typedef struct method_job {
    const be_desc *d;
    const double *bw; /* the two bandwidths of the ratios */
    int m, rc;
    be_result r;
    be_run base, x[2];
} method_job;

typedef struct method_pool {
    method_job *j;
    int n, next;
    pthread_mutex_t mu;
} method_pool;

static void *method_thread(void *arg) {
    method_pool *q = (method_pool *)arg;
    for (;;) {
        method_job *j;
        int i, k;
        pthread_mutex_lock(&q->mu);
        i = q->next < q->n ? q->next++ : -1;
        pthread_mutex_unlock(&q->mu);
        if (i < 0) return NULL;
        j = &q->j[i];
        j->rc = be_breakeven(j->d, j->m, &j->r) != 0 || be_simulate(j->d, 0, 0.0, DSGD_SIMNET_FREE, 3, &j->base) != 0;
        for (k = 0; k < 2 && !j->rc; ++k)
            j->rc = be_simulate(j->d, j->m, 1.0 / j->bw[k], j->r.gamma_c, 3, &j->x[k]) != 0;
    }
}

/* The n methods' rows, on up to `threads` threads (the caller's among
   them): each row is a function of d and its method, and the cache is
   frozen meanwhile (filled before with fp32's common runs). */
static void run_methods(method_job *js, int n, int threads) {
    pthread_t th[8];
    method_pool q;
    int i, started = 0;
    q.j = js;
    q.n = n;
    q.next = 0;
    pthread_mutex_init(&q.mu, NULL);
    for (i = 1; i < threads && i < n && started < 8; ++i)
        if (pthread_create(&th[started], NULL, method_thread, &q) == 0) ++started;
    method_thread(&q);
    for (i = 0; i < started; ++i) pthread_join(th[i], NULL);
    pthread_mutex_destroy(&q.mu);
}

/* Each compressor's real seconds per replica and step here. */
static int measure_codecs(const be_desc *d, be_desc *out) {
    be_desc z = *d;
    int m;
    z.workers = 2;
    z.real_batch = 64;
    for (m = 1; m < BE_METHODS; ++m) {
        be_run r;
        if (out->codec_step_s[m] >= 0) continue; /* given */
        if (be_simulate(&z, m, 1e-10, DSGD_SIMNET_FREE, 4, &r) != 0) return -1;
        out->codec_step_s[m] = r.compress_s;
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *out = "build/sim";
    int a, m, w, smoke = 0, measured = 0, only = 0, failed = 0, nw, njobs = 2;
    int workers[2] = {2, 8};
    be_desc d;
    static be_cache cache;
    char path[1024], buf[64];
    FILE *csv;
    double t0 = dsgd_now();
    memset(&d, 0, sizeof(d));
    d.alpha_s = 50e-6;
    d.compute_s = 0.010;
    d.gamma_s_per_float = 1e-10;
    for (m = 0; m < BE_METHODS; ++m) d.codec_step_s[m] = -1;
    d.cache = &cache;
    for (a = 1; a < argc; ++a) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(argv[a], "--out") && v) out = argv[++a];
        else if (!strcmp(argv[a], "--alpha") && v) d.alpha_s = atof(argv[++a]);
        else if (!strcmp(argv[a], "--compute-s") && v) d.compute_s = atof(argv[++a]);
        else if (!strcmp(argv[a], "--gamma") && v) d.gamma_s_per_float = atof(argv[++a]);
        else if (!strcmp(argv[a], "--codec-s") && v) d.codec_s_per_float = atof(argv[++a]);
        else if (!strcmp(argv[a], "--codec") && v && !strcmp(v, "measured")) measured = 1, ++a;
        else if (!strcmp(argv[a], "--codec-step-s") && v) {
            if (parse_step_s(argv[++a], &d) != 0) {
                fprintf(stderr, "--codec-step-s: NAME=SECONDS,... with NAME one of fp16 bf16 topk1%% sign "
                                "powersgd1 powersgd2 powersgd4\n");
                return 2;
            }
        } else if (!strcmp(argv[a], "--workers") && v) only = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--jobs") && v) njobs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--smoke")) smoke = 1;
        else {
            fprintf(stderr, "usage: %s %s\n", argv[0], USAGE);
            return 2;
        }
    }
    if (!(d.alpha_s >= 0) || !(d.compute_s >= 0) || !(d.gamma_s_per_float >= 0) || !(d.codec_s_per_float >= 0) ||
        (only && (only < 2 || only > 64)) || njobs < 1 || njobs > 8) {
        fprintf(stderr, "--alpha, --compute-s, --gamma, --codec-s: >= 0; --workers: 2..64; --jobs: 1..8\n");
        return 2;
    }
    nw = 2;
    if (only) workers[0] = only, nw = 1;
    if (smoke) nw = 1;
    if (measured && measure_codecs(&d, &d) != 0) return 1;
    if (mkdir(out, 0777) != 0 && errno != EEXIST) {
        fprintf(stderr, "error: cannot create %s\n", out);
        return 1;
    }
    snprintf(path, sizeof(path), "%s/breakeven.csv", out);
    if (!(csv = fopen(path, "w"))) {
        fprintf(stderr, "error: cannot write %s\n", path);
        return 1;
    }
    fprintf(csv, "workers,method,bytes_per_replica_step,codec,codec_floats,codec_s_per_float,codec_s_per_step,"
                 "overhead_s,breakeven_bytes_per_s,ratio_1gbit,ratio_10gbit,alpha_s,compute_s,gamma_s\n");
    printf("break-even bandwidth of gradient compression (simnet): MLP 784-512-512-10, 64 samples a replica, ring\n"
           "alpha %.3g s, compute %.3g s a step, gamma %.3g s a float; codec: ",
           d.alpha_s, d.compute_s, d.gamma_s_per_float);
    if (measured) printf("measured here (compress_s per replica and step)\n");
    else printf("charged, %.3g s a float (unless --codec-step-s)\n",
                d.codec_s_per_float > 0 ? d.codec_s_per_float : DSGD_SIMNET_DEFAULT_CODEC_S);
    for (w = 0; w < nw && !failed; ++w) {
        double fp32[2];
        const double bw[2] = {1.25e8, 1.25e9}; /* 1 and 10 Gbit/s */
        int k;
        d.workers = workers[w];
        for (k = 0; k < 2; ++k) {
            be_run r;
            if (be_simulate(&d, 0, 1.0 / bw[k], DSGD_SIMNET_FREE, 3, &r) != 0) return 1;
            fp32[k] = r.step_s;
        }
        printf("\nN = %d workers (fp32 step: %.4g ms at 1 Gbit/s, %.4g ms at 10 Gbit/s)\n", d.workers, 1e3 * fp32[0],
               1e3 * fp32[1]);
        printf("%-10s %12s %8s %9s %11s %11s %20s %9s %9s\n", "method", "bytes/step", "fewer", "codec", "codec ms",
               "extra ms", "break-even", "x@1Gb", "x@10Gb");
        {
            method_job js[BE_METHODS];
            be_run common;
            int nj = 0, i;
            /* fp32 where every method's search starts (0, its ends), then
               the methods' rows over the threads, printed in order */
            if (be_simulate(&d, 0, 0.0, DSGD_SIMNET_FREE, 3, &common) != 0 ||
                be_simulate(&d, 0, BE_BETA_LO, DSGD_SIMNET_FREE, 3, &common) != 0 ||
                be_simulate(&d, 0, BE_BETA_HI, DSGD_SIMNET_FREE, 3, &common) != 0)
                return 1;
            for (m = 1; m < BE_METHODS; ++m) {
                if (smoke && m != 1 && m != 3 && m != 6) continue; /* fp16, top-k, PowerSGD r2 */
                memset(&js[nj], 0, sizeof(js[nj]));
                js[nj].d = &d;
                js[nj].bw = bw;
                js[nj].m = m;
                ++nj;
            }
            cache.frozen = 1;
            run_methods(js, nj, njobs);
            cache.frozen = 0;
            for (i = 0; i < nj; ++i) {
                const be_result *r = &js[i].r;
                double ratio[2], fewer;
                m = js[i].m;
                if (js[i].rc != 0) {
                    failed = 1;
                    break;
                }
                for (k = 0; k < 2; ++k) ratio[k] = js[i].x[k].step_s / fp32[k];
                fewer = js[i].base.bytes_sent / r->bytes_sent;
                printf("%-10s %12.0f %7.1fx %9s %11.3f %11.3f %20s %9.3f %9.3f\n", BE_METHOD[m].name, r->bytes_sent,
                       fewer, d.codec_step_s[m] >= 0 ? "measured" : "charged", 1e3 * r->codec_s, 1e3 * r->overhead_s,
                       be_format(r->beta, buf, sizeof(buf)), ratio[0], ratio[1]);
                fprintf(csv, "%d,%s,%.0f,%s,%.0f,%.6g,%.6g,%.6g,%.6g,%.6f,%.6f,%.6g,%.6g,%.6g\n", d.workers,
                        BE_METHOD[m].name, r->bytes_sent, d.codec_step_s[m] >= 0 ? "measured" : "charged", r->floats,
                        r->gamma_c > 0 ? r->gamma_c : 0.0, r->codec_s, r->overhead_s,
                        r->beta == 0 ? 0.0 : isinf(r->beta) ? -1.0 : 1.0 / r->beta, ratio[0], ratio[1], d.alpha_s,
                        d.compute_s, d.gamma_s_per_float);
                fflush(stdout);
            }
        }
    }
    fclose(csv);
    if (failed) return 1;
    printf("\nbreak-even: the bandwidth below which the compressed step is shorter than fp32's; extra: its\n"
           "step minus fp32's at infinite bandwidth (codec and latency); x@: its step over fp32's.\nwrote %s\n",
           path);
    if (!smoke) fprintf(stderr, "%.1f s\n", dsgd_now() - t0);
    return 0;
}
