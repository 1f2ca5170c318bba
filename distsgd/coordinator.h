/* distsgd/coordinator.h - the cluster coordinator: servers and workers as threads, closures scheduled on workers
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   CLUSTER COORDINATOR (TF's ParameterServerStrategy with ClusterCoordinator)

     dsgd_cluster_create starts the parameter-server engine (ps.h) in this
     process: P server threads, each serving the shards the partitioner
     gives it, and W worker threads, each with its own context ("worker w"),
     backend, model and dsgd_ps_worker, over one transport (a loopback of
     its own, or the P + W endpoints you give, servers first). The calling
     thread is the coordinator:

       dsgd_cluster_schedule(c, fn, user, &h)  queues a closure; the first
                                               idle worker runs fn(worker, user)
       dsgd_cluster_join(c)                    waits until every closure
                                               scheduled so far has run
       dsgd_cluster_fetch(c, h)                waits for closure h, returns
                                               its result
       dsgd_cluster_shutdown(c)                joins, lets every worker say
                                               goodbye, waits for the servers;
                                               then read the variables

     dsgd_cluster_schedule_on(c, w, ...) queues a closure for worker w
     alone. Free scheduling suits ASYNC and BACKUP; under SYNC and SSP every
     worker must push once per step, so give each step one closure per worker
     with schedule_on.

     A closure usually calls dsgd_cluster_worker_train_step: pull the
     variables into the worker's model, compute the mean gradient of a
     batch, push it; the servers apply it as the policy says. With
     desc.ps.apply ON_WORKERS (summation only, ps.h's WHO APPLIES THE
     UPDATE) the servers only sum: every worker's engine starts from the
     model's initial values and applies desc.ps.optimizer to its own copy
     as it pulls, the same code and bits; at shutdown each remaining worker
     fetches the last means, and dsgd_cluster_read_params reads a worker's
     copy. Each worker
     draws its own data: dsgd_cluster_worker_id says which worker runs the
     closure (for example, worker w takes the batches b with b % W == w of
     an epoch's order).

     Failures, as TF documents them:
       - A closure that returns an error keeps it as its result (fetch),
         and the error surfaces from the next schedule or join, as in TF:
         that call returns the first failure not yet surfaced, naming the
         closure and the worker (a schedule that returns it schedules
         nothing; a join surfaces every failure it waited for). The worker
         goes on, unless
         the worker's own engine failed (a deadline, a broken transport):
         then that worker stops taking closures.
       - A worker that is lost (dsgd_cluster_kill_worker, for tests and
         simulations) stops taking closures and tells the servers it is gone,
         so they do not wait for it. The closure it was running, if it did
         not complete, is scheduled again on another worker: a closure runs
         at least once, and one interrupted after its push was applied is new
         work, as in TF. Its queued closures stay queued for the others. With
         no worker left, join and fetch fail instead of waiting. Under SYNC
         and SSP the servers need every worker's gradient of every step, so
         a lost worker stops them at their deadline: going on without it is
         for ASYNC and BACKUP (b at least the workers lost).
       - A server that fails stops the run: the transport is aborted, and
         join, fetch and schedule return the server's error, naming it.
     Every wait has the engine's deadline (desc.ps.timeout_s), except
     join, fetch and shutdown, which wait for the closures themselves (each
     of whose pulls and pushes has that deadline).
*/
#ifndef DSGD__PART_COORDINATOR_DECL
#define DSGD__PART_COORDINATOR_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- coordinator */

typedef struct dsgd_cluster dsgd_cluster;
/* A worker as seen from inside a closure. */
typedef struct dsgd_cluster_worker dsgd_cluster_worker;
typedef dsgd_result (*dsgd_closure_fn)(dsgd_cluster_worker *worker, void *user_data);

typedef struct dsgd_cluster_desc {
    dsgd_ps_desc ps;               /* servers, workers, policy, optimizer, deadlines */
    dsgd_model_desc model;         /* every worker's model (and the variables'
                                      shapes and initial values, from model.seed);
                                      model.backend is ignored */
    dsgd_partitioner partitioner;  /* how variables are cut into shards; zero:
                                      whole variables, round-robin */
    dsgd_backend_factory backend_factory; /* the workers' backends; NULL: CPU */
    void *backend_user_data;
    /* P + W endpoints of one group (servers first), each with probe; NULL: a
       loopback hub of the cluster's own. The cluster copies the tables and
       uses endpoint i only from rank i's thread (abort from any). */
    const dsgd_transport_i *endpoints;
    int cpu_threads;               /* the workers' CPU backends (backend_factory
                                      NULL): threads of each; 0: dsgd_cpu_count()
                                      / W, at least 1 (the strategies' rule);
                                      1..DSGD_CPU_MAX_THREADS: that many. The
                                      weights do not depend on it */
} dsgd_cluster_desc;

/* Creates the cluster: the shard map, the P servers (their threads start
   serving) and the W workers (their threads wait for closures).
   Errors (recorded on ctx; a server's or worker's failure is copied from its
   context): DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing recorded; out or
   desc NULL; the ps desc, the model desc, the partitioner, as the engine and
   dsgd_model_create check them; cpu_threads out of range; endpoints of
   the wrong rank or size, or
   without send, recv or probe), DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_SYSTEM (a
   thread, lock or condition), backend errors, what backend_factory returns.
   Thread safety: ctx's thread, which is then the coordinator: every
   dsgd_cluster_* function but the worker ones is called from it. */
DSGD_API dsgd_result dsgd_cluster_create(dsgd_ctx *ctx, const dsgd_cluster_desc *desc, dsgd_cluster **out);
/* Shuts the cluster down if that was not done (its errors are dropped), joins
   every thread and frees everything; c NULL: nothing. When something failed,
   the transport is aborted first so that nobody waits out a deadline.
   Thread safety: the coordinator, not inside a closure. */
DSGD_API void dsgd_cluster_destroy(dsgd_cluster *c);

