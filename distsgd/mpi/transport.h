/* distsgd/mpi/transport.h - the MPI transport: ranks as MPI processes
   Part of distsgd's MPI add-on (see ../../distsgd_mpi.h, which includes the parts in order).

   THE MPI TRANSPORT

     dsgd_mpi_transport_create fills this process's endpoint (a
     dsgd_transport_i) of a group whose ranks are the ranks of an MPI
     communicator (MPI_COMM_WORLD by default). Every rank of the communicator
     creates its endpoint, then a dsgd_comm over it, and the collectives and
     the parameter-server engine run unchanged. The endpoint works on its own
     duplicate of the communicator (MPI_Comm_dup, with MPI_ERRORS_RETURN set
     on the duplicate), so its messages never match the program's own, and an
     MPI error becomes a result code instead of ending the job.

     Members: send, recv, sendrecv (both halves progress together), the
     native allreduce (MPI's own all-reduce, in place: see THE NATIVE
     ALL-REDUCE), share, unshare and share_window when every rank is on one
     node (see SHARED MEMORY), probe (receive from any source), abort,
     error_message and destroy. DSGD_ALLREDUCE_AUTO runs DIRECT through the
     shared-memory windows when they are there (faster than MPI_Allreduce
     at every size measured), else the native
     hook; an explicit algorithm runs the library's, over point-to-point
     messages (or the windows, for DIRECT).

     dsgd_mpi_transport_create_local fills several endpoints per process,
     for multi-worker training with k local replicas (threads): with count
     endpoints in each of the P processes of the communicator, the group
     has count * P ranks and process p's endpoint j is rank p * count + j,
     each used by its own thread concurrently (MPI_THREAD_MULTIPLE). They
     share one duplicate communicator, freed by the last endpoint
     destroyed (destroy every one). Every process must pass the same count:
     creation compares them (one MPI_Allreduce on the duplicate) and fails
     on every process, naming a rank and both counts, never hangs. MPI's
     all-reduce spans processes, not endpoints, so with count > 1 there is
     no native allreduce (AUTO runs the library's algorithms), and no
     share/unshare either (the window is per process; not done); count = 1
     is dsgd_mpi_transport_create exactly.

     There is no sendrecv_reduce (the communicator receives into scratch and reduces,
     in the same order as over the loopback, so every explicit algorithm
     gives the same bits over MPI as over the loopback), no clock and no
     progress hooks.

   MESSAGES

     A message carries a 64-bit tag, but MPI tags are small (at least
     32767), and a rank that receives from any source (a parameter server)
     needs the whole tag before it takes the message. So each message goes as
     two MPI messages on the duplicate: a 16-byte header (the tag and the
     size, two uint64_t in the sender's byte order: the ranks must share one)
     under one fixed MPI tag, then the payload under another. MPI's
     non-overtaking rule keeps them paired. A receive posts its header and
     payload receives together when the payload fits one MPI message, so a
     small message costs one latency. The receiver checks the header against
     the tag and size it expects and returns DSGD_ERR_DESYNC at once on a
     mismatch ("mpi rank 1: the message from rank 0 has tag ..., expected
     ..."); the message stays to be received again when its payload had not
     arrived, else it is consumed (and buf may have been written). Payloads
     above DSGD_MPI_MAX_MESSAGE bytes (1 GiB unless defined otherwise before
     the include; the same on every rank) go in several MPI messages, and so
     do native all-reduces above that many bytes, MPI counts being ints.
     probe takes the header of the next message from any source
     (MPI_Improbe and MPI_Mrecv), keeps it for that source and reports the
     source, tag and size; the next recv from that source uses it.

     With count endpoints per process, a message from group rank g to group
     rank h goes to MPI process h / count, and the MPI tags name the pair of
     local indices (sl = g % count, dl = h % count): the header goes under
     1 + 2 * (sl * count + dl), the payload under the next tag, so the
     threads of one process never take each other's messages, and each
     ordered pair (g, h) keeps MPI's order. count = 1 uses tags 1 and 2, as
     dsgd_mpi_transport_create. The largest tag, 2 * count^2, must not
     exceed MPI_TAG_UB (at least 32767 by the standard; OpenMPI's is
     2^31 - 1), which creation checks. Two endpoints of one process talk
     through MPI too (messages to this process), with the same order and
     deadlines. probe on endpoint j looks only at the tags addressed to j,
     MPI_Improbe from any source once per source local index, starting
     round-robin from the one after the last found, and keeps the stash per
     group rank.

   SHARED MEMORY

     When every process of the communicator is on one node
     (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED gives them all, in the
     same order) and dsgd_mpi_desc.no_share is 0, creation allocates each
     rank a segment of an MPI-3 shared-memory window
     (MPI_Win_allocate_shared, opened once with MPI_Win_lock_all) and maps
     every rank's segment; the endpoint then has share, unshare and
     share_window, so DSGD_ALLREDUCE_DIRECT runs across processes. A
     segment is a few control words and the window proper, share_bytes
     (DSGD_MPI_SHARE_BYTES, 1 MiB, unless dsgd_mpi_desc says otherwise;
     equal on every rank, checked at creation): its size is fixed, so it
     never has to grow (which would be collective). The direct all-reduce
     goes through it a piece at a time (distsgd/collectives_algos.h): copy a
     piece of the buffer in, share (MPI_Win_sync, then publish the tag in
     this rank's control word and poll the others'), reduce this rank's
     block of the piece in rank order 0..N-1 from every window into every
     window, unshare (publish "done", poll the others'), copy the piece
     out. So its bits equal the loopback's DIRECT. The waits poll as
     below, against the caller's deadline, and name the rank waited for.
     On several nodes, or with no_share, share, unshare and share_window
     are NULL. destroy frees the window (MPI_Win_free, which waits for
     every rank of the node: destroy on every rank, as the communicator).

   NODES

     Creation also reads the node layout (MPI_Comm_split_type with
     MPI_COMM_TYPE_SHARED): when every node holds the same number P of
     processes, at consecutive ranks, the endpoints' ranks_per_node is P x
     count (count endpoints per process), so a communicator over them knows
     which ranks share a node and AUTO picks DSGD_ALLREDUCE_HIERARCHICAL
     when there are several (on one node, P x count is the group's size:
     one node). Any other layout gives 0 (one node assumed); a program may
     then map its processes so, or pass dsgd_comm_desc.ranks_per_node
     (dsgd_strategy_desc.ranks_per_node), which also fakes nodes on one
     machine for tests.

   THE NATIVE ALL-REDUCE

     OpenMPI 4.1's MPI_Iallreduce (libnbc) is 2-7x slower than its blocking
     MPI_Allreduce on one node, polled with MPI_Test or waited for. So when
     MPI provides MPI_THREAD_MULTIPLE (dsgd_mpi_init asks for it), the hook
     runs MPI_Allreduce on a helper thread of the endpoint, started at its
     first use and stopped by destroy, while the caller waits on a
     condition variable until it is done, the deadline passes or the
     endpoint is aborted (seen within 1 ms). Each call pays two thread
     wake-ups, 15-30 us on a 2-CPU machine: far behind MPI_Allreduce
     called directly below 256 KiB (it takes 1-20 us there), 0.8-0.95x
     of it at 1 MiB. Below MPI_THREAD_MULTIPLE the helper's MPI
     calls could overlap the program's, so the hook polls MPI_Iallreduce
     with MPI_Test instead. With dsgd_mpi_desc.blocking_allreduce = 1 the
     hook calls MPI_Allreduce on the caller's thread, at any thread level:
     MPI_Allreduce's time and bits, but no deadline and no abort: the call
     returns when every rank has joined (a rank that never comes hangs
     it, as MPI_Allreduce would). MEAN sums, then divides by the size; MAX
     and MIN use operations that propagate NaN and give the same bits in
     any order.

   WAITING AND DEADLINES

     MPI has no timeouts, so every call posts non-blocking operations and
     polls them (MPI_Test, MPI_Improbe) against the caller's absolute
     deadline on dsgd_now()'s clock: past it, DSGD_ERR_TIMEOUT, with
     error_message naming the rank waited for ("mpi rank 0: the deadline
     passed while waiting for rank 1"). A waiting rank polls; after 64
     fruitless polls it yields the CPU between polls (ranks may share
     cores). Once it has waited 400 us without progress, or sooner where
     a yield took over 50 us (another thread wanted the CPU: other ranks,
     or backward beside an overlapped exchange), it sleeps between polls
     instead, an eighth of the time waited so far (50 us to 1 ms): a wait
     then ends at most about an eighth later than its message came, and
     leaves the CPU to other work meanwhile.

   AFTER A FAILURE

     MPI cannot take back a send that a peer has not matched, nor any
     collective. When a call fails (a deadline, an abort, a mismatch), the
     endpoint cancels what it posted (MPI_Cancel; unmatched receives are
     withdrawn) and waits up to 10 ms for the rest to settle. When nothing
     is left pending and no message was half taken, the endpoint stays
     usable: a timed-out probe or recv that matched nothing costs nothing.
     Otherwise (a large send that no one received, a native all-reduce that
     some rank never joined: its helper thread stays inside MPI_Allreduce,
     and destroy then leaves the endpoint, the thread and the duplicate
     to the end of the job) the endpoint is failed: every later call
     returns DSGD_ERR_ABORTED saying that a transfer timed out and the job
     must end, and MPI may still read or write that call's buffer until the
     job ends. The way out is an error to the caller, then the end of the
     job: dsgd_mpi_abort (MPI_Abort on MPI_COMM_WORLD) stops every process,
     while MPI_Finalize could wait forever for the pending operations.
     After any failed transfer (a mismatch included), destroy leaves the
     duplicate communicator to MPI_Finalize instead of freeing it: a peer's
     message may still be on its way or unreceived, and MPICH hands a freed
     communicator's context to the next one created, where that message
     would be received as a new one (a probe after a mismatch would take
     it).
     The transport does not use ULFM (MPIX_Comm_revoke, MPIX_Comm_shrink),
     so the surviving ranks of a failed job do not go on; Debian 12's
     OpenMPI 4.1 and MPICH 4.0 do not provide it usably. Elastic training
     over MPI (distsgd/mpi/elastic.h) changes the group between steps
     instead: a planned leave, a grow by spawn, a relaunch after a crash,
     and a ULFM shrink where the MPI has one.

     A share or unshare that fails (its deadline, an abort, a peer that
     withdrew) withdraws this rank's window for good: it marks it in its
     control words, so that peers waiting on it return at once
     (DSGD_ERR_TIMEOUT naming the rank that never came when this rank
     timed out waiting for it, else DSGD_ERR_ABORTED naming this rank),
     and later share calls return DSGD_ERR_ABORTED. What is left: the
     window, which a late peer may still read and write (never the
     caller's buffer, which only the caller copies to and from), and which
     destroy then does not free (MPI_Win_free would wait for every rank);
     messages are not affected. End the job (dsgd_mpi_abort), or let it
     end: a job whose windows were withdrawn still finalises.

     abort is local to the process: it marks every endpoint of this process
     aborted (the one it was called on and, with
     dsgd_mpi_transport_create_local, its siblings), so their waits (in any
     thread) return DSGD_ERR_ABORTED within a poll, and later calls too. It
     cannot reach the other processes: they run into their deadlines, unless
     the program ends the job. A failed endpoint (above) is failed alone:
     its siblings' requests are their own.

   THREAD LEVELS

     An endpoint is used by one thread at a time (the transport contract),
     but not necessarily always the same thread (a strategy's replica
     thread), so by default it needs MPI_THREAD_SERIALIZED;
     dsgd_mpi_desc.thread_level says what the program needs (FUNNELED when
     only the thread that initialised MPI calls distsgd and MPI, MULTIPLE
     when several threads make MPI calls at once, e.g. several endpoints).
     dsgd_mpi_transport_create_local with count > 1 needs
     MPI_THREAD_MULTIPLE whatever thread_level says (its endpoints' threads
     call MPI at once) and refuses less with DSGD_ERR_UNSUPPORTED naming
     both levels, on every process when one provides less. dsgd_mpi_init
     asks MPI for MPI_THREAD_MULTIPLE; with it the native all-reduce runs
     on a helper thread unless blocking_allreduce is set (see THE NATIVE
     ALL-REDUCE). abort only sets a flag and calls no MPI function.

   THE PARTS

     The transport is two parts. This one declares it, documents it (the
     sections above, for both parts) and holds the endpoint's state and its
     point-to-point side: the messages (send, recv, sendrecv,
     sendrecv_upto) and probe. transport_collective.h, next, holds what the
     processes of the communicator do together: the native all-reduce and
     its helper thread, the shared-memory window (share, unshare,
     share_window), the node layout, and the table of members with its
     lifetime: creation (dsgd_mpi_transport_create,
     dsgd_mpi_transport_create_local), destroy, dsgd_mpi_init and
     dsgd_mpi_abort.
*/
#ifndef DSGD_MPI__PART_TRANSPORT_DECL
#define DSGD_MPI__PART_TRANSPORT_DECL

