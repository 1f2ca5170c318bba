/* distsgd/cl/backend.h - the OpenCL backend: CLBlast GEMM and our kernels behind dsgd_backend_i
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

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

static void dsgd_cl__destroy(void *impl);
static dsgd_result dsgd_cl__finish(void *impl);
static dsgd_result dsgd_cl__map_impl(dsgd_cl__backend *b, dsgd_ref ref, size_t count, int flags, float **out);
static dsgd_result dsgd_cl__unmap_impl(dsgd_cl__backend *b, dsgd_ref ref, float *ptr);

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

static dsgd_result dsgd_cl__copy(void *impl, dsgd_ref dst, dsgd_ref src, size_t count) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    dsgd_cl__buffer *d, *s;
    cl_int err;
    if (!dsgd_cl__out(b, dst, count, "copy") || !dsgd_cl__span(b, src, count, "copy"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (count == 0 || (dst.buf == src.buf && dst.off == src.off)) return DSGD_OK;
    d = dsgd_cl__buf(dst);
    s = dsgd_cl__buf(src);
    if (d == s && (dst.off < src.off + count && src.off < dst.off + count)) {
        /* overlapping ranges (memmove semantics): go through the scratch buffer */
        dsgd_result r = dsgd_cl__ensure_scratch(b, count * sizeof(float));
        if (r != DSGD_OK) return r;
        err = clEnqueueCopyBuffer(b->queue, s->mem, b->scratch, src.off * sizeof(float), 0,
                                  count * sizeof(float), 0, NULL, NULL);
        if (err == CL_SUCCESS)
            err = clEnqueueCopyBuffer(b->queue, b->scratch, d->mem, 0, dst.off * sizeof(float),
                                      count * sizeof(float), 0, NULL, NULL);
    } else {
        err = clEnqueueCopyBuffer(b->queue, s->mem, d->mem, src.off * sizeof(float),
                                  dst.off * sizeof(float), count * sizeof(float), 0, NULL, NULL);
    }
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueCopyBuffer", "copy");
    return DSGD_OK;
}

static dsgd_result dsgd_cl__fill(void *impl, dsgd_ref dst, float value, size_t count) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_float v = value;
    cl_int err;
    if (!dsgd_cl__out(b, dst, count, "fill")) return DSGD_ERR_INVALID_ARGUMENT;
    if (count == 0) return DSGD_OK;
    err = clEnqueueFillBuffer(b->queue, dsgd_cl__buf(dst)->mem, &v, sizeof(v), dst.off * sizeof(float),
                              count * sizeof(float), 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueFillBuffer", "fill");
    return DSGD_OK;
}

static dsgd_result dsgd_cl__scale(void *impl, dsgd_ref x, float alpha, size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong off = x.off, nn = n;
    cl_float a = alpha;
    dsgd_result r;
    if (!dsgd_cl__out(b, x, n, "scale")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    r = dsgd_cl__args(b, DSGD_CL__K_SCALE, 4, DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(off),
                      DSGD_CL__A(a), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_SCALE, n, b->local);
}

static dsgd_result dsgd_cl__axpy(void *impl, dsgd_ref y, float alpha, dsgd_ref x, size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong yoff = y.off, xoff = x.off, nn = n;
    cl_float a = alpha;
    dsgd_result r;
    if (!dsgd_cl__out(b, y, n, "axpy") || !dsgd_cl__span(b, x, n, "axpy")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    r = dsgd_cl__args(b, DSGD_CL__K_AXPY, 6, DSGD_CL__A(dsgd_cl__buf(y)->mem), DSGD_CL__A(yoff),
                      DSGD_CL__A(a), DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(xoff), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_AXPY, n, b->local);
}

/* C = beta * C for the m x n matrix at c (row stride ldc): beta == 0
   overwrites (NaN does not propagate), beta == 1 leaves C alone. */
static dsgd_result dsgd_cl__scale_matrix(dsgd_cl__backend *b, dsgd_ref c, int m, int n, int ldc,
                                         float beta) {
    int i;
    dsgd_result r = DSGD_OK;
    if (beta == 1.0f) return DSGD_OK;
    if (ldc == n) {
        return beta == 0.0f ? dsgd_cl__fill(b, c, 0.0f, (size_t)m * n)
                            : dsgd_cl__scale(b, c, beta, (size_t)m * n);
    }
    for (i = 0; i < m && r == DSGD_OK; ++i) {
        dsgd_ref row = c;
        row.off += (size_t)i * ldc;
        r = beta == 0.0f ? dsgd_cl__fill(b, row, 0.0f, (size_t)n) : dsgd_cl__scale(b, row, beta, (size_t)n);
    }
    return r;
}

/* A thin TN GEMM over a long k (a weight gradient over many rows, such as
   a convolution's over batch x pixels) gives CLBlast one tile of C or a few
   to run the whole k through; such GEMMs are split along k instead, into
   parts of at least 64 rows (at most 256 parts) that run in parallel and
   are then added in order (GEMM in the header comment). */
/* Whether b has run this GEMM shape since the last parameter override;
   called under the CLBlast lock (which guards the epoch). */
static int dsgd_cl__gemm_warm(const dsgd_cl__backend *b, int ta, int tb, int m, int n, int k) {
    int i;
    if (b->warm_epoch != dsgd_cl__clblast_epoch) return 0;
    for (i = 0; i < b->nwarm; ++i) {
        const dsgd_cl__shape *w = &b->warm[i];
        if (w->ta == ta && w->tb == tb && w->m == m && w->n == n && w->k == k) return 1;
    }
    return 0;
}

/* Notes a shape whose first call succeeded (under the exclusive lock). Past
   DSGD_CL__WARM_MAX shapes, a new one keeps taking the lock exclusively. */
static void dsgd_cl__gemm_remember(dsgd_cl__backend *b, int ta, int tb, int m, int n, int k) {
    dsgd_cl__shape *w;
    if (b->warm_epoch != dsgd_cl__clblast_epoch) {
        b->nwarm = 0;
        b->warm_epoch = dsgd_cl__clblast_epoch;
    }
    if (b->nwarm == DSGD_CL__WARM_MAX) return;
    w = &b->warm[b->nwarm++];
    w->ta = ta;
    w->tb = tb;
    w->m = m;
    w->n = n;
    w->k = k;
}

static int dsgd_cl__split_k(int ta, int tb, int m, int n, int k) {
    return ta && !tb && (size_t)m * (size_t)n <= 8192 && k >= 2048 && k >= 16 * (m > n ? m : n);
}

static dsgd_result dsgd_cl__gemm_split_k(dsgd_cl__backend *b, int m, int n, int k, float alpha, dsgd_ref ra,
                                         int lda, dsgd_ref rb, int ldb, float beta, dsgd_ref rc, int ldc) {
    size_t chunk = ((size_t)k + 255) / 256; /* at most 256 parts, of at least 64 rows */
    cl_uint mm = (cl_uint)m, nn = (cl_uint)n, kk = (cl_uint)k, kc, parts, la = (cl_uint)lda, lb = (cl_uint)ldb,
            lc = (cl_uint)ldc;
    cl_ulong aoff = ra.off, boff = rb.off, coff = rc.off;
    cl_float al = alpha, be = beta;
    dsgd_result r;
    if (chunk < 64) chunk = 64;
    kc = (cl_uint)chunk;
    parts = (cl_uint)(((size_t)k + chunk - 1) / chunk);
    if ((r = dsgd_cl__ensure_scratch(b, (size_t)parts * (size_t)m * (size_t)n * sizeof(float))) != DSGD_OK) return r;
    r = dsgd_cl__args(b, DSGD_CL__K_GEMM_TN_PART, 11, DSGD_CL__A(mm), DSGD_CL__A(nn), DSGD_CL__A(kk), DSGD_CL__A(kc),
                      DSGD_CL__A(dsgd_cl__buf(ra)->mem), DSGD_CL__A(aoff), DSGD_CL__A(la),
                      DSGD_CL__A(dsgd_cl__buf(rb)->mem), DSGD_CL__A(boff), DSGD_CL__A(lb), DSGD_CL__A(b->scratch));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_GEMM_TN_PART, (size_t)parts * b->local, b->local);
    if (r == DSGD_OK)
        r = dsgd_cl__args(b, DSGD_CL__K_GEMM_TN_SUM, 9, DSGD_CL__A(mm), DSGD_CL__A(nn), DSGD_CL__A(parts),
                          DSGD_CL__A(b->scratch), DSGD_CL__A(al), DSGD_CL__A(be), DSGD_CL__A(dsgd_cl__buf(rc)->mem),
                          DSGD_CL__A(coff), DSGD_CL__A(lc));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_GEMM_TN_SUM, (size_t)m * (size_t)n, b->local);
    return r;
}

