/* distsgd/ps_worker.h - a parameter-server worker: pulls the parameters, pushes gradients, and its loop with the stop rule
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   See PARAMETER SERVERS in ps.h for the roles, the policies and the wire
   protocol, and CHECKPOINTS in ps_checkpoint.h for save and restore. A
   worker is one thread's: pull, compute a gradient, push, and at the end
   finish; dsgd_ps_worker_run is that loop with the policy's stop rule.

   THE LOOP

     dsgd_ps_worker_run is TF's worker loop, everything a worker does after
     dsgd_ps_worker_create (and dsgd_ps_worker_set_params or _restore):

       repeat:  pull                       into params (the whole buffer)
                after_pull(step, global)   optional: evaluate, log, stop
                the stop rule              the policy's (ps.h's table)
                grad(step, params, grads)  your gradient of the whole buffer
                                           (BACKUP with backup_cancel: when
                                           it called dsgd_ps_worker_compute_for
                                           and a CANCEL cut that short, the
                                           loop pulls again, without a push)
                push                       grads, each server its slice
                after_push(step)           optional
       then:    finish                     unless no_finish

     step is the worker's clock: its pushes so far (those before a restore
     too), so the number its next push gets; a late worker's counts from
     the clock it joined at (MEMBERSHIP in ps.h), so it stops at the same
     target as the others. The stop rule compares one
     count with the target, dsgd_ps_run_desc.steps:
       BACKUP            the global step (dsgd_ps_worker_global_step): every
                         worker stops at the same step, as TF's do, and
                         every server ends at version `steps`, whatever the
                         number of servers or backups
       ASYNC, SSP, SYNC  the worker's clock: each worker pushes `steps`
                         times in all (SSP and SYNC need every worker to
                         push as often, see UPDATE POLICIES in ps.h)
     dsgd_ps_policy_stops_on_global says which. The pull the rule stops at
     is followed by no push, so after_pull sees the parameters the worker
     ends with (SYNC: the final ones). A restored worker goes on to the
     same target. after_pull may stop the run early (*stop): under SSP and
     SYNC only when every worker stops at the same clock, under BACKUP
     only at a global step every worker stops at.
*/
#ifndef DSGD__PART_PS_WORKER_DECL
#define DSGD__PART_PS_WORKER_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* What a worker did (dsgd_ps_worker_get_stats). */
typedef struct dsgd_ps_worker_stats {
    int64_t clock;          /* pushes completed */
    int64_t pulls;          /* pulls completed */
    int64_t push_resends;   /* push messages sent again (to one server each) */
    int64_t pull_resends;   /* pull and JOIN messages sent again */
    int64_t pushes_dropped; /* (push, server) slices a BACKUP server dropped */
    int64_t stale_replies;  /* replies to older requests, ignored */
    int64_t gradients_cancelled; /* BACKUP with backup_cancel: computes a
                                    CANCEL cut short (dsgd_ps_worker_compute_for) */
    int64_t joined_at;      /* the clock it joined at: 0 for a member from
                               the start, -1 for a late worker not joined
                               yet (MEMBERSHIP in ps.h) */
} dsgd_ps_worker_stats;

/* Creates worker t->rank - P (P <= rank < P + W) of desc over endpoint t
   with map; both must outlive it.
   Errors (recorded on ctx): as dsgd_ps_server_create (t->rank must be a
   worker's), without initial_full_params.
   Thread safety: ctx's thread; the worker is then used by one thread at a
   time, the rank's. */
DSGD_API dsgd_result dsgd_ps_worker_create(dsgd_ctx *ctx, const dsgd_transport_i *t, const dsgd_ps_desc *desc,
                                           const dsgd_shard_map *map, dsgd_ps_worker **out);
/* Fetches every server's parameters into their ranges of full_params (the
   whole flat buffer; floats no shard holds are left as they are), waiting
   as the policy says (ASYNC: not at all; SSP at clock c: version >= c - s;
   SYNC and BACKUP: the last pushed step applied on every server). Records
   the version read from each server (dsgd_ps_worker_version) and so the
   global step (dsgd_ps_worker_global_step); a push computes on them.
   With apply ON_WORKERS the servers send means, not parameters: the pull
   fetches every mean the worker has not applied yet (one round per step
   behind), applies each with the desc's optimizer to the worker's own copy
   (dsgd_ps_worker_set_params first, DSGD_ERR_STATE otherwise), and fills
   full_params with that copy; the version is then the number of means
   applied. A late worker's first pull joins first (dsgd_ps_worker_join)
   and waits, under SSP, SYNC and BACKUP, for version >= the clock it
   joined at.
   Errors (recorded on the worker's ctx, "dsgd_ps_worker_pull: worker w:
   ..."): DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded; full_params
   NULL), DSGD_ERR_STATE (after finish or a failure), DSGD_ERR_TIMEOUT (the
   servers that did not answer within timeout_s are named), DSGD_ERR_DESYNC
   (a message from a non-server rank, or of the wrong size), transport
   errors. After a failure the worker is unusable.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_pull(dsgd_ps_worker *w, float *full_params);
/* A late worker (index >= initial_workers) joins the run: the two rounds
   of MEMBERSHIP in ps.h with every server, after which every server counts
   it from one clock b (dsgd_ps_worker_get_stats: joined_at), its clock is
   b + its pushes, and its next pull waits for version >= b on every server
   (clocked policies). Its first pull or push joins by itself; a member
   from the start, or a worker that joined, returns DSGD_OK at once.
   Errors: as dsgd_ps_worker_pull ("dsgd_ps_worker_join"; DSGD_ERR_TIMEOUT
   names the servers that did not answer, DSGD_ERR_DESYNC a server that
   answered out of protocol). After a failure the worker is unusable.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_join(dsgd_ps_worker *w);
/* Sends each server its slice of full_grads (the whole flat gradient) with
   (worker, push seq, the version computed on: BACKUP the global step)
   and waits until every server
   has acknowledged it, resending after retry_s; applied exactly once per
   server (or, BACKUP, dropped as stale: see
   dsgd_ps_worker_last_push_dropped). The clock then advances.
   Errors: as dsgd_ps_worker_pull ("dsgd_ps_worker_push"), and
   DSGD_ERR_STATE for a push without a pull since the last one under SSP,
   SYNC or BACKUP.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_push(dsgd_ps_worker *w, const float *full_grads);
/* Spends `seconds` of the transport's clock (simnet's virtual one; real
   time on the others) as the compute of the gradient the worker is about
   to push: a wait on the transport (probe with a deadline) that takes the
   messages coming in meanwhile. With BACKUP and backup_cancel, a CANCEL
   for a step newer than the one the worker pulled ends it early: the
   gradient is abandoned (*cancelled = 1), the next push is refused until
   a pull, which waits for that newer step on every server, and
   dsgd_ps_worker_run, when its gradient fn called this, skips the push
   and pulls again. Otherwise *cancelled = 0 (cancelled may be NULL) and
   the wait lasts `seconds`: TF's late worker finishes its stale gradient.
   Call it from the gradient fn, on simnet in place of
   dsgd_simnet_compute(hub, rank, attempt) with
   dsgd_simnet_compute_time(hub, rank, attempt), counting attempts, so
   that a restart draws a fresh time.
   Errors: DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded; seconds
   negative or not finite), DSGD_ERR_STATE (after finish or a failure),
   DSGD_ERR_DESYNC (a message from a non-server rank, or too large),
   transport errors (the worker is then unusable).
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_compute_for(dsgd_ps_worker *w, double seconds, int *cancelled);
/* Apply ON_WORKERS: sets the worker's own copy of the parameters (the
   whole flat buffer, the same on every worker; only the floats of shards
   are kept). Call it once, before the first pull.
   Errors: DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded; full_params
   NULL), DSGD_ERR_STATE (apply ON_SERVERS, or after the first pull).
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_set_params(dsgd_ps_worker *w, const float *full_params);
/* Apply ON_WORKERS: writes the worker's copy of the parameters into the
   ranges of full that shards hold (also after finish).
   Errors: DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded; full NULL),
   DSGD_ERR_STATE (apply ON_SERVERS: read the servers').
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_read_params(const dsgd_ps_worker *w, float *full);
/* Tells every server this worker is done (once; not acknowledged, see WIRE
   PROTOCOL). The worker can then only be read and destroyed. With apply
   ON_WORKERS it first fetches the means of every clock it pushed (SSP and
   SYNC: it waits for them; BACKUP: what the servers have), so every worker
   ends with the same copy and the servers keep every mean a checkpoint
   needs.
   Errors: DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded),
   DSGD_ERR_STATE (after finish or a failure), those of
   dsgd_ps_worker_pull (ON_WORKERS), transport errors.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_finish(dsgd_ps_worker *w);
/* Saves the worker's state to path, atomically (see CHECKPOINTS in
   ps_checkpoint.h and checkpoint.h): after dsgd_ps_worker_finish, or before the first pull
   (or push) since it was created or restored.
   Errors (recorded on the worker's ctx): DSGD_ERR_INVALID_ARGUMENT (w
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (a failed
   worker, or one between its first pull and finish: the servers, serving,
   cannot be saved with it), DSGD_ERR_UNSUPPORTED (late workers:
   initial_workers < W, see MEMBERSHIP in ps.h), DSGD_ERR_IO,
   DSGD_ERR_OUT_OF_MEMORY. path is then unchanged.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_save(dsgd_ps_worker *w, const char *path);
/* Restores what dsgd_ps_worker_save wrote into w, a worker created with the
   same desc and map and the same rank, before its first pull (ON_WORKERS:
   instead of dsgd_ps_worker_set_params). The worker is then unfinished
   and goes on from its saved sequence numbers and versions.
   Errors (recorded on the worker's ctx): DSGD_ERR_INVALID_ARGUMENT (w
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (w pulled,
   pushed, finished or failed), DSGD_ERR_UNSUPPORTED (late workers),
   DSGD_ERR_IO, DSGD_ERR_FORMAT (a damaged file), DSGD_ERR_SHAPE (a server's checkpoint, another worker's, or one
   of another desc, optimizer kind or shard map: the message names the
   difference); after any of these w is untouched.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_restore(dsgd_ps_worker *w, const char *path);
/* Fills *out with the worker's counters (zeros for w or out NULL).
   Errors: none. Thread safety: the worker's thread. */
