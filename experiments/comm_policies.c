/* comm_policies.c - which way of communicating trains fastest, on a fast
   and on a slow network? One model trained on the simulated cluster
   (distsgd/simnet.h) by every communication policy the library has, with
   the same batches, seeds and compute model, to the same test accuracy:

     fp32       mirrored, the ring all-reduce of the fp32 gradient
     fp16       mirrored, the fp16 hook (compress.h: a half wire, sums in fp32)
     topk       mirrored, top-k hook, 1% of each variable, error feedback
     powersgd   mirrored, PowerSGD hook, rank 2, error feedback, warm start
     topk-cheap, powersgd-cheap
                the same two with the codec at 0.25 ns a float (as fast as
                F16C: what a GPU kernel might cost), to separate what the
                bytes save from what the CPU codec costs
     local8     local SGD (DSGD_STRATEGY_LOCAL), H = 8, outer AVERAGE
     diloco50   DiLoCo (DSGD_STRATEGY_LOCAL), H = 50, outer NESTEROV lr 0.7,
                momentum 0.9, inner AdamW
     async      parameter server (one server rank), ASYNC
     backup     parameter server, sync with backup workers: N = 3 of the 4
                workers' gradients make a step (b = 1), late ones dropped

   The task: Fashion-MNIST, the MLP 784-64-10 (50,890 parameters, 203,560
   bytes in fp32), 4 workers x 32 samples, trained to 85% test accuracy
   (the test set's 10,000 images, evaluated every 5,120 samples of
   training: 40 steps of 128, DiLoCo every 50 steps, at its rounds' ends).
   Every worker draws its batch k from the training set by a generator of
   (seed, worker, k), so replica r of a mirrored or local run and worker r
   of a parameter-server run see the same batches.

   Compute per worker and step (simnet's compute model, the same for every
   policy): 0.64 ms (20 us a sample) + Exp(mean 0.16 ms). Networks (links
   alpha + bytes x beta, reductions 0.1 ns a float):
     fast  alpha 5 us, 10 GB/s
     slow  alpha 50 us, 1 Gb/s (125 MB/s)
   Codec time (simnet's codec_s_per_float, charged by the hooks): fp16 0.25
   ns a float (simnet's default, F16C); top-k 18 ns and PowerSGD 36 ns, the
   seconds a float their compressors took on a shared 2-vCPU VM
   (examples/gradient_compression's compress_s over 2 floats x steps x
   replicas, one epoch), fixed here so that runs repeat.

   Learning rates (not tuned per policy): mirrored and the hooks SGD with
   momentum 0.9, lr 0.05 (global batch 128); local8 the same optimizer in
   every replica; diloco50 AdamW lr 1e-3 inside; async SGD with momentum
   0.9 at lr 0.0125 (one gradient of 32 samples an update: the linear
   scaling rule); backup the same at lr 0.0375 (96 samples a step).

   Measured, per seed: the virtual time of the first evaluation at or
   above 85% and the bytes a worker had sent by then (the hub's count,
   dsgd_simnet_bytes_sent, mean over the workers; for the parameter server
   the workers' pushes and pull requests, not the server's replies). A run
   that does not reach 85% within its budget (768,000 samples of training,
   12.8 epochs) says so. Reported: the median over the seeds (--seeds,
   default 3; unreached counts as infinite) and the range.

   Writes, in --out (default build/sim):
     comm_policies_runs.csv   every evaluation: run,step,time_s,loss,
                              accuracy,staleness,dropped,bytes_per_worker
                              (run: NET-POLICY-sSEED)
     comm_policies_seeds.csv  one row per network, policy and seed
     comm_policies.csv        one row per network and policy: the median
     comm_policies_table.md   the table
     comm_policies.png        accuracy against virtual time (fast, slow)
                              and against bytes sent (slow), first seed;
                              the median time to 85% (gnuplot)
   The same seeds give the same bytes.

   Run:  make sim   (with the other experiments)
   or:   ./build/experiments/comm_policies --data DIR [--out DIR] [--seed S]
                [--seeds K] [--jobs J] [--only POLICY] [--quick] [--smoke]
   DIR holds the uncompressed Fashion-MNIST IDX files. --quick: the target
   80%, a third of the budget; --smoke: a few seconds (fp32, topk, local8,
   async, one seed, 70% on 2,000 test images, no figure), for the build's
   checks. */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "sim_common.h"