/* Queues fn(worker, user_data) to run once on some worker; *handle (may be
   NULL) names it for dsgd_cluster_fetch. Handles count from 0. When an
   earlier closure has failed and no schedule or join has returned that
   yet, nothing is queued and its error is returned (*handle = -1).
   Errors (recorded on the coordinator's ctx): DSGD_ERR_INVALID_ARGUMENT (c
   NULL, nothing recorded; fn NULL), DSGD_ERR_STATE (after shutdown),
   DSGD_ERR_ABORTED (no worker is left, or a server failed: the message
   names it), DSGD_ERR_OUT_OF_MEMORY, an earlier closure's error ("closure
   #h on worker w: ...").
   Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_schedule(dsgd_cluster *c, dsgd_closure_fn fn, void *user_data,
                                           int64_t *handle);
/* As dsgd_cluster_schedule, on worker `worker` (0..W-1) only; its closures
   run in the order scheduled, before any shared one. If that worker is
   lost, they go to the others. Under SYNC and SSP, where each worker must
   push once per step, schedule each step's closures one per worker so.
   Errors: as dsgd_cluster_schedule; DSGD_ERR_INVALID_ARGUMENT for a worker
   out of range. Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_schedule_on(dsgd_cluster *c, int worker, dsgd_closure_fn fn, void *user_data,
                                              int64_t *handle);
/* Waits until every closure scheduled so far has run.
   Errors: DSGD_ERR_INVALID_ARGUMENT (c NULL, nothing recorded); a server's
   error if one failed ("server s failed: ..."); DSGD_ERR_ABORTED when no
   worker is left with closures still queued; else the result of the first
   failed closure that no schedule or join returned yet, its message
   prefixed "closure #h on worker w: " (every other failure so far counts
   as surfaced with it); DSGD_OK.
   Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_join(dsgd_cluster *c);
/* Waits for closure `handle` and returns its result (its message copied to
   the coordinator's ctx, prefixed as in join).
   Errors: DSGD_ERR_INVALID_ARGUMENT (c NULL, nothing recorded; no such
   handle), a server's error, DSGD_ERR_ABORTED (no worker left before it
   ran), the closure's result.
   Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_fetch(dsgd_cluster *c, int64_t handle);
/* Makes worker w lost, as if its machine went away (fault injection for
   tests and simulations): at its next check (before a closure, or between
   the pull, the gradient and the push of dsgd_cluster_worker_train_step)
   it stops, puts an unfinished closure back in the queue, tells the servers
   it is gone and leaves. Returns at once.
   Errors: DSGD_ERR_INVALID_ARGUMENT (c NULL, nothing recorded; w out of
   range). Thread safety: any thread while c lives (a closure may kill its
   own worker). */
DSGD_API dsgd_result dsgd_cluster_kill_worker(dsgd_cluster *c, int w);
/* Joins, then lets every worker tell the servers it is done and waits until
   every server has stopped serving; afterwards only the getters below,
   dsgd_cluster_read_params and destroy may be called.
   Errors: as dsgd_cluster_join, then a server's failure ("server s failed:
   ..."); DSGD_ERR_STATE when called twice.
   Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_shutdown(dsgd_cluster *c);
/* Writes the servers' variables (the whole flat buffer of
   dsgd_cluster_num_params floats) into full; only after shutdown. With
   desc.ps.apply ON_WORKERS the servers hold none: it writes the copy of
   the first worker that fetched every published mean at shutdown (every
   worker not lost or failed does; they hold the same bits).
   Errors: DSGD_ERR_INVALID_ARGUMENT (c NULL, nothing recorded; full NULL),
   DSGD_ERR_STATE (before shutdown; ON_WORKERS with no such worker).
   Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_read_params(dsgd_cluster *c, float *full);
/* Getters (0 or NULL for c NULL or an index out of range):
     dsgd_cluster_num_params    floats of the flat parameter buffer
     dsgd_cluster_shard_map     the map the servers use
     dsgd_cluster_workers_alive workers not lost or failed (a worker is
                                lost from dsgd_cluster_kill_worker on; it
                                fails when its engine fails or a failed
                                server stops it); after shutdown, those
                                that said goodbye cleanly still count
   and the engine's counters of server s and worker w (zeros for c or out
   NULL; a server's only after shutdown).
   Errors: none. Thread safety: the coordinator, between closures (the
   worker counters: after join). */
DSGD_API size_t dsgd_cluster_num_params(const dsgd_cluster *c);
DSGD_API const dsgd_shard_map *dsgd_cluster_shard_map(const dsgd_cluster *c);
DSGD_API int dsgd_cluster_workers_alive(dsgd_cluster *c);
DSGD_API void dsgd_cluster_server_stats(const dsgd_cluster *c, int s, dsgd_ps_server_stats *out);
DSGD_API void dsgd_cluster_worker_stats(const dsgd_cluster *c, int w, dsgd_ps_worker_stats *out);

/* Inside a closure (on the worker's thread):
     dsgd_cluster_worker_id     0..W-1
     dsgd_cluster_worker_model  its model (its own backend and context)
     dsgd_cluster_worker_ps     its engine worker, to pull and push yourself
     dsgd_cluster_worker_ctx    its context ("worker w")
   Errors: none (-1 or NULL for w NULL). Thread safety: the worker's thread. */
DSGD_API int dsgd_cluster_worker_id(const dsgd_cluster_worker *w);
DSGD_API dsgd_model *dsgd_cluster_worker_model(dsgd_cluster_worker *w);
DSGD_API dsgd_ps_worker *dsgd_cluster_worker_ps(dsgd_cluster_worker *w);
DSGD_API dsgd_ctx *dsgd_cluster_worker_ctx(dsgd_cluster_worker *w);
/* Per-worker datasets (TF's create_per_worker_dataset): every worker draws
   its own shard of each epoch of ds. The epoch's shuffled order (a
   dsgd_sampler with seed: the same on every worker) is cut into batches of
   `batch` samples (the last, partial one dropped), and worker w takes
   batches w, w + W, w + 2W, ...: floor(batches / W) each per epoch, so the
   workers' shards are disjoint and the few batches left over are skipped.
   Workers then move on to the next epoch on their own. ds must outlive the
   cluster, or the next call. Call it while no closure runs (before the
   first schedule, or after a join); every worker starts over at epoch 0.
   Errors (recorded on the coordinator's ctx): DSGD_ERR_INVALID_ARGUMENT (c
   NULL, nothing recorded; ds NULL or empty, its dim not the model's input
   size, batch outside 1..model.max_batch, fewer batches than workers),
   DSGD_ERR_STATE (after shutdown).
   Thread safety: the coordinator. */
