/* distsgd/ps_server.h - a parameter server: holds its shards (or only sums), applies pushes as the policy says, answers pulls
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   See PARAMETER SERVERS in ps.h for the roles, the policies and the wire
   protocol, and CHECKPOINTS in ps_checkpoint.h for save and restore. A
   server is one thread's: dsgd_ps_server_serve answers its workers until
   every one has finished.
*/
#ifndef DSGD__PART_PS_SERVER_DECL
#define DSGD__PART_PS_SERVER_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* What a server did (dsgd_ps_server_get_stats). */
typedef struct dsgd_ps_server_stats {
    int64_t version;          /* optimizer updates applied */
    int64_t pushes_received;  /* new pushes (not duplicates) */
    int64_t pushes_applied;   /* gradients that went into an update (ASYNC:
                                 = version; else the accepted pushes of the
                                 applied clocks) */
    int64_t duplicates;       /* pushes received again (resends, copies) */
    int64_t stale_dropped;    /* BACKUP: pushes for an older step, dropped */
    int64_t pulls_answered;
    int64_t pulls_deferred;   /* answered later, when the version was reached */
    int64_t pulls_repeated;   /* resent pulls (replacing or dropped) */
    int64_t cancels_sent;     /* BACKUP with backup_cancel: CANCELs sent to
                                 late workers */
    int64_t joins;            /* late workers admitted (MEMBERSHIP in ps.h) */
    double staleness_mean;    /* over the applied pushes; 0 when none */
    int64_t staleness_max;
    int staleness_bins;
    const int64_t *staleness_hist; /* [staleness_bins], sums to pushes_applied;
                                      points into the server */
} dsgd_ps_server_stats;

/* What a server knows of one worker (dsgd_ps_server_get_peer_stats). */
typedef struct dsgd_ps_peer_stats {
    int member;          /* 1: the server counts it (from the start, or it
                            joined or is joining); 0: a late worker that
                            has not joined */
    int64_t joined_at;   /* the clock it is counted from: 0 for a member
                            from the start, a late worker's join clock
                            (MEMBERSHIP in ps.h), -1 not joined */
    int64_t pushes;      /* its new pushes (not duplicates) */
    int64_t applied;     /* of them, the gradients that went into an update */
    int finished;        /* it called dsgd_ps_worker_finish */
} dsgd_ps_peer_stats;

/* Creates server t->rank (0 <= rank < P) of desc over endpoint t (copied;
   it must outlive the server) with the shards `map` places on it (map must
   outlive it too), their parameters copied from initial_full_params (the
   whole flat buffer; every server and worker must be given the same map and
   desc). Its optimizer state lives on a CPU backend created with ctx.
   With apply ON_WORKERS the server holds no parameters and no optimizer
   state: initial_full_params is ignored and may be NULL.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing
   recorded; t, desc, map, initial_full_params (ON_SERVERS) or out NULL; a
   bad desc: P or W < 1, an unknown policy or apply, ON_WORKERS with ASYNC,
   staleness or backup_workers out of range or set
   for another policy, the optimizer (as dsgd_optimizer_create), clip_norm
   > 0, timeout_s, retry_s or staleness_bins out of range; t->size not
   P + W; t->rank not a server; map built for another number of servers),
   DSGD_ERR_UNSUPPORTED (t has no probe), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: ctx's thread; the server is then used by one thread at a
   time, the rank's. */
DSGD_API dsgd_result dsgd_ps_server_create(dsgd_ctx *ctx, const dsgd_transport_i *t, const dsgd_ps_desc *desc,
                                           const dsgd_shard_map *map, const float *initial_full_params,
                                           dsgd_ps_server **out);
/* Serves the workers until every one has called dsgd_ps_worker_finish:
   answers pulls (deferring those the policy makes wait), applies pushes as
   the policy says, acknowledges each. Called once.
   Errors (recorded on the server's ctx, "dsgd_ps_server_serve: server s:
   ..."): DSGD_ERR_STATE (called again, or after a failure; s NULL gives
   DSGD_ERR_INVALID_ARGUMENT with nothing recorded), DSGD_ERR_TIMEOUT (no
   message from some unfinished worker for timeout_s: the message names
   them), DSGD_ERR_DESYNC (a message from a non-worker rank, of an unknown
   type or size, a push seq ahead of the expected one, a clock outside the
   SSP window; a deferred pull that can never be answered, see UPDATE
   POLICIES), DSGD_ERR_ABORTED and transport errors, DSGD_ERR_OUT_OF_MEMORY,
   backend errors. After a failure the server is unusable (destroy it).
   Thread safety: the server's thread. */
DSGD_API dsgd_result dsgd_ps_server_serve(dsgd_ps_server *s);
/* Fills *out with the server's counters (zeros for s or out NULL).
   Errors: none. Thread safety: the server's thread. */
DSGD_API void dsgd_ps_server_get_stats(const dsgd_ps_server *s, dsgd_ps_server_stats *out);
/* Fills *out with what server s knows of worker `worker` (0 <= worker <
   W): pushes counts from the run's start (a restore brings them back),
   applied since create or restore.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; out NULL or
   worker out of range, *out zeroed where out is not NULL).
   Thread safety: the server's thread. */
DSGD_API dsgd_result dsgd_ps_server_get_peer_stats(const dsgd_ps_server *s, int worker, dsgd_ps_peer_stats *out);
/* Writes the server's parameters into their ranges of full (a buffer of the
   whole flat size); every other float of full is left as it is.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; full NULL),
   DSGD_ERR_UNSUPPORTED (apply ON_WORKERS: the server holds no parameters;
   read a worker's, dsgd_ps_worker_read_params).
   Thread safety: the server's thread. */
DSGD_API dsgd_result dsgd_ps_server_read_params(const dsgd_ps_server *s, float *full);
/* Saves the server's state to path, atomically (see CHECKPOINTS in
   ps_checkpoint.h and checkpoint.h): before serve, or after serve returned DSGD_OK.
   Errors (recorded on the server's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (serve
   failed: the state may be half-updated), DSGD_ERR_UNSUPPORTED (late
   workers: initial_workers < W, see MEMBERSHIP in ps.h), DSGD_ERR_IO,
   DSGD_ERR_OUT_OF_MEMORY, backend errors. path is then unchanged.
   Thread safety: the server's thread, outside serve. */
DSGD_API dsgd_result dsgd_ps_server_save(dsgd_ps_server *s, const char *path);
/* Restores what dsgd_ps_server_save wrote into s, a server created with
   the same desc and map and the same rank, before serve. Afterwards serve
   expects every worker again, each continuing from its saved sequence
   numbers.
   Errors (recorded on the server's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (serve was
   called), DSGD_ERR_UNSUPPORTED (late workers), DSGD_ERR_IO,
   DSGD_ERR_FORMAT (a damaged file),
   DSGD_ERR_SHAPE (a worker's checkpoint, another server's, or one of
   another desc, optimizer kind or shard map: the message names the
   difference), DSGD_ERR_OUT_OF_MEMORY; after any of these s is untouched.
   Thread safety: the server's thread. */
DSGD_API dsgd_result dsgd_ps_server_restore(dsgd_ps_server *s, const char *path);
/* Frees the server (NULL: nothing); not the transport or the map.
   Thread safety: the server's thread. */
DSGD_API void dsgd_ps_server_destroy(dsgd_ps_server *s);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_PS_SERVER_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_PS_SERVER_IMPL)
#define DSGD__PART_PS_SERVER_IMPL

