/* distsgd/strategy_checkpoint.h - a strategy's checkpoint: its replicas' state, variables and metrics
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A STRATEGY'S CHECKPOINT

     dsgd_strategy_save writes, in the format of checkpoint.h: the model's
     layout, the parameters and the optimizer's state (the one copy every
     replica holds, or central storage's), every replica's metrics
     accumulators, the distributed variables with every replica's copy, the
     kind and replica count, a comm hook's state (every replica's, section
     "hook": COMM HOOKS in comm_hook.h), and the caller's extra (sampler,
     user bytes).
     dsgd_strategy_restore puts them into a strategy created with the same
     model and optimizer description (and the same variables, created
     before the restore); the kind and the replica count may differ, except
     into a parameter-server strategy, which also restores each of its
     ranks' files and so needs a checkpoint of the same servers, workers
     and policy (A CHECKPOINT in strategy_ps.h), and but with a comm hook
     that keeps state, whose state restores at the same replica count
     only (each replica loads its own bytes).

     A kind may add sections of its own (LOCAL: "local", every replica's
     state, which differs mid-round; see its part), which its restore
     checks with the rest before anything is written.

     At the same replica count the restore is exact: training on gives the
     bits of a run never interrupted. At another count (4 -> 2, say) the
     parameters and the optimizer's state are still exact (every replica
     holds the same), and with the same global batch and a restored
     sampler each epoch still sees every sample once: the sampler is
     global, and the strategy cuts each global batch among its replicas.
     Only the order of the float sums changes (a gradient summed over 2
     replicas, not 4). The per-replica parts are then combined as a
     cross-replica read and written back as a cross-replica assignment:
     ON_WRITE variables take the saved value; ON_READ SUM variables the
     sum of the saved copies divided among the new replicas, MEAN ones the
     mean; the metrics accumulators are summed into replica 0's. So a read
     or dsgd_strategy_take_metrics after the restore gives what it would
     have before (up to float rounding).

   ACROSS WORKERS (MULTI_WORKER_MIRRORED)

     Save and restore are collectives: every worker calls them, with the
     same path. The replica count above is then the group's (W, every
     worker's replicas), and replica r is global rank r. Save all-gathers
     every replica's metrics, variable copies and comm hook state (its
     bytes two a float, exact, after an all-gather of their sizes); the
     chief (the worker
     holding rank 0) writes the one file, which is the file a one-process
     strategy of W replicas would write; every worker returns the chief's
     result. Restore reads the file on every worker (so every worker must
     reach it: one machine, or a shared file system), and writes nothing
     until every worker's checks have passed; a worker whose checks fail
     keeps its own error, and the others return the same code naming the
     first rank that failed. A checkpoint moves freely between one process
     and several: 2 workers x 2 replicas restore exactly what 1 x 4 saved,
     and the reverse. A worker whose strategy has already failed returns
     DSGD_ERR_STATE at once; the others then time out in the collective.
*/
#ifndef DSGD__PART_STRATEGY_CHECKPOINT_DECL
#define DSGD__PART_STRATEGY_CHECKPOINT_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* Saves the strategy's state and extra (may be NULL) to path, atomically
   (see CHECKPOINTS in checkpoint.h and above).
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; path NULL or empty; user_bytes > 0 with user
   NULL; a sampler not initialised), DSGD_ERR_STATE (the strategy has
   failed: its replicas may differ), DSGD_ERR_IO, DSGD_ERR_OUT_OF_MEMORY, a
   replica's backend error, a comm hook's save error (naming the hook and
   the replica); across workers also a collective's error
   (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED, ...), and another worker's error,
   named. path is then unchanged. DSGD_STRATEGY_PARAMETER_SERVER also
   writes each rank's file beside path (A CHECKPOINT in strategy_ps.h).
   Across workers every worker calls it (see above).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_save(dsgd_strategy *s, const char *path, const dsgd_checkpoint_extra *extra);
/* Restores what dsgd_strategy_save wrote (or dsgd_model_save: a model's
   checkpoint has no variables, so the strategy must have none of its own
   beyond the metrics) into s and extra.
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (as
   save), DSGD_ERR_STATE (the strategy has failed), DSGD_ERR_IO,
   DSGD_ERR_FORMAT (a damaged file), DSGD_ERR_SHAPE (another model,
   optimizer kind, sampler, user size, or a distributed variable missing
   on either side or of another count, synchronization or aggregation:
   the message names it), DSGD_ERR_INVALID_ARGUMENT for a comm hook that
   does not match (another name; no "hook" section for a hook with
   state; a section for a strategy without a hook; another replica count
   for a hook with state) or whose load fails; across workers also a
   collective's error and another worker's error, named; after any of
   these nothing was touched.
   DSGD_STRATEGY_PARAMETER_SERVER also restores each rank's file (another
   kind's checkpoint has none: DSGD_ERR_IO names the missing file). A
   replica's backend failing while the checked state is written leaves
   the replicas different: the strategy has then failed.
   Across workers every worker calls it (see above).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_restore(dsgd_strategy *s, const char *path, const dsgd_checkpoint_extra *extra);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_STRATEGY_CHECKPOINT_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_CHECKPOINT_IMPL)
#define DSGD__PART_STRATEGY_CHECKPOINT_IMPL

/* >>strategy_checkpoint ----------------------------------------------------- */

