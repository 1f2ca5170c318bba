/* crossover.c - when does synchronous training beat asynchronous? A sweep
   on the simulated cluster (distsgd/simnet.h) over the update policy, the
   number of workers P, the stragglers' severity and the network, with
   several seeds per point and each policy's learning rate tuned by a small
   grid on seeds of its own.

   The task is the one where staleness costs accuracy: the digits MLP
   (64-64-10, 8 samples per worker and gradient) trained to 92% test
   accuracy, a target async reaches late when P workers make each gradient
   P - 1 updates stale. Policies (parameter-server engine, one server):
     sync b    BACKUP with P = N + b: a step applies the first N gradients
               (b = 0: plain synchronous), late workers finishing their stale
               gradient first (TF's SyncReplicasOptimizer)
     cancel b  the same, late workers abandoning it and restarting at once
               (dsgd_ps_desc.backup_cancel)
     async     every gradient applied on arrival
     ssp 4     stale synchronous parallel, bound 4
   Compute per worker and step: 10 ms + Exp(mean m), m = 2.5 ms (light),
   10 ms (heavy), or 1 ms with 5% of steps 4x slower (tail: a tight
   distribution with a few stragglers in every step, as on a shared
   cluster). Networks:
   fast (alpha 50 us, 10 GB/s) and slow (alpha 1 ms, 100 MB/s; the server
   sends its 19 KB of weights to each worker through one NIC).

   Learning rates: sync and cancel use SGD with momentum 0.9 at
   lr = g x 0.1 x N / 16 (the linear scaling rule), g from {0.5, 1, 2};
   async and SSP plain SGD at lr = g x 0.05, g from {2, 1, 1/2, 1/4, 1/8};
   the best g chosen by the mean time to target over the tuning seeds
   (100 + k), then measured on the evaluation seeds (1..K). A run that
   does not reach the target by 3000 updates (async: 10 virtual seconds,
   10 to 40 times what sync takes here) counts as not reached; a point is
   reported only where every evaluation seed reached it. Means come with
   95% confidence intervals (Student's t over the seeds).

   Writes, in --out (default build/sim):
     crossover_runs.csv     every evaluation run: net,severity,P,policy,k,
                            lr,seed,time_to_target,updates,reached
     crossover_summary.csv  every point: its tuned lr, mean, CI, seeds
     crossover_table.md     "when sync beats async", one row per network,
                            severity and P
     crossover_backups.png  time to target against b at P = 100, both
                            protocols, with error bars (gnuplot)
     crossover_p.png        time to target against P, best sync and async
     crossover_cdf.png      the step-time CDF at P = 100, b = 0 and b = 4
   The same seeds give the same bytes, whatever --jobs. Every point's runs
   go together over --jobs threads (default 2), the larger P first, grid
   value by grid value, the likeliest best first; a tuning run stops as
   soon as it can no longer beat its point's best mean so far (which
   leaves the choice as it would be), and a run stops at its target,
   computing no further (an SSP run stops its workers at one clock):
   1,735 runs in about 2 CPU minutes (8.3 before).

   Run:  make sim      (with the other experiments)
   or:   ./build/experiments/crossover [--data PATH] [--out DIR] [--seeds K]
                                      [--tune-seeds K] [--jobs J] [--quick]
                                      [--smoke]
   --quick: P = 16 and 64 only; --smoke: a few seconds (P = 16, one network,
   one straggler model, 2 seeds, no figures), for the build's checks. */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "sim_common.h"

#define BATCH 8
#define TARGET 0.92
#define MAX_SEEDS 16
#define MAX_STEPS 3000
#define NB100 7
#define MAX_ASYNC_S 10.0 /* virtual seconds: 10 to 40 times sync's times here */

static const dsgd_layer_desc LAYERS[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};

typedef enum pol { POL_SYNC, POL_CANCEL, POL_ASYNC, POL_SSP } pol;
static const char *const POL_NAME[4] = {"sync", "cancel", "async", "ssp"};

static const net_desc NETS[2] = {{"fast", 50e-6, 1e-10}, {"slow", 1e-3, 1e-8}};

