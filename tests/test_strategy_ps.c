/* test_strategy_ps.c - parameter servers as a strategy kind (strategy_ps.h).

   The model is test_strategy_central.c's small MLP (20 -> 16 relu -> 8
   tanh -> 5, softmax cross-entropy, 517 parameters) on seeded data.

   What is asserted, and how:
   - SYNC with 2 servers and N = 2 or 3 replicas x batch B trains, step for
     step, the bits of the cluster coordinator's SYNC run in which worker w
     takes replica w's shard of the same global batches (the same pull,
     gradient and push), with the servers applying (momentum, Adam) and
     with the workers applying (ON_WORKERS): every replica's model after the
     last step equals the coordinator's variables after shutdown.
   - Every policy (ASYNC, SSP 1, SYNC, BACKUP 2 + 1) trains (SSP, SYNC and
     BACKUP saved at step 100 and restored into a new strategy there, with
     the same evaluation loss for SYNC and BACKUP; ASYNC's arrival order
     makes its loss too noisy to add the restart's transient): the mean loss
     over a fixed evaluation batch falls to below 0.8 of the initial one
     after 200 steps on a learnable task; the step infos count the global
     step as the policy says (SYNC and BACKUP one update per step; SSP too,
     but its pull may come one clock early; ASYNC N, of which replica 0's
     pull saw at least its own), and SYNC
     replicas hold identical weights after each step.
   - Over endpoints given (one loopback hub of 2 servers + 2 workers) split
     among three strategies on three threads, as three processes would
     hold them (server 0; server 1 and worker 0; worker 1), SYNC trains
     every worker to the bits of the strategy with its own transport, also
     when every process saves at step 6 (each rank's file and the
     strategy's are written); the process of servers alone refuses to
     train and waits in destroy.
   - Over simnet (one strategy holding the 4 ranks of a simulated cluster,
     park_between_calls), SYNC gives the same bits, also with a save at
     step 6, and virtual time moved on every rank (each rank leaves the
     simulation when done).
   - Checkpoints (SYNC, momentum, servers and workers applying): a save at
     step 6 of 12 leaves the run on the bits of one never saved; a new
     strategy restored from the files trains them too; the strategy's file
     alone holds step 6's parameters and the velocity the last update used
     ((p5 - p6) / lr within 1e-3, read back through dsgd_model_restore); a
     missing rank's file (DSGD_ERR_IO) and files of two saves
     (DSGD_ERR_SHAPE) are refused and the strategy still trains the bits.
     At N = 1 (deterministic under every policy), every policy x placement
     x 1 or 2 servers (Adam), saved at step 6 and restored into a new
     strategy, ends with the bits of the run never saved.
   - A lost server (its process gone: nobody holds its rank of the
     endpoints' hub): the step fails with DSGD_ERR_TIMEOUT naming the
     server within timeout_s, the strategy is failed, and neither the next
     step nor destroy waits for the server.
   - Errors: DEVICE gradients, endpoints without probe and 0 servers are refused at
     creation; clip_norm is refused (the engine's rule); a save where no
     file can be made is DSGD_ERR_IO before anything stops; a variable aggregating SUM fails the step and the
     strategy (the others stop at once, not at their deadline); the kind's
     name.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant).
   distsgd-test: tsan */
#include "harness.h"

#include <pthread.h>

enum { IN = 20, OUT = 5, NPARAMS = 20 * 16 + 16 + 16 * 8 + 8 + 8 * 5 + 5, MAXN = 3, B = 6, STEPS = 12 };

static const dsgd_layer_desc LAYERS[3] = {
    {16, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

static dsgd_model_desc model_desc(void) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof(md));
    md.input_dim = IN;
    md.layers = LAYERS;
    md.num_layers = 3;
    md.max_batch = B;
    md.seed = 20240611u;
    return md;
}

static dsgd_optimizer_desc opt_desc(dsgd_optimizer_kind kind) {
    dsgd_optimizer_desc od;
    memset(&od, 0, sizeof(od));
    od.kind = kind;
    od.lr = kind == DSGD_OPT_ADAM ? 0.005f : 0.05f;
    od.momentum = 0.9f;
    return od;
}

