/* distsgd/cl/context.h - devices, the shared context, queues, our kernels, GEMM parameters and their cache
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   DEVICES

     dsgd_cl_list_devices() lists every device of every platform, numbered in
     that order (platform 0's devices first). A context opens devices of one
     platform, chosen by a spec string (dsgd_cl_context_desc.device, or the
     environment when that is NULL):

         ""  or "default"    the first GPU, else the first device of any type
         "gpu" "cpu" "accelerator" "all"
                             the first device of that type
         "N"                 device N of the list (a number)
         "P:D"               device D of platform P
         "P:gpu", "P:cpu"... the first device of that type on platform P

     Environment (read only when desc.device is NULL):
         DSGD_CL_DEVICE        a spec as above
         DSGD_CL_PLATFORM      a platform index, when the spec names none
         DSGD_CL_DEVICE_TYPE   gpu|cpu|accelerator|all, when the spec names no
                               type and no index

     Several devices: desc.max_devices > 1 opens up to that many devices of
     the chosen platform (of the chosen device's type) in one cl_context. A
     backend runs on one of them (dsgd_cl_backend_desc.device); a strategy's
     backend_factory usually places replica r on device
     r % dsgd_cl_context_num_devices(). Any
     number of backends may share a context and a device (see QUEUES).

   QUEUES

     dsgd_cl_context_desc.queues says which in-order command queue a backend
     enqueues on. PER_BACKEND: each backend creates its own, so replicas on
     one device overlap their kernels. PER_DEVICE: the backends on one device
     share one queue that the context owns, so their commands run one at a
     time, in the order the threads enqueue them (each backend's own commands
     stay in its program order; finish waits for all of them). AUTO, the
     default, is PER_BACKEND except on PoCL: PoCL 3.1 aborts with
     "pocl_release_dlhandle_cache: Assertion `found->ref_count > 0' failed"
     when one kernel runs at different grid sizes from several queues at once
     (2 of 12 runs of the 4-replica demo died so, 0 of 36 with one queue), and
     its kernels already spread over all of its threads, so one queue costs
     little there. A backend created with profiling gets a queue of its own
     whatever the policy. dsgd_cl_context_queues() tells the policy in force.

   ERRORS

     Every OpenCL and CLBlast failure becomes a dsgd_result recorded on the
     backend's (or the call's) dsgd_ctx with a message that names the call and
     the error, e.g. "clEnqueueNDRangeKernel(bias_act_forward):
     CL_OUT_OF_RESOURCES (-5)". CL_MEM_OBJECT_ALLOCATION_FAILURE,
     CL_OUT_OF_HOST_MEMORY and CL_INVALID_BUFFER_SIZE (a buffer larger than
     the device allows) are DSGD_ERR_OUT_OF_MEMORY, everything else
     DSGD_ERR_BACKEND. A kernel build failure's message carries the build log
     (the full log is also logged at DSGD_LOG_ERROR). No platform or no
     matching device is DSGD_ERR_BACKEND with a message saying which and how
     to get one. Bad arguments (ranges outside a buffer, a buffer of another
     context or backend, bad sizes) are DSGD_ERR_INVALID_ARGUMENT, as on the
     CPU backend. dsgd_cl_map and dsgd_cl_unmap given a non-OpenCL backend,
     and dsgd_cl_tune_cache_path, have no context and return the code alone.

   GEMM TUNING

     CLBlast's stock GEMM parameters are tuned for known GPUs; on other devices
     (PoCL on a CPU above all) they can be several times slower than good ones.
     distsgd's GEMM tuner, cl_tune (`make tune`), searches CLBlast's Xgemm
     parameters (register-tiled candidates made for the device's float
     vector width, dsgd_cl_device_info.vector_width, among them) and the
     size below which CLBlast's single-kernel "direct" GEMM is used
     (XGEMM_MIN_INDIRECT_SIZE), at the shapes a model uses, within a time
     bound. It times candidates on back-to-back GEMMs with one finish per
     sample, as in a training step, checks every candidate's results, and
     writes the winner (dsgd_cl_save_gemm_params) to a per-device cache
     file:

         $DSGD_CL_TUNE_CACHE            a file, or a directory (ends with '/'
                                        or exists as one)
         else $XDG_CACHE_HOME/distsgd/  else ~/.cache/distsgd/
         file: clblast-gemm-<device>-<hash of platform, device, driver>.txt

     dsgd_cl_context_desc.tune_cache overrides the environment. At context
     creation each device's file is read and applied with
     CLBlastOverrideParameters. A file that is missing, unreadable, corrupt or
     made for another device (platform name, device name and driver version are
     compared) leaves CLBlast's defaults in place and logs a DSGD_LOG_WARN
     message saying why; desc.tuning = DSGD_CL_TUNING_OFF skips the file
     (no warning). Overrides are process-wide per device (CLBlast keeps them
     in a global table and has no call to undo them), so once a context has
     applied tuned parameters, later contexts on that device in the same
     process use them too.

   COLD START (PoCL)

     CLBlast compiles its GEMM kernels on the first call with a given set of
     parameters: about 7 s per routine on PoCL, then ~40 ms from PoCL's
     on-disk kernel cache. POCL_CACHE_DIR must name a writable directory, or
     PoCL drops the device silently (POCL_DEBUG=err says why); our own kernels
     are built once per context and cached by PoCL the same way. Each tuning
     candidate is a new compile, which is what bounds the tuner's speed.

   PRECISION (against the CPU reference backend)

     Kernels are built with FP_CONTRACT off and, where the device supports it,
     -cl-fp32-correctly-rounded-divide-sqrt, so scale, axpy, bias_backward,
     the optimizer updates, relu and the image operations (im2col, col2im,
     max-pool: copies, compares and float adds in the CPU's order) match the
     CPU backend bit for bit. Options that allow reassociation or assume
     finite math (-cl-fast-relaxed-math, -cl-unsafe-math-optimizations,
     -cl-finite-math-only) are never passed by the library; added through
     build_options they void these promises (max-pool's NaN rule first). tanh,
     sigmoid and the losses use OpenCL's exp/tanh/log (a few ulp). The losses
     and norm_check accumulate in double when every device of the context has
     cl_khr_fp64, else in float (then norm_check's per-work-group partial sums
     are float, summed in double on the host). Reductions have a fixed order
     for a given size and device: same inputs, same bits. sum_across adds in
     float in rank order, as the host's DSGD_ALLREDUCE_DIRECT does, so the
     DEVICE and HOST gradient paths give the same bits with that algorithm.
*/
#ifndef DSGD_CL__PART_CONTEXT_DECL
#define DSGD_CL__PART_CONTEXT_DECL

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#ifndef CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS /* clCreateCommandQueue under newer targets */
#endif
#if defined(__APPLE__)
#include <OpenCL/opencl.h>
#else
#include <CL/cl.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- devices */

#define DSGD_CL_MAX_NAME 128
#define DSGD_CL_MAX_DEVICES 16

typedef enum dsgd_cl_device_type {
    DSGD_CL_DEVICE_DEFAULT = 0, /* a GPU if there is one, else any device */
    DSGD_CL_DEVICE_GPU,
    DSGD_CL_DEVICE_CPU,
    DSGD_CL_DEVICE_ACCELERATOR,
    DSGD_CL_DEVICE_ALL /* any type */
} dsgd_cl_device_type;

typedef struct dsgd_cl_device_info {
    int index;          /* position in dsgd_cl_list_devices()'s list */
    int platform_index; /* the platform's position in clGetPlatformIDs */
    int device_index;   /* the device's position within its platform */
    char platform_name[DSGD_CL_MAX_NAME];
    char platform_version[DSGD_CL_MAX_NAME];
    char device_name[DSGD_CL_MAX_NAME];
    char device_vendor[DSGD_CL_MAX_NAME];
    char device_version[DSGD_CL_MAX_NAME];
    char driver_version[DSGD_CL_MAX_NAME];
    dsgd_cl_device_type type; /* GPU, CPU, ACCELERATOR, or ALL for other types */
    uint64_t global_mem_bytes;
    uint64_t max_alloc_bytes;
    uint64_t local_mem_bytes;
    unsigned compute_units;
    unsigned max_clock_mhz;
    size_t max_work_group_size;
    int fp64;           /* cl_khr_fp64 */
    int unified_memory; /* CL_DEVICE_HOST_UNIFIED_MEMORY */
    unsigned vector_width; /* CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT (16 on
                              PoCL with AVX-512, usually 1 on GPUs; 0 when
                              the driver does not answer); the cl_tune
                              tuner makes register-tiled GEMM candidates for it */
} dsgd_cl_device_info;

/* Lists every device of every platform. Fills out[0 .. min(capacity, total))
   and sets *count to the total (so capacity 0 with out NULL counts them).
   No OpenCL platform at all is not an error here: *count is 0.
   Errors (recorded on ctx, which may be NULL): DSGD_ERR_INVALID_ARGUMENT
   (count NULL, capacity < 0, out NULL with capacity > 0), DSGD_ERR_BACKEND
   (clGetPlatformIDs failed), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: any thread (that may use ctx). */
DSGD_API dsgd_result dsgd_cl_list_devices(dsgd_ctx *ctx, dsgd_cl_device_info *out,
                                          int capacity, int *count);
/* "gpu", "cpu", "accelerator", "all"; "default" for DEFAULT and any other
   value. Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_cl_device_type_name(dsgd_cl_device_type t);
/* The name of an OpenCL or CLBlast error code ("CL_OUT_OF_RESOURCES",
   "CLBlastInvalidLeadDimA"); "unknown OpenCL error" otherwise. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_cl_error_string(int code);

/* ---------------------------------------------------------------- context */

typedef enum dsgd_cl_tuning {
    DSGD_CL_TUNING_AUTO = 0, /* apply the device's tuning cache file if valid */
    DSGD_CL_TUNING_OFF       /* leave CLBlast's parameters alone, read no file */
} dsgd_cl_tuning;

/* Which command queue a backend enqueues on (see QUEUES). */
typedef enum dsgd_cl_queues {
    DSGD_CL_QUEUES_AUTO = 0,    /* PER_BACKEND, except on PoCL: PER_DEVICE */
    DSGD_CL_QUEUES_PER_BACKEND, /* each backend its own in-order queue */
    DSGD_CL_QUEUES_PER_DEVICE   /* the backends on one device share one
                                   in-order queue, owned by the context */
} dsgd_cl_queues;

typedef struct dsgd_cl_context_desc {
    const char *device;    /* device spec (see DEVICES); NULL: the environment */
    int max_devices;       /* open up to this many devices (see DEVICES); 0: 1;
                              at most DSGD_CL_MAX_DEVICES */
    dsgd_cl_tuning tuning; /* default AUTO */
    const char *tune_cache; /* file or directory; NULL: $DSGD_CL_TUNE_CACHE, else
                               the user cache directory (see GEMM TUNING) */
    const char *build_options; /* appended to our kernels' clBuildProgram
                                  options; NULL: none */
    dsgd_cl_queues queues; /* default AUTO (see QUEUES) */
} dsgd_cl_context_desc;

typedef struct dsgd_cl_context dsgd_cl_context;

/* Opens the chosen device(s) in one cl_context, builds our kernels for them,
   and applies each device's tuned GEMM parameters (see GEMM TUNING). desc may
   be NULL (all defaults). ctx receives errors and log messages; the context
   keeps no pointer to it. A tuning file that cannot be applied is not an
   error: it is a DSGD_LOG_WARN message.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (out NULL, max_devices
   outside 0..DSGD_CL_MAX_DEVICES, a device spec, DSGD_CL_PLATFORM or
   DSGD_CL_DEVICE_TYPE that does not parse), DSGD_ERR_BACKEND (no platform,
   a platform index out of range, no matching device, an OpenCL error, a
   kernel build failure with its log), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: any thread (that may use ctx); see THREAD SAFETY for
   sharing the context. */
DSGD_API dsgd_result dsgd_cl_context_create(dsgd_ctx *ctx, const dsgd_cl_context_desc *desc,
                                            dsgd_cl_context **out);
/* Destroys the context (c NULL: nothing); every backend created from it must
   be destroyed first.
   Thread safety: one thread, once no backend of c exists. */
DSGD_API void dsgd_cl_context_destroy(dsgd_cl_context *c);
/* Getters (c NULL, or i out of range: 0 or NULL):
     dsgd_cl_context_num_devices  devices opened (1..DSGD_CL_MAX_DEVICES)
     dsgd_cl_context_device_info  information on the context's device i
     dsgd_cl_context_gemm_tuned   1 when device i runs with tuned GEMM
                                  parameters applied by this library (from a
                                  cache file or dsgd_cl_apply_gemm_params)
     dsgd_cl_context_fp64         1 when the kernels accumulate in double
                                  (every device has cl_khr_fp64)
     dsgd_cl_context_handle, dsgd_cl_context_device
                                  the OpenCL context and device i, for your
                                  own OpenCL calls (owned by c)
   Errors: none. Thread safety: any thread while c lives (fixed at creation;
   gemm_tuned also changes with dsgd_cl_apply_gemm_params). */