DSGD_API void dsgd_ps_worker_get_stats(const dsgd_ps_worker *w, dsgd_ps_worker_stats *out);
/* dsgd_ps_worker_version: the version read from server `server` at the
   last pull (0 before any; -1 for w NULL or server out of range).
   dsgd_ps_worker_global_step: the least of them, the step every server
   had applied at the last pull (TF's global step: BACKUP workers stop on
   it, see UPDATE POLICIES in ps.h; -1 for w NULL).
   dsgd_ps_worker_last_push_dropped: 1 when that server dropped the last
   push as stale (BACKUP), 0 otherwise.
   dsgd_ps_worker_failed: 1 once a call of the worker failed (it is then
   unusable, see dsgd_ps_worker_pull), 0 otherwise and for w NULL.
   Errors: none. Thread safety: the worker's thread. */
DSGD_API int64_t dsgd_ps_worker_version(const dsgd_ps_worker *w, int server);
DSGD_API int64_t dsgd_ps_worker_global_step(const dsgd_ps_worker *w);
DSGD_API int dsgd_ps_worker_last_push_dropped(const dsgd_ps_worker *w, int server);
DSGD_API int dsgd_ps_worker_failed(const dsgd_ps_worker *w);
/* Frees the worker (NULL: nothing); not the transport or the map.
   Thread safety: the worker's thread. */
DSGD_API void dsgd_ps_worker_destroy(dsgd_ps_worker *w);

/* The loop's callbacks (see THE LOOP above), called on the worker's thread
   with dsgd_ps_run_desc.user. An error one returns stops the run, which
   returns it; a message recorded on the worker's context is kept.
   dsgd_ps_grad_fn: the gradient of the whole flat buffer at params into
   grads (num_floats each) for the worker's push number `step`.
   dsgd_ps_pull_fn: after each pull, before the stop rule: step (the
   worker's pushes so far), global_step (dsgd_ps_worker_global_step) and
   the parameters pulled; set *stop (0 on entry) to non-zero to end the
   run there as the stop rule would (then finish).
   dsgd_ps_push_fn: after each push was acknowledged by every server, with
   its number (dsgd_ps_worker_last_push_dropped tells a BACKUP drop). */
typedef dsgd_result (*dsgd_ps_grad_fn)(void *user, int64_t step, const float *params, float *grads);
typedef dsgd_result (*dsgd_ps_pull_fn)(void *user, int64_t step, int64_t global_step, const float *params, int *stop);
typedef dsgd_result (*dsgd_ps_push_fn)(void *user, int64_t step);

/* What dsgd_ps_worker_run does; zero is the default for every field but
   grad. */
typedef struct dsgd_ps_run_desc {
    int64_t steps;              /* the target, >= 0: the global step (BACKUP)
                                   or the worker's pushes in all (ASYNC, SSP,
                                   SYNC) at which it stops */
    dsgd_ps_grad_fn grad;       /* required */
    void *user;                 /* passed to every callback */
    size_t num_floats;          /* the whole flat buffer; 0: up to the end
                                   of the map's last shard */
    float *params, *grads;      /* two buffers of num_floats, or NULL: the
                                   run allocates them (params zeroed); floats
                                   no shard holds keep their values */
    dsgd_ps_pull_fn after_pull; /* optional */
    dsgd_ps_push_fn after_push; /* optional */
    int no_finish;              /* non-zero: return without finishing, so
                                   that the caller can pull again (a chief
                                   reading the final weights once every
                                   worker is done) and then finish */
} dsgd_ps_run_desc;

/* Runs the worker's loop with d (see THE LOOP above): pull, stop as the
   policy says at the target d->steps (or when after_pull says so), else
   compute the gradient with d->grad and push; then finish, unless
   d->no_finish. The worker's counters (dsgd_ps_worker_get_stats: clock)
   then hold its pushes. Apply ON_WORKERS: dsgd_ps_worker_set_params (or
   dsgd_ps_worker_restore) first.
   Errors (recorded on the worker's ctx, "dsgd_ps_worker_run: worker w:
   ..." or the pull's, push's or finish's message): DSGD_ERR_INVALID_ARGUMENT
   (w NULL, nothing recorded; d NULL, grad NULL, steps < 0, num_floats
   below the end of the map's last shard, params equal to grads),
   DSGD_ERR_STATE (a finished or failed worker), DSGD_ERR_OUT_OF_MEMORY,
   those of dsgd_ps_worker_pull, _push and _finish (the worker is then
   unusable), and a callback's error (with the callback's own message when
   it recorded one on the worker's ctx, else one naming the callback and
   the step); after a callback's error the worker is left unfinished and
   usable: finish it, or stop the others (the transport's abort).
   Thread safety: the worker's thread, on which the callbacks run. */
DSGD_API dsgd_result dsgd_ps_worker_run(dsgd_ps_worker *w, const dsgd_ps_run_desc *d);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_PS_WORKER_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_PS_WORKER_IMPL)
#define DSGD__PART_PS_WORKER_IMPL

struct dsgd_ps_worker {
    const dsgd__ps_policy_row *pol;
    dsgd_ctx *ctx;
    dsgd_transport_i t;
    dsgd_ps_desc d; /* defaults filled */
    const dsgd_shard_map *map;
    int index, P, W, state, pulled;
    size_t *n;         /* [P] floats of each server */
    float **buf;       /* [P] [header | n[s]]: a push's slice, then a pull's reply */
    dsgd_ps_header *pull_hdr; /* [P] the pull requests, for resends */
    float *scratch;    /* stale replies land here */
    size_t scratch_bytes;
    int64_t *version, *last_step; /* [P] read at the last pull; the tag of the last push */
    int *dropped, *pending;       /* [P] */
    double *sent_at, *backoff;    /* [P] */
    uint64_t push_seq, pull_seq;
    uint64_t push_seq0, pull_seq0; /* at create or restore: a save or restore
                                      needs no pull or push since */
    int64_t pulls, push_resends, pull_resends, pushes_dropped, stale;
    /* BACKUP with backup_cancel: the version a CANCEL announced (the next
       pull waits for it), the gradient abandoned, and how often */
    int64_t cancel_version, cancels;
    int abandoned;
    /* MEMBERSHIP (ps.h): a late worker (index >= initial_workers), joined
       once its commit was admitted; base, the clock it joined at (0 for a
       member from the start); join_at and admitted [P], each server's
       JOINED: the clock it counts the worker from, and the commit's status */
    int late, joined;
    int64_t base, *join_at;
    int *admitted;
    /* ON_WORKERS: per server, its ranges of the worker's copy (the server's
       layout), the mean received ([header | n[s]]) and the optimizer's
       slots; latest: the server's version the first reply of a pull
       announced */
    int holds, have_be, params_set, round; /* holds: the placement's servers_hold */
    dsgd_backend_i be;
    dsgd_buffer **own, **sum;
    dsgd__opt_state *opt;     /* [P]: the optimizer's slots for each server's ranges */
    int64_t *latest;
};

