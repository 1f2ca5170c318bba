/* distsgd/strategy_overlap.h - the synchronous exchange overlapped with backward: gradient-ready buckets
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   OVERLAP

     With dsgd_strategy_desc.overlap set, each replica of a synchronous
     strategy all-reduces its gradient's buckets on a communication thread
     of its own while its backward pass goes on, as PyTorch DDP's Reducer
     and Horovod's tensor fusion do. The buckets are those of the exchange
     without overlap (desc.bucket_bytes, cut from the start of the flat
     gradient; 0: one bucket), and each is all-reduced by the same call
     (dsgd_allreduce_at at the bucket's offset), so the weights are the
     same bits with overlap on and off, and at every bucket size, piece
     size and thread count: an element's reduction order depends on its
     index in the whole gradient, not on its bucket.

     A bucket is ready when every variable it holds is final
     (dsgd_model_variable_ready: the built-in network reports each layer as
     backward goes down, the last layer first). Buckets go to the thread in
     one fixed order, the last first, the same on every replica: bucket k
     goes once it and every bucket after it are ready. Before a bucket
     goes, the replica's own thread counts its non-finite values and scales
     its variables to their aggregation, which the step without overlap
     does for the whole buffer (THE SYNCHRONOUS STEP, phases 1 and 3). When
     backward returns, the variables it never reported are final and the
     buckets left go; the replica waits for its thread, then the replicas
     agree (phase 2) and update (phase 5). Every replica exchanges every
     bucket even when its own backward failed, so that no other waits for
     it; the agreement then stops them all with nothing updated, as clean
     as without overlap. A non-finite gradient makes the exchanged sum
     non-finite; the step is skipped as before (the gradient buffer then
     holds that sum).

     Where: MIRRORED and MULTI_WORKER_MIRRORED with more than one replica
     in sync, on the HOST path, when every replica's gradient buffer has a
     host pointer (the CPU backend). Elsewhere the exchange runs after
     backward, as without overlap (an OpenCL replica maps its gradient,
     which waits for its queued work anyway). dsgd_strategy_create refuses
     it over a transport with a clock of its own other than simnet's
     (TWO LANES, below).

     With a comm hook (dsgd_strategy_desc.comm_hook, comm_hook.h) the
     thread calls the hook's reduce for each bucket instead of the
     all-reduce, and the buckets hold whole variables (a bucket ends with
     the first variable that reaches bucket_bytes); so does the exchange
     without overlap (strategy_sync.h, phase 4). The hook's copy, its
     buckets (computed once, with each bucket's variables) and each
     replica's state are made at creation, before the overlap.

     The step's info says how long the exchange took (exchange_s) and how
     much of that the step waited for after backward (exposed_s); the rest
     was hidden behind backward. The cost: one thread per replica, asleep
     between buckets.

   TWO LANES (over simnet)

     Over the simulated cluster (the endpoints of a dsgd_simnet hub) each
     rank runs two lanes on the virtual clock: a compute lane and a
     communication lane. Backward charges its compute variable by variable
     (dsgd_simnet_desc.backward_s[v]: the compute before the model reports
     variable v final), so with the step's gradient computation starting
     at T0 on the rank's clock and the variables reported in the order
     v_1, v_2, ... (the built-in network: the last layer first, kernel then
     bias), variable v_j is final at
         R(v_j) = T0 + c(v_1) + ... + c(v_j)          (c = backward_s)
     and the compute lane ends at C = T0 + the sum of every c. Bucket k is
     ready at r_k, the latest R of the variables it holds, and goes at
     G_k = max(r_k, G_k+1) (the last bucket first, as above). The
     communication lane runs the buckets' all-reduces one after another:
         S_nb-1 = G_nb-1,   S_k = max(G_k, E_k+1),   E_k = S_k + A_k
     where A_k is bucket k's all-reduce as simnet times it (its messages'
     alpha + bytes * beta on the rank's NIC, as any collective's). Phase 1
     ends at max(C, E_0); the agreement (phase 2) and the update follow.
     The step's info then says exchange_s = the sum of A_k and exposed_s =
     max(0, E_0 - C), virtual seconds: exchange_s - exposed_s was hidden
     behind backward. Without overlap the step charges the same compute in
     one piece after backward (C), then agrees and exchanges: C + agreement
     + the sum of A_k. The model assumes the compute and the communication
     of a rank do not slow each other (separate engines, as a GPU's
     compute and its NIC's DMA), and every variable's report is its only
     compute mark (nothing after the last report is charged).

     How: the rank's clock is its communication lane. The replica's thread
     keeps the compute lane itself (a number it advances by c(v) as
     backward reports v, without entering the hub) and stamps each bucket
     it hands to the communication thread with its ready time; that
     thread advances the rank's clock to the stamp when it is behind
     (dsgd_simnet_advance), then all-reduces the bucket. After backward
     the replica's thread waits for it and advances the clock to C if the
     compute lane ended last. The hub is created with park_between_calls
     (a strategy needs it anyway), so only one of the two threads uses the
     rank at a time and the virtual times, like the bits, do not depend on
     how the OS schedules them. Faults act on the rank's calls, those of
     its communication lane (a KILL or STALL while it waits for a bucket
     hits it there); a trace shows the communication lane (its waits for
     buckets as compute).
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_OVERLAP_IMPL)
#define DSGD__PART_STRATEGY_OVERLAP_IMPL

/* >>strategy_overlap -------------------------------------------------------- */

