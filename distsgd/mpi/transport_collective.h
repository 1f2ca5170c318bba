/* distsgd/mpi/transport_collective.h - the MPI transport's collective side: native all-reduce, shared memory, creation
   Part of distsgd's MPI add-on (see ../../distsgd_mpi.h, which includes the parts in order).

   THE COLLECTIVE SIDE

     transport.h, above, declares the MPI transport and documents it: the
     public functions' comments are there, and so are the sections that the
     comments here name (THE NATIVE ALL-REDUCE, SHARED MEMORY, NODES, AFTER
     A FAILURE, THREAD LEVELS). It also holds the endpoint's state
     (dsgd_mpi__ep, dsgd_mpi__shared, dsgd_mpi__helper) and its
     point-to-point side (the messages and probe), which this part stands
     on. This part holds what the processes of the communicator do
     together:

       - the native all-reduce (the endpoint's allreduce member): MPI's own
         all-reduce on a helper thread under MPI_THREAD_MULTIPLE, else
         MPI_Iallreduce polled, and the NaN-propagating MAX and MIN
         operations it reduces with;
       - the shared-memory window (share, unshare, share_window), through
         which DSGD_ALLREDUCE_DIRECT runs across the processes of one node;
       - the node layout (the endpoints' ranks_per_node);
       - the table of members and its lifetime: creation
         (dsgd_mpi_transport_create, dsgd_mpi_transport_create_local),
         destroy, dsgd_mpi_init and dsgd_mpi_abort.

     Creation is collective over the communicator, and every process makes
     the same calls in the same order: MPI_Comm_dup; on the duplicate, one
     MPI_Allreduce comparing the processes' counts, thread levels and
     window sizes; with one endpoint per process and a window asked for,
     MPI_Comm_split_type, one MPI_Allreduce and, when every process is on
     one node, MPI_Win_allocate_shared and MPI_Barrier; then, for the node
     layout, MPI_Comm_split_type (freed at once) and one MPI_Allreduce. The
     last endpoint destroyed frees the window (MPI_Win_free, which waits for
     every rank of the node) and the duplicate (MPI_Comm_free), unless MPI
     is finalized or a failure left them in use (see AFTER A FAILURE).
*/
#if defined(DISTSGD_MPI_IMPLEMENTATION) && !defined(DSGD_MPI__PART_TRANSPORT_COLLECTIVE_IMPL)
#define DSGD_MPI__PART_TRANSPORT_COLLECTIVE_IMPL

/* >>mpi native all-reduce -------------------------------------------------- */
/* See THE NATIVE ALL-REDUCE. MPI_Iallreduce (libnbc) measured 2-7x
   slower than MPI_Allreduce (tuned) from 4 KiB to 16 MiB on one node,
   polled or waited for. So with MPI_THREAD_MULTIPLE the hook runs
   the blocking MPI_Allreduce on a helper thread of the endpoint, started at
   its first use, and the caller waits for it on a condition variable
   against the deadline (in slices of 1 ms, to see an abort). Past the
   deadline the helper stays inside MPI_Allreduce (MPI cannot cancel it),
   as a pending MPI_Iallreduce would: the endpoint is failed. Below
   MPI_THREAD_MULTIPLE (the helper's MPI calls would break the level: the
   caller's thread may call MPI after a timeout) it polls MPI_Iallreduce
   with MPI_Test, as before.

   Cost of the helper: two thread hand-offs per call (post, done), each a
   futex wake and a scheduler wake-up: 15-30 us a call on a 2-CPU virtual
   machine (a bare mutex + condition ping-pong between two threads there:
   9-21 us a round trip; a raw futex one: 3-11 us), against
   MPI_Allreduce's 1.3 us at 4 KiB and 18 us at 64 KiB on 2 ranks. No
   hand-off keeps a deadline that MPI cannot give, and a busy wait needs
   a spare CPU per rank. So with dsgd_mpi_desc.blocking_allreduce the hook
   calls MPI_Allreduce on the caller's thread (any thread level): MPI's
   time and bits, no deadline, no abort. */

#ifdef __cplusplus
extern "C" {
#endif
static void *dsgd_mpi__helper_main(void *arg);
#ifdef __cplusplus
}
#endif

static void *dsgd_mpi__helper_main(void *arg) {
    dsgd_mpi__helper *h = (dsgd_mpi__helper *)arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        int rc;
        while (h->state != DSGD_MPI__JOB_POSTED && h->state != DSGD_MPI__JOB_QUIT) pthread_cond_wait(&h->go, &h->mu);
        if (h->state == DSGD_MPI__JOB_QUIT) break;
        DSGD__STORE_REL(&h->state, (int)DSGD_MPI__JOB_RUNNING);
        pthread_mutex_unlock(&h->mu);
        rc = MPI_Allreduce(MPI_IN_PLACE, h->buf, h->len, MPI_FLOAT, h->op, h->comm);
        pthread_mutex_lock(&h->mu);
        h->rc = rc;
        DSGD__STORE_REL(&h->state, (int)DSGD_MPI__JOB_DONE);
        pthread_cond_signal(&h->done);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Starts e's helper; NULL (and the caller polls MPI_Iallreduce) on failure. */
static dsgd_mpi__helper *dsgd_mpi__helper_start(dsgd_mpi__ep *e) {
    dsgd_mpi__helper *h = (dsgd_mpi__helper *)DSGD_MALLOC(sizeof(*h));
    pthread_condattr_t ca;
    if (!h) return NULL;
    memset(h, 0, sizeof(*h));
    h->comm = e->comm;
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        DSGD_FREE(h);
        return NULL;
    }
    pthread_condattr_init(&ca);
    h->monotonic = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
    if (pthread_cond_init(&h->done, &ca) != 0 || pthread_cond_init(&h->go, NULL) != 0 ||
        pthread_create(&h->thread, NULL, dsgd_mpi__helper_main, h) != 0) {
        /* the conditions that were set up are leaked with it: rare */
        pthread_condattr_destroy(&ca);
        pthread_mutex_destroy(&h->mu);
        DSGD_FREE(h);
        return NULL;
    }
    pthread_condattr_destroy(&ca);
    return h;
}

