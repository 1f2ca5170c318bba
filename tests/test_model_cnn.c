/* test_model_cnn.c - the built-in network's image layers (conv2d and max-pool) on the CPU backend.

   The network: input 7x6x2 (NHWC), conv2d 3x3 pad 1 x4 relu, max-pool 2
   (7x6 -> 3x3), conv2d 2x2 stride 1 x3 tanh, dense 5, softmax
   cross-entropy: odd sizes, a pool that drops a row, both activations.

   What is asserted:
   - The forward pass equals a naive NHWC convolution and max-pool written
     here from the documented kernel layout (k, k, c, filters), within 1e-5.
   - Every parameter's gradient equals central differences of the loss
     (computed in double from the network's logits), |g - fd| <= 2e-3 +
     2e-2 |fd|.
   - Variables: names conv0/..., conv2/..., dense0/...; shapes; output_dim.
   - MIRRORED N = 3 x B equals ONE_DEVICE N*B within 1e-5 (SGD, 10 steps).
   - The CPU backend with conv_gemm and conv_backward_x, with conv_gemm
     alone, and with neither (im2col + GEMM, GEMM + col2im): the same
     gradients and parameters bit for bit over 4 steps (2 threads).
   - Misuse: no input_shape, a product other than input_dim, a window
     larger than its input, a negative stride, zero filters, an unknown
     kind, a backend without the image operations: DSGD_ERR_INVALID_ARGUMENT.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

enum { H = 7, W = 6, C = 2, F1 = 4, F2 = 3, OUT = 5, IN = H * W * C };

static const dsgd_image_layer_desc g_image[3] = {
    {DSGD_IMAGE_CONV2D, F1, 3, 0, 1, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {DSGD_IMAGE_MAXPOOL, 0, 2, 0, 0, DSGD_ACT_NONE, DSGD_INIT_AUTO},
    {DSGD_IMAGE_CONV2D, F2, 2, 1, 0, DSGD_ACT_TANH, DSGD_INIT_AUTO},
};
static const dsgd_layer_desc g_dense[1] = {{OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO}};

static dsgd_model_desc cnn_desc(void) {
    dsgd_model_desc d;
    memset(&d, 0, sizeof(d));
    d.image_layers = g_image;
    d.num_image_layers = 3;
    d.input_shape[0] = H;
    d.input_shape[1] = W;
    d.input_shape[2] = C;
    d.layers = g_dense;
    d.num_layers = 1;
    d.max_batch = 16;
    d.seed = 3;
    return d;
}

static void data(uint64_t seed, float *x, float *y, int n) {
    tu_rng r = tu_rng_make(seed);
    int i;
    tu_fill(&r, x, (size_t)n * IN, -1.0f, 1.0f);
    for (i = 0; i < n; ++i) y[i] = (float)tu_below(&r, OUT);
}

/* ---------------------------------------------------------------- a naive reference */

/* y(oh, ow, f) = act(sum x(oy*s - p + ky, ox*s - p + kx, c) K(ky, kx, c, f) + b(f)), one image */
static void ref_conv(const float *x, int h, int w, int c, const float *K, const float *b, int k, int f, int s, int p,
                     dsgd_activation act, float *y, int *oh, int *ow) {
    int oy, ox, ky, kx, ch, o;
    *oh = (h + 2 * p - k) / s + 1;
    *ow = (w + 2 * p - k) / s + 1;
    for (oy = 0; oy < *oh; ++oy)
        for (ox = 0; ox < *ow; ++ox)
            for (o = 0; o < f; ++o) {
                double sum = b[o];
                for (ky = 0; ky < k; ++ky)
                    for (kx = 0; kx < k; ++kx) {
                        int iy = oy * s - p + ky, ix = ox * s - p + kx;
                        if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
                        for (ch = 0; ch < c; ++ch)
                            sum += (double)x[(iy * w + ix) * c + ch] * K[((ky * k + kx) * c + ch) * f + o];
                    }
                y[(oy * *ow + ox) * f + o] = (float)(act == DSGD_ACT_RELU ? (sum > 0 ? sum : 0)
                                                     : act == DSGD_ACT_TANH ? tanh(sum) : sum);
            }
}

