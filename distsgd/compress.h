/* distsgd/compress.h - gradient compressors with error feedback, as comm hooks
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   COMPRESSION

     dsgd_compress_hook(&desc) is a comm hook (comm_hook.h) that sends a
     compressed bucket instead of all-reducing it in fp32:

         dsgd_compress_desc cd = {0};
         cd.kind = DSGD_COMPRESS_POWERSGD;          (rank 2 by default)
         dsgd_comm_hook h = dsgd_compress_hook(&cd);
         sd.comm_hook = &h;   (a strategy desc sd; create copies the table)

     Each replica keeps a residual e (error feedback, one float per
     parameter, saved with the checkpoint). For every bucket, with g this
     replica's scaled gradient and e its residual for those floats:

         M = g + e                      (floats, element by element)
         C = the compressor's message, decompressed (this replica's part)
         e = M - C                      (what was not sent waits for later)
         bucket = the SUM over the replicas of their C, the same bits on all

     so that over T steps sum_t C_t + e_T = sum_t g_t: nothing is lost, only
     delayed (Seide et al. 2014, Karimireddy et al. 2019). no_error_feedback
     keeps e at zero (the compressor alone, for comparison). The seconds
     a compressor spends outside its collectives go to the communicator's
     compress_s (dsgd_comm_stats; the half wires count their own), and on
     a simulated clock each bucket costs 2 count floats of codec time
     (dsgd_comm_charge_codec: compressed once, decompressed once; simnet's
     codec_s_per_float, which a real top-k or PowerSGD exceeds many times:
     set it from compress_s).

     DSGD_COMPRESS_NONE   the plain all-reduce (SUM) of the bucket, through
                          the hook: the baseline, bit for bit the strategy's
                          own exchange; no residual.
     DSGD_COMPRESS_FP16, DSGD_COMPRESS_BF16
                          the bucket on a half wire: dsgd_allreduce_wire
                          (collectives.h: the ring, 2 bytes a float, sums
                          in fp32 at every hop, one power-of-two scale
                          agreed by all, so no overflow and no flush to
                          zero; its error bound is there), the bucket's
                          algorithm if it is RING, else AUTO (the ring);
                          no residual: the rounding is not fed back.
     DSGD_COMPRESS_TOPK   keeps the k entries of largest |M| (ties: the lower
                          index; NaN counts as the largest), per variable
                          (k = ceil(ratio * count) of each) or over the
                          bucket (global). The (index, value) pairs are
                          all-gathered (indices as 32-bit integers, carried
                          bit for bit in the float buffer) and every replica
                          adds them, replica 0's first, into a zeroed
                          bucket. e = M with the sent entries zeroed.
     DSGD_COMPRESS_SIGN   scaled sign (EF-signSGD, Karimireddy et al. 2019),
                          per variable of n floats: s = ||M||_1 / n rounded
                          to 8 significant bits (below), C_i = s for M_i
                          with the sign bit clear, -s with it set (so -0
                          counts as negative); the sign bits (32 to a word)
                          and s are all-gathered, and every replica adds
                          the replicas' C in rank order.
     DSGD_COMPRESS_POWERSGD
                          rank-r PowerSGD (Vogels et al. 2019) for each
                          variable of rank >= 2, seen as a matrix M of n =
                          shape[0] rows and m = count / n columns, with r' =
                          min(r, n, m), compressed when n >= 2, m >= 2 and
                          n m / (r' (n + m)) >= min_compression_rate (as
                          PyTorch's PowerSGD hook); a row or a column (n = 1
                          or m = 1) never is, whatever the rate (below 1
                          the formula would pass it): its P and Q hold n +
                          m floats, more than its n m:
                            P = M Q                 (n x r'; Q m x r')
                            P = SUM of P over the replicas (one all-reduce
                                for all the bucket's matrices)
                            P = orthonormal columns of P (modified
                                Gram-Schmidt, sums in double, a second pass
                                over a column the projections left with
                                under 1/32 of its norm, so that the columns
                                of a matrix of rank below r' are orthogonal
                                too and P Q^T reproduces it; a zero column
                                stays zero): the same bits on every replica
                            Q = M^T P               (this replica's part)
                            C = P Q^T               (this replica's part:
                                the residual is e = M - C, Vogels' local
                                decompression)
                            Q = SUM of Q over the replicas (one all-reduce)
                            bucket = P Q^T
                          Since P Q^T is linear in Q, the bucket is the sum
                          over the replicas of their C (up to the rounding
                          of the sums): the SUM convention, where PyTorch's
                          hook divides by the world size. Q starts from a
                          seeded uniform draw in [-1, 1), the same on every
                          replica, and with warm start (the default) the
                          summed Q of the last step is the next step's start
                          (drawn afresh if it is all zero); without, it is
                          drawn every step. Vectors (biases) and the
                          matrices below the rate are all-reduced plainly
                          (SUM, the bucket's algorithm, at their offsets in
                          the flat gradient, a run of neighbours in one
                          call), and keep no residual. Before step
                          start_iter the whole bucket is all-reduced plainly
                          and e is left alone.

     Momentum correction (top-k; Lin et al. 2018, Deep Gradient
     Compression). With momentum m > 0 the hook keeps, per parameter, the
     momentum u besides the residual v, and for every bucket:

         u = m u + g
         a = u, or g + m u with nesterov   (the optimizer's MOMENTUM rule)
         M = v + a;  C = top-k of M;  v = M - C
         u = 0 where C was sent            (momentum factor masking)

     so that sum_t C_t + v_T = sum_t a_t, and the replicas sum their C as
     above. The hook then sends the momentum step itself, not the
     gradient: the strategy's optimizer must be DSGD_OPT_SGD (no momentum
     of its own), which applies the summed sparse step with its learning
     rate (its schedule, weight decay and clip_norm act on that step).
     Keeping the optimizer's momentum would apply momentum twice, so the
     hook says it owns the momentum (dsgd_comm_hook.owns_momentum) and
     dsgd_strategy_create refuses any other optimizer. Why (Lin
     et al.): with error feedback alone the optimizer's momentum acts on
     the sparse sums, so an entry's gradients, delayed in e, reach the
     velocity late and in bursts; accumulating momentum steps instead of
     gradients keeps sum_t a_t what dense momentum SGD would have applied,
     and the masking stops a sent entry's old velocity from pushing on.
     Before start_iter the hook all-reduces a (the optimizer's momentum
     step, so the dense warm-up is momentum SGD) and leaves v alone.

     Sparsity warm-up (top-k, Deep Gradient Compression's). With
     warmup_steps W > 0 the W steps from start_iter keep more than ratio:
     they are split into S stages, S the number of the fractions 1/4,
     1/16, 1/64, ... above ratio (3 for 0.01; 4 for 0.001: 75%, 93.75%,
     98.4375%, 99.6% sparse), stage j (the steps start_iter + [floor(j W /
     S), floor((j + 1) W / S))) keeping 4^-(j + 1) (k as for ratio: of
     each variable, or of the bucket with global), then ratio. An alternative to a dense warm-up that never
     sends the whole gradient.

     Defaults (zero in the desc). ratio 0.01 (1% kept). rank 2: Vogels et
     al. match full-precision SGD's accuracy with rank 2 on ResNet-18 /
     CIFAR-10, where rank 1 loses some; PyTorch defaults to 1, the
     cheapest. start_iter 0 (top-k, sign and PowerSGD alike): compress
     from the first step, as the PowerSGD paper does (error feedback and warm start make that work); PyTorch defaults
     to 1000 and suggests about 10% of training, which in this library's
     runs of a few hundred steps would mean never compressing: set it for
     a plain warm-up. min_compression_rate 2 (PyTorch's). seed: a fixed
     constant, so runs repeat.

     Determinism. Every sum has a fixed order (index order inside a
     replica, rank order across them; all-reduces are the collectives'
     deterministic ones), top-k's ties are broken by index, and PowerSGD's
     draws depend on the seed, the variable's offset and the step only:
     the same inputs give the same bits, run after run, on every replica.

     Exactness of the error feedback. The identity above holds bit for bit
     at each step when both M = g + e and e = M - C are exact in float
     (C + e_new = g + e_old, and the steps telescope). The compressors make
     the second as likely as they can:
       - top-k: always (e_i is M_i or 0).
       - sign: the scale is rounded to 8 significant bits (bfloat16's
         precision; it moves by at most 2^-9 of itself), so M_i - s is exact
         whenever |M_i| >= s/2, or M_i lies on the scale's grid (integers,
         say), not only by Sterbenz's lemma in [s/2, 2s].
       - PowerSGD: C is rounded to the grid 2^(E - 20), E = floor(log2
         max |M|) over the variable (21 bits below its largest entry: a
         relative change of at most 2^-21 of that entry), so M_i - C_i is
         exact whenever M_i lies on that grid and |M_i - C_i| < 2^(E+4).
         With one replica the bucket is this C (it is the sum over one
         replica); with several it is P (sum Q)^T as above, not rounded.
     With gradients on a coarse grid (integers, as the tests use) both hold
     and the identity is exact for all three. In general a step may round
     each element once or twice: |(C + e_new) - (g + e_old)| <= 2^-24
     (|M_i| + |e_new,i|) per element per step.

   BYTES

     dsgd_compress_bytes gives the bytes of one replica's message for a
     bucket of count floats in variables v of n_v floats (matrices n_v x
     m_v, r_v = min(r, n_v, m_v)):
       NONE       4 count                              (all-reduced)
       FP16, BF16 2 count                              (all-reduced)
       TOPK       8 K, K = sum of k_v (per variable) or k (global) (gathered),
                  k at the step's fraction during a sparsity warm-up
       SIGN       4 sum_v (1 + ceil(n_v / 32))          (gathered)
       POWERSGD   4 (sum over compressed v of r_v (n_v + m_v)
                     + the floats of the others)       (all-reduced)
                  (compressed: rank >= 2, n_v >= 2, m_v >= 2 and the
                  rate reached: COMPRESSION above; a 1 x 8 and an 8 x 1
                  at rank 1 and rate 0.5 are 4 (8 + 8) bytes, not the
                  4 (9 + 9) of the formula)
       TOPK, SIGN, POWERSGD: 4 count before start_iter
     On the wire, per replica (collectives.h, COLLECTIVES, Cost): a
     gathered message goes round the ring all-gather, (N - 1) times its
     bytes; all-reduced floats cost what the bucket's algorithm costs, e.g.
     log2 N times their bytes for recursive doubling at N a power of two,
     2 (N - 1) / N for the ring with N chunks dividing them, none through
     the transport for DIRECT (shared memory). Each collective adds its
     agreement: TOPK and SIGN call one all-gather per bucket, POWERSGD two
     all-reduces (P and Q, when a variable is compressed) and one per run
     of plainly reduced variables, NONE one all-reduce.

   STATE

     Saved (state_bytes, save, load) as 24 bytes of header (tag, kind, rank,
     parameter count) then the residual (when error feedback is on),
     PowerSGD's Q memories (with warm start) and top-k's momentum u (with
     momentum correction): one float per parameter each,
     the Q of a variable at offset o kept at o (r' m <= n m floats). A run
     resumed from them continues bit for bit. Nothing is saved for NONE,
     nor when neither applies. Native byte order, as the floats of the rest
     of a checkpoint.
*/
#ifndef DSGD__PART_COMPRESS_DECL
#define DSGD__PART_COMPRESS_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- compressors */