/* Stops an idle helper. Returns 0 (and leaves it) when it is stuck in an
   all-reduce that never finished. */
static int dsgd_mpi__helper_stop(dsgd_mpi__helper *h) {
    pthread_mutex_lock(&h->mu);
    if (h->state == DSGD_MPI__JOB_POSTED || h->state == DSGD_MPI__JOB_RUNNING) {
        pthread_mutex_unlock(&h->mu);
        return 0;
    }
    DSGD__STORE_REL(&h->state, (int)DSGD_MPI__JOB_QUIT);
    pthread_cond_signal(&h->go);
    pthread_mutex_unlock(&h->mu);
    pthread_join(h->thread, NULL);
    pthread_cond_destroy(&h->go);
    pthread_cond_destroy(&h->done);
    pthread_mutex_destroy(&h->mu);
    DSGD_FREE(h);
    return 1;
}

/* One MPI_Allreduce of len floats on the helper, waited for until the
   deadline. Returns DSGD_OK, or DSGD_ERR_TIMEOUT / DSGD_ERR_ABORTED with
   the helper still inside MPI (the caller fails the endpoint), or, with
   *rc set, MPI's error. */
static dsgd_result dsgd_mpi__helper_run(dsgd_mpi__ep *e, float *buf, int len, MPI_Op op, double deadline, int *rc) {
    dsgd_mpi__helper *h = e->helper;
    dsgd_result r = DSGD_OK;
    *rc = MPI_SUCCESS;
    pthread_mutex_lock(&h->mu);
    h->buf = buf;
    h->len = len;
    h->op = op;
    DSGD__STORE_REL(&h->state, (int)DSGD_MPI__JOB_POSTED);
    pthread_cond_signal(&h->go);
    /* no spinning here: MPI_Allreduce polls on the helper, and a second
       busy thread per rank made it 2-8x slower on 2 CPUs (nor does the
       helper spin for the next job: no faster) */
    while (h->state != DSGD_MPI__JOB_DONE) {
        struct timespec ts;
        double left = deadline - dsgd_now(), slice;
        if (DSGD__LOAD_ACQ(&e->sh->aborted)) {
            r = DSGD_ERR_ABORTED;
            break;
        }
        if (left <= 0) {
            r = DSGD_ERR_TIMEOUT;
            break;
        }
        slice = left < 1e-3 ? left : 1e-3;
        clock_gettime(h->monotonic ? CLOCK_MONOTONIC : CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(slice * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec += 1;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&h->done, &h->mu, &ts);
    }
    if (r == DSGD_OK) {
        *rc = h->rc;
        DSGD__STORE_REL(&h->state, (int)DSGD_MPI__JOB_IDLE);
    }
    pthread_mutex_unlock(&h->mu);
    return r;
}

/* NaN-propagating max and min, made commutative bit for bit (of two NaNs
   the larger bit pattern; +0 is the max of +0 and -0), so that MPI may
   combine operands in any order and every rank still gets the same bits. */
#ifdef __cplusplus
extern "C" {
#endif
static void dsgd_mpi__op_max(void *in, void *inout, int *len, MPI_Datatype *type);
static void dsgd_mpi__op_min(void *in, void *inout, int *len, MPI_Datatype *type);
#ifdef __cplusplus
}
#endif

static uint32_t dsgd_mpi__bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

static float dsgd_mpi__pick(float a, float b, int want_max) {
    if (a != a || b != b) {
        if (a != a && b != b) return dsgd_mpi__bits(a) > dsgd_mpi__bits(b) ? a : b;
        return a != a ? a : b;
    }
    if (a == b) /* equal, or +0 and -0: the sign bit decides */
        return (dsgd_mpi__bits(a) >> 31) == (want_max ? 0u : 1u) ? a : b;
    return (a > b) == (want_max != 0) ? a : b;
}

static void dsgd_mpi__op_max(void *in, void *inout, int *len, MPI_Datatype *type) {
    const float *s = (const float *)in;
    float *d = (float *)inout;
    int i, n = *len;
    (void)type; /* MPI_FLOAT only */
    for (i = 0; i < n; ++i) d[i] = dsgd_mpi__pick(s[i], d[i], 1);
}

static void dsgd_mpi__op_min(void *in, void *inout, int *len, MPI_Datatype *type) {
    const float *s = (const float *)in;
    float *d = (float *)inout;
    int i, n = *len;
    (void)type;
    for (i = 0; i < n; ++i) d[i] = dsgd_mpi__pick(s[i], d[i], 0);
}

static dsgd_result dsgd_mpi__allreduce(void *impl, float *buf, size_t count, dsgd_reduce_op op, double deadline) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    size_t per = (size_t)DSGD_MPI_MAX_MESSAGE / sizeof(float), off;
    MPI_Op mop;
    dsgd_result r = dsgd_mpi__usable(e);
    if (r != DSGD_OK) return r;
    switch (op) {
    case DSGD_REDUCE_SUM:
    case DSGD_REDUCE_MEAN: mop = MPI_SUM; break;
    case DSGD_REDUCE_MAX: mop = e->sh->op_max; break;
    case DSGD_REDUCE_MIN: mop = e->sh->op_min; break;
    default:
        snprintf(e->err, sizeof(e->err), "mpi rank %d: unknown reduce op %d", e->rank, (int)op);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (count > 0 && !buf) {
        snprintf(e->err, sizeof(e->err), "mpi rank %d: all-reduce of %zu floats from NULL", e->rank, count);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (!e->sh->blocking && !e->helper && count > 0 && e->sh->provided == MPI_THREAD_MULTIPLE)
        e->helper = dsgd_mpi__helper_start(e);
    for (off = 0; off < count; off += per) {
        int len = (int)DSGD__MIN(per, count - off), flag = 0, rc = MPI_SUCCESS;
        MPI_Request req = MPI_REQUEST_NULL;
        dsgd_mpi__wait w;
        if (e->sh->blocking) { /* blocking_allreduce: no deadline, no abort */
            rc = MPI_Allreduce(MPI_IN_PLACE, buf + off, len, MPI_FLOAT, mop, e->comm);
            if (rc != MPI_SUCCESS) return dsgd_mpi__mpi_error(e, "MPI_Allreduce", -1, rc);
            continue;
        }
        memset(&w, 0, sizeof(w));
        if (e->helper) {
            r = dsgd_mpi__helper_run(e, buf + off, len, mop, deadline, &rc);
            if (r == DSGD_OK && rc != MPI_SUCCESS) return dsgd_mpi__mpi_error(e, "MPI_Allreduce", -1, rc);
            if (r == DSGD_OK) continue;
        } else {
            rc = MPI_Iallreduce(MPI_IN_PLACE, buf + off, len, MPI_FLOAT, mop, e->comm, &req);
            if (rc != MPI_SUCCESS) return dsgd_mpi__mpi_error(e, "MPI_Iallreduce", -1, rc);
            for (;;) {
                rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
                if (rc != MPI_SUCCESS) return dsgd_mpi__mpi_error(e, "MPI_Iallreduce", -1, rc);
                if (flag) break;
                if (DSGD__LOAD_ACQ(&e->sh->aborted)) {
                    r = DSGD_ERR_ABORTED;
                    break;
                }
                if (dsgd_now() >= deadline) {
                    r = DSGD_ERR_TIMEOUT;
                    break;
                }
                dsgd_mpi__backoff(&w, 0);
            }
            if (flag) continue;
            dsgd_mpi__orphan(e, req);
        }
        e->failed = 1;
        snprintf(e->err, sizeof(e->err),
                 "mpi rank %d: %s in %s of %zu floats, waiting for the other %d ranks; MPI cannot cancel it, so this "
                 "endpoint cannot be used again: end the job (dsgd_mpi_abort)",
                 e->rank, r == DSGD_ERR_ABORTED ? "the endpoint was aborted" : "the deadline passed",
                 e->helper ? "MPI_Allreduce" : "MPI_Iallreduce", count, e->size - 1);
        return r;
    }
    if (op == DSGD_REDUCE_MEAN) { /* a true division, the same on every rank */
        float k = (float)e->size;
        for (off = 0; off < count; ++off) buf[off] = buf[off] / k;
    }
    return DSGD_OK;
}

/* >>mpi shared memory ------------------------------------------------------ */
/* Each rank's segment of the window starts with three control words, each
   on its own cache line and written only by the segment's owner: PUB (the
   tag it shares), DONE (the tag it is done with) and GONE (it withdrew the
   window after a failure). share: the caller has copied its data into the
   window; MPI_Win_sync, PUB = tag (release), then wait until every other
   rank's PUB is tag. unshare: MPI_Win_sync, DONE = tag, wait until every
   other rank's DONE is tag, MPI_Win_sync. A rank cannot move on to its next
   tag before every rank has seen its current one (it waits for them), so
   equality is enough. The waits poll (dsgd_mpi__backoff) against the
   deadline and give up at once when a peer's GONE is set. */
#define DSGD_MPI__SEG_HEAD 256
enum { DSGD_MPI__CTL_PUB = 0, DSGD_MPI__CTL_DONE = 8, DSGD_MPI__CTL_GONE = 16 }; /* uint64_t index */

static uint64_t *dsgd_mpi__ctl(const dsgd_mpi__shared *sh, int k) { return (uint64_t *)(void *)sh->seg[k]; }

/* After a failure: peers may still read and write this rank's segment, so
   it is never shared again, and peers waiting on it give up at once. GONE
   says why: bit 0 set, bit 1 a timeout, bits 8.. the rank waited for + 1,
   so that the peers report the rank that never came, not this one. */
static void dsgd_mpi__withdraw(dsgd_mpi__ep *e, dsgd_result r, int blame) {
    uint64_t *mine = dsgd_mpi__ctl(e->sh, e->rank);
    uint64_t why = 1u | (r == DSGD_ERR_TIMEOUT ? 2u : 0u) | ((uint64_t)(blame + 1) << 8);
    e->sh->gone = 1;
    DSGD__STORE_SC(&mine[DSGD_MPI__CTL_GONE], blame >= 0 ? why : (why & 3u));
    DSGD__STORE_SC(&mine[DSGD_MPI__CTL_PUB], (uint64_t)0);
}

/* Waits until every other rank's control word `line` holds tag. */
static dsgd_result dsgd_mpi__shm_wait(dsgd_mpi__ep *e, int line, uint64_t tag, double deadline, int *failed_peer) {
    const dsgd_mpi__shared *sh = e->sh;
    const char *what = line == DSGD_MPI__CTL_PUB ? "to share its window" : "to finish with this rank's window";
    dsgd_mpi__wait w;
    int last_ready = -1;
    memset(&w, 0, sizeof(w));
    for (;;) {
        int k, ready = 0, blame = -1;
        for (k = 0; k < e->size; ++k) {
            const uint64_t *ctl;
            uint64_t gone;
            if (k == e->rank) continue;
            ctl = dsgd_mpi__ctl(sh, k);
            gone = DSGD__LOAD_ACQ(&ctl[DSGD_MPI__CTL_GONE]);
            if (gone) {
                int cause = (int)(gone >> 8) - 1;
                if ((gone & 2u) && cause >= 0 && cause != e->rank && cause < e->size) {
                    /* k timed out waiting for `cause`, which this rank has not heard from either */
                    snprintf(e->err, sizeof(e->err),
                             "mpi rank %d: rank %d timed out waiting for rank %d and withdrew its shared-memory "
                             "window", e->rank, k, cause);
                    if (failed_peer) *failed_peer = cause;
                    return DSGD_ERR_TIMEOUT;
                }
                snprintf(e->err, sizeof(e->err),
                         "mpi rank %d: rank %d withdrew its shared-memory window (%s) while this rank was waiting "
                         "for it %s", e->rank, k, (gone & 2u) ? "it timed out waiting for this rank" : "it failed",
                         what);
                if (failed_peer) *failed_peer = k;
                return DSGD_ERR_ABORTED;
            }
            if (DSGD__LOAD_ACQ(&ctl[line]) == tag) ++ready;
            else if (blame < 0) blame = k;
        }
        if (blame < 0) return DSGD_OK;
        if (failed_peer) *failed_peer = blame;
        if (DSGD__LOAD_ACQ(&e->sh->aborted)) {
            snprintf(e->err, sizeof(e->err), "mpi rank %d: the endpoint was aborted while waiting for rank %d %s",
                     e->rank, blame, what);
            return DSGD_ERR_ABORTED;
        }
        if (dsgd_now() >= deadline) {
            snprintf(e->err, sizeof(e->err), "mpi rank %d: the deadline passed while waiting for rank %d %s",
                     e->rank, blame, what);
            return DSGD_ERR_TIMEOUT;
        }
        dsgd_mpi__backoff(&w, ready != last_ready);
        last_ready = ready;
    }
}

static void *dsgd_mpi__share_window(void *impl, size_t *bytes) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    if (bytes) *bytes = e->sh->win_bytes;
    return e->sh->seg[e->rank] + DSGD_MPI__SEG_HEAD;
}

static dsgd_result dsgd_mpi__share(void *impl, uint64_t tag, void *buf, void **peers, double deadline,
                                   int *failed_peer) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    dsgd_mpi__shared *sh = e->sh;
    dsgd_result r;
    int k;
    if (failed_peer) *failed_peer = -1;
    if ((r = dsgd_mpi__usable(e)) != DSGD_OK) return r;
    if (sh->gone) {
        snprintf(e->err, sizeof(e->err), "mpi rank %d: this rank withdrew its shared-memory window after an earlier "
                 "failure; it cannot be shared again: end the job (dsgd_mpi_abort)", e->rank);
        return DSGD_ERR_ABORTED;
    }
    if ((char *)buf != sh->seg[e->rank] + DSGD_MPI__SEG_HEAD || tag == 0) {
        snprintf(e->err, sizeof(e->err), "mpi rank %d: share takes this rank's window (share_window) and a "
                 "non-zero tag", e->rank);
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    MPI_Win_sync(sh->win); /* the caller's writes into the window, before PUB */
    DSGD__STORE_REL(&dsgd_mpi__ctl(sh, e->rank)[DSGD_MPI__CTL_PUB], tag);
    r = dsgd_mpi__shm_wait(e, DSGD_MPI__CTL_PUB, tag, deadline, failed_peer);
    if (r != DSGD_OK) {
        dsgd_mpi__withdraw(e, r, failed_peer ? *failed_peer : -1);
        return r;
    }
    MPI_Win_sync(sh->win); /* the peers' writes, before reading them */
    for (k = 0; k < e->size; ++k) peers[k] = sh->seg[k] + DSGD_MPI__SEG_HEAD;
    return DSGD_OK;
}

static dsgd_result dsgd_mpi__unshare(void *impl, uint64_t tag, double deadline, int *failed_peer) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    dsgd_mpi__shared *sh = e->sh;
    dsgd_result r;
    if (failed_peer) *failed_peer = -1;
    if (sh->gone) {
        snprintf(e->err, sizeof(e->err), "mpi rank %d: this rank withdrew its shared-memory window after an earlier "
                 "failure", e->rank);
        return DSGD_ERR_ABORTED;
    }
    MPI_Win_sync(sh->win); /* this rank's writes into the peers' windows, before DONE */
    DSGD__STORE_REL(&dsgd_mpi__ctl(sh, e->rank)[DSGD_MPI__CTL_DONE], tag);
    r = dsgd_mpi__shm_wait(e, DSGD_MPI__CTL_DONE, tag, deadline, failed_peer);
    if (r != DSGD_OK) {
        dsgd_mpi__withdraw(e, r, failed_peer ? *failed_peer : -1);
        return r;
    }
    MPI_Win_sync(sh->win);
    return DSGD_OK;
}

