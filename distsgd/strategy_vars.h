/* distsgd/strategy_vars.h - a strategy's distributed variables and metrics: tf.VariableAggregation / tf.VariableSynchronization
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   DISTRIBUTED VARIABLES

     A strategy (strategy.h) holds, besides its replicas' models, variables
     of your own with one copy per replica, created in cross-replica
     context and written in replica context (inside dsgd_strategy_run) with
     tf.distribute's semantics: ON_WRITE variables are combined by their
     aggregation on every write and stay one value; ON_READ variables keep
     a copy per replica, combined when read across replicas. The metrics
     (dsgd_strategy_take_metrics) are six of them. This part holds their
     interface and its implementation; the table of copies lives with the
     strategy, which creates the metrics' at creation.
*/
#ifndef DSGD__PART_STRATEGY_VARS_DECL
#define DSGD__PART_STRATEGY_VARS_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- distributed variables */

/* Creates a variable with one copy per replica (cross-replica context).
   Rejected with DSGD_ERR_INVALID_ARGUMENT: synchronization NONE (as
   tf.distribute rejects it under a strategy); ON_READ with trainable set
   (Keras 2's add_weight rejects it; tf.Variable accepts it); ON_READ with
   aggregation NONE (tf.distribute fails when such a variable is read across
   replicas; here it fails at creation); unknown enum values. *id receives
   the handle.
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (the
   cases above; s NULL, nothing recorded; desc or id NULL; an empty name; a
   name longer than DSGD_MAX_VARIABLE_NAME bytes (never cut: a cut name
   would not be found again); a name in use; count 0),
   DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_STATE (the
   strategy has failed, see dsgd_strategy_failed).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_create_variable(dsgd_strategy *s, const dsgd_dvar_desc *desc,
                                                   int *id);
/* Replica context (inside dsgd_strategy_run). Writes `value` (count floats):
     ON_WRITE: a collective every replica must call; the replicas' values are
               combined by the aggregation (SUM: sum; MEAN: mean;
               ONLY_FIRST_REPLICA: replica 0's) and every copy receives the
               result, as in tf.distribute. NONE: DSGD_ERR_INVALID_ARGUMENT
               on every replica. This rejection is ours: TF 2.21 accepts
               such a write and each replica updates only its own copy, so
               the copies silently differ (older TF raised an error).
     ON_READ:  writes this replica's copy only; no communication.
   Errors (recorded on the replica's ctx): DSGD_ERR_INVALID_ARGUMENT (r NULL,
   nothing recorded; no variable id; value NULL; ON_WRITE with aggregation
   NONE), DSGD_ERR_OUT_OF_MEMORY, and for ON_WRITE with N > 1 the errors of
   dsgd_allreduce or dsgd_broadcast (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED, ...).
   Thread safety: the replica's thread, inside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_replica_assign(dsgd_replica *r, int id, const float *value);
/* As dsgd_replica_assign, with the copy incremented by the combined delta
   (ON_WRITE) or by the replica's own delta (ON_READ).
   Errors: as dsgd_replica_assign. Thread safety: as dsgd_replica_assign. */
DSGD_API dsgd_result dsgd_replica_assign_add(dsgd_replica *r, int id, const float *delta);
/* Copies this replica's copy to out (count floats).
   Errors: DSGD_ERR_INVALID_ARGUMENT (r NULL, nothing recorded; no variable
   id; out NULL). Thread safety: the replica's thread, inside
   dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_replica_read(dsgd_replica *r, int id, float *out);
/* Cross-replica read (strategy.reduce semantics for ON_READ): ON_WRITE
   variables give replica 0's copy (all copies are equal); ON_READ variables
   give the SUM or MEAN of the copies in rank order (added in double), or
   replica 0's copy for ONLY_FIRST_REPLICA.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; no variable
   id; out NULL), DSGD_ERR_STATE (the strategy has failed, see
   dsgd_strategy_failed). Thread safety: the strategy's thread, outside
   dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_read_variable(dsgd_strategy *s, int id, float *out);
/* What replica `replica` holds, without aggregation.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; no variable
   id; out NULL; replica outside [0, N)), DSGD_ERR_STATE (the strategy has
   failed). Thread safety: the strategy's thread, outside
   dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_read_local(dsgd_strategy *s, int id, int replica, float *out);
/* Cross-replica write: ON_WRITE variables and ON_READ MEAN or
   ONLY_FIRST_REPLICA variables get `value` in every copy; ON_READ SUM
   variables get value / N in every copy, so that a read gives value back
   (as tf.distribute does).
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; no variable
   id; value NULL), DSGD_ERR_STATE (the strategy has failed).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_assign_variable(dsgd_strategy *s, int id, const float *value);
/* Finds a variable by name (-1 if none, or s or name NULL). The metrics are
   the ON_READ SUM variables "metrics/train/loss_sum", "metrics/train/correct",
   "metrics/train/count" and the same under "metrics/eval/"; between two
   dsgd_strategy_take_metrics they hold only what dsgd_replica_assign_add put
   there (the models' own accumulators are added in by the take).
   Errors: none. Thread safety: the strategy's thread, or any replica's
   inside dsgd_strategy_run (no variable is created then). */