/* A strategy that can save and restore: usable, or a kind keeping its
   own state in a process that holds no replica. */
static dsgd_result dsgd__strategy_ck_usable(dsgd_strategy *s, const char *what) {
    if (s->n == 0 && s->ops->save && s->ops->restore && !s->failed) return DSGD_OK;
    return dsgd__strategy_usable(s, what);
}

/* The variables and optimizer holding the one copy of the state: the
   kind's own (central storage's host copy), or replica 0's. */
static dsgd__ck_vars dsgd__strategy_state(dsgd_strategy *s) {
    return s->ops->state ? s->ops->state(s) : dsgd__ck_vars_of(s->reps[0].m.model, s->reps[0].opt);
}

/* The model's layout and the state (v) into w. */
static void dsgd__ck_put_state(dsgd__ck_writer *w, dsgd_strategy *s, const dsgd__ck_vars *v) {
    dsgd__ck_put_model(w, s->reps[0].m.model);
    dsgd__ck_put_params(w, v);
    dsgd__ck_put_optimizer(w, v);
}

/* Every replica's model, for the metrics records (n pointers). */
static dsgd_model **dsgd__strategy_models(dsgd_strategy *s, const char *what) {
    dsgd_model **m = (dsgd_model **)dsgd__alloc(s->ctx, sizeof(dsgd_model *) * (size_t)s->n, what);
    int r;
    if (m)
        for (r = 0; r < s->n; ++r) m[r] = s->reps[r].m.model;
    return m;
}

/* "strategy": kind and replica count; "variables": name, count,
   synchronization, aggregation, trainable, copies, then the copies. With
   gathered NULL the copies are the strategy's own (world == n); else
   gathered holds world records of rec floats, a replica's metrics record
   (DSGD__CK_REC_HEAD floats) and then its copy of each variable in order. */
#define DSGD__CK_REC_HEAD (DSGD__CK_METRICS_BYTES / sizeof(float))

static void dsgd__ck_put_variables(dsgd__ck_writer *w, const dsgd_strategy *s, const float *gathered, size_t rec) {
    size_t off = DSGD__CK_REC_HEAD;
    int i, g;
    dsgd__ckw_begin(w, "strategy");
    dsgd__ckw_u32(w, (uint32_t)s->d.kind);
    dsgd__ckw_u32(w, (uint32_t)s->world);
    dsgd__ckw_end(w);
    dsgd__ckw_begin(w, "variables");
    dsgd__ckw_u32(w, (uint32_t)s->num_vars);
    for (i = 0; i < s->num_vars; ++i) {
        const dsgd__dvar *v = &s->vars[i];
        dsgd__ckw_str(w, v->name);
        dsgd__ckw_u64(w, (uint64_t)v->count);
        dsgd__ckw_u32(w, (uint32_t)v->sync);
        dsgd__ckw_u32(w, (uint32_t)v->agg);
        dsgd__ckw_u32(w, (uint32_t)v->trainable);
        dsgd__ckw_u32(w, (uint32_t)s->world);
        if (!gathered) {
            dsgd__ckw_floats(w, v->copies, (size_t)s->n * v->count);
            continue;
        }
        for (g = 0; g < s->world; ++g) dsgd__ckw_floats(w, gathered + (size_t)g * rec + off, v->count);
        off += v->count;
    }
    dsgd__ckw_end(w);
}

/* ---- a comm hook's state: the "hook" section (COMM HOOKS in comm_hook.h) */

/* This process's replicas' hook states, saved (on the strategy's thread,
   before anything is written). */
typedef struct dsgd__ck_hook_out {
    size_t *bytes;       /* local replica i's */
    unsigned char *data; /* theirs, one after another */
    size_t total;
} dsgd__ck_hook_out;

static void dsgd__ck_hook_out_free(dsgd__ck_hook_out *ho) {
    DSGD_FREE(ho->bytes);
    DSGD_FREE(ho->data);
    memset(ho, 0, sizeof(*ho));
}

/* Saves every local replica's state into ho (all empty without a hook
   that has state_bytes). A failure is recorded on the strategy's ctx. */
static dsgd_result dsgd__ck_hook_save(dsgd_strategy *s, const char *what, dsgd__ck_hook_out *ho) {
    const dsgd__hook *h = s->hook;
    size_t at = 0;
    int i;
    memset(ho, 0, sizeof(*ho));
    if (!h || !h->t.state_bytes) return DSGD_OK;
    if (!(ho->bytes = (size_t *)dsgd__alloc(s->ctx, sizeof(size_t) * (size_t)s->n, what))) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < s->n; ++i) {
        ho->bytes[i] = h->t.state_bytes(h->state[i]);
        if (ho->bytes[i] > SIZE_MAX / 2 - ho->total)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: comm hook '%s': states of over %zu bytes",
                                      what, h->name, ho->total);
        ho->total += ho->bytes[i];
    }
    if (!(ho->data = (unsigned char *)dsgd__alloc(s->ctx, ho->total ? ho->total : 1, what))) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < s->n; ++i) {
        dsgd_result r = ho->bytes[i] ? h->t.save(h->state[i], ho->data + at, ho->bytes[i]) : DSGD_OK;
        if (r != DSGD_OK)
            return dsgd_ctx_set_error(s->ctx, r, "%s: comm hook '%s' could not save replica %d's state (%zu bytes): %s",
                                      what, h->name, s->reps[i].rank, ho->bytes[i], dsgd_result_string(r));
        at += ho->bytes[i];
    }
    return DSGD_OK;
}

