/* distsgd/cl/backend.h - the OpenCL backend: CLBlast GEMM and our kernels behind dsgd_backend_i
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   The backend is three parts, in this order; this one declares its public
   functions and documents it:
     backend.h         (this one) the backend's state, range checks and
                       kernel launches, the staging ring and class checks,
                       finish and destroy, the buffers, the accessors and
                       dsgd_cl_map/dsgd_cl_unmap
     backend_ops.h     the operations (copies, GEMM, activations and losses,
                       optimizer updates, sums, images, marks)
     backend_create.h  the queue, the kernels, the table of operations:
                       dsgd_cl_backend_create

   BACKENDS

     dsgd_cl_backend_create fills every member of dsgd_backend_i, the
     optional ones included (buffer_host_ptr always answers NULL: OpenCL
     buffers are never permanently host-addressable). Among them:
       write         staged: returns without waiting for the device (see
                     STAGING)
       loss          softmax cross-entropy's class check is looked at later
                     (see CLASS CHECKS)
       finish        clFinish on the backend's queue
       map, unmap    blocking clEnqueueMapBuffer (read and write) and
                     clEnqueueUnmapMemObject (also dsgd_cl_map/dsgd_cl_unmap)
       mark, wait_marks, release_mark
                     clEnqueueMarkerWithWaitList, clEnqueueBarrierWithWaitList
                     and clReleaseEvent: the DEVICE gradient path orders the
                     replicas' queues with them instead of finishing them
       nonfinite_flag, read_marked, wait_mark
                     one work-group ORs isfinite over x into a float flag; a
                     read without waiting, its event the mark; the event
                     awaited (counted only when not done yet)
       host_shared   1 when the backend's buffers are CL_MEM_ALLOC_HOST_PTR,
                     so that mapping copies nothing: by default on devices
                     with CL_DEVICE_HOST_UNIFIED_MEMORY (CPUs, integrated
                     GPUs); dsgd_cl_backend_desc.host_visible forces it
                     either way
       can_access    1 for an OpenCL backend of the same dsgd_cl_context on
                     the same device, 0 for one on another device: a cl_mem
                     works on every device of its context, but GPU runtimes
                     keep a copy of it per device and move the whole buffer
                     to the device that uses it next, so two devices writing
                     disjoint blocks of one buffer may lose one's writes
       sum_across    our kernels: up to 8 buffers summed and written back in
                     one launch; more through the backend's scratch buffer, 8
                     a launch, in the same order; a buffer made on another
                     device is refused
       device_name   "NAME (device I of its context)"
       im2col, col2im, maxpool_forward, maxpool_backward
                     our kernels: on a GPU (any device but a CPU) one
                     work-item per float of the output, neighbouring
                     work-items on neighbouring floats; on a CPU one per
                     row of col or pixel of the output, its floats in a
                     loop (col2im and maxpool_backward gather their sums in
                     the documented order): the CPU backend's bits; 32-bit
                     index arithmetic when every range of the call holds at
                     most 2^31 - 1 floats, else 64-bit. Test hooks, read
                     when the backend is made: DSGD_CL_IMAGE_INDEX_BITS=64
                     forces 64-bit, DSGD_CL_IMAGE_SPREAD=1 or 0 the GPU or
                     the CPU shape
       bias_backward our kernels: one work-item per (block of
                     DSGD_CL__BIAS_ROWS rows, column), then one per column
                     sums the blocks (PRECISION in kernels.h), the partials
                     in the scratch buffer
     So a strategy over OpenCL backends of one context on one device (see
     BACKENDS in distsgd.h) takes, with gradient_path AUTO, the DEVICE path
     when some backend's buffers are the device's own (a discrete GPU, or
     host_visible = -1): each replica sums its block of every replica's
     gradient between two barriers and nothing is copied to the host. On
     PoCL and integrated GPUs it takes the HOST path, where map is zero-copy
     and the host's all-reduce is as fast. Replicas on several devices, or
     on different contexts, take HOST (AUTO), and gradient_path DEVICE is
     refused with both devices named: each replica then writes only buffers
     made on its own device.

     GEMM: CLBlast's indirect GEMM transposes and pads its operands into a
     temporary buffer, which CLBlast would create and free on every call.
     Each backend keeps one instead (CLBlastSgemmWithTempBuffer), grown to
     the largest size a call has needed (CLBlastSGemmTempBufferSize); its
     in-order queue keeps two GEMMs from using it at once. CLBlast's calls
     share one process-wide lock, taken exclusively only by a shape's first
     call on a backend (which may compile and cache a routine) and shared
     after that, so replicas on their own threads enqueue their GEMMs
     without waiting for each other (dsgd_cl_backend_gemm_exclusive counts
     the exclusive calls).
     On devices other than CPUs, a thin A^T B over a long k (m n <= 8192,
     k >= 2048 and >= 16 max(m, n): a convolution's weight gradient, k =
     batch x output pixels), which gives CLBlast one tile of C or a few to
     run the whole k through, is split along k by our kernels instead: at
     most 256 parts of at least 64 rows that run in parallel, each summed
     in row order, then added in part order (fixed for a given shape: same
     inputs, same bits). On an H200 the CNN's 9x16x50176 took 0.035 ms split
     and 1.0 ms in CLBlast; on PoCL, CLBlast is as fast or faster. Test
     hook, read when the backend is made: DSGD_CL_GEMM_SPLIT_K=1 or 0.

   STAGING

     write copies the host's floats into a pinned staging ring (a
     CL_MEM_ALLOC_HOST_PTR buffer the backend maps once, 4 x the largest
     write so far and at least 1 MiB) and enqueues the copy to the device
     without waiting, so the caller may reuse its floats at once and the
     host runs ahead of the device. The host waits only where the ring space
     a write needs is still being read by an earlier one (the device is more
     than the ring behind), when the ring grows, and for a write larger than
     64 MiB, which is made blocking instead. Each wait counts in
     dsgd_cl_backend_host_waits, as does every call that needs the device's
     answer: finish, read, map and norm_check. A training step on one device
     therefore waits for nothing when the device keeps up: the step's
     non-finite verdict stays on the device too (THE VERDICT ON THE DEVICE
     in distsgd.h); on the HOST gradient path it waits for norm_check's
     count and its map. The test suite asserts these counts.

   CLASS CHECKS

     Softmax cross-entropy refuses a class that is not an integer in
     [0, c). The OpenCL loss does not wait for its kernel's verdict: the
     verdict comes back into a pinned slot without waiting, and the
     backend's next loss, or its next call that waits (finish, read, map,
     norm_check), reports a bad one as DSGD_ERR_INVALID_ARGUMENT, with the
     class, the sample and "found after that loss call returned"; the stats
     are unchanged, as when the loss reports it itself. The built-in model
     checks its classes on the host before any work, so a model's
     dsgd_model_compute_gradients still fails at once on every backend.

   BITS

     Where this header and kernels.h (PRECISION) promise the CPU backend's
     bits, the promise rests on what the device reports in
     CL_DEVICE_SINGLE_FP_CONFIG (dsgd_cl_device_info.single_fp_config):
       CL_FP_ROUND_TO_NEAREST, CL_FP_INF_NAN
                     every float add and multiply rounds as the host's
                     does (both required of full-profile devices)
       CL_FP_DENORM  denormals are kept, not flushed to zero; without it a
                     result below FLT_MIN may come back as 0 (scale, axpy,
                     the optimizer updates, bias_backward, col2im, the
                     max-pool backward pass, sum_across)
       CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT
                     divide and sqrt within 0.5 ulp: the context then
                     builds our kernels with
                     -cl-fp32-correctly-rounded-divide-sqrt (only when every
                     device of the context reports it); without it OpenCL
                     allows 2.5 ulp for divide and 3 for sqrt, so Adam and
                     AdamW differ from the CPU by a few ulp per step
       CL_FP_FMA     not needed: the kernels set FP_CONTRACT OFF and call no
                     fma or mad, and the library never passes -cl-mad-enable,
                     -cl-denorms-are-zero or the fast-math options (options
                     added through build_options void the promise).
     Copies and compares (write, read, copy, fill, im2col, the max-pool
     forward pass, checkpoints) give the same bits on any device. PoCL's
     CPU devices report all of the above (FMA too); some GPUs (Intel Arc
     among them) report no correctly rounded divide and sqrt.
     The tests read these bits and compare bit for bit where the device
     promises them, within a few ulp elsewhere.

   TRANSPORTS

     This header adds no transport: replicas on OpenCL backends synchronise
     over distsgd.h's (the loopback, in one process). On the HOST gradient
     path the gradients reach the transport through map: zero-copy with
     host-shared buffers, else a device-to-host copy and a copy back per
     step. On the DEVICE path only the finiteness flag and two barriers
     cross the transport.
*/
#ifndef DSGD_CL__PART_BACKEND_DECL
#define DSGD_CL__PART_BACKEND_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- backend */

