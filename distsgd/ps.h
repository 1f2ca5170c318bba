/* distsgd/ps.h - the parameter-server engine: servers own the variables and the optimizer state and apply every pushed gradient (or only sum, and workers apply: BytePS); workers pull, compute, push
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   PARAMETER SERVERS

     Who applies the update? Here, the servers (by default; summation only
     is an option, see WHO APPLIES THE UPDATE). The ranks of one transport
     are split in two roles: ranks 0..P-1 are servers, ranks P..P+W-1 are
     workers (the transport's size must be P + W; worker w is rank P + w).
     Each rank runs on its own thread (or process) and talks only through
     the transport; workers never talk to each other.

       server s  holds the shards the shard map places on it (sharding.h),
                 concatenated in placement order: their parameters and the
                 optimizer's slots for them, and a CPU backend that applies
                 the optimizer with the very code (and bits) of
                 dsgd_optimizer_step. dsgd_ps_server_serve answers its
                 workers until every one has finished.
       worker w  dsgd_ps_worker_pull fetches the whole parameter buffer
                 (every server's shards), the caller computes a gradient of
                 the whole buffer, dsgd_ps_worker_push sends each server its
                 slice, dsgd_ps_worker_finish says goodbye.

     A server's version is the number of optimizer updates it has applied.
     Every push carries the version of that server the worker computed on
     (the one it last pulled); a gradient's staleness is the server's
     version when it is applied minus that version. Servers report mean,
     max and a histogram of it.

   WHO APPLIES THE UPDATE (dsgd_ps_desc.apply)

     ON_SERVERS  (the default, as above) the servers hold the parameters and
                 the optimizer's slots and apply each step; a pull returns
                 parameters.
     ON_WORKERS  summation only (BytePS): a server holds neither parameters
                 nor slots. For each clock (step) it sums the accepted
                 gradients in worker rank order, divides as the policy says
                 (the mean), and publishes that mean as the step's result;
                 its version is the number of means published. Every worker
                 holds a copy of the whole buffer (dsgd_ps_worker_set_params,
                 the same initial values on every worker) and the optimizer's
                 slots for it; dsgd_ps_worker_pull waits as the policy says,
                 fetches every mean it has not applied yet, one step at a
                 time and in order, applies each to the server's ranges with
                 the servers' code (so the bits equal ON_SERVERS'), and
                 returns the parameters. Workers that fetched the same steps
                 hold the same bits.
                 Trade-off: servers do no optimizer work and hold no slots
                 (1 or 2 buffers of the parameters' size fewer each), but
                 every worker holds the optimizer state and applies the same
                 update, W times in all. It needs a step whose sum to
                 publish, so it fits the clock-aggregated policies (SSP, SYNC,
                 BACKUP) and ASYNC refuses it. A server keeps each mean until
                 every unfinished worker has fetched it: one in SYNC; in SSP
                 and BACKUP as many steps as the slowest worker lags. Once
                 every worker has finished it keeps what is left (the means
                 the last ones had not fetched) for a checkpoint.

   UPDATE POLICIES (dsgd_ps_policy), modes of one engine

     ASYNC   every push is applied on arrival: one optimizer update with that
             gradient, version + 1 (Hogwild-free asynchronous SGD, as TF's
             ParameterServerStrategy). A server is one thread and applies
             one push at a time to all its shards: that is the per-shard
             lock. Pulls are answered at once.
     SSP     stale synchronous parallel with bound s (Ho et al. 2013). A
             worker's k-th push (k = 0, 1, ...) belongs to clock k. A server
             applies clock k once it has all W gradients of clock k and has
             applied clock k - 1: their sum in worker rank order, divided by
             W, one optimizer update, version + 1. A worker's pull at clock c
             (after c pushes) waits until clocks 0..c-s-1 are applied
             (version >= c - s), so no worker runs more than s clocks ahead
             of the slowest, and what it reads holds every update of clocks
             <= c - s - 1.
     SYNC    bulk synchronous: SSP with s = 0, the same code. Every step
             averages one gradient per worker; a pull for step k waits for
             version k.
     BACKUP  N + b backup workers (TF v1 SyncReplicasOptimizer; Chen et al.
             2016), N = W - b. A push is tagged with the step it was computed
             on (the version it pulled). The first N pushes tagged with the
             server's current step are accepted; when the N-th arrives their
             sum in worker rank order (not arrival order, so a run is
             reproducible given the accepted set), divided by N, is applied.
             Pushes for an older step are acknowledged as dropped, counted,
             and never applied. A worker's pull waits until the step it last
             pushed for is applied (TF's token queue). Each server decides
             its accepted set on its own, as each of TF's per-variable
             accumulators does. With b = 0 it is SYNC, bit for bit.
     In SSP, SYNC and BACKUP a worker must pull before each push
     (DSGD_ERR_STATE otherwise). In SSP and SYNC every worker must push as
     many times as the others: a clock that misses a finished worker's
     gradient is never applied. In BACKUP workers stop on the version, as
     TF's stop on the global step (pull; stop once the version reaches the
     target; else compute and push): a worker that pushes a fixed number of
     times may wait for a step the others, finished, no longer complete. A
     server sees when a deferred pull can never be answered and fails at
     once with DSGD_ERR_DESYNC naming the workers; the waiting worker times
     out. Pushes of a last, incomplete clock or step are never applied.

   WIRE PROTOCOL

     A message is a header of DSGD_PS_HEADER_WORDS uint64 words (type,
     worker, seq, version, count, status) followed by count floats; its tag
     is DSGD_PS_TAG(type, seq). Servers take messages in arrival order with
     the transport's probe (receive from any source), which both roles
     need (DSGD_ERR_UNSUPPORTED without it).
       PUSH    worker -> server: seq = the worker's push number, version =
               the version computed on, count = the server's floats
       ACK     server -> worker: seq = that push, status 0 (applied or
               accepted) or DSGD_PS_DROPPED (BACKUP: stale), version = the
               server's version
       PULL    worker -> server: seq = the worker's pull number, version =
               the version the reply must have at least (the policy's wait)
       PARAMS  server -> worker: seq = that pull, version = the version sent,
               count floats of parameters
     Summation only (ON_WORKERS): a PULL's status is the step whose mean the
     worker wants next (the number it has applied); PARAMS then carries that
     mean, version = that step + 1 and status = the server's version, or,
     when the worker has every mean, count 0 floats and version = status =
     the server's version. A worker pulls again until it has the means of
     every step the first reply announced.
       DONE    worker -> server: seq = the worker's number of pushes
     Exactly once: per worker a server keeps the next push seq it expects
     and the status of the last one. A seq below it is a duplicate (a
     resend, or a copy the network made): acknowledged again (with the last
     push's status: a worker waits only for its last push's ACK), counted,
     never applied. A seq above it is DSGD_ERR_DESYNC.
     A worker resends a push (or pull) that got no reply after retry_s,
     backing off (retry_s, 2 retry_s, 4 retry_s, ... at most timeout_s / 8)
     so that a stalled server's queue is not flooded. Workers take every
     message with probe + recv and drop replies to older requests, so an
     unexpected message never blocks them. A pull is answered once: a
     resent pull replaces the deferred one, or is dropped when it was
     answered already. Its reply is never sent twice because a reply the
     worker no longer waits for could hold both sides of a rendezvous
     transport (a large message waits for its receiver); so a lost request
     is recovered by a resend, a lost reply is not (the wait times out).
     DONE is sent once, after every push was acknowledged, and not
     acknowledged: the server is gone once every worker said it.

   DEADLINES

     Every wait has one (timeout_s). A worker's pull or push fails with
     DSGD_ERR_TIMEOUT naming the servers that did not answer; a server's
     serve fails naming the workers it has heard nothing from (not even a
     resend) for timeout_s, so every worker must pull or push at least that
     often. A failed rank does not stop the others: call the transport's
     abort (dsgd_loopback_abort) to stop them at once.

   CHECKPOINTS

     Each rank saves its own file (the format of checkpoint.h), at a point
     where nothing is in flight: a server before dsgd_ps_server_serve or
     after it returned DSGD_OK (every worker finished), a worker before its
     first pull or after dsgd_ps_worker_finish; never after a failure
     (DSGD_ERR_STATE). A server's file holds its identity (index, P, W,
     policy, apply, staleness, backup workers, optimizer kind, histogram
     bins, its floats) and the whole shard map's layout; its version,
     counters and staleness histogram; each worker's exactly-once table (next
     push seq and last push status, next pull seq, and ON_WORKERS the means
     it fetched); the gradients accepted for clocks not yet applied (a BACKUP
     step that lacked gradients at the end); ON_SERVERS its parameters and
     the optimizer's slots (the step is the version); ON_WORKERS the means
     some worker has not fetched (a save is DSGD_ERR_STATE when a worker
     finished without a mean the others fetched after it, which is then gone:
     let every worker pull after its last push, or none). A worker's holds
     its identity, the map, its push and pull seqs, the version read from
     each server, the step it last pushed for, its counters, and, ON_WORKERS,
     its copy of the parameters and the slots. Restore into a rank created
     anew with the same desc (timeout_s and retry_s may differ; of the
     optimizer only the kind is checked, as in checkpoint.h) and map, before
     it serves or pulls; on a new transport, every rank restored from the
     same save, the run goes on bit for bit: each server expects every worker
     again (none has finished) and continues its sequence numbers where the
     workers do. A restore checks the whole file first and touches nothing on
     an error: DSGD_ERR_FORMAT for a damaged file, DSGD_ERR_SHAPE for a
     checkpoint of something else (the other role, another rank, desc or map:
     the message names it).
*/
#ifndef DSGD__PART_PS_DECL
#define DSGD__PART_PS_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- parameter servers */

typedef enum dsgd_ps_policy {
    DSGD_PS_ASYNC = 0, /* every push applied on arrival */
    DSGD_PS_SSP = 1,   /* stale synchronous parallel, bound `staleness` */
    DSGD_PS_SYNC = 2,  /* one averaged update per step from all workers (SSP, s = 0) */
    DSGD_PS_BACKUP = 3 /* the first N = W - b gradients of each step */
} dsgd_ps_policy;
#define DSGD_PS_POLICY_COUNT (DSGD_PS_BACKUP + 1)

/* Who applies the optimizer (see WHO APPLIES THE UPDATE above). */
typedef enum dsgd_ps_apply {
    DSGD_PS_APPLY_ON_SERVERS = 0, /* servers hold the parameters and slots and apply */
    DSGD_PS_APPLY_ON_WORKERS = 1  /* summation only (BytePS): servers publish each step's
                                     mean gradient, every worker applies it to its copy */
} dsgd_ps_apply;

/* The defaults of dsgd_ps_desc. */
#define DSGD_PS_DEFAULT_RETRY_S 0.05
#define DSGD_PS_DEFAULT_STALENESS_BINS 16
/* Bounds: SSP's staleness (a server keeps s + 1 clocks of W gradients at
   most) and the histogram's bins. */
#define DSGD_PS_MAX_STALENESS 65536
#define DSGD_PS_MAX_STALENESS_BINS 65536

typedef struct dsgd_ps_desc {
    int num_servers;       /* P >= 1: ranks 0..P-1 */
    int num_workers;       /* W >= 1: ranks P..P+W-1 */
    dsgd_ps_policy policy; /* default ASYNC */
    int staleness;         /* SSP: the bound s, 0..DSGD_PS_MAX_STALENESS (0 is
                              SYNC); other policies: must be 0 */
    int backup_workers;    /* BACKUP: b, 0 <= b < W (N = W - b gradients per
                              step); other policies: must be 0 */
    dsgd_ps_apply apply;   /* default ON_SERVERS; ON_WORKERS needs SSP, SYNC
                              or BACKUP */
    /* What the servers (ON_WORKERS: the workers) apply (dsgd_optimizer_create's rules and defaults).
       clip_norm must be 0: a server holds only its shards, so the global
       norm of a gradient across servers is not defined here. */
    dsgd_optimizer_desc optimizer;
    double timeout_s;      /* every wait, in seconds; 0: DSGD_DEFAULT_TIMEOUT_S;
                              at most 1e7 */
    double retry_s;        /* a worker resends an unanswered push or pull
                              after this (then backs off); 0:
                              DSGD_PS_DEFAULT_RETRY_S */
    int staleness_bins;    /* histogram bins 0..bins-1, the last one counts
                              staleness >= bins - 1; 0:
                              DSGD_PS_DEFAULT_STALENESS_BINS */
} dsgd_ps_desc;

