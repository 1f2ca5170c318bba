/* distsgd/cl/kernels.h - our OpenCL C kernels: their source and their names
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   KERNELS

     Every computation of the OpenCL backend but GEMM is one of the kernels
     below, embedded as OpenCL C 1.2 source. The context (context.h) builds
     the source once, for all of its devices, with the options PRECISION
     names (the build log is in the error message when it fails: ERRORS in
     devices.h); each backend (backend.h) makes its own kernel object of
     each and launches it by its DSGD_CL__K_* index. This part declares
     nothing public.

   PRECISION (against the CPU reference backend)

     Kernels are built with FP_CONTRACT off and, where the device supports it,
     -cl-fp32-correctly-rounded-divide-sqrt, so scale, axpy, bias_backward,
     the optimizer updates, relu and the image operations (im2col, col2im,
     max-pool: copies, compares and float adds in the CPU's order) match the
     CPU backend bit for bit. bias_backward adds in the order both backends
     share: the rows in blocks of DSGD_CL__BIAS_ROWS (128; the last one
     shorter), each block's column sum from 0.0f in row order, then db the
     block sums from 0.0f in block order (for m <= 128 simply the rows in
     order), whatever the work-group size or the CPU's thread count.
     Options that allow reassociation or assume
     finite math (-cl-fast-relaxed-math, -cl-unsafe-math-optimizations,
     -cl-finite-math-only) are never passed by the library; added through
     build_options they void these promises (max-pool's NaN rule first). tanh,
     sigmoid and the losses use OpenCL's exp/tanh/log (a few ulp). The losses
     and norm_check accumulate in double when every device of the context has
     cl_khr_fp64, else in float (then norm_check's per-work-group partial sums
     are float, summed in double on the host). Reductions have a fixed order
     for a given size and device: same inputs, same bits. sum_across adds in
     float in rank order, as the host's DSGD_ALLREDUCE_DIRECT does, so the
     DEVICE and HOST gradient paths give the same bits with that algorithm.
*/
#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_KERNELS_IMPL)
#define DSGD_CL__PART_KERNELS_IMPL

/* >>kernels ----------------------------------------------------------------- */
/* Our OpenCL C 1.2 kernels. Offsets and counts travel as ulong (size_t is not
   a valid kernel argument type); every kernel checks its index against the
   size, so global sizes are rounded up to whole work-groups. The source is an
   array of pieces because C99 compilers need only support 4095-character
   string literals. */

/* bias_backward's rows per block: the CPU backend's DSGD__BIAS_ROWS
   (backend_cpu.h) is the same, and so is the order it fixes (PRECISION). */
#define DSGD_CL__BIAS_ROWS 128
#define DSGD_CL__STR2(x) #x
#define DSGD_CL__STR(x) DSGD_CL__STR2(x)

/* The image kernels' source, built twice (see the NHWC piece below). Each
   work-item splits its dimension-1 index before any early return, so that
   a compiler may do the divisions once for a row of work-items. */