static void ref_pool(const float *x, int h, int w, int c, int k, float *y, int *oh, int *ow) {
    int oy, ox, ky, kx, ch;
    *oh = (h - k) / k + 1;
    *ow = (w - k) / k + 1;
    for (oy = 0; oy < *oh; ++oy)
        for (ox = 0; ox < *ow; ++ox)
            for (ch = 0; ch < c; ++ch) {
                float mx = -INFINITY;
                for (ky = 0; ky < k; ++ky)
                    for (kx = 0; kx < k; ++kx) mx = fmaxf(mx, x[((oy * k + ky) * w + ox * k + kx) * c + ch]);
                y[(oy * *ow + ox) * c + ch] = mx;
            }
}

/* The whole network on one image, from the parameters p. */
static void ref_forward(const float *p, const dsgd_model *m, const float *x, float *logits) {
    float a[H * W * F1], b[H * W * F1], c2[H * W * F2];
    int oh, ow, oh2, ow2, oh3, ow3, o, i;
    const dsgd_variable *k0 = dsgd_model_variable(m, 0), *b0 = dsgd_model_variable(m, 1);
    const dsgd_variable *k2 = dsgd_model_variable(m, 2), *b2 = dsgd_model_variable(m, 3);
    const dsgd_variable *kd = dsgd_model_variable(m, 4), *bd = dsgd_model_variable(m, 5);
    ref_conv(x, H, W, C, p + k0->offset, p + b0->offset, 3, F1, 1, 1, DSGD_ACT_RELU, a, &oh, &ow);
    ref_pool(a, oh, ow, F1, 2, b, &oh2, &ow2);
    ref_conv(b, oh2, ow2, F1, p + k2->offset, p + b2->offset, 2, F2, 1, 0, DSGD_ACT_TANH, c2, &oh3, &ow3);
    for (o = 0; o < OUT; ++o) {
        double s = p[bd->offset + o];
        for (i = 0; i < oh3 * ow3 * F2; ++i) s += (double)c2[i] * p[kd->offset + (size_t)i * OUT + o];
        logits[o] = (float)s;
    }
}

/* ---------------------------------------------------------------- tests */

