/* distsgd/strategy_run.h - a strategy's getters, training, evaluation, run and wait report
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of strategy.h (the replicas, their threads and failures; the
   declarations of what this part defines). Here: the getters, the calls
   that dispatch a step, an evaluation or your function to the replicas
   (train_step and eval_batch, their _fn forms, run), the failure getters,
   and dsgd_strategy_wait_report (>>waits). This part declares nothing
   public.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_RUN_IMPL)
#define DSGD__PART_STRATEGY_RUN_IMPL

/* >>strategy_run ------------------------------------------------------------ */

DSGD_API int dsgd_strategy_num_replicas(const dsgd_strategy *s) { return s ? s->n : 0; }
DSGD_API int dsgd_strategy_num_replicas_in_sync(const dsgd_strategy *s) { return s ? s->world : 0; }
DSGD_API dsgd_result dsgd_strategy_comm_stats(const dsgd_strategy *s, dsgd_comm_stats *out) {
    int i;
    if (!s || !out) return DSGD_ERR_INVALID_ARGUMENT;
    memset(out, 0, sizeof(*out));
    for (i = 0; s->reps && i < s->n; ++i) {
        dsgd_comm_stats c;
        if (!s->reps[i].comm) continue;
        dsgd_comm_get_stats(s->reps[i].comm, &c);
        out->bytes_sent += c.bytes_sent;
        out->bytes_uncompressed += c.bytes_uncompressed;
        out->compress_s += c.compress_s;
        out->comm_s += c.comm_s;
    }
    return DSGD_OK;
}

DSGD_API dsgd_gradient_path dsgd_strategy_gradient_path(const dsgd_strategy *s) {
    return s ? s->path : DSGD_GRADIENTS_HOST;
}
DSGD_API const char *dsgd_gradient_path_name(dsgd_gradient_path p) {
    static const char *const names[DSGD_GRADIENTS_COUNT] = {"auto", "host", "device"};
    return (int)p >= 0 && (int)p < (int)DSGD_GRADIENTS_COUNT ? names[p] : "unknown";
}
DSGD_API dsgd_model *dsgd_strategy_model(dsgd_strategy *s, int replica) {
    return (s && replica >= 0 && replica < s->n) ? s->reps[replica].m.model : NULL;
}
DSGD_API int dsgd_replica_id(const dsgd_replica *r) { return r ? r->rank : -1; }
DSGD_API int dsgd_replica_count(const dsgd_replica *r) { return r ? r->s->world : 0; }
DSGD_API dsgd_ctx *dsgd_replica_ctx(const dsgd_replica *r) { return r ? r->m.ctx : NULL; }
DSGD_API dsgd_model *dsgd_replica_model(const dsgd_replica *r) { return r ? r->m.model : NULL; }
DSGD_API dsgd_comm *dsgd_replica_comm(const dsgd_replica *r) { return r ? r->comm : NULL; }

DSGD_API dsgd_result dsgd_strategy_set_aggregation(dsgd_strategy *s, const char *variable, dsgd_aggregation agg,
                                                   dsgd_synchronization sync) {
    int i, nv, hit = 0;
    const char *what = "dsgd_strategy_set_aggregation";
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, what) != DSGD_OK) return DSGD_ERR_STATE;
    if (!variable) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable name is NULL", what);
    if (sync == DSGD_SYNC_ON_READ)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: model variables are trainable, and ON_READ synchronization is only for "
                                  "non-trainable variables", what, variable);
    if (sync != DSGD_SYNC_AUTO && sync != DSGD_SYNC_ON_WRITE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: synchronization %d is not supported under a distribution strategy", what,
                                  variable, (int)sync);
    if (!dsgd__agg_valid(agg) || agg == DSGD_AGG_NONE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: a mirrored variable updated in replica context needs an aggregation "
                                  "(SUM, MEAN or ONLY_FIRST_REPLICA), got %d", what, variable, (int)agg);
    nv = dsgd_model_num_variables(s->reps[0].m.model);
    for (i = 0; i < nv; ++i) {
        if (!strcmp(variable, "*") || !strcmp(variable, dsgd_model_variable(s->reps[0].m.model, i)->name)) {
            s->param_agg[i] = agg;
            hit = 1;
        }
    }
    if (!hit) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: the model has no variable '%s'", what, variable);
    s->all_mean = 1;
    for (i = 0; i < nv; ++i) s->all_mean &= s->param_agg[i] == DSGD_AGG_MEAN;
    return DSGD_OK;
}

