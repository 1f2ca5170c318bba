/* backup_workers.c - synchronous training with backup workers (Chen et al.
   2016, "Revisiting distributed synchronous SGD"): P = N + b workers, each
   step applies the first N gradients and drops the b late ones, so no step
   waits for the slowest b workers.

   Sweep: b in {0, 1, 2, 4} at P = 8 and P = 16, and asynchronous training
   at the same P, on a simulated cluster (distsgd/simnet.h) with
   shifted-exponential compute times (10 ms + Exp(mean 10 ms) per worker
   and step) and the parameter-server engine (distsgd/ps.h, one server).
   Each run trains the digits MLP (64-64-10, 8 samples per worker) until its
   test accuracy reaches 85% and reports that virtual time, averaged over
   SEEDS seeds (the seed sets the weights, the batches and the compute
   times). Sync rows use SGD with momentum 0.9 at lr 0.1 x N / 16 (the
   linear scaling rule for the N x 8 samples a step averages); async uses
   lr 0.05 without momentum, as experiments/sync_vs_async_sim.c.

   The trade-off: a larger b makes each step shorter (it ends at the N-th
   of P arrivals) but averages fewer samples. The engine runs TF's
   protocol (SyncReplicasOptimizer): a late worker finishes its stale
   gradient, which is dropped, before it pulls, so it starts the next step
   late. The order statistic 10 ms + 10 ms x (H_P - H_b) is the mean step
   only when late workers abandon their gradient and all restart together
   (dsgd_ps_desc.backup_cancel); under TF's protocol the step is longer:
   with pure Exp(mu) compute, by 12.5%, 26% and 63% at b = 1, 2 and 4
   (P = 8; the formula is in ps.h, UPDATE POLICIES). Digits trains in a few hundred updates, so a run takes a
   fraction of a second of real time, and 5 seeds make the averages
   meaningful.

   Writes build/sim/backup_workers.csv (every run's rows: run,step,time_s,
   loss,accuracy,staleness,dropped, run = P16-b2-s3 and so on),
   build/sim/backup_workers_summary.csv (P,b,mean s to 85%, per seed) and,
   when gnuplot is installed, build/sim/backup_workers.png.

   Run:  make sim      (all three experiments)
   or:   ./build/experiments/backup_workers [--data PATH] [--out DIR] [--seeds K] */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "sim_common.h"

#define BATCH 8
#define MAX_SEEDS 16

static const dsgd_layer_desc LAYERS[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};
static const int PS_[2] = {8, 16};
static const int BS[4] = {0, 1, 2, 4};

