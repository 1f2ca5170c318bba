/* distsgd.h - v0.1.0 - data-parallel distributed SGD in one C99 header.
   MIT licence (see the end of this file).

   distsgd trains neural networks with data-parallel SGD, in the style of
   TensorFlow's tf.distribute, from plain C: models whose parameters live in one
   flat buffer, optimizers, datasets, replicas that all-reduce their gradients
   over a transport, per-variable aggregation, and strategies (one_device,
   mirrored). It depends on libc, libm and POSIX threads only.

   USING IT

     In exactly one C or C++ file:

         #define DISTSGD_IMPLEMENTATION
         #include "distsgd.h"

     Everywhere else, include "distsgd.h" without the define. Link with -lm
     (and -lpthread). Define DISTSGD_STATIC before the include to make every
     function static to that translation unit.

   A COMPLETE PROGRAM (C99; it learns XOR)

         #define DISTSGD_IMPLEMENTATION
         #include "distsgd.h"
         #include <stdio.h>

         int main(void) {
             float x[8] = {0,0, 0,1, 1,0, 1,1}, y[4] = {0, 1, 1, 0};
             dsgd_layer_desc layers[2] = {{8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                          {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
             dsgd_model_desc md = {0};
             dsgd_optimizer_desc od = {0};
             dsgd_ctx *ctx; dsgd_model *m; dsgd_optimizer *opt; dsgd_metrics mt;
             int step;
             md.input_dim = 2; md.layers = layers; md.num_layers = 2;
             md.max_batch = 4; md.seed = 1;
             od.kind = DSGD_OPT_ADAM; od.lr = 0.05f;
             if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
             if (dsgd_model_create(ctx, &md, &m) != DSGD_OK ||
                 dsgd_optimizer_create(m, &od, &opt) != DSGD_OK) {
                 fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); return 1;
             }
             for (step = 0; step < 300; ++step) {
                 dsgd_model_compute_gradients(m, x, y, 4, 1.0f / 4);
                 dsgd_optimizer_step(opt);
             }
             dsgd_model_eval_batch(m, x, y, 4);
             dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt);
             printf("accuracy %.2f\n", mt.correct / mt.count);
             dsgd_optimizer_destroy(opt); dsgd_model_destroy(m); dsgd_ctx_destroy(ctx);
             return 0;
         }

   CONFIGURATION

     Objects are configured by *_desc structs in which a zero field means "the
     default" (documented beside each field), so `dsgd_x_desc d = {0};` (`{}`
     in C++) plus the fields that have no default (a model's input_dim and
     layers, a variable's name and count) is valid. A function's comment says when its
     desc pointer may be NULL (all defaults).

     Compile-time options, before every include of the header:
       DISTSGD_STATIC      make the API static (private to the translation
                           unit, which must then define DISTSGD_IMPLEMENTATION)
       DSGD_API            the decoration of every public function (default
                           extern; static with DISTSGD_STATIC)
     and before the include that has DISTSGD_IMPLEMENTATION:
       DSGD_USE_CBLAS      the CPU backend's GEMM calls cblas_sgemm (link e.g.
                           -lopenblas); otherwise a portable cache-blocked GEMM
       DSGD_ASSERT(c)      replaces assert() for internal invariants (never used
                           to check user input)
       DSGD_MALLOC(sz), DSGD_REALLOC(p,sz), DSGD_FREE(p)
                           replace the allocator: define all three or none
                           (#error otherwise); distsgd_cl.h uses them too
     The implementation needs POSIX.1-2008 (clock_gettime, pthreads). Unless a
     feature macro is already set it defines _POSIX_C_SOURCE 200809L, which
     works only when distsgd.h is the first header of that file; otherwise
     compile it with -D_POSIX_C_SOURCE=200809L.

   ERRORS

     Every fallible call returns a dsgd_result: DSGD_OK (0) or a negative code.
     dsgd_result_string() names a code. The dsgd_ctx passed to (or owned by) the
     object that failed keeps a message saying what failed, where and why, read
     with dsgd_ctx_last_error(); a logger callback set in dsgd_ctx_desc also
     receives it. A strategy copies the failing replica's message (which names
     the replica) to its own context. Calls with nowhere to record return the
     code alone: a NULL object argument (dsgd_allreduce(NULL, ...)),
     dsgd_ctx_create, dsgd_dataset_gather. The library never calls exit() or
     abort() on bad input, and never sizes an allocation from an unchecked
     file header.

     Above each function, "Errors:" lists the codes it returns and when.
     "Backend errors" are those of the model's backend, recorded on the
     backend's context (DSGD_ERR_BACKEND, DSGD_ERR_OUT_OF_MEMORY, or
     DSGD_ERR_INVALID_ARGUMENT for a range outside a buffer). Getters that
     cannot fail say what they return for a NULL object or an index out of
     range.

   THREAD SAFETY

     distsgd.h has no global state (distsgd_cl.h adds one mutex), so many
     independent runs can share a process. The rules, which the "Thread
     safety:" line above each function applies:
       - A dsgd_ctx and everything created with it (backend, model, optimizer,
         communicator) is used by one thread at a time: "the context's thread"
         (or the model's, ...). Give each thread its own context. A logger is
         called on the thread that records the message. (A loopback hub is
         the exception: each of its endpoints is used by its rank's thread.)
       - Functions of their arguments alone (names of codes, dsgd_block_range,
         dsgd_lr_at, the RNG on your own state, dsgd_now) run on any thread.
         So do getters that read only what creation fixed (dsgd_comm_rank,
         dsgd_model_num_params, ...), while the object lives.
       - Datasets are read-only after loading and may be shared between
         threads; a sampler is used by one thread at a time.
       - Collectives: each rank's communicator (and transport endpoint) lives
         on that rank's thread, and all ranks call the same collectives
         concurrently. dsgd_loopback_abort and dsgd_loopback_aborted may be
         called from any thread while the hub exists.
       - A strategy is driven from one thread, the one that owns its ctx. It
         runs replica 0 on that thread and replicas 1..N-1 on threads of its
         own, each with its own context (and backend, model, optimizer and
         communicator), and returns only when they are done. The replicas'
         contexts share the strategy context's logger, so that logger may be
         called from several threads at once. Inside dsgd_strategy_run, fn
         runs on every replica's thread at once and uses that replica's
         objects (dsgd_replica_*), not the strategy's functions.
       - Gradient paths (see BACKENDS): on the HOST path each replica touches
         only its own gradient buffer. On the DEVICE path replica r's backend
         reads and writes block r of every replica's gradient buffer; the
         strategy orders this itself: each replica finishes its queue and
         enters a barrier, sums its block (sum_across) and finishes again, and
         a second barrier keeps every replica from using its gradient before
         all blocks are written.

   STRATEGIES

     dsgd_strategy_create(ctx, &desc, &s) builds N replicas (a model, an
     optimizer, a backend and, for N > 1, a communicator each) over a loopback
     transport; dsgd_strategy_train_step(s, x, y, count, &info) shards the
     global batch, computes gradients on every replica, agrees on finiteness,
     sums the flat gradient buffers (through the host or on the devices: see
     BACKENDS) and applies the same update everywhere, so the replicas stay
     bitwise identical, and N replicas x batch B with MEAN aggregation give the
     weights of one replica with batch N*B (up to float reassociation).
     dsgd_strategy_run(s, fn, user) runs your own function in replica context,
     where distributed variables (dsgd_strategy_create_variable) follow
     tf.VariableAggregation / tf.VariableSynchronization semantics.

     Failures: when one replica fails, the strategy aborts its transport at
     once, so the others return within milliseconds ("aborted because
     replica k failed"), and the call returns the failing replica's own
     error (dsgd_strategy_replica_result gives each replica's). A failure
     the replicas agreed on before the update (a bad label, a non-finite
     gradient under DSGD_NONFINITE_ERROR) changes nothing; any other failure
     (a collective, a timeout, a backend failing in the exchange or the
     update, any failed dsgd_strategy_run) may have left the replicas
     different, so the strategy fails: every later call that uses the
     replicas returns DSGD_ERR_STATE naming the step and the first error
     (dsgd_strategy_failed) until you destroy it and create a new one.

   BACKENDS

     A backend is a dsgd_backend_i: a table of compute operations on device
     buffers plus an implementation pointer. Models never touch memory
     directly, so the OpenCL backend (distsgd_cl.h) plugs in unchanged. The CPU
     reference backend, dsgd_cpu_backend_create(), is the one every other
     backend is tested against. Optional members may be NULL: destroy,
     buffer_host_ptr, finish, and those the strategies use to move gradients:
     map/unmap (a host view of a range, zero-copy where the device shares the
     host's memory), host_shared (whether it does), and can_access/sum_across
     (a sum computed on the device over other backends' buffers).

     A synchronous step sums the replicas' gradients along one of two paths,
     chosen by dsgd_strategy_desc.gradient_path and reported by
     dsgd_strategy_gradient_path():
       HOST    each replica exposes its gradient buffer to the host through
               buffer_host_ptr (the CPU backend), else map (zero-copy on CPUs
               and integrated GPUs, PoCL included), else a read into a staging
               copy that is written back afterwards; then dsgd_allreduce over
               the transport, with the strategy's algorithm and buckets.
       DEVICE  between two barriers, replica r sums block r (dsgd_block_range)
               of every replica's gradient buffer in rank order with its
               backend's sum_across and writes the sum into all of them; the
               gradients never reach the host. Every backend must reach every
               other's buffers (can_access: OpenCL backends of one
               dsgd_cl_context).
     AUTO, the default, picks DEVICE only when it is possible and some
     backend's buffers are not host-shared (a discrete GPU, where the HOST path
     would copy the gradient to the host and back every step). Where mapping
     copies nothing the host's all-reduce is as fast, so AUTO stays on HOST
     (measured on PoCL with bench/mirrored_cl). DEVICE adds in the order of the
     HOST path's DSGD_ALLREDUCE_DIRECT, and the two give the same bits
     (tests/test_cl_strategy.c).

   TRANSPORTS

     A transport is a dsgd_transport_i: one endpoint per rank, a table of
     functions plus an implementation pointer. The collectives need only
     `send` and `recv` of tagged byte buffers with an absolute deadline; every
     other member is optional and either speeds things up (sendrecv;
     sendrecv_reduce, which reduces from a peer's buffer in place; share and
     unshare, which let ranks in one address space use each other's buffers
     directly), replaces the library's algorithm (a native allreduce, as MPI
     would provide), supplies a clock (a simulated-clock transport) or
     improves error messages (error_message, set_progress/peer_progress). A
     new transport fills what it can and leaves the rest NULL; the
     collectives do not change. A strategy's step sends its gradients over
     the transport only on the HOST path; on the DEVICE path the transport
     carries the finiteness flag and the two barriers.

     The loopback transport connects N ranks in one process: one thread per
     rank (the caller's threads), in-process mailboxes per ordered pair of
     ranks, real time. Messages up to 64 KiB are copied into the mailbox so
     the sender does not wait (unless 8 messages to that receiver are still
     queued); larger ones are posted by pointer and the receiver copies (or
     reduces) straight from the sender's memory while the sender waits. It
     also provides share/unshare, so AUTO all-reduces on it run
     DSGD_ALLREDUCE_DIRECT. A waiting rank spins briefly (pausing, then
     yielding the CPU), then sleeps on a condition variable; see
     dsgd_loopback_set_spin.

   COLLECTIVES

     A dsgd_comm is one rank's view of a group: dsgd_comm_create(ctx,
     &endpoint, &desc, &comm) in each rank's thread, then every rank calls the
     same collectives in the same order with the same counts. Each call has a
     deadline (timeout_s, 0: the communicator's default; at most 1e7 s) and
     returns DSGD_ERR_TIMEOUT with a message naming the collective, its
     sequence number and the rank it waited for, e.g.
         "allreduce #17 (ring): rank 2 timed out waiting for rank 3 after 0.50 s"
     A communicator whose collective failed mid-way is unusable afterwards
     (DSGD_ERR_STATE): its peers may be anywhere in the protocol.

     Agreement: before a collective moves any data, the ranks check that
     they all called the same one: the same collective (kind and sequence
     number), count, op, root, algorithm and piece size. If any rank differs,
     every rank returns DSGD_ERR_DESYNC, at once rather than at the deadline,
     with a message naming two ranks and what they passed, e.g.
         "allreduce #9 (ring): rank 0: the ranks disagree on the collective:
          rank 2 passed count 999; rank 0 passed count 1000; no buffer was
          touched"
     No buffer is read or written, and the communicator stays usable (unless
     the ranks are in collectives of different numbers). So no collective
     returns DSGD_OK unless every rank agreed, and none touches memory
     outside the caller's count. Cost: DIRECT publishes the description
     beside the buffer it already shares (free); the message-passing
     algorithms and a native hook first run ceil(log2 N) rounds of 128-byte
     messages (a few microseconds on the loopback, see bench/allreduce.c).
     Ranks that call different all-reduce algorithms, one of them DIRECT,
     do not meet in the agreement: they time out instead.

     Determinism: each algorithm reduces every element in a fixed order that
     depends only on (algorithm, N, count), not on timing or the piece size,
     so the same inputs give the same bits every run. Every rank ends with
     bitwise identical buffers: each element is reduced by one rank and its
     bits are copied to the others, except in recursive doubling, where both
     partners of a step compute the same operation on the same operands in
     the same order. Different algorithms may differ in the last bits.
*/
#ifndef DISTSGD_H
#define DISTSGD_H

#define DISTSGD_VERSION_MAJOR 0
#define DISTSGD_VERSION_MINOR 1
#define DISTSGD_VERSION_PATCH 0
#define DISTSGD_VERSION_STRING "0.1.0"

/* The implementation needs POSIX.1-2008 (clock_gettime, pthreads). Under a
   strict -std=c99 the feature macro must precede the first system header, so
   it is set here; include distsgd.h before other headers in the file that
   defines DISTSGD_IMPLEMENTATION, or compile with -D_POSIX_C_SOURCE=200809L. */
#if defined(DISTSGD_IMPLEMENTATION) && !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && \
    !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif

#include <stddef.h>
#include <stdint.h>

#ifndef DSGD_API
#ifdef DISTSGD_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define DSGD_API static __attribute__((unused)) /* a program need not call every function */
#else
#define DSGD_API static
#endif
#else
#define DSGD_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- results */

/* X(name, value, description): one list makes the enum and its strings. */
#define DSGD__RESULT_LIST(X)                                                   \
    X(DSGD_OK, 0, "ok")                                                        \
    X(DSGD_ERR_INVALID_ARGUMENT, -1, "invalid argument")                       \
    X(DSGD_ERR_OUT_OF_MEMORY, -2, "out of memory")                             \
    X(DSGD_ERR_IO, -3, "input/output error")                                   \
    X(DSGD_ERR_FORMAT, -4, "malformed input file")                             \
    X(DSGD_ERR_SHAPE, -5, "shape mismatch")                                    \
    X(DSGD_ERR_NON_FINITE, -6, "non-finite value")                             \
    X(DSGD_ERR_TIMEOUT, -7, "deadline expired")                                \
    X(DSGD_ERR_BACKEND, -8, "backend failure")                                 \
    X(DSGD_ERR_UNSUPPORTED, -9, "unsupported operation")                       \
    X(DSGD_ERR_STATE, -10, "invalid state")                                   \
    X(DSGD_ERR_DESYNC, -11, "ranks disagree on a collective")

typedef enum dsgd_result {
#define DSGD__RESULT_ENUM(name, value, text) name = value,
    DSGD__RESULT_LIST(DSGD__RESULT_ENUM)
#undef DSGD__RESULT_ENUM
    DSGD__RESULT_LAST_ = -11
} dsgd_result;

/* The fixed description of a result code ("invalid argument"); "unknown
   result code" for any other value. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_result_string(dsgd_result r);

/* ---------------------------------------------------------------- context */

typedef enum dsgd_log_level {
    DSGD_LOG_ERROR = 0,
    DSGD_LOG_WARN = 1,
    DSGD_LOG_INFO = 2,
    DSGD_LOG_DEBUG = 3
} dsgd_log_level;

typedef struct dsgd_logger {
    /* Called with every error message the context records, and with warnings
       and information; NULL: no logging. May be called from the thread that
       uses the context. */
    void (*func)(void *user_data, dsgd_log_level level, const char *message);
    void *user_data;
} dsgd_logger;

typedef struct dsgd_ctx_desc {
    dsgd_logger logger;
    const char *label; /* prefixed to messages, e.g. "replica 2"; NULL: none */
} dsgd_ctx_desc;

typedef struct dsgd_ctx dsgd_ctx;

/* Creates a context. desc may be NULL (all defaults); the label is copied
   (up to 63 bytes).
   Errors: DSGD_ERR_INVALID_ARGUMENT (out NULL), DSGD_ERR_OUT_OF_MEMORY;
   nothing is recorded (there is no context yet).
   Thread safety: any thread; the context is then used by one thread at a time. */
DSGD_API dsgd_result dsgd_ctx_create(const dsgd_ctx_desc *desc, dsgd_ctx **out);
/* Frees ctx (NULL: nothing). Objects created with ctx keep a pointer to it:
   destroy them first.
   Thread safety: the context's thread. */
DSGD_API void dsgd_ctx_destroy(dsgd_ctx *ctx);
/* The message of the last error recorded on ctx ("" when none, or ctx NULL).
   The pointer points into ctx: its text changes with the next error recorded
   on ctx (or dsgd_ctx_clear_error), and it dies with ctx.
   Errors: none. Thread safety: the context's thread. */
DSGD_API const char *dsgd_ctx_last_error(const dsgd_ctx *ctx);
/* The result code of the last error recorded on ctx (DSGD_OK when none, or
   ctx NULL).
   Errors: none (it returns the recorded code). Thread safety: the context's
   thread. */
DSGD_API dsgd_result dsgd_ctx_last_result(const dsgd_ctx *ctx);
/* Forgets the last error: dsgd_ctx_last_result gives DSGD_OK and
   dsgd_ctx_last_error "" until the next one. ctx NULL: nothing.
   Thread safety: the context's thread. */
DSGD_API void dsgd_ctx_clear_error(dsgd_ctx *ctx);
/* Records an error on ctx (printf-style message, prefixed with the context's
   label and cut at 1023 bytes), passes it to the logger at DSGD_LOG_ERROR,
   and returns r. Backends and transports written outside this file use it
   too. ctx may be NULL: then only r is returned.
   Errors: none of its own: it returns r.
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_ctx_set_error(dsgd_ctx *ctx, dsgd_result r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Sends a message (printf-style, prefixed with the label) to the context's
   logger at `level`; nothing when ctx is NULL or has no logger. Records
   nothing. Thread safety: the context's thread. */