DSGD_API int dsgd_strategy_find_variable(const dsgd_strategy *s, const char *name);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_STRATEGY_VARS_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_VARS_IMPL)
#define DSGD__PART_STRATEGY_VARS_IMPL

/* >>strategy_vars ----------------------------------------------------------- */

/* Appends a variable to the strategy's table: dsgd_strategy_create_variable
   after its checks, and the metrics at creation (strategy_create.h). */
static dsgd_result dsgd__dvar_add(dsgd_strategy *s, const dsgd_dvar_desc *d, int *id) {
    dsgd__dvar *v;
    size_t bytes, i;
    int r;
    if (s->num_vars == s->cap_vars) {
        int cap = s->cap_vars ? 2 * s->cap_vars : 16;
        dsgd__dvar *nv = (dsgd__dvar *)DSGD_REALLOC(s->vars, sizeof(dsgd__dvar) * (size_t)cap);
        if (!nv) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "cannot grow the variable table");
        s->vars = nv;
        s->cap_vars = cap;
    }
    if (dsgd__mul_overflows(d->count, (size_t)s->n * sizeof(float), &bytes))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "variable '%s': %zu floats overflow", d->name, d->count);
    v = &s->vars[s->num_vars];
    memset(v, 0, sizeof(*v));
    v->copies = (float *)dsgd__alloc(s->ctx, bytes, "dsgd_strategy_create_variable");
    if (!v->copies) return DSGD_ERR_OUT_OF_MEMORY;
    snprintf(v->name, sizeof(v->name), "%s", d->name);
    v->count = d->count;
    v->sync = d->synchronization == DSGD_SYNC_ON_READ ? DSGD_SYNC_ON_READ : DSGD_SYNC_ON_WRITE;
    v->agg = d->aggregation;
    v->trainable = d->trainable;
    for (r = 0; r < s->n; ++r)
        for (i = 0; i < d->count; ++i) v->copies[(size_t)r * d->count + i] = d->initial_value ? d->initial_value[i] : 0.0f;
    *id = s->num_vars++;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_create_variable(dsgd_strategy *s, const dsgd_dvar_desc *d, int *id) {
    const char *what = "dsgd_strategy_create_variable";
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, what) != DSGD_OK) return DSGD_ERR_STATE;
    if (!d || !id || !d->name || !d->name[0] || d->count == 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: NULL desc or id, empty name or zero count", what);
    if (strlen(d->name) > DSGD_MAX_VARIABLE_NAME)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: the name '%.40s...' has %zu bytes; at most %d (DSGD_MAX_VARIABLE_NAME)", what,
                                  d->name, strlen(d->name), DSGD_MAX_VARIABLE_NAME);
    if (dsgd_strategy_find_variable(s, d->name) >= 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: a variable named '%s' exists", what, d->name);
    if (!dsgd__agg_valid(d->aggregation) || (int)d->synchronization < 0 || (int)d->synchronization >= (int)DSGD_SYNC_COUNT)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: '%s': unknown aggregation %d or synchronization %d",
                                  what, d->name, (int)d->aggregation, (int)d->synchronization);
    if (d->synchronization == DSGD_SYNC_NONE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': synchronization NONE is not supported under a distribution strategy", what, d->name);
    if (d->synchronization == DSGD_SYNC_ON_READ && d->trainable)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': ON_READ synchronization is only for non-trainable variables", what, d->name);
    if (d->synchronization == DSGD_SYNC_ON_READ && d->aggregation == DSGD_AGG_NONE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': an ON_READ variable needs an aggregation (SUM, MEAN or ONLY_FIRST_REPLICA) "
                                  "to be read across replicas", what, d->name);
    return dsgd__dvar_add(s, d, id);
}

DSGD_API int dsgd_strategy_find_variable(const dsgd_strategy *s, const char *name) {
    int i;
    if (!s || !name) return -1;
    for (i = 0; i < s->num_vars; ++i)
        if (!strcmp(s->vars[i].name, name)) return i;
    return -1;
}