DSGD_API int dsgd_cl_context_num_devices(const dsgd_cl_context *c);
DSGD_API const dsgd_cl_device_info *dsgd_cl_context_device_info(const dsgd_cl_context *c, int i);
DSGD_API int dsgd_cl_context_gemm_tuned(const dsgd_cl_context *c, int i);
DSGD_API int dsgd_cl_context_fp64(const dsgd_cl_context *c);
/* DSGD_CL_QUEUES_PER_BACKEND or DSGD_CL_QUEUES_PER_DEVICE: how desc.queues
   was resolved (c NULL: PER_BACKEND). Errors: none. Thread safety: any
   thread while c lives. */
DSGD_API dsgd_cl_queues dsgd_cl_context_queues(const dsgd_cl_context *c);
DSGD_API cl_context dsgd_cl_context_handle(const dsgd_cl_context *c);
DSGD_API cl_device_id dsgd_cl_context_device(const dsgd_cl_context *c, int i);

/* ---------------------------------------------------------------- GEMM parameters */

/* The CLBlast GEMM parameters of a device and their cache file (see GEMM
   TUNING): context creation applies the cache (DSGD_CL_TUNING_AUTO);
   the cl_tune tuner (`make tune`) searches for them. */
#define DSGD_CL_XGEMM_NPARAMS 16
#define DSGD_CL_DIRECT_NPARAMS 10

/* A set of CLBlast GEMM parameters for one device (single precision). */
typedef struct dsgd_cl_gemm_params {
    int xgemm_set; /* non-zero: xgemm[] holds Xgemm's parameters in the order of
                      dsgd_cl_xgemm_param_name(): GEMMK KREG KWG KWI MDIMA MDIMC
                      MWG NDIMB NDIMC NWG SA SB STRM STRN VWM VWN */
    size_t xgemm[DSGD_CL_XGEMM_NPARAMS];
    int direct_set; /* XgemmDirect: KWID MDIMAD MDIMCD NDIMBD NDIMCD PADA PADB
                       VWMD VWND WGD */
    size_t direct[DSGD_CL_DIRECT_NPARAMS];
    int min_indirect_set; /* GemmRoutine's XGEMM_MIN_INDIRECT_SIZE: GEMMs with
                             m*n*k below its cube use the direct kernel */
    size_t min_indirect;
} dsgd_cl_gemm_params;

/* Parameter names ("GEMMK", ...; "KWID", ...), NULL when i is out of range.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_cl_xgemm_param_name(int i);
DSGD_API const char *dsgd_cl_direct_param_name(int i);
/* Checks the divisibility rules CLBlast's kernels need, and the limits of
   its GEMMK=1 kernel found by testing (square tiles of 16 or more); a
   rejected set would fail to build, crash or compute wrong results.
   Returns 1 when valid, 0 otherwise (and for p NULL).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cl_gemm_params_valid(const dsgd_cl_gemm_params *p);

/* Applies p to device i of c with CLBlastOverrideParameters (the parts whose
   *_set is non-zero) and marks the device tuned (dsgd_cl_context_gemm_tuned).
   Process-wide for that device; takes effect at the next GEMM (which
   compiles the kernels for the new parameters).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c or p NULL, device
   out of range, a set dsgd_cl_gemm_params_valid rejects), DSGD_ERR_BACKEND
   (CLBlast refused; parts applied before stay applied).
   Thread safety: any thread (that may use ctx); CLBlast calls are
   serialised by the library's lock, but not concurrently with another
   apply on c or with dsgd_cl_context_gemm_tuned. */
DSGD_API dsgd_result dsgd_cl_apply_gemm_params(dsgd_ctx *ctx, dsgd_cl_context *c, int device,
                                               const dsgd_cl_gemm_params *p);
/* The tuning cache file for device i: desc_path, else $DSGD_CL_TUNE_CACHE,
   taken as is when it names a file, or a directory (it ends with '/' or
   exists as one) that gets the device's file name; else that name in
   $XDG_CACHE_HOME/distsgd (when absolute) or ~/.cache/distsgd. Writes it,
   NUL-terminated, to buf.
   Errors (nothing recorded: no context): DSGD_ERR_INVALID_ARGUMENT (c NULL
   or no device i, buf NULL or cap 0, no HOME and no absolute
   XDG_CACHE_HOME, a path that does not fit in buf).
   Thread safety: any thread (it reads the environment). */
DSGD_API dsgd_result dsgd_cl_tune_cache_path(const dsgd_cl_context *c, int device,
                                             const char *desc_path, char *buf, size_t cap);
/* Reads a cache file and checks that it was made for device i of c; *out is
   zeroed on failure.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c NULL or no device
   i, path or out NULL), DSGD_ERR_IO (cannot open), DSGD_ERR_FORMAT (corrupt,
   a read error or parameters dsgd_cl_gemm_params_valid rejects: with the
   line and what is wrong), DSGD_ERR_STATE (made for another device: the
   message names both).
   Thread safety: any thread (that may use ctx). */
DSGD_API dsgd_result dsgd_cl_load_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device,
                                              const char *path, dsgd_cl_gemm_params *out);
/* Writes a cache file for device i (creating missing directories),
   atomically (path.tmp, then rename). note, if non-NULL, is stored as a
   comment line.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c NULL or no device
   i, path or p NULL, a path of 1024 bytes or more, a set
   dsgd_cl_gemm_params_valid rejects), DSGD_ERR_IO (a directory, the file or
   the rename failed).
   Thread safety: any thread (that may use ctx); two writers of one path at
   once race on path.tmp. */
DSGD_API dsgd_result dsgd_cl_save_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device,
                                              const char *path, const dsgd_cl_gemm_params *p,
                                              const char *note);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_CL__PART_CONTEXT_DECL */

#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_CONTEXT_IMPL)
#define DSGD_CL__PART_CONTEXT_IMPL

#include <clblast_c.h>
#include <pthread.h>

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

/* CLBlast 1.5 is not safe when several threads make their first calls at once
   (its routine database is built and freed concurrently: a use-after-free
   seen under ASan with one replica thread per backend). Every CLBlast call
   of this file is therefore made under one process-wide lock, the only
   global state of distsgd. The calls only enqueue work, so the lock is held
   briefly, except during CLBlast's first compile of a routine. */
static pthread_mutex_t dsgd_cl__clblast_lock = PTHREAD_MUTEX_INITIALIZER;

/* Allocation (DSGD_MALLOC, DSGD_FREE), DSGD__UNUSED and the file helpers
   are the core's (distsgd/base.h, distsgd/internal.h). */

/* >>error names ------------------------------------------------------------- */

#define DSGD_CL__ERROR_LIST(X)                                                 \
    X(0, "CL_SUCCESS")                                                         \
    X(-1, "CL_DEVICE_NOT_FOUND")                                               \
    X(-2, "CL_DEVICE_NOT_AVAILABLE")                                           \
    X(-3, "CL_COMPILER_NOT_AVAILABLE")                                         \
    X(-4, "CL_MEM_OBJECT_ALLOCATION_FAILURE")                                  \
    X(-5, "CL_OUT_OF_RESOURCES")                                               \
    X(-6, "CL_OUT_OF_HOST_MEMORY")                                             \
    X(-7, "CL_PROFILING_INFO_NOT_AVAILABLE")                                   \
    X(-8, "CL_MEM_COPY_OVERLAP")                                               \
    X(-9, "CL_IMAGE_FORMAT_MISMATCH")                                          \
    X(-10, "CL_IMAGE_FORMAT_NOT_SUPPORTED")                                    \
    X(-11, "CL_BUILD_PROGRAM_FAILURE")                                         \
    X(-12, "CL_MAP_FAILURE")                                                   \
    X(-13, "CL_MISALIGNED_SUB_BUFFER_OFFSET")                                  \
    X(-14, "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST")                     \
    X(-15, "CL_COMPILE_PROGRAM_FAILURE")                                       \
    X(-16, "CL_LINKER_NOT_AVAILABLE")                                          \
    X(-17, "CL_LINK_PROGRAM_FAILURE")                                          \
    X(-18, "CL_DEVICE_PARTITION_FAILED")                                       \
    X(-19, "CL_KERNEL_ARG_INFO_NOT_AVAILABLE")                                 \
    X(-30, "CL_INVALID_VALUE")                                                 \
    X(-31, "CL_INVALID_DEVICE_TYPE")                                           \
    X(-32, "CL_INVALID_PLATFORM")                                              \
    X(-33, "CL_INVALID_DEVICE")                                                \
    X(-34, "CL_INVALID_CONTEXT")                                               \
    X(-35, "CL_INVALID_QUEUE_PROPERTIES")                                      \
    X(-36, "CL_INVALID_COMMAND_QUEUE")                                         \
    X(-37, "CL_INVALID_HOST_PTR")                                              \
    X(-38, "CL_INVALID_MEM_OBJECT")                                            \
    X(-39, "CL_INVALID_IMAGE_FORMAT_DESCRIPTOR")                               \
    X(-40, "CL_INVALID_IMAGE_SIZE")                                            \
    X(-41, "CL_INVALID_SAMPLER")                                               \
    X(-42, "CL_INVALID_BINARY")                                                \
    X(-43, "CL_INVALID_BUILD_OPTIONS")                                         \
    X(-44, "CL_INVALID_PROGRAM")                                               \
    X(-45, "CL_INVALID_PROGRAM_EXECUTABLE")                                    \
    X(-46, "CL_INVALID_KERNEL_NAME")                                           \
    X(-47, "CL_INVALID_KERNEL_DEFINITION")                                     \
    X(-48, "CL_INVALID_KERNEL")                                                \
    X(-49, "CL_INVALID_ARG_INDEX")                                             \
    X(-50, "CL_INVALID_ARG_VALUE")                                             \
    X(-51, "CL_INVALID_ARG_SIZE")                                              \
    X(-52, "CL_INVALID_KERNEL_ARGS")                                           \
    X(-53, "CL_INVALID_WORK_DIMENSION")                                        \
    X(-54, "CL_INVALID_WORK_GROUP_SIZE")                                       \
    X(-55, "CL_INVALID_WORK_ITEM_SIZE")                                        \
    X(-56, "CL_INVALID_GLOBAL_OFFSET")                                         \
    X(-57, "CL_INVALID_EVENT_WAIT_LIST")                                       \
    X(-58, "CL_INVALID_EVENT")                                                 \
    X(-59, "CL_INVALID_OPERATION")                                             \
    X(-60, "CL_INVALID_GL_OBJECT")                                             \
    X(-61, "CL_INVALID_BUFFER_SIZE")                                           \
    X(-62, "CL_INVALID_MIP_LEVEL")                                             \
    X(-63, "CL_INVALID_GLOBAL_WORK_SIZE")                                      \
    X(-64, "CL_INVALID_PROPERTY")                                              \
    X(-65, "CL_INVALID_IMAGE_DESCRIPTOR")                                      \
    X(-66, "CL_INVALID_COMPILER_OPTIONS")                                      \
    X(-67, "CL_INVALID_LINKER_OPTIONS")                                        \
    X(-68, "CL_INVALID_DEVICE_PARTITION_COUNT")                                \
    X(-69, "CL_INVALID_PIPE_SIZE")                                             \
    X(-70, "CL_INVALID_DEVICE_QUEUE")                                          \
    X(-71, "CL_INVALID_SPEC_ID")                                               \
    X(-72, "CL_MAX_SIZE_RESTRICTION_EXCEEDED")                                 \
    X(-1001, "CL_PLATFORM_NOT_FOUND_KHR")                                      \
    X(-1024, "CLBlastNotImplemented")                                          \
    X(-1022, "CLBlastInvalidMatrixA")                                          \
    X(-1021, "CLBlastInvalidMatrixB")                                          \
    X(-1020, "CLBlastInvalidMatrixC")                                          \
    X(-1019, "CLBlastInvalidVectorX")                                          \
    X(-1018, "CLBlastInvalidVectorY")                                          \
    X(-1017, "CLBlastInvalidDimension")                                        \
    X(-1016, "CLBlastInvalidLeadDimA")                                         \
    X(-1015, "CLBlastInvalidLeadDimB")                                         \
    X(-1014, "CLBlastInvalidLeadDimC")                                         \
    X(-1013, "CLBlastInvalidIncrementX")                                       \
    X(-1012, "CLBlastInvalidIncrementY")                                       \
    X(-1011, "CLBlastInsufficientMemoryA")                                     \
    X(-1010, "CLBlastInsufficientMemoryB")                                     \
    X(-1009, "CLBlastInsufficientMemoryC")                                     \
    X(-1008, "CLBlastInsufficientMemoryX")                                     \
    X(-1007, "CLBlastInsufficientMemoryY")                                     \
    X(-2050, "CLBlastInsufficientMemoryTemp")                                  \
    X(-2049, "CLBlastInvalidBatchCount")                                       \
    X(-2048, "CLBlastInvalidOverrideKernel")                                   \
    X(-2047, "CLBlastMissingOverrideParameter")                                \
    X(-2046, "CLBlastInvalidLocalMemUsage")                                    \
    X(-2045, "CLBlastNoHalfPrecision")                                         \
    X(-2044, "CLBlastNoDoublePrecision")                                       \
    X(-2043, "CLBlastInvalidVectorScalar")                                     \
    X(-2042, "CLBlastInsufficientMemoryScalar")                                \
    X(-2041, "CLBlastDatabaseError")                                           \
    X(-2040, "CLBlastUnknownError")                                            \
    X(-2039, "CLBlastUnexpectedError")