typedef struct dsgd_cl_backend_desc {
    int device;       /* index into the context's devices; default 0 */
    int host_visible; /* 0: CL_MEM_ALLOC_HOST_PTR buffers where the device has
                         unified memory; 1 (> 0): always; -1 (< 0): never.
                         host_shared answers accordingly, which steers a
                         strategy's AUTO gradient path (see BACKENDS) */
    int profiling;    /* non-zero: a queue of its own (whatever the context's
                         QUEUES policy) with CL_QUEUE_PROFILING_ENABLE */
} dsgd_cl_backend_desc;

/* Fills *out with an OpenCL backend on device desc->device of context c, with
   an in-order command queue (its own, or its device's shared one: see
   QUEUES), its own kernel objects and buffers (see BACKENDS
   for the members it sets). desc may be NULL. Errors are recorded on ctx,
   which must outlive the backend, as must c. Destroy with
   out->destroy(out->impl).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out or c NULL, device
   outside the context's devices), DSGD_ERR_BACKEND (creating the queue, a
   kernel or a buffer), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: any thread (that may use ctx); the backend is then used by
   one thread at a time. */
DSGD_API dsgd_result dsgd_cl_backend_create(dsgd_ctx *ctx, dsgd_cl_context *c,
                                            const dsgd_cl_backend_desc *desc,
                                            dsgd_backend_i *out);
/* dsgd_cl_is_backend: 1 when b was made by dsgd_cl_backend_create, else 0.
   dsgd_cl_backend_queue, _device, _context: its queue, device and context
   (NULL when b is NULL or not OpenCL), for your own OpenCL calls; the
   backend owns them.
   Errors: none. Thread safety: any thread while b lives (fixed at creation;
   commands you enqueue on the queue follow the backend's thread rule). */
DSGD_API int dsgd_cl_is_backend(const dsgd_backend_i *b);
DSGD_API cl_command_queue dsgd_cl_backend_queue(const dsgd_backend_i *b);
DSGD_API cl_device_id dsgd_cl_backend_device(const dsgd_backend_i *b);
DSGD_API dsgd_cl_context *dsgd_cl_backend_context(const dsgd_backend_i *b);
/* The cl_mem of a buffer made by an OpenCL backend (a ref's offset counts
   floats from its start); NULL for NULL or for another backend's buffer
   (recognised by a tag the OpenCL backend's buffers start with).
   Errors: none. Thread safety: any thread while the buffer lives. */
