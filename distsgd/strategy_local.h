/* distsgd/strategy_local.h - local SGD, post-local SGD and DiLoCo: replicas that train alone and average
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   LOCAL SGD (DSGD_STRATEGY_LOCAL)

     Mirrored replicas that exchange their weights every H steps instead of
     their gradients every step: local SGD (Stich 2019; Lin et al. 2020),
     post-local SGD (Lin et al. 2020: synchronous steps first) and DiLoCo
     (Douillard et al. 2023: an outer Nesterov step on the averaged change,
     with AdamW inside). desc.local (dsgd_strategy_local_desc) holds the
     period H (default 8), the warmup_steps, the outer kind (AVERAGE,
     NESTEROV, SGD), outer_lr and outer_momentum.

     Steps, counted by the optimizer (dsgd_step_info.step, t):
       - t < warmup_steps: exactly MIRRORED's step (the same code: the
         gradient of the global batch, all-reduced, one update everywhere:
         the very bits of a MIRRORED strategy of as many replicas);
       - afterwards, rounds of H steps. At a round's first step each
         replica keeps its weights as the round's start theta0 (equal on
         every replica). Each step, replica g takes its shard
         dsgd_block_range(count, W, g) of the global batch, as mirrored
         does, and updates its own weights with its own optimizer
         (desc.optimizer: its own state, e.g. DiLoCo's inner AdamW) from
         the mean gradient of its shard alone: no gradient is exchanged.
         The only per-step communication is the agreement of the
         synchronous step (one float, a MAX all-reduce; with a batch fn
         also the count, one float), so that a failure or a non-finite
         gradient on one replica stops or skips every replica alike, as in
         strategy.h's failure rules: an agreed failure changes nothing, a
         skipped step is skipped everywhere, and the replicas' step counts
         (so their rounds) never part; local.agree_in_process takes it in
         memory instead (AGREEMENT IN PROCESS below);
       - after a round's last update (t - warmup_steps = k H - 1), the
         replicas average: the pseudo-gradient delta = theta0 - theta is
         all-reduced (SUM, in float32, with desc.algorithm in buckets of
         bucket_bytes, as the gradient is: every algorithm sums in a fixed
         order; with local.wire F16 or BF16 the ring carries it in 2 bytes
         a parameter, summed in fp32 at every hop: dsgd_allreduce_wire) and
         divided by W, then the outer step makes the new theta0:
           AVERAGE   theta0 - mean(delta): the replicas' mean weights,
                     within one rounding (computed this way so that every
                     outer kind exchanges the same thing);
           NESTEROV  the MOMENTUM optimizer's Nesterov rule (optim.h's,
                     backend optimizer_update): v = mu v + mean(delta);
                     theta0 -= outer_lr (mean(delta) + mu v);
           SGD       the SGD optimizer's rule: theta0 -= outer_lr mean(delta)
                     (NESTEROV with mu 0, bit for bit; with outer_lr 1
                     AVERAGE's bits);
         every replica takes it (theta = theta0) and keeps its inner
         optimizer's state (DiLoCo's choice). dsgd_step_info.averaged says
         the step averaged, and exchange_s how long the all-reduce took.
     With H = 1 and SGD inside, a step is mirrored's up to rounding (each
     replica's update of its mean shard gradient, averaged).

     Between averagings the replicas differ: dsgd_strategy_model(s, r)
     gives replica r's own weights; dsgd_strategy_eval_batch evaluates
     each replica with its own weights on its shard (the metrics sum them
     all); evaluate one model (the mean is a round's start, and the
     replicas equal it right after a round's last step) for one model's
     numbers. Model variables are not distributed variables (those of
     dsgd_strategy_create_variable behave as under MIRRORED).
     dsgd_strategy_set_aggregation applies to the warmup steps; a local
     step uses its shard's mean gradient, and the averaging the mean over
     replicas, whatever the aggregation.

     Multi-worker: as MULTI_WORKER_MIRRORED, the kind takes desc.endpoints
     spanning processes (a loopback hub's, the MPI add-on's, simnet's with
     park_between_calls), replica g being global rank g of W; every worker
     calls every step; without endpoints the replicas share a loopback of
     the strategy's own. The gradients take the HOST path (gradient_path
     DEVICE and overlap are refused).

     AGREEMENT IN PROCESS (local.agree_in_process non-zero)

     Over a network the per-step agreement is a latency-bound all-reduce
     (about 2 log2 W message latencies) every step, which for a small
     model on a slow link is most of what local SGD saves: over simnet
     (4 ranks, 50 us a message, 1 ns a byte; a 99-parameter
     model, no compute charged) 8 rounds of H 8 take 14.5 ms of virtual
     time and 1152 messages with it, 1.66 ms and 128 messages without.
     With agree_in_process a local step's agreement is taken in memory by
     this process's replicas (their threads meet; the strategy's thread
     sees them all), and a local step calls no collective: a round's only
     one is its averaging. What changes:
       - every replica in this process (no endpoints, or endpoints of
         this process only): nothing but the traffic. The in-memory
         agreement is the whole group's, so the bits, the failure rules
         and dsgd_step_info are exactly those of the agreement over the
         transport (a batch fn's count is summed in memory too);
       - across workers (W > N): the verdict is this worker's.
         A failure in a local step (a replica's own code, its gradient)
         stops this worker's replicas and fails the strategy (it is not
         agreed: the other workers took the step); so does a non-finite
         gradient under DSGD_NONFINITE_ERROR. The other workers run on
         through their local steps and fail at their next collective, the
         round's averaging, at the latest: at once over a transport whose
         abort reaches them (a loopback hub), else at their deadline
         (DSGD_ERR_TIMEOUT naming a rank of the failed worker), never a
         hang. Under DSGD_NONFINITE_SKIP a non-finite gradient skips the
         update on this worker's replicas alone (the others update;
         info.skipped is 1 on this worker only) and the step is counted
         (dsgd_optimizer_steps moves, as if updated with nothing), so that
         every replica's step count stays equal and the rounds line up;
         the averaging then takes the replicas' weights as they are. The
         bits stay deterministic (the same inputs, the same weights), and
         with no failed or skipped step they are the agreement's;
       - across workers a batch fn's count is still all-reduced every
         step (one float: the uneven end of an epoch and a failed fn must
         be known everywhere; a failed fn stays an agreed failure that
         changes nothing); dsgd_strategy_train_step's sliced batches
         exchange nothing between averagings;
       - the warmup's steps are mirrored's, agreed as always.
     Every worker must pass the same agree_in_process (the creation's
     fingerprint checks it).

     Checkpoints (dsgd_strategy_save): the common sections hold replica
     0's weights and inner optimizer (what another kind restores), and a
     section "local" every replica's weights, inner optimizer state and
     last clipped norm (they differ mid-round), the round's start, the
     outer momentum and the step within the round; across workers the
     save all-gathers every replica's (W x (1 + slots) x parameters
     floats on every replica: mind the memory). A restore at the same
     replica count, period and warmup is exact mid-round (training on
     gives the bits of a run never interrupted). At another count, period
     or warmup it is refused (DSGD_ERR_SHAPE) unless the file was saved at
     a round's boundary (or in the warmup): then every replica takes the
     saved weights and replica 0's inner optimizer state. Another outer
     kind is refused. A checkpoint without a "local" section (another
     kind's) restores the common state into every replica, the weights
     then being the round's start.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_LOCAL) && !defined(DSGD__PART_STRATEGY_LOCAL_IMPL)
#define DSGD__PART_STRATEGY_LOCAL_IMPL

/* >>strategy_local ---------------------------------------------------------- */

