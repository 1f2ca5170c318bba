/* distsgd/backend.h - the compute interface, dsgd_backend_i
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   BACKENDS

     A backend is a dsgd_backend_i: a table of compute operations on device
     buffers plus an implementation pointer. Models never touch memory
     directly, so the OpenCL backend (distsgd_cl.h) plugs in unchanged. The CPU
     reference backend, dsgd_cpu_backend_create(), is the one every other
     backend is tested against. Optional members may be NULL: destroy,
     buffer_host_ptr, finish, and those the strategies use to move gradients:
     map/unmap (a host view of a range, zero-copy where the device shares the
     host's memory), host_shared (whether it does), can_access/sum_across (a
     sum computed on the device over other backends' buffers),
     device_name (the device a backend computes on, for messages) and
     mark/wait_marks/release_mark (one backend's queue waiting for
     another's on the device, for the DEVICE path below). Four more
     are optional until a model has convolution or pooling layers: im2col and
     col2im (a convolution as a GEMM and its gradient) and maxpool_forward /
     maxpool_backward, over NHWC images shaped by a dsgd_window (IMAGES below).
     Both backends here set them, with the same bits (they only copy, compare
     and add in a fixed order).

     A synchronous step sums the replicas' gradients along one of two paths,
     chosen by dsgd_strategy_desc.gradient_path and reported by
     dsgd_strategy_gradient_path():
       HOST    each replica exposes its gradient buffer to the host through
               buffer_host_ptr (the CPU backend), else map (zero-copy on CPUs
               and integrated GPUs, PoCL included), else a read into a staging
               copy that is written back afterwards; then dsgd_allreduce over
               the transport, with the strategy's algorithm and buckets.
       DEVICE  between two barriers, replica r sums block r (dsgd_block_range)
               of every replica's gradient buffer in rank order with its
               backend's sum_across and writes the sum into all of them; the
               gradients never reach the host. Every backend must reach every
               other's buffers (can_access: OpenCL backends of one
               dsgd_cl_context on one device; replicas on two devices, whose
               runtimes may keep a copy of a buffer per device and move it
               whole to the device that touches it next, take HOST).
               The barriers order the host threads; the devices' queues are
               ordered by marks where every backend has them (each replica
               marks its gradient done, and its sum waits for every
               replica's mark; its update waits for every replica's sum),
               so the host never waits for a device there; otherwise each
               replica finishes its queue before each barrier.
     AUTO, the default, picks DEVICE only when it is possible and some
     backend's buffers are not host-shared (a discrete GPU, where the HOST path
     would copy the gradient to the host and back every step). Where mapping
     copies nothing the host's all-reduce is as fast, so AUTO stays on HOST
     (measured on PoCL). DEVICE adds in the order of the HOST path's
     DSGD_ALLREDUCE_DIRECT, and the two give the same bits.

   IMAGES

     Images are NHWC, row-major: a batch x(n, h, w, c) holds x[i, y, x, ch]
     at ((i h + y) w + x) c + ch. A dsgd_window gives the input's shape and
     a window (kernel) sliding over it with a stride and zero padding; its
     output is (n, oh, ow) positions, oh = (h + 2 pad - kh) / stride + 1 and
     ow = (w + 2 pad - kw) / stride + 1 (rounded down). A convolution with
     oc output channels is then
         col = im2col(x)                     (n oh ow, kh kw c)
         y   = col W + bias                  W (kh kw c, oc): gemm, then
                                             bias_act_forward with m = n oh ow
     and y (n oh ow, oc) is already the NHWC image (n, oh, ow, oc), so a
     following layer (or a flatten, which is then nothing) reads it as is.
     Its gradient: dW = col^T dy and db = bias_backward(dy) (gemm, bias
     backward), dx = col2im(dy W^T). A backend may also offer conv_gemm and
     conv_backward_x, the same products with the same bits without col
     being built (the CPU backend does). The operations check their shapes and
     ranges: a dimension <= 0, stride < 1, pad < 0, a window larger than the
     padded input, pad != 0 for max-pool, sizes that overflow (a count past
     SIZE_MAX, a padded side past INT_MAX), ranges past a buffer's end and
     an output that overlaps an input are DSGD_ERR_INVALID_ARGUMENT,
     recorded with a message, with nothing written.

   CPU KERNELS

     The CPU backend runs its GEMM micro-kernel and its hot element-wise
     loops (scale, axpy, bias and activation, their backward, the optimizer
     update, the finiteness check, max-pool's gradient where windows do not
     overlap) from one set of kernels chosen when the
     backend is created, so that a generic build (plain -O2 on x86-64, as the
     examples and tests build) still uses the widest vectors the machine has.
     On x86-64 with GCC or Clang: "avx512" (AVX-512F, 16 floats wide, 12 x 32
     GEMM tiles) when the CPU has it, else "avx2" (AVX2 and FMA, 8 wide,
     6 x 16), else "portable"; elsewhere (aarch64, other compilers) only
     "portable", the compiler's own vectors (4 wide, or 8 when built with
     -mavx; no FMA). dsgd_cpu_isa() and dsgd_cpu_backend_isa() say which. The
     environment variable DSGD_CPU_ISA=portable|avx2|avx512, read at backend
     creation, asks for one (for tests and benchmarks); a kernel the CPU
     lacks, or an unknown name, gives the widest one it has. Defining
     DSGD_CPU_NO_DISPATCH where the implementation is compiled leaves only
     the portable kernels (what other architectures get).
     Results are bitwise reproducible for a given kernel. The GEMM sums every
     entry of C in one order, fixed by its KC blocking and not by the tile
     size or by which of its paths (blocked, or thin for a narrow C) runs:
     so the two FMA kernels agree bit for bit with each other, and the
     portable kernel at any width with any other build of it, but FMA and
     non-FMA kernels may differ in the last bits (one rounding per
     multiply-add instead of two). The element-wise loops give the same bits
     with every kernel. With DSGD_USE_CBLAS, cblas_sgemm does the GEMM (in
     its own order); the element-wise kernels are still chosen.
     The element-wise kernels read and write their arrays as non-overlapping
     (C restrict): the CPU backend refuses ranges of one operation that
     overlap (DSGD_ERR_INVALID_ARGUMENT), except y and x of axpy being the
     same range.

   CPU THREADS

     A CPU backend may split each operation across a pool of threads of its
     own (dsgd_cpu_backend_desc.threads; the strategies give each replica
     online cores / replicas of them, see dsgd_strategy_desc.cpu_threads).
     The GEMM packs each panel of B once, the threads together, then each
     thread computes its block of C's rows (whole tiles) from it; a C
     narrower than one tile is cut into independent blocks instead, and a
     thin one (the avx2 and avx512 kernels: at most 32 columns, B not
     transposed, and k at most 16 or m at most 256, as convolutions make
     them) into whole tiles of rows, each thread over every block of k
     with B read where it lies, unpacked, and no barrier; a thin C one tile
     high into blocks of k, whose sums the caller then adds to C in order.
     Every entry of C is summed as one thread sums it (block of k by block
     of k, in order). The element-wise operations (write, read, fill, scale, axpy,
     bias and activation, their backward, the optimizer update, the
     finiteness check) cut their elements (bias_backward its columns, each
     summed in its blocked order by one thread); im2col
     and maxpool_forward cut their output rows, col2im and maxpool_backward
     the rows of dx (each row gathers its own sums, in the documented order,
     whatever the cut); conv_gemm cuts as the GEMM does, and
     conv_backward_x the rows of dx in whole tiles or whole images. No operation
     sums across a cut, so every thread count gives the same bits. Small operations (GEMMs
     under 2^17 multiply-adds, element-wise and image ones under 32768 floats), the
     loss, the norm with its sum of squares and copy (a memmove) run on the
     calling thread alone. Between operations the helpers spin for up to 200 us,
     then sleep; a backend with one thread starts none. With
     DSGD_USE_CBLAS the GEMM is cblas_sgemm's, threaded as that library is
     (OPENBLAS_NUM_THREADS), and only the element-wise operations use the
     pool.
*/
#ifndef DSGD__PART_BACKEND_DECL
#define DSGD__PART_BACKEND_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- backend */

