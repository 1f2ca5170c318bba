/* distsgd/backend_cpu.h - the CPU reference backend
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_BACKEND_CPU_IMPL)
#define DSGD__PART_BACKEND_CPU_IMPL

/* >>cpu backend ------------------------------------------------------------ */
/* dsgd_buffer is never defined: every backend casts its own buffer type. */

typedef struct dsgd__cpu_buffer {
    size_t count;
    float *data;
} dsgd__cpu_buffer;

/* >>pool ------------------------------------------------------------------- */
/* The threads of one backend's operations (CPU THREADS in backend.h). An
   operation big enough to be worth it is cut into tasks, each of which
   writes its own part of the output with the arithmetic the whole operation
   would use there; the calling thread and the pool's helpers claim tasks
   until none is left. Which thread runs a task changes none of its bits, so
   results do not depend on the thread count. Between operations a helper
   spins for a while (a step's operations follow each other within
   microseconds), then sleeps until the next one. */

#define DSGD__CPU_SPIN_S 200e-6 /* a helper's spin before it sleeps */

/* Task `task` of the current operation `job`, run by thread `slot` (0 is
   the caller, 1.. the helpers): a slot's scratch is its own. */
typedef void (*dsgd__cpu_task_fn)(void *job, int task, int slot);

typedef struct dsgd__cpu_pool dsgd__cpu_pool;

typedef struct dsgd__cpu_helper {
    dsgd__cpu_pool *pool;
    int slot;
    pthread_t thread;
} dsgd__cpu_helper;

struct dsgd__cpu_pool {
    int n;                     /* threads, the caller's included (1: no pool) */
    int started;               /* helpers running */
    int have_lock;             /* mu and the conditions are initialised */
    dsgd__cpu_helper *helpers; /* n - 1 */
    pthread_mutex_t mu;
    pthread_cond_t wake, unused_;
    /* The operation: written by the caller before it publishes the ticket,
       read by a thread only once it has claimed one of its tasks (until
       then the operation cannot finish, so the caller cannot change it). */
    dsgd__cpu_task_fn fn;
    void *job;
    /* atomics */
    uint64_t ticket; /* operation number << 32 | tasks not yet claimed */
    int done;        /* tasks of the operation finished */
    int sleepers;    /* helpers waiting on wake */
    int quit;
};

typedef struct dsgd__cpu {
    dsgd_ctx *ctx;
    const struct dsgd__cpu_kernel *kern; /* this ISA's kernels, chosen at creation */
    float **pack;    /* per thread slot: GEMM packing scratch (A panel, then B panel), made on first use */
    dsgd__cpu_pool pool;
} dsgd__cpu;

/* Claims a task of operation `op`: its index, or -1 when none is left or
   the pool has moved on to another operation. Tasks go out last first. */
static int dsgd__pool_claim(dsgd__cpu_pool *p, uint32_t op) {
    uint64_t t = DSGD__LOAD_ACQ(&p->ticket);
    for (;;) {
        if ((uint32_t)(t >> 32) != op || (t & 0xffffffffu) == 0) return -1;
        if (DSGD__CAS(&p->ticket, &t, t - 1)) return (int)(t & 0xffffffffu) - 1;
    }
}

static void dsgd__pool_work(dsgd__cpu_pool *p, uint32_t op, int slot) {
    int task;
    while ((task = dsgd__pool_claim(p, op)) >= 0) {
        p->fn(p->job, task, slot);
        DSGD__FETCH_ADD(&p->done, 1);
    }
}

static void *dsgd__pool_helper_main(void *arg) {
    dsgd__cpu_helper *h = (dsgd__cpu_helper *)arg;
    dsgd__cpu_pool *p = h->pool;
    uint32_t seen = 0, op;
    for (;;) {
        double since = dsgd_now();
        unsigned spins = 0;
        while ((op = (uint32_t)(DSGD__LOAD_ACQ(&p->ticket) >> 32)) == seen) {
            if (DSGD__LOAD_ACQ(&p->quit)) return NULL;
            if ((++spins & 255u) != 0 || dsgd_now() - since < DSGD__CPU_SPIN_S) {
                DSGD__PAUSE();
                continue;
            }
            /* Sleep. The caller publishes the ticket, then reads sleepers;
               this thread counts itself, then reads the ticket (all
               sequentially consistent): one of the two sees the other. */
            pthread_mutex_lock(&p->mu);
            DSGD__FETCH_ADD(&p->sleepers, 1);
            while ((uint32_t)(DSGD__LOAD_SC(&p->ticket) >> 32) == seen && !DSGD__LOAD_SC(&p->quit))
                pthread_cond_wait(&p->wake, &p->mu);
            DSGD__FETCH_ADD(&p->sleepers, -1);
            pthread_mutex_unlock(&p->mu);
            since = dsgd_now();
            spins = 0;
        }
        seen = op;
        dsgd__pool_work(p, op, h->slot);
    }
}

/* Runs fn(job, t, slot) for every t in [0, ntasks), on the pool's threads
   and the caller's, and returns when all are done. */
static void dsgd__cpu_run(dsgd__cpu *cpu, dsgd__cpu_task_fn fn, void *job, int ntasks) {
    dsgd__cpu_pool *p = &cpu->pool;
    uint32_t op;
    unsigned spins = 0;
    int t;
    if (ntasks <= 1 || !p->started) {
        for (t = 0; t < ntasks; ++t) fn(job, t, 0);
        return;
    }
    op = (uint32_t)(DSGD__LOAD_RLX(&p->ticket) >> 32) + 1u;
    p->fn = fn;
    p->job = job;
    DSGD__STORE_RLX(&p->done, 0);
    DSGD__STORE_SC(&p->ticket, ((uint64_t)op << 32) | (uint32_t)ntasks);
    if (DSGD__LOAD_SC(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
    }
    dsgd__pool_work(p, op, 0);
    while (DSGD__LOAD_ACQ(&p->done) != ntasks) { /* helpers finishing their last tasks */
        if ((++spins & 4095u) == 0)
            sched_yield();
        else
            DSGD__PAUSE();
    }
}

static void dsgd__pool_stop(dsgd__cpu_pool *p) {
    int i;
    if (p->started) {
        DSGD__STORE_SC(&p->quit, 1);
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->mu);
        for (i = 0; i < p->started; ++i) pthread_join(p->helpers[i].thread, NULL);
        p->started = 0;
    }
    if (p->have_lock) {
        pthread_cond_destroy(&p->wake);
        pthread_cond_destroy(&p->unused_);
        pthread_mutex_destroy(&p->mu);
        p->have_lock = 0;
    }
    DSGD_FREE(p->helpers);
    p->helpers = NULL;
}

/* Starts n - 1 helpers (nothing for n <= 1); on failure none is left. */
static dsgd_result dsgd__pool_start(dsgd_ctx *ctx, dsgd__cpu_pool *p, int n) {
    const char *what = "dsgd_cpu_backend_create";
    dsgd_result r;
    int i;
    p->n = n;
    if (n <= 1) return DSGD_OK;
    p->helpers = (dsgd__cpu_helper *)dsgd__alloc(ctx, sizeof(dsgd__cpu_helper) * (size_t)(n - 1), what);
    if (!p->helpers) return DSGD_ERR_OUT_OF_MEMORY;
    if ((r = dsgd__lock_init(ctx, &p->mu, &p->wake, &p->unused_, what)) != DSGD_OK) return r;
    p->have_lock = 1;
    for (i = 0; i < n - 1; ++i) {
        p->helpers[i].pool = p;
        p->helpers[i].slot = i + 1;
        if (pthread_create(&p->helpers[i].thread, NULL, dsgd__pool_helper_main, &p->helpers[i]) != 0) {
            dsgd__pool_stop(p);
            return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: cannot start helper thread %d of %d", what, i + 1,
                                      n - 1);
        }
        p->started = i + 1;
    }
    return DSGD_OK;
}

/* Checks that [ref.off, ref.off + n) lies inside ref's buffer and returns its
   address, or records an error and returns NULL. */
static float *dsgd__cpu_span(dsgd__cpu *cpu, dsgd_ref ref, size_t n, const char *op) {
    dsgd__cpu_buffer *b = (dsgd__cpu_buffer *)ref.buf;
    if (!b) {
        dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu %s: NULL buffer", op);
        return NULL;
    }
    if (ref.off > b->count || n > b->count - ref.off) {
        dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                           "cpu %s: range [%zu, %zu) outside a buffer of %zu floats", op,
                           ref.off, ref.off + n, b->count);
        return NULL;
    }
    return b->data + ref.off;
}

/* 1 when the ranges [a.off, a.off + na) and [b.off, b.off + nb) share a
   float: the element-wise kernels take their arrays as restrict. */
static int dsgd__cpu_overlap(dsgd_ref a, size_t na, dsgd_ref b, size_t nb) {
    return a.buf == b.buf && na && nb && a.off < b.off + nb && b.off < a.off + na;
}

static dsgd_result dsgd__cpu_buffer_create(void *impl, size_t count, dsgd_buffer **out) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__cpu_buffer *b;
    size_t bytes;
    if (!out) return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu buffer_create: out is NULL");
    *out = NULL;
    if (dsgd__mul_overflows(count, sizeof(float), &bytes))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_OUT_OF_MEMORY, "cpu buffer_create: %zu floats overflow size_t", count);
    b = (dsgd__cpu_buffer *)dsgd__alloc(cpu->ctx, sizeof(*b), "cpu buffer_create");
    if (!b) return DSGD_ERR_OUT_OF_MEMORY;
    b->data = (float *)dsgd__alloc(cpu->ctx, bytes, "cpu buffer_create");
    if (!b->data) {
        DSGD_FREE(b);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    memset(b->data, 0, bytes);
    b->count = count;
    *out = (dsgd_buffer *)b;
    return DSGD_OK;
}

static void dsgd__cpu_buffer_destroy(void *impl, dsgd_buffer *buf) {
    dsgd__cpu_buffer *b = (dsgd__cpu_buffer *)buf;
    DSGD__UNUSED(impl);
    if (!b) return;
    DSGD_FREE(b->data);
    DSGD_FREE(b);
}

static float *dsgd__cpu_buffer_host_ptr(void *impl, dsgd_buffer *buf) {
    DSGD__UNUSED(impl);
    return buf ? ((dsgd__cpu_buffer *)buf)->data : NULL;
}

static dsgd_result dsgd__cpu_copy(void *impl, dsgd_ref dst, dsgd_ref src, size_t count) {
    float *d = dsgd__cpu_span((dsgd__cpu *)impl, dst, count, "copy");
    float *s = dsgd__cpu_span((dsgd__cpu *)impl, src, count, "copy");
    if (!d || !s) return DSGD_ERR_INVALID_ARGUMENT;
    if (count) memmove(d, s, count * sizeof(float));
    return DSGD_OK;
}

/* >>kernels ---------------------------------------------------------------- */
/* One ISA's kernels: the GEMM micro-kernel and the hot element-wise loops,
   chosen together when the backend is created (CPU KERNELS in backend.h):
   "avx512" (AVX-512F), "avx2" (AVX2 and FMA) or "portable" (the compiler's
   baseline target). The element-wise loops are one C source each, inlined
   into a function per target; each element's arithmetic is the same in
   every one (no contraction into FMA), so they give the same bits whatever
   the vector width. */

/* Compilers contract a * b + c into an FMA where the target has one
   (-march=native, or a target attribute): not in the code that promises two
   roundings. Clang does within an expression unless the pragma says not to;
   GCC across statements in its GNU modes (-std=gnu*, its default) unless
   the function's fp-contract option is off. */
#if defined(__clang__)
#define DSGD__NO_CONTRACT _Pragma("STDC FP_CONTRACT OFF")
#define DSGD__NO_CONTRACT_FN
#elif defined(__GNUC__)
#define DSGD__NO_CONTRACT
#define DSGD__NO_CONTRACT_FN __attribute__((optimize("fp-contract=off")))
#else
#define DSGD__NO_CONTRACT
#define DSGD__NO_CONTRACT_FN
#endif