/* A replica's round: its start theta0 and pseudo-gradient on its backend,
   and the outer optimizer over theta0 (no slot for AVERAGE and SGD). */
typedef struct dsgd__local_rep {
    dsgd_buffer *start, *delta;
    dsgd__opt_state outer;
    int have_outer;
} dsgd__local_rep;

typedef struct dsgd__local {
    dsgd__local_rep *reps; /* [n] */
    int inner_slots, outer_slots;
    /* a save across workers: every replica's record (ck_put with w NULL) */
    float *gathered;
    size_t rec; /* floats per record: weights, inner slots, last norm (2) */
    /* a restore: the checked section (phase 0 for phase 1) */
    const dsgd__ck_section *sec;
    uint32_t saved_world;
    int exact;
    const unsigned char *start, *oslot, *records; /* in the file's image */
    /* AGREEMENT IN PROCESS (n > 1): the replicas' meeting in memory: each
       one's sum and max entries [2 n], the totals of the last meeting */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int meets;
    int arrived;
    uint64_t gen;
    float *meet;
    float sum, max;
} dsgd__local;

#define DSGD__LOCAL_DEFAULT_PERIOD 8

static dsgd_result dsgd__local_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    const char *what = "dsgd_strategy_create";
    const dsgd_strategy_local_desc *l = &d->local;
    if (d->gradient_path == DSGD_GRADIENTS_DEVICE || d->overlap)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: local exchanges on the HOST path, after backward (gradient_path DEVICE and "
                                  "overlap are for mirrored)", what);
    if (l->period < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: local.period %d: the steps between averagings must be >= 1 (0: %d)", what,
                                  l->period, DSGD__LOCAL_DEFAULT_PERIOD);
    if (l->warmup_steps < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: local.warmup_steps %lld is negative", what,
                                  (long long)l->warmup_steps);
    if ((int)l->outer < 0 || (int)l->outer >= (int)DSGD_OUTER_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown local.outer %d", what, (int)l->outer);
    if (l->outer != DSGD_OUTER_AVERAGE && !(l->outer_lr >= 0.0f && isfinite(l->outer_lr)))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: local.outer_lr %g: the outer learning rate must be > 0 and finite (0: the "
                                  "default)", what, (double)l->outer_lr);
    if (l->outer == DSGD_OUTER_NESTEROV && !(l->outer_momentum >= 0.0f && l->outer_momentum < 1.0f))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: local.outer_momentum %g must lie in [0, 1) (0: 0.9; no momentum: outer SGD)",
                                  what, (double)l->outer_momentum);
    if ((int)l->wire < 0 || (int)l->wire >= (int)DSGD_WIRE_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown local.wire %d", what, (int)l->wire);
    if (l->wire != DSGD_WIRE_F32 && d->algorithm != DSGD_ALLREDUCE_AUTO && d->algorithm != DSGD_ALLREDUCE_RING)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: local.wire %s runs the ring; algorithm %s cannot carry it (AUTO or RING)", what,
                                  dsgd_wire_name(l->wire), dsgd_allreduce_algo_name(d->algorithm));
    return DSGD_OK;
}