static dsgd_result dsgd__ps_worker_fail(dsgd_ps_worker *w, dsgd_result r) {
    w->state = DSGD__PS_FAILED;
    return r;
}

/* ON_WORKERS: takes server src's reply h (the mean in sum[src]): applies
   the mean it carries to the worker's copy of that server's ranges, as the
   server would have (dsgd__ps_apply: the same update, the same step count). */
static dsgd_result dsgd__ps_worker_take_mean(dsgd_ps_worker *w, const char *fn, int src, const dsgd_ps_header *h,
                                             float *full) {
    dsgd_result r;
    int64_t v = w->version[src];
    (void)full;
    if (w->round == 0) w->latest[src] = h->version;
    if (h->step < 0) { /* nothing new */
        if (h->version != v)
            return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                      "%s: worker %d: server %d says it has published %lld means, the worker has %lld",
                                      fn, w->index, src, (long long)h->version, (long long)v);
        return DSGD_OK;
    }
    if (h->step != v)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC, "%s: worker %d: server %d sent the mean of step %lld, not %lld",
                                  fn, w->index, src, (long long)h->step, (long long)v);
    r = dsgd__opt_state_update(&w->opt[src], v, dsgd__ref(w->own[src], 0), dsgd__ref(w->sum[src], DSGD__PS_H), 1.0f);
    if (r != DSGD_OK) return r;
    w->version[src] = v + 1;
    if (w->t.charge_apply && (r = w->t.charge_apply(w->t.impl, w->n[src])) != DSGD_OK) /* a simulated clock */
        return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: charging an update failed: %s%s%s", fn, w->index,
                                  dsgd_result_string(r), dsgd__ps_terr_sep(&w->t), dsgd__ps_terr(&w->t));
    return DSGD_OK;
}

/* ON_SERVERS: takes server src's reply h (the parameters in buf[src]) into
   their ranges of full. */
static dsgd_result dsgd__ps_worker_take_params(dsgd_ps_worker *w, const char *fn, int src, const dsgd_ps_header *h,
                                               float *full) {
    (void)fn;
    w->version[src] = h->version;
    dsgd__ps_scatter(w->map, src, w->buf[src] + DSGD__PS_H, full);
    return DSGD_OK;
}

/* How the apply placement makes a worker take a pull's reply; in the order
   of dsgd_ps_apply (ps.h's table says what each placement is). */
typedef dsgd_result (*dsgd__ps_worker_take)(dsgd_ps_worker *w, const char *fn, int src, const dsgd_ps_header *h,
                                            float *full);
static const dsgd__ps_worker_take dsgd__ps_worker_takes[DSGD_PS_APPLY_COUNT] = {dsgd__ps_worker_take_params,
                                                                               dsgd__ps_worker_take_mean};

/* The global step: the least version read at the last pull, the step every
   server has applied. */
static int64_t dsgd__ps_worker_global(const dsgd_ps_worker *w) {
    int64_t g = w->version[0];
    int s;
    for (s = 1; s < w->P; ++s) g = DSGD__MIN(g, w->version[s]);
    return g;
}

/* ACK: takes server src's acknowledgement of a push (dropped or applied). */
static dsgd_result dsgd__ps_worker_take_ack(dsgd_ps_worker *w, const char *fn, int src, const dsgd_ps_header *h,
                                            float *full) {
    (void)fn;
    (void)full;
    w->dropped[src] = h->status == DSGD_PS_DROPPED;
    w->pushes_dropped += w->dropped[src];
    return DSGD_OK;
}

/* JOINED: takes server src's answer to the worker's JOIN (MEMBERSHIP in
   ps.h): its version, the clock it counts the worker from, the commit's
   status. */
static dsgd_result dsgd__ps_worker_take_joined(dsgd_ps_worker *w, const char *fn, int src, const dsgd_ps_header *h,
                                               float *full) {
    (void)fn;
    (void)full;
    w->version[src] = h->version;
    w->join_at[src] = h->step;
    w->admitted[src] = h->status == DSGD_PS_ADMITTED;
    return DSGD_OK;
}

/* What a wait waits for, a row per reply type: the reply's name in a
   timeout's message, the request it answers (named there too), the type of
   that request (a resend's tag), and how a reply is taken (NULL: as the
   apply placement says, dsgd__ps_worker_takes). */
typedef struct dsgd__ps_wait_row {
    int reply;
    const char *noun, *request;
    int request_type;
    dsgd__ps_worker_take take;
} dsgd__ps_wait_row;

static const dsgd__ps_wait_row dsgd__ps_wait_rows[] = {
    {/* .reply = */ DSGD_PS_MSG_ACK, /* .noun = */ "acknowledgement", /* .request = */ "push",
     /* .request_type = */ DSGD_PS_MSG_PUSH, /* .take = */ dsgd__ps_worker_take_ack},
    {/* .reply = */ DSGD_PS_MSG_PARAMS, /* .noun = */ "parameters", /* .request = */ "pull",
     /* .request_type = */ DSGD_PS_MSG_PULL, /* .take = */ NULL},
    {/* .reply = */ DSGD_PS_MSG_JOINED, /* .noun = */ "answer to its JOIN", /* .request = */ "join round",
     /* .request_type = */ DSGD_PS_MSG_JOIN, /* .take = */ dsgd__ps_worker_take_joined}};
#define DSGD__PS_WAIT_ROWS ((int)(sizeof dsgd__ps_wait_rows / sizeof dsgd__ps_wait_rows[0]))

/* type's row (ACK, PARAMS or JOINED: the last row for any other). */
static const dsgd__ps_wait_row *dsgd__ps_wait_row_of(int type) {
    int k = 0;
    while (k < DSGD__PS_WAIT_ROWS - 1 && dsgd__ps_wait_rows[k].reply != type) k++;
    return &dsgd__ps_wait_rows[k];
}

/* When the wait wakes: the earliest resend due, or the deadline. */
static double dsgd__ps_worker_wake(const dsgd_ps_worker *w, double deadline) {
    double wake = deadline;
    int s;
    for (s = 0; s < w->P; ++s)
        if (w->pending[s] && w->sent_at[s] + w->backoff[s] < wake) wake = w->sent_at[s] + w->backoff[s];
    return wake;
}

/* The deadline passed: the timeout, naming the servers still silent. */
static dsgd_result dsgd__ps_worker_timed_out(dsgd_ps_worker *w, const char *fn, const dsgd__ps_wait_row *row,
                                             uint64_t seq) {
    char names[256];
    size_t used = 0;
    int k = 0, s;
    names[0] = '\0';
    for (s = 0; s < w->P; ++s)
        if (w->pending[s]) {
            int m = snprintf(names + used, sizeof names - used, "%s%d", k++ ? ", " : "", s);
            if (m > 0) used = DSGD__MIN(sizeof names - 1, used + (size_t)m);
        }
    return dsgd_ctx_set_error(w->ctx, DSGD_ERR_TIMEOUT, "%s: worker %d: no %s from server%s %s within %g s (%s %llu)",
                              fn, w->index, row->noun, k > 1 ? "s" : "", names, w->d.timeout_s, row->request,
                              (unsigned long long)seq);
}

/* Resends the request to each silent server whose backoff has passed at
   now, and doubles its backoff (up to max_backoff): a push's whole
   message, or a pull's or a JOIN's header. */
