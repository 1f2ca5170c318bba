/* distsgd/strategy.h - strategies, replicas, distributed variables, metrics
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   STRATEGIES

     dsgd_strategy_create(ctx, &desc, &s) builds N replicas (a model, an
     optimizer, a backend and, for N > 1, a communicator each) over a transport
     (a loopback of its own, or the endpoints you give in
     dsgd_strategy_desc.endpoints; the strategy never knows which);
     dsgd_strategy_train_step(s, x, y, count, &info) shards the global batch,
     computes gradients on every replica, agrees on finiteness, sums the flat
     gradient buffers (through the host or on the devices: see BACKENDS) and
     applies the same update everywhere, so the replicas stay bitwise
     identical, and N replicas x batch B with MEAN aggregation give the weights
     of one replica with batch N*B (up to float reassociation).
     dsgd_strategy_run(s, fn, user) runs your own function in replica context,
     where distributed variables (dsgd_strategy_create_variable) follow
     tf.VariableAggregation / tf.VariableSynchronization semantics.

     Failures: when one replica fails, the strategy aborts its transport at
     once, so the others return within milliseconds ("aborted because
     replica k failed"), and the call returns the failing replica's own
     error (dsgd_strategy_replica_result gives each replica's). A failure
     the replicas agreed on before the update (a bad label, a non-finite
     gradient under DSGD_NONFINITE_ERROR) changes nothing; any other failure
     (a collective, a timeout, a backend failing in the exchange or the
     update, any failed dsgd_strategy_run) may have left the replicas
     different, so the strategy fails: every later call that uses the
     replicas returns DSGD_ERR_STATE naming the step and the first error
     (dsgd_strategy_failed) until you destroy it and create a new one.
     Elastic (desc.elastic, strategy_elastic.h): mirrored and multi-worker
     mirrored instead shrink past a replica whose own code failed before
     the update and retry the step over the survivors; over endpoints you
     give, with every replica in this process, also past one that is gone
     (killed) or late in the step's first collectives, without aborting
     the transport.

   THE VERDICT ON THE DEVICE

     Where every replica's backend can keep a step's non-finite verdict on
     its device (nonfinite_flag, read_marked, wait_mark: the OpenCL
     backend), the replicas are one_device's or mirrored's in this process
     (one replica, or the DEVICE gradient path with marks) and nothing is
     clipped (the clipping norm is the host's), a synchronous step does not
     wait for its verdict: each replica writes its gradient's flag on the
     device, the DEVICE path sums the flags with the gradients, the update
     is made only where the sum is 0 (dsgd_opt_update.gate), and the flag
     comes back to the host without waiting, to be taken at the next step
     before its update (on a GPU it is in by then), or at the next other
     call that dispatches to the replicas. The weights, the optimizer's
     state, the step count and the learning rate are exactly those of the
     verdict taken before the update (the tests compare the two bit for
     bit across a non-finite step). What moves is when the host learns it:
       - dsgd_step_info: passing info makes the step wait for its own
         verdict, so skipped and the error are reported by that step as
         elsewhere; with info NULL the step waits for nothing;
       - under DSGD_NONFINITE_ERROR with info NULL, the error is returned
         by the next call ("taken at the next step"), which then updates
         nothing: the weights are those from before the non-finite step;
       - until the verdict is taken, the optimizer's step count
         (dsgd_optimizer_steps of a replica's optimizer) counts the
         step, and it is taken back if the verdict says skipped;
         dsgd_strategy_save takes every pending verdict first (the step
         count it saves is the verdict's), dsgd_strategy_restore drops
         them (what it restores replaces what they would change).
     A steady-state step on OpenCL then makes no call that waits for the
     device (dsgd_cl_backend_host_waits counts them) unless the device is
     behind the host, as PoCL's CPU device is: then the host waits for the
     last step's verdict while the device works on this one.

   MULTI-WORKER

     DSGD_STRATEGY_MULTI_WORKER_MIRRORED runs this process's num_replicas
     replicas (threads) as ranks first .. first + N - 1 of a group of W
     replicas in all, spread over several processes (workers): the
     endpoints you pass (dsgd_strategy_desc.endpoints, required) say where,
     endpoints[i] being rank first + i of size W (an MPI transport with N
     local endpoints per process, distsgd_mpi.h; or, to simulate workers in
     one process, N endpoints each of one loopback hub, one strategy per
     worker, each driven from its own thread). Then:
       - every worker calls every collective call in the same order with
         the same arguments: train_step (and _fn), eval_batch, take_metrics,
         read_variable of an ON_READ variable; they are collectives of all
         W replicas;
       - dsgd_strategy_train_step takes the global batch on every worker
         (the same x, y and count: a dsgd_sampler with the same seed makes
         it), and replica g (global) takes dsgd_block_range(count, W, g), so
         2 workers x 2 replicas see the samples of one 4-replica MIRRORED
         strategy, and over one loopback hub train its bits; with
         dsgd_strategy_train_step_fn each replica fetches its own shard;
       - creation checks that every worker describes the same model,
         optimizer and strategy (a fingerprint all-gathered over the group:
         a difference is DSGD_ERR_INVALID_ARGUMENT on every worker naming the
         first rank that differs from rank 0, never a hang), then rank 0 (the
         chief) broadcasts its initial weights;
       - dsgd_replica_id and dsgd_replica_count are global (g and W);
         dsgd_strategy_num_replicas is this worker's N and
         dsgd_strategy_num_replicas_in_sync is W;
       - gradients go the HOST path;
       - dsgd_strategy_save and dsgd_strategy_restore are collectives too:
         the chief writes the one file, every worker reads it (see
         strategy_checkpoint.h, ACROSS WORKERS).
     A failure on one worker aborts its own replicas at once; the other
     workers return at their deadline (DSGD_ERR_TIMEOUT naming the rank they
     waited for), as MPI cannot reach them sooner (the MPI transport's AFTER
     A FAILURE: end the job).

     Inside: a strategy kind is a table of operations (check the desc, set
     up, one replica's part of a step, tear down: dsgd__strategy_ops). This
     part holds what every kind shares: the replicas and their threads, the
     transport, failure handling, and the table of variables (their
     functions and the metrics' are strategy_vars.h's); its own parts
     strategy_create.h (creation, in phases) and strategy_run.h (the
     getters, the steps, dsgd_strategy_run, the wait report) define most
     of the functions it declares. The kinds are parts
     of their own below it (strategy_sync.h: one_device and mirrored, whose
     step is gradients, agree, aggregate, exchange, update;
     strategy_central.h: central storage, whose step sums the gradients
     into one host copy and updates it once; strategy_local.h: local SGD,
     whose replicas step alone and average every H steps), and
     strategy_kinds.h, the
     last, holds the table of kinds that dsgd_strategy_create picks from.
*/
#ifndef DSGD__PART_STRATEGY_DECL
#define DSGD__PART_STRATEGY_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- strategies */

typedef enum dsgd_strategy_kind {
    DSGD_STRATEGY_ONE_DEVICE = 0, /* one replica on the calling thread, no transport */
    DSGD_STRATEGY_MIRRORED = 1,   /* N replicas, one thread each, gradients summed in
                                     lockstep (see dsgd_gradient_path) */
    DSGD_STRATEGY_CENTRAL_STORAGE = 2, /* N replicas compute gradients; the variables and
                                     the optimizer state live once, on the host,
                                     updated once per step; the replicas read them
                                     (see CENTRAL STORAGE in strategy_central.h) */
    DSGD_STRATEGY_MULTI_WORKER_MIRRORED = 3, /* mirrored across processes: this
                                     process's N replicas are ranks of a larger
                                     group (see MULTI-WORKER below) */
    DSGD_STRATEGY_PARAMETER_SERVER = 4, /* the N replicas are the workers of
                                     desc.ps parameter servers, which hold the
                                     variables and apply the updates (see
                                     PARAMETER SERVERS AS A STRATEGY in
                                     strategy_ps.h) */
    DSGD_STRATEGY_LOCAL = 5       /* local SGD, post-local SGD, DiLoCo: the
                                     replicas train alone and average every
                                     desc.local.period steps, in one process
                                     or across workers (see LOCAL SGD in
                                     strategy_local.h) */
} dsgd_strategy_kind;
#define DSGD_STRATEGY_COUNT (DSGD_STRATEGY_LOCAL + 1)

/* What a training step does when a gradient holds NaN or infinity on any
   replica. Every replica checks its own gradient before the exchange and
   the replicas agree through a MAX all-reduce of a flag, so all of them do
   the same thing. */