/* The local desc's defaults, in one place (the desc's comments list them). */
static void dsgd__local_defaults(dsgd_strategy_local_desc *l) {
    if (l->period == 0) l->period = DSGD__LOCAL_DEFAULT_PERIOD;
    if (l->outer_lr == 0.0f) l->outer_lr = l->outer == DSGD_OUTER_NESTEROV ? 0.7f : 1.0f;
    if (l->outer_momentum == 0.0f && l->outer == DSGD_OUTER_NESTEROV) l->outer_momentum = 0.9f;
    if (l->outer != DSGD_OUTER_NESTEROV) l->outer_momentum = 0.0f;
    if (l->outer == DSGD_OUTER_AVERAGE) l->outer_lr = 0.0f;
    l->agree_in_process = l->agree_in_process != 0;
}

/* Without endpoints a loopback of the strategy's own; with them, the group
   across workers (the common rule of a multi-worker kind). */
static dsgd_result dsgd__local_layout(dsgd_strategy *s) {
    return s->d.endpoints ? dsgd__strategy_transport(s) : dsgd__strategy_endpoints(s, NULL);
}

static void dsgd__local_teardown(dsgd_strategy *s) {
    dsgd__local *L = (dsgd__local *)s->kind_data;
    int i;
    if (!L) return;
    for (i = 0; L->reps && i < s->n; ++i) {
        const dsgd_backend_i *be = &s->reps[i].m.be;
        dsgd__local_rep *lr = &L->reps[i];
        if (lr->have_outer) dsgd__opt_state_free(&lr->outer);
        if (lr->start) be->buffer_destroy(be->impl, lr->start);
        if (lr->delta) be->buffer_destroy(be->impl, lr->delta);
    }
    DSGD_FREE(L->reps);
    DSGD_FREE(L->gathered);
    DSGD_FREE(L->meet);
    if (L->meets) {
        pthread_cond_destroy(&L->cv);
        pthread_mutex_destroy(&L->mu);
    }
    DSGD_FREE(L);
    s->kind_data = NULL;
}

static dsgd_result dsgd__local_ck_put(dsgd_strategy *s, dsgd__ck_writer *w);
static dsgd_result dsgd__local_ck_take(dsgd_strategy *s, const dsgd__ck_file *f, int phase);

/* Each replica's round buffers and outer optimizer on its backend. */
static dsgd_result dsgd__local_setup(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    dsgd__local *L = (dsgd__local *)dsgd__alloc(s->ctx, sizeof(*L), what);
    dsgd_optimizer_desc od;
    dsgd_result res = DSGD_OK;
    int i;
    if (!L) return DSGD_ERR_OUT_OF_MEMORY;
    memset(L, 0, sizeof(*L));
    s->kind_data = L;
    dsgd__local_defaults(&s->d.local);
    s->ck_put = dsgd__local_ck_put;
    s->ck_take = dsgd__local_ck_take;
    if (s->n == 0) return DSGD_OK;
    if (s->d.local.agree_in_process && s->n > 1) {
        if (!(L->meet = (float *)dsgd__alloc(s->ctx, sizeof(float) * 2 * (size_t)s->n, what)))
            return DSGD_ERR_OUT_OF_MEMORY;
        if (pthread_mutex_init(&L->mu, NULL) != 0) goto no_sync;
        if (pthread_cond_init(&L->cv, NULL) != 0) {
            pthread_mutex_destroy(&L->mu);
            goto no_sync;
        }
        L->meets = 1;
    }
    L->reps = (dsgd__local_rep *)dsgd__alloc(s->ctx, sizeof(dsgd__local_rep) * (size_t)s->n, what);
    if (!L->reps) return DSGD_ERR_OUT_OF_MEMORY;
    memset(L->reps, 0, sizeof(dsgd__local_rep) * (size_t)s->n);
    memset(&od, 0, sizeof(od)); /* the outer optimizer: no schedule, no decay, no clipping */
    od.kind = s->d.local.outer == DSGD_OUTER_NESTEROV ? DSGD_OPT_MOMENTUM : DSGD_OPT_SGD;
    od.lr = s->d.local.outer_lr;
    od.momentum = s->d.local.outer_momentum;
    od.nesterov = 1;
    L->inner_slots = dsgd_optimizer_num_slots(s->reps[0].opt);
    L->outer_slots = dsgd__opt_kind_slots(od.kind);
    for (i = 0; i < s->n && res == DSGD_OK; ++i) {
        dsgd_replica *r = &s->reps[i];
        const dsgd_backend_i *be = &r->m.be;
        dsgd__local_rep *lr = &L->reps[i];
        size_t p = dsgd_model_num_params(r->m.model);
        if ((res = be->buffer_create(be->impl, p ? p : 1, &lr->start)) == DSGD_OK &&
            (res = be->buffer_create(be->impl, p ? p : 1, &lr->delta)) == DSGD_OK &&
            (res = be->copy(be->impl, dsgd__ref(lr->start, 0), dsgd_model_params(r->m.model), p)) == DSGD_OK &&
            s->d.local.outer != DSGD_OUTER_AVERAGE) {
            lr->have_outer = 1;
            res = dsgd__opt_state_init(&lr->outer, be, &od, p);
        }
        if (res != DSGD_OK && dsgd_ctx_last_result(r->m.ctx) != DSGD_OK)
            dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(r->m.ctx));
    }
    return res;
