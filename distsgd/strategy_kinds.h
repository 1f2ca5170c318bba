/* distsgd/strategy_kinds.h - the table of strategy kinds, and dsgd_strategy_create
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   The kinds' parts come above this one (strategy_sync.h: one_device,
   mirrored and multi_worker_mirrored; strategy_central.h: central_storage;
   strategy_ps.h: parameter_server; strategy_local.h: local), and strategy_elastic.h (the shrink of the
   synchronous kinds, armed here); a new kind is a part above this one and a line in
   dsgd__strategy_kinds. dsgd_strategy_create and dsgd_strategy_kind_name are
   declared, with the rest of the strategy's interface, in strategy.h.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_KINDS_IMPL)
#define DSGD__PART_STRATEGY_KINDS_IMPL

/* >>strategy_kinds ---------------------------------------------------------- */

/* The kinds, indexed by dsgd_strategy_kind. */
static const dsgd__strategy_ops *const dsgd__strategy_kinds[DSGD_STRATEGY_COUNT] = {
    &dsgd__one_device_ops, /* DSGD_STRATEGY_ONE_DEVICE */
    &dsgd__mirrored_ops,   /* DSGD_STRATEGY_MIRRORED */
    &dsgd__central_storage_ops, /* DSGD_STRATEGY_CENTRAL_STORAGE */
    &dsgd__multi_worker_ops, /* DSGD_STRATEGY_MULTI_WORKER_MIRRORED */
    &dsgd__parameter_server_ops, /* DSGD_STRATEGY_PARAMETER_SERVER */
    &dsgd__local_ops,            /* DSGD_STRATEGY_LOCAL */
};

DSGD_API const char *dsgd_strategy_kind_name(dsgd_strategy_kind kind) {
    return (int)kind >= 0 && (int)kind < (int)DSGD_STRATEGY_COUNT ? dsgd__strategy_kinds[kind]->name : "unknown";
}

DSGD_API dsgd_result dsgd_strategy_create(dsgd_ctx *ctx, const dsgd_strategy_desc *desc, dsgd_strategy **out) {
    const dsgd__strategy_ops *ops = NULL;
    dsgd_result res;
    if (desc && (int)desc->kind >= 0 && (int)desc->kind < (int)DSGD_STRATEGY_COUNT) ops = dsgd__strategy_kinds[desc->kind];
    if (desc && ops && (res = dsgd__elastic_check(ctx, desc)) != DSGD_OK) return res;
    if ((res = dsgd__strategy_create(ctx, desc, ops, out)) != DSGD_OK) return res;
    if ((res = dsgd__elastic_arm(*out)) != DSGD_OK) { /* ELASTIC in strategy_elastic.h */
        dsgd_strategy_destroy(*out);
        *out = NULL;
    }
    return res;
}

#endif /* DSGD__PART_STRATEGY_KINDS_IMPL */
