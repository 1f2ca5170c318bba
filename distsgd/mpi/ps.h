/* distsgd/mpi/ps.h - parameter servers across MPI processes: this process's role and the engine's rank order
   Part of distsgd's MPI add-on (see ../../distsgd_mpi.h, which includes the parts in order).

   PARAMETER SERVERS OVER MPI

     The parameter-server engine (distsgd/ps.h) runs unchanged with its
     ranks as MPI processes: every process creates one endpoint
     (dsgd_mpi_transport_create) and then a server or a worker over it. The
     engine wants its servers first (ranks 0..P-1, then the workers
     P..P+W-1), while TF_CONFIG numbers a cluster chief, workers, ps (see
     THE RANK LAYOUT in distsgd/tf_config.h) and mpirun numbers processes
     as it starts them. dsgd_mpi_ps_role_create settles who is what, once,
     collectively:

       - TF_CONFIG set, with a task: the role is the task's. A "ps" task of
         index i is server i; the "chief" is worker 0 and "worker" i is
         worker chiefs + i (TF's id_in_cluster, so the chief, or worker 0
         when there is none, is worker 0). P is the size of the ps job, W
         chiefs + workers. The evaluator is refused: TF runs it apart, as
         a cluster of its own, so start it outside the training job.
       - TF_CONFIG not set (or "{}", which TF reads as a single process):
         the rank layout. The first num_servers processes of the
         communicator are the servers, the rest the workers, in order.

     Every process then all-gathers what it found (its role, P, W, or its
     error) and checks the whole: every process described its role, all
     agree on P and W, P + W is the size of the communicator, and no role
     is claimed twice. All processes see the same table, so all fail, or
     none, with the same message naming the first process at fault (its
     own error when it had one: a malformed TF_CONFIG, an index out of
     range), never a hang. Last, MPI_Comm_split with key = the engine's
     rank gives a communicator in the engine's order: pass it as
     dsgd_mpi_desc.comm, and the endpoint's rank is the engine's.

         dsgd_mpi_ps_role role;
         dsgd_mpi_desc md = {0};
         if (dsgd_mpi_ps_role_create(ctx, MPI_COMM_WORLD, 2, &role) != DSGD_OK) ... (every process fails)
         md.comm = role.comm;
         dsgd_mpi_transport_create(ctx, &md, &ep);     ep.rank == role.rank
         role.is_server ? dsgd_ps_server_create(ctx, &ep, ...) : dsgd_ps_worker_create(ctx, &ep, ...);
         ...
         ep.destroy(ep.impl);
         dsgd_mpi_ps_role_free(&role);

     The addresses in TF_CONFIG are not used: MPI has already connected
     the processes.

     Late workers (dsgd_ps_desc.initial_workers, MEMBERSHIP in
     distsgd/ps.h): every process of the job, a late worker's too, starts
     with the job and calls dsgd_mpi_ps_role_create (it is collective); a
     late worker then joins the engine whenever it is ready (after loading
     its data, say), by its first pull. A process that starts after the
     job (MPI's dynamic processes) cannot join. A lost server (A LOST
     SERVER in distsgd/ps.h): the endpoint returns MPI errors as results,
     but whether the other processes run on after one died is the
     launcher's choice (mpirun commonly ends the whole job); where they do,
     the workers fail with DSGD_ERR_TIMEOUT naming the server.
*/
#ifndef DSGD_MPI__PART_PS_DECL
#define DSGD_MPI__PART_PS_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- PS roles */

/* What this process is in a parameter-server job (dsgd_mpi_ps_role_create). */
typedef struct dsgd_mpi_ps_role {
    int is_server;   /* 1: parameter server `index`; 0: worker `index` */
    int index;       /* 0..num_servers-1 (server) or 0..num_workers-1 (worker) */
    int rank;        /* the engine's rank: index (server) or num_servers + index (worker);
                        also this process's rank in comm */
    int num_servers; /* P (dsgd_ps_desc.num_servers) */
    int num_workers; /* W (dsgd_ps_desc.num_workers) */
    int is_chief;    /* worker 0: TF's chief, or worker 0 when the cluster has none */
    int from_tf_config; /* 1: the role came from TF_CONFIG; 0: from the rank layout */
    MPI_Comm comm;   /* the processes in the engine's order (servers first):
                        dsgd_mpi_desc.comm; MPI_COMM_NULL until created */
} dsgd_mpi_ps_role;