/* "hook": the hook's name, the replica count (world), then each replica's
   state in global rank order: u64 size, the bytes (data holds them one
   after another). */
static void dsgd__ck_put_hook(dsgd__ck_writer *w, const char *name, int world, const size_t *bytes,
                              const unsigned char *data) {
    unsigned char *p;
    int g;
    dsgd__ckw_begin(w, "hook");
    dsgd__ckw_str(w, name);
    dsgd__ckw_u32(w, (uint32_t)world);
    for (g = 0; g < world; ++g) {
        dsgd__ckw_u64(w, (uint64_t)bytes[g]);
        if (bytes[g] && (p = dsgd__ckw_grow(w, bytes[g]))) memcpy(p, data, bytes[g]);
        data += bytes[g];
    }
    dsgd__ckw_end(w);
}

/* A restore's hook states: each local replica's saved bytes, located in
   the file, and the bytes it held before, to put back if the restore
   stops after they were loaded. */
typedef struct dsgd__ck_hook_in {
    int load;                  /* the states are loaded (a hook with state) */
    const unsigned char **src; /* local replica i's saved bytes (len[i]) */
    size_t *len;
    dsgd__ck_hook_out old;     /* their states before the load */
    int loaded;                /* local replicas loaded so far */
} dsgd__ck_hook_in;

/* Checks the file's "hook" section against the strategy's hook (COMM
   HOOKS in comm_hook.h: any difference is DSGD_ERR_INVALID_ARGUMENT saying
   what differs) and locates each local replica's bytes. */
static dsgd_result dsgd__ck_check_hook(const dsgd__ck_file *f, dsgd_strategy *s, dsgd__ck_hook_in *hi) {
    const dsgd__ck_section *sec = dsgd__ck_find(f, "hook");
    const dsgd__hook *h = s->hook;
    char name[DSGD__HOOK_NAME_MAX + 1];
    dsgd__ck_cur c;
    uint32_t copies, g;
    int i, stateful = 0;
    for (i = 0; h && h->t.state_bytes && i < s->n; ++i) stateful |= h->t.state_bytes(h->state[i]) > 0;
    if (!sec) {
        if (stateful)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: %s: the checkpoint has no state of comm hook '%s' (no \"hook\" section: it "
                                      "was saved without that hook), which keeps state", f->what, f->path, h->name);
        return DSGD_OK;
    }
    c = dsgd__ck_cursor(sec);
    dsgd__ckr_str(&c, name, sizeof(name));
    copies = dsgd__ckr_u32(&c);
    if (c.bad || copies == 0 || copies > DSGD__CK_MAX_RECORDS)
        return dsgd__ck_bad_section(f, sec, "a hook name too long, or no replica count");
    if (!h)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: the checkpoint holds the state of comm hook '%s'; the strategy has no comm "
                                  "hook (dsgd_strategy_desc.comm_hook)", f->what, f->path, name);
    if (strcmp(name, h->name) != 0)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: the checkpoint holds the state of comm hook '%s', the strategy's hook is '%s'",
                                  f->what, f->path, name, h->name);
    if (stateful && copies != (uint32_t)s->world)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: the checkpoint holds comm hook '%s''s state of %u replicas, the strategy has "
                                  "%d in sync (a hook's state restores at the same replica count only)",
                                  f->what, f->path, name, (unsigned)copies, s->world);
    hi->src = (const unsigned char **)dsgd__alloc(s->ctx, sizeof(*hi->src) * (size_t)(s->n ? s->n : 1), f->what);
    hi->len = (size_t *)dsgd__alloc(s->ctx, sizeof(size_t) * (size_t)(s->n ? s->n : 1), f->what);
    if (!hi->src || !hi->len) return DSGD_ERR_OUT_OF_MEMORY;
    for (g = 0; g < copies; ++g) {
        uint64_t len = dsgd__ckr_u64(&c);
        const unsigned char *p = len <= (uint64_t)c.left ? dsgd__ck_take(&c, (size_t)len) : NULL;
        if (c.bad || (len && !p)) return dsgd__ck_bad_section(f, sec, "a replica's state cut short");
        if ((int)g >= s->first && (int)g < s->first + s->n) {
            hi->src[g - (uint32_t)s->first] = p;
            hi->len[g - (uint32_t)s->first] = (size_t)len;
        }
    }
    if (c.left != 0) return dsgd__ck_bad_section(f, sec, "bytes after the last replica's state");
    hi->load = stateful;
    return DSGD_OK;
}

/* Puts back the states loaded so far (the restore stopped). */
static void dsgd__ck_hook_unload(dsgd_strategy *s, dsgd__ck_hook_in *hi) {
    const dsgd__hook *h = s->hook;
    size_t at = 0;
    int i;
    for (i = 0; i < hi->loaded; ++i) {
        h->t.load(h->state[i], hi->old.data + at, hi->old.bytes[i]);
        at += hi->old.bytes[i];
    }
    hi->loaded = 0;
}

