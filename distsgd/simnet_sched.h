/* distsgd/simnet_sched.h - the simnet hub's scheduler: fibers, turns, the timeline, entering and leaving
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of simnet.h (the simnet transport; SIMNET there says how it
   schedules and what it models). Here: dsgd_simnet_run's fibers and their
   stack switch (>>simnet fibers); when a rank's wait ends, its key and the
   hand-off of the turn (>>simnet scheduler); the spans and
   dsgd_simnet_write_trace (>>simnet timeline); stalls, deaths, and a
   rank's way into and out of the hub, dsgd__sn_enter, _block and _exit,
   which simnet_endpoint.h calls. This part declares nothing public.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_SIMNET) && !defined(DSGD__PART_SIMNET_SCHED_IMPL)
#define DSGD__PART_SIMNET_SCHED_IMPL

/* >>simnet fibers ---------------------------------------------------------- */

/* One rank of dsgd_simnet_run (or the caller of run, the last). */
typedef struct dsgd__sn_fiber {
    void *sp; /* asm: the stack pointer saved at the switch away */
#if DSGD__SN_FIBERS == 2
    ucontext_t uc;
#endif
    unsigned char *stack; /* its lowest 8 bytes hold a canary */
    int done;
#ifdef DSGD__SN_ASAN
    const void *asan_bottom; /* its stack (the caller's: told by the first switch) */
    size_t asan_size;
#endif
#ifdef DSGD__SN_TSAN
    void *tsan; /* its TSan fiber (the caller's: its thread) */
#endif
} dsgd__sn_fiber;

#define DSGD__SN_CANARY 0x5AFE57ACC0FFEE11ull
#define DSGD__SN_STACK_DEFAULT ((size_t)256 * 1024)
#define DSGD__SN_STACK_MIN ((size_t)16 * 1024)

#if DSGD__SN_FIBERS == 1
/* Saves the callee-saved registers (and the SSE and x87 control words) on
   the current stack and its pointer in *save, then loads `to` and returns
   into whatever was saved there (System V x86-64 ABI: rbx, rbp, r12-r15,
   MXCSR and the x87 control word survive a call). */
__attribute__((naked, noinline)) static void dsgd__sn_swap(void **save __attribute__((unused)),
                                                            void *to __attribute__((unused))) {
    __asm__("pushq %rbp\n\t"
            "pushq %rbx\n\t"
            "pushq %r12\n\t"
            "pushq %r13\n\t"
            "pushq %r14\n\t"
            "pushq %r15\n\t"
            "subq $8, %rsp\n\t"
            "stmxcsr (%rsp)\n\t"
            "fnstcw 4(%rsp)\n\t"
            "movq %rsp, (%rdi)\n\t"
            "movq %rsi, %rsp\n\t"
            "ldmxcsr (%rsp)\n\t"
            "fldcw 4(%rsp)\n\t"
            "addq $8, %rsp\n\t"
            "popq %r15\n\t"
            "popq %r14\n\t"
            "popq %r13\n\t"
            "popq %r12\n\t"
            "popq %rbx\n\t"
            "popq %rbp\n\t"
            "ret\n\t");
}

/* A new fiber's first return lands here: entry(arg) from r13(r12), which
   never returns. */
__attribute__((naked, noinline)) static void dsgd__sn_boot(void) {
    __asm__("movq %r12, %rdi\n\t"
            "callq *%r13\n\t"
            "ud2\n\t");
}

/* A stack that dsgd__sn_swap can switch to: it returns into boot with
   entry and arg in r13 and r12, and the stack aligned as after a call. */
static void *dsgd__sn_stack_init(unsigned char *stack, size_t size, void (*entry)(void *), void *arg) {
    uint64_t *sp = (uint64_t *)(void *)(((uintptr_t)(stack + size)) & ~(uintptr_t)15);
    uint32_t ctl[2] = {0, 0};
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(ctl[0]), "=m"(ctl[1]));
    *--sp = 0;
    *--sp = 0;
    *--sp = (uint64_t)(uintptr_t)dsgd__sn_boot; /* after its ret, rsp is 16-aligned */
    *--sp = 0;                                  /* rbp */
    *--sp = 0;                                  /* rbx */
    *--sp = (uint64_t)(uintptr_t)arg;           /* r12 */
    *--sp = (uint64_t)(uintptr_t)entry;         /* r13 */
    *--sp = 0;                                  /* r14 */
    *--sp = 0;                                  /* r15 */
    *--sp = (uint64_t)ctl[0] | ((uint64_t)(ctl[1] & 0xFFFFu) << 32);
    return sp;
}
#endif

