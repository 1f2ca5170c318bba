/* distsgd/cl/backend_ops.h - the OpenCL backend's operations: copies, GEMM, activations, losses, updates, images, marks
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   A part of backend.h, which holds what this one stands on and documents
   BACKENDS, STAGING, CLASS CHECKS and BITS: the backend's state
   (dsgd_cl__backend), its buffers, range checks and kernel launches, the
   staging ring and the class checks. Here: the operations behind
   dsgd_backend_i other than the buffers' (copy, fill, scale, axpy, the
   GEMM with its split along k, activations and losses, optimizer updates,
   norm_check, sum_across, the image operations, map, the marks), which
   backend_create.h puts in the table.
*/
#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_BACKEND_OPS_IMPL)
#define DSGD_CL__PART_BACKEND_OPS_IMPL

/* >>operations -------------------------------------------------------------- */
static dsgd_result dsgd_cl__copy(void *impl, dsgd_ref dst, dsgd_ref src, size_t count) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    dsgd_cl__buffer *d, *s;
    cl_int err;
    if (!dsgd_cl__out(b, dst, count, "copy") || !dsgd_cl__span(b, src, count, "copy"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (count == 0 || (dst.buf == src.buf && dst.off == src.off)) return DSGD_OK;
    d = dsgd_cl__buf(dst);
    s = dsgd_cl__buf(src);
    if (d == s && (dst.off < src.off + count && src.off < dst.off + count)) {
        /* overlapping ranges (memmove semantics): go through the scratch buffer */
        dsgd_result r = dsgd_cl__ensure_scratch(b, count * sizeof(float));
        if (r != DSGD_OK) return r;
        err = clEnqueueCopyBuffer(b->queue, s->mem, b->scratch, src.off * sizeof(float), 0,
                                  count * sizeof(float), 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueCopyBuffer(b->queue, b->scratch, d->mem, 0, dst.off * sizeof(float),
                                      count * sizeof(float), 0, NULL, NULL);
    } else {
        err = clEnqueueCopyBuffer(b->queue, s->mem, d->mem, src.off * sizeof(float),
                                  dst.off * sizeof(float), count * sizeof(float), 0, NULL, NULL);
    }
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueCopyBuffer", "copy");
    return DSGD_OK;
}

static dsgd_result dsgd_cl__fill(void *impl, dsgd_ref dst, float value, size_t count) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_float v = value;
    cl_int err;
    if (!dsgd_cl__out(b, dst, count, "fill")) return DSGD_ERR_INVALID_ARGUMENT;
    if (count == 0) return DSGD_OK;
    err = clEnqueueFillBuffer(b->queue, dsgd_cl__buf(dst)->mem, &v, sizeof(v), dst.off * sizeof(float),
                              count * sizeof(float), 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueFillBuffer", "fill");
    return DSGD_OK;
}

static dsgd_result dsgd_cl__scale(void *impl, dsgd_ref x, float alpha, size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong off = x.off, nn = n;
    cl_float a = alpha;
    dsgd_result r;
    if (!dsgd_cl__out(b, x, n, "scale")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    r = dsgd_cl__args(b, DSGD_CL__K_SCALE, 4, DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(off),
                      DSGD_CL__A(a), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_SCALE, n, b->local);
}

static dsgd_result dsgd_cl__axpy(void *impl, dsgd_ref y, float alpha, dsgd_ref x, size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong yoff = y.off, xoff = x.off, nn = n;
    cl_float a = alpha;
    dsgd_result r;
    if (!dsgd_cl__out(b, y, n, "axpy") || !dsgd_cl__span(b, x, n, "axpy")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    r = dsgd_cl__args(b, DSGD_CL__K_AXPY, 6, DSGD_CL__A(dsgd_cl__buf(y)->mem), DSGD_CL__A(yoff),
                      DSGD_CL__A(a), DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(xoff), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_AXPY, n, b->local);
}

/* C = beta * C for the m x n matrix at c (row stride ldc): beta == 0
   overwrites (NaN does not propagate), beta == 1 leaves C alone. */
static dsgd_result dsgd_cl__scale_matrix(dsgd_cl__backend *b, dsgd_ref c, int m, int n, int ldc,
                                         float beta) {
    int i;
    dsgd_result r = DSGD_OK;
    if (beta == 1.0f) return DSGD_OK;
    if (ldc == n) {
        return beta == 0.0f ? dsgd_cl__fill(b, c, 0.0f, (size_t)m * n)
                            : dsgd_cl__scale(b, c, beta, (size_t)m * n);
    }
    for (i = 0; i < m && r == DSGD_OK; ++i) {
        dsgd_ref row = c;
        row.off += (size_t)i * ldc;
        r = beta == 0.0f ? dsgd_cl__fill(b, row, 0.0f, (size_t)n) : dsgd_cl__scale(b, row, beta, (size_t)n);
    }
    return r;
}

/* A thin TN GEMM over a long k (a weight gradient over many rows, such as
   a convolution's over batch x pixels) gives CLBlast one tile of C or a few
   to run the whole k through; such GEMMs are split along k instead, into
   parts of at least 64 rows (at most 256 parts) that run in parallel and
   are then added in order (GEMM in the header comment). */
/* Whether b has run this GEMM shape since the last parameter override;
   called under the CLBlast lock (which guards the epoch). */
static int dsgd_cl__gemm_warm(const dsgd_cl__backend *b, int ta, int tb, int m, int n, int k) {
    int i;
    if (b->warm_epoch != dsgd_cl__clblast_epoch) return 0;
    for (i = 0; i < b->nwarm; ++i) {
        const dsgd_cl__shape *w = &b->warm[i];
        if (w->ta == ta && w->tb == tb && w->m == m && w->n == n && w->k == k) return 1;
    }
    return 0;
}

/* Notes a shape whose first call succeeded (under the exclusive lock). Past
   DSGD_CL__WARM_MAX shapes, a new one keeps taking the lock exclusively. */
static void dsgd_cl__gemm_remember(dsgd_cl__backend *b, int ta, int tb, int m, int n, int k) {
    dsgd_cl__shape *w;
    if (b->warm_epoch != dsgd_cl__clblast_epoch) {
        b->nwarm = 0;
        b->warm_epoch = dsgd_cl__clblast_epoch;
    }
    if (b->nwarm == DSGD_CL__WARM_MAX) return;
    w = &b->warm[b->nwarm++];
    w->ta = ta;
    w->tb = tb;
    w->m = m;
    w->n = n;
    w->k = k;
}

static int dsgd_cl__split_k(int ta, int tb, int m, int n, int k) {
    return ta && !tb && (size_t)m * (size_t)n <= 8192 && k >= 2048 && k >= 16 * (m > n ? m : n);
}

static dsgd_result dsgd_cl__gemm_split_k(dsgd_cl__backend *b, int m, int n, int k, float alpha, dsgd_ref ra,
                                         int lda, dsgd_ref rb, int ldb, float beta, dsgd_ref rc, int ldc) {
    size_t chunk = ((size_t)k + 255) / 256; /* at most 256 parts, of at least 64 rows */
    cl_uint mm = (cl_uint)m, nn = (cl_uint)n, kk = (cl_uint)k, kc, parts, la = (cl_uint)lda, lb = (cl_uint)ldb,
            lc = (cl_uint)ldc;
    cl_ulong aoff = ra.off, boff = rb.off, coff = rc.off;
    cl_float al = alpha, be = beta;
    dsgd_result r;
    if (chunk < 64) chunk = 64;
    kc = (cl_uint)chunk;
    parts = (cl_uint)(((size_t)k + chunk - 1) / chunk);
    if ((r = dsgd_cl__ensure_scratch(b, (size_t)parts * (size_t)m * (size_t)n * sizeof(float))) != DSGD_OK) return r;
    r = dsgd_cl__args(b, DSGD_CL__K_GEMM_TN_PART, 11, DSGD_CL__A(mm), DSGD_CL__A(nn), DSGD_CL__A(kk), DSGD_CL__A(kc),
                      DSGD_CL__A(dsgd_cl__buf(ra)->mem), DSGD_CL__A(aoff), DSGD_CL__A(la),
                      DSGD_CL__A(dsgd_cl__buf(rb)->mem), DSGD_CL__A(boff), DSGD_CL__A(lb), DSGD_CL__A(b->scratch));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_GEMM_TN_PART, (size_t)parts * b->local, b->local);
    if (r == DSGD_OK)
        r = dsgd_cl__args(b, DSGD_CL__K_GEMM_TN_SUM, 9, DSGD_CL__A(mm), DSGD_CL__A(nn), DSGD_CL__A(parts),
                          DSGD_CL__A(b->scratch), DSGD_CL__A(al), DSGD_CL__A(be), DSGD_CL__A(dsgd_cl__buf(rc)->mem),
                          DSGD_CL__A(coff), DSGD_CL__A(lc));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_GEMM_TN_SUM, (size_t)m * (size_t)n, b->local);
    return r;
}

static dsgd_result dsgd_cl__gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha,
                                 dsgd_ref ra, int lda, dsgd_ref rb, int ldb, float beta, dsgd_ref rc,
                                 int ldc) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    CLBlastTranspose tra = ta ? CLBlastTransposeYes : CLBlastTransposeNo, trb = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    size_t temp_bytes = 0;
    const char *call = "CLBlastSgemm";
    CLBlastStatusCode st;
    int exclusive;
    char what[96];
    if (m < 0 || n < 0 || k < 0 || lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "opencl gemm: bad sizes m=%d n=%d k=%d lda=%d ldb=%d ldc=%d", m, n, k,
                                  lda, ldb, ldc);
    if (m == 0 || n == 0) return DSGD_OK;
    if (!dsgd_cl__out(b, rc, (size_t)(m - 1) * ldc + n, "gemm C")) return DSGD_ERR_INVALID_ARGUMENT;
    if (k == 0 || alpha == 0.0f) return dsgd_cl__scale_matrix(b, rc, m, n, ldc, beta);
    if (!dsgd_cl__span(b, ra, (size_t)(a_rows - 1) * lda + a_cols, "gemm A") ||
        !dsgd_cl__span(b, rb, (size_t)(b_rows - 1) * ldb + b_cols, "gemm B"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (b->split_k && dsgd_cl__split_k(ta, tb, m, n, k)) return dsgd_cl__gemm_split_k(b, m, n, k, alpha, ra, lda, rb, ldb, beta, rc, ldc);
    /* CLBlast's indirect GEMM transposes and pads operands into a temporary
       buffer; left to itself it creates and frees one per call. The backend
       keeps one, grown when a call needs more (the in-order queue keeps
       consecutive GEMMs from overlapping in it). */
    pthread_rwlock_rdlock(&dsgd_cl__clblast_lock);
    exclusive = !dsgd_cl__gemm_warm(b, ta, tb, m, n, k);
    if (exclusive) { /* the shape's first call here: CLBlast may store to its caches */
        pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
        pthread_rwlock_wrlock(&dsgd_cl__clblast_lock);
        b->gemm_exclusive++;
    }
    st = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, tra, trb, (size_t)m, (size_t)n, (size_t)k, ra.off,
                                    (size_t)lda, rb.off, (size_t)ldb, rc.off, (size_t)ldc, &b->queue, &temp_bytes);
    if (st == CLBlastSuccess && temp_bytes > b->gemm_temp_bytes) {
        cl_int err;
        if (b->gemm_temp) clReleaseMemObject(b->gemm_temp); /* freed once queued work is done */
        b->gemm_temp_bytes = 0;
        b->gemm_temp = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE, temp_bytes, NULL, &err);
        if (err != CL_SUCCESS) {
            pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
            b->gemm_temp = NULL;
            return dsgd_cl__fail(b->ctx, err, "clCreateBuffer", "gemm temporary buffer");
        }
        b->gemm_temp_bytes = temp_bytes;
    }
    if (st != CLBlastSuccess) call = "CLBlastSGemmTempBufferSize";
    if (st == CLBlastSuccess)
        st = b->gemm_temp ? CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, tra, trb, (size_t)m, (size_t)n,
                                                      (size_t)k, alpha, dsgd_cl__buf(ra)->mem, ra.off, (size_t)lda,
                                                      dsgd_cl__buf(rb)->mem, rb.off, (size_t)ldb, beta,
                                                      dsgd_cl__buf(rc)->mem, rc.off, (size_t)ldc, &b->queue, NULL,
                                                      b->gemm_temp)
                          : CLBlastSgemm(CLBlastLayoutRowMajor, tra, trb, (size_t)m, (size_t)n, (size_t)k, alpha,
                                         dsgd_cl__buf(ra)->mem, ra.off, (size_t)lda, dsgd_cl__buf(rb)->mem, rb.off,
                                         (size_t)ldb, beta, dsgd_cl__buf(rc)->mem, rc.off, (size_t)ldc, &b->queue,
                                         NULL);
    if (exclusive && st == CLBlastSuccess) dsgd_cl__gemm_remember(b, ta, tb, m, n, k);
    pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
    if (st != CLBlastSuccess) {
        snprintf(what, sizeof(what), "%s%s %dx%dx%d", ta ? "T" : "N", tb ? "T" : "N", m, n, k);
        return dsgd_cl__fail(b->ctx, (int)st, call, what);
    }
    return DSGD_OK;
}