static dsgd_result dsgd_cl__gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha,
                                 dsgd_ref ra, int lda, dsgd_ref rb, int ldb, float beta, dsgd_ref rc,
                                 int ldc) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    CLBlastTranspose tra = ta ? CLBlastTransposeYes : CLBlastTransposeNo, trb = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    size_t temp_bytes = 0;
    const char *call = "CLBlastSgemm";
    CLBlastStatusCode st;
    int exclusive;
    char what[96];
    if (m < 0 || n < 0 || k < 0 || lda < (a_cols > 1 ? a_cols : 1) || ldb < (b_cols > 1 ? b_cols : 1) ||
        ldc < (n > 1 ? n : 1))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "opencl gemm: bad sizes m=%d n=%d k=%d lda=%d ldb=%d ldc=%d", m, n, k,
                                  lda, ldb, ldc);
    if (m == 0 || n == 0) return DSGD_OK;
    if (!dsgd_cl__out(b, rc, (size_t)(m - 1) * ldc + n, "gemm C")) return DSGD_ERR_INVALID_ARGUMENT;
    if (k == 0 || alpha == 0.0f) return dsgd_cl__scale_matrix(b, rc, m, n, ldc, beta);
    if (!dsgd_cl__span(b, ra, (size_t)(a_rows - 1) * lda + a_cols, "gemm A") ||
        !dsgd_cl__span(b, rb, (size_t)(b_rows - 1) * ldb + b_cols, "gemm B"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (b->split_k && dsgd_cl__split_k(ta, tb, m, n, k)) return dsgd_cl__gemm_split_k(b, m, n, k, alpha, ra, lda, rb, ldb, beta, rc, ldc);
    /* CLBlast's indirect GEMM transposes and pads operands into a temporary
       buffer; left to itself it creates and frees one per call. The backend
       keeps one, grown when a call needs more (the in-order queue keeps
       consecutive GEMMs from overlapping in it). */
    pthread_rwlock_rdlock(&dsgd_cl__clblast_lock);
    exclusive = !dsgd_cl__gemm_warm(b, ta, tb, m, n, k);
    if (exclusive) { /* the shape's first call here: CLBlast may store to its caches */
        pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
        pthread_rwlock_wrlock(&dsgd_cl__clblast_lock);
        b->gemm_exclusive++;
    }
    st = CLBlastSGemmTempBufferSize(CLBlastLayoutRowMajor, tra, trb, (size_t)m, (size_t)n, (size_t)k, ra.off,
                                    (size_t)lda, rb.off, (size_t)ldb, rc.off, (size_t)ldc, &b->queue, &temp_bytes);
    if (st == CLBlastSuccess && temp_bytes > b->gemm_temp_bytes) {
        cl_int err;
        if (b->gemm_temp) clReleaseMemObject(b->gemm_temp); /* freed once queued work is done */
        b->gemm_temp_bytes = 0;
        b->gemm_temp = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE, temp_bytes, NULL, &err);
        if (err != CL_SUCCESS) {
            pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
            b->gemm_temp = NULL;
            return dsgd_cl__fail(b->ctx, err, "clCreateBuffer", "gemm temporary buffer");
        }
        b->gemm_temp_bytes = temp_bytes;
    }
    if (st != CLBlastSuccess) call = "CLBlastSGemmTempBufferSize";
    if (st == CLBlastSuccess)
        st = b->gemm_temp ? CLBlastSgemmWithTempBuffer(CLBlastLayoutRowMajor, tra, trb, (size_t)m, (size_t)n,
                                                      (size_t)k, alpha, dsgd_cl__buf(ra)->mem, ra.off, (size_t)lda,
                                                      dsgd_cl__buf(rb)->mem, rb.off, (size_t)ldb, beta,
                                                      dsgd_cl__buf(rc)->mem, rc.off, (size_t)ldc, &b->queue, NULL,
                                                      b->gemm_temp)
                          : CLBlastSgemm(CLBlastLayoutRowMajor, tra, trb, (size_t)m, (size_t)n, (size_t)k, alpha,
                                         dsgd_cl__buf(ra)->mem, ra.off, (size_t)lda, dsgd_cl__buf(rb)->mem, rb.off,
                                         (size_t)ldb, beta, dsgd_cl__buf(rc)->mem, rc.off, (size_t)ldc, &b->queue,
                                         NULL);
    if (exclusive && st == CLBlastSuccess) dsgd_cl__gemm_remember(b, ta, tb, m, n, k);
    pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
    if (st != CLBlastSuccess) {
        snprintf(what, sizeof(what), "%s%s %dx%dx%d", ta ? "T" : "N", tb ? "T" : "N", m, n, k);
        return dsgd_cl__fail(b->ctx, (int)st, call, what);
    }
    return DSGD_OK;
}

static int dsgd_cl__act_valid(dsgd_activation act) {
    return act == DSGD_ACT_NONE || act == DSGD_ACT_RELU || act == DSGD_ACT_TANH || act == DSGD_ACT_SIGMOID;
}

