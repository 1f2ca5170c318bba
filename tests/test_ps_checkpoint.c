/* test_ps_checkpoint.c - the parameter servers' checkpoints (dsgd_ps_server_save
   and _restore, dsgd_ps_worker_save and _restore, distsgd/ps.h).

   The run: P = 2 servers and W = 2 workers, ranks of one loopback hub, one
   pthread each, SYNC. The parameters are those of a 6 -> 16 tanh -> 4 MLP
   (180 floats in 4 variables, each cut in 2 shards over the servers); each
   worker computes a real gradient of them (dsgd_model_compute_gradients on
   its own model) on a batch of 8 random samples drawn from (worker, step).
   The optimizer has a warmup and a cosine schedule over the 200 steps, so
   a step count restored wrong moves the parameters.

   What is asserted, and how it is measured:
   - Resume: a child process runs 100 steps (40 under make test, with a
     schedule over 80; pull, gradient, push), the
     workers finish, and every rank saves its own file; this process creates
     a new hub, new servers and workers, restores each from its file and
     runs 100 more steps. The final parameters equal those of 200 steps
     never interrupted, bit for bit, and so do the servers' versions,
     counters and staleness histograms, and the workers' clocks and pulls:
     Adam and momentum with the servers applying, Adam with the workers
     applying (apply ON_WORKERS, whose first session ends without a pull
     after the last push, so the servers must keep and save the last step's
     mean), which also equals the servers-applying run bit for bit.
   - A gradient accepted for a clock not yet applied (one worker of two
     pushed it before the save) is saved with its server and applied with
     the other's after the restore: the bits of both pushing at once.
   - Corruption: every single-byte change of a server's file (and of a
     worker's; make test: the first 64 bytes, the last 16 and every 5th
     between) is DSGD_ERR_FORMAT, as is a truncation, and the server (its
     parameters, counters and histogram) or worker is what the good file
     restored before.
   - Mismatches, DSGD_ERR_SHAPE with the message naming the difference: a
     server's file into a worker and a worker's into a server, server 0's
     file into server 1, a server's into a server with another shard map,
     another optimizer kind or another apply, a model's checkpoint into a
     server.
   - States, DSGD_ERR_STATE: a save after serve failed and after a worker's
     pull failed, a worker's save between its first pull and finish, a
     restore into a worker that pulled and into a server that served.

   Worker and server threads never call cmocka's assertions (they longjmp);
   they record results that the main thread checks after joining. The
   first session runs in a child, which reports through its exit status.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#define P 2
#define W 2
#define NR (P + W)
#define IN 6
#define OUT 4
#define NPARAMS 180
#define BATCH 8
/* The steps before the save (as many after): 100 under make test-full,
   40 in the quick tier (the cut past the 30 steps of warmup either way) */
#define HALF TU_PICK(100, 40)
#define BINS 16
#define MSG 1024

static const dsgd_layer_desc LAYERS[2] = {{16, DSGD_ACT_TANH, DSGD_INIT_AUTO}, {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static char g_dir[64];

static int setup(void **state) {
    (void)state;
    tu_mkdtemp(g_dir);
    tu_watchdog(600); /* a hang fails the run instead of blocking CI */
    return 0;
}

static int teardown(void **state) {
    (void)state;
    tu_rmdir_files(g_dir);
    tu_watchdog(0);
    return 0;
}

TU_FN int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* The file of `rank` under prefix (g_dir/prefix.rankN). */
static void rank_path(char *out, size_t cap, const char *prefix, int rank) {
    snprintf(out, cap, "%s/%s.rank%d", g_dir, prefix, rank);
}

static dsgd_model_desc model_desc(void) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof md);
    md.input_dim = IN;
    md.layers = LAYERS;
    md.num_layers = 2;
    md.max_batch = BATCH;
    md.seed = 11;
    return md;
}

static dsgd_ps_desc ps_desc(dsgd_optimizer_kind kind, dsgd_ps_apply apply) {
    dsgd_ps_desc d;
    memset(&d, 0, sizeof d);
    d.num_servers = P;
    d.num_workers = W;
    d.policy = DSGD_PS_SYNC;
    d.apply = apply;
    d.optimizer.kind = kind;
    d.optimizer.lr = kind == DSGD_OPT_ADAM ? 0.01f : 0.05f;
    d.optimizer.schedule.kind = DSGD_SCHEDULE_COSINE;
    d.optimizer.schedule.warmup_steps = 30;
    d.optimizer.schedule.total_steps = 2 * HALF;
    d.optimizer.schedule.final_lr = 0.001f;
    d.staleness_bins = BINS;
    /* the runs compare their counts, duplicates included: a resend after
       the default 50 ms of real time (a reply delayed on a busy machine,
       under TSan) would be a duplicate only one run saw */
    d.retry_s = 2.0;
    return d;
}