no_sync:
    return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot create the replicas' meeting (a mutex)", what);
}

/* t's place in its round (t >= warmup_steps): 0 the round's first step,
   H - 1 its last. */
static int64_t dsgd__local_pos(const dsgd_strategy *s, int64_t t) {
    return (t - s->d.local.warmup_steps) % s->d.local.period;
}

/* Replica r's pseudo-gradient in host memory (its buffer's host pointer,
   or staged: *staged set), or NULL on failure (recorded). */
static float *dsgd__local_host(dsgd_replica *r, dsgd_ref d, size_t p, int *staged, dsgd_result *res) {
    const dsgd_backend_i *be = &r->m.be;
    float *host = be->buffer_host_ptr ? be->buffer_host_ptr(be->impl, d.buf) : NULL;
    *staged = 0;
    *res = DSGD_OK;
    if (host) {
        if (be->finish && (*res = be->finish(be->impl)) != DSGD_OK) return NULL;
        return host + d.off;
    }
    if (!(host = dsgd__replica_stage(r, p))) {
        *res = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    *staged = 1;
    if ((*res = be->read(be->impl, d, host, p)) != DSGD_OK) return NULL;
    return host;
}

/* The averaging after a round's last update: delta = theta0 - theta,
   all-reduced (SUM) and divided by W, the outer step on theta0 (round
   `round`, 0-based), theta = theta0. */
static dsgd_result dsgd__local_average(dsgd_replica *r, int64_t round) {
    dsgd_strategy *s = r->s;
    dsgd__local_rep *lr = &((dsgd__local *)s->kind_data)->reps[r->local];
    const dsgd_backend_i *be = &r->m.be;
    size_t p = dsgd_model_num_params(r->m.model), o, bucket, i;
    dsgd_ref start = dsgd__ref(lr->start, 0), delta = dsgd__ref(lr->delta, 0), params = dsgd_model_params(r->m.model);
    float *host, w = (float)s->world;
    int staged;
    double t0;
    dsgd_result res = be->copy(be->impl, delta, start, p);
    if (res == DSGD_OK) res = be->axpy(be->impl, delta, -1.0f, params, p); /* theta0 - theta */
    if (res != DSGD_OK) return res;
    if (!(host = dsgd__local_host(r, delta, p, &staged, &res))) return res;
    t0 = dsgd_now();
    bucket = s->d.bucket_bytes / sizeof(float);
    if (bucket == 0 || bucket > p) bucket = p;
    for (o = 0; o < p && s->world > 1 && res == DSGD_OK; o += bucket) /* F32: dsgd_allreduce_at itself */
        res = dsgd_allreduce_wire(r->comm, host + o, DSGD__MIN(bucket, p - o), o, DSGD_REDUCE_SUM, s->d.algorithm,
                                  s->d.local.wire, 0.0);
    r->exchange_s = r->exposed_s = dsgd_now() - t0;
    if (res != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    for (i = 0; i < p; ++i) host[i] /= w; /* the mean */
    if (staged && (res = be->write(be->impl, delta, host, p)) != DSGD_OK) return res;
    if (s->d.local.outer == DSGD_OUTER_AVERAGE) res = be->axpy(be->impl, start, -1.0f, delta, p);
    else res = dsgd__opt_state_update(&lr->outer, round, start, delta, 1.0f);
    if (res == DSGD_OK) res = be->copy(be->impl, params, start, p);
    if (res == DSGD_OK) r->averaged = 1;
    return res;
}

/* AGREEMENT IN PROCESS: this process's replicas meet in memory: each
   brings *sum and *max and leaves with every replica's sum (added in
   replica order, so the same bits every run) and their max. Every
   replica of the step must come (no early return before it). */
static void dsgd__local_meet(dsgd_replica *r, float *sum, float *max) {
    dsgd_strategy *s = r->s;
    dsgd__local *L = (dsgd__local *)s->kind_data;
    uint64_t gen;
    int i;
    if (s->n == 1) return;
    pthread_mutex_lock(&L->mu);
    L->meet[2 * r->local] = *sum;
    L->meet[2 * r->local + 1] = *max;
    gen = L->gen;
    if (++L->arrived == s->n) { /* the last one sums; nobody can start the next meeting before all read this one */
        L->sum = 0.0f;
        L->max = L->meet[1];
        for (i = 0; i < s->n; ++i) {
            L->sum += L->meet[2 * i];
            if (L->meet[2 * i + 1] > L->max) L->max = L->meet[2 * i + 1];
        }
        L->arrived = 0;
        ++L->gen;
        pthread_cond_broadcast(&L->cv);
    } else {
        while (L->gen == gen) pthread_cond_wait(&L->cv, &L->mu);
    }
    *sum = L->sum;
    *max = L->max;
    pthread_mutex_unlock(&L->mu);
}

/* Phase 0 in process: the batch; a batch fn's count is summed in memory
   when every replica is in this process, else over the transport (the
   synchronous step's phase 0: the uneven end of an epoch and a failed fn
   must be known to every worker). */
static dsgd_result dsgd__local_batch(dsgd_replica *r, const dsgd__step_args *a, dsgd_batch *b) {
    dsgd_strategy *s = r->s;
    float total, none = 0.0f;
    dsgd_result res;
    if (!a->fn || s->world > s->n) return dsgd__step_batch(r, a, b, &r->global);
    res = dsgd__replica_fn_batch(r, a, b);
    total = res == DSGD_OK ? (float)b->count : -1099511627776.0f;
    dsgd__local_meet(r, &total, &none);
    r->global = total < 0.0f ? -1 : (int)total;
    return res;
}

/* A local step with the agreement in process (t >= warmup_steps): batch,
   gradient, the verdict of this process's replicas from a meeting in
   memory, the update, the averaging at a round's last step. With every
   replica here (all) the verdict is the group's: the rules of the
   agreement over the transport, bit for bit. Across workers it is this
   worker's: a failure or an ERROR verdict fails the strategy (the other
   workers, which stepped, learn it at their next collective, the round's
   averaging, at the latest), a SKIP verdict skips the update here but
   counts the step, so that every worker's rounds stay aligned. */
static dsgd_result dsgd__local_step_in_process(dsgd_replica *r, const dsgd__step_args *a, int64_t t) {
    dsgd_strategy *s = r->s;
    dsgd__local_rep *lr = &((dsgd__local *)s->kind_data)->reps[r->local];
    dsgd_model *m = r->m.model;
    const dsgd_backend_i *be = &r->m.be;
    size_t p = dsgd_model_num_params(m), bad = 0;
    int all = s->world == s->n;
    int64_t pos = dsgd__local_pos(s, t);
    float none = 0.0f, flag;
    dsgd_batch b;
    dsgd_result res = dsgd__local_batch(r, a, &b);                        /* 0 */
    if (r->comm_failed) dsgd__strategy_abort(s, r->local); /* the others here must not wait for it in the transport */
    if (res == DSGD_OK && r->global > 0) {                                 /* 1: its shard's mean gradient, alone */
        res = b.count > 0 ? dsgd_model_gradients(m, &b, 1.0f / (float)b.count)
                          : be->fill(be->impl, dsgd_model_grads(m), 0.0f, p);
        if (res == DSGD_OK) res = be->norm_check(be->impl, dsgd_model_grads(m), p, NULL, &bad);
    }
    flag = res != DSGD_OK ? (float)(2 + r->rank) : (bad ? 1.0f : 0.0f);
    dsgd__local_meet(r, &none, &flag);                                     /* 2, in memory */
    if (r->comm_failed || (res == DSGD_OK && r->global == 0)) return res;
    if (r->global < 0 || flag >= 2.0f) {
        /* a batch fn failed (the count told every worker: agreed), or a
           gradient failed here (agreed only when every replica is here) */
        if (r->global < 0 || all) r->clean_fail = 1;
        if (flag >= 2.0f) r->stop_by = (int)flag - 2;
        if (res != DSGD_OK) return res;
        r->own_error = 0;
        if (flag < 2.0f)
            return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_ABORTED,
                                      "step %lld abandoned: a replica of another worker failed its batch function",
                                      (long long)t);
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_ABORTED, "step %lld abandoned: replica %d failed%s", (long long)t,
                                  (int)flag - 2,
                                  all ? "" : " (a local step across workers, agreed in process: the strategy fails)");
    }
    if (flag == 1.0f) {
        if (s->d.nonfinite == DSGD_NONFINITE_ERROR) {
            r->clean_fail = all;
            r->own_error = bad != 0;
            return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_NON_FINITE,
                                      "step %lld: non-finite gradient (%zu NaN/Inf values on this replica); every "
                                      "replica %s",
                                      (long long)t, bad,
                                      all ? "stops" : "of this worker stops and the strategy fails (a local step "
                                                      "across workers, agreed in process)");
        }
        r->skipped = 1;
        if (all) return DSGD_OK; /* skipped everywhere: the step is not counted */
    }
    if (pos == 0 && (res = be->copy(be->impl, dsgd__ref(lr->start, 0), dsgd_model_params(m), p)) != DSGD_OK)
        return res;                                                        /* the round's start */
    if (!r->skipped) res = dsgd_optimizer_step(r->opt);                    /* its own update */
    else dsgd__optimizer_set_steps(r->opt, t + 1); /* skipped on this worker alone: counted, the rounds aligned */
    if (res == DSGD_OK && pos == s->d.local.period - 1)
        res = dsgd__local_average(r, (t - s->d.local.warmup_steps) / s->d.local.period);
    return res;
}

