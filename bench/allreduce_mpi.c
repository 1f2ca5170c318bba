/* bench/allreduce_mpi.c - the baseline for bench/allreduce.c: the same sizes
   through OpenMPI's MPI_Allreduce (float SUM, in place), one process per
   rank, printing the same columns and machine-readable lines.

   Build and run (see `make bench-mpi`):
     mpicc -O3 -march=native bench/allreduce_mpi.c -o build/bench/allreduce_mpi
     mpirun --allow-run-as-root --oversubscribe -np 2 build/bench/allreduce_mpi
   Options: [-s 4K,64M] [-q] as in bench/allreduce.c.

   time: median over batches of the slowest rank's time per all-reduce
   (back-to-back calls after a barrier); algbw = S / t; busbw = algbw *
   2(N-1)/N; frac_copy / frac_sum = (2 N S / t) / bandwidth of memcpy (2
   bytes per byte) / of c = a + b (3 bytes per element byte), measured with
   min(N, CPUs) processes at once in this run; frac uses the higher.
     RESULT allreduce n=2 bytes=4096 algo=mpi time_us=... algbw_GBps=... busbw_GBps=... frac=...
            frac_memcpy=... frac_sum=... */
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
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"

#define MAX_SIZES 32
#define MAX_BATCHES 9

static double now(void) { return MPI_Wtime(); }

static int iters_for(size_t bytes) {
    size_t it = ((size_t)8 << 20) / bytes; /* the same as bench/allreduce.c */
    if (it < 1) it = 1;
    if (it > 2000) it = 2000;
    return (int)it;
}

static int batches_for(size_t bytes, int quick) {
    if (quick) return bytes >= ((size_t)16 << 20) ? 2 : 3;
    return bytes >= ((size_t)16 << 20) ? 3 : bytes >= ((size_t)1 << 20) ? 5 : 7;
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end == 'K' || *end == 'k') v *= 1024;
    else if (*end == 'M' || *end == 'm') v *= 1024 * 1024;
    return (size_t)v;
}

static void sum_arrays(float *c, const float *a, const float *b, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

/* Aggregate bandwidth of `active` ranks at once (kind 0 memcpy, 1 sum). */
static double measure_bw(int rank, int active, int kind) {
    size_t floats = (size_t)32 << 20, bytes = floats * sizeof(float);
    float *a = NULL, *b = NULL, *c = NULL;
    double best = 1e30, slowest;
    int r;
    if (rank < active) {
        a = (float *)malloc(bytes);
        b = (float *)malloc(bytes);
        c = (float *)malloc(bytes);
        if (!a || !b || !c) MPI_Abort(MPI_COMM_WORLD, 1);
        memset(a, 0, bytes);
        memset(b, 0, bytes);
        memset(c, 0, bytes);
    }
    for (r = 0; r < 5; ++r) {
        double t;
        MPI_Barrier(MPI_COMM_WORLD);
        t = now();
        if (rank < active) {
            if (kind == 0) memcpy(c, a, bytes);
            else sum_arrays(c, a, b, floats);
        }
        t = now() - t;
        if (t < best) best = t;
    }
    if (rank >= active) best = 0;
    MPI_Allreduce(&best, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    free(a);
    free(b);
    free(c);
    return (double)active * (kind ? 3.0 : 2.0) * (double)bytes / slowest;
}

int main(int argc, char **argv) {
    size_t sizes[MAX_SIZES], maxbytes = 0;
    int num_sizes = 8, quick = 0, rank, n, i, k, si;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double memcpy_bw, sum_bw, mem_bw;
    float *buf;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (ncpu < 1) ncpu = 1;
    for (k = 0; k < 8; ++k) sizes[k] = (size_t)4096 << (2 * k);
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-q")) quick = 1;
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            char *tok, *save = NULL;
            num_sizes = 0;
            for (tok = strtok_r(argv[++i], ",", &save); tok; tok = strtok_r(NULL, ",", &save))
                if (num_sizes < MAX_SIZES && parse_size(tok) >= sizeof(float)) sizes[num_sizes++] = parse_size(tok);
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            ++i; /* accepted for symmetry with bench/allreduce.c; N comes from mpirun -np */
        }
    }
    for (si = 0; si < num_sizes; ++si)
        if (sizes[si] > maxbytes) maxbytes = sizes[si];

    {
        int active = (int)(n < ncpu ? n : ncpu);
        memcpy_bw = measure_bw(rank, active, 0);
        sum_bw = measure_bw(rank, active, 1);
        mem_bw = memcpy_bw > sum_bw ? memcpy_bw : sum_bw;
        if (rank == 0) {
            printf("MPI_Allreduce (float SUM, in place), N = %d processes on %ld CPUs: memory bandwidth with %d "
                   "processes: memcpy %.2f GB/s, sum %.2f GB/s; limit used: %.2f GB/s\n",
                   n, ncpu, active, memcpy_bw / 1e9, sum_bw / 1e9, mem_bw / 1e9);
            printf("MEMBW n=%d threads=%d memcpy_GBps=%.3f sum_GBps=%.3f\n", n, active, memcpy_bw / 1e9,
                   sum_bw / 1e9);
            printf("%8s %-18s %-18s %11s %10s %10s %9s %9s\n", "size", "algorithm", "", "time_us", "algbw_GB/s",
                   "busbw_GB/s", "frac_copy", "frac_sum");
        }
    }

    buf = (float *)malloc(maxbytes);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 1);
    memset(buf, 0, maxbytes); /* zeros: sums stay finite and normal */
    for (si = 0; si < num_sizes; ++si) {
        size_t bytes = sizes[si];
        int count = (int)(bytes / sizeof(float)), iters = iters_for(bytes), nb = batches_for(bytes, quick), b, it;
        double per_batch[MAX_BATCHES];
        for (b = -1; b < nb; ++b) { /* batch -1 warms up */
            double t, tmax;
            MPI_Barrier(MPI_COMM_WORLD);
            t = now();
            for (it = 0; it < iters; ++it) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            t = (now() - t) / iters;
            MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (b >= 0) per_batch[b] = tmax;
        }
        if (rank == 0) {
            char hs[16];
            double t, algbw, busbw, frac;
            qsort(per_batch, (size_t)nb, sizeof(double), bench_cmp_double);
            t = per_batch[nb / 2];
            algbw = (double)bytes / t;
            busbw = algbw * 2.0 * (n - 1) / n;
            frac = 2.0 * n * (double)bytes / t / mem_bw;
            if (bytes >= ((size_t)1 << 20)) snprintf(hs, sizeof(hs), "%zuM", bytes >> 20);
            else snprintf(hs, sizeof(hs), "%zuK", bytes >> 10);
            printf("%8s %-18s %-18s %11.2f %10.3f %10.3f %9.3f %9.3f\n", hs, "MPI_Allreduce", "", t * 1e6, algbw / 1e9,
                   busbw / 1e9, 2.0 * n * (double)bytes / t / memcpy_bw, 2.0 * n * (double)bytes / t / sum_bw);
            printf("RESULT allreduce n=%d bytes=%zu algo=mpi time_us=%.3f algbw_GBps=%.4f busbw_GBps=%.4f frac=%.4f "
                   "frac_memcpy=%.4f frac_sum=%.4f\n",
                   n, bytes, t * 1e6, algbw / 1e9, busbw / 1e9, frac, 2.0 * n * (double)bytes / t / memcpy_bw,
                   2.0 * n * (double)bytes / t / sum_bw);
            fflush(stdout);
        }
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
#endif /* HAVE_MPI */