typedef enum dsgd_activation {
    DSGD_ACT_NONE = 0,
    DSGD_ACT_RELU,
    DSGD_ACT_TANH,
    DSGD_ACT_SIGMOID
} dsgd_activation;

typedef enum dsgd_loss {
    DSGD_LOSS_SOFTMAX_XENT = 0, /* targets: one class index per sample (as float) */
    DSGD_LOSS_MSE               /* targets: one value per output */
} dsgd_loss;

typedef enum dsgd_optimizer_kind {
    DSGD_OPT_SGD = 0,
    DSGD_OPT_MOMENTUM,
    DSGD_OPT_ADAM,
    DSGD_OPT_ADAMW
} dsgd_optimizer_kind;
/* The number of values of each enum: a macro, not an enumerator, so that a
   switch over the enum in your code stays complete. */
#define DSGD_OPT_COUNT (DSGD_OPT_ADAMW + 1)

/* A backend-defined device buffer of floats. */
typedef struct dsgd_buffer dsgd_buffer;

/* A position in a device buffer: buf plus an offset counted in floats. */
typedef struct dsgd_ref {
    dsgd_buffer *buf;
    size_t off;
} dsgd_ref;

/* The scalars of one optimizer update, computed on the host each step. */
typedef struct dsgd_opt_update {
    dsgd_optimizer_kind kind;
    float lr;            /* learning rate of this step (schedule applied) */
    float momentum;      /* MOMENTUM: mu */
    int nesterov;        /* MOMENTUM: Nesterov's variant when non-zero */
    float beta1, beta2;  /* ADAM, ADAMW */
    float eps;           /* ADAM, ADAMW */
    float weight_decay;  /* SGD, MOMENTUM, ADAM: L2 added to the gradient;
                            ADAMW: decoupled, p -= lr * wd * p */
    float bias_correction1; /* ADAM, ADAMW: 1 - beta1^t */
    float bias_correction2; /* ADAM, ADAMW: 1 - beta2^t */
    float grad_scale;    /* every gradient is multiplied by this first (clipping) */
    dsgd_ref gate;       /* buf set: the update is made only where gate[0] is 0
                            (a step's non-finite flag, kept on the device:
                            nonfinite_flag); else nothing changes */
} dsgd_opt_update;

