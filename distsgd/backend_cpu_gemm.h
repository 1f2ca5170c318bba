/* distsgd/backend_cpu_gemm.h - the CPU backend's GEMM: cache-blocked, on one thread and on the pool
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   A part of backend_cpu.h, which holds what this one stands on: the
   backend's state (dsgd__cpu), its pool (dsgd__cpu_run) and the kernels by
   ISA, whose micro-kernel this GEMM calls. Here: the blocking and packing,
   the one-thread GEMM, the threads' GEMM, and the backend's gemm operation
   (dsgd__cpu_gemm, which backend_cpu_ops.h puts in the table). The order of
   the sums, and what the kernels and the threads change of it (nothing
   within a kernel), are documented under CPU KERNELS and CPU THREADS in
   backend.h.
*/
#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_BACKEND_CPU_GEMM_IMPL)
#define DSGD__PART_BACKEND_CPU_GEMM_IMPL

/* >>gemm ------------------------------------------------------------------- */
/* A cache-blocked GEMM in the style of Goto & van de Geijn (2008): B is packed
   into KC x NC panels of NR-wide column strips, A into MC x KC panels of
   MR-high row strips, and a register-blocked MR x NR micro-kernel does the
   arithmetic into a tile that is then added, times alpha, to C.

   The micro-kernel is chosen at run time (see dsgd_cpu_isa): "avx512"
   (AVX-512F, 12 x 32), "avx2" (AVX2 and FMA, 6 x 16) or "portable" (GNU
   vectors of the compiler's width, 6 x 8 on plain x86-64 and NEON, 6 x 16
   with -mavx). Whatever MR and NR are, every entry of C is summed in the same
   order: beta C, then for each KC block of k, in order, alpha times that
   block's products summed from its first p to its last. So results are
   bitwise reproducible for a given kernel; every kernel without FMA (the
   portable one, at any width) gives the same bits, and so do the two FMA
   kernels, which differ from the portable one in the last bits (one rounding
   per multiply-add instead of two). */

/* C(m, n) = beta C; beta == 0 overwrites, so NaN in C does not propagate */
static void dsgd__gemm_beta(int m, int n, float beta, float *c, int ldc) {
    int i, j;
    for (i = 0; i < m; ++i) {
        float *row = c + (size_t)i * ldc;
        if (beta == 0.0f)
            for (j = 0; j < n; ++j) row[j] = 0.0f;
        else if (beta != 1.0f)
            for (j = 0; j < n; ++j) row[j] *= beta;
    }
}

#ifndef DSGD_USE_CBLAS
#define DSGD__KC 256
#define DSGD__MC 120  /* a multiple of every kernel's MR */
#define DSGD__NC 2048 /* a multiple of every kernel's NR */
#define DSGD__MR_MAX 12
#define DSGD__NR_MAX 32

#if defined(__SSE__) && (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <xmmintrin.h>
#define DSGD__PACK_SSE 1
#else
#define DSGD__PACK_SSE 0
#endif

/* dst[p * stride + r] = src[r * ld + p] for r < rows, p < cols: the
   transposing copy of packing, where a row of the source is contiguous and
   the packed strip wants it as a column. With SSE (every x86-64) it moves
   4 x 4 blocks through registers instead of one float at a time. */
static void dsgd__pack_t(const float *src, size_t ld, int rows, int cols, int stride, float *DSGD__RESTRICT dst) {
    int r = 0, p;
#if DSGD__PACK_SSE
    for (; r + 4 <= rows; r += 4) {
        const float *s0 = src + (size_t)r * ld, *s1 = s0 + ld, *s2 = s1 + ld, *s3 = s2 + ld;
        for (p = 0; p + 4 <= cols; p += 4) {
            __m128 x0 = _mm_loadu_ps(s0 + p), x1 = _mm_loadu_ps(s1 + p), x2 = _mm_loadu_ps(s2 + p),
                   x3 = _mm_loadu_ps(s3 + p);
            float *d = dst + (size_t)p * stride + r;
            _MM_TRANSPOSE4_PS(x0, x1, x2, x3);
            _mm_storeu_ps(d, x0);
            _mm_storeu_ps(d + stride, x1);
            _mm_storeu_ps(d + 2 * (size_t)stride, x2);
            _mm_storeu_ps(d + 3 * (size_t)stride, x3);
        }
        for (; p < cols; ++p) {
            float *d = dst + (size_t)p * stride + r;
            d[0] = s0[p], d[1] = s1[p], d[2] = s2[p], d[3] = s3[p];
        }
    }
    if (r + 2 <= rows) { /* two rows (a 6-row strip's last): pairs of floats */
        const float *s0 = src + (size_t)r * ld, *s1 = s0 + ld;
        for (p = 0; p + 4 <= cols; p += 4) {
            __m128 x0 = _mm_loadu_ps(s0 + p), x1 = _mm_loadu_ps(s1 + p);
            __m128 lo = _mm_unpacklo_ps(x0, x1), hi = _mm_unpackhi_ps(x0, x1);
            float *d = dst + (size_t)p * stride + r;
            _mm_storel_pi((__m64 *)d, lo);
            _mm_storeh_pi((__m64 *)(d + stride), lo);
            _mm_storel_pi((__m64 *)(d + 2 * (size_t)stride), hi);
            _mm_storeh_pi((__m64 *)(d + 3 * (size_t)stride), hi);
        }
        for (; p < cols; ++p) {
            float *d = dst + (size_t)p * stride + r;
            d[0] = s0[p], d[1] = s1[p];
        }
        r += 2;
    }
#endif
    for (; r < rows; ++r) {
        const float *s = src + (size_t)r * ld;
        for (p = 0; p < cols; ++p) dst[(size_t)p * stride + r] = s[p];
    }
}

/* dst[p * w_ + j] = src[p * ld + j] for p < rows, j < w, and 0 for
   w <= j < w_: the straight copy of packing, where a column of the packed
   strip is contiguous in the source too. The strip widths of the kernels
   get a copy of constant size (inlined, instead of a memcpy call or a
   loop per row of 24 to 128 bytes). */
static void dsgd__pack_n(const float *src, size_t ld, int rows, int w, int w_, float *DSGD__RESTRICT dst) {
    int p, j;
#define DSGD__PACK_W(W)                                                                  \
    case W:                                                                              \
        for (p = 0; p < rows; ++p) memcpy(dst + (size_t)p * (W), src + (size_t)p * ld, (W) * sizeof(float)); \
        return
    if (w == w_) switch (w_) {
        DSGD__PACK_W(6); DSGD__PACK_W(8); DSGD__PACK_W(12); DSGD__PACK_W(16); DSGD__PACK_W(32);
        default: break;
        }
#undef DSGD__PACK_W
    for (p = 0; p < rows; ++p) {
        memcpy(dst + (size_t)p * w_, src + (size_t)p * ld, (size_t)w * sizeof(float));
        for (j = w; j < w_; ++j) dst[(size_t)p * w_ + j] = 0.0f;
    }
}

/* An A that is im2col(x), read where the packing needs it instead of built
   (conv_gemm): the window, the image, and op(A)'s first row (a task's
   offset: col rows, the pixels, for ta 0; col columns for ta 1). */
typedef struct dsgd__img_src {
    dsgd_window wd;
    const float *x;
    int oh, ow;
    size_t row0;
} dsgd__img_src;

/* The scratch of a thread slot's packing area where im2col blocks go:
   past its A and B areas, DSGD__KC x DSGD__THIN_M floats. */
