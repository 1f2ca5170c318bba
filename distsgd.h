/* distsgd.h - v0.1.0 - data-parallel distributed SGD in one C99 header.
   MIT licence (see the end of this file).

   distsgd trains neural networks with data-parallel SGD, in the style of
   TensorFlow's tf.distribute, from plain C: models whose parameters live in one
   flat buffer, optimizers, datasets, and (in later versions) replicas,
   collectives and strategies. It depends on libc, libm and POSIX threads only.

   USING IT

     In exactly one C or C++ file:

         #define DISTSGD_IMPLEMENTATION
         #include "distsgd.h"

     Everywhere else, include "distsgd.h" without the define. Link with -lm
     (and -lpthread). Define DISTSGD_STATIC before the include to make every
     function static to that translation unit.

   A COMPLETE PROGRAM (it learns XOR)

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
     default" (documented beside each field), so `dsgd_x_desc d = {0};` plus the
     fields you care about is always valid.

     Compile-time options, defined before the include that has
     DISTSGD_IMPLEMENTATION:
       DISTSGD_STATIC      make the API static (private to one translation unit)
       DSGD_USE_CBLAS      the CPU backend's GEMM calls cblas_sgemm (link e.g.
                           -lopenblas); otherwise a portable cache-blocked GEMM
       DSGD_ASSERT(c)      replaces assert() for internal invariants (never used
                           to check user input)
       DSGD_MALLOC(sz), DSGD_REALLOC(p,sz), DSGD_FREE(p)
                           replace the allocator: define all three or none

   ERRORS

     Every fallible call returns a dsgd_result: DSGD_OK (0) or a negative code.
     dsgd_result_string() names a code. The dsgd_ctx passed to (or owned by) the
     object that failed keeps a message saying what failed, where and why, read
     with dsgd_ctx_last_error(); a logger callback set in dsgd_ctx_desc also
     receives it. The library never calls exit() or abort() on bad input, and
     never sizes an allocation from an unchecked file header.

   THREAD SAFETY

     There is no global state. A dsgd_ctx and everything created from it (its
     backend, models, optimizers) must be used by one thread at a time; give
     each thread its own context. Datasets are read-only after loading and may
     be shared between threads.

   BACKENDS

     A backend is a dsgd_backend_i: a table of compute operations on device
     buffers plus an implementation pointer. Models never touch memory
     directly, so the OpenCL backend (distsgd_cl.h) plugs in unchanged. The CPU
     reference backend, dsgd_cpu_backend_create(), is the one every other
     backend is tested against.

   TRANSPORTS

     Replicas, transports and collectives arrive in the next version.
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
#define DSGD_API static
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
    X(DSGD_ERR_STATE, -10, "invalid state")

typedef enum dsgd_result {
#define DSGD__RESULT_ENUM(name, value, text) name = value,
    DSGD__RESULT_LIST(DSGD__RESULT_ENUM)
#undef DSGD__RESULT_ENUM
    DSGD__RESULT_LAST_ = -11
} dsgd_result;

/* The fixed description of a result code ("invalid argument"); never NULL. */
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

/* Creates a context. desc may be NULL (all defaults).
   Errors: DSGD_ERR_INVALID_ARGUMENT (out NULL), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: any thread; the context is then used by one thread at a time. */
DSGD_API dsgd_result dsgd_ctx_create(const dsgd_ctx_desc *desc, dsgd_ctx **out);
DSGD_API void dsgd_ctx_destroy(dsgd_ctx *ctx);
/* The message of the last error recorded on ctx ("" when none). The pointer
   stays valid until the next failing call on ctx. */
DSGD_API const char *dsgd_ctx_last_error(const dsgd_ctx *ctx);
/* The result code of the last error recorded on ctx (DSGD_OK when none). */
DSGD_API dsgd_result dsgd_ctx_last_result(const dsgd_ctx *ctx);
DSGD_API void dsgd_ctx_clear_error(dsgd_ctx *ctx);
/* Records an error on ctx (printf-style message), logs it, and returns r.
   Backends and transports written outside this file use it too. ctx may be
   NULL, then only r is returned. */
DSGD_API dsgd_result dsgd_ctx_set_error(dsgd_ctx *ctx, dsgd_result r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Sends a message to the context's logger, if any. */
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
   ones must be set. Each operation returns DSGD_OK or an error recorded on the
   context the backend was created with. Operations may be asynchronous;
   `read` and `finish` complete all queued work. */
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
       A class index outside [0, c) is DSGD_ERR_INVALID_ARGUMENT. */
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
       of NaN and infinite entries. */
    dsgd_result (*norm_check)(void *impl, dsgd_ref x, size_t n, double *sumsq,
                              size_t *nonfinite);
    /* optional: wait until all queued operations are done. */
    dsgd_result (*finish)(void *impl);
} dsgd_backend_i;