typedef enum dsgd_compress_kind {
    DSGD_COMPRESS_NONE = 0,    /* the plain all-reduce, through the hook */
    DSGD_COMPRESS_TOPK = 1,    /* top-k sparsification */
    DSGD_COMPRESS_SIGN = 2,    /* scaled sign, one bit per float */
    DSGD_COMPRESS_POWERSGD = 3, /* low-rank (PowerSGD) */
    DSGD_COMPRESS_FP16 = 4,     /* fp16 on the wire, fp32 sums (dsgd_allreduce_wire) */
    DSGD_COMPRESS_BF16 = 5      /* bfloat16 on the wire, fp32 sums (dsgd_allreduce_wire) */
} dsgd_compress_kind;
#define DSGD_COMPRESS_KIND_COUNT (DSGD_COMPRESS_BF16 + 1)

/* The defaults of dsgd_compress_desc (COMPRESSION above says why). */
#define DSGD_COMPRESS_DEFAULT_RATIO 0.01
#define DSGD_COMPRESS_DEFAULT_RANK 2
#define DSGD_COMPRESS_DEFAULT_MIN_RATE 2.0
#define DSGD_COMPRESS_DEFAULT_SEED 0x5EEDC0DE2019ull

typedef struct dsgd_compress_desc {
    dsgd_compress_kind kind;
    double ratio;                /* TOPK: the fraction kept, in (0, 1]; 0: 0.01 */
    int global;                  /* TOPK: 0: each variable keeps ceil(ratio *
                                    its count); 1: ceil(ratio * count) over
                                    the whole bucket */
    int rank;                    /* POWERSGD: r, 1..1024; 0: 2 */
    int64_t start_iter;          /* TOPK, SIGN, POWERSGD: buckets of steps
                                    before it are all-reduced plainly (a
                                    dense warm-up, as Deep Gradient
                                    Compression's); >= 0; 0: compress from
                                    the first step */
    double min_compression_rate; /* POWERSGD: a matrix is compressed when n m /
                                    (r (n + m)) reaches it; finite, >= 0;
                                    0: 2 */
    int no_warm_start;           /* POWERSGD: 1 draws Q afresh every step */
    int no_error_feedback;       /* 1: no residual (the compressor alone) */
    uint64_t seed;               /* POWERSGD: Q's draws; 0: DSGD_COMPRESS_DEFAULT_SEED */
    float momentum;              /* TOPK: momentum correction (Deep Gradient
                                    Compression; COMPRESSION, Momentum
                                    correction): the hook keeps the velocity
                                    and the strategy's optimizer must be
                                    DSGD_OPT_SGD; in [0, 1); needs error
                                    feedback; 0: off */
    int nesterov;                /* TOPK with momentum: Nesterov's variant */
    int64_t warmup_steps;        /* TOPK: sparsity warm-up over this many
                                    steps from start_iter (COMPRESSION,
                                    Sparsity warm-up); >= 0; 0: off */
} dsgd_compress_desc;

/* "none", "topk", "sign", "powersgd", "fp16", "bf16"; "unknown" for other
   values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_compress_kind_name(dsgd_compress_kind kind);

/* Checks desc as the hook's create does, recording what is wrong on ctx
   (the hook's create has no context to record it on: a strategy whose
   hook failed to create can call this for the message).
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx NULL: nothing recorded; desc
   NULL; an unknown kind; ratio outside (0, 1] or not a number; rank
   outside 0..1024; start_iter negative; min_compression_rate negative or
   not finite; momentum outside [0, 1), or above 0 but kind not TOPK or
   no error feedback; warmup_steps negative, or above 0 but kind not
   TOPK), recorded on ctx.
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_compress_check(dsgd_ctx *ctx, const dsgd_compress_desc *desc);

/* A comm hook that compresses each bucket as desc says (COMPRESSION above),
   with error feedback. user points at desc: it must live until the hook's
   create has run (a strategy creates its replicas' states when it is
   created), which copies it into each replica's state. Its create
   returns DSGD_ERR_INVALID_ARGUMENT for a desc that dsgd_compress_check
   refuses (the message: dsgd_compress_check), DSGD_ERR_OUT_OF_MEMORY. Its
   reduce records its errors on the bucket's communicator's context: a
   bucket that is not whole variables laid end to end
   (DSGD_ERR_INVALID_ARGUMENT), over 2^32 - 1 floats (TOPK), outside the
   num_params floats of create, or from a collective.
   Errors: none (desc is read by create). Thread safety: any thread. */