#define DSGD__THIN_M 256 /* the thin GEMM's "m small": at most this */
#define DSGD__IMG_TMP(pack) ((pack) + (size_t)DSGD__MC * DSGD__KC + (size_t)DSGD__KC * DSGD__NC)
#define DSGD__IMG_TMP_FLOATS ((size_t)DSGD__KC * DSGD__THIN_M)

/* dst[r ld + e] = col(p0 + r, e0 + e) for r < np, e < ne, col = im2col(x)
   as the im2col operation writes it: per pixel and ky, the part in
   [e0, e0 + ne) of its kw c entries, which are zeros, one contiguous run of
   x (the kx inside the image), zeros. */
static void dsgd__img_block(const dsgd__img_src *s, size_t p0, int np, size_t e0, int ne, float *DSGD__RESTRICT dst,
                            size_t ld) {
    const dsgd_window *wd = &s->wd;
    const size_t c = (size_t)wd->c, run = (size_t)wd->kw * c, e1 = e0 + (size_t)ne;
    const int ky0 = (int)(e0 / run), ky1 = (int)((e1 + run - 1) / run);
    size_t i = p0 / ((size_t)s->ow * (size_t)s->oh);
    int ox = (int)(p0 % (size_t)s->ow), oy = (int)(p0 / (size_t)s->ow % (size_t)s->oh), r, ky;
    if (c == 1 && wd->kw == 3 && e0 == 0 && e1 == (size_t)wd->kh * 3) {
        /* whole rows of a window 3 wide over one channel (a first layer
           over gray pixels), where a row of the window is 3 floats and a
           memcpy call per row would cost more than its copy: per ky and run
           of ox in one output row, each ox's 3 pixels, zeros outside */
        const int w = wd->w, st = wd->stride, pad = wd->pad;
        for (r = 0; r < np;) {
            const int ox1 = DSGD__MIN(s->ow, ox + (np - r));
            int o, kx;
            for (ky = 0; ky < wd->kh; ++ky) {
                const int iy = oy * st - pad + ky;
                const float *src = s->x + (i * (size_t)wd->h + (size_t)(iy < 0 ? 0 : iy)) * (size_t)w;
                float *d = dst + (size_t)r * ld + (size_t)ky * 3;
                for (o = ox; o < ox1; ++o, d += ld) {
                    const int ix0 = o * st - pad;
                    if (iy < 0 || iy >= wd->h) {
                        d[0] = d[1] = d[2] = 0.0f;
                    } else if (ix0 >= 0 && ix0 + 3 <= w) {
                        d[0] = src[ix0];
                        d[1] = src[ix0 + 1];
                        d[2] = src[ix0 + 2];
                    } else {
                        for (kx = 0; kx < 3; ++kx) d[kx] = ix0 + kx >= 0 && ix0 + kx < w ? src[ix0 + kx] : 0.0f;
                    }
                }
            }
            r += ox1 - ox;
            ox = 0;
            if (++oy == s->oh) oy = 0, ++i;
        }
        return;
    }
    for (r = 0; r < np; ++r, dst += ld) {
        const int iy0 = oy * wd->stride - wd->pad, ix0 = ox * wd->stride - wd->pad;
        const int kx0 = ix0 < 0 ? DSGD__MIN(-ix0, wd->kw) : 0, kx1 = DSGD__MIN(wd->w - ix0, wd->kw);
        for (ky = ky0; ky < ky1; ++ky) {
            const int iy = iy0 + ky;
            const size_t base = (size_t)ky * run, lo = DSGD__MAX(base, e0), hi = DSGD__MIN(base + run, e1);
            size_t in0 = base + (size_t)kx0 * c, in1 = kx1 > kx0 ? base + (size_t)kx1 * c : in0;
            float *d = dst + (lo - e0);
            if (iy < 0 || iy >= wd->h) in0 = in1 = hi;
            in0 = DSGD__MIN(DSGD__MAX(in0, lo), hi);
            in1 = DSGD__MIN(DSGD__MAX(in1, in0), hi);
            if (in0 > lo) memset(d, 0, (in0 - lo) * sizeof(float));
            if (in1 > in0) /* x[i, iy, ix0 + kx, ch] for entry base + kx c + ch */
                memcpy(d + (in0 - lo),
                       s->x + ((i * (size_t)wd->h + (size_t)iy) * (size_t)wd->w + (size_t)(ix0 + (int)((in0 - base) / c))) * c +
                           (in0 - base) % c,
                       (in1 - in0) * sizeof(float));
            if (hi > in1) memset(d + (in1 - lo), 0, (hi - in1) * sizeof(float));
        }
        if (++ox == s->ow) {
            ox = 0;
            if (++oy == s->oh) oy = 0, ++i;
        }
    }
}

/* Packs the mc x kc block of op(A) at (i0, p0) into mr_-row strips. With
   img, A is im2col(img's x): the block is first built in tmp (mc kc floats
   at most DSGD__IMG_TMP_FLOATS), then packed from there as from A. */
static void dsgd__pack_a(int ta, const float *a, int lda, int i0, int mc, int p0, int kc, int mr_,
                         float *DSGD__RESTRICT ap, const dsgd__img_src *img, float *tmp) {
    int ib, i, p;
    if (img) {
        if (ta)
            dsgd__img_block(img, (size_t)p0, kc, img->row0 + (size_t)i0, mc, tmp, (size_t)mc);
        else
            dsgd__img_block(img, img->row0 + (size_t)i0, mc, (size_t)p0, kc, tmp, (size_t)kc);
        a = tmp, lda = ta ? mc : kc, i0 = p0 = 0;
    }
    for (ib = 0; ib < mc; ib += mr_) {
        int mr = DSGD__MIN(mr_, mc - ib);
        if (ta) { /* a column of op(A) is contiguous: read along it */
            dsgd__pack_n(a + (size_t)p0 * lda + i0 + ib, (size_t)lda, kc, mr, mr_, ap);
        } else { /* a row is contiguous: read along it, write with stride mr_ */
            dsgd__pack_t(a + (size_t)(i0 + ib) * lda + p0, (size_t)lda, mr, kc, mr_, ap);
            for (i = mr; i < mr_; ++i)
                for (p = 0; p < kc; ++p) ap[(size_t)p * mr_ + i] = 0.0f;
        }
        ap += (size_t)kc * mr_;
    }
}

/* Packs the kc x nc block of op(B) at (p0, j0) into nr_-column strips. */
static void dsgd__pack_b(int tb, const float *b, int ldb, int p0, int kc, int j0, int nc, int nr_,
                         float *DSGD__RESTRICT bp) {
    int jb, j, p;
    for (jb = 0; jb < nc; jb += nr_) {
        int nr = DSGD__MIN(nr_, nc - jb);
        if (tb) { /* a column of op(B) is a contiguous row of B: read along it */
            dsgd__pack_t(b + (size_t)(j0 + jb) * ldb + p0, (size_t)ldb, nr, kc, nr_, bp);
            for (j = nr; j < nr_; ++j)
                for (p = 0; p < kc; ++p) bp[(size_t)p * nr_ + j] = 0.0f;
        } else {
            dsgd__pack_n(b + (size_t)p0 * ldb + j0 + jb, (size_t)ldb, kc, nr, nr_, bp);
        }
        bp += (size_t)kc * nr_;
    }
}

