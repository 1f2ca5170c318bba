/* distsgd/backend_cpu_ops.h - the CPU backend's operations other than the GEMM, and dsgd_cpu_backend_create
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of backend_cpu.h (the backend's state, buffers, pool and kernels
   by ISA) after backend_cpu_gemm.h (the GEMM). Here: the element-wise
   operations, activations and losses, optimizer updates and the image
   operations (im2col, col2im, max-pool), each cut into tasks for the pool
   (CPU THREADS in backend.h); then the table of operations that
   dsgd_cpu_backend_create fills, and the backend's accessors.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_BACKEND_CPU_OPS_IMPL)
#define DSGD__PART_BACKEND_CPU_OPS_IMPL

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
/* The formulas are in dsgd__update_body (>>kernels in backend_cpu.h). */
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
    if (u->gate.buf) { /* a step's non-finite flag: skipped when set */
        const float *gate = dsgd__cpu_span(cpu, u->gate, 1, "optimizer_update gate");
        if (!gate) return DSGD_ERR_INVALID_ARGUMENT;
        if (*gate != 0.0f) return DSGD_OK;
    }
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
    const dsgd__cpu_kernel *kern; /* POOL_BWD: the backend's kernels */
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

/* The same rows for a window 3 wide over one channel (a first layer over
   gray pixels), where a window row is 3 floats and a memcpy call per row
   would cost more than its copy: per run of ox in one output row and per
   ky, each ox's 3 pixels, zeros outside the image. */
static void dsgd__img_im2col_c1w3(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const int kh = wd->kh, kw = 3, w = wd->w, s = wd->stride, pad = wd->pad, ow = j->d.ow, oh = j->d.oh;
    const size_t k = j->d.k;
    size_t r = lo;
    while (r < hi) {
        const size_t row = r / (size_t)ow, i = row / (size_t)oh; /* (i, oy) */
        const int ox0 = (int)(r % (size_t)ow), oy = (int)(row % (size_t)oh),
                  ox1 = hi - r < (size_t)(ow - ox0) ? ox0 + (int)(hi - r) : ow;
        int ky, ox, kx;
        for (ky = 0; ky < kh; ++ky) {
            const int iy = oy * s - pad + ky;
            const float *src = j->x + (i * (size_t)wd->h + (size_t)(iy < 0 ? 0 : iy)) * (size_t)w;
            float *d = j->out + r * k + (size_t)ky * (size_t)kw;
            for (ox = ox0; ox < ox1; ++ox, d += k) {
                const int ix0 = ox * s - pad;
                if (iy < 0 || iy >= wd->h) {
                    for (kx = 0; kx < kw; ++kx) d[kx] = 0.0f;
                } else if (ix0 >= 0 && ix0 + 3 <= w) { /* inside */
                    d[0] = src[ix0];
                    d[1] = src[ix0 + 1];
                    d[2] = src[ix0 + 2];
                } else {
                    for (kx = 0; kx < kw; ++kx) d[kx] = ix0 + kx >= 0 && ix0 + kx < w ? src[ix0 + kx] : 0.0f;
                }
            }
        }
        r += (size_t)(ox1 - ox0);
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

/* The same rows when no two windows overlap (stride >= kh and >= kw, the
   usual 2x2 stride 2): every element takes at most one window's dy, so
   each window row is written once by the kernel's pool_back, which needs
   no zeroed dx to add to; the rows are zeroed first only where some
   element lies in no window (stride > kh or kw, or rows and columns past
   the last window). */
static void dsgd__img_pool_bwd_apart(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const size_t c = (size_t)wd->c, rowlen = (size_t)wd->w * c, H = (size_t)wd->h;
    const int s = wd->stride, oh = j->d.oh, ow = j->d.ow;
    size_t r = lo;
    if (s != wd->kh || s != wd->kw || oh * s != wd->h || ow * s != wd->w)
        memset(j->out + lo * rowlen, 0, (hi - lo) * rowlen * sizeof(float));
    while (r < hi) { /* one image's band of rows [a, b) at a time */
        const size_t i = r / H;
        const int a = (int)(r % H), b = (int)((i + 1) * H < hi ? H : hi - i * H);
        int oy, oy_end = (b - 1) / s + 1;
        if (oy_end > oh) oy_end = oh;
        for (oy = a / s; oy < oy_end; ++oy) { /* the windows whose rows meet [a, b) */
            const int top = oy * s, r0 = a > top ? a - top : 0, r1 = b - top < wd->kh ? b - top : wd->kh;
            const size_t at = (i * H + (size_t)top) * rowlen, o = (i * (size_t)oh + (size_t)oy) * (size_t)ow * c;
            if (r0 < r1) j->kern->pool_back(j->out + at, j->x + at, j->y + o, j->dy + o, c, rowlen, ow, wd->kh, wd->kw, s, r0, r1);
        }
        r = (i + 1) * H;
    }
}

static void dsgd__img_pool_bwd(const dsgd__img_job *j, size_t lo, size_t hi) {
    const dsgd_window *wd = &j->wd;
    const size_t c = (size_t)wd->c, rowlen = (size_t)wd->w * c, H = (size_t)wd->h;
    size_t r = lo;
    if (wd->stride >= wd->kh && wd->stride >= wd->kw) {
        dsgd__img_pool_bwd_apart(j, lo, hi);
        return;
    }
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
    case DSGD__IMG_IM2COL:
        if (j->wd.c == 1 && j->wd.kw == 3)
            dsgd__img_im2col_c1w3(j, lo, hi);
        else
            dsgd__img_im2col(j, lo, hi);
        break;
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
    j->kern = cpu->kern;
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
#ifndef DSGD_USE_CBLAS
    out->conv_gemm = dsgd__cpu_conv_gemm;
    if (cpu->kern->thin) out->conv_backward_x = dsgd__cpu_conv_backward_x;
#endif
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

#endif /* DSGD__PART_BACKEND_CPU_OPS_IMPL */
