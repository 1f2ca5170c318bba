/* distsgd/optim.h - optimizers, clipping, learning-rate schedules
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/
#ifndef DSGD__PART_OPTIM_DECL
#define DSGD__PART_OPTIM_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- optimizers */

typedef enum dsgd_schedule_kind {
    DSGD_SCHEDULE_CONSTANT = 0, /* lr after warmup */
    DSGD_SCHEDULE_COSINE,       /* cosine from lr to final_lr at total_steps */
    DSGD_SCHEDULE_STEP          /* lr * gamma^floor((t - warmup) / step_size) */
} dsgd_schedule_kind;
#define DSGD_SCHEDULE_COUNT (DSGD_SCHEDULE_STEP + 1)

/* Learning rate at step t (0-based): during the first warmup_steps steps it
   rises linearly from warmup_start_lr to lr (Goyal et al. 2017, gradual
   warmup); then it follows the kind. */
typedef struct dsgd_lr_schedule {
    dsgd_schedule_kind kind;
    int64_t warmup_steps;     /* default 0: no warmup */
    float warmup_start_lr;    /* default 0 */
    int64_t total_steps;      /* COSINE: the step at which final_lr is reached */
    float final_lr;           /* COSINE: default 0 */
    int64_t step_size;        /* STEP: steps between decays (must be > 0) */
    float gamma;              /* STEP: factor per decay (default 0.1) */
} dsgd_lr_schedule;

typedef struct dsgd_optimizer_desc {
    dsgd_optimizer_kind kind; /* default SGD */
    float lr;                 /* peak learning rate; default 0.01 */
    float momentum;           /* MOMENTUM: default 0.9 */
    int nesterov;             /* MOMENTUM */
    float beta1;              /* ADAM(W): default 0.9 */
    float beta2;              /* ADAM(W): default 0.999 */
    float eps;                /* ADAM(W): default 1e-8 */
    float weight_decay;       /* default 0; see dsgd_opt_update */
    float clip_norm;          /* > 0: clip gradients to this global L2 norm */
    dsgd_lr_schedule schedule;
} dsgd_optimizer_desc;

typedef struct dsgd_optimizer dsgd_optimizer;

/* Creates an optimizer for m with desc's zero fields set to their defaults;
   its state (MOMENTUM: one buffer, ADAM and ADAMW: two, SGD: none) lives on
   m's backend, zeroed.
   Errors (recorded on m's ctx): DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing
   recorded; desc or out NULL; an unknown kind; lr <= 0 or not finite;
   negative weight_decay or clip_norm; momentum, beta1 or beta2 outside
   [0, 1); eps <= 0; a bad schedule: unknown kind, negative warmup_steps,
   STEP with step_size <= 0, COSINE with total_steps <= warmup_steps),
   DSGD_ERR_OUT_OF_MEMORY, backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_optimizer_create(dsgd_model *m, const dsgd_optimizer_desc *desc,
                                           dsgd_optimizer **out);
/* Frees the optimizer's state through its model's backend, so destroy it
   before the model; opt NULL: nothing.
   Thread safety: the model's thread. */
DSGD_API void dsgd_optimizer_destroy(dsgd_optimizer *opt);
/* Applies one update from the model's gradient buffer: clipping (if set), then
   the optimizer's rule with the scheduled learning rate; advances the step.
   Without clipping the gradient is not checked for NaN or infinity.
   Errors: DSGD_ERR_INVALID_ARGUMENT (opt NULL, nothing recorded),
   DSGD_ERR_NON_FINITE when clipping is on and the gradient holds NaN or
   infinity (nothing is updated), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_optimizer_step(dsgd_optimizer *opt);
/* dsgd_optimizer_steps: the number of steps applied so far.
   dsgd_optimizer_last_grad_norm: the global L2 norm of the gradient at the
   last step with clipping on (clip_norm > 0), scaled or not; 0 before, or
   without clipping.
   Errors: none (opt NULL: 0). Thread safety: the model's thread (a step
   changes them). */