#if DSGD__SN_FIBERS
/* Switches from fiber `from` to fiber `to` (-1: the caller of run); the
   mutex stays held, and the fiber switched to carries on with it. ASan is
   told the stack switched to before, and that the switch is over after
   (a finished rank's fake frames, NULL, go); TSan which fiber runs next,
   with a happens-before edge from this one. TSan's fibers own mutexes as
   threads do (one unlocked by another fiber than its locker is a bad
   unlock, whatever the switch's flags), so under TSan the mutex is let go
   before the switch and taken again after it: `to` was chosen under it,
   and what another thread may do in between (abort) every fiber rechecks. */
static void dsgd__sn_switch(dsgd_simnet *h, int from, int to) {
    dsgd__sn_fiber *f = &h->fib[from < 0 ? h->n : from], *t = &h->fib[to < 0 ? h->n : to];
#ifdef DSGD__SN_ASAN
    void *fake = NULL;
#endif
    if (f == t) return;
    /* a rank that overflowed its stack (desc.fiber_stack_bytes) wrote over it */
    DSGD_ASSERT(!f->stack || *(const uint64_t *)(const void *)f->stack == DSGD__SN_CANARY);
#ifdef DSGD__SN_TSAN
    pthread_mutex_unlock(&h->mu);
    __tsan_switch_to_fiber(t->tsan, 0);
#endif
#ifdef DSGD__SN_ASAN
    __sanitizer_start_switch_fiber(f->done ? NULL : &fake, t->asan_bottom, t->asan_size);
#endif
#if DSGD__SN_FIBERS == 1
    dsgd__sn_swap(&f->sp, t->sp);
#else
    swapcontext(&f->uc, &t->uc);
#endif
#ifdef DSGD__SN_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
#ifdef DSGD__SN_TSAN
    pthread_mutex_lock(&h->mu);
#endif
}

/* A rank's fiber, entered for the first time: ASan's switch ends here (and
   names the caller of run's stack, which the first switch leaves); under
   TSan it takes the mutex that the switch let go. */
static void dsgd__sn_fiber_begin(dsgd_simnet *h) {
#ifdef DSGD__SN_ASAN
    const void *bottom = NULL;
    size_t size = 0;
    __sanitizer_finish_switch_fiber(NULL, &bottom, &size);
    if (!h->fib[h->n].asan_bottom) {
        h->fib[h->n].asan_bottom = bottom;
        h->fib[h->n].asan_size = size;
    }
#endif
#ifdef DSGD__SN_TSAN
    pthread_mutex_lock(&h->mu);
#endif
    (void)h;
}
#endif

/* >>simnet scheduler ------------------------------------------------------- */

