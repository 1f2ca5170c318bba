/* distsgd/ps_checkpoint.h - the parameter servers' checkpoint format: each rank's file, its sections and their checks
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   CHECKPOINTS

     Each rank saves its own file (the format of checkpoint.h), at a point
     where nothing is in flight: a server before dsgd_ps_server_serve or
     after it returned DSGD_OK (every worker finished), a worker before its
     first pull or after dsgd_ps_worker_finish; never after a failure
     (DSGD_ERR_STATE). A server's file holds its identity (index, P, W,
     policy, apply, staleness, backup workers, optimizer kind, histogram
     bins, its floats) and the whole shard map's layout; its version,
     counters and staleness histogram; each worker's exactly-once table (next
     push seq and last push status, next pull seq, and ON_WORKERS the means
     it fetched); the gradients accepted for clocks not yet applied (a BACKUP
     step that lacked gradients at the end); ON_SERVERS its parameters and
     the optimizer's slots (the step is the version); ON_WORKERS the means
     some worker has not fetched (a save is DSGD_ERR_STATE when a worker
     finished without a mean the others fetched after it, which is then
     gone: dsgd_ps_worker_finish fetches every mean of the clocks it pushed,
     so this needs BACKUP workers that stop on something else than the
     global step). A worker's holds
     its identity, the map, its push and pull seqs, the version read from
     each server, the step it last pushed for, its counters, and, ON_WORKERS,
     its copy of the parameters and the slots. Restore into a rank created
     anew with the same desc (timeout_s and retry_s may differ; of the
     optimizer only the kind is checked, as in checkpoint.h) and map, before
     it serves or pulls; on a new transport, every rank restored from the
     same save, the run goes on bit for bit: each server expects every worker
     again (none has finished) and continues its sequence numbers where the
     workers do. A restore checks the whole file first and touches nothing on
     an error: DSGD_ERR_FORMAT for a damaged file, DSGD_ERR_SHAPE for a
     checkpoint of something else (the other role, another rank, desc or map:
     the message names it).

     This part holds the format: the sections, their records and the
     checks a restore runs before it touches anything. The server's and the
     worker's save and restore (ps_server.h, ps_worker.h) write and apply
     them.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_PS_CHECKPOINT_IMPL)
#define DSGD__PART_PS_CHECKPOINT_IMPL

/* >>ps checkpoints --------------------------------------------------------- */
/* The sections of a rank's checkpoint (see CHECKPOINTS above):
     "ps_server"  identity, floats, version, counters, staleness histogram
     "ps_peers"   per worker: next push seq, last push status, next pull
                  seq, the pending pull's minimum version and first step,
                  the means it fetched (ON_WORKERS)
     "ps_clocks"  the gradients accepted for clocks not yet applied
     "params", "optimizer"  ON_SERVERS: the server's floats and slots, in
                  the layout of checkpoint.h (its step is the version)
     "ps_worker"  identity, seqs, flags, counters, per server its floats,
                  version, last step, dropped flag, announced version
     "ps_copy"    ON_WORKERS: the worker's copy and slots, each the servers'
                  ranges in server order
     "ps_map"     (both) the shard map's layout */

#define DSGD__PS_CK_SHARD 36  /* bytes of a "ps_map" record */
#define DSGD__PS_CK_PEER 48   /* of a "ps_peers" record */
#define DSGD__PS_CK_SERVER 36 /* of a "ps_worker" per-server record */

/* The size hint of an image of `copies` x n floats (0 on overflow: the
   writer then grows). */
static size_t dsgd__ps_ck_expect(size_t n, size_t copies) {
    size_t floats;
    if (dsgd__mul_overflows(n, copies, &floats) || floats > (SIZE_MAX - 65536) / sizeof(float)) return 0;
    return 65536 + floats * sizeof(float);
}

/* What a rank's checkpoint must share with the rank restoring it: its
   index among its role, the desc's shape and the optimizer's kind. */
typedef struct dsgd__ps_ident {
    uint32_t index, P, W, policy, apply, staleness, backup, opt;
} dsgd__ps_ident;

static dsgd__ps_ident dsgd__ps_ident_of(const dsgd_ps_desc *d, int index) {
    dsgd__ps_ident id;
    id.index = (uint32_t)index;
    id.P = (uint32_t)d->num_servers;
    id.W = (uint32_t)d->num_workers;
    id.policy = (uint32_t)d->policy;
    id.apply = (uint32_t)d->apply;
    id.staleness = (uint32_t)d->staleness;
    id.backup = (uint32_t)d->backup_workers;
    id.opt = (uint32_t)d->optimizer.kind;
    return id;
}