DSGD_API int64_t dsgd_optimizer_steps(const dsgd_optimizer *opt);
DSGD_API double dsgd_optimizer_last_grad_norm(const dsgd_optimizer *opt);
/* dsgd_optimizer_lr: the learning rate the next step applies (the schedule's
   at dsgd_optimizer_steps; opt NULL: 0).
   dsgd_optimizer_model: the model opt was created for (opt NULL: NULL).
   Errors: none. Thread safety: the model's thread (a step changes the
   first). */
DSGD_API float dsgd_optimizer_lr(const dsgd_optimizer *opt);
DSGD_API dsgd_model *dsgd_optimizer_model(const dsgd_optimizer *opt);
/* The optimizer's state, read-only (what a checkpoint saves besides the
   parameters and dsgd_optimizer_steps): its slots, one float per parameter
   each, in the order of the model's flat parameter buffer.
     SGD       no slot
     MOMENTUM  slot 0 "momentum": the velocity v, v = momentum * v + g
     ADAM(W)   slot 0 "m": the first moment, m = beta1 * m + (1 - beta1) g;
               slot 1 "v": the second moment, v = beta2 * v + (1 - beta2) g^2
               (both without bias correction; g includes weight decay for
               ADAM, not for ADAMW)
   dsgd_optimizer_num_slots: their number (opt NULL: 0).
   dsgd_optimizer_slot_name: slot's name, NULL for a slot that does not
   exist (or opt NULL).
   dsgd_optimizer_read_slot: copies count floats of slot `slot` from
   parameter index `offset` to host memory (waits for queued work).
   Errors: dsgd_optimizer_read_slot: DSGD_ERR_INVALID_ARGUMENT (opt NULL,
   nothing recorded; dst NULL with count > 0; no such slot), DSGD_ERR_SHAPE
   (offset + count beyond the parameter count), backend errors. The others:
   none.
   Thread safety: the model's thread. */
DSGD_API int dsgd_optimizer_num_slots(const dsgd_optimizer *opt);
DSGD_API const char *dsgd_optimizer_slot_name(const dsgd_optimizer *opt, int slot);
DSGD_API dsgd_result dsgd_optimizer_read_slot(dsgd_optimizer *opt, int slot, size_t offset, size_t count,
                                              float *dst);
/* The learning rate the schedule gives at step t (t < 0 counts as 0), peak
   lr `lr`; s NULL: lr. A STEP schedule with step_size <= 0 gives lr.
   Errors: none. Thread safety: any thread. */
DSGD_API float dsgd_lr_at(const dsgd_lr_schedule *s, float lr, int64_t t);
/* The linear scaling rule (Goyal et al. 2017): base_lr * global_batch /
   base_batch; base_batch <= 0: base_lr.
   Errors: none. Thread safety: any thread. */
DSGD_API float dsgd_linear_scaled_lr(float base_lr, int global_batch, int base_batch);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_OPTIM_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_OPTIM_IMPL)
#define DSGD__PART_OPTIM_IMPL

/* >>optimizer -------------------------------------------------------------- */

/* ---- the optimizer's state, without a model */

/* The slot buffers (one float per parameter each) an optimizer kind keeps,
   the one rule for models, parameter servers and summation-only workers:
   MOMENTUM the velocity, ADAM and ADAMW the two moments, SGD none. */
static int dsgd__opt_kind_slots(dsgd_optimizer_kind k) {
    return (k != DSGD_OPT_SGD) + (k == DSGD_OPT_ADAM || k == DSGD_OPT_ADAMW);
}

/* An optimizer's state for n floats on a backend, needing no model: the
   desc (defaults filled) and its slots, zeroed. A model's optimizer holds
   one, and so does central storage's host copy (both with a step count:
   dsgd__opt_run below); so do a parameter server (its shards) and a
   summation-only worker (its copy of each server's shards), whose step
   count stays with the owner (a server's is its version). */
