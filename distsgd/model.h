/* distsgd/model.h - the built-in model: dense layers over flat buffers
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/
#ifndef DSGD__PART_MODEL_DECL
#define DSGD__PART_MODEL_DECL

#ifdef __cplusplus
extern "C" {
#endif

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

/* The default of dsgd_model_desc.max_batch. */
#define DSGD_DEFAULT_MAX_BATCH 256

typedef struct dsgd_model_desc {
    int input_dim;
    const dsgd_layer_desc *layers;
    int num_layers;
    dsgd_loss loss;             /* default SOFTMAX_XENT */
    int max_batch;              /* largest batch passed to the model; 0:
                                   DSGD_DEFAULT_MAX_BATCH */
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

/* Checks a model desc; every message names dsgd_model_create. */
static dsgd_result dsgd__model_check(dsgd_ctx *ctx, const dsgd_model_desc *desc) {
    int l;
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
    return DSGD_OK;
}

/* The model struct from a checked desc: its backend (the desc's, or a CPU
   backend it owns) and its host arrays; no device buffer yet. */
static dsgd_result dsgd__model_new(dsgd_ctx *ctx, const dsgd_model_desc *desc, dsgd_model **out) {
    dsgd_model *m;
    dsgd_result r;
    m = (dsgd_model *)dsgd__alloc(ctx, sizeof(*m), "dsgd_model_create");
    if (!m) return DSGD_ERR_OUT_OF_MEMORY;
    memset(m, 0, sizeof(*m));
    m->ctx = ctx;
    m->input_dim = desc->input_dim;
    m->num_layers = desc->num_layers;
    m->max_batch = desc->max_batch ? desc->max_batch : DSGD_DEFAULT_MAX_BATCH;
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
    *out = m;
    return DSGD_OK;
}

/* The flat layouts (llm.c's fill_in_parameter_sizes): the variables, kernel
   (in, out) then bias (out) layer after layer, at the same offsets of params
   and grads; every layer's activations (max_batch, dims[l]) in acts; the
   two delta halves. Returns the floats of acts. */
static size_t dsgd__model_layout(dsgd_model *m) {
    int l, max_dim = m->input_dim;
    size_t off = 0, act_total = 0;
    m->dims[0] = m->input_dim;
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
    return act_total;
}

/* The device buffers of the layout; the statistics and the gradients start
   at zero. */
static dsgd_result dsgd__model_buffers(dsgd_model *m, size_t act_total) {
    dsgd_result r;
    if ((r = dsgd__model_buffer(m, m->num_params, &m->params)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, m->num_params, &m->grads)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, act_total, &m->acts)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, 2 * m->delta_half, &m->delta)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, (size_t)m->max_batch * dsgd_model_target_dim(m), &m->targets)) != DSGD_OK ||
        (r = dsgd__model_buffer(m, 4, &m->stats)) != DSGD_OK ||
        (r = m->be.fill(m->be.impl, dsgd__ref(m->stats, 0), 0.0f, 4)) != DSGD_OK)
        return r;
    return m->be.fill(m->be.impl, dsgd__ref(m->grads, 0), 0.0f, m->num_params);
}

/* Initialises the parameters on the host, so every backend starts from the
   same bits (kernels drawn per layer from seed, biases zero), and uploads
   them. */
static dsgd_result dsgd__model_init_params(dsgd_model *m, uint64_t seed) {
    dsgd_result r;
    size_t i;
    int l;
    float *host = (float *)dsgd__alloc(m->ctx, m->num_params * sizeof(float), "dsgd_model_create");
    if (!host) return DSGD_ERR_OUT_OF_MEMORY;
    for (l = 0; l < m->num_layers; ++l) {
        const dsgd_variable *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
        dsgd__init_kernel(host + k->offset, k->shape[0], k->shape[1], m->layers[l].init,
                          m->layers[l].activation, dsgd__seed_mix(seed, (uint64_t)l));
        for (i = 0; i < b->count; ++i) host[b->offset + i] = 0.0f;
    }
    r = m->be.write(m->be.impl, dsgd__ref(m->params, 0), host, m->num_params);
    DSGD_FREE(host);
    return r;
}

/* check the desc, make the struct, lay out the variables, create the
   buffers, initialise the parameters */
