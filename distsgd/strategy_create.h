/* distsgd/strategy_create.h - a strategy's creation, in phases
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of strategy.h (the replicas, their threads and failures). Here:
   dsgd__strategy_create, which dsgd_strategy_create (strategy_kinds.h)
   calls with a kind's table, and its phases: the desc's checks and
   defaults, the transport and each replica's endpoint, each replica's
   context, backend, model, optimizer and communicator, the variables'
   aggregations, the metrics, the worker pool, and across workers the
   fingerprint and the chief's weights (MULTI-WORKER in strategy.h). This
   part declares nothing public.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_CREATE_IMPL)
#define DSGD__PART_STRATEGY_CREATE_IMPL

/* >>strategy_create --------------------------------------------------------- */

/* ---- creation, in phases */

/* The desc's common rules, then the kind's (ops->check; ops NULL: an
   unknown kind). */
static dsgd_result dsgd__strategy_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d, const dsgd__strategy_ops *ops) {
    const char *what = "dsgd_strategy_create";
    if (!ops)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown strategy kind %d", what, (int)d->kind);
    if (d->num_replicas < 0 || d->num_replicas > DSGD_MAX_REPLICAS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d replicas (%s takes 0..%d)", what,
                                  d->num_replicas, ops->name, DSGD_MAX_REPLICAS);
    if (d->nonfinite != DSGD_NONFINITE_SKIP && d->nonfinite != DSGD_NONFINITE_ERROR)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown non-finite policy %d", what,
                                  (int)d->nonfinite);
    if (!(d->timeout_s >= 0.0) || (int)d->algorithm < 0 || (int)d->algorithm >= (int)DSGD_ALLREDUCE_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: bad timeout %g or algorithm %d", what,
                                  d->timeout_s, (int)d->algorithm);
    if ((int)d->gradient_path < 0 || (int)d->gradient_path >= (int)DSGD_GRADIENTS_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown gradient path %d", what,
                                  (int)d->gradient_path);
    if (d->cpu_threads < 0 || d->cpu_threads > DSGD_CPU_MAX_THREADS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d CPU threads per replica (0..%d)", what,
                                  d->cpu_threads, DSGD_CPU_MAX_THREADS);
    if (d->comm_hook && (!(ops->caps & DSGD__KIND_HOOKS) || d->gradient_path == DSGD_GRADIENTS_DEVICE))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: a comm hook exchanges the gradient of mirrored and multi_worker_mirrored on the "
                                  "HOST path, not %s", what,
                                  d->gradient_path == DSGD_GRADIENTS_DEVICE ? "with gradient_path DEVICE" : ops->name);
    if (d->comm_hook && dsgd__comm_hook_check(ctx, d->comm_hook, what) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    if (d->comm_hook && d->comm_hook->owns_momentum && d->optimizer.kind != DSGD_OPT_SGD)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: comm hook '%s' applies momentum itself (momentum correction), so the optimizer "
                                  "must be DSGD_OPT_SGD, not %s: its momentum would be applied on top",
                                  what, d->comm_hook->name,
                                  d->optimizer.kind == DSGD_OPT_MOMENTUM ? "DSGD_OPT_MOMENTUM"
                                  : d->optimizer.kind == DSGD_OPT_ADAM   ? "DSGD_OPT_ADAM"
                                  : d->optimizer.kind == DSGD_OPT_ADAMW  ? "DSGD_OPT_ADAMW"
                                                                         : "an unknown kind");
    return ops->check ? ops->check(ctx, d) : DSGD_OK;
}

/* The desc's defaults, in one place (the desc's comments list them). */
static void dsgd__strategy_defaults(dsgd_strategy_desc *d) {
    if (d->num_replicas == 0) d->num_replicas = 1;
    if (d->timeout_s == 0.0) d->timeout_s = DSGD_DEFAULT_TIMEOUT_S;
    if (d->model.max_batch == 0) d->model.max_batch = DSGD_DEFAULT_MAX_BATCH; /* the model's default, per replica */
    d->model.backend = NULL; /* each replica's comes from backend_factory */
    d->cpu_threads = dsgd__group_cpu_threads(d->cpu_threads, d->num_replicas);
}

