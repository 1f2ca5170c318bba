/* distsgd/collectives_algos.h - the all-reduce algorithms, the half wire and the collectives' entry points
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of collectives.h (the communicator, its checks and exchanges),
   after collectives_agree.h (the agreement). Here: blocks and pieces, the
   global element map (>>map), the ring, halving-doubling, recursive
   doubling, the broadcast tree, DIRECT, reduce-broadcast, the native hook
   and the hierarchical all-reduce; their table, dsgd__allreduce_algos; the
   half wire (>>wire); then the collectives themselves, dsgd_allreduce to
   dsgd_barrier, which collectives.h declares and documents (COLLECTIVES
   there says what each costs and in what order it reduces).
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_COLLECTIVES_ALGOS_IMPL)
#define DSGD__PART_COLLECTIVES_ALGOS_IMPL

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
        if (!p) return dsgd__coll_nomem(c, count, "floats to lay out the blocks");
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

/* The all-reduce algorithms by dsgd_allreduce_algo: their code (their
   names are dsgd_allreduce_algo_name's, in collectives.h). A new algorithm
   is an enumerator, its name there and one line here. agreed: the
   agreement and the algorithm together (DIRECT checks the fingerprints
   through the memory it shares, count 0 included; ring and recursive
   doubling carry their first exchanges with the agreement: see >>fold in
   collectives_agree.h); NULL: the agreement (dsgd__coll_agree), then run. */
static const struct {
    dsgd_result (*run)(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op);
    dsgd_result (*agreed)(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op);
} dsgd__allreduce_algos[DSGD_ALLREDUCE_COUNT] = {
    /* AUTO, resolved to the native hook */ {dsgd__native, NULL},
    /* RING */ {dsgd__ring_allreduce, dsgd__ring_allreduce_agreed},
    /* HALVING_DOUBLING */ {dsgd__halving_doubling, NULL},
    /* REDUCE_BROADCAST */ {dsgd__reduce_broadcast, NULL},
    /* RECURSIVE_DOUBLING */ {dsgd__recursive_doubling, dsgd__rd_agreed},
    /* DIRECT */ {dsgd__direct, dsgd__direct},
    /* HIERARCHICAL */ {dsgd__hierarchical, NULL},
};

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
        if (!p) return dsgd__coll_nomem(c, count * sizeof(uint16_t), "bytes for the wire");
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

/* >>entry points ----------------------------------------------------------- */

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

#endif /* DSGD__PART_COLLECTIVES_ALGOS_IMPL */
