/* distsgd/model.h - models: the interface, the built-in dense network, variables over flat buffers
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   MODELS

     A dsgd_model is one replica's copy of a network: its variables laid out
     in one flat parameter buffer and, at the same offsets, one flat gradient
     buffer, on one backend, plus the functions that compute gradients. The
     strategies, the optimizers, the checkpoints and the parameter servers
     see only that: variables, two flat buffers and a function that fills
     the gradient one. Where the functions come from:

       the built-in network   dsgd_model_desc.layers: dense layers (llm.c's
                              style over the backend's GEMM and kernels)
       a model of your own    dsgd_model_desc.custom, a dsgd_model_i table,
                              with dsgd_model_desc.variables declaring its
                              variables (name, shape, initial values,
                              aggregation)

     The built-in network is one implementation of dsgd_model_i (its table
     is internal); nothing downstream tells the two apart, so every strategy
     (one_device, mirrored, central storage, the parameter servers) trains
     either unchanged.

   MODELS OF YOUR OWN

     Declare the variables; the library lays them out in declaration order
     (offsets in floats, no padding), initialises them on the host (from
     `initial`, else drawn from `init` and the model's seed) and uploads
     them. Then compute_gradients(state, m, batch, grad_scale, metrics) must
     leave in the gradient buffer grad_scale * d(sum of the batch's
     per-sample losses)/d(parameters), the same convention as the built-in
     network's, so that the strategies' MEAN, SUM and ONLY_FIRST_REPLICA
     aggregations and the N x B == 1 x NB contract hold. The gradient buffer
     is zeroed before the call unless the table sets writes_all_gradients
     (a promise that every element is written). Reach the buffers through
     dsgd_model_backend(m) with dsgd_model_params/grads(m) and the
     variables' offsets, or, on backends whose buffers the host addresses
     (the CPU backend), through dsgd_model_host_params/grads(m) as plain
     float arrays. Add the batch's loss sum and correct predictions to
     *metrics (host side; the library counts the samples), or accumulate
     them on the device at dsgd_model_stats(m, slot) as the backend's loss
     operation does; dsgd_model_take_metrics adds both.
     A batch is rows of x (count, input_dim) and y (count, target_dim) when
     the strategy slices one global batch, or whatever a dsgd_batch_fn hands
     each replica (dsgd_strategy_train_step_fn: token sequences, variable
     lengths) in dsgd_batch.data.
*/
#ifndef DSGD__PART_MODEL_DECL
#define DSGD__PART_MODEL_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- model */

typedef enum dsgd_init {
    DSGD_INIT_AUTO = 0,     /* built-in layers: He normal before ReLU, Glorot uniform
                               otherwise; declared variables: ZEROS at rank 1,
                               Glorot uniform otherwise */
    DSGD_INIT_HE_NORMAL,    /* N(0, 2/fan_in), He et al. 2015 */
    DSGD_INIT_HE_UNIFORM,   /* U(-sqrt(6/fan_in), +) */
    DSGD_INIT_GLOROT_UNIFORM, /* U(-sqrt(6/(fan_in+fan_out)), +), Glorot & Bengio 2010 */
    DSGD_INIT_GLOROT_NORMAL, /* N(0, 2/(fan_in+fan_out)) */
    DSGD_INIT_ZEROS         /* all zero */
} dsgd_init;
/* fan_in and fan_out of a variable of shape (d0, ..., dk): the product
   d0 * ... * d(k-1) and dk (a dense kernel (in, out): in and out); a rank-1
   variable has fan_in = fan_out = d0. */

/* How the replicas' values of a variable combine. For variables created
   with dsgd_strategy_create_variable and written in replica context this is
   tf.VariableAggregation's meaning. For model variables it says how the
   gradients combine (dsgd_model_desc.variables, dsgd_strategy_set_aggregation),
   which is ours: Keras ignores a variable's aggregation there. */
typedef enum dsgd_aggregation {
    DSGD_AGG_NONE = 0,
    DSGD_AGG_SUM = 1,
    DSGD_AGG_MEAN = 2,
    DSGD_AGG_ONLY_FIRST_REPLICA = 3
} dsgd_aggregation;
#define DSGD_AGG_COUNT (DSGD_AGG_ONLY_FIRST_REPLICA + 1)

/* One dense layer, y = act(x W + b), W of shape (inputs, units). */
typedef struct dsgd_layer_desc {
    int units;
    dsgd_activation activation; /* default NONE */
    dsgd_init init;             /* default AUTO; biases start at zero */
} dsgd_layer_desc;

typedef enum dsgd_image_layer_kind {
    DSGD_IMAGE_CONV2D = 0, /* y = act(conv(x, W) + b): filters output channels,
                              W (kernel, kernel, in channels, filters), zero
                              padding on every side; im2col + GEMM */
    DSGD_IMAGE_MAXPOOL     /* y = the maximum of each kernel x kernel window,
                              channel by channel, no padding; filters,
                              activation and init unused */
} dsgd_image_layer_kind;
#define DSGD_IMAGE_LAYER_COUNT (DSGD_IMAGE_MAXPOOL + 1)

/* One image layer of the built-in network. Image layers come first, over
   the NHWC image input_shape (backend.h, IMAGES); the dense layers then read
   the last image as one flat row per sample (the flatten is nothing). */
typedef struct dsgd_image_layer_desc {
    dsgd_image_layer_kind kind;
    int filters;                /* CONV2D: output channels, >= 1 */
    int kernel;                 /* the window's side, >= 1 */
    int stride;                 /* >= 0; 0: 1 for CONV2D, kernel for MAXPOOL */
    int padding;                /* CONV2D: >= 0 */
    dsgd_activation activation; /* CONV2D; default NONE */
    dsgd_init init;             /* CONV2D; default AUTO (fan_in k k c, fan_out filters) */
} dsgd_image_layer_desc;

/* The default of dsgd_model_desc.max_batch. */
#define DSGD_DEFAULT_MAX_BATCH 256

#define DSGD_MAX_NAME 32
#define DSGD_MAX_RANK 4
/* The most variables a model declares. */
#define DSGD_MAX_VARIABLES 4096

/* A variable a model of your own declares. */
typedef struct dsgd_variable_desc {
    const char *name;             /* unique in the model, 1..DSGD_MAX_NAME-1 bytes */
    int rank;                     /* 1..DSGD_MAX_RANK */
    int shape[DSGD_MAX_RANK];     /* each >= 1; the variable holds their product */
    dsgd_init init;               /* when initial is NULL; default AUTO */
    const float *initial;         /* optional: the initial values (copied at
                                     creation; any values, non-finite included) */
    dsgd_aggregation aggregation; /* how the strategies combine its gradient;
                                     0 (NONE): MEAN, the default. A strategy's
                                     dsgd_strategy_set_aggregation changes it */
} dsgd_variable_desc;

/* One replica's batch, as a model's functions receive it. x (count,
   input_dim) and y (count, target_dim) are host rows when the batch is a
   slice of one global batch, and may be NULL when it comes from a
   dsgd_batch_fn, which may hand anything in data instead. count is the
   number of samples, the unit of MEAN's denominators and of the metrics. */
typedef struct dsgd_batch {
    const float *x;
    const float *y;
    int count;
    const void *data;
} dsgd_batch;

typedef struct dsgd_model dsgd_model;
typedef struct dsgd_metrics dsgd_metrics;

/* A model's functions (MODELS OF YOUR OWN above). state is what create set,
   or dsgd_model_desc.user_data when create is NULL. The functions run on the
   model's thread (a replica's, under a strategy) and return DSGD_OK or an
   error; an error they return without recording a message on
   dsgd_model_ctx(m) gets one naming the model and the function. */
typedef struct dsgd_model_i {
    const char *name;
    /* optional: per-model state (scratch buffers on dsgd_model_backend(m), a
       tokenizer, ...), made after the variables are laid out and
       initialised; called once per replica. */
    dsgd_result (*create)(void *user_data, dsgd_model *m, void **state);
    /* optional: frees what create made. */
    void (*destroy)(void *state);
    /* required: the gradient of the batch (count >= 1) as said above; add
       the batch's loss sum and correct predictions to *metrics (its count is
       ignored: the library adds batch->count). */
    dsgd_result (*compute_gradients)(void *state, dsgd_model *m, const dsgd_batch *batch,
                                     float grad_scale, dsgd_metrics *metrics);
    /* optional: loss and correct predictions of a batch, nothing else
       changed; without it dsgd_model_eval_batch is DSGD_ERR_UNSUPPORTED. */
    dsgd_result (*evaluate)(void *state, dsgd_model *m, const dsgd_batch *batch, dsgd_metrics *metrics);
    /* non-zero: compute_gradients writes every gradient element, so the
       library does not zero the buffer first. */
    int writes_all_gradients;
} dsgd_model_i;