static dsgd_result dsgd_cl__bias_act_forward(void *impl, dsgd_activation act, dsgd_ref y, dsgd_ref bias,
                                             int m, int n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong yoff = y.off, boff = bias.off, total;
    cl_int has_bias = bias.buf != NULL, a = (cl_int)act;
    cl_uint nn = (cl_uint)n;
    cl_mem bmem;
    dsgd_result r;
    if (m < 0 || n < 0 || !dsgd_cl__act_valid(act))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "opencl bias_act_forward: bad arguments m=%d n=%d act=%d", m, n, (int)act);
    total = (cl_ulong)m * (cl_ulong)n;
    if (!dsgd_cl__out(b, y, (size_t)total, "bias_act_forward y")) return DSGD_ERR_INVALID_ARGUMENT;
    if (has_bias && !dsgd_cl__span(b, bias, (size_t)n, "bias_act_forward bias")) return DSGD_ERR_INVALID_ARGUMENT;
    if (total == 0 || (!has_bias && act == DSGD_ACT_NONE)) return DSGD_OK;
    bmem = has_bias ? dsgd_cl__buf(bias)->mem : NULL;
    r = dsgd_cl__args(b, DSGD_CL__K_BIAS_ACT, 8, DSGD_CL__A(dsgd_cl__buf(y)->mem), DSGD_CL__A(yoff),
                      DSGD_CL__A(bmem), DSGD_CL__A(boff), DSGD_CL__A(has_bias), DSGD_CL__A(a), DSGD_CL__A(nn),
                      DSGD_CL__A(total));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_BIAS_ACT, (size_t)total, b->local);
}

static dsgd_result dsgd_cl__act_backward(void *impl, dsgd_activation act, dsgd_ref dy, dsgd_ref y,
                                         size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong dyoff = dy.off, yoff = y.off, nn = n;
    cl_int a = (cl_int)act;
    dsgd_result r;
    if (!dsgd_cl__act_valid(act))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl act_backward: bad activation %d",
                                  (int)act);
    if (!dsgd_cl__out(b, dy, n, "act_backward dy") || !dsgd_cl__span(b, y, n, "act_backward y"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0 || act == DSGD_ACT_NONE) return DSGD_OK;
    r = dsgd_cl__args(b, DSGD_CL__K_ACT_BWD, 6, DSGD_CL__A(dsgd_cl__buf(dy)->mem), DSGD_CL__A(dyoff),
                      DSGD_CL__A(dsgd_cl__buf(y)->mem), DSGD_CL__A(yoff), DSGD_CL__A(a), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_ACT_BWD, n, b->local);
}

/* db = column sums of dy in the blocked order (kernels.h): with one block
   of DSGD_CL__BIAS_ROWS rows (m at most that) the partials kernel writes db
   itself; else it writes the blocks' partials to the scratch buffer and a
   second kernel sums them per column in block order. */
static dsgd_result dsgd_cl__bias_backward(void *impl, dsgd_ref db, dsgd_ref dy, int m, int n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong dboff = db.off, dyoff = dy.off, poff;
    cl_uint mm = (cl_uint)m, nn = (cl_uint)n, blocks;
    cl_mem part;
    dsgd_result r;
    if (m < 0 || n < 0)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl bias_backward: m=%d n=%d", m, n);
    if (!dsgd_cl__out(b, db, (size_t)n, "bias_backward db") ||
        !dsgd_cl__span(b, dy, (size_t)m * (size_t)n, "bias_backward dy"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    blocks = m <= DSGD_CL__BIAS_ROWS ? 1 : (mm + DSGD_CL__BIAS_ROWS - 1) / DSGD_CL__BIAS_ROWS;
    if (blocks == 1) {
        part = dsgd_cl__buf(db)->mem;
        poff = dboff;
    } else {
        r = dsgd_cl__ensure_scratch(b, (size_t)blocks * (size_t)n * sizeof(float));
        if (r != DSGD_OK) return r;
        part = b->scratch;
        poff = 0;
    }
    r = dsgd_cl__args(b, DSGD_CL__K_BIAS_PART, 6, DSGD_CL__A(part), DSGD_CL__A(poff),
                      DSGD_CL__A(dsgd_cl__buf(dy)->mem), DSGD_CL__A(dyoff), DSGD_CL__A(mm), DSGD_CL__A(nn));
    if (r == DSGD_OK) r = dsgd_cl__run2(b, DSGD_CL__K_BIAS_PART, (size_t)n, (size_t)blocks, b->local);
    if (r != DSGD_OK || blocks == 1) return r;
    r = dsgd_cl__args(b, DSGD_CL__K_BIAS_RED, 5, DSGD_CL__A(dsgd_cl__buf(db)->mem), DSGD_CL__A(dboff),
                      DSGD_CL__A(b->scratch), DSGD_CL__A(blocks), DSGD_CL__A(nn));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_BIAS_RED, (size_t)n, b->local);
}

static dsgd_result dsgd_cl__loss(void *impl, dsgd_loss loss, int m, int c, dsgd_ref pred, dsgd_ref target,
                                 float grad_scale, dsgd_ref dpred, dsgd_ref stats) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    int xent = loss == DSGD_LOSS_SOFTMAX_XENT, kid;
    cl_uint mm = (cl_uint)m, cc = (cl_uint)c;
    cl_ulong poff = pred.off, toff = target.off, doff = dpred.off, soff = stats.off;
    cl_float gs = grad_scale;
    cl_int want = dpred.buf != NULL;
    int slot;
    cl_mem dmem;
    size_t L = b->reduce_local;
    dsgd_result r;
    cl_int err;
    if (m < 0 || c < 1 || (loss != DSGD_LOSS_SOFTMAX_XENT && loss != DSGD_LOSS_MSE))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl loss: bad arguments m=%d c=%d loss=%d",
                                  m, c, (int)loss);
    if (!dsgd_cl__span(b, pred, (size_t)m * c, "loss pred") ||
        !dsgd_cl__span(b, target, xent ? (size_t)m : (size_t)m * c, "loss target") ||
        !dsgd_cl__out(b, stats, 2, "loss stats"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (want && !dsgd_cl__out(b, dpred, (size_t)m * c, "loss dpred")) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd_cl__class_checks(b, 0)) != DSGD_OK) return r; /* an earlier loss's, come in */
    if (m == 0) return DSGD_OK;
    r = dsgd_cl__ensure_scratch(b, 2 * (size_t)m * b->acc_size);
    if (r != DSGD_OK) return r;
    dmem = want ? dsgd_cl__buf(dpred)->mem : NULL;
    kid = xent ? DSGD_CL__K_XENT : DSGD_CL__K_MSE;
    r = dsgd_cl__args(b, kid, 11, DSGD_CL__A(mm), DSGD_CL__A(cc), DSGD_CL__A(dsgd_cl__buf(pred)->mem),
                      DSGD_CL__A(poff), DSGD_CL__A(dsgd_cl__buf(target)->mem), DSGD_CL__A(toff), DSGD_CL__A(gs),
                      DSGD_CL__A(dmem), DSGD_CL__A(doff), DSGD_CL__A(want), DSGD_CL__A(b->scratch));
    if (r == DSGD_OK) r = dsgd_cl__run(b, kid, (size_t)m, b->local);
    if (r == DSGD_OK)
        r = dsgd_cl__args(b, DSGD_CL__K_LOSS_REDUCE, 9, DSGD_CL__A(mm), DSGD_CL__A(b->scratch),
                          DSGD_CL__A(dsgd_cl__buf(stats)->mem), DSGD_CL__A(soff), DSGD_CL__A(b->status),
                          DSGD_CL__LOCAL(L * b->acc_size), DSGD_CL__LOCAL(L * b->acc_size),
                          DSGD_CL__LOCAL(L * sizeof(cl_uint)), DSGD_CL__LOCAL(L * sizeof(cl_uint)));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_LOSS_REDUCE, L, L);
    if (r != DSGD_OK) return r;
    if (!xent) return DSGD_OK; /* MSE has no invalid targets */
    /* The class check's answer comes back without waiting, into a pinned
       slot; a later loss or a call that waits looks at it (CLASS CHECKS). */
    if (b->checks_n == DSGD_CL__CHECKS_MAX && (r = dsgd_cl__class_checks(b, 1)) != DSGD_OK) return r;
    slot = (b->checks_first + b->checks_n) % DSGD_CL__CHECKS_MAX;
    err = clEnqueueReadBuffer(b->queue, b->status, CL_FALSE, 0, 3 * sizeof(cl_int), b->checks_host + 4 * slot, 0,
                              NULL, &b->checks[slot].ev);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "loss class check");
    b->checks[slot].m = m;
    b->checks[slot].c = c;
    b->checks_n++;
    return DSGD_OK;
}

