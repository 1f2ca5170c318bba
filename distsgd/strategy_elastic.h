/* distsgd/strategy_elastic.h - elastic synchronous training: the group shrinks past a failed, dead or late replica
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   ELASTIC

     With dsgd_strategy_desc.elastic.min_replicas > 0 (MIRRORED and
     MULTI_WORKER_MIRRORED), a training step on which a replica fails before
     the update does not fail the strategy: the survivors agree who is alive
     and at which step, drop the failed replicas, build a communicator over
     the survivors only, call elastic.on_resize, and retry the step within
     the same call, re-sharded over the survivors (replica g of W' takes
     dsgd_block_range(count, W', g); MEAN divides by the global count, which
     is the same batch's), from the weights they hold: no checkpoint, no
     rollback. dsgd_step_info's world and resized report it. The survivors'
     step is a W'-replica strategy's step: after 8 -> 7 at step k, the
     weights are bitwise those of 8 replicas to step k, saved, restored into
     7 and trained on (over a loopback of the strategy's own; over the
     endpoints you gave, with the same explicit algorithm: AUTO may choose
     another over the survivors' endpoints, which cannot share memory).
     dsgd_step_info.dropped counts the replicas dropped in the call, and
     dropped_rank[i], dropped_why[i] name each: its rank as the call began
     (global across workers) and why: DSGD_DROP_FAILED (its own failure),
     DSGD_DROP_GONE (its transport stopped: killed), DSGD_DROP_LATE.

     Which failures shrink:
       - a replica's own failure in phase 0 or 1 of the step (its batch
         function, its backend computing the gradient; see THE
         SYNCHRONOUS STEP in strategy_sync.h), which phase 2 (the
         agreement) makes known to every replica before anyone updates;
       - over the endpoints you gave (desc.endpoints), every replica of
         the group in this process (a transport with send, recv and
         probe_from: simnet, the loopback): a replica whose collective of phase 0
         or 2 fails (before any update) because a replica is gone (its
         transport stopped under it: a simnet KILL fault) or late (it
         entered the collective when another had already given up on
         it: a simnet STALL longer than the deadline, a replica that
         stalls past timeout_s). The others return at their deadline
         (the transport is not aborted) and settle (SETTLE below); the
         gone and the late are dropped. Over simnet the survivors go on
         one deadline after they entered the collective: a kill at step
         k costs the spoiled attempt, one timeout_s and the settle's few
         messages, and the weights are those of the scripted run. A
         replica killed while the others settle, or in its own settle,
         is dropped as gone in the same shrink (the others learn of its
         death one link latency after it: SETTLE below).
     Not:
       - a failure about the batch rather than the replica (a class index
         out of range, DSGD_ERR_INVALID_ARGUMENT; a non-finite gradient,
         DSGD_ERR_NON_FINITE): the step fails on every replica as before and
         the group stays whole, as it would fail on any replica count;
       - a failure after the agreement (in the exchange, the update), or
         in a collective where nobody is gone or late (a dropped message):
         the strategy fails as without elastic (after a settle the
         message adds each failing replica's transport message: simnet
         names the rank whose message was lost);
       - a failed collective across processes (MULTI_WORKER_MIRRORED over
         several workers): the survivors would have to agree on who is
         gone over a group that lost a member, which the settle does not
         attempt (in one process the strategy's thread sees every
         replica's result); the transport is aborted and the strategy
         fails, as without elastic. So does a failed collective over a
         loopback of the strategy's own (nothing there is killed; a
         replica past its deadline aborts it as before). Over MPI a crashed
         process ends the job in any case (MPI without ULFM cannot
         continue a communicator that lost a process);
       - a replica killed inside a collective (a simnet KILL by time)
         where the others have gone on past it (its exchange after the
         agreement, or the next collective while it dies in the one
         before): the step fails (no hang; the same way in every run,
         since simnet kills it where the virtual times say; killed in a
         collective of phase 0 or 2, or in the settle after one, it is
         dropped as gone), and so does
         a replica late by more than about two deadlines (the settle
         waits twice timeout_s for each message: a late replica sees its
         own collective fail by its deadline).
     Nothing is half-applied: every replica updates only after phase 2 says
     go, and a replica that failed says stop there instead, so either every
     replica updates or none does; the shrink starts from the weights and
     optimizer state of the last step, equal on every survivor.

     The shrink, on the strategy's thread once the step returned everywhere:
       1 agree  after a settle: from the replicas' reports (all here).
                Else every replica (the failed ones too: their threads are
                fine, their transport is intact) all-reduces (MAX) a vote per
                rank (0 alive, 1 failed, 2 a failure about the batch) and
                its step count; every worker of a multi-worker group learns
                the same set of survivors, and a vote 2 anywhere ends the
                shrink (the step fails as before)
       2 fewer than min_replicas survive: wait grace_s (nothing can join a
                group yet: the wait is where a replica would be let back
                in), then fail the strategy with DSGD_ERR_ABORTED naming the
                survivors and min_replicas
       3 shrink over the endpoints you gave, each dropped replica leaves
                the transport (its leave member, on its thread: simnet
                then waits for it no more; a gone one left in its
                settle); the replicas' threads stop,
                the kind's per-replica state
                (overlap threads, the device path's marks) is torn down,
                the failed replicas are destroyed, the survivors renumbered
                0..W'-1 in their old order, each distributed variable's
                copies with them; a loopback of the strategy's own is
                replaced by one of W' ranks, the endpoints you gave are
                wrapped (rank i of the new group is the old rank
                survivors[i] over the same transport); new communicators,
                the kind's setup, the threads
       4 resize on_resize(user, W, W', survivors, s) on the strategy's
                thread
       5 retry  the same step (the same x, y, count or batch function,
                which is now told W' and the new ranks)
     SETTLE (the endpoints you gave, every replica here; a collective of
     phase 0 or 2 failed), on each replica's thread inside the step:
       gone     its transport stopped under it (DSGD_ERR_ABORTED, nobody in
                this strategy aborted it): it says so, leaves the
                transport (a simnet rank killed in a wait holds back the
                others' deadlines until its thread calls again or
                leaves) and stops; so does a replica killed later, in
                its settle (whichever call of it fails so)
       drain    it sends every other replica a mark, then takes each
                one's messages in turn (probe_from, then recv: the
                failed collective's leftovers) up to its mark; one pair's
                messages arrive in the order they were sent, so after a
                replica's mark nothing it sent before is left to be
                received
       end      it sends an end to each whose mark came and takes each
                one's end, so that nobody leaves while another still
                waits for its mark (a simnet rank parks when it leaves
                its last call, and a deadline waits for parked ranks)
     Who is gone the transport says: probe_from also ends when the
     replica waited for is gone with nothing of its left to take (a
     mark goes to a gone one too, which costs its bytes and nothing
     else), so a replica killed before the settle, during the others'
     or in its own is waited for no longer. Over simnet a death is known
     one link latency after it, as a message sent then would be: who
     counts as gone, and from when, follows the virtual times alone,
     never which thread got there first, so the clocks and the trace are
     the same in every run. A settle that hears nothing for twice
     timeout_s fails (the transport is aborted, the strategy fails, the
     message names the replica it waited for). Then, on the strategy's thread: the gone, and the late
     (entered their collective at or after the earliest deadline of one
     that settled), are dropped, and the group shrinks and retries as
     above (3-5), over new communicators; a replica that finished the
     step while others settled (it would have updated) fails the
     strategy instead, and so does a settle that finds nobody gone or
     late (the communicators failed: a dropped message). Why a drain and
     not an epoch in the tags: a transport checks the tag of the message
     at the head of a pair's queue, so a leftover there fails the next
     collective with DSGD_ERR_DESYNC whatever its tag, and nothing but a
     probe can take a message whose tag and size the receiver does not
     know; the drain leaves nothing in flight to a survivor, not even
     from the gone.

     Every worker must pass the same min_replicas (creation checks it
     with the rest of the description), so that all decide alike. A
     worker whose replicas all failed fails (the others go on). The
     retry fails with DSGD_ERR_INVALID_ARGUMENT, the strategy shrunk and
     usable, when a sliced global batch exceeds W' x max_batch. The failed
     attempt's losses stay in the survivors' TRAIN metrics (as a skipped
     step's do); the failed replicas' metrics go with them. A survivor's
     context keeps its label (its rank at creation); its messages name its
     new rank. After a shrink the communicators take one node
     (ranks_per_node 0).

   GROW

     dsgd_strategy_grow(s, joiners, count), between steps, admits count
     replicas into an elastic MIRRORED strategy whose replicas are all in
     this process: the threads stop, the kind is torn down, the joiners'
     replicas are created (ranks W..W+count-1), every replica gets a new
     communicator (a new loopback of the strategy's own; over the
     endpoints you gave, the group's ranks then the joiners' over that one
     transport), the kind is set up again, and the joiners receive rank
     0's weights, optimizer slots and step count by a broadcast over the
     new communicators (charged as on a cluster, over simnet too; the path
     a joiner in another process would take). Distributed variables are
     copied in the process (replica 0's copy; 0 for ON_READ). The sampler
     needs nothing: the next step re-shards over W + count. on_resize is
     called with survivors[i] = i for the old ranks and -1 for the
     joiners. After 4 -> 6 at step k the weights are bitwise those of 4
     replicas to step k, saved, restored into 6 and trained on.
     Spares: an elastic mirrored strategy may be created over ranks
     0..N-1 of a larger group (desc.endpoints of the group's first N
     ranks); the others are spares for a later grow. Over simnet a spare
     must not wait parked while the group trains (a parked rank holds back
     the deadlines after its clock, so a settle after a kill would wait
     for it): set it aside first (dsgd_simnet_spare) and admit it at the
     group's latest clock, between steps, before the grow
     (dsgd_simnet_admit). A killed rank cannot come back, a spare takes
     its place: 8 -> 7 by a kill at step 50, a spare grown in at step 100
     (7 -> 8) gives the bits of 8 to step 50, saved, restored into 7, to
     step 100, saved, restored into 8 and trained on.

   REGROUP (across processes)

     dsgd_strategy_regroup(s, endpoints, old_ranks), between steps, moves
     a multi-worker mirrored strategy onto a new group of W' ranks: the
     endpoints of another communicator, made by the program (the MPI
     add-on's planned leave splits its communicator, its grow merges the
     spawned processes in; see distsgd/mpi/elastic.h). Every worker of the
     new group calls it with the same old_ranks (old_ranks[g]: new rank
     g's rank in the old group, -1 for a joiner); a joiner calls it on a
     strategy it created alone (a group of its own, one rank per
     replica). The threads stop, the kind is torn down, each replica takes
     its new endpoint and a new communicator, the kind is set up again,
     and rank 0's weights, optimizer slots and step count are broadcast to
     every replica (as the grow's), so the group goes on with the weights
     of the last step; the next step re-shards over W'. Distributed
     variables keep each worker's copies (a joiner's are its own
     creation's); on_resize(user, W, W', old_ranks, s) is called, W the
     group's size before. After 3 -> 2 at step k the weights are bitwise
     those of 3 replicas to step k, saved, restored into 2 and trained on
     (the same explicit algorithm); so after 2 -> 3.
*/
#ifndef DSGD__PART_STRATEGY_ELASTIC_DECL
#define DSGD__PART_STRATEGY_ELASTIC_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* Admits count replicas into an elastic mirrored strategy between steps
   (GROW above): joiners are their endpoints, of the group the strategy
   was created over (desc.endpoints: ranks of that group that are in no
   replica's use, the spares), or NULL over the strategy's own loopback
   (it is replaced by one of W + count ranks). The group's replicas keep
   their ranks 0..W-1, joiner j becomes rank W + j; every replica gets a
   new communicator over the W + count ranks, the joiners receive the
   weights, the optimizer state and step count by broadcast from rank 0,
   and on_resize(user, W, W + count, survivors, s) is called with
   survivors[i] = i for the old ranks and -1 for the joiners.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; the
   strategy not elastic, multi-worker, or not mirrored; count outside
   1..DSGD_MAX_REPLICAS - W; joiners NULL over endpoints you gave or given
   over the strategy's own loopback; a joiner without send or recv, of
   another group's size, or whose rank is out of range, taken by a
   replica or by another joiner); nothing is changed then.
   DSGD_ERR_STATE (the strategy has failed). After the replicas' threads
   stopped: DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_SYSTEM, a backend's errors
   and the broadcast's (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED, ...): the
   strategy has then failed.
   Thread safety: the strategy's thread, outside a step and
   dsgd_strategy_run; each joiner's endpoint is then used only from its
   replica's thread (it must not be in use elsewhere). */