/* C(mr, nr) += alpha * acc(mr, nr). Shared by every kernel and compiled for
   the baseline target, so no kernel fuses this multiply-add and the kernels'
   bits differ only where their accumulation does. */
DSGD__NO_CONTRACT_FN static void dsgd__gemm_add(float *c, int ldc, int mr, int nr, float alpha,
                           const float *DSGD__RESTRICT acc, int ld) {
    DSGD__NO_CONTRACT
    int i, j;
    for (i = 0; i < mr; ++i) {
        float *row = c + (size_t)i * ldc;
        const float *t = acc + (size_t)i * ld;
        j = 0;
#if defined(__GNUC__) || defined(__clang__)
        { /* the same operations, element by element, VW at a time */
            dsgd__v8 vc, vt;
            for (j = 0; j + DSGD__VW <= nr; j += DSGD__VW) {
                DSGD__V8_LOAD(vc, row + j);
                DSGD__V8_LOAD(vt, t + j);
                vc += vt * alpha;
                DSGD__V8_STORE(row + j, vc);
            }
        }
#endif
        for (; j < nr; ++j) row[j] += alpha * t[j];
    }
}

/* C^T += alpha * acc: C(j, i) += alpha acc(i, j) for i < mr, j < nr, the
   same operations as dsgd__gemm_add, for the transposed product below. */
DSGD__NO_CONTRACT_FN static void dsgd__gemm_add_t(float *c, int ldc, int mr, int nr, float alpha,
                                                  const float *DSGD__RESTRICT acc, int ld) {
    DSGD__NO_CONTRACT
    int i, j;
    for (j = 0; j < nr; ++j) {
        float *row = c + (size_t)j * ldc;
        for (i = 0; i < mr; ++i) row[i] += alpha * acc[(size_t)i * ld + j];
    }
}

/* Rows [r0, r1) and panel columns [c0, c1) of one (jc, pc) block: C (or,
   with trans_c, C^T stored as C(n, m)) += alpha op(A) op(B), from B's
   packed panel and A packed here into ap, MC rows at a time. With `zero`
   (the first block of k, beta = 0) C has not been zeroed: each tile is
   0.0f + alpha T as if it had, without the pass that would zero it. */
static void dsgd__gemm_macro(const dsgd__cpu_kernel *kern, float *ap, const float *panel, int ta, const float *a,
                             int lda, int pc, int kc, int r0, int r1, int jc, int c0, int c1, float alpha, float *c,
                             int ldc, int trans_c, int zero, const dsgd__img_src *img) {
    const int kmr = kern->mr, knr = kern->nr;
    float acc[DSGD__MR_MAX * DSGD__NR_MAX];
    int ic, ir, jr;
    for (ic = r0; ic < r1; ic += DSGD__MC) {
        int mc = DSGD__MIN(DSGD__MC, r1 - ic);
        dsgd__pack_a(ta, a, lda, ic, mc, pc, kc, kmr, ap, img, DSGD__IMG_TMP(ap));
        for (jr = c0; jr < c1; jr += knr) {
            for (ir = 0; ir < mc; ir += kmr) {
                int mr = DSGD__MIN(kmr, mc - ir), nr = DSGD__MIN(knr, c1 - jr);
                const float *at = ap + (size_t)ir * kc, *bt = panel + (size_t)jr * kc;
                if (!trans_c && mr == kmr && nr == knr) { /* a whole tile: added in registers */
                    kern->micro(kc, at, bt, c + (size_t)(ic + ir) * ldc + jc + jr, (size_t)ldc, alpha, zero ? 2 : 1);
                    continue;
                }
                kern->micro(kc, at, bt, acc, (size_t)knr, 0.0f, 0);
                if (trans_c) {
                    if (zero) dsgd__gemm_beta(nr, mr, 0.0f, c + (size_t)(jc + jr) * ldc + ic + ir, ldc);
                    dsgd__gemm_add_t(c + (size_t)(jc + jr) * ldc + ic + ir, ldc, mr, nr, alpha, acc, knr);
                } else {
                    if (zero) dsgd__gemm_beta(mr, nr, 0.0f, c + (size_t)(ic + ir) * ldc + jc + jr, ldc);
                    dsgd__gemm_add(c + (size_t)(ic + ir) * ldc + jc + jr, ldc, mr, nr, alpha, acc, knr);
                }
            }
        }
    }
}

/* C(m, n) (or, with trans_c, C^T stored as C(n, m)) += alpha op(A) op(B),
   or with `zero` = alpha op(A) op(B) over a C that beta = 0 would have
   zeroed: the blocked loops above, with `pack` (MC x KC + KC x NC floats). */
static void dsgd__gemm_blocked(const dsgd__cpu_kernel *kern, float *pack, int ta, int tb, int m, int n, int k,
                               float alpha, const float *a, int lda, const float *b, int ldb, float *c, int ldc,
                               int trans_c, int zero, const dsgd__img_src *img) {
    float *bp = pack + (size_t)DSGD__MC * DSGD__KC;
    int jc, pc;
    for (jc = 0; jc < n; jc += DSGD__NC) {
        int nc = DSGD__MIN(DSGD__NC, n - jc);
        for (pc = 0; pc < k; pc += DSGD__KC) {
            int kc = DSGD__MIN(DSGD__KC, k - pc);
            dsgd__pack_b(tb, b, ldb, pc, kc, jc, nc, kern->nr, bp);
            dsgd__gemm_macro(kern, pack, bp, ta, a, lda, pc, kc, 0, m, jc, 0, nc, alpha, c, ldc, trans_c,
                             zero && pc == 0, img);
        }
    }
}

/* C(m, n) = beta C + alpha op(A) op(B) on one thread. When C is narrower
   than a tile and its tiles would be mostly padding (n = 10 outputs in
   32-wide tiles), it computes C^T =
   op(B)^T op(A)^T instead, with the long side across the tile's width: each
   entry is still the same products (a b = b a) summed in the same order,
   so the bits do not change. (Not with img, an A that only pack_a reads.) */
static void dsgd__gemm_serial(const dsgd__cpu_kernel *kern, float *pack, int ta, int tb, int m, int n, int k,
                              float alpha, const float *a, int lda, const float *b, int ldb, float beta, float *c,
                              int ldc, const dsgd__img_src *img) {
#define DSGD__UP(x, t) (((size_t)(x) + (size_t)(t) - 1) / (size_t)(t) * (size_t)(t))
    const int kmr = kern->mr, knr = kern->nr, zero = beta == 0.0f && k > 0 && alpha != 0.0f;
    if (!zero) dsgd__gemm_beta(m, n, beta, c, ldc); /* else the first block of k writes C */
    if (k == 0 || alpha == 0.0f) return;
    if (!img && n < knr && DSGD__UP(n, kmr) * DSGD__UP(m, knr) < DSGD__UP(m, kmr) * DSGD__UP(n, knr))
        dsgd__gemm_blocked(kern, pack, !tb, !ta, n, m, k, alpha, b, ldb, a, lda, c, ldc, 1, zero, NULL);
    else
        dsgd__gemm_blocked(kern, pack, ta, tb, m, n, k, alpha, a, lda, b, ldb, c, ldc, 0, zero, img);
#undef DSGD__UP
}

/* A GEMM cut into independent tasks (what the threads do with a C narrower
   than a tile, or with nothing to multiply): rows of C (rows = 1) or
   columns, `step` each, a multiple of the kernel's MR or NR. Each task is
   the whole GEMM of its block of C, so every entry is summed as the
   one-thread GEMM sums it. */