#if defined(__GNUC__) || defined(__clang__)
#define DSGD__INLINE static inline __attribute__((always_inline))
#else
#define DSGD__INLINE static
#endif

/* BODY(i) for every i in [0, n): blocks of 16 with a fixed inner count,
   which gcc -O2 vectorises (its cheap cost model leaves a loop of unknown
   count scalar), then the rest one by one. */
#define DSGD__EACH(n, BODY)                                                   \
    do {                                                                      \
        size_t i_ = 0, n_ = (size_t)(n);                                      \
        int e_;                                                               \
        for (; i_ + 16 <= n_; i_ += 16)                                       \
            for (e_ = 0; e_ < 16; ++e_) BODY(i_ + (size_t)e_);                \
        for (; i_ < n_; ++i_) BODY(i_);                                       \
    } while (0)

/* T(MR x NR) = Ap(MR, kc) Bp(kc, NR), then out(MR x NR, rows ldo apart) =
   T (add 0), or out += alpha T (add 1) rounded as dsgd__gemm_add rounds (a
   product, then a sum; no contraction), with the tile still in registers. */
typedef void (*dsgd__micro_fn)(int kc, const float *DSGD__RESTRICT ap, const float *DSGD__RESTRICT bp,
                               float *DSGD__RESTRICT out, size_t ldo, float alpha, int add);

/* One entry of the kernel table. The element-wise members take ranges the
   backend operation has checked; different arrays must not overlap. */
typedef struct dsgd__cpu_kernel {
    const char *name;       /* dsgd_cpu_isa's answer */
    int (*supported)(void); /* 1 when this CPU (and OS) runs it */
    int mr, nr;             /* GEMM tile rows and columns (packing strips) */
    dsgd__micro_fn micro;
    void (*scale)(float *x, float alpha, size_t n);
    void (*axpy)(float *y, float alpha, const float *x, size_t n);
    void (*bias_act)(dsgd_activation act, float *y, const float *bias, int m, int n);
    void (*act_backward)(dsgd_activation act, float *dy, const float *y, size_t n);
    void (*bias_backward)(float *db, const float *dy, int m, int n, int ld); /* dy's rows ld apart */
    void (*update)(const dsgd_opt_update *u, float *p, const float *g, float *m1, float *m2, size_t n);
    int (*nonfinite)(const float *x, size_t n); /* 1 when an element is NaN or infinite */
} dsgd__cpu_kernel;

/* ---- element-wise bodies */

static float dsgd__act(dsgd_activation act, float v) {
    switch (act) {
    case DSGD_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case DSGD_ACT_TANH: return tanhf(v);
    case DSGD_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    default: return v;
    }
}

DSGD__INLINE void dsgd__scale_body(float *DSGD__RESTRICT x, float alpha, size_t n) {
#define DSGD__SCALE(i) x[i] *= alpha
    DSGD__EACH(n, DSGD__SCALE);
#undef DSGD__SCALE
}

DSGD__INLINE void dsgd__axpy_body(float *DSGD__RESTRICT y, float alpha, const float *DSGD__RESTRICT x,
                                  size_t n) {
    DSGD__NO_CONTRACT
#define DSGD__AXPY(i) y[i] += alpha * x[i]
    DSGD__EACH(n, DSGD__AXPY);
#undef DSGD__AXPY
}

/* y(m, n) = act(y + bias); bias may be NULL */
DSGD__INLINE void dsgd__bias_act_body(dsgd_activation act, float *DSGD__RESTRICT y,
                                      const float *DSGD__RESTRICT bias, int m, int n) {
    int i, j;
    for (i = 0; i < m; ++i) {
        float *DSGD__RESTRICT row = y + (size_t)i * n;
        if (act == DSGD_ACT_RELU && bias) {
#define DSGD__BIAS_RELU(j_) do { float t_ = row[j_] + bias[j_]; row[j_] = t_ > 0.0f ? t_ : 0.0f; } while (0)
            DSGD__EACH(n, DSGD__BIAS_RELU);
#undef DSGD__BIAS_RELU
        } else if (act == DSGD_ACT_RELU) {
#define DSGD__RELU(j_) row[j_] = row[j_] > 0.0f ? row[j_] : 0.0f
            DSGD__EACH(n, DSGD__RELU);
#undef DSGD__RELU
        } else if (act == DSGD_ACT_NONE && bias) {
#define DSGD__BIAS(j_) row[j_] = row[j_] + bias[j_]
            DSGD__EACH(n, DSGD__BIAS);
#undef DSGD__BIAS
        } else if (act != DSGD_ACT_NONE) { /* tanh, sigmoid: libm, one by one */
            for (j = 0; j < n; ++j) row[j] = dsgd__act(act, bias ? row[j] + bias[j] : row[j]);
        }
    }
}

/* dy *= act'(y), written in terms of the activation's output y */
DSGD__INLINE void dsgd__act_backward_body(dsgd_activation act, float *DSGD__RESTRICT dy,
                                          const float *DSGD__RESTRICT y, size_t n) {
    DSGD__NO_CONTRACT
    switch (act) {
    case DSGD_ACT_RELU:
#define DSGD__DRELU(i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f
        DSGD__EACH(n, DSGD__DRELU);
#undef DSGD__DRELU
        break;
    case DSGD_ACT_TANH:
#define DSGD__DTANH(i) dy[i] *= 1.0f - y[i] * y[i]
        DSGD__EACH(n, DSGD__DTANH);
#undef DSGD__DTANH
        break;
    case DSGD_ACT_SIGMOID:
#define DSGD__DSIGMOID(i) dy[i] *= y[i] * (1.0f - y[i])
        DSGD__EACH(n, DSGD__DSIGMOID);
#undef DSGD__DSIGMOID
        break;
    default:
        break;
    }
}

/* db(n) = column sums of dy(m, n) (rows ld apart), rows added in order */
DSGD__INLINE void dsgd__bias_backward_body(float *DSGD__RESTRICT db, const float *DSGD__RESTRICT dy,
                                           int m, int n, int ld) {
    int i;
    memset(db, 0, (size_t)n * sizeof(float));
    for (i = 0; i < m; ++i) {
        const float *DSGD__RESTRICT row = dy + (size_t)i * ld;
#define DSGD__COLSUM(j) db[j] += row[j]
        DSGD__EACH(n, DSGD__COLSUM);
#undef DSGD__COLSUM
    }
}

/* SGD and momentum follow torch.optim.SGD (v = mu v + g; p -= lr v; Nesterov:
   p -= lr (g + mu v)); Adam follows Kingma & Ba 2015, Algorithm 1, with L2
   weight decay added to the gradient as torch.optim.Adam does; AdamW follows
   Loshchilov & Hutter 2019, decoupled decay p -= lr wd p (torch.optim.AdamW).
   The kind is valid (the backend operation checked it). */
DSGD__INLINE void dsgd__update_body(const dsgd_opt_update *u, float *DSGD__RESTRICT p,
                                    const float *DSGD__RESTRICT g, float *DSGD__RESTRICT m1,
                                    float *DSGD__RESTRICT m2, size_t n) {
    DSGD__NO_CONTRACT
    const float lr = u->lr, wd = u->weight_decay, gs = u->grad_scale, mu = u->momentum;
    const float b1 = u->beta1, b2 = u->beta2, eps = u->eps;
    const float bc1 = u->bias_correction1, bc2 = u->bias_correction2;
    switch (u->kind) {
    case DSGD_OPT_SGD:
#define DSGD__SGD(i)                                                                     \
    do {                                                                                 \
        float gi = g[i] * gs + wd * p[i]; /* L2 term */                                  \
        p[i] -= lr * gi;                                                                 \
    } while (0)
        DSGD__EACH(n, DSGD__SGD);
#undef DSGD__SGD
        break;
    case DSGD_OPT_MOMENTUM:
#define DSGD__MOMENTUM(i, NESTEROV)                                                      \
    do {                                                                                 \
        float gi = g[i] * gs + wd * p[i];                                                \
        float v = mu * m1[i] + gi; /* velocity */                                        \
        m1[i] = v;                                                                       \
        p[i] -= lr * (NESTEROV ? gi + mu * v : v);                                       \
    } while (0)
#define DSGD__NESTEROV(i) DSGD__MOMENTUM(i, 1)
#define DSGD__HEAVY_BALL(i) DSGD__MOMENTUM(i, 0)
        if (u->nesterov) /* two loops: no select in the vector code */
            DSGD__EACH(n, DSGD__NESTEROV);
        else
            DSGD__EACH(n, DSGD__HEAVY_BALL);
#undef DSGD__HEAVY_BALL
#undef DSGD__NESTEROV
#undef DSGD__MOMENTUM
        break;
    default: { /* Adam, AdamW: sqrtf may set errno, so this loop stays scalar */
        int decoupled = u->kind == DSGD_OPT_ADAMW;
        size_t i;
        for (i = 0; i < n; ++i) {
            float gi = g[i] * gs + (decoupled ? 0.0f : wd * p[i]);
            float mi = b1 * m1[i] + (1.0f - b1) * gi;      /* first moment */
            float vi = b2 * m2[i] + (1.0f - b2) * gi * gi; /* second moment */
            float mhat = mi / bc1, vhat = vi / bc2;        /* bias-corrected */
            m1[i] = mi;
            m2[i] = vi;
            p[i] -= lr * (mhat / (sqrtf(vhat) + eps) + (decoupled ? wd * p[i] : 0.0f));
        }
        break;
    }
    }
}

/* 1 when an element of x is NaN or infinite: its exponent is all ones (an
   integer OR over the bits vectorises) */
DSGD__INLINE int dsgd__nonfinite_body(const float *DSGD__RESTRICT x, size_t n) {
    uint32_t any = 0;
#define DSGD__NONFINITE(i)                                                               \
    do {                                                                                 \
        uint32_t u_;                                                                     \
        memcpy(&u_, x + (i), sizeof(u_));                                                \
        any |= (uint32_t)((u_ & 0x7f800000u) == 0x7f800000u);                            \
    } while (0)
    DSGD__EACH(n, DSGD__NONFINITE);
#undef DSGD__NONFINITE
    return any != 0;
}

/* The element-wise members for one target: SUFFIX names them, ATTR is its
   target attribute (empty for the baseline). */
#define DSGD__ELEMENTWISE(SUFFIX, ATTR)                                                                        \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__scale_##SUFFIX(float *x, float alpha, size_t n) {              \
        dsgd__scale_body(x, alpha, n);                                                                         \
    }                                                                                                          \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__axpy_##SUFFIX(float *y, float alpha, const float *x, size_t n) { \
        dsgd__axpy_body(y, alpha, x, n);                                                                       \
    }                                                                                                          \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__bias_act_##SUFFIX(dsgd_activation act, float *y, const float *bias, \
                                             int m, int n) {                                                   \
        dsgd__bias_act_body(act, y, bias, m, n);                                                               \
    }                                                                                                          \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__act_backward_##SUFFIX(dsgd_activation act, float *dy, const float *y, \
                                                 size_t n) {                                                   \
        dsgd__act_backward_body(act, dy, y, n);                                                                \
    }                                                                                                          \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__bias_backward_##SUFFIX(float *db, const float *dy, int m, int n, \
                                                                  int ld) { \
        dsgd__bias_backward_body(db, dy, m, n, ld);                                                                \
    }                                                                                                          \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__update_##SUFFIX(const dsgd_opt_update *u, float *p, const float *g, \
                                           float *m1, float *m2, size_t n) {                                   \
        dsgd__update_body(u, p, g, m1, m2, n);                                                                 \
    }                                                                                                          \
    ATTR static int dsgd__nonfinite_##SUFFIX(const float *x, size_t n) {                                       \
        return dsgd__nonfinite_body(x, n);                                                                     \
    }

