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

/* ---- the exact bits of the ring family, computed serially ----
   op(a, b) as the library reduces a value a with a received b: a + b, or
   the larger (smaller) of the two, a when they compare equal or a is NaN. */
static inline float ref_op(float a, float b, dsgd_reduce_op op) {
    switch (op) {
    case DSGD_REDUCE_MAX: return (a >= b || a != a) ? a : b;
    case DSGD_REDUCE_MIN: return (a <= b || a != a) ? a : b;
    default: return a + b;
    }
}

/* Element i summed around a ring of m members (rank base + k * stride for
   member k), from member start round to member start - 1: each member
   reduces the partial result it receives into its own value, op(own,
   received). */
static inline float ref_ring_fold(const float *const *in, size_t i, int m, int start, int base, int stride,
                                  dsgd_reduce_op op) {
    float acc = in[base + start * stride][i];
    int k;
    for (k = 1; k < m; ++k) acc = ref_op(in[base + ((start + k) % m) * stride][i], acc, op);
    return acc;
}

enum { REF_RING, REF_REDUCE_SCATTER, REF_HIERARCHICAL };

/* The bits of out[0..count) as the library computes them from the n
   ranks' inputs in[r][0..count), the part of a vector starting at element
   first: REF_RING, the ring all-reduce (element g = first + i in block
   (g / DSGD_ALLREDUCE_CHUNK) mod n, summed from rank block + 1);
   REF_REDUCE_SCATTER, the reduce-scatter's block of i (dsgd_block_range
   over count, first ignored); REF_HIERARCHICAL, L ranks per node: block
   v as above, reduced inside each node from local rank v mod L + 1, then
   across the nodes from node v / L + 1. MEAN divides the sum by n. */
static inline void ref_exact(float *out, const float *const *in, int n, size_t count, size_t first, dsgd_reduce_op op,
                             int kind, int L) {
    size_t i;
    int M = kind == REF_HIERARCHICAL ? n / L : 1;
    for (i = 0; i < count; ++i) {
        int v = (int)(((first + i) / DSGD_ALLREDUCE_CHUNK) % (size_t)n);
        float acc;
        if (kind == REF_REDUCE_SCATTER) {
            size_t q = count / (size_t)n, rem = count % (size_t)n, hi = 0;
            for (v = 0; v < n; ++v) {
                hi += q + ((size_t)v < rem);
                if (i < hi) break;
            }
        }
        if (kind != REF_HIERARCHICAL || M == 1 || L == 1) {
            acc = ref_ring_fold(in, i, n, (v + 1) % n, 0, 1, op);
        } else {
            int l = v % L, m = v / L, k;
            float node[64] = {0};
            for (k = 0; k < M && k < 64; ++k) node[k] = ref_ring_fold(in, i, L, (l + 1) % L, k * L, 1, op);
            acc = node[(m + 1) % M];
            for (k = 1; k < M; ++k) acc = ref_op(node[(m + 1 + k) % M], acc, op);
        }
        if (op == DSGD_REDUCE_MEAN) acc = acc / (float)n;
        out[i] = acc;
    }
}

#endif