typedef struct sev_desc {
    const char *name;
    double mean, p, factor;
} sev_desc;
static const sev_desc SEVS[3] = {{"light", 0.0025, 0, 0}, {"heavy", 0.010, 0, 0}, {"tail", 0.001, 0.05, 4.0}};

/* The learning-rate grids: sync and cancel scale the linear-scaling rate,
   async and SSP the single-gradient rate 0.05, down to 1/8 of it (a
   gradient P - 1 updates stale wants a smaller step). */
#define NG_SYNC 3
#define NG_ASYNC 5 /* the larger */
static const double GRID_SYNC[NG_SYNC] = {0.5, 1.0, 2.0};
static const double GRID_ASYNC[NG_ASYNC] = {2.0, 1.0, 0.5, 0.25, 0.125};

static int is_sync(pol p) { return p == POL_SYNC || p == POL_CANCEL; }

/* The size of policy p's learning-rate grid. */
static int grid_size(pol p) { return is_sync(p) ? NG_SYNC : NG_ASYNC; }

/* The order in which measure_all tries the grid values: the one most
   often best first (the linear-scaling rate; async's rates 1 to 1/4 of
   0.05, never twice it in the full sweep), so that the later values' runs
   can give up early. The choice does not depend on the order. */
static const int ORDER_SYNC[NG_SYNC] = {1, 0, 2};
static const int ORDER_ASYNC[NG_ASYNC] = {1, 2, 3, 4, 0};

/* A point of the sweep and what was measured there. */
typedef struct point {
    int net, sev, P, k; /* k: b (sync, cancel), s (ssp), 0 (async) */
    pol policy;
    double lr, mean, ci, t[MAX_SEEDS];
    int reached; /* evaluation seeds that reached the target */
} point;

typedef struct sweep {
    sim_data data;
    int seeds, tune_seeds, jobs;
    FILE *runs;
    long nruns;
    double t0;
} sweep;

/* Student's t at 97.5% for df degrees of freedom (df 1..15). */
static double t975(int df) {
    static const double t[16] = {0, 12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365,
                                 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131};
    return df >= 1 && df <= 15 ? t[df] : 1.96;
}

static double lr_of(const point *p, double g) {
    if (is_sync(p->policy)) return g * 0.1 * (double)(p->P - p->k) / 16.0;
    return g * 0.05;
}

/* One run of point p at learning rate lr and seed; its time to target, or
   -1. rows (optional) gets the run's CSV rows; without rows only the time
   to target is computed (sim_run_desc.target_only), and give_up_s > 0
   ends the run there (-1) when it has not reached the target by then. */
static double run_one(sweep *sw, const point *p, double lr, uint64_t seed, FILE *rows, double give_up_s,
                      long *updates) {
    sim_run_desc d;
    sim_result r;
    char name[64];
    memset(&d, 0, sizeof(d));
    snprintf(name, sizeof(name), "%s-%s-P%d-%s%d-s%llu", NETS[p->net].name, SEVS[p->sev].name, p->P,
             POL_NAME[p->policy], p->k, (unsigned long long)seed);
    d.name = name;
    d.kind = SIM_PS;
    d.workers = p->P;
    d.batch = BATCH;
    d.layers = LAYERS;
    d.num_layers = 2;
    d.target = TARGET;
    d.stop_at_target = p->policy != POL_SSP; /* SSP stops on its clocks: run to the end */
    d.net.alpha_s = NETS[p->net].alpha;
    d.net.beta_s_per_byte = NETS[p->net].beta;
    d.net.gamma_s_per_float = 1e-10;
    d.net.compute.kind = DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL;
    d.net.compute.shift_s = 0.010;
    d.net.compute.mean_s = SEVS[p->sev].mean;
    d.net.compute.straggler_p = SEVS[p->sev].p;
    d.net.compute.straggler_factor = SEVS[p->sev].factor;
    d.net.compute.seed = seed;
    d.csv = rows;
    d.target_only = rows == NULL;
    d.give_up_s = give_up_s;
    d.seed = seed;
    d.optimizer.lr = (float)lr;
    switch (p->policy) {
    case POL_SYNC:
    case POL_CANCEL:
        d.policy = DSGD_PS_BACKUP;
        d.backups = p->k;
        d.backup_cancel = p->policy == POL_CANCEL;
        d.optimizer.kind = DSGD_OPT_MOMENTUM;
        d.optimizer.momentum = 0.9f;
        d.steps = MAX_STEPS;
        d.eval_every = 1;
        break;
    case POL_ASYNC:
        d.policy = DSGD_PS_ASYNC;
        d.optimizer.kind = DSGD_OPT_SGD;
        d.max_time_s = MAX_ASYNC_S;
        d.eval_every = p->P;
        break;
    case POL_SSP:
        d.policy = DSGD_PS_SSP;
        d.staleness = p->k;
        d.optimizer.kind = DSGD_OPT_SGD;
        d.steps = MAX_STEPS / 8; /* pushes per worker */
        d.eval_every = p->P;
        break;
    }
    if (sim_run(&d, &sw->data, &r) != 0) return -2;
    *updates = r.steps_to_target;
    return r.time_to_target;
}

