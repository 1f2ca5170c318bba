/* distsgd/simnet.h - the simnet transport: a cluster on a virtual clock
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   SIMNET

     A discrete-event simulation of a cluster behind the transport interface.
     As with the loopback, each rank is a thread of yours (or a fiber that
     the hub runs: dsgd_simnet_run, below) and the arithmetic is real (real
     gradients, real reductions, the same bits as the loopback); only time
     is modelled. Every rank has a virtual clock, and the endpoint's `now`
     returns it, so a communicator's deadlines are virtual too.

     Scheduling. Exactly one rank runs at a time (parked ranks aside,
     below): the one with the smallest (virtual time, rank) among those
     that can proceed, kept in a heap (a hand-off costs O(log ranks)). A rank
     gives up its turn whenever it enters the hub (send, recv, sendrecv,
     sendrecv_reduce, probe, probe_from, a charge_apply and a charge_codec that cost time,
     dsgd_simnet_compute, dsgd_simnet_advance) and
     gets it back when what it waits for is due; what it does between two
     calls takes no virtual time. Receives from any source (probe) and
     everything the ranks compute between calls therefore happen in one
     order, which depends only on the configuration and the seeds, never on
     the OS scheduler (50 runs with threads sleeping at random give the same
     order). With a thread per rank the hand-off is a condition variable
     per rank: only the rank whose turn it is wakes (a futex wake and a
     context switch, some microseconds). A rank's first call waits for its
     turn at virtual time 0, in rank order. When every rank waits and no
     message is in flight, the earliest deadline fires: time jumps to it, so
     a simulation never waits in real time for a deadline; a wait with no
     deadline then fails (DSGD_ERR_TIMEOUT, "deadlock"), unless a rank is
     parked (below): that rank may still send, so the wait is for it.

     Ranks as fibers (dsgd_simnet_run(hub, fn, user)): the hub calls fn for
     every rank itself, each on a stack of its own (desc.fiber_stack_bytes,
     256 KiB by default), all on the calling thread, and returns when every
     fn has returned. The hand-off is then a switch of stacks without a
     system call, a few million events a second, and 16,384 ranks fit in
     memory; the schedule, and so every time, CSV and trace, is the one a
     thread per rank gives. fn must wait only through the hub: no parking,
     so strategies (their replica pools wait outside the hub) keep their
     threads, while the parameter-server engine and the collectives run as
     they are. The switch is a few instructions of assembly on x86-64 with
     GCC 8+ or clang, ucontext (which also saves the signal mask, with a
     system call) on other glibc targets, and AddressSanitizer and
     ThreadSanitizer are told of every switch (under TSan, whose limit of
     about 8,000 threads counts fibers, keep to fewer ranks); elsewhere,
     and with DSGD_SIMNET_NO_FIBERS defined, run starts a thread per rank
     instead, with the same results (dsgd_simnet_run_mode says which).

     The model (per message of b bytes from s to d; per reduction of k floats):
       - links cost alpha + b * beta: the send occupies the sender's NIC for
         b * beta from the moment the NIC is free (sends of one rank go out
         one after another, and send returns when its message has left), and
         the message arrives alpha after it has left, its first byte b *
         beta before that. A receiving NIC takes the bytes of one message at
         a time too, in the order the rank takes its messages (its receives,
         and a probe's choice): a message whose bytes came while the NIC
         took another waits in the network and comes in after it, so it is
         taken at max(first byte, NIC free) + b * beta. The sender's NIC is
         not held back, and a rank that receives in arrival order keeps its
         link busy without a gap, so incast (k messages of b bytes to one
         rank at once) costs alpha + k * b * beta, and a rank that takes a
         later message first pays for the earlier one behind it (on two
         levels the node's link and the network's are separate, one
         message at a time on each). Each rank's link is so serialised in
         both directions, and the order depends only on what the rank does
         (parking changes nothing); parallel_receives lets a NIC take any
         number of messages at once instead (each at its arrival), and
         half_duplex makes a rank's NIC carry one message at
         a time in either direction (booked when the message is sent, in
         simulation order, on the receiver's NIC too);
       - two levels: with ranks_per_node = L > 0, ranks r and q with r / L ==
         q / L talk over intra_alpha / intra_beta, the others over alpha /
         beta (give the communicators the same L in
         dsgd_comm_desc.ranks_per_node for DSGD_ALLREDUCE_HIERARCHICAL);
       - an optimizer update of k floats that the parameter-server engine
         applies (the endpoint's charge_apply) costs k * apply_s_per_float,
         by default the reduction's gamma (a negative value: free), so a
         server that applies every push is a bottleneck as on a cluster;
       - converting or compressing k floats for the wire (the endpoint's
         charge_codec: a half wire's piece as it is sent and again as it
         is received, a compressor's bucket once each way) costs k *
         codec_s_per_float, by default DSGD_SIMNET_DEFAULT_CODEC_S (F16C's
         conversion, measured);
       - o, the CPU overhead of a message (LogP's o, overhead_s, 0 by
         default): the sender spends it before its NIC takes the message,
         the receiver after the message is in, so a message of b bytes
         from an idle link costs o + b * beta + alpha + o end to end;
       - sendrecv_reduce of k floats costs k * gamma after the message is in
         (the collectives' ring, halving-doubling, fold and reduce-to-one
         reduce through it); reductions a collective does on its own memory
         (recursive doubling, the division of MEAN) cost nothing;
       - a receive completes at max(the time it was called, the time its
         NIC has taken the message) (+ k *
         gamma); sendrecv when both halves are done. Messages between one
         pair arrive in the order they were sent (a delayed message holds
         back later ones);
       - compute: dsgd_simnet_compute(hub, rank, step) advances the rank's
         clock by a sample of the compute model (constant; per-rank time
         factors; exponential or shifted exponential; transient stragglers,
         slow by a factor with probability p on a step) that depends only on
         (seed, rank, step); dsgd_simnet_advance adds a given time. A STALL
         by time that falls inside either freezes the compute: it resumes
         after the stall, so advance(1.0) from 0 with a 0.3 s stall at 0.5
         ends at 1.3.
       - faults (dsgd_simnet_fault), by rank and compute step or virtual
         time: KILL (the rank's calls fail with DSGD_ERR_ABORTED from then on;
         messages it sent before still arrive; a peer waiting for it gets
         DSGD_ERR_TIMEOUT at exactly its deadline, and error_message names
         the dead rank, but a peer's probe_from, which waits for the
         rank's next message, learns of its death one link latency after
         it, as it would of a message sent then, once the messages sent
         before are taken (of a rank that left, likewise); a KILL by time
         at K kills the rank in whatever call
         it is in at K, after every message that reaches it before K: the
         call it dies in depends only on virtual times), STALL (the rank is frozen for some seconds), SLOW
         (its compute takes factor times longer), DROP (messages to a peer
         are lost: the receiver times out naming the sender), DELAY (they
         arrive later by exactly some seconds).
     Not simulated: contention inside the network (only the NICs are
     resources), packetisation, the cost of copies and of the compute
     between calls (charge it with dsgd_simnet_compute or _advance), and
     memory. There is no share/unshare (so AUTO all-reduces run message
     passing algorithms, as on a cluster) and no native allreduce.

     Code that waits outside the hub. The turn is the one requirement: a
     rank's thread holds it between its calls, so a rank that waits for
     another rank by other means (a condition variable, a pthread barrier,
     a replica pool waiting for the next step) would stop the simulation.
     Such a rank parks first (dsgd_simnet_park): it drops out of the
     scheduling until its next call, which brings it back at its clock, and
     while it is away the hub makes no decision that it could change (a
     deadline, a death by time in a wait for a message, or a probe, that it
     could still beat waits for it). Results do not depend on when it
     returns. With park_between_calls every rank parks
     whenever it returns from the hub: rank threads then run concurrently
     between calls, and the virtual times and probe orders are still those
     of the one-at-a-time schedule. There a rank killed in a call counts as
     parked at its kill time until its thread calls again or leaves, so
     that whatever its thread does on learning of its death (the call
     returns DSGD_ERR_ABORTED) happens before a wait of another rank on it
     can time out: a thread that is done with the hub once it knows must
     leave (dsgd_simnet_leave), or the others' deadlines (and deaths) past
     its kill time wait for it for good. A death by time waits for the
     parked ranks as a deadline at the kill time would, never longer than
     the wait's own deadline; so a wait with no deadline (or a later one)
     that only the death can end stays blocked while a rank is parked
     before the kill time minus the smallest alpha: that rank's thread must
     not wait, outside the hub, for the killed rank's thread.
     A rank that is done for good calls dsgd_simnet_leave (from its thread;
     a rank that never called may be left from any thread); until then the
     others may wait for it. A rank that is to join later (a spare for an
     elastic strategy's grow) is set aside before its first call
     (dsgd_simnet_spare): it holds back nothing, and dsgd_simnet_admit lets
     it in at a virtual time you give (the group's clock), from where it
     runs as the others do.

     Running distributed training over it (charge each step's compute with
     dsgd_simnet_compute(hub, rank, step) on the rank's thread; without
     that, compute takes no virtual time):
       - a strategy (dsgd_strategy_desc.endpoints = the hub's N endpoints):
         create the hub with park_between_calls, since the replica threads
         wait for each step on a condition variable of the strategy's own.
         A mirrored strategy then gives the loopback's weights bit for bit;
       - the parameter-server engine (ps.h): one server or worker per rank
         thread, each calling serve or pull/push/finish, then leave; it needs
         no parking.

     Two lanes (desc.backward_s; a synchronous strategy's step). A rank of
     a strategy with dsgd_strategy_desc.overlap computes and communicates
     at once: its compute lane charges backward variable by variable,
     backward_s[v] before the model reports variable v final, and its
     communication lane, the rank's clock, all-reduces each bucket of the
     gradient from max(the bucket's ready time on the compute lane, the
     end of the bucket before); the step goes on when both lanes are done.
     So with C the compute lane's end and E the communication lane's, the
     gradient is in at max(C, E) and exposed_s = max(0, E - C) (TWO LANES
     in strategy_overlap.h has the whole formula). The replica's thread
     keeps the compute lane without entering the hub; the strategy's
     communication thread makes the rank's calls meanwhile (it moves the
     clock to a bucket's ready time with dsgd_simnet_advance), one thread
     at a time: the times are the same whichever runs when. Without
     overlap the step charges the same backward in one piece. Other code
     never reads backward_s.
     The cluster coordinator (coordinator.h) does not run over simnet: its
     idle workers wait for closures outside the hub and, parked at an early
     clock, would hold back the later probes and deadlines of the others for
     good.

     Timeline (desc.trace): the hub records what each rank's calls did in
     virtual time, and dsgd_simnet_write_trace writes it as a Chrome trace
     (the catapult JSON that chrome://tracing and Perfetto open; times in
     microseconds), one row (tid) per rank. A call's time is cut into
     consecutive spans: "send" (its send half: the NIC's queue and the
     bytes going out), "wait" (until the awaited message begins to arrive,
     or the deadline; a probe's wait for any message; a probe_from's for
     its rank's message or death), "receive" (the bytes
     coming in), "reduce" (k * gamma); dsgd_simnet_compute is "compute"
     (after a "stall" for STALL faults), a kill an instant event "killed".
     When the send and the receive of a sendrecv overlap, the row shows the
     send first and the receive from where it ended. Each rank's spans are
     kept in its own call order and written rank by rank, so the file
     depends only on the configuration and the seeds: the same run gives
     the same bytes. Spans carry args (peer, bytes, step). trace_until_s
     bounds a long run's trace to its first virtual seconds.

     Thread safety: each endpoint (and the hub's functions that take a rank)
     is used by that rank's thread (or fiber), or by one thread at a time
     where the rank's threads hand it over with a lock of their own (a
     strategy's communication thread, Two lanes); dsgd_simnet_abort, _aborted,
     _time and _get_stats from any thread. Messages live in one FIFO list
     per pair of ranks that ever talked (a hash table), so memory grows with
     the pairs used, not with ranks squared.
*/
#ifndef DSGD__PART_SIMNET_DECL
#define DSGD__PART_SIMNET_DECL

#include <stdio.h> /* FILE, for dsgd_simnet_write_trace */

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- simnet */

typedef struct dsgd_simnet dsgd_simnet;

typedef enum dsgd_simnet_compute_kind {
    DSGD_SIMNET_COMPUTE_NONE = 0,    /* compute takes no time */
    DSGD_SIMNET_COMPUTE_CONSTANT,    /* mean_s every step */
    DSGD_SIMNET_COMPUTE_EXPONENTIAL, /* Exp with mean mean_s (rate 1 / mean_s) */
    DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL /* shift_s + Exp with mean mean_s */
} dsgd_simnet_compute_kind;

/* The compute model. A step's time on rank r is
     sample(kind) * rank_factor[r] * (straggler_factor when a straggler)
   where the sample and the straggler draw depend only on (seed, r, step). */
typedef struct dsgd_simnet_compute_desc {
    dsgd_simnet_compute_kind kind;
    double mean_s;             /* CONSTANT: the time; (SHIFTED_)EXPONENTIAL: the mean of the exponential part */
    double shift_s;            /* SHIFTED_EXPONENTIAL: the minimum */
    const double *rank_factor; /* NULL: 1 for every rank; else one factor per rank (copied), > 0 */
    double straggler_p;        /* probability that a rank is a straggler on a step, 0..1 */
    double straggler_factor;   /* a straggler's time is multiplied by this (0: 1) */
    uint64_t seed;
} dsgd_simnet_compute_desc;

typedef enum dsgd_simnet_fault_kind {
    DSGD_SIMNET_FAULT_KILL = 1, /* rank dies */
    DSGD_SIMNET_FAULT_STALL,    /* rank is frozen for `seconds` */
    DSGD_SIMNET_FAULT_SLOW,     /* rank's compute takes `factor` times longer from then on */
    DSGD_SIMNET_FAULT_DROP,     /* `count` messages from rank to peer are lost */
    DSGD_SIMNET_FAULT_DELAY     /* `count` messages from rank to peer arrive `seconds` later */
} dsgd_simnet_fault_kind;

/* One fault. When: step >= 0: at dsgd_simnet_compute(hub, rank, step) (KILL,
   STALL: at the start of that step; SLOW: that step and later; DROP, DELAY:
   messages sent after the rank began that step); step < 0: at virtual time
   `time` (KILL: the rank dies at that time, even inside a call, after the
   messages that reach it before then, whatever the threads' order; STALL: the
   rank is frozen from then for `seconds`; SLOW: compute that starts then or
   later; DROP, DELAY: messages sent at that time or later). */
typedef struct dsgd_simnet_fault {
    dsgd_simnet_fault_kind kind;
    int rank;       /* the rank (DROP, DELAY: the sender) */
    int peer;       /* DROP, DELAY: the receiver; -1 any */
    long step;      /* >= 0: a compute step; < 0: use time */
    double time;    /* virtual seconds, when step < 0 */
    double seconds; /* STALL, DELAY */
    double factor;  /* SLOW, > 0 */
    long count;     /* DROP, DELAY: how many messages (0: 1) */
} dsgd_simnet_fault;

