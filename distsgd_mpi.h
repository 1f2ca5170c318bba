/* distsgd_mpi.h - v0.1.0 - MPI transport for distsgd (ranks as MPI processes).
   MIT licence (see the end of distsgd.h).

   This header adds a dsgd_transport_i over an MPI communicator, so that the
   collectives (and the strategies and the parameter-server engine above
   them) run across processes and machines on the MPI engine a cluster
   already has (OpenMPI, MPICH). Each rank is an MPI process; the library's
   deadlines, error messages and checks keep their promises over MPI.

   USING IT

     In exactly one C or C++ file:

         #define DISTSGD_IMPLEMENTATION      (unless another file has it)
         #define DISTSGD_MPI_IMPLEMENTATION
         #include "distsgd_mpi.h"            (it includes distsgd.h, then <mpi.h>)

     Build with the MPI compiler wrapper (or the flags it prints with
     `mpicc --showme:compile` / `mpicc -show`) and run under mpirun:

         mpicc -std=c99 app.c -o app -lm -lpthread
         mpirun -np 4 ./app

     On Debian/Ubuntu: libopenmpi-dev openmpi-bin (or libmpich-dev mpich).

   A COMPLETE PROGRAM (C99; every rank ends with the mean of the ranks' vectors)

         #define DISTSGD_IMPLEMENTATION
         #define DISTSGD_MPI_IMPLEMENTATION
         #include "distsgd_mpi.h"
         #include <stdio.h>

         int main(int argc, char **argv) {
             float g[4];
             dsgd_mpi_desc md = {0};
             dsgd_transport_i t;
             dsgd_ctx *ctx; dsgd_comm *comm;
             int i;
             if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
             if (dsgd_mpi_init(ctx, &argc, &argv, NULL) != DSGD_OK ||
                 dsgd_mpi_transport_create(ctx, &md, &t) != DSGD_OK ||
                 dsgd_comm_create(ctx, &t, NULL, &comm) != DSGD_OK) {
                 fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); dsgd_mpi_abort(1);
             }
             for (i = 0; i < 4; ++i) g[i] = (float)(t.rank * 4 + i);
             if (dsgd_allreduce(comm, g, 4, DSGD_REDUCE_MEAN, DSGD_ALLREDUCE_AUTO, 10.0) != DSGD_OK) {
                 fprintf(stderr, "%s\n", dsgd_ctx_last_error(ctx)); dsgd_mpi_abort(1);
             }
             printf("rank %d of %d: %g %g %g %g\n", t.rank, t.size, g[0], g[1], g[2], g[3]);
             dsgd_comm_destroy(comm);
             t.destroy(t.impl);
             dsgd_ctx_destroy(ctx);
             MPI_Finalize();
             return 0;
         }

     After a failed collective the program ends the whole job with
     dsgd_mpi_abort (MPI_Abort): MPI cannot cancel what a timed-out transfer
     left pending, so MPI_Finalize could wait forever (see AFTER A FAILURE in
     distsgd/mpi/transport.h).

   CONFIGURATION

     dsgd_mpi_desc: the communicator whose ranks make the group (zero:
     MPI_COMM_WORLD) and the thread level the program needs (zero:
     MPI_THREAD_SERIALIZED). Compile time: DSGD_MPI_MAX_MESSAGE, the largest
     payload of one MPI message (1 GiB; larger messages go in pieces).

   THREAD SAFETY

     MPI's thread level decides which threads may call MPI: dsgd_mpi_init
     asks for MPI_THREAD_MULTIPLE, and dsgd_mpi_transport_create refuses an
     MPI that provides less than desc.thread_level. An endpoint is used by one
     thread at a time, as every transport, and its abort member by any
     thread (it sets a flag and calls no MPI function). Endpoints hold no
     global state: a process may hold several (each on its own duplicate
     communicator), used from different threads when MPI provides
     MPI_THREAD_MULTIPLE. dsgd_mpi_transport_create_local makes several
     endpoints of one group per process (count * P ranks, one per local
     replica thread), used concurrently; it needs MPI_THREAD_MULTIPLE.
     dsgd_mpi_abort may be called from any thread.

   CONTENTS

     The add-on is one part per layer under distsgd/mpi/, included below in
     dependency order after the core (distsgd.h); each part holds its topic
     comment, its declarations and its implementation. To vendor it, copy
     single_include/distsgd.h and define DISTSGD_WITH_MPI.
*/
#include "distsgd.h"

#include "distsgd/mpi/transport.h"            /* the MPI transport: its interface, messages, deadlines, probe */
#include "distsgd/mpi/transport_collective.h" /* its collective side: the native all-reduce, shared memory, nodes, creation */
#include "distsgd/mpi/ps.h"                   /* parameter servers over MPI: this process's role (TF_CONFIG or a rank layout), the engine's rank order */
#include "distsgd/mpi/elastic.h"              /* elastic multi-worker training: a planned leave (MPI_Comm_split), a grow (MPI_Comm_spawn), ULFM where there is one */
