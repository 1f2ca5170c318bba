/* bench/bench_util.h - the statistics every benchmark shares, and the CPU's
   name for their reports. Benchmarks report medians of repeated samples
   (this machine is noisy), never means. */
#ifndef DSGD_BENCH_UTIL_H
#define DSGD_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* The CPU's model name (/proc/cpuinfo's first "model name"), else
   "unknown CPU", into buf. */
static inline void bench_cpu_model(char *buf, size_t n) {
    char line[256];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(buf, n, "unknown CPU");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (strncmp(line, "model name", 10) != 0 || !c) continue;
        for (++c; *c == ' ' || *c == '\t'; ++c) {
        }
        c[strcspn(c, "\n")] = '\0';
        snprintf(buf, n, "%s", c);
        break;
    }
    if (f) fclose(f);
}

#endif