/* One run of the sweep: a point's learning rate and seed. */
typedef struct job {
    sweep *sw;
    const point *p;
    double lr, give_up_s, t;
    uint64_t seed;
    long updates;
} job;

static void job_run(void *user, int i) {
    job *j = ((job **)user)[i];
    j->t = run_one(j->sw, j->p, j->lr, j->seed, NULL, j->give_up_s, &j->updates);
}

/* Larger P first (the longer runs), then in the given order: the last
   runs on the threads are the short ones. */
static int cmp_job(const void *a, const void *b) {
    const job *x = *(job *const *)a, *y = *(job *const *)b;
    if (x->p->P != y->p->P) return y->p->P - x->p->P;
    return (x > y) - (x < y);
}

/* Runs the n jobs over sw->jobs threads (each run is a function of its
   desc, so nothing depends on which thread ran it). -1 when a run failed. */
static int run_jobs(sweep *sw, job *js, int n) {
    job **order = (job **)malloc(sizeof(job *) * (size_t)(n > 0 ? n : 1));
    int i;
    if (!order) return -1;
    for (i = 0; i < n; ++i) order[i] = &js[i];
    qsort(order, (size_t)n, sizeof(job *), cmp_job);
    sim_parallel(n, sw->jobs, job_run, order);
    free(order);
    sw->nruns += n;
    for (i = 0; i < n; ++i)
        if (js[i].t < -1.5) return -1;
    return 0;
}

/* The mean of k times (unreached, -1: +inf) and how many reached. */
static double mean_of(const job *js, int k, int *reached) {
    double sum = 0;
    int i;
    *reached = 0;
    for (i = 0; i < k; ++i)
        if (js[i].t >= 0) {
            sum += js[i].t;
            ++*reached;
        }
    return *reached == k ? sum / k : HUGE_VAL;
}

/* Tunes each point's learning rate on the tuning seeds (100 + i), then
   measures it on the evaluation seeds (1 + i): the points' runs together,
   grid value by grid value (ORDER_SYNC, ORDER_ASYNC), so that the threads
   stay busy. A point's best grid value is the first in the grid of the
   lowest mean time over the tuning seeds; a value tried later can only
   beat or tie it with every run's time below tune_seeds x the best mean
   so far, so its runs give up there (sim_run_desc.give_up_s, with a margin
   of 1e-9), which leaves the choice as it would be. The evaluation runs' rows go to
   sw->runs, point by point in order. 0, or -1 on a failed run. */
