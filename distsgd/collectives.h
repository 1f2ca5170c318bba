/* distsgd/collectives.h - communicators, the agreement, all-reduce and the rest
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   COLLECTIVES

     A dsgd_comm is one rank's view of a group: dsgd_comm_create(ctx,
     &endpoint, &desc, &comm) in each rank's thread, then every rank calls the
     same collectives in the same order with the same counts. Each call has a
     deadline (timeout_s, 0: the communicator's default; at most 1e7 s) and
     returns DSGD_ERR_TIMEOUT with a message naming the collective, its
     sequence number and the rank it waited for, e.g.
         "dsgd_allreduce #17 (ring): rank 2 timed out waiting for rank 3 after 0.50 s"
     A communicator whose collective failed mid-way is unusable afterwards
     (DSGD_ERR_STATE): its peers may be anywhere in the protocol.

     Agreement: before a collective moves any data, the ranks check that
     they all called the same one: the same collective (kind and sequence
     number), count, op, root, algorithm (with its wire, see
     dsgd_allreduce_wire), piece size and node layout
     (ranks_per_node). If any rank differs,
     every rank returns DSGD_ERR_DESYNC, at once rather than at the deadline,
     with a message naming two ranks and what they passed, e.g.
         "dsgd_allreduce #9 (ring): rank 0: the ranks disagree on the collective:
          rank 2 passed count 999; rank 0 passed count 1000; no buffer was
          touched"
     No buffer is read or written, and the communicator stays usable (unless
     the ranks are in collectives of different numbers). So no collective
     returns DSGD_OK unless every rank agreed, and none touches memory
     outside the caller's count. Cost: DIRECT publishes the description
     beside the buffer it already shares (free). Message passing runs
     ceil(log2 N) rounds of small messages (the range of fingerprints seen
     so far); over a transport with sendrecv_upto (the loopback, MPI) those
     rounds also carry the algorithm's first exchanges, so the fingerprints
     ride with the first message: recursive doubling at N a power of two
     and broadcast at any N (up to 4096 floats) pay no round trip for them, and
     the ring, reduce-scatter and all-gather one round fewer (none at
     N = 2); see >>fold. Otherwise (halving-doubling, reduce-broadcast,
     hierarchical, the native hook, larger messages) the rounds come
     first: a few microseconds on the loopback; the barrier is the rounds
     alone. Ranks that call different all-reduce algorithms, one of them
     DIRECT, do not meet in the agreement: they time out instead.

     Cost, in the alpha-beta-gamma model (alpha: a message's latency, beta:
     seconds per byte, gamma: seconds per float reduced; n floats on N
     ranks, c = ceil(n / N) floats the largest block; for the ring and
     hierarchical all-reduce, whose blocks are chunk-cyclic, c is the
     largest block of the map, within two chunks of ceil(n / N),
     and ceil(n / N) when N chunks divide n):
       agreement A       ceil(log2 N) (alpha + 144 beta) as rounds of its
                         own (DIRECT: 0, it rides the shared memory)
       ring all-reduce   A + 2(N-1)(alpha + 4 c beta) + (N-1) c gamma
       reduce-scatter    A + (N-1)(alpha + c (4 beta + gamma))
       all-gather        A + (N-1)(alpha + 4 c beta)
       hierarchical      A + (L-1)(alpha_in + c_L (4 beta_in + gamma))
                         + 2(M-1)(alpha + 4 c_LM beta) + (M-1) c_LM gamma
                         + (L-1)(alpha_in + 4 c_L beta_in)
       ring, half wire   A + 2(N-1)(alpha + 2 c beta) + (N-1) c gamma
                         (dsgd_allreduce_wire: half the bytes; the
                         agreement never carries its first step)
       broadcast         A + ceil(log2 N)(alpha + 4 n beta): the root sends
                         the buffer to each of its ceil(log2 N) children
                         (segments of 4 pieces flow on down the tree
                         meanwhile, so the root's link is the limit)
     with L ranks per node, M nodes, c_L = ceil(n / L), c_LM = ceil(c_L / M),
     alpha_in and beta_in the links inside a node. A ring step is one
     message of a whole block, so alpha is paid once per step and there is
     no pipeline fill: the transport carries the message's bytes back to
     back (MPI in its own fragments, TCP in its window; simnet charges
     alpha + bytes * beta, and gives the ring's and the hierarchical
     all-reduce's times above exactly where N divides n). The
     step's reduction follows its message (the (N-1) c gamma term, not
     overlapped); over a transport without sendrecv_reduce (MPI) it needs c
     floats of scratch, as MPI's own ring does. Over sendrecv_upto the
     agreement's rounds carry 8 bytes more each, and the ring's first step
     when N = 2 or N is not a power of two and c <= 4096: one alpha less.
     Ranks in one address space (the loopback) run the ring in pieces of
     piece_bytes instead, each through the whole ring before the next, so
     that a piece is still in cache when the next rank reduces it: there
     the memory, not alpha, is the limit.

     Determinism: each algorithm reduces every element in a fixed order that
     depends only on the algorithm, N and the element's index in the whole
     vector (dsgd_allreduce_at's first + i; ring and hierarchical: through
     DSGD_ALLREDUCE_CHUNK), not on timing, the piece size, or how the vector
     is cut into buckets, so the same inputs give the same bits every run
     and at every bucket size (the strategies pass each bucket's offset, so
     their weights depend neither on bucket_bytes nor on overlap). DIRECT
     (rank order 0..N-1), recursive doubling (the lower group's value
     first) and reduce-broadcast (a rank's own value, then its children's)
     never depended on the position; halving-doubling reduces the lower
     group's value first in every step, whichever rank owns the element.
     The native hook's order is the transport's. Every rank ends with
     bitwise identical buffers: each element is reduced by one rank and its
     bits are copied to the others, except in recursive doubling, where both
     partners of a step compute the same operation on the same operands in
     the same order. Different algorithms may differ in the last bits.
     A half wire (dsgd_allreduce_wire) keeps the ring's order and adds a
     rounding per step; its owner's rounded sum is what every rank takes.

     Bytes: dsgd_comm_stats counts what each communicator handed to its
     transport, and the seconds spent; its closed forms are beside it.

     Waits: dsgd_comm_get_waits says, per peer, how long this rank was
     blocked waiting for it, on the communicator's clock; the agreement
     passes a straggler's lateness on through its rounds, so a rank that
     comes X late is charged X by every other rank, not the messengers
     between them (see there).

     The collectives are three parts, in this order; every public function
     is declared here:
       collectives.h        (this one) the communicator: creation, AUTO's
                            choice, the checks, the exchanges, waits and
                            stats, the names
       collectives_agree.h  the agreement: the fingerprints and their
                            rounds (>>agreement), the rounds that carry an
                            algorithm's first exchanges (>>fold)
       collectives_algos.h  the map (>>map), the algorithms and their
                            table, the half wire (>>wire), the entry points
*/
#ifndef DSGD__PART_COLLECTIVES_DECL
#define DSGD__PART_COLLECTIVES_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- collectives */