/* The model's variables over P servers; shards 2 cuts each in two, 0 keeps
   them whole. */
static dsgd_shard_map *make_map(dsgd_ctx *ctx, dsgd_model *m, int shards) {
    dsgd_variable vars[8];
    dsgd_partitioner part;
    dsgd_shard_map *map = NULL;
    int i, nv = dsgd_model_num_variables(m);
    for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(m, i);
    memset(&part, 0, sizeof part);
    part.kind = DSGD_PARTITIONER_FIXED_SHARDS;
    part.num_shards = shards;
    TU_OK(ctx, dsgd_shard_map_create(ctx, vars, nv, P, shards ? &part : NULL, &map));
    return map;
}

/* Worker w's batch of step k. */
static void batch_of(int w, int64_t k, float *x, float *y) {
    tu_rng r = tu_rng_make(1000003ull * (uint64_t)(w + 1) + (uint64_t)k);
    int i;
    tu_fill(&r, x, BATCH * IN, -1.0f, 1.0f);
    for (i = 0; i < BATCH; ++i) y[i] = (float)tu_below(&r, OUT);
}

/* ---------------------------------------------------------------- the runner */

typedef struct session {
    dsgd_ps_desc d;
    const dsgd_shard_map *map;
    const float *init;
    int steps;
    int wsteps[W];           /* where use_wsteps: worker w's steps */
    int use_wsteps;
    int final_pull;          /* a pull after the last push */
    const char *load, *save; /* file prefixes; NULL: none */
    /* results */
    float final[NPARAMS];    /* the servers' ranges, or (ON_WORKERS) worker 0's copy */
    float wfinal[W][NPARAMS]; /* ON_WORKERS: each worker's copy */
    dsgd_result res[NR];
    char msg[NR][MSG];
    dsgd_ps_server_stats st[P];
    int64_t hist[P][BINS];
    dsgd_ps_worker_stats wst[W];
} session;

typedef struct rank_arg {
    session *S;
    int rank;
    dsgd_transport_i t;
} rank_arg;

