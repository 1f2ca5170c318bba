/* distsgd/backend_cpu.h - the CPU reference backend: its state, buffers, thread pool and kernels by ISA
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   The CPU backend is three parts, in this order; its public functions are
   declared in backend.h, which also documents CPU KERNELS and CPU THREADS:
     backend_cpu.h       (this one) the backend's state and buffers, the pool
                         of threads that runs an operation's tasks (CPU
                         THREADS), and the kernels by ISA: the GEMM
                         micro-kernels and the element-wise loops, their
                         table and dsgd_cpu_isa (CPU KERNELS)
     backend_cpu_gemm.h  the cache-blocked GEMM over those micro-kernels, on
                         one thread and on the pool
     backend_cpu_ops.h   the other operations (element-wise, activations and
                         losses, optimizer updates, images), and the table
                         of operations: dsgd_cpu_backend_create
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
/* One ISA's kernels: the GEMM micro-kernel and the hot element-wise loops
   (max-pool's gradient over windows apart among them),
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
   T (add 0), or out += alpha T (add 1) rounded as dsgd__gemm_add (in
   backend_cpu_gemm.h) rounds (a product, then a sum; no contraction), with
   the tile still in registers; add 2: out = 0.0f + alpha T, the same sum
   over an out that beta = 0 zeroed, without reading it. */
typedef void (*dsgd__micro_fn)(int kc, const float *DSGD__RESTRICT ap, const float *DSGD__RESTRICT bp,
                               float *DSGD__RESTRICT out, size_t ldo, float alpha, int add);

/* The thin GEMM's kernel (backend_cpu_gemm.h): T(MR x n) = Ap(MR, kc) B(kc,
   n), n <= the kernel's thin_n, with Ap packed as for the micro-kernel
   (MR entries of a column, for rows 0..MR-1, then the next column lda
   floats on: lda = MR when packed, more where A is read where it lies) and
   B read where it lies (rows ldb apart, no packing); then the first `rows`
   rows of c (ldc apart) become c + alpha T (load 1) or 0.0f + alpha T (load
   0: what c would be after beta = 0), rounded as the micro-kernel rounds,
   or T itself (load 2).
   Each entry of T is the micro-kernel's sum, in the same order, so the bits
   are the blocked GEMM's. */
typedef void (*dsgd__thin_fn)(int kc, const float *DSGD__RESTRICT ap, size_t lda, const float *DSGD__RESTRICT b,
                              size_t ldb, int n, int rows, float *DSGD__RESTRICT c, size_t ldc, float alpha, int load);

/* One entry of the kernel table. The element-wise members take ranges the
   backend operation has checked; different arrays must not overlap. */