/* The shape of a window sliding over a batch of NHWC images (IMAGES above):
   the input x(n, h, w, c), the window kh x kw, its stride and the zero
   padding on every side. The output has oh x ow positions per image:
   oh = (h + 2 pad - kh) / stride + 1, ow = (w + 2 pad - kw) / stride + 1
   (rounded down), both >= 1. */
typedef struct dsgd_window {
    int n, h, w, c; /* batch, input height, width, channels: all >= 1 */
    int kh, kw;     /* window (kernel) height and width: >= 1 */
    int stride;     /* >= 1, both directions */
    int pad;        /* >= 0 zero padding on every side (max-pool: 0) */
} dsgd_window;

/* A compute backend. Row-major everywhere. All members but the optional
   ones must be set (dsgd_model_create checks). Each operation returns DSGD_OK
   or an error recorded on the context the backend was created with. An
   operation may be queued rather than done (write too: its src is free
   again when it returns); `read` and `finish` complete all queued work, and
   an error found late (the OpenCL loss's class check) may be reported by a
   later call that waits. A backend is used by one thread at a time, its
   context's. */
typedef struct dsgd_backend_i {
    const char *name;
    void *impl;
    void (*destroy)(void *impl); /* optional */

    dsgd_result (*buffer_create)(void *impl, size_t count, dsgd_buffer **out);
    void (*buffer_destroy)(void *impl, dsgd_buffer *buf);
    /* optional: host pointer to the buffer's floats when the host can address
       them directly (the CPU backend); NULL otherwise. */
    float *(*buffer_host_ptr)(void *impl, dsgd_buffer *buf);

    dsgd_result (*write)(void *impl, dsgd_ref dst, const float *src, size_t count);
    dsgd_result (*read)(void *impl, dsgd_ref src, float *dst, size_t count);
    dsgd_result (*copy)(void *impl, dsgd_ref dst, dsgd_ref src, size_t count);
    dsgd_result (*fill)(void *impl, dsgd_ref dst, float value, size_t count);
    /* x *= alpha */
    dsgd_result (*scale)(void *impl, dsgd_ref x, float alpha, size_t n);
    /* y += alpha * x */
    dsgd_result (*axpy)(void *impl, dsgd_ref y, float alpha, dsgd_ref x, size_t n);

    /* C(m,n) = alpha * op(A)(m,k) * op(B)(k,n) + beta * C; op transposes when
       trans_* is non-zero; ld* are the row strides of the matrices as stored.
       beta == 0 overwrites C (NaN in C does not propagate). */
    dsgd_result (*gemm)(void *impl, int trans_a, int trans_b, int m, int n, int k,
                        float alpha, dsgd_ref a, int lda, dsgd_ref b, int ldb,
                        float beta, dsgd_ref c, int ldc);
    /* y(m,n) = act(y + bias) in place; bias(n) may have buf NULL (no bias). */
    dsgd_result (*bias_act_forward)(void *impl, dsgd_activation act, dsgd_ref y,
                                    dsgd_ref bias, int m, int n);
    /* dy(n) *= act'(.) in place, the derivative written in terms of the
       activation's output y(n): relu y>0, tanh 1-y^2, sigmoid y(1-y). */
    dsgd_result (*act_backward)(void *impl, dsgd_activation act, dsgd_ref dy,
                                dsgd_ref y, size_t n);
    /* db(n) = sum over rows of dy(m,n), in a fixed blocked order: the rows
       in blocks of 128 (the last one shorter), each block's column sum from
       0.0f in row order, then the block sums from 0.0f in block order (the
       CPU and OpenCL backends both; for m <= 128 the rows in order). */
    dsgd_result (*bias_backward)(void *impl, dsgd_ref db, dsgd_ref dy, int m, int n);
    /* Loss of pred(m,c) against target (m for SOFTMAX_XENT, (m,c) for MSE).
       stats[0] += sum of per-sample losses, stats[1] += correct predictions
       (argmax == class; for MSE argmax(pred) == argmax(target)).
       If dpred.buf is non-NULL: dpred(m,c) = grad_scale * d(sum of losses)/d pred.
       SOFTMAX_XENT per-sample loss: -log softmax(pred)[class].
       MSE per-sample loss: (1/c) * sum_j (pred_j - target_j)^2.
       A class index that is not an integer in [0, c) is
       DSGD_ERR_INVALID_ARGUMENT. */
    dsgd_result (*loss)(void *impl, dsgd_loss loss, int m, int c, dsgd_ref pred,
                        dsgd_ref target, float grad_scale, dsgd_ref dpred,
                        dsgd_ref stats);
    /* One optimizer update of n parameters (see dsgd_opt_update); m1, m2 are
       the optimizer's state (momentum; Adam's first and second moments) and
       may have buf NULL when the kind needs none. */
    dsgd_result (*optimizer_update)(void *impl, const dsgd_opt_update *u,
                                    dsgd_ref param, dsgd_ref grad, dsgd_ref m1,
                                    dsgd_ref m2, size_t n);
    /* *sumsq = sum of x^2 over the finite entries (double), *nonfinite = number
       of NaN and infinite entries. Either pointer may be NULL; with sumsq NULL
       a backend may take a faster path that only counts non-finite values. */
    dsgd_result (*norm_check)(void *impl, dsgd_ref x, size_t n, double *sumsq,
                              size_t *nonfinite);
    /* optional: wait until all queued operations are done. */
    dsgd_result (*finish)(void *impl);

    /* optional, both or neither: a host pointer to count floats at ref that
       the host may read and write until unmap (after queued work is done);
       zero-copy where the device shares memory with the host. No other
       operation may use the range while it is mapped. On the HOST gradient
       path the strategies all-reduce gradients in place through it (when
       buffer_host_ptr gives nothing) rather than through a read/write
       staging copy. */
    dsgd_result (*map)(void *impl, dsgd_ref ref, size_t count, float **out);
    dsgd_result (*unmap)(void *impl, dsgd_ref ref, float *ptr);
    /* optional: 1 when the buffers live in memory the host shares (map copies
       nothing: CPUs, integrated GPUs), 0 when they are the device's own
       (discrete GPUs: a host path costs two transfers per step). NULL: 0.
       Only DSGD_GRADIENTS_AUTO asks. */
    int (*host_shared)(void *impl);
    /* optional, both or neither: device-side reduction across replicas.
       can_access(impl, other) is 1 when this backend's operations can read
       and write the buffers of backend `other` directly while `other` writes
       other parts of them (OpenCL backends of one context on one device), 0
       otherwise: two devices writing disjoint blocks of one buffer may
       overwrite each other's where the runtime migrates the buffer whole.
       sum_across sets, for every e in [lo, hi),
       x[j][e] = x[0][e] + x[1][e] + ... + x[n-1][e] (summed in that order)
       for every j, where x[j] is the range starting at refs[j]; every refs[j]
       must be on a backend this one can access, and no two may overlap. It
       only enqueues: the caller orders it against the other backends'
       work (finish, then a barrier). The DEVICE gradient path uses them. */
    int (*can_access)(void *impl, const struct dsgd_backend_i *other);
    dsgd_result (*sum_across)(void *impl, const dsgd_ref *refs, int n, size_t lo, size_t hi);

    /* optional, all four or none (a model needs them only for convolution
       and pooling layers); see IMAGES above for the layout and the checks.
       Each gives the same bits on every backend: it copies, compares, and
       adds in the order said, from 0.0f. No output may overlap an input.

       im2col: col(n*oh*ow, kh*kw*c) is overwritten; row (i, oy, ox), column
       (ky, kx, ch) (row-major: ch fastest) holds
       x[i, oy*stride - pad + ky, ox*stride - pad + kx, ch], or 0 where that
       lies outside the image (in the padding). */
    dsgd_result (*im2col)(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref col);
    /* col2im, im2col's adjoint: dx(n, h, w, c) is overwritten; each element
       is the sum, starting from 0.0f and in (ky, kx) ascending order, of the
       col entries im2col would have copied from it (0.0f when none). A gather:
       no atomics, the same bits on every backend. */
    dsgd_result (*col2im)(void *impl, const dsgd_window *wd, dsgd_ref col, dsgd_ref dx);
    /* Max-pool: y(n, oh, ow, c) is overwritten with the maximum of each
       window, channel by channel: its first maximum in row-major (ky, kx)
       order (of -0 and +0, whichever comes first), NaN-propagating (a NaN
       in the window gives the window's first NaN). wd->pad must be 0. */
    dsgd_result (*maxpool_forward)(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y);
    /* Max-pool's gradient: dx(n, h, w, c) is overwritten. Each window's
       dy(i, oy, ox, ch) goes to the window's first element in row-major
       (ky, kx) order that equals y(i, oy, ox, ch) (for a NaN y: the first
       NaN; nowhere when none does, which a y from maxpool_forward rules
       out); every other element gets 0. Where windows overlap (stride < kh
       or kw) an element is the sum, from 0.0f, of the dy of every window
       that chose it, windows in (oy, ox) ascending order. x and y are those
       of maxpool_forward; the inputs may overlap each other, dx none of
       them. */
    dsgd_result (*maxpool_backward)(void *impl, const dsgd_window *wd, dsgd_ref x, dsgd_ref y,
                                    dsgd_ref dy, dsgd_ref dx);

    /* optional: the device this backend computes on, for messages (the
       OpenCL backend: its device's name and index in its context); a string
       that lives as long as the backend. NULL: `name` stands for it. */
    const char *(*device_name)(void *impl);

    /* optional, all three or none: ordering between backends of one device
       without the host waiting (the DEVICE gradient path uses them in place
       of finish). mark enqueues a marker on this backend's queue and gives a
       handle to it; wait_marks makes every operation this backend enqueues
       afterwards wait, on the device, until the n marks' earlier operations
       are done (the marks may be other backends' of the same device);
       release_mark drops a handle once no wait_marks that names it is still
       to be called. The OpenCL backend: clEnqueueMarkerWithWaitList,
       clEnqueueBarrierWithWaitList, clReleaseEvent. */
    dsgd_result (*mark)(void *impl, void **out);
    dsgd_result (*wait_marks)(void *impl, void *const *marks, int n);
    void (*release_mark)(void *impl, void *mark);

    /* optional, all three or none (and the three above): a step's
       non-finite verdict kept on the device, so that a step need not wait
       for it (THE VERDICT ON THE DEVICE in strategy.h). nonfinite_flag
       enqueues flag[0] = 1.0f when x(n) holds a NaN or an infinity, else
       0.0f; read_marked enqueues a read of count floats into dst (which
       must stay valid until then) and gives a mark that is done when dst
       holds them; wait_mark makes the host wait for a mark (at once when it
       is done; the mark is still released with release_mark). */
    dsgd_result (*nonfinite_flag)(void *impl, dsgd_ref x, size_t n, dsgd_ref flag);
    dsgd_result (*read_marked)(void *impl, dsgd_ref src, float *dst, size_t count, void **mark);
    dsgd_result (*wait_mark)(void *impl, void *mark);

    /* optional (NULL: a model runs im2col into a buffer of its own, then
       gemm): a GEMM whose A is im2col(x) without it being built,
         ta 0: C (n oh ow, n_) = beta C + alpha col (n oh ow, kh kw c) B (kh kw c, n_)
         ta 1: C (kh kw c, n_) = beta C + alpha col^T (kh kw c, n oh ow) B (n oh ow, n_)
       with col = im2col(wd, x); B not transposed, rows ldb apart. The bits
       are those of im2col followed by gemm(ta, 0, ...) on this backend (a
       convolution's forward product and its weight gradient, see IMAGES).
       The checks are those of im2col and gemm; C may not overlap x or B. */
    dsgd_result (*conv_gemm)(void *impl, const dsgd_window *wd, int ta, int n_, float alpha, dsgd_ref x,
                             dsgd_ref b, int ldb, float beta, dsgd_ref c, int ldc);
    /* optional (NULL: a model runs gemm into a buffer, then col2im): a
       convolution's input gradient dx = col2im(dy W^T) without the columns
       being built: dy (n oh ow, f), W (kh kw c, f), dx (n, h, w, c)
       overwritten. The bits are those of gemm(0, 1, n oh ow, kh kw c, f,
       1.0f, dy, f, W, f, 0.0f, col, kh kw c) then col2im(col, dx) on this
       backend. The checks are those of col2im and gemm; dx may not overlap
       dy or W. */
    dsgd_result (*conv_backward_x)(void *impl, const dsgd_window *wd, int f, dsgd_ref dy, dsgd_ref w, dsgd_ref dx);
} dsgd_backend_i;