DSGD_API dsgd_result dsgd_cluster_set_dataset(dsgd_cluster *c, const dsgd_dataset *ds, int batch, uint64_t seed);
/* Inside a closure: the worker's next batch of its shard (see
   dsgd_cluster_set_dataset), gathered into buffers the worker owns, valid
   until its next call: *x (count, dim), *y (count, target_dim), *count;
   *epoch (may be NULL) is the epoch the batch belongs to.
   Errors (recorded on the worker's ctx): DSGD_ERR_INVALID_ARGUMENT (w NULL,
   nothing recorded; x, y or count NULL), DSGD_ERR_STATE (no dataset set),
   DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_cluster_worker_next_batch(dsgd_cluster_worker *w, const float **x, const float **y,
                                                    int *count, uint64_t *epoch);

/* One step of the worker: pulls the variables into its model, computes the
   gradient of the mean loss of x, y (count rows, at most model.max_batch),
   and pushes it. The loss and accuracy accumulate in the model's TRAIN
   metrics.
   Errors (recorded on the worker's ctx): DSGD_ERR_INVALID_ARGUMENT (w NULL,
   nothing recorded; x or y NULL, count outside 1..max_batch),
   DSGD_ERR_ABORTED (the worker was killed: the closure is scheduled again),
   the engine's errors (dsgd_ps_worker_pull, dsgd_ps_worker_push), model
   and backend errors.
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_cluster_worker_train_step(dsgd_cluster_worker *w, const float *x, const float *y,
                                                    int count);
/* Pulls the variables (as the policy allows) into full, a buffer of
   dsgd_cluster_num_params floats, e.g. to evaluate them while training.
   Errors: as dsgd_ps_worker_pull; DSGD_ERR_ABORTED (killed).
   Thread safety: the worker's thread. */
DSGD_API dsgd_result dsgd_cluster_worker_pull(dsgd_cluster_worker *w, float *full);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_COORDINATOR_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_COORDINATOR_IMPL)
#define DSGD__PART_COORDINATOR_IMPL

enum { DSGD__CL_QUEUED = 0, DSGD__CL_RUNNING = 1, DSGD__CL_DONE = 2 };

typedef struct dsgd__closure {
    dsgd_closure_fn fn;
    void *user;
    int state;  /* DSGD__CL_*, under the cluster's mu */
    int worker; /* the worker that ran it last */
    dsgd_result result;
    char *msg;  /* a failure's message (allocated), or NULL */
    int surfaced; /* its failure was returned by a schedule or a join */
} dsgd__closure;

/* A double-ended queue of closure handles (retries go in front). */
typedef struct dsgd__cl_queue {
    int64_t *q;
    int64_t head, tail, cap;
} dsgd__cl_queue;

struct dsgd_cluster_worker {
    dsgd_cluster *c;
    int id;
    dsgd__member m; /* its context, backend and model (group.h) */
    dsgd_ps_worker *psw;
    float *buf;      /* num_params floats: pulled parameters, then the gradient */
    pthread_t thread;
    int started;
    int killed;      /* atomic: set by dsgd_cluster_kill_worker */
    int gone;        /* under mu: the thread stopped taking closures */
    int retired;     /* under mu: it left at shutdown, neither lost nor
                        failed, and said goodbye (it still counts as alive) */
    int final;       /* apply ON_WORKERS: its copy holds every published mean
                        (written by its thread before it ends) */
    dsgd__cl_queue own; /* under mu: closures scheduled on this worker */
    /* its shard of the dataset (dsgd_cluster_set_dataset) */
    dsgd_sampler smp;
    uint64_t ds_gen;    /* the dataset generation smp was made for; 0: none */
    uint64_t ds_next;   /* its next batch: epoch * per_epoch + k */
    float *bx, *by;     /* the gathered batch */
};

typedef struct dsgd__cluster_server {
    struct dsgd_cluster *c;
    int id;
    dsgd__member m; /* its context (group.h) */
    dsgd_ps_server *srv;
    pthread_t thread;
    int started;
    dsgd_result result; /* of serve, once done */
    int done;           /* under mu */
} dsgd__cluster_server;

struct dsgd_cluster {
    dsgd_ctx *ctx;
    dsgd_cluster_desc d;
    int P, W;
    size_t num_params;
    dsgd_loopback *hub;
    dsgd_transport_i *eps;  /* P + W */
    dsgd_shard_map *map;
    dsgd__cluster_server *servers;
    dsgd_cluster_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    int sync_ready;
    dsgd__closure *cl;      /* every scheduled closure, by handle */
    int64_t ncl, capcl;
    dsgd__cl_queue shared;  /* closures any worker may run */
    int64_t pending;        /* queued + running */
    int64_t fail_first;     /* the first failed closure not yet surfaced, -1: none */
    int alive;              /* workers taking closures */
    int server_failed;      /* the first failed server + 1, 0: none */
    int abort_at_stop;      /* creation failed: stop without waiting for anyone */
    int stopping, down;
    /* the per-worker dataset: set by the coordinator while no closure runs */
    const dsgd_dataset *ds;
    int ds_batch;
    uint64_t ds_seed, ds_gen;
};

/* ---- the queues (under mu) */

static int dsgd__clq_empty(const dsgd__cl_queue *q) { return q->head == q->tail; }

static int dsgd__clq_grow(dsgd__cl_queue *q) {
    int64_t cap = q->cap ? 2 * q->cap : 64, n = q->tail - q->head;
    int64_t *nq = (int64_t *)DSGD_MALLOC(sizeof(int64_t) * (size_t)cap);
    if (!nq) return 0;
    /* the live part goes to the middle, so that retries can go in front */
    if (n) memcpy(nq + cap / 4, q->q + q->head, sizeof(int64_t) * (size_t)n);
    DSGD_FREE(q->q);
    q->q = nq;
    q->head = cap / 4;
    q->tail = cap / 4 + n;
    q->cap = cap;
    return 1;
}

/* Appends h (back), or puts it in front (a closure to retry first). */
static int dsgd__clq_put(dsgd__cl_queue *q, int64_t h, int front) {
    if ((front ? q->head == 0 : q->tail == q->cap) && !dsgd__clq_grow(q)) return 0;
    if (front) q->q[--q->head] = h;
    else q->q[q->tail++] = h;
    return 1;
}

static int64_t dsgd__clq_take(dsgd__cl_queue *q) { return q->q[q->head++]; }

/* Queues closure h on worker w's own queue (w >= 0) or the shared one. */
static int dsgd__cluster_enqueue(dsgd_cluster *c, int64_t h, int w, int front) {
    if (!dsgd__clq_put(w >= 0 ? &c->workers[w].own : &c->shared, h, front)) return 0;
    c->cl[h].state = DSGD__CL_QUEUED;
    return 1;
}