DSGD_API dsgd_result dsgd_strategy_grow(dsgd_strategy *s, const dsgd_transport_i *joiners, int count);
/* "failed", "gone" or "late" (dsgd_step_info.dropped_why); "unknown" for
   any other value.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_drop_reason_name(dsgd_drop_reason why);

/* Moves a multi-worker mirrored strategy onto a new group between steps
   (REGROUP above): endpoints are this worker's num_replicas endpoints of
   the new group (contiguous ranks of one size W', as at creation), and
   old_ranks (W' entries, the same on every worker) gives each new rank's
   rank in the old group, or -1 for a joiner; old_ranks[0] must not be -1
   (rank 0 broadcasts the state). A collective over the new group: every
   worker in it calls it; a worker that left calls nothing (it destroys
   its strategy). The replicas receive rank 0's weights, optimizer slots
   and step count; on_resize, when set, is called with old_ranks.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; endpoints
   or old_ranks NULL; the strategy not multi_worker_mirrored; an endpoint
   without send or recv, not contiguous or of another size; old_ranks[0]
   -1, an entry below -1, a rank twice, or this worker's replica at its
   new rank given an old rank not its own); nothing is changed then.
   DSGD_ERR_STATE (the strategy has failed). After the replicas' threads
   stopped: DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_SYSTEM and the broadcast's
   errors (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED, ...): the strategy has
   then failed.
   Thread safety: the strategy's thread, outside a step and
   dsgd_strategy_run; the endpoints are then used only from the
   replicas' threads (the old ones are no longer used: destroy them
   after). */
DSGD_API dsgd_result dsgd_strategy_regroup(dsgd_strategy *s, const dsgd_transport_i *endpoints, const int *old_ranks);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_STRATEGY_ELASTIC_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_ELASTIC) && !defined(DSGD__PART_STRATEGY_ELASTIC_IMPL)
#define DSGD__PART_STRATEGY_ELASTIC_IMPL

#include <time.h>

/* >>strategy_elastic -------------------------------------------------------- */

/* ---- the settle (SETTLE above) */

/* The tags of the settle's marks and ends: no collective's (its sequence
   number would have to reach 2^32 - 1). */
#define DSGD__EL_MARK (~(uint64_t)0)
#define DSGD__EL_END (~(uint64_t)0 - 1)

/* The transport under replica r's endpoint (the one given, also after a
   shrink), and its rank of the group's rank k. */
static const dsgd_transport_i *dsgd__el_base(const dsgd_replica *r) {
    return r->sub ? &((const dsgd__sub_ep *)r->sub)->base : &r->ep;
}
static int dsgd__el_out(const dsgd_replica *r, int k) { return r->sub ? ((const dsgd__sub_ep *)r->sub)->map[k] : k; }

