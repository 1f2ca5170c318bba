/* distsgd/strategy_ps.h - parameter servers as a strategy kind: the replicas are the workers
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   PARAMETER SERVERS AS A STRATEGY (DSGD_STRATEGY_PARAMETER_SERVER)

     Moving from mirrored to parameter servers is one field: desc.kind, with
     desc.ps saying how many servers and which update policy (ps.h: UPDATE
     POLICIES, WHO APPLIES THE UPDATE). The training loop stays the same:
     dsgd_strategy_train_step(s, x, y, count, &info) shards the global batch
     over the N replicas, and each replica is a worker of the engine:

       1 gradient  the mean gradient of its shard (a zero gradient for an
                   empty shard), at the parameters it last pulled
       2 push      to every server its slice; the servers apply it as the
                   policy says (ASYNC: on arrival; SYNC: the mean of the N
                   workers' pushes, one update; BACKUP: the first N - b)
       3 pull      the parameters, waiting as the policy says (SYNC: this
                   step's update), into the replica's model

     The replicas run their steps at once, each on its thread, and the call
     returns when every one has pulled. So within one call the policies
     differ (ASYNC applies N updates in arrival order, SYNC one), while the
     call itself keeps the workers in step: SSP with a bound s > 0 then
     behaves as SYNC, except that a pull may return before the last clock
     is applied. For workers that run free, use the engine itself or the
     cluster coordinator (coordinator.h).

     With desc.endpoints NULL, the P servers are threads of the strategy,
     each serving its shards (desc.ps.partitioner over the model's
     variables) over a loopback of the strategy's own with P + N ranks
     (servers first), and applying the optimizer of desc.optimizer
     (clip_norm must be 0) on a CPU backend.

     THE SAME PROGRAM ACROSS PROCESSES. desc.endpoints may instead hold
     this process's ranks of one group of P servers and W workers
     (desc.num_replicas of them, in increasing rank order, each with probe:
     an MPI transport over dsgd_mpi_ps_role_create's communicator, whose
     first P ranks serve). The ranks below P become server threads of this
     strategy; the others, which must be consecutive, its replicas (worker
     w, rank P + w, takes shard w of the W workers' global batch, so every
     process passes the same batch). A process may hold no replica: its
     strategy then serves, refuses every call that would run replicas
     (DSGD_ERR_STATE), and its dsgd_strategy_destroy waits until every
     worker of the group has finished. So one program, creating the
     strategy from its endpoints, training and destroying it, runs over the
     strategy's own loopback and under mpirun alike, with the same SYNC
     bits. The replicas' own collectives (metrics, distributed variables)
     run among this process's replicas only: across processes each reads
     its own. A worker without samples pushes zeros there, since the
     others cannot know (all here: the step does nothing, as mirrored).
     Over simnet, give the strategy the hub's endpoints (created with
     park_between_calls, as for every strategy): every rank makes each of
     its calls from its own thread (a replica's pulls and pushes in its
     steps, its goodbye in a last job at destroy; a server serves on its
     thread) and then leaves the simulation (the endpoint's leave). A
     replica starts from the initial parameters its model holds, as a
     pull at version 0 would give, without asking the servers: so every
     replica's first push is tagged 0, even one that starts after the
     others' step 0 is applied (BACKUP then drops it instead of opening a
     step nobody else joins).

     SYNC gives, step for step, the bits of the cluster coordinator's SYNC
     run fed the same shards: the same pull, gradient and push. After a
     step every replica's model holds what it pulled, so
     dsgd_strategy_eval_batch evaluates the servers' parameters (SYNC, and
     BACKUP: those of the step just applied); info->step is the global step
     (dsgd_ps_worker_global_step) replica 0 read at its last pull, and
     info->lr the schedule's rate there (ASYNC: its pull does not wait, so
     it holds its own push and those applied before it, maybe not all N).

     Differences from mirrored: the servers average the workers' mean
     gradients, so every model variable must aggregate MEAN; a non-finite
     gradient under DSGD_NONFINITE_SKIP is pushed as zeros (the step
     reports skipped = 1; the other workers' pushes still count), under
     ERROR the step fails; any failure of a replica stops the servers and
     the other workers at once (the transport is aborted) and fails the
     strategy, since the others may have pushed. A lost server (its
     process gone, or its thread's serve failed) fails the step in flight
     within timeout_s with DSGD_ERR_TIMEOUT, the message naming the server
     (the replica that found it is reported, not those the abort then
     stopped), and fails the strategy; resume from the last checkpoint (A
     CHECKPOINT below, and A LOST SERVER in ps.h). The gradients go through
     the host (gradient_path DEVICE is refused). Distributed variables and
     the metrics behave as under mirrored.

     A CHECKPOINT. dsgd_strategy_save(s, path, extra) and _restore are
     collectives of every process of the group, servers-only ones too
     (each passes the same path, which every process must reach: one
     machine or a shared file system), between steps. A save brings the
     engine to rest (each worker finishes, each server returns once every
     worker of the group did), then writes:
       path                 the strategy's file, as every kind writes it
                            (strategy_checkpoint.h), by the process of
                            worker 0: replica 0's parameters and the
                            global step, its metrics, the variables, the
                            extra; its optimizer's slots are the servers'
                            (or, ON_WORKERS, worker 0's copy's) where that
                            process holds every server (always with the
                            strategy's own transport), else the replica's
                            own, which parameter servers leave at zero;
       path.ps-server-I     server I's engine file (ps_checkpoint.h), by
                            the process holding it;
       path.ps-worker-W     worker W's.
     It then goes on from those files, as their restore would: new servers
     and workers, each restored from its file, replace the running ones.
     So a save leaves a SYNC run on the bits of one never saved, and a new
     strategy of the same desc (servers, workers, policy, apply, optimizer
     kind, model), restored from the files, trains the same bits; the
     parameters alone (and, with every server here, the optimizer's state)
     also restore into a model (dsgd_model_restore) or another kind. A
     restore reads its ranks' files into new servers and workers before it
     touches anything: a missing or damaged file (DSGD_ERR_IO,
     DSGD_ERR_FORMAT), one of another desc or rank (DSGD_ERR_SHAPE), or
     files of two saves, told apart by worker 0's step against the
     strategy's file's (DSGD_ERR_SHAPE), leave the strategy as it was.
     Each server, its serve over, tells every worker so, and a worker
     waits for the word of every server before it goes on, so none of its
     messages reaches a server still ending its last serve in another
     process. A save first
     checks that a file can be made beside path (DSGD_ERR_IO, nothing
     stopped); an error after the engine came to rest (a rank's file that
     cannot be written, a rank failing) fails the strategy. Across
     processes each returns its own result; a process that fails leaves
     the others waiting for its ranks until their deadline.

     This part declares nothing public but its desc (in strategy.h); the
     kind is chosen with DSGD_STRATEGY_PARAMETER_SERVER.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD__PART_STRATEGY_PS_IMPL)
#define DSGD__PART_STRATEGY_PS_IMPL

/* >>strategy_ps ------------------------------------------------------------- */