/* The wire protocol (see WIRE PROTOCOL above), for transports and tests
   that look at messages. */
typedef enum dsgd_ps_msg {
    DSGD_PS_MSG_PUSH = 1,
    DSGD_PS_MSG_ACK = 2,
    DSGD_PS_MSG_PULL = 3,
    DSGD_PS_MSG_PARAMS = 4,
    DSGD_PS_MSG_DONE = 5
} dsgd_ps_msg;
#define DSGD_PS_HEADER_WORDS 6 /* uint64: type, worker, seq, version, count, status */
#define DSGD_PS_DROPPED 1      /* ACK status: the push was stale and dropped */
#define DSGD_PS_SEQ_MASK 0x00FFFFFFFFFFFFFFull
#define DSGD_PS_TAG(type, seq) (((uint64_t)(type) << 56) | ((uint64_t)(seq) & DSGD_PS_SEQ_MASK))
#define DSGD_PS_TAG_TYPE(tag) ((int)((uint64_t)(tag) >> 56))
#define DSGD_PS_TAG_SEQ(tag) ((uint64_t)(tag) & DSGD_PS_SEQ_MASK)

/* "ASYNC", "SSP", "SYNC", "BACKUP"; "?" for other values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_ps_policy_name(dsgd_ps_policy p);

typedef struct dsgd_ps_server dsgd_ps_server;
typedef struct dsgd_ps_worker dsgd_ps_worker;

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
    double staleness_mean;    /* over the applied pushes; 0 when none */
    int64_t staleness_max;
    int staleness_bins;
    const int64_t *staleness_hist; /* [staleness_bins], sums to pushes_applied;
                                      points into the server */
} dsgd_ps_server_stats;

/* What a worker did (dsgd_ps_worker_get_stats). */
typedef struct dsgd_ps_worker_stats {
    int64_t clock;          /* pushes completed */
    int64_t pulls;          /* pulls completed */
    int64_t push_resends;   /* push messages sent again (to one server each) */
    int64_t pull_resends;
    int64_t pushes_dropped; /* (push, server) slices a BACKUP server dropped */
    int64_t stale_replies;  /* replies to older requests, ignored */
} dsgd_ps_worker_stats;

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
/* Writes the server's parameters into their ranges of full (a buffer of the
   whole flat size); every other float of full is left as it is.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; full NULL),
   DSGD_ERR_UNSUPPORTED (apply ON_WORKERS: the server holds no parameters;
   read a worker's, dsgd_ps_worker_read_params).
   Thread safety: the server's thread. */
DSGD_API dsgd_result dsgd_ps_server_read_params(const dsgd_ps_server *s, float *full);
/* Saves the server's state to path, atomically (see CHECKPOINTS above and
   in checkpoint.h): before serve, or after serve returned DSGD_OK.
   Errors (recorded on the server's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (serve
   failed: the state may be half-updated), DSGD_ERR_IO,
   DSGD_ERR_OUT_OF_MEMORY, backend errors. path is then unchanged.
   Thread safety: the server's thread, outside serve. */
DSGD_API dsgd_result dsgd_ps_server_save(dsgd_ps_server *s, const char *path);
/* Restores what dsgd_ps_server_save wrote into s, a server created with
   the same desc and map and the same rank, before serve. Afterwards serve
   expects every worker again, each continuing from its saved sequence
   numbers.
   Errors (recorded on the server's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (serve was
   called), DSGD_ERR_IO, DSGD_ERR_FORMAT (a damaged file),
   DSGD_ERR_SHAPE (a worker's checkpoint, another server's, or one of
   another desc, optimizer kind or shard map: the message names the
   difference), DSGD_ERR_OUT_OF_MEMORY; after any of these s is untouched.
   Thread safety: the server's thread. */
DSGD_API dsgd_result dsgd_ps_server_restore(dsgd_ps_server *s, const char *path);
/* Frees the server (NULL: nothing); not the transport or the map.
   Thread safety: the server's thread. */
DSGD_API void dsgd_ps_server_destroy(dsgd_ps_server *s);

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
   SYNC and BACKUP: the last pushed step applied). Records the version read
   from each server (dsgd_ps_worker_version); a push computes on it.
   With apply ON_WORKERS the servers send means, not parameters: the pull
   fetches every mean the worker has not applied yet (one round per step
   behind), applies each with the desc's optimizer to the worker's own copy
   (dsgd_ps_worker_set_params first, DSGD_ERR_STATE otherwise), and fills
   full_params with that copy; the version is then the number of means
   applied.
   Errors (recorded on the worker's ctx, "dsgd_ps_worker_pull: worker w:
   ..."): DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded; full_params
   NULL), DSGD_ERR_STATE (after finish or a failure), DSGD_ERR_TIMEOUT (the
   servers that did not answer within timeout_s are named), DSGD_ERR_DESYNC
   (a message from a non-server rank, or of the wrong size), transport
   errors. After a failure the worker is unusable.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_pull(dsgd_ps_worker *w, float *full_params);
/* Sends each server its slice of full_grads (the whole flat gradient) with
   (worker, push seq, the version computed on) and waits until every server
   has acknowledged it, resending after retry_s; applied exactly once per
   server (or, BACKUP, dropped as stale: see
   dsgd_ps_worker_last_push_dropped). The clock then advances.
   Errors: as dsgd_ps_worker_pull ("dsgd_ps_worker_push"), and
   DSGD_ERR_STATE for a push without a pull since the last one under SSP,
   SYNC or BACKUP.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_push(dsgd_ps_worker *w, const float *full_grads);
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
   PROTOCOL). The worker can then only be read and destroyed.
   Errors: DSGD_ERR_INVALID_ARGUMENT (w NULL, nothing recorded),
   DSGD_ERR_STATE (after finish or a failure), transport errors.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_finish(dsgd_ps_worker *w);
/* Saves the worker's state to path, atomically (see CHECKPOINTS above and
   in checkpoint.h): after dsgd_ps_worker_finish, or before the first pull
   (or push) since it was created or restored.
   Errors (recorded on the worker's ctx): DSGD_ERR_INVALID_ARGUMENT (w
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (a failed
   worker, or one between its first pull and finish: the servers, serving,
   cannot be saved with it), DSGD_ERR_IO, DSGD_ERR_OUT_OF_MEMORY. path is
   then unchanged.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_save(dsgd_ps_worker *w, const char *path);
/* Restores what dsgd_ps_worker_save wrote into w, a worker created with the
   same desc and map and the same rank, before its first pull (ON_WORKERS:
   instead of dsgd_ps_worker_set_params). The worker is then unfinished
   and goes on from its saved sequence numbers and versions.
   Errors (recorded on the worker's ctx): DSGD_ERR_INVALID_ARGUMENT (w
   NULL, nothing recorded; path NULL or empty), DSGD_ERR_STATE (w pulled,
   pushed, finished or failed), DSGD_ERR_IO, DSGD_ERR_FORMAT (a damaged
   file), DSGD_ERR_SHAPE (a server's checkpoint, another worker's, or one
   of another desc, optimizer kind or shard map: the message names the
   difference); after any of these w is untouched.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_ps_worker_restore(dsgd_ps_worker *w, const char *path);
/* Fills *out with the worker's counters (zeros for w or out NULL).
   Errors: none. Thread safety: the worker's thread. */
DSGD_API void dsgd_ps_worker_get_stats(const dsgd_ps_worker *w, dsgd_ps_worker_stats *out);
/* dsgd_ps_worker_version: the version read from server `server` at the
   last pull (0 before any; -1 for w NULL or server out of range).
   dsgd_ps_worker_last_push_dropped: 1 when that server dropped the last
   push as stale (BACKUP), 0 otherwise.
   dsgd_ps_worker_failed: 1 once a call of the worker failed (it is then
   unusable, see dsgd_ps_worker_pull), 0 otherwise and for w NULL.
   Errors: none. Thread safety: the worker's thread. */
DSGD_API int64_t dsgd_ps_worker_version(const dsgd_ps_worker *w, int server);
DSGD_API int dsgd_ps_worker_last_push_dropped(const dsgd_ps_worker *w, int server);
DSGD_API int dsgd_ps_worker_failed(const dsgd_ps_worker *w);
/* Frees the worker (NULL: nothing); not the transport or the map.
   Thread safety: the worker's thread. */
DSGD_API void dsgd_ps_worker_destroy(dsgd_ps_worker *w);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_PS_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_PS_IMPL)
#define DSGD__PART_PS_IMPL

/* >>ps common -------------------------------------------------------------- */

/* The header occupies the first DSGD__PS_H floats of every buffer that goes
   over the wire, so a message is sent and received in place. */
#define DSGD__PS_H (DSGD_PS_HEADER_WORDS * 2)
#define DSGD__PS_HBYTES (DSGD_PS_HEADER_WORDS * sizeof(uint64_t))

enum { DSGD__PS_CREATED = 0, DSGD__PS_DONE = 1, DSGD__PS_FAILED = 2 };

DSGD_API const char *dsgd_ps_policy_name(dsgd_ps_policy p) {
    static const char *const names[DSGD_PS_POLICY_COUNT] = {"ASYNC", "SSP", "SYNC", "BACKUP"};
    return (int)p >= 0 && (int)p < (int)DSGD_PS_POLICY_COUNT ? names[p] : "?";
}

static double dsgd__ps_now(const dsgd_transport_i *t) { return t->now ? t->now(t->impl) : dsgd_now(); }

static const char *dsgd__ps_terr(const dsgd_transport_i *t) {
    const char *m = t->error_message ? t->error_message(t->impl) : NULL;
    return m ? m : "";
}

static void dsgd__ps_hdr_put(void *dst, uint64_t type, uint64_t worker, uint64_t seq, int64_t version, uint64_t count,
                             uint64_t status) {
    uint64_t h[DSGD_PS_HEADER_WORDS];
    h[0] = type;
    h[1] = worker;
    h[2] = seq;
    h[3] = (uint64_t)version;
    h[4] = count;
    h[5] = status;
    memcpy(dst, h, sizeof h);
}

/* The one place dsgd_ps_desc's defaults are filled and checked, with the
   transport and the map every role shares. */
