/* fuzz/fuzz_checkpoint.c - libFuzzer target: the checkpoint reader (what
   dsgd_model_restore and dsgd_strategy_restore run on a file's bytes) on
   any bytes, from memory. Each input is read twice: as it is, and with its
   checksums recomputed wherever its sizes reach (so that mutations get past
   the CRC32C checks to the parsers behind them). Each reading goes into a
   model (3 -> 4 tanh -> 2, Adam, a sampler, 8 user bytes) and into a
   one-replica mirrored strategy of that model with one distributed
   variable; and through the parameter-server readers' checks (a server and
   a worker of one SYNC group: 1 server, 1 worker, Adam). Allowed: DSGD_OK,
   DSGD_ERR_FORMAT (a damaged file) and DSGD_ERR_SHAPE (a checkpoint of
   something else); after the two errors the model, optimizer, sampler and
   user bytes must be untouched. Seeds: fuzz/corpus/checkpoint (a model's,
   a strategy's, a server's and a worker's checkpoint). Run: make fuzz
   (FUZZ_SECONDS=N). */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <string.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const dsgd_layer_desc fz_layers[2] = {{4, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

typedef struct fz_target {
    dsgd_ctx *ctx;
    dsgd_model *m;
    dsgd_optimizer *opt;
    dsgd_strategy *s;
    dsgd_sampler smp;
    unsigned char user[8];
    dsgd_checkpoint_extra extra;
    dsgd_loopback *hub;
    dsgd_transport_i ts, tw;
    dsgd_shard_map *map;
    dsgd_ps_server *server;
    dsgd_ps_worker *worker;
} fz_target;

/* One server (rank 0) and one worker (rank 1) of a SYNC group over the
   model's variables. */
static void fz_ps_make(fz_target *t, const dsgd_optimizer_desc *od) {
    dsgd_variable vars[4];
    dsgd_ps_desc pd;
    float init[32] = {0};
    int i;
    memset(&pd, 0, sizeof(pd));
    for (i = 0; i < 4; ++i) vars[i] = *dsgd_model_variable(t->m, i);
    pd.num_servers = 1;
    pd.num_workers = 1;
    pd.policy = DSGD_PS_SYNC;
    pd.optimizer = *od;
    if (dsgd_loopback_create(t->ctx, 2, &t->hub) != DSGD_OK || dsgd_loopback_endpoint(t->hub, 0, &t->ts) != DSGD_OK ||
        dsgd_loopback_endpoint(t->hub, 1, &t->tw) != DSGD_OK ||
        dsgd_shard_map_create(t->ctx, vars, 4, 1, NULL, &t->map) != DSGD_OK ||
        dsgd_ps_server_create(t->ctx, &t->ts, &pd, t->map, init, &t->server) != DSGD_OK ||
        dsgd_ps_worker_create(t->ctx, &t->tw, &pd, t->map, &t->worker) != DSGD_OK)
        fuzz_fail(t->ctx, DSGD_ERR_STATE, "cannot make the parameter servers");
}

/* Made once and kept (reachable, so not a leak). */
static fz_target *fz_get(void) {
    static fz_target t;
    static int made = 0;
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_strategy_desc sd;
    dsgd_dvar_desc vd;
    int id;
    if (made) return &t;
    memset(&md, 0, sizeof(md));
    memset(&od, 0, sizeof(od));
    memset(&sd, 0, sizeof(sd));
    memset(&vd, 0, sizeof(vd));
    md.input_dim = 3;
    md.layers = fz_layers;
    md.num_layers = 2;
    md.max_batch = 8;
    md.seed = 1;
    od.kind = DSGD_OPT_ADAM;
    t.ctx = fuzz_ctx();
    if (dsgd_model_create(t.ctx, &md, &t.m) != DSGD_OK || dsgd_optimizer_create(t.m, &od, &t.opt) != DSGD_OK ||
        dsgd_sampler_init(t.ctx, &t.smp, 50, 8, 3, 1, 0) != DSGD_OK)
        fuzz_fail(t.ctx, DSGD_ERR_STATE, "cannot make the model");
    sd.kind = DSGD_STRATEGY_MIRRORED;
    sd.num_replicas = 1;
    sd.model = md;
    sd.optimizer = od;
    sd.cpu_threads = 1;
    vd.name = "v";
    vd.count = 3;
    vd.synchronization = DSGD_SYNC_ON_READ;
    vd.aggregation = DSGD_AGG_SUM;
    if (dsgd_strategy_create(t.ctx, &sd, &t.s) != DSGD_OK || dsgd_strategy_create_variable(t.s, &vd, &id) != DSGD_OK)
        fuzz_fail(t.ctx, DSGD_ERR_STATE, "cannot make the strategy");
    t.extra.sampler = &t.smp;
    t.extra.user = t.user;
    t.extra.user_bytes = sizeof(t.user);
    fz_ps_make(&t, &od);
    made = 1;
    return &t;
}

/* What a failed restore must leave as it was. */
typedef struct fz_state {
    float v[3 * 32 + 2];
    uint64_t epoch;
    size_t cursor;
    unsigned char user[8];
} fz_state;

static void fz_snap(fz_target *t, dsgd_model *m, fz_state *out) {
    size_t p = dsgd_model_num_params(m);
    memset(out, 0, sizeof(*out));
    if (p > 32 || dsgd_model_get_params(m, out->v, p) != DSGD_OK) fuzz_fail(t->ctx, DSGD_OK, "cannot read the model");
    if (m == t->m) {
        dsgd_optimizer_read_slot(t->opt, 0, 0, p, out->v + p);
        dsgd_optimizer_read_slot(t->opt, 1, 0, p, out->v + 2 * p);
        out->v[3 * p] = (float)dsgd_optimizer_steps(t->opt);
    }
    out->epoch = t->smp.epoch;
    out->cursor = t->smp.cursor;
    memcpy(out->user, t->user, sizeof(out->user));
}

static void fz_restore(fz_target *t, const uint8_t *img, size_t size, int strategy) {
    dsgd__ck_file f;
    fz_state before, after;
    dsgd_model *m = strategy ? dsgd_strategy_model(t->s, 0) : t->m;
    dsgd_result r;
    fz_snap(t, m, &before);
    r = dsgd__ck_from_memory(&f, t->ctx, "fuzz", "input", img, size);
    if (r == DSGD_OK) r = strategy ? dsgd__strategy_restore_from(t->s, &f, DSGD_OK, &t->extra, "fuzz", "input")
                                   : dsgd__model_restore_from(&f, t->m, t->opt, &t->extra);
    if (r == DSGD_OK) return;
    if (r != DSGD_ERR_FORMAT && r != DSGD_ERR_SHAPE) fuzz_fail(t->ctx, r, "a result other than OK, FORMAT or SHAPE");
    fz_snap(t, m, &after);
    if (memcmp(&before, &after, sizeof(before)) != 0) fuzz_fail(t->ctx, r, "a rejected checkpoint changed the state");
}

/* Recomputes the header's and every reachable section's CRC32C in img. */
static void fz_fix_crcs(uint8_t *img, size_t size) {
    size_t at = 32;
    uint32_t i, n;
    if (size < 32) return;
    dsgd__ck_put32(img + 28, dsgd_crc32c(0, img, 28));
    n = dsgd__ck_get32(img + 12);
    for (i = 0; i < n && size - at >= 28; ++i) {
        uint64_t len = dsgd__ck_get64(img + at + 16);
        if (len > size - at - 28) return;
        dsgd__ck_put32(img + at + 24 + len, dsgd_crc32c(0, img + at, 24 + (size_t)len));
        at += 28 + (size_t)len;
    }
}

/* The servers' readers check without writing: only the result matters. */
static void fz_ps(fz_target *t, const uint8_t *img, size_t size) {
    dsgd__ck_file f;
    dsgd__ps_ck_server ss;
    dsgd__ps_ck_worker ws;
    dsgd__ps_server_shape sshape = dsgd__ps_server_shape_of(t->server);
    dsgd__ps_worker_shape wshape = dsgd__ps_worker_shape_of(t->worker);
    dsgd_result r = dsgd__ck_from_memory(&f, t->ctx, "fuzz", "input", img, size);
    if (r != DSGD_OK) return;
    memset(&ss, 0, sizeof(ss));
    memset(&ws, 0, sizeof(ws));
    r = dsgd__ps_check_server(&f, &sshape, &ss);
    if (r != DSGD_OK && r != DSGD_ERR_FORMAT && r != DSGD_ERR_SHAPE)
        fuzz_fail(t->ctx, r, "the server's reader: a result other than OK, FORMAT or SHAPE");
    r = dsgd__ps_check_worker(&f, &wshape, &ws);
    if (r != DSGD_OK && r != DSGD_ERR_FORMAT && r != DSGD_ERR_SHAPE)
        fuzz_fail(t->ctx, r, "the worker's reader: a result other than OK, FORMAT or SHAPE");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_target *t = fz_get();
    uint8_t *copy = (uint8_t *)malloc(size ? size : 1);
    if (!copy) abort();
    fz_restore(t, data, size, 0);
    fz_restore(t, data, size, 1);
    memcpy(copy, data, size);
    fz_fix_crcs(copy, size);
    fz_restore(t, copy, size, 0);
    fz_restore(t, copy, size, 1);
    fz_ps(t, data, size);
    fz_ps(t, copy, size);
    free(copy);
    return 0;
}