int main(int argc, char **argv) {
    const char *data_path = "examples/data/digits.csv", *out = "build/sim";
    int seeds = 5, a, pi, bi, k, failed = 0;
    char csv_path[1024], sum_path[1024], name[64];
    FILE *csv, *sum;
    double mean[2][5], t0 = dsgd_now();
    sim_run_desc d;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) data_path = argv[++a];
        else if (!strcmp(argv[a], "--out") && a + 1 < argc) out = argv[++a];
        else if (!strcmp(argv[a], "--seeds") && a + 1 < argc) seeds = atoi(argv[++a]);
        else {
            fprintf(stderr, "usage: %s [--data PATH] [--out DIR] [--seeds K]\n", argv[0]);
            return 2;
        }
    }
    if (seeds < 1 || seeds > MAX_SEEDS) {
        fprintf(stderr, "--seeds: 1..%d\n", MAX_SEEDS);
        return 2;
    }
    snprintf(csv_path, sizeof(csv_path), "%s/backup_workers.csv", out);
    snprintf(sum_path, sizeof(sum_path), "%s/backup_workers_summary.csv", out);
    if (sim_mkdir(out) != 0) return 1;
    csv = fopen(csv_path, "w");
    sum = fopen(sum_path, "w");
    if (!csv || !sum) {
        fprintf(stderr, "error: cannot write %s\n", csv_path);
        return 1;
    }
    sim_csv_header(csv);
    fprintf(sum, "P,b,mean_s_to_85");
    for (k = 0; k < seeds; ++k) fprintf(sum, ",seed%d", k + 1);
    fprintf(sum, "\n");

    printf("virtual seconds to 85%% test accuracy (digits MLP, 10 ms + Exp(10 ms) compute), mean of %d seeds\n", seeds);
    printf("%4s %6s %10s %10s   per seed\n", "P", "b", "mean s", "mean steps");
    for (pi = 0; pi < 2 && !failed; ++pi) {
        for (bi = 0; bi < 5 && !failed; ++bi) { /* bi 4: async */
            int P = PS_[pi], async = bi == 4;
            double t_sum = 0, steps_sum = 0, t[MAX_SEEDS];
            for (k = 0; k < seeds && !failed; ++k) {
                dsgd_ctx *ctx;
                sim_data data;
                sim_result r;
                uint64_t seed = (uint64_t)k + 1;
                if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
                if (sim_load_digits(ctx, data_path, seed, &data) != 0) {
                    fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
                    return 1;
                }
                memset(&d, 0, sizeof(d));
                if (async) snprintf(name, sizeof(name), "P%d-async-s%d", P, k + 1);
                else snprintf(name, sizeof(name), "P%d-b%d-s%d", P, BS[bi], k + 1);
                d.name = name;
                d.kind = SIM_PS;
                d.workers = P;
                d.batch = BATCH;
                d.layers = LAYERS;
                d.num_layers = 2;
                d.target = 0.85;
                d.stop_at_target = 1;
                d.net.alpha_s = 50e-6;
                d.net.beta_s_per_byte = 1e-9;
                d.net.gamma_s_per_float = 1e-10;
                d.net.compute.kind = DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL;
                d.net.compute.shift_s = 0.010;
                d.net.compute.mean_s = 0.010;
                d.net.compute.seed = seed;
                d.csv = csv;
                d.seed = seed;
                if (async) {
                    d.policy = DSGD_PS_ASYNC;
                    d.optimizer.kind = DSGD_OPT_SGD;
                    d.optimizer.lr = 0.05f;
                    d.max_time_s = 60;
                    d.eval_every = P;
                } else {
                    d.policy = DSGD_PS_BACKUP;
                    d.backups = BS[bi];
                    d.optimizer.kind = DSGD_OPT_MOMENTUM;
                    d.optimizer.momentum = 0.9f;
                    d.optimizer.lr = 0.1f * (float)(P - BS[bi]) / 16.0f;
                    d.steps = 3000;
                    d.eval_every = 1;
                }
                if (sim_run(&d, &data, &r) != 0) failed = 1;
                else if (r.time_to_target < 0) {
                    fprintf(stderr, "%s: 85%% not reached\n", name);
                    failed = 1;
                }
                t[k] = r.time_to_target;
                t_sum += r.time_to_target;
                steps_sum += (double)r.steps_to_target;
                sim_data_free(&data);
                dsgd_ctx_destroy(ctx);
            }
            if (failed) break;
            mean[pi][bi] = t_sum / seeds;
            if (async) {
                printf("%4d %6s %10.3f %10.0f  ", P, "async", mean[pi][bi], steps_sum / seeds);
                fprintf(sum, "%d,async,%.6f", P, mean[pi][bi]);
            } else {
                printf("%4d %6d %10.3f %10.1f  ", P, BS[bi], mean[pi][bi], steps_sum / seeds);
                fprintf(sum, "%d,%d,%.6f", P, BS[bi], mean[pi][bi]);
            }
            for (k = 0; k < seeds; ++k) {
                printf(" %.3f", t[k]);
                fprintf(sum, ",%.6f", t[k]);
            }
            printf("\n");
            fprintf(sum, "\n");
            fflush(stdout);
        }
    }
    fclose(csv);
    fclose(sum);
    if (failed) return 1;
    for (pi = 0; pi < 2; ++pi) {
        int best = 0;
        for (bi = 1; bi < 4; ++bi)
            if (mean[pi][bi] < mean[pi][best]) best = bi;
        printf("P = %d: best b = %d (%.3f s) vs b = 0 %.3f s (%.2fx) and async %.3f s (%.2fx)\n", PS_[pi], BS[best],
               mean[pi][best], mean[pi][0], mean[pi][0] / mean[pi][best], mean[pi][4], mean[pi][4] / mean[pi][best]);
    }
    printf("%d runs in %.1f s\nwrote %s and %s\n", 10 * seeds, dsgd_now() - t0, csv_path, sum_path);
    if (sim_have_gnuplot()) {
        char script[4096], png[1024];
        snprintf(png, sizeof(png), "%s/backup_workers.png", out);
        snprintf(script, sizeof(script),
                 "set terminal pngcairo size 800,500 noenhanced\nset output '%s'\n"
                 "set datafile separator ','\nset key bottom left\nset grid\n"
                 "set title 'sync with b backup workers (P = N + b), digits MLP, mean of %d seeds (simnet)'\n"
                 "set xlabel 'backup workers b'\nset ylabel 'virtual seconds to 85%% test accuracy'\n"
                 "set xrange [-0.5:4.5]\nset yrange [0:*]\nset xtics (0, 1, 2, 4)\n"
                 "f='%s'\n"
                 "plot f every ::1 using ($1 == 8 && strcol(2) ne 'async' ? $2 : NaN):3 with linespoints lw 2 pt 7 title 'P = 8', "
                 "f every ::1 using ($1 == 16 && strcol(2) ne 'async' ? $2 : NaN):3 with linespoints lw 2 pt 7 title 'P = 16', "
                 "%g with lines dt 2 lw 2 lc 1 title 'async, P = 8', %g with lines dt 2 lw 2 lc 2 title 'async, P = 16'\n",
                 png, seeds, sum_path, mean[0][4], mean[1][4]);
        if (sim_gnuplot(script) == 0) printf("wrote %s\n", png);
        else printf("gnuplot failed: no PNG\n");
    } else {
        printf("gnuplot not found: no PNG (apt-get install gnuplot-nox)\n");
    }
    return 0;
}