/* Replica r takes replica k's messages (probe_from, then recv: the failed
   collective's leftovers) up to the one tagged want (a mark or an end;
   *got 1), or until k is gone with nothing left from it (*got 0: killed,
   as the transport says: over simnet at the virtual time of its death,
   whatever the threads' order). Each wait ends at *deadline at the
   latest, span after the last message. */
static dsgd_result dsgd__el_take(dsgd_replica *r, const dsgd_transport_i *t, int k, uint64_t want, double *deadline,
                                 int *got) {
    dsgd_strategy *s = r->s;
    for (;;) {
        uint64_t tag = 0;
        size_t bytes = 0;
        int gone = 0;
        float *buf;
        dsgd_result e = t->probe_from(t->impl, dsgd__el_out(r, k), *deadline, &tag, &bytes, &gone);
        *got = 0;
        if (e != DSGD_OK || gone) return e;
        if (!(buf = dsgd__replica_stage(r, bytes / sizeof(float) + 1))) return DSGD_ERR_OUT_OF_MEMORY;
        if ((e = t->recv(t->impl, dsgd__el_out(r, k), tag, buf, bytes, *deadline)) != DSGD_OK) return e;
        *deadline = (t->now ? t->now(t->impl) : dsgd_now()) + 2.0 * s->d.timeout_s;
        if (tag == want) {
            *got = 1;
            return DSGD_OK;
        }
    }
}

/* Replica r is gone when e is DSGD_ERR_ABORTED and nobody in this
   strategy aborted the transport (it was killed): it says so and leaves
   the transport (simnet: a rank killed in a wait holds back the others'
   deadlines until its thread calls again or leaves). Non-zero then. */
static int dsgd__el_depart(dsgd_replica *r, const dsgd_transport_i *t, dsgd_result e) {
    dsgd_strategy *s = r->s;
    int gone;
    pthread_mutex_lock(&s->mu);
    gone = e == DSGD_ERR_ABORTED && s->abort_by < 0;
    if (gone) r->el_phase = DSGD__EL_GONE;
    pthread_mutex_unlock(&s->mu);
    if (gone && !s->hub && t->leave) t->leave(t->impl);
    return gone;
}

/* s->el_settle: replica r's collective of phase 0 or 2 failed with the
   transport intact as far as this replica knows (no abort). Gone (its
   transport stopped under it: killed) it leaves the transport and stops
   here. Else it sends every other replica a mark and takes each one's
   messages (the failed collective's leftovers) up to its mark, or until
   it is gone: after a mark nothing of its sender is left between them
   (one pair's messages arrive in order). Then it sends an end to each
   whose mark came and takes each one's end, or learns that it is gone:
   no replica leaves the settle while another may still wait for its
   mark (over simnet a rank that has left its last call parks, and a
   deadline waits for parked ranks). Who is gone the transport says
   (probe_from), in the order of the events, so a replica killed during
   the settle, in its own too, is no longer waited for from its death
   on. Waits at most twice timeout_s for each message (a late replica
   learns that the others gave up by its own deadline at the latest).
   Returns res (settled), DSGD_ERR_ABORTED (killed in the settle: gone,
   which settles too) or the settle's error (the caller aborts the
   transport). */
static dsgd_result dsgd__elastic_settle(dsgd_replica *r, dsgd_result res) {
    dsgd_strategy *s = r->s;
    const dsgd_transport_i *t = dsgd__el_base(r);
    double span = 2.0 * s->d.timeout_s, deadline; /* a late replica sees its collective fail by its deadline */
    float mark = (float)r->rank;
    int have[DSGD_MAX_REPLICAS], k, got = 0, peer = -1;
    dsgd_result e = DSGD_OK;
    const char *d;
    if (dsgd__el_depart(r, t, r->el_cr)) return res;
    pthread_mutex_lock(&s->mu);
    r->el_phase = DSGD__EL_SETTLING;
    pthread_mutex_unlock(&s->mu);
    deadline = (t->now ? t->now(t->impl) : dsgd_now()) + span;
    for (k = 0; k < s->n; ++k) have[k] = 0;
    for (k = 0; k < s->n && e == DSGD_OK; ++k) /* the marks (to a gone one too: it is the transport's to say) */
        if (k != r->local &&
            (e = t->send(t->impl, dsgd__el_out(r, k), DSGD__EL_MARK, &mark, sizeof(mark), deadline)) != DSGD_OK)
            peer = k;
    for (k = 0; k < s->n && e == DSGD_OK; ++k) /* the drain */
        if (k != r->local && (e = dsgd__el_take(r, t, k, DSGD__EL_MARK, &deadline, &have[k])) != DSGD_OK) peer = k;
    for (k = 0; k < s->n && e == DSGD_OK; ++k) /* the ends */
        if (have[k] &&
            (e = t->send(t->impl, dsgd__el_out(r, k), DSGD__EL_END, &mark, sizeof(mark), deadline)) != DSGD_OK)
            peer = k;
    for (k = 0; k < s->n && e == DSGD_OK; ++k)
        if (have[k] && (e = dsgd__el_take(r, t, k, DSGD__EL_END, &deadline, &got)) != DSGD_OK) peer = k;
    d = e != DSGD_OK && t->error_message ? t->error_message(t->impl) : NULL;
    if (e != DSGD_OK && dsgd__el_depart(r, t, e)) /* killed in the settle: gone, as before it */
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_ABORTED, "elastic: its transport stopped in the settle after "
                                  "its collective failed (%s): gone%s%s", dsgd_result_string(res), d && *d ? "; " : "",
                                  d ? d : "");
    if (e != DSGD_OK)
        return dsgd_ctx_set_error(r->m.ctx, e, "elastic: after its collective failed (%s), replica %d heard nothing "
                                  "from replica(s) %d within %g s (late or gone: the step cannot be settled)%s%s",
                                  dsgd_result_string(res), r->rank, peer, span, d && *d ? "; the transport: " : "",
                                  d ? d : "");
    pthread_mutex_lock(&s->mu);
    r->el_phase = DSGD__EL_SETTLED;
    pthread_mutex_unlock(&s->mu);
    return res;
}

/* A job: a replica the shrink drops leaves the transport you gave (its
   leave member; simnet: so that nobody waits for what it might send: a
   parked rank holds back the others' deadlines and receives from any
   source for good). */
static dsgd_result dsgd__elastic_leave(dsgd_replica *r, void *user) {
    const int *keep = (const int *)user;
    const dsgd_transport_i *t = dsgd__el_base(r);
    if (!keep[r->local] && t->leave) t->leave(t->impl);
    return DSGD_OK;
}

/* ---- the desc */

static dsgd_result dsgd__elastic_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d, const dsgd__strategy_ops *ops) {
    const dsgd_strategy_elastic_desc *e = &d->elastic;
    const char *what = "dsgd_strategy_create";
    if (e->min_replicas == 0) return DSGD_OK;
    if (e->min_replicas < 0 || !(e->grace_s >= 0.0) || e->grace_s > 1e9)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: elastic: min_replicas %d or grace_s %g out of "
                                  "range (min_replicas >= 0, grace_s in 0..1e9)", what, e->min_replicas, e->grace_s);
    if (!(ops->caps & DSGD__KIND_ELASTIC))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: elastic training shrinks mirrored and "
                                  "multi_worker_mirrored strategies, not %s", what, ops->name);
    if (d->comm_hook)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: elastic with a comm hook (its per-replica "
                                  "state cannot be re-sharded over the survivors)", what);
    return DSGD_OK;
}

/* ---- the shrink */