static dsgd_result dsgd__ps_setup(dsgd_ctx *ctx, const dsgd_transport_i *t, const dsgd_ps_desc *in,
                                  const dsgd_shard_map *map, const char *fn, dsgd_ps_desc *d) {
    dsgd_result r;
    if (!t || !in || !map)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: transport, desc or shard map is NULL", fn);
    *d = *in;
    if (d->num_servers < 1 || d->num_workers < 1 || d->num_servers > INT_MAX / 2 || d->num_workers > INT_MAX / 2)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: need num_servers >= 1 and num_workers >= 1 (got %d, %d)",
                                  fn, d->num_servers, d->num_workers);
    if ((int)d->policy < 0 || (int)d->policy >= (int)DSGD_PS_POLICY_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", fn, (int)d->policy);
    if (d->policy == DSGD_PS_SSP ? (d->staleness < 0 || d->staleness > DSGD_PS_MAX_STALENESS) : d->staleness != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: staleness %d (SSP: 0..%d; other policies: 0)", fn,
                                  d->staleness, DSGD_PS_MAX_STALENESS);
    if (d->policy == DSGD_PS_BACKUP ? (d->backup_workers < 0 || d->backup_workers >= d->num_workers)
                                    : d->backup_workers != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: backup_workers %d (BACKUP: 0 <= b < num_workers = %d; other policies: 0)", fn,
                                  d->backup_workers, d->num_workers);
    if ((int)d->apply < 0 || (int)d->apply > (int)DSGD_PS_APPLY_ON_WORKERS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown apply %d", fn, (int)d->apply);
    if (d->apply == DSGD_PS_APPLY_ON_WORKERS && d->policy == DSGD_PS_ASYNC)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: apply ON_WORKERS (summation only) needs SSP, SYNC or BACKUP: ASYNC applies each "
                                  "push alone, so there is no step whose sum to publish", fn);
    d->optimizer = dsgd__optimizer_defaults(&in->optimizer);
    if ((r = dsgd__optimizer_desc_check(ctx, &d->optimizer, fn)) != DSGD_OK) return r;
    if (d->optimizer.clip_norm > 0.0f)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: clip_norm %g is not supported: each server holds only its shards, so the global "
                                  "norm of a gradient across servers is not defined here", fn, (double)d->optimizer.clip_norm);
    if (d->timeout_s == 0.0) d->timeout_s = DSGD_DEFAULT_TIMEOUT_S;
    if (d->retry_s == 0.0) d->retry_s = DSGD_PS_DEFAULT_RETRY_S;
    if (d->staleness_bins == 0) d->staleness_bins = DSGD_PS_DEFAULT_STALENESS_BINS;
    if (!(d->timeout_s > 0.0 && d->timeout_s <= 1e7) || !(d->retry_s > 0.0 && d->retry_s <= 1e7) ||
        d->staleness_bins < 1 || d->staleness_bins > DSGD_PS_MAX_STALENESS_BINS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: timeout_s %g and retry_s %g must lie in (0, 1e7], staleness_bins %d in 1..%d", fn,
                                  d->timeout_s, d->retry_s, d->staleness_bins, DSGD_PS_MAX_STALENESS_BINS);
    if (!t->send || !t->recv)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: the transport has no send or recv", fn);
    if (!t->probe)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED,
                                  "%s: transport \"%s\" has no probe (receive from any source), which the parameter "
                                  "servers need", fn, t->name ? t->name : "?");
    if (t->size != d->num_servers + d->num_workers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: the transport has %d ranks; %d servers + %d workers need %d", fn, t->size,
                                  d->num_servers, d->num_workers, d->num_servers + d->num_workers);
    if (dsgd_shard_map_num_servers(map) != d->num_servers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: the shard map is for %d servers, the desc says %d",
                                  fn, dsgd_shard_map_num_servers(map), d->num_servers);
    return DSGD_OK;
}

/* >>ps server -------------------------------------------------------------- */

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
} dsgd__ps_peer;

struct dsgd_ps_server {
    dsgd_ctx *ctx;
    dsgd_transport_i t;
    dsgd_ps_desc d; /* defaults filled */
    const dsgd_shard_map *map;
    int index, P, W;
    int ring;   /* clocks buffered at once: SSP s + 1, SYNC and BACKUP 1 */
    int needed; /* gradients per clock: W, BACKUP N */
    size_t n;   /* floats this server holds */
    dsgd_backend_i be;
    int have_be, state, done_count;
    dsgd_buffer *params, *grad, *m1, *m2; /* params, grad: [header | n] */
    float *params_h, *grad_h;
    /* clock modes: slot[(k % ring) * W + w] holds worker w's gradient of
       clock k ([header | n]), vcomp the version it was computed on */
    dsgd_buffer **slot, **pool;
    int64_t *vcomp;
    int *slot_count, pool_len;
    /* ON_WORKERS: agg[i] is the mean of step agg_base + i ([header | n]),
       kept until every unfinished worker has fetched it */
    int sum_only;
    dsgd_buffer **agg, *agg_spare;
    size_t agg_len, agg_cap;
    int64_t agg_base;
    dsgd__ps_peer *peer;
    int64_t version, received, applied, duplicates, dropped, pulls, deferred, repeated, stal_max;
    double stal_sum;
    int64_t *hist;
};

static dsgd_result dsgd__ps_server_fail(dsgd_ps_server *s, dsgd_result r) {
    s->state = DSGD__PS_FAILED;
    return r;
}

static void dsgd__ps_staleness(dsgd_ps_server *s, int64_t st) {
    if (st < 0) st = 0;
    s->stal_sum += (double)st;
    if (st > s->stal_max) s->stal_max = st;
    s->hist[st < s->d.staleness_bins - 1 ? st : s->d.staleness_bins - 1]++;
}

/* One optimizer update of the server's floats with the gradient in grad. */
static dsgd_result dsgd__ps_apply(dsgd_ps_server *s) {
    dsgd_opt_update u = dsgd__opt_update_at(&s->d.optimizer, s->version, 1.0f);
    dsgd_ref p, g, m1, m2;
    dsgd_result r;
    p.buf = s->params;
    p.off = DSGD__PS_H;
    g.buf = s->grad;
    g.off = DSGD__PS_H;
    m1.buf = s->m1;
    m1.off = 0;
    m2.buf = s->m2;
    m2.off = 0;
    r = s->be.optimizer_update(s->be.impl, &u, p, g, m1, m2, s->n);
    if (r == DSGD_OK) s->version++;
    return r;
}

static dsgd_result dsgd__ps_send(dsgd_ps_server *s, int w, uint64_t type, uint64_t seq, const void *buf, size_t bytes) {
    dsgd_result r = s->t.send(s->t.impl, s->P + w, DSGD_PS_TAG(type, seq), buf, bytes, dsgd__ps_now(&s->t) + s->d.timeout_s);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "dsgd_ps_server_serve: server %d: sending to worker %d (rank %d) failed: %s%s%s",
                                  s->index, w, s->P + w, dsgd_result_string(r), dsgd__ps_terr(&s->t)[0] ? ": " : "",
                                  dsgd__ps_terr(&s->t));
    return DSGD_OK;
}

static dsgd_result dsgd__ps_ack(dsgd_ps_server *s, int w, uint64_t seq, uint64_t status) {
    uint64_t h[DSGD_PS_HEADER_WORDS];
    dsgd__ps_hdr_put(h, DSGD_PS_MSG_ACK, (uint64_t)w, seq, s->version, 0, status);
    return dsgd__ps_send(s, w, DSGD_PS_MSG_ACK, seq, h, sizeof h);
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
    if (from >= s->version) {
        uint64_t h[DSGD_PS_HEADER_WORDS];
        dsgd__ps_hdr_put(h, DSGD_PS_MSG_PARAMS, (uint64_t)w, seq, s->version, 0, (uint64_t)s->version);
        return dsgd__ps_send(s, w, DSGD_PS_MSG_PARAMS, seq, h, sizeof h);
    }
    host = s->be.buffer_host_ptr(s->be.impl, s->agg[from - s->agg_base]);
    dsgd__ps_hdr_put(host, DSGD_PS_MSG_PARAMS, (uint64_t)w, seq, from + 1, (uint64_t)s->n, (uint64_t)s->version);
    r = dsgd__ps_send(s, w, DSGD_PS_MSG_PARAMS, seq, host, DSGD__PS_HBYTES + s->n * sizeof(float));
    if (r != DSGD_OK) return r;
    pe->have = from + 1;
    dsgd__ps_trim(s);
    return DSGD_OK;
}

static dsgd_result dsgd__ps_answer_pull(dsgd_ps_server *s, int w) {
    dsgd__ps_peer *pe = &s->peer[w];
    uint64_t seq = pe->pull_next - 1;
    pe->pull_pending = 0;
    s->pulls++;
    if (s->sum_only) return dsgd__ps_answer_sum(s, w, seq);
    dsgd__ps_hdr_put(s->params_h, DSGD_PS_MSG_PARAMS, (uint64_t)w, seq, s->version, (uint64_t)s->n, 0);
    return dsgd__ps_send(s, w, DSGD_PS_MSG_PARAMS, seq, s->params_h, DSGD__PS_HBYTES + s->n * sizeof(float));
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

/* Clock modes: applies every complete clock, in order. The sum runs in
   worker rank order whatever the arrival order. */
static dsgd_result dsgd__ps_apply_clocks(dsgd_ps_server *s) {
    dsgd_result r;
    for (;;) {
        int k = (int)(s->version % s->ring), w, cnt = 0;
        float *sum = s->grad_h + DSGD__PS_H;
        if (s->slot_count[k] < s->needed) return DSGD_OK;
        for (w = 0; w < s->W; ++w) {
            dsgd_buffer **b = &s->slot[(size_t)k * s->W + w];
            const float *g;
            if (!*b) continue;
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
        if ((r = s->sum_only ? dsgd__ps_publish(s) : dsgd__ps_apply(s)) != DSGD_OK) return r;
        if ((r = dsgd__ps_release_pulls(s)) != DSGD_OK) return r;
    }
}

/* Checks a received header against what the tag and size promised. */
static dsgd_result dsgd__ps_check_hdr(dsgd_ps_server *s, const void *buf, int w, uint64_t type, uint64_t seq,
                                      uint64_t count, uint64_t *h) {
    memcpy(h, buf, DSGD__PS_HBYTES);
    if (h[0] != type || h[1] != (uint64_t)w || DSGD_PS_TAG_SEQ(h[2]) != seq || h[4] != count)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "dsgd_ps_server_serve: server %d: worker %d sent a header (type %llu, worker %llu, seq "
                                  "%llu, count %llu) that does not match its tag and size", s->index, w,
                                  (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2],
                                  (unsigned long long)h[4]);
    return DSGD_OK;
}

static dsgd_result dsgd__ps_on_push(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    dsgd__ps_peer *pe = &s->peer[w];
    uint64_t seq = DSGD_PS_TAG_SEQ(tag), h[DSGD_PS_HEADER_WORDS], status = 0;
    size_t want = DSGD__PS_HBYTES + s->n * sizeof(float);
    dsgd_buffer *b;
    float *host;
    int64_t step, vcomp;
    dsgd_result r;
    if (bytes != want)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: push %llu of worker %d has %zu bytes, not %zu",
                                  fn, s->index, (unsigned long long)seq, w, bytes, want);
    if (seq > pe->next_seq)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: push %llu of worker %d, but push %llu is next",
                                  fn, s->index, (unsigned long long)seq, w, (unsigned long long)pe->next_seq);
    /* the buffer to receive into: grad for duplicates and ASYNC, a pooled
       one for a clock's gradient */
    if (seq < pe->next_seq || s->d.policy == DSGD_PS_ASYNC) {
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
                                  dsgd__ps_terr(&s->t)[0] ? ": " : "", dsgd__ps_terr(&s->t));
    }
    if ((r = dsgd__ps_check_hdr(s, host, w, DSGD_PS_MSG_PUSH, seq, (uint64_t)s->n, h)) != DSGD_OK) {
        if (b != s->grad) s->pool[s->pool_len++] = b;
        return r;
    }
    if (seq < pe->next_seq) { /* a duplicate: acknowledged again, not applied */
        s->duplicates++;
        return dsgd__ps_ack(s, w, seq, pe->last_status);
    }
    s->received++;
    pe->next_seq++;
    vcomp = (int64_t)h[3];
    if (s->d.policy == DSGD_PS_ASYNC) {
        dsgd__ps_staleness(s, s->version - vcomp);
        s->applied++;
        if ((r = dsgd__ps_apply(s)) != DSGD_OK) return r;
        pe->last_status = 0;
        if ((r = dsgd__ps_ack(s, w, seq, 0)) != DSGD_OK) return r;
        return dsgd__ps_release_pulls(s);
    }
    /* clock modes: SSP and SYNC count clocks by push seq, BACKUP by the
       step (version) the gradient was computed on */
    step = s->d.policy == DSGD_PS_BACKUP ? vcomp : (int64_t)seq;
    if (s->d.policy == DSGD_PS_BACKUP && step < s->version) {
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

/* Clock modes: fails when a deferred pull can never be answered because
   the clock (step) the server must apply next cannot complete: SSP and SYNC
   need a push of it from a worker that has finished; BACKUP has fewer
   accepted gradients plus workers still able to push (not finished, not
   waiting, not already in this step) than it needs. Called when a worker
   finishes and when a pull is deferred; exact, so a run that can go on is
   never stopped. */
static dsgd_result dsgd__ps_check_stuck(dsgd_ps_server *s) {
    static const char *const fn = "dsgd_ps_server_serve";
    int k = (int)(s->version % s->ring), w, waiter = -1, missing = -1, can = 0;
    if (s->d.policy == DSGD_PS_ASYNC) return DSGD_OK;
    for (w = 0; w < s->W; ++w) {
        const dsgd__ps_peer *pe = &s->peer[w];
        int in_step = s->slot[(size_t)k * s->W + w] != NULL;
        if (pe->pull_pending && waiter < 0) waiter = w;
        if (pe->done && !in_step && missing < 0 && (s->d.policy == DSGD_PS_BACKUP || pe->next_seq <= (uint64_t)s->version))
            missing = w;
        if (!pe->done && !pe->pull_pending && !in_step) can++;
    }
    if (waiter < 0) return DSGD_OK;
    if (s->d.policy != DSGD_PS_BACKUP && missing >= 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "%s: server %d: worker %d waits for version %lld, which can never come: clock %lld needs "
                                  "a push of worker %d, which finished after %llu pushes (%s needs every worker's push of "
                                  "every clock)", fn, s->index, waiter, (long long)s->peer[waiter].pull_min,
                                  (long long)s->version, missing, (unsigned long long)s->peer[missing].next_seq,
                                  dsgd_ps_policy_name(s->d.policy));
    if (s->d.policy == DSGD_PS_BACKUP && s->slot_count[k] + can < s->needed)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "%s: server %d: worker %d waits for version %lld, which can never come: step %lld has %d "
                                  "of %d gradients and %d worker%s can still push (the others finished or wait); stop "
                                  "BACKUP workers on the version", fn, s->index, waiter,
                                  (long long)s->peer[waiter].pull_min, (long long)s->version, s->slot_count[k],
                                  s->needed, can, can == 1 ? "" : "s");
    return DSGD_OK;
}