/* A server of this process: a member of the rank group (its context), its
   engine server and thread. */
typedef struct dsgd__psk_server {
    dsgd__member m;
    dsgd_ps_server *srv;
    dsgd_ps_server *next; /* staged by a restore (dsgd__psk_stage) */
    dsgd_transport_i ep;
    int index;            /* among the P servers */
    pthread_t thread;
    int started;
    struct dsgd__psk *k;
    /* under k->mu: close, a checkpoint asks it to tell the workers when its
       serve is over; served, serve returned with result (and the workers
       were told); go, 1 serve srv again (a checkpoint replaced it), -1
       leave and end the thread */
    int close, served, go;
    dsgd_result result;
} dsgd__psk_server;

typedef struct dsgd__psk {
    dsgd_ps_desc pd;
    dsgd_shard_map *map;
    float *init;                /* the initial parameters (a new server's before its restore) */
    pthread_mutex_t mu;         /* the servers' served and go */
    pthread_cond_t cv;
    int sync_made;
    dsgd_loopback *hub;         /* the engine's transport when the strategy makes its own */
    dsgd_transport_i *eps;      /* [servers + N]: this process's engine endpoints, servers first */
    int servers_here;           /* servers of this process (all P with its own transport) */
    int eps_here;               /* eps's count: servers_here + N */
    dsgd__psk_server *servers;  /* [servers_here] */
    dsgd_ps_worker **workers;   /* [N]: replica i's engine worker */
    dsgd_ps_worker **next;      /* [N]: staged by a restore */
    int quiet;                  /* every worker here finished and every server here returned (a checkpoint) */
    float **buf;                /* [N]: the flat parameters, then the gradient */
    int *pulled, *finished;     /* [N]: replica i started (dsgd__ps_worker_start_at_initial); its goodbye said */
    int failed;                 /* atomic: a replica failed, the transport was aborted */
    size_t p;
} dsgd__psk;

static dsgd_result dsgd__psk_check(dsgd_ctx *ctx, const dsgd_strategy_desc *d) {
    const char *what = "dsgd_strategy_create";
    int i;
    if (d->gradient_path == DSGD_GRADIENTS_DEVICE)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: parameter_server pushes the gradients from the host; gradient_path DEVICE "
                                  "is for mirrored", what);
    if (d->ps.num_servers < 1 || d->ps.num_servers > 4096)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: parameter_server needs 1..4096 servers "
                                  "(desc.ps.num_servers is %d)", what, d->ps.num_servers);
    for (i = 0; d->endpoints && i < d->num_replicas; ++i) {
        const dsgd_transport_i *t = &d->endpoints[i];
        if (!t->send || !t->recv || !t->probe || t->size != d->endpoints[0].size ||
            t->size <= d->ps.num_servers || (i > 0 && t->rank <= d->endpoints[i - 1].rank) || t->rank < 0 ||
            t->rank >= t->size)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: parameter_server's endpoints[%d] is rank %d of %d%s; this process's ranks "
                                      "of one group of %d servers and at least one worker are needed, in increasing "
                                      "order, each with send, recv and probe", what, i, t->rank, t->size,
                                      t->send && t->recv && t->probe ? "" : " without send, recv or probe",
                                      d->ps.num_servers);
        if (i > 0 && t->rank >= d->ps.num_servers && d->endpoints[i - 1].rank >= d->ps.num_servers &&
            t->rank != d->endpoints[i - 1].rank + 1)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: parameter_server's workers in one process must be consecutive ranks "
                                      "(endpoints[%d] is rank %d after rank %d)", what, i, t->rank,
                                      d->endpoints[i - 1].rank);
    }
    return DSGD_OK;
}