DSGD_API cl_mem dsgd_cl_buffer_mem(const dsgd_buffer *buf);
/* How many operations b has enqueued that write a buffer made by a backend
   on another device (a write, copy or fill into it, a kernel's output, a
   map for writing): 0 in every correct use, since a runtime may keep one
   copy of a buffer per device and move it whole to the device that uses
   it next. A check for code that exchanges buffers between devices; it
   counts and never refuses. 0 when b is NULL or not OpenCL.
   Errors: none. Thread safety: b's thread. */
DSGD_API unsigned long dsgd_cl_backend_foreign_writes(const dsgd_backend_i *b);
/* How many times b has made the host wait for its device: every finish,
   read, map and norm_check (each needs the device's answer), a write too
   large to stage (over 64 MiB), a staged write, class check or marked
   read (wait_mark) that was not done yet, and the two blocking maps of its
   pinned buffers at creation and when the staging ring grows (see
   STAGING). A steady-state training step on one device or on the DEVICE
   gradient path waits for nothing when the device keeps up (the step's
   non-finite verdict stays on the device: THE VERDICT ON THE DEVICE in
   distsgd.h); the HOST path waits twice per replica (the non-finite count,
   the map). 0 when b is NULL or not OpenCL.
   Errors: none. Thread safety: b's thread. */
DSGD_API unsigned long dsgd_cl_backend_host_waits(const dsgd_backend_i *b);
/* How many of b's GEMMs called CLBlast under its process-wide lock held
   exclusively: a shape's first call on b, and its first after a parameter
   override (dsgd_cl_apply_gemm_params, which a tuning cache found at
   context creation goes through too). Every
   other CLBlast call takes the lock shared, so in steady state the
   replicas' threads never wait for one another there (GEMM).
   Errors: none. Thread safety: b's thread. */
DSGD_API unsigned long dsgd_cl_backend_gemm_exclusive(const dsgd_backend_i *b);

#define DSGD_CL_MAP_READ 1  /* the host reads the mapped floats */
#define DSGD_CL_MAP_WRITE 2 /* the host writes them (READ|WRITE for both) */

/* Maps count floats at ref into host memory after all queued work is done
   (blocking); *out is NULL on failure. Zero-copy when the buffer is
   CL_MEM_ALLOC_HOST_PTR (see host_visible), else a copy to the host (and
   back at unmap, with DSGD_CL_MAP_WRITE). Each map must be undone by
   dsgd_cl_unmap before kernels use the range again. The backend's map
   member is this with READ|WRITE.
   Errors: DSGD_ERR_INVALID_ARGUMENT (b not an OpenCL backend or out NULL:
   nothing recorded; flags 0 or with other bits; count 0; the range outside
   ref's buffer, or a buffer of another context), DSGD_ERR_BACKEND or
   DSGD_ERR_OUT_OF_MEMORY (clEnqueueMapBuffer), recorded on b's ctx.
   Thread safety: the backend's thread. */
DSGD_API dsgd_result dsgd_cl_map(const dsgd_backend_i *b, dsgd_ref ref, size_t count, int flags,
                                 float **out);
/* Unmaps a pointer dsgd_cl_map returned for ref's buffer; the writes become
   visible to later operations on the backend's queue (other backends' queues
   see them after a finish of this one).
   Errors: DSGD_ERR_INVALID_ARGUMENT (b not an OpenCL backend: nothing
   recorded; ptr NULL; ref's buffer not of this context), DSGD_ERR_BACKEND or
   DSGD_ERR_OUT_OF_MEMORY (clEnqueueUnmapMemObject), recorded on b's ctx.
   Thread safety: the backend's thread. */
DSGD_API dsgd_result dsgd_cl_unmap(const dsgd_backend_i *b, dsgd_ref ref, float *ptr);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_CL__PART_BACKEND_DECL */

#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_BACKEND_IMPL)
#define DSGD_CL__PART_BACKEND_IMPL

/* >>backend ----------------------------------------------------------------- */

/* The OpenCL buffer behind a dsgd_buffer pointer (dsgd_buffer itself is never
   defined; each backend casts its own type). */
typedef struct dsgd_cl__buffer {
    uint32_t magic; /* first: a foreign buffer (another backend's) is caught */
    cl_mem mem;
    size_t count;
    const dsgd_cl_context *cl; /* buffers are usable by every backend of it */
    int dev;                   /* the device (of cl) whose backend made it */
} dsgd_cl__buffer;

#define DSGD_CL__MAGIC 0x6473636cu /* "dscl" */

/* A write still reading bytes [lo, hi) of the staging ring until ev. */
typedef struct dsgd_cl__staged {
    size_t lo, hi;
    cl_event ev;
} dsgd_cl__staged;

/* A class check of a loss of m samples and c classes, its answer due at ev. */
typedef struct dsgd_cl__class_check {
    cl_event ev;
    int m, c;
} dsgd_cl__class_check;

/* A kernel argument as last set (ARGUMENTS): kind 0 unknown, 1 a value of
   size bytes (at most 8), 2 local memory of size bytes. */
typedef struct dsgd_cl__arg_val {
    size_t size;
    int kind;
    unsigned char v[8];
} dsgd_cl__arg_val;