DSGD_API dsgd_comm_hook dsgd_compress_hook(const dsgd_compress_desc *desc);

/* The bytes of one replica's message for bucket (its count, vars and step)
   under desc (BYTES above); 0 when desc or bucket is NULL, desc is not
   valid or the bucket's variables do not lie end to end over it.
   Errors: none. Thread safety: any thread. */
DSGD_API size_t dsgd_compress_bytes(const dsgd_compress_desc *desc, const dsgd_hook_bucket *bucket);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_COMPRESS_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_COMPRESS) && !defined(DSGD__PART_COMPRESS_IMPL)
#define DSGD__PART_COMPRESS_IMPL

/* >>compress_desc ---------------------------------------------------------- */

DSGD_API const char *dsgd_compress_kind_name(dsgd_compress_kind kind) {
    static const char *const names[DSGD_COMPRESS_KIND_COUNT] = {"none", "topk", "sign", "powersgd", "fp16", "bf16"};
    return (int)kind >= 0 && (int)kind < (int)DSGD_COMPRESS_KIND_COUNT ? names[kind] : "unknown";
}

/* Checks d and fills *out with its defaults; writes the complaint to msg. */
static dsgd_result dsgd__compress_fill(const dsgd_compress_desc *d, dsgd_compress_desc *out, char *msg, size_t cap) {
    if (!d) {
        snprintf(msg, cap, "dsgd_compress: desc is NULL");
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if ((int)d->kind < 0 || (int)d->kind >= (int)DSGD_COMPRESS_KIND_COUNT) {
        snprintf(msg, cap, "dsgd_compress: unknown kind %d", (int)d->kind);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (!(d->ratio >= 0.0 && d->ratio <= 1.0)) {
        snprintf(msg, cap, "dsgd_compress: ratio %g is outside (0, 1] (0: the default %g)", d->ratio,
                 DSGD_COMPRESS_DEFAULT_RATIO);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (d->rank < 0 || d->rank > 1024) {
        snprintf(msg, cap, "dsgd_compress: rank %d is outside 1..1024 (0: the default %d)", d->rank,
                 DSGD_COMPRESS_DEFAULT_RANK);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (d->start_iter < 0) {
        snprintf(msg, cap, "dsgd_compress: start_iter %lld is negative", (long long)d->start_iter);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (!(d->min_compression_rate >= 0.0 && d->min_compression_rate <= DBL_MAX)) {
        snprintf(msg, cap, "dsgd_compress: min_compression_rate %g is negative or not finite (0: the default %g)",
                 d->min_compression_rate, DSGD_COMPRESS_DEFAULT_MIN_RATE);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (!(d->momentum >= 0.0f && d->momentum < 1.0f)) {
        snprintf(msg, cap, "dsgd_compress: momentum %g is outside [0, 1)", (double)d->momentum);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (d->momentum > 0.0f && (d->kind != DSGD_COMPRESS_TOPK || d->no_error_feedback)) {
        snprintf(msg, cap, "dsgd_compress: momentum correction (momentum %g) needs kind topk with error feedback",
                 (double)d->momentum);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (d->warmup_steps < 0 || (d->warmup_steps > 0 && d->kind != DSGD_COMPRESS_TOPK)) {
        snprintf(msg, cap, "dsgd_compress: warmup_steps %lld is %s", (long long)d->warmup_steps,
                 d->warmup_steps < 0 ? "negative" : "for kind topk only");
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    *out = *d;
    if (out->ratio == 0.0) out->ratio = DSGD_COMPRESS_DEFAULT_RATIO;
    if (out->rank == 0) out->rank = DSGD_COMPRESS_DEFAULT_RANK;
    if (out->min_compression_rate == 0.0) out->min_compression_rate = DSGD_COMPRESS_DEFAULT_MIN_RATE;
    if (out->seed == 0) out->seed = DSGD_COMPRESS_DEFAULT_SEED;
    out->global = out->global != 0;
    out->no_warm_start = out->no_warm_start != 0;
    out->nesterov = out->nesterov != 0 && out->momentum > 0.0f;
    out->no_error_feedback = out->no_error_feedback != 0 || out->kind == DSGD_COMPRESS_NONE ||
                             out->kind == DSGD_COMPRESS_FP16 || out->kind == DSGD_COMPRESS_BF16;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_compress_check(dsgd_ctx *ctx, const dsgd_compress_desc *desc) {
    char msg[256];
    dsgd_compress_desc full;
    dsgd_result res;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__compress_fill(desc, &full, msg, sizeof(msg));
    return res == DSGD_OK ? DSGD_OK : dsgd_ctx_set_error(ctx, res, "%s", msg);
}

/* >>compress_shapes -------------------------------------------------------- */

/* k of top-k for n floats: ceil(ratio n), a product within 1e-9 of an
   integer taken as that integer (0.07 * 100 is 7, not 8), in [1, n]. */
static size_t dsgd__topk_k(double ratio, size_t n) {
    double x = ratio * (double)n, near = floor(x + 0.5), k;
    if (n == 0) return 0;
    k = fabs(x - near) <= 1e-9 * (x > 1.0 ? x : 1.0) ? near : ceil(x);
    if (k < 1.0) k = 1.0;
    return k >= (double)n ? n : (size_t)k;
}

/* Top-k's kept fraction at step: ratio, but during the sparsity warm-up
   (warmup_steps from start_iter) stage j of S keeps 4^-(j + 1), S the
   number of those fractions above ratio, stage j the steps t - start_iter
   in [floor(j W / S), floor((j + 1) W / S)) of the W = warmup_steps. */
static double dsgd__topk_ratio_at(const dsgd_compress_desc *d, int64_t step) {
    int64_t t = step - d->start_iter, W = d->warmup_steps, S = 0, j;
    double f = 0.25;
    if (W <= 0 || step < d->start_iter || t >= W) return d->ratio;
    while (f > d->ratio) { /* at most ~540 stages: ratio > 0 is a double */
        ++S;
        f *= 0.25;
    }
    if (S == 0) return d->ratio;
    /* floor(j W / S) <= t, without overflow: W = q S + rem */
    for (j = S - 1; j > 0; --j)
        if ((W / S) * j + (W % S) * j / S <= t) break;
    return ldexp(1.0, -2 * (int)(j + 1));
}

/* A variable as PowerSGD sees it: rows n, columns m, rank r (0: reduced
   plainly). */
typedef struct dsgd__pmat {
    size_t off, n, m; /* off: in the bucket */
    size_t po, qo;    /* where its P (n x r) and Q (m x r) start in the scratch */
    int r;
} dsgd__pmat;

static void dsgd__pmat_of(const dsgd_compress_desc *d, const dsgd_variable *v, size_t off, dsgd__pmat *pm) {
    size_t n = v->rank >= 2 && v->shape[0] > 0 ? (size_t)v->shape[0] : 1, m = n ? v->count / n : 0;
    size_t r = (size_t)d->rank;
    pm->off = off;
    pm->n = n;
    pm->m = m;
    pm->r = 0;
    if (v->rank < 2 || n < 2 || m < 2) return;
    if (r > n) r = n;
    if (r > m) r = m;
    if ((double)n * (double)m / ((double)r * ((double)n + (double)m)) >= d->min_compression_rate) pm->r = (int)r;
}

/* The bucket's variables lie end to end over [first, first + count) with
   consistent shapes; 0 when they do (or there are none), else a message. */
static int dsgd__bucket_bad(const dsgd_hook_bucket *b, char *msg, size_t cap) {
    size_t at = b->first;
    int i, j;
    for (i = 0; i < b->num_vars; ++i) {
        const dsgd_variable *v = b->vars ? b->vars[i] : NULL;
        size_t prod = 1;
        if (!v) {
            snprintf(msg, cap, "variable %d of the bucket is NULL", i);
            return 1;
        }
        if (v->rank < 1 || v->rank > DSGD_MAX_RANK) {
            snprintf(msg, cap, "variable %s has rank %d", v->name, v->rank);
            return 1;
        }
        for (j = 0; j < v->rank; ++j) prod *= v->shape[j] > 0 ? (size_t)v->shape[j] : 0;
        if (prod != v->count || v->offset != at || v->count > b->first + b->count - at) {
            snprintf(msg, cap,
                     "variable %s (offset %zu, %zu floats) does not follow at %zu inside the bucket [%zu, %zu)"
                     " with a shape of its count",
                     v->name, v->offset, v->count, at, b->first, b->first + b->count);
            return 1;
        }
        at += v->count;
    }
    if (b->num_vars > 0 && at != b->first + b->count) {
        snprintf(msg, cap, "the bucket's variables end at %zu, the bucket at %zu", at, b->first + b->count);
        return 1;
    }
    return 0;
}

/* A segment of the bucket: a variable, or the whole bucket when it has no
   variables (or for global top-k). */
static void dsgd__segment(const dsgd_hook_bucket *b, int whole, int i, size_t *off, size_t *n) {
    if (whole || b->num_vars == 0) {
        *off = 0;
        *n = b->count;
    } else {
        *off = b->vars[i]->offset - b->first;
        *n = b->vars[i]->count;
    }
}

/* Before start_iter the error-feedback compressors all-reduce plainly. */
static int dsgd__compress_warming(const dsgd_compress_desc *d, const dsgd_hook_bucket *b) {
    return (d->kind == DSGD_COMPRESS_TOPK || d->kind == DSGD_COMPRESS_SIGN || d->kind == DSGD_COMPRESS_POWERSGD) &&
           b->step < d->start_iter;
}

static int dsgd__num_segments(const dsgd_hook_bucket *b, int whole) {
    return whole || b->num_vars == 0 ? 1 : b->num_vars;
}

DSGD_API size_t dsgd_compress_bytes(const dsgd_compress_desc *desc, const dsgd_hook_bucket *b) {
    char msg[256];
    dsgd_compress_desc d;
    size_t floats = 0, off, n;
    int i, ns;
    if (!b || dsgd__compress_fill(desc, &d, msg, sizeof(msg)) != DSGD_OK || dsgd__bucket_bad(b, msg, sizeof(msg)))
        return 0;
    if (dsgd__compress_warming(&d, b)) return b->count * sizeof(float);
    switch (d.kind) {
    case DSGD_COMPRESS_TOPK:
        ns = dsgd__num_segments(b, d.global);
        for (i = 0; i < ns; ++i) {
            dsgd__segment(b, d.global, i, &off, &n);
            floats += 2 * dsgd__topk_k(dsgd__topk_ratio_at(&d, b->step), n);
        }
        break;
    case DSGD_COMPRESS_SIGN:
        ns = dsgd__num_segments(b, 0);
        for (i = 0; i < ns; ++i) {
            dsgd__segment(b, 0, i, &off, &n);
            floats += n ? 1 + (n + 31) / 32 : 0;
        }
        break;
    case DSGD_COMPRESS_POWERSGD:
        if (b->num_vars == 0) return b->count * sizeof(float);
        for (i = 0; i < b->num_vars; ++i) {
            dsgd__pmat pm;
            dsgd__pmat_of(&d, b->vars[i], 0, &pm);
            floats += pm.r ? (size_t)pm.r * (pm.n + pm.m) : b->vars[i]->count;
        }
        break;
    case DSGD_COMPRESS_FP16:
    case DSGD_COMPRESS_BF16: return b->count * 2;
    default: floats = b->count; break;
    }
    return floats * sizeof(float);
}

/* >>compress_state --------------------------------------------------------- */

#define DSGD__COMPRESS_TAG 0x31504D4344475344ull /* "DSGDCMP1" */
#define DSGD__COMPRESS_HEADER 24

typedef struct dsgd__compress {
    dsgd_compress_desc d; /* defaults filled */
    int replica, num_replicas;
    size_t num_params;
    float *res;  /* (num_params) the residual; NULL without error feedback */
    float *qmem; /* (num_params) PowerSGD's Q memories; NULL without warm start */
    float *mom;  /* (num_params) top-k's momentum u (momentum correction); else NULL */
    /* scratch, grown on demand (not saved) */
    float *buf;
    size_t buf_cap;
    uint64_t *keys;
    size_t keys_cap;
    double *acc;
    size_t acc_cap;
    dsgd__pmat *mats;
    int mats_cap;
    double coll_s; /* real seconds inside collectives, this reduce so far */
} dsgd__compress;

static void dsgd__compress_destroy(void *state) {
    dsgd__compress *s = (dsgd__compress *)state;
    if (!s) return;
    DSGD_FREE(s->res);
    DSGD_FREE(s->qmem);
    DSGD_FREE(s->mom);
    DSGD_FREE(s->buf);
    DSGD_FREE(s->keys);
    DSGD_FREE(s->acc);
    DSGD_FREE(s->mats);
    DSGD_FREE(s);
}

static dsgd_result dsgd__compress_create(void *user, int replica, int num_replicas, size_t num_params, void **state) {
    char msg[256];
    dsgd__compress *s;
    size_t bytes;
    if (!state) return DSGD_ERR_INVALID_ARGUMENT;
    *state = NULL;
    if (num_replicas < 1 || replica < 0 || replica >= num_replicas) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__mul_overflows(num_params, sizeof(float), &bytes)) return DSGD_ERR_INVALID_ARGUMENT;
    s = (dsgd__compress *)DSGD_MALLOC(sizeof(*s));
    if (!s) return DSGD_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof(*s));
    if (dsgd__compress_fill((const dsgd_compress_desc *)user, &s->d, msg, sizeof(msg)) != DSGD_OK) {
        DSGD_FREE(s);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    s->replica = replica;
    s->num_replicas = num_replicas;
    s->num_params = num_params;
    if (!s->d.no_error_feedback) {
        s->res = (float *)DSGD_MALLOC(bytes ? bytes : 1);
        if (s->res) memset(s->res, 0, bytes);
    }
    if (s->d.kind == DSGD_COMPRESS_POWERSGD && !s->d.no_warm_start) {
        s->qmem = (float *)DSGD_MALLOC(bytes ? bytes : 1);
        if (s->qmem) memset(s->qmem, 0, bytes);
    }
    if (s->d.momentum > 0.0f) {
        s->mom = (float *)DSGD_MALLOC(bytes ? bytes : 1);
        if (s->mom) memset(s->mom, 0, bytes);
    }
    if ((!s->d.no_error_feedback && !s->res) ||
        (s->d.kind == DSGD_COMPRESS_POWERSGD && !s->d.no_warm_start && !s->qmem) ||
        (s->d.momentum > 0.0f && !s->mom)) {
        dsgd__compress_destroy(s);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    *state = s;
    return DSGD_OK;
}

static size_t dsgd__compress_state_bytes(void *state) {
    dsgd__compress *s = (dsgd__compress *)state;
    size_t arrays;
    if (!s) return 0;
    arrays = (s->res ? 1u : 0u) + (s->qmem ? 1u : 0u) + (s->mom ? 1u : 0u);
    return arrays ? DSGD__COMPRESS_HEADER + arrays * s->num_params * sizeof(float) : 0;
}

static void dsgd__compress_header(const dsgd__compress *s, unsigned char *h) {
    uint64_t tag = DSGD__COMPRESS_TAG, np = (uint64_t)s->num_params;
    uint32_t kind = (uint32_t)s->d.kind | (s->res ? 0x100u : 0u) | (s->qmem ? 0x200u : 0u) | (s->mom ? 0x400u : 0u);
    uint32_t rank = (uint32_t)s->d.rank;
    memcpy(h, &tag, 8);
    memcpy(h + 8, &kind, 4);
    memcpy(h + 12, &rank, 4);
    memcpy(h + 16, &np, 8);
}

static dsgd_result dsgd__compress_save(void *state, void *dst, size_t bytes) {
    dsgd__compress *s = (dsgd__compress *)state;
    unsigned char *p = (unsigned char *)dst;
    size_t arr;
    if (!s || !dst || bytes != dsgd__compress_state_bytes(s) || bytes == 0) return DSGD_ERR_INVALID_ARGUMENT;
    arr = s->num_params * sizeof(float);
    dsgd__compress_header(s, p);
    p += DSGD__COMPRESS_HEADER;
    if (s->res) {
        memcpy(p, s->res, arr);
        p += arr;
    }
    if (s->qmem) {
        memcpy(p, s->qmem, arr);
        p += arr;
    }
    if (s->mom) memcpy(p, s->mom, arr);
    return DSGD_OK;
}

static dsgd_result dsgd__compress_load(void *state, const void *src, size_t bytes) {
    dsgd__compress *s = (dsgd__compress *)state;
    const unsigned char *p = (const unsigned char *)src;
    unsigned char want[DSGD__COMPRESS_HEADER];
    size_t arr;
    if (!s || !src || bytes != dsgd__compress_state_bytes(s) || bytes == 0) return DSGD_ERR_INVALID_ARGUMENT;
    dsgd__compress_header(s, want);
    if (memcmp(want, p, DSGD__COMPRESS_HEADER) != 0) return DSGD_ERR_INVALID_ARGUMENT;
    arr = s->num_params * sizeof(float);
    p += DSGD__COMPRESS_HEADER;
    if (s->res) {
        memcpy(s->res, p, arr);
        p += arr;
    }
    if (s->qmem) {
        memcpy(s->qmem, p, arr);
        p += arr;
    }
    if (s->mom) memcpy(s->mom, p, arr);
    return DSGD_OK;
}

/* The collectives a compressor calls, timed (real seconds into s->coll_s,
   so that the rest of reduce is its compression time). */
static dsgd_result dsgd__cz_allgather(dsgd__compress *s, const dsgd_hook_bucket *b, float *buf, size_t count) {
    double t = dsgd_now();
    dsgd_result r = dsgd_allgather(b->comm, buf, count, b->timeout_s);
    s->coll_s += dsgd_now() - t;
    return r;
}

static dsgd_result dsgd__cz_allreduce(dsgd__compress *s, const dsgd_hook_bucket *b, float *buf, size_t count,
                                      size_t first) {
    double t = dsgd_now();
    dsgd_result r = dsgd_allreduce_at(b->comm, buf, count, first, DSGD_REDUCE_SUM, b->algorithm, b->timeout_s);
    s->coll_s += dsgd_now() - t;
    return r;
}

static dsgd_result dsgd__plain(dsgd__compress *s, const dsgd_hook_bucket *b, size_t off, size_t len) {
    return dsgd__cz_allreduce(s, b, b->data + off, len, b->first + off);
}

/* Scratch of n floats / keys / doubles, grown on demand. */
static float *dsgd__cbuf(dsgd__compress *s, dsgd_ctx *ctx, size_t n) {
    if (n > s->buf_cap) {
        float *p;
        if (n > SIZE_MAX / sizeof(float)) return NULL;
        p = (float *)DSGD_REALLOC(s->buf, n * sizeof(float));
        if (!p) {
            dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_compress: cannot allocate %zu floats", n);
            return NULL;
        }
        s->buf = p;
        s->buf_cap = n;
    }
    return s->buf;
}

static uint64_t *dsgd__ckeys(dsgd__compress *s, dsgd_ctx *ctx, size_t n) {
    if (n > s->keys_cap) {
        uint64_t *p;
        if (n > SIZE_MAX / sizeof(uint64_t)) return NULL;
        p = (uint64_t *)DSGD_REALLOC(s->keys, n * sizeof(uint64_t));
        if (!p) {
            dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_compress: cannot allocate %zu keys", n);
            return NULL;
        }
        s->keys = p;
        s->keys_cap = n;
    }
    return s->keys;
}

static double *dsgd__cacc(dsgd__compress *s, dsgd_ctx *ctx, size_t n) {
    if (n > s->acc_cap) {
        double *p;
        if (n > SIZE_MAX / sizeof(double)) return NULL;
        p = (double *)DSGD_REALLOC(s->acc, n * sizeof(double));
        if (!p) {
            dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_compress: cannot allocate %zu doubles", n);
            return NULL;
        }
        s->acc = p;
        s->acc_cap = n;
    }
    return s->acc;
}

static uint32_t dsgd__fbits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float dsgd__bitsf(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* >>compress_topk ---------------------------------------------------------- */

/* The key of element i: |x|'s bits above, ~i below, so that the larger key
   is the larger magnitude, then the lower index (NaN above infinity). */
static uint64_t dsgd__topk_key(float x, size_t i) {
    return ((uint64_t)(dsgd__fbits(x) & 0x7FFFFFFFu) << 32) | (uint64_t)(0xFFFFFFFFu - (uint32_t)i);
}

static void dsgd__swap64(uint64_t *a, uint64_t *b) {
    uint64_t t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k largest of keys[0..n) to the front (in no order):
   quickselect with a median-of-three pivot; keys are distinct, so the k
   keys moved there do not depend on the partitioning's order. The
   partition is Lomuto's without a branch on the comparison (every key is
   swapped with the boundary's, which moves on when the key is above the
   pivot): gradients' magnitudes make that branch a coin flip. */
static void dsgd__select_top(uint64_t *keys, size_t n, size_t k) {
    size_t lo = 0, hi = n; /* the k-th largest is in [lo, hi) */
    while (hi - lo > 1 && k > lo && k < hi) {
        size_t mid = lo + (hi - lo) / 2, i, store, at;
        uint64_t a = keys[lo], b = keys[mid], c = keys[hi - 1], pivot;
        at = a < b ? (b < c ? mid : (a < c ? hi - 1 : lo)) : (a < c ? lo : (b < c ? hi - 1 : mid));
        pivot = keys[at];
        dsgd__swap64(&keys[at], &keys[hi - 1]);
        for (store = lo, i = lo; i < hi - 1; ++i) {
            uint64_t x = keys[i];
            keys[i] = keys[store];
            keys[store] = x;
            store += x > pivot;
        }
        dsgd__swap64(&keys[store], &keys[hi - 1]); /* keys[store] = pivot: store + 1 keys >= pivot before it */
        if (store + 1 == k) return;
        if (store + 1 < k) lo = store + 1;
        else hi = store;
    }
}

static int dsgd__cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static dsgd_result dsgd__topk_reduce(dsgd__compress *s, const dsgd_hook_bucket *b, dsgd_ctx *ctx) {
    int ns = dsgd__num_segments(b, s->d.global), i, r, n = b->num_replicas;
    size_t K = 0, at = 0, j, off, len, total;
    double ratio = dsgd__topk_ratio_at(&s->d, b->step);
    float *msg, *all;
    uint64_t *keys;
    dsgd_result res;
    if (b->count > 0xFFFFFFFFu)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_compress (topk): bucket %d has %zu floats, over the 2^32 - 1 its indices carry",
                                  b->index, b->count);
    for (i = 0; i < ns; ++i) {
        dsgd__segment(b, s->d.global, i, &off, &len);
        K += dsgd__topk_k(ratio, len);
    }
    if (2 * K > SIZE_MAX / (size_t)n / sizeof(float))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_compress (topk): message too large");
    total = 2 * K * (size_t)n;
    if (!(all = dsgd__cbuf(s, ctx, total)) || !(keys = dsgd__ckeys(s, ctx, b->count ? b->count : 1)))
        return DSGD_ERR_OUT_OF_MEMORY;
    msg = all + 2 * K * (size_t)b->replica; /* this replica's block: K indices, then K values */
    for (i = 0; i < ns; ++i) {
        size_t k;
        dsgd__segment(b, s->d.global, i, &off, &len);
        k = dsgd__topk_k(ratio, len);
        for (j = 0; j < len; ++j) keys[j] = dsgd__topk_key(b->data[off + j], off + j);
        dsgd__select_top(keys, len, k);
        for (j = 0; j < k; ++j) keys[j] = 0xFFFFFFFFu - (uint32_t)(keys[j] & 0xFFFFFFFFu);
        qsort(keys, k, sizeof(uint64_t), dsgd__cmp_u64); /* the kept indices, ascending */
        for (j = 0; j < k; ++j) {
            msg[at + j] = dsgd__bitsf((uint32_t)keys[j]);
            msg[K + at + j] = b->data[keys[j]];
        }
        at += k;
    }
    if (s->res) {
        memcpy(s->res + b->first, b->data, b->count * sizeof(float));
        for (j = 0; j < K; ++j) s->res[b->first + dsgd__fbits(msg[j])] = 0.0f;
    }
    if (s->mom) /* momentum factor masking */
        for (j = 0; j < K; ++j) s->mom[b->first + dsgd__fbits(msg[j])] = 0.0f;
    res = dsgd__cz_allgather(s, b, all, total);
    if (res != DSGD_OK) return res;
    memset(b->data, 0, b->count * sizeof(float));
    for (r = 0; r < n; ++r) {
        const float *m = all + 2 * K * (size_t)r;
        for (j = 0; j < K; ++j) {
            uint32_t idx = dsgd__fbits(m[j]);
            if (idx >= b->count)
                return dsgd_ctx_set_error(ctx, DSGD_ERR_DESYNC,
                                          "dsgd_compress (topk): replica %d sent index %u for bucket %d of %zu floats",
                                          r, (unsigned)idx, b->index, b->count);
            b->data[idx] += m[K + j];
        }
    }
    return DSGD_OK;
}

/* >>compress_sign ---------------------------------------------------------- */

/* x rounded to 8 significant bits (to nearest, ties to even), as bfloat16
   holds it; infinities and NaN as they are. */
static float dsgd__round8(float x) {
    uint32_t u = dsgd__fbits(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return dsgd__bitsf(u);
}

static dsgd_result dsgd__sign_reduce(dsgd__compress *s, const dsgd_hook_bucket *b, dsgd_ctx *ctx) {
    int ns = dsgd__num_segments(b, 0), i, r, n = b->num_replicas;
    size_t W = 0, at, j, off, len, total;
    float *all, *msg;
    dsgd_result res;
    for (i = 0; i < ns; ++i) {
        dsgd__segment(b, 0, i, &off, &len);
        W += len ? 1 + (len + 31) / 32 : 0;
    }
    if (W > SIZE_MAX / (size_t)n / sizeof(float))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_compress (sign): message too large");
    total = W * (size_t)n;
    if (!(all = dsgd__cbuf(s, ctx, total))) return DSGD_ERR_OUT_OF_MEMORY;
    msg = all + W * (size_t)b->replica; /* per segment: the scale, then the sign words */
    for (i = 0, at = 0; i < ns; ++i) {
        const float *m;
        double l1 = 0.0;
        float sc;
        dsgd__segment(b, 0, i, &off, &len);
        if (!len) continue;
        m = b->data + off;
        for (j = 0; j < len; ++j) l1 += fabs((double)m[j]);
        sc = dsgd__round8((float)(l1 / (double)len));
        msg[at] = sc;
        for (j = 0; j < (len + 31) / 32; ++j) {
            uint32_t w = 0, t;
            size_t e = j * 32 + 32 < len ? j * 32 + 32 : len;
            for (t = 0; j * 32 + t < e; ++t) w |= (dsgd__fbits(m[j * 32 + t]) >> 31) << t;
            msg[at + 1 + j] = dsgd__bitsf(w);
        }
        if (s->res)
            for (j = 0; j < len; ++j) s->res[b->first + off + j] = m[j] - (dsgd__fbits(m[j]) >> 31 ? -sc : sc);
        at += 1 + (len + 31) / 32;
    }
    res = dsgd__cz_allgather(s, b, all, total);
    if (res != DSGD_OK) return res;
    memset(b->data, 0, b->count * sizeof(float));
    for (r = 0; r < n; ++r) {
        const float *m = all + W * (size_t)r;
        for (i = 0, at = 0; i < ns; ++i) {
            float sc, *out;
            dsgd__segment(b, 0, i, &off, &len);
            if (!len) continue;
            sc = m[at];
            out = b->data + off;
            for (j = 0; j < len; ++j) {
                uint32_t w = dsgd__fbits(m[at + 1 + j / 32]);
                out[j] += (w >> (j % 32)) & 1u ? -sc : sc;
            }
            at += 1 + (len + 31) / 32;
        }
    }
    return DSGD_OK;
}

/* >>compress_powersgd ------------------------------------------------------ */

/* Column c of P (n x r, row-major) less its projections on columns 0..c-1
   (one modified Gram-Schmidt pass, sums in double, in index order);
   returns its norm after. */
static double dsgd__mgs_pass(float *P, size_t n, int r, int c) {
    double norm = 0.0;
    size_t i;
    int l;
    for (l = 0; l < c; ++l) {
        double dot = 0.0;
        for (i = 0; i < n; ++i) dot += (double)P[i * r + l] * (double)P[i * r + c];
        for (i = 0; i < n; ++i) P[i * r + c] = (float)((double)P[i * r + c] - dot * (double)P[i * r + l]);
    }
    for (i = 0; i < n; ++i) norm += (double)P[i * r + c] * (double)P[i * r + c];
    return sqrt(norm);
}

/* Orthonormal columns of P (n x r, row-major): modified Gram-Schmidt,
   with a second pass over a column whose norm fell below 1/32 of its
   norm before the projections ("twice is enough": Daniel, Gragg, Kaufman
   and Stewart's reorthogonalization, at a lower threshold). One pass
   leaves a column about eps x (norm before / norm after) off orthogonal
   (eps the float's 2^-24, its entries being rounded at the size they had
   before): up to 32 eps without the second pass, which keeps the bits of
   every P that loses less. A column almost in the span of the ones before
   (P = M Q of a matrix of rank below r: what remains is that rounding)
   would otherwise be that rounding normalised to unit length, carrying
   the earlier directions again, and P (M^T P)^T would count them twice;
   after the second pass it is orthogonal to them to float precision, and
   the rank-r product reproduces a matrix of lower rank. A column of norm
   0 (or not finite) is left as it is after the projections. */
static void dsgd__orthonormalize(float *P, size_t n, int r) {
    int c;
    size_t i;
    for (c = 0; c < r; ++c) {
        double before = 0.0, norm;
        if (c > 0)
            for (i = 0; i < n; ++i) before += (double)P[i * r + c] * (double)P[i * r + c];
        norm = dsgd__mgs_pass(P, n, r, c);
        if (c > 0 && 1024.0 * norm * norm < before) norm = dsgd__mgs_pass(P, n, r, c);
        if (norm > 0.0 && norm <= DBL_MAX)
            for (i = 0; i < n; ++i) P[i * r + c] = (float)((double)P[i * r + c] / norm);
    }
}

/* The products below sum each entry in double, in index order (the same
   bits whatever the loop order): they walk M by rows, once, and keep the
   r sums of a row (or the m r of M^T P) in a scratch of doubles, so the
   inner loops run over contiguous memory. */

/* P (n x r) = M (n x m) Q (m x r); acc: r doubles. */
static void dsgd__mul_mq(const float *M, const float *Q, size_t n, size_t m, int r, float *P, double *acc) {
    size_t i, k;
    int j;
    for (i = 0; i < n; ++i) {
        const float *row = M + i * m;
        for (j = 0; j < r; ++j) acc[j] = 0.0;
        if (r == 2) { /* the default rank, unrolled */
            double a0 = 0.0, a1 = 0.0;
            for (k = 0; k < m; ++k) {
                double x = (double)row[k];
                a0 += x * (double)Q[2 * k];
                a1 += x * (double)Q[2 * k + 1];
            }
            acc[0] = a0;
            acc[1] = a1;
        } else
            for (k = 0; k < m; ++k) {
                double x = (double)row[k];
                const float *q = Q + k * (size_t)r;
                for (j = 0; j < r; ++j) acc[j] += x * (double)q[j];
            }
        for (j = 0; j < r; ++j) P[i * (size_t)r + j] = (float)acc[j];
    }
}

/* Q (m x r) = M^T P (M n x m, P n x r); acc: m r doubles. */
static void dsgd__mul_mtp(const float *M, const float *P, size_t n, size_t m, int r, float *Q, double *acc) {
    size_t i, k, kr = m * (size_t)r;
    int j;
    for (k = 0; k < kr; ++k) acc[k] = 0.0;
    for (i = 0; i < n; ++i) {
        const float *row = M + i * m, *p = P + i * (size_t)r;
        if (r == 2) {
            double p0 = (double)p[0], p1 = (double)p[1];
            for (k = 0; k < m; ++k) {
                double x = (double)row[k];
                acc[2 * k] += x * p0;
                acc[2 * k + 1] += x * p1;
            }
        } else
            for (k = 0; k < m; ++k) {
                double x = (double)row[k], *a = acc + k * (size_t)r;
                for (j = 0; j < r; ++j) a[j] += x * (double)p[j];
            }
    }
    for (k = 0; k < kr; ++k) Q[k] = (float)acc[k];
}

/* Row i of A B^T (A n x r, B m x r) into out (m floats). */
static void dsgd__outer_row(const float *A, const float *B, size_t i, size_t m, int r, float *out) {
    const float *a = A + i * (size_t)r;
    size_t k;
    int j;
    if (r == 2) {
        double a0 = (double)a[0], a1 = (double)a[1];
        for (k = 0; k < m; ++k) /* from 0.0, as the general loop: -0.0 products sum to +0.0 */
            out[k] = (float)((0.0 + a0 * (double)B[2 * k]) + a1 * (double)B[2 * k + 1]);
        return;
    }
    for (k = 0; k < m; ++k) {
        double sum = 0.0;
        for (j = 0; j < r; ++j) sum += (double)a[j] * (double)B[k * (size_t)r + j];
        out[k] = (float)sum;
    }
}

/* A (n x r) times B^T (B m x r) into out (n x m), sums in double. */
static void dsgd__outer(const float *A, const float *B, size_t n, size_t m, int r, float *out) {
    size_t i;
    for (i = 0; i < n; ++i) dsgd__outer_row(A, B, i, m, r, out + i * m);
}

/* c rounded to a multiple of 2^g (to nearest, ties to even), up = 2^-g and
   down = 2^g: for FLT_MIN_EXP <= g <= FLT_MAX_EXP - 21 both are normal
   powers of two, so c up is ldexpf(c, -g) (one correct rounding, should
   it underflow) and the product by down is exact: ldexpf's bits, without
   its calls (which cost more than PowerSGD's products). */
static float dsgd__to_grid(float c, float up, float down) {
    return rintf(c * up) * down;
}


/* The bucket's matrices (s->mats): each variable classified, the plain
   ones all-reduced (each run of neighbours in one call) with their
   residual zeroed, the compressed ones given their P and Q offsets;
   *lp, *lq: the floats of all P and all Q, *maxm: the widest m (0: none
   compressed). */
static dsgd_result dsgd__psgd_plan(dsgd__compress *s, const dsgd_hook_bucket *b, dsgd_ctx *ctx, size_t *lp,
                                   size_t *lq, size_t *maxm) {
    size_t run_off = 0, run_len = 0;
    int v, nm = b->num_vars;
    dsgd_result res;
    *lp = *lq = *maxm = 0;
    if (nm > s->mats_cap) {
        dsgd__pmat *p = (dsgd__pmat *)DSGD_REALLOC(s->mats, (size_t)nm * sizeof(dsgd__pmat));
        if (!p) return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_compress: cannot allocate");
        s->mats = p;
        s->mats_cap = nm;
    }
    for (v = 0; v < nm; ++v) {
        dsgd__pmat *pm = &s->mats[v];
        dsgd__pmat_of(&s->d, b->vars[v], b->vars[v]->offset - b->first, pm);
        if (pm->r) {
            pm->po = *lp;
            pm->qo = *lq;
            *lp += pm->n * (size_t)pm->r;
            *lq += pm->m * (size_t)pm->r;
            if (pm->m > *maxm) *maxm = pm->m;
            if (run_len && (res = dsgd__plain(s, b, run_off, run_len)) != DSGD_OK) return res;
            run_len = 0;
            continue;
        }
        if (s->res) memset(s->res + b->first + pm->off, 0, b->vars[v]->count * sizeof(float));
        if (!run_len) run_off = pm->off;
        run_len += b->vars[v]->count;
    }
    return run_len ? dsgd__plain(s, b, run_off, run_len) : DSGD_OK;
}

/* Matrix pm's Q (its memory, or a seeded draw when it has none or it is
   all zero), then P = M Q. */
static void dsgd__psgd_start(const dsgd__compress *s, const dsgd_hook_bucket *b, const dsgd__pmat *pm, float *P,
                             float *Q, double *acc) {
    size_t i, qn = pm->m * (size_t)pm->r;
    int fresh = 1;
    if (s->qmem) {
        const float *mem = s->qmem + b->first + pm->off;
        for (i = 0; i < qn && fresh; ++i) fresh = mem[i] == 0.0f;
        if (!fresh) memcpy(Q + pm->qo, mem, qn * sizeof(float));
    }
    if (fresh) {
        uint64_t st = dsgd__seed_mix(dsgd__seed_mix(s->d.seed, (uint64_t)(b->first + pm->off)), (uint64_t)b->step);
        for (i = 0; i < qn; ++i) Q[pm->qo + i] = (float)(2.0 * dsgd_rng_uniform(&st) - 1.0);
    }
    dsgd__mul_mq(b->data + pm->off, Q + pm->qo, pm->n, pm->m, pm->r, P + pm->po, acc);
}

/* Matrix pm after P was summed: P orthonormal, this replica's Q = M^T P
   and C = P Q^T rounded to M's grid (2^(E - 20), E M's largest exponent),
   the residual e = M - C and, with one replica, M = C (the sum over one). */
static void dsgd__psgd_feedback(dsgd__compress *s, const dsgd_hook_bucket *b, const dsgd__pmat *pm, float *P,
                                float *Q, double *acc) {
    float *M = b->data + pm->off, *Pv = P + pm->po, *Qv = Q + pm->qo, mx = 0.0f, up, down, *e, *c;
    size_t i, k, kr = pm->m * (size_t)pm->r;
    int ex = 0, grid, round;
    dsgd__orthonormalize(Pv, pm->n, pm->r);
    dsgd__mul_mtp(M, Pv, pm->n, pm->m, pm->r, Qv, acc);
    if (!s->res && b->num_replicas != 1) return;
    for (i = 0; i < pm->n * pm->m; ++i) {
        float a = fabsf(M[i]);
        if (!(a <= mx)) mx = a; /* NaN wins */
    }
    frexpf(mx, &ex);
    grid = ex - 21; /* 2^(E - 20), E = ex - 1 */
    e = s->res ? s->res + b->first + pm->off : NULL;
    c = (float *)(acc + kr);
    round = mx > 0.0f && mx <= FLT_MAX && grid >= FLT_MIN_EXP; /* grid <= 107: ex <= 128 */
    up = round ? ldexpf(1.0f, -grid) : 1.0f;
    down = round ? ldexpf(1.0f, grid) : 1.0f;
    for (i = 0; i < pm->n; ++i) {
        float *Mi = M + i * pm->m;
        dsgd__outer_row(Pv, Qv, i, pm->m, pm->r, c);
        if (round)
            for (k = 0; k < pm->m; ++k) c[k] = dsgd__to_grid(c[k], up, down);
        if (e)
            for (k = 0; k < pm->m; ++k) e[i * pm->m + k] = Mi[k] - c[k];
        if (b->num_replicas == 1) memcpy(Mi, c, pm->m * sizeof(float)); /* the sum over one replica */
    }
}

/* PowerSGD over the bucket (COMPRESSION above): plan, P = M Q, sum P,
   feedback, sum Q, then M = P Q^T and the Q memory. */
static dsgd_result dsgd__powersgd_reduce(dsgd__compress *s, const dsgd_hook_bucket *b, dsgd_ctx *ctx) {
    size_t Lp, Lq, maxm;
    int v, nm = b->num_vars;
    float *P, *Q;
    double *acc;
    dsgd_result res;
    if ((res = dsgd__psgd_plan(s, b, ctx, &Lp, &Lq, &maxm)) != DSGD_OK || !maxm) return res;
    if (!(P = dsgd__cbuf(s, ctx, Lp + Lq)) || !(acc = dsgd__cacc(s, ctx, maxm * (size_t)s->d.rank + maxm)))
        return DSGD_ERR_OUT_OF_MEMORY;
    Q = P + Lp;
    for (v = 0; v < nm; ++v)
        if (s->mats[v].r) dsgd__psgd_start(s, b, &s->mats[v], P, Q, acc);
    if ((res = dsgd__cz_allreduce(s, b, P, Lp, 0)) != DSGD_OK) return res;
    for (v = 0; v < nm; ++v)
        if (s->mats[v].r) dsgd__psgd_feedback(s, b, &s->mats[v], P, Q, acc);
    if ((res = dsgd__cz_allreduce(s, b, Q, Lq, 0)) != DSGD_OK) return res;
    for (v = 0; v < nm; ++v) {
        const dsgd__pmat *pm = &s->mats[v];
        if (!pm->r) continue;
        if (b->num_replicas > 1) dsgd__outer(P + pm->po, Q + pm->qo, pm->n, pm->m, pm->r, b->data + pm->off);
        if (s->qmem) memcpy(s->qmem + b->first + pm->off, Q + pm->qo, pm->m * (size_t)pm->r * sizeof(float));
    }
    return DSGD_OK;
}

/* >>compress_hook ---------------------------------------------------------- */

static dsgd_result dsgd__compress_reduce_in(void *state, const dsgd_hook_bucket *b) {
    dsgd__compress *s = (dsgd__compress *)state;
    dsgd_ctx *ctx;
    char msg[384];
    size_t i;
    const char *name;
    if (!b || !b->comm) return DSGD_ERR_INVALID_ARGUMENT;
    ctx = dsgd_comm_ctx(b->comm);
    if (!s) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_compress: the hook's state is NULL");
    name = dsgd_compress_kind_name(s->d.kind);
    if ((!b->data && b->count) || b->first > s->num_params || b->count > s->num_params - b->first)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_compress (%s): bucket %d [%zu, +%zu) is not inside the %zu parameters", name,
                                  b->index, b->first, b->count, s->num_params);
    if (b->num_replicas != dsgd_comm_size(b->comm) || b->replica != dsgd_comm_rank(b->comm))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_compress (%s): bucket %d says replica %d of %d, the communicator %d of %d", name,
                                  b->index, b->replica, b->num_replicas, dsgd_comm_rank(b->comm),
                                  dsgd_comm_size(b->comm));
    if (dsgd__bucket_bad(b, msg, sizeof(msg)))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_compress (%s): bucket %d: %s", name, b->index,
                                  msg);
    if (s->d.kind == DSGD_COMPRESS_FP16 || s->d.kind == DSGD_COMPRESS_BF16) /* the comm counts its own time */
        return dsgd_allreduce_wire(b->comm, b->data, b->count, b->first, DSGD_REDUCE_SUM,
                                   b->algorithm == DSGD_ALLREDUCE_RING ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_AUTO,
                                   s->d.kind == DSGD_COMPRESS_FP16 ? DSGD_WIRE_F16 : DSGD_WIRE_BF16, b->timeout_s);
    if (s->mom) { /* momentum correction: u = m u + g, then a = u (or g + m u) */
        float mu = s->d.momentum, *u = s->mom + b->first, *v = s->res + b->first;
        int warm = dsgd__compress_warming(&s->d, b);
        for (i = 0; i < b->count; ++i) {
            float g = b->data[i];
            u[i] = mu * u[i] + g;
            g = s->d.nesterov ? g + mu * u[i] : u[i];
            b->data[i] = warm ? g : v[i] + g; /* dense: the optimizer's momentum step; else M = v + a */
        }
        if (warm) return dsgd__plain(s, b, 0, b->count);
        return dsgd__topk_reduce(s, b, ctx);
    }
    if (s->d.kind == DSGD_COMPRESS_NONE || dsgd__compress_warming(&s->d, b)) return dsgd__plain(s, b, 0, b->count);
    if (s->res)
        for (i = 0; i < b->count; ++i) b->data[i] += s->res[b->first + i]; /* M = g + e */
    switch (s->d.kind) {
    case DSGD_COMPRESS_TOPK: return dsgd__topk_reduce(s, b, ctx);
    case DSGD_COMPRESS_SIGN: return dsgd__sign_reduce(s, b, ctx);
    default:
        if (b->num_vars == 0) return dsgd__plain(s, b, 0, b->count);
        return dsgd__powersgd_reduce(s, b, ctx);
    }
}

/* The hook's check: the desc's rules (dsgd_compress_check). */
static dsgd_result dsgd__compress_hook_check(void *user, dsgd_ctx *ctx) {
    return dsgd_compress_check(ctx, (const dsgd_compress_desc *)user);
}

/* The hook's reduce: the compressor, with its time outside the
   collectives added to the communicator's compress_s (dsgd_comm_stats_add;
   the half wires count their own). */
static dsgd_result dsgd__compress_reduce(void *state, const dsgd_hook_bucket *b) {
    dsgd__compress *s = (dsgd__compress *)state;
    dsgd_comm_stats add;
    double t = dsgd_now();
    dsgd_result r;
    if (s) s->coll_s = 0.0;
    r = dsgd__compress_reduce_in(state, b);
    if (s && b && b->comm && s->d.kind != DSGD_COMPRESS_FP16 && s->d.kind != DSGD_COMPRESS_BF16 &&
        s->d.kind != DSGD_COMPRESS_NONE && !dsgd__compress_warming(&s->d, b)) {
        memset(&add, 0, sizeof(add));
        add.compress_s = DSGD__MAX(0.0, dsgd_now() - t - s->coll_s);
        dsgd_comm_stats_add(b->comm, &add);
        /* a simulated clock: the bucket compressed and decompressed */
        if (r == DSGD_OK) r = dsgd_comm_charge_codec(b->comm, 2 * b->count);
    }
    return r;
}

DSGD_API dsgd_comm_hook dsgd_compress_hook(const dsgd_compress_desc *desc) {
    static const char *const names[DSGD_COMPRESS_KIND_COUNT] = {
        "compress_none", "compress_topk", "compress_sign", "compress_powersgd", "compress_fp16", "compress_bf16"};
    dsgd_comm_hook h;
    memset(&h, 0, sizeof(h));
    h.name = desc && (int)desc->kind >= 0 && (int)desc->kind < (int)DSGD_COMPRESS_KIND_COUNT ? names[desc->kind]
                                                                                             : "compress";
    h.create = dsgd__compress_create;
    h.reduce = dsgd__compress_reduce;
    h.state_bytes = dsgd__compress_state_bytes;
    h.save = dsgd__compress_save;
    h.load = dsgd__compress_load;
    h.destroy = dsgd__compress_destroy;
    h.user = (void *)desc;
    h.check = dsgd__compress_hook_check;
    h.owns_momentum = desc && desc->momentum > 0.0f;
    return h;
}

#endif /* DSGD__PART_COMPRESS_IMPL */
