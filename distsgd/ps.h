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
                 and BACKUP as many steps as the slowest worker lags.
                 dsgd_ps_worker_finish first fetches the means of every
                 clock the worker pushed (SSP: it waits for the slowest),
                 so every worker ends with the same bits and a server has
                 every mean it must keep for a checkpoint.

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
             2016), N = W - b. The global step is the step every server has
             applied: the least version a worker read at its last pull
             (dsgd_ps_worker_global_step). A push is tagged with the
             worker's global step, the same on every server. A server
             accepts the first N pushes tagged with its current step; when
             the N-th arrives their sum in worker rank order (not arrival
             order, so a run is reproducible given the accepted set),
             divided by N, is applied. Pushes for an older step are
             acknowledged as dropped, counted, and never applied. A
             worker's pull waits until every server has applied the step it
             last pushed for (TF's token queue). Each server decides its
             accepted set on its own, as each of TF's per-variable
             accumulators does. With b = 0 it is SYNC, bit for bit.
             How it maps to TF: TF keeps one global_step variable, which the
             chief increments once every accumulator has applied the step;
             here a step is global once every server has applied it, and a
             worker's tag is TF's local_step. No push is ever tagged with a
             step that some server has not reached, so no server opens a
             step ahead of the others: workers that stop once the global
             step reaches a target T leave every server at version T, with
             any number of servers.
             Late workers, two ways (dsgd_ps_desc.backup_cancel):
               0 (TF's protocol) a late worker finishes its stale gradient,
                 pushes it (dropped) and only then pulls the new step;
               1 (cancelling) when a server applies a step it sends CANCEL
                 to every worker it did not accept a push of that step
                 from and whose pull does not wait; a worker computing
                 through dsgd_ps_worker_compute_for abandons its gradient
                 there and pulls the new step at once (dsgd_ps_worker_run
                 skips the push).
             With i.i.d. Exp(mu) compute, free links and free applies
             (P = N + b workers, H_k the harmonic numbers), the cancelling
             step is the N-th order statistic of P fresh Exp(mu):
               E[T] = (H_P - H_b) / mu
             (Renyi). TF's protocol starts every step with the N accepted
             workers fresh and the b others still inside a stale
             gradient, whose remainder is again Exp(mu) (memoryless), so
             T is the N-th smallest of N Exp(mu) and b Erlang(2, mu):
               E[T] = integral_0^inf P(fewer than N done by t) dt,
               P(.) = sum_{i+j<N} C(N,i) F1^i (1-F1)^(N-i) C(b,j) F2^j (1-F2)^(b-j),
               F1 = 1 - e^(-mu t), F2 = 1 - e^(-mu t) (1 + mu t);
             at P = 8 that is 12.5%, 26% and 63% above (H_P - H_b)/mu for
             b = 1, 2 and 4 (equal at b = 0).
     In SSP, SYNC and BACKUP a worker must pull before each push
     (DSGD_ERR_STATE otherwise). In SSP and SYNC every worker must push as
     many times as the others: a clock that misses a finished worker's
     gradient is never applied. In BACKUP workers stop on the global step,
     as TF's (pull; stop once dsgd_ps_worker_global_step reaches the
     target; else compute and push): a worker that pushes a fixed number of
     times may wait for a step the others, finished, no longer complete. A
     server sees when a deferred pull can never be answered and fails at
     once with DSGD_ERR_DESYNC naming the workers; the waiting worker times
     out. Pushes of a last, incomplete clock or step are never applied.
     dsgd_ps_worker_run (THE LOOP in ps_worker.h) is that loop, with each
     policy's stop rule from the table below: BACKUP stops once the global
     step reaches the target; ASYNC, SSP and SYNC after the target's number
     of pushes of each worker (dsgd_ps_policy_stops_on_global says which).

   WIRE PROTOCOL

     A message is a dsgd_ps_header (DSGD_PS_HEADER_WORDS 64-bit words:
     type, worker, seq, version, count, status, step) followed by count
     floats; its tag is DSGD_PS_TAG(type, seq). Servers take messages in
     arrival order with the transport's probe (receive from any source),
     which both roles need (DSGD_ERR_UNSUPPORTED without it).
       PUSH    worker -> server: seq = the worker's push number, version =
               the version computed on (BACKUP: the global step), count =
               the server's floats
       ACK     server -> worker: seq = that push, status 0 (applied or
               accepted) or DSGD_PS_DROPPED (BACKUP: stale), version = the
               server's version
       PULL    worker -> server: seq = the worker's pull number, version =
               the version the reply must have at least (the policy's
               wait); summation only (ON_WORKERS): step = the step whose
               mean the worker wants next (the number it has applied)
       PARAMS  server -> worker: seq = that pull, version = the server's
               version, count floats: of parameters; summation only, of the
               mean of step `step`, or none with step = -1 when the worker
               has every mean (a server that holds no floats sends means of
               0 floats, told apart by their step). A worker pulls again
               until it has the means of every step the first reply
               announced.
       DONE    worker -> server: seq = the worker's number of pushes
       CANCEL  server -> worker (BACKUP with backup_cancel): seq 0,
               version = the server's new version (the step it applied +
               1), no floats; a worker not computing drops it
       JOIN    late worker -> server (see MEMBERSHIP): seq = the round
               (0 prepare, 1 commit), version = -1 (prepare) or the clock
               it joins at (commit)
       JOINED  server -> worker: seq = that round, version = the server's
               version (prepare: the clock it counts the worker from),
               status DSGD_PS_ADMITTED once committed, step = the clock
               the server counts the worker from
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

   SIMULATED COSTS

     Every optimizer update the engine applies (a server's, or a
     summation-only worker's of a mean) is followed by the transport's
     charge_apply with the floats updated, when it has one: over simnet an
     update of k floats then costs k * apply_s_per_float of virtual time
     (by default the reduction's gamma), so a server's apply is part of
     its step, as on a cluster. Real transports have none.

   MEMBERSHIP: WORKERS THAT JOIN MID-RUN

     dsgd_ps_desc.initial_workers = W0 < W makes workers 0..W0-1 the
     members a server counts from the start and W0..W-1 late workers: a
     server neither waits for nor times out a late worker until it joins.
     A late worker's first pull or push joins (dsgd_ps_worker_join does it
     explicitly; dsgd_ps_worker_run's first pull so joins); one that will
     not come calls dsgd_ps_worker_finish instead.
     The join is two rounds of JOIN / JOINED with every server, so that
     every server counts the worker from the same clock b:
       prepare  JOIN with version -1. Server s makes the worker a member
                at once, counted from its current version v_s: a clocked
                server (SSP, SYNC, BACKUP) applies no clock >= v_s without
                it; from now on the server also times it out. JOINED
                answers v_s.
       commit   JOIN with version b = max_s v_s. Every server takes b as
                the worker's first clock (none can have applied clock b:
                each stopped at v_s <= b), so clocks v_s..b-1 go on without
                it. JOINED answers admitted (status DSGD_PS_ADMITTED).
     The worker's clock is then b + its pushes: its k-th push belongs to
     clock b + k (SSP, SYNC), the run's stop rule counts from b, and its
     first pull waits for version >= b on every server (clocked
     policies; ASYNC pulls at once), so it starts from the weights every
     server had reached when it joined. From clock b on, SSP and SYNC
     count it among the gradients a clock needs and BACKUP among the
     workers (N = members - b); ASYNC simply serves it. A SYNC run's
     weights are so those of a run that averages, at each clock, the
     members' gradients of that clock. A server's stats count the
     admissions (dsgd_ps_server_stats.joins) and, per worker, the clock it
     joined at and its gradients (dsgd_ps_server_get_peer_stats).
     Late workers need apply ON_SERVERS (a summation-only worker would
     need every mean since step 0) and more initial workers than backups
     under BACKUP; a server with late workers cannot be saved or restored
     (DSGD_ERR_UNSUPPORTED). Once every member has finished, a server
     waits timeout_s more for late workers that neither joined nor
     finished, then fails naming them. A lost worker is not replaced by a
     joiner: SSP, SYNC and BACKUP still count it (see DEADLINES).

   A LOST SERVER

     A server holds the only copy of its shards and of their optimizer
     state; nothing replicates them, so a run cannot go on without it.
     What each role sees when a server dies (its process ends, its
     thread's serve fails, simnet KILLs it):
       a worker    its next pull or push (or the one it is in) fails with
                   DSGD_ERR_TIMEOUT within timeout_s of its request,
                   "dsgd_ps_worker_pull: worker w: no parameters from
                   server s within T s (pull n)" (push: "no
                   acknowledgement"; under SSP, SYNC and BACKUP a pull
                   may also name live servers, whose clock can no longer
                   complete); a send the transport cannot deliver
                   (a large message waiting for its receiver, a full
                   queue) fails the same way within timeout_s, naming
                   the server. The worker is then unusable
                   (dsgd_ps_worker_failed).
                   A worker computing a gradient learns of it only at its
                   next request, so within compute + timeout_s.
       the others  the remaining servers, whose workers stopped, fail with
                   DSGD_ERR_TIMEOUT naming the workers timeout_s after
                   they last heard from them (or at once after the
                   transport's abort). No rank hangs.
       a strategy  (DSGD_STRATEGY_PARAMETER_SERVER) the step in flight
                   fails with the worker's error and the strategy fails:
                   its message names the server; it aborts the transport
                   so every rank of the process stops.
     To resume, restart from the last checkpoint: every server's and
     worker's files (dsgd_ps_server_save, _worker_save, or
     dsgd_strategy_save) restored into new ranks, as CHECKPOINTS in
     ps_checkpoint.h says. The updates since that checkpoint are lost; a
     checkpoint holds every server's state, so it is taken at a point
     where the engine is at rest (and not in a run with late workers).
     The engine neither replicates a server nor moves its shards to
     another: a lost server ends the run.

   DEADLINES

     Every wait has one (timeout_s). A worker's pull or push fails with
     DSGD_ERR_TIMEOUT naming the servers that did not answer; a server's
     serve fails naming the workers it has heard nothing from (not even a
     resend) for timeout_s, so every worker must pull or push at least that
     often (the members: a late worker from its join on, see MEMBERSHIP). A failed rank does not stop the others: call the transport's
     abort (dsgd_loopback_abort) to stop them at once.

   THE PARTS

     This part holds the protocol: the desc and its checks, the message
     header, the table of update policies and the table of apply
     placements (the only places that say what a policy or a placement
     does), and the copy between the whole flat buffer and a server's
     shards. ps_checkpoint.h holds the checkpoint format, ps_server.h the
     server, ps_worker.h the worker and its loop.
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
#define DSGD_PS_APPLY_COUNT (DSGD_PS_APPLY_ON_WORKERS + 1)

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
    int backup_cancel;     /* BACKUP: 0, TF's protocol (late workers finish
                              and push their stale gradient); non-zero, late
                              workers are sent CANCEL and abandon it (see
                              UPDATE POLICIES); other policies: must be 0 */
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
    int initial_workers;   /* W0, 1..W: workers 0..W0-1 are members from
                              the start, W0..W-1 join mid-run (see
                              MEMBERSHIP); 0: W, every worker */
} dsgd_ps_desc;