static dsgd_result dsgd__ps_worker_resend_due(dsgd_ps_worker *w, const char *fn, const dsgd__ps_wait_row *row,
                                              uint64_t seq, double now, double deadline, double max_backoff) {
    int s;
    for (s = 0; s < w->P; ++s) {
        const void *msg;
        size_t mbytes;
        dsgd_result r;
        if (!w->pending[s] || now < w->sent_at[s] + w->backoff[s]) continue;
        if (row->reply == DSGD_PS_MSG_ACK) {
            msg = w->buf[s];
            mbytes = DSGD__PS_HBYTES + w->n[s] * sizeof(float);
            w->push_resends++;
        } else { /* a pull's or a JOIN's header */
            msg = &w->pull_hdr[s];
            mbytes = DSGD__PS_HBYTES;
            w->pull_resends++;
        }
        r = w->t.send(w->t.impl, s, DSGD_PS_TAG(row->request_type, seq), msg, mbytes, deadline);
        if (r != DSGD_OK)
            return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: resending to server %d failed: %s%s%s", fn, w->index,
                                      s, dsgd_result_string(r), dsgd__ps_terr_sep(&w->t), dsgd__ps_terr(&w->t));
        w->sent_at[s] = dsgd__ps_now(&w->t);
        w->backoff[s] = DSGD__MIN(2 * w->backoff[s], max_backoff);
    }
    return DSGD_OK;
}

/* Takes the expected reply of bytes from server src (tag): checks its
   size, receives it, checks its header, then takes it as its row says. */
static dsgd_result dsgd__ps_worker_take_reply(dsgd_ps_worker *w, const char *fn, const dsgd__ps_wait_row *row,
                                              uint64_t seq, int src, uint64_t tag, size_t bytes, double deadline,
                                              float *full) {
    int type = row->reply;
    unsigned char ack[DSGD__PS_HBYTES];
    dsgd_ps_header h;
    size_t want = DSGD__PS_HBYTES + (type == DSGD_PS_MSG_PARAMS ? w->n[src] * sizeof(float) : 0);
    void *dst = type == DSGD_PS_MSG_PARAMS ? (void *)w->buf[src] : (void *)ack;
    dsgd_result r;
    if (type == DSGD_PS_MSG_PARAMS && !w->holds) { /* a mean, or nothing new */
        dst = w->be.buffer_host_ptr(w->be.impl, w->sum[src]);
        if (bytes == DSGD__PS_HBYTES) want = bytes;
    }
    if (bytes != want)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC, "%s: worker %d: server %d sent %zu bytes, not %zu", fn,
                                  w->index, src, bytes, want);
    r = w->t.recv(w->t.impl, src, tag, dst, bytes, deadline);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: receiving from server %d failed: %s%s%s", fn, w->index,
                                  src, dsgd_result_string(r), dsgd__ps_terr_sep(&w->t), dsgd__ps_terr(&w->t));
    h = dsgd__ps_hdr_get(dst);
    if (h.type != (uint64_t)type || h.worker != (uint64_t)w->index || DSGD_PS_TAG_SEQ(h.seq) != DSGD_PS_TAG_SEQ(seq) ||
        (type == DSGD_PS_MSG_PARAMS && DSGD__PS_HBYTES + h.count * sizeof(float) != bytes))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                  "%s: worker %d: server %d sent a header (type %llu, worker %llu, seq %llu, "
                                  "count %llu) that does not match its tag and size", fn, w->index, src,
                                  (unsigned long long)h.type, (unsigned long long)h.worker, (unsigned long long)h.seq,
                                  (unsigned long long)h.count);
    return (row->take ? row->take : dsgd__ps_worker_takes[w->d.apply])(w, fn, src, &h, full);
}

/* A reply to an older request (or a copy) of bytes from server src (tag,
   of type mtype): received into the scratch buffer and dropped. */
static dsgd_result dsgd__ps_worker_drain(dsgd_ps_worker *w, const char *fn, int src, uint64_t tag, size_t bytes,
                                         int mtype, double deadline) {
    dsgd_result r;
    if (bytes > w->scratch_bytes)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                  "%s: worker %d: server %d sent an unexpected message of %zu bytes (type %d)", fn,
                                  w->index, src, bytes, mtype);
    r = w->t.recv(w->t.impl, src, tag, w->scratch, bytes, deadline);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: receiving from server %d failed: %s", fn, w->index, src,
                                  dsgd_result_string(r));
    w->stale++;
    return DSGD_OK;
}

/* The wait for one reply from every server: probe, take the expected
   replies, drop stale ones, resend to silent servers with backoff. type is
   ACK, PARAMS or JOINED; full receives the parameters of PARAMS. */
static dsgd_result dsgd__ps_worker_wait(dsgd_ps_worker *w, const char *fn, int type, uint64_t seq, float *full) {
    const dsgd__ps_wait_row *row = dsgd__ps_wait_row_of(type);
    double start = dsgd__ps_now(&w->t), deadline = start + w->d.timeout_s;
    double max_backoff = DSGD__MAX(w->d.retry_s, w->d.timeout_s / 8);
    int left = w->P, s;
    dsgd_result r;
    for (s = 0; s < w->P; ++s) {
        w->pending[s] = 1;
        w->sent_at[s] = start;
        w->backoff[s] = w->d.retry_s;
    }
    while (left > 0) {
        double now;
        int src = -1, mtype;
        uint64_t tag = 0;
        size_t bytes = 0;
        r = w->t.probe(w->t.impl, dsgd__ps_worker_wake(w, deadline), &src, &tag, &bytes);
        now = dsgd__ps_now(&w->t);
        if (r == DSGD_ERR_TIMEOUT) {
            if (now >= deadline) return dsgd__ps_worker_timed_out(w, fn, row, seq);
            if ((r = dsgd__ps_worker_resend_due(w, fn, row, seq, now, deadline, max_backoff)) != DSGD_OK) return r;
            continue;
        }
        if (r != DSGD_OK)
            return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: waiting for the servers failed: %s%s%s", fn, w->index,
                                      dsgd_result_string(r), dsgd__ps_terr_sep(&w->t), dsgd__ps_terr(&w->t));
        if (src < 0 || src >= w->P)
            return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC, "%s: worker %d: a message from rank %d, which is not a server",
                                      fn, w->index, src);
        mtype = DSGD_PS_TAG_TYPE(tag);
        if (mtype == type && DSGD_PS_TAG_SEQ(tag) == (seq & DSGD_PS_SEQ_MASK) && w->pending[src]) {
            if ((r = dsgd__ps_worker_take_reply(w, fn, row, seq, src, tag, bytes, deadline, full)) != DSGD_OK) return r;
            w->pending[src] = 0;
            left--;
        } else if ((r = dsgd__ps_worker_drain(w, fn, src, tag, bytes, mtype, deadline)) != DSGD_OK) {
            return r;
        }
    }
    return DSGD_OK;
}

/* ON_WORKERS: the worker's copy into the shards' ranges of full. */
static void dsgd__ps_worker_copy_out(const dsgd_ps_worker *w, float *full) {
    int s;
    for (s = 0; s < w->P; ++s) dsgd__ps_scatter(w->map, s, (const float *)w->be.buffer_host_ptr(w->be.impl, w->own[s]), full);
}

static dsgd_result dsgd__ps_worker_usable(dsgd_ps_worker *w, const char *fn) {
    if (w->state == DSGD__PS_CREATED) return DSGD_OK;
    return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: worker %d has %s", fn, w->index,
                              w->state == DSGD__PS_DONE ? "finished" : "failed");
}

static dsgd_result dsgd__ps_worker_send(dsgd_ps_worker *w, const char *fn, int s, uint64_t tag, const void *buf,
                                        size_t bytes) {
    dsgd_result r = w->t.send(w->t.impl, s, tag, buf, bytes, dsgd__ps_now(&w->t) + w->d.timeout_s);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: sending to server %d failed: %s%s%s", fn, w->index, s,
                                  dsgd_result_string(r), dsgd__ps_terr_sep(&w->t), dsgd__ps_terr(&w->t));
    return DSGD_OK;
}

/* MEMBERSHIP (ps.h): a late worker's two rounds of JOIN with every
   server; nothing for a member or a worker that joined. Round 0 makes
   each server count it from its version, round 1 commits the largest of
   them as the clock every server counts it from. */