#define WORKERS 4
#define BATCH 32
#define EVAL_SAMPLES 5120   /* 40 steps of the global batch 128 */
#define MAX_SAMPLES 768000L /* 12.8 epochs */
#define TOPK_CODEC_S 18e-9  /* compress_s / (2 floats x steps x replicas): 16.3 s for an epoch of 4 replicas */
#define MAX_SEEDS 8
#define POWERSGD_CODEC_S 36e-9 /* 31.9 s likewise */

static const dsgd_layer_desc LAYERS[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};

typedef enum pol {
    POL_FP32,
    POL_FP16,
    POL_TOPK,
    POL_POWERSGD,
    POL_TOPK_CHEAP,
    POL_POWERSGD_CHEAP,
    POL_LOCAL8,
    POL_DILOCO50,
    POL_ASYNC,
    POL_BACKUP,
    POL_COUNT
} pol;
static const char *const POL_NAME[POL_COUNT] = {"fp32",       "fp16",           "topk",   "powersgd",
                                                "topk-cheap", "powersgd-cheap", "local8", "diloco50",
                                                "async",      "backup"};
static const char *const POL_TITLE[POL_COUNT] = {"mirrored fp32",
                                                 "mirrored + fp16",
                                                 "mirrored + top-k 1%",
                                                 "mirrored + PowerSGD r2",
                                                 "top-k, codec 0.25 ns",
                                                 "PowerSGD, codec 0.25 ns",
                                                 "local SGD H=8",
                                                 "DiLoCo H=50",
                                                 "PS async",
                                                 "PS sync, 1 backup"};

/* the figure's lines: a colour per family, dashed for the cheap codecs */
static const char *const POL_COLOR[POL_COUNT] = {"#000000", "#7f7f7f", "#1f77b4", "#d62728", "#1f77b4",
                                                 "#d62728", "#2ca02c", "#17becf", "#9467bd", "#ff7f0e"};
static const int POL_DASH[POL_COUNT] = {1, 1, 1, 1, 2, 2, 1, 1, 1, 1};

static const net_desc NETS[2] = {{"fast", 5e-6, 1e-10}, {"slow", 50e-6, 8e-9}};

/* One run: its desc, the hook's storage, its rows and what it measured. */
typedef struct job {
    int net;
    pol policy;
    uint64_t seed;
    char name[48];
    sim_run_desc d;
    dsgd_compress_desc cd;
    dsgd_comm_hook hook;
    FILE *rows; /* a temporary file: the run's CSV rows */
    sim_result r;
    int rc;
} job;

typedef struct jobs {
    job *j;
    const int *order; /* the runs in the order the threads take them */
    const sim_data *data;
} jobs;

/* About how long a policy's run takes (thousands of training samples to
   85%, measured): the threads take the longest first, so that no long run
   is left alone at the end. Only the order changes, not what a run does. */
static const int POL_COST[POL_COUNT] = {108, 104, 370, 152, 370, 152, 133, 115, 339, 100};