static dsgd_result dsgd__ps_on_pull(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    dsgd__ps_peer *pe = &s->peer[w];
    uint64_t seq = DSGD_PS_TAG_SEQ(tag), h[DSGD_PS_HEADER_WORDS];
    dsgd_result r;
    if (bytes != DSGD__PS_HBYTES)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: pull of worker %d has %zu bytes, not %zu", fn,
                                  s->index, w, bytes, (size_t)DSGD__PS_HBYTES);
    r = s->t.recv(s->t.impl, s->P + w, tag, h, sizeof h, dsgd__ps_now(&s->t) + s->d.timeout_s);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "%s: server %d: receiving a pull of worker %d failed: %s%s%s", fn, s->index,
                                  w, dsgd_result_string(r), dsgd__ps_terr(&s->t)[0] ? ": " : "", dsgd__ps_terr(&s->t));
    if ((r = dsgd__ps_check_hdr(s, h, w, DSGD_PS_MSG_PULL, seq, 0, h)) != DSGD_OK) return r;
    if (seq < pe->pull_next) { /* a resend: the deferred pull stays, an answered one is not answered again */
        s->repeated++;
        return DSGD_OK;
    }
    if (seq > pe->pull_next)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: pull %llu of worker %d, but pull %llu is next",
                                  fn, s->index, (unsigned long long)seq, w, (unsigned long long)pe->pull_next);
    if (s->sum_only && (int64_t)h[5] != pe->have)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC,
                                  "%s: server %d: pull %llu of worker %d wants the mean of step %lld, but it has fetched "
                                  "%lld", fn, s->index, (unsigned long long)seq, w, (long long)(int64_t)h[5],
                                  (long long)pe->have);
    pe->pull_next = seq + 1;
    pe->pull_min = (int64_t)h[3];
    pe->pull_from = (int64_t)h[5];
    if (s->version >= pe->pull_min) return dsgd__ps_answer_pull(s, w);
    pe->pull_pending = 1;
    s->deferred++;
    return dsgd__ps_check_stuck(s);
}

static dsgd_result dsgd__ps_on_done(dsgd_ps_server *s, int w, uint64_t tag, size_t bytes) {
    static const char *const fn = "dsgd_ps_server_serve";
    uint64_t h[DSGD_PS_HEADER_WORDS], seq = DSGD_PS_TAG_SEQ(tag);
    dsgd_result r;
    if (bytes != DSGD__PS_HBYTES)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: DONE of worker %d has %zu bytes", fn,
                                  s->index, w, bytes);
    r = s->t.recv(s->t.impl, s->P + w, tag, h, sizeof h, dsgd__ps_now(&s->t) + s->d.timeout_s);
    if (r != DSGD_OK)
        return dsgd_ctx_set_error(s->ctx, r, "%s: server %d: receiving DONE of worker %d failed: %s", fn, s->index, w,
                                  dsgd_result_string(r));
    if ((r = dsgd__ps_check_hdr(s, h, w, DSGD_PS_MSG_DONE, seq, 0, h)) != DSGD_OK) return r;
    if (seq != s->peer[w].next_seq)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_DESYNC, "%s: server %d: worker %d finished after %llu pushes, %llu arrived",
                                  fn, s->index, w, (unsigned long long)seq, (unsigned long long)s->peer[w].next_seq);
    if (!s->peer[w].done) {
        s->peer[w].done = 1;
        s->done_count++;
        if (s->sum_only) dsgd__ps_trim(s);
    }
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
        int src = -1, first = 1, type;
        uint64_t tag = 0;
        size_t bytes = 0;
        for (w = 0; w < s->W; ++w)
            if (!s->peer[w].done && (first || s->peer[w].last_heard + s->d.timeout_s < deadline)) {
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
                if (!s->peer[w].done && now >= s->peer[w].last_heard + s->d.timeout_s) {
                    int k = snprintf(names + used, sizeof names - used, "%s%d (rank %d)", late ? ", " : "", w, s->P + w);
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
                                   dsgd_result_string(r), dsgd__ps_terr(&s->t)[0] ? ": " : "", dsgd__ps_terr(&s->t));
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
        dsgd_buffer *own[4];
        int k;
        own[0] = s->params;
        own[1] = s->grad;
        own[2] = s->m1;
        own[3] = s->m2;
        for (k = 0; k < 4; ++k)
            if (own[k]) s->be.buffer_destroy(s->be.impl, own[k]);
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
    size_t slots = 0, at = 0;
    int i;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if ((r = dsgd__ps_setup(ctx, t, desc, map, fn, &d)) != DSGD_OK) return r;
    if (t->rank < 0 || t->rank >= d.num_servers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: rank %d is not a server (servers are ranks 0..%d)",
                                  fn, t->rank, d.num_servers - 1);
    if (!initial_full_params && d.apply == DSGD_PS_APPLY_ON_SERVERS)
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
    s->ring = d.policy == DSGD_PS_SSP ? d.staleness + 1 : 1;
    s->needed = d.policy == DSGD_PS_BACKUP ? d.num_workers - d.backup_workers : d.num_workers;
    s->sum_only = d.apply == DSGD_PS_APPLY_ON_WORKERS;
    r = DSGD_OK;
    if (s->n > (SIZE_MAX / sizeof(float)) - DSGD__PS_H - 1)
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: %zu floats overflow size_t", fn, s->n);
    if (r == DSGD_OK && (r = dsgd_cpu_backend_create(ctx, &s->be)) == DSGD_OK) s->have_be = 1;
    /* ON_WORKERS: no parameters, no slots */
    if (r == DSGD_OK && !s->sum_only) r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->params);
    if (r == DSGD_OK) r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->grad);
    if (r == DSGD_OK && !s->sum_only && d.optimizer.kind != DSGD_OPT_SGD) r = s->be.buffer_create(s->be.impl, s->n, &s->m1);
    if (r == DSGD_OK && !s->sum_only && (d.optimizer.kind == DSGD_OPT_ADAM || d.optimizer.kind == DSGD_OPT_ADAMW))
        r = s->be.buffer_create(s->be.impl, s->n, &s->m2);
    if (r == DSGD_OK && d.policy != DSGD_PS_ASYNC) {
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
    memset(s->hist, 0, (size_t)d.staleness_bins * sizeof *s->hist);
    s->params_h = s->params ? s->be.buffer_host_ptr(s->be.impl, s->params) : NULL;
    s->grad_h = s->be.buffer_host_ptr(s->be.impl, s->grad);
    /* the server's shards, concatenated in placement order; slots start at 0 */
    for (i = 0; i < dsgd_shard_map_num_shards(map) && s->params_h; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(map, i);
        if (sh->server != s->index) continue;
        memcpy(s->params_h + DSGD__PS_H + at, initial_full_params + sh->offset, sh->count * sizeof(float));
        at += sh->count;
    }
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
    out->staleness_mean = s->applied ? s->stal_sum / (double)s->applied : 0.0;
    out->staleness_max = s->stal_max;
    out->staleness_bins = s->d.staleness_bins;
    out->staleness_hist = s->hist;
}

DSGD_API dsgd_result dsgd_ps_server_read_params(const dsgd_ps_server *s, float *full) {
    size_t at = 0;
    int i;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_ps_server_read_params: full is NULL");
    if (s->sum_only)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_UNSUPPORTED,
                                  "dsgd_ps_server_read_params: server %d sums only (apply ON_WORKERS) and holds no "
                                  "parameters; read a worker's (dsgd_ps_worker_read_params)", s->index);
    for (i = 0; i < dsgd_shard_map_num_shards(s->map); ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(s->map, i);
        if (sh->server != s->index) continue;
        memcpy(full + sh->offset, s->params_h + DSGD__PS_H + at, sh->count * sizeof(float));
        at += sh->count;
    }
    return DSGD_OK;
}

/* >>ps worker -------------------------------------------------------------- */

struct dsgd_ps_worker {
    dsgd_ctx *ctx;
    dsgd_transport_i t;
    dsgd_ps_desc d; /* defaults filled */
    const dsgd_shard_map *map;
    int index, P, W, state, pulled;
    size_t *n;         /* [P] floats of each server */
    float **buf;       /* [P] [header | n[s]]: a push's slice, then a pull's reply */
    uint64_t *pull_hdr; /* [P * header words] the pull requests, for resends */
    float *scratch;    /* stale replies land here */
    size_t scratch_bytes;
    int64_t *version, *last_step; /* [P] read at the last pull; BACKUP: step last pushed */
    int *dropped, *pending;       /* [P] */
    double *sent_at, *backoff;    /* [P] */
    uint64_t push_seq, pull_seq;
    uint64_t push_seq0, pull_seq0; /* at create or restore: a save or restore
                                      needs no pull or push since */
    int64_t pulls, push_resends, pull_resends, pushes_dropped, stale;
    /* ON_WORKERS: per server, its ranges of the worker's copy (the server's
       layout), the mean received ([header | n[s]]) and the optimizer's
       slots; latest: the server's version the first reply of a pull
       announced */
    int sum_only, have_be, params_set, round;
    dsgd_backend_i be;
    dsgd_buffer **own, **sum, **m1, **m2;
    int64_t *latest;
};

static dsgd_result dsgd__ps_worker_fail(dsgd_ps_worker *w, dsgd_result r) {
    w->state = DSGD__PS_FAILED;
    return r;
}

/* ON_WORKERS: takes server src's reply h (in sum[src]): applies the mean
   it carries to the worker's copy of that server's ranges, as the server
   would have (dsgd__ps_apply: the same update, the same step count). */