typedef enum dsgd_allreduce_algo {
    /* AUTO picks, for a message of S bytes on N ranks (dsgd_allreduce_choose
       tells which; measured with distsgd's all-reduce benchmark on a 2-vCPU
       machine):
         N == 1                  nothing to exchange
         share_window present    DIRECT through the windows (the MPI
                                 transport with every process on one node):
                                 1.6-13x MPI_Allreduce's busbw from 4 KiB to
                                 64 MiB at N = 2 and 4, and 1.05-6x the
                                 native hook's at 64 KiB and up (2 CPUs)
         several nodes           HIERARCHICAL (the node layout L, from
                                 dsgd_comm_desc.ranks_per_node or the
                                 transport's, with 1 < L < N)
         native hook present     the transport's allreduce
         share/unshare present   DIRECT (the loopback): fastest or close to it
                                 at every size and N = 2..8 measured, and the
                                 least hurt by a busy machine, having no
                                 step-by-step handshakes
       otherwise (message passing only):
         S <= 64 KiB             RECURSIVE_DOUBLING: log2 N exchanges of the
                                 whole buffer, the fewest round trips
         N a power of two and
         S <= 1 MiB              HALVING_DOUBLING: log2 N rounds, each moving
                                 half as much as the last
         otherwise               RING: bandwidth-optimal, one latency per
                                 step (see COLLECTIVES, Cost) */
    DSGD_ALLREDUCE_AUTO = 0,
    /* reduce-scatter then all-gather around the ring, 2(N-1) steps, each rank
       sending 2(N-1)/N of the buffer, a step one message (see COLLECTIVES,
       Cost). Element g of the vector (dsgd_allreduce_at's first + i) is in
       block b = (g / DSGD_ALLREDUCE_CHUNK) mod N and is summed in ring
       order starting from rank b+1 and ending at rank b, each rank
       reducing the partial result it receives into its own value. The
       blocks of a buffer are balanced within one chunk (below N chunks,
       some are empty); the buffer is laid out in block order in scratch
       memory (count floats, reused) and back, two copies, unless its
       chunks already lie in that order. */
    DSGD_ALLREDUCE_RING,
    /* Rabenseifner's recursive halving (reduce-scatter) then recursive
       doubling (all-gather): 2 log2 N steps. For N not a power of two, with
       p = 2^floor(log2 N) and r = N - p, the first 2r ranks first fold in
       pairs (rank 2i's buffer is reduced into rank 2i+1's), p ranks run the
       algorithm, and the result is sent back to the even ranks. */
    DSGD_ALLREDUCE_HALVING_DOUBLING,
    /* binomial-tree reduce to rank 0, then binomial broadcast */
    DSGD_ALLREDUCE_REDUCE_BROADCAST,
    /* log2 N pairwise exchanges of the whole buffer (plus a fold for N not a
       power of two); best for small messages. Needs count floats of scratch
       (capped by the piece size). */
    DSGD_ALLREDUCE_RECURSIVE_DOUBLING,
    /* ranks that reach each other's memory (a transport with share/unshare:
       the loopback's threads, or the MPI transport's processes on one node
       through shared-memory windows): each rank sums its block
       (dsgd_block_range) straight from every rank's buffer, in rank order
       0..N-1, and writes the result into every buffer. Each element is read
       and written once per rank (2 N S bytes in all, the minimum) with no
       step-by-step handshakes. Across processes (share_window) the buffer
       goes through the windows a window at a time (copied in, reduced,
       copied out), with the same bits. DSGD_ERR_UNSUPPORTED without the
       hooks. */
    DSGD_ALLREDUCE_DIRECT,
    /* two levels, for ranks on several nodes (dsgd_comm_desc.ranks_per_node
       L: ranks node*L .. node*L + L - 1 share a node, M = N / L nodes): a
       ring reduce-scatter inside each node (local rank l ends owning block l
       of L), a ring all-reduce of block l across the M nodes among the ranks
       of local rank l, then a ring all-gather inside each node. Inside a
       node each rank moves 2(L-1)/L of the buffer; across nodes 2(M-1)/(M L)
       (Jeaugey, NCCL; Sergeev and Del Balso, Horovod). MEAN divides by N
       once, at the end of the sum. Element g's block b (as RING's) goes to
       local rank b mod L and, across the nodes, to node b / L, so its
       order too depends on g alone. With one node (L unset or N) or one rank
       per node it is RING, bit for bit. */
    DSGD_ALLREDUCE_HIERARCHICAL
} dsgd_allreduce_algo;
#define DSGD_ALLREDUCE_COUNT (DSGD_ALLREDUCE_HIERARCHICAL + 1) /* AUTO included */

/* Names for messages and benchmarks: "sum", "ring", ...; "unknown" for other
   values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_reduce_op_name(dsgd_reduce_op op);
DSGD_API const char *dsgd_allreduce_algo_name(dsgd_allreduce_algo algo);

/* The block of `count` elements that rank `index` of n owns in reduce-scatter
   and all-gather: the first count % n ranks get count / n + 1 elements, the
   others count / n, in rank order. *offset and *len may not be NULL.
   Errors: none (n < 1 or index outside [0, n): both are set to 0).
   Thread safety: any thread. */
DSGD_API void dsgd_block_range(size_t count, int n, int index, size_t *offset, size_t *len);

/* The global element map of the ring and hierarchical all-reduce: element
   g of the vector (g = first + i for buf[i] of dsgd_allreduce_at) belongs to
   block (g / DSGD_ALLREDUCE_CHUNK) mod N, wherever the vector is cut, so
   its reduction order (which rank's value comes first) depends on g, N and
   the algorithm alone; the blocks of any bucket are balanced within about one
   chunk (4 KiB). */
#define DSGD_ALLREDUCE_CHUNK 1024

/* The defaults of dsgd_comm_desc (and of the strategies' communicators). */
#define DSGD_DEFAULT_TIMEOUT_S 30.0
#define DSGD_DEFAULT_PIECE_BYTES ((size_t)256 * 1024)

typedef struct dsgd_comm_desc {
    double timeout_s;   /* default deadline of each collective in seconds; 0:
                           DSGD_DEFAULT_TIMEOUT_S; at most 1e7 */
    size_t piece_bytes; /* large buffers are processed in pieces of this size so
                           that a step's working set stays in cache
                           (halving-doubling, recursive doubling,
                           reduce-broadcast, the broadcast tree, and the
                           ring where the ranks share an address space;
                           across address spaces a ring step is one
                           message: see COLLECTIVES, Cost); 0:
                           DSGD_DEFAULT_PIECE_BYTES (256 KiB);
                           clamped to 256 B..1 GiB. Must be equal on all ranks
                           (checked: DSGD_ERR_DESYNC otherwise); the results do
                           not depend on it. */
    int ranks_per_node; /* the node layout for DSGD_ALLREDUCE_HIERARCHICAL: ranks
                           node*L .. node*L + L - 1 share a node; L must divide
                           the size. 0: the transport's layout
                           (dsgd_transport_i.ranks_per_node) when it has one
                           that divides the size, else one node. Must be equal
                           on all ranks (checked: DSGD_ERR_DESYNC otherwise).
                           On one machine it fakes nodes, for tests and the
                           simulated cluster */
} dsgd_comm_desc;