/* dsgd_simnet_desc.apply_s_per_float, codec_s_per_float: free. */
#define DSGD_SIMNET_FREE (-1.0)
/* dsgd_simnet_desc.codec_s_per_float's default: converting 4M floats to
   fp16 and back took about 2 ms on an AMD EPYC (Zen 4) with F16C and
   AVX-512 (half.h), 0.25 ns a float each way. A top-k or PowerSGD
   compressor costs tens of times more per float (compress.h's
   compress_s says how much on your machine): set codec_s_per_float to
   model one. */
#define DSGD_SIMNET_DEFAULT_CODEC_S 2.5e-10

typedef struct dsgd_simnet_desc {
    int ranks;                  /* 1..65536 */
    double alpha_s;             /* latency of a message (between nodes, or everywhere when ranks_per_node is 0) */
    double beta_s_per_byte;     /* its time per byte */
    double gamma_s_per_float;   /* sendrecv_reduce's time per float reduced */
    int ranks_per_node;         /* 0: one level; L > 0: ranks r / L share a node */
    double intra_alpha_s;       /* within a node (ranks_per_node > 0) */
    double intra_beta_s_per_byte;
    /* the parameter-server engine's optimizer update, per float updated
       (charge_apply); 0: gamma_s_per_float; DSGD_SIMNET_FREE (< 0): free */
    double apply_s_per_float;
    /* converting or compressing a float for the wire (charge_codec: a half
       wire's pieces as they are sent and received, a compressor's bucket
       once compressed and once decompressed); 0:
       DSGD_SIMNET_DEFAULT_CODEC_S (F16C's conversion, measured);
       DSGD_SIMNET_FREE (< 0): free */
    double codec_s_per_float;
    /* LogP's o: CPU seconds a rank spends on each message it sends and on
       each it receives (0: none) */
    double overhead_s;
    int half_duplex;            /* non-zero: a rank sends or receives, not both at once */
    /* non-zero: a receiving NIC takes any number of messages at once (each
       at its arrival); 0: one at a time, in the order the rank takes them */
    int parallel_receives;
    dsgd_simnet_compute_desc compute;
    /* The backward pass layer by layer, for the synchronous strategies'
       step over the hub (Two lanes, above): backward_s[v] is the compute,
       in seconds, that a rank's backward spends before its model reports
       variable v final (dsgd_model_variable_ready; the forward pass counts
       in the first variable reported), num_backward_s of them (copied,
       finite, >= 0; a variable beyond them costs 0). NULL: the step's
       backward takes no virtual time (charge compute in the batch
       function, with dsgd_simnet_compute or _advance) */
    const double *backward_s;
    int num_backward_s;
    const dsgd_simnet_fault *faults; /* copied */
    int num_faults;
    /* non-zero: every rank is parked (see dsgd_simnet_park) whenever it
       returns from the hub, so rank threads run concurrently between calls
       and code that also synchronises its threads by other means (the
       strategies' replica pools) runs unchanged. Not with half_duplex. */
    int park_between_calls;
    /* non-zero: record every rank's timeline for dsgd_simnet_write_trace
       (32 bytes a span, up to 4 spans a call) */
    int trace;
    /* trace: > 0 records only the spans that begin before this virtual
       time; 0 records all */
    double trace_until_s;
    /* Test hook: > 0 makes every rank thread sleep up to this many real
       seconds (or yield) at random before and after each hand-off, to show
       that the result does not depend on the OS scheduler. 0 in real use. */
    double test_jitter_s;
    /* dsgd_simnet_run with fibers: each rank's stack in bytes (0: 256 KiB;
       at least 16 KiB); with threads, each thread's stack (0: the system's
       default) */
    size_t fiber_stack_bytes;
} dsgd_simnet_desc;

/* Counters since creation (events = messages + computes). */
typedef struct dsgd_simnet_stats {
    uint64_t messages;  /* messages sent (dropped ones included) */
    uint64_t bytes;     /* their payload */
    uint64_t dropped;   /* messages lost to DROP faults */
    uint64_t computes;  /* dsgd_simnet_compute and _advance calls */
    uint64_t handoffs;  /* turns passed from one thread to another */
    double max_time;    /* the largest virtual clock of any rank */
} dsgd_simnet_stats;

/* Creates a hub of desc->ranks ranks, each at virtual time 0. Costs are in
   seconds and may be 0 (free); zero fields mean: one level, full duplex, no
   compute time, no faults. ctx receives the errors of create and must
   outlive the hub.
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx, desc or out NULL, nothing recorded
   when ctx is; ranks outside 1..65536; a negative or non-finite cost; a bad
   compute model or fault, named with its index), DSGD_ERR_OUT_OF_MEMORY,
   DSGD_ERR_SYSTEM (a pthread mutex or condition variable).
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_simnet_create(dsgd_ctx *ctx, const dsgd_simnet_desc *desc, dsgd_simnet **out);
/* Fills *out with the endpoint of `rank` (name "simnet"); it lives as long
   as the hub (out->destroy is NULL). Every member but destroy, share,
   unshare and allreduce is set.
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL, nothing recorded; out NULL;
   rank outside [0, ranks)).
   Thread safety: the thread of the hub's ctx. */
DSGD_API dsgd_result dsgd_simnet_endpoint(dsgd_simnet *hub, int rank, dsgd_transport_i *out);
/* Charges compute step `step` to rank: its clock advances by the compute
   model's sample for (rank, step), times SLOW faults, plus STALL faults;
   KILL faults at this step take effect. It gives up the turn like any call.
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL; rank outside [0, ranks);
   step < 0), DSGD_ERR_ABORTED (the rank was killed, or the hub aborted),
   DSGD_ERR_STATE (the rank left).
   Thread safety: rank's thread. */
DSGD_API dsgd_result dsgd_simnet_compute(dsgd_simnet *hub, int rank, long step);
/* Advances rank's clock by `seconds` (>= 0, finite), as compute that takes
   exactly that long (SLOW faults do not apply; a KILL or STALL at a time in
   between does).
   Errors: as dsgd_simnet_compute, and DSGD_ERR_INVALID_ARGUMENT for seconds.
   Thread safety: rank's thread. */
DSGD_API dsgd_result dsgd_simnet_advance(dsgd_simnet *hub, int rank, double seconds);
/* The compute model's sample for (rank, step) in seconds, without faults:
   what dsgd_simnet_compute charges when no fault applies. Pure: the same
   for the same desc, whatever else happened (hub NULL, rank or step out of
   range: 0).
   Errors: none. Thread safety: any thread. */
DSGD_API double dsgd_simnet_compute_time(const dsgd_simnet *hub, int rank, long step);
/* The rank leaves the simulation for good: it gives up its turn, is never
   scheduled again, and its later calls return DSGD_ERR_STATE. Call it on the
   rank's thread when the rank is done (a rank that returns without leaving
   holds the turn and stops the others). Messages it sent still arrive; a
   peer waiting for more times out at its deadline. hub NULL or rank out of
   range: nothing.
   Thread safety: rank's thread. */
DSGD_API void dsgd_simnet_leave(dsgd_simnet *hub, int rank);
/* Parks rank: it gives up its turn and is left out of the scheduling until
   its next call, which brings it back at its clock. Call it on the rank's
   thread before it waits for something the hub cannot see (another
   thread, a condition variable, input), so that the other ranks go on
   meanwhile. While a rank p is parked at clock t_p, the hub makes no
   decision that p could change: a rank whose deadline would fire, whose
   KILL by time would kill it in a wait for a message, or whose probe would
   choose, at a time K >= t_p + the smallest alpha waits (in real time) for
   p to return or leave; everything else (compute, a death inside it, a
   message already queued) goes on. So the result is the same whenever p returns.
   A parked rank's thread runs concurrently with the others.
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL, rank out of range),
   DSGD_ERR_UNSUPPORTED (half_duplex: its bookings depend on the order of
   the sends), DSGD_ERR_STATE (the rank left),
   DSGD_ERR_ABORTED (killed, or the hub aborted).
   Thread safety: rank's thread. */
DSGD_API dsgd_result dsgd_simnet_park(dsgd_simnet *hub, int rank);
/* Sets rank aside as a spare: a rank that is not part of the run until
   it is admitted, such as one that an elastic strategy lets join later
   (dsgd_strategy_grow). A spare holds nothing back: no deadline and no
   probe of another rank waits for it (a rank parked at its first clock
   would hold back every one after it), and its calls fail with
   DSGD_ERR_STATE until dsgd_simnet_admit. Call it before the rank's first
   call (a rank that never called, parked or arriving at time 0).
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL, nothing recorded; rank out
   of range), DSGD_ERR_STATE (the rank called the hub or parked, left, is a
   spare already, or runs under dsgd_simnet_run).
   Thread safety: the thread of the hub's ctx; the ranks may run meanwhile. */
DSGD_API dsgd_result dsgd_simnet_spare(dsgd_simnet *hub, int rank);
/* Admits a spare at virtual time `at`: its clock becomes the later of its
   own and at, and from then on it is a rank like the others: parked there
   until its first call (park_between_calls), else arriving there (it
   takes its turn at that time). For the results to depend only on the
   configuration and the seeds, admit it while no clock of the group moves
   (between a strategy's steps, every replica parked) at the group's
   latest clock (the largest dsgd_simnet_time of its ranks): it then
   starts where the group is, and its deadlines are the group's.
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL, nothing recorded; rank out
   of range; at negative or not finite), DSGD_ERR_STATE (not a spare).
   Thread safety: the thread of the hub's ctx; the ranks may run meanwhile. */
DSGD_API dsgd_result dsgd_simnet_admit(dsgd_simnet *hub, int rank, double at);
/* Marks the hub aborted: every waiting and later call returns
   DSGD_ERR_ABORTED at once (the endpoints' abort member does the same); the
   ranks then run freely, so the virtual times after an abort mean nothing.
   Irreversible. hub NULL: nothing.
   Thread safety: any thread while the hub exists. */
DSGD_API void dsgd_simnet_abort(dsgd_simnet *hub);
/* Non-zero once the hub was aborted (hub NULL: 0).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_simnet_aborted(dsgd_simnet *hub);
/* Rank's virtual clock in seconds (hub NULL or rank out of range: 0). Read
   by another thread while the rank runs, it is the time of its last call.
   Errors: none. Thread safety: any thread. */
DSGD_API double dsgd_simnet_time(dsgd_simnet *hub, int rank);
/* Fills *out with the hub's counters (nothing when either is NULL).
   Errors: none. Thread safety: any thread. */
DSGD_API void dsgd_simnet_get_stats(dsgd_simnet *hub, dsgd_simnet_stats *out);
/* The payload bytes rank has sent since creation (dropped messages
   included): its share of dsgd_simnet_stats.bytes, so the ranks' counts sum
   to it. Read between a rank's calls (or by the rank itself), it counts
   every message sent so far, whoever sent them: a strategy's
   communicators, a parameter-server worker, a user's own calls.
   hub NULL or rank out of range: 0.
   Errors: none. Thread safety: any thread. */
DSGD_API uint64_t dsgd_simnet_bytes_sent(dsgd_simnet *hub, int rank);
/* Writes the timeline recorded since creation (desc.trace) to out as a
   Chrome trace (JSON object format, "traceEvents": metadata naming each
   rank's row, then complete events "X" rank by rank in call order, ts and
   dur in microseconds with 3 decimals). The same configuration and seeds
   give the same bytes. Call it once the ranks are done (joined or left).
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL, nothing recorded; out NULL),
   DSGD_ERR_STATE (desc.trace was 0), DSGD_ERR_OUT_OF_MEMORY (a span could
   not be recorded during the run, so the trace would be incomplete;
   nothing written), DSGD_ERR_IO (a write failed).
   Thread safety: one thread, once no rank uses the hub. */
DSGD_API dsgd_result dsgd_simnet_write_trace(dsgd_simnet *hub, FILE *out);
/* Frees the hub and every message still in flight; its endpoints are
   invalid afterwards. hub NULL: nothing.
   Thread safety: one thread, once no rank uses the hub (join them first). */
DSGD_API void dsgd_simnet_destroy(dsgd_simnet *hub);

/* One rank's program for dsgd_simnet_run: ep is the rank's endpoint (as
   dsgd_simnet_endpoint fills it), user the pointer given to run. Returning
   leaves the simulation (dsgd_simnet_leave). */
typedef void (*dsgd_simnet_rank_fn)(dsgd_simnet *hub, int rank, const dsgd_transport_i *ep, void *user);
/* Runs fn for every rank of a fresh hub and returns when all have
   returned: the hub runs the ranks itself, as fibers on the calling thread
   where the build has them (see dsgd_simnet_run_mode), so handing the turn
   to the next rank is a switch of stacks, not a wake-up of a thread. The
   schedule, and so every result and trace, is the same as with a thread of
   yours per rank. fn must wait only through the hub (its endpoint and the
   dsgd_simnet_* calls): it must not park, and it must not wait for another
   rank by other means (a lock another rank holds across a call, a
   condition variable), which would stop every rank. Stacks are
   desc.fiber_stack_bytes each; a rank that needs more overflows it.
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub or fn NULL; nothing recorded when
   hub is), DSGD_ERR_UNSUPPORTED (park_between_calls), DSGD_ERR_STATE (a rank
   has already called the hub, or run was called before),
   DSGD_ERR_OUT_OF_MEMORY (the stacks), DSGD_ERR_SYSTEM (a thread could not
   start: the hub is aborted and the started ranks end). The ranks' own
   errors are theirs (their endpoints' error_message).
   Thread safety: one thread (the hub's ctx's), once. */
DSGD_API dsgd_result dsgd_simnet_run(dsgd_simnet *hub, dsgd_simnet_rank_fn fn, void *user);
/* How dsgd_simnet_run runs the ranks in this build: "fibers" (a stack
   switch of a few instructions), "fibers (ucontext)" (swapcontext, which
   also saves the signal mask with a system call), or "threads" (one per
   rank, where neither is available or with DSGD_SIMNET_NO_FIBERS). Under
   AddressSanitizer and ThreadSanitizer the fibers stay (each switch is
   announced to them). The results are the same; only the speed differs.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_simnet_run_mode(void);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_SIMNET_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_SIMNET_IMPL)
#define DSGD__PART_SIMNET_IMPL

/* >>simnet ----------------------------------------------------------------- */
/* One mutex guards the simulation; `turn` names the rank that may run. A
   rank entering the hub records what it waits for (a time, a transfer, a
   probe), computes its key (the virtual time at which that is due, capped
   by its deadline and its death), passes the turn to the rank with the
   smallest (key, rank) and waits until the turn comes back: on its own
   condition variable (a thread of the user's), or by switching to the
   stack of the rank whose turn it is (dsgd_simnet_run's fibers, which hold
   the mutex across the switch: one thread runs them all). The ranks that
   can run (arriving, or waiting with a key) sit in a binary heap ordered
   by (key, rank); keys are recomputed when a message is posted to the
   rank, so a hand-off is O(log ranks). Messages are copied at send into a
   per-pair FIFO list with their arrival time; the pairs that ever carried
   a message live in a hash table, and each rank lists the pairs that hold
   messages for it (what a probe looks at). */