typedef struct dsgd__opt_state {
    dsgd_optimizer_desc d;
    const dsgd_backend_i *be; /* must outlive the state */
    size_t n;
    dsgd_buffer *slot[2];     /* dsgd__opt_kind_slots(d.kind) of them, the others NULL */
    dsgd_ref gate;            /* dsgd_opt_update.gate of its updates (buf NULL: none) */
} dsgd__opt_state;

static void dsgd__opt_state_free(dsgd__opt_state *st) {
    int k;
    for (k = 0; k < 2; ++k)
        if (st->slot[k]) st->be->buffer_destroy(st->be->impl, st->slot[k]);
    st->slot[0] = st->slot[1] = NULL;
}

/* Zeroed slots for n floats on be; *st is left freeable on an error. */
static dsgd_result dsgd__opt_state_init(dsgd__opt_state *st, const dsgd_backend_i *be, const dsgd_optimizer_desc *d,
                                        size_t n) {
    dsgd_result r = DSGD_OK;
    int k;
    memset(st, 0, sizeof(*st));
    st->d = *d;
    st->be = be;
    st->n = n;
    for (k = 0; k < dsgd__opt_kind_slots(d->kind) && r == DSGD_OK; ++k) {
        r = be->buffer_create(be->impl, n, &st->slot[k]);
        if (r == DSGD_OK) r = be->fill(be->impl, dsgd__ref(st->slot[k], 0), 0.0f, n);
    }
    return r;
}

static int dsgd__opt_state_slots(const dsgd__opt_state *st) { return (st->slot[0] != NULL) + (st->slot[1] != NULL); }

/* ---- a model's optimizer */

/* An optimizer at work over n floats of a backend, with no model: its
   state (desc and slots), its step count and the last clipped norm. A
   model's optimizer holds one; central storage's copy of the variables
   another. */
typedef struct dsgd__opt_run {
    dsgd__opt_state st;
    int64_t t;
    double last_norm;
} dsgd__opt_run;

struct dsgd_optimizer {
    dsgd_model *m;
    dsgd__opt_run run; /* on the model's backend, over its parameters */
};

/* The one place optimizer defaults are filled. */
static dsgd_optimizer_desc dsgd__optimizer_defaults(const dsgd_optimizer_desc *in) {
    dsgd_optimizer_desc d = *in;
    if (d.lr == 0.0f) d.lr = 0.01f;
    if (d.momentum == 0.0f && d.kind == DSGD_OPT_MOMENTUM) d.momentum = 0.9f;
    if (d.beta1 == 0.0f) d.beta1 = 0.9f;
    if (d.beta2 == 0.0f) d.beta2 = 0.999f;
    if (d.eps == 0.0f) d.eps = 1e-8f;
    if (d.schedule.gamma == 0.0f) d.schedule.gamma = 0.1f;
    return d;
}

DSGD_API float dsgd_lr_at(const dsgd_lr_schedule *s, float lr, int64_t t) {
    double u, T, gamma;
    if (!s) return lr;
    if (t < 0) t = 0;
    if (t < s->warmup_steps)
        return (float)(s->warmup_start_lr + ((double)lr - s->warmup_start_lr) * (double)t / (double)s->warmup_steps);
    u = (double)(t - DSGD__MAX(s->warmup_steps, 0));
    switch (s->kind) {
    case DSGD_SCHEDULE_COSINE:
        T = (double)(s->total_steps - DSGD__MAX(s->warmup_steps, 0));
        if (T <= 0.0 || u >= T) return s->final_lr;
        return (float)(s->final_lr + ((double)lr - s->final_lr) * 0.5 * (1.0 + cos(3.141592653589793 * u / T)));
    case DSGD_SCHEDULE_STEP:
        if (s->step_size <= 0) return lr;
        gamma = s->gamma == 0.0f ? 0.1 : (double)s->gamma;
        return (float)((double)lr * pow(gamma, floor(u / (double)s->step_size)));
    default:
        return lr;
    }
}

