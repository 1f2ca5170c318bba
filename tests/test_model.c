/* test_model.c - the sequential dense model: gradients, layout, initialisation,
   determinism, metrics, errors, and a functional training run on the vendored
   UCI digits.

   - Gradients: dsgd_model_compute_gradients against central finite
     differences of the device's own loss (dsgd_model_eval_batch, then the
     EVAL slot's loss_sum times grad_scale), for every parameter of a 4-layer
     cross-entropy model and a 3-layer MSE model. Parameters are drawn here
     (not by the library) and redrawn until every ReLU pre-activation is at
     least 0.05 from its kink, checked by a double-precision host forward
     pass, so the finite differences are smooth.
   - Layout: variables "denseK/kernel" (in,out) then "denseK/bias" (out),
     contiguous; the forward output matches x W + b computed on the host.
   - Initialisation statistics, same seed -> same bits after 20 training steps
     (SGD with momentum, Adam), errors, logger, result strings.
   - Training the 64-32-10 MLP on examples/data/digits.csv reaches >= 90% on a
     held-out split of 300 samples (functional, not timed).

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

/* ---------------------------------------------------------------- host reference */

static double host_act(dsgd_activation a, double z) {
    switch (a) {
    case DSGD_ACT_RELU: return z > 0 ? z : 0;
    case DSGD_ACT_TANH: return tanh(z);
    case DSGD_ACT_SIGMOID: return 1.0 / (1.0 + exp(-z));
    default: return z;
    }
}

/* Double-precision forward pass over the flat parameter vector laid out as
   the library documents it (per layer: kernel (in,out) row-major, then bias).
   Writes the outputs (count, out_dim) to out when non-NULL; returns the sum of
   per-sample losses; *relu_margin = min |z| over ReLU pre-activations. */
static double host_forward(int input_dim, const dsgd_layer_desc *layers, int nl, dsgd_loss loss,
                           const float *params, const float *x, const float *y, int count,
                           double *out, double *relu_margin) {
    double total = 0, margin = 1e300;
    int s, l, i, j;
    double *a = (double *)tu_alloc(sizeof(double) * 1024), *z = (double *)tu_alloc(sizeof(double) * 1024);
    for (s = 0; s < count; ++s) {
        int in = input_dim;
        const float *p = params;
        for (i = 0; i < in; ++i) a[i] = x[(size_t)s * input_dim + i];
        for (l = 0; l < nl; ++l) {
            int o = layers[l].units;
            const float *w = p, *b = p + (size_t)in * o;
            for (j = 0; j < o; ++j) {
                double acc = b[j];
                for (i = 0; i < in; ++i) acc += a[i] * w[(size_t)i * o + j];
                z[j] = acc;
                if (layers[l].activation == DSGD_ACT_RELU && fabs(acc) < margin) margin = fabs(acc);
            }
            for (j = 0; j < o; ++j) a[j] = host_act(layers[l].activation, z[j]);
            p += (size_t)in * o + o;
            in = o;
        }
        if (out)
            for (j = 0; j < in; ++j) out[(size_t)s * in + j] = a[j];
        if (y) {
            if (loss == DSGD_LOSS_SOFTMAX_XENT) {
                double mx = a[0], se = 0;
                for (j = 1; j < in; ++j) mx = a[j] > mx ? a[j] : mx;
                for (j = 0; j < in; ++j) se += exp(a[j] - mx);
                total += mx + log(se) - a[(int)y[s]];
            } else {
                double se = 0;
                for (j = 0; j < in; ++j) {
                    double d = a[j] - y[(size_t)s * in + j];
                    se += d * d;
                }
                total += se / in;
            }
        }
    }
    if (relu_margin) *relu_margin = margin;
    free(a);
    free(z);
    return total;
}

/* ---------------------------------------------------------------- gradients */

static double eval_loss(dsgd_ctx *ctx, dsgd_model *m, const float *x, const float *y, int count) {
    dsgd_metrics mt;
    TU_OK(ctx, dsgd_model_eval_batch(m, x, y, count));
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt));
    assert_true(mt.count == count);
    return mt.loss_sum;
}

/* Finite-difference check of every parameter. Step h = 1e-2 on floats:
   the loss is a float sum of order 5, so rounding contributes about
   4 ulp / 2h ~ 1e-4 before grad_scale; truncation is h^2/6 |f'''| ~ 2e-5 for
   these smooth nets (ReLUs kept off their kink). Tolerance:
   2e-4 + 1e-2 |fd| (measured errors are below 3e-5). At least a third of
   the gradients must be larger than 1e-3 so that a zero gradient cannot pass. */