/* The argument of the agreement: each local replica's vote (0 alive, 1
   failed, 2 failed on the batch), and replica 0's copy of the result
   (world votes, the largest step, minus the smallest). */
typedef struct dsgd__elastic_vote {
    const float *votes;
    float *out;
} dsgd__elastic_vote;

static dsgd_result dsgd__elastic_agree(dsgd_replica *r, void *user) {
    dsgd__elastic_vote *v = (dsgd__elastic_vote *)user;
    dsgd_strategy *s = r->s;
    size_t n = (size_t)s->world + 2;
    float *buf = dsgd__replica_stage(r, n);
    float step = (float)dsgd_optimizer_steps(r->opt);
    dsgd_result res;
    r->clean_fail = 1;
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    memset(buf, 0, sizeof(float) * n);
    buf[r->rank] = v->votes[r->local];
    buf[s->world] = step;
    buf[s->world + 1] = -step;
    if (s->world > 1 && (res = dsgd_allreduce(r->comm, buf, n, DSGD_REDUCE_MAX, DSGD_ALLREDUCE_AUTO, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if (r->local == 0) memcpy(v->out, buf, sizeof(float) * n);
    return DSGD_OK;
}

/* Stops the replicas' threads (they wait for a job: the step returned). */
static void dsgd__elastic_stop_threads(dsgd_strategy *s) {
    int i;
    pthread_mutex_lock(&s->mu);
    s->shutdown = 1;
    pthread_cond_broadcast(&s->cv_start);
    pthread_mutex_unlock(&s->mu);
    for (i = 0; i < s->n; ++i) {
        if (s->reps[i].thread_started) pthread_join(s->reps[i].thread, NULL);
        s->reps[i].thread_started = 0;
    }
    pthread_mutex_lock(&s->mu);
    s->shutdown = 0;
    s->gen = 0; /* a new thread has seen generation 0 */
    s->pending = 0;
    pthread_mutex_unlock(&s->mu);
}

/* Step 3 of the shrink: keep[i] says whether local replica i survives;
   survivors (world entries) are the old ranks of the new group's ranks. */
static dsgd_result dsgd__elastic_shrink(dsgd_strategy *s, const int *keep, const int *survivors, int world) {
    const char *what = "elastic shrink";
    dsgd_result res = DSGD_OK;
    int i, j, k, v;
    dsgd__elastic_stop_threads(s);
    if (s->ops->teardown) s->ops->teardown(s);
    for (i = 0; i < s->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        if (keep[i]) { /* its communicator is remade over the survivors */
            dsgd_comm_destroy(r->comm);
            r->comm = NULL;
        } else {
            dsgd__replica_destroy(r);
        }
    }
    for (v = 0; v < s->num_vars; ++v) { /* the survivors' copies, in order */
        dsgd__dvar *dv = &s->vars[v];
        for (i = 0, j = 0; i < s->n; ++i)
            if (keep[i]) {
                if (i != j) memmove(dv->copies + (size_t)j * dv->count, dv->copies + (size_t)i * dv->count,
                                    sizeof(float) * dv->count);
                ++j;
            }
    }
    for (i = 0, j = 0; i < s->n; ++i) {
        if (!keep[i]) continue;
        if (i != j) s->reps[j] = s->reps[i];
        s->reps[j].local = j;
        for (k = 0; k < world; ++k)
            if (survivors[k] == s->reps[j].rank) s->reps[j].rank = k;
        ++j;
    }
    s->n = j;
    s->world = world;
    s->first = s->reps[0].rank;
    s->shard_count = world;
    s->shard_first = s->first;
    if (s->hub) { /* the strategy's own loopback: one of the survivors */
        dsgd_transport_i *eps = (dsgd_transport_i *)dsgd__alloc(s->ctx, sizeof(dsgd_transport_i) * (size_t)s->n, what);
        dsgd_loopback_destroy(s->hub);
        s->hub = NULL;
        res = eps ? dsgd__group_endpoints(s->ctx, NULL, s->n, &s->hub, eps) : DSGD_ERR_OUT_OF_MEMORY;
        for (i = 0; i < s->n && res == DSGD_OK; ++i) s->reps[i].ep = eps[i];
        DSGD_FREE(eps);
    } else { /* the given endpoints, wrapped (also for one: a grow maps its rank) */
        for (i = 0; i < s->n && res == DSGD_OK; ++i) {
            dsgd_replica *r = &s->reps[i];
            dsgd__sub_ep *old = (dsgd__sub_ep *)r->sub;
            dsgd__sub_ep *e = (dsgd__sub_ep *)dsgd__alloc(s->ctx, sizeof(*e) + sizeof(int) * (size_t)world, what);
            if (!e) {
                res = DSGD_ERR_OUT_OF_MEMORY;
                break;
            }
            e->base = old ? old->base : r->ep;
            e->size = world;
            e->map = (int *)(void *)(e + 1);
            for (k = 0; k < world; ++k) e->map[k] = old ? old->map[survivors[k]] : survivors[k];
            DSGD_FREE(old);
            r->sub = e;
            dsgd__sub_endpoint(e, r->rank, &r->ep);
        }
    }
    for (i = 0; i < s->n && res == DSGD_OK && world > 1; ++i) {
        dsgd_replica *r = &s->reps[i];
        dsgd_comm_desc cd;
        memset(&cd, 0, sizeof(cd));
        cd.timeout_s = s->d.timeout_s;
        cd.piece_bytes = s->d.piece_bytes;
        res = dsgd_comm_create(r->m.ctx, &r->ep, &cd, &r->comm);
        if (res != DSGD_OK) dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(r->m.ctx));
    }
    if (res == DSGD_OK && s->ops->setup) res = s->ops->setup(s);
    for (i = 1; i < s->n && res == DSGD_OK; ++i) {
        if (pthread_create(&s->reps[i].thread, NULL, dsgd__replica_main, &s->reps[i]) != 0)
            res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: cannot start replica %d's thread", what, i);
        else s->reps[i].thread_started = 1;
    }
    return res;
}

/* "3, 5, 6": the ranks k (of n) whose vote is `want`, into buf. */
static void dsgd__elastic_ranks(const float *votes, int n, float want, char *buf, size_t cap) {
    size_t len = 0;
    int k;
    buf[0] = '\0';
    for (k = 0; k < n && len + 16 < cap; ++k)
        if (votes[k] == want) len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? ", " : "", k);
}

static void dsgd__elastic_sleep(double seconds) {
    struct timespec ts;
    double until = dsgd_now() + seconds;
    while (seconds > 0.0) {
        double step = seconds < 0.05 ? seconds : 0.05;
        ts.tv_sec = 0;
        ts.tv_nsec = (long)(step * 1e9);
        nanosleep(&ts, NULL);
        seconds = until - dsgd_now();
    }
}

/* One shrink of dsgd__elastic_step ("The shrink" in ELASTIC above: the
   numbers in the margin are its phases), which its helpers share. */
typedef struct dsgd__elastic_round {
    dsgd_strategy *s;
    const char *what;
    dsgd_result *res;       /* the call's result */
    int64_t step;           /* the failed step */
    int n, w;               /* this process's replicas; the group's */
    int settled;            /* a replica settled: every vote is here, the communicators failed */
    double first;           /* the earliest deadline of a settled replica's failed collective */
    char *saved;            /* the failed step's messages, kept for the report (n) */
    char *last;             /* then the call's error message */
    int *results;           /* the failed step's results (n) */
    float *votes;           /* this process's replicas' votes (n) */
    float *agreed;          /* the group's votes, then the step and -step (w + 2) */
    int *keep;              /* which of this process's replicas stay (n) */
    int *surv;              /* the survivors' ranks in the old group (alive of w) */
    int alive;
    char failed[256], alive_list[256];    /* "3, 5, 6": the failed ranks; the survivors' */
    unsigned char why[DSGD_MAX_REPLICAS]; /* each dropped rank's dsgd_drop_reason */
} dsgd__elastic_round;

/* Each replica's vote (0 alive, 1 failed, 2 a failure about the batch),
   its failed step's result and message kept for the report. 0 (the
   strategy failed) when a replica finished the step while the collectives
   of others failed. */
static int dsgd__elastic_votes(dsgd__elastic_round *e) {
    dsgd_strategy *s = e->s;
    int i;
    snprintf(e->last, DSGD__MSG_MAX, "%s", dsgd_ctx_last_error(s->ctx));
    for (i = 0; i < e->n; ++i) { /* the earliest deadline of a settled replica's failed collective */
        const dsgd_replica *r = &s->reps[i];
        if (r->el_phase == DSGD__EL_SETTLED && r->el_entered + s->d.timeout_s < e->first)
            e->first = r->el_entered + s->d.timeout_s;
    }
    for (i = 0; i < e->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        memcpy(e->saved + (size_t)i * DSGD__MSG_MAX, r->msg, DSGD__MSG_MAX);
        e->results[i] = (int)r->result;
        e->votes[i] = r->result == DSGD_OK || !r->own_error ? 0.0f
                      : r->result == DSGD_ERR_INVALID_ARGUMENT || r->result == DSGD_ERR_NON_FINITE ? 2.0f : 1.0f;
        if (e->settled && r->el_phase == DSGD__EL_GONE) e->votes[i] = 1.0f;
        /* late: it entered the collective when another had given up on it */
        if (e->settled && r->el_phase == DSGD__EL_SETTLED) e->votes[i] = r->el_entered >= e->first ? 1.0f : 0.0f;
        if (e->settled && r->result == DSGD_OK) {
            *e->res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE, "%s: elastic: replica %d finished the step while "
                                         "the collectives of others failed: cannot shrink", e->what, r->rank);
            dsgd__strategy_fail(s, e->step, e->what, dsgd_ctx_last_error(s->ctx));
            return 0;
        }
        e->keep[i] = 0;
    }
    return 1;
}