/* Creation, collective over sh->comm: when every process is on one node
   (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED, in the same rank order),
   allocates each rank a segment of DSGD_MPI__SEG_HEAD + bytes with
   MPI_Win_allocate_shared and maps every segment; otherwise leaves win
   MPI_WIN_NULL. Every process reaches the same decision. */
static dsgd_result dsgd_mpi__window_create(dsgd_ctx *ctx, const char *fn, dsgd_mpi__shared *sh, size_t bytes,
                                           int proc, int procs) {
    char text[MPI_MAX_ERROR_STRING + 32];
    MPI_Info info = MPI_INFO_NULL;
    char *base = NULL;
    int nsize = 0, nrank = -1, mine, all = 0, k, rc;
    rc = MPI_Comm_split_type(sh->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &sh->node);
    if (rc != MPI_SUCCESS) sh->node = MPI_COMM_NULL;
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(sh->node, &nsize);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(sh->node, &nrank);
    mine = rc == MPI_SUCCESS && nsize == procs && nrank == proc;
    if (mine) {
        sh->seg = (char **)DSGD_MALLOC(sizeof(char *) * (size_t)procs);
        if (sh->seg) memset(sh->seg, 0, sizeof(char *) * (size_t)procs);
        mine = sh->seg ? 1 : -1;
    }
    rc = MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, sh->comm);
    if (rc == MPI_SUCCESS && all < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: out of memory for the shared-memory window's "
                                  "table (on some process)", fn);
    if (rc != MPI_SUCCESS || !all) return DSGD_OK; /* several nodes: no window */
    sh->node_size = procs;
    if (MPI_Info_create(&info) == MPI_SUCCESS) MPI_Info_set(info, "alloc_shared_noncontig", "true");
    rc = MPI_Win_allocate_shared((MPI_Aint)(DSGD_MPI__SEG_HEAD + bytes), 1, info, sh->node, &base, &sh->win);
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    if (rc != MPI_SUCCESS) {
        sh->win = MPI_WIN_NULL;
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: MPI_Win_allocate_shared of %zu bytes failed: %s (pass "
                                  "dsgd_mpi_desc.no_share = 1 to go without)", fn, DSGD_MPI__SEG_HEAD + bytes,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    }
    MPI_Win_set_errhandler(sh->win, MPI_ERRORS_RETURN);
    for (k = 0; k < procs && rc == MPI_SUCCESS; ++k) {
        MPI_Aint size = 0;
        int unit = 0;
        void *p = NULL;
        rc = MPI_Win_shared_query(sh->win, k, &size, &unit, &p);
        sh->seg[k] = (char *)p;
        if (rc == MPI_SUCCESS && (!p || size < (MPI_Aint)(DSGD_MPI__SEG_HEAD + bytes))) rc = MPI_ERR_WIN;
    }
    if (rc == MPI_SUCCESS) rc = MPI_Win_lock_all(MPI_MODE_NOCHECK, sh->win);
    if (rc != MPI_SUCCESS) {
        MPI_Win_free(&sh->win);
        sh->win = MPI_WIN_NULL;
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: mapping the shared-memory window failed: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    }
    memset(sh->seg[proc], 0, DSGD_MPI__SEG_HEAD);
    MPI_Win_sync(sh->win);
    rc = MPI_Barrier(sh->comm); /* every control word is zero before anyone shares */
    MPI_Win_sync(sh->win);
    if (rc != MPI_SUCCESS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: MPI_Barrier failed: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    sh->win_bytes = bytes;
    return DSGD_OK;
}

/* The node layout, collective over comm: P when every node
   (MPI_Comm_split_type, MPI_COMM_TYPE_SHARED) holds P processes at
   consecutive ranks starting at a multiple of P; 0 otherwise, or when MPI
   fails. Every process reaches the same answer. */
static int dsgd_mpi__node_layout(MPI_Comm comm, int proc) {
    MPI_Comm node = MPI_COMM_NULL;
    int nsize = 0, nrank = -1, mine[3], all[3] = {0, 0, 0}, rc;
    rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(node, &nsize);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(node, &nrank);
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    mine[0] = rc == MPI_SUCCESS && nsize > 0 && nrank == proc % nsize; /* consecutive, aligned */
    mine[1] = nsize;  /* the smallest node */
    mine[2] = -nsize; /* the largest */
    if (MPI_Allreduce(mine, all, 3, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS) return 0;
    return all[0] == 1 && all[1] == -all[2] ? nsize : 0;
}

/* >>mpi table -------------------------------------------------------------- */

static void dsgd_mpi__abort_ep(void *impl) { DSGD__STORE_SC(&((dsgd_mpi__ep *)impl)->sh->aborted, 1); }

static const char *dsgd_mpi__error_message(void *impl) { return ((dsgd_mpi__ep *)impl)->err; }

/* Drops one endpoint's reference; the last frees what MPI allocated (unless
   MPI is finalized: then it is gone). MPI_Comm_free and MPI_Op_free let
   pending operations finish. */
static void dsgd_mpi__release(dsgd_mpi__shared *sh) {
    int fin = 0;
    if (!sh || DSGD__FETCH_ADD(&sh->refs, -1) != 1) return;
    MPI_Finalized(&fin);
    if (!fin && sh->win != MPI_WIN_NULL) {
        /* MPI_Win_free waits for every rank of the node: skipped (the window
           leaks) when one of them withdrew it after a failure */
        int k, gone = 0;
        for (k = 0; sh->seg && k < sh->node_size && !gone; ++k)
            gone = DSGD__LOAD_ACQ(&dsgd_mpi__ctl(sh, k)[DSGD_MPI__CTL_GONE]) != 0;
        if (!gone) {
            MPI_Win_unlock_all(sh->win);
            MPI_Win_free(&sh->win);
        }
    }
    if (!fin && sh->node != MPI_COMM_NULL) MPI_Comm_free(&sh->node);
    if (!fin) {
        if (sh->op_max != MPI_OP_NULL) MPI_Op_free(&sh->op_max);
        if (sh->op_min != MPI_OP_NULL) MPI_Op_free(&sh->op_min);
        /* after a failed transfer a message may still be on its way:
           MPICH gives a freed communicator's context to the next one, where
           it would be taken for a new message; MPI_Finalize frees it */
        if (sh->comm != MPI_COMM_NULL && !DSGD__LOAD_ACQ(&sh->stale)) MPI_Comm_free(&sh->comm);
    }
    DSGD_FREE(sh->seg);
    DSGD_FREE(sh);
}

/* Frees the endpoint, and the shared state with the last one. Requests left
   by failed calls are not freed (see AFTER A FAILURE). */
static void dsgd_mpi__destroy(void *impl) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)impl;
    if (!e) return;
    /* a helper stuck in an all-reduce that timed out still uses e and the
       communicator: both are left to the end of the job */
    if (e->helper && !dsgd_mpi__helper_stop(e->helper)) return;
    dsgd_mpi__release(e->sh);
    DSGD_FREE(e->orphans);
    DSGD_FREE(e->stash);
    DSGD_FREE(e->stashed);
    DSGD_FREE(e);
}