typedef struct dsgd__gemm_job {
    const dsgd__cpu_kernel *kern;
    float *const *pack;
    int ta, tb, m, n, k, lda, ldb, ldc, rows, step;
    float alpha, beta;
    const float *a, *b;
    float *c;
    const dsgd__img_src *img; /* A is im2col (conv_gemm), else NULL */
} dsgd__gemm_job;

static void dsgd__gemm_task(void *arg, int task, int slot) {
    const dsgd__gemm_job *j = (const dsgd__gemm_job *)arg;
    const float *a = j->a, *b = j->b;
    size_t lo = (size_t)task * (size_t)j->step;
    int len = DSGD__MIN(j->step, (j->rows ? j->m : j->n) - (int)lo);
    dsgd__img_src img;
    if (j->img) img = *j->img;
    if (j->rows) { /* rows lo.. of C: rows of op(A) */
        if (a) a += j->ta ? lo : lo * (size_t)j->lda;
        img.row0 = j->img ? j->img->row0 + lo : 0;
        dsgd__gemm_serial(j->kern, j->pack[slot], j->ta, j->tb, len, j->n, j->k, j->alpha, a, j->lda, b, j->ldb,
                          j->beta, j->c + lo * (size_t)j->ldc, j->ldc, j->img ? &img : NULL);
    } else { /* columns lo.. of C: columns of op(B) */
        if (b) b += j->tb ? lo * (size_t)j->ldb : lo;
        dsgd__gemm_serial(j->kern, j->pack[slot], j->ta, j->tb, j->m, len, j->k, j->alpha, a, j->lda, b, j->ldb,
                          j->beta, j->c + lo, j->ldc, j->img);
    }
}

/* C = beta C + alpha op(A) op(B) as independent blocks, one per thread
   (split) or one in all, in whole tiles along C's longer side. */
static void dsgd__gemm_blocks(dsgd__cpu *cpu, int split, int ta, int tb, int m, int n, int k, float alpha,
                              const float *a, int lda, const float *b, int ldb, float beta, float *c, int ldc,
                              const dsgd__img_src *img) {
    dsgd__gemm_job j;
    int tasks = 1, dim, tile, units;
    j.kern = cpu->kern;
    j.pack = cpu->pack;
    j.ta = ta, j.tb = tb, j.m = m, j.n = n, j.k = k, j.lda = lda, j.ldb = ldb, j.ldc = ldc;
    j.alpha = alpha, j.beta = beta, j.a = a, j.b = b, j.c = c;
    j.img = img;
    j.rows = m >= n;
    dim = j.rows ? m : n;
    j.step = dim;
    if (split) {
        tile = j.rows ? cpu->kern->mr : cpu->kern->nr;
        units = (dim + tile - 1) / tile;
        tasks = DSGD__MIN(cpu->pool.n, units);
        j.step = (units + tasks - 1) / tasks * tile;
        tasks = (dim + j.step - 1) / j.step;
    }
    dsgd__cpu_run(cpu, dsgd__gemm_task, &j, tasks);
}

/* The threads' GEMM for a C at least as wide as a tile: per (jc, pc) block
   the threads first pack B's KC x NC panel together, each a range of its
   NR strips, into slot 0's B area; then each computes a block of C, whole
   MR tiles of rows (and, when C has fewer row tiles than threads, whole NR
   strips of columns), packing its own A panels. Nothing is packed twice,
   and every entry of C is still summed block of k by block of k, in order,
   as the one-thread GEMM sums it. Each phase is one dsgd__cpu_run, whose
   return is the barrier between them. */
typedef struct dsgd__gemm_par {
    const dsgd__cpu_kernel *kern;
    float *const *pack;
    float *panel; /* the shared packed B panel */
    int ta, tb, m, lda, ldb, ldc;
    float alpha, beta;
    const float *a, *b;
    float *c;
    int jc, nc, pc, kc;                  /* the current block */
    int strips, strip_step;              /* phase 1: NR strips of the panel, per task */
    int row_step, col_step, col_tasks;   /* phase 2: the grid of C's blocks */
    const dsgd__img_src *img;            /* A is im2col (conv_gemm), else NULL */
} dsgd__gemm_par;

static void dsgd__gemm_par_pack(void *arg, int task, int slot) {
    const dsgd__gemm_par *g = (const dsgd__gemm_par *)arg;
    const int nr = g->kern->nr, s0 = task * g->strip_step, s1 = DSGD__MIN(g->strips, s0 + g->strip_step);
    DSGD__UNUSED(slot);
    dsgd__pack_b(g->tb, g->b, g->ldb, g->pc, g->kc, g->jc + s0 * nr, DSGD__MIN(g->nc - s0 * nr, (s1 - s0) * nr), nr,
                 g->panel + (size_t)s0 * g->kc * nr);
}

static void dsgd__gemm_par_compute(void *arg, int task, int slot) {
    const dsgd__gemm_par *g = (const dsgd__gemm_par *)arg;
    const int r0 = (task / g->col_tasks) * g->row_step, r1 = DSGD__MIN(g->m, r0 + g->row_step);
    const int c0 = (task % g->col_tasks) * g->col_step, c1 = DSGD__MIN(g->nc, c0 + g->col_step);
    if (r0 >= r1 || c0 >= c1) return;
    if (g->pc == 0 && g->beta != 0.0f)
        dsgd__gemm_beta(r1 - r0, c1 - c0, g->beta, g->c + (size_t)r0 * g->ldc + g->jc + c0, g->ldc);
    dsgd__gemm_macro(g->kern, g->pack[slot], g->panel, g->ta, g->a, g->lda, g->pc, g->kc, r0, r1, g->jc, c0, c1,
                     g->alpha, g->c, g->ldc, 0, g->pc == 0 && g->beta == 0.0f, g->img);
}

static void dsgd__gemm_threads(dsgd__cpu *cpu, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                               int lda, const float *b, int ldb, float beta, float *c, int ldc,
                               const dsgd__img_src *img) {
    dsgd__gemm_par g;
    const int T = cpu->pool.n, kmr = cpu->kern->mr, knr = cpu->kern->nr;
    int row_tiles = (m + kmr - 1) / kmr, row_tasks = DSGD__MIN(T, row_tiles), ptasks;
    memset(&g, 0, sizeof(g));
    g.kern = cpu->kern;
    g.pack = cpu->pack;
    g.panel = cpu->pack[0] + (size_t)DSGD__MC * DSGD__KC;
    g.ta = ta, g.tb = tb, g.m = m, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    g.alpha = alpha, g.beta = beta, g.a = a, g.b = b, g.c = c;
    g.img = img;
    g.row_step = (row_tiles + row_tasks - 1) / row_tasks * kmr;
    for (g.jc = 0; g.jc < n; g.jc += DSGD__NC) {
        g.nc = DSGD__MIN(DSGD__NC, n - g.jc);
        g.strips = (g.nc + knr - 1) / knr;
        g.col_tasks = row_tasks < T ? DSGD__MIN((T + row_tasks - 1) / row_tasks, g.strips) : 1;
        g.col_step = (g.strips + g.col_tasks - 1) / g.col_tasks * knr;
        ptasks = DSGD__MIN(T, g.strips);
        g.strip_step = (g.strips + ptasks - 1) / ptasks;
        ptasks = (g.strips + g.strip_step - 1) / g.strip_step;
        for (g.pc = 0; g.pc < k; g.pc += DSGD__KC) {
            g.kc = DSGD__MIN(DSGD__KC, k - g.pc);
            dsgd__cpu_run(cpu, dsgd__gemm_par_pack, &g, ptasks);
            dsgd__cpu_run(cpu, dsgd__gemm_par_compute, &g, row_tasks * g.col_tasks);
        }
    }
}