static dsgd_result dsgd__strategy_check_batch(dsgd_strategy *s, const float *x, const float *y, int count,
                                              int need_y, const char *what) {
    int max_batch = s->d.model.max_batch; /* per replica, default applied */
    dsgd_result res = dsgd__strategy_usable(s, what);
    if (res != DSGD_OK) return res;
    if (dsgd_model_input_dim(s->reps[0].m.model) == 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: model '%s' has input_dim 0, so x cannot be sliced: use a dsgd_batch_fn "
                                  "(dsgd_strategy_train_step_fn, dsgd_strategy_eval_fn)", what,
                                  dsgd_model_name(s->reps[0].m.model));
    if (!x || (need_y && !y))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: x or y is NULL", what);
    if (count < 1 || (long long)count > (long long)s->shard_count * max_batch)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: global batch of %d outside 1..%lld (replicas x max_batch)", what, count,
                                  (long long)s->shard_count * max_batch);
    return DSGD_OK;
}

/* THE VERDICT ON THE DEVICE before a call that reads or replaces the
   replicas' state from this thread (a checkpoint): every pending verdict
   taken (drop 0: a job that does nothing, taken before it) or dropped
   (drop 1). */
static dsgd_result dsgd__strategy_verdicts(dsgd_strategy *s, int drop, const char *what) {
    int i, pending = 0;
    for (i = 0; i < s->n; ++i) pending |= s->reps[i].vmark != NULL;
    if (!pending) return DSGD_OK;
    return dsgd__strategy_dispatch(s, drop ? dsgd__replica_drop_verdict : dsgd__replica_noop, NULL, what);
}

/* One training step over a (checked) dsgd__step_args. */
static dsgd_result dsgd__strategy_train(dsgd_strategy *s, dsgd__step_args *a, dsgd_step_info *info, const char *what) {
    dsgd_result res;
    int i;
    a->verdict = info != NULL;
    if (info) info->step = dsgd_optimizer_steps(s->reps[0].opt);
    s->resized = 0;
    s->dropped = 0;
    do res = dsgd__strategy_dispatch(s, s->ops->step, a, what);
    while (res != DSGD_OK && s->elastic && s->elastic(s, a, what, &res));
    if (info) {
        info->world = s->world;
        info->resized = s->resized;
        info->dropped = s->dropped;
        for (i = 0; i < s->dropped; ++i) {
            info->dropped_rank[i] = s->drop_rank[i];
            info->dropped_why[i] = (dsgd_drop_reason)s->drop_why[i];
        }
        if (s->defer && s->n > 0) info->step = s->reps[0].t_step; /* a pending verdict taken in the step */
        info->count = s->reps[0].global;
        info->skipped = s->reps[0].skipped;
        info->lr = s->reps[0].lr;
        info->exchange_s = s->reps[0].exchange_s;
        info->exposed_s = s->reps[0].exposed_s;
        info->averaged = s->reps[0].averaged;
        for (i = 1; i < s->n; ++i) DSGD_ASSERT(res != DSGD_OK || s->reps[i].skipped == info->skipped);
    }
    return res;
}

DSGD_API dsgd_result dsgd_strategy_train_step(dsgd_strategy *s, const float *x, const float *y, int count,
                                              dsgd_step_info *info) {
    dsgd__step_args a;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_check_batch(s, x, y, count, 1, "dsgd_strategy_train_step")) != DSGD_OK) return res;
    memset(&a, 0, sizeof(a));
    a.x = x;
    a.y = y;
    a.count = count;
    return dsgd__strategy_train(s, &a, info, "dsgd_strategy_train_step");
}

/* The checks of the _fn calls. */
static dsgd_result dsgd__strategy_check_fn(dsgd_strategy *s, dsgd_batch_fn fn, const char *what) {
    dsgd_result res = dsgd__strategy_usable(s, what);
    if (res != DSGD_OK) return res;
    if (!fn) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: fn is NULL", what);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_train_step_fn(dsgd_strategy *s, dsgd_batch_fn fn, void *user_data,
                                                 dsgd_step_info *info) {
    dsgd__step_args a;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_check_fn(s, fn, "dsgd_strategy_train_step_fn")) != DSGD_OK) return res;
    memset(&a, 0, sizeof(a));
    a.fn = fn;
    a.fn_user = user_data;
    return dsgd__strategy_train(s, &a, info, "dsgd_strategy_train_step_fn");
}