/* Creates the backend of replica (or worker) `replica` in *out, recording
   errors on ctx (that replica's context, which outlives the backend). Called
   by dsgd_strategy_create and dsgd_cluster_create on their thread, for
   replicas 0..N-1 in order; they destroy each backend with its destroy
   member. A result other than DSGD_OK makes the creation fail with it. */
typedef dsgd_result (*dsgd_backend_factory)(void *user_data, dsgd_ctx *ctx, int replica,
                                            dsgd_backend_i *out);

/* Fills *out with the CPU reference backend. Its operations record errors on
   ctx, which must outlive the backend; destroy with out->destroy(out->impl).
   Its buffers are host memory (buffer_host_ptr is set) and every operation
   is done when it returns, so finish, map, unmap, host_shared, can_access
   and sum_across are NULL (a strategy on it takes the HOST gradient path);
   im2col, col2im, maxpool_forward and maxpool_backward are set, and
   conv_gemm unless built with DSGD_USE_CBLAS, and conv_backward_x too
   unless the kernels are the portable ones.
   Errors: DSGD_ERR_INVALID_ARGUMENT (out NULL), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread; the backend is then used by one
   thread at a time. */
DSGD_API dsgd_result dsgd_cpu_backend_create(dsgd_ctx *ctx, dsgd_backend_i *out);