#define DSGD_CL__IMG_SRC_A                                                                                     \
    "/* col(r, q) for row r = (i, oy, ox, ky), q < kw c: image row iy's float\n"                              \
    "   (ox s - p) c + q, 0 outside the image */\n"                                                            \
    "__kernel void DSGD_IMG(dsgd_im2col)(__global const float *x, ulong xoff, __global float *col,\n"          \
    "                                    ulong coff, DSGD_WIN) {\n"                                            \
    "    DSGD_IU r = (DSGD_IU)get_global_id(rd), t = r / (DSGD_IU)kh, u = t / (DSGD_IU)ow;\n"                   \
    "    DSGD_IU ky = r - t * (DSGD_IU)kh, ox = t - u * (DSGD_IU)ow, oy = u % (DSGD_IU)oh, i = u / (DSGD_IU)oh;\n" \
    "    DSGD_IU q0 = (DSGD_IU)get_global_id(1 - rd), qs = (DSGD_IU)get_global_size(1 - rd), run = (DSGD_IU)kw * (DSGD_IU)c;\n" \
    "    if (r >= items) return;\n"                                                                            \
    "    DSGD_IS iy = (DSGD_IS)(oy * (DSGD_IU)s + ky) - p, wc = (DSGD_IS)w * c;\n"                             \
    "    DSGD_IS e0 = ((DSGD_IS)(ox * (DSGD_IU)s) - p) * c;\n"                                                 \
    "    __global float *d = col + coff + r * run;\n"                                                          \
    "    if (iy < 0 || iy >= h) {\n"                                                                           \
    "        DSGD_RUN(q, q0, qs, run, d[q] = 0.0f;)\n"                                            \
    "        return;\n"                                                                                        \
    "    }\n"                                                                                                  \
    "    __global const float *src = x + xoff + (DSGD_IU)(((DSGD_IS)i * h + iy) * wc);\n"                      \
    "    DSGD_RUN(q, q0, qs, run, { DSGD_IS e = e0 + (DSGD_IS)q; d[q] = e >= 0 && e < wc ? src[e] : 0.0f; })\n"                                                                                                  \
    "}\n"                                                                                                      \
    "\n"                                                                                                       \
    "/* dx at pixel g = (i, iy, ix), channel by channel in place: from 0.0f,\n"                                \
    "   the col entries im2col copied from it, (ky, kx) ascending (oy, then\n"                                 \
    "   ox, descending) */\n"                                                                                  \
    "__kernel void DSGD_IMG(dsgd_col2im)(__global const float *col, ulong coff, __global float *dx,\n"         \
    "                                    ulong dxoff, DSGD_WIN) {\n"                                           \
    "    DSGD_IU g = (DSGD_IU)get_global_id(rd), t = g / (DSGD_IU)w, ix = g - t * (DSGD_IU)w;\n"                \
    "    DSGD_IU iy = t % (DSGD_IU)h, i = t / (DSGD_IU)h;\n"                                                   \
    "    DSGD_IU c0 = (DSGD_IU)get_global_id(1 - rd), cs = (DSGD_IU)get_global_size(1 - rd), cc = (DSGD_IU)c;\n"         \
    "    DSGD_IU k = (DSGD_IU)kh * (DSGD_IU)kw * cc;\n"                                                        \
    "    DSGD_IS ty = (DSGD_IS)iy + p, tx = (DSGD_IS)ix + p;\n"                                                \
    "    DSGD_IS oy0 = ty - kh + 1 <= 0 ? 0 : (ty - kh + s) / s, oy1 = min((DSGD_IS)oh - 1, ty / s);\n"       \
    "    DSGD_IS ox0 = tx - kw + 1 <= 0 ? 0 : (tx - kw + s) / s, ox1 = min((DSGD_IS)ow - 1, tx / s);\n"       \
    "    if (g >= items) return;\n"                                                                            \
    "    __global float *d = dx + dxoff + g * cc;\n"                                                           \
    "    DSGD_RUN(ch, c0, cs, cc, d[ch] = 0.0f;)\n"                                             \
    "    for (DSGD_IS oy = oy1; oy >= oy0; --oy)\n"                                                            \
    "        for (DSGD_IS ox = ox1; ox >= ox0; --ox) {\n"                                                      \
    "            __global const float *src = col + coff + (DSGD_IU)(((DSGD_IS)i * oh + oy) * ow + ox) * k\n"   \
    "                                        + (DSGD_IU)(((ty - oy * s) * kw + tx - ox * s) * c);\n"          \
    "            DSGD_RUN(ch, c0, cs, cc, d[ch] = d[ch] + src[ch];)\n"                          \
    "        }\n"                                                                                              \
    "}\n"