typedef struct dsgd_comm dsgd_comm;

/* Creates rank transport->rank's communicator over the endpoint (the table
   is copied; its impl must stay valid until dsgd_comm_destroy). desc may be
   NULL (defaults).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing
   recorded; transport or out NULL; size < 1; rank outside [0, size); send or
   recv missing; a negative or NaN timeout; ranks_per_node negative or not
   dividing the size), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread; the communicator, like ctx, is then
   used by one thread at a time (the rank's). */
DSGD_API dsgd_result dsgd_comm_create(dsgd_ctx *ctx, const dsgd_transport_i *transport,
                                      const dsgd_comm_desc *desc, dsgd_comm **out);
/* Frees the communicator, not the endpoint (its owner frees that); comm
   NULL: nothing.
   Thread safety: the communicator's thread. */
DSGD_API void dsgd_comm_destroy(dsgd_comm *comm);
/* dsgd_comm_rank, dsgd_comm_size: this rank and the group's size (comm NULL:
   -1 and 0). dsgd_comm_ctx: the context errors are recorded on (NULL).
   Errors: none. Thread safety: any thread while comm lives (fixed at
   creation). */
DSGD_API int dsgd_comm_rank(const dsgd_comm *comm);
DSGD_API int dsgd_comm_size(const dsgd_comm *comm);
DSGD_API dsgd_ctx *dsgd_comm_ctx(const dsgd_comm *comm);
/* The number of collectives started so far: the first collective is #1, and
   the number is the same on every rank after the same calls. Calls rejected
   before they start (a bad argument, a broken communicator) do not count.
   Errors: none (comm NULL: 0). Thread safety: the communicator's thread. */
DSGD_API uint64_t dsgd_comm_seq(const dsgd_comm *comm);
/* Non-zero once a collective failed mid-way on this communicator (a
   timeout, an abort, messages out of step): its protocol state is unknown
   and every later collective returns DSGD_ERR_STATE; recreate the group
   (comm NULL: 0). A DSGD_ERR_DESYNC found by the agreement, before any data
   moved, does not break it, unless the ranks were at collectives of
   different numbers (dsgd_comm_seq).
   Errors: none. Thread safety: the communicator's thread. */
DSGD_API int dsgd_comm_broken(const dsgd_comm *comm);
/* The algorithm AUTO would run for count floats on this communicator
   (DSGD_ALLREDUCE_AUTO itself when the transport's native hook would be used;
   DSGD_ALLREDUCE_RING for one rank or comm NULL, where nothing is exchanged).
   Errors: none. Thread safety: any thread while comm lives. */
DSGD_API dsgd_allreduce_algo dsgd_allreduce_choose(const dsgd_comm *comm, size_t count);

/* All-reduce of buf[0..count) in place: on return every rank holds op over
   all ranks' inputs, bitwise identical on all ranks. timeout_s: 0 the
   communicator's default, > 0 this call's deadline, negative invalid. With
   one rank it returns at once (and still counts in dsgd_comm_seq); count 0
   still agrees with the other ranks (see COLLECTIVES, Agreement), then
   returns.
   Errors (recorded on the communicator's ctx): DSGD_ERR_INVALID_ARGUMENT
   (comm NULL, nothing recorded; buf NULL with count > 0; an unknown op or
   algorithm; a negative or NaN timeout; count * 4 bytes overflowing size_t),
   DSGD_ERR_UNSUPPORTED (DIRECT on a transport without share/unshare),
   DSGD_ERR_TIMEOUT (names the rank waited for and the sequence number),
   DSGD_ERR_DESYNC (the ranks passed different counts, ops, algorithms,
   piece sizes or collectives: returned by every rank, before any buffer
   is touched, naming two ranks that differ; the communicator stays usable),
   DSGD_ERR_ABORTED (the group was aborted, through the transport's abort,
   or a peer gave up mid-way), DSGD_ERR_DESYNC also when messages arrive out
   of step, DSGD_ERR_STATE (the communicator was broken by an earlier
   failure), DSGD_ERR_OUT_OF_MEMORY, or whatever a native allreduce hook
   returns. A failure in the exchange (all but the argument checks and
   DSGD_ERR_UNSUPPORTED) breaks the communicator: later collectives return
   DSGD_ERR_STATE.
   Thread safety: the communicator's thread; all ranks call concurrently. */
DSGD_API dsgd_result dsgd_allreduce(dsgd_comm *comm, float *buf, size_t count,
                                    dsgd_reduce_op op, dsgd_allreduce_algo algo,
                                    double timeout_s);
/* dsgd_allreduce of buf[0..count) where buf is part of a larger vector
   that the caller all-reduces in pieces (buckets), buf[0] being its
   element `first`: every element gets the bits it gets when the whole
   vector is all-reduced in one call, whatever the cut (an element's
   reduction order depends on its index in the whole vector, see
   DSGD_ALLREDUCE_CHUNK). dsgd_allreduce is this with first 0. Every rank
   passes the same first (checked: DSGD_ERR_DESYNC otherwise).
   Errors: as dsgd_allreduce (first + count overflowing size_t:
   DSGD_ERR_INVALID_ARGUMENT).
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_allreduce_at(dsgd_comm *comm, float *buf, size_t count, size_t first,
                                       dsgd_reduce_op op, dsgd_allreduce_algo algo, double timeout_s);

/* The format of an all-reduce's messages (dsgd_allreduce_wire). */
typedef enum dsgd_wire {
    DSGD_WIRE_F32 = 0, /* fp32: dsgd_allreduce_at itself */
    DSGD_WIRE_F16,     /* IEEE binary16 (half.h) on the wire, fp32 sums */
    DSGD_WIRE_BF16     /* bfloat16 on the wire, fp32 sums */
} dsgd_wire;
#define DSGD_WIRE_COUNT (DSGD_WIRE_BF16 + 1)

