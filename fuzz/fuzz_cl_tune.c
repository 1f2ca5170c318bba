/* fuzz/fuzz_cl_tune.c - libFuzzer target: the OpenCL tuning-cache parser
   (dsgd_cl__parse_gemm_params, what dsgd_cl_load_gemm_params runs on a
   file's bytes) on any bytes. No OpenCL device is needed: the parser never
   touches one. The only result allowed besides DSGD_OK is DSGD_ERR_FORMAT;
   accepted parameters must pass dsgd_cl_gemm_params_valid, and the names
   must be NUL-terminated within their buffers. Run: make fuzz
   (FUZZ_SECONDS=N). */
/* the parser only: the parts a strategy adds are left out (a shorter build) */
#define DSGD_NO_SIMNET
#define DSGD_NO_PS
#define DSGD_NO_COMPRESS
#define DSGD_NO_ELASTIC
#define DSGD_NO_LOCAL
#define DSGD_NO_TF_CONFIG
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_CL_IMPLEMENTATION
#include "../distsgd_cl.h"

#include <string.h>

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsgd_ctx *ctx = fuzz_ctx();
    dsgd_cl_gemm_params p;
    char plat[DSGD_CL_MAX_NAME], dev[DSGD_CL_MAX_NAME], drv[DSGD_CL_MAX_NAME];
    dsgd_result r = dsgd_cl__parse_gemm_params(ctx, (const char *)data, size, "input", &p, plat, dev, drv);
    if (r == DSGD_OK) {
        if (!dsgd_cl_gemm_params_valid(&p)) fuzz_fail(ctx, r, "accepted parameters CLBlast would reject");
        if (!memchr(plat, 0, sizeof plat) || !memchr(dev, 0, sizeof dev) || !memchr(drv, 0, sizeof drv))
            fuzz_fail(ctx, r, "a name is not NUL-terminated");
    } else if (r != DSGD_ERR_FORMAT) {
        fuzz_fail(ctx, r, "rejected with a result other than DSGD_ERR_FORMAT");
    }
    dsgd_ctx_destroy(ctx);
    return 0;
}
