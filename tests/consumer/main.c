/* tests/consumer/main.c - the README's minimal program (it learns XOR with
   Adam on the CPU backend), built out of tree by tests/consumers.sh through
   pkg-config against a DESTDIR install and through CMake (add_subdirectory /
   FetchContent). Prints the header's version, then "accuracy 1.00". */
#define DISTSGD_IMPLEMENTATION
#include "distsgd.h"
#include <stdio.h>

int main(void) {
    float x[8] = {0,0, 0,1, 1,0, 1,1}, y[4] = {0, 1, 1, 0};
    dsgd_layer_desc layers[2] = {{8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                 {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_model_desc md = {0};
    dsgd_optimizer_desc od = {0};
    dsgd_ctx *ctx; dsgd_model *m; dsgd_optimizer *opt; dsgd_metrics mt;
    int step;
    md.input_dim = 2; md.layers = layers; md.num_layers = 2;
    md.max_batch = 4; md.seed = 1;
    od.kind = DSGD_OPT_ADAM; od.lr = 0.05f;
    printf("distsgd %s\n", DISTSGD_VERSION_STRING);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_model_create(ctx, &md, &m) != DSGD_OK ||
        dsgd_optimizer_create(m, &od, &opt) != DSGD_OK) {
        fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); return 1;
    }
    for (step = 0; step < 300; ++step) {
        if (dsgd_model_compute_gradients(m, x, y, 4, 1.0f / 4) != DSGD_OK ||
            dsgd_optimizer_step(opt) != DSGD_OK) {
            fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); return 1;
        }
    }
    if (dsgd_model_eval_batch(m, x, y, 4) != DSGD_OK ||
        dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt) != DSGD_OK) {
        fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); return 1;
    }
    printf("accuracy %.2f\n", mt.correct / mt.count);
    dsgd_optimizer_destroy(opt); dsgd_model_destroy(m); dsgd_ctx_destroy(ctx);
    return 0;
}