static void test_layout_and_forward(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = cnn_desc();
    dsgd_model *m = NULL;
    float x[4 * IN], y[4], out[4 * OUT], want[OUT], *p;
    int i, o;
    (void)state;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    assert_int_equal(dsgd_model_input_dim(m), IN);
    assert_int_equal(dsgd_model_output_dim(m), OUT);
    assert_int_equal(dsgd_model_num_variables(m), 6);
    assert_string_equal(dsgd_model_variable(m, 0)->name, "conv0/kernel");
    assert_string_equal(dsgd_model_variable(m, 2)->name, "conv2/kernel");
    assert_string_equal(dsgd_model_variable(m, 4)->name, "dense0/kernel");
    assert_int_equal(dsgd_model_variable(m, 0)->rank, 4);
    assert_int_equal(dsgd_model_variable(m, 0)->shape[2], C);
    assert_int_equal(dsgd_model_variable(m, 0)->shape[3], F1);
    assert_int_equal(dsgd_model_variable(m, 2)->shape[2], F1);
    assert_int_equal(dsgd_model_variable(m, 4)->shape[0], 2 * 2 * F2); /* 3x3 pooled -> 2x2 conv */
    assert_int_equal((int)dsgd_model_num_params(m), 3 * 3 * C * F1 + F1 + 2 * 2 * F1 * F2 + F2 + 12 * OUT + OUT);
    data(1, x, y, 4);
    TU_OK(ctx, dsgd_model_eval_batch(m, x, NULL, 4));
    TU_OK(ctx, dsgd_model_read_output(m, out, 4));
    p = dsgd_model_host_params(m);
    for (i = 0; i < 4; ++i) {
        ref_forward(p, m, x + i * IN, want);
        for (o = 0; o < OUT; ++o) TU_NEAR(out[i * OUT + o], want[o], 1e-5 + 1e-5 * fabs(want[o]));
    }
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

static double loss_of(dsgd_model *m, const float *x, const float *y, int n) {
    float out[8 * OUT];
    double sum = 0.0;
    int i, k;
    if (dsgd_model_eval_batch(m, x, NULL, n) != DSGD_OK || dsgd_model_read_output(m, out, n) != DSGD_OK) return NAN;
    for (i = 0; i < n; ++i) {
        double mx = out[i * OUT], se = 0.0;
        for (k = 1; k < OUT; ++k) mx = fmax(mx, out[i * OUT + k]);
        for (k = 0; k < OUT; ++k) se += exp(out[i * OUT + k] - mx);
        sum += log(se) + mx - out[i * OUT + (int)y[i]];
    }
    return sum;
}

static void test_gradient_fd(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = cnn_desc();
    dsgd_model *m = NULL;
    float x[6 * IN], y[6], *g, *p;
    size_t np, i;
    int worst = -1;
    double worst_err = 0.0;
    (void)state;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    np = dsgd_model_num_params(m);
    g = tu_floats(np);
    data(2, x, y, 6);
    TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 6, 1.0f));
    TU_OK(ctx, dsgd_model_get_grads(m, g, np));
    p = dsgd_model_host_params(m);
    for (i = 0; i < np; ++i) {
        float keep = p[i];
        double h = 1e-3, lp, lm, fd, err;
        p[i] = keep + (float)h;
        lp = loss_of(m, x, y, 6);
        p[i] = keep - (float)h;
        lm = loss_of(m, x, y, 6);
        p[i] = keep;
        fd = (lp - lm) / (2.0 * h);
        err = fabs(g[i] - fd) / (2e-3 + 2e-2 * fabs(fd));
        if (err > worst_err) worst_err = err, worst = (int)i;
    }
    printf("    %zu parameters against central differences: worst |g - fd| / tol %.3f (parameter %d)\n", np, worst_err,
           worst);
    assert_true(worst_err <= 1.0);
    free(g);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

static void train(dsgd_strategy_kind kind, int n, float *out, size_t np) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_strategy_desc sd;
    dsgd_strategy *s = NULL;
    float x[12 * IN], y[12];
    int step;
    memset(&sd, 0, sizeof(sd));
    sd.kind = kind;
    sd.num_replicas = n;
    sd.model = cnn_desc();
    sd.optimizer.kind = DSGD_OPT_SGD;
    sd.optimizer.lr = 0.1f;
    sd.cpu_threads = 1;
    TU_OK(ctx, dsgd_strategy_create(ctx, &sd, &s));
    for (step = 0; step < 10; ++step) {
        data(40 + (uint64_t)step, x, y, 12);
        TU_OK(ctx, dsgd_strategy_train_step(s, x, y, 12, NULL));
    }
    tu_assert_replicas_identical(ctx, s);
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), out, np));
    dsgd_strategy_destroy(s);
    dsgd_ctx_destroy(ctx);
}

static void test_contract(void **state) {
    float a[512], b[512];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d = cnn_desc();
    dsgd_model *m = NULL;
    size_t np;
    double e;
    (void)state;
    TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
    np = dsgd_model_num_params(m);
    assert_true(np <= 512);
    dsgd_model_destroy(m);
    train(DSGD_STRATEGY_ONE_DEVICE, 1, a, np);
    train(DSGD_STRATEGY_MIRRORED, 3, b, np);
    e = tu_rel_err(b, a, np);
    printf("    CNN mirrored N=3 vs one_device: rel err %.3g\n", e);
    assert_true(e <= 1e-5);
    dsgd_ctx_destroy(ctx);
}