/* ---- the threads */

static void dsgd__cluster_abort(dsgd_cluster *c) {
    int i;
    for (i = 0; i < c->P + c->W; ++i)
        if (c->eps[i].abort) {
            c->eps[i].abort(c->eps[i].impl);
            return;
        }
}

/* A server's thread: serves until every worker is done. A failure stops
   the run: the transport is aborted so that nobody waits for this server
   until a deadline. */
static void *dsgd__cluster_server_main(void *arg) {
    dsgd__cluster_server *sv = (dsgd__cluster_server *)arg;
    dsgd_cluster *c = sv->c;
    dsgd_result r = dsgd_ps_server_serve(sv->srv);
    int stop_all;
    pthread_mutex_lock(&c->mu);
    sv->result = r;
    sv->done = 1;
    stop_all = r != DSGD_OK && !c->stopping;
    if (stop_all && !c->server_failed) c->server_failed = sv->id + 1;
    pthread_cond_broadcast(&c->cv_done);
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    if (stop_all) dsgd__cluster_abort(c);
    return NULL;
}

static int dsgd__cluster_killed(const dsgd_cluster_worker *w) { return DSGD__LOAD_ACQ(&w->killed); }


/* The next closure for worker w (-1: leave), under mu: waits while the
   queue is empty and the cluster runs. */
static int64_t dsgd__cluster_take(dsgd_cluster *c, dsgd_cluster_worker *w) {
    int64_t h;
    while (dsgd__clq_empty(&w->own) && dsgd__clq_empty(&c->shared) && !c->stopping && !dsgd__cluster_killed(w) &&
           !c->server_failed)
        pthread_cond_wait(&c->cv_work, &c->mu);
    if (dsgd__cluster_killed(w) || c->server_failed) return -1;
    if (!dsgd__clq_empty(&w->own)) h = dsgd__clq_take(&w->own);
    else if (!dsgd__clq_empty(&c->shared)) h = dsgd__clq_take(&c->shared);
    else return -1;
    c->cl[h].state = DSGD__CL_RUNNING;
    c->cl[h].worker = w->id;
    return h;
}

/* Records closure h's end, under mu: done with its result, or back in the
   queue when its worker was killed before it completed. */
static void dsgd__cluster_finish_closure(dsgd_cluster *c, dsgd_cluster_worker *w, int64_t h, dsgd_result r) {
    dsgd__closure *k = &c->cl[h];
    if (r != DSGD_OK && dsgd__cluster_killed(w) && dsgd__cluster_enqueue(c, h, -1, 1)) {
        pthread_cond_broadcast(&c->cv_work);
        return;
    }
    k->state = DSGD__CL_DONE;
    k->result = r;
    if (r != DSGD_OK) {
        const char *m = dsgd_ctx_last_error(w->m.ctx);
        size_t len = strlen(m);
        k->msg = (char *)DSGD_MALLOC(len + 1);
        if (k->msg) memcpy(k->msg, m, len + 1);
        if (c->fail_first < 0 || h < c->fail_first) c->fail_first = h;
    }
    c->pending--;
    pthread_cond_broadcast(&c->cv_done);
}

/* A worker's thread: runs closures until the cluster stops, the worker is
   killed or its engine fails; then says goodbye to the servers. */
