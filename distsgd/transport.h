/* distsgd/transport.h - the transport interface, reduce ops and kernels
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   TRANSPORTS

     A transport is a dsgd_transport_i: one endpoint per rank, a table of
     functions plus an implementation pointer. The collectives need only
     `send` and `recv` of tagged byte buffers with an absolute deadline; every
     other member is optional and either speeds things up (sendrecv;
     sendrecv_reduce, which reduces from a peer's buffer in place; share and
     unshare, which let ranks in one address space use each other's buffers
     directly, or processes on one node each other's windows of shared
     memory, with share_window), replaces the library's algorithm (a native allreduce, as MPI
     would provide), receives from any source (probe, for a rank that serves
     many peers, such as a parameter server) or from one until it is gone
     (probe_from, for an elastic strategy's settle), supplies a clock (a simulated-clock transport) or
     improves error messages (error_message, set_progress/peer_progress). A
     new transport fills what it can and leaves the rest NULL; the
     collectives do not change. A strategy's step sends its gradients over
     the transport only on the HOST path; on the DEVICE path the transport
     carries the finiteness flag and the two barriers.
*/
#ifndef DSGD__PART_TRANSPORT_DECL
#define DSGD__PART_TRANSPORT_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- transport */

typedef enum dsgd_reduce_op {
    DSGD_REDUCE_SUM = 0,
    DSGD_REDUCE_MEAN, /* the sum divided by N (a true division, by the rank that owns the element) */
    DSGD_REDUCE_MAX,  /* NaN-propagating: a NaN in any input gives NaN */
    DSGD_REDUCE_MIN   /* NaN-propagating */
} dsgd_reduce_op;
#define DSGD_REDUCE_COUNT (DSGD_REDUCE_MIN + 1)

/* One rank's endpoint of a transport. Fill it with memset(0) first so that
   optional members added in later versions stay NULL.

   Deadlines are absolute times in seconds on the transport's clock: now() when
   set, dsgd_now() otherwise. A transport must deliver the messages of one
   ordered pair (src, dst) in the order they were sent; tags let the receiver
   check that the message is the one it expects (a transport may check only
   part of the tag). Every blocking function returns DSGD_ERR_TIMEOUT once the
   deadline has passed, and never hangs.

   Result codes of the transfer functions: DSGD_OK; DSGD_ERR_TIMEOUT;
   DSGD_ERR_DESYNC (the message has another tag or size than the receiver
   expects: the ranks are out of step); DSGD_ERR_ABORTED (the group was
   aborted, or the peer gave up on a message); DSGD_ERR_OUT_OF_MEMORY;
   DSGD_ERR_INVALID_ARGUMENT (a peer outside the group, or this rank
   itself). They record nothing on any dsgd_ctx: the
   communicator turns them into messages (with error_message's text if set).

   Thread safety: an endpoint is used by one thread at a time. */
