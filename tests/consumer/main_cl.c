/* tests/consumer/main_cl.c - an OpenCL-backend consumer: includes distsgd_cl.h
   (which includes distsgd.h), lists the OpenCL devices and prints their count.
   Needs no device: with no OpenCL driver it prints "opencl devices 0". Built by
   tests/consumers.sh through pkg-config (distsgd-opencl) and CMake
   (distsgd::opencl). */
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "distsgd_cl.h"
#include <stdio.h>

int main(void) {
    dsgd_cl_device_info info[16];
    dsgd_ctx *ctx;
    int n = 0, i;
    printf("distsgd %s\n", DISTSGD_VERSION_STRING);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_cl_list_devices(ctx, info, 16, &n) != DSGD_OK) {
        fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx));
        dsgd_ctx_destroy(ctx);
        return 1;
    }
    printf("opencl devices %d\n", n);
    for (i = 0; i < n && i < 16; ++i)
        printf("  %d: %s (%s)\n", i, info[i].device_name, dsgd_cl_device_type_name(info[i].type));
    dsgd_ctx_destroy(ctx);
    return 0;
}