#define DSGD_CL__ARGS_CACHED 32
#define DSGD_CL__STAGED_MAX 32
#define DSGD_CL__CHECKS_MAX 4
#define DSGD_CL__STAGE_MIN ((size_t)1 << 20)
#define DSGD_CL__STAGE_LARGEST ((size_t)64 << 20) /* larger writes block */

/* A GEMM's shape, as CLBlast is first called for it (GEMM). */
#define DSGD_CL__WARM_MAX 64
typedef struct {
    int ta, tb, m, n, k;
} dsgd_cl__shape;

typedef struct dsgd_cl__backend {
    dsgd_ctx *ctx;
    dsgd_cl_context *cl;
    int dev;
    cl_device_id device;
    cl_command_queue queue;
    cl_kernel kernels[DSGD_CL__K_COUNT];
    size_t local; /* work-group size of the element-wise kernels */
    size_t local_max1; /* the device's most work-items in dimension 1 */
    size_t img32_max;  /* image calls whose ranges all hold at most this many
                          floats use the kernels with 32-bit indices */
    int split_k;       /* thin TN GEMMs over a long k split along k (GEMM) */
    int img_spread;    /* image kernels: a row's floats over work-items (1,
                          not on CPUs) or one work-item's loop (0) */
    size_t reduce_local; /* power-of-two work-group size of the reductions */
    size_t acc_size;     /* sizeof(acc_t) in the kernels */
    cl_mem scratch;      /* loss rows, norm and bias_backward partials */
    size_t scratch_bytes;
    cl_mem status; /* small int / ulong results */
    cl_mem gemm_temp; /* CLBlast's temporary buffer for transposed/padded operands */
    size_t gemm_temp_bytes;
    /* GEMM shapes run on this backend since parameter override warm_epoch:
       their CLBlast calls take the lock shared (context.h); and how many
       calls took it exclusively (dsgd_cl_backend_gemm_exclusive). */
    dsgd_cl__shape warm[DSGD_CL__WARM_MAX];
    int nwarm;
    unsigned long warm_epoch, gemm_exclusive;
    cl_mem_flags alloc_flags;
    /* Operations that wrote a buffer made on another device (a check for the
       tests: on GPU runtimes that migrate a buffer whole between devices, two
       devices writing one buffer may lose writes; nothing here does it). */
    unsigned long foreign_writes;
    /* Each kernel's arguments as last set, valid while the context's
       released-buffer count is args_gen (a released handle may come back). */
    dsgd_cl__arg_val args[DSGD_CL__K_COUNT][DSGD_CL__ARGS_CACHED];
    unsigned long args_gen;
    /* Times the host waited for the device (dsgd_cl_backend_host_waits). */
    unsigned long host_waits;
    /* write's staging ring (STAGING): a pinned buffer mapped for good, the
       writes that still read it, oldest first. */
    cl_mem stage;
    unsigned char *stage_host;
    size_t stage_bytes, stage_head;
    dsgd_cl__staged staged[DSGD_CL__STAGED_MAX];
    int staged_first, staged_n;
    /* softmax cross-entropy's class checks, read back without waiting into
       pinned slots of 4 ints (bad count, first bad sample, its class's bits)
       and looked at later, oldest first */
    cl_mem checks_mem;
    cl_int *checks_host;
    dsgd_cl__class_check checks[DSGD_CL__CHECKS_MAX];
    int checks_first, checks_n;
    char label[DSGD_CL_MAX_NAME + 48]; /* device_name's answer */
} dsgd_cl__backend;

#define DSGD_CL__STATUS_BYTES 4096
#define DSGD_CL__NORM_MAX_GROUPS 64

/* A dsgd_ref's buffer, or NULL when it is not one of b's. */
static dsgd_cl__buffer *dsgd_cl__buf(dsgd_ref r) { return (dsgd_cl__buffer *)(void *)r.buf; }

/* Checks [r.off, r.off + n) against r's buffer; records an error otherwise. */
static int dsgd_cl__span(dsgd_cl__backend *b, dsgd_ref r, size_t n, const char *op) {
    dsgd_cl__buffer *buf = dsgd_cl__buf(r);
    if (!buf) {
        dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl %s: NULL buffer", op);
        return 0;
    }
    if (buf->magic != DSGD_CL__MAGIC || buf->cl != b->cl) {
        dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                           "opencl %s: the buffer was not made by an OpenCL backend of this context", op);
        return 0;
    }
    if (r.off > buf->count || n > buf->count - r.off) {
        dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                           "opencl %s: range [%lu, %lu) outside a buffer of %lu floats", op,
                           (unsigned long)r.off, (unsigned long)(r.off + n), (unsigned long)buf->count);
        return 0;
    }
    return 1;
}

/* dsgd_cl__span for a range the operation writes: also counts a write to
   a buffer made on another device (foreign_writes). */
static int dsgd_cl__out(dsgd_cl__backend *b, dsgd_ref r, size_t n, const char *op) {
    if (!dsgd_cl__span(b, r, n, op)) return 0;
    if (dsgd_cl__buf(r)->dev != b->dev) b->foreign_writes++;
    return 1;
}

/* Sets kernel arguments from (size, pointer) pairs. */
#define DSGD_CL__A(x) sizeof(x), (const void *)&(x)
#define DSGD_CL__LOCAL(bytes) (size_t)(bytes), (const void *)NULL

/* Sets argument i of kernel k, unless it holds that value already: the
   backend's kernel objects are its own, so an argument keeps its value
   from one launch to the next, and most do not change between steps. */