typedef struct dsgd__ps_peer {
    uint64_t next_seq;   /* the push seq expected next */
    uint64_t last_status;
    uint64_t pull_next;  /* the pull seq expected next */
    int pull_pending;    /* a pull (seq pull_next - 1) waits for version >= pull_min */
    int done;
    int64_t pull_min;
    int64_t pull_from;   /* ON_WORKERS: the step whose mean the pending pull wants */
    int64_t have;        /* ON_WORKERS: means the worker has fetched */
    double last_heard;
    int64_t accepted;    /* BACKUP with backup_cancel: the last step a push of it went into, -1 */
    /* MEMBERSHIP (ps.h): member, counted from clock base on (a late
       worker from its prepare on); committed, its join's commit came
       (join_round: the last round taken); applied, its gradients in
       updates */
    int member, committed;
    uint64_t join_round;
    int64_t base, applied;
} dsgd__ps_peer;

struct dsgd_ps_server {
    dsgd_ctx *ctx;
    dsgd_transport_i t;
    dsgd_ps_desc d; /* defaults filled */
    const dsgd_shard_map *map;
    int index, P, W;
    const dsgd__ps_policy_row *pol;
    int ring;   /* clocks buffered at once (the policy's ring) */
    size_t n;   /* floats this server holds */
    dsgd_backend_i be;
    int have_be, state, done_count;
    dsgd_buffer *params, *grad; /* [header | n] */
    dsgd__opt_state opt;        /* the optimizer's slots for the n floats (holds only) */
    float *params_h, *grad_h;
    /* clock modes: slot[(k % ring) * W + w] holds worker w's gradient of
       clock k ([header | n]), vcomp the version it was computed on */
    dsgd_buffer **slot, **pool;
    int64_t *vcomp;
    int *slot_count, pool_len;
    /* ON_WORKERS: agg[i] is the mean of step agg_base + i ([header | n]),
       kept until every unfinished worker has fetched it */
    int holds; /* the placement's servers_hold: parameters and slots here */
    dsgd_buffer **agg, *agg_spare;
    size_t agg_len, agg_cap;
    int64_t agg_base;
    dsgd__ps_peer *peer;
    int64_t version, received, applied, duplicates, dropped, pulls, deferred, repeated, stal_max, cancels, joins;
    int late_wait; /* every member finished: the late workers that never joined now have timeout_s */
    double stal_sum;
    int64_t *hist;
};

static dsgd_result dsgd__ps_server_fail(dsgd_ps_server *s, dsgd_result r) {
    s->state = DSGD__PS_FAILED;
    return r;
}

/* The gradients that complete clock c: the policy's need with the members
   counted for c (those from the start and late ones from their clock). */
static int dsgd__ps_needed_at(const dsgd_ps_server *s, int64_t c) {
    int w, m = 0;
    for (w = 0; w < s->W; ++w) m += s->peer[w].member && s->peer[w].base <= c;
    return s->pol->needed(&s->d, m);
}

static void dsgd__ps_staleness(dsgd_ps_server *s, int64_t st) {
    if (st < 0) st = 0;
    s->stal_sum += (double)st;
    if (st > s->stal_max) s->stal_max = st;
    s->hist[st < s->d.staleness_bins - 1 ? st : s->d.staleness_bins - 1]++;
}

/* One optimizer update of the server's floats with the gradient in grad,
   charged to a simulated clock (the transport's charge_apply). */
static dsgd_result dsgd__ps_apply(dsgd_ps_server *s) {
    dsgd_result r = dsgd__opt_state_update(&s->opt, s->version, dsgd__ref(s->params, DSGD__PS_H),
                                           dsgd__ref(s->grad, DSGD__PS_H), 1.0f);
    if (r == DSGD_OK) s->version++;
    if (r == DSGD_OK && s->t.charge_apply && (r = s->t.charge_apply(s->t.impl, s->n)) != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "dsgd_ps_server_serve: server %d: charging an update failed: %s%s%s",
                                  s->index, dsgd_result_string(r), dsgd__ps_terr_sep(&s->t), dsgd__ps_terr(&s->t));
    return r;
}

static dsgd_result dsgd__ps_send(dsgd_ps_server *s, int w, uint64_t type, uint64_t seq, const void *buf, size_t bytes) {
    dsgd_result r = s->t.send(s->t.impl, s->P + w, DSGD_PS_TAG(type, seq), buf, bytes, dsgd__ps_now(&s->t) + s->d.timeout_s);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "dsgd_ps_server_serve: server %d: sending to worker %d (rank %d) failed: %s%s%s",
                                  s->index, w, s->P + w, dsgd_result_string(r), dsgd__ps_terr_sep(&s->t),
                                  dsgd__ps_terr(&s->t));
    return DSGD_OK;
}

static dsgd_result dsgd__ps_ack(dsgd_ps_server *s, int w, uint64_t seq, uint64_t status) {
    dsgd_ps_header h = dsgd__ps_hdr(DSGD_PS_MSG_ACK, w, seq, s->version, 0, status, 0);
    return dsgd__ps_send(s, w, DSGD_PS_MSG_ACK, seq, &h, sizeof h);
}

/* ON_WORKERS: the mean in grad becomes step version's result; grad gets a
   fresh buffer. */
static dsgd_result dsgd__ps_publish(dsgd_ps_server *s) {
    dsgd_buffer *b = s->agg_spare;
    dsgd_result r;
    if (s->agg_len == s->agg_cap) {
        size_t cap = s->agg_cap ? 2 * s->agg_cap : 4;
        dsgd_buffer **a = cap > SIZE_MAX / sizeof *a ? NULL : (dsgd_buffer **)DSGD_REALLOC(s->agg, cap * sizeof *a);
        if (!a)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_ps_server_serve: server %d: keeping %zu means",
                                      s->index, cap);
        s->agg = a;
        s->agg_cap = cap;
    }
    if (b) {
        s->agg_spare = NULL;
    } else if ((r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &b)) != DSGD_OK) {
        return r;
    }
    s->agg[s->agg_len++] = s->grad;
    s->grad = b;
    s->grad_h = s->be.buffer_host_ptr(s->be.impl, b);
    s->version++;
    return DSGD_OK;
}

/* ON_WORKERS: frees the means every unfinished worker has fetched (one
   buffer is kept for the next). Once every worker has finished, the rest
   stays: the workers a checkpoint restores may still fetch it. */
static void dsgd__ps_trim(dsgd_ps_server *s) {
    int64_t lo = s->version;
    size_t k, drop;
    int w;
    if (s->done_count == s->W) return;
    for (w = 0; w < s->W; ++w)
        if (!s->peer[w].done && s->peer[w].have < lo) lo = s->peer[w].have;
    if (lo <= s->agg_base) return;
    drop = (size_t)(lo - s->agg_base);
    for (k = 0; k < drop; ++k) {
        if (!s->agg_spare)
            s->agg_spare = s->agg[k];
        else
            s->be.buffer_destroy(s->be.impl, s->agg[k]);
    }
    memmove(s->agg, s->agg + drop, (s->agg_len - drop) * sizeof *s->agg);
    s->agg_len -= drop;
    s->agg_base = lo;
}

/* ON_WORKERS: answers a pull with the mean of the step it wants, or with no
   floats when the worker has every mean. */
