/* distsgd/mpi/elastic.h - elastic multi-worker training over MPI: a planned leave, a grow by spawn
   Part of distsgd's MPI add-on (see ../../distsgd_mpi.h, which includes the parts in order).

   ELASTIC TRAINING OVER MPI

     A dsgd_mpi_elastic holds this process's place in a group that may
     change between steps: a communicator of its own (a duplicate of
     dsgd_mpi_desc.comm, MPI_COMM_WORLD by default) and one MPI endpoint
     over it, which a DSGD_STRATEGY_MULTI_WORKER_MIRRORED strategy with one
     replica per process takes as desc.endpoints. Between steps the group
     can change in two ways, each a collective over the current group that
     ends with dsgd_strategy_regroup (REGROUP in distsgd/strategy_elastic.h):
     the survivors or the grown group go on with rank 0's weights,
     optimizer slots and step count, and the next step re-shards the
     global batch over the new size.

     A planned leave (a preemption notice). Every process calls
     dsgd_mpi_elastic_step at each step boundary with leave = 1 on a
     process that is to go (typically a flag its SIGTERM handler set:
     a volatile sig_atomic_t, the only thing a handler may write). The
     processes all-gather their flags (one small MPI_Iallgather, polled
     against timeout_s: a process that never comes is DSGD_ERR_TIMEOUT
     naming nobody in particular, never a hang); when nobody leaves that
     is all the call costs. Else MPI_Comm_split drops the leavers (the
     survivors keep their order), the survivors make an endpoint over the
     new communicator, regroup their strategies (on_resize is called) and
     destroy the old endpoint; a leaver gets *left = 1 and its strategy
     untouched: it destroys the strategy, then the dsgd_mpi_elastic (whose
     old endpoint the survivors free with it: MPI_Win_free of the
     shared-memory window is collective), then ends with MPI_Finalize.
     OpenMPI's MPI_Finalize waits for the job's other processes (a fence),
     so a leaver's process lingers until the job ends, having done no work
     and holding no transfer since its leave; its GPU and data are free.
     When every process leaves, all get *left = 1.

     A grow by spawn. dsgd_mpi_elastic_spawn, called by every process of
     the group, starts count new processes (MPI_Comm_spawn of a command,
     root rank 0), merges them in after the group (MPI_Intercomm_merge:
     the group keeps ranks 0..W-1, the joiners take W..W+count-1), makes
     an endpoint over the merged communicator and regroups. A spawned
     process (MPI_Comm_get_parent is not MPI_COMM_NULL) calls
     dsgd_mpi_elastic_join with the same strategy description instead of
     creating a strategy: it creates one over a group of its own, joins
     the merge and regroups with the others, so it receives the weights,
     the optimizer state and the step count by broadcast from rank 0.
     Both calls take a state buffer of the same size on every process,
     broadcast from rank 0 after the regroup: the program's own position
     (its sampler's epoch and batch, its schedule), so the joiner starts
     where the group is.

     Not done: several replicas per process (dsgd_mpi_transport_create_local),
     and a deadline on MPI_Comm_split, MPI_Comm_spawn and
     MPI_Intercomm_merge, which MPI does not give (once every process
     agreed to change the group they are all there). The joiner's
     description is not compared with the group's (creation's check runs
     over its own group); a joiner with another model fails the broadcast
     (its size differs).

   A CRASH

     MPI without ULFM cannot go on after a process died: OpenMPI ends the
     job. A launcher relaunches the job at one process fewer (as torchrun
     does; the repository's elastic_launch.sh is one), and the program
     resumes from its last checkpoint (dsgd_strategy_save and
     dsgd_strategy_restore move between group sizes). With ULFM (an MPI
     whose <mpi.h> or <mpi-ext.h> defines MPIX_ERR_PROC_FAILED, such as
     OpenMPI 5 built with it, or MPICH with ULFM enabled),
     dsgd_mpi_elastic_recover shrinks the communicator past the dead
     processes (MPIX_Comm_revoke, MPIX_Comm_shrink) and gives the survivors
     a new endpoint; the strategy whose step failed has failed, so the
     program creates a new one over it and restores its last checkpoint.
     This path is compiled only with such an MPI and has not been run
     (Debian 12's OpenMPI 4.1 and MPICH 4.0 do not provide ULFM); without
     it dsgd_mpi_elastic_recover returns DSGD_ERR_UNSUPPORTED.

     Sketch (one replica per process; error handling left out):

         static volatile sig_atomic_t leave_now;
         static void on_term(int sig) { (void)sig; leave_now = 1; }
         ...
         signal(SIGTERM, on_term);
         if (spawned) dsgd_mpi_elastic_join(ctx, NULL, &sd, &pos, sizeof(pos), &el, &s);
         else {
             dsgd_mpi_elastic_create(ctx, NULL, &el);
             sd.endpoints = dsgd_mpi_elastic_endpoint(el);
             dsgd_strategy_create(ctx, &sd, &s);
         }
         for (; pos.step < steps; ++pos.step) {
             dsgd_mpi_elastic_step(el, s, leave_now, &left);
             if (left) break;
             dsgd_strategy_train_step(s, x, y, count, NULL);   the global batch
         }
         dsgd_strategy_destroy(s);
         dsgd_mpi_elastic_destroy(el);
         MPI_Finalize();
*/
#ifndef DSGD_MPI__PART_ELASTIC_DECL
#define DSGD_MPI__PART_ELASTIC_DECL