DSGD_API void dsgd_ctx_log(dsgd_ctx *ctx, dsgd_log_level level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---------------------------------------------------------------- backend */

typedef enum dsgd_activation {
    DSGD_ACT_NONE = 0,
    DSGD_ACT_RELU,
    DSGD_ACT_TANH,
    DSGD_ACT_SIGMOID
} dsgd_activation;

typedef enum dsgd_loss {
    DSGD_LOSS_SOFTMAX_XENT = 0, /* targets: one class index per sample (as float) */
    DSGD_LOSS_MSE               /* targets: one value per output */
} dsgd_loss;

typedef enum dsgd_optimizer_kind {
    DSGD_OPT_SGD = 0,
    DSGD_OPT_MOMENTUM,
    DSGD_OPT_ADAM,
    DSGD_OPT_ADAMW
} dsgd_optimizer_kind;

/* A backend-defined device buffer of floats. */
typedef struct dsgd_buffer dsgd_buffer;

/* A position in a device buffer: buf plus an offset counted in floats. */
typedef struct dsgd_ref {
    dsgd_buffer *buf;
    size_t off;
} dsgd_ref;

/* The scalars of one optimizer update, computed on the host each step. */
typedef struct dsgd_opt_update {
    dsgd_optimizer_kind kind;
    float lr;            /* learning rate of this step (schedule applied) */
    float momentum;      /* MOMENTUM: mu */
    int nesterov;        /* MOMENTUM: Nesterov's variant when non-zero */
    float beta1, beta2;  /* ADAM, ADAMW */
    float eps;           /* ADAM, ADAMW */
    float weight_decay;  /* SGD, MOMENTUM, ADAM: L2 added to the gradient;
                            ADAMW: decoupled, p -= lr * wd * p */
    float bias_correction1; /* ADAM, ADAMW: 1 - beta1^t */
    float bias_correction2; /* ADAM, ADAMW: 1 - beta2^t */
    float grad_scale;    /* every gradient is multiplied by this first (clipping) */
} dsgd_opt_update;

/* A compute backend. Row-major everywhere. All members but the optional
   ones must be set (dsgd_model_create checks). Each operation returns DSGD_OK
   or an error recorded on the context the backend was created with. An
   operation may be queued rather than done; `read` and `finish` complete all
   queued work. A backend is used by one thread at a time, its context's. */
typedef struct dsgd_backend_i {
    const char *name;
    void *impl;
    void (*destroy)(void *impl); /* optional */

    dsgd_result (*buffer_create)(void *impl, size_t count, dsgd_buffer **out);
    void (*buffer_destroy)(void *impl, dsgd_buffer *buf);
    /* optional: host pointer to the buffer's floats when the host can address
       them directly (the CPU backend); NULL otherwise. */
    float *(*buffer_host_ptr)(void *impl, dsgd_buffer *buf);

    dsgd_result (*write)(void *impl, dsgd_ref dst, const float *src, size_t count);
    dsgd_result (*read)(void *impl, dsgd_ref src, float *dst, size_t count);
    dsgd_result (*copy)(void *impl, dsgd_ref dst, dsgd_ref src, size_t count);
    dsgd_result (*fill)(void *impl, dsgd_ref dst, float value, size_t count);
    /* x *= alpha */
    dsgd_result (*scale)(void *impl, dsgd_ref x, float alpha, size_t n);
    /* y += alpha * x */
    dsgd_result (*axpy)(void *impl, dsgd_ref y, float alpha, dsgd_ref x, size_t n);

    /* C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C; op transposes when
       trans_* is non-zero; ld* are the row strides of the matrices as stored.
       beta == 0 overwrites C (NaN in C does not propagate). */
    dsgd_result (*gemm)(void *impl, int trans_a, int trans_b, int m, int n, int k,
                        float alpha, dsgd_ref a, int lda, dsgd_ref b, int ldb,
                        float beta, dsgd_ref c, int ldc);
    /* y(m,n) = act(y + bias) in place; bias(n) may have buf NULL (no bias). */
    dsgd_result (*bias_act_forward)(void *impl, dsgd_activation act, dsgd_ref y,
                                    dsgd_ref bias, int m, int n);
    /* dy(n) *= act'(.) in place, the derivative written in terms of the
       activation's output y(n): relu y>0, tanh 1-y^2, sigmoid y(1-y). */
    dsgd_result (*act_backward)(void *impl, dsgd_activation act, dsgd_ref dy,
                                dsgd_ref y, size_t n);
    /* db(n) = sum over rows of dy(m,n) */
    dsgd_result (*bias_backward)(void *impl, dsgd_ref db, dsgd_ref dy, int m, int n);
    /* Loss of pred(m,c) against target (m for SOFTMAX_XENT, (m,c) for MSE).
       stats[0] += sum of per-sample losses, stats[1] += correct predictions
       (argmax == class; for MSE argmax(pred) == argmax(target)).
       If dpred.buf is non-NULL: dpred(m,c) = grad_scale * d(sum of losses)/d pred.
       SOFTMAX_XENT per-sample loss: -log softmax(pred)[class].
       MSE per-sample loss: (1/c) * sum_j (pred_j - target_j)^2.
       A class index that is not an integer in [0, c) is
       DSGD_ERR_INVALID_ARGUMENT. */
    dsgd_result (*loss)(void *impl, dsgd_loss loss, int m, int c, dsgd_ref pred,
                        dsgd_ref target, float grad_scale, dsgd_ref dpred,
                        dsgd_ref stats);
    /* One optimizer update of n parameters (see dsgd_opt_update); m1, m2 are
       the optimizer's state (momentum; Adam's first and second moments) and
       may have buf NULL when the kind needs none. */
    dsgd_result (*optimizer_update)(void *impl, const dsgd_opt_update *u,
                                    dsgd_ref param, dsgd_ref grad, dsgd_ref m1,
                                    dsgd_ref m2, size_t n);
    /* *sumsq = sum of x^2 over the finite entries (double), *nonfinite = number
       of NaN and infinite entries. Either pointer may be NULL; with sumsq NULL
       a backend may take a faster path that only counts non-finite values. */
    dsgd_result (*norm_check)(void *impl, dsgd_ref x, size_t n, double *sumsq,
                              size_t *nonfinite);
    /* optional: wait until all queued operations are done. */
    dsgd_result (*finish)(void *impl);

    /* optional, both or neither: a host pointer to count floats at ref that
       the host may read and write until unmap (after queued work is done);
       zero-copy where the device shares memory with the host. No other
       operation may use the range while it is mapped. On the HOST gradient
       path the strategies all-reduce gradients in place through it (when
       buffer_host_ptr gives nothing) rather than through a read/write
       staging copy. */
    dsgd_result (*map)(void *impl, dsgd_ref ref, size_t count, float **out);
    dsgd_result (*unmap)(void *impl, dsgd_ref ref, float *ptr);
    /* optional: 1 when the buffers live in memory the host shares (map copies
       nothing: CPUs, integrated GPUs), 0 when they are the device's own
       (discrete GPUs: a host path costs two transfers per step). NULL: 0.
       Only DSGD_GRADIENTS_AUTO asks. */
    int (*host_shared)(void *impl);
    /* optional, both or neither: device-side reduction across replicas.
       can_access(impl, other) is 1 when this backend's operations can read
       and write the buffers of backend `other` directly (OpenCL backends of
       one context), 0 otherwise. sum_across sets, for every e in [lo, hi),
       x[j][e] = x[0][e] + x[1][e] + ... + x[n-1][e] (summed in that order)
       for every j, where x[j] is the range starting at refs[j]; every refs[j]
       must be on a backend this one can access, and no two may overlap. It
       only enqueues: the caller orders it against the other backends'
       work (finish, then a barrier). The DEVICE gradient path uses them. */
    int (*can_access)(void *impl, const struct dsgd_backend_i *other);
    dsgd_result (*sum_across)(void *impl, const dsgd_ref *refs, int n, size_t lo, size_t hi);
} dsgd_backend_i;

/* Fills *out with the CPU reference backend. Its operations record errors on
   ctx, which must outlive the backend; destroy with out->destroy(out->impl).
   Its buffers are host memory (buffer_host_ptr is set) and every operation
   is done when it returns, so finish, map, unmap, host_shared, can_access
   and sum_across are NULL (a strategy on it takes the HOST gradient path).
   Errors: DSGD_ERR_INVALID_ARGUMENT (out NULL), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread; the backend is then used by one
   thread at a time. */
DSGD_API dsgd_result dsgd_cpu_backend_create(dsgd_ctx *ctx, dsgd_backend_i *out);

/* ---------------------------------------------------------------- model */

typedef enum dsgd_init {
    DSGD_INIT_AUTO = 0,     /* He normal before ReLU, Glorot uniform otherwise */
    DSGD_INIT_HE_NORMAL,    /* N(0, 2/fan_in), He et al. 2015 */
    DSGD_INIT_HE_UNIFORM,   /* U(-sqrt(6/fan_in), +) */
    DSGD_INIT_GLOROT_UNIFORM, /* U(-sqrt(6/(fan_in+fan_out)), +), Glorot & Bengio 2010 */
    DSGD_INIT_GLOROT_NORMAL /* N(0, 2/(fan_in+fan_out)) */
} dsgd_init;

/* One dense layer, y = act(x W + b), W of shape (inputs, units). */
typedef struct dsgd_layer_desc {
    int units;
    dsgd_activation activation; /* default NONE */
    dsgd_init init;             /* default AUTO; biases start at zero */
} dsgd_layer_desc;

typedef struct dsgd_model_desc {
    int input_dim;
    const dsgd_layer_desc *layers;
    int num_layers;
    dsgd_loss loss;             /* default SOFTMAX_XENT */
    int max_batch;              /* largest batch passed to the model; default 256 */
    uint64_t seed;              /* initialisation seed (0 is a valid seed) */
    /* The backend to run on; NULL: a CPU backend owned by the model. The
       backend must outlive the model and have been created with the same ctx. */
    const dsgd_backend_i *backend;
} dsgd_model_desc;

#define DSGD_MAX_NAME 32
#define DSGD_MAX_RANK 2

/* A variable is a named view into the model's flat parameter buffer; its
   gradient sits at the same offset of the flat gradient buffer. */
typedef struct dsgd_variable {
    char name[DSGD_MAX_NAME]; /* "dense0/kernel", "dense0/bias", ... */
    size_t offset;            /* in floats, from the start of the flat buffer */
    size_t count;
    int rank;
    int shape[DSGD_MAX_RANK];
} dsgd_variable;

typedef enum dsgd_metrics_slot {
    DSGD_METRICS_TRAIN = 0, /* accumulated by dsgd_model_compute_gradients */
    DSGD_METRICS_EVAL = 1   /* accumulated by dsgd_model_eval_batch */
} dsgd_metrics_slot;

typedef struct dsgd_metrics {
    double loss_sum; /* sum of per-sample losses */
    double correct;  /* number of correct predictions */
    double count;    /* number of samples */
} dsgd_metrics;

typedef struct dsgd_model dsgd_model;

/* Creates a model: variables are laid out in layer order (kernel, then bias),
   initialised on the host from desc->seed and uploaded; gradients start at
   zero. With desc->backend NULL the model creates (and owns) a CPU backend.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out or desc NULL,
   input_dim <= 0, no layers, an unknown loss, negative max_batch, a layer
   with units <= 0 or an unknown activation or init, a final activation other
   than NONE with SOFTMAX_XENT, a backend lacking a required operation),
   DSGD_ERR_OUT_OF_MEMORY, backend errors (creating and filling its buffers).
   Thread safety: the context's thread; the model then belongs to it. */
DSGD_API dsgd_result dsgd_model_create(dsgd_ctx *ctx, const dsgd_model_desc *desc,
                                       dsgd_model **out);
/* Frees the model's buffers, and its backend when the model created it;
   m NULL: nothing. Destroy its optimizers first.
   Thread safety: the model's thread. */
DSGD_API void dsgd_model_destroy(dsgd_model *m);

/* Getters. With m NULL they return NULL, 0, or a ref whose buf is NULL.
     dsgd_model_ctx            the context the model records errors on
     dsgd_model_backend        the model's backend table (m's own copy)
     dsgd_model_num_params     floats in the parameter (and gradient) buffer
     dsgd_model_num_variables  2 per layer
     dsgd_model_variable       the i-th variable ("dense0/kernel",
                               "dense0/bias", ...); NULL when i is out of range
     dsgd_model_input_dim, dsgd_model_output_dim
     dsgd_model_target_dim     floats per sample in a target array: 1 for
                               SOFTMAX_XENT, output_dim for MSE
     dsgd_model_params, dsgd_model_grads
                               the device buffers holding all parameters and
                               all gradients (offset 0)
   Errors: none. Thread safety: any thread while m lives (they read what
   creation fixed; what the refs point at is the model thread's). */
DSGD_API dsgd_ctx *dsgd_model_ctx(const dsgd_model *m);
DSGD_API const dsgd_backend_i *dsgd_model_backend(const dsgd_model *m);
DSGD_API size_t dsgd_model_num_params(const dsgd_model *m);
DSGD_API int dsgd_model_num_variables(const dsgd_model *m);
DSGD_API const dsgd_variable *dsgd_model_variable(const dsgd_model *m, int i);
DSGD_API int dsgd_model_input_dim(const dsgd_model *m);
DSGD_API int dsgd_model_output_dim(const dsgd_model *m);
DSGD_API int dsgd_model_target_dim(const dsgd_model *m);
DSGD_API dsgd_ref dsgd_model_params(const dsgd_model *m);
DSGD_API dsgd_ref dsgd_model_grads(const dsgd_model *m);

/* Copy all parameters (or gradients) between the model and host memory;
   count must equal dsgd_model_num_params(). The get functions wait for
   queued work.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; the host
   pointer NULL), DSGD_ERR_SHAPE (count), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_get_params(dsgd_model *m, float *dst, size_t count);
DSGD_API dsgd_result dsgd_model_set_params(dsgd_model *m, const float *src, size_t count);
DSGD_API dsgd_result dsgd_model_get_grads(dsgd_model *m, float *dst, size_t count);

/* Forward and backward pass on one batch, x (count, input_dim) and y (count,
   target_dim) in host memory. The gradient buffer is overwritten with
   grad_scale * d(sum of per-sample losses)/d params: pass 1/count for the
   batch mean, 1/global_count when batches are split across replicas. The
   batch's loss and accuracy accumulate in the TRAIN metrics slot.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; x or y NULL;
   count outside 1..max_batch; a class index out of range, found by the
   backend's loss), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_compute_gradients(dsgd_model *m, const float *x,
                                                  const float *y, int count,
                                                  float grad_scale);
/* Forward pass only; the loss and accuracy accumulate in the EVAL slot. y may
   be NULL (no metrics; use dsgd_model_read_output for predictions).
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; x NULL; count
   outside 1..max_batch; a class index out of range), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_eval_batch(dsgd_model *m, const float *x,
                                           const float *y, int count);
/* Copies the first count rows of the last forward pass's outputs (count,
   output_dim), before softmax.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; dst NULL;
   count outside 1..the last pass's batch, or no pass yet), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_read_output(dsgd_model *m, float *dst, int count);
/* Reads a metrics slot and resets it to zero.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; out NULL;
   an unknown slot), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_take_metrics(dsgd_model *m, dsgd_metrics_slot slot,
                                             dsgd_metrics *out);

/* ---------------------------------------------------------------- optimizers */

typedef enum dsgd_schedule_kind {
    DSGD_SCHEDULE_CONSTANT = 0, /* lr after warmup */
    DSGD_SCHEDULE_COSINE,       /* cosine from lr to final_lr at total_steps */
    DSGD_SCHEDULE_STEP          /* lr * gamma^floor((t - warmup) / step_size) */
} dsgd_schedule_kind;

/* Learning rate at step t (0-based): during the first warmup_steps steps it
   rises linearly from warmup_start_lr to lr (Goyal et al. 2017, gradual
   warmup); then it follows the kind. */
typedef struct dsgd_lr_schedule {
    dsgd_schedule_kind kind;
    int64_t warmup_steps;     /* default 0: no warmup */
    float warmup_start_lr;    /* default 0 */
    int64_t total_steps;      /* COSINE: the step at which final_lr is reached */
    float final_lr;           /* COSINE: default 0 */
    int64_t step_size;        /* STEP: steps between decays (must be > 0) */
    float gamma;              /* STEP: factor per decay (default 0.1) */
} dsgd_lr_schedule;

typedef struct dsgd_optimizer_desc {
    dsgd_optimizer_kind kind; /* default SGD */
    float lr;                 /* peak learning rate; default 0.01 */
    float momentum;           /* MOMENTUM: default 0.9 */
    int nesterov;             /* MOMENTUM */
    float beta1;              /* ADAM(W): default 0.9 */
    float beta2;              /* ADAM(W): default 0.999 */
    float eps;                /* ADAM(W): default 1e-8 */
    float weight_decay;       /* default 0; see dsgd_opt_update */
    float clip_norm;          /* > 0: clip gradients to this global L2 norm */
    dsgd_lr_schedule schedule;
} dsgd_optimizer_desc;

typedef struct dsgd_optimizer dsgd_optimizer;

/* Creates an optimizer for m with desc's zero fields set to their defaults;
   its state (MOMENTUM: one buffer, ADAM and ADAMW: two, SGD: none) lives on
   m's backend, zeroed.
   Errors (recorded on m's ctx): DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing
   recorded; desc or out NULL; an unknown kind; lr <= 0 or not finite;
   negative weight_decay or clip_norm; momentum, beta1 or beta2 outside
   [0, 1); eps <= 0; a bad schedule: unknown kind, negative warmup_steps,
   STEP with step_size <= 0, COSINE with total_steps <= warmup_steps),
   DSGD_ERR_OUT_OF_MEMORY, backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_optimizer_create(dsgd_model *m, const dsgd_optimizer_desc *desc,
                                           dsgd_optimizer **out);
/* Frees the optimizer's state through its model's backend, so destroy it
   before the model; opt NULL: nothing.
   Thread safety: the model's thread. */
DSGD_API void dsgd_optimizer_destroy(dsgd_optimizer *opt);
/* Applies one update from the model's gradient buffer: clipping (if set), then
   the optimizer's rule with the scheduled learning rate; advances the step.
   Without clipping the gradient is not checked for NaN or infinity.
   Errors: DSGD_ERR_INVALID_ARGUMENT (opt NULL, nothing recorded),
   DSGD_ERR_NON_FINITE when clipping is on and the gradient holds NaN or
   infinity (nothing is updated), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_optimizer_step(dsgd_optimizer *opt);
/* dsgd_optimizer_steps: the number of steps applied so far.
   dsgd_optimizer_last_grad_norm: the global L2 norm of the gradient at the
   last step with clipping on (clip_norm > 0), scaled or not; 0 before, or
   without clipping.
   Errors: none (opt NULL: 0). Thread safety: the model's thread (a step
   changes them). */
DSGD_API int64_t dsgd_optimizer_steps(const dsgd_optimizer *opt);
DSGD_API double dsgd_optimizer_last_grad_norm(const dsgd_optimizer *opt);
/* The optimizer's state, read-only (what a checkpoint saves besides the
   parameters and dsgd_optimizer_steps): its slots, one float per parameter
   each, in the order of the model's flat parameter buffer.
     SGD       no slot
     MOMENTUM  slot 0 "momentum": the velocity v, v = momentum * v + g
     ADAM(W)   slot 0 "m": the first moment, m = beta1 * m + (1 - beta1) g;
               slot 1 "v": the second moment, v = beta2 * v + (1 - beta2) g^2
               (both without bias correction; g includes weight decay for
               ADAM, not for ADAMW)
   dsgd_optimizer_num_slots: their number (opt NULL: 0).
   dsgd_optimizer_slot_name: slot's name, NULL for a slot that does not
   exist (or opt NULL).
   dsgd_optimizer_read_slot: copies count floats of slot `slot` from
   parameter index `offset` to host memory (waits for queued work).
   Errors: dsgd_optimizer_read_slot: DSGD_ERR_INVALID_ARGUMENT (opt NULL,
   nothing recorded; dst NULL with count > 0; no such slot), DSGD_ERR_SHAPE
   (offset + count beyond the parameter count), backend errors. The others:
   none.
   Thread safety: the model's thread. */
DSGD_API int dsgd_optimizer_num_slots(const dsgd_optimizer *opt);
DSGD_API const char *dsgd_optimizer_slot_name(const dsgd_optimizer *opt, int slot);
DSGD_API dsgd_result dsgd_optimizer_read_slot(dsgd_optimizer *opt, int slot, size_t offset, size_t count,
                                              float *dst);
/* The learning rate the schedule gives at step t (t < 0 counts as 0), peak
   lr `lr`; s NULL: lr. A STEP schedule with step_size <= 0 gives lr.
   Errors: none. Thread safety: any thread. */
DSGD_API float dsgd_lr_at(const dsgd_lr_schedule *s, float lr, int64_t t);
/* The linear scaling rule (Goyal et al. 2017): base_lr * global_batch /
   base_batch; base_batch <= 0: base_lr.
   Errors: none. Thread safety: any thread. */
DSGD_API float dsgd_linear_scaled_lr(float base_lr, int global_batch, int base_batch);

/* ---------------------------------------------------------------- data */

/* An in-memory dataset. Row i of x is sample i (dim floats); row i of y is its
   target (target_dim floats; a class index stored as float when num_classes > 0). */
typedef struct dsgd_dataset {
    float *x;
    float *y;
    size_t n;
    int dim;
    int target_dim;
    int num_classes; /* 0 for regression targets */
} dsgd_dataset;

/* Loads an IDX image file (magic 0x00000803, unsigned bytes) and its IDX label
   file (0x00000801) as MNIST and Fashion-MNIST ship them, uncompressed. Pixels
   are scaled to [0, 1]; y holds the labels (target_dim 1). num_classes: 0
   means 10. On failure *out is left empty (all zero).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out or a path NULL,
   num_classes outside 0..256), DSGD_ERR_IO (cannot open, not a regular file
   (a FIFO or a device fails at once, never blocks), a failed read), DSGD_ERR_FORMAT (every malformed input: magic, dimensions,
   sizes that disagree with the file's, image and label counts that differ,
   no images, more than 2^24 pixels an image, a label >= num_classes), with
   a message naming the file, the byte offset or sample, and what is wrong;
   DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_dataset_load_idx(dsgd_ctx *ctx, const char *images_path,
                                           const char *labels_path, int num_classes,
                                           dsgd_dataset *out);

typedef struct dsgd_csv_desc {
    int label_column;    /* 1-based column holding the class label; 0: the last */
    int num_classes;     /* labels must be integers in [0, num_classes);
                            0: num_classes = largest label + 1 */
    int header_lines;    /* lines to skip at the top; default 0 */
    float feature_scale; /* features are multiplied by this; 0: 1; finite, >= 0 */
} dsgd_csv_desc;

/* Loads a comma-separated file of numbers, one sample per line, all lines with
   the same number of fields (2 or more); blank lines are skipped. desc may be
   NULL (defaults). On failure *out is left empty (all zero).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out or path NULL, a
   negative field in desc, a NaN or infinite feature_scale), DSGD_ERR_IO
   (cannot open or read, not a regular file: a FIFO or a device fails at once,
   never blocks), DSGD_ERR_FORMAT with file, line and column (a field that is
   not a finite number, a feature that is not finite as a float once scaled,
   such as 1e300 or -3.5e38, a ragged line, a NUL byte, fewer than 2 fields,
   a label column beyond the fields, a label that is not an integer in
   [0, num_classes), no data lines),
   DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_dataset_load_csv(dsgd_ctx *ctx, const char *path,
                                           const dsgd_csv_desc *desc, dsgd_dataset *out);
/* Allocates a dataset of n samples (n may be 0), x (n, dim) and y (n,
   target_dim) zeroed. On failure *out is left empty (all zero).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out NULL, dim or
   target_dim <= 0, num_classes < 0), DSGD_ERR_OUT_OF_MEMORY (also when the
   sizes overflow size_t).
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_dataset_alloc(dsgd_ctx *ctx, size_t n, int dim, int target_dim,
                                        int num_classes, dsgd_dataset *out);
/* Frees a dataset's arrays and zeroes *ds; ds NULL: nothing.
   Thread safety: any thread, once no other thread uses ds. */
DSGD_API void dsgd_dataset_free(dsgd_dataset *ds);
/* Shuffles src's samples by seed and splits them: the first `first` go to a,
   the rest to b (both newly allocated; free them with dsgd_dataset_free).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (a NULL argument, src
   without data, first > n), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread; other threads may read src. */
DSGD_API dsgd_result dsgd_dataset_split(dsgd_ctx *ctx, const dsgd_dataset *src, size_t first,
                                        uint64_t seed, dsgd_dataset *a, dsgd_dataset *b);
/* Copies the samples idx[0..count) into x (count, dim) and y (count, target_dim).
   Errors: DSGD_ERR_INVALID_ARGUMENT (NULL, an index >= n; nothing copied).
   It records no message (it has no context). Thread safety: any thread. */
DSGD_API dsgd_result dsgd_dataset_gather(const dsgd_dataset *ds, const size_t *idx, size_t count,
                                  float *x, float *y);

/* Deterministic epoch order and fixed-size batches. */
typedef struct dsgd_sampler {
    size_t n;          /* samples */
    size_t batch;      /* batch size */
    uint64_t seed;
    int drop_last;     /* non-zero: the last partial batch is skipped */
    int shuffle;       /* non-zero: a new permutation every epoch */
    uint64_t epoch;
    size_t *order;     /* the epoch's permutation of 0..n-1 */
} dsgd_sampler;

/* Prepares a sampler and sets epoch 0. The permutation of epoch e depends only
   on (seed, e) (the identity when shuffle is 0). Free it with
   dsgd_sampler_free.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (s NULL, or there would
   be no batch: n == 0, batch == 0, or drop_last with batch > n),
   DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread; the sampler is then used by one
   thread at a time. */
DSGD_API dsgd_result dsgd_sampler_init(dsgd_ctx *ctx, dsgd_sampler *s, size_t n, size_t batch,
                                       uint64_t seed, int shuffle, int drop_last);
/* dsgd_sampler_free: frees the permutation and zeroes *s.
   dsgd_sampler_set_epoch: computes epoch `epoch`'s permutation.
   dsgd_sampler_num_batches: batches per epoch (the last one partial unless
   drop_last).
   dsgd_sampler_batch: sets *idx (if idx is not NULL) to the indices of batch
   b of the current epoch, valid until the next set_epoch or free, and
   returns their count; 0 when b is out of range.
   Errors: none (s NULL or not initialised: nothing, or 0).
   Thread safety: one thread at a time per sampler. */
DSGD_API void dsgd_sampler_free(dsgd_sampler *s);
DSGD_API void dsgd_sampler_set_epoch(dsgd_sampler *s, uint64_t epoch);
DSGD_API size_t dsgd_sampler_num_batches(const dsgd_sampler *s);
DSGD_API size_t dsgd_sampler_batch(const dsgd_sampler *s, size_t b, const size_t **idx);

/* ---------------------------------------------------------------- utilities */

/* dsgd_rng_next: SplitMix64 (Steele et al. 2014), the library's only random
   number source: advances *state and returns the next 64 bits.
   dsgd_rng_uniform: a double uniform in [0, 1) (53 bits) from the same stream.
   dsgd_now: CLOCK_MONOTONIC in seconds.
   Errors: none. Thread safety: any thread (the state is the caller's). */
DSGD_API uint64_t dsgd_rng_next(uint64_t *state);
DSGD_API double dsgd_rng_uniform(uint64_t *state);
DSGD_API double dsgd_now(void);

#ifdef __cplusplus
}
#endif

/* ======================================================================== */
/*                        TRANSPORTS AND COLLECTIVES                        */
/* ======================================================================== */
#ifndef DSGD__COLLECTIVES_DECL
#define DSGD__COLLECTIVES_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- transport */

typedef enum dsgd_reduce_op {
    DSGD_REDUCE_SUM = 0,
    DSGD_REDUCE_MEAN, /* the sum divided by N (a true division, by the rank that owns the element) */
    DSGD_REDUCE_MAX,  /* NaN-propagating: a NaN in any input gives NaN */
    DSGD_REDUCE_MIN   /* NaN-propagating */
} dsgd_reduce_op;

/* One rank's endpoint of a transport. Fill it with memset(0) first so that
   optional members added in later versions stay NULL.

   Deadlines are absolute times in seconds on the transport's clock: now() when
   set, dsgd_now() otherwise. A transport must deliver the messages of one
   ordered pair (src, dst) in the order they were sent; tags let the receiver
   check that the message is the one it expects (a transport may check only
   part of the tag). Every blocking function returns DSGD_ERR_TIMEOUT once the
   deadline has passed, and never hangs.

   Result codes of the transfer functions: DSGD_OK; DSGD_ERR_TIMEOUT; DSGD_ERR_SHAPE
   (the message has another size than the receiver expects); DSGD_ERR_STATE
   (the transport was aborted, the tag does not match, the peer gave up on a
   message); DSGD_ERR_OUT_OF_MEMORY; DSGD_ERR_INVALID_ARGUMENT (a peer outside
   the group, or this rank itself). They record nothing on any dsgd_ctx: the
   communicator turns them into messages (with error_message's text if set).

   Thread safety: an endpoint is used by one thread at a time. */
typedef struct dsgd_transport_i {
    const char *name; /* "loopback", "mpi", ... */
    void *impl;       /* passed to every function */
    int rank;         /* this endpoint's rank, 0 <= rank < size */
    int size;         /* number of ranks, >= 1 */
    /* optional: releases the endpoint. The communicator never calls it; the
       owner of the endpoint does. */
    void (*destroy)(void *impl);

    /* Sends `bytes` bytes to rank dst. Returns when buf may be reused (the
       message is buffered or has been received). */
    dsgd_result (*send)(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes,
                        double deadline);
    /* Receives exactly `bytes` bytes from rank src into buf. */
    dsgd_result (*recv)(void *impl, int src, uint64_t tag, void *buf, size_t bytes,
                        double deadline);

    /* optional: a send to dst and a receive from src that progress together,
       so that two ranks may exchange large messages without deadlock. dst or
       src may be -1 (that half is skipped). On failure *failed_peer is set to
       the rank the call was waiting for. NULL: the communicator orders a send
       and a recv so that its patterns (rings, pairs) cannot deadlock, at the
       cost of serialising them. */
    dsgd_result (*sendrecv)(void *impl, int dst, uint64_t stag, const void *sbuf,
                            size_t sbytes, int src, uint64_t rtag, void *rbuf,
                            size_t rbytes, double deadline, int *failed_peer);
    /* optional zero-copy hook: as sendrecv, but the rcount received floats are
       combined into rbuf, rbuf[i] = op(rbuf[i], received[i]) with op SUM, MAX
       or MIN (MEAN counts as SUM), reading the peer's memory in place where the
       transport can, without a temporary copy. sbuf and rbuf must not overlap.
       NULL: the communicator receives into scratch memory and reduces. */
    dsgd_result (*sendrecv_reduce)(void *impl, int dst, uint64_t stag, const void *sbuf,
                                   size_t sbytes, int src, uint64_t rtag, float *rbuf,
                                   size_t rcount, dsgd_reduce_op op, double deadline,
                                   int *failed_peer);

    /* optional shared-memory hooks, for ranks that share an address space
       (the loopback; an MPI transport leaves them NULL). share publishes
       buf and returns once every rank has published a buffer with the same
       tag, with peers[k] = rank k's buffer (peers[rank] = buf); the caller
       may then read and write the peers' buffers until it calls unshare.
       unshare declares that this rank is done with the peers' buffers and
       returns once every peer is done with this rank's, so buf may be
       reused. On failure (DSGD_ERR_TIMEOUT, DSGD_ERR_STATE) either call
       withdraws buf and does not return while a peer may still touch it;
       *failed_peer is the rank waited for, or -1 when unknown. The direct
       all-reduce needs both. */
    dsgd_result (*share)(void *impl, uint64_t tag, void *buf, void **peers, double deadline,
                         int *failed_peer);
    dsgd_result (*unshare)(void *impl, uint64_t tag, double deadline, int *failed_peer);

    /* optional native collective: in-place all-reduce of count floats over all
       ranks (an MPI transport maps it to MPI_Allreduce; for MEAN it sums
       and divides by size, for MAX/MIN it must propagate NaN). When set,
       dsgd_allreduce with DSGD_ALLREDUCE_AUTO uses it instead of the library's
       algorithms; an explicit algorithm still runs the library's. */
    dsgd_result (*allreduce)(void *impl, float *buf, size_t count, dsgd_reduce_op op,
                             double deadline);

    /* optional clock in seconds (a simulated-clock transport); NULL: dsgd_now(). */
    double (*now)(void *impl);

    /* optional diagnostics. error_message: text describing the last failure of
       this endpoint ("" when none). set_progress: the communicator announces
       that this rank has entered collective number seq. peer_progress: the
       last seq announced by rank peer (0: none yet). With both progress hooks
       a timeout message also names the ranks that never entered the
       collective, which need not be the neighbour that was waited for. */
    const char *(*error_message)(void *impl);
    void (*set_progress)(void *impl, uint64_t seq);
    uint64_t (*peer_progress)(void *impl, int peer);
} dsgd_transport_i;

/* ---------------------------------------------------------------- loopback */

typedef struct dsgd_loopback dsgd_loopback;

/* Creates a loopback hub for n ranks. ctx receives the errors of create and
   endpoint and must outlive the hub.
   Errors: DSGD_ERR_INVALID_ARGUMENT (ctx or out NULL, nothing recorded when
   ctx is; n outside 1..4096), DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_STATE (a
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
   DSGD_ERR_STATE promptly. Use it when one replica fails so that the others
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

/* ---------------------------------------------------------------- collectives */

typedef enum dsgd_allreduce_algo {
    /* AUTO picks, for a message of S bytes on N ranks (dsgd_allreduce_choose
       tells which; measured with bench/allreduce.c on a 2-vCPU machine):
         N == 1                  nothing to exchange
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
         otherwise               RING: bandwidth-optimal, pipelined in pieces */
    DSGD_ALLREDUCE_AUTO = 0,
    /* reduce-scatter then all-gather around the ring, 2(N-1) steps, each rank
       sending 2(N-1)/N of the buffer. Element e in block b (dsgd_block_range)
       is summed in ring order starting from rank b+1 and ending at rank b. */
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
    /* ranks in one address space (a transport with share/unshare, such as
       the loopback): each rank sums its block (dsgd_block_range) straight
       from every rank's buffer, in rank order 0..N-1, and writes the result
       into every buffer. Each element is read and written once per rank
       (2 N S bytes in all, the minimum) with no step-by-step handshakes.
       DSGD_ERR_UNSUPPORTED without the hooks. */
    DSGD_ALLREDUCE_DIRECT
} dsgd_allreduce_algo;

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

typedef struct dsgd_comm_desc {
    double timeout_s;   /* default deadline of each collective in seconds; 0: 30;
                           at most 1e7 */
    size_t piece_bytes; /* large buffers are processed in pieces of this size so
                           that a step's working set stays in cache; 0: 256 KiB;
                           clamped to 256 B..1 GiB. Must be equal on all ranks
                           (checked: DSGD_ERR_DESYNC otherwise); the results do
                           not depend on it. */
} dsgd_comm_desc;

typedef struct dsgd_comm dsgd_comm;

/* Creates rank transport->rank's communicator over the endpoint (the table
   is copied; its impl must stay valid until dsgd_comm_destroy). desc may be
   NULL (defaults).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing
   recorded; transport or out NULL; size < 1; rank outside [0, size); send or
   recv missing; a negative or NaN timeout), DSGD_ERR_OUT_OF_MEMORY.
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
   DSGD_ERR_STATE (transport aborted, messages out of step, communicator
   broken by an earlier failure),
   DSGD_ERR_SHAPE, DSGD_ERR_OUT_OF_MEMORY, or whatever a native allreduce
   hook returns. A failure in the exchange (all but the argument checks and
   DSGD_ERR_UNSUPPORTED) breaks the communicator: later collectives return
   DSGD_ERR_STATE.
   Thread safety: the communicator's thread; all ranks call concurrently. */
DSGD_API dsgd_result dsgd_allreduce(dsgd_comm *comm, float *buf, size_t count,
                                    dsgd_reduce_op op, dsgd_allreduce_algo algo,
                                    double timeout_s);
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
/* Broadcast of root's buf[0..count) to every rank (binomial tree, pipelined
   in pieces); every rank passes the same root (a different root on some
   rank is DSGD_ERR_DESYNC on every rank).
   Errors: as dsgd_allgather, and DSGD_ERR_INVALID_ARGUMENT for root outside
   [0, size).
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_broadcast(dsgd_comm *comm, float *buf, size_t count, int root,
                                    double timeout_s);
/* Returns once every rank has entered the barrier: the agreement alone
   (dissemination, ceil(log2 N) rounds of 128-byte messages). A rank in
   another collective makes it DSGD_ERR_DESYNC on every rank.
   Errors: as dsgd_allgather (no buffer).
   Thread safety: as dsgd_allreduce. */
DSGD_API dsgd_result dsgd_barrier(dsgd_comm *comm, double timeout_s);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__COLLECTIVES_DECL */

/* ======================================================================== */
/*                   STRATEGIES AND DISTRIBUTED VARIABLES                   */
/* ======================================================================== */
#ifndef DSGD__STRATEGY_DECL
#define DSGD__STRATEGY_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- variables */

/* How the replicas' values of a variable combine. For variables created
   with dsgd_strategy_create_variable and written in replica context this is
   tf.VariableAggregation's meaning. For model variables it says how the
   gradients combine (dsgd_strategy_set_aggregation), which is ours: Keras
   ignores a variable's aggregation there. */
typedef enum dsgd_aggregation {
    DSGD_AGG_NONE = 0,
    DSGD_AGG_SUM = 1,
    DSGD_AGG_MEAN = 2,
    DSGD_AGG_ONLY_FIRST_REPLICA = 3
} dsgd_aggregation;

/* When the replicas' copies of a variable are synchronised
   (tf.VariableSynchronization). */
typedef enum dsgd_synchronization {
    DSGD_SYNC_AUTO = 0,     /* ON_WRITE under every strategy here */
    DSGD_SYNC_NONE = 1,     /* rejected, as tf.distribute rejects it under a strategy */
    DSGD_SYNC_ON_WRITE = 2, /* mirrored: every write is aggregated and applied to all copies */
    DSGD_SYNC_ON_READ = 3   /* each replica writes its own copy; reads from the strategy aggregate */
} dsgd_synchronization;

/* "SUM", "ON_READ", ...; "?" for other values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_aggregation_name(dsgd_aggregation a);
DSGD_API const char *dsgd_synchronization_name(dsgd_synchronization s);

/* ---------------------------------------------------------------- strategies */

typedef enum dsgd_strategy_kind {
    DSGD_STRATEGY_ONE_DEVICE = 0, /* one replica on the calling thread, no transport */
    DSGD_STRATEGY_MIRRORED = 1    /* N replicas, one thread each, gradients summed in
                                     lockstep (see dsgd_gradient_path) */
} dsgd_strategy_kind;

/* What a training step does when a gradient holds NaN or infinity on any
   replica. Every replica checks its own gradient before the exchange and
   the replicas agree through a MAX all-reduce of a flag, so all of them do
   the same thing. */
typedef enum dsgd_nonfinite_policy {
    DSGD_NONFINITE_SKIP = 0, /* every replica skips the update (weights and
                                optimizer state unchanged); the step reports
                                skipped = 1 and returns DSGD_OK */
    DSGD_NONFINITE_ERROR = 1 /* every replica returns DSGD_ERR_NON_FINITE */
} dsgd_nonfinite_policy;

