/* distsgd/cl/devices.h - the OpenCL headers, error names, the device list and the spec that picks devices
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).
   The context (context.h) opens the devices chosen here and builds our
   kernels (kernels.h) for them; QUEUES, GEMM TUNING and COLD START are there.

   DEVICES

     dsgd_cl_list_devices() lists every device of every platform, numbered in
     that order (platform 0's devices first). A context opens devices of one
     platform, chosen by a spec string (dsgd_cl_context_desc.device, or the
     environment when that is NULL):

         ""  or "default"    the best GPU (dsgd_cl_default_device: a discrete
                             one before an integrated one, then more compute
                             units, then a higher clock, then list order),
                             else the first device of any type
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
     number of backends may share a context and a device (see QUEUES in
     context.h).

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
*/
#ifndef DSGD_CL__PART_DEVICES_DECL
#define DSGD_CL__PART_DEVICES_DECL

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
    DSGD_CL_DEVICE_DEFAULT = 0, /* the best GPU if there is one, else any device */
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
    size_t max_work_group_size;       /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    size_t max_work_item_sizes[3];    /* CL_DEVICE_MAX_WORK_ITEM_SIZES, the
                                         first three dimensions (0: not
                                         answered) */
    int fp64;           /* cl_khr_fp64 */
    int unified_memory; /* CL_DEVICE_HOST_UNIFIED_MEMORY */
    unsigned vector_width; /* CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT (16 on
                              PoCL with AVX-512, usually 1 on GPUs; 0 when
                              the driver does not answer); the cl_tune
                              tuner makes register-tiled GEMM candidates for it */
    unsigned long long single_fp_config; /* CL_DEVICE_SINGLE_FP_CONFIG bits
                              (a cl_device_fp_config: CL_FP_DENORM,
                              CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT, CL_FP_FMA...);
                              0 when the driver does not answer. Which bits
                              the CPU backend's bits need: PRECISION in
                              kernels.h, BITS in backend.h */
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
/* The device a "default" spec opens among count described ones (see
   DEVICES): the best GPU - a discrete one (unified_memory 0) before an
   integrated one (unified_memory 1, which shares the host's memory), then
   the one with more compute_units, then a higher max_clock_mhz, then the
   earlier in the array - or, when none is a GPU, devices[0]. Returns the
   index into devices; -1 when devices is NULL or count <= 0. It reads only
   type, unified_memory, compute_units and max_clock_mhz, so it ranks
   made-up descriptions as well as dsgd_cl_list_devices()'s.
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cl_default_device(const dsgd_cl_device_info *devices, int count);
/* "gpu", "cpu", "accelerator", "all"; "default" for DEFAULT and any other
   value. Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_cl_device_type_name(dsgd_cl_device_type t);
/* The name of an OpenCL or CLBlast error code ("CL_OUT_OF_RESOURCES",
   "CLBlastInvalidLeadDimA"); "unknown OpenCL error" otherwise. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_cl_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_CL__PART_DEVICES_DECL */

#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_DEVICES_IMPL)
#define DSGD_CL__PART_DEVICES_IMPL

#if defined(__APPLE__)
#include <OpenCL/cl_ext.h> /* CL_PLATFORM_NOT_FOUND_KHR */
#else
#include <CL/cl_ext.h> /* CL_PLATFORM_NOT_FOUND_KHR */
#endif

#include <stdlib.h>
#include <string.h>

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

/* >>devices ----------------------------------------------------------------- */

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
    {
        size_t items[16], got = 0, j;
        memset(items, 0, sizeof(items));
        if (clGetDeviceInfo(d, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(items), items, &got) == CL_SUCCESS)
            for (j = 0; j < 3 && j < got / sizeof(size_t); ++j) info->max_work_item_sizes[j] = items[j];
    }
    if (clGetDeviceInfo(d, CL_DEVICE_HOST_UNIFIED_MEMORY, sizeof(unified), &unified, NULL) == CL_SUCCESS)
        info->unified_memory = unified == CL_TRUE;
    if (clGetDeviceInfo(d, CL_DEVICE_PREFERRED_VECTOR_WIDTH_FLOAT, sizeof(v), &v, NULL) == CL_SUCCESS)
        info->vector_width = v;
    {
        cl_device_fp_config fp = 0;
        if (clGetDeviceInfo(d, CL_DEVICE_SINGLE_FP_CONFIG, sizeof(fp), &fp, NULL) == CL_SUCCESS)
            info->single_fp_config = (unsigned long long)fp;
    }
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

/* 1 when a ranks strictly before b as the default device: a GPU before any
   other type; between GPUs a discrete one before an integrated one, then
   more compute units, then a higher clock. Other types never outrank one
   another (list order decides). */
static int dsgd_cl__better_default(const dsgd_cl_device_info *a, const dsgd_cl_device_info *b) {
    int ag = a->type == DSGD_CL_DEVICE_GPU, bg = b->type == DSGD_CL_DEVICE_GPU;
    if (ag != bg) return ag;
    if (!ag) return 0;
    if ((a->unified_memory == 0) != (b->unified_memory == 0)) return a->unified_memory == 0;
    if (a->compute_units != b->compute_units) return a->compute_units > b->compute_units;
    return a->max_clock_mhz > b->max_clock_mhz;
}

DSGD_API int dsgd_cl_default_device(const dsgd_cl_device_info *devices, int count) {
    int i, best = 0;
    if (!devices || count <= 0) return -1;
    for (i = 1; i < count; ++i)
        if (dsgd_cl__better_default(&devices[i], &devices[best])) best = i;
    return best;
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

#endif /* DSGD_CL__PART_DEVICES_IMPL */