/* MPI's C++ bindings (dropped from the standard in MPI 3.0) are not used,
   and OpenMPI's warn under g++ -Wextra; a program that wants them includes
   <mpi.h> before this file. */
#ifdef __cplusplus
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#endif
#include <mpi.h>

/* The default size of each rank's shared-memory window (dsgd_mpi_desc.share_bytes). */
#ifndef DSGD_MPI_SHARE_BYTES
#define DSGD_MPI_SHARE_BYTES 1048576
#endif

/* Bytes of payload per MPI message (and of floats per native all-reduce): a
   multiple of 4 in [64, INT_MAX]; must be equal on every rank. */
#ifndef DSGD_MPI_MAX_MESSAGE
#define DSGD_MPI_MAX_MESSAGE 1073741824
#endif
#if DSGD_MPI_MAX_MESSAGE < 64 || DSGD_MPI_MAX_MESSAGE > 2147483647 || DSGD_MPI_MAX_MESSAGE % 4 != 0
#error "distsgd: DSGD_MPI_MAX_MESSAGE must be a multiple of 4 in [64, INT_MAX]"
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- MPI */

/* Initialises MPI with MPI_Init_thread asking for MPI_THREAD_MULTIPLE, or,
   when the program has already initialised MPI, accepts that. *provided
   (when not NULL) receives the thread level MPI provides (MPI_THREAD_SINGLE
   .. MPI_THREAD_MULTIPLE); dsgd_mpi_transport_create checks it against the
   level the program needs. argc and argv may be NULL. The program calls
   MPI_Finalize at the end, or dsgd_mpi_abort after a failure.
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing recorded),
   DSGD_ERR_STATE (MPI was finalized), DSGD_ERR_SYSTEM (MPI_Init_thread
   failed; MPI usually ends the job itself).
   Thread safety: once per process, on the thread that will be MPI's main
   thread, before any other MPI call. */
