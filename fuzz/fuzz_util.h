/* fuzz/fuzz_util.h - what the libFuzzer targets share. Include after the
   library. A finding is a crash, a sanitizer report, a leak, or a result
   other than the ones a target allows: fuzz_fail prints the input's result
   and message, then aborts, so that libFuzzer saves the input. */
#ifndef DSGD_FUZZ_UTIL_H
#define DSGD_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static inline void fuzz_fail(dsgd_ctx *ctx, dsgd_result r, const char *why) {
    fprintf(stderr, "finding: %s (result %s: %s)\n", why, dsgd_result_string(r), ctx ? dsgd_ctx_last_error(ctx) : "");
    abort();
}

/* A context that stays silent (no logger), or abort. */
static inline dsgd_ctx *fuzz_ctx(void) {
    dsgd_ctx *ctx = NULL;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) abort();
    return ctx;
}

/* Every value of a dataset that a parser accepted: the shape is sane,
   features finite, labels integers in [0, num_classes). */
static inline void fuzz_check_dataset(dsgd_ctx *ctx, const dsgd_dataset *ds) {
    size_t i;
    if (!ds->x || !ds->y || ds->n == 0 || ds->dim < 1 || ds->target_dim != 1 || ds->num_classes < 1)
        fuzz_fail(ctx, DSGD_OK, "accepted a dataset with a bad shape");
    for (i = 0; i < ds->n * (size_t)ds->dim; ++i)
        if (!(ds->x[i] == ds->x[i]) || ds->x[i] > 3.4e38f || ds->x[i] < -3.4e38f)
            fuzz_fail(ctx, DSGD_OK, "accepted a feature that is not finite");
    for (i = 0; i < ds->n; ++i)
        if (!(ds->y[i] >= 0.0f && ds->y[i] < (float)ds->num_classes) || ds->y[i] != (float)(int)ds->y[i])
            fuzz_fail(ctx, DSGD_OK, "accepted a label outside [0, num_classes)");
}

/* What a dataset parser may answer: DSGD_OK with a sane dataset (freed
   here), or DSGD_ERR_FORMAT with *out left empty. */
static inline void fuzz_check_parse(dsgd_ctx *ctx, dsgd_result r, dsgd_dataset *ds) {
    if (r == DSGD_OK) {
        fuzz_check_dataset(ctx, ds);
        dsgd_dataset_free(ds);
    } else if (r != DSGD_ERR_FORMAT) {
        fuzz_fail(ctx, r, "rejected with a result other than DSGD_ERR_FORMAT");
    } else if (ds->x || ds->y || ds->n) {
        fuzz_fail(ctx, r, "a rejected parse left data in *out");
    }
}

#endif