/* One replica's part of a step: the warmup's synchronous step, or a local
   step (batch, its own gradient, the agreement, its own update) ending
   with the averaging at a round's last step. */
static dsgd_result dsgd__local_step(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_strategy *s = r->s;
    dsgd__local_rep *lr = &((dsgd__local *)s->kind_data)->reps[r->local];
    dsgd_model *m = r->m.model;
    const dsgd_backend_i *be = &r->m.be;
    size_t p = dsgd_model_num_params(m), bad = 0;
    int64_t t = dsgd_optimizer_steps(r->opt), pos;
    dsgd_batch b;
    dsgd_result res;
    r->averaged = 0;
    if (t < s->d.local.warmup_steps) return dsgd__sync_step(r, user); /* post-local SGD: mirrored's step */
    dsgd__step_note(r);
    r->skipped = 0;
    r->exchange_s = r->exposed_s = 0.0;
    if (s->d.local.agree_in_process) return dsgd__local_step_in_process(r, a, t);
    res = dsgd__step_batch(r, a, &b, &r->global);                          /* 0 */
    if (r->comm_failed || (res == DSGD_OK && r->global == 0)) return res;
    if (res == DSGD_OK) { /* 1: its shard's mean gradient, alone */
        res = b.count > 0 ? dsgd_model_gradients(m, &b, 1.0f / (float)b.count)
                          : be->fill(be->impl, dsgd_model_grads(m), 0.0f, p);
        if (res == DSGD_OK) res = be->norm_check(be->impl, dsgd_model_grads(m), p, NULL, &bad);
    }
    res = dsgd__step_agree(r, res, bad, &r->skipped);                      /* 2 */
    if (res != DSGD_OK || r->skipped) return res;
    pos = dsgd__local_pos(s, t);
    if (pos == 0 && (res = be->copy(be->impl, dsgd__ref(lr->start, 0), dsgd_model_params(m), p)) != DSGD_OK)
        return res;                                                        /* the round's start */
    if ((res = dsgd_optimizer_step(r->opt)) != DSGD_OK) return res;        /* its own update */
    if (pos == s->d.local.period - 1) res = dsgd__local_average(r, (t - s->d.local.warmup_steps) / s->d.local.period);
    return res;
}