static void dsgd__ps_put_ident(dsgd__ck_writer *w, const dsgd__ps_ident *id) {
    dsgd__ckw_u32(w, id->index);
    dsgd__ckw_u32(w, id->P);
    dsgd__ckw_u32(w, id->W);
    dsgd__ckw_u32(w, id->policy);
    dsgd__ckw_u32(w, id->apply);
    dsgd__ckw_u32(w, id->staleness);
    dsgd__ckw_u32(w, id->backup);
    dsgd__ckw_u32(w, id->opt);
}

static void dsgd__ps_get_ident(dsgd__ck_cur *c, dsgd__ps_ident *id) {
    id->index = dsgd__ckr_u32(c);
    id->P = dsgd__ckr_u32(c);
    id->W = dsgd__ckr_u32(c);
    id->policy = dsgd__ckr_u32(c);
    id->apply = dsgd__ckr_u32(c);
    id->staleness = dsgd__ckr_u32(c);
    id->backup = dsgd__ckr_u32(c);
    id->opt = dsgd__ckr_u32(c);
}

/* DSGD_ERR_SHAPE unless the saved identity is this rank's; role is
   "server" or "worker". */
static dsgd_result dsgd__ps_check_ident(const dsgd__ck_file *f, const char *role, const dsgd__ps_ident *got,
                                        const dsgd__ps_ident *want) {
    dsgd__ps_ident same = *got;
    same.index = want->index;
    if (memcmp(&same, want, sizeof same) != 0)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: a checkpoint of another run: %u servers, %u workers, %s (staleness %u, backup "
                                  "workers %u), apply %s, %s in the checkpoint; %u, %u, %s (%u, %u), %s, %s here",
                                  f->what,
                                  f->path, (unsigned)got->P, (unsigned)got->W,
                                  dsgd_ps_policy_name((dsgd_ps_policy)got->policy), (unsigned)got->staleness,
                                  (unsigned)got->backup, dsgd_ps_apply_name((dsgd_ps_apply)got->apply), dsgd__opt_kind_text(got->opt),
                                  (unsigned)want->P, (unsigned)want->W,
                                  dsgd_ps_policy_name((dsgd_ps_policy)want->policy), (unsigned)want->staleness,
                                  (unsigned)want->backup, dsgd_ps_apply_name((dsgd_ps_apply)want->apply),
                                  dsgd__opt_kind_text(want->opt));
    if (got->index != want->index)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE, "%s: %s: the checkpoint of %s %u, not of %s %u", f->what,
                                  f->path, role, (unsigned)got->index, role, (unsigned)want->index);
    return DSGD_OK;
}

/* The rank's own section ("ps_server" or "ps_worker"), or NULL after
   DSGD_ERR_SHAPE naming what the file holds instead. */
static const dsgd__ck_section *dsgd__ps_ck_role(const dsgd__ck_file *f, int server) {
    const char *name = server ? "ps_server" : "ps_worker", *role = server ? "server" : "worker";
    const char *other = server ? "worker" : "server";
    const dsgd__ck_section *sec = dsgd__ck_find(f, name), *alt = dsgd__ck_find(f, server ? "ps_worker" : "ps_server");
    if (sec) return sec;
    if (alt) {
        dsgd__ck_cur c = dsgd__ck_cursor(alt);
        uint32_t index = dsgd__ckr_u32(&c);
        dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                           "%s: %s: a checkpoint of %s %u of a parameter-server run, not of a %s", f->what, f->path,
                           other, (unsigned)index, role);
    } else if (dsgd__ck_find(f, "model")) {
        dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE, "%s: %s: a model's or strategy's checkpoint, not a parameter %s's",
                           f->what, f->path, role);
    } else {
        dsgd__ck_need(f, name, server ? "a parameter server" : "a parameter-server worker");
    }
    return NULL;
}