DSGD_API const char *dsgd_cl_error_string(int code) {
    switch (code) {
#define DSGD_CL__ERROR_CASE(value, text) \
    case value:                          \
        return text;
        DSGD_CL__ERROR_LIST(DSGD_CL__ERROR_CASE)
#undef DSGD_CL__ERROR_CASE
    default:
        return "unknown OpenCL error";
    }
}

/* Records an OpenCL or CLBlast failure as "call(what): NAME (code)". */
static dsgd_result dsgd_cl__fail(dsgd_ctx *ctx, int err, const char *call, const char *what) {
    dsgd_result r = DSGD_ERR_BACKEND;
    if (err == CL_MEM_OBJECT_ALLOCATION_FAILURE || err == CL_OUT_OF_HOST_MEMORY ||
        err == CL_INVALID_BUFFER_SIZE)
        r = DSGD_ERR_OUT_OF_MEMORY;
    return dsgd_ctx_set_error(ctx, r, "%s(%s): %s (%d)", call, what ? what : "",
                              dsgd_cl_error_string(err), err);
}

/* >>kernels ----------------------------------------------------------------- */
/* Our OpenCL C 1.2 kernels. Offsets and counts travel as ulong (size_t is not
   a valid kernel argument type); every kernel checks its index against the
   size, so global sizes are rounded up to whole work-groups. The source is an
   array of pieces because C99 compilers need only support 4095-character
   string literals. */

static const char *const dsgd_cl__source[] = {
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "#ifdef DSGD_CL_FP64\n"
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "typedef double acc_t;\n"
    "#else\n"
    "typedef float acc_t;\n"
    "#endif\n"
    "#ifdef DSGD_CL_SELFTEST_BUILD_ERROR\n"
    "#error \"deliberate build failure requested by DSGD_CL_SELFTEST_BUILD_ERROR\"\n"
    "#endif\n"
    "\n"
    "float dsgd_act(int act, float v) {\n"
    "    if (act == 1) return v > 0.0f ? v : 0.0f;\n"
    "    if (act == 2) return tanh(v);\n"
    "    if (act == 3) return 1.0f / (1.0f + exp(-v));\n"
    "    return v;\n"
    "}\n"
    "\n"
    "__kernel void dsgd_scale(__global float *x, ulong off, float alpha, ulong n) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < n) x[off + i] = x[off + i] * alpha;\n"
    "}\n"
    "\n"
    "__kernel void dsgd_axpy(__global float *y, ulong yoff, float alpha,\n"
    "                        __global const float *x, ulong xoff, ulong n) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < n) y[yoff + i] = y[yoff + i] + alpha * x[xoff + i];\n"
    "}\n"
    "\n"
    "/* y(m,n) = act(y + bias) over total = m*n entries */\n"
    "__kernel void dsgd_bias_act(__global float *y, ulong yoff, __global const float *b,\n"
    "                            ulong boff, int has_bias, int act, uint n, ulong total) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < total) {\n"
    "        float v = y[yoff + i];\n"
    "        if (has_bias) v = v + b[boff + i % n];\n"
    "        y[yoff + i] = dsgd_act(act, v);\n"
    "    }\n"
    "}\n"
    "\n"
    "/* dy *= act'(y), written in terms of the activation's output y */\n"
    "__kernel void dsgd_act_backward(__global float *dy, ulong dyoff, __global const float *y,\n"
    "                                ulong yoff, int act, ulong n) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < n) {\n"
    "        float d = dy[dyoff + i], v = y[yoff + i];\n"
    "        if (act == 1) d = v > 0.0f ? d : 0.0f;\n"
    "        else if (act == 2) d = d * (1.0f - v * v);\n"
    "        else if (act == 3) d = d * (v * (1.0f - v));\n"
    "        dy[dyoff + i] = d;\n"
    "    }\n"
    "}\n"
    "\n"
    "/* db(n) = column sums of dy(m,n): one work-item per column, rows in order */\n"
    "__kernel void dsgd_bias_backward(__global float *db, ulong dboff, __global const float *dy,\n"
    "                                 ulong dyoff, uint m, uint n) {\n"
    "    uint j = get_global_id(0);\n"
    "    if (j < n) {\n"
    "        float s = 0.0f;\n"
    "        for (uint i = 0; i < m; ++i) s = s + dy[dyoff + (ulong)i * n + j];\n"
    "        db[dboff + j] = s;\n"
    "    }\n"
    "}\n",

    "/* Softmax cross-entropy, one work-item per sample. rows[2i] = the sample's\n"
    "   loss, rows[2i+1] = 1 when argmax == class, else 0; -1 marks a class that\n"
    "   is not an integer in [0, c). */\n"
    "__kernel void dsgd_xent_rows(uint m, uint c, __global const float *pred, ulong poff,\n"
    "                             __global const float *tgt, ulong toff, float gs,\n"
    "                             __global float *dpred, ulong doff, int want_grad,\n"
    "                             __global acc_t *rows) {\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= m) return;\n"
    "    __global const float *z = pred + poff + (ulong)i * c;\n"
    "    float t = tgt[toff + i];\n"
    "    if (!(t >= 0.0f && t < (float)c) || t != floor(t)) {\n"
    "        rows[2 * i] = 0; rows[2 * i + 1] = -1; return;\n"
    "    }\n"
    "    uint cls = (uint)t, best = 0;\n"
    "    for (uint j = 1; j < c; ++j) if (z[j] > z[best]) best = j;\n"
    "    acc_t mx = z[best], sum = 0;\n"
    "    for (uint j = 0; j < c; ++j) sum += exp((acc_t)z[j] - mx);\n"
    "    acc_t lse = mx + log(sum);\n"
    "    rows[2 * i] = lse - (acc_t)z[cls];\n"
    "    rows[2 * i + 1] = best == cls ? 1 : 0;\n"
    "    if (want_grad) {\n"
    "        __global float *d = dpred + doff + (ulong)i * c;\n"
    "        for (uint j = 0; j < c; ++j) {\n"
    "            acc_t p = exp((acc_t)z[j] - lse);\n"
    "            d[j] = (float)((acc_t)gs * (p - (j == cls ? (acc_t)1 : (acc_t)0)));\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "/* Mean squared error, one work-item per sample (rows as above). */\n"
    "__kernel void dsgd_mse_rows(uint m, uint c, __global const float *pred, ulong poff,\n"
    "                            __global const float *tgt, ulong toff, float gs,\n"
    "                            __global float *dpred, ulong doff, int want_grad,\n"
    "                            __global acc_t *rows) {\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= m) return;\n"
    "    __global const float *p = pred + poff + (ulong)i * c;\n"
    "    __global const float *t = tgt + toff + (ulong)i * c;\n"
    "    acc_t s = 0;\n"
    "    uint bp = 0, bt = 0;\n"
    "    for (uint j = 0; j < c; ++j) {\n"
    "        acc_t e = (acc_t)p[j] - (acc_t)t[j];\n"
    "        s += e * e;\n"
    "        if (want_grad) dpred[doff + (ulong)i * c + j] = (float)((acc_t)gs * (acc_t)2 * e / (acc_t)c);\n"
    "        if (p[j] > p[bp]) bp = j;\n"
    "        if (t[j] > t[bt]) bt = j;\n"
    "    }\n"
    "    rows[2 * i] = s / (acc_t)c;\n"
    "    rows[2 * i + 1] = bp == bt ? 1 : 0;\n"
    "}\n"
    "\n"
    "/* One work-group (power-of-two size) sums the rows in a fixed order and, when\n"
    "   no sample was bad, adds loss and correct count to stats. status[0] = bad\n"
    "   samples, status[1] = the first bad sample (m when none). */\n"
    "__kernel void dsgd_loss_reduce(uint m, __global const acc_t *rows, __global float *stats,\n"
    "                               ulong soff, __global int *status, __local acc_t *sl,\n"
    "                               __local acc_t *sc, __local uint *sb, __local uint *sf) {\n"
    "    uint lid = get_local_id(0), L = get_local_size(0);\n"
    "    acc_t a = 0, b = 0;\n"
    "    uint bad = 0, first = m;\n"
    "    for (uint i = lid; i < m; i += L) {\n"
    "        acc_t cr = rows[2 * i + 1];\n"
    "        if (cr < 0) { ++bad; if (i < first) first = i; }\n"
    "        else { a += rows[2 * i]; b += cr; }\n"
    "    }\n"
    "    sl[lid] = a; sc[lid] = b; sb[lid] = bad; sf[lid] = first;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint s = L / 2; s > 0; s >>= 1) {\n"
    "        if (lid < s) {\n"
    "            sl[lid] += sl[lid + s]; sc[lid] += sc[lid + s]; sb[lid] += sb[lid + s];\n"
    "            sf[lid] = min(sf[lid], sf[lid + s]);\n"
    "        }\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (lid == 0) {\n"
    "        status[0] = (int)sb[0]; status[1] = (int)sf[0];\n"
    "        if (sb[0] == 0) {\n"
    "            stats[soff] = stats[soff] + (float)sl[0];\n"
    "            stats[soff + 1] = stats[soff + 1] + (float)sc[0];\n"
    "        }\n"
    "    }\n"
    "}\n",

    "/* One optimizer step per parameter; the arithmetic is the CPU backend's,\n"
    "   operation for operation. kind: 0 SGD, 1 momentum, 2 Adam, 3 AdamW. */\n"
    "__kernel void dsgd_opt_update(__global float *p, ulong poff, __global const float *g,\n"
    "                              ulong goff, __global float *m1, ulong m1off,\n"
    "                              __global float *m2, ulong m2off, ulong n, int kind,\n"
    "                              float lr, float mu, int nesterov, float b1, float b2,\n"
    "                              float eps, float wd, float bc1, float bc2, float gs) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float pi = p[poff + i];\n"
    "    if (kind == 0) {\n"
    "        float gi = g[goff + i] * gs + wd * pi;\n"
    "        pi = pi - lr * gi;\n"
    "    } else if (kind == 1) {\n"
    "        float gi = g[goff + i] * gs + wd * pi;\n"
    "        float v = mu * m1[m1off + i] + gi;\n"
    "        m1[m1off + i] = v;\n"
    "        pi = pi - lr * (nesterov ? gi + mu * v : v);\n"
    "    } else {\n"
    "        int dec = kind == 3;\n"
    "        float gi = g[goff + i] * gs + (dec ? 0.0f : wd * pi);\n"
    "        float mi = b1 * m1[m1off + i] + (1.0f - b1) * gi;\n"
    "        float vi = b2 * m2[m2off + i] + (1.0f - b2) * gi * gi;\n"
    "        float mhat = mi / bc1, vhat = vi / bc2;\n"
    "        m1[m1off + i] = mi;\n"
    "        m2[m2off + i] = vi;\n"
    "        pi = pi - lr * (mhat / (sqrt(vhat) + eps) + (dec ? wd * pi : 0.0f));\n"
    "    }\n"
    "    p[poff + i] = pi;\n"
    "}\n"
    "\n"
    "/* First pass of norm_check: work-group g sums the squares of the finite\n"
    "   entries of [g*chunk, (g+1)*chunk) and counts the others, in a fixed\n"
    "   order (power-of-two work-group size). */\n"
    "__kernel void dsgd_norm_partial(__global const float *x, ulong off, ulong n, ulong chunk,\n"
    "                                __global acc_t *psum, __global ulong *pbad,\n"
    "                                __local acc_t *ls, __local ulong *lb) {\n"
    "    uint lid = get_local_id(0), L = get_local_size(0), g = get_group_id(0);\n"
    "    ulong start = (ulong)g * chunk, end = min(start + chunk, n);\n"
    "    acc_t s = 0;\n"
    "    ulong bad = 0;\n"
    "    for (ulong i = start + lid; i < end; i += L) {\n"
    "        float v = x[off + i];\n"
    "        if (isfinite(v)) s += (acc_t)v * (acc_t)v; else ++bad;\n"
    "    }\n"
    "    ls[lid] = s; lb[lid] = bad;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint h = L / 2; h > 0; h >>= 1) {\n"
    "        if (lid < h) { ls[lid] += ls[lid + h]; lb[lid] += lb[lid + h]; }\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (lid == 0) { psum[g] = ls[0]; pbad[g] = lb[0]; }\n"
    "}\n",

    "/* Device-side reduction across replicas (sum_across), up to 8 buffers\n"
    "   a launch: v = [d +] s0 + s1 + ... + s(k-1), in that order, written to\n"
    "   d, or with put to every s(j) (each work-item reads its entry of every\n"
    "   buffer before it writes them). */\n"
    "#define DSGD_SRC(j) , __global float *s##j, ulong o##j\n"
    "#define DSGD_DST(j) , __global float *d##j, ulong o##j\n"
    "#define DSGD_8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)\n"
    "__kernel void dsgd_sum8(__global float *d, ulong doff, int acc, int put, uint k, ulong n\n"
    "                        DSGD_8(DSGD_SRC)) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float v = acc ? d[doff + i] + s0[o0 + i] : s0[o0 + i];\n"
    "#define DSGD_ADD(j) if (j > 0 && k > j) v = v + s##j[o##j + i];\n"
    "    DSGD_8(DSGD_ADD)\n"
    "    if (!put) { d[doff + i] = v; return; }\n"
    "#define DSGD_BACK(j) if (k > j) s##j[o##j + i] = v;\n"
    "    DSGD_8(DSGD_BACK)\n"
    "}\n"
    "\n"
    "/* d0 .. d(k-1) = s, up to 8 destinations a launch. */\n"
    "__kernel void dsgd_copy8(__global const float *s, ulong soff, uint k, ulong n\n"
    "                         DSGD_8(DSGD_DST)) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float v = s[soff + i];\n"
    "#define DSGD_PUT(j) if (k > j) d##j[o##j + i] = v;\n"
    "    DSGD_8(DSGD_PUT)\n"
    "}\n",

    "/* NHWC images (IMAGES in backend.h). One work-item per run of the\n"
    "   output: a row (i, oy, ox, ky) of kw c floats of col, or the c channels\n"
    "   of one pixel (i, y, x) of dx or y, done in a loop. (One work-item per\n"
    "   float costs PoCL ~30x more in index arithmetic than the copy itself.)\n"
    "   The arithmetic is the CPU backend's: copies, compares and float adds\n"
    "   from 0.0f in the documented order. Every kernel takes the window as\n"
    "   h w c kh kw s p oh ow, then the number of work-items. */\n"
    "#define DSGD_WIN int h, int w, int c, int kh, int kw, int s, int p, int oh, int ow, ulong items\n"
    "/* col's row (i, oy, ox, ky): the kw c floats of image row iy from column\n"
    "   ox s - p on, 0 outside the image */\n"
    "__kernel void dsgd_im2col(__global const float *x, ulong xoff, __global float *col, ulong coff,\n"
    "                          DSGD_WIN) {\n"
    "    ulong r = get_global_id(0), run = (ulong)kw * c, t = r / kh / ow;\n"
    "    if (r >= items) return;\n"
    "    long ky = r % kh, ox = r / kh % ow, oy = t % oh, i = t / oh, wc = (long)w * c;\n"
    "    long iy = oy * s - p + ky, at = (ox * s - p) * c;\n"
    "    __global float *d = col + coff + r * run;\n"
    "    if (iy < 0 || iy >= h) {\n"
    "        for (long q = 0; q < (long)run; ++q) d[q] = 0.0f;\n"
    "        return;\n"
    "    }\n"
    "    __global const float *src = x + xoff + (i * h + iy) * wc;\n"
    "    for (long q = 0; q < (long)run; ++q) d[q] = at + q >= 0 && at + q < wc ? src[at + q] : 0.0f;\n"
    "}\n"
    "\n"
    "/* dx = col2im(col) at pixel (i, iy, ix): each channel sums, from 0.0f\n"
    "   and (ky, kx) ascending (oy, then ox, descending), the col entries\n"
    "   im2col copied from it, in place in dx (c floats in a row) */\n"
    "__kernel void dsgd_col2im(__global const float *col, ulong coff, __global float *dx, ulong dxoff,\n"
    "                          DSGD_WIN) {\n"
    "    ulong g = get_global_id(0), k = (ulong)kh * kw * c, t = g / w;\n"
    "    if (g >= items) return;\n"
    "    long ix = g % w, iy = t % h, i = t / h, ty = iy + p, tx = ix + p;\n"
    "    long oy0 = ty - kh + 1 <= 0 ? 0 : (ty - kh + s) / s, oy1 = min((long)oh - 1, ty / s);\n"
    "    long ox0 = tx - kw + 1 <= 0 ? 0 : (tx - kw + s) / s, ox1 = min((long)ow - 1, tx / s);\n"
    "    __global float *d = dx + dxoff + g * c;\n"
    "    for (long ch = 0; ch < c; ++ch) d[ch] = 0.0f;\n"
    "    for (long oy = oy1; oy >= oy0; --oy)\n"
    "        for (long ox = ox1; ox >= ox0; --ox) {\n"
    "            __global const float *src = col + coff + ((i * oh + oy) * ow + ox) * k + ((ty - oy * s) * kw + tx - ox * s) * c;\n"
    "            for (long ch = 0; ch < c; ++ch) d[ch] = d[ch] + src[ch];\n"
    "        }\n"
    "}\n",

    "/* y = max-pool(x) at pixel (i, oy, ox): per channel the window's first\n"
    "   maximum, or its first NaN */\n"
    "__kernel void dsgd_maxpool_fwd(__global const float *x, ulong xoff, __global float *y, ulong yoff,\n"
    "                               DSGD_WIN) {\n"
    "    ulong g = get_global_id(0), t = g / ow;\n"
    "    if (g >= items) return;\n"
    "    long ox = g % ow, oy = t % oh, i = t / oh;\n"
    "    __global const float *b = x + xoff + ((i * h + oy * s) * w + ox * s) * c;\n"
    "    for (long ch = 0; ch < c; ++ch) {\n"
    "        float m = b[ch];\n"
    "        for (int ky = 0; ky < kh; ++ky)\n"
    "            for (int kx = ky == 0 ? 1 : 0; kx < kw; ++kx) {\n"
    "                float v = b[((long)ky * w + kx) * c + ch];\n"
    "                if (v > m || (isnan(v) && !isnan(m))) m = v;\n"
    "            }\n"
    "        y[yoff + g * c + ch] = m;\n"
    "    }\n"
    "}\n"
    "\n"
    "/* max-pool's dx at pixel (i, iy, ix): per channel the sum, from 0.0f and\n"
    "   windows (oy, ox) ascending, of the dy of every window whose first\n"
    "   element equal to y (the first NaN for a NaN y) it is */\n"
    "__kernel void dsgd_maxpool_bwd(__global const float *x, ulong xoff, __global const float *y, ulong yoff,\n"
    "                               __global const float *dy, ulong dyoff, __global float *dx, ulong dxoff,\n"
    "                               DSGD_WIN) {\n"
    "    ulong g = get_global_id(0), t = g / w;\n"
    "    if (g >= items) return;\n"
    "    long ix = g % w, iy = t % h, i = t / h;\n"
    "    long oy0 = iy - kh + 1 <= 0 ? 0 : (iy - kh + s) / s, oy1 = min((long)oh - 1, iy / s);\n"
    "    long ox0 = ix - kw + 1 <= 0 ? 0 : (ix - kw + s) / s, ox1 = min((long)ow - 1, ix / s);\n"
    "    for (long ch = 0; ch < c; ++ch) {\n"
    "        float acc = 0.0f;\n"
    "        for (long oy = oy0; oy <= oy1; ++oy)\n"
    "            for (long ox = ox0; ox <= ox1; ++ox) {\n"
    "                ulong o = ((i * oh + oy) * ow + ox) * c + ch;\n"
    "                __global const float *b = x + xoff + ((i * h + oy * s) * w + ox * s) * c + ch;\n"
    "                float want = y[yoff + o];\n"
    "                int want_nan = isnan(want), found = 0, mine = 0;\n"
    "                for (int ky = 0; ky < kh && !found; ++ky)\n"
    "                    for (int kx = 0; kx < kw; ++kx) {\n"
    "                        float v = b[((long)ky * w + kx) * c];\n"
    "                        if (want_nan ? isnan(v) : v == want) {\n"
    "                            mine = ky == iy - oy * s && kx == ix - ox * s;\n"
    "                            found = 1;\n"
    "                            break;\n"
    "                        }\n"
    "                    }\n"
    "                if (mine) acc = acc + dy[dyoff + o];\n"
    "            }\n"
    "        dx[dxoff + g * c + ch] = acc;\n"
    "    }\n"
    "}\n"};