DSGD_API dsgd_result dsgd_mpi_init(dsgd_ctx *ctx, int *argc, char ***argv, int *provided);

typedef struct dsgd_mpi_desc {
    MPI_Comm comm;    /* the ranks of the group; 0 or MPI_COMM_NULL: MPI_COMM_WORLD.
                         The endpoint duplicates it: the program may use and free
                         its own while the endpoint lives */
    int thread_level; /* the thread level this program needs (MPI_THREAD_FUNNELED,
                         _SERIALIZED or _MULTIPLE); 0: MPI_THREAD_SERIALIZED */
    size_t share_bytes; /* each rank's shared-memory window (see SHARED MEMORY),
                           rounded up to 64 bytes, at least 4 KiB, at most
                           1 GiB; 0: DSGD_MPI_SHARE_BYTES (1 MiB). Must be equal
                           on every rank (checked at creation) */
    int no_share;     /* 1: no shared-memory window even when every rank is on
                         one node (share/unshare NULL). Must be equal on every
                         rank (checked at creation) */
    int blocking_allreduce; /* 1: the native all-reduce calls MPI_Allreduce on
                               the caller's thread, with no deadline and no
                               abort (see THE NATIVE ALL-REDUCE); 0: on a
                               helper thread, against the deadline */
} dsgd_mpi_desc;

/* Fills *out with this process's endpoint of the group desc->comm (desc
   may be NULL: MPI_COMM_WORLD, MPI_THREAD_SERIALIZED): rank and size are
   those of this process in comm, name "mpi". It duplicates comm
   (MPI_Comm_dup, which is collective: every rank of comm calls this, in the
   same order as its other collective calls on comm) and sets
   MPI_ERRORS_RETURN on the duplicate. out->destroy frees the endpoint and
   the duplicate (MPI_Comm_free, so call it on every rank, before
   MPI_Finalize); the owner calls it after the communicators over the
   endpoint are destroyed. It is dsgd_mpi_transport_create_local with
   count 1 (so creation also compares the counts of the processes). Set
   members: send, recv, sendrecv, sendrecv_upto, allreduce, abort,
   error_message, probe, destroy, ranks_per_node (see NODES), and share,
   unshare and share_window when every rank is on one node (see THE MPI
   TRANSPORT and SHARED MEMORY). Also collective over the node:
   MPI_Comm_split_type and,
   on one node, MPI_Win_allocate_shared.
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing recorded; out NULL;
   thread_level not a thread level; an intercommunicator),
   DSGD_ERR_STATE (MPI is not initialised, or was finalized: call
   dsgd_mpi_init first), DSGD_ERR_UNSUPPORTED (MPI provides a lower thread
   level than desc->thread_level; the message names both),
   DSGD_ERR_SYSTEM (MPI_Comm_dup, MPI_Op_create or
   MPI_Win_allocate_shared failed: no_share = 1 goes without the window),
   DSGD_ERR_INVALID_ARGUMENT also when processes pass different
   share_bytes or no_share (the message names a rank and both sizes, on
   every process), DSGD_ERR_OUT_OF_MEMORY. On failure *out is zeroed.
   Thread safety: a thread allowed to call MPI (see THREAD LEVELS); the
   endpoint is then used by one thread at a time, and its abort by any
   thread. */
DSGD_API dsgd_result dsgd_mpi_transport_create(dsgd_ctx *ctx, const dsgd_mpi_desc *desc,
                                               dsgd_transport_i *out);

/* Fills out[0..count-1] with this process's `count` endpoints of a group
   of count * P ranks, P the size of desc->comm (desc may be NULL, as for
   dsgd_mpi_transport_create): out[j] has rank p * count + j, p this
   process's rank in comm, size count * P, name "mpi". For multi-worker
   training with count local replicas (threads) per process, each using its
   own endpoint concurrently. count = 1 is dsgd_mpi_transport_create, the
   same messages bit for bit. Collective over comm like
   dsgd_mpi_transport_create (one call per process, from one thread, for
   all its endpoints): it duplicates comm once for all of them and compares
   the counts of the processes, so that a process passing another count
   fails on every process instead of hanging. Messages between two
   endpoints of one process go through MPI too (see MESSAGES). With
   count > 1 the endpoints have no native allreduce (MPI's all-reduce spans
   processes, not endpoints) and no share/unshare (the window is per
   process): DSGD_ALLREDUCE_AUTO runs the library's message-passing
   algorithms; and abort on any of them aborts every endpoint of this
   process (see AFTER A FAILURE). out[j].destroy must be called on every
   endpoint (before MPI_Finalize); the last one destroyed frees the
   duplicate.
   Errors: as dsgd_mpi_transport_create, and DSGD_ERR_INVALID_ARGUMENT
   (count < 1; processes passing different counts: the message names a rank
   whose count differs and both counts, on every process),
   DSGD_ERR_UNSUPPORTED (count > 1 and MPI provides less than
   MPI_THREAD_MULTIPLE on some process: the message names both levels;
   count above what MPI_TAG_UB allows, sqrt(MPI_TAG_UB / 2): 32767 on
   OpenMPI). On failure out[0..count-1] are zeroed.
   Thread safety: as dsgd_mpi_transport_create; then each endpoint is used
   by one thread at a time, the endpoints of a process concurrently, and
   abort by any thread. */
DSGD_API dsgd_result dsgd_mpi_transport_create_local(dsgd_ctx *ctx, const dsgd_mpi_desc *desc, int count,
                                                     dsgd_transport_i *out);