/* Phase 3 on the floats [lo, hi) of replica r's gradient: each variable's
   slice there, computed for the SUM of the replica's losses, scaled to what
   its aggregation adds up: MEAN 1/global count, SUM 1/local count,
   ONLY_FIRST_REPLICA 1/local count on replica 0 and 0 on the others. */
static dsgd_result dsgd__step_aggregate(dsgd_replica *r, int global, size_t local, size_t lo, size_t hi) {
    const dsgd_backend_i *be = &r->m.be;
    dsgd_ref g = dsgd_model_grads(r->m.model);
    int i, nv = dsgd_model_num_variables(r->m.model);
    dsgd_result res = DSGD_OK;
    for (i = 0; i < nv && res == DSGD_OK; ++i) {
        const dsgd_variable *v = dsgd_model_variable(r->m.model, i);
        size_t a = DSGD__MAX(v->offset, lo), b = DSGD__MIN(v->offset + v->count, hi);
        dsgd_ref slice = dsgd__ref(g.buf, g.off + a);
        float f;
        if (a >= b) continue;
        switch (r->s->param_agg[i]) {
        case DSGD_AGG_SUM: f = local ? 1.0f / (float)local : 0.0f; break;
        case DSGD_AGG_ONLY_FIRST_REPLICA: f = (r->rank == 0 && local) ? 1.0f / (float)local : 0.0f; break;
        default: f = 1.0f / (float)global; break;
        }
        res = f == 0.0f ? be->fill(be->impl, slice, 0.0f, b - a) : be->scale(be->impl, slice, f, b - a);
    }
    return res;
}

/* >>strategy_hook ----------------------------------------------------------- */

struct dsgd__hook {
    dsgd_comm_hook t;             /* desc.comm_hook, copied (t.name is name) */
    char name[DSGD__HOOK_NAME_MAX + 1];
    dsgd__hook_plan plan;         /* the buckets: whole variables */
    int nv;                       /* variables in the plan's order */
    const dsgd_variable **vars;   /* local replica i's model's, at i * nv, in the plan's order */
    void **state;                 /* local replica i's state */
    int created;                  /* the states create made (destroy each) */
};

/* Undoes dsgd__hook_setup (also a partial one): every state destroyed. */
static void dsgd__hook_teardown(dsgd_strategy *s) {
    dsgd__hook *h = s->hook;
    int i;
    if (!h) return;
    for (i = 0; i < h->created; ++i)
        if (h->t.destroy) h->t.destroy(h->state[i]);
    dsgd__hook_plan_free(&h->plan);
    DSGD_FREE(h->vars);
    DSGD_FREE(h->state);
    DSGD_FREE(h);
    s->hook = NULL;
    s->d.comm_hook = NULL;
}