static dsgd_result dsgd_cl__arg(dsgd_cl__backend *b, int k, int i, size_t size, const void *ptr) {
    dsgd_cl__arg_val *a = i < DSGD_CL__ARGS_CACHED ? &b->args[k][i] : NULL;
    unsigned long gen = dsgd_cl__context_mem_released(b->cl);
    cl_int err;
    if (gen != b->args_gen) {
        memset(b->args, 0, sizeof(b->args));
        b->args_gen = gen;
    }
    if (a && a->size == size &&
        (ptr ? a->kind == 1 && size <= sizeof(a->v) && memcmp(a->v, ptr, size) == 0 : a->kind == 2))
        return DSGD_OK;
    err = clSetKernelArg(b->kernels[k], (cl_uint)i, size, ptr);
    if (a) {
        a->kind = err != CL_SUCCESS || (ptr && size > sizeof(a->v)) ? 0 : ptr ? 1 : 2;
        a->size = size;
        if (a->kind == 1) memcpy(a->v, ptr, size);
    }
    if (err != CL_SUCCESS) {
        char what[96];
        snprintf(what, sizeof(what), "%s, argument %d", dsgd_cl__kernel_op[k], i);
        return dsgd_cl__fail(b->ctx, err, "clSetKernelArg", what);
    }
    return DSGD_OK;
}

static dsgd_result dsgd_cl__args(dsgd_cl__backend *b, int k, int n, ...) {
    va_list ap;
    int i;
    dsgd_result r = DSGD_OK;
    va_start(ap, n);
    for (i = 0; i < n && r == DSGD_OK; ++i) {
        size_t size = va_arg(ap, size_t);
        const void *ptr = va_arg(ap, const void *);
        r = dsgd_cl__arg(b, k, i, size, ptr);
    }
    va_end(ap);
    return r;
}

/* Enqueues kernel k over `items` work-items in groups of `local`. */
static dsgd_result dsgd_cl__run(dsgd_cl__backend *b, int k, size_t items, size_t local) {
    size_t global = (items + local - 1) / local * local;
    cl_int err;
    if (items == 0) return DSGD_OK;
    err = clEnqueueNDRangeKernel(b->queue, b->kernels[k], 1, NULL, &global, &local, 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueNDRangeKernel", dsgd_cl__kernel_op[k]);
    return DSGD_OK;
}

/* Enqueues kernel k over a (run, rows) range whose dimension 0 walks
   consecutive floats: work-groups of lx x ly work-items, lx the power of
   two at or above run but at most wide (at most b->local) and ly =
   b->local / lx, so that a work-group's work-items touch neighbouring
   addresses (and PoCL, which compiles a kernel once per work-group size,
   sees few sizes); with lx below run the kernel loops over the rest. wide
   1 transposes the range: (rows, 1), a row per work-item (the image
   kernels' CPU shape, rd 0). */
static dsgd_result dsgd_cl__run2(dsgd_cl__backend *b, int k, size_t run, size_t rows, size_t wide) {
    size_t global[2], local[2];
    cl_int err;
    if (run == 0 || rows == 0) return DSGD_OK;
    if (wide == 1) { /* transposed: rows along dimension 0, one work-item each */
        local[0] = b->local;
        global[0] = (rows + local[0] - 1) / local[0] * local[0];
        local[1] = global[1] = 1;
    } else {
        local[0] = 1;
        while (local[0] < run && local[0] * 2 <= wide && local[0] * 2 <= b->local) local[0] *= 2;
        local[1] = b->local / local[0];
        if (local[1] > b->local_max1) local[1] = b->local_max1;
        global[0] = (run + local[0] - 1) / local[0] * local[0];
        global[1] = (rows + local[1] - 1) / local[1] * local[1];
    }
    err = clEnqueueNDRangeKernel(b->queue, b->kernels[k], 2, NULL, global, local, 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueNDRangeKernel", dsgd_cl__kernel_op[k]);
    return DSGD_OK;
}

static dsgd_result dsgd_cl__ensure_scratch(dsgd_cl__backend *b, size_t bytes) {
    cl_int err;
    if (bytes <= b->scratch_bytes) return DSGD_OK;
    if (bytes < 4096) bytes = 4096;
    if (b->scratch) dsgd_cl__context_release_mem(b->cl, b->scratch); /* freed once queued work is done */
    b->scratch = NULL;
    b->scratch_bytes = 0;
    b->scratch = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE, bytes, NULL, &err);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clCreateBuffer", "scratch");
    b->scratch_bytes = bytes;
    return DSGD_OK;
}

/* >>staging ----------------------------------------------------------------- */
/* STAGING: write copies the host's floats into a pinned ring and enqueues
   the copy to the device without waiting; the host waits only where the
   ring space it needs is still being read. Loss class checks come back the
   same way, into pinned slots, and are looked at later. */

/* CL_SUCCESS once ev's command is complete: at once when it is (nothing
   counted), else one host wait: the event's status polled for up to
   DSGD_CL__SPIN_S (a short wait sleeps in clWaitForEvents for longer than
   it lasts on some GPU drivers), then clWaitForEvents (on PoCL the device
   is the host's own cores: a longer spin would take one from it). A failed
   command gives its error. */
#define DSGD_CL__SPIN_S 100e-6
static cl_int dsgd_cl__await(dsgd_cl__backend *b, cl_event ev) {
    cl_int st = CL_QUEUED, err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL);
    double until;
    if (err != CL_SUCCESS) return err;
    if (st <= CL_COMPLETE) return st < 0 ? st : CL_SUCCESS;
    b->host_waits++;
    clFlush(b->queue);
    for (until = dsgd_now() + DSGD_CL__SPIN_S; st > CL_COMPLETE && dsgd_now() < until;)
        if ((err = clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL)) != CL_SUCCESS)
            return err;
    if (st > CL_COMPLETE) {
        err = clWaitForEvents(1, &ev);
        if (clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL) != CL_SUCCESS) st = err;
    }
    return st < 0 ? st : err;
}