typedef struct dsgd__cpu_kernel {
    const char *name;       /* dsgd_cpu_isa's answer */
    int (*supported)(void); /* 1 when this CPU (and OS) runs it */
    int mr, nr;             /* GEMM tile rows and columns (packing strips) */
    dsgd__micro_fn micro;
    dsgd__thin_fn thin;     /* NULL: no thin GEMM (the blocked one does all) */
    int thin_n;             /* the widest C it takes */
    void (*scale)(float *x, float alpha, size_t n);
    void (*axpy)(float *y, float alpha, const float *x, size_t n);
    void (*bias_act)(dsgd_activation act, float *y, const float *bias, int m, int n);
    void (*act_backward)(dsgd_activation act, float *dy, const float *y, size_t n);
    void (*bias_backward)(float *db, const float *dy, int m, int n, int ld); /* dy's rows ld apart */
    void (*update)(const dsgd_opt_update *u, float *p, const float *g, float *m1, float *m2, size_t n);
    int (*nonfinite)(const float *x, size_t n); /* 1 when an element is NaN or infinite */
    /* max-pool's gradient over a row of windows that do not overlap
       (dsgd__pool_back_body) */
    void (*pool_back)(float *dx, const float *x, const float *y, const float *dy, size_t c, size_t rowlen, int ow,
                      int kh, int kw, int stride, int r0, int r1);
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

/* bias_backward's fixed blocked order: the rows are cut into blocks of
   DSGD__BIAS_ROWS (the last one shorter); each block's column partial is
   summed from 0.0f in row order, then db sums the partials from 0.0f in
   block order. The OpenCL backend (DSGD_CL__BIAS_ROWS in
   distsgd/cl/kernels.h) uses the same constant and order, so the two give
   the same bits, and with m <= DSGD__BIAS_ROWS it is the plain row order.
   The partials of DSGD__BIAS_COLS columns at a time live on the stack. */
#define DSGD__BIAS_ROWS 128
#define DSGD__BIAS_COLS 256

/* db(n) = column sums of dy(m, n) (rows ld apart), in the blocked order */
DSGD__INLINE void dsgd__bias_backward_body(float *DSGD__RESTRICT db, const float *DSGD__RESTRICT dy,
                                           int m, int n, int ld) {
    float part[DSGD__BIAS_COLS];
    int j0, lo, i;
    for (j0 = 0; j0 < n; j0 += DSGD__BIAS_COLS) {
        const int nc = n - j0 < DSGD__BIAS_COLS ? n - j0 : DSGD__BIAS_COLS;
        float *DSGD__RESTRICT out = db + j0;
        memset(out, 0, (size_t)nc * sizeof(float));
        for (lo = 0; lo < m; lo += DSGD__BIAS_ROWS) {
            const int hi = m - lo < DSGD__BIAS_ROWS ? m : lo + DSGD__BIAS_ROWS;
            memset(part, 0, (size_t)nc * sizeof(float));
            for (i = lo; i < hi; ++i) {
                const float *DSGD__RESTRICT row = dy + (size_t)i * ld + j0;
#define DSGD__COLSUM(j) part[j] += row[j]
                DSGD__EACH(nc, DSGD__COLSUM);
#undef DSGD__COLSUM
            }
#define DSGD__BLOCKSUM(j) out[j] += part[j]
            DSGD__EACH(nc, DSGD__BLOCKSUM);
#undef DSGD__BLOCKSUM
        }
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

/* Max-pool's gradient over one row of windows that do not overlap (stride
   >= kh and >= kw; backend_cpu_ops.h calls it): x and dx point at the
   first element of the band's first row (rows rowlen floats apart, c
   channels a pixel, window ox starting stride pixels after ox - 1), y and
   dy at the output row's first element. Every window element in rows
   [r0, r1) of the band becomes 0.0f + dy where it is the window's first
   (ky, kx) element equal to y (both NaN for a NaN y), else 0.0f + 0.0f:
   the bits of dx zeroed and then added to, as the windows do not overlap
   and no element takes two dy. Nothing else is written. Channels go
   DSGD__POOL_BLOCK at a time, with no branch on the data. */
#define DSGD__POOL_BLOCK 64
DSGD__INLINE void dsgd__pool_back_body(float *DSGD__RESTRICT dx, const float *DSGD__RESTRICT x,
                                       const float *DSGD__RESTRICT y, const float *DSGD__RESTRICT dy, size_t c,
                                       size_t rowlen, int ow, int kh, int kw, int stride, int r0, int r1) {
    int ox;
    for (ox = 0; ox < ow; ++ox) {
        const size_t base = (size_t)ox * (size_t)stride * c, o = (size_t)ox * c;
        size_t c0;
        for (c0 = 0; c0 < c; c0 += DSGD__POOL_BLOCK) {
            const size_t cn = c - c0 < DSGD__POOL_BLOCK ? c - c0 : DSGD__POOL_BLOCK;
            const float *DSGD__RESTRICT yv = y + o + c0, *DSGD__RESTRICT gv = dy + o + c0;
            int open[DSGD__POOL_BLOCK], ky, kx;
            size_t ch;
            for (ch = 0; ch < cn; ++ch) open[ch] = 1;
            for (ky = 0; ky < kh; ++ky) {
                const int mine = ky >= r0 && ky < r1;
                for (kx = 0; kx < kw; ++kx) {
                    const size_t e = base + (size_t)ky * rowlen + (size_t)kx * c + c0;
                    const float *DSGD__RESTRICT xv = x + e;
                    float *DSGD__RESTRICT d = dx + e;
                    /* x == y is false for a NaN y, which matches through
                       the second term only */
#define DSGD__HIT(i) (open[i] & ((xv[i] == yv[i]) | ((yv[i] != yv[i]) & (xv[i] != xv[i]))))
#define DSGD__PB_SET(i)                                                                  \
    do {                                                                                 \
        const int h_ = DSGD__HIT(i);                                                     \
        uint32_t u_;                                                                     \
        float g_;                                                                        \
        memcpy(&u_, gv + (i), sizeof(u_));                                               \
        u_ &= 0u - (uint32_t)h_; /* dy's bits or +0.0f's: a mask, not a branch */        \
        memcpy(&g_, &u_, sizeof(g_));                                                    \
        open[i] &= ~h_;                                                                  \
        d[i] = 0.0f + g_;                                                                \
    } while (0)
#define DSGD__PB_SKIP(i) open[i] &= ~DSGD__HIT(i)
                    if (mine)
                        DSGD__EACH(cn, DSGD__PB_SET);
                    else
                        DSGD__EACH(cn, DSGD__PB_SKIP);
#undef DSGD__PB_SKIP
#undef DSGD__PB_SET
#undef DSGD__HIT
                }
            }
        }
    }
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
    }                                                                                                          \
    ATTR DSGD__NO_CONTRACT_FN static void dsgd__pool_back_##SUFFIX(float *dx, const float *x, const float *y,   \
                                                                  const float *dy, size_t c, size_t rowlen,    \
                                                                  int ow, int kh, int kw, int stride, int r0,  \
                                                                  int r1) {                                    \
        dsgd__pool_back_body(dx, x, y, dy, c, rowlen, ow, kh, kw, stride, r0, r1);                             \
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
            if (add == 1) DSGD__V8_LOAD(o, q); else o = z;                               \
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
                out[i * ldo + j] = (add == 1 ? out[i * ldo + j] : 0.0f) + t * alpha;
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

/* The kernels' shared steps: M applied to rows 0..5 or 0..11; one row's
   multiply-add of a broadcast element of A into its two accumulators
   (avx2: c<i>0, c<i>1; avx512: c0[i], c1[i]); zeroing. */
#define DSGD__ROWS6(M) M(0); M(1); M(2); M(3); M(4); M(5)
#define DSGD__ROWS12(M) DSGD__ROWS6(M); M(6); M(7); M(8); M(9); M(10); M(11)
#define DSGD__FMA8(i) \
    a = _mm256_broadcast_ss(ap + i); \
    c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0); \
    c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1)
#define DSGD__FMA16(i) \
    a = _mm512_set1_ps(ap[i]); \
    c0[i] = _mm512_fmadd_ps(a, b0, c0[i]); \
    c1[i] = _mm512_fmadd_ps(a, b1, c1[i])
#define DSGD__ZERO16(i) c0[i] = c1[i] = _mm512_setzero_ps()

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
        DSGD__ROWS6(DSGD__FMA8);
        ap += 6;
        bp += 16;
    }