/* Ends the whole job: flushes stdio, then MPI_Abort(MPI_COMM_WORLD, code),
   which stops every process of the job, so that a rank whose transfer timed
   out (see AFTER A FAILURE) need not wait on a peer that will never come.
   code is the exit status asked for (0 counts as 1: the job failed). When
   MPI is not initialised (or finalized) it ends this process alone with
   _exit(code). It does not return.
   Errors: none (it does not return).
   Thread safety: any thread. */
DSGD_API void dsgd_mpi_abort(int code)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((noreturn))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* DSGD_MPI__PART_TRANSPORT_DECL */

#if defined(DISTSGD_MPI_IMPLEMENTATION) && !defined(DSGD_MPI__PART_TRANSPORT_IMPL)
#define DSGD_MPI__PART_TRANSPORT_IMPL

/* Allocation (DSGD_MALLOC, DSGD_FREE, dsgd__alloc), the atomics and the
   system headers are the core's (distsgd/base.h, distsgd/internal.h). */

/* >>mpi endpoint ----------------------------------------------------------- */

/* The MPI tags of the messages between the only endpoints of two processes
   (count 1); with count endpoints per process, the pair (source local index
   sl, destination local index dl) uses DSGD_MPI__TAG_HEADER + 2 * (sl *
   count + dl) and the payload tag one above it (see MESSAGES). */
enum { DSGD_MPI__TAG_HEADER = 1, DSGD_MPI__TAG_PAYLOAD = 2 };
/* Whether a receive posts its payload beside its header. MPICH ends the job
   on a truncated receive (a payload larger than expected) even with
   MPI_ERRORS_RETURN, so there the payload is posted once the header has
   been checked: one latency more per small message, and a size mismatch
   stays DSGD_ERR_DESYNC. */
#ifdef MPICH_VERSION
#define DSGD_MPI__EAGER_PAYLOAD 0
#else
#define DSGD_MPI__EAGER_PAYLOAD 1
#endif
#define DSGD_MPI__GRACE_S 0.01      /* how long a failed call waits for cancelled requests */
#define DSGD_MPI__YIELD_S 400e-6     /* fruitless polls yield for this long, then sleep */
#define DSGD_MPI__YIELD_BUSY_S 50e-6 /* a yield this long: another thread wanted the CPU */
#define DSGD_MPI__SLEEP_MIN_S 50e-6  /* a sleep between polls: an eighth of the time waited, */
#define DSGD_MPI__SLEEP_MAX_S 1e-3   /* within these bounds */

/* A request's state, as far as the endpoint knows. */
enum { DSGD_MPI__IDLE = 0, DSGD_MPI__PENDING, DSGD_MPI__DONE, DSGD_MPI__CANCELLED };

/* What the endpoints of one process share (one for dsgd_mpi_transport_create,
   one for all `count` of dsgd_mpi_transport_create_local): freed by the
   last endpoint destroyed. */
typedef struct dsgd_mpi__shared {
    MPI_Comm comm; /* the duplicate */
    MPI_Op op_max, op_min;
    int aborted;   /* atomic: abort was called on an endpoint of this process */
    int refs;      /* atomic: endpoints not yet destroyed */
    /* the shared-memory window (count 1, every rank on one node; else
       win is MPI_WIN_NULL): rank k's segment is seg[k] as mapped here,
       DSGD_MPI__SEG_HEAD bytes of control words, then win_bytes of window */
    MPI_Comm node;
    MPI_Win win;
    char **seg;
    int node_size; /* segments in seg */
    size_t win_bytes;
    int gone; /* this rank withdrew its window after a failure */
    int provided; /* MPI's thread level */
    int blocking; /* desc->blocking_allreduce: the native all-reduce on the caller's thread */
    int stale;    /* atomic: a transfer failed, messages may be left on comm (not freed) */
} dsgd_mpi__shared;

/* The native all-reduce's helper thread (see THE NATIVE ALL-REDUCE): one
   job at a time, under mu. */
enum { DSGD_MPI__JOB_IDLE = 0, DSGD_MPI__JOB_POSTED, DSGD_MPI__JOB_RUNNING, DSGD_MPI__JOB_DONE,
       DSGD_MPI__JOB_QUIT };
typedef struct dsgd_mpi__helper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int monotonic; /* done waits on CLOCK_MONOTONIC */
    int state;
    MPI_Comm comm;
    MPI_Op op;
    float *buf;
    int len, rc;
} dsgd_mpi__helper;

typedef struct dsgd_mpi__ep {
    dsgd_ctx *ctx;
    dsgd_mpi__shared *sh;
    MPI_Comm comm; /* sh->comm */
    int rank, size; /* in the group: proc * count + local, procs * count */
    int count;      /* endpoints per process; group rank g lives in MPI process g / count */
    int local;      /* this endpoint's index in its process, rank % count */
    int failed;     /* requests that MPI cannot take back are pending */
    int probe_next;
    int probe_src_local; /* probe's next source local index to look at first (round-robin) */
    /* Header buffers live here, not on a call's stack: after a failure MPI
       may still touch what a pending request points to. */
    uint64_t send_header[2], recv_header[2], probe_header[2];
    uint64_t *stash;         /* 2 per source: the header probe took, tag and bytes */
    unsigned char *stashed;  /* per source: stash holds a header */
    MPI_Request *orphans;    /* requests left pending by failed calls */
    size_t num_orphans, cap_orphans;
    dsgd_mpi__helper *helper; /* the native all-reduce's thread, once started */
    char err[384];
} dsgd_mpi__ep;

/* Routing: group rank g lives in MPI process g / count; the header's MPI
   tag for a message from group rank src to group rank dst (the payload's is
   one more). count 1: process g, tags 1 and 2, as ever. */
static int dsgd_mpi__proc(const dsgd_mpi__ep *e, int g) { return g / e->count; }

static int dsgd_mpi__header_tag(const dsgd_mpi__ep *e, int src, int dst) {
    return DSGD_MPI__TAG_HEADER + 2 * ((src % e->count) * e->count + dst % e->count);
}

/* MPI's text for an error code. */
static const char *dsgd_mpi__error_text(int code, char *buf, size_t cap) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) len = 0;
    if (len < 0) len = 0;
    if (len >= MPI_MAX_ERROR_STRING) len = MPI_MAX_ERROR_STRING - 1;
    text[len] = '\0';
    snprintf(buf, cap, "%s (MPI error %d)", len ? text : "unknown error", code);
    return buf;
}

/* Keeps a request that a failed call leaves pending: it is never freed
   (MPI forbids freeing a pending collective's request), only remembered. */
static void dsgd_mpi__orphan(dsgd_mpi__ep *e, MPI_Request req) {
    if (e->num_orphans == e->cap_orphans) {
        size_t cap = e->cap_orphans ? 2 * e->cap_orphans : 8;
        MPI_Request *p = (MPI_Request *)DSGD_REALLOC(e->orphans, cap * sizeof(MPI_Request));
        if (!p) return; /* the request is leaked, which MPI tolerates */
        e->orphans = p;
        e->cap_orphans = cap;
    }
    e->orphans[e->num_orphans++] = req;
}