DSGD_API dsgd_result dsgd_mpi_init(dsgd_ctx *ctx, int *argc, char ***argv, int *provided) {
    int init = 0, fin = 0, level = MPI_THREAD_SINGLE, rc;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    MPI_Finalized(&fin);
    if (fin) return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "dsgd_mpi_init: MPI was finalized and cannot start again");
    MPI_Initialized(&init);
    if (init) {
        rc = MPI_Query_thread(&level);
    } else {
        rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &level);
        if (rc != MPI_SUCCESS) {
            char text[MPI_MAX_ERROR_STRING + 32];
            return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "dsgd_mpi_init: MPI_Init_thread failed: %s",
                                      dsgd_mpi__error_text(rc, text, sizeof(text)));
        }
    }
    if (rc != MPI_SUCCESS) level = MPI_THREAD_SINGLE;
    if (provided) *provided = level;
    return DSGD_OK;
}

static const char *dsgd_mpi__level_name(int level) {
    if (level == MPI_THREAD_SINGLE) return "MPI_THREAD_SINGLE";
    if (level == MPI_THREAD_FUNNELED) return "MPI_THREAD_FUNNELED";
    if (level == MPI_THREAD_SERIALIZED) return "MPI_THREAD_SERIALIZED";
    if (level == MPI_THREAD_MULTIPLE) return "MPI_THREAD_MULTIPLE";
    return "an unknown thread level";
}

