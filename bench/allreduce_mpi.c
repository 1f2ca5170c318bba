/* bench/allreduce_mpi.c - all-reduce across processes, side by side: MPI's
   own MPI_Allreduce and distsgd's all-reduces over its MPI transport
   (distsgd_mpi.h), float SUM in place, one process per rank, in one run.

   Rows, per size:
     MPI_Allreduce   MPI_Allreduce(MPI_IN_PLACE, ...) on MPI_COMM_WORLD
     hook            the transport's native hook (t.allreduce: MPI_Allreduce
                     on the endpoint's helper thread, waited for against the
                     deadline; see distsgd/mpi/transport.h), called directly
     hook_blocking   the same hook on an endpoint created with
                     blocking_allreduce = 1 (and no_share): MPI_Allreduce on
                     the calling thread, no deadline
     auto            dsgd_allreduce(AUTO): what dsgd_allreduce_choose picks
                     (named in the row), with its agreement (ceil(log2 N)
                     rounds of 144-byte messages first, except DIRECT, whose
                     fingerprints ride in the windows)
     ring            dsgd_allreduce(RING) over MPI point-to-point messages: one
                     message per ring step (see distsgd/collectives.h)
     ring_pieces     the same ring with the schedule it had before: the
                     blocks cut into pieces (piece_bytes, 256 KiB), each piece
                     through the whole ring before the next, one latency per
                     piece and step (the communicator's benchmark-only
                     ring_pieces; the same bits)
     direct          dsgd_allreduce(DIRECT) through the MPI-3 shared-memory
                     windows (every rank on one node)
     MPI_again       MPI_Allreduce once more: the noise control (its vs_mpi
                     would be 1 on a quiet machine)
   The methods take turns within each batch, each batch starting one method
   later than the one before, so drift and the place in the turn hit them
   alike.

   Build and run (see `make bench-mpi`):
     mpicc -std=c99 -O3 -march=native -I. bench/allreduce_mpi.c -o build/mpi/allreduce_mpi -lm -lpthread
     mpirun --allow-run-as-root --oversubscribe -np 2 build/mpi/allreduce_mpi
   Options: [-s 4K,64M] (sizes; default 4K, 16K, ..., 64M) [-q] (fewer
   batches) [-b B] (batches, the median is taken over them) [-w BYTES]
   (dsgd_mpi_desc.share_bytes, the shared-memory window; default 1M) [-m
   mpi,hook,hook_blocking,...] (the methods to run, by row name; mpi is always
   run: the ratios need it).

   time: median over batches of the slowest rank's time per all-reduce
   (back-to-back calls after a barrier); algbw = S / t; busbw = algbw *
   2(N-1)/N (nccl-tests' bus bandwidth); vs_mpi = MPI_Allreduce's time / this
   method's time in the same run (> 1: faster than MPI_Allreduce);
   frac_copy = (2 N S / t) / the bandwidth of memcpy measured with min(N,
   CPUs) processes at once in this run.
     RESULT allreduce_mpi n=2 bytes=4096 algo=mpi time_us=... algbw_GBps=... busbw_GBps=... vs_mpi=...
            frac_copy=... */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>

/* Plain `cc` (as `make bench` builds every bench program) does not see mpi.h;
   then the program only prints how to build and run the MPI benchmark. */
#if defined(__has_include)
#if __has_include(<mpi.h>)
#define HAVE_MPI 1
#endif
#endif

#ifndef HAVE_MPI
int main(void) {
    puts("allreduce_mpi: built without MPI (mpi.h not found); `make bench-mpi` builds it with mpicc and runs it");
    return 0;
}
#else
#define DISTSGD_IMPLEMENTATION
#define DISTSGD_MPI_IMPLEMENTATION
#include "../distsgd_mpi.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_SIZES 32
#define MAX_BATCHES 31
#define TIMEOUT_S 120.0

enum { M_MPI, M_HOOK, M_HOOK_BLOCKING, M_AUTO, M_RING, M_RING_PIECES, M_DIRECT, M_MPI_AGAIN, M_COUNT };
static const char *const METHOD_NAME[M_COUNT] = {"MPI_Allreduce", "hook", "hook_blocking", "auto",
                                                 "ring", "ring_pieces", "direct", "MPI_again"};
static const char *const METHOD_KEY[M_COUNT] = {"mpi",  "hook",        "hook_blocking", "auto",
                                                "ring", "ring_pieces", "direct",        "mpi_again"};

static double now(void) { return MPI_Wtime(); }

static int iters_for(size_t bytes) {
    size_t it = ((size_t)8 << 20) / bytes; /* as bench/allreduce.c, but at least 3: one call after
                                              another method was noisy (the cache it left) */
    if (it < 3) it = 3;
    if (it > 2000) it = 2000;
    return (int)it;
}

static int batches_for(size_t bytes, int quick) {
    if (quick) return 3;
    return bytes >= ((size_t)16 << 20) ? 7 : bytes >= ((size_t)1 << 20) ? 7 : 9;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    return (size_t)v;
}

