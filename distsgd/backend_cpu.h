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

#endif /* DSGD__PART_BACKEND_CPU_IMPL */
