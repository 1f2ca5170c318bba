/* distsgd/group.h - rank groups: each member's context, backend, model and endpoint, made one way for every kind
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   RANK GROUPS

     A strategy's replicas, the cluster coordinator's workers and servers,
     and the servers of the parameter-server strategy are the members of a
     rank group. What each member owns is made here, once for all of them:

       - a context labelled "<role> <i>" with the creator's logger;
       - a backend (members that compute): backend_factory's, or a CPU
         backend with the one thread rule: cpu_threads threads, or, when it
         is 0, the online cores shared out among the members of this
         process that compute, at least one each (dsgd_cpu_count() / N);
       - a model from the desc on that backend (dsgd_model_create applies
         max_batch's default, DSGD_DEFAULT_MAX_BATCH, so nobody else does);
       - an endpoint: the one given, or one of a loopback of the group's
         own (dsgd__group_endpoints).

     The threads stay with their kinds: a strategy's replicas wait for the
     next step's job, the coordinator's workers for closures, servers serve.
     This part declares nothing public.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_GROUP_IMPL)
#define DSGD__PART_GROUP_IMPL

/* >>group ------------------------------------------------------------------- */

/* The one CPU-thread rule: requested threads, or 0: the cores shared out
   among `sharing` members, at least 1. */
static int dsgd__group_cpu_threads(int requested, int sharing) {
    if (requested > 0) return requested;
    return DSGD__MAX(1, dsgd_cpu_count() / DSGD__MAX(1, sharing));
}

/* What a member is made of. */
typedef struct dsgd__member_desc {
    const char *role;                 /* "replica", "worker", "server" */
    const dsgd_model_desc *model;     /* NULL: no backend and no model (a server) */
    dsgd_backend_factory factory;     /* NULL: a CPU backend of cpu_threads */
    void *factory_user;
    int cpu_threads;                  /* resolved (dsgd__group_cpu_threads) */
} dsgd__member_desc;

typedef struct dsgd__member {
    dsgd_ctx *ctx;
    dsgd_backend_i be;
    int has_be;
    dsgd_model *model;
} dsgd__member;

/* Member i: its context, then its backend and model when d has a model; a
   failure's message is copied to parent. m is zeroed first, and what was
   made stays in it for dsgd__member_destroy. */
static dsgd_result dsgd__member_create(dsgd_ctx *parent, const dsgd__member_desc *d, int i, dsgd__member *m) {
    dsgd_ctx_desc cd;
    dsgd_cpu_backend_desc bd;
    dsgd_model_desc md;
    dsgd_result r;
    char label[48];
    memset(m, 0, sizeof(*m));
    memset(&cd, 0, sizeof(cd));
    snprintf(label, sizeof(label), "%s %d", d->role, i);
    cd.label = label;
    cd.logger = dsgd_ctx_logger(parent);
    if ((r = dsgd_ctx_create(&cd, &m->ctx)) != DSGD_OK)
        return dsgd_ctx_set_error(parent, r, "cannot create %s %d's context", d->role, i);
    if (!d->model) return DSGD_OK;
    memset(&bd, 0, sizeof(bd));
    bd.threads = d->cpu_threads;
    r = d->factory ? d->factory(d->factory_user, m->ctx, i, &m->be) : dsgd_cpu_backend_create_desc(m->ctx, &bd, &m->be);
    if (r == DSGD_OK) {
        m->has_be = 1;
        md = *d->model;
        md.backend = &m->be;
        r = dsgd_model_create(m->ctx, &md, &m->model);
    }
    if (r != DSGD_OK && dsgd_ctx_last_result(m->ctx) != DSGD_OK)
        dsgd_ctx_set_error(parent, r, "%s", dsgd_ctx_last_error(m->ctx));
    return r;
}

/* Frees what dsgd__member_create made: model, backend, context. */
static void dsgd__member_destroy(dsgd__member *m) {
    dsgd_model_destroy(m->model);
    if (m->has_be && m->be.destroy) m->be.destroy(m->be.impl);
    dsgd_ctx_destroy(m->ctx);
    memset(m, 0, sizeof(*m));
}

/* The group's count endpoints into eps: copies of given's, or, with given
   NULL, those of a loopback hub of count ranks of the group's own (*hub;
   none for a group of one, whose endpoint is left zero). */
static dsgd_result dsgd__group_endpoints(dsgd_ctx *ctx, const dsgd_transport_i *given, int count,
                                         dsgd_loopback **hub, dsgd_transport_i *eps) {
    dsgd_result r = DSGD_OK;
    int i;
    *hub = NULL;
    if (given) {
        memcpy(eps, given, sizeof(dsgd_transport_i) * (size_t)count);
        return DSGD_OK;
    }
    memset(eps, 0, sizeof(dsgd_transport_i) * (size_t)count);
    if (count == 1) return DSGD_OK;
    if ((r = dsgd_loopback_create(ctx, count, hub)) != DSGD_OK) return r;
    for (i = 0; i < count && r == DSGD_OK; ++i) r = dsgd_loopback_endpoint(*hub, i, &eps[i]);
    return r;
}

#endif /* DSGD__PART_GROUP_IMPL */
