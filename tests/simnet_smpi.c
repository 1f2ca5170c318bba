/* simnet_smpi.c - the simnet transport against SimGrid's SMPI (tests/simnet_smpi.sh).

   Built twice. With cc (and distsgd): runs dsgd_allreduce (RING, and
   HALVING_DOUBLING for powers of two) over a simnet hub, alpha 2 us, beta
   1e-10 s/byte (10 GB/s), gamma 0, and prints "SIMNET algo p n seconds" for
   the last rank to finish, and "AGREE bytes" (the agreement's message). With
   smpicc (-DSIMNET_SMPI_SIDE): the same messages with MPI_Sendrecv (the
   agreement's dissemination rounds, then the algorithm's steps, block sizes
   of dsgd_block_range), on the platform the script writes (the same alpha
   and beta), and prints "SMPI algo p n seconds". The script compares them. */
#ifdef SIMNET_SMPI_SIDE
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t blk(size_t n, int p, int b) {
    size_t q = n / (size_t)p, r = n % (size_t)p, i = (size_t)b;
    return i * q + (i < r ? i : r);
}

static void xchg(int dst, const void *s, size_t sb, int src, void *r, size_t rb) {
    MPI_Sendrecv(s, (int)sb, MPI_BYTE, sb ? dst : MPI_PROC_NULL, 0, r, (int)rb, MPI_BYTE, rb ? src : MPI_PROC_NULL, 0,
                 MPI_COMM_WORLD, MPI_STATUS_IGNORE);
}

int main(int argc, char **argv) {
    int r, p, k, d, hd;
    size_t n, agree;
    float *x, *tmp;
    char *a, *b;
    double t, mx;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    if (argc < 4) MPI_Abort(MPI_COMM_WORLD, 2);
    hd = !strcmp(argv[1], "halving_doubling");
    n = (size_t)atol(argv[2]);
    agree = (size_t)atol(argv[3]);
    x = (float *)calloc(n + 1, sizeof(float));
    tmp = (float *)calloc(n + 1, sizeof(float));
    a = (char *)calloc(agree, 1);
    b = (char *)calloc(agree, 1);
    for (d = 1; d < p; d <<= 1) xchg((r + d) % p, a, agree, (r - d + p) % p, b, agree);
    if (!hd) {
        int next = (r + 1) % p, prev = (r + p - 1) % p;
        for (k = 0; k < p - 1; ++k) {
            int sb = ((r - k - 1) % p + p) % p, rb = ((r - k - 2) % p + p) % p;
            xchg(next, x + blk(n, p, sb), (blk(n, p, sb + 1) - blk(n, p, sb)) * 4, prev, tmp,
                 (blk(n, p, rb + 1) - blk(n, p, rb)) * 4);
        }
        for (k = 0; k < p - 1; ++k) {
            int sb = ((r - k) % p + p) % p, rb = ((r - k - 1) % p + p) % p;
            xchg(next, x + blk(n, p, sb), (blk(n, p, sb + 1) - blk(n, p, sb)) * 4, prev, x + blk(n, p, rb),
                 (blk(n, p, rb + 1) - blk(n, p, rb)) * 4);
        }
    } else { /* p a power of two: halving, then doubling (collectives_algos.h) */
        int lo = 0, hi = p;
        for (d = p / 2; d >= 1; d /= 2) {
            int mid = lo + d, klo, khi, slo, shi;
            if ((r & d) == 0) { klo = lo; khi = mid; slo = mid; shi = hi; }
            else { klo = mid; khi = hi; slo = lo; shi = mid; }
            xchg(r ^ d, x + blk(n, p, slo), (blk(n, p, shi) - blk(n, p, slo)) * 4, r ^ d, tmp,
                 (blk(n, p, khi) - blk(n, p, klo)) * 4);
            lo = klo;
            hi = khi;
        }
        for (d = 1; d < p; d *= 2) {
            int plo, phi;
            if ((r & d) == 0) { plo = hi; phi = hi + d; }
            else { plo = lo - d; phi = lo; }
            xchg(r ^ d, x + blk(n, p, lo), (blk(n, p, hi) - blk(n, p, lo)) * 4, r ^ d, x + blk(n, p, plo),
                 (blk(n, p, phi) - blk(n, p, plo)) * 4);
            if (plo < lo) lo = plo;
            else hi = phi;
        }
    }
    t = MPI_Wtime();
    MPI_Reduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (r == 0) printf("SMPI %s %d %zu %.12g\n", argv[1], p, n, mx);
    free(x);
    free(tmp);
    free(a);
    free(b);
    MPI_Finalize();
    return 0;
}
#else
#define DISTSGD_IMPLEMENTATION
#include "../distsgd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct arg {
    dsgd_simnet *hub;
    dsgd_transport_i ep;
    dsgd_allreduce_algo algo;
    size_t n;
    dsgd_result res;
} arg;

