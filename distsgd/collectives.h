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

static dsgd_result dsgd__scratch(dsgd_comm *c, size_t count) {
    float *p;
    if (count <= c->scratch_cap) return DSGD_OK;
    p = (float *)DSGD_REALLOC(c->scratch, count * sizeof(float));
    if (!p) {
        char name[96];
        dsgd__coll_name(c, name, sizeof(name));
        c->broken = 1;
        c->broken_seq = c->seq;
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: rank %d cannot allocate %zu floats of scratch",
                                  name, c->rank, count);
    }
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

/* >>agreement -------------------------------------------------------------- */
/* Before a collective moves any data, the ranks agree on what it is: every
   rank's fingerprint (the fields below) must be equal, or every rank returns
   DSGD_ERR_DESYNC naming two ranks that differ, having touched no buffer.
   Message passing: a dissemination exchange (ceil(log2 N) rounds, as the
   barrier; the butterfly at N a power of two over sendrecv_upto, see
   >>fold) carries the smallest and the largest fingerprint seen so far, with
   their ranks; after the last round every rank holds the same pair, so every
   rank reaches the same verdict. Shared memory (DIRECT): each rank publishes
   its fingerprint beside its buffer and reads the others', at no extra cost.
   Fields are compared in this order, so seq differences are reported first. */
enum { DSGD__FP_SEQ, DSGD__FP_KIND, DSGD__FP_COUNT, DSGD__FP_OP, DSGD__FP_ROOT, DSGD__FP_ALGO, DSGD__FP_PIECE,
       DSGD__FP_NODE, DSGD__FP_N };
/* the tag's piece field marking the agreement's messages */
#define DSGD__AGREE_PIECE 0xFFFFF

typedef struct dsgd__fp_range {
    uint64_t lo[DSGD__FP_N], hi[DSGD__FP_N]; /* smallest and largest fingerprint seen */
    uint32_t lo_rank, hi_rank;               /* the lowest rank holding each */
    /* low 8 bits: the largest exponent field seen (a half wire's scale,
       see >>wire; merged by MAX); the rest: the rank the sender's
       lateness traces to (see >>waits; not merged) */
    uint32_t xc;
    float late; /* how late the sender is for that rank, in seconds (>>waits) */
} dsgd__fp_range;
#define DSGD__XMAX(xc) ((xc) & 0xFFu)

static void dsgd__fp_fill(const dsgd_comm *c, uint64_t *fp) {
    fp[DSGD__FP_SEQ] = c->seq;
    fp[DSGD__FP_KIND] = (uint64_t)c->kind;
    fp[DSGD__FP_COUNT] = (uint64_t)c->count;
    fp[DSGD__FP_OP] = (uint64_t)(int64_t)c->op;
    /* an all-reduce has no root: the field carries its first element (see
       >>map), which every rank must agree on as well */
    fp[DSGD__FP_ROOT] = c->kind == DSGD__K_ALLREDUCE ? (uint64_t)c->first : (uint64_t)(int64_t)c->root;
    /* a half wire rides in the algorithm's field: ring + 256 * wire */
    fp[DSGD__FP_ALGO] = (uint64_t)(int64_t)c->algo + ((uint64_t)c->wire << 8);
    fp[DSGD__FP_PIECE] = (uint64_t)c->piece;
    fp[DSGD__FP_NODE] = (uint64_t)c->node_ranks;
}