#define DSGD_CL__NSOURCE ((cl_uint)(sizeof(dsgd_cl__source) / sizeof(dsgd_cl__source[0])))

enum {
    DSGD_CL__K_SCALE = 0,
    DSGD_CL__K_AXPY,
    DSGD_CL__K_BIAS_ACT,
    DSGD_CL__K_ACT_BWD,
    DSGD_CL__K_BIAS_BWD,
    DSGD_CL__K_XENT,
    DSGD_CL__K_MSE,
    DSGD_CL__K_LOSS_REDUCE,
    DSGD_CL__K_OPT,
    DSGD_CL__K_NORM,
    DSGD_CL__K_SUM8,
    DSGD_CL__K_COPY8,
    DSGD_CL__K_IM2COL,
    DSGD_CL__K_COL2IM,
    DSGD_CL__K_POOL_FWD,
    DSGD_CL__K_POOL_BWD,
    DSGD_CL__K_COUNT
};

/* Kernel function names, and the operation names used in error messages. */
static const char *const dsgd_cl__kernel_fn[DSGD_CL__K_COUNT] = {
    "dsgd_scale",     "dsgd_axpy",     "dsgd_bias_act",    "dsgd_act_backward",
    "dsgd_bias_backward", "dsgd_xent_rows", "dsgd_mse_rows", "dsgd_loss_reduce",
    "dsgd_opt_update", "dsgd_norm_partial", "dsgd_sum8", "dsgd_copy8",
    "dsgd_im2col", "dsgd_col2im", "dsgd_maxpool_fwd", "dsgd_maxpool_bwd"};
static const char *const dsgd_cl__kernel_op[DSGD_CL__K_COUNT] = {
    "scale",        "axpy",          "bias_act_forward", "act_backward",
    "bias_backward", "loss(softmax_xent)", "loss(mse)", "loss(reduce)",
    "optimizer_update", "norm_check", "sum_across", "sum_across(copy)",
    "im2col", "col2im", "maxpool_forward", "maxpool_backward"};

/* >>context ----------------------------------------------------------------- */

struct dsgd_cl_context {
    cl_platform_id platform;
    cl_context context;
    cl_program program;
    int num_devices;
    cl_device_id devices[DSGD_CL_MAX_DEVICES];
    dsgd_cl_device_info info[DSGD_CL_MAX_DEVICES];
    int tuned[DSGD_CL_MAX_DEVICES];
    int fp64;
    dsgd_cl_queues queues;                          /* resolved */
    cl_command_queue dev_queue[DSGD_CL_MAX_DEVICES]; /* PER_DEVICE: shared */
};

static void dsgd_cl__copy_str(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static void dsgd_cl__dev_str(cl_device_id d, cl_device_info what, char *dst, size_t cap) {
    size_t got = 0;
    dst[0] = '\0';
    if (clGetDeviceInfo(d, what, cap - 1, dst, &got) != CL_SUCCESS) {
        /* a longer value than cap: fetch it whole, keep the head */
        size_t need = 0;
        char *tmp;
        if (clGetDeviceInfo(d, what, 0, NULL, &need) != CL_SUCCESS || need == 0) return;
        tmp = (char *)DSGD_MALLOC(need + 1);
        if (!tmp) return;
        if (clGetDeviceInfo(d, what, need, tmp, NULL) == CL_SUCCESS) {
            tmp[need] = '\0';
            dsgd_cl__copy_str(dst, cap, tmp);
        }
        DSGD_FREE(tmp);
        return;
    }
    dst[cap - 1] = '\0';
}

static void dsgd_cl__plat_str(cl_platform_id p, cl_platform_info what, char *dst, size_t cap) {
    dst[0] = '\0';
    if (clGetPlatformInfo(p, what, cap - 1, dst, NULL) != CL_SUCCESS) {
        size_t need = 0;
        char *tmp;
        if (clGetPlatformInfo(p, what, 0, NULL, &need) != CL_SUCCESS || need == 0) return;
        tmp = (char *)DSGD_MALLOC(need + 1);
        if (!tmp) return;
        if (clGetPlatformInfo(p, what, need, tmp, NULL) == CL_SUCCESS) {
            tmp[need] = '\0';
            dsgd_cl__copy_str(dst, cap, tmp);
        }
        DSGD_FREE(tmp);
        return;
    }
    dst[cap - 1] = '\0';
}

static int dsgd_cl__has_extension(cl_device_id d, const char *ext) {
    size_t need = 0, n = strlen(ext);
    char *s, *p;
    int found = 0;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, 0, NULL, &need) != CL_SUCCESS || need == 0) return 0;
    s = (char *)DSGD_MALLOC(need + 1);
    if (!s) return 0;
    if (clGetDeviceInfo(d, CL_DEVICE_EXTENSIONS, need, s, NULL) == CL_SUCCESS) {
        s[need] = '\0';
        for (p = strstr(s, ext); p; p = strstr(p + 1, ext)) {
            if ((p == s || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ')) {
                found = 1;
                break;
            }
        }
    }
    DSGD_FREE(s);
    return found;
}