/* OpenMPI declares its extensions (ULFM's MPIX_ calls, where built with
   them) in <mpi-ext.h>; MPICH in <mpi.h>. */
#if defined(OPEN_MPI) && defined(__has_include)
#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- elastic */

typedef struct dsgd_mpi_elastic dsgd_mpi_elastic;

/* Creates this process's place in an elastic group over desc->comm (desc
   may be NULL: MPI_COMM_WORLD): a duplicate of comm and an endpoint over
   it (dsgd_mpi_transport_create with the rest of desc). Collective over
   comm. timeout_s bounds the flag exchange of dsgd_mpi_elastic_step (0:
   60 s).
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing recorded; out NULL;
   timeout_s negative or not finite), DSGD_ERR_SYSTEM (MPI_Comm_dup
   failed), dsgd_mpi_transport_create's errors, DSGD_ERR_OUT_OF_MEMORY.
   On failure *out is NULL.
   Thread safety: a thread allowed to call MPI; the object is then used
   by one thread at a time (the strategy's). */
DSGD_API dsgd_result dsgd_mpi_elastic_create(dsgd_ctx *ctx, const dsgd_mpi_desc *desc, double timeout_s,
                                             dsgd_mpi_elastic **out);

/* Frees the endpoint (collective over the group it was made for, as an
   endpoint's destroy: the leavers of a step call it too) and the
   communicator. Destroy the strategy over the endpoint first. NULL is
   ignored.
   Thread safety: as dsgd_mpi_elastic_create. */
DSGD_API void dsgd_mpi_elastic_destroy(dsgd_mpi_elastic *el);

/* The current endpoint (desc.endpoints of a strategy with one replica),
   valid until the next call that changes the group; NULL for NULL.
   Errors: none.
   Thread safety: the thread that uses el. */
DSGD_API const dsgd_transport_i *dsgd_mpi_elastic_endpoint(const dsgd_mpi_elastic *el);

/* The current group's communicator (not the endpoint's duplicate), for
   the program's own collectives; MPI_COMM_NULL for NULL.
   Errors: none.
   Thread safety: the thread that uses el. */
DSGD_API MPI_Comm dsgd_mpi_elastic_comm(const dsgd_mpi_elastic *el);