static dsgd_result dsgd_cl__optimizer_update(void *impl, const dsgd_opt_update *u, dsgd_ref p, dsgd_ref g,
                                             dsgd_ref m1, dsgd_ref m2, size_t n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong poff = p.off, goff = g.off, m1off = m1.off, m2off = m2.off, nn = n;
    cl_int kind, nesterov;
    cl_float lr, mu, b1, b2, eps, wd, bc1, bc2, gs;
    cl_mem m1mem = NULL, m2mem = NULL, gmem;
    cl_ulong gateoff = u ? u->gate.off : 0;
    cl_int gated = u && u->gate.buf != NULL;
    dsgd_result r;
    if (!u) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl optimizer_update: bad arguments");
    if (!dsgd_cl__out(b, p, n, "optimizer_update param") || !dsgd_cl__span(b, g, n, "optimizer_update grad"))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (u->kind != DSGD_OPT_SGD && u->kind != DSGD_OPT_MOMENTUM && u->kind != DSGD_OPT_ADAM &&
        u->kind != DSGD_OPT_ADAMW)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl optimizer_update: unknown kind %d",
                                  (int)u->kind);
    if (u->kind != DSGD_OPT_SGD) {
        if (!dsgd_cl__out(b, m1, n, "optimizer_update state m1")) return DSGD_ERR_INVALID_ARGUMENT;
        m1mem = dsgd_cl__buf(m1)->mem;
    }
    if (u->kind == DSGD_OPT_ADAM || u->kind == DSGD_OPT_ADAMW) {
        if (!dsgd_cl__out(b, m2, n, "optimizer_update state m2")) return DSGD_ERR_INVALID_ARGUMENT;
        m2mem = dsgd_cl__buf(m2)->mem;
    }
    if (gated && !dsgd_cl__span(b, u->gate, 1, "optimizer_update gate")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) return DSGD_OK;
    gmem = gated ? dsgd_cl__buf(u->gate)->mem : dsgd_cl__buf(p)->mem; /* not NULL: see args8 */
    kind = (cl_int)u->kind;
    nesterov = u->nesterov != 0;
    lr = u->lr;
    mu = u->momentum;
    b1 = u->beta1;
    b2 = u->beta2;
    eps = u->eps;
    wd = u->weight_decay;
    bc1 = u->bias_correction1;
    bc2 = u->bias_correction2;
    gs = u->grad_scale;
    r = dsgd_cl__args(b, DSGD_CL__K_OPT, 23, DSGD_CL__A(dsgd_cl__buf(p)->mem), DSGD_CL__A(poff),
                      DSGD_CL__A(dsgd_cl__buf(g)->mem), DSGD_CL__A(goff), DSGD_CL__A(m1mem), DSGD_CL__A(m1off),
                      DSGD_CL__A(m2mem), DSGD_CL__A(m2off), DSGD_CL__A(nn), DSGD_CL__A(kind), DSGD_CL__A(lr),
                      DSGD_CL__A(mu), DSGD_CL__A(nesterov), DSGD_CL__A(b1), DSGD_CL__A(b2), DSGD_CL__A(eps),
                      DSGD_CL__A(wd), DSGD_CL__A(bc1), DSGD_CL__A(bc2), DSGD_CL__A(gs), DSGD_CL__A(gmem),
                      DSGD_CL__A(gateoff), DSGD_CL__A(gated));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_OPT, n, b->local);
}

static dsgd_result dsgd_cl__norm_check(void *impl, dsgd_ref x, size_t n, double *sumsq, size_t *nonfinite) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    size_t L = b->reduce_local, groups, chunk, i;
    cl_ulong off = x.off, nn = n, ch;
    double psum_d[DSGD_CL__NORM_MAX_GROUPS];
    float psum_f[DSGD_CL__NORM_MAX_GROUPS];
    cl_ulong pbad[DSGD_CL__NORM_MAX_GROUPS];
    double s = 0.0;
    size_t bad = 0;
    dsgd_result r;
    cl_int err;
    cl_mem status;
    if (!dsgd_cl__span(b, x, n, "norm_check")) return DSGD_ERR_INVALID_ARGUMENT;
    if (n == 0) {
        if (sumsq) *sumsq = 0.0;
        if (nonfinite) *nonfinite = 0;
        return DSGD_OK;
    }
    /* Fixed for a given n and device: the same bits every run. */
    groups = (n + L * 16 - 1) / (L * 16);
    if (groups > DSGD_CL__NORM_MAX_GROUPS) groups = DSGD_CL__NORM_MAX_GROUPS;
    if (groups < 1) groups = 1;
    chunk = (n + groups - 1) / groups;
    ch = chunk;
    r = dsgd_cl__ensure_scratch(b, groups * b->acc_size);
    if (r != DSGD_OK) return r;
    status = b->status;
    r = dsgd_cl__args(b, DSGD_CL__K_NORM, 8, DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(off), DSGD_CL__A(nn),
                      DSGD_CL__A(ch), DSGD_CL__A(b->scratch), DSGD_CL__A(status), DSGD_CL__LOCAL(L * b->acc_size),
                      DSGD_CL__LOCAL(L * sizeof(cl_ulong)));
    if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_NORM, groups * L, L);
    if (r != DSGD_OK) return r;
    err = clEnqueueReadBuffer(b->queue, b->scratch, CL_FALSE, 0, groups * b->acc_size,
                              b->acc_size == sizeof(double) ? (void *)psum_d : (void *)psum_f, 0, NULL, NULL);
    if (err == CL_SUCCESS)
        err = clEnqueueReadBuffer(b->queue, b->status, CL_TRUE, 0, groups * sizeof(cl_ulong), pbad, 0, NULL, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "norm_check partials");
    if ((r = dsgd_cl__waited(b)) != DSGD_OK) return r;
    /* second pass on the host, in group order, in double */
    for (i = 0; i < groups; ++i) {
        s += b->acc_size == sizeof(double) ? psum_d[i] : (double)psum_f[i];
        bad += (size_t)pbad[i];
    }
    if (sumsq) *sumsq = s;
    if (nonfinite) *nonfinite = bad;
    return DSGD_OK;
}