/* Every process must pass the same count: one MPI_Allreduce (MINLOC) over
   the duplicate gives the smallest count, the largest (negated) and the
   lowest thread level, each with the lowest rank that has it. The same
   answer reaches every process, so all fail, or none. */
static dsgd_result dsgd_mpi__agree(dsgd_ctx *ctx, const char *fn, MPI_Comm comm, int count, int provided,
                                   int share_lines) {
    char text[MPI_MAX_ERROR_STRING + 32];
    int mine[10], all[10], rank = 0, rc, tag_ub = 32767, flag = 0, *ub = NULL;
    double largest;
    rc = MPI_Comm_rank(comm, &rank);
    mine[0] = count; mine[1] = rank;
    mine[2] = -count; mine[3] = rank;
    mine[4] = provided; mine[5] = rank;
    mine[6] = share_lines; mine[7] = rank;
    mine[8] = -share_lines; mine[9] = rank;
    if (rc == MPI_SUCCESS) rc = MPI_Allreduce(mine, all, 5, MPI_2INT, MPI_MINLOC, comm);
    if (rc != MPI_SUCCESS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: comparing the counts of the processes failed: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    if (all[0] != -all[2]) {
        /* name a process whose count differs from this one's */
        int other = all[0] != count ? all[1] : all[3], theirs = all[0] != count ? all[0] : -all[2];
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: every process must pass the same count: rank %d passes count %d, rank %d "
                                  "(this process) passes count %d",
                                  fn, other, theirs, rank, count);
    }
    if (count < 1)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: count %d, expected at least 1", fn, count);
    if (all[6] != -all[8]) {
        int other = all[6] != share_lines ? all[7] : all[9], theirs = all[6] != share_lines ? all[6] : -all[8];
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: every process must pass the same share_bytes and no_share: rank %d has a "
                                  "window of %lld bytes, rank %d (this process) %lld (0: no_share)",
                                  fn, other, (long long)theirs * 64, rank, (long long)share_lines * 64);
    }
    if (count > 1 && all[4] < MPI_THREAD_MULTIPLE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED,
                                  "%s: MPI provides %s (on rank %d), but %d endpoints per process need "
                                  "MPI_THREAD_MULTIPLE (their threads call MPI at once; initialise MPI with "
                                  "dsgd_mpi_init, or MPI_Init_thread asking for MPI_THREAD_MULTIPLE)",
                                  fn, dsgd_mpi__level_name(all[4]), all[5], count);
    /* the largest MPI tag is the payload's of the pair (count - 1, count - 1) */
    if (MPI_Comm_get_attr(comm, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub) tag_ub = *ub;
    largest = (double)DSGD_MPI__TAG_PAYLOAD + 2.0 * ((double)count * count - 1.0);
    if (largest > (double)tag_ub)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED,
                                  "%s: count %d needs MPI tags up to %.0f, but this MPI's MPI_TAG_UB is %d (at most "
                                  "%d endpoints per process)",
                                  fn, count, largest, tag_ub, (int)floor(sqrt((double)tag_ub / 2.0)));
    return DSGD_OK;
}