/* The wire protocol (see WIRE PROTOCOL above), for transports and tests
   that look at messages. */
typedef enum dsgd_ps_msg {
    DSGD_PS_MSG_PUSH = 1,
    DSGD_PS_MSG_ACK = 2,
    DSGD_PS_MSG_PULL = 3,
    DSGD_PS_MSG_PARAMS = 4,
    DSGD_PS_MSG_DONE = 5,
    DSGD_PS_MSG_CANCEL = 6,
    DSGD_PS_MSG_JOIN = 7,
    DSGD_PS_MSG_JOINED = 8
} dsgd_ps_msg;
/* The header that starts every message, in the sender's byte order. */
typedef struct dsgd_ps_header {
    uint64_t type;   /* dsgd_ps_msg */
    uint64_t worker; /* the worker's index, both ways */
    uint64_t seq;    /* the push or pull it is or answers */
    int64_t version; /* see WIRE PROTOCOL, per type */
    uint64_t count;  /* floats that follow */
    uint64_t status; /* ACK: 0 or DSGD_PS_DROPPED; JOINED: 0 or DSGD_PS_ADMITTED */
    int64_t step;    /* summation only: PULL the mean wanted, PARAMS the mean sent (-1: none) */
} dsgd_ps_header;
#define DSGD_PS_HEADER_WORDS 7 /* sizeof(dsgd_ps_header) / 8 */
#define DSGD_PS_DROPPED 1      /* ACK status: the push was stale and dropped */
#define DSGD_PS_ADMITTED 1     /* JOINED status: the join is committed */
#define DSGD_PS_SEQ_MASK 0x00FFFFFFFFFFFFFFull
#define DSGD_PS_TAG(type, seq) (((uint64_t)(type) << 56) | ((uint64_t)(seq) & DSGD_PS_SEQ_MASK))
#define DSGD_PS_TAG_TYPE(tag) ((int)((uint64_t)(tag) >> 56))
#define DSGD_PS_TAG_SEQ(tag) ((uint64_t)(tag) & DSGD_PS_SEQ_MASK)