/* Sets kernel k's 8 (buffer, offset) pairs from argument `first` on to
   refs[0 .. count), shifted by lo; the unused pairs repeat refs[0] (never
   touched: the kernel stops at count). Not NULL: PoCL 3.1 ran these kernels
   about 80x slower with NULL buffer arguments. */
static dsgd_result dsgd_cl__args8(dsgd_cl__backend *b, int k, int first, const dsgd_ref *refs, int count,
                                  size_t lo) {
    int j;
    dsgd_result r = DSGD_OK;
    for (j = 0; j < 8 && r == DSGD_OK; ++j) {
        cl_mem mem = dsgd_cl__buf(refs[j < count ? j : 0])->mem;
        cl_ulong off = j < count ? (cl_ulong)(refs[j].off + lo) : 0;
        r = dsgd_cl__arg(b, k, first + 2 * j, sizeof(mem), &mem);
        if (r == DSGD_OK) r = dsgd_cl__arg(b, k, first + 2 * j + 1, sizeof(off), &off);
    }
    return r;
}

static int dsgd_cl__host_shared(void *impl) {
    return (((dsgd_cl__backend *)impl)->alloc_flags & CL_MEM_ALLOC_HOST_PTR) != 0;
}

/* One context and one device: a backend on another device could write one
   block of a buffer while this one writes another, and a runtime that keeps
   a copy per device and migrates the whole buffer would lose one of them. */
static int dsgd_cl__can_access(void *impl, const dsgd_backend_i *other) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    const dsgd_cl__backend *o;
    if (!dsgd_cl_is_backend(other)) return 0;
    o = (const dsgd_cl__backend *)other->impl;
    return o->cl == b->cl && o->dev == b->dev;
}

static const char *dsgd_cl__device_name(void *impl) { return ((dsgd_cl__backend *)impl)->label; }

/* Sums [lo, hi) of the n ranges in index order and writes the sum to all
   of them: up to 8 ranges in one launch, in place; more into the scratch
   buffer 8 sources a launch, then copied back to all of them. */
static dsgd_result dsgd_cl__sum_across(void *impl, const dsgd_ref *refs, int n, size_t lo, size_t hi) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong count = hi - lo, zero = 0;
    cl_int put = n <= 8; /* one launch, in place */
    cl_mem d;
    int j;
    dsgd_result r = DSGD_OK;
    if (!refs || n < 1 || hi < lo)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl sum_across: bad arguments");
    for (j = 0; j < n; ++j) {
        dsgd_ref x = refs[j];
        x.off += lo;
        if (!dsgd_cl__span(b, x, (size_t)count, "sum_across")) return DSGD_ERR_INVALID_ARGUMENT;
        if (dsgd_cl__buf(x)->dev != b->dev)
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "opencl sum_across: buffer %d was made on %s (device %d), this backend runs "
                                      "on %s (device %d); sum_across reaches one device's buffers",
                                      j, dsgd_cl_context_device_info(b->cl, dsgd_cl__buf(x)->dev)->device_name,
                                      dsgd_cl__buf(x)->dev, dsgd_cl_context_device_info(b->cl, b->dev)->device_name,
                                      b->dev);
    }
    if (count == 0) return DSGD_OK;
    if (!put && (r = dsgd_cl__ensure_scratch(b, (size_t)count * sizeof(float))) != DSGD_OK) return r;
    d = put ? dsgd_cl__buf(refs[0])->mem : b->scratch; /* d is unused with put */
    for (j = 0; j < n && r == DSGD_OK; j += 8) {
        cl_int acc = j > 0;
        cl_uint k = (cl_uint)(n - j < 8 ? n - j : 8);
        r = dsgd_cl__args(b, DSGD_CL__K_SUM8, 6, DSGD_CL__A(d), DSGD_CL__A(zero), DSGD_CL__A(acc), DSGD_CL__A(put),
                          DSGD_CL__A(k), DSGD_CL__A(count));
        if (r == DSGD_OK) r = dsgd_cl__args8(b, DSGD_CL__K_SUM8, 6, refs + j, (int)k, lo);
        if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_SUM8, (size_t)count, b->local);
    }
    for (j = 0; j < n && r == DSGD_OK && !put; j += 8) {
        cl_uint k = (cl_uint)(n - j < 8 ? n - j : 8);
        r = dsgd_cl__args(b, DSGD_CL__K_COPY8, 4, DSGD_CL__A(b->scratch), DSGD_CL__A(zero), DSGD_CL__A(k),
                          DSGD_CL__A(count));
        if (r == DSGD_OK) r = dsgd_cl__args8(b, DSGD_CL__K_COPY8, 4, refs + j, (int)k, lo);
        if (r == DSGD_OK) r = dsgd_cl__run(b, DSGD_CL__K_COPY8, (size_t)count, b->local);
    }
    return r;
}

/* >>images ------------------------------------------------------------------ */
/* im2col, col2im and max-pool (IMAGES in backend.h): one work-item per
   float of the output or per row of them (BACKENDS), gathers where the
   CPU backend scatters within a row, the same sums in the same order (the
   kernels' comment in kernels.h). */

/* 1 when [a.off, a.off + na) and [b.off, b.off + nb) of one buffer share a
   float: a kernel reading what another work-item writes would race. */
static int dsgd_cl__overlap(dsgd_ref a, size_t na, dsgd_ref b, size_t nb) {
    return a.buf == b.buf && na && nb && a.off < b.off + nb && b.off < a.off + na;
}