/* The window size in 64-byte lines (0: none), from the description. */
static int dsgd_mpi__share_lines(const dsgd_mpi_desc *desc) {
    size_t bytes = desc && desc->share_bytes ? desc->share_bytes : (size_t)DSGD_MPI_SHARE_BYTES;
    if (desc && desc->no_share) return 0;
    if (bytes < 4096) bytes = 4096;
    if (bytes > ((size_t)1 << 30)) bytes = (size_t)1 << 30;
    return (int)((bytes + 63) / 64);
}

/* Checks what can be checked alone; *base and *provided for the rest. */
static dsgd_result dsgd_mpi__check_desc(dsgd_ctx *ctx, const char *fn, const dsgd_mpi_desc *desc, MPI_Comm *base,
                                        int *provided) {
    char text[MPI_MAX_ERROR_STRING + 32];
    int init = 0, fin = 0, need = MPI_THREAD_SERIALIZED, inter = 0, rc;
    *base = MPI_COMM_WORLD;
    *provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: MPI is %s: call dsgd_mpi_init (or MPI_Init_thread) first",
                                  fn, fin ? "finalized" : "not initialised");
    if (desc) {
        if (desc->comm != (MPI_Comm)0 && desc->comm != MPI_COMM_NULL) *base = desc->comm;
        if (desc->thread_level) need = desc->thread_level;
    }
    if (need != MPI_THREAD_SINGLE && need != MPI_THREAD_FUNNELED && need != MPI_THREAD_SERIALIZED &&
        need != MPI_THREAD_MULTIPLE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: thread_level %d is not an MPI thread level",
                                  fn, need);
    if (MPI_Query_thread(provided) != MPI_SUCCESS) *provided = MPI_THREAD_SINGLE;
    if (*provided < need)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_UNSUPPORTED,
                                  "%s: MPI provides %s, but this program needs %s (initialise MPI with dsgd_mpi_init, "
                                  "or MPI_Init_thread asking for %s)",
                                  fn, dsgd_mpi__level_name(*provided), dsgd_mpi__level_name(need),
                                  dsgd_mpi__level_name(need));
    rc = MPI_Comm_test_inter(*base, &inter);
    if (rc != MPI_SUCCESS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: the communicator is not valid: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    if (inter)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: an intercommunicator; pass an intracommunicator (MPI_Intercomm_merge)", fn);
    return DSGD_OK;
}