/* Loads each local replica's saved bytes (keeping what it held in
   hi->old); a load that fails puts back the ones done and fails. */
static dsgd_result dsgd__ck_hook_load(dsgd_strategy *s, const char *what, const char *path, dsgd__ck_hook_in *hi) {
    const dsgd__hook *h = s->hook;
    dsgd_result r;
    int i;
    if (!hi->load) return DSGD_OK;
    if ((r = dsgd__ck_hook_save(s, what, &hi->old)) != DSGD_OK) return r;
    for (i = 0; i < s->n; ++i) {
        if ((r = h->t.load(h->state[i], hi->src[i], hi->len[i])) != DSGD_OK) {
            dsgd__ck_hook_unload(s, hi);
            return dsgd_ctx_set_error(s->ctx, r, "%s: %s: comm hook '%s' could not load replica %d's state (%zu bytes): %s",
                                      what, path, h->name, s->reps[i].rank, hi->len[i], dsgd_result_string(r));
        }
        hi->loaded = i + 1;
    }
    return DSGD_OK;
}

static void dsgd__ck_hook_in_free(dsgd__ck_hook_in *hi) {
    DSGD_FREE(hi->src);
    DSGD_FREE(hi->len);
    dsgd__ck_hook_out_free(&hi->old);
}

/* ---- across workers: save and restore are collectives of every worker */

/* One multi-worker save or restore's shared state. */
typedef struct dsgd__ck_world {
    size_t rec;   /* floats per replica record (the hook's state last) */
    const dsgd__ck_hook_out *ho; /* this worker's replicas' hook states */
    size_t hook_off;  /* where a record's hook state starts, two bytes a float */
    size_t *sizes;    /* every replica's hook state bytes (world; the sizes job) */
    float *all;   /* world records, gathered (save) */
    int code;     /* this worker's result, for a verdict */
    int bad_rank; /* the verdict: the first rank that failed (-1: none) */
    int bad_code; /* and its result */
} dsgd__ck_world;

/* Each replica packs its record (metrics, then its copy of every
   variable) and all-gathers the world's; local replica 0 keeps them. */
