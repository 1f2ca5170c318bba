/* mpi_ps.c - parameter servers across MPI processes (distsgd/ps.h over
   distsgd_mpi.h, roles from distsgd/mpi/ps.h), run under mpirun -np 4.

   Not a cmocka test: it is built with mpicc and run by
   tests/mpi_collectives.sh (make test-mpi) at np = 4, 2 servers + 2 workers.
     - Roles. No TF_CONFIG: the rank layout (the first 2 processes serve);
       "{}" is the same. A TF_CONFIG per process in a scrambled order
       (process 0 is worker 1, 1 is ps 1, 2 is the chief, 3 is ps 0): each
       gets its task's role, the chief is worker 0, and the new
       communicator orders the processes servers first (process 3, 1, 2, 0).
       Errors, on every process with the same result and message, *out
       zeroed: malformed JSON on process 2 only (DSGD_ERR_FORMAT naming
       process 2); a cluster of 5 tasks on 4 processes; two processes
       claiming ps 0; a process whose cluster differs from the others'; an
       evaluator; a worker index out of range (TF's rule, from the parser);
       the rank layout with 0 or 4 servers.
     - SYNC, the same bits as one process. Under the scrambled TF_CONFIG,
       2 servers (a FIXED_SHARDS partitioner cutting every variable in two,
       so each server holds half of each) and 2 workers train a small MLP
       with SGD momentum for STEPS steps, worker w computing on the fixed
       batches w, w + 2, w + 4, ... of a synthetic set; the chief then
       pulls. It also runs the same engine in-process, over a loopback hub
       of 4 ranks (a thread each), on the same batches, and compares: the
       same bits are expected (the servers sum the gradients in worker rank
       order, whatever the transport), and the weights must have moved.
       Each server's version is STEPS.
     - SYNC resumed across processes: the same run in two sessions on new
       transports; after the first half every rank saves its own file (a
       server its shards), and the second session's ranks restore from
       them (each worker's loop, dsgd_ps_worker_run, goes on from its
       restored clock to the same target): the chief's last pull equals the
       uninterrupted run's, bit for bit, and each server's version is
       STEPS.
     - ASYNC. Under the rank layout, 2 workers push ASYNC_STEPS gradients
       each; each server's version and new pushes equal 2 x ASYNC_STEPS
       (every push applied once, whatever resends the deadline caused), and
       the chief's pull after both workers finished has a lower loss on the
       whole set than the initial weights.
   Every process counts its checks and prints its failures; process 0 prints
   "N passed, N failed" after an MPI_Allreduce of the counts. A watchdog
   (alarm) ends a process that hangs. */
#define _POSIX_C_SOURCE 200809L
#include "../distsgd_mpi.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NP 4
#define SERVERS 2
#define WORKERS 2
#define IN 12
#define CLASSES 4
#define SAMPLES 256
#define BATCH 16
#define STEPS 12
#define ASYNC_STEPS 20
#define TIMEOUT_S 60.0

static int g_rank, g_size;
static long g_passed, g_failed;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static int check(int ok, const char *fmt, ...) {
    pthread_mutex_lock(&g_lock);
    if (ok) {
        g_passed++;
    } else {
        va_list ap;
        g_failed++;
        printf("process %d: FAIL ", g_rank);
        va_start(ap, fmt);
        vprintf(fmt, ap);
        va_end(ap);
        printf("\n");
        fflush(stdout);
    }
    pthread_mutex_unlock(&g_lock);
    return ok;
}

static void on_alarm(int sig) {
    static const char msg[] = "mpi_ps: watchdog expired, a call hung\n";
    (void)sig;
    if (write(2, msg, sizeof(msg) - 1) < 0) _exit(98);
    _exit(99);
}

/* ---------------------------------------------------------------- roles */

static void set_tf_config(const char *json) {
    if (json) setenv("TF_CONFIG", json, 1);
    else unsetenv("TF_CONFIG");
}