/* Aggregate memcpy bandwidth of `active` ranks at once. */
static double measure_copy_bw(int rank, int active) {
    size_t bytes = (size_t)128 << 20;
    char *a = NULL, *c = NULL;
    double best = 1e30, slowest;
    int r;
    if (rank < active) {
        a = (char *)malloc(bytes);
        c = (char *)malloc(bytes);
        if (!a || !c) MPI_Abort(MPI_COMM_WORLD, 1);
        memset(a, 1, bytes);
        memset(c, 0, bytes);
    }
    for (r = 0; r < 5; ++r) {
        double t;
        MPI_Barrier(MPI_COMM_WORLD);
        t = now();
        if (rank < active) memcpy(c, a, bytes);
        t = now() - t;
        if (t < best) best = t;
    }
    if (rank >= active) best = 0;
    MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(a);
    free(c);
    return (double)active * 2.0 * (double)bytes / slowest;
}

static void fail(dsgd_ctx *ctx, const char *what) {
    fprintf(stderr, "allreduce_mpi: %s: %s\n", what, dsgd_ctx_last_error(ctx));
    dsgd_mpi_abort(1);
}

/* iters calls of method m; returns the seconds this rank spent per call. */
static double run_method(int m, dsgd_transport_i *t, dsgd_transport_i *tb, dsgd_comm *comm, dsgd_comm *comm_pieces, dsgd_ctx *ctx,
                         float *buf, size_t count, int iters) {
    double t0;
    int it;
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now();
    for (it = 0; it < iters; ++it) {
        dsgd_result r = DSGD_OK;
        switch (m) {
        case M_MPI:
        case M_MPI_AGAIN: MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
        case M_HOOK: r = t->allreduce(t->impl, buf, count, DSGD_REDUCE_SUM, dsgd_now() + TIMEOUT_S); break;
        case M_HOOK_BLOCKING: r = tb->allreduce(tb->impl, buf, count, DSGD_REDUCE_SUM, dsgd_now() + TIMEOUT_S); break;
        case M_AUTO: r = dsgd_allreduce(comm, buf, count, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_AUTO, TIMEOUT_S); break;
        case M_RING: r = dsgd_allreduce(comm, buf, count, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING, TIMEOUT_S); break;
        case M_RING_PIECES:
            r = dsgd_allreduce(comm_pieces, buf, count, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_RING, TIMEOUT_S);
            break;
        default: r = dsgd_allreduce(comm, buf, count, DSGD_REDUCE_SUM, DSGD_ALLREDUCE_DIRECT, TIMEOUT_S); break;
        }
        if (r != DSGD_OK) fail(ctx, METHOD_NAME[m]);
    }
    return (now() - t0) / iters;
}