static dsgd_result dsgd__ck_gather_job(dsgd_replica *r, void *user) {
    dsgd__ck_world *cw = (dsgd__ck_world *)user;
    dsgd_strategy *s = r->s;
    size_t n = cw->rec * (size_t)s->world, off = DSGD__CK_REC_HEAD;
    float *buf = dsgd__replica_stage(r, n), *mine;
    dsgd__ck_mrec mrec;
    dsgd_result res;
    int i;
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    mine = buf + (size_t)r->rank * cw->rec;
    if ((res = dsgd__ck_mrec_get(r->m.model, &mrec)) != DSGD_OK) return res;
    memcpy(mine, &mrec, sizeof(mrec));
    for (i = 0; i < s->num_vars; ++i) {
        memcpy(mine + off, s->vars[i].copies + (size_t)r->local * s->vars[i].count, sizeof(float) * s->vars[i].count);
        off += s->vars[i].count;
    }
    if (cw->hook_off) { /* its hook state, two bytes a float (exact integers) */
        const unsigned char *b = cw->ho->data;
        size_t k, len = cw->ho->bytes[r->local];
        for (i = 0; i < r->local; ++i) b += cw->ho->bytes[i];
        for (k = 0; k < cw->rec - cw->hook_off; ++k)
            mine[cw->hook_off + k] = (float)((2 * k < len ? b[2 * k] : 0) | (2 * k + 1 < len ? b[2 * k + 1] << 8 : 0));
    }
    if ((res = dsgd_allgather(r->comm, buf, n, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if (r->local == 0) memcpy(cw->all, buf, sizeof(float) * n);
    return DSGD_OK;
}

/* Every replica all-gathers the size of its hook state (three 16-bit
   pieces, exact as floats); local replica 0 keeps them in cw->sizes. */
static dsgd_result dsgd__ck_hook_sizes_job(dsgd_replica *r, void *user) {
    dsgd__ck_world *cw = (dsgd__ck_world *)user;
    int world = r->s->world, g, k;
    uint64_t mine = cw->ho->bytes ? (uint64_t)cw->ho->bytes[r->local] : 0;
    float *buf = dsgd__replica_stage(r, 3 * (size_t)world);
    dsgd_result res;
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    for (k = 0; k < 3; ++k) buf[3 * (size_t)r->rank + k] = (float)((mine >> (16 * k)) & 0xffff);
    if ((res = dsgd_allgather(r->comm, buf, 3 * (size_t)world, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if (r->local == 0)
        for (g = 0; g < world; ++g) {
            uint64_t v = 0;
            for (k = 0; k < 3; ++k) v |= (uint64_t)buf[3 * (size_t)g + k] << (16 * k);
            cw->sizes[g] = (size_t)v;
        }
    return DSGD_OK;
}

/* Every replica all-gathers its worker's result (cw->code), so every
   worker learns the first rank that failed and its code. */
static dsgd_result dsgd__ck_verdict_job(dsgd_replica *r, void *user) {
    dsgd__ck_world *cw = (dsgd__ck_world *)user;
    int world = r->s->world, g;
    float *buf = dsgd__replica_stage(r, (size_t)world);
    dsgd_result res;
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    buf[r->rank] = (float)cw->code; /* small integers: exact */
    if ((res = dsgd_allgather(r->comm, buf, (size_t)world, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if (r->local == 0)
        for (g = world - 1; g >= 0; --g)
            if (buf[g] != 0.0f) {
                cw->bad_rank = g;
                cw->bad_code = (int)buf[g];
            }
    return DSGD_OK;
}

/* Tells every worker this worker's result (mine); DSGD_OK when every
   worker succeeded. Otherwise a worker that failed keeps its own error
   and the others record one naming the first rank that failed. */
static dsgd_result dsgd__ck_verdict(dsgd_strategy *s, dsgd_result mine, const char *what, const char *path,
                                    const char *doing, const char *untouched) {
    dsgd__ck_world cw;
    dsgd_result r;
    memset(&cw, 0, sizeof(cw));
    cw.code = (int)mine;
    cw.bad_rank = -1;
    if ((r = dsgd__strategy_dispatch(s, dsgd__ck_verdict_job, &cw, what)) != DSGD_OK) return r;
    if (cw.bad_rank < 0 || mine != DSGD_OK) return mine;
    return dsgd_ctx_set_error(s->ctx, (dsgd_result)cw.bad_code,
                              "%s: %s: rank %d failed %s (%s; its worker has the message); nothing was %s", what,
                              path ? path : "(null)", cw.bad_rank, doing, dsgd_result_string((dsgd_result)cw.bad_code),
                              untouched);
}

/* The record's floats: the metrics record and one copy of each variable. */
static size_t dsgd__ck_rec_floats(const dsgd_strategy *s) {
    size_t n = DSGD__CK_REC_HEAD;
    int i;
    for (i = 0; i < s->num_vars; ++i) n += s->vars[i].count;
    return n;
}

/* Multi-worker save: every worker learns that every worker's arguments
   and memory are good (one verdict), the records are all-gathered, worker
   0 (the chief, global rank 0) writes the file, and every worker learns
   its result. */
static dsgd_result dsgd__strategy_save_world(dsgd_strategy *s, const char *path, const dsgd_checkpoint_extra *extra,
                                             const char *what, dsgd_result args) {
    dsgd__ck_world cw;
    dsgd__ck_hook_out ho;
    dsgd_result r, mine = args;
    size_t bytes = 0, most = 0;
    int g;
    memset(&cw, 0, sizeof(cw));
    cw.rec = dsgd__ck_rec_floats(s);
    cw.ho = &ho;
    memset(&ho, 0, sizeof(ho));
    if (s->hook && s->hook->t.state_bytes) { /* the hook's states: saved here, their sizes all-gathered */
        if (mine == DSGD_OK && (mine = dsgd__ck_hook_save(s, what, &ho)) != DSGD_OK) dsgd__ck_hook_out_free(&ho);
        if (!(cw.sizes = (size_t *)dsgd__alloc(s->ctx, sizeof(size_t) * (size_t)s->world, what))) {
            dsgd__ck_hook_out_free(&ho);
            return DSGD_ERR_OUT_OF_MEMORY; /* the others time out in the collective, as for any local failure */
        }
        if ((r = dsgd__strategy_dispatch(s, dsgd__ck_hook_sizes_job, &cw, what)) != DSGD_OK) {
            dsgd__ck_hook_out_free(&ho);
            DSGD_FREE(cw.sizes);
            return r;
        }
        for (g = 0; g < s->world; ++g) most = DSGD__MAX(most, cw.sizes[g]);
        if (most > 0 && mine == DSGD_OK) {
            cw.hook_off = cw.rec;
            cw.rec += (most + 1) / 2;
        }
    }
    if (mine == DSGD_OK && dsgd__mul_overflows(cw.rec, (size_t)s->world * sizeof(float), &bytes))
        mine = dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: the variables are too large", what);
    else if (mine == DSGD_OK && !(cw.all = (float *)dsgd__alloc(s->ctx, bytes, what)))
        mine = DSGD_ERR_OUT_OF_MEMORY;
    /* one verdict on every worker's arguments and memory, before any data moves */
    if ((r = dsgd__ck_verdict(s, mine, what, path, "checking its arguments or allocating", "written")) != DSGD_OK) {
        DSGD_FREE(cw.all);
        DSGD_FREE(cw.sizes);
        dsgd__ck_hook_out_free(&ho);
        return r;
    }
    r = dsgd__strategy_dispatch(s, dsgd__ck_gather_job, &cw, what);
    if (r == DSGD_OK && s->ck_put) r = s->ck_put(s, NULL); /* the kind's own, brought to the chief */
    if (r == DSGD_OK && s->first == 0) {
        dsgd__ck_vars v = dsgd__strategy_state(s);
        dsgd__ck_writer w;
        int g;
        dsgd__ckw_init(&w, s->ctx, what,
                       dsgd__ck_expect(s->reps[0].m.model, dsgd__opt_state_slots(&v.opt->st),
                                       bytes + (extra ? extra->user_bytes : 0)));
        dsgd__ck_put_state(&w, s, &v);
        dsgd__ckw_begin(&w, "metrics");
        dsgd__ckw_u32(&w, (uint32_t)s->world);
        for (g = 0; g < s->world; ++g) {
            dsgd__ck_mrec rec;
            memcpy(&rec, cw.all + (size_t)g * cw.rec, sizeof(rec));
            dsgd__ckw_mrec(&w, &rec);
        }
        dsgd__ckw_end(&w);
        dsgd__ck_put_variables(&w, s, cw.all, cw.rec);
        if (s->ck_put) s->ck_put(s, &w);
        if (cw.hook_off) { /* every replica's hook state, back to bytes */
            size_t total = 0, k, at = 0;
            unsigned char *b;
            for (g = 0; g < s->world; ++g) total += cw.sizes[g];
            if ((b = (unsigned char *)dsgd__alloc(s->ctx, total ? total : 1, what)) != NULL) {
                for (g = 0; g < s->world; ++g)
                    for (k = 0; k < cw.sizes[g]; ++k) {
                        unsigned v = (unsigned)cw.all[(size_t)g * cw.rec + cw.hook_off + k / 2];
                        b[at++] = (unsigned char)(k % 2 ? v >> 8 : v & 0xff);
                    }
                dsgd__ck_put_hook(&w, s->hook->name, s->world, cw.sizes, b);
                DSGD_FREE(b);
            } else if (w.res == DSGD_OK) {
                w.res = DSGD_ERR_OUT_OF_MEMORY;
            }
        }
        dsgd__ck_put_extra(&w, extra);
        if (w.res != DSGD_OK && w.res != DSGD_ERR_OUT_OF_MEMORY)
            dsgd_ctx_set_error(s->ctx, w.res, "%s: reading the state: %s", what, dsgd_ctx_last_error(v.ctx));
        mine = dsgd__ckw_commit(&w, path);
    }
    DSGD_FREE(cw.all);
    DSGD_FREE(cw.sizes);
    dsgd__ck_hook_out_free(&ho);
    if (r != DSGD_OK) return r;
    return dsgd__ck_verdict(s, mine, what, path, "writing the checkpoint", "written");
}

DSGD_API dsgd_result dsgd_strategy_save(dsgd_strategy *s, const char *path, const dsgd_checkpoint_extra *extra) {
    const char *what = "dsgd_strategy_save";
    dsgd__ck_vars v;
    dsgd_model **models;
    dsgd__ck_hook_out ho;
    dsgd__ck_writer w;
    dsgd_result r;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__strategy_ck_usable(s, what)) != DSGD_OK) return r;
    if ((r = dsgd__strategy_verdicts(s, 0, what)) != DSGD_OK) return r; /* the step count it saves */
    r = dsgd__ck_check_args(s->ctx, what, path, extra);
    if (s->ops->save) { /* the kind's own state first; maybe no file here */
        int writes = 1;
        if (r != DSGD_OK || (r = s->ops->save(s, path, &writes)) != DSGD_OK || !writes) return r;
    }
    if (s->world > s->n) return dsgd__strategy_save_world(s, path, extra, what, r);
    if (r != DSGD_OK) return r;
    if (s->ck_put && (r = s->ck_put(s, NULL)) != DSGD_OK) return r;
    if ((r = dsgd__ck_hook_save(s, what, &ho)) != DSGD_OK) {
        dsgd__ck_hook_out_free(&ho);
        return r;
    }
    if (!(models = dsgd__strategy_models(s, what))) {
        dsgd__ck_hook_out_free(&ho);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    v = dsgd__strategy_state(s);
    dsgd__ckw_init(&w, s->ctx, what,
                   dsgd__ck_expect(s->reps[0].m.model, dsgd__opt_state_slots(&v.opt->st),
                                   (extra ? extra->user_bytes : 0) + ho.total));
    dsgd__ck_put_state(&w, s, &v);
    dsgd__ck_put_metrics(&w, models, s->n);
    dsgd__ck_put_variables(&w, s, NULL, 0);
    if (s->ck_put) s->ck_put(s, &w);
    if (ho.total > 0) dsgd__ck_put_hook(&w, s->hook->name, s->n, ho.bytes, ho.data);
    dsgd__ck_put_extra(&w, extra);
    if (w.res != DSGD_OK && w.res != DSGD_ERR_OUT_OF_MEMORY) /* a backend's error, on its replica's ctx */
        dsgd_ctx_set_error(s->ctx, w.res, "%s: reading a replica's state: %s", what, dsgd_ctx_last_error(v.ctx));
    DSGD_FREE(models);
    dsgd__ck_hook_out_free(&ho);
    return dsgd__ckw_commit(&w, path);
}

/* One saved variable, located in the image. */
typedef struct dsgd__ck_var {
    uint32_t copies;
    const unsigned char *data; /* copies x count floats */
} dsgd__ck_var;

/* Matches the saved variables with the strategy's, by name (found[i] for
   s->vars[i]); any difference is DSGD_ERR_SHAPE naming the variable. A
   model's checkpoint (no "variables") matches a strategy with only its
   metrics. */
static dsgd_result dsgd__ck_check_variables(const dsgd__ck_file *f, const dsgd_strategy *s, dsgd__ck_var *found) {
    const dsgd__ck_section *sec = dsgd__ck_find(f, "variables");
    dsgd__ck_cur c;
    uint32_t nv, i;
    int k, first_user = s->metric_var[1] + 3; /* the metrics' six come first */
    for (k = 0; k < s->num_vars; ++k) found[k].data = NULL;
    if (!sec) {
        if (s->num_vars > first_user)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: the checkpoint has no distributed variables; the strategy has \"%s\"",
                                      f->what, f->path, s->vars[first_user].name);
        return DSGD_OK;
    }
    c = dsgd__ck_cursor(sec);
    nv = dsgd__ckr_u32(&c);
    for (i = 0; i < nv; ++i) {
        char name[DSGD_MAX_VARIABLE_NAME + 1];
        uint64_t count;
        uint32_t sync, agg, copies;
        dsgd__ckr_str(&c, name, sizeof(name));
        count = dsgd__ckr_u64(&c);
        sync = dsgd__ckr_u32(&c);
        agg = dsgd__ckr_u32(&c);
        (void)dsgd__ckr_u32(&c); /* trainable: fixed by sync and the creator */
        copies = dsgd__ckr_u32(&c);
        if (c.bad || copies == 0 || copies > DSGD__CK_MAX_RECORDS || count == 0 ||
            count > (uint64_t)(c.left / sizeof(float) / copies))
            return dsgd__ck_bad_section(f, sec, "a variable record cut short or of no size");
        for (k = 0; k < s->num_vars && strcmp(s->vars[k].name, name) != 0; ++k) {
        }
        if (k == s->num_vars)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: the checkpoint has distributed variable \"%s\", the strategy does not "
                                      "(create it before the restore)",
                                      f->what, f->path, name);
        if (found[k].data) return dsgd__ck_bad_section(f, sec, "a variable saved twice");
        if (count != (uint64_t)s->vars[k].count || sync != (uint32_t)s->vars[k].sync || agg != (uint32_t)s->vars[k].agg)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: variable \"%s\" has %llu floats, %s, %s in the checkpoint and %zu, %s, "
                                      "%s in the strategy",
                                      f->what, f->path, name, (unsigned long long)count,
                                      dsgd_synchronization_name((dsgd_synchronization)sync),
                                      dsgd_aggregation_name((dsgd_aggregation)agg), s->vars[k].count,
                                      dsgd_synchronization_name(s->vars[k].sync), dsgd_aggregation_name(s->vars[k].agg));
        found[k].copies = copies;
        found[k].data = dsgd__ckr_floats(&c, (uint64_t)copies * count);
    }
    if (c.bad || c.left != 0) return dsgd__ck_bad_section(f, sec, "bytes after the last variable");
    for (k = 0; k < s->num_vars; ++k)
        if (!found[k].data && k >= first_user)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: the strategy has distributed variable \"%s\", the checkpoint does not",
                                      f->what, f->path, s->vars[k].name);
    return DSGD_OK;
}

/* Writes the saved copies into the strategy's (global replicas first ..
   first + n - 1 of world): as they are at the same replica count, else as
   a cross-replica read and assignment (above). */
static void dsgd__ck_apply_variable(dsgd_strategy *s, dsgd__dvar *v, const dsgd__ck_var *in) {
    size_t i, count = v->count;
    uint32_t r;
    if (!in->data) { /* a metric missing from a model's checkpoint: zero */
        memset(v->copies, 0, sizeof(float) * count * (size_t)s->n);
        return;
    }
    if (in->copies == (uint32_t)s->world) {
        dsgd__ck_copy_floats(v->copies, in->data + (size_t)s->first * count * sizeof(float), count * (size_t)s->n);
        return;
    }
    dsgd__ck_copy_floats(v->copies, in->data, count); /* the saved copy 0 */
    if (v->sync == DSGD_SYNC_ON_READ && v->agg != DSGD_AGG_ONLY_FIRST_REPLICA)
        for (i = 0; i < count; ++i) {
            double acc = 0.0; /* rank order, in double, as a cross-replica read */
            float x, value;
            for (r = 0; r < in->copies; ++r) {
                dsgd__ck_copy_floats(&x, in->data + ((size_t)r * count + i) * sizeof(float), 1);
                acc += x;
            }
            value = (float)(v->agg == DSGD_AGG_MEAN ? acc / in->copies : acc);
            v->copies[i] = v->agg == DSGD_AGG_SUM ? value / (float)s->world : value;
        }
    for (r = 1; r < (uint32_t)s->n; ++r) memcpy(v->copies + (size_t)r * count, v->copies, sizeof(float) * count);
}

/* Writes the checked state into every replica (and the central copy).
   A backend error here leaves the replicas different. */
static dsgd_result dsgd__ck_apply_strategy(dsgd_strategy *s, const dsgd__ck_file *f, const dsgd__ck_state *cs,
                                           dsgd_model **models) {
    const dsgd__ck_opt *st = &cs->opt;
    dsgd__ck_vars v = dsgd__strategy_state(s);
    dsgd_result r = DSGD_OK;
    int i;
    if (s->ops->state) {
        if ((r = dsgd__ck_apply_params(f, &v)) == DSGD_OK) r = dsgd__ck_apply_optimizer(f, &v, st);
        if (r != DSGD_OK) return dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(v.ctx));
    }
    for (i = 0; i < s->n; ++i) {
        dsgd_replica *rep = &s->reps[i];
        dsgd__ck_vars rv = dsgd__ck_vars_of(rep->m.model, rep->opt);
        r = dsgd__ck_apply_params(f, &rv);
        if (r == DSGD_OK && !s->ops->state) r = dsgd__ck_apply_optimizer(f, &rv, st);
        if (r != DSGD_OK) return dsgd_ctx_set_error(s->ctx, r, "replica %d: %s", i, dsgd_ctx_last_error(rep->m.ctx));
        dsgd__optimizer_set_steps(rep->opt, st->t);
        dsgd__optimizer_set_last_grad_norm(rep->opt, st->last_norm);
    }
    if ((r = dsgd__ck_apply_metrics(cs->metrics, cs->replicas, models, s->n, s->first, s->world)) != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "%s", "a replica's backend failed writing its metrics");
    return DSGD_OK;
}

/* Checks the parsed checkpoint f against s and extra (r: DSGD_OK, or the
   error that kept f from opening); across workers every worker then learns
   whether every worker's checks passed; then it restores. */
static dsgd_result dsgd__strategy_restore_from(dsgd_strategy *s, const dsgd__ck_file *f, dsgd_result r,
                                               const dsgd_checkpoint_extra *extra, const char *what,
                                               const char *path) {
    dsgd__ck_vars v = dsgd__strategy_state(s);
    dsgd_model **models = NULL;
    dsgd__ck_var *found = NULL;
    dsgd__ck_state st;
    dsgd__ck_hook_in hi;
    int i;
    memset(&hi, 0, sizeof(hi));
    if (r == DSGD_OK && (r = dsgd__ck_check_state(f, s->reps[0].m.model, &v, extra, &st)) == DSGD_OK) {
        found = (dsgd__ck_var *)dsgd__alloc(s->ctx, sizeof(dsgd__ck_var) * (size_t)(s->num_vars ? s->num_vars : 1),
                                            what);
        models = dsgd__strategy_models(s, what);
        r = found && models ? dsgd__ck_check_variables(f, s, found) : DSGD_ERR_OUT_OF_MEMORY;
        if (r == DSGD_OK && s->ck_take) r = s->ck_take(s, f, 0); /* the kind's own sections, checked */
    }
    if (r == DSGD_OK && (r = dsgd__ck_check_hook(f, s, &hi)) == DSGD_OK) /* loaded now: a load may fail */
        r = dsgd__ck_hook_load(s, what, path, &hi);
    if (s->world > s->n) r = dsgd__ck_verdict(s, r, what, path, "checking the checkpoint", "restored");
    if (r == DSGD_OK && s->ops->restore) r = s->ops->restore(s, path, 0, st.opt.t); /* the kind's own: checked, staged */
    if (r != DSGD_OK) dsgd__ck_hook_unload(s, &hi); /* nothing touched */
    if (r == DSGD_OK) { /* everything checked (on every worker): now write */
        if ((r = dsgd__ck_apply_strategy(s, f, &st, models)) != DSGD_OK) {
            if (s->ops->restore) s->ops->restore(s, path, -1, -1);
            dsgd__strategy_fail(s, st.opt.t, what, dsgd_ctx_last_error(s->ctx));
        } else {
            for (i = 0; i < s->num_vars; ++i) dsgd__ck_apply_variable(s, &s->vars[i], &found[i]);
            dsgd__ck_apply_extra(f, extra, &st.pos);
            if (s->ck_take && (r = s->ck_take(s, f, 1)) != DSGD_OK)
                dsgd__strategy_fail(s, st.opt.t, what, dsgd_ctx_last_error(s->ctx));
            if (r == DSGD_OK && s->ops->restore) r = s->ops->restore(s, path, 1, -1);
        }
    }
    DSGD_FREE(found);
    DSGD_FREE(models);
    dsgd__ck_hook_in_free(&hi);
    return r;
}

DSGD_API dsgd_result dsgd_strategy_restore(dsgd_strategy *s, const char *path, const dsgd_checkpoint_extra *extra) {
    const char *what = "dsgd_strategy_restore";
    dsgd__ck_file f;
    dsgd_result r;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__strategy_ck_usable(s, what)) != DSGD_OK) return r;
    if ((r = dsgd__strategy_verdicts(s, 1, what)) != DSGD_OK) return r; /* what it restores replaces them */
    memset(&f, 0, sizeof(f));
    r = dsgd__ck_check_args(s->ctx, what, path, extra);
    if (s->n == 0) /* no replica here: the kind's own state only */
        return r != DSGD_OK || (r = s->ops->restore(s, path, 0, -1)) != DSGD_OK ? r : s->ops->restore(s, path, 1, -1);
    if (r == DSGD_OK) r = dsgd__ck_open(&f, s->ctx, what, path);
    if (r == DSGD_OK || s->world > s->n) r = dsgd__strategy_restore_from(s, &f, r, extra, what, path);
    dsgd__ck_close(&f);
    return r;
}

#endif /* DSGD__PART_STRATEGY_CHECKPOINT_IMPL */