#define CLUSTER_22 "\"cluster\": {\"chief\": [\"h0:1\"], \"worker\": [\"h1:1\"], \"ps\": [\"h2:1\", \"h3:1\"]}"
/* The scrambled order: process p's task. */
static const char *const SCRAMBLED[NP] = {
    "{" CLUSTER_22 ", \"task\": {\"type\": \"worker\", \"index\": 0}}", /* worker 1 */
    "{" CLUSTER_22 ", \"task\": {\"type\": \"ps\", \"index\": 1}}",     /* server 1 */
    "{" CLUSTER_22 ", \"task\": {\"type\": \"chief\", \"index\": 0}}",  /* worker 0 */
    "{" CLUSTER_22 ", \"task\": {\"type\": \"ps\", \"index\": 0}}"};    /* server 0 */
static const int SCRAMBLED_RANK[NP] = {3, 1, 2, 0};

/* Every process must get `want` and a message holding both substrings. */
static void expect_fail(dsgd_ctx *ctx, const char *json, int num_servers, dsgd_result want, const char *sub1,
                        const char *sub2, const char *what) {
    dsgd_mpi_ps_role role;
    dsgd_result r;
    const char *m;
    int codes[NP], i, same = 1;
    set_tf_config(json);
    r = dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, num_servers, &role);
    m = dsgd_ctx_last_error(ctx);
    check(r == want, "%s: result %s, expected %s (%s)", what, dsgd_result_string(r), dsgd_result_string(want), m);
    check(strstr(m, sub1) && (!sub2 || strstr(m, sub2)), "%s: message \"%s\" lacks \"%s\"%s%s", what, m, sub1,
          sub2 ? " or " : "", sub2 ? sub2 : "");
    check(role.comm == MPI_COMM_NULL && role.num_servers == 0 && role.rank == 0, "%s: *out not zeroed", what);
    MPI_Allgather(&r, 1, MPI_INT, codes, 1, MPI_INT, MPI_COMM_WORLD);
    for (i = 1; i < g_size; ++i) same &= codes[i] == codes[0];
    check(same, "%s: the processes got different results", what);
    if (g_rank == 0 && r == want) printf("  %s: every process: %s\n", what, m);
    dsgd_mpi_ps_role_free(&role);
}