static void fd_check(const dsgd_layer_desc *layers, int nl, int input_dim, dsgd_loss loss,
                     int count, float grad_scale, uint64_t seed) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_model *m = NULL;
    dsgd_metrics mt;
    size_t np, i;
    float *p, *g, *x, *y, *pp;
    int tdim, tries, out_dim = layers[nl - 1].units, big = 0;
    double margin = 0, host_l, dev_l, *hout, worst = 0;
    tu_rng r = tu_rng_make(seed);

    memset(&md, 0, sizeof md);
    md.input_dim = input_dim;
    md.layers = layers;
    md.num_layers = nl;
    md.loss = loss;
    md.max_batch = count;
    md.seed = seed;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    np = dsgd_model_num_params(m);
    tdim = dsgd_model_target_dim(m);
    assert_int_equal(tdim, loss == DSGD_LOSS_SOFTMAX_XENT ? 1 : out_dim);
    p = tu_floats(np);
    pp = tu_floats(np);
    g = tu_floats(np);
    x = tu_floats((size_t)count * input_dim);
    y = tu_floats((size_t)count * tdim);
    hout = (double *)tu_alloc(sizeof(double) * (size_t)count * out_dim);

    tu_fill(&r, x, (size_t)count * input_dim, -1.0f, 1.0f);
    for (i = 0; i < (size_t)count * tdim; ++i)
        y[i] = loss == DSGD_LOSS_SOFTMAX_XENT ? (float)tu_below(&r, (size_t)out_dim)
                                              : tu_uniform(&r, -0.9f, 0.9f);
    for (tries = 0; tries < 200; ++tries) {
        tu_fill(&r, p, np, -0.8f, 0.8f); /* biases non-zero too */
        host_forward(input_dim, layers, nl, loss, p, x, y, count, NULL, &margin);
        if (margin >= 0.05) break;
    }
    if (margin < 0.05) fail_msg("could not draw parameters with a ReLU margin");
    TU_OK(ctx, dsgd_model_set_params(m, p, np));

    /* the device loss agrees with the host's double forward pass */
    host_l = host_forward(input_dim, layers, nl, loss, p, x, y, count, hout, NULL);
    dev_l = eval_loss(ctx, m, x, y, count);
    TU_NEAR(dev_l, host_l, 1e-5 * host_l + 1e-6);

    TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, count, grad_scale));
    TU_OK(ctx, dsgd_model_get_grads(m, g, np));
    /* the TRAIN slot saw the same loss */
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_TRAIN, &mt));
    TU_NEAR(mt.loss_sum, dev_l, 1e-6 * dev_l);
    assert_true(mt.count == count);
    /* parameters are not touched by computing gradients */
    TU_OK(ctx, dsgd_model_get_params(m, pp, np));
    assert_memory_equal(pp, p, np * sizeof(float));

    for (i = 0; i < np; ++i) {
        const float h = 1e-2f;
        double lp, lm, fd, err;
        float pi = p[i];
        memcpy(pp, p, np * sizeof(float));
        pp[i] = pi + h;
        TU_OK(ctx, dsgd_model_set_params(m, pp, np));
        lp = eval_loss(ctx, m, x, y, count);
        pp[i] = pi - h;
        TU_OK(ctx, dsgd_model_set_params(m, pp, np));
        lm = eval_loss(ctx, m, x, y, count);
        fd = grad_scale * (lp - lm) / ((double)(pi + h) - (double)(pi - h));
        err = fabs(g[i] - fd);
        if (err > worst) worst = err;
        if (!(err <= 2e-4 + 1e-2 * fabs(fd))) {
            const dsgd_variable *v = NULL;
            int k;
            for (k = 0; k < dsgd_model_num_variables(m); ++k) {
                const dsgd_variable *w = dsgd_model_variable(m, k);
                if (i >= w->offset && i < w->offset + w->count) v = w;
            }
            fail_msg("gradient of param %zu (%s[%zu]) = %.7g, finite difference %.7g", i,
                     v ? v->name : "?", v ? i - v->offset : (size_t)0, g[i], fd);
        }
        big += fabs(fd) > 1e-3;
    }
    if ((size_t)big * 3 < np) fail_msg("only %d of %zu gradients above 1e-3", big, np);
    print_message("    %zu parameters, max |grad - fd| = %.3g\n", np, worst);

    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    free(p);
    free(pp);
    free(g);
    free(x);
    free(y);
    free(hout);
}