typedef enum dsgd_nonfinite_policy {
    DSGD_NONFINITE_SKIP = 0, /* every replica skips the update (weights and
                                optimizer state unchanged); the step reports
                                skipped = 1 and returns DSGD_OK */
    DSGD_NONFINITE_ERROR = 1 /* every replica returns DSGD_ERR_NON_FINITE */
} dsgd_nonfinite_policy;

/* How a synchronous step's gradients are summed across replicas (see
   BACKENDS at the top of this file). */
typedef enum dsgd_gradient_path {
    DSGD_GRADIENTS_AUTO = 0, /* DEVICE when every replica's backend can reach
                                every other's buffers (OpenCL backends of one
                                context on one device; not across devices)
                                and some backend's buffers are not in
                                host-shared memory (a discrete GPU), else HOST:
                                where mapping copies nothing the host's
                                all-reduce is as fast (measured on PoCL) */
    DSGD_GRADIENTS_HOST,     /* through host memory and the transport: each
                                replica uses its gradient buffer's host pointer
                                (CPU backend), or maps it (zero-copy on devices
                                that share memory), or else copies it to a host
                                staging buffer and back; then dsgd_allreduce
                                with the strategy's algorithm and buckets */
    DSGD_GRADIENTS_DEVICE    /* on the devices, with no host copy: after a
                                barrier, replica r sums block r (see
                                dsgd_block_range) of every replica's gradient
                                buffer in rank order and writes the sum to all
                                of them (backend sum_across; 2*N*S bytes moved
                                for S bytes of gradient in all), then a second
                                barrier. algorithm and bucket_bytes are unused.
                                Gives the bits of HOST with the DIRECT
                                algorithm. dsgd_strategy_create fails with
                                DSGD_ERR_INVALID_ARGUMENT when the backends
                                cannot do it (with one replica nothing is
                                exchanged and the path resolves to HOST) */
} dsgd_gradient_path;
#define DSGD_GRADIENTS_COUNT (DSGD_GRADIENTS_DEVICE + 1)

/* The most replicas a strategy runs. */
#define DSGD_MAX_REPLICAS 256

/* DSGD_STRATEGY_PARAMETER_SERVER's servers and how they update (ps.h: the
   engine's dsgd_ps_desc, whose workers are the replicas, whose optimizer
   is desc.optimizer and whose deadline desc.timeout_s). */
typedef struct dsgd_strategy_ps_desc {
    int num_servers;              /* P, 1..4096 */
    dsgd_ps_policy policy;        /* default ASYNC */
    int staleness;                /* SSP: the bound s; other policies 0 */
    int backup_workers;           /* BACKUP: b < num_replicas; other policies 0 */
    dsgd_ps_apply apply;          /* default ON_SERVERS */
    dsgd_partitioner partitioner; /* how variables are cut into shards; zero:
                                     whole variables, round-robin */
    double retry_s;               /* a worker resends after this; 0:
                                     DSGD_PS_DEFAULT_RETRY_S */
} dsgd_strategy_ps_desc;

/* DSGD_STRATEGY_LOCAL's outer step: what a round's averaged pseudo-gradient
   (the mean over replicas of the round's start minus each replica's
   weights) does to the round's start (LOCAL SGD in strategy_local.h). */
typedef enum dsgd_outer_kind {
    DSGD_OUTER_AVERAGE = 0, /* model averaging (local SGD): the round's start
                               minus the mean pseudo-gradient, the replicas'
                               mean weights within one rounding */
    DSGD_OUTER_NESTEROV,    /* DiLoCo (Douillard et al. 2023): SGD with
                               Nesterov momentum on the round's start, the
                               optimizer MOMENTUM's rule with nesterov */
    DSGD_OUTER_SGD          /* the start minus outer_lr times the mean
                               pseudo-gradient: NESTEROV with momentum 0
                               (which a zero field cannot ask for), a
                               server learning rate as in FedOpt */
} dsgd_outer_kind;
#define DSGD_OUTER_COUNT (DSGD_OUTER_SGD + 1)

/* DSGD_STRATEGY_LOCAL's rounds (zero fields: the defaults). */
typedef struct dsgd_strategy_local_desc {
    int period;            /* H: local steps between two averagings, >= 1;
                              0: 8 */
    int64_t warmup_steps;  /* synchronous (MIRRORED) steps first, post-local
                              SGD (Lin et al. 2020); default 0 */
    dsgd_outer_kind outer; /* default AVERAGE */
    float outer_lr;        /* NESTEROV, SGD: > 0; 0: 0.7 for NESTEROV (DiLoCo),
                              1 for SGD; AVERAGE ignores it */
    float outer_momentum;  /* NESTEROV: in [0, 1); 0: 0.9; the others
                              ignore it */
    dsgd_wire wire;        /* the pseudo-gradient's wire: F32 (default, 4
                              bytes a parameter), F16 or BF16 (2 bytes, sums
                              in fp32 at every hop: dsgd_allreduce_wire, the
                              ring) */
    int agree_in_process;  /* non-zero: a local step's agreement stays in
                              this process (its replicas agree in memory),
                              so across workers nothing is exchanged
                              between two averagings, and a failure or a
                              non-finite gradient on one worker is that
                              worker's (AGREEMENT IN PROCESS in
                              strategy_local.h); 0: every local step
                              agrees over the transport (default) */
} dsgd_strategy_local_desc;

/* Called on the strategy's thread after the group shrank from old_world
   to new_world replicas, before the step is retried; survivors[i] is the
   rank (before the shrink) of the replica that is now rank i. The
   strategy may be read (dsgd_strategy_num_replicas_in_sync, its models),
   not driven, from it. */
typedef struct dsgd_strategy dsgd_strategy;
typedef void (*dsgd_resize_fn)(void *user, int old_world, int new_world, const int *survivors, dsgd_strategy *s);

/* Elastic synchronous training (ELASTIC in strategy_elastic.h). */
typedef struct dsgd_strategy_elastic_desc {
    int min_replicas;         /* 0: not elastic (a failure fails the
                                 strategy); else 1..W: the fewest replicas
                                 the group trains on */
    double grace_s;           /* below min_replicas: how long to wait before
                                 failing; 0: none */
    dsgd_resize_fn on_resize; /* may be NULL */
    void *user;               /* on_resize's */
} dsgd_strategy_elastic_desc;

typedef struct dsgd_strategy_desc {
    dsgd_strategy_kind kind;        /* default ONE_DEVICE */
    int num_replicas;               /* MIRRORED, CENTRAL_STORAGE: default 1;
                                       ONE_DEVICE: 0 or 1 */
    dsgd_model_desc model;          /* every replica's model; max_batch is per replica;
                                       model.backend is ignored (see backend_factory) */
    dsgd_optimizer_desc optimizer;  /* every replica's optimizer */
    dsgd_allreduce_algo algorithm;  /* gradient all-reduce (MIRRORED, HOST path);
                                       default AUTO */
    size_t bucket_bytes;            /* HOST path: all-reduce the gradient in buckets of
                                       this many bytes; 0: one bucket (the whole flat
                                       buffer). Each bucket goes through
                                       dsgd_allreduce_at at its offset, so the
                                       weights do not depend on it, for every
                                       algorithm (only the speed does) */
    size_t piece_bytes;             /* every replica's communicator processes its
                                       collectives in pieces of this many bytes
                                       (dsgd_comm_desc.piece_bytes): 0: the default,
                                       256 KiB; any other value is clamped to
                                       256 B..1 GiB, never rejected. The same on
                                       every replica, and the weights do not depend
                                       on it (only the speed does) */
    dsgd_nonfinite_policy nonfinite; /* default SKIP */
    double timeout_s;               /* deadline of every collective; 0:
                                       DSGD_DEFAULT_TIMEOUT_S (30 s) */
    dsgd_backend_factory backend_factory; /* NULL: a CPU backend per replica */
    void *backend_user_data;
    int cpu_threads;                /* the CPU backends made when backend_factory is
                                       NULL: threads of each (dsgd_cpu_backend_desc,
                                       CPU THREADS). 0: dsgd_cpu_count() / N, at
                                       least 1, so that N replicas never ask for
                                       more threads than there are cores; n in
                                       1..DSGD_CPU_MAX_THREADS: n each. The weights
                                       do not depend on it (only the speed does) */
    dsgd_gradient_path gradient_path; /* default AUTO */
    /* The transport the replicas communicate over (MIRRORED with N > 1).
       NULL: a loopback hub of the strategy's own. Otherwise N endpoints of
       one group, endpoints[i] being replica i's (rank i of size N, with send
       and recv); the strategy copies the tables, and uses endpoints[i] only
       from replica i's thread (abort, when set, from any). Their impl must
       outlive the strategy, which never destroys them. Without abort, the
       replicas a failing one leaves waiting return at their deadline. */
    const dsgd_transport_i *endpoints;
    int ranks_per_node;             /* the replicas' node layout for
                                       DSGD_ALLREDUCE_HIERARCHICAL (and AUTO's
                                       choice of it), dsgd_comm_desc.ranks_per_node:
                                       global ranks node*L .. node*L + L - 1 share
                                       a node; L divides the replicas in sync.
                                       0: the endpoints' layout (the MPI
                                       transport's, from MPI_Comm_split_type),
                                       else one node */
    dsgd_strategy_ps_desc ps;       /* PARAMETER_SERVER only (ignored by the others) */
    int overlap;                    /* MIRRORED, MULTI_WORKER_MIRRORED, HOST path:
                                       non-zero all-reduces each bucket of
                                       bucket_bytes on a communication thread
                                       of the replica's as soon as backward has
                                       finished its variables, while backward
                                       goes on (OVERLAP in strategy_overlap.h;
                                       the CPU backend; elsewhere the exchange
                                       runs after backward). The same weights,
                                       bit for bit, as without, at any
                                       bucket_bytes, piece_bytes and
                                       cpu_threads. Over simnet each rank
                                       runs a compute and a communication
                                       lane on the virtual clock (TWO LANES
                                       in strategy_overlap.h); refused over
                                       another transport with its own
                                       clock. 0: after backward */
    dsgd_strategy_local_desc local; /* LOCAL only (ignored by the others) */
    const dsgd_comm_hook *comm_hook; /* MIRRORED, MULTI_WORKER_MIRRORED, HOST
                                       path: your code exchanges each bucket
                                       instead of the SUM all-reduce, on
                                       every replica (COMM HOOKS in
                                       comm_hook.h; the buckets then hold
                                       whole variables); the table is copied.
                                       NULL: the all-reduce */
    dsgd_strategy_elastic_desc elastic; /* MIRRORED, MULTI_WORKER_MIRRORED:
                                       shrink past a failed replica instead
                                       of failing (ELASTIC in
                                       strategy_elastic.h); zero: not
                                       elastic */
} dsgd_strategy_desc;