static void *dsgd__cluster_worker_main(void *arg) {
    dsgd_cluster_worker *w = (dsgd_cluster_worker *)arg;
    dsgd_cluster *c = w->c;
    int last;
    for (;;) {
        dsgd__closure k;
        dsgd_result r;
        int64_t h;
        pthread_mutex_lock(&c->mu);
        h = dsgd__cluster_take(c, w);
        if (h >= 0) k = c->cl[h];
        pthread_mutex_unlock(&c->mu);
        if (h < 0) break;
        r = k.fn(w, k.user);
        pthread_mutex_lock(&c->mu);
        dsgd__cluster_finish_closure(c, w, h, r);
        pthread_mutex_unlock(&c->mu);
        if (r != DSGD_OK && dsgd_ps_worker_failed(w->psw)) break;
    }
    pthread_mutex_lock(&c->mu);
    while (!dsgd__clq_empty(&w->own)) { /* its own closures go to the others */
        int64_t h = dsgd__clq_take(&w->own);
        if (!dsgd__cluster_enqueue(c, h, -1, 0)) { /* no memory: it fails instead */
            c->cl[h].state = DSGD__CL_DONE;
            c->cl[h].result = DSGD_ERR_OUT_OF_MEMORY;
            c->pending--;
        }
    }
    w->gone = 1;
    c->alive--;
    last = c->stopping && !c->server_failed && !dsgd__cluster_killed(w);
    pthread_cond_broadcast(&c->cv_work);
    pthread_cond_broadcast(&c->cv_done);
    pthread_mutex_unlock(&c->mu);
    /* the goodbye; apply ON_WORKERS, finish first fetches the means of every
       step pushed, so the copy is dsgd_cluster_read_params's */
    if (!dsgd_ps_worker_failed(w->psw)) {
        int said = dsgd_ps_worker_finish(w->psw) == DSGD_OK;
        if (last && !dsgd__ps_apply_of(&c->d.ps)->servers_hold) w->final = said;
    }
    if (last && !dsgd_ps_worker_failed(w->psw)) { /* a clean goodbye: still alive for the getter */
        pthread_mutex_lock(&c->mu);
        w->retired = 1;
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* ---- creation */

static dsgd_result dsgd__cluster_check(dsgd_ctx *ctx, const dsgd_cluster_desc *d) {
    const char *what = "dsgd_cluster_create";
    int i, n = d->ps.num_servers + d->ps.num_workers;
    if (d->ps.num_servers < 1 || d->ps.num_workers < 1 || n > 4096)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d servers and %d workers (need >= 1 each, "
                                  "4096 ranks at most)", what, d->ps.num_servers, d->ps.num_workers);
    if (d->cpu_threads < 0 || d->cpu_threads > DSGD_CPU_MAX_THREADS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: %d CPU threads per worker (0..%d)", what,
                                  d->cpu_threads, DSGD_CPU_MAX_THREADS);
    for (i = 0; d->endpoints && i < n; ++i) {
        const dsgd_transport_i *t = &d->endpoints[i];
        if (t->rank != i || t->size != n || !t->send || !t->recv || !t->probe)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: endpoints[%d] is rank %d of %d%s; rank %d of %d with send, recv and "
                                      "probe is needed", what, i, t->rank, t->size,
                                      t->send && t->recv && t->probe ? "" : " without send, recv or probe", i, n);
    }
    return DSGD_OK;
}

/* The shard map over the variables of the desc's model, whose initial
   values go to *init. */
static dsgd_result dsgd__cluster_map(dsgd_cluster *c, float **init) {
    return dsgd__shard_map_for_model(c->ctx, &c->d.model, c->P, &c->d.partitioner, init, &c->num_params, &c->map);
}

/* The endpoints: the desc's, or a loopback of the cluster's own. */
static dsgd_result dsgd__cluster_transport(dsgd_cluster *c) {
    int n = c->P + c->W;
    c->eps = (dsgd_transport_i *)dsgd__alloc(c->ctx, sizeof(dsgd_transport_i) * (size_t)n, "dsgd_cluster_create");
    if (!c->eps) return DSGD_ERR_OUT_OF_MEMORY;
    return dsgd__group_endpoints(c->ctx, c->d.endpoints, n, &c->hub, c->eps);
}

/* Copies a failure's message from a member's context to the coordinator's. */
static dsgd_result dsgd__cluster_copy_error(dsgd_cluster *c, dsgd_ctx *from, dsgd_result r) {
    if (r != DSGD_OK && from && dsgd_ctx_last_result(from) != DSGD_OK)
        dsgd_ctx_set_error(c->ctx, r, "%s", dsgd_ctx_last_error(from));
    return r;
}

/* Server s and worker i are members of the rank group (group.h): their
   contexts, and a worker's backend (backend_factory's, or a CPU backend of
   desc.cpu_threads, by default the cores shared out among the workers)
   and model. */
static dsgd__member_desc dsgd__cluster_member(const dsgd_cluster *c, int worker) {
    dsgd__member_desc md;
    memset(&md, 0, sizeof(md));
    md.role = worker ? "worker" : "server";
    if (!worker) return md;
    md.model = &c->d.model;
    md.factory = c->d.backend_factory;
    md.factory_user = c->d.backend_user_data;
    md.cpu_threads = dsgd__group_cpu_threads(c->d.cpu_threads, c->W);
    return md;
}

static dsgd_result dsgd__cluster_server_create(dsgd_cluster *c, int s, const float *init) {
    dsgd__cluster_server *sv = &c->servers[s];
    dsgd__member_desc md = dsgd__cluster_member(c, 0);
    dsgd_result r;
    sv->c = c;
    sv->id = s;
    if ((r = dsgd__member_create(c->ctx, &md, s, &sv->m)) != DSGD_OK) return r;
    r = dsgd_ps_server_create(sv->m.ctx, &c->eps[s], &c->d.ps, c->map, init, &sv->srv);
    return dsgd__cluster_copy_error(c, sv->m.ctx, r);
}

static dsgd_result dsgd__cluster_worker_create(dsgd_cluster *c, int i, const float *init) {
    dsgd_cluster_worker *w = &c->workers[i];
    dsgd__member_desc md = dsgd__cluster_member(c, 1);
    dsgd_result r;
    w->c = c;
    w->id = i;
    if ((r = dsgd__member_create(c->ctx, &md, i, &w->m)) != DSGD_OK) return r;
    r = dsgd_ps_worker_create(w->m.ctx, &c->eps[c->P + i], &c->d.ps, c->map, &w->psw);
    if (r == DSGD_OK && !dsgd__ps_apply_of(&c->d.ps)->servers_hold) r = dsgd_ps_worker_set_params(w->psw, init);
    if (r == DSGD_OK && !(w->buf = (float *)dsgd__alloc(w->m.ctx, sizeof(float) * c->num_params, "dsgd_cluster_create")))
        r = DSGD_ERR_OUT_OF_MEMORY;
    return dsgd__cluster_copy_error(c, w->m.ctx, r);
}

static dsgd_result dsgd__cluster_start(dsgd_cluster *c) {
    const char *what = "dsgd_cluster_create";
    dsgd_result r;
    int i;
    if ((r = dsgd__lock_init(c->ctx, &c->mu, &c->cv_work, &c->cv_done, what)) != DSGD_OK) return r;
    c->sync_ready = 1;
    for (i = 0; i < c->P; ++i) {
        if (pthread_create(&c->servers[i].thread, NULL, dsgd__cluster_server_main, &c->servers[i]) != 0)
            return dsgd_ctx_set_error(c->ctx, DSGD_ERR_SYSTEM, "%s: cannot start server %d's thread", what, i);
        c->servers[i].started = 1;
    }
    for (i = 0; i < c->W; ++i) {
        if (pthread_create(&c->workers[i].thread, NULL, dsgd__cluster_worker_main, &c->workers[i]) != 0)
            return dsgd_ctx_set_error(c->ctx, DSGD_ERR_SYSTEM, "%s: cannot start worker %d's thread", what, i);
        c->workers[i].started = 1;
        c->alive++;
    }
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cluster_create(dsgd_ctx *ctx, const dsgd_cluster_desc *desc, dsgd_cluster **out) {
    const char *what = "dsgd_cluster_create";
    dsgd_cluster *c;
    float *init = NULL;
    dsgd_result r;
    int i;
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", what);
    *out = NULL;
    if (!desc) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: desc is NULL", what);
    if ((r = dsgd__cluster_check(ctx, desc)) != DSGD_OK) return r;
    if (!(c = (dsgd_cluster *)dsgd__alloc(ctx, sizeof(*c), what))) return DSGD_ERR_OUT_OF_MEMORY;
    memset(c, 0, sizeof(*c));
    c->ctx = ctx;
    c->d = *desc;
    c->P = desc->ps.num_servers;
    c->W = desc->ps.num_workers;
    c->fail_first = -1;
    if (c->d.model.max_batch == 0) c->d.model.max_batch = DSGD_DEFAULT_MAX_BATCH;
    c->servers = (dsgd__cluster_server *)dsgd__alloc(ctx, sizeof(dsgd__cluster_server) * (size_t)c->P, what);
    c->workers = (dsgd_cluster_worker *)dsgd__alloc(ctx, sizeof(dsgd_cluster_worker) * (size_t)c->W, what);
    r = c->servers && c->workers ? DSGD_OK : DSGD_ERR_OUT_OF_MEMORY;
    if (r == DSGD_OK) {
        memset(c->servers, 0, sizeof(dsgd__cluster_server) * (size_t)c->P);
        memset(c->workers, 0, sizeof(dsgd_cluster_worker) * (size_t)c->W);
        r = dsgd__cluster_map(c, &init);
    }
    if (r == DSGD_OK) r = dsgd__cluster_transport(c);
    for (i = 0; r == DSGD_OK && i < c->P; ++i) r = dsgd__cluster_server_create(c, i, init);
    for (i = 0; r == DSGD_OK && i < c->W; ++i) r = dsgd__cluster_worker_create(c, i, init);
    DSGD_FREE(init);
    if (r == DSGD_OK) r = dsgd__cluster_start(c);
    if (r != DSGD_OK) {
        c->abort_at_stop = 1;
        dsgd_cluster_destroy(c);
        return r;
    }
    *out = c;
    return DSGD_OK;
}

/* ---- running closures */

/* The run's fatal state, under mu: a failed server (named), or no worker
   left while closures wait. */
static dsgd_result dsgd__cluster_fatal(dsgd_cluster *c, const char *what) {
    if (c->server_failed > 0) {
        dsgd__cluster_server *sv = &c->servers[c->server_failed - 1];
        return dsgd_ctx_set_error(c->ctx, sv->result, "%s: server %d failed: %s", what, sv->id,
                                  dsgd_ctx_last_error(sv->m.ctx));
    }
    if (c->alive == 0 && c->pending > 0)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_ABORTED, "%s: no worker is left; %lld closure(s) did not run",
                                  what, (long long)c->pending);
    return DSGD_OK;
}

/* Copies closure h's failure to the coordinator's ctx. */
static dsgd_result dsgd__cluster_closure_error(dsgd_cluster *c, int64_t h, const char *what) {
    const dsgd__closure *k = &c->cl[h];
    return dsgd_ctx_set_error(c->ctx, k->result, "%s: closure #%lld on worker %d: %s", what, (long long)h, k->worker,
                              k->msg ? k->msg : dsgd_result_string(k->result));
}

/* Returns the first failure not yet surfaced (under mu) and marks it; all
   of them when `all` (a join reports one error for everything it waited
   for). DSGD_OK when there is none. */
static dsgd_result dsgd__cluster_surface(dsgd_cluster *c, int all, const char *what) {
    int64_t h = c->fail_first, k;
    dsgd_result r;
    if (h < 0) return DSGD_OK;
    r = dsgd__cluster_closure_error(c, h, what);
    c->cl[h].surfaced = 1;
    c->fail_first = -1;
    for (k = h + 1; k < c->ncl; ++k) {
        dsgd__closure *q = &c->cl[k];
        if (q->state != DSGD__CL_DONE || q->result == DSGD_OK || q->surfaced) continue;
        if (!all) {
            c->fail_first = k;
            break;
        }
        q->surfaced = 1;
    }
    return r;
}

/* Schedules on worker w's own queue, or (w < 0) the shared one. */
static dsgd_result dsgd__cluster_schedule(dsgd_cluster *c, int w, dsgd_closure_fn fn, void *user_data,
                                         int64_t *handle, const char *what) {
    dsgd_result r = DSGD_OK;
    if (handle) *handle = -1;
    if (!fn) return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: fn is NULL", what);
    if (w >= c->W) return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: no worker %d", what, w);
    pthread_mutex_lock(&c->mu);
    if (w >= 0 && c->workers[w].gone) w = -1; /* lost: any other worker runs it */
    if (c->stopping) r = dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE, "%s: the cluster was shut down", what);
    if (r == DSGD_OK && c->alive == 0)
        r = dsgd_ctx_set_error(c->ctx, DSGD_ERR_ABORTED, "%s: no worker is left", what);
    if (r == DSGD_OK) r = dsgd__cluster_fatal(c, what);
    if (r == DSGD_OK) r = dsgd__cluster_surface(c, 0, what); /* an earlier closure's failure: not scheduled */
    if (r == DSGD_OK && c->ncl == c->capcl) {
        int64_t cap = c->capcl ? 2 * c->capcl : 64;
        dsgd__closure *n = (dsgd__closure *)DSGD_REALLOC(c->cl, sizeof(dsgd__closure) * (size_t)cap);
        if (n) {
            c->cl = n;
            c->capcl = cap;
        } else {
            r = dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot grow the closure table", what);
        }
    }
    if (r == DSGD_OK) {
        dsgd__closure *k = &c->cl[c->ncl];
        memset(k, 0, sizeof(*k));
        k->fn = fn;
        k->user = user_data;
        k->worker = -1;
        if (!dsgd__cluster_enqueue(c, c->ncl, w, 0)) {
            r = dsgd_ctx_set_error(c->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot grow the queue", what);
        } else {
            if (handle) *handle = c->ncl;
            c->ncl++;
            c->pending++;
            pthread_cond_broadcast(&c->cv_work);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

DSGD_API dsgd_result dsgd_cluster_schedule(dsgd_cluster *c, dsgd_closure_fn fn, void *user_data, int64_t *handle) {
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd__cluster_schedule(c, -1, fn, user_data, handle, "dsgd_cluster_schedule");
}

DSGD_API dsgd_result dsgd_cluster_schedule_on(dsgd_cluster *c, int worker, dsgd_closure_fn fn, void *user_data,
                                              int64_t *handle) {
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if (worker < 0) {
        if (handle) *handle = -1;
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cluster_schedule_on: no worker %d", worker);
    }
    return dsgd__cluster_schedule(c, worker, fn, user_data, handle, "dsgd_cluster_schedule_on");
}

DSGD_API dsgd_result dsgd_cluster_join(dsgd_cluster *c) {
    const char *what = "dsgd_cluster_join";
    dsgd_result r;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    while (c->pending > 0 && c->alive > 0 && !c->server_failed) pthread_cond_wait(&c->cv_done, &c->mu);
    r = dsgd__cluster_fatal(c, what);
    if (r == DSGD_OK) r = dsgd__cluster_surface(c, 1, what);
    pthread_mutex_unlock(&c->mu);
    return r;
}

DSGD_API dsgd_result dsgd_cluster_fetch(dsgd_cluster *c, int64_t handle) {
    const char *what = "dsgd_cluster_fetch";
    dsgd_result r = DSGD_OK;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&c->mu);
    if (handle < 0 || handle >= c->ncl) {
        r = dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: no closure #%lld", what, (long long)handle);
    } else {
        while (c->cl[handle].state != DSGD__CL_DONE && c->alive > 0 && !c->server_failed)
            pthread_cond_wait(&c->cv_done, &c->mu);
        if (c->cl[handle].state == DSGD__CL_DONE)
            r = c->cl[handle].result == DSGD_OK ? DSGD_OK : dsgd__cluster_closure_error(c, handle, what);
        else
            r = dsgd__cluster_fatal(c, what);
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

DSGD_API dsgd_result dsgd_cluster_kill_worker(dsgd_cluster *c, int w) {
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if (w < 0 || w >= c->W)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cluster_kill_worker: no worker %d", w);
    pthread_mutex_lock(&c->mu);
    DSGD__STORE_REL(&c->workers[w].killed, 1);
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    return DSGD_OK;
}

/* Stops the worker threads (after the queue drained) and waits for the
   servers; aborts the transport first when a server failed or a worker
   could not say goodbye (its engine failed: the servers would wait for
   it). A killed worker's thread still says goodbye, so the servers end
   cleanly: aborting then would race with their last replies. */
static void dsgd__cluster_stop(dsgd_cluster *c) {
    int i, failed;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    failed = c->server_failed != 0;
    pthread_cond_broadcast(&c->cv_work);
    pthread_mutex_unlock(&c->mu);
    for (i = 0; i < c->W; ++i)
        if (c->workers[i].started) {
            pthread_join(c->workers[i].thread, NULL);
            c->workers[i].started = 0;
        }
    for (i = 0; i < c->W; ++i) failed |= dsgd_ps_worker_failed(c->workers[i].psw);
    if (failed) dsgd__cluster_abort(c);
    for (i = 0; i < c->P; ++i)
        if (c->servers[i].started) {
            pthread_join(c->servers[i].thread, NULL);
            c->servers[i].started = 0;
        }
    c->down = 1;
}

DSGD_API dsgd_result dsgd_cluster_shutdown(dsgd_cluster *c) {
    const char *what = "dsgd_cluster_shutdown";
    dsgd_result r;
    int i;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if (c->down) return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE, "%s: called twice", what);
    r = dsgd_cluster_join(c);
    dsgd__cluster_stop(c);
    for (i = 0; r == DSGD_OK && i < c->P; ++i)
        if (c->servers[i].result != DSGD_OK)
            r = dsgd_ctx_set_error(c->ctx, c->servers[i].result, "%s: server %d failed: %s", what, i,
                                   dsgd_ctx_last_error(c->servers[i].m.ctx));
    return r;
}

DSGD_API void dsgd_cluster_destroy(dsgd_cluster *c) {
    int64_t h;
    int i;
    if (!c) return;
    if (c->sync_ready && !c->down) {
        if (c->abort_at_stop) dsgd__cluster_abort(c);
        dsgd__cluster_stop(c);
    }
    for (i = 0; c->workers && i < c->W; ++i) {
        dsgd_cluster_worker *w = &c->workers[i];
        dsgd_ps_worker_destroy(w->psw);
        DSGD_FREE(w->buf);
        DSGD_FREE(w->own.q);
        dsgd_sampler_free(&w->smp);
        DSGD_FREE(w->bx);
        DSGD_FREE(w->by);
        dsgd__member_destroy(&w->m);
    }
    for (i = 0; c->servers && i < c->P; ++i) {
        dsgd_ps_server_destroy(c->servers[i].srv);
        dsgd__member_destroy(&c->servers[i].m);
    }
    for (h = 0; h < c->ncl; ++h) DSGD_FREE(c->cl[h].msg);
    if (c->sync_ready) {
        pthread_cond_destroy(&c->cv_work);
        pthread_cond_destroy(&c->cv_done);
        pthread_mutex_destroy(&c->mu);
    }
    dsgd_shard_map_destroy(c->map);
    dsgd_loopback_destroy(c->hub);
    DSGD_FREE(c->eps);
    DSGD_FREE(c->cl);
    DSGD_FREE(c->shared.q);
    DSGD_FREE(c->workers);
    DSGD_FREE(c->servers);
    DSGD_FREE(c);
}

DSGD_API dsgd_result dsgd_cluster_read_params(dsgd_cluster *c, float *full) {
    const char *what = "dsgd_cluster_read_params";
    dsgd_result r = DSGD_OK;
    int i;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if (!full) return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: full is NULL", what);
    if (!c->down) return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE, "%s: only after dsgd_cluster_shutdown", what);
    if (!dsgd__ps_apply_of(&c->d.ps)->servers_hold) { /* the servers only sum: the first final worker's copy */
        for (i = 0; i < c->W; ++i)
            if (c->workers[i].final)
                return dsgd__cluster_copy_error(c, c->workers[i].m.ctx, dsgd_ps_worker_read_params(c->workers[i].psw, full));
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE,
                                  "%s: the servers only sum (apply ON_WORKERS) and no worker fetched the last means at "
                                  "shutdown (every worker was lost or failed)", what);
    }
    for (i = 0; i < c->P && r == DSGD_OK; ++i)
        r = dsgd__cluster_copy_error(c, c->servers[i].m.ctx, dsgd_ps_server_read_params(c->servers[i].srv, full));
    return r;
}

DSGD_API size_t dsgd_cluster_num_params(const dsgd_cluster *c) { return c ? c->num_params : 0; }
DSGD_API const dsgd_shard_map *dsgd_cluster_shard_map(const dsgd_cluster *c) { return c ? c->map : NULL; }

DSGD_API int dsgd_cluster_workers_alive(dsgd_cluster *c) {
    int n = 0, i;
    if (!c) return 0;
    pthread_mutex_lock(&c->mu);
    /* a killed worker is lost from the kill on, even before its thread
       notices and leaves; one that left at shutdown without failing counts */
    for (i = 0; i < c->W; ++i)
        n += (!c->workers[i].gone || c->workers[i].retired) && !dsgd__cluster_killed(&c->workers[i]);
    pthread_mutex_unlock(&c->mu);
    return n;
}

DSGD_API void dsgd_cluster_server_stats(const dsgd_cluster *c, int s, dsgd_ps_server_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof(*out));
    if (c && c->down && s >= 0 && s < c->P) dsgd_ps_server_get_stats(c->servers[s].srv, out);
}

DSGD_API void dsgd_cluster_worker_stats(const dsgd_cluster *c, int w, dsgd_ps_worker_stats *out) {
    if (!out) return;
    memset(out, 0, sizeof(*out));
    if (c && w >= 0 && w < c->W) dsgd_ps_worker_get_stats(c->workers[w].psw, out);
}

/* ---- inside a closure */

DSGD_API int dsgd_cluster_worker_id(const dsgd_cluster_worker *w) { return w ? w->id : -1; }
DSGD_API dsgd_model *dsgd_cluster_worker_model(dsgd_cluster_worker *w) { return w ? w->m.model : NULL; }
DSGD_API dsgd_ps_worker *dsgd_cluster_worker_ps(dsgd_cluster_worker *w) { return w ? w->psw : NULL; }
DSGD_API dsgd_ctx *dsgd_cluster_worker_ctx(dsgd_cluster_worker *w) { return w ? w->m.ctx : NULL; }

static dsgd_result dsgd__cluster_lost(dsgd_cluster_worker *w, const char *what) {
    return dsgd_ctx_set_error(w->m.ctx, DSGD_ERR_ABORTED, "%s: worker %d was lost (killed)", what, w->id);
}

DSGD_API dsgd_result dsgd_cluster_set_dataset(dsgd_cluster *c, const dsgd_dataset *ds, int batch, uint64_t seed) {
    const char *what = "dsgd_cluster_set_dataset";
    size_t nb;
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    if (c->down) return dsgd_ctx_set_error(c->ctx, DSGD_ERR_STATE, "%s: the cluster was shut down", what);
    if (!ds || !ds->x || !ds->y || ds->n == 0 || ds->dim != c->d.model.input_dim)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: need a dataset of inputs of size %d", what,
                                  c->d.model.input_dim);
    if (batch < 1 || batch > c->d.model.max_batch)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: batch %d outside 1..%d (model.max_batch)",
                                  what, batch, c->d.model.max_batch);
    nb = ds->n / (size_t)batch;
    if (nb < (size_t)c->W)
        return dsgd_ctx_set_error(c->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: %zu samples make %zu batches of %d, fewer than the %d workers", what, ds->n, nb,
                                  batch, c->W);
    pthread_mutex_lock(&c->mu);
    c->ds = ds;
    c->ds_batch = batch;
    c->ds_seed = seed;
    c->ds_gen++;
    pthread_mutex_unlock(&c->mu);
    return DSGD_OK;
}