/* The test hook: a random real-time pause (a yield or a sleep). */
static void dsgd__sn_jitter(dsgd__sn_ep *e) {
    double j = e->hub->d.test_jitter_s;
    uint64_t r;
    if (!(j > 0)) return;
    r = dsgd_rng_next(&e->jitter);
    if (r & 1) {
        sched_yield();
    } else {
        struct timespec ts;
        double s = j * (double)(r >> 11) * (1.0 / 9007199254740992.0);
        ts.tv_sec = (time_t)s;
        ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
}

/* When e's NIC has taken m, the next message e takes: the NIC takes one
   message at a time, in the order e takes them (unless parallel_receives;
   half_duplex books at the send). *in: when its bytes begin to come in. */
/* Which of e's receiving links a message from src comes in over. */
static int dsgd__sn_lane(const dsgd__sn_ep *e, int src) {
    int L = e->hub->d.ranks_per_node;
    return L > 0 && src / L == e->rank / L;
}

static double dsgd__sn_taken(const dsgd__sn_ep *e, const dsgd__sn_msg *m, int src, double *in) {
    const dsgd_simnet *h = e->hub;
    double b = m->first, f = e->rx_free[dsgd__sn_lane(e, src)];
    if (!h->d.parallel_receives && !h->d.half_duplex && f > b) b = f;
    if (in) *in = b;
    return b == m->first ? m->arrival : b + (m->arrival - m->first);
}

static void dsgd__sn_link(const dsgd_simnet *h, int s, int d, double *alpha, double *beta) {
    int L = h->d.ranks_per_node;
    if (L > 0 && s / L == d / L) {
        *alpha = h->d.intra_alpha_s;
        *beta = h->d.intra_beta_s_per_byte;
    } else {
        *alpha = h->d.alpha_s;
        *beta = h->d.beta_s_per_byte;
    }
}

/* When e's wait is over, ignoring the deadline (INF: not known yet). */
static double dsgd__sn_event(const dsgd__sn_ep *e) {
    const dsgd_simnet *h = e->hub;
    double ev;
    int k;
    switch (e->wait) {
    case DSGD__SN_W_TIME: return e->until;
    case DSGD__SN_W_XFER: {
        const dsgd__sn_msg *m;
        ev = e->until;
        if (e->src < 0) return ev;
        m = dsgd__sn_head(h, e->src, e->rank);
        if (!m) return DSGD__SN_INF;
        return DSGD__MAX(ev, DSGD__MAX(e->t_call, dsgd__sn_taken(e, m, e->src, NULL)) + h->d.overhead_s +
                                 (double)e->reduce_k * h->d.gamma_s_per_float);
    }
    case DSGD__SN_W_FROM: { /* src's next message, or src gone (killed, left) with nothing left: known a
                               latency later, as a message it sent then */
        const dsgd__sn_msg *m = dsgd__sn_head(h, e->src, e->rank);
        const dsgd__sn_ep *src = &h->ep[e->src];
        double alpha, beta;
        if (m) return DSGD__MAX(e->t_call, dsgd__sn_taken(e, m, e->src, NULL));
        if (src->state != DSGD__SN_DEAD && src->state != DSGD__SN_LEFT) return DSGD__SN_INF;
        dsgd__sn_link(h, e->src, e->rank, &alpha, &beta);
        return DSGD__MAX(e->t_call, (src->state == DSGD__SN_DEAD ? src->kill_time : src->t) + alpha);
    }
    default: /* probe: the earliest the NIC could take */
        ev = DSGD__SN_INF;
        for (k = 0; k < e->nin; ++k) {
            const dsgd__sn_pair *p = &h->pairs[e->in[k]];
            double a = dsgd__sn_taken(e, p->head, (int)(p->key / (uint64_t)h->n), NULL);
            if (a < ev) ev = a;
        }
        return ev < DSGD__SN_INF ? DSGD__MAX(ev, e->t_call) : ev;
    }
}

static double dsgd__sn_key(const dsgd__sn_ep *e) {
    double k = dsgd__sn_event(e);
    if (e->deadline < k) k = e->deadline;
    if (e->kill_time < k) k = e->kill_time;
    return k;
}

/* Non-zero when no parked rank can change how e's wait ends. A compute
   (a death inside it included) and a message already queued (a pair's
   messages arrive in order) are e's own. A deadline that fires, a death
   by time, or the choice of a probe, at time K could be changed by a
   message from any parked rank p, directly or through ranks it unblocks
   (it would end the wait before K), and such a message arrives no earlier
   than t_p plus the smallest latency: so it needs every parked rank past
   K - alpha_min. A death so waits no longer than the wait's deadline
   would (K is at most the deadline). A probe_from (W_FROM) that ends by
   src's message or src gone is e's own too (its death is known a
   latency later, as a message would be). */
static int dsgd__sn_safe(const dsgd__sn_ep *e) {
    const dsgd_simnet *h = e->hub;
    double alpha_min = h->d.alpha_s;
    int k;
    if (h->parked == 0 || e->state != DSGD__SN_WAITING || e->wait == DSGD__SN_W_TIME)
        return 1;
    if (e->wait == DSGD__SN_W_FROM && (dsgd__sn_head(h, e->src, e->rank) || h->ep[e->src].state == DSGD__SN_DEAD ||
                                        h->ep[e->src].state == DSGD__SN_LEFT))
        return 1;
    if (e->wait == DSGD__SN_W_XFER &&
        (e->src < 0 || dsgd__sn_head(h, e->src, e->rank)))
        return 1;
    if (h->d.ranks_per_node > 0 && h->d.intra_alpha_s < alpha_min) alpha_min = h->d.intra_alpha_s;
    for (k = 0; k < h->n; ++k) {
        const dsgd__sn_ep *p = &h->ep[k];
        if ((p->state == DSGD__SN_PARKED || p->dead_held) && !(p->t + alpha_min > e->key)) return 0;
    }
    return 1;
}

/* Gives the turn to the rank with the smallest (key, rank), when its wait
   can end whatever the parked ranks do; otherwise (or when no rank is
   left) to nobody (-1) until a parked rank returns. Called with the mutex
   held by the rank that has the turn (or that just gave it up by parking,
   leaving or dying), or by a parked rank returning to a hub where nobody
   has the turn. */
static void dsgd__sn_pass(dsgd_simnet *h) {
    int best = h->nheap > 0 ? h->heap[0] : -1, me = h->turn;
    if (best >= 0 && !dsgd__sn_safe(&h->ep[best])) best = -1;
    h->turn = best;
    if (best >= 0 && best != me) {
        h->stats.handoffs++;
        if (!h->fib) pthread_cond_signal(&h->ep[best].cv);
    }
}

/* Waits (mutex held) until it is e's turn or the hub is aborted. */
static void dsgd__sn_wait_turn(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
#if DSGD__SN_FIBERS
    if (h->fib) {
        while (h->turn != e->rank && !DSGD__LOAD_RLX(&h->aborted)) dsgd__sn_switch(h, e->rank, h->turn);
        return;
    }
#endif
    while (h->turn != e->rank && !DSGD__LOAD_RLX(&h->aborted)) pthread_cond_wait(&e->cv, &h->mu);
}

static dsgd_result dsgd__sn_fail(dsgd__sn_ep *e, dsgd_result r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static dsgd_result dsgd__sn_fail(dsgd__sn_ep *e, dsgd_result r, const char *fmt, ...) {
    va_list ap;
    int k = snprintf(e->err, sizeof(e->err), "simnet rank %d at %.9g s: ", e->rank, e->t);
    if (k < 0 || (size_t)k >= sizeof(e->err)) return r;
    va_start(ap, fmt);
    vsnprintf(e->err + k, sizeof(e->err) - (size_t)k, fmt, ap);
    va_end(ap);
    return r;
}

/* >>simnet timeline -------------------------------------------------------- */

/* Records a span of e's time (mutex held, on e's thread): nothing without
   desc.trace, for an empty span (other than KILLED), or past
   trace_until_s. */
static void dsgd__sn_span_add(dsgd__sn_ep *e, int kind, double t0, double t1, int peer, uint64_t amount, int flags) {
    dsgd_simnet *h = e->hub;
    dsgd__sn_span *sp;
    if (!h->d.trace || h->trace_oom || (t1 <= t0 && kind != DSGD__SN_SP_KILLED)) return;
    if (h->d.trace_until_s > 0 && t0 >= h->d.trace_until_s) return;
    if (e->nspans == e->capspans) {
        size_t cap = e->capspans ? 2 * e->capspans : 256;
        dsgd__sn_span *grown = (dsgd__sn_span *)DSGD_REALLOC(e->spans, cap * sizeof(*grown));
        if (!grown) {
            h->trace_oom = 1;
            return;
        }
        e->spans = grown;
        e->capspans = cap;
    }
    sp = &e->spans[e->nspans++];
    sp->t0 = t0;
    sp->t1 = t1;
    sp->amount = amount;
    sp->peer = peer;
    sp->kind = (unsigned char)kind;
    sp->flags = (unsigned char)flags;
}

/* The spans of a transfer call that began at t_call: its send half left
   the NIC at done (-INF: none); m (NULL: none, or the wait failed) is the
   message it waited for; the call ends at e->t. */
static void dsgd__sn_span_xfer(dsgd__sn_ep *e, int dst, size_t sbytes, double done, int src, const dsgd__sn_msg *m,
                               size_t reduce_k, int dropped, int failed) {
    double cur = e->t_call, r0, in;
    if (!e->hub->d.trace) return;
    if (dst >= 0 && done > cur) {
        dsgd__sn_span_add(e, DSGD__SN_SP_SEND, cur, done, dst, sbytes, dropped ? DSGD__SN_DROPPED_BIT : 0);
        cur = done;
    }
    if (m) {
        double taken = dsgd__sn_taken(e, m, src, &in);
        r0 = DSGD__MAX(e->t_call, in);
        if (r0 > cur) {
            dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, cur, r0, src, 0, 0);
            cur = r0;
        }
        if (taken > cur) {
            dsgd__sn_span_add(e, DSGD__SN_SP_RECEIVE, cur, taken, src, m->bytes, 0);
            cur = taken;
        }
        if (reduce_k && e->t > cur) dsgd__sn_span_add(e, DSGD__SN_SP_REDUCE, cur, e->t, src, reduce_k, 0);
    } else if (e->t > cur) {
        dsgd__sn_span_add(e, DSGD__SN_SP_WAIT, cur, e->t, src, 0, failed ? DSGD__SN_TIMEOUT_BIT : 0);
    }
}

static const char *const dsgd__sn_span_names[] = {"compute", "stall", "send", "wait", "receive", "reduce", "killed"};

DSGD_API dsgd_result dsgd_simnet_write_trace(dsgd_simnet *h, FILE *out) {
    const char *w = "dsgd_simnet_write_trace";
    int r;
    size_t i;
    if (!h) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", w);
    if (!h->d.trace) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_STATE, "%s: the hub was created without trace", w);
    pthread_mutex_lock(&h->mu);
    if (h->trace_oom) {
        pthread_mutex_unlock(&h->mu);
        return dsgd_ctx_set_error(h->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: spans were lost to a failed allocation", w);
    }
    fprintf(out, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"distsgd simnet\",\"ranks\":%d},"
                 "\"traceEvents\":[\n", h->n);
    fprintf(out, "{\"ph\":\"M\",\"pid\":0,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"simnet\"}}");
    for (r = 0; r < h->n; ++r)
        fprintf(out, ",\n{\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"rank %d\"}}"
                     ",\n{\"ph\":\"M\",\"pid\":0,\"tid\":%d,\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":%d}}",
                r, r, r, r);
    for (r = 0; r < h->n; ++r) {
        const dsgd__sn_ep *e = &h->ep[r];
        for (i = 0; i < e->nspans; ++i) {
            const dsgd__sn_span *sp = &e->spans[i];
            const char *name = dsgd__sn_span_names[sp->kind];
            double ts = sp->t0 * 1e6;
            if (sp->kind == DSGD__SN_SP_KILLED) {
                fprintf(out, ",\n{\"ph\":\"i\",\"s\":\"t\",\"pid\":0,\"tid\":%d,\"name\":\"%s\",\"cat\":\"fault\",\"ts\":%.3f}",
                        r, name, ts);
                continue;
            }
            fprintf(out, ",\n{\"ph\":\"X\",\"pid\":0,\"tid\":%d,\"name\":\"%s\",\"cat\":\"simnet\",\"ts\":%.3f,\"dur\":%.3f",
                    r, name, ts, sp->t1 * 1e6 - ts);
            switch (sp->kind) {
            case DSGD__SN_SP_COMPUTE:
                if (sp->amount) fprintf(out, ",\"args\":{\"step\":%llu}", (unsigned long long)(sp->amount - 1));
                break;
            case DSGD__SN_SP_SEND:
                fprintf(out, ",\"args\":{\"to\":%d,\"bytes\":%llu%s}", sp->peer, (unsigned long long)sp->amount,
                        sp->flags & DSGD__SN_DROPPED_BIT ? ",\"dropped\":1" : "");
                break;
            case DSGD__SN_SP_RECEIVE:
                fprintf(out, ",\"args\":{\"from\":%d,\"bytes\":%llu}", sp->peer, (unsigned long long)sp->amount);
                break;
            case DSGD__SN_SP_REDUCE:
                fprintf(out, ",\"args\":{\"from\":%d,\"floats\":%llu}", sp->peer, (unsigned long long)sp->amount);
                break;
            case DSGD__SN_SP_WAIT:
                if (sp->peer >= 0) fprintf(out, ",\"args\":{\"for\":%d%s}", sp->peer,
                                           sp->flags & DSGD__SN_TIMEOUT_BIT ? ",\"timeout\":1" : "");
                else fprintf(out, ",\"args\":{\"for\":\"any\"%s}", sp->flags & DSGD__SN_TIMEOUT_BIT ? ",\"timeout\":1" : "");
                break;
            default: break;
            }
            fputc('}', out);
        }
    }
    fputs("\n]}\n", out);
    pthread_mutex_unlock(&h->mu);
    if (fflush(out) != 0 || ferror(out)) return dsgd_ctx_set_error(h->ctx, DSGD_ERR_IO, "%s: a write failed", w);
    return DSGD_OK;
}