/* desc.comm_hook (checked at creation): its copy, the buckets, each local
   replica's variables in their order and its state (create, replica by
   replica; a failure names the replica). Nothing without a hook. */
static dsgd_result dsgd__hook_setup(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    dsgd__hook *h;
    dsgd_result res;
    int i, j;
    if (!s->d.comm_hook || s->n == 0) return DSGD_OK;
    if (!(h = (dsgd__hook *)dsgd__alloc(s->ctx, sizeof(*h), what))) return DSGD_ERR_OUT_OF_MEMORY;
    memset(h, 0, sizeof(*h));
    s->hook = h;
    h->t = *s->d.comm_hook;
    snprintf(h->name, sizeof(h->name), "%s", h->t.name);
    h->t.name = h->name;
    s->d.comm_hook = &h->t;
    if ((res = dsgd__hook_plan_make(s->ctx, s->reps[0].m.model, s->d.bucket_bytes, &h->plan)) != DSGD_OK) return res;
    h->nv = h->plan.first[h->plan.nb];
    h->vars = (const dsgd_variable **)dsgd__alloc(s->ctx, sizeof(*h->vars) * (size_t)s->n * (size_t)(h->nv ? h->nv : 1), what);
    h->state = (void **)dsgd__alloc(s->ctx, sizeof(void *) * (size_t)s->n, what);
    if (!h->vars || !h->state) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < s->n; ++i) {
        h->state[i] = NULL;
        for (j = 0; j < h->nv; ++j)
            h->vars[(size_t)i * h->nv + j] = dsgd_model_variable(s->reps[i].m.model, h->plan.order[j]);
    }
    for (i = 0; i < s->n && h->t.create; ++i) {
        res = h->t.create(h->t.user, s->reps[i].rank, s->world, dsgd_model_num_params(s->reps[i].m.model),
                          &h->state[i]);
        if (res != DSGD_OK)
            return dsgd_ctx_set_error(s->ctx, res, "%s: comm hook '%s' could not create replica %d's state: %s", what,
                                      h->name, s->reps[i].rank, dsgd_result_string(res));
        h->created = i + 1;
    }
    return DSGD_OK;
}

/* Bucket k of replica r's gradient (host: the whole of it in host memory)
   through the hook: its reduce, on the calling thread (the replica's, or
   its communication thread), with the errors on the communicator's
   context; a failure without a message of its own gets one naming the
   hook, the bucket and the step. */
static dsgd_result dsgd__hook_reduce(dsgd_replica *r, float *host, int k) {
    const dsgd_strategy *s = r->s;
    const dsgd__hook *h = s->hook;
    const dsgd__hook_plan *pl = &h->plan;
    dsgd_ctx *ctx = dsgd_comm_ctx(r->comm);
    dsgd_hook_bucket b;
    dsgd_result res;
    char detail[DSGD__MSG_MAX];
    b.data = host + pl->lo[k];
    b.count = pl->lo[k + 1] - pl->lo[k];
    b.first = pl->lo[k];
    b.index = k;
    b.num_buckets = pl->nb;
    b.vars = h->vars + (size_t)r->local * h->nv + pl->first[k];
    b.num_vars = pl->first[k + 1] - pl->first[k];
    b.step = r->t_step;
    b.replica = r->rank;
    b.num_replicas = s->world;
    b.comm = r->comm;
    b.algorithm = s->d.algorithm;
    b.timeout_s = s->d.timeout_s;
    dsgd_ctx_clear_error(ctx);
    if ((res = h->t.reduce(h->state[r->local], &b)) == DSGD_OK) return DSGD_OK;
    if (dsgd_ctx_last_result(ctx) == DSGD_OK) {
        snprintf(detail, sizeof(detail), "%s", dsgd_result_string(res));
    } else {
        const char *d = dsgd_ctx_last_error(ctx), *label = dsgd_ctx_label(ctx);
        size_t n = strlen(label);
        if (n && !strncmp(d, label, n) && !strncmp(d + n, ": ", 2)) d += n + 2;
        snprintf(detail, sizeof(detail), "%s", d);
    }
    return dsgd_ctx_set_error(ctx, res, "step %lld: comm hook '%s' failed on bucket %d of %d: %s",
                              (long long)r->t_step, h->name, k, pl->nb, detail);
}