static void test_roles(dsgd_ctx *ctx) {
    dsgd_mpi_ps_role role;
    dsgd_result r;
    int order[NP], i, er = -1;
    char json[512];
    /* the rank layout, without TF_CONFIG and with "{}" */
    for (i = 0; i < 2; ++i) {
        set_tf_config(i ? "{}" : NULL);
        r = dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, SERVERS, &role);
        if (check(r == DSGD_OK, "layout%s: %s", i ? " ({})" : "", dsgd_ctx_last_error(ctx))) {
            check(role.is_server == (g_rank < SERVERS) && role.index == (g_rank < SERVERS ? g_rank : g_rank - SERVERS) &&
                      role.rank == g_rank && role.num_servers == SERVERS && role.num_workers == WORKERS &&
                      role.is_chief == (g_rank == SERVERS) && !role.from_tf_config,
                  "layout: role server %d index %d rank %d P %d W %d chief %d", role.is_server, role.index, role.rank,
                  role.num_servers, role.num_workers, role.is_chief);
            MPI_Comm_rank(role.comm, &er);
            check(er == g_rank, "layout: rank %d in the new communicator, expected %d", er, g_rank);
        }
        dsgd_mpi_ps_role_free(&role);
        check(role.comm == MPI_COMM_NULL, "dsgd_mpi_ps_role_free leaves MPI_COMM_NULL");
    }
    /* TF_CONFIG, scrambled */
    set_tf_config(SCRAMBLED[g_rank]);
    r = dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, 0, &role);
    if (check(r == DSGD_OK, "TF_CONFIG: %s", dsgd_ctx_last_error(ctx))) {
        int want = SCRAMBLED_RANK[g_rank];
        check(role.rank == want && role.is_server == (want < SERVERS) &&
                  role.index == (want < SERVERS ? want : want - SERVERS) && role.num_servers == SERVERS &&
                  role.num_workers == WORKERS && role.is_chief == (want == SERVERS) && role.from_tf_config,
              "TF_CONFIG: rank %d (expected %d), server %d, index %d, chief %d", role.rank, want, role.is_server,
              role.index, role.is_chief);
        MPI_Comm_rank(role.comm, &er);
        check(er == want, "TF_CONFIG: rank %d in the new communicator, expected %d", er, want);
        MPI_Allgather(&g_rank, 1, MPI_INT, order, 1, MPI_INT, role.comm);
        check(order[0] == 3 && order[1] == 1 && order[2] == 2 && order[3] == 0,
              "TF_CONFIG: engine order of the processes %d %d %d %d, expected 3 1 2 0", order[0], order[1], order[2],
              order[3]);
    }
    dsgd_mpi_ps_role_free(&role);

    /* errors, on every process */
    expect_fail(ctx, g_rank == 2 ? "{\"cluster\": {" : SCRAMBLED[g_rank], 0, DSGD_ERR_FORMAT, "process 2",
                "malformed JSON", "malformed TF_CONFIG on process 2");
    snprintf(json, sizeof(json),
             "{\"cluster\": {\"worker\": [\"a:1\", \"b:1\", \"c:1\"], \"ps\": [\"d:1\", \"e:1\"]}, "
             "\"task\": {\"type\": \"%s\", \"index\": %d}}", g_rank < 2 ? "ps" : "worker", g_rank < 2 ? g_rank : g_rank - 2);
    expect_fail(ctx, json, 0, DSGD_ERR_INVALID_ARGUMENT, "= 5 tasks", "has 4 processes", "5 tasks on 4 processes");
    expect_fail(ctx, g_rank == 3 ? SCRAMBLED[3] : SCRAMBLED[g_rank == 1 ? 3 : g_rank], 0, DSGD_ERR_INVALID_ARGUMENT,
                "processes 1 and 3 are both server 0", NULL, "ps 0 claimed twice");
    expect_fail(ctx,
                g_rank == 1 ? "{\"cluster\": {\"worker\": [\"a:1\", \"b:1\", \"c:1\"], \"ps\": [\"d:1\"]}, "
                              "\"task\": {\"type\": \"ps\", \"index\": 0}}"
                            : SCRAMBLED[g_rank],
                0, DSGD_ERR_INVALID_ARGUMENT, "disagree", "process 1 has 1 and 3", "a different cluster on process 1");
    expect_fail(ctx,
                g_rank == 3 ? "{\"cluster\": {\"chief\": [\"h0:1\"], \"worker\": [\"h1:1\"], \"ps\": [\"h2:1\", "
                              "\"h3:1\"], \"evaluator\": [\"e:1\"]}, \"task\": {\"type\": \"evaluator\", \"index\": 0}}"
                            : SCRAMBLED[g_rank],
                0, DSGD_ERR_INVALID_ARGUMENT, "process 3", "an evaluator runs apart", "an evaluator");
    expect_fail(ctx, g_rank == 0 ? "{" CLUSTER_22 ", \"task\": {\"type\": \"worker\", \"index\": 5}}" : SCRAMBLED[g_rank],
                0, DSGD_ERR_INVALID_ARGUMENT, "process 0", "index 5 exceeds", "worker index out of range");
    expect_fail(ctx, NULL, 0, DSGD_ERR_INVALID_ARGUMENT, "1 <= num_servers < 4", NULL, "rank layout, 0 servers");
    expect_fail(ctx, NULL, NP, DSGD_ERR_INVALID_ARGUMENT, "got num_servers 4", NULL, "rank layout, 4 servers");
    set_tf_config(NULL);
}

/* ---------------------------------------------------------------- training */