static dsgd_strategy_desc ps_desc(int n, dsgd_ps_policy policy, dsgd_ps_apply apply, dsgd_optimizer_kind opt) {
    dsgd_strategy_desc d;
    memset(&d, 0, sizeof(d));
    d.kind = DSGD_STRATEGY_PARAMETER_SERVER;
    d.num_replicas = n;
    d.model = model_desc();
    d.optimizer = opt_desc(opt);
    d.timeout_s = 20.0;
    d.ps.num_servers = 2;
    d.ps.policy = policy;
    d.ps.staleness = policy == DSGD_PS_SSP ? 1 : 0;
    d.ps.backup_workers = policy == DSGD_PS_BACKUP ? 1 : 0;
    d.ps.apply = apply;
    return d;
}

static void make_batch(tu_rng *r, float *x, float *y, int count) {
    int i;
    tu_fill(r, x, (size_t)count * IN, -1.0f, 1.0f);
    for (i = 0; i < count; ++i) y[i] = (float)tu_below(r, OUT);
}

/* ---------------------------------------------------------------- SYNC = the coordinator's SYNC */

typedef struct shard_job {
    const float *x, *y; /* the step's global batch */
    int n;              /* workers */
} shard_job;

/* Worker w's closure: its block of the global batch, as replica w takes it. */
static dsgd_result closure_step(dsgd_cluster_worker *w, void *user) {
    const shard_job *j = (const shard_job *)user;
    size_t off = 0, len = 0;
    dsgd_block_range((size_t)(j->n * B), j->n, dsgd_cluster_worker_id(w), &off, &len);
    return dsgd_cluster_worker_train_step(w, j->x + off * IN, j->y + off, (int)len);
}

static void coordinator_run(int n, dsgd_ps_apply apply, dsgd_optimizer_kind opt, const float *xs, const float *ys,
                            float *out) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cluster_desc cd;
    dsgd_cluster *c = NULL;
    int step, w;
    memset(&cd, 0, sizeof(cd));
    cd.ps.num_servers = 2;
    cd.ps.num_workers = n;
    cd.ps.policy = DSGD_PS_SYNC;
    cd.ps.apply = apply;
    cd.ps.optimizer = opt_desc(opt);
    cd.ps.timeout_s = 20.0;
    cd.model = model_desc();
    TU_OK(ctx, dsgd_cluster_create(ctx, &cd, &c));
    for (step = 0; step < STEPS; ++step) {
        shard_job j;
        j.x = xs + (size_t)step * n * B * IN;
        j.y = ys + (size_t)step * n * B;
        j.n = n;
        for (w = 0; w < n; ++w) TU_OK(ctx, dsgd_cluster_schedule_on(c, w, closure_step, &j, NULL));
        TU_OK(ctx, dsgd_cluster_join(c));
    }
    TU_OK(ctx, dsgd_cluster_shutdown(c));
    TU_OK(ctx, dsgd_cluster_read_params(c, out));
    dsgd_cluster_destroy(c);
    dsgd_ctx_destroy(ctx);
}