/* The strategy and its N replica slots, nothing created yet. */
static dsgd_result dsgd__strategy_alloc(dsgd_ctx *ctx, const dsgd_strategy_desc *desc, const dsgd__strategy_ops *ops,
                                        dsgd_strategy **out) {
    const char *what = "dsgd_strategy_create";
    dsgd_strategy *s = (dsgd_strategy *)dsgd__alloc(ctx, sizeof(*s), what);
    if (!s) return DSGD_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof(*s));
    s->ctx = ctx;
    s->d = *desc;
    dsgd__strategy_defaults(&s->d);
    s->ops = ops;
    s->n = s->d.num_replicas;
    s->world = s->n;
    s->path = DSGD_GRADIENTS_HOST;
    s->all_mean = 1;
    s->abort_by = -1;
    *out = s;
    s->reps = (dsgd_replica *)dsgd__alloc(ctx, sizeof(dsgd_replica) * (size_t)s->n, what);
    if (!s->reps) return DSGD_ERR_OUT_OF_MEMORY;
    memset(s->reps, 0, sizeof(dsgd_replica) * (size_t)s->n);
    return DSGD_OK;
}

/* Each replica's endpoint: given's (the desc's), or, with given NULL, one
   of a loopback of the strategy's own (none with one replica), as the
   rank group makes them. */
static dsgd_result dsgd__strategy_endpoints(dsgd_strategy *s, const dsgd_transport_i *given) {
    dsgd_transport_i *eps = (dsgd_transport_i *)dsgd__alloc(s->ctx, sizeof(dsgd_transport_i) * (size_t)s->n,
                                                            "dsgd_strategy_create");
    dsgd_result r;
    int i;
    if (!eps) return DSGD_ERR_OUT_OF_MEMORY;
    r = dsgd__group_endpoints(s->ctx, given, s->n, &s->hub, eps);
    for (i = 0; i < s->n && r == DSGD_OK; ++i) s->reps[i].ep = eps[i];
    DSGD_FREE(eps);
    return r;
}

/* Elastic mirrored over ranks 0..n-1 of a larger group (the others are
   spares that dsgd_strategy_grow may admit): each replica's endpoint is a
   sub-group's of n ranks over the one given (ELASTIC in
   strategy_elastic.h). */
static dsgd_result dsgd__strategy_spares(dsgd_strategy *s, const dsgd_transport_i *ep) {
    const char *what = "dsgd_strategy_create";
    int i, k, n = s->n;
    dsgd_result r;
    for (i = 0; i < n; ++i)
        if (ep[i].rank != i || ep[i].size != s->world || !ep[i].send || !ep[i].recv)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: endpoints[%d] is rank %d of %d%s; replica %d needs rank %d of %d", what, i,
                                      ep[i].rank, ep[i].size, ep[i].send && ep[i].recv ? "" : " without send or recv",
                                      i, i, s->world);
    s->world = n;
    if ((r = dsgd__strategy_endpoints(s, ep)) != DSGD_OK) return r;
    for (i = 0; i < n; ++i) {
        dsgd_replica *rep = &s->reps[i];
        dsgd__sub_ep *e = (dsgd__sub_ep *)dsgd__alloc(s->ctx, sizeof(*e) + sizeof(int) * (size_t)n, what);
        if (!e) return DSGD_ERR_OUT_OF_MEMORY;
        e->base = rep->ep;
        e->size = n;
        e->map = (int *)(void *)(e + 1);
        for (k = 0; k < n; ++k) e->map[k] = k;
        rep->sub = e;
        dsgd__sub_endpoint(e, i, &rep->ep);
    }
    return DSGD_OK;
}

/* The transport: the desc's endpoints, checked (contiguous ranks first ..
   first + n - 1 of one size W; W = n unless the kind is multi-worker), or,
   for N > 1, a loopback of the strategy's own. */