/* Replica r's part of a batch fn's result: fn's own result, or an error
   naming the replica when its count is outside 0..max_batch. */
static dsgd_result dsgd__replica_fn_batch(dsgd_replica *r, const dsgd__step_args *a, dsgd_batch *b) {
    dsgd_result res;
    int max_batch = dsgd_model_max_batch(r->m.model);
    memset(b, 0, sizeof(*b));
    dsgd_ctx_clear_error(r->m.ctx);
    res = a->fn(a->fn_user, r->s->shard_first + r->local, r->s->shard_count, b);
    if (res != DSGD_OK) {
        if (dsgd_ctx_last_result(r->m.ctx) == DSGD_OK)
            dsgd_ctx_set_error(r->m.ctx, res, "the batch function failed on replica %d: %s", r->rank,
                               dsgd_result_string(res));
        return res;
    }
    if (b->count < 0 || b->count > max_batch)
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "the batch function gave replica %d a batch of %d samples (0..max_batch %d)",
                                  r->rank, b->count, max_batch);
    return DSGD_OK;
}

/* Replica r's shard of a sliced batch: dsgd_block_range of the global one. */
static void dsgd__replica_slice(const dsgd_replica *r, const dsgd__step_args *a, dsgd_batch *b) {
    size_t off = 0, len = 0;
    dsgd_block_range((size_t)a->count, r->s->shard_count, r->s->shard_first + r->local, &off, &len);
    memset(b, 0, sizeof(*b));
    b->count = (int)len;
    if (len == 0) return;
    b->x = a->x + off * (size_t)dsgd_model_input_dim(r->m.model);
    b->y = a->y ? a->y + off * (size_t)dsgd_model_target_dim(r->m.model) : NULL;
}

static dsgd_result dsgd__replica_eval(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_batch b;
    dsgd_result res = DSGD_OK;
    r->clean_fail = 1; /* no collective, no weight changes */
    if (a->fn) res = dsgd__replica_fn_batch(r, a, &b);
    else dsgd__replica_slice(r, a, &b);
    if (res != DSGD_OK || b.count == 0) return res;
    return dsgd_model_evaluate(r->m.model, &b);
}

DSGD_API dsgd_result dsgd_strategy_eval_batch(dsgd_strategy *s, const float *x, const float *y, int count) {
    dsgd__step_args a;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_check_batch(s, x, y, count, 0, "dsgd_strategy_eval_batch")) != DSGD_OK) return res;
    memset(&a, 0, sizeof(a));
    a.x = x;
    a.y = y;
    a.count = count;
    return dsgd__strategy_dispatch(s, dsgd__replica_eval, &a, "dsgd_strategy_eval_batch");
}

DSGD_API dsgd_result dsgd_strategy_eval_fn(dsgd_strategy *s, dsgd_batch_fn fn, void *user_data) {
    dsgd__step_args a;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_check_fn(s, fn, "dsgd_strategy_eval_fn")) != DSGD_OK) return res;
    memset(&a, 0, sizeof(a));
    a.fn = fn;
    a.fn_user = user_data;
    return dsgd__strategy_dispatch(s, dsgd__replica_eval, &a, "dsgd_strategy_eval_fn");
}

DSGD_API dsgd_result dsgd_strategy_run(dsgd_strategy *s, dsgd_replica_fn fn, void *user_data) {
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_usable(s, "dsgd_strategy_run")) != DSGD_OK) return res;
    if (!fn) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_run: fn is NULL");
    return dsgd__strategy_dispatch(s, fn, user_data, "dsgd_strategy_run");
}

DSGD_API int dsgd_strategy_failed(const dsgd_strategy *s) { return s ? s->failed : 0; }

DSGD_API dsgd_result dsgd_strategy_replica_result(const dsgd_strategy *s, int replica, const char **message) {
    if (message) *message = "";
    if (!s || replica < 0 || replica >= s->n) return DSGD_ERR_INVALID_ARGUMENT;
    if (message) *message = s->reps[replica].msg;
    return s->reps[replica].result;
}