/* The engine's desc from the strategy's (defaults applied); W workers. */
static dsgd_ps_desc dsgd__psk_desc(const dsgd_strategy *s, int W) {
    dsgd_ps_desc pd;
    memset(&pd, 0, sizeof(pd));
    pd.num_servers = s->d.ps.num_servers;
    pd.num_workers = W;
    pd.policy = s->d.ps.policy;
    pd.staleness = s->d.ps.staleness;
    pd.backup_workers = s->d.ps.backup_workers;
    pd.apply = s->d.ps.apply;
    pd.optimizer = s->d.optimizer;
    pd.timeout_s = s->d.timeout_s;
    pd.retry_s = s->d.ps.retry_s;
    return pd;
}

/* Where the replicas and servers go (the kind's layout): with no
   endpoints, N replicas and all P servers here, over a loopback of P + N
   ranks; with endpoints, this process's ranks of the group: the servers'
   ranks become server threads, the workers' the replicas (maybe none),
   worker w taking shard w of the W workers'. The replicas' own collectives
   (metrics, variables) run over a loopback of this process's replicas. */
static dsgd_result dsgd__psk_layout(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    const dsgd_transport_i *ep = s->d.endpoints;
    int P = s->d.ps.num_servers, here = s->n, W, servers_here = 0;
    dsgd__psk *k = (dsgd__psk *)dsgd__alloc(s->ctx, sizeof(*k), what);
    dsgd_result r;
    if (!k) return DSGD_ERR_OUT_OF_MEMORY;
    memset(k, 0, sizeof(*k));
    s->kind_data = k;
    if (ep) {
        while (servers_here < here && ep[servers_here].rank < P) servers_here++;
        W = ep[0].size - P;
        s->n = here - servers_here;
        s->shard_first = s->n ? ep[servers_here].rank - P : 0;
    } else {
        W = s->n;
        servers_here = P;
    }
    s->world = s->n;
    s->first = 0;
    s->shard_count = W;
    k->servers_here = servers_here;
    k->pd = dsgd__psk_desc(s, W);
    k->eps_here = servers_here + s->n;
    k->eps = (dsgd_transport_i *)dsgd__alloc(s->ctx, sizeof(dsgd_transport_i) * (size_t)k->eps_here, what);
    if (!k->eps) return DSGD_ERR_OUT_OF_MEMORY;
    /* the engine's: the given ones (here of them), or a loopback of P + N */
    r = dsgd__group_endpoints(s->ctx, ep, k->eps_here, &k->hub, k->eps);
    /* the replicas' own collectives: a loopback of this process's replicas */
    return r == DSGD_OK && s->n ? dsgd__strategy_endpoints(s, NULL) : r;
}

/* A checkpoint's quiet (dsgd__psk_quiesce): a worker may send again only
   once every server's serve has ended, or its next message could reach a
   server still waiting, in that serve, for another process's workers to
   finish. So each server, its serve over, tells every worker so, and each
   worker, finished, waits for the word of every server. (Over simnet this
   also keeps the workers in the hub, not parked, while the servers
   collect their goodbyes.) */
#define DSGD__PSK_TAG_CLOSED DSGD_PS_TAG(15, 0) /* no engine message has type 15 */

static void dsgd__psk_tell_closed(dsgd__psk *k, const dsgd__psk_server *sv) {
    uint64_t word = (uint64_t)sv->index;
    int w;
    for (w = 0; w < k->pd.num_workers; ++w)
        if (sv->ep.send(sv->ep.impl, k->pd.num_servers + w, DSGD__PSK_TAG_CLOSED, &word, sizeof word,
                        dsgd__ps_now(&sv->ep) + k->pd.timeout_s) != DSGD_OK)
            return; /* the worker's wait then fails, naming the server */
}

/* A server's thread: serves until every worker finished, then waits to
   serve again (a checkpoint replaced its server) or to end. */