static dsgd_result dsgd__ps_worker_join(dsgd_ps_worker *w, const char *fn) {
    int64_t b = -1;
    dsgd_result r;
    int round, s;
    if (!w->late || w->joined) return DSGD_OK;
    for (round = 0; round < 2; ++round) {
        for (s = 0; s < w->P; ++s) {
            w->pull_hdr[s] = dsgd__ps_hdr(DSGD_PS_MSG_JOIN, w->index, (uint64_t)round, round ? b : -1, 0, 0, 0);
            w->admitted[s] = 0;
            r = dsgd__ps_worker_send(w, fn, s, DSGD_PS_TAG(DSGD_PS_MSG_JOIN, round), &w->pull_hdr[s], DSGD__PS_HBYTES);
            if (r != DSGD_OK) return dsgd__ps_worker_fail(w, r);
        }
        if ((r = dsgd__ps_worker_wait(w, fn, DSGD_PS_MSG_JOINED, (uint64_t)round, NULL)) != DSGD_OK)
            return dsgd__ps_worker_fail(w, r);
        for (s = 0; s < w->P; ++s) {
            if (round == 0) {
                b = DSGD__MAX(b, w->join_at[s]);
            } else if (!w->admitted[s] || w->join_at[s] != b) {
                return dsgd__ps_worker_fail(w, dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                                                  "%s: worker %d: server %d answered its join at clock "
                                                                  "%lld with clock %lld%s", fn, w->index, s,
                                                                  (long long)b, (long long)w->join_at[s],
                                                                  w->admitted[s] ? "" : ", not admitted"));
            }
        }
    }
    w->base = b;
    w->joined = 1;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_join(dsgd_ps_worker *w) {
    static const char *const fn = "dsgd_ps_worker_join";
    dsgd_result r;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    return dsgd__ps_worker_join(w, fn);
}

/* How long a pull waits: as the policy says, or as at the end of a worker
   (dsgd_ps_worker_finish: the clocks it pushed). */
enum { DSGD__PS_PULL_POLICY = 1, DSGD__PS_PULL_FINAL = 2 };

/* The pull. full_params may be NULL for a final pull ON_WORKERS, which
   only brings the worker's copy up to date. */
static dsgd_result dsgd__ps_worker_pull(dsgd_ps_worker *w, float *full_params, const char *fn, int wait) {
    dsgd_result r;
    int s;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    if (!full_params && (w->holds || wait != DSGD__PS_PULL_FINAL))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full_params is NULL", fn, w->index);
    if (!w->holds && !w->params_set)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE,
                                  "%s: worker %d: apply %s needs dsgd_ps_worker_set_params before the first pull", fn,
                                  w->index, dsgd_ps_apply_name(w->d.apply));
    if ((r = dsgd__ps_worker_join(w, fn)) != DSGD_OK) return r;
    /* ON_WORKERS: one round per mean behind the versions the first round announced */
    for (w->round = 0;; w->round++) {
        int behind = 0;
        for (s = 0; s < w->P; ++s) {
            dsgd_ps_header *h = &w->pull_hdr[s];
            int64_t need = w->pol->pull_needs(&w->d, (uint64_t)w->base + w->push_seq, w->last_step[s],
                                              wait == DSGD__PS_PULL_FINAL);
            if (wait != DSGD__PS_PULL_FINAL && w->cancel_version > need) need = w->cancel_version;
            if (w->pol->clocked && need < w->base) need = w->base; /* a late worker starts at its clock */
            *h = dsgd__ps_hdr(DSGD_PS_MSG_PULL, w->index, w->pull_seq, need, 0, 0, w->holds ? 0 : w->version[s]);
            if ((r = dsgd__ps_worker_send(w, fn, s, DSGD_PS_TAG(DSGD_PS_MSG_PULL, w->pull_seq), h, DSGD__PS_HBYTES)) != DSGD_OK)
                return dsgd__ps_worker_fail(w, r);
        }
        r = dsgd__ps_worker_wait(w, fn, DSGD_PS_MSG_PARAMS, w->pull_seq, full_params);
        if (r != DSGD_OK) return dsgd__ps_worker_fail(w, r);
        w->pull_seq++;
        for (s = 0; s < w->P && !w->holds; ++s) behind |= w->version[s] < w->latest[s];
        if (!behind) break;
    }
    if (!w->holds && full_params) dsgd__ps_worker_copy_out(w, full_params);
    w->pulls++;
    w->pulled = 1;
    w->abandoned = 0;
    return DSGD_OK;
}

/* A worker created with the run's initial parameters (every server at
   version 0, and summation only its copy set) counts as having pulled
   them, without asking the servers: its first push is then tagged 0 on
   every server, whatever the others did meanwhile (the parameter-server
   strategy's replicas start so, each step in lockstep). Nothing happens
   after the first pull or push. */
static void dsgd__ps_worker_start_at_initial(dsgd_ps_worker *w) {
    if (w->pulls == 0 && w->push_seq == 0 && w->state == DSGD__PS_CREATED) w->pulled = 1;
}

DSGD_API dsgd_result dsgd_ps_worker_pull(dsgd_ps_worker *w, float *full_params) {
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__ps_worker_pull(w, full_params, "dsgd_ps_worker_pull", DSGD__PS_PULL_POLICY);
}

DSGD_API dsgd_result dsgd_ps_worker_push(dsgd_ps_worker *w, const float *full_grads) {
    static const char *const fn = "dsgd_ps_worker_push";
    dsgd_result r;
    int64_t global;
    int s;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    if (!full_grads) return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full_grads is NULL", fn, w->index);
    if ((r = dsgd__ps_worker_join(w, fn)) != DSGD_OK) return r;
    if (w->pol->clocked && !w->pulled)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: worker %d: %s needs a pull before each push (push %llu)",
                                  fn, w->index, w->pol->name, (unsigned long long)w->push_seq);
    global = dsgd__ps_worker_global(w);
    for (s = 0; s < w->P; ++s) {
        int64_t tag = w->pol->global_tag ? global : w->version[s];
        dsgd_ps_header h = dsgd__ps_hdr(DSGD_PS_MSG_PUSH, w->index, w->push_seq, tag, w->n[s], 0, 0);
        dsgd__ps_hdr_put(w->buf[s], &h);
        dsgd__ps_gather(w->map, s, full_grads, w->buf[s] + DSGD__PS_H);
        w->dropped[s] = 0;
        w->last_step[s] = tag;
        r = dsgd__ps_worker_send(w, fn, s, DSGD_PS_TAG(DSGD_PS_MSG_PUSH, w->push_seq), w->buf[s],
                                 DSGD__PS_HBYTES + w->n[s] * sizeof(float));
        if (r != DSGD_OK) return dsgd__ps_worker_fail(w, r);
    }
    r = dsgd__ps_worker_wait(w, fn, DSGD_PS_MSG_ACK, w->push_seq, NULL);
    if (r != DSGD_OK) return dsgd__ps_worker_fail(w, r);
    w->push_seq++;
    w->pulled = 0;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_compute_for(dsgd_ps_worker *w, double seconds, int *cancelled) {
    static const char *const fn = "dsgd_ps_worker_compute_for";
    double end;
    dsgd_result r;
    if (cancelled) *cancelled = 0;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    if (!(seconds >= 0.0 && seconds < HUGE_VAL))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: seconds %g (need finite, >= 0)", fn,
                                  w->index, seconds);
    end = dsgd__ps_now(&w->t) + seconds;
    for (;;) {
        int src = -1;
        uint64_t tag = 0;
        size_t bytes = 0;
        dsgd_ps_header h;
        r = w->t.probe(w->t.impl, end, &src, &tag, &bytes);
        if (r == DSGD_ERR_TIMEOUT) return DSGD_OK; /* computed for the whole time */
        if (r != DSGD_OK)
            return dsgd__ps_worker_fail(w, dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: waiting failed: %s%s%s", fn, w->index,
                                                              dsgd_result_string(r), dsgd__ps_terr_sep(&w->t),
                                                              dsgd__ps_terr(&w->t)));
        if (src < 0 || src >= w->P || bytes > w->scratch_bytes)
            return dsgd__ps_worker_fail(w, dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                                              "%s: worker %d: an unexpected message of %zu bytes from rank %d",
                                                              fn, w->index, bytes, src));
        r = w->t.recv(w->t.impl, src, tag, w->scratch, bytes, end);
        if (r != DSGD_OK)
            return dsgd__ps_worker_fail(w, dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: receiving from server %d failed: %s",
                                                              fn, w->index, src, dsgd_result_string(r)));
        if (w->d.backup_cancel && DSGD_PS_TAG_TYPE(tag) == DSGD_PS_MSG_CANCEL && bytes == DSGD__PS_HBYTES &&
            w->pulled && (h = dsgd__ps_hdr_get(w->scratch)).version > dsgd__ps_worker_global(w)) {
            /* the step it computes for was applied without it: abandon */
            w->cancel_version = DSGD__MAX(w->cancel_version, h.version);
            w->pulled = 0;
            w->abandoned = 1;
            w->cancels++;
            if (cancelled) *cancelled = 1;
            return DSGD_OK;
        }
        w->stale++; /* an older reply, or a CANCEL of a step already read */
    }
}

