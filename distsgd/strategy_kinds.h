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

/* A kind left out of the build (DSGD_NO_PS, DSGD_NO_LOCAL): its row keeps
   its name, and its check refuses it, naming the define. */
#if defined(DSGD_NO_PS) || defined(DSGD_NO_LOCAL)
static dsgd_result dsgd__kind_left_out(dsgd_ctx *ctx, const char *kind, const char *define) {
    return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED, "dsgd_strategy_create: the %s kind was left out of this "
                              "build (%s is defined)", kind, define);
}
#endif
#ifdef DSGD_NO_PS
static dsgd_result dsgd__psk_left_out(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    DSGD__UNUSED(d);
    return dsgd__kind_left_out(ctx, "parameter_server", "DSGD_NO_PS");
}
static const dsgd__strategy_ops dsgd__parameter_server_ops = {"parameter_server", dsgd__psk_left_out, NULL, NULL,
                                                             NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL};
#endif
#ifdef DSGD_NO_LOCAL
static dsgd_result dsgd__local_left_out(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    DSGD__UNUSED(d);
    return dsgd__kind_left_out(ctx, "local", "DSGD_NO_LOCAL");
}
static const dsgd__strategy_ops dsgd__local_ops = {"local", dsgd__local_left_out, NULL, NULL, NULL, NULL, 1, NULL,
                                                  NULL, NULL, NULL, 0, NULL};
#endif
#ifdef DSGD_NO_ELASTIC /* strategy_elastic.h left out: a desc that asks for it is refused */
static dsgd_result dsgd__elastic_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d, const dsgd__strategy_ops *ops) {
    DSGD__UNUSED(ops);
    if (d->elastic.min_replicas == 0) return DSGD_OK;
    return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED, "dsgd_strategy_create: elastic training was left out of "
                              "this build (DSGD_NO_ELASTIC is defined)");
}
static dsgd_result dsgd__elastic_arm(dsgd_strategy *s) {
    DSGD__UNUSED(s);
    return DSGD_OK;
}
#endif

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
    if (out) *out = NULL; /* also when a check below refuses the desc */
    if (desc && (int)desc->kind >= 0 && (int)desc->kind < (int)DSGD_STRATEGY_COUNT) ops = dsgd__strategy_kinds[desc->kind];
    if (desc && ops && (res = dsgd__elastic_check(ctx, desc, ops)) != DSGD_OK) return res;
    if ((res = dsgd__strategy_create(ctx, desc, ops, out)) != DSGD_OK) return res;
    if ((res = dsgd__elastic_arm(*out)) != DSGD_OK) { /* ELASTIC in strategy_elastic.h */
        dsgd_strategy_destroy(*out);
        *out = NULL;
    }
    return res;
}

#endif /* DSGD__PART_STRATEGY_KINDS_IMPL */