typedef struct dsgd_model_desc {
    int input_dim;              /* floats per sample in x; a custom model that
                                   only takes batches from a dsgd_batch_fn may
                                   leave it 0; with image layers, 0 means
                                   the product of input_shape */
    const dsgd_layer_desc *layers; /* the built-in network's dense layers (after
                                      its image layers, below); NULL with custom */
    int num_layers;
    dsgd_loss loss;             /* the built-in network's; default SOFTMAX_XENT */
    int max_batch;              /* largest batch passed to the model; 0:
                                   DSGD_DEFAULT_MAX_BATCH */
    uint64_t seed;              /* initialisation seed (0 is a valid seed) */
    /* The backend to run on; NULL: a CPU backend owned by the model. The
       backend must outlive the model and have been created with the same ctx. */
    const dsgd_backend_i *backend;
    /* A model of your own instead of layers: its table (copied; the strings
       and functions it points to must outlive the model), the user_data its
       create (or, without create, every function) receives, and its
       variables (copied at creation). */
    const dsgd_model_i *custom;
    void *user_data;
    const dsgd_variable_desc *variables;
    int num_variables;          /* 1..DSGD_MAX_VARIABLES */
    int target_dim;             /* custom: floats per sample in y; 0: 1 (a
                                   class index) */
    int output_dim;             /* custom: what dsgd_model_output_dim reports
                                   (informational) */
    /* The built-in network's image layers, before its dense ones, over
       input images of input_shape (height, width, channels), NHWC. */
    const dsgd_image_layer_desc *image_layers;
    int num_image_layers;
    int input_shape[3];
} dsgd_model_desc;

/* A variable is a named view into the model's flat parameter buffer; its
   gradient sits at the same offset of the flat gradient buffer. */
typedef struct dsgd_variable {
    char name[DSGD_MAX_NAME]; /* "dense0/kernel", "dense0/bias", ... */
    size_t offset;            /* in floats, from the start of the flat buffer */
    size_t count;
    int rank;
    int shape[DSGD_MAX_RANK];
    dsgd_aggregation aggregation; /* as declared (MEAN for the built-in network);
                                     a strategy starts from it */
} dsgd_variable;

typedef enum dsgd_metrics_slot {
    DSGD_METRICS_TRAIN = 0, /* accumulated by dsgd_model_compute_gradients */
    DSGD_METRICS_EVAL = 1   /* accumulated by dsgd_model_eval_batch */
} dsgd_metrics_slot;

struct dsgd_metrics {
    double loss_sum; /* sum of per-sample losses */
    double correct;  /* number of correct predictions */
    double count;    /* number of samples */
};

/* Creates a model: the built-in network (desc->image_layers, then
   desc->layers: variables in layer order, kernel then bias, named
   "conv<i>/..." after the image layer's index and "dense<l>/..." after the
   dense layer's; kernels drawn from desc->seed, biases zero) or
   a custom one (desc->custom and desc->variables, see MODELS OF YOUR OWN);
   the parameters are initialised on the host and uploaded, the gradients
   start at zero, then custom->create runs.
   With desc->backend NULL the model creates (and owns) a CPU backend.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out or desc NULL,
   a negative max_batch, a backend lacking a required operation; the
   built-in network: input_dim <= 0 without image layers, no layers, an
   unknown loss, a layer with units <= 0 or an unknown activation or init,
   a final activation other than NONE with SOFTMAX_XENT; image layers: an
   input_shape with a dimension < 1 or whose product is not input_dim (when
   set), an unknown kind, filters < 1, kernel < 1, a negative stride or
   padding, a window larger than its padded input, a backend without the
   image operations (backend.h, IMAGES); a custom model: both layers and
   custom, no compute_gradients, no variables or more than
   DSGD_MAX_VARIABLES, a variable with no name, a name too long or used
   twice, a rank outside 1..DSGD_MAX_RANK, a dimension < 1, more than 2^40
   parameters, an unknown init or aggregation; negative input, target or
   output dims), DSGD_ERR_OUT_OF_MEMORY, backend errors, what custom->create
   returns.
   Thread safety: the context's thread; the model then belongs to it. */
DSGD_API dsgd_result dsgd_model_create(dsgd_ctx *ctx, const dsgd_model_desc *desc,
                                       dsgd_model **out);
/* Runs custom->destroy, frees the model's buffers, and its backend when the
   model created it; m NULL: nothing. Destroy its optimizers first.
   Thread safety: the model's thread. */
DSGD_API void dsgd_model_destroy(dsgd_model *m);

/* Getters. With m NULL they return NULL, 0, or a ref whose buf is NULL.
     dsgd_model_ctx            the context the model records errors on
     dsgd_model_backend        the model's backend table (m's own copy)
     dsgd_model_name           "dense" for the built-in network, else the
                               table's name ("custom" when it has none)
     dsgd_model_state          the custom model's state (what create set, or
                               user_data); NULL for the built-in network
     dsgd_model_num_params     floats in the parameter (and gradient) buffer
     dsgd_model_num_variables  2 per dense or conv2d layer, or as declared
     dsgd_model_variable       the i-th variable ("dense0/kernel",
                               "dense0/bias", ...); NULL when i is out of range
     dsgd_model_find_variable  the index of the variable named name, -1
                               when there is none
     dsgd_model_input_dim, dsgd_model_output_dim
     dsgd_model_target_dim     floats per sample in a target array: 1 for
                               SOFTMAX_XENT, output_dim for MSE; a custom
                               model's target_dim
     dsgd_model_max_batch      the largest batch (the default applied)
     dsgd_model_params, dsgd_model_grads
                               the device buffers holding all parameters and
                               all gradients (offset 0)
     dsgd_model_host_params, dsgd_model_host_grads
                               the same as host arrays when the backend gives
                               host pointers (buffer_host_ptr: the CPU
                               backend), else NULL
     dsgd_model_stats          two device floats, the loss sum and the correct
                               count of a metrics slot, that
                               dsgd_model_take_metrics reads (the backend's
                               loss operation adds to them)
   Errors: none. Thread safety: any thread while m lives (they read what
   creation fixed; what the refs and pointers point at is the model
   thread's). */
DSGD_API dsgd_ctx *dsgd_model_ctx(const dsgd_model *m);
DSGD_API const dsgd_backend_i *dsgd_model_backend(const dsgd_model *m);
DSGD_API const char *dsgd_model_name(const dsgd_model *m);
DSGD_API void *dsgd_model_state(const dsgd_model *m);
DSGD_API size_t dsgd_model_num_params(const dsgd_model *m);
DSGD_API int dsgd_model_num_variables(const dsgd_model *m);
DSGD_API const dsgd_variable *dsgd_model_variable(const dsgd_model *m, int i);
DSGD_API int dsgd_model_find_variable(const dsgd_model *m, const char *name);
DSGD_API int dsgd_model_input_dim(const dsgd_model *m);
DSGD_API int dsgd_model_output_dim(const dsgd_model *m);
DSGD_API int dsgd_model_target_dim(const dsgd_model *m);
DSGD_API int dsgd_model_max_batch(const dsgd_model *m);
DSGD_API dsgd_ref dsgd_model_params(const dsgd_model *m);
DSGD_API dsgd_ref dsgd_model_grads(const dsgd_model *m);
DSGD_API float *dsgd_model_host_params(const dsgd_model *m);
DSGD_API float *dsgd_model_host_grads(const dsgd_model *m);
DSGD_API dsgd_ref dsgd_model_stats(const dsgd_model *m, dsgd_metrics_slot slot);

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
   dsgd_model_gradients takes a dsgd_batch (a custom model's
   data included); dsgd_model_compute_gradients(m, x, y, count, s) is it
   with {x, y, count, NULL}.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; batch NULL;
   count outside 1..max_batch; the built-in network: x or y NULL, a class
   index out of range, found on the host before any work), backend errors,
   what a custom model's compute_gradients returns.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_compute_gradients(dsgd_model *m, const float *x,
                                                  const float *y, int count,
                                                  float grad_scale);
DSGD_API dsgd_result dsgd_model_gradients(dsgd_model *m, const dsgd_batch *batch,
                                                        float grad_scale);