/* dsgd_ps_policy_name: "ASYNC", "SSP", "SYNC", "BACKUP";
   dsgd_ps_apply_name: "ON_SERVERS", "ON_WORKERS"; "?" for other values.
   Never NULL. Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_ps_policy_name(dsgd_ps_policy p);
DSGD_API const char *dsgd_ps_apply_name(dsgd_ps_apply a);
/* 1 when dsgd_ps_worker_run stops a worker of policy p once the global
   step reaches its target (BACKUP), 0 when after that many pushes of the
   worker (ASYNC, SSP, SYNC) and for other values: what the target counts
   (see THE LOOP in ps_worker.h).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_ps_policy_stops_on_global(dsgd_ps_policy p);

/* The roles' handles (ps_server.h, ps_worker.h). */
typedef struct dsgd_ps_server dsgd_ps_server;
typedef struct dsgd_ps_worker dsgd_ps_worker;

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_PS_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && defined(DSGD_NO_TF_CONFIG) && !defined(DSGD_NO_PS)
#error "distsgd: the parameter servers read TF_CONFIG (tf_config.h): define DSGD_NO_PS as well, or not DSGD_NO_TF_CONFIG"
#endif
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_PS_IMPL)
#define DSGD__PART_PS_IMPL

/* The header occupies the first DSGD__PS_H floats of every buffer that goes
   over the wire, so a message is sent and received in place. */