static void test_gradients_xent_fd(void **state) {
    static const dsgd_layer_desc layers[4] = {{7, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                              {6, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {4, DSGD_ACT_SIGMOID, DSGD_INIT_AUTO},
                                              {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    (void)state;
    fd_check(layers, 4, 5, DSGD_LOSS_SOFTMAX_XENT, 4, 0.3f, 101);
    fd_check(layers, 4, 5, DSGD_LOSS_SOFTMAX_XENT, 1, 1.0f, 102);
}

static void test_gradients_mse_fd(void **state) {
    static const dsgd_layer_desc layers[3] = {{8, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {5, DSGD_ACT_SIGMOID, DSGD_INIT_AUTO},
                                              {3, DSGD_ACT_TANH, DSGD_INIT_AUTO}};
    static const dsgd_layer_desc linear[1] = {{2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    (void)state;
    fd_check(layers, 3, 4, DSGD_LOSS_MSE, 5, 0.2f, 201);
    fd_check(linear, 1, 3, DSGD_LOSS_MSE, 3, 1.0f / 3, 202);
}

/* ---------------------------------------------------------------- layout */

static void test_variables_and_forward(void **state) {
    static const dsgd_layer_desc layers[3] = {{7, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                              {6, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    static const int dims[4] = {5, 7, 6, 3};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_model *m = NULL;
    size_t off = 0, np;
    int l;
    float *p, x[4 * 5], out[4 * 3];
    double hout[4 * 3];
    tu_rng r = tu_rng_make(5);
    (void)state;

    memset(&md, 0, sizeof md);
    md.input_dim = 5;
    md.layers = layers;
    md.num_layers = 3;
    md.max_batch = 8;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    assert_int_equal(dsgd_model_input_dim(m), 5);
    assert_int_equal(dsgd_model_output_dim(m), 3);
    assert_int_equal(dsgd_model_target_dim(m), 1);
    assert_int_equal(dsgd_model_num_variables(m), 6);
    assert_true(dsgd_model_ctx(m) == ctx);
    assert_non_null(dsgd_model_backend(m));
    assert_non_null(dsgd_model_params(m).buf);
    assert_non_null(dsgd_model_grads(m).buf);
    assert_null(dsgd_model_variable(m, -1));
    assert_null(dsgd_model_variable(m, 6));
    for (l = 0; l < 3; ++l) {
        const dsgd_variable *k = dsgd_model_variable(m, 2 * l), *b = dsgd_model_variable(m, 2 * l + 1);
        char name[DSGD_MAX_NAME];
        assert_non_null(k);
        assert_non_null(b);
        snprintf(name, sizeof name, "dense%d/kernel", l);
        assert_string_equal(k->name, name);
        snprintf(name, sizeof name, "dense%d/bias", l);
        assert_string_equal(b->name, name);
        assert_int_equal(k->offset, off);
        assert_int_equal(k->count, (size_t)dims[l] * dims[l + 1]);
        assert_int_equal(k->rank, 2);
        assert_int_equal(k->shape[0], dims[l]);
        assert_int_equal(k->shape[1], dims[l + 1]);
        off += k->count;
        assert_int_equal(b->offset, off);
        assert_int_equal(b->count, (size_t)dims[l + 1]);
        assert_int_equal(b->rank, 1);
        assert_int_equal(b->shape[0], dims[l + 1]);
        off += b->count;
    }
    np = dsgd_model_num_params(m);
    assert_int_equal(np, off);
    assert_int_equal(np, 5 * 7 + 7 + 7 * 6 + 6 + 6 * 3 + 3);

    /* biases start at zero */
    p = tu_floats(np);
    TU_OK(ctx, dsgd_model_get_params(m, p, np));
    for (l = 0; l < 3; ++l) {
        const dsgd_variable *b = dsgd_model_variable(m, 2 * l + 1);
        size_t i;
        for (i = 0; i < b->count; ++i) assert_true(p[b->offset + i] == 0.0f);
    }

    /* the forward pass reads kernels as (in,out) row-major: compare outputs
       with the host forward pass on parameters set here */
    tu_fill(&r, p, np, -0.7f, 0.7f);
    tu_fill(&r, x, 20, -1.0f, 1.0f);
    TU_OK(ctx, dsgd_model_set_params(m, p, np));
    TU_OK(ctx, dsgd_model_eval_batch(m, x, NULL, 4));
    TU_OK(ctx, dsgd_model_read_output(m, out, 4));
    host_forward(5, layers, 3, DSGD_LOSS_SOFTMAX_XENT, p, x, NULL, 4, hout, NULL);
    for (l = 0; l < 12; ++l) TU_NEAR(out[l], hout[l], 1e-5 + 1e-5 * fabs(hout[l]));
    {
        /* y == NULL records no metrics */
        dsgd_metrics mt;
        TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt));
        assert_true(mt.count == 0 && mt.loss_sum == 0 && mt.correct == 0);
    }

    /* get/set with the wrong count */
    TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_model_get_params(m, p, np - 1));
    TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_model_set_params(m, p, np + 1));
    TU_ERR(ctx, DSGD_ERR_SHAPE, dsgd_model_get_grads(m, p, 1));

    free(p);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- init */

typedef struct wstats {
    double mean, std, maxabs;
} wstats;

static wstats stats_of(const float *w, size_t n) {
    wstats s;
    double sum = 0, sq = 0, mx = 0;
    size_t i;
    for (i = 0; i < n; ++i) {
        sum += w[i];
        if (fabs(w[i]) > mx) mx = fabs(w[i]);
    }
    s.mean = sum / (double)n;
    for (i = 0; i < n; ++i) sq += (w[i] - s.mean) * (w[i] - s.mean);
    s.std = sqrt(sq / (double)(n - 1));
    s.maxabs = mx;
    return s;
}

/* A normal initialiser: std within rel_tol, mean near 0, and tails beyond
   what a uniform of the same std (max sqrt(3) std) could produce. */
static void check_normal(const float *w, size_t n, double want_std, double rel_tol,
                         const char *what) {
    wstats s = stats_of(w, n);
    if (!(fabs(s.std - want_std) <= rel_tol * want_std))
        fail_msg("%s: std %.6g, want %.6g within %.0f%%", what, s.std, want_std, rel_tol * 100);
    if (!(fabs(s.mean) <= 6.0 * want_std / sqrt((double)n)))
        fail_msg("%s: mean %.6g too far from 0", what, s.mean);
    if (!(s.maxabs > 2.5 * want_std)) fail_msg("%s: max |w| %.6g: no normal tails", what, s.maxabs);
}

/* A uniform initialiser U(-bound, bound): inside the bound, reaching near it,
   with variance bound^2/3 within rel_tol. */
static void check_uniform(const float *w, size_t n, double bound, double rel_tol,
                          const char *what) {
    wstats s = stats_of(w, n);
    double want_std = bound / sqrt(3.0);
    if (!(s.maxabs <= bound * (1 + 1e-6)))
        fail_msg("%s: max |w| %.7g exceeds the bound %.7g", what, s.maxabs, bound);
    if (!(s.maxabs >= 0.95 * bound))
        fail_msg("%s: max |w| %.7g, expected close to the bound %.7g", what, s.maxabs, bound);
    if (!(fabs(s.std - want_std) <= rel_tol * want_std))
        fail_msg("%s: std %.6g, want %.6g within %.0f%%", what, s.std, want_std, rel_tol * 100);
    if (!(fabs(s.mean) <= 6.0 * want_std / sqrt((double)n)))
        fail_msg("%s: mean %.6g too far from 0", what, s.mean);
}

static void test_init_statistics(void **state) {
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_model *m = NULL;
    float *p;
    size_t np, i;
    (void)state;

    /* AUTO: He normal before ReLU (1000 -> 500: 500k weights, std within 5%),
       Glorot uniform otherwise (500 -> 10). */
    {
        static const dsgd_layer_desc layers[2] = {{500, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                                  {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
        memset(&md, 0, sizeof md);
        md.input_dim = 1000;
        md.layers = layers;
        md.num_layers = 2;
        md.max_batch = 4;
        md.seed = 9;
        TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
        np = dsgd_model_num_params(m);
        p = tu_floats(np);
        TU_OK(ctx, dsgd_model_get_params(m, p, np));
        check_normal(p, 1000 * 500, sqrt(2.0 / 1000), 0.05, "AUTO+relu (He normal) 1000x500");
        for (i = 0; i < 500; ++i) assert_true(p[1000 * 500 + i] == 0.0f);
        check_uniform(p + 1000 * 500 + 500, 500 * 10, sqrt(6.0 / 510), 0.05,
                      "AUTO+none (Glorot uniform) 500x10");
        for (i = 0; i < 10; ++i) assert_true(p[np - 10 + i] == 0.0f);
        free(p);
        dsgd_model_destroy(m);
    }
    /* explicit kinds */
    {
        static const dsgd_layer_desc layers[5] = {{300, DSGD_ACT_TANH, DSGD_INIT_HE_UNIFORM},
                                                  {200, DSGD_ACT_SIGMOID, DSGD_INIT_GLOROT_NORMAL},
                                                  {100, DSGD_ACT_RELU, DSGD_INIT_GLOROT_UNIFORM},
                                                  {60, DSGD_ACT_NONE, DSGD_INIT_HE_NORMAL},
                                                  {50, DSGD_ACT_TANH, DSGD_INIT_AUTO}};
        size_t o = 0;
        memset(&md, 0, sizeof md);
        md.input_dim = 400;
        md.layers = layers;
        md.num_layers = 5;
        md.loss = DSGD_LOSS_MSE;
        md.max_batch = 4;
        md.seed = 10;
        TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
        np = dsgd_model_num_params(m);
        p = tu_floats(np);
        TU_OK(ctx, dsgd_model_get_params(m, p, np));
        check_uniform(p + o, 400 * 300, sqrt(6.0 / 400), 0.05, "HE_UNIFORM 400x300");
        o += 400 * 300 + 300;
        check_normal(p + o, 300 * 200, sqrt(2.0 / 500), 0.05, "GLOROT_NORMAL 300x200");
        o += 300 * 200 + 200;
        check_uniform(p + o, 200 * 100, sqrt(6.0 / 300), 0.05, "GLOROT_UNIFORM 200x100");
        o += 200 * 100 + 100;
        check_normal(p + o, 100 * 60, sqrt(2.0 / 100), 0.08, "HE_NORMAL 100x60");
        o += 100 * 60 + 60;
        check_uniform(p + o, 60 * 50, sqrt(6.0 / 110), 0.08, "AUTO+tanh (Glorot uniform) 60x50");
        free(p);
        dsgd_model_destroy(m);
    }
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- determinism */

/* Builds a 64-32-10 MLP with `seed`, trains it 20 steps with `kind` on fixed
   random batches and returns its parameters (caller frees). */
static float *train20(dsgd_optimizer_kind kind, uint64_t seed, size_t *np_out) {
    static const dsgd_layer_desc layers[2] = {{32, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_model *m = NULL;
    dsgd_optimizer *opt = NULL;
    float x[16 * 64], y[16], *p;
    int step, i;
    tu_rng r = tu_rng_make(77); /* the data does not depend on the model seed */

    memset(&md, 0, sizeof md);
    md.input_dim = 64;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 16;
    md.seed = seed;
    memset(&od, 0, sizeof od);
    od.kind = kind;
    od.lr = kind == DSGD_OPT_MOMENTUM ? 0.05f : 0.01f;
    od.momentum = 0.9f;
    od.nesterov = 1;
    od.weight_decay = 1e-4f;
    od.clip_norm = 5.0f;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    TU_OK(ctx, dsgd_optimizer_create(m, &od, &opt));
    for (step = 0; step < 20; ++step) {
        tu_fill(&r, x, 16 * 64, 0.0f, 1.0f);
        for (i = 0; i < 16; ++i) y[i] = (float)tu_below(&r, 10);
        TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 16, 1.0f / 16));
        TU_OK(ctx, dsgd_optimizer_step(opt));
    }
    assert_int_equal(dsgd_optimizer_steps(opt), 20);
    *np_out = dsgd_model_num_params(m);
    p = tu_floats(*np_out);
    TU_OK(ctx, dsgd_model_get_params(m, p, *np_out));
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    return p;
}

static float *init_params(uint64_t seed, size_t *np) {
    static const dsgd_layer_desc layers[2] = {{32, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_model *m = NULL;
    float *p;
    memset(&md, 0, sizeof md);
    md.input_dim = 64;
    md.layers = layers;
    md.num_layers = 2;
    md.seed = seed;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    *np = dsgd_model_num_params(m);
    p = tu_floats(*np);
    TU_OK(ctx, dsgd_model_get_params(m, p, *np));
    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
    return p;
}

static void test_same_seed_same_bits(void **state) {
    const dsgd_optimizer_kind kinds[2] = {DSGD_OPT_MOMENTUM, DSGD_OPT_ADAM};
    size_t n1, n2, n3, k;
    float *a, *b, *c;
    (void)state;

    /* initialisation alone; seed 0 is a valid seed distinct from 1 */
    a = init_params(0, &n1);
    b = init_params(0, &n2);
    c = init_params(1, &n3);
    assert_int_equal(n1, n2);
    assert_memory_equal(a, b, n1 * sizeof(float));
    assert_memory_not_equal(a, c, n1 * sizeof(float));
    free(a);
    free(b);
    free(c);

    for (k = 0; k < 2; ++k) {
        float *p0;
        a = train20(kinds[k], 1234, &n1);
        b = train20(kinds[k], 1234, &n2);
        c = train20(kinds[k], 1235, &n3);
        p0 = init_params(1234, &n3);
        assert_int_equal(n1, n2);
        if (memcmp(a, b, n1 * sizeof(float)) != 0)
            fail_msg("optimizer %d: same seed gave different weights after 20 steps", (int)kinds[k]);
        assert_memory_not_equal(a, c, n1 * sizeof(float));
        assert_memory_not_equal(a, p0, n1 * sizeof(float)); /* training moved them */
        free(a);
        free(b);
        free(c);
        free(p0);
    }
}

/* A model on a caller-created backend behaves exactly like one that owns its
   CPU backend; a backend table missing a required operation is refused. */
static void test_external_backend(void **state) {
    static const dsgd_layer_desc layers[2] = {{9, DSGD_ACT_SIGMOID, DSGD_INIT_AUTO},
                                              {4, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_backend_i be, broken;
    dsgd_model_desc md;
    dsgd_model *own = NULL, *ext = NULL, *bad = NULL;
    float x[6 * 5], y[6], *p1, *p2;
    size_t np;
    int i;
    tu_rng r = tu_rng_make(66);
    (void)state;
    TU_OK(ctx, dsgd_cpu_backend_create(ctx, &be));
    memset(&md, 0, sizeof md);
    md.input_dim = 5;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 6;
    md.seed = 17;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &own));
    md.backend = &be;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &ext));
    np = dsgd_model_num_params(own);
    p1 = tu_floats(np);
    p2 = tu_floats(np);
    TU_OK(ctx, dsgd_model_get_params(own, p1, np));
    TU_OK(ctx, dsgd_model_get_params(ext, p2, np));
    assert_memory_equal(p1, p2, np * sizeof(float));
    tu_fill(&r, x, 30, -1.0f, 1.0f);
    for (i = 0; i < 6; ++i) y[i] = (float)(i % 4);
    TU_OK(ctx, dsgd_model_compute_gradients(own, x, y, 6, 1.0f / 6));
    TU_OK(ctx, dsgd_model_compute_gradients(ext, x, y, 6, 1.0f / 6));
    TU_OK(ctx, dsgd_model_get_grads(own, p1, np));
    TU_OK(ctx, dsgd_model_get_grads(ext, p2, np));
    assert_memory_equal(p1, p2, np * sizeof(float));
    /* the model's parameters live in the caller's backend */
    assert_non_null(be.buffer_host_ptr(be.impl, dsgd_model_params(ext).buf));
    broken = be;
    broken.gemm = NULL;
    md.backend = &broken;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    assert_null(bad);
    dsgd_model_destroy(own);
    dsgd_model_destroy(ext);
    be.destroy(be.impl); /* after the model that used it */
    dsgd_ctx_destroy(ctx);
    free(p1);
    free(p2);
}

/* ---------------------------------------------------------------- metrics */

static void test_metrics(void **state) {
    static const dsgd_layer_desc layers[2] = {{6, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                              {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_model *m = NULL;
    dsgd_metrics mt;
    float x[7 * 4], y[7], out[7 * 3];
    double want_loss = 0, want_correct = 0;
    int i, j;
    tu_rng r = tu_rng_make(55);
    (void)state;
    memset(&md, 0, sizeof md);
    md.input_dim = 4;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 8;
    md.seed = 3;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    tu_fill(&r, x, 28, -2.0f, 2.0f);
    for (i = 0; i < 7; ++i) y[i] = (float)(i % 3);

    /* expected per-sample losses and accuracy from the outputs */
    TU_OK(ctx, dsgd_model_eval_batch(m, x, NULL, 7));
    TU_OK(ctx, dsgd_model_read_output(m, out, 7));
    for (i = 0; i < 7; ++i) {
        double mx = out[i * 3], se = 0;
        int am = 0;
        for (j = 1; j < 3; ++j)
            if (out[i * 3 + j] > out[i * 3 + am]) am = j;
        mx = out[i * 3 + am];
        for (j = 0; j < 3; ++j) se += exp(out[i * 3 + j] - mx);
        want_loss += mx + log(se) - out[i * 3 + (int)y[i]];
        want_correct += am == (int)y[i];
    }

    /* TRAIN accumulates over calls (4 + 3 samples), EVAL is untouched */
    TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 4, 0.25f));
    TU_OK(ctx, dsgd_model_compute_gradients(m, x + 16, y + 4, 3, 1.0f / 3));
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt));
    assert_true(mt.count == 0 && mt.loss_sum == 0 && mt.correct == 0);
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_TRAIN, &mt));
    assert_true(mt.count == 7);
    TU_NEAR(mt.correct, want_correct, 0);
    TU_NEAR(mt.loss_sum, want_loss, 1e-5 * want_loss);
    /* take resets */
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_TRAIN, &mt));
    assert_true(mt.count == 0 && mt.loss_sum == 0 && mt.correct == 0);

    /* EVAL accumulates too */
    TU_OK(ctx, dsgd_model_eval_batch(m, x, y, 2));
    TU_OK(ctx, dsgd_model_eval_batch(m, x + 8, y + 2, 5));
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt));
    assert_true(mt.count == 7);
    TU_NEAR(mt.correct, want_correct, 0);
    TU_NEAR(mt.loss_sum, want_loss, 1e-5 * want_loss);
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_TRAIN, &mt));
    assert_true(mt.count == 0);

    dsgd_model_destroy(m);
    dsgd_ctx_destroy(ctx);
}

/* ---------------------------------------------------------------- errors */

typedef struct log_capture {
    int calls, errors;
    dsgd_log_level level;
    char last[1024];
} log_capture;

static void capture_log(void *user, dsgd_log_level level, const char *message) {
    log_capture *c = (log_capture *)user;
    c->calls++;
    if (level == DSGD_LOG_ERROR) c->errors++;
    c->level = level;
    snprintf(c->last, sizeof c->last, "%s", message ? message : "(null)");
}

static void test_bad_arguments(void **state) {
    static const dsgd_layer_desc good[2] = {{4, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                            {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    static const dsgd_layer_desc bad_last[2] = {{4, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                                {3, DSGD_ACT_SIGMOID, DSGD_INIT_AUTO}};
    static const dsgd_layer_desc zero_units[2] = {{0, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                                  {3, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = tu_ctx();
    dsgd_model_desc md;
    dsgd_model *m = NULL, *bad = NULL;
    float x[5 * 2] = {0}, y[5] = {0, 1, 2, 0, 1}, out[3];
    (void)state;

    memset(&md, 0, sizeof md);
    md.input_dim = 2;
    md.layers = good;
    md.num_layers = 2;
    md.max_batch = 4;

    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, NULL, &bad));
    assert_null(bad);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, NULL));
    md.num_layers = 0;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    md.num_layers = 2;
    md.layers = NULL;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    md.layers = bad_last; /* SOFTMAX_XENT needs a final NONE */
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    md.loss = DSGD_LOSS_MSE; /* ...but MSE takes any final activation */
    TU_OK(ctx, dsgd_model_create(ctx, &md, &bad));
    dsgd_model_destroy(bad);
    bad = NULL;
    md.loss = DSGD_LOSS_SOFTMAX_XENT;
    md.layers = zero_units;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    md.layers = good;
    md.input_dim = 0;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    md.input_dim = 2;
    md.max_batch = -1;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, &md, &bad));
    assert_null(bad);
    md.max_batch = 4;

    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, x, y, 5, 0.2f));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, x, y, 0, 1.0f));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, x, y, -1, 1.0f));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, NULL, y, 2, 1.0f));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, x, NULL, 2, 1.0f));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_eval_batch(m, x, y, 5));
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_eval_batch(m, x, y, 0));
    /* a class index out of range */
    y[1] = 3.0f;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_compute_gradients(m, x, y, 2, 0.5f));
    y[1] = -1.0f;
    dsgd_ctx_clear_error(ctx);
    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_eval_batch(m, x, y, 2));
    y[1] = 1.0f;
    /* a valid call after errors still works */
    TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, 4, 0.25f));
    TU_OK(ctx, dsgd_model_eval_batch(m, x, y, 1));
    TU_OK(ctx, dsgd_model_read_output(m, out, 1));
    dsgd_ctx_clear_error(ctx);
    assert_string_equal(dsgd_ctx_last_error(ctx), "");
    assert_int_equal(dsgd_ctx_last_result(ctx), DSGD_OK);
    dsgd_model_destroy(m);
    dsgd_model_destroy(NULL); /* destroying nothing is fine */
    dsgd_ctx_destroy(ctx);
}

