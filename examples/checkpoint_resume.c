/* checkpoint_resume.c - stop a run, resume it from its checkpoint, get the same bits.

   Two mirrored replicas train a 64-64-10 MLP with Adam on the vendored UCI
   digits, drawing batches from a shuffling sampler (dsgd_sampler_next). The
   run stops halfway: dsgd_strategy_save writes the weights, the optimizer's
   state and step, the metrics, the sampler's epoch and cursor and the
   program's own counter. Everything is then destroyed, as if the process
   had died; a new strategy restores the checkpoint and trains the second
   half. A third run trains all the way without stopping, and the program
   checks that both end with the same weights, bit for bit.

   Build and run from the repository root:
       make build/examples/checkpoint_resume && ./build/examples/checkpoint_resume
   Options: --data PATH (default examples/data/digits.csv), --steps N (default
   400), --ckpt PATH (default checkpoint_resume.ckpt in the current directory) */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"
#include "common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH 64

typedef struct run {
    dsgd_ctx *ctx;
    dsgd_strategy *s;
    dsgd_sampler smp;
    uint64_t steps_done; /* the program's own state, saved as the user section */
} run;

/* Prints the run's last error; returns 1. */
static int fail(run *r) {
    return ex_fail(r->ctx);
}

/* A fresh run: its own context, 2 mirrored replicas of the MLP, a sampler. */
static int run_start(run *r, const dsgd_dataset *train) {
    static const dsgd_layer_desc layers[2] = {{.units = 64, .activation = DSGD_ACT_RELU}, {.units = 10}};
    dsgd_strategy_desc d = {
        .kind = DSGD_STRATEGY_MIRRORED,
        .num_replicas = 2,
        .model = {.input_dim = 64, .layers = layers, .num_layers = 2, .max_batch = BATCH / 2, .seed = 42},
        .optimizer = {.kind = DSGD_OPT_ADAM, .lr = 3e-3f},
    };
    memset(r, 0, sizeof(*r));
    if (dsgd_ctx_create(NULL, &r->ctx) != DSGD_OK) return 1;
    if (dsgd_strategy_create(r->ctx, &d, &r->s) != DSGD_OK ||
        dsgd_sampler_init(r->ctx, &r->smp, train->n, BATCH, 7, 1, 0) != DSGD_OK)
        return fail(r);
    return 0;
}

/* Destroys everything the run holds. */
static void run_end(run *r) {
    dsgd_sampler_free(&r->smp);
    dsgd_strategy_destroy(r->s);
    dsgd_ctx_destroy(r->ctx);
}

/* What the checkpoint carries besides the strategy's state. */
static dsgd_checkpoint_extra run_extra(run *r) {
    dsgd_checkpoint_extra x = {.sampler = &r->smp, .user = &r->steps_done, .user_bytes = sizeof(r->steps_done)};
    return x;
}

/* Trains until steps_done reaches `until`, epoch after epoch. */
static int run_train(run *r, const dsgd_dataset *train, uint64_t until) {
    float x[BATCH * 64], y[BATCH];
    while (r->steps_done < until) {
        const size_t *idx;
        size_t k = dsgd_sampler_next(&r->smp, &idx);
        if (k == 0) { /* the epoch is over */
            dsgd_sampler_set_epoch(&r->smp, r->smp.epoch + 1);
            continue;
        }
        dsgd_dataset_gather(train, idx, k, x, y);
        if (dsgd_strategy_train_step(r->s, x, y, (int)k, NULL) != DSGD_OK) return fail(r);
        r->steps_done++;
    }
    return 0;
}

/* The run's test accuracy (-1 when evaluation failed). */
static double run_test_accuracy(run *r, const dsgd_dataset *test) {
    dsgd_metrics m;
    size_t i;
    for (i = 0; i < test->n; i += BATCH) {
        int n = (int)(test->n - i < BATCH ? test->n - i : BATCH);
        if (dsgd_strategy_eval_batch(r->s, test->x + i * test->dim, test->y + i, n) != DSGD_OK) return -1.0;
    }
    dsgd_strategy_take_metrics(r->s, DSGD_METRICS_EVAL, &m);
    return m.correct / m.count;
}

int main(int argc, char **argv) {
    const char *path = "examples/data/digits.csv", *ckpt = "checkpoint_resume.ckpt";
    uint64_t steps = 400;
    dsgd_ctx *ctx = NULL;
    dsgd_dataset train, test;
    dsgd_checkpoint_extra x;
    run a, b;
    float *wa, *wb;
    size_t np;
    int i;
    const char *v;
    for (i = 1; i < argc; ++i) {
        if ((v = ex_flag(argc, argv, &i, "--data"))) path = v;
        else if ((v = ex_flag(argc, argv, &i, "--steps"))) steps = strtoull(v, NULL, 10);
        else if ((v = ex_flag(argc, argv, &i, "--ckpt"))) ckpt = v;
        else return ex_usage(argv[0], "[--data PATH] [--steps N] [--ckpt PATH]");
    }
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (!ex_load_digits(ctx, path, 42, &train, &test)) return ex_fail(ctx);

    /* the first half, then a checkpoint, then nothing left in memory */
    if (run_start(&a, &train) || run_train(&a, &train, steps / 2)) return 1;
    x = run_extra(&a);
    if (dsgd_strategy_save(a.s, ckpt, &x) != DSGD_OK) return fail(&a);
    printf("stopped after %llu steps (epoch %llu, sample %zu of it); saved %s\n", (unsigned long long)a.steps_done,
           (unsigned long long)a.smp.epoch, a.smp.cursor, ckpt);
    run_end(&a);

    /* a new strategy resumes from the file */
    if (run_start(&b, &train)) return 1;
    x = run_extra(&b);
    if (dsgd_strategy_restore(b.s, ckpt, &x) != DSGD_OK) return fail(&b);
    printf("resumed at step %llu, epoch %llu, sample %zu\n", (unsigned long long)b.steps_done,
           (unsigned long long)b.smp.epoch, b.smp.cursor);
    if (run_train(&b, &train, steps)) return 1;
    printf("resumed run:       test accuracy %.4f after %llu steps\n", run_test_accuracy(&b, &test),
           (unsigned long long)b.steps_done);

    /* the same run without stopping */
    if (run_start(&a, &train) || run_train(&a, &train, steps)) return 1;
    printf("uninterrupted run: test accuracy %.4f after %llu steps\n", run_test_accuracy(&a, &test),
           (unsigned long long)a.steps_done);

    np = dsgd_model_num_params(dsgd_strategy_model(a.s, 0));
    wa = (float *)malloc(np * sizeof(float));
    wb = (float *)malloc(np * sizeof(float));
    if (!wa || !wb || dsgd_model_get_params(dsgd_strategy_model(a.s, 0), wa, np) != DSGD_OK ||
        dsgd_model_get_params(dsgd_strategy_model(b.s, 0), wb, np) != DSGD_OK)
        return 1;
    printf("the %zu weights are %s\n", np,
           memcmp(wa, wb, np * sizeof(float)) == 0 ? "bitwise equal" : "DIFFERENT (a bug: please report it)");
    i = memcmp(wa, wb, np * sizeof(float)) != 0;
    remove(ckpt);
    free(wa);
    free(wb);
    run_end(&a);
    run_end(&b);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
    return i;
}