static int dsgd_cl__act_valid(dsgd_activation act) {
    return act == DSGD_ACT_NONE || act == DSGD_ACT_RELU || act == DSGD_ACT_TANH || act == DSGD_ACT_SIGMOID;
}

static dsgd_result dsgd_cl__bias_act_forward(void *impl, dsgd_activation act, dsgd_ref y, dsgd_ref bias,
                                             int m, int n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong yoff = y.off, boff = bias.off, total;
    cl_int has_bias = bias.buf != NULL, a = (cl_int)act;
    cl_uint nn = (cl_uint)n;
    cl_mem bmem;
    dsgd_result r;
    if (m < 0 || n < 0 || !dsgd_cl__act_valid(act))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "opencl bias_act_forward: bad arguments m=%d n=%d act=%d", m, n, (int)act);
    total = (cl_ulong)m * (cl_ulong)n;
    if (!dsgd_cl__out(b, y, (size_t)total, "bias_act_forward y")) return DSGD_ERR_INVALID_ARGUMENT;
    if (has_bias && !dsgd_cl__span(b, bias, (size_t)n, "bias_act_forward bias")) return DSGD_ERR_INVALID_ARGUMENT;
    if (total == 0 || (!has_bias && act == DSGD_ACT_NONE)) return DSGD_OK;
    bmem = has_bias ? dsgd_cl__buf(bias)->mem : NULL;
    r = dsgd_cl__args(b, DSGD_CL__K_BIAS_ACT, 8, DSGD_CL__A(dsgd_cl__buf(y)->mem), DSGD_CL__A(yoff),
                      DSGD_CL__A(bmem), DSGD_CL__A(boff), DSGD_CL__A(has_bias), DSGD_CL__A(a), DSGD_CL__A(nn),
                      DSGD_CL__A(total));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_BIAS_ACT, (size_t)total, b->local);
}

