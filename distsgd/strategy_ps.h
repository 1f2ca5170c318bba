/* distsgd/strategy_ps.h - parameter servers as a strategy kind: the replicas are the workers
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   PARAMETER SERVERS AS A STRATEGY (DSGD_STRATEGY_PARAMETER_SERVER)

     Moving from mirrored to parameter servers is one field: desc.kind, with
     desc.ps saying how many servers and which update policy (ps.h: UPDATE
     POLICIES, WHO APPLIES THE UPDATE). The training loop stays the same:
     dsgd_strategy_train_step(s, x, y, count, &info) shards the global batch
     over the N replicas, and each replica is a worker of the engine:

       1 gradient  the mean gradient of its shard (a zero gradient for an
                   empty shard), at the parameters it last pulled
       2 push      to every server its slice; the servers apply it as the
                   policy says (ASYNC: on arrival; SYNC: the mean of the N
                   workers' pushes, one update; BACKUP: the first N - b)
       3 pull      the parameters, waiting as the policy says (SYNC: this
                   step's update), into the replica's model

     The replicas run their steps at once, each on its thread, and the call
     returns when every one has pulled. So within one call the policies
     differ (ASYNC applies N updates in arrival order, SYNC one), while the
     call itself keeps the workers in step: SSP with a bound s > 0 then
     behaves as SYNC, except that a pull may return before the last clock
     is applied. For workers that run free, use the engine itself or the
     cluster coordinator (coordinator.h).

     The P servers are threads of the strategy, each serving its shards
     (desc.ps.partitioner over the model's variables) over a loopback of
     the strategy's own with P + N ranks (servers first), and applying the
     optimizer of desc.optimizer (clip_norm must be 0) on a CPU backend.
     SYNC gives, step for step, the bits of the cluster coordinator's SYNC
     run fed the same shards: the same pull, gradient and push. After a
     step every replica's model holds what it pulled, so
     dsgd_strategy_eval_batch evaluates the servers' parameters (SYNC, and
     BACKUP: those of the step just applied); info->step is the global step
     (dsgd_ps_worker_global_step) replica 0 read at its last pull, and
     info->lr the schedule's rate there (ASYNC: its pull does not wait, so
     it holds its own push and those applied before it, maybe not all N).

     Differences from mirrored: the servers average the workers' mean
     gradients, so every model variable must aggregate MEAN; a non-finite
     gradient under DSGD_NONFINITE_SKIP is pushed as zeros (the step
     reports skipped = 1; the other workers' pushes still count), under
     ERROR the step fails; any failure of a replica stops the servers and
     the other workers at once (the transport is aborted) and fails the
     strategy, since the others may have pushed. The gradients go through
     the host (gradient_path DEVICE is refused). desc.endpoints is not
     taken yet (the strategy makes its own transport), and a checkpoint
     (dsgd_strategy_save, _restore) is DSGD_ERR_UNSUPPORTED: the servers
     hold the state. Distributed variables and the metrics behave as under
     mirrored.

     This part declares nothing public but its desc (in strategy.h); the
     kind is chosen with DSGD_STRATEGY_PARAMETER_SERVER.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_PS_IMPL)
#define DSGD__PART_STRATEGY_PS_IMPL

/* >>strategy_ps ------------------------------------------------------------- */

/* A server of the strategy: a member of the rank group (its context) and
   its thread. */
typedef struct dsgd__psk_server {
    dsgd__member m;
    dsgd_ps_server *srv;
    pthread_t thread;
    int started;
    dsgd_result result; /* of serve */
} dsgd__psk_server;

typedef struct dsgd__psk {
    dsgd_ps_desc pd;
    dsgd_shard_map *map;
    dsgd_loopback *hub;         /* P + N ranks: servers, then the replicas */
    dsgd_transport_i *eps;      /* [P + N] */
    dsgd__psk_server *servers;  /* [P] */
    dsgd_ps_worker **workers;   /* [N]: replica i's engine worker */
    float **buf;                /* [N]: the flat parameters, then the gradient */
    int failed;                 /* a replica failed: the hub was aborted */
    size_t p;
} dsgd__psk;

static dsgd_result dsgd__psk_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    const char *what = "dsgd_strategy_create";
    if (d->gradient_path == DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: parameter_server pushes the gradients from the host; gradient_path DEVICE "
                                  "is for mirrored", what);
    if (d->endpoints)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED,
                                  "%s: parameter_server makes its own transport; endpoints are not taken yet (run "
                                  "the engine, ps.h, over yours)", what);
    if (d->ps.num_servers < 1 || d->ps.num_servers > 4096)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: parameter_server needs 1..4096 servers "
                                  "(desc.ps.num_servers is %d)", what, d->ps.num_servers);
    return DSGD_OK;
}