/* Finds this process's role in a parameter-server job of the processes of
   comm (0 or MPI_COMM_NULL: MPI_COMM_WORLD): from TF_CONFIG when it is set
   with a task, else from the rank layout with num_servers servers (then
   1 <= num_servers < size; ignored with TF_CONFIG), checks it against every
   other process's, and fills *out, out->comm included (see PARAMETER
   SERVERS OVER MPI). Collective over comm: every process calls it, in the
   same order as its other collective calls on comm.
   Errors (recorded on ctx; the same result and message on every process
   unless noted): DSGD_ERR_INVALID_ARGUMENT (ctx NULL, nothing recorded,
   or out NULL, on that process only; a process whose role cannot be
   found: its TF_CONFIG's error (DSGD_ERR_FORMAT for malformed JSON), an
   evaluator task, a cluster without a ps or a worker job, num_servers
   out of range; processes that disagree on P or W; P + W not the size
   of comm; a role claimed by two processes: the message names the first
   process at fault and what it found), DSGD_ERR_STATE (MPI not
   initialised, or finalized; that process only), DSGD_ERR_SYSTEM
   (MPI_Allgather or MPI_Comm_split failed), DSGD_ERR_OUT_OF_MEMORY. On
   failure *out is zeroed with comm = MPI_COMM_NULL.
   Thread safety: a thread allowed to call MPI, while no thread changes the
   environment. */
DSGD_API dsgd_result dsgd_mpi_ps_role_create(dsgd_ctx *ctx, MPI_Comm comm, int num_servers,
                                             dsgd_mpi_ps_role *out);
/* Frees role->comm (MPI_Comm_free; call it before MPI_Finalize, after the
   endpoints made over it are destroyed, on every process) and sets it to
   MPI_COMM_NULL; role NULL or without a comm: nothing.
   Errors: none. Thread safety: a thread allowed to call MPI. */
DSGD_API void dsgd_mpi_ps_role_free(dsgd_mpi_ps_role *role);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_MPI__PART_PS_DECL */

#if defined(DISTSGD_MPI_IMPLEMENTATION) && !defined(DSGD_NO_PS) && !defined(DSGD_MPI__PART_PS_IMPL)
#define DSGD_MPI__PART_PS_IMPL

/* >>mpi ps roles ----------------------------------------------------------- */

/* What each process found, all-gathered as bytes (the processes share one
   byte order, as the transport's headers already require). */
typedef struct dsgd_mpi__ps_claim {
    int code;      /* DSGD_OK, or this process's error */
    int rank;      /* the engine's rank it claims */
    int servers, workers;
    int is_server, index, is_chief, from_tf;
    char msg[320]; /* the error's message, or a description of the role */
} dsgd_mpi__ps_claim;