/* The most threads a CPU backend takes. */
#define DSGD_CPU_MAX_THREADS 256

/* Options of dsgd_cpu_backend_create_desc; zero means the default. */
typedef struct dsgd_cpu_backend_desc {
    int threads; /* threads each operation may use, the caller's included
                    (CPU THREADS above): 0 or 1, the caller's alone (no
                    pool); n in 2..DSGD_CPU_MAX_THREADS, n - 1 helper
                    threads started here and joined by destroy */
} dsgd_cpu_backend_desc;

/* dsgd_cpu_backend_create with options: desc NULL or all zero is
   dsgd_cpu_backend_create. The results do not depend on desc->threads.
   Errors: DSGD_ERR_INVALID_ARGUMENT (out NULL; threads < 0 or >
   DSGD_CPU_MAX_THREADS), DSGD_ERR_OUT_OF_MEMORY, DSGD_ERR_SYSTEM (a helper
   thread or its lock could not be created; none is left running).
   Thread safety: the context's thread; the backend is then used by one
   thread at a time, whose calls its helpers join. */
DSGD_API dsgd_result dsgd_cpu_backend_create_desc(dsgd_ctx *ctx, const dsgd_cpu_backend_desc *desc,
                                                  dsgd_backend_i *out);

/* dsgd_cpu_backend_threads: the threads of the CPU backend `be`, the
   caller's included (1 without a pool), or 0 when be is NULL or not a CPU
   backend. dsgd_cpu_count: the online processors (sysconf), at least 1
   and at most DSGD_CPU_MAX_THREADS.
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cpu_backend_threads(const dsgd_backend_i *be);
DSGD_API int dsgd_cpu_count(void);

/* Returns the name of the kernels (GEMM micro-kernel and element-wise
   loops) a CPU backend created now would use, see CPU KERNELS above:
   "avx512", "avx2" or "portable". It honours DSGD_CPU_ISA.
   Errors: none; a DSGD_CPU_ISA the CPU lacks or that is not a kernel's name
   gives the widest kernel the CPU has.
   Thread safety: any thread (it reads the environment, so not while another
   thread calls setenv). */