#define DSGD__PS_H (DSGD_PS_HEADER_WORDS * 2)
#define DSGD__PS_HBYTES (DSGD_PS_HEADER_WORDS * sizeof(uint64_t))
typedef char dsgd__ps_header_size_check[sizeof(dsgd_ps_header) == DSGD__PS_HBYTES ? 1 : -1];

enum { DSGD__PS_CREATED = 0, DSGD__PS_DONE = 1, DSGD__PS_FAILED = 2 };

/* ---- the table of update policies: what each one does, in one row */

typedef struct dsgd__ps_policy_row {
    const char *name;
    /* 0: each push is applied on arrival; 1: pushes are gathered per
       clock, and a clock is applied (in order) once it holds `needed` */
    int clocked;
    int max_staleness; /* the bound s may be 0..this (others: 0) */
    int backups;       /* backup workers allowed (0 <= b < W; else 0) */
    /* clocks a server buffers at once, and the gradients that complete one
       when `members` workers count for it (MEMBERSHIP) */
    int (*ring)(const dsgd_ps_desc *d);
    int (*needed)(const dsgd_ps_desc *d, int members);
    /* the clock a push belongs to, from its push number and its tag; a
       push for an applied clock is dropped when drops_stale, else it is
       DSGD_ERR_DESYNC */
    int64_t (*step_of)(uint64_t seq, int64_t tag);
    int drops_stale;
    /* a push is tagged with the worker's global step (the least version
       read), on every server; else with the version of that server */
    int global_tag;
    /* the version a pull must wait for on every server, after `pushes`
       pushes, the last one tagged last_tag (-1: none); final: the pull
       that ends a worker, which waits for every clock it pushed */
    int64_t (*pull_needs)(const dsgd_ps_desc *d, uint64_t pushes, int64_t last_tag, int final);
    const char *stuck_hint; /* why a clock cannot complete, for DSGD_ERR_DESYNC */
    /* the stop rule of dsgd_ps_worker_run: 1, stop once the global step
       reaches the target (a fixed number of pushes could wait for a step
       that the others, stopped, never complete); 0, after the target's
       number of pushes of the worker (every worker pushes as often) */
    int stop_on_global;
} dsgd__ps_policy_row;

