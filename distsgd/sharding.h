/* distsgd/sharding.h - partitioners and the shard map: which server holds which rows of which variable
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   SHARDING. A parameter-server strategy keeps each variable on the servers,
   not on the workers. This part decides where, the way TensorFlow's
   ParameterServerStrategy does, and nothing else: it is pure arithmetic on
   variable shapes, with no threads and no transport.

   - A partitioner says into how many shards one variable is cut. Shards are
     cut along the first axis only (rows of a kernel, elements of a bias), and
     the kinds are tf.distribute.experimental.partitioners' (bytes are the
     variable's bytes; rows = shape[0]; a row = the product of the other axes):

       NONE          1: whole variables (the default)
       FIXED_SHARDS  min(num_shards, rows)
       MIN_SIZE      max(1, min(rows, max_shards, ceil(bytes / min_shard_bytes)))
                     every shard holds at least min_shard_bytes where it can
       MAX_SIZE      ceil(rows / max(1, floor(max_shard_bytes / row bytes))),
                     then at most max_shards when max_shards > 0: every shard
                     holds at most max_shard_bytes where one row fits

   - k shards of n rows: shard i holds n / k rows, plus one for the first
     n mod k shards (TF's "div" rule: 10 rows in 4 shards are 3, 3, 2, 2).
   - Placement is round-robin with one counter for the whole model: the
     variables in their order, each variable's shards in row order, shard j
     of the whole list on server j mod P (TF's round-robin placement, where
     each shard is a variable of its own).
   - Rows are contiguous in the flat buffer (row-major), so every shard is one
     contiguous range of it. The gradient buffer and every optimizer slot
     share the parameters' offsets, so the same map shards them too: a server
     holds, for each of its shards, the parameters, the optimizer's slots and
     receives the gradients of the same range.
*/
#ifndef DSGD__PART_SHARDING_DECL
#define DSGD__PART_SHARDING_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- sharding */

typedef enum dsgd_partitioner_kind {
    DSGD_PARTITIONER_NONE = 0,         /* whole variables */
    DSGD_PARTITIONER_FIXED_SHARDS = 1, /* FixedShardsPartitioner */
    DSGD_PARTITIONER_MIN_SIZE = 2,     /* MinSizePartitioner */
    DSGD_PARTITIONER_MAX_SIZE = 3      /* MaxSizePartitioner */
} dsgd_partitioner_kind;
#define DSGD_PARTITIONER_COUNT (DSGD_PARTITIONER_MAX_SIZE + 1)

/* TF's MinSizePartitioner default: 256 KiB per shard at least. */
#define DSGD_DEFAULT_MIN_SHARD_BYTES ((size_t)256 * 1024)

/* Zero-initialise, set kind and the fields it reads. */
typedef struct dsgd_partitioner {
    dsgd_partitioner_kind kind;
    int num_shards;         /* FIXED_SHARDS: >= 1 */
    size_t min_shard_bytes; /* MIN_SIZE: 0 means DSGD_DEFAULT_MIN_SHARD_BYTES */
    size_t max_shard_bytes; /* MAX_SIZE: >= 1 (no default, as in TF) */
    int max_shards;         /* MIN_SIZE: 0 means 1 (TF's default);
                               MAX_SIZE: 0 means no limit; never negative */
} dsgd_partitioner;

/* "NONE", "FIXED_SHARDS", "MIN_SIZE", "MAX_SIZE"; "?" for other values.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_partitioner_kind_name(dsgd_partitioner_kind kind);

/* The number of shards p cuts a variable of the given shape into (the first
   element of what TF's partitioner returns; the others are always 1).
   elem_bytes is the size of one element (4 for float); p NULL means NONE.
   A rank-0 variable (rank 0, shape unused) is never cut, as in TF.
   Errors (recorded on ctx, which may be NULL): DSGD_ERR_INVALID_ARGUMENT
   (out NULL; rank < 0 or > 8, shape NULL with rank > 0, an axis <= 0,
   elem_bytes 0, an unknown kind, a field the kind reads out of range, a size
   that overflows size_t).
   Thread safety: any thread. */
DSGD_API dsgd_result dsgd_partitioner_num_shards(dsgd_ctx *ctx, const dsgd_partitioner *p, int rank,
                                                 const int *shape, size_t elem_bytes, int *out);