/* The worker's sampler and buffers for the current dataset generation. */
static dsgd_result dsgd__cluster_worker_shard(dsgd_cluster_worker *w) {
    dsgd_cluster *c = w->c;
    const char *what = "dsgd_cluster_worker_next_batch";
    dsgd_result r;
    dsgd_sampler_free(&w->smp);
    DSGD_FREE(w->bx);
    DSGD_FREE(w->by);
    w->ds_gen = 0;
    w->bx = (float *)dsgd__alloc(w->m.ctx, sizeof(float) * (size_t)c->ds_batch * (size_t)c->ds->dim, what);
    w->by = (float *)dsgd__alloc(w->m.ctx, sizeof(float) * (size_t)c->ds_batch * (size_t)c->ds->target_dim, what);
    if (!w->bx || !w->by) return DSGD_ERR_OUT_OF_MEMORY;
    r = dsgd_sampler_init(w->m.ctx, &w->smp, c->ds->n, (size_t)c->ds_batch, c->ds_seed, 1, 1);
    if (r != DSGD_OK) return r;
    w->ds_gen = c->ds_gen;
    w->ds_next = 0;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cluster_worker_next_batch(dsgd_cluster_worker *w, const float **x, const float **y,
                                                    int *count, uint64_t *epoch) {
    const char *what = "dsgd_cluster_worker_next_batch";
    dsgd_cluster *c;
    const size_t *idx = NULL;
    size_t n;
    dsgd_result r;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    c = w->c;
    if (!x || !y || !count)
        return dsgd_ctx_set_error(w->m.ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: x, y and count are needed", what);
    if (!c->ds) return dsgd_ctx_set_error(w->m.ctx, DSGD_ERR_STATE, "%s: no dataset (dsgd_cluster_set_dataset)", what);
    if (w->ds_gen != c->ds_gen && (r = dsgd__cluster_worker_shard(w)) != DSGD_OK) return r;
    n = dsgd_sampler_worker_batch(&w->smp, w->id, c->W, w->ds_next, &idx);
    if ((r = dsgd_dataset_gather(c->ds, idx, n, w->bx, w->by)) != DSGD_OK)
        return dsgd_ctx_set_error(w->m.ctx, r, "%s: cannot gather the worker's batch %llu", what,
                                  (unsigned long long)w->ds_next);
    w->ds_next++;
    *x = w->bx;
    *y = w->by;
    *count = (int)n;
    if (epoch) *epoch = w->smp.epoch;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cluster_worker_pull(dsgd_cluster_worker *w, float *full) {
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__cluster_killed(w)) return dsgd__cluster_lost(w, "dsgd_cluster_worker_pull");
    return dsgd_ps_worker_pull(w->psw, full);
}

DSGD_API dsgd_result dsgd_cluster_worker_train_step(dsgd_cluster_worker *w, const float *x, const float *y,
                                                    int count) {
    const char *what = "dsgd_cluster_worker_train_step";
    size_t p;
    dsgd_result r;
    if (!w) return DSGD_ERR_INVALID_ARGUMENT;
    p = w->c->num_params;
    if (!x || !y || count < 1 || count > w->c->d.model.max_batch)
        return dsgd_ctx_set_error(w->m.ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: need x, y and 1 <= count <= %d (got %d)",
                                  what, w->c->d.model.max_batch, count);
    if (dsgd__cluster_killed(w)) return dsgd__cluster_lost(w, what);
    if ((r = dsgd_ps_worker_pull(w->psw, w->buf)) != DSGD_OK) return r;
    if ((r = dsgd_model_set_params(w->m.model, w->buf, p)) != DSGD_OK) return r;
    if (dsgd__cluster_killed(w)) return dsgd__cluster_lost(w, what);
    if ((r = dsgd_model_compute_gradients(w->m.model, x, y, count, 1.0f / (float)count)) != DSGD_OK) return r;
    if ((r = dsgd_model_get_grads(w->m.model, w->buf, p)) != DSGD_OK) return r;
    if (dsgd__cluster_killed(w)) return dsgd__cluster_lost(w, what);
    return dsgd_ps_worker_push(w->psw, w->buf);
}

#endif /* DSGD__PART_COORDINATOR_IMPL */