DSGD_API const char *dsgd_cpu_isa(void);

/* Returns the name of the kernels the CPU backend `be` uses (fixed when it
   was created), or NULL when be is NULL or not a CPU backend.
   Errors: none (NULL as said).
   Thread safety: any thread; the name is a static string. */
DSGD_API const char *dsgd_cpu_backend_isa(const dsgd_backend_i *be);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_BACKEND_DECL */

#if (defined(DISTSGD_IMPLEMENTATION) || defined(DISTSGD_CL_IMPLEMENTATION)) && !defined(DSGD__PART_BACKEND_IMPL)
#define DSGD__PART_BACKEND_IMPL

/* >>windows ---------------------------------------------------------------- */
/* The checks every backend's image operations share (IMAGES above). */

/* A checked window's derived sizes, in elements. */
typedef struct dsgd__window_dims {
    int oh, ow;      /* output positions per image */
    size_t x;        /* n h w c: x, dx */
    size_t rows;     /* n oh ow: col's rows */
    size_t k;        /* kh kw c: col's columns */
    size_t col;      /* rows k */
    size_t y;        /* rows c: the pooled y, dy */
} dsgd__window_dims;

/* Checks *wd (pool: max-pool, so pad must be 0) and fills *d; records
   "<who> <op>: <why>" on ctx as DSGD_ERR_INVALID_ARGUMENT otherwise. Every
   size, the padded input and oh, ow are computed without overflow: each
   count must fit in size_t, the padded height and width in int (so every
   position the kernels compute does). */