/* -1, 0, 1: a before, equal to, after b, lexicographically. */
static int dsgd__fp_cmp(const uint64_t *a, const uint64_t *b) {
    int i;
    for (i = 0; i < DSGD__FP_N; ++i)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* Takes the smallest and the largest fingerprint of acc and (lo, hi), each
   with the lowest rank that holds it, so the result does not depend on the
   order of merging. */
static void dsgd__fp_merge(dsgd__fp_range *acc, const uint64_t *lo, uint64_t lo_rank, const uint64_t *hi,
                           uint64_t hi_rank) {
    int cl = dsgd__fp_cmp(lo, acc->lo), ch = dsgd__fp_cmp(hi, acc->hi);
    if (cl < 0 || (cl == 0 && lo_rank < acc->lo_rank)) {
        memcpy(acc->lo, lo, sizeof(acc->lo));
        acc->lo_rank = (uint32_t)lo_rank;
    }
    if (ch > 0 || (ch == 0 && hi_rank < acc->hi_rank)) {
        memcpy(acc->hi, hi, sizeof(acc->hi));
        acc->hi_rank = (uint32_t)hi_rank;
    }
}

static void dsgd__fp_init(const dsgd_comm *c, dsgd__fp_range *acc) {
    dsgd__fp_fill(c, acc->lo);
    memcpy(acc->hi, acc->lo, sizeof(acc->hi));
    acc->lo_rank = acc->hi_rank = (uint32_t)c->rank;
    acc->xc = (c->xmax & 0xFFu) | ((uint32_t)c->rank << 8);
    acc->late = 0.0f;
}

/* >>waits in the agreement. Its rounds pass every rank's lateness on: a
   rank that waits X for the straggler in round 0 sends its round 1 late by
   X, and whoever waits for that message waits for the straggler, not for
   the messenger. So each message says for whom its sender is late and by
   how much (dsgd__fp_range: the cause in xc's high bits, late): the
   receiver charges up to `late` of its wait to that rank and the rest to
   the sender (its own lateness, or the message's time), and carries on
   the larger of the two parts (summed while the cause stays the same).
   A straggler waits for no message (they are all in when it comes), so
   it carries itself with 0 and every wait for it is charged to it. */
static void dsgd__agree_start(dsgd_comm *c) {
    c->cause = c->rank;
    c->late = 0.0;
}
static void dsgd__agree_note(dsgd_comm *c, int who, double part) {
    if (who == c->cause) c->late += part;
    else if (part > c->late) {
        c->cause = who;
        c->late = part;
    }
}
static void dsgd__agree_charge(dsgd_comm *c, int src, uint32_t xc, float late, double dt) {
    uint32_t cause = xc >> 8;
    int k = cause < (uint32_t)c->size && cause != (uint32_t)c->rank ? (int)cause : src;
    /* late travels as a float: its rounding (2^-24 relative) is not the sender's; 2^-22 */
    double a = late > 0.0f && late < 1e30f ? DSGD__MIN((double)late * (1.0 + 2.384185791015625e-7), dt) : 0.0, b;
    if (!(dt > 0.0) || src < 0 || src >= c->size || src == c->rank) return;
    if (!(a > 0.0)) a = 0.0;
    b = dt - a;
    c->waits[k] += a;
    c->waits[src] += b;
    if (a >= b) dsgd__agree_note(c, k, a);
    else dsgd__agree_note(c, src, b);
}
/* What this rank's next message says (see dsgd__agree_charge). */
static void dsgd__agree_mark(const dsgd_comm *c, dsgd__fp_range *acc) {
    acc->xc = DSGD__XMAX(acc->xc) | ((uint32_t)c->cause << 8);
    acc->late = (float)c->late;
}

/* Field i of a fingerprint as text, after its label. */
static const char *dsgd__fp_field(int i, uint64_t v, char *buf, size_t cap) {
    switch (i) {
    case DSGD__FP_KIND: return dsgd__kind_name(v);
    case DSGD__FP_OP: return dsgd_reduce_op_name((dsgd_reduce_op)(int64_t)v);
    case DSGD__FP_ALGO:
        if (v >> 8 && v >> 8 < DSGD_WIRE_COUNT) { /* a half wire (see dsgd__fp_fill) */
            snprintf(buf, cap, "%s on the %s wire", dsgd_allreduce_algo_name((dsgd_allreduce_algo)(v & 0xFF)),
                     dsgd_wire_name((dsgd_wire)(v >> 8)));
            return buf;
        }
        return v == DSGD_ALLREDUCE_AUTO ? "native" : dsgd_allreduce_algo_name((dsgd_allreduce_algo)v);
    case DSGD__FP_ROOT: snprintf(buf, cap, "%lld", (long long)(int64_t)v); return buf;
    case DSGD__FP_PIECE: v *= sizeof(float); break; /* kept in floats, shown in bytes */
    default: break;
    }
    snprintf(buf, cap, "%llu", (unsigned long long)v);
    return buf;
}

/* Appends "rank R passed count 1000, op sum" (the fields where fp differs
   from other) to dst. */
static void dsgd__fp_describe(char *dst, size_t cap, uint64_t rank, const uint64_t *fp, const uint64_t *other) {
    static const char *const label[DSGD__FP_N] = {"is in collective #", "is in ", "count ", "op ",
                                                  "root ", "algorithm ", "piece bytes ", "ranks per node "};
    size_t used = 0;
    int i, k, first = 1;
    k = snprintf(dst, cap, "rank %llu", (unsigned long long)rank);
    used += k > 0 && (size_t)k < cap ? (size_t)k : 0;
    for (i = 0; i < DSGD__FP_N; ++i) {
        char v[48];
        int at = i == DSGD__FP_ROOT && fp[DSGD__FP_KIND] == DSGD__K_ALLREDUCE; /* the root field holds first */
        if (fp[i] == other[i]) continue;
        k = snprintf(dst + used, cap - used, "%s%s%s%s", first ? " " : ", ",
                     i >= DSGD__FP_COUNT && first ? "passed " : "", at ? "first element " : label[i],
                     at ? dsgd__fp_field(DSGD__FP_COUNT, fp[i], v, sizeof(v)) : dsgd__fp_field(i, fp[i], v, sizeof(v)));
        used += k > 0 && (size_t)k < cap - used ? (size_t)k : 0;
        first = 0;
        if (i <= DSGD__FP_KIND) break; /* another collective: its other fields mean nothing here */
    }
}

/* DSGD_OK when every rank holds the same fingerprint; otherwise records the
   disagreement and returns DSGD_ERR_DESYNC. The ranks reached the same
   verdict and moved no data, so the communicator stays usable, unless they
   are in collectives of different numbers (then it is broken: every later
   collective would pair them up wrongly). */
static dsgd_result dsgd__fp_verdict(dsgd_comm *c, const dsgd__fp_range *acc) {
    char name[96], lo[192], hi[192];
    c->xmax = DSGD__XMAX(acc->xc); /* every rank's largest: the same on all after the last round */
    if (dsgd__fp_cmp(acc->lo, acc->hi) == 0) return DSGD_OK;
    dsgd__coll_name(c, name, sizeof(name));
    dsgd__fp_describe(hi, sizeof(hi), acc->hi_rank, acc->hi, acc->lo);
    dsgd__fp_describe(lo, sizeof(lo), acc->lo_rank, acc->lo, acc->hi);
    if (acc->lo[DSGD__FP_SEQ] != acc->hi[DSGD__FP_SEQ]) {
        c->broken = 1;
        c->broken_seq = c->seq;
    }
    return dsgd_ctx_set_error(c->ctx, DSGD_ERR_DESYNC,
                              "%s: rank %d: the ranks disagree on the collective: %s; %s; no buffer was touched",
                              name, c->rank, lo, hi);
}

/* The message-passing agreement (see above), over send and recv; also the
   barrier. */
static dsgd_result dsgd__coll_agree_plain(dsgd_comm *c) {
    dsgd__fp_range acc, in;
    int n = c->size, r = c->rank, d, step;
    dsgd_result res;
    dsgd__fp_init(c, &acc);
    dsgd__agree_start(c);
    for (d = 1, step = 0; d < n; d <<= 1, ++step) {
        dsgd__agree_mark(c, &acc);
        c->hold = 1;
        c->held = 0.0;
        /* 144 bytes of integers, carried as 36 floats and only ever copied */
        res = dsgd__xchg(c, dsgd__tag(c, DSGD__AGREE_PIECE, DSGD__PH_FOLD, step), (r + d) % n,
                         (const float *)(const void *)&acc, sizeof(acc) / sizeof(float), (r - d + n) % n,
                         (float *)(void *)&in, sizeof(in) / sizeof(float), -1);
        c->hold = 0;
        if (res == DSGD_OK) dsgd__agree_charge(c, (r - d + n) % n, in.xc, in.late, c->held);
        else dsgd__agree_charge(c, (r - d + n) % n, (uint32_t)c->rank << 8, 0.0f, c->held);
        if (res != DSGD_OK) return res;
        dsgd__fp_merge(&acc, in.lo, in.lo_rank, in.hi, in.hi_rank);
        if (DSGD__XMAX(in.xc) > DSGD__XMAX(acc.xc)) acc.xc = (acc.xc & ~0xFFu) | DSGD__XMAX(in.xc);
    }
    return dsgd__fp_verdict(c, &acc);
}

/* >>fold ------------------------------------------------------------------- */
/* With sendrecv_upto the agreement's rounds also carry an algorithm's first
   exchanges, so a collective pays no round trip of its own for its
   fingerprint: each message is the range so far and the number of floats
   that follow, then those floats (at most DSGD__FOLD_MAX), received into
   room for the most. The rounds' pattern depends only on N: partner
   r XOR 2^k when N is a power of two (the butterfly), else the
   dissemination's r + 2^k and r - 2^k, so every rank runs the same rounds
   whatever it thinks the collective is. Recursive doubling (N a power of
   two) and a broadcast (any N) ride every round; the ring's first step
   rides round 0 when that round's peers are the ring's (N = 2, or N not a
   power of two). A payload
   is used only while the range merged so far is one fingerprint (the
   sender's group agrees with this rank), and only in scratch memory: the
   caller's buffer is written after the verdict, so a DESYNC still touches
   no buffer and leaves the communicator usable. */
#define DSGD__FOLD_MAX 4096 /* floats a round carries (16 KiB) */

typedef struct dsgd__agree_head {
    dsgd__fp_range range;
    uint64_t nfloats; /* the payload that follows */
} dsgd__agree_head;
#define DSGD__FOLD_MSG (sizeof(dsgd__agree_head) + DSGD__FOLD_MAX * sizeof(float))

/* What an algorithm sends with the agreement's first `rounds` rounds, nout
   floats out and nin floats expected in each, in one of two ways.
   Broadcast (every round): with vr this rank's place relative to the
   root (r - root mod N; r XOR root for the butterfly), the ranks below 2^k
   hold the data at round k and send it to their partner (vr + 2^k), which
   keeps it in acc; base gets it after the verdict.
   Keep (reduce 0, one round): out is sent; the payload received stays in
   the comm's fold buffer, at *got after the agreement.
   Reduce (recursive doubling, every round): round 0 sends base, the
   caller's buffer, and round k > 0 sends acc (scratch); the payload of
   round k is reduced into acc as op(base or acc, payload) in the
   butterfly's operand order, except the last round's, which goes into
   base, after the verdict: base is written only when every rank agreed. */
typedef struct dsgd__carry {
    int rounds;
    size_t nout, nin;
    const float *out;
    const float *got;
    int reduce;
    float *base, *acc;
    dsgd_reduce_op op;
    int bcast; /* a broadcast of nout floats from the rank at vr 0 (see dsgd__bcast_agreed) */
    int vr;
} dsgd__carry;

static int dsgd__agree_butterfly(const dsgd_comm *c) { return dsgd__is_pow2(c->size); }

/* t[i] = op(a[i], b[i]), or op(b[i], a[i]) when b_first; t may be a. */
static void dsgd__reduce_to(float *t, const float *a, const float *b, size_t n, dsgd_reduce_op op, int b_first) {
    size_t i;
    if (op == DSGD_REDUCE_SUM || op == DSGD_REDUCE_MEAN) {
        if (b_first)
            for (i = 0; i < n; ++i) t[i] = b[i] + a[i];
        else
            for (i = 0; i < n; ++i) t[i] = a[i] + b[i];
        return;
    }
    if (t != a) memcpy(t, a, n * sizeof(float));
    dsgd__reduce_into(t, b, n, op, b_first);
}

/* The agreement over sendrecv_upto, carrying cr (NULL: nothing). Round 0
   receives into the first half of the fold buffer's receiving part, later
   rounds into the second, so round 0's payload survives them. */
static dsgd_result dsgd__coll_agree_carry(dsgd_comm *c, dsgd__carry *cr) {
    const dsgd_transport_i *t = &c->t;
    const size_t H = sizeof(dsgd__agree_head);
    const float *last = NULL;
    dsgd__fp_range acc;
    dsgd__agree_head head;
    int n = c->size, r = c->rank, d, step, bfly = dsgd__agree_butterfly(c), tainted = 0, last_src = 0;
    dsgd_result res;
    if (!c->fold && !(c->fold = (unsigned char *)DSGD_MALLOC(3 * DSGD__FOLD_MSG))) {
        char name[96];
        dsgd__coll_name(c, name, sizeof(name));
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: rank %d cannot allocate %zu bytes", name,
                                  c->rank, 3 * DSGD__FOLD_MSG);
    }
    dsgd__fp_init(c, &acc);
    dsgd__agree_start(c);
    for (d = 1, step = 0; d < n; d <<= 1, ++step) {
        int dst = bfly ? r ^ d : (r + d) % n, src = bfly ? r ^ d : (r - d + n) % n, failed = -1;
        double t0;
        int carries = cr && step < cr->rounds;
        unsigned char *out = c->fold, *in = c->fold + (step ? 2 : 1) * DSGD__FOLD_MSG;
        const float *payload = (const float *)(const void *)(in + H), *from;
        size_t nout = carries && !tainted ? cr->nout : 0, nin = carries ? cr->nin : 0, got = 0;
        if (carries && cr->bcast) { /* holders send, the next 2^k receive */
            nout = !tainted && cr->vr < d && (bfly || cr->vr + d < n) ? cr->nout : 0;
            nin = cr->vr >= d && cr->vr < 2 * d ? cr->nin : 0;
        }
        from = cr && cr->bcast ? (cr->vr ? cr->acc : cr->base) : cr && cr->reduce ? (step ? cr->acc : cr->base)
                                                                                : cr ? cr->out : NULL;
        dsgd__agree_mark(c, &acc);
        head.range = acc;
        head.nfloats = nout;
        memcpy(out, &head, H);
        if (nout) memcpy(out + H, from, nout * sizeof(float));
        dsgd__count(c, H + nout * sizeof(float), H + nout * sizeof(float));
        t0 = dsgd__comm_now(c);
        res = t->sendrecv_upto(t->impl, dst, dsgd__tag(c, DSGD__AGREE_PIECE, DSGD__PH_FOLD, step), out,
                               H + nout * sizeof(float), src, dsgd__tag(c, DSGD__AGREE_PIECE, DSGD__PH_FOLD, step),
                               in, DSGD__FOLD_MSG, &got, c->deadline, &failed);
        if (res == DSGD_OK && got >= H) memcpy(&head, in, H);
        if (res == DSGD_OK && got >= H)
            dsgd__agree_charge(c, src, head.range.xc, head.range.late, dsgd__comm_now(c) - t0);
        else
            dsgd__agree_charge(c, failed >= 0 && failed != r ? failed : src, (uint32_t)r << 8, 0.0f,
                               dsgd__comm_now(c) - t0);
        if (res != DSGD_OK) return dsgd__coll_fail(c, res, failed >= 0 ? failed : src);
        if (got < H || head.nfloats > DSGD__FOLD_MAX || got != H + head.nfloats * sizeof(float)) {
            char name[96];
            dsgd__coll_name(c, name, sizeof(name));
            c->broken = 1;
            c->broken_seq = c->seq;
            return dsgd_ctx_set_error(c->ctx, DSGD_ERR_DESYNC,
                                      "%s: rank %d: the agreement's message from rank %d has %zu bytes, not a "
                                      "fingerprint and its payload (an endpoint without sendrecv_upto, or "
                                      "another build of distsgd?)",
                                      name, c->rank, src, got);
        }
        dsgd__fp_merge(&acc, head.range.lo, head.range.lo_rank, head.range.hi, head.range.hi_rank);
        if (DSGD__XMAX(head.range.xc) > DSGD__XMAX(acc.xc))
            acc.xc = (acc.xc & ~0xFFu) | DSGD__XMAX(head.range.xc);
        if (!carries) continue;
        if (tainted || dsgd__fp_cmp(acc.lo, acc.hi) != 0 || head.nfloats != nin) {
            tainted = 1; /* another collective: its payload means nothing here */
            continue;
        }
        if (cr->bcast) {
            if (nin) memcpy(cr->acc, payload, nin * sizeof(float));
        } else if (!cr->reduce)
            cr->got = payload;
        else if (step + 1 < cr->rounds)
            dsgd__reduce_to(cr->acc, step ? cr->acc : cr->base, payload, cr->nin, cr->op, src < r);
        else {
            last = payload;
            last_src = src;
        }
    }
    res = dsgd__fp_verdict(c, &acc);
    if (res == DSGD_OK && cr && cr->rounds && tainted) { /* one fingerprint everywhere, a payload of another size */
        char name[96];
        dsgd__coll_name(c, name, sizeof(name));
        c->broken = 1;
        c->broken_seq = c->seq;
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE, "%s: rank %d: a payload of the agreement had another size "
                                  "than every rank's fingerprint implies", name, c->rank);
    }
    if (res == DSGD_OK && last) /* every rank agreed: the result goes into the caller's buffer */
        dsgd__reduce_to(cr->base, cr->rounds > 1 ? cr->acc : cr->base, last, cr->nin, cr->op, last_src < r);
    if (res == DSGD_OK && cr && cr->bcast && cr->vr) memcpy(cr->base, cr->acc, cr->nin * sizeof(float));
    return res;
}

