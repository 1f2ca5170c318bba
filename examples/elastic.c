/* elastic.c - elastic synchronous training: a replica dies, the others go
   on, and a spare joins later.

   8 mirrored replicas train a 64-32-10 MLP on the vendored UCI digits over
   the simulated cluster (simnet.h: real arithmetic, a virtual clock, the
   same bits every run). At step --kill-step the rank of replica --kill
   is killed (a simnet KILL fault). With desc.elastic.min_replicas set the
   step does not fail: the survivors wait out one deadline (timeout_s of
   virtual time) in the step's first collective, settle (who is gone, no
   message of the failed collective left between them), shrink to 7,
   re-shard the same global batch over themselves, call on_resize and
   retry the step from the weights they hold: no checkpoint, no rollback.
   At step --grow-step a spare rank, kept out of the way since the start
   (dsgd_simnet_spare: it holds back no deadline), is admitted at the
   group's clock (dsgd_simnet_admit) and grown in (dsgd_strategy_grow):
   it receives the weights, the optimizer state and the step count by
   broadcast, and the group re-shards over 8 again.

   It prints one line per step around each change (step, replicas in sync,
   the step's mean loss, the virtual clock; the dropped replica and why,
   from dsgd_step_info.dropped), the test accuracy at the end
   and the wait report (dsgd_strategy_wait_report) since the last resize:
   replica 2's rank computes 1.5 times slower, and the others wait for it.

   Build and run from the repository root:
       make build/examples/elastic && ./build/examples/elastic
   Options: --data PATH (default examples/data/digits.csv), --steps N
   (default 60), --kill-step K (default 20), --kill R (default 5),
   --grow-step G (default 40; past --steps: no grow), --seed S */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { REPLICAS = 8, SPARE = REPLICAS, RANKS = REPLICAS + 1, BATCH = 64 };

/* The global batch of a step, and each replica's rank of the hub (the
   survivors keep theirs: on_resize renumbers the replicas, not the ranks). */
typedef struct run {
    dsgd_simnet *hub;
    long step;
    float x[BATCH * 64], y[BATCH];
    int count;
    int rank_of[RANKS];
} run;

/* The batch function: replica g of W takes its block of the global batch,
   and its rank of the cluster is charged the step's compute. */
static dsgd_result batch_fn(void *user, int replica, int num_replicas, dsgd_batch *out) {
    run *r = (run *)user;
    size_t off = 0, len = 0;
    dsgd_result res = dsgd_simnet_compute(r->hub, r->rank_of[replica], r->step);
    if (res != DSGD_OK) return res; /* killed: this rank's calls fail from now on */
    dsgd_block_range((size_t)r->count, num_replicas, replica, &off, &len);
    out->x = r->x + off * 64;
    out->y = r->y + off;
    out->count = (int)len;
    return DSGD_OK;
}

/* The group changed: survivors[i] is the old replica that is now replica
   i, or -1 for a joiner (the spare rank). */
static void on_resize(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s) {
    run *r = (run *)user;
    int map[RANKS], i;
    (void)s;
    for (i = 0; i < new_world; ++i) map[i] = survivors[i] >= 0 ? r->rank_of[survivors[i]] : SPARE;
    memcpy(r->rank_of, map, sizeof(int) * (size_t)new_world);
    printf("resize: %d -> %d replicas; %s\n", old_world, new_world,
           new_world < old_world ? "the survivors retry the step" : "the joiner has the group's weights");
}

/* The latest virtual clock of the replicas' ranks. */
static double clock_of(const run *r, int n) {
    double t = 0.0;
    int i;
    for (i = 0; i < n; ++i)
        if (dsgd_simnet_time(r->hub, r->rank_of[i]) > t) t = dsgd_simnet_time(r->hub, r->rank_of[i]);
    return t;
}