/* GRADIENT READINESS. While compute_gradients runs, a model may say that a
   variable's gradient is final, so that a strategy that overlaps its
   exchange with backward (dsgd_strategy_desc.overlap) can start
   all-reducing the buckets that hold it while backward goes on. The
   built-in network says so layer by layer as its backward pass goes down:
   a layer's kernel and bias once their gradients are written, before the
   layer's input gradient. A custom model may call it from its
   compute_gradients, at most once per variable and call (later calls for
   the same variable do nothing); a variable it never names is final when
   compute_gradients returns. After the call the model must not write that
   variable's gradient again in this call. Outside such a strategy it does
   nothing. Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded;
   variable out of range), and what the strategy's preparation of a bucket
   returns (backend errors): return it from compute_gradients.
   Thread safety: the model's thread, inside compute_gradients. */
DSGD_API dsgd_result dsgd_model_variable_ready(dsgd_model *m, int variable);
/* Forward pass only; the loss and accuracy accumulate in the EVAL slot. y may
   be NULL (no metrics; use dsgd_model_read_output for predictions).
   dsgd_model_evaluate takes a dsgd_batch.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; batch NULL;
   count outside 1..max_batch; the built-in network: x NULL, a class index
   out of range), DSGD_ERR_UNSUPPORTED (a custom model without evaluate),
   backend errors, what a custom model's evaluate returns.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_eval_batch(dsgd_model *m, const float *x,
                                           const float *y, int count);
DSGD_API dsgd_result dsgd_model_evaluate(dsgd_model *m, const dsgd_batch *batch);
/* Copies the first count rows of the last forward pass's outputs (count,
   output_dim), before softmax. The built-in network only.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; dst NULL;
   count outside 1..the last pass's batch, or no pass yet),
   DSGD_ERR_UNSUPPORTED (a custom model), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_read_output(dsgd_model *m, float *dst, int count);
/* Reads a metrics slot (the device accumulators plus what custom functions
   added on the host) and resets it to zero.
   Errors: DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing recorded; out NULL;
   an unknown slot), backend errors.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_take_metrics(dsgd_model *m, dsgd_metrics_slot slot,
                                             dsgd_metrics *out);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_MODEL_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_MODEL_IMPL)
#define DSGD__PART_MODEL_IMPL

/* >>model ------------------------------------------------------------------ */

struct dsgd_model {
    dsgd_ctx *ctx;
    dsgd_backend_i be;     /* the backend's table, copied */
    int owns_backend;
    dsgd_model_i fn;       /* the functions (the built-in network's or custom's), copied */
    void *state;           /* what fn.create set, or user_data */
    int has_state;         /* fn.create succeeded: destroy runs fn.destroy */
    struct dsgd__net *net; /* the built-in network's state (NULL: custom) */
    int input_dim, target_dim, output_dim, max_batch;
    dsgd_variable *vars;
    int num_vars;
    size_t num_params;
    dsgd_buffer *params, *grads;
    dsgd_buffer *stats;    /* [train loss, train correct, eval loss, eval correct] */
    double count[2];       /* samples per slot */
    double host[2][2];     /* per slot: loss and correct that custom functions added */
    /* who hears of dsgd_model_variable_ready (a strategy's overlap), and
       what it passes back; NULL: nobody */
    dsgd_result (*on_ready)(void *user, int variable);
    void *on_ready_user;
};

/* Sets (fn NULL: clears) the listener of dsgd_model_variable_ready. */
static void dsgd__model_listen(dsgd_model *m, dsgd_result (*fn)(void *user, int variable), void *user) {
    m->on_ready = fn;
    m->on_ready_user = user;
}

static dsgd_ref dsgd__ref(dsgd_buffer *buf, size_t off) {
    dsgd_ref r;
    r.buf = buf;
    r.off = off;
    return r;
}

static int dsgd__agg_valid(dsgd_aggregation a) { return (int)a >= 0 && (int)a < (int)DSGD_AGG_COUNT; }
static int dsgd__init_valid(dsgd_init i) { return (int)i >= 0 && (int)i <= (int)DSGD_INIT_ZEROS; }

/* Draws n values of a variable with the given fans on the host; init is
   resolved (not AUTO). */