static void dsgd_cl__fill_info(cl_platform_id p, cl_device_id d, dsgd_cl_device_info *info) {
    cl_device_type t = 0;
    cl_ulong u = 0;
    cl_uint v = 0;
    size_t z = 0;
    cl_bool unified = CL_FALSE;
    dsgd_cl__plat_str(p, CL_PLATFORM_NAME, info->platform_name, sizeof(info->platform_name));
    dsgd_cl__plat_str(p, CL_PLATFORM_VERSION, info->platform_version, sizeof(info->platform_version));
    dsgd_cl__dev_str(d, CL_DEVICE_NAME, info->device_name, sizeof(info->device_name));
    dsgd_cl__dev_str(d, CL_DEVICE_VENDOR, info->device_vendor, sizeof(info->device_vendor));
    dsgd_cl__dev_str(d, CL_DEVICE_VERSION, info->device_version, sizeof(info->device_version));
    dsgd_cl__dev_str(d, CL_DRIVER_VERSION, info->driver_version, sizeof(info->driver_version));
    clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof(t), &t, NULL);
    info->type = (t & CL_DEVICE_TYPE_GPU)           ? DSGD_CL_DEVICE_GPU
                 : (t & CL_DEVICE_TYPE_CPU)         ? DSGD_CL_DEVICE_CPU
                 : (t & CL_DEVICE_TYPE_ACCELERATOR) ? DSGD_CL_DEVICE_ACCELERATOR
                                                    : DSGD_CL_DEVICE_ALL;
    if (clGetDeviceInfo(d, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(u), &u, NULL) == CL_SUCCESS)
        info->global_mem_bytes = u;
    if (clGetDeviceInfo(d, CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof(u), &u, NULL) == CL_SUCCESS)
        info->max_alloc_bytes = u;
    if (clGetDeviceInfo(d, CL_DEVICE_LOCAL_MEM_SIZE, sizeof(u), &u, NULL) == CL_SUCCESS)
        info->local_mem_bytes = u;
    if (clGetDeviceInfo(d, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof(v), &v, NULL) == CL_SUCCESS)
        info->compute_units = v;
    if (clGetDeviceInfo(d, CL_DEVICE_MAX_CLOCK_FREQUENCY, sizeof(v), &v, NULL) == CL_SUCCESS)
        info->max_clock_mhz = v;
    if (clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof(z), &z, NULL) == CL_SUCCESS)
        info->max_work_group_size = z;
    if (clGetDeviceInfo(d, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(unified), &unified, NULL) == CL_SUCCESS)
        info->unified_memory = unified == CL_TRUE;
    if (clGetDeviceInfo(d, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof(v), &v, NULL) == CL_SUCCESS)
        info->vector_width = v;
    info->fp64 = dsgd_cl__has_extension(d, "cl_khr_fp64");
}

/* Every (platform, device) pair in enumeration order. */
typedef struct dsgd_cl__enum {
    int count;
    int num_platforms;
    cl_platform_id *platforms;
    cl_platform_id *dev_platform; /* per device */
    cl_device_id *devices;
    int *plat_index, *dev_index;
} dsgd_cl__enum;

static void dsgd_cl__enum_free(dsgd_cl__enum *e) {
    DSGD_FREE(e->platforms);
    DSGD_FREE(e->dev_platform);
    DSGD_FREE(e->devices);
    DSGD_FREE(e->plat_index);
    DSGD_FREE(e->dev_index);
    memset(e, 0, sizeof(*e));
}

/* Enumerates all devices for the public function fn (allocation failures
   name it). No platform: DSGD_OK with count 0 and *platform_err the
   clGetPlatformIDs code. */
static dsgd_result dsgd_cl__enumerate(dsgd_ctx *ctx, const char *fn, dsgd_cl__enum *e, cl_int *platform_err) {
    cl_uint np = 0, p;
    cl_int err;
    int total = 0, k = 0;
    memset(e, 0, sizeof(*e));
    err = clGetPlatformIDs(0, NULL, &np);
    if (platform_err) *platform_err = err;
    if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && np == 0)) return DSGD_OK;
    if (err != CL_SUCCESS) return dsgd_cl__fail(ctx, err, "clGetPlatformIDs", "count");
    e->platforms = (cl_platform_id *)DSGD_MALLOC(np * sizeof(cl_platform_id));
    if (!e->platforms) return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: platform list", fn);
    err = clGetPlatformIDs(np, e->platforms, NULL);
    if (err != CL_SUCCESS) {
        dsgd_cl__enum_free(e);
        return dsgd_cl__fail(ctx, err, "clGetPlatformIDs", "list");
    }
    e->num_platforms = (int)np;
    for (p = 0; p < np; ++p) {
        cl_uint nd = 0;
        err = clGetDeviceIDs(e->platforms[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd);
        if (err == CL_SUCCESS) total += (int)nd;
    }
    if (total > 0) {
        size_t t = (size_t)total;
        e->dev_platform = (cl_platform_id *)DSGD_MALLOC(t * sizeof(cl_platform_id));
        e->devices = (cl_device_id *)DSGD_MALLOC(t * sizeof(cl_device_id));
        e->plat_index = (int *)DSGD_MALLOC(t * sizeof(int));
        e->dev_index = (int *)DSGD_MALLOC(t * sizeof(int));
        if (!e->dev_platform || !e->devices || !e->plat_index || !e->dev_index) {
            dsgd_cl__enum_free(e);
            return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: device list", fn);
        }
        for (p = 0; p < np && k < total; ++p) {
            cl_uint nd = 0, d;
            if (clGetDeviceIDs(e->platforms[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0)
                continue;
            if ((int)nd > total - k) nd = (cl_uint)(total - k);
            if (clGetDeviceIDs(e->platforms[p], CL_DEVICE_TYPE_ALL, nd, e->devices + k, &nd) != CL_SUCCESS)
                continue;
            for (d = 0; d < nd; ++d) {
                e->dev_platform[k + (int)d] = e->platforms[p];
                e->plat_index[k + (int)d] = (int)p;
                e->dev_index[k + (int)d] = (int)d;
            }
            k += (int)nd;
        }
    }
    e->count = k;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cl_list_devices(dsgd_ctx *ctx, dsgd_cl_device_info *out, int capacity,
                                          int *count) {
    dsgd_cl__enum e;
    dsgd_result r;
    int i;
    if (!count || capacity < 0 || (capacity > 0 && !out))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_list_devices: bad arguments");
    *count = 0;
    r = dsgd_cl__enumerate(ctx, "dsgd_cl_list_devices", &e, NULL);
    if (r != DSGD_OK) return r;
    for (i = 0; i < e.count && i < capacity; ++i) {
        memset(&out[i], 0, sizeof(out[i]));
        dsgd_cl__fill_info(e.dev_platform[i], e.devices[i], &out[i]);
        out[i].index = i;
        out[i].platform_index = e.plat_index[i];
        out[i].device_index = e.dev_index[i];
    }
    *count = e.count;
    dsgd_cl__enum_free(&e);
    return DSGD_OK;
}

DSGD_API const char *dsgd_cl_device_type_name(dsgd_cl_device_type t) {
    switch (t) {
    case DSGD_CL_DEVICE_GPU: return "gpu";
    case DSGD_CL_DEVICE_CPU: return "cpu";
    case DSGD_CL_DEVICE_ACCELERATOR: return "accelerator";
    case DSGD_CL_DEVICE_ALL: return "all";
    default: return "default";
    }
}

/* A parsed device spec: -1 means "not given". */
typedef struct dsgd_cl__spec {
    int platform;
    int index;
    int type_given;
    dsgd_cl_device_type type;
} dsgd_cl__spec;

static int dsgd_cl__parse_uint(const char *s, size_t n, int *out) {
    size_t i;
    long v = 0;
    if (n == 0 || n > 6) return 0;
    for (i = 0; i < n; ++i) {
        if (s[i] < '0' || s[i] > '9') return 0;
        v = v * 10 + (s[i] - '0');
    }
    *out = (int)v;
    return 1;
}

static int dsgd_cl__parse_type(const char *s, size_t n, dsgd_cl_device_type *out) {
    static const char *const names[] = {"default", "gpu", "cpu", "accelerator", "all"};
    int i;
    size_t j;
    for (i = 0; i < 5; ++i) {
        if (strlen(names[i]) != n) continue;
        for (j = 0; j < n; ++j) {
            char ch = s[j];
            if (ch >= 'A' && ch <= 'Z') ch = (char)(ch - 'A' + 'a');
            if (ch != names[i][j]) break;
        }
        if (j == n) {
            *out = (dsgd_cl_device_type)i;
            return 1;
        }
    }
    return 0;
}

/* spec := "" | TYPE | N | P ":" N | P ":" TYPE */
static int dsgd_cl__parse_spec(const char *s, dsgd_cl__spec *sp) {
    const char *colon;
    const char *rest = s;
    size_t n;
    sp->platform = -1;
    sp->index = -1;
    sp->type_given = 0;
    sp->type = DSGD_CL_DEVICE_DEFAULT;
    if (!s) return 1;
    while (*rest == ' ') ++rest;
    n = strlen(rest);
    while (n > 0 && rest[n - 1] == ' ') --n;
    if (n == 0) return 1;
    colon = (const char *)memchr(rest, ':', n);
    if (colon) {
        if (!dsgd_cl__parse_uint(rest, (size_t)(colon - rest), &sp->platform)) return 0;
        n -= (size_t)(colon - rest) + 1;
        rest = colon + 1;
        if (n == 0) return 0;
    }
    if (rest[0] >= '0' && rest[0] <= '9') return dsgd_cl__parse_uint(rest, n, &sp->index);
    if (!dsgd_cl__parse_type(rest, n, &sp->type)) return 0;
    sp->type_given = sp->type != DSGD_CL_DEVICE_DEFAULT;
    return 1;
}

static int dsgd_cl__type_matches(cl_device_id d, dsgd_cl_device_type t) {
    cl_device_type dt = 0;
    if (t == DSGD_CL_DEVICE_ALL || t == DSGD_CL_DEVICE_DEFAULT) return 1;
    if (clGetDeviceInfo(d, CL_DEVICE_TYPE, sizeof(dt), &dt, NULL) != CL_SUCCESS) return 0;
    if (t == DSGD_CL_DEVICE_GPU) return (dt & CL_DEVICE_TYPE_GPU) != 0;
    if (t == DSGD_CL_DEVICE_CPU) return (dt & CL_DEVICE_TYPE_CPU) != 0;
    return (dt & CL_DEVICE_TYPE_ACCELERATOR) != 0;
}

/* >>program ----------------------------------------------------------------- */

/* A failed clBuildProgram: logs every device's build log and records the
   error with the first log in its message. */
static dsgd_result dsgd_cl__build_failed(dsgd_ctx *ctx, dsgd_cl_context *c, cl_int err, const char *options) {
    char head[640];
    int i;
    head[0] = '\0';
    for (i = 0; i < c->num_devices; ++i) {
        size_t need = 0;
        char *log;
        if (clGetProgramBuildInfo(c->program, c->devices[i], CL_PROGRAM_BUILD_LOG, 0, NULL, &need) != CL_SUCCESS ||
            need <= 1)
            continue;
        log = (char *)DSGD_MALLOC(need + 1);
        if (!log) continue;
        if (clGetProgramBuildInfo(c->program, c->devices[i], CL_PROGRAM_BUILD_LOG, need, log, NULL) == CL_SUCCESS) {
            log[need] = '\0';
            dsgd_ctx_log(ctx, DSGD_LOG_ERROR, "OpenCL build log of the distsgd kernels for %s:\n%s",
                         c->info[i].device_name, log);
            if (!head[0]) dsgd_cl__copy_str(head, sizeof(head), log);
        }
        DSGD_FREE(log);
    }
    return dsgd_ctx_set_error(ctx, err == CL_OUT_OF_HOST_MEMORY ? DSGD_ERR_OUT_OF_MEMORY : DSGD_ERR_BACKEND,
                              "clBuildProgram(distsgd kernels, options \"%s\"): %s (%d); build log: %s", options,
                              dsgd_cl_error_string(err), err, head[0] ? head : "(empty)");
}

/* Builds our kernels into c->program for every device of c. On failure
   c->program may be left for dsgd_cl_context_destroy to release. */
static dsgd_result dsgd_cl__build(dsgd_ctx *ctx, dsgd_cl_context *c, const char *user_options) {
    cl_int err;
    char *options;
    size_t olen;
    int correctly_rounded = 1, i;
    dsgd_result r = DSGD_OK;
    c->program = clCreateProgramWithSource(c->context, DSGD_CL__NSOURCE, (const char **)dsgd_cl__source, NULL, &err);
    if (err != CL_SUCCESS) {
        c->program = NULL;
        return dsgd_cl__fail(ctx, err, "clCreateProgramWithSource", "distsgd kernels");
    }
    for (i = 0; i < c->num_devices; ++i) {
        cl_device_fp_config fp = 0;
        if (clGetDeviceInfo(c->devices[i], CL_DEVICE_SINGLE_FP_CONFIG, sizeof(fp), &fp, NULL) != CL_SUCCESS ||
            !(fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT))
            correctly_rounded = 0;
    }
    olen = 96 + (user_options ? strlen(user_options) : 0);
    options = (char *)DSGD_MALLOC(olen);
    if (!options)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_context_create: clBuildProgram options");
    snprintf(options, olen, "%s%s%s", c->fp64 ? "-DDSGD_CL_FP64=1 " : "",
             correctly_rounded ? "-cl-fp32-correctly-rounded-divide-sqrt " : "", user_options ? user_options : "");
    err = clBuildProgram(c->program, (cl_uint)c->num_devices, c->devices, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        r = dsgd_cl__build_failed(ctx, c, err, options);
        clReleaseProgram(c->program);
        c->program = NULL;
    }
    DSGD_FREE(options);
    return r;
}

/* >>context creation -------------------------------------------------------- */
/* dsgd_cl_context_create's phases, in order. Each records its error on ctx;
   once the context struct exists, dsgd_cl_context_destroy releases whatever
   the phases before the failing one created. */

/* The device spec: desc.device, else the environment (see DEVICES). */
static dsgd_result dsgd_cl__read_spec(dsgd_ctx *ctx, const dsgd_cl_context_desc *d, dsgd_cl__spec *sp) {
    const char *spec = d->device, *spec_src = "desc.device";
    const char *ep, *et;
    if (!spec) {
        spec = getenv("DSGD_CL_DEVICE");
        spec_src = "DSGD_CL_DEVICE";
    }
    if (!dsgd_cl__parse_spec(spec, sp))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "OpenCL device spec '%s' (%s) is not one of: default, gpu, cpu, "
                                  "accelerator, all, N, P:N, P:TYPE",
                                  spec, spec_src);
    if (d->device) return DSGD_OK;
    ep = getenv("DSGD_CL_PLATFORM");
    et = getenv("DSGD_CL_DEVICE_TYPE");
    if (sp->platform < 0 && ep && *ep) {
        if (!dsgd_cl__parse_uint(ep, strlen(ep), &sp->platform))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "DSGD_CL_PLATFORM='%s' is not a platform index", ep);
    }
    if (!sp->type_given && sp->index < 0 && et && *et) {
        if (!dsgd_cl__parse_type(et, strlen(et), &sp->type))
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                      "DSGD_CL_DEVICE_TYPE='%s' is not gpu, cpu, accelerator or all", et);
        sp->type_given = sp->type != DSGD_CL_DEVICE_DEFAULT;
    }
    return DSGD_OK;
}

