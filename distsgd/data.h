/* distsgd/data.h - datasets, samplers, the IDX and CSV loaders
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/
#ifndef DSGD__PART_DATA_DECL
#define DSGD__PART_DATA_DECL

#ifdef __cplusplus
extern "C" {
#endif

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
/* From memory (stb's _from_memory): dsgd_dataset_parse_csv reads the CSV
   text [text, text + len) (no NUL needed; text may be NULL when len is 0),
   dsgd_dataset_parse_idx the two IDX files' bytes, with the rules, results
   and messages of the loaders above; the messages name "CSV text",
   "IDX images" and "IDX labels" instead of paths. The inputs are only read
   (the caller keeps them). The file loaders are these on a file's bytes.
   Errors (recorded on ctx): as the loaders, without DSGD_ERR_IO, and
   DSGD_ERR_INVALID_ARGUMENT for a NULL input with a non-zero size.
   Thread safety: the context's thread; the inputs may be shared. */
DSGD_API dsgd_result dsgd_dataset_parse_csv(dsgd_ctx *ctx, const char *text, size_t len,
                                            const dsgd_csv_desc *desc, dsgd_dataset *out);
DSGD_API dsgd_result dsgd_dataset_parse_idx(dsgd_ctx *ctx, const void *images, size_t images_size,
                                            const void *labels, size_t labels_size, int num_classes,
                                            dsgd_dataset *out);
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
    size_t cursor;     /* samples of this epoch dsgd_sampler_next has handed
                          out (a checkpoint saves it with the epoch) */
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
   dsgd_sampler_set_epoch: computes epoch `epoch`'s permutation and sets
   the cursor to its start.
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
/* The next batch of the current epoch, from the cursor: sets *idx (if idx
   is not NULL) to its indices and returns their count, min(batch, samples
   left), advancing the cursor by it; 0 at the end of the epoch (fewer than
   batch left with drop_last), where the loop calls set_epoch(epoch + 1).
   The cursor counts samples, not batches, so a sampler restored from a
   checkpoint (dsgd_model_restore, dsgd_strategy_restore) with another batch
   size still hands out each sample of the epoch exactly once:
       for (; smp.epoch < epochs; dsgd_sampler_set_epoch(&smp, smp.epoch + 1))
           while ((k = dsgd_sampler_next(&smp, &idx)) > 0) { ... }
   Errors: none (s NULL or not initialised: 0).
   Thread safety: one thread at a time per sampler. */
DSGD_API size_t dsgd_sampler_next(dsgd_sampler *s, const size_t **idx);
/* Batch k (0, 1, ...) of worker `worker`'s shard, when num_workers
   workers share the sampler's epochs (the same seed on every worker) as
   dsgd_cluster_set_dataset cuts them: worker w takes batches w, w + W,
   w + 2W, ... of each epoch, per = floor(num_batches / W) of them, so its
   batch k is batch w + (k % per) W of epoch k / per, and the shards are
   disjoint. Moves the sampler to that epoch when it is in another (as
   dsgd_sampler_set_epoch: call it with k growing), sets *idx (if idx is not
   NULL) as dsgd_sampler_batch and returns the count; 0 when worker is not
   in 0..num_workers-1 or there are fewer batches than workers.
   Errors: none (s NULL or not initialised: 0).
   Thread safety: one thread at a time per sampler. */
DSGD_API size_t dsgd_sampler_worker_batch(dsgd_sampler *s, int worker, int num_workers, uint64_t k,
                                          const size_t **idx);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_DATA_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_DATA_IMPL)
#define DSGD__PART_DATA_IMPL

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
    s->cursor = 0;
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

DSGD_API size_t dsgd_sampler_next(dsgd_sampler *s, const size_t **idx) {
    size_t k;
    if (!s || !s->order || s->cursor >= s->n) return 0;
    k = DSGD__MIN(s->batch, s->n - s->cursor);
    if (s->drop_last && k < s->batch) return 0;
    if (idx) *idx = s->order + s->cursor;
    s->cursor += k;
    return k;
}

DSGD_API size_t dsgd_sampler_worker_batch(dsgd_sampler *s, int worker, int num_workers, uint64_t k,
                                          const size_t **idx) {
    size_t per;
    uint64_t epoch;
    if (!s || !s->order || worker < 0 || worker >= num_workers) return 0;
    per = dsgd_sampler_num_batches(s) / (size_t)num_workers;
    if (per == 0) return 0;
    epoch = k / (uint64_t)per;
    if (s->epoch != epoch) dsgd_sampler_set_epoch(s, epoch);
    return dsgd_sampler_batch(s, (size_t)worker + (size_t)(k % (uint64_t)per) * (size_t)num_workers, idx);
}

