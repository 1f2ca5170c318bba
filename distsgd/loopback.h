/* distsgd/loopback.h - the loopback transport: ranks as threads
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

     The loopback transport connects N ranks in one process: one thread per
     rank (the caller's threads), in-process mailboxes per ordered pair of
     ranks, real time. Messages up to 64 KiB are copied into the mailbox so
     the sender does not wait (unless 8 messages to that receiver are still
     queued); larger ones are posted by pointer and the receiver copies (or
     reduces) straight from the sender's memory while the sender waits. It
     also provides share/unshare, so AUTO all-reduces on it run
     DSGD_ALLREDUCE_DIRECT, and probe (receive from any source), which
     reports the waiting sources round-robin, and probe_from (one
     source's; no rank here is ever gone). A waiting rank spins briefly
     (pausing, then yielding the CPU), then sleeps on a condition variable;
     see dsgd_loopback_set_spin.
*/
#ifndef DSGD__PART_LOOPBACK_DECL
#define DSGD__PART_LOOPBACK_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- loopback */

typedef struct dsgd_loopback dsgd_loopback;

/* Creates a loopback hub for n ranks. ctx receives the errors of create and
   endpoint and must outlive the hub.
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx or out NULL, nothing recorded when
   ctx is; n outside 1..4096), DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_SYSTEM (a
   pthread mutex or condition variable could not be created).
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_loopback_create(dsgd_ctx *ctx, int n, dsgd_loopback **out);
/* Fills *out with the endpoint of `rank`; the endpoint lives as long as the
   hub (out->destroy is NULL). Each endpoint must be used by one thread at a
   time. Every member but destroy, allreduce and now is set.
   Errors: DSGD_ERR_INVALID_ARGUMENT (hub NULL, nothing recorded; out NULL;
   rank outside [0, n)).
   Thread safety: the thread of the hub's ctx. */
DSGD_API dsgd_result dsgd_loopback_endpoint(dsgd_loopback *hub, int rank, dsgd_transport_i *out);
/* Marks the hub aborted: every waiting and later transfer returns
   DSGD_ERR_ABORTED promptly (the endpoints' abort member does the same). Use it when one replica fails so that the others
   stop without waiting for their deadlines. Irreversible. hub NULL: nothing.
   Thread safety: any thread, at any time while the hub exists. */
DSGD_API void dsgd_loopback_abort(dsgd_loopback *hub);
/* Non-zero once dsgd_loopback_abort has been called (hub NULL: 0).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_loopback_aborted(dsgd_loopback *hub);
/* How long a waiting rank spins before it sleeps on a condition variable,
   in seconds (default 1 ms): first with a pause instruction (4 us, only
   when the hub has no more ranks than the machine has processors), then
   with sched_yield() so that ranks sharing a core let each other run.
   0: sleep at once; negative (or NaN): back to the default; more than 1 s
   counts as 1 s. hub NULL: nothing.
   Thread safety: one thread, before the ranks start. */
DSGD_API void dsgd_loopback_set_spin(dsgd_loopback *hub, double seconds);
/* Frees the hub; its endpoints are invalid afterwards. hub NULL: nothing.
   Thread safety: one thread, once no rank uses the hub (join the ranks'
   threads first). */
DSGD_API void dsgd_loopback_destroy(dsgd_loopback *hub);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_LOOPBACK_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_LOOPBACK_IMPL)
#define DSGD__PART_LOOPBACK_IMPL

/* >>loopback --------------------------------------------------------------- */
/* Mailboxes: for every ordered pair (src, dst) a single-producer
   single-consumer queue of DSGD__LB_QUEUE slots. `tail` counts messages
   posted (written by src), `head` messages consumed (written by dst). A slot
   is EAGER (the bytes sit in the slot's own storage) or RDV (rendezvous: the
   slot points at the sender's buffer and the sender waits until head has
   passed it). A rendezvous slot is claimed by the receiver (RDV -> TAKEN)
   before it reads, or withdrawn by a sender that gives up (RDV -> CANCELLED),
   so a timed-out sender never returns while its buffer is being read.

   Sleeping: each endpoint has one mutex + condition variable and a
   `sleeping` flag. A waiter spins for hub->spin_ns, then locks, sets
   sleeping, re-checks its conditions and waits; whoever changes a condition
   (posts into its inbox, consumes from its outbox, aborts) checks the flag
   after the change and signals under the mutex. Both sides use sequentially
   consistent atomics, so a wake-up cannot be lost. */

#define DSGD__LB_QUEUE 8
#define DSGD__LB_EAGER_MAX ((size_t)64 * 1024)
#define DSGD__LB_LINE 64
/* Waiting: a rank whose peer is not ready spins with a pause instruction for
   DSGD__LB_PAUSE_NS (skipped when the hub has more ranks than CPUs), then
   calls sched_yield() in a loop until DSGD__LB_SPIN_NS, then sleeps on its
   condition variable. Why, measured with distsgd's all-reduce benchmark on
   a 2-vCPU virtual machine shared with other work:
   - sleeping is expensive (a wake-up on an idle vCPU took ~50 us, up to ms
     under load), and once a rank sleeps its peer tends to wait long enough
     to sleep as well, so every later pipeline step pays a wake-up; a spin
     budget well above a step's time (10-50 us) avoids that convoy;
   - pausing for long is worse when two ranks end up on one CPU (or the
     peer is preempted): the spinner holds the CPU the peer needs; yielding
     lets the peer (or whatever else) run and costs ~1 us per round;
   - a short pause phase keeps small-message latency at ~1 us. */