/* >>strategy_overlap (the exchange beside backward) ------------------------ */

struct dsgd__overlap {
    dsgd_replica *r;
    dsgd_ctx *ctx;         /* the errors of the thread's collectives */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    float *host;           /* the gradient in host memory */
    size_t p, bucket;      /* floats in the gradient and in a bucket */
    const dsgd__hook_plan *plan; /* a comm hook's buckets (whole variables,
                                    of their own bounds); NULL: `bucket` each */
    int nb;                /* buckets */
    int *need;             /* per bucket: the variables it holds */
    int *left;             /* per bucket: those not final yet (this step) */
    unsigned char *final;  /* per variable: final (this step) */
    int next;              /* the next bucket to go, nb - 1 down to 0; -1: all gone */
    int prep;              /* count and scale a bucket before it goes (not
                              after a failure of this replica's) */
    dsgd_result prep_res;  /* the first failure of that */
    int global;            /* the step's counts, for the aggregation */
    size_t local, bad;     /* bad: non-finite values in the buckets gone */
    /* under mu: buckets given to the thread and all-reduced, its first
       failure this step, seconds it spent in collectives, stop */
    int issued, done, stop;
    dsgd_result res;
    double busy;
    /* Over simnet (TWO LANES above; else hub NULL): the rank; the compute
       lane's clock (the replica's thread); per bucket, that clock when the
       bucket went (written before it is given to the thread) */
    dsgd_simnet *hub;
    int sn_rank;
    double lane;
    double *ready;
};

/* The simnet hub under replica r's endpoint (the one given, also when
   elastic wraps it) and r's rank there; NULL over any other transport.
   The lane clock's two calls: variable v's backward seconds, and a rank's
   advance. Without simnet (DSGD_NO_SIMNET) no endpoint has a hub. */
#ifndef DSGD_NO_SIMNET
static dsgd_simnet *dsgd__replica_simnet(const dsgd_replica *r, int *rank) {
    const dsgd_transport_i *t = r->sub ? &((const dsgd__sub_ep *)r->sub)->base : &r->ep;
    return dsgd__simnet_of(t, rank);
}
static double dsgd__lane_backward_s(dsgd_simnet *hub, int v) { return dsgd__simnet_backward_s(hub, v); }
static dsgd_result dsgd__lane_advance(dsgd_simnet *hub, int rank, double s) { return dsgd_simnet_advance(hub, rank, s); }
#else
static dsgd_simnet *dsgd__replica_simnet(const dsgd_replica *r, int *rank) {
    DSGD__UNUSED(r);
    *rank = 0;
    return NULL;
}
static double dsgd__lane_backward_s(dsgd_simnet *hub, int v) {
    DSGD__UNUSED(hub);
    DSGD__UNUSED(v);
    return 0.0;
}
static dsgd_result dsgd__lane_advance(dsgd_simnet *hub, int rank, double s) {
    DSGD__UNUSED(hub);
    DSGD__UNUSED(rank);
    DSGD__UNUSED(s);
    return DSGD_ERR_UNSUPPORTED;
}
#endif

/* The clock replica r's exchange is timed on (dsgd_step_info): its
   transport's (simnet: the rank's virtual clock), else the real one. */
static double dsgd__replica_now(const dsgd_replica *r) { return r->ep.now ? r->ep.now(r->ep.impl) : dsgd_now(); }
static double dsgd__overlap_now(const dsgd__overlap *ov) { return dsgd__replica_now(ov->r); }

