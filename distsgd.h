/* distsgd.h - v0.1.0 - data-parallel distributed SGD, header-only C99.
   MIT licence (see the end of this file).

   distsgd trains neural networks with data-parallel SGD, in the style of
   TensorFlow's tf.distribute, from plain C: models (the built-in dense and
   convolutional network, or your own through dsgd_model_i) whose parameters
   live in one flat buffer, optimizers, datasets, replicas that all-reduce
   their gradients over a transport, per-variable aggregation, and strategies
   (one_device, mirrored, multi-worker mirrored, central storage, parameter
   servers, local SGD). It depends on libc, libm and POSIX threads only.

   USING IT

     In exactly one C or C++ file:

         #define DISTSGD_IMPLEMENTATION
         #include "distsgd.h"

     Everywhere else, include "distsgd.h" without the define. From the
     repository or an install, distsgd.h includes its parts from distsgd/
     (keep them beside it); to vendor, copy the one generated file
     single_include/distsgd.h instead, which holds them all. Link with -lm
     (and -lpthread). Define DISTSGD_STATIC before the include to make every
     function static to that translation unit.

   LEAVING PARTS OUT

     Define any of these before the include, in the file that defines
     DISTSGD_IMPLEMENTATION (and in the one that defines
     DISTSGD_MPI_IMPLEMENTATION), to leave a part's implementation out of
     the build; they change no declaration, so other files need not:

         DSGD_NO_SIMNET      the simulated cluster (simnet*.h)
         DSGD_NO_PS          parameter servers: the servers, workers, the
                             coordinator, sharding and the parameter_server
                             kind (ps*.h, coordinator.h, sharding.h,
                             strategy_ps.h), and distsgd_mpi.h's part for them
         DSGD_NO_COMPRESS    the gradient compressors (compress.h)
         DSGD_NO_ELASTIC     elastic training (strategy_elastic.h), and
                             distsgd_mpi.h's part for it
         DSGD_NO_LOCAL       the local kind: local SGD, DiLoCo (strategy_local.h)
         DSGD_NO_TF_CONFIG   the TF_CONFIG parser (tf_config.h); the parameter
                             servers read it, so it needs DSGD_NO_PS (#error
                             otherwise)

     The declarations stay, so a program that calls a function of a part
     left out fails to link, naming it; dsgd_strategy_create refuses a kind
     or a desc.elastic left out with DSGD_ERR_UNSUPPORTED and says which
     define did it. With all of them the implementation compiles in about
     two thirds of the time (docs/building.md has the figures).

   A COMPLETE PROGRAM (C99; it learns XOR)

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
             if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
             if (dsgd_model_create(ctx, &md, &m) != DSGD_OK ||
                 dsgd_optimizer_create(m, &od, &opt) != DSGD_OK) {
                 fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); return 1;
             }
             for (step = 0; step < 300; ++step) {
                 dsgd_model_compute_gradients(m, x, y, 4, 1.0f / 4);
                 dsgd_optimizer_step(opt);
             }
             dsgd_model_eval_batch(m, x, y, 4);
             dsgd_model_take_metrics(m, DSGD_METRICS_EVAL, &mt);
             printf("accuracy %.2f\n", mt.correct / mt.count);
             dsgd_optimizer_destroy(opt); dsgd_model_destroy(m); dsgd_ctx_destroy(ctx);
             return 0;
         }

   CONTENTS

     The library is one part per layer under distsgd/, included below in
     dependency order; each part holds its topic comment, its declarations
     and its implementation, and uses only the parts above it. To vendor
     distsgd, copy the one generated file single_include/distsgd.h instead.

   THREAD SAFETY

     distsgd.h has no global state (distsgd_cl.h adds one mutex), so many
     independent runs can share a process. The rules, which the "Thread
     safety:" line above each function applies:
       - A dsgd_ctx and everything created with it (backend, model, optimizer,
         communicator) is used by one thread at a time: "the context's thread"
         (or the model's, ...). Give each thread its own context. A logger is
         called on the thread that records the message. (A loopback hub is
         the exception: each of its endpoints is used by its rank's thread.)
       - Functions of their arguments alone (names of codes, dsgd_block_range,
         dsgd_lr_at, the RNG on your own state, dsgd_now) run on any thread.
         So do getters that read only what creation fixed (dsgd_comm_rank,
         dsgd_model_num_params, ...), while the object lives.
       - Datasets are read-only after loading and may be shared between
         threads; a sampler is used by one thread at a time.
       - Collectives: each rank's communicator (and transport endpoint) lives
         on that rank's thread, and all ranks call the same collectives
         concurrently. dsgd_loopback_abort and dsgd_loopback_aborted may be
         called from any thread while the hub exists.
       - Parameter servers (ps.h): each server and each worker is used by
         its rank's thread (with its own context); they share only the
         transport and the read-only shard map.
       - A strategy is driven from one thread, the one that owns its ctx. It
         runs replica 0 on that thread and replicas 1..N-1 on threads of its
         own, each with its own context (and backend, model, optimizer and
         communicator), and returns only when they are done. The replicas'
         contexts share the strategy context's logger, so that logger may be
         called from several threads at once. Inside dsgd_strategy_run, fn
         runs on every replica's thread at once and uses that replica's
         objects (dsgd_replica_*), not the strategy's functions.
       - Gradient paths (see BACKENDS): on the HOST path each replica touches
         only its own gradient buffer. On the DEVICE path (every replica on
         one device) replica r's backend reads and writes block r of every
         replica's gradient buffer; the strategy orders this itself: each
         replica finishes its queue and enters a barrier, sums its block
         (sum_across) and finishes again, and a second barrier keeps every
         replica from using its gradient before all blocks are written.
       - A CPU backend made with threads > 1 (dsgd_cpu_backend_desc; the
         strategies' default when there are fewer replicas than cores) runs
         parts of each operation on helper threads of its own, inside the
         call, which returns when they are done: to its caller it is still
         one backend used by one thread at a time. Its helpers touch no
         context and call no logger.
*/
#ifndef DISTSGD_H
#define DISTSGD_H