/* At a step boundary, every process of the group: leave = 1 on a process
   that goes (see ELASTIC TRAINING OVER MPI). *left receives 1 on a
   process that left (its strategy untouched: destroy it, then el), 0 on
   the others, whose strategy s (multi_worker_mirrored over
   dsgd_mpi_elastic_endpoint(el)) was regrouped when anyone left.
   Errors: DSGD_ERR_INVALID_ARGUMENT (el NULL, nothing recorded; s or
   left NULL), DSGD_ERR_TIMEOUT (a process did not come within
   timeout_s: end the job, dsgd_mpi_abort), DSGD_ERR_SYSTEM (an MPI call
   failed), dsgd_mpi_transport_create's and dsgd_strategy_regroup's
   errors (the group then has no usable strategy: end the job). The
   messages go to el's context.
   Thread safety: the strategy's thread, outside a step. */
DSGD_API dsgd_result dsgd_mpi_elastic_step(dsgd_mpi_elastic *el, dsgd_strategy *s, int leave, int *left);

/* Grows the group by count processes running command with argv (as
   MPI_Comm_spawn: argv NULL-terminated, may be NULL; the command is
   looked up as mpirun would), merged in after the group; the strategy is
   regrouped and state (bytes, may be 0) broadcast from rank 0. Every
   process of the group calls it with the same arguments; each spawned
   process calls dsgd_mpi_elastic_join.
   Errors: DSGD_ERR_INVALID_ARGUMENT (el NULL, nothing recorded; s or
   command NULL; count < 1 or the group would exceed DSGD_MAX_REPLICAS;
   state NULL with bytes > 0; bytes above INT_MAX), DSGD_ERR_SYSTEM
   (MPI_Comm_spawn failed or could not start every process: the message
   has MPI's error; nothing changed), then dsgd_mpi_transport_create's,
   dsgd_strategy_regroup's and the broadcast's (DSGD_ERR_SYSTEM): end the
   job.
   Thread safety: the strategy's thread, outside a step. */
DSGD_API dsgd_result dsgd_mpi_elastic_spawn(dsgd_mpi_elastic *el, dsgd_strategy *s, const char *command, char **argv,
                                            int count, void *state, size_t bytes);

/* In a process started by dsgd_mpi_elastic_spawn: joins the group (the
   merge, a strategy of desc created over a group of its own, its
   regroup with the others) and receives state (bytes, the size the
   group passes). desc is the group's description (num_replicas 1; its
   endpoints are ignored); mdesc as for dsgd_mpi_elastic_create (its comm
   ignored). *el and *s receive the group and the strategy.
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing recorded; desc,
   el or s NULL; state NULL with bytes > 0), DSGD_ERR_STATE (this process
   was not spawned: MPI_Comm_get_parent gives MPI_COMM_NULL), then
   dsgd_strategy_create's, dsgd_mpi_transport_create's,
   dsgd_strategy_regroup's and the broadcast's. On failure *el and *s
   are NULL.
   Thread safety: a thread allowed to call MPI. */
DSGD_API dsgd_result dsgd_mpi_elastic_join(dsgd_ctx *ctx, const dsgd_mpi_desc *mdesc, const dsgd_strategy_desc *desc,
                                           void *state, size_t bytes, dsgd_mpi_elastic **el, dsgd_strategy **s);

/* After a step failed because a process died (ULFM only, see A CRASH):
   every surviving process calls it; the communicator is shrunk past the
   dead, a new endpoint made over it (dsgd_mpi_elastic_endpoint), and
   old_ranks (DSGD_MAX_REPLICAS entries, may be NULL) receives each new
   rank's old rank. The old endpoint is left to the end of the job. The
   program then creates a new strategy over the endpoint and restores its
   checkpoint.
   Errors: DSGD_ERR_INVALID_ARGUMENT (el NULL, nothing recorded),
   DSGD_ERR_UNSUPPORTED (this MPI has no ULFM: a crashed process ends the
   job; relaunch it), DSGD_ERR_SYSTEM (an MPIX call
   failed), dsgd_mpi_transport_create's.
   Thread safety: as dsgd_mpi_elastic_step. */
DSGD_API dsgd_result dsgd_mpi_elastic_recover(dsgd_mpi_elastic *el, int *old_ranks);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_MPI__PART_ELASTIC_DECL */

