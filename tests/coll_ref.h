/* coll_ref.h - the serial double-precision reference of a reduction over
   ranks, shared by tests/test_collectives.c (loopback) and
   tests/mpi_collectives.c (MPI). Include after the library; no test
   framework needed. */
#ifndef DSGD_TEST_COLL_REF_H
#define DSGD_TEST_COLL_REF_H

#include <float.h>
#include <math.h>
#include <stdlib.h>

/* Per element: the sum and the sum of |x| in double, the max and the min. */
typedef struct ref {
    size_t count;
    double *sum, *abs;
    float *max, *min;
} ref;

/* Room for count elements; 0 when out of memory (nothing left allocated). */
static inline int ref_init(ref *rf, size_t count) {
    rf->count = count;
    rf->sum = (double *)calloc(count + 1, sizeof(double));
    rf->abs = (double *)calloc(count + 1, sizeof(double));
    rf->max = (float *)malloc((count + 1) * sizeof(float));
    rf->min = (float *)malloc((count + 1) * sizeof(float));
    if (rf->sum && rf->abs && rf->max && rf->min) return 1;
    free(rf->sum);
    free(rf->abs);
    free(rf->max);
    free(rf->min);
    return 0;
}

/* Adds rank r's value x of element i (ranks in order, 0 first). */
static inline void ref_add(ref *rf, int r, size_t i, float x) {
    rf->sum[i] += x;
    rf->abs[i] += fabs(x);
    if (r == 0 || x > rf->max[i]) rf->max[i] = x;
    if (r == 0 || x < rf->min[i]) rf->min[i] = x;
}

static inline void ref_free(ref *rf) {
    free(rf->sum);
    free(rf->abs);
    free(rf->max);
    free(rf->min);
}

/* The first i in [lo, hi) where got is off the reference, or hi; *want and
   *tol then say by how much. SUM/MEAN: within (N + 2) * FLT_EPSILON * sum|x|
   (the bound of any summation order, plus the final division); MAX/MIN
   exact. */
static inline size_t ref_mismatch(const float *got, const ref *rf, dsgd_reduce_op op, int n, size_t lo, size_t hi,
                                  double *want, double *tol) {
    size_t i;
    for (i = lo; i < hi; ++i) {
        switch (op) {
        case DSGD_REDUCE_MAX: *want = rf->max[i]; *tol = 0; break;
        case DSGD_REDUCE_MIN: *want = rf->min[i]; *tol = 0; break;
        case DSGD_REDUCE_MEAN:
            *want = rf->sum[i] / n;
            *tol = (n + 2) * FLT_EPSILON * rf->abs[i] / n + 1e-37;
            break;
        default:
            *want = rf->sum[i];
            *tol = (n + 2) * FLT_EPSILON * rf->abs[i] + 1e-37;
            break;
        }
        if (!(fabs((double)got[i] - *want) <= *tol)) return i;
    }
    return hi;
}

#endif