/* The agreement: carried by sendrecv_upto when the transport has it. */
static dsgd_result dsgd__coll_agree(dsgd_comm *c) {
    return c->t.sendrecv_upto ? dsgd__coll_agree_carry(c, NULL) : dsgd__coll_agree_plain(c);
}

/* Block b of count elements in n blocks: bo[b] .. bo[b + 1] when bo (the
   map's blocks, see >>map), else dsgd_block_range's. */
static void dsgd__block_at(size_t count, int n, const size_t *bo, int b, size_t *off, size_t *len) {
    if (bo) {
        *off = bo[b];
        *len = bo[b + 1] - bo[b];
    } else
        dsgd_block_range(count, n, b, off, len);
}

/* The largest block (see dsgd__block_at). */
static size_t dsgd__block_max(size_t count, int n, const size_t *bo) {
    size_t mx = 0;
    int b;
    if (!bo) return count / (size_t)n + (count % (size_t)n != 0);
    for (b = 0; b < n; ++b)
        if (bo[b + 1] - bo[b] > mx) mx = bo[b + 1] - bo[b];
    return mx;
}

/* Piece j of block b (count elements in n blocks as dsgd__block_at, pieces
   of P floats). */
static void dsgd__piece(size_t count, int n, const size_t *bo, int b, size_t j, size_t P, size_t *off, size_t *len) {
    size_t bo_, bl, lo;
    dsgd__block_at(count, n, bo, b, &bo_, &bl);
    lo = j * P;
    *off = bo_ + (lo < bl ? lo : bl);
    *len = lo < bl ? DSGD__MIN(P, bl - lo) : 0;
}

/* A ring's members: n ranks, base + i * stride for i in [0, n), this rank
   being member r (the whole group: n = size, base 0, stride 1). */
typedef struct dsgd__ring_view {
    int n, r, base, stride;
} dsgd__ring_view;

/* Floats per message of a ring of n over count floats. Across address
   spaces every message pays the network's latency (alpha), so a step
   moves its whole block in one message, which the transport pipelines
   (MPI's fragments, TCP's window; simnet charges alpha + bytes * beta
   once): alpha once per step, not once per piece and step. Ranks in one
   address space (share without share_window: the loopback) have no
   latency to save, and there pieces of P floats, each through the whole
   ring before the next, keep the piece a rank has just reduced in cache
   for the next rank (at 64 MiB on 4 threads 1.4x faster than whole
   blocks; at 4 MiB 2.5x slower, but AUTO runs DIRECT there). */
static size_t dsgd__ring_piece(const dsgd_comm *c, size_t maxlen) {
    int one_space = c->t.share && c->t.unshare && !c->t.share_window;
    if ((c->ring_pieces || one_space) && c->piece < maxlen) return c->piece;
    return maxlen ? maxlen : 1;
}

/* >>map -------------------------------------------------------------------- */
/* The global element map: an all-reduce of buf[0..count) that is part of a
   larger vector (dsgd_allreduce_at's first: the index of buf[0] in it)
   gives element g of that vector (g = first + i) to virtual block
   v(g) = (g / DSGD_ALLREDUCE_CHUNK) mod N, chunk-cyclic. The ring sums
   virtual block v, wherever its elements lie in the bucket, as it sums
   block v (from rank v + 1 round to rank v), and the hierarchical
   all-reduce gives it to local rank v mod L and, across the nodes, to node
   v / L, so an element's reduction order depends on g alone, not on how
   the vector is cut into buckets, and every block of a bucket is within one
   chunk of count / N. The algorithms run on the bucket packed in the
   blocks' order (into the comm's pack buffer, count floats, grown and
   reused, never shrunk), then unpacked; a bucket whose chunks already lie
   in that order (one chunk, or the first N chunks from a multiple of N) is
   used in place. */

/* Virtual block v's place in the packed order: v = l + L m goes to
   l * M + m (L = n, M = 1: v itself). */
static int dsgd__map_slot(int v, int L, int M) { return (v % L) * M + v / L; }

/* Fills sz[0..n) (virtual block v's elements in [first, first + count))
   and pos[0..n) (where block v starts in the packed order); returns 1 when
   packing is the identity (the chunks' slots increase along the bucket). */
static int dsgd__map_layout(size_t first, size_t count, int n, int L, size_t *sz, size_t *pos) {
    const size_t C = DSGD_ALLREDUCE_CHUNK;
    size_t g = first, end = first + count, acc = 0;
    int v, s, M = n / L, last = -1, ident = 1;
    for (v = 0; v < n; ++v) sz[v] = 0;
    while (g < end) {
        size_t k = g / C, e = DSGD__MIN((k + 1) * C, end);
        v = (int)(k % (size_t)n);
        s = dsgd__map_slot(v, L, M);
        if (s <= last) ident = 0;
        last = s;
        sz[v] += e - g;
        g = e;
    }
    for (s = 0; s < n; ++s) {
        v = (s / M) + L * (s % M);
        pos[v] = acc;
        acc += sz[v];
    }
    return ident;
}

/* Copies between buf (the bucket) and packed (blocks in slot order, block
   v from pos[v]); to_packed 1: buf to packed; cur: n cursors. */
static void dsgd__map_copy(float *buf, float *packed, size_t first, size_t count, int n, const size_t *pos,
                           size_t *cur, int to_packed) {
    const size_t C = DSGD_ALLREDUCE_CHUNK;
    size_t g = first, end = first + count;
    int v;
    for (v = 0; v < n; ++v) cur[v] = pos[v];
    while (g < end) {
        size_t k = g / C, e = DSGD__MIN((k + 1) * C, end);
        v = (int)(k % (size_t)n);
        if (to_packed)
            memcpy(packed + cur[v], buf + (g - first), (e - g) * sizeof(float));
        else
            memcpy(buf + (g - first), packed + cur[v], (e - g) * sizeof(float));
        cur[v] += e - g;
        g = e;
    }
}

/* The all-reduce in progress (c->first, count floats) laid out for L local
   ranks of M = size / L nodes: *x is buf itself or the packed copy (in the
   comm's pack buffer), and c->lay holds sz (size), pos (size), the
   cursors (size), then the offsets of the L node blocks (L + 1) in *x.
   Reads buf only. */