#if defined(DISTSGD_MPI_IMPLEMENTATION) && !defined(DSGD_NO_ELASTIC) && !defined(DSGD_MPI__PART_ELASTIC_IMPL)
#define DSGD_MPI__PART_ELASTIC_IMPL

#include <limits.h>

/* >>mpi elastic ------------------------------------------------------------ */

struct dsgd_mpi_elastic {
    dsgd_ctx *ctx;
    dsgd_mpi_desc md;    /* the endpoints' settings (comm set per endpoint) */
    double timeout_s;
    MPI_Comm comm;       /* the group (ours) */
    dsgd_transport_i ep; /* over comm */
    int has_ep;
};

static dsgd_result dsgd_mpi__el_error(dsgd_mpi_elastic *el, const char *what, const char *call, int rc) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    text[0] = '\0';
    if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof(text), "error %d", rc);
    return dsgd_ctx_set_error(el->ctx, DSGD_ERR_SYSTEM, "%s: %s failed: %s", what, call, text);
}

/* The endpoint over comm (el->ep), with the desc's settings. */
static dsgd_result dsgd_mpi__el_endpoint(dsgd_mpi_elastic *el, MPI_Comm comm, dsgd_transport_i *out) {
    dsgd_mpi_desc md = el->md;
    md.comm = comm;
    return dsgd_mpi_transport_create(el->ctx, &md, out);
}

/* Takes a new communicator and endpoint: the old endpoint is destroyed
   (collective over the old group, whose leavers destroy theirs in
   dsgd_mpi_elastic_destroy) and the old communicator freed. */
static void dsgd_mpi__el_swap(dsgd_mpi_elastic *el, MPI_Comm comm, const dsgd_transport_i *ep) {
    if (el->has_ep) el->ep.destroy(el->ep.impl);
    if (el->comm != MPI_COMM_NULL) MPI_Comm_free(&el->comm);
    el->comm = comm;
    el->ep = *ep;
    el->has_ep = 1;
}

DSGD_API dsgd_result dsgd_mpi_elastic_create(dsgd_ctx *ctx, const dsgd_mpi_desc *desc, double timeout_s,
                                             dsgd_mpi_elastic **out) {
    const char *what = "dsgd_mpi_elastic_create";
    dsgd_mpi_elastic *el;
    dsgd_transport_i ep;
    MPI_Comm comm = MPI_COMM_NULL;
    int rc;
    dsgd_result res;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (out) *out = NULL;
    if (!out || !(timeout_s >= 0.0) || timeout_s > 1e9)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL or timeout_s %g out of range "
                                  "(0..1e9)", what, out ? timeout_s : 0.0);
    el = (dsgd_mpi_elastic *)dsgd__alloc(ctx, sizeof(*el), what);
    if (!el) return DSGD_ERR_OUT_OF_MEMORY;
    memset(el, 0, sizeof(*el));
    el->ctx = ctx;
    if (desc) el->md = *desc;
    el->timeout_s = timeout_s > 0.0 ? timeout_s : 60.0;
    el->comm = MPI_COMM_NULL;
    rc = MPI_Comm_dup(desc && desc->comm != MPI_COMM_NULL && desc->comm != 0 ? desc->comm : MPI_COMM_WORLD, &comm);
    if (rc != MPI_SUCCESS) {
        res = dsgd_mpi__el_error(el, what, "MPI_Comm_dup", rc);
        DSGD_FREE(el);
        return res;
    }
    if ((res = dsgd_mpi__el_endpoint(el, comm, &ep)) != DSGD_OK) {
        MPI_Comm_free(&comm);
        DSGD_FREE(el);
        return res;
    }
    dsgd_mpi__el_swap(el, comm, &ep);
    *out = el;
    return DSGD_OK;
}

DSGD_API void dsgd_mpi_elastic_destroy(dsgd_mpi_elastic *el) {
    if (!el) return;
    if (el->has_ep) el->ep.destroy(el->ep.impl);
    if (el->comm != MPI_COMM_NULL) MPI_Comm_free(&el->comm);
    DSGD_FREE(el);
}