/* How a synchronous step's gradients are summed across replicas (see
   BACKENDS at the top of this file). */
typedef enum dsgd_gradient_path {
    DSGD_GRADIENTS_AUTO = 0, /* DEVICE when every replica's backend can reach
                                every other's buffers (OpenCL backends on one
                                context) and some backend's buffers are not in
                                host-shared memory (a discrete GPU), else HOST:
                                where mapping copies nothing the host's
                                all-reduce is as fast (measured on PoCL:
                                bench/mirrored_cl) */
    DSGD_GRADIENTS_HOST,     /* through host memory and the transport: each
                                replica uses its gradient buffer's host pointer
                                (CPU backend), or maps it (zero-copy on devices
                                that share memory), or else copies it to a host
                                staging buffer and back; then dsgd_allreduce
                                with the strategy's algorithm and buckets */
    DSGD_GRADIENTS_DEVICE    /* on the devices, with no host copy: after a
                                barrier, replica r sums block r (see
                                dsgd_block_range) of every replica's gradient
                                buffer in rank order and writes the sum to all
                                of them (backend sum_across; 2*N*S bytes moved
                                for S bytes of gradient in all), then a second
                                barrier. algorithm and bucket_bytes are unused.
                                Gives the bits of HOST with the DIRECT
                                algorithm. dsgd_strategy_create fails with
                                DSGD_ERR_INVALID_ARGUMENT when the backends
                                cannot do it (with one replica nothing is
                                exchanged and the path resolves to HOST) */
} dsgd_gradient_path;

/* Creates replica `replica`'s backend in *out, recording errors on ctx (the
   replica's context, which outlives the backend). Called by
   dsgd_strategy_create on its thread, for replicas 0..N-1 in order; the
   strategy destroys each backend with its destroy member. A result other
   than DSGD_OK makes dsgd_strategy_create fail with it. */
typedef dsgd_result (*dsgd_backend_factory)(void *user_data, dsgd_ctx *ctx, int replica,
                                            dsgd_backend_i *out);

typedef struct dsgd_strategy_desc {
    dsgd_strategy_kind kind;        /* default ONE_DEVICE */
    int num_replicas;               /* MIRRORED: default 1; ONE_DEVICE: 0 or 1 */
    dsgd_model_desc model;          /* every replica's model; max_batch is per replica;
                                       model.backend is ignored (see backend_factory) */
    dsgd_optimizer_desc optimizer;  /* every replica's optimizer */
    dsgd_allreduce_algo algorithm;  /* gradient all-reduce (HOST path); default AUTO */
    size_t bucket_bytes;            /* HOST path: all-reduce the gradient in buckets of
                                       this many bytes; 0: one bucket (the whole flat
                                       buffer) */
    size_t piece_bytes;             /* every replica's communicator pipelines its
                                       collectives in pieces of this many bytes
                                       (dsgd_comm_desc.piece_bytes): 0: the default,
                                       256 KiB; any other value is clamped to
                                       256 B..1 GiB, never rejected. The same on
                                       every replica, and the weights do not depend
                                       on it (only the speed does) */
    dsgd_nonfinite_policy nonfinite; /* default SKIP */
    double timeout_s;               /* deadline of every collective; default 30 s */
    dsgd_backend_factory backend_factory; /* NULL: a CPU backend per replica */
    void *backend_user_data;
    dsgd_gradient_path gradient_path; /* default AUTO */
} dsgd_strategy_desc;

/* What one training step did. */
typedef struct dsgd_step_info {
    int64_t step;      /* optimizer steps applied before this one */
    int count;         /* samples in the global batch */
    int skipped;       /* 1 when the update was skipped (non-finite gradient) */
    float lr;          /* learning rate the step used */
} dsgd_step_info;

typedef struct dsgd_strategy dsgd_strategy;
/* A replica as seen from inside dsgd_strategy_run (replica context). */
typedef struct dsgd_replica dsgd_replica;
typedef dsgd_result (*dsgd_replica_fn)(dsgd_replica *replica, void *user_data);

/* Creates a strategy: N replicas, each with its own context (labelled
   "replica r", with ctx's logger), backend, model, optimizer and, for N > 1,
   communicator over one loopback hub, and N - 1 threads that run replicas
   1..N-1. All replicas start from the same weights (desc->model.seed). The
   gradient path is resolved here (dsgd_strategy_gradient_path).
   Errors (recorded on ctx; a replica's failure is copied from its context):
   DSGD_ERR_INVALID_ARGUMENT (out or desc NULL; an unknown kind, non-finite
   policy, algorithm or gradient path; num_replicas < 0 or > 256; ONE_DEVICE
   with more than one replica; a negative or NaN timeout; a bad model or
   optimizer desc; gradient_path DEVICE with several replicas when a backend
   lacks sum_across or cannot reach another's buffers),
   DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_STATE (a pthread object or thread could
   not be created), backend errors and whatever backend_factory returns.
   Thread safety: the context's thread, which then drives the strategy:
   every dsgd_strategy_* function is called from it. */
DSGD_API dsgd_result dsgd_strategy_create(dsgd_ctx *ctx, const dsgd_strategy_desc *desc,
                                          dsgd_strategy **out);
/* Stops and joins the replicas' threads and frees everything the strategy
   created (backends through their destroy member); s NULL: nothing.
   Thread safety: the strategy's thread, not inside dsgd_strategy_run. */
DSGD_API void dsgd_strategy_destroy(dsgd_strategy *s);
/* dsgd_strategy_num_replicas: N (s NULL: 0).
   dsgd_strategy_gradient_path: the path resolved at creation, HOST or DEVICE
   (HOST with one replica, where nothing is exchanged; s NULL: HOST).
   Errors: none. Thread safety: any thread while s lives (fixed at
   creation). */
DSGD_API int dsgd_strategy_num_replicas(const dsgd_strategy *s);
DSGD_API dsgd_gradient_path dsgd_strategy_gradient_path(const dsgd_strategy *s);
/* "auto", "host", "device"; "unknown" for other values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_gradient_path_name(dsgd_gradient_path p);
/* Replica r's model, for inspection between steps (NULL when s is NULL or r
   is out of range).
   Errors: none. Thread safety: any thread while s lives (fixed at creation);
   use the model itself only from the strategy's thread, between calls. */
DSGD_API dsgd_model *dsgd_strategy_model(dsgd_strategy *s, int replica);

/* Sets the aggregation of a model variable (by name, e.g. "dense0/kernel", or
   "*" for all). Model variables are trainable and ON_WRITE; their aggregation
   says how the replicas' gradients combine before the identical update:
     MEAN (default)  the mean over every sample of the global batch: each
                     replica's gradient is scaled by 1 / global count and the
                     replicas' gradients are summed; with equal shards this is
                     the mean of the replicas' mean gradients
     SUM             the sum over replicas of each replica's mean gradient
     ONLY_FIRST_REPLICA  replica 0's mean gradient, used by all
   TensorFlow: Keras's optimizer.apply_gradients (TF 2.x, Keras 3 in TF
   2.21) ignores a variable's aggregation and always sums the replicas'
   gradients; with the loss scaled by the global batch, as Keras does, that
   sum is our MEAN, which is the TF behaviour. SUM and ONLY_FIRST_REPLICA are
   our extension: they match TF only for a variable updated directly in
   replica context (v.assign_sub(lr * g) with that aggregation), not for
   training through apply_gradients.
   NONE is rejected (ours: a mirrored variable needs an aggregation to stay
   one value across replicas), and so is ON_READ (only non-trainable
   variables may be ON_READ, the rule of Keras 2's add_weight).
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; variable NULL
   or not a model variable; aggregation NONE or unknown; synchronization
   other than AUTO or ON_WRITE), DSGD_ERR_STATE (the strategy has failed,
   see dsgd_strategy_failed).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_set_aggregation(dsgd_strategy *s, const char *variable,
                                                   dsgd_aggregation aggregation,
                                                   dsgd_synchronization synchronization);

/* One synchronous training step on the global batch x (count, input_dim),
   y (count, target_dim). The batch is sharded in contiguous slices: replica
   r takes dsgd_block_range(count, N, r) (the first count % N replicas take
   one sample more). Every replica then computes its gradient, the replicas
   agree on finiteness, sum the flat gradient buffers (SUM, after the
   per-variable scaling above; on the host or on the devices, see
   dsgd_gradient_path), and apply the same optimizer update, so their
   weights stay bitwise identical. A replica whose slice is empty (count < N)
   contributes a zero gradient. count may be 1..N * max_batch. info may be
   NULL.
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; x or y NULL; count out of range),
   DSGD_ERR_NON_FINITE (policy ERROR), DSGD_ERR_TIMEOUT, DSGD_ERR_STATE (the
   strategy has failed, see dsgd_strategy_failed), or the error chosen as in
   dsgd_strategy_run, with its message, which names the replica. A failure
   the replicas agree on before the update (a class index out of range on
   one replica, a non-finite gradient under policy ERROR) fails the step on
   every replica, changes nothing and leaves the strategy usable. Any other
   failure (in a collective, a timeout, a replica's backend failing in the
   exchange or in the optimizer update, after which the others may have
   updated) stops the other replicas at once and fails the strategy.
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_train_step(dsgd_strategy *s, const float *x, const float *y,
                                              int count, dsgd_step_info *info);
/* A sharded forward pass; loss and accuracy accumulate per replica in the
   EVAL metrics (read with dsgd_strategy_take_metrics). y may be NULL (no
   metrics).
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; x NULL; count outside 1..N * max_batch; a class
   index out of range), DSGD_ERR_STATE (the strategy has failed, see
   dsgd_strategy_failed), a replica's backend error. A failure here changes
   no weights and leaves the strategy usable (the EVAL metrics may hold part
   of the batch).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_eval_batch(dsgd_strategy *s, const float *x, const float *y,
                                              int count);
/* Reads the TRAIN or EVAL metrics and resets them. They are the ON_READ SUM
   variables "metrics/<slot>/loss_sum", ".../correct" and ".../count" (slot
   "train" or "eval"): each replica's model accumulators are first moved into
   its copies, then the copies are summed over replicas in rank order like
   strategy.reduce(SUM) and reset on every replica. TRAIN counts every sample
   a train step computed a loss for, skipped steps included. The
   accumulators are floats: counts are exact up to 2^24 samples between two
   takes.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; out NULL; an
   unknown slot), DSGD_ERR_STATE (the strategy has failed), a replica's
   backend error (copied to the strategy's ctx).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_take_metrics(dsgd_strategy *s, dsgd_metrics_slot slot,
                                                dsgd_metrics *out);

/* Runs fn on every replica at once (replica context, like strategy.run):
   replica 0 on the calling thread, the others on the strategy's threads; it
   returns when all have returned. A collective in fn must be called by every
   replica, or the others wait until their deadline (a replica that returns
   DSGD_OK without joining does not stop them).
   When fn fails on a replica (returns anything but DSGD_OK), the strategy
   aborts its transport at once: the replicas waiting in a collective, or
   entering one later, get DSGD_ERR_STATE within milliseconds instead of
   waiting out their deadline, and their results become DSGD_ERR_STATE
   "aborted because replica k failed (...)", k the replica that failed first
   (see dsgd_strategy_replica_result). The strategy has then failed, as the
   transport cannot be used again and fn may have left the replicas
   different: every later call refuses (dsgd_strategy_failed). Recreate it.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; fn NULL),
   DSGD_ERR_STATE (the strategy has failed), else DSGD_OK if every call
   returned it, or one replica's result with its message copied to the
   strategy's ctx, chosen by this rule: the lowest-numbered replica whose
   own code failed (fn returned an error not from a collective); if none,
   the lowest-numbered replica whose collective failed other than by the
   abort (a timeout, a mismatch); if none, the lowest-numbered aborted one.
   Thread safety: the strategy's thread; fn runs on N threads at once. */
DSGD_API dsgd_result dsgd_strategy_run(dsgd_strategy *s, dsgd_replica_fn fn, void *user_data);

/* dsgd_strategy_failed: non-zero once the strategy has failed (s NULL: 0).
   A strategy fails when a call ends in a failure that may have left its
   replicas different or stopped its transport: any failed
   dsgd_strategy_run, and any failed dsgd_strategy_train_step except the
   failures the replicas agree on before the update (see there). That call
   returns its own error; from then on every call that uses the replicas'
   state (train_step, eval_batch, run, take_metrics, set_aggregation and
   the variable functions) returns DSGD_ERR_STATE with a message that names
   the step (the optimizer steps applied before the failing call), the call
   and its error, and says the strategy must be recreated: destroy it and
   create a new one (the getters, dsgd_strategy_model included, still answer,
   for a post-mortem). This holds for every N, one replica included.
   dsgd_strategy_replica_result: replica `replica`'s result in the last call
   that ran the replicas (train_step, eval_batch or run; DSGD_OK before the
   first), and in *message (if message is not NULL) its message, "" when it
   succeeded; the message stays valid until the next such call or destroy.
   s NULL or replica outside [0, N): DSGD_ERR_INVALID_ARGUMENT and "".
   Errors: none (dsgd_strategy_replica_result returns a replica's recorded
   result; nothing is recorded on any context).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API int dsgd_strategy_failed(const dsgd_strategy *s);
DSGD_API dsgd_result dsgd_strategy_replica_result(const dsgd_strategy *s, int replica, const char **message);

/* Replica context getters (r NULL: -1, 0 or NULL):
     dsgd_replica_id     the replica's rank, 0..N-1
     dsgd_replica_count  N
     dsgd_replica_ctx, dsgd_replica_model, dsgd_replica_comm
                         the replica's own context, model and communicator
                         (comm NULL with one replica)
   Errors: none. Thread safety: the replica's thread, inside
   dsgd_strategy_run; the objects they return belong to that thread while fn
   runs. */
DSGD_API int dsgd_replica_id(const dsgd_replica *r);
DSGD_API int dsgd_replica_count(const dsgd_replica *r);
DSGD_API dsgd_ctx *dsgd_replica_ctx(const dsgd_replica *r);
DSGD_API dsgd_model *dsgd_replica_model(const dsgd_replica *r);
DSGD_API dsgd_comm *dsgd_replica_comm(const dsgd_replica *r);

/* ---------------------------------------------------------------- distributed variables */

/* The longest name of a distributed variable, in bytes (without the NUL). */
#define DSGD_MAX_VARIABLE_NAME 63

typedef struct dsgd_dvar_desc {
    const char *name;                    /* 1..DSGD_MAX_VARIABLE_NAME bytes, unique */
    size_t count;                        /* floats, >= 1 */
    dsgd_synchronization synchronization; /* AUTO = ON_WRITE */
    dsgd_aggregation aggregation;
    int trainable;                       /* ON_READ requires trainable == 0 */
    const float *initial_value;          /* count floats, copied to every replica's
                                            copy (so a cross-replica read of an ON_READ
                                            SUM variable starts at N x initial); NULL: zeros */
} dsgd_dvar_desc;

/* Creates a variable with one copy per replica (cross-replica context).
   Rejected with DSGD_ERR_INVALID_ARGUMENT: synchronization NONE (as
   tf.distribute rejects it under a strategy); ON_READ with trainable set
   (Keras 2's add_weight rejects it; tf.Variable accepts it); ON_READ with
   aggregation NONE (tf.distribute fails when such a variable is read across
   replicas; here it fails at creation); unknown enum values. *id receives
   the handle.
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (the
   cases above; s NULL, nothing recorded; desc or id NULL; an empty name; a
   name longer than DSGD_MAX_VARIABLE_NAME bytes (never cut: a cut name
   would not be found again); a name in use; count 0),
   DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_STATE (the
   strategy has failed, see dsgd_strategy_failed).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_create_variable(dsgd_strategy *s, const dsgd_dvar_desc *desc,
                                                   int *id);
/* Replica context (inside dsgd_strategy_run). Writes `value` (count floats):
     ON_WRITE: a collective every replica must call; the replicas' values are
               combined by the aggregation (SUM: sum; MEAN: mean;
               ONLY_FIRST_REPLICA: replica 0's) and every copy receives the
               result, as in tf.distribute. NONE: DSGD_ERR_INVALID_ARGUMENT
               on every replica. This rejection is ours: TF 2.21 accepts
               such a write and each replica updates only its own copy, so
               the copies silently differ (older TF raised an error).
     ON_READ:  writes this replica's copy only; no communication.
   Errors (recorded on the replica's ctx): DSGD_ERR_INVALID_ARGUMENT (r NULL,
   nothing recorded; no variable id; value NULL; ON_WRITE with aggregation
   NONE), DSGD_ERR_OUT_OF_MEMORY, and for ON_WRITE with N > 1 the errors of
   dsgd_allreduce or dsgd_broadcast (DSGD_ERR_TIMEOUT, DSGD_ERR_STATE, ...).
   Thread safety: the replica's thread, inside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_replica_assign(dsgd_replica *r, int id, const float *value);
/* As dsgd_replica_assign, with the copy incremented by the combined delta
   (ON_WRITE) or by the replica's own delta (ON_READ).
   Errors: as dsgd_replica_assign. Thread safety: as dsgd_replica_assign. */
DSGD_API dsgd_result dsgd_replica_assign_add(dsgd_replica *r, int id, const float *delta);
/* Copies this replica's copy to out (count floats).
   Errors: DSGD_ERR_INVALID_ARGUMENT (r NULL, nothing recorded; no variable
   id; out NULL). Thread safety: the replica's thread, inside
   dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_replica_read(dsgd_replica *r, int id, float *out);
/* Cross-replica read (strategy.reduce semantics for ON_READ): ON_WRITE
   variables give replica 0's copy (all copies are equal); ON_READ variables
   give the SUM or MEAN of the copies in rank order (added in double), or
   replica 0's copy for ONLY_FIRST_REPLICA.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; no variable
   id; out NULL), DSGD_ERR_STATE (the strategy has failed, see
   dsgd_strategy_failed). Thread safety: the strategy's thread, outside
   dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_read_variable(dsgd_strategy *s, int id, float *out);
/* What replica `replica` holds, without aggregation.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; no variable
   id; out NULL; replica outside [0, N)), DSGD_ERR_STATE (the strategy has
   failed). Thread safety: the strategy's thread, outside
   dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_read_local(dsgd_strategy *s, int id, int replica, float *out);
/* Cross-replica write: ON_WRITE variables and ON_READ MEAN or
   ONLY_FIRST_REPLICA variables get `value` in every copy; ON_READ SUM
   variables get value / N in every copy, so that a read gives value back
   (as tf.distribute does).
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; no variable
   id; value NULL), DSGD_ERR_STATE (the strategy has failed).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API dsgd_result dsgd_strategy_assign_variable(dsgd_strategy *s, int id, const float *value);
/* Finds a variable by name (-1 if none, or s or name NULL). The metrics are
   the ON_READ SUM variables "metrics/train/loss_sum", "metrics/train/correct",
   "metrics/train/count" and the same under "metrics/eval/"; between two
   dsgd_strategy_take_metrics they hold only what dsgd_replica_assign_add put
   there (the models' own accumulators are added in by the take).
   Errors: none. Thread safety: the strategy's thread, or any replica's
   inside dsgd_strategy_run (no variable is created then). */
DSGD_API int dsgd_strategy_find_variable(const dsgd_strategy *s, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* DSGD__STRATEGY_DECL */

#endif /* DISTSGD_H */

/* ======================================================================== */
/*                              IMPLEMENTATION                              */
/* ======================================================================== */
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__IMPLEMENTED)
#define DSGD__IMPLEMENTED

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#if defined(DSGD_MALLOC) && defined(DSGD_REALLOC) && defined(DSGD_FREE)
/* all three overridden */
#elif !defined(DSGD_MALLOC) && !defined(DSGD_REALLOC) && !defined(DSGD_FREE)
#define DSGD_MALLOC(sz) malloc(sz)
#define DSGD_REALLOC(p, sz) realloc(p, sz)
#define DSGD_FREE(p) free(p)
#else
#error "distsgd: define all of DSGD_MALLOC, DSGD_REALLOC and DSGD_FREE, or none"
#endif

#ifdef DSGD_USE_CBLAS
#include <cblas.h>
#endif

#ifndef DSGD_ASSERT
#include <assert.h>
#define DSGD_ASSERT(c) assert(c)
#endif

#ifdef __cplusplus
#define DSGD__RESTRICT __restrict
#define DSGD__ZERO_INIT {}
#else
#define DSGD__RESTRICT restrict
#define DSGD__ZERO_INIT {0}
#endif

#define DSGD__UNUSED(x) ((void)(x))
#define DSGD__MIN(a, b) ((a) < (b) ? (a) : (b))
#define DSGD__MAX(a, b) ((a) > (b) ? (a) : (b))

/* >>results ---------------------------------------------------------------- */

DSGD_API const char *dsgd_result_string(dsgd_result r) {
    switch (r) {
#define DSGD__RESULT_CASE(name, value, text) \
    case name:                               \
        return text;
        DSGD__RESULT_LIST(DSGD__RESULT_CASE)
#undef DSGD__RESULT_CASE
    default:
        return "unknown result code";
    }
}

/* >>context ---------------------------------------------------------------- */

#define DSGD__MSG_MAX 1024

struct dsgd_ctx {
    dsgd_logger logger;
    char label[64];
    dsgd_result last_result;
    char last_error[DSGD__MSG_MAX];
};

DSGD_API dsgd_result dsgd_ctx_create(const dsgd_ctx_desc *desc, dsgd_ctx **out) {
    dsgd_ctx *ctx;
    if (!out) return DSGD_ERR_INVALID_ARGUMENT;
    *out = NULL;
    ctx = (dsgd_ctx *)DSGD_MALLOC(sizeof(*ctx));
    if (!ctx) return DSGD_ERR_OUT_OF_MEMORY;
    memset(ctx, 0, sizeof(*ctx));
    if (desc) {
        ctx->logger = desc->logger;
        if (desc->label) {
            strncpy(ctx->label, desc->label, sizeof(ctx->label) - 1);
        }
    }
    *out = ctx;
    return DSGD_OK;
}

DSGD_API void dsgd_ctx_destroy(dsgd_ctx *ctx) { DSGD_FREE(ctx); }

DSGD_API const char *dsgd_ctx_last_error(const dsgd_ctx *ctx) {
    return ctx ? ctx->last_error : "";
}

DSGD_API dsgd_result dsgd_ctx_last_result(const dsgd_ctx *ctx) {
    return ctx ? ctx->last_result : DSGD_OK;
}

DSGD_API void dsgd_ctx_clear_error(dsgd_ctx *ctx) {
    if (!ctx) return;
    ctx->last_result = DSGD_OK;
    ctx->last_error[0] = '\0';
}

static void dsgd__vformat(dsgd_ctx *ctx, char *dst, size_t cap, const char *fmt, va_list ap) {
    size_t used = 0;
    if (ctx->label[0]) {
        int k = snprintf(dst, cap, "%s: ", ctx->label);
        used = k > 0 ? (size_t)k : 0;
        if (used >= cap) used = cap - 1;
    }
    vsnprintf(dst + used, cap - used, fmt, ap);
}

DSGD_API dsgd_result dsgd_ctx_set_error(dsgd_ctx *ctx, dsgd_result r, const char *fmt, ...) {
    va_list ap;
    if (!ctx) return r;
    va_start(ap, fmt);
    dsgd__vformat(ctx, ctx->last_error, sizeof(ctx->last_error), fmt, ap);
    va_end(ap);
    ctx->last_result = r;
    if (ctx->logger.func) ctx->logger.func(ctx->logger.user_data, DSGD_LOG_ERROR, ctx->last_error);
    return r;
}