/* The group's votes, the step and -step (MAX gives the lowest step too),
   into e->agreed: in memory after a settle, else by a job; then the
   failed step's report again. 0 when the job failed (the strategy has
   failed: dispatch). */
static int dsgd__elastic_tally(dsgd__elastic_round *e) {
    dsgd_strategy *s = e->s;
    dsgd__elastic_vote vote;
    dsgd_result ar;
    int i, k;
    if (e->settled) { /* 1, in this process: every replica's vote is here; the communicators failed */
        for (k = 0; k < e->w; ++k) e->agreed[k] = e->votes[k];
        e->agreed[e->w] = (float)e->step;
        e->agreed[e->w + 1] = -(float)e->step;
    } else {
        vote.votes = e->votes;
        vote.out = e->agreed;
        ar = dsgd__strategy_dispatch(s, dsgd__elastic_agree, &vote, e->what);            /* 1 */
        if (ar != DSGD_OK) { /* a collective failed: the strategy has failed (dispatch) */
            *e->res = ar;
            return 0;
        }
    }
    for (i = 0; i < e->n; ++i) { /* the failed step's report again */
        memcpy(s->reps[i].msg, e->saved + (size_t)i * DSGD__MSG_MAX, DSGD__MSG_MAX);
        s->reps[i].result = (dsgd_result)e->results[i];
    }
    dsgd_ctx_set_error(s->ctx, *e->res, "%s", e->last);
    return 1;
}

/* Every replica was in time and none is gone, but the communicators
   failed: the strategy fails with the call's message and, after it, what
   each failed replica's transport says (simnet names a dropped message). */
static void dsgd__elastic_whole_failed(dsgd__elastic_round *e) {
    dsgd_strategy *s = e->s;
    char m[DSGD__MSG_MAX];
    int i, len = snprintf(m, sizeof(m), "%s", e->last), add;
    for (i = 0; i < e->n && len >= 0 && len < (int)sizeof(m); ++i) {
        const dsgd_transport_i *t = dsgd__el_base(&s->reps[i]);
        const char *d = e->results[i] != DSGD_OK && t->error_message ? t->error_message(t->impl) : NULL;
        if (!d || !*d || strstr(m, d)) continue;
        add = snprintf(m + len, sizeof(m) - (size_t)len, "; replica %d's transport: %s", s->reps[i].rank, d);
        len = add < 0 ? -1 : len + add;
    }
    dsgd__strategy_abort(s, 0);
    *e->res = dsgd_ctx_set_error(s->ctx, *e->res, "%s", m);
    dsgd__strategy_fail(s, e->step, e->what, m);
}

/* What the agreed votes say: 1, shrink to e->alive survivors (e->surv,
   e->keep, the rank lists); or 0, the group stays whole (a failure about
   the batch, or every replica alive) or the strategy fails (*e->res). */
static int dsgd__elastic_verdict(dsgd__elastic_round *e) {
    dsgd_strategy *s = e->s;
    const dsgd_strategy_elastic_desc *ed = &s->d.elastic;
    const float *agreed = e->agreed;
    int i, k, w = e->w;
    for (k = 0; k < w; ++k) {
        if (agreed[k] == 2.0f) return 0; /* about the batch: the group stays whole */
        if (agreed[k] == 0.0f) e->surv[e->alive++] = k;
    }
    if (agreed[w] != -agreed[w + 1]) {
        *e->res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE, "%s: elastic: the replicas are at different steps "
                                     "(%.0f to %.0f): cannot shrink", e->what, (double)-agreed[w + 1],
                                     (double)agreed[w]);
        dsgd__strategy_fail(s, e->step, e->what, dsgd_ctx_last_error(s->ctx));
        return 0;
    }
    if (e->alive == w && e->settled) { /* every replica in time and none gone, but the communicators failed */
        dsgd__elastic_whole_failed(e);
        return 0;
    }
    if (e->alive == w) return 0;
    dsgd__elastic_ranks(agreed, w, 1.0f, e->failed, sizeof(e->failed));
    dsgd__elastic_ranks(agreed, w, 0.0f, e->alive_list, sizeof(e->alive_list));
    if (e->alive < ed->min_replicas || e->alive == 0) {                                 /* 2 */
        if (e->settled) dsgd__strategy_abort(s, 0); /* whoever is still in the transport returns */
        dsgd__elastic_sleep(ed->grace_s);
        *e->res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_ABORTED, "%s: elastic: at step %lld replica(s) %s failed; %d "
                                     "of %d replicas survive (ranks %s), fewer than min_replicas %d, and none "
                                     "joined within grace_s %g s (%s)", e->what, (long long)e->step, e->failed,
                                     e->alive, w, e->alive ? e->alive_list : "none", ed->min_replicas,
                                     ed->grace_s, e->last);
        dsgd__strategy_fail(s, e->step, e->what, dsgd_ctx_last_error(s->ctx));
        return 0;
    }
    for (i = 0, k = 0; i < e->n; ++i) e->keep[i] = agreed[s->reps[i].rank] == 0.0f;
    for (i = 0; i < e->n; ++i) k += e->keep[i];
    if (k == 0) {
        *e->res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_ABORTED, "%s: elastic: at step %lld every replica of this "
                                     "worker failed; the group goes on with ranks %s of the others (%s)", e->what,
                                     (long long)e->step, e->alive_list, e->last);
        dsgd__strategy_fail(s, e->step, e->what, dsgd_ctx_last_error(s->ctx));
        return 0;
    }
    return 1;
}

/* Why each dropped rank was dropped, read before the shrink renumbers the
   replicas. */