static int dsgd__ps_ring_none(const dsgd_ps_desc *d) { (void)d; return 0; }
static int dsgd__ps_ring_window(const dsgd_ps_desc *d) { return d->staleness + 1; }
static int dsgd__ps_ring_one(const dsgd_ps_desc *d) { (void)d; return 1; }
static int dsgd__ps_needed_one(const dsgd_ps_desc *d, int members) { (void)d, (void)members; return 1; }
static int dsgd__ps_needed_all(const dsgd_ps_desc *d, int members) { (void)d; return members; }
static int dsgd__ps_needed_first(const dsgd_ps_desc *d, int members) { return members - d->backup_workers; }
static int64_t dsgd__ps_step_by_seq(uint64_t seq, int64_t tag) { (void)tag; return (int64_t)seq; }
static int64_t dsgd__ps_step_by_tag(uint64_t seq, int64_t tag) { (void)seq; return tag; }
static int64_t dsgd__ps_needs_nothing(const dsgd_ps_desc *d, uint64_t pushes, int64_t last_tag, int final) {
    (void)d, (void)pushes, (void)last_tag, (void)final;
    return 0;
}
/* SSP at clock c: clocks 0..c-s-1 applied; at the end, every clock */
static int64_t dsgd__ps_needs_window(const dsgd_ps_desc *d, uint64_t pushes, int64_t last_tag, int final) {
    (void)last_tag;
    return DSGD__MAX((int64_t)pushes - (final ? 0 : d->staleness), (int64_t)0);
}
/* BACKUP: the step last pushed for applied; at the end nothing (a step
   the others, stopped, never complete must not hold a worker) */
static int64_t dsgd__ps_needs_last(const dsgd_ps_desc *d, uint64_t pushes, int64_t last_tag, int final) {
    (void)d, (void)pushes;
    return final ? 0 : last_tag + 1;
}

/* In the order of dsgd_ps_policy. */
static const dsgd__ps_policy_row dsgd__ps_policies[DSGD_PS_POLICY_COUNT] = {
    {"ASYNC", 0, 0, 0, dsgd__ps_ring_none, dsgd__ps_needed_one, dsgd__ps_step_by_seq, 0, 0, dsgd__ps_needs_nothing, "",
     0},
    {"SSP", 1, DSGD_PS_MAX_STALENESS, 0, dsgd__ps_ring_window, dsgd__ps_needed_all, dsgd__ps_step_by_seq, 0, 0,
     dsgd__ps_needs_window, "SSP needs every worker's push of every clock", 0},
    {"SYNC", 1, 0, 0, dsgd__ps_ring_one, dsgd__ps_needed_all, dsgd__ps_step_by_seq, 0, 0, dsgd__ps_needs_window,
     "SYNC needs every worker's push of every clock", 0},
    {"BACKUP", 1, 0, 1, dsgd__ps_ring_one, dsgd__ps_needed_first, dsgd__ps_step_by_tag, 1, 1, dsgd__ps_needs_last,
     "stop BACKUP workers on the global step", 1}};