DSGD_API float dsgd_linear_scaled_lr(float base_lr, int global_batch, int base_batch) {
    if (base_batch <= 0) return base_lr;
    return (float)((double)base_lr * global_batch / base_batch);
}

/* Checks a desc whose defaults are filled; records the error under `what`
   (the public function's name). Shared with the parameter servers. */
static dsgd_result dsgd__optimizer_desc_check(dsgd_ctx *ctx, const dsgd_optimizer_desc *d, const char *what) {
    if ((int)d->kind < 0 || (int)d->kind >= (int)DSGD_OPT_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown optimizer kind %d", what, (int)d->kind);
    if (!(d->lr > 0.0f) || !isfinite(d->lr) || !(d->weight_decay >= 0.0f) || !(d->clip_norm >= 0.0f))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: lr %g must be > 0, weight_decay %g and clip_norm %g >= 0", what, (double)d->lr,
                                  (double)d->weight_decay, (double)d->clip_norm);
    if (!(d->momentum >= 0.0f && d->momentum < 1.0f) || !(d->beta1 >= 0.0f && d->beta1 < 1.0f) ||
        !(d->beta2 >= 0.0f && d->beta2 < 1.0f) || !(d->eps > 0.0f))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: momentum %g, beta1 %g, beta2 %g must lie in [0, 1) and eps %g > 0", what,
                                  (double)d->momentum, (double)d->beta1, (double)d->beta2, (double)d->eps);
    if ((int)d->schedule.kind < 0 || (int)d->schedule.kind >= (int)DSGD_SCHEDULE_COUNT || d->schedule.warmup_steps < 0 ||
        (d->schedule.kind == DSGD_SCHEDULE_STEP && d->schedule.step_size <= 0) ||
        (d->schedule.kind == DSGD_SCHEDULE_COSINE && d->schedule.total_steps <= d->schedule.warmup_steps))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: bad schedule (kind %d, warmup_steps %lld, step_size %lld, total_steps %lld)", what,
                                  (int)d->schedule.kind, (long long)d->schedule.warmup_steps,
                                  (long long)d->schedule.step_size, (long long)d->schedule.total_steps);
    return DSGD_OK;
}

/* The scalars of update number t (0-based) under d (defaults filled), the
   gradient scaled by grad_scale: what dsgd_optimizer_step passes to the
   backend, and what a parameter server passes for its version t, so both
   compute the very same bits. */
static dsgd_opt_update dsgd__opt_update_at(const dsgd_optimizer_desc *d, int64_t t, float grad_scale) {
    dsgd_opt_update u;
    memset(&u, 0, sizeof(u));
    u.grad_scale = grad_scale;
    u.kind = d->kind;
    u.lr = dsgd_lr_at(&d->schedule, d->lr, t);
    u.momentum = d->momentum;
    u.nesterov = d->nesterov;
    u.beta1 = d->beta1;
    u.beta2 = d->beta2;
    u.eps = d->eps;
    u.weight_decay = d->weight_decay;
    u.bias_correction1 = (float)(1.0 - pow((double)d->beta1, (double)(t + 1)));
    u.bias_correction2 = (float)(1.0 - pow((double)d->beta2, (double)(t + 1)));
    return u;
}

/* One update of params with grads (scaled by grad_scale) at step t, whose
   learning rate and bias correction it takes. */
static dsgd_result dsgd__opt_state_update(const dsgd__opt_state *st, int64_t t, dsgd_ref params, dsgd_ref grads,
                                          float grad_scale) {
    dsgd_opt_update u = dsgd__opt_update_at(&st->d, t, grad_scale);
    u.gate = st->gate;
    return st->be->optimizer_update(st->be->impl, &u, params, grads, dsgd__ref(st->slot[0], 0),
                                    dsgd__ref(st->slot[1], 0), st->n);
}