static dsgd_result dsgd__map_pack(dsgd_comm *c, float *buf, size_t count, int L, float **x) {
    int n = c->size, l;
    size_t *sz = c->lay, *pos = sz + n, *cur = pos + n, *bo = cur + n;
    int ident = dsgd__map_layout(c->first, count, n, L, sz, pos);
    for (l = 0; l < L; ++l) bo[l] = pos[l];
    bo[L] = count;
    *x = buf;
    if (ident) return DSGD_OK;
    if (count > c->pack_cap) {
        float *p = (float *)DSGD_REALLOC(c->pack, count * sizeof(float));
        if (!p) {
            char name[96];
            dsgd__coll_name(c, name, sizeof(name));
            c->broken = 1;
            c->broken_seq = c->seq;
            return dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY,
                                      "%s: rank %d cannot allocate %zu floats to lay out the blocks", name, c->rank,
                                      count);
        }
        c->pack = p;
        c->pack_cap = count;
    }
    dsgd__map_copy(buf, c->pack, c->first, count, n, pos, cur, 1);
    *x = c->pack;
    return DSGD_OK;
}

/* The results back from the packed copy x into buf (nothing when x is
   buf). */
static void dsgd__map_unpack(dsgd_comm *c, float *buf, size_t count, const float *x) {
    int n = c->size;
    if (x == buf) return;
    dsgd__map_copy(buf, c->pack, c->first, count, n, c->lay + n, c->lay + 2 * n, 0);
}

/* Ring over blocks: phases bit 1 = reduce-scatter (member r ends owning
   block r), bit 2 = all-gather. Each block is cut into pieces of
   dsgd__ring_piece floats (most often one piece, the whole block), and piece j of
   every block goes through both phases before piece j + 1. Pieces never
   change which rank reduces an element or in what order, so the bits do
   not depend on their size. Empty pieces (short blocks) are skipped by
   both sides. */
static dsgd_result dsgd__ring_in(dsgd_comm *c, const dsgd__ring_view *v, float *buf, size_t count, const size_t *bo,
                                 dsgd_reduce_op op, int phases) {
    int n = v->n, r = v->r, k;
    int next = v->base + ((r + 1) % n) * v->stride, prev = v->base + ((r + n - 1) % n) * v->stride;
    size_t maxlen = dsgd__block_max(count, n, bo), P = dsgd__ring_piece(c, maxlen), npieces, j;
    dsgd_result res = DSGD_OK;
    npieces = (maxlen + P - 1) / P;
    c->view_n = n;
    c->view_r = r;
    for (j = 0; j < npieces && res == DSGD_OK; ++j) {
        size_t so, sl, ro, rl;
        if (phases & 1) {
            for (k = 0; k < n - 1; ++k) {
                int sb = ((r - k - 1) % n + n) % n, rb = ((r - k - 2) % n + n) % n;
                dsgd__piece(count, n, bo, sb, j, P, &so, &sl);
                dsgd__piece(count, n, bo, rb, j, P, &ro, &rl);
                if (c->ring_pre) { /* this step rode the agreement (see >>fold) */
                    dsgd__reduce_into(buf + ro, c->ring_pre, rl, op, 0);
                    c->ring_pre = NULL;
                    continue;
                }
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, k), sl ? next : -1, buf + so, sl,
                                 rl ? prev : -1, buf + ro, rl, (int)op);
                if (res != DSGD_OK) break;
            }
            if (res == DSGD_OK && op == DSGD_REDUCE_MEAN) {
                dsgd__piece(count, n, bo, r, j, P, &ro, &rl);
                dsgd__divide(buf + ro, rl, n);
            }
        }
        if (res == DSGD_OK && (phases & 2)) {
            for (k = 0; k < n - 1; ++k) {
                int sb = ((r - k) % n + n) % n, rb = ((r - k - 1) % n + n) % n;
                dsgd__piece(count, n, bo, sb, j, P, &so, &sl);
                dsgd__piece(count, n, bo, rb, j, P, &ro, &rl);
                if (c->ring_pre) { /* an all-gather's first step rode the agreement */
                    if (rl) memcpy(buf + ro, c->ring_pre, rl * sizeof(float));
                    c->ring_pre = NULL;
                    continue;
                }
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_AG, k), sl ? next : -1, buf + so, sl,
                                 rl ? prev : -1, buf + ro, rl, -1);
                if (res != DSGD_OK) break;
            }
        }
    }
    c->view_n = 0;
    return res;
}

/* The ring of the whole group (bo: as dsgd__ring_in). */
static dsgd_result dsgd__ring(dsgd_comm *c, float *buf, size_t count, const size_t *bo, dsgd_reduce_op op,
                              int phases) {
    dsgd__ring_view v;
    v.n = c->size;
    v.r = c->rank;
    v.base = 0;
    v.stride = 1;
    return dsgd__ring_in(c, &v, buf, count, bo, op, phases);
}

/* The agreement, then the ring of the whole group (phases as dsgd__ring_in).
   When the agreement's round 0 goes to the ring's next rank and comes from
   its previous one (N = 2, or N not a power of two: see >>fold), it carries
   the ring's first step of piece 0, which ring_in then takes from
   ring_pre. */
static dsgd_result dsgd__ring_agreed(dsgd_comm *c, float *buf, size_t count, const size_t *bo, dsgd_reduce_op op,
                                     int phases) {
    int n = c->size, r = c->rank, sb, rb;
    size_t so, sl, ro, rl, P;
    dsgd__carry cr;
    dsgd_result res;
    if (c->no_agree) return count ? dsgd__ring(c, buf, count, bo, op, phases) : DSGD_OK;
    if (!c->t.sendrecv_upto || count == 0 || (n > 2 && dsgd__agree_butterfly(c))) {
        res = dsgd__coll_agree(c);
        return res != DSGD_OK || count == 0 ? res : dsgd__ring(c, buf, count, bo, op, phases);
    }
    sb = phases & 1 ? (r - 1 + n) % n : r;
    rb = phases & 1 ? (r - 2 + 2 * n) % n : (r - 1 + n) % n;
    P = dsgd__ring_piece(c, dsgd__block_max(count, n, bo));
    dsgd__piece(count, n, bo, sb, 0, P, &so, &sl);
    dsgd__piece(count, n, bo, rb, 0, P, &ro, &rl);
    if (sl > DSGD__FOLD_MAX || rl > DSGD__FOLD_MAX) {
        res = dsgd__coll_agree(c);
        return res != DSGD_OK ? res : dsgd__ring(c, buf, count, bo, op, phases);
    }
    memset(&cr, 0, sizeof(cr));
    cr.rounds = 1;
    cr.out = buf + so;
    cr.nout = sl;
    cr.nin = rl;
    if ((res = dsgd__coll_agree_carry(c, &cr)) != DSGD_OK) return res;
    c->ring_pre = cr.got;
    res = dsgd__ring(c, buf, count, bo, op, phases);
    c->ring_pre = NULL;
    return res;
}

/* N not a power of two: with p = 2^floor(log2 N) and rem = N - p, the first
   2 rem ranks fold in pairs (even rank r sends its buffer to r + 1, which
   reduces it into its own) and only the odd ones take part, as virtual rank
   r / 2; ranks >= 2 rem are virtual rank r - rem. At the end the odd ranks
   send the result back (unfold). */
static int dsgd__vrank(int r, int rem) { return r < 2 * rem ? (r % 2 ? r / 2 : -1) : r - rem; }
static int dsgd__real_rank(int q, int rem) { return q < rem ? 2 * q + 1 : q + rem; }

static int dsgd__floor_pow2(int n) {
    int p = 1;
    while (p <= n / 2) p *= 2;
    return p;
}

static dsgd_result dsgd__fold(dsgd_comm *c, float *seg, size_t len, size_t j, int rem, dsgd_reduce_op op) {
    int r = c->rank;
    if (r >= 2 * rem) return DSGD_OK;
    if (r % 2 == 0) return dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_FOLD, 0), r + 1, seg, len, -1, NULL, 0, -1);
    return dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_FOLD, 0), -1, NULL, 0, r - 1, seg, len, (int)op);
}

static dsgd_result dsgd__unfold(dsgd_comm *c, float *seg, size_t len, size_t j, int rem) {
    int r = c->rank;
    if (r >= 2 * rem) return DSGD_OK;
    if (r % 2 == 1) return dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_UNFOLD, 0), r - 1, seg, len, -1, NULL, 0, -1);
    return dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_UNFOLD, 0), -1, NULL, 0, r + 1, seg, len, -1);
}

/* Rabenseifner's algorithm: recursive halving reduce-scatter over p blocks
   (partner at distance p/2 first; each rank keeps the half of its range that
   holds its own block), then recursive doubling all-gather, on contiguous
   segments of p * P floats. Every element goes through the same butterfly,
   so segmenting does not change the bits. */