static void strategy_run(int n, dsgd_ps_apply apply, dsgd_optimizer_kind opt, const float *xs, const float *ys,
                         float out[][NPARAMS]) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d = ps_desc(n, DSGD_PS_SYNC, apply, opt);
    dsgd_strategy *s = NULL;
    int step, r;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    for (step = 0; step < STEPS; ++step) {
        dsgd_step_info info;
        TU_OK(ctx, dsgd_strategy_train_step(s, xs + (size_t)step * n * B * IN, ys + (size_t)step * n * B, n * B, &info));
        assert_int_equal((int)info.step, step);
        assert_int_equal(info.count, n * B);
        assert_int_equal(info.skipped, 0);
        tu_assert_replicas_identical(ctx, s);
    }
    for (r = 0; r < n; ++r) TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, r), out[r], NPARAMS));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_sync_is_the_coordinators(void **state) {
    static const dsgd_optimizer_kind opts[2] = {DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM};
    float *xs = tu_floats((size_t)STEPS * MAXN * B * IN), ys[STEPS * MAXN * B];
    float want[NPARAMS], got[MAXN][NPARAMS], init[NPARAMS];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md = model_desc();
    dsgd_model *m = NULL;
    tu_rng rng = tu_rng_make(77);
    int n, o, apply, r;
    (void)state;
    tu_watchdog(240);
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    TU_OK(ctx, dsgd_model_get_params(m, init, NPARAMS));
    make_batch(&rng, xs, ys, STEPS * MAXN * B);
    for (n = 2; n <= 3; ++n)
        for (o = 0; o < 2; ++o)
            for (apply = 0; apply < 2; ++apply) {
                dsgd_ps_apply a = apply ? DSGD_PS_APPLY_ON_WORKERS : DSGD_PS_APPLY_ON_SERVERS;
                coordinator_run(n, a, opts[o], xs, ys, want);
                strategy_run(n, a, opts[o], xs, ys, got);
                assert_true(memcmp(want, init, sizeof(want)) != 0); /* it trained */
                for (r = 0; r < n; ++r)
                    if (memcmp(got[r], want, sizeof(want)) != 0)
                        fail_msg("N %d, %s, apply %s: replica %d differs from the coordinator's run (relative error "
                                 "%.3g)", n, opts[o] == DSGD_OPT_ADAM ? "Adam" : "momentum", dsgd_ps_apply_name(a),
                                 r, tu_rel_err(got[r], want, NPARAMS));
            }
    print_message("SYNC, 2 servers: N = 2, 3 x momentum, Adam x ON_SERVERS, ON_WORKERS = the coordinator's bits\n");
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(xs);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- over endpoints, as processes */

typedef struct proc {
    const dsgd_transport_i *eps; /* this "process's" endpoints */
    int count;
    const float *xs, *ys;
    const char *ckpt;            /* non-NULL: every process saves there before step STEPS / 2 */
    float out[NPARAMS];          /* its replica's weights at the end (if it has one) */
    int replicas;
    dsgd_result res, refused;
    char msg[512];
} proc;

static void *proc_main(void *arg) {
    proc *p = (proc *)arg;
    dsgd_ctx *ctx = NULL;
    dsgd_strategy_desc d = ps_desc(p->count, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_MOMENTUM);
    dsgd_strategy *s = NULL;
    int step;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return NULL;
    d.endpoints = p->eps;
    p->res = dsgd_strategy_create(ctx, &d, &s);
    if (p->res == DSGD_OK) {
        p->replicas = dsgd_strategy_num_replicas(s);
        for (step = 0; step < STEPS && p->res == DSGD_OK; ++step) {
            dsgd_result r;
            if (p->ckpt && step == STEPS / 2 && (p->res = dsgd_strategy_save(s, p->ckpt, NULL)) != DSGD_OK) break;
            r = dsgd_strategy_train_step(s, p->xs + (size_t)step * 2 * B * IN, p->ys + (size_t)step * 2 * B, 2 * B,
                                         NULL);
            if (p->replicas) p->res = r;
            else p->refused = r; /* servers alone: nothing to run */
        }
        if (p->res == DSGD_OK && p->replicas) p->res = dsgd_model_get_params(dsgd_strategy_model(s, 0), p->out, NPARAMS);
    }
    snprintf(p->msg, sizeof(p->msg), "%s", dsgd_ctx_last_error(ctx));
    dsgd_strategy_destroy(s); /* the servers' process waits here for the workers */
    dsgd_ctx_destroy(ctx);
    return NULL;
}

static void test_endpoints_as_processes(void **state) {
    static const int first[3] = {0, 1, 3}, count[3] = {1, 2, 1};
    float *xs = tu_floats((size_t)STEPS * 2 * B * IN), ys[STEPS * 2 * B], want[MAXN][NPARAMS];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[4];
    proc procs[3];
    pthread_t th[3];
    tu_rng rng = tu_rng_make(31);
    char dir[64], path[128], file[160];
    int i, save;
    (void)state;
    tu_watchdog(120);
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/ps.ckpt", dir);
    make_batch(&rng, xs, ys, STEPS * 2 * B);
    strategy_run(2, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_MOMENTUM, xs, ys, want);
    for (save = 0; save < 2; ++save) {
    TU_OK(ctx, dsgd_loopback_create(ctx, 4, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    memset(procs, 0, sizeof(procs));
    for (i = 0; i < 3; ++i) {
        procs[i].eps = &eps[first[i]];
        procs[i].count = count[i];
        procs[i].xs = xs;
        procs[i].ys = ys;
        procs[i].ckpt = save ? path : NULL;
        assert_int_equal(pthread_create(&th[i], NULL, proc_main, &procs[i]), 0);
    }
    for (i = 0; i < 3; ++i) assert_int_equal(pthread_join(th[i], NULL), 0);
    for (i = 0; i < 3; ++i)
        if (procs[i].res != DSGD_OK) print_message("process %d: %s: %s\n", i, dsgd_result_string(procs[i].res), procs[i].msg);
    for (i = 0; i < 3; ++i) assert_int_equal(procs[i].res, DSGD_OK);
    assert_int_equal(procs[0].replicas, 0);
    assert_int_equal(procs[0].refused, DSGD_ERR_STATE);
    assert_int_equal(procs[1].replicas, 1);
    assert_int_equal(procs[2].replicas, 1);
    assert_memory_equal(procs[1].out, want[0], sizeof(want[0]));
    assert_memory_equal(procs[2].out, want[1], sizeof(want[1]));
    print_message("SYNC over 3 processes' endpoints (server 0 | server 1 + worker 0 | worker 1)%s = its own "
                  "transport's bits\n", save ? ", each saving at step 6," : "");
    dsgd_loopback_destroy(hub);
    }
    for (i = 0; i < 4; ++i) { /* each rank's file and the strategy's, written by worker 0's process */
        static const char *const names[4] = {"", ".ps-server-0", ".ps-server-1", ".ps-worker-1"};
        snprintf(file, sizeof file, "%s%s", path, names[i]);
        assert_int_equal(access(file, R_OK), 0);
    }
    tu_rmdir_files(dir);
    rmdir(dir);
    dsgd_ctx_destroy(ctx);
    free(xs);
    tu_watchdog(0);
}

/* Over simnet: one strategy holding the 4 ranks of a simulated cluster
   (park_between_calls, as every strategy over simnet), SYNC gives the
   bits of its own loopback, and time moved on every rank. */
static void test_simnet_same_bits(void **state) {
    float *xs = tu_floats((size_t)STEPS * 2 * B * IN), ys[STEPS * 2 * B], want[MAXN][NPARAMS], got[NPARAMS];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_simnet_desc sd;
    dsgd_simnet *hub = NULL;
    dsgd_transport_i eps[4];
    dsgd_strategy_desc d = ps_desc(4, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_MOMENTUM);
    dsgd_strategy *s = NULL;
    tu_rng rng = tu_rng_make(32);
    char dir[64], path[128];
    int i, step;
    (void)state;
    tu_watchdog(120);
    make_batch(&rng, xs, ys, STEPS * 2 * B);
    strategy_run(2, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_MOMENTUM, xs, ys, want);
    memset(&sd, 0, sizeof(sd));
    sd.ranks = 4;
    sd.alpha_s = 20e-6;
    sd.beta_s_per_byte = 1e-9;
    sd.park_between_calls = 1;
    TU_OK(ctx, dsgd_simnet_create(ctx, &sd, &hub));
    for (i = 0; i < 4; ++i) TU_OK(ctx, dsgd_simnet_endpoint(hub, i, &eps[i]));
    d.endpoints = eps;
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    assert_int_equal(dsgd_strategy_num_replicas(s), 2);
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/ps.ckpt", dir);
    for (step = 0; step < STEPS; ++step) {
        if (step == STEPS / 2) TU_OK(ctx, dsgd_strategy_save(s, path, NULL)); /* the ranks' calls on their threads */
        TU_OK(ctx, dsgd_strategy_train_step(s, xs + (size_t)step * 2 * B * IN, ys + (size_t)step * 2 * B, 2 * B, NULL));
    }
    for (i = 0; i < 2; ++i) {
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, i), got, NPARAMS));
        assert_memory_equal(got, want[i], sizeof(got));
    }
    dsgd_strategy_destroy(s);
    for (i = 0; i < 4; ++i) assert_true(dsgd_simnet_time(hub, i) > 0.0);
    print_message("SYNC over simnet (2 servers + 2 workers, %.3f ms virtual, saved at step %d) = its own transport's "
                  "bits\n", 1e3 * dsgd_simnet_time(hub, 2), STEPS / 2);
    tu_rmdir_files(dir);
    rmdir(dir);
    dsgd_simnet_destroy(hub);
    dsgd_ctx_destroy(ctx);
    free(xs);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- every policy trains */

/* A learnable task: the class is the index of the largest of the first OUT
   inputs. */
static void make_task(tu_rng *r, float *x, float *y, int count) {
    int i, k;
    tu_fill(r, x, (size_t)count * IN, -1.0f, 1.0f);
    for (i = 0; i < count; ++i) {
        int best = 0;
        for (k = 1; k < OUT; ++k)
            if (x[(size_t)i * IN + k] > x[(size_t)i * IN + best]) best = k;
        y[i] = (float)best;
    }
}

static double eval_loss(dsgd_ctx *ctx, dsgd_strategy *s, const float *x, const float *y, int count) {
    dsgd_metrics m;
    TU_OK(ctx, dsgd_strategy_eval_batch(s, x, y, count));
    TU_OK(ctx, dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &m));
    assert_true(m.count == (double)count);
    return m.loss_sum / m.count;
}