DSGD_API void dsgd_ctx_log(dsgd_ctx *ctx, dsgd_log_level level, const char *fmt, ...) {
    char msg[DSGD__MSG_MAX];
    va_list ap;
    if (!ctx || !ctx->logger.func) return;
    va_start(ap, fmt);
    dsgd__vformat(ctx, msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctx->logger.func(ctx->logger.user_data, level, msg);
}

/* >>utilities -------------------------------------------------------------- */

DSGD_API uint64_t dsgd_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

DSGD_API double dsgd_rng_uniform(uint64_t *state) {
    return (double)(dsgd_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* A standard normal deviate (Box-Muller; one of the pair is discarded so the
   stream position depends only on the number of draws). */
static double dsgd__rng_normal(uint64_t *state) {
    double u1 = dsgd_rng_uniform(state), u2 = dsgd_rng_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Uniform integer in [0, n) without modulo bias. */
static size_t dsgd__rng_below(uint64_t *state, size_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)n, r;
    do {
        r = dsgd_rng_next(state);
    } while (r >= limit);
    return (size_t)(r % (uint64_t)n);
}

/* A seed derived from a base seed and a stream index. */
static uint64_t dsgd__seed_mix(uint64_t seed, uint64_t stream) {
    uint64_t s = seed ^ (stream * 0xD1B54A32D192ED03ull);
    return dsgd_rng_next(&s);
}

DSGD_API double dsgd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *dsgd__alloc(dsgd_ctx *ctx, size_t bytes, const char *what) {
    void *p = DSGD_MALLOC(bytes ? bytes : 1);
    if (!p) dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, bytes);
    return p;
}

/* n * size, or 0 on overflow (callers treat 0 from non-zero operands as overflow). */
static int dsgd__mul_overflows(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 1;
    *out = a * b;
    return 0;
}


/* >>cpu backend ------------------------------------------------------------ */
/* dsgd_buffer is never defined: every backend casts its own buffer type. */

typedef struct dsgd__cpu_buffer {
    size_t count;
    float *data;
} dsgd__cpu_buffer;

typedef struct dsgd__cpu {
    dsgd_ctx *ctx;
    float *pack; /* GEMM packing scratch: A panel then B panel */
    size_t pack_cap;
} dsgd__cpu;

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

static dsgd_result dsgd__cpu_write(void *impl, dsgd_ref dst, const float *src, size_t count) {
    float *d = dsgd__cpu_span((dsgd__cpu *)impl, dst, count, "write");
    if (!d) return DSGD_ERR_INVALID_ARGUMENT;
    if (count) memcpy(d, src, count * sizeof(float));
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_read(void *impl, dsgd_ref src, float *dst, size_t count) {
    float *s = dsgd__cpu_span((dsgd__cpu *)impl, src, count, "read");
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (count) memcpy(dst, s, count * sizeof(float));
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_copy(void *impl, dsgd_ref dst, dsgd_ref src, size_t count) {
    float *d = dsgd__cpu_span((dsgd__cpu *)impl, dst, count, "copy");
    float *s = dsgd__cpu_span((dsgd__cpu *)impl, src, count, "copy");
    if (!d || !s) return DSGD_ERR_INVALID_ARGUMENT;
    if (count) memmove(d, s, count * sizeof(float));
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_fill(void *impl, dsgd_ref dst, float value, size_t count) {
    float *d = dsgd__cpu_span((dsgd__cpu *)impl, dst, count, "fill");
    size_t i;
    if (!d) return DSGD_ERR_INVALID_ARGUMENT;
    for (i = 0; i < count; ++i) d[i] = value;
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_scale(void *impl, dsgd_ref x, float alpha, size_t n) {
    float *p = dsgd__cpu_span((dsgd__cpu *)impl, x, n, "scale");
    size_t i;
    if (!p) return DSGD_ERR_INVALID_ARGUMENT;
    for (i = 0; i < n; ++i) p[i] *= alpha;
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_axpy(void *impl, dsgd_ref y, float alpha, dsgd_ref x, size_t n) {
    float *py = dsgd__cpu_span((dsgd__cpu *)impl, y, n, "axpy");
    float *px = dsgd__cpu_span((dsgd__cpu *)impl, x, n, "axpy");
    size_t i;
    if (!py || !px) return DSGD_ERR_INVALID_ARGUMENT;
    for (i = 0; i < n; ++i) py[i] += alpha * px[i];
    return DSGD_OK;
}

/* >>gemm ------------------------------------------------------------------- */
/* A cache-blocked GEMM in the style of Goto & van de Geijn (2008): B is packed
   into KC x NC panels of NR-wide column strips, A into MC x KC panels of
   MR-high row strips, and a register-blocked MR x NR micro-kernel the compiler
   vectorises does the arithmetic. The summation order is fixed, so results
   are bitwise reproducible. */

#ifndef DSGD_USE_CBLAS
/* The micro-kernel works on NR = 2 vectors of VW floats: 8 with AVX, else 4
   (SSE2, NEON), so that no vector operation is split into scalars. */
#if defined(__AVX__)
#define DSGD__VW 8
#else
#define DSGD__VW 4
#endif
#define DSGD__MR 6
#define DSGD__NR (2 * DSGD__VW)
#define DSGD__KC 256
#define DSGD__MC 120
#define DSGD__NC 2048

/* Packs the mc x kc block of op(A) at (i0, p0) into MR-row strips. */
static void dsgd__pack_a(int ta, const float *a, int lda, int i0, int mc, int p0, int kc,
                         float *DSGD__RESTRICT ap) {
    int ib, i, p;
    for (ib = 0; ib < mc; ib += DSGD__MR) {
        int mr = DSGD__MIN(DSGD__MR, mc - ib);
        for (p = 0; p < kc; ++p) {
            for (i = 0; i < mr; ++i) {
                int row = i0 + ib + i, col = p0 + p;
                ap[i] = ta ? a[(size_t)col * lda + row] : a[(size_t)row * lda + col];
            }
            for (; i < DSGD__MR; ++i) ap[i] = 0.0f;
            ap += DSGD__MR;
        }
    }
}

/* Packs the kc x nc block of op(B) at (p0, j0) into NR-column strips. */
static void dsgd__pack_b(int tb, const float *b, int ldb, int p0, int kc, int j0, int nc,
                         float *DSGD__RESTRICT bp) {
    int jb, j, p;
    for (jb = 0; jb < nc; jb += DSGD__NR) {
        int nr = DSGD__MIN(DSGD__NR, nc - jb);
        for (p = 0; p < kc; ++p) {
            int row = p0 + p;
            if (!tb && nr == DSGD__NR) {
                memcpy(bp, b + (size_t)row * ldb + j0 + jb, DSGD__NR * sizeof(float));
            } else {
                for (j = 0; j < nr; ++j) {
                    int col = j0 + jb + j;
                    bp[j] = tb ? b[(size_t)col * ldb + row] : b[(size_t)row * ldb + col];
                }
                for (; j < DSGD__NR; ++j) bp[j] = 0.0f;
            }
            bp += DSGD__NR;
        }
    }
}

/* C(mr, nr) += alpha * Ap(MR, kc) * Bp(kc, NR) */
#if defined(__GNUC__) || defined(__clang__)
/* GNU vector extensions: twelve accumulators stay in registers (gcc does not
   vectorise the plain loop below with the accumulators in them). */
typedef float dsgd__v8 __attribute__((vector_size(DSGD__VW * 4)));
/* loads and zeroing through memcpy/memset: no vector crosses a function
   boundary, so the ABI does not depend on -mavx */
#define DSGD__V8_LOAD(v, p) memcpy(&(v), (p), sizeof(dsgd__v8))

static void dsgd__gemm_micro(int kc, const float *DSGD__RESTRICT ap, const float *DSGD__RESTRICT bp,
                             float *c, int ldc, int mr, int nr, float alpha) {
    dsgd__v8 z, b0, b1;
    dsgd__v8 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    float acc[DSGD__MR][DSGD__NR];
    int i, j, p;
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
        ap += DSGD__MR;
        bp += DSGD__NR;
    }
    memcpy(acc[0], &c00, sizeof(z)); memcpy(acc[0] + DSGD__VW, &c01, sizeof(z));
    memcpy(acc[1], &c10, sizeof(z)); memcpy(acc[1] + DSGD__VW, &c11, sizeof(z));
    memcpy(acc[2], &c20, sizeof(z)); memcpy(acc[2] + DSGD__VW, &c21, sizeof(z));
    memcpy(acc[3], &c30, sizeof(z)); memcpy(acc[3] + DSGD__VW, &c31, sizeof(z));
    memcpy(acc[4], &c40, sizeof(z)); memcpy(acc[4] + DSGD__VW, &c41, sizeof(z));
    memcpy(acc[5], &c50, sizeof(z)); memcpy(acc[5] + DSGD__VW, &c51, sizeof(z));
    for (i = 0; i < mr; ++i)
        for (j = 0; j < nr; ++j) c[(size_t)i * ldc + j] += alpha * acc[i][j];
}
#else
static void dsgd__gemm_micro(int kc, const float *DSGD__RESTRICT ap, const float *DSGD__RESTRICT bp,
                             float *c, int ldc, int mr, int nr, float alpha) {
    float acc[DSGD__MR][DSGD__NR];
    int i, j, p;
    for (i = 0; i < DSGD__MR; ++i)
        for (j = 0; j < DSGD__NR; ++j) acc[i][j] = 0.0f;
    for (p = 0; p < kc; ++p) {
        for (i = 0; i < DSGD__MR; ++i) {
            float av = ap[i];
            for (j = 0; j < DSGD__NR; ++j) acc[i][j] += av * bp[j];
        }
        ap += DSGD__MR;
        bp += DSGD__NR;
    }
    for (i = 0; i < mr; ++i)
        for (j = 0; j < nr; ++j) c[(size_t)i * ldc + j] += alpha * acc[i][j];
}
#endif
#endif /* !DSGD_USE_CBLAS */

static dsgd_result dsgd__cpu_gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha,
                                  dsgd_ref ra, int lda, dsgd_ref rb, int ldb, float beta,
                                  dsgd_ref rc, int ldc) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    const float *a, *b;
    float *c;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    int i, j, ic, jc, pc;
    size_t need;
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
    /* C = beta * C first; beta == 0 overwrites so NaN in C does not propagate */
    for (i = 0; i < m; ++i) {
        float *row = c + (size_t)i * ldc;
        if (beta == 0.0f)
            for (j = 0; j < n; ++j) row[j] = 0.0f;
        else if (beta != 1.0f)
            for (j = 0; j < n; ++j) row[j] *= beta;
    }
    if (k == 0 || alpha == 0.0f) return DSGD_OK;
#ifdef DSGD_USE_CBLAS
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
                k, alpha, a, lda, b, ldb, 1.0f, c, ldc);
    DSGD__UNUSED(ic); DSGD__UNUSED(jc); DSGD__UNUSED(pc); DSGD__UNUSED(need);
    return DSGD_OK;
#else
    need = (size_t)DSGD__MC * DSGD__KC + (size_t)DSGD__KC * DSGD__NC;
    if (cpu->pack_cap < need) {
        float *p = (float *)DSGD_REALLOC(cpu->pack, need * sizeof(float));
        if (!p) return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_OUT_OF_MEMORY, "cpu gemm: packing buffer");
        cpu->pack = p;
        cpu->pack_cap = need;
    }
    for (jc = 0; jc < n; jc += DSGD__NC) {
        int nc = DSGD__MIN(DSGD__NC, n - jc);
        for (pc = 0; pc < k; pc += DSGD__KC) {
            int kc = DSGD__MIN(DSGD__KC, k - pc);
            float *bp = cpu->pack + (size_t)DSGD__MC * DSGD__KC;
            dsgd__pack_b(tb, b, ldb, pc, kc, jc, nc, bp);
            for (ic = 0; ic < m; ic += DSGD__MC) {
                int mc = DSGD__MIN(DSGD__MC, m - ic);
                int ir, jr;
                dsgd__pack_a(ta, a, lda, ic, mc, pc, kc, cpu->pack);
                for (jr = 0; jr < nc; jr += DSGD__NR) {
                    for (ir = 0; ir < mc; ir += DSGD__MR) {
                        dsgd__gemm_micro(kc, cpu->pack + (size_t)ir * kc, bp + (size_t)jr * kc,
                                         c + (size_t)(ic + ir) * ldc + jc + jr, ldc,
                                         DSGD__MIN(DSGD__MR, mc - ir), DSGD__MIN(DSGD__NR, nc - jr),
                                         alpha);
                    }
                }
            }
        }
    }
    return DSGD_OK;
#endif
}

/* >>activations and losses ------------------------------------------------- */

static float dsgd__act(dsgd_activation act, float v) {
    switch (act) {
    case DSGD_ACT_RELU: return v > 0.0f ? v : 0.0f;
    case DSGD_ACT_TANH: return tanhf(v);
    case DSGD_ACT_SIGMOID: return 1.0f / (1.0f + expf(-v));
    default: return v;
    }
}

static int dsgd__act_valid(dsgd_activation act) {
    return act == DSGD_ACT_NONE || act == DSGD_ACT_RELU || act == DSGD_ACT_TANH ||
           act == DSGD_ACT_SIGMOID;
}

static dsgd_result dsgd__cpu_bias_act_forward(void *impl, dsgd_activation act, dsgd_ref ry,
                                              dsgd_ref rbias, int m, int n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *y;
    const float *bias = NULL;
    int i, j;
    if (m < 0 || n < 0 || !dsgd__act_valid(act))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "cpu bias_act_forward: bad arguments m=%d n=%d act=%d", m, n, (int)act);
    y = dsgd__cpu_span(cpu, ry, (size_t)m * n, "bias_act_forward y");
    if (!y) return DSGD_ERR_INVALID_ARGUMENT;
    if (rbias.buf) {
        bias = dsgd__cpu_span(cpu, rbias, (size_t)n, "bias_act_forward bias");
        if (!bias) return DSGD_ERR_INVALID_ARGUMENT;
    }
    for (i = 0; i < m; ++i) {
        float *row = y + (size_t)i * n;
        for (j = 0; j < n; ++j) row[j] = dsgd__act(act, bias ? row[j] + bias[j] : row[j]);
    }
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_act_backward(void *impl, dsgd_activation act, dsgd_ref rdy, dsgd_ref ry,
                                          size_t n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *dy;
    const float *y;
    size_t i;
    if (!dsgd__act_valid(act))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu act_backward: bad activation %d", (int)act);
    dy = dsgd__cpu_span(cpu, rdy, n, "act_backward dy");
    y = dsgd__cpu_span(cpu, ry, n, "act_backward y");
    if (!dy || !y) return DSGD_ERR_INVALID_ARGUMENT;
    switch (act) {
    case DSGD_ACT_RELU:
        for (i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
        break;
    case DSGD_ACT_TANH:
        for (i = 0; i < n; ++i) dy[i] *= 1.0f - y[i] * y[i];
        break;
    case DSGD_ACT_SIGMOID:
        for (i = 0; i < n; ++i) dy[i] *= y[i] * (1.0f - y[i]);
        break;
    default:
        break;
    }
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_bias_backward(void *impl, dsgd_ref rdb, dsgd_ref rdy, int m, int n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *db;
    const float *dy;
    int i, j;
    if (m < 0 || n < 0)
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu bias_backward: m=%d n=%d", m, n);
    db = dsgd__cpu_span(cpu, rdb, (size_t)n, "bias_backward db");
    dy = dsgd__cpu_span(cpu, rdy, (size_t)m * n, "bias_backward dy");
    if (!db || !dy) return DSGD_ERR_INVALID_ARGUMENT;
    for (j = 0; j < n; ++j) db[j] = 0.0f;
    for (i = 0; i < m; ++i) {
        const float *row = dy + (size_t)i * n;
        for (j = 0; j < n; ++j) db[j] += row[j];
    }
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
/* SGD and momentum follow torch.optim.SGD (v = mu v + g; p -= lr v; Nesterov:
   p -= lr (g + mu v)); Adam follows Kingma & Ba 2015, Algorithm 1, with L2
   weight decay added to the gradient as torch.optim.Adam does; AdamW follows
   Loshchilov & Hutter 2019, decoupled decay p -= lr wd p (torch.optim.AdamW). */
static dsgd_result dsgd__cpu_optimizer_update(void *impl, const dsgd_opt_update *u, dsgd_ref rp,
                                              dsgd_ref rg, dsgd_ref rm1, dsgd_ref rm2, size_t n) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    float *p = dsgd__cpu_span(cpu, rp, n, "optimizer_update param");
    const float *g = dsgd__cpu_span(cpu, rg, n, "optimizer_update grad");
    float *m1 = NULL, *m2 = NULL;
    float lr, wd, gs;
    size_t i;
    if (!p || !g || !u) return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu optimizer_update: bad arguments");
    if (u->kind != DSGD_OPT_SGD) {
        m1 = dsgd__cpu_span(cpu, rm1, n, "optimizer_update state m1");
        if (!m1) return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (u->kind == DSGD_OPT_ADAM || u->kind == DSGD_OPT_ADAMW) {
        m2 = dsgd__cpu_span(cpu, rm2, n, "optimizer_update state m2");
        if (!m2) return DSGD_ERR_INVALID_ARGUMENT;
    }
    lr = u->lr;
    wd = u->weight_decay;
    gs = u->grad_scale;
    switch (u->kind) {
    case DSGD_OPT_SGD:
        for (i = 0; i < n; ++i) {
            float gi = g[i] * gs + wd * p[i]; /* L2 term */
            p[i] -= lr * gi;
        }
        break;
    case DSGD_OPT_MOMENTUM: {
        float mu = u->momentum;
        for (i = 0; i < n; ++i) {
            float gi = g[i] * gs + wd * p[i];
            float v = mu * m1[i] + gi; /* velocity */
            m1[i] = v;
            p[i] -= lr * (u->nesterov ? gi + mu * v : v);
        }
        break;
    }
    case DSGD_OPT_ADAM:
    case DSGD_OPT_ADAMW: {
        float b1 = u->beta1, b2 = u->beta2, eps = u->eps;
        float bc1 = u->bias_correction1, bc2 = u->bias_correction2;
        int decoupled = u->kind == DSGD_OPT_ADAMW;
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
    default:
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu optimizer_update: unknown kind %d", (int)u->kind);
    }
    return DSGD_OK;
}

static dsgd_result dsgd__cpu_norm_check(void *impl, dsgd_ref rx, size_t n, double *sumsq, size_t *nonfinite) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    const float *x = dsgd__cpu_span(cpu, rx, n, "norm_check");
    double s = 0.0;
    size_t bad = 0, i;
    if (!x) return DSGD_ERR_INVALID_ARGUMENT;
    if (!sumsq) {
        /* finiteness only (the strategies' check every step): an exponent of
           all ones is NaN or infinity; an integer OR vectorises */
        uint32_t any = 0, u;
        for (i = 0; i < n; ++i) {
            memcpy(&u, x + i, sizeof(u));
            any |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (!any) {
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

static void dsgd__cpu_destroy(void *impl) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    if (!cpu) return;
    DSGD_FREE(cpu->pack);
    DSGD_FREE(cpu);
}

DSGD_API dsgd_result dsgd_cpu_backend_create(dsgd_ctx *ctx, dsgd_backend_i *out) {
    dsgd__cpu *cpu;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cpu_backend_create: out is NULL");
    memset(out, 0, sizeof(*out));
    cpu = (dsgd__cpu *)dsgd__alloc(ctx, sizeof(*cpu), "dsgd_cpu_backend_create");
    if (!cpu) return DSGD_ERR_OUT_OF_MEMORY;
    memset(cpu, 0, sizeof(*cpu));
    cpu->ctx = ctx;
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
    return DSGD_OK;
}


/* >>model ------------------------------------------------------------------ */

struct dsgd_model {
    dsgd_ctx *ctx;
    dsgd_backend_i be;     /* the backend's table, copied */
    int owns_backend;
    int input_dim, num_layers, max_batch;
    dsgd_loss loss;
    dsgd_layer_desc *layers;
    int *dims;             /* dims[0] = input_dim, dims[l + 1] = units of layer l */
    dsgd_variable *vars;   /* 2 per layer: kernel, bias */
    size_t num_params;
    dsgd_buffer *params, *grads;
    dsgd_buffer *acts;     /* x, then every layer's output, each (max_batch, dims[l]) */
    size_t *act_off;
    dsgd_buffer *delta;    /* two (max_batch, max dim) halves, used in turn */
    size_t delta_half;
    dsgd_buffer *targets;  /* (max_batch, target_dim) */
    dsgd_buffer *stats;    /* [train loss, train correct, eval loss, eval correct] */
    double count[2];
    int last_count;        /* batch size of the last forward pass */
};

static dsgd_ref dsgd__ref(dsgd_buffer *buf, size_t off) {
    dsgd_ref r;
    r.buf = buf;
    r.off = off;
    return r;
}

/* Draws a layer's kernel (fan_in, fan_out) on the host. */
static void dsgd__init_kernel(float *w, int fan_in, int fan_out, dsgd_init init, dsgd_activation act,
                              uint64_t seed) {
    size_t i, n = (size_t)fan_in * fan_out;
    uint64_t st = seed;
    if (init == DSGD_INIT_AUTO) init = act == DSGD_ACT_RELU ? DSGD_INIT_HE_NORMAL : DSGD_INIT_GLOROT_UNIFORM;
    for (i = 0; i < n; ++i) {
        double v;
        switch (init) {
        case DSGD_INIT_HE_NORMAL: v = dsgd__rng_normal(&st) * sqrt(2.0 / fan_in); break;
        case DSGD_INIT_HE_UNIFORM: v = (2.0 * dsgd_rng_uniform(&st) - 1.0) * sqrt(6.0 / fan_in); break;
        case DSGD_INIT_GLOROT_NORMAL: v = dsgd__rng_normal(&st) * sqrt(2.0 / (fan_in + fan_out)); break;
        default: v = (2.0 * dsgd_rng_uniform(&st) - 1.0) * sqrt(6.0 / (fan_in + fan_out)); break;
        }
        w[i] = (float)v;
    }
}

static dsgd_result dsgd__model_buffer(dsgd_model *m, size_t count, dsgd_buffer **out) {
    return m->be.buffer_create(m->be.impl, count, out);
}

DSGD_API void dsgd_model_destroy(dsgd_model *m) {
    dsgd_buffer **bufs[6];
    int i;
    if (!m) return;
    bufs[0] = &m->params; bufs[1] = &m->grads; bufs[2] = &m->acts;
    bufs[3] = &m->delta; bufs[4] = &m->targets; bufs[5] = &m->stats;
    for (i = 0; i < 6; ++i)
        if (*bufs[i] && m->be.buffer_destroy) m->be.buffer_destroy(m->be.impl, *bufs[i]);
    if (m->owns_backend && m->be.destroy) m->be.destroy(m->be.impl);
    DSGD_FREE(m->layers);
    DSGD_FREE(m->dims);
    DSGD_FREE(m->vars);
    DSGD_FREE(m->act_off);
    DSGD_FREE(m);
}

static int dsgd__backend_complete(const dsgd_backend_i *b) {
    return b->buffer_create && b->buffer_destroy && b->write && b->read && b->copy && b->fill &&
           b->scale && b->axpy && b->gemm && b->bias_act_forward && b->act_backward &&
           b->bias_backward && b->loss && b->optimizer_update && b->norm_check;
}

DSGD_API dsgd_result dsgd_model_create(dsgd_ctx *ctx, const dsgd_model_desc *desc, dsgd_model **out) {
    dsgd_model *m;
    dsgd_result r;
    int l, max_dim;
    size_t off, act_total, i;
    float *host;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: out is NULL");
    *out = NULL;
    if (!desc) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: desc is NULL");
    if (desc->input_dim <= 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: input_dim %d must be > 0", desc->input_dim);
    if (desc->num_layers <= 0 || !desc->layers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: a model needs at least one layer (num_layers %d)", desc->num_layers);
    if (desc->loss != DSGD_LOSS_SOFTMAX_XENT && desc->loss != DSGD_LOSS_MSE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: unknown loss %d", (int)desc->loss);
    if (desc->max_batch < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: max_batch %d is negative", desc->max_batch);
    for (l = 0; l < desc->num_layers; ++l) {
        const dsgd_layer_desc *ld = &desc->layers[l];
        if (ld->units <= 0 || !dsgd__act_valid(ld->activation) || (int)ld->init < 0 ||
            (int)ld->init > (int)DSGD_INIT_GLOROT_NORMAL)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "dsgd_model_create: layer %d: units %d, activation %d or init %d invalid",
                                      l, ld->units, (int)ld->activation, (int)ld->init);
    }
    if (desc->loss == DSGD_LOSS_SOFTMAX_XENT && desc->layers[desc->num_layers - 1].activation != DSGD_ACT_NONE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_model_create: softmax cross-entropy takes logits: the last layer's activation must be NONE");
    if (desc->backend && !dsgd__backend_complete(desc->backend))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: backend '%s' lacks a required operation",
                                  desc->backend->name ? desc->backend->name : "?");

    m = (dsgd_model *)dsgd__alloc(ctx, sizeof(*m), "dsgd_model_create");
    if (!m) return DSGD_ERR_OUT_OF_MEMORY;
    memset(m, 0, sizeof(*m));
    m->ctx = ctx;
    m->input_dim = desc->input_dim;
    m->num_layers = desc->num_layers;
    m->max_batch = desc->max_batch ? desc->max_batch : 256;
    m->loss = desc->loss;
    if (desc->backend) {
        m->be = *desc->backend;
    } else {
        r = dsgd_cpu_backend_create(ctx, &m->be);
        if (r != DSGD_OK) { DSGD_FREE(m); return r; }
        m->owns_backend = 1;
    }
    m->layers = (dsgd_layer_desc *)dsgd__alloc(ctx, sizeof(dsgd_layer_desc) * m->num_layers, "dsgd_model_create");
    m->dims = (int *)dsgd__alloc(ctx, sizeof(int) * (m->num_layers + 1), "dsgd_model_create");
    m->vars = (dsgd_variable *)dsgd__alloc(ctx, sizeof(dsgd_variable) * 2 * m->num_layers, "dsgd_model_create");
    m->act_off = (size_t *)dsgd__alloc(ctx, sizeof(size_t) * (m->num_layers + 1), "dsgd_model_create");
    if (!m->layers || !m->dims || !m->vars || !m->act_off) { dsgd_model_destroy(m); return DSGD_ERR_OUT_OF_MEMORY; }
    memcpy(m->layers, desc->layers, sizeof(dsgd_layer_desc) * m->num_layers);
    memset(m->vars, 0, sizeof(dsgd_variable) * 2 * m->num_layers);

    /* variables: kernel (in, out) then bias (out), layer after layer */
    m->dims[0] = m->input_dim;
    max_dim = m->input_dim;
    off = 0;
    act_total = 0;
    for (l = 0; l < m->num_layers; ++l) {
        dsgd_variable *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
        m->dims[l + 1] = m->layers[l].units;
        max_dim = DSGD__MAX(max_dim, m->dims[l + 1]);
        snprintf(k->name, sizeof(k->name), "dense%d/kernel", l);
        k->offset = off; k->count = (size_t)m->dims[l] * m->dims[l + 1];
        k->rank = 2; k->shape[0] = m->dims[l]; k->shape[1] = m->dims[l + 1];
        off += k->count;
        snprintf(b->name, sizeof(b->name), "dense%d/bias", l);
        b->offset = off; b->count = (size_t)m->dims[l + 1];
        b->rank = 1; b->shape[0] = m->dims[l + 1];
        off += b->count;
    }
    m->num_params = off;
    for (l = 0; l <= m->num_layers; ++l) {
        m->act_off[l] = act_total;
        act_total += (size_t)m->max_batch * m->dims[l];
    }
    m->delta_half = (size_t)m->max_batch * max_dim;

    if ((r = dsgd__model_buffer(m, m->num_params, &m->params)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, m->num_params, &m->grads)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, act_total, &m->acts)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, 2 * m->delta_half, &m->delta)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, (size_t)m->max_batch * dsgd_model_target_dim(m), &m->targets)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, 4, &m->stats)) != DSGD_OK ||
        (r = m->be.fill(m->be.impl, dsgd__ref(m->stats, 0), 0.0f, 4)) != DSGD_OK ||
        (r = m->be.fill(m->be.impl, dsgd__ref(m->grads, 0), 0.0f, m->num_params)) != DSGD_OK) {
        dsgd_model_destroy(m);
        return r;
    }

    /* initialise on the host, so every backend starts from the same bits */
    host = (float *)dsgd__alloc(ctx, m->num_params * sizeof(float), "dsgd_model_create");
    if (!host) { dsgd_model_destroy(m); return DSGD_ERR_OUT_OF_MEMORY; }
    for (l = 0; l < m->num_layers; ++l) {
        const dsgd_variable *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
        dsgd__init_kernel(host + k->offset, k->shape[0], k->shape[1], m->layers[l].init,
                          m->layers[l].activation, dsgd__seed_mix(desc->seed, (uint64_t)l));
        for (i = 0; i < b->count; ++i) host[b->offset + i] = 0.0f;
    }
    r = m->be.write(m->be.impl, dsgd__ref(m->params, 0), host, m->num_params);
    DSGD_FREE(host);
    if (r != DSGD_OK) { dsgd_model_destroy(m); return r; }
    *out = m;
    return DSGD_OK;
}

DSGD_API dsgd_ctx *dsgd_model_ctx(const dsgd_model *m) { return m ? m->ctx : NULL; }
DSGD_API const dsgd_backend_i *dsgd_model_backend(const dsgd_model *m) { return m ? &m->be : NULL; }
DSGD_API size_t dsgd_model_num_params(const dsgd_model *m) { return m ? m->num_params : 0; }
DSGD_API int dsgd_model_num_variables(const dsgd_model *m) { return m ? 2 * m->num_layers : 0; }
DSGD_API const dsgd_variable *dsgd_model_variable(const dsgd_model *m, int i) {
    return (m && i >= 0 && i < 2 * m->num_layers) ? &m->vars[i] : NULL;
}
DSGD_API int dsgd_model_input_dim(const dsgd_model *m) { return m ? m->input_dim : 0; }
DSGD_API int dsgd_model_output_dim(const dsgd_model *m) { return m ? m->dims[m->num_layers] : 0; }
DSGD_API int dsgd_model_target_dim(const dsgd_model *m) {
    if (!m) return 0;
    return m->loss == DSGD_LOSS_SOFTMAX_XENT ? 1 : m->dims[m->num_layers];
}
DSGD_API dsgd_ref dsgd_model_params(const dsgd_model *m) { return dsgd__ref(m ? m->params : NULL, 0); }
DSGD_API dsgd_ref dsgd_model_grads(const dsgd_model *m) { return dsgd__ref(m ? m->grads : NULL, 0); }

static dsgd_result dsgd__model_io(dsgd_model *m, dsgd_buffer *buf, float *dst, const float *src,
                                  size_t count, const char *what) {
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!(dst || src))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: host pointer is NULL", what);
    if (count != m->num_params)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_SHAPE, "%s: count %zu, the model has %zu parameters", what,
                                  count, m->num_params);
    return src ? m->be.write(m->be.impl, dsgd__ref(buf, 0), src, count)
               : m->be.read(m->be.impl, dsgd__ref(buf, 0), dst, count);
}

DSGD_API dsgd_result dsgd_model_get_params(dsgd_model *m, float *dst, size_t count) {
    return dsgd__model_io(m, m ? m->params : NULL, dst, NULL, count, "dsgd_model_get_params");
}
DSGD_API dsgd_result dsgd_model_set_params(dsgd_model *m, const float *src, size_t count) {
    return dsgd__model_io(m, m ? m->params : NULL, NULL, src, count, "dsgd_model_set_params");
}
DSGD_API dsgd_result dsgd_model_get_grads(dsgd_model *m, float *dst, size_t count) {
    return dsgd__model_io(m, m ? m->grads : NULL, dst, NULL, count, "dsgd_model_get_grads");
}

/* Uploads a batch; y may be NULL. */
static dsgd_result dsgd__model_upload(dsgd_model *m, const float *x, const float *y, int count, const char *what) {
    dsgd_result r;
    if (!x)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: x is NULL", what);
    if (count <= 0 || count > m->max_batch)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: batch of %d samples outside 1..max_batch (%d)",
                                  what, count, m->max_batch);
    r = m->be.write(m->be.impl, dsgd__ref(m->acts, m->act_off[0]), x, (size_t)count * m->input_dim);
    if (r == DSGD_OK && y)
        r = m->be.write(m->be.impl, dsgd__ref(m->targets, 0), y, (size_t)count * dsgd_model_target_dim(m));
    return r;
}

/* acts[l+1](M, dims[l+1]) = act(acts[l](M, dims[l]) W_l + b_l), layer by layer */
static dsgd_result dsgd__model_forward(dsgd_model *m, int M) {
    int l;
    dsgd_result r;
    for (l = 0; l < m->num_layers; ++l) {
        int in = m->dims[l], out = m->dims[l + 1];
        const dsgd_variable *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
        dsgd_ref x = dsgd__ref(m->acts, m->act_off[l]), y = dsgd__ref(m->acts, m->act_off[l + 1]);
        r = m->be.gemm(m->be.impl, 0, 0, M, out, in, 1.0f, x, in, dsgd__ref(m->params, k->offset), out, 0.0f, y, out);
        if (r != DSGD_OK) return r;
        r = m->be.bias_act_forward(m->be.impl, m->layers[l].activation, y, dsgd__ref(m->params, b->offset), M, out);
        if (r != DSGD_OK) return r;
    }
    m->last_count = M;
    return DSGD_OK;
}

/* Given dlogits in delta half 0, fills the gradient buffer, layer L-1 down to 0. */
static dsgd_result dsgd__model_backward(dsgd_model *m, int M) {
    int l, cur = 0;
    dsgd_result r;
    for (l = m->num_layers - 1; l >= 0; --l) {
        int in = m->dims[l], out = m->dims[l + 1];
        const dsgd_variable *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
        dsgd_ref d = dsgd__ref(m->delta, cur * m->delta_half);            /* (M, out) */
        dsgd_ref dprev = dsgd__ref(m->delta, (1 - cur) * m->delta_half);  /* (M, in) */
        dsgd_ref x = dsgd__ref(m->acts, m->act_off[l]);                   /* (M, in) */
        if (m->layers[l].activation != DSGD_ACT_NONE) {
            r = m->be.act_backward(m->be.impl, m->layers[l].activation, d,
                                   dsgd__ref(m->acts, m->act_off[l + 1]), (size_t)M * out);
            if (r != DSGD_OK) return r;
        }
        /* dW(in, out) = x^T d */
        r = m->be.gemm(m->be.impl, 1, 0, in, out, M, 1.0f, x, in, d, out, 0.0f, dsgd__ref(m->grads, k->offset), out);
        if (r != DSGD_OK) return r;
        /* db(out) = column sums of d */
        r = m->be.bias_backward(m->be.impl, dsgd__ref(m->grads, b->offset), d, M, out);
        if (r != DSGD_OK) return r;
        if (l > 0) {
            /* dx(M, in) = d W^T */
            r = m->be.gemm(m->be.impl, 0, 1, M, in, out, 1.0f, d, out, dsgd__ref(m->params, k->offset), out, 0.0f, dprev, in);
            if (r != DSGD_OK) return r;
            cur = 1 - cur;
        }
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_model_compute_gradients(dsgd_model *m, const float *x, const float *y, int count,
                                                  float grad_scale) {
    dsgd_result r;
    const char *what = "dsgd_model_compute_gradients";
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!y) return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: y is NULL", what);
    if ((r = dsgd__model_upload(m, x, y, count, what)) != DSGD_OK) return r;
    if ((r = dsgd__model_forward(m, count)) != DSGD_OK) return r;
    r = m->be.loss(m->be.impl, m->loss, count, m->dims[m->num_layers], dsgd__ref(m->acts, m->act_off[m->num_layers]),
                   dsgd__ref(m->targets, 0), grad_scale, dsgd__ref(m->delta, 0), dsgd__ref(m->stats, 0));
    if (r != DSGD_OK) return r;
    m->count[DSGD_METRICS_TRAIN] += count;
    return dsgd__model_backward(m, count);
}

DSGD_API dsgd_result dsgd_model_eval_batch(dsgd_model *m, const float *x, const float *y, int count) {
    dsgd_result r;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__model_upload(m, x, y, count, "dsgd_model_eval_batch")) != DSGD_OK) return r;
    if ((r = dsgd__model_forward(m, count)) != DSGD_OK) return r;
    if (!y) return DSGD_OK;
    r = m->be.loss(m->be.impl, m->loss, count, m->dims[m->num_layers], dsgd__ref(m->acts, m->act_off[m->num_layers]),
                   dsgd__ref(m->targets, 0), 0.0f, dsgd__ref(NULL, 0), dsgd__ref(m->stats, 2));
    if (r == DSGD_OK) m->count[DSGD_METRICS_EVAL] += count;
    return r;
}

DSGD_API dsgd_result dsgd_model_read_output(dsgd_model *m, float *dst, int count) {
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!dst || count <= 0 || count > m->last_count)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_model_read_output: %d rows requested, the last forward pass had %d",
                                  count, m->last_count);
    return m->be.read(m->be.impl, dsgd__ref(m->acts, m->act_off[m->num_layers]), dst,
                      (size_t)count * m->dims[m->num_layers]);
}