/* Over simnet, the failure of a lane's advance (the rank was killed, the
   hub aborted) on ctx, with the hub's word on it. */
static dsgd_result dsgd__overlap_lane_fail(const dsgd_replica *r, dsgd_ctx *ctx, dsgd_result res, const char *lane) {
    const char *why = r->ep.error_message ? r->ep.error_message(r->ep.impl) : "";
    return dsgd_ctx_set_error(ctx, res, "step %lld: replica %d's %s lane could not advance on the simulated clock: %s",
                              (long long)r->t_step, r->rank, lane, why && *why ? why : dsgd_result_string(res));
}

/* Without overlap, over simnet: the step's backward charged after it, in
   one piece (every variable's desc.backward_s, TWO LANES above); own, the
   backward's result, unless the charge fails first. Nothing elsewhere. */
static dsgd_result dsgd__step_charge_backward(dsgd_replica *r, dsgd_result own) {
    int rank, v, nv = dsgd_model_num_variables(r->m.model);
    dsgd_simnet *hub = dsgd__replica_simnet(r, &rank);
    double t = 0.0;
    dsgd_result res;
    if (!hub) return own;
    for (v = 0; v < nv; ++v) t += dsgd__lane_backward_s(hub, v);
    if (t <= 0.0 || (res = dsgd__lane_advance(hub, rank, t)) == DSGD_OK) return own;
    r->comm_failed = 1;
    return own != DSGD_OK ? own : dsgd__overlap_lane_fail(r, r->m.ctx, res, "compute");
}

/* Bucket k's floats, [*lo, *hi). */
static void dsgd__overlap_range(const dsgd__overlap *ov, int k, size_t *lo, size_t *hi) {
    if (ov->plan) {
        *lo = ov->plan->lo[k];
        *hi = ov->plan->lo[k + 1];
        return;
    }
    *lo = (size_t)k * ov->bucket;
    *hi = DSGD__MIN(*lo + ov->bucket, ov->p);
}

/* The communication thread: all-reduces the buckets given to it (or hands
   them to the comm hook), in the order given; after a failure it only
   counts them done (the transport's state is unknown, and the step
   fails). */
static void *dsgd__overlap_main(void *arg) {
    dsgd__overlap *ov = (dsgd__overlap *)arg;
    const dsgd_strategy *s = ov->r->s;
    pthread_mutex_lock(&ov->mu);
    for (;;) {
        size_t lo, hi;
        int ok, k;
        double t;
        dsgd_result res = DSGD_OK;
        while (!ov->stop && ov->done == ov->issued) pthread_cond_wait(&ov->cv, &ov->mu);
        if (ov->stop) break;
        k = ov->nb - 1 - ov->done;
        dsgd__overlap_range(ov, k, &lo, &hi);
        ok = ov->res == DSGD_OK;
        pthread_mutex_unlock(&ov->mu);
        if (ok && ov->hub) { /* the communication lane waits for the bucket's ready time */
            double wait = ov->ready[k] - dsgd__overlap_now(ov);
            if (wait > 0.0 && (res = dsgd__lane_advance(ov->hub, ov->sn_rank, wait)) != DSGD_OK) {
                dsgd__overlap_lane_fail(ov->r, ov->ctx, res, "communication");
                ok = 0;
            }
        }
        t = dsgd__overlap_now(ov);
        if (ok && ov->plan)
            res = dsgd__hook_reduce(ov->r, ov->host, k);
        else if (ok)
            res = dsgd_allreduce_at(ov->r->comm, ov->host + lo, hi - lo, lo, DSGD_REDUCE_SUM, s->d.algorithm, 0.0);
        t = dsgd__overlap_now(ov) - t;
        pthread_mutex_lock(&ov->mu);
        ov->busy += t;
        if (res != DSGD_OK && ov->res == DSGD_OK) ov->res = res;
        ov->done++;
        pthread_cond_broadcast(&ov->cv);
    }
    pthread_mutex_unlock(&ov->mu);
    return NULL;
}