DSGD_API const dsgd_transport_i *dsgd_mpi_elastic_endpoint(const dsgd_mpi_elastic *el) {
    return el && el->has_ep ? &el->ep : NULL;
}

DSGD_API MPI_Comm dsgd_mpi_elastic_comm(const dsgd_mpi_elastic *el) { return el ? el->comm : MPI_COMM_NULL; }

/* All-gathers one int per process on el->comm, polled against timeout_s. */
static dsgd_result dsgd_mpi__el_gather(dsgd_mpi_elastic *el, const char *what, int mine, int *all) {
    MPI_Request req;
    double deadline = dsgd_now() + el->timeout_s;
    int rc, done = 0, polls = 0;
    rc = MPI_Iallgather(&mine, 1, MPI_INT, all, 1, MPI_INT, el->comm, &req);
    if (rc != MPI_SUCCESS) return dsgd_mpi__el_error(el, what, "MPI_Iallgather", rc);
    for (;;) {
        if ((rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE)) != MPI_SUCCESS)
            return dsgd_mpi__el_error(el, what, "MPI_Test", rc);
        if (done) return DSGD_OK;
        if (dsgd_now() >= deadline)
            return dsgd_ctx_set_error(el->ctx, DSGD_ERR_TIMEOUT, "%s: not every process of the group came to the "
                                      "step boundary within %g s (the all-gather of the leave flags is pending: "
                                      "end the job, dsgd_mpi_abort)", what, el->timeout_s);
        if (++polls > 64) sched_yield();
    }
}