DSGD_API dsgd_result dsgd_model_take_metrics(dsgd_model *m, dsgd_metrics_slot slot, dsgd_metrics *out) {
    float s[2];
    dsgd_result r;
    size_t off;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out || (slot != DSGD_METRICS_TRAIN && slot != DSGD_METRICS_EVAL))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_take_metrics: bad slot or NULL out");
    off = slot == DSGD_METRICS_TRAIN ? 0 : 2;
    if ((r = m->be.read(m->be.impl, dsgd__ref(m->stats, off), s, 2)) != DSGD_OK) return r;
    if ((r = m->be.fill(m->be.impl, dsgd__ref(m->stats, off), 0.0f, 2)) != DSGD_OK) return r;
    out->loss_sum = s[0];
    out->correct = s[1];
    out->count = m->count[slot];
    m->count[slot] = 0.0;
    return DSGD_OK;
}

/* >>optimizer -------------------------------------------------------------- */

struct dsgd_optimizer {
    dsgd_model *m;
    dsgd_optimizer_desc d; /* defaults filled */
    dsgd_buffer *m1, *m2;
    int64_t t;
    double last_norm;
};

/* The one place optimizer defaults are filled. */
static dsgd_optimizer_desc dsgd__optimizer_defaults(const dsgd_optimizer_desc *in) {
    dsgd_optimizer_desc d = *in;
    if (d.lr == 0.0f) d.lr = 0.01f;
    if (d.momentum == 0.0f && d.kind == DSGD_OPT_MOMENTUM) d.momentum = 0.9f;
    if (d.beta1 == 0.0f) d.beta1 = 0.9f;
    if (d.beta2 == 0.0f) d.beta2 = 0.999f;
    if (d.eps == 0.0f) d.eps = 1e-8f;
    if (d.schedule.gamma == 0.0f) d.schedule.gamma = 0.1f;
    return d;
}

DSGD_API float dsgd_lr_at(const dsgd_lr_schedule *s, float lr, int64_t t) {
    double u, T, gamma;
    if (!s) return lr;
    if (t < 0) t = 0;
    if (t < s->warmup_steps)
        return (float)(s->warmup_start_lr + ((double)lr - s->warmup_start_lr) * (double)t / (double)s->warmup_steps);
    u = (double)(t - DSGD__MAX(s->warmup_steps, 0));
    switch (s->kind) {
    case DSGD_SCHEDULE_COSINE:
        T = (double)(s->total_steps - DSGD__MAX(s->warmup_steps, 0));
        if (T <= 0.0 || u >= T) return s->final_lr;
        return (float)(s->final_lr + ((double)lr - s->final_lr) * 0.5 * (1.0 + cos(3.141592653589793 * u / T)));
    case DSGD_SCHEDULE_STEP:
        if (s->step_size <= 0) return lr;
        gamma = s->gamma == 0.0f ? 0.1 : (double)s->gamma;
        return (float)((double)lr * pow(gamma, floor(u / (double)s->step_size)));
    default:
        return lr;
    }
}

DSGD_API float dsgd_linear_scaled_lr(float base_lr, int global_batch, int base_batch) {
    if (base_batch <= 0) return base_lr;
    return (float)((double)base_lr * global_batch / base_batch);
}

DSGD_API dsgd_result dsgd_optimizer_create(dsgd_model *m, const dsgd_optimizer_desc *desc, dsgd_optimizer **out) {
    dsgd_optimizer *o;
    dsgd_optimizer_desc d;
    dsgd_result r = DSGD_OK;
    const char *what = "dsgd_optimizer_create";
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!desc || !out) return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: desc or out is NULL", what);
    *out = NULL;
    d = dsgd__optimizer_defaults(desc);
    if ((int)d.kind < 0 || (int)d.kind > (int)DSGD_OPT_ADAMW)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown optimizer kind %d", what, (int)d.kind);
    if (!(d.lr > 0.0f) || !isfinite(d.lr) || !(d.weight_decay >= 0.0f) || !(d.clip_norm >= 0.0f))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: lr %g must be > 0, weight_decay %g and clip_norm %g >= 0", what, (double)d.lr,
                                  (double)d.weight_decay, (double)d.clip_norm);
    if (!(d.momentum >= 0.0f && d.momentum < 1.0f) || !(d.beta1 >= 0.0f && d.beta1 < 1.0f) ||
        !(d.beta2 >= 0.0f && d.beta2 < 1.0f) || !(d.eps > 0.0f))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: momentum %g, beta1 %g, beta2 %g must lie in [0, 1) and eps %g > 0", what,
                                  (double)d.momentum, (double)d.beta1, (double)d.beta2, (double)d.eps);
    if ((int)d.schedule.kind < 0 || (int)d.schedule.kind > (int)DSGD_SCHEDULE_STEP || d.schedule.warmup_steps < 0 ||
        (d.schedule.kind == DSGD_SCHEDULE_STEP && d.schedule.step_size <= 0) ||
        (d.schedule.kind == DSGD_SCHEDULE_COSINE && d.schedule.total_steps <= d.schedule.warmup_steps))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: bad schedule (kind %d, warmup_steps %lld, step_size %lld, total_steps %lld)", what,
                                  (int)d.schedule.kind, (long long)d.schedule.warmup_steps,
                                  (long long)d.schedule.step_size, (long long)d.schedule.total_steps);
    o = (dsgd_optimizer *)dsgd__alloc(m->ctx, sizeof(*o), what);
    if (!o) return DSGD_ERR_OUT_OF_MEMORY;
    memset(o, 0, sizeof(*o));
    o->m = m;
    o->d = d;
    if (d.kind != DSGD_OPT_SGD) {
        r = m->be.buffer_create(m->be.impl, m->num_params, &o->m1);
        if (r == DSGD_OK) r = m->be.fill(m->be.impl, dsgd__ref(o->m1, 0), 0.0f, m->num_params);
    }
    if (r == DSGD_OK && (d.kind == DSGD_OPT_ADAM || d.kind == DSGD_OPT_ADAMW)) {
        r = m->be.buffer_create(m->be.impl, m->num_params, &o->m2);
        if (r == DSGD_OK) r = m->be.fill(m->be.impl, dsgd__ref(o->m2, 0), 0.0f, m->num_params);
    }
    if (r != DSGD_OK) {
        dsgd_optimizer_destroy(o);
        return r;
    }
    *out = o;
    return DSGD_OK;
}

DSGD_API void dsgd_optimizer_destroy(dsgd_optimizer *o) {
    if (!o) return;
    if (o->m1) o->m->be.buffer_destroy(o->m->be.impl, o->m1);
    if (o->m2) o->m->be.buffer_destroy(o->m->be.impl, o->m2);
    DSGD_FREE(o);
}

DSGD_API dsgd_result dsgd_optimizer_step(dsgd_optimizer *o) {
    dsgd_model *m;
    dsgd_opt_update u;
    dsgd_result r;
    if (!o) return DSGD_ERR_INVALID_ARGUMENT;
    m = o->m;
    memset(&u, 0, sizeof(u));
    u.grad_scale = 1.0f;
    if (o->d.clip_norm > 0.0f) {
        /* clip_by_global_norm: g * clip / max(norm, clip) */
        double sumsq = 0.0;
        size_t bad = 0;
        r = m->be.norm_check(m->be.impl, dsgd__ref(m->grads, 0), m->num_params, &sumsq, &bad);
        if (r != DSGD_OK) return r;
        if (bad)
            return dsgd_ctx_set_error(m->ctx, DSGD_ERR_NON_FINITE,
                                      "dsgd_optimizer_step: step %lld: %zu gradient values are NaN or infinite; nothing updated",
                                      (long long)o->t, bad);
        o->last_norm = sqrt(sumsq);
        if (o->last_norm > o->d.clip_norm) u.grad_scale = (float)(o->d.clip_norm / o->last_norm);
    }
    u.kind = o->d.kind;
    u.lr = dsgd_lr_at(&o->d.schedule, o->d.lr, o->t);
    u.momentum = o->d.momentum;
    u.nesterov = o->d.nesterov;
    u.beta1 = o->d.beta1;
    u.beta2 = o->d.beta2;
    u.eps = o->d.eps;
    u.weight_decay = o->d.weight_decay;
    u.bias_correction1 = (float)(1.0 - pow((double)o->d.beta1, (double)(o->t + 1)));
    u.bias_correction2 = (float)(1.0 - pow((double)o->d.beta2, (double)(o->t + 1)));
    r = m->be.optimizer_update(m->be.impl, &u, dsgd__ref(m->params, 0), dsgd__ref(m->grads, 0), dsgd__ref(o->m1, 0),
                               dsgd__ref(o->m2, 0), m->num_params);
    if (r == DSGD_OK) ++o->t;
    return r;
}

DSGD_API int64_t dsgd_optimizer_steps(const dsgd_optimizer *o) { return o ? o->t : 0; }
DSGD_API double dsgd_optimizer_last_grad_norm(const dsgd_optimizer *o) { return o ? o->last_norm : 0.0; }

DSGD_API int dsgd_optimizer_num_slots(const dsgd_optimizer *o) { return o ? (o->m1 != NULL) + (o->m2 != NULL) : 0; }

DSGD_API const char *dsgd_optimizer_slot_name(const dsgd_optimizer *o, int slot) {
    if (!o || slot < 0 || slot >= dsgd_optimizer_num_slots(o)) return NULL;
    if (o->d.kind == DSGD_OPT_MOMENTUM) return "momentum";
    return slot == 0 ? "m" : "v";
}

DSGD_API dsgd_result dsgd_optimizer_read_slot(dsgd_optimizer *o, int slot, size_t offset, size_t count, float *dst) {
    const char *what = "dsgd_optimizer_read_slot";
    if (!o) return DSGD_ERR_INVALID_ARGUMENT;
    if (!dst && count > 0) return dsgd_ctx_set_error(o->m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: dst is NULL", what);
    if (!dsgd_optimizer_slot_name(o, slot))
        return dsgd_ctx_set_error(o->m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: slot %d; this optimizer has %d", what,
                                  slot, dsgd_optimizer_num_slots(o));
    if (offset > o->m->num_params || count > o->m->num_params - offset)
        return dsgd_ctx_set_error(o->m->ctx, DSGD_ERR_SHAPE, "%s: floats %zu..%zu, the model has %zu parameters",
                                  what, offset, offset + count, o->m->num_params);
    if (count == 0) return DSGD_OK;
    return o->m->be.read(o->m->be.impl, dsgd__ref(slot == 0 ? o->m1 : o->m2, offset), dst, count);
}


/* >>data ------------------------------------------------------------------- */

DSGD_API dsgd_result dsgd_dataset_alloc(dsgd_ctx *ctx, size_t n, int dim, int target_dim, int num_classes,
                                        dsgd_dataset *out) {
    size_t xs, ys;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_alloc: out is NULL");
    memset(out, 0, sizeof(*out));
    if (dim <= 0 || target_dim <= 0 || num_classes < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_dataset_alloc: dim %d and target_dim %d must be > 0, num_classes %d >= 0", dim,
                                  target_dim, num_classes);
    if (dsgd__mul_overflows(n, (size_t)dim, &xs) || dsgd__mul_overflows(xs, sizeof(float), &xs) ||
        dsgd__mul_overflows(n, (size_t)target_dim, &ys) || dsgd__mul_overflows(ys, sizeof(float), &ys))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_dataset_alloc: %zu samples overflow size_t", n);
    out->x = (float *)dsgd__alloc(ctx, xs, "dsgd_dataset_alloc");
    out->y = (float *)dsgd__alloc(ctx, ys, "dsgd_dataset_alloc");
    if (!out->x || !out->y) {
        dsgd_dataset_free(out);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    memset(out->x, 0, xs);
    memset(out->y, 0, ys);
    out->n = n;
    out->dim = dim;
    out->target_dim = target_dim;
    out->num_classes = num_classes;
    return DSGD_OK;
}

DSGD_API void dsgd_dataset_free(dsgd_dataset *ds) {
    if (!ds) return;
    DSGD_FREE(ds->x);
    DSGD_FREE(ds->y);
    memset(ds, 0, sizeof(*ds));
}

DSGD_API dsgd_result dsgd_dataset_gather(const dsgd_dataset *ds, const size_t *idx, size_t count, float *x, float *y) {
    size_t i;
    if (!ds || (count && (!idx || !x || !y))) return DSGD_ERR_INVALID_ARGUMENT;
    for (i = 0; i < count; ++i)
        if (idx[i] >= ds->n) return DSGD_ERR_INVALID_ARGUMENT;
    for (i = 0; i < count; ++i) {
        size_t s = idx[i];
        memcpy(x + i * ds->dim, ds->x + s * ds->dim, sizeof(float) * ds->dim);
        memcpy(y + i * ds->target_dim, ds->y + s * ds->target_dim, sizeof(float) * ds->target_dim);
    }
    return DSGD_OK;
}

/* Fisher-Yates shuffle of 0..n-1 driven by seed. */
static void dsgd__permutation(size_t *order, size_t n, uint64_t seed, int shuffle) {
    size_t i;
    uint64_t st = seed;
    for (i = 0; i < n; ++i) order[i] = i;
    if (!shuffle) return;
    for (i = n; i > 1; --i) {
        size_t j = dsgd__rng_below(&st, i), t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

DSGD_API dsgd_result dsgd_dataset_split(dsgd_ctx *ctx, const dsgd_dataset *src, size_t first, uint64_t seed,
                                        dsgd_dataset *a, dsgd_dataset *b) {
    size_t *order;
    dsgd_result r;
    if (!src || !a || !b || !src->x || !src->y)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_split: NULL argument");
    memset(a, 0, sizeof(*a));
    memset(b, 0, sizeof(*b));
    if (first > src->n)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_split: first %zu exceeds the %zu samples",
                                  first, src->n);
    order = (size_t *)dsgd__alloc(ctx, sizeof(size_t) * src->n, "dsgd_dataset_split");
    if (!order) return DSGD_ERR_OUT_OF_MEMORY;
    dsgd__permutation(order, src->n, dsgd__seed_mix(seed, 0x5911u), 1);
    r = dsgd_dataset_alloc(ctx, first, src->dim, src->target_dim, src->num_classes, a);
    if (r == DSGD_OK) r = dsgd_dataset_alloc(ctx, src->n - first, src->dim, src->target_dim, src->num_classes, b);
    if (r == DSGD_OK) {
        dsgd_dataset_gather(src, order, first, a->x, a->y);
        dsgd_dataset_gather(src, order + first, src->n - first, b->x, b->y);
    } else {
        dsgd_dataset_free(a);
        dsgd_dataset_free(b);
    }
    DSGD_FREE(order);
    return r;
}

DSGD_API dsgd_result dsgd_sampler_init(dsgd_ctx *ctx, dsgd_sampler *s, size_t n, size_t batch, uint64_t seed,
                                       int shuffle, int drop_last) {
    if (!s) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_sampler_init: sampler is NULL");
    memset(s, 0, sizeof(*s));
    if (n == 0 || batch == 0 || (drop_last && batch > n))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_sampler_init: %zu samples in batches of %zu%s gives no batch", n, batch,
                                  drop_last ? " (drop_last)" : "");
    s->order = (size_t *)dsgd__alloc(ctx, sizeof(size_t) * n, "dsgd_sampler_init");
    if (!s->order) return DSGD_ERR_OUT_OF_MEMORY;
    s->n = n;
    s->batch = batch;
    s->seed = seed;
    s->shuffle = shuffle;
    s->drop_last = drop_last;
    dsgd_sampler_set_epoch(s, 0);
    return DSGD_OK;
}

DSGD_API void dsgd_sampler_free(dsgd_sampler *s) {
    if (!s) return;
    DSGD_FREE(s->order);
    memset(s, 0, sizeof(*s));
}

DSGD_API void dsgd_sampler_set_epoch(dsgd_sampler *s, uint64_t epoch) {
    if (!s || !s->order) return;
    s->epoch = epoch;
    dsgd__permutation(s->order, s->n, dsgd__seed_mix(s->seed, epoch), s->shuffle);
}

DSGD_API size_t dsgd_sampler_num_batches(const dsgd_sampler *s) {
    if (!s || !s->batch) return 0;
    return s->drop_last ? s->n / s->batch : (s->n + s->batch - 1) / s->batch;
}

DSGD_API size_t dsgd_sampler_batch(const dsgd_sampler *s, size_t b, const size_t **idx) {
    size_t start;
    if (!s || b >= dsgd_sampler_num_batches(s)) return 0;
    start = b * s->batch;
    if (idx) *idx = s->order + start;
    return DSGD__MIN(s->batch, s->n - start);
}

/* >>loaders ---------------------------------------------------------------- */

/* Opens path and returns its size, or records an error. Only regular files:
   the open is non-blocking, so a FIFO with no writer (or a device) fails at
   once instead of blocking in open(); the type is checked on the opened
   descriptor, so a path swapped after the check cannot slip through. */
static FILE *dsgd__open_sized(dsgd_ctx *ctx, const char *path, size_t *size) {
    FILE *f;
    long end;
    struct stat st;
    int fd, flags;
    if (!path) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "file path is NULL");
        return NULL;
    }
    fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb"))) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot determine the file size", path);
        fclose(f);
        return NULL;
    }
    *size = (size_t)end;
    return f;
}

/* Reads an IDX header of unsigned bytes with `want_dims` dimensions; fills
   dims and checks that the file holds exactly the data the header claims. */
static dsgd_result dsgd__idx_header(dsgd_ctx *ctx, FILE *f, const char *path, size_t fsize, int want_dims,
                                    uint32_t *dims, size_t *items) {
    unsigned char h[4 + 4 * 3];
    size_t hlen = 4 + 4 * (size_t)want_dims, total = 1, data;
    int d;
    if (fsize < 4 || fread(h, 1, 4, f) != 4)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: truncated IDX header: %zu bytes, need at least 4", path, fsize);
    if (h[0] != 0 || h[1] != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT,
                                  "%s: bad IDX magic %02x %02x %02x %02x at offset 0 (the first two bytes must be 0)",
                                  path, h[0], h[1], h[2], h[3]);
    if (h[2] != 0x08)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT,
                                  "%s: IDX data type 0x%02x at offset 2 is not supported (only 0x08, unsigned byte)",
                                  path, h[2]);
    if (h[3] != want_dims)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: IDX file has %d dimensions at offset 3, expected %d", path,
                                  h[3], want_dims);
    if (fsize < hlen || fread(h + 4, 1, hlen - 4, f) != hlen - 4)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: truncated IDX header: %zu bytes, need %zu", path, fsize, hlen);
    for (d = 0; d < want_dims; ++d) {
        const unsigned char *p = h + 4 + 4 * d;
        dims[d] = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
        if (dsgd__mul_overflows(total, dims[d], &total))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: IDX dimensions overflow size_t (dimension %d is %u)", path,
                                      d, (unsigned)dims[d]);
    }
    data = fsize - hlen;
    if (data < total)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT,
                                  "%s: truncated: the header (offset 4..%zu) promises %zu data bytes, the file holds %zu",
                                  path, hlen, total, data);
    if (data > total)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: %zu unexpected bytes after the data, from offset %zu", path,
                                  data - total, hlen + total);
    *items = total;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_dataset_load_idx(dsgd_ctx *ctx, const char *images_path, const char *labels_path,
                                           int num_classes, dsgd_dataset *out) {
    FILE *fi = NULL, *fl = NULL;
    size_t isize = 0, lsize = 0, items = 0, litems = 0, i, dim;
    uint32_t idims[3] = {0, 0, 0}, ldims[1] = {0};
    unsigned char buf[4096];
    dsgd_result r;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_load_idx: out is NULL");
    memset(out, 0, sizeof(*out));
    if (num_classes == 0) num_classes = 10;
    if (num_classes < 0 || num_classes > 256)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_load_idx: num_classes %d outside 1..256",
                                  num_classes);
    fi = dsgd__open_sized(ctx, images_path, &isize);
    if (!fi) return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO;
    fl = dsgd__open_sized(ctx, labels_path, &lsize);
    if (!fl) {
        fclose(fi);
        return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO;
    }
    r = dsgd__idx_header(ctx, fi, images_path, isize, 3, idims, &items);
    if (r == DSGD_OK) r = dsgd__idx_header(ctx, fl, labels_path, lsize, 1, ldims, &litems);
    if (r == DSGD_OK && idims[0] != ldims[0])
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s holds %u images but %s holds %u labels", images_path,
                               (unsigned)idims[0], labels_path, (unsigned)ldims[0]);
    if (r == DSGD_OK && idims[0] == 0)
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: the header (offset 4) says it holds no images", images_path);
    if (r == DSGD_OK && (idims[1] == 0 || idims[2] == 0 || (size_t)idims[1] * idims[2] > (1u << 24)))
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: image size %ux%u is not supported", images_path,
                               (unsigned)idims[1], (unsigned)idims[2]);
    if (r == DSGD_OK) {
        dim = (size_t)idims[1] * idims[2];
        /* sizes are now bounded by the file's real size */
        r = dsgd_dataset_alloc(ctx, idims[0], (int)dim, 1, num_classes, out);
    }
    for (i = 0; r == DSGD_OK && i < items;) {
        size_t k, got = fread(buf, 1, DSGD__MIN(sizeof(buf), items - i), fi);
        if (got == 0) {
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: read failed at byte %zu", images_path, 16 + i);
            break;
        }
        for (k = 0; k < got; ++k) out->x[i + k] = (float)buf[k] * (1.0f / 255.0f);
        i += got;
    }
    for (i = 0; r == DSGD_OK && i < litems;) {
        size_t k, got = fread(buf, 1, DSGD__MIN(sizeof(buf), litems - i), fl);
        if (got == 0) {
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: read failed at byte %zu", labels_path, 8 + i);
            break;
        }
        for (k = 0; k < got && r == DSGD_OK; ++k) {
            if (buf[k] >= num_classes)
                r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: label %u of sample %zu (offset %zu) is outside [0, %d)",
                                       labels_path, buf[k], i + k, 8 + i + k, num_classes);
            out->y[i + k] = (float)buf[k];
        }
        i += got;
    }
    fclose(fi);
    fclose(fl);
    if (r != DSGD_OK) dsgd_dataset_free(out);
    return r;
}

/* Reads a whole text file into a NUL-terminated buffer. */
static char *dsgd__read_text(dsgd_ctx *ctx, const char *path, size_t *len) {
    size_t size = 0;
    char *text;
    FILE *f = dsgd__open_sized(ctx, path, &size);
    if (!f) return NULL;
    if (size == SIZE_MAX) {
        fclose(f);
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: too large", path);
        return NULL;
    }
    text = (char *)dsgd__alloc(ctx, size + 1, path);
    if (text && fread(text, 1, size, f) != size) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: read failed", path);
        DSGD_FREE(text);
        text = NULL;
    }
    fclose(f);
    if (text) {
        text[size] = '\0';
        *len = size;
    }
    return text;
}

/* One CSV line: [p, end) without the line terminator. */
static const char *dsgd__csv_line(const char *p, const char *stop, const char **end) {
    const char *e = p;
    while (e < stop && *e != '\n') ++e;
    *end = (e > p && e[-1] == '\r') ? e - 1 : e;
    return e < stop ? e + 1 : stop;
}

static int dsgd__csv_blank(const char *p, const char *end) {
    for (; p < end; ++p)
        if (*p != ' ' && *p != '\t') return 0;
    return 1;
}

static size_t dsgd__csv_fields(const char *p, const char *end) {
    size_t n = 1;
    for (; p < end; ++p) n += *p == ',';
    return n;
}

/* Parses the field [p, end) as a finite number. */
static int dsgd__csv_number(const char *p, const char *end, double *v) {
    char tmp[64], *stop;
    size_t len;
    while (p < end && (*p == ' ' || *p == '\t')) ++p;
    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) --end;
    len = (size_t)(end - p);
    if (len == 0 || len >= sizeof(tmp)) return 0;
    memcpy(tmp, p, len);
    tmp[len] = '\0';
    *v = strtod(tmp, &stop);
    return *stop == '\0' && isfinite(*v);
}

DSGD_API dsgd_result dsgd_dataset_load_csv(dsgd_ctx *ctx, const char *path, const dsgd_csv_desc *desc,
                                           dsgd_dataset *out) {
    dsgd_csv_desc d;
    size_t len = 0, fields = 0, rows = 0, line_no, row;
    const char *p, *stop, *end;
    char *text;
    int label_col, max_label = -1, c;
    float scale;
    dsgd_result r = DSGD_OK;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_load_csv: out is NULL");
    memset(out, 0, sizeof(*out));
    memset(&d, 0, sizeof(d));
    if (desc) d = *desc;
    if (d.label_column < 0 || d.num_classes < 0 || d.header_lines < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_dataset_load_csv: label_column %d, num_classes %d, header_lines %d must be >= 0",
                                  d.label_column, d.num_classes, d.header_lines);
    if (!(d.feature_scale >= 0.0f) || !isfinite(d.feature_scale))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_dataset_load_csv: feature_scale %g must be finite and >= 0 (0: 1)",
                                  (double)d.feature_scale);
    scale = d.feature_scale == 0.0f ? 1.0f : d.feature_scale;
    text = dsgd__read_text(ctx, path, &len);
    if (!text) return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO; /* ctx may be NULL */
    stop = text + len;

    /* pass 1: shape */
    p = text;
    for (line_no = 1; p < stop; ++line_no) {
        const char *line = p;
        size_t nf;
        p = dsgd__csv_line(p, stop, &end);
        if ((int)line_no <= d.header_lines || dsgd__csv_blank(line, end)) continue;
        if (memchr(line, '\0', (size_t)(end - line))) {
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: line %zu holds a NUL byte", path, line_no);
            break;
        }
        nf = dsgd__csv_fields(line, end);
        if (rows == 0) {
            fields = nf;
            if (fields < 2 || fields > (1u << 20)) {
                r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: line %zu has %zu fields; need 2 or more (features and a label)",
                                       path, line_no, fields);
                break;
            }
        } else if (nf != fields) {
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: line %zu has %zu fields, the first data line has %zu", path,
                                   line_no, nf, fields);
            break;
        }
        ++rows;
    }
    if (r == DSGD_OK && rows == 0) r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: no data lines", path);
    label_col = d.label_column == 0 ? (int)fields : d.label_column;
    if (r == DSGD_OK && (size_t)label_col > fields)
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: label column %d, but lines have %zu fields", path, label_col, fields);
    if (r == DSGD_OK) r = dsgd_dataset_alloc(ctx, rows, (int)fields - 1, 1, d.num_classes, out);

    /* pass 2: values */
    p = text;
    row = 0;
    for (line_no = 1; r == DSGD_OK && p < stop; ++line_no) {
        const char *line = p, *f;
        size_t col = 0;
        p = dsgd__csv_line(p, stop, &end);
        if ((int)line_no <= d.header_lines || dsgd__csv_blank(line, end)) continue;
        for (f = line; r == DSGD_OK && col < fields; ++col) {
            const char *fe = f;
            double v;
            while (fe < end && *fe != ',') ++fe;
            if (!dsgd__csv_number(f, fe, &v)) {
                int shown = (int)DSGD__MIN((size_t)(fe - f), (size_t)40);
                r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: line %zu, column %zu: '%.*s' is not a finite number",
                                       path, line_no, col + 1, shown, f);
                break;
            }
            if ((int)col + 1 == label_col) {
                if (v != floor(v) || v < 0 || v >= (d.num_classes ? d.num_classes : (1 << 20))) {
                    r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT,
                                           "%s: line %zu, column %zu: label %g is not an integer in [0, %d)", path, line_no,
                                           col + 1, v, d.num_classes ? d.num_classes : (1 << 20));
                    break;
                }
                out->y[row] = (float)v;
                if ((int)v > max_label) max_label = (int)v;
            } else {
                /* in double, then checked: 1e300, or a finite field times a
                   large scale, would be an infinite float */
                float xv = (float)(v * (double)scale);
                if (!isfinite(xv)) {
                    int shown = (int)DSGD__MIN((size_t)(fe - f), (size_t)40);
                    r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT,
                                           "%s: line %zu, column %zu: '%.*s' times feature_scale %g is outside the "
                                           "float range",
                                           path, line_no, col + 1, shown, f, (double)scale);
                    break;
                }
                c = (int)col - ((int)col + 1 > label_col ? 1 : 0);
                out->x[row * out->dim + (size_t)c] = xv;
            }
            f = fe + 1;
        }
        ++row;
    }
    DSGD_FREE(text);
    if (r != DSGD_OK) {
        dsgd_dataset_free(out);
        return r;
    }
    if (!d.num_classes) out->num_classes = max_label + 1;
    return DSGD_OK;
}