/* Retires the oldest staged write, waiting for it if it is not done. */
static cl_int dsgd_cl__unstage(dsgd_cl__backend *b) {
    dsgd_cl__staged *w = &b->staged[b->staged_first];
    cl_int err = dsgd_cl__await(b, w->ev);
    clReleaseEvent(w->ev);
    b->staged_first = (b->staged_first + 1) % DSGD_CL__STAGED_MAX;
    b->staged_n--;
    return err;
}

/* 1 when a queued write still reads a byte of [lo, hi) of the ring. */
static int dsgd_cl__stage_busy(const dsgd_cl__backend *b, size_t lo, size_t hi) {
    int i;
    for (i = 0; i < b->staged_n; ++i) {
        const dsgd_cl__staged *w = &b->staged[(b->staged_first + i) % DSGD_CL__STAGED_MAX];
        if (w->lo < hi && lo < w->hi) return 1;
    }
    return 0;
}

/* Drops the ring once its writes are done. */
static void dsgd_cl__stage_free(dsgd_cl__backend *b) {
    while (b->staged_n > 0) dsgd_cl__unstage(b);
    if (b->stage_host) clEnqueueUnmapMemObject(b->queue, b->stage, b->stage_host, 0, NULL, NULL);
    if (b->stage) clReleaseMemObject(b->stage); /* freed once the unmap is done */
    b->stage = NULL;
    b->stage_host = NULL;
    b->stage_bytes = b->stage_head = 0;
}

/* A pinned buffer of `bytes`, mapped for good at *host (a blocking map:
   one host wait, at creation only). */
static dsgd_result dsgd_cl__pinned(dsgd_cl__backend *b, size_t bytes, cl_map_flags mf, const char *what,
                                   cl_mem *mem, void **host) {
    cl_int err;
    *host = NULL;
    *mem = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes, NULL,
                          &err);
    if (err != CL_SUCCESS) {
        *mem = NULL;
        return dsgd_cl__fail(b->ctx, err, "clCreateBuffer", what);
    }
    b->host_waits++;
    *host = clEnqueueMapBuffer(b->queue, *mem, CL_TRUE, mf, 0, bytes, 0, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        *host = NULL;
        return dsgd_cl__fail(b->ctx, err, "clEnqueueMapBuffer", what);
    }
    return DSGD_OK;
}

/* *at: `bytes` of the ring that no queued write reads any more; the ring is
   made, or grown to 4 x bytes (at least DSGD_CL__STAGE_MIN), first. */
static dsgd_result dsgd_cl__stage_take(dsgd_cl__backend *b, size_t bytes, size_t *at) {
    size_t pos;
    cl_int err;
    if (bytes > b->stage_bytes) {
        size_t cap = 4 * bytes > DSGD_CL__STAGE_MIN ? 4 * bytes : DSGD_CL__STAGE_MIN;
        void *host;
        dsgd_result r;
        dsgd_cl__stage_free(b);
        r = dsgd_cl__pinned(b, cap, CL_MAP_WRITE, "write staging", &b->stage, &host);
        b->stage_host = (unsigned char *)host;
        if (r != DSGD_OK) return r;
        b->stage_bytes = cap;
    }
    pos = b->stage_head + bytes <= b->stage_bytes ? b->stage_head : 0;
    while (b->staged_n > 0 && (b->staged_n == DSGD_CL__STAGED_MAX || dsgd_cl__stage_busy(b, pos, pos + bytes)))
        if ((err = dsgd_cl__unstage(b)) != CL_SUCCESS)
            return dsgd_cl__fail(b->ctx, err, "clEnqueueWriteBuffer", "write (an earlier one, staged)");
    *at = pos;
    b->stage_head = (pos + bytes + 63) & ~(size_t)63;
    return DSGD_OK;
}

/* Looks at the answers of the pending class checks, oldest first: those
   that are in, or all of them when wait (waiting where one is not). The
   first bad one is DSGD_ERR_INVALID_ARGUMENT, recorded; all are retired. */
static dsgd_result dsgd_cl__class_checks(dsgd_cl__backend *b, int wait) {
    dsgd_result r = DSGD_OK;
    while (b->checks_n > 0) {
        int slot = b->checks_first;
        const dsgd_cl__class_check k = b->checks[slot];
        const cl_int *s = b->checks_host + 4 * slot;
        cl_int st = CL_QUEUED, err;
        if (!wait && (clGetEventInfo(k.ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL) != CL_SUCCESS ||
                      st > CL_COMPLETE))
            break;
        err = dsgd_cl__await(b, k.ev);
        clReleaseEvent(k.ev);
        b->checks_first = (slot + 1) % DSGD_CL__CHECKS_MAX;
        b->checks_n--;
        if (r != DSGD_OK) continue;
        if (err != CL_SUCCESS) {
            r = dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "loss class check");
        } else if (s[0] != 0) {
            float t;
            memcpy(&t, &s[2], sizeof(t));
            r = dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                   "softmax cross-entropy: class %g of sample %d is not an integer in [0, %d) "
                                   "(%d bad sample%s of %d; stats unchanged, dpred unspecified; found after that "
                                   "loss call returned)",
                                   (double)t, (int)s[1], k.c, (int)s[0], s[0] == 1 ? "" : "s", k.m);
        }
    }
    return r;
}

/* A blocking call's end: one host wait counted, then the class checks
   (their answers are in by now: the queue is in order). */
