/* distsgd/variables.h - aggregation and synchronization of distributed variables
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/
#ifndef DSGD__PART_VARIABLES_DECL
#define DSGD__PART_VARIABLES_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- variables */

/* How the replicas' values of a variable combine. For variables created
   with dsgd_strategy_create_variable and written in replica context this is
   tf.VariableAggregation's meaning. For model variables it says how the
   gradients combine (dsgd_strategy_set_aggregation), which is ours: Keras
   ignores a variable's aggregation there. */
typedef enum dsgd_aggregation {
    DSGD_AGG_NONE = 0,
    DSGD_AGG_SUM = 1,
    DSGD_AGG_MEAN = 2,
    DSGD_AGG_ONLY_FIRST_REPLICA = 3
} dsgd_aggregation;

/* When the replicas' copies of a variable are synchronised
   (tf.VariableSynchronization). */
typedef enum dsgd_synchronization {
    DSGD_SYNC_AUTO = 0,     /* ON_WRITE under every strategy here */
    DSGD_SYNC_NONE = 1,     /* rejected, as tf.distribute rejects it under a strategy */
    DSGD_SYNC_ON_WRITE = 2, /* mirrored: every write is aggregated and applied to all copies */
    DSGD_SYNC_ON_READ = 3   /* each replica writes its own copy; reads from the strategy aggregate */
} dsgd_synchronization;

/* "SUM", "ON_READ", ...; "?" for other values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_aggregation_name(dsgd_aggregation a);
DSGD_API const char *dsgd_synchronization_name(dsgd_synchronization s);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_VARIABLES_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_VARIABLES_IMPL)
#define DSGD__PART_VARIABLES_IMPL

static int dsgd__agg_valid(dsgd_aggregation a) {
    return a == DSGD_AGG_NONE || a == DSGD_AGG_SUM || a == DSGD_AGG_MEAN || a == DSGD_AGG_ONLY_FIRST_REPLICA;
}

DSGD_API const char *dsgd_aggregation_name(dsgd_aggregation a) {
    switch (a) {
    case DSGD_AGG_NONE: return "NONE";
    case DSGD_AGG_SUM: return "SUM";
    case DSGD_AGG_MEAN: return "MEAN";
    case DSGD_AGG_ONLY_FIRST_REPLICA: return "ONLY_FIRST_REPLICA";
    default: return "?";
    }
}

DSGD_API const char *dsgd_synchronization_name(dsgd_synchronization s) {
    switch (s) {
    case DSGD_SYNC_AUTO: return "AUTO";
    case DSGD_SYNC_NONE: return "NONE";
    case DSGD_SYNC_ON_WRITE: return "ON_WRITE";
    case DSGD_SYNC_ON_READ: return "ON_READ";
    default: return "?";
    }
}

#endif /* DSGD__PART_VARIABLES_IMPL */