/* dsgd_simnet_run's fibers: 1, a stack switch in assembly (x86-64, GCC 8+
   or clang); 2, ucontext (glibc); 0, a thread per rank. Under
   AddressSanitizer and ThreadSanitizer every switch is announced to them
   (DSGD__SN_ASAN, DSGD__SN_TSAN; dsgd__sn_switch), so they follow the
   fibers as they follow threads. */
#if !defined(DSGD_SIMNET_NO_FIBERS) && !defined(DSGD__SN_FIBERS)
#if defined(__x86_64__) && !defined(__ILP32__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 8))
#define DSGD__SN_FIBERS 1
#elif defined(__GLIBC__)
#define DSGD__SN_FIBERS 2
#endif
#endif
#ifndef DSGD__SN_FIBERS
#define DSGD__SN_FIBERS 0
#endif
#if DSGD__SN_FIBERS == 2
#include <ucontext.h>
#endif
#if DSGD__SN_FIBERS && defined(__SANITIZE_ADDRESS__)
#define DSGD__SN_ASAN 1
#elif DSGD__SN_FIBERS && defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DSGD__SN_ASAN 1
#endif
#endif
#if DSGD__SN_FIBERS && defined(__SANITIZE_THREAD__)
#define DSGD__SN_TSAN 1
#elif DSGD__SN_FIBERS && defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DSGD__SN_TSAN 1
#endif
#endif
#ifdef DSGD__SN_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef DSGD__SN_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#define DSGD__SN_INF HUGE_VAL

enum { DSGD__SN_ARRIVING = 0, DSGD__SN_RUNNING, DSGD__SN_WAITING, DSGD__SN_PARKED, DSGD__SN_LEFT, DSGD__SN_DEAD,
       DSGD__SN_SPARE /* set aside (dsgd_simnet_spare): holds nothing back until admitted */ };
enum { DSGD__SN_W_TIME = 0, DSGD__SN_W_XFER, DSGD__SN_W_PROBE, DSGD__SN_W_FROM /* probe_from */ };

typedef struct dsgd__sn_msg {
    struct dsgd__sn_msg *next;
    uint64_t tag;
    size_t bytes;
    double arrival;
    double first; /* when its first byte arrives: arrival - bytes * beta */
    /* the payload follows, aligned for floats */
} dsgd__sn_msg;

#define DSGD__SN_HDR ((sizeof(dsgd__sn_msg) + 15) & ~(size_t)15)
#define DSGD__SN_PAYLOAD(m) ((unsigned char *)(m) + DSGD__SN_HDR)

typedef struct dsgd__sn_pair {
    dsgd__sn_msg *head, *tail;
    double last_arrival;
    long dropped;
    uint64_t key; /* src * ranks + dst */
    int dst;
    int inpos;    /* its place in dst's list of pairs with messages, -1: none */
} dsgd__sn_pair;

typedef struct dsgd__sn_fault {
    dsgd_simnet_fault f;
    long left;   /* DROP, DELAY: messages still to hit */
    int applied; /* STALL by time */
} dsgd__sn_fault;

/* The timeline: a span of a rank's virtual time (desc.trace). */
enum { DSGD__SN_SP_COMPUTE = 0, DSGD__SN_SP_STALL, DSGD__SN_SP_SEND, DSGD__SN_SP_WAIT, DSGD__SN_SP_RECEIVE,
       DSGD__SN_SP_REDUCE, DSGD__SN_SP_KILLED };
/* what `peer` means in a WAIT span: the awaited rank, or these */
#define DSGD__SN_ANY (-1)      /* a probe */
#define DSGD__SN_TIMEOUT_BIT 1 /* flags: the wait ended at the deadline */
#define DSGD__SN_DROPPED_BIT 2 /* flags: the message sent was dropped */

typedef struct dsgd__sn_span {
    double t0, t1;
    uint64_t amount; /* SEND, RECEIVE: bytes; REDUCE: floats; COMPUTE: the step (+1, 0: advance) */
    int peer;
    unsigned char kind, flags;
} dsgd__sn_span;

typedef struct dsgd__sn_ep {
    struct dsgd_simnet *hub;
    int rank;
    int state;
    double t;          /* the virtual clock */
    double key;        /* WAITING: when its wait ends (cached) */
    /* the wait */
    int wait;
    double t_call;     /* the clock when the call began */
    double until;      /* W_TIME: the end; W_XFER: when the send half is done (-INF: none) */
    int src;           /* W_XFER: the source, -1 none */
    size_t reduce_k;   /* W_XFER: floats reduced on receipt (gamma), 0: a copy */
    double deadline;
    double kill_time;  /* KILL by time, or INF */
    int dead_held;     /* killed in a call under park_between_calls: counted
                          parked until its thread calls again or leaves */
    int called;        /* its thread has called the hub (or parked) */
    double tx_free;    /* the NIC, sending */
    double rx_free[2]; /* receiving: [1] within the node (ranks_per_node), [0] the rest */
    long step;         /* the last compute step, -1 */
    double slow;       /* SLOW factor in force */
    uint64_t sent;     /* payload bytes sent (dsgd_simnet_bytes_sent) */
    uint64_t progress; /* atomic */
    uint64_t jitter;   /* test hook's generator (owner thread only) */
    int hpos;          /* its place in the hub's heap, -1: not there */
    int *in;           /* the pairs (indices) that hold messages for this rank */
    int nin, capin;
    pthread_cond_t cv;
    dsgd__sn_span *spans; /* desc.trace: this rank's, in call order */
    size_t nspans, capspans;
    char err[224];
} dsgd__sn_ep;

struct dsgd_simnet {
    dsgd_ctx *ctx;
    dsgd_simnet_desc d;
    int n;
    pthread_mutex_t mu;
    int turn;    /* the rank that may run, -1: none */
    int parked;  /* ranks PARKED */
    int aborted; /* atomic */
    dsgd__sn_ep *ep;
    int *heap;   /* the ranks that can run (ARRIVING, WAITING), by (key, rank) */
    int nheap;
    dsgd__sn_pair *pairs; /* every pair that carried a message, by index */
    size_t npairs, cappairs;
    size_t *map;          /* open addressing: pair index + 1, 0 empty */
    size_t mapcap;        /* a power of 2, or 0 */
    int used;             /* a rank called the hub */
    int ran;              /* dsgd_simnet_run was called */
    struct dsgd__sn_fiber *fib; /* during run with fibers: n + 1, the last the caller's */
    int fibers_done;
    dsgd_simnet_rank_fn fn;
    void *user;
    dsgd__sn_fault *faults;
    double *rank_factor;
    double *backward_s; /* desc.backward_s, copied (one more, never read, so that 0 allocates) */
    dsgd_simnet_stats stats;
    int trace_oom; /* a span could not be recorded */
};

static int dsgd__sn_finite_nonneg(double x) { return x >= 0 && x < DSGD__SN_INF; }

/* >>simnet ready heap ------------------------------------------------------ */

static int dsgd__sn_before(const dsgd__sn_ep *a, const dsgd__sn_ep *b) {
    return a->key < b->key || (a->key == b->key && a->rank < b->rank);
}

static void dsgd__sn_heap_set(dsgd_simnet *h, int i, int rank) {
    h->heap[i] = rank;
    h->ep[rank].hpos = i;
}

static void dsgd__sn_heap_up(dsgd_simnet *h, int i) {
    int x = h->heap[i];
    while (i > 0) {
        int parent = (i - 1) / 2;
        if (!dsgd__sn_before(&h->ep[x], &h->ep[h->heap[parent]])) break;
        dsgd__sn_heap_set(h, i, h->heap[parent]);
        i = parent;
    }
    dsgd__sn_heap_set(h, i, x);
}

static void dsgd__sn_heap_down(dsgd_simnet *h, int i) {
    int x = h->heap[i];
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->nheap) break;
        if (c + 1 < h->nheap && dsgd__sn_before(&h->ep[h->heap[c + 1]], &h->ep[h->heap[c]])) ++c;
        if (!dsgd__sn_before(&h->ep[h->heap[c]], &h->ep[x])) break;
        dsgd__sn_heap_set(h, i, h->heap[c]);
        i = c;
    }
    dsgd__sn_heap_set(h, i, x);
}

/* Puts e in the heap of ranks that can run when it is ARRIVING (key: its
   clock) or WAITING (key: when its wait ends), at its key; takes it out
   otherwise. Called (mutex held) after every change of e's state or key. */
static void dsgd__sn_sched(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    int ready = e->state == DSGD__SN_ARRIVING || e->state == DSGD__SN_WAITING, i, last;
    if (e->state == DSGD__SN_ARRIVING) e->key = e->t;
    if (e->hpos < 0) {
        if (!ready) return;
        i = h->nheap++;
        dsgd__sn_heap_set(h, i, e->rank);
        dsgd__sn_heap_up(h, i);
    } else if (!ready) {
        i = e->hpos;
        e->hpos = -1;
        last = h->heap[--h->nheap];
        if (last != e->rank) {
            dsgd__sn_heap_set(h, i, last);
            dsgd__sn_heap_up(h, i);
            dsgd__sn_heap_down(h, h->ep[last].hpos);
        }
    } else {
        dsgd__sn_heap_up(h, e->hpos);
        dsgd__sn_heap_down(h, e->hpos);
    }
}

/* >>simnet pairs ----------------------------------------------------------- */

static size_t dsgd__sn_slot(uint64_t k, size_t mask) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull;
    k ^= k >> 29;
    return (size_t)k & mask;
}

/* The pair src -> dst, or NULL when it never carried a message. */
static dsgd__sn_pair *dsgd__sn_pair_find(const dsgd_simnet *h, int src, int dst) {
    uint64_t k = (uint64_t)src * (uint64_t)h->n + (uint64_t)dst;
    size_t i, mask = h->mapcap - 1;
    if (!h->mapcap) return NULL;
    for (i = dsgd__sn_slot(k, mask); h->map[i]; i = (i + 1) & mask)
        if (h->pairs[h->map[i] - 1].key == k) return &h->pairs[h->map[i] - 1];
    return NULL;
}

/* The first message from src waiting for dst, or NULL. */
static const dsgd__sn_msg *dsgd__sn_head(const dsgd_simnet *h, int src, int dst) {
    const dsgd__sn_pair *p = dsgd__sn_pair_find(h, src, dst);
    return p ? p->head : NULL;
}

/* The pair src -> dst, made on first use (NULL: out of memory). Pointers
   to pairs are valid until the next call. */
static dsgd__sn_pair *dsgd__sn_pair_get(dsgd_simnet *h, int src, int dst) {
    dsgd__sn_pair *p = dsgd__sn_pair_find(h, src, dst);
    size_t i;
    if (p) return p;
    if (h->npairs == h->cappairs) {
        size_t cap = h->cappairs ? 2 * h->cappairs : 64;
        dsgd__sn_pair *grown = (dsgd__sn_pair *)DSGD_REALLOC(h->pairs, cap * sizeof(*grown));
        if (!grown) return NULL;
        h->pairs = grown;
        h->cappairs = cap;
    }
    if (2 * (h->npairs + 1) > h->mapcap) { /* at most half full */
        size_t cap = h->mapcap ? 2 * h->mapcap : 256, mask = cap - 1;
        size_t *map = (size_t *)DSGD_MALLOC(cap * sizeof(*map));
        if (!map) return NULL;
        memset(map, 0, cap * sizeof(*map));
        for (i = 0; i < h->npairs; ++i) {
            size_t j = dsgd__sn_slot(h->pairs[i].key, mask);
            while (map[j]) j = (j + 1) & mask;
            map[j] = i + 1;
        }
        DSGD_FREE(h->map);
        h->map = map;
        h->mapcap = cap;
    }
    p = &h->pairs[h->npairs];
    memset(p, 0, sizeof(*p));
    p->key = (uint64_t)src * (uint64_t)h->n + (uint64_t)dst;
    p->dst = dst;
    p->inpos = -1;
    for (i = dsgd__sn_slot(p->key, h->mapcap - 1); h->map[i]; i = (i + 1) & (h->mapcap - 1)) {}
    h->map[i] = ++h->npairs;
    return p;
}