static dsgd_result dsgd__ps_worker_apply(dsgd_ps_worker *w, const char *fn, int src, const uint64_t *h) {
    dsgd_opt_update u;
    dsgd_ref p, g, m1, m2;
    dsgd_result r;
    int64_t v = w->version[src];
    if (w->round == 0) w->latest[src] = (int64_t)h[5];
    if (h[4] == 0) {
        if ((int64_t)h[3] != v)
            return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                      "%s: worker %d: server %d says it has published %lld means, the worker has %lld",
                                      fn, w->index, src, (long long)(int64_t)h[3], (long long)v);
        return DSGD_OK;
    }
    if ((int64_t)h[3] != v + 1)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC, "%s: worker %d: server %d sent the mean of step %lld, not %lld",
                                  fn, w->index, src, (long long)((int64_t)h[3] - 1), (long long)v);
    u = dsgd__opt_update_at(&w->d.optimizer, v, 1.0f);
    p.buf = w->own[src];
    p.off = 0;
    g.buf = w->sum[src];
    g.off = DSGD__PS_H;
    m1.buf = w->m1[src];
    m1.off = 0;
    m2.buf = w->m2[src];
    m2.off = 0;
    if ((r = w->be.optimizer_update(w->be.impl, &u, p, g, m1, m2, w->n[src])) != DSGD_OK) return r;
    w->version[src] = v + 1;
    return DSGD_OK;
}

/* The wait for one reply from every server: probe, take the expected
   replies, drop stale ones, resend to silent servers with backoff. type is
   ACK or PARAMS; full receives the parameters of PARAMS. */
static dsgd_result dsgd__ps_worker_wait(dsgd_ps_worker *w, const char *fn, int type, uint64_t seq, float *full) {
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
        double wake = deadline, now;
        int src = -1, mtype;
        uint64_t tag = 0;
        size_t bytes = 0;
        for (s = 0; s < w->P; ++s)
            if (w->pending[s] && w->sent_at[s] + w->backoff[s] < wake) wake = w->sent_at[s] + w->backoff[s];
        r = w->t.probe(w->t.impl, wake, &src, &tag, &bytes);
        now = dsgd__ps_now(&w->t);
        if (r == DSGD_ERR_TIMEOUT) {
            if (now >= deadline) {
                char names[256];
                size_t used = 0;
                int k = 0;
                names[0] = '\0';
                for (s = 0; s < w->P; ++s)
                    if (w->pending[s]) {
                        int m = snprintf(names + used, sizeof names - used, "%s%d", k++ ? ", " : "", s);
                        if (m > 0) used = DSGD__MIN(sizeof names - 1, used + (size_t)m);
                    }
                return dsgd_ctx_set_error(w->ctx, DSGD_ERR_TIMEOUT,
                                          "%s: worker %d: no %s from server%s %s within %g s (%s %llu)", fn, w->index,
                                          type == DSGD_PS_MSG_ACK ? "acknowledgement" : "parameters", k > 1 ? "s" : "",
                                          names, w->d.timeout_s, type == DSGD_PS_MSG_ACK ? "push" : "pull",
                                          (unsigned long long)seq);
            }
            for (s = 0; s < w->P; ++s) {
                const void *msg;
                size_t mbytes;
                uint64_t mtag;
                if (!w->pending[s] || now < w->sent_at[s] + w->backoff[s]) continue;
                if (type == DSGD_PS_MSG_ACK) {
                    msg = w->buf[s];
                    mbytes = DSGD__PS_HBYTES + w->n[s] * sizeof(float);
                    mtag = DSGD_PS_TAG(DSGD_PS_MSG_PUSH, seq);
                    w->push_resends++;
                } else {
                    msg = w->pull_hdr + (size_t)s * DSGD_PS_HEADER_WORDS;
                    mbytes = DSGD__PS_HBYTES;
                    mtag = DSGD_PS_TAG(DSGD_PS_MSG_PULL, seq);
                    w->pull_resends++;
                }
                r = w->t.send(w->t.impl, s, mtag, msg, mbytes, deadline);
                if (r != DSGD_OK)
                    return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: resending to server %d failed: %s%s%s", fn,
                                              w->index, s, dsgd_result_string(r), dsgd__ps_terr(&w->t)[0] ? ": " : "",
                                              dsgd__ps_terr(&w->t));
                w->sent_at[s] = dsgd__ps_now(&w->t);
                w->backoff[s] = DSGD__MIN(2 * w->backoff[s], max_backoff);
            }
            continue;
        }
        if (r != DSGD_OK)
            return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: waiting for the servers failed: %s%s%s", fn, w->index,
                                      dsgd_result_string(r), dsgd__ps_terr(&w->t)[0] ? ": " : "", dsgd__ps_terr(&w->t));
        if (src < 0 || src >= w->P)
            return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC, "%s: worker %d: a message from rank %d, which is not a server",
                                      fn, w->index, src);
        mtype = DSGD_PS_TAG_TYPE(tag);
        if (mtype == type && DSGD_PS_TAG_SEQ(tag) == (seq & DSGD_PS_SEQ_MASK) && w->pending[src]) {
            uint64_t h[DSGD_PS_HEADER_WORDS];
            size_t want = DSGD__PS_HBYTES + (type == DSGD_PS_MSG_PARAMS ? w->n[src] * sizeof(float) : 0);
            void *dst = type == DSGD_PS_MSG_PARAMS ? (void *)w->buf[src] : (void *)h;
            if (type == DSGD_PS_MSG_PARAMS && w->sum_only) { /* a mean, or nothing new */
                dst = w->be.buffer_host_ptr(w->be.impl, w->sum[src]);
                if (bytes == DSGD__PS_HBYTES) want = bytes;
            }
            if (bytes != want)
                return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC, "%s: worker %d: server %d sent %zu bytes, not %zu", fn,
                                          w->index, src, bytes, want);
            r = w->t.recv(w->t.impl, src, tag, dst, bytes, deadline);
            if (r != DSGD_OK)
                return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: receiving from server %d failed: %s%s%s", fn,
                                          w->index, src, dsgd_result_string(r), dsgd__ps_terr(&w->t)[0] ? ": " : "",
                                          dsgd__ps_terr(&w->t));
            memcpy(h, dst, sizeof h);
            if (h[0] != (uint64_t)type || h[1] != (uint64_t)w->index || DSGD_PS_TAG_SEQ(h[2]) != DSGD_PS_TAG_SEQ(seq) ||
                (type == DSGD_PS_MSG_PARAMS && DSGD__PS_HBYTES + h[4] * sizeof(float) != bytes))
                return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                          "%s: worker %d: server %d sent a header (type %llu, worker %llu, seq %llu, "
                                          "count %llu) that does not match its tag and size", fn, w->index, src,
                                          (unsigned long long)h[0], (unsigned long long)h[1], (unsigned long long)h[2],
                                          (unsigned long long)h[4]);
            if (type == DSGD_PS_MSG_ACK) {
                w->dropped[src] = h[5] == DSGD_PS_DROPPED;
                w->pushes_dropped += w->dropped[src];
            } else if (w->sum_only) {
                if ((r = dsgd__ps_worker_apply(w, fn, src, h)) != DSGD_OK) return r;
            } else {
                int i;
                const float *p = w->buf[src] + DSGD__PS_H;
                w->version[src] = (int64_t)h[3];
                for (i = 0; i < dsgd_shard_map_num_shards(w->map); ++i) {
                    const dsgd_shard *sh = dsgd_shard_map_shard(w->map, i);
                    if (sh->server != src) continue;
                    memcpy(full + sh->offset, p, sh->count * sizeof(float));
                    p += sh->count;
                }
            }
            w->pending[src] = 0;
            left--;
        } else { /* a reply to an older request (or a copy): dropped */
            if (bytes > w->scratch_bytes)
                return dsgd_ctx_set_error(w->ctx, DSGD_ERR_DESYNC,
                                          "%s: worker %d: server %d sent an unexpected message of %zu bytes (type %d)", fn,
                                          w->index, src, bytes, mtype);
            r = w->t.recv(w->t.impl, src, tag, w->scratch, bytes, deadline);
            if (r != DSGD_OK)
                return dsgd_ctx_set_error(w->ctx, r, "%s: worker %d: receiving from server %d failed: %s", fn, w->index,
                                          src, dsgd_result_string(r));
            w->stale++;
        }
    }
    return DSGD_OK;
}

/* ON_WORKERS: the worker's copy into the shards' ranges of full. */
static void dsgd__ps_worker_copy_out(const dsgd_ps_worker *w, float *full) {
    int s, i;
    for (s = 0; s < w->P; ++s) {
        const float *p = w->be.buffer_host_ptr(w->be.impl, w->own[s]);
        for (i = 0; i < dsgd_shard_map_num_shards(w->map); ++i) {
            const dsgd_shard *sh = dsgd_shard_map_shard(w->map, i);
            if (sh->server != s) continue;
            memcpy(full + sh->offset, p, sh->count * sizeof(float));
            p += sh->count;
        }
    }
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
                                  dsgd_result_string(r), dsgd__ps_terr(&w->t)[0] ? ": " : "", dsgd__ps_terr(&w->t));
    return DSGD_OK;
}

/* The pull; wait 0 asks for no version (what the servers have now: the
   coordinator's last fetch, once every push was acknowledged). */
static dsgd_result dsgd__ps_worker_pull(dsgd_ps_worker *w, float *full_params, const char *fn, int wait) {
    dsgd_result r;
    int s;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    if (!full_params)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full_params is NULL", fn, w->index);
    if (w->sum_only && !w->params_set)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE,
                                  "%s: worker %d: apply ON_WORKERS needs dsgd_ps_worker_set_params before the first pull",
                                  fn, w->index);
    /* ON_WORKERS: one round per mean behind the versions the first round announced */
    for (w->round = 0;; w->round++) {
        int behind = 0;
        for (s = 0; s < w->P; ++s) {
            uint64_t *h = w->pull_hdr + (size_t)s * DSGD_PS_HEADER_WORDS;
            int64_t need = 0;
            if (!wait)
                need = 0;
            else if (w->d.policy == DSGD_PS_SSP || w->d.policy == DSGD_PS_SYNC)
                need = DSGD__MAX((int64_t)w->push_seq - w->d.staleness, (int64_t)0); /* clocks 0..c-s-1 applied */
            else if (w->d.policy == DSGD_PS_BACKUP)
                need = w->last_step[s] + 1; /* the step last pushed for is applied */
            dsgd__ps_hdr_put(h, DSGD_PS_MSG_PULL, (uint64_t)w->index, w->pull_seq, need, 0,
                             w->sum_only ? (uint64_t)w->version[s] : 0);
            if ((r = dsgd__ps_worker_send(w, fn, s, DSGD_PS_TAG(DSGD_PS_MSG_PULL, w->pull_seq), h, DSGD__PS_HBYTES)) != DSGD_OK)
                return dsgd__ps_worker_fail(w, r);
        }
        r = dsgd__ps_worker_wait(w, fn, DSGD_PS_MSG_PARAMS, w->pull_seq, full_params);
        if (r != DSGD_OK) return dsgd__ps_worker_fail(w, r);
        w->pull_seq++;
        for (s = 0; s < w->P && w->sum_only; ++s) behind |= w->version[s] < w->latest[s];
        if (!behind) break;
    }
    if (w->sum_only) dsgd__ps_worker_copy_out(w, full_params);
    w->pulls++;
    w->pulled = 1;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_pull(dsgd_ps_worker *w, float *full_params) {
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__ps_worker_pull(w, full_params, "dsgd_ps_worker_pull", 1);
}