static dsgd__dvar *dsgd__dvar_get(dsgd_strategy *s, dsgd_ctx *ctx, int id, const void *buf, const char *what) {
    if (id < 0 || id >= s->num_vars || !buf) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: no variable %d, or NULL buffer", what, id);
        return NULL;
    }
    return &s->vars[id];
}

/* Combines the replicas' `value`s of an ON_WRITE variable into out (replica context). */
static dsgd_result dsgd__dvar_combine(dsgd_replica *r, dsgd__dvar *v, const float *value, float *out, const char *what) {
    dsgd_result res = DSGD_OK;
    if (v->agg == DSGD_AGG_NONE)
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s' is a mirrored (ON_WRITE) variable with aggregation NONE; updating it in "
                                  "replica context needs SUM, MEAN or ONLY_FIRST_REPLICA", what, v->name);
    memcpy(out, value, sizeof(float) * v->count);
    if (r->s->world == 1) return DSGD_OK;
    if (v->agg == DSGD_AGG_ONLY_FIRST_REPLICA)
        res = dsgd_broadcast(r->comm, out, v->count, 0, 0.0);
    else
        res = dsgd_allreduce(r->comm, out, v->count, v->agg == DSGD_AGG_SUM ? DSGD_REDUCE_SUM : DSGD_REDUCE_MEAN,
                             DSGD_ALLREDUCE_AUTO, 0.0);
    if (res != DSGD_OK) r->comm_failed = 1;
    return res;
}

static dsgd_result dsgd__replica_write(dsgd_replica *r, int id, const float *value, int add, const char *what) {
    dsgd__dvar *v;
    float *local, *tmp;
    size_t i;
    dsgd_result res;
    if (!r) return DSGD_ERR_INVALID_ARGUMENT;
    if (!(v = dsgd__dvar_get(r->s, r->m.ctx, id, value, what))) return DSGD_ERR_INVALID_ARGUMENT;
    local = v->copies + (size_t)r->local * v->count;
    if (v->sync == DSGD_SYNC_ON_READ) {
        tmp = (float *)value;
    } else {
        if (!(tmp = dsgd__replica_stage(r, v->count))) return DSGD_ERR_OUT_OF_MEMORY;
        if ((res = dsgd__dvar_combine(r, v, value, tmp, what)) != DSGD_OK) return res;
    }
    for (i = 0; i < v->count; ++i) local[i] = add ? local[i] + tmp[i] : tmp[i];
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_replica_assign(dsgd_replica *r, int id, const float *value) {
    return dsgd__replica_write(r, id, value, 0, "dsgd_replica_assign");
}

DSGD_API dsgd_result dsgd_replica_assign_add(dsgd_replica *r, int id, const float *delta) {
    return dsgd__replica_write(r, id, delta, 1, "dsgd_replica_assign_add");
}

DSGD_API dsgd_result dsgd_replica_read(dsgd_replica *r, int id, float *out) {
    dsgd__dvar *v;
    if (!r) return DSGD_ERR_INVALID_ARGUMENT;
    if (!(v = dsgd__dvar_get(r->s, r->m.ctx, id, out, "dsgd_replica_read"))) return DSGD_ERR_INVALID_ARGUMENT;
    memcpy(out, v->copies + (size_t)r->local * v->count, sizeof(float) * v->count);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_read_local(dsgd_strategy *s, int id, int replica, float *out) {
    dsgd__dvar *v;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, "dsgd_strategy_read_local") != DSGD_OK) return DSGD_ERR_STATE;
    if (!(v = dsgd__dvar_get(s, s->ctx, id, out, "dsgd_strategy_read_local"))) return DSGD_ERR_INVALID_ARGUMENT;
    if (replica < 0 || replica >= s->n)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_read_local: no replica %d", replica);
    memcpy(out, v->copies + (size_t)replica * v->count, sizeof(float) * v->count);
    return DSGD_OK;
}

/* The cross-replica SUM (or MEAN) of an ON_READ variable across workers:
   every local replica all-reduces its copy over the group (a collective of
   all W replicas, so every worker calls it), in float. */
typedef struct dsgd__world_sum {
    dsgd__dvar *v;
    float *buf; /* n copies */
} dsgd__world_sum;