#define DSGD_CL__IMG_SRC_B                                                                                     \
    "/* y = max-pool(x) at pixel g = (i, oy, ox): per channel the window's\n"                                  \
    "   first maximum, or its first NaN */\n"                                                                  \
    "__kernel void DSGD_IMG(dsgd_maxpool_fwd)(__global const float *x, ulong xoff, __global float *y,\n"      \
    "                                         ulong yoff, DSGD_WIN) {\n"                                       \
    "    DSGD_IU g = (DSGD_IU)get_global_id(rd), t = g / (DSGD_IU)ow, ox = g - t * (DSGD_IU)ow;\n"              \
    "    DSGD_IU oy = t % (DSGD_IU)oh, i = t / (DSGD_IU)oh;\n"                                                 \
    "    DSGD_IU c0 = (DSGD_IU)get_global_id(1 - rd), cs = (DSGD_IU)get_global_size(1 - rd), cc = (DSGD_IU)c;\n"         \
    "    if (g >= items) return;\n"                                                                            \
    "    __global const float *b = x + xoff\n"                                                                 \
    "        + ((i * (DSGD_IU)h + oy * (DSGD_IU)s) * (DSGD_IU)w + ox * (DSGD_IU)s) * cc;\n"                    \
    "    for (DSGD_IU ch = c0; ch < cc; ch += cs) {\n"                                                         \
    "        float m = b[ch];\n"                                                                               \
    "        for (int ky = 0; ky < kh; ++ky)\n"                                                                \
    "            for (int kx = ky == 0 ? 1 : 0; kx < kw; ++kx) {\n"                                            \
    "                float v = b[((DSGD_IU)ky * (DSGD_IU)w + (DSGD_IU)kx) * cc + ch];\n"                       \
    "                if (v > m || (isnan(v) && !isnan(m))) m = v;\n"                                           \
    "            }\n"                                                                                          \
    "        y[yoff + g * cc + ch] = m;\n"                                                                     \
    "    }\n"                                                                                                  \
    "}\n"                                                                                                      \
    "\n"                                                                                                       \
    "/* max-pool's dx at pixel g = (i, iy, ix): per channel the sum, from 0.0f\n"                              \
    "   and windows (oy, ox) ascending, of the dy of every window whose first\n"                               \
    "   element equal to y (the first NaN for a NaN y) it is */\n"                                            \
    "__kernel void DSGD_IMG(dsgd_maxpool_bwd)(__global const float *x, ulong xoff, __global const float *y,\n" \
    "                                         ulong yoff, __global const float *dy, ulong dyoff,\n"            \
    "                                         __global float *dx, ulong dxoff, DSGD_WIN) {\n"                  \
    "    DSGD_IU g = (DSGD_IU)get_global_id(rd), t = g / (DSGD_IU)w, ix = g - t * (DSGD_IU)w;\n"                \
    "    DSGD_IU iy = t % (DSGD_IU)h, i = t / (DSGD_IU)h;\n"                                                   \
    "    DSGD_IU c0 = (DSGD_IU)get_global_id(1 - rd), cs = (DSGD_IU)get_global_size(1 - rd), cc = (DSGD_IU)c;\n"         \
    "    DSGD_IS sy = (DSGD_IS)iy, sx = (DSGD_IS)ix;\n"                                                        \
    "    DSGD_IS oy0 = sy - kh + 1 <= 0 ? 0 : (sy - kh + s) / s, oy1 = min((DSGD_IS)oh - 1, sy / s);\n"       \
    "    DSGD_IS ox0 = sx - kw + 1 <= 0 ? 0 : (sx - kw + s) / s, ox1 = min((DSGD_IS)ow - 1, sx / s);\n"       \
    "    if (g >= items) return;\n"                                                                            \
    "    for (DSGD_IU ch = c0; ch < cc; ch += cs) {\n"                                                         \
    "        float acc = 0.0f;\n"                                                                              \
    "        for (DSGD_IS oy = oy0; oy <= oy1; ++oy)\n"                                                        \
    "            for (DSGD_IS ox = ox0; ox <= ox1; ++ox) {\n"                                                  \
    "                DSGD_IU o = (DSGD_IU)(((DSGD_IS)i * oh + oy) * ow + ox) * cc + ch;\n"                     \
    "                __global const float *b = x + xoff + ch\n"                                                \
    "                    + (DSGD_IU)((((DSGD_IS)i * h + oy * s) * w + ox * s) * c);\n"                        \
    "                float want = y[yoff + o];\n"                                                              \
    "                int want_nan = isnan(want), found = 0, mine = 0;\n"                                       \
    "                for (int ky = 0; ky < kh && !found; ++ky)\n"                                              \
    "                    for (int kx = 0; kx < kw; ++kx) {\n"                                                  \
    "                        float v = b[((DSGD_IU)ky * (DSGD_IU)w + (DSGD_IU)kx) * cc];\n"                    \
    "                        if (want_nan ? isnan(v) : v == want) {\n"                                         \
    "                            mine = ky == sy - oy * s && kx == sx - ox * s;\n"                             \
    "                            found = 1;\n"                                                                 \
    "                            break;\n"                                                                     \
    "                        }\n"                                                                              \
    "                    }\n"                                                                                  \
    "                if (mine) acc = acc + dy[dyoff + o];\n"                                                   \
    "            }\n"                                                                                          \
    "        dx[dxoff + g * cc + ch] = acc;\n"                                                                 \
    "    }\n"                                                                                                  \
    "}\n"

