/* distsgd/half.h - fp16 and bf16: conversions to and from fp32, by ISA
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   HALF FORMATS

     Two 16-bit formats, held as uint16_t bit patterns:
       fp16  IEEE 754 binary16: 1 sign, 5 exponent, 10 fraction bits; normal
             magnitudes 2^-14 .. 65504, subnormals down to 2^-24; unit
             roundoff u = 2^-11.
       bf16  bfloat16, the top half of an fp32: 1 sign, 8 exponent, 7
             fraction bits; fp32's range; u = 2^-8.
     fp32 to either rounds to nearest, ties to even (RNE), as IEEE 754's
     default: fp16 keeps subnormals (a magnitude below 2^-25 goes to a
     signed zero, exactly 2^-25 too, the tie going to the even zero) and
     sends 65520 and more to Inf; bf16 keeps fp32's subnormals, sends what
     rounds above FLT_MAX to Inf. Inf stays Inf; a NaN stays a NaN, made
     quiet (fp16: the sign, the quiet bit and the fraction's top 9 bits;
     bf16: the top 16 bits with the quiet bit set). Back to fp32 is exact
     (an fp16 NaN comes back quiet, its fraction in the top bits; a bf16
     NaN comes back as it was).

     Kernels by ISA, picked as the CPU backend picks its own (CPU KERNELS
     in backend.h: the same detection, the same DSGD_CPU_ISA): on x86-64
     with GCC or Clang, "avx512_bf16" (AVX-512F's fp16 conversions,
     AVX512_BF16's vcvtneps2bf16 to bf16), "avx512" (AVX-512F; bf16 by
     integer rounding), "avx2" (F16C for fp16, AVX2 integer rounding for
     bf16), else "portable" (plain C). DSGD_CPU_ISA names one of these (the
     CPU backend takes "avx512_bf16" as its widest); otherwise the widest
     one the CPU has at or below the CPU backend's choice. Every kernel
     gives the same bits for every input (the tests check every fp16 value
     and millions of fp32 values, edges included, against the portable
     one).
*/
#ifndef DSGD__PART_HALF_DECL
#define DSGD__PART_HALF_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- half formats */

/* dst[i] = src[i] rounded to fp16 (dsgd_f32_to_f16) or bf16
   (dsgd_f32_to_bf16), or the 16-bit value src[i] as an fp32 (dsgd_f16_to_f32,
   dsgd_bf16_to_f32); see HALF FORMATS for rounding, Inf and NaN. src and dst
   may be NULL when n is 0 and must not overlap.
   Errors: none. Thread safety: any thread (they read DSGD_CPU_ISA, so not
   while another thread calls setenv). */
DSGD_API void dsgd_f32_to_f16(const float *src, uint16_t *dst, size_t n);
DSGD_API void dsgd_f16_to_f32(const uint16_t *src, float *dst, size_t n);
DSGD_API void dsgd_f32_to_bf16(const float *src, uint16_t *dst, size_t n);
DSGD_API void dsgd_bf16_to_f32(const uint16_t *src, float *dst, size_t n);

/* The kernels the conversions use now (HALF FORMATS): "avx512_bf16",
   "avx512", "avx2" or "portable". It honours DSGD_CPU_ISA.
   Errors: none. Thread safety: as dsgd_f32_to_f16. */
DSGD_API const char *dsgd_half_isa(void);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_HALF_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_HALF_IMPL)
#define DSGD__PART_HALF_IMPL

/* >>half portable ---------------------------------------------------------- */
/* The reference: every other kernel gives these bits. */