/* "ps_map": the layout of every shard (every rank holds the same map). */
static void dsgd__ps_put_map(dsgd__ck_writer *w, const dsgd_shard_map *map) {
    int i, ns = dsgd_shard_map_num_shards(map);
    dsgd__ckw_begin(w, "ps_map");
    dsgd__ckw_u32(w, (uint32_t)dsgd_shard_map_num_servers(map));
    dsgd__ckw_u32(w, (uint32_t)ns);
    for (i = 0; i < ns; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(map, i);
        dsgd__ckw_u32(w, (uint32_t)sh->variable);
        dsgd__ckw_u32(w, (uint32_t)sh->part);
        dsgd__ckw_u32(w, (uint32_t)sh->server);
        dsgd__ckw_u32(w, (uint32_t)sh->row_begin);
        dsgd__ckw_u32(w, (uint32_t)sh->rows);
        dsgd__ckw_u64(w, (uint64_t)sh->offset);
        dsgd__ckw_u64(w, (uint64_t)sh->count);
    }
    dsgd__ckw_end(w);
}

static dsgd_result dsgd__ps_check_map(const dsgd__ck_file *f, const dsgd_shard_map *map) {
    const dsgd__ck_section *sec = dsgd__ck_need(f, "ps_map", "the shard map");
    int ns = dsgd_shard_map_num_shards(map), np = dsgd_shard_map_num_servers(map);
    uint32_t servers, shards, i;
    dsgd__ck_cur c;
    if (!sec) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    servers = dsgd__ckr_u32(&c);
    shards = dsgd__ckr_u32(&c);
    if (c.bad || c.left % DSGD__PS_CK_SHARD != 0 || c.left / DSGD__PS_CK_SHARD != shards)
        return dsgd__ck_bad_section(f, sec, "not one 36-byte record per shard");
    for (i = 0; i < shards && (int)i < ns; ++i) {
        const dsgd_shard *sh = dsgd_shard_map_shard(map, (int)i);
        uint32_t var = dsgd__ckr_u32(&c), part = dsgd__ckr_u32(&c), server = dsgd__ckr_u32(&c);
        uint32_t row0 = dsgd__ckr_u32(&c), rows = dsgd__ckr_u32(&c);
        uint64_t off = dsgd__ckr_u64(&c), count = dsgd__ckr_u64(&c);
        if (var != (uint32_t)sh->variable || part != (uint32_t)sh->part || server != (uint32_t)sh->server ||
            row0 != (uint32_t)sh->row_begin || rows != (uint32_t)sh->rows || off != (uint64_t)sh->offset ||
            count != (uint64_t)sh->count)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: another shard map: shard %u is part %u of variable %u (%u rows from row "
                                      "%u, %llu floats at %llu) on server %u in the checkpoint, part %d of variable %d "
                                      "(%d rows from row %d, %zu floats at %zu) on server %d in this map", f->what,
                                      f->path, (unsigned)i, (unsigned)part, (unsigned)var, (unsigned)rows,
                                      (unsigned)row0, (unsigned long long)count, (unsigned long long)off,
                                      (unsigned)server, sh->part, sh->variable, sh->rows, sh->row_begin, sh->count,
                                      sh->offset, sh->server);
    }
    if (servers != (uint32_t)np || shards != (uint32_t)ns)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: another shard map: %u shards over %u servers in the checkpoint, %d over %d "
                                  "in this map", f->what, f->path, (unsigned)shards, (unsigned)servers, ns, np);
    return DSGD_OK;
}

/* What a server's checkpoint must match: the server's desc (defaults
   filled), index and map, its floats, its clock slots (ring x W, 0 when
   not clocked), its optimizer slots, and whether it holds parameters. */
typedef struct dsgd__ps_server_shape {
    const dsgd_ps_desc *d;
    const dsgd_shard_map *map;
    int index, ring, W, nslots, holds;
    size_t n, cells;
} dsgd__ps_server_shape;

/* A server's checkpoint, checked and located in the image. */
typedef struct dsgd__ps_ck_server {
    int64_t version, cnt[8]; /* received, applied, duplicates, dropped, pulls, deferred, repeated, stal_max */
    double stal_sum;
    const unsigned char *hist, *peers, *params, *slots, *means;
    const dsgd__ck_section *clocks;
    uint32_t held, nmeans;
    int64_t min_have; /* the fewest means a worker has fetched */
} dsgd__ps_ck_server;

/* Walks the records of "ps_clocks" (after its count): row, worker, version
   computed on, the gradient's floats. */
static int dsgd__ps_ck_clock(dsgd__ck_cur *c, size_t n, uint32_t *row, uint32_t *worker, int64_t *vcomp,
                             const unsigned char **floats) {
    *row = dsgd__ckr_u32(c);
    *worker = dsgd__ckr_u32(c);
    *vcomp = (int64_t)dsgd__ckr_u64(c);
    *floats = dsgd__ckr_floats(c, (uint64_t)n);
    return !c->bad;
}

