/* distsgd/cl/context.h - the shared context: its devices and queues, our kernels built, GEMM parameters and their cache
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).
   The parts above hold the device list, the spec that picks devices and
   the error names (DEVICES, ERRORS: devices.h), and our kernels' source
   (PRECISION: kernels.h); this part opens the chosen devices in one
   cl_context, builds the kernels for them and applies their GEMM tuning.

   QUEUES

     dsgd_cl_context_desc.queues says which in-order command queue a backend
     enqueues on. PER_BACKEND: each backend creates its own, so replicas on
     one device overlap their kernels. PER_DEVICE: the backends on one device
     share one queue that the context owns, so their commands run one at a
     time, in the order the threads enqueue them (each backend's own commands
     stay in its program order; finish waits for all of them). AUTO, the
     default, resolves per device with dsgd_cl_auto_queues(): PER_DEVICE on
     PoCL's pthread driver (device names "pthread-..."; PoCL 4 renamed it
     "cpu-..."), PER_BACKEND everywhere else, PoCL's basic driver included;
     a context whose devices disagree gets PER_BACKEND.
       - PoCL 3.1's pthread driver aborts with "pocl_release_dlhandle_cache:
         Assertion `found->ref_count > 0' failed" when one kernel runs at
         different grid sizes from several queues at once (2 of 12 runs of
         the 4-replica demo died so, 0 of 36 with one queue); its kernels
         already spread over all of its threads, so one queue costs little.
       - PoCL 3.1's basic driver runs a command in the thread that enqueues
         it, and the commands that were waiting on it from inside that
         call; with one queue shared by several threads it deadlocks (the
         enqueuing thread waits on an event lock it holds itself), so
         PER_DEVICE there hangs the first time two replicas' commands
         queue up behind each other. Do not ask for PER_DEVICE on it.
     A backend created with profiling gets a queue of its own whatever the
     policy. dsgd_cl_context_queues() tells the policy in force.

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
     message saying why. So does a file whose parameters do not fit the
     device's limits (dsgd_cl_gemm_params_fit: work-group size, work-items
     per dimension, local memory, checked before anything is applied): a
     cache tuned with other limits (PoCL's POCL_MAX_WORK_GROUP_SIZE, say)
     would fail with CL_INVALID_WORK_GROUP_SIZE at the first GEMM it sends
     down the path it changed. desc.tuning = DSGD_CL_TUNING_OFF skips the file
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
*/
#ifndef DSGD_CL__PART_CONTEXT_DECL
#define DSGD_CL__PART_CONTEXT_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- context */

typedef enum dsgd_cl_tuning {
    DSGD_CL_TUNING_AUTO = 0, /* apply the device's tuning cache file if valid */
    DSGD_CL_TUNING_OFF       /* leave CLBlast's parameters alone, read no file */
} dsgd_cl_tuning;

/* Which command queue a backend enqueues on (see QUEUES). */
typedef enum dsgd_cl_queues {
    DSGD_CL_QUEUES_AUTO = 0,    /* per device: dsgd_cl_auto_queues() */
    DSGD_CL_QUEUES_PER_BACKEND, /* each backend its own in-order queue */
    DSGD_CL_QUEUES_PER_DEVICE   /* the backends on one device share one
                                   in-order queue, owned by the context */
} dsgd_cl_queues;