/* The thin GEMM: C at most DSGD__THIN_N wide, B not transposed, and either
   k small (a convolution over few channels: im2col (rows, k k c) by W
   (k k c, out)) or m small (a convolution's weight gradient, im2col^T
   (k k c, rows) by dy (rows, out), whose k is the batch's pixels). There
   the blocked GEMM's tiles would be mostly padding, or its packing of B a
   pass of its own, or its two barriers per block of k most of the time.
   This one reads B where it lies, in strips of the kernel's thin_n
   columns; packs A a tile of rows and a block of k at a time (into the
   slot's scratch, in cache) and keeps the tile in registers. The threads
   take whole tiles of rows, each over every block of k, with no barrier
   between blocks; or, where there are fewer tiles than threads (m one
   tile, many blocks of k: a first layer's weight gradient), whole blocks
   of k, each block's T stored apart, and the caller adds them to C in
   block order. Every entry is summed as the blocked GEMM sums it (block of
   k by block of k, each from 0.0f, its products in order, then alpha times
   it added to beta C), so the bits are the same as the blocked GEMM's,
   whichever of the two runs, and on any number of threads. */
#define DSGD__THIN_N 32  /* C at most this wide */
#define DSGD__THIN_K 16  /* "k small": at most this */

static int dsgd__gemm_thin_fits(const dsgd__cpu_kernel *kern, int tb, int m, int n, int k) {
    return kern->thin && !tb && n <= DSGD__THIN_N && k > 0 && (k <= DSGD__THIN_K || m <= DSGD__THIN_M);
}

typedef struct dsgd__thin_job {
    const dsgd__cpu_kernel *kern;
    float *const *pack;
    int ta, m, n, k, lda, ldb, ldc, step; /* step: rows per task, whole tiles */
    float alpha, beta;
    const float *a, *b;
    float *c;
    float *blocks; /* by blocks of k: each block's T (m x n, rows n apart), in order */
    int bstep;     /* and the blocks per task */
    const dsgd__img_src *img; /* A is im2col (conv_gemm), else NULL */
} dsgd__thin_job;

/* Blocks [task bstep, ..) of k of a one-tile C: their T, stored apart. */
static void dsgd__gemm_thin_blocks(const dsgd__thin_job *j, int task, float *ap) {
    const int tn = j->kern->thin_n, nb = (j->k + DSGD__KC - 1) / DSGD__KC;
    int blk, j0;
    for (blk = task * j->bstep; blk < nb && blk < (task + 1) * j->bstep; ++blk) {
        const int pc = blk * DSGD__KC, kc = DSGD__MIN(DSGD__KC, j->k - pc);
        dsgd__pack_a(j->ta, j->a, j->lda, 0, j->m, pc, kc, j->kern->mr, ap, j->img, DSGD__IMG_TMP(ap));
        for (j0 = 0; j0 < j->n; j0 += tn)
            j->kern->thin(kc, ap, (size_t)j->kern->mr, j->b + (size_t)pc * j->ldb + j0, (size_t)j->ldb,
                          DSGD__MIN(tn, j->n - j0), j->m, j->blocks + (size_t)blk * j->m * j->n + j0, (size_t)j->n,
                          1.0f, 2);
    }
}

static void dsgd__gemm_thin_task(void *arg, int task, int slot) {
    const dsgd__thin_job *j = (const dsgd__thin_job *)arg;
    const int mr = j->kern->mr, tn = j->kern->thin_n, r0 = task * j->step, r1 = DSGD__MIN(j->m, r0 + j->step);
    float *ap = j->pack[slot];
    int i, pc, j0;
    if (j->blocks) {
        dsgd__gemm_thin_blocks(j, task, ap);
        return;
    }
    if (j->beta != 0.0f) dsgd__gemm_beta(r1 - r0, j->n, j->beta, j->c + (size_t)r0 * j->ldc, j->ldc);
    for (pc = 0; pc < j->k; pc += DSGD__KC) { /* B's block stays in cache across the tiles */
        const int kc = DSGD__MIN(DSGD__KC, j->k - pc), load = j->beta != 0.0f || pc > 0;
        /* with img: im2col's rows (ta 0) or columns (ta 1) [i0, i0 + ch)
           of this block of k built in tmp at once, the tiles packed from it */
        const int ch = (int)(DSGD__IMG_TMP_FLOATS / (size_t)kc) / mr * mr;
        float *tmp = DSGD__IMG_TMP(ap);
        int i0 = r0, next = r0, cn = 0;
        for (i = r0; i < r1; i += mr) {
            const int rows = DSGD__MIN(mr, r1 - i);
            if (j->img && i == next) {
                i0 = i, cn = DSGD__MIN(ch, r1 - i), next = i + cn;
                if (j->ta && j->img->wd.kw * j->img->wd.c < 16 && j->m <= ch)
                    i0 = 0, cn = j->m, next = r1; /* whole col rows: short runs cost more cut */
                if (j->ta)
                    dsgd__img_block(j->img, (size_t)pc, kc, j->img->row0 + (size_t)i0, cn, tmp, (size_t)cn);
                else
                    dsgd__img_block(j->img, j->img->row0 + (size_t)i0, cn, (size_t)pc, kc, tmp, (size_t)kc);
            }
            if (j->img)
                dsgd__pack_a(j->ta, tmp, j->ta ? cn : kc, i - i0, rows, 0, kc, mr, ap, NULL, NULL);
            else
                dsgd__pack_a(j->ta, j->a, j->lda, i, rows, pc, kc, mr, ap, NULL, NULL);
            for (j0 = 0; j0 < j->n; j0 += tn)
                j->kern->thin(kc, ap, (size_t)mr, j->b + (size_t)pc * j->ldb + j0, (size_t)j->ldb,
                              DSGD__MIN(tn, j->n - j0), rows, j->c + (size_t)i * j->ldc + j0, (size_t)j->ldc, j->alpha,
                              load);
        }
    }
}

static void dsgd__gemm_thin(dsgd__cpu *cpu, int split, int ta, int m, int n, int k, float alpha, const float *a,
                            int lda, const float *b, int ldb, float beta, float *c, int ldc,
                            const dsgd__img_src *img) {
    dsgd__thin_job j;
    const int mr = cpu->kern->mr, tiles = (m + mr - 1) / mr;
    int tasks = split ? DSGD__MIN(cpu->pool.n, tiles) : 1;
    j.kern = cpu->kern;
    j.pack = cpu->pack;
    j.ta = ta, j.m = m, j.n = n, j.k = k, j.lda = lda, j.ldb = ldb, j.ldc = ldc;
    j.alpha = alpha, j.beta = beta, j.a = a, j.b = b, j.c = c;
    j.blocks = NULL;
    j.bstep = 0;
    j.img = img;
    j.step = (tiles + tasks - 1) / tasks * mr;
    tasks = (m + j.step - 1) / j.step;
    if (split && tiles == 1 && cpu->pool.n > 1) { /* one tile: the threads take blocks of k */
        const int nb = (k + DSGD__KC - 1) / DSGD__KC;
        if (nb > 1 && (size_t)nb * (size_t)m * (size_t)n <= (size_t)DSGD__KC * DSGD__NC) {
            int blk;
            j.blocks = cpu->pack[0] + (size_t)DSGD__MC * DSGD__KC; /* slot 0's B area: the thin GEMM packs no B */
            tasks = DSGD__MIN(cpu->pool.n, nb);
            j.bstep = (nb + tasks - 1) / tasks;
            tasks = (nb + j.bstep - 1) / j.bstep;
            dsgd__cpu_run(cpu, dsgd__gemm_thin_task, &j, tasks);
            dsgd__gemm_beta(m, n, beta, c, ldc);
            for (blk = 0; blk < nb; ++blk) /* C += alpha T, block after block: the one-thread order */
                dsgd__gemm_add(c, ldc, m, n, alpha, j.blocks + (size_t)blk * m * n, n);
            return;
        }
    }
    dsgd__cpu_run(cpu, dsgd__gemm_thin_task, &j, tasks);
}