/* One shard: rows [row_begin, row_begin + rows) of variable `variable`,
   which are floats [offset, offset + count) of the flat buffer. */
typedef struct dsgd_shard {
    int variable;   /* index into the variables the map was built from */
    int part;       /* the variable's shard number, 0..its shards - 1 */
    int server;     /* 0..num_servers - 1 */
    int row_begin;  /* along the first axis */
    int rows;
    size_t offset;  /* in floats, from the start of the flat buffer */
    size_t count;   /* floats */
} dsgd_shard;

typedef struct dsgd_shard_map dsgd_shard_map;

/* Builds the map of vars[0..num_vars) (a model's variables, from
   dsgd_model_variable, or any views of one flat float buffer) over
   num_servers servers with partitioner p (NULL: whole variables).
   The variables must be rank 1 or 2 with every axis > 0, count equal to the
   product of the shape, and must not overlap. They need not cover the whole
   buffer; what they leave out belongs to no server.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out NULL, vars NULL
   with num_vars > 0, num_vars < 0, num_servers < 1, a variable as above
   (the message names it), the partitioner (as dsgd_partitioner_num_shards)),
   DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: ctx's thread; the map is then read-only and may be read
   from any thread. */
DSGD_API dsgd_result dsgd_shard_map_create(dsgd_ctx *ctx, const dsgd_variable *vars, int num_vars,
                                           int num_servers, const dsgd_partitioner *p,
                                           dsgd_shard_map **out);
/* Frees the map; m NULL: nothing.
   Errors: none. Thread safety: the thread that owns m, once no one reads it. */
DSGD_API void dsgd_shard_map_destroy(dsgd_shard_map *m);

/* Getters. With m NULL (or i out of range) they return 0 or NULL.
     dsgd_shard_map_num_shards   every variable's shards, in placement order
     dsgd_shard_map_shard        the i-th shard in that order
     dsgd_shard_map_num_servers  as created
     dsgd_shard_map_server_floats
                                 floats server s holds (the sum of its shards'
                                 counts; its optimizer slots hold as many each)
     dsgd_shard_map_variable_shards
                                 the first shard of variable v (its shards are
                                 consecutive in the list) and, in *count, how
                                 many it has
   Errors: none. Thread safety: any thread while m lives. */
DSGD_API int dsgd_shard_map_num_shards(const dsgd_shard_map *m);
DSGD_API const dsgd_shard *dsgd_shard_map_shard(const dsgd_shard_map *m, int i);
DSGD_API int dsgd_shard_map_num_servers(const dsgd_shard_map *m);
DSGD_API size_t dsgd_shard_map_server_floats(const dsgd_shard_map *m, int s);
DSGD_API const dsgd_shard *dsgd_shard_map_variable_shards(const dsgd_shard_map *m, int v, int *count);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_SHARDING_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_SHARDING_IMPL)
#define DSGD__PART_SHARDING_IMPL

struct dsgd_shard_map {
    int num_shards, num_servers, num_vars;
    dsgd_shard *shards;
    int *var_first;        /* [num_vars + 1]: variable v's shards are [var_first[v], var_first[v + 1]) */
    size_t *server_floats; /* [num_servers] */
};

#define DSGD__MAX_PARTITION_RANK 8

DSGD_API const char *dsgd_partitioner_kind_name(dsgd_partitioner_kind kind) {
    static const char *const names[DSGD_PARTITIONER_COUNT] = {"NONE", "FIXED_SHARDS", "MIN_SIZE", "MAX_SIZE"};
    return (int)kind >= 0 && (int)kind < (int)DSGD_PARTITIONER_COUNT ? names[kind] : "?";
}

/* Bytes of one row (the product of the axes after the first, times
   elem_bytes); 0 on overflow. */
static size_t dsgd__row_bytes(int rank, const int *shape, size_t elem_bytes) {
    size_t b = elem_bytes;
    int i;
    for (i = 1; i < rank; i++)
        if (dsgd__mul_overflows(b, (size_t)shape[i], &b)) return 0;
    return b;
}