static dsgd_result dsgd__halving_doubling(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    int n = c->size, p = dsgd__floor_pow2(n), rem = n - p, q = dsgd__vrank(c->rank, rem), d, step;
    size_t seg = c->piece * (size_t)p, base, j;
    dsgd_result res;
    for (base = 0, j = 0; base < count; base += seg, ++j) {
        size_t len = DSGD__MIN(seg, count - base);
        float *x = buf + base;
        res = dsgd__fold(c, x, len, j, rem, op);
        if (res != DSGD_OK) return res;
        if (q >= 0) {
            int blo = 0, bhi = p;
            for (d = p / 2, step = 0; d >= 1; d /= 2, ++step) {
                int partner = dsgd__real_rank(q ^ d, rem), mid = blo + d;
                int klo, khi, slo, shi;
                size_t ko, kn, so, sn;
                if ((q & d) == 0) {
                    klo = blo; khi = mid; slo = mid; shi = bhi;
                } else {
                    klo = mid; khi = bhi; slo = blo; shi = mid;
                }
                ko = dsgd__block_off(len, p, klo);
                kn = dsgd__block_off(len, p, khi) - ko;
                so = dsgd__block_off(len, p, slo);
                sn = dsgd__block_off(len, p, shi) - so;
                if ((q & d) && kn && (op == DSGD_REDUCE_MAX || op == DSGD_REDUCE_MIN)) {
                    /* this rank holds the upper group's value: op(lower, upper), as every element gets,
                       whichever rank owns it (MAX and MIN of +0 and -0 depend on the operand order;
                       addition does not) */
                    if ((res = dsgd__scratch(c, kn)) != DSGD_OK) return res;
                    res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, step), sn ? partner : -1, x + so, sn, partner,
                                     c->scratch, kn, -1);
                    if (res == DSGD_OK) dsgd__reduce_into(x + ko, c->scratch, kn, op, 1);
                } else
                    res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, step), sn ? partner : -1, x + so, sn,
                                     kn ? partner : -1, x + ko, kn, (int)op);
                if (res != DSGD_OK) return res;
                blo = klo;
                bhi = khi;
            }
            if (op == DSGD_REDUCE_MEAN) {
                size_t o = dsgd__block_off(len, p, q);
                dsgd__divide(x + o, dsgd__block_off(len, p, q + 1) - o, n);
            }
            for (d = 1, step = 0; d < p; d *= 2, ++step) {
                int partner = dsgd__real_rank(q ^ d, rem), plo, phi;
                size_t mo, mn, po, pn;
                if ((q & d) == 0) {
                    plo = bhi; phi = bhi + d;
                } else {
                    plo = blo - d; phi = blo;
                }
                mo = dsgd__block_off(len, p, blo);
                mn = dsgd__block_off(len, p, bhi) - mo;
                po = dsgd__block_off(len, p, plo);
                pn = dsgd__block_off(len, p, phi) - po;
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_AG, step), mn ? partner : -1, x + mo, mn,
                                 pn ? partner : -1, x + po, pn, -1);
                if (res != DSGD_OK) return res;
                if (plo < blo) blo = plo;
                else bhi = phi;
            }
        }
        res = dsgd__unfold(c, x, len, j, rem);
        if (res != DSGD_OK) return res;
    }
    return DSGD_OK;
}

/* Recursive doubling: log2 p exchanges of the whole segment. Both partners
   reduce the same pair of values, so each computes op(lower group's value,
   upper group's value) in that operand order and they get the same bits. */
static dsgd_result dsgd__recursive_doubling(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    int n = c->size, p = dsgd__floor_pow2(n), rem = n - p, q = dsgd__vrank(c->rank, rem), d, step;
    size_t seg = c->piece * (size_t)p, base, j;
    dsgd_result res;
    if (count > 0 && q >= 0 && p > 1) {
        res = dsgd__scratch(c, DSGD__MIN(seg, count));
        if (res != DSGD_OK) return res;
    }
    for (base = 0, j = 0; base < count; base += seg, ++j) {
        size_t len = DSGD__MIN(seg, count - base);
        float *x = buf + base;
        res = dsgd__fold(c, x, len, j, rem, op);
        if (res != DSGD_OK) return res;
        if (q >= 0) {
            for (d = 1, step = 0; d < p; d *= 2, ++step) {
                int pq = q ^ d, partner = dsgd__real_rank(pq, rem);
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, step), partner, x, len, partner, c->scratch, len,
                                 -1);
                if (res != DSGD_OK) return res;
                dsgd__reduce_into(x, c->scratch, len, op, pq < q);
            }
            if (op == DSGD_REDUCE_MEAN) dsgd__divide(x, len, n);
        }
        res = dsgd__unfold(c, x, len, j, rem);
        if (res != DSGD_OK) return res;
    }
    return DSGD_OK;
}

/* The agreement carrying recursive doubling whole (N a power of two, count
   <= DSGD__FOLD_MAX: every round of the butterfly is one of rd's): the
   partial sums build in scratch, reduced in rd's operand order, so the bits
   are rd's; the buffer gets them after the verdict. Otherwise the agreement,
   then rd. */
static dsgd_result dsgd__rd_agreed(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    int n = c->size, d;
    dsgd__carry cr;
    dsgd_result res;
    if (!c->t.sendrecv_upto || count == 0 || count > DSGD__FOLD_MAX || !dsgd__agree_butterfly(c)) {
        res = dsgd__coll_agree(c);
        return res != DSGD_OK || count == 0 ? res : dsgd__recursive_doubling(c, buf, count, op);
    }
    if (n > 2 && (res = dsgd__scratch(c, count)) != DSGD_OK) return res;
    memset(&cr, 0, sizeof(cr));
    for (d = 1; d < n; d <<= 1) ++cr.rounds;
    cr.nout = cr.nin = count;
    cr.reduce = 1;
    cr.base = buf;
    cr.acc = c->scratch;
    cr.op = op;
    if ((res = dsgd__coll_agree_carry(c, &cr)) != DSGD_OK) return res;
    if (op == DSGD_REDUCE_MEAN) dsgd__divide(buf, count, n);
    return DSGD_OK;
}

/* Binomial-tree broadcast of len floats from root (one segment). */
static dsgd_result dsgd__bcast_seg(dsgd_comm *c, float *x, size_t len, size_t j, int root) {
    int n = c->size, vr = (c->rank - root + n) % n, mask = 1;
    dsgd_result res;
    while (mask < n) {
        if (vr & mask) {
            res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_AG, 0), -1, NULL, 0, (vr - mask + root) % n, x, len, -1);
            if (res != DSGD_OK) return res;
            break;
        }
        mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
        if (vr + mask < n) {
            res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_AG, 0), (vr + mask + root) % n, x, len, -1, NULL, 0, -1);
            if (res != DSGD_OK) return res;
        }
    }
    return DSGD_OK;
}

/* Direct (shared memory): see DSGD_ALLREDUCE_DIRECT. Rank r owns block r;
   tile by tile it sums the tile of every rank's buffer in rank order into a
   small buffer in L1 and copies the result into every rank's buffer. Only
   rank r touches block r of any buffer, so the ranks never wait for each
   other between share and unshare. */
#define DSGD__DIRECT_TILE 2048
/* the head of a window (share_window), before the data: the fingerprint
   (64 bytes), then when the rank entered (a double) */
#define DSGD__DIRECT_HEAD 128

/* What each rank publishes: its buffer and its fingerprint, checked by
   every rank before any buffer is touched, and when it entered the
   collective (see >>waits). */
typedef struct dsgd__direct_pub {
    float *buf;
    uint64_t fp[DSGD__FP_N];
    double entered;
} dsgd__direct_pub;

/* >>waits in DIRECT: share returned now, having waited for every rank to
   publish; the wait since this rank entered is charged to the rank that
   entered last (entered[k] at byte offset `at` of peers[k]: the ranks'
   clocks are one, the process's or the node's). One clock read. */
static void dsgd__direct_waited(dsgd_comm *c, size_t at) {
    int k, last = -1;
    double tk, latest = 0.0;
    for (k = 0; k < c->size; ++k) {
        if (k == c->rank) continue;
        memcpy(&tk, (const char *)c->peers[k] + at, sizeof(tk));
        if (last < 0 || tk > latest) {
            last = k;
            latest = tk;
        }
    }
    if (last >= 0) c->waits[last] += dsgd__comm_now(c) - c->entered;
}

/* Elements [off, off + len) of the n buffers p[0..n-1]: each reduced in
   rank order 0..n-1 (MEAN: then divided by n), the result written into
   every buffer. */
static void dsgd__direct_block(void *const *p, int n, size_t off, size_t len, dsgd_reduce_op op) {
    float tmp[DSGD__DIRECT_TILE];
    size_t i, m;
    int k;
    for (i = 0; i < len; i += m) {
        m = DSGD__MIN((size_t)DSGD__DIRECT_TILE, len - i);
        if (op == DSGD_REDUCE_SUM || op == DSGD_REDUCE_MEAN) { /* the first two in one pass */
            dsgd__sum2(tmp, (const float *)p[0] + off + i, (const float *)p[1] + off + i, m);
        } else {
            memcpy(tmp, (const float *)p[0] + off + i, m * sizeof(float));
            dsgd__reduce_into(tmp, (const float *)p[1] + off + i, m, op, 0);
        }
        for (k = 2; k < n; ++k) dsgd__reduce_into(tmp, (const float *)p[k] + off + i, m, op, 0);
        if (op == DSGD_REDUCE_MEAN) dsgd__divide(tmp, m, n);
        for (k = 0; k < n; ++k) memcpy((float *)p[k] + off + i, tmp, m * sizeof(float));
    }
}

/* Across address spaces (share_window set): the buffer goes through the
   window a piece at a time (the window's size less its head): copied in,
   shared, block r of the piece reduced as above in every rank's window,
   unshared, copied out. The fingerprint rides in the head of the first
   piece. Each element is reduced in the same order as in one address
   space, so the bits are the same. */