/* Validates desc; records the first problem. */
static dsgd_result dsgd__sn_check(dsgd_ctx *ctx, const dsgd_simnet_desc *d) {
    const char *w = "dsgd_simnet_create";
    const dsgd_simnet_compute_desc *c = &d->compute;
    int i;
    if (d->ranks < 1 || d->ranks > 65536)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d ranks (need 1..65536)", w, d->ranks);
    if (!dsgd__sn_finite_nonneg(d->alpha_s) || !dsgd__sn_finite_nonneg(d->beta_s_per_byte) ||
        !dsgd__sn_finite_nonneg(d->gamma_s_per_float) || !dsgd__sn_finite_nonneg(d->intra_alpha_s) ||
        !dsgd__sn_finite_nonneg(d->intra_beta_s_per_byte) || !dsgd__sn_finite_nonneg(d->test_jitter_s) ||
        !dsgd__sn_finite_nonneg(d->overhead_s) || !(d->apply_s_per_float < DSGD__SN_INF) ||
        d->apply_s_per_float != d->apply_s_per_float || !(d->codec_s_per_float < DSGD__SN_INF) ||
        d->codec_s_per_float != d->codec_s_per_float)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: costs must be finite and >= 0 (alpha %g, beta %g, gamma %g, intra alpha %g, "
                                  "intra beta %g, overhead %g, jitter %g; apply %g and codec %g finite)", w,
                                  d->alpha_s, d->beta_s_per_byte, d->gamma_s_per_float, d->intra_alpha_s,
                                  d->intra_beta_s_per_byte, d->overhead_s, d->test_jitter_s, d->apply_s_per_float,
                                  d->codec_s_per_float);
    if (d->park_between_calls && d->half_duplex)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: park_between_calls cannot be combined with half_duplex "
                                  "(its bookings depend on the order of the sends)", w);
    if (d->ranks_per_node < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: ranks_per_node %d < 0", w, d->ranks_per_node);
    if (!dsgd__sn_finite_nonneg(d->trace_until_s))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: trace_until_s %g (need finite, >= 0)", w,
                                  d->trace_until_s);
    if ((int)c->kind < 0 || (int)c->kind > (int)DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown compute kind %d", w, (int)c->kind);
    if (!dsgd__sn_finite_nonneg(c->mean_s) || !dsgd__sn_finite_nonneg(c->shift_s) ||
        !(c->straggler_p >= 0 && c->straggler_p <= 1) || !dsgd__sn_finite_nonneg(c->straggler_factor))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: compute model: mean %g, shift %g, straggler p %g, factor %g (need finite "
                                  "values >= 0 and p in [0, 1])", w, c->mean_s, c->shift_s, c->straggler_p,
                                  c->straggler_factor);
    for (i = 0; c->rank_factor && i < d->ranks; ++i)
        if (!(c->rank_factor[i] > 0 && c->rank_factor[i] < DSGD__SN_INF))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: rank_factor[%d] = %g (need > 0)", w, i,
                                      c->rank_factor[i]);
    if (d->num_backward_s < 0 || (d->num_backward_s > 0 && !d->backward_s))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d backward_s at %p", w, d->num_backward_s,
                                  (const void *)d->backward_s);
    for (i = 0; i < d->num_backward_s; ++i)
        if (!dsgd__sn_finite_nonneg(d->backward_s[i]))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: backward_s[%d] = %g (need finite, >= 0)", w,
                                      i, d->backward_s[i]);
    if (d->num_faults < 0 || (d->num_faults > 0 && !d->faults))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d faults at %p", w, d->num_faults,
                                  (const void *)d->faults);
    for (i = 0; i < d->num_faults; ++i) {
        const dsgd_simnet_fault *f = &d->faults[i];
        const char *bad = NULL;
        if ((int)f->kind < (int)DSGD_SIMNET_FAULT_KILL || (int)f->kind > (int)DSGD_SIMNET_FAULT_DELAY)
            bad = "unknown kind";
        else if (f->rank < 0 || f->rank >= d->ranks)
            bad = "rank out of range";
        else if ((f->kind == DSGD_SIMNET_FAULT_DROP || f->kind == DSGD_SIMNET_FAULT_DELAY) &&
                 (f->peer < -1 || f->peer >= d->ranks))
            bad = "peer out of range";
        else if (f->step < 0 && !dsgd__sn_finite_nonneg(f->time))
            bad = "time must be finite and >= 0";
        else if (!dsgd__sn_finite_nonneg(f->seconds))
            bad = "seconds must be finite and >= 0";
        else if (f->kind == DSGD_SIMNET_FAULT_SLOW && !(f->factor > 0 && f->factor < DSGD__SN_INF))
            bad = "factor must be > 0";
        else if (f->count < 0)
            bad = "count < 0";
        if (bad) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: faults[%d]: %s", w, i, bad);
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_simnet_create(dsgd_ctx *ctx, const dsgd_simnet_desc *desc, dsgd_simnet **out) {
    const char *w = "dsgd_simnet_create";
    dsgd_simnet *h;
    int i, inited = 0;
    dsgd_result r;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", w);
    *out = NULL;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!desc) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: desc is NULL", w);
    if ((r = dsgd__sn_check(ctx, desc)) != DSGD_OK) return r;
    h = (dsgd_simnet *)dsgd__alloc(ctx, sizeof(*h), w);
    if (!h) return DSGD_ERR_OUT_OF_MEMORY;
    memset(h, 0, sizeof(*h));
    h->ctx = ctx;
    h->d = *desc;
    h->n = desc->ranks;
    h->ep = (dsgd__sn_ep *)dsgd__alloc(ctx, sizeof(dsgd__sn_ep) * (size_t)h->n, w);
    h->heap = (int *)dsgd__alloc(ctx, sizeof(int) * (size_t)h->n, w);
    h->faults = (dsgd__sn_fault *)dsgd__alloc(ctx, sizeof(dsgd__sn_fault) * (size_t)(desc->num_faults + 1), w);
    h->rank_factor = (double *)dsgd__alloc(ctx, sizeof(double) * (size_t)h->n, w);
    h->backward_s = (double *)dsgd__alloc(ctx, sizeof(double) * (size_t)(desc->num_backward_s + 1), w);
    if (!h->ep || !h->heap || !h->faults || !h->rank_factor || !h->backward_s) {
        DSGD_FREE(h->ep);
        DSGD_FREE(h->heap);
        DSGD_FREE(h->faults);
        DSGD_FREE(h->rank_factor);
        DSGD_FREE(h->backward_s);
        DSGD_FREE(h);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    memset(h->ep, 0, sizeof(dsgd__sn_ep) * (size_t)h->n);
    for (i = 0; i < desc->num_faults; ++i) {
        h->faults[i].f = desc->faults[i];
        h->faults[i].left = desc->faults[i].count > 0 ? desc->faults[i].count : 1;
        h->faults[i].applied = 0;
    }
    h->d.faults = NULL; /* the copy above is the hub's */
    /* the one place the cost defaults are filled */
    if (h->d.apply_s_per_float == 0) h->d.apply_s_per_float = h->d.gamma_s_per_float;
    else if (h->d.apply_s_per_float < 0) h->d.apply_s_per_float = 0;
    if (h->d.codec_s_per_float == 0) h->d.codec_s_per_float = DSGD_SIMNET_DEFAULT_CODEC_S;
    else if (h->d.codec_s_per_float < 0) h->d.codec_s_per_float = 0;
    for (i = 0; i < h->n; ++i) h->rank_factor[i] = desc->compute.rank_factor ? desc->compute.rank_factor[i] : 1.0;
    h->d.compute.rank_factor = h->rank_factor;
    for (i = 0; i < desc->num_backward_s; ++i) h->backward_s[i] = desc->backward_s[i];
    h->d.backward_s = h->backward_s;
    if (pthread_mutex_init(&h->mu, NULL) == 0) {
        for (i = 0; i < h->n; ++i) {
            dsgd__sn_ep *e = &h->ep[i];
            int k;
            e->hub = h;
            e->rank = i;
            /* parking between calls: outside the hub until the first call */
            e->state = desc->park_between_calls ? DSGD__SN_PARKED : DSGD__SN_ARRIVING;
            e->kill_time = DSGD__SN_INF;
            e->step = -1;
            e->slow = 1.0;
            e->src = -1;
            e->hpos = -1;
            e->jitter = (uint64_t)(dsgd_now() * 1e9) ^ ((uint64_t)i * 0x9E3779B97F4A7C15ull);
            for (k = 0; k < desc->num_faults; ++k) {
                const dsgd_simnet_fault *f = &desc->faults[k];
                if (f->kind == DSGD_SIMNET_FAULT_KILL && f->rank == i && f->step < 0 && f->time < e->kill_time)
                    e->kill_time = f->time;
            }
            if (pthread_cond_init(&e->cv, NULL) != 0) break;
            ++inited;
        }
        if (inited < h->n) {
            for (i = 0; i < inited; ++i) pthread_cond_destroy(&h->ep[i].cv);
            pthread_mutex_destroy(&h->mu);
        }
    }
    if (inited < h->n) {
        DSGD_FREE(h->ep);
        DSGD_FREE(h->heap);
        DSGD_FREE(h->faults);
        DSGD_FREE(h->rank_factor);
        DSGD_FREE(h->backward_s);
        DSGD_FREE(h);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: cannot create a pthread mutex or condition", w);
    }
    /* every rank arrives at time 0, rank 0 first; parked, they come when they call */
    for (i = 0; i < h->n; ++i) dsgd__sn_sched(&h->ep[i]);
    h->turn = desc->park_between_calls ? -1 : 0;
    h->parked = desc->park_between_calls ? h->n : 0;
    *out = h;
    return DSGD_OK;
}

DSGD_API void dsgd_simnet_destroy(dsgd_simnet *h) {
    size_t i;
    int k;
    if (!h) return;
    for (i = 0; i < h->npairs; ++i) {
        dsgd__sn_msg *m = h->pairs[i].head;
        while (m) {
            dsgd__sn_msg *next = m->next;
            DSGD_FREE(m);
            m = next;
        }
    }
    for (k = 0; k < h->n; ++k) {
        pthread_cond_destroy(&h->ep[k].cv);
        DSGD_FREE(h->ep[k].spans);
        DSGD_FREE(h->ep[k].in);
    }
    pthread_mutex_destroy(&h->mu);
    DSGD_FREE(h->ep);
    DSGD_FREE(h->heap);
    DSGD_FREE(h->pairs);
    DSGD_FREE(h->map);
    DSGD_FREE(h->faults);
    DSGD_FREE(h->rank_factor);
    DSGD_FREE(h->backward_s);
    DSGD_FREE(h);
}

DSGD_API void dsgd_simnet_abort(dsgd_simnet *h) {
    int i;
    if (!h) return;
    pthread_mutex_lock(&h->mu);
    DSGD__STORE_SC(&h->aborted, 1);
    if (!h->fib)
        for (i = 0; i < h->n; ++i) pthread_cond_signal(&h->ep[i].cv);
    pthread_mutex_unlock(&h->mu);
}

DSGD_API int dsgd_simnet_aborted(dsgd_simnet *h) { return h ? DSGD__LOAD_SC(&h->aborted) : 0; }

DSGD_API double dsgd_simnet_time(dsgd_simnet *h, int rank) {
    double t;
    if (!h || rank < 0 || rank >= h->n) return 0;
    pthread_mutex_lock(&h->mu);
    t = h->ep[rank].t;
    pthread_mutex_unlock(&h->mu);
    return t;
}

DSGD_API void dsgd_simnet_get_stats(dsgd_simnet *h, dsgd_simnet_stats *out) {
    int i;
    if (!h || !out) return;
    pthread_mutex_lock(&h->mu);
    *out = h->stats;
    out->max_time = 0;
    for (i = 0; i < h->n; ++i)
        if (h->ep[i].t > out->max_time) out->max_time = h->ep[i].t;
    pthread_mutex_unlock(&h->mu);
}

DSGD_API uint64_t dsgd_simnet_bytes_sent(dsgd_simnet *h, int rank) {
    uint64_t b;
    if (!h || rank < 0 || rank >= h->n) return 0;
    pthread_mutex_lock(&h->mu);
    b = h->ep[rank].sent;
    pthread_mutex_unlock(&h->mu);
    return b;
}

/* >>simnet compute model --------------------------------------------------- */

DSGD_API double dsgd_simnet_compute_time(const dsgd_simnet *h, int rank, long step) {
    const dsgd_simnet_compute_desc *c;
    uint64_t s;
    double u, x = 0, straggle;
    if (!h || rank < 0 || rank >= h->n || step < 0) return 0;
    c = &h->d.compute;
    /* one stream per (seed, rank, step): two mixing rounds */
    s = c->seed ^ ((uint64_t)rank * 0xD1B54A32D192ED03ull);
    s = dsgd_rng_next(&s) ^ ((uint64_t)step * 0x9E3779B97F4A7C15ull);
    dsgd_rng_next(&s);
    u = dsgd_rng_uniform(&s);
    straggle = dsgd_rng_uniform(&s);
    switch (c->kind) {
    case DSGD_SIMNET_COMPUTE_CONSTANT: x = c->mean_s; break;
    case DSGD_SIMNET_COMPUTE_EXPONENTIAL: x = -c->mean_s * log(1.0 - u); break;
    case DSGD_SIMNET_COMPUTE_SHIFTED_EXPONENTIAL: x = c->shift_s - c->mean_s * log(1.0 - u); break;
    default: x = 0; break;
    }
    x *= h->rank_factor[rank];
    if (c->straggler_p > 0 && straggle < c->straggler_p && c->straggler_factor > 0) x *= c->straggler_factor;
    return x;
}

/* >>simnet fibers ---------------------------------------------------------- */

/* One rank of dsgd_simnet_run (or the caller of run, the last). */
typedef struct dsgd__sn_fiber {
    void *sp; /* asm: the stack pointer saved at the switch away */
#if DSGD__SN_FIBERS == 2
    ucontext_t uc;
#endif
    unsigned char *stack; /* its lowest 8 bytes hold a canary */
    int done;
#ifdef DSGD__SN_ASAN
    const void *asan_bottom; /* its stack (the caller's: told by the first switch) */
    size_t asan_size;
#endif
#ifdef DSGD__SN_TSAN
    void *tsan; /* its TSan fiber (the caller's: its thread) */
#endif
} dsgd__sn_fiber;

#define DSGD__SN_CANARY 0x5AFE57ACC0FFEE11ull
#define DSGD__SN_STACK_DEFAULT ((size_t)256 * 1024)
#define DSGD__SN_STACK_MIN ((size_t)16 * 1024)

#if DSGD__SN_FIBERS == 1
/* Saves the callee-saved registers (and the SSE and x87 control words) on
   the current stack and its pointer in *save, then loads `to` and returns
   into whatever was saved there (System V x86-64 ABI: rbx, rbp, r12-r15,
   MXCSR and the x87 control word survive a call). */
__attribute__((naked, noinline)) static void dsgd__sn_swap(void **save __attribute__((unused)),
                                                            void *to __attribute__((unused))) {
    __asm__("pushq %rbp\n\t"
            "pushq %rbx\n\t"
            "pushq %r12\n\t"
            "pushq %r13\n\t"
            "pushq %r14\n\t"
            "pushq %r15\n\t"
            "subq $8, %rsp\n\t"
            "stmxcsr (%rsp)\n\t"
            "fnstcw 4(%rsp)\n\t"
            "movq %rsp, (%rdi)\n\t"
            "movq %rsi, %rsp\n\t"
            "ldmxcsr (%rsp)\n\t"
            "fldcw 4(%rsp)\n\t"
            "addq $8, %rsp\n\t"
            "popq %r15\n\t"
            "popq %r14\n\t"
            "popq %r13\n\t"
            "popq %r12\n\t"
            "popq %rbx\n\t"
            "popq %rbp\n\t"
            "ret\n\t");
}

/* A new fiber's first return lands here: entry(arg) from r13(r12), which
   never returns. */
__attribute__((naked, noinline)) static void dsgd__sn_boot(void) {
    __asm__("movq %r12, %rdi\n\t"
            "callq *%r13\n\t"
            "ud2\n\t");
}

/* A stack that dsgd__sn_swap can switch to: it returns into boot with
   entry and arg in r13 and r12, and the stack aligned as after a call. */
static void *dsgd__sn_stack_init(unsigned char *stack, size_t size, void (*entry)(void *), void *arg) {
    uint64_t *sp = (uint64_t *)(void *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    uint32_t ctl[2] = {0, 0};
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(ctl[0]), "=m"(ctl[1]));
    *--sp = 0;
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)dsgd__sn_boot; /* after its ret, rsp is 16-aligned */
    *--sp = 0;                                  /* rbp */
    *--sp = 0;                                  /* rbx */
    *--sp = (uint64_t)(uintptr_t)arg;           /* r12 */
    *--sp = (uint64_t)(uintptr_t)entry;         /* r13 */
    *--sp = 0;                                  /* r14 */
    *--sp = 0;                                  /* r15 */
    *--sp = (uint64_t)ctl[0] | ((uint64_t)(ctl[1] & 0xFFFFu) << 32);
    return sp;
}
#endif