/* Fills j's desc for its policy and network. */
static void make_job(job *j, int net, pol p, uint64_t seed, double target, long max_samples) {
    sim_run_desc *d = &j->d;
    long steps = max_samples / (WORKERS * BATCH), eval = EVAL_SAMPLES / (WORKERS * BATCH);
    memset(j, 0, sizeof(*j));
    j->net = net;
    j->policy = p;
    j->seed = seed;
    snprintf(j->name, sizeof(j->name), "%s-%s-s%llu", NETS[net].name, POL_NAME[p], (unsigned long long)seed);
    d->name = j->name;
    d->kind = SIM_MIRRORED;
    d->workers = WORKERS;
    d->batch = BATCH;
    d->layers = LAYERS;
    d->num_layers = 2;
    d->target = target;
    d->stop_at_target = 1;
    d->csv_bytes = 1;
    d->ps_draw_as_replica = 1;
    d->seed = seed;
    d->steps = steps;
    d->eval_every = (int)eval;
    d->optimizer.kind = DSGD_OPT_MOMENTUM;
    d->optimizer.momentum = 0.9f;
    d->optimizer.lr = 0.05f;
    d->net.alpha_s = NETS[net].alpha;
    d->net.beta_s_per_byte = NETS[net].beta;
    d->net.gamma_s_per_float = 1e-10;
    d->net.compute.kind = DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL;
    d->net.compute.shift_s = 20e-6 * BATCH;
    d->net.compute.mean_s = 5e-6 * BATCH;
    d->net.compute.seed = seed;
    switch (p) {
    case POL_FP32:
        break;
    case POL_FP16:
        j->cd.kind = DSGD_COMPRESS_FP16;
        break;
    case POL_TOPK:
    case POL_TOPK_CHEAP:
        j->cd.kind = DSGD_COMPRESS_TOPK;
        j->cd.ratio = 0.01;
        d->net.codec_s_per_float = p == POL_TOPK ? TOPK_CODEC_S : 0.0; /* 0: simnet's default */
        break;
    case POL_POWERSGD:
    case POL_POWERSGD_CHEAP:
        j->cd.kind = DSGD_COMPRESS_POWERSGD;
        j->cd.rank = 2;
        d->net.codec_s_per_float = p == POL_POWERSGD ? POWERSGD_CODEC_S : 0.0;
        break;
    case POL_LOCAL8:
        d->local_sgd = 1;
        d->local.period = 8;
        d->local.outer = DSGD_OUTER_AVERAGE;
        break;
    case POL_DILOCO50:
        d->local_sgd = 1;
        d->local.period = 50;
        d->local.outer = DSGD_OUTER_NESTEROV;
        d->local.outer_lr = 0.7f;
        d->local.outer_momentum = 0.9f;
        d->optimizer.kind = DSGD_OPT_ADAMW;
        d->optimizer.momentum = 0;
        d->optimizer.lr = 1e-3f;
        d->eval_every = 50; /* a round's end: the replicas hold the averaged weights */
        break;
    case POL_ASYNC:
        d->kind = SIM_PS;
        d->policy = DSGD_PS_ASYNC;
        d->optimizer.lr = 0.0125f;
        d->steps = steps * WORKERS; /* updates of one gradient each */
        d->max_time_s = 1e3;
        d->eval_every = (int)eval * WORKERS;
        break;
    case POL_BACKUP:
        d->kind = SIM_PS;
        d->policy = DSGD_PS_BACKUP;
        d->backups = 1;
        d->optimizer.lr = 0.0375f;
        d->steps = steps * WORKERS / (WORKERS - 1);
        break;
    case POL_COUNT:
        break;
    }
    if (j->cd.kind != DSGD_COMPRESS_NONE) {
        j->hook = dsgd_compress_hook(&j->cd);
        d->comm_hook = &j->hook;
    }
}

static void job_run(void *user, int i) {
    jobs *q = (jobs *)user;
    job *j = &q->j[q->order[i]];
    j->d.csv = j->rows;
    j->rc = j->rows ? sim_run(&j->d, q->data, &j->r) : -1;
}

