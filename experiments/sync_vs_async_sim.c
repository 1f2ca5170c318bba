/* sync_vs_async_sim.c - test accuracy against virtual time for synchronous
   and asynchronous training of 16 simulated workers with stragglers.

   Four runs of the same MLP (64-64-10) on the vendored UCI digits, each on
   a simulated cluster (distsgd/simnet.h: real gradients, virtual time):
     mirrored  all-reduce (ring) every step: waits for the slowest of 16
     async     parameter server, ASYNC: every gradient applied on arrival
     ssp       parameter server, SSP with bound s = 3
     backup    parameter server, BACKUP: 14 + 2 backup workers, each step
               takes the first 14 gradients and drops the 2 late ones
   Compute: each worker's step takes a shifted exponential time (10 ms +
   Exp(mean 10 ms), seeded per worker and step), so every step has
   stragglers; links cost 50 us + 1 ns per byte (a gradient is 19 KB).
   The synchronous runs average 16 x 8 = 128 samples a step (backup: 112) at
   SGD with momentum 0.9, lr 0.1 (backup 0.0875, the linear scaling rule);
   async applies each worker's 8-sample gradient, at lr 0.05 without
   momentum (stale gradients act as momentum already; Mitliagkas et al.
   2016); SSP, whose clocks average 16 gradients, the synchronous rate
   divided by s + 1 (Zhang et al. 2016).

   Digits: 1797 images, 1437 to train and 360 to test; a gradient costs
   microseconds, so 16 simulated workers run thousands of steps in
   seconds, and 85% test accuracy takes a few hundred updates, enough to
   separate the policies.

   Writes build/sim/sync_vs_async.csv (run,step,time_s,loss,accuracy,
   staleness,dropped; see experiments/sim_common.h), the first 0.2 virtual
   seconds of each run as a Chrome trace (build/sim/sync_vs_async_RUN.json:
   open in chrome://tracing or ui.perfetto.dev), and, when gnuplot is
   installed, build/sim/sync_vs_async.png. Prints each run's virtual time
   to 85% test accuracy. The same seed gives the same bytes.

   Run:  make sim      (all three experiments)
   or:   ./build/experiments/sync_vs_async_sim [--data PATH] [--out DIR] [--seed S] */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "sim_common.h"

#define WORKERS 16
#define BATCH 8

static const dsgd_layer_desc LAYERS[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};