static dsgd_result dsgd__strategy_transport(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    const dsgd_transport_i *ep = s->d.endpoints;
    int i, n = s->n;
    if (!ep) {
        if (s->ops->multi_worker)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: %s needs the endpoints of the group across the workers "
                                      "(dsgd_strategy_desc.endpoints)", what, s->ops->name);
        return dsgd__strategy_endpoints(s, NULL);
    }
    s->first = ep[0].rank;
    s->world = ep[0].size;
    if (!s->ops->multi_worker && s->d.elastic.min_replicas > 0 && s->first == 0 && s->world > n)
        return dsgd__strategy_spares(s, ep);
    if (!s->ops->multi_worker && (s->first != 0 || s->world != n))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: endpoints[0] is rank %d of %d; %s with %d replicas needs ranks 0..%d of %d "
                                  "(across processes: DSGD_STRATEGY_MULTI_WORKER_MIRRORED)", what, ep[0].rank,
                                  ep[0].size, s->ops->name, n, n - 1, n);
    if (s->first < 0 || s->world < n || s->first > s->world - n)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: endpoints[0] is rank %d of %d, which leaves no room for %d replicas", what,
                                  ep[0].rank, ep[0].size, n);
    for (i = 0; i < n; ++i) {
        const dsgd_transport_i *t = &ep[i];
        if (t->rank != s->first + i || t->size != s->world || !t->send || !t->recv)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: endpoints[%d] is rank %d of %d%s; replica %d needs rank %d of %d", what, i,
                                      t->rank, t->size, t->send && t->recv ? "" : " without send or recv", i,
                                      s->first + i, s->world);
    }
    return dsgd__strategy_endpoints(s, ep);
}

/* Replica i's context, backend and model (a member of the rank group,
   group.h), optimizer and communicator; a failure's message is copied to
   the strategy's context. */
static dsgd_result dsgd__replica_create(dsgd_strategy *s, int i) {
    dsgd_replica *r = &s->reps[i];
    dsgd__member_desc md;
    dsgd_result res;
    memset(&md, 0, sizeof(md));
    md.role = "replica";
    md.model = &s->d.model;
    md.factory = s->d.backend_factory;
    md.factory_user = s->d.backend_user_data;
    md.cpu_threads = s->d.cpu_threads;
    r->s = s;
    r->rank = s->first + i;
    r->local = i;
    if ((res = dsgd__member_create(s->ctx, &md, i, &r->m)) != DSGD_OK) return res;
    res = dsgd_optimizer_create(r->m.model, &s->d.optimizer, &r->opt);
    if (res == DSGD_OK && s->world > 1) {
        dsgd_comm_desc cdesc;
        memset(&cdesc, 0, sizeof(cdesc));
        cdesc.timeout_s = s->d.timeout_s;
        cdesc.piece_bytes = s->d.piece_bytes; /* the communicator clamps it, equally on every replica */
        cdesc.ranks_per_node = s->d.ranks_per_node;
        res = dsgd_comm_create(r->m.ctx, &r->ep, &cdesc, &r->comm);
        if (res == DSGD_OK) { /* dsgd_strategy_wait_report's window: three rows of W */
            r->wait_at = (double *)dsgd__alloc(r->m.ctx, sizeof(double) * 3 * (size_t)s->world,
                                               "dsgd_strategy_create");
            if (!r->wait_at) res = DSGD_ERR_OUT_OF_MEMORY;
            else {
                memset(r->wait_at, 0, sizeof(double) * 3 * (size_t)s->world);
                r->wait_sum = r->wait_at + s->world;
                r->wait_now = r->wait_sum + s->world;
            }
        }
    }
    if (res != DSGD_OK && dsgd_ctx_last_result(r->m.ctx) != DSGD_OK)
        dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(r->m.ctx));
    return res;
}

/* Every model variable starts with its declared aggregation (MEAN unless a
   custom model declared another; dsgd_strategy_set_aggregation changes it). */
static dsgd_result dsgd__strategy_param_agg(dsgd_strategy *s) {
    int i, nv = s->n ? dsgd_model_num_variables(s->reps[0].m.model) : 0; /* no replica: a process of servers */
    s->param_agg = (dsgd_aggregation *)dsgd__alloc(s->ctx, sizeof(dsgd_aggregation) * (size_t)(nv ? nv : 1),
                                                    "dsgd_strategy_create");
    if (!s->param_agg) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < nv; ++i) s->param_agg[i] = dsgd_model_variable(s->reps[0].m.model, i)->aggregation;
    s->all_mean = 1;
    for (i = 0; i < nv; ++i) s->all_mean &= s->param_agg[i] == DSGD_AGG_MEAN;
    return DSGD_OK;
}