#ifndef DSGD__LB_PAUSE_NS
#define DSGD__LB_PAUSE_NS 4000L
#endif
#ifndef DSGD__LB_SPIN_NS
#define DSGD__LB_SPIN_NS 1000000L
#endif

enum { DSGD__LB_FREE = 0, DSGD__LB_EAGER = 1, DSGD__LB_RDV = 2, DSGD__LB_TAKEN = 3, DSGD__LB_CANCELLED = 4 };

typedef struct dsgd__lb_slot {
    uint64_t tag;
    size_t bytes;
    const void *ptr; /* the payload: `store` (EAGER) or the sender's buffer (RDV) */
    int state;       /* atomic */
    void *store;     /* eager storage, owned by the slot, written by the sender */
    size_t cap;
} dsgd__lb_slot;

typedef struct dsgd__lb_pair {
    uint64_t tail; /* atomic; messages posted by src */
    char pad0[DSGD__LB_LINE - sizeof(uint64_t)];
    uint64_t head; /* atomic; messages consumed by dst */
    char pad1[DSGD__LB_LINE - sizeof(uint64_t)];
    dsgd__lb_slot slot[DSGD__LB_QUEUE];
    char pad2[DSGD__LB_LINE];
} dsgd__lb_pair;

typedef struct dsgd__lb_ep {
    struct dsgd_loopback *hub;
    int rank;
    int sleeping;      /* atomic */
    int probe_next;    /* probe: the source looked at first next time */
    uint64_t progress; /* atomic; last collective seq entered */
    /* shared window (share/unshare): win_ptr is published by win_tag (0:
       none); peers count holds on it: holders = win_acq - win_rel */
    void *win_ptr;
    uint64_t win_tag; /* atomic */
    long win_acq, win_rel; /* atomic */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char err[160];
    char pad[DSGD__LB_LINE];
} dsgd__lb_ep;

struct dsgd_loopback {
    dsgd_ctx *ctx;
    int n;
    int aborted; /* atomic */
    int cond_monotonic;
    long pause_ns;  /* first spin with a pause instruction this long, */
    long spin_ns;   /* then with sched_yield() until this long, then sleep */
    dsgd__lb_ep *ep;     /* n endpoints */
    dsgd__lb_pair *pair; /* n * n, pair[src * n + dst] */
    void *ep_mem, *pair_mem;
};

static void *dsgd__align_up(void *p) {
    uintptr_t u = (uintptr_t)p;
    return (void *)((u + DSGD__LB_LINE - 1) & ~(uintptr_t)(DSGD__LB_LINE - 1));
}

static void dsgd__lb_default_spin(dsgd_loopback *hub) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (ncpu < 1) ncpu = 1;
    hub->pause_ns = (long)hub->n <= ncpu ? DSGD__LB_PAUSE_NS : 0;
    hub->spin_ns = DSGD__LB_SPIN_NS;
}

/* Creates every endpoint's mutex and condition variable; on failure returns 0
   with none of them left. Timed waits use CLOCK_MONOTONIC where the platform
   allows it, so that a wall-clock jump neither fires nor stretches a
   deadline. */
static int dsgd__lb_sync_init(dsgd_loopback *hub) {
    pthread_condattr_t ca;
    int i, inited = 0;
    if (pthread_condattr_init(&ca) != 0) return 0;
#if !defined(__APPLE__)
    hub->cond_monotonic = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
#endif
    for (i = 0; i < hub->n; ++i) {
        dsgd__lb_ep *e = &hub->ep[i];
        e->hub = hub;
        e->rank = i;
        if (pthread_mutex_init(&e->mu, NULL) != 0) break;
        if (pthread_cond_init(&e->cv, &ca) != 0) {
            pthread_mutex_destroy(&e->mu);
            break;
        }
        ++inited;
    }
    pthread_condattr_destroy(&ca);
    if (inited == hub->n) return 1;
    for (i = 0; i < inited; ++i) {
        pthread_cond_destroy(&hub->ep[i].cv);
        pthread_mutex_destroy(&hub->ep[i].mu);
    }
    return 0;
}

DSGD_API dsgd_result dsgd_loopback_create(dsgd_ctx *ctx, int n, dsgd_loopback **out) {
    dsgd_loopback *hub;
    size_t npairs;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_loopback_create: out is NULL");
    *out = NULL;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (n < 1 || n > 4096)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_loopback_create: %d ranks (need 1..4096)", n);
    hub = (dsgd_loopback *)dsgd__alloc(ctx, sizeof(*hub), "dsgd_loopback_create");
    if (!hub) return DSGD_ERR_OUT_OF_MEMORY;
    memset(hub, 0, sizeof(*hub));
    hub->ctx = ctx;
    hub->n = n;
    dsgd__lb_default_spin(hub);
    npairs = (size_t)n * (size_t)n;
    hub->ep_mem = dsgd__alloc(ctx, sizeof(dsgd__lb_ep) * (size_t)n + DSGD__LB_LINE, "dsgd_loopback_create");
    hub->pair_mem = dsgd__alloc(ctx, sizeof(dsgd__lb_pair) * npairs + DSGD__LB_LINE, "dsgd_loopback_create");
    if (!hub->ep_mem || !hub->pair_mem) {
        DSGD_FREE(hub->ep_mem);
        DSGD_FREE(hub->pair_mem);
        DSGD_FREE(hub);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    hub->ep = (dsgd__lb_ep *)dsgd__align_up(hub->ep_mem);
    hub->pair = (dsgd__lb_pair *)dsgd__align_up(hub->pair_mem);
    memset(hub->ep, 0, sizeof(dsgd__lb_ep) * (size_t)n);
    memset(hub->pair, 0, sizeof(dsgd__lb_pair) * npairs);
    if (!dsgd__lb_sync_init(hub)) {
        DSGD_FREE(hub->ep_mem);
        DSGD_FREE(hub->pair_mem);
        DSGD_FREE(hub);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "dsgd_loopback_create: cannot create a pthread mutex or condition");
    }
    *out = hub;
    return DSGD_OK;
}