static void dsgd__init_values(float *w, size_t n, double fan_in, double fan_out, dsgd_init init, uint64_t seed) {
    size_t i;
    uint64_t st = seed;
    for (i = 0; i < n; ++i) {
        double v;
        switch (init) {
        case DSGD_INIT_ZEROS: v = 0.0; break;
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

static void dsgd__model_free_buffer(dsgd_model *m, dsgd_buffer **b) {
    if (*b && m->be.buffer_destroy) m->be.buffer_destroy(m->be.impl, *b);
    *b = NULL;
}

DSGD_API void dsgd_model_destroy(dsgd_model *m) {
    if (!m) return;
    if (m->has_state && m->fn.destroy) m->fn.destroy(m->state);
    dsgd__model_free_buffer(m, &m->params);
    dsgd__model_free_buffer(m, &m->grads);
    dsgd__model_free_buffer(m, &m->stats);
    if (m->owns_backend && m->be.destroy) m->be.destroy(m->be.impl);
    DSGD_FREE(m->vars);
    DSGD_FREE(m);
}

static int dsgd__backend_complete(const dsgd_backend_i *b) {
    return b->buffer_create && b->buffer_destroy && b->write && b->read && b->copy && b->fill &&
           b->scale && b->axpy && b->gemm && b->bias_act_forward && b->act_backward &&
           b->bias_backward && b->loss && b->optimizer_update && b->norm_check;
}

/* One variable to lay out: its public record (name, shape, aggregation),
   how to initialise it, and from which seed stream. */
typedef struct dsgd__var_plan {
    dsgd_variable v;
    const float *initial;
    dsgd_init init;       /* resolved: never AUTO */
    uint64_t stream;
} dsgd__var_plan;

/* ---- the built-in network: image and dense layers, one implementation of dsgd_model_i */

enum { DSGD__DENSE = 0, DSGD__CONV, DSGD__POOL };

/* One layer of the network, image or dense, with its geometry: its input
   image (h, w, c) and output image (oh, ow, oc); a dense layer's are (1, 1,
   inputs) and (1, 1, units). */
typedef struct dsgd__layer {
    int kind;               /* DSGD__DENSE, _CONV, _POOL */
    int index;              /* among the desc's dense or image layers (the name) */
    int units;              /* dense units, conv filters; pool: its channels */
    dsgd_activation activation;
    dsgd_init init;
    int kernel, stride, pad; /* image layers, stride resolved */
    int h, w, c, oh, ow, oc;
} dsgd__layer;

typedef struct dsgd__net {
    int num_layers;
    dsgd_loss loss;
    dsgd__layer *layers;
    int *var;              /* per layer: its kernel's variable index (bias next), -1 for max-pool */
    int *dims;             /* dims[0] = input_dim, dims[l + 1] = layer l's output floats per sample */
    dsgd_buffer *acts;     /* x, then every layer's output, each (max_batch, dims[l]) */
    size_t *act_off;
    dsgd_buffer *delta;    /* two (max_batch, max dim) halves, used in turn */
    size_t delta_half;
    dsgd_buffer *col;      /* every conv layer's im2col, (max_batch oh ow, k k c) each; with the
                              backend's conv_gemm, one scratch for the input gradients' columns */
    size_t *col_off;       /* per layer: its im2col's offset in col (0 for the others) */
    dsgd_buffer *targets;  /* (max_batch, target_dim) */
    int last_count;        /* batch size of the last forward pass */
    dsgd_model *m;
} dsgd__net;

static int dsgd__net_has_images(const dsgd_model_desc *desc) { return desc->num_image_layers > 0; }

/* The layers of desc, image layers first, with their geometry (the desc's
   fields as they are; dsgd__net_check says what is wrong). Allocated with
   DSGD_MALLOC (NULL: out of memory); *L their number. */
static dsgd__layer *dsgd__net_layers(const dsgd_model_desc *desc, int *L) {
    int i, n = 0, h = 1, w = 1, c = desc->input_dim;
    int ni = desc->image_layers ? DSGD__MAX(desc->num_image_layers, 0) : 0;
    int nd = desc->layers ? DSGD__MAX(desc->num_layers, 0) : 0;
    dsgd__layer *ls = (dsgd__layer *)DSGD_MALLOC(sizeof(dsgd__layer) * (size_t)(ni + nd ? ni + nd : 1));
    if (!ls) return NULL;
    memset(ls, 0, sizeof(dsgd__layer) * (size_t)(ni + nd ? ni + nd : 1));
    if (ni) {
        h = desc->input_shape[0];
        w = desc->input_shape[1];
        c = desc->input_shape[2];
    }
    for (i = 0; i < ni + nd; ++i) {
        dsgd__layer *y = &ls[n++];
        y->h = h; y->w = w; y->c = c;
        if (i < ni) {
            const dsgd_image_layer_desc *d = &desc->image_layers[i];
            y->kind = d->kind == DSGD_IMAGE_MAXPOOL ? DSGD__POOL : DSGD__CONV;
            y->index = i;
            y->activation = y->kind == DSGD__CONV ? d->activation : DSGD_ACT_NONE;
            y->init = d->init;
            y->kernel = d->kernel;
            y->stride = d->stride ? d->stride : y->kind == DSGD__CONV ? 1 : d->kernel;
            y->pad = y->kind == DSGD__CONV ? d->padding : 0;
            y->units = y->kind == DSGD__CONV ? d->filters : c;
            if (y->stride >= 1 && y->kernel >= 1) {
                y->oh = (h + 2 * y->pad - y->kernel) / y->stride + 1;
                y->ow = (w + 2 * y->pad - y->kernel) / y->stride + 1;
            }
            y->oc = y->units;
        } else {
            const dsgd_layer_desc *d = &desc->layers[i - ni];
            y->kind = DSGD__DENSE;
            y->index = i - ni;
            y->units = d->units;
            y->activation = d->activation;
            y->init = d->init;
            y->stride = 1;
            y->c = h * w * c; /* flattened */
            y->h = y->w = 1;
            y->oh = y->ow = 1;
            y->oc = d->units;
        }
        h = y->oh;
        w = y->ow;
        c = y->oc;
    }
    *L = n;
    return ls;
}

/* The built-in network's rules; every message names dsgd_model_create and
   the layer. */
static dsgd_result dsgd__net_check_layers(dsgd_ctx *ctx, const dsgd_model_desc *desc, const dsgd__layer *ls, int L) {
    const char *what = "dsgd_model_create";
    int l;
    for (l = 0; l < L; ++l) {
        const dsgd__layer *y = &ls[l];
        const char *kind = y->kind == DSGD__DENSE ? "layer" : "image layer";
        if (y->kind != DSGD__DENSE) {
            const dsgd_image_layer_desc *d = &desc->image_layers[y->index];
            if ((int)d->kind < 0 || (int)d->kind >= (int)DSGD_IMAGE_LAYER_COUNT)
                return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: image layer %d: unknown kind %d", what,
                                          y->index, (int)d->kind);
            if (y->kernel < 1 || d->stride < 0 || d->padding < 0 || y->kernel > y->h + 2 * y->pad ||
                y->kernel > y->w + 2 * y->pad)
                return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                          "%s: image layer %d: a %dx%d window (stride %d, padding %d) does not fit "
                                          "its %dx%dx%d input", what, y->index, y->kernel, y->kernel, d->stride,
                                          d->padding, y->h, y->w, y->c);
        }
        if (y->units <= 0 || !dsgd__act_valid(y->activation) || !dsgd__init_valid(y->init))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: %s %d: %s %d, activation %d or init %d invalid", what, kind, y->index,
                                      y->kind == DSGD__DENSE ? "units" : "filters", y->units, (int)y->activation,
                                      (int)y->init);
        if ((double)y->oh * y->ow * y->oc > 2147483647.0 || (double)y->c * y->units > 2147483647.0)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %s %d is too large", what, kind, y->index);
    }
    if (desc->loss == DSGD_LOSS_SOFTMAX_XENT && ls[L - 1].activation != DSGD_ACT_NONE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: softmax cross-entropy takes logits: the last layer's activation must be NONE", what);
    return DSGD_OK;
}

static dsgd_result dsgd__net_check(dsgd_ctx *ctx, const dsgd_model_desc *desc) {
    const char *what = "dsgd_model_create";
    const int *sh = desc->input_shape;
    dsgd__layer *ls;
    dsgd_result r;
    int L = 0;
    if (desc->num_image_layers < 0 || (desc->num_image_layers > 0 && !desc->image_layers))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d image layers%s", what,
                                  desc->num_image_layers, desc->image_layers ? "" : " (image_layers NULL)");
    if (dsgd__net_has_images(desc)) {
        double n = (double)sh[0] * sh[1] * sh[2];
        if (sh[0] < 1 || sh[1] < 1 || sh[2] < 1 || n > 2147483647.0 || (desc->input_dim && n != desc->input_dim))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: image layers need input_shape (height, width, channels), each >= 1 and "
                                      "input_dim %d (or 0) as their product; got %dx%dx%d", what, desc->input_dim,
                                      sh[0], sh[1], sh[2]);
    } else if (desc->input_dim <= 0) {
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: input_dim %d must be > 0", what, desc->input_dim);
    }
    if (desc->num_layers < 0 || (desc->num_layers > 0 && !desc->layers) ||
        desc->num_layers + DSGD__MAX(desc->num_image_layers, 0) == 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: a model needs at least one layer (num_layers %d)",
                                  what, desc->num_layers);
    if (desc->loss != DSGD_LOSS_SOFTMAX_XENT && desc->loss != DSGD_LOSS_MSE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown loss %d", what, (int)desc->loss);
    if (!(ls = dsgd__net_layers(desc, &L)))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    r = dsgd__net_check_layers(ctx, desc, ls, L);
    DSGD_FREE(ls);
    return r;
}

/* The network's variables (llm.c's fill_in_parameter_sizes): kernel then
   bias for each conv layer ((k, k, c, filters), (filters)) and dense layer
   ((in, out), (out)), layer after layer; dense layer l's kernel draws from
   stream l, image layer i's from stream 2^32 + i. Returns their number, -1
   when out of memory. */
static int dsgd__net_plan(const dsgd_model_desc *desc, dsgd__var_plan *plan) {
    int l, L = 0, n = 0;
    dsgd__layer *ls = dsgd__net_layers(desc, &L);
    if (!ls) return -1;
    for (l = 0; l < L; ++l) {
        const dsgd__layer *y = &ls[l];
        const char *kind = y->kind == DSGD__CONV ? "conv" : "dense";
        dsgd__var_plan *k, *b;
        if (y->kind == DSGD__POOL) continue;
        k = &plan[n++];
        b = &plan[n++];
        snprintf(k->v.name, sizeof(k->v.name), "%s%d/kernel", kind, y->index);
        if (y->kind == DSGD__CONV) {
            k->v.rank = 4; k->v.shape[0] = y->kernel; k->v.shape[1] = y->kernel;
            k->v.shape[2] = y->c; k->v.shape[3] = y->units;
            k->stream = ((uint64_t)1 << 32) + (uint64_t)y->index;
        } else {
            k->v.rank = 2; k->v.shape[0] = y->c; k->v.shape[1] = y->units;
            k->stream = (uint64_t)y->index;
        }
        k->init = y->init != DSGD_INIT_AUTO ? y->init
                  : y->activation == DSGD_ACT_RELU ? DSGD_INIT_HE_NORMAL : DSGD_INIT_GLOROT_UNIFORM;
        snprintf(b->v.name, sizeof(b->v.name), "%s%d/bias", kind, y->index);
        b->v.rank = 1; b->v.shape[0] = y->units;
        b->init = DSGD_INIT_ZEROS;
    }
    DSGD_FREE(ls);
    return n;
}

static void dsgd__net_destroy(void *state) {
    dsgd__net *net = (dsgd__net *)state;
    if (!net) return;
    dsgd__model_free_buffer(net->m, &net->acts);
    dsgd__model_free_buffer(net->m, &net->delta);
    dsgd__model_free_buffer(net->m, &net->col);
    dsgd__model_free_buffer(net->m, &net->targets);
    DSGD_FREE(net->layers);
    DSGD_FREE(net->var);
    DSGD_FREE(net->dims);
    DSGD_FREE(net->act_off);
    DSGD_FREE(net->col_off);
    DSGD_FREE(net);
}

/* The buffers of the layout: every layer's activations (max_batch,
   dims[l]) in acts, the two delta halves, every conv layer's im2col (the
   forward pass's, which the backward pass reads again for the weight
   gradient, then overwrites with the input gradient's columns), the
   targets. A backend with conv_gemm reads im2col where its GEMM needs it,
   so col is only the input gradients' columns: one scratch, as large as
   the largest of them, shared by the conv layers but the first (which has
   no input gradient); none at all when it has conv_backward_x too. */