/* ---- portable: the compiler's vectors, no FMA */

/* The baseline target's vectors: VW floats, 8 with AVX, else 4 (SSE2,
   NEON). The portable GEMM kernel's NR is 2 of them, so that no vector
   operation is split into scalars. */
#if defined(__AVX__)
#define DSGD__VW 8
#else
#define DSGD__VW 4
#endif
#define DSGD__PMR 6
#define DSGD__PNR (2 * DSGD__VW)

static int dsgd__isa_always(void) { return 1; }

DSGD__ELEMENTWISE(portable, )

#if defined(__GNUC__) || defined(__clang__)
/* GNU vector extensions: in the portable kernel twelve accumulators stay in
   registers (gcc does not vectorise the plain loop with them in there). */
typedef float dsgd__v8 __attribute__((vector_size(DSGD__VW * 4)));
/* loads and stores through memcpy: no vector crosses a function boundary,
   so the ABI does not depend on -mavx */
#define DSGD__V8_LOAD(v, p) memcpy(&(v), (p), sizeof(dsgd__v8))
#define DSGD__V8_STORE(p, v) memcpy((p), &(v), sizeof(dsgd__v8))

DSGD__NO_CONTRACT_FN static void dsgd__micro_portable(int kc, const float *DSGD__RESTRICT ap,
                                                      const float *DSGD__RESTRICT bp, float *DSGD__RESTRICT out,
                                                      size_t ldo, float alpha, int add) {
    DSGD__NO_CONTRACT
    dsgd__v8 z, b0, b1, o;
    dsgd__v8 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    int p;
    memset(&z, 0, sizeof(z));
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = z;
    for (p = 0; p < kc; ++p) {
        DSGD__V8_LOAD(b0, bp);
        DSGD__V8_LOAD(b1, bp + DSGD__VW);
        c00 += b0 * ap[0]; c01 += b1 * ap[0];
        c10 += b0 * ap[1]; c11 += b1 * ap[1];
        c20 += b0 * ap[2]; c21 += b1 * ap[2];
        c30 += b0 * ap[3]; c31 += b1 * ap[3];
        c40 += b0 * ap[4]; c41 += b1 * ap[4];
        c50 += b0 * ap[5]; c51 += b1 * ap[5];
        ap += DSGD__PMR;
        bp += DSGD__PNR;
    }
#define DSGD__OUT_V(q, v)                                                                 \
    do {                                                                                 \
        if (add) {                                                                       \
            DSGD__V8_LOAD(o, q);                                                         \
            o += (v) * alpha;                                                            \
            DSGD__V8_STORE(q, o);                                                        \
        } else {                                                                         \
            DSGD__V8_STORE(q, v);                                                        \
        }                                                                                \
    } while (0)
#define DSGD__OUT_ROW(i) DSGD__OUT_V(out + i * ldo, c##i##0); DSGD__OUT_V(out + i * ldo + DSGD__VW, c##i##1)
    DSGD__OUT_ROW(0); DSGD__OUT_ROW(1); DSGD__OUT_ROW(2); DSGD__OUT_ROW(3); DSGD__OUT_ROW(4); DSGD__OUT_ROW(5);
#undef DSGD__OUT_ROW
#undef DSGD__OUT_V
}
#else
DSGD__NO_CONTRACT_FN static void dsgd__micro_portable(int kc, const float *DSGD__RESTRICT ap,
                                                      const float *DSGD__RESTRICT bp, float *DSGD__RESTRICT out,
                                                      size_t ldo, float alpha, int add) {
    DSGD__NO_CONTRACT
    float acc[DSGD__PMR * DSGD__PNR];
    int i, j, p;
    for (i = 0; i < DSGD__PMR * DSGD__PNR; ++i) acc[i] = 0.0f;
    for (p = 0; p < kc; ++p) {
        for (i = 0; i < DSGD__PMR; ++i) {
            float av = ap[i];
            for (j = 0; j < DSGD__PNR; ++j) acc[i * DSGD__PNR + j] += av * bp[j];
        }
        ap += DSGD__PMR;
        bp += DSGD__PNR;
    }
    for (i = 0; i < DSGD__PMR; ++i)
        for (j = 0; j < DSGD__PNR; ++j) {
            float t = acc[i * DSGD__PNR + j];
            if (add)
                out[i * ldo + j] += t * alpha;
            else
                out[i * ldo + j] = t;
        }
}
#endif

/* ---- x86-64: AVX2+FMA and AVX-512F, compiled whatever -m flags the build
   has (target attributes) and called only where the CPU has them */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DSGD_CPU_NO_DISPATCH)
#define DSGD__X86_DISPATCH 1
#include <immintrin.h>

/* __builtin_cpu_supports also checks that the OS saves the wide registers. */
static int dsgd__isa_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
static int dsgd__isa_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f");
}

/* A 6 x 16 tile: twelve 8-wide accumulators, acc += a * b fused; the output
   step adds without contraction (DSGD__NO_CONTRACT_FN), as dsgd__gemm_add. */
__attribute__((target("avx2,fma"))) DSGD__NO_CONTRACT_FN static void dsgd__micro_avx2(
    int kc, const float *DSGD__RESTRICT ap, const float *DSGD__RESTRICT bp, float *DSGD__RESTRICT out, size_t ldo,
    float alpha, int add) {
    DSGD__NO_CONTRACT
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, a, b0, b1, va = _mm256_set1_ps(alpha);
    int p;
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    for (p = 0; p < kc; ++p) {
        b0 = _mm256_loadu_ps(bp);
        b1 = _mm256_loadu_ps(bp + 8);
#define DSGD__ROW8(i) \
    a = _mm256_broadcast_ss(ap + i); \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0); \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1)
        DSGD__ROW8(0); DSGD__ROW8(1); DSGD__ROW8(2); DSGD__ROW8(3); DSGD__ROW8(4); DSGD__ROW8(5);
#undef DSGD__ROW8
        ap += 6;
        bp += 16;
    }
#define DSGD__OUT8(q, v) \
    _mm256_storeu_ps(q, add ? _mm256_add_ps(_mm256_loadu_ps(q), _mm256_mul_ps(v, va)) : (v))
#define DSGD__ROW8(i) DSGD__OUT8(out + i * ldo, c##i##0); DSGD__OUT8(out + i * ldo + 8, c##i##1)
    DSGD__ROW8(0); DSGD__ROW8(1); DSGD__ROW8(2); DSGD__ROW8(3); DSGD__ROW8(4); DSGD__ROW8(5);
#undef DSGD__ROW8
#undef DSGD__OUT8
}

/* A 12 x 32 tile: twenty-four 16-wide accumulators, acc += a * b fused;
   the output step as dsgd__micro_avx2's. */
__attribute__((target("avx512f"))) DSGD__NO_CONTRACT_FN static void dsgd__micro_avx512(
    int kc, const float *DSGD__RESTRICT ap, const float *DSGD__RESTRICT bp, float *DSGD__RESTRICT out, size_t ldo,
    float alpha, int add) {
    DSGD__NO_CONTRACT
    __m512 c0[12], c1[12], a, b0, b1, va = _mm512_set1_ps(alpha);
    int p;
#define DSGD__ZERO16(i) c0[i] = c1[i] = _mm512_setzero_ps()
    DSGD__ZERO16(0); DSGD__ZERO16(1); DSGD__ZERO16(2); DSGD__ZERO16(3); DSGD__ZERO16(4); DSGD__ZERO16(5);
    DSGD__ZERO16(6); DSGD__ZERO16(7); DSGD__ZERO16(8); DSGD__ZERO16(9); DSGD__ZERO16(10); DSGD__ZERO16(11);
#undef DSGD__ZERO16
    for (p = 0; p < kc; ++p) {
        b0 = _mm512_loadu_ps(bp);
        b1 = _mm512_loadu_ps(bp + 16);
#define DSGD__ROW16(i) \
    a = _mm512_set1_ps(ap[i]); \
    c0[i] = _mm512_fmadd_ps(a, b0, c0[i]); \
    c1[i] = _mm512_fmadd_ps(a, b1, c1[i])
        DSGD__ROW16(0); DSGD__ROW16(1); DSGD__ROW16(2); DSGD__ROW16(3); DSGD__ROW16(4); DSGD__ROW16(5);
        DSGD__ROW16(6); DSGD__ROW16(7); DSGD__ROW16(8); DSGD__ROW16(9); DSGD__ROW16(10); DSGD__ROW16(11);
#undef DSGD__ROW16
        ap += 12;
        bp += 32;
    }
#define DSGD__OUT16(q, v) \
    _mm512_storeu_ps(q, add ? _mm512_add_ps(_mm512_loadu_ps(q), _mm512_mul_ps(v, va)) : (v))
#define DSGD__ROW16(i) DSGD__OUT16(out + i * ldo, c0[i]); DSGD__OUT16(out + i * ldo + 16, c1[i])
    DSGD__ROW16(0); DSGD__ROW16(1); DSGD__ROW16(2); DSGD__ROW16(3); DSGD__ROW16(4); DSGD__ROW16(5);
    DSGD__ROW16(6); DSGD__ROW16(7); DSGD__ROW16(8); DSGD__ROW16(9); DSGD__ROW16(10); DSGD__ROW16(11);
#undef DSGD__ROW16
#undef DSGD__OUT16
}

DSGD__ELEMENTWISE(avx2, __attribute__((target("avx2,fma"))))
DSGD__ELEMENTWISE(avx512, __attribute__((target("avx512f"))))
#else
#define DSGD__X86_DISPATCH 0
#endif

