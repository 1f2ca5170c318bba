/* distsgd/comm_hook.h - communication hooks: your own code exchanges a bucket of the gradient
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   COMM HOOKS

     A synchronous strategy (mirrored, multi-worker mirrored) all-reduces
     its replicas' flat gradient in buckets. A comm hook
     (dsgd_strategy_desc.comm_hook) replaces that all-reduce, bucket by
     bucket, with code of its own, as PyTorch DDP's register_comm_hook
     does: to compress what goes over the wire (the built-in compressors
     are compress.h's), to log, or to route some variables elsewhere.

     The contract. reduce(state, &bucket) is called on every replica for
     every bucket of every step, in the same order on all of them, with
     bucket.data holding this replica's slice of its gradient already
     scaled to its variables' aggregation (THE SYNCHRONOUS STEP, phase 3:
     what a SUM over the replicas turns into the aggregate). On return,
     bucket.data must hold the same bits on every replica: the sum over
     the replicas in sync, exactly (a plain all-reduce:
     dsgd_allreduce_at(bucket.comm, bucket.data, bucket.count,
     bucket.first, DSGD_REDUCE_SUM, bucket.algorithm, bucket.timeout_s)
     gives the weights of no hook, bit for bit) or approximately (a
     compressor). The hook may call any collective on bucket.comm; every
     replica must call the same ones.

     Buckets under a hook hold whole variables: the buffer is cut at the
     end of the first variable that reaches desc.bucket_bytes (0: one
     bucket), so a hook sees each variable's gradient, with its name and
     shape, in one piece.

     Which strategies: MIRRORED and MULTI_WORKER_MIRRORED, on the HOST
     gradient path (AUTO resolves to it when a hook is given), with or
     without desc.overlap, over any transport (the simulated cluster
     too). ONE_DEVICE takes a hook too, but nothing is exchanged there, nor
     with one replica in sync: reduce is never called (create, destroy and
     the checkpoint still are). dsgd_strategy_create refuses a hook with
     gradient_path DEVICE (the sum runs on the devices, where no host code
     sees a bucket), CENTRAL_STORAGE and PARAMETER_SERVER
     (DSGD_ERR_INVALID_ARGUMENT), and one whose name is not 1..31 bytes,
     without reduce, or with state_bytes but no save or load; a hook with
     a check member has it called on its user pointer first, and creation
     fails with the check's error and message (a compressor's desc: "ratio
     1.5 is outside (0, 1]"), before any state is made. The
     strategy copies the table (and the name); user and what it points to
     must outlive the strategy. Every worker of a multi-worker strategy
     must pass a hook of the same name (or none): the name is part of the
     description their creation compares.

     Errors. A hook that fails returns the error; it may record a message
     first with dsgd_ctx_set_error(dsgd_comm_ctx(bucket->comm), ...) (the
     collectives it calls record theirs there), else the strategy records
     one naming the hook, the bucket and the step. The step then fails as
     a failed exchange does: the strategy aborts its transport at once,
     so the replicas waiting in a collective return, and has failed
     (dsgd_strategy_failed).

     State. create makes one state per replica (error feedback is a
     replica's own), destroy frees it; both run at dsgd_strategy_create
     and dsgd_strategy_destroy (also of a creation that failed half-way).
     A hook with state (state_bytes non-NULL, and some replica's state
     of a non-zero size) saves it into the strategy's checkpoint as a
     section of its own, "hook" (the hook's name, the replica count, then
     every replica's bytes in global rank order: checkpoints.md), and
     dsgd_strategy_restore loads each replica's own bytes back, so that a
     run resumed from a checkpoint continues as the uninterrupted run
     would (PyTorch's comm hooks keep their state out of the checkpoint).
     A restore refuses, with DSGD_ERR_INVALID_ARGUMENT saying what
     differs, a checkpoint of a hook of another name, one without the
     section when the hook has state, one with the section into a
     strategy without a hook, and one of another replica count when the
     hook has state (a stateless hook restores at any count). A load
     that fails fails the restore with nothing touched (the replicas
     whose load succeeded get their old bytes back through load). Every
     member but name and reduce may be NULL.

     Thread safety: reduce runs on the replica's thread (with
     dsgd_strategy_desc.overlap, on its communication thread), one call at
     a time per replica; different replicas call it at once with their own
     states. create, state_bytes, save, load and destroy run on the
     strategy's thread, between its calls. user is shared by all of them.

   BYTES

     dsgd_comm_stats (collectives.h) counts what a communicator handed to
     its transport, whoever called the collective, so a hook's own
     collectives are counted as they go. A hook that spends time
     compressing adds those seconds (dsgd_comm_stats_add, compress_s; the
     built-in compressors do). bytes_uncompressed counts the payloads as
     fp32, which differs from bytes_sent only for the half wires
     (dsgd_allreduce_wire); for what another compressor saves, compare
     bytes_sent with a run without the hook (a hook may credit
     bytes_uncompressed with its own reference, dsgd_comm_stats_add). A
     strategy's totals are dsgd_strategy_comm_stats's.
*/
#ifndef DSGD__PART_COMM_HOOK_DECL
#define DSGD__PART_COMM_HOOK_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- comm hooks */