/* "f32", "f16", "bf16"; "unknown" for other values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_wire_name(dsgd_wire wire);

/* dsgd_allreduce_at (the same first, the same bits-from-the-index rule)
   with its messages in the format `wire`: gradient compression done in the
   collective, as PyTorch's fp16_compress_hook and bf16_compress_hook, but
   with every sum in fp32 and a shared power-of-two scale.
   DSGD_WIRE_F32 is dsgd_allreduce_at, any op and algorithm. A half wire
   (DSGD_WIRE_F16, DSGD_WIRE_BF16) takes op SUM and algo AUTO or RING, and
   runs the ring on the map's blocks (DSGD_ALLREDUCE_CHUNK) on every
   transport: DIRECT has no wire, so over the loopback, whose AUTO is
   DIRECT in fp32, a half wire still runs the ring (in pieces of
   piece_bytes there, with the same bits).
   What each rank computes, with k = dsgd_wire_scale(M, N) for M the
   largest finite |x| of the bucket over every rank (agreed in the
   agreement's rounds: no message more): every input is scaled by 2^k
   (exact); around the ring each step sends its fp32 partial sum rounded
   to the wire (round to nearest even, half.h) and the receiver adds its
   own fp32 value to it in fp32; the owner of a block rounds the final
   sum to the wire once and every rank, the owner too, takes that value
   back to fp32 and multiplies by 2^-k. So every rank holds the same bits,
   which depend neither on piece_bytes nor on how the vector is cut into
   buckets (first) as long as the buckets get the same k (a bucket's k
   comes from its own largest magnitude; another k changes only elements
   whose partial sums fall among the wire's subnormals, below 2^-14 after
   scaling for fp16: fp16's and fp32's roundings are otherwise the same
   at every scale). Neither overflow nor fp16's subnormals are a concern:
   scaled, every input is below 2^(15 - ceil(log2 N)) and every partial
   sum below 2^15 (1 + u)^N, under 65504 for N up to 1024.
   Error bound, per element, with S the exact sum of the N inputs x_i and
   A = sum |x_i|, u the wire's unit roundoff (fp16 2^-11, bf16 2^-8),
   c = (1 + u)^N (1 + 2^-24)^(N-1), eta the wire's half smallest
   subnormal (fp16 2^-25, bf16 2^-134):
       |result - S| <= (c - 1) A + 2 c N eta 2^-k + 2^-149
   (N roundings to the wire and N - 1 fp32 sums along the element's
   chain; the absolute terms cover underflow, in the wire or, for k < 0,
   in the scaling; they matter only for elements far below M). Inf and
   NaN inputs give Inf or NaN.
   Cost (see COLLECTIVES, Cost): A + 2(N-1)(alpha + 2 c beta) +
   (N-1) c gamma, half the ring's bytes, plus the conversions (about 3 n
   elements converted per rank); the agreement's rounds come first (the
   ring's first step does not ride them, its scale is not known yet).
   With one rank it returns at once, buf unchanged.
   Errors: as dsgd_allreduce_at; DSGD_ERR_INVALID_ARGUMENT for an unknown
   wire; DSGD_ERR_UNSUPPORTED (before the collective starts) for a half
   wire with an op other than SUM or an algorithm other than AUTO and
   RING. The ranks must pass the same wire (checked: DSGD_ERR_DESYNC).
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_allreduce_wire(dsgd_comm *comm, float *buf, size_t count, size_t first,
                                         dsgd_reduce_op op, dsgd_allreduce_algo algo, dsgd_wire wire,
                                         double timeout_s);
/* The scale exponent k of a half wire's all-reduce on n ranks whose
   largest finite input magnitude is max_abs (dsgd_allreduce_wire): with
   e = floor(log2 max_abs) (-127 for 0 and fp32 subnormals),
   k = 14 - e - ceil(log2 n), clamped to [-126, 126], so every scaled
   input is below 2^(15 - ceil(log2 n)) and an exact sum of n of them
   below 2^15.
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_wire_scale(float max_abs, int n);

/* What a communicator has done since its creation or
   dsgd_comm_reset_stats (BYTES in comm_hook.h for comm hooks). */
typedef struct dsgd_comm_stats {
    /* Bytes this rank handed to its transport: every send, sendrecv,
       sendrecv_reduce and sendrecv_upto (the agreement's included: 144
       bytes a round, or 152 plus the floats it carries over sendrecv_upto).
       DIRECT, which sends nothing, counts the bytes it moves in the
       other ranks' memory: their N-1 fingerprints (64 bytes each), then,
       for its block of b floats, 2 (N-1) 4 b (read from each, written into
       each), per window over share_window. The native hook counts the
       4 count bytes it is handed. So, for count floats, N dividing count
       and N chunks dividing count / N where it matters:
         ring          ceil(log2 N) G + 2 (N-1)/N 4 count
         half wire     ceil(log2 N) G + 2 (N-1)/N 2 count
         DIRECT        (N-1) 64 + 2 (N-1)/N 4 count
       with G = 144 (send/recv, sendrecv) or 152 (sendrecv_upto). */
    uint64_t bytes_sent;
    /* The same with every payload counted as fp32 (a half wire's twice):
       bytes_sent / bytes_uncompressed is the compression on the wire. */
    uint64_t bytes_uncompressed;
    /* Seconds (dsgd_now, real time) converting to and from a wire,
       scaling and scanning for the scale, and what dsgd_comm_stats_add
       added. */
    double compress_s;
    /* Seconds inside the collectives, from entry to return, on the
       communicator's clock (the transport's now: virtual seconds on
       simnet), failed calls included. */
    double comm_s;
} dsgd_comm_stats;

/* dsgd_comm_get_stats: *out = the counts (comm NULL: zeros; out NULL:
   nothing). dsgd_comm_reset_stats: zeros them, and the waits
   (dsgd_comm_get_waits). dsgd_comm_stats_add: adds
   each field of *extra (NULL: nothing): a comm hook that compresses by its
   own means adds its seconds (compress_s) and credits bytes_uncompressed
   with what its bucket's fp32 exchange would have cost beyond the bytes
   the collectives it called counted.
   Errors: none. Thread safety: the communicator's thread. */
DSGD_API void dsgd_comm_get_stats(const dsgd_comm *comm, dsgd_comm_stats *out);
DSGD_API void dsgd_comm_reset_stats(dsgd_comm *comm);
DSGD_API void dsgd_comm_stats_add(dsgd_comm *comm, const dsgd_comm_stats *extra);
/* Tells the transport that this rank has just converted or compressed
   `floats` floats for the wire, for a simulated clock to charge (the
   transport's charge_codec: simnet's codec_s_per_float each); elsewhere
   nothing (the real time was spent). The half wires call it for their
   conversions; a comm hook that compresses calls it for its bucket.
   Errors: DSGD_ERR_INVALID_ARGUMENT (comm NULL, nothing recorded), the
   transport's (simnet: DSGD_ERR_ABORTED once the hub is aborted).
   Thread safety: the communicator's thread. */