#define DSGD__OUT8(q, v) \
    _mm256_storeu_ps(q, add ? _mm256_add_ps(add == 1 ? _mm256_loadu_ps(q) : _mm256_setzero_ps(), \
                                            _mm256_mul_ps(v, va)) : (v))
#define DSGD__ROW8(i) DSGD__OUT8(out + i * ldo, c##i##0); DSGD__OUT8(out + i * ldo + 8, c##i##1)
    DSGD__ROWS6(DSGD__ROW8);
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
    DSGD__ROWS12(DSGD__ZERO16);
    for (p = 0; p < kc; ++p) {
        b0 = _mm512_loadu_ps(bp);
        b1 = _mm512_loadu_ps(bp + 16);
        DSGD__ROWS12(DSGD__FMA16);
        ap += 12;
        bp += 32;
    }
#define DSGD__OUT16(q, v) \
    _mm512_storeu_ps(q, add ? _mm512_add_ps(add == 1 ? _mm512_loadu_ps(q) : _mm512_setzero_ps(), \
                                            _mm512_mul_ps(v, va)) : (v))
#define DSGD__ROW16(i) DSGD__OUT16(out + i * ldo, c0[i]); DSGD__OUT16(out + i * ldo + 16, c1[i])
    DSGD__ROWS12(DSGD__ROW16);
