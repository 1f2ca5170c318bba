/* cl_mlp.h - the small MLP that the OpenCL strategy tests train
   (test_cl_strategy.c, test_cl_devices.c): 20-16-8-5, relu and tanh, batch
   B per replica, STEPS steps, its weights from MODEL_SEED. Include it after
   harness.h and distsgd_cl.h. */
#ifndef DSGD_TESTS_CL_MLP_H
#define DSGD_TESTS_CL_MLP_H

enum { IN = 20, OUT = 5, NPARAMS = 20 * 16 + 16 + 16 * 8 + 8 + 8 * 5 + 5, B = 8, STEPS = 20 };

static const dsgd_layer_desc LAYERS[3] = {
    {16, DSGD_ACT_RELU, DSGD_INIT_AUTO},
    {8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
    {OUT, DSGD_ACT_NONE, DSGD_INIT_AUTO},
};

#define MODEL_SEED 20240611u

/* The model part of a strategy's desc: this MLP, at most max_batch samples
   per replica. */
static void cl_mlp_model(dsgd_model_desc *m, int max_batch) {
    m->input_dim = IN;
    m->layers = LAYERS;
    m->num_layers = 3;
    m->max_batch = max_batch;
    m->seed = MODEL_SEED;
}

#endif /* DSGD_TESTS_CL_MLP_H */
