/* common.h - the few helpers the examples share: error and usage messages,
   flag parsing, loading Fashion-MNIST and the vendored UCI digits, and
   evaluating a model over a dataset.

   Include it after distsgd.h (or distsgd_cl.h, distsgd_mpi.h): it uses their
   types and includes none of them, so an example built against
   single_include/distsgd.h sees one copy of the library. Every function is
   static and marked unused, so an example that calls only some of them still
   builds under -Wall -Werror. */
#ifndef DSGD_EXAMPLES_COMMON_H
#define DSGD_EXAMPLES_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define EX_UNUSED __attribute__((unused))
#else
#define EX_UNUSED
#endif

/* Prints ctx's last error as "error: MESSAGE"; returns 1, main's status. */
static EX_UNUSED int ex_fail(dsgd_ctx *ctx) {
    fprintf(stderr, "error: %s\n", dsgd_ctx_last_error(ctx));
    return 1;
}

/* Prints "usage: PROG OPTIONS"; returns 2, main's status for a bad flag. */
static EX_UNUSED int ex_usage(const char *prog, const char *options) {
    fprintf(stderr, "usage: %s %s\n", prog, options);
    return 2;
}

/* When argv[*a] is flag and a value follows it: the value (*a then points at
   it, so the caller's loop steps past both); else NULL. */
static EX_UNUSED const char *ex_flag(int argc, char **argv, int *a, const char *flag) {
    if (strcmp(argv[*a], flag) != 0 || *a + 1 >= argc) return NULL;
    return argv[++*a];
}

/* Loads DIR/PREFIX-images-idx3-ubyte and DIR/PREFIX-labels-idx1-ubyte (10
   classes, uncompressed IDX); returns 1 when it did. */
static EX_UNUSED int ex_load_idx(dsgd_ctx *ctx, const char *dir, const char *prefix, dsgd_dataset *ds) {
    char img[1024], lab[1024];
    snprintf(img, sizeof(img), "%s/%s-images-idx3-ubyte", dir, prefix);
    snprintf(lab, sizeof(lab), "%s/%s-labels-idx1-ubyte", dir, prefix);
    return dsgd_dataset_load_idx(ctx, img, lab, 10, ds) == DSGD_OK;
}

/* Fashion-MNIST's training ("train") and test ("t10k") sets from dir (make
   demo unpacks them into build/data/fashion-mnist); returns 1 when loaded. */
static EX_UNUSED int ex_load_fashion_mnist(dsgd_ctx *ctx, const char *dir, dsgd_dataset *train, dsgd_dataset *test) {
    return ex_load_idx(ctx, dir, "train", train) && ex_load_idx(ctx, dir, "t10k", test);
}

/* The vendored UCI digits (examples/data/digits.csv: 64 pixels of 0..16,
   scaled to 0..1, then the class), split at random (seed) into 1400
   training and 397 test rows; returns 1 when done. */
static EX_UNUSED int ex_load_digits(dsgd_ctx *ctx, const char *path, uint64_t seed, dsgd_dataset *train,
                                    dsgd_dataset *test) {
    dsgd_csv_desc csv = {.num_classes = 10, .feature_scale = 1.0f / 16.0f};
    dsgd_dataset all;
    if (dsgd_dataset_load_csv(ctx, path, &csv, &all) != DSGD_OK ||
        dsgd_dataset_split(ctx, &all, 1400, seed, train, test) != DSGD_OK)
        return 0;
    dsgd_dataset_free(&all);
    return 1;
}

/* Evaluates model m on all of ds, batch samples at a time (at most the
   model's max_batch), into *out; returns 1 when it did. */
static EX_UNUSED int ex_evaluate(dsgd_model *m, const dsgd_dataset *ds, int batch, dsgd_metrics *out) {
    size_t i;
    for (i = 0; i < ds->n; i += (size_t)batch) {
        int n = (int)(ds->n - i < (size_t)batch ? ds->n - i : (size_t)batch);
        if (dsgd_model_eval_batch(m, ds->x + i * ds->dim, ds->y + i, n) != DSGD_OK) return 0;
    }
    return dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, out) == DSGD_OK;
}

#endif /* DSGD_EXAMPLES_COMMON_H */