/* Gives the thread every bucket that may go now (bucket next, once it and
   those after it are ready), each counted and scaled first while prep is
   set. A failure there clears prep and is returned (and kept), but the
   bucket still goes: the other replicas wait for it. */
static dsgd_result dsgd__overlap_issue(dsgd__overlap *ov) {
    dsgd_replica *r = ov->r;
    const dsgd_backend_i *be = &r->m.be;
    dsgd_result res = DSGD_OK;
    while (ov->next >= 0 && ov->left[ov->next] == 0) {
        size_t lo, hi, bad = 0;
        dsgd__overlap_range(ov, ov->next, &lo, &hi);
        if (ov->prep) {
            dsgd_ref g = dsgd_model_grads(r->m.model);
            if (be->finish) res = be->finish(be->impl);
            if (res == DSGD_OK) res = be->norm_check(be->impl, dsgd__ref(g.buf, g.off + lo), hi - lo, NULL, &bad);
            ov->bad += bad;
            if (res == DSGD_OK && !r->s->all_mean) res = dsgd__step_aggregate(r, ov->global, ov->local, lo, hi);
            if (res != DSGD_OK) {
                ov->prep = 0;
                ov->prep_res = res;
            }
        }
        if (ov->hub) ov->ready[ov->next] = ov->lane;
        pthread_mutex_lock(&ov->mu);
        ov->issued++;
        pthread_cond_broadcast(&ov->cv);
        pthread_mutex_unlock(&ov->mu);
        ov->next--;
    }
    return res;
}

/* count[k] += delta for every bucket k that holds some of variable v. */
static void dsgd__overlap_count(const dsgd__overlap *ov, int v, int *count, int delta) {
    const dsgd_variable *var = dsgd_model_variable(ov->r->m.model, v);
    size_t k;
    if (var->count == 0) return;
    if (ov->plan) { /* a hook's bucket holds whole variables */
        count[ov->plan->bucket_of[v]] += delta;
        return;
    }
    for (k = var->offset / ov->bucket; k <= (var->offset + var->count - 1) / ov->bucket; ++k) count[k] += delta;
}

/* Variable v is final: its buckets need it no more. */
static void dsgd__overlap_final(dsgd__overlap *ov, int v) {
    if (ov->final[v]) return;
    ov->final[v] = 1;
    if (ov->hub) ov->lane += dsgd__lane_backward_s(ov->hub, v); /* the compute lane reaches v's report */
    dsgd__overlap_count(ov, v, ov->left, -1);
}

/* The model's listener (dsgd_model_variable_ready). */
static dsgd_result dsgd__overlap_ready(void *user, int variable) {
    dsgd__overlap *ov = (dsgd__overlap *)user;
    dsgd__overlap_final(ov, variable);
    return dsgd__overlap_issue(ov);
}

/* Before replica r's backward: every bucket waits for its variables, and
   the model reports to the overlap. */
static void dsgd__overlap_begin(dsgd_replica *r, int global, size_t local) {
    dsgd__overlap *ov = r->ov;
    int nv = dsgd_model_num_variables(r->m.model);
    memcpy(ov->left, ov->need, sizeof(int) * (size_t)ov->nb);
    memset(ov->final, 0, (size_t)nv);
    ov->next = ov->nb - 1;
    if (ov->hub) ov->lane = dsgd__overlap_now(ov);
    ov->prep = 1;
    ov->prep_res = DSGD_OK;
    ov->global = global;
    ov->local = local;
    ov->bad = 0;
    pthread_mutex_lock(&ov->mu);
    ov->issued = ov->done = 0;
    ov->res = DSGD_OK;
    ov->busy = 0.0;
    pthread_mutex_unlock(&ov->mu);
    dsgd_ctx_clear_error(ov->ctx);
    dsgd__comm_set_ctx(r->comm, ov->ctx);
    dsgd__model_listen(r->m.model, dsgd__overlap_ready, ov);
}