static dsgd_result dsgd__direct_windowed(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    const dsgd_transport_i *t = &c->t;
    size_t wbytes = 0, cap, base = 0, len, off, blen, j = 0;
    char *win = (char *)t->share_window(t->impl, &wbytes);
    float *data = (float *)(void *)(win + DSGD__DIRECT_HEAD);
    dsgd__fp_range acc;
    dsgd_result r, agreed = DSGD_OK;
    int n = c->size, k, failed = -1;
    if (!win || wbytes < DSGD__DIRECT_HEAD + 64 * sizeof(float)) {
        char name[96];
        dsgd__coll_name(c, name, sizeof(name));
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_UNSUPPORTED, "%s: transport '%s' has no window to share (%zu bytes)",
                                  name, t->name ? t->name : "?", wbytes);
    }
    cap = (wbytes - DSGD__DIRECT_HEAD) / sizeof(float);
    dsgd__fp_fill(c, (uint64_t *)(void *)win);
    memcpy(win + DSGD__FP_N * sizeof(uint64_t), &c->entered, sizeof(c->entered));
    do {
        uint64_t tag = dsgd__tag(c, j, DSGD__PH_FOLD, 0);
        len = DSGD__MIN(cap, count - base);
        if (len) memcpy(data, buf + base, len * sizeof(float));
        r = t->share(t->impl, tag, win, c->peers, c->deadline, &failed);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, failed);
        if (j == 0) {
            dsgd__direct_waited(c, DSGD__FP_N * sizeof(uint64_t));
            dsgd__fp_init(c, &acc);
            for (k = 0; k < n; ++k) {
                const uint64_t *fp = (const uint64_t *)c->peers[k];
                dsgd__fp_merge(&acc, fp, (uint64_t)k, fp, (uint64_t)k);
            }
            agreed = dsgd__fp_verdict(c, &acc);
        }
        if (j == 0) dsgd__count(c, (size_t)(n - 1) * DSGD__FP_N * 8, (size_t)(n - 1) * DSGD__FP_N * 8);
        if (agreed == DSGD_OK && len > 0) {
            for (k = 0; k < n; ++k) c->peers[k] = (char *)c->peers[k] + DSGD__DIRECT_HEAD;
            dsgd_block_range(len, n, c->rank, &off, &blen);
            dsgd__direct_block(c->peers, n, off, blen, op);
            dsgd__count(c, 2 * (size_t)(n - 1) * blen * sizeof(float), 2 * (size_t)(n - 1) * blen * sizeof(float));
        }
        r = t->unshare(t->impl, tag, c->deadline, &failed);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, failed);
        if (agreed != DSGD_OK) return agreed;
        if (len) memcpy(buf + base, data, len * sizeof(float));
        base += len;
        ++j;
    } while (base < count);
    return DSGD_OK;
}

static dsgd_result dsgd__direct(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    const dsgd_transport_i *t = &c->t;
    uint64_t tag = dsgd__tag(c, 0, DSGD__PH_FOLD, 0);
    dsgd__direct_pub pub;
    dsgd__fp_range acc;
    size_t off, len;
    int n = c->size, k, failed = -1;
    dsgd_result r, agreed;
    if (!t->share || !t->unshare) {
        char name[96];
        dsgd__coll_name(c, name, sizeof(name));
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_UNSUPPORTED, "%s: transport '%s' cannot share memory",
                                  name, t->name ? t->name : "?");
    }
    if (t->share_window) return dsgd__direct_windowed(c, buf, count, op);
    pub.buf = buf;
    dsgd__fp_fill(c, pub.fp);
    pub.entered = c->entered;
    r = t->share(t->impl, tag, &pub, c->peers, c->deadline, &failed);
    if (r != DSGD_OK) return dsgd__coll_fail(c, r, failed);
    dsgd__direct_waited(c, offsetof(dsgd__direct_pub, entered));
    dsgd__fp_init(c, &acc);
    for (k = 0; k < n; ++k) {
        const dsgd__direct_pub *p = (const dsgd__direct_pub *)c->peers[k];
        dsgd__fp_merge(&acc, p->fp, (uint64_t)k, p->fp, (uint64_t)k);
    }
    agreed = dsgd__fp_verdict(c, &acc);
    dsgd__count(c, (size_t)(n - 1) * sizeof(pub.fp), (size_t)(n - 1) * sizeof(pub.fp));
    if (agreed == DSGD_OK && count > 0) {
        for (k = 0; k < n; ++k) c->peers[k] = ((const dsgd__direct_pub *)c->peers[k])->buf;
        dsgd_block_range(count, n, c->rank, &off, &len);
        dsgd__direct_block(c->peers, n, off, len, op);
        dsgd__count(c, 2 * (size_t)(n - 1) * len * sizeof(float), 2 * (size_t)(n - 1) * len * sizeof(float));
    }
    r = t->unshare(t->impl, tag, c->deadline, &failed);
    return r == DSGD_OK ? agreed : dsgd__coll_fail(c, r, failed);
}

/* Binomial reduce to rank 0 (rank r reduces r + 1 into its value, then
   r + 2, r + 4, ..., in that order) and binomial broadcast, per segment of
   N * P floats. */
static dsgd_result dsgd__reduce_broadcast(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    int n = c->size, r = c->rank, d;
    size_t seg = c->piece * (size_t)n, base, j;
    dsgd_result res;
    for (base = 0, j = 0; base < count; base += seg, ++j) {
        size_t len = DSGD__MIN(seg, count - base);
        float *x = buf + base;
        for (d = 1; d < n; d <<= 1) {
            if (r & d) {
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, 0), r - d, x, len, -1, NULL, 0, -1);
                if (res != DSGD_OK) return res;
                break;
            }
            if (r + d < n) {
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, 0), -1, NULL, 0, r + d, x, len, (int)op);
                if (res != DSGD_OK) return res;
            }
        }
        if (r == 0 && op == DSGD_REDUCE_MEAN) dsgd__divide(x, len, n);
        res = dsgd__bcast_seg(c, x, len, j, 0);
        if (res != DSGD_OK) return res;
    }
    return DSGD_OK;
}

/* The transport's native collective (AUTO when the transport has one). */
static dsgd_result dsgd__native(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    dsgd_result res;
    dsgd__count(c, count * sizeof(float), count * sizeof(float));
    res = c->t.allreduce(c->t.impl, buf, count, op, c->deadline);
    return res == DSGD_OK ? res : dsgd__coll_fail(c, res, -1);
}

/* The ring all-reduce on the map's blocks (see >>map); agreed: with the
   agreement first (see dsgd__ring_agreed). */
static dsgd_result dsgd__ring_mapped(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op, int agreed) {
    float *x = buf;
    const size_t *bo = c->lay + 3 * (size_t)c->size;
    dsgd_result res;
    if (count && (res = dsgd__map_pack(c, buf, count, c->size, &x)) != DSGD_OK) return res;
    res = agreed ? dsgd__ring_agreed(c, x, count, bo, op, 3) : dsgd__ring(c, x, count, bo, op, 3);
    if (res == DSGD_OK && count) dsgd__map_unpack(c, buf, count, x);
    return res;
}

static dsgd_result dsgd__ring_allreduce(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    return dsgd__ring_mapped(c, buf, count, op, 0);
}

/* Two levels (see DSGD_ALLREDUCE_HIERARCHICAL): with L ranks per node and M
   nodes, the node's ring reduce-scatters, the ring of local rank l across
   the nodes all-reduces block l, the node's ring all-gathers. The messages
   of the two rings never share a pair of ranks (1 < L < N), so their tags
   may repeat. */
static dsgd_result dsgd__hierarchical(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    int L = c->node_ranks, M = c->size / L, n = c->size, m;
    dsgd_reduce_op sum = op == DSGD_REDUCE_MEAN ? DSGD_REDUCE_SUM : op;
    dsgd__ring_view node, across;
    size_t off = 0, len = 0, *pos = c->lay + n, *bo = c->lay + 3 * (size_t)n, *bm = bo + L + 1;
    float *x = buf;
    dsgd_result res;
    if (L <= 1 || M <= 1) return dsgd__ring_mapped(c, buf, count, op, 0);
    if ((res = dsgd__map_pack(c, buf, count, L, &x)) != DSGD_OK) return res;
    node.n = L;
    node.r = c->rank % L;
    node.base = c->rank - node.r;
    node.stride = 1;
    across.n = M;
    across.r = c->rank / L;
    across.base = node.r;
    across.stride = L;
    /* node block l holds virtual blocks l + L m, m = 0..M-1, in m order */
    off = bo[node.r];
    len = bo[node.r + 1] - off;
    for (m = 0; m < M; ++m) bm[m] = pos[node.r + L * m] - off;
    bm[M] = len;
    if ((res = dsgd__ring_in(c, &node, x, count, bo, sum, 1)) != DSGD_OK) return res;
    if (len > 0 && (res = dsgd__ring_in(c, &across, x + off, len, bm, sum, 3)) != DSGD_OK) return res;
    if (op == DSGD_REDUCE_MEAN) dsgd__divide(x + off, len, c->size);
    if ((res = dsgd__ring_in(c, &node, x, count, bo, sum, 2)) != DSGD_OK) return res;
    dsgd__map_unpack(c, buf, count, x);
    return DSGD_OK;
}

static dsgd_result dsgd__ring_allreduce_agreed(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    return dsgd__ring_mapped(c, buf, count, op, 1);
}