static dsgd_result dsgd__partitioner_check(dsgd_ctx *ctx, const dsgd_partitioner *p) {
    static const char *const fn = "dsgd_partitioner_num_shards";
    switch (p->kind) {
    case DSGD_PARTITIONER_NONE: return DSGD_OK;
    case DSGD_PARTITIONER_FIXED_SHARDS:
        if (p->num_shards < 1)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: FIXED_SHARDS needs num_shards >= 1, not %d",
                                      fn, p->num_shards);
        return DSGD_OK;
    case DSGD_PARTITIONER_MIN_SIZE:
    case DSGD_PARTITIONER_MAX_SIZE:
        if (p->max_shards < 0)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %s needs max_shards >= 0, not %d", fn,
                                      dsgd_partitioner_kind_name(p->kind), p->max_shards);
        if (p->kind == DSGD_PARTITIONER_MAX_SIZE && p->max_shard_bytes == 0)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: MAX_SIZE needs max_shard_bytes >= 1", fn);
        return DSGD_OK;
    }
    return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: unknown partitioner kind %d", fn, (int)p->kind);
}

/* The kinds' formulas (see SHARDING), in exact integer arithmetic; rows >= 1,
   row_bytes >= 1, and rows * row_bytes does not overflow. */
static int dsgd__partition_rows(const dsgd_partitioner *p, int rows, size_t row_bytes) {
    size_t total = (size_t)rows * row_bytes, k, per_shard, min_bytes;
    switch (p->kind) {
    case DSGD_PARTITIONER_FIXED_SHARDS: return p->num_shards < rows ? p->num_shards : rows;
    case DSGD_PARTITIONER_MIN_SIZE:
        min_bytes = p->min_shard_bytes ? p->min_shard_bytes : DSGD_DEFAULT_MIN_SHARD_BYTES;
        k = total / min_bytes + (total % min_bytes != 0);
        if (k > (size_t)rows) k = (size_t)rows;
        if (k > (size_t)(p->max_shards ? p->max_shards : 1)) k = (size_t)(p->max_shards ? p->max_shards : 1);
        return k < 1 ? 1 : (int)k;
    case DSGD_PARTITIONER_MAX_SIZE:
        per_shard = p->max_shard_bytes / row_bytes;
        if (per_shard < 1) per_shard = 1;
        k = (size_t)rows / per_shard + ((size_t)rows % per_shard != 0);
        if (p->max_shards > 0 && k > (size_t)p->max_shards) k = (size_t)p->max_shards;
        return (int)k;
    default: return 1;
    }
}

DSGD_API dsgd_result dsgd_partitioner_num_shards(dsgd_ctx *ctx, const dsgd_partitioner *p, int rank,
                                                 const int *shape, size_t elem_bytes, int *out) {
    static const char *const fn = "dsgd_partitioner_num_shards";
    size_t row_bytes, total;
    dsgd_result r;
    int i;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = 0;
    if (rank < 0 || rank > DSGD__MAX_PARTITION_RANK || (rank > 0 && !shape) || elem_bytes == 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: need 0 <= rank <= %d, a shape when rank > 0 and elem_bytes > 0 (rank %d, "
                                  "elem_bytes %zu)", fn, DSGD__MAX_PARTITION_RANK, rank, elem_bytes);
    for (i = 0; i < rank; i++)
        if (shape[i] <= 0)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: axis %d is %d (must be > 0)", fn, i,
                                      shape[i]);
    if (p && (r = dsgd__partitioner_check(ctx, p)) != DSGD_OK) return r;
    if (rank == 0 || !p || p->kind == DSGD_PARTITIONER_NONE) {
        *out = 1;
        return DSGD_OK;
    }
    row_bytes = dsgd__row_bytes(rank, shape, elem_bytes);
    if (row_bytes == 0 || dsgd__mul_overflows(row_bytes, (size_t)shape[0], &total))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: the variable's size overflows size_t", fn);
    *out = dsgd__partition_rows(p, shape[0], row_bytes);
    return DSGD_OK;
}

/* A variable the map can shard: rank 1 or 2, axes > 0, count = their
   product, the range inside size_t; names it otherwise. */