static dsgd_result dsgd__net_buffers(dsgd__net *net) {
    dsgd_model *m = net->m;
    size_t act_total = 0, col = 0, mb = (size_t)m->max_batch;
    int l, max_dim = net->dims[0];
    dsgd_result r;
    for (l = 0; l <= net->num_layers; ++l) {
        net->act_off[l] = act_total;
        act_total += mb * net->dims[l];
        max_dim = DSGD__MAX(max_dim, net->dims[l]);
    }
    for (l = 0; l < net->num_layers; ++l) {
        const dsgd__layer *y = &net->layers[l];
        const size_t n = y->kind == DSGD__CONV ? mb * y->oh * y->ow * y->kernel * y->kernel * y->c : 0;
        if (m->be.conv_gemm) {
            net->col_off[l] = 0;
            if (l > 0 && !m->be.conv_backward_x) col = DSGD__MAX(col, n);
        } else {
            net->col_off[l] = col;
            col += n;
        }
    }
    net->delta_half = mb * max_dim;
    if ((r = dsgd__model_buffer(m, act_total, &net->acts)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, 2 * net->delta_half, &net->delta)) != DSGD_OK ||
        (col && (r = dsgd__model_buffer(m, col, &net->col)) != DSGD_OK) ||
        (r = dsgd__model_buffer(m, mb * m->target_dim, &net->targets)) != DSGD_OK)
        return r;
    return DSGD_OK;
}

/* The network's state (user_data: the checked desc): its layers and their
   variables, then the buffers. */
static dsgd_result dsgd__net_create(void *user_data, dsgd_model *m, void **state) {
    const dsgd_model_desc *desc = (const dsgd_model_desc *)user_data;
    const char *what = "dsgd_model_create";
    int l, L = 0, v = 0;
    dsgd_result r;
    dsgd__net *net = (dsgd__net *)dsgd__alloc(m->ctx, sizeof(*net), what);
    if (!net) return DSGD_ERR_OUT_OF_MEMORY;
    memset(net, 0, sizeof(*net));
    net->m = m;
    net->loss = desc->loss;
    net->layers = dsgd__net_layers(desc, &L);
    net->num_layers = L;
    net->var = (int *)dsgd__alloc(m->ctx, sizeof(int) * (size_t)L, what);
    net->dims = (int *)dsgd__alloc(m->ctx, sizeof(int) * (size_t)(L + 1), what);
    net->act_off = (size_t *)dsgd__alloc(m->ctx, sizeof(size_t) * (size_t)(L + 1), what);
    net->col_off = (size_t *)dsgd__alloc(m->ctx, sizeof(size_t) * (size_t)(L + 1), what);
    if (!net->layers || !net->var || !net->dims || !net->act_off || !net->col_off) {
        dsgd__net_destroy(net);
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
    }
    net->dims[0] = m->input_dim;
    for (l = 0; l < L; ++l) {
        const dsgd__layer *y = &net->layers[l];
        net->dims[l + 1] = y->oh * y->ow * y->oc;
        net->var[l] = y->kind == DSGD__POOL ? -1 : v;
        v += y->kind == DSGD__POOL ? 0 : 2;
    }
    m->output_dim = net->dims[L];
    m->target_dim = net->loss == DSGD_LOSS_SOFTMAX_XENT ? 1 : m->output_dim;
    if (dsgd__net_has_images(desc) && !(m->be.im2col && m->be.col2im && m->be.maxpool_forward && m->be.maxpool_backward)) {
        dsgd__net_destroy(net);
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: backend '%s' lacks the image operations "
                                  "(im2col, col2im, maxpool) that image layers need", what,
                                  m->be.name ? m->be.name : "?");
    }
    if ((r = dsgd__net_buffers(net)) != DSGD_OK) {
        dsgd__net_destroy(net);
        return r;
    }
    m->net = net;
    *state = net;
    return DSGD_OK;
}

/* Uploads a batch; y may be NULL. */
static dsgd_result dsgd__net_upload(dsgd__net *net, const dsgd_batch *b, int need_y, const char *what) {
    dsgd_model *m = net->m;
    dsgd_result r;
    int i;
    if (!b->x || (need_y && !b->y))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %s is NULL", what, b->x ? "y" : "x");
    /* The classes are checked here, on the host, so that the error comes
       from this call on every backend (the OpenCL one reports its own
       check's answer later, not to wait for the device every step). */
    for (i = 0; b->y && net->loss == DSGD_LOSS_SOFTMAX_XENT && i < b->count; ++i) {
        float t = b->y[i];
        if (!(t >= 0.0f && t < (float)m->output_dim) || t != (float)(int)t)
            return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: softmax cross-entropy: class %g of sample %d is not an integer in [0, %d)",
                                      what, (double)t, i, m->output_dim);
    }
    r = m->be.write(m->be.impl, dsgd__ref(net->acts, net->act_off[0]), b->x, (size_t)b->count * m->input_dim);
    if (r == DSGD_OK && b->y)
        r = m->be.write(m->be.impl, dsgd__ref(net->targets, 0), b->y, (size_t)b->count * m->target_dim);
    return r;
}

/* Layer l's views (llm.c's ParameterTensors and ActivationTensors for one
   layer): what the layers' forward and backward read and write. A dense
   layer is a conv layer whose rows are samples: with M the batch, it
   multiplies (M, in) by W (in, out); a conv layer multiplies its im2col
   (M oh ow, k k c) by W (k k c, out), so both are `rows` x `in` times
   `in` x `out`. */
typedef struct dsgd__dense {
    int in, out, rows;
    dsgd_activation act;
    int kind;        /* DSGD__DENSE, _CONV, _POOL */
    dsgd_window wd;  /* image layers: the input image and window */
    dsgd_ref W, b;   /* params: kernel, bias */
    dsgd_ref dW, db; /* grads, at the same offsets */
    dsgd_ref x, y;   /* acts: input (M, dims[l]), output (M, dims[l + 1]) */
    dsgd_ref col;    /* conv: its im2col, then the input gradient's columns */
} dsgd__dense;

static dsgd__dense dsgd__layer_view(const dsgd__net *net, int l, int M) {
    dsgd__dense L;
    const dsgd_model *m = net->m;
    const dsgd__layer *y = &net->layers[l];
    memset(&L, 0, sizeof(L));
    L.kind = y->kind;
    L.act = y->activation;
    L.x = dsgd__ref(net->acts, net->act_off[l]);
    L.y = dsgd__ref(net->acts, net->act_off[l + 1]);
    L.col = dsgd__ref(net->col, net->col_off[l]);
    L.wd.n = M; L.wd.h = y->h; L.wd.w = y->w; L.wd.c = y->c;
    L.wd.kh = L.wd.kw = y->kernel;
    L.wd.stride = y->stride;
    L.wd.pad = y->pad;
    L.rows = M * y->oh * y->ow;
    L.in = y->kind == DSGD__CONV ? y->kernel * y->kernel * y->c : y->c;
    L.out = y->oc;
    if (net->var[l] >= 0) {
        const dsgd_variable *k = &m->vars[net->var[l]], *b = &m->vars[net->var[l] + 1];
        L.W = dsgd__ref(m->params, k->offset);
        L.b = dsgd__ref(m->params, b->offset);
        L.dW = dsgd__ref(m->grads, k->offset);
        L.db = dsgd__ref(m->grads, b->offset);
    }
    return L;
}

/* Dense: y (M, out) = act(x (M, in) · W (in, out) + b (out)).
   Conv: the same with im2col(x) (M oh ow, k k c) for x (built in col, or
   read in place by the backend's conv_gemm: the same bits). Max-pool: y =
   maxpool(x). */
static dsgd_result dsgd__dense_forward(const dsgd_backend_i *be, const dsgd__dense *L) {
    dsgd_ref a = L->x;
    dsgd_result r;
    if (L->kind == DSGD__POOL) return be->maxpool_forward(be->impl, &L->wd, L->x, L->y);
    if (L->kind == DSGD__CONV && be->conv_gemm) { /* im2col(x) read in place */
        r = be->conv_gemm(be->impl, &L->wd, 0, L->out, 1.0f, L->x, L->W, L->out, 0.0f, L->y, L->out);
    } else {
        if (L->kind == DSGD__CONV) {
            if ((r = be->im2col(be->impl, &L->wd, L->x, L->col)) != DSGD_OK) return r;
            a = L->col;
        }
        r = be->gemm(be->impl, 0, 0, L->rows, L->out, L->in, 1.0f, a, L->in, L->W, L->out, 0.0f, L->y, L->out);
    }
    if (r != DSGD_OK) return r;
    return be->bias_act_forward(be->impl, L->act, L->y, L->b, L->rows, L->out);           /* y = act(y + b) */
}

