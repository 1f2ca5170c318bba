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
/* Copies the samples idx[0..count) into x (count, dim) and y (count, target_dim). */
DSGD_API void dsgd_dataset_gather(const dsgd_dataset *ds, const size_t *idx, size_t count,
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
   on (seed, e). Errors: n == 0, batch == 0, memory. */
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