/* The metrics: ON_READ SUM variables, three per slot. */
static dsgd_result dsgd__strategy_metrics(dsgd_strategy *s) {
    static const char *const names[3] = {"loss_sum", "correct", "count"};
    dsgd_result res = DSGD_OK;
    int slot, i;
    for (slot = 0; slot < 2 && res == DSGD_OK; ++slot) {
        for (i = 0; i < 3 && res == DSGD_OK; ++i) {
            dsgd_dvar_desc vd;
            char name[64];
            int id;
            memset(&vd, 0, sizeof(vd));
            snprintf(name, sizeof(name), "metrics/%s/%s", slot == 0 ? "train" : "eval", names[i]);
            vd.name = name;
            vd.count = 1;
            vd.synchronization = DSGD_SYNC_ON_READ;
            vd.aggregation = DSGD_AGG_SUM;
            res = dsgd__dvar_add(s, &vd, &id);
            if (i == 0) s->metric_var[slot] = id;
        }
    }
    return res;
}

/* The worker pool: its lock and conditions, then a thread for each of
   replicas 1..N-1 (replica 0 runs on the caller's). */
static dsgd_result dsgd__strategy_start(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    dsgd_result r;
    int i;
    if ((r = dsgd__lock_init(s->ctx, &s->mu, &s->cv_start, &s->cv_done, what)) != DSGD_OK) return r;
    s->sync_ready = 1;
    for (i = 1; i < s->n; ++i) {
        if (pthread_create(&s->reps[i].thread, NULL, dsgd__replica_main, &s->reps[i]) != 0)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: cannot start replica %d's thread", what, i);
        s->reps[i].thread_started = 1;
    }
    return DSGD_OK;
}


/* ---- multi-worker: one description, the chief's weights */

static uint64_t dsgd__fp(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull; /* FNV-1a */
    return h;
}
#define DSGD__FP(h, x) ((h) = dsgd__fp((h), &(x), sizeof(x)))

/* A hash of what every worker must agree on: the model's variables and
   their aggregations, the optimizer and the strategy's options (field by
   field: no padding, no pointers), the comm hook's name ("" for none:
   names are never empty). Not the seed: the chief's weights win. */
static uint64_t dsgd__strategy_fingerprint(const dsgd_strategy *s) {
    const dsgd_model *m = s->reps[0].m.model;
    const dsgd_optimizer_desc *o = &s->d.optimizer;
    const dsgd_lr_schedule *sc = &o->schedule;
    uint64_t h = 14695981039346656037ull, np = dsgd_model_num_params(m);
    int i, k, nv = dsgd_model_num_variables(m), dims[4];
    DSGD__FP(h, np);
    for (i = 0; i < nv; ++i) {
        const dsgd_variable *v = dsgd_model_variable(m, i);
        h = dsgd__fp(h, v->name, strlen(v->name) + 1);
        DSGD__FP(h, v->rank);
        for (k = 0; k < v->rank; ++k) DSGD__FP(h, v->shape[k]);
        DSGD__FP(h, s->param_agg[i]);
    }
    h = dsgd__fp(h, dsgd_model_name(m), strlen(dsgd_model_name(m)) + 1);
    dims[0] = dsgd_model_input_dim(m);
    dims[1] = dsgd_model_target_dim(m);
    dims[2] = dsgd_model_max_batch(m);
    dims[3] = (int)s->d.nonfinite;
    h = dsgd__fp(h, dims, sizeof(dims));
    DSGD__FP(h, o->kind); DSGD__FP(h, o->lr); DSGD__FP(h, o->momentum); DSGD__FP(h, o->nesterov);
    DSGD__FP(h, o->beta1); DSGD__FP(h, o->beta2); DSGD__FP(h, o->eps); DSGD__FP(h, o->weight_decay);
    DSGD__FP(h, o->clip_norm);
    DSGD__FP(h, sc->kind); DSGD__FP(h, sc->warmup_steps); DSGD__FP(h, sc->warmup_start_lr);
    DSGD__FP(h, sc->total_steps); DSGD__FP(h, sc->final_lr); DSGD__FP(h, sc->step_size); DSGD__FP(h, sc->gamma);
    DSGD__FP(h, s->d.kind); DSGD__FP(h, s->d.algorithm); DSGD__FP(h, s->d.bucket_bytes);
    DSGD__FP(h, s->d.piece_bytes);
    DSGD__FP(h, s->d.ranks_per_node);
    if (s->ops->fingerprint) h = s->ops->fingerprint(s, h); /* the kind's own options */
    h = s->d.comm_hook ? dsgd__fp(h, s->d.comm_hook->name, strlen(s->d.comm_hook->name) + 1) : dsgd__fp(h, "", 1);
    if (s->d.elastic.min_replicas) DSGD__FP(h, s->d.elastic.min_replicas); /* every worker decides alike */
    return h;
}

