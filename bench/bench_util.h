/* bench/bench_util.h - the statistics every benchmark shares. Benchmarks
   report medians of repeated samples (this machine is noisy), never means. */
#ifndef DSGD_BENCH_UTIL_H
#define DSGD_BENCH_UTIL_H

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

#endif