/* This process's own claim, from TF_CONFIG or the rank layout. */
static void dsgd_mpi__ps_claim_mine(dsgd_ctx *ctx, int proc, int size, int num_servers, dsgd_mpi__ps_claim *c) {
    dsgd_cluster_config cfg;
    dsgd_result r;
    memset(c, 0, sizeof(*c));
    memset(&cfg, 0, sizeof(cfg));
    c->rank = -1;
    r = dsgd_tf_config_from_env(ctx, &cfg);
    if (r != DSGD_OK) {
        const char *m = dsgd_ctx_last_error(ctx);
        size_t n = strlen(m);
        if (n >= sizeof(c->msg)) n = sizeof(c->msg) - 1; /* a long message is cut */
        memcpy(c->msg, m, n);
        c->msg[n] = '\0';
        c->code = r;
        return;
    }
    if (cfg.task_type == DSGD_TASK_NONE) { /* no TF_CONFIG (or "{}"): the rank layout */
        if (num_servers < 1 || num_servers >= size) {
            c->code = DSGD_ERR_INVALID_ARGUMENT;
            snprintf(c->msg, sizeof(c->msg),
                     "no TF_CONFIG task, so the rank layout, which needs 1 <= num_servers < %d processes (got num_servers %d)",
                     size, num_servers);
        } else {
            c->servers = num_servers;
            c->workers = size - num_servers;
            c->is_server = proc < num_servers;
            c->index = c->is_server ? proc : proc - num_servers;
            c->rank = proc;
        }
    } else {
        int chiefs = cfg.num_tasks[DSGD_TASK_CHIEF];
        c->from_tf = 1;
        c->servers = cfg.num_tasks[DSGD_TASK_PS];
        c->workers = chiefs + cfg.num_tasks[DSGD_TASK_WORKER];
        if (cfg.task_type == DSGD_TASK_EVALUATOR) {
            c->code = DSGD_ERR_INVALID_ARGUMENT;
            snprintf(c->msg, sizeof(c->msg), "TF_CONFIG: task evaluator %d: an evaluator runs apart from the "
                     "training job (TF gives it a cluster of its own); start it outside this job", cfg.task_index);
        } else if (c->servers < 1 || c->workers < 1) {
            c->code = DSGD_ERR_INVALID_ARGUMENT;
            snprintf(c->msg, sizeof(c->msg), "TF_CONFIG: the cluster has %d ps and %d chief + worker tasks; "
                     "parameter servers need at least one of each", c->servers, c->workers);
        } else if (cfg.task_type == DSGD_TASK_PS) {
            c->is_server = 1;
            c->index = cfg.task_index;
            c->rank = cfg.task_index;
        } else { /* chief or worker: TF's id_in_cluster (the chief first) */
            c->index = cfg.task_type == DSGD_TASK_CHIEF ? 0 : chiefs + cfg.task_index;
            c->rank = c->servers + c->index;
        }
        if (c->code == DSGD_OK)
            snprintf(c->msg, sizeof(c->msg), "TF_CONFIG task %s %d", dsgd_task_type_name(cfg.task_type),
                     cfg.task_index);
    }
    if (c->code == DSGD_OK) {
        c->is_chief = !c->is_server && c->index == 0;
        if (!c->from_tf) snprintf(c->msg, sizeof(c->msg), "rank layout, %d servers", num_servers);
    }
    dsgd_cluster_config_free(&cfg);
}

/* The same verdict on every process: DSGD_OK, or the error naming the first
   process at fault. */