DSGD_API dsgd_result dsgd_comm_charge_codec(dsgd_comm *comm, size_t floats);
/* Who made this rank wait: per_peer[k] = the seconds this rank spent
   blocked in its collectives waiting for rank k, since its creation or
   dsgd_comm_reset_stats, on the communicator's clock (the transport's
   now: virtual seconds on simnet); per_peer[rank] = 0. A straggler that
   enters a collective X seconds after the others shows as X (plus the
   messages' own times) on each of the others' entries for it, and no
   more than message times elsewhere. How a wait is charged:
     - message passing: each blocking transport call (send, recv,
       sendrecv, sendrecv_reduce, sendrecv_upto) is timed and charged to
       the peer it received from (to the peer it sent to when it only
       sends), so a wait includes the message's own transfer (alpha +
       bytes beta) and, over sendrecv_reduce, the reduction of what
       arrived;
     - the agreement's rounds (every collective's first, see
       COLLECTIVES) pass lateness on: its messages name the rank the
       sender's lateness traces to, and a round's wait is charged to that
       rank, not to the messenger; after the agreement, every message's
       wait is charged to its sender;
     - DIRECT: the wait in share (until every rank has published) is
       charged to the rank that entered the collective last (each rank
       publishes when it entered, on the clock of the process or node);
       the wait in unshare (until the others are done with this rank's
       buffer: the blocks' imbalance, not anyone's lateness) is not
       charged, and nor is the native hook's (its peers are the
       transport's business).
   Cost: one or two clock reads per blocking call (one per DIRECT
   all-reduce), measured in the noise of a one-float loopback all-reduce.
   Errors: DSGD_ERR_INVALID_ARGUMENT (comm NULL, nothing recorded;
   per_peer NULL or n below the size: recorded on the comm's ctx).
   Thread safety: the communicator's thread. */
DSGD_API dsgd_result dsgd_comm_get_waits(const dsgd_comm *comm, double *per_peer, int n);
/* Reduce-scatter in place (ring): on return this rank's block of buf (see
   dsgd_block_range(count, size, rank, ...)) holds op over all ranks' inputs
   for that block; the rest of buf is unspecified.
   Errors: as dsgd_allreduce, without the algorithm and DSGD_ERR_UNSUPPORTED.
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_reduce_scatter(dsgd_comm *comm, float *buf, size_t count,
                                         dsgd_reduce_op op, double timeout_s);
/* All-gather in place (ring): on entry each rank's block of buf (see
   dsgd_block_range) holds its contribution; on return buf holds every
   rank's block on every rank.
   Errors: as dsgd_allreduce, without the op, the algorithm and
   DSGD_ERR_UNSUPPORTED.
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_allgather(dsgd_comm *comm, float *buf, size_t count,
                                    double timeout_s);
/* Broadcast of root's buf[0..count) to every rank (up to 4096 floats over
   a transport with sendrecv_upto: carried by the agreement's rounds, see
   COLLECTIVES; otherwise a binomial tree, pipelined in pieces); every rank
   passes the same root (a different root on some rank is DSGD_ERR_DESYNC
   on every rank).
   Errors: as dsgd_allgather, and DSGD_ERR_INVALID_ARGUMENT for root outside
   [0, size).
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_broadcast(dsgd_comm *comm, float *buf, size_t count, int root,
                                    double timeout_s);
/* Returns once every rank has entered the barrier: the agreement alone
   (ceil(log2 N) rounds of messages of 144 bytes, 152 over sendrecv_upto,
   in the dissemination's pattern; over sendrecv_upto at N a power of two,
   the butterfly's). A rank in
   another collective makes it DSGD_ERR_DESYNC on every rank.
   Errors: as dsgd_allgather (no buffer).
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_barrier(dsgd_comm *comm, double timeout_s);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_COLLECTIVES_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_COLLECTIVES_IMPL)
#define DSGD__PART_COLLECTIVES_IMPL

/* >>transport -------------------------------------------------------------- */

DSGD_API const char *dsgd_reduce_op_name(dsgd_reduce_op op) {
    static const char *const names[DSGD_REDUCE_COUNT] = {"sum", "mean", "max", "min"};
    return (int)op >= 0 && (int)op < (int)DSGD_REDUCE_COUNT ? names[op] : "unknown";
}

DSGD_API const char *dsgd_allreduce_algo_name(dsgd_allreduce_algo algo) {
    /* in the order of dsgd_allreduce_algo and of the table of algorithms,
       dsgd__allreduce_algos (collectives_algos.h) */
    static const char *const names[DSGD_ALLREDUCE_COUNT] = {
        "auto", "ring", "halving_doubling", "reduce_broadcast", "recursive_doubling", "direct", "hierarchical"};
    return (int)algo >= 0 && (int)algo < (int)DSGD_ALLREDUCE_COUNT ? names[algo] : "unknown";
}

DSGD_API const char *dsgd_wire_name(dsgd_wire wire) {
    static const char *const names[DSGD_WIRE_COUNT] = {"f32", "f16", "bf16"};
    return (int)wire >= 0 && (int)wire < (int)DSGD_WIRE_COUNT ? names[wire] : "unknown";
}


/* >>collectives ------------------------------------------------------------ */

#define DSGD__COMM_MAX_TIMEOUT 1e7 /* longer timeouts are clamped (~115 days) */
/* AUTO thresholds in bytes; see dsgd_allreduce_algo */
#define DSGD__AUTO_RD_MAX ((size_t)64 * 1024)
#define DSGD__AUTO_HD_MAX ((size_t)1024 * 1024)

/* A message's tag is (seq << 32) | (piece << 12) | (phase << 10) | step, the
   same on sender and receiver; transports may check any part of it. */
enum { DSGD__PH_FOLD = 0, DSGD__PH_RS = 1, DSGD__PH_AG = 2, DSGD__PH_UNFOLD = 3 };

struct dsgd_comm {
    dsgd_ctx *ctx;
    dsgd_transport_i t;
    int rank, size;
    double timeout;   /* default timeout, s */
    size_t piece;     /* floats per pipelined piece */
    int node_ranks;   /* L: ranks per node (size: one node) */
    int view_n, view_r; /* a ring over part of the group in progress: its size and
                           this rank's place (0: none; dsgd__xchg's order) */
    uint64_t seq;     /* collectives started */
    int broken;       /* a collective failed mid-way: the protocol state is unknown */
    uint64_t broken_seq;
    /* the collective in progress: its description, which every rank must
       agree on (dsgd__coll_agree), and its name for messages */
    const char *what, *how;
    int kind, algo, op, root;
    size_t count;
    double deadline, span;
    float *scratch;
    size_t scratch_cap; /* floats */
    unsigned char *fold; /* the agreement's messages over sendrecv_upto: out, then in */
    const float *ring_pre; /* the ring's first step, received with the agreement (NULL: none) */
    int no_agree;       /* benchmarks only: skip the agreement */
    int ring_pieces;    /* benchmarks only: the ring's pieces one after another on
                           any transport (see dsgd__ring_piece) */
    void **peers;       /* size pointers, for the shared-memory hooks */
    size_t first;       /* the all-reduce in progress: the index of buf[0] in the
                           caller's whole vector (see >>map) */
    float *pack;        /* the buffer in the map's block order (see >>map) */
    size_t pack_cap;    /* floats */
    size_t *lay;        /* 4 * size + 4: the map's block sizes, places and offsets */
    int wire;           /* the all-reduce in progress: its dsgd_wire (0 for every other) */
    uint32_t xmax;      /* a half wire's exponent: this rank's largest before the
                           agreement, every rank's after it (see >>wire) */
    const dsgd__half_kernel *half; /* the conversions (half.h), chosen at creation */
    uint16_t *wv;       /* a half wire's messages: the bucket in the wire's format */
    size_t wv_cap;      /* elements */
    dsgd_comm_stats st; /* what dsgd_comm_get_stats reports */
    /* >>waits: seconds blocked, charged per peer (size doubles; see
       dsgd_comm_get_waits) */
    double *waits;
    double entered;     /* the collective in progress: when it began (its deadline's clock read) */
    int cause;          /* the agreement in progress: the rank this rank's lateness traces to */
    double late;        /* and by how much (see dsgd__agree_charge) */
    int hold;           /* 1: dsgd__xchg_bytes leaves its wait in held for the agreement to charge */
    double held;
};