/* >>loaders ---------------------------------------------------------------- */

static dsgd_result dsgd__idx_header(dsgd_ctx *ctx, const unsigned char *h, size_t fsize, const char *path,
                                    int want_dims, uint32_t *dims, size_t *items) {
    size_t hlen = 4 + 4 * (size_t)want_dims, total = 1, data;
    int d;
    if (fsize < 4)
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
    if (fsize < hlen)
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

/* The IDX pair in memory; iname and lname name them in messages. */
static dsgd_result dsgd__parse_idx(dsgd_ctx *ctx, const unsigned char *img, size_t isize, const char *iname,
                                   const unsigned char *lbl, size_t lsize, const char *lname, int num_classes,
                                   dsgd_dataset *out) {
    size_t items = 0, litems = 0, i, dim;
    uint32_t idims[3] = {0, 0, 0}, ldims[1] = {0};
    const unsigned char *px, *lb;
    dsgd_result r;
    r = dsgd__idx_header(ctx, img, isize, iname, 3, idims, &items);
    if (r == DSGD_OK) r = dsgd__idx_header(ctx, lbl, lsize, lname, 1, ldims, &litems);
    if (r == DSGD_OK && idims[0] != ldims[0])
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s holds %u images but %s holds %u labels", iname,
                               (unsigned)idims[0], lname, (unsigned)ldims[0]);
    if (r == DSGD_OK && idims[0] == 0)
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: the header (offset 4) says it holds no images", iname);
    if (r == DSGD_OK && (idims[1] == 0 || idims[2] == 0 || (size_t)idims[1] * idims[2] > (1u << 24)))
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: image size %ux%u is not supported", iname,
                               (unsigned)idims[1], (unsigned)idims[2]);
    if (r == DSGD_OK) {
        dim = (size_t)idims[1] * idims[2];
        /* sizes are now bounded by the input's real size */
        r = dsgd_dataset_alloc(ctx, idims[0], (int)dim, 1, num_classes, out);
    }
    if (r != DSGD_OK) return r;
    px = img + 16; /* the headers are checked: 16 and 8 bytes, then exactly the data */
    lb = lbl + 8;
    for (i = 0; i < items; ++i) out->x[i] = (float)px[i] * (1.0f / 255.0f);
    for (i = 0; i < litems; ++i) {
        if (lb[i] >= num_classes) {
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s: label %u of sample %zu (offset %zu) is outside [0, %d)",
                                   lname, lb[i], i, 8 + i, num_classes);
            dsgd_dataset_free(out);
            return r;
        }
        out->y[i] = (float)lb[i];
    }
    return DSGD_OK;
}

static dsgd_result dsgd__idx_classes(dsgd_ctx *ctx, int *num_classes, dsgd_dataset *out, const char *what) {
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
    memset(out, 0, sizeof(*out));
    if (*num_classes == 0) *num_classes = 10;
    if (*num_classes < 0 || *num_classes > 256)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: num_classes %d outside 1..256", what,
                                  *num_classes);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_dataset_parse_idx(dsgd_ctx *ctx, const void *images, size_t images_size, const void *labels,
                                            size_t labels_size, int num_classes, dsgd_dataset *out) {
    dsgd_result r = dsgd__idx_classes(ctx, &num_classes, out, "dsgd_dataset_parse_idx");
    if (r != DSGD_OK) return r;
    if ((!images && images_size) || (!labels && labels_size))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_parse_idx: NULL data with a size");
    return dsgd__parse_idx(ctx, (const unsigned char *)images, images_size, "IDX images",
                           (const unsigned char *)labels, labels_size, "IDX labels", num_classes, out);
}

DSGD_API dsgd_result dsgd_dataset_load_idx(dsgd_ctx *ctx, const char *images_path, const char *labels_path,
                                           int num_classes, dsgd_dataset *out) {
    size_t isize = 0, lsize = 0;
    char *img, *lbl;
    dsgd_result r = dsgd__idx_classes(ctx, &num_classes, out, "dsgd_dataset_load_idx");
    if (r != DSGD_OK) return r;
    if (!(img = dsgd__read_file(ctx, images_path, &isize)))
        return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO; /* ctx may be NULL */
    if (!(lbl = dsgd__read_file(ctx, labels_path, &lsize))) {
        DSGD_FREE(img);
        return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO;
    }
    r = dsgd__parse_idx(ctx, (const unsigned char *)img, isize, images_path, (const unsigned char *)lbl, lsize,
                        labels_path, num_classes, out);
    DSGD_FREE(img);
    DSGD_FREE(lbl);
    return r;
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

/* Checks desc (NULL: defaults) into *d and clears *out. */
static dsgd_result dsgd__csv_desc(dsgd_ctx *ctx, const dsgd_csv_desc *desc, dsgd_csv_desc *d, dsgd_dataset *out,
                                  const char *what) {
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
    memset(out, 0, sizeof(*out));
    memset(d, 0, sizeof(*d));
    if (desc) *d = *desc;
    if (d->label_column < 0 || d->num_classes < 0 || d->header_lines < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: label_column %d, num_classes %d, header_lines %d must be >= 0", what,
                                  d->label_column, d->num_classes, d->header_lines);
    if (!(d->feature_scale >= 0.0f) || !isfinite(d->feature_scale))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: feature_scale %g must be finite and >= 0 (0: 1)",
                                  what, (double)d->feature_scale);
    return DSGD_OK;
}