static void *rank_main(void *p) {
    arg *a = (arg *)p;
    dsgd_ctx *ctx = NULL;
    dsgd_comm *c = NULL;
    dsgd_comm_desc cd;
    float *x = (float *)calloc(a->n + 1, sizeof(float));
    memset(&cd, 0, sizeof(cd));
    cd.timeout_s = 1e6;
    cd.piece_bytes = (size_t)1 << 30;
    a->res = DSGD_ERR_OUT_OF_MEMORY;
    if (x && dsgd_ctx_create(NULL, &ctx) == DSGD_OK && dsgd_comm_create(ctx, &a->ep, &cd, &c) == DSGD_OK)
        a->res = dsgd_allreduce(c, x, a->n, DSGD_REDUCE_SUM, a->algo, 0);
    if (a->res != DSGD_OK) fprintf(stderr, "rank %d: %s\n", a->ep.rank, ctx ? dsgd_ctx_last_error(ctx) : "?");
    dsgd_comm_destroy(c);
    dsgd_ctx_destroy(ctx);
    free(x);
    dsgd_simnet_leave(a->hub, a->ep.rank);
    return NULL;
}

int main(int argc, char **argv) {
    dsgd_ctx *ctx;
    dsgd_simnet_desc d;
    dsgd_simnet_stats st;
    pthread_t th[64];
    arg args[64];
    int p, i;
    if (argc < 4) {
        fprintf(stderr, "usage: simnet_smpi ring|halving_doubling P COUNT\n");
        return 2;
    }
    p = atoi(argv[2]);
    if (p < 2 || p > 64) return 2;
    memset(&d, 0, sizeof(d));
    d.ranks = p;
    d.alpha_s = 2e-6;
    d.beta_s_per_byte = 1e-10;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK || dsgd_simnet_create(ctx, &d, &args[0].hub) != DSGD_OK) return 1;
    for (i = 0; i < p; ++i) {
        args[i].hub = args[0].hub;
        args[i].algo = !strcmp(argv[1], "ring") ? DSGD_ALLREDUCE_RING : DSGD_ALLREDUCE_HALVING_DOUBLING;
        args[i].n = (size_t)atol(argv[3]);
        dsgd_simnet_endpoint(args[0].hub, i, &args[i].ep);
        pthread_create(&th[i], NULL, rank_main, &args[i]);
    }
    for (i = 0; i < p; ++i) pthread_join(th[i], NULL);
    for (i = 0; i < p; ++i)
        if (args[i].res != DSGD_OK) return 1;
    dsgd_simnet_get_stats(args[0].hub, &st);
    printf("AGREE %zu\nSIMNET %s %d %s %.12g\n", sizeof(dsgd__fp_range), argv[1], p, argv[3], st.max_time);
    dsgd_simnet_destroy(args[0].hub);
    dsgd_ctx_destroy(ctx);
    return 0;
}
#endif