static void *dsgd__psk_server_main(void *arg) {
    dsgd__psk_server *sv = (dsgd__psk_server *)arg;
    dsgd__psk *k = sv->k;
    int go = 0;
    for (;;) {
        dsgd_result r = dsgd_ps_server_serve(sv->srv);
        pthread_mutex_lock(&k->mu);
        sv->result = r;
        while (!sv->go && !sv->close) pthread_cond_wait(&k->cv, &k->mu);
        if (sv->close) { /* a checkpoint: every worker learns this serve is over */
            sv->close = 0;
            pthread_mutex_unlock(&k->mu);
            dsgd__psk_tell_closed(k, sv);
            pthread_mutex_lock(&k->mu);
        }
        sv->served = 1;
        pthread_cond_broadcast(&k->cv);
        while (!sv->go) pthread_cond_wait(&k->cv, &k->mu);
        go = sv->go;
        sv->go = 0;
        sv->served = 0;
        pthread_cond_broadcast(&k->cv); /* a go -1 may wait for this go 1 to be taken */
        pthread_mutex_unlock(&k->mu);
        if (go < 0) break;
    }
    if (sv->ep.leave) sv->ep.leave(sv->ep.impl); /* done with the group, on the rank's thread */
    return NULL;
}

/* Tells server sv's thread to serve again (go 1) or to end (-1), the end
   after it took a word to serve again (a destroy right after a checkpoint
   must not keep it from serving the other processes' workers). */
static void dsgd__psk_server_go(dsgd__psk *k, dsgd__psk_server *sv, int go) {
    pthread_mutex_lock(&k->mu);
    while (sv->go > 0) pthread_cond_wait(&k->cv, &k->mu);
    sv->go = go;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

/* Stops every rank at once (a failed replica; teardown after a failure):
   the strategy's own transport, or the endpoints' abort. */
static void dsgd__psk_abort(dsgd__psk *k) {
    int i;
    DSGD__STORE_REL(&k->failed, 1);
    if (k->hub) {
        dsgd_loopback_abort(k->hub);
        return;
    }
    for (i = 0; i < k->eps_here && k->eps; ++i)
        if (k->eps[i].abort) {
            k->eps[i].abort(k->eps[i].impl);
            return;
        }
}

static void dsgd__psk_teardown(dsgd_strategy *s) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    int i;
    if (!k) return;
    /* every worker here said goodbye (dsgd__psk_stop), so the servers
       return once the other processes' workers did too; else (a failure,
       a partial setup) the transport is aborted */
    for (i = 0; k->workers && i < s->n; ++i)
        if (!k->finished || !k->finished[i]) dsgd__psk_abort(k);
    for (i = 0; k->servers && i < k->servers_here; ++i)
        if (k->servers[i].started) {
            dsgd__psk_server_go(k, &k->servers[i], -1);
            pthread_join(k->servers[i].thread, NULL);
        }
    for (i = 0; k->servers && i < k->servers_here; ++i) {
        dsgd_ps_server_destroy(k->servers[i].srv);
        dsgd_ps_server_destroy(k->servers[i].next);
        dsgd__member_destroy(&k->servers[i].m);
    }
    for (i = 0; k->workers && i < s->n; ++i) dsgd_ps_worker_destroy(k->workers[i]);
    for (i = 0; k->next && i < s->n; ++i) dsgd_ps_worker_destroy(k->next[i]);
    for (i = 0; k->buf && i < s->n; ++i) DSGD_FREE(k->buf[i]);
    if (k->hub) dsgd_loopback_destroy(k->hub);
    dsgd_shard_map_destroy(k->map);
    DSGD_FREE(k->servers);
    DSGD_FREE(k->workers);
    DSGD_FREE(k->next);
    DSGD_FREE(k->init);
    if (k->sync_made) {
        pthread_mutex_destroy(&k->mu);
        pthread_cond_destroy(&k->cv);
    }
    DSGD_FREE(k->buf);
    DSGD_FREE(k->pulled);
    DSGD_FREE(k->finished);
    DSGD_FREE(k->eps);
    DSGD_FREE(k);
    s->kind_data = NULL;
}

/* This process's servers (created and serving) and the replicas' engine
   workers, each having pulled the initial parameters. */