DSGD_API dsgd_result dsgd_ps_worker_set_params(dsgd_ps_worker *w, const float *full_params) {
    static const char *const fn = "dsgd_ps_worker_set_params";
    int s;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full_params)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full_params is NULL", fn, w->index);
    if (w->holds || w->pulls > 0 || w->state != DSGD__PS_CREATED)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: worker %d: %s", fn, w->index,
                                  w->holds ? "the servers hold the parameters" : "only before the first pull");
    for (s = 0; s < w->P; ++s) dsgd__ps_gather(w->map, s, full_params, w->be.buffer_host_ptr(w->be.impl, w->own[s]));
    w->params_set = 1;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_read_params(const dsgd_ps_worker *w, float *full) {
    static const char *const fn = "dsgd_ps_worker_read_params";
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full) return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full is NULL", fn, w->index);
    if (w->holds)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE,
                                  "%s: worker %d: the servers hold the parameters (apply %s); read theirs", fn,
                                  w->index, dsgd_ps_apply_name(w->d.apply));
    dsgd__ps_worker_copy_out(w, full);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_finish(dsgd_ps_worker *w) {
    static const char *const fn = "dsgd_ps_worker_finish";
    dsgd_ps_header h;
    dsgd_result r;
    int s;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    /* summation only: the means of every clock pushed first, so every
       worker ends with the same bits and no server lets go of a mean that
       a checkpoint needs */
    if (!w->holds && w->params_set && (r = dsgd__ps_worker_pull(w, NULL, fn, DSGD__PS_PULL_FINAL)) != DSGD_OK) return r;
    h = dsgd__ps_hdr(DSGD_PS_MSG_DONE, w->index, w->push_seq, 0, 0, 0, 0);
    for (s = 0; s < w->P; ++s)
        if ((r = dsgd__ps_worker_send(w, fn, s, DSGD_PS_TAG(DSGD_PS_MSG_DONE, w->push_seq), &h, sizeof h)) != DSGD_OK)
            return dsgd__ps_worker_fail(w, r);
    w->state = DSGD__PS_DONE;
    return DSGD_OK;
}

DSGD_API void dsgd_ps_worker_destroy(dsgd_ps_worker *w) {
    int s;
    if (!w) return;
    if (w->buf)
        for (s = 0; s < w->P; ++s) DSGD_FREE(w->buf[s]);
    DSGD_FREE(w->buf);
    DSGD_FREE(w->n);
    DSGD_FREE(w->pull_hdr);
    DSGD_FREE(w->scratch);
    DSGD_FREE(w->version);
    DSGD_FREE(w->last_step);
    DSGD_FREE(w->dropped);
    DSGD_FREE(w->pending);
    DSGD_FREE(w->sent_at);
    DSGD_FREE(w->backoff);
    DSGD_FREE(w->join_at);
    DSGD_FREE(w->admitted);
    if (w->have_be) {
        dsgd_buffer **own[2];
        int k;
        own[0] = w->own;
        own[1] = w->sum;
        for (k = 0; k < 2; ++k)
            for (s = 0; own[k] && s < w->P; ++s)
                if (own[k][s]) w->be.buffer_destroy(w->be.impl, own[k][s]);
        for (s = 0; w->opt && s < w->P; ++s)
            if (w->opt[s].be) dsgd__opt_state_free(&w->opt[s]);
        if (w->be.destroy) w->be.destroy(w->be.impl);
    }
    DSGD_FREE(w->own);
    DSGD_FREE(w->sum);
    DSGD_FREE(w->opt);
    DSGD_FREE(w->latest);
    DSGD_FREE(w);
}

DSGD_API dsgd_result dsgd_ps_worker_create(dsgd_ctx *ctx, const dsgd_transport_i *t, const dsgd_ps_desc *desc,
                                           const dsgd_shard_map *map, dsgd_ps_worker **out) {
    static const char *const fn = "dsgd_ps_worker_create";
    dsgd_ps_worker *w;
    dsgd_ps_desc d;
    dsgd_result r;
    size_t P, max_n = 0;
    int s;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if ((r = dsgd__ps_setup(ctx, t, desc, map, fn, &d)) != DSGD_OK) return r;
    if (t->rank < d.num_servers || t->rank >= d.num_servers + d.num_workers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: rank %d is not a worker (workers are ranks %d..%d)",
                                  fn, t->rank, d.num_servers, d.num_servers + d.num_workers - 1);
    w = (dsgd_ps_worker *)dsgd__alloc(ctx, sizeof *w, fn);
    if (!w) return DSGD_ERR_OUT_OF_MEMORY;
    memset(w, 0, sizeof *w);
    w->ctx = ctx;
    w->t = *t;
    w->d = d;
    w->map = map;
    w->P = d.num_servers;
    w->W = d.num_workers;
    w->index = t->rank - d.num_servers;
    P = (size_t)w->P;
    w->n = (size_t *)dsgd__alloc(ctx, P * sizeof *w->n, fn);
    w->buf = (float **)dsgd__alloc(ctx, P * sizeof *w->buf, fn);
    w->pull_hdr = (dsgd_ps_header *)dsgd__alloc(ctx, P * sizeof *w->pull_hdr, fn);
    w->version = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->version, fn);
    w->last_step = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->last_step, fn);
    w->dropped = (int *)dsgd__alloc(ctx, P * sizeof *w->dropped, fn);
    w->pending = (int *)dsgd__alloc(ctx, P * sizeof *w->pending, fn);
    w->sent_at = (double *)dsgd__alloc(ctx, P * sizeof *w->sent_at, fn);
    w->backoff = (double *)dsgd__alloc(ctx, P * sizeof *w->backoff, fn);
    w->join_at = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->join_at, fn);
    w->admitted = (int *)dsgd__alloc(ctx, P * sizeof *w->admitted, fn);
    w->late = w->index >= d.initial_workers;
    if (!w->n || !w->buf || !w->pull_hdr || !w->version || !w->last_step || !w->dropped || !w->pending || !w->sent_at ||
        !w->backoff || !w->join_at || !w->admitted) {
        dsgd_ps_worker_destroy(w);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    memset(w->buf, 0, P * sizeof *w->buf);
    for (s = 0; s < w->P; ++s) {
        w->n[s] = dsgd_shard_map_server_floats(map, s);
        w->version[s] = 0;
        w->last_step[s] = -1;
        w->dropped[s] = 0;
        if (w->n[s] > max_n) max_n = w->n[s];
        if (w->n[s] > (SIZE_MAX / sizeof(float)) - DSGD__PS_H - 1 ||
            !(w->buf[s] = (float *)dsgd__alloc(ctx, (DSGD__PS_H + w->n[s]) * sizeof(float), fn))) {
            dsgd_ps_worker_destroy(w);
            return DSGD_ERR_OUT_OF_MEMORY;
        }
    }
    w->scratch_bytes = (DSGD__PS_H + max_n) * sizeof(float);
    w->scratch = (float *)dsgd__alloc(ctx, w->scratch_bytes, fn);
    if (!w->scratch) {
        dsgd_ps_worker_destroy(w);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    w->pol = dsgd__ps_policy(&d);
    w->holds = dsgd__ps_apply_of(&d)->servers_hold;
    if (!w->holds) { /* the worker's copy and the optimizer's slots, on a CPU backend */
        w->own = (dsgd_buffer **)dsgd__alloc(ctx, P * sizeof *w->own, fn);
        w->sum = (dsgd_buffer **)dsgd__alloc(ctx, P * sizeof *w->sum, fn);
        w->opt = (dsgd__opt_state *)dsgd__alloc(ctx, P * sizeof *w->opt, fn);
        w->latest = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->latest, fn);
        if (!w->own || !w->sum || !w->opt || !w->latest) {
            dsgd_ps_worker_destroy(w);
            return DSGD_ERR_OUT_OF_MEMORY;
        }
        memset(w->own, 0, P * sizeof *w->own);
        memset(w->sum, 0, P * sizeof *w->sum);
        memset(w->opt, 0, P * sizeof *w->opt);
        memset(w->latest, 0, P * sizeof *w->latest);
        r = dsgd_cpu_backend_create(ctx, &w->be);
        if (r == DSGD_OK) w->have_be = 1;
        for (s = 0; s < w->P && r == DSGD_OK; ++s) {
            r = w->be.buffer_create(w->be.impl, w->n[s], &w->own[s]);
            if (r == DSGD_OK) r = w->be.buffer_create(w->be.impl, DSGD__PS_H + w->n[s], &w->sum[s]);
            if (r == DSGD_OK) r = dsgd__opt_state_init(&w->opt[s], &w->be, &w->d.optimizer, w->n[s]);
        }
        if (r != DSGD_OK) {
            dsgd_ps_worker_destroy(w);
            return r;
        }
    }
    *out = w;
    return DSGD_OK;
}