int main(int argc, char **argv) {
    size_t sizes[MAX_SIZES], maxbytes = 0, wbytes = 0;
    int num_sizes = 8, quick = 0, batches = 0, rank, n, i, k, si, m, provided = 0, want[M_COUNT];
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double copy_bw;
    float *buf;
    dsgd_ctx *ctx = NULL;
    dsgd_transport_i t, tb;
    dsgd_comm *comm = NULL, *comm_pieces = NULL;
    dsgd_mpi_desc md, mb;
    memset(&md, 0, sizeof(md));
    memset(&mb, 0, sizeof(mb));
    mb.no_share = 1;
    mb.blocking_allreduce = 1;
    for (m = 0; m < M_COUNT; ++m) want[m] = 1;
    for (i = 1; i + 1 < argc; ++i)
        if (!strcmp(argv[i], "-w")) md.share_bytes = parse_size(argv[i + 1]);
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) return 1;
    if (dsgd_mpi_init(ctx, &argc, &argv, &provided) != DSGD_OK) fail(ctx, "dsgd_mpi_init");
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (dsgd_mpi_transport_create(ctx, &md, &t) != DSGD_OK) fail(ctx, "dsgd_mpi_transport_create");
    if (dsgd_mpi_transport_create(ctx, &mb, &tb) != DSGD_OK) fail(ctx, "dsgd_mpi_transport_create (blocking)");
    if (dsgd_comm_create(ctx, &t, NULL, &comm) != DSGD_OK) fail(ctx, "dsgd_comm_create");
    /* a second communicator over the same endpoint (their collectives never
       overlap), with the ring's old schedule */
    if (dsgd_comm_create(ctx, &t, NULL, &comm_pieces) != DSGD_OK) fail(ctx, "dsgd_comm_create");
    comm_pieces->ring_pieces = 1; /* benchmarks only */
    if (t.share_window) t.share_window(t.impl, &wbytes);
    if (ncpu < 1) ncpu = 1;
    for (k = 0; k < 8; ++k) sizes[k] = (size_t)4096 << (2 * k);
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-q")) quick = 1;
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) batches = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-w") && i + 1 < argc) ++i; /* read above */
        else if (!strcmp(argv[i], "-m") && i + 1 < argc) {
            char *tok, *save = NULL;
            for (m = 1; m < M_COUNT; ++m) want[m] = 0;
            for (tok = strtok_r(argv[++i], ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                for (m = 0; m < M_COUNT && strcmp(tok, METHOD_KEY[m]) != 0; ++m) {}
                if (m == M_COUNT) {
                    if (rank == 0) fprintf(stderr, "allreduce_mpi: unknown method %s\n", tok);
                    dsgd_mpi_abort(2);
                }
                want[m] = 1;
            }
        }
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            char *tok, *save = NULL;
            num_sizes = 0;
            for (tok = strtok_r(argv[++i], ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (num_sizes < MAX_SIZES && parse_size(tok) >= sizeof(float)) sizes[num_sizes++] = parse_size(tok);
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            ++i; /* accepted for symmetry with bench/allreduce.c; N comes from mpirun -np */
        }
    }
    if (batches > MAX_BATCHES) batches = MAX_BATCHES;
    for (si = 0; si < num_sizes; ++si)
        if (sizes[si] > maxbytes) maxbytes = sizes[si];

    {
        int active = (int)(n < ncpu ? n : ncpu);
        copy_bw = measure_copy_bw(rank, active);
        if (rank == 0) {
            printf("all-reduce across processes (float SUM, in place), N = %d processes on %ld CPUs, MPI thread level "
                   "%d; memcpy bandwidth with %d processes: %.2f GB/s; direct: %s of %zu bytes\n",
                   n, ncpu, provided, active, copy_bw / 1e9,
                   t.share ? "shared-memory windows" : "unavailable (not one node): windows", wbytes);
            printf("MEMBW n=%d threads=%d memcpy_GBps=%.3f\n", n, active, copy_bw / 1e9);
            printf("%8s %-22s %11s %10s %10s %7s %9s\n", "size", "method", "time_us", "algbw_GB/s", "busbw_GB/s",
                   "vs_mpi", "frac_copy");
        }
    }

    buf = (float *)malloc(maxbytes);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(buf, 0, maxbytes); /* zeros: sums stay finite and normal */
    for (si = 0; si < num_sizes; ++si) {
        size_t bytes = sizes[si], count = bytes / sizeof(float);
        int iters = iters_for(bytes), nb = batches > 0 ? batches : batches_for(bytes, quick), b;
        double per_batch[M_COUNT][MAX_BATCHES], med[M_COUNT];
        int order[M_COUNT], nm = 0;
        for (m = 0; m < M_COUNT; ++m)
            if (want[m] && !(m == M_DIRECT && !t.share)) order[nm++] = m;
        for (b = -1; b < nb; ++b) { /* batch -1 warms up */
            for (k = 0; k < nm; ++k) {
                double tm, tmax;
                m = order[(k + b + 1) % nm];
                tm = run_method(m, &t, &tb, comm, comm_pieces, ctx, buf, count, iters);
                MPI_Allreduce(&tm, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                if (b >= 0) per_batch[m][b] = tmax;
            }
        }
        if (rank == 0) {
            char hs[16];
            if (bytes >= ((size_t)1 << 20)) snprintf(hs, sizeof(hs), "%zuM", bytes >> 20);
            else snprintf(hs, sizeof(hs), "%zuK", bytes >> 10);
            for (m = 0; m < M_COUNT; ++m) {
                char label[40];
                double tt, algbw, busbw, vs;
                if (!want[m] || (m == M_DIRECT && !t.share)) continue;
                med[m] = tt = bench_median(per_batch[m], nb);
                algbw = (double)bytes / tt;
                busbw = algbw * 2.0 * (n - 1) / n;
                vs = med[M_MPI] / tt;
                if (m == M_AUTO) {
                    dsgd_allreduce_algo a = dsgd_allreduce_choose(comm, count);
                    snprintf(label, sizeof(label), "auto (%s)", a == DSGD_ALLREDUCE_AUTO ? "hook" : dsgd_allreduce_algo_name(a));
                } else {
                    snprintf(label, sizeof(label), "%s", METHOD_NAME[m]);
                }
                printf("%8s %-22s %11.2f %10.3f %10.3f %7.3f %9.3f\n", hs, label, tt * 1e6, algbw / 1e9, busbw / 1e9,
                       vs, 2.0 * n * (double)bytes / tt / copy_bw);
                printf("RESULT allreduce_mpi n=%d bytes=%zu algo=%s time_us=%.3f algbw_GBps=%.4f busbw_GBps=%.4f "
                       "vs_mpi=%.4f frac_copy=%.4f\n",
                       n, bytes, METHOD_KEY[m], tt * 1e6, algbw / 1e9, busbw / 1e9, vs,
                       2.0 * n * (double)bytes / tt / copy_bw);
            }
            fflush(stdout);
        }
    }
    free(buf);
    dsgd_comm_destroy(comm);
    dsgd_comm_destroy(comm_pieces);
    t.destroy(t.impl);
    tb.destroy(tb.impl);
    dsgd_ctx_destroy(ctx);
    MPI_Finalize();
    return 0;
}
#endif /* HAVE_MPI */
