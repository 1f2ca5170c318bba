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

     The simnet is three parts, in this order; every public function is
     declared here:
       simnet.h           (this one) the hub's state, the ready heap, the
                          pairs, creation, the getters, the compute model
       simnet_sched.h     the fibers, the scheduler, the timeline, stalls,
                          entering and leaving the hub
       simnet_endpoint.h  the transfers, the endpoint's operations and its
                          table, run, park, spare and admit, the lanes
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

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_SIMNET) && !defined(DSGD__PART_SIMNET_IMPL)
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

#endif /* DSGD__PART_SIMNET_IMPL */