/* The server's own section: its identity, histogram bins, map, floats,
   version, counters and staleness histogram. */
static dsgd_result dsgd__ps_check_server_head(const dsgd__ck_file *f, const dsgd__ps_server_shape *s,
                                              dsgd__ps_ck_server *st) {
    const dsgd__ck_section *sec = dsgd__ps_ck_role(f, 1);
    dsgd__ps_ident got, want = dsgd__ps_ident_of(s->d, s->index);
    uint64_t n, sum = 0;
    uint32_t bins, i;
    dsgd__ck_cur c;
    dsgd_result r;
    int k;
    if (!sec) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    dsgd__ps_get_ident(&c, &got);
    bins = dsgd__ckr_u32(&c);
    n = dsgd__ckr_u64(&c);
    st->version = (int64_t)dsgd__ckr_u64(&c);
    for (k = 0; k < 8; ++k) st->cnt[k] = (int64_t)dsgd__ckr_u64(&c);
    st->stal_sum = dsgd__ckr_f64(&c);
    if (c.bad || bins == 0 || bins > DSGD_PS_MAX_STALENESS_BINS || c.left != (size_t)bins * 8)
        return dsgd__ck_bad_section(f, sec, "cut short, or not a histogram of its bins");
    if ((r = dsgd__ps_check_ident(f, "server", &got, &want)) != DSGD_OK) return r;
    if (bins != (uint32_t)s->d->staleness_bins)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: the checkpoint's staleness histogram has %u bins, this server's %d", f->what,
                                  f->path, (unsigned)bins, s->d->staleness_bins);
    if ((r = dsgd__ps_check_map(f, s->map)) != DSGD_OK) return r;
    if (n != (uint64_t)s->n) return dsgd__ck_bad_section(f, sec, "not the floats its shard map places on the server");
    if (st->version < 0 || !(st->stal_sum >= 0.0))
        return dsgd__ck_bad_section(f, sec, "a negative version or staleness sum");
    for (k = 0; k < 8; ++k)
        if (st->cnt[k] < 0) return dsgd__ck_bad_section(f, sec, "a negative counter");
    st->hist = c.p;
    for (i = 0; i < bins; ++i) {
        uint64_t h = dsgd__ckr_u64(&c);
        if (h > (uint64_t)st->cnt[1] - sum) break;
        sum += h;
    }
    if (i < bins || sum != (uint64_t)st->cnt[1])
        return dsgd__ck_bad_section(f, sec, "a staleness histogram that does not sum to the applied pushes");
    return DSGD_OK;
}

/* "ps_peers": the workers' exactly-once tables; notes the fewest means a
   worker has fetched. */
