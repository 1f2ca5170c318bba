/* linear_scaling.c - Goyal et al. 2017 ("Accurate, large minibatch SGD"):
   the linear scaling rule (multiply the learning rate by k when the batch
   grows k times) with a gradual warmup keeps accuracy flat as the global
   batch grows; without the warmup the large batches start at a rate too
   high for the untrained network and lose accuracy.

   8 simulated workers (mirrored, ring all-reduce over distsgd/simnet.h)
   train an MLP (784-64-10) on Fashion-MNIST for 8 epochs at global batch
   256, 512, ..., 8192 (8 x 32 ... 8 x 1024 per worker), SGD with momentum
   0.9 at lr 0.05 x batch / 256 (dsgd_linear_scaled_lr), with and without
   a linear warmup from 0 over the first 2 epochs (the optimizer's
   schedule.warmup_steps; Goyal et al. warm up for 5 of 90 epochs). Every
   run sees the same number of samples, so batch 8192 takes 32 times fewer
   steps than 256 (56 against 1872).
   Compute is charged at 20 us per sample per worker (a constant model),
   so the virtual time shows the fewer, larger steps finishing sooner.

   Why Fashion-MNIST: 60000 training images are 7 steps an epoch at batch
   8192 (the vendored digits have 1437, fewer than one such batch); a
   64-unit hidden layer keeps the 12 runs near 50 CPU seconds (two at a
   time, --jobs).

   Writes build/sim/linear_scaling.csv (a row per epoch: run,step,time_s,
   loss,accuracy,staleness,dropped; run = warmup-8192 and so on),
   build/sim/linear_scaling_summary.csv (batch, final test accuracy with
   and without warmup) and, when gnuplot is installed,
   build/sim/linear_scaling.png.

   Run:  make sim      (prepares Fashion-MNIST as make demo does)
   or:   ./build/experiments/linear_scaling [--data DIR] [--out DIR] [--epochs E]
           [--warmup-epochs W] [--lr LR at batch 256] [--seed S] [--jobs J]
   --jobs: runs at a time (default 2; the CSVs do not depend on it). */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "sim_common.h"

#define WORKERS 8
#define NB 6

static const dsgd_layer_desc LAYERS[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};

/* One run: its desc, its rows (a temporary file, appended to the CSV in
   the runs' order) and what it measured. */
typedef struct job {
    char name[64];
    sim_run_desc d;
    FILE *rows;
    sim_result r;
    int rc;
} job;

typedef struct jobs {
    job *j;
    const sim_data *data;
} jobs;

static void job_run(void *user, int i) {
    jobs *q = (jobs *)user;
    job *j = &q->j[i];
    j->d.csv = j->rows;
    j->rc = j->rows ? sim_run(&j->d, q->data, &j->r) : -1;
}

