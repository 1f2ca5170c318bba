/* bench/bench_models.h - the models the benches train: the CNN of
   examples/cnn_fashion_mnist.c (28x28x1: conv3x3x16 relu, pool2,
   conv3x3x32 relu, pool2, dense 128 relu, dense 10) and the demo's MLP
   (784-256-128-10). Include after distsgd.h. */
#ifndef DSGD_BENCH_MODELS_H
#define DSGD_BENCH_MODELS_H

static const dsgd_image_layer_desc g_image[4] = {
    {DSGD_IMAGE_CONV2D, 16, 3, 1, 1, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {DSGD_IMAGE_MAXPOOL, 0, 2, 0, 0, DSGD_ACT_NONE, DSGD_INIT_AUTO},
    {DSGD_IMAGE_CONV2D, 32, 3, 1, 1, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {DSGD_IMAGE_MAXPOOL, 0, 2, 0, 0, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};
static const int g_shape[3] = {28, 28, 1};
static const dsgd_layer_desc g_cnn_dense[2] = {{128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                               {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
static const dsgd_layer_desc g_mlp[3] = {{256, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                         {128, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                         {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
#define MLP_IN 784

#endif