/* The logger receives each error message; the context label is part of it. */
static void test_logger(void **state) {
    dsgd_ctx_desc cd;
    dsgd_ctx *ctx = NULL;
    dsgd_model *m = NULL;
    log_capture cap;
    (void)state;
    memset(&cap, 0, sizeof cap);
    memset(&cd, 0, sizeof cd);
    cd.logger.func = capture_log;
    cd.logger.user_data = &cap;
    cd.label = "replica 7";
    TU_OK(NULL, dsgd_ctx_create(&cd, &ctx));
    assert_string_equal(dsgd_ctx_last_error(ctx), "");

    TU_ERR(ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_model_create(ctx, NULL, &m));
    assert_true(cap.errors >= 1);
    assert_int_equal(cap.level, DSGD_LOG_ERROR);
    assert_true(cap.last[0] != '\0');
    if (!strstr(cap.last, "replica 7")) fail_msg("logged message lacks the label: '%s'", cap.last);
    /* what was logged is what the context keeps (perhaps with the label around it) */
    if (!strstr(cap.last, dsgd_ctx_last_error(ctx)) && !strstr(dsgd_ctx_last_error(ctx), cap.last))
        fail_msg("logged '%s' but last error is '%s'", cap.last, dsgd_ctx_last_error(ctx));

    /* set_error formats, logs and returns the code */
    cap.errors = 0;
    assert_int_equal(dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "disk %d is %s", 3, "gone"),
                     DSGD_ERR_IO);
    assert_int_equal(cap.errors, 1);
    assert_non_null(strstr(cap.last, "disk 3 is gone"));
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "disk 3 is gone"));
    assert_int_equal(dsgd_ctx_last_result(ctx), DSGD_ERR_IO);
    /* dsgd_ctx_log reaches the logger with its level */
    dsgd_ctx_log(ctx, DSGD_LOG_WARN, "warning %s", "w1");
    assert_int_equal(cap.level, DSGD_LOG_WARN);
    assert_non_null(strstr(cap.last, "warning w1"));
    assert_int_equal(dsgd_ctx_set_error(NULL, DSGD_ERR_STATE, "no context"), DSGD_ERR_STATE);
    /* the getters give what creation fixed: another context can share the logger */
    assert_true(dsgd_ctx_logger(ctx).func == capture_log);
    assert_ptr_equal(dsgd_ctx_logger(ctx).user_data, &cap);
    assert_string_equal(dsgd_ctx_label(ctx), "replica 7");
    assert_null(dsgd_ctx_logger(NULL).func);
    assert_string_equal(dsgd_ctx_label(NULL), "");
    dsgd_ctx_destroy(ctx);
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    assert_null(dsgd_ctx_logger(ctx).func);
    assert_string_equal(dsgd_ctx_label(ctx), "");
    dsgd_ctx_destroy(ctx);
    TU_ERR(NULL, DSGD_ERR_INVALID_ARGUMENT, dsgd_ctx_create(NULL, NULL));
}