/* No device matches the spec: frees e and says why. */
static dsgd_result dsgd_cl__no_device(dsgd_ctx *ctx, const dsgd_cl__spec *sp, dsgd_cl__enum *e) {
    int n = e->count;
    dsgd_cl__enum_free(e);
    if (sp->index >= 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_BACKEND,
                                  "no OpenCL device %d%s (%d device%s found; dsgd_cl_list_devices "
                                  "lists them)",
                                  sp->index, sp->platform >= 0 ? " on the requested platform" : "", n,
                                  n == 1 ? "" : "s");
    if (n == 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_BACKEND,
                                  "no OpenCL device found (the platforms list none; on PoCL a missing "
                                  "device often means POCL_CACHE_DIR is not writable: POCL_DEBUG=err says "
                                  "why)");
    return dsgd_ctx_set_error(ctx, DSGD_ERR_BACKEND,
                              "no OpenCL device of type %s%s (%d device%s found; dsgd_cl_list_devices "
                              "lists them)",
                              dsgd_cl_device_type_name(sp->type),
                              sp->platform >= 0 ? " on the requested platform" : "", n, n == 1 ? "" : "s");
}

/* Enumerates the devices into e and picks the one sp names (*chosen, an index
   into e). A DEFAULT spec without an index becomes GPU when the platform(s)
   in question have one, else ALL. On failure e holds nothing. */
static dsgd_result dsgd_cl__pick_device(dsgd_ctx *ctx, dsgd_cl__spec *sp, dsgd_cl__enum *e, int *chosen) {
    cl_int plat_err = CL_SUCCESS;
    int i, seen = 0, any_gpu = 0;
    dsgd_result r = dsgd_cl__enumerate(ctx, "dsgd_cl_context_create", e, &plat_err);
    if (r != DSGD_OK) return r;
    if (e->num_platforms == 0) {
        dsgd_cl__enum_free(e);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_BACKEND,
                                  "no OpenCL platform found (clGetPlatformIDs: %s (%d)): install an "
                                  "OpenCL driver (ICD), e.g. the GPU vendor's or pocl-opencl-icd, and "
                                  "check /etc/OpenCL/vendors",
                                  dsgd_cl_error_string(plat_err), plat_err);
    }
    if (sp->platform >= e->num_platforms) {
        int np = e->num_platforms;
        dsgd_cl__enum_free(e);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_BACKEND, "OpenCL platform %d requested, but there %s %d",
                                  sp->platform, np == 1 ? "is" : "are", np);
    }
    if (!sp->type_given && sp->index < 0) {
        for (i = 0; i < e->count; ++i)
            if ((sp->platform < 0 || e->plat_index[i] == sp->platform) &&
                dsgd_cl__type_matches(e->devices[i], DSGD_CL_DEVICE_GPU))
                any_gpu = 1;
        sp->type = any_gpu ? DSGD_CL_DEVICE_GPU : DSGD_CL_DEVICE_ALL;
    }
    *chosen = -1;
    for (i = 0; i < e->count && *chosen < 0; ++i) {
        int pos;
        if (sp->platform >= 0 && e->plat_index[i] != sp->platform) continue;
        if (!dsgd_cl__type_matches(e->devices[i], sp->type)) continue;
        pos = sp->platform >= 0 ? e->dev_index[i] : i;
        if (sp->index >= 0) {
            /* an index counts devices of the platform (P:N) or of the list (N) */
            if (sp->type_given ? seen++ == sp->index : pos == sp->index) *chosen = i;
        } else {
            *chosen = i;
        }
    }
    return *chosen < 0 ? dsgd_cl__no_device(ctx, sp, e) : DSGD_OK;
}

/* Appends device i of e to c's devices, with its place in the list. */
static void dsgd_cl__add_device(dsgd_cl_context *c, const dsgd_cl__enum *e, int i) {
    c->devices[c->num_devices] = e->devices[i];
    c->info[c->num_devices].index = i;
    c->info[c->num_devices].platform_index = e->plat_index[i];
    c->info[c->num_devices].device_index = e->dev_index[i];
    ++c->num_devices;
}

/* The chosen device, then more of its platform and type in list order, up to
   want devices; then their descriptions and whether all have fp64. */
static void dsgd_cl__take_devices(dsgd_cl_context *c, const dsgd_cl__enum *e, const dsgd_cl__spec *sp, int chosen,
                                  int want) {
    int i;
    c->platform = e->dev_platform[chosen];
    dsgd_cl__add_device(c, e, chosen);
    for (i = 0; i < e->count && c->num_devices < want; ++i) {
        dsgd_cl_device_type t = sp->type;
        if (i == chosen || e->dev_platform[i] != c->platform) continue;
        if (t == DSGD_CL_DEVICE_DEFAULT || (!sp->type_given && sp->index >= 0)) {
            /* same type as the chosen device */
            cl_device_type a = 0, b = 0;
            clGetDeviceInfo(e->devices[chosen], CL_DEVICE_TYPE, sizeof(a), &a, NULL);
            clGetDeviceInfo(e->devices[i], CL_DEVICE_TYPE, sizeof(b), &b, NULL);
            if (a != b) continue;
        } else if (!dsgd_cl__type_matches(e->devices[i], t)) {
            continue;
        }
        dsgd_cl__add_device(c, e, i);
    }
    c->fp64 = 1;
    for (i = 0; i < c->num_devices; ++i) {
        int idx = c->info[i].index, pi = c->info[i].platform_index, di = c->info[i].device_index;
        dsgd_cl__fill_info(c->platform, c->devices[i], &c->info[i]);
        c->info[i].index = idx;
        c->info[i].platform_index = pi;
        c->info[i].device_index = di;
        if (!c->info[i].fp64) c->fp64 = 0;
    }
}

/* One cl_context over c's devices. */
static dsgd_result dsgd_cl__open_context(dsgd_ctx *ctx, dsgd_cl_context *c) {
    cl_context_properties props[3];
    cl_int err;
    props[0] = (cl_context_properties)CL_CONTEXT_PLATFORM;
    props[1] = (cl_context_properties)c->platform;
    props[2] = 0;
    c->context = clCreateContext(props, (cl_uint)c->num_devices, c->devices, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        c->context = NULL;
        return dsgd_cl__fail(ctx, err, "clCreateContext", c->info[0].device_name);
    }
    return DSGD_OK;
}

/* Resolves the queue policy (see QUEUES) and, for PER_DEVICE, creates each
   device's shared queue.
   PoCL 3.1 aborts (pocl_release_dlhandle_cache: "Assertion
   `found->ref_count > 0' failed") when one kernel runs at different grid
   sizes from several queues at once: its cache of compiled work-group
   functions takes a reference on one entry and may drop it on another.
   2 in 12 runs of the 4-replica demo died so. One in-order queue per
   device runs one command at a time and avoids it. */
static dsgd_result dsgd_cl__create_queues(dsgd_ctx *ctx, dsgd_cl_context *c, dsgd_cl_queues policy) {
    cl_int err;
    int i;
    c->queues = policy != DSGD_CL_QUEUES_AUTO ? policy
                : strstr(c->info[0].platform_name, "Portable Computing Language") ? DSGD_CL_QUEUES_PER_DEVICE
                                                                                   : DSGD_CL_QUEUES_PER_BACKEND;
    for (i = 0; i < c->num_devices && c->queues == DSGD_CL_QUEUES_PER_DEVICE; ++i) {
        c->dev_queue[i] = clCreateCommandQueue(c->context, c->devices[i], 0, &err);
        if (err != CL_SUCCESS) {
            c->dev_queue[i] = NULL;
            return dsgd_cl__fail(ctx, err, "clCreateCommandQueue", c->info[i].device_name);
        }
    }
    return DSGD_OK;
}

static void dsgd_cl__apply_cache(dsgd_ctx *ctx, dsgd_cl_context *c, int i, const char *desc_path);

/* Logs each device and, with tuning AUTO, applies its tuning cache (a cache
   that cannot be applied is a warning, not an error). */
static void dsgd_cl__announce(dsgd_ctx *ctx, dsgd_cl_context *c, const dsgd_cl_context_desc *d) {
    int i;
    for (i = 0; i < c->num_devices; ++i) {
        dsgd_ctx_log(ctx, DSGD_LOG_INFO, "OpenCL device %d: %s (%s, %s, driver %s)%s", i,
                     c->info[i].device_name, dsgd_cl_device_type_name(c->info[i].type),
                     c->info[i].platform_name, c->info[i].driver_version,
                     c->fp64 ? "" : "; no cl_khr_fp64: losses and norms accumulate in float");
        if (d->tuning == DSGD_CL_TUNING_AUTO) dsgd_cl__apply_cache(ctx, c, i, d->tune_cache);
    }
}