/* The kernels, widest first: the first one supported is the default. */
#define DSGD__KERNEL(NAME, SUFFIX, SUPPORTED, MR, NR)                                   \
    {/* .name = */ NAME, /* .supported = */ SUPPORTED, /* .mr = */ MR, /* .nr = */ NR,  \
     /* .micro = */ dsgd__micro_##SUFFIX, /* .scale = */ dsgd__scale_##SUFFIX,          \
     /* .axpy = */ dsgd__axpy_##SUFFIX, /* .bias_act = */ dsgd__bias_act_##SUFFIX,      \
     /* .act_backward = */ dsgd__act_backward_##SUFFIX,                                 \
     /* .bias_backward = */ dsgd__bias_backward_##SUFFIX,                               \
     /* .update = */ dsgd__update_##SUFFIX, /* .nonfinite = */ dsgd__nonfinite_##SUFFIX}
static const dsgd__cpu_kernel dsgd__cpu_kernels[] = {
#if DSGD__X86_DISPATCH
    DSGD__KERNEL("avx512", avx512, dsgd__isa_avx512, 12, 32),
    DSGD__KERNEL("avx2", avx2, dsgd__isa_avx2, 6, 16),
#endif
    DSGD__KERNEL("portable", portable, dsgd__isa_always, DSGD__PMR, DSGD__PNR),
};
#undef DSGD__KERNEL

/* The kernel named `want` when the CPU runs it, else the widest one it runs
   (also for NULL, "" and names not in the table). */
static const dsgd__cpu_kernel *dsgd__cpu_kernel_choose(const char *want) {
    const dsgd__cpu_kernel *best = NULL;
    size_t i;
    for (i = 0; i < sizeof(dsgd__cpu_kernels) / sizeof(dsgd__cpu_kernels[0]); ++i) {
        const dsgd__cpu_kernel *k = &dsgd__cpu_kernels[i];
        if (!k->supported()) continue;
        if (!best) best = k;
        if (want && !strcmp(want, k->name)) return k;
    }
    return best;
}

DSGD_API const char *dsgd_cpu_isa(void) { return dsgd__cpu_kernel_choose(getenv("DSGD_CPU_ISA"))->name; }

/* >>gemm ------------------------------------------------------------------- */
/* A cache-blocked GEMM in the style of Goto & van de Geijn (2008): B is packed
   into KC x NC panels of NR-wide column strips, A into MC x KC panels of
   MR-high row strips, and a register-blocked MR x NR micro-kernel does the
   arithmetic into a tile that is then added, times alpha, to C.

   The micro-kernel is chosen at run time (see dsgd_cpu_isa): "avx512"
   (AVX-512F, 12 x 32), "avx2" (AVX2 and FMA, 6 x 16) or "portable" (GNU
   vectors of the compiler's width, 6 x 8 on plain x86-64 and NEON, 6 x 16
   with -mavx). Whatever MR and NR are, every entry of C is summed in the same
   order: beta C, then for each KC block of k, in order, alpha times that
   block's products summed from its first p to its last. So results are
   bitwise reproducible for a given kernel; every kernel without FMA (the
   portable one, at any width) gives the same bits, and so do the two FMA
   kernels, which differ from the portable one in the last bits (one rounding
   per multiply-add instead of two). */

/* C(m, n) = beta C; beta == 0 overwrites, so NaN in C does not propagate */
static void dsgd__gemm_beta(int m, int n, float beta, float *c, int ldc) {
    int i, j;
    for (i = 0; i < m; ++i) {
        float *row = c + (size_t)i * ldc;
        if (beta == 0.0f)
            for (j = 0; j < n; ++j) row[j] = 0.0f;
        else if (beta != 1.0f)
            for (j = 0; j < n; ++j) row[j] *= beta;
    }
}

#ifndef DSGD_USE_CBLAS
#define DSGD__KC 256
#define DSGD__MC 120  /* a multiple of every kernel's MR */
#define DSGD__NC 2048 /* a multiple of every kernel's NR */
#define DSGD__MR_MAX 12
#define DSGD__NR_MAX 32

#if defined(__SSE__) && (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <xmmintrin.h>
#define DSGD__PACK_SSE 1
#else
#define DSGD__PACK_SSE 0
#endif

/* dst[p * stride + r] = src[r * ld + p] for r < rows, p < cols: the
   transposing copy of packing, where a row of the source is contiguous and
   the packed strip wants it as a column. With SSE (every x86-64) it moves
   4 x 4 blocks through registers instead of one float at a time. */
static void dsgd__pack_t(const float *src, size_t ld, int rows, int cols, int stride, float *DSGD__RESTRICT dst) {
    int r = 0, p;
#if DSGD__PACK_SSE
    for (; r + 4 <= rows; r += 4) {
        const float *s0 = src + (size_t)r * ld, *s1 = s0 + ld, *s2 = s1 + ld, *s3 = s2 + ld;
        for (p = 0; p + 4 <= cols; p += 4) {
            __m128 x0 = _mm_loadu_ps(s0 + p), x1 = _mm_loadu_ps(s1 + p), x2 = _mm_loadu_ps(s2 + p),
                   x3 = _mm_loadu_ps(s3 + p);
            float *d = dst + (size_t)p * stride + r;
            _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
            _mm_storeu_ps(d, x0);
            _mm_storeu_ps(d + stride, x1);
            _mm_storeu_ps(d + 2 * (size_t)stride, x2);
            _mm_storeu_ps(d + 3 * (size_t)stride, x3);
        }
        for (; p < cols; ++p) {
            float *d = dst + (size_t)p * stride + r;
            d[0] = s0[p], d[1] = s1[p], d[2] = s2[p], d[3] = s3[p];
        }
    }
#endif
    for (; r < rows; ++r) {
        const float *s = src + (size_t)r * ld;
        for (p = 0; p < cols; ++p) dst[(size_t)p * stride + r] = s[p];
    }
}

/* Packs the mc x kc block of op(A) at (i0, p0) into mr_-row strips. */
static void dsgd__pack_a(int ta, const float *a, int lda, int i0, int mc, int p0, int kc, int mr_,
                         float *DSGD__RESTRICT ap) {
    int ib, i, p;
    for (ib = 0; ib < mc; ib += mr_) {
        int mr = DSGD__MIN(mr_, mc - ib);
        if (ta) { /* a column of op(A) is contiguous: read along it */
            for (p = 0; p < kc; ++p) {
                const float *src = a + (size_t)(p0 + p) * lda + i0 + ib;
                for (i = 0; i < mr; ++i) ap[(size_t)p * mr_ + i] = src[i];
                for (; i < mr_; ++i) ap[(size_t)p * mr_ + i] = 0.0f;
            }
        } else { /* a row is contiguous: read along it, write with stride mr_ */
            dsgd__pack_t(a + (size_t)(i0 + ib) * lda + p0, (size_t)lda, mr, kc, mr_, ap);
            for (i = mr; i < mr_; ++i)
                for (p = 0; p < kc; ++p) ap[(size_t)p * mr_ + i] = 0.0f;
        }
        ap += (size_t)kc * mr_;
    }
}

/* Packs the kc x nc block of op(B) at (p0, j0) into nr_-column strips. */
static void dsgd__pack_b(int tb, const float *b, int ldb, int p0, int kc, int j0, int nc, int nr_,
                         float *DSGD__RESTRICT bp) {
    int jb, j, p;
    for (jb = 0; jb < nc; jb += nr_) {
        int nr = DSGD__MIN(nr_, nc - jb);
        if (tb) { /* a column of op(B) is a contiguous row of B: read along it */
            dsgd__pack_t(b + (size_t)(j0 + jb) * ldb + p0, (size_t)ldb, nr, kc, nr_, bp);
            for (j = nr; j < nr_; ++j)
                for (p = 0; p < kc; ++p) bp[(size_t)p * nr_ + j] = 0.0f;
        } else {
            for (p = 0; p < kc; ++p) {
                const float *src = b + (size_t)(p0 + p) * ldb + j0 + jb;
                memcpy(bp + (size_t)p * nr_, src, (size_t)nr * sizeof(float));
                for (j = nr; j < nr_; ++j) bp[(size_t)p * nr_ + j] = 0.0f;
            }
        }
        bp += (size_t)kc * nr_;
    }
}

/* C(mr, nr) += alpha * acc(mr, nr). Shared by every kernel and compiled for
   the baseline target, so no kernel fuses this multiply-add and the kernels'
   bits differ only where their accumulation does. */
DSGD__NO_CONTRACT_FN static void dsgd__gemm_add(float *c, int ldc, int mr, int nr, float alpha,
                           const float *DSGD__RESTRICT acc, int ld) {
    DSGD__NO_CONTRACT
    int i, j;
    for (i = 0; i < mr; ++i) {
        float *row = c + (size_t)i * ldc;
        const float *t = acc + (size_t)i * ld;
        j = 0;
#if defined(__GNUC__) || defined(__clang__)
        { /* the same operations, element by element, VW at a time */
            dsgd__v8 vc, vt;
            for (j = 0; j + DSGD__VW <= nr; j += DSGD__VW) {
                DSGD__V8_LOAD(vc, row + j);
                DSGD__V8_LOAD(vt, t + j);
                vc += vt * alpha;
                DSGD__V8_STORE(row + j, vc);
            }
        }
#endif
        for (; j < nr; ++j) row[j] += alpha * t[j];
    }
}

/* C^T += alpha * acc: C(j, i) += alpha acc(i, j) for i < mr, j < nr, the
   same operations as dsgd__gemm_add, for the transposed product below. */
DSGD__NO_CONTRACT_FN static void dsgd__gemm_add_t(float *c, int ldc, int mr, int nr, float alpha,
                                                  const float *DSGD__RESTRICT acc, int ld) {
    DSGD__NO_CONTRACT
    int i, j;
    for (j = 0; j < nr; ++j) {
        float *row = c + (size_t)j * ldc;
        for (i = 0; i < mr; ++i) row[i] += alpha * acc[(size_t)i * ld + j];
    }
}

/* Rows [r0, r1) and panel columns [c0, c1) of one (jc, pc) block: C (or,
   with trans_c, C^T stored as C(n, m)) += alpha op(A) op(B), from B's
   packed panel and A packed here into ap, MC rows at a time. */
static void dsgd__gemm_macro(const dsgd__cpu_kernel *kern, float *ap, const float *panel, int ta, const float *a,
                             int lda, int pc, int kc, int r0, int r1, int jc, int c0, int c1, float alpha, float *c,
                             int ldc, int trans_c) {
    const int kmr = kern->mr, knr = kern->nr;
    float acc[DSGD__MR_MAX * DSGD__NR_MAX];
    int ic, ir, jr;
    for (ic = r0; ic < r1; ic += DSGD__MC) {
        int mc = DSGD__MIN(DSGD__MC, r1 - ic);
        dsgd__pack_a(ta, a, lda, ic, mc, pc, kc, kmr, ap);
        for (jr = c0; jr < c1; jr += knr) {
            for (ir = 0; ir < mc; ir += kmr) {
                int mr = DSGD__MIN(kmr, mc - ir), nr = DSGD__MIN(knr, c1 - jr);
                const float *at = ap + (size_t)ir * kc, *bt = panel + (size_t)jr * kc;
                if (!trans_c && mr == kmr && nr == knr) { /* a whole tile: added in registers */
                    kern->micro(kc, at, bt, c + (size_t)(ic + ir) * ldc + jc + jr, (size_t)ldc, alpha, 1);
                    continue;
                }
                kern->micro(kc, at, bt, acc, (size_t)knr, 0.0f, 0);
                if (trans_c)
                    dsgd__gemm_add_t(c + (size_t)(jc + jr) * ldc + ic + ir, ldc, mr, nr, alpha, acc, knr);
                else
                    dsgd__gemm_add(c + (size_t)(ic + ir) * ldc + jc + jr, ldc, mr, nr, alpha, acc, knr);
            }
        }
    }
}

/* C(m, n) (or, with trans_c, C^T stored as C(n, m)) += alpha op(A) op(B):
   the blocked loops above, with `pack` (MC x KC + KC x NC floats). */
static void dsgd__gemm_blocked(const dsgd__cpu_kernel *kern, float *pack, int ta, int tb, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb, float *c, int ldc,
                               int trans_c) {
    float *bp = pack + (size_t)DSGD__MC * DSGD__KC;
    int jc, pc;
    for (jc = 0; jc < n; jc += DSGD__NC) {
        int nc = DSGD__MIN(DSGD__NC, n - jc);
        for (pc = 0; pc < k; pc += DSGD__KC) {
            int kc = DSGD__MIN(DSGD__KC, k - pc);
            dsgd__pack_b(tb, b, ldb, pc, kc, jc, nc, kern->nr, bp);
            dsgd__gemm_macro(kern, pack, bp, ta, a, lda, pc, kc, 0, m, jc, 0, nc, alpha, c, ldc, trans_c);
        }
    }
}

/* C(m, n) = beta C + alpha op(A) op(B) on one thread. When C is narrower
   than a tile and its tiles would be mostly padding (n = 10 outputs in
   32-wide tiles), it computes C^T =
   op(B)^T op(A)^T instead, with the long side across the tile's width: each
   entry is still the same products (a b = b a) summed in the same order,
   so the bits do not change. */
static void dsgd__gemm_serial(const dsgd__cpu_kernel *kern, float *pack, int ta, int tb, int m, int n, int k,
                              float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c,
                              int ldc) {
#define DSGD__UP(x, t) (((size_t)(x) + (size_t)(t) - 1) / (size_t)(t) * (size_t)(t))
    const int kmr = kern->mr, knr = kern->nr;
    dsgd__gemm_beta(m, n, beta, c, ldc);
    if (k == 0 || alpha == 0.0f) return;
    if (n < knr && DSGD__UP(n, kmr) * DSGD__UP(m, knr) < DSGD__UP(m, kmr) * DSGD__UP(n, knr))
        dsgd__gemm_blocked(kern, pack, !tb, !ta, n, m, k, alpha, b, ldb, a, lda, c, ldc, 1);
    else
        dsgd__gemm_blocked(kern, pack, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc, 0);
#undef DSGD__UP
}

/* A GEMM cut into independent tasks (what the threads do with a C narrower
   than a tile, or with nothing to multiply): rows of C (rows = 1) or
   columns, `step` each, a multiple of the kernel's MR or NR. Each task is
   the whole GEMM of its block of C, so every entry is summed as the
   one-thread GEMM sums it. */
typedef struct dsgd__gemm_job {
    const dsgd__cpu_kernel *kern;
    float *const *pack;
    int ta, tb, m, n, k, lda, ldb, ldc, rows, step;
    float alpha, beta;
    const float *a, *b;
    float *c;
} dsgd__gemm_job;

static void dsgd__gemm_task(void *arg, int task, int slot) {
    const dsgd__gemm_job *j = (const dsgd__gemm_job *)arg;
    const float *a = j->a, *b = j->b;
    size_t lo = (size_t)task * (size_t)j->step;
    int len = DSGD__MIN(j->step, (j->rows ? j->m : j->n) - (int)lo);
    if (j->rows) { /* rows lo.. of C: rows of op(A) */
        if (a) a += j->ta ? lo : lo * (size_t)j->lda;
        dsgd__gemm_serial(j->kern, j->pack[slot], j->ta, j->tb, len, j->n, j->k, j->alpha, a, j->lda, b, j->ldb,
                          j->beta, j->c + lo * (size_t)j->ldc, j->ldc);
    } else { /* columns lo.. of C: columns of op(B) */
        if (b) b += j->tb ? lo * (size_t)j->ldb : lo;
        dsgd__gemm_serial(j->kern, j->pack[slot], j->ta, j->tb, j->m, len, j->k, j->alpha, a, j->lda, b, j->ldb,
                          j->beta, j->c + lo, j->ldc);
    }
}

/* C = beta C + alpha op(A) op(B) as independent blocks, one per thread
   (split) or one in all, in whole tiles along C's longer side. */
static void dsgd__gemm_blocks(dsgd__cpu *cpu, int split, int ta, int tb, int m, int n, int k, float alpha,
                              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dsgd__gemm_job j;
    int tasks = 1, dim, tile, units;
    j.kern = cpu->kern;
    j.pack = cpu->pack;
    j.ta = ta, j.tb = tb, j.m = m, j.n = n, j.k = k, j.lda = lda, j.ldb = ldb, j.ldc = ldc;
    j.alpha = alpha, j.beta = beta, j.a = a, j.b = b, j.c = c;
    j.rows = m >= n;
    dim = j.rows ? m : n;
    j.step = dim;
    if (split) {
        tile = j.rows ? cpu->kern->mr : cpu->kern->nr;
        units = (dim + tile - 1) / tile;
        tasks = DSGD__MIN(cpu->pool.n, units);
        j.step = (units + tasks - 1) / tasks * tile;
        tasks = (dim + j.step - 1) / j.step;
    }
    dsgd__cpu_run(cpu, dsgd__gemm_task, &j, tasks);
}

/* The threads' GEMM for a C at least as wide as a tile: per (jc, pc) block
   the threads first pack B's KC x NC panel together, each a range of its
   NR strips, into slot 0's B area; then each computes a block of C, whole
   MR tiles of rows (and, when C has fewer row tiles than threads, whole NR
   strips of columns), packing its own A panels. Nothing is packed twice,
   and every entry of C is still summed block of k by block of k, in order,
   as the one-thread GEMM sums it. Each phase is one dsgd__cpu_run, whose
   return is the barrier between them. */
typedef struct dsgd__gemm_par {
    const dsgd__cpu_kernel *kern;
    float *const *pack;
    float *panel; /* the shared packed B panel */
    int ta, tb, m, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int jc, nc, pc, kc;                  /* the current block */
    int strips, strip_step;              /* phase 1: NR strips of the panel, per task */
    int row_step, col_step, col_tasks;   /* phase 2: the grid of C's blocks */
} dsgd__gemm_par;

static void dsgd__gemm_par_pack(void *arg, int task, int slot) {
    const dsgd__gemm_par *g = (const dsgd__gemm_par *)arg;
    const int nr = g->kern->nr, s0 = task * g->strip_step, s1 = DSGD__MIN(g->strips, s0 + g->strip_step);
    DSGD__UNUSED(slot);
    dsgd__pack_b(g->tb, g->b, g->ldb, g->pc, g->kc, g->jc + s0 * nr, DSGD__MIN(g->nc - s0 * nr, (s1 - s0) * nr), nr,
                 g->panel + (size_t)s0 * g->kc * nr);
}

static void dsgd__gemm_par_compute(void *arg, int task, int slot) {
    const dsgd__gemm_par *g = (const dsgd__gemm_par *)arg;
    const int r0 = (task / g->col_tasks) * g->row_step, r1 = DSGD__MIN(g->m, r0 + g->row_step);
    const int c0 = (task % g->col_tasks) * g->col_step, c1 = DSGD__MIN(g->nc, c0 + g->col_step);
    if (r0 >= r1 || c0 >= c1) return;
    if (g->pc == 0) dsgd__gemm_beta(r1 - r0, c1 - c0, g->beta, g->c + (size_t)r0 * g->ldc + g->jc + c0, g->ldc);
    dsgd__gemm_macro(g->kern, g->pack[slot], g->panel, g->ta, g->a, g->lda, g->pc, g->kc, r0, r1, g->jc, c0, c1,
                     g->alpha, g->c, g->ldc, 0);
}

static void dsgd__gemm_threads(dsgd__cpu *cpu, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                               int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    dsgd__gemm_par g;
    const int T = cpu->pool.n, kmr = cpu->kern->mr, knr = cpu->kern->nr;
    int row_tiles = (m + kmr - 1) / kmr, row_tasks = DSGD__MIN(T, row_tiles), ptasks;
    memset(&g, 0, sizeof(g));
    g.kern = cpu->kern;
    g.pack = cpu->pack;
    g.panel = cpu->pack[0] + (size_t)DSGD__MC * DSGD__KC;
    g.ta = ta, g.tb = tb, g.m = m, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    g.alpha = alpha, g.beta = beta, g.a = a, g.b = b, g.c = c;
    g.row_step = (row_tiles + row_tasks - 1) / row_tasks * kmr;
    for (g.jc = 0; g.jc < n; g.jc += DSGD__NC) {
        g.nc = DSGD__MIN(DSGD__NC, n - g.jc);
        g.strips = (g.nc + knr - 1) / knr;
        g.col_tasks = row_tasks < T ? DSGD__MIN((T + row_tasks - 1) / row_tasks, g.strips) : 1;
        g.col_step = (g.strips + g.col_tasks - 1) / g.col_tasks * knr;
        ptasks = DSGD__MIN(T, g.strips);
        g.strip_step = (g.strips + ptasks - 1) / ptasks;
        ptasks = (g.strips + g.strip_step - 1) / g.strip_step;
        for (g.pc = 0; g.pc < k; g.pc += DSGD__KC) {
            g.kc = DSGD__MIN(DSGD__KC, k - g.pc);
            dsgd__cpu_run(cpu, dsgd__gemm_par_pack, &g, ptasks);
            dsgd__cpu_run(cpu, dsgd__gemm_par_compute, &g, row_tasks * g.col_tasks);
        }
    }
}

/* The packing scratch of thread slots 0..slots-1, allocated before any
   task runs: MC x KC + KC x NC floats each. */
static dsgd_result dsgd__cpu_pack_reserve(dsgd__cpu *cpu, int slots) {
    size_t need = (size_t)DSGD__MC * DSGD__KC + (size_t)DSGD__KC * DSGD__NC;
    int i;
    for (i = 0; i < slots; ++i)
        if (!cpu->pack[i] && !(cpu->pack[i] = (float *)DSGD_MALLOC(need * sizeof(float))))
            return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_OUT_OF_MEMORY, "cpu gemm: packing buffer");
    return DSGD_OK;
}