static void *server_main(void *arg) {
    rank_arg *a = (rank_arg *)arg;
    session *S = a->S;
    dsgd_ctx *ctx = NULL;
    dsgd_ps_server *s = NULL;
    char path[256];
    dsgd_result r;
    int b;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        S->res[a->rank] = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    r = dsgd_ps_server_create(ctx, &a->t, &S->d, S->map, S->init, &s);
    if (r == DSGD_OK && S->load) {
        rank_path(path, sizeof path, S->load, a->rank);
        r = dsgd_ps_server_restore(s, path);
    }
    if (r == DSGD_OK) r = dsgd_ps_server_serve(s);
    if (r == DSGD_OK && S->save) {
        rank_path(path, sizeof path, S->save, a->rank);
        r = dsgd_ps_server_save(s, path);
    }
    if (r == DSGD_OK) {
        dsgd_ps_server_get_stats(s, &S->st[a->rank]);
        for (b = 0; b < BINS; ++b) S->hist[a->rank][b] = S->st[a->rank].staleness_hist[b];
        S->st[a->rank].staleness_hist = NULL;
        if (S->d.apply == DSGD_PS_APPLY_ON_SERVERS) r = dsgd_ps_server_read_params(s, S->final);
    }
    S->res[a->rank] = r;
    snprintf(S->msg[a->rank], MSG, "%s", dsgd_ctx_last_error(ctx));
    dsgd_ps_server_destroy(s);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

/* Pull, gradient of the pulled parameters on this step's batch, push;
   steps times from the worker's clock. */
static dsgd_result worker_steps(session *S, int w, dsgd_ps_worker *pw, dsgd_model *m) {
    float p[NPARAMS], g[NPARAMS], x[BATCH * IN], y[BATCH];
    dsgd_ps_worker_stats ws;
    dsgd_result r = DSGD_OK;
    int64_t k, k0;
    int steps = S->use_wsteps ? S->wsteps[w] : S->steps;
    dsgd_ps_worker_get_stats(pw, &ws);
    k0 = ws.clock;
    for (k = k0; k < k0 + steps && r == DSGD_OK; ++k) {
        if ((r = dsgd_ps_worker_pull(pw, p)) != DSGD_OK) break;
        batch_of(w, k, x, y);
        if ((r = dsgd_model_set_params(m, p, NPARAMS)) != DSGD_OK ||
            (r = dsgd_model_compute_gradients(m, x, y, BATCH, 1.0f / BATCH)) != DSGD_OK ||
            (r = dsgd_model_get_grads(m, g, NPARAMS)) != DSGD_OK)
            break;
        r = dsgd_ps_worker_push(pw, g);
    }
    if (r == DSGD_OK && S->final_pull) r = dsgd_ps_worker_pull(pw, p);
    return r;
}

static void *worker_main(void *arg) {
    rank_arg *a = (rank_arg *)arg;
    session *S = a->S;
    int w = a->rank - P;
    dsgd_ctx *ctx = NULL;
    dsgd_ps_worker *pw = NULL;
    dsgd_model *m = NULL;
    dsgd_model_desc md = model_desc();
    char path[256];
    dsgd_result r;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        S->res[a->rank] = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    r = dsgd_ps_worker_create(ctx, &a->t, &S->d, S->map, &pw);
    if (r == DSGD_OK && S->load) {
        rank_path(path, sizeof path, S->load, a->rank);
        r = dsgd_ps_worker_restore(pw, path);
    } else if (r == DSGD_OK && S->d.apply == DSGD_PS_APPLY_ON_WORKERS) {
        r = dsgd_ps_worker_set_params(pw, S->init);
    }
    if (r == DSGD_OK) r = dsgd_model_create(ctx, &md, &m);
    if (r == DSGD_OK) r = worker_steps(S, w, pw, m);
    if (r == DSGD_OK) r = dsgd_ps_worker_finish(pw);
    if (r == DSGD_OK && S->save) {
        rank_path(path, sizeof path, S->save, a->rank);
        r = dsgd_ps_worker_save(pw, path);
    }
    if (r == DSGD_OK && S->d.apply == DSGD_PS_APPLY_ON_WORKERS) {
        r = dsgd_ps_worker_read_params(pw, S->wfinal[w]);
        if (w == 0) memcpy(S->final, S->wfinal[0], sizeof S->final);
    }
    dsgd_ps_worker_get_stats(pw, &S->wst[w]);
    S->res[a->rank] = r;
    snprintf(S->msg[a->rank], MSG, "%s", dsgd_ctx_last_error(ctx));
    dsgd_model_destroy(m);
    dsgd_ps_worker_destroy(pw);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

/* Runs every rank of S on its own thread over a new hub; returns the first
   failing rank, or -1 when every rank succeeded (no cmocka here: the first
   session runs in a child). */
static int run_session(session *S) {
    dsgd_ctx *ctx = NULL;
    dsgd_loopback *hub = NULL;
    pthread_t th[NR];
    rank_arg args[NR];
    int i, bad = -1;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK || dsgd_loopback_create(ctx, NR, &hub) != DSGD_OK) return NR;
    for (i = 0; i < NR; ++i) {
        args[i].S = S;
        args[i].rank = i;
        S->res[i] = DSGD_OK;
        S->msg[i][0] = '\0';
        if (dsgd_loopback_endpoint(hub, i, &args[i].t) != DSGD_OK) return NR;
    }
    for (i = 0; i < NR; ++i)
        if (pthread_create(&th[i], NULL, i < P ? server_main : worker_main, &args[i]) != 0) return NR;
    for (i = 0; i < NR; ++i) pthread_join(th[i], NULL);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    for (i = 0; i < NR && bad < 0; ++i)
        if (S->res[i] != DSGD_OK) bad = i;
    return bad;
}

static void expect_session_ok(const session *S) {
    int bad = run_session((session *)S);
    if (bad >= NR) fail_msg("could not start the session");
    if (bad >= 0) fail_msg("rank %d: %s: %s", bad, dsgd_result_string(S->res[bad]), S->msg[bad]);
}

/* The model's initial parameters, the map, the desc. */
typedef struct fixture {
    dsgd_ctx *ctx;
    dsgd_model *m;
    dsgd_shard_map *map;
    float init[NPARAMS];
} fixture;

static void fixture_make(fixture *F) {
    dsgd_model_desc md = model_desc();
    F->ctx = tu_ctx();
    TU_OK(F->ctx, dsgd_model_create(F->ctx, &md, &F->m));
    assert_int_equal(dsgd_model_num_params(F->m), NPARAMS);
    TU_OK(F->ctx, dsgd_model_get_params(F->m, F->init, NPARAMS));
    F->map = make_map(F->ctx, F->m, 2);
}

static void fixture_free(fixture *F) {
    dsgd_shard_map_destroy(F->map);
    dsgd_model_destroy(F->m);
    dsgd_ctx_destroy(F->ctx);
}

static void session_init(session *S, const fixture *F, const dsgd_ps_desc *d, int steps, int final_pull,
                         const char *load, const char *save) {
    memset(S, 0, sizeof *S);
    S->d = *d;
    S->map = F->map;
    S->init = F->init;
    S->steps = steps;
    S->final_pull = final_pull;
    S->load = load;
    S->save = save;
}

/* Runs the first `steps` steps in a child process, which saves every rank
   under prefix. */
static void child_session(const fixture *F, const dsgd_ps_desc *d, int steps, const char *prefix) {
    pid_t pid;
    int status = 0;
    fflush(NULL);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        static session S;
        int bad;
        session_init(&S, F, d, steps, 0, NULL, prefix);
        bad = run_session(&S);
        if (bad >= 0) {
            fprintf(stderr, "child: rank %d: %s: %s\n", bad, bad < NR ? dsgd_result_string(S.res[bad]) : "",
                    bad < NR ? S.msg[bad] : "could not start");
            _exit(3);
        }
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail_msg("the saving child failed (status %d)", status);
}

/* The resumed session's outcome equals the uninterrupted one's. Summation
   only, the saved half's dsgd_ps_worker_finish made one pull more per
   worker (it fetches every mean before it says goodbye). */
static void expect_same_run(const session *got, const session *want) {
    int extra = got->d.apply == DSGD_PS_APPLY_ON_WORKERS;
    int i, b;
    if (memcmp(got->final, want->final, sizeof got->final) != 0)
        fail_msg("resumed parameters differ (relative error %.3g)", tu_rel_err(got->final, want->final, NPARAMS));
    for (i = 0; i < W && got->d.apply == DSGD_PS_APPLY_ON_WORKERS; ++i)
        if (memcmp(got->wfinal[i], want->wfinal[i], sizeof got->wfinal[i]) != 0)
            fail_msg("worker %d's resumed copy differs", i);
    for (i = 0; i < P; ++i) {
        const dsgd_ps_server_stats *g = &got->st[i], *x = &want->st[i];
        assert_int_equal(g->version, 2 * HALF);
        assert_int_equal(g->version, x->version);
        assert_int_equal(g->pushes_received, x->pushes_received);
        assert_int_equal(g->pushes_applied, x->pushes_applied);
        assert_int_equal(g->duplicates, x->duplicates);
        assert_int_equal(g->stale_dropped, x->stale_dropped);
        assert_int_equal(g->pulls_answered, x->pulls_answered + extra * W);
        assert_int_equal(g->staleness_max, x->staleness_max);
        assert_true(g->staleness_mean == x->staleness_mean);
        for (b = 0; b < BINS; ++b) assert_int_equal(got->hist[i][b], want->hist[i][b]);
    }
    for (i = 0; i < W; ++i) {
        assert_int_equal(got->wst[i].clock, 2 * HALF);
        assert_int_equal(got->wst[i].clock, want->wst[i].clock);
        assert_int_equal(got->wst[i].pulls, want->wst[i].pulls + extra);
    }
}

/* 100 steps in a child, saved; restored here for 100 more; against 200 at
   once. want (may be NULL) receives the uninterrupted run. */
static void resume_case(dsgd_optimizer_kind kind, dsgd_ps_apply apply, session *want) {
    static session a, b;
    fixture F;
    dsgd_ps_desc d = ps_desc(kind, apply);
    fixture_make(&F);
    child_session(&F, &d, HALF, "half");
    session_init(&a, &F, &d, 2 * HALF, 1, NULL, NULL);
    expect_session_ok(&a);
    session_init(&b, &F, &d, HALF, 1, "half", NULL);
    expect_session_ok(&b);
    expect_same_run(&b, &a);
    assert_true(memcmp(a.final, F.init, sizeof a.final) != 0); /* it trained */
    print_message("%s, apply %s: %d + %d steps restored from 4 files = %d steps, bit for bit\n",
                  kind == DSGD_OPT_ADAM ? "Adam" : "momentum",
                  apply == DSGD_PS_APPLY_ON_SERVERS ? "ON_SERVERS" : "ON_WORKERS", HALF, HALF, 2 * HALF);
    if (want) *want = a;
    fixture_free(&F);
}

static void test_resume_adam(void **state) {
    (void)state;
    resume_case(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_SERVERS, NULL);
}

static void test_resume_momentum(void **state) {
    (void)state;
    resume_case(DSGD_OPT_MOMENTUM, DSGD_PS_APPLY_ON_SERVERS, NULL);
}

static void test_resume_on_workers(void **state) {
    static session on_servers, on_workers;
    int w;
    (void)state;
    resume_case(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_SERVERS, &on_servers);
    resume_case(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_WORKERS, &on_workers);
    for (w = 0; w < W; ++w)
        if (memcmp(on_workers.wfinal[w], on_servers.final, sizeof on_servers.final) != 0)
            fail_msg("worker %d applying differs from the servers applying", w);
}

/* A gradient accepted for a clock not yet applied travels too: worker 0
   pushes clock 0 and finishes, worker 1 finishes without pushing; the
   servers save (clock 0 holds one gradient of two); restored, worker 1
   pushes clock 0, which is then applied. The parameters equal those of both
   pushing in one session. */
static void test_held_gradient(void **state) {
    static session a, b, c;
    fixture F;
    dsgd_ps_desc d = ps_desc(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_SERVERS);
    int i;
    (void)state;
    d.timeout_s = 10.0;
    d.optimizer.schedule.warmup_steps = 0; /* step 0 moves the parameters */
    fixture_make(&F);
    session_init(&a, &F, &d, 0, 0, NULL, "held");
    a.use_wsteps = 1;
    a.wsteps[0] = 1;
    expect_session_ok(&a);
    for (i = 0; i < P; ++i) assert_true(a.st[i].version == 0 && a.st[i].pushes_received == 1);
    session_init(&b, &F, &d, 0, 1, "held", NULL);
    b.use_wsteps = 1;
    b.wsteps[1] = 1;
    expect_session_ok(&b);
    session_init(&c, &F, &d, 1, 1, NULL, NULL);
    expect_session_ok(&c);
    assert_memory_equal(b.final, c.final, sizeof b.final);
    assert_true(memcmp(b.final, F.init, sizeof b.final) != 0);
    for (i = 0; i < P; ++i) {
        assert_true(b.st[i].version == 1 && b.st[i].pushes_applied == 2 && b.st[i].pushes_received == 2);
        assert_memory_equal(b.hist[i], c.hist[i], sizeof b.hist[i]);
    }
    fixture_free(&F);
}

/* ---------------------------------------------------------------- damaged and mismatched files */

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n;
    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n > 0);
    rewind(f);
    buf = (unsigned char *)malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Writes a new file (unlinked first: rewriting one in place makes some file
   systems flush it on close, 2 ms each). */