static void test_every_policy_trains(void **state) {
    static const dsgd_ps_policy policies[4] = {DSGD_PS_ASYNC, DSGD_PS_SSP, DSGD_PS_SYNC, DSGD_PS_BACKUP};
    enum { N = 3 };
    float x[N * B * IN], y[N * B], ex[N * B * IN], ey[N * B];
    dsgd_ctx *ctx = tu_ctx();
    char dir[64], path[128];
    int p, step;
    const int train = TU_PICK(200, 120); /* make test-full 200; 120 halve the loss even when ASYNC runs on a busy
                                            machine (at 60 it once stopped at 0.80 of the start, on the bound) */
    (void)state;
    tu_watchdog(240);
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/policy.ckpt", dir);
    for (p = 0; p < 4; ++p) {
        dsgd_strategy_desc d = ps_desc(N, policies[p], DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_MOMENTUM);
        dsgd_strategy *s = NULL;
        tu_rng rng = tu_rng_make(5);
        double before, after;
        d.optimizer.lr = 0.05f;
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        assert_string_equal(dsgd_strategy_kind_name(d.kind), "parameter_server");
        make_task(&rng, ex, ey, N * B);
        before = eval_loss(ctx, s, ex, ey, N * B);
        for (step = 0; step < train; ++step) {
            dsgd_step_info info;
            if (step == train / 2 && policies[p] != DSGD_PS_ASYNC) { /* halfway: saved, restored into a new strategy */
                double saved, restored;
                saved = eval_loss(ctx, s, ex, ey, N * B);
                TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
                dsgd_strategy_destroy(s);
                s = NULL;
                TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
                TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
                restored = eval_loss(ctx, s, ex, ey, N * B);
                if (policies[p] == DSGD_PS_SYNC || policies[p] == DSGD_PS_BACKUP) /* every replica held the same */
                    assert_true(restored == saved);
            }
            make_task(&rng, x, y, N * B);
            TU_OK(ctx, dsgd_strategy_train_step(s, x, y, N * B, &info));
            /* the global step replica 0 read at its last pull: one update a
               step; ASYNC one per push, of which its pull, not waiting, saw its
               own and those that came before it */
            if (policies[p] == DSGD_PS_SSP) assert_true(info.step == step - 1 || info.step == step); /* s = 1 */
            else if (policies[p] != DSGD_PS_ASYNC) assert_int_equal((int)info.step, step);
            else if (step == 0) assert_int_equal((int)info.step, 0);
            else assert_true(info.step >= N * (step - 1) + 1 && info.step <= N * step);
            if (policies[p] == DSGD_PS_SYNC) tu_assert_replicas_identical(ctx, s);
        }
        after = eval_loss(ctx, s, ex, ey, N * B);
        print_message("%s: evaluation loss %.4f -> %.4f after %d steps\n", dsgd_ps_policy_name(policies[p]), before,
                      after, train);
        if (!(after < 0.8 * before)) fail_msg("%s did not train: %.4f -> %.4f", dsgd_ps_policy_name(policies[p]),
                                              before, after);
        dsgd_strategy_destroy(s);
    }
    tu_rmdir_files(dir);
    rmdir(dir);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- checkpoints */

/* Trains global steps [from, to) of the batches (n replicas x B each). */
static void train_steps(dsgd_ctx *ctx, dsgd_strategy *s, int n, const float *xs, const float *ys, int from, int to) {
    int step;
    for (step = from; step < to; ++step) {
        dsgd_step_info info;
        TU_OK(ctx, dsgd_strategy_train_step(s, xs + (size_t)step * n * B * IN, ys + (size_t)step * n * B, n * B, &info));
        assert_int_equal((int)info.step, step);
    }
}

/* Save at step K, then: the run goes on with the bits of one never saved,
   a new strategy restored from the files trains the same bits, and the
   strategy's file holds the servers' state: its parameters are step K's
   and its momentum is the velocity the last update used, (p[K-1] - p[K]) /
   lr, read from a model restored from the file alone. A missing rank's
   file and files of two saves are refused, touching nothing. */
static void test_checkpoint(void **state) {
    enum { N = 2, K = STEPS / 2 };
    float *xs = tu_floats((size_t)STEPS * N * B * IN), ys[STEPS * N * B], want[MAXN][NPARAMS];
    float before[NPARAMS], at[NPARAMS], got[NPARAMS], v[NPARAMS];
    char dir[64], path[128], path2[128], rank[160], rank2[160];
    dsgd_ctx *ctx = tu_ctx();
    tu_rng rng = tu_rng_make(57);
    int apply;
    (void)state;
    tu_watchdog(180);
    tu_mkdtemp(dir);
    make_batch(&rng, xs, ys, STEPS * N * B);
    for (apply = 0; apply < 2; ++apply) {
        dsgd_ps_apply a = apply ? DSGD_PS_APPLY_ON_WORKERS : DSGD_PS_APPLY_ON_SERVERS;
        dsgd_strategy_desc d = ps_desc(N, DSGD_PS_SYNC, a, DSGD_OPT_MOMENTUM);
        dsgd_model_desc md = model_desc();
        dsgd_strategy *s = NULL, *s2 = NULL;
        dsgd_model *m = NULL;
        dsgd_optimizer *o = NULL;
        double vmax = 0.0;
        size_t i;
        strategy_run(N, a, DSGD_OPT_MOMENTUM, xs, ys, want);
        snprintf(path, sizeof path, "%s/ps%d.ckpt", dir, apply);
        snprintf(path2, sizeof path2, "%s/ps%d-later.ckpt", dir, apply);
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
        train_steps(ctx, s, N, xs, ys, 0, K - 1);
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), before, NPARAMS));
        train_steps(ctx, s, N, xs, ys, K - 1, K);
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), at, NPARAMS));
        TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
        train_steps(ctx, s, N, xs, ys, K, STEPS);
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), got, NPARAMS));
        assert_memory_equal(got, want[0], sizeof(got));
        TU_OK(ctx, dsgd_strategy_save(s, path2, NULL));
        dsgd_strategy_destroy(s);
        /* the file alone: step K's parameters and the servers' velocity */
        TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
        TU_OK(ctx, dsgd_optimizer_create(m, &d.optimizer, &o));
        TU_OK(ctx, dsgd_model_restore(m, o, path, NULL));
        assert_int_equal((int)dsgd_optimizer_steps(o), K);
        TU_OK(ctx, dsgd_model_get_params(m, got, NPARAMS));
        assert_memory_equal(got, at, sizeof(got));
        TU_OK(ctx, dsgd_optimizer_read_slot(o, 0, 0, NPARAMS, v));
        for (i = 0; i < NPARAMS; ++i) {
            double want_v = ((double)before[i] - (double)at[i]) / (double)d.optimizer.lr;
            if (fabs(v[i] - want_v) > 1e-4 + 1e-3 * fabs(want_v))
                fail_msg("%s: momentum[%zu] is %g in the file, the last update used %g", dsgd_ps_apply_name(a), i,
                         (double)v[i], want_v);
            if (fabs(want_v) > vmax) vmax = fabs(want_v);
        }
        assert_true(vmax > 1e-3); /* a zero velocity would not pass */
        dsgd_optimizer_destroy(o);
        dsgd_model_destroy(m);
        /* a new strategy, restored, trains the same bits */
        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s2));
        TU_OK(ctx, dsgd_strategy_restore(s2, path, NULL));
        train_steps(ctx, s2, N, xs, ys, K, K + 1);
        /* refused, nothing touched: a rank's file missing, files of two saves */
        snprintf(rank, sizeof rank, "%s.ps-worker-1", path2);
        snprintf(rank2, sizeof rank2, "%s.ps-worker-0", path2);
        assert_int_equal(rename(rank, path), 0); /* path2's worker 1 moves aside */
        TU_ERR(ctx, DSGD_ERR_IO, dsgd_strategy_restore(s2, path2, NULL));
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "ps-worker-1"));
        assert_int_equal(rename(path, rank), 0);
        snprintf(path, sizeof path, "%s/ps%d.ckpt.ps-worker-0", dir, apply);
        assert_int_equal(rename(path, rank2), 0); /* step K's worker 0 beside step STEPS's file */
        TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_strategy_restore(s2, path2, NULL));
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "two different saves"));
        print_message("    %s\n", dsgd_ctx_last_error(ctx));
        train_steps(ctx, s2, N, xs, ys, K + 1, STEPS);
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s2, 1), got, NPARAMS));
        assert_memory_equal(got, want[1], sizeof(got));
        dsgd_strategy_destroy(s2);
        print_message("%s: save at step %d goes on with the uninterrupted bits; a restore trains them too\n",
                      dsgd_ps_apply_name(a), K);
    }
    tu_rmdir_files(dir);
    rmdir(dir);
    dsgd_ctx_destroy(ctx);
    free(xs);
    tu_watchdog(0);
}