DSGD_API dsgd_result dsgd_model_create(dsgd_ctx *ctx, const dsgd_model_desc *desc, dsgd_model **out) {
    dsgd_model *m = NULL;
    dsgd_result r;
    size_t act_total;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_model_create: out is NULL");
    *out = NULL;
    if ((r = dsgd__model_check(ctx, desc)) != DSGD_OK) return r;
    if ((r = dsgd__model_new(ctx, desc, &m)) != DSGD_OK) return r;
    act_total = dsgd__model_layout(m);
    if ((r = dsgd__model_buffers(m, act_total)) != DSGD_OK ||
        (r = dsgd__model_init_params(m, desc->seed)) != DSGD_OK) {
        dsgd_model_destroy(m);
        return r;
    }
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

/* Layer l's views (llm.c's ParameterTensors and ActivationTensors for one
   layer): what dsgd__dense_forward and dsgd__dense_backward read and write.
   M is the batch; in = dims[l], out = dims[l + 1]. */
typedef struct dsgd__dense {
    int in, out;
    dsgd_activation act;
    dsgd_ref W, b;   /* params: kernel (in, out), bias (out) */
    dsgd_ref dW, db; /* grads, at the same offsets */
    dsgd_ref x, y;   /* acts: input (M, in), output (M, out) */
} dsgd__dense;

static dsgd__dense dsgd__layer(const dsgd_model *m, int l) {
    dsgd__dense L;
    const dsgd_variable *k = &m->vars[2 * l], *b = &m->vars[2 * l + 1];
    L.in = m->dims[l];
    L.out = m->dims[l + 1];
    L.act = m->layers[l].activation;
    L.W = dsgd__ref(m->params, k->offset);
    L.b = dsgd__ref(m->params, b->offset);
    L.dW = dsgd__ref(m->grads, k->offset);
    L.db = dsgd__ref(m->grads, b->offset);
    L.x = dsgd__ref(m->acts, m->act_off[l]);
    L.y = dsgd__ref(m->acts, m->act_off[l + 1]);
    return L;
}

/* y (M, out) = act(x (M, in) · W (in, out) + b (out)) */
static dsgd_result dsgd__dense_forward(const dsgd_backend_i *be, const dsgd__dense *L, int M) {
    int in = L->in, out = L->out;
    dsgd_result r = be->gemm(be->impl, 0, 0, M, out, in, 1.0f, L->x, in, L->W, out, 0.0f, L->y, out); /* y = x W */
    if (r != DSGD_OK) return r;
    return be->bias_act_forward(be->impl, L->act, L->y, L->b, M, out);                   /* y = act(y + b) */
}

/* Given dy (M, out), the gradient of the loss with respect to y:
     dy (M, out)  *= act'(y)              in place (nothing for NONE)
     dW (in, out)  = x^T (in, M) · dy
     db (out)      = column sums of dy
     dx (M, in)    = dy · W^T (out, in)   unless dx.buf is NULL (layer 0) */
static dsgd_result dsgd__dense_backward(const dsgd_backend_i *be, dsgd_ref dx, dsgd_ref dy, const dsgd__dense *L,
                                        int M) {
    int in = L->in, out = L->out;
    dsgd_result r;
    if (L->act != DSGD_ACT_NONE) {
        r = be->act_backward(be->impl, L->act, dy, L->y, (size_t)M * out);
        if (r != DSGD_OK) return r;
    }
    r = be->gemm(be->impl, 1, 0, in, out, M, 1.0f, L->x, in, dy, out, 0.0f, L->dW, out);
    if (r != DSGD_OK) return r;
    r = be->bias_backward(be->impl, L->db, dy, M, out);
    if (r != DSGD_OK || !dx.buf) return r;
    return be->gemm(be->impl, 0, 1, M, in, out, 1.0f, dy, out, L->W, out, 0.0f, dx, in);
}

/* acts[l+1] (M, dims[l+1]) = act(acts[l] (M, dims[l]) · W_l + b_l), layer by layer */
static dsgd_result dsgd__model_forward(dsgd_model *m, int M) {
    int l;
    dsgd_result r;
    for (l = 0; l < m->num_layers; ++l) {
        dsgd__dense L = dsgd__layer(m, l);
        if ((r = dsgd__dense_forward(&m->be, &L, M)) != DSGD_OK) return r;
    }
    m->last_count = M;
    return DSGD_OK;
}

/* Given dlogits in delta half 0, fills the gradient buffer, layer L-1 down
   to 0; each layer's dy is the one above's dx, in the two delta halves in
   turn. */
static dsgd_result dsgd__model_backward(dsgd_model *m, int M) {
    int l, cur = 0;
    dsgd_result r;
    for (l = m->num_layers - 1; l >= 0; --l) {
        dsgd__dense L = dsgd__layer(m, l);
        dsgd_ref dy = dsgd__ref(m->delta, cur * m->delta_half);                        /* (M, out) */
        dsgd_ref dx = dsgd__ref(l > 0 ? m->delta : NULL, (1 - cur) * m->delta_half);  /* (M, in) */
        if ((r = dsgd__dense_backward(&m->be, dx, dy, &L, M)) != DSGD_OK) return r;
        cur = 1 - cur;
    }
    return DSGD_OK;
}

/* The loss of the logits (M, output_dim) against the uploaded targets: the
   loss sum and the correct count accumulate at stats; with dlogits.buf set,
   dlogits (M, output_dim) = grad_scale * d(sum of losses)/d logits. */
static dsgd_result dsgd__model_loss(dsgd_model *m, int M, float grad_scale, dsgd_ref dlogits, dsgd_ref stats) {
    int top = m->num_layers;
    return m->be.loss(m->be.impl, m->loss, M, m->dims[top], dsgd__ref(m->acts, m->act_off[top]),
                      dsgd__ref(m->targets, 0), grad_scale, dlogits, stats);
}

DSGD_API dsgd_result dsgd_model_compute_gradients(dsgd_model *m, const float *x, const float *y, int count,
                                                  float grad_scale) {
    dsgd_result r;
    const char *what = "dsgd_model_compute_gradients";
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if (!y) return dsgd_ctx_set_error(m->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: y is NULL", what);
    if ((r = dsgd__model_upload(m, x, y, count, what)) != DSGD_OK) return r;
    if ((r = dsgd__model_forward(m, count)) != DSGD_OK) return r;
    r = dsgd__model_loss(m, count, grad_scale, dsgd__ref(m->delta, 0), dsgd__ref(m->stats, 0)); /* dlogits */
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
    r = dsgd__model_loss(m, count, 0.0f, dsgd__ref(NULL, 0), dsgd__ref(m->stats, 2));
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

#endif /* DSGD__PART_MODEL_IMPL */