DSGD_API dsgd_result dsgd_mpi_elastic_step(dsgd_mpi_elastic *el, dsgd_strategy *s, int leave, int *left) {
    const char *what = "dsgd_mpi_elastic_step";
    int flags[DSGD_MAX_REPLICAS], old_ranks[DSGD_MAX_REPLICAS];
    int size = 0, rank = 0, i, w = 0, rc;
    MPI_Comm comm = MPI_COMM_NULL;
    dsgd_transport_i ep;
    dsgd_result res;
    if (!el) return DSGD_ERR_INVALID_ARGUMENT;
    if (left) *left = 0;
    if (!s || !left) return dsgd_ctx_set_error(el->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: s or left is NULL", what);
    MPI_Comm_size(el->comm, &size);
    MPI_Comm_rank(el->comm, &rank);
    if (size > DSGD_MAX_REPLICAS)
        return dsgd_ctx_set_error(el->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: a group of %d processes (at most %d)",
                                  what, size, DSGD_MAX_REPLICAS);
    if ((res = dsgd_mpi__el_gather(el, what, leave ? 1 : 0, flags)) != DSGD_OK) return res;
    for (i = 0; i < size; ++i)
        if (!flags[i]) old_ranks[w++] = i;
    if (w == size) return DSGD_OK; /* nobody leaves: the common case, one all-gather */
    *left = leave ? 1 : 0;
    if (w == 0) return DSGD_OK; /* everybody leaves */
    rc = MPI_Comm_split(el->comm, leave ? MPI_UNDEFINED : 0, rank, &comm);
    if (rc != MPI_SUCCESS) return dsgd_mpi__el_error(el, what, "MPI_Comm_split", rc);
    if (leave) return DSGD_OK; /* comm is MPI_COMM_NULL; the old endpoint goes with el */
    dsgd_ctx_log(el->ctx, DSGD_LOG_INFO, "%s: %d of %d processes leave; the group goes on with %d", what, size - w,
                 size, w);
    if ((res = dsgd_mpi__el_endpoint(el, comm, &ep)) != DSGD_OK) {
        MPI_Comm_free(&comm);
        return res;
    }
    res = dsgd_strategy_regroup(s, &ep, old_ranks);
    dsgd_mpi__el_swap(el, comm, &ep); /* the strategy uses ep now (or has failed) */
    return res;
}

/* After the merge (comm, this process's rank in it): the endpoint, the
   regroup, the swap, the state's broadcast. */
static dsgd_result dsgd_mpi__el_regroup(dsgd_mpi_elastic *el, dsgd_strategy *s, MPI_Comm comm, const int *old_ranks,
                                        void *state, size_t bytes, const char *what) {
    dsgd_transport_i ep;
    dsgd_result res;
    int rc;
    if ((res = dsgd_mpi__el_endpoint(el, comm, &ep)) != DSGD_OK) {
        MPI_Comm_free(&comm);
        return res;
    }
    res = dsgd_strategy_regroup(s, &ep, old_ranks);
    dsgd_mpi__el_swap(el, comm, &ep);
    if (res != DSGD_OK) return res;
    if (bytes > 0 && (rc = MPI_Bcast(state, (int)bytes, MPI_BYTE, 0, el->comm)) != MPI_SUCCESS)
        return dsgd_mpi__el_error(el, what, "MPI_Bcast of the state", rc);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_mpi_elastic_spawn(dsgd_mpi_elastic *el, dsgd_strategy *s, const char *command, char **argv,
                                            int count, void *state, size_t bytes) {
    const char *what = "dsgd_mpi_elastic_spawn";
    int old_ranks[DSGD_MAX_REPLICAS], errs[DSGD_MAX_REPLICAS];
    int size = 0, i, rc, started = 0;
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    if (!el) return DSGD_ERR_INVALID_ARGUMENT;
    MPI_Comm_size(el->comm, &size);
    if (!s || !command || count < 1 || count > DSGD_MAX_REPLICAS - size || (!state && bytes > 0) ||
        bytes > (size_t)INT_MAX)
        return dsgd_ctx_set_error(el->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: s or command NULL, count %d outside "
                                  "1..%d (a group of %d), or state NULL with %zu bytes (at most INT_MAX)", what,
                                  count, DSGD_MAX_REPLICAS - size, size, bytes);
    for (i = 0; i < count; ++i) errs[i] = MPI_SUCCESS;
    rc = MPI_Comm_spawn(command, argv ? argv : MPI_ARGV_NULL, count, MPI_INFO_NULL, 0, el->comm, &inter, errs);
    if (rc != MPI_SUCCESS) return dsgd_mpi__el_error(el, what, "MPI_Comm_spawn", rc);
    for (i = 0; i < count; ++i) started += errs[i] == MPI_SUCCESS;
    if (started != count) {
        MPI_Comm_free(&inter);
        return dsgd_ctx_set_error(el->ctx, DSGD_ERR_SYSTEM, "%s: MPI_Comm_spawn started %d of %d processes of %s",
                                  what, started, count, command);
    }
    rc = MPI_Intercomm_merge(inter, 0, &merged); /* the group first, in its order */
    MPI_Comm_free(&inter);
    if (rc != MPI_SUCCESS) return dsgd_mpi__el_error(el, what, "MPI_Intercomm_merge", rc);
    for (i = 0; i < size + count; ++i) old_ranks[i] = i < size ? i : -1;
    dsgd_ctx_log(el->ctx, DSGD_LOG_INFO, "%s: %d processes join; the group goes on with %d", what, count,
                 size + count);
    return dsgd_mpi__el_regroup(el, s, merged, old_ranks, state, bytes, what);
}

DSGD_API dsgd_result dsgd_mpi_elastic_join(dsgd_ctx *ctx, const dsgd_mpi_desc *mdesc, const dsgd_strategy_desc *desc,
                                           void *state, size_t bytes, dsgd_mpi_elastic **el, dsgd_strategy **s) {
    const char *what = "dsgd_mpi_elastic_join";
    int old_ranks[DSGD_MAX_REPLICAS];
    int size = 0, rsize = 0, i, rc;
    MPI_Comm parent = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    dsgd_mpi_elastic *e = NULL;
    dsgd_strategy *st = NULL;
    dsgd_strategy_desc d;
    dsgd_mpi_desc md;
    dsgd_result res;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (el) *el = NULL;
    if (s) *s = NULL;
    if (!desc || !el || !s || (!state && bytes > 0) || bytes > (size_t)INT_MAX)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: desc, el or s NULL, or state NULL with %zu "
                                  "bytes (at most INT_MAX)", what, bytes);
    if ((rc = MPI_Comm_get_parent(&parent)) != MPI_SUCCESS || parent == MPI_COMM_NULL)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: this process was not started by "
                                  "dsgd_mpi_elastic_spawn (it has no parent communicator)", what);
    MPI_Comm_remote_size(parent, &rsize);
    /* alone first: its own group of one, so that creation's collectives need nobody */
    if (mdesc) md = *mdesc;
    else memset(&md, 0, sizeof(md));
    md.comm = MPI_COMM_SELF;
    if ((res = dsgd_mpi_elastic_create(ctx, &md, 0.0, &e)) != DSGD_OK) return res;
    d = *desc;
    d.endpoints = dsgd_mpi_elastic_endpoint(e);
    if ((res = dsgd_strategy_create(ctx, &d, &st)) != DSGD_OK) {
        dsgd_mpi_elastic_destroy(e);
        return res;
    }
    if ((rc = MPI_Intercomm_merge(parent, 1, &merged)) != MPI_SUCCESS) {
        res = dsgd_mpi__el_error(e, what, "MPI_Intercomm_merge", rc);
        dsgd_strategy_destroy(st);
        dsgd_mpi_elastic_destroy(e);
        return res;
    }
    MPI_Comm_size(merged, &size);
    for (i = 0; i < size && i < DSGD_MAX_REPLICAS; ++i) old_ranks[i] = i < rsize ? i : -1;
    if ((res = dsgd_mpi__el_regroup(e, st, merged, old_ranks, state, bytes, what)) != DSGD_OK) {
        dsgd_strategy_destroy(st);
        dsgd_mpi_elastic_destroy(e);
        return res;
    }
    *el = e;
    *s = st;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_mpi_elastic_recover(dsgd_mpi_elastic *el, int *old_ranks) {
    const char *what = "dsgd_mpi_elastic_recover";
#if defined(MPIX_ERR_PROC_FAILED)
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Group was, now;
    dsgd_transport_i ep;
    dsgd_result res;
    int i, n = 0, rc, ranks[DSGD_MAX_REPLICAS];
    if (!el) return DSGD_ERR_INVALID_ARGUMENT;
    MPIX_Comm_revoke(el->comm); /* everyone still inside a call on it returns */
    if ((rc = MPIX_Comm_shrink(el->comm, &comm)) != MPI_SUCCESS) return dsgd_mpi__el_error(el, what, "MPIX_Comm_shrink", rc);
    MPI_Comm_size(comm, &n);
    if (old_ranks && n <= DSGD_MAX_REPLICAS) {
        MPI_Comm_group(el->comm, &was);
        MPI_Comm_group(comm, &now);
        for (i = 0; i < n; ++i) ranks[i] = i;
        MPI_Group_translate_ranks(now, n, ranks, was, old_ranks);
        MPI_Group_free(&was);
        MPI_Group_free(&now);
    }
    if ((res = dsgd_mpi__el_endpoint(el, comm, &ep)) != DSGD_OK) {
        MPI_Comm_free(&comm);
        return res;
    }
    /* the old endpoint and communicator stay to the end of the job: their
       collectives (the window's free) would wait for the dead */
    el->comm = comm;
    el->ep = ep;
    el->has_ep = 1;
    return DSGD_OK;
#else
    if (!el) return DSGD_ERR_INVALID_ARGUMENT;
    (void)old_ranks;
    return dsgd_ctx_set_error(el->ctx, DSGD_ERR_UNSUPPORTED, "%s: this MPI has no ULFM (MPIX_Comm_shrink; "
                              "<mpi.h> does not define MPIX_ERR_PROC_FAILED): a crashed process ends the job; "
                              "relaunch it at fewer processes from the last checkpoint", what);
#endif
}

#endif /* DSGD_MPI__PART_ELASTIC_IMPL */