static dsgd_result dsgd__shard_var_check(dsgd_ctx *ctx, const dsgd_variable *v, int i) {
    static const char *const fn = "dsgd_shard_map_create";
    size_t n = 1;
    int a;
    if (v->rank < 1 || v->rank > DSGD_MAX_RANK)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: variable %d (\"%.*s\") has rank %d (need 1..%d)",
                                  fn, i, DSGD_MAX_NAME, v->name, v->rank, DSGD_MAX_RANK);
    for (a = 0; a < v->rank; a++)
        if (v->shape[a] <= 0 || dsgd__mul_overflows(n, (size_t)v->shape[a], &n))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: variable %d (\"%.*s\") has axis %d = %d (must be > 0)", fn, i,
                                      DSGD_MAX_NAME, v->name, a, v->shape[a]);
    if (n != v->count || v->offset > SIZE_MAX - v->count)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: variable %d (\"%.*s\") has count %zu but its shape holds %zu", fn, i,
                                  DSGD_MAX_NAME, v->name, v->count, n);
    return DSGD_OK;
}

/* Variables must not share floats: sort their indices by offset (insertion
   sort; models have few variables) and compare neighbours. */
static dsgd_result dsgd__shard_vars_disjoint(dsgd_ctx *ctx, const dsgd_variable *vars, int n) {
    int *order, i, j;
    dsgd_result r = DSGD_OK;
    if (n < 2) return DSGD_OK;
    order = (int *)dsgd__alloc(ctx, (size_t)n * sizeof *order, "dsgd_shard_map_create");
    if (!order) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < n; i++) {
        int v = i;
        for (j = i; j > 0 && vars[order[j - 1]].offset > vars[v].offset; j--) order[j] = order[j - 1];
        order[j] = v;
    }
    for (i = 1; i < n && r == DSGD_OK; i++) {
        const dsgd_variable *a = &vars[order[i - 1]], *b = &vars[order[i]];
        if (a->offset + a->count > b->offset)
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                   "dsgd_shard_map_create: variables %d (\"%.*s\") and %d (\"%.*s\") overlap",
                                   order[i - 1], DSGD_MAX_NAME, a->name, order[i], DSGD_MAX_NAME, b->name);
    }
    DSGD_FREE(order);
    return r;
}

/* Cuts variable v into k shards (TF's div rule) placed round-robin from
   *next (the model-wide counter), appending them at m->shards + *at. */
static void dsgd__shard_cut(dsgd_shard_map *m, const dsgd_variable *v, int vi, int k, int *at, int *next) {
    int rows = v->shape[0], base = rows / k, extra = rows % k, row = 0, i;
    size_t row_floats = v->count / (size_t)rows;
    for (i = 0; i < k; i++) {
        dsgd_shard *s = &m->shards[(*at)++];
        s->variable = vi;
        s->part = i;
        s->server = (*next)++ % m->num_servers;
        s->row_begin = row;
        s->rows = base + (i < extra);
        s->offset = v->offset + (size_t)row * row_floats;
        s->count = (size_t)s->rows * row_floats;
        m->server_floats[s->server] += s->count;
        row += s->rows;
    }
}

DSGD_API dsgd_result dsgd_shard_map_create(dsgd_ctx *ctx, const dsgd_variable *vars, int num_vars,
                                           int num_servers, const dsgd_partitioner *p,
                                           dsgd_shard_map **out) {
    static const char *const fn = "dsgd_shard_map_create";
    dsgd_shard_map *m;
    dsgd_result r;
    int *parts, i, total = 0, at = 0, next = 0;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (num_vars < 0 || (num_vars > 0 && !vars) || num_servers < 1)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: need vars (%d of them, >= 0) and num_servers >= 1 (got %d)", fn, num_vars,
                                  num_servers);
    for (i = 0; i < num_vars; i++)
        if ((r = dsgd__shard_var_check(ctx, &vars[i], i)) != DSGD_OK) return r;
    if ((r = dsgd__shard_vars_disjoint(ctx, vars, num_vars)) != DSGD_OK) return r;
    parts = (int *)dsgd__alloc(ctx, ((size_t)num_vars + 1) * sizeof *parts, fn);
    if (!parts) return DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; i < num_vars; i++) {
        if ((r = dsgd_partitioner_num_shards(ctx, p, vars[i].rank, vars[i].shape, sizeof(float), &parts[i])) != DSGD_OK) {
            DSGD_FREE(parts);
            return r;
        }
        if (parts[i] > INT_MAX - total) {
            DSGD_FREE(parts);
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: more than %d shards", fn, INT_MAX);
        }
        total += parts[i];
    }
    m = (dsgd_shard_map *)dsgd__alloc(ctx, sizeof *m, fn);
    if (m) {
        memset(m, 0, sizeof *m);
        m->shards = (dsgd_shard *)dsgd__alloc(ctx, (size_t)total * sizeof *m->shards, fn);
        m->var_first = (int *)dsgd__alloc(ctx, ((size_t)num_vars + 1) * sizeof *m->var_first, fn);
        m->server_floats = (size_t *)dsgd__alloc(ctx, (size_t)num_servers * sizeof *m->server_floats, fn);
    }
    if (!m || !m->shards || !m->var_first || !m->server_floats) {
        dsgd_shard_map_destroy(m);
        DSGD_FREE(parts);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    m->num_shards = total;
    m->num_servers = num_servers;
    m->num_vars = num_vars;
    memset(m->server_floats, 0, (size_t)num_servers * sizeof *m->server_floats);
    for (i = 0; i < num_vars; i++) {
        m->var_first[i] = at;
        dsgd__shard_cut(m, &vars[i], i, parts[i], &at, &next);
    }
    m->var_first[num_vars] = at;
    DSGD_FREE(parts);
    *out = m;
    return DSGD_OK;
}