/* The packing scratch of thread slots 0..slots-1, allocated before any
   task runs: MC x KC + KC x NC floats each, and the im2col blocks of
   conv_gemm (KC x THIN_M floats, 256 KB). */
static dsgd_result dsgd__cpu_pack_reserve(dsgd__cpu *cpu, int slots) {
    size_t need = (size_t)DSGD__MC * DSGD__KC + (size_t)DSGD__KC * DSGD__NC + DSGD__IMG_TMP_FLOATS;
    int i;
    for (i = 0; i < slots; ++i)
        if (!cpu->pack[i] && !(cpu->pack[i] = (float *)DSGD_MALLOC(need * sizeof(float))))
            return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_OUT_OF_MEMORY, "cpu gemm: packing buffer");
    return DSGD_OK;
}

/* GEMMs of fewer multiply-adds than this run on one thread. */
#define DSGD__CPU_GEMM_GRAIN 131072.0

/* The GEMM of checked ranges, C (m, n) = beta C + alpha op(A) op(B), with
   A im2col(img's x) when img is set (a NULL then), on the paths that fit:
   thin, the threads' shared panels, or independent blocks. */
static dsgd_result dsgd__cpu_gemm_run(dsgd__cpu *cpu, int ta, int tb, int m, int n, int k, float alpha, const float *a,
                                      int lda, const float *b, int ldb, float beta, float *c, int ldc,
                                      const dsgd__img_src *img) {
    const int split = cpu->pool.n > 1 && (double)m * n * DSGD__MAX(k, 1) >= DSGD__CPU_GEMM_GRAIN;
    dsgd_result r = dsgd__cpu_pack_reserve(cpu, split ? cpu->pool.n : 1);
    if (r != DSGD_OK) return r;
    if (alpha != 0.0f && dsgd__gemm_thin_fits(cpu->kern, tb, m, n, k))
        dsgd__gemm_thin(cpu, split, ta, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, img);
    else if (split && k > 0 && alpha != 0.0f && n >= cpu->kern->nr)
        dsgd__gemm_threads(cpu, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, img);
    else
        dsgd__gemm_blocks(cpu, split, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, img);
    return DSGD_OK;
}

/* conv_gemm (backend.h): the GEMM above with A = im2col(x), each block of
   it built where the packing reads it (in the slot's scratch, in cache), so
   the packed panels hold what they would have held after im2col: the same
   bits. */
static dsgd_result dsgd__cpu_conv_gemm(void *impl, const dsgd_window *wd, int ta, int n, float alpha, dsgd_ref rx,
                                       dsgd_ref rb, int ldb, float beta, dsgd_ref rc, int ldc) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__window_dims d;
    dsgd__img_src img;
    const float *b;
    float *c;
    size_t m, k;
    if (dsgd__window_check(cpu->ctx, "cpu", "conv_gemm", wd, 0, &d) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    m = ta ? d.k : d.rows;
    k = ta ? d.rows : d.k;
    if ((ta != 0 && ta != 1) || n < 0 || ldb < DSGD__MAX(1, n) || ldc < DSGD__MAX(1, n) || m > INT_MAX ||
        k > INT_MAX)
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "cpu conv_gemm: bad sizes ta=%d m=%zu n=%d k=%zu ldb=%d ldc=%d", ta, m, n, k, ldb,
                                  ldc);
    if (n == 0) return DSGD_OK;
    memset(&img, 0, sizeof(img));
    img.wd = *wd;
    img.oh = d.oh, img.ow = d.ow;
    if (!(img.x = dsgd__cpu_span(cpu, rx, d.x, "conv_gemm x")) ||
        !(b = dsgd__cpu_span(cpu, rb, (k - 1) * (size_t)ldb + (size_t)n, "conv_gemm B")) ||
        !(c = dsgd__cpu_span(cpu, rc, (m - 1) * (size_t)ldc + (size_t)n, "conv_gemm C")))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__cpu_overlap(rc, (m - 1) * (size_t)ldc + (size_t)n, rx, d.x) ||
        dsgd__cpu_overlap(rc, (m - 1) * (size_t)ldc + (size_t)n, rb, (k - 1) * (size_t)ldb + (size_t)n))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu conv_gemm: C overlaps x or B");
    return dsgd__cpu_gemm_run(cpu, ta, 0, (int)m, n, (int)k, alpha, NULL, ta ? (int)m : (int)k, b, ldb, beta, c, ldc,
                              &img);
}

/* conv_backward_x (backend.h): dx = col2im(dy W^T) without the columns.
   Each task owns whole tiles of MR rows of dx (pixels (i, iy, ix)); per
   tile and (ky, kx) ascending, the tile's rows of dy W_(ky,kx)^T, with the
   dy row each pixel takes from that (ky, kx) (zeros where none), are the
   thin kernel's T, added to the tile (the first one written over 0.0f):
   the col entry that gemm would have stored, then the sum col2im makes
   from 0.0f in (ky, kx) order, the same roundings. A col entry is
   0.0f + T, where adding T itself differs only for T = -0, and a sum that
   starts at 0.0f is never -0, so +0 and -0 add alike; a pixel with no dy
   for some (ky, kx) adds zeros, which change no sum for the same reason.
   With f past one block of k (DSGD__KC), each col entry is summed block
   by block in a small tile first, as gemm sums it, then added. Wt is W
   transposed per (ky, kx): Wt[(ky kw + kx) f + p][ch] = W[(ky kw + kx) c +
   ch][p], so B is read where it lies, c wide. With stride 1 a direct path
   (below) reads A where it lies too; this one, by tiles, takes the rest. */
typedef struct dsgd__dx_job {
    const dsgd__cpu_kernel *kern;
    float *const *pack;
    dsgd_window wd;
    int oh, ow, f;
    size_t rows, step; /* n h w; dx rows per task, whole tiles (direct: images per task) */
    const float *dy, *wt;
    float *dx;
    int xp, l, t0; /* direct: dy planes' row pitch, left and top borders */
    size_t plane;  /* direct: floats per plane */
} dsgd__dx_job;

