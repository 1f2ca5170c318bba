/* distsgd_cl.h - v0.1.0 - OpenCL backend for distsgd (GEMM by CLBlast, every
   other computation by our own OpenCL C kernels).
   MIT licence (see the end of distsgd.h).

   This header adds a dsgd_backend_i that runs on any OpenCL 1.2 device (AMD,
   Intel and NVIDIA GPUs, CPUs through PoCL) through the Khronos ICD loader.
   Matrix products go to CLBlast's C API; bias, activations, losses, optimizer
   updates, scale/axpy, the non-finite check and the cross-replica gradient
   sum are kernels embedded below as source and built once per context.

   USING IT

     In exactly one C or C++ file:

         #define DISTSGD_IMPLEMENTATION      (unless another file has it)
         #define DISTSGD_CL_IMPLEMENTATION
         #include "distsgd_cl.h"             (it includes distsgd.h)

     Build with the flags of pkg-config's OpenCL and clblast packages:

         cc -std=c99 app.c $(pkg-config --cflags OpenCL clblast) \
            $(pkg-config --libs OpenCL clblast) -lm -lpthread

     On Debian/Ubuntu: ocl-icd-opencl-dev opencl-headers libclblast-dev, plus a
     driver (ICD): pocl-opencl-icd for the CPU, or the GPU vendor's (below).

   A COMPLETE PROGRAM (C99; a model on the default OpenCL device)

         #define DISTSGD_IMPLEMENTATION
         #define DISTSGD_CL_IMPLEMENTATION
         #include "distsgd_cl.h"
         #include <stdio.h>

         int main(void) {
             float x[8] = {0,0, 0,1, 1,0, 1,1}, y[4] = {0, 1, 1, 0};
             dsgd_layer_desc layers[2] = {{8, DSGD_ACT_TANH, DSGD_INIT_AUTO},
                                          {2, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
             dsgd_model_desc md = {0};
             dsgd_cl_context_desc cd = {0};
             dsgd_backend_i be;
             dsgd_ctx *ctx; dsgd_cl_context *cl; dsgd_model *m;
             if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
             if (dsgd_cl_context_create(ctx, &cd, &cl) != DSGD_OK ||
                 dsgd_cl_backend_create(ctx, cl, NULL, &be) != DSGD_OK) {
                 fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); return 1;
             }
             md.input_dim = 2; md.layers = layers; md.num_layers = 2;
             md.max_batch = 4; md.backend = &be;
             if (dsgd_model_create(ctx, &md, &m) == DSGD_OK) {
                 dsgd_model_compute_gradients(m, x, y, 4, 1.0f / 4);
                 dsgd_model_destroy(m);
             }
             be.destroy(be.impl);
             dsgd_cl_context_destroy(cl);
             dsgd_ctx_destroy(ctx);
             return 0;
         }

   CONFIGURATION

     dsgd_cl_context_desc (which devices, GEMM tuning, extra kernel build
     options, the queue policy) and dsgd_cl_backend_desc (device index, buffer placement,
     profiling), where zero means the default as in distsgd.h; either may be
     passed as NULL. Environment: DSGD_CL_DEVICE, DSGD_CL_PLATFORM and
     DSGD_CL_DEVICE_TYPE when desc.device is NULL (see DEVICES);
     DSGD_CL_TUNE_CACHE, XDG_CACHE_HOME and HOME (see GEMM TUNING);
     POCL_CACHE_DIR (see COLD START). Compile time: CL_TARGET_OPENCL_VERSION
     (default 120) and CL_USE_DEPRECATED_OPENCL_1_2_APIS are defined unless
     already set; when distsgd.h's allocator is replaced (DSGD_MALLOC,
     DSGD_REALLOC, DSGD_FREE) this file's host allocations use it too.

   THREAD SAFETY

     A dsgd_cl_context may be shared by backends used from different threads
     (OpenCL contexts and programs are thread-safe); create and destroy it on
     one thread while no backend uses it. Each backend (its kernel objects,
     scratch and GEMM temporary buffers) is used by one thread at a time,
     like its dsgd_ctx; backends sharing a device's queue (QUEUES) may be
     used from different threads, as OpenCL queues are thread-safe. A backend's sum_across reads and writes other
     backends' buffers: every backend involved must have finished the work
     that touches those ranges before it runs, and they may use them again
     only once it has finished (the strategy's DEVICE path does this with
     finish and two barriers). CLBlast is not safe for concurrent first
     calls, so every CLBlast call (with the growth of a backend's GEMM
     temporary buffer) goes through one process-wide mutex, the only global
     state of distsgd. Functions of their arguments alone (names, error
     strings, dsgd_cl_gemm_params_valid, ...) run on any thread.

   CONTENTS

     The add-on is one part per layer under distsgd/cl/, included below in
     dependency order after the core (distsgd.h); each part holds its topic
     comment, its declarations and its implementation: DEVICES and ERRORS
     in devices.h, PRECISION in kernels.h, QUEUES, GEMM TUNING and COLD
     START in context.h, BACKENDS and TRANSPORTS in backend.h. To vendor
     it, copy single_include/distsgd.h and define DISTSGD_WITH_OPENCL.
*/
#include "distsgd.h"

#include "distsgd/cl/devices.h" /* the OpenCL headers, error names, the device list, the spec that picks devices */
#include "distsgd/cl/kernels.h" /* our OpenCL C kernels: their source and their names */
#include "distsgd/cl/context.h" /* the shared context: its devices and queues, our kernels built, GEMM parameters */
#include "distsgd/cl/backend.h" /* the OpenCL backend: CLBlast GEMM and our kernels behind dsgd_backend_i */
#include "distsgd/cl/backend_ops.h" /* the OpenCL backend's operations: copies, GEMM, activations, losses, images, marks */
#include "distsgd/cl/backend_create.h" /* the OpenCL backend's queue, kernels and table: dsgd_cl_backend_create */