DSGD_API dsgd_result dsgd_cl_context_create(dsgd_ctx *ctx, const dsgd_cl_context_desc *desc,
                                            dsgd_cl_context **out) {
    dsgd_cl_context_desc d;
    dsgd_cl__spec sp;
    dsgd_cl__enum e;
    dsgd_cl_context *c;
    dsgd_result r;
    int chosen = -1; /* set by dsgd_cl__pick_device; initialised for gcc -O1 -Wmaybe-uninitialized */
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_context_create: out is NULL");
    *out = NULL;
    memset(&d, 0, sizeof(d));
    if (desc) d = *desc;
    if (d.max_devices < 0 || d.max_devices > DSGD_CL_MAX_DEVICES)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_context_create: max_devices %d outside 0..%d", d.max_devices,
                                  DSGD_CL_MAX_DEVICES);
    if ((r = dsgd_cl__read_spec(ctx, &d, &sp)) != DSGD_OK) return r;
    if ((r = dsgd_cl__pick_device(ctx, &sp, &e, &chosen)) != DSGD_OK) return r;
    c = (dsgd_cl_context *)DSGD_MALLOC(sizeof(*c));
    if (!c) {
        dsgd_cl__enum_free(&e);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_context_create");
    }
    memset(c, 0, sizeof(*c));
    dsgd_cl__take_devices(c, &e, &sp, chosen, d.max_devices ? d.max_devices : 1);
    dsgd_cl__enum_free(&e);
    r = dsgd_cl__open_context(ctx, c);
    if (r == DSGD_OK) r = dsgd_cl__build(ctx, c, d.build_options);
    if (r == DSGD_OK) r = dsgd_cl__create_queues(ctx, c, d.queues);
    if (r != DSGD_OK) {
        dsgd_cl_context_destroy(c);
        return r;
    }
    dsgd_cl__announce(ctx, c, &d);
    *out = c;
    return DSGD_OK;
}

DSGD_API void dsgd_cl_context_destroy(dsgd_cl_context *c) {
    int i;
    if (!c) return;
    for (i = 0; i < c->num_devices; ++i)
        if (c->dev_queue[i]) clReleaseCommandQueue(c->dev_queue[i]);
    if (c->program) clReleaseProgram(c->program);
    if (c->context) clReleaseContext(c->context);
    DSGD_FREE(c);
}

DSGD_API int dsgd_cl_context_num_devices(const dsgd_cl_context *c) { return c ? c->num_devices : 0; }

DSGD_API const dsgd_cl_device_info *dsgd_cl_context_device_info(const dsgd_cl_context *c, int i) {
    return (c && i >= 0 && i < c->num_devices) ? &c->info[i] : NULL;
}

DSGD_API int dsgd_cl_context_gemm_tuned(const dsgd_cl_context *c, int i) {
    return (c && i >= 0 && i < c->num_devices) ? c->tuned[i] : 0;
}

DSGD_API int dsgd_cl_context_fp64(const dsgd_cl_context *c) { return c ? c->fp64 : 0; }

DSGD_API dsgd_cl_queues dsgd_cl_context_queues(const dsgd_cl_context *c) {
    return c ? c->queues : DSGD_CL_QUEUES_PER_BACKEND;
}

DSGD_API cl_context dsgd_cl_context_handle(const dsgd_cl_context *c) { return c ? c->context : NULL; }

DSGD_API cl_device_id dsgd_cl_context_device(const dsgd_cl_context *c, int i) {
    return (c && i >= 0 && i < c->num_devices) ? c->devices[i] : NULL;
}

/* For the backend (backend.h): the program of our kernels, built for every
   device; device i's shared queue under DSGD_CL_QUEUES_PER_DEVICE (NULL
   under PER_BACKEND: each backend then opens its own). */
static cl_program dsgd_cl__context_program(const dsgd_cl_context *c) { return c->program; }
static cl_command_queue dsgd_cl__context_shared_queue(const dsgd_cl_context *c, int i) { return c->dev_queue[i]; }

/* >>gemm parameters --------------------------------------------------------- */

static const char *const dsgd_cl__xgemm_names[DSGD_CL_XGEMM_NPARAMS] = {
    "GEMMK", "KREG", "KWG", "KWI", "MDIMA", "MDIMC", "MWG", "NDIMB",
    "NDIMC", "NWG",  "SA",  "SB",  "STRM",  "STRN",  "VWM", "VWN"};
static const char *const dsgd_cl__direct_names[DSGD_CL_DIRECT_NPARAMS] = {
    "KWID", "MDIMAD", "MDIMCD", "NDIMBD", "NDIMCD", "PADA", "PADB", "VWMD", "VWND", "WGD"};

enum {
    DSGD_CL__GEMMK = 0, DSGD_CL__KREG, DSGD_CL__KWG, DSGD_CL__KWI, DSGD_CL__MDIMA, DSGD_CL__MDIMC,
    DSGD_CL__MWG, DSGD_CL__NDIMB, DSGD_CL__NDIMC, DSGD_CL__NWG, DSGD_CL__SA, DSGD_CL__SB,
    DSGD_CL__STRM, DSGD_CL__STRN, DSGD_CL__VWM, DSGD_CL__VWN
};
enum {
    DSGD_CL__KWID = 0, DSGD_CL__MDIMAD, DSGD_CL__MDIMCD, DSGD_CL__NDIMBD, DSGD_CL__NDIMCD,
    DSGD_CL__PADA, DSGD_CL__PADB, DSGD_CL__VWMD, DSGD_CL__VWND, DSGD_CL__WGD
};

DSGD_API const char *dsgd_cl_xgemm_param_name(int i) {
    return i >= 0 && i < DSGD_CL_XGEMM_NPARAMS ? dsgd_cl__xgemm_names[i] : NULL;
}

DSGD_API const char *dsgd_cl_direct_param_name(int i) {
    return i >= 0 && i < DSGD_CL_DIRECT_NPARAMS ? dsgd_cl__direct_names[i] : NULL;
}

static int dsgd_cl__pow2(size_t v) { return v >= 1 && v <= 1024 && (v & (v - 1)) == 0; }

DSGD_API int dsgd_cl_gemm_params_valid(const dsgd_cl_gemm_params *p) {
    if (!p) return 0;
    if (p->xgemm_set) {
        const size_t *x = p->xgemm;
        int i;
        static const int pow2_params[] = {DSGD_CL__KWG, DSGD_CL__KWI, DSGD_CL__MDIMA, DSGD_CL__MDIMC,
                                          DSGD_CL__MWG, DSGD_CL__NDIMB, DSGD_CL__NDIMC, DSGD_CL__NWG,
                                          DSGD_CL__VWM, DSGD_CL__VWN, DSGD_CL__KREG};
        for (i = 0; i < (int)(sizeof(pow2_params) / sizeof(pow2_params[0])); ++i)
            if (!dsgd_cl__pow2(x[pow2_params[i]])) return 0;
        if (x[DSGD_CL__GEMMK] > 1 || x[DSGD_CL__SA] > 1 || x[DSGD_CL__SB] > 1 || x[DSGD_CL__STRM] > 1 ||
            x[DSGD_CL__STRN] > 1 || x[DSGD_CL__VWM] > 16 || x[DSGD_CL__VWN] > 16)
            return 0;
        if (x[DSGD_CL__KWG] % x[DSGD_CL__KWI]) return 0;
        if (x[DSGD_CL__MWG] % (x[DSGD_CL__MDIMC] * x[DSGD_CL__VWM])) return 0;
        if (x[DSGD_CL__NWG] % (x[DSGD_CL__NDIMC] * x[DSGD_CL__VWN])) return 0;
        if (x[DSGD_CL__MWG] % (x[DSGD_CL__MDIMA] * x[DSGD_CL__VWM])) return 0;
        if (x[DSGD_CL__NWG] % (x[DSGD_CL__NDIMB] * x[DSGD_CL__VWN])) return 0;
        if (x[DSGD_CL__GEMMK] == 0) {
            size_t t = x[DSGD_CL__MDIMC] * x[DSGD_CL__NDIMC];
            if (t % x[DSGD_CL__MDIMA] || t % x[DSGD_CL__NDIMB]) return 0;
            if (x[DSGD_CL__KWG] % (t / x[DSGD_CL__MDIMA]) || x[DSGD_CL__KWG] % (t / x[DSGD_CL__NDIMB])) return 0;
        } else {
            if (x[DSGD_CL__KREG] % x[DSGD_CL__VWN]) return 0;
            if (x[DSGD_CL__MDIMA] != x[DSGD_CL__MDIMC] || x[DSGD_CL__NDIMB] != x[DSGD_CL__NDIMC]) return 0;
            /* CLBlast 1.5.3's GEMMK=1 path computes wrong values on padded
               (non-multiple) sizes unless the tile is square, and crashes
               with tiles below 16 (found by the cl_tune tuner's checks on PoCL) */
            if (x[DSGD_CL__MWG] != x[DSGD_CL__NWG] || x[DSGD_CL__MWG] < 16) return 0;
        }
    }
    if (p->direct_set) {
        const size_t *x = p->direct;
        int i;
        for (i = 0; i < DSGD_CL_DIRECT_NPARAMS; ++i) {
            if (i == DSGD_CL__PADA || i == DSGD_CL__PADB) {
                if (x[i] > 1) return 0;
            } else if (!dsgd_cl__pow2(x[i])) {
                return 0;
            }
        }
        if (x[DSGD_CL__WGD] % x[DSGD_CL__KWID]) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__MDIMCD] * x[DSGD_CL__VWMD])) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__NDIMCD] * x[DSGD_CL__VWND])) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__MDIMAD] * x[DSGD_CL__VWMD])) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__NDIMBD] * x[DSGD_CL__VWND])) return 0;
        {
            size_t t = x[DSGD_CL__MDIMCD] * x[DSGD_CL__NDIMCD];
            if (t % x[DSGD_CL__MDIMAD] || t % x[DSGD_CL__NDIMBD]) return 0;
            if (x[DSGD_CL__WGD] % (t / x[DSGD_CL__MDIMAD]) || x[DSGD_CL__WGD] % (t / x[DSGD_CL__NDIMBD])) return 0;
        }
    }
    if (p->min_indirect_set && p->min_indirect > 100000) return 0;
    return 1;
}

DSGD_API dsgd_result dsgd_cl_apply_gemm_params(dsgd_ctx *ctx, dsgd_cl_context *c, int device,
                                               const dsgd_cl_gemm_params *p) {
    CLBlastStatusCode st;
    if (!c || !p || device < 0 || device >= c->num_devices)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_apply_gemm_params: bad arguments");
    if (!dsgd_cl_gemm_params_valid(p))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_apply_gemm_params: the parameters break CLBlast's rules");
    if (p->xgemm_set) {
        pthread_mutex_lock(&dsgd_cl__clblast_lock);
        st = CLBlastOverrideParameters(c->devices[device], "Xgemm", CLBlastPrecisionSingle, DSGD_CL_XGEMM_NPARAMS,
                                       (const char **)dsgd_cl__xgemm_names, p->xgemm);
        pthread_mutex_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "Xgemm");
    }
    if (p->direct_set) {
        pthread_mutex_lock(&dsgd_cl__clblast_lock);
        st = CLBlastOverrideParameters(c->devices[device], "XgemmDirect", CLBlastPrecisionSingle,
                                       DSGD_CL_DIRECT_NPARAMS, (const char **)dsgd_cl__direct_names, p->direct);
        pthread_mutex_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "XgemmDirect");
    }
    if (p->min_indirect_set) {
        const char *name[1];
        size_t v[1];
        name[0] = "XGEMM_MIN_INDIRECT_SIZE";
        v[0] = p->min_indirect;
        pthread_mutex_lock(&dsgd_cl__clblast_lock);
        st = CLBlastOverrideParameters(c->devices[device], "GemmRoutine", CLBlastPrecisionSingle, 1, name, v);
        pthread_mutex_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "GemmRoutine");
    }
    if (p->xgemm_set || p->direct_set || p->min_indirect_set) c->tuned[device] = 1;
    return DSGD_OK;
}

/* FNV-1a, 64-bit: names the cache file after the device's identity. */
static uint64_t dsgd_cl__fnv(uint64_t h, const char *s) {
    if (h == 0) h = 1469598103934665603ull;
    for (; *s; ++s) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    h ^= 0xff; /* field separator */
    h *= 1099511628211ull;
    return h;
}