/* The all-reduce algorithms by dsgd_allreduce_algo: name and code. A new
   algorithm is an enumerator and one line here. agreed: the agreement and
   the algorithm together (DIRECT checks the fingerprints through the
   memory it shares, count 0 included; ring and recursive doubling carry
   their first exchanges with the agreement: see >>fold); NULL: the
   agreement (dsgd__coll_agree), then run. */
static const struct {
    const char *name;
    dsgd_result (*run)(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op);
    dsgd_result (*agreed)(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op);
} dsgd__allreduce_algos[DSGD_ALLREDUCE_COUNT] = {
    /* AUTO, resolved to the native hook */ {"auto", dsgd__native, NULL},
    /* RING */ {"ring", dsgd__ring_allreduce, dsgd__ring_allreduce_agreed},
    /* HALVING_DOUBLING */ {"halving_doubling", dsgd__halving_doubling, NULL},
    /* REDUCE_BROADCAST */ {"reduce_broadcast", dsgd__reduce_broadcast, NULL},
    /* RECURSIVE_DOUBLING */ {"recursive_doubling", dsgd__recursive_doubling, dsgd__rd_agreed},
    /* DIRECT */ {"direct", dsgd__direct, dsgd__direct},
    /* HIERARCHICAL */ {"hierarchical", dsgd__hierarchical, NULL},
};

DSGD_API const char *dsgd_allreduce_algo_name(dsgd_allreduce_algo algo) {
    return (int)algo >= 0 && (int)algo < (int)DSGD_ALLREDUCE_COUNT ? dsgd__allreduce_algos[algo].name : "unknown";
}

/* >>wire ------------------------------------------------------------------- */
/* The all-reduce over a half wire (dsgd_allreduce_wire): the ring on the
   map's blocks, its messages in fp16 or bf16 and its sums in fp32.
   Before any message, every rank scales its bucket by the same 2^k: k from
   the largest exponent field of every rank's finite elements (xmax, merged
   by MAX in the agreement's rounds, which carry it in the fingerprint
   range's spare bytes: no message or byte more) and N, so that every
   partial sum stays below 2^15 (fp16's largest is 65504) and small values
   rise away from fp16's subnormals. Reduce-scatter: each step sends the
   fp32 partial rounded to the wire and the receiver adds its own fp32
   value to the wire value made fp32 again. The owner rounds the final sum
   to the wire once; the all-gather passes those 16-bit values on as they
   are, and every rank, the owner too, takes them back to fp32 and undoes
   2^k. */
#define DSGD__WIRE_TOP 14 /* every scaled input below 2^(15 - ceil(log2 N)), every sum below 2^15 */

DSGD_API const char *dsgd_wire_name(dsgd_wire wire) {
    static const char *const names[DSGD_WIRE_COUNT] = {"f32", "f16", "bf16"};
    return (int)wire >= 0 && (int)wire < (int)DSGD_WIRE_COUNT ? names[wire] : "unknown";
}


static int dsgd__wire_shift(uint32_t max_exponent_field, int n) {
    int lg = 0, k;
    while (lg < 31 && (1 << lg) < n) ++lg;
    k = DSGD__WIRE_TOP - ((int)max_exponent_field - 127) - lg;
    return k < -126 ? -126 : k > 126 ? 126 : k;
}

DSGD_API int dsgd_wire_scale(float max_abs, int n) {
    return dsgd__wire_shift(dsgd__exp_max_portable(&max_abs, 1), n);
}

/* x[0..n) *= 2^k, |k| <= 126 (a normal float, so exact unless a product
   leaves fp32's normal range) */
static void dsgd__scale_pow2(float *x, size_t n, int k) {
    uint32_t u = (uint32_t)(k + 127) << 23;
    float f;
    memcpy(&f, &u, 4);
    if (k == 0) return;
#define DSGD__SCALE_ONE(i) x[i] *= f
    DSGD__EACH(n, DSGD__SCALE_ONE);
#undef DSGD__SCALE_ONE
}

/* x to the wire (to 0) or back (to 1), timed into compress_s and charged
   to a simulated clock (the transport's charge_codec). */
static dsgd_result dsgd__wire_conv(dsgd_comm *c, float *x, uint16_t *w, size_t n, int back) {
    double t0;
    if (!n) return DSGD_OK;
    t0 = dsgd_now();
    if (c->wire == DSGD_WIRE_F16) {
        if (back) c->half->from_f16(w, x, n);
        else c->half->to_f16(x, w, n);
    } else {
        if (back) c->half->from_bf16(w, x, n);
        else c->half->to_bf16(x, w, n);
    }
    c->st.compress_s += dsgd_now() - t0;
    return c->t.charge_codec ? c->t.charge_codec(c->t.impl, n) : DSGD_OK;
}

/* The ring (as dsgd__ring_in over the whole group, phases 3, pieces as
   dsgd__ring_piece) on x, packed and scaled, with its messages in c->wv;
   on return c->wv[0..count) holds every block's final sum on the wire. */
static dsgd_result dsgd__ring_wire(dsgd_comm *c, float *x, size_t count, const size_t *bo) {
    int n = c->size, r = c->rank, k;
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    size_t maxlen = dsgd__block_max(count, n, bo), P = dsgd__ring_piece(c, maxlen), npieces, j;
    uint16_t *w = c->wv;
    dsgd_result res = DSGD_OK;
    npieces = (maxlen + P - 1) / P;
    if ((res = dsgd__scratch(c, DSGD__MIN(P, maxlen))) != DSGD_OK) return res;
    c->view_n = n;
    c->view_r = r;
    for (j = 0; j < npieces && res == DSGD_OK; ++j) {
        size_t so, sl, ro, rl;
        for (k = 0; k < n - 1 && res == DSGD_OK; ++k) { /* reduce-scatter: fp32 sums of wire values */
            int sb = ((r - k - 1) % n + n) % n, rb = ((r - k - 2) % n + n) % n;
            dsgd__piece(count, n, bo, sb, j, P, &so, &sl);
            dsgd__piece(count, n, bo, rb, j, P, &ro, &rl);
            if ((res = dsgd__wire_conv(c, x + so, w + so, sl, 0)) != DSGD_OK) break;
            res = dsgd__xchg_bytes(c, dsgd__tag(c, j, DSGD__PH_RS, k), sl ? next : -1, w + so, sl * 2,
                                   rl ? prev : -1, w + ro, rl * 2, sl * sizeof(float));
            if (res != DSGD_OK || !rl) continue;
            if ((res = dsgd__wire_conv(c, c->scratch, w + ro, rl, 1)) != DSGD_OK) break;
            dsgd__sum_into(x + ro, c->scratch, rl);
        }
        if (res != DSGD_OK) break;
        dsgd__piece(count, n, bo, r, j, P, &ro, &rl);
        if ((res = dsgd__wire_conv(c, x + ro, w + ro, rl, 0)) != DSGD_OK) break; /* the owner's sum, rounded once */
        for (k = 0; k < n - 1 && res == DSGD_OK; ++k) { /* all-gather: the wire values as they are */
            int sb = ((r - k) % n + n) % n, rb = ((r - k - 1) % n + n) % n;
            dsgd__piece(count, n, bo, sb, j, P, &so, &sl);
            dsgd__piece(count, n, bo, rb, j, P, &ro, &rl);
            res = dsgd__xchg_bytes(c, dsgd__tag(c, j, DSGD__PH_AG, k), sl ? next : -1, w + so, sl * 2,
                                   rl ? prev : -1, w + ro, rl * 2, sl * sizeof(float));
        }
    }
    c->view_n = 0;
    return res;
}

/* The half-wire all-reduce after dsgd__coll_begin: the agreement (carrying
   xmax), then pack, scale, ring, back to fp32, unscale, unpack. */
static dsgd_result dsgd__allreduce_wire(dsgd_comm *c, float *buf, size_t count) {
    const size_t *bo = c->lay + 3 * (size_t)c->size;
    float *x = buf;
    double t0 = dsgd_now();
    dsgd_result res;
    int k;
    c->xmax = c->half->exp_max(buf, count);
    c->st.compress_s += dsgd_now() - t0;
    /* the agreement runs even with no_agree (benchmarks): it carries the scale */
    if ((res = dsgd__coll_agree(c)) != DSGD_OK || count == 0) return res;
    if ((res = dsgd__map_pack(c, buf, count, c->size, &x)) != DSGD_OK) return res;
    if (count > c->wv_cap) {
        uint16_t *p = (uint16_t *)DSGD_REALLOC(c->wv, count * sizeof(uint16_t));
        if (!p) {
            char name[96];
            dsgd__coll_name(c, name, sizeof(name));
            c->broken = 1;
            c->broken_seq = c->seq;
            return dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: rank %d cannot allocate %zu bytes for the wire",
                                      name, c->rank, count * sizeof(uint16_t));
        }
        c->wv = p;
        c->wv_cap = count;
    }
    k = dsgd__wire_shift(c->xmax, c->size);
    t0 = dsgd_now();
    dsgd__scale_pow2(x, count, k);
    c->st.compress_s += dsgd_now() - t0;
    if ((res = dsgd__ring_wire(c, x, count, bo)) != DSGD_OK) return res;
    if ((res = dsgd__wire_conv(c, x, c->wv, count, 1)) != DSGD_OK) return res;
    t0 = dsgd_now();
    dsgd__scale_pow2(x, count, -k);
    c->st.compress_s += dsgd_now() - t0;
    dsgd__map_unpack(c, buf, count, x);
    return DSGD_OK;
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