static dsgd_result dsgd_cl__act_backward(void *impl, dsgd_activation act, dsgd_ref dy, dsgd_ref y,
                                         size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong dyoff = dy.off, yoff = y.off, nn = n;
    cl_int a = (cl_int)act;
    dsgd_result r;
    if (!dsgd_cl__act_valid(act))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl act_backward: bad activation %d",
                                  (int)act);
    if (!dsgd_cl__out(b, dy, n, "act_backward dy") || !dsgd_cl__span(b, y, n, "act_backward y"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0 || act == DSGD_ACT_NONE) return DSGD_OK;
    r = dsgd_cl__args(b, DSGD_CL__K_ACT_BWD, 6, DSGD_CL__A(dsgd_cl__buf(dy)->mem), DSGD_CL__A(dyoff),
                      DSGD_CL__A(dsgd_cl__buf(y)->mem), DSGD_CL__A(yoff), DSGD_CL__A(a), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_ACT_BWD, n, b->local);
}

/* db = column sums of dy in the blocked order (kernels.h): with one block
   of DSGD_CL__BIAS_ROWS rows (m at most that) the partials kernel writes db
   itself; else it writes the blocks' partials to the scratch buffer and a
   second kernel sums them per column in block order. */
static dsgd_result dsgd_cl__bias_backward(void *impl, dsgd_ref db, dsgd_ref dy, int m, int n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong dboff = db.off, dyoff = dy.off, poff;
    cl_uint mm = (cl_uint)m, nn = (cl_uint)n, blocks;
    cl_mem part;
    dsgd_result r;
    if (m < 0 || n < 0)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl bias_backward: m=%d n=%d", m, n);
    if (!dsgd_cl__out(b, db, (size_t)n, "bias_backward db") ||
        !dsgd_cl__span(b, dy, (size_t)m * (size_t)n, "bias_backward dy"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    blocks = m <= DSGD_CL__BIAS_ROWS ? 1 : (mm + DSGD_CL__BIAS_ROWS - 1) / DSGD_CL__BIAS_ROWS;
    if (blocks == 1) {
        part = dsgd_cl__buf(db)->mem;
        poff = dboff;
    } else {
        r = dsgd_cl__ensure_scratch(b, (size_t)blocks * (size_t)n * sizeof(float));
        if (r != DSGD_OK) return r;
        part = b->scratch;
        poff = 0;
    }
    r = dsgd_cl__args(b, DSGD_CL__K_BIAS_PART, 6, DSGD_CL__A(part), DSGD_CL__A(poff),
                      DSGD_CL__A(dsgd_cl__buf(dy)->mem), DSGD_CL__A(dyoff), DSGD_CL__A(mm), DSGD_CL__A(nn));
    if (r == DSGD_OK) r = dsgd_cl__run2(b, DSGD_CL__K_BIAS_PART, (size_t)n, (size_t)blocks, b->local);
    if (r != DSGD_OK || blocks == 1) return r;
    r = dsgd_cl__args(b, DSGD_CL__K_BIAS_RED, 5, DSGD_CL__A(dsgd_cl__buf(db)->mem), DSGD_CL__A(dboff),
                      DSGD_CL__A(b->scratch), DSGD_CL__A(blocks), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_BIAS_RED, (size_t)n, b->local);
}

static dsgd_result dsgd_cl__loss(void *impl, dsgd_loss loss, int m, int c, dsgd_ref pred, dsgd_ref target,
                                 float grad_scale, dsgd_ref dpred, dsgd_ref stats) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    int xent = loss == DSGD_LOSS_SOFTMAX_XENT, kid;
    cl_uint mm = (cl_uint)m, cc = (cl_uint)c;
    cl_ulong poff = pred.off, toff = target.off, doff = dpred.off, soff = stats.off;
    cl_float gs = grad_scale;
    cl_int want = dpred.buf != NULL;
    int slot;
    cl_mem dmem;
    size_t L = b->reduce_local;
    dsgd_result r;
    cl_int err;
    if (m < 0 || c < 1 || (loss != DSGD_LOSS_SOFTMAX_XENT && loss != DSGD_LOSS_MSE))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl loss: bad arguments m=%d c=%d loss=%d",
                                  m, c, (int)loss);
    if (!dsgd_cl__span(b, pred, (size_t)m * c, "loss pred") ||
        !dsgd_cl__span(b, target, xent ? (size_t)m : (size_t)m * c, "loss target") ||
        !dsgd_cl__out(b, stats, 2, "loss stats"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (want && !dsgd_cl__out(b, dpred, (size_t)m * c, "loss dpred")) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd_cl__class_checks(b, 0)) != DSGD_OK) return r; /* an earlier loss's, come in */
    if (m == 0) return DSGD_OK;
    r = dsgd_cl__ensure_scratch(b, 2 * (size_t)m * b->acc_size);
    if (r != DSGD_OK) return r;
    dmem = want ? dsgd_cl__buf(dpred)->mem : NULL;
    kid = xent ? DSGD_CL__K_XENT : DSGD_CL__K_MSE;
    r = dsgd_cl__args(b, kid, 11, DSGD_CL__A(mm), DSGD_CL__A(cc), DSGD_CL__A(dsgd_cl__buf(pred)->mem),
                      DSGD_CL__A(poff), DSGD_CL__A(dsgd_cl__buf(target)->mem), DSGD_CL__A(toff), DSGD_CL__A(gs),
                      DSGD_CL__A(dmem), DSGD_CL__A(doff), DSGD_CL__A(want), DSGD_CL__A(b->scratch));
    if (r == DSGD_OK) r = dsgd_cl__run(b, kid, (size_t)m, b->local);
    if (r == DSGD_OK)
        r = dsgd_cl__args(b, DSGD_CL__K_LOSS_REDUCE, 9, DSGD_CL__A(mm), DSGD_CL__A(b->scratch),
                          DSGD_CL__A(dsgd_cl__buf(stats)->mem), DSGD_CL__A(soff), DSGD_CL__A(b->status),
                          DSGD_CL__LOCAL(L * b->acc_size), DSGD_CL__LOCAL(L * b->acc_size),
                          DSGD_CL__LOCAL(L * sizeof(cl_uint)), DSGD_CL__LOCAL(L * sizeof(cl_uint)));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_LOSS_REDUCE, L, L);
    if (r != DSGD_OK) return r;
    if (!xent) return DSGD_OK; /* MSE has no invalid targets */
    /* The class check's answer comes back without waiting, into a pinned
       slot; a later loss or a call that waits looks at it (CLASS CHECKS). */
    if (b->checks_n == DSGD_CL__CHECKS_MAX && (r = dsgd_cl__class_checks(b, 1)) != DSGD_OK) return r;
    slot = (b->checks_first + b->checks_n) % DSGD_CL__CHECKS_MAX;
    err = clEnqueueReadBuffer(b->queue, b->status, CL_FALSE, 0, 3 * sizeof(cl_int), b->checks_host + 4 * slot, 0,
                              NULL, &b->checks[slot].ev);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "loss class check");
    b->checks[slot].m = m;
    b->checks[slot].c = c;
    b->checks_n++;
    return DSGD_OK;
}