typedef struct dsgd_transport_i {
    const char *name; /* "loopback", "mpi", ... */
    void *impl;       /* passed to every function */
    int rank;         /* this endpoint's rank, 0 <= rank < size */
    int size;         /* number of ranks, >= 1 */
    /* optional: releases the endpoint. The communicator never calls it; the
       owner of the endpoint does. */
    void (*destroy)(void *impl);

    /* Sends `bytes` bytes to rank dst. Returns when buf may be reused (the
       message is buffered or has been received). */
    dsgd_result (*send)(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes,
                        double deadline);
    /* Receives exactly `bytes` bytes from rank src into buf. */
    dsgd_result (*recv)(void *impl, int src, uint64_t tag, void *buf, size_t bytes,
                        double deadline);

    /* optional: a send to dst and a receive from src that progress together,
       so that two ranks may exchange large messages without deadlock. dst or
       src may be -1 (that half is skipped). On failure *failed_peer is set to
       the rank the call was waiting for. NULL: the communicator orders a send
       and a recv so that its patterns (rings, pairs) cannot deadlock, at the
       cost of serialising them. */
    dsgd_result (*sendrecv)(void *impl, int dst, uint64_t stag, const void *sbuf,
                            size_t sbytes, int src, uint64_t rtag, void *rbuf,
                            size_t rbytes, double deadline, int *failed_peer);
    /* optional zero-copy hook: as sendrecv, but the rcount received floats are
       combined into rbuf, rbuf[i] = op(rbuf[i], received[i]) with op SUM, MAX
       or MIN (MEAN counts as SUM), reading the peer's memory in place where the
       transport can, without a temporary copy. sbuf and rbuf must not overlap.
       NULL: the communicator receives into scratch memory and reduces. */
    dsgd_result (*sendrecv_reduce)(void *impl, int dst, uint64_t stag, const void *sbuf,
                                   size_t sbytes, int src, uint64_t rtag, float *rbuf,
                                   size_t rcount, dsgd_reduce_op op, double deadline,
                                   int *failed_peer);

    /* optional shared-memory hooks, for ranks that can reach each other's
       memory: ranks in one address space (the loopback), or processes on
       one node through memory they map together (the MPI transport's
       MPI-3 shared-memory windows, with share_window below). share
       publishes buf and returns once every rank has published a buffer
       with the same tag, with peers[k] = rank k's buffer (peers[rank] =
       buf); the caller may then read and write the peers' buffers until it
       calls unshare. unshare declares that this rank is done with the
       peers' buffers and returns once every peer is done with this rank's,
       so buf may be reused. On failure (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED)
       either call withdraws buf and does not return while a peer may still
       touch it; *failed_peer is the rank waited for, or -1 when unknown.
       The direct all-reduce needs both. */
    dsgd_result (*share)(void *impl, uint64_t tag, void *buf, void **peers, double deadline,
                         int *failed_peer);
    dsgd_result (*unshare)(void *impl, uint64_t tag, double deadline, int *failed_peer);

    /* optional native collective: in-place all-reduce of count floats over all
       ranks (an MPI transport maps it to MPI_Allreduce; for MEAN it sums
       and divides by size, for MAX/MIN it must propagate NaN). When set,
       dsgd_allreduce with DSGD_ALLREDUCE_AUTO uses it instead of the library's
       algorithms; an explicit algorithm still runs the library's. */
    dsgd_result (*allreduce)(void *impl, float *buf, size_t count, dsgd_reduce_op op,
                             double deadline);

    /* optional: stops the whole group at once: every rank's waiting and later
       transfers return DSGD_ERR_ABORTED promptly. Any rank may call it,
       from any thread, at any time while the endpoint lives; it cannot be
       undone (the group must be recreated). A strategy calls it when one
       replica fails, so the others need not wait out their deadline. NULL:
       they wait until their deadline. */
    void (*abort)(void *impl);

    /* optional clock in seconds (a simulated-clock transport); NULL: dsgd_now(). */
    double (*now)(void *impl);

    /* optional diagnostics. error_message: text describing the last failure of
       this endpoint ("" when none). set_progress: the communicator announces
       that this rank has entered collective number seq. peer_progress: the
       last seq announced by rank peer (0: none yet). With both progress hooks
       a timeout message also names the ranks that never entered the
       collective, which need not be the neighbour that was waited for. */
    const char *(*error_message)(void *impl);
    void (*set_progress)(void *impl, uint64_t seq);
    uint64_t (*peer_progress)(void *impl, int peer);
    /* optional: receive from any source (MPI_Probe with MPI_ANY_SOURCE).
       Waits until a message from some rank is ready and reports its source,
       tag and size without taking it; the caller then takes it with
       recv(src, tag, ..., bytes). Messages from one source are reported in
       the order they were sent. When several sources are ready, the report
       may be any of them, but no source may be passed over forever (the
       loopback reports them round-robin). A withdrawn message (its sender
       failed) is reported too, and recv returns DSGD_ERR_ABORTED for it.
       On failure (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED) *src is -1. A rank
       that serves many peers in arrival order (a parameter server) needs it;
       the collectives never call it. */
    dsgd_result (*probe)(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes);
    /* optional, with share/unshare, for ranks in different address spaces:
       this rank's window, memory the other ranks can reach, and its size in
       *bytes (the same on every rank, a multiple of 64). Then share accepts
       only buf == the window (DSGD_ERR_INVALID_ARGUMENT otherwise) and
       peers[k] is rank k's window as mapped in this process; a caller
       copies its data in before share and out after unshare, a window at a
       time (the direct all-reduce does). NULL: share publishes any buffer
       itself (the ranks share an address space). The MPI transport's
       windows are MPI_Win_allocate_shared segments. */
    void *(*share_window)(void *impl, size_t *bytes);
    /* optional: as sendrecv, but the message received may be shorter than
       rcap bytes: *rbytes gets its size. A message with another tag, or
       longer than rcap, is DSGD_ERR_DESYNC (it stays in place). The
       collectives' agreement uses it to carry an algorithm's first
       exchanges with the fingerprints (see collectives.h); NULL: the
       agreement is a round trip of its own. The agreement's messages
       differ with and without it, so a group's endpoints all have it or
       none do (a mix is DSGD_ERR_DESYNC at the first collective). */
    dsgd_result (*sendrecv_upto)(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                 uint64_t rtag, void *rbuf, size_t rcap, size_t *rbytes, double deadline,
                                 int *failed_peer);
    /* optional: the node layout the transport found, L: ranks node*L ..
       node*L + L - 1 share a node (the MPI transport reads it from
       MPI_Comm_split_type when every node holds L consecutive ranks). 0:
       unknown or irregular. A communicator created with ranks_per_node 0
       takes it (see dsgd_comm_desc), so AUTO picks HIERARCHICAL across
       nodes. */
    int ranks_per_node;
    /* optional: this rank is done with the group for good. Called once,
       after its last call, on the thread that made it (simnet: the rank
       leaves the simulation, so no rank waits for what it might still
       send). NULL: nothing to do. The parameter-server strategy calls it
       for the ranks it runs. */
    void (*leave)(void *impl);
    /* optional: this rank has just applied an optimizer update to `floats`
       floats (a parameter server applying a push, a summation-only worker
       applying a mean), work a simulated clock must charge: simnet
       advances the rank's clock by floats times its apply cost. NULL:
       nothing to do (the real time was spent). The parameter-server
       engine calls it after every update it applies. */
    dsgd_result (*charge_apply)(void *impl, size_t floats);
    /* optional: this rank has just converted or compressed `floats` floats
       for the wire (a half wire's piece before it is sent or after it is
       received, a comm hook's compressor on its bucket), work a simulated
       clock must charge: simnet advances the rank's clock by floats times
       its codec cost. NULL: nothing to do (the real time was spent). Called
       through dsgd_comm_charge_codec (collectives.h). */
    dsgd_result (*charge_codec)(void *impl, size_t floats);
    /* optional: as probe, for the messages from src alone, and it also
       ends when src is gone with nothing it sent left for this rank
       (simnet: src was killed, or left; known at the later of the call
       and that time plus the link's latency, as a message it sent then
       would be): DSGD_OK with *gone 1 (else *gone 0). The messages a gone
       src sent before are reported first. So a rank waits for a peer's
       message or its death, whichever comes first, and the answer
       depends only on what the peer did (over a simulated clock, on the
       virtual times), not on which thread got there first. On failure
       (DSGD_ERR_TIMEOUT; DSGD_ERR_ABORTED: this rank's transport
       stopped) *gone is 0. An elastic strategy's settle needs it (the
       loopback has it, and never reports a rank gone). */
    dsgd_result (*probe_from)(void *impl, int src, double deadline, uint64_t *tag, size_t *bytes, int *gone);
} dsgd_transport_i;

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_TRANSPORT_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_TRANSPORT_IMPL)
#define DSGD__PART_TRANSPORT_IMPL