int main(int argc, char **argv) {
    const char *data_path = "examples/data/digits.csv", *out = "build/sim";
    uint64_t seed = 1;
    dsgd_ctx *ctx;
    sim_data data;
    sim_run_desc base, runs[4];
    sim_result res[4];
    char csv_path[1024], trace[4][1024], png[1024];
    FILE *csv;
    int a, i, failed = 0;
    double t_end = 0, wall = 0;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) data_path = argv[++a];
        else if (!strcmp(argv[a], "--out") && a + 1 < argc) out = argv[++a];
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else {
            fprintf(stderr, "usage: %s [--data PATH] [--out DIR] [--seed S]\n", argv[0]);
            return 2;
        }
    }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (sim_load_digits(ctx, data_path, seed, &data) != 0) {
        fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    snprintf(csv_path, sizeof(csv_path), "%s/sync_vs_async.csv", out);
    if (sim_mkdir(out) != 0) return 1;
    csv = fopen(csv_path, "w");
    if (!csv) {
        fprintf(stderr, "error: cannot write %s\n", csv_path);
        return 1;
    }
    sim_csv_header(csv);

    memset(&base, 0, sizeof(base));
    base.workers = WORKERS;
    base.batch = BATCH;
    base.layers = LAYERS;
    base.num_layers = 2;
    base.optimizer.kind = DSGD_OPT_MOMENTUM;
    base.optimizer.momentum = 0.9f;
    base.optimizer.lr = 0.1f;
    base.steps = 150;
    base.eval_every = 2;
    base.target = 0.85;
    base.net.alpha_s = 50e-6;
    base.net.beta_s_per_byte = 1e-9;
    base.net.gamma_s_per_float = 1e-10;
    base.net.compute.kind = DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL;
    base.net.compute.shift_s = 0.010;
    base.net.compute.mean_s = 0.010;
    base.net.compute.seed = seed;
    base.csv = csv;
    base.trace_until_s = 0.2;
    base.seed = seed;
    for (i = 0; i < 4; ++i) runs[i] = base;
    runs[0].name = "mirrored";
    runs[0].kind = SIM_MIRRORED;
    runs[1].name = "async";
    runs[1].kind = SIM_PS;
    runs[1].policy = DSGD_PS_ASYNC;
    runs[1].optimizer.kind = DSGD_OPT_SGD;
    runs[1].optimizer.momentum = 0;
    runs[1].optimizer.lr = 0.05f;
    runs[1].steps = 0;
    runs[1].eval_every = 2 * WORKERS; /* as many gradients between rows as the synchronous runs */
    runs[2].name = "ssp";
    runs[2].kind = SIM_PS;
    runs[2].policy = DSGD_PS_SSP;
    runs[2].staleness = 3;
    runs[2].optimizer.lr = 0.1f / 4;
    runs[2].steps = 2 * base.steps; /* its steps are shorter: as long a run */
    runs[3].name = "backup";
    runs[3].kind = SIM_PS;
    runs[3].policy = DSGD_PS_BACKUP;
    runs[3].backups = 2;
    runs[3].steps = base.steps * 4 / 3; /* its steps are shorter: as long a run */
    runs[3].optimizer.lr = dsgd_linear_scaled_lr(0.1f, (WORKERS - 2) * BATCH, WORKERS * BATCH);

    printf("%d workers x batch %d, shifted-exponential compute (10 ms + Exp(10 ms)), digits MLP 64-64-10\n",
           WORKERS, BATCH);
    printf("%-9s %10s %12s %14s %10s %10s %8s\n", "run", "updates", "virtual s", "to 85% (s)", "final acc",
           "staleness", "dropped");
    /* mirrored first: async runs for as long (virtual) as it did */
    for (i = 0; i < 4; ++i) {
        snprintf(trace[i], sizeof(trace[i]), "%s/sync_vs_async_%s.json", out, runs[i].name);
        runs[i].trace_path = trace[i];
        if (i == 1) runs[1].max_time_s = t_end;
        if (sim_run(&runs[i], &data, &res[i]) != 0) {
            failed = 1;
            break;
        }
        if (i == 0) t_end = res[0].final_time;
        printf("%-9s %10ld %12.3f %14.3f %10.4f %10.3f %8ld\n", runs[i].name, res[i].updates, res[i].final_time,
               res[i].time_to_target, res[i].final_accuracy, res[i].staleness_mean, res[i].dropped);
        wall += res[i].wall_s;
        fflush(stdout);
    }
    fclose(csv);
    if (!failed) {
        printf("4 runs in %.1f s\nwrote %s and the traces %s/sync_vs_async_*.json\n", wall, csv_path, out);
        if (sim_have_gnuplot()) {
            char script[4096];
            snprintf(png, sizeof(png), "%s/sync_vs_async.png", out);
            snprintf(script, sizeof(script),
                     "set terminal pngcairo size 800,500 noenhanced\nset output '%s'\n"
                     "set datafile separator ','\nset key bottom right\nset grid\n"
                     "set title 'digits MLP, %d workers, shifted-exponential compute (simnet)'\n"
                     "set xlabel 'virtual time (s)'\nset ylabel 'test accuracy'\nset yrange [0.5:1]\n"
                     "set xrange [0:%g]\n"
                     "f='%s'\n"
                     "plot for [r in 'mirrored async ssp backup'] f using 3:(strcol(1) eq r ? $5 : NaN) "
                     "with lines lw 2 title r, 0.85 with lines dt 2 lc 'gray' title '85%%'\n",
                     png, WORKERS, t_end, csv_path);
            if (sim_gnuplot(script) == 0) printf("wrote %s\n", png);
            else printf("gnuplot failed: no PNG\n");
        } else {
            printf("gnuplot not found: no PNG (apt-get install gnuplot-nox)\n");
        }
    }
    sim_data_free(&data);
    dsgd_ctx_destroy(ctx);
    return failed;
}