DSGD_API dsgd_result dsgd_ps_worker_push(dsgd_ps_worker *w, const float *full_grads) {
    static const char *const fn = "dsgd_ps_worker_push";
    dsgd_result r;
    int s, i;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    if (!full_grads) return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full_grads is NULL", fn, w->index);
    if (w->d.policy != DSGD_PS_ASYNC && !w->pulled)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: worker %d: %s needs a pull before each push (push %llu)",
                                  fn, w->index, dsgd_ps_policy_name(w->d.policy), (unsigned long long)w->push_seq);
    for (s = 0; s < w->P; ++s) {
        float *p = w->buf[s] + DSGD__PS_H;
        dsgd__ps_hdr_put(w->buf[s], DSGD_PS_MSG_PUSH, (uint64_t)w->index, w->push_seq, w->version[s], (uint64_t)w->n[s], 0);
        for (i = 0; i < dsgd_shard_map_num_shards(w->map); ++i) {
            const dsgd_shard *sh = dsgd_shard_map_shard(w->map, i);
            if (sh->server != s) continue;
            memcpy(p, full_grads + sh->offset, sh->count * sizeof(float));
            p += sh->count;
        }
        w->dropped[s] = 0;
        w->last_step[s] = w->version[s];
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

DSGD_API dsgd_result dsgd_ps_worker_set_params(dsgd_ps_worker *w, const float *full_params) {
    static const char *const fn = "dsgd_ps_worker_set_params";
    int s, i;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full_params)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full_params is NULL", fn, w->index);
    if (!w->sum_only || w->pulls > 0 || w->state != DSGD__PS_CREATED)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: worker %d: %s", fn, w->index,
                                  !w->sum_only ? "the servers hold the parameters (apply ON_SERVERS)"
                                               : "only before the first pull");
    for (s = 0; s < w->P; ++s) {
        float *p = w->be.buffer_host_ptr(w->be.impl, w->own[s]);
        for (i = 0; i < dsgd_shard_map_num_shards(w->map); ++i) {
            const dsgd_shard *sh = dsgd_shard_map_shard(w->map, i);
            if (sh->server != s) continue;
            memcpy(p, full_params + sh->offset, sh->count * sizeof(float));
            p += sh->count;
        }
    }
    w->params_set = 1;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_read_params(const dsgd_ps_worker *w, float *full) {
    static const char *const fn = "dsgd_ps_worker_read_params";
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full) return dsgd_ctx_set_error(w->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: worker %d: full is NULL", fn, w->index);
    if (!w->sum_only)
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE,
                                  "%s: worker %d: the servers hold the parameters (apply ON_SERVERS); read theirs", fn,
                                  w->index);
    dsgd__ps_worker_copy_out(w, full);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_ps_worker_finish(dsgd_ps_worker *w) {
    static const char *const fn = "dsgd_ps_worker_finish";
    uint64_t h[DSGD_PS_HEADER_WORDS];
    dsgd_result r;
    int s;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ps_worker_usable(w, fn)) != DSGD_OK) return r;
    dsgd__ps_hdr_put(h, DSGD_PS_MSG_DONE, (uint64_t)w->index, w->push_seq, 0, 0, 0);
    for (s = 0; s < w->P; ++s)
        if ((r = dsgd__ps_worker_send(w, fn, s, DSGD_PS_TAG(DSGD_PS_MSG_DONE, w->push_seq), h, sizeof h)) != DSGD_OK)
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
    if (w->have_be) {
        dsgd_buffer **own[4];
        int k;
        own[0] = w->own;
        own[1] = w->sum;
        own[2] = w->m1;
        own[3] = w->m2;
        for (k = 0; k < 4; ++k)
            for (s = 0; own[k] && s < w->P; ++s)
                if (own[k][s]) w->be.buffer_destroy(w->be.impl, own[k][s]);
        if (w->be.destroy) w->be.destroy(w->be.impl);
    }
    DSGD_FREE(w->own);
    DSGD_FREE(w->sum);
    DSGD_FREE(w->m1);
    DSGD_FREE(w->m2);
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
    w->pull_hdr = (uint64_t *)dsgd__alloc(ctx, P * DSGD__PS_HBYTES, fn);
    w->version = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->version, fn);
    w->last_step = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->last_step, fn);
    w->dropped = (int *)dsgd__alloc(ctx, P * sizeof *w->dropped, fn);
    w->pending = (int *)dsgd__alloc(ctx, P * sizeof *w->pending, fn);
    w->sent_at = (double *)dsgd__alloc(ctx, P * sizeof *w->sent_at, fn);
    w->backoff = (double *)dsgd__alloc(ctx, P * sizeof *w->backoff, fn);
    if (!w->n || !w->buf || !w->pull_hdr || !w->version || !w->last_step || !w->dropped || !w->pending || !w->sent_at ||
        !w->backoff) {
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
    if (d.apply == DSGD_PS_APPLY_ON_WORKERS) { /* the worker's copy and the optimizer's slots, on a CPU backend */
        int slots1 = d.optimizer.kind != DSGD_OPT_SGD;
        int slots2 = d.optimizer.kind == DSGD_OPT_ADAM || d.optimizer.kind == DSGD_OPT_ADAMW;
        w->sum_only = 1;
        w->own = (dsgd_buffer **)dsgd__alloc(ctx, P * sizeof *w->own, fn);
        w->sum = (dsgd_buffer **)dsgd__alloc(ctx, P * sizeof *w->sum, fn);
        w->m1 = (dsgd_buffer **)dsgd__alloc(ctx, P * sizeof *w->m1, fn);
        w->m2 = (dsgd_buffer **)dsgd__alloc(ctx, P * sizeof *w->m2, fn);
        w->latest = (int64_t *)dsgd__alloc(ctx, P * sizeof *w->latest, fn);
        if (!w->own || !w->sum || !w->m1 || !w->m2 || !w->latest) {
            dsgd_ps_worker_destroy(w);
            return DSGD_ERR_OUT_OF_MEMORY;
        }
        memset(w->own, 0, P * sizeof *w->own);
        memset(w->sum, 0, P * sizeof *w->sum);
        memset(w->m1, 0, P * sizeof *w->m1);
        memset(w->m2, 0, P * sizeof *w->m2);
        memset(w->latest, 0, P * sizeof *w->latest);
        r = dsgd_cpu_backend_create(ctx, &w->be);
        if (r == DSGD_OK) w->have_be = 1;
        for (s = 0; s < w->P && r == DSGD_OK; ++s) {
            r = w->be.buffer_create(w->be.impl, w->n[s], &w->own[s]);
            if (r == DSGD_OK) r = w->be.buffer_create(w->be.impl, DSGD__PS_H + w->n[s], &w->sum[s]);
            if (r == DSGD_OK && slots1) r = w->be.buffer_create(w->be.impl, w->n[s], &w->m1[s]);
            if (r == DSGD_OK && slots2) r = w->be.buffer_create(w->be.impl, w->n[s], &w->m2[s]);
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
}

DSGD_API int64_t dsgd_ps_worker_version(const dsgd_ps_worker *w, int server) {
    return w && server >= 0 && server < w->P ? w->version[server] : -1;
}

DSGD_API int dsgd_ps_worker_last_push_dropped(const dsgd_ps_worker *w, int server) {
    return w && server >= 0 && server < w->P ? w->dropped[server] : 0;
}

DSGD_API int dsgd_ps_worker_failed(const dsgd_ps_worker *w) {
    return w && w->state == DSGD__PS_FAILED;
}

/* >>ps checkpoints --------------------------------------------------------- */
/* The sections of a rank's checkpoint (see CHECKPOINTS above):
     "ps_server"  identity, floats, version, counters, staleness histogram
     "ps_peers"   per worker: next push seq, last push status, next pull
                  seq, the pending pull's minimum version and first step,
                  the means it fetched (ON_WORKERS)
     "ps_clocks"  the gradients accepted for clocks not yet applied
     "params", "optimizer"  ON_SERVERS: the server's floats and slots, in
                  the layout of checkpoint.h (its step is the version)
     "ps_worker"  identity, seqs, flags, counters, per server its floats,
                  version, last step, dropped flag, announced version
     "ps_copy"    ON_WORKERS: the worker's copy and slots, each the servers'
                  ranges in server order
     "ps_map"     (both) the shard map's layout */

#define DSGD__PS_CK_SHARD 36  /* bytes of a "ps_map" record */
#define DSGD__PS_CK_PEER 48   /* of a "ps_peers" record */
#define DSGD__PS_CK_SERVER 36 /* of a "ps_worker" per-server record */

/* The size hint of an image of `copies` x n floats (0 on overflow: the
   writer then grows). */
static size_t dsgd__ps_ck_expect(size_t n, size_t copies) {
    size_t floats;
    if (dsgd__mul_overflows(n, copies, &floats) || floats > (SIZE_MAX - 65536) / sizeof(float)) return 0;
    return 65536 + floats * sizeof(float);
}

/* What a rank's checkpoint must share with the rank restoring it: its
   index among its role, the desc's shape and the optimizer's kind. */
typedef struct dsgd__ps_ident {
    uint32_t index, P, W, policy, apply, staleness, backup, opt;
} dsgd__ps_ident;

static dsgd__ps_ident dsgd__ps_ident_of(const dsgd_ps_desc *d, int index) {
    dsgd__ps_ident id;
    id.index = (uint32_t)index;
    id.P = (uint32_t)d->num_servers;
    id.W = (uint32_t)d->num_workers;
    id.policy = (uint32_t)d->policy;
    id.apply = (uint32_t)d->apply;
    id.staleness = (uint32_t)d->staleness;
    id.backup = (uint32_t)d->backup_workers;
    id.opt = (uint32_t)d->optimizer.kind;
    return id;
}

static void dsgd__ps_put_ident(dsgd__ck_writer *w, const dsgd__ps_ident *id) {
    dsgd__ckw_u32(w, id->index);
    dsgd__ckw_u32(w, id->P);
    dsgd__ckw_u32(w, id->W);
    dsgd__ckw_u32(w, id->policy);
    dsgd__ckw_u32(w, id->apply);
    dsgd__ckw_u32(w, id->staleness);
    dsgd__ckw_u32(w, id->backup);
    dsgd__ckw_u32(w, id->opt);
}

static void dsgd__ps_get_ident(dsgd__ck_cur *c, dsgd__ps_ident *id) {
    id->index = dsgd__ckr_u32(c);
    id->P = dsgd__ckr_u32(c);
    id->W = dsgd__ckr_u32(c);
    id->policy = dsgd__ckr_u32(c);
    id->apply = dsgd__ckr_u32(c);
    id->staleness = dsgd__ckr_u32(c);
    id->backup = dsgd__ckr_u32(c);
    id->opt = dsgd__ckr_u32(c);
}

static const char *dsgd__ps_apply_text(uint32_t a) {
    return a == DSGD_PS_APPLY_ON_SERVERS ? "ON_SERVERS" : a == DSGD_PS_APPLY_ON_WORKERS ? "ON_WORKERS" : "?";
}

/* DSGD_ERR_SHAPE unless the saved identity is this rank's; role is
   "server" or "worker". */
static dsgd_result dsgd__ps_check_ident(const dsgd__ck_file *f, const char *role, const dsgd__ps_ident *got,
                                        const dsgd__ps_ident *want) {
    dsgd__ps_ident same = *got;
    same.index = want->index;
    if (memcmp(&same, want, sizeof same) != 0)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: a checkpoint of another run: %u servers, %u workers, %s (staleness %u, backup "
                                  "workers %u), apply %s, %s in the checkpoint; %u, %u, %s (%u, %u), %s, %s here",
                                  f->what,
                                  f->path, (unsigned)got->P, (unsigned)got->W,
                                  dsgd_ps_policy_name((dsgd_ps_policy)got->policy), (unsigned)got->staleness,
                                  (unsigned)got->backup, dsgd__ps_apply_text(got->apply), dsgd__opt_kind_text(got->opt),
                                  (unsigned)want->P, (unsigned)want->W,
                                  dsgd_ps_policy_name((dsgd_ps_policy)want->policy), (unsigned)want->staleness,
                                  (unsigned)want->backup, dsgd__ps_apply_text(want->apply),
                                  dsgd__opt_kind_text(want->opt));
    if (got->index != want->index)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE, "%s: %s: the checkpoint of %s %u, not of %s %u", f->what,
                                  f->path, role, (unsigned)got->index, role, (unsigned)want->index);
    return DSGD_OK;
}

/* The rank's own section ("ps_server" or "ps_worker"), or NULL after
   DSGD_ERR_SHAPE naming what the file holds instead. */
static const dsgd__ck_section *dsgd__ps_ck_role(const dsgd__ck_file *f, int server) {
    const char *name = server ? "ps_server" : "ps_worker", *role = server ? "server" : "worker";
    const char *other = server ? "worker" : "server";
    const dsgd__ck_section *sec = dsgd__ck_find(f, name), *alt = dsgd__ck_find(f, server ? "ps_worker" : "ps_server");
    if (sec) return sec;
    if (alt) {
        dsgd__ck_cur c = dsgd__ck_cursor(alt);
        uint32_t index = dsgd__ckr_u32(&c);
        dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                           "%s: %s: a checkpoint of %s %u of a parameter-server run, not of a %s", f->what, f->path,
                           other, (unsigned)index, role);
    } else if (dsgd__ck_find(f, "model")) {
        dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE, "%s: %s: a model's or strategy's checkpoint, not a parameter %s's",
                           f->what, f->path, role);
    } else {
        dsgd__ck_need(f, name, server ? "a parameter server" : "a parameter-server worker");
    }
    return NULL;
}