static const dsgd_layer_desc LAYERS[2] = {{16, DSGD_ACT_RELU, DSGD_INIT_AUTO}, {CLASSES, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

/* A synthetic set: x uniform in [-1, 1), the label the argmax of a fixed
   linear teacher, so a few dozen steps lower the loss. */
static float g_x[SAMPLES * IN], g_y[SAMPLES];

static void make_data(void) {
    uint64_t s = 12345;
    float teacher[CLASSES * IN];
    int i, j, c;
    for (i = 0; i < CLASSES * IN; ++i) teacher[i] = (float)dsgd_rng_uniform(&s) * 2.0f - 1.0f;
    for (i = 0; i < SAMPLES; ++i) {
        int best = 0;
        float bv = -1e30f;
        for (j = 0; j < IN; ++j)
            g_x[i * IN + j] = (float)dsgd_rng_uniform(&s) * 2.0f - 1.0f;
        for (c = 0; c < CLASSES; ++c) {
            float v = 0;
            for (j = 0; j < IN; ++j) v += teacher[c * IN + j] * g_x[i * IN + j];
            if (v > bv) bv = v, best = c;
        }
        g_y[i] = (float)best;
    }
}

typedef struct job {
    dsgd_ps_desc pd;
    dsgd_model_desc md;
    const dsgd_shard_map *map;
    const float *init;
    size_t np;
    int steps;             /* the workers' pushes in all (a restored worker goes on to it) */
    MPI_Comm workers_comm; /* ASYNC over MPI: the chief pulls once every worker finished; else MPI_COMM_NULL */
    const char *load_dir, *save_dir; /* checkpoints: each rank restores from, saves to, dir/rank<R>.ckpt */
    int no_final_pull;     /* the chief finishes without its last pull (before a save) */
} job;

static void rank_path(char *dst, size_t cap, const char *dir, int rank) {
    snprintf(dst, cap, "%s/rank%d.ckpt", dir, rank);
}

/* What one rank did. */
typedef struct rank_out {
    dsgd_result r;
    char msg[512];
    dsgd_ps_server_stats st;
    float *final; /* the chief's last pull (allocated by the caller) */
} rank_out;

static dsgd_model_desc model_desc(void) {
    dsgd_model_desc md;
    memset(&md, 0, sizeof(md));
    md.input_dim = IN;
    md.layers = LAYERS;
    md.num_layers = 2;
    md.max_batch = SAMPLES;
    md.seed = 7;
    return md;
}

/* A worker's gradient in dsgd_ps_worker_run: batch w + k W of the fixed
   set, at the pulled params. */
typedef struct rank_worker {
    const job *j;
    dsgd_model *m;
    int w, W;
} rank_worker;

static dsgd_result rank_grad(void *user, int64_t k, const float *params, float *grads) {
    rank_worker *rw = (rank_worker *)user;
    float x[BATCH * IN], y[BATCH];
    int i, b = rw->w + (int)k * rw->W;
    dsgd_result r;
    for (i = 0; i < BATCH; ++i) {
        int n = (b * BATCH + i) % SAMPLES;
        memcpy(x + i * IN, g_x + n * IN, sizeof(float) * IN);
        y[i] = g_y[n];
    }
    if ((r = dsgd_model_set_params(rw->m, params, rw->j->np)) != DSGD_OK) return r;
    if ((r = dsgd_model_compute_gradients(rw->m, x, y, BATCH, 1.0f / BATCH)) != DSGD_OK) return r;
    return dsgd_model_get_grads(rw->m, grads, rw->j->np);
}

/* One engine rank over endpoint t: a server serves; worker w runs the
   engine's loop (dsgd_ps_worker_run: pull, compute on batch w + k W, push)
   until it has pushed `steps` times in all (a restored worker goes on from
   its clock); the chief (worker 0) then pulls into out->final. The same
   code over MPI and the loopback. */
static void run_rank(dsgd_ctx *ctx, const dsgd_transport_i *t, const job *j, rank_out *o) {
    int P = j->pd.num_servers, W = j->pd.num_workers;
    char path[256];
    o->r = DSGD_OK;
    if (t->rank < P) {
        dsgd_ps_server *s = NULL;
        o->r = dsgd_ps_server_create(ctx, t, &j->pd, j->map, j->init, &s);
        if (o->r == DSGD_OK && j->load_dir) {
            rank_path(path, sizeof(path), j->load_dir, t->rank);
            o->r = dsgd_ps_server_restore(s, path);
        }
        if (o->r == DSGD_OK) o->r = dsgd_ps_server_serve(s);
        if (o->r == DSGD_OK && j->save_dir) {
            rank_path(path, sizeof(path), j->save_dir, t->rank);
            o->r = dsgd_ps_server_save(s, path);
        }
        dsgd_ps_server_get_stats(s, &o->st);
        dsgd_ps_server_destroy(s);
    } else {
        int w = t->rank - P;
        dsgd_ps_worker *pw = NULL;
        rank_worker rw;
        dsgd_ps_run_desc rd;
        memset(&rw, 0, sizeof(rw));
        rw.j = j;
        rw.w = w;
        rw.W = W;
        memset(&rd, 0, sizeof(rd));
        rd.steps = j->steps;
        rd.grad = rank_grad;
        rd.user = &rw;
        rd.num_floats = j->np;
        rd.no_finish = w == 0 && !j->no_final_pull; /* the chief pulls once more, then finishes */
        o->r = dsgd_model_create(ctx, &j->md, &rw.m);
        if (o->r == DSGD_OK) o->r = dsgd_ps_worker_create(ctx, t, &j->pd, j->map, &pw);
        if (o->r == DSGD_OK && j->load_dir) {
            rank_path(path, sizeof(path), j->load_dir, t->rank);
            o->r = dsgd_ps_worker_restore(pw, path);
        }
        if (o->r == DSGD_OK) o->r = dsgd_ps_worker_run(pw, &rd);
        if (j->workers_comm != MPI_COMM_NULL) MPI_Barrier(j->workers_comm);
        if (o->r == DSGD_OK && w == 0 && !j->no_final_pull) {
            memcpy(o->final, j->init, sizeof(float) * j->np);
            o->r = dsgd_ps_worker_pull(pw, o->final);
            if (o->r == DSGD_OK) o->r = dsgd_ps_worker_finish(pw);
        }
        if (o->r == DSGD_OK && j->save_dir) {
            rank_path(path, sizeof(path), j->save_dir, t->rank);
            o->r = dsgd_ps_worker_save(pw, path);
        }
        dsgd_ps_worker_destroy(pw);
        dsgd_model_destroy(rw.m);
    }
    if (o->r != DSGD_OK) {
        const char *m = dsgd_ctx_last_error(ctx);
        size_t n = strlen(m) < sizeof(o->msg) ? strlen(m) : sizeof(o->msg) - 1;
        memcpy(o->msg, m, n);
        o->msg[n] = '\0';
    }
}

/* The in-process reference: the same job over a loopback hub of P + W ranks. */
typedef struct ref_thread {
    const job *j;
    dsgd_transport_i ep;
    rank_out out;
} ref_thread;

static void *ref_main(void *arg) {
    ref_thread *rt = (ref_thread *)arg;
    dsgd_ctx *ctx = NULL;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) {
        rt->out.r = DSGD_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    run_rank(ctx, &rt->ep, rt->j, &rt->out);
    dsgd_ctx_destroy(ctx);
    return NULL;
}

static int run_reference(dsgd_ctx *ctx, const job *j, float *final) {
    dsgd_loopback *hub = NULL;
    ref_thread rt[NP];
    pthread_t th[NP];
    job jr = *j;
    int i, ok = 1;
    jr.workers_comm = MPI_COMM_NULL;
    memset(rt, 0, sizeof(rt));
    if (!check(dsgd_loopback_create(ctx, NP, &hub) == DSGD_OK, "loopback: %s", dsgd_ctx_last_error(ctx))) return 0;
    for (i = 0; i < NP; ++i) {
        rt[i].j = &jr;
        rt[i].out.final = final;
        dsgd_loopback_endpoint(hub, i, &rt[i].ep);
        pthread_create(&th[i], NULL, ref_main, &rt[i]);
    }
    for (i = 0; i < NP; ++i) pthread_join(th[i], NULL);
    for (i = 0; i < NP; ++i)
        ok &= check(rt[i].out.r == DSGD_OK, "reference rank %d: %s", i, rt[i].out.msg);
    dsgd_loopback_destroy(hub);
    return ok;
}

/* Mean loss of the flat weights p on the whole set. */
static double set_loss(dsgd_ctx *ctx, const float *p, size_t n) {
    dsgd_model_desc md = model_desc();
    dsgd_model *m = NULL;
    dsgd_metrics mt;
    double loss = -1;
    if (dsgd_model_create(ctx, &md, &m) == DSGD_OK && dsgd_model_set_params(m, p, n) == DSGD_OK &&
        dsgd_model_eval_batch(m, g_x, g_y, SAMPLES) == DSGD_OK &&
        dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt) == DSGD_OK)
        loss = mt.loss_sum / mt.count;
    dsgd_model_destroy(m);
    return loss;
}

/* SYNC in two sessions, each on a new transport: STEPS / 2 steps, after
   which every rank saves its own file (each server its shards, in its own
   process), then new servers and workers restored from their files run
   the other half. The chief's last pull equals the uninterrupted run's
   (want), bit for bit, and each server's version is STEPS. */
static void test_resume(dsgd_ctx *ctx, const job *full, const dsgd_mpi_ps_role *role, const float *want) {
    char dir[64] = "/tmp/dsgd_mpi_ps_XXXXXX", path[256];
    job half[2];
    rank_out o;
    dsgd_mpi_desc mdsc;
    dsgd_transport_i ep;
    float *final = (float *)malloc(sizeof(float) * full->np);
    int k;
    if (!final) dsgd_mpi_abort(1);
    if (g_rank == 0 && !mkdtemp(dir)) dir[0] = '\0';
    MPI_Bcast(dir, (int)sizeof(dir), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (!check(dir[0] != '\0', "resume: mkdtemp failed")) {
        free(final);
        return;
    }
    half[0] = half[1] = *full;
    half[0].steps = STEPS / 2;
    half[0].save_dir = dir;
    half[0].no_final_pull = 1;
    half[1].load_dir = dir;
    for (k = 0; k < 2; ++k) {
        memset(&o, 0, sizeof(o));
        o.final = final;
        memset(&mdsc, 0, sizeof(mdsc));
        mdsc.comm = role->comm;
        if (!check(dsgd_mpi_transport_create(ctx, &mdsc, &ep) == DSGD_OK, "resume: transport: %s",
                   dsgd_ctx_last_error(ctx)))
            dsgd_mpi_abort(1);
        run_rank(ctx, &ep, &half[k], &o);
        ep.destroy(ep.impl);
        if (!check(o.r == DSGD_OK, "resume, session %d: %s %d: %s", k + 1, role->is_server ? "server" : "worker",
                   role->index, o.msg))
            dsgd_mpi_abort(1);
    }
    if (role->is_server)
        check(o.st.version == STEPS, "resume: server %d version %lld, expected %d", role->index,
              (long long)o.st.version, STEPS);
    if (role->is_chief) {
        size_t i, diff = 0;
        for (i = 0; i < full->np; ++i) diff += memcmp(&final[i], &want[i], sizeof(float)) != 0;
        check(diff == 0, "resume: %zu of %zu floats differ from the uninterrupted run", diff, full->np);
        printf("  SYNC resumed: %d + %d steps, every rank restored from its own file in its own process: %zu floats "
               "differ from %d steps never interrupted\n", STEPS / 2, STEPS - STEPS / 2, diff, STEPS);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
        for (k = 0; k < NP; ++k) {
            rank_path(path, sizeof(path), dir, k);
            remove(path);
        }
        rmdir(dir);
    }
    free(final);
}

/* One run over MPI under the roles TF_CONFIG (or the layout) gives. */
static void test_train(dsgd_ctx *ctx, dsgd_ps_policy policy) {
    const char *name = dsgd_ps_policy_name(policy);
    dsgd_mpi_ps_role role;
    dsgd_mpi_desc mdsc;
    dsgd_transport_i ep;
    dsgd_model *m0 = NULL;
    dsgd_variable vars[8];
    dsgd_shard_map *map = NULL;
    dsgd_partitioner part;
    job j;
    rank_out o;
    float *init = NULL, *final = NULL, *ref = NULL;
    int i, nv;
    memset(&j, 0, sizeof(j));
    memset(&o, 0, sizeof(o));
    memset(&part, 0, sizeof(part));
    set_tf_config(policy == DSGD_PS_SYNC ? SCRAMBLED[g_rank] : NULL);
    if (dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, SERVERS, &role) != DSGD_OK) {
        check(0, "%s: roles: %s", name, dsgd_ctx_last_error(ctx));
        return; /* every process fails alike */
    }
    set_tf_config(NULL);
    j.md = model_desc();
    if (dsgd_model_create(ctx, &j.md, &m0) != DSGD_OK) dsgd_mpi_abort(1);
    j.np = dsgd_model_num_params(m0);
    nv = dsgd_model_num_variables(m0);
    init = (float *)malloc(sizeof(float) * j.np);
    final = (float *)malloc(sizeof(float) * j.np);
    ref = (float *)malloc(sizeof(float) * j.np);
    if (!init || !final || !ref || nv > 8) dsgd_mpi_abort(1);
    for (i = 0; i < nv; ++i) vars[i] = *dsgd_model_variable(m0, i);
    dsgd_model_get_params(m0, init, j.np);
    dsgd_model_destroy(m0);
    part.kind = DSGD_PARTITIONER_FIXED_SHARDS;
    part.num_shards = SERVERS; /* every variable in halves, one on each server */
    if (dsgd_shard_map_create(ctx, vars, nv, role.num_servers, &part, &map) != DSGD_OK) dsgd_mpi_abort(1);
    j.pd.num_servers = role.num_servers;
    j.pd.num_workers = role.num_workers;
    j.pd.policy = policy;
    j.pd.optimizer.kind = DSGD_OPT_MOMENTUM;
    j.pd.optimizer.lr = 0.05f;
    j.pd.timeout_s = TIMEOUT_S;
    j.pd.retry_s = 0.5;
    j.map = map;
    j.init = init;
    j.steps = policy == DSGD_PS_SYNC ? STEPS : ASYNC_STEPS;
    j.workers_comm = MPI_COMM_NULL;
    if (policy == DSGD_PS_ASYNC) MPI_Comm_split(role.comm, role.is_server ? 0 : 1, role.rank, &j.workers_comm);
    o.final = final;
    memset(&mdsc, 0, sizeof(mdsc));
    mdsc.comm = role.comm;
    if (!check(dsgd_mpi_transport_create(ctx, &mdsc, &ep) == DSGD_OK, "%s: transport: %s", name,
               dsgd_ctx_last_error(ctx)))
        dsgd_mpi_abort(1);
    check(ep.rank == role.rank && ep.size == NP, "%s: endpoint rank %d of %d, expected %d of %d", name, ep.rank,
          ep.size, role.rank, NP);
    run_rank(ctx, &ep, &j, &o);
    if (!check(o.r == DSGD_OK, "%s: %s %d: %s", name, role.is_server ? "server" : "worker", role.index, o.msg))
        dsgd_mpi_abort(1); /* a peer may wait for this rank: end the job */
    if (role.is_server) {
        int64_t want = policy == DSGD_PS_SYNC ? STEPS : (int64_t)WORKERS * ASYNC_STEPS;
        check(o.st.version == want, "%s: server %d version %lld, expected %lld", name, role.index,
              (long long)o.st.version, (long long)want);
        if (policy == DSGD_PS_ASYNC)
            check(o.st.pushes_received == want && o.st.pushes_applied == want,
                  "ASYNC: server %d received %lld and applied %lld pushes, expected %lld", role.index,
                  (long long)o.st.pushes_received, (long long)o.st.pushes_applied, (long long)want);
        printf("  %s: server %d (process %d): version %lld, pushes %lld, duplicates %lld, staleness mean %.2f max %lld\n",
               name, role.index, g_rank, (long long)o.st.version, (long long)o.st.pushes_received,
               (long long)o.st.duplicates, o.st.staleness_mean, (long long)o.st.staleness_max);
    } else if (role.is_chief) {
        size_t k, diff = 0, moved = 0;
        if (policy == DSGD_PS_SYNC) {
            if (run_reference(ctx, &j, ref)) {
                for (k = 0; k < j.np; ++k) {
                    diff += memcmp(&final[k], &ref[k], sizeof(float)) != 0;
                    moved += final[k] != init[k];
                }
                check(diff == 0, "SYNC: %zu of %zu floats differ from the one-process loopback run", diff, j.np);
                check(moved > j.np / 2, "SYNC: only %zu of %zu floats moved", moved, j.np);
                printf("  SYNC: chief (process %d): %zu floats, %zu differ from the loopback run of 4 ranks in one "
                       "process, %zu moved from the initial weights\n", g_rank, j.np, diff, moved);
            }
        } else {
            double l0 = set_loss(ctx, init, j.np), l1 = set_loss(ctx, final, j.np);
            check(l1 >= 0 && l1 < 0.9 * l0, "ASYNC: loss %.4f after %d pushes, initially %.4f", l1,
                  WORKERS * ASYNC_STEPS, l0);
            printf("  ASYNC: chief (process %d): loss on the set %.4f -> %.4f after %d pushes\n", g_rank, l0, l1,
                   WORKERS * ASYNC_STEPS);
        }
    }
    fflush(stdout);
    ep.destroy(ep.impl);
    if (policy == DSGD_PS_SYNC) test_resume(ctx, &j, &role, final);
    if (j.workers_comm != MPI_COMM_NULL) MPI_Comm_free(&j.workers_comm);
    dsgd_mpi_ps_role_free(&role);
    dsgd_shard_map_destroy(map);
    free(init);
    free(final);
    free(ref);
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx = NULL;
    long mine[2], all[2];
    signal(SIGALRM, on_alarm);
    alarm(240);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK) {
        fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx));
        dsgd_mpi_abort(1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (g_size != NP) {
        if (g_rank == 0) printf("mpi_ps: run with mpirun -np %d (got %d)\n0 passed, 1 failed\n", NP, g_size);
        MPI_Finalize();
        return 1;
    }
    make_data();
    if (g_rank == 0) printf("roles\n");
    test_roles(ctx);
    if (g_rank == 0) printf("SYNC, 2 servers + 2 workers, scrambled TF_CONFIG\n");
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    test_train(ctx, DSGD_PS_SYNC);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) printf("ASYNC, 2 servers + 2 workers, rank layout\n");
    fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    test_train(ctx, DSGD_PS_ASYNC);
    mine[0] = g_passed;
    mine[1] = g_failed;
    fflush(stdout);
    MPI_Allreduce(mine, all, 2, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (g_rank == 0) printf("%ld passed, %ld failed\n", all[0], all[1]);
    fflush(stdout);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return all[1] ? 1 : 0;
}
