/* list_devices_cl.c - lists the OpenCL platforms and devices distsgd can use.

   Shows, for every device: the spec strings that select it (for
   dsgd_cl_context_desc.device, DSGD_CL_DEVICE or an example's --device flag),
   its type, memory, compute units and fp64 support, and whether a tuned
   CLBlast GEMM parameter file exists for it (tools/cl_tune writes one). Then
   it opens the device the environment selects (DSGD_CL_DEVICE,
   DSGD_CL_PLATFORM, DSGD_CL_DEVICE_TYPE; default: the best GPU, a discrete
   one before an integrated one, else the first device) and says which one
   that is.

   Build and run:  make examples && build/examples/list_devices_cl
   With no OpenCL driver installed it says so and exits 0. */
#define _POSIX_C_SOURCE 200809L
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <stdio.h>

static void print_log(void *ud, dsgd_log_level level, const char *msg) {
    (void)ud;
    if (level <= DSGD_LOG_WARN) fprintf(stderr, "  (%s)\n", msg);
}

int main(void) {
    dsgd_cl_device_info info[DSGD_CL_MAX_DEVICES * 4];
    dsgd_ctx_desc cdsc = {.logger = {.func = print_log}};
    dsgd_cl_context_desc cd = {.tuning = DSGD_CL_TUNING_OFF};
    dsgd_ctx *ctx;
    dsgd_cl_context *cl;
    int n = 0, i, last_platform = -1;
    if (dsgd_ctx_create(&cdsc, &ctx) != DSGD_OK) return 1;
    if (dsgd_cl_list_devices(ctx, info, (int)(sizeof info / sizeof info[0]), &n) != DSGD_OK) {
        fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx));
        return 1;
    }
    if (n == 0) {
        printf("no OpenCL platform or device found: install an OpenCL driver (ICD), e.g. your GPU vendor's "
               "or pocl-opencl-icd for the CPU\n");
        dsgd_ctx_destroy(ctx);
        return 0;
    }
    if (n > (int)(sizeof info / sizeof info[0])) n = (int)(sizeof info / sizeof info[0]);
    for (i = 0; i < n; ++i) {
        const dsgd_cl_device_info *d = &info[i];
        if (d->platform_index != last_platform) {
            printf("platform %d: %s (%s)\n", d->platform_index, d->platform_name, d->platform_version);
            last_platform = d->platform_index;
        }
        printf("  device %d  spec \"%d\" or \"%d:%d\"\n", i, i, d->platform_index, d->device_index);
        printf("    %s (%s), %s, driver %s\n", d->device_name, d->device_vendor, d->device_version,
               d->driver_version);
        printf("    type %s, %u compute units at %u MHz, %.2f GiB global memory (largest buffer %.2f GiB), "
               "%lu KiB local\n",
               dsgd_cl_device_type_name(d->type), d->compute_units, d->max_clock_mhz,
               (double)d->global_mem_bytes / (1u << 30), (double)d->max_alloc_bytes / (1u << 30),
               (unsigned long)(d->local_mem_bytes / 1024));
        printf("    fp64 %s, host-unified memory %s, max work-group size %lu, float vector width %u\n",
               d->fp64 ? "yes" : "no", d->unified_memory ? "yes (mapping is zero-copy)" : "no",
               (unsigned long)d->max_work_group_size, d->vector_width);
    }

    /* the device the environment selects, and its tuning file */
    printf("\ndefault selection (DSGD_CL_DEVICE=%s, DSGD_CL_PLATFORM=%s, DSGD_CL_DEVICE_TYPE=%s):\n",
           getenv("DSGD_CL_DEVICE") ? getenv("DSGD_CL_DEVICE") : "",
           getenv("DSGD_CL_PLATFORM") ? getenv("DSGD_CL_PLATFORM") : "",
           getenv("DSGD_CL_DEVICE_TYPE") ? getenv("DSGD_CL_DEVICE_TYPE") : "");
    if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK) {
        printf("  %s\n", dsgd_ctx_last_error(ctx));
        dsgd_ctx_destroy(ctx);
        return 1;
    } else {
        const dsgd_cl_device_info *d = dsgd_cl_context_device_info(cl, 0);
        char path[1100];
        FILE *f;
        printf("  device %d: %s\n", d->index, d->device_name);
        if (dsgd_cl_tune_cache_path(cl, 0, NULL, path, sizeof path) == DSGD_OK) {
            f = fopen(path, "r");
            printf("  tuned GEMM parameters: %s (%s)\n", path, f ? "present" : "absent: run tools/cl_tune");
            if (f) fclose(f);
        }
        dsgd_cl_context_destroy(cl);
    }
    dsgd_ctx_destroy(ctx);
    return 0;
}