static int measure_all(sweep *sw, point *pts, int npts) {
    int kt = sw->tune_seeds, ks = sw->seeds, most = kt > ks ? kt : ks, g, i, s, n, reached;
    job *js = (job *)calloc((size_t)npts * (size_t)most, sizeof(job));
    double *best = (double *)malloc(sizeof(double) * (size_t)(npts > 0 ? npts : 1));
    int *best_g = (int *)malloc(sizeof(int) * (size_t)(npts > 0 ? npts : 1));
    if (!js || !best || !best_g) {
        free(js);
        free(best);
        free(best_g);
        return -1;
    }
    for (i = 0; i < npts; ++i) {
        best[i] = HUGE_VAL;
        best_g[i] = NG_ASYNC;
        pts[i].lr = lr_of(&pts[i], 1.0);
    }
    for (g = 0; g < NG_ASYNC; ++g) {
        n = 0;
        for (i = 0; i < npts; ++i) {
            const point *p = &pts[i];
            const double *grid = is_sync(p->policy) ? GRID_SYNC : GRID_ASYNC;
            const int *order = is_sync(p->policy) ? ORDER_SYNC : ORDER_ASYNC;
            if (g >= grid_size(p->policy)) continue;
            for (s = 0; s < kt; ++s, ++n) {
                job *j = &js[n];
                j->sw = sw;
                j->p = p;
                j->lr = lr_of(p, grid[order[g]]);
                j->seed = 100 + (uint64_t)s;
                j->give_up_s = isfinite(best[i]) ? best[i] * kt * (1 + 1e-9) : 0;
                j->updates = -1;
            }
        }
        if (n == 0) break;
        if (run_jobs(sw, js, n) != 0) goto fail;
        n = 0;
        for (i = 0; i < npts; ++i) {
            double m;
            int gi;
            if (g >= grid_size(pts[i].policy)) continue;
            gi = (is_sync(pts[i].policy) ? ORDER_SYNC : ORDER_ASYNC)[g];
            m = mean_of(&js[n], kt, &reached);
            if (m < best[i] || (m == best[i] && isfinite(m) && gi < best_g[i])) { /* the first in the grid */
                best[i] = m;
                best_g[i] = gi;
                pts[i].lr = js[n].lr;
            }
            n += kt;
        }
    }
    n = 0;
    for (i = 0; i < npts; ++i)
        for (s = 0; s < ks; ++s, ++n) {
            job *j = &js[n];
            memset(j, 0, sizeof(*j));
            j->sw = sw;
            j->p = &pts[i];
            j->lr = pts[i].lr;
            j->seed = 1 + (uint64_t)s;
            j->updates = -1;
        }
    if (run_jobs(sw, js, n) != 0) goto fail;
    for (i = 0; i < npts; ++i) {
        point *p = &pts[i];
        const job *pj = &js[i * ks];
        double sd = 0;
        p->mean = mean_of(pj, ks, &p->reached);
        for (s = 0; s < ks; ++s) {
            double x = pj[s].t;
            p->t[s] = x;
            if (sw->runs)
                fprintf(sw->runs, "%s,%s,%d,%s,%d,%.6g,%llu,%.6f,%ld,%d\n", NETS[p->net].name, SEVS[p->sev].name,
                        p->P, POL_NAME[p->policy], p->k, p->lr, (unsigned long long)pj[s].seed, x, pj[s].updates,
                        x >= 0);
        }
        p->ci = HUGE_VAL;
        if (p->reached == ks && ks > 1) {
            for (s = 0; s < ks; ++s) sd += (p->t[s] - p->mean) * (p->t[s] - p->mean);
            sd = sqrt(sd / (ks - 1));
            p->ci = t975(ks - 1) * sd / sqrt((double)ks);
        }
    }
    free(js);
    free(best);
    free(best_g);
    return 0;
fail:
    free(js);
    free(best);
    free(best_g);
    return -1;
}

static point make_point(int net, int sev, int P, pol policy, int k) {
    point p;
    memset(&p, 0, sizeof(p));
    p.net = net;
    p.sev = sev;
    p.P = P;
    p.policy = policy;
    p.k = k;
    return p;
}

static void summary_row(FILE *f, const point *p) {
    fprintf(f, "%s,%s,%d,%s,%d,%.6g,%.6f,%.6f,%d\n", NETS[p->net].name, SEVS[p->sev].name, p->P, POL_NAME[p->policy],
            p->k, p->lr, p->reached == 0 ? -1.0 : p->mean, isfinite(p->ci) ? p->ci : -1.0, p->reached);
    fflush(f);
}