/* The network on a backend with conv_gemm and conv_backward_x (the CPU
   backend's), with conv_gemm alone (one shared scratch for the input
   gradients' columns), and with neither (each layer's im2col kept): the
   same gradients and parameters, bit for bit, over a few SGD steps. */
static void test_conv_ops_same_bits(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_cpu_backend_desc bd;
    dsgd_backend_i be, variant[3];
    float x[6 * IN], y[6], *g[3], *p[3];
    size_t np = 0, i;
    int v, step;
    (void)state;
    memset(&bd, 0, sizeof(bd));
    bd.threads = 2;
    TU_OK(ctx, dsgd_cpu_backend_create_desc(ctx, &bd, &be));
    if (!be.conv_gemm || !be.conv_backward_x) { /* DSGD_USE_CBLAS or portable kernels: nothing to compare */
        be.destroy(be.impl);
        dsgd_ctx_destroy(ctx);
        skip();
    }
    for (v = 0; v < 3; ++v) {
        dsgd_model_desc d = cnn_desc();
        dsgd_model *m = NULL;
        variant[v] = be;
        if (v >= 1) variant[v].conv_backward_x = NULL;
        if (v == 2) variant[v].conv_gemm = NULL;
        d.backend = &variant[v];
        TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
        np = dsgd_model_num_params(m);
        g[v] = tu_floats(np);
        p[v] = tu_floats(np);
        for (step = 0; step < 4; ++step) {
            float *hp = dsgd_model_host_params(m);
            data(60 + (uint64_t)step, x, y, 6);
            TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 6, 1.0f / 6));
            TU_OK(ctx, dsgd_model_get_grads(m, g[v], np));
            for (i = 0; i < np; ++i) hp[i] -= 0.5f * g[v][i];
        }
        memcpy(p[v], dsgd_model_host_params(m), np * sizeof(float));
        dsgd_model_destroy(m);
    }
    for (v = 1; v < 3; ++v) {
        assert_memory_equal(g[v], g[0], np * sizeof(float));
        assert_memory_equal(p[v], p[0], np * sizeof(float));
    }
    for (v = 0; v < 3; ++v) {
        free(g[v]);
        free(p[v]);
    }
    be.destroy(be.impl);
    dsgd_ctx_destroy(ctx);
}

static void test_misuse(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc d;
    dsgd_image_layer_desc il[3];
    dsgd_backend_i be;
    dsgd_model *m = NULL;
    int k;
    (void)state;
    for (k = 0; k < 8; ++k) {
        d = cnn_desc();
        memcpy(il, g_image, sizeof(il));
        d.image_layers = il;
        switch (k) {
        case 0: memset(d.input_shape, 0, sizeof(d.input_shape)); break;
        case 1: d.input_dim = IN + 1; break;
        case 2: il[2].kernel = 4; break;         /* 3x3 input, no padding */
        case 3: il[0].stride = -1; break;
        case 4: il[0].filters = 0; break;
        case 5: il[1].kind = (dsgd_image_layer_kind)7; break;
        case 6: d.num_image_layers = -1; break;
        default: il[0].kernel = 0; break;
        }
        dsgd_ctx_clear_error(ctx);
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &d, &m));
        assert_null(m);
        if (k == 2) assert_non_null(strstr(dsgd_ctx_last_error(ctx), "image layer 2: a 4x4 window"));
    }
    TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
    {
        dsgd_backend_i bare = be;
        bare.im2col = NULL;
        d = cnn_desc();
        d.backend = &bare;
        TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &d, &m));
        assert_non_null(strstr(dsgd_ctx_last_error(ctx), "image operations"));
        d.input_dim = IN; /* given and right: fine */
        d.backend = &be;
        TU_OK(ctx, dsgd_model_create(ctx, &d, &m));
        dsgd_model_destroy(m);
    }
    be.destroy(be.impl);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_and_forward),
        cmocka_unit_test(test_gradient_fd),
        cmocka_unit_test(test_contract),
        cmocka_unit_test(test_conv_ops_same_bits),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