static uint16_t dsgd__f16_of(uint32_t x) {
    uint32_t s = (x >> 16) & 0x8000u, a = x & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(s | 0x7E00u | ((a >> 13) & 0x3FFu)); /* NaN, quiet */
    if (a >= 0x477FF000u) return (uint16_t)(s | 0x7C00u); /* 65520 and up (Inf too): Inf */
    if (a >= 0x38800000u) {                                /* a normal fp16: rebias, round the 13 bits off */
        uint32_t r = a - 0x38000000u;
        r += 0xFFFu + ((r >> 13) & 1u);
        return (uint16_t)(s | (r >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)s; /* below 2^-25: zero */
    {                                        /* a subnormal fp16: units of 2^-24 */
        uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, sh = 126u - e;
        uint32_t q = m >> sh, rem = m & ((1u << sh) - 1u), half = 1u << (sh - 1u);
        q += rem > half || (rem == half && (q & 1u));
        return (uint16_t)(s | q);
    }
}

static uint32_t dsgd__f32_of_f16(uint16_t h) {
    uint32_t s = ((uint32_t)h & 0x8000u) << 16, e = ((uint32_t)h >> 10) & 0x1Fu, m = (uint32_t)h & 0x3FFu;
    if (e == 0x1Fu) return s | 0x7F800000u | (m ? 0x400000u | (m << 13) : 0u);
    if (e) return s | ((e + 112u) << 23) | (m << 13);
    if (!m) return s;
    e = 113u; /* subnormal: normalise m * 2^-24 */
    while (!(m & 0x400u)) {
        m <<= 1;
        --e;
    }
    return s | (e << 23) | ((m & 0x3FFu) << 13);
}

static uint16_t dsgd__bf16_of(uint32_t x) {
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN, quiet */
    return (uint16_t)((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

static void dsgd__to_f16_portable(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        uint32_t x;
        memcpy(&x, src + i, 4);
        dst[i] = dsgd__f16_of(x);
    }
}
static void dsgd__from_f16_portable(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        uint32_t x = dsgd__f32_of_f16(src[i]);
        memcpy(dst + i, &x, 4);
    }
}
static void dsgd__to_bf16_portable(const float *src, uint16_t *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        uint32_t x;
        memcpy(&x, src + i, 4);
        dst[i] = dsgd__bf16_of(x);
    }
}
static void dsgd__from_bf16_portable(const uint16_t *src, float *dst, size_t n) {
    size_t i;
    for (i = 0; i < n; ++i) {
        uint32_t x = (uint32_t)src[i] << 16;
        memcpy(dst + i, &x, 4);
    }
}

/* The largest exponent field (bits 23..30) among x's finite elements (0:
   none, or zeros and subnormals only): what a half wire's scale is chosen
   from (collectives_algos.h, >>wire). */
static uint32_t dsgd__exp_max_portable(const float *x, size_t n) {
    uint32_t m = 0, u;
    size_t i;
    for (i = 0; i < n; ++i) {
        memcpy(&u, x + i, 4);
        u &= 0x7F800000u;
        u = u == 0x7F800000u ? 0u : u;
        m = u > m ? u : m;
    }
    return m >> 23;
}

/* >>half x86 --------------------------------------------------------------- */
/* Whole vectors here, the tail by the portable loops (the same bits). The
   hardware's fp16 conversions (F16C, AVX-512F) round to nearest even with
   an immediate rounding mode, not MXCSR's, and quiet NaNs as the portable
   code does. AVX512_BF16's conversion treats fp32 subnormals as zero: those
   lanes (rare) are redone by integer rounding. */
#if DSGD__X86_DISPATCH

#include <cpuid.h>

/* F16C: CPUID leaf 1, ECX bit 29; AVX512_BF16: leaf 7 subleaf 1, EAX bit
   5 (read directly: not every compiler's __builtin_cpu_supports knows the
   names). The CPU backend's checks (AVX2, AVX-512F) say the OS saves the
   registers. */
static int dsgd__isa_f16c(void) {
    unsigned a, b, c, d;
    return dsgd__isa_avx2() && __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1u);
}
#if (defined(__clang__) && __clang_major__ >= 9) || (!defined(__clang__) && __GNUC__ >= 10)
#define DSGD__HALF_BF16_ISA 1 /* the compiler knows target("avx512bf16") */
static int dsgd__isa_avx512_bf16(void) {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return dsgd__isa_avx512() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u);
}
#else
#define DSGD__HALF_BF16_ISA 0
#endif