/* Every policy and placement at N = 1 (one worker: no arrival order, so
   every policy is deterministic) and 1 or 2 servers: a run saved at step
   STEPS / 2 and restored into a new strategy ends with the bits of the run
   never saved. The quick tier takes one server count per policy and
   placement, in turn (both counts for each policy but ASYNC, and in all);
   make test-full both for each. */
static void test_checkpoint_every_policy(void **state) {
    static const dsgd_ps_policy policies[4] = {DSGD_PS_ASYNC, DSGD_PS_SSP, DSGD_PS_SYNC, DSGD_PS_BACKUP};
    float *xs = tu_floats((size_t)STEPS * B * IN), ys[STEPS * B], want[NPARAMS], got[NPARAMS];
    char dir[64], path[128];
    dsgd_ctx *ctx = tu_ctx();
    tu_rng rng = tu_rng_make(58);
    int p, apply, servers, save, runs = 0;
    (void)state;
    tu_watchdog(180);
    tu_mkdtemp(dir);
    snprintf(path, sizeof path, "%s/one.ckpt", dir);
    make_batch(&rng, xs, ys, STEPS * B);
    for (p = 0; p < 4; ++p)
        for (apply = 0; apply < 2; ++apply)
            for (servers = 1; servers <= 2; ++servers) {
                dsgd_strategy_desc d = ps_desc(1, policies[p], apply ? DSGD_PS_APPLY_ON_WORKERS : DSGD_PS_APPLY_ON_SERVERS,
                                               DSGD_OPT_ADAM);
                if (policies[p] == DSGD_PS_ASYNC && apply) continue; /* summation only needs a clock */
                if (!tu_full() && servers != 1 + (p + apply) % 2) continue;
                d.ps.num_servers = servers;
                d.ps.backup_workers = 0;
                for (save = 0; save < 2; ++save) {
                    dsgd_strategy *s = NULL;
                    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
                    train_steps(ctx, s, 1, xs, ys, 0, STEPS / 2);
                    if (save) {
                        TU_OK(ctx, dsgd_strategy_save(s, path, NULL));
                        dsgd_strategy_destroy(s);
                        s = NULL;
                        TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
                        TU_OK(ctx, dsgd_strategy_restore(s, path, NULL));
                    }
                    train_steps(ctx, s, 1, xs, ys, STEPS / 2, STEPS);
                    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), save ? got : want, NPARAMS));
                    dsgd_strategy_destroy(s);
                }
                if (memcmp(got, want, sizeof got) != 0)
                    fail_msg("%s, apply %s, %d servers: the restored run differs (relative error %.3g)",
                             dsgd_ps_policy_name(policies[p]), dsgd_ps_apply_name(d.ps.apply), servers,
                             tu_rel_err(got, want, NPARAMS));
                runs++;
            }
    print_message("N = 1: %d policy x placement x servers settings (Adam) restore to the uninterrupted bits\n", runs);
    tu_rmdir_files(dir);
    rmdir(dir);
    dsgd_ctx_destroy(ctx);
    free(xs);
    tu_watchdog(0);
}