static void dsgd__elastic_reasons(dsgd__elastic_round *e) {
    dsgd_strategy *s = e->s;
    int i, k;
    for (k = 0; k < e->w; ++k) e->why[k] = DSGD_DROP_FAILED; /* a replica of another worker: its own failure */
    for (i = 0; i < e->n && e->settled; ++i) {
        const dsgd_replica *r = &s->reps[i];
        if (r->el_phase == DSGD__EL_GONE) e->why[r->rank] = DSGD_DROP_GONE;
        else if (r->el_phase == DSGD__EL_SETTLED && r->el_entered >= e->first) e->why[r->rank] = DSGD_DROP_LATE;
    }
}

/* After the shrink: the dropped ranks and their reasons, in the call's
   numbering (dsgd_step_info.dropped), and the survivors' numbering. */
static void dsgd__elastic_drops(dsgd__elastic_round *e) {
    dsgd_strategy *s = e->s;
    int i, k, w = e->w;
    if (!s->resized) /* the first shrink of this call: the ranks are those it began with */
        for (k = 0; k < w; ++k) s->call_rank[k] = k;
    for (k = 0; k < w; ++k) /* dsgd_step_info.dropped: in the call's numbering */
        if (e->agreed[k] != 0.0f) {
            s->drop_rank[s->dropped] = s->call_rank[k];
            s->drop_why[s->dropped++] = (unsigned char)e->why[k];
        }
    for (k = 0; k < e->alive; ++k) s->call_rank[k] = s->call_rank[e->surv[k]];
    s->resized = 1;
    for (i = 0; i < s->n; ++i) { /* dsgd_strategy_wait_report's window restarts: the ranks were renumbered */
        dsgd_replica *r = &s->reps[i];
        if (r->wait_at) memset(r->wait_at, 0, sizeof(double) * 3 * (size_t)e->alive);
        r->wait_time = 0.0;
        r->wait_steps = 0;
    }
}

/* Whether the step's global batch fits the survivors (a batch function's
   does); else *e->res says that the step was not retried. */
static int dsgd__elastic_retry_fits(dsgd__elastic_round *e, const dsgd__step_args *a) {
    dsgd_strategy *s = e->s;
    if (!a->fn && (long long)a->count > (long long)e->alive * s->d.model.max_batch) {
        *e->res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                     "%s: shrunk to %d replicas after replica(s) %s failed, but the global batch of "
                                     "%d exceeds %d x max_batch %d: the step was not retried (call again with a "
                                     "smaller batch)", e->what, e->alive, e->failed, a->count, e->alive,
                                     s->d.model.max_batch);
        return 0;
    }
    return 1;
}

/* After a failed step (s->elastic): shrinks and returns 1 (retry the step)
   when replicas failed on their own before the update and at least
   min_replicas survive; else 0, with *res the call's error. */
static int dsgd__elastic_step(dsgd_strategy *s, const dsgd__step_args *a, const char *what, dsgd_result *res) {
    const dsgd_strategy_elastic_desc *ed = &s->d.elastic;
    dsgd__elastic_round e;
    dsgd_result ar;
    int i, n = s->n, w = s->world, go = 0;
    memset(&e, 0, sizeof(e));
    e.s = s;
    e.what = what;
    e.res = res;
    e.n = n;
    e.w = w;
    e.first = HUGE_VAL;
    for (i = 0; i < n; ++i) e.settled |= dsgd__replica_settled(&s->reps[i]);
    if (s->failed || n == 0 || (!e.settled && s->reps[0].stop_by < 0)) return 0; /* not agreed before the update */
    e.step = dsgd_optimizer_steps(s->reps[0].opt);
    /* the failed step's results and messages, kept for the report */
    e.saved = (char *)dsgd__alloc(s->ctx, (size_t)(n + 1) * DSGD__MSG_MAX, what);
    e.votes = (float *)dsgd__alloc(s->ctx, sizeof(float) * ((size_t)n + (size_t)w + 2), what);
    e.keep = (int *)dsgd__alloc(s->ctx, sizeof(int) * (2 * (size_t)n + (size_t)w), what);
    if (!e.saved || !e.votes || !e.keep) {
        DSGD_FREE(e.saved);
        DSGD_FREE(e.votes);
        DSGD_FREE(e.keep);
        dsgd__strategy_fail(s, e.step, what, "elastic: out of memory before the shrink");
        *res = DSGD_ERR_OUT_OF_MEMORY;
        return 0;
    }
    e.last = e.saved + (size_t)n * DSGD__MSG_MAX;
    e.agreed = e.votes + n;
    e.surv = e.keep + n;
    e.results = e.surv + w;
    if (!dsgd__elastic_votes(&e) || !dsgd__elastic_tally(&e) || !dsgd__elastic_verdict(&e)) goto done; /* 1, 2 */
    dsgd_ctx_log(s->ctx, DSGD_LOG_WARN, "%s: step %lld: replica(s) %s failed (%s); shrinking %d -> %d replicas", what,
                 (long long)e.step, e.failed, e.last, w, e.alive);
    dsgd__elastic_reasons(&e);
    if (!s->hub) { /* the dropped leave (the gone left in their settle) */
        int stay[DSGD_MAX_REPLICAS];
        for (i = 0; i < n; ++i) stay[i] = e.keep[i] || s->reps[i].el_phase == DSGD__EL_GONE;
        (void)dsgd__strategy_dispatch(s, dsgd__elastic_leave, stay, what);
    }
    if ((ar = dsgd__elastic_shrink(s, e.keep, e.surv, e.alive)) != DSGD_OK) {           /* 3 */
        char m[DSGD__MSG_MAX];
        snprintf(m, sizeof(m), "%s", dsgd_ctx_last_error(s->ctx));
        *res = dsgd_ctx_set_error(s->ctx, ar, "%s: elastic: the shrink to %d replicas failed: %s", what, e.alive, m);
        dsgd__strategy_fail(s, e.step, what, dsgd_ctx_last_error(s->ctx));
        goto done;
    }
    dsgd__elastic_drops(&e);
    if (ed->on_resize) ed->on_resize(ed->user, w, e.alive, e.surv, s);                   /* 4 */
    if (!dsgd__elastic_retry_fits(&e, a)) goto done;
    go = 1;                                                                              /* 5 */
done:
    DSGD_FREE(e.saved);
    DSGD_FREE(e.votes);
    DSGD_FREE(e.keep);
    return go;
}

/* ---- the grow (GROW above) */

/* A job: rank 0's parameters, optimizer slots and step count (four 16-bit
   pieces, exact as floats) to every replica by broadcast. */