/* The state the endpoints share, with creation's own reference: a
   duplicate of base that returns its errors, this process's rank *proc
   among *procs, the MAX and MIN ops. On failure nothing is left (*out
   NULL). */
static dsgd_result dsgd_mpi__shared_create(dsgd_ctx *ctx, const char *fn, const dsgd_mpi_desc *desc, MPI_Comm base,
                                           int provided, dsgd_mpi__shared **out, int *proc, int *procs) {
    char text[MPI_MAX_ERROR_STRING + 32];
    dsgd_mpi__shared *sh;
    int rc;
    *out = NULL;
    sh = (dsgd_mpi__shared *)dsgd__alloc(ctx, sizeof(*sh), fn);
    if (!sh) return DSGD_ERR_OUT_OF_MEMORY;
    memset(sh, 0, sizeof(*sh));
    sh->comm = MPI_COMM_NULL;
    sh->op_max = sh->op_min = MPI_OP_NULL;
    sh->node = MPI_COMM_NULL;
    sh->win = MPI_WIN_NULL;
    sh->provided = provided;
    sh->blocking = desc && desc->blocking_allreduce;
    sh->refs = 1; /* creation's own reference, dropped at the end */
    rc = MPI_Comm_dup(base, &sh->comm);
    if (rc != MPI_SUCCESS) {
        sh->comm = MPI_COMM_NULL;
        dsgd_mpi__release(sh);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: MPI_Comm_dup failed: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    }
    rc = MPI_Comm_set_errhandler(sh->comm, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(sh->comm, proc);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(sh->comm, procs);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(dsgd_mpi__op_max, 1, &sh->op_max);
    if (rc == MPI_SUCCESS) rc = MPI_Op_create(dsgd_mpi__op_min, 1, &sh->op_min);
    if (rc != MPI_SUCCESS) {
        dsgd_mpi__release(sh);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: setting up the duplicate communicator failed: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    }
    *out = sh;
    return DSGD_OK;
}

/* The processes agree (dsgd_mpi__agree), one endpoint per process makes
   the window, and *node_procs is this node's count of processes; the
   ranks must fit an int. On failure sh is released. */
static dsgd_result dsgd_mpi__shared_agree(dsgd_ctx *ctx, const char *fn, dsgd_mpi__shared *sh, int count,
                                          int share_lines, int proc, int procs, int *node_procs) {
    dsgd_result r;
    if ((r = dsgd_mpi__agree(ctx, fn, sh->comm, count, sh->provided, share_lines)) != DSGD_OK ||
        (count == 1 && share_lines > 0 &&
         (r = dsgd_mpi__window_create(ctx, fn, sh, (size_t)share_lines * 64, proc, procs)) != DSGD_OK)) {
        dsgd_mpi__release(sh);
        return r;
    }
    *node_procs = dsgd_mpi__node_layout(sh->comm, proc);
    if ((double)procs * count > 2147483647.0) {
        dsgd_mpi__release(sh);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d processes x %d endpoints is more ranks than "
                                  "an int holds", fn, procs, count);
    }
    return DSGD_OK;
}