static dsgd_result dsgd__ps_check_server_peers(const dsgd__ck_file *f, const dsgd__ps_server_shape *s,
                                               dsgd__ps_ck_server *st) {
    const dsgd__ck_section *sec;
    uint32_t nw, i;
    dsgd__ck_cur c;
    if (!(sec = dsgd__ck_need(f, "ps_peers", "the workers' sequence tables"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    nw = dsgd__ckr_u32(&c);
    if (c.bad || nw != (uint32_t)s->W || c.left != (size_t)nw * DSGD__PS_CK_PEER)
        return dsgd__ck_bad_section(f, sec, "not one 48-byte record per worker");
    st->peers = c.p;
    st->min_have = st->version;
    for (i = 0; i < nw; ++i) {
        uint64_t next = dsgd__ckr_u64(&c), status = dsgd__ckr_u64(&c), pull_next = dsgd__ckr_u64(&c);
        int64_t have;
        (void)dsgd__ckr_u64(&c); /* pull_min, pull_from: any */
        (void)dsgd__ckr_u64(&c);
        have = (int64_t)dsgd__ckr_u64(&c);
        if (next > DSGD_PS_SEQ_MASK || pull_next > DSGD_PS_SEQ_MASK || status > DSGD_PS_DROPPED || have < 0 ||
            have > st->version)
            return dsgd__ck_bad_section(f, sec, "a sequence number, status or fetched count out of range");
        if (have < st->min_have) st->min_have = have;
    }
    return DSGD_OK;
}

/* "ps_clocks": the gradients of clocks not yet applied, in slot order. */
static dsgd_result dsgd__ps_check_server_clocks(const dsgd__ck_file *f, const dsgd__ps_server_shape *s,
                                                dsgd__ps_ck_server *st) {
    const dsgd__ck_section *sec;
    size_t cells = s->cells, rec;
    uint32_t i;
    int64_t prev = -1;
    dsgd__ck_cur c;
    if (!(sec = dsgd__ck_need(f, "ps_clocks", "the gradients of clocks not yet applied"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    st->held = dsgd__ckr_u32(&c);
    rec = 16 + s->n * sizeof(float);
    if (c.bad || st->held > cells || (st->held ? c.left % st->held != 0 || c.left / st->held != rec : c.left != 0))
        return dsgd__ck_bad_section(f, sec, "not a record of the server's floats per held gradient");
    st->clocks = sec;
    for (i = 0; i < st->held; ++i) {
        uint32_t row, worker;
        int64_t vcomp;
        const unsigned char *g;
        if (!dsgd__ps_ck_clock(&c, s->n, &row, &worker, &vcomp, &g) || row >= (uint32_t)s->ring ||
            worker >= (uint32_t)s->W || (int64_t)row * s->W + worker <= prev)
            return dsgd__ck_bad_section(f, sec, "a clock record out of range or out of order");
        prev = (int64_t)row * s->W + worker;
    }
    return DSGD_OK;
}

/* ON_WORKERS, "ps_means": the means kept: the last steps, every one a
   worker has not fetched. */
static dsgd_result dsgd__ps_check_server_means(const dsgd__ck_file *f, const dsgd__ps_server_shape *s,
                                               dsgd__ps_ck_server *st) {
    const dsgd__ck_section *sec;
    size_t rec;
    uint32_t i;
    dsgd__ck_cur c;
    if (!(sec = dsgd__ck_need(f, "ps_means", "the means the workers have not fetched"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    st->nmeans = dsgd__ckr_u32(&c);
    rec = 8 + s->n * sizeof(float);
    if (c.bad || (int64_t)st->nmeans > st->version || c.left % rec != 0 || c.left / rec != st->nmeans)
        return dsgd__ck_bad_section(f, sec, "not a record of the server's floats per kept mean");
    st->means = c.p;
    for (i = 0; i < st->nmeans; ++i) {
        if (dsgd__ckr_u64(&c) != (uint64_t)(st->version - st->nmeans + i))
            return dsgd__ck_bad_section(f, sec, "means not of the last steps, in order");
        (void)dsgd__ckr_floats(&c, (uint64_t)s->n);
    }
    if (st->min_have < st->version - (int64_t)st->nmeans)
        return dsgd__ck_bad_section(f, sec, "a worker lacks a mean the server does not keep");
    return DSGD_OK;
}

/* ON_SERVERS, "params" and "optimizer": the parameters and the optimizer's
   slots. */
static dsgd_result dsgd__ps_check_server_params(const dsgd__ck_file *f, const dsgd__ps_server_shape *s,
                                                dsgd__ps_ck_server *st) {
    const dsgd__ck_section *sec;
    dsgd__ck_cur c;
    if (!(sec = dsgd__ck_need(f, "params", "the server's parameters"))) return DSGD_ERR_SHAPE;
    if (sec->size != s->n * sizeof(float)) return dsgd__ck_bad_section(f, sec, "not the server's float count");
    st->params = sec->data;
    if (!(sec = dsgd__ck_need(f, "optimizer", "the optimizer's slots"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    {
        uint32_t kind = dsgd__ckr_u32(&c), nslots;
        uint64_t t = dsgd__ckr_u64(&c), np;
        (void)dsgd__ckr_f64(&c); /* last norm: the servers keep none */
        nslots = dsgd__ckr_u32(&c);
        np = dsgd__ckr_u64(&c);
        if (c.bad || kind != (uint32_t)s->d->optimizer.kind || t != (uint64_t)st->version ||
            nslots != (uint32_t)s->nslots || np != (uint64_t)s->n ||
            c.left != (size_t)nslots * s->n * sizeof(float))
            return dsgd__ck_bad_section(f, sec, "not the server's optimizer kind, step (its version) or slots");
    }
    st->slots = c.p;
    return DSGD_OK;
}

/* A server's checkpoint, section by section; ON_WORKERS keeps means where
   ON_SERVERS keeps the parameters and the optimizer's slots. */
static dsgd_result dsgd__ps_check_server(const dsgd__ck_file *f, const dsgd__ps_server_shape *s, dsgd__ps_ck_server *st) {
    dsgd_result r;
    if ((r = dsgd__ps_check_server_head(f, s, st)) != DSGD_OK) return r;
    if ((r = dsgd__ps_check_server_peers(f, s, st)) != DSGD_OK) return r;
    if ((r = dsgd__ps_check_server_clocks(f, s, st)) != DSGD_OK) return r;
    if (!s->holds) return dsgd__ps_check_server_means(f, s, st);
    return dsgd__ps_check_server_params(f, s, st);
}

/* What a worker's checkpoint must match: the worker's desc (defaults
   filled), index and map, each server's floats (n[P]) and their sum, and
   summation only (holds 0) its copy's optimizer slots. */
typedef struct dsgd__ps_worker_shape {
    const dsgd_ps_desc *d;
    const dsgd_shard_map *map;
    int index, P, nslots, holds;
    const size_t *n;
    size_t floats;
} dsgd__ps_worker_shape;

/* A worker's checkpoint, checked and located in the image. */
typedef struct dsgd__ps_ck_worker {
    uint32_t pulled, params_set;
    uint64_t push_seq, pull_seq;
    int64_t cnt[5]; /* pulls, push_resends, pull_resends, pushes_dropped, stale */
    const unsigned char *servers, *copy;
} dsgd__ps_ck_worker;

static dsgd_result dsgd__ps_check_worker(const dsgd__ck_file *f, const dsgd__ps_worker_shape *w, dsgd__ps_ck_worker *st) {
    const dsgd__ck_section *sec = dsgd__ps_ck_role(f, 0);
    dsgd__ps_ident got, want = dsgd__ps_ident_of(w->d, w->index);
    uint32_t finished, nP, s;
    dsgd__ck_cur c;
    dsgd_result r;
    int k;
    if (!sec) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    dsgd__ps_get_ident(&c, &got);
    finished = dsgd__ckr_u32(&c);
    st->pulled = dsgd__ckr_u32(&c);
    st->params_set = dsgd__ckr_u32(&c);
    st->push_seq = dsgd__ckr_u64(&c);
    st->pull_seq = dsgd__ckr_u64(&c);
    for (k = 0; k < 5; ++k) st->cnt[k] = (int64_t)dsgd__ckr_u64(&c);
    nP = dsgd__ckr_u32(&c);
    if (c.bad || c.left % DSGD__PS_CK_SERVER != 0 || c.left / DSGD__PS_CK_SERVER != nP || nP != got.P)
        return dsgd__ck_bad_section(f, sec, "cut short, or not one 36-byte record per server");
    if ((r = dsgd__ps_check_ident(f, "worker", &got, &want)) != DSGD_OK) return r;
    if ((r = dsgd__ps_check_map(f, w->map)) != DSGD_OK) return r;
    if (finished > 1 || st->pulled > 1 || st->params_set > 1 || st->push_seq > DSGD_PS_SEQ_MASK ||
        st->pull_seq > DSGD_PS_SEQ_MASK)
        return dsgd__ck_bad_section(f, sec, "a flag or sequence number out of range");
    for (k = 0; k < 5; ++k)
        if (st->cnt[k] < 0) return dsgd__ck_bad_section(f, sec, "a negative counter");
    st->servers = c.p;
    for (s = 0; s < nP; ++s) {
        uint64_t n = dsgd__ckr_u64(&c);
        int64_t version = (int64_t)dsgd__ckr_u64(&c), last = (int64_t)dsgd__ckr_u64(&c);
        uint32_t dropped = dsgd__ckr_u32(&c);
        int64_t latest = (int64_t)dsgd__ckr_u64(&c);
        if (n != (uint64_t)w->n[s])
            return dsgd__ck_bad_section(f, sec, "not the floats its shard map places on the servers");
        if (version < 0 || last < -1 || dropped > 1 || latest < 0)
            return dsgd__ck_bad_section(f, sec, "a version, step or flag out of range");
    }
    if (w->holds) return DSGD_OK;
    /* ON_WORKERS: the worker's copy and slots */
    if (!(sec = dsgd__ck_need(f, "ps_copy", "the worker's copy of the parameters"))) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(sec);
    {
        uint32_t nslots = dsgd__ckr_u32(&c);
        uint64_t total = dsgd__ckr_u64(&c);
        size_t floats = w->floats;
        if (c.bad || nslots != (uint32_t)w->nslots || total != (uint64_t)floats ||
            c.left / sizeof(float) / (1 + nslots) != floats || c.left != (1 + nslots) * floats * sizeof(float))
            return dsgd__ck_bad_section(f, sec, "not the worker's floats and optimizer slots");
    }
    st->copy = c.p;
    return DSGD_OK;
}

#endif /* DSGD__PART_PS_CHECKPOINT_IMPL */