#if DSGD__SN_FIBERS
/* Switches from fiber `from` to fiber `to` (-1: the caller of run); the
   mutex stays held, and the fiber switched to carries on with it. ASan is
   told the stack switched to before, and that the switch is over after
   (a finished rank's fake frames, NULL, go); TSan which fiber runs next,
   with a happens-before edge from this one. TSan's fibers own mutexes as
   threads do (one unlocked by another fiber than its locker is a bad
   unlock, whatever the switch's flags), so under TSan the mutex is let go
   before the switch and taken again after it: `to` was chosen under it,
   and what another thread may do in between (abort) every fiber rechecks. */
static void dsgd__sn_switch(dsgd_simnet *h, int from, int to) {
    dsgd__sn_fiber *f = &h->fib[from < 0 ? h->n : from], *t = &h->fib[to < 0 ? h->n : to];
#ifdef DSGD__SN_ASAN
    void *fake = NULL;
#endif
    if (f == t) return;
    /* a rank that overflowed its stack (desc.fiber_stack_bytes) wrote over it */
    DSGD_ASSERT(!f->stack || *(const uint64_t *)(const void *)f->stack == DSGD__SN_CANARY);
#ifdef DSGD__SN_TSAN
    pthread_mutex_unlock(&h->mu);
    __tsan_switch_to_fiber(t->tsan, 0);
#endif
#ifdef DSGD__SN_ASAN
    __sanitizer_start_switch_fiber(f->done ? NULL : &fake, t->asan_bottom, t->asan_size);
#endif
#if DSGD__SN_FIBERS == 1
    dsgd__sn_swap(&f->sp, t->sp);
#else
    swapcontext(&f->uc, &t->uc);
#endif
#ifdef DSGD__SN_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
#ifdef DSGD__SN_TSAN
    pthread_mutex_lock(&h->mu);
#endif
}

/* A rank's fiber, entered for the first time: ASan's switch ends here (and
   names the caller of run's stack, which the first switch leaves); under
   TSan it takes the mutex that the switch let go. */
static void dsgd__sn_fiber_begin(dsgd_simnet *h) {
#ifdef DSGD__SN_ASAN
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    if (!h->fib[h->n].asan_bottom) {
        h->fib[h->n].asan_bottom = bottom;
        h->fib[h->n].asan_size = size;
    }
#endif
#ifdef DSGD__SN_TSAN
    pthread_mutex_lock(&h->mu);
#endif
    (void)h;
}
#endif

/* >>simnet scheduler ------------------------------------------------------- */

/* The test hook: a random real-time pause (a yield or a sleep). */
static void dsgd__sn_jitter(dsgd__sn_ep *e) {
    double j = e->hub->d.test_jitter_s;
    uint64_t r;
    if (!(j > 0)) return;
    r = dsgd_rng_next(&e->jitter);
    if (r & 1) {
        sched_yield();
    } else {
        struct timespec ts;
        double s = j * (double)(r >> 11) * (1.0 / 9007199254740992.0);
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
}

/* When e's NIC has taken m, the next message e takes: the NIC takes one
   message at a time, in the order e takes them (unless parallel_receives;
   half_duplex books at the send). *in: when its bytes begin to come in. */
/* Which of e's receiving links a message from src comes in over. */
static int dsgd__sn_lane(const dsgd__sn_ep *e, int src) {
    int L = e->hub->d.ranks_per_node;
    return L > 0 && src / L == e->rank / L;
}

static double dsgd__sn_taken(const dsgd__sn_ep *e, const dsgd__sn_msg *m, int src, double *in) {
    const dsgd_simnet *h = e->hub;
    double b = m->first, f = e->rx_free[dsgd__sn_lane(e, src)];
    if (!h->d.parallel_receives && !h->d.half_duplex && f > b) b = f;
    if (in) *in = b;
    return b == m->first ? m->arrival : b + (m->arrival - m->first);
}

static void dsgd__sn_link(const dsgd_simnet *h, int s, int d, double *alpha, double *beta);

/* When e's wait is over, ignoring the deadline (INF: not known yet). */
static double dsgd__sn_event(const dsgd__sn_ep *e) {
    const dsgd_simnet *h = e->hub;
    double ev;
    int k;
    switch (e->wait) {
    case DSGD__SN_W_TIME: return e->until;
    case DSGD__SN_W_XFER: {
        const dsgd__sn_msg *m;
        ev = e->until;
        if (e->src < 0) return ev;
        m = dsgd__sn_head(h, e->src, e->rank);
        if (!m) return DSGD__SN_INF;
        return DSGD__MAX(ev, DSGD__MAX(e->t_call, dsgd__sn_taken(e, m, e->src, NULL)) + h->d.overhead_s +
                                 (double)e->reduce_k * h->d.gamma_s_per_float);
    }
    case DSGD__SN_W_FROM: { /* src's next message, or src gone (killed, left) with nothing left: known a
                               latency later, as a message it sent then */
        const dsgd__sn_msg *m = dsgd__sn_head(h, e->src, e->rank);
        const dsgd__sn_ep *src = &h->ep[e->src];
        double alpha, beta;
        if (m) return DSGD__MAX(e->t_call, dsgd__sn_taken(e, m, e->src, NULL));
        if (src->state != DSGD__SN_DEAD && src->state != DSGD__SN_LEFT) return DSGD__SN_INF;
        dsgd__sn_link(h, e->src, e->rank, &alpha, &beta);
        return DSGD__MAX(e->t_call, (src->state == DSGD__SN_DEAD ? src->kill_time : src->t) + alpha);
    }
    default: /* probe: the earliest the NIC could take */
        ev = DSGD__SN_INF;
        for (k = 0; k < e->nin; ++k) {
            const dsgd__sn_pair *p = &h->pairs[e->in[k]];
            double a = dsgd__sn_taken(e, p->head, (int)(p->key / (uint64_t)h->n), NULL);
            if (a < ev) ev = a;
        }
        return ev < DSGD__SN_INF ? DSGD__MAX(ev, e->t_call) : ev;
    }
}

static double dsgd__sn_key(const dsgd__sn_ep *e) {
    double k = dsgd__sn_event(e);
    if (e->deadline < k) k = e->deadline;
    if (e->kill_time < k) k = e->kill_time;
    return k;
}

/* Non-zero when no parked rank can change how e's wait ends. A compute
   (a death inside it included) and a message already queued (a pair's
   messages arrive in order) are e's own. A deadline that fires, a death
   by time, or the choice of a probe, at time K could be changed by a
   message from any parked rank p, directly or through ranks it unblocks
   (it would end the wait before K), and such a message arrives no earlier
   than t_p plus the smallest latency: so it needs every parked rank past
   K - alpha_min. A death so waits no longer than the wait's deadline
   would (K is at most the deadline). A probe_from (W_FROM) that ends by
   src's message or src gone is e's own too (its death is known a
   latency later, as a message would be). */
static int dsgd__sn_safe(const dsgd__sn_ep *e) {
    const dsgd_simnet *h = e->hub;
    double alpha_min = h->d.alpha_s;
    int k;
    if (h->parked == 0 || e->state != DSGD__SN_WAITING || e->wait == DSGD__SN_W_TIME)
        return 1;
    if (e->wait == DSGD__SN_W_FROM && (dsgd__sn_head(h, e->src, e->rank) || h->ep[e->src].state == DSGD__SN_DEAD ||
                                        h->ep[e->src].state == DSGD__SN_LEFT))
        return 1;
    if (e->wait == DSGD__SN_W_XFER &&
        (e->src < 0 || dsgd__sn_head(h, e->src, e->rank)))
        return 1;
    if (h->d.ranks_per_node > 0 && h->d.intra_alpha_s < alpha_min) alpha_min = h->d.intra_alpha_s;
    for (k = 0; k < h->n; ++k) {
        const dsgd__sn_ep *p = &h->ep[k];
        if ((p->state == DSGD__SN_PARKED || p->dead_held) && !(p->t + alpha_min > e->key)) return 0;
    }
    return 1;
}

/* Gives the turn to the rank with the smallest (key, rank), when its wait
   can end whatever the parked ranks do; otherwise (or when no rank is
   left) to nobody (-1) until a parked rank returns. Called with the mutex
   held by the rank that has the turn (or that just gave it up by parking,
   leaving or dying), or by a parked rank returning to a hub where nobody
   has the turn. */
static void dsgd__sn_pass(dsgd_simnet *h) {
    int best = h->nheap > 0 ? h->heap[0] : -1, me = h->turn;
    if (best >= 0 && !dsgd__sn_safe(&h->ep[best])) best = -1;
    h->turn = best;
    if (best >= 0 && best != me) {
        h->stats.handoffs++;
        if (!h->fib) pthread_cond_signal(&h->ep[best].cv);
    }
}

/* Waits (mutex held) until it is e's turn or the hub is aborted. */
static void dsgd__sn_wait_turn(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
#if DSGD__SN_FIBERS
    if (h->fib) {
        while (h->turn != e->rank && !DSGD__LOAD_RLX(&h->aborted)) dsgd__sn_switch(h, e->rank, h->turn);
        return;
    }
#endif
    while (h->turn != e->rank && !DSGD__LOAD_RLX(&h->aborted)) pthread_cond_wait(&e->cv, &h->mu);
}

static dsgd_result dsgd__sn_fail(dsgd__sn_ep *e, dsgd_result r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static dsgd_result dsgd__sn_fail(dsgd__sn_ep *e, dsgd_result r, const char *fmt, ...) {
    va_list ap;
    int k = snprintf(e->err, sizeof(e->err), "simnet rank %d at %.9g s: ", e->rank, e->t);
    if (k < 0 || (size_t)k >= sizeof(e->err)) return r;
    va_start(ap, fmt);
    vsnprintf(e->err + k, sizeof(e->err) - (size_t)k, fmt, ap);
    va_end(ap);
    return r;
}

/* >>simnet timeline -------------------------------------------------------- */

/* Records a span of e's time (mutex held, on e's thread): nothing without
   desc.trace, for an empty span (other than KILLED), or past
   trace_until_s. */
static void dsgd__sn_span_add(dsgd__sn_ep *e, int kind, double t0, double t1, int peer, uint64_t amount, int flags) {
    dsgd_simnet *h = e->hub;
    dsgd__sn_span *sp;
    if (!h->d.trace || h->trace_oom || (t1 <= t0 && kind != DSGD__SN_SP_KILLED)) return;
    if (h->d.trace_until_s > 0 && t0 >= h->d.trace_until_s) return;
    if (e->nspans == e->capspans) {
        size_t cap = e->capspans ? 2 * e->capspans : 256;
        dsgd__sn_span *grown = (dsgd__sn_span *)DSGD_REALLOC(e->spans, cap * sizeof(*grown));
        if (!grown) {
            h->trace_oom = 1;
            return;
        }
        e->spans = grown;
        e->capspans = cap;
    }
    sp = &e->spans[e->nspans++];
    sp->t0 = t0;
    sp->t1 = t1;
    sp->amount = amount;
    sp->peer = peer;
    sp->kind = (unsigned char)kind;
    sp->flags = (unsigned char)flags;
}

/* The spans of a transfer call that began at t_call: its send half left
   the NIC at done (-INF: none); m (NULL: none, or the wait failed) is the
   message it waited for; the call ends at e->t. */
static void dsgd__sn_span_xfer(dsgd__sn_ep *e, int dst, size_t sbytes, double done, int src, const dsgd__sn_msg *m,
                               size_t reduce_k, int dropped, int failed) {
    double cur = e->t_call, r0, in;
    if (!e->hub->d.trace) return;
    if (dst >= 0 && done > cur) {
        dsgd__sn_span_add(e, DSGD__SN_SP_SEND, cur, done, dst, sbytes, dropped ? DSGD__SN_DROPPED_BIT : 0);
        cur = done;
    }
    if (m) {
        double taken = dsgd__sn_taken(e, m, src, &in);
        r0 = DSGD__MAX(e->t_call, in);
        if (r0 > cur) {
            dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, cur, r0, src, 0, 0);
            cur = r0;
        }
        if (taken > cur) {
            dsgd__sn_span_add(e, DSGD__SN_SP_RECEIVE, cur, taken, src, m->bytes, 0);
            cur = taken;
        }
        if (reduce_k && e->t > cur) dsgd__sn_span_add(e, DSGD__SN_SP_REDUCE, cur, e->t, src, reduce_k, 0);
    } else if (e->t > cur) {
        dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, cur, e->t, src, 0, failed ? DSGD__SN_TIMEOUT_BIT : 0);
    }
}

static const char *const dsgd__sn_span_names[] = {"compute", "stall", "send", "wait", "receive", "reduce", "killed"};

DSGD_API dsgd_result dsgd_simnet_write_trace(dsgd_simnet *h, FILE *out) {
    const char *w = "dsgd_simnet_write_trace";
    int r;
    size_t i;
    if (!h) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", w);
    if (!h->d.trace) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_STATE, "%s: the hub was created without trace", w);
    pthread_mutex_lock(&h->mu);
    if (h->trace_oom) {
        pthread_mutex_unlock(&h->mu);
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: spans were lost to a failed allocation", w);
    }
    fprintf(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"distsgd simnet\",\"ranks\":%d},"
                 "\"traceEvents\":[\n", h->n);
    fprintf(out, "{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"simnet\"}}");
    for (r = 0; r < h->n; ++r)
        fprintf(out, ",\n{\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"rank %d\"}}"
                     ",\n{\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                r, r, r, r);
    for (r = 0; r < h->n; ++r) {
        const dsgd__sn_ep *e = &h->ep[r];
        for (i = 0; i < e->nspans; ++i) {
            const dsgd__sn_span *sp = &e->spans[i];
            const char *name = dsgd__sn_span_names[sp->kind];
            double ts = sp->t0 * 1e6;
            if (sp->kind == DSGD__SN_SP_KILLED) {
                fprintf(out, ",\n{\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":%d,\"name\":\"%s\",\"cat\":\"fault\",\"ts\":%.3f}",
                        r, name, ts);
                continue;
            }
            fprintf(out, ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"name\":\"%s\",\"cat\":\"simnet\",\"ts\":%.3f,\"dur\":%.3f",
                    r, name, ts, sp->t1 * 1e6 - ts);
            switch (sp->kind) {
            case DSGD__SN_SP_COMPUTE:
                if (sp->amount) fprintf(out, ",\"args\":{\"step\":%llu}", (unsigned long long)(sp->amount - 1));
                break;
            case DSGD__SN_SP_SEND:
                fprintf(out, ",\"args\":{\"to\":%d,\"bytes\":%llu%s}", sp->peer, (unsigned long long)sp->amount,
                        sp->flags & DSGD__SN_DROPPED_BIT ? ",\"dropped\":1" : "");
                break;
            case DSGD__SN_SP_RECEIVE:
                fprintf(out, ",\"args\":{\"from\":%d,\"bytes\":%llu}", sp->peer, (unsigned long long)sp->amount);
                break;
            case DSGD__SN_SP_REDUCE:
                fprintf(out, ",\"args\":{\"from\":%d,\"floats\":%llu}", sp->peer, (unsigned long long)sp->amount);
                break;
            case DSGD__SN_SP_WAIT:
                if (sp->peer >= 0) fprintf(out, ",\"args\":{\"for\":%d%s}", sp->peer,
                                           sp->flags & DSGD__SN_TIMEOUT_BIT ? ",\"timeout\":1" : "");
                else fprintf(out, ",\"args\":{\"for\":\"any\"%s}", sp->flags & DSGD__SN_TIMEOUT_BIT ? ",\"timeout\":1" : "");
                break;
            default: break;
            }
            fputc('}', out);
        }
    }
    fputs("\n]}\n", out);
    pthread_mutex_unlock(&h->mu);
    if (fflush(out) != 0 || ferror(out)) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_IO, "%s: a write failed", w);
    return DSGD_OK;
}