DSGD_API void dsgd_block_range(size_t count, int n, int index, size_t *offset, size_t *len) {
    size_t q, rem, i;
    if (n < 1 || index < 0 || index >= n) {
        *offset = 0;
        *len = 0;
        return;
    }
    q = count / (size_t)n;
    rem = count % (size_t)n;
    i = (size_t)index;
    *offset = i * q + (i < rem ? i : rem);
    *len = q + (i < rem ? 1 : 0);
}

/* Offset of block b of n (b == n: the end). */
static size_t dsgd__block_off(size_t count, int n, int b) {
    size_t q = count / (size_t)n, rem = count % (size_t)n, i = (size_t)b;
    return i * q + (i < rem ? i : rem);
}

DSGD_API dsgd_result dsgd_comm_create(dsgd_ctx *ctx, const dsgd_transport_i *t,
                                      const dsgd_comm_desc *desc, dsgd_comm **out) {
    dsgd_comm *c;
    double timeout = DSGD_DEFAULT_TIMEOUT_S;
    size_t piece = DSGD_DEFAULT_PIECE_BYTES;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_comm_create: out is NULL");
    *out = NULL;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!t) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_comm_create: transport is NULL");
    if (t->size < 1 || t->rank < 0 || t->rank >= t->size)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_comm_create: rank %d of size %d (need size >= 1 and 0 <= rank < size)",
                                  t->rank, t->size);
    if (!t->send || !t->recv)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_comm_create: transport '%s' lacks send or recv",
                                  t->name ? t->name : "?");
    if (desc) {
        if (!(desc->timeout_s >= 0))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "dsgd_comm_create: timeout_s %g must be >= 0 (0: default)", desc->timeout_s);
        if (desc->timeout_s > 0) timeout = desc->timeout_s;
        if (desc->piece_bytes) piece = desc->piece_bytes;
        if (desc->ranks_per_node < 0 || (desc->ranks_per_node > 0 && t->size % desc->ranks_per_node != 0))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "dsgd_comm_create: ranks_per_node %d must be >= 0 and divide the size %d",
                                      desc->ranks_per_node, t->size);
    }
    if (timeout > DSGD__COMM_MAX_TIMEOUT) timeout = DSGD__COMM_MAX_TIMEOUT;
    piece /= sizeof(float);
    if (piece < 64) piece = 64;
    if (piece > ((size_t)1 << 28)) piece = (size_t)1 << 28;
    c = (dsgd_comm *)dsgd__alloc(ctx, sizeof(*c), "dsgd_comm_create");
    if (!c) return DSGD_ERR_OUT_OF_MEMORY;
    memset(c, 0, sizeof(*c));
    c->peers = (void **)dsgd__alloc(ctx, sizeof(void *) * (size_t)t->size, "dsgd_comm_create");
    c->lay = c->peers ? (size_t *)dsgd__alloc(ctx, sizeof(size_t) * (4 * (size_t)t->size + 4), "dsgd_comm_create")
                      : NULL;
    c->waits = c->lay ? (double *)dsgd__alloc(ctx, sizeof(double) * (size_t)t->size, "dsgd_comm_create") : NULL;
    if (!c->waits) {
        DSGD_FREE(c->lay);
        DSGD_FREE(c->peers);
        DSGD_FREE(c);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    c->ctx = ctx;
    c->t = *t;
    c->rank = t->rank;
    c->size = t->size;
    c->timeout = timeout;
    c->piece = piece;
    if (desc && desc->ranks_per_node)
        c->node_ranks = desc->ranks_per_node;
    else if (t->ranks_per_node > 0 && t->size % t->ranks_per_node == 0)
        c->node_ranks = t->ranks_per_node;
    else
        c->node_ranks = t->size;
    c->root = -1;
    memset(c->waits, 0, sizeof(double) * (size_t)t->size);
    c->half = dsgd__half_choose(getenv("DSGD_CPU_ISA"));
    *out = c;
    return DSGD_OK;
}

DSGD_API void dsgd_comm_destroy(dsgd_comm *c) {
    if (!c) return;
    DSGD_FREE(c->scratch);
    DSGD_FREE(c->fold);
    DSGD_FREE(c->peers);
    DSGD_FREE(c->pack);
    DSGD_FREE(c->lay);
    DSGD_FREE(c->wv);
    DSGD_FREE(c->waits);
    DSGD_FREE(c);
}

DSGD_API int dsgd_comm_rank(const dsgd_comm *c) { return c ? c->rank : -1; }
DSGD_API int dsgd_comm_size(const dsgd_comm *c) { return c ? c->size : 0; }
DSGD_API dsgd_ctx *dsgd_comm_ctx(const dsgd_comm *c) { return c ? c->ctx : NULL; }

/* Records c's errors on ctx from now on (a strategy's communication thread
   uses c with a context of its own while the replica's thread computes). */
static void dsgd__comm_set_ctx(dsgd_comm *c, dsgd_ctx *ctx) { c->ctx = ctx; }
DSGD_API uint64_t dsgd_comm_seq(const dsgd_comm *c) { return c ? c->seq : 0; }
DSGD_API int dsgd_comm_broken(const dsgd_comm *c) { return c ? c->broken : 0; }

static int dsgd__is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

DSGD_API dsgd_allreduce_algo dsgd_allreduce_choose(const dsgd_comm *c, size_t count) {
    size_t bytes = count * sizeof(float);
    if (!c || c->size == 1) return DSGD_ALLREDUCE_RING; /* nothing is exchanged */
    if (c->t.share_window && c->t.share && c->t.unshare) return DSGD_ALLREDUCE_DIRECT;
    if (c->node_ranks > 1 && c->node_ranks < c->size) return DSGD_ALLREDUCE_HIERARCHICAL;
    if (c->t.allreduce) return DSGD_ALLREDUCE_AUTO;
    if (c->t.share && c->t.unshare) return DSGD_ALLREDUCE_DIRECT;
    if (bytes <= DSGD__AUTO_RD_MAX) return DSGD_ALLREDUCE_RECURSIVE_DOUBLING;
    if (dsgd__is_pow2(c->size) && bytes <= DSGD__AUTO_HD_MAX) return DSGD_ALLREDUCE_HALVING_DOUBLING;
    return DSGD_ALLREDUCE_RING;
}