/* One bucket of a replica's flat gradient, as a hook receives it. */
typedef struct dsgd_hook_bucket {
    float *data;                       /* (count) the bucket: this replica's
                                          scaled gradient; on return the sum
                                          over the replicas, the same bits on
                                          every replica */
    size_t count;                      /* floats in the bucket */
    size_t first;                      /* data[0]'s offset in the flat gradient */
    int index;                         /* bucket 0..num_buckets-1, from offset 0 */
    int num_buckets;
    const dsgd_variable *const *vars;  /* the variables in the bucket, whole,
                                          in offset order (vars[i]->offset -
                                          first is where each starts in data) */
    int num_vars;
    int64_t step;                      /* optimizer steps applied before this one */
    int replica;                       /* this replica's rank in the group (global) */
    int num_replicas;                  /* the replicas in sync */
    dsgd_comm *comm;                   /* this replica's communicator */
    dsgd_allreduce_algo algorithm;     /* the strategy's desc.algorithm */
    double timeout_s;                  /* the strategy's deadline (0: the comm's) */
} dsgd_hook_bucket;

/* A comm hook: a table of functions and the user pointer they share. */
typedef struct dsgd_comm_hook {
    const char *name;                  /* 1..31 bytes; saved with the state in
                                          the checkpoint's "hook" section,
                                          compared across workers and at a
                                          restore, and named in messages */
    /* Makes replica `replica`'s state (of num_replicas in sync, for a
       gradient of num_params floats) in *state. NULL: the state is NULL. */
    dsgd_result (*create)(void *user, int replica, int num_replicas, size_t num_params, void **state);
    /* Exchanges one bucket (COMM HOOKS above). Required. An error fails the
       step as a failed exchange does (the strategy fails). */
    dsgd_result (*reduce)(void *state, const dsgd_hook_bucket *bucket);
    /* The bytes save writes (the same every call for one state; 0 or NULL:
       nothing is saved; non-NULL needs save and load). */
    size_t (*state_bytes)(void *state);
    /* Writes exactly state_bytes(state) bytes to dst. */
    dsgd_result (*save)(void *state, void *dst, size_t bytes);
    /* Reads what save wrote (bytes as saved); a size it cannot take is
       DSGD_ERR_INVALID_ARGUMENT, and the restore fails. */
    dsgd_result (*load)(void *state, const void *src, size_t bytes);
    void (*destroy)(void *state);
    void *user;
    int owns_momentum; /* 1: the hook applies momentum itself and sends the
                          momentum step (dsgd_compress_hook with momentum
                          correction sets it): the strategy refuses an
                          optimizer other than DSGD_OPT_SGD, which would
                          apply momentum twice. 0: the gradient is sent */
    /* Optional: checks what user points to (the hook's configuration)
       before any create, recording a message that names the field on ctx
       (dsgd_ctx_set_error) when it returns an error; dsgd_strategy_create
       then fails with that error and the message, after the hook's name.
       dsgd_compress_hook sets it to dsgd_compress_check. */
    dsgd_result (*check)(void *user, dsgd_ctx *ctx);
} dsgd_comm_hook;

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_COMM_HOOK_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_COMM_HOOK_IMPL)
#define DSGD__PART_COMM_HOOK_IMPL

/* >>comm_hook --------------------------------------------------------------- */

/* The longest hook name, in bytes (without the NUL). */
#define DSGD__HOOK_NAME_MAX 31