/* DSGD_OK when the endpoint may transfer; else DSGD_ERR_ABORTED with the
   reason in e->err. */
static dsgd_result dsgd_mpi__usable(dsgd_mpi__ep *e) {
    if (DSGD__LOAD_ACQ(&e->sh->aborted)) {
        snprintf(e->err, sizeof(e->err), "mpi rank %d: the endpoint was aborted (%s)", e->rank,
                 e->count == 1 ? "its abort member was called" : "abort was called on an endpoint of this process");
        return DSGD_ERR_ABORTED;
    }
    if (e->failed) {
        snprintf(e->err, sizeof(e->err),
                 "mpi rank %d: an earlier transfer timed out or failed and left MPI operations that cannot be "
                 "cancelled; this endpoint cannot be used again: end the job (dsgd_mpi_abort)",
                 e->rank);
        return DSGD_ERR_ABORTED;
    }
    return DSGD_OK;
}

/* Records an MPI failure (the state of the messages is unknown, so the
   endpoint is failed). */
static dsgd_result dsgd_mpi__mpi_error(dsgd_mpi__ep *e, const char *call, int peer, int code) {
    char text[256]; /* MPI's text cut to fit e->err (MPICH's may be 512 bytes) */
    dsgd_mpi__error_text(code, text, sizeof(text));
    e->failed = 1;
    if (peer >= 0)
        snprintf(e->err, sizeof(e->err), "mpi rank %d: %s with rank %d failed: %s", e->rank, call, peer, text);
    else
        snprintf(e->err, sizeof(e->err), "mpi rank %d: %s failed: %s", e->rank, call, text);
    return DSGD_ERR_ABORTED;
}

/* Waiting between fruitless polls (see WAITING AND DEADLINES). */
typedef struct dsgd_mpi__wait {
    int idle;          /* fruitless polls in a row */
    int contended;     /* a yield gave the CPU away: sleep between polls */
    double idle_since; /* when the last progress was made */
} dsgd_mpi__wait;

static void dsgd_mpi__backoff(dsgd_mpi__wait *w, int progressed) {
    double t0, waited;
    struct timespec ts;
    if (progressed) {
        w->idle = 0;
        return;
    }
    if (w->idle++ == 0) w->idle_since = dsgd_now();
    if (w->idle < 64) return;
    t0 = dsgd_now();
    waited = t0 - w->idle_since;
    if (!w->contended && waited < DSGD_MPI__YIELD_S) {
        sched_yield();
        w->contended = dsgd_now() - t0 > DSGD_MPI__YIELD_BUSY_S;
        if (!w->contended) return;
    }
    waited /= 8;
    if (waited < DSGD_MPI__SLEEP_MIN_S) waited = DSGD_MPI__SLEEP_MIN_S;
    if (waited > DSGD_MPI__SLEEP_MAX_S) waited = DSGD_MPI__SLEEP_MAX_S;
    ts.tv_sec = 0;
    ts.tv_nsec = (long)(waited * 1e9);
    nanosleep(&ts, NULL);
}

/* Tests a PENDING request: *st becomes DONE or CANCELLED when it has
   completed, *count (when not NULL) the bytes it received. Returns MPI's
   code; a request that completed with an error counts as DONE. */
static int dsgd_mpi__test(MPI_Request *req, int *st, int *count) {
    MPI_Status status;
    int flag = 0, cancelled = 0, rc;
    rc = MPI_Test(req, &flag, &status);
    if (rc != MPI_SUCCESS) {
        *st = DSGD_MPI__DONE;
        *req = MPI_REQUEST_NULL;
        if (count) *count = -1;
        return rc;
    }
    if (!flag) return MPI_SUCCESS;
    MPI_Test_cancelled(&status, &cancelled);
    *st = cancelled ? DSGD_MPI__CANCELLED : DSGD_MPI__DONE;
    if (count) {
        *count = -1;
        if (!cancelled && MPI_Get_count(&status, MPI_BYTE, count) != MPI_SUCCESS) *count = -1;
    }
    return MPI_SUCCESS;
}

/* >>mpi transfer ----------------------------------------------------------- */
/* One transfer sends at most one message (header, then the payload in
   chunks of DSGD_MPI_MAX_MESSAGE bytes, one posted at a time) and receives
   at most one (the header from the stash or the wire, then the payload).
   Every request is polled by dsgd_mpi__xfer until both halves are done, the
   deadline passes, the endpoint is aborted or the header disagrees; then
   dsgd_mpi__settle cancels what is left and decides whether the endpoint
   is still usable. */

typedef struct dsgd_mpi__xfer {
    dsgd_mpi__ep *e;
    /* send half (dst < 0: none) */
    int dst, dst_proc, dst_tag; /* group rank; its MPI process; the header's MPI tag */
    const char *sbuf;
    size_t sbytes, schunks, snext; /* chunks in all; the next chunk to post */
    MPI_Request sh, sd;            /* header, current chunk */
    int sh_st, sd_st;
    /* receive half (src < 0: none) */
    int src, src_proc, src_tag;
    uint64_t rtag;
    char *rbuf;
    size_t rbytes, rchunks, rnext;
    MPI_Request rh, rd;
    int rh_st, rd_st;
    size_t *got;    /* NULL, or (sendrecv_upto) rbytes is a capacity and the size received goes here */
    int from_stash; /* the header came from the stash */
    int header_ok;  /* the header is known and matches */
    int rd_count;   /* bytes the current chunk received (-1: unknown) */
    int blame;
} dsgd_mpi__xfer;

static size_t dsgd_mpi__chunks(size_t bytes) {
    return bytes == 0 ? 1 : (bytes - 1) / (size_t)DSGD_MPI_MAX_MESSAGE + 1;
}

static int dsgd_mpi__chunk_len(size_t bytes, size_t i) {
    size_t off = i * (size_t)DSGD_MPI_MAX_MESSAGE, left = bytes > off ? bytes - off : 0;
    return (int)DSGD__MIN(left, (size_t)DSGD_MPI_MAX_MESSAGE);
}

static dsgd_result dsgd_mpi__post_send_chunk(dsgd_mpi__xfer *x) {
    const char *p = x->sbytes ? x->sbuf + x->snext * (size_t)DSGD_MPI_MAX_MESSAGE : x->sbuf;
    int rc = MPI_Isend(p, dsgd_mpi__chunk_len(x->sbytes, x->snext), MPI_BYTE, x->dst_proc,
                       x->dst_tag + (DSGD_MPI__TAG_PAYLOAD - DSGD_MPI__TAG_HEADER), x->e->comm, &x->sd);
    if (rc != MPI_SUCCESS) {
        x->blame = x->dst;
        return dsgd_mpi__mpi_error(x->e, "MPI_Isend", x->dst, rc);
    }
    x->sd_st = DSGD_MPI__PENDING;
    x->snext++;
    return DSGD_OK;
}