static dsgd_result dsgd_cl__optimizer_update(void *impl, const dsgd_opt_update *u, dsgd_ref p, dsgd_ref g,
                                             dsgd_ref m1, dsgd_ref m2, size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong poff = p.off, goff = g.off, m1off = m1.off, m2off = m2.off, nn = n;
    cl_int kind, nesterov;
    cl_float lr, mu, b1, b2, eps, wd, bc1, bc2, gs;
    cl_mem m1mem = NULL, m2mem = NULL, gmem;
    cl_ulong gateoff = u ? u->gate.off : 0;
    cl_int gated = u && u->gate.buf != NULL;
    dsgd_result r;
    if (!u) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl optimizer_update: bad arguments");
    if (!dsgd_cl__out(b, p, n, "optimizer_update param") || !dsgd_cl__span(b, g, n, "optimizer_update grad"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (u->kind != DSGD_OPT_SGD && u->kind != DSGD_OPT_MOMENTUM && u->kind != DSGD_OPT_ADAM &&
        u->kind != DSGD_OPT_ADAMW)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl optimizer_update: unknown kind %d",
                                  (int)u->kind);
    if (u->kind != DSGD_OPT_SGD) {
        if (!dsgd_cl__out(b, m1, n, "optimizer_update state m1")) return DSGD_ERR_INVALID_ARGUMENT;
        m1mem = dsgd_cl__buf(m1)->mem;
    }
    if (u->kind == DSGD_OPT_ADAM || u->kind == DSGD_OPT_ADAMW) {
        if (!dsgd_cl__out(b, m2, n, "optimizer_update state m2")) return DSGD_ERR_INVALID_ARGUMENT;
        m2mem = dsgd_cl__buf(m2)->mem;
    }
    if (gated && !dsgd_cl__span(b, u->gate, 1, "optimizer_update gate")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    gmem = gated ? dsgd_cl__buf(u->gate)->mem : dsgd_cl__buf(p)->mem; /* not NULL: see args8 */
    kind = (cl_int)u->kind;
    nesterov = u->nesterov != 0;
    lr = u->lr;
    mu = u->momentum;
    b1 = u->beta1;
    b2 = u->beta2;
    eps = u->eps;
    wd = u->weight_decay;
    bc1 = u->bias_correction1;
    bc2 = u->bias_correction2;
    gs = u->grad_scale;
    r = dsgd_cl__args(b, DSGD_CL__K_OPT, 23, DSGD_CL__A(dsgd_cl__buf(p)->mem), DSGD_CL__A(poff),
                      DSGD_CL__A(dsgd_cl__buf(g)->mem), DSGD_CL__A(goff), DSGD_CL__A(m1mem), DSGD_CL__A(m1off),
                      DSGD_CL__A(m2mem), DSGD_CL__A(m2off), DSGD_CL__A(nn), DSGD_CL__A(kind), DSGD_CL__A(lr),
                      DSGD_CL__A(mu), DSGD_CL__A(nesterov), DSGD_CL__A(b1), DSGD_CL__A(b2), DSGD_CL__A(eps),
                      DSGD_CL__A(wd), DSGD_CL__A(bc1), DSGD_CL__A(bc2), DSGD_CL__A(gs), DSGD_CL__A(gmem),
                      DSGD_CL__A(gateoff), DSGD_CL__A(gated));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_OPT, n, b->local);
}

static dsgd_result dsgd_cl__norm_check(void *impl, dsgd_ref x, size_t n, double *sumsq, size_t *nonfinite) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    size_t L = b->reduce_local, groups, chunk, i;
    cl_ulong off = x.off, nn = n, ch;
    double psum_d[DSGD_CL__NORM_MAX_GROUPS];
    float psum_f[DSGD_CL__NORM_MAX_GROUPS];
    cl_ulong pbad[DSGD_CL__NORM_MAX_GROUPS];
    double s = 0.0;
    size_t bad = 0;
    dsgd_result r;
    cl_int err;
    cl_mem status;
    if (!dsgd_cl__span(b, x, n, "norm_check")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) {
        if (sumsq) *sumsq = 0.0;
        if (nonfinite) *nonfinite = 0;
        return DSGD_OK;
    }
    /* Fixed for a given n and device: the same bits every run. */
    groups = (n + L * 16 - 1) / (L * 16);
    if (groups > DSGD_CL__NORM_MAX_GROUPS) groups = DSGD_CL__NORM_MAX_GROUPS;
    if (groups < 1) groups = 1;
    chunk = (n + groups - 1) / groups;
    ch = chunk;
    r = dsgd_cl__ensure_scratch(b, groups * b->acc_size);
    if (r != DSGD_OK) return r;
    status = b->status;
    r = dsgd_cl__args(b, DSGD_CL__K_NORM, 8, DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(off), DSGD_CL__A(nn),
                      DSGD_CL__A(ch), DSGD_CL__A(b->scratch), DSGD_CL__A(status), DSGD_CL__LOCAL(L * b->acc_size),
                      DSGD_CL__LOCAL(L * sizeof(cl_ulong)));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_NORM, groups * L, L);
    if (r != DSGD_OK) return r;
    err = clEnqueueReadBuffer(b->queue, b->scratch, CL_FALSE, 0, groups * b->acc_size,
                              b->acc_size == sizeof(double) ? (void *)psum_d : (void *)psum_f, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(b->queue, b->status, CL_TRUE, 0, groups * sizeof(cl_ulong), pbad, 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "norm_check partials");
    if ((r = dsgd_cl__waited(b)) != DSGD_OK) return r;
    /* second pass on the host, in group order, in double */
    for (i = 0; i < groups; ++i) {
        s += b->acc_size == sizeof(double) ? psum_d[i] : (double)psum_f[i];
        bad += (size_t)pbad[i];
    }
    if (sumsq) *sumsq = s;
    if (nonfinite) *nonfinite = bad;
    return DSGD_OK;
}