static dsgd_result dsgd__allreduce_at(dsgd_comm *c, float *buf, size_t count, size_t first, dsgd_reduce_op op,
                                     dsgd_allreduce_algo algo, double timeout_s) {
    dsgd_result res;
    res = dsgd__coll_check(c, "allreduce", buf, count, 1, op, timeout_s);
    if (res != DSGD_OK) return res;
    if ((int)algo < 0 || (int)algo >= (int)DSGD_ALLREDUCE_COUNT)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_allreduce: unknown algorithm %d", (int)algo);
    if (first > SIZE_MAX - count)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_allreduce: first %zu + count %zu overflows", first, count);
    if (algo == DSGD_ALLREDUCE_AUTO) algo = dsgd_allreduce_choose(c, count);
    c->first = first;
    dsgd__coll_begin(c, DSGD__K_ALLREDUCE, algo == DSGD_ALLREDUCE_AUTO ? "native" : dsgd_allreduce_algo_name(algo),
                     (int)algo, (int)op, -1, count, timeout_s);
    if (c->size == 1) return DSGD_OK; /* MEAN over one rank divides by 1: nothing to do */
    if (c->no_agree && algo != DSGD_ALLREDUCE_DIRECT)
        return count ? dsgd__allreduce_algos[algo].run(c, buf, count, op) : DSGD_OK;
    if (dsgd__allreduce_algos[algo].agreed) return dsgd__allreduce_algos[algo].agreed(c, buf, count, op);
    res = dsgd__coll_agree(c);
    if (res != DSGD_OK || count == 0) return res;
    return dsgd__allreduce_algos[algo].run(c, buf, count, op);
}

DSGD_API dsgd_result dsgd_allreduce_at(dsgd_comm *c, float *buf, size_t count, size_t first, dsgd_reduce_op op,
                                       dsgd_allreduce_algo algo, double timeout_s) {
    double t0;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    t0 = dsgd__comm_now(c);
    return dsgd__coll_timed(c, t0, dsgd__allreduce_at(c, buf, count, first, op, algo, timeout_s));
}

DSGD_API dsgd_result dsgd_allreduce_wire(dsgd_comm *c, float *buf, size_t count, size_t first, dsgd_reduce_op op,
                                         dsgd_allreduce_algo algo, dsgd_wire wire, double timeout_s) {
    dsgd_result res;
    double t0;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if ((int)wire < 0 || (int)wire >= (int)DSGD_WIRE_COUNT)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_allreduce_wire: unknown wire %d", (int)wire);
    if (wire == DSGD_WIRE_F32) return dsgd_allreduce_at(c, buf, count, first, op, algo, timeout_s);
    t0 = dsgd__comm_now(c);
    res = dsgd__coll_check(c, "allreduce", buf, count, 1, op, timeout_s);
    if (res != DSGD_OK) return dsgd__coll_timed(c, t0, res);
    if ((int)algo < 0 || (int)algo >= (int)DSGD_ALLREDUCE_COUNT)
        return dsgd__coll_timed(c, t0, dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                                          "dsgd_allreduce: unknown algorithm %d", (int)algo));
    if (op != DSGD_REDUCE_SUM)
        return dsgd__coll_timed(c, t0, dsgd_ctx_set_error(c->ctx, DSGD_ERR_UNSUPPORTED,
                                                          "dsgd_allreduce_wire: the %s wire sums only (op %s)",
                                                          dsgd_wire_name(wire), dsgd_reduce_op_name(op)));
    if (algo != DSGD_ALLREDUCE_AUTO && algo != DSGD_ALLREDUCE_RING)
        return dsgd__coll_timed(
            c, t0, dsgd_ctx_set_error(c->ctx, DSGD_ERR_UNSUPPORTED,
                                      "dsgd_allreduce_wire: the %s wire runs on the ring (AUTO or RING), not %s",
                                      dsgd_wire_name(wire), dsgd_allreduce_algo_name(algo)));
    if (first > SIZE_MAX - count)
        return dsgd__coll_timed(c, t0, dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                                          "dsgd_allreduce: first %zu + count %zu overflows", first,
                                                          count));
    c->first = first;
    dsgd__coll_begin(c, DSGD__K_ALLREDUCE, wire == DSGD_WIRE_F16 ? "ring, f16 wire" : "ring, bf16 wire",
                     (int)DSGD_ALLREDUCE_RING, (int)op, -1, count, timeout_s);
    c->wire = (int)wire;
    if (c->size == 1) return dsgd__coll_timed(c, t0, DSGD_OK);
    return dsgd__coll_timed(c, t0, dsgd__allreduce_wire(c, buf, count));
}

DSGD_API dsgd_result dsgd_allreduce(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op,
                                    dsgd_allreduce_algo algo, double timeout_s) {
    return dsgd_allreduce_at(c, buf, count, 0, op, algo, timeout_s);
}

DSGD_API dsgd_result dsgd_reduce_scatter(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op,
                                         double timeout_s) {
    dsgd_result res;
    double t0;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "reduce_scatter", buf, count, 1, op, timeout_s);
    if (res != DSGD_OK) return res;
    t0 = dsgd__comm_now(c);
    dsgd__coll_begin(c, DSGD__K_REDUCE_SCATTER, "ring", -1, (int)op, -1, count, timeout_s);
    if (c->size == 1) return dsgd__coll_timed(c, t0, DSGD_OK);
    return dsgd__coll_timed(c, t0, dsgd__ring_agreed(c, buf, count, NULL, op, 1));
}

DSGD_API dsgd_result dsgd_allgather(dsgd_comm *c, float *buf, size_t count, double timeout_s) {
    dsgd_result res;
    double t0;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "allgather", buf, count, 0, DSGD_REDUCE_SUM, timeout_s);
    if (res != DSGD_OK) return res;
    t0 = dsgd__comm_now(c);
    dsgd__coll_begin(c, DSGD__K_ALLGATHER, "ring", -1, -1, -1, count, timeout_s);
    if (c->size == 1) return dsgd__coll_timed(c, t0, DSGD_OK);
    return dsgd__coll_timed(c, t0, dsgd__ring_agreed(c, buf, count, NULL, DSGD_REDUCE_SUM, 2));
}

/* The agreement, then the broadcast; up to DSGD__FOLD_MAX floats the
   agreement's rounds carry the broadcast whole (see dsgd__carry): ceil(log2
   N) rounds in all, the data written into each rank's buffer after the
   verdict. Larger: the binomial tree, pipelined in segments, after the
   agreement. */
static dsgd_result dsgd__bcast_agreed(dsgd_comm *c, float *buf, size_t count, int root) {
    int n = c->size, d;
    size_t seg, base, j;
    dsgd__carry cr;
    dsgd_result res;
    if (c->t.sendrecv_upto && count > 0 && count <= DSGD__FOLD_MAX) {
        if ((res = dsgd__scratch(c, count)) != DSGD_OK) return res;
        memset(&cr, 0, sizeof(cr));
        for (d = 1; d < n; d <<= 1) ++cr.rounds;
        cr.bcast = 1;
        cr.vr = dsgd__agree_butterfly(c) ? c->rank ^ root : (c->rank - root + n) % n;
        cr.nout = cr.nin = count;
        cr.base = buf;
        cr.acc = c->scratch;
        return dsgd__coll_agree_carry(c, &cr);
    }
    if ((res = dsgd__coll_agree(c)) != DSGD_OK) return res;
    seg = c->piece * 4;
    for (base = 0, j = 0; base < count; base += seg, ++j) {
        res = dsgd__bcast_seg(c, buf + base, DSGD__MIN(seg, count - base), j, root);
        if (res != DSGD_OK) return res;
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_broadcast(dsgd_comm *c, float *buf, size_t count, int root, double timeout_s) {
    dsgd_result res;
    double t0;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "broadcast", buf, count, 0, DSGD_REDUCE_SUM, timeout_s);
    if (res != DSGD_OK) return res;
    if (root < 0 || root >= c->size)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_broadcast: root %d outside [0, %d)", root,
                                  c->size);
    t0 = dsgd__comm_now(c);
    dsgd__coll_begin(c, DSGD__K_BROADCAST, NULL, -1, -1, root, count, timeout_s);
    if (c->size == 1) return dsgd__coll_timed(c, t0, DSGD_OK);
    return dsgd__coll_timed(c, t0, dsgd__bcast_agreed(c, buf, count, root));
}

DSGD_API dsgd_result dsgd_barrier(dsgd_comm *c, double timeout_s) {
    dsgd_result res;
    double t0;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "barrier", NULL, 0, 0, DSGD_REDUCE_SUM, timeout_s);
    if (res != DSGD_OK) return res;
    t0 = dsgd__comm_now(c);
    dsgd__coll_begin(c, DSGD__K_BARRIER, NULL, -1, -1, -1, 0, timeout_s);
    /* The agreement is a dissemination barrier (Hensgen, Finkel and Manber
       1988): in round k rank r signals r + 2^k and waits for r - 2^k (or,
       the butterfly, exchanges with r XOR 2^k), so after the last round
       every rank has heard, through others, from all. */
    return dsgd__coll_timed(c, t0, c->size == 1 ? DSGD_OK : dsgd__coll_agree(c));
}

#endif /* DSGD__PART_COLLECTIVES_IMPL */