#endif /* !DSGD_USE_CBLAS */

/* GEMMs of fewer multiply-adds than this run on one thread. */
#define DSGD__CPU_GEMM_GRAIN 131072.0

static dsgd_result dsgd__cpu_gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha,
                                  dsgd_ref ra, int lda, dsgd_ref rb, int ldb, float beta,
                                  dsgd_ref rc, int ldc) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    const float *a, *b;
    float *c;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < DSGD__MAX(1, a_cols) || ldb < DSGD__MAX(1, b_cols) ||
        ldc < DSGD__MAX(1, n))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "cpu gemm: bad sizes m=%d n=%d k=%d lda=%d ldb=%d ldc=%d", m, n, k,
                                  lda, ldb, ldc);
    if (m == 0 || n == 0) return DSGD_OK;
    c = dsgd__cpu_span(cpu, rc, (size_t)(m - 1) * ldc + n, "gemm C");
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    a = b = NULL;
    if (k > 0) { /* check every range before C is touched */
        a = dsgd__cpu_span(cpu, ra, (size_t)(a_rows - 1) * lda + a_cols, "gemm A");
        b = dsgd__cpu_span(cpu, rb, (size_t)(b_rows - 1) * ldb + b_cols, "gemm B");
        if (!a || !b) return DSGD_ERR_INVALID_ARGUMENT;
    }
#ifdef DSGD_USE_CBLAS
    dsgd__gemm_beta(m, n, beta, c, ldc);
    if (k > 0 && alpha != 0.0f)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, 1.0f, c, ldc);
    return DSGD_OK;