static void spit(const char *path, const void *data, size_t len) {
    FILE *f;
    unlink(path);
    f = fopen(path, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

/* A server or worker of desc d on endpoint `rank` of a hub (never served:
   only restored). */
typedef struct lone {
    dsgd_ctx *ctx;
    dsgd_loopback *hub;
    dsgd_transport_i t;
    dsgd_ps_server *s;
    dsgd_ps_worker *w;
    int sum_only;
} lone;

static void lone_make(lone *L, const fixture *F, const dsgd_ps_desc *d, const dsgd_shard_map *map, int rank) {
    memset(L, 0, sizeof *L);
    L->sum_only = d->apply == DSGD_PS_APPLY_ON_WORKERS;
    L->ctx = tu_ctx();
    TU_OK(L->ctx, dsgd_loopback_create(L->ctx, NR, &L->hub));
    TU_OK(L->ctx, dsgd_loopback_endpoint(L->hub, rank, &L->t));
    if (rank < P)
        TU_OK(L->ctx, dsgd_ps_server_create(L->ctx, &L->t, d, map, F->init, &L->s));
    else
        TU_OK(L->ctx, dsgd_ps_worker_create(L->ctx, &L->t, d, map, &L->w));
}

static void lone_free(lone *L) {
    dsgd_ps_server_destroy(L->s);
    dsgd_ps_worker_destroy(L->w);
    dsgd_loopback_destroy(L->hub);
    dsgd_ctx_destroy(L->ctx);
}

/* What a restore must leave untouched: a server's parameters, counters and
   histogram; a worker's counters and versions. */
typedef struct snapshot {
    float params[NPARAMS];
    dsgd_ps_server_stats st;
    int64_t hist[BINS];
    dsgd_ps_worker_stats ws;
    int64_t version[P];
} snapshot;

static void snap(const lone *L, snapshot *o) {
    int i;
    memset(o, 0, sizeof *o);
    if (L->s) {
        if (!L->sum_only) TU_OK(L->ctx, dsgd_ps_server_read_params(L->s, o->params));
        dsgd_ps_server_get_stats(L->s, &o->st);
        for (i = 0; i < BINS && i < o->st.staleness_bins; ++i) o->hist[i] = o->st.staleness_hist[i];
        o->st.staleness_hist = NULL;
    } else {
        if (L->sum_only) TU_OK(L->ctx, dsgd_ps_worker_read_params(L->w, o->params));
        dsgd_ps_worker_get_stats(L->w, &o->ws);
        for (i = 0; i < P; ++i) o->version[i] = dsgd_ps_worker_version(L->w, i);
    }
}

static dsgd_result lone_restore(lone *L, const char *path) {
    return L->s ? dsgd_ps_server_restore(L->s, path) : dsgd_ps_worker_restore(L->w, path);
}

/* Every single-byte change and a few truncations of rank's file are
   DSGD_ERR_FORMAT, and leave what the good file restored. The quick tier
   changes the first 64 bytes, the last 16 and every 5th between; make
   test-full every byte. */
static void corrupt_case(const fixture *F, const dsgd_ps_desc *d, int rank, const char *prefix) {
    char good[256], bad[256];
    unsigned char *img;
    size_t len, i, cut[3], changed = 0;
    lone L;
    snapshot before, after;
    int k;
    rank_path(good, sizeof good, prefix, rank);
    snprintf(bad, sizeof bad, "%s/damaged", g_dir);
    img = slurp(good, &len);
    lone_make(&L, F, d, F->map, rank);
    TU_OK(L.ctx, lone_restore(&L, good));
    snap(&L, &before);
    if (L.s) assert_int_equal(before.st.version, 10);
    else assert_int_equal(before.ws.clock, 10);
    for (i = 0; i < len; ++i) {
        unsigned char keep = img[i];
        if (!tu_full() && i >= 64 && i + 16 < len && i % 5 != 0) continue;
        ++changed;
        img[i] ^= (unsigned char)(1u << (i % 8)); /* one bit of each byte in turn */
        spit(bad, img, len);
        img[i] = keep;
        if (lone_restore(&L, bad) != DSGD_ERR_FORMAT)
            fail_msg("rank %d: byte %zu of %zu changed: %s, not DSGD_ERR_FORMAT (%s)", rank, i, len,
                     dsgd_result_string(dsgd_ctx_last_result(L.ctx)), dsgd_ctx_last_error(L.ctx));
    }
    cut[0] = 0;
    cut[1] = len / 2;
    cut[2] = len - 1;
    for (k = 0; k < 3; ++k) {
        spit(bad, img, cut[k]);
        TU_ERR(L.ctx, DSGD_ERR_FORMAT, lone_restore(&L, bad));
    }
    snap(&L, &after);
    assert_memory_equal(&after, &before, sizeof before);
    print_message("%s %d: %zu single-byte changes and 3 truncations of its %zu-byte file: DSGD_ERR_FORMAT, "
                  "untouched\n", rank < P ? "server" : "worker", rank < P ? rank : rank - P, changed, len);
    lone_free(&L);
    free(img);
}

static void test_corruption(void **state) {
    static session S;
    fixture F;
    dsgd_ps_desc d = ps_desc(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_SERVERS);
    (void)state;
    fixture_make(&F);
    session_init(&S, &F, &d, 10, 0, NULL, "ten");
    expect_session_ok(&S);
    corrupt_case(&F, &d, 0, "ten");
    corrupt_case(&F, &d, 1, "ten");
    corrupt_case(&F, &d, P, "ten");
    fixture_free(&F);
}

/* A restore of rank `from`'s file into a fresh rank `into` of desc d and map
   is DSGD_ERR_SHAPE whose message contains needle. */
static void shape_case(const fixture *F, const dsgd_ps_desc *d, const dsgd_shard_map *map, int from, int into,
                       const char *needle) {
    char path[256];
    lone L;
    snapshot before, after;
    rank_path(path, sizeof path, "ten", from);
    lone_make(&L, F, d, map, into);
    snap(&L, &before);
    TU_ERR(L.ctx, DSGD_ERR_SHAPE, lone_restore(&L, path));
    if (!contains(dsgd_ctx_last_error(L.ctx), needle))
        fail_msg("rank %d's file into rank %d: \"%s\" does not say \"%s\"", from, into, dsgd_ctx_last_error(L.ctx),
                 needle);
    snap(&L, &after);
    assert_memory_equal(&after, &before, sizeof before);
    print_message("  %s\n", dsgd_ctx_last_error(L.ctx));
    lone_free(&L);
}

static void test_mismatches(void **state) {
    static session S;
    fixture F;
    dsgd_ps_desc d = ps_desc(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_SERVERS), other;
    dsgd_shard_map *whole;
    dsgd_optimizer *opt = NULL;
    dsgd_optimizer_desc od;
    char path[256];
    lone L;
    (void)state;
    fixture_make(&F);
    session_init(&S, &F, &d, 10, 0, NULL, "ten");
    expect_session_ok(&S);
    shape_case(&F, &d, F.map, 0, P, "server 0 of a parameter-server run, not of a worker");
    shape_case(&F, &d, F.map, P + 1, 1, "worker 1 of a parameter-server run, not of a server");
    shape_case(&F, &d, F.map, 0, 1, "server 0, not of server 1");
    shape_case(&F, &d, F.map, P, P + 1, "worker 0, not of worker 1");
    whole = make_map(F.ctx, F.m, 0);
    shape_case(&F, &d, whole, 0, 0, "another shard map");
    shape_case(&F, &d, whole, P, P, "another shard map");
    other = ps_desc(DSGD_OPT_MOMENTUM, DSGD_PS_APPLY_ON_SERVERS);
    shape_case(&F, &other, F.map, 0, 0, "ADAM in the checkpoint");
    other = ps_desc(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_WORKERS);
    shape_case(&F, &other, F.map, 1, 1, "apply ON_SERVERS");
    shape_case(&F, &other, F.map, P, P, "apply ON_SERVERS");
    other = d;
    other.staleness_bins = BINS / 2;
    shape_case(&F, &other, F.map, 0, 0, "16 bins");
    dsgd_shard_map_destroy(whole);
    /* a model's checkpoint */
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    TU_OK(F.ctx, dsgd_optimizer_create(F.m, &od, &opt));
    snprintf(path, sizeof path, "%s/model.ckpt", g_dir);
    TU_OK(F.ctx, dsgd_model_save(F.m, opt, path, NULL));
    lone_make(&L, &F, &d, F.map, 0);
    TU_ERR(L.ctx, DSGD_ERR_SHAPE, dsgd_ps_server_restore(L.s, path));
    assert_true(contains(dsgd_ctx_last_error(L.ctx), "model's or strategy's checkpoint"));
    lone_free(&L);
    dsgd_optimizer_destroy(opt);
    fixture_free(&F);
}

/* ---------------------------------------------------------------- states */

typedef struct lone_server {
    dsgd_ps_server *s;
    dsgd_result serve, restore_after, save_after;
} lone_server;

static void *serve_then_restore(void *arg) {
    lone_server *a = (lone_server *)arg;
    char path[256];
    a->serve = dsgd_ps_server_serve(a->s);
    snprintf(path, sizeof path, "%s/served", g_dir);
    a->save_after = dsgd_ps_server_save(a->s, path);
    a->restore_after = dsgd_ps_server_restore(a->s, path);
    return NULL;
}

static void test_states(void **state) {
    fixture F;
    dsgd_ps_desc d = ps_desc(DSGD_OPT_ADAM, DSGD_PS_APPLY_ON_SERVERS);
    dsgd_ctx *sctx, *wctx;
    dsgd_loopback *hub = NULL;
    dsgd_transport_i ts, tw;
    dsgd_ps_server *s = NULL;
    dsgd_ps_worker *w = NULL;
    lone_server ls;
    pthread_t th;
    float p[NPARAMS], g[NPARAMS];
    char path[256], path2[256];
    (void)state;
    fixture_make(&F);
    d.num_workers = 1;
    d.timeout_s = TU_PICK(0.2, 0.05); /* nothing can come: how long it waits for nobody */
    snprintf(path, sizeof path, "%s/state", g_dir);
    snprintf(path2, sizeof path2, "%s/state2", g_dir);
    memset(g, 0, sizeof g);

    /* a server whose serve failed (no worker ever came), a worker whose pull failed (no server answered) */
    sctx = tu_ctx();
    wctx = tu_ctx();
    TU_OK(sctx, dsgd_loopback_create(sctx, P + 1, &hub));
    TU_OK(sctx, dsgd_loopback_endpoint(hub, 0, &ts));
    TU_OK(sctx, dsgd_ps_server_create(sctx, &ts, &d, F.map, F.init, &s));
    TU_OK(sctx, dsgd_ps_server_save(s, path)); /* before serve: fine */
    TU_ERR(sctx, DSGD_ERR_TIMEOUT, dsgd_ps_server_serve(s));
    TU_ERR(sctx, DSGD_ERR_STATE, dsgd_ps_server_save(s, path2));
    assert_true(contains(dsgd_ctx_last_error(sctx), "serve failed"));
    TU_ERR(sctx, DSGD_ERR_STATE, dsgd_ps_server_restore(s, path));
    dsgd_ps_server_destroy(s);
    TU_OK(wctx, dsgd_loopback_endpoint(hub, P, &tw));
    TU_OK(wctx, dsgd_ps_worker_create(wctx, &tw, &d, F.map, &w));
    TU_ERR(wctx, DSGD_ERR_TIMEOUT, dsgd_ps_worker_pull(w, p));
    TU_ERR(wctx, DSGD_ERR_STATE, dsgd_ps_worker_save(w, path2));
    assert_true(contains(dsgd_ctx_last_error(wctx), "failed"));
    dsgd_ps_worker_destroy(w);
    dsgd_loopback_destroy(hub);

    /* a worker between its first pull and finish; a server that served */
    d.timeout_s = 20.0;
    d.num_servers = 1;
    {
        dsgd_shard_map *one;
        dsgd_variable vars[8];
        int i, nv = dsgd_model_num_variables(F.m);
        for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(F.m, i);
        TU_OK(sctx, dsgd_shard_map_create(sctx, vars, nv, 1, NULL, &one));
        TU_OK(sctx, dsgd_loopback_create(sctx, 2, &hub));
        TU_OK(sctx, dsgd_loopback_endpoint(hub, 0, &ts));
        TU_OK(wctx, dsgd_loopback_endpoint(hub, 1, &tw));
        TU_OK(sctx, dsgd_ps_server_create(sctx, &ts, &d, one, F.init, &s));
        TU_OK(wctx, dsgd_ps_worker_create(wctx, &tw, &d, one, &w));
        TU_OK(wctx, dsgd_ps_worker_save(w, path)); /* before the first pull: fine */
        memset(&ls, 0, sizeof ls);
        ls.s = s;
        assert_int_equal(pthread_create(&th, NULL, serve_then_restore, &ls), 0);
        TU_OK(wctx, dsgd_ps_worker_pull(w, p));
        TU_ERR(wctx, DSGD_ERR_STATE, dsgd_ps_worker_save(w, path2));
        assert_true(contains(dsgd_ctx_last_error(wctx), "between its first pull and finish"));
        TU_ERR(wctx, DSGD_ERR_STATE, dsgd_ps_worker_restore(w, path));
        TU_OK(wctx, dsgd_ps_worker_push(w, g));
        TU_OK(wctx, dsgd_ps_worker_finish(w));
        TU_OK(wctx, dsgd_ps_worker_save(w, path2)); /* after finish: fine */
        TU_ERR(wctx, DSGD_ERR_STATE, dsgd_ps_worker_restore(w, path2));
        assert_int_equal(pthread_join(th, NULL), 0);
        assert_int_equal(ls.serve, DSGD_OK);
        assert_int_equal(ls.save_after, DSGD_OK);
        assert_int_equal(ls.restore_after, DSGD_ERR_STATE);
        assert_true(contains(dsgd_ctx_last_error(sctx), "has served"));
        /* arguments */
        TU_ERR(sctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_server_save(s, NULL));
        TU_ERR(wctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_ps_worker_restore(w, ""));
        assert_int_equal(dsgd_ps_server_save(NULL, path), DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsgd_ps_worker_restore(NULL, path), DSGD_ERR_INVALID_ARGUMENT);
        dsgd_ps_worker_destroy(w);
        dsgd_ps_server_destroy(s);
        dsgd_loopback_destroy(hub);
        dsgd_shard_map_destroy(one);
    }
    dsgd_ctx_destroy(wctx);
    dsgd_ctx_destroy(sctx);
    fixture_free(&F);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_resume_adam, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_momentum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_on_workers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_held_gradient, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mismatches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_states, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