DSGD_API void dsgd_loopback_destroy(dsgd_loopback *hub) {
    size_t i, npairs;
    int k;
    if (!hub) return;
    npairs = (size_t)hub->n * (size_t)hub->n;
    for (i = 0; i < npairs; ++i)
        for (k = 0; k < DSGD__LB_QUEUE; ++k) DSGD_FREE(hub->pair[i].slot[k].store);
    for (k = 0; k < hub->n; ++k) {
        pthread_cond_destroy(&hub->ep[k].cv);
        pthread_mutex_destroy(&hub->ep[k].mu);
    }
    DSGD_FREE(hub->ep_mem);
    DSGD_FREE(hub->pair_mem);
    DSGD_FREE(hub);
}

DSGD_API void dsgd_loopback_abort(dsgd_loopback *hub) {
    int i;
    if (!hub) return;
    DSGD__STORE_SC(&hub->aborted, 1);
    for (i = 0; i < hub->n; ++i) {
        pthread_mutex_lock(&hub->ep[i].mu);
        pthread_cond_broadcast(&hub->ep[i].cv);
        pthread_mutex_unlock(&hub->ep[i].mu);
    }
}

DSGD_API int dsgd_loopback_aborted(dsgd_loopback *hub) {
    return hub ? DSGD__LOAD_SC(&hub->aborted) : 0;
}

DSGD_API void dsgd_loopback_set_spin(dsgd_loopback *hub, double seconds) {
    if (!hub) return;
    dsgd__lb_default_spin(hub);
    if (seconds >= 0) hub->spin_ns = seconds > 1.0 ? 1000000000L : (long)(seconds * 1e9);
    if (hub->pause_ns > hub->spin_ns) hub->pause_ns = hub->spin_ns;
}