#else
    {
        /* GEMMs big enough for the threads: the shared-panel GEMM, or
           independent blocks where C is narrower than a tile */
        const int split = cpu->pool.n > 1 && (double)m * n * DSGD__MAX(k, 1) >= DSGD__CPU_GEMM_GRAIN;
        dsgd_result r = dsgd__cpu_pack_reserve(cpu, split ? cpu->pool.n : 1);
        if (r != DSGD_OK) return r;
        if (split && k > 0 && alpha != 0.0f && n >= cpu->kern->nr)
            dsgd__gemm_threads(cpu, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        else
            dsgd__gemm_blocks(cpu, split, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    }
    return DSGD_OK;
#endif
}

/* >>element-wise operations ---------------------------------------------- */
/* An element-wise operation cut into tasks of `step` items (elements;
   rows of BIAS_ACT, columns of BIAS_BACKWARD). Each element's arithmetic is
   the kernel's whatever the cut, so every thread count gives the same bits. */
enum {
    DSGD__EW_SCALE,
    DSGD__EW_AXPY,
    DSGD__EW_FILL,
    DSGD__EW_MEMCPY, /* write and read: host memory to or from the buffer */
    DSGD__EW_BIAS_ACT,
    DSGD__EW_ACT_BACKWARD,
    DSGD__EW_BIAS_BACKWARD,
    DSGD__EW_UPDATE,
    DSGD__EW_NONFINITE
};

typedef struct dsgd__ew_job {
    const dsgd__cpu_kernel *kern;
    int op;
    size_t items, step;
    float *x;       /* written: x, y of axpy, dy, db, the parameters */
    const float *y; /* read: x of axpy, y of act_backward, bias, dy, the gradient */
    float alpha;
    dsgd_activation act;
    int rows, cols; /* BIAS_ACT, BIAS_BACKWARD: the matrix */
    const dsgd_opt_update *u;
    float *m1, *m2;
    int nonfinite; /* NONFINITE: set (atomically) by a task that finds one */
} dsgd__ew_job;

static void dsgd__ew_task(void *arg, int task, int slot) {
    dsgd__ew_job *j = (dsgd__ew_job *)arg;
    size_t lo = (size_t)task * j->step, cnt = j->items - lo < j->step ? j->items - lo : j->step, i;
    DSGD__UNUSED(slot);
    switch (j->op) {
    case DSGD__EW_SCALE: j->kern->scale(j->x + lo, j->alpha, cnt); break;
    case DSGD__EW_AXPY: j->kern->axpy(j->x + lo, j->alpha, j->y + lo, cnt); break;
    case DSGD__EW_FILL:
        for (i = 0; i < cnt; ++i) j->x[lo + i] = j->alpha;
        break;
    case DSGD__EW_MEMCPY: memcpy(j->x + lo, j->y + lo, cnt * sizeof(float)); break;
    case DSGD__EW_BIAS_ACT: j->kern->bias_act(j->act, j->x + lo * (size_t)j->cols, j->y, (int)cnt, j->cols); break;
    case DSGD__EW_ACT_BACKWARD: j->kern->act_backward(j->act, j->x + lo, j->y + lo, cnt); break;
    case DSGD__EW_BIAS_BACKWARD: j->kern->bias_backward(j->x + lo, j->y + lo, j->rows, (int)cnt, j->cols); break;
    case DSGD__EW_UPDATE:
        j->kern->update(j->u, j->x + lo, j->y + lo, j->m1 ? j->m1 + lo : NULL, j->m2 ? j->m2 + lo : NULL, cnt);
        break;
    default:
        if (j->kern->nonfinite(j->y + lo, cnt)) DSGD__STORE_RLX(&j->nonfinite, 1);
        break;
    }
}

/* Operations on fewer floats than twice this run on one thread. */
#define DSGD__CPU_EW_GRAIN 16384

/* Runs job over its items, `per_item` floats each, cut into at most one
   task per thread of at least DSGD__CPU_EW_GRAIN floats. */
static void dsgd__cpu_ew(dsgd__cpu *cpu, dsgd__ew_job *j, size_t items, size_t per_item) {
    size_t floats = items * (per_item ? per_item : 1), tasks = 1;
    j->kern = cpu->kern;
    j->items = items;
    j->step = items ? items : 1;
    if (cpu->pool.n > 1 && floats >= 2 * (size_t)DSGD__CPU_EW_GRAIN) {
        tasks = floats / DSGD__CPU_EW_GRAIN;
        if (tasks > (size_t)cpu->pool.n) tasks = (size_t)cpu->pool.n;
        j->step = (items + tasks - 1) / tasks;
        if (per_item == 1) j->step = (j->step + 15) & ~(size_t)15; /* whole 16-element blocks */
        tasks = (items + j->step - 1) / j->step;
    }
    dsgd__cpu_run(cpu, dsgd__ew_task, j, items ? (int)tasks : 0);
}

/* A job of operation op with everything else zero. */
static dsgd__ew_job dsgd__ew(int op) {
    dsgd__ew_job j;
    memset(&j, 0, sizeof(j));
    j.op = op;
    return j;
}


/* write and read: one memcpy of count floats, cut across the threads when
   it is large. */
static void dsgd__cpu_memcpy(dsgd__cpu *cpu, float *dst, const float *src, size_t count) {
    dsgd__ew_job j = dsgd__ew(DSGD__EW_MEMCPY);
    j.x = dst;
    j.y = src;
    dsgd__cpu_ew(cpu, &j, count, 1);
}

static dsgd_result dsgd__cpu_write(void *impl, dsgd_ref dst, const float *src, size_t count) {
    float *d = dsgd__cpu_span((dsgd__cpu *)impl, dst, count, "write");
    if (!d) return DSGD_ERR_INVALID_ARGUMENT;
    dsgd__cpu_memcpy((dsgd__cpu *)impl, d, src, count);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_read(void *impl, dsgd_ref src, float *dst, size_t count) {
    float *s = dsgd__cpu_span((dsgd__cpu *)impl, src, count, "read");
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    dsgd__cpu_memcpy((dsgd__cpu *)impl, dst, s, count);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_fill(void *impl, dsgd_ref dst, float value, size_t count) {
    float *d = dsgd__cpu_span((dsgd__cpu *)impl, dst, count, "fill");
    dsgd__ew_job j = dsgd__ew(DSGD__EW_FILL);
    if (!d) return DSGD_ERR_INVALID_ARGUMENT;
    j.x = d;
    j.alpha = value;
    dsgd__cpu_ew((dsgd__cpu *)impl, &j, count, 1);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_scale(void *impl, dsgd_ref x, float alpha, size_t n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *p = dsgd__cpu_span(cpu, x, n, "scale");
    dsgd__ew_job j = dsgd__ew(DSGD__EW_SCALE);
    if (!p) return DSGD_ERR_INVALID_ARGUMENT;
    j.x = p;
    j.alpha = alpha;
    dsgd__cpu_ew(cpu, &j, n, 1);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_axpy(void *impl, dsgd_ref y, float alpha, dsgd_ref x, size_t n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *py = dsgd__cpu_span(cpu, y, n, "axpy");
    float *px = dsgd__cpu_span(cpu, x, n, "axpy");
    dsgd__ew_job j = dsgd__ew(DSGD__EW_AXPY);
    size_t i;
    if (!py || !px) return DSGD_ERR_INVALID_ARGUMENT;
    if (py == px) { /* y += alpha y: one array, one by one */
        for (i = 0; i < n; ++i) py[i] += alpha * px[i];
        return DSGD_OK;
    }
    if (dsgd__cpu_overlap(y, n, x, n))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu axpy: y and x overlap");
    j.x = py;
    j.y = px;
    j.alpha = alpha;
    dsgd__cpu_ew(cpu, &j, n, 1);
    return DSGD_OK;
}

/* >>activations and losses ------------------------------------------------- */

static int dsgd__act_valid(dsgd_activation act) {
    return act == DSGD_ACT_NONE || act == DSGD_ACT_RELU || act == DSGD_ACT_TANH ||
           act == DSGD_ACT_SIGMOID;
}

static dsgd_result dsgd__cpu_bias_act_forward(void *impl, dsgd_activation act, dsgd_ref ry,
                                              dsgd_ref rbias, int m, int n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *y;
    const float *bias = NULL;
    dsgd__ew_job j = dsgd__ew(DSGD__EW_BIAS_ACT);
    if (m < 0 || n < 0 || !dsgd__act_valid(act))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "cpu bias_act_forward: bad arguments m=%d n=%d act=%d", m, n, (int)act);
    y = dsgd__cpu_span(cpu, ry, (size_t)m * n, "bias_act_forward y");
    if (!y) return DSGD_ERR_INVALID_ARGUMENT;
    if (rbias.buf) {
        bias = dsgd__cpu_span(cpu, rbias, (size_t)n, "bias_act_forward bias");
        if (!bias) return DSGD_ERR_INVALID_ARGUMENT;
        if (dsgd__cpu_overlap(ry, (size_t)m * n, rbias, (size_t)n))
            return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu bias_act_forward: y and bias overlap");
    }
    j.x = y;
    j.y = bias;
    j.act = act;
    j.cols = n;
    dsgd__cpu_ew(cpu, &j, (size_t)m, (size_t)n);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_act_backward(void *impl, dsgd_activation act, dsgd_ref rdy, dsgd_ref ry,
                                          size_t n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *dy;
    const float *y;
    dsgd__ew_job j = dsgd__ew(DSGD__EW_ACT_BACKWARD);
    if (!dsgd__act_valid(act))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu act_backward: bad activation %d", (int)act);
    dy = dsgd__cpu_span(cpu, rdy, n, "act_backward dy");
    y = dsgd__cpu_span(cpu, ry, n, "act_backward y");
    if (!dy || !y) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__cpu_overlap(rdy, n, ry, n))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu act_backward: dy and y overlap");
    j.x = dy;
    j.y = y;
    j.act = act;
    dsgd__cpu_ew(cpu, &j, n, 1);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_bias_backward(void *impl, dsgd_ref rdb, dsgd_ref rdy, int m, int n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *db;
    const float *dy;
    dsgd__ew_job j = dsgd__ew(DSGD__EW_BIAS_BACKWARD);
    if (m < 0 || n < 0)
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu bias_backward: m=%d n=%d", m, n);
    db = dsgd__cpu_span(cpu, rdb, (size_t)n, "bias_backward db");
    dy = dsgd__cpu_span(cpu, rdy, (size_t)m * n, "bias_backward dy");
    if (!db || !dy) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__cpu_overlap(rdb, (size_t)n, rdy, (size_t)m * n))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu bias_backward: db and dy overlap");
    j.x = db;
    j.y = dy;
    j.rows = m;
    j.cols = n;
    dsgd__cpu_ew(cpu, &j, (size_t)n, (size_t)m);
    return DSGD_OK;
}

static int dsgd__argmax(const float *v, int n) {
    int j, best = 0;
    for (j = 1; j < n; ++j)
        if (v[j] > v[best]) best = j;
    return best;
}

static dsgd_result dsgd__cpu_loss(void *impl, dsgd_loss loss, int m, int c, dsgd_ref rpred,
                                  dsgd_ref rtarget, float grad_scale, dsgd_ref rdpred, dsgd_ref rstats) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    const float *pred, *target;
    float *dpred = NULL, *stats;
    double loss_sum = 0.0, correct = 0.0;
    int i, j;
    if (m < 0 || c < 1 || (loss != DSGD_LOSS_SOFTMAX_XENT && loss != DSGD_LOSS_MSE))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu loss: bad arguments m=%d c=%d loss=%d", m, c, (int)loss);
    pred = dsgd__cpu_span(cpu, rpred, (size_t)m * c, "loss pred");
    target = dsgd__cpu_span(cpu, rtarget, loss == DSGD_LOSS_MSE ? (size_t)m * c : (size_t)m, "loss target");
    stats = dsgd__cpu_span(cpu, rstats, 2, "loss stats");
    if (!pred || !target || !stats) return DSGD_ERR_INVALID_ARGUMENT;
    if (rdpred.buf) {
        dpred = dsgd__cpu_span(cpu, rdpred, (size_t)m * c, "loss dpred");
        if (!dpred) return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (loss == DSGD_LOSS_SOFTMAX_XENT) {
        /* validate every label before writing anything */
        for (i = 0; i < m; ++i) {
            float t = target[i];
            if (!(t >= 0.0f && t < (float)c) || t != floorf(t))
                return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                          "softmax cross-entropy: class %g of sample %d is not an integer in [0, %d)",
                                          (double)t, i, c);
        }
        for (i = 0; i < m; ++i) {
            const float *z = pred + (size_t)i * c;
            int cls = (int)target[i], best = dsgd__argmax(z, c);
            double mx = z[best], sum = 0.0, lse;
            for (j = 0; j < c; ++j) sum += exp((double)z[j] - mx);
            lse = mx + log(sum);
            loss_sum += lse - (double)z[cls];
            correct += best == cls;
            if (dpred) {
                float *d = dpred + (size_t)i * c;
                for (j = 0; j < c; ++j) {
                    double p = exp((double)z[j] - lse);
                    d[j] = (float)(grad_scale * (p - (j == cls ? 1.0 : 0.0)));
                }
            }
        }
    } else {
        for (i = 0; i < m; ++i) {
            const float *p = pred + (size_t)i * c, *t = target + (size_t)i * c;
            double s = 0.0;
            for (j = 0; j < c; ++j) {
                double e = (double)p[j] - (double)t[j];
                s += e * e;
                if (dpred) dpred[(size_t)i * c + j] = (float)(grad_scale * 2.0 * e / c);
            }
            loss_sum += s / c;
            correct += dsgd__argmax(p, c) == dsgd__argmax(t, c);
        }
    }
    stats[0] += (float)loss_sum;
    stats[1] += (float)correct;
    return DSGD_OK;
}

/* >>optimizer updates ------------------------------------------------------ */
/* The formulas are in dsgd__update_body (>>kernels). */
static dsgd_result dsgd__cpu_optimizer_update(void *impl, const dsgd_opt_update *u, dsgd_ref rp,
                                              dsgd_ref rg, dsgd_ref rm1, dsgd_ref rm2, size_t n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *p = dsgd__cpu_span(cpu, rp, n, "optimizer_update param");
    const float *g = dsgd__cpu_span(cpu, rg, n, "optimizer_update grad");
    float *m1 = NULL, *m2 = NULL;
    dsgd__ew_job j = dsgd__ew(DSGD__EW_UPDATE);
    if (!p || !g || !u) return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu optimizer_update: bad arguments");
    if (u->kind != DSGD_OPT_SGD) {
        m1 = dsgd__cpu_span(cpu, rm1, n, "optimizer_update state m1");
        if (!m1) return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (u->kind == DSGD_OPT_ADAM || u->kind == DSGD_OPT_ADAMW) {
        m2 = dsgd__cpu_span(cpu, rm2, n, "optimizer_update state m2");
        if (!m2) return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (u->kind != DSGD_OPT_SGD && u->kind != DSGD_OPT_MOMENTUM && u->kind != DSGD_OPT_ADAM &&
        u->kind != DSGD_OPT_ADAMW)
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu optimizer_update: unknown kind %d", (int)u->kind);
    if (dsgd__cpu_overlap(rp, n, rg, n) || (m1 && (dsgd__cpu_overlap(rp, n, rm1, n) || dsgd__cpu_overlap(rg, n, rm1, n))) ||
        (m2 && (dsgd__cpu_overlap(rp, n, rm2, n) || dsgd__cpu_overlap(rg, n, rm2, n) || dsgd__cpu_overlap(rm1, n, rm2, n))))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "cpu optimizer_update: param, grad and state ranges overlap");
    j.u = u;
    j.x = p;
    j.y = g;
    j.m1 = m1;
    j.m2 = m2;
    dsgd__cpu_ew(cpu, &j, n, 1);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_norm_check(void *impl, dsgd_ref rx, size_t n, double *sumsq, size_t *nonfinite) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    const float *x = dsgd__cpu_span(cpu, rx, n, "norm_check");
    double s = 0.0;
    size_t bad = 0, i;
    if (!x) return DSGD_ERR_INVALID_ARGUMENT;
    if (!sumsq) {
        /* finiteness only (the strategies' check every step) */
        dsgd__ew_job j = dsgd__ew(DSGD__EW_NONFINITE);
        j.y = x;
        dsgd__cpu_ew(cpu, &j, n, 1);
        if (!DSGD__LOAD_RLX(&j.nonfinite)) {
            if (nonfinite) *nonfinite = 0;
            return DSGD_OK;
        }
    }
    for (i = 0; i < n; ++i) {
        if (isfinite(x[i]))
            s += (double)x[i] * (double)x[i];
        else
            ++bad;
    }
    if (sumsq) *sumsq = s;
    if (nonfinite) *nonfinite = bad;
    return DSGD_OK;
}

/* >>images ----------------------------------------------------------------- */
/* im2col, col2im and max-pool over NHWC images (IMAGES in backend.h). Each
   task owns a range of rows of its output: im2col and maxpool_forward the
   output rows (i, oy), col2im and maxpool_backward the rows (i, iy) of dx,
   which each gather their own sums in the documented order. So the cut
   changes no bits, and neither does the ISA: these are copies, compares
   and adds, each element's in one order. */

enum { DSGD__IMG_IM2COL, DSGD__IMG_COL2IM, DSGD__IMG_POOL_FWD, DSGD__IMG_POOL_BWD };

typedef struct dsgd__img_job {
    int op;
    dsgd_window wd;
    dsgd__window_dims d;
    const float *x;  /* x; col for COL2IM */
    const float *y;  /* POOL_BWD: y */
    const float *dy; /* POOL_BWD: dy */
    float *out;      /* col, dx or y */
    size_t items, step; /* rows of the output (see above), per task */
} dsgd__img_job;

/* d[j] += s[j] for j < n: different arrays */
DSGD__INLINE void dsgd__img_add(float *DSGD__RESTRICT d, const float *DSGD__RESTRICT s, size_t n) {
#define DSGD__ADD(i) d[i] += s[i]
    DSGD__EACH(n, DSGD__ADD);
#undef DSGD__ADD
}

/* The first kx in [0, kw) whose column ix0 + kx is inside [0, w), and one
   past the last; lo >= hi when none is. */
static void dsgd__img_span(int ix0, int kw, int w, int *lo, int *hi) {
    *lo = ix0 < 0 ? -ix0 : 0;
    *hi = w - ix0 < kw ? w - ix0 : kw;
    if (*lo > kw) *lo = kw;
}

/* col rows (i, oy, ox) in [lo, hi): per (row, ky), zeros, one contiguous
   copy of the kx that fall inside the image (consecutive kx read
   consecutive pixels), zeros. */
static void dsgd__img_im2col(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const size_t c = (size_t)wd->c, k = j->d.k, run = (size_t)wd->kw * c;
    size_t r, i = lo / ((size_t)j->d.ow * (size_t)j->d.oh);
    int ox = (int)(lo % (size_t)j->d.ow), oy = (int)(lo / (size_t)j->d.ow % (size_t)j->d.oh);
    for (r = lo; r < hi; ++r) {
        const int iy0 = oy * wd->stride - wd->pad, ix0 = ox * wd->stride - wd->pad;
        float *dst = j->out + r * k;
        int ky, kx0, kx1;
        dsgd__img_span(ix0, wd->kw, wd->w, &kx0, &kx1);
        for (ky = 0; ky < wd->kh; ++ky, dst += run) {
            const int iy = iy0 + ky;
            if (iy < 0 || iy >= wd->h || kx0 >= kx1) {
                memset(dst, 0, run * sizeof(float));
                continue;
            }
            if (kx0 > 0) memset(dst, 0, (size_t)kx0 * c * sizeof(float));
            memcpy(dst + (size_t)kx0 * c, j->x + ((i * (size_t)wd->h + (size_t)iy) * (size_t)wd->w + (size_t)(ix0 + kx0)) * c,
                   (size_t)(kx1 - kx0) * c * sizeof(float));
            if (kx1 < wd->kw) memset(dst + (size_t)kx1 * c, 0, (size_t)(wd->kw - kx1) * c * sizeof(float));
        }
        if (++ox == j->d.ow) { /* the next row's (i, oy, ox), without dividing */
            ox = 0;
            if (++oy == j->d.oh) {
                oy = 0;
                ++i;
            }
        }
    }
}

/* dx rows (i, iy) in [lo, hi): zero the row, then for ky ascending (the
   output row oy that reads row iy with it), the output columns ox
   descending, so that every element receives its kx in ascending order:
   the sum is (ky, kx) ascending, as the gather documents. */
static void dsgd__img_col2im(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const size_t c = (size_t)wd->c, k = j->d.k, rowlen = (size_t)wd->w * c;
    size_t r;
    for (r = lo; r < hi; ++r) {
        const int iy = (int)(r % (size_t)wd->h);
        const size_t i = r / (size_t)wd->h;
        float *dst = j->out + r * rowlen;
        int ky, ox;
        memset(dst, 0, rowlen * sizeof(float));
        for (ky = 0; ky < wd->kh; ++ky) {
            const int t = iy + wd->pad - ky; /* oy * stride */
            int oy;
            if (t < 0) break; /* and so for every later ky */
            if (t % wd->stride != 0 || (oy = t / wd->stride) >= j->d.oh) continue;
            for (ox = j->d.ow - 1; ox >= 0; --ox) {
                const int ix0 = ox * wd->stride - wd->pad;
                int kx0, kx1;
                dsgd__img_span(ix0, wd->kw, wd->w, &kx0, &kx1);
                if (kx0 >= kx1) continue;
                dsgd__img_add(dst + (size_t)(ix0 + kx0) * c,
                              j->x + ((i * (size_t)j->d.oh + (size_t)oy) * (size_t)j->d.ow + (size_t)ox) * k +
                                  ((size_t)ky * (size_t)wd->kw + (size_t)kx0) * c,
                              (size_t)(kx1 - kx0) * c);
            }
        }
    }
}

/* m[j] = v[j] when v[j] > m[j], or when v[j] is the first NaN (m[j] is not
   one): so m ends as the first maximum, or the first NaN, of a window (the
   OpenCL kernel decides the same way). One select, which gcc -O2 vectorises. */
DSGD__INLINE void dsgd__img_max(float *DSGD__RESTRICT m, const float *DSGD__RESTRICT v, size_t n) {
#define DSGD__MAX1(i) m[i] = !(v[i] <= m[i]) && m[i] == m[i] ? v[i] : m[i]
    DSGD__EACH(n, DSGD__MAX1);
#undef DSGD__MAX1
}

/* y rows (i, oy) in [lo, hi): per output pixel, its c channels start from
   the window's first element, then take the others in (ky, kx) order. */
static void dsgd__img_pool_fwd(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const size_t c = (size_t)wd->c;
    size_t r;
    for (r = lo; r < hi; ++r) {
        const int oy = (int)(r % (size_t)j->d.oh);
        const size_t i = r / (size_t)j->d.oh;
        int ox, ky, kx;
        for (ox = 0; ox < j->d.ow; ++ox) {
            float *m = j->out + (r * (size_t)j->d.ow + (size_t)ox) * c;
            const float *base = j->x + ((i * (size_t)wd->h + (size_t)(oy * wd->stride)) * (size_t)wd->w +
                                        (size_t)(ox * wd->stride)) * c;
            memcpy(m, base, c * sizeof(float));
            for (ky = 0; ky < wd->kh; ++ky)
                for (kx = ky == 0 ? 1 : 0; kx < wd->kw; ++kx)
                    dsgd__img_max(m, base + ((size_t)ky * (size_t)wd->w + (size_t)kx) * c, c);
        }
    }
}

/* dx rows (i, iy) in [lo, hi): zero them, then every window that covers
   one of them, (oy, ox) ascending, finds per channel its first element
   equal to y (or the first NaN for a NaN y) and, when that element lies in
   [lo, hi), adds the window's dy to it. */
#define DSGD__POOL_BLOCK 64 /* maxpool_backward's channels at a time */

/* One element of a window in maxpool_backward, for n channels: those still
   open whose x equals y (both NaN for a NaN y) close, and take their dy
   when `mine` (the element is in the task's rows). Without branches, so
   that data-dependent choices do not stall: a channel that takes nothing
   adds 0.0f, which changes no bits, as d + 0.0f == d unless d is -0.0f
   (outside round-down mode) or a signaling NaN, and d, a sum started from
   +0.0f, is neither. */
DSGD__INLINE void dsgd__img_pool_take(int *DSGD__RESTRICT open, float *DSGD__RESTRICT d, const float *DSGD__RESTRICT x,
                                      const float *DSGD__RESTRICT y, const float *DSGD__RESTRICT dy, size_t n,
                                      int mine) {
    /* x == y is false for a NaN y, which matches through the second term
       only; every term is computed, so gcc -O2 vectorises the loops */
#define DSGD__TAKE(i)                                                                             \
    do {                                                                                          \
        const float xv_ = x[i], yv_ = y[i];                                                       \
        const int o_ = open[i], hit_ = o_ & ((xv_ == yv_) | ((yv_ != yv_) & (xv_ != xv_)));      \
        open[i] = o_ & ~hit_;                                                                     \
        if (ADD_) {                                                                               \
            const float g_ = dy[i], d_ = d[i]; /* loaded whatever hit_ is: no branch */           \
            d[i] = d_ + (hit_ ? g_ : 0.0f);                                                       \
        }                                                                                         \
    } while (0)
    if (mine) {
#define ADD_ 1
        DSGD__EACH(n, DSGD__TAKE);
#undef ADD_
    } else {
#define ADD_ 0
        DSGD__EACH(n, DSGD__TAKE);
#undef ADD_
    }
#undef DSGD__TAKE
}

static void dsgd__img_pool_bwd(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const size_t c = (size_t)wd->c, rowlen = (size_t)wd->w * c, H = (size_t)wd->h;
    size_t r = lo;
    memset(j->out + lo * rowlen, 0, (hi - lo) * rowlen * sizeof(float));
    while (r < hi) { /* one image's band of rows [a, b) at a time */
        const size_t i = r / H;
        const int a = (int)(r % H), b = (int)((i + 1) * H < hi ? H : hi - i * H);
        /* the windows whose rows [oy s, oy s + kh) meet [a, b) */
        int oy = a - wd->kh + 1 <= 0 ? 0 : (a - wd->kh + wd->stride) / wd->stride, oy_end = (b - 1) / wd->stride + 1, ox;
        if (oy_end > j->d.oh) oy_end = j->d.oh;
        for (; oy < oy_end; ++oy)
            for (ox = 0; ox < j->d.ow; ++ox) {
                const size_t o = ((i * (size_t)j->d.oh + (size_t)oy) * (size_t)j->d.ow + (size_t)ox) * c;
                const size_t base = ((i * H + (size_t)(oy * wd->stride)) * (size_t)wd->w + (size_t)(ox * wd->stride)) * c;
                size_t c0;
                /* DSGD__POOL_BLOCK channels at a time: every element of the
                   window, in (ky, kx) order, is a contiguous run of them */
                for (c0 = 0; c0 < c; c0 += DSGD__POOL_BLOCK) {
                    const size_t cn = c - c0 < DSGD__POOL_BLOCK ? c - c0 : DSGD__POOL_BLOCK;
                    int open[DSGD__POOL_BLOCK], ky, kx;
                    size_t ch;
                    for (ch = 0; ch < cn; ++ch) open[ch] = 1;
                    for (ky = 0; ky < wd->kh; ++ky) {
                        const int iy = oy * wd->stride + ky, mine = iy >= a && iy < b;
                        for (kx = 0; kx < wd->kw; ++kx) {
                            const size_t e = base + ((size_t)ky * (size_t)wd->w + (size_t)kx) * c + c0;
                            dsgd__img_pool_take(open, j->out + e, j->x + e, j->y + o + c0, j->dy + o + c0, cn, mine);
                        }
                    }
                }
            }
        r = (i + 1) * H;
    }
}

static void dsgd__img_task(void *arg, int task, int slot) {
    const dsgd__img_job *j = (const dsgd__img_job *)arg;
    size_t lo = (size_t)task * j->step, hi = j->items - lo < j->step ? j->items : lo + j->step;
    DSGD__UNUSED(slot);
    switch (j->op) {
    case DSGD__IMG_IM2COL: dsgd__img_im2col(j, lo, hi); break;
    case DSGD__IMG_COL2IM: dsgd__img_col2im(j, lo, hi); break;
    case DSGD__IMG_POOL_FWD: dsgd__img_pool_fwd(j, lo, hi); break;
    default: dsgd__img_pool_bwd(j, lo, hi); break;
    }
}

/* Runs job over `items` output rows of `floats` floats in all: at most one
   task per thread, each of at least DSGD__CPU_EW_GRAIN floats. */
static void dsgd__cpu_img(dsgd__cpu *cpu, dsgd__img_job *j, size_t items, size_t floats) {
    size_t tasks = 1;
    j->items = items;
    j->step = items;
    if (cpu->pool.n > 1 && floats >= 2 * (size_t)DSGD__CPU_EW_GRAIN) {
        tasks = floats / DSGD__CPU_EW_GRAIN;
        if (tasks > (size_t)cpu->pool.n) tasks = (size_t)cpu->pool.n;
        if (tasks > items) tasks = items;
        j->step = (items + tasks - 1) / tasks;
        tasks = (items + j->step - 1) / j->step;
    }
    dsgd__cpu_run(cpu, dsgd__img_task, j, (int)tasks);
}

/* The checks of every image operation: the window, the input range `in`
   of nin floats (and those of maxpool_backward's y and dy), the output
   range `out` of nout floats, and that the output overlaps no input. */
static dsgd_result dsgd__cpu_img_begin(dsgd__cpu *cpu, dsgd__img_job *j, int op, const char *name,
                                        const dsgd_window *wd, dsgd_ref in, dsgd_ref ry, dsgd_ref rdy, dsgd_ref out) {
    const int pool = op == DSGD__IMG_POOL_FWD || op == DSGD__IMG_POOL_BWD;
    size_t nin, nout;
    char what[48];
    memset(j, 0, sizeof(*j));
    j->op = op;
    if (dsgd__window_check(cpu->ctx, "cpu", name, wd, pool, &j->d) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    j->wd = *wd;
    nin = op == DSGD__IMG_COL2IM ? j->d.col : j->d.x;
    nout = op == DSGD__IMG_IM2COL ? j->d.col : op == DSGD__IMG_POOL_FWD ? j->d.y : j->d.x;
    snprintf(what, sizeof(what), "%s %s", name, op == DSGD__IMG_COL2IM ? "col" : "x");
    if (!(j->x = dsgd__cpu_span(cpu, in, nin, what))) return DSGD_ERR_INVALID_ARGUMENT;
    snprintf(what, sizeof(what), "%s %s", name,
             op == DSGD__IMG_IM2COL ? "col" : op == DSGD__IMG_POOL_FWD ? "y" : "dx");
    if (!(j->out = dsgd__cpu_span(cpu, out, nout, what))) return DSGD_ERR_INVALID_ARGUMENT;
    if (op == DSGD__IMG_POOL_BWD) {
        snprintf(what, sizeof(what), "%s y", name);
        if (!(j->y = dsgd__cpu_span(cpu, ry, j->d.y, what))) return DSGD_ERR_INVALID_ARGUMENT;
        snprintf(what, sizeof(what), "%s dy", name);
        if (!(j->dy = dsgd__cpu_span(cpu, rdy, j->d.y, what))) return DSGD_ERR_INVALID_ARGUMENT;
        if (dsgd__cpu_overlap(out, nout, ry, j->d.y) || dsgd__cpu_overlap(out, nout, rdy, j->d.y))
            return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu %s: dx overlaps y or dy", name);
    }
    if (dsgd__cpu_overlap(out, nout, in, nin))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu %s: the output overlaps the input", name);
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_im2col(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref col) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__img_job j;
    dsgd_result r = dsgd__cpu_img_begin(cpu, &j, DSGD__IMG_IM2COL, "im2col", wd, x, x, x, col);
    if (r == DSGD_OK) dsgd__cpu_img(cpu, &j, j.d.rows, j.d.col);
    return r;
}

static dsgd_result dsgd__cpu_col2im(void *impl, const dsgd_window *wd, dsgd_ref col, dsgd_ref dx) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__img_job j;
    dsgd_result r = dsgd__cpu_img_begin(cpu, &j, DSGD__IMG_COL2IM, "col2im", wd, col, col, col, dx);
    if (r == DSGD_OK) dsgd__cpu_img(cpu, &j, (size_t)wd->n * (size_t)wd->h, j.d.col);
    return r;
}

static dsgd_result dsgd__cpu_maxpool_forward(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__img_job j;
    dsgd_result r = dsgd__cpu_img_begin(cpu, &j, DSGD__IMG_POOL_FWD, "maxpool_forward", wd, x, x, x, y);
    if (r == DSGD_OK) dsgd__cpu_img(cpu, &j, (size_t)wd->n * (size_t)j.d.oh, j.d.x);
    return r;
}

static dsgd_result dsgd__cpu_maxpool_backward(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y,
                                              dsgd_ref dy, dsgd_ref dx) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__img_job j;
    dsgd_result r = dsgd__cpu_img_begin(cpu, &j, DSGD__IMG_POOL_BWD, "maxpool_backward", wd, x, y, dy, dx);
    if (r == DSGD_OK) dsgd__cpu_img(cpu, &j, (size_t)wd->n * (size_t)wd->h, j.d.x);
    return r;
}

static void dsgd__cpu_destroy(void *impl) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    int i;
    if (!cpu) return;
    dsgd__pool_stop(&cpu->pool);
    if (cpu->pack)
        for (i = 0; i < cpu->pool.n; ++i) DSGD_FREE(cpu->pack[i]);
    DSGD_FREE(cpu->pack);
    DSGD_FREE(cpu);
}

DSGD_API int dsgd_cpu_count(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > DSGD_CPU_MAX_THREADS ? DSGD_CPU_MAX_THREADS : (int)n;
}

DSGD_API dsgd_result dsgd_cpu_backend_create(dsgd_ctx *ctx, dsgd_backend_i *out) {
    return dsgd_cpu_backend_create_desc(ctx, NULL, out);
}

DSGD_API dsgd_result dsgd_cpu_backend_create_desc(dsgd_ctx *ctx, const dsgd_cpu_backend_desc *desc,
                                                  dsgd_backend_i *out) {
    const char *what = "dsgd_cpu_backend_create";
    dsgd__cpu *cpu;
    dsgd_result r;
    int threads = desc && desc->threads > 1 ? desc->threads : 1;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
    memset(out, 0, sizeof(*out));
    if (desc && (desc->threads < 0 || desc->threads > DSGD_CPU_MAX_THREADS))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d threads (0..%d)", what, desc->threads,
                                  DSGD_CPU_MAX_THREADS);
    cpu = (dsgd__cpu *)dsgd__alloc(ctx, sizeof(*cpu), what);
    if (!cpu) return DSGD_ERR_OUT_OF_MEMORY;
    memset(cpu, 0, sizeof(*cpu));
    cpu->ctx = ctx;
    cpu->kern = dsgd__cpu_kernel_choose(getenv("DSGD_CPU_ISA"));
    cpu->pool.n = threads;
    cpu->pack = (float **)dsgd__alloc(ctx, sizeof(float *) * (size_t)threads, what);
    if (!cpu->pack) {
        dsgd__cpu_destroy(cpu);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    memset(cpu->pack, 0, sizeof(float *) * (size_t)threads);
    if ((r = dsgd__pool_start(ctx, &cpu->pool, threads)) != DSGD_OK) {
        dsgd__cpu_destroy(cpu);
        return r;
    }
#ifndef DSGD_USE_CBLAS
    DSGD_ASSERT(DSGD__MC % cpu->kern->mr == 0 && DSGD__NC % cpu->kern->nr == 0 &&
                cpu->kern->mr <= DSGD__MR_MAX && cpu->kern->nr <= DSGD__NR_MAX);
#endif
    out->name = "cpu";
    out->impl = cpu;
    out->destroy = dsgd__cpu_destroy;
    out->buffer_create = dsgd__cpu_buffer_create;
    out->buffer_destroy = dsgd__cpu_buffer_destroy;
    out->buffer_host_ptr = dsgd__cpu_buffer_host_ptr;
    out->write = dsgd__cpu_write;
    out->read = dsgd__cpu_read;
    out->copy = dsgd__cpu_copy;
    out->fill = dsgd__cpu_fill;
    out->scale = dsgd__cpu_scale;
    out->axpy = dsgd__cpu_axpy;
    out->gemm = dsgd__cpu_gemm;
    out->bias_act_forward = dsgd__cpu_bias_act_forward;
    out->act_backward = dsgd__cpu_act_backward;
    out->bias_backward = dsgd__cpu_bias_backward;
    out->loss = dsgd__cpu_loss;
    out->optimizer_update = dsgd__cpu_optimizer_update;
    out->norm_check = dsgd__cpu_norm_check;
    out->finish = NULL;
    out->im2col = dsgd__cpu_im2col;
    out->col2im = dsgd__cpu_col2im;
    out->maxpool_forward = dsgd__cpu_maxpool_forward;
    out->maxpool_backward = dsgd__cpu_maxpool_backward;
    return DSGD_OK;
}

DSGD_API const char *dsgd_cpu_backend_isa(const dsgd_backend_i *be) {
    if (!be || !be->impl || be->destroy != dsgd__cpu_destroy) return NULL;
    return ((const dsgd__cpu *)be->impl)->kern->name;
}

DSGD_API int dsgd_cpu_backend_threads(const dsgd_backend_i *be) {
    if (!be || !be->impl || be->destroy != dsgd__cpu_destroy) return 0;
    return ((const dsgd__cpu *)be->impl)->pool.n;
}

#endif /* DSGD__PART_BACKEND_CPU_IMPL */