static int dsgd_cl__is_dir(const char *path) {
    struct stat st;
    size_t n = strlen(path);
    if (n > 0 && path[n - 1] == '/') return 1;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

DSGD_API dsgd_result dsgd_cl_tune_cache_path(const dsgd_cl_context *c, int device, const char *desc_path,
                                             char *buf, size_t cap) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(c, device);
    const char *base = desc_path, *sep;
    char dir[1024], name[96];
    uint64_t h;
    size_t j = 0;
    const char *s;
    int k;
    if (!info || !buf || cap == 0) return DSGD_ERR_INVALID_ARGUMENT;
    buf[0] = '\0';
    if (!base || !*base) base = getenv("DSGD_CL_TUNE_CACHE");
    if (base && *base && !dsgd_cl__is_dir(base)) {
        k = snprintf(buf, cap, "%s", base);
        return (k < 0 || (size_t)k >= cap) ? DSGD_ERR_INVALID_ARGUMENT : DSGD_OK;
    }
    if (base && *base) {
        k = snprintf(dir, sizeof(dir), "%s", base);
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && xdg[0] == '/')
            k = snprintf(dir, sizeof(dir), "%s/distsgd", xdg);
        else if (home && *home)
            k = snprintf(dir, sizeof(dir), "%s/.cache/distsgd", home);
        else
            return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (k < 0 || (size_t)k >= sizeof(dir)) return DSGD_ERR_INVALID_ARGUMENT;
    /* a readable slug of the device name, then a hash of its identity */
    for (s = info->device_name; *s && j < 40; ++s) {
        char ch = *s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '-')
            name[j++] = ch;
        else if (ch >= 'A' && ch <= 'Z')
            name[j++] = (char)(ch - 'A' + 'a');
        else if (j > 0 && name[j - 1] != '_')
            name[j++] = '_';
    }
    name[j] = '\0';
    h = dsgd_cl__fnv(0, info->platform_name);
    h = dsgd_cl__fnv(h, info->device_name);
    h = dsgd_cl__fnv(h, info->driver_version);
    sep = (dir[0] && dir[strlen(dir) - 1] == '/') ? "" : "/";
    k = snprintf(buf, cap, "%s%sclblast-gemm-%s-%08lx%08lx.txt", dir, sep, name,
                 (unsigned long)(h >> 32), (unsigned long)(h & 0xffffffffu));
    return (k < 0 || (size_t)k >= cap) ? DSGD_ERR_INVALID_ARGUMENT : DSGD_OK;
}

#define DSGD_CL__CACHE_MAGIC "distsgd-clblast-gemm-cache 1"

/* Parses "NAME=VALUE NAME=VALUE ..." into vals[] following names[]; every
   name exactly once. */
static int dsgd_cl__parse_kv(const char *s, const char *const *names, int count, size_t *vals) {
    int seen[32], i, total = 0;
    memset(seen, 0, sizeof(seen));
    while (*s) {
        const char *eq, *end;
        size_t n;
        unsigned long v = 0;
        int digits = 0;
        while (*s == ' ') ++s;
        if (!*s) break;
        eq = strchr(s, '=');
        if (!eq) return 0;
        n = (size_t)(eq - s);
        for (i = 0; i < count; ++i)
            if (strlen(names[i]) == n && strncmp(names[i], s, n) == 0) break;
        if (i == count || seen[i]) return 0;
        for (end = eq + 1; *end >= '0' && *end <= '9'; ++end) {
            if (++digits > 6) return 0;
            v = v * 10 + (unsigned long)(*end - '0');
        }
        if (digits == 0 || (*end != ' ' && *end != '\0')) return 0;
        vals[i] = (size_t)v;
        seen[i] = 1;
        ++total;
        s = end;
    }
    return total == count;
}

/* Parses the text [text, text + len) of a tuning cache file: its parameters
   into *p and the platform, device and driver it was made for into plat,
   dev and drv (DSGD_CL_MAX_NAME each). `what` (the path) names it in
   messages. Only a format error (DSGD_ERR_FORMAT, with the line) rejects
   it; nothing is allocated. The loader reads the file and calls this; the
   fuzzer calls it on anything. */
static dsgd_result dsgd_cl__parse_gemm_params(dsgd_ctx *ctx, const char *text, size_t len, const char *what,
                                              dsgd_cl_gemm_params *p, char *plat, char *dev, char *drv) {
    char line[1024];
    size_t pos = 0;
    int lineno = 0, have_end = 0, have_plat = 0, have_dev = 0, have_drv = 0;
    memset(p, 0, sizeof(*p));
    plat[0] = dev[0] = drv[0] = '\0';
#define DSGD_CL__BAD(why) return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s:%d: %s", what, lineno, why)
    while (pos < len) {
        const char *nl = (const char *)memchr(text + pos, '\n', len - pos);
        size_t n = (nl ? (size_t)(nl - text) : len) - pos;
        ++lineno;
        if (n >= sizeof(line) - 1) DSGD_CL__BAD("line too long");
        if (memchr(text + pos, '\0', n)) DSGD_CL__BAD("NUL byte");
        memcpy(line, text + pos, n);
        line[n] = '\0';
        pos += n + (nl ? 1 : 0);
        while (n > 0 && line[n - 1] == '\r') line[--n] = '\0';
        if (have_end) {
            if (n) DSGD_CL__BAD("text after 'end'");
            continue;
        }
        if (lineno == 1) {
            if (strcmp(line, DSGD_CL__CACHE_MAGIC) != 0)
                DSGD_CL__BAD("not a distsgd CLBlast tuning file (first line is not '" DSGD_CL__CACHE_MAGIC "')");
            continue;
        }
        if (n == 0 || line[0] == '#') continue;
        if (strncmp(line, "platform ", 9) == 0) {
            dsgd_cl__copy_str(plat, DSGD_CL_MAX_NAME, line + 9);
            have_plat = 1;
        } else if (strncmp(line, "device ", 7) == 0) {
            dsgd_cl__copy_str(dev, DSGD_CL_MAX_NAME, line + 7);
            have_dev = 1;
        } else if (strncmp(line, "driver ", 7) == 0) {
            dsgd_cl__copy_str(drv, DSGD_CL_MAX_NAME, line + 7);
            have_drv = 1;
        } else if (strncmp(line, "clblast ", 8) == 0) {
            /* informational */
        } else if (strncmp(line, "Xgemm ", 6) == 0) {
            if (p->xgemm_set || !dsgd_cl__parse_kv(line + 6, dsgd_cl__xgemm_names, DSGD_CL_XGEMM_NPARAMS, p->xgemm))
                DSGD_CL__BAD("bad Xgemm line (want each of GEMMK KREG KWG KWI MDIMA MDIMC MWG NDIMB NDIMC NWG SA SB "
                             "STRM STRN VWM VWN once, as NAME=VALUE)");
            p->xgemm_set = 1;
        } else if (strncmp(line, "XgemmDirect ", 12) == 0) {
            if (p->direct_set ||
                !dsgd_cl__parse_kv(line + 12, dsgd_cl__direct_names, DSGD_CL_DIRECT_NPARAMS, p->direct))
                DSGD_CL__BAD("bad XgemmDirect line");
            p->direct_set = 1;
        } else if (strncmp(line, "GemmRoutine ", 12) == 0) {
            static const char *const mi[1] = {"XGEMM_MIN_INDIRECT_SIZE"};
            if (p->min_indirect_set || !dsgd_cl__parse_kv(line + 12, mi, 1, &p->min_indirect))
                DSGD_CL__BAD("bad GemmRoutine line");
            p->min_indirect_set = 1;
        } else if (strcmp(line, "end") == 0) {
            have_end = 1;
        } else {
            DSGD_CL__BAD("unknown line");
        }
    }
    if (lineno == 0) DSGD_CL__BAD("empty file");
    if (!have_end) DSGD_CL__BAD("no 'end' line (truncated?)");
    if (!have_plat || !have_dev || !have_drv) DSGD_CL__BAD("missing platform, device or driver line");
    if (!dsgd_cl_gemm_params_valid(p)) DSGD_CL__BAD("parameters break CLBlast's divisibility rules");
#undef DSGD_CL__BAD
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cl_load_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device, const char *path,
                                              dsgd_cl_gemm_params *out) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(c, device);
    char plat[DSGD_CL_MAX_NAME], dev[DSGD_CL_MAX_NAME], drv[DSGD_CL_MAX_NAME], *text;
    dsgd_cl_gemm_params p;
    dsgd_result r;
    size_t len = 0;
    if (!info || !path || !out)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_load_gemm_params: bad arguments");
    memset(out, 0, sizeof(*out));
    /* a regular file only: a FIFO fails at once instead of blocking */
    if (!(text = dsgd__read_file(ctx, path, &len)))
        return dsgd_ctx_last_result(ctx) ? dsgd_ctx_last_result(ctx) : DSGD_ERR_IO; /* ctx may be NULL */
    r = dsgd_cl__parse_gemm_params(ctx, text, len, path, &p, plat, dev, drv);
    DSGD_FREE(text);
    if (r != DSGD_OK) return r;
    if (strcmp(plat, info->platform_name) != 0 || strcmp(dev, info->device_name) != 0 ||
        strcmp(drv, info->driver_version) != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE,
                                  "%s was tuned for '%s' (driver %s, platform '%s'), not for this device '%s' "
                                  "(driver %s, platform '%s')",
                                  path, dev, drv, plat, info->device_name, info->driver_version,
                                  info->platform_name);
    *out = p;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cl_save_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device, const char *path,
                                              const dsgd_cl_gemm_params *p, const char *note) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(c, device);
    char tmp[1100], dir[1024];
    FILE *f;
    int i, ok;
    char *slash;
    if (!info || !path || !p || strlen(path) >= sizeof(dir))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_save_gemm_params: bad arguments");
    if (!dsgd_cl_gemm_params_valid(p))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_save_gemm_params: the parameters break CLBlast's rules");
    dsgd_cl__copy_str(dir, sizeof(dir), path);
    slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        /* mkdir -p of the file's directory */
        char *q;
        *slash = '\0';
        for (q = dir + 1;; ++q) {
            if (*q == '/' || *q == '\0') {
                char keep = *q;
                *q = '\0';
                if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                    return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot create the directory: %s", dir,
                                              strerror(errno));
                *q = keep;
                if (keep == '\0') break;
            }
        }
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f) return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    fprintf(f, "%s\n", DSGD_CL__CACHE_MAGIC);
    fprintf(f, "# CLBlast GEMM parameters for one OpenCL device, written by distsgd's tuner.\n");
    if (note) {
        const char *s = note;
        fputs("# ", f);
        for (; *s; ++s) fputc(*s == '\n' ? ' ' : *s, f);
        fputc('\n', f);
    }
    fprintf(f, "platform %s\ndevice %s\ndriver %s\nclblast %d.%d.%d\n", info->platform_name, info->device_name,
            info->driver_version, CLBLAST_VERSION_MAJOR, CLBLAST_VERSION_MINOR, CLBLAST_VERSION_PATCH);
    if (p->xgemm_set) {
        fputs("Xgemm", f);
        for (i = 0; i < DSGD_CL_XGEMM_NPARAMS; ++i)
            fprintf(f, " %s=%lu", dsgd_cl__xgemm_names[i], (unsigned long)p->xgemm[i]);
        fputc('\n', f);
    }
    if (p->direct_set) {
        fputs("XgemmDirect", f);
        for (i = 0; i < DSGD_CL_DIRECT_NPARAMS; ++i)
            fprintf(f, " %s=%lu", dsgd_cl__direct_names[i], (unsigned long)p->direct[i]);
        fputc('\n', f);
    }
    if (p->min_indirect_set) fprintf(f, "GemmRoutine XGEMM_MIN_INDIRECT_SIZE=%lu\n", (unsigned long)p->min_indirect);
    fputs("end\n", f);
    ok = !ferror(f);
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return DSGD_OK;
}

/* Context creation: reads device i's cache file and applies it, or logs a
   warning saying why not and leaves CLBlast's defaults. The failure is not
   recorded as the caller's error: a scratch context collects its message. */
static void dsgd_cl__apply_cache(dsgd_ctx *ctx, dsgd_cl_context *c, int i, const char *desc_path) {
    char path[1100];
    dsgd_cl_gemm_params p;
    dsgd_ctx *scratch = NULL;
    dsgd_result r;
    const char *dev = c->info[i].device_name, *why;
    if (dsgd_cl_tune_cache_path(c, i, desc_path, path, sizeof(path)) != DSGD_OK) {
        dsgd_ctx_log(ctx, DSGD_LOG_WARN,
                     "no GEMM tuning cache location for %s (set DSGD_CL_TUNE_CACHE or HOME); using CLBlast's "
                     "default GEMM parameters",
                     dev);
        return;
    }
    if (dsgd_ctx_create(NULL, &scratch) != DSGD_OK) scratch = NULL;
    r = dsgd_cl_load_gemm_params(scratch, c, i, path, &p);
    if (r == DSGD_OK) r = dsgd_cl_apply_gemm_params(scratch, c, i, &p);
    if (r == DSGD_OK) {
        dsgd_ctx_log(ctx, DSGD_LOG_INFO, "applied tuned CLBlast GEMM parameters for %s from %s", dev, path);
    } else {
        why = r == DSGD_ERR_IO ? "missing" : r == DSGD_ERR_STATE ? "for another device" : "corrupt";
        dsgd_ctx_log(ctx, DSGD_LOG_WARN,
                     "GEMM tuning cache %s (%s): %s; using CLBlast's default GEMM parameters for %s (the cl_tune "
                     "tuner, `make tune`, tunes this device)",
                     why, dsgd_result_string(r), scratch ? dsgd_ctx_last_error(scratch) : path, dev);
    }
    dsgd_ctx_destroy(scratch);
}

#endif /* DSGD_CL__PART_CONTEXT_IMPL */