/* "ps_map": the layout of every shard (every rank holds the same map). */
static void dsgd__ps_put_map(dsgd__ck_writer *w, const dsgd_shard_map *map) {
    int i, ns = dsgd_shard_map_num_shards(map);
    dsgd__ckw_begin(w, "ps_map");
    dsgd__ckw_u32(w, (uint32_t)dsgd_shard_map_num_servers(map));
    dsgd__ckw_u32(w, (uint32_t)ns);
    for (i = 0; i < ns; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(map, i);
        dsgd__ckw_u32(w, (uint32_t)sh->variable);
        dsgd__ckw_u32(w, (uint32_t)sh->part);
        dsgd__ckw_u32(w, (uint32_t)sh->server);
        dsgd__ckw_u32(w, (uint32_t)sh->row_begin);
        dsgd__ckw_u32(w, (uint32_t)sh->rows);
        dsgd__ckw_u64(w, (uint64_t)sh->offset);
        dsgd__ckw_u64(w, (uint64_t)sh->count);
    }
    dsgd__ckw_end(w);
}

static dsgd_result dsgd__ps_check_map(const dsgd__ck_file *f, const dsgd_shard_map *map) {
    const dsgd__ck_section *sec = dsgd__ck_need(f, "ps_map", "the shard map");
    int ns = dsgd_shard_map_num_shards(map), np = dsgd_shard_map_num_servers(map);
    uint32_t servers, shards, i;
    dsgd__ck_cur c;
    if (!sec) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    servers = dsgd__ckr_u32(&c);
    shards = dsgd__ckr_u32(&c);
    if (c.bad || c.left % DSGD__PS_CK_SHARD != 0 || c.left / DSGD__PS_CK_SHARD != shards)
        return dsgd__ck_bad_section(f, sec, "not one 36-byte record per shard");
    for (i = 0; i < shards && (int)i < ns; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(map, (int)i);
        uint32_t var = dsgd__ckr_u32(&c), part = dsgd__ckr_u32(&c), server = dsgd__ckr_u32(&c);
        uint32_t row0 = dsgd__ckr_u32(&c), rows = dsgd__ckr_u32(&c);
        uint64_t off = dsgd__ckr_u64(&c), count = dsgd__ckr_u64(&c);
        if (var != (uint32_t)sh->variable || part != (uint32_t)sh->part || server != (uint32_t)sh->server ||
            row0 != (uint32_t)sh->row_begin || rows != (uint32_t)sh->rows || off != (uint64_t)sh->offset ||
            count != (uint64_t)sh->count)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: another shard map: shard %u is part %u of variable %u (%u rows from row "
                                      "%u, %llu floats at %llu) on server %u in the checkpoint, part %d of variable %d "
                                      "(%d rows from row %d, %zu floats at %zu) on server %d in this map", f->what,
                                      f->path, (unsigned)i, (unsigned)part, (unsigned)var, (unsigned)rows,
                                      (unsigned)row0, (unsigned long long)count, (unsigned long long)off,
                                      (unsigned)server, sh->part, sh->variable, sh->rows, sh->row_begin, sh->count,
                                      sh->offset, sh->server);
    }
    if (servers != (uint32_t)np || shards != (uint32_t)ns)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: another shard map: %u shards over %u servers in the checkpoint, %d over %d "
                                  "in this map", f->what, f->path, (unsigned)shards, (unsigned)servers, ns, np);
    return DSGD_OK;
}

/* ---- the server */