__attribute__((target("avx2,f16c"))) static void dsgd__to_f16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    dsgd__to_f16_portable(src + i, dst + i, n - i);
}
__attribute__((target("avx2,f16c"))) static void dsgd__from_f16_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    dsgd__from_f16_portable(src + i, dst + i, n - i);
}
/* 8 lanes of dsgd__bf16_of, as 32-bit integers */
__attribute__((target("avx2"))) static __m256i dsgd__bf16_avx2_8(__m256i x) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
    __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7F800000));
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_and_si256(_mm256_srli_epi32(x, 16), one));
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(_mm256_srli_epi32(r, 16), q, nan);
}
__attribute__((target("avx2"))) static void dsgd__to_bf16_avx2(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i lo = dsgd__bf16_avx2_8(_mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
        __m256i hi = dsgd__bf16_avx2_8(_mm256_loadu_si256((const __m256i *)(const void *)(src + i + 8)));
        /* packus works within 128-bit lanes: put the quarters back in order */
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
    }
    dsgd__to_bf16_portable(src + i, dst + i, n - i);
}
__attribute__((target("avx2"))) static uint32_t dsgd__exp_max_avx2(const float *x, size_t n) {
    const __m256i ex = _mm256_set1_epi32(0x7F800000);
    __m256i m = _mm256_setzero_si256();
    uint32_t lanes[8], mx;
    size_t i = 0;
    int k;
    for (; i + 8 <= n; i += 8) {
        __m256i u = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(x + i)), ex);
        m = _mm256_max_epu32(m, _mm256_andnot_si256(_mm256_cmpeq_epi32(u, ex), u)); /* Inf, NaN: 0 */
    }
    _mm256_storeu_si256((__m256i *)(void *)lanes, m);
    mx = dsgd__exp_max_portable(x + i, n - i) << 23;
    for (k = 0; k < 8; ++k) mx = lanes[k] > mx ? lanes[k] : mx;
    return mx >> 23;
}
__attribute__((target("avx2"))) static void dsgd__from_bf16_avx2(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(src + i)));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    dsgd__from_bf16_portable(src + i, dst + i, n - i);
}

/* every lane (the maskz forms: g++ -O2 warns about the plain ones'
   undefined pass-through operand) */
#define DSGD__ALL16 ((__mmask16)0xFFFF)
__attribute__((target("avx512f"))) static void dsgd__to_f16_avx512(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                            _mm512_maskz_cvtps_ph(DSGD__ALL16, _mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    dsgd__to_f16_portable(src + i, dst + i, n - i);
}
__attribute__((target("avx512f"))) static void dsgd__from_f16_avx512(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_maskz_cvtph_ps(DSGD__ALL16, _mm256_loadu_si256((const __m256i *)(const void *)(src + i))));
    dsgd__from_f16_portable(src + i, dst + i, n - i);
}
/* 16 lanes of dsgd__bf16_of, as 32-bit integers */
__attribute__((target("avx512f"))) static __m512i dsgd__bf16_avx512_16(__m512i x) {
    __m512i a = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
    __mmask16 nan = _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7F800000));
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)),
                                 _mm512_and_si512(_mm512_maskz_srli_epi32(DSGD__ALL16, x, 16), _mm512_set1_epi32(1)));
    return _mm512_mask_or_epi32(_mm512_maskz_srli_epi32(DSGD__ALL16, r, 16), nan, _mm512_maskz_srli_epi32(DSGD__ALL16, x, 16), _mm512_set1_epi32(0x40));
}
__attribute__((target("avx512f"))) static void dsgd__to_bf16_avx512(const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                            _mm512_maskz_cvtepi32_epi16(DSGD__ALL16, dsgd__bf16_avx512_16(_mm512_loadu_si512((const void *)(src + i)))));
    dsgd__to_bf16_portable(src + i, dst + i, n - i);
}
__attribute__((target("avx512f"))) static uint32_t dsgd__exp_max_avx512(const float *x, size_t n) {
    const __m512i ex = _mm512_set1_epi32(0x7F800000);
    __m512i m = _mm512_setzero_si512();
    size_t i = 0;
    uint32_t lanes[16], mx;
    int k;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_and_si512(_mm512_loadu_si512((const void *)(x + i)), ex);
        m = _mm512_mask_max_epu32(m, _mm512_cmpneq_epu32_mask(u, ex), m, u); /* Inf, NaN: left out */
    }
    _mm512_storeu_si512((void *)lanes, m);
    mx = dsgd__exp_max_portable(x + i, n - i) << 23;
    for (k = 0; k < 16; ++k) mx = lanes[k] > mx ? lanes[k] : mx;
    return mx >> 23;
}
__attribute__((target("avx512f"))) static void dsgd__from_bf16_avx512(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i w = _mm512_maskz_cvtepu16_epi32(DSGD__ALL16, _mm256_loadu_si256((const __m256i *)(const void *)(src + i)));
        _mm512_storeu_si512((void *)(dst + i), _mm512_maskz_slli_epi32(DSGD__ALL16, w, 16));
    }
    dsgd__from_bf16_portable(src + i, dst + i, n - i);
}
#if DSGD__HALF_BF16_ISA
__attribute__((target("avx512f,avx512bf16"))) static void dsgd__to_bf16_avx512_bf16(const float *src, uint16_t *dst,
                                                                                    size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(src + i);
        __m256bh h = _mm512_cvtneps_pbh(v);
        __m512i x = _mm512_castps_si512(v), a = _mm512_and_si512(x, _mm512_set1_epi32(0x7FFFFFFF));
        /* subnormal lanes: exponent 0, fraction not 0 */
        __mmask16 sub = _mm512_mask_cmplt_epu32_mask(_mm512_test_epi32_mask(a, a), a, _mm512_set1_epi32(0x800000));
        __m256i out;
        memcpy(&out, &h, sizeof(out));
        _mm256_storeu_si256((__m256i *)(void *)(dst + i), out);
        if (sub) {
            int k;
            for (k = 0; k < 16; ++k)
                if (sub >> k & 1) {
                    uint32_t xb;
                    memcpy(&xb, src + i + (size_t)k, 4);
                    dst[i + (size_t)k] = dsgd__bf16_of(xb);
                }
        }
    }
    dsgd__to_bf16_portable(src + i, dst + i, n - i);
}
#endif /* DSGD__HALF_BF16_ISA */
#endif /* DSGD__X86_DISPATCH */