static void fmt_bytes(char *s, size_t n, double b) {
    if (b >= 1e9) snprintf(s, n, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(s, n, "%.1f MB", b / 1e6);
    else snprintf(s, n, "%.0f kB", b / 1e3);
}

/* Training samples a run's update takes. */
static long samples_per_update(pol p) {
    return p == POL_ASYNC ? BATCH : p == POL_BACKUP ? (WORKERS - 1) * BATCH : WORKERS * BATCH;
}

/* One (network, policy) over its seeds. */
typedef struct point {
    const job *med; /* the seed of the median time; NULL: the median did not reach the target */
    double lo, hi;  /* the fastest and slowest seed that reached it */
    int reached;
} point;

static int cmp_time(const void *a, const void *b) {
    const job *x = *(const job *const *)a, *y = *(const job *const *)b;
    double tx = x->r.time_to_target < 0 ? HUGE_VAL : x->r.time_to_target;
    double ty = y->r.time_to_target < 0 ? HUGE_VAL : y->r.time_to_target;
    return tx < ty ? -1 : tx > ty ? 1 : (x->seed > y->seed) - (x->seed < y->seed);
}

/* The median of k runs (the lower middle for even k), unreached counting
   as infinite. */
static void summarize(const job *j, int k, point *pt) {
    const job *o[MAX_SEEDS];
    int i;
    memset(pt, 0, sizeof(*pt));
    for (i = 0; i < k; ++i) o[i] = &j[i];
    qsort(o, (size_t)k, sizeof(o[0]), cmp_time);
    for (i = 0; i < k; ++i)
        if (o[i]->r.time_to_target >= 0) {
            if (!pt->reached) pt->lo = o[i]->r.time_to_target;
            pt->hi = o[i]->r.time_to_target;
            pt->reached++;
        }
    pt->med = o[(k - 1) / 2]->r.time_to_target >= 0 ? o[(k - 1) / 2] : NULL;
}

/* gnuplot's plot list: accuracy against column col (3: time, 8: bytes) of
   network net's runs, one line per policy. */
static void plot_lines(char *s, size_t cap, const char *net, int col, const int *pols, int npol, uint64_t seed) {
    size_t len = 0;
    int p;
    s[0] = 0;
    for (p = 0; p < npol && len < cap; ++p)
        len += (size_t)snprintf(s + len, cap - len,
                                "%sf using (strcol(1) eq '%s-%s-s%llu' ? $%d : NaN):5 with lines lw 2 lc rgb '%s' dt %d title '%s'",
                                p ? ", " : "", net, POL_NAME[pols[p]], (unsigned long long)seed, col,
                                POL_COLOR[pols[p]], POL_DASH[pols[p]], POL_TITLE[pols[p]]);
}

int main(int argc, char **argv) {
    const char *data_dir = NULL, *out = "build/sim", *only = NULL;
    int quick = 0, smoke = 0, njobs = 2, a, i, n, p, failed = 0;
    uint64_t seed = 1;
    double target = 0.85;
    long max_samples = MAX_SAMPLES;
    char path[1024];
    FILE *runs, *sum, *seedf, *table;
    dsgd_ctx *ctx;
    sim_data data;
    static job js[2 * POL_COUNT * MAX_SEEDS];
    static int order[2 * POL_COUNT * MAX_SEEDS];
    point pts[2][POL_COUNT];
    jobs q;
    int pols[POL_COUNT], npol = 0, seeds = 3, k;
    double t0;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) data_dir = argv[++a];
        else if (!strcmp(argv[a], "--out") && a + 1 < argc) out = argv[++a];
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = (uint64_t)strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--jobs") && a + 1 < argc) njobs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--seeds") && a + 1 < argc) seeds = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--quick")) quick = 1;
        else if (!strcmp(argv[a], "--smoke")) smoke = 1;
        else if (!strcmp(argv[a], "--only") && a + 1 < argc) only = argv[++a];
        else break;
    }
    if (a < argc || !data_dir || njobs < 1 || njobs > 16 || seeds < 1 || seeds > MAX_SEEDS) {
        fprintf(stderr,
                "usage: %s --data DIR [--out DIR] [--seed S] [--seeds 1..%d] [--jobs 1..16] [--only POLICY] "
                "[--quick] [--smoke]\n",
                argv[0], MAX_SEEDS);
        return 2;
    }
    for (p = 0; p < POL_COUNT; ++p)
        if ((!smoke || p == POL_FP32 || p == POL_TOPK || p == POL_LOCAL8 || p == POL_ASYNC) &&
            (!only || !strcmp(only, POL_NAME[p])))
            pols[npol++] = p;
    if (npol == 0) {
        fprintf(stderr, "--only: fp32, fp16, topk, powersgd, local8, diloco50, async or backup\n");
        return 2;
    }
    if (quick) target = 0.80, max_samples = MAX_SAMPLES / 3;
    if (smoke) target = 0.70, max_samples = 40960, seeds = 1;
    if (sim_mkdir(out) != 0) return 1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (sim_load_fashion(ctx, data_dir, &data) != 0) {
        fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    if (smoke && data.test.n > 2000) data.test.n = 2000; /* the first 2,000 test images */
    snprintf(path, sizeof(path), "%s/comm_policies_runs.csv", out);
    runs = fopen(path, "w");
    snprintf(path, sizeof(path), "%s/comm_policies.csv", out);
    sum = fopen(path, "w");
    snprintf(path, sizeof(path), "%s/comm_policies_seeds.csv", out);
    seedf = fopen(path, "w");
    snprintf(path, sizeof(path), "%s/comm_policies_table.md", out);
    table = fopen(path, "w");
    if (!runs || !sum || !seedf || !table) {
        fprintf(stderr, "error: cannot write in %s\n", out);
        return 1;
    }
    printf("Fashion-MNIST MLP 784-64-10, %d workers x %d samples, to %.0f%% test accuracy (%zu test images), "
           "at most %ld samples\n",
           WORKERS, BATCH, 100 * target, data.test.n, max_samples);
    printf("compute 0.64 ms + Exp(0.16 ms) a step; fast: 5 us, 10 GB/s; slow: 50 us, 1 Gb/s\n");

    /* every (network, policy, seed), two at a time (--jobs): each run is a
       function of its desc, so the bytes do not depend on which thread ran
       it */
    n = 0;
    for (i = 0; i < 2; ++i)
        for (p = 0; p < npol; ++p)
            for (k = 0; k < seeds; ++k) {
                make_job(&js[n], i, (pol)pols[p], seed + (uint64_t)k, target, max_samples);
                js[n].rows = tmpfile();
                ++n;
            }
    for (i = 0; i < n; ++i) order[i] = i;
    for (i = 1; i < n; ++i) { /* by cost, longest first; stable */
        int x = order[i], at = i;
        while (at > 0 && POL_COST[js[order[at - 1]].policy] < POL_COST[js[x].policy]) {
            order[at] = order[at - 1];
            --at;
        }
        order[at] = x;
    }
    q.j = js;
    q.order = order;
    q.data = &data;
    t0 = dsgd_now();
    sim_parallel(n, njobs, job_run, &q);

    sim_csv_header_bytes(runs);
    fprintf(seedf, "net,policy,seed,time_to_target_s,samples_to_target,bytes_per_worker_to_target,final_time_s,"
                   "final_accuracy,final_bytes_per_worker,reached\n");
    for (i = 0; i < n; ++i) {
        const job *j = &js[i];
        int reached = j->r.time_to_target >= 0;
        if (j->rc != 0) failed = 1;
        if (j->rows) {
            sim_append(runs, j->rows);
            fclose(j->rows);
        }
        fprintf(seedf, "%s,%s,%llu,%.6f,%ld,%.0f,%.6f,%.6f,%.0f,%d\n", NETS[j->net].name, POL_NAME[j->policy],
                (unsigned long long)j->seed, reached ? j->r.time_to_target : -1.0,
                reached ? j->r.steps_to_target * samples_per_update(j->policy) : -1L,
                reached ? j->r.bytes_to_target : -1.0, j->r.final_time, j->r.final_accuracy, j->r.final_bytes,
                reached);
    }

    /* per network and policy: the seed of the median time (unreached
       counts as infinite), its time and bytes, the range over the seeds */
    fprintf(sum, "net,policy,alpha_s,bytes_per_s,median_time_to_target_s,min_s,max_s,median_seed_bytes_per_worker,"
                 "median_seed_samples,seeds_reached,seeds\n");
    for (i = 0; i < 2; ++i)
        for (p = 0; p < npol; ++p) {
            point *pt = &pts[i][p];
            summarize(&js[(i * npol + p) * seeds], seeds, pt);
            fprintf(sum, "%s,%s,%g,%g,%.6f,%.6f,%.6f,%.0f,%ld,%d,%d\n", NETS[i].name, POL_NAME[pols[p]], NETS[i].alpha,
                    1.0 / NETS[i].beta, pt->med ? pt->med->r.time_to_target : -1.0, pt->reached ? pt->lo : -1.0,
                    pt->reached ? pt->hi : -1.0, pt->med ? pt->med->r.bytes_to_target : -1.0,
                    pt->med ? pt->med->r.steps_to_target * samples_per_update(pt->med->policy) : -1L, pt->reached,
                    seeds);
        }

    /* the table */
    fprintf(table, "| policy | fast: s to %.0f%% | fast: sent/worker | slow: s to %.0f%% | slow: sent/worker | "
                   "slow / fast |\n|---|---|---|---|---|---|\n",
            100 * target, 100 * target);
    printf("median of %d seeds (min-max), virtual seconds to %.0f%%, and the bytes a worker sent by then\n", seeds,
           100 * target);
    printf("%-24s %20s %10s %20s %10s %9s\n", "policy", "fast s", "sent", "slow s", "sent", "slow/fast");
    for (p = 0; p < npol; ++p) {
        char cell[2][2][64];
        for (i = 0; i < 2; ++i) {
            const point *pt = &pts[i][p];
            if (pt->med) {
                if (seeds > 1)
                    snprintf(cell[i][0], sizeof(cell[i][0]), "%.2f (%.2f-%.2f)", pt->med->r.time_to_target, pt->lo,
                             pt->hi);
                else
                    snprintf(cell[i][0], sizeof(cell[i][0]), "%.2f", pt->med->r.time_to_target);
                if (pt->reached < seeds)
                    snprintf(cell[i][0] + strlen(cell[i][0]), sizeof(cell[i][0]) - strlen(cell[i][0]),
                             " %d/%d", pt->reached, seeds);
                fmt_bytes(cell[i][1], sizeof(cell[i][1]), pt->med->r.bytes_to_target);
            } else {
                snprintf(cell[i][0], sizeof(cell[i][0]), "not reached");
                snprintf(cell[i][1], sizeof(cell[i][1]), "-");
            }
        }
        fprintf(table, "| %s | %s | %s | %s | %s | ", POL_TITLE[pols[p]], cell[0][0], cell[0][1], cell[1][0],
                cell[1][1]);
        printf("%-24s %20s %10s %20s %10s ", POL_TITLE[pols[p]], cell[0][0], cell[0][1], cell[1][0], cell[1][1]);
        if (pts[0][p].med && pts[1][p].med) {
            double r = pts[1][p].med->r.time_to_target / pts[0][p].med->r.time_to_target;
            fprintf(table, "%.1fx |\n", r);
            printf("%8.1fx\n", r);
        } else {
            fprintf(table, "- |\n");
            printf("%9s\n", "-");
        }
    }
    for (i = 0; i < n; ++i)
        if (js[i].r.time_to_target < 0)
            printf("%s: not reached, %.2f%% at %.3f virtual s\n", js[i].name, 100 * js[i].r.final_accuracy,
                   js[i].r.final_time);
    fclose(runs);
    fclose(seedf);
    fclose(sum);
    fclose(table);

    /* the figure */
    if (!failed && !smoke && sim_have_gnuplot()) {
        char script[12288], plot[3][2048], bars[1024];
        for (i = 0; i < 3; ++i) /* accuracy against time (fast, slow), against bytes (slow) */
            plot_lines(plot[i], sizeof(plot[i]), i == 0 ? "fast" : "slow", i == 2 ? 8 : 3, pols, npol, seed);
        snprintf(bars, sizeof(bars), "%s/comm_policies.csv", out);
        snprintf(script, sizeof(script),
                 "set terminal pngcairo size 1200,900 noenhanced\nset datafile separator ','\nset grid\n"
                 "set output '%s/comm_policies.png'\nf='%s/comm_policies_runs.csv'\n"
                 "set multiplot layout 2,2 title 'Fashion-MNIST MLP, %d workers x %d samples, every communication "
                 "policy on the simulated cluster (curves: seed %llu; bars: median of %d seeds)'\n"
                 "set key bottom right font ',8'\nset yrange [0.6:0.9]\nset ylabel 'test accuracy'\n"
                 "set arrow 1 from graph 0, first %g to graph 1, first %g nohead dt 2 lc 'black'\n"
                 "set logscale x\nset xlabel 'virtual seconds'\n"
                 "set title 'fast network: 5 us, 10 GB/s'\nplot %s\n"
                 "set title 'slow network: 50 us, 1 Gb/s'\nplot %s\n"
                 "set title 'against the bytes a worker sent (slow network)'\nset xlabel 'bytes sent per worker'\n"
                 "plot %s\n"
                 "unset arrow 1\nunset logscale x\nset logscale y\nset autoscale\n"
                 "set title 'virtual seconds to %.0f%%'\nset ylabel 'seconds (log)'\nunset xlabel\n"
                 "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.8\n"
                 "set xtics rotate by -30 font ',8'\nset key top left\n"
                 "plot '< grep -h ^fast, %s' using ($5 > 0 ? $5 : NaN):xtic(2) title 'fast', "
                 "'< grep -h ^slow, %s' using ($5 > 0 ? $5 : NaN) title 'slow'\n"
                 "unset multiplot\n",
                 out, out, WORKERS, BATCH, (unsigned long long)seed, seeds, target, target, plot[0], plot[1], plot[2], 100 * target, bars, bars);
        if (sim_gnuplot(script) != 0) printf("gnuplot failed: no PNG\n");
        else printf("wrote %s/comm_policies.png\n", out);
    } else if (!failed && !smoke) {
        printf("gnuplot not found: no PNG (apt-get install gnuplot-nox)\n");
    }
    printf("wrote %s/comm_policies.csv, comm_policies_runs.csv, comm_policies_table.md\n", out);
    printf("%d runs in %.1f s\n", n, dsgd_now() - t0);
    sim_data_free(&data);
    dsgd_ctx_destroy(ctx);
    return failed;
}