#endif /* DISTSGD_IMPLEMENTATION */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__COLLECTIVES_IMPL)
#define DSGD__COLLECTIVES_IMPL

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

/* >>atomics ---------------------------------------------------------------- */
/* GCC/Clang builtins (C and C++ alike; no <stdatomic.h>, so C++11 users
   compile this too). Sequentially consistent where a sleeper and a waker
   must see each other's stores (the "sleeping" flag against the queue
   indices); acquire/release elsewhere. */
#if defined(__GNUC__) || defined(__clang__)
#define DSGD__LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define DSGD__LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define DSGD__LOAD_SC(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define DSGD__STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define DSGD__STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define DSGD__STORE_SC(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define DSGD__CAS(p, expected, desired) \
    __atomic_compare_exchange_n((p), (expected), (desired), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#else
#error "distsgd: the loopback transport needs GCC or Clang (__atomic builtins)"
#endif

#if defined(__x86_64__) || defined(__i386__)
#define DSGD__PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define DSGD__PAUSE() __asm__ __volatile__("yield" ::: "memory")
#else
#define DSGD__PAUSE() ((void)0)
#endif

/* >>reduce kernels --------------------------------------------------------- */
/* Unrolled by 8 with restrict pointers so that compilers vectorise them at -O2. */

static void dsgd__sum_into(float *DSGD__RESTRICT d, const float *DSGD__RESTRICT s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        d[i + 0] += s[i + 0]; d[i + 1] += s[i + 1]; d[i + 2] += s[i + 2]; d[i + 3] += s[i + 3];
        d[i + 4] += s[i + 4]; d[i + 5] += s[i + 5]; d[i + 6] += s[i + 6]; d[i + 7] += s[i + 7];
    }
    for (; i < n; ++i) d[i] += s[i];
}

/* t = a + b */
static void dsgd__sum2(float *DSGD__RESTRICT t, const float *DSGD__RESTRICT a, const float *DSGD__RESTRICT b,
                       size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        t[i + 0] = a[i + 0] + b[i + 0]; t[i + 1] = a[i + 1] + b[i + 1];
        t[i + 2] = a[i + 2] + b[i + 2]; t[i + 3] = a[i + 3] + b[i + 3];
        t[i + 4] = a[i + 4] + b[i + 4]; t[i + 5] = a[i + 5] + b[i + 5];
        t[i + 6] = a[i + 6] + b[i + 6]; t[i + 7] = a[i + 7] + b[i + 7];
    }
    for (; i < n; ++i) t[i] = a[i] + b[i];
}

/* max(a, b) and min(a, b) that propagate a NaN in either operand */
#define DSGD__FMAX(a, b) (((a) >= (b) || (a) != (a)) ? (a) : (b))
#define DSGD__FMIN(a, b) (((a) <= (b) || (a) != (a)) ? (a) : (b))

/* d[i] = op(d[i], s[i]), or op(s[i], d[i]) when s_first. The operand order
   matters only for NaN payloads and signed zeros; recursive doubling fixes it
   so that two ranks reducing the same pair compute the very same operation. */
static void dsgd__reduce_into(float *DSGD__RESTRICT d, const float *DSGD__RESTRICT s, size_t n,
                              dsgd_reduce_op op, int s_first) {
    size_t i;
    switch (op) {
    case DSGD_REDUCE_MAX:
        if (s_first) {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMAX(s[i], d[i]);
        } else {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMAX(d[i], s[i]);
        }
        break;
    case DSGD_REDUCE_MIN:
        if (s_first) {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMIN(s[i], d[i]);
        } else {
            for (i = 0; i < n; ++i) d[i] = DSGD__FMIN(d[i], s[i]);
        }
        break;
    default: /* SUM, MEAN */
        if (s_first) {
            for (i = 0; i < n; ++i) d[i] = s[i] + d[i];
        } else {
            dsgd__sum_into(d, s, n);
        }
        break;
    }
}

static void dsgd__divide(float *d, size_t n, int by) {
    float k = (float)by;
    size_t i;
    for (i = 0; i < n; ++i) d[i] = d[i] / k;
}

/* >>transport -------------------------------------------------------------- */

DSGD_API const char *dsgd_reduce_op_name(dsgd_reduce_op op) {
    switch (op) {
    case DSGD_REDUCE_SUM: return "sum";
    case DSGD_REDUCE_MEAN: return "mean";
    case DSGD_REDUCE_MAX: return "max";
    case DSGD_REDUCE_MIN: return "min";
    default: return "unknown";
    }
}

DSGD_API const char *dsgd_allreduce_algo_name(dsgd_allreduce_algo algo) {
    switch (algo) {
    case DSGD_ALLREDUCE_AUTO: return "auto";
    case DSGD_ALLREDUCE_RING: return "ring";
    case DSGD_ALLREDUCE_HALVING_DOUBLING: return "halving_doubling";
    case DSGD_ALLREDUCE_REDUCE_BROADCAST: return "reduce_broadcast";
    case DSGD_ALLREDUCE_RECURSIVE_DOUBLING: return "recursive_doubling";
    case DSGD_ALLREDUCE_DIRECT: return "direct";
    default: return "unknown";
    }
}

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
   condition variable. Why, measured with bench/allreduce.c on a 2-vCPU
   virtual machine shared with other work:
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

DSGD_API dsgd_result dsgd_loopback_create(dsgd_ctx *ctx, int n, dsgd_loopback **out) {
    dsgd_loopback *hub;
    pthread_condattr_t ca;
    size_t npairs;
    int i, inited = 0;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "loopback_create: out is NULL");
    *out = NULL;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (n < 1 || n > 4096)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "loopback_create: %d ranks (need 1..4096)", n);
    hub = (dsgd_loopback *)dsgd__alloc(ctx, sizeof(*hub), "loopback_create");
    if (!hub) return DSGD_ERR_OUT_OF_MEMORY;
    memset(hub, 0, sizeof(*hub));
    hub->ctx = ctx;
    hub->n = n;
    dsgd__lb_default_spin(hub);
    npairs = (size_t)n * (size_t)n;
    hub->ep_mem = dsgd__alloc(ctx, sizeof(dsgd__lb_ep) * (size_t)n + DSGD__LB_LINE, "loopback_create");
    hub->pair_mem = dsgd__alloc(ctx, sizeof(dsgd__lb_pair) * npairs + DSGD__LB_LINE, "loopback_create");
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

    /* Timed waits on CLOCK_MONOTONIC where the platform allows it, so that a
       wall-clock jump neither fires nor stretches a deadline. */
    if (pthread_condattr_init(&ca) != 0) goto fail;
#if !defined(__APPLE__)
    hub->cond_monotonic = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0;
#endif
    for (i = 0; i < n; ++i) {
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
    if (inited < n) {
        for (i = 0; i < inited; ++i) {
            pthread_cond_destroy(&hub->ep[i].cv);
            pthread_mutex_destroy(&hub->ep[i].mu);
        }
        goto fail;
    }
    *out = hub;
    return DSGD_OK;

fail:
    DSGD_FREE(hub->ep_mem);
    DSGD_FREE(hub->pair_mem);
    DSGD_FREE(hub);
    return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "loopback_create: cannot create a pthread mutex or condition");
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

/* The one transfer routine: posts a message to dst (dst >= 0) and takes one
   from src (src >= 0), copying it into rbuf (op < 0) or reducing it into rbuf
   as floats (op >= 0), until both are done, the deadline passes or the hub
   is aborted. */
static dsgd_result dsgd__lb_xfer(dsgd__lb_ep *e, int dst, uint64_t stag, const void *sbuf,
                                 size_t sbytes, int src, uint64_t rtag, void *rbuf,
                                 size_t rbytes, int op, double deadline, int *failed_peer) {
    dsgd_loopback *hub = e->hub;
    int n = hub->n, me = e->rank;
    dsgd__lb_pair *out = dst >= 0 ? &hub->pair[(size_t)me * (size_t)n + (size_t)dst] : NULL;
    dsgd__lb_pair *in = src >= 0 ? &hub->pair[(size_t)src * (size_t)n + (size_t)me] : NULL;
    int send_state = dst >= 0 ? 1 : 0; /* 1: to post, 2: rendezvous posted, 0: done */
    int recv_state = src >= 0 ? 1 : 0;
    uint64_t send_idx = 0;
    long spun_ns = 0;
    double spin_start = 0;
    int spins = 0;
    dsgd_result r = DSGD_OK;
    int blame = -1;

    for (;;) {
        int progressed = 0;
        if (send_state == 1) {
            uint64_t tail = DSGD__LOAD_RLX(&out->tail);
            if (tail - DSGD__LOAD_ACQ(&out->head) < DSGD__LB_QUEUE) {
                dsgd__lb_slot *s = &out->slot[tail % DSGD__LB_QUEUE];
                s->tag = stag;
                s->bytes = sbytes;
                if (sbytes <= DSGD__LB_EAGER_MAX) {
                    if (s->cap < sbytes) {
                        void *p = DSGD_REALLOC(s->store, sbytes);
                        if (!p) {
                            blame = dst;
                            r = dsgd__lb_fail(e, DSGD_ERR_OUT_OF_MEMORY, "out of memory for a message to", dst);
                            goto fail;
                        }
                        s->store = p;
                        s->cap = sbytes;
                    }
                    if (sbytes) memcpy(s->store, sbuf, sbytes);
                    s->ptr = s->store;
                    DSGD__STORE_RLX(&s->state, (int)DSGD__LB_EAGER);
                    send_state = 0;
                } else {
                    s->ptr = sbuf;
                    DSGD__STORE_RLX(&s->state, (int)DSGD__LB_RDV);
                    send_idx = tail;
                    send_state = 2;
                }
                DSGD__STORE_SC(&out->tail, tail + 1); /* publishes the slot */
                dsgd__lb_wake(&hub->ep[dst]);
                progressed = 1;
            }
        }
        if (recv_state == 1) {
            uint64_t head = DSGD__LOAD_RLX(&in->head);
            if (DSGD__LOAD_ACQ(&in->tail) > head) {
                dsgd__lb_slot *s = &in->slot[head % DSGD__LB_QUEUE];
                int st = DSGD__LOAD_ACQ(&s->state);
                blame = src;
                if (st != DSGD__LB_CANCELLED && (s->tag != rtag || s->bytes != rbytes)) {
                    /* Leave the message in place (unclaimed): the ranks are out of step. */
                    if (s->tag != rtag) {
                        snprintf(e->err, sizeof(e->err),
                                 "loopback rank %d: the message from rank %d has tag %016llx, expected %016llx "
                                 "(ranks out of step?)",
                                 me, src, (unsigned long long)s->tag, (unsigned long long)rtag);
                        r = DSGD_ERR_STATE;
                    } else {
                        snprintf(e->err, sizeof(e->err),
                                 "loopback rank %d: the message from rank %d has %zu bytes, expected %zu "
                                 "(different counts on different ranks?)",
                                 me, src, s->bytes, rbytes);
                        r = DSGD_ERR_SHAPE;
                    }
                    goto fail;
                }
                if (st == DSGD__LB_RDV) { /* claim it, unless its sender withdraws it first */
                    int expect = DSGD__LB_RDV;
                    if (!DSGD__CAS(&s->state, &expect, (int)DSGD__LB_TAKEN)) st = expect;
                }
                if (st == DSGD__LB_CANCELLED) {
                    DSGD__STORE_SC(&in->head, head + 1);
                    dsgd__lb_wake(&hub->ep[src]);
                    r = dsgd__lb_fail(e, DSGD_ERR_STATE, "a message was withdrawn (its sender failed) by", src);
                    goto fail;
                }
                if (rbytes) {
                    if (op < 0) memcpy(rbuf, s->ptr, rbytes);
                    else dsgd__reduce_into((float *)rbuf, (const float *)s->ptr, rbytes / sizeof(float),
                                           (dsgd_reduce_op)op, 0);
                }
                DSGD__STORE_SC(&in->head, head + 1); /* releases the slot (and a rendezvous sender) */
                dsgd__lb_wake(&hub->ep[src]);
                recv_state = 0;
                progressed = 1;
            }
        }
        if (send_state == 2 && DSGD__LOAD_ACQ(&out->head) > send_idx) {
            send_state = 0;
            progressed = 1;
        }
        if (!send_state && !recv_state) return DSGD_OK;
        if (DSGD__LOAD_ACQ(&hub->aborted)) {
            blame = recv_state ? src : dst;
            r = dsgd__lb_fail(e, DSGD_ERR_STATE, "the hub was aborted while waiting for", blame);
            goto fail;
        }
        if (progressed) {
            spins = 0;
            spun_ns = 0;
            continue;
        }
        /* Spin for spin_ns (reading the clock every 64 pauses), then sleep. */
        if (spins == 0) spin_start = dsgd_now();
        if (spun_ns < hub->spin_ns) {
            if (spun_ns < hub->pause_ns) {
                DSGD__PAUSE();
                if ((++spins & 63) == 0) spun_ns = (long)((dsgd_now() - spin_start) * 1e9);
            } else {
                sched_yield();
                ++spins;
                spun_ns = (long)((dsgd_now() - spin_start) * 1e9);
            }
            continue;
        }
        if (dsgd_now() >= deadline) {
            blame = recv_state ? src : dst;
            r = dsgd__lb_fail(e, DSGD_ERR_TIMEOUT, "the deadline passed while waiting for", blame);
            goto fail;
        }
        pthread_mutex_lock(&e->mu);
        DSGD__STORE_SC(&e->sleeping, 1);
        if (!(send_state == 1 && DSGD__LOAD_SC(&out->tail) - DSGD__LOAD_SC(&out->head) < DSGD__LB_QUEUE) &&
            !(recv_state == 1 && DSGD__LOAD_SC(&in->tail) > DSGD__LOAD_RLX(&in->head)) &&
            !(send_state == 2 && DSGD__LOAD_SC(&out->head) > send_idx) && !DSGD__LOAD_SC(&hub->aborted))
            dsgd__lb_timedwait(e, deadline);
        DSGD__STORE_SC(&e->sleeping, 0);
        pthread_mutex_unlock(&e->mu);
        /* After a wake-up spin again: the next message often follows. */
        spins = 0;
        spun_ns = 0;
    }

fail:
    if (send_state == 2) {
        /* Withdraw the posted buffer; if the receiver has claimed it, wait
           for it to finish reading (one copy, so this is short). */
        dsgd__lb_slot *s = &out->slot[send_idx % DSGD__LB_QUEUE];
        for (;;) {
            int expect = DSGD__LB_RDV;
            if (DSGD__CAS(&s->state, &expect, (int)DSGD__LB_CANCELLED)) break;
            if (DSGD__LOAD_ACQ(&out->head) > send_idx) break;
            sched_yield();
        }
    }
    if (failed_peer) *failed_peer = blame;
    return r;
}

/* >>loopback window -------------------------------------------------------- */

typedef int (*dsgd__lb_ready_fn)(dsgd__lb_ep *e, uint64_t tag);

/* Waits with the hub's spin policy until ready(e, tag), the deadline or an
   abort (DSGD_ERR_TIMEOUT, DSGD_ERR_STATE). ready must use SC loads. */
static dsgd_result dsgd__lb_wait(dsgd__lb_ep *e, dsgd__lb_ready_fn ready, uint64_t tag, double deadline) {
    dsgd_loopback *hub = e->hub;
    double start = dsgd_now();
    long spun = 0;
    int spins = 0;
    for (;;) {
        if (ready(e, tag)) return DSGD_OK;
        if (DSGD__LOAD_ACQ(&hub->aborted)) return DSGD_ERR_STATE;
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
            dsgd__lb_fail(e, DSGD_ERR_STATE, "a buffer was withdrawn (its rank failed) by", k);
            dsgd__lb_withdraw(e, tag);
            if (failed_peer) *failed_peer = k;
            return DSGD_ERR_STATE;
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
    return dsgd__lb_xfer(e, dst, tag, buf, bytes, -1, 0, NULL, 0, -1, deadline, NULL);
}

static dsgd_result dsgd__lb_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes,
                                 double deadline) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (src < 0) return dsgd__lb_fail(e, DSGD_ERR_INVALID_ARGUMENT, "invalid peer", src);
    if (dsgd__lb_check(e, src, NULL) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__lb_xfer(e, -1, 0, NULL, 0, src, tag, buf, bytes, -1, deadline, NULL);
}

static dsgd_result dsgd__lb_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf,
                                     size_t sbytes, int src, uint64_t rtag, void *rbuf,
                                     size_t rbytes, double deadline, int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (dsgd__lb_check(e, dst, failed_peer) != DSGD_OK || dsgd__lb_check(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__lb_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rbytes, -1, deadline, failed_peer);
}

static dsgd_result dsgd__lb_sendrecv_reduce(void *impl, int dst, uint64_t stag, const void *sbuf,
                                            size_t sbytes, int src, uint64_t rtag, float *rbuf,
                                            size_t rcount, dsgd_reduce_op op, double deadline,
                                            int *failed_peer) {
    dsgd__lb_ep *e = (dsgd__lb_ep *)impl;
    if (dsgd__lb_check(e, dst, failed_peer) != DSGD_OK || dsgd__lb_check(e, src, failed_peer) != DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    if ((int)op < 0 || (int)op > (int)DSGD_REDUCE_MIN)
        return dsgd__lb_fail(e, DSGD_ERR_INVALID_ARGUMENT, "unknown reduce op for a message from", src);
    return dsgd__lb_xfer(e, dst, stag, sbuf, sbytes, src, rtag, rbuf, rcount * sizeof(float), (int)op,
                         deadline, failed_peer);
}

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
    if (!out) return dsgd_ctx_set_error(hub->ctx, DSGD_ERR_INVALID_ARGUMENT, "loopback_endpoint: out is NULL");
    memset(out, 0, sizeof(*out));
    if (rank < 0 || rank >= hub->n)
        return dsgd_ctx_set_error(hub->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "loopback_endpoint: rank %d outside [0, %d)", rank, hub->n);
    out->name = "loopback";
    out->impl = &hub->ep[rank];
    out->rank = rank;
    out->size = hub->n;
    out->destroy = NULL;
    out->send = dsgd__lb_send;
    out->recv = dsgd__lb_recv;
    out->sendrecv = dsgd__lb_sendrecv;
    out->sendrecv_reduce = dsgd__lb_sendrecv_reduce;
    out->allreduce = NULL;
    out->now = NULL;
    out->error_message = dsgd__lb_error_message;
    out->set_progress = dsgd__lb_set_progress;
    out->peer_progress = dsgd__lb_peer_progress;
    out->share = dsgd__lb_share;
    out->unshare = dsgd__lb_unshare;
    return DSGD_OK;
}

/* >>collectives ------------------------------------------------------------ */

#define DSGD__COMM_DEFAULT_TIMEOUT 30.0
#define DSGD__COMM_DEFAULT_PIECE ((size_t)256 * 1024)
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
    void **peers;       /* size pointers, for the shared-memory hooks */
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
    double timeout = DSGD__COMM_DEFAULT_TIMEOUT;
    size_t piece = DSGD__COMM_DEFAULT_PIECE;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "comm_create: out is NULL");
    *out = NULL;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!t) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "comm_create: transport is NULL");
    if (t->size < 1 || t->rank < 0 || t->rank >= t->size)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "comm_create: rank %d of size %d (need size >= 1 and 0 <= rank < size)",
                                  t->rank, t->size);
    if (!t->send || !t->recv)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "comm_create: transport '%s' lacks send or recv",
                                  t->name ? t->name : "?");
    if (desc) {
        if (!(desc->timeout_s >= 0))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "comm_create: timeout_s %g must be >= 0 (0: default)", desc->timeout_s);
        if (desc->timeout_s > 0) timeout = desc->timeout_s;
        if (desc->piece_bytes) piece = desc->piece_bytes;
    }
    if (timeout > DSGD__COMM_MAX_TIMEOUT) timeout = DSGD__COMM_MAX_TIMEOUT;
    piece /= sizeof(float);
    if (piece < 64) piece = 64;
    if (piece > ((size_t)1 << 28)) piece = (size_t)1 << 28;
    c = (dsgd_comm *)dsgd__alloc(ctx, sizeof(*c), "comm_create");
    if (!c) return DSGD_ERR_OUT_OF_MEMORY;
    memset(c, 0, sizeof(*c));
    c->peers = (void **)dsgd__alloc(ctx, sizeof(void *) * (size_t)t->size, "comm_create");
    if (!c->peers) {
        DSGD_FREE(c);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    c->ctx = ctx;
    c->t = *t;
    c->rank = t->rank;
    c->size = t->size;
    c->timeout = timeout;
    c->piece = piece;
    c->root = -1;
    *out = c;
    return DSGD_OK;
}

DSGD_API void dsgd_comm_destroy(dsgd_comm *c) {
    if (!c) return;
    DSGD_FREE(c->scratch);
    DSGD_FREE(c->peers);
    DSGD_FREE(c);
}

DSGD_API int dsgd_comm_rank(const dsgd_comm *c) { return c ? c->rank : -1; }
DSGD_API int dsgd_comm_size(const dsgd_comm *c) { return c ? c->size : 0; }
DSGD_API dsgd_ctx *dsgd_comm_ctx(const dsgd_comm *c) { return c ? c->ctx : NULL; }
DSGD_API uint64_t dsgd_comm_seq(const dsgd_comm *c) { return c ? c->seq : 0; }

static int dsgd__is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

DSGD_API dsgd_allreduce_algo dsgd_allreduce_choose(const dsgd_comm *c, size_t count) {
    size_t bytes = count * sizeof(float);
    if (!c || c->size == 1) return DSGD_ALLREDUCE_RING; /* nothing is exchanged */
    if (c->t.allreduce) return DSGD_ALLREDUCE_AUTO;
    if (c->t.share && c->t.unshare) return DSGD_ALLREDUCE_DIRECT;
    if (bytes <= DSGD__AUTO_RD_MAX) return DSGD_ALLREDUCE_RECURSIVE_DOUBLING;
    if (dsgd__is_pow2(c->size) && bytes <= DSGD__AUTO_HD_MAX) return DSGD_ALLREDUCE_HALVING_DOUBLING;
    return DSGD_ALLREDUCE_RING;
}

static double dsgd__comm_now(const dsgd_comm *c) { return c->t.now ? c->t.now(c->t.impl) : dsgd_now(); }

/* "allreduce #17 (ring)", "broadcast #3 (root 1)", "barrier #4" */
static void dsgd__coll_name(const dsgd_comm *c, char *dst, size_t cap) {
    if (c->how)
        snprintf(dst, cap, "%s #%llu (%s)", c->what, (unsigned long long)c->seq, c->how);
    else if (c->root >= 0)
        snprintf(dst, cap, "%s #%llu (root %d)", c->what, (unsigned long long)c->seq, c->root);
    else
        snprintf(dst, cap, "%s #%llu", c->what, (unsigned long long)c->seq);
}

/* Validation shared by every collective (has_op 0: it takes no op);
   records the message. */
static dsgd_result dsgd__coll_check(dsgd_comm *c, const char *what, const float *buf, size_t count, int has_op,
                                    dsgd_reduce_op op, double timeout_s) {
    if (buf == NULL && count > 0)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: buf is NULL with count %zu", what,
                                  count);
    if (has_op && ((int)op < 0 || (int)op > (int)DSGD_REDUCE_MIN))
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown reduce op %d", what, (int)op);
    if (!(timeout_s >= 0))
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: timeout_s %g must be >= 0 (0: the communicator's default)", what,
                                  timeout_s);
    if (count > SIZE_MAX / sizeof(float))
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: count %zu is too large", what, count);
    if (c->broken)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE,
                                  "%s: rank %d's communicator failed in collective #%llu and cannot be used "
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
    c->span = timeout_s > 0 ? timeout_s : c->timeout;
    if (c->span > DSGD__COMM_MAX_TIMEOUT) c->span = DSGD__COMM_MAX_TIMEOUT;
    c->deadline = dsgd__comm_now(c) + c->span;
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

/* One step: send scount floats of sbuf to dst and receive rcount floats from
   src into rbuf (copied when op < 0, reduced into rbuf otherwise); dst or src
   -1 skips that half. Both halves carry the same tag. Records the error. */
static dsgd_result dsgd__xchg(dsgd_comm *c, uint64_t tag, int dst, const float *sbuf, size_t scount, int src,
                              float *rbuf, size_t rcount, int op) {
    const dsgd_transport_i *t = &c->t;
    size_t sbytes = scount * sizeof(float), rbytes = rcount * sizeof(float);
    int failed = -1, send_first;
    dsgd_result r;
    if (dst < 0 && src < 0) return DSGD_OK;
    if (op >= 0 && src >= 0) {
        if (t->sendrecv_reduce) {
            r = t->sendrecv_reduce(t->impl, dst, tag, sbuf, sbytes, src, tag, rbuf, rcount, (dsgd_reduce_op)op,
                                   c->deadline, &failed);
            return r == DSGD_OK ? r : dsgd__coll_fail(c, r, failed >= 0 ? failed : src);
        }
        /* No zero-copy hook: receive into scratch, then reduce. */
        r = dsgd__scratch(c, rcount);
        if (r != DSGD_OK) return r;
        r = dsgd__xchg(c, tag, dst, sbuf, scount, src, c->scratch, rcount, -1);
        if (r == DSGD_OK) dsgd__reduce_into(rbuf, c->scratch, rcount, (dsgd_reduce_op)op, 0);
        return r;
    }
    if (t->sendrecv) {
        r = t->sendrecv(t->impl, dst, tag, sbuf, sbytes, src, tag, rbuf, rbytes, c->deadline, &failed);
        return r == DSGD_OK ? r : dsgd__coll_fail(c, r, failed >= 0 ? failed : (src >= 0 ? src : dst));
    }
    /* Only send and recv: order them so that the pairs and shifts used here
       cannot deadlock even when a send blocks until it is received. In a pair
       the lower rank sends first; in a shift by d the ranks below d send
       first (every cycle of the shift contains one of them). */
    if (dst < 0) send_first = 0;
    else if (src < 0) send_first = 1;
    else if (dst == src) send_first = c->rank < dst;
    else send_first = c->rank < (dst - c->rank + c->size) % c->size;
    if (send_first) {
        r = t->send(t->impl, dst, tag, sbuf, sbytes, c->deadline);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, dst);
    }
    if (src >= 0) {
        r = t->recv(t->impl, src, tag, rbuf, rbytes, c->deadline);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, src);
    }
    if (!send_first && dst >= 0) {
        r = t->send(t->impl, dst, tag, sbuf, sbytes, c->deadline);
        if (r != DSGD_OK) return dsgd__coll_fail(c, r, dst);
    }
    return DSGD_OK;
}

/* >>agreement -------------------------------------------------------------- */
/* Before a collective moves any data, the ranks agree on what it is: every
   rank's fingerprint (the fields below) must be equal, or every rank returns
   DSGD_ERR_DESYNC naming two ranks that differ, having touched no buffer.
   Message passing: a dissemination exchange (ceil(log2 N) rounds, as the
   barrier) carries the smallest and the largest fingerprint seen so far, with
   their ranks; after the last round every rank holds the same pair, so every
   rank reaches the same verdict. Shared memory (DIRECT): each rank publishes
   its fingerprint beside its buffer and reads the others', at no extra cost.
   Fields are compared in this order, so seq differences are reported first. */