int main(int argc, char **argv) {
    const char *dir = "build/data/fashion-mnist", *out = "build/sim";
    int epochs = 8, warmup_epochs = 2, njobs = 2, a, bi, v, failed = 0;
    float base_lr = 0.05f;
    uint64_t seed = 1;
    dsgd_ctx *ctx;
    sim_data data;
    char csv_path[1024], sum_path[1024];
    FILE *csv, *sum;
    double acc[NB][2], vt[NB][2], wall_all = 0;
    job js[NB * 2];
    jobs q;

    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--data") && a + 1 < argc) dir = argv[++a];
        else if (!strcmp(argv[a], "--out") && a + 1 < argc) out = argv[++a];
        else if (!strcmp(argv[a], "--epochs") && a + 1 < argc) epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--seed") && a + 1 < argc) seed = strtoull(argv[++a], NULL, 10);
        else if (!strcmp(argv[a], "--lr") && a + 1 < argc) base_lr = (float)atof(argv[++a]);
        else if (!strcmp(argv[a], "--warmup-epochs") && a + 1 < argc) warmup_epochs = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--jobs") && a + 1 < argc) njobs = atoi(argv[++a]);
        else {
            fprintf(stderr,
                    "usage: %s [--data DIR] [--out DIR] [--epochs E] [--warmup-epochs W] [--lr LR] [--seed S] "
                    "[--jobs J]\n",
                    argv[0]);
            return 2;
        }
    }
    if (epochs < 1 || njobs < 1 || njobs > 16) return 2;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (sim_load_fashion(ctx, dir, &data) != 0) {
        fprintf(stderr, "error: %s (make demo prepares build/data/fashion-mnist)\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    snprintf(csv_path, sizeof(csv_path), "%s/linear_scaling.csv", out);
    snprintf(sum_path, sizeof(sum_path), "%s/linear_scaling_summary.csv", out);
    if (sim_mkdir(out) != 0) return 1;
    csv = fopen(csv_path, "w");
    sum = fopen(sum_path, "w");
    if (!csv || !sum) {
        fprintf(stderr, "error: cannot write %s\n", csv_path);
        return 1;
    }
    sim_csv_header(csv);
    fprintf(sum, "batch,lr,acc_warmup,acc_no_warmup,virtual_s\n");
    printf("%d workers, Fashion-MNIST MLP 784-64-10, %d epochs, lr %g x batch / 256, momentum 0.9, warmup %d epochs\n",
           WORKERS, epochs, base_lr, warmup_epochs);
    printf("%6s %8s %7s %14s %14s %10s\n", "batch", "lr", "steps", "acc warmup", "acc no warmup", "virtual s");
    /* the 12 runs, two at a time (--jobs): each is a function of its desc,
       its rows go to a file of its own, appended below in the runs' order,
       so the CSV is the same whatever the threads */
    memset(js, 0, sizeof(js));
    for (bi = 0; bi < NB; ++bi) {
        int G = 256 << bi, per = G / WORKERS;
        long steps_per_epoch = (long)(data.train.n / (size_t)G);
        for (v = 0; v < 2; ++v) {
            job *j = &js[bi * 2 + v];
            sim_run_desc *d = &j->d;
            snprintf(j->name, sizeof(j->name), "%s-%d", v == 0 ? "warmup" : "no-warmup", G);
            d->name = j->name;
            d->kind = SIM_MIRRORED;
            d->workers = WORKERS;
            d->batch = per;
            d->layers = LAYERS;
            d->num_layers = 2;
            d->optimizer.kind = DSGD_OPT_MOMENTUM;
            d->optimizer.momentum = 0.9f;
            d->optimizer.lr = dsgd_linear_scaled_lr(base_lr, G, 256);
            if (v == 0) d->optimizer.schedule.warmup_steps = steps_per_epoch * warmup_epochs;
            d->steps = steps_per_epoch * epochs;
            d->eval_every = (int)steps_per_epoch;
            d->target = 2; /* not used */
            d->net.alpha_s = 50e-6;
            d->net.beta_s_per_byte = 1e-9;
            d->net.gamma_s_per_float = 1e-10;
            d->net.compute.kind = DSGD_SIMNET_COMPUTE_CONSTANT;
            d->net.compute.mean_s = 20e-6 * per;
            d->net.compute.seed = seed;
            d->seed = seed;
            j->rows = tmpfile();
        }
    }
    q.j = js;
    q.data = &data;
    sim_parallel(NB * 2, njobs, job_run, &q);
    for (bi = 0; bi < NB * 2; ++bi) {
        if (js[bi].rc != 0) {
            if (!js[bi].rows) fprintf(stderr, "%s: no temporary file\n", js[bi].name);
            failed = 1;
            break;
        }
        sim_append(csv, js[bi].rows);
    }
    for (bi = 0; bi < NB && !failed; ++bi) {
        int G = 256 << bi;
        long steps_per_epoch = (long)(data.train.n / (size_t)G);
        double wall = 0;
        for (v = 0; v < 2; ++v) {
            const sim_result *r = &js[bi * 2 + v].r;
            acc[bi][v] = r->final_accuracy;
            vt[bi][v] = r->final_time;
            wall += r->wall_s;
        }
        printf("%6d %8.3f %7ld %14.4f %14.4f %10.3f\n", G, dsgd_linear_scaled_lr(base_lr, G, 256),
               steps_per_epoch * epochs, acc[bi][0], acc[bi][1], vt[bi][0]);
        wall_all += wall;
        fprintf(sum, "%d,%.4f,%.6f,%.6f,%.6f\n", G, dsgd_linear_scaled_lr(base_lr, G, 256), acc[bi][0], acc[bi][1],
                vt[bi][0]);
        fflush(stdout);
    }
    for (bi = 0; bi < NB * 2; ++bi)
        if (js[bi].rows) fclose(js[bi].rows);
    fclose(csv);
    fclose(sum);
    sim_data_free(&data);
    dsgd_ctx_destroy(ctx);
    if (failed) return 1;
    printf("%d runs in %.1f s\nwrote %s and %s\n", 2 * NB, wall_all, csv_path, sum_path);
    if (sim_have_gnuplot()) {
        char script[4096], png[1024];
        snprintf(png, sizeof(png), "%s/linear_scaling.png", out);
        snprintf(script, sizeof(script),
                 "set terminal pngcairo size 800,500 noenhanced\nset output '%s'\n"
                 "set datafile separator ','\nset key bottom left\nset grid\nset logscale x 2\n"
                 "set title 'linear LR scaling (lr %g x batch/256), %d workers, Fashion-MNIST MLP, %d epochs (simnet)'\n"
                 "set xlabel 'global batch (workers x per-worker batch)'\nset ylabel 'test accuracy'\n"
                 "set yrange [*:*]\nset xrange [181:11585]\n"
                 "f='%s'\n"
                 "plot f every ::1 using 1:3 with linespoints lw 2 pt 7 title 'warmup %d epochs', "
                 "f every ::1 using 1:4 with linespoints lw 2 pt 5 title 'no warmup'\n",
                 png, base_lr, WORKERS, epochs, sum_path, warmup_epochs);
        if (sim_gnuplot(script) == 0) printf("wrote %s\n", png);
        else printf("gnuplot failed: no PNG\n");
    } else {
        printf("gnuplot not found: no PNG (apt-get install gnuplot-nox)\n");
    }
    return 0;
}
