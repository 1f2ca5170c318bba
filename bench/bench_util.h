/* bench/bench_util.h - the statistics every benchmark shares. Benchmarks
   report medians of repeated samples (this machine is noisy), never means. */
#ifndef DSGD_BENCH_UTIL_H
#define DSGD_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* qsort comparator for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v[0 .. n) and returns its median (the mean of the middle two for
   even n). n >= 1. */
static inline double bench_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The OpenCL benches' thread count: `requested`, or POCL_MAX_PTHREAD_COUNT,
   or dsgd_cpu_count(); PoCL reads POCL_MAX_PTHREAD_COUNT once per process,
   so this sets it (before any OpenCL call) and refuses a different value
   already set, so that PoCL runs on as many threads as the CPU side it is
   compared with. Returns 0, after a message naming `prog`, on error.
   Include after distsgd.h. */
static inline int bench_pocl_threads(const char *prog, int requested) {
    const char *env = getenv("POCL_MAX_PTHREAD_COUNT");
    int pocl = env && *env ? atoi(env) : 0;
    char buf[16];
    if (env && *env && pocl < 1) {
        fprintf(stderr, "%s: POCL_MAX_PTHREAD_COUNT=%s is not a thread count\n", prog, env);
        return 0;
    }
    if (requested < 1) requested = pocl ? pocl : dsgd_cpu_count();
    if (pocl && pocl != requested) {
        fprintf(stderr,
                "%s: --threads %d but POCL_MAX_PTHREAD_COUNT=%d: PoCL would run on other threads than the CPU "
                "side; unset it (the bench then sets it) or make them equal\n",
                prog, requested, pocl);
        return 0;
    }
    snprintf(buf, sizeof buf, "%d", requested);
    if (setenv("POCL_MAX_PTHREAD_COUNT", buf, 1) != 0) return 0;
    return requested;
}

#endif