/* Given dy, the gradient of the loss with respect to y:
     dy (rows, out) *= act'(y)             in place (nothing for NONE)
     dW (in, out)    = a^T (in, rows) · dy  a = x (dense) or im2col(x) (conv:
                                            the forward pass's, kept per layer;
                                            with conv_gemm, read in place)
     db (out)        = column sums of dy
     dx              = dy · W^T (rows, in)  (conv: into the scratch, then col2im,
                                            or the backend's conv_backward_x)
                       unless dx.buf is NULL (layer 0)
   Max-pool: dx = maxpool_backward(x, y, dy). */
static dsgd_result dsgd__dense_backward(dsgd_model *m, int var, dsgd_ref dx, dsgd_ref dy, const dsgd__dense *L) {
    const dsgd_backend_i *be = &m->be;
    dsgd_ref a = L->x;
    dsgd_result r;
    if (L->kind == DSGD__POOL)
        return dx.buf ? be->maxpool_backward(be->impl, &L->wd, L->x, L->y, dy, dx) : DSGD_OK;
    if (L->act != DSGD_ACT_NONE) {
        r = be->act_backward(be->impl, L->act, dy, L->y, (size_t)L->rows * L->out);
        if (r != DSGD_OK) return r;
    }
    if (L->kind == DSGD__CONV) a = L->col; /* built by the forward pass just before */
    if (L->kind == DSGD__CONV && be->conv_gemm) /* im2col(x) read in place */
        r = be->conv_gemm(be->impl, &L->wd, 1, L->out, 1.0f, L->x, dy, L->out, 0.0f, L->dW, L->out);
    else
        r = be->gemm(be->impl, 1, 0, L->in, L->out, L->rows, 1.0f, a, L->in, dy, L->out, 0.0f, L->dW, L->out);
    if (r != DSGD_OK) return r;
    r = be->bias_backward(be->impl, L->db, dy, L->rows, L->out);
    if (r == DSGD_OK && var >= 0 && (r = dsgd_model_variable_ready(m, var)) == DSGD_OK) /* kernel and bias: final */
        r = dsgd_model_variable_ready(m, var + 1);
    if (r != DSGD_OK || !dx.buf) return r;
    if (L->kind != DSGD__CONV)
        return be->gemm(be->impl, 0, 1, L->rows, L->in, L->out, 1.0f, dy, L->out, L->W, L->out, 0.0f, dx, L->in);
    if (be->conv_backward_x) /* col2im(dy W^T) without the columns */
        return be->conv_backward_x(be->impl, &L->wd, L->out, dy, L->W, dx);
    r = be->gemm(be->impl, 0, 1, L->rows, L->in, L->out, 1.0f, dy, L->out, L->W, L->out, 0.0f, L->col, L->in);
    if (r != DSGD_OK) return r;
    return be->col2im(be->impl, &L->wd, L->col, dx);
}

/* acts[l+1] = layer l (acts[l]), layer by layer */
static dsgd_result dsgd__net_forward(dsgd__net *net, int M) {
    int l;
    dsgd_result r;
    for (l = 0; l < net->num_layers; ++l) {
        dsgd__dense L = dsgd__layer_view(net, l, M);
        if ((r = dsgd__dense_forward(&net->m->be, &L)) != DSGD_OK) return r;
    }
    net->last_count = M;
    return DSGD_OK;
}

/* Given dlogits in delta half 0, fills the gradient buffer, layer L-1 down
   to 0; each layer's dy is the one above's dx, in the two delta halves in
   turn. */
static dsgd_result dsgd__net_backward(dsgd__net *net, int M) {
    int l, cur = 0;
    dsgd_result r;
    for (l = net->num_layers - 1; l >= 0; --l) {
        dsgd__dense L = dsgd__layer_view(net, l, M);
        dsgd_ref dy = dsgd__ref(net->delta, cur * net->delta_half);
        dsgd_ref dx = dsgd__ref(l > 0 ? net->delta : NULL, (1 - cur) * net->delta_half);
        if ((r = dsgd__dense_backward(net->m, net->var[l], dx, dy, &L)) != DSGD_OK) return r;
        cur = 1 - cur;
    }
    return DSGD_OK;
}

/* The loss of the logits (M, output_dim) against the uploaded targets: the
   loss sum and the correct count accumulate at stats; with dlogits.buf set,
   dlogits (M, output_dim) = grad_scale * d(sum of losses)/d logits. */
static dsgd_result dsgd__net_loss(dsgd__net *net, int M, float grad_scale, dsgd_ref dlogits, dsgd_ref stats) {
    int top = net->num_layers;
    dsgd_model *m = net->m;
    return m->be.loss(m->be.impl, net->loss, M, net->dims[top], dsgd__ref(net->acts, net->act_off[top]),
                      dsgd__ref(net->targets, 0), grad_scale, dlogits, stats);
}

/* The metrics go to the device accumulators (the loss operation adds them),
   so the host's are left alone. */
static dsgd_result dsgd__net_gradients(void *state, dsgd_model *m, const dsgd_batch *b, float grad_scale,
                                       dsgd_metrics *metrics) {
    dsgd__net *net = (dsgd__net *)state;
    dsgd_result r;
    (void)metrics;
    if ((r = dsgd__net_upload(net, b, 1, "dsgd_model_compute_gradients")) != DSGD_OK) return r;
    if ((r = dsgd__net_forward(net, b->count)) != DSGD_OK) return r;
    r = dsgd__net_loss(net, b->count, grad_scale, dsgd__ref(net->delta, 0), dsgd_model_stats(m, DSGD_METRICS_TRAIN));
    if (r != DSGD_OK) return r;
    return dsgd__net_backward(net, b->count);
}

static dsgd_result dsgd__net_evaluate(void *state, dsgd_model *m, const dsgd_batch *b, dsgd_metrics *metrics) {
    dsgd__net *net = (dsgd__net *)state;
    dsgd_result r;
    (void)metrics;
    if ((r = dsgd__net_upload(net, b, 0, "dsgd_model_eval_batch")) != DSGD_OK) return r;
    if ((r = dsgd__net_forward(net, b->count)) != DSGD_OK) return r;
    if (!b->y) return DSGD_OK;
    return dsgd__net_loss(net, b->count, 0.0f, dsgd__ref(NULL, 0), dsgd_model_stats(m, DSGD_METRICS_EVAL));
}

static const dsgd_model_i dsgd__net_model = {
    "dense", dsgd__net_create, dsgd__net_destroy, dsgd__net_gradients, dsgd__net_evaluate, 1,
};

/* ---- creation */

/* A custom model's desc and variables; every message names dsgd_model_create. */
static dsgd_result dsgd__custom_check(dsgd_ctx *ctx, const dsgd_model_desc *desc) {
    const char *what = "dsgd_model_create";
    double total = 0.0;
    int i, j, k;
    if (desc->layers || desc->num_layers || desc->image_layers || desc->num_image_layers)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: a model has either layers (the built-in network) or custom, not both", what);
    if (!desc->custom->compute_gradients)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: custom model '%s' has no compute_gradients",
                                  what, desc->custom->name ? desc->custom->name : "custom");
    if (desc->input_dim < 0 || desc->target_dim < 0 || desc->output_dim < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: input_dim %d, target_dim %d or output_dim %d "
                                  "is negative", what, desc->input_dim, desc->target_dim, desc->output_dim);
    if (!desc->variables || desc->num_variables < 1 || desc->num_variables > DSGD_MAX_VARIABLES)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: a custom model declares 1..%d variables, got %d%s",
                                  what, DSGD_MAX_VARIABLES, desc->num_variables, desc->variables ? "" : " (variables NULL)");
    for (i = 0; i < desc->num_variables; ++i) {
        const dsgd_variable_desc *v = &desc->variables[i];
        double count = 1.0;
        if (!v->name || !v->name[0] || strlen(v->name) >= DSGD_MAX_NAME)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable %d: a name of 1..%d bytes is needed%s%s",
                                      what, i, DSGD_MAX_NAME - 1, v->name ? ", got " : "", v->name ? v->name : "");
        for (j = 0; j < i; ++j)
            if (!strcmp(desc->variables[j].name, v->name))
                return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variables %d and %d are both named '%s'",
                                          what, j, i, v->name);
        if (v->rank < 1 || v->rank > DSGD_MAX_RANK)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable '%s': rank %d outside 1..%d", what,
                                      v->name, v->rank, DSGD_MAX_RANK);
        for (k = 0; k < v->rank; ++k) {
            if (v->shape[k] < 1)
                return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable '%s': dimension %d is %d (each "
                                          "must be >= 1)", what, v->name, k, v->shape[k]);
            count *= v->shape[k];
        }
        if (!dsgd__init_valid(v->init) || !dsgd__agg_valid(v->aggregation))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable '%s': unknown init %d or aggregation %d",
                                      what, v->name, (int)v->init, (int)v->aggregation);
        total += count;
    }
    if (total > 1099511627776.0) /* 2^40 floats */
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %.0f parameters (at most 2^40)", what, total);
    return DSGD_OK;
}