/* desc with its defaults, checked (errors recorded on ctx naming what),
   and zeroed slots for n floats on be; *o is left freeable on an error. */
static dsgd_result dsgd__opt_run_init(dsgd__opt_run *o, dsgd_ctx *ctx, const dsgd_backend_i *be,
                                      const dsgd_optimizer_desc *desc, size_t n, const char *what) {
    dsgd_optimizer_desc d = dsgd__optimizer_defaults(desc);
    dsgd_result r;
    memset(o, 0, sizeof(*o));
    if ((r = dsgd__optimizer_desc_check(ctx, &d, what)) != DSGD_OK) return r;
    return dsgd__opt_state_init(&o->st, be, &d, n);
}

/* One step over params with grads (st.n floats each, on st.be):
   clip_by_global_norm when clip_norm > 0 (a NaN or infinity there is
   DSGD_ERR_NON_FINITE, recorded on ctx, and nothing is updated), the
   update at step t, then t + 1. */
static dsgd_result dsgd__opt_run_step(dsgd__opt_run *o, dsgd_ctx *ctx, dsgd_ref params, dsgd_ref grads) {
    const dsgd_backend_i *be = o->st.be;
    float grad_scale = 1.0f;
    dsgd_result r;
    if (o->st.d.clip_norm > 0.0f) {
        /* clip_by_global_norm: g * clip / max(norm, clip) */
        double sumsq = 0.0;
        size_t bad = 0;
        r = be->norm_check(be->impl, grads, o->st.n, &sumsq, &bad);
        if (r != DSGD_OK) return r;
        if (bad)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_NON_FINITE,
                                      "dsgd_optimizer_step: step %lld: %zu gradient values are NaN or infinite; nothing updated",
                                      (long long)o->t, bad);
        o->last_norm = sqrt(sumsq);
        if (o->last_norm > o->st.d.clip_norm) grad_scale = (float)(o->st.d.clip_norm / o->last_norm);
    }
    r = dsgd__opt_state_update(&o->st, o->t, params, grads, grad_scale);
    if (r == DSGD_OK) ++o->t;
    return r;
}