/* One replica's part of joining the group: all-gather every rank's
   fingerprint (four 16-bit pieces, exact as floats), fail on every rank
   alike when one differs from rank 0's, then take rank 0's weights. */
static dsgd_result dsgd__strategy_join(dsgd_replica *r, void *user) {
    dsgd_strategy *s = r->s;
    uint64_t fp = *(const uint64_t *)user, other = 0;
    size_t p = dsgd_model_num_params(r->m.model), n = 4 * (size_t)s->world;
    float *buf = dsgd__replica_stage(r, DSGD__MAX(n, p));
    dsgd_result res;
    int g, k, bad = -1;
    r->clean_fail = 1;
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    for (k = 0; k < 4; ++k) buf[4 * (size_t)r->rank + k] = (float)((fp >> (16 * k)) & 0xffff);
    if ((res = dsgd_allgather(r->comm, buf, n, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    for (g = 1; g < s->world && bad < 0; ++g)
        for (k = 0; k < 4; ++k)
            if (buf[4 * (size_t)g + k] != buf[k]) bad = g;
    if (bad >= 0) {
        uint64_t f0 = 0;
        for (k = 0; k < 4; ++k) {
            f0 |= (uint64_t)buf[k] << (16 * k);
            other |= (uint64_t)buf[4 * (size_t)bad + k] << (16 * k);
        }
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: rank %d describes another model, optimizer or strategy than "
                                  "rank 0 (fingerprints %016llx and %016llx): every worker must pass the same "
                                  "description", bad, (unsigned long long)other, (unsigned long long)f0);
    }
    r->clean_fail = 0;
    if ((res = dsgd_model_get_params(r->m.model, buf, p)) != DSGD_OK) return res;
    if ((res = dsgd_broadcast(r->comm, buf, p, 0, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    return dsgd_model_set_params(r->m.model, buf, p);
}

/* dsgd_strategy_create of the kind whose table is ops (NULL: desc's kind is
   unknown), in phases. */
static dsgd_result dsgd__strategy_create(dsgd_ctx *ctx, const dsgd_strategy_desc *desc, const dsgd__strategy_ops *ops,
                                         dsgd_strategy **out) {
    dsgd_strategy *s = NULL;
    dsgd_result res;
    int i;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_create: out is NULL");
    *out = NULL;
    if (!desc) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_create: desc is NULL");
    if ((res = dsgd__strategy_check(ctx, desc, ops)) != DSGD_OK) return res;
    res = dsgd__strategy_alloc(ctx, desc, ops, &s);
    if (res == DSGD_OK) res = s->ops->layout ? s->ops->layout(s) : dsgd__strategy_transport(s);
    if (res == DSGD_OK && !s->shard_count) {
        s->shard_count = s->world;
        s->shard_first = s->first;
    }
    for (i = 0; res == DSGD_OK && i < s->n; ++i) res = dsgd__replica_create(s, i);
    if (res == DSGD_OK) res = dsgd__strategy_param_agg(s);
    if (res == DSGD_OK && s->ops->setup) res = s->ops->setup(s);
    if (res == DSGD_OK) res = dsgd__strategy_metrics(s);
    if (res == DSGD_OK) res = dsgd__strategy_start(s);
    if (res == DSGD_OK && s->ops->multi_worker && s->world > 1) {
        uint64_t fp = dsgd__strategy_fingerprint(s);
        res = dsgd__strategy_dispatch(s, dsgd__strategy_join, &fp, "dsgd_strategy_create");
    }
    if (res != DSGD_OK) {
        dsgd_strategy_destroy(s);
        return res;
    }
    *out = s;
    return DSGD_OK;
}

#endif /* DSGD__PART_STRATEGY_CREATE_IMPL */