static dsgd_result dsgd_cl__waited(dsgd_cl__backend *b) {
    b->host_waits++;
    return dsgd_cl__class_checks(b, 1);
}

static dsgd_result dsgd_cl__finish(void *impl) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_int err = clFinish(b->queue);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clFinish", "finish");
    return dsgd_cl__waited(b);
}

static void dsgd_cl__destroy(void *impl) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    int k;
    if (!b) return;
    if (b->queue) clFinish(b->queue);
    dsgd_cl__stage_free(b);
    while (b->checks_n > 0) {
        clReleaseEvent(b->checks[b->checks_first].ev);
        b->checks_first = (b->checks_first + 1) % DSGD_CL__CHECKS_MAX;
        b->checks_n--;
    }
    if (b->checks_host) clEnqueueUnmapMemObject(b->queue, b->checks_mem, b->checks_host, 0, NULL, NULL);
    if (b->checks_mem) clReleaseMemObject(b->checks_mem);
    if (b->queue) clFinish(b->queue);
    for (k = 0; k < DSGD_CL__K_COUNT; ++k)
        if (b->kernels[k]) clReleaseKernel(b->kernels[k]);
    if (b->scratch) clReleaseMemObject(b->scratch);
    if (b->gemm_temp) clReleaseMemObject(b->gemm_temp);
    if (b->status) clReleaseMemObject(b->status);
    if (b->queue) clReleaseCommandQueue(b->queue);
    DSGD_FREE(b);
}

static dsgd_result dsgd_cl__buffer_create(void *impl, size_t count, dsgd_buffer **out) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    dsgd_cl__buffer *buf;
    size_t bytes = (count ? count : 1) * sizeof(float);
    cl_int err;
    char what[64];
    if (!out) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl buffer_create: out is NULL");
    *out = NULL;
    if (count > (size_t)-1 / sizeof(float))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_OUT_OF_MEMORY,
                                  "opencl buffer_create: %lu floats overflow size_t", (unsigned long)count);
    {
        /* Refused here rather than by the runtime: NVIDIA's creates such a
           buffer and fails at its first use (the zero fill below). */
        uint64_t largest = dsgd_cl_context_device_info(b->cl, b->dev)->max_alloc_bytes;
        if (largest && (uint64_t)bytes > largest)
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_OUT_OF_MEMORY,
                                      "clCreateBuffer(%lu floats): CL_INVALID_BUFFER_SIZE (-61): %.4g GiB, over the "
                                      "device's largest buffer (CL_DEVICE_MAX_MEM_ALLOC_SIZE, %.4g GiB)",
                                      (unsigned long)count, (double)bytes / 1073741824.0,
                                      (double)largest / 1073741824.0);
    }
    buf = (dsgd_cl__buffer *)DSGD_MALLOC(sizeof(*buf));
    if (!buf) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_OUT_OF_MEMORY, "opencl buffer_create");
    buf->mem = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE | b->alloc_flags, bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        DSGD_FREE(buf);
        snprintf(what, sizeof(what), "%lu floats", (unsigned long)count);
        return dsgd_cl__fail(b->ctx, err, "clCreateBuffer", what);
    }
    buf->magic = DSGD_CL__MAGIC;
    buf->count = count;
    buf->cl = b->cl;
    buf->dev = b->dev;
    /* zero-initialised, like the CPU backend's buffers */
    {
        cl_float zero = 0.0f;
        err = clEnqueueFillBuffer(b->queue, buf->mem, &zero, sizeof(zero), 0, bytes, 0, NULL, NULL);
        if (err != CL_SUCCESS) {
            clReleaseMemObject(buf->mem);
            DSGD_FREE(buf);
            return dsgd_cl__fail(b->ctx, err, "clEnqueueFillBuffer", "buffer_create");
        }
    }
    *out = (dsgd_buffer *)(void *)buf;
    return DSGD_OK;
}

static void dsgd_cl__buffer_destroy(void *impl, dsgd_buffer *buffer) {
    dsgd_cl__buffer *buf = (dsgd_cl__buffer *)(void *)buffer;
    DSGD__UNUSED(impl);
    if (!buf) return;
    dsgd_cl__context_release_mem((dsgd_cl_context *)buf->cl, buf->mem); /* counts in the context */
    buf->magic = 0;
    DSGD_FREE(buf);
}

static float *dsgd_cl__buffer_host_ptr(void *impl, dsgd_buffer *buf) {
    DSGD__UNUSED(impl);
    DSGD__UNUSED(buf);
    return NULL;
}

static dsgd_result dsgd_cl__write(void *impl, dsgd_ref dst, const float *src, size_t count) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    size_t bytes;
    cl_int err;
    if (!dsgd_cl__out(b, dst, count, "write")) return DSGD_ERR_INVALID_ARGUMENT;
    if (count == 0) return DSGD_OK;
    if (!src) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl write: src is NULL");
    bytes = count * sizeof(float);
    if (bytes > DSGD_CL__STAGE_LARGEST) { /* too large to stage: wait */
        b->host_waits++;
        err = clEnqueueWriteBuffer(b->queue, dsgd_cl__buf(dst)->mem, CL_TRUE, dst.off * sizeof(float), bytes, src, 0,
                                   NULL, NULL);
    } else {
        size_t at = 0;
        cl_event ev;
        dsgd_result r = dsgd_cl__stage_take(b, bytes, &at);
        if (r != DSGD_OK) return r;
        memcpy(b->stage_host + at, src, bytes);
        err = clEnqueueWriteBuffer(b->queue, dsgd_cl__buf(dst)->mem, CL_FALSE, dst.off * sizeof(float), bytes,
                                   b->stage_host + at, 0, NULL, &ev);
        if (err == CL_SUCCESS) {
            dsgd_cl__staged *w = &b->staged[(b->staged_first + b->staged_n) % DSGD_CL__STAGED_MAX];
            w->lo = at;
            w->hi = at + bytes;
            w->ev = ev;
            b->staged_n++;
        }
    }
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueWriteBuffer", "write");
    return DSGD_OK;
}