static dsgd_result dsgd__ps_answer_sum(dsgd_ps_server *s, int w, uint64_t seq) {
    dsgd__ps_peer *pe = &s->peer[w];
    int64_t from = pe->pull_from;
    float *host;
    dsgd_result r;
    dsgd_ps_header h;
    if (from >= s->version) { /* nothing new: no floats, step -1 */
        h = dsgd__ps_hdr(DSGD_PS_MSG_PARAMS, w, seq, s->version, 0, 0, -1);
        return dsgd__ps_send(s, w, DSGD_PS_MSG_PARAMS, seq, &h, sizeof h);
    }
    host = s->be.buffer_host_ptr(s->be.impl, s->agg[from - s->agg_base]);
    h = dsgd__ps_hdr(DSGD_PS_MSG_PARAMS, w, seq, s->version, s->n, 0, from);
    dsgd__ps_hdr_put(host, &h);
    r = dsgd__ps_send(s, w, DSGD_PS_MSG_PARAMS, seq, host, DSGD__PS_HBYTES + s->n * sizeof(float));
    if (r != DSGD_OK) return r;
    pe->have = from + 1;
    dsgd__ps_trim(s);
    return DSGD_OK;
}

/* ON_SERVERS: answers a pull with the server's parameters. */
static dsgd_result dsgd__ps_answer_params(dsgd_ps_server *s, int w, uint64_t seq) {
    dsgd_ps_header h = dsgd__ps_hdr(DSGD_PS_MSG_PARAMS, w, seq, s->version, s->n, 0, 0);
    dsgd__ps_hdr_put(s->params_h, &h);
    return dsgd__ps_send(s, w, DSGD_PS_MSG_PARAMS, seq, s->params_h, DSGD__PS_HBYTES + s->n * sizeof(float));
}

/* What the apply placement makes a server do when a clock is complete
   (its mean in grad) and when it answers a pull; in the order of
   dsgd_ps_apply (ps.h's table says what each placement is). */
typedef struct dsgd__ps_server_acts {
    dsgd_result (*close_clock)(dsgd_ps_server *s);
    dsgd_result (*answer)(dsgd_ps_server *s, int w, uint64_t seq);
} dsgd__ps_server_acts;

static const dsgd__ps_server_acts dsgd__ps_server_act[DSGD_PS_APPLY_COUNT] = {
    {dsgd__ps_apply, dsgd__ps_answer_params}, {dsgd__ps_publish, dsgd__ps_answer_sum}};

static dsgd_result dsgd__ps_answer_pull(dsgd_ps_server *s, int w) {
    dsgd__ps_peer *pe = &s->peer[w];
    pe->pull_pending = 0;
    s->pulls++;
    return dsgd__ps_server_act[s->d.apply].answer(s, w, pe->pull_next - 1);
}

/* After the version moved: answers the deferred pulls it satisfies, in
   worker order. */
static dsgd_result dsgd__ps_release_pulls(dsgd_ps_server *s) {
    dsgd_result r;
    int w;
    for (w = 0; w < s->W; ++w)
        if (s->peer[w].pull_pending && s->version >= s->peer[w].pull_min)
            if ((r = dsgd__ps_answer_pull(s, w)) != DSGD_OK) return r;
    return DSGD_OK;
}

/* BACKUP with backup_cancel, once step `step` was applied: CANCEL to every
   unfinished worker whose push did not go into it and whose pull does not
   wait (it computes for that step, or will push a stale gradient). */
static dsgd_result dsgd__ps_cancel_late(dsgd_ps_server *s, int64_t step) {
    dsgd_result r;
    int w;
    for (w = 0; w < s->W; ++w) {
        dsgd__ps_peer *pe = &s->peer[w];
        dsgd_ps_header h;
        if (!pe->member || pe->done || pe->pull_pending || pe->accepted == step) continue;
        h = dsgd__ps_hdr(DSGD_PS_MSG_CANCEL, w, 0, s->version, 0, 0, 0);
        if ((r = dsgd__ps_send(s, w, DSGD_PS_MSG_CANCEL, 0, &h, sizeof h)) != DSGD_OK) return r;
        s->cancels++;
    }
    return DSGD_OK;
}

/* Clock modes: applies every complete clock, in order. The sum runs in
   worker rank order whatever the arrival order. */
static dsgd_result dsgd__ps_apply_clocks(dsgd_ps_server *s) {
    dsgd_result r;
    for (;;) {
        int k = (int)(s->version % s->ring), w, cnt = 0;
        int64_t step = s->version;
        float *sum = s->grad_h + DSGD__PS_H;
        if (s->slot_count[k] < dsgd__ps_needed_at(s, step)) return DSGD_OK;
        for (w = 0; w < s->W; ++w) {
            dsgd_buffer **b = &s->slot[(size_t)k * s->W + w];
            const float *g;
            if (!*b) continue;
            s->peer[w].accepted = step;
            s->peer[w].applied++;
            g = s->be.buffer_host_ptr(s->be.impl, *b) + DSGD__PS_H;
            if (cnt++ == 0) {
                if (s->n) memcpy(sum, g, s->n * sizeof(float));
            } else {
                dsgd__sum_into(sum, g, s->n);
            }
            dsgd__ps_staleness(s, s->version - s->vcomp[(size_t)k * s->W + w]);
            s->pool[s->pool_len++] = *b;
            *b = NULL;
        }
        dsgd__divide(sum, s->n, cnt);
        s->slot_count[k] = 0;
        s->applied += cnt;
        if ((r = dsgd__ps_server_act[s->d.apply].close_clock(s)) != DSGD_OK) return r;
        if (s->d.backup_cancel && (r = dsgd__ps_cancel_late(s, step)) != DSGD_OK) return r;
        if ((r = dsgd__ps_release_pulls(s)) != DSGD_OK) return r;
    }
}

/* Reads the header at buf and checks it against what the tag and size
   promised. */
static dsgd_result dsgd__ps_check_hdr(dsgd_ps_server *s, const void *buf, int w, dsgd_ps_msg type, uint64_t seq,
                                      size_t count, dsgd_ps_header *h) {
    *h = dsgd__ps_hdr_get(buf);
    if (h->type != (uint64_t)type || h->worker != (uint64_t)w || DSGD_PS_TAG_SEQ(h->seq) != seq ||
        h->count != (uint64_t)count)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "dsgd_ps_server_serve: server %d: worker %d sent a header (type %llu, worker %llu, seq "
                                  "%llu, count %llu) that does not match its tag and size", s->index, w,
                                  (unsigned long long)h->type, (unsigned long long)h->worker,
                                  (unsigned long long)h->seq, (unsigned long long)h->count);
    return DSGD_OK;
}