/* Checks the window and the ranges (in: x, or col for col2im; y and dy:
   maxpool_backward's; out: col, dx or y) and launches kernel k, whose
   arguments are its buffers (as offsets) and then the window. */
static dsgd_result dsgd_cl__img(dsgd_cl__backend *b, int k, const dsgd_window *wd, dsgd_ref in, dsgd_ref y,
                                dsgd_ref dy, dsgd_ref out) {
    const char *name = dsgd_cl__kernel_op[k];
    dsgd__window_dims d;
    cl_int win[9], rd = b->img_spread ? 1 : 0;
    cl_ulong items, off[4];
    size_t nin, nout, run;
    const dsgd_ref *refs[4];
    int nref = 0, i;
    dsgd_result r;
    char what[48];
    if (dsgd__window_check(b->ctx, "opencl", name, wd, k == DSGD_CL__K_POOL_FWD || k == DSGD_CL__K_POOL_BWD, &d) !=
        DSGD_OK)
        return DSGD_ERR_INVALID_ARGUMENT;
    nin = k == DSGD_CL__K_COL2IM ? d.col : d.x;
    nout = k == DSGD_CL__K_IM2COL ? d.col : k == DSGD_CL__K_POOL_FWD ? d.y : d.x;
    snprintf(what, sizeof(what), "%s %s", name, k == DSGD_CL__K_COL2IM ? "col" : "x");
    if (!dsgd_cl__span(b, in, nin, what)) return DSGD_ERR_INVALID_ARGUMENT;
    refs[nref++] = &in;
    if (k == DSGD_CL__K_POOL_BWD) {
        snprintf(what, sizeof(what), "%s y", name);
        if (!dsgd_cl__span(b, y, d.y, what)) return DSGD_ERR_INVALID_ARGUMENT;
        snprintf(what, sizeof(what), "%s dy", name);
        if (!dsgd_cl__span(b, dy, d.y, what)) return DSGD_ERR_INVALID_ARGUMENT;
        if (dsgd_cl__overlap(out, nout, y, d.y) || dsgd_cl__overlap(out, nout, dy, d.y))
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl %s: dx overlaps y or dy", name);
        refs[nref++] = &y;
        refs[nref++] = &dy;
    }
    snprintf(what, sizeof(what), "%s %s", name,
             k == DSGD_CL__K_IM2COL ? "col" : k == DSGD_CL__K_POOL_FWD ? "y" : "dx");
    if (!dsgd_cl__out(b, out, nout, what)) return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd_cl__overlap(out, nout, in, nin))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl %s: the output overlaps the input", name);
    refs[nref++] = &out;
    win[0] = wd->h;
    win[1] = wd->w;
    win[2] = wd->c;
    win[3] = wd->kh;
    win[4] = wd->kw;
    win[5] = wd->stride;
    win[6] = wd->pad;
    win[7] = d.oh;
    win[8] = d.ow;
    /* the range (IMAGES kernels in kernels.h): dimension 0 along col's rows
       of kw c floats or the c channels of a pixel; dimension 1 over col's
       rows (i, oy, ox, ky), else the output's pixels */
    run = k == DSGD_CL__K_IM2COL ? (size_t)wd->kw * (size_t)wd->c : (size_t)wd->c;
    items = run ? (cl_ulong)(nout / run) : 0;
    /* 32-bit indices when every range (whence every index) fits in an int */
    if (nin > b->img32_max || nout > b->img32_max || (k == DSGD_CL__K_POOL_BWD && d.y > b->img32_max))
        k += DSGD_CL__K_IM2COL_64 - DSGD_CL__K_IM2COL;
    for (i = 0, r = DSGD_OK; i < nref && r == DSGD_OK; ++i) {
        off[i] = refs[i]->off;
        r = dsgd_cl__arg(b, k, 2 * i, sizeof(cl_mem), &dsgd_cl__buf(*refs[i])->mem);
        if (r == DSGD_OK) r = dsgd_cl__arg(b, k, 2 * i + 1, sizeof(cl_ulong), &off[i]);
    }
    for (i = 0; i < 9 && r == DSGD_OK; ++i) r = dsgd_cl__arg(b, k, 2 * nref + i, sizeof(cl_int), &win[i]);
    if (r == DSGD_OK) r = dsgd_cl__arg(b, k, 2 * nref + 9, sizeof(cl_ulong), &items);
    if (r == DSGD_OK) r = dsgd_cl__arg(b, k, 2 * nref + 10, sizeof(cl_int), &rd);
    return r != DSGD_OK ? r : dsgd_cl__run2(b, k, run, (size_t)items, b->img_spread ? b->local : 1);
}

static dsgd_result dsgd_cl__im2col(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref col) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_IM2COL, wd, x, x, x, col);
}

static dsgd_result dsgd_cl__col2im(void *impl, const dsgd_window *wd, dsgd_ref col, dsgd_ref dx) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_COL2IM, wd, col, col, col, dx);
}

static dsgd_result dsgd_cl__maxpool_forward(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_POOL_FWD, wd, x, x, x, y);
}

static dsgd_result dsgd_cl__maxpool_backward(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y,
                                             dsgd_ref dy, dsgd_ref dx) {
    return dsgd_cl__img((dsgd_cl__backend *)impl, DSGD_CL__K_POOL_BWD, wd, x, y, dy, dx);
}

static dsgd_result dsgd_cl__map_rw(void *impl, dsgd_ref ref, size_t count, float **out) {
    return dsgd_cl__map_impl((dsgd_cl__backend *)impl, ref, count, DSGD_CL_MAP_READ | DSGD_CL_MAP_WRITE, out);
}

static dsgd_result dsgd_cl__unmap_rw(void *impl, dsgd_ref ref, float *ptr) {
    return dsgd_cl__unmap_impl((dsgd_cl__backend *)impl, ref, ptr);
}

/* mark, wait_marks, release_mark: events of one context order its queues
   on the device. */
static dsgd_result dsgd_cl__mark(void *impl, void **out) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_event ev = NULL;
    cl_int err;
    if (!out) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl mark: out is NULL");
    *out = NULL;
    err = clEnqueueMarkerWithWaitList(b->queue, 0, NULL, &ev);
    /* another queue waiting for the mark needs this one flushed (OpenCL
       1.2, 5.13), and the device starts on what is queued */
    if (err == CL_SUCCESS) err = clFlush(b->queue);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueMarkerWithWaitList", "mark");
    *out = (void *)ev;
    return DSGD_OK;
}

static dsgd_result dsgd_cl__wait_marks(void *impl, void *const *marks, int n) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_event evs[64];
    int i;
    cl_int err;
    if (n < 0 || n > 64 || (n > 0 && !marks))
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl wait_marks: %d marks (0..64)", n);
    if (n == 0) return DSGD_OK;
    for (i = 0; i < n; ++i) {
        if (!marks[i])
            return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl wait_marks: mark %d is NULL", i);
        evs[i] = (cl_event)marks[i];
    }
    err = clEnqueueBarrierWithWaitList(b->queue, (cl_uint)n, evs, NULL);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueBarrierWithWaitList", "wait_marks");
    return DSGD_OK;
}