static dsgd_result dsgd_mpi__post_recv_chunk(dsgd_mpi__xfer *x) {
    char *p = x->rbytes ? x->rbuf + x->rnext * (size_t)DSGD_MPI_MAX_MESSAGE : x->rbuf;
    int rc = MPI_Irecv(p, dsgd_mpi__chunk_len(x->rbytes, x->rnext), MPI_BYTE, x->src_proc,
                       x->src_tag + (DSGD_MPI__TAG_PAYLOAD - DSGD_MPI__TAG_HEADER), x->e->comm, &x->rd);
    if (rc != MPI_SUCCESS) {
        x->blame = x->src;
        return dsgd_mpi__mpi_error(x->e, "MPI_Irecv", x->src, rc);
    }
    x->rd_st = DSGD_MPI__PENDING;
    x->rd_count = -1;
    x->rnext++;
    return DSGD_OK;
}

/* The send half's first step: the header, and the first chunk with it. */
static dsgd_result dsgd_mpi__start_send(dsgd_mpi__xfer *x, uint64_t tag) {
    dsgd_mpi__ep *e = x->e;
    int rc;
    e->send_header[0] = tag;
    e->send_header[1] = (uint64_t)x->sbytes;
    rc = MPI_Isend(e->send_header, (int)sizeof(e->send_header), MPI_BYTE, x->dst_proc, x->dst_tag, e->comm,
                   &x->sh);
    if (rc != MPI_SUCCESS) {
        x->blame = x->dst;
        return dsgd_mpi__mpi_error(e, "MPI_Isend", x->dst, rc);
    }
    x->sh_st = DSGD_MPI__PENDING;
    return dsgd_mpi__post_send_chunk(x);
}

/* DSGD_ERR_DESYNC when the header (tag, bytes) is not the expected one. */
static dsgd_result dsgd_mpi__check_header(dsgd_mpi__xfer *x, uint64_t tag, uint64_t bytes) {
    dsgd_mpi__ep *e = x->e;
    if (tag == x->rtag && x->got && bytes <= (uint64_t)x->rbytes) { /* a capacity: the message's own size */
        x->rbytes = (size_t)bytes;
        x->rchunks = dsgd_mpi__chunks(x->rbytes);
        *x->got = x->rbytes;
        return DSGD_OK;
    }
    if (tag == x->rtag && bytes == (uint64_t)x->rbytes) return DSGD_OK;
    x->blame = x->src;
    if (tag != x->rtag)
        snprintf(e->err, sizeof(e->err),
                 "mpi rank %d: the message from rank %d has tag %016llx, expected %016llx (ranks out of step?)",
                 e->rank, x->src, (unsigned long long)tag, (unsigned long long)x->rtag);
    else
        snprintf(e->err, sizeof(e->err),
                 "mpi rank %d: the message from rank %d has %llu bytes, expected %s%zu (different counts on "
                 "different ranks?)",
                 e->rank, x->src, (unsigned long long)bytes, x->got ? "at most " : "", x->rbytes);
    return DSGD_ERR_DESYNC;
}

/* The receive half's first step: the stashed header (checked at once, and
   left in the stash on a mismatch), else the header's receive, with the
   payload's when it is one MPI message. */
static dsgd_result dsgd_mpi__start_recv(dsgd_mpi__xfer *x) {
    dsgd_mpi__ep *e = x->e;
    int rc;
    x->rchunks = dsgd_mpi__chunks(x->rbytes);
    if (e->stashed[x->src]) {
        dsgd_result r = dsgd_mpi__check_header(x, e->stash[2 * x->src], e->stash[2 * x->src + 1]);
        if (r != DSGD_OK) return r;
        e->stashed[x->src] = 0;
        x->from_stash = 1;
        x->header_ok = 1;
        return dsgd_mpi__post_recv_chunk(x);
    }
    rc = MPI_Irecv(e->recv_header, (int)sizeof(e->recv_header), MPI_BYTE, x->src_proc, x->src_tag, e->comm,
                   &x->rh);
    if (rc != MPI_SUCCESS) {
        x->blame = x->src;
        return dsgd_mpi__mpi_error(e, "MPI_Irecv", x->src, rc);
    }
    x->rh_st = DSGD_MPI__PENDING;
    return x->rchunks == 1 && DSGD_MPI__EAGER_PAYLOAD ? dsgd_mpi__post_recv_chunk(x) : DSGD_OK;
}

static int dsgd_mpi__send_done(const dsgd_mpi__xfer *x) {
    return x->dst < 0 || (x->sh_st == DSGD_MPI__DONE && x->sd_st == DSGD_MPI__DONE && x->snext == x->schunks);
}

static int dsgd_mpi__recv_done(const dsgd_mpi__xfer *x) {
    return x->src < 0 || (x->header_ok && x->rd_st == DSGD_MPI__DONE && x->rnext == x->rchunks);
}

static dsgd_result dsgd_mpi__send_step(dsgd_mpi__xfer *x, int *progressed) {
    int rc;
    if (x->sh_st == DSGD_MPI__PENDING) {
        rc = dsgd_mpi__test(&x->sh, &x->sh_st, NULL);
        if (rc != MPI_SUCCESS) {
            x->blame = x->dst;
            return dsgd_mpi__mpi_error(x->e, "a header send", x->dst, rc);
        }
        if (x->sh_st != DSGD_MPI__PENDING) *progressed = 1;
    }
    if (x->sd_st == DSGD_MPI__PENDING) {
        rc = dsgd_mpi__test(&x->sd, &x->sd_st, NULL);
        if (rc != MPI_SUCCESS) {
            x->blame = x->dst;
            return dsgd_mpi__mpi_error(x->e, "a payload send", x->dst, rc);
        }
        if (x->sd_st != DSGD_MPI__PENDING) {
            *progressed = 1;
            if (x->snext < x->schunks) return dsgd_mpi__post_send_chunk(x);
        }
    }
    return DSGD_OK;
}

/* The bytes received in chunk rnext - 1 must be its length. */
static dsgd_result dsgd_mpi__check_chunk(dsgd_mpi__xfer *x) {
    int want = dsgd_mpi__chunk_len(x->rbytes, x->rnext - 1);
    if (x->rd_count == want) return DSGD_OK;
    x->blame = x->src;
    snprintf(x->e->err, sizeof(x->e->err),
             "mpi rank %d: a part of the message from rank %d has %d bytes, expected %d (is DSGD_MPI_MAX_MESSAGE "
             "the same on every rank?)",
             x->e->rank, x->src, x->rd_count, want);
    return DSGD_ERR_DESYNC;
}