/* Applies time-triggered stalls once e's clock has reached them. */
static void dsgd__sn_stalls(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    int i;
    for (i = 0; i < h->d.num_faults; ++i) {
        dsgd__sn_fault *f = &h->faults[i];
        if (f->f.kind == DSGD_SIMNET_FAULT_STALL && f->f.rank == e->rank && f->f.step < 0 && !f->applied &&
            e->t >= f->f.time) {
            f->applied = 1;
            if (e->t < f->f.time + f->f.seconds) {
                dsgd__sn_span_add(e, DSGD__SN_SP_STALL, e->t, f->f.time + f->f.seconds, -1, 0, 0);
                e->t = f->f.time + f->f.seconds;
            }
        }
    }
}

/* e is gone (killed, left): the ranks whose probe_from waits for it
   learn it now. */
static void dsgd__sn_gone(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    int k;
    for (k = 0; k < h->n; ++k) {
        dsgd__sn_ep *w = &h->ep[k];
        if (w->state == DSGD__SN_WAITING && w->wait == DSGD__SN_W_FROM && w->src == e->rank) {
            w->key = dsgd__sn_key(w);
            dsgd__sn_sched(w);
        }
    }
}

/* The rank dies at time `at`: it gives up the turn for good. */
static dsgd_result dsgd__sn_die(dsgd__sn_ep *e, double at) {
    if (at > e->t) e->t = at;
    e->state = DSGD__SN_DEAD;
    dsgd__sn_sched(e);
    e->kill_time = e->t;
    dsgd__sn_gone(e);
    if (e->hub->d.park_between_calls && !e->dead_held) { /* held until its thread has heard */
        e->dead_held = 1;
        e->hub->parked++;
    }
    dsgd__sn_span_add(e, DSGD__SN_SP_KILLED, e->t, e->t, -1, 0, 0);
    dsgd__sn_pass(e->hub);
    return dsgd__sn_fail(e, DSGD_ERR_ABORTED, "this rank was killed (fault injection)");
}