static dsgd_result dsgd__ps_on_push(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    dsgd__ps_peer *pe = &s->peer[w];
    uint64_t seq = DSGD_PS_TAG_SEQ(tag), status = 0;
    dsgd_ps_header h;
    size_t want = DSGD__PS_HBYTES + s->n * sizeof(float);
    dsgd_buffer *b;
    float *host;
    int64_t step, vcomp;
    dsgd_result r;
    if (bytes != want)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: push %llu of worker %d has %zu bytes, not %zu",
                                  fn, s->index, (unsigned long long)seq, w, bytes, want);
    if (!pe->member)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: push %llu of worker %d, which has not joined",
                                  fn, s->index, (unsigned long long)seq, w);
    if (seq > pe->next_seq)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: push %llu of worker %d, but push %llu is next",
                                  fn, s->index, (unsigned long long)seq, w, (unsigned long long)pe->next_seq);
    /* the buffer to receive into: grad for duplicates and pushes applied on
       arrival, a pooled one for a clock's gradient */
    if (seq < pe->next_seq || !s->pol->clocked) {
        b = s->grad;
    } else {
        if (s->pool_len == 0) {
            if ((r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->pool[s->pool_len])) != DSGD_OK) return r;
            s->pool_len++;
        }
        b = s->pool[--s->pool_len];
    }
    host = s->be.buffer_host_ptr(s->be.impl, b);
    r = s->t.recv(s->t.impl, s->P + w, tag, host, bytes, dsgd__ps_now(&s->t) + s->d.timeout_s);
    if (r != DSGD_OK) {
        if (b != s->grad) s->pool[s->pool_len++] = b;
        return dsgd_ctx_set_error(s->ctx, r, "%s: server %d: receiving push %llu of worker %d failed: %s%s%s", fn,
                                  s->index, (unsigned long long)seq, w, dsgd_result_string(r),
                                  dsgd__ps_terr_sep(&s->t), dsgd__ps_terr(&s->t));
    }
    if ((r = dsgd__ps_check_hdr(s, host, w, DSGD_PS_MSG_PUSH, seq, s->n, &h)) != DSGD_OK) {
        if (b != s->grad) s->pool[s->pool_len++] = b;
        return r;
    }
    if (seq < pe->next_seq) { /* a duplicate: acknowledged again, not applied */
        s->duplicates++;
        return dsgd__ps_ack(s, w, seq, pe->last_status);
    }
    s->received++;
    pe->next_seq++;
    vcomp = h.version;
    if (!s->pol->clocked) {
        dsgd__ps_staleness(s, s->version - vcomp);
        s->applied++;
        pe->applied++;
        if ((r = dsgd__ps_apply(s)) != DSGD_OK) return r;
        pe->last_status = 0;
        if ((r = dsgd__ps_ack(s, w, seq, 0)) != DSGD_OK) return r;
        return dsgd__ps_release_pulls(s);
    }
    /* clocked: the push's clock (its seq from the clock it joined at, or
       its tag), its slot */
    step = s->pol->step_of((uint64_t)pe->base + seq, vcomp);
    if (s->pol->drops_stale && step < s->version) {
        status = DSGD_PS_DROPPED;
        s->dropped++;
        s->pool[s->pool_len++] = b;
    } else if (step < s->version || step > s->version + (s->ring - 1) ||
               s->slot[(size_t)(step % s->ring) * s->W + w]) {
        s->pool[s->pool_len++] = b;
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "%s: server %d: push %llu of worker %d is for clock %lld, outside [%lld, %lld] or twice",
                                  fn, s->index, (unsigned long long)seq, w, (long long)step, (long long)s->version,
                                  (long long)(s->version + s->ring - 1));
    } else {
        size_t i = (size_t)(step % s->ring) * s->W + w;
        s->slot[i] = b;
        s->vcomp[i] = vcomp;
        s->slot_count[step % s->ring]++;
    }
    pe->last_status = status;
    if ((r = dsgd__ps_ack(s, w, seq, status)) != DSGD_OK) return r;
    return status ? DSGD_OK : dsgd__ps_apply_clocks(s);
}

/* Clocked policies: fails when a deferred pull can never be answered
   because the clock the server must apply next cannot complete: it has
   fewer gradients than it needs plus workers still able to push one (not
   finished, not waiting here, not already in this clock). Called when a
   worker finishes and when a pull is deferred; exact, so a run that can
   go on is never stopped. */
static dsgd_result dsgd__ps_check_stuck(dsgd_ps_server *s) {
    static const char *const fn = "dsgd_ps_server_serve";
    int k, w, waiter = -1, missing = -1, can = 0, members = 0, needed;
    if (!s->pol->clocked) return DSGD_OK;
    k = (int)(s->version % s->ring);
    /* a late worker that has not joined changes nothing: joining adds one
       to the gradients needed and one to the workers able to push */
    for (w = 0; w < s->W; ++w) {
        const dsgd__ps_peer *pe = &s->peer[w];
        int in_step = s->slot[(size_t)k * s->W + w] != NULL;
        if (!pe->member || pe->base > s->version) continue;
        members++;
        if (pe->pull_pending && waiter < 0) waiter = w;
        if (pe->done && !in_step && missing < 0) missing = w;
        if (!pe->done && !pe->pull_pending && !in_step) can++;
    }
    needed = s->pol->needed(&s->d, members);
    if (waiter < 0 || s->slot_count[k] + can >= needed) return DSGD_OK;
    if (missing >= 0 && needed == members)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "%s: server %d: worker %d waits for version %lld, which can never come: clock %lld needs "
                                  "a push of worker %d, which finished after %llu pushes (%s)", fn, s->index, waiter,
                                  (long long)s->peer[waiter].pull_min, (long long)s->version, missing,
                                  (unsigned long long)s->peer[missing].next_seq, s->pol->stuck_hint);
    return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                              "%s: server %d: worker %d waits for version %lld, which can never come: clock %lld has %d "
                              "of %d gradients and %d worker%s can still push (the others finished or wait); %s", fn,
                              s->index, waiter, (long long)s->peer[waiter].pull_min, (long long)s->version,
                              s->slot_count[k], needed, can, can == 1 ? "" : "s", s->pol->stuck_hint);
}

/* Takes worker w's message of a header alone (a PULL or a DONE, `what`)
   and checks it against its tag and size. */
static dsgd_result dsgd__ps_take_hdr(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes, dsgd_ps_msg type,
                                     const char *what, dsgd_ps_header *h) {
    unsigned char buf[DSGD__PS_HBYTES];
    dsgd_result r;
    if (bytes != DSGD__PS_HBYTES)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "dsgd_ps_server_serve: server %d: %s of worker %d has %zu bytes, not %zu", s->index,
                                  what, w, bytes, (size_t)DSGD__PS_HBYTES);
    r = s->t.recv(s->t.impl, s->P + w, tag, buf, sizeof buf, dsgd__ps_now(&s->t) + s->d.timeout_s);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "dsgd_ps_server_serve: server %d: receiving %s of worker %d failed: %s%s%s",
                                  s->index, what, w, dsgd_result_string(r), dsgd__ps_terr_sep(&s->t),
                                  dsgd__ps_terr(&s->t));
    return dsgd__ps_check_hdr(s, buf, w, type, DSGD_PS_TAG_SEQ(tag), 0, h);
}

static dsgd_result dsgd__ps_on_pull(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    dsgd__ps_peer *pe = &s->peer[w];
    uint64_t seq = DSGD_PS_TAG_SEQ(tag);
    dsgd_ps_header h;
    dsgd_result r;
    if ((r = dsgd__ps_take_hdr(s, w, tag, bytes, DSGD_PS_MSG_PULL, "a pull", &h)) != DSGD_OK) return r;
    if (!pe->member)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: pull %llu of worker %d, which has not joined",
                                  fn, s->index, (unsigned long long)seq, w);
    if (seq < pe->pull_next) { /* a resend: the deferred pull stays, an answered one is not answered again */
        s->repeated++;
        return DSGD_OK;
    }
    if (seq > pe->pull_next)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: pull %llu of worker %d, but pull %llu is next",
                                  fn, s->index, (unsigned long long)seq, w, (unsigned long long)pe->pull_next);
    if (!s->holds && h.step != pe->have)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "%s: server %d: pull %llu of worker %d wants the mean of step %lld, but it has fetched "
                                  "%lld", fn, s->index, (unsigned long long)seq, w, (long long)h.step,
                                  (long long)pe->have);
    pe->pull_next = seq + 1;
    pe->pull_min = h.version;
    pe->pull_from = h.step;
    if (s->version >= pe->pull_min) return dsgd__ps_answer_pull(s, w);
    pe->pull_pending = 1;
    s->deferred++;
    return dsgd__ps_check_stuck(s);
}