static dsgd_result dsgd__psk_setup(dsgd_strategy *s) {
    const char *what = "dsgd_strategy_create";
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd__member_desc md;
    int i, here = k->servers_here, N = s->n;
    dsgd_result r;
    if (pthread_mutex_init(&k->mu, NULL) != 0) return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: mutex", what);
    if (pthread_cond_init(&k->cv, NULL) != 0) {
        pthread_mutex_destroy(&k->mu);
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: condition variable", what);
    }
    k->sync_made = 1;
    k->servers = (dsgd__psk_server *)dsgd__alloc(s->ctx, sizeof(dsgd__psk_server) * (size_t)(here ? here : 1), what);
    k->workers = (dsgd_ps_worker **)dsgd__alloc(s->ctx, sizeof(dsgd_ps_worker *) * (size_t)(N ? N : 1), what);
    k->next = (dsgd_ps_worker **)dsgd__alloc(s->ctx, sizeof(dsgd_ps_worker *) * (size_t)(N ? N : 1), what);
    k->buf = (float **)dsgd__alloc(s->ctx, sizeof(float *) * (size_t)(N ? N : 1), what);
    k->pulled = (int *)dsgd__alloc(s->ctx, sizeof(int) * (size_t)(N ? N : 1), what);
    k->finished = (int *)dsgd__alloc(s->ctx, sizeof(int) * (size_t)(N ? N : 1), what);
    if (!k->servers || !k->workers || !k->next || !k->buf || !k->pulled || !k->finished) return DSGD_ERR_OUT_OF_MEMORY;
    memset(k->pulled, 0, sizeof(int) * (size_t)(N ? N : 1));
    memset(k->finished, 0, sizeof(int) * (size_t)(N ? N : 1));
    memset(k->servers, 0, sizeof(dsgd__psk_server) * (size_t)(here ? here : 1));
    memset(k->workers, 0, sizeof(dsgd_ps_worker *) * (size_t)(N ? N : 1));
    memset(k->next, 0, sizeof(dsgd_ps_worker *) * (size_t)(N ? N : 1));
    memset(k->buf, 0, sizeof(float *) * (size_t)(N ? N : 1));
    /* the map over the desc's variables and their initial values (this
       process may hold no replica) */
    r = dsgd__shard_map_for_model(s->ctx, &s->d.model, k->pd.num_servers, &s->d.ps.partitioner, &k->init, &k->p,
                                  &k->map);
    for (i = 0; i < N && r == DSGD_OK; ++i)
        if (!(k->buf[i] = (float *)dsgd__alloc(s->ctx, sizeof(float) * (k->p ? k->p : 1), what)))
            r = DSGD_ERR_OUT_OF_MEMORY;
    memset(&md, 0, sizeof(md));
    md.role = "server";
    for (i = 0; i < here && r == DSGD_OK; ++i) {
        dsgd__psk_server *sv = &k->servers[i];
        sv->index = k->eps[i].rank;
        sv->ep = k->eps[i];
        sv->k = k;
        if ((r = dsgd__member_create(s->ctx, &md, sv->index, &sv->m)) != DSGD_OK) break;
        r = dsgd_ps_server_create(sv->m.ctx, &k->eps[i], &k->pd, k->map, k->init, &sv->srv);
        if (r != DSGD_OK) dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(sv->m.ctx));
    }
    for (i = 0; i < N && r == DSGD_OK; ++i) {
        dsgd_replica *rep = &s->reps[i];
        r = dsgd_ps_worker_create(rep->m.ctx, &k->eps[here + i], &k->pd, k->map, &k->workers[i]);
        if (r == DSGD_OK && !dsgd__ps_apply_of(&k->pd)->servers_hold)
            r = dsgd_ps_worker_set_params(k->workers[i], k->init);
        if (r != DSGD_OK) dsgd_ctx_set_error(s->ctx, r, "%s", dsgd_ctx_last_error(rep->m.ctx));
    }
    for (i = 0; i < here && r == DSGD_OK; ++i) {
        if (pthread_create(&k->servers[i].thread, NULL, dsgd__psk_server_main, &k->servers[i]) != 0)
            return dsgd_ctx_set_error(s->ctx, DSGD_ERR_SYSTEM, "%s: cannot start server %d's thread", what, i);
        k->servers[i].started = 1;
    }
    return r;
}

/* A replica's worker finishes and, for a checkpoint (user non-NULL), waits
   for every server's word that its serve is over (it stays in the group). */
static dsgd_result dsgd__psk_finish_job(dsgd_replica *r, void *user) {
    dsgd__psk *k = (dsgd__psk *)r->s->kind_data;
    const dsgd_transport_i *ep = &k->eps[k->servers_here + r->local];
    dsgd_result res = dsgd_ps_worker_finish(k->workers[r->local]);
    uint64_t word;
    int sv;
    for (sv = 0; user && sv < k->pd.num_servers && res == DSGD_OK; ++sv)
        if ((res = ep->recv(ep->impl, sv, DSGD__PSK_TAG_CLOSED, &word, sizeof word,
                            dsgd__ps_now(ep) + k->pd.timeout_s)) != DSGD_OK)
            dsgd_ctx_set_error(r->m.ctx, res, "worker %d: server %d did not end its serve for the checkpoint: %s",
                               ep->rank - k->pd.num_servers, sv, dsgd_result_string(res));
    return res;
}

/* A replica's goodbye, on its own thread: the engine's finish, then the
   endpoint's leave (simnet: out of the simulation). */
static dsgd_result dsgd__psk_finish(dsgd_replica *r, void *user) {
    dsgd__psk *k = (dsgd__psk *)r->s->kind_data;
    const dsgd_transport_i *ep = &k->eps[k->servers_here + r->local];
    dsgd_result res = dsgd__psk_finish_job(r, NULL);
    (void)user;
    if (res != DSGD_OK) return res;
    k->finished[r->local] = 1;
    if (ep->leave) ep->leave(ep->impl);
    return DSGD_OK;
}

/* Before the replicas' threads stop: every replica says goodbye from its
   own thread (the threads of a simulation must make every call of their
   rank). */