/* Sets kernel k's 8 (buffer, offset) pairs from argument `first` on to
   refs[0 .. count), shifted by lo; the unused pairs repeat refs[0] (never
   touched: the kernel stops at count). Not NULL: PoCL 3.1 ran these kernels
   about 80x slower with NULL buffer arguments. */
static dsgd_result dsgd_cl__args8(dsgd_cl__backend *b, int k, int first, const dsgd_ref *refs, int count,
                                  size_t lo) {
    int j;
    dsgd_result r = DSGD_OK;
    for (j = 0; j < 8 && r == DSGD_OK; ++j) {
        cl_mem mem = dsgd_cl__buf(refs[j < count ? j : 0])->mem;
        cl_ulong off = j < count ? (cl_ulong)(refs[j].off + lo) : 0;
        r = dsgd_cl__arg(b, k, first + 2 * j, sizeof(mem), &mem);
        if (r == DSGD_OK) r = dsgd_cl__arg(b, k, first + 2 * j + 1, sizeof(off), &off);
    }
    return r;
}

static int dsgd_cl__host_shared(void *impl) {
    return (((dsgd_cl__backend *)impl)->alloc_flags & CL_MEM_ALLOC_HOST_PTR) != 0;
}

/* One context and one device: a backend on another device could write one
   block of a buffer while this one writes another, and a runtime that keeps
   a copy per device and migrates the whole buffer would lose one of them. */