/* What one training step did. Asking for it costs a wait for the step's
   verdict where the verdict stays on the device (THE VERDICT ON THE
   DEVICE above). */
/* Why elastic training dropped a replica (dsgd_step_info.dropped_why;
   see strategy_elastic.h). */
typedef enum dsgd_drop_reason {
    DSGD_DROP_FAILED = 1, /* it failed before the update (its batch function, its backend) */
    DSGD_DROP_GONE,       /* its transport stopped under it (a simnet KILL: its rank is dead) */
    DSGD_DROP_LATE        /* it entered the step's collective after another had given up on it (a stall) */
} dsgd_drop_reason;

typedef struct dsgd_step_info {
    int64_t step;      /* optimizer steps applied before this one */
    int count;         /* samples in the global batch */
    int skipped;       /* 1 when the update was skipped (non-finite gradient) */
    float lr;          /* learning rate the step used */
    double exchange_s; /* seconds replica 0's gradient all-reduces took (on
                          its communication thread with overlap); 0: none.
                          Mirrored and multi-worker over simnet: virtual
                          seconds (TWO LANES in strategy_overlap.h) */
    double exposed_s;  /* the seconds replica 0 waited for the exchange
                          after its backward pass: exchange_s without
                          overlap; with it exchange_s - exposed_s was
                          hidden behind backward (exposed_s exceeds
                          exchange_s by the hand-offs to the thread where
                          there is little to hide) */
    int averaged;      /* LOCAL: 1 when the step ended a round and the
                          replicas averaged (exchange_s is then the
                          averaging's all-reduce); else 0 */
    int world;         /* the replicas in sync that made the step */
    int resized;       /* elastic: 1 when the group shrank in this call
                          (the step was then made by the survivors) */
    int dropped;       /* elastic: the replicas dropped in this call (0: none) */
    /* the first `dropped` entries: each one's rank in the group as the
       call began (the global rank across workers), in rank order per
       shrink, and why it was dropped */
    int dropped_rank[DSGD_MAX_REPLICAS];
    dsgd_drop_reason dropped_why[DSGD_MAX_REPLICAS];
} dsgd_step_info;

/* A replica as seen from inside dsgd_strategy_run (replica context). */
typedef struct dsgd_replica dsgd_replica;
typedef dsgd_result (*dsgd_replica_fn)(dsgd_replica *replica, void *user_data);

/* Creates a strategy: N replicas, each with its own context (labelled
   "replica r", with ctx's logger), backend, model, optimizer and, for N > 1,
   communicator over one loopback hub (or desc->endpoints), and N - 1
   threads that run replicas 1..N-1. All replicas start from the same
   weights (desc->model.seed). The gradient path is resolved here
   (dsgd_strategy_gradient_path).
   Errors (recorded on ctx; a replica's failure is copied from its context):
   DSGD_ERR_INVALID_ARGUMENT (out or desc NULL; an unknown kind, non-finite
   policy, algorithm or gradient path; num_replicas < 0 or > DSGD_MAX_REPLICAS; ONE_DEVICE
   with more than one replica; a negative or NaN timeout; cpu_threads < 0 or
   > DSGD_CPU_MAX_THREADS; a bad model or
   optimizer desc; gradient_path DEVICE with several replicas when a backend
   lacks sum_across or cannot reach another's buffers (OpenCL replicas on
   two devices; the message names both), or with
   CENTRAL_STORAGE; a bad comm_hook, or one with gradient_path DEVICE,
   CENTRAL_STORAGE or PARAMETER_SERVER), errors of the comm hook's create,
   DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_SYSTEM (a pthread object or thread could
   not be created), backend errors and whatever backend_factory returns.
   Thread safety: the context's thread, which then drives the strategy:
   every dsgd_strategy_* function is called from it. */
DSGD_API dsgd_result dsgd_strategy_create(dsgd_ctx *ctx, const dsgd_strategy_desc *desc,
                                          dsgd_strategy **out);
/* Stops and joins the replicas' threads and frees everything the strategy
   created (backends through their destroy member); s NULL: nothing.
   Thread safety: the strategy's thread, not inside dsgd_strategy_run. */
DSGD_API void dsgd_strategy_destroy(dsgd_strategy *s);
/* dsgd_strategy_num_replicas: N, this process's replicas (s NULL: 0).
   dsgd_strategy_num_replicas_in_sync: W, the replicas of the whole group:
   N but for a multi-worker strategy (MULTI-WORKER above).
   dsgd_strategy_gradient_path: the path resolved at creation, HOST or DEVICE
   (HOST with one replica, where nothing is exchanged; s NULL: HOST).
   Errors: none. Thread safety: any thread while s lives (fixed at
   creation; an elastic shrink changes N and W on the strategy's thread,
   inside a train step: read them there or from on_resize). */
DSGD_API int dsgd_strategy_num_replicas(const dsgd_strategy *s);
DSGD_API int dsgd_strategy_num_replicas_in_sync(const dsgd_strategy *s);
DSGD_API dsgd_gradient_path dsgd_strategy_gradient_path(const dsgd_strategy *s);
/* What this process's replicas' communicators did since the strategy was
   created: the sum over its replicas of dsgd_comm_stats (collectives.h):
   bytes handed to the transport (agreements included), the same counted
   as fp32 (a half wire's payload twice), and the seconds converting,
   compressing (comm hooks, compress.h) and inside collectives, added over
   the replicas. Every exchange of the synchronous kinds and of LOCAL goes
   through them (the gradients, the agreements, a hook's own collectives,
   the metrics and the checkpoints' gathers); the parameter servers do not
   (their engine, ps.h, counts its own), nor does a single replica, which
   has no communicator: zeros. Divide by steps and replicas for a
   replica's bytes per step; compare bytes_sent with a run without a hook
   for what a compressor saves.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s or out NULL; nothing recorded).
   Thread safety: the strategy's thread, between calls. */
DSGD_API dsgd_result dsgd_strategy_comm_stats(const dsgd_strategy *s, dsgd_comm_stats *out);
/* "auto", "host", "device"; "unknown" for other values. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_gradient_path_name(dsgd_gradient_path p);
/* "one_device", "mirrored", "central_storage", "multi_worker_mirrored",
   "parameter_server", "local"; "unknown" for other values.
   Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_strategy_kind_name(dsgd_strategy_kind kind);
/* Replica r's model, for inspection between steps (NULL when s is NULL or r
   is out of range).
   Errors: none. Thread safety: any thread while s lives (fixed at creation);
   use the model itself only from the strategy's thread, between calls. */
DSGD_API dsgd_model *dsgd_strategy_model(dsgd_strategy *s, int replica);