/* ---------------------------------------------------------------- errors */

static void test_errors(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    dsgd_transport_i ep;
    float x[2 * B * IN], y[2 * B];
    tu_rng rng = tu_rng_make(9);
    double t0;
    (void)state;
    tu_watchdog(60);
    d = ps_desc(2, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_SGD);
    d.gradient_path = DSGD_GRADIENTS_DEVICE;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "gradient_path DEVICE"));
    d = ps_desc(2, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_SGD);
    d.ps.num_servers = 0;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "num_servers is 0"));
    d = ps_desc(1, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_SGD);
    memset(&ep, 0, sizeof(ep));
    ep.size = 4;
    d.endpoints = &ep;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "without send, recv or probe"));
    d = ps_desc(2, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_SGD);
    d.optimizer.clip_norm = 1.0f;
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_create(ctx, &d, &s));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "clip_norm"));
    assert_null(s);
    /* a checkpoint is refused; a SUM variable fails the step at once */
    d = ps_desc(2, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_SGD);
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    TU_ERR(ctx, DSGD_ERR_IO, dsgd_strategy_save(s, "/nonexistent-dir/ps.ckpt", NULL));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "nothing was saved"));
    assert_false(dsgd_strategy_failed(s));
    TU_OK(ctx, dsgd_strategy_set_aggregation(s, "dense0/bias", DSGD_AGG_SUM, DSGD_SYNC_AUTO));
    make_batch(&rng, x, y, 2 * B);
    t0 = dsgd_now();
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_strategy_train_step(s, x, y, 2 * B, NULL));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "aggregate MEAN"));
    assert_true(dsgd_now() - t0 < 10.0); /* not the 20 s deadline */
    assert_true(dsgd_strategy_failed(s));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