static int dsgd_cl__can_access(void *impl, const dsgd_backend_i *other) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    const dsgd_cl__backend *o;
    if (!dsgd_cl_is_backend(other)) return 0;
    o = (const dsgd_cl__backend *)other->impl;
    return o->cl == b->cl && o->dev == b->dev;
}

static const char *dsgd_cl__device_name(void *impl) { return ((dsgd_cl__backend *)impl)->label; }

/* Sums [lo, hi) of the n ranges in index order and writes the sum to all
   of them: up to 8 ranges in one launch, in place; more into the scratch
   buffer 8 sources a launch, then copied back to all of them. */
static dsgd_result dsgd_cl__sum_across(void *impl, const dsgd_ref *refs, int n, size_t lo, size_t hi) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong count = hi - lo, zero = 0;
    cl_int put = n <= 8; /* one launch, in place */
    cl_mem d;
    int j;
    dsgd_result r = DSGD_OK;
    if (!refs || n < 1 || hi < lo)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl sum_across: bad arguments");
    for (j = 0; j < n; ++j) {
        dsgd_ref x = refs[j];
        x.off += lo;
        if (!dsgd_cl__span(b, x, (size_t)count, "sum_across")) return DSGD_ERR_INVALID_ARGUMENT;
        if (dsgd_cl__buf(x)->dev != b->dev)
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "opencl sum_across: buffer %d was made on %s (device %d), this backend runs "
                                      "on %s (device %d); sum_across reaches one device's buffers",
                                      j, dsgd_cl_context_device_info(b->cl, dsgd_cl__buf(x)->dev)->device_name,
                                      dsgd_cl__buf(x)->dev, dsgd_cl_context_device_info(b->cl, b->dev)->device_name,
                                      b->dev);
    }
    if (count == 0) return DSGD_OK;
    if (!put && (r = dsgd_cl__ensure_scratch(b, (size_t)count * sizeof(float))) != DSGD_OK) return r;
    d = put ? dsgd_cl__buf(refs[0])->mem : b->scratch; /* d is unused with put */
    for (j = 0; j < n && r == DSGD_OK; j += 8) {
        cl_int acc = j > 0;
        cl_uint k = (cl_uint)(n - j < 8 ? n - j : 8);
        r = dsgd_cl__args(b, DSGD_CL__K_SUM8, 6, DSGD_CL__A(d), DSGD_CL__A(zero), DSGD_CL__A(acc), DSGD_CL__A(put),
                          DSGD_CL__A(k), DSGD_CL__A(count));
        if (r == DSGD_OK) r = dsgd_cl__args8(b, DSGD_CL__K_SUM8, 6, refs + j, (int)k, lo);
        if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_SUM8, (size_t)count, b->local);
    }
    for (j = 0; j < n && r == DSGD_OK && !put; j += 8) {
        cl_uint k = (cl_uint)(n - j < 8 ? n - j : 8);
        r = dsgd_cl__args(b, DSGD_CL__K_COPY8, 4, DSGD_CL__A(b->scratch), DSGD_CL__A(zero), DSGD_CL__A(k),
                          DSGD_CL__A(count));
        if (r == DSGD_OK) r = dsgd_cl__args8(b, DSGD_CL__K_COPY8, 4, refs + j, (int)k, lo);
        if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_COPY8, (size_t)count, b->local);
    }
    return r;
}