/* >>waits ------------------------------------------------------------------ */

/* A job across workers: every replica's row of the window (its steps'
   time, then its waits per global rank: W + 1 numbers, each as a float
   and the float of its remainder) all-gathered into its staging buffer. */
static dsgd_result dsgd__wait_gather(dsgd_replica *r, void *user) {
    int W = r->s->world, k;
    size_t row = 2 * ((size_t)W + 1), n = row * (size_t)W;
    float *buf = dsgd__replica_stage(r, n), *mine;
    dsgd_result res;
    DSGD__UNUSED(user);
    r->clean_fail = 1;
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    mine = buf + row * (size_t)r->rank;
    for (k = 0; k <= W; ++k) {
        double x = k == 0 ? r->wait_time : r->wait_sum[k - 1];
        mine[2 * k] = (float)x;
        mine[2 * k + 1] = (float)(x - (double)mine[2 * k]);
    }
    if ((res = dsgd_allgather(r->comm, buf, n, 0.0)) != DSGD_OK) {
        r->clean_fail = 0;
        r->comm_failed = 1;
    }
    return res;
}

DSGD_API dsgd_result dsgd_strategy_wait_report(dsgd_strategy *s, dsgd_wait_report *out, double *fraction, int n) {
    const char *what = "dsgd_strategy_wait_report";
    double *rows, longest = 0.0; /* rows: W rows of W + 1 (time, then waits per rank) */
    int W, i, j, k;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_usable(s, what)) != DSGD_OK) return res;
    if (!out) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
    W = s->world;
    if (fraction && n < W)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: fraction has room for %d ranks, and %d are in sync", what, n, W);
    memset(out, 0, sizeof(*out));
    out->worst = -1;
    if (fraction) memset(fraction, 0, sizeof(double) * (size_t)W);
    if (!s->reps[0].wait_at || !s->reps[0].comm) return DSGD_OK; /* no communicator: nobody waits */
    rows = (double *)dsgd__alloc(s->ctx, sizeof(double) * (size_t)W * ((size_t)W + 1), what);
    if (!rows) return DSGD_ERR_OUT_OF_MEMORY;
    if (W > s->n) { /* across workers: every replica's row, from all of them */
        size_t row = 2 * ((size_t)W + 1);
        if ((res = dsgd__strategy_dispatch(s, dsgd__wait_gather, NULL, what)) != DSGD_OK) {
            DSGD_FREE(rows);
            return res;
        }
        for (j = 0; j < W; ++j)
            for (k = 0; k <= W; ++k)
                rows[(size_t)j * (W + 1) + k] = (double)s->reps[0].stage[row * j + 2 * k] +
                                                (double)s->reps[0].stage[row * j + 2 * k + 1];
    } else {
        for (j = 0; j < W; ++j) {
            rows[(size_t)j * (W + 1)] = s->reps[j].wait_time;
            memcpy(rows + (size_t)j * (W + 1) + 1, s->reps[j].wait_sum, sizeof(double) * (size_t)W);
        }
    }
    out->steps = s->reps[0].wait_steps;
    for (j = 0; j < W; ++j) longest = DSGD__MAX(longest, rows[(size_t)j * (W + 1)]);
    out->step_s = out->steps > 0 ? longest / (double)out->steps : 0.0;
    for (k = 0; k < W; ++k) {
        double f = 0.0;
        for (j = 0; j < W; ++j) {
            double t = rows[(size_t)j * (W + 1)];
            if (j != k && t > 0.0) f += rows[(size_t)j * (W + 1) + 1 + k] / t;
        }
        f = W > 1 ? f / (double)(W - 1) : 0.0;
        if (fraction) fraction[k] = f;
        if (f > 0.0 && (out->worst < 0 || f > out->worst_fraction)) {
            out->worst = k;
            out->worst_fraction = f;
        }
    }
    DSGD_FREE(rows);
    for (i = 0; i < s->n; ++i) { /* the next window starts at the next step */
        dsgd_replica *r = &s->reps[i];
        memset(r->wait_sum, 0, sizeof(double) * (size_t)W);
        r->wait_time = 0.0;
        r->wait_steps = 0;
    }
    return DSGD_OK;
}

#endif /* DSGD__PART_STRATEGY_RUN_IMPL */