/* The engine's desc from the strategy's (defaults applied). */
static dsgd_ps_desc dsgd__psk_desc(const dsgd_strategy *s) {
    dsgd_ps_desc pd;
    memset(&pd, 0, sizeof(pd));
    pd.num_servers = s->d.ps.num_servers;
    pd.num_workers = s->n;
    pd.policy = s->d.ps.policy;
    pd.staleness = s->d.ps.staleness;
    pd.backup_workers = s->d.ps.backup_workers;
    pd.apply = s->d.ps.apply;
    pd.optimizer = s->d.optimizer;
    pd.timeout_s = s->d.timeout_s;
    pd.retry_s = s->d.ps.retry_s;
    return pd;
}

static void *dsgd__psk_server_main(void *arg) {
    dsgd__psk_server *sv = (dsgd__psk_server *)arg;
    sv->result = dsgd_ps_server_serve(sv->srv);
    return NULL;
}

/* Stops every rank at once (a failed replica; teardown after a failure). */
static void dsgd__psk_abort(dsgd__psk *k) {
    k->failed = 1;
    if (k->hub) dsgd_loopback_abort(k->hub);
}

static void dsgd__psk_teardown(dsgd_strategy *s) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    int i, P;
    if (!k) return;
    P = k->pd.num_servers;
    /* every worker says goodbye (the replicas' threads are joined), so the
       servers return; after a failure the transport is aborted instead */
    for (i = 0; k->workers && i < s->n; ++i)
        if (k->workers[i] && !k->failed && dsgd_ps_worker_finish(k->workers[i]) != DSGD_OK) dsgd__psk_abort(k);
    if (k->workers && !k->failed)
        for (i = 0; i < s->n; ++i)
            if (!k->workers[i]) dsgd__psk_abort(k); /* a partial setup: no goodbye from it */
    for (i = 0; k->servers && i < P; ++i)
        if (k->servers[i].started) pthread_join(k->servers[i].thread, NULL);
    for (i = 0; k->servers && i < P; ++i) {
        dsgd_ps_server_destroy(k->servers[i].srv);
        dsgd__member_destroy(&k->servers[i].m);
    }
    for (i = 0; k->workers && i < s->n; ++i) dsgd_ps_worker_destroy(k->workers[i]);
    for (i = 0; k->buf && i < s->n; ++i) DSGD_FREE(k->buf[i]);
    if (k->hub) dsgd_loopback_destroy(k->hub);
    dsgd_shard_map_destroy(k->map);
    DSGD_FREE(k->servers);
    DSGD_FREE(k->workers);
    DSGD_FREE(k->buf);
    DSGD_FREE(k->eps);
    DSGD_FREE(k);
    s->kind_data = NULL;
}

/* The shard map over replica 0's variables, and their initial values. */
static dsgd_result dsgd__psk_map(dsgd_strategy *s, dsgd__psk *k, float *init) {
    dsgd_model *m = s->reps[0].m.model;
    int i, nv = dsgd_model_num_variables(m);
    dsgd_variable *vars = (dsgd_variable *)dsgd__alloc(s->ctx, sizeof(dsgd_variable) * (size_t)(nv ? nv : 1),
                                                        "dsgd_strategy_create");
    dsgd_result r;
    if (!vars) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(m, i);
    r = dsgd_shard_map_create(s->ctx, vars, nv, k->pd.num_servers, &s->d.ps.partitioner, &k->map);
    DSGD_FREE(vars);
    if (r == DSGD_OK && (r = dsgd_model_get_params(m, init, k->p)) != DSGD_OK)
        dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(s->reps[0].m.ctx));
    return r;
}

/* The servers (created and serving) and the replicas' engine workers, each
   having pulled the initial parameters. */