/* Applies time-triggered stalls once e's clock has reached them. */
static void dsgd__sn_stalls(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    int i;
    for (i = 0; i < h->d.num_faults; ++i) {
        dsgd__sn_fault *f = &h->faults[i];
        if (f->f.kind == DSGD_SIMNET_FAULT_STALL && f->f.rank == e->rank && f->f.step < 0 && !f->applied &&
            e->t >= f->f.time) {
            f->applied = 1;
            if (e->t < f->f.time + f->f.seconds) {
                dsgd__sn_span_add(e, DSGD__SN_SP_STALL, e->t, f->f.time + f->f.seconds, -1, 0, 0);
                e->t = f->f.time + f->f.seconds;
            }
        }
    }
}

/* e is gone (killed, left): the ranks whose probe_from waits for it
   learn it now. */
static void dsgd__sn_gone(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    int k;
    for (k = 0; k < h->n; ++k) {
        dsgd__sn_ep *w = &h->ep[k];
        if (w->state == DSGD__SN_WAITING && w->wait == DSGD__SN_W_FROM && w->src == e->rank) {
            w->key = dsgd__sn_key(w);
            dsgd__sn_sched(w);
        }
    }
}

/* The rank dies at time `at`: it gives up the turn for good. */
static dsgd_result dsgd__sn_die(dsgd__sn_ep *e, double at) {
    if (at > e->t) e->t = at;
    e->state = DSGD__SN_DEAD;
    dsgd__sn_sched(e);
    e->kill_time = e->t;
    dsgd__sn_gone(e);
    if (e->hub->d.park_between_calls && !e->dead_held) { /* held until its thread has heard */
        e->dead_held = 1;
        e->hub->parked++;
    }
    dsgd__sn_span_add(e, DSGD__SN_SP_KILLED, e->t, e->t, -1, 0, 0);
    dsgd__sn_pass(e->hub);
    return dsgd__sn_fail(e, DSGD_ERR_ABORTED, "this rank was killed (fault injection)");
}

/* A killed rank held as parked (dead_held) is let go: its thread called
   again or left, so it knows. */
static void dsgd__sn_unhold(dsgd__sn_ep *e) {
    if (!e->dead_held) return;
    e->dead_held = 0;
    e->hub->parked--;
    if (e->hub->turn < 0) dsgd__sn_pass(e->hub);
}

/* Entering the hub: locks the mutex and waits for the turn. Returns DSGD_OK
   with the mutex held and the turn, or an error with the mutex released. */
static dsgd_result dsgd__sn_enter(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    dsgd_result r;
    dsgd__sn_jitter(e);
    pthread_mutex_lock(&h->mu);
    h->used = 1;
    e->called = 1;
    dsgd__sn_unhold(e);
    if (e->state == DSGD__SN_PARKED) {
        /* back at its clock, as a rank arriving */
        e->state = DSGD__SN_ARRIVING;
        dsgd__sn_sched(e);
        h->parked--;
        if (h->turn < 0) dsgd__sn_pass(h);
    }
    if (e->state == DSGD__SN_ARRIVING) {
        dsgd__sn_wait_turn(e);
        if (!DSGD__LOAD_RLX(&h->aborted)) {
            e->state = DSGD__SN_RUNNING;
            dsgd__sn_sched(e);
            dsgd__sn_jitter(e);
        }
    }
    if (DSGD__LOAD_RLX(&h->aborted)) {
        r = dsgd__sn_fail(e, DSGD_ERR_ABORTED, "the hub was aborted");
    } else if (e->state == DSGD__SN_DEAD) {
        r = dsgd__sn_fail(e, DSGD_ERR_ABORTED, "this rank was killed at %.9g s (fault injection)", e->kill_time);
    } else if (e->state == DSGD__SN_LEFT) {
        r = dsgd__sn_fail(e, DSGD_ERR_STATE, "this rank left the simulation");
    } else if (e->state == DSGD__SN_SPARE) {
        r = dsgd__sn_fail(e, DSGD_ERR_STATE, "this rank is a spare: dsgd_simnet_admit it first");
    } else {
        DSGD_ASSERT(e->state == DSGD__SN_RUNNING && h->turn == e->rank);
        dsgd__sn_stalls(e);
        if (e->t >= e->kill_time) {
            dsgd__sn_die(e, e->kill_time);
            r = DSGD_ERR_ABORTED;
        } else {
            return DSGD_OK;
        }
    }
    pthread_mutex_unlock(&h->mu);
    return r;
}

/* Waits, holding the mutex and the turn, for e's wait (set by the caller)
   to be due, and returns with the turn again: DSGD_OK (the event is due;
   the clock is at it), DSGD_ERR_TIMEOUT (the clock is at the deadline, or
   every rank waits for ever), DSGD_ERR_ABORTED (aborted or killed; the
   message is set). */
static dsgd_result dsgd__sn_block(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    double ev;
    e->state = DSGD__SN_WAITING;
    e->key = dsgd__sn_key(e);
    dsgd__sn_sched(e);
    dsgd__sn_pass(h);
    dsgd__sn_wait_turn(e);
    if (DSGD__LOAD_RLX(&h->aborted)) {
        if (e->state == DSGD__SN_WAITING) {
            e->state = DSGD__SN_RUNNING;
            dsgd__sn_sched(e);
        }
        return dsgd__sn_fail(e, DSGD_ERR_ABORTED, "the hub was aborted");
    }
    e->state = DSGD__SN_RUNNING;
    dsgd__sn_sched(e);
    dsgd__sn_jitter(e);
    ev = dsgd__sn_event(e);
    if (e->kill_time < DSGD__SN_INF && e->kill_time <= ev && e->kill_time <= e->deadline)
        return dsgd__sn_die(e, e->kill_time);
    if (ev < DSGD__SN_INF && ev <= e->deadline) {
        if (ev > e->t) e->t = ev;
        return DSGD_OK;
    }
    if (e->deadline < DSGD__SN_INF) {
        if (e->deadline > e->t) e->t = e->deadline;
        return DSGD_ERR_TIMEOUT;
    }
    return DSGD_ERR_TIMEOUT; /* every rank waits with no deadline: a deadlock */
}

/* Parks a running rank: it gives up the turn and is left out of the
   scheduling until its next call. */
static void dsgd__sn_park(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    e->state = DSGD__SN_PARKED;
    dsgd__sn_sched(e);
    h->parked++;
    if (h->turn == e->rank) dsgd__sn_pass(h);
}

/* Leaves the hub after a call: time-triggered stalls, parking when every
   rank parks between calls, then the mutex. */
static dsgd_result dsgd__sn_exit(dsgd__sn_ep *e, dsgd_result r) {
    if (e->state == DSGD__SN_RUNNING) {
        dsgd__sn_stalls(e);
        if (e->hub->d.park_between_calls && !DSGD__LOAD_RLX(&e->hub->aborted)) dsgd__sn_park(e);
    }
    pthread_mutex_unlock(&e->hub->mu);
    return r;
}

/* >>simnet transfers ------------------------------------------------------- */

static void dsgd__sn_link(const dsgd_simnet *h, int s, int d, double *alpha, double *beta) {
    int L = h->d.ranks_per_node;
    if (L > 0 && s / L == d / L) {
        *alpha = h->d.intra_alpha_s;
        *beta = h->d.intra_beta_s_per_byte;
    } else {
        *alpha = h->d.alpha_s;
        *beta = h->d.beta_s_per_byte;
    }
}

/* The DROP or DELAY fault that hits a message from e to dst now, if any. */
static dsgd__sn_fault *dsgd__sn_msg_fault(dsgd__sn_ep *e, int dst, int kind) {
    dsgd_simnet *h = e->hub;
    int i;
    for (i = 0; i < h->d.num_faults; ++i) {
        dsgd__sn_fault *f = &h->faults[i];
        if ((int)f->f.kind != kind || f->f.rank != e->rank || f->left <= 0) continue;
        if (f->f.peer >= 0 && f->f.peer != dst) continue;
        if (f->f.step >= 0 ? e->step < f->f.step : e->t < f->f.time) continue;
        return f;
    }
    return NULL;
}

/* Posts a message from e (at its clock) to dst; *done is when it has left
   the NIC. DSGD_ERR_TIMEOUT (nothing posted) when that is past the
   deadline. */
static dsgd_result dsgd__sn_post(dsgd__sn_ep *e, int dst, uint64_t tag, const void *buf, size_t bytes,
                                 double deadline, double *done) {
    dsgd_simnet *h = e->hub;
    dsgd__sn_ep *d = &h->ep[dst];
    dsgd__sn_pair *p;
    double alpha, beta, start, occupy, *tx, *rx = NULL;
    dsgd__sn_fault *f;
    dsgd__sn_msg *m;
    dsgd__sn_link(h, e->rank, dst, &alpha, &beta);
    tx = &e->tx_free;
    if (h->d.half_duplex) rx = &d->tx_free;
    start = DSGD__MAX(e->t + h->d.overhead_s, *tx); /* o: the CPU hands the message to the NIC */
    if (rx && *rx > start) start = *rx;
    occupy = (double)bytes * beta;
    *done = start + occupy;
    if (*done > deadline)
        return dsgd__sn_fail(e, DSGD_ERR_TIMEOUT, "the deadline passed before the message to rank %d could leave", dst);
    if (!(p = dsgd__sn_pair_get(h, e->rank, dst)))
        return dsgd__sn_fail(e, DSGD_ERR_OUT_OF_MEMORY, "cannot record the pair to rank %d", dst);
    if (!p->head && d->nin == d->capin) { /* room in dst's list of pairs with messages */
        int cap = d->capin ? 2 * d->capin : 4;
        int *grown = (int *)DSGD_REALLOC(d->in, (size_t)cap * sizeof(int));
        if (!grown) return dsgd__sn_fail(e, DSGD_ERR_OUT_OF_MEMORY, "cannot list a message for rank %d", dst);
        d->in = grown;
        d->capin = cap;
    }
    m = (dsgd__sn_msg *)DSGD_MALLOC(DSGD__SN_HDR + bytes);
    if (!m) return dsgd__sn_fail(e, DSGD_ERR_OUT_OF_MEMORY, "cannot buffer %zu bytes for rank %d", bytes, dst);
    *tx = *done;
    if (rx) *rx = *done;
    h->stats.messages++;
    h->stats.bytes += bytes;
    e->sent += bytes;
    if ((f = dsgd__sn_msg_fault(e, dst, DSGD_SIMNET_FAULT_DROP)) != NULL) {
        f->left--;
        p->dropped++;
        h->stats.dropped++;
        DSGD_FREE(m);
        return DSGD_OK;
    }
    m->next = NULL;
    m->tag = tag;
    m->bytes = bytes;
    m->arrival = *done + alpha;
    if ((f = dsgd__sn_msg_fault(e, dst, DSGD_SIMNET_FAULT_DELAY)) != NULL) {
        f->left--;
        m->arrival += f->f.seconds;
    }
    if (m->arrival < p->last_arrival) m->arrival = p->last_arrival; /* one pair stays in order */
    p->last_arrival = m->arrival;
    m->first = m->arrival - occupy;
    if (bytes) memcpy(DSGD__SN_PAYLOAD(m), buf, bytes);
    if (p->tail) {
        p->tail->next = m;
    } else {
        p->head = m;
        p->inpos = d->nin;
        d->in[d->nin++] = (int)(p - h->pairs);
    }
    p->tail = m;
    if (d->state == DSGD__SN_WAITING) {
        d->key = dsgd__sn_key(d);
        dsgd__sn_sched(d);
    }
    return DSGD_OK;
}

/* Why a wait for src ended without its message: text for the error. */
static const char *dsgd__sn_why(const dsgd__sn_ep *e, int src, char *buf, size_t cap) {
    const dsgd_simnet *h = e->hub;
    const dsgd__sn_ep *p = &h->ep[src];
    const dsgd__sn_pair *pr = dsgd__sn_pair_find(h, src, e->rank);
    buf[0] = '\0';
    if (p->state == DSGD__SN_DEAD) snprintf(buf, cap, " (rank %d was killed at %.9g s)", src, p->kill_time);
    else if (pr && pr->dropped)
        snprintf(buf, cap, " (a message from rank %d was dropped)", src);
    else if (p->state == DSGD__SN_LEFT) snprintf(buf, cap, " (rank %d left the simulation)", src);
    return buf;
}

/* The one transfer: post to dst (>= 0), then wait for the message from src
   (>= 0) and copy it (op < 0) or reduce it into rbuf. */