static dsgd_result dsgd__elastic_admit(dsgd_replica *r, void *user) {
    const dsgd_backend_i *be = &r->m.be;
    size_t p = dsgd_model_num_params(r->m.model);
    int ns = dsgd_optimizer_num_slots(r->opt), k;
    size_t n = p * (size_t)(1 + ns) + 4;
    float *buf = dsgd__replica_stage(r, n);
    uint64_t t = 0;
    dsgd_result res = DSGD_OK;
    DSGD__UNUSED(user);
    if (!buf) return DSGD_ERR_OUT_OF_MEMORY;
    if (r->rank == 0) {
        t = (uint64_t)dsgd_optimizer_steps(r->opt);
        res = dsgd_model_get_params(r->m.model, buf, p);
        for (k = 0; k < ns && res == DSGD_OK; ++k) res = dsgd_optimizer_read_slot(r->opt, k, 0, p, buf + p * (size_t)(1 + k));
        for (k = 0; k < 4; ++k) buf[n - 4 + (size_t)k] = (float)((t >> (16 * k)) & 0xffff);
        if (res != DSGD_OK) return res;
    }
    if ((res = dsgd_broadcast(r->comm, buf, n, 0, 0.0)) != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    if (r->rank == 0) return DSGD_OK;
    res = dsgd_model_set_params(r->m.model, buf, p);
    for (k = 0; k < ns && res == DSGD_OK; ++k)
        res = be->write(be->impl, dsgd__optimizer_slot_ref(r->opt, k), buf + p * (size_t)(1 + k), p);
    for (k = 0, t = 0; k < 4; ++k) t |= (uint64_t)buf[n - 4 + (size_t)k] << (16 * k);
    dsgd__optimizer_set_steps(r->opt, (int64_t)t);
    return res;
}

/* A replica's communicator over its (new) endpoint and its wait window. */
static dsgd_result dsgd__elastic_comm(dsgd_strategy *s, dsgd_replica *r) {
    dsgd_comm_desc cd;
    dsgd_result res;
    memset(&cd, 0, sizeof(cd));
    cd.timeout_s = s->d.timeout_s;
    cd.piece_bytes = s->d.piece_bytes;
    if ((res = dsgd_comm_create(r->m.ctx, &r->ep, &cd, &r->comm)) != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(r->m.ctx));
    DSGD_FREE(r->wait_at);
    r->wait_at = (double *)dsgd__alloc(s->ctx, sizeof(double) * 3 * (size_t)s->world, "dsgd_strategy_grow");
    if (!r->wait_at) return DSGD_ERR_OUT_OF_MEMORY;
    memset(r->wait_at, 0, sizeof(double) * 3 * (size_t)s->world);
    r->wait_sum = r->wait_at + s->world;
    r->wait_now = r->wait_sum + s->world;
    r->wait_time = 0.0;
    r->wait_steps = 0;
    return DSGD_OK;
}

/* The regroup, once the threads stopped: the slots, the variables'
   copies, the endpoints (basemap: the new group's ranks in the given
   transport), the joiners' replicas, the communicators, the kind, the
   threads, the state. */
static dsgd_result dsgd__elastic_grow(dsgd_strategy *s, const dsgd_transport_i *joiners, int count, const int *basemap) {
    const char *what = "dsgd_strategy_grow";
    int w = s->n, nw = w + count, i, v, rpn = s->d.ranks_per_node;
    dsgd_result res = DSGD_OK;
    dsgd_replica *reps = (dsgd_replica *)DSGD_REALLOC(s->reps, sizeof(dsgd_replica) * (size_t)nw);
    if (!reps) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    s->reps = reps;
    memset(reps + w, 0, sizeof(dsgd_replica) * (size_t)count);
    for (i = 0; i < w; ++i) {
        dsgd_comm_destroy(reps[i].comm);
        reps[i].comm = NULL;
    }
    for (v = 0; v < s->num_vars; ++v) { /* a joiner's copies: replica 0's (ON_READ: its own, 0) */
        dsgd__dvar *dv = &s->vars[v];
        float *c = (float *)DSGD_REALLOC(dv->copies, sizeof(float) * dv->count * (size_t)nw);
        if (!c) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
        dv->copies = c;
        for (i = w; i < nw; ++i) {
            if (dv->sync == DSGD_SYNC_ON_READ) memset(c + (size_t)i * dv->count, 0, sizeof(float) * dv->count);
            else memcpy(c + (size_t)i * dv->count, c, sizeof(float) * dv->count);
        }
    }
    s->n = s->world = s->shard_count = nw;
    s->first = s->shard_first = 0;
    if (!joiners) { /* the strategy's own loopback: one of nw ranks */
        dsgd_transport_i *eps = (dsgd_transport_i *)dsgd__alloc(s->ctx, sizeof(dsgd_transport_i) * (size_t)nw, what);
        if (s->hub) dsgd_loopback_destroy(s->hub);
        s->hub = NULL;
        res = eps ? dsgd__group_endpoints(s->ctx, NULL, nw, &s->hub, eps) : DSGD_ERR_OUT_OF_MEMORY;
        for (i = 0; i < nw && res == DSGD_OK; ++i) reps[i].ep = eps[i];
        DSGD_FREE(eps);
    } else {
        for (i = 0; i < nw && res == DSGD_OK; ++i) {
            dsgd_replica *r = &reps[i];
            dsgd__sub_ep *old = (dsgd__sub_ep *)r->sub;
            dsgd__sub_ep *e = (dsgd__sub_ep *)dsgd__alloc(s->ctx, sizeof(*e) + sizeof(int) * (size_t)nw, what);
            if (!e) {
                res = DSGD_ERR_OUT_OF_MEMORY;
                break;
            }
            e->base = i >= w ? joiners[i - w] : old ? old->base : r->ep;
            e->size = nw;
            e->map = (int *)(void *)(e + 1);
            memcpy(e->map, basemap, sizeof(int) * (size_t)nw);
            DSGD_FREE(old);
            r->sub = e;
            dsgd__sub_endpoint(e, i, &r->ep);
        }
    }
    s->d.ranks_per_node = 0; /* after a resize the communicators take one node */
    for (i = w; i < nw && res == DSGD_OK; ++i) {
        dsgd_transport_i ep = reps[i].ep;
        void *sub = reps[i].sub;
        res = dsgd__replica_create(s, i);
        reps[i].ep = ep;
        reps[i].sub = sub;
        reps[i].stop_by = -1;
    }
    s->d.ranks_per_node = rpn;
    for (i = 0; i < w && res == DSGD_OK; ++i) res = dsgd__elastic_comm(s, &reps[i]);
    if (res == DSGD_OK && s->ops->setup) res = s->ops->setup(s);
    for (i = 1; i < nw && res == DSGD_OK; ++i) {
        if (pthread_create(&reps[i].thread, NULL, dsgd__replica_main, &reps[i]) != 0)
            res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: cannot start replica %d's thread", what, i);
        else reps[i].thread_started = 1;
    }
    if (res == DSGD_OK) res = dsgd__strategy_dispatch(s, dsgd__elastic_admit, NULL, what);
    return res;
}

DSGD_API dsgd_result dsgd_strategy_grow(dsgd_strategy *s, const dsgd_transport_i *joiners, int count) {
    const char *what = "dsgd_strategy_grow";
    int basemap[DSGD_MAX_REPLICAS], surv[DSGD_MAX_REPLICAS];
    int w, i, j, size = 0, given;
    int64_t step;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, what) != DSGD_OK) return DSGD_ERR_STATE;
    w = s->world;
    if (!s->elastic || !(s->ops->caps & DSGD__KIND_GROW) || s->n != w || w < 1)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: grows an elastic mirrored strategy "
                                  "(desc.elastic.min_replicas > 0), not %s%s", what, s->ops->name,
                                  s->elastic ? "" : " without elastic");
    if (count < 1 || count > DSGD_MAX_REPLICAS - w)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d joiners (1..%d for a group of %d)", what,
                                  count, DSGD_MAX_REPLICAS - w, w);
    given = s->d.endpoints != NULL; /* the desc's pointer, as a flag only */
    if (given != (joiners != NULL))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %s", what,
                                  given ? "joiners is NULL, but the strategy runs over endpoints you gave: pass the "
                                          "joiners' endpoints of that group"
                                        : "the strategy runs over a loopback of its own: pass joiners NULL");
    for (i = 0; i < w; ++i) { /* the group's ranks in the transport you gave */
        const dsgd_replica *r = &s->reps[i];
        const dsgd__sub_ep *e = (const dsgd__sub_ep *)r->sub;
        basemap[i] = e ? e->map[r->rank] : r->ep.rank;
        size = e ? e->base.size : r->ep.size;
    }
    for (j = 0; given && j < count; ++j) {
        const dsgd_transport_i *t = &joiners[j];
        int taken = 0;
        for (i = 0; i < w + j; ++i) taken |= basemap[i] == t->rank;
        if (!t->send || !t->recv || t->size != size || t->rank < 0 || t->rank >= size || taken)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: joiners[%d] is rank %d of %d%s; it needs a rank of the group of %d that no "
                                      "replica or other joiner has", what, j, t->rank, t->size,
                                      t->send && t->recv ? "" : " without send or recv", size);
        basemap[w + j] = t->rank;
    }
    step = dsgd_optimizer_steps(s->reps[0].opt);
    dsgd_ctx_log(s->ctx, DSGD_LOG_INFO, "%s: step %lld: growing %d -> %d replicas", what, (long long)step, w,
                 w + count);
    dsgd__elastic_stop_threads(s);
    if (s->ops->teardown) s->ops->teardown(s);
    if ((res = dsgd__elastic_grow(s, joiners, count, basemap)) != DSGD_OK) {
        char m[DSGD__MSG_MAX];
        snprintf(m, sizeof(m), "%s", dsgd_ctx_last_error(s->ctx));
        res = dsgd_ctx_set_error(s->ctx, res, "%s: elastic: the grow %d -> %d failed: %s", what, w, w + count, m);
        dsgd__strategy_fail(s, step, what, dsgd_ctx_last_error(s->ctx));
        return res;
    }
    for (i = 0; i < w + count; ++i) surv[i] = i < w ? i : -1;
    if (s->d.elastic.on_resize) s->d.elastic.on_resize(s->d.elastic.user, w, w + count, surv, s);
    return DSGD_OK;
}