#define DISTSGD_VERSION_MAJOR 0
#define DISTSGD_VERSION_MINOR 1
#define DISTSGD_VERSION_PATCH 0
#define DISTSGD_VERSION_STRING "0.1.0"

#endif /* DISTSGD_H */

/* Every part is guarded twice (declarations; implementation when
   DISTSGD_IMPLEMENTATION is defined), so this file may be included again. */
#include "distsgd/base.h"             /* API decoration, results, context, RNG, clock */
#include "distsgd/internal.h"         /* private helpers shared by the core and its add-ons */
#include "distsgd/backend.h"          /* the compute interface, dsgd_backend_i */
#include "distsgd/backend_cpu.h"      /* the CPU reference backend: its state, buffers, thread pool, kernels by ISA */
#include "distsgd/backend_cpu_gemm.h" /* the CPU backend's cache-blocked GEMM, on one thread and on the pool */
#include "distsgd/backend_cpu_ops.h"  /* the CPU backend's other operations and its table, dsgd_cpu_backend_create */
#include "distsgd/half.h"             /* fp16 and bf16: conversions to and from fp32, by ISA */
#include "distsgd/model.h"            /* models: the interface, the built-in network (dense, conv, pool), variables */
#include "distsgd/optim.h"            /* optimizers, clipping, learning-rate schedules */
#include "distsgd/data.h"             /* datasets, samplers, the IDX and CSV loaders */
#include "distsgd/checkpoint.h"       /* checkpoints: the file format, atomic writes, a model's state */
#include "distsgd/transport.h"        /* the transport interface, reduce ops and kernels */
#include "distsgd/loopback.h"         /* the loopback transport: ranks as threads */
#include "distsgd/simnet.h"           /* the simnet transport: ranks as threads on a virtual clock */
#include "distsgd/simnet_sched.h"     /* the simnet scheduler: fibers, turns, the timeline, entering and leaving */
#include "distsgd/simnet_endpoint.h"  /* the simnet endpoint: transfers, its operations, run, park/spare/admit, lanes */
#include "distsgd/collectives.h"      /* communicators, the agreement, all-reduce and the rest */
#include "distsgd/collectives_agree.h" /* the agreement: fingerprints, their rounds, the first exchanges they carry */
#include "distsgd/collectives_algos.h" /* the all-reduce algorithms, the half wire, the collectives' entry points */
#include "distsgd/variables.h"        /* aggregation and synchronization of distributed variables */
#include "distsgd/comm_hook.h"        /* comm hooks: your own code exchanges a bucket of the gradient */
#include "distsgd/compress.h"         /* gradient compressors with error feedback (top-k, sign, PowerSGD) as comm hooks */
#include "distsgd/sharding.h"         /* partitioners and the shard map of the parameter servers */
#include "distsgd/group.h"            /* rank groups: each member's context, backend, model, endpoint */
#include "distsgd/ps.h"               /* the parameter servers' protocol: desc, header, the policy and placement tables */
#include "distsgd/ps_checkpoint.h"    /* the parameter servers' checkpoint format and its checks */
#include "distsgd/ps_server.h"        /* a parameter server: applies pushes (or sums), answers pulls */
#include "distsgd/ps_worker.h"        /* a parameter-server worker: pull, push, finish */
#include "distsgd/coordinator.h"      /* the cluster coordinator: closures scheduled on workers */
#include "distsgd/tf_config.h"        /* TF_CONFIG: the cluster and this task, parsed with TF's rules */
#include "distsgd/strategy.h"         /* strategies, replicas, the common step machinery */
#include "distsgd/strategy_vars.h"    /* a strategy's distributed variables and metrics */
#include "distsgd/strategy_create.h"  /* a strategy's creation, in phases: desc, transport, replicas, metrics, workers */
#include "distsgd/strategy_run.h"     /* getters, train and eval steps, dsgd_strategy_run, the wait report */
#include "distsgd/strategy_overlap.h" /* the synchronous exchange beside backward: gradient-ready buckets */
#include "distsgd/strategy_sync.h"    /* the synchronous kinds: one_device, mirrored, multi_worker_mirrored */
#include "distsgd/strategy_central.h" /* central storage: the variables once, on the host */
#include "distsgd/strategy_ps.h"      /* parameter servers as a kind: the replicas are the workers */
#include "distsgd/strategy_local.h"   /* local SGD, post-local SGD, DiLoCo: replicas that average every H steps */
#include "distsgd/strategy_elastic.h" /* elastic synchronous training: the group shrinks past a failed, dead or late replica */
#include "distsgd/strategy_kinds.h"   /* the table of kinds; dsgd_strategy_create */
#include "distsgd/strategy_checkpoint.h" /* a strategy's checkpoint: replicas, variables, metrics */

/* ------------------------------------------------------------------------
   LICENCE (also in the file LICENSE)

   MIT License

   Copyright (c) 2026 the distsgd authors

   Permission is hereby granted, free of charge, to any person obtaining a copy
   of this software and associated documentation files (the "Software"), to deal
   in the Software without restriction, including without limitation the rights
   to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
   copies of the Software, and to permit persons to whom the Software is
   furnished to do so, subject to the following conditions:

   The above copyright notice and this permission notice shall be included in all
   copies or substantial portions of the Software.

   THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
   IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
   FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
   LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
   OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
   SOFTWARE.
*/