static dsgd_result dsgd__sn_xfer(dsgd__sn_ep *e, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                 uint64_t rtag, void *rbuf, size_t rbytes, int op, double deadline,
                                 int *failed_peer) {
    dsgd_simnet *h = e->hub;
    dsgd_result r;
    double done = -DSGD__SN_INF;
    uint64_t dropped_before;
    char why[96];
    if (failed_peer) *failed_peer = -1;
    if ((r = dsgd__sn_enter(e)) != DSGD_OK) {
        if (failed_peer) *failed_peer = src >= 0 ? src : dst;
        return r;
    }
    e->t_call = e->t;
    dropped_before = h->stats.dropped;
    if (dst >= 0 && (r = dsgd__sn_post(e, dst, stag, sbuf, sbytes, deadline, &done)) != DSGD_OK) {
        /* the send could not leave in time: wait out the deadline, then fail */
        e->wait = DSGD__SN_W_TIME;
        e->until = DSGD__SN_INF;
        e->deadline = r == DSGD_ERR_TIMEOUT ? deadline : e->t;
        if (dsgd__sn_block(e) != DSGD_ERR_ABORTED)
            dsgd__sn_fail(e, r, r == DSGD_ERR_TIMEOUT ? "the deadline passed before the message to rank %d could leave"
                                                      : "cannot buffer a message for rank %d", dst);
        dsgd__sn_span_xfer(e, -1, 0, done, dst, NULL, 0, 0, 1);
        if (failed_peer) *failed_peer = dst;
        return dsgd__sn_exit(e, r);
    }
    e->wait = DSGD__SN_W_XFER;
    e->until = done;
    e->src = src;
    e->reduce_k = op >= 0 ? rbytes / sizeof(float) : 0;
    e->deadline = deadline;
    r = dsgd__sn_block(e);
    if (r == DSGD_OK && src >= 0) {
        dsgd__sn_pair *p = dsgd__sn_pair_find(h, src, e->rank);
        dsgd__sn_msg *m = p ? p->head : NULL;
        DSGD_ASSERT(m != NULL);
        dsgd__sn_span_xfer(e, dst, sbytes, done, src, m, e->reduce_k, h->stats.dropped != dropped_before, 0);
        if (m->tag != rtag || m->bytes != rbytes) {
            r = dsgd__sn_fail(e, DSGD_ERR_DESYNC,
                              "rank %d sent tag %#llx of %zu bytes; this rank expected tag %#llx of %zu bytes%s", src,
                              (unsigned long long)m->tag, m->bytes, (unsigned long long)rtag, rbytes,
                              dsgd__sn_why(e, src, why, sizeof(why)));
        } else {
            p->head = m->next;
            if (!p->head) { /* off this rank's list of pairs with messages */
                int last = e->in[--e->nin];
                p->tail = NULL;
                e->in[p->inpos] = last;
                h->pairs[last].inpos = p->inpos;
                p->inpos = -1;
            }
            e->rx_free[dsgd__sn_lane(e, src)] = dsgd__sn_taken(e, m, src, NULL);
            if (op < 0) {
                if (rbytes) memcpy(rbuf, DSGD__SN_PAYLOAD(m), rbytes);
            } else {
                dsgd__reduce_into((float *)rbuf, (const float *)(const void *)DSGD__SN_PAYLOAD(m),
                                  rbytes / sizeof(float), (dsgd_reduce_op)op, 0);
            }
            DSGD_FREE(m);
        }
    } else {
        dsgd__sn_span_xfer(e, dst, sbytes, done, src, NULL, 0, h->stats.dropped != dropped_before, r != DSGD_OK);
    }
    if (r == DSGD_ERR_TIMEOUT) {
        if (src >= 0 && e->deadline < DSGD__SN_INF)
            dsgd__sn_fail(e, r, "the deadline passed while waiting for rank %d%s", src, dsgd__sn_why(e, src, why, sizeof(why)));
        else if (src >= 0)
            dsgd__sn_fail(e, r, "deadlock: every rank waits and nothing is in flight; waiting for rank %d", src);
        else
            dsgd__sn_fail(e, r, "the deadline passed before the message to rank %d had left", dst);
    }
    if (r != DSGD_OK && failed_peer) *failed_peer = src >= 0 ? src : dst;
    return dsgd__sn_exit(e, r);
}

/* peer -1 (no transfer) or another rank of the hub. */
static dsgd_result dsgd__sn_check_peer(dsgd__sn_ep *e, int peer, int *failed_peer) {
    if (peer < -1 || peer >= e->hub->n || peer == e->rank) {
        if (failed_peer) *failed_peer = peer;
        snprintf(e->err, sizeof(e->err), "simnet rank %d: invalid peer %d", e->rank, peer);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    return DSGD_OK;
}

static dsgd_result dsgd__sn_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    if (dst < 0 || dsgd__sn_check_peer(e, dst, NULL) != DSGD_OK) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: invalid peer %d", e->rank, dst);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    return dsgd__sn_xfer(e, dst, tag, buf, bytes, -1, 0, NULL, 0, -1, deadline, NULL);
}

static dsgd_result dsgd__sn_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    if (src < 0 || dsgd__sn_check_peer(e, src, NULL) != DSGD_OK) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: invalid peer %d", e->rank, src);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    return dsgd__sn_xfer(e, -1, 0, NULL, 0, src, tag, buf, bytes, -1, deadline, NULL);
}

static dsgd_result dsgd__sn_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                     uint64_t rtag, void *rbuf, size_t rbytes, double deadline, int *failed_peer) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    if (dsgd__sn_check_peer(e, dst, failed_peer) != DSGD_OK || dsgd__sn_check_peer(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__sn_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, -1, deadline, failed_peer);
}

static dsgd_result dsgd__sn_sendrecv_reduce(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                            int src, uint64_t rtag, float *rbuf, size_t rcount, dsgd_reduce_op op,
                                            double deadline, int *failed_peer) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    if (dsgd__sn_check_peer(e, dst, failed_peer) != DSGD_OK || dsgd__sn_check_peer(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    if ((int)op < 0 || (int)op >= (int)DSGD_REDUCE_COUNT) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: unknown reduce op %d", e->rank, (int)op);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    return dsgd__sn_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcount * sizeof(float), (int)op, deadline,
                         failed_peer);
}

/* Receive from any source: the earliest arrival, ties by the lower rank. */
static dsgd_result dsgd__sn_probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    dsgd_simnet *h = e->hub;
    dsgd_result r;
    int k, best = -1;
    if (src) *src = -1;
    if (!src || !tag || !bytes) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: probe needs src, tag and bytes", e->rank);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if ((r = dsgd__sn_enter(e)) != DSGD_OK) return r;
    e->t_call = e->t;
    e->wait = DSGD__SN_W_PROBE;
    e->deadline = deadline;
    r = dsgd__sn_block(e);
    if (r == DSGD_OK) {
        double best_taken = DSGD__SN_INF;
        for (k = 0; k < e->nin; ++k) { /* the earliest, ties by the lower rank */
            const dsgd__sn_pair *p = &h->pairs[e->in[k]];
            int from = (int)(p->key / (uint64_t)h->n);
            double a = dsgd__sn_taken(e, p->head, from, NULL);
            if (a < best_taken || (a == best_taken && from < best)) {
                best_taken = a;
                best = from;
            }
        }
        DSGD_ASSERT(best >= 0);
        {
            const dsgd__sn_msg *m = dsgd__sn_head(h, best, e->rank);
            double in, taken = dsgd__sn_taken(e, m, best, &in), r0 = DSGD__MAX(e->t_call, in);
            *src = best;
            *tag = m->tag;
            *bytes = m->bytes;
            dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, e->t_call, r0, DSGD__SN_ANY, 0, 0);
            dsgd__sn_span_add(e, DSGD__SN_SP_RECEIVE, r0, taken, best, m->bytes, 0);
        }
    } else {
        dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, e->t_call, e->t, DSGD__SN_ANY, 0, r != DSGD_OK ? DSGD__SN_TIMEOUT_BIT : 0);
        if (r == DSGD_ERR_TIMEOUT) dsgd__sn_fail(e, r, "the deadline passed while waiting for a message from any rank");
    }
    return dsgd__sn_exit(e, r);
}

/* The endpoint's probe_from: a probe of src's messages alone that also
   ends when src is gone (killed, or left) with nothing left for e: at
   the later of the call and its death (or leave) plus the link's
   latency, *gone 1. */
static dsgd_result dsgd__sn_probe_from(void *impl, int src, double deadline, uint64_t *tag, size_t *bytes, int *gone) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    dsgd_simnet *h = e->hub;
    const dsgd__sn_msg *m;
    dsgd_result r;
    char why[96];
    if (gone) *gone = 0;
    if (!tag || !bytes || !gone || src < 0 || src >= h->n || src == e->rank) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: probe_from needs tag, bytes, gone and another rank (%d)",
                 e->rank, src);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if ((r = dsgd__sn_enter(e)) != DSGD_OK) return r;
    e->t_call = e->t;
    e->wait = DSGD__SN_W_FROM;
    e->src = src;
    e->deadline = deadline;
    r = dsgd__sn_block(e);
    m = r == DSGD_OK ? dsgd__sn_head(h, src, e->rank) : NULL;
    if (m) {
        double in, taken = dsgd__sn_taken(e, m, src, &in), r0 = DSGD__MAX(e->t_call, in);
        *tag = m->tag;
        *bytes = m->bytes;
        dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, e->t_call, r0, src, 0, 0);
        dsgd__sn_span_add(e, DSGD__SN_SP_RECEIVE, r0, taken, src, m->bytes, 0);
    } else {
        *gone = r == DSGD_OK;
        dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, e->t_call, e->t, src, 0, r != DSGD_OK ? DSGD__SN_TIMEOUT_BIT : 0);
        if (r == DSGD_ERR_TIMEOUT)
            dsgd__sn_fail(e, r, "the deadline passed while waiting for a message from rank %d%s", src,
                          dsgd__sn_why(e, src, why, sizeof(why)));
    }
    return dsgd__sn_exit(e, r);
}

/* The earliest STALL by time of e, not applied yet, that begins before
   `end` (ties: the first given); NULL: none. */
static dsgd__sn_fault *dsgd__sn_next_stall(dsgd__sn_ep *e, double end) {
    dsgd_simnet *h = e->hub;
    dsgd__sn_fault *best = NULL;
    int i;
    for (i = 0; i < h->d.num_faults; ++i) {
        dsgd__sn_fault *f = &h->faults[i];
        if (f->f.kind == DSGD_SIMNET_FAULT_STALL && f->f.rank == e->rank && f->f.step < 0 && !f->applied &&
            f->f.time < end && (!best || f->f.time < best->f.time))
            best = f;
    }
    return best;
}

/* A wait of `stall` + `seconds` of compute (kill and stall faults apply);
   step: the compute step + 1, 0 for an advance (the timeline's args). A
   STALL by time that begins inside freezes the rank from then on: during
   the compute, what is left of it resumes after the stall; during a stall,
   the freeze lasts until the later of the two ends. */
static dsgd_result dsgd__sn_charge(dsgd__sn_ep *e, double stall, double seconds, uint64_t step) {
    dsgd_result r;
    double t0, t_stall, left = seconds;
    dsgd__sn_fault *f;
    e->hub->stats.computes++;
    for (;;) {
        t0 = e->t;
        while ((f = dsgd__sn_next_stall(e, t0 + stall + left)) != NULL && f->f.time < t0 + stall) {
            f->applied = 1; /* inside the freeze */
            if (f->f.time + f->f.seconds > t0 + stall) stall = f->f.time + f->f.seconds - t0;
        }
        e->t_call = t0;
        e->wait = DSGD__SN_W_TIME;
        e->until = f ? f->f.time : t0 + stall + left; /* a stall inside the compute: up to it */
        e->deadline = DSGD__SN_INF;
        r = dsgd__sn_block(e);
        t_stall = DSGD__MIN(e->t, t0 + stall);
        dsgd__sn_span_add(e, DSGD__SN_SP_STALL, t0, t_stall, -1, 0, 0);
        dsgd__sn_span_add(e, DSGD__SN_SP_COMPUTE, t_stall, e->t, -1, step, 0);
        if (r != DSGD_OK || !f) break;
        left -= e->t - t_stall;
        stall = 0;
        dsgd__sn_stalls(e); /* f, from e->t: the rest of the compute follows */
    }
    return dsgd__sn_exit(e, r);
}

/* hub NULL or rank out of range: DSGD_ERR_INVALID_ARGUMENT, recorded nowhere
   (the hub's ctx belongs to another thread). */
static dsgd_result dsgd__sn_rank_check(dsgd_simnet *h, int rank) {
    return h && rank >= 0 && rank < h->n ? DSGD_OK : DSGD_ERR_INVALID_ARGUMENT;
}

DSGD_API dsgd_result dsgd_simnet_compute(dsgd_simnet *h, int rank, long step) {
    dsgd__sn_ep *e;
    dsgd_result r;
    double x, extra = 0;
    int i;
    if ((r = dsgd__sn_rank_check(h, rank)) != DSGD_OK) return r;
    e = &h->ep[rank];
    if (step < 0) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: compute step %ld < 0", rank, step);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if ((r = dsgd__sn_enter(e)) != DSGD_OK) return r;
    e->step = step;
    x = dsgd_simnet_compute_time(h, rank, step);
    for (i = 0; i < h->d.num_faults; ++i) {
        const dsgd_simnet_fault *f = &h->faults[i].f;
        if (f->rank != rank) continue;
        if (f->kind == DSGD_SIMNET_FAULT_KILL && f->step == step) {
            dsgd__sn_die(e, e->t);
            return dsgd__sn_exit(e, DSGD_ERR_ABORTED);
        }
        if (f->kind == DSGD_SIMNET_FAULT_STALL && f->step == step) extra += f->seconds;
        if (f->kind == DSGD_SIMNET_FAULT_SLOW && (f->step >= 0 ? step >= f->step : e->t >= f->time)) x *= f->factor;
    }
    return dsgd__sn_charge(e, extra, x, (uint64_t)step + 1);
}

DSGD_API dsgd_result dsgd_simnet_advance(dsgd_simnet *h, int rank, double seconds) {
    dsgd__sn_ep *e;
    dsgd_result r;
    if ((r = dsgd__sn_rank_check(h, rank)) != DSGD_OK) return r;
    e = &h->ep[rank];
    if (!dsgd__sn_finite_nonneg(seconds)) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: advance by %g s (need finite, >= 0)", rank, seconds);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if ((r = dsgd__sn_enter(e)) != DSGD_OK) return r;
    return dsgd__sn_charge(e, 0, seconds, 0);
}

/* dsgd_simnet_leave with the mutex held. */
static void dsgd__sn_leave(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    dsgd__sn_unhold(e);
    if (e->state == DSGD__SN_RUNNING || e->state == DSGD__SN_ARRIVING || e->state == DSGD__SN_PARKED ||
        e->state == DSGD__SN_SPARE) {
        if (e->state == DSGD__SN_PARKED) h->parked--;
        e->state = DSGD__SN_LEFT;
        dsgd__sn_sched(e);
        dsgd__sn_gone(e);
        if (h->turn == e->rank || h->turn < 0) dsgd__sn_pass(h);
    }
}

DSGD_API void dsgd_simnet_leave(dsgd_simnet *h, int rank) {
    if (!h || rank < 0 || rank >= h->n) return;
    pthread_mutex_lock(&h->mu);
    dsgd__sn_leave(&h->ep[rank]);
    pthread_mutex_unlock(&h->mu);
}

DSGD_API const char *dsgd_simnet_run_mode(void) {
    return DSGD__SN_FIBERS == 1 ? "fibers" : DSGD__SN_FIBERS == 2 ? "fibers (ucontext)" : "threads";
}

/* A rank of dsgd_simnet_run: its program, then leave; resumed with the
   mutex held (as a fiber), and ends by switching away for good. */
static void dsgd__sn_rank_main(void *arg) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)arg;
    dsgd_simnet *h = e->hub;
    dsgd_transport_i ep;
#if DSGD__SN_FIBERS
    if (h->fib) dsgd__sn_fiber_begin(h);