/* >>images ------------------------------------------------------------------ */
/* im2col, col2im and max-pool (IMAGES in backend.h): one work-item per
   float of the output or per row of them (BACKENDS), gathers where the
   CPU backend scatters within a row, the same sums in the same order (the
   kernels' comment in kernels.h). */

/* 1 when [a.off, a.off + na) and [b.off, b.off + nb) of one buffer share a
   float: a kernel reading what another work-item writes would race. */
static int dsgd_cl__overlap(dsgd_ref a, size_t na, dsgd_ref b, size_t nb) {
    return a.buf == b.buf && na && nb && a.off < b.off + nb && b.off < a.off + na;
}

/* Checks the window and the ranges (in: x, or col for col2im; y and dy:
   maxpool_backward's; out: col, dx or y) and launches kernel k, whose
   arguments are its buffers (as offsets) and then the window. */
static dsgd_result dsgd_cl__img(dsgd_cl__backend *b, int k, const dsgd_window *wd, dsgd_ref in, dsgd_ref y,
                                dsgd_ref dy, dsgd_ref out) {
    const char *name = dsgd_cl__kernel_op[k];
    dsgd__window_dims d;
    cl_int win[9], rd = b->img_spread ? 1 : 0;
    cl_ulong items, off[4];
    size_t nin, nout, run;
    const dsgd_ref *refs[4];
    int nref = 0, i;
    dsgd_result r;
    char what[48];
    if (dsgd__window_check(b->ctx, "opencl", name, wd, k == DSGD_CL__K_POOL_FWD || k == DSGD_CL__K_POOL_BWD, &d) !=
        DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    nin = k == DSGD_CL__K_COL2IM ? d.col : d.x;
    nout = k == DSGD_CL__K_IM2COL ? d.col : k == DSGD_CL__K_POOL_FWD ? d.y : d.x;
    snprintf(what, sizeof(what), "%s %s", name, k == DSGD_CL__K_COL2IM ? "col" : "x");
    if (!dsgd_cl__span(b, in, nin, what)) return DSGD_ERR_INVALID_ARGUMENT;
    refs[nref++] = &in;
    if (k == DSGD_CL__K_POOL_BWD) {
        snprintf(what, sizeof(what), "%s y", name);
        if (!dsgd_cl__span(b, y, d.y, what)) return DSGD_ERR_INVALID_ARGUMENT;
        snprintf(what, sizeof(what), "%s dy", name);
        if (!dsgd_cl__span(b, dy, d.y, what)) return DSGD_ERR_INVALID_ARGUMENT;
        if (dsgd_cl__overlap(out, nout, y, d.y) || dsgd_cl__overlap(out, nout, dy, d.y))
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl %s: dx overlaps y or dy", name);
        refs[nref++] = &y;
        refs[nref++] = &dy;
    }
    snprintf(what, sizeof(what), "%s %s", name,
             k == DSGD_CL__K_IM2COL ? "col" : k == DSGD_CL__K_POOL_FWD ? "y" : "dx");
    if (!dsgd_cl__out(b, out, nout, what)) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd_cl__overlap(out, nout, in, nin))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl %s: the output overlaps the input", name);
    refs[nref++] = &out;
    win[0] = wd->h;
    win[1] = wd->w;
    win[2] = wd->c;
    win[3] = wd->kh;
    win[4] = wd->kw;
    win[5] = wd->stride;
    win[6] = wd->pad;
    win[7] = d.oh;
    win[8] = d.ow;
    /* the range (IMAGES kernels in kernels.h): dimension 0 along col's rows
       of kw c floats or the c channels of a pixel; dimension 1 over col's
       rows (i, oy, ox, ky), else the output's pixels */
    run = k == DSGD_CL__K_IM2COL ? (size_t)wd->kw * (size_t)wd->c : (size_t)wd->c;
    items = run ? (cl_ulong)(nout / run) : 0;
    /* 32-bit indices when every range (whence every index) fits in an int */
    if (nin > b->img32_max || nout > b->img32_max || (k == DSGD_CL__K_POOL_BWD && d.y > b->img32_max))
        k += DSGD_CL__K_IM2COL_64 - DSGD_CL__K_IM2COL;
    for (i = 0, r = DSGD_OK; i < nref && r == DSGD_OK; ++i) {
        off[i] = refs[i]->off;
        r = dsgd_cl__arg(b, k, 2 * i, sizeof(cl_mem), &dsgd_cl__buf(*refs[i])->mem);
        if (r == DSGD_OK) r = dsgd_cl__arg(b, k, 2 * i + 1, sizeof(cl_ulong), &off[i]);
    }
    for (i = 0; i < 9 && r == DSGD_OK; ++i) r = dsgd_cl__arg(b, k, 2 * nref + i, sizeof(cl_int), &win[i]);
    if (r == DSGD_OK) r = dsgd_cl__arg(b, k, 2 * nref + 9, sizeof(cl_ulong), &items);
    if (r == DSGD_OK) r = dsgd_cl__arg(b, k, 2 * nref + 10, sizeof(cl_int), &rd);
    return r != DSGD_OK ? r : dsgd_cl__run2(b, k, run, (size_t)items, b->img_spread ? b->local : 1);
}