static dsgd_result dsgd__ps_on_done(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    uint64_t seq = DSGD_PS_TAG_SEQ(tag);
    dsgd_ps_header h;
    dsgd_result r;
    if ((r = dsgd__ps_take_hdr(s, w, tag, bytes, DSGD_PS_MSG_DONE, "the DONE", &h)) != DSGD_OK) return r;
    if (seq != s->peer[w].next_seq)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: worker %d finished after %llu pushes, %llu arrived",
                                  fn, s->index, w, (unsigned long long)seq, (unsigned long long)s->peer[w].next_seq);
    if (!s->peer[w].done) {
        s->peer[w].done = 1;
        s->done_count++;
        if (!s->holds) dsgd__ps_trim(s);
    }
    return dsgd__ps_check_stuck(s);
}

/* Whether serve waits for worker w now, and times it out: an unfinished
   member, or a late worker that never joined once no member is left. */
static int dsgd__ps_awaited(const dsgd_ps_server *s, int w) {
    return !s->peer[w].done && (s->peer[w].member || s->late_wait);
}

/* A late worker's JOIN (MEMBERSHIP in ps.h): round 0 (prepare) makes it
   a member counted from the server's version, round 1 (commit) moves that
   to the clock it joins at on every server. A resent round is answered
   again, an older one dropped. */
static dsgd_result dsgd__ps_on_join(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    dsgd__ps_peer *pe = &s->peer[w];
    uint64_t seq = DSGD_PS_TAG_SEQ(tag), status = 0;
    int committing = 0;
    dsgd_ps_header h;
    dsgd_result r;
    if ((r = dsgd__ps_take_hdr(s, w, tag, bytes, DSGD_PS_MSG_JOIN, "a JOIN", &h)) != DSGD_OK) return r;
    if (w < s->d.initial_workers || seq > 1 || pe->done)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: worker %d sent JOIN round %llu, but %s", fn,
                                  s->index, w, (unsigned long long)seq,
                                  w < s->d.initial_workers ? "it is a member from the start (initial_workers)"
                                  : pe->done ? "it has finished" : "a join has rounds 0 and 1");
    if (seq < pe->join_round) return DSGD_OK; /* a resent prepare after the commit */
    if (seq == 0) {
        if (!pe->member) { /* counted from now: no clock from here on goes without it */
            pe->member = 1;
            pe->base = s->version;
        }
    } else {
        if (!pe->member || h.version < pe->base || (pe->committed && h.version != pe->base))
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                      "%s: server %d: worker %d commits its join at clock %lld, but %s %lld", fn,
                                      s->index, w, (long long)h.version,
                                      !pe->member ? "it never prepared; version" : pe->committed
                                                                                   ? "it committed at"
                                                                                   : "this server counts it from",
                                      (long long)(pe->member ? pe->base : s->version));
        committing = !pe->committed;
        pe->committed = 1;
        pe->base = h.version;
        status = DSGD_PS_ADMITTED;
    }
    pe->join_round = seq;
    h = dsgd__ps_hdr(DSGD_PS_MSG_JOINED, w, seq, s->version, 0, status, pe->base);
    if ((r = dsgd__ps_send(s, w, DSGD_PS_MSG_JOINED, seq, &h, sizeof h)) != DSGD_OK) return r;
    if (!committing) return DSGD_OK;
    s->joins++;
    /* the clocks before its own may now complete without it */
    if (s->pol->clocked && (r = dsgd__ps_apply_clocks(s)) != DSGD_OK) return r;
    return dsgd__ps_check_stuck(s);
}

DSGD_API dsgd_result dsgd_ps_server_serve(dsgd_ps_server *s) {
    static const char *const fn = "dsgd_ps_server_serve";
    dsgd_result r = DSGD_OK;
    double start;
    int w;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (s->state != DSGD__PS_CREATED)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE, "%s: server %d: already served%s", fn, s->index,
                                  s->state == DSGD__PS_FAILED ? " and failed" : "");
    start = dsgd__ps_now(&s->t);
    for (w = 0; w < s->W; ++w) s->peer[w].last_heard = start;
    while (s->done_count < s->W) {
        double deadline = 0.0, now;
        int src = -1, first = 1, type, left = 0;
        uint64_t tag = 0;
        size_t bytes = 0;
        /* members are timed out; late workers that never joined only once
           every member has finished, timeout_s from then */
        for (w = 0; w < s->W; ++w) left += s->peer[w].member && !s->peer[w].done;
        if (!left && !s->late_wait) {
            double t0 = dsgd__ps_now(&s->t);
            s->late_wait = 1;
            for (w = 0; w < s->W; ++w)
                if (!s->peer[w].member) s->peer[w].last_heard = t0;
        }
        for (w = 0; w < s->W; ++w)
            if (dsgd__ps_awaited(s, w) && (first || s->peer[w].last_heard + s->d.timeout_s < deadline)) {
                deadline = s->peer[w].last_heard + s->d.timeout_s;
                first = 0;
            }
        r = s->t.probe(s->t.impl, deadline, &src, &tag, &bytes);
        now = dsgd__ps_now(&s->t);
        if (r == DSGD_ERR_TIMEOUT) {
            char names[256];
            size_t used = 0;
            int late = 0;
            names[0] = '\0';
            for (w = 0; w < s->W; ++w)
                if (dsgd__ps_awaited(s, w) && now >= s->peer[w].last_heard + s->d.timeout_s) {
                    int k = snprintf(names + used, sizeof names - used, "%s%d (rank %d%s)", late ? ", " : "", w, s->P + w,
                                     s->peer[w].member ? "" : ", a late worker that never joined");
                    if (k > 0) used = DSGD__MIN(sizeof names - 1, used + (size_t)k);
                    late++;
                }
            if (!late) continue;
            r = dsgd_ctx_set_error(s->ctx, DSGD_ERR_TIMEOUT, "%s: server %d: no message from worker%s %s within %g s", fn,
                                   s->index, late > 1 ? "s" : "", names, s->d.timeout_s);
            break;
        }
        if (r != DSGD_OK) {
            r = dsgd_ctx_set_error(s->ctx, r, "%s: server %d: waiting for a message failed: %s%s%s", fn, s->index,
                                   dsgd_result_string(r), dsgd__ps_terr_sep(&s->t), dsgd__ps_terr(&s->t));
            break;
        }
        if (src < s->P || src >= s->P + s->W) {
            r = dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: a message from rank %d, which is not a worker",
                                   fn, s->index, src);
            break;
        }
        w = src - s->P;
        s->peer[w].last_heard = now;
        type = DSGD_PS_TAG_TYPE(tag);
        if (type == DSGD_PS_MSG_PUSH) {
            r = dsgd__ps_on_push(s, w, tag, bytes);
        } else if (type == DSGD_PS_MSG_PULL) {
            r = dsgd__ps_on_pull(s, w, tag, bytes);
        } else if (type == DSGD_PS_MSG_DONE) {
            r = dsgd__ps_on_done(s, w, tag, bytes);
        } else if (type == DSGD_PS_MSG_JOIN) {
            r = dsgd__ps_on_join(s, w, tag, bytes);
        } else {
            r = dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: worker %d sent a message of type %d", fn,
                                   s->index, w, type);
        }
        if (r != DSGD_OK) break;
    }
    if (r != DSGD_OK) return dsgd__ps_server_fail(s, r);
    s->state = DSGD__PS_DONE;
    return DSGD_OK;
}