/* >>reduce kernels --------------------------------------------------------- */
/* Unrolled by 8 with restrict pointers so that compilers vectorise them at -O2. */

static void dsgd__sum_into(float *DSGD__RESTRICT d, const float *DSGD__RESTRICT s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        d[i + 0] += s[i + 0]; d[i + 1] += s[i + 1]; d[i + 2] += s[i + 2]; d[i + 3] += s[i + 3];
        d[i + 4] += s[i + 4]; d[i + 5] += s[i + 5]; d[i + 6] += s[i + 6]; d[i + 7] += s[i + 7];
    }
    for (; i < n; ++i) d[i] += s[i];
}

/* t = a + b */
static void dsgd__sum2(float *DSGD__RESTRICT t, const float *DSGD__RESTRICT a, const float *DSGD__RESTRICT b,
                       size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        t[i + 0] = a[i + 0] + b[i + 0]; t[i + 1] = a[i + 1] + b[i + 1];
        t[i + 2] = a[i + 2] + b[i + 2]; t[i + 3] = a[i + 3] + b[i + 3];
        t[i + 4] = a[i + 4] + b[i + 4]; t[i + 5] = a[i + 5] + b[i + 5];
        t[i + 6] = a[i + 6] + b[i + 6]; t[i + 7] = a[i + 7] + b[i + 7];
    }
    for (; i < n; ++i) t[i] = a[i] + b[i];
}

/* max(a, b) and min(a, b) that propagate a NaN in either operand */
#define DSGD__FMAX(a, b) (((a) >= (b) || (a) != (a)) ? (a) : (b))
#define DSGD__FMIN(a, b) (((a) <= (b) || (a) != (a)) ? (a) : (b))

/* d[i] = op(d[i], s[i]), or op(s[i], d[i]) when s_first. The operand order
   matters only for NaN payloads and signed zeros; recursive doubling fixes it
   so that two ranks reducing the same pair compute the very same operation. */
static void dsgd__reduce_into(float *DSGD__RESTRICT d, const float *DSGD__RESTRICT s, size_t n,
                              dsgd_reduce_op op, int s_first) {
    size_t i;
    switch (op) {
    case DSGD_REDUCE_MAX:
        if (s_first) {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMAX(s[i], d[i]);
        } else {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMAX(d[i], s[i]);
        }
        break;
    case DSGD_REDUCE_MIN:
        if (s_first) {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMIN(s[i], d[i]);
        } else {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMIN(d[i], s[i]);
        }
        break;
    default: /* SUM, MEAN */
        if (s_first) {
            for (i = 0; i < n; ++i) d[i] = s[i] + d[i];
        } else {
            dsgd__sum_into(d, s, n);
        }
        break;
    }
}

static void dsgd__divide(float *d, size_t n, int by) {
    float k = (float)by;
    size_t i;
    for (i = 0; i < n; ++i) d[i] = d[i] / k;
}

#endif /* DSGD__PART_TRANSPORT_IMPL */