static const dsgd__ps_policy_row *dsgd__ps_policy(const dsgd_ps_desc *d) { return &dsgd__ps_policies[d->policy]; }

/* ---- the table of apply placements */

typedef struct dsgd__ps_apply_row {
    const char *name;
    /* 1: servers hold the parameters and the optimizer's slots, apply each
       clock and answer a pull with parameters; 0: summation only, servers
       publish each clock's mean and workers hold copies and apply it */
    int servers_hold;
} dsgd__ps_apply_row;

/* In the order of dsgd_ps_apply. */
static const dsgd__ps_apply_row dsgd__ps_applies[DSGD_PS_APPLY_COUNT] = {{"ON_SERVERS", 1}, {"ON_WORKERS", 0}};

static const dsgd__ps_apply_row *dsgd__ps_apply_of(const dsgd_ps_desc *d) { return &dsgd__ps_applies[d->apply]; }

DSGD_API const char *dsgd_ps_policy_name(dsgd_ps_policy p) {
    return (int)p >= 0 && (int)p < (int)DSGD_PS_POLICY_COUNT ? dsgd__ps_policies[p].name : "?";
}

DSGD_API const char *dsgd_ps_apply_name(dsgd_ps_apply a) {
    return (int)a >= 0 && (int)a < (int)DSGD_PS_APPLY_COUNT ? dsgd__ps_applies[a].name : "?";
}

DSGD_API int dsgd_ps_policy_stops_on_global(dsgd_ps_policy p) {
    return (int)p >= 0 && (int)p < (int)DSGD_PS_POLICY_COUNT ? dsgd__ps_policies[p].stop_on_global : 0;
}

/* ---- messages */

static double dsgd__ps_now(const dsgd_transport_i *t) { return t->now ? t->now(t->impl) : dsgd_now(); }

static const char *dsgd__ps_terr(const dsgd_transport_i *t) {
    const char *m = t->error_message ? t->error_message(t->impl) : NULL;
    return m ? m : "";
}

/* ": " and the transport's own message, or nothing. */
static const char *dsgd__ps_terr_sep(const dsgd_transport_i *t) { return dsgd__ps_terr(t)[0] ? ": " : ""; }

static dsgd_ps_header dsgd__ps_hdr(dsgd_ps_msg type, int worker, uint64_t seq, int64_t version, size_t count,
                                   uint64_t status, int64_t step) {
    dsgd_ps_header h;
    h.type = (uint64_t)type;
    h.worker = (uint64_t)worker;
    h.seq = seq;
    h.version = version;
    h.count = (uint64_t)count;
    h.status = status;
    h.step = step;
    return h;
}

static void dsgd__ps_hdr_put(void *dst, const dsgd_ps_header *h) { memcpy(dst, h, sizeof *h); }

static dsgd_ps_header dsgd__ps_hdr_get(const void *src) {
    dsgd_ps_header h;
    memcpy(&h, src, sizeof h);
    return h;
}

/* ---- the shard map: the whole flat buffer and a server's shards */

/* Copies server s's shards between full (the whole flat buffer) and packed
   (the shards concatenated in placement order, the server's layout):
   into packed when to_packed, else out of it. The one walk over the map. */
static void dsgd__ps_map_copy(const dsgd_shard_map *map, int s, float *full, float *packed, int to_packed) {
    int i, ns = dsgd_shard_map_num_shards(map);
    for (i = 0; i < ns; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(map, i);
        if (sh->server != s) continue;
        if (sh->count) {
            if (to_packed)
                memcpy(packed, full + sh->offset, sh->count * sizeof(float));
            else
                memcpy(full + sh->offset, packed, sh->count * sizeof(float));
        }
        packed += sh->count;
    }
}