/* A killed rank held as parked (dead_held) is let go: its thread called
   again or left, so it knows. */
static void dsgd__sn_unhold(dsgd__sn_ep *e) {
    if (!e->dead_held) return;
    e->dead_held = 0;
    e->hub->parked--;
    if (e->hub->turn < 0) dsgd__sn_pass(e->hub);
}

/* Entering the hub: locks the mutex and waits for the turn. Returns DSGD_OK
   with the mutex held and the turn, or an error with the mutex released. */
static dsgd_result dsgd__sn_enter(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    dsgd_result r;
    dsgd__sn_jitter(e);
    pthread_mutex_lock(&h->mu);
    h->used = 1;
    e->called = 1;
    dsgd__sn_unhold(e);
    if (e->state == DSGD__SN_PARKED) {
        /* back at its clock, as a rank arriving */
        e->state = DSGD__SN_ARRIVING;
        dsgd__sn_sched(e);
        h->parked--;
        if (h->turn < 0) dsgd__sn_pass(h);
    }
    if (e->state == DSGD__SN_ARRIVING) {
        dsgd__sn_wait_turn(e);
        if (!DSGD__LOAD_RLX(&h->aborted)) {
            e->state = DSGD__SN_RUNNING;
            dsgd__sn_sched(e);
            dsgd__sn_jitter(e);
        }
    }
    if (DSGD__LOAD_RLX(&h->aborted)) {
        r = dsgd__sn_fail(e, DSGD_ERR_ABORTED, "the hub was aborted");
    } else if (e->state == DSGD__SN_DEAD) {
        r = dsgd__sn_fail(e, DSGD_ERR_ABORTED, "this rank was killed at %.9g s (fault injection)", e->kill_time);
    } else if (e->state == DSGD__SN_LEFT) {
        r = dsgd__sn_fail(e, DSGD_ERR_STATE, "this rank left the simulation");
    } else if (e->state == DSGD__SN_SPARE) {
        r = dsgd__sn_fail(e, DSGD_ERR_STATE, "this rank is a spare: dsgd_simnet_admit it first");
    } else {
        DSGD_ASSERT(e->state == DSGD__SN_RUNNING && h->turn == e->rank);
        dsgd__sn_stalls(e);
        if (e->t >= e->kill_time) {
            dsgd__sn_die(e, e->kill_time);
            r = DSGD_ERR_ABORTED;
        } else {
            return DSGD_OK;
        }
    }
    pthread_mutex_unlock(&h->mu);
    return r;
}