DSGD_API dsgd_result dsgd_optimizer_create(dsgd_model *m, const dsgd_optimizer_desc *desc, dsgd_optimizer **out) {
    dsgd_optimizer *o;
    dsgd_result r;
    const char *what = "dsgd_optimizer_create";
    dsgd_ctx *ctx;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    ctx = dsgd_model_ctx(m);
    if (!desc || !out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: desc or out is NULL", what);
    *out = NULL;
    o = (dsgd_optimizer *)dsgd__alloc(ctx, sizeof(*o), what);
    if (!o) return DSGD_ERR_OUT_OF_MEMORY;
    memset(o, 0, sizeof(*o));
    o->m = m;
    r = dsgd__opt_run_init(&o->run, ctx, dsgd_model_backend(m), desc, dsgd_model_num_params(m), what);
    if (r != DSGD_OK) {
        dsgd_optimizer_destroy(o);
        return r;
    }
    *out = o;
    return DSGD_OK;
}

DSGD_API void dsgd_optimizer_destroy(dsgd_optimizer *o) {
    if (!o) return;
    dsgd__opt_state_free(&o->run.st);
    DSGD_FREE(o);
}

DSGD_API dsgd_result dsgd_optimizer_step(dsgd_optimizer *o) {
    if (!o) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__opt_run_step(&o->run, dsgd_model_ctx(o->m), dsgd_model_params(o->m), dsgd_model_grads(o->m));
}

DSGD_API int64_t dsgd_optimizer_steps(const dsgd_optimizer *o) { return o ? o->run.t : 0; }

/* For a strategy that keeps the step's non-finite verdict on the device
   (strategy.h): a step whose update is made only where gate[0] is 0, and
   the step count taken back once the verdict says it was not made. */
static dsgd_result dsgd__optimizer_step_gated(dsgd_optimizer *o, dsgd_ref gate) {
    dsgd_result r;
    o->run.st.gate = gate;
    r = dsgd_optimizer_step(o);
    o->run.st.gate = dsgd__ref(NULL, 0);
    return r;
}
static void dsgd__optimizer_unstep(dsgd_optimizer *o) { --o->run.t; }
DSGD_API double dsgd_optimizer_last_grad_norm(const dsgd_optimizer *o) { return o ? o->run.last_norm : 0.0; }
DSGD_API float dsgd_optimizer_lr(const dsgd_optimizer *o) {
    return o ? dsgd_lr_at(&o->run.st.d.schedule, o->run.st.d.lr, o->run.t) : 0.0f;
}
DSGD_API dsgd_model *dsgd_optimizer_model(const dsgd_optimizer *o) { return o ? o->m : NULL; }

/* The counters a checkpoint restores, and central storage copies from its
   central optimizer into the replicas' (whose slots it never uses): the
   step count (dsgd_optimizer_steps), and the last clipped norm
   (dsgd_optimizer_last_grad_norm). */
static void dsgd__optimizer_set_steps(dsgd_optimizer *o, int64_t t) { o->run.t = t; }
static void dsgd__optimizer_set_last_grad_norm(dsgd_optimizer *o, double norm) { o->run.last_norm = norm; }

/* The optimizer at work inside o: what a checkpoint reads and writes. */
static dsgd__opt_run *dsgd__optimizer_run(dsgd_optimizer *o) { return &o->run; }

DSGD_API int dsgd_optimizer_num_slots(const dsgd_optimizer *o) { return o ? dsgd__opt_state_slots(&o->run.st) : 0; }

DSGD_API const char *dsgd_optimizer_slot_name(const dsgd_optimizer *o, int slot) {
    if (!o || slot < 0 || slot >= dsgd_optimizer_num_slots(o)) return NULL;
    if (o->run.st.d.kind == DSGD_OPT_MOMENTUM) return "momentum";
    return slot == 0 ? "m" : "v";
}

/* Slot k (0 <= k < dsgd_optimizer_num_slots, in dsgd_optimizer_slot_name's
   order) as a ref at its first float, in the model's backend: what a
   checkpoint reads to save it and writes to restore it. */
static dsgd_ref dsgd__optimizer_slot_ref(const dsgd_optimizer *o, int k) {
    return dsgd__ref(o->run.st.slot[k], 0);
}

DSGD_API dsgd_result dsgd_optimizer_read_slot(dsgd_optimizer *o, int slot, size_t offset, size_t count, float *dst) {
    const char *what = "dsgd_optimizer_read_slot";
    const dsgd_backend_i *be;
    dsgd_ref at;
    dsgd_ctx *ctx;
    size_t n;
    if (!o) return DSGD_ERR_INVALID_ARGUMENT;
    ctx = dsgd_model_ctx(o->m);
    n = dsgd_model_num_params(o->m);
    if (!dst && count > 0) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: dst is NULL", what);
    if (!dsgd_optimizer_slot_name(o, slot))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: slot %d; this optimizer has %d", what, slot,
                                  dsgd_optimizer_num_slots(o));
    if (offset > n || count > n - offset)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SHAPE, "%s: floats %zu..%zu, the model has %zu parameters", what,
                                  offset, offset + count, n);
    if (count == 0) return DSGD_OK;
    be = dsgd_model_backend(o->m);
    at = dsgd__optimizer_slot_ref(o, slot);
    at.off += offset;
    return be->read(be->impl, at, dst, count);
}

#endif /* DSGD__PART_OPTIM_IMPL */