/* >>half kernels ----------------------------------------------------------- */
/* The kernels, widest first; tier: the CPU backend's kernel they belong to
   (DSGD_CPU_ISA above it rules them out). */
typedef struct dsgd__half_kernel {
    const char *name, *tier;
    int (*supported)(void);
    void (*to_f16)(const float *src, uint16_t *dst, size_t n);
    void (*from_f16)(const uint16_t *src, float *dst, size_t n);
    void (*to_bf16)(const float *src, uint16_t *dst, size_t n);
    void (*from_bf16)(const uint16_t *src, float *dst, size_t n);
    uint32_t (*exp_max)(const float *x, size_t n);
} dsgd__half_kernel;

static const dsgd__half_kernel dsgd__half_kernels[] = {
#if DSGD__X86_DISPATCH
#if DSGD__HALF_BF16_ISA
    {"avx512_bf16", "avx512", dsgd__isa_avx512_bf16, dsgd__to_f16_avx512, dsgd__from_f16_avx512,
     dsgd__to_bf16_avx512_bf16, dsgd__from_bf16_avx512, dsgd__exp_max_avx512},
#endif
    {"avx512", "avx512", dsgd__isa_avx512, dsgd__to_f16_avx512, dsgd__from_f16_avx512, dsgd__to_bf16_avx512,
     dsgd__from_bf16_avx512, dsgd__exp_max_avx512},
    {"avx2", "avx2", dsgd__isa_f16c, dsgd__to_f16_avx2, dsgd__from_f16_avx2, dsgd__to_bf16_avx2,
     dsgd__from_bf16_avx2, dsgd__exp_max_avx2},
#endif
    {"portable", "portable", dsgd__isa_always, dsgd__to_f16_portable, dsgd__from_f16_portable,
     dsgd__to_bf16_portable, dsgd__from_bf16_portable, dsgd__exp_max_portable},
};

/* The kernel named `want` when the CPU runs it; else the widest one the CPU
   runs at or below the CPU backend's choice for `want`. */
static const dsgd__half_kernel *dsgd__half_choose(const char *want) {
    const size_t nk = sizeof(dsgd__half_kernels) / sizeof(dsgd__half_kernels[0]);
    const char *tier;
    size_t i;
    int on = 0;
    for (i = 0; want && i < nk; ++i)
        if (!strcmp(want, dsgd__half_kernels[i].name) && dsgd__half_kernels[i].supported())
            return &dsgd__half_kernels[i];
    tier = dsgd__cpu_kernel_choose(want)->name;
    for (i = 0; i < nk; ++i) {
        if (!strcmp(tier, dsgd__half_kernels[i].tier)) on = 1;
        if (on && dsgd__half_kernels[i].supported()) return &dsgd__half_kernels[i];
    }
    return &dsgd__half_kernels[nk - 1];
}

static const dsgd__half_kernel *dsgd__half_now(void) { return dsgd__half_choose(getenv("DSGD_CPU_ISA")); }

DSGD_API void dsgd_f32_to_f16(const float *src, uint16_t *dst, size_t n) {
    if (n) dsgd__half_now()->to_f16(src, dst, n);
}
DSGD_API void dsgd_f16_to_f32(const uint16_t *src, float *dst, size_t n) {
    if (n) dsgd__half_now()->from_f16(src, dst, n);
}
DSGD_API void dsgd_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
    if (n) dsgd__half_now()->to_bf16(src, dst, n);
}
DSGD_API void dsgd_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
    if (n) dsgd__half_now()->from_bf16(src, dst, n);
}
DSGD_API const char *dsgd_half_isa(void) { return dsgd__half_now()->name; }

#endif /* DSGD__PART_HALF_IMPL */