/* The direct path (stride 1, f at most one block of k, an image's dy
   fitting the slot's scratch): per image, dy is laid out as f planes,
   dyt[p][(oy + t0) xp + l + ox] = dy[i, oy, ox, p], zeros elsewhere. dx
   pixel (iy, ix) is then v = iy xp + ix, and the dy row it takes at
   (ky, kx), (oy, ox) = (iy + pad - ky, ix + pad - kx), lies at v + (pad -
   ky + t0) xp + (pad - kx + l) in every plane, or where there is none at a
   zero: the top rows and left columns (t0, l) take oy, ox < 0, and with
   xp >= w + pad an ox >= ow lands past its row's dy and before the next
   row's (the right border is the next row's left). So MR consecutive v
   are a strip of the planes that the thin kernel reads as its packed A
   where it lies (lda: the plane), with nothing packed; the tile's T per
   (ky, kx) is the same sum as above, in a small tile first, 0.0f + T then
   + T in (ky, kx) order, and the pixels of the tile (v whose ix < w) are
   copied to dx. Where no dy reaches, T is the sum of zeros times W, +0 for
   a finite W, which changes no sum (see above); the v past a row's w are
   computed and dropped. */
static void dsgd__dx_direct_task(void *arg, int task, int slot) {
    const dsgd__dx_job *j = (const dsgd__dx_job *)arg;
    const dsgd_window *wd = &j->wd;
    const int mr = j->kern->mr, tn = j->kern->thin_n, f = j->f, c = wd->c, xp = j->xp, w = wd->w;
    const size_t i0 = (size_t)task * j->step, i1 = DSGD__MIN((size_t)wd->n, i0 + j->step), plane = j->plane;
    const size_t vend = (size_t)(wd->h - 1) * (size_t)xp + (size_t)w; /* past the last pixel */
    float *dyt = DSGD__IMG_TMP(j->pack[slot]);
    float acc[DSGD__MR_MAX * DSGD__NR_MAX];
    size_t i, v0;
    int oy, ky, kx, j0, q;
    memset(dyt, 0, (size_t)f * plane * sizeof(float)); /* the borders; each image writes the rest */
    for (i = i0; i < i1; ++i) {
        for (oy = 0; oy < j->oh; ++oy)
            dsgd__pack_t(j->dy + (i * (size_t)j->oh + (size_t)oy) * (size_t)j->ow * (size_t)f, (size_t)f, j->ow, f,
                         (int)plane, dyt + (size_t)(oy + j->t0) * (size_t)xp + (size_t)j->l);
        for (v0 = 0; v0 < vend; v0 += (size_t)mr) {
            const int rows = (int)DSGD__MIN((size_t)mr, vend - v0);
            for (j0 = 0; j0 < c; j0 += tn) {
                const int n = DSGD__MIN(tn, c - j0);
                for (ky = 0; ky < wd->kh; ++ky)
                    for (kx = 0; kx < wd->kw; ++kx)
                        j->kern->thin(f,
                                      dyt + v0 + (size_t)(wd->pad - ky + j->t0) * (size_t)xp +
                                          (size_t)(wd->pad - kx + j->l),
                                      plane, j->wt + (size_t)(ky * wd->kw + kx) * (size_t)f * (size_t)c + (size_t)j0,
                                      (size_t)c, n, rows, acc, (size_t)tn, 1.0f, ky > 0 || kx > 0);
                for (q = 0; q < rows; ++q) {
                    const size_t v = v0 + (size_t)q, ix = v % (size_t)xp;
                    if (ix < (size_t)w)
                        memcpy(j->dx + ((i * (size_t)wd->h + v / (size_t)xp) * (size_t)w + ix) * (size_t)c + (size_t)j0,
                               acc + (size_t)q * (size_t)tn, (size_t)n * sizeof(float));
                }
            }
        }
    }
}

static void dsgd__dx_task(void *arg, int task, int slot) {
    const dsgd__dx_job *j = (const dsgd__dx_job *)arg;
    const dsgd_window *wd = &j->wd;
    const int mr = j->kern->mr, tn = j->kern->thin_n, f = j->f, c = wd->c, s = wd->stride;
    const size_t r0 = (size_t)task * j->step, r1 = DSGD__MIN(j->rows, r0 + j->step);
    float *ap = j->pack[slot], *tmp = DSGD__IMG_TMP(ap);
    float acc[DSGD__MR_MAX * DSGD__NR_MAX];
    const float *src[DSGD__MR_MAX];
    int iys[DSGD__MR_MAX], ixs[DSGD__MR_MAX];
    size_t imgs[DSGD__MR_MAX], t0;
    for (t0 = r0; t0 < r1; t0 += (size_t)mr) {
        const int rows = (int)DSGD__MIN((size_t)mr, r1 - t0);
        float *out = j->dx + t0 * (size_t)c;
        int q, ky, kx, first = 1, pc, j0;
        for (q = 0; q < rows; ++q) { /* the tile's pixels */
            const size_t p = t0 + (size_t)q;
            imgs[q] = p / ((size_t)wd->h * (size_t)wd->w);
            iys[q] = (int)(p / (size_t)wd->w % (size_t)wd->h);
            ixs[q] = (int)(p % (size_t)wd->w);
        }
        for (ky = 0; ky < wd->kh; ++ky)
            for (kx = 0; kx < wd->kw; ++kx) {
                const float *wt = j->wt + (size_t)(ky * wd->kw + kx) * (size_t)f * (size_t)c;
                int any = 0, even = 1; /* even: the rows f apart in dy, packed from where they lie */
                for (q = 0; q < rows; ++q) { /* the dy row of output (oy, ox) that reads it at (ky, kx) */
                    int ny = iys[q] + wd->pad - ky, nx = ixs[q] + wd->pad - kx;
                    src[q] = NULL;
                    if (s > 1) {
                        if (ny < 0 || nx < 0 || ny % s || nx % s) continue;
                        ny /= s, nx /= s;
                    }
                    if (ny < 0 || nx < 0 || ny >= j->oh || nx >= j->ow) continue;
                    src[q] = j->dy + ((imgs[q] * (size_t)j->oh + (size_t)ny) * (size_t)j->ow + (size_t)nx) * (size_t)f;
                    any = 1;
                }
                if (!any) continue;
                for (q = 1; q < rows && even; ++q) even = src[q - 1] && src[q] == src[q - 1] + f;
                even = even && src[0];
                for (j0 = 0; j0 < c; j0 += tn) {
                    const int n = DSGD__MIN(tn, c - j0);
                    for (pc = 0; pc < f; pc += DSGD__KC) {
                        const int kc = DSGD__MIN(DSGD__KC, f - pc);
                        if (even && (j0 == 0 || f > DSGD__KC)) {
                            dsgd__pack_a(0, src[0], f, 0, rows, pc, kc, mr, ap, NULL, NULL);
                        } else if (j0 == 0 || f > DSGD__KC) { /* A's rows: packed once per (ky, kx) when one block */
                            for (q = 0; q < rows; ++q)
                                if (src[q])
                                    memcpy(tmp + (size_t)q * kc, src[q] + pc, (size_t)kc * sizeof(float));
                                else
                                    memset(tmp + (size_t)q * kc, 0, (size_t)kc * sizeof(float));
                            dsgd__pack_a(0, tmp, kc, 0, rows, 0, kc, mr, ap, NULL, NULL);
                        }
                        if (f <= DSGD__KC) /* the col entry is 0.0f + T: T added straight */
                            j->kern->thin(kc, ap, (size_t)mr, wt + (size_t)pc * (size_t)c + (size_t)j0, (size_t)c, n,
                                          rows, out + j0, (size_t)c, 1.0f, !first);
                        else
                            j->kern->thin(kc, ap, (size_t)mr, wt + (size_t)pc * (size_t)c + (size_t)j0, (size_t)c, n,
                                          rows, acc, (size_t)tn, 1.0f, pc > 0);
                    }
                    if (f > DSGD__KC) {
                        if (first) dsgd__gemm_beta(rows, n, 0.0f, out + j0, c);
                        dsgd__gemm_add(out + j0, c, rows, n, 1.0f, acc, tn);
                    }
                }
                first = 0;
            }
        if (first) dsgd__gemm_beta(rows, c, 0.0f, out, c); /* no dy reaches these pixels */
    }
}