static dsgd_result dsgd_mpi__recv_step(dsgd_mpi__xfer *x, int *progressed) {
    dsgd_result r;
    int rc;
    if (x->rh_st == DSGD_MPI__PENDING) {
        rc = dsgd_mpi__test(&x->rh, &x->rh_st, NULL);
        if (rc != MPI_SUCCESS) {
            x->blame = x->src;
            return dsgd_mpi__mpi_error(x->e, "a header receive", x->src, rc);
        }
        if (x->rh_st == DSGD_MPI__DONE) {
            *progressed = 1;
            r = dsgd_mpi__check_header(x, x->e->recv_header[0], x->e->recv_header[1]);
            if (r != DSGD_OK) return r;
            x->header_ok = 1;
            if (x->rd_st == DSGD_MPI__IDLE) {
                r = dsgd_mpi__post_recv_chunk(x);
                if (r != DSGD_OK) return r;
            } else if (x->rd_st == DSGD_MPI__DONE && (r = dsgd_mpi__check_chunk(x)) != DSGD_OK) {
                return r; /* the pre-posted payload came first */
            }
        }
    }
    if (x->rd_st == DSGD_MPI__PENDING) {
        rc = dsgd_mpi__test(&x->rd, &x->rd_st, &x->rd_count);
        if (x->rd_st == DSGD_MPI__PENDING) return DSGD_OK;
        *progressed = 1;
        if (rc != MPI_SUCCESS && !x->header_ok) return DSGD_OK; /* judged with the header */
        if (rc != MPI_SUCCESS) {
            x->blame = x->src;
            return dsgd_mpi__mpi_error(x->e, "a payload receive", x->src, rc);
        }
        if (x->header_ok) {
            if ((r = dsgd_mpi__check_chunk(x)) != DSGD_OK) return r;
            if (x->rnext < x->rchunks) return dsgd_mpi__post_recv_chunk(x);
        }
    }
    return DSGD_OK;
}

/* After a failure: cancels the pending requests, polls them for up to
   DSGD_MPI__GRACE_S, then keeps the message streams consistent (a header
   whose payload was not taken goes back to the stash) or, when it cannot
   (something still pending, a message half sent or half taken), marks the
   endpoint failed and keeps the pending requests. */
static void dsgd_mpi__settle(dsgd_mpi__xfer *x) {
    dsgd_mpi__ep *e = x->e;
    MPI_Request *reqs[4];
    int *sts[4];
    double until;
    int i, pending, ok = 1;
    reqs[0] = &x->sh; sts[0] = &x->sh_st;
    reqs[1] = &x->sd; sts[1] = &x->sd_st;
    reqs[2] = &x->rh; sts[2] = &x->rh_st;
    reqs[3] = &x->rd; sts[3] = &x->rd_st;
    for (i = 0; i < 4; ++i)
        if (*sts[i] == DSGD_MPI__PENDING) MPI_Cancel(reqs[i]);
    until = dsgd_now() + DSGD_MPI__GRACE_S;
    for (;;) {
        pending = 0;
        for (i = 0; i < 4; ++i) {
            if (*sts[i] != DSGD_MPI__PENDING) continue;
            dsgd_mpi__test(reqs[i], sts[i], i == 3 ? &x->rd_count : NULL);
            pending += *sts[i] == DSGD_MPI__PENDING;
        }
        if (!pending || dsgd_now() >= until) break;
        sched_yield();
    }
    for (i = 0; i < 4; ++i) {
        if (*sts[i] != DSGD_MPI__PENDING) continue;
        dsgd_mpi__orphan(e, *reqs[i]);
        ok = 0;
    }
    if (ok && x->dst >= 0 && !dsgd_mpi__send_done(x)) {
        /* nothing may have gone out (the header and the first chunk withdrawn) */
        ok = x->sh_st == DSGD_MPI__CANCELLED && x->sd_st == DSGD_MPI__CANCELLED && x->snext == 1;
    }
    if (ok && x->src >= 0 && !dsgd_mpi__recv_done(x)) {
        int header_taken = x->from_stash || x->rh_st == DSGD_MPI__DONE;
        int payload_untouched = x->rd_st == DSGD_MPI__IDLE || (x->rd_st == DSGD_MPI__CANCELLED && x->rnext == 1);
        if (!payload_untouched) {
            /* a mismatched header whose payload arrived anyway: that message is
               consumed, and the stream stays in step */
            ok = header_taken && !x->header_ok && x->rd_st == DSGD_MPI__DONE && x->rnext == 1;
        } else if (header_taken) {
            /* the message stays: its header goes back to the stash */
            const uint64_t *h = x->from_stash ? NULL : e->recv_header;
            if (h) {
                e->stash[2 * x->src] = h[0];
                e->stash[2 * x->src + 1] = h[1];
            }
            e->stashed[x->src] = 1;
        }
        /* else: nothing of the message was taken */
    }
    if (!ok) {
        size_t used = strlen(e->err);
        e->failed = 1;
        snprintf(e->err + used, sizeof(e->err) - used,
                 "; MPI cannot cancel what is pending, so this endpoint cannot be used again: end the job "
                 "(dsgd_mpi_abort)");
    }
}

/* The one transfer routine: sends to dst (>= 0) and receives from src (>=
   0), polling both halves until done, the deadline, an abort or an error.
   dst and src are -1 or other ranks (the callers check). */
static dsgd_result dsgd_mpi__xfer_run(dsgd_mpi__ep *e, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                      int src, uint64_t rtag, void *rbuf, size_t rbytes, size_t *got, double deadline,
                                      int *failed_peer) {
    dsgd_mpi__xfer x;
    dsgd_mpi__wait w;
    dsgd_result r;
    memset(&x, 0, sizeof(x));
    memset(&w, 0, sizeof(w));
    x.e = e;
    x.dst = dst; x.sbuf = (const char *)sbuf; x.sbytes = sbytes; x.schunks = dsgd_mpi__chunks(sbytes);
    x.src = src; x.rtag = rtag; x.rbuf = (char *)rbuf; x.rbytes = rbytes; x.got = got;
    if (dst >= 0) { x.dst_proc = dsgd_mpi__proc(e, dst); x.dst_tag = dsgd_mpi__header_tag(e, e->rank, dst); }
    if (src >= 0) { x.src_proc = dsgd_mpi__proc(e, src); x.src_tag = dsgd_mpi__header_tag(e, src, e->rank); }
    x.sh = x.sd = x.rh = x.rd = MPI_REQUEST_NULL;
    x.rd_count = -1;
    x.blame = src >= 0 ? src : dst;
    if (failed_peer) *failed_peer = -1;
    r = dsgd_mpi__usable(e);
    if (r == DSGD_OK && dst >= 0) r = dsgd_mpi__start_send(&x, stag);
    if (r == DSGD_OK && src >= 0) r = dsgd_mpi__start_recv(&x);
    while (r == DSGD_OK) {
        int progressed = 0;
        if (x.dst >= 0 && (r = dsgd_mpi__send_step(&x, &progressed)) != DSGD_OK) break;
        if (x.src >= 0 && (r = dsgd_mpi__recv_step(&x, &progressed)) != DSGD_OK) break;
        if (dsgd_mpi__send_done(&x) && dsgd_mpi__recv_done(&x)) return DSGD_OK;
        x.blame = !dsgd_mpi__recv_done(&x) ? x.src : x.dst;
        if (DSGD__LOAD_ACQ(&e->sh->aborted)) {
            r = DSGD_ERR_ABORTED;
            snprintf(e->err, sizeof(e->err), "mpi rank %d: the endpoint was aborted while waiting for rank %d",
                     e->rank, x.blame);
            break;
        }
        if (dsgd_now() >= deadline) {
            r = DSGD_ERR_TIMEOUT;
            snprintf(e->err, sizeof(e->err), "mpi rank %d: the deadline passed while waiting for rank %d", e->rank,
                     x.blame);
            break;
        }
        dsgd_mpi__backoff(&w, progressed);
    }
    dsgd_mpi__settle(&x);
    if (failed_peer) *failed_peer = x.blame;
    if (r != DSGD_OK) DSGD__STORE_SC(&e->sh->stale, 1);
    return r;
}