/* Sets the aggregation of a model variable (by name, e.g. "dense0/kernel", or
   "*" for all). Model variables are trainable and ON_WRITE; their aggregation
   says how the replicas' gradients combine before the identical update:
     MEAN (default)  the mean over every sample of the global batch: each
                     replica's gradient is scaled by 1 / global count and the
                     replicas' gradients are summed; with equal shards this is
                     the mean of the replicas' mean gradients
     SUM             the sum over replicas of each replica's mean gradient
     ONLY_FIRST_REPLICA  replica 0's mean gradient, used by all
   TensorFlow: Keras's optimizer.apply_gradients (TF 2.x, Keras 3 in TF
   2.21) ignores a variable's aggregation and always sums the replicas'
   gradients; with the loss scaled by the global batch, as Keras does, that
   sum is our MEAN, which is the TF behaviour. SUM and ONLY_FIRST_REPLICA are
   our extension: they match TF only for a variable updated directly in
   replica context (v.assign_sub(lr * g) with that aggregation), not for
   training through apply_gradients.
   NONE is rejected (ours: a mirrored variable needs an aggregation to stay
   one value across replicas), and so is ON_READ (only non-trainable
   variables may be ON_READ, the rule of Keras 2's add_weight).
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; variable NULL
   or not a model variable; aggregation NONE or unknown; synchronization
   other than AUTO or ON_WRITE), DSGD_ERR_STATE (the strategy has failed,
   see dsgd_strategy_failed).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_set_aggregation(dsgd_strategy *s, const char *variable,
                                                   dsgd_aggregation aggregation,
                                                   dsgd_synchronization synchronization);

/* One synchronous training step on the global batch x (count, input_dim),
   y (count, target_dim). The batch is sharded in contiguous slices: replica
   r takes dsgd_block_range(count, N, r) (the first count % N replicas take
   one sample more). Every replica then computes its gradient, the replicas
   agree on finiteness, sum the flat gradient buffers (SUM, after the
   per-variable scaling above; on the host or on the devices, see
   dsgd_gradient_path), and apply the same optimizer update, so their
   weights stay bitwise identical. A replica whose slice is empty (count < N)
   contributes a zero gradient. count may be 1..N * max_batch. info may be
   NULL.
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; x or y NULL; count out of range),
   DSGD_ERR_NON_FINITE (policy ERROR), DSGD_ERR_TIMEOUT, DSGD_ERR_STATE (the
   strategy has failed, see dsgd_strategy_failed), or the error chosen as in
   dsgd_strategy_run, with its message, which names the replica. A failure
   the replicas agree on before the update (a class index out of range on
   one replica, a non-finite gradient under policy ERROR) fails the step on
   every replica, changes nothing and leaves the strategy usable. Any other
   failure (in a collective, a timeout, a replica's backend failing in the
   exchange or in the optimizer update, after which the others may have
   updated) stops the other replicas at once and fails the strategy.
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_train_step(dsgd_strategy *s, const float *x, const float *y,
                                              int count, dsgd_step_info *info);
/* A sharded forward pass; loss and accuracy accumulate per replica in the
   EVAL metrics (read with dsgd_strategy_take_metrics). y may be NULL (no
   metrics).
   Errors (recorded on the strategy's ctx): DSGD_ERR_INVALID_ARGUMENT (s
   NULL, nothing recorded; x NULL; count outside 1..N * max_batch; a class
   index out of range), DSGD_ERR_STATE (the strategy has failed, see
   dsgd_strategy_failed), a replica's backend error. A failure here changes
   no weights and leaves the strategy usable (the EVAL metrics may hold part
   of the batch).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_eval_batch(dsgd_strategy *s, const float *x, const float *y,
                                              int count);
/* A replica's batch from your code, for batches that are not rows of one
   float matrix (token sequences, variable-length samples, data each
   replica reads itself): fill *out (zeroed before the call) with this
   replica's batch, count samples in 0..max_batch (0: an empty shard, which
   contributes a zero gradient), whatever the model reads in x, y and data.
   The pointers must stay valid until the step returns. It is called on
   replica `replica`'s thread, for every replica at once, so it must be safe
   to call concurrently for different replicas. An error it returns fails
   the step on every replica as a failure of that replica's own code (with
   the message it recorded on dsgd_replica_ctx's context, or one naming the
   function). */
typedef dsgd_result (*dsgd_batch_fn)(void *user_data, int replica, int num_replicas, dsgd_batch *out);
/* dsgd_strategy_train_step and dsgd_strategy_eval_batch with each
   replica's batch from fn instead of a slice of x and y. A training step
   first learns the global count (a SUM all-reduce of the replicas' counts,
   one float, exact up to 2^24 samples) so that MEAN divides by it as the
   sliced step does: with fn handing each replica the slice
   dsgd_block_range gives, the weights are bitwise those of
   dsgd_strategy_train_step. info->count is the global count.
   Uneven inputs (DDP's Join): a replica whose data has run out hands
   count 0 and contributes a zero gradient while the others go on, and MEAN
   divides by the samples that exist; when no replica has a sample left
   (global count 0) the step returns DSGD_OK on every replica having done
   nothing (info->count 0, no optimizer step): loop until then.
   Errors: as dsgd_strategy_train_step and dsgd_strategy_eval_batch, with
   DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; fn NULL; a count
   outside 0..max_batch, named with its replica) and fn's errors, which the
   replicas agree on before the update (clean: the strategy stays
   usable).
   Thread safety: the strategy's thread; fn runs on N threads at once. */
DSGD_API dsgd_result dsgd_strategy_train_step_fn(dsgd_strategy *s, dsgd_batch_fn fn, void *user_data,
                                                 dsgd_step_info *info);
DSGD_API dsgd_result dsgd_strategy_eval_fn(dsgd_strategy *s, dsgd_batch_fn fn, void *user_data);
/* Reads the TRAIN or EVAL metrics and resets them. They are the ON_READ SUM
   variables "metrics/<slot>/loss_sum", ".../correct" and ".../count" (slot
   "train" or "eval"): each replica's model accumulators are first moved into
   its copies, then the copies are summed over replicas in rank order like
   strategy.reduce(SUM) and reset on every replica. TRAIN counts every sample
   a train step computed a loss for, skipped steps included. The
   accumulators are floats: counts are exact up to 2^24 samples between two
   takes.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; out NULL; an
   unknown slot), DSGD_ERR_STATE (the strategy has failed), a replica's
   backend error (copied to the strategy's ctx).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_take_metrics(dsgd_strategy *s, dsgd_metrics_slot slot,
                                                dsgd_metrics *out);

/* Runs fn on every replica at once (replica context, like strategy.run):
   replica 0 on the calling thread, the others on the strategy's threads; it
   returns when all have returned. A collective in fn must be called by every
   replica, or the others wait until their deadline (a replica that returns
   DSGD_OK without joining does not stop them).
   When fn fails on a replica (returns anything but DSGD_OK), the strategy
   aborts its transport at once: the replicas waiting in a collective, or
   entering one later, get DSGD_ERR_ABORTED within milliseconds instead of
   waiting out their deadline, and their results become DSGD_ERR_ABORTED
   "aborted because replica k failed (...)", k the replica that failed first
   (see dsgd_strategy_replica_result). The strategy has then failed, as the
   transport cannot be used again and fn may have left the replicas
   different: every later call refuses (dsgd_strategy_failed). Recreate it.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; fn NULL),
   DSGD_ERR_STATE (the strategy has failed), else DSGD_OK if every call
   returned it, or one replica's result with its message copied to the
   strategy's ctx, chosen by this rule: the lowest-numbered replica whose
   own code failed (fn returned an error not from a collective); if none,
   the lowest-numbered replica whose collective failed other than by the
   abort (a timeout, a mismatch); if none, the lowest-numbered aborted one.
   Thread safety: the strategy's thread; fn runs on N threads at once. */
DSGD_API dsgd_result dsgd_strategy_run(dsgd_strategy *s, dsgd_replica_fn fn, void *user_data);

/* dsgd_strategy_failed: non-zero once the strategy has failed (s NULL: 0).
   A strategy fails when a call ends in a failure that may have left its
   replicas different or stopped its transport: any failed
   dsgd_strategy_run, and any failed dsgd_strategy_train_step except the
   failures the replicas agree on before the update (see there). That call
   returns its own error; from then on every call that uses the replicas'
   state (train_step, eval_batch, run, take_metrics, set_aggregation and
   the variable functions) returns DSGD_ERR_STATE with a message that names
   the step (the optimizer steps applied before the failing call), the call
   and its error, and says the strategy must be recreated: destroy it and
   create a new one (the getters, dsgd_strategy_model included, still answer,
   for a post-mortem). This holds for every N, one replica included.
   dsgd_strategy_replica_result: replica `replica`'s result in the last call
   that ran the replicas (train_step, eval_batch or run; DSGD_OK before the
   first), and in *message (if message is not NULL) its message, "" when it
   succeeded; the message stays valid until the next such call or destroy.
   s NULL or replica outside [0, N): DSGD_ERR_INVALID_ARGUMENT and "".
   Errors: none (dsgd_strategy_replica_result returns a replica's recorded
   result; nothing is recorded on any context).
   Thread safety: the strategy's thread, outside dsgd_strategy_run. */