DSGD_API void dsgd_ps_server_destroy(dsgd_ps_server *s) {
    size_t i;
    if (!s) return;
    if (s->have_be) {
        dsgd_buffer *own[2];
        int k;
        own[0] = s->params;
        own[1] = s->grad;
        for (k = 0; k < 2; ++k)
            if (own[k]) s->be.buffer_destroy(s->be.impl, own[k]);
        if (s->opt.be) dsgd__opt_state_free(&s->opt);
        if (s->slot)
            for (i = 0; i < (size_t)s->ring * (size_t)s->W; ++i)
                if (s->slot[i]) s->be.buffer_destroy(s->be.impl, s->slot[i]);
        if (s->pool)
            for (k = 0; k < s->pool_len; ++k) s->be.buffer_destroy(s->be.impl, s->pool[k]);
        for (i = 0; i < s->agg_len; ++i) s->be.buffer_destroy(s->be.impl, s->agg[i]);
        if (s->agg_spare) s->be.buffer_destroy(s->be.impl, s->agg_spare);
        if (s->be.destroy) s->be.destroy(s->be.impl);
    }
    DSGD_FREE(s->slot);
    DSGD_FREE(s->pool);
    DSGD_FREE(s->agg);
    DSGD_FREE(s->vcomp);
    DSGD_FREE(s->slot_count);
    DSGD_FREE(s->peer);
    DSGD_FREE(s->hist);
    DSGD_FREE(s);
}

DSGD_API dsgd_result dsgd_ps_server_create(dsgd_ctx *ctx, const dsgd_transport_i *t, const dsgd_ps_desc *desc,
                                           const dsgd_shard_map *map, const float *initial_full_params,
                                           dsgd_ps_server **out) {
    static const char *const fn = "dsgd_ps_server_create";
    dsgd_ps_server *s;
    dsgd_ps_desc d;
    dsgd_result r;
    size_t slots = 0;
    int i;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if ((r = dsgd__ps_setup(ctx, t, desc, map, fn, &d)) != DSGD_OK) return r;
    if (t->rank < 0 || t->rank >= d.num_servers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: rank %d is not a server (servers are ranks 0..%d)",
                                  fn, t->rank, d.num_servers - 1);
    if (!initial_full_params && dsgd__ps_apply_of(&d)->servers_hold)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: initial_full_params is NULL", fn);
    s = (dsgd_ps_server *)dsgd__alloc(ctx, sizeof *s, fn);
    if (!s) return DSGD_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    s->t = *t;
    s->d = d;
    s->map = map;
    s->index = t->rank;
    s->P = d.num_servers;
    s->W = d.num_workers;
    s->n = dsgd_shard_map_server_floats(map, s->index);
    s->pol = dsgd__ps_policy(&d);
    s->ring = s->pol->ring(&d);
    s->holds = dsgd__ps_apply_of(&d)->servers_hold;
    r = DSGD_OK;
    if (s->n > (SIZE_MAX / sizeof(float)) - DSGD__PS_H - 1)
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: %zu floats overflow size_t", fn, s->n);
    if (r == DSGD_OK && (r = dsgd_cpu_backend_create(ctx, &s->be)) == DSGD_OK) s->have_be = 1;
    /* ON_WORKERS: no parameters, no slots */
    if (r == DSGD_OK && s->holds) r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->params);
    if (r == DSGD_OK) r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->grad);
    if (r == DSGD_OK && s->holds) r = dsgd__opt_state_init(&s->opt, &s->be, &s->d.optimizer, s->n);
    if (r == DSGD_OK && s->pol->clocked) {
        if (dsgd__mul_overflows((size_t)s->ring, (size_t)s->W, &slots) || slots > SIZE_MAX / sizeof(int64_t) - 1) {
            dsgd_ps_server_destroy(s);
            return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: %d clocks of %d workers overflow size_t", fn,
                                      s->ring, s->W);
        }
        s->slot = (dsgd_buffer **)dsgd__alloc(ctx, slots * sizeof *s->slot, fn);
        /* every buffer is in a slot, in the pool, or receiving: slots + 1 */
        s->pool = (dsgd_buffer **)dsgd__alloc(ctx, (slots + 1) * sizeof *s->pool, fn);
        s->vcomp = (int64_t *)dsgd__alloc(ctx, slots * sizeof *s->vcomp, fn);
        s->slot_count = (int *)dsgd__alloc(ctx, (size_t)s->ring * sizeof *s->slot_count, fn);
        if (!s->slot || !s->pool || !s->vcomp || !s->slot_count) {
            r = DSGD_ERR_OUT_OF_MEMORY;
        } else {
            memset(s->slot, 0, slots * sizeof *s->slot);
            memset(s->slot_count, 0, (size_t)s->ring * sizeof *s->slot_count);
        }
    }
    if (r == DSGD_OK) {
        s->peer = (dsgd__ps_peer *)dsgd__alloc(ctx, (size_t)s->W * sizeof *s->peer, fn);
        s->hist = (int64_t *)dsgd__alloc(ctx, (size_t)d.staleness_bins * sizeof *s->hist, fn);
        if (!s->peer || !s->hist) r = DSGD_ERR_OUT_OF_MEMORY;
    }
    if (r != DSGD_OK) {
        dsgd_ps_server_destroy(s);
        return r;
    }
    memset(s->peer, 0, (size_t)s->W * sizeof *s->peer);
    for (i = 0; i < s->W; ++i) {
        s->peer[i].accepted = -1;
        s->peer[i].member = i < d.initial_workers;
        s->peer[i].base = s->peer[i].member ? 0 : -1;
    }
    memset(s->hist, 0, (size_t)d.staleness_bins * sizeof *s->hist);
    s->params_h = s->params ? s->be.buffer_host_ptr(s->be.impl, s->params) : NULL;
    s->grad_h = s->be.buffer_host_ptr(s->be.impl, s->grad);
    /* the server's shards, concatenated in placement order; slots start at 0 */
    if (s->params_h) dsgd__ps_gather(map, s->index, initial_full_params, s->params_h + DSGD__PS_H);
    *out = s;
    return DSGD_OK;
}

DSGD_API void dsgd_ps_server_get_stats(const dsgd_ps_server *s, dsgd_ps_server_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!s) return;
    out->version = s->version;
    out->pushes_received = s->received;
    out->pushes_applied = s->applied;
    out->duplicates = s->duplicates;
    out->stale_dropped = s->dropped;
    out->pulls_answered = s->pulls;
    out->pulls_deferred = s->deferred;
    out->pulls_repeated = s->repeated;
    out->cancels_sent = s->cancels;
    out->joins = s->joins;
    out->staleness_mean = s->applied ? s->stal_sum / (double)s->applied : 0.0;
    out->staleness_max = s->stal_max;
    out->staleness_bins = s->d.staleness_bins;
    out->staleness_hist = s->hist;
}