#endif
    if (h->fib) pthread_mutex_unlock(&h->mu);
    dsgd_simnet_endpoint(h, e->rank, &ep);
    h->fn(h, e->rank, &ep, h->user);
    pthread_mutex_lock(&h->mu);
    dsgd__sn_leave(e);
#if DSGD__SN_FIBERS
    if (h->fib) {
        h->fib[e->rank].done = 1;
        h->fibers_done++;
        /* the rank whose turn it is, or the caller of run (which also
           finishes the ranks of an aborted hub) */
        dsgd__sn_switch(h, e->rank, DSGD__LOAD_RLX(&h->aborted) ? -1 : h->turn);
        DSGD_ASSERT(0); /* a finished fiber is never resumed */
    }
#endif
    pthread_mutex_unlock(&h->mu);
}

#if !DSGD__SN_FIBERS
static void *dsgd__sn_rank_thread(void *arg) {
    dsgd__sn_rank_main(arg);
    return NULL;
}
#endif

#if DSGD__SN_FIBERS == 2
static void dsgd__sn_rank_uc(unsigned hi, unsigned lo) {
    dsgd__sn_rank_main((void *)(uintptr_t)(((uint64_t)hi << 32) | (uint64_t)lo));
}
#endif

#if !DSGD__SN_FIBERS
/* run with a thread per rank. */
static dsgd_result dsgd__sn_run_threads(dsgd_simnet *h) {
    pthread_t *th = (pthread_t *)dsgd__alloc(h->ctx, sizeof(pthread_t) * (size_t)h->n, "dsgd_simnet_run");
    pthread_attr_t attr;
    int i, started = 0, attr_ok;
    if (!th) return DSGD_ERR_OUT_OF_MEMORY;
    attr_ok = pthread_attr_init(&attr) == 0;
    if (attr_ok && h->d.fiber_stack_bytes) pthread_attr_setstacksize(&attr, h->d.fiber_stack_bytes);
    for (i = 0; i < h->n; ++i, ++started)
        if (pthread_create(&th[i], attr_ok ? &attr : NULL, dsgd__sn_rank_thread, &h->ep[i]) != 0) break;
    if (attr_ok) pthread_attr_destroy(&attr);
    if (started < h->n) dsgd_simnet_abort(h); /* the started ones end */
    for (i = 0; i < started; ++i) pthread_join(th[i], NULL);
    DSGD_FREE(th);
    if (started < h->n)
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_SYSTEM, "dsgd_simnet_run: cannot start the thread of rank %d of %d",
                                  started, h->n);
    return DSGD_OK;
}
#endif

#if DSGD__SN_FIBERS
/* Makes fiber i ready to start rank i on its stack; non-zero when it failed. */
static int dsgd__sn_fiber_init(dsgd_simnet *h, dsgd__sn_fiber *f, int i, size_t size) {
    *(uint64_t *)(void *)f->stack = DSGD__SN_CANARY;
#ifdef DSGD__SN_ASAN
    f->asan_bottom = f->stack;
    f->asan_size = size;
#endif
#ifdef DSGD__SN_TSAN
    if (!(f->tsan = __tsan_create_fiber(0))) return 1;
#endif
#if DSGD__SN_FIBERS == 1
    f->sp = dsgd__sn_stack_init(f->stack, size, dsgd__sn_rank_main, &h->ep[i]);
    return 0;
#else
    if (getcontext(&f->uc) != 0) return 1;
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = size;
    f->uc.uc_link = NULL;
    makecontext(&f->uc, (void (*)(void))dsgd__sn_rank_uc, 2, (unsigned)((uint64_t)(uintptr_t)&h->ep[i] >> 32),
                (unsigned)(uintptr_t)&h->ep[i]);
    return 0;
#endif
}

/* run with fibers on this thread. */
static dsgd_result dsgd__sn_run_fibers(dsgd_simnet *h) {
    const char *w = "dsgd_simnet_run";
    size_t size = h->d.fiber_stack_bytes ? h->d.fiber_stack_bytes : DSGD__SN_STACK_DEFAULT;
    dsgd__sn_fiber *fib;
    dsgd_result r = DSGD_OK;
    int i, next = 0;
    if (size < DSGD__SN_STACK_MIN) size = DSGD__SN_STACK_MIN;
    size = (size + 15) & ~(size_t)15;
    fib = (dsgd__sn_fiber *)dsgd__alloc(h->ctx, sizeof(dsgd__sn_fiber) * ((size_t)h->n + 1), w);
    if (!fib) return DSGD_ERR_OUT_OF_MEMORY;
    memset(fib, 0, sizeof(dsgd__sn_fiber) * ((size_t)h->n + 1));
    for (i = 0; i < h->n; ++i) {
        if (!(fib[i].stack = (unsigned char *)DSGD_MALLOC(size)) || dsgd__sn_fiber_init(h, &fib[i], i, size)) break;
    }
    if (i < h->n) {
        r = dsgd_ctx_set_error(h->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot make the stack of rank %d (%zu bytes)",
                               w, i, size);
    } else {
#ifdef DSGD__SN_TSAN
        fib[h->n].tsan = __tsan_get_current_fiber();
#endif
        pthread_mutex_lock(&h->mu);
        h->fib = fib;
        while (h->fibers_done < h->n) {
            int to = h->turn;
            if (to < 0 || DSGD__LOAD_RLX(&h->aborted)) {
                /* aborted: every rank left runs to its end, in rank order */
                if (!DSGD__LOAD_RLX(&h->aborted)) { /* nobody can run: cannot happen without parking */
                    DSGD__STORE_SC(&h->aborted, 1);
                    r = dsgd_ctx_set_error(h->ctx, DSGD_ERR_STATE, "%s: no rank can run", w);
                }
                while (fib[next].done) ++next;
                to = next;
            }
            dsgd__sn_switch(h, -1, to);
        }
        h->fib = NULL;
        pthread_mutex_unlock(&h->mu);
    }
    for (i = 0; i < h->n; ++i) {
#ifdef DSGD__SN_TSAN
        if (fib[i].tsan) __tsan_destroy_fiber(fib[i].tsan);
#endif
        DSGD_FREE(fib[i].stack);
    }
    DSGD_FREE(fib);
    return r;
}
#endif

DSGD_API dsgd_result dsgd_simnet_run(dsgd_simnet *h, dsgd_simnet_rank_fn fn, void *user) {
    const char *w = "dsgd_simnet_run";
    int bad;
    if (!h) return DSGD_ERR_INVALID_ARGUMENT;
    if (!fn) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: fn is NULL", w);
    if (h->d.park_between_calls)
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_UNSUPPORTED, "%s: the ranks cannot park between calls", w);
    pthread_mutex_lock(&h->mu);
    bad = h->used || h->ran;
    h->ran = 1;
    pthread_mutex_unlock(&h->mu);
    if (bad) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_STATE, "%s: the ranks have run already", w);
    h->fn = fn;
    h->user = user;
#if DSGD__SN_FIBERS
    return dsgd__sn_run_fibers(h);
#else
    return dsgd__sn_run_threads(h);
#endif
}

DSGD_API dsgd_result dsgd_simnet_park(dsgd_simnet *h, int rank) {
    dsgd__sn_ep *e;
    dsgd_result r = DSGD_OK;
    if (dsgd__sn_rank_check(h, rank) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    e = &h->ep[rank];
    if (h->d.half_duplex) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: cannot park with half_duplex", rank);
        return DSGD_ERR_UNSUPPORTED;
    }
    if (h->fib) {
        snprintf(e->err, sizeof(e->err), "simnet rank %d: cannot park a fiber of dsgd_simnet_run", rank);
        return DSGD_ERR_UNSUPPORTED;
    }
    pthread_mutex_lock(&h->mu);
    e->called = 1;
    if ((e->state == DSGD__SN_RUNNING || e->state == DSGD__SN_ARRIVING) && !DSGD__LOAD_RLX(&h->aborted))
        dsgd__sn_park(e);
    else if (e->state == DSGD__SN_LEFT || e->state == DSGD__SN_SPARE) r = DSGD_ERR_STATE;
    else if (e->state == DSGD__SN_DEAD || DSGD__LOAD_RLX(&h->aborted)) r = DSGD_ERR_ABORTED;
    pthread_mutex_unlock(&h->mu);
    return r;
}

DSGD_API dsgd_result dsgd_simnet_spare(dsgd_simnet *h, int rank) {
    const char *w = "dsgd_simnet_spare";
    dsgd__sn_ep *e;
    dsgd_result r = DSGD_OK;
    if (!h) return DSGD_ERR_INVALID_ARGUMENT;
    if (rank < 0 || rank >= h->n)
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: rank %d outside [0, %d)", w, rank, h->n);
    e = &h->ep[rank];
    pthread_mutex_lock(&h->mu);
    if (e->called || h->ran || (e->state != DSGD__SN_PARKED && e->state != DSGD__SN_ARRIVING)) {
        r = dsgd_ctx_set_error(h->ctx, DSGD_ERR_STATE, "%s: rank %d %s", w, rank,
                               e->state == DSGD__SN_SPARE ? "is a spare already"
                               : e->state == DSGD__SN_LEFT ? "left the simulation"
                               : h->ran ? "runs under dsgd_simnet_run" : "has called the hub already");
    } else {
        if (e->state == DSGD__SN_PARKED) h->parked--;
        e->state = DSGD__SN_SPARE;
        dsgd__sn_sched(e); /* out of the heap (ARRIVING) */
        if (h->turn == rank || h->turn < 0) dsgd__sn_pass(h); /* nobody waits for it now */
    }
    pthread_mutex_unlock(&h->mu);
    return r;
}

DSGD_API dsgd_result dsgd_simnet_admit(dsgd_simnet *h, int rank, double at) {
    const char *w = "dsgd_simnet_admit";
    dsgd__sn_ep *e;
    dsgd_result r = DSGD_OK;
    if (!h) return DSGD_ERR_INVALID_ARGUMENT;
    if (rank < 0 || rank >= h->n || !dsgd__sn_finite_nonneg(at))
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: rank %d of %d at %g s (need a rank of the "
                                  "hub and a finite time >= 0)", w, rank, h->n, at);
    e = &h->ep[rank];
    pthread_mutex_lock(&h->mu);
    if (e->state != DSGD__SN_SPARE) {
        r = dsgd_ctx_set_error(h->ctx, DSGD_ERR_STATE, "%s: rank %d is not a spare (dsgd_simnet_spare)", w, rank);
    } else {
        if (at > e->t) e->t = at;
        if (h->d.park_between_calls) { /* parked at its clock until its first call */
            e->state = DSGD__SN_PARKED;
            h->parked++;
        } else { /* arriving at its clock: it takes its turn then */
            e->state = DSGD__SN_ARRIVING;
            dsgd__sn_sched(e);
            if (h->turn < 0) dsgd__sn_pass(h);
        }
    }
    pthread_mutex_unlock(&h->mu);
    return r;
}

static void dsgd__sn_abort(void *impl) { dsgd_simnet_abort(((dsgd__sn_ep *)impl)->hub); }

static void dsgd__sn_leave_ep(void *impl) { dsgd_simnet_leave(((dsgd__sn_ep *)impl)->hub, ((dsgd__sn_ep *)impl)->rank); }

static double dsgd__sn_now(void *impl) { return ((dsgd__sn_ep *)impl)->t; }

static const char *dsgd__sn_error_message(void *impl) { return ((dsgd__sn_ep *)impl)->err; }

static void dsgd__sn_set_progress(void *impl, uint64_t seq) {
    DSGD__STORE_REL(&((dsgd__sn_ep *)impl)->progress, seq);
}

static uint64_t dsgd__sn_peer_progress(void *impl, int peer) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    if (peer < 0 || peer >= e->hub->n) return 0;
    return DSGD__LOAD_ACQ(&e->hub->ep[peer].progress);
}

/* floats times a cost per float on the rank's clock (0: no hand-off). */
static dsgd_result dsgd__sn_charge_floats(dsgd__sn_ep *e, size_t floats, double per_float) {
    double x = (double)floats * per_float;
    dsgd_result r;
    if (!(x > 0)) return DSGD_OK; /* free: no hand-off */
    if ((r = dsgd__sn_enter(e)) != DSGD_OK) return r;
    return dsgd__sn_charge(e, 0, x, 0);
}

static dsgd_result dsgd__sn_charge_apply(void *impl, size_t floats) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    return dsgd__sn_charge_floats(e, floats, e->hub->d.apply_s_per_float);
}

static dsgd_result dsgd__sn_charge_codec(void *impl, size_t floats) {
    dsgd__sn_ep *e = (dsgd__sn_ep *)impl;
    return dsgd__sn_charge_floats(e, floats, e->hub->d.codec_s_per_float);
}

DSGD_API dsgd_result dsgd_simnet_endpoint(dsgd_simnet *h, int rank, dsgd_transport_i *out) {
    if (!h) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_simnet_endpoint: out is NULL");
    memset(out, 0, sizeof(*out));
    if (rank < 0 || rank >= h->n)
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_simnet_endpoint: rank %d outside [0, %d)",
                                  rank, h->n);
    out->name = "simnet";
    out->impl = &h->ep[rank];
    out->rank = rank;
    out->size = h->n;
    out->destroy = NULL;
    out->send = dsgd__sn_send;
    out->recv = dsgd__sn_recv;
    out->sendrecv = dsgd__sn_sendrecv;
    out->sendrecv_reduce = dsgd__sn_sendrecv_reduce;
    out->share = NULL;
    out->unshare = NULL;
    out->allreduce = NULL;
    out->abort = dsgd__sn_abort;
    out->now = dsgd__sn_now;
    out->error_message = dsgd__sn_error_message;
    out->set_progress = dsgd__sn_set_progress;
    out->peer_progress = dsgd__sn_peer_progress;
    out->probe = dsgd__sn_probe;
    out->leave = dsgd__sn_leave_ep;
    out->charge_apply = dsgd__sn_charge_apply;
    out->charge_codec = dsgd__sn_charge_codec;
    out->probe_from = dsgd__sn_probe_from;
    return DSGD_OK;
}

/* >>simnet lanes (the strategies' step: Two lanes, above) ------------------ */

/* The hub behind t and its rank there (*rank), when t is one of the hub's
   endpoints as dsgd_simnet_endpoint filled it; NULL otherwise. */
DSGD__PRIVATE dsgd_simnet *dsgd__simnet_of(const dsgd_transport_i *t, int *rank) {
    const dsgd__sn_ep *e;
    if (!t || t->now != dsgd__sn_now || !t->impl) return NULL;
    e = (const dsgd__sn_ep *)t->impl;
    *rank = e->rank;
    return e->hub;
}

/* desc.backward_s[v]: the compute before the model reports variable v
   final (0 beyond the values given). */
DSGD__PRIVATE double dsgd__simnet_backward_s(const dsgd_simnet *h, int v) {
    return v >= 0 && v < h->d.num_backward_s ? h->backward_s[v] : 0.0;
}

#endif /* DSGD__PART_SIMNET_IMPL */