#undef DSGD__ROW16
#undef DSGD__OUT16
}

/* The thin kernels: the micro-kernels' loops with B loaded unpacked, its
   columns past n masked off (read as 0.0f, never touched), and C's rows
   past `rows` left alone. */
__attribute__((target("avx2,fma"))) DSGD__NO_CONTRACT_FN static void dsgd__thin_avx2(
    int kc, const float *DSGD__RESTRICT ap, size_t lda, const float *DSGD__RESTRICT b, size_t ldb, int n, int rows,
    float *DSGD__RESTRICT c, size_t ldc, float alpha, int load) {
    DSGD__NO_CONTRACT
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i k0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane),
                  k1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - 8), lane);
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51, a, b0, b1, va = _mm256_set1_ps(alpha);
    int p;
    c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = _mm256_setzero_ps();
    for (p = 0; p < kc; ++p) {
        if (n >= 16) { /* AMD's masked moves are slow: plain ones where the row is whole */
            b0 = _mm256_loadu_ps(b);
            b1 = _mm256_loadu_ps(b + 8);
        } else {
            b0 = _mm256_maskload_ps(b, k0);
            b1 = _mm256_maskload_ps(b + 8, k1);
        }
        DSGD__ROWS6(DSGD__FMA8);
        ap += lda;
        b += ldb;
    }
#define DSGD__OUT8(q, v, k)                                                                                  \
    do {                                                                                                     \
        const __m256 t_ = _mm256_mul_ps(v, va);                                                              \
        if (load == 2 && n >= 16)                                                                            \
            _mm256_storeu_ps(q, v);                                                                          \
        else if (load == 2)                                                                                  \
            _mm256_maskstore_ps(q, k, v);                                                                    \
        else if (n >= 16)                                                                                    \
            _mm256_storeu_ps(q, _mm256_add_ps(load ? _mm256_loadu_ps(q) : _mm256_setzero_ps(), t_));         \
        else                                                                                                 \
            _mm256_maskstore_ps(q, k, _mm256_add_ps(load ? _mm256_maskload_ps(q, k) : _mm256_setzero_ps(), t_)); \
    } while (0)