static void test_result_strings(void **state) {
    const char *s[11];
    int i, j;
    (void)state;
    for (i = 0; i < 11; ++i) {
        s[i] = dsgd_result_string((dsgd_result)-i);
        assert_non_null(s[i]);
        assert_true(s[i][0] != '\0');
        for (j = 0; j < i; ++j)
            if (strcmp(s[i], s[j]) == 0) fail_msg("codes %d and %d share '%s'", -i, -j, s[i]);
    }
    assert_string_equal(dsgd_result_string(DSGD_OK), "ok");
    /* unknown codes still give a string */
    assert_non_null(dsgd_result_string((dsgd_result)-100));
    assert_non_null(dsgd_result_string((dsgd_result)5));
}

/* ---------------------------------------------------------------- digits */

static void test_train_digits(void **state) {
    static const dsgd_layer_desc layers[2] = {{32, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    char path[256];
    dsgd_ctx *ctx = tu_ctx();
    dsgd_csv_desc cd;
    dsgd_dataset all, train, test;
    dsgd_model_desc md;
    dsgd_optimizer_desc od;
    dsgd_model *m = NULL;
    dsgd_optimizer *opt = NULL;
    dsgd_sampler s;
    dsgd_metrics mt;
    float x[32 * 64], y[32];
    double first_loss = 0, last_loss = 0, acc;
    size_t b, i;
    int epoch;
    (void)state;

    if (!tu_find_repo_file("examples/data/digits.csv", path, sizeof path))
        fail_msg("examples/data/digits.csv not found (run from the repository root)");
    memset(&cd, 0, sizeof cd);
    cd.num_classes = 10;
    cd.feature_scale = 1.0f / 16;
    TU_OK(ctx, dsgd_dataset_load_csv(ctx, path, &cd, &all));
    assert_int_equal(all.n, 1797);
    TU_OK(ctx, dsgd_dataset_split(ctx, &all, 1497, 2024, &train, &test));

    memset(&md, 0, sizeof md);
    md.input_dim = 64;
    md.layers = layers;
    md.num_layers = 2;
    md.max_batch = 32;
    md.seed = 1;
    memset(&od, 0, sizeof od);
    od.kind = DSGD_OPT_ADAM;
    od.lr = 0.01f;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &m));
    TU_OK(ctx, dsgd_optimizer_create(m, &od, &opt));
    TU_OK(ctx, dsgd_sampler_init(ctx, &s, train.n, 32, 5, 1, 0));
    for (epoch = 0; epoch < 10; ++epoch) {
        dsgd_sampler_set_epoch(&s, (uint64_t)epoch);
        for (b = 0; b < dsgd_sampler_num_batches(&s); ++b) {
            const size_t *idx;
            size_t cnt = dsgd_sampler_batch(&s, b, &idx);
            dsgd_dataset_gather(&train, idx, cnt, x, y);
            TU_OK(ctx, dsgd_model_compute_gradients(m, x, y, (int)cnt, 1.0f / (float)cnt));
            TU_OK(ctx, dsgd_optimizer_step(opt));
        }
        TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_TRAIN, &mt));
        assert_true(mt.count == (double)train.n);
        if (epoch == 0) first_loss = mt.loss_sum / mt.count;
        last_loss = mt.loss_sum / mt.count;
    }
    for (i = 0; i < test.n; i += 32) {
        size_t cnt = test.n - i < 32 ? test.n - i : 32;
        TU_OK(ctx, dsgd_model_eval_batch(m, test.x + i * 64, test.y + i, (int)cnt));
    }
    TU_OK(ctx, dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt));
    assert_true(mt.count == 300);
    acc = mt.correct / mt.count;
    print_message("    digits: train loss %.4f -> %.4f, held-out accuracy %.3f\n", first_loss,
                  last_loss, acc);
    assert_true(last_loss < first_loss);
    if (!(acc >= 0.90)) fail_msg("held-out accuracy %.3f < 0.90", acc);

    dsgd_sampler_free(&s);
    dsgd_optimizer_destroy(opt);
    dsgd_model_destroy(m);
    dsgd_dataset_free(&all);
    dsgd_dataset_free(&train);
    dsgd_dataset_free(&test);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients_xent_fd),
        cmocka_unit_test(test_gradients_mse_fd),
        cmocka_unit_test(test_variables_and_forward),
        cmocka_unit_test(test_init_statistics),
        cmocka_unit_test(test_same_seed_same_bits),
        cmocka_unit_test(test_external_backend),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_logger),
        cmocka_unit_test(test_result_strings),
        cmocka_unit_test(test_train_digits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