/* A CSV parse: the text, its name in messages, the checked desc, and what
   pass 1 (the shape) found for pass 2 (the values). */
typedef struct dsgd__csv {
    dsgd_ctx *ctx;
    const char *text, *stop, *path; /* the text is [text, stop) */
    dsgd_csv_desc d;
    float scale;                    /* feature_scale, 0 read as 1 */
    size_t fields, rows;            /* of every data line; data lines */
    int label_col;                  /* 1-based */
    int max_label;                  /* the largest label seen, -1 before any */
} dsgd__csv;

/* The next data line after *p, skipping header and blank lines: sets
   [*line, *end) (without its terminator) and *line_no (1-based, counting
   every line) and moves *p past it; 0 at the end of the text. */
static int dsgd__csv_next(const dsgd__csv *cs, const char **p, size_t *line_no, const char **line,
                          const char **end) {
    while (*p < cs->stop) {
        *line = *p;
        ++*line_no;
        *p = dsgd__csv_line(*p, cs->stop, end);
        if ((int)*line_no > cs->d.header_lines && !dsgd__csv_blank(*line, *end)) return 1;
    }
    return 0;
}

/* Pass 1, the shape: every data line has the first one's number of fields
   (2 or more) and no NUL byte; sets rows, fields and label_col. */
static dsgd_result dsgd__csv_shape(dsgd__csv *cs) {
    const char *p = cs->text, *line, *end;
    size_t line_no = 0, nf;
    while (dsgd__csv_next(cs, &p, &line_no, &line, &end)) {
        if (memchr(line, '\0', (size_t)(end - line)))
            return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT, "%s: line %zu holds a NUL byte", cs->path, line_no);
        nf = dsgd__csv_fields(line, end);
        if (cs->rows == 0) {
            cs->fields = nf;
            if (nf < 2 || nf > (1u << 20))
                return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT,
                                          "%s: line %zu has %zu fields; need 2 or more (features and a label)",
                                          cs->path, line_no, nf);
        } else if (nf != cs->fields) {
            return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT, "%s: line %zu has %zu fields, the first data line has %zu",
                                      cs->path, line_no, nf, cs->fields);
        }
        ++cs->rows;
    }
    if (cs->rows == 0) return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT, "%s: no data lines", cs->path);
    cs->label_col = cs->d.label_column == 0 ? (int)cs->fields : cs->d.label_column;
    if ((size_t)cs->label_col > cs->fields)
        return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT, "%s: label column %d, but lines have %zu fields", cs->path,
                                  cs->label_col, cs->fields);
    return DSGD_OK;
}

/* How much of the field [f, fe) a message shows. */
static int dsgd__csv_shown(const char *f, const char *fe) { return (int)DSGD__MIN((size_t)(fe - f), (size_t)40); }

/* The label of a row: v must be an integer in [0, num_classes) (num_classes
   0: [0, 2^20)). col is 0-based. */
static dsgd_result dsgd__csv_label(dsgd__csv *cs, double v, size_t line_no, size_t col, float *y) {
    int limit = cs->d.num_classes ? cs->d.num_classes : (1 << 20);
    if (v != floor(v) || v < 0 || v >= limit)
        return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT, "%s: line %zu, column %zu: label %g is not an integer in [0, %d)",
                                  cs->path, line_no, col + 1, v, limit);
    *y = (float)v;
    if ((int)v > cs->max_label) cs->max_label = (int)v;
    return DSGD_OK;
}

/* A feature, the field [f, fe) read as v: scaled in double, then checked as
   a float (1e300, or a finite field times a large scale, would be an
   infinite float). col is 0-based. */
