/* distsgd/comm_hook.h - communication hooks: your own code exchanges a bucket of the gradient
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   COMM HOOKS

     A synchronous strategy (mirrored, multi-worker mirrored) all-reduces
     its replicas' flat gradient in buckets. A comm hook
     (dsgd_strategy_desc.comm_hook) replaces that all-reduce, bucket by
     bucket, with code of its own, as PyTorch DDP's register_comm_hook
     does: to compress what goes over the wire (the built-in compressors
     are compress.h's), to log, or to route some variables elsewhere.

     The contract. reduce(state, &bucket) is called on every replica for
     every bucket of every step, in the same order on all of them, with
     bucket.data holding this replica's slice of its gradient already
     scaled to its variables' aggregation (THE SYNCHRONOUS STEP, phase 3:
     what a SUM over the replicas turns into the aggregate). On return,
     bucket.data must hold the same bits on every replica: the sum over
     the replicas in sync, exactly (a plain all-reduce:
     dsgd_allreduce_at(bucket.comm, bucket.data, bucket.count,
     bucket.first, DSGD_REDUCE_SUM, bucket.algorithm, bucket.timeout_s)
     gives the weights of no hook, bit for bit) or approximately (a
     compressor). The hook may call any collective on bucket.comm; every
     replica must call the same ones.

     Buckets under a hook hold whole variables: the buffer is cut at the
     end of the first variable that reaches desc.bucket_bytes (0: one
     bucket), so a hook sees each variable's gradient, with its name and
     shape, in one piece.

     State. create makes one state per replica (error feedback is a
     replica's own), destroy frees it. A hook with state_bytes saves it
     into the strategy's checkpoint as a section of its own, named
     "hook/<name>", with every replica's bytes in rank order, and load
     reads its replica's bytes back, so that a run resumed from a
     checkpoint continues as the uninterrupted run would (PyTorch's comm
     hooks keep their state out of the checkpoint). Every member but name
     and reduce may be NULL.

     Thread safety: reduce runs on the replica's thread (with
     dsgd_strategy_desc.overlap, on its communication thread), one call at
     a time per replica; different replicas call it at once with their own
     states. user is shared by all of them.

   BYTES

     dsgd_comm_stats (collectives.h) counts what a communicator handed to
     its transport; a hook that compresses adds the seconds it spent and
     the fp32 bytes its bucket stood for (dsgd_comm_stats_add), so that
     bytes_sent against bytes_uncompressed is the compression on the
     wire. A strategy's totals are dsgd_strategy_comm_stats's.
*/
#ifndef DSGD__PART_COMM_HOOK_DECL
#define DSGD__PART_COMM_HOOK_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- comm hooks */

/* One bucket of a replica's flat gradient, as a hook receives it. */
typedef struct dsgd_hook_bucket {
    float *data;                       /* (count) the bucket: this replica's
                                          scaled gradient; on return the sum
                                          over the replicas, the same bits on
                                          every replica */
    size_t count;                      /* floats in the bucket */
    size_t first;                      /* data[0]'s offset in the flat gradient */
    int index;                         /* bucket 0..num_buckets-1, from offset 0 */
    int num_buckets;
    const dsgd_variable *const *vars;  /* the variables in the bucket, whole,
                                          in offset order (vars[i]->offset -
                                          first is where each starts in data) */
    int num_vars;
    int64_t step;                      /* optimizer steps applied before this one */
    int replica;                       /* this replica's rank in the group (global) */
    int num_replicas;                  /* the replicas in sync */
    dsgd_comm *comm;                   /* this replica's communicator */
    dsgd_allreduce_algo algorithm;     /* the strategy's desc.algorithm */
    double timeout_s;                  /* the strategy's deadline (0: the comm's) */
} dsgd_hook_bucket;

/* A comm hook: a table of functions and the user pointer they share. */
typedef struct dsgd_comm_hook {
    const char *name;                  /* 1..31 bytes; names the checkpoint
                                          section "hook/<name>" and appears in
                                          messages */
    /* Makes replica `replica`'s state (of num_replicas in sync, for a
       gradient of num_params floats) in *state. NULL: the state is NULL. */
    dsgd_result (*create)(void *user, int replica, int num_replicas, size_t num_params, void **state);
    /* Exchanges one bucket (COMM HOOKS above). Required. An error fails the
       step as a failed exchange does (the strategy fails). */
    dsgd_result (*reduce)(void *state, const dsgd_hook_bucket *bucket);
    /* The bytes save writes (the same every call for one state; 0 or NULL:
       nothing is saved). */
    size_t (*state_bytes)(void *state);
    /* Writes exactly state_bytes(state) bytes to dst. */
    dsgd_result (*save)(void *state, void *dst, size_t bytes);
    /* Reads what save wrote (bytes as saved); a size it cannot take is
       DSGD_ERR_INVALID_ARGUMENT, and the restore fails. */
    dsgd_result (*load)(void *state, const void *src, size_t bytes);
    void (*destroy)(void *state);
    void *user;
} dsgd_comm_hook;

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_COMM_HOOK_DECL */
