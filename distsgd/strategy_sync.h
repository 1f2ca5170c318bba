/* distsgd/strategy_sync.h - the synchronous kinds: one_device and mirrored
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   THE SYNCHRONOUS STEP

     A training step is the same for both (one_device is mirrored with one
     replica and nothing to exchange). One replica's part of it, in phases:

       1 gradients  the gradient of the sum of its shard's losses, scaled by
                    1 / global count when every variable is MEAN
       2 agree      one MAX all-reduce of a flag: go, skip (a non-finite
                    gradient somewhere), or stop (some replica failed)
       3 aggregate  unless every variable is MEAN: each variable's slice
                    scaled to what its aggregation adds up
       4 exchange   the SUM all-reduce of the flat gradient buffer, on the host
                    or on the devices (dsgd_gradient_path)
       5 update     the optimizer step, the same on every replica

     With the verdict on the device (THE VERDICT ON THE DEVICE in
     strategy.h), phase 1 writes a flag on the device instead of counting
     on the host, phase 2 agrees on failures only, phase 4 sums the flags
     with the gradients, phase 5 is gated by the sum, and the last step's
     verdict is taken between phases 1 and 2.

     With desc.overlap, phases 3 and 4 run bucket by bucket during phase 1,
     on a communication thread, before phase 2 (OVERLAP in
     strategy_overlap.h); the weights are the same bits.

     The step waits for its slowest replica in its first collective
     (phase 0's count with a dsgd_batch_fn, else phase 2's flag), so that
     is where the others' waits are charged to it (the communicators'
     dsgd_comm_get_waits); dsgd_strategy_wait_report (strategy.h) says,
     over the steps since its last call, which replica made the others
     wait and for what fraction of the step.

     From phase 2 on every replica does the same, so a failure agreed on in
     phase 2 leaves them all as they were (clean); a failure in phases 3-5 is
     not clean: the others may have updated, or wait for this replica in the
     exchange (dsgd__replica_job stops them).

     one_device and mirrored are two tables of operations (dsgd__strategy_ops,
     see strategy.h) sharing this step; mirrored's setup resolves the
     gradient path. This part declares nothing public: the kinds are chosen
     by dsgd_strategy_desc.kind (strategy_kinds.h holds the table of kinds).
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_SYNC_IMPL)
#define DSGD__PART_STRATEGY_SYNC_IMPL

/* >>strategy_sync ----------------------------------------------------------- */

/* The all-reduce of one float of phases 0 and 2, told to elastic's settle
   (strategy.h's dsgd__replica_el_coll). */
static dsgd_result dsgd__step_allreduce(dsgd_replica *r, float *v, dsgd_reduce_op op) {
    dsgd_result cr;
    dsgd__replica_el_coll(r, 1, 1, DSGD_OK);
    cr = dsgd_allreduce(r->comm, v, 1, op, DSGD_ALLREDUCE_AUTO, 0.0);
    dsgd__replica_el_coll(r, 0, 1, cr);
    return cr;
}

/* Phase 0: replica r's batch and the global count (*global). A sliced batch:
   its dsgd_block_range shard, and the caller's count. A dsgd_batch_fn's:
   what fn gives this replica, and the SUM all-reduce of every replica's
   count, to which a replica whose fn failed sends -2^40, so that every
   replica learns before computing anything that one failed (phase 2 names
   it). No sample on any replica (*global 0) ends the step on every replica
   with nothing done: the uneven end of an epoch (Join). */
static dsgd_result dsgd__step_batch(dsgd_replica *r, const dsgd__step_args *a, dsgd_batch *b, int *global) {
    dsgd_result res, cr;
    float total;
    if (!a->fn) {
        dsgd__replica_slice(r, a, b);
        *global = a->count;
        return DSGD_OK;
    }
    res = dsgd__replica_fn_batch(r, a, b);
    total = res == DSGD_OK ? (float)b->count : -1099511627776.0f;
    if (r->s->world > 1 && (cr = dsgd__step_allreduce(r, &total, DSGD_REDUCE_SUM)) != DSGD_OK) {
        r->comm_failed = 1;
        return cr;
    }
    *global = total < 0.0f ? -1 : (int)total;
    return res;
}

/* The gradient of replica r's batch b -> the model's gradient buffer (zero
   for an empty batch). */