static void dsgd__ps_gather(const dsgd_shard_map *map, int s, const float *full, float *packed) {
    dsgd__ps_map_copy(map, s, (float *)(uintptr_t)full, packed, 1); /* full is only read */
}

static void dsgd__ps_scatter(const dsgd_shard_map *map, int s, const float *packed, float *full) {
    dsgd__ps_map_copy(map, s, full, (float *)(uintptr_t)packed, 0); /* packed is only read */
}

/* ---- the desc */

/* The one place dsgd_ps_desc's defaults are filled and checked, with the
   transport and the map every role shares. */
static dsgd_result dsgd__ps_setup(dsgd_ctx *ctx, const dsgd_transport_i *t, const dsgd_ps_desc *in,
                                  const dsgd_shard_map *map, const char *fn, dsgd_ps_desc *d) {
    const dsgd__ps_policy_row *pol;
    dsgd_result r;
    if (!t || !in || !map)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: transport, desc or shard map is NULL", fn);
    *d = *in;
    if (d->num_servers < 1 || d->num_workers < 1 || d->num_servers > INT_MAX / 2 || d->num_workers > INT_MAX / 2)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: need num_servers >= 1 and num_workers >= 1 (got %d, %d)",
                                  fn, d->num_servers, d->num_workers);
    if ((int)d->policy < 0 || (int)d->policy >= (int)DSGD_PS_POLICY_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown policy %d", fn, (int)d->policy);
    pol = dsgd__ps_policy(d);
    if (d->staleness < 0 || d->staleness > pol->max_staleness)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: staleness %d (SSP: 0..%d; other policies: 0)", fn,
                                  d->staleness, DSGD_PS_MAX_STALENESS);
    if (pol->backups ? (d->backup_workers < 0 || d->backup_workers >= d->num_workers) : d->backup_workers != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: backup_workers %d (BACKUP: 0 <= b < num_workers = %d; other policies: 0)", fn,
                                  d->backup_workers, d->num_workers);
    if (d->backup_cancel && !pol->backups)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: backup_cancel is for BACKUP, not %s", fn,
                                  pol->name);
    d->backup_cancel = d->backup_cancel != 0;
    if ((int)d->apply < 0 || (int)d->apply >= (int)DSGD_PS_APPLY_COUNT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown apply %d", fn, (int)d->apply);
    if (!dsgd__ps_apply_of(d)->servers_hold && !pol->clocked)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: apply %s (summation only) needs a policy with clocks (SSP, SYNC or BACKUP): %s "
                                  "applies each push alone, so there is no step whose sum to publish", fn,
                                  dsgd__ps_apply_of(d)->name, pol->name);
    d->optimizer = dsgd__optimizer_defaults(&in->optimizer);
    if ((r = dsgd__optimizer_desc_check(ctx, &d->optimizer, fn)) != DSGD_OK) return r;
    if (d->initial_workers == 0) d->initial_workers = d->num_workers;
    if (d->initial_workers < 1 || d->initial_workers > d->num_workers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: initial_workers %d (1..num_workers = %d; 0: all)",
                                  fn, d->initial_workers, d->num_workers);
    if (d->initial_workers < d->num_workers && !dsgd__ps_apply_of(d)->servers_hold)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: late workers (initial_workers %d < %d) need apply ON_SERVERS: a summation-only "
                                  "worker that joins would need every mean since step 0", fn, d->initial_workers,
                                  d->num_workers);
    if (d->initial_workers <= d->backup_workers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: initial_workers %d must exceed backup_workers %d (a step needs members - backups "
                                  ">= 1 gradients)", fn, d->initial_workers, d->backup_workers);
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

#endif /* DSGD__PART_PS_IMPL */