int main(int argc, char **argv) {
    const char *path = "examples/data/digits.csv", *v;
    long steps = 60, kill_step = 20, grow_step = 40;
    int kill = 5, a, i;
    uint64_t seed = 42;
    static run r;
    double factor[RANKS] = {1, 1, 1.5, 1, 1, 1, 1, 1, 1}; /* replica 2's rank is slower */
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_sampler sampler;
    dsgd_layer_desc layers[2] = {{.units = 32, .activation = DSGD_ACT_RELU}, {.units = 10}};
    dsgd_transport_i ep[RANKS];
    dsgd_strategy *s = NULL;
    dsgd_wait_report rep;
    dsgd_metrics te;

    for (a = 1; a < argc; ++a) {
        if ((v = ex_flag(argc, argv, &a, "--data"))) path = v;
        else if ((v = ex_flag(argc, argv, &a, "--steps"))) steps = atol(v);
        else if ((v = ex_flag(argc, argv, &a, "--kill-step"))) kill_step = atol(v);
        else if ((v = ex_flag(argc, argv, &a, "--kill"))) kill = atoi(v);
        else if ((v = ex_flag(argc, argv, &a, "--grow-step"))) grow_step = atol(v);
        else if ((v = ex_flag(argc, argv, &a, "--seed"))) seed = strtoull(v, NULL, 10);
        else return ex_usage(argv[0], "[--data PATH] [--steps N] [--kill-step K] [--kill R] [--grow-step G] [--seed S]");
    }
    if (steps < 1 || kill_step < 0 || kill < 0 || kill >= REPLICAS || grow_step <= kill_step)
        return ex_usage(argv[0], "[--data PATH] [--steps N >= 1] [--kill-step K >= 0] [--kill R in 0..7] "
                                 "[--grow-step G > K] [--seed S]");
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_digits(ctx, path, seed, &train, &test)) return ex_fail(ctx);

    /* The cluster: 10 us and 1 GB/s links, 2 ms of compute a step, one
       rank killed at its compute of step kill_step, and a spare rank set
       aside before anything runs. */
    dsgd_simnet_fault f = {.kind = DSGD_SIMNET_FAULT_KILL, .rank = kill, .step = kill_step};
    dsgd_simnet_desc sd = {.ranks = RANKS, .alpha_s = 1e-5, .beta_s_per_byte = 1e-9,
                           .compute = {.kind = DSGD_SIMNET_COMPUTE_CONSTANT, .mean_s = 2e-3, .rank_factor = factor},
                           .faults = &f, .num_faults = 1, .park_between_calls = 1};
    if (dsgd_simnet_create(ctx, &sd, &r.hub) != DSGD_OK || dsgd_simnet_spare(r.hub, SPARE) != DSGD_OK)
        return ex_fail(ctx);
    for (i = 0; i < RANKS; ++i) {
        if (dsgd_simnet_endpoint(r.hub, i, &ep[i]) != DSGD_OK) return ex_fail(ctx);
        r.rank_of[i] = i;
    }

    /* Mirrored over the first 8 of the cluster's endpoints (the ninth is
       the spare); elastic down to 4 replicas. */
    dsgd_strategy_desc d = {
        .kind = DSGD_STRATEGY_MIRRORED, .num_replicas = REPLICAS, .endpoints = ep,
        .model = {.input_dim = 64, .layers = layers, .num_layers = 2, .max_batch = BATCH, .seed = seed},
        .optimizer = {.kind = DSGD_OPT_ADAM, .lr = 3e-3f},
        .algorithm = DSGD_ALLREDUCE_RING, .gradient_path = DSGD_GRADIENTS_HOST, .cpu_threads = 1,
        .timeout_s = 0.05, /* the deadline, virtual seconds */
        .elastic = {.min_replicas = 4, .on_resize = on_resize, .user = &r}};
    if (dsgd_strategy_create(ctx, &d, &s) != DSGD_OK ||
        dsgd_sampler_init(ctx, &sampler, train.n, BATCH, seed, 1, 0) != DSGD_OK)
        return ex_fail(ctx);

    for (r.step = 0; r.step < steps; ++r.step) {
        size_t nb = dsgd_sampler_num_batches(&sampler);
        const size_t *idx = NULL;
        dsgd_step_info info;
        dsgd_metrics tr;
        int i;
        dsgd_sampler_set_epoch(&sampler, (uint64_t)((size_t)r.step / nb));
        r.count = (int)dsgd_sampler_batch(&sampler, (size_t)r.step % nb, &idx);
        dsgd_dataset_gather(&train, idx, (size_t)r.count, r.x, r.y);
        if (r.step == grow_step) { /* the spare joins where the group is */
            if (dsgd_simnet_admit(r.hub, SPARE, clock_of(&r, dsgd_strategy_num_replicas(s))) != DSGD_OK ||
                dsgd_strategy_grow(s, &ep[SPARE], 1) != DSGD_OK)
                return ex_fail(ctx);
        }
        if (dsgd_strategy_train_step_fn(s, batch_fn, &r, &info) != DSGD_OK ||
            dsgd_strategy_take_metrics(s, DSGD_METRICS_TRAIN, &tr) != DSGD_OK)
            return ex_fail(ctx);
        if ((r.step >= kill_step - 3 && r.step <= kill_step + 3) || (r.step >= grow_step - 2 && r.step <= grow_step + 2))
            printf("step %3ld  replicas %d  loss %.4f  virtual time %.4f s%s\n", r.step, info.world,
                   tr.loss_sum / tr.count, clock_of(&r, info.world),
                   info.resized ? "  (shrunk)" : r.step == grow_step ? "  (grown)" : "");
        for (i = 0; i < info.dropped; ++i) /* who was dropped, and why */
            printf("          dropped replica %d (%s)\n", info.dropped_rank[i], dsgd_drop_reason_name(info.dropped_why[i]));
    }

    if (!ex_evaluate(dsgd_strategy_model(s, 0), &test, BATCH, &te) ||
        dsgd_strategy_wait_report(s, &rep, NULL, 0) != DSGD_OK)
        return ex_fail(ctx);
    printf("test accuracy %.4f after %ld steps, %d replicas at the end\n", te.correct / te.count, steps,
           dsgd_strategy_num_replicas(s));
    if (rep.worst >= 0)
        printf("waits since the last resize: replica %d made the others wait %.0f%% of the step (%.2f ms a step, %lld "
               "steps)\n", rep.worst, 100.0 * rep.worst_fraction, 1e3 * rep.step_s, (long long)rep.steps);

    dsgd_sampler_free(&sampler);
    dsgd_strategy_destroy(s);
    dsgd_simnet_destroy(r.hub);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return 0;
}