DSGD_API int dsgd_strategy_failed(const dsgd_strategy *s);
DSGD_API dsgd_result dsgd_strategy_replica_result(const dsgd_strategy *s, int replica, const char **message);

/* Who made the others wait, over the training steps since the last report
   (dsgd_strategy_wait_report). */
typedef struct dsgd_wait_report {
    int64_t steps;   /* training steps in the window: since the last report, or
                        the strategy's creation */
    double step_s;   /* their mean time, seconds: the longest of the replicas'
                        step times summed over the window, / steps (the
                        communicators' clock: virtual seconds on simnet) */
    int worst;       /* the rank whose fraction (below) is the largest; -1
                        when nobody waited (one replica, no step) */
    double worst_fraction; /* its fraction */
} dsgd_wait_report;

/* Straggler attribution: for every rank k in sync, the fraction of the
   step the OTHER ranks spent waiting for k,
       fraction[k] = mean over ranks j != k of  wait_j(k) / time_j
   where wait_j(k) is what rank j's communicator charged to k during the
   window's training steps (dsgd_comm_get_waits: a straggler's lateness is
   charged to it, not to the ranks that relayed it) and time_j the time of
   those steps on j's clock. The window is the training steps since the
   last call (or creation): only their collectives and time count, not
   eval, take_metrics, dsgd_strategy_run or this call's own exchange; the
   call starts the next window. So "rank 3 made the others wait 41% of
   the step" is worst = 3, worst_fraction = 0.41: a synchronous step lasts
   as long as its slowest replica, and this says which one and how much
   of everyone else's time it cost. Ties go to the lower rank. fraction
   may be NULL; else n >= dsgd_strategy_num_replicas_in_sync(s) doubles,
   global ranks. Multi-worker (W > N): each worker knows only its own
   replicas' waits, so the call all-gathers every replica's row (W + 1
   numbers, as pairs of floats: about 1e-14 relative) over the group: it
   is a collective, which every worker must call at the same point,
   between the same steps, and all get the same report. Strategies whose
   replicas exchange nothing through their communicators (one replica,
   parameter servers) report zeros and worst -1.
   Errors: DSGD_ERR_INVALID_ARGUMENT (s NULL, nothing recorded; out NULL;
   fraction with n below the ranks in sync), DSGD_ERR_STATE (the strategy
   has failed), DSGD_ERR_OUT_OF_MEMORY, and across workers the
   all-gather's errors (which fail the strategy, as a failed collective
   does).
   Thread safety: the strategy's thread. */
DSGD_API dsgd_result dsgd_strategy_wait_report(dsgd_strategy *s, dsgd_wait_report *out, double *fraction, int n);

/* Replica context getters (r NULL: -1, 0 or NULL):
     dsgd_replica_id     the replica's rank, 0..N-1 (multi-worker: its
                         global rank, 0..W-1)
     dsgd_replica_count  N (multi-worker: W)
     dsgd_replica_ctx, dsgd_replica_model, dsgd_replica_comm
                         the replica's own context, model and communicator
                         (comm NULL with one replica)
   Errors: none. Thread safety: the replica's thread, inside
   dsgd_strategy_run; the objects they return belong to that thread while fn
   runs. */
DSGD_API int dsgd_replica_id(const dsgd_replica *r);
DSGD_API int dsgd_replica_count(const dsgd_replica *r);
DSGD_API dsgd_ctx *dsgd_replica_ctx(const dsgd_replica *r);
DSGD_API dsgd_model *dsgd_replica_model(const dsgd_replica *r);
DSGD_API dsgd_comm *dsgd_replica_comm(const dsgd_replica *r);

/* A distributed variable (its functions: strategy_vars.h). */
/* The longest name of a distributed variable, in bytes (without the NUL). */
#define DSGD_MAX_VARIABLE_NAME 63

typedef struct dsgd_dvar_desc {
    const char *name;                    /* 1..DSGD_MAX_VARIABLE_NAME bytes, unique */
    size_t count;                        /* floats, >= 1 */
    dsgd_synchronization synchronization; /* AUTO = ON_WRITE */
    dsgd_aggregation aggregation;
    int trainable;                       /* ON_READ requires trainable == 0 */
    const float *initial_value;          /* count floats, copied to every replica's
                                            copy (so a cross-replica read of an ON_READ
                                            SUM variable starts at N x initial); NULL: zeros */
} dsgd_dvar_desc;

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_STRATEGY_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_STRATEGY_IMPL)
#define DSGD__PART_STRATEGY_IMPL

#include <pthread.h>

/* >>strategy --------------------------------------------------------------- */

typedef struct dsgd__dvar {
    char name[DSGD_MAX_VARIABLE_NAME + 1];
    size_t count;
    dsgd_synchronization sync; /* ON_WRITE or ON_READ (AUTO resolved) */
    dsgd_aggregation agg;
    int trainable;
    float *copies; /* num_replicas * count: replica r's copy at r * count */
} dsgd__dvar;

/* A replica's exchange beside its backward (strategy_overlap.h). */
typedef struct dsgd__overlap dsgd__overlap;
/* desc.comm_hook's copy, its buckets and states (strategy_overlap.h). */
typedef struct dsgd__hook dsgd__hook;

struct dsgd_replica {
    dsgd_strategy *s;
    int rank;
    dsgd__member m; /* its context, backend and model (group.h) */
    dsgd_optimizer *opt;
    dsgd_transport_i ep;
    dsgd_comm *comm;
    float *stage; /* host staging: gradients of backends without host pointers, variable writes */
    size_t stage_cap;
    pthread_t thread;
    int thread_started;
    dsgd_result result; /* of the last job */
    char msg[DSGD__MSG_MAX]; /* its message ("" when it succeeded) */
    int own_error;      /* 0: the failure only echoes another replica's */
    int comm_failed;    /* a collective failed: the transport's state is unknown */
    int clean_fail;     /* set by the job: its failure left every replica as it was */
    int skipped;
    float lr;
    int global;         /* the global batch of the last step */
    int local;          /* index in the strategy's reps (rank - first) */
    /* THE VERDICT ON THE DEVICE (s->defer): this step's non-finite flag,
       the last step's read back into vhost, done at vmark (NULL: none
       pending) */
    dsgd_buffer *vflag;
    float vhost;
    void *vmark;
    int64_t t_step;     /* optimizer steps before this step's update */
    dsgd__overlap *ov;  /* desc.overlap where it runs, else NULL */
    double exchange_s, exposed_s; /* the last step's (dsgd_step_info) */
    int averaged;       /* LOCAL: the last step averaged (dsgd_step_info) */
    int stop_by;        /* phase 2 agreed that this replica (rank) failed; -1: none */
    void *sub;          /* elastic: the survivors' endpoint's state (strategy_elastic.h) */
    /* elastic's settle (SETTLE in strategy_elastic.h), under s->mu: where
       this step's job is (DSGD__EL_*), when it entered its last collective
       (its clock), that collective's result, and whether it was one of
       phases 0 and 2, before the update */
    int el_phase;
    double el_entered;
    dsgd_result el_cr;
    int el_fail;
    /* dsgd_strategy_wait_report's window (with a communicator): its
       waits per global rank at the step's start (W), the window's sum
       (W) and scratch (W); the steps' summed time and count */
    double *wait_at, *wait_sum, *wait_now;
    double wait_time, wait_t0;
    int64_t wait_steps;
};

/* A strategy kind is a table of these operations; dsgd_strategy_create
   picks it by desc.kind from dsgd__strategy_kinds (strategy_kinds.h). A new
   kind adds a part with its table and a line there, not branches. Everything
   else (replicas, their threads, the transport, failure handling, variables,
   metrics) is common, here. */