typedef struct dsgd_cl_context_desc {
    const char *device;    /* device spec (see DEVICES in devices.h); NULL:
                              the environment */
    int max_devices;       /* open up to this many devices (see DEVICES); 0: 1;
                              at most DSGD_CL_MAX_DEVICES */
    dsgd_cl_tuning tuning; /* default AUTO */
    const char *tune_cache; /* file or directory; NULL: $DSGD_CL_TUNE_CACHE, else
                               the user cache directory (see GEMM TUNING) */
    const char *build_options; /* appended to our kernels' clBuildProgram
                                  options (see PRECISION in kernels.h);
                                  NULL: none */
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
/* What DSGD_CL_QUEUES_AUTO resolves to for a device described by info (see
   QUEUES): DSGD_CL_QUEUES_PER_DEVICE for PoCL's pthread (or "cpu") driver,
   else DSGD_CL_QUEUES_PER_BACKEND (also for info NULL). It reads only
   info's platform_name and device_name.
   Errors: none. Thread safety: any thread. */
DSGD_API dsgd_cl_queues dsgd_cl_auto_queues(const dsgd_cl_device_info *info);
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
/* Checks p against the limits of the device info describes (see GEMM
   TUNING): each kernel's work-group (Xgemm MDIMC x NDIMC, XgemmDirect
   MDIMCD x NDIMCD) within max_work_group_size and, per dimension, within
   max_work_item_sizes; their local memory (Xgemm: KWG x MWG floats with SA,
   KWG x NWG with SB; XgemmDirect: WGD x (WGD + PADA) + WGD x (WGD + PADB))
   within local_mem_bytes; and, for a set with min_indirect (which sends
   GEMMs to CLBlast's indirect path, whose pad, copy and transpose kernels
   keep CLBlast's own 16 x 16 work-groups), at least 256 work-items and 16
   per dimension. A limit of 0 (the driver did not answer) is not checked.
   Returns 1 when p fits, 0 otherwise (and for p or info NULL); then, when
   why is non-NULL and cap > 0, writes the first limit broken to why
   (NUL-terminated, truncated to cap).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cl_gemm_params_fit(const dsgd_cl_gemm_params *p, const dsgd_cl_device_info *info, char *why,
                                     size_t cap);

/* Applies p to device i of c with CLBlastOverrideParameters (the parts whose
   *_set is non-zero) and marks the device tuned (dsgd_cl_context_gemm_tuned).
   Process-wide for that device; takes effect at the next GEMM (which
   compiles the kernels for the new parameters).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c or p NULL, device
   out of range, a set dsgd_cl_gemm_params_valid rejects or that does not
   fit the device, dsgd_cl_gemm_params_fit: nothing applied), DSGD_ERR_BACKEND
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

/* CLBlast 1.5 is not safe when several threads make their first calls at once:
   a call that compiles a routine or builds its parameter database stores it
   in CLBlast's caches, and concurrent stores free what another thread still
   uses (a use-after-free seen under ASan with one replica thread per
   backend; fixed in CLBlast after 1.5.3). Calls that find everything cached
   store nothing. So a backend makes a GEMM shape's first call, and every
   call after a parameter override, under this lock held exclusively (the
   overrides take it exclusively too and bump the epoch); once a shape has
   run on a backend, its calls take the lock shared, and replica threads
   never wait for one another. The only global state of distsgd. */
static pthread_rwlock_t dsgd_cl__clblast_lock = PTHREAD_RWLOCK_INITIALIZER;
static unsigned long dsgd_cl__clblast_epoch; /* parameter overrides so far (under the lock) */

/* Allocation (DSGD_MALLOC, DSGD_FREE), DSGD__UNUSED and the file helpers
   are the core's (distsgd/base.h, distsgd/internal.h). */

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
    unsigned long mem_released; /* buffers released so far (atomic): a
                                   backend's cached kernel arguments may
                                   name a handle the runtime reuses */
};

/* >>program ----------------------------------------------------------------- */
/* Our kernels (their source is kernels.h's) built into one program for
   every device of the context. */

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

/* The device spec: desc.device, else the environment (see DEVICES in
   devices.h). */
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

/* A DEFAULT spec without an index: dsgd_cl_default_device() over the devices
   of the platform(s) in question (*chosen, an index into e; -1 when there
   are none). sp->type becomes GPU when it chose a GPU, else ALL. On failure
   e holds nothing. */
static dsgd_result dsgd_cl__pick_default(dsgd_ctx *ctx, dsgd_cl__spec *sp, dsgd_cl__enum *e, int *chosen) {
    dsgd_cl_device_info *info;
    int *map, i, n = 0, best;
    sp->type = DSGD_CL_DEVICE_ALL;
    *chosen = -1;
    if (e->count == 0) return DSGD_OK;
    info = (dsgd_cl_device_info *)DSGD_MALLOC((size_t)e->count * sizeof(*info));
    map = (int *)DSGD_MALLOC((size_t)e->count * sizeof(*map));
    if (!info || !map) {
        DSGD_FREE(info);
        DSGD_FREE(map);
        dsgd_cl__enum_free(e);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_context_create: device descriptions");
    }
    for (i = 0; i < e->count; ++i) {
        if (sp->platform >= 0 && e->plat_index[i] != sp->platform) continue;
        memset(&info[n], 0, sizeof(info[n]));
        dsgd_cl__fill_info(e->dev_platform[i], e->devices[i], &info[n]);
        map[n++] = i;
    }
    best = dsgd_cl_default_device(info, n);
    if (best >= 0) {
        *chosen = map[best];
        if (info[best].type == DSGD_CL_DEVICE_GPU) sp->type = DSGD_CL_DEVICE_GPU;
    }
    DSGD_FREE(info);
    DSGD_FREE(map);
    return DSGD_OK;
}

/* Enumerates the devices into e and picks the one sp names (*chosen, an index
   into e); a DEFAULT spec without an index goes to dsgd_cl__pick_default.
   On failure e holds nothing. */