DSGD__PRIVATE dsgd_result dsgd__window_check(dsgd_ctx *ctx, const char *who, const char *op,
                                             const dsgd_window *wd, int pool, dsgd__window_dims *d) {
    long long ph, pw, oh, ow;
    size_t t;
    memset(d, 0, sizeof(*d));
    if (!wd) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s %s: the window is NULL", who, op);
    if (wd->n <= 0 || wd->h <= 0 || wd->w <= 0 || wd->c <= 0 || wd->kh <= 0 || wd->kw <= 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s %s: n=%d h=%d w=%d c=%d kh=%d kw=%d: every size must be >= 1", who, op, wd->n,
                                  wd->h, wd->w, wd->c, wd->kh, wd->kw);
    if (wd->stride < 1 || wd->pad < 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s %s: stride=%d pad=%d (stride >= 1, pad >= 0)",
                                  who, op, wd->stride, wd->pad);
    if (pool && wd->pad != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s %s: pad=%d (max-pool takes no padding)", who,
                                  op, wd->pad);
    ph = (long long)wd->h + 2LL * wd->pad;
    pw = (long long)wd->w + 2LL * wd->pad;
    if (ph > INT_MAX || pw > INT_MAX) /* positions in the padded input are ints */
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s %s: the padded input %lldx%lld is larger than INT_MAX", who, op, ph, pw);
    if (wd->kh > ph || wd->kw > pw)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s %s: a %dx%d window is larger than the padded %lldx%lld input", who, op, wd->kh,
                                  wd->kw, ph, pw);
    oh = (ph - wd->kh) / wd->stride + 1;
    ow = (pw - wd->kw) / wd->stride + 1;
    if (oh > INT_MAX || ow > INT_MAX ||
        dsgd__mul_overflows((size_t)wd->n, (size_t)wd->h, &t) || dsgd__mul_overflows(t, (size_t)wd->w, &t) ||
        dsgd__mul_overflows(t, (size_t)wd->c, &d->x) || dsgd__mul_overflows((size_t)wd->n, (size_t)oh, &t) ||
        dsgd__mul_overflows(t, (size_t)ow, &d->rows) || dsgd__mul_overflows((size_t)wd->kh, (size_t)wd->kw, &t) ||
        dsgd__mul_overflows(t, (size_t)wd->c, &d->k) || dsgd__mul_overflows(d->rows, d->k, &d->col) ||
        dsgd__mul_overflows(d->rows, (size_t)wd->c, &d->y))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "%s %s: n=%d h=%d w=%d c=%d kh=%d kw=%d stride=%d pad=%d: the sizes overflow", who, op,
                                  wd->n, wd->h, wd->w, wd->c, wd->kh, wd->kw, wd->stride, wd->pad);
    d->oh = (int)oh;
    d->ow = (int)ow;
    return DSGD_OK;
}

#endif /* DSGD__PART_BACKEND_IMPL */