DSGD_API void dsgd_shard_map_destroy(dsgd_shard_map *m) {
    if (!m) return;
    DSGD_FREE(m->shards);
    DSGD_FREE(m->var_first);
    DSGD_FREE(m->server_floats);
    DSGD_FREE(m);
}

DSGD_API int dsgd_shard_map_num_shards(const dsgd_shard_map *m) { return m ? m->num_shards : 0; }

DSGD_API const dsgd_shard *dsgd_shard_map_shard(const dsgd_shard_map *m, int i) {
    return m && i >= 0 && i < m->num_shards ? &m->shards[i] : NULL;
}

DSGD_API int dsgd_shard_map_num_servers(const dsgd_shard_map *m) { return m ? m->num_servers : 0; }

DSGD_API size_t dsgd_shard_map_server_floats(const dsgd_shard_map *m, int s) {
    return m && s >= 0 && s < m->num_servers ? m->server_floats[s] : 0;
}

DSGD_API const dsgd_shard *dsgd_shard_map_variable_shards(const dsgd_shard_map *m, int v, int *count) {
    if (count) *count = 0;
    if (!m || v < 0 || v >= m->num_vars) return NULL;
    if (count) *count = m->var_first[v + 1] - m->var_first[v];
    return &m->shards[m->var_first[v]];
}

/* The shard map over P servers of the variables of a model built from md
   (on a CPU backend of ctx's, md.backend ignored), and the model's initial
   values in *init (allocated, num_params floats; the desc's seed gives
   every process and replica the same). What the parameter servers of a
   strategy or of the cluster coordinator start from. */
static dsgd_result dsgd__shard_map_for_model(dsgd_ctx *ctx, const dsgd_model_desc *md, int P,
                                             const dsgd_partitioner *part, float **init, size_t *num_params,
                                             dsgd_shard_map **out) {
    const char *what = "dsgd_shard_map for a model";
    dsgd_model_desc d = *md;
    dsgd_model *m = NULL;
    dsgd_variable *vars = NULL;
    dsgd_result r;
    int i, nv;
    *init = NULL;
    d.backend = NULL;
    if ((r = dsgd_model_create(ctx, &d, &m)) != DSGD_OK) return r;
    nv = dsgd_model_num_variables(m);
    *num_params = dsgd_model_num_params(m);
    vars = (dsgd_variable *)dsgd__alloc(ctx, sizeof(dsgd_variable) * (size_t)(nv ? nv : 1), what);
    *init = (float *)dsgd__alloc(ctx, sizeof(float) * (*num_params ? *num_params : 1), what);
    r = vars && *init ? DSGD_OK : DSGD_ERR_OUT_OF_MEMORY;
    for (i = 0; r == DSGD_OK && i < nv; ++i) vars[i] = *dsgd_model_variable(m, i);
    if (r == DSGD_OK) r = dsgd_model_get_params(m, *init, *num_params);
    if (r == DSGD_OK) r = dsgd_shard_map_create(ctx, vars, nv, P, part, out);
    DSGD_FREE(vars);
    dsgd_model_destroy(m);
    return r;
}

#endif /* DSGD__PART_SHARDING_IMPL */