static dsgd_result dsgd__csv_feature(const dsgd__csv *cs, double v, const char *f, const char *fe, size_t line_no,
                                     size_t col, float *x) {
    float xv = (float)(v * (double)cs->scale);
    if (!isfinite(xv))
        return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT,
                                  "%s: line %zu, column %zu: '%.*s' times feature_scale %g is outside the float range",
                                  cs->path, line_no, col + 1, dsgd__csv_shown(f, fe), f, (double)cs->scale);
    *x = xv;
    return DSGD_OK;
}

/* Pass 2, one data line [line, end) (pass 1 checked its field count) into
   row `row` of out: the label into y, the other fields, in order, into x. */
static dsgd_result dsgd__csv_row(dsgd__csv *cs, const char *line, const char *end, size_t line_no, size_t row,
                                 dsgd_dataset *out) {
    const char *f = line, *fe;
    size_t col, c;
    double v;
    dsgd_result r;
    for (col = 0; col < cs->fields; ++col) {
        fe = f;
        while (fe < end && *fe != ',') ++fe;
        if (!dsgd__csv_number(f, fe, &v))
            return dsgd_ctx_set_error(cs->ctx, DSGD_ERR_FORMAT, "%s: line %zu, column %zu: '%.*s' is not a finite number",
                                      cs->path, line_no, col + 1, dsgd__csv_shown(f, fe), f);
        if ((int)col + 1 == cs->label_col) {
            r = dsgd__csv_label(cs, v, line_no, col, &out->y[row]);
        } else {
            c = (int)col + 1 > cs->label_col ? col - 1 : col; /* x skips the label column */
            r = dsgd__csv_feature(cs, v, f, fe, line_no, col, &out->x[row * out->dim + c]);
        }
        if (r != DSGD_OK) return r;
        f = fe < end ? fe + 1 : end; /* past the comma, never beyond end */
    }
    return DSGD_OK;
}

/* Pass 2, the values: every data line into the next row of out. */
static dsgd_result dsgd__csv_values(dsgd__csv *cs, dsgd_dataset *out) {
    const char *p = cs->text, *line, *end;
    size_t line_no = 0, row = 0;
    dsgd_result r;
    while (dsgd__csv_next(cs, &p, &line_no, &line, &end)) {
        DSGD_ASSERT(row < cs->rows);
        if ((r = dsgd__csv_row(cs, line, end, line_no, row++, out)) != DSGD_OK) return r;
    }
    return DSGD_OK;
}

/* The CSV text [text, text + len) (no NUL needed), named path in messages:
   the shape (pass 1), the dataset, the values (pass 2). */
static dsgd_result dsgd__parse_csv(dsgd_ctx *ctx, const char *text, size_t len, const char *path,
                                   const dsgd_csv_desc *dp, dsgd_dataset *out) {
    dsgd__csv cs;
    dsgd_result r;
    memset(&cs, 0, sizeof(cs));
    cs.ctx = ctx;
    cs.text = text;
    cs.stop = text + len;
    cs.path = path;
    cs.d = *dp;
    cs.scale = dp->feature_scale == 0.0f ? 1.0f : dp->feature_scale;
    cs.max_label = -1;
    r = dsgd__csv_shape(&cs);
    if (r == DSGD_OK) r = dsgd_dataset_alloc(ctx, cs.rows, (int)cs.fields - 1, 1, cs.d.num_classes, out);
    if (r == DSGD_OK) r = dsgd__csv_values(&cs, out);
    if (r != DSGD_OK) {
        dsgd_dataset_free(out);
        return r;
    }
    if (!cs.d.num_classes) out->num_classes = cs.max_label + 1;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_dataset_parse_csv(dsgd_ctx *ctx, const char *text, size_t len, const dsgd_csv_desc *desc,
                                            dsgd_dataset *out) {
    dsgd_csv_desc d;
    dsgd_result r = dsgd__csv_desc(ctx, desc, &d, out, "dsgd_dataset_parse_csv");
    if (r != DSGD_OK) return r;
    if (!text && len) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_dataset_parse_csv: text is NULL");
    return dsgd__parse_csv(ctx, text ? text : "", len, "CSV text", &d, out);
}

DSGD_API dsgd_result dsgd_dataset_load_csv(dsgd_ctx *ctx, const char *path, const dsgd_csv_desc *desc,
                                           dsgd_dataset *out) {
    dsgd_csv_desc d;
    size_t len = 0;
    char *text;
    dsgd_result r = dsgd__csv_desc(ctx, desc, &d, out, "dsgd_dataset_load_csv");
    if (r != DSGD_OK) return r;
    text = dsgd__read_file(ctx, path, &len);
    if (!text) return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO; /* ctx may be NULL */
    r = dsgd__parse_csv(ctx, text, len, path, &d, out);
    DSGD_FREE(text);
    return r;
}

#endif /* DSGD__PART_DATA_IMPL */