static void dsgd__psk_stop(dsgd_strategy *s) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    if (!k || !k->workers || s->n == 0) return;
    if (dsgd__strategy_dispatch(s, dsgd__psk_finish, NULL, "dsgd_strategy_destroy") != DSGD_OK) dsgd__psk_abort(k);
}

/* Phase 1: replica r's mean gradient of its batch b into buf (zeros for an
   empty batch, or a non-finite gradient under SKIP). */
static dsgd_result dsgd__psk_gradient(dsgd_replica *r, const dsgd_batch *b, float *buf, size_t p) {
    dsgd_model *m = r->m.model;
    size_t bad = 0;
    dsgd_result res;
    if (b->count > 0) {
        if ((res = dsgd_model_gradients(m, b, 1.0f / (float)b->count)) != DSGD_OK) return res;
        if ((res = r->m.be.norm_check(r->m.be.impl, dsgd_model_grads(m), p, NULL, &bad)) != DSGD_OK) return res;
    }
    if (bad && r->s->d.nonfinite == DSGD_NONFINITE_ERROR)
        return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_NON_FINITE,
                                  "step %lld: non-finite gradient (%zu NaN/Inf values on this replica)",
                                  (long long)dsgd_optimizer_steps(r->opt), bad);
    r->skipped = bad != 0;
    if (b->count == 0 || bad) {
        if (p) memset(buf, 0, p * sizeof(float));
        return DSGD_OK;
    }
    return dsgd_model_get_grads(m, buf, p);
}

/* One replica's step: batch, gradient, push, pull (see the top). */
static dsgd_result dsgd__psk_step(dsgd_replica *r, void *user) {
    const dsgd__step_args *a = (const dsgd__step_args *)user;
    dsgd_strategy *s = r->s;
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_ps_worker *w = k->workers[r->local];
    float *buf = k->buf[r->local];
    dsgd_batch b;
    dsgd_result res;
    r->skipped = 0;
    r->lr = dsgd_optimizer_lr(r->opt);
    res = DSGD_OK;
    if (!k->pulled[r->local]) { /* the model holds the initial parameters, version 0 on every server */
        dsgd__ps_worker_start_at_initial(w);
        k->pulled[r->local] = 1;
    }
    res = dsgd__step_batch(r, a, &b, &r->global);
    /* no sample anywhere (every worker is here to agree): nothing to do;
       across processes a worker without samples pushes zeros */
    if (res == DSGD_OK && r->global == 0 && s->shard_count == s->n) return DSGD_OK;
    if (res == DSGD_OK && !s->all_mean)
        res = dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_INVALID_ARGUMENT,
                                 "parameter servers average the workers' mean gradients: every variable must "
                                 "aggregate MEAN");
    if (res == DSGD_OK) res = dsgd__psk_gradient(r, &b, buf, k->p);
    if (res == DSGD_OK) res = dsgd_ps_worker_push(w, buf);
    if (res == DSGD_OK) res = dsgd_ps_worker_pull(w, buf);
    if (res == DSGD_OK) res = dsgd_model_set_params(r->m.model, buf, k->p);
    if (res == DSGD_OK) {
        dsgd__optimizer_set_steps(r->opt, dsgd_ps_worker_global_step(w));
        return DSGD_OK;
    }
    /* aborted because another replica failed first: that one's error (a
       lost server's name) is the one the step reports */
    if (res == DSGD_ERR_ABORTED && DSGD__LOAD_ACQ(&k->failed)) r->own_error = 0;
    dsgd__psk_abort(k); /* the servers and the other workers stop now, not at their deadline */
    return res;
}

/* ---- checkpoints: each rank's engine file beside the strategy's (see A CHECKPOINT above) */

/* The file beside path of this process's engine rank i (its servers
   first, then its replicas' workers: path.ps-server-I, path.ps-worker-W);
   NULL (recorded) on no memory. */
static char *dsgd__psk_rank_path(dsgd_strategy *s, const char *path, int i) {
    const dsgd__psk *k = (const dsgd__psk *)s->kind_data;
    int server = i < k->servers_here;
    size_t n = strlen(path) + 32;
    char *p = (char *)dsgd__alloc(s->ctx, n, "a parameter-server checkpoint");
    if (p)
        snprintf(p, n, "%s.ps-%s-%d", path, server ? "server" : "worker",
                 server ? k->servers[i].index : s->shard_first + i - k->servers_here);
    return p;
}

/* The strategy cannot go on (its workers finished, or a rank failed): it
   fails, the transport stops the other ranks, and r is returned. */
static dsgd_result dsgd__psk_broken(dsgd_strategy *s, const char *what, dsgd_result r) {
    dsgd__psk_abort((dsgd__psk *)s->kind_data);
    if (!s->failed)
        dsgd__strategy_fail(s, s->n ? dsgd_optimizer_steps(s->reps[0].opt) : 0, what, dsgd_ctx_last_error(s->ctx));
    return r;
}

/* Brings the engine to where its ranks may be saved or replaced: every
   worker here finishes (it stays in the group: no leave), every server
   returns from serve once every worker of the group, in every process,
   finished, and tells every worker so; the workers here wait for that
   word from every server, this thread for the servers here. */