typedef struct dsgd__strategy_ops {
    const char *name;
    /* the kind's rules for the desc, after the common ones; may be NULL */
    dsgd_result (*check)(dsgd_ctx *ctx, const dsgd_strategy_desc *d);
    /* after the replicas exist (models, optimizers, communicators), before
       the threads start; may be NULL */
    dsgd_result (*setup)(dsgd_strategy *s);
    /* one replica's part of dsgd_strategy_train_step (user: dsgd__step_args) */
    dsgd_replica_fn step;
    /* after the threads stopped, before the replicas go; undoes setup (also
       a partial one); may be NULL */
    void (*teardown)(dsgd_strategy *s);
    /* where the variables and the optimizer's state live once, if not in
       every replica (a checkpoint saves and restores them; the replicas
       then get the parameters and the step); NULL: every replica holds
       them, equal (replica 0's are saved) */
    dsgd__ck_vars (*state)(dsgd_strategy *s);
    /* non-zero: the replicas may be part of a larger group (the endpoints'
       size), spread over processes (MULTI-WORKER above) */
    int multi_worker;
    /* the kind places its replicas on desc.endpoints itself (s->n,
       s->world, s->first, the shards, each replica's ep; it may leave no
       replica at all); NULL: the common rule (dsgd__strategy_transport) */
    dsgd_result (*layout)(dsgd_strategy *s);
    /* at destroy, while the replicas' threads still run (it may dispatch a
       last job), unless the strategy failed; may be NULL */
    void (*stop)(dsgd_strategy *s);
    /* the kind's own state beside the checkpoint's file (strategy_checkpoint.h),
       NULL: the file holds it all. save: on every process before the file
       is written (it may bring the state into replica 0's model and
       optimizer) and setting *writes to 0 where this process writes no
       file; restore: phase 0 once the file's checks passed (check and
       stage the kind's own state against the file's step, -1 where no
       file was read, touching nothing), 1 after the file was applied (put
       the staged state in place), -1 to drop what phase 0 staged. With
       these a process may hold no replica (s->n == 0): it then reads and
       writes only the kind's own state. */
    dsgd_result (*save)(dsgd_strategy *s, const char *path, int *writes);
    dsgd_result (*restore)(dsgd_strategy *s, const char *path, int phase, int64_t step);
    /* what the kind allows (DSGD__KIND_*): a feature asks the row, never
       the kind */
    unsigned caps;
    /* the kind's own options folded into the fingerprint the workers
       agree on (dsgd__strategy_fingerprint), defaults applied; may be NULL */
    uint64_t (*fingerprint)(const dsgd_strategy *s, uint64_t h);
} dsgd__strategy_ops;

/* dsgd__strategy_ops.caps */
enum {
    DSGD__KIND_HOOKS = 1,   /* a comm hook exchanges its gradient (on the HOST path) */
    DSGD__KIND_ELASTIC = 2, /* desc.elastic: the group shrinks past a failed replica */
    DSGD__KIND_GROW = 4,    /* dsgd_strategy_grow admits joiners into this process's group */
    DSGD__KIND_REGROUP = 8  /* dsgd_strategy_regroup takes a new group of processes */
};

/* The argument of a kind's step: the global batch. */
typedef struct dsgd__step_args {
    const float *x, *y;
    int count;
    dsgd_batch_fn fn;  /* non-NULL: each replica's batch comes from fn (x, y, count unused) */
    void *fn_user;
    int verdict;       /* s->defer: wait for this step's verdict (the caller asked for info) */
} dsgd__step_args;

struct dsgd_strategy {
    dsgd_ctx *ctx;
    dsgd_strategy_desc d;   /* defaults applied (dsgd__strategy_defaults) */
    const dsgd__strategy_ops *ops;
    int n;                  /* this process's replicas (threads) */
    int world, first;       /* the group's replicas, and rank of reps[0]; W = n, first 0 but multi-worker */
    /* the global batch is cut into shard_count shards, replica i taking
       shard shard_first + i: world and first, but for a kind whose layout
       says otherwise (parameter servers across processes) */
    int shard_count, shard_first;
    dsgd_replica *reps;
    dsgd_loopback *hub;     /* the strategy's own transport, when desc.endpoints is NULL */
    dsgd_aggregation *param_agg; /* per model variable */
    int all_mean;
    dsgd__dvar *vars;
    int num_vars, cap_vars;
    dsgd_gradient_path path; /* resolved: HOST or DEVICE */
    dsgd_ref *grad_refs;     /* DEVICE: every replica's gradient buffer */
    void **marks;            /* DEVICE with marks: each replica's "gradient
                                done" (0..n-1) and "sum done" (n..2n-1) */
    int defer;               /* the non-finite verdict stays on the device */
    dsgd_ref *flag_refs;     /* defer, n > 1: every replica's vflag */
    int metric_var[2]; /* first of the three metric variables of each slot */
    void *kind_data;   /* the kind's own state: its setup creates it, its teardown frees it */
    /* the kind's own sections inside the checkpoint's file
       (strategy_checkpoint.h), set by its setup; NULL: none. ck_put: with
       w NULL on every process first (across workers a collective that
       brings what the chief writes), then with w where the file is
       written. ck_take: phase 0 checks f, touching nothing; 1 writes it
       into the replicas, after the common state */
    dsgd_result (*ck_put)(dsgd_strategy *s, dsgd__ck_writer *w);
    dsgd_result (*ck_take)(dsgd_strategy *s, const dsgd__ck_file *f, int phase);
    dsgd__hook *hook;  /* desc.comm_hook's (the synchronous kinds' setup); NULL: none */
    /* elastic (strategy_elastic.h, set at creation): after a failed step,
       non-zero when the group shrank and the step is to be retried; else
       *res may be replaced */
    int (*elastic)(dsgd_strategy *s, const dsgd__step_args *a, const char *what, dsgd_result *res);
    int resized;       /* the group shrank in the current call */
    /* the replicas dropped in the current call (dsgd_step_info.dropped);
       call_rank: each rank's rank as the call began (valid once resized) */
    int dropped, drop_rank[DSGD_MAX_REPLICAS], call_rank[DSGD_MAX_REPLICAS];
    unsigned char drop_why[DSGD_MAX_REPLICAS];
    /* elastic over the endpoints you gave, every replica in this process
       (strategy_elastic.h, set at creation): replica r, whose collective of
       phase 0 or 2 failed with res, settles instead of aborting the
       transport; returns res or the settle's error. NULL: none */
    dsgd_result (*el_settle)(dsgd_replica *r, dsgd_result res);
    /* failed: a failure may have left the replicas different, or stopped the
       transport; every call but the getters and destroy refuses (the one
       check: dsgd__strategy_usable) */
    int failed;
    int64_t fail_step;      /* optimizer steps applied before the failing call */
    const char *fail_in;    /* the failing call */
    char fail_msg[DSGD__MSG_MAX]; /* the error it returned */
    int abort_by;           /* the replica that aborted the transport, -1: none (under mu) */
    /* the worker pool: replicas 1..n-1 wait for a new generation of job */
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    int sync_ready;
    uint64_t gen;
    int pending, shutdown;
    dsgd_replica_fn job;
    void *job_user;
};

/* ---- the replicas' threads and failures */

/* Stops every replica's transport at once because local replica `local`
   failed; the first caller is the one the others' messages name (by its
   global rank). */
static void dsgd__strategy_abort(dsgd_strategy *s, int local) {
    const dsgd_transport_i *t = &s->reps[local].ep;
    if (!t->abort) return;
    pthread_mutex_lock(&s->mu);
    if (s->abort_by < 0) s->abort_by = s->reps[local].rank;
    pthread_mutex_unlock(&s->mu);
    t->abort(t->impl);
}

/* THE VERDICT ON THE DEVICE: takes replica r's pending verdict, if any
   (waiting for it when it is not in yet): a flag set means the update of
   that step was not made on the device; its optimizer step is taken back,
   *skipped (may be NULL) set, and under DSGD_NONFINITE_ERROR it is
   DSGD_ERR_NON_FINITE, recorded and clean (every replica holds the same
   summed flag, so all of them stop). `when` says when it was taken. */
static dsgd_result dsgd__replica_settle(dsgd_replica *r, int *skipped, const char *when) {
    const dsgd_backend_i *be = &r->m.be;
    dsgd_result res;
    if (skipped) *skipped = 0;
    if (!r->vmark) return DSGD_OK;
    res = be->wait_mark(be->impl, r->vmark);
    be->release_mark(be->impl, r->vmark);
    r->vmark = NULL;
    if (res != DSGD_OK || r->vhost == 0.0f) return res;
    dsgd__optimizer_unstep(r->opt);
    if (skipped) *skipped = 1;
    if (r->s->d.nonfinite != DSGD_NONFINITE_ERROR) return DSGD_OK;
    r->clean_fail = 1;
    return dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_NON_FINITE,
                              "step %lld: non-finite gradient (the replicas' verdict, kept on the device, taken %s); "
                              "nothing was updated; every replica stops",
                              (long long)dsgd_optimizer_steps(r->opt), when);
}

/* A job: drops replica r's pending verdict (a restore replaces what it
   would change). */