DSGD_API const char *dsgd_drop_reason_name(dsgd_drop_reason why) {
    switch (why) {
    case DSGD_DROP_FAILED: return "failed";
    case DSGD_DROP_GONE: return "gone";
    case DSGD_DROP_LATE: return "late";
    default: return "unknown";
    }
}

/* Arms a created strategy: min_replicas fits the group. */
static dsgd_result dsgd__elastic_arm(dsgd_strategy *s) {
    int m = s->d.elastic.min_replicas;
    if (m == 0) return DSGD_OK;
    if (m > s->world)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: elastic min_replicas %d exceeds the %d replicas in sync", m,
                                  s->world);
    s->elastic = dsgd__elastic_step;
    if (!s->hub && s->n > 1 && s->world == s->n) { /* SETTLE: the endpoints you gave, every replica here */
        int i, ok = 1;
        for (i = 0; i < s->n; ++i) ok &= dsgd__el_base(&s->reps[i])->probe_from != NULL;
        if (ok) s->el_settle = dsgd__elastic_settle;
    }
    return DSGD_OK;
}

/* ---- the regroup (REGROUP above) */

/* Once the threads stopped: the new endpoints, communicators, the kind,
   the threads, rank 0's state by broadcast. */
static dsgd_result dsgd__elastic_rebind(dsgd_strategy *s, const dsgd_transport_i *eps) {
    const char *what = "dsgd_strategy_regroup";
    int i, nw = eps[0].size;
    dsgd_result res = DSGD_OK;
    s->world = s->shard_count = nw;
    s->first = s->shard_first = eps[0].rank;
    for (i = 0; i < s->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        dsgd_comm_destroy(r->comm);
        r->comm = NULL;
        DSGD_FREE(r->sub);
        r->sub = NULL;
        r->ep = eps[i];
        r->rank = s->first + i;
        DSGD_FREE(r->wait_at);
        r->wait_at = r->wait_sum = r->wait_now = NULL;
        r->wait_time = 0.0;
        r->wait_steps = 0;
    }
    for (i = 0; i < s->n && res == DSGD_OK && nw > 1; ++i) res = dsgd__elastic_comm(s, &s->reps[i]);
    if (res == DSGD_OK && s->ops->setup) res = s->ops->setup(s);
    for (i = 1; i < s->n && res == DSGD_OK; ++i) {
        if (pthread_create(&s->reps[i].thread, NULL, dsgd__replica_main, &s->reps[i]) != 0)
            res = dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: cannot start replica %d's thread", what, i);
        else s->reps[i].thread_started = 1;
    }
    if (res == DSGD_OK && nw > 1) res = dsgd__strategy_dispatch(s, dsgd__elastic_admit, NULL, what);
    return res;
}

DSGD_API dsgd_result dsgd_strategy_regroup(dsgd_strategy *s, const dsgd_transport_i *endpoints, const int *old_ranks) {
    const char *what = "dsgd_strategy_regroup";
    unsigned char seen[DSGD_MAX_REPLICAS];
    int w, nw, first, i;
    int64_t step;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, what) != DSGD_OK) return DSGD_ERR_STATE;
    if (!endpoints || !old_ranks)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: endpoints or old_ranks is NULL", what);
    if (!(s->ops->caps & DSGD__KIND_REGROUP))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: regroups a multi_worker_mirrored "
                                  "strategy, not %s", what, s->ops->name);
    w = s->world;
    nw = endpoints[0].size;
    first = endpoints[0].rank;
    if (nw < s->n || nw > DSGD_MAX_REPLICAS || first < 0 || first > nw - s->n)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: endpoints[0] is rank %d of %d, which "
                                  "leaves no room for %d replicas (at most %d in all)", what, first, nw, s->n,
                                  DSGD_MAX_REPLICAS);
    for (i = 0; i < s->n; ++i) {
        const dsgd_transport_i *t = &endpoints[i];
        int old = old_ranks[first + i];
        if (t->rank != first + i || t->size != nw || !t->send || !t->recv)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: endpoints[%d] is rank %d of %d%s; replica %d needs rank %d of %d", what, i,
                                      t->rank, t->size, t->send && t->recv ? "" : " without send or recv", i,
                                      first + i, nw);
        if (old != -1 && old != s->reps[i].rank)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: old_ranks[%d] is %d, but replica %d "
                                      "(new rank %d) was rank %d", what, first + i, old, i, first + i,
                                      s->reps[i].rank);
    }
    memset(seen, 0, sizeof(seen));
    for (i = 0; i < nw; ++i) {
        int old = old_ranks[i];
        if (old < -1 || old >= DSGD_MAX_REPLICAS || (old >= 0 && seen[old]) || (i == 0 && old < 0))
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: old_ranks[%d] is %d (an old rank "
                                      "0..%d once each, or -1 for a joiner; rank 0 not a joiner)", what, i, old,
                                      DSGD_MAX_REPLICAS - 1);
        if (old >= 0) seen[old] = 1;
    }
    step = dsgd_optimizer_steps(s->reps[0].opt);
    dsgd_ctx_log(s->ctx, DSGD_LOG_INFO, "%s: step %lld: regrouping %d -> %d replicas", what, (long long)step, w, nw);
    dsgd__elastic_stop_threads(s);
    if (s->ops->teardown) s->ops->teardown(s);
    if ((res = dsgd__elastic_rebind(s, endpoints)) != DSGD_OK) {
        char m[DSGD__MSG_MAX];
        snprintf(m, sizeof(m), "%s", dsgd_ctx_last_error(s->ctx));
        res = dsgd_ctx_set_error(s->ctx, res, "%s: elastic: the regroup %d -> %d failed: %s", what, w, nw, m);
        dsgd__strategy_fail(s, step, what, dsgd_ctx_last_error(s->ctx));
        return res;
    }
    if (s->d.elastic.on_resize) s->d.elastic.on_resize(s->d.elastic.user, w, nw, old_ranks, s);
    return DSGD_OK;
}

#endif /* DSGD__PART_STRATEGY_ELASTIC_IMPL */