DSGD_API void dsgd_ps_worker_get_stats(const dsgd_ps_worker *w, dsgd_ps_worker_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!w) return;
    out->clock = (int64_t)w->push_seq;
    out->pulls = w->pulls;
    out->push_resends = w->push_resends;
    out->pull_resends = w->pull_resends;
    out->pushes_dropped = w->pushes_dropped;
    out->stale_replies = w->stale;
    out->gradients_cancelled = w->cancels;
    out->joined_at = w->late && !w->joined ? -1 : w->base;
}

DSGD_API int64_t dsgd_ps_worker_version(const dsgd_ps_worker *w, int server) {
    return w && server >= 0 && server < w->P ? w->version[server] : -1;
}

DSGD_API int64_t dsgd_ps_worker_global_step(const dsgd_ps_worker *w) { return w ? dsgd__ps_worker_global(w) : -1; }

DSGD_API int dsgd_ps_worker_last_push_dropped(const dsgd_ps_worker *w, int server) {
    return w && server >= 0 && server < w->P ? w->dropped[server] : 0;
}

DSGD_API int dsgd_ps_worker_failed(const dsgd_ps_worker *w) {
    return w && w->state == DSGD__PS_FAILED;
}

/* ---- the loop */

/* The floats of the whole flat buffer the map spans: up to the end of its
   last shard. */
static size_t dsgd__ps_worker_span(const dsgd_ps_worker *w) {
    size_t end = 0;
    int i, ns = dsgd_shard_map_num_shards(w->map);
    for (i = 0; i < ns; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(w->map, i);
        end = DSGD__MAX(end, sh->offset + sh->count);
    }
    return end;
}

/* A callback's result r: its own message when it recorded one on the
   worker's ctx (cleared before the call), else one naming it. */
static dsgd_result dsgd__ps_worker_callback(dsgd_ps_worker *w, dsgd_result r, const char *which, int64_t step) {
    if (r != DSGD_OK && dsgd_ctx_last_result(w->ctx) == DSGD_OK)
        dsgd_ctx_set_error(w->ctx, r, "dsgd_ps_worker_run: worker %d: %s failed at step %lld: %s", w->index, which,
                           (long long)step, dsgd_result_string(r));
    return r;
}

DSGD_API dsgd_result dsgd_ps_worker_run(dsgd_ps_worker *w, const dsgd_ps_run_desc *d) {
    static const char *const fn = "dsgd_ps_worker_run";
    float *own = NULL, *params, *grads;
    size_t span, n, room, buffers;
    dsgd_result r;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if (!d || !d->grad)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: %s is NULL", fn, w->index,
                                  d ? "the gradient fn (grad)" : "the desc");
    span = dsgd__ps_worker_span(w);
    n = d->num_floats ? d->num_floats : span;
    if (d->steps < 0)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: steps %lld (the target) is negative",
                                  fn, w->index, (long long)d->steps);
    if (n < span)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: worker %d: num_floats %zu is below %zu, the end of the shard map's last shard", fn,
                                  w->index, n, span);
    if (d->params && d->params == d->grads)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: params and grads are one buffer",
                                  fn, w->index);
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    room = DSGD__MAX(n, (size_t)1);
    buffers = (size_t)!d->params + (size_t)!d->grads; /* the run's own */
    if (buffers && room > SIZE_MAX / (2 * sizeof(float)))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: worker %d: %zu floats", fn, w->index, n);
    if (buffers && !(own = (float *)dsgd__alloc(w->ctx, buffers * room * sizeof(float), fn)))
        return DSGD_ERR_OUT_OF_MEMORY;
    params = d->params ? d->params : own;
    grads = d->grads ? d->grads : own + (d->params ? 0 : room);
    if (!d->params) memset(params, 0, n * sizeof(float));
    for (;;) {
        int64_t step, global;
        int stop = 0;
        if ((r = dsgd_ps_worker_pull(w, params)) != DSGD_OK) break;
        /* the clock: the pushes so far (a late worker: from the clock it
           joined at, known after its first pull), the next push's number */
        step = w->base + (int64_t)w->push_seq;
        global = dsgd__ps_worker_global(w);
        if (d->after_pull) {
            dsgd_ctx_clear_error(w->ctx);
            r = dsgd__ps_worker_callback(w, d->after_pull(d->user, step, global, params, &stop), "after_pull", step);
            if (r != DSGD_OK) break;
        }
        /* the stop rule: the policy's (ps.h), TF's order: after the pull */
        if (stop || (w->pol->stop_on_global ? global : step) >= d->steps) break;
        dsgd_ctx_clear_error(w->ctx);
        w->abandoned = 0;
        if ((r = dsgd__ps_worker_callback(w, d->grad(d->user, step, params, grads), "the gradient fn", step)) != DSGD_OK)
            break;
        if (w->abandoned) continue; /* a CANCEL cut its compute short: pull the new step */
        if ((r = dsgd_ps_worker_push(w, grads)) != DSGD_OK) break;
        if (d->after_push) {
            dsgd_ctx_clear_error(w->ctx);
            if ((r = dsgd__ps_worker_callback(w, d->after_push(d->user, step), "after_push", step)) != DSGD_OK) break;
        }
    }
    if (r == DSGD_OK && !d->no_finish) r = dsgd_ps_worker_finish(w);
    DSGD_FREE(own);
    return r;
}

/* ---- checkpoints */

/* ON_WORKERS: buffer k of server s's ranges in a checkpoint's order: 0 the
   copy, 1.. the optimizer's slots. */
static dsgd_buffer *dsgd__ps_worker_copy_buf(const dsgd_ps_worker *w, int k, int s) {
    return k == 0 ? w->own[s] : w->opt[s].slot[k - 1];
}

static int dsgd__ps_worker_slots(const dsgd_ps_worker *w) {
    return !w->holds ? dsgd__opt_state_slots(&w->opt[0]) : 0;
}

/* ON_WORKERS: the worker's copy (k = 0) or its optimizer's slot k - 1
   into their ranges of full; DSGD_ERR_UNSUPPORTED when the servers hold
   them (or no such slot). A parameter-server strategy reads them into the
   file of its checkpoint. */
static dsgd_result dsgd__ps_worker_read_state(const dsgd_ps_worker *w, int k, float *full) {
    float *packed;
    dsgd_result r = DSGD_OK;
    size_t most = 1;
    int s;
    if (w->holds || k < 0 || k > dsgd__ps_worker_slots(w)) return DSGD_ERR_UNSUPPORTED;
    for (s = 0; s < w->P; ++s)
        if (w->n[s] > most) most = w->n[s];
    if (!(packed = (float *)dsgd__alloc(w->ctx, sizeof(float) * most, "reading a worker's state")))
        return DSGD_ERR_OUT_OF_MEMORY;
    for (s = 0; s < w->P && r == DSGD_OK; ++s) {
        if (w->n[s] && (r = w->be.read(w->be.impl, dsgd__ref(dsgd__ps_worker_copy_buf(w, k, s), 0), packed, w->n[s])) != DSGD_OK)
            break;
        dsgd__ps_scatter(w->map, s, packed, full);
    }
    DSGD_FREE(packed);
    return r;
}

