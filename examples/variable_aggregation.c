/* variable_aggregation.c - what each replica holds under each variable
   synchronization and aggregation (tf.VariableSynchronization x
   tf.VariableAggregation), in one table.

   Four mirrored replicas share a distributed variable. Inside
   dsgd_strategy_run (replica context) replica r writes r + 1, either with
   assign or with assign_add onto an initial value of 10. The table shows each
   replica's copy afterwards and what a cross-replica read
   (dsgd_strategy_read_variable, like strategy.reduce) returns:
     ON_WRITE  every write is a collective: the replicas' values are combined
               (SUM, MEAN, or replica 0's for ONLY_FIRST_REPLICA) and every
               copy receives the result, so the copies never differ;
     ON_READ   each replica writes only its own copy; the copies differ, and
               the aggregation is applied when the variable is read across
               replicas (this is how the training metrics are kept).
   Every copy starts at the variable's initial value. Then the combinations
   distsgd rejects, with their error messages (the ON_WRITE write with
   aggregation NONE is rejected by us, not by TF 2.21, where each replica
   then updates only its own copy), and the one cross-replica write that is
   not a plain copy.
   The model is irrelevant here (a tiny one; the strategy needs one).

   Build and run from the repository root:
       make build/examples/variable_aggregation && ./build/examples/variable_aggregation */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <stdio.h>
#include <string.h>

enum { N = 4 };

typedef struct job {
    int id, add;
    dsgd_result res[N];
} job;

/* Replica context: replica r writes (or adds) r + 1. */
static dsgd_result write_rank(dsgd_replica *rep, void *user) {
    job *j = (job *)user;
    int r = dsgd_replica_id(rep);
    float v = (float)(r + 1);
    j->res[r] = j->add ? dsgd_replica_assign_add(rep, j->id, &v) : dsgd_replica_assign(rep, j->id, &v);
    return j->res[r];
}

/* One row of the table. A failed dsgd_strategy_run fails the strategy
   (dsgd_strategy_failed), so after the rejected write *s is replaced by a
   new one. Returns 0 when that cannot be created. */
static int row(dsgd_ctx *ctx, dsgd_strategy **s, const dsgd_strategy_desc *sd, dsgd_synchronization sync,
               dsgd_aggregation agg, int add) {
    char name[64];
    float init = 10.0f, v;
    dsgd_dvar_desc d = {.name = name, .count = 1, .synchronization = sync, .aggregation = agg, .initial_value = &init};
    job j = {.add = add};
    int id, r;
    snprintf(name, sizeof(name), "%s_%s_%s", dsgd_synchronization_name(sync), dsgd_aggregation_name(agg),
             add ? "add" : "assign");
    printf("%-9s %-19s %-10s ", dsgd_synchronization_name(sync), dsgd_aggregation_name(agg),
           add ? "assign_add" : "assign");
    if (dsgd_strategy_create_variable(*s, &d, &id) != DSGD_OK) {
        printf("creation rejected\n          %s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    j.id = id;
    if (dsgd_strategy_run(*s, write_rank, &j) != DSGD_OK) {
        printf("write rejected on every replica (%s)\n          %s\n",
               dsgd_result_string(j.res[0]), dsgd_ctx_last_error(ctx));
        dsgd_strategy_destroy(*s);
        return dsgd_strategy_create(ctx, sd, s) == DSGD_OK;
    }
    for (r = 0; r < N; ++r) {
        dsgd_strategy_read_local(*s, id, r, &v);
        printf("%6g", (double)v);
    }
    dsgd_strategy_read_variable(*s, id, &v);
    printf("  | %6g\n", (double)v);
    return 1;
}

/* The other combinations distsgd rejects, with their messages. */
static void other_rejections(dsgd_ctx *ctx, dsgd_strategy *s) {
    dsgd_dvar_desc none = {.name = "sync_none", .count = 1, .synchronization = DSGD_SYNC_NONE,
                           .aggregation = DSGD_AGG_SUM};
    dsgd_dvar_desc on_read = {.name = "trainable_on_read", .count = 1, .synchronization = DSGD_SYNC_ON_READ,
                              .aggregation = DSGD_AGG_SUM, .trainable = 1};
    int id;
    printf("other rejected combinations:\n");
    if (dsgd_strategy_create_variable(s, &none, &id) != DSGD_OK) printf("  %s\n", dsgd_ctx_last_error(ctx));
    if (dsgd_strategy_create_variable(s, &on_read, &id) != DSGD_OK) printf("  %s\n", dsgd_ctx_last_error(ctx));
    if (dsgd_strategy_set_aggregation(s, "dense0/kernel", DSGD_AGG_NONE, DSGD_SYNC_AUTO) != DSGD_OK)
        printf("  %s\n", dsgd_ctx_last_error(ctx));
}

/* Cross-replica assign: a plain copy, except ON_READ SUM, which stores
   value / N per copy so that the read (the sum) gives the value back. */
static void cross_replica_assign(dsgd_strategy *s) {
    dsgd_dvar_desc d = {.name = "xassign", .count = 1, .synchronization = DSGD_SYNC_ON_READ,
                        .aggregation = DSGD_AGG_SUM};
    float v = 8.0f, local[N];
    int id, r;
    if (dsgd_strategy_create_variable(s, &d, &id) == DSGD_OK && dsgd_strategy_assign_variable(s, id, &v) == DSGD_OK) {
        for (r = 0; r < N; ++r) dsgd_strategy_read_local(s, id, r, &local[r]);
        dsgd_strategy_read_variable(s, id, &v);
        printf("\ncross-replica assign of 8 to an ON_READ SUM variable: copies %g %g %g %g, read %g\n",
               (double)local[0], (double)local[1], (double)local[2], (double)local[3], (double)v);
    }
}

int main(void) {
    static const dsgd_layer_desc layers[1] = {{.units = 2}};
    static const dsgd_aggregation aggs[4] = {DSGD_AGG_SUM, DSGD_AGG_MEAN, DSGD_AGG_ONLY_FIRST_REPLICA,
                                             DSGD_AGG_NONE};
    dsgd_strategy_desc sd = {.kind = DSGD_STRATEGY_MIRRORED,
                             .num_replicas = N,
                             .model = {.input_dim = 2, .layers = layers, .num_layers = 1, .max_batch = 1}};
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    int si, ai, add;

    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_strategy_create(ctx, &sd, &s) != DSGD_OK) {
        fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }

    printf("%d mirrored replicas; replica r writes r+1 (assign), or adds r+1 to 10 (assign_add)\n\n", N);
    printf("%-9s %-19s %-10s %6s%6s%6s%6s  | %s\n", "sync", "aggregation", "write", "r0", "r1", "r2", "r3",
           "cross-replica read");
    for (si = 0; si < 2; ++si) {
        dsgd_synchronization sync = si == 0 ? DSGD_SYNC_ON_WRITE : DSGD_SYNC_ON_READ;
        for (ai = 0; ai < 4; ++ai)
            for (add = 0; add < 2; ++add) {
                if (aggs[ai] == DSGD_AGG_NONE && add) continue; /* rejected the same way */
                if (!row(ctx, &s, &sd, sync, aggs[ai], add)) {
                    fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx));
                    return 1;
                }
            }
        printf("\n");
    }
    printf("(every copy starts at the initial value, so ON_READ SUM after assign_add reads\n"
           " %d x 10 + (1 + 2 + 3 + 4) = 50)\n\n", N);

    other_rejections(ctx, s);
    cross_replica_assign(s);

    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return 0;
}