static double dsgd__comm_now(const dsgd_comm *c) { return c->t.now ? c->t.now(c->t.impl) : dsgd_now(); }

/* "dsgd_allreduce #17 (ring)", "dsgd_broadcast #3 (root 1)", "dsgd_barrier #4": the
   public function, then the collective's number */
static void dsgd__coll_name(const dsgd_comm *c, char *dst, size_t cap) {
    if (c->how)
        snprintf(dst, cap, "dsgd_%s #%llu (%s)", c->what, (unsigned long long)c->seq, c->how);
    else if (c->root >= 0)
        snprintf(dst, cap, "dsgd_%s #%llu (root %d)", c->what, (unsigned long long)c->seq, c->root);
    else
        snprintf(dst, cap, "dsgd_%s #%llu", c->what, (unsigned long long)c->seq);
}

/* Validation shared by every collective (has_op 0: it takes no op);
   records the message. */
static dsgd_result dsgd__coll_check(dsgd_comm *c, const char *what, const float *buf, size_t count, int has_op,
                                    dsgd_reduce_op op, double timeout_s) {
    if (buf == NULL && count > 0)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_%s: buf is NULL with count %zu", what,
                                  count);
    if (has_op && ((int)op < 0 || (int)op >= (int)DSGD_REDUCE_COUNT))
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_%s: unknown reduce op %d", what, (int)op);
    if (!(timeout_s >= 0))
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_%s: timeout_s %g must be >= 0 (0: the communicator's default)", what,
                                  timeout_s);
    if (count > SIZE_MAX / sizeof(float))
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_%s: count %zu is too large", what, count);
    if (c->broken)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE,
                                  "dsgd_%s: rank %d's communicator failed in collective #%llu and cannot be used "
                                  "again; create a new transport and communicator",
                                  what, c->rank, (unsigned long long)c->broken_seq);
    return DSGD_OK;
}

/* Collective kinds, as fingerprints carry them. */
enum { DSGD__K_ALLREDUCE = 1, DSGD__K_REDUCE_SCATTER, DSGD__K_ALLGATHER, DSGD__K_BROADCAST, DSGD__K_BARRIER };

static const char *dsgd__kind_name(uint64_t kind) {
    static const char *const names[] = {"?", "allreduce", "reduce_scatter", "allgather", "broadcast", "barrier"};
    return kind <= DSGD__K_BARRIER ? names[kind] : "?";
}

/* Starts collective number seq + 1 and its deadline, and records what this
   rank thinks the collective is (algo and op -1 where the kind has none,
   root -1 where it has no root). */
static void dsgd__coll_begin(dsgd_comm *c, int kind, const char *how, int algo, int op, int root, size_t count,
                             double timeout_s) {
    c->seq++;
    c->kind = kind;
    c->what = dsgd__kind_name((uint64_t)kind);
    c->how = how;
    c->algo = algo;
    c->op = op;
    c->root = root;
    c->count = count;
    c->wire = DSGD_WIRE_F32;
    c->xmax = 0;
    c->span = timeout_s > 0 ? timeout_s : c->timeout;
    if (c->span > DSGD__COMM_MAX_TIMEOUT) c->span = DSGD__COMM_MAX_TIMEOUT;
    c->entered = dsgd__comm_now(c);
    c->deadline = c->entered + c->span;
    if (c->t.set_progress) c->t.set_progress(c->t.impl, c->seq);
}

/* Records a failure of the collective in progress, naming the peer waited
   for (peer < 0: none, the native collective failed) and, when the
   transport can tell, the ranks that have not entered this collective. */
static dsgd_result dsgd__coll_fail(dsgd_comm *c, dsgd_result r, int peer) {
    char name[96], late[160];
    const char *detail;
    size_t used = 0;
    int i, listed = 0;
    dsgd__coll_name(c, name, sizeof(name));
    c->broken = 1;
    c->broken_seq = c->seq;
    late[0] = '\0';
    if (c->t.peer_progress) {
        for (i = 0; i < c->size; ++i) {
            int k;
            if (i == c->rank || c->t.peer_progress(c->t.impl, i) >= c->seq) continue;
            if (listed == 8) {
                k = snprintf(late + used, sizeof(late) - used, ", ...");
                used += k > 0 && (size_t)k < sizeof(late) - used ? (size_t)k : 0;
                break;
            }
            k = snprintf(late + used, sizeof(late) - used, "%s%d",
                         listed ? ", " : "; not yet in this collective: rank ", i);
            used += k > 0 && (size_t)k < sizeof(late) - used ? (size_t)k : 0;
            ++listed;
        }
    }
    if (r == DSGD_ERR_TIMEOUT && peer >= 0)
        return dsgd_ctx_set_error(c->ctx, r, "%s: rank %d timed out waiting for rank %d after %.2f s%s", name,
                                  c->rank, peer, c->span, late);
    detail = c->t.error_message ? c->t.error_message(c->t.impl) : "";
    if (!detail || !detail[0]) detail = dsgd_result_string(r);
    if (peer < 0) return dsgd_ctx_set_error(c->ctx, r, "%s: rank %d: %s%s", name, c->rank, detail, late);
    return dsgd_ctx_set_error(c->ctx, r, "%s: rank %d failed exchanging with rank %d: %s%s", name, c->rank, peer,
                              detail, late);
}

/* A collective could not grow a buffer of n (units, what: "floats of
   scratch"): the communicator is broken (its peers are mid-collective) and
   the error names it. */
static dsgd_result dsgd__coll_nomem(dsgd_comm *c, size_t n, const char *what) {
    char name[96];
    dsgd__coll_name(c, name, sizeof(name));
    c->broken = 1;
    c->broken_seq = c->seq;
    return dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: rank %d cannot allocate %zu %s", name, c->rank, n,
                              what);
}

static dsgd_result dsgd__scratch(dsgd_comm *c, size_t count) {
    float *p;
    if (count <= c->scratch_cap) return DSGD_OK;
    p = (float *)DSGD_REALLOC(c->scratch, count * sizeof(float));
    if (!p) return dsgd__coll_nomem(c, count, "floats of scratch");
    c->scratch = p;
    c->scratch_cap = count;
    return DSGD_OK;
}

static uint64_t dsgd__tag(const dsgd_comm *c, size_t piece, int phase, int step) {
    return (c->seq << 32) | ((uint64_t)(piece & 0xFFFFF) << 12) | ((uint64_t)phase << 10) |
           (uint64_t)(step & 0x3FF);
}