static dsgd_result dsgd_cl__read(void *impl, dsgd_ref src, float *dst, size_t count) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_int err;
    if (!dsgd_cl__span(b, src, count, "read")) return DSGD_ERR_INVALID_ARGUMENT;
    if (count == 0) return dsgd_cl__finish(b);
    if (!dst) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl read: dst is NULL");
    err = clEnqueueReadBuffer(b->queue, dsgd_cl__buf(src)->mem, CL_TRUE, src.off * sizeof(float),
                              count * sizeof(float), dst, 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "read");
    return dsgd_cl__waited(b);
}

DSGD_API int dsgd_cl_is_backend(const dsgd_backend_i *b) {
    return b && b->impl && b->destroy == dsgd_cl__destroy;
}

DSGD_API cl_command_queue dsgd_cl_backend_queue(const dsgd_backend_i *b) {
    return dsgd_cl_is_backend(b) ? ((dsgd_cl__backend *)b->impl)->queue : NULL;
}

DSGD_API cl_device_id dsgd_cl_backend_device(const dsgd_backend_i *b) {
    return dsgd_cl_is_backend(b) ? ((dsgd_cl__backend *)b->impl)->device : NULL;
}

DSGD_API dsgd_cl_context *dsgd_cl_backend_context(const dsgd_backend_i *b) {
    return dsgd_cl_is_backend(b) ? ((dsgd_cl__backend *)b->impl)->cl : NULL;
}

DSGD_API unsigned long dsgd_cl_backend_foreign_writes(const dsgd_backend_i *b) {
    return dsgd_cl_is_backend(b) ? ((const dsgd_cl__backend *)b->impl)->foreign_writes : 0;
}

DSGD_API unsigned long dsgd_cl_backend_host_waits(const dsgd_backend_i *b) {
    return dsgd_cl_is_backend(b) ? ((const dsgd_cl__backend *)b->impl)->host_waits : 0;
}

DSGD_API unsigned long dsgd_cl_backend_gemm_exclusive(const dsgd_backend_i *b) {
    return dsgd_cl_is_backend(b) ? ((const dsgd_cl__backend *)b->impl)->gemm_exclusive : 0;
}

DSGD_API cl_mem dsgd_cl_buffer_mem(const dsgd_buffer *buf) {
    const dsgd_cl__buffer *b = (const dsgd_cl__buffer *)(const void *)buf;
    return b && b->magic == DSGD_CL__MAGIC ? b->mem : NULL;
}

static dsgd_result dsgd_cl__map_impl(dsgd_cl__backend *b, dsgd_ref ref, size_t count, int flags, float **out) {
    cl_map_flags mf = 0;
    cl_int err;
    dsgd_result r;
    void *p;
    *out = NULL;
    if (!(flags & (DSGD_CL_MAP_READ | DSGD_CL_MAP_WRITE)) || (flags & ~(DSGD_CL_MAP_READ | DSGD_CL_MAP_WRITE)))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_map: flags %d", flags);
    if (count == 0) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_map: count 0");
    if (!((flags & DSGD_CL_MAP_WRITE) ? dsgd_cl__out : dsgd_cl__span)(b, ref, count, "map"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (flags & DSGD_CL_MAP_READ) mf |= CL_MAP_READ;
    if (flags & DSGD_CL_MAP_WRITE) mf |= CL_MAP_WRITE;
    p = clEnqueueMapBuffer(b->queue, dsgd_cl__buf(ref)->mem, CL_TRUE, mf, ref.off * sizeof(float),
                           count * sizeof(float), 0, NULL, NULL, &err);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueMapBuffer", "dsgd_cl_map");
    if ((r = dsgd_cl__waited(b)) != DSGD_OK) {
        clEnqueueUnmapMemObject(b->queue, dsgd_cl__buf(ref)->mem, p, 0, NULL, NULL);
        return r;
    }
    *out = (float *)p;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cl_map(const dsgd_backend_i *be, dsgd_ref ref, size_t count, int flags, float **out) {
    if (out) *out = NULL;
    if (!dsgd_cl_is_backend(be) || !out)
        return DSGD_ERR_INVALID_ARGUMENT; /* no context to record on */
    return dsgd_cl__map_impl((dsgd_cl__backend *)be->impl, ref, count, flags, out);
}

static dsgd_result dsgd_cl__unmap_impl(dsgd_cl__backend *b, dsgd_ref ref, float *ptr) {
    cl_int err;
    if (!ptr || !dsgd_cl__span(b, ref, 0, "unmap")) {
        if (!ptr) dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_unmap: NULL pointer");
        return DSGD_ERR_INVALID_ARGUMENT;
    }
    err = clEnqueueUnmapMemObject(b->queue, dsgd_cl__buf(ref)->mem, ptr, 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueUnmapMemObject", "dsgd_cl_unmap");
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cl_unmap(const dsgd_backend_i *be, dsgd_ref ref, float *ptr) {
    if (!dsgd_cl_is_backend(be)) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd_cl__unmap_impl((dsgd_cl__backend *)be->impl, ref, ptr);
}

#endif /* DSGD_CL__PART_BACKEND_IMPL */