static dsgd_result dsgd_mpi__ps_claims_check(dsgd_ctx *ctx, const char *fn, const dsgd_mpi__ps_claim *all, int size,
                                             int proc) {
    int p, q;
    for (p = 0; p < size; ++p)
        if (all[p].code != DSGD_OK)
            return dsgd_ctx_set_error(ctx, (dsgd_result)all[p].code, "%s: process %d%s: %s", fn, p,
                                      p == proc ? " (this process)" : "", all[p].msg);
    for (p = 1; p < size; ++p)
        if (all[p].servers != all[0].servers || all[p].workers != all[0].workers || all[p].from_tf != all[0].from_tf)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "%s: the processes disagree on the cluster: process 0 has %d servers and %d "
                                      "workers (%s), process %d has %d and %d (%s)", fn, all[0].servers,
                                      all[0].workers, all[0].msg, p, all[p].servers, all[p].workers, all[p].msg);
    if (all[0].servers + all[0].workers != size)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s: the cluster has %d servers + %d workers = %d tasks, but the job has %d "
                                  "processes (start one process per task: mpirun -np %d)", fn, all[0].servers,
                                  all[0].workers, all[0].servers + all[0].workers, size,
                                  all[0].servers + all[0].workers);
    for (p = 0; p < size; ++p)
        for (q = 0; q < p; ++q)
            if (all[q].rank == all[p].rank)
                return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                          "%s: processes %d and %d are both %s %d (%s; %s): every task needs its "
                                          "own process", fn, q, p, all[p].is_server ? "server" : "worker",
                                          all[p].index, all[q].msg, all[p].msg);
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_mpi_ps_role_create(dsgd_ctx *ctx, MPI_Comm comm, int num_servers,
                                             dsgd_mpi_ps_role *out) {
    const char *fn = "dsgd_mpi_ps_role_create";
    char text[MPI_MAX_ERROR_STRING + 32];
    dsgd_mpi__ps_claim mine, *all;
    dsgd_result r;
    int init = 0, fin = 0, proc = 0, size = 0, rc, erank = -1, ok;
    if (out) {
        memset(out, 0, sizeof(*out));
        out->comm = MPI_COMM_NULL;
    }
    if (!ctx) return DSGD_ERR_INVALID_ARGUMENT;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE, "%s: MPI is %s: call dsgd_mpi_init (or MPI_Init_thread) first",
                                  fn, fin ? "finalized" : "not initialised");
    if (comm == (MPI_Comm)0 || comm == MPI_COMM_NULL) comm = MPI_COMM_WORLD;
    rc = MPI_Comm_rank(comm, &proc);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_size(comm, &size);
    if (rc != MPI_SUCCESS)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: the communicator is not valid: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    dsgd_mpi__ps_claim_mine(ctx, proc, size, num_servers, &mine);
    /* Every process learns whether every other could allocate the table
       before the all-gather, so one short of memory fails them all. */
    all = (dsgd_mpi__ps_claim *)DSGD_MALLOC(sizeof(*all) * (size_t)size);
    ok = all != NULL;
    rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (rc == MPI_SUCCESS && ok)
        rc = MPI_Allgather(&mine, (int)sizeof(mine), MPI_BYTE, all, (int)sizeof(mine), MPI_BYTE, comm);
    if (rc != MPI_SUCCESS) {
        DSGD_FREE(all);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: gathering the roles failed: %s", fn,
                                  dsgd_mpi__error_text(rc, text, sizeof(text)));
    }
    if (!ok) {
        const char *where = all ? " (on another process)" : "";
        DSGD_FREE(all);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: out of memory for the table of %d roles%s", fn,
                                  size, where);
    }
    r = dsgd_mpi__ps_claims_check(ctx, fn, all, size, proc);
    DSGD_FREE(all);
    if (r != DSGD_OK) return r;
    rc = MPI_Comm_split(comm, 0, mine.rank, &out->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_rank(out->comm, &erank);
    if (rc != MPI_SUCCESS || erank != mine.rank) {
        if (out->comm != MPI_COMM_NULL && rc == MPI_SUCCESS) MPI_Comm_free(&out->comm);
        out->comm = MPI_COMM_NULL;
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: MPI_Comm_split %s", fn,
                                  rc != MPI_SUCCESS ? dsgd_mpi__error_text(rc, text, sizeof(text))
                                                    : "did not order the processes by the engine's rank");
    }
    out->is_server = mine.is_server;
    out->index = mine.index;
    out->rank = mine.rank;
    out->num_servers = mine.servers;
    out->num_workers = mine.workers;
    out->is_chief = mine.is_chief;
    out->from_tf_config = mine.from_tf;
    return DSGD_OK;
}

DSGD_API void dsgd_mpi_ps_role_free(dsgd_mpi_ps_role *role) {
    int fin = 0;
    if (!role || role->comm == MPI_COMM_NULL || role->comm == (MPI_Comm)0) return;
    MPI_Finalized(&fin);
    if (!fin) MPI_Comm_free(&role->comm);
    role->comm = MPI_COMM_NULL;
}

#endif /* DSGD_MPI__PART_PS_IMPL */
