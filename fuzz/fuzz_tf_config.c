/* fuzz/fuzz_tf_config.c - libFuzzer target: dsgd_tf_config_parse on any bytes.

   The input is the TF_CONFIG text itself. The only results allowed are
   DSGD_OK, DSGD_ERR_FORMAT (malformed JSON) and DSGD_ERR_INVALID_ARGUMENT
   (a rule broken); an error must leave the config empty. An accepted
   config must keep TF's rules: at most one chief and one evaluator, the
   task's index below its job's size, the rank layout and is_chief as
   documented, and every address (and rpc_layer) a NUL-terminated string
   inside the input's length. Run: make fuzz (FUZZ_SECONDS=N). */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include "fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_config(dsgd_ctx *ctx, const dsgd_cluster_config *c, size_t size) {
    int t, i, chiefs = c->num_tasks[DSGD_TASK_CHIEF], workers = c->num_tasks[DSGD_TASK_WORKER];
    size_t total = 0;
    if (!c->storage) fuzz_fail(ctx, DSGD_OK, "accepted without storage");
    for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t) {
        if (c->num_tasks[t] < 0 || (c->num_tasks[t] == 0) != (c->addresses[t] == NULL))
            fuzz_fail(ctx, DSGD_OK, "a job's size and addresses disagree");
        for (i = 0; i < c->num_tasks[t]; ++i) {
            size_t n = strlen(c->addresses[t][i]); /* ASan: the NUL is inside the block */
            if (n >= size) fuzz_fail(ctx, DSGD_OK, "an address longer than the input");
            total += n;
        }
    }
    if (total > size) fuzz_fail(ctx, DSGD_OK, "more address bytes than input bytes");
    if (c->rpc_layer && strlen(c->rpc_layer) >= size) fuzz_fail(ctx, DSGD_OK, "an rpc_layer longer than the input");
    if (chiefs > 1) fuzz_fail(ctx, DSGD_OK, "accepted two chiefs");
    if (c->num_tasks[DSGD_TASK_EVALUATOR] > 1) fuzz_fail(ctx, DSGD_OK, "accepted two evaluators");
    if (c->task_type == DSGD_TASK_NONE) {
        for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t)
            if (c->num_tasks[t]) fuzz_fail(ctx, DSGD_OK, "accepted a cluster without a task");
        if (c->rank != 0 || c->num_workers_total != 1 || !c->is_chief || c->task_index != 0)
            fuzz_fail(ctx, DSGD_OK, "a single process that is not rank 0 of 1, the chief");
        return;
    }
    if ((int)c->task_type < 0 || (int)c->task_type >= DSGD_TASK_TYPE_COUNT)
        fuzz_fail(ctx, DSGD_OK, "accepted an unknown task type");
    if (c->task_index < 0 || c->task_index >= c->num_tasks[c->task_type])
        fuzz_fail(ctx, DSGD_OK, "accepted an index outside its job");
    if (c->num_workers_total != (c->task_type == DSGD_TASK_EVALUATOR ? 1 : chiefs + workers))
        fuzz_fail(ctx, DSGD_OK, "num_workers_total is not chief + workers (1 for the evaluator)");
    switch (c->task_type) {
    case DSGD_TASK_CHIEF:
        if (c->rank != 0 || !c->is_chief) fuzz_fail(ctx, DSGD_OK, "the chief is not rank 0 and chief");
        break;
    case DSGD_TASK_WORKER:
        if (c->rank != chiefs + c->task_index) fuzz_fail(ctx, DSGD_OK, "a worker's rank is not chief + index");
        if (c->is_chief != (chiefs == 0 && c->task_index == 0)) fuzz_fail(ctx, DSGD_OK, "a worker's is_chief is wrong");
        break;
    case DSGD_TASK_PS:
        if (c->rank != chiefs + workers + c->task_index || c->is_chief)
            fuzz_fail(ctx, DSGD_OK, "a ps's rank or is_chief is wrong");
        break;
    default:
        if (c->rank != 0 || !c->is_chief) fuzz_fail(ctx, DSGD_OK, "the evaluator is not rank 0 and chief");
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsgd_ctx *ctx = fuzz_ctx();
    dsgd_cluster_config c;
    dsgd_result r = dsgd_tf_config_parse(ctx, (const char *)data, size, &c);
    int t;
    if (r == DSGD_OK) {
        check_config(ctx, &c, size);
    } else if (r != DSGD_ERR_FORMAT && r != DSGD_ERR_INVALID_ARGUMENT) {
        fuzz_fail(ctx, r, "rejected with a result other than DSGD_ERR_FORMAT or DSGD_ERR_INVALID_ARGUMENT");
    } else {
        if (c.storage || c.rpc_layer) fuzz_fail(ctx, r, "a rejected parse left memory in *out");
        for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t)
            if (c.num_tasks[t] || c.addresses[t]) fuzz_fail(ctx, r, "a rejected parse left a job in *out");
    }
    dsgd_cluster_config_free(&c);
    dsgd_ctx_destroy(ctx);
    return 0;
}