/* ---- the checkpoint's section "local":
     u32 W, outer kind, period; u64 warmup_steps, t; u32 the step within
     the round, inner slots, outer slots; u64 parameters p;
     p floats the round's start, outer slots x p floats the outer state;
     W records of (1 + inner slots) x p floats (weights, slots);
     W f64, each replica's last clipped norm */

/* The floats of one replica's record as the save all-gathers it: the
   section's, then its last clipped norm (a double's bytes in two floats). */
static size_t dsgd__local_rec(const dsgd_strategy *s, size_t p) {
    return (size_t)(1 + ((dsgd__local *)s->kind_data)->inner_slots) * p + 2;
}

/* Replica r packs its record into rec. */
static dsgd_result dsgd__local_pack(dsgd_replica *r, float *rec, size_t p) {
    const dsgd_backend_i *be = &r->m.be;
    dsgd__opt_run *o = dsgd__optimizer_run(r->opt);
    int k, slots = dsgd__opt_state_slots(&o->st);
    dsgd_result res = be->read(be->impl, dsgd_model_params(r->m.model), rec, p);
    for (k = 0; k < slots && res == DSGD_OK; ++k) res = be->read(be->impl, dsgd__ref(o->st.slot[k], 0), rec + (size_t)(1 + k) * p, p);
    memcpy(rec + (size_t)(1 + slots) * p, &o->last_norm, sizeof(double));
    return res;
}

/* Across workers: every replica packs its record and all-gathers the
   world's; local replica 0 keeps them (on the chief, for ck_put). */
