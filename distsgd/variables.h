/* distsgd/variables.h - aggregation and synchronization of distributed variables
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/
#ifndef DSGD__PART_VARIABLES_DECL
#define DSGD__PART_VARIABLES_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- variables */

/* dsgd_aggregation (how the replicas' values combine) is declared with the
   model's variables, in model.h. */

/* When the replicas' copies of a variable are synchronised
   (tf.VariableSynchronization). */
typedef enum dsgd_synchronization {
    DSGD_SYNC_AUTO = 0,     /* ON_WRITE under every strategy here */
    DSGD_SYNC_NONE = 1,     /* rejected, as tf.distribute rejects it under a strategy */
    DSGD_SYNC_ON_WRITE = 2, /* mirrored: every write is aggregated and applied to all copies */
    DSGD_SYNC_ON_READ = 3   /* each replica writes its own copy; reads from the strategy aggregate */
} dsgd_synchronization;
#define DSGD_SYNC_COUNT (DSGD_SYNC_ON_READ + 1)

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

DSGD_API const char *dsgd_aggregation_name(dsgd_aggregation a) {
    static const char *const names[DSGD_AGG_COUNT] = {"NONE", "SUM", "MEAN", "ONLY_FIRST_REPLICA"};
    return dsgd__agg_valid(a) ? names[a] : "?";
}

DSGD_API const char *dsgd_synchronization_name(dsgd_synchronization sy) {
    static const char *const names[DSGD_SYNC_COUNT] = {"AUTO", "NONE", "ON_WRITE", "ON_READ"};
    return (int)sy >= 0 && (int)sy < (int)DSGD_SYNC_COUNT ? names[sy] : "?";
}

#endif /* DSGD__PART_VARIABLES_IMPL */