/* Counts sbytes handed to the transport (unc: the same payload as fp32). */
static void dsgd__count(dsgd_comm *c, size_t sbytes, size_t unc) {
    c->st.bytes_sent += sbytes;
    c->st.bytes_uncompressed += unc;
}

/* >>waits: a blocking call that began at t0 ends now; its time is charged
   to peer (see dsgd_comm_get_waits), or, during the agreement's rounds
   (c->hold), left in c->held for the round to charge to the rank the
   message's lateness traces to. One clock read. */
static void dsgd__waited(dsgd_comm *c, int peer, double t0) {
    double dt = dsgd__comm_now(c) - t0;
    if (c->hold) c->held += dt;
    else if (peer >= 0 && peer < c->size && peer != c->rank) c->waits[peer] += dt;
}

/* As dsgd__xchg with op < 0, in bytes; unc: the message's bytes as fp32
   (dsgd_comm_stats.bytes_uncompressed). */
static dsgd_result dsgd__xchg_bytes(dsgd_comm *c, uint64_t tag, int dst, const void *sbuf, size_t sbytes, int src,
                                    void *rbuf, size_t rbytes, size_t unc) {
    const dsgd_transport_i *t = &c->t;
    int failed = -1, send_first;
    double t0;
    dsgd_result r;
    if (dst < 0 && src < 0) return DSGD_OK;
    if (dst >= 0) dsgd__count(c, sbytes, unc);
    if (t->sendrecv) {
        t0 = dsgd__comm_now(c);
        r = t->sendrecv(t->impl, dst, tag, sbuf, sbytes, src, tag, rbuf, rbytes, c->deadline, &failed);
        dsgd__waited(c, failed >= 0 ? failed : (src >= 0 ? src : dst), t0);
        return r == DSGD_OK ? r : dsgd__coll_fail(c, r, failed >= 0 ? failed : (src >= 0 ? src : dst));
    }
    /* Only send and recv: order them so that the pairs and shifts used here
       cannot deadlock even when a send blocks until it is received. In a pair
       the lower rank sends first; in a shift by d the ranks below d send
       first (every cycle of the shift contains one of them). */
    if (dst < 0) send_first = 0;
    else if (src < 0) send_first = 1;
    else if (dst == src) send_first = c->rank < dst;
    else if (c->view_n) send_first = c->view_r == 0; /* a ring's shift by one: its first member */
    else send_first = c->rank < (dst - c->rank + c->size) % c->size;
    if (send_first) {
        t0 = dsgd__comm_now(c);
        r = t->send(t->impl, dst, tag, sbuf, sbytes, c->deadline);
        dsgd__waited(c, dst, t0);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, dst);
    }
    if (src >= 0) {
        t0 = dsgd__comm_now(c);
        r = t->recv(t->impl, src, tag, rbuf, rbytes, c->deadline);
        dsgd__waited(c, src, t0);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, src);
    }
    if (!send_first && dst >= 0) {
        t0 = dsgd__comm_now(c);
        r = t->send(t->impl, dst, tag, sbuf, sbytes, c->deadline);
        dsgd__waited(c, dst, t0);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, dst);
    }
    return DSGD_OK;
}

/* One step: send scount floats of sbuf to dst and receive rcount floats from
   src into rbuf (copied when op < 0, reduced into rbuf otherwise); dst or src
   -1 skips that half. Both halves carry the same tag. Records the error. */
static dsgd_result dsgd__xchg(dsgd_comm *c, uint64_t tag, int dst, const float *sbuf, size_t scount, int src,
                              float *rbuf, size_t rcount, int op) {
    const dsgd_transport_i *t = &c->t;
    size_t sbytes = scount * sizeof(float);
    int failed = -1;
    dsgd_result r;
    if (op >= 0 && src >= 0) {
        if (t->sendrecv_reduce) {
            double t0;
            if (dst >= 0) dsgd__count(c, sbytes, sbytes);
            t0 = dsgd__comm_now(c);
            r = t->sendrecv_reduce(t->impl, dst, tag, sbuf, sbytes, src, tag, rbuf, rcount, (dsgd_reduce_op)op,
                                   c->deadline, &failed);
            dsgd__waited(c, failed >= 0 ? failed : src, t0);
            return r == DSGD_OK ? r : dsgd__coll_fail(c, r, failed >= 0 ? failed : src);
        }
        /* No zero-copy hook: receive into scratch, then reduce. */
        r = dsgd__scratch(c, rcount);
        if (r != DSGD_OK) return r;
        r = dsgd__xchg_bytes(c, tag, dst, sbuf, sbytes, src, c->scratch, rcount * sizeof(float), sbytes);
        if (r == DSGD_OK) dsgd__reduce_into(rbuf, c->scratch, rcount, (dsgd_reduce_op)op, 0);
        return r;
    }
    return dsgd__xchg_bytes(c, tag, dst, sbuf, sbytes, src, rbuf, rcount * sizeof(float), sbytes);
}

/* >>stats ------------------------------------------------------------------ */

DSGD_API void dsgd_comm_get_stats(const dsgd_comm *c, dsgd_comm_stats *out) {
    if (!out) return;
    if (c) *out = c->st;
    else memset(out, 0, sizeof(*out));
}

DSGD_API void dsgd_comm_reset_stats(dsgd_comm *c) {
    if (!c) return;
    memset(&c->st, 0, sizeof(c->st));
    memset(c->waits, 0, sizeof(double) * (size_t)c->size);
}

DSGD_API dsgd_result dsgd_comm_get_waits(const dsgd_comm *c, double *per_peer, int n) {
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if (!per_peer || n < c->size)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_comm_get_waits: per_peer %s with n %d (need room for the size, %d)",
                                  per_peer ? "given" : "NULL", n, c->size);
    memcpy(per_peer, c->waits, sizeof(double) * (size_t)c->size);
    return DSGD_OK;
}

DSGD_API void dsgd_comm_stats_add(dsgd_comm *c, const dsgd_comm_stats *extra) {
    if (!c || !extra) return;
    c->st.bytes_sent += extra->bytes_sent;
    c->st.bytes_uncompressed += extra->bytes_uncompressed;
    c->st.compress_s += extra->compress_s;
    c->st.comm_s += extra->comm_s;
}

DSGD_API dsgd_result dsgd_comm_charge_codec(dsgd_comm *c, size_t floats) {
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    return c->t.charge_codec && floats ? c->t.charge_codec(c->t.impl, floats) : DSGD_OK;
}

/* The time of a collective from its start to its return, on the
   communicator's clock, into comm_s. */
static dsgd_result dsgd__coll_timed(dsgd_comm *c, double t0, dsgd_result res) {
    c->st.comm_s += dsgd__comm_now(c) - t0;
    return res;
}

#endif /* DSGD__PART_COLLECTIVES_IMPL */