static void print_point(const sweep *sw, const point *p) {
    if (p->reached == sw->seeds)
        printf("  %-5s %-6s P=%-4d %-6s %-3d lr %-7.4g %8.3f s +- %.3f\n", NETS[p->net].name, SEVS[p->sev].name, p->P,
               POL_NAME[p->policy], p->k, p->lr, p->mean, p->ci);
    else
        printf("  %-5s %-6s P=%-4d %-6s %-3d lr %-7.4g not reached (%d of %d seeds)\n", NETS[p->net].name,
               SEVS[p->sev].name, p->P, POL_NAME[p->policy], p->k, p->lr, p->reached, sw->seeds);
    fflush(stdout);
}

/* Step times (differences of time_s between consecutive versions) of the
   rows in f (one run's CSV, eval_every 1), into t; returns how many. */
static int step_times(FILE *f, double *t, int cap) {
    char line[256];
    double prev = -1;
    int n = 0;
    rewind(f);
    while (fgets(line, sizeof(line), f) && n < cap) {
        char *c = strchr(line, ',');
        double x;
        if (!c || !(c = strchr(c + 1, ','))) continue;
        x = strtod(c + 1, NULL);
        if (prev >= 0) t[n++] = x - prev;
        prev = x;
    }
    return n;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    const char *data_path = "examples/data/digits.csv", *out = "build/sim";
    static const int PS_FULL[4] = {16, 32, 64, 128}, PS_QUICK[2] = {16, 64};
    static const int BS[6] = {0, 1, 2, 4, 8, 16}, BS100[NB100] = {0, 1, 2, 4, 8, 16, 32};
    int quick = 0, smoke = 0, a, n, s, i, j, nP, failed = 0, npts, at;
    int P100 = 100, nb100 = NB100, nnet = 2, sev_lo = 0, sev_hi = 3;
    const int *PS_;
    char path[1024];
    FILE *sum = NULL, *table = NULL, *cdf = NULL;
    sweep sw;
    dsgd_ctx *ctx;
    point best_sync[2][3][4], async_pt[2][3][4], bpts[2][NB100], apt100, ssp100;
    static point pts[2 * NB100 + 2 + 2 * 3 * 4 * 7];

    memset(&sw, 0, sizeof(sw));
    sw.seeds = 5;
    sw.tune_seeds = 2;
    sw.jobs = 2;
    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) data_path = argv[++a];
        else if (!strcmp(argv[a], "--out") && a + 1 < argc) out = argv[++a];
        else if (!strcmp(argv[a], "--seeds") && a + 1 < argc) sw.seeds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--tune-seeds") && a + 1 < argc) sw.tune_seeds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--jobs") && a + 1 < argc) sw.jobs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--quick")) quick = 1;
        else if (!strcmp(argv[a], "--smoke")) smoke = 1;
        else {
            fprintf(stderr, "usage: %s [--data PATH] [--out DIR] [--seeds K] [--tune-seeds K] [--jobs J] [--quick] [--smoke]\n", argv[0]);
            return 2;
        }
    }
    if (sw.seeds < 2 || sw.seeds > MAX_SEEDS || sw.tune_seeds < 1 || sw.tune_seeds > MAX_SEEDS || sw.jobs < 1 ||
        sw.jobs > MAX_SEEDS) {
        fprintf(stderr, "--seeds: 2..%d, --tune-seeds: 1..%d, --jobs: 1..%d\n", MAX_SEEDS, MAX_SEEDS, MAX_SEEDS);
        return 2;
    }
    PS_ = quick || smoke ? PS_QUICK : PS_FULL;
    nP = smoke ? 1 : quick ? 2 : 4;
    if (smoke) { /* a few seconds: P = 16, the fast network, heavy stragglers, b <= 2, no figures */
        P100 = 16, nb100 = 3, nnet = 1, sev_lo = 1, sev_hi = 2;
        sw.seeds = 2, sw.tune_seeds = 1;
    }
    if (sim_mkdir(out) != 0) return 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (sim_load_digits(ctx, data_path, 1, &sw.data) != 0) {
        fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    snprintf(path, sizeof(path), "%s/crossover_runs.csv", out);
    sw.runs = fopen(path, "w");
    snprintf(path, sizeof(path), "%s/crossover_summary.csv", out);
    sum = fopen(path, "w");
    if (!sw.runs || !sum) {
        fprintf(stderr, "error: cannot write in %s\n", out);
        return 1;
    }
    fprintf(sw.runs, "net,severity,P,policy,k,lr,seed,time_to_target,updates,reached\n");
    fprintf(sum, "net,severity,P,policy,k,lr,mean_s,ci95_s,seeds_reached\n");
    sw.t0 = dsgd_now();
    printf("virtual seconds to %.0f%% test accuracy (digits MLP), mean +- 95%% CI of %d seeds, lr tuned on %d\n",
           100 * TARGET, sw.seeds, sw.tune_seeds);

    /* The points of sections 1 and 3, measured together (measure_all),
       then reported in this order. */
    /* 1. Chen et al.'s shape: P = 100 workers, fast network, tail
       stragglers (a few slow workers in every step, as on a shared
       cluster); time to target against b, both protocols; async and SSP
       beside them */
    npts = 0;
    for (j = 0; j < nb100; ++j) {
        pts[npts++] = make_point(0, 2, P100, POL_SYNC, BS100[j]);
        pts[npts++] = make_point(0, 2, P100, POL_CANCEL, BS100[j]);
    }
    pts[npts++] = make_point(0, 2, P100, POL_ASYNC, 0);
    pts[npts++] = make_point(0, 2, P100, POL_SSP, 4);
    /* 3. the crossover: async against sync at its best b (cancelling), per
       network, severity and P */
    for (n = 0; n < nnet; ++n)
        for (s = sev_lo; s < sev_hi; ++s)
            for (i = 0; i < nP; ++i) {
                int P = PS_[i];
                for (j = 0; j < 6 && BS[j] <= P / 8; ++j) pts[npts++] = make_point(n, s, P, POL_CANCEL, BS[j]);
                pts[npts++] = make_point(n, s, P, POL_ASYNC, 0);
            }
    if (measure_all(&sw, pts, npts) != 0) {
        fprintf(stderr, "error: a run failed\n");
        failed = 1;
    }

    printf("P = %d, fast network, tail stragglers: time to target against b\n", P100);
    at = 0;
    for (j = 0; j < nb100 && !failed; ++j) {
        int pol2;
        for (pol2 = 0; pol2 < 2; ++pol2) {
            bpts[pol2][j] = pts[at++];
            summary_row(sum, &bpts[pol2][j]);
            print_point(&sw, &bpts[pol2][j]);
        }
    }
    if (!failed) {
        apt100 = pts[at++];
        summary_row(sum, &apt100);
        print_point(&sw, &apt100);
        ssp100 = pts[at++];
        summary_row(sum, &ssp100);
        print_point(&sw, &ssp100);
    }

    /* 2. the step-time CDF there (one seed): b = 0 against b = 4, TF's
       protocol and cancelling */
    if (!failed) {
        static double st[3][MAX_STEPS];
        int cnt[3], c;
        snprintf(path, sizeof(path), "%s/crossover_cdf.csv", out);
        cdf = fopen(path, "w");
        for (c = 0; c < 3 && cdf; ++c) {
            point q = make_point(0, 2, P100, c == 2 ? POL_CANCEL : POL_SYNC, c ? 2 + 2 * !smoke : 0);
            FILE *rows = tmpfile();
            long upd;
            q.lr = lr_of(&q, 1.0);
            if (!rows || run_one(&sw, &q, q.lr, 1, rows, 0, &upd) < -1.5) failed = 1;
            sw.nruns++;
            cnt[c] = rows ? step_times(rows, st[c], MAX_STEPS) : 0;
            qsort(st[c], (size_t)cnt[c], sizeof(double), cmp_double);
            if (rows) fclose(rows);
        }
        if (cdf) {
            fprintf(cdf, "fraction,b0_s,b4_tf_s,b4_cancel_s\n");
            for (i = 1; i <= 100; ++i) {
                fprintf(cdf, "%.2f", i / 100.0);
                for (c = 0; c < 3; ++c) {
                    int at2 = cnt[c] ? (int)((double)i / 100.0 * cnt[c]) - 1 : 0;
                    fprintf(cdf, ",%.6f", cnt[c] ? st[c][at2 < 0 ? 0 : at2] : 0.0);
                }
                fprintf(cdf, "\n");
            }
            fclose(cdf);
        }
    }

    /* 3. (measured above) */
    printf("the crossover: sync at its best b (cancelling) against async\n");
    for (n = 0; n < nnet && !failed; ++n)
        for (s = sev_lo; s < sev_hi; ++s)
            for (i = 0; i < nP; ++i) {
                int P = PS_[i];
                point *bs = &best_sync[n][s][i];
                *bs = make_point(n, s, P, POL_CANCEL, 0);
                bs->mean = HUGE_VAL;
                for (j = 0; j < 6 && BS[j] <= P / 8; ++j) {
                    const point *q = &pts[at++];
                    summary_row(sum, q);
                    if (q->mean < bs->mean || j == 0) *bs = *q;
                }
                async_pt[n][s][i] = pts[at++];
                summary_row(sum, &async_pt[n][s][i]);
                print_point(&sw, bs);
                print_point(&sw, &async_pt[n][s][i]);
            }

    /* 4. the table */
    snprintf(path, sizeof(path), "%s/crossover_table.md", out);
    table = fopen(path, "w");
    if (table && !failed) {
        fprintf(table, "| network | stragglers | P | sync, best b | async | async / sync | faster |\n");
        fprintf(table, "|---|---|---|---|---|---|---|\n");
        for (n = 0; n < nnet; ++n)
            for (s = sev_lo; s < sev_hi; ++s)
                for (i = 0; i < nP; ++i) {
                    const point *y = &best_sync[n][s][i], *x = &async_pt[n][s][i];
                    char ys[64], xs[64];
                    const char *who;
                    if (y->reached == sw.seeds) snprintf(ys, sizeof(ys), "%.2f +- %.2f s (b = %d)", y->mean, y->ci, y->k);
                    else snprintf(ys, sizeof(ys), "not reached");
                    if (x->reached == sw.seeds) snprintf(xs, sizeof(xs), "%.2f +- %.2f s", x->mean, x->ci);
                    else snprintf(xs, sizeof(xs), "not reached");
                    if (y->reached != sw.seeds && x->reached != sw.seeds) who = "neither";
                    else if (x->reached != sw.seeds || y->mean + y->ci < x->mean - x->ci) who = "**sync**";
                    else if (y->reached != sw.seeds || x->mean + x->ci < y->mean - y->ci) who = "**async**";
                    else who = y->mean < x->mean ? "sync (CIs overlap)" : "async (CIs overlap)";
                    fprintf(table, "| %s | %s | %d | %s | %s | %.2f | %s |\n", NETS[n].name, SEVS[s].name, PS_[i], ys, xs,
                            y->reached == sw.seeds && x->reached == sw.seeds ? x->mean / y->mean : 0.0, who);
                }
        fclose(table);
        printf("wrote %s\n", path);
    }

    /* 5. the figures */
    if (!failed && !smoke && sim_have_gnuplot()) {
        char script[8192], sp[1024], cp[1024];
        snprintf(sp, sizeof(sp), "%s/crossover_summary.csv", out);
        snprintf(cp, sizeof(cp), "%s/crossover_cdf.csv", out);
        fflush(sum);
        snprintf(script, sizeof(script),
                 "set terminal pngcairo size 800,500 noenhanced\nset datafile separator ','\nset grid\n"
                 "set output '%s/crossover_backups.png'\nset key top right\n"
                 "set title 'P = 100 workers = N + b, tail stragglers, fast network: mean and 95%% CI of %d seeds'\n"
                 "set xlabel 'backup workers b'\nset ylabel 'virtual seconds to %.0f%% test accuracy'\n"
                 "set yrange [0:*]\nset xrange [-1:33]\nf='%s'\n"
                 "sel(pol)=(strcol(1) eq 'fast' && strcol(2) eq 'tail' && $3 == 100 && strcol(4) eq pol && $9 == %d)\n"
                 "plot f every ::1 using (sel('sync') ? $5 : NaN):7:8 with yerrorlines lw 2 pt 7 title 'TF protocol (late workers finish)', "
                 "f every ::1 using (sel('cancel') ? $5 : NaN):7:8 with yerrorlines lw 2 pt 5 title 'late workers cancelled', "
                 "%g with lines dt 2 lw 2 title 'async%s', %g with lines dt 3 lw 2 title 'SSP, s = 4%s'\n"
                 "set output '%s/crossover_cdf.png'\nset key bottom right\nset autoscale\nset yrange [0:1]\n"
                 "set title 'step time at P = 100, tail stragglers (one seed)'\n"
                 "set xlabel 'virtual seconds per step'\nset ylabel 'fraction of steps'\n"
                 "plot '%s' every ::1 using 2:1 with lines lw 2 title 'b = 0', "
                 "'' every ::1 using 3:1 with lines lw 2 title 'b = 4, TF protocol', "
                 "'' every ::1 using 4:1 with lines lw 2 title 'b = 4, cancelled'\n",
                 out, sw.seeds, 100 * TARGET, sp, sw.seeds, apt100.reached == sw.seeds ? apt100.mean : -1.0,
                 apt100.reached == sw.seeds ? "" : " (not reached)", ssp100.reached == sw.seeds ? ssp100.mean : -1.0,
                 ssp100.reached == sw.seeds ? "" : " (not reached)", out, cp);
        if (sim_gnuplot(script) != 0) printf("gnuplot failed: no PNG\n");
        snprintf(script, sizeof(script),
                 "set terminal pngcairo size 1000,700 noenhanced\nset datafile separator ','\nset grid\n"
                 "set output '%s/crossover_p.png'\nset multiplot layout 2,3 title "
                 "'virtual seconds to %.0f%% (mean, 95%% CI of %d seeds): sync at its best b (o), async (x)'\n"
                 "set logscale x 2\nset xrange [12:160]\nset yrange [0:*]\nset key off\nf='%s'\n"
                 "do for [nn in 'fast slow'] { do for [ss in 'light heavy tail'] {\n"
                 "  set title nn.' network, '.ss.' stragglers'\n"
                 "  plot f every ::1 using ((strcol(1) eq nn && strcol(2) eq ss && strcol(4) eq 'async' && $9 == %d) ? $3 : NaN):7:8 "
                 "with yerrorlines lw 2 pt 2 lc 2, "
                 "'%s/crossover_best.csv' every ::1 using ((strcol(1) eq nn && strcol(2) eq ss) ? $3 : NaN):5:6 "
                 "with yerrorlines lw 2 pt 7 lc 1\n} }\nunset multiplot\n",
                 out, 100 * TARGET, sw.seeds, sp, sw.seeds, out);
        snprintf(path, sizeof(path), "%s/crossover_best.csv", out);
        if ((table = fopen(path, "w")) != NULL) {
            fprintf(table, "net,severity,P,b,mean_s,ci95_s\n");
            for (n = 0; n < 2; ++n)
                for (s = 0; s < 3; ++s)
                    for (i = 0; i < nP; ++i)
                        if (best_sync[n][s][i].reached == sw.seeds)
                            fprintf(table, "%s,%s,%d,%d,%.6f,%.6f\n", NETS[n].name, SEVS[s].name, PS_[i],
                                    best_sync[n][s][i].k, best_sync[n][s][i].mean, best_sync[n][s][i].ci);
            fclose(table);
            if (sim_gnuplot(script) != 0) printf("gnuplot failed: no PNG\n");
        }
        printf("wrote %s/crossover_backups.png, crossover_cdf.png, crossover_p.png\n", out);
    } else if (!failed && !smoke) {
        printf("gnuplot not found: no PNG (apt-get install gnuplot-nox)\n");
    }
    printf("%ld runs in %.1f s\n", sw.nruns, dsgd_now() - sw.t0);
    fclose(sw.runs);
    fclose(sum);
    sim_data_free(&sw.data);
    dsgd_ctx_destroy(ctx);
    return failed;
}