static dsgd_result dsgd_cl__im2col(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref col) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_IM2COL, wd, x, x, x, col);
}

static dsgd_result dsgd_cl__col2im(void *impl, const dsgd_window *wd, dsgd_ref col, dsgd_ref dx) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_COL2IM, wd, col, col, col, dx);
}

static dsgd_result dsgd_cl__maxpool_forward(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_POOL_FWD, wd, x, x, x, y);
}

static dsgd_result dsgd_cl__maxpool_backward(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y,
                                             dsgd_ref dy, dsgd_ref dx) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_POOL_BWD, wd, x, y, dy, dx);
}

static dsgd_result dsgd_cl__map_rw(void *impl, dsgd_ref ref, size_t count, float **out) {
    return dsgd_cl__map_impl((dsgd_cl__backend *)impl, ref, count, DSGD_CL_MAP_READ | DSGD_CL_MAP_WRITE, out);
}

static dsgd_result dsgd_cl__unmap_rw(void *impl, dsgd_ref ref, float *ptr) {
    return dsgd_cl__unmap_impl((dsgd_cl__backend *)impl, ref, ptr);
}

/* mark, wait_marks, release_mark: events of one context order its queues
   on the device. */
static dsgd_result dsgd_cl__mark(void *impl, void **out) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_event ev = NULL;
    cl_int err;
    if (!out) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl mark: out is NULL");
    *out = NULL;
    err = clEnqueueMarkerWithWaitList(b->queue, 0, NULL, &ev);
    /* another queue waiting for the mark needs this one flushed (OpenCL
       1.2, 5.13), and the device starts on what is queued */
    if (err == CL_SUCCESS) err = clFlush(b->queue);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueMarkerWithWaitList", "mark");
    *out = (void *)ev;
    return DSGD_OK;
}

static dsgd_result dsgd_cl__wait_marks(void *impl, void *const *marks, int n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_event evs[64];
    int i;
    cl_int err;
    if (n < 0 || n > 64 || (n > 0 && !marks))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl wait_marks: %d marks (0..64)", n);
    if (n == 0) return DSGD_OK;
    for (i = 0; i < n; ++i) {
        if (!marks[i])
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl wait_marks: mark %d is NULL", i);
        evs[i] = (cl_event)marks[i];
    }
    err = clEnqueueBarrierWithWaitList(b->queue, (cl_uint)n, evs, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueBarrierWithWaitList", "wait_marks");
    return DSGD_OK;
}

static void dsgd_cl__release_mark(void *impl, void *mark) {
    DSGD__UNUSED(impl);
    if (mark) clReleaseEvent((cl_event)mark);
}

/* nonfinite_flag, read_marked, wait_mark: the verdict kept on the device. */
static dsgd_result dsgd_cl__nonfinite_flag(void *impl, dsgd_ref x, size_t n, dsgd_ref flag) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong off = x.off, nn = n, foff = flag.off;
    size_t L = b->reduce_local;
    dsgd_result r;
    if (!dsgd_cl__span(b, x, n, "nonfinite_flag x") || !dsgd_cl__out(b, flag, 1, "nonfinite_flag flag"))
        return DSGD_ERR_INVALID_ARGUMENT;
    r = dsgd_cl__args(b, DSGD_CL__K_NONFINITE, 6, DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(off), DSGD_CL__A(nn),
                      DSGD_CL__A(dsgd_cl__buf(flag)->mem), DSGD_CL__A(foff), DSGD_CL__LOCAL(L * sizeof(cl_int)));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_NONFINITE, L, L);
}

static dsgd_result dsgd_cl__read_marked(void *impl, dsgd_ref src, float *dst, size_t count, void **mark) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_event ev = NULL;
    cl_int err;
    if (!mark) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl read_marked: mark is NULL");
    *mark = NULL;
    if (!dsgd_cl__span(b, src, count, "read_marked")) return DSGD_ERR_INVALID_ARGUMENT;
    if (!dst || count == 0)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl read_marked: dst NULL or count 0");
    err = clEnqueueReadBuffer(b->queue, dsgd_cl__buf(src)->mem, CL_FALSE, src.off * sizeof(float),
                              count * sizeof(float), dst, 0, NULL, &ev);
    if (err == CL_SUCCESS && (err = clFlush(b->queue)) != CL_SUCCESS) clReleaseEvent(ev); /* submitted now: in by the next step */
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "read_marked");
    *mark = (void *)ev;
    return DSGD_OK;
}

static dsgd_result dsgd_cl__wait_mark(void *impl, void *mark) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_int err;
    if (!mark) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl wait_mark: mark is NULL");
    err = dsgd_cl__await(b, (cl_event)mark);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clWaitForEvents", "wait_mark");
    return DSGD_OK;
}

#endif /* DSGD_CL__PART_BACKEND_OPS_IMPL */