/* A lost server: the strategy's two replicas are the workers of a group
   whose server's process is gone (nobody holds rank 0 of the hub). The
   step fails with DSGD_ERR_TIMEOUT naming server 0 within timeout_s (+ 2 s
   of slack), the strategy is failed, and neither the next step nor
   destroy waits for the server. */
static void test_lost_server(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_loopback *hub = NULL;
    dsgd_transport_i eps[3];
    dsgd_strategy_desc d;
    dsgd_strategy *s = NULL;
    float x[2 * B * IN], y[2 * B];
    tu_rng rng = tu_rng_make(17);
    const double timeout = TU_PICK(0.5, 0.2);
    double t0, dt;
    int i;
    (void)state;
    tu_watchdog(60);
    TU_OK(ctx, dsgd_loopback_create(ctx, 3, &hub));
    for (i = 0; i < 3; ++i) TU_OK(ctx, dsgd_loopback_endpoint(hub, i, &eps[i]));
    d = ps_desc(2, DSGD_PS_SYNC, DSGD_PS_APPLY_ON_SERVERS, DSGD_OPT_SGD);
    d.ps.num_servers = 1;
    d.timeout_s = timeout; /* nothing can come: how long the workers wait for nobody */
    d.endpoints = &eps[1];
    TU_OK(ctx, dsgd_strategy_create(ctx, &d, &s));
    make_batch(&rng, x, y, 2 * B);
    t0 = dsgd_now();
    TU_ERR(ctx, DSGD_ERR_TIMEOUT, dsgd_strategy_train_step(s, x, y, 2 * B, NULL));
    dt = dsgd_now() - t0;
    print_message("lost server: the step failed after %.3f s (timeout_s %g): \"%s\"\n", dt, timeout,
                  dsgd_ctx_last_error(ctx));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "server 0"));
    assert_true(dt >= timeout - 0.05 && dt < timeout + 2.0);
    assert_true(dsgd_strategy_failed(s));
    t0 = dsgd_now();
    assert_int_not_equal(dsgd_strategy_train_step(s, x, y, 2 * B, NULL), DSGD_OK);
    dsgd_strategy_destroy(s);
    assert_true(dsgd_now() - t0 < 0.5);
    dsgd_loopback_destroy(hub);
    dsgd_ctx_destroy(ctx);
    tu_watchdog(0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_every_policy_trains),
        cmocka_unit_test(test_sync_is_the_coordinators),
        cmocka_unit_test(test_checkpoint),
        cmocka_unit_test(test_checkpoint_every_policy),
        cmocka_unit_test(test_endpoints_as_processes),
        cmocka_unit_test(test_simnet_same_bits),
        cmocka_unit_test(test_lost_server),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