static const char *const dsgd_cl__source[] = {
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "#define DSGD_BIAS_ROWS " DSGD_CL__STR(DSGD_CL__BIAS_ROWS) "u\n"
    "#ifdef DSGD_CL_FP64\n"
    "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    "typedef double acc_t;\n"
    "#else\n"
    "typedef float acc_t;\n"
    "#endif\n"
    "#ifdef DSGD_CL_SELFTEST_BUILD_ERROR\n"
    "#error \"deliberate build failure requested by DSGD_CL_SELFTEST_BUILD_ERROR\"\n"
    "#endif\n"
    "\n"
    "float dsgd_act(int act, float v) {\n"
    "    if (act == 1) return v > 0.0f ? v : 0.0f;\n"
    "    if (act == 2) return tanh(v);\n"
    "    if (act == 3) return 1.0f / (1.0f + exp(-v));\n"
    "    return v;\n"
    "}\n"
    "\n"
    "__kernel void dsgd_scale(__global float *x, ulong off, float alpha, ulong n) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < n) x[off + i] = x[off + i] * alpha;\n"
    "}\n"
    "\n"
    "__kernel void dsgd_axpy(__global float *y, ulong yoff, float alpha,\n"
    "                        __global const float *x, ulong xoff, ulong n) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < n) y[yoff + i] = y[yoff + i] + alpha * x[xoff + i];\n"
    "}\n"
    "\n"
    "/* y(m,n) = act(y + bias) over total = m*n entries */\n"
    "__kernel void dsgd_bias_act(__global float *y, ulong yoff, __global const float *b,\n"
    "                            ulong boff, int has_bias, int act, uint n, ulong total) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < total) {\n"
    "        float v = y[yoff + i];\n"
    "        if (has_bias) v = v + b[boff + i % n];\n"
    "        y[yoff + i] = dsgd_act(act, v);\n"
    "    }\n"
    "}\n"
    "\n"
    "/* dy *= act'(y), written in terms of the activation's output y */\n"
    "__kernel void dsgd_act_backward(__global float *dy, ulong dyoff, __global const float *y,\n"
    "                                ulong yoff, int act, ulong n) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i < n) {\n"
    "        float d = dy[dyoff + i], v = y[yoff + i];\n"
    "        if (act == 1) d = v > 0.0f ? d : 0.0f;\n"
    "        else if (act == 2) d = d * (1.0f - v * v);\n"
    "        else if (act == 3) d = d * (v * (1.0f - v));\n"
    "        dy[dyoff + i] = d;\n"
    "    }\n"
    "}\n"
    "\n"
    "/* bias_backward in the blocked order of DSGD_BIAS_ROWS-row blocks (the\n"
    "   CPU backend's: see DSGD_CL__BIAS_ROWS). Work-item (j, blk) sums column\n"
    "   j of block blk from 0.0f in row order into part(blk, j); neighbours in\n"
    "   j read neighbouring floats. With one block part is db itself. */\n"
    "__kernel void dsgd_bias_partial(__global float *part, ulong poff, __global const float *dy,\n"
    "                                ulong dyoff, uint m, uint n) {\n"
    "    uint j = get_global_id(0), blk = get_global_id(1);\n"
    "    uint lo = blk * DSGD_BIAS_ROWS, hi = min(m, lo + DSGD_BIAS_ROWS);\n"
    "    if (j >= n || (blk > 0 && lo >= m)) return;\n"
    "    __global const float *p = dy + dyoff + (ulong)lo * n + j;\n"
    "    float s = 0.0f;\n"
    "    for (uint i = lo; i < hi; ++i, p += n) s = s + *p;\n"
    "    part[poff + (ulong)blk * n + j] = s;\n"
    "}\n"
    "\n"
    "/* db(j) = the block partials of column j summed from 0.0f in block order */\n"
    "__kernel void dsgd_bias_reduce(__global float *db, ulong dboff, __global const float *part,\n"
    "                               uint blocks, uint n) {\n"
    "    uint j = get_global_id(0);\n"
    "    if (j >= n) return;\n"
    "    float s = 0.0f;\n"
    "    for (uint k = 0; k < blocks; ++k) s = s + part[(ulong)k * n + j];\n"
    "    db[dboff + j] = s;\n"
    "}\n",

    "/* Softmax cross-entropy, one work-item per sample. rows[2i] = the sample's\n"
    "   loss, rows[2i+1] = 1 when argmax == class, else 0; -1 marks a class that\n"
    "   is not an integer in [0, c), rows[2i] then holding that class. */\n"
    "__kernel void dsgd_xent_rows(uint m, uint c, __global const float *pred, ulong poff,\n"
    "                             __global const float *tgt, ulong toff, float gs,\n"
    "                             __global float *dpred, ulong doff, int want_grad,\n"
    "                             __global acc_t *rows) {\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= m) return;\n"
    "    __global const float *z = pred + poff + (ulong)i * c;\n"
    "    float t = tgt[toff + i];\n"
    "    if (!(t >= 0.0f && t < (float)c) || t != floor(t)) {\n"
    "        rows[2 * i] = (acc_t)t; rows[2 * i + 1] = -1; return;\n"
    "    }\n"
    "    uint cls = (uint)t, best = 0;\n"
    "    for (uint j = 1; j < c; ++j) if (z[j] > z[best]) best = j;\n"
    "    acc_t mx = z[best], sum = 0;\n"
    "    for (uint j = 0; j < c; ++j) sum += exp((acc_t)z[j] - mx);\n"
    "    acc_t lse = mx + log(sum);\n"
    "    rows[2 * i] = lse - (acc_t)z[cls];\n"
    "    rows[2 * i + 1] = best == cls ? 1 : 0;\n"
    "    if (want_grad) {\n"
    "        __global float *d = dpred + doff + (ulong)i * c;\n"
    "        for (uint j = 0; j < c; ++j) {\n"
    "            acc_t p = exp((acc_t)z[j] - lse);\n"
    "            d[j] = (float)((acc_t)gs * (p - (j == cls ? (acc_t)1 : (acc_t)0)));\n"
    "        }\n"
    "    }\n"
    "}\n"
    "\n"
    "/* Mean squared error, one work-item per sample (rows as above). */\n"
    "__kernel void dsgd_mse_rows(uint m, uint c, __global const float *pred, ulong poff,\n"
    "                            __global const float *tgt, ulong toff, float gs,\n"
    "                            __global float *dpred, ulong doff, int want_grad,\n"
    "                            __global acc_t *rows) {\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= m) return;\n"
    "    __global const float *p = pred + poff + (ulong)i * c;\n"
    "    __global const float *t = tgt + toff + (ulong)i * c;\n"
    "    acc_t s = 0;\n"
    "    uint bp = 0, bt = 0;\n"
    "    for (uint j = 0; j < c; ++j) {\n"
    "        acc_t e = (acc_t)p[j] - (acc_t)t[j];\n"
    "        s += e * e;\n"
    "        if (want_grad) dpred[doff + (ulong)i * c + j] = (float)((acc_t)gs * (acc_t)2 * e / (acc_t)c);\n"
    "        if (p[j] > p[bp]) bp = j;\n"
    "        if (t[j] > t[bt]) bt = j;\n"
    "    }\n"
    "    rows[2 * i] = s / (acc_t)c;\n"
    "    rows[2 * i + 1] = bp == bt ? 1 : 0;\n"
    "}\n"
    "\n"
    "/* One work-group (power-of-two size) sums the rows in a fixed order and, when\n"
    "   no sample was bad, adds loss and correct count to stats. status[0] = bad\n"
    "   samples, status[1] = the first bad sample (m when none), status[2] = the\n"
    "   bits of its class as a float. */\n"
    "__kernel void dsgd_loss_reduce(uint m, __global const acc_t *rows, __global float *stats,\n"
    "                               ulong soff, __global int *status, __local acc_t *sl,\n"
    "                               __local acc_t *sc, __local uint *sb, __local uint *sf) {\n"
    "    uint lid = get_local_id(0), L = get_local_size(0);\n"
    "    acc_t a = 0, b = 0;\n"
    "    uint bad = 0, first = m;\n"
    "    for (uint i = lid; i < m; i += L) {\n"
    "        acc_t cr = rows[2 * i + 1];\n"
    "        if (cr < 0) { ++bad; if (i < first) first = i; }\n"
    "        else { a += rows[2 * i]; b += cr; }\n"
    "    }\n"
    "    sl[lid] = a; sc[lid] = b; sb[lid] = bad; sf[lid] = first;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint s = L / 2; s > 0; s >>= 1) {\n"
    "        if (lid < s) {\n"
    "            sl[lid] += sl[lid + s]; sc[lid] += sc[lid + s]; sb[lid] += sb[lid + s];\n"
    "            sf[lid] = min(sf[lid], sf[lid + s]);\n"
    "        }\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (lid == 0) {\n"
    "        status[0] = (int)sb[0]; status[1] = (int)sf[0];\n"
    "        status[2] = sf[0] < m ? as_int((float)rows[2 * sf[0]]) : 0;\n"
    "        if (sb[0] == 0) {\n"
    "            stats[soff] = stats[soff] + (float)sl[0];\n"
    "            stats[soff + 1] = stats[soff + 1] + (float)sc[0];\n"
    "        }\n"
    "    }\n"
    "}\n",

    "/* One optimizer step per parameter; the arithmetic is the CPU backend's,\n"
    "   operation for operation. kind: 0 SGD, 1 momentum, 2 Adam, 3 AdamW. */\n"
    "__kernel void dsgd_opt_update(__global float *p, ulong poff, __global const float *g,\n"
    "                              ulong goff, __global float *m1, ulong m1off,\n"
    "                              __global float *m2, ulong m2off, ulong n, int kind,\n"
    "                              float lr, float mu, int nesterov, float b1, float b2,\n"
    "                              float eps, float wd, float bc1, float bc2, float gs,\n"
    "                              __global const float *gate, ulong gateoff, int gated) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i >= n || (gated && gate[gateoff] != 0.0f)) return;\n"
    "    float pi = p[poff + i];\n"
    "    if (kind == 0) {\n"
    "        float gi = g[goff + i] * gs + wd * pi;\n"
    "        pi = pi - lr * gi;\n"
    "    } else if (kind == 1) {\n"
    "        float gi = g[goff + i] * gs + wd * pi;\n"
    "        float v = mu * m1[m1off + i] + gi;\n"
    "        m1[m1off + i] = v;\n"
    "        pi = pi - lr * (nesterov ? gi + mu * v : v);\n"
    "    } else {\n"
    "        int dec = kind == 3;\n"
    "        float gi = g[goff + i] * gs + (dec ? 0.0f : wd * pi);\n"
    "        float mi = b1 * m1[m1off + i] + (1.0f - b1) * gi;\n"
    "        float vi = b2 * m2[m2off + i] + (1.0f - b2) * gi * gi;\n"
    "        float mhat = mi / bc1, vhat = vi / bc2;\n"
    "        m1[m1off + i] = mi;\n"
    "        m2[m2off + i] = vi;\n"
    "        pi = pi - lr * (mhat / (sqrt(vhat) + eps) + (dec ? wd * pi : 0.0f));\n"
    "    }\n"
    "    p[poff + i] = pi;\n"
    "}\n"
    "\n"
    "/* First pass of norm_check: work-group g sums the squares of the finite\n"
    "   entries of [g*chunk, (g+1)*chunk) and counts the others, in a fixed\n"
    "   order (power-of-two work-group size). */\n"
    "__kernel void dsgd_norm_partial(__global const float *x, ulong off, ulong n, ulong chunk,\n"
    "                                __global acc_t *psum, __global ulong *pbad,\n"
    "                                __local acc_t *ls, __local ulong *lb) {\n"
    "    uint lid = get_local_id(0), L = get_local_size(0), g = get_group_id(0);\n"
    "    ulong start = (ulong)g * chunk, end = min(start + chunk, n);\n"
    "    acc_t s = 0;\n"
    "    ulong bad = 0;\n"
    "    for (ulong i = start + lid; i < end; i += L) {\n"
    "        float v = x[off + i];\n"
    "        if (isfinite(v)) s += (acc_t)v * (acc_t)v; else ++bad;\n"
    "    }\n"
    "    ls[lid] = s; lb[lid] = bad;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint h = L / 2; h > 0; h >>= 1) {\n"
    "        if (lid < h) { ls[lid] += ls[lid + h]; lb[lid] += lb[lid + h]; }\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (lid == 0) { psum[g] = ls[0]; pbad[g] = lb[0]; }\n"
    "}\n",

    "/* Device-side reduction across replicas (sum_across), up to 8 buffers\n"
    "   a launch: v = [d +] s0 + s1 + ... + s(k-1), in that order, written to\n"
    "   d, or with put to every s(j) (each work-item reads its entry of every\n"
    "   buffer before it writes them). */\n"
    "#define DSGD_SRC(j) , __global float *s##j, ulong o##j\n"
    "#define DSGD_DST(j) , __global float *d##j, ulong o##j\n"
    "#define DSGD_8(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)\n"
    "__kernel void dsgd_sum8(__global float *d, ulong doff, int acc, int put, uint k, ulong n\n"
    "                        DSGD_8(DSGD_SRC)) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float v = acc ? d[doff + i] + s0[o0 + i] : s0[o0 + i];\n"
    "#define DSGD_ADD(j) if (j > 0 && k > j) v = v + s##j[o##j + i];\n"
    "    DSGD_8(DSGD_ADD)\n"
    "    if (!put) { d[doff + i] = v; return; }\n"
    "#define DSGD_BACK(j) if (k > j) s##j[o##j + i] = v;\n"
    "    DSGD_8(DSGD_BACK)\n"
    "}\n"
    "\n"
    "/* d0 .. d(k-1) = s, up to 8 destinations a launch. */\n"
    "__kernel void dsgd_copy8(__global const float *s, ulong soff, uint k, ulong n\n"
    "                         DSGD_8(DSGD_DST)) {\n"
    "    ulong i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float v = s[soff + i];\n"
    "#define DSGD_PUT(j) if (k > j) d##j[o##j + i] = v;\n"
    "    DSGD_8(DSGD_PUT)\n"
    "}\n",

    "/* NHWC images (IMAGES in backend.h), on a two-dimensional range.\n"
    "   Dimension rd counts col's rows (i, oy, ox, ky) or the output's\n"
    "   pixels; a row's work-items (dimension 1 - rd, global size qs) share\n"
    "   its consecutive floats (col's kw c, or the pixel's c channels) as q,\n"
    "   q + qs, ...: on a GPU rd is 1, qs covers the run and neighbouring\n"
    "   work-items touch neighbouring addresses; on a CPU rd is 0 and qs 1,\n"
    "   one work-item does a row in a loop and PoCL vectorises across rows\n"
    "   (one work-item per float costs it several times more in index\n"
    "   arithmetic than the copy). The arithmetic is the CPU backend's:\n"
    "   copies, compares and float adds from 0.0f in the documented order.\n"
    "   Each kernel is built twice: with 32-bit index arithmetic (name _32:\n"
    "   DSGD_IU uint, DSGD_IS int), used when every index of the call fits\n"
    "   in an int, and with 64-bit (_64). Every kernel takes the window as h\n"
    "   w c kh kw s p oh ow, then the number of rows or pixels, then rd. */\n"
    "#define DSGD_WIN int h, int w, int c, int kh, int kw, int s, int p, int oh, int ow, ulong items, int rd\n"
    "/* for (q = q0; q < n; q += qs) BODY, spelled with stride 1 when qs is 1\n"
    "   (the CPU's shape) so that the compiler sees a plain loop */\n"
    "#define DSGD_RUN(q, q0, qs, n, BODY) \\\n"
    "    if (qs == 1) { for (DSGD_IU q = 0; q < n; ++q) BODY } \\\n"
    "    else { for (DSGD_IU q = q0; q < n; q += qs) BODY }\n",
    "#define DSGD_IU uint\n#define DSGD_IS int\n#define DSGD_IMG(f) f##_32\n",
    DSGD_CL__IMG_SRC_A,
    DSGD_CL__IMG_SRC_B,
    "#undef DSGD_IU\n#undef DSGD_IS\n#undef DSGD_IMG\n"
    "#define DSGD_IU ulong\n#define DSGD_IS long\n#define DSGD_IMG(f) f##_64\n",
    DSGD_CL__IMG_SRC_A,
    DSGD_CL__IMG_SRC_B,

    "/* flag[0] = 1 when x(n) holds a NaN or an infinity, else 0: one\n"
    "   work-group (power-of-two size) looks at a stride each and ORs. */\n"
    "__kernel void dsgd_nonfinite_flag(__global const float *x, ulong off, ulong n,\n"
    "                                  __global float *flag, ulong foff, __local int *bad) {\n"
    "    uint lid = get_local_id(0), L = get_local_size(0);\n"
    "    int b = 0;\n"
    "    for (ulong i = lid; i < n; i += L) b |= !isfinite(x[off + i]);\n"
    "    bad[lid] = b;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint s = L / 2; s > 0; s >>= 1) {\n"
    "        if (lid < s) bad[lid] |= bad[lid + s];\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (lid == 0) flag[foff] = bad[0] ? 1.0f : 0.0f;\n"
    "}\n"
    "\n"
    "/* A thin C = A^T B (A (k, m), B (k, n), m n small, k long: a weight\n"
    "   gradient over many rows), split along k: work-group g sums rows\n"
    "   [g kc, min(k, g kc + kc)) in row order, from 0, into part[g] (m, n),\n"
    "   each work-item outputs lid, lid + L, ...; then dsgd_gemm_tn_sum adds\n"
    "   the parts in order. */\n"
    "__kernel void dsgd_gemm_tn_part(uint m, uint n, uint k, uint kc, __global const float *a,\n"
    "                                ulong aoff, uint lda, __global const float *b, ulong boff,\n"
    "                                uint ldb, __global float *part) {\n"
    "    uint g = get_group_id(0), L = get_local_size(0), mn = m * n;\n"
    "    uint p0 = g * kc, p1 = min(k, p0 + kc);\n"
    "    for (uint o = get_local_id(0); o < mn; o += L) {\n"
    "        uint i = o / n, j = o - i * n;\n"
    "        __global const float *ai = a + aoff + i, *bj = b + boff + j;\n"
    "        float s = 0.0f;\n"
    "        for (uint q = p0; q < p1; ++q) s = s + ai[(ulong)q * lda] * bj[(ulong)q * ldb];\n"
    "        part[(ulong)g * mn + o] = s;\n"
    "    }\n"
    "}\n"
    "\n"
    "/* C (m, n; row stride ldc) = alpha (part[0] + ... + part[parts - 1]) + beta C,\n"
    "   the parts added in order from 0; beta == 0 overwrites C. */\n"
    "__kernel void dsgd_gemm_tn_sum(uint m, uint n, uint parts, __global const float *part,\n"
    "                               float alpha, float beta, __global float *c, ulong coff,\n"
    "                               uint ldc) {\n"
    "    uint o = get_global_id(0), mn = m * n;\n"
    "    if (o >= mn) return;\n"
    "    uint i = o / n, j = o - i * n;\n"
    "    float s = 0.0f;\n"
    "    for (uint g = 0; g < parts; ++g) s = s + part[(ulong)g * mn + o];\n"
    "    ulong at = coff + (ulong)i * ldc + j;\n"
    "    c[at] = beta == 0.0f ? alpha * s : alpha * s + beta * c[at];\n"
    "}\n"};