static dsgd_result dsgd__psk_quiesce(dsgd_strategy *s, const char *what) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_result r;
    int i;
    if (k->quiet) return DSGD_OK;
    pthread_mutex_lock(&k->mu);
    for (i = 0; i < k->servers_here; ++i) k->servers[i].close = 1;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
    r = s->n ? dsgd__strategy_dispatch(s, dsgd__psk_finish_job, k, what) : DSGD_OK;
    if (r != DSGD_OK) dsgd__psk_abort(k); /* the servers here then return at once */
    pthread_mutex_lock(&k->mu);
    for (i = 0; i < k->servers_here; ++i)
        while (!k->servers[i].served) pthread_cond_wait(&k->cv, &k->mu);
    pthread_mutex_unlock(&k->mu);
    for (i = 0; i < k->servers_here && r == DSGD_OK; ++i)
        if ((r = k->servers[i].result) != DSGD_OK)
            dsgd_ctx_set_error(s->ctx, r, "%s: server %d: %s", what, k->servers[i].index,
                               dsgd_ctx_last_error(k->servers[i].m.ctx));
    k->quiet = r == DSGD_OK;
    return r;
}

/* Replica 0 takes the state its file saves: the step worker 0 read, and
   the parameters and the optimizer's slots where this process holds them
   (every server here, or ON_WORKERS worker 0's copy); else it keeps the
   parameters it pulled. */
static dsgd_result dsgd__psk_state_here(dsgd_strategy *s, const char *what) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_replica *r0 = &s->reps[0];
    const dsgd_backend_i *be = &r0->m.be;
    int holds = dsgd__ps_apply_of(&k->pd)->servers_hold, slots = dsgd_optimizer_num_slots(r0->opt), j, i;
    float *full;
    dsgd_result r = DSGD_OK;
    dsgd__optimizer_set_steps(r0->opt, dsgd_ps_worker_global_step(k->workers[0]));
    if (holds && k->servers_here < k->pd.num_servers) return DSGD_OK;
    if (!(full = (float *)dsgd__alloc(s->ctx, sizeof(float) * (k->p ? k->p : 1), what))) return DSGD_ERR_OUT_OF_MEMORY;
    for (j = 0; j <= slots && r == DSGD_OK; ++j) {
        r = j == 0 ? dsgd_model_get_params(r0->m.model, full, k->p) : dsgd_optimizer_read_slot(r0->opt, j - 1, 0, k->p, full);
        for (i = 0; holds && i < k->servers_here && r == DSGD_OK; ++i)
            r = dsgd__ps_server_read_state(k->servers[i].srv, j, full);
        if (r == DSGD_OK && !holds) r = dsgd__ps_worker_read_state(k->workers[0], j, full);
        if (r == DSGD_OK)
            r = j == 0 ? dsgd_model_set_params(r0->m.model, full, k->p)
                       : be->write(be->impl, dsgd__optimizer_slot_ref(r0->opt, j - 1), full, k->p);
    }
    DSGD_FREE(full);
    if (r != DSGD_OK && r != DSGD_ERR_OUT_OF_MEMORY)
        dsgd_ctx_set_error(s->ctx, r, "%s: reading the servers' state: %s", what, dsgd_ctx_last_error(r0->m.ctx));
    return r;
}

/* Drops what dsgd__psk_stage made. */
static void dsgd__psk_drop(dsgd_strategy *s) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    int i;
    for (i = 0; i < k->servers_here; ++i) {
        dsgd_ps_server_destroy(k->servers[i].next);
        k->servers[i].next = NULL;
    }
    for (i = 0; i < s->n; ++i) {
        dsgd_ps_worker_destroy(k->next[i]);
        k->next[i] = NULL;
    }
}

/* A new server and worker for each rank here, restored from its file
   beside path, the running ones untouched; step >= 0: worker 0's global
   step must be the strategy file's. On an error none is kept. */