static dsgd_result dsgd__psk_setup(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    dsgd__psk *k = (dsgd__psk *)dsgd__alloc(s->ctx, sizeof(*k), what);
    dsgd__member_desc md;
    int i, P, N = s->n;
    dsgd_result r;
    if (!k) return DSGD_ERR_OUT_OF_MEMORY;
    memset(k, 0, sizeof(*k));
    s->kind_data = k;
    k->pd = dsgd__psk_desc(s);
    k->p = dsgd_model_num_params(s->reps[0].m.model);
    P = k->pd.num_servers;
    k->eps = (dsgd_transport_i *)dsgd__alloc(s->ctx, sizeof(dsgd_transport_i) * (size_t)(P + N), what);
    k->servers = (dsgd__psk_server *)dsgd__alloc(s->ctx, sizeof(dsgd__psk_server) * (size_t)P, what);
    k->workers = (dsgd_ps_worker **)dsgd__alloc(s->ctx, sizeof(dsgd_ps_worker *) * (size_t)N, what);
    k->buf = (float **)dsgd__alloc(s->ctx, sizeof(float *) * (size_t)N, what);
    if (!k->eps || !k->servers || !k->workers || !k->buf) return DSGD_ERR_OUT_OF_MEMORY;
    memset(k->servers, 0, sizeof(dsgd__psk_server) * (size_t)P);
    memset(k->workers, 0, sizeof(dsgd_ps_worker *) * (size_t)N);
    memset(k->buf, 0, sizeof(float *) * (size_t)N);
    for (i = 0; i < N; ++i)
        if (!(k->buf[i] = (float *)dsgd__alloc(s->ctx, sizeof(float) * (k->p ? k->p : 1), what)))
            return DSGD_ERR_OUT_OF_MEMORY;
    if ((r = dsgd__psk_map(s, k, k->buf[0])) != DSGD_OK) return r;
    if ((r = dsgd__group_endpoints(s->ctx, NULL, P + N, &k->hub, k->eps)) != DSGD_OK) return r;
    memset(&md, 0, sizeof(md));
    md.role = "server";
    for (i = 0; i < P && r == DSGD_OK; ++i) {
        dsgd__psk_server *sv = &k->servers[i];
        if ((r = dsgd__member_create(s->ctx, &md, i, &sv->m)) != DSGD_OK) break;
        r = dsgd_ps_server_create(sv->m.ctx, &k->eps[i], &k->pd, k->map, k->buf[0], &sv->srv);
        if (r != DSGD_OK) dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(sv->m.ctx));
    }
    for (i = 0; i < N && r == DSGD_OK; ++i) {
        dsgd_replica *rep = &s->reps[i];
        r = dsgd_ps_worker_create(rep->m.ctx, &k->eps[P + i], &k->pd, k->map, &k->workers[i]);
        if (r == DSGD_OK && !dsgd__ps_apply_of(&k->pd)->servers_hold) r = dsgd_ps_worker_set_params(k->workers[i], k->buf[0]);
        if (r != DSGD_OK) dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(rep->m.ctx));
    }
    for (i = 0; i < P && r == DSGD_OK; ++i) {
        if (pthread_create(&k->servers[i].thread, NULL, dsgd__psk_server_main, &k->servers[i]) != 0)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: cannot start server %d's thread", what, i);
        k->servers[i].started = 1;
    }
    /* the first pull, version 0 everywhere: the engine wants a pull before
       each push, and the replicas already hold these parameters */
    for (i = 0; i < N && r == DSGD_OK; ++i)
        if ((r = dsgd_ps_worker_pull(k->workers[i], k->buf[i])) != DSGD_OK)
            dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(s->reps[i].m.ctx));
    return r;
}

/* Phase 1: replica r's mean gradient of its batch b into buf (zeros for an
   empty batch, or a non-finite gradient under SKIP). */
static dsgd_result dsgd__psk_gradient(dsgd_replica *r, const dsgd_batch *b, float *buf, size_t p) {
    dsgd_model *m = r->m.model;
    size_t bad = 0;
    dsgd_result res;
    if (b->count > 0) {
        if ((res = dsgd_model_gradients(m, b, 1.0f / (float)b->count)) != DSGD_OK) return res;
        if ((res = r->m.be.norm_check(r->m.be.impl, dsgd_model_grads(m), p, NULL, &bad)) != DSGD_OK) return res;
    }
    if (bad && r->s->d.nonfinite == DSGD_NONFINITE_ERROR)
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_NON_FINITE,
                                  "step %lld: non-finite gradient (%zu NaN/Inf values on this replica)",
                                  (long long)dsgd_optimizer_steps(r->opt), bad);
    r->skipped = bad != 0;
    if (b->count == 0 || bad) {
        if (p) memset(buf, 0, p * sizeof(float));
        return DSGD_OK;
    }
    return dsgd_model_get_grads(m, buf, p);
}

/* One replica's step: batch, gradient, push, pull (see the top). */
static dsgd_result dsgd__psk_step(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_strategy *s = r->s;
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_ps_worker *w = k->workers[r->local];
    float *buf = k->buf[r->local];
    dsgd_batch b;
    dsgd_result res;
    r->skipped = 0;
    r->lr = dsgd_optimizer_lr(r->opt);
    res = dsgd__step_batch(r, a, &b, &r->global);
    if (res == DSGD_OK && r->global == 0) return DSGD_OK; /* no sample anywhere: nothing to do */
    if (res == DSGD_OK && !s->all_mean)
        res = dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_INVALID_ARGUMENT,
                                 "parameter servers average the workers' mean gradients: every variable must "
                                 "aggregate MEAN");
    if (res == DSGD_OK) res = dsgd__psk_gradient(r, &b, buf, k->p);
    if (res == DSGD_OK) res = dsgd_ps_worker_push(w, buf);
    if (res == DSGD_OK) res = dsgd_ps_worker_pull(w, buf);
    if (res == DSGD_OK) res = dsgd_model_set_params(r->m.model, buf, k->p);
    if (res == DSGD_OK) {
        dsgd__optimizer_set_steps(r->opt, dsgd_ps_worker_global_step(w));
        return DSGD_OK;
    }
    dsgd__psk_abort(k); /* the servers and the other workers stop now, not at their deadline */
    return res;
}

static const dsgd__strategy_ops dsgd__parameter_server_ops = {
    "parameter_server", dsgd__psk_check, dsgd__psk_setup, dsgd__psk_step, dsgd__psk_teardown, NULL, 0,
    "the parameter servers hold the variables and the optimizer's state",
};

#endif /* DSGD__PART_STRATEGY_PS_IMPL */