static dsgd_result dsgd__cpu_conv_backward_x(void *impl, const dsgd_window *wd, int f, dsgd_ref rdy, dsgd_ref rw,
                                             dsgd_ref rdx) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    dsgd__window_dims d;
    dsgd__dx_job j;
    float *wt;
    const float *w;
    size_t nw, kk, p, ch, tiles, tasks = 1;
    int own = 0, direct = 0;
    dsgd_result r;
    if (dsgd__window_check(cpu->ctx, "cpu", "conv_backward_x", wd, 0, &d) != DSGD_OK) return DSGD_ERR_INVALID_ARGUMENT;
    if (f < 1 || !cpu->kern->thin)
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu conv_backward_x: f=%d (>= 1)%s", f,
                                  cpu->kern->thin ? "" : ", or kernels without a thin GEMM");
    memset(&j, 0, sizeof(j));
    nw = d.k * (size_t)f;
    if (!(j.dy = dsgd__cpu_span(cpu, rdy, d.rows * (size_t)f, "conv_backward_x dy")) ||
        !(w = dsgd__cpu_span(cpu, rw, nw, "conv_backward_x W")) ||
        !(j.dx = dsgd__cpu_span(cpu, rdx, d.x, "conv_backward_x dx")))
        return DSGD_ERR_INVALID_ARGUMENT;
    if (dsgd__cpu_overlap(rdx, d.x, rdy, d.rows * (size_t)f) || dsgd__cpu_overlap(rdx, d.x, rw, nw))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT, "cpu conv_backward_x: dx overlaps dy or W");
    j.kern = cpu->kern;
    j.pack = cpu->pack;
    j.wd = *wd;
    j.oh = d.oh, j.ow = d.ow, j.f = f;
    j.rows = (size_t)wd->n * (size_t)wd->h * (size_t)wd->w;
    tiles = (j.rows + (size_t)cpu->kern->mr - 1) / (size_t)cpu->kern->mr;
    if (cpu->pool.n > 1 && (double)d.rows * (double)d.k * f >= DSGD__CPU_GEMM_GRAIN)
        tasks = DSGD__MIN((size_t)cpu->pool.n, tiles);
    if (wd->stride == 1 && f <= DSGD__KC && (size_t)wd->n >= tasks) { /* the direct path, if dy's planes fit */
        const int kh = wd->kh, kw = wd->kw, pad = wd->pad;
        size_t vend, reach;
        j.l = DSGD__MAX(0, kw - 1 - pad);
        j.t0 = DSGD__MAX(0, kh - 1 - pad);
        j.xp = DSGD__MAX(j.l + d.ow, wd->w + pad); /* a row's right border is the next one's left */
        /* the furthest float a tile reads: its last v's dy at (0, 0) */
        vend = (size_t)(wd->h - 1) * (size_t)j.xp + (size_t)wd->w;
        reach = vend + (size_t)cpu->kern->mr - 1 + (size_t)(pad + j.t0) * (size_t)j.xp + (size_t)(pad + j.l);
        j.plane = DSGD__MAX(reach, ((size_t)j.t0 + (size_t)d.oh) * (size_t)j.xp);
        direct = j.plane * (size_t)f <= DSGD__IMG_TMP_FLOATS;
    }
    if ((r = dsgd__cpu_pack_reserve(cpu, tasks > 1 ? cpu->pool.n : 1)) != DSGD_OK) return r;
    /* Wt in slot 0's B area (no task packs B here), or apart when W is larger */
    if (nw <= (size_t)DSGD__KC * DSGD__NC) {
        wt = cpu->pack[0] + (size_t)DSGD__MC * DSGD__KC;
    } else {
        if (!(wt = (float *)DSGD_MALLOC(nw * sizeof(float))))
            return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_OUT_OF_MEMORY, "cpu conv_backward_x: W transposed");
        own = 1;
    }
    for (kk = 0; kk < (size_t)wd->kh * (size_t)wd->kw; ++kk)
        for (ch = 0; ch < (size_t)wd->c; ++ch)
            for (p = 0; p < (size_t)f; ++p)
                wt[(kk * (size_t)f + p) * (size_t)wd->c + ch] = w[(kk * (size_t)wd->c + ch) * (size_t)f + p];
    for (p = 0; direct && p < nw; ++p) /* the direct path's border zeros times W are +0 only for a finite W */
        if (!isfinite(w[p])) direct = 0;
    j.wt = wt;
    if (direct) {
        j.step = ((size_t)wd->n + tasks - 1) / tasks;
        tasks = ((size_t)wd->n + j.step - 1) / j.step;
        dsgd__cpu_run(cpu, dsgd__dx_direct_task, &j, (int)tasks);
    } else {
        j.step = (tiles + tasks - 1) / tasks * (size_t)cpu->kern->mr;
        tasks = (j.rows + j.step - 1) / j.step;
        dsgd__cpu_run(cpu, dsgd__dx_task, &j, (int)tasks);
    }
    if (own) DSGD_FREE(wt);
    return DSGD_OK;
}

#endif /* !DSGD_USE_CBLAS */

static dsgd_result dsgd__cpu_gemm(void *impl, int ta, int tb, int m, int n, int k, float alpha,
                                  dsgd_ref ra, int lda, dsgd_ref rb, int ldb, float beta,
                                  dsgd_ref rc, int ldc) {
    dsgd__cpu *cpu = (dsgd__cpu *)impl;
    const float *a, *b;
    float *c;
    int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (m < 0 || n < 0 || k < 0 || lda < DSGD__MAX(1, a_cols) || ldb < DSGD__MAX(1, b_cols) ||
        ldc < DSGD__MAX(1, n))
        return dsgd_ctx_set_error(cpu->ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "cpu gemm: bad sizes m=%d n=%d k=%d lda=%d ldb=%d ldc=%d", m, n, k,
                                  lda, ldb, ldc);
    if (m == 0 || n == 0) return DSGD_OK;
    c = dsgd__cpu_span(cpu, rc, (size_t)(m - 1) * ldc + n, "gemm C");
    if (!c) return DSGD_ERR_INVALID_ARGUMENT;
    a = b = NULL;
    if (k > 0) { /* check every range before C is touched */
        a = dsgd__cpu_span(cpu, ra, (size_t)(a_rows - 1) * lda + a_cols, "gemm A");
        b = dsgd__cpu_span(cpu, rb, (size_t)(b_rows - 1) * ldb + b_cols, "gemm B");
        if (!a || !b) return DSGD_ERR_INVALID_ARGUMENT;
    }
#ifdef DSGD_USE_CBLAS
    dsgd__gemm_beta(m, n, beta, c, ldc);
    if (k > 0 && alpha != 0.0f)
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, 1.0f, c, ldc);
    return DSGD_OK;
#else
    return dsgd__cpu_gemm_run(cpu, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, NULL);
#endif
}

#endif /* DSGD__PART_BACKEND_CPU_GEMM_IMPL */