static void dsgd_cl__release_mark(void *impl, void *mark) {
    DSGD__UNUSED(impl);
    if (mark) clReleaseEvent((cl_event)mark);
}

/* nonfinite_flag, read_marked, wait_mark: the verdict kept on the device. */
static dsgd_result dsgd_cl__nonfinite_flag(void *impl, dsgd_ref x, size_t n, dsgd_ref flag) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_ulong off = x.off, nn = n, foff = flag.off;
    size_t L = b->reduce_local;
    dsgd_result r;
    if (!dsgd_cl__span(b, x, n, "nonfinite_flag x") || !dsgd_cl__out(b, flag, 1, "nonfinite_flag flag"))
        return DSGD_ERR_INVALID_ARGUMENT;
    r = dsgd_cl__args(b, DSGD_CL__K_NONFINITE, 6, DSGD_CL__A(dsgd_cl__buf(x)->mem), DSGD_CL__A(off), DSGD_CL__A(nn),
                      DSGD_CL__A(dsgd_cl__buf(flag)->mem), DSGD_CL__A(foff), DSGD_CL__LOCAL(L * sizeof(cl_int)));
    return r != DSGD_OK ? r : dsgd_cl__run(b, DSGD_CL__K_NONFINITE, L, L);
}

static dsgd_result dsgd_cl__read_marked(void *impl, dsgd_ref src, float *dst, size_t count, void **mark) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_event ev = NULL;
    cl_int err;
    if (!mark) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl read_marked: mark is NULL");
    *mark = NULL;
    if (!dsgd_cl__span(b, src, count, "read_marked")) return DSGD_ERR_INVALID_ARGUMENT;
    if (!dst || count == 0)
        return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl read_marked: dst NULL or count 0");
    err = clEnqueueReadBuffer(b->queue, dsgd_cl__buf(src)->mem, CL_FALSE, src.off * sizeof(float),
                              count * sizeof(float), dst, 0, NULL, &ev);
    if (err == CL_SUCCESS && (err = clFlush(b->queue)) != CL_SUCCESS) clReleaseEvent(ev); /* submitted now: in by the next step */
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clEnqueueReadBuffer", "read_marked");
    *mark = (void *)ev;
    return DSGD_OK;
}

static dsgd_result dsgd_cl__wait_mark(void *impl, void *mark) {
    dsgd_cl__backend *b = (dsgd_cl__backend *)impl;
    cl_int err;
    if (!mark) return dsgd_ctx_set_error(b->ctx, DSGD_ERR_INVALID_ARGUMENT, "opencl wait_mark: mark is NULL");
    err = dsgd_cl__await(b, (cl_event)mark);
    if (err != CL_SUCCESS) return dsgd_cl__fail(b->ctx, err, "clWaitForEvents", "wait_mark");
    return DSGD_OK;
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

/* >>backend creation -------------------------------------------------------- */
/* dsgd_cl_backend_create's phases, in order. Each records its error on ctx
   and leaves what it created in b, for dsgd_cl__destroy to release. */

/* The device's shared queue (see QUEUES) with one more reference, or a queue
   of the backend's own (always with profiling). */
static dsgd_result dsgd_cl__open_queue(dsgd_ctx *ctx, dsgd_cl__backend *b, int profiling) {
    dsgd_cl_context *c = b->cl;
    cl_command_queue shared = dsgd_cl__context_shared_queue(c, b->dev);
    cl_int err;
    if (shared && !profiling) {
        b->queue = shared;
        err = clRetainCommandQueue(b->queue);
    } else {
        b->queue = clCreateCommandQueue(dsgd_cl_context_handle(c), b->device,
                                        profiling ? CL_QUEUE_PROFILING_ENABLE : 0, &err);
    }
    if (err != CL_SUCCESS) {
        b->queue = NULL;
        return dsgd_cl__fail(ctx, err, "clCreateCommandQueue", dsgd_cl_context_device_info(c, b->dev)->device_name);
    }
    return DSGD_OK;
}

/* The backend's own kernel objects (clSetKernelArg is not thread-safe on a
   shared cl_kernel) and the work-group sizes it launches them with. */
static dsgd_result dsgd_cl__make_kernels(dsgd_ctx *ctx, dsgd_cl__backend *b) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(b->cl, b->dev);
    size_t kmax = (size_t)-1, local_mem = (size_t)info->local_mem_bytes;
    cl_int err;
    int k;
    for (k = 0; k < DSGD_CL__K_COUNT; ++k) {
        size_t wg = 0;
        b->kernels[k] = clCreateKernel(dsgd_cl__context_program(b->cl), dsgd_cl__kernel_fn[k], &err);
        if (err != CL_SUCCESS) {
            b->kernels[k] = NULL;
            return dsgd_cl__fail(ctx, err, "clCreateKernel", dsgd_cl__kernel_fn[k]);
        }
        err = clGetKernelWorkGroupInfo(b->kernels[k], b->device, CL_KERNEL_WORK_GROUP_SIZE, sizeof(wg), &wg, NULL);
        if (err != CL_SUCCESS) return dsgd_cl__fail(ctx, err, "clGetKernelWorkGroupInfo", dsgd_cl__kernel_fn[k]);
        if (wg < kmax) kmax = wg;
    }
    /* Work-groups are one-dimensional but for the image and bias_backward
       kernels' (lx, ly), whose lx ly is at most b->local: the device's limits
       (work-group and first dimension; a driver may report a kernel limit
       above them, or POCL_MAX_WORK_GROUP_SIZE lowers them) cap the kernels'
       answers. */
    if (info->max_work_group_size && info->max_work_group_size < kmax) kmax = info->max_work_group_size;
    if (info->max_work_item_sizes[0] && info->max_work_item_sizes[0] < kmax) kmax = info->max_work_item_sizes[0];
    /* One work-group size for every element-wise kernel keeps the number of
       compiled variants (PoCL compiles one per size) small. */
    b->local = kmax < 256 ? kmax : 256;
    if (b->local < 1) b->local = 1;
    /* The image and bias_backward kernels' two-dimensional ranges. */
    b->local_max1 = info->max_work_item_sizes[1] ? info->max_work_item_sizes[1] : 1;
    {
        /* DSGD_CL_IMAGE_INDEX_BITS=64 forces the 64-bit image kernels (for
           the tests: no test buffer is large enough to need them); */
        const char *bits = getenv("DSGD_CL_IMAGE_INDEX_BITS"), *spread = getenv("DSGD_CL_IMAGE_SPREAD");
        b->img32_max = bits && strcmp(bits, "64") == 0 ? 0 : 0x7fffffff;
        /* the same for DSGD_CL_IMAGE_SPREAD=1 or 0, which sets img_spread */
        b->img_spread = spread && *spread ? strcmp(spread, "0") != 0 : info->type != DSGD_CL_DEVICE_CPU;
        /* and DSGD_CL_GEMM_SPLIT_K=1 or 0 for split_k */
        spread = getenv("DSGD_CL_GEMM_SPLIT_K");
        b->split_k = spread && *spread ? strcmp(spread, "0") != 0 : info->type != DSGD_CL_DEVICE_CPU;
    }
    /* Reductions: the largest power of two that fits, at most 256, and whose
       local arrays fit in local memory. */
    b->reduce_local = 1;
    while (b->reduce_local * 2 <= b->local &&
           b->reduce_local * 2 * (2 * b->acc_size + 2 * sizeof(cl_ulong)) <= local_mem)
        b->reduce_local *= 2;
    return DSGD_OK;
}