#define DSGD_CL__NSOURCE ((cl_uint)(sizeof(dsgd_cl__source) / sizeof(dsgd_cl__source[0])))

enum {
    DSGD_CL__K_SCALE = 0,
    DSGD_CL__K_AXPY,
    DSGD_CL__K_BIAS_ACT,
    DSGD_CL__K_ACT_BWD,
    DSGD_CL__K_BIAS_PART,
    DSGD_CL__K_BIAS_RED,
    DSGD_CL__K_XENT,
    DSGD_CL__K_MSE,
    DSGD_CL__K_LOSS_REDUCE,
    DSGD_CL__K_OPT,
    DSGD_CL__K_NORM,
    DSGD_CL__K_SUM8,
    DSGD_CL__K_COPY8,
    DSGD_CL__K_IM2COL,
    DSGD_CL__K_COL2IM,
    DSGD_CL__K_POOL_FWD,
    DSGD_CL__K_POOL_BWD,
    DSGD_CL__K_IM2COL_64, /* the image kernels with 64-bit indices, in the same order */
    DSGD_CL__K_COL2IM_64,
    DSGD_CL__K_POOL_FWD_64,
    DSGD_CL__K_POOL_BWD_64,
    DSGD_CL__K_GEMM_TN_PART,
    DSGD_CL__K_GEMM_TN_SUM,
    DSGD_CL__K_NONFINITE,
    DSGD_CL__K_COUNT
};