static dsgd_result dsgd_cl__pick_device(dsgd_ctx *ctx, dsgd_cl__spec *sp, dsgd_cl__enum *e, int *chosen) {
    cl_int plat_err = CL_SUCCESS;
    int i, seen = 0;
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
        r = dsgd_cl__pick_default(ctx, sp, e, chosen);
        if (r != DSGD_OK) return r;
        return *chosen < 0 ? dsgd_cl__no_device(ctx, sp, e) : DSGD_OK;
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
   PoCL 3.1's pthread driver aborts (pocl_release_dlhandle_cache: "Assertion
   `found->ref_count > 0' failed") when one kernel runs at different grid
   sizes from several queues at once: its cache of compiled work-group
   functions takes a reference on one entry and may drop it on another.
   2 in 12 runs of the 4-replica demo died so. One in-order queue per
   device runs one command at a time and avoids it.
   PoCL 3.1's basic driver must not get that queue: it runs commands in the
   enqueuing thread, and when a command completes it runs the commands that
   waited on it from inside the same call (pocl_broadcast -> the driver's
   notify -> pocl_exec_command -> pocl_update_event_running), which locks an
   event mutex that thread already holds. Commands of other threads queued
   behind one another on a shared in-order queue get there: 4 of 4 runs of
   three replicas on threads hung so; with a queue per backend none did. */
static dsgd_result dsgd_cl__create_queues(dsgd_ctx *ctx, dsgd_cl_context *c, dsgd_cl_queues policy) {
    cl_int err;
    int i;
    c->queues = policy;
    if (policy == DSGD_CL_QUEUES_AUTO) {
        c->queues = DSGD_CL_QUEUES_PER_DEVICE;
        for (i = 0; i < c->num_devices; ++i)
            if (dsgd_cl_auto_queues(&c->info[i]) != DSGD_CL_QUEUES_PER_DEVICE) c->queues = DSGD_CL_QUEUES_PER_BACKEND;
    }
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

DSGD_API dsgd_cl_queues dsgd_cl_auto_queues(const dsgd_cl_device_info *info) {
    if (!info || !strstr(info->platform_name, "Portable Computing Language")) return DSGD_CL_QUEUES_PER_BACKEND;
    return strncmp(info->device_name, "pthread-", 8) == 0 || strncmp(info->device_name, "cpu-", 4) == 0
               ? DSGD_CL_QUEUES_PER_DEVICE
               : DSGD_CL_QUEUES_PER_BACKEND;
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
/* Releases a buffer that a kernel argument may name, and counts it. */
static void dsgd_cl__context_release_mem(dsgd_cl_context *c, cl_mem mem) {
    DSGD__FETCH_ADD(&c->mem_released, 1UL);
    clReleaseMemObject(mem);
}
static unsigned long dsgd_cl__context_mem_released(dsgd_cl_context *c) { return DSGD__LOAD_ACQ(&c->mem_released); }

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

/* CLBlast 1.5.3's pad, copy and transpose kernels, which its indirect GEMM
   runs before and after Xgemm, launch 16 x 16 work-items with its default
   parameters ("256 is larger than 64" on PoCL with
   POCL_MAX_WORK_GROUP_SIZE=64); a tuned set does not change them. */
#define DSGD_CL__CLBLAST_HELPER_DIM 16

/* The first limit of info that a kernel with a dx x dy work-group and
   `local` bytes of local memory breaks, written to why; 0 when none. */
static int dsgd_cl__breaks(const dsgd_cl_device_info *info, const char *kernel, size_t dx, size_t dy,
                           size_t local, char *why, size_t cap) {
    const size_t *items = info->max_work_item_sizes;
    char buf[200];
    buf[0] = '\0';
    if (info->max_work_group_size && dx * dy > info->max_work_group_size)
        snprintf(buf, sizeof(buf), "%s's work-group of %lu x %lu work-items exceeds the device's %lu", kernel,
                 (unsigned long)dx, (unsigned long)dy, (unsigned long)info->max_work_group_size);
    else if ((items[0] && dx > items[0]) || (items[1] && dy > items[1]))
        snprintf(buf, sizeof(buf), "%s's work-group of %lu x %lu work-items exceeds the device's %lu x %lu per dimension",
                 kernel, (unsigned long)dx, (unsigned long)dy, (unsigned long)items[0], (unsigned long)items[1]);
    else if (info->local_mem_bytes && local > info->local_mem_bytes)
        snprintf(buf, sizeof(buf), "%s needs %lu bytes of local memory, the device has %lu", kernel,
                 (unsigned long)local, (unsigned long)info->local_mem_bytes);
    if (!buf[0]) return 0;
    if (why && cap) snprintf(why, cap, "%s", buf);
    return 1;
}

DSGD_API int dsgd_cl_gemm_params_fit(const dsgd_cl_gemm_params *p, const dsgd_cl_device_info *info, char *why,
                                     size_t cap) {
    const size_t f = sizeof(float);
    if (why && cap) why[0] = '\0';
    if (!p || !info) {
        if (why && cap) snprintf(why, cap, "no parameters or no device");
        return 0;
    }
    if (p->xgemm_set) {
        const size_t *x = p->xgemm;
        size_t local = ((x[DSGD_CL__SA] ? x[DSGD_CL__KWG] * x[DSGD_CL__MWG] : 0) +
                        (x[DSGD_CL__SB] ? x[DSGD_CL__KWG] * x[DSGD_CL__NWG] : 0)) * f;
        if (dsgd_cl__breaks(info, "Xgemm", x[DSGD_CL__MDIMC], x[DSGD_CL__NDIMC], local, why, cap)) return 0;
    }
    if (p->direct_set) {
        const size_t *x = p->direct;
        size_t local = (x[DSGD_CL__WGD] * (x[DSGD_CL__WGD] + x[DSGD_CL__PADA]) +
                        x[DSGD_CL__WGD] * (x[DSGD_CL__WGD] + x[DSGD_CL__PADB])) * f;
        if (dsgd_cl__breaks(info, "XgemmDirect", x[DSGD_CL__MDIMCD], x[DSGD_CL__NDIMCD], local, why, cap)) return 0;
    }
    if (p->min_indirect_set &&
        dsgd_cl__breaks(info, "the indirect GEMM's pad and transpose kernels (CLBlast's own parameters)",
                        DSGD_CL__CLBLAST_HELPER_DIM, DSGD_CL__CLBLAST_HELPER_DIM, 0, why, cap))
        return 0;
    return 1;
}

DSGD_API dsgd_result dsgd_cl_apply_gemm_params(dsgd_ctx *ctx, dsgd_cl_context *c, int device,
                                               const dsgd_cl_gemm_params *p) {
    CLBlastStatusCode st;
    char why[256];
    if (!c || !p || device < 0 || device >= c->num_devices)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_apply_gemm_params: bad arguments");
    if (!dsgd_cl_gemm_params_valid(p))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_apply_gemm_params: the parameters break CLBlast's rules");
    if (!dsgd_cl_gemm_params_fit(p, &c->info[device], why, sizeof(why)))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_apply_gemm_params: the parameters do not fit %s: %s",
                                  c->info[device].device_name, why);
    if (p->xgemm_set) {
        pthread_rwlock_wrlock(&dsgd_cl__clblast_lock);
        dsgd_cl__clblast_epoch++;
        st = CLBlastOverrideParameters(c->devices[device], "Xgemm", CLBlastPrecisionSingle, DSGD_CL_XGEMM_NPARAMS,
                                       (const char **)dsgd_cl__xgemm_names, p->xgemm);
        pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "Xgemm");
    }
    if (p->direct_set) {
        pthread_rwlock_wrlock(&dsgd_cl__clblast_lock);
        dsgd_cl__clblast_epoch++;
        st = CLBlastOverrideParameters(c->devices[device], "XgemmDirect", CLBlastPrecisionSingle,
                                       DSGD_CL_DIRECT_NPARAMS, (const char **)dsgd_cl__direct_names, p->direct);
        pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "XgemmDirect");
    }
    if (p->min_indirect_set) {
        const char *name[1];
        size_t v[1];
        name[0] = "XGEMM_MIN_INDIRECT_SIZE";
        v[0] = p->min_indirect;
        pthread_rwlock_wrlock(&dsgd_cl__clblast_lock);
        dsgd_cl__clblast_epoch++;
        st = CLBlastOverrideParameters(c->devices[device], "GemmRoutine", CLBlastPrecisionSingle, 1, name, v);
        pthread_rwlock_unlock(&dsgd_cl__clblast_lock);
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
    char path[1100], limit[256];
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
    if (r == DSGD_OK && !dsgd_cl_gemm_params_fit(&p, &c->info[i], limit, sizeof(limit))) {
        /* tuned elsewhere, or the device's limits changed since (a driver
           setting such as POCL_MAX_WORK_GROUP_SIZE): nothing is applied */
        dsgd_ctx_log(ctx, DSGD_LOG_WARN,
                     "GEMM tuning cache %s does not fit the device's limits: %s; using CLBlast's default GEMM "
                     "parameters for %s (the cl_tune tuner, `make tune`, tunes this device)",
                     path, limit, dev);
        dsgd_ctx_destroy(scratch);
        return;
    }
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