enum { DSGD__FP_SEQ, DSGD__FP_KIND, DSGD__FP_COUNT, DSGD__FP_OP, DSGD__FP_ROOT, DSGD__FP_ALGO, DSGD__FP_PIECE,
       DSGD__FP_N };
/* the tag's piece field marking the agreement's messages */
#define DSGD__AGREE_PIECE 0xFFFFF

typedef struct dsgd__fp_range {
    uint64_t lo[DSGD__FP_N], hi[DSGD__FP_N]; /* smallest and largest fingerprint seen */
    uint64_t lo_rank, hi_rank;               /* the lowest rank holding each */
} dsgd__fp_range;

static void dsgd__fp_fill(const dsgd_comm *c, uint64_t *fp) {
    fp[DSGD__FP_SEQ] = c->seq;
    fp[DSGD__FP_KIND] = (uint64_t)c->kind;
    fp[DSGD__FP_COUNT] = (uint64_t)c->count;
    fp[DSGD__FP_OP] = (uint64_t)(int64_t)c->op;
    fp[DSGD__FP_ROOT] = (uint64_t)(int64_t)c->root;
    fp[DSGD__FP_ALGO] = (uint64_t)(int64_t)c->algo;
    fp[DSGD__FP_PIECE] = (uint64_t)c->piece;
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
        acc->lo_rank = lo_rank;
    }
    if (ch > 0 || (ch == 0 && hi_rank < acc->hi_rank)) {
        memcpy(acc->hi, hi, sizeof(acc->hi));
        acc->hi_rank = hi_rank;
    }
}

static void dsgd__fp_init(const dsgd_comm *c, dsgd__fp_range *acc) {
    dsgd__fp_fill(c, acc->lo);
    memcpy(acc->hi, acc->lo, sizeof(acc->hi));
    acc->lo_rank = acc->hi_rank = (uint64_t)c->rank;
}

/* Field i of a fingerprint as text, after its label. */
static const char *dsgd__fp_field(int i, uint64_t v, char *buf, size_t cap) {
    switch (i) {
    case DSGD__FP_KIND: return dsgd__kind_name(v);
    case DSGD__FP_OP: return dsgd_reduce_op_name((dsgd_reduce_op)(int64_t)v);
    case DSGD__FP_ALGO: return v == DSGD_ALLREDUCE_AUTO ? "native" : dsgd_allreduce_algo_name((dsgd_allreduce_algo)v);
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
                                                  "root ", "algorithm ", "piece bytes "};
    size_t used = 0;
    int i, k, first = 1;
    k = snprintf(dst, cap, "rank %llu", (unsigned long long)rank);
    used += k > 0 && (size_t)k < cap ? (size_t)k : 0;
    for (i = 0; i < DSGD__FP_N; ++i) {
        char v[32];
        if (fp[i] == other[i]) continue;
        k = snprintf(dst + used, cap - used, "%s%s%s%s", first ? " " : ", ",
                     i >= DSGD__FP_COUNT && first ? "passed " : "", label[i], dsgd__fp_field(i, fp[i], v, sizeof(v)));
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

/* The message-passing agreement (see above); also the barrier. */
static dsgd_result dsgd__coll_agree(dsgd_comm *c) {
    dsgd__fp_range acc, in;
    int n = c->size, r = c->rank, d, step;
    dsgd_result res;
    dsgd__fp_init(c, &acc);
    for (d = 1, step = 0; d < n; d <<= 1, ++step) {
        /* 128 bytes of integers, carried as 32 floats and only ever copied */
        res = dsgd__xchg(c, dsgd__tag(c, DSGD__AGREE_PIECE, DSGD__PH_FOLD, step), (r + d) % n,
                         (const float *)(const void *)&acc, sizeof(acc) / sizeof(float), (r - d + n) % n,
                         (float *)(void *)&in, sizeof(in) / sizeof(float), -1);
        if (res != DSGD_OK) return res;
        dsgd__fp_merge(&acc, in.lo, in.lo_rank, in.hi, in.hi_rank);
    }
    return dsgd__fp_verdict(c, &acc);
}

/* Piece j of block b (count elements in n blocks, pieces of P floats). */
static void dsgd__piece(size_t count, int n, int b, size_t j, size_t P, size_t *off, size_t *len) {
    size_t bo, bl, lo;
    dsgd_block_range(count, n, b, &bo, &bl);
    lo = j * P;
    *off = bo + (lo < bl ? lo : bl);
    *len = lo < bl ? DSGD__MIN(P, bl - lo) : 0;
}

/* Ring over blocks: phases bit 1 = reduce-scatter (rank r ends owning block
   r), bit 2 = all-gather. Each block is cut into pieces of P floats, and
   piece j of every block goes through both phases before piece j + 1, so a
   step's data is still in cache for the next. Pieces never change which rank
   reduces an element or in what order, so the bits do not depend on P.
   Empty pieces (short blocks) are skipped by both sides. */
static dsgd_result dsgd__ring(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op, int phases) {
    int n = c->size, r = c->rank, next = (r + 1) % n, prev = (r + n - 1) % n, k;
    size_t P = c->piece, maxlen = count / (size_t)n + (count % (size_t)n != 0), npieces, j;
    dsgd_result res;
    npieces = (maxlen + P - 1) / P;
    for (j = 0; j < npieces; ++j) {
        size_t so, sl, ro, rl;
        if (phases & 1) {
            for (k = 0; k < n - 1; ++k) {
                int sb = ((r - k - 1) % n + n) % n, rb = ((r - k - 2) % n + n) % n;
                dsgd__piece(count, n, sb, j, P, &so, &sl);
                dsgd__piece(count, n, rb, j, P, &ro, &rl);
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_RS, k), sl ? next : -1, buf + so, sl,
                                 rl ? prev : -1, buf + ro, rl, (int)op);
                if (res != DSGD_OK) return res;
            }
            if (op == DSGD_REDUCE_MEAN) {
                dsgd__piece(count, n, r, j, P, &ro, &rl);
                dsgd__divide(buf + ro, rl, n);
            }
        }
        if (phases & 2) {
            for (k = 0; k < n - 1; ++k) {
                int sb = ((r - k) % n + n) % n, rb = ((r - k - 1) % n + n) % n;
                dsgd__piece(count, n, sb, j, P, &so, &sl);
                dsgd__piece(count, n, rb, j, P, &ro, &rl);
                res = dsgd__xchg(c, dsgd__tag(c, j, DSGD__PH_AG, k), sl ? next : -1, buf + so, sl,
                                 rl ? prev : -1, buf + ro, rl, -1);
                if (res != DSGD_OK) return res;
            }
        }
    }
    return DSGD_OK;
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

/* What each rank publishes: its buffer and its fingerprint, checked by
   every rank before any buffer is touched. */
typedef struct dsgd__direct_pub {
    float *buf;
    uint64_t fp[DSGD__FP_N];
} dsgd__direct_pub;

static dsgd_result dsgd__direct(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op) {
    const dsgd_transport_i *t = &c->t;
    uint64_t tag = dsgd__tag(c, 0, DSGD__PH_FOLD, 0);
    float tmp[DSGD__DIRECT_TILE];
    dsgd__direct_pub pub;
    dsgd__fp_range acc;
    size_t off, len, i, m;
    int n = c->size, k, failed = -1;
    dsgd_result r, agreed;
    if (!t->share || !t->unshare) {
        char name[96];
        dsgd__coll_name(c, name, sizeof(name));
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_UNSUPPORTED, "%s: transport '%s' cannot share memory",
                                  name, t->name ? t->name : "?");
    }
    pub.buf = buf;
    dsgd__fp_fill(c, pub.fp);
    r = t->share(t->impl, tag, &pub, c->peers, c->deadline, &failed);
    if (r != DSGD_OK) return dsgd__coll_fail(c, r, failed);
    dsgd__fp_init(c, &acc);
    for (k = 0; k < n; ++k) {
        const dsgd__direct_pub *p = (const dsgd__direct_pub *)c->peers[k];
        dsgd__fp_merge(&acc, p->fp, (uint64_t)k, p->fp, (uint64_t)k);
    }
    agreed = dsgd__fp_verdict(c, &acc);
    if (agreed == DSGD_OK && count > 0) {
        for (k = 0; k < n; ++k) c->peers[k] = ((const dsgd__direct_pub *)c->peers[k])->buf;
        dsgd_block_range(count, n, c->rank, &off, &len);
        for (i = 0; i < len; i += m) {
            m = DSGD__MIN((size_t)DSGD__DIRECT_TILE, len - i);
            if (op == DSGD_REDUCE_SUM || op == DSGD_REDUCE_MEAN) { /* the first two in one pass */
                dsgd__sum2(tmp, (const float *)c->peers[0] + off + i, (const float *)c->peers[1] + off + i, m);
            } else {
                memcpy(tmp, (const float *)c->peers[0] + off + i, m * sizeof(float));
                dsgd__reduce_into(tmp, (const float *)c->peers[1] + off + i, m, op, 0);
            }
            for (k = 2; k < n; ++k) dsgd__reduce_into(tmp, (const float *)c->peers[k] + off + i, m, op, 0);
            if (op == DSGD_REDUCE_MEAN) dsgd__divide(tmp, m, n);
            for (k = 0; k < n; ++k) memcpy((float *)c->peers[k] + off + i, tmp, m * sizeof(float));
        }
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

DSGD_API dsgd_result dsgd_allreduce(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op,
                                    dsgd_allreduce_algo algo, double timeout_s) {
    dsgd_result res;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "allreduce", buf, count, 1, op, timeout_s);
    if (res != DSGD_OK) return res;
    if ((int)algo < 0 || (int)algo > (int)DSGD_ALLREDUCE_DIRECT)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "allreduce: unknown algorithm %d", (int)algo);
    if (algo == DSGD_ALLREDUCE_AUTO) algo = dsgd_allreduce_choose(c, count);
    dsgd__coll_begin(c, DSGD__K_ALLREDUCE, algo == DSGD_ALLREDUCE_AUTO ? "native" : dsgd_allreduce_algo_name(algo),
                     (int)algo, (int)op, -1, count, timeout_s);
    if (c->size == 1) return DSGD_OK; /* MEAN over one rank divides by 1: nothing to do */
    if (algo == DSGD_ALLREDUCE_DIRECT) return dsgd__direct(c, buf, count, op); /* agrees through shared memory */
    res = dsgd__coll_agree(c);
    if (res != DSGD_OK || count == 0) return res;
    switch (algo) {
    case DSGD_ALLREDUCE_AUTO: /* the transport's native collective */
        res = c->t.allreduce(c->t.impl, buf, count, op, c->deadline);
        return res == DSGD_OK ? res : dsgd__coll_fail(c, res, -1);
    case DSGD_ALLREDUCE_HALVING_DOUBLING: return dsgd__halving_doubling(c, buf, count, op);
    case DSGD_ALLREDUCE_REDUCE_BROADCAST: return dsgd__reduce_broadcast(c, buf, count, op);
    case DSGD_ALLREDUCE_RECURSIVE_DOUBLING: return dsgd__recursive_doubling(c, buf, count, op);
    default: return dsgd__ring(c, buf, count, op, 3);
    }
}

DSGD_API dsgd_result dsgd_reduce_scatter(dsgd_comm *c, float *buf, size_t count, dsgd_reduce_op op,
                                         double timeout_s) {
    dsgd_result res;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "reduce_scatter", buf, count, 1, op, timeout_s);
    if (res != DSGD_OK) return res;
    dsgd__coll_begin(c, DSGD__K_REDUCE_SCATTER, "ring", -1, (int)op, -1, count, timeout_s);
    if (c->size == 1) return DSGD_OK;
    res = dsgd__coll_agree(c);
    if (res != DSGD_OK || count == 0) return res;
    return dsgd__ring(c, buf, count, op, 1);
}

DSGD_API dsgd_result dsgd_allgather(dsgd_comm *c, float *buf, size_t count, double timeout_s) {
    dsgd_result res;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "allgather", buf, count, 0, DSGD_REDUCE_SUM, timeout_s);
    if (res != DSGD_OK) return res;
    dsgd__coll_begin(c, DSGD__K_ALLGATHER, "ring", -1, -1, -1, count, timeout_s);
    if (c->size == 1) return DSGD_OK;
    res = dsgd__coll_agree(c);
    if (res != DSGD_OK || count == 0) return res;
    return dsgd__ring(c, buf, count, DSGD_REDUCE_SUM, 2);
}

DSGD_API dsgd_result dsgd_broadcast(dsgd_comm *c, float *buf, size_t count, int root, double timeout_s) {
    dsgd_result res;
    size_t seg, base, j;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "broadcast", buf, count, 0, DSGD_REDUCE_SUM, timeout_s);
    if (res != DSGD_OK) return res;
    if (root < 0 || root >= c->size)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "broadcast: root %d outside [0, %d)", root,
                                  c->size);
    dsgd__coll_begin(c, DSGD__K_BROADCAST, NULL, -1, -1, root, count, timeout_s);
    if (c->size == 1) return DSGD_OK;
    res = dsgd__coll_agree(c);
    if (res != DSGD_OK) return res;
    seg = c->piece * 4;
    for (base = 0, j = 0; base < count; base += seg, ++j) {
        res = dsgd__bcast_seg(c, buf + base, DSGD__MIN(seg, count - base), j, root);
        if (res != DSGD_OK) return res;
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_barrier(dsgd_comm *c, double timeout_s) {
    dsgd_result res;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    res = dsgd__coll_check(c, "barrier", NULL, 0, 0, DSGD_REDUCE_SUM, timeout_s);
    if (res != DSGD_OK) return res;
    dsgd__coll_begin(c, DSGD__K_BARRIER, NULL, -1, -1, -1, 0, timeout_s);
    /* The agreement is a dissemination barrier (Hensgen, Finkel and Manber
       1988): in round k rank r signals r + 2^k and waits for r - 2^k, so
       after the last round every rank has heard, through others, from all. */
    return c->size == 1 ? DSGD_OK : dsgd__coll_agree(c);
}

#endif /* DISTSGD_IMPLEMENTATION && !DSGD__COLLECTIVES_IMPL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__STRATEGY_IMPL)
#define DSGD__STRATEGY_IMPL
#include <pthread.h>

/* >>strategy --------------------------------------------------------------- */

typedef struct dsgd__dvar {
    char name[DSGD_MAX_VARIABLE_NAME + 1];
    size_t count;
    dsgd_synchronization sync; /* ON_WRITE or ON_READ (AUTO resolved) */
    dsgd_aggregation agg;
    int trainable;
    float *copies; /* num_replicas * count: replica r's copy at r * count */
} dsgd__dvar;

struct dsgd_replica {
    dsgd_strategy *s;
    int rank;
    dsgd_ctx *ctx;
    dsgd_backend_i be;
    int has_be;
    dsgd_model *model;
    dsgd_optimizer *opt;
    dsgd_transport_i ep;
    dsgd_comm *comm;
    float *stage; /* host staging: gradients of backends without host pointers, variable writes */
    size_t stage_cap;
    pthread_t thread;
    int thread_started;
    dsgd_result result; /* of the last job */
    char msg[DSGD__MSG_MAX]; /* its message ("" when it succeeded) */
    int own_error;      /* 0: the failure only echoes another replica's */
    int comm_failed;    /* a collective failed: the transport's state is unknown */
    int clean_fail;     /* set by the job: its failure left every replica as it was */
    int skipped;
    float lr;
};

struct dsgd_strategy {
    dsgd_ctx *ctx;
    dsgd_strategy_desc d;
    int n;
    dsgd_replica *reps;
    dsgd_loopback *hub;
    dsgd_aggregation *param_agg; /* per model variable */
    int all_mean;
    dsgd__dvar *vars;
    int num_vars, cap_vars;
    dsgd_gradient_path path; /* resolved: HOST or DEVICE */
    dsgd_ref *grad_refs;     /* DEVICE: every replica's gradient buffer */
    int metric_var[2]; /* first of the three metric variables of each slot */
    /* failed: a failure may have left the replicas different, or stopped the
       transport; every call but the getters and destroy refuses (the one
       check: dsgd__strategy_usable) */
    int failed;
    int64_t fail_step;      /* optimizer steps applied before the failing call */
    const char *fail_in;    /* the failing call */
    char fail_msg[DSGD__MSG_MAX]; /* the error it returned */
    int abort_by;           /* the replica that aborted the hub, -1: none (under mu) */
    /* the worker pool: replicas 1..n-1 wait for a new generation of job */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    int sync_ready;
    uint64_t gen;
    int pending, shutdown;
    dsgd_replica_fn job;
    void *job_user;
};

/* Stops every replica's transport at once because replica `rank` failed;
   the first caller is the one the others' messages name. */
static void dsgd__strategy_abort(dsgd_strategy *s, int rank) {
    if (!s->hub) return;
    pthread_mutex_lock(&s->mu);
    if (s->abort_by < 0) s->abort_by = rank;
    pthread_mutex_unlock(&s->mu);
    dsgd_loopback_abort(s->hub);
}

/* Runs fn as replica r (on r's thread) and classifies its failure. A
   failure the job did not mark clean aborts the hub at once, so that the
   replicas waiting for r in a collective return now instead of at their
   deadline; theirs, caused by the abort, then say so. */
static dsgd_result dsgd__replica_job(dsgd_replica *r, dsgd_replica_fn fn, void *user) {
    dsgd_strategy *s = r->s;
    dsgd_result res;
    int by;
    r->own_error = 1;
    r->comm_failed = 0;
    r->clean_fail = 0;
    res = fn(r, user);
    if (res == DSGD_OK) {
        r->msg[0] = '\0';
        return res;
    }
    if (r->comm && r->comm->broken) r->comm_failed = 1; /* also a collective called by a user's fn */
    if (!r->clean_fail || r->comm_failed) dsgd__strategy_abort(s, r->rank);
    pthread_mutex_lock(&s->mu);
    by = s->abort_by;
    pthread_mutex_unlock(&s->mu);
    if (by >= 0 && by != r->rank && r->comm_failed && res != DSGD_ERR_TIMEOUT) {
        char detail[DSGD__MSG_MAX];
        const char *d = dsgd_ctx_last_error(r->ctx);
        size_t label = strlen(r->ctx->label);
        if (label && !strncmp(d, r->ctx->label, label) && !strncmp(d + label, ": ", 2)) d += label + 2;
        snprintf(detail, sizeof(detail), "%s", d);
        r->own_error = 0;
        res = dsgd_ctx_set_error(r->ctx, DSGD_ERR_STATE, "aborted because replica %d failed (%s)", by, detail);
    }
    snprintf(r->msg, sizeof(r->msg), "%s", dsgd_ctx_last_error(r->ctx));
    return res;
}

static void *dsgd__replica_main(void *arg) {
    dsgd_replica *r = (dsgd_replica *)arg;
    dsgd_strategy *s = r->s;
    uint64_t seen = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        dsgd_replica_fn fn;
        void *user;
        dsgd_result res;
        while (s->gen == seen && !s->shutdown) pthread_cond_wait(&s->cv_start, &s->mu);
        if (s->shutdown) break;
        seen = s->gen;
        fn = s->job;
        user = s->job_user;
        pthread_mutex_unlock(&s->mu);
        res = dsgd__replica_job(r, fn, user);
        pthread_mutex_lock(&s->mu);
        r->result = res;
        if (--s->pending == 0) pthread_cond_signal(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* How much a replica's failure explains: a local failure (3) over a failed
   collective (2) over an echo of another replica's failure (1). */
static int dsgd__error_rank(const dsgd_replica *r) {
    if (!r->own_error) return 1;
    return r->comm_failed ? 2 : 3;
}

/* The one check of a failed strategy, at the top of every call that uses
   the replicas' state. */
static dsgd_result dsgd__strategy_usable(dsgd_strategy *s, const char *what) {
    if (!s->failed) return DSGD_OK;
    return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE,
                              "%s: refused: the strategy failed at step %lld in %s and must be recreated "
                              "(its replicas may differ, its transport is stopped): %s",
                              what, (long long)s->fail_step, s->fail_in, s->fail_msg);
}

/* Runs fn on all replicas and reports the failure that explains most, the
   lowest replica among equals. A failure that no job marked clean fails the
   strategy. */
static dsgd_result dsgd__strategy_dispatch(dsgd_strategy *s, dsgd_replica_fn fn, void *user, const char *what) {
    int i, pick = -1, clean = 1;
    int64_t step = dsgd_optimizer_steps(s->reps[0].opt);
    dsgd_result r0;
    if (s->n > 1) {
        pthread_mutex_lock(&s->mu);
        s->job = fn;
        s->job_user = user;
        s->pending = s->n - 1;
        ++s->gen;
        pthread_cond_broadcast(&s->cv_start);
        pthread_mutex_unlock(&s->mu);
    }
    r0 = dsgd__replica_job(&s->reps[0], fn, user);
    if (s->n > 1) {
        pthread_mutex_lock(&s->mu);
        while (s->pending > 0) pthread_cond_wait(&s->cv_done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    s->reps[0].result = r0;
    for (i = 0; i < s->n; ++i)
        if (s->reps[i].result != DSGD_OK && (pick < 0 || dsgd__error_rank(&s->reps[i]) > dsgd__error_rank(&s->reps[pick])))
            pick = i;
    if (pick < 0) return DSGD_OK;
    for (i = 0; i < s->n; ++i)
        if (s->reps[i].result != DSGD_OK && (!s->reps[i].clean_fail || s->reps[i].comm_failed)) clean = 0;
    if (!clean) {
        s->failed = 1;
        s->fail_step = step;
        s->fail_in = what;
        snprintf(s->fail_msg, sizeof(s->fail_msg), "%s", s->reps[pick].msg);
    }
    return dsgd_ctx_set_error(s->ctx, s->reps[pick].result, "%s", s->reps[pick].msg);
}

static float *dsgd__replica_stage(dsgd_replica *r, size_t count) {
    if (r->stage_cap < count) {
        float *p = (float *)DSGD_REALLOC(r->stage, sizeof(float) * (count ? count : 1));
        if (!p) {
            dsgd_ctx_set_error(r->ctx, DSGD_ERR_OUT_OF_MEMORY, "cannot allocate %zu floats of staging", count);
            return NULL;
        }
        r->stage = p;
        r->stage_cap = count;
    }
    return r->stage;
}

DSGD_API void dsgd_strategy_destroy(dsgd_strategy *s) {
    int i;
    if (!s) return;
    if (s->sync_ready) {
        pthread_mutex_lock(&s->mu);
        s->shutdown = 1;
        pthread_cond_broadcast(&s->cv_start);
        pthread_mutex_unlock(&s->mu);
    }
    for (i = 0; s->reps && i < s->n; ++i)
        if (s->reps[i].thread_started) pthread_join(s->reps[i].thread, NULL);
    for (i = 0; s->reps && i < s->n; ++i) {
        dsgd_replica *r = &s->reps[i];
        dsgd_comm_destroy(r->comm);
        dsgd_optimizer_destroy(r->opt);
        dsgd_model_destroy(r->model);
        if (r->has_be && r->be.destroy) r->be.destroy(r->be.impl);
        DSGD_FREE(r->stage);
        dsgd_ctx_destroy(r->ctx);
    }
    if (s->hub) dsgd_loopback_destroy(s->hub);
    if (s->sync_ready) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv_start);
        pthread_cond_destroy(&s->cv_done);
    }
    for (i = 0; i < s->num_vars; ++i) DSGD_FREE(s->vars[i].copies);
    DSGD_FREE(s->vars);
    DSGD_FREE(s->param_agg);
    DSGD_FREE(s->grad_refs);
    DSGD_FREE(s->reps);
    DSGD_FREE(s);
}

static dsgd_result dsgd__dvar_add(dsgd_strategy *s, const dsgd_dvar_desc *d, int *id);

/* Resolves desc.gradient_path: DEVICE needs every replica's backend to have
   sum_across and to reach every other replica's buffers; AUTO also wants
   some replica's buffers outside host-shared memory. */
static dsgd_result dsgd__strategy_resolve_path(dsgd_strategy *s) {
    int i, j, ok = 1;
    const char *why = "";
    if (s->n == 1) { /* nothing to exchange, whatever the desc asks */
        s->path = DSGD_GRADIENTS_HOST;
        return DSGD_OK;
    }
    for (i = 0; i < s->n && ok; ++i) {
        const dsgd_backend_i *bi = &s->reps[i].be;
        if (!bi->sum_across || !bi->can_access) {
            ok = 0;
            why = "a replica's backend has no device-side reduction (sum_across)";
        }
        for (j = 0; j < s->n && ok; ++j) {
            if (!bi->can_access(bi->impl, &s->reps[j].be)) {
                ok = 0;
                why = "a replica's backend cannot reach another replica's buffers (not one OpenCL context)";
            }
        }
    }
    if (!ok && s->d.gradient_path == DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_strategy_create: gradient_path DEVICE, but %s", why);
    if (ok && s->d.gradient_path == DSGD_GRADIENTS_AUTO) {
        int shared = 1;
        for (i = 0; i < s->n; ++i)
            shared &= s->reps[i].be.host_shared && s->reps[i].be.host_shared(s->reps[i].be.impl);
        ok = !shared;
    }
    s->path = ok && s->d.gradient_path != DSGD_GRADIENTS_HOST ? DSGD_GRADIENTS_DEVICE : DSGD_GRADIENTS_HOST;
    if (s->path != DSGD_GRADIENTS_DEVICE) return DSGD_OK;
    s->grad_refs = (dsgd_ref *)dsgd__alloc(s->ctx, sizeof(dsgd_ref) * (size_t)s->n, "dsgd_strategy_create");
    if (!s->grad_refs) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < s->n; ++i) s->grad_refs[i] = dsgd_model_grads(s->reps[i].model);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_create(dsgd_ctx *ctx, const dsgd_strategy_desc *desc, dsgd_strategy **out) {
    dsgd_strategy *s;
    dsgd_result res = DSGD_OK;
    int i, n, slot;
    const char *what = "dsgd_strategy_create";
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
    *out = NULL;
    if (!desc) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: desc is NULL", what);
    if (desc->kind != DSGD_STRATEGY_ONE_DEVICE && desc->kind != DSGD_STRATEGY_MIRRORED)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown strategy kind %d", what, (int)desc->kind);
    if (desc->num_replicas < 0 || desc->num_replicas > 256 ||
        (desc->kind == DSGD_STRATEGY_ONE_DEVICE && desc->num_replicas > 1))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %d replicas (one_device takes 1, mirrored 1..256)", what, desc->num_replicas);
    if (desc->nonfinite != DSGD_NONFINITE_SKIP && desc->nonfinite != DSGD_NONFINITE_ERROR)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown non-finite policy %d", what,
                                  (int)desc->nonfinite);
    if (!(desc->timeout_s >= 0.0) || (int)desc->algorithm < 0 || (int)desc->algorithm > (int)DSGD_ALLREDUCE_DIRECT)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: bad timeout %g or algorithm %d", what,
                                  desc->timeout_s, (int)desc->algorithm);
    if ((int)desc->gradient_path < 0 || (int)desc->gradient_path > (int)DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown gradient path %d", what,
                                  (int)desc->gradient_path);
    n = desc->num_replicas ? desc->num_replicas : 1;
    s = (dsgd_strategy *)dsgd__alloc(ctx, sizeof(*s), what);
    if (!s) return DSGD_ERR_OUT_OF_MEMORY;
    memset(s, 0, sizeof(*s));
    s->ctx = ctx;
    s->d = *desc;
    s->d.model.backend = NULL;
    if (s->d.timeout_s == 0.0) s->d.timeout_s = 30.0;
    s->n = n;
    s->all_mean = 1;
    s->abort_by = -1;
    s->reps = (dsgd_replica *)dsgd__alloc(ctx, sizeof(dsgd_replica) * n, what);
    if (!s->reps) { DSGD_FREE(s); return DSGD_ERR_OUT_OF_MEMORY; }
    memset(s->reps, 0, sizeof(dsgd_replica) * n);
    if (n > 1 && (res = dsgd_loopback_create(ctx, n, &s->hub)) != DSGD_OK) {
        dsgd_strategy_destroy(s);
        return res;
    }
    for (i = 0; i < n && res == DSGD_OK; ++i) {
        dsgd_replica *r = &s->reps[i];
        dsgd_ctx_desc cd;
        dsgd_model_desc md = s->d.model;
        char label[32];
        memset(&cd, 0, sizeof(cd));
        snprintf(label, sizeof(label), "replica %d", i);
        cd.label = label;
        cd.logger = ctx ? ctx->logger : cd.logger;
        r->s = s;
        r->rank = i;
        if ((res = dsgd_ctx_create(&cd, &r->ctx)) != DSGD_OK) {
            dsgd_ctx_set_error(ctx, res, "%s: cannot create replica %d's context", what, i);
            break;
        }
        res = s->d.backend_factory ? s->d.backend_factory(s->d.backend_user_data, r->ctx, i, &r->be)
                                   : dsgd_cpu_backend_create(r->ctx, &r->be);
        if (res != DSGD_OK) break;
        r->has_be = 1;
        md.backend = &r->be;
        if ((res = dsgd_model_create(r->ctx, &md, &r->model)) != DSGD_OK) break;
        if ((res = dsgd_optimizer_create(r->model, &s->d.optimizer, &r->opt)) != DSGD_OK) break;
        if (n > 1) {
            dsgd_comm_desc cdesc;
            memset(&cdesc, 0, sizeof(cdesc));
            cdesc.timeout_s = s->d.timeout_s;
            cdesc.piece_bytes = s->d.piece_bytes; /* the communicator clamps it, equally on every replica */
            if ((res = dsgd_loopback_endpoint(s->hub, i, &r->ep)) != DSGD_OK) break;
            if ((res = dsgd_comm_create(r->ctx, &r->ep, &cdesc, &r->comm)) != DSGD_OK) break;
        }
    }
    if (res != DSGD_OK) {
        if (i < n && s->reps[i].ctx && dsgd_ctx_last_result(s->reps[i].ctx) != DSGD_OK)
            dsgd_ctx_set_error(ctx, res, "%s", dsgd_ctx_last_error(s->reps[i].ctx));
        dsgd_strategy_destroy(s);
        return res;
    }
    s->param_agg = (dsgd_aggregation *)dsgd__alloc(ctx, sizeof(dsgd_aggregation) *
                                                        (size_t)dsgd_model_num_variables(s->reps[0].model), what);
    if (!s->param_agg) { dsgd_strategy_destroy(s); return DSGD_ERR_OUT_OF_MEMORY; }
    for (i = 0; i < dsgd_model_num_variables(s->reps[0].model); ++i) s->param_agg[i] = DSGD_AGG_MEAN;
    if ((res = dsgd__strategy_resolve_path(s)) != DSGD_OK) {
        dsgd_strategy_destroy(s);
        return res;
    }
    /* the metrics: ON_READ SUM variables, three per slot */
    for (slot = 0; slot < 2 && res == DSGD_OK; ++slot) {
        static const char *const names[3] = {"loss_sum", "correct", "count"};
        for (i = 0; i < 3 && res == DSGD_OK; ++i) {
            dsgd_dvar_desc vd;
            char name[64];
            int id;
            memset(&vd, 0, sizeof(vd));
            snprintf(name, sizeof(name), "metrics/%s/%s", slot == 0 ? "train" : "eval", names[i]);
            vd.name = name;
            vd.count = 1;
            vd.synchronization = DSGD_SYNC_ON_READ;
            vd.aggregation = DSGD_AGG_SUM;
            res = dsgd__dvar_add(s, &vd, &id);
            if (i == 0) s->metric_var[slot] = id;
        }
    }
    if (res != DSGD_OK) { dsgd_strategy_destroy(s); return res; }
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        dsgd_strategy_destroy(s);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: pthread_mutex_init failed", what);
    }
    if (pthread_cond_init(&s->cv_start, NULL) != 0) {
        pthread_mutex_destroy(&s->mu);
        dsgd_strategy_destroy(s);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: pthread_cond_init failed", what);
    }
    if (pthread_cond_init(&s->cv_done, NULL) != 0) {
        pthread_cond_destroy(&s->cv_start);
        pthread_mutex_destroy(&s->mu);
        dsgd_strategy_destroy(s);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: pthread_cond_init failed", what);
    }
    s->sync_ready = 1;
    for (i = 1; i < n; ++i) {
        if (pthread_create(&s->reps[i].thread, NULL, dsgd__replica_main, &s->reps[i]) != 0) {
            dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: cannot start replica %d's thread", what, i);
            dsgd_strategy_destroy(s);
            return DSGD_ERR_STATE;
        }
        s->reps[i].thread_started = 1;
    }
    *out = s;
    return DSGD_OK;
}

