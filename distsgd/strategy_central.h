/* distsgd/strategy_central.h - central storage: the variables once, on the host; the replicas compute
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   CENTRAL STORAGE (tf.distribute.experimental.CentralStorageStrategy)

     The model's variables and the optimizer's state live once, in a host
     copy that the strategy owns: the flat parameters and gradient on a CPU
     backend of the strategy's context, and an optimizer at work over them
     (no model: nothing is computed there but the update). Each of the N replicas (a thread with
     its own backend: the CPU, or an OpenCL device) computes the gradients of
     its shard of the batch. The gradients are summed into the central copy,
     which is updated once, and then every replica reads the variables. One
     replica's part of a step:

       0 batch      \
       1 gradients   \  as in the synchronous step
       2 agree       /  (strategy_sync.h)
       3 aggregate  /
       4 reduce     the replica's gradient on the host (its buffer's host
                    pointer, mapped, or copied), a barrier; then replica r
                    sums block r (dsgd_block_range) of every replica's
                    gradient, in rank order, into the central gradient; a
                    barrier
       5 update     replica 0 runs the optimizer on the central copy (so
                    clip_norm clips the global norm); a barrier
       6 read       every replica copies the central parameters into its
                    model

     So the replicas stay bitwise identical, and the weights equal the
     mirrored strategy's up to float reassociation: each gradient element is
     summed in rank order here, in the all-reduce algorithm's order there.
     With one replica they are one_device's, bit for bit.

     Differences from mirrored: the gradients always go through the host
     (gradient_path DEVICE is refused, and the resolved path is HOST);
     algorithm and bucket_bytes are unused, since the sum is not an
     all-reduce; the transport carries only the barriers. Each replica still
     has an optimizer, which this kind uses only for the step count and the
     learning rate; its slots (momentum, Adam's moments) stay untouched.
     Distributed variables (dsgd_strategy_create_variable) and the metrics
     behave as under mirrored: per-replica copies, kept in step through the
     transport.

     This part declares nothing public: the kind is chosen with
     DSGD_STRATEGY_CENTRAL_STORAGE.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_CENTRAL_IMPL)
#define DSGD__PART_STRATEGY_CENTRAL_IMPL

/* >>strategy_central -------------------------------------------------------- */

typedef struct dsgd__central {
    dsgd_backend_i be;           /* a CPU backend of the strategy's ctx */
    int have_be;
    dsgd_buffer *pbuf, *gbuf;    /* the central parameters and gradient, p floats each */
    float *params, *grads;       /* their host memory */
    size_t p;
    dsgd__opt_run opt;           /* the only optimizer whose slots move */
    float **src;                 /* [N]: each replica's gradient on the host, during phase 4 */
} dsgd__central;

static dsgd_result dsgd__central_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    if (d->gradient_path == DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: central_storage sums the gradients on the host; "
                                  "gradient_path DEVICE is for mirrored");
    return DSGD_OK;
}

static void dsgd__central_teardown(dsgd_strategy *s) {
    dsgd__central *c = (dsgd__central *)s->kind_data;
    if (!c) return;
    if (c->opt.st.be) dsgd__opt_state_free(&c->opt.st);
    if (c->pbuf) c->be.buffer_destroy(c->be.impl, c->pbuf);
    if (c->gbuf) c->be.buffer_destroy(c->be.impl, c->gbuf);
    if (c->have_be && c->be.destroy) c->be.destroy(c->be.impl);
    DSGD_FREE(c->src);
    DSGD_FREE(c);
    s->kind_data = NULL;
}

/* The central copy on a CPU backend of its own: the parameters, holding
   replica 0's initial weights, the gradient, and the optimizer. */
static dsgd_result dsgd__central_setup(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    dsgd__central *c = (dsgd__central *)dsgd__alloc(s->ctx, sizeof(*c), what);
    dsgd_result res;
    if (!c) return DSGD_ERR_OUT_OF_MEMORY;
    memset(c, 0, sizeof(*c));
    s->kind_data = c;
    c->p = dsgd_model_num_params(s->reps[0].m.model);
    if ((res = dsgd_cpu_backend_create(s->ctx, &c->be)) != DSGD_OK) return res;
    c->have_be = 1;
    if ((res = c->be.buffer_create(c->be.impl, c->p ? c->p : 1, &c->pbuf)) != DSGD_OK ||
        (res = c->be.buffer_create(c->be.impl, c->p ? c->p : 1, &c->gbuf)) != DSGD_OK ||
        (res = dsgd__opt_run_init(&c->opt, s->ctx, &c->be, &s->d.optimizer, c->p, what)) != DSGD_OK)
        return res;
    c->params = c->be.buffer_host_ptr(c->be.impl, c->pbuf);
    c->grads = c->be.buffer_host_ptr(c->be.impl, c->gbuf);
    c->src = (float **)dsgd__alloc(s->ctx, sizeof(float *) * (size_t)s->n, what);
    if (!c->src) return DSGD_ERR_OUT_OF_MEMORY;
    res = dsgd_model_get_params(s->reps[0].m.model, c->params, c->p);
    if (res != DSGD_OK) dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(s->reps[0].m.ctx));
    return res;
}