/* After replica r's backward (own: its result): the buckets left go, and
   the replica waits for its thread. *bad: the non-finite values counted.
   Returns own's failure, else the preparation's, else the exchange's (the
   exchange's message copied to the replica's context, comm_failed set). */
static dsgd_result dsgd__overlap_end(dsgd_replica *r, dsgd_result own, size_t *bad) {
    dsgd__overlap *ov = r->ov;
    int v, nv = dsgd_model_num_variables(r->m.model);
    dsgd_result res;
    double t;
    dsgd__model_listen(r->m.model, NULL, NULL);
    if (own != DSGD_OK) ov->prep = 0;
    for (v = 0; v < nv; ++v) dsgd__overlap_final(ov, v);
    dsgd__overlap_issue(ov); /* its failure is in prep_res */
    t = dsgd_now();
    pthread_mutex_lock(&ov->mu);
    while (ov->done < ov->issued) pthread_cond_wait(&ov->cv, &ov->mu);
    res = ov->res;
    r->exchange_s = ov->busy;
    pthread_mutex_unlock(&ov->mu);
    r->exposed_s = dsgd_now() - t;
    dsgd__comm_set_ctx(r->comm, r->m.ctx);
    *bad = ov->bad;
    if (ov->hub) { /* the step goes on when both lanes are done */
        double comm_end = dsgd__overlap_now(ov);
        dsgd_result ar;
        r->exposed_s = DSGD__MAX(0.0, comm_end - ov->lane);
        if (res == DSGD_OK && ov->lane > comm_end &&
            (ar = dsgd__lane_advance(ov->hub, ov->sn_rank, ov->lane - comm_end)) != DSGD_OK) {
            r->comm_failed = 1;
            return own != DSGD_OK ? own : dsgd__overlap_lane_fail(r, r->m.ctx, ar, "compute");
        }
    }
    if (res != DSGD_OK) {
        r->comm_failed = 1;
        if (own == DSGD_OK) return dsgd_ctx_set_error(r->m.ctx, res, "%s", dsgd_ctx_last_error(ov->ctx));
    }
    return own != DSGD_OK ? own : ov->prep_res;
}

/* Stops and frees replica r's overlap (NULL: nothing). */
static void dsgd__overlap_destroy(dsgd_replica *r) {
    dsgd__overlap *ov = r->ov;
    if (!ov) return;
    if (ov->started) {
        pthread_mutex_lock(&ov->mu);
        ov->stop = 1;
        pthread_cond_broadcast(&ov->cv);
        pthread_mutex_unlock(&ov->mu);
        pthread_join(ov->thread, NULL);
        pthread_cond_destroy(&ov->cv);
        pthread_mutex_destroy(&ov->mu);
    }
    dsgd_ctx_destroy(ov->ctx);
    DSGD_FREE(ov->need);
    DSGD_FREE(ov->left);
    DSGD_FREE(ov->final);
    DSGD_FREE(ov->ready);
    DSGD_FREE(ov);
    r->ov = NULL;
}