/* Checks a model desc; every message names dsgd_model_create. */
static dsgd_result dsgd__model_check(dsgd_ctx *ctx, const dsgd_model_desc *desc) {
    dsgd_result r;
    if (!desc) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: desc is NULL");
    if (desc->max_batch < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: max_batch %d is negative", desc->max_batch);
    r = desc->custom ? dsgd__custom_check(ctx, desc) : dsgd__net_check(ctx, desc);
    if (r != DSGD_OK) return r;
    if (desc->backend && !dsgd__backend_complete(desc->backend))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: backend '%s' lacks a required operation",
                                  desc->backend->name ? desc->backend->name : "?");
    return DSGD_OK;
}

/* The model struct from a checked desc: its backend (the desc's, or a CPU
   backend it owns), functions and dimensions; no variable or buffer yet. */
static dsgd_result dsgd__model_new(dsgd_ctx *ctx, const dsgd_model_desc *desc, dsgd_model **out) {
    dsgd_model *m;
    dsgd_result r;
    m = (dsgd_model *)dsgd__alloc(ctx, sizeof(*m), "dsgd_model_create");
    if (!m) return DSGD_ERR_OUT_OF_MEMORY;
    memset(m, 0, sizeof(*m));
    m->ctx = ctx;
    m->fn = desc->custom ? *desc->custom : dsgd__net_model;
    if (!m->fn.name) m->fn.name = "custom";
    m->input_dim = desc->input_dim;
    m->max_batch = desc->max_batch ? desc->max_batch : DSGD_DEFAULT_MAX_BATCH;
    if (desc->custom) {
        m->target_dim = desc->target_dim ? desc->target_dim : 1;
        m->output_dim = desc->output_dim;
    } else if (!m->input_dim) { /* output_dim and target_dim: dsgd__net_create */
        m->input_dim = desc->input_shape[0] * desc->input_shape[1] * desc->input_shape[2];
    }
    if (desc->backend) {
        m->be = *desc->backend;
    } else {
        r = dsgd_cpu_backend_create(ctx, &m->be);
        if (r != DSGD_OK) { DSGD_FREE(m); return r; }
        m->owns_backend = 1;
    }
    *out = m;
    return DSGD_OK;
}

/* The variables' plan: the network's layers, or the declared variables
   (AUTO resolved, variable i drawing from stream i). */
static dsgd__var_plan *dsgd__model_plan(dsgd_model *m, const dsgd_model_desc *desc, int *n) {
    dsgd__var_plan *plan;
    int i, k;
    *n = desc->custom ? desc->num_variables : 2 * (desc->num_layers + desc->num_image_layers);
    plan = (dsgd__var_plan *)dsgd__alloc(m->ctx, sizeof(*plan) * (size_t)*n, "dsgd_model_create");
    if (!plan) return NULL;
    memset(plan, 0, sizeof(*plan) * (size_t)*n);
    if (!desc->custom) {
        if ((*n = dsgd__net_plan(desc, plan)) < 0) {
            DSGD_FREE(plan);
            dsgd_ctx_set_error(m->ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_model_create: out of memory");
            return NULL;
        }
        return plan;
    }
    for (i = 0; i < *n; ++i) {
        const dsgd_variable_desc *d = &desc->variables[i];
        snprintf(plan[i].v.name, sizeof(plan[i].v.name), "%s", d->name);
        plan[i].v.rank = d->rank;
        for (k = 0; k < d->rank; ++k) plan[i].v.shape[k] = d->shape[k];
        plan[i].v.aggregation = d->aggregation;
        plan[i].initial = d->initial;
        plan[i].init = d->init != DSGD_INIT_AUTO ? d->init : d->rank == 1 ? DSGD_INIT_ZEROS : DSGD_INIT_GLOROT_UNIFORM;
        plan[i].stream = (uint64_t)i;
    }
    return plan;
}

/* Lays the variables out in order in one flat buffer (offsets in floats)
   and fills their initial values on the host. */
static dsgd_result dsgd__model_variables(dsgd_model *m, const dsgd_model_desc *desc, float **host) {
    int i, k, n = 0;
    size_t off = 0;
    dsgd__var_plan *plan = dsgd__model_plan(m, desc, &n);
    if (!plan) return DSGD_ERR_OUT_OF_MEMORY;
    m->vars = (dsgd_variable *)dsgd__alloc(m->ctx, sizeof(dsgd_variable) * (size_t)n, "dsgd_model_create");
    if (!m->vars) {
        DSGD_FREE(plan);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    for (i = 0; i < n; ++i) {
        dsgd_variable *v = &m->vars[i];
        *v = plan[i].v;
        if (v->aggregation == DSGD_AGG_NONE) v->aggregation = DSGD_AGG_MEAN;
        v->count = 1;
        for (k = 0; k < v->rank; ++k) v->count *= (size_t)v->shape[k];
        v->offset = off;
        off += v->count;
    }
    m->num_vars = n;
    m->num_params = off;
    *host = (float *)dsgd__alloc(m->ctx, (off ? off : 1) * sizeof(float), "dsgd_model_create");
    for (i = 0; *host && i < n; ++i) {
        const dsgd_variable *v = &m->vars[i];
        double fan_out = v->shape[v->rank - 1], fan_in = v->rank == 1 ? fan_out : (double)v->count / fan_out;
        if (plan[i].initial) memcpy(*host + v->offset, plan[i].initial, v->count * sizeof(float));
        else dsgd__init_values(*host + v->offset, v->count, fan_in, fan_out, plan[i].init,
                               dsgd__seed_mix(desc->seed, plan[i].stream));
    }
    DSGD_FREE(plan);
    return *host ? DSGD_OK : DSGD_ERR_OUT_OF_MEMORY;
}

/* The flat buffers: parameters (uploaded from host), gradients and
   statistics (zero). */
static dsgd_result dsgd__model_buffers(dsgd_model *m, const float *host) {
    dsgd_result r;
    if ((r = dsgd__model_buffer(m, m->num_params, &m->params)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, m->num_params, &m->grads)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, 4, &m->stats)) != DSGD_OK ||
        (r = m->be.fill(m->be.impl, dsgd__ref(m->stats, 0), 0.0f, 4)) != DSGD_OK ||
        (r = m->be.write(m->be.impl, dsgd__ref(m->params, 0), host, m->num_params)) != DSGD_OK)
        return r;
    return m->be.fill(m->be.impl, dsgd__ref(m->grads, 0), 0.0f, m->num_params);
}

/* Gives a failing model function's error a message when it recorded none. */
static dsgd_result dsgd__model_fn_result(dsgd_model *m, dsgd_result r, const char *fn) {
    if (r != DSGD_OK && dsgd_ctx_last_result(m->ctx) == DSGD_OK)
        dsgd_ctx_set_error(m->ctx, r, "model '%s': %s failed: %s", m->fn.name, fn, dsgd_result_string(r));
    return r;
}

/* check the desc, make the struct, lay out and initialise the variables,
   create the buffers, then the functions' state */
DSGD_API dsgd_result dsgd_model_create(dsgd_ctx *ctx, const dsgd_model_desc *desc, dsgd_model **out) {
    dsgd_model *m = NULL;
    dsgd_result r;
    float *host = NULL;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: out is NULL");
    *out = NULL;
    if ((r = dsgd__model_check(ctx, desc)) != DSGD_OK) return r;
    if ((r = dsgd__model_new(ctx, desc, &m)) != DSGD_OK) return r;
    r = dsgd__model_variables(m, desc, &host);
    if (r == DSGD_OK) r = dsgd__model_buffers(m, host);
    DSGD_FREE(host);
    if (r == DSGD_OK) {
        if (!m->fn.create) {
            m->state = desc->user_data;
        } else {
            dsgd_ctx_clear_error(ctx);
            r = dsgd__model_fn_result(m, m->fn.create(desc->custom ? desc->user_data : (void *)desc, m, &m->state),
                                      "create");
            m->has_state = r == DSGD_OK;
        }
    }
    if (r != DSGD_OK) {
        dsgd_model_destroy(m);
        return r;
    }
    *out = m;
    return DSGD_OK;
}

