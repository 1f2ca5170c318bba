/* fuzz/fuzz_idx.c - libFuzzer target: dsgd_dataset_parse_idx on any bytes.

   The input is the two files: the first byte chooses num_classes (0, or
   1-255 kept below 256), the next two bytes (little-endian) the length of
   the image file, capped at what is left; the label file is the rest. The
   only result allowed besides DSGD_OK is DSGD_ERR_FORMAT; an accepted
   dataset must hold finite pixels and labels in [0, num_classes). Run:
   make fuzz (FUZZ_SECONDS=N). */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsgd_ctx *ctx = fuzz_ctx();
    dsgd_dataset ds;
    dsgd_result r;
    size_t img = 0;
    int classes = 0;
    if (size >= 3) {
        classes = data[0];
        img = (size_t)data[1] | (size_t)data[2] << 8;
        data += 3;
        size -= 3;
    }
    if (img > size) img = size;
    r = dsgd_dataset_parse_idx(ctx, data, img, data + img, size - img, classes, &ds);
    fuzz_check_parse(ctx, r, &ds);
    dsgd_ctx_destroy(ctx);
    return 0;
}