static dsgd_result dsgd__step_backward(dsgd_replica *r, const dsgd_batch *b, int global) {
    dsgd_model *m = r->m.model;
    if (b->count > 0) return dsgd_model_gradients(m, b, r->s->all_mean ? 1.0f / (float)global : 1.0f);
    return r->m.be.fill(r->m.be.impl, dsgd_model_grads(m), 0.0f, dsgd_model_num_params(m));
}

/* Phase 1: dsgd__step_backward; *bad counts the gradient's non-finite
   values (or the verdict's flag is written on the device). */
static dsgd_result dsgd__step_gradients(dsgd_replica *r, const dsgd_batch *b, int global, size_t *bad) {
    dsgd_model *m = r->m.model;
    size_t p = dsgd_model_num_params(m);
    dsgd_result res = dsgd__step_backward(r, b, global);
    if (res != DSGD_OK) return res;
    if (r->s->defer) return r->m.be.nonfinite_flag(r->m.be.impl, dsgd_model_grads(m), p, dsgd__ref(r->vflag, 0));
    return r->m.be.norm_check(r->m.be.impl, dsgd_model_grads(m), p, NULL, bad);
}

/* Phases 0 and 1 of both synchronous kinds: the batch, then its gradient
   unless a replica already failed (own result, or the global count says
   another one did). */
static dsgd_result dsgd__step_compute(dsgd_replica *r, const dsgd__step_args *a, dsgd_batch *b, size_t *bad) {
    dsgd_result res = dsgd__step_batch(r, a, b, &r->global);                 /* 0 */
    *bad = 0;
    if (res != DSGD_OK || r->global <= 0) return res;
    if (!r->ov) /* 1 (over simnet its backward_s charged after it) */
        return dsgd__step_charge_backward(r, dsgd__step_gradients(r, b, r->global, bad));
    /* 1, 3 and 4 with OVERLAP: buckets counted, scaled and exchanged as
       backward finishes them; every replica exchanges them all */
    dsgd__overlap_begin(r, r->global, (size_t)b->count);
    return dsgd__overlap_end(r, dsgd__step_backward(r, b, r->global), bad);
}

/* Phase 2: every replica learns one verdict from the MAX of a flag: 0 go,
   1 a non-finite gradient somewhere (*skip under policy SKIP, an error
   under ERROR), 2 + k replica k failed in phase 1 (own: this replica's
   phase 1 result; bad: its non-finite count). */
static dsgd_result dsgd__step_agree(dsgd_replica *r, dsgd_result own, size_t bad, int *skip) {
    dsgd_strategy *s = r->s;
    float flag = own != DSGD_OK ? (float)(2 + r->rank) : (bad ? 1.0f : 0.0f);
    *skip = 0;
    if (s->world > 1) {
        dsgd_result cr = dsgd__step_allreduce(r, &flag, DSGD_REDUCE_MAX);
        if (cr != DSGD_OK) {
            r->comm_failed = 1;
            return cr;
        }
    }
    if (flag >= 2.0f) {
        r->clean_fail = 1;
        r->stop_by = (int)flag - 2;
        if (own != DSGD_OK) return own;
        r->own_error = 0;
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_ABORTED, "step %lld abandoned: replica %d failed",
                                  (long long)dsgd_optimizer_steps(r->opt), (int)flag - 2);
    }
    if (flag == 1.0f) {
        if (s->d.nonfinite == DSGD_NONFINITE_ERROR) {
            r->clean_fail = 1;
            r->own_error = bad != 0;
            return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_NON_FINITE,
                                      "step %lld: non-finite gradient (%zu NaN/Inf values on this replica); "
                                      "every replica stops", (long long)dsgd_optimizer_steps(r->opt), bad);
        }
        *skip = 1;
    }
    return DSGD_OK;
}

/* Replica r's queue is done up to here for the others: its mark in
   marks[slot] (the one it held there before released: every replica has
   waited on it by now), or, without marks, finished. */
static dsgd_result dsgd__step_device_done(dsgd_replica *r, void **slot) {
    const dsgd_backend_i *be = &r->m.be;
    if (!r->s->marks) return be->finish ? be->finish(be->impl) : DSGD_OK;
    if (*slot) be->release_mark(be->impl, *slot);
    *slot = NULL;
    return be->mark(be->impl, slot);
}

/* After a barrier: replica r's later work waits for every replica's marks
   (nothing to do without marks: each finished its queue). */