DSGD_API dsgd_result dsgd_ps_server_get_peer_stats(const dsgd_ps_server *s, int worker, dsgd_ps_peer_stats *out) {
    const dsgd__ps_peer *pe;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (out) memset(out, 0, sizeof *out);
    if (!out || worker < 0 || worker >= s->W)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_ps_server_get_peer_stats: server %d: %s (worker %d of %d)", s->index,
                                  out ? "no such worker" : "out is NULL", worker, s->W);
    pe = &s->peer[worker];
    out->member = pe->member;
    out->joined_at = pe->member ? pe->base : -1;
    out->pushes = (int64_t)pe->next_seq;
    out->applied = pe->applied;
    out->finished = pe->done;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_server_read_params(const dsgd_ps_server *s, float *full) {
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_ps_server_read_params: full is NULL");
    if (!s->holds)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_UNSUPPORTED,
                                  "dsgd_ps_server_read_params: server %d sums only (apply %s) and holds no "
                                  "parameters; read a worker's (dsgd_ps_worker_read_params)", s->index,
                                  dsgd_ps_apply_name(s->d.apply));
    dsgd__ps_scatter(s->map, s->index, s->params_h + DSGD__PS_H, full);
    return DSGD_OK;
}

/* ---- checkpoints */

static int dsgd__ps_server_slots(const dsgd_ps_server *s) { return s->holds ? dsgd__opt_state_slots(&s->opt) : 0; }

/* The server's parameters (k = 0) or its optimizer's slot k - 1 into
   their ranges of full, outside serve; DSGD_ERR_UNSUPPORTED when it holds
   none (ON_WORKERS, or no such slot). A parameter-server strategy reads
   them into the file of its checkpoint. */
static dsgd_result dsgd__ps_server_read_state(const dsgd_ps_server *s, int k, float *full) {
    float *packed;
    dsgd_result r;
    if (!s->holds || k < 0 || k > dsgd__ps_server_slots(s)) return DSGD_ERR_UNSUPPORTED;
    if (!(packed = (float *)dsgd__alloc(s->ctx, sizeof(float) * (s->n ? s->n : 1), "reading a server's state")))
        return DSGD_ERR_OUT_OF_MEMORY;
    r = s->n ? s->be.read(s->be.impl, k == 0 ? dsgd__ref(s->params, DSGD__PS_H) : dsgd__ref(s->opt.slot[k - 1], 0),
                          packed, s->n)
             : DSGD_OK;
    if (r == DSGD_OK) dsgd__ps_scatter(s->map, s->index, packed, full);
    DSGD_FREE(packed);
    return r;
}

/* What the server's checkpoint must match (ps_checkpoint.h). */
static dsgd__ps_server_shape dsgd__ps_server_shape_of(const dsgd_ps_server *s) {
    dsgd__ps_server_shape sh;
    sh.d = &s->d;
    sh.map = s->map;
    sh.index = s->index;
    sh.ring = s->ring;
    sh.W = s->W;
    sh.nslots = dsgd__ps_server_slots(s);
    sh.holds = s->holds;
    sh.n = s->n;
    sh.cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0;
    return sh;
}

/* A checkpoint does not hold the membership (MEMBERSHIP in ps.h). */
static dsgd_result dsgd__ps_server_no_late_ck(dsgd_ps_server *s, const char *what) {
    return dsgd_ctx_set_error(s->ctx, DSGD_ERR_UNSUPPORTED,
                              "%s: a run with late workers (initial_workers %d < %d) cannot be saved or restored: "
                              "a checkpoint does not hold who joined at which clock", what, s->d.initial_workers, s->W);
}

DSGD_API dsgd_result dsgd_ps_server_save(dsgd_ps_server *s, const char *path) {
    char what[64];
    dsgd__ck_writer w;
    dsgd__ps_ident id;
    dsgd_buffer *slot[2];
    size_t i, cells, held = 0;
    int k, nslots;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof what, "dsgd_ps_server_save: server %d", s->index);
    if (dsgd__ck_check_args(s->ctx, what, path, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    if (s->state == DSGD__PS_FAILED)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE,
                                  "%s: serve failed, so its state may be half-updated (save before serve or after it "
                                  "returned DSGD_OK)", what);
    if (s->d.initial_workers < s->W) return dsgd__ps_server_no_late_ck(s, what);
    for (k = 0; k < s->W && !s->holds; ++k)
        if (s->peer[k].have < s->agg_base)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE,
                                      "%s: worker %d finished having fetched the means of %lld steps, and the server "
                                      "no longer keeps step %lld's, which the others fetched after it (let every "
                                      "worker pull after its last push, or none)", what, k,
                                      (long long)s->peer[k].have, (long long)s->peer[k].have);
    cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0;
    for (i = 0; i < cells; ++i) held += s->slot[i] != NULL;
    nslots = dsgd__ps_server_slots(s);
    slot[0] = s->opt.slot[0];
    slot[1] = s->opt.slot[1];
    id = dsgd__ps_ident_of(&s->d, s->index);
    dsgd__ckw_init(&w, s->ctx, what, dsgd__ps_ck_expect(s->n, 1 + (size_t)nslots + held + s->agg_len));
    dsgd__ckw_begin(&w, "ps_server");
    dsgd__ps_put_ident(&w, &id);
    dsgd__ckw_u32(&w, (uint32_t)s->d.staleness_bins);
    dsgd__ckw_u64(&w, (uint64_t)s->n);
    dsgd__ckw_u64(&w, (uint64_t)s->version);
    dsgd__ckw_u64(&w, (uint64_t)s->received);
    dsgd__ckw_u64(&w, (uint64_t)s->applied);
    dsgd__ckw_u64(&w, (uint64_t)s->duplicates);
    dsgd__ckw_u64(&w, (uint64_t)s->dropped);
    dsgd__ckw_u64(&w, (uint64_t)s->pulls);
    dsgd__ckw_u64(&w, (uint64_t)s->deferred);
    dsgd__ckw_u64(&w, (uint64_t)s->repeated);
    dsgd__ckw_u64(&w, (uint64_t)s->stal_max);
    dsgd__ckw_f64(&w, s->stal_sum);
    for (k = 0; k < s->d.staleness_bins; ++k) dsgd__ckw_u64(&w, (uint64_t)s->hist[k]);
    dsgd__ckw_end(&w);
    dsgd__ps_put_map(&w, s->map);
    dsgd__ckw_begin(&w, "ps_peers");
    dsgd__ckw_u32(&w, (uint32_t)s->W);
    for (k = 0; k < s->W; ++k) {
        const dsgd__ps_peer *pe = &s->peer[k];
        dsgd__ckw_u64(&w, pe->next_seq);
        dsgd__ckw_u64(&w, pe->last_status);
        dsgd__ckw_u64(&w, pe->pull_next);
        dsgd__ckw_u64(&w, (uint64_t)pe->pull_min);
        dsgd__ckw_u64(&w, (uint64_t)pe->pull_from);
        dsgd__ckw_u64(&w, (uint64_t)pe->have);
    }
    dsgd__ckw_end(&w);
    dsgd__ckw_begin(&w, "ps_clocks");
    dsgd__ckw_u32(&w, (uint32_t)held);
    for (i = 0; i < cells; ++i) {
        if (!s->slot[i]) continue;
        dsgd__ckw_u32(&w, (uint32_t)(i / (size_t)s->W)); /* the ring's row: clock % ring */
        dsgd__ckw_u32(&w, (uint32_t)(i % (size_t)s->W));
        dsgd__ckw_u64(&w, (uint64_t)s->vcomp[i]);
        dsgd__ckw_read(&w, &s->be, dsgd__ref(s->slot[i], DSGD__PS_H), s->n);
    }
    dsgd__ckw_end(&w);
    if (!s->holds) {
        dsgd__ckw_begin(&w, "ps_means"); /* the means kept: steps agg_base.. in order */
        dsgd__ckw_u32(&w, (uint32_t)s->agg_len);
        for (i = 0; i < s->agg_len; ++i) {
            dsgd__ckw_u64(&w, (uint64_t)s->agg_base + i);
            dsgd__ckw_read(&w, &s->be, dsgd__ref(s->agg[i], DSGD__PS_H), s->n);
        }
        dsgd__ckw_end(&w);
    } else {
        dsgd__ckw_begin(&w, "params");
        dsgd__ckw_read(&w, &s->be, dsgd__ref(s->params, DSGD__PS_H), s->n);
        dsgd__ckw_end(&w);
        dsgd__ckw_begin(&w, "optimizer"); /* checkpoint.h's layout; the step is the version */
        dsgd__ckw_u32(&w, (uint32_t)s->d.optimizer.kind);
        dsgd__ckw_u64(&w, (uint64_t)s->version);
        dsgd__ckw_f64(&w, 0.0);
        dsgd__ckw_u32(&w, (uint32_t)nslots);
        dsgd__ckw_u64(&w, (uint64_t)s->n);
        for (k = 0; k < nslots; ++k) dsgd__ckw_read(&w, &s->be, dsgd__ref(slot[k], 0), s->n);
        dsgd__ckw_end(&w);
    }
    return dsgd__ckw_commit(&w, path);
}

