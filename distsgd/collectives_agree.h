/* distsgd/collectives_agree.h - the agreement: fingerprints, their rounds, the first exchanges they carry
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of collectives.h (the communicator, its checks and exchanges;
   Agreement in COLLECTIVES there says what the ranks agree on and what it
   costs). Here: the fingerprint and the message-passing agreement over
   send and recv (>>agreement), and the agreement over sendrecv_upto,
   whose rounds carry an algorithm's first exchanges (>>fold), which
   collectives_algos.h calls. This part declares nothing public.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_COLLECTIVES_AGREE_IMPL)
#define DSGD__PART_COLLECTIVES_AGREE_IMPL

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

#endif /* DSGD__PART_COLLECTIVES_AGREE_IMPL */