static dsgd_result dsgd__step_device_after(dsgd_replica *r, void *const *marks) {
    const dsgd_backend_i *be = &r->m.be;
    return r->s->marks ? be->wait_marks(be->impl, marks, r->s->n) : DSGD_OK;
}

/* Phase 4, DEVICE path: every replica's gradients are complete (marks or
   finish, then a barrier), replica r sums its block of all of them on its
   device, and nobody reads a gradient before every block is written (the
   same again). With marks the host never waits for a device here. */
static dsgd_result dsgd__step_exchange_device(dsgd_replica *r, size_t p) {
    const dsgd_backend_i *be = &r->m.be;
    dsgd_strategy *s = r->s;
    void **ready = s->marks, **summed = s->marks ? s->marks + s->n : NULL;
    size_t lo = 0, len = 0;
    dsgd_result res = dsgd__step_device_done(r, ready ? &ready[r->rank] : NULL);
    if (res != DSGD_OK) return res;
    if ((res = dsgd_barrier(r->comm, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if ((res = dsgd__step_device_after(r, ready)) != DSGD_OK) return res;
    dsgd_block_range(p, s->n, r->rank, &lo, &len);
    if (len > 0) res = be->sum_across(be->impl, s->grad_refs, s->n, lo, lo + len);
    if (res == DSGD_OK && s->flag_refs && r->local == 0) /* the verdict: every replica's flag */
        res = be->sum_across(be->impl, s->flag_refs, s->n, 0, 1);
    if (res == DSGD_OK) res = dsgd__step_device_done(r, summed ? &summed[r->rank] : NULL);
    if (res != DSGD_OK) return res;
    if ((res = dsgd_barrier(r->comm, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    return dsgd__step_device_after(r, summed);
}

/* The replica's p gradients in host memory, for phase 4: the buffer's own
   host pointer when the backend exposes it, else mapped (*mapped set),
   else read into the replica's staging buffer. NULL on failure (recorded). */
static float *dsgd__grads_on_host(dsgd_replica *r, size_t p, float **mapped, dsgd_result *res) {
    const dsgd_backend_i *be = &r->m.be;
    dsgd_ref g = dsgd_model_grads(r->m.model);
    float *host = be->buffer_host_ptr ? be->buffer_host_ptr(be->impl, g.buf) : NULL;
    *mapped = NULL;
    *res = DSGD_OK;
    if (host) { /* map and read wait for queued work themselves */
        if (be->finish && (*res = be->finish(be->impl)) != DSGD_OK) return NULL;
        return host + g.off;
    }
    if (be->map && be->unmap) {
        if ((*res = be->map(be->impl, g, p, mapped)) != DSGD_OK) return NULL;
        return *mapped;
    }
    if (!(host = dsgd__replica_stage(r, p))) {
        *res = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    if ((*res = be->read(be->impl, g, host, p)) != DSGD_OK) return NULL;
    return host;
}

/* Gives back what dsgd__grads_on_host lent: unmaps (the device sees the
   host's writes), or writes the staging copy back when write_back is set. */
static dsgd_result dsgd__grads_on_host_done(dsgd_replica *r, size_t p, float *host, float *mapped, int write_back) {
    const dsgd_backend_i *be = &r->m.be;
    if (mapped) return be->unmap(be->impl, dsgd_model_grads(r->m.model), mapped);
    if (write_back && host == r->stage) return be->write(be->impl, dsgd_model_grads(r->m.model), host, p);
    return DSGD_OK;
}

/* Phase 4: all-reduces (SUM) the flat gradient buffer: on the devices
   (DEVICE path), or on the host in place when the backend exposes host
   memory or maps it, through a staging copy otherwise, in buckets of
   desc.bucket_bytes (with a comm hook: its buckets of whole variables,
   each through the hook). */
static dsgd_result dsgd__step_exchange(dsgd_replica *r) {
    dsgd_strategy *s = r->s;
    size_t p = dsgd_model_num_params(r->m.model), o, bucket;
    float *host, *mapped;
    dsgd_result res = DSGD_OK, done;
    double t = dsgd__replica_now(r); /* simnet: virtual seconds */
    if (s->path == DSGD_GRADIENTS_DEVICE) {
        res = dsgd__step_exchange_device(r, p);
        r->exchange_s = r->exposed_s = dsgd__replica_now(r) - t;
        return res;
    }
    if (!(host = dsgd__grads_on_host(r, p, &mapped, &res))) return res;
    bucket = s->d.bucket_bytes / sizeof(float);
    if (bucket == 0 || bucket > p) bucket = p;
    if (s->hook) { /* the comm hook's buckets: whole variables */
        int k;
        for (k = 0; k < s->hook->plan.nb && res == DSGD_OK; ++k) res = dsgd__hook_reduce(r, host, k);
    } else {
        for (o = 0; o < p && res == DSGD_OK; o += bucket)
            res = dsgd_allreduce_at(r->comm, host + o, DSGD__MIN(bucket, p - o), o, DSGD_REDUCE_SUM, s->d.algorithm,
                                    0.0);
    }
    r->exchange_s = r->exposed_s = dsgd__replica_now(r) - t;
    if (res != DSGD_OK) r->comm_failed = 1;
    done = dsgd__grads_on_host_done(r, p, host, mapped, res == DSGD_OK);
    return res == DSGD_OK ? done : res;
}

/* The learning rate and step count this step's update will use (info). */
static void dsgd__step_note(dsgd_replica *r) {
    r->lr = dsgd_optimizer_lr(r->opt);
    r->t_step = dsgd_optimizer_steps(r->opt);
}

/* One replica's part of a synchronous training step: the five phases. */
static dsgd_result dsgd__sync_step(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_strategy *s = r->s;
    dsgd_batch b;
    size_t bad = 0;
    dsgd_result res, vr;
    dsgd__step_note(r);
    r->skipped = 0;
    r->exchange_s = r->exposed_s = 0.0;
    res = dsgd__step_compute(r, a, &b, &bad);           /* 0, 1 (3, 4 with overlap) */
    if (r->comm_failed || (res == DSGD_OK && r->global == 0)) return res;
    if (s->defer) { /* the last step's verdict, in by now on a GPU */
        if ((vr = dsgd__replica_settle(r, NULL, "at the next step")) != DSGD_OK) return res != DSGD_OK ? res : vr;
        dsgd__step_note(r); /* its count taken back if it was skipped */
    }
    res = dsgd__step_agree(r, res, bad, &r->skipped);   /* 2 */
    if (res != DSGD_OK || r->skipped) return res;
    if (!r->ov && !s->all_mean) /* 3 */
        res = dsgd__step_aggregate(r, r->global, (size_t)b.count, 0, dsgd_model_num_params(r->m.model));
    if (!r->ov && res == DSGD_OK && s->world > 1) res = dsgd__step_exchange(r); /* 4 */
    if (res != DSGD_OK) return res;
    if (!s->defer) return dsgd_optimizer_step(r->opt);            /* 5 */
    /* 5, gated by the verdict on the device; read back without waiting */
    if ((res = dsgd__optimizer_step_gated(r->opt, dsgd__ref(r->vflag, 0))) != DSGD_OK) return res;
    res = r->m.be.read_marked(r->m.be.impl, dsgd__ref(r->vflag, 0), &r->vhost, 1, &r->vmark);
    if (res == DSGD_OK && a->verdict) res = dsgd__replica_settle(r, &r->skipped, "at the end of its step");
    return res;
}

static dsgd_result dsgd__one_device_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    if (d->num_replicas > 1)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: one_device takes 1 replica, not %d", d->num_replicas);
    return DSGD_OK;
}

/* The device a replica's backend computes on, for messages. */
static const char *dsgd__replica_device(const dsgd_strategy *s, int i) {
    const dsgd_backend_i *be = &s->reps[i].m.be;
    const char *name = be->device_name ? be->device_name(be->impl) : NULL;
    return name ? name : be->name ? be->name : "a backend";
}

/* THE VERDICT ON THE DEVICE, where every replica's backend can keep it
   there (nonfinite_flag, read_marked, wait_mark, release_mark), all of them
   in this process, and one replica or the DEVICE path with marks, and no
   clipping (its norm is the host's): each replica gets a one-float flag. */
static dsgd_result dsgd__sync_defer_setup(dsgd_strategy *s) {
    int i, ok = s->n >= 1 && s->world == s->n && (s->n == 1 || s->marks) && s->d.optimizer.clip_norm <= 0.0f;
    dsgd_result res;
    for (i = 0; i < s->n && ok; ++i) {
        const dsgd_backend_i *be = &s->reps[i].m.be;
        ok = be->nonfinite_flag && be->read_marked && be->wait_mark && be->release_mark;
    }
    if (!ok) return DSGD_OK;
    for (i = 0; i < s->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        if ((res = r->m.be.buffer_create(r->m.be.impl, 1, &r->vflag)) != DSGD_OK) return res;
    }
    if (s->n > 1) {
        s->flag_refs = (dsgd_ref *)dsgd__alloc(s->ctx, sizeof(dsgd_ref) * (size_t)s->n, "dsgd_strategy_create");
        if (!s->flag_refs) return DSGD_ERR_OUT_OF_MEMORY;
        for (i = 0; i < s->n; ++i) s->flag_refs[i] = dsgd__ref(s->reps[i].vflag, 0);
    }
    s->defer = 1;
    return DSGD_OK;
}

/* Undoes dsgd__sync_defer_setup (a verdict still pending is dropped). */
static void dsgd__sync_defer_teardown(dsgd_strategy *s) {
    int i;
    for (i = 0; s->reps && i < s->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        if (r->vmark) r->m.be.release_mark(r->m.be.impl, r->vmark);
        if (r->vflag) r->m.be.buffer_destroy(r->m.be.impl, r->vflag);
        r->vmark = NULL;
        r->vflag = NULL;
    }
    DSGD_FREE(s->flag_refs);
    s->flag_refs = NULL;
    s->defer = 0;
}

/* Mirrored's setup resolves desc.gradient_path: DEVICE needs every
   replica's backend to have sum_across and to reach every other replica's
   buffers (OpenCL: one context, one device); AUTO also wants some
   replica's buffers outside host-shared memory. One replica has nothing to
   exchange: HOST. */
static dsgd_result dsgd__mirrored_path(dsgd_strategy *s) {
    int i, j, ok = 1;
    const char *why = "";
    char what[DSGD__MSG_MAX];
    s->path = DSGD_GRADIENTS_HOST;
    if (s->n == 1) return DSGD_OK;
    for (i = 0; i < s->n && ok; ++i) {
        const dsgd_backend_i *bi = &s->reps[i].m.be;
        if (!bi->sum_across || !bi->can_access) {
            ok = 0;
            why = "a replica's backend has no device-side reduction (sum_across)";
        }
        for (j = 0; j < s->n && ok; ++j) {
            if (!bi->can_access(bi->impl, &s->reps[j].m.be)) {
                ok = 0;
                snprintf(what, sizeof(what),
                         "replica %d computes on %s and replica %d on %s, and the first cannot write the "
                         "second's buffers (the device path needs one device: one OpenCL context and device)",
                         i, dsgd__replica_device(s, i), j, dsgd__replica_device(s, j));
                why = what;
            }
        }
    }
    if (!ok && s->d.gradient_path == DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: gradient_path DEVICE, but %s", why);
    if (ok && s->d.gradient_path == DSGD_GRADIENTS_AUTO && s->d.comm_hook) ok = 0; /* a hook sees host buckets */
    if (ok && s->d.gradient_path == DSGD_GRADIENTS_AUTO) {
        int shared = 1;
        for (i = 0; i < s->n; ++i)
            shared &= s->reps[i].m.be.host_shared && s->reps[i].m.be.host_shared(s->reps[i].m.be.impl);
        ok = !shared;
    }
    if (!ok || s->d.gradient_path == DSGD_GRADIENTS_HOST) return DSGD_OK;
    s->grad_refs = (dsgd_ref *)dsgd__alloc(s->ctx, sizeof(dsgd_ref) * (size_t)s->n, "dsgd_strategy_create");
    if (!s->grad_refs) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < s->n; ++i) s->grad_refs[i] = dsgd_model_grads(s->reps[i].m.model);
    s->path = DSGD_GRADIENTS_DEVICE;
    for (i = 0, ok = 1; i < s->n; ++i) {
        const dsgd_backend_i *bi = &s->reps[i].m.be;
        ok &= bi->mark && bi->wait_marks && bi->release_mark;
    }
    if (!ok) return DSGD_OK; /* each replica finishes its queue instead */
    s->marks = (void **)dsgd__alloc(s->ctx, sizeof(void *) * 2 * (size_t)s->n, "dsgd_strategy_create");
    if (!s->marks) return DSGD_ERR_OUT_OF_MEMORY;
    memset(s->marks, 0, sizeof(void *) * 2 * (size_t)s->n);
    return DSGD_OK;
}

static dsgd_result dsgd__mirrored_setup(dsgd_strategy *s) {
    dsgd_result res = dsgd__mirrored_path(s);
    if (res == DSGD_OK) res = dsgd__sync_defer_setup(s);
    if (res == DSGD_OK) res = dsgd__hook_setup(s);
    return res != DSGD_OK ? res : dsgd__overlap_setup(s);
}

/* The marks still held (after the backends' queues are done with them). */
static void dsgd__mirrored_teardown(dsgd_strategy *s) {
    int i;
    dsgd__overlap_teardown(s);
    dsgd__hook_teardown(s);
    dsgd__sync_defer_teardown(s);
    for (i = 0; s->marks && i < 2 * s->n; ++i) {
        const dsgd_backend_i *be = &s->reps[i % s->n].m.be;
        if (s->marks[i]) be->release_mark(be->impl, s->marks[i]);
    }
    DSGD_FREE(s->marks);
    s->marks = NULL;
    DSGD_FREE(s->grad_refs);
    s->grad_refs = NULL;
}

/* Across workers the gradients take the HOST path (DEVICE sums buffers of
   one process's devices). */
static dsgd_result dsgd__multi_worker_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    if (d->gradient_path == DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: multi_worker_mirrored sums gradients on the HOST path "
                                  "(gradient_path DEVICE reaches one process's devices only)");
    return DSGD_OK;
}

/* one_device: the verdict on the device, and a comm hook's state (its
   reduce is never called: nothing is exchanged). */
static dsgd_result dsgd__one_device_setup(dsgd_strategy *s) {
    dsgd_result res = dsgd__sync_defer_setup(s);
    return res != DSGD_OK ? res : dsgd__hook_setup(s);
}
static void dsgd__one_device_teardown(dsgd_strategy *s) {
    dsgd__hook_teardown(s);
    dsgd__sync_defer_teardown(s);
}

/* multi_worker_mirrored: a comm hook's state and buckets, then the overlap. */
static dsgd_result dsgd__multi_worker_setup(dsgd_strategy *s) {
    dsgd_result res = dsgd__hook_setup(s);
    return res != DSGD_OK ? res : dsgd__overlap_setup(s);
}
static void dsgd__multi_worker_teardown(dsgd_strategy *s) {
    dsgd__overlap_teardown(s);
    dsgd__hook_teardown(s);
}

static const dsgd__strategy_ops dsgd__one_device_ops = {
    "one_device", dsgd__one_device_check, dsgd__one_device_setup, dsgd__sync_step, dsgd__one_device_teardown,
    /* .state = */ NULL, /* .multi_worker = */ 0, /* .layout = */ NULL, /* .stop = */ NULL, /* .save = */ NULL,
    /* .restore = */ NULL, /* .caps = */ DSGD__KIND_HOOKS, /* .fingerprint = */ NULL,
};
static const dsgd__strategy_ops dsgd__mirrored_ops = {
    "mirrored", NULL, dsgd__mirrored_setup, dsgd__sync_step, dsgd__mirrored_teardown,
    /* .state = */ NULL, /* .multi_worker = */ 0, /* .layout = */ NULL, /* .stop = */ NULL, /* .save = */ NULL,
    /* .restore = */ NULL, /* .caps = */ DSGD__KIND_HOOKS | DSGD__KIND_ELASTIC | DSGD__KIND_GROW,
    /* .fingerprint = */ NULL,
};
static const dsgd__strategy_ops dsgd__multi_worker_ops = {
    "multi_worker_mirrored", dsgd__multi_worker_check, dsgd__multi_worker_setup, dsgd__sync_step,
    dsgd__multi_worker_teardown,
    /* .state = */ NULL, /* .multi_worker = */ 1, /* .layout = */ NULL, /* .stop = */ NULL, /* .save = */ NULL,
    /* .restore = */ NULL, /* .caps = */ DSGD__KIND_HOOKS | DSGD__KIND_ELASTIC | DSGD__KIND_REGROUP,
    /* .fingerprint = */ NULL,
};

#endif /* DSGD__PART_STRATEGY_SYNC_IMPL */
