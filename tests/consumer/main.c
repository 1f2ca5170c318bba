/* tests/consumer/main.c - the README's minimal program (two mirrored replicas
   learn XOR with Adam on the CPU backend), built out of tree by
   tests/consumers.sh through pkg-config against a DESTDIR install and through
   CMake (add_subdirectory / FetchContent). Prints the header's version, then
   "accuracy 1.00". */
#define DISTSGD_IMPLEMENTATION
#include "distsgd.h"
#include <stdio.h>
#if defined(__cplusplus) && defined(__GNUC__)
/* g++ -Wextra warns about the fields a designated initializer leaves out;
   C++20 zeroes them as C does, and zero means "default" in every desc. */
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#endif

int main(void) {
    float x[8] = {0, 0, 0, 1, 1, 0, 1, 1}, y[4] = {0, 1, 1, 0};
    dsgd_layer_desc layers[2] = {{.units = 8, .activation = DSGD_ACT_TANH},
                                 {.units = 2, .activation = DSGD_ACT_NONE}};
    dsgd_strategy_desc sd = {
        .kind = DSGD_STRATEGY_MIRRORED,
        .num_replicas = 2, /* two threads, one replica each */
        .model = {.input_dim = 2, .layers = layers, .num_layers = 2, .max_batch = 4, .seed = 1},
        .optimizer = {.kind = DSGD_OPT_ADAM, .lr = 0.05f},
    };
    dsgd_ctx *ctx = NULL;
    dsgd_strategy *s = NULL;
    dsgd_step_info info;
    dsgd_metrics mt;
    int step, ok;
    printf("distsgd %s\n", DISTSGD_VERSION_STRING);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    ok = dsgd_strategy_create(ctx, &sd, &s) == DSGD_OK;
    for (step = 0; ok && step < 300; ++step) /* global batch 4: 2 per replica */
        ok = dsgd_strategy_train_step(s, x, y, 4, &info) == DSGD_OK;
    ok = ok && dsgd_strategy_eval_batch(s, x, y, 4) == DSGD_OK &&
         dsgd_strategy_take_metrics(s, DSGD_METRICS_EVAL, &mt) == DSGD_OK;
    if (ok) printf("accuracy %.2f\n", mt.correct / mt.count);
    else fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
    return ok ? 0 : 1;
}