/* The small buffer of int / ulong results (loss status, norm counts). */
static dsgd_result dsgd_cl__make_status(dsgd_ctx *ctx, dsgd_cl__backend *b) {
    cl_int err;
    b->status = clCreateBuffer(dsgd_cl_context_handle(b->cl), CL_MEM_READ_WRITE, DSGD_CL__STATUS_BYTES, NULL, &err);
    if (err != CL_SUCCESS) {
        b->status = NULL;
        return dsgd_cl__fail(ctx, err, "clCreateBuffer", "status");
    }
    {
        void *host;
        dsgd_result r = dsgd_cl__pinned(b, DSGD_CL__CHECKS_MAX * 4 * sizeof(cl_int), CL_MAP_READ, "loss class checks",
                                        &b->checks_mem, &host);
        b->checks_host = (cl_int *)host;
        return r;
    }
}

/* Every member of dsgd_backend_i, the optional ones included. */
static void dsgd_cl__fill_interface(dsgd_backend_i *out, dsgd_cl__backend *b) {
    out->name = "opencl";
    out->impl = b;
    out->destroy = dsgd_cl__destroy;
    out->buffer_create = dsgd_cl__buffer_create;
    out->buffer_destroy = dsgd_cl__buffer_destroy;
    out->buffer_host_ptr = dsgd_cl__buffer_host_ptr;
    out->write = dsgd_cl__write;
    out->read = dsgd_cl__read;
    out->copy = dsgd_cl__copy;
    out->fill = dsgd_cl__fill;
    out->scale = dsgd_cl__scale;
    out->axpy = dsgd_cl__axpy;
    out->gemm = dsgd_cl__gemm;
    out->bias_act_forward = dsgd_cl__bias_act_forward;
    out->act_backward = dsgd_cl__act_backward;
    out->bias_backward = dsgd_cl__bias_backward;
    out->loss = dsgd_cl__loss;
    out->optimizer_update = dsgd_cl__optimizer_update;
    out->norm_check = dsgd_cl__norm_check;
    out->finish = dsgd_cl__finish;
    out->map = dsgd_cl__map_rw;
    out->unmap = dsgd_cl__unmap_rw;
    out->host_shared = dsgd_cl__host_shared;
    out->can_access = dsgd_cl__can_access;
    out->sum_across = dsgd_cl__sum_across;
    out->im2col = dsgd_cl__im2col;
    out->col2im = dsgd_cl__col2im;
    out->maxpool_forward = dsgd_cl__maxpool_forward;
    out->maxpool_backward = dsgd_cl__maxpool_backward;
    out->device_name = dsgd_cl__device_name;
    out->mark = dsgd_cl__mark;
    out->wait_marks = dsgd_cl__wait_marks;
    out->release_mark = dsgd_cl__release_mark;
    out->nonfinite_flag = dsgd_cl__nonfinite_flag;
    out->read_marked = dsgd_cl__read_marked;
    out->wait_mark = dsgd_cl__wait_mark;
}

DSGD_API dsgd_result dsgd_cl_backend_create(dsgd_ctx *ctx, dsgd_cl_context *c, const dsgd_cl_backend_desc *desc,
                                            dsgd_backend_i *out) {
    dsgd_cl_backend_desc d;
    dsgd_cl__backend *b;
    dsgd_result r;
    if (!out || !c)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_backend_create: %s is NULL",
                                  out ? "the context" : "out");
    memset(out, 0, sizeof(*out));
    memset(&d, 0, sizeof(d));
    if (desc) d = *desc;
    if (d.device < 0 || d.device >= dsgd_cl_context_num_devices(c))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_backend_create: device %d outside the context's 0..%d (use replica %% "
                                  "dsgd_cl_context_num_devices())",
                                  d.device, dsgd_cl_context_num_devices(c) - 1);
    b = (dsgd_cl__backend *)DSGD_MALLOC(sizeof(*b));
    if (!b) return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_backend_create");
    memset(b, 0, sizeof(*b));
    b->ctx = ctx;
    b->cl = c;
    b->dev = d.device;
    b->device = dsgd_cl_context_device(c, d.device);
    b->acc_size = dsgd_cl_context_fp64(c) ? sizeof(cl_double) : sizeof(cl_float);
    snprintf(b->label, sizeof(b->label), "%s (device %d of its context)",
             dsgd_cl_context_device_info(c, d.device)->device_name, d.device);
    if (d.host_visible > 0 || (d.host_visible == 0 && dsgd_cl_context_device_info(c, d.device)->unified_memory))
        b->alloc_flags = CL_MEM_ALLOC_HOST_PTR;
    r = dsgd_cl__open_queue(ctx, b, d.profiling);
    if (r == DSGD_OK) r = dsgd_cl__make_kernels(ctx, b);
    if (r == DSGD_OK) r = dsgd_cl__make_status(ctx, b);
    if (r != DSGD_OK) {
        dsgd_cl__destroy(b);
        return r;
    }
    dsgd_cl__fill_interface(out, b);
    return DSGD_OK;
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

DSGD_API dsgd_result dsgd_cl_map(const dsgd_backend_i *be, dsgd_ref ref, size_t count, int flags, float **out) {
    if (out) *out = NULL;
    if (!dsgd_cl_is_backend(be) || !out)
        return DSGD_ERR_INVALID_ARGUMENT; /* no context to record on */
    return dsgd_cl__map_impl((dsgd_cl__backend *)be->impl, ref, count, flags, out);
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

DSGD_API dsgd_result dsgd_cl_unmap(const dsgd_backend_i *be, dsgd_ref ref, float *ptr) {
    if (!dsgd_cl_is_backend(be)) return DSGD_ERR_INVALID_ARGUMENT;
    return dsgd_cl__unmap_impl((dsgd_cl__backend *)be->impl, ref, ptr);
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

#endif /* DSGD_CL__PART_BACKEND_IMPL */