/* Replica r's overlap: its buckets, what each holds, its context and thread. */
static dsgd_result dsgd__overlap_create(dsgd_strategy *s, dsgd_replica *r, float *host) {
    dsgd_model *m = r->m.model;
    int v, nv = dsgd_model_num_variables(m);
    dsgd_ctx_desc cd;
    dsgd__overlap *ov = (dsgd__overlap *)dsgd__alloc(s->ctx, sizeof(*ov), "dsgd_strategy_create");
    if (!ov) return DSGD_ERR_OUT_OF_MEMORY;
    memset(ov, 0, sizeof(*ov));
    r->ov = ov;
    ov->r = r;
    ov->host = host;
    ov->p = dsgd_model_num_params(m);
    ov->bucket = s->d.bucket_bytes / sizeof(float);
    if (ov->bucket == 0 || ov->bucket > ov->p) ov->bucket = ov->p;
    ov->nb = (int)((ov->p + ov->bucket - 1) / ov->bucket);
    if (s->hook) {
        ov->plan = &s->hook->plan;
        ov->nb = ov->plan->nb;
    }
    ov->need = (int *)dsgd__alloc(s->ctx, sizeof(int) * (size_t)ov->nb, "dsgd_strategy_create");
    ov->left = (int *)dsgd__alloc(s->ctx, sizeof(int) * (size_t)ov->nb, "dsgd_strategy_create");
    ov->final = (unsigned char *)dsgd__alloc(s->ctx, (size_t)nv, "dsgd_strategy_create");
    ov->ready = (double *)dsgd__alloc(s->ctx, sizeof(double) * (size_t)ov->nb, "dsgd_strategy_create");
    if (!ov->need || !ov->left || !ov->final || !ov->ready) return DSGD_ERR_OUT_OF_MEMORY;
    ov->hub = dsgd__replica_simnet(r, &ov->sn_rank);
    memset(ov->need, 0, sizeof(int) * (size_t)ov->nb);
    for (v = 0; v < nv; ++v) dsgd__overlap_count(ov, v, ov->need, 1);
    memset(&cd, 0, sizeof(cd)); /* no label, no logger: a failure is told through the replica's context */
    if (dsgd_ctx_create(&cd, &ov->ctx) != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_strategy_create: no context for the exchange");
    if (pthread_mutex_init(&ov->mu, NULL) != 0) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "dsgd_strategy_create: pthread_mutex_init failed");
    if (pthread_cond_init(&ov->cv, NULL) != 0) {
        pthread_mutex_destroy(&ov->mu);
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "dsgd_strategy_create: pthread_cond_init failed");
    }
    if (pthread_create(&ov->thread, NULL, dsgd__overlap_main, ov) != 0) {
        pthread_cond_destroy(&ov->cv);
        pthread_mutex_destroy(&ov->mu);
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "dsgd_strategy_create: cannot start replica %d's exchange thread",
                                  r->rank);
    }
    ov->started = 1;
    return DSGD_OK;
}

/* The synchronous kinds' setup of desc.overlap: refused over a transport
   with its own clock; otherwise a thread per replica where the exchange
   can run beside backward (OVERLAP above), none elsewhere. */
static dsgd_result dsgd__overlap_setup(dsgd_strategy *s) {
    int i;
    dsgd_result res = DSGD_OK;
    if (!s->d.overlap || s->world < 2 || s->path != DSGD_GRADIENTS_HOST) return DSGD_OK;
    for (i = 0; i < s->n; ++i) {
        int rank;
        if (s->reps[i].ep.now && !dsgd__replica_simnet(&s->reps[i], &rank))
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_UNSUPPORTED,
                                      "dsgd_strategy_create: overlap over transport '%s', which keeps its own clock "
                                      "(only simnet's clock can be run as two lanes, compute and communication)",
                                      s->reps[i].ep.name ? s->reps[i].ep.name : "?");
    }
    for (i = 0; i < s->n; ++i) {
        const dsgd_backend_i *be = &s->reps[i].m.be;
        if (!be->buffer_host_ptr || !be->buffer_host_ptr(be->impl, dsgd_model_grads(s->reps[i].m.model).buf))
            return DSGD_OK; /* the exchange runs after backward */
    }
    for (i = 0; i < s->n && res == DSGD_OK; ++i) {
        dsgd_replica *r = &s->reps[i];
        dsgd_ref g = dsgd_model_grads(r->m.model);
        res = dsgd__overlap_create(s, r, r->m.be.buffer_host_ptr(r->m.be.impl, g.buf) + g.off);
    }
    return res;
}

/* Undoes dsgd__overlap_setup. */
static void dsgd__overlap_teardown(dsgd_strategy *s) {
    int i;
    for (i = 0; s->reps && i < s->n; ++i) dsgd__overlap_destroy(&s->reps[i]);
}

#endif /* DSGD__PART_STRATEGY_OVERLAP_IMPL */