/* peer: -1 (no such half; allowed when may_skip) or another rank. */
static dsgd_result dsgd_mpi__check_peer(dsgd_mpi__ep *e, int peer, int may_skip, int *failed_peer) {
    if ((peer == -1 && may_skip) || (peer >= 0 && peer < e->size && peer != e->rank)) return DSGD_OK;
    if (failed_peer) *failed_peer = peer;
    snprintf(e->err, sizeof(e->err), "mpi rank %d: invalid peer rank %d (group of %d)", e->rank, peer, e->size);
    return DSGD_ERR_INVALID_ARGUMENT;
}

static dsgd_result dsgd_mpi__send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes,
                                  double deadline) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    if (dsgd_mpi__check_peer(e, dst, 0, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd_mpi__xfer_run(e, dst, tag, buf, bytes, -1, 0, NULL, 0, NULL, deadline, NULL);
}

static dsgd_result dsgd_mpi__recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes,
                                  double deadline) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    if (dsgd_mpi__check_peer(e, src, 0, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd_mpi__xfer_run(e, -1, 0, NULL, 0, src, tag, buf, bytes, NULL, deadline, NULL);
}

static dsgd_result dsgd_mpi__sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                      int src, uint64_t rtag, void *rbuf, size_t rbytes, double deadline,
                                      int *failed_peer) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    if (dsgd_mpi__check_peer(e, dst, 1, failed_peer) != DSGD_OK ||
        dsgd_mpi__check_peer(e, src, 1, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    if (dst < 0 && src < 0) return DSGD_OK;
    return dsgd_mpi__xfer_run(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, NULL, deadline, failed_peer);
}

static dsgd_result dsgd_mpi__sendrecv_upto(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                           int src, uint64_t rtag, void *rbuf, size_t rcap, size_t *rbytes,
                                           double deadline, int *failed_peer) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    size_t got = 0;
    dsgd_result r;
    if (rbytes) *rbytes = 0;
    if (dsgd_mpi__check_peer(e, dst, 1, failed_peer) != DSGD_OK ||
        dsgd_mpi__check_peer(e, src, 1, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    if (dst < 0 && src < 0) return DSGD_OK;
    r = dsgd_mpi__xfer_run(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcap, src >= 0 ? &got : NULL, deadline,
                           failed_peer);
    if (rbytes) *rbytes = got;
    return r;
}

/* >>mpi probe -------------------------------------------------------------- */

static dsgd_result dsgd_mpi__probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    dsgd_mpi__wait w;
    dsgd_result r;
    if (src) *src = -1;
    if (!src || !tag || !bytes) {
        snprintf(e->err, sizeof(e->err), "mpi rank %d: probe needs src, tag and bytes", e->rank);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if ((r = dsgd_mpi__usable(e)) != DSGD_OK) return r;
    memset(&w, 0, sizeof(w));
    for (;;) {
        MPI_Message msg;
        MPI_Status status;
        int i, k = -1, flag = 0, rc;
        /* a header taken earlier comes first, round-robin over the sources */
        for (i = 0; i < e->size; ++i) {
            k = (e->probe_next + i) % e->size;
            if (!e->stashed[k]) continue;
            *src = k;
            *tag = e->stash[2 * k];
            *bytes = (size_t)e->stash[2 * k + 1];
            e->probe_next = (k + 1) % e->size;
            return DSGD_OK;
        }
        /* the headers addressed to this endpoint: one MPI tag per source
           local index, any process; the local index looked at first goes
           round-robin so that none is passed over forever */
        for (i = 0; i < e->count && !flag; ++i) {
            int sl = (e->probe_src_local + i) % e->count;
            rc = MPI_Improbe(MPI_ANY_SOURCE, dsgd_mpi__header_tag(e, sl, e->rank), e->comm, &flag, &msg, &status);
            if (rc != MPI_SUCCESS) return dsgd_mpi__mpi_error(e, "MPI_Improbe", -1, rc);
            if (flag) {
                k = status.MPI_SOURCE * e->count + sl;
                e->probe_src_local = (sl + 1) % e->count;
            }
        }
        if (flag) {
            rc = MPI_Mrecv(e->probe_header, (int)sizeof(e->probe_header), MPI_BYTE, &msg, &status);
            if (rc != MPI_SUCCESS) return dsgd_mpi__mpi_error(e, "MPI_Mrecv", k, rc);
            if ((uint64_t)(size_t)e->probe_header[1] != e->probe_header[1]) {
                e->failed = 1; /* its payload cannot be received here */
                snprintf(e->err, sizeof(e->err), "mpi rank %d: the message from rank %d has %llu bytes, more than "
                         "this process can address", e->rank, k, (unsigned long long)e->probe_header[1]);
                return DSGD_ERR_DESYNC;
            }
            e->stash[2 * k] = e->probe_header[0];
            e->stash[2 * k + 1] = e->probe_header[1];
            e->stashed[k] = 1;
            continue; /* reported by the loop above */
        }
        if (DSGD__LOAD_ACQ(&e->sh->aborted)) {
            snprintf(e->err, sizeof(e->err), "mpi rank %d: the endpoint was aborted while waiting for a message "
                     "from any rank", e->rank);
            return DSGD_ERR_ABORTED;
        }
        if (dsgd_now() >= deadline) {
            snprintf(e->err, sizeof(e->err), "mpi rank %d: the deadline passed while waiting for a message from "
                     "any rank", e->rank);
            return DSGD_ERR_TIMEOUT;
        }
        dsgd_mpi__backoff(&w, 0);
    }
}

#endif /* DSGD_MPI__PART_TRANSPORT_IMPL */