/* Endpoint j of count on process proc of procs, holding a reference to
   sh, with its stash; NULL when out of memory (what it had, freed). */
static dsgd_mpi__ep *dsgd_mpi__ep_create(dsgd_ctx *ctx, const char *fn, dsgd_mpi__shared *sh, int count, int j,
                                         int proc, int procs) {
    dsgd_mpi__ep *e = (dsgd_mpi__ep *)dsgd__alloc(ctx, sizeof(*e), fn);
    if (e) {
        memset(e, 0, sizeof(*e));
        DSGD__FETCH_ADD(&sh->refs, 1);
        e->sh = sh;
        e->ctx = ctx;
        e->comm = sh->comm;
        e->count = count;
        e->local = j;
        e->rank = proc * count + j;
        e->size = procs * count;
        e->stash = (uint64_t *)dsgd__alloc(ctx, 2 * sizeof(uint64_t) * (size_t)e->size, fn);
        e->stashed = (unsigned char *)dsgd__alloc(ctx, (size_t)e->size, fn);
    }
    if (!e || !e->stash || !e->stashed) {
        dsgd_mpi__destroy(e);
        return NULL;
    }
    memset(e->stashed, 0, (size_t)e->size);
    return e;
}

/* The transport interface of endpoint e, on a node of node_procs
   processes. */
static void dsgd_mpi__ep_interface(dsgd_transport_i *out, dsgd_mpi__ep *e, int node_procs) {
    int shared = e->sh->win != MPI_WIN_NULL;
    out->name = "mpi";
    out->impl = e;
    out->rank = e->rank;
    out->size = e->size;
    out->destroy = dsgd_mpi__destroy;
    out->send = dsgd_mpi__send;
    out->recv = dsgd_mpi__recv;
    out->sendrecv = dsgd_mpi__sendrecv;
    out->sendrecv_reduce = NULL;
    out->sendrecv_upto = dsgd_mpi__sendrecv_upto;
    /* the window is per process: one endpoint per process only */
    out->share = shared ? dsgd_mpi__share : NULL;
    out->unshare = shared ? dsgd_mpi__unshare : NULL;
    out->share_window = shared ? dsgd_mpi__share_window : NULL;
    /* MPI's all-reduce spans processes, not endpoints */
    out->allreduce = e->count == 1 ? dsgd_mpi__allreduce : NULL;
    out->abort = dsgd_mpi__abort_ep;
    out->now = NULL;
    out->error_message = dsgd_mpi__error_message;
    out->set_progress = NULL;
    out->peer_progress = NULL;
    out->probe = dsgd_mpi__probe;
    out->ranks_per_node = node_procs * e->count;
}

static dsgd_result dsgd_mpi__create(dsgd_ctx *ctx, const char *fn, const dsgd_mpi_desc *desc, int count,
                                    dsgd_transport_i *out) {
    MPI_Comm base;
    dsgd_mpi__shared *sh;
    dsgd_result r;
    int provided, proc = 0, procs = 0, j, share_lines, node_procs = 0;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (count > 0) memset(out, 0, (size_t)count * sizeof(*out));
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd_mpi__check_desc(ctx, fn, desc, &base, &provided)) != DSGD_OK) return r;
    share_lines = dsgd_mpi__share_lines(desc);
    if ((r = dsgd_mpi__shared_create(ctx, fn, desc, base, provided, &sh, &proc, &procs)) != DSGD_OK) return r;
    if ((r = dsgd_mpi__shared_agree(ctx, fn, sh, count, share_lines, proc, procs, &node_procs)) != DSGD_OK) return r;
    for (j = 0; j < count; ++j) {
        dsgd_mpi__ep *e = dsgd_mpi__ep_create(ctx, fn, sh, count, j, proc, procs);
        if (!e) {
            while (j-- > 0) dsgd_mpi__destroy(out[j].impl);
            memset(out, 0, (size_t)count * sizeof(*out));
            dsgd_mpi__release(sh);
            return DSGD_ERR_OUT_OF_MEMORY;
        }
        dsgd_mpi__ep_interface(&out[j], e, node_procs);
    }
    dsgd_mpi__release(sh); /* the endpoints hold it now */
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_mpi_transport_create(dsgd_ctx *ctx, const dsgd_mpi_desc *desc, dsgd_transport_i *out) {
    return dsgd_mpi__create(ctx, "dsgd_mpi_transport_create", desc, 1, out);
}

DSGD_API dsgd_result dsgd_mpi_transport_create_local(dsgd_ctx *ctx, const dsgd_mpi_desc *desc, int count,
                                                     dsgd_transport_i *out) {
    return dsgd_mpi__create(ctx, "dsgd_mpi_transport_create_local", desc, count, out);
}

DSGD_API void dsgd_mpi_abort(int code) {
    int init = 0, fin = 0;
    if (code == 0) code = 1;
    fflush(NULL);
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (init && !fin) MPI_Abort(MPI_COMM_WORLD, code);
    _exit(code);
}

#endif /* DSGD_MPI__PART_TRANSPORT_COLLECTIVE_IMPL */