/* Fills *out with the CPU reference backend. Errors are recorded on ctx, which
   must outlive the backend; destroy with out->destroy(out->impl).
   Errors: DSGD_ERR_INVALID_ARGUMENT, DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: one backend instance per thread. */
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
   initialised on the host from desc->seed and uploaded. Errors recorded on
   ctx: DSGD_ERR_INVALID_ARGUMENT (bad sizes, no layers, a final activation
   other than NONE with SOFTMAX_XENT), DSGD_ERR_OUT_OF_MEMORY, backend errors. */
DSGD_API dsgd_result dsgd_model_create(dsgd_ctx *ctx, const dsgd_model_desc *desc,
                                       dsgd_model **out);
DSGD_API void dsgd_model_destroy(dsgd_model *m);

DSGD_API dsgd_ctx *dsgd_model_ctx(const dsgd_model *m);
DSGD_API const dsgd_backend_i *dsgd_model_backend(const dsgd_model *m);
DSGD_API size_t dsgd_model_num_params(const dsgd_model *m);
DSGD_API int dsgd_model_num_variables(const dsgd_model *m);
/* The i-th variable, NULL when i is out of range. */
DSGD_API const dsgd_variable *dsgd_model_variable(const dsgd_model *m, int i);
DSGD_API int dsgd_model_input_dim(const dsgd_model *m);
DSGD_API int dsgd_model_output_dim(const dsgd_model *m);
/* Floats per sample in a target array: 1 for SOFTMAX_XENT, output_dim for MSE. */
DSGD_API int dsgd_model_target_dim(const dsgd_model *m);
/* The device buffers holding all parameters and all gradients. */
DSGD_API dsgd_ref dsgd_model_params(const dsgd_model *m);
DSGD_API dsgd_ref dsgd_model_grads(const dsgd_model *m);

/* Copies all parameters (or gradients) between the model and host memory;
   count must equal dsgd_model_num_params(). Errors: DSGD_ERR_SHAPE, backend. */
DSGD_API dsgd_result dsgd_model_get_params(dsgd_model *m, float *dst, size_t count);
DSGD_API dsgd_result dsgd_model_set_params(dsgd_model *m, const float *src, size_t count);
DSGD_API dsgd_result dsgd_model_get_grads(dsgd_model *m, float *dst, size_t count);

/* Forward and backward pass on one batch, x (count, input_dim) and y (count,
   target_dim) in host memory. The gradient buffer is overwritten with
   grad_scale * d(sum of per-sample losses)/d params: pass 1/count for the
   batch mean, 1/global_count when batches are split across replicas. The
   batch's loss and accuracy accumulate in the TRAIN metrics slot.
   Errors: DSGD_ERR_INVALID_ARGUMENT (count outside 1..max_batch, NULL,
   a class index out of range), backend errors. */
DSGD_API dsgd_result dsgd_model_compute_gradients(dsgd_model *m, const float *x,
                                                  const float *y, int count,
                                                  float grad_scale);
/* Forward pass only; the loss and accuracy accumulate in the EVAL slot. y may
   be NULL (no metrics; use dsgd_model_read_output for predictions). */
DSGD_API dsgd_result dsgd_model_eval_batch(dsgd_model *m, const float *x,
                                           const float *y, int count);
/* Copies the last forward pass's outputs (count, output_dim), before softmax. */
DSGD_API dsgd_result dsgd_model_read_output(dsgd_model *m, float *dst, int count);
/* Reads a metrics slot and resets it to zero. */
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

/* Creates an optimizer for m (its state lives on m's backend). Errors:
   DSGD_ERR_INVALID_ARGUMENT (negative lr, beta outside [0,1), ...), memory. */
DSGD_API dsgd_result dsgd_optimizer_create(dsgd_model *m, const dsgd_optimizer_desc *desc,
                                           dsgd_optimizer **out);
DSGD_API void dsgd_optimizer_destroy(dsgd_optimizer *opt);
/* Applies one update from the model's gradient buffer: clipping (if set), then
   the optimizer's rule with the scheduled learning rate; advances the step.
   Errors: DSGD_ERR_NON_FINITE when clipping is on and the gradient holds NaN
   or infinity (nothing is updated), backend errors. */
DSGD_API dsgd_result dsgd_optimizer_step(dsgd_optimizer *opt);
/* Number of steps applied so far. */
DSGD_API int64_t dsgd_optimizer_steps(const dsgd_optimizer *opt);
/* The global L2 norm of the last gradient clipping saw (0 before). */
DSGD_API double dsgd_optimizer_last_grad_norm(const dsgd_optimizer *opt);
/* The learning rate the schedule gives at step t, peak lr `lr`. */
DSGD_API float dsgd_lr_at(const dsgd_lr_schedule *s, float lr, int64_t t);
/* The linear scaling rule (Goyal et al. 2017): base_lr * global_batch / base_batch. */
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
   are scaled to [0, 1]. num_classes: 0 means 10. Every malformed input is
   DSGD_ERR_FORMAT (or DSGD_ERR_IO) with a message naming the file, the byte
   offset or sample, and what is wrong. */