static dsgd_result dsgd__replica_drop_verdict(dsgd_replica *r, void *user) {
    DSGD__UNUSED(user);
    if (r->vmark) r->m.be.release_mark(r->m.be.impl, r->vmark);
    r->vmark = NULL;
    return DSGD_OK;
}

static dsgd_result dsgd__replica_noop(dsgd_replica *r, void *user) {
    DSGD__UNUSED(r);
    DSGD__UNUSED(user);
    return DSGD_OK;
}

/* Frees what replica r owns (its thread is joined, the kind torn down). */
static void dsgd__replica_destroy(dsgd_replica *r) {
    dsgd_comm_destroy(r->comm);
    r->comm = NULL;
    DSGD_FREE(r->sub);
    DSGD_FREE(r->wait_at);
    dsgd_optimizer_destroy(r->opt);
    DSGD_FREE(r->stage);
    dsgd__member_destroy(&r->m);
}

/* dsgd_strategy_wait_report's accounting around a training step: the
   communicator's waits and clock at its start, and what the step added. */
static void dsgd__replica_wait_begin(dsgd_replica *r) {
    if (!r->wait_at || !r->comm) return; /* no communicator (an elastic group shrunk to one): nobody waits */
    dsgd_comm_get_waits(r->comm, r->wait_at, r->s->world);
    r->wait_t0 = dsgd__comm_now(r->comm);
}
static void dsgd__replica_wait_end(dsgd_replica *r) {
    int k;
    if (!r->wait_at || !r->comm) return;
    r->wait_time += dsgd__comm_now(r->comm) - r->wait_t0;
    r->wait_steps++;
    dsgd_comm_get_waits(r->comm, r->wait_now, r->s->world);
    for (k = 0; k < r->s->world; ++k) /* a reset inside the step (dsgd_comm_reset_stats) restarts from 0 */
        r->wait_sum[k] += r->wait_now[k] >= r->wait_at[k] ? r->wait_now[k] - r->wait_at[k] : r->wait_now[k];
}

/* ELASTIC's settle (strategy_elastic.h): where a replica's step is
   (el_phase, under s->mu; the shrink reads it once the step returned
   everywhere): busy (anywhere, the transport included), done, settling,
   settled, gone. */
enum { DSGD__EL_BUSY = 0, DSGD__EL_DONE, DSGD__EL_SETTLING, DSGD__EL_SETTLED, DSGD__EL_GONE };

/* Replica r enters (on 1) or has left (on 0, with the collective's result
   cr) a collective of the step: phase 0 or 2 (pre 1), or another (pre 0).
   Only where the strategy settles (s->el_settle). */
static void dsgd__replica_el_coll(dsgd_replica *r, int on, int pre, dsgd_result cr) {
    dsgd_strategy *s = r->s;
    if (!s->el_settle || !r->comm) return;
    pthread_mutex_lock(&s->mu);
    if (on) r->el_entered = dsgd__comm_now(r->comm);
    if (!on && cr != DSGD_OK) {
        r->el_cr = cr;
        r->el_fail = pre;
    }
    pthread_mutex_unlock(&s->mu);
}

/* Non-zero when replica r's failure was settled (it left the transport as
   the survivors need it: no abort, no failed strategy). */
static int dsgd__replica_settled(const dsgd_replica *r) {
    return r->s->el_settle && (r->el_phase == DSGD__EL_SETTLED || r->el_phase == DSGD__EL_GONE);
}

/* Replica r's job is over, unless it settled. */
static void dsgd__replica_el_done(dsgd_replica *r) {
    dsgd_strategy *s = r->s;
    if (!s->el_settle) return;
    pthread_mutex_lock(&s->mu);
    if (r->el_phase < DSGD__EL_DONE) r->el_phase = DSGD__EL_DONE;
    pthread_mutex_unlock(&s->mu);
}

/* Runs fn as replica r (on r's thread) and classifies its failure. A
   failure the job did not mark clean aborts the transport at once, so that the
   replicas waiting for r in a collective return now instead of at their
   deadline; theirs, caused by the abort, then say so. */
static dsgd_result dsgd__replica_job(dsgd_replica *r, dsgd_replica_fn fn, void *user) {
    dsgd_strategy *s = r->s;
    dsgd_result res;
    int by;
    r->own_error = 1;
    r->comm_failed = 0;
    r->clean_fail = 0;
    r->stop_by = -1;
    /* a verdict still pending is taken before any other job (but the one
       that drops it) */
    res = r->vmark && fn != s->ops->step && fn != dsgd__replica_drop_verdict
              ? dsgd__replica_settle(r, NULL, "at the next call")
              : DSGD_OK;
    if (fn == s->ops->step) dsgd__replica_wait_begin(r);
    if (res == DSGD_OK) res = fn(r, user);
    if (fn == s->ops->step) dsgd__replica_wait_end(r);
    if (res == DSGD_OK) {
        dsgd__replica_el_done(r);
        r->msg[0] = '\0';
        return res;
    }
    if (dsgd_comm_broken(r->comm)) r->comm_failed = 1; /* also a collective called by a user's fn */
    if (s->el_settle && fn == s->ops->step && r->el_fail) res = s->el_settle(r, res);
    dsgd__replica_el_done(r);
    if ((!r->clean_fail || r->comm_failed) && !dsgd__replica_settled(r)) dsgd__strategy_abort(s, r->local);
    pthread_mutex_lock(&s->mu);
    by = s->abort_by;
    pthread_mutex_unlock(&s->mu);
    if (by >= 0 && by != r->rank && r->comm_failed && res != DSGD_ERR_TIMEOUT) {
        char detail[DSGD__MSG_MAX];
        const char *d = dsgd_ctx_last_error(r->m.ctx);
        const char *own = dsgd_ctx_label(r->m.ctx);
        size_t label = strlen(own);
        if (label && !strncmp(d, own, label) && !strncmp(d + label, ": ", 2)) d += label + 2;
        snprintf(detail, sizeof(detail), "%s", d);
        r->own_error = 0;
        res = dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_ABORTED, "aborted because replica %d failed (%s)", by, detail);
    }
    snprintf(r->msg, sizeof(r->msg), "%s", dsgd_ctx_last_error(r->m.ctx));
    return res;
}

static void *dsgd__replica_main(void *arg) {
    dsgd_replica *r = (dsgd_replica *)arg;
    dsgd_strategy *s = r->s;
    uint64_t seen = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        dsgd_replica_fn fn;
        void *user;
        dsgd_result res;
        while (s->gen == seen && !s->shutdown) pthread_cond_wait(&s->cv_start, &s->mu);
        if (s->shutdown) break;
        seen = s->gen;
        fn = s->job;
        user = s->job_user;
        pthread_mutex_unlock(&s->mu);
        res = dsgd__replica_job(r, fn, user);
        pthread_mutex_lock(&s->mu);
        r->result = res;
        if (--s->pending == 0) pthread_cond_broadcast(&s->cv_done);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* How much a replica's failure explains: a local failure (3) over a failed
   collective (2) over an echo of another replica's failure (1). */
static int dsgd__error_rank(const dsgd_replica *r) {
    if (!r->own_error) return 1;
    return r->comm_failed ? 2 : 3;
}

/* The one check of a failed strategy, at the top of every call that uses
   the replicas' state. */
static dsgd_result dsgd__strategy_usable(dsgd_strategy *s, const char *what) {
    if (s->n == 0)
        return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE,
                                  "%s: this process holds no replica, only %s's servers: there is nothing to run "
                                  "here (dsgd_strategy_destroy waits for the workers)", what, s->ops->name);
    if (!s->failed) return DSGD_OK;
    return dsgd_ctx_set_error(s->ctx, DSGD_ERR_STATE,
                              "%s: refused: the strategy failed at step %lld in %s and must be recreated "
                              "(its replicas may differ, its transport is stopped): %s",
                              what, (long long)s->fail_step, s->fail_in, s->fail_msg);
}

/* Marks the strategy failed at step in `what` with msg: every later call
   but destroy is refused (dsgd__strategy_usable). */
static void dsgd__strategy_fail(dsgd_strategy *s, int64_t step, const char *what, const char *msg) {
    s->failed = 1;
    s->fail_step = step;
    s->fail_in = what;
    snprintf(s->fail_msg, sizeof(s->fail_msg), "%s", msg);
}

/* Runs fn on all replicas and reports the failure that explains most, the
   lowest replica among equals. A failure that no job marked clean fails the
   strategy. */