/* Waits, holding the mutex and the turn, for e's wait (set by the caller)
   to be due, and returns with the turn again: DSGD_OK (the event is due;
   the clock is at it), DSGD_ERR_TIMEOUT (the clock is at the deadline, or
   every rank waits for ever), DSGD_ERR_ABORTED (aborted or killed; the
   message is set). */
static dsgd_result dsgd__sn_block(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    double ev;
    e->state = DSGD__SN_WAITING;
    e->key = dsgd__sn_key(e);
    dsgd__sn_sched(e);
    dsgd__sn_pass(h);
    dsgd__sn_wait_turn(e);
    if (DSGD__LOAD_RLX(&h->aborted)) {
        if (e->state == DSGD__SN_WAITING) {
            e->state = DSGD__SN_RUNNING;
            dsgd__sn_sched(e);
        }
        return dsgd__sn_fail(e, DSGD_ERR_ABORTED, "the hub was aborted");
    }
    e->state = DSGD__SN_RUNNING;
    dsgd__sn_sched(e);
    dsgd__sn_jitter(e);
    ev = dsgd__sn_event(e);
    if (e->kill_time < DSGD__SN_INF && e->kill_time <= ev && e->kill_time <= e->deadline)
        return dsgd__sn_die(e, e->kill_time);
    if (ev < DSGD__SN_INF && ev <= e->deadline) {
        if (ev > e->t) e->t = ev;
        return DSGD_OK;
    }
    if (e->deadline < DSGD__SN_INF) {
        if (e->deadline > e->t) e->t = e->deadline;
        return DSGD_ERR_TIMEOUT;
    }
    return DSGD_ERR_TIMEOUT; /* every rank waits with no deadline: a deadlock */
}

/* Parks a running rank: it gives up the turn and is left out of the
   scheduling until its next call. */
static void dsgd__sn_park(dsgd__sn_ep *e) {
    dsgd_simnet *h = e->hub;
    e->state = DSGD__SN_PARKED;
    dsgd__sn_sched(e);
    h->parked++;
    if (h->turn == e->rank) dsgd__sn_pass(h);
}

/* Leaves the hub after a call: time-triggered stalls, parking when every
   rank parks between calls, then the mutex. */
static dsgd_result dsgd__sn_exit(dsgd__sn_ep *e, dsgd_result r) {
    if (e->state == DSGD__SN_RUNNING) {
        dsgd__sn_stalls(e);
        if (e->hub->d.park_between_calls && !DSGD__LOAD_RLX(&e->hub->aborted)) dsgd__sn_park(e);
    }
    pthread_mutex_unlock(&e->hub->mu);
    return r;
}

#endif /* DSGD__PART_SIMNET_SCHED_IMPL */