DSGD_API dsgd_result dsgd_dataset_load_idx(dsgd_ctx *ctx, const char *images_path,
                                           const char *labels_path, int num_classes,
                                           dsgd_dataset *out);

typedef struct dsgd_csv_desc {
    int label_column;    /* 1-based column holding the class label; 0: the last */
    int num_classes;     /* labels must be integers in [0, num_classes);
                            0: num_classes = largest label + 1 */
    int header_lines;    /* lines to skip at the top; default 0 */
    float feature_scale; /* features are multiplied by this; default 1 */
} dsgd_csv_desc;

/* Loads a comma-separated file of numbers, one sample per line, all lines with
   the same number of fields. desc may be NULL. Errors: DSGD_ERR_IO,
   DSGD_ERR_FORMAT with file, line and column (non-numeric field, ragged line,
   non-integer or out-of-range label, empty file). */
DSGD_API dsgd_result dsgd_dataset_load_csv(dsgd_ctx *ctx, const char *path,
                                           const dsgd_csv_desc *desc, dsgd_dataset *out);
/* Allocates an empty dataset of n samples (x and y zeroed). */
DSGD_API dsgd_result dsgd_dataset_alloc(dsgd_ctx *ctx, size_t n, int dim, int target_dim,
                                        int num_classes, dsgd_dataset *out);
DSGD_API void dsgd_dataset_free(dsgd_dataset *ds);
/* Shuffles src by seed and splits it: the first `first` samples go to a, the
   rest to b (both newly allocated). Errors: first > n, memory. */
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
   on (seed, e). Errors: DSGD_ERR_INVALID_ARGUMENT when there would be no batch
   (n == 0, batch == 0, or drop_last with batch > n), DSGD_ERR_OUT_OF_MEMORY. */
DSGD_API dsgd_result dsgd_sampler_init(dsgd_ctx *ctx, dsgd_sampler *s, size_t n, size_t batch,
                                       uint64_t seed, int shuffle, int drop_last);
DSGD_API void dsgd_sampler_free(dsgd_sampler *s);
DSGD_API void dsgd_sampler_set_epoch(dsgd_sampler *s, uint64_t epoch);
DSGD_API size_t dsgd_sampler_num_batches(const dsgd_sampler *s);
/* Indices of batch b of the current epoch; returns their count (the last
   batch may be short unless drop_last), 0 when b is out of range. */
DSGD_API size_t dsgd_sampler_batch(const dsgd_sampler *s, size_t b, const size_t **idx);

/* ---------------------------------------------------------------- utilities */

/* SplitMix64 (Steele et al. 2014): the library's only random number source. */
DSGD_API uint64_t dsgd_rng_next(uint64_t *state);
/* Uniform in [0, 1). */
DSGD_API double dsgd_rng_uniform(uint64_t *state);
/* Monotonic clock in seconds. */
DSGD_API double dsgd_now(void);

#ifdef __cplusplus
}
#endif

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
#define DSGD__MR 6
#define DSGD__NR 16
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
/* GNU vector extensions: twelve 8-wide accumulators stay in registers (gcc
   does not vectorise the plain loop below with the accumulators in them). */
typedef float dsgd__v8 __attribute__((vector_size(32)));
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
        DSGD__V8_LOAD(b1, bp + 8);
        c00 += b0 * ap[0]; c01 += b1 * ap[0];
        c10 += b0 * ap[1]; c11 += b1 * ap[1];
        c20 += b0 * ap[2]; c21 += b1 * ap[2];
        c30 += b0 * ap[3]; c31 += b1 * ap[3];
        c40 += b0 * ap[4]; c41 += b1 * ap[4];
        c50 += b0 * ap[5]; c51 += b1 * ap[5];
        ap += DSGD__MR;
        bp += DSGD__NR;
    }
    memcpy(acc[0], &c00, 32); memcpy(acc[0] + 8, &c01, 32);
    memcpy(acc[1], &c10, 32); memcpy(acc[1] + 8, &c11, 32);
    memcpy(acc[2], &c20, 32); memcpy(acc[2] + 8, &c21, 32);
    memcpy(acc[3], &c30, 32); memcpy(acc[3] + 8, &c31, 32);
    memcpy(acc[4], &c40, 32); memcpy(acc[4] + 8, &c41, 32);
    memcpy(acc[5], &c50, 32); memcpy(acc[5] + 8, &c51, 32);
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

/* Opens path and returns its size, or records an error. */
static FILE *dsgd__open_sized(dsgd_ctx *ctx, const char *path, size_t *size) {
    FILE *f;
    long end;
    struct stat st;
    if (!path) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "file path is NULL");
        return NULL;
    }
    f = fopen(path, "rb");
    if (!f) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: not a regular file", path);
        fclose(f);
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
    scale = d.feature_scale == 0.0f ? 1.0f : d.feature_scale;
    text = dsgd__read_text(ctx, path, &len);
    if (!text) return dsgd_ctx_last_result(ctx);
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
                c = (int)col - ((int)col + 1 > label_col ? 1 : 0);
                out->x[row * out->dim + (size_t)c] = (float)v * scale;
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