static int dsgd__ps_server_slots(const dsgd_ps_server *s) { return (s->m1 != NULL) + (s->m2 != NULL); }

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
    for (k = 0; k < s->W && s->sum_only; ++k)
        if (s->peer[k].have < s->agg_base)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE,
                                      "%s: worker %d finished having fetched the means of %lld steps, and the server "
                                      "no longer keeps step %lld's, which the others fetched after it (let every "
                                      "worker pull after its last push, or none)", what, k,
                                      (long long)s->peer[k].have, (long long)s->peer[k].have);
    cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0;
    for (i = 0; i < cells; ++i) held += s->slot[i] != NULL;
    nslots = dsgd__ps_server_slots(s);
    slot[0] = s->m1;
    slot[1] = s->m2;
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
    if (s->sum_only) {
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

/* A server's checkpoint, checked and located in the image. */
typedef struct dsgd__ps_ck_server {
    int64_t version, cnt[8]; /* received, applied, duplicates, dropped, pulls, deferred, repeated, stal_max */
    double stal_sum;
    const unsigned char *hist, *peers, *params, *slots, *means;
    const dsgd__ck_section *clocks;
    uint32_t held, nmeans;
    int64_t min_have; /* the fewest means a worker has fetched */
} dsgd__ps_ck_server;

/* Walks the records of "ps_clocks" (after its count): row, worker, version
   computed on, the gradient's floats. */
static int dsgd__ps_ck_clock(dsgd__ck_cur *c, size_t n, uint32_t *row, uint32_t *worker, int64_t *vcomp,
                             const unsigned char **floats) {
    *row = dsgd__ckr_u32(c);
    *worker = dsgd__ckr_u32(c);
    *vcomp = (int64_t)dsgd__ckr_u64(c);
    *floats = dsgd__ckr_floats(c, (uint64_t)n);
    return !c->bad;
}

static dsgd_result dsgd__ps_check_server(const dsgd__ck_file *f, const dsgd_ps_server *s, dsgd__ps_ck_server *st) {
    const dsgd__ck_section *sec = dsgd__ps_ck_role(f, 1);
    dsgd__ps_ident got, want = dsgd__ps_ident_of(&s->d, s->index);
    size_t cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0, rec;
    uint64_t n, sum = 0;
    uint32_t bins, nw, i;
    int64_t prev = -1;
    dsgd__ck_cur c;
    dsgd_result r;
    int k;
    if (!sec) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    dsgd__ps_get_ident(&c, &got);
    bins = dsgd__ckr_u32(&c);
    n = dsgd__ckr_u64(&c);
    st->version = (int64_t)dsgd__ckr_u64(&c);
    for (k = 0; k < 8; ++k) st->cnt[k] = (int64_t)dsgd__ckr_u64(&c);
    st->stal_sum = dsgd__ckr_f64(&c);
    if (c.bad || bins == 0 || bins > DSGD_PS_MAX_STALENESS_BINS || c.left != (size_t)bins * 8)
        return dsgd__ck_bad_section(f, sec, "cut short, or not a histogram of its bins");
    if ((r = dsgd__ps_check_ident(f, "server", &got, &want)) != DSGD_OK) return r;
    if (bins != (uint32_t)s->d.staleness_bins)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: the checkpoint's staleness histogram has %u bins, this server's %d", f->what,
                                  f->path, (unsigned)bins, s->d.staleness_bins);
    if ((r = dsgd__ps_check_map(f, s->map)) != DSGD_OK) return r;
    if (n != (uint64_t)s->n) return dsgd__ck_bad_section(f, sec, "not the floats its shard map places on the server");
    if (st->version < 0 || !(st->stal_sum >= 0.0))
        return dsgd__ck_bad_section(f, sec, "a negative version or staleness sum");
    for (k = 0; k < 8; ++k)
        if (st->cnt[k] < 0) return dsgd__ck_bad_section(f, sec, "a negative counter");
    st->hist = c.p;
    for (i = 0; i < bins; ++i) {
        uint64_t h = dsgd__ckr_u64(&c);
        if (h > (uint64_t)st->cnt[1] - sum) break;
        sum += h;
    }
    if (i < bins || sum != (uint64_t)st->cnt[1])
        return dsgd__ck_bad_section(f, sec, "a staleness histogram that does not sum to the applied pushes");
    /* the workers' exactly-once tables */
    if (!(sec = dsgd__ck_need(f, "ps_peers", "the workers' sequence tables"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    nw = dsgd__ckr_u32(&c);
    if (c.bad || nw != (uint32_t)s->W || c.left != (size_t)nw * DSGD__PS_CK_PEER)
        return dsgd__ck_bad_section(f, sec, "not one 48-byte record per worker");
    st->peers = c.p;
    st->min_have = st->version;
    for (i = 0; i < nw; ++i) {
        uint64_t next = dsgd__ckr_u64(&c), status = dsgd__ckr_u64(&c), pull_next = dsgd__ckr_u64(&c);
        int64_t have;
        (void)dsgd__ckr_u64(&c); /* pull_min, pull_from: any */
        (void)dsgd__ckr_u64(&c);
        have = (int64_t)dsgd__ckr_u64(&c);
        if (next > DSGD_PS_SEQ_MASK || pull_next > DSGD_PS_SEQ_MASK || status > DSGD_PS_DROPPED || have < 0 ||
            have > st->version)
            return dsgd__ck_bad_section(f, sec, "a sequence number, status or fetched count out of range");
        if (have < st->min_have) st->min_have = have;
    }
    /* the gradients of clocks not yet applied, in slot order */
    if (!(sec = dsgd__ck_need(f, "ps_clocks", "the gradients of clocks not yet applied"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    st->held = dsgd__ckr_u32(&c);
    rec = 16 + s->n * sizeof(float);
    if (c.bad || st->held > cells || (st->held ? c.left % st->held != 0 || c.left / st->held != rec : c.left != 0))
        return dsgd__ck_bad_section(f, sec, "not a record of the server's floats per held gradient");
    st->clocks = sec;
    for (i = 0; i < st->held; ++i) {
        uint32_t row, worker;
        int64_t vcomp;
        const unsigned char *g;
        if (!dsgd__ps_ck_clock(&c, s->n, &row, &worker, &vcomp, &g) || row >= (uint32_t)s->ring ||
            worker >= (uint32_t)s->W || (int64_t)row * s->W + worker <= prev)
            return dsgd__ck_bad_section(f, sec, "a clock record out of range or out of order");
        prev = (int64_t)row * s->W + worker;
    }
    if (s->sum_only) { /* the means kept: the last steps, every one a worker has not fetched */
        if (!(sec = dsgd__ck_need(f, "ps_means", "the means the workers have not fetched"))) return DSGD_ERR_SHAPE;
        c = dsgd__ck_cursor(sec);
        st->nmeans = dsgd__ckr_u32(&c);
        rec = 8 + s->n * sizeof(float);
        if (c.bad || (int64_t)st->nmeans > st->version || c.left % rec != 0 || c.left / rec != st->nmeans)
            return dsgd__ck_bad_section(f, sec, "not a record of the server's floats per kept mean");
        st->means = c.p;
        for (i = 0; i < st->nmeans; ++i) {
            if (dsgd__ckr_u64(&c) != (uint64_t)(st->version - st->nmeans + i))
                return dsgd__ck_bad_section(f, sec, "means not of the last steps, in order");
            (void)dsgd__ckr_floats(&c, (uint64_t)s->n);
        }
        if (st->min_have < st->version - (int64_t)st->nmeans)
            return dsgd__ck_bad_section(f, sec, "a worker lacks a mean the server does not keep");
        return DSGD_OK;
    }
    /* ON_SERVERS: the parameters and the optimizer's slots */
    if (!(sec = dsgd__ck_need(f, "params", "the server's parameters"))) return DSGD_ERR_SHAPE;
    if (sec->size != s->n * sizeof(float)) return dsgd__ck_bad_section(f, sec, "not the server's float count");
    st->params = sec->data;
    if (!(sec = dsgd__ck_need(f, "optimizer", "the optimizer's slots"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    {
        uint32_t kind = dsgd__ckr_u32(&c), nslots;
        uint64_t t = dsgd__ckr_u64(&c), np;
        (void)dsgd__ckr_f64(&c); /* last norm: the servers keep none */
        nslots = dsgd__ckr_u32(&c);
        np = dsgd__ckr_u64(&c);
        if (c.bad || kind != (uint32_t)s->d.optimizer.kind || t != (uint64_t)st->version ||
            nslots != (uint32_t)dsgd__ps_server_slots(s) || np != (uint64_t)s->n ||
            c.left != (size_t)nslots * s->n * sizeof(float))
            return dsgd__ck_bad_section(f, sec, "not the server's optimizer kind, step (its version) or slots");
    }
    st->slots = c.p;
    return DSGD_OK;
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
        pe->next_seq = dsgd__ck_get64(p);
        pe->last_status = dsgd__ck_get64(p + 8);
        pe->pull_next = dsgd__ck_get64(p + 16);
        pe->pull_min = (int64_t)dsgd__ck_get64(p + 24);
        pe->pull_from = (int64_t)dsgd__ck_get64(p + 32);
        pe->have = (int64_t)dsgd__ck_get64(p + 40);
    }
    s->done_count = 0;
    if (s->sum_only) { /* the buffers of agg[0..nmeans) exist (dsgd__ps_ck_mean_buffers) */
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
    if (!s->sum_only) {
        dsgd_buffer *slot[2];
        slot[0] = s->m1;
        slot[1] = s->m2;
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
    dsgd__ck_file f;
    dsgd_result r;
    size_t i, have, cells;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof what, "dsgd_ps_server_restore: server %d", s->index);
    if ((r = dsgd__ck_check_args(s->ctx, what, path, NULL)) != DSGD_OK) return r;
    if (s->state != DSGD__PS_CREATED)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE, "%s: restore into a server before serve (this one %s)", what,
                                  s->state == DSGD__PS_FAILED ? "failed" : "has served");
    memset(&st, 0, sizeof st);
    if ((r = dsgd__ck_open(&f, s->ctx, what, path)) == DSGD_OK) r = dsgd__ps_check_server(&f, s, &st);
    if (r == DSGD_OK) {
        /* the buffers of the held gradients first (into the pool, which
           holds every buffer not in a slot), so nothing fails after the
           first write */
        cells = s->slot ? (size_t)s->ring * (size_t)s->W : 0;
        for (have = (size_t)s->pool_len, i = 0; i < cells; ++i) have += s->slot[i] != NULL;
        for (; have < st.held && r == DSGD_OK; ++have)
            if ((r = s->be.buffer_create(s->be.impl, DSGD__PS_H + s->n, &s->pool[s->pool_len])) == DSGD_OK) s->pool_len++;
        if (r == DSGD_OK && s->sum_only) r = dsgd__ps_ck_mean_buffers(s, what, st.nmeans);
        if (r == DSGD_OK) dsgd__ps_server_apply_ck(s, &st);
    }
    dsgd__ck_close(&f);
    return r;
}

/* ---- the worker */

static int dsgd__ps_worker_slots(const dsgd_ps_worker *w) {
    return w->sum_only ? (w->m1[0] != NULL) + (w->m2[0] != NULL) : 0;
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
    if (w->state == DSGD__PS_CREATED && dsgd__ps_worker_moved(w))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE,
                                  "%s: it is between its first pull and finish (at push %llu, pull %llu): the servers, "
                                  "serving, cannot be saved with it; save after dsgd_ps_worker_finish", what,
                                  (unsigned long long)w->push_seq, (unsigned long long)w->pull_seq);
    nslots = dsgd__ps_worker_slots(w);
    id = dsgd__ps_ident_of(&w->d, w->index);
    dsgd__ckw_init(&wr, w->ctx, what,
                   dsgd__ps_ck_expect(dsgd__ps_worker_floats(w), w->sum_only ? 1 + (size_t)nslots : 0));
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
        dsgd__ckw_u64(&wr, (uint64_t)(w->sum_only ? w->latest[s] : 0));
    }
    dsgd__ckw_end(&wr);
    dsgd__ps_put_map(&wr, w->map);
    if (w->sum_only) {
        dsgd_buffer **arr[3];
        arr[0] = w->own;
        arr[1] = w->m1;
        arr[2] = w->m2;
        dsgd__ckw_begin(&wr, "ps_copy");
        dsgd__ckw_u32(&wr, (uint32_t)nslots);
        dsgd__ckw_u64(&wr, (uint64_t)dsgd__ps_worker_floats(w));
        for (k = 0; k <= nslots; ++k)
            for (s = 0; s < w->P; ++s) dsgd__ckw_read(&wr, &w->be, dsgd__ref(arr[k][s], 0), w->n[s]);
        dsgd__ckw_end(&wr);
    }
    return dsgd__ckw_commit(&wr, path);
}

/* A worker's checkpoint, checked and located in the image. */
typedef struct dsgd__ps_ck_worker {
    uint32_t pulled, params_set;
    uint64_t push_seq, pull_seq;
    int64_t cnt[5]; /* pulls, push_resends, pull_resends, pushes_dropped, stale */
    const unsigned char *servers, *copy;
} dsgd__ps_ck_worker;

static dsgd_result dsgd__ps_check_worker(const dsgd__ck_file *f, const dsgd_ps_worker *w, dsgd__ps_ck_worker *st) {
    const dsgd__ck_section *sec = dsgd__ps_ck_role(f, 0);
    dsgd__ps_ident got, want = dsgd__ps_ident_of(&w->d, w->index);
    uint32_t finished, nP, s;
    dsgd__ck_cur c;
    dsgd_result r;
    int k;
    if (!sec) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    dsgd__ps_get_ident(&c, &got);
    finished = dsgd__ckr_u32(&c);
    st->pulled = dsgd__ckr_u32(&c);
    st->params_set = dsgd__ckr_u32(&c);
    st->push_seq = dsgd__ckr_u64(&c);
    st->pull_seq = dsgd__ckr_u64(&c);
    for (k = 0; k < 5; ++k) st->cnt[k] = (int64_t)dsgd__ckr_u64(&c);
    nP = dsgd__ckr_u32(&c);
    if (c.bad || c.left % DSGD__PS_CK_SERVER != 0 || c.left / DSGD__PS_CK_SERVER != nP || nP != got.P)
        return dsgd__ck_bad_section(f, sec, "cut short, or not one 36-byte record per server");
    if ((r = dsgd__ps_check_ident(f, "worker", &got, &want)) != DSGD_OK) return r;
    if ((r = dsgd__ps_check_map(f, w->map)) != DSGD_OK) return r;
    if (finished > 1 || st->pulled > 1 || st->params_set > 1 || st->push_seq > DSGD_PS_SEQ_MASK ||
        st->pull_seq > DSGD_PS_SEQ_MASK)
        return dsgd__ck_bad_section(f, sec, "a flag or sequence number out of range");
    for (k = 0; k < 5; ++k)
        if (st->cnt[k] < 0) return dsgd__ck_bad_section(f, sec, "a negative counter");
    st->servers = c.p;
    for (s = 0; s < nP; ++s) {
        uint64_t n = dsgd__ckr_u64(&c);
        int64_t version = (int64_t)dsgd__ckr_u64(&c), last = (int64_t)dsgd__ckr_u64(&c);
        uint32_t dropped = dsgd__ckr_u32(&c);
        int64_t latest = (int64_t)dsgd__ckr_u64(&c);
        if (n != (uint64_t)w->n[s])
            return dsgd__ck_bad_section(f, sec, "not the floats its shard map places on the servers");
        if (version < 0 || last < -1 || dropped > 1 || latest < 0)
            return dsgd__ck_bad_section(f, sec, "a version, step or flag out of range");
    }
    if (!w->sum_only) return DSGD_OK;
    /* ON_WORKERS: the worker's copy and slots */
    if (!(sec = dsgd__ck_need(f, "ps_copy", "the worker's copy of the parameters"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    {
        uint32_t nslots = dsgd__ckr_u32(&c);
        uint64_t total = dsgd__ckr_u64(&c);
        size_t floats = dsgd__ps_worker_floats(w);
        if (c.bad || nslots != (uint32_t)dsgd__ps_worker_slots(w) || total != (uint64_t)floats ||
            c.left / sizeof(float) / (1 + nslots) != floats || c.left != (1 + nslots) * floats * sizeof(float))
            return dsgd__ck_bad_section(f, sec, "not the worker's floats and optimizer slots");
    }
    st->copy = c.p;
    return DSGD_OK;
}

/* Writes the checked state into w; nothing here fails. */
static void dsgd__ps_worker_apply_ck(dsgd_ps_worker *w, const dsgd__ps_ck_worker *st) {
    int s, k;
    w->push_seq = w->push_seq0 = st->push_seq;
    w->pull_seq = w->pull_seq0 = st->pull_seq;
    w->pulled = (int)st->pulled;
    w->params_set = w->sum_only && st->params_set;
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
        if (w->sum_only) w->latest[s] = (int64_t)dsgd__ck_get64(p + 28);
    }
    w->state = DSGD__PS_CREATED; /* a finished worker goes on */
    if (w->sum_only) {
        const unsigned char *src = st->copy;
        dsgd_buffer **arr[3];
        arr[0] = w->own;
        arr[1] = w->m1;
        arr[2] = w->m2;
        for (k = 0; k <= dsgd__ps_worker_slots(w); ++k)
            for (s = 0; s < w->P; ++s) {
                dsgd__ck_copy_floats(w->be.buffer_host_ptr(w->be.impl, arr[k][s]), src, w->n[s]);
                src += w->n[s] * sizeof(float);
            }
    }
}

DSGD_API dsgd_result dsgd_ps_worker_restore(dsgd_ps_worker *w, const char *path) {
    char what[64];
    dsgd__ps_ck_worker st;
    dsgd__ck_file f;
    dsgd_result r;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof what, "dsgd_ps_worker_restore: worker %d", w->index);
    if ((r = dsgd__ck_check_args(w->ctx, what, path, NULL)) != DSGD_OK) return r;
    if (w->state != DSGD__PS_CREATED || dsgd__ps_worker_moved(w))
        return dsgd_ctx_set_error(w->ctx, DSGD_ERR_STATE, "%s: restore into a worker before its first pull (this one %s)",
                                  what, w->state == DSGD__PS_FAILED ? "failed" : w->state == DSGD__PS_DONE ? "finished"
                                                                                                          : "pulled or pushed");
    memset(&st, 0, sizeof st);
    if ((r = dsgd__ck_open(&f, w->ctx, what, path)) == DSGD_OK && (r = dsgd__ps_check_worker(&f, w, &st)) == DSGD_OK)
        dsgd__ps_worker_apply_ck(w, &st);
    dsgd__ck_close(&f);
    return r;
}

#endif /* DSGD__PART_PS_IMPL */