static dsgd_result dsgd__world_sum_job(dsgd_replica *r, void *user) {
    dsgd__world_sum *w = (dsgd__world_sum *)user;
    float *mine = w->buf + (size_t)r->local * w->v->count;
    dsgd_result res;
    memcpy(mine, w->v->copies + (size_t)r->local * w->v->count, sizeof(float) * w->v->count);
    res = dsgd_allreduce(r->comm, mine, w->v->count, w->v->agg == DSGD_AGG_MEAN ? DSGD_REDUCE_MEAN : DSGD_REDUCE_SUM,
                         DSGD_ALLREDUCE_AUTO, 0.0);
    if (res != DSGD_OK) r->comm_failed = 1;
    return res;
}

static dsgd_result dsgd__dvar_world_sum(dsgd_strategy *s, dsgd__dvar *v, float *out) {
    dsgd__world_sum w;
    dsgd_result res;
    size_t bytes;
    if (dsgd__mul_overflows(v->count, (size_t)s->n * sizeof(float), &bytes))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "variable '%s' is too large", v->name);
    w.v = v;
    if (!(w.buf = (float *)dsgd__alloc(s->ctx, bytes, "dsgd_strategy_read_variable"))) return DSGD_ERR_OUT_OF_MEMORY;
    res = dsgd__strategy_dispatch(s, dsgd__world_sum_job, &w, "dsgd_strategy_read_variable");
    if (res == DSGD_OK) memcpy(out, w.buf, sizeof(float) * v->count);
    DSGD_FREE(w.buf);
    return res;
}

DSGD_API dsgd_result dsgd_strategy_read_variable(dsgd_strategy *s, int id, float *out) {
    dsgd__dvar *v;
    size_t i;
    int r;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, "dsgd_strategy_read_variable") != DSGD_OK) return DSGD_ERR_STATE;
    if (!(v = dsgd__dvar_get(s, s->ctx, id, out, "dsgd_strategy_read_variable"))) return DSGD_ERR_INVALID_ARGUMENT;
    if (v->sync == DSGD_SYNC_ON_WRITE || v->agg == DSGD_AGG_ONLY_FIRST_REPLICA) {
        memcpy(out, v->copies, sizeof(float) * v->count);
        return DSGD_OK;
    }
    if (s->world > s->n) return dsgd__dvar_world_sum(s, v, out);
    for (i = 0; i < v->count; ++i) {
        double acc = 0.0; /* rank order, in double */
        for (r = 0; r < s->n; ++r) acc += v->copies[(size_t)r * v->count + i];
        out[i] = (float)(v->agg == DSGD_AGG_MEAN ? acc / s->n : acc);
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_assign_variable(dsgd_strategy *s, int id, const float *value) {
    dsgd__dvar *v;
    size_t i;
    int r;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, "dsgd_strategy_assign_variable") != DSGD_OK) return DSGD_ERR_STATE;
    if (!(v = dsgd__dvar_get(s, s->ctx, id, value, "dsgd_strategy_assign_variable"))) return DSGD_ERR_INVALID_ARGUMENT;
    for (r = 0; r < s->n; ++r)
        for (i = 0; i < v->count; ++i)
            v->copies[(size_t)r * v->count + i] =
                (v->sync == DSGD_SYNC_ON_READ && v->agg == DSGD_AGG_SUM) ? value[i] / (float)s->world : value[i];
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_take_metrics(dsgd_strategy *s, dsgd_metrics_slot slot, dsgd_metrics *out) {
    int r, k;
    float vals[3];
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_usable(s, "dsgd_strategy_take_metrics")) != DSGD_OK) return res;
    if (!out || (slot != DSGD_METRICS_TRAIN && slot != DSGD_METRICS_EVAL))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_take_metrics: bad slot or NULL out");
    /* move each replica's device-side accumulators into its local copies */
    for (r = 0; r < s->n; ++r) {
        dsgd_metrics m;
        if ((res = dsgd_model_take_metrics(s->reps[r].m.model, slot, &m)) != DSGD_OK)
            return dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(s->reps[r].m.ctx));
        vals[0] = (float)m.loss_sum;
        vals[1] = (float)m.correct;
        vals[2] = (float)m.count;
        for (k = 0; k < 3; ++k) s->vars[s->metric_var[slot] + k].copies[r] += vals[k];
    }
    /* the cross-replica read (SUM; across workers a collective), then reset */
    for (k = 0; k < 3; ++k)
        if ((res = dsgd_strategy_read_variable(s, s->metric_var[slot] + k, &vals[k])) != DSGD_OK) return res;
    out->loss_sum = vals[0];
    out->correct = vals[1];
    out->count = vals[2];
    for (k = 0; k < 3; ++k)
        for (r = 0; r < s->n; ++r) s->vars[s->metric_var[slot] + k].copies[r] = 0.0f;
    return DSGD_OK;
}

#endif /* DSGD__PART_STRATEGY_VARS_IMPL */