static dsgd_result dsgd__psk_stage(dsgd_strategy *s, const char *path, int64_t step, const char *what) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_result r = DSGD_OK;
    dsgd_ctx *at = s->ctx;
    char *name = NULL;
    int i;
    for (i = 0; i < k->servers_here + s->n && r == DSGD_OK; ++i) {
        int server = i < k->servers_here, w = i - k->servers_here;
        dsgd__psk_server *sv = server ? &k->servers[i] : NULL;
        at = server ? sv->m.ctx : s->reps[w].m.ctx;
        DSGD_FREE(name);
        if (!(name = dsgd__psk_rank_path(s, path, i))) {
            r = DSGD_ERR_OUT_OF_MEMORY;
            at = s->ctx;
        } else if (server && (r = dsgd_ps_server_create(at, &sv->ep, &k->pd, k->map, k->init, &sv->next)) == DSGD_OK) {
            r = dsgd_ps_server_restore(sv->next, name);
        } else if (!server && (r = dsgd_ps_worker_create(at, &k->eps[i], &k->pd, k->map, &k->next[w])) == DSGD_OK) {
            r = dsgd_ps_worker_restore(k->next[w], name);
        }
    }
    if (r != DSGD_OK && at != s->ctx) dsgd_ctx_set_error(s->ctx, r, "%s: %s", what, dsgd_ctx_last_error(at));
    if (r == DSGD_OK && step >= 0 && s->n && s->shard_first == 0 && dsgd_ps_worker_global_step(k->next[0]) != step) {
        DSGD_FREE(name); /* worker 0's file, for the message */
        if (!(name = dsgd__psk_rank_path(s, path, k->servers_here))) r = DSGD_ERR_OUT_OF_MEMORY;
    }
    if (r == DSGD_OK && step >= 0 && s->n && s->shard_first == 0 && dsgd_ps_worker_global_step(k->next[0]) != step)
        r = dsgd_ctx_set_error(s->ctx, DSGD_ERR_SHAPE,
                               "%s: %s is of step %lld, %s of step %lld: files of two different saves (save every "
                               "checkpoint to a new path)", what, path, (long long)step, name,
                               (long long)dsgd_ps_worker_global_step(k->next[0]));
    DSGD_FREE(name);
    if (r != DSGD_OK) dsgd__psk_drop(s);
    return r;
}

/* The staged ranks replace the running ones, which first finish. */
static dsgd_result dsgd__psk_commit(dsgd_strategy *s, const char *what) {
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_result r = dsgd__psk_quiesce(s, what);
    int i;
    if (r != DSGD_OK) {
        dsgd__psk_drop(s);
        return r;
    }
    for (i = 0; i < s->n; ++i) {
        dsgd_ps_worker_destroy(k->workers[i]);
        k->workers[i] = k->next[i];
        k->next[i] = NULL;
        k->finished[i] = k->pulled[i] = 0; /* starting: a no-op unless it never pulled */
    }
    for (i = 0; i < k->servers_here; ++i) {
        dsgd_ps_server_destroy(k->servers[i].srv);
        k->servers[i].srv = k->servers[i].next;
        k->servers[i].next = NULL;
    }
    k->quiet = 0;
    for (i = 0; i < k->servers_here; ++i) dsgd__psk_server_go(k, &k->servers[i], 1);
    return DSGD_OK;
}

static dsgd_result dsgd__psk_save(dsgd_strategy *s, const char *path, int *writes) {
    const char *what = "dsgd_strategy_save";
    dsgd__psk *k = (dsgd__psk *)s->kind_data;
    dsgd_result r;
    char *name = NULL;
    int i;
    *writes = s->n > 0 && s->shard_first == 0; /* the process of worker 0 writes the strategy's file */
    if ((r = dsgd__ck_can_create(s->ctx, what, path)) != DSGD_OK) return r; /* before anything stops */
    if ((r = dsgd__psk_quiesce(s, what)) == DSGD_OK && *writes) r = dsgd__psk_state_here(s, what);
    for (i = 0; i < k->servers_here + s->n && r == DSGD_OK; ++i) {
        int server = i < k->servers_here, w = i - k->servers_here;
        DSGD_FREE(name);
        if (!(name = dsgd__psk_rank_path(s, path, i)))
            r = DSGD_ERR_OUT_OF_MEMORY;
        else if ((r = server ? dsgd_ps_server_save(k->servers[i].srv, name) : dsgd_ps_worker_save(k->workers[w], name)) !=
                 DSGD_OK)
            dsgd_ctx_set_error(s->ctx, r, "%s",
                               dsgd_ctx_last_error(server ? k->servers[i].m.ctx : s->reps[w].m.ctx));
    }
    DSGD_FREE(name);
    /* go on from the files just written, as their restore would */
    if (r == DSGD_OK && (r = dsgd__psk_stage(s, path, -1, what)) == DSGD_OK) r = dsgd__psk_commit(s, what);
    return r == DSGD_OK ? DSGD_OK : dsgd__psk_broken(s, what, r);
}

static dsgd_result dsgd__psk_restore(dsgd_strategy *s, const char *path, int phase, int64_t step) {
    const char *what = "dsgd_strategy_restore";
    dsgd_result r;
    if (phase == 0) return dsgd__psk_stage(s, path, step, what);
    if (phase < 0) {
        dsgd__psk_drop(s);
        return DSGD_OK;
    }
    return (r = dsgd__psk_commit(s, what)) == DSGD_OK ? DSGD_OK : dsgd__psk_broken(s, what, r);
}

static const dsgd__strategy_ops dsgd__parameter_server_ops = {
    "parameter_server", dsgd__psk_check, dsgd__psk_setup, dsgd__psk_step, dsgd__psk_teardown,
    /* .state = */ NULL, /* .multi_worker = */ 0, /* .layout = */ dsgd__psk_layout, /* .stop = */ dsgd__psk_stop,
    /* .save = */ dsgd__psk_save, /* .restore = */ dsgd__psk_restore, /* .caps = */ 0, /* .fingerprint = */ NULL,
};

#endif /* DSGD__PART_STRATEGY_PS_IMPL */