/* Wakes e's owner if it is (about to be) asleep. */
static void dsgd__lb_wake(dsgd__lb_ep *e) {
    if (DSGD__LOAD_SC(&e->sleeping)) {
        pthread_mutex_lock(&e->mu);
        pthread_cond_signal(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
}

static void dsgd__lb_timedwait(dsgd__lb_ep *e, double deadline) {
    struct timespec ts;
    double rem = deadline - dsgd_now();
    long ns;
    if (rem > 1.0) rem = 1.0; /* re-check at least every second */
    if (rem < 0) rem = 0;
    clock_gettime(e->hub->cond_monotonic ? CLOCK_MONOTONIC : CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)rem;
    ns = ts.tv_nsec + (long)((rem - (double)(time_t)rem) * 1e9);
    if (ns >= 1000000000L) {
        ts.tv_sec += 1;
        ns -= 1000000000L;
    }
    ts.tv_nsec = ns;
    pthread_cond_timedwait(&e->cv, &e->mu, &ts);
}

/* Records "loopback rank <me>: ... rank <peer> ..." as the endpoint's error. */
static dsgd_result dsgd__lb_fail(dsgd__lb_ep *e, dsgd_result r, const char *what, int peer) {
    snprintf(e->err, sizeof(e->err), "loopback rank %d: %s rank %d", e->rank, what, peer);
    return r;
}

/* >>loopback transfer ------------------------------------------------------ */
/* One transfer (dsgd__lb_xfer) posts at most one message and takes at most
   one, each direction in its own phase:
     send:    TO_POST -> DONE (eager: copied into the slot)
              TO_POST -> POSTED -> DONE (rendezvous: done once the receiver
                                        has consumed it)
     receive: TO_POST -> DONE (taken: copied or reduced, slot released)
   A direction that is not part of the transfer starts DONE. On failure a
   POSTED send is withdrawn before returning (dsgd__lb_cancel_send), so the
   sender's buffer is never read after the transfer returns. */
typedef enum dsgd__lb_phase { DSGD__LB_DONE = 0, DSGD__LB_TO_POST = 1, DSGD__LB_POSTED = 2 } dsgd__lb_phase;

typedef struct dsgd__lb_transfer {
    dsgd__lb_ep *e;
    /* send: to dst through out */
    int dst;
    uint64_t stag;
    const void *sbuf;
    size_t sbytes;
    dsgd__lb_pair *out;
    dsgd__lb_phase send;
    uint64_t send_idx; /* the POSTED message's index in out */
    /* receive: from src through in, copied (op < 0) or reduced into rbuf */
    int src;
    uint64_t rtag;
    void *rbuf;
    size_t rbytes;  /* the size expected; with got, the most accepted */
    size_t *got;    /* NULL, or where the size received goes (shorter accepted) */
    int op;
    dsgd__lb_pair *in;
    dsgd__lb_phase recv;
    /* waiting: the spin since the last progress */
    long spun_ns;
    double spin_start;
    int spins;
    int blame; /* the peer a failure is attributed to */
} dsgd__lb_transfer;

/* The send phase: into the next slot of out if the queue has room; eager
   messages are copied, larger ones posted by pointer (rendezvous). */
static dsgd_result dsgd__lb_post_send(dsgd__lb_transfer *x, int *progressed) {
    dsgd__lb_pair *out = x->out;
    uint64_t tail = DSGD__LOAD_RLX(&out->tail);
    dsgd__lb_slot *s;
    DSGD_ASSERT(x->send == DSGD__LB_TO_POST);
    if (tail - DSGD__LOAD_ACQ(&out->head) >= DSGD__LB_QUEUE) return DSGD_OK; /* full */
    s = &out->slot[tail % DSGD__LB_QUEUE];
    /* head has passed the slot's last message, so its receiver has claimed
       it (or seen it withdrawn) and is done with it */
    DSGD_ASSERT(DSGD__LOAD_RLX(&s->state) != DSGD__LB_RDV);
    s->tag = x->stag;
    s->bytes = x->sbytes;
    if (x->sbytes <= DSGD__LB_EAGER_MAX) {
        if (s->cap < x->sbytes) {
            void *p = DSGD_REALLOC(s->store, x->sbytes);
            if (!p) {
                x->blame = x->dst;
                return dsgd__lb_fail(x->e, DSGD_ERR_OUT_OF_MEMORY, "out of memory for a message to", x->dst);
            }
            s->store = p;
            s->cap = x->sbytes;
        }
        if (x->sbytes) memcpy(s->store, x->sbuf, x->sbytes);
        s->ptr = s->store;
        DSGD__STORE_RLX(&s->state, (int)DSGD__LB_EAGER);
        x->send = DSGD__LB_DONE;
    } else {
        s->ptr = x->sbuf;
        DSGD__STORE_RLX(&s->state, (int)DSGD__LB_RDV);
        x->send_idx = tail;
        x->send = DSGD__LB_POSTED;
    }
    DSGD__STORE_SC(&out->tail, tail + 1); /* publishes the slot */
    dsgd__lb_wake(&x->e->hub->ep[x->dst]);
    *progressed = 1;
    return DSGD_OK;
}

/* The receive phase met a message that is not the expected one: it stays in
   place (unclaimed), since the ranks are out of step. */
static dsgd_result dsgd__lb_desync(dsgd__lb_transfer *x, const dsgd__lb_slot *s) {
    dsgd__lb_ep *e = x->e;
    x->blame = x->src;
    if (s->tag != x->rtag)
        snprintf(e->err, sizeof(e->err),
                 "loopback rank %d: the message from rank %d has tag %016llx, expected %016llx "
                 "(ranks out of step?)",
                 e->rank, x->src, (unsigned long long)s->tag, (unsigned long long)x->rtag);
    else
        snprintf(e->err, sizeof(e->err),
                 "loopback rank %d: the message from rank %d has %zu bytes, expected %s%zu "
                 "(different counts on different ranks?)",
                 e->rank, x->src, s->bytes, x->got ? "at most " : "", x->rbytes);
    return DSGD_ERR_DESYNC;
}

/* The receive phase: takes the next message of in, if there is one, into
   rbuf; a rendezvous slot is claimed first (RDV -> TAKEN) unless its sender
   has withdrawn it. Releasing the slot (head + 1) also completes a
   rendezvous sender. */
static dsgd_result dsgd__lb_take(dsgd__lb_transfer *x, int *progressed) {
    dsgd__lb_pair *in = x->in;
    uint64_t head = DSGD__LOAD_RLX(&in->head);
    dsgd__lb_slot *s;
    int st;
    DSGD_ASSERT(x->recv == DSGD__LB_TO_POST);
    if (DSGD__LOAD_ACQ(&in->tail) <= head) return DSGD_OK; /* nothing yet */
    s = &in->slot[head % DSGD__LB_QUEUE];
    st = DSGD__LOAD_ACQ(&s->state);
    /* published and not consumed: only this receiver claims or releases it */
    DSGD_ASSERT(st == DSGD__LB_EAGER || st == DSGD__LB_RDV || st == DSGD__LB_CANCELLED);
    if (st != DSGD__LB_CANCELLED && (s->tag != x->rtag || (x->got ? s->bytes > x->rbytes : s->bytes != x->rbytes)))
        return dsgd__lb_desync(x, s);
    if (x->got) x->rbytes = *x->got = s->bytes;
    if (st == DSGD__LB_RDV) { /* claim it, unless its sender withdraws it first */
        int expect = DSGD__LB_RDV;
        if (!DSGD__CAS(&s->state, &expect, (int)DSGD__LB_TAKEN)) st = expect;
        DSGD_ASSERT(st == DSGD__LB_RDV || st == DSGD__LB_CANCELLED);
    }
    if (st == DSGD__LB_CANCELLED) {
        DSGD__STORE_SC(&in->head, head + 1);
        dsgd__lb_wake(&x->e->hub->ep[x->src]);
        x->blame = x->src;
        return dsgd__lb_fail(x->e, DSGD_ERR_ABORTED, "a message was withdrawn (its sender failed) by", x->src);
    }
    if (x->rbytes) {
        if (x->op < 0) memcpy(x->rbuf, s->ptr, x->rbytes);
        else dsgd__reduce_into((float *)x->rbuf, (const float *)s->ptr, x->rbytes / sizeof(float),
                               (dsgd_reduce_op)x->op, 0);
    }
    DSGD__STORE_SC(&in->head, head + 1); /* releases the slot (and a rendezvous sender) */
    dsgd__lb_wake(&x->e->hub->ep[x->src]);
    x->recv = DSGD__LB_DONE;
    *progressed = 1;
    return DSGD_OK;
}

/* A POSTED send is DONE once its receiver has released the slot. */
static int dsgd__lb_send_consumed(dsgd__lb_transfer *x) {
    DSGD_ASSERT(x->send == DSGD__LB_POSTED);
    if (DSGD__LOAD_ACQ(&x->out->head) <= x->send_idx) return 0;
    x->send = DSGD__LB_DONE;
    return 1;
}

/* The transfer cannot go on (abort, deadline): blames the peer of the
   pending receive, else of the pending send. */
static dsgd_result dsgd__lb_stuck(dsgd__lb_transfer *x, dsgd_result r, const char *what) {
    DSGD_ASSERT(x->send != DSGD__LB_DONE || x->recv != DSGD__LB_DONE);
    x->blame = x->recv != DSGD__LB_DONE ? x->src : x->dst;
    return dsgd__lb_fail(x->e, r, what, x->blame);
}

/* One round of waiting without progress: spins for spin_ns (a pause
   instruction up to pause_ns, reading the clock every 64 pauses, then
   sched_yield()). Returns 0 once the spin budget is spent. */
static int dsgd__lb_spin(dsgd__lb_transfer *x) {
    dsgd_loopback *hub = x->e->hub;
    if (x->spins == 0) x->spin_start = dsgd_now();
    if (x->spun_ns >= hub->spin_ns) return 0;
    if (x->spun_ns < hub->pause_ns) {
        DSGD__PAUSE();
        if ((++x->spins & 63) == 0) x->spun_ns = (long)((dsgd_now() - x->spin_start) * 1e9);
    } else {
        sched_yield();
        ++x->spins;
        x->spun_ns = (long)((dsgd_now() - x->spin_start) * 1e9);
    }
    return 1;
}

/* Whether a phase could progress now (or the hub is aborted); SC loads, for
   the re-check under the endpoint's mutex. */
static int dsgd__lb_ready(const dsgd__lb_transfer *x) {
    return (x->send == DSGD__LB_TO_POST &&
            DSGD__LOAD_SC(&x->out->tail) - DSGD__LOAD_SC(&x->out->head) < DSGD__LB_QUEUE) ||
           (x->recv == DSGD__LB_TO_POST && DSGD__LOAD_SC(&x->in->tail) > DSGD__LOAD_RLX(&x->in->head)) ||
           (x->send == DSGD__LB_POSTED && DSGD__LOAD_SC(&x->out->head) > x->send_idx) ||
           DSGD__LOAD_SC(&x->e->hub->aborted);
}

/* Sleeps on the endpoint's condition variable until a peer wakes it, the
   deadline or a second passes; then spins again (the next message often
   follows). */
static void dsgd__lb_sleep(dsgd__lb_transfer *x, double deadline) {
    dsgd__lb_ep *e = x->e;
    pthread_mutex_lock(&e->mu);
    DSGD__STORE_SC(&e->sleeping, 1);
    if (!dsgd__lb_ready(x)) dsgd__lb_timedwait(e, deadline);
    DSGD__STORE_SC(&e->sleeping, 0);
    pthread_mutex_unlock(&e->mu);
    x->spins = 0;
    x->spun_ns = 0;
}

/* Withdraws a POSTED send after a failure; if the receiver has claimed it,
   waits for it to finish reading (one copy, so this is short). */
static void dsgd__lb_cancel_send(dsgd__lb_transfer *x) {
    dsgd__lb_slot *s = &x->out->slot[x->send_idx % DSGD__LB_QUEUE];
    DSGD_ASSERT(x->send == DSGD__LB_POSTED);
    for (;;) {
        int expect = DSGD__LB_RDV;
        if (DSGD__CAS(&s->state, &expect, (int)DSGD__LB_CANCELLED)) break;
        if (DSGD__LOAD_ACQ(&x->out->head) > x->send_idx) break;
        sched_yield();
    }
}

/* The one transfer routine: posts a message to dst (dst >= 0) and takes one
   from src (src >= 0), copying it into rbuf (op < 0) or reducing it into rbuf
   as floats (op >= 0), until both are done, the deadline passes or the hub
   is aborted. dst and src are -1 or other ranks of the hub (the callers
   check). */
static dsgd_result dsgd__lb_xfer(dsgd__lb_ep *e, int dst, uint64_t stag, const void *sbuf,
                                 size_t sbytes, int src, uint64_t rtag, void *rbuf,
                                 size_t rbytes, size_t *got, int op, double deadline, int *failed_peer) {
    dsgd_loopback *hub = e->hub;
    size_t n = (size_t)hub->n, me = (size_t)e->rank;
    dsgd__lb_transfer x;
    dsgd_result r = DSGD_OK;
    DSGD_ASSERT(dst >= -1 && dst < hub->n && dst != e->rank && src >= -1 && src < hub->n && src != e->rank);
    DSGD_ASSERT(op < (int)DSGD_REDUCE_COUNT && (op < 0 || rbytes % sizeof(float) == 0));
    memset(&x, 0, sizeof(x));
    x.e = e;
    x.dst = dst; x.stag = stag; x.sbuf = sbuf; x.sbytes = sbytes;
    x.out = dst >= 0 ? &hub->pair[me * n + (size_t)dst] : NULL;
    x.send = dst >= 0 ? DSGD__LB_TO_POST : DSGD__LB_DONE;
    x.src = src; x.rtag = rtag; x.rbuf = rbuf; x.rbytes = rbytes; x.got = got; x.op = op;
    x.in = src >= 0 ? &hub->pair[(size_t)src * n + me] : NULL;
    x.recv = src >= 0 ? DSGD__LB_TO_POST : DSGD__LB_DONE;
    x.blame = -1;
    for (;;) {
        int progressed = 0;
        if (x.send == DSGD__LB_TO_POST && (r = dsgd__lb_post_send(&x, &progressed)) != DSGD_OK) break;
        if (x.recv == DSGD__LB_TO_POST && (r = dsgd__lb_take(&x, &progressed)) != DSGD_OK) break;
        if (x.send == DSGD__LB_POSTED) progressed |= dsgd__lb_send_consumed(&x);
        if (x.send == DSGD__LB_DONE && x.recv == DSGD__LB_DONE) return DSGD_OK;
        if (DSGD__LOAD_ACQ(&hub->aborted)) {
            r = dsgd__lb_stuck(&x, DSGD_ERR_ABORTED, "the hub was aborted while waiting for");
            break;
        }
        if (progressed) {
            x.spins = 0;
            x.spun_ns = 0;
            continue;
        }
        if (dsgd__lb_spin(&x)) continue;
        if (dsgd_now() >= deadline) {
            r = dsgd__lb_stuck(&x, DSGD_ERR_TIMEOUT, "the deadline passed while waiting for");
            break;
        }
        dsgd__lb_sleep(&x, deadline);
    }
    DSGD_ASSERT(r != DSGD_OK && x.blame >= 0 && x.blame < hub->n);
    if (x.send == DSGD__LB_POSTED) dsgd__lb_cancel_send(&x);
    if (failed_peer) *failed_peer = x.blame;
    return r;
}

/* >>loopback window -------------------------------------------------------- */

typedef int (*dsgd__lb_ready_fn)(dsgd__lb_ep *e, uint64_t tag);

/* Waits with the hub's spin policy until ready(e, tag), the deadline or an
   abort (DSGD_ERR_TIMEOUT, DSGD_ERR_ABORTED). ready must use SC loads. */
static dsgd_result dsgd__lb_wait(dsgd__lb_ep *e, dsgd__lb_ready_fn ready, uint64_t tag, double deadline) {
    dsgd_loopback *hub = e->hub;
    double start = dsgd_now();
    long spun = 0;
    int spins = 0;
    for (;;) {
        if (ready(e, tag)) return DSGD_OK;
        if (DSGD__LOAD_ACQ(&hub->aborted)) return DSGD_ERR_ABORTED;
        if (spun < hub->spin_ns) {
            if (spun < hub->pause_ns) {
                DSGD__PAUSE();
                if ((++spins & 63) == 0) spun = (long)((dsgd_now() - start) * 1e9);
            } else {
                sched_yield();
                spun = (long)((dsgd_now() - start) * 1e9);
            }
            continue;
        }
        if (dsgd_now() >= deadline) return DSGD_ERR_TIMEOUT;
        pthread_mutex_lock(&e->mu);
        DSGD__STORE_SC(&e->sleeping, 1);
        if (!ready(e, tag) && !DSGD__LOAD_SC(&hub->aborted)) dsgd__lb_timedwait(e, deadline);
        DSGD__STORE_SC(&e->sleeping, 0);
        pthread_mutex_unlock(&e->mu);
        start = dsgd_now();
        spun = 0;
        spins = 0;
    }
}

/* The first rank that has not published `tag`, or -1. */
static int dsgd__lb_unpublished(dsgd__lb_ep *e, uint64_t tag) {
    int k;
    for (k = 0; k < e->hub->n; ++k)
        if (k != e->rank && DSGD__LOAD_SC(&e->hub->ep[k].win_tag) != tag) return k;
    return -1;
}

static int dsgd__lb_all_published(dsgd__lb_ep *e, uint64_t tag) { return dsgd__lb_unpublished(e, tag) < 0; }

static int dsgd__lb_all_released(dsgd__lb_ep *e, uint64_t tag) {
    (void)tag;
    return DSGD__LOAD_SC(&e->win_rel) >= (long)e->hub->n - 1;
}

/* Takes this rank's buffer back: nobody can acquire it afterwards, and it
   returns once nobody holds it (holders are copying, so this is short). */
static void dsgd__lb_withdraw(dsgd__lb_ep *e, uint64_t tag) {
    uint64_t expect = tag;
    DSGD__CAS(&e->win_tag, &expect, (uint64_t)0);
    while (DSGD__LOAD_SC(&e->win_acq) != DSGD__LOAD_SC(&e->win_rel)) sched_yield();
}

static dsgd_result dsgd__lb_share(void *impl, uint64_t tag, void *buf, void **peers, double deadline,
                                  int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    dsgd_loopback *hub = e->hub;
    dsgd_result r;
    int n = hub->n, k, j, blame;
    e->win_ptr = buf;
    DSGD__STORE_SC(&e->win_acq, 0L);
    DSGD__STORE_SC(&e->win_rel, 0L);
    DSGD__STORE_SC(&e->win_tag, tag); /* publishes win_ptr */
    for (k = 0; k < n; ++k)
        if (k != e->rank) dsgd__lb_wake(&hub->ep[k]);
    r = dsgd__lb_wait(e, dsgd__lb_all_published, tag, deadline);
    if (r != DSGD_OK) {
        blame = dsgd__lb_unpublished(e, tag);
        dsgd__lb_fail(e, r, r == DSGD_ERR_TIMEOUT ? "the deadline passed waiting for the buffer of"
                                                  : "the hub was aborted while waiting for the buffer of",
                      blame);
        dsgd__lb_withdraw(e, tag);
        if (failed_peer) *failed_peer = blame;
        return r;
    }
    for (k = 0; k < n; ++k) {
        dsgd__lb_ep *p = &hub->ep[k];
        if (k == e->rank) {
            peers[k] = buf;
            continue;
        }
        /* hold, then check it was not withdrawn in between */
        __atomic_add_fetch(&p->win_acq, 1L, __ATOMIC_SEQ_CST);
        if (DSGD__LOAD_SC(&p->win_tag) != tag) {
            __atomic_sub_fetch(&p->win_acq, 1L, __ATOMIC_SEQ_CST);
            for (j = 0; j < k; ++j)
                if (j != e->rank) __atomic_add_fetch(&hub->ep[j].win_rel, 1L, __ATOMIC_SEQ_CST);
            dsgd__lb_fail(e, DSGD_ERR_ABORTED, "a buffer was withdrawn (its rank failed) by", k);
            dsgd__lb_withdraw(e, tag);
            if (failed_peer) *failed_peer = k;
            return DSGD_ERR_ABORTED;
        }
        peers[k] = p->win_ptr;
    }
    return DSGD_OK;
}

static dsgd_result dsgd__lb_unshare(void *impl, uint64_t tag, double deadline, int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    dsgd_loopback *hub = e->hub;
    dsgd_result r;
    int k;
    for (k = 0; k < hub->n; ++k) {
        if (k == e->rank) continue;
        __atomic_add_fetch(&hub->ep[k].win_rel, 1L, __ATOMIC_SEQ_CST);
        dsgd__lb_wake(&hub->ep[k]);
    }
    r = dsgd__lb_wait(e, dsgd__lb_all_released, tag, deadline);
    if (r == DSGD_OK) {
        DSGD__STORE_SC(&e->win_tag, (uint64_t)0);
        return DSGD_OK;
    }
    snprintf(e->err, sizeof(e->err), "loopback rank %d: %s before the other ranks were done with its buffer",
             e->rank, r == DSGD_ERR_TIMEOUT ? "the deadline passed" : "the hub was aborted");
    dsgd__lb_withdraw(e, tag);
    if (failed_peer) *failed_peer = -1;
    return r;
}

/* >>loopback probe --------------------------------------------------------- */

/* The first source, from e->probe_next on (round-robin), with a message
   waiting for e; -1 if none. SC loads of the senders' tails. */
/* Non-zero when rank k has a message waiting for e. */
static int dsgd__lb_has(const dsgd__lb_ep *e, int k) {
    const dsgd__lb_pair *in = &e->hub->pair[(size_t)k * (size_t)e->hub->n + (size_t)e->rank];
    return DSGD__LOAD_SC(&in->tail) > DSGD__LOAD_RLX(&in->head);
}

/* The tag and size of the first message from rank k waiting for e. */
static void dsgd__lb_peek(const dsgd__lb_ep *e, int k, uint64_t *tag, size_t *bytes) {
    const dsgd__lb_pair *in = &e->hub->pair[(size_t)k * (size_t)e->hub->n + (size_t)e->rank];
    const dsgd__lb_slot *s = &in->slot[DSGD__LOAD_RLX(&in->head) % DSGD__LB_QUEUE];
    *tag = s->tag; /* written before the tail that published it */
    *bytes = s->bytes;
}

static int dsgd__lb_waiting_source(dsgd__lb_ep *e) {
    int i;
    for (i = 0; i < e->hub->n; ++i) {
        int k = (e->probe_next + i) % e->hub->n;
        if (k != e->rank && dsgd__lb_has(e, k)) return k;
    }
    return -1;
}

static int dsgd__lb_any_waiting(dsgd__lb_ep *e, uint64_t tag) {
    (void)tag;
    return dsgd__lb_waiting_source(e) >= 0;
}

static dsgd_result dsgd__lb_probe(void *impl, double deadline, int *src, uint64_t *tag, size_t *bytes) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    dsgd_result r;
    int k;
    if (src) *src = -1;
    if (!src || !tag || !bytes) {
        snprintf(e->err, sizeof(e->err), "loopback rank %d: probe needs src, tag and bytes", e->rank);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    r = dsgd__lb_wait(e, dsgd__lb_any_waiting, 0, deadline);
    if (r != DSGD_OK) {
        snprintf(e->err, sizeof(e->err), "loopback rank %d: %s while waiting for a message from any rank", e->rank,
                 r == DSGD_ERR_TIMEOUT ? "the deadline passed" : "the hub was aborted");
        return r;
    }
    k = dsgd__lb_waiting_source(e);
    DSGD_ASSERT(k >= 0); /* only this rank consumes its inboxes */
    dsgd__lb_peek(e, k, tag, bytes);
    *src = k;
    e->probe_next = (k + 1) % e->hub->n;
    return DSGD_OK;
}

/* src's messages alone (src in the tag argument of the wait). */
static int dsgd__lb_from_waiting(dsgd__lb_ep *e, uint64_t src) { return dsgd__lb_has(e, (int)src); }

/* The endpoint's probe_from: nothing here is ever gone (no rank is
   killed; an aborted hub fails every call). */
static dsgd_result dsgd__lb_probe_from(void *impl, int src, double deadline, uint64_t *tag, size_t *bytes, int *gone) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    dsgd_result r;
    if (gone) *gone = 0;
    if (!tag || !bytes || !gone || src < 0 || src >= e->hub->n || src == e->rank) {
        snprintf(e->err, sizeof(e->err), "loopback rank %d: probe_from needs tag, bytes, gone and another rank (%d)",
                 e->rank, src);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    r = dsgd__lb_wait(e, dsgd__lb_from_waiting, (uint64_t)src, deadline);
    if (r != DSGD_OK) {
        snprintf(e->err, sizeof(e->err), "loopback rank %d: %s while waiting for a message from rank %d", e->rank,
                 r == DSGD_ERR_TIMEOUT ? "the deadline passed" : "the hub was aborted", src);
        return r;
    }
    dsgd__lb_peek(e, src, tag, bytes);
    return DSGD_OK;
}

/* peer -1 (no transfer) or another rank of the hub. */
static dsgd_result dsgd__lb_check(dsgd__lb_ep *e, int peer, int *failed_peer) {
    if (peer < -1 || peer >= e->hub->n || peer == e->rank) {
        if (failed_peer) *failed_peer = peer;
        return dsgd__lb_fail(e, DSGD_ERR_INVALID_ARGUMENT, "invalid peer", peer);
    }
    return DSGD_OK;
}

static dsgd_result dsgd__lb_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes,
                                 double deadline) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (dst < 0) return dsgd__lb_fail(e, DSGD_ERR_INVALID_ARGUMENT, "invalid peer", dst);
    if (dsgd__lb_check(e, dst, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__lb_xfer(e, dst, tag, buf, bytes, -1, 0, NULL, 0, NULL, -1, deadline, NULL);
}

static dsgd_result dsgd__lb_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes,
                                 double deadline) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (src < 0) return dsgd__lb_fail(e, DSGD_ERR_INVALID_ARGUMENT, "invalid peer", src);
    if (dsgd__lb_check(e, src, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__lb_xfer(e, -1, 0, NULL, 0, src, tag, buf, bytes, NULL, -1, deadline, NULL);
}

static dsgd_result dsgd__lb_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf,
                                     size_t sbytes, int src, uint64_t rtag, void *rbuf,
                                     size_t rbytes, double deadline, int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (dsgd__lb_check(e, dst, failed_peer) != DSGD_OK || dsgd__lb_check(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__lb_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, NULL, -1, deadline, failed_peer);
}

static dsgd_result dsgd__lb_sendrecv_upto(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                          int src, uint64_t rtag, void *rbuf, size_t rcap, size_t *rbytes,
                                          double deadline, int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    size_t got = 0;
    dsgd_result r;
    if (dsgd__lb_check(e, dst, failed_peer) != DSGD_OK || dsgd__lb_check(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    r = dsgd__lb_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcap, src >= 0 ? &got : NULL, -1, deadline,
                      failed_peer);
    if (rbytes) *rbytes = got;
    return r;
}

static dsgd_result dsgd__lb_sendrecv_reduce(void *impl, int dst, uint64_t stag, const void *sbuf,
                                            size_t sbytes, int src, uint64_t rtag, float *rbuf,
                                            size_t rcount, dsgd_reduce_op op, double deadline,
                                            int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (dsgd__lb_check(e, dst, failed_peer) != DSGD_OK || dsgd__lb_check(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    if ((int)op < 0 || (int)op >= (int)DSGD_REDUCE_COUNT)
        return dsgd__lb_fail(e, DSGD_ERR_INVALID_ARGUMENT, "unknown reduce op for a message from", src);
    return dsgd__lb_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcount * sizeof(float), NULL, (int)op,
                         deadline, failed_peer);
}

static void dsgd__lb_abort(void *impl) { dsgd_loopback_abort(((dsgd__lb_ep *)impl)->hub); }

static const char *dsgd__lb_error_message(void *impl) { return ((dsgd__lb_ep *)impl)->err; }

static void dsgd__lb_set_progress(void *impl, uint64_t seq) {
    DSGD__STORE_REL(&((dsgd__lb_ep *)impl)->progress, seq);
}

static uint64_t dsgd__lb_peer_progress(void *impl, int peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (peer < 0 || peer >= e->hub->n) return 0;
    return DSGD__LOAD_ACQ(&e->hub->ep[peer].progress);
}

DSGD_API dsgd_result dsgd_loopback_endpoint(dsgd_loopback *hub, int rank, dsgd_transport_i *out) {
    if (!hub) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(hub->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_loopback_endpoint: out is NULL");
    memset(out, 0, sizeof(*out));
    if (rank < 0 || rank >= hub->n)
        return dsgd_ctx_set_error(hub->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_loopback_endpoint: rank %d outside [0, %d)", rank, hub->n);
    out->name = "loopback";
    out->impl = &hub->ep[rank];
    out->rank = rank;
    out->size = hub->n;
    out->destroy = NULL;
    out->send = dsgd__lb_send;
    out->recv = dsgd__lb_recv;
    out->sendrecv = dsgd__lb_sendrecv;
    out->sendrecv_reduce = dsgd__lb_sendrecv_reduce;
    out->sendrecv_upto = dsgd__lb_sendrecv_upto;
    out->allreduce = NULL;
    out->abort = dsgd__lb_abort;
    out->now = NULL;
    out->error_message = dsgd__lb_error_message;
    out->set_progress = dsgd__lb_set_progress;
    out->peer_progress = dsgd__lb_peer_progress;
    out->share = dsgd__lb_share;
    out->unshare = dsgd__lb_unshare;
    out->probe = dsgd__lb_probe;
    out->probe_from = dsgd__lb_probe_from;
    return DSGD_OK;
}

#endif /* DSGD__PART_LOOPBACK_IMPL */