/* A barrier of every replica (nothing to wait for with one). */
static dsgd_result dsgd__central_barrier(dsgd_replica *r) {
    dsgd_result res;
    if (r->s->n == 1) return DSGD_OK;
    res = dsgd_barrier(r->comm, 0.0);
    if (res != DSGD_OK) r->comm_failed = 1;
    return res;
}

/* Phase 4: once every replica has published its host gradient (barrier),
   replica r writes block r of the central gradient, the rank-order sum of
   that block of every replica's; nobody goes on before every block is
   written (barrier). */
static dsgd_result dsgd__central_reduce(dsgd_replica *r, dsgd__central *c, size_t p) {
    size_t lo = 0, len = 0;
    int k;
    dsgd_result res = dsgd__central_barrier(r);
    if (res != DSGD_OK) return res;
    dsgd_block_range(p, r->s->n, r->rank, &lo, &len);
    if (len > 0) {
        memcpy(c->grads + lo, c->src[0] + lo, len * sizeof(float));
        for (k = 1; k < r->s->n; ++k) dsgd__sum_into(c->grads + lo, c->src[k] + lo, len);
    }
    return dsgd__central_barrier(r);
}

/* Phase 5, on replica 0 (the strategy's thread, which owns the central
   copy's context): one optimizer step of the central copy. */
static dsgd_result dsgd__central_update(dsgd_replica *r, dsgd__central *c) {
    dsgd_result res = dsgd__opt_run_step(&c->opt, r->s->ctx, dsgd__ref(c->pbuf, 0), dsgd__ref(c->gbuf, 0));
    if (res != DSGD_OK) dsgd_ctx_set_error(r->m.ctx, res, "%s", dsgd_ctx_last_error(r->s->ctx));
    return res;
}

/* One replica's part of a central-storage step: the six phases. */
static dsgd_result dsgd__central_step(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_strategy *s = r->s;
    dsgd__central *c = (dsgd__central *)s->kind_data;
    size_t bad = 0, p = dsgd_model_num_params(r->m.model);
    float *host, *mapped = NULL;
    dsgd_batch b;
    dsgd_result res, done;
    r->lr = dsgd_lr_at(&c->opt.st.d.schedule, c->opt.st.d.lr, c->opt.t);
    res = dsgd__step_compute(r, a, &b, &bad);                        /* 0, 1 */
    if (r->comm_failed || (res == DSGD_OK && r->global == 0)) return res;
    res = dsgd__step_agree(r, res, bad, &r->skipped);                /* 2 */
    if (res != DSGD_OK || r->skipped) return res;
    if (!s->all_mean) /* 3 */
        res = dsgd__step_aggregate(r, r->global, (size_t)b.count, 0, dsgd_model_num_params(r->m.model));
    if (res == DSGD_OK && r->m.be.finish) res = r->m.be.finish(r->m.be.impl);
    if (res != DSGD_OK) return res;
    if (!(host = dsgd__grads_on_host(r, p, &mapped, &res))) return res;
    c->src[r->local] = host;
    res = dsgd__central_reduce(r, c, p);                              /* 4 */
    if (res == DSGD_OK && r->local == 0) res = dsgd__central_update(r, c); /* 5 */
    if (res == DSGD_OK) res = dsgd__central_barrier(r);
    done = dsgd__grads_on_host_done(r, p, host, mapped, 0); /* the others have read it */
    if (res == DSGD_OK) res = done;
    if (res == DSGD_OK) res = dsgd_model_set_params(r->m.model, c->params, p); /* 6 */
    if (res == DSGD_OK) dsgd__optimizer_set_steps(r->opt, c->opt.t);
    return res;
}

/* The central copy holds the state a checkpoint saves. */
static dsgd__ck_vars dsgd__central_state(dsgd_strategy *s) {
    dsgd__central *c = (dsgd__central *)s->kind_data;
    dsgd__ck_vars v;
    v.ctx = s->ctx;
    v.be = &c->be;
    v.params = dsgd__ref(c->pbuf, 0);
    v.n = c->p;
    v.opt = &c->opt;
    return v;
}

static const dsgd__strategy_ops dsgd__central_storage_ops = {
    "central_storage", dsgd__central_check, dsgd__central_setup, dsgd__central_step, dsgd__central_teardown,
    /* .state = */ dsgd__central_state, /* .multi_worker = */ 0, /* .layout = */ NULL, /* .stop = */ NULL,
    /* .save = */ NULL, /* .restore = */ NULL, /* .caps = */ 0, /* .fingerprint = */ NULL,
};

#endif /* DSGD__PART_STRATEGY_CENTRAL_IMPL */