/* Writes the checked state into s; nothing here fails. */
static void dsgd__ps_server_apply_ck(dsgd_ps_server *s, const dsgd__ps_ck_server *st) {
    size_t i, cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0;
    dsgd__ck_cur c;
    int k;
    s->version = st->version;
    s->received = st->cnt[0];
    s->applied = st->cnt[1];
    s->duplicates = st->cnt[2];
    s->dropped = st->cnt[3];
    s->pulls = st->cnt[4];
    s->deferred = st->cnt[5];
    s->repeated = st->cnt[6];
    s->stal_max = st->cnt[7];
    s->stal_sum = st->stal_sum;
    for (k = 0; k < s->d.staleness_bins; ++k) s->hist[k] = (int64_t)dsgd__ck_get64(st->hist + (size_t)k * 8);
    for (k = 0; k < s->W; ++k) { /* every worker is expected again */
        dsgd__ps_peer *pe = &s->peer[k];
        const unsigned char *p = st->peers + (size_t)k * DSGD__PS_CK_PEER;
        memset(pe, 0, sizeof *pe);
        pe->member = 1; /* a run with late workers has no checkpoints */
        pe->next_seq = dsgd__ck_get64(p);
        pe->last_status = dsgd__ck_get64(p + 8);
        pe->pull_next = dsgd__ck_get64(p + 16);
        pe->pull_min = (int64_t)dsgd__ck_get64(p + 24);
        pe->pull_from = (int64_t)dsgd__ck_get64(p + 32);
        pe->have = (int64_t)dsgd__ck_get64(p + 40);
    }
    s->done_count = 0;
    if (!s->holds) { /* the buffers of agg[0..nmeans) exist (dsgd__ps_ck_mean_buffers) */
        for (i = st->nmeans; i < s->agg_len; ++i) s->be.buffer_destroy(s->be.impl, s->agg[i]);
        s->agg_len = st->nmeans;
        s->agg_base = s->version - (int64_t)st->nmeans;
        for (i = 0; i < st->nmeans; ++i)
            dsgd__ck_copy_floats(s->be.buffer_host_ptr(s->be.impl, s->agg[i]) + DSGD__PS_H,
                                 st->means + i * (8 + s->n * sizeof(float)) + 8, s->n);
    }
    for (i = 0; i < cells; ++i)
        if (s->slot[i]) {
            s->pool[s->pool_len++] = s->slot[i];
            s->slot[i] = NULL;
        }
    for (k = 0; k < s->ring && cells; ++k) s->slot_count[k] = 0;
    if (st->held) {
        c = dsgd__ck_cursor(st->clocks);
        (void)dsgd__ckr_u32(&c);
        for (i = 0; i < st->held; ++i) {
            uint32_t row, worker;
            int64_t vcomp;
            const unsigned char *g;
            size_t at;
            dsgd_buffer *b;
            dsgd__ps_ck_clock(&c, s->n, &row, &worker, &vcomp, &g);
            at = (size_t)row * (size_t)s->W + worker;
            b = s->pool[--s->pool_len];
            dsgd__ck_copy_floats(s->be.buffer_host_ptr(s->be.impl, b) + DSGD__PS_H, g, s->n);
            s->slot[at] = b;
            s->vcomp[at] = vcomp;
            s->slot_count[row]++;
        }
    }
    if (s->holds) {
        dsgd_buffer *slot[2];
        slot[0] = s->opt.slot[0];
        slot[1] = s->opt.slot[1];
        dsgd__ck_copy_floats(s->params_h + DSGD__PS_H, st->params, s->n);
        for (k = 0; k < dsgd__ps_server_slots(s); ++k)
            dsgd__ck_copy_floats(s->be.buffer_host_ptr(s->be.impl, slot[k]),
                                 st->slots + (size_t)k * s->n * sizeof(float), s->n);
    }
}

/* ON_WORKERS: room in agg and buffers for count means, made before anything
   is written (those beyond agg_len are not means until then). */
static dsgd_result dsgd__ps_ck_mean_buffers(dsgd_ps_server *s, const char *what, size_t count) {
    size_t j;
    dsgd_result r;
    if (count > s->agg_cap) {
        dsgd_buffer **a = count > SIZE_MAX / sizeof *a ? NULL : (dsgd_buffer **)DSGD_REALLOC(s->agg, count * sizeof *a);
        if (!a) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: keeping %zu means", what, count);
        s->agg = a;
        s->agg_cap = count;
    }
    for (j = s->agg_len; j < count; ++j)
        if ((r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->agg[j])) != DSGD_OK) {
            while (j-- > s->agg_len) s->be.buffer_destroy(s->be.impl, s->agg[j]);
            return r;
        }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_server_restore(dsgd_ps_server *s, const char *path) {
    char what[64];
    dsgd__ps_ck_server st;
    dsgd__ps_server_shape shape;
    dsgd__ck_file f;
    dsgd_result r;
    size_t i, have, cells;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof what, "dsgd_ps_server_restore: server %d", s->index);
    if ((r = dsgd__ck_check_args(s->ctx, what, path, NULL)) != DSGD_OK) return r;
    if (s->state != DSGD__PS_CREATED)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE, "%s: restore into a server before serve (this one %s)", what,
                                  s->state == DSGD__PS_FAILED ? "failed" : "has served");
    if (s->d.initial_workers < s->W) return dsgd__ps_server_no_late_ck(s, what);
    memset(&st, 0, sizeof st);
    shape = dsgd__ps_server_shape_of(s);
    if ((r = dsgd__ck_open(&f, s->ctx, what, path)) == DSGD_OK) r = dsgd__ps_check_server(&f, &shape, &st);
    if (r == DSGD_OK) {
        /* the buffers of the held gradients first (into the pool, which
           holds every buffer not in a slot), so nothing fails after the
           first write */
        cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0;
        for (have = (size_t)s->pool_len, i = 0; i < cells; ++i) have += s->slot[i] != NULL;
        for (; have < st.held && r == DSGD_OK; ++have)
            if ((r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->pool[s->pool_len])) == DSGD_OK) s->pool_len++;
        if (r == DSGD_OK && !s->holds) r = dsgd__ps_ck_mean_buffers(s, what, st.nmeans);
        if (r == DSGD_OK) dsgd__ps_server_apply_ck(s, &st);
    }
    dsgd__ck_close(&f);
    return r;
}

#endif /* DSGD__PART_PS_SERVER_IMPL */