static dsgd_result dsgd__local_gather_job(dsgd_replica *r, void *user) {
    dsgd_strategy *s = r->s;
    dsgd__local *L = (dsgd__local *)s->kind_data;
    size_t n = L->rec * (size_t)s->world;
    float *buf = dsgd__replica_stage(r, n);
    dsgd_result res;
    (void)user;
    r->clean_fail = 1; /* nothing changes */
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    if ((res = dsgd__local_pack(r, buf + (size_t)r->rank * L->rec, dsgd_model_num_params(r->m.model))) != DSGD_OK)
        return res;
    if ((res = dsgd_allgather(r->comm, buf, n, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if (r->local == 0) memcpy(L->gathered, buf, sizeof(float) * n);
    return DSGD_OK;
}

static dsgd_result dsgd__local_ck_put(dsgd_strategy *s, dsgd__ck_writer *w) {
    dsgd__local *L = (dsgd__local *)s->kind_data;
    dsgd_replica *r0 = &s->reps[0];
    const dsgd_backend_i *be = &r0->m.be;
    size_t p = dsgd_model_num_params(r0->m.model), bytes;
    int64_t t = dsgd_optimizer_steps(r0->opt);
    int g, k;
    if (!w) { /* every process: across workers, bring every replica's record */
        DSGD_FREE(L->gathered);
        L->gathered = NULL;
        if (s->world == s->n) return DSGD_OK;
        L->rec = dsgd__local_rec(s, p);
        if (dsgd__mul_overflows(L->rec, (size_t)s->world * sizeof(float), &bytes))
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_strategy_save: the replicas' state is too large");
        if (!(L->gathered = (float *)dsgd__alloc(s->ctx, bytes, "dsgd_strategy_save"))) return DSGD_ERR_OUT_OF_MEMORY;
        return dsgd__strategy_dispatch(s, dsgd__local_gather_job, NULL, "dsgd_strategy_save");
    }
    dsgd__ckw_begin(w, "local");
    dsgd__ckw_u32(w, (uint32_t)s->world);
    dsgd__ckw_u32(w, (uint32_t)s->d.local.outer);
    dsgd__ckw_u32(w, (uint32_t)s->d.local.period);
    dsgd__ckw_u64(w, (uint64_t)s->d.local.warmup_steps);
    dsgd__ckw_u64(w, (uint64_t)t);
    dsgd__ckw_u32(w, (uint32_t)(t < s->d.local.warmup_steps ? 0 : dsgd__local_pos(s, t)));
    dsgd__ckw_u32(w, (uint32_t)L->inner_slots);
    dsgd__ckw_u32(w, (uint32_t)L->outer_slots);
    dsgd__ckw_u64(w, (uint64_t)p);
    dsgd__ckw_read(w, be, dsgd__ref(L->reps[0].start, 0), p);
    for (k = 0; k < L->outer_slots; ++k) dsgd__ckw_read(w, be, dsgd__ref(L->reps[0].outer.slot[k], 0), p);
    for (g = 0; g < s->world; ++g) {
        if (L->gathered) {
            dsgd__ckw_floats(w, L->gathered + (size_t)g * L->rec, L->rec - 2);
        } else {
            dsgd_replica *r = &s->reps[g];
            dsgd__opt_run *o = dsgd__optimizer_run(r->opt);
            dsgd__ckw_read(w, &r->m.be, dsgd_model_params(r->m.model), p);
            for (k = 0; k < L->inner_slots; ++k) dsgd__ckw_read(w, &r->m.be, dsgd__ref(o->st.slot[k], 0), p);
        }
    }
    for (g = 0; g < s->world; ++g) { /* the norms, after the floats */
        double norm;
        if (L->gathered) memcpy(&norm, L->gathered + (size_t)g * L->rec + L->rec - 2, sizeof(double));
        else norm = dsgd_optimizer_last_grad_norm(s->reps[g].opt);
        dsgd__ckw_f64(w, norm);
    }
    dsgd__ckw_end(w);
    DSGD_FREE(L->gathered);
    L->gathered = NULL;
    return DSGD_OK;
}

/* The record of global replica g in the checked section: its weights. */
static const unsigned char *dsgd__local_record(const dsgd__local *L, uint32_t g, size_t p) {
    return L->records + (size_t)g * (size_t)(1 + L->inner_slots) * p * sizeof(float);
}

static dsgd_result dsgd__local_ck_take(dsgd_strategy *s, const dsgd__ck_file *f, int phase) {
    dsgd__local *L = (dsgd__local *)s->kind_data;
    size_t p = dsgd_model_num_params(s->reps[0].m.model);
    int i, k;
    if (phase == 0) {
        const dsgd__ck_section *sec = dsgd__ck_find(f, "local");
        dsgd__ck_cur c;
        uint32_t world, outer, period, pos, inner, oslots;
        uint64_t warmup, t, np, recs;
        L->sec = sec;
        if (!sec) return DSGD_OK; /* another kind's: the common state everywhere */
        c = dsgd__ck_cursor(sec);
        world = dsgd__ckr_u32(&c);
        outer = dsgd__ckr_u32(&c);
        period = dsgd__ckr_u32(&c);
        warmup = dsgd__ckr_u64(&c);
        t = dsgd__ckr_u64(&c);
        pos = dsgd__ckr_u32(&c);
        inner = dsgd__ckr_u32(&c);
        oslots = dsgd__ckr_u32(&c);
        np = dsgd__ckr_u64(&c);
        recs = (uint64_t)(1 + inner) * np;
        if (c.bad || world == 0 || world > DSGD_MAX_REPLICAS || inner > 2 || oslots > 1 || period == 0 ||
            np != (uint64_t)p || (uint64_t)c.left != (uint64_t)(1 + oslots) * p * sizeof(float) + world * (recs * sizeof(float) + 8))
            return dsgd__ck_bad_section(f, sec, "fields of the wrong size");
        (void)t;
        if (outer != (uint32_t)s->d.local.outer || oslots != (uint32_t)L->outer_slots || inner != (uint32_t)L->inner_slots)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: the checkpoint's local strategy has outer kind %u (%u outer, %u inner "
                                      "optimizer slots); this one %d (%d, %d)",
                                      f->what, f->path, (unsigned)outer, (unsigned)oslots, (unsigned)inner,
                                      (int)s->d.local.outer, L->outer_slots, L->inner_slots);
        L->exact = world == (uint32_t)s->world && period == (uint32_t)s->d.local.period &&
                   warmup == (uint64_t)s->d.local.warmup_steps;
        if (!L->exact && pos != 0)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: saved in the middle of a round (step %u of %u) with %u replicas and "
                                      "warmup %llu; this strategy has %d replicas, period %d and warmup %lld: restore "
                                      "mid-round with the same, or save at a round's boundary",
                                      f->what, f->path, (unsigned)pos, (unsigned)period, (unsigned)world,
                                      (unsigned long long)warmup, s->world, s->d.local.period,
                                      (long long)s->d.local.warmup_steps);
        L->saved_world = world;
        L->start = c.p;
        L->oslot = c.p + p * sizeof(float);
        L->records = c.p + (size_t)(1 + oslots) * p * sizeof(float);
        return DSGD_OK;
    }
    if (phase != 1) return DSGD_OK;
    for (i = 0; i < s->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        const dsgd_backend_i *be = &r->m.be;
        dsgd__local_rep *lr = &L->reps[i];
        dsgd__ck_vars v = dsgd__ck_vars_of(r->m.model, r->opt);
        dsgd_result res;
        if (!L->sec) { /* the restored weights start the round */
            res = be->copy(be->impl, dsgd__ref(lr->start, 0), dsgd_model_params(r->m.model), p);
            for (k = 0; k < L->outer_slots && res == DSGD_OK; ++k)
                res = be->fill(be->impl, dsgd__ref(lr->outer.slot[k], 0), 0.0f, p);
        } else {
            res = dsgd__ck_write_buffer(&v, f->what, dsgd__ref(lr->start, 0), L->start, p);
            for (k = 0; k < L->outer_slots && res == DSGD_OK; ++k)
                res = dsgd__ck_write_buffer(&v, f->what, dsgd__ref(lr->outer.slot[k], 0), L->oslot, p);
            if (L->exact) {
                const unsigned char *rec = dsgd__local_record(L, (uint32_t)r->rank, p);
                uint64_t u = dsgd__ck_get64(dsgd__local_record(L, L->saved_world, p) + (size_t)r->rank * 8);
                double norm;
                memcpy(&norm, &u, 8);
                if (res == DSGD_OK) res = dsgd__ck_write_buffer(&v, f->what, v.params, rec, p);
                for (k = 0; k < L->inner_slots && res == DSGD_OK; ++k)
                    res = dsgd__ck_write_buffer(&v, f->what, dsgd__ref(v.opt->st.slot[k], 0),
                                                rec + (size_t)(1 + k) * p * sizeof(float), p);
                dsgd__optimizer_set_last_grad_norm(r->opt, norm);
            }
        }
        if (res != DSGD_OK)
            return dsgd_ctx_set_error(s->ctx, res, "replica %d: %s", i, dsgd_ctx_last_error(r->m.ctx));
    }
    return DSGD_OK;
}

/* The rounds, defaults applied, in the fingerprint the workers agree on. */
static uint64_t dsgd__local_fingerprint(const dsgd_strategy *s, uint64_t h) {
    DSGD__FP(h, s->d.local.period); DSGD__FP(h, s->d.local.warmup_steps); DSGD__FP(h, s->d.local.outer);
    DSGD__FP(h, s->d.local.outer_lr); DSGD__FP(h, s->d.local.outer_momentum);
    DSGD__FP(h, s->d.local.wire); DSGD__FP(h, s->d.local.agree_in_process);
    return h;
}

static const dsgd__strategy_ops dsgd__local_ops = {
    "local", dsgd__local_check, dsgd__local_setup, dsgd__local_step, dsgd__local_teardown,
    /* .state = */ NULL, /* .multi_worker = */ 1, /* .layout = */ dsgd__local_layout, /* .stop = */ NULL,
    /* .save = */ NULL, /* .restore = */ NULL, /* .caps = */ 0, /* .fingerprint = */ dsgd__local_fingerprint,
};

#endif /* DSGD__PART_STRATEGY_LOCAL_IMPL */
