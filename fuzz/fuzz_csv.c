/* fuzz/fuzz_csv.c - libFuzzer target: dsgd_dataset_parse_csv on any bytes.

   The first byte chooses the options (header lines 0-3, label column 0-7,
   num_classes 0 or 1-7, feature_scale 0 or 0.5); the rest is the CSV text.
   The options are always valid, so the only result allowed besides DSGD_OK
   is DSGD_ERR_FORMAT; an accepted dataset must hold finite features and
   labels in [0, num_classes). Run: make fuzz (FUZZ_SECONDS=N). */
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dsgd_ctx *ctx = fuzz_ctx();
    dsgd_csv_desc d = {0};
    dsgd_dataset ds;
    dsgd_result r;
    if (size > 0) {
        d.header_lines = data[0] & 3;
        d.label_column = (data[0] >> 2) & 7;
        d.num_classes = (data[0] >> 5) & 7;
        d.feature_scale = (data[0] & 0x80) && (data[0] & 1) ? 0.5f : 0.0f;
        ++data;
        --size;
    }
    r = dsgd_dataset_parse_csv(ctx, (const char *)data, size, &d, &ds);
    fuzz_check_parse(ctx, r, &ds);
    dsgd_ctx_destroy(ctx);
    return 0;
}