/* Kernel function names, and the operation names used in error messages. */
static const char *const dsgd_cl__kernel_fn[DSGD_CL__K_COUNT] = {
    "dsgd_scale",     "dsgd_axpy",     "dsgd_bias_act",    "dsgd_act_backward",
    "dsgd_bias_partial", "dsgd_bias_reduce", "dsgd_xent_rows", "dsgd_mse_rows", "dsgd_loss_reduce",
    "dsgd_opt_update", "dsgd_norm_partial", "dsgd_sum8", "dsgd_copy8",
    "dsgd_im2col_32", "dsgd_col2im_32", "dsgd_maxpool_fwd_32", "dsgd_maxpool_bwd_32",
    "dsgd_im2col_64", "dsgd_col2im_64", "dsgd_maxpool_fwd_64", "dsgd_maxpool_bwd_64",
    "dsgd_gemm_tn_part", "dsgd_gemm_tn_sum", "dsgd_nonfinite_flag"};
static const char *const dsgd_cl__kernel_op[DSGD_CL__K_COUNT] = {
    "scale",        "axpy",          "bias_act_forward", "act_backward",
    "bias_backward", "bias_backward(reduce)", "loss(softmax_xent)", "loss(mse)", "loss(reduce)",
    "optimizer_update", "norm_check", "sum_across", "sum_across(copy)",
    "im2col", "col2im", "maxpool_forward", "maxpool_backward",
    "im2col", "col2im", "maxpool_forward", "maxpool_backward",
    "gemm(split k)", "gemm(split k, sum)", "nonfinite_flag"};

#endif /* DSGD_CL__PART_KERNELS_IMPL */