/* The rules of a hook's table (COMM HOOKS above). */
static dsgd_result dsgd__comm_hook_check(dsgd_ctx *ctx, const dsgd_comm_hook *h, const char *what) {
    size_t n = 0;
    while (h->name && n <= DSGD__HOOK_NAME_MAX && h->name[n]) ++n;
    if (!h->name || n == 0 || n > DSGD__HOOK_NAME_MAX)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: comm_hook.name is %s (a name of 1..%d bytes)",
                                  what, !h->name ? "NULL" : n == 0 ? "empty" : "too long", DSGD__HOOK_NAME_MAX);
    if (!h->reduce)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: comm hook '%s' has no reduce (dsgd_comm_hook.reduce is required)", what, h->name);
    if (h->state_bytes && (!h->save || !h->load))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: comm hook '%s' has state_bytes but no %s (a state it saves, it must load)", what,
                                  h->name, h->save ? "load" : "save");
    if (h->check) { /* the hook's own configuration, in its own words (without ctx's label again) */
        char before[256], msg[256];
        const char *m, *label = dsgd_ctx_label(ctx);
        size_t ll = strlen(label);
        dsgd_result r;
        snprintf(before, sizeof(before), "%.255s", dsgd_ctx_last_error(ctx));
        if ((r = h->check(h->user, ctx)) == DSGD_OK) return DSGD_OK;
        m = dsgd_ctx_last_error(ctx);
        if (ll && !strncmp(m, label, ll) && !strncmp(m + ll, ": ", 2)) m += ll + 2;
        snprintf(msg, sizeof(msg), "%.255s", strncmp(dsgd_ctx_last_error(ctx), before, 255) ? m : "");
        return dsgd_ctx_set_error(ctx, r, "%s: comm hook '%s': %s", what, h->name,
                                  msg[0] ? msg : "its check failed without a message");
    }
    return DSGD_OK;
}

/* The buckets of a flat gradient under a hook: whole variables, cut at
   the end of the first variable that reaches bucket_bytes (0: one
   bucket); the last bucket ends at the gradient's end. */
typedef struct dsgd__hook_plan {
    int nb;         /* buckets */
    size_t *lo;     /* nb + 1 bounds: bucket k is the floats [lo[k], lo[k + 1]) */
    int *first;     /* nb + 1: bucket k holds the variables order[first[k] .. first[k + 1]) */
    int *order;     /* the model's variables of one float or more, in offset order */
    int *bucket_of; /* per model variable: its bucket (-1: it has no float) */
} dsgd__hook_plan;

static void dsgd__hook_plan_free(dsgd__hook_plan *pl) {
    DSGD_FREE(pl->lo);
    DSGD_FREE(pl->first);
    DSGD_FREE(pl->order);
    DSGD_FREE(pl->bucket_of);
    memset(pl, 0, sizeof(*pl));
}

/* m's buckets of bucket_bytes into *pl (free with dsgd__hook_plan_free,
   also after a failure). */
static dsgd_result dsgd__hook_plan_make(dsgd_ctx *ctx, dsgd_model *m, size_t bucket_bytes, dsgd__hook_plan *pl) {
    const char *what = "dsgd_strategy_create";
    size_t p = dsgd_model_num_params(m), end = 0;
    int i, used = 0, nv = dsgd_model_num_variables(m);
    memset(pl, 0, sizeof(*pl));
    pl->lo = (size_t *)dsgd__alloc(ctx, sizeof(size_t) * (size_t)(nv + 2), what);
    pl->first = (int *)dsgd__alloc(ctx, sizeof(int) * (size_t)(nv + 2), what);
    pl->order = (int *)dsgd__alloc(ctx, sizeof(int) * (size_t)(nv + 1), what);
    pl->bucket_of = (int *)dsgd__alloc(ctx, sizeof(int) * (size_t)(nv + 1), what);
    if (!pl->lo || !pl->first || !pl->order || !pl->bucket_of) return DSGD_ERR_OUT_OF_MEMORY;
    pl->lo[0] = 0;
    pl->first[0] = 0;
    for (i = 0; i < nv; ++i) {
        const dsgd_variable *v = dsgd_model_variable(m, i);
        pl->bucket_of[i] = -1;
        if (v->count == 0) continue;
        if (v->offset < end || v->offset + v->count > p)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: variable '%s' (floats %zu..%zu) is not after the one before it within "
                                      "the %zu parameters: a comm hook's buckets need variables in offset order",
                                      what, v->name, v->offset, v->offset + v->count, p);
        end = v->offset + v->count;
        pl->order[used++] = i;
        pl->bucket_of[i] = pl->nb;
        if (bucket_bytes && (end - pl->lo[pl->nb]) * sizeof(float) >= bucket_bytes && end < p) {
            pl->lo[++pl->nb] = end;
            pl->first[pl->nb] = used;
        }
    }
    pl->lo[++pl->nb] = p;
    pl->first[pl->nb] = used;
    return DSGD_OK;
}

#endif /* DSGD__PART_COMM_HOOK_IMPL */