static dsgd_result dsgd__strategy_dispatch(dsgd_strategy *s, dsgd_replica_fn fn, void *user, const char *what) {
    int i, pick = -1, clean = 1;
    int64_t step = dsgd_optimizer_steps(s->reps[0].opt);
    dsgd_result r0;
    if (s->el_settle) { /* this job's reports only (SETTLE in strategy_elastic.h) */
        pthread_mutex_lock(&s->mu);
        for (i = 0; i < s->n; ++i) {
            s->reps[i].el_phase = DSGD__EL_BUSY;
            s->reps[i].el_fail = 0;
            s->reps[i].el_cr = DSGD_OK;
        }
        pthread_mutex_unlock(&s->mu);
    }
    if (s->n > 1) {
        pthread_mutex_lock(&s->mu);
        s->job = fn;
        s->job_user = user;
        s->pending = s->n - 1;
        ++s->gen;
        pthread_cond_broadcast(&s->cv_start);
        pthread_mutex_unlock(&s->mu);
    }
    r0 = dsgd__replica_job(&s->reps[0], fn, user);
    if (s->n > 1) {
        pthread_mutex_lock(&s->mu);
        while (s->pending > 0) pthread_cond_wait(&s->cv_done, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    s->reps[0].result = r0;
    for (i = 0; i < s->n; ++i)
        if (s->reps[i].result != DSGD_OK && (pick < 0 || dsgd__error_rank(&s->reps[i]) > dsgd__error_rank(&s->reps[pick])))
            pick = i;
    if (pick < 0) return DSGD_OK;
    for (i = 0; i < s->n; ++i)
        if (s->reps[i].result != DSGD_OK && (!s->reps[i].clean_fail || s->reps[i].comm_failed) &&
            !dsgd__replica_settled(&s->reps[i]))
            clean = 0;
    if (!clean) dsgd__strategy_fail(s, step, what, s->reps[pick].msg);
    return dsgd_ctx_set_error(s->ctx, s->reps[pick].result, "%s", s->reps[pick].msg);
}

static float *dsgd__replica_stage(dsgd_replica *r, size_t count) {
    if (r->stage_cap < count) {
        float *p = (float *)DSGD_REALLOC(r->stage, sizeof(float) * (count ? count : 1));
        if (!p) {
            dsgd_ctx_set_error(r->m.ctx, DSGD_ERR_OUT_OF_MEMORY, "cannot allocate %zu floats of staging", count);
            return NULL;
        }
        r->stage = p;
        r->stage_cap = count;
    }
    return r->stage;
}


DSGD_API void dsgd_strategy_destroy(dsgd_strategy *s) {
    int i;
    if (!s) return;
    if (s->ops && s->ops->stop && s->sync_ready && !s->failed) s->ops->stop(s);
    if (s->sync_ready) {
        pthread_mutex_lock(&s->mu);
        s->shutdown = 1;
        pthread_cond_broadcast(&s->cv_start);
        pthread_mutex_unlock(&s->mu);
    }
    for (i = 0; s->reps && i < s->n; ++i)
        if (s->reps[i].thread_started) pthread_join(s->reps[i].thread, NULL);
    if (s->ops && s->ops->teardown) s->ops->teardown(s);
    for (i = 0; s->reps && i < s->n; ++i) dsgd__replica_destroy(&s->reps[i]);
    if (s->hub) dsgd_loopback_destroy(s->hub);
    if (s->sync_ready) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv_start);
        pthread_cond_destroy(&s->cv_done);
    }
    for (i = 0; i < s->num_vars; ++i) DSGD_FREE(s->vars[i].copies);
    DSGD_FREE(s->vars);
    DSGD_FREE(s->param_agg);
    DSGD_FREE(s->reps);
    DSGD_FREE(s);
}

/* ---- a sub-group's endpoint over a given transport (elastic: the
   survivors, the grown group, a group with spare ranks; strategy_elastic.h) */

/* Rank i of the survivors' group is rank map[i] of base's group. */
typedef struct dsgd__sub_ep {
    dsgd_transport_i base; /* the endpoint the strategy was given */
    int size;
    int *map;              /* size ranks, stored after the struct */
} dsgd__sub_ep;

/* A new rank -> base's rank (-1 stays -1: sendrecv's skipped half; out of
   range: base's size, which base refuses). */
static int dsgd__sub_out(const dsgd__sub_ep *e, int peer) {
    if (peer == -1) return -1;
    return peer >= 0 && peer < e->size ? e->map[peer] : e->base.size;
}

/* base's rank -> the new rank (-1 when it is not in the group). */
static int dsgd__sub_in(const dsgd__sub_ep *e, int peer) {
    int i;
    for (i = 0; i < e->size; ++i)
        if (e->map[i] == peer) return i;
    return -1;
}

static dsgd_result dsgd__sub_send(void *impl, int dst, uint64_t tag, const void *buf, size_t bytes, double deadline) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    return e->base.send(e->base.impl, dsgd__sub_out(e, dst), tag, buf, bytes, deadline);
}

static dsgd_result dsgd__sub_recv(void *impl, int src, uint64_t tag, void *buf, size_t bytes, double deadline) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    return e->base.recv(e->base.impl, dsgd__sub_out(e, src), tag, buf, bytes, deadline);
}

static dsgd_result dsgd__sub_sendrecv(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes, int src,
                                      uint64_t rtag, void *rbuf, size_t rbytes, double deadline, int *failed_peer) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    int fp = -1;
    dsgd_result r = e->base.sendrecv(e->base.impl, dsgd__sub_out(e, dst), stag, sbuf, sbytes, dsgd__sub_out(e, src),
                                     rtag, rbuf, rbytes, deadline, &fp);
    if (failed_peer) *failed_peer = dsgd__sub_in(e, fp);
    return r;
}

static dsgd_result dsgd__sub_sendrecv_reduce(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                             int src, uint64_t rtag, float *rbuf, size_t rcount, dsgd_reduce_op op,
                                             double deadline, int *failed_peer) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    int fp = -1;
    dsgd_result r = e->base.sendrecv_reduce(e->base.impl, dsgd__sub_out(e, dst), stag, sbuf, sbytes,
                                            dsgd__sub_out(e, src), rtag, rbuf, rcount, op, deadline, &fp);
    if (failed_peer) *failed_peer = dsgd__sub_in(e, fp);
    return r;
}

static dsgd_result dsgd__sub_sendrecv_upto(void *impl, int dst, uint64_t stag, const void *sbuf, size_t sbytes,
                                           int src, uint64_t rtag, void *rbuf, size_t rcap, size_t *rbytes,
                                           double deadline, int *failed_peer) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    int fp = -1;
    dsgd_result r = e->base.sendrecv_upto(e->base.impl, dsgd__sub_out(e, dst), stag, sbuf, sbytes,
                                          dsgd__sub_out(e, src), rtag, rbuf, rcap, rbytes, deadline, &fp);
    if (failed_peer) *failed_peer = dsgd__sub_in(e, fp);
    return r;
}

static void dsgd__sub_abort(void *impl) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    e->base.abort(e->base.impl);
}

static double dsgd__sub_now(void *impl) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    return e->base.now(e->base.impl);
}

static dsgd_result dsgd__sub_charge_apply(void *impl, size_t floats) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    return e->base.charge_apply(e->base.impl, floats);
}

static dsgd_result dsgd__sub_charge_codec(void *impl, size_t floats) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    return e->base.charge_codec(e->base.impl, floats);
}

static const char *dsgd__sub_error_message(void *impl) {
    dsgd__sub_ep *e = (dsgd__sub_ep *)impl;
    return e->base.error_message(e->base.impl);
}

/* The endpoint of rank `rank` of e's group: the point-to-point members of
   base, ranks mapped, and those of this rank alone (its clock, the costs
   it charges to it: charge_apply, charge_codec). Not the members that
   involve every rank of base's group (share, a native allreduce, probe)
   nor the progress hooks (their
   sequence numbers are the old communicator's). */
static void dsgd__sub_endpoint(dsgd__sub_ep *e, int rank, dsgd_transport_i *out) {
    const dsgd_transport_i *b = &e->base;
    memset(out, 0, sizeof(*out));
    out->name = b->name;
    out->impl = e;
    out->rank = rank;
    out->size = e->size;
    out->send = dsgd__sub_send;
    out->recv = dsgd__sub_recv;
    if (b->sendrecv) out->sendrecv = dsgd__sub_sendrecv;
    if (b->sendrecv_reduce) out->sendrecv_reduce = dsgd__sub_sendrecv_reduce;
    if (b->sendrecv_upto) out->sendrecv_upto = dsgd__sub_sendrecv_upto;
    if (b->abort) out->abort = dsgd__sub_abort;
    if (b->now) out->now = dsgd__sub_now;
    if (b->charge_apply) out->charge_apply = dsgd__sub_charge_apply;
    if (b->charge_codec) out->charge_codec = dsgd__sub_charge_codec;
    if (b->error_message) out->error_message = dsgd__sub_error_message;
}

#endif /* DSGD__PART_STRATEGY_IMPL */