DSGD_API dsgd_ctx *dsgd_model_ctx(const dsgd_model *m) { return m ? m->ctx : NULL; }
DSGD_API const dsgd_backend_i *dsgd_model_backend(const dsgd_model *m) { return m ? &m->be : NULL; }
DSGD_API const char *dsgd_model_name(const dsgd_model *m) { return m ? m->fn.name : NULL; }
DSGD_API void *dsgd_model_state(const dsgd_model *m) { return m && !m->net ? m->state : NULL; }
DSGD_API size_t dsgd_model_num_params(const dsgd_model *m) { return m ? m->num_params : 0; }
DSGD_API int dsgd_model_num_variables(const dsgd_model *m) { return m ? m->num_vars : 0; }
DSGD_API const dsgd_variable *dsgd_model_variable(const dsgd_model *m, int i) {
    return (m && i >= 0 && i < m->num_vars) ? &m->vars[i] : NULL;
}
DSGD_API int dsgd_model_find_variable(const dsgd_model *m, const char *name) {
    int i;
    for (i = 0; m && name && i < m->num_vars; ++i)
        if (!strcmp(m->vars[i].name, name)) return i;
    return -1;
}
DSGD_API int dsgd_model_input_dim(const dsgd_model *m) { return m ? m->input_dim : 0; }
DSGD_API int dsgd_model_output_dim(const dsgd_model *m) { return m ? m->output_dim : 0; }
DSGD_API int dsgd_model_target_dim(const dsgd_model *m) { return m ? m->target_dim : 0; }
DSGD_API int dsgd_model_max_batch(const dsgd_model *m) { return m ? m->max_batch : 0; }
DSGD_API dsgd_ref dsgd_model_params(const dsgd_model *m) { return dsgd__ref(m ? m->params : NULL, 0); }
DSGD_API dsgd_ref dsgd_model_grads(const dsgd_model *m) { return dsgd__ref(m ? m->grads : NULL, 0); }

static float *dsgd__model_host_ptr(const dsgd_model *m, dsgd_buffer *buf) {
    return m && m->be.buffer_host_ptr ? m->be.buffer_host_ptr(m->be.impl, buf) : NULL;
}
DSGD_API float *dsgd_model_host_params(const dsgd_model *m) { return dsgd__model_host_ptr(m, m ? m->params : NULL); }
DSGD_API float *dsgd_model_host_grads(const dsgd_model *m) { return dsgd__model_host_ptr(m, m ? m->grads : NULL); }
DSGD_API dsgd_ref dsgd_model_stats(const dsgd_model *m, dsgd_metrics_slot slot) {
    return dsgd__ref(m ? m->stats : NULL, slot == DSGD_METRICS_EVAL ? 2 : 0);
}

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

/* A batch's common checks. */
static dsgd_result dsgd__model_batch_check(dsgd_model *m, const dsgd_batch *b, const char *what) {
    if (!b) return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: batch is NULL", what);
    if (b->count <= 0 || b->count > m->max_batch)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: batch of %d samples outside 1..max_batch (%d)",
                                  what, b->count, m->max_batch);
    return DSGD_OK;
}

/* Adds what a function put in *mt to the host accumulators of slot. */
static void dsgd__model_add_metrics(dsgd_model *m, int slot, const dsgd_metrics *mt, int count) {
    m->host[slot][0] += mt->loss_sum;
    m->host[slot][1] += mt->correct;
    m->count[slot] += count;
}

DSGD_API dsgd_result dsgd_model_gradients(dsgd_model *m, const dsgd_batch *b, float grad_scale) {
    const char *what = "dsgd_model_compute_gradients";
    dsgd_metrics mt;
    dsgd_result r;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__model_batch_check(m, b, what)) != DSGD_OK) return r;
    if (!m->fn.writes_all_gradients && (r = m->be.fill(m->be.impl, dsgd__ref(m->grads, 0), 0.0f, m->num_params)) != DSGD_OK)
        return r;
    memset(&mt, 0, sizeof(mt));
    dsgd_ctx_clear_error(m->ctx);
    r = dsgd__model_fn_result(m, m->fn.compute_gradients(m->state, m, b, grad_scale, &mt), "compute_gradients");
    if (r == DSGD_OK) dsgd__model_add_metrics(m, DSGD_METRICS_TRAIN, &mt, b->count);
    return r;
}

DSGD_API dsgd_result dsgd_model_variable_ready(dsgd_model *m, int variable) {
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (variable < 0 || variable >= m->num_vars)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_model_variable_ready: variable %d of a model with %d", variable, m->num_vars);
    return m->on_ready ? m->on_ready(m->on_ready_user, variable) : DSGD_OK;
}

DSGD_API dsgd_result dsgd_model_compute_gradients(dsgd_model *m, const float *x, const float *y, int count,
                                                  float grad_scale) {
    dsgd_batch b;
    b.x = x;
    b.y = y;
    b.count = count;
    b.data = NULL;
    return dsgd_model_gradients(m, &b, grad_scale);
}

DSGD_API dsgd_result dsgd_model_evaluate(dsgd_model *m, const dsgd_batch *b) {
    const char *what = "dsgd_model_eval_batch";
    dsgd_metrics mt;
    dsgd_result r;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__model_batch_check(m, b, what)) != DSGD_OK) return r;
    if (!m->fn.evaluate)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_UNSUPPORTED, "%s: model '%s' has no evaluate function", what,
                                  m->fn.name);
    memset(&mt, 0, sizeof(mt));
    dsgd_ctx_clear_error(m->ctx);
    r = dsgd__model_fn_result(m, m->fn.evaluate(m->state, m, b, &mt), "evaluate");
    if (r == DSGD_OK && (b->y || !m->net)) dsgd__model_add_metrics(m, DSGD_METRICS_EVAL, &mt, b->count);
    return r;
}

DSGD_API dsgd_result dsgd_model_eval_batch(dsgd_model *m, const float *x, const float *y, int count) {
    dsgd_batch b;
    b.x = x;
    b.y = y;
    b.count = count;
    b.data = NULL;
    return dsgd_model_evaluate(m, &b);
}

DSGD_API dsgd_result dsgd_model_read_output(dsgd_model *m, float *dst, int count) {
    dsgd__net *net;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!(net = m->net))
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_UNSUPPORTED,
                                  "dsgd_model_read_output: model '%s' is not the built-in network", m->fn.name);
    if (!dst || count <= 0 || count > net->last_count)
        return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_model_read_output: %d rows requested, the last forward pass had %d",
                                  count, net->last_count);
    return m->be.read(m->be.impl, dsgd__ref(net->acts, net->act_off[net->num_layers]), dst,
                      (size_t)count * m->output_dim);
}

/* Folds the host accumulators into the device ones (a checkpoint saves
   those), so both hold one total. */
static dsgd_result dsgd__model_fold_metrics(dsgd_model *m) {
    float s[4];
    dsgd_result r;
    int k;
    if (m->host[0][0] == 0.0 && m->host[0][1] == 0.0 && m->host[1][0] == 0.0 && m->host[1][1] == 0.0) return DSGD_OK;
    if ((r = m->be.read(m->be.impl, dsgd__ref(m->stats, 0), s, 4)) != DSGD_OK) return r;
    for (k = 0; k < 4; ++k) s[k] = (float)((double)s[k] + m->host[k / 2][k % 2]);
    if ((r = m->be.write(m->be.impl, dsgd__ref(m->stats, 0), s, 4)) != DSGD_OK) return r;
    memset(m->host, 0, sizeof(m->host));
    return DSGD_OK;
}

/* The accumulators a checkpoint saves and restores: st the device floats
   [train loss, train correct, eval loss, eval correct], count the samples
   of the train and eval slots. The read folds the host part in first
   (count is filled even when reading the device fails); the write replaces
   all of them and clears the host part (count is set even when writing the
   device fails). */
static dsgd_result dsgd__model_read_accumulators(dsgd_model *m, float st[4], double count[2]) {
    dsgd_result r = dsgd__model_fold_metrics(m);
    if (r == DSGD_OK) r = m->be.read(m->be.impl, dsgd__ref(m->stats, 0), st, 4);
    count[0] = m->count[0];
    count[1] = m->count[1];
    return r;
}
static dsgd_result dsgd__model_write_accumulators(dsgd_model *m, const float st[4], const double count[2]) {
    dsgd_result r = m->be.write(m->be.impl, dsgd__ref(m->stats, 0), st, 4);
    m->count[0] = count[0];
    m->count[1] = count[1];
    memset(m->host, 0, sizeof(m->host));
    return r;
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
    out->loss_sum = s[0] + m->host[slot][0];
    out->correct = s[1] + m->host[slot][1];
    out->count = m->count[slot];
    m->host[slot][0] = m->host[slot][1] = 0.0;
    m->count[slot] = 0.0;
    return DSGD_OK;
}

#endif /* DSGD__PART_MODEL_IMPL */