/* The worker's floats over every server. */
static size_t dsgd__ps_worker_floats(const dsgd_ps_worker *w) {
    size_t total = 0;
    int s;
    for (s = 0; s < w->P; ++s) total += w->n[s];
    return total;
}

/* A pull or push since create or restore (not at a point to save or restore). */
static int dsgd__ps_worker_moved(const dsgd_ps_worker *w) {
    return w->push_seq != w->push_seq0 || w->pull_seq != w->pull_seq0;
}

/* What the worker's checkpoint must match (ps_checkpoint.h). */
static dsgd__ps_worker_shape dsgd__ps_worker_shape_of(const dsgd_ps_worker *w) {
    dsgd__ps_worker_shape sh;
    sh.d = &w->d;
    sh.map = w->map;
    sh.index = w->index;
    sh.P = w->P;
    sh.nslots = dsgd__ps_worker_slots(w);
    sh.holds = w->holds;
    sh.n = w->n;
    sh.floats = dsgd__ps_worker_floats(w);
    return sh;
}

/* A checkpoint does not hold the membership (MEMBERSHIP in ps.h). */
static dsgd_result dsgd__ps_worker_no_late_ck(dsgd_ps_worker *w, const char *what) {
    return dsgd_ctx_set_error(w->ctx, DSGD_ERR_UNSUPPORTED,
                              "%s: a run with late workers (initial_workers %d < %d) cannot be saved or restored: "
                              "a checkpoint does not hold who joined at which clock", what, w->d.initial_workers, w->W);
}

DSGD_API dsgd_result dsgd_ps_worker_save(dsgd_ps_worker *w, const char *path) {
    char what[64];
    dsgd__ck_writer wr;
    dsgd__ps_ident id;
    int s, k, nslots;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof what, "dsgd_ps_worker_save: worker %d", w->index);
    if (dsgd__ck_check_args(w->ctx, what, path, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    if (w->state == DSGD__PS_FAILED)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: it has failed, so its state may be half-updated", what);
    if (w->d.initial_workers < w->W) return dsgd__ps_worker_no_late_ck(w, what);
    if (w->state == DSGD__PS_CREATED && dsgd__ps_worker_moved(w))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE,
                                  "%s: it is between its first pull and finish (at push %llu, pull %llu): the servers, "
                                  "serving, cannot be saved with it; save after dsgd_ps_worker_finish", what,
                                  (unsigned long long)w->push_seq, (unsigned long long)w->pull_seq);
    nslots = dsgd__ps_worker_slots(w);
    id = dsgd__ps_ident_of(&w->d, w->index);
    dsgd__ckw_init(&wr, w->ctx, what,
                   dsgd__ps_ck_expect(dsgd__ps_worker_floats(w), !w->holds ? 1 + (size_t)nslots : 0));
    dsgd__ckw_begin(&wr, "ps_worker");
    dsgd__ps_put_ident(&wr, &id);
    dsgd__ckw_u32(&wr, (uint32_t)(w->state == DSGD__PS_DONE));
    dsgd__ckw_u32(&wr, (uint32_t)(w->pulled != 0));
    dsgd__ckw_u32(&wr, (uint32_t)(w->params_set != 0));
    dsgd__ckw_u64(&wr, w->push_seq);
    dsgd__ckw_u64(&wr, w->pull_seq);
    dsgd__ckw_u64(&wr, (uint64_t)w->pulls);
    dsgd__ckw_u64(&wr, (uint64_t)w->push_resends);
    dsgd__ckw_u64(&wr, (uint64_t)w->pull_resends);
    dsgd__ckw_u64(&wr, (uint64_t)w->pushes_dropped);
    dsgd__ckw_u64(&wr, (uint64_t)w->stale);
    dsgd__ckw_u32(&wr, (uint32_t)w->P);
    for (s = 0; s < w->P; ++s) {
        dsgd__ckw_u64(&wr, (uint64_t)w->n[s]);
        dsgd__ckw_u64(&wr, (uint64_t)w->version[s]);
        dsgd__ckw_u64(&wr, (uint64_t)w->last_step[s]);
        dsgd__ckw_u32(&wr, (uint32_t)(w->dropped[s] != 0));
        dsgd__ckw_u64(&wr, (uint64_t)(!w->holds ? w->latest[s] : 0));
    }
    dsgd__ckw_end(&wr);
    dsgd__ps_put_map(&wr, w->map);
    if (!w->holds) {
        dsgd__ckw_begin(&wr, "ps_copy");
        dsgd__ckw_u32(&wr, (uint32_t)nslots);
        dsgd__ckw_u64(&wr, (uint64_t)dsgd__ps_worker_floats(w));
        for (k = 0; k <= nslots; ++k)
            for (s = 0; s < w->P; ++s) dsgd__ckw_read(&wr, &w->be, dsgd__ref(dsgd__ps_worker_copy_buf(w, k, s), 0), w->n[s]);
        dsgd__ckw_end(&wr);
    }
    return dsgd__ckw_commit(&wr, path);
}

/* Writes the checked state into w; nothing here fails. */
static void dsgd__ps_worker_apply_ck(dsgd_ps_worker *w, const dsgd__ps_ck_worker *st) {
    int s, k;
    w->push_seq = w->push_seq0 = st->push_seq;
    w->pull_seq = w->pull_seq0 = st->pull_seq;
    w->pulled = (int)st->pulled;
    w->params_set = !w->holds && st->params_set;
    w->pulls = st->cnt[0];
    w->push_resends = st->cnt[1];
    w->pull_resends = st->cnt[2];
    w->pushes_dropped = st->cnt[3];
    w->stale = st->cnt[4];
    for (s = 0; s < w->P; ++s) {
        const unsigned char *p = st->servers + (size_t)s * DSGD__PS_CK_SERVER;
        w->version[s] = (int64_t)dsgd__ck_get64(p + 8);
        w->last_step[s] = (int64_t)dsgd__ck_get64(p + 16);
        w->dropped[s] = (int)dsgd__ck_get32(p + 24);
        if (!w->holds) w->latest[s] = (int64_t)dsgd__ck_get64(p + 28);
    }
    w->state = DSGD__PS_CREATED; /* a finished worker goes on */
    if (!w->holds) {
        const unsigned char *src = st->copy;
        for (k = 0; k <= dsgd__ps_worker_slots(w); ++k)
            for (s = 0; s < w->P; ++s) {
                dsgd__ck_copy_floats(w->be.buffer_host_ptr(w->be.impl, dsgd__ps_worker_copy_buf(w, k, s)), src, w->n[s]);
                src += w->n[s] * sizeof(float);
            }
    }
}

DSGD_API dsgd_result dsgd_ps_worker_restore(dsgd_ps_worker *w, const char *path) {
    char what[64];
    dsgd__ps_ck_worker st;
    dsgd__ps_worker_shape shape;
    dsgd__ck_file f;
    dsgd_result r;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof what, "dsgd_ps_worker_restore: worker %d", w->index);
    if ((r = dsgd__ck_check_args(w->ctx, what, path, NULL)) != DSGD_OK) return r;
    if (w->d.initial_workers < w->W) return dsgd__ps_worker_no_late_ck(w, what);
    if (w->state != DSGD__PS_CREATED || dsgd__ps_worker_moved(w))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: restore into a worker before its first pull (this one %s)",
                                  what, w->state == DSGD__PS_FAILED ? "failed" : w->state == DSGD__PS_DONE ? "finished"
                                                                                                          : "pulled or pushed");
    memset(&st, 0, sizeof st);
    shape = dsgd__ps_worker_shape_of(w);
    if ((r = dsgd__ck_open(&f, w->ctx, what, path)) == DSGD_OK && (r = dsgd__ps_check_worker(&f, &shape, &st)) == DSGD_OK)
        dsgd__ps_worker_apply_ck(w, &st);
    dsgd__ck_close(&f);
    return r;
}

#endif /* DSGD__PART_PS_WORKER_IMPL */