DSGD_API int dsgd_strategy_num_replicas(const dsgd_strategy *s) { return s ? s->n : 0; }
DSGD_API dsgd_gradient_path dsgd_strategy_gradient_path(const dsgd_strategy *s) {
    return s ? s->path : DSGD_GRADIENTS_HOST;
}
DSGD_API const char *dsgd_gradient_path_name(dsgd_gradient_path p) {
    switch (p) {
    case DSGD_GRADIENTS_AUTO: return "auto";
    case DSGD_GRADIENTS_HOST: return "host";
    case DSGD_GRADIENTS_DEVICE: return "device";
    }
    return "unknown";
}
DSGD_API dsgd_model *dsgd_strategy_model(dsgd_strategy *s, int replica) {
    return (s && replica >= 0 && replica < s->n) ? s->reps[replica].model : NULL;
}
DSGD_API int dsgd_replica_id(const dsgd_replica *r) { return r ? r->rank : -1; }
DSGD_API int dsgd_replica_count(const dsgd_replica *r) { return r ? r->s->n : 0; }
DSGD_API dsgd_ctx *dsgd_replica_ctx(const dsgd_replica *r) { return r ? r->ctx : NULL; }
DSGD_API dsgd_model *dsgd_replica_model(const dsgd_replica *r) { return r ? r->model : NULL; }
DSGD_API dsgd_comm *dsgd_replica_comm(const dsgd_replica *r) { return r ? r->comm : NULL; }

static int dsgd__agg_valid(dsgd_aggregation a) {
    return a == DSGD_AGG_NONE || a == DSGD_AGG_SUM || a == DSGD_AGG_MEAN || a == DSGD_AGG_ONLY_FIRST_REPLICA;
}

DSGD_API const char *dsgd_aggregation_name(dsgd_aggregation a) {
    switch (a) {
    case DSGD_AGG_NONE: return "NONE";
    case DSGD_AGG_SUM: return "SUM";
    case DSGD_AGG_MEAN: return "MEAN";
    case DSGD_AGG_ONLY_FIRST_REPLICA: return "ONLY_FIRST_REPLICA";
    default: return "?";
    }
}

DSGD_API const char *dsgd_synchronization_name(dsgd_synchronization s) {
    switch (s) {
    case DSGD_SYNC_AUTO: return "AUTO";
    case DSGD_SYNC_NONE: return "NONE";
    case DSGD_SYNC_ON_WRITE: return "ON_WRITE";
    case DSGD_SYNC_ON_READ: return "ON_READ";
    default: return "?";
    }
}

DSGD_API dsgd_result dsgd_strategy_set_aggregation(dsgd_strategy *s, const char *variable, dsgd_aggregation agg,
                                                   dsgd_synchronization sync) {
    int i, nv, hit = 0;
    const char *what = "dsgd_strategy_set_aggregation";
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, what) != DSGD_OK) return DSGD_ERR_STATE;
    if (!variable) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable name is NULL", what);
    if (sync == DSGD_SYNC_ON_READ)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: model variables are trainable, and ON_READ synchronization is only for "
                                  "non-trainable variables", what, variable);
    if (sync != DSGD_SYNC_AUTO && sync != DSGD_SYNC_ON_WRITE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: synchronization %d is not supported under a distribution strategy", what,
                                  variable, (int)sync);
    if (!dsgd__agg_valid(agg) || agg == DSGD_AGG_NONE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %s: a mirrored variable updated in replica context needs an aggregation "
                                  "(SUM, MEAN or ONLY_FIRST_REPLICA), got %d", what, variable, (int)agg);
    nv = dsgd_model_num_variables(s->reps[0].model);
    for (i = 0; i < nv; ++i) {
        if (!strcmp(variable, "*") || !strcmp(variable, dsgd_model_variable(s->reps[0].model, i)->name)) {
            s->param_agg[i] = agg;
            hit = 1;
        }
    }
    if (!hit) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: the model has no variable '%s'", what, variable);
    s->all_mean = 1;
    for (i = 0; i < nv; ++i) s->all_mean &= s->param_agg[i] == DSGD_AGG_MEAN;
    return DSGD_OK;
}

typedef struct dsgd__step_args {
    const float *x, *y;
    int count;
} dsgd__step_args;

/* Scales each variable's gradient slice, computed for the SUM of the
   replica's losses, to what its aggregation adds up: MEAN 1/global count,
   SUM 1/local count, ONLY_FIRST_REPLICA 1/local count on replica 0 and 0 on
   the others. */
static dsgd_result dsgd__replica_prescale(dsgd_replica *r, int global, size_t local) {
    const dsgd_backend_i *be = &r->be;
    dsgd_ref g = dsgd_model_grads(r->model);
    int i, nv = dsgd_model_num_variables(r->model);
    dsgd_result res = DSGD_OK;
    for (i = 0; i < nv && res == DSGD_OK; ++i) {
        const dsgd_variable *v = dsgd_model_variable(r->model, i);
        dsgd_ref slice = dsgd__ref(g.buf, g.off + v->offset);
        float f;
        switch (r->s->param_agg[i]) {
        case DSGD_AGG_SUM: f = local ? 1.0f / (float)local : 0.0f; break;
        case DSGD_AGG_ONLY_FIRST_REPLICA: f = (r->rank == 0 && local) ? 1.0f / (float)local : 0.0f; break;
        default: f = 1.0f / (float)global; break;
        }
        res = f == 0.0f ? be->fill(be->impl, slice, 0.0f, v->count) : be->scale(be->impl, slice, f, v->count);
    }
    return res;
}

/* DEVICE path: every replica's gradients are complete (barrier), replica r
   sums its block of all of them on its device, and nobody reads a gradient
   before every block is written (barrier). */
static dsgd_result dsgd__replica_exchange_device(dsgd_replica *r, size_t p) {
    const dsgd_backend_i *be = &r->be;
    size_t lo = 0, len = 0;
    dsgd_result res = dsgd_barrier(r->comm, 0.0);
    if (res != DSGD_OK) {
        r->comm_failed = 1;
        return res;
    }
    dsgd_block_range(p, r->s->n, r->rank, &lo, &len);
    if (len > 0) res = be->sum_across(be->impl, r->s->grad_refs, r->s->n, lo, lo + len);
    if (res == DSGD_OK && be->finish) res = be->finish(be->impl);
    if (res != DSGD_OK) return res;
    res = dsgd_barrier(r->comm, 0.0);
    if (res != DSGD_OK) r->comm_failed = 1;
    return res;
}

/* All-reduces (SUM) the flat gradient buffer: on the devices (DEVICE path),
   or on the host in place when the backend exposes host memory or maps it,
   through a staging copy otherwise. */
static dsgd_result dsgd__replica_exchange(dsgd_replica *r) {
    dsgd_strategy *s = r->s;
    const dsgd_backend_i *be = &r->be;
    dsgd_ref g = dsgd_model_grads(r->model);
    size_t p = dsgd_model_num_params(r->model), o, bucket;
    float *host = NULL, *mapped = NULL;
    dsgd_result res = DSGD_OK;
    if (be->finish && (res = be->finish(be->impl)) != DSGD_OK) return res;
    if (s->path == DSGD_GRADIENTS_DEVICE) return dsgd__replica_exchange_device(r, p);
    if (be->buffer_host_ptr) host = be->buffer_host_ptr(be->impl, g.buf);
    if (host) {
        host += g.off;
    } else if (be->map && be->unmap) {
        if ((res = be->map(be->impl, g, p, &mapped)) != DSGD_OK) return res;
        host = mapped;
    } else {
        if (!(host = dsgd__replica_stage(r, p))) return DSGD_ERR_OUT_OF_MEMORY;
        if ((res = be->read(be->impl, g, host, p)) != DSGD_OK) return res;
    }
    bucket = s->d.bucket_bytes / sizeof(float);
    if (bucket == 0 || bucket > p) bucket = p;
    for (o = 0; o < p && res == DSGD_OK; o += bucket)
        res = dsgd_allreduce(r->comm, host + o, DSGD__MIN(bucket, p - o), DSGD_REDUCE_SUM, s->d.algorithm, 0.0);
    if (res != DSGD_OK) r->comm_failed = 1;
    if (mapped) {
        dsgd_result ur = be->unmap(be->impl, g, mapped);
        if (res == DSGD_OK) res = ur;
    } else if (res == DSGD_OK && host == r->stage) {
        res = be->write(be->impl, g, host, p);
    }
    return res;
}

/* One replica's part of a synchronous training step. */
static dsgd_result dsgd__replica_train(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_strategy *s = r->s;
    dsgd_model *m = r->model;
    size_t off = 0, len = 0, bad = 0;
    dsgd_result res;
    float flag = 0.0f;
    dsgd_block_range((size_t)a->count, s->n, r->rank, &off, &len);
    r->skipped = 0;
    r->lr = dsgd_lr_at(&r->opt->d.schedule, r->opt->d.lr, r->opt->t);
    if (len > 0)
        res = dsgd_model_compute_gradients(m, a->x + off * (size_t)dsgd_model_input_dim(m),
                                           a->y + off * (size_t)dsgd_model_target_dim(m), (int)len,
                                           s->all_mean ? 1.0f / (float)a->count : 1.0f);
    else
        res = r->be.fill(r->be.impl, dsgd_model_grads(m), 0.0f, dsgd_model_num_params(m));
    if (res == DSGD_OK) res = r->be.norm_check(r->be.impl, dsgd_model_grads(m), dsgd_model_num_params(m), NULL, &bad);
    /* agree on the step: 0 go, 1 a non-finite gradient somewhere, 2 + k replica k failed */
    flag = res != DSGD_OK ? (float)(2 + r->rank) : (bad ? 1.0f : 0.0f);
    if (s->n > 1) {
        dsgd_result cr = dsgd_allreduce(r->comm, &flag, 1, DSGD_REDUCE_MAX, DSGD_ALLREDUCE_AUTO, 0.0);
        if (cr != DSGD_OK) {
            r->comm_failed = 1;
            return cr;
        }
    }
    /* from here to the update every replica does the same, so a failure
       agreed on here leaves them all as they were (clean) */
    if (flag >= 2.0f) {
        r->clean_fail = 1;
        if (res != DSGD_OK) return res;
        r->own_error = 0;
        return dsgd_ctx_set_error(r->ctx, DSGD_ERR_STATE, "step %lld abandoned: replica %d failed",
                                  (long long)r->opt->t, (int)flag - 2);
    }
    if (flag == 1.0f) {
        if (s->d.nonfinite == DSGD_NONFINITE_ERROR) {
            r->clean_fail = 1;
            r->own_error = bad != 0;
            return dsgd_ctx_set_error(r->ctx, DSGD_ERR_NON_FINITE,
                                      "step %lld: non-finite gradient (%zu NaN/Inf values on this replica); "
                                      "every replica stops", (long long)r->opt->t, bad);
        }
        r->skipped = 1;
        return DSGD_OK;
    }
    if (!s->all_mean) res = dsgd__replica_prescale(r, a->count, len);
    if (res == DSGD_OK && s->n > 1) res = dsgd__replica_exchange(r);
    if (res == DSGD_OK) res = dsgd_optimizer_step(r->opt);
    /* a failure after the agreement is not clean: the others may have
       updated, or wait for this replica in the exchange (dsgd__replica_job
       stops them) */
    return res;
}

static dsgd_result dsgd__strategy_check_batch(dsgd_strategy *s, const float *x, const float *y, int count,
                                              int need_y, const char *what) {
    int max_batch;
    dsgd_result res = dsgd__strategy_usable(s, what);
    if (res != DSGD_OK) return res;
    max_batch = s->d.model.max_batch ? s->d.model.max_batch : 256;
    if (!x || (need_y && !y))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: x or y is NULL", what);
    if (count < 1 || (long long)count > (long long)s->n * max_batch)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: global batch of %d outside 1..%lld (replicas x max_batch)", what, count,
                                  (long long)s->n * max_batch);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_train_step(dsgd_strategy *s, const float *x, const float *y, int count,
                                              dsgd_step_info *info) {
    dsgd__step_args a;
    dsgd_result res;
    int i;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_check_batch(s, x, y, count, 1, "dsgd_strategy_train_step")) != DSGD_OK) return res;
    a.x = x;
    a.y = y;
    a.count = count;
    if (info) {
        info->step = dsgd_optimizer_steps(s->reps[0].opt);
        info->count = count;
    }
    res = dsgd__strategy_dispatch(s, dsgd__replica_train, &a, "dsgd_strategy_train_step");
    if (info) {
        info->skipped = s->reps[0].skipped;
        info->lr = s->reps[0].lr;
        for (i = 1; i < s->n; ++i) DSGD_ASSERT(res != DSGD_OK || s->reps[i].skipped == info->skipped);
    }
    return res;
}

static dsgd_result dsgd__replica_eval(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    size_t off = 0, len = 0;
    dsgd_block_range((size_t)a->count, r->s->n, r->rank, &off, &len);
    r->clean_fail = 1; /* no collective, no weight changes */
    if (len == 0) return DSGD_OK;
    return dsgd_model_eval_batch(r->model, a->x + off * (size_t)dsgd_model_input_dim(r->model),
                                 a->y ? a->y + off * (size_t)dsgd_model_target_dim(r->model) : NULL, (int)len);
}

DSGD_API dsgd_result dsgd_strategy_eval_batch(dsgd_strategy *s, const float *x, const float *y, int count) {
    dsgd__step_args a;
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_check_batch(s, x, y, count, 0, "dsgd_strategy_eval_batch")) != DSGD_OK) return res;
    a.x = x;
    a.y = y;
    a.count = count;
    return dsgd__strategy_dispatch(s, dsgd__replica_eval, &a, "dsgd_strategy_eval_batch");
}

DSGD_API dsgd_result dsgd_strategy_run(dsgd_strategy *s, dsgd_replica_fn fn, void *user_data) {
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_usable(s, "dsgd_strategy_run")) != DSGD_OK) return res;
    if (!fn) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_run: fn is NULL");
    return dsgd__strategy_dispatch(s, fn, user_data, "dsgd_strategy_run");
}

DSGD_API int dsgd_strategy_failed(const dsgd_strategy *s) { return s ? s->failed : 0; }

DSGD_API dsgd_result dsgd_strategy_replica_result(const dsgd_strategy *s, int replica, const char **message) {
    if (message) *message = "";
    if (!s || replica < 0 || replica >= s->n) return DSGD_ERR_INVALID_ARGUMENT;
    if (message) *message = s->reps[replica].msg;
    return s->reps[replica].result;
}

/* >>distributed variables -------------------------------------------------- */

static dsgd_result dsgd__dvar_add(dsgd_strategy *s, const dsgd_dvar_desc *d, int *id) {
    dsgd__dvar *v;
    size_t bytes, i;
    int r;
    if (s->num_vars == s->cap_vars) {
        int cap = s->cap_vars ? 2 * s->cap_vars : 16;
        dsgd__dvar *nv = (dsgd__dvar *)DSGD_REALLOC(s->vars, sizeof(dsgd__dvar) * (size_t)cap);
        if (!nv) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "cannot grow the variable table");
        s->vars = nv;
        s->cap_vars = cap;
    }
    if (dsgd__mul_overflows(d->count, (size_t)s->n * sizeof(float), &bytes))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_OUT_OF_MEMORY, "variable '%s': %zu floats overflow", d->name, d->count);
    v = &s->vars[s->num_vars];
    memset(v, 0, sizeof(*v));
    v->copies = (float *)dsgd__alloc(s->ctx, bytes, "dsgd_strategy_create_variable");
    if (!v->copies) return DSGD_ERR_OUT_OF_MEMORY;
    snprintf(v->name, sizeof(v->name), "%s", d->name);
    v->count = d->count;
    v->sync = d->synchronization == DSGD_SYNC_ON_READ ? DSGD_SYNC_ON_READ : DSGD_SYNC_ON_WRITE;
    v->agg = d->aggregation;
    v->trainable = d->trainable;
    for (r = 0; r < s->n; ++r)
        for (i = 0; i < d->count; ++i) v->copies[(size_t)r * d->count + i] = d->initial_value ? d->initial_value[i] : 0.0f;
    *id = s->num_vars++;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_create_variable(dsgd_strategy *s, const dsgd_dvar_desc *d, int *id) {
    const char *what = "dsgd_strategy_create_variable";
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, what) != DSGD_OK) return DSGD_ERR_STATE;
    if (!d || !id || !d->name || !d->name[0] || d->count == 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: NULL desc or id, empty name or zero count", what);
    if (strlen(d->name) > DSGD_MAX_VARIABLE_NAME)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: the name '%.40s...' has %zu bytes; at most %d (DSGD_MAX_VARIABLE_NAME)", what,
                                  d->name, strlen(d->name), DSGD_MAX_VARIABLE_NAME);
    if (dsgd_strategy_find_variable(s, d->name) >= 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: a variable named '%s' exists", what, d->name);
    if (!dsgd__agg_valid(d->aggregation) || (int)d->synchronization < 0 || (int)d->synchronization > (int)DSGD_SYNC_ON_READ)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: '%s': unknown aggregation %d or synchronization %d",
                                  what, d->name, (int)d->aggregation, (int)d->synchronization);
    if (d->synchronization == DSGD_SYNC_NONE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': synchronization NONE is not supported under a distribution strategy", what, d->name);
    if (d->synchronization == DSGD_SYNC_ON_READ && d->trainable)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': ON_READ synchronization is only for non-trainable variables", what, d->name);
    if (d->synchronization == DSGD_SYNC_ON_READ && d->aggregation == DSGD_AGG_NONE)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s': an ON_READ variable needs an aggregation (SUM, MEAN or ONLY_FIRST_REPLICA) "
                                  "to be read across replicas", what, d->name);
    return dsgd__dvar_add(s, d, id);
}

DSGD_API int dsgd_strategy_find_variable(const dsgd_strategy *s, const char *name) {
    int i;
    if (!s || !name) return -1;
    for (i = 0; i < s->num_vars; ++i)
        if (!strcmp(s->vars[i].name, name)) return i;
    return -1;
}

static dsgd__dvar *dsgd__dvar_get(dsgd_strategy *s, dsgd_ctx *ctx, int id, const void *buf, const char *what) {
    if (id < 0 || id >= s->num_vars || !buf) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: no variable %d, or NULL buffer", what, id);
        return NULL;
    }
    return &s->vars[id];
}

/* Combines the replicas' `value`s of an ON_WRITE variable into out (replica context). */
static dsgd_result dsgd__dvar_combine(dsgd_replica *r, dsgd__dvar *v, const float *value, float *out, const char *what) {
    dsgd_result res = DSGD_OK;
    if (v->agg == DSGD_AGG_NONE)
        return dsgd_ctx_set_error(r->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: '%s' is a mirrored (ON_WRITE) variable with aggregation NONE; updating it in "
                                  "replica context needs SUM, MEAN or ONLY_FIRST_REPLICA", what, v->name);
    memcpy(out, value, sizeof(float) * v->count);
    if (r->s->n == 1) return DSGD_OK;
    if (v->agg == DSGD_AGG_ONLY_FIRST_REPLICA)
        res = dsgd_broadcast(r->comm, out, v->count, 0, 0.0);
    else
        res = dsgd_allreduce(r->comm, out, v->count, v->agg == DSGD_AGG_SUM ? DSGD_REDUCE_SUM : DSGD_REDUCE_MEAN,
                             DSGD_ALLREDUCE_AUTO, 0.0);
    if (res != DSGD_OK) r->comm_failed = 1;
    return res;
}

static dsgd_result dsgd__replica_write(dsgd_replica *r, int id, const float *value, int add, const char *what) {
    dsgd__dvar *v;
    float *local, *tmp;
    size_t i;
    dsgd_result res;
    if (!r) return DSGD_ERR_INVALID_ARGUMENT;
    if (!(v = dsgd__dvar_get(r->s, r->ctx, id, value, what))) return DSGD_ERR_INVALID_ARGUMENT;
    local = v->copies + (size_t)r->rank * v->count;
    if (v->sync == DSGD_SYNC_ON_READ) {
        tmp = (float *)value;
    } else {
        if (!(tmp = dsgd__replica_stage(r, v->count))) return DSGD_ERR_OUT_OF_MEMORY;
        if ((res = dsgd__dvar_combine(r, v, value, tmp, what)) != DSGD_OK) return res;
    }
    for (i = 0; i < v->count; ++i) local[i] = add ? local[i] + tmp[i] : tmp[i];
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_replica_assign(dsgd_replica *r, int id, const float *value) {
    return dsgd__replica_write(r, id, value, 0, "dsgd_replica_assign");
}

DSGD_API dsgd_result dsgd_replica_assign_add(dsgd_replica *r, int id, const float *delta) {
    return dsgd__replica_write(r, id, delta, 1, "dsgd_replica_assign_add");
}

DSGD_API dsgd_result dsgd_replica_read(dsgd_replica *r, int id, float *out) {
    dsgd__dvar *v;
    if (!r) return DSGD_ERR_INVALID_ARGUMENT;
    if (!(v = dsgd__dvar_get(r->s, r->ctx, id, out, "dsgd_replica_read"))) return DSGD_ERR_INVALID_ARGUMENT;
    memcpy(out, v->copies + (size_t)r->rank * v->count, sizeof(float) * v->count);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_read_local(dsgd_strategy *s, int id, int replica, float *out) {
    dsgd__dvar *v;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, "dsgd_strategy_read_local") != DSGD_OK) return DSGD_ERR_STATE;
    if (!(v = dsgd__dvar_get(s, s->ctx, id, out, "dsgd_strategy_read_local"))) return DSGD_ERR_INVALID_ARGUMENT;
    if (replica < 0 || replica >= s->n)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_read_local: no replica %d", replica);
    memcpy(out, v->copies + (size_t)replica * v->count, sizeof(float) * v->count);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_read_variable(dsgd_strategy *s, int id, float *out) {
    dsgd__dvar *v;
    size_t i;
    int r;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, "dsgd_strategy_read_variable") != DSGD_OK) return DSGD_ERR_STATE;
    if (!(v = dsgd__dvar_get(s, s->ctx, id, out, "dsgd_strategy_read_variable"))) return DSGD_ERR_INVALID_ARGUMENT;
    if (v->sync == DSGD_SYNC_ON_WRITE || v->agg == DSGD_AGG_ONLY_FIRST_REPLICA) {
        memcpy(out, v->copies, sizeof(float) * v->count);
        return DSGD_OK;
    }
    for (i = 0; i < v->count; ++i) {
        double acc = 0.0; /* rank order, in double */
        for (r = 0; r < s->n; ++r) acc += v->copies[(size_t)r * v->count + i];
        out[i] = (float)(v->agg == DSGD_AGG_MEAN ? acc / s->n : acc);
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_assign_variable(dsgd_strategy *s, int id, const float *value) {
    dsgd__dvar *v;
    size_t i;
    int r;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__strategy_usable(s, "dsgd_strategy_assign_variable") != DSGD_OK) return DSGD_ERR_STATE;
    if (!(v = dsgd__dvar_get(s, s->ctx, id, value, "dsgd_strategy_assign_variable"))) return DSGD_ERR_INVALID_ARGUMENT;
    for (r = 0; r < s->n; ++r)
        for (i = 0; i < v->count; ++i)
            v->copies[(size_t)r * v->count + i] =
                (v->sync == DSGD_SYNC_ON_READ && v->agg == DSGD_AGG_SUM) ? value[i] / (float)s->n : value[i];
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_strategy_take_metrics(dsgd_strategy *s, dsgd_metrics_slot slot, dsgd_metrics *out) {
    int r, k;
    float vals[3];
    dsgd_result res;
    if (!s) return DSGD_ERR_INVALID_ARGUMENT;
    if ((res = dsgd__strategy_usable(s, "dsgd_strategy_take_metrics")) != DSGD_OK) return res;
    if (!out || (slot != DSGD_METRICS_TRAIN && slot != DSGD_METRICS_EVAL))
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_strategy_take_metrics: bad slot or NULL out");
    /* move each replica's device-side accumulators into its local copies */
    for (r = 0; r < s->n; ++r) {
        dsgd_metrics m;
        if ((res = dsgd_model_take_metrics(s->reps[r].model, slot, &m)) != DSGD_OK)
            return dsgd_ctx_set_error(s->ctx, res, "%s", dsgd_ctx_last_error(s->reps[r].ctx));
        vals[0] = (float)m.loss_sum;
        vals[1] = (float)m.correct;
        vals[2] = (float)m.count;
        for (k = 0; k < 3; ++k) s->vars[s->metric_var[slot] + k].copies[r] += vals[k];
    }
    /* the cross-replica read (SUM), then reset */
    for (k = 0; k < 3; ++k) dsgd_strategy_read_variable(s, s->metric_var[slot] + k, &vals[k]);
    out->loss_sum = vals[0];
    out->correct = vals[1];
    out->count = vals[2];
    for (k = 0; k < 3; ++k)
        for (r = 0; r < s->n; ++r) s->vars[s->metric_var[slot] + k].copies[r] = 0.0f;
    return DSGD_OK;
}

#endif /* DSGD__STRATEGY_IMPL */

/* ------------------------------------------------------------------------
   LICENCE (also in the file LICENSE)

   MIT License

   Copyright (c) 2026 the distsgd authors

   Permission is hereby granted, free of charge, to any person obtaining a copy
   of this software and associated documentation files (the "Software"), to deal
   in the Software without restriction, including without limitation the rights
   to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
   copies of the Software, and to permit persons to whom the Software is
   furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in all
   copies or substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
   IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
   FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
   LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
   SOFTWARE.
*/