#define DSGD__ROW8(i) \
    if (i < rows) { DSGD__OUT8(c + i * ldc, c##i##0, k0); DSGD__OUT8(c + i * ldc + 8, c##i##1, k1); }
    DSGD__ROWS6(DSGD__ROW8);
#undef DSGD__ROW8
#undef DSGD__OUT8
}

__attribute__((target("avx512f"))) DSGD__NO_CONTRACT_FN static void dsgd__thin_avx512(
    int kc, const float *DSGD__RESTRICT ap, size_t lda, const float *DSGD__RESTRICT b, size_t ldb, int n, int rows,
    float *DSGD__RESTRICT c, size_t ldc, float alpha, int load) {
    DSGD__NO_CONTRACT
    const __mmask16 k0 = (__mmask16)(n >= 16 ? 0xffffu : (1u << n) - 1u),
                    k1 = (__mmask16)(n >= 32 ? 0xffffu : n <= 16 ? 0u : (1u << (n - 16)) - 1u);
    __m512 c0[12], c1[12], a, b0, b1, va = _mm512_set1_ps(alpha);
    int p;
    DSGD__ROWS12(DSGD__ZERO16);
    if (k1) { /* two vectors wide */
        for (p = 0; p < kc; ++p) {
            b0 = _mm512_maskz_loadu_ps(k0, b);
            b1 = _mm512_maskz_loadu_ps(k1, b + 16);
            DSGD__ROWS12(DSGD__FMA16);
            ap += lda;
            b += ldb;
        }
    } else { /* one: the second's accumulators stay 0 and are not stored */
        for (p = 0; p < kc; ++p) {
            b0 = _mm512_maskz_loadu_ps(k0, b);
#define DSGD__ROW16(i) c0[i] = _mm512_fmadd_ps(_mm512_set1_ps(ap[i]), b0, c0[i])
            DSGD__ROWS12(DSGD__ROW16);
#undef DSGD__ROW16
            ap += lda;
            b += ldb;
        }
    }
#define DSGD__OUT16(q, v, k) \
    _mm512_mask_storeu_ps(q, k, load == 2 ? (v) : _mm512_add_ps(load ? _mm512_maskz_loadu_ps(k, q) : _mm512_setzero_ps(), \
                                                                _mm512_mul_ps(v, va)))
#define DSGD__ROW16(i) \
    if (i < rows) { DSGD__OUT16(c + i * ldc, c0[i], k0); if (k1) DSGD__OUT16(c + i * ldc + 16, c1[i], k1); }
    DSGD__ROWS12(DSGD__ROW16);
#undef DSGD__ROW16
#undef DSGD__OUT16
}

#undef DSGD__ROWS6
#undef DSGD__ROWS12
#undef DSGD__FMA8
#undef DSGD__FMA16
#undef DSGD__ZERO16

DSGD__ELEMENTWISE(avx2, __attribute__((target("avx2,fma"))))
DSGD__ELEMENTWISE(avx512, __attribute__((target("avx512f"))))
#else
#define DSGD__X86_DISPATCH 0
#endif

/* The kernels, widest first: the first one supported is the default. */
#define DSGD__KERNEL(NAME, SUFFIX, SUPPORTED, MR, NR, THIN, THIN_N)                     \
    {/* .name = */ NAME, /* .supported = */ SUPPORTED, /* .mr = */ MR, /* .nr = */ NR,  \
     /* .micro = */ dsgd__micro_##SUFFIX, /* .thin = */ THIN, /* .thin_n = */ THIN_N,   \
     /* .scale = */ dsgd__scale_##SUFFIX,                                               \
     /* .axpy = */ dsgd__axpy_##SUFFIX, /* .bias_act = */ dsgd__bias_act_##SUFFIX,      \
     /* .act_backward = */ dsgd__act_backward_##SUFFIX,                                 \
     /* .bias_backward = */ dsgd__bias_backward_##SUFFIX,                               \
     /* .update = */ dsgd__update_##SUFFIX, /* .nonfinite = */ dsgd__nonfinite_##SUFFIX, \
     /* .pool_back = */ dsgd__pool_back_##SUFFIX}
static const dsgd__cpu_kernel dsgd__cpu_kernels[] = {
#if DSGD__X86_DISPATCH
    DSGD__KERNEL("avx512", avx512, dsgd__isa_avx512, 12, 32, dsgd__thin_avx512, 32),
    DSGD__KERNEL("avx2", avx2, dsgd__isa_avx2, 6, 16, dsgd__thin_avx2, 16),
#endif
    DSGD__KERNEL("portable", portable, dsgd__isa_always, DSGD__PMR, DSGD__PNR, NULL, 0),
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

#endif /* DSGD__PART_BACKEND_CPU_IMPL */
