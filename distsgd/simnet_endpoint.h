/* distsgd/simnet_endpoint.h - the simnet endpoint: transfers, the transport's operations, run, the lanes
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of simnet.h (the simnet transport), after simnet_sched.h (the
   scheduler). Here: the link model and faults, posting a message and a
   rank's transfer (>>simnet transfers); the endpoint's operations, the
   charged compute, leave, dsgd_simnet_run (threads or fibers), park, spare
   and admit, and the table dsgd_simnet_endpoint fills; the strategies'
   lanes (>>simnet lanes). simnet.h declares and documents the public
   functions. This part declares nothing public.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_SIMNET) && !defined(DSGD__PART_SIMNET_ENDPOINT_IMPL)
#define DSGD__PART_SIMNET_ENDPOINT_IMPL

/* >>simnet transfers ------------------------------------------------------- */

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

/* A probe found m from src: its tag and size, and the call's spans (the
   wait until it began to arrive, then its bytes coming in); wait_peer is
   the span's peer (src, or DSGD__SN_ANY). */
static void dsgd__sn_probe_found(dsgd__sn_ep *e, const dsgd__sn_msg *m, int src, int wait_peer, uint64_t *tag,
                                 size_t *bytes) {
    double in, taken = dsgd__sn_taken(e, m, src, &in), r0 = DSGD__MAX(e->t_call, in);
    *tag = m->tag;
    *bytes = m->bytes;
    dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, e->t_call, r0, wait_peer, 0, 0);
    dsgd__sn_span_add(e, DSGD__SN_SP_RECEIVE, r0, taken, src, m->bytes, 0);
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
        *src = best;
        dsgd__sn_probe_found(e, dsgd__sn_head(h, best, e->rank), best, DSGD__SN_ANY, tag, bytes);
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
        dsgd__sn_probe_found(e, m, src, src, tag, bytes);
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

/* >>simnet lanes (the strategies' step: Two lanes in simnet.h) ------------- */

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


#endif /* DSGD__PART_SIMNET_ENDPOINT_IMPL */
