/* test_half.c - fp16 and bf16 conversions (distsgd/half.h, HALF FORMATS).

   - fp16 to fp32: all 65536 values, every kernel this CPU runs bit for bit
     against the portable one, and the portable one against the format's
     definition (sign * 2^(e-15) * (1 + m/1024), subnormals m * 2^-24, Inf,
     NaN);
   - fp32 to fp16 and to bf16: every kernel against the portable one, and
     the portable one against round-to-nearest-even checked from the
     decoded neighbours (the result is nearest; a tie goes to the even
     one; overflow to Inf only at or past the midpoint above the largest
     finite value; NaN stays NaN), over: every fp16 / bf16 value, the
     midpoints between neighbours (ties) and one fp32 ulp either side,
     the subnormal and overflow boundaries, signed zeros, fp32 subnormals,
     Inf, NaNs with assorted payloads (quiet and signalling), and 2^22
     random bit patterns;
   - round trips: half -> fp32 -> half is the identity for every non-NaN;
   - the largest finite exponent field (what a half wire's scale comes
     from), every kernel against a loop written here, over windows of the
     fp16 sample (Inf and NaN skipped);
   - lengths 0..70 at offsets 0..3 (the vector loops' tails);
   - dsgd_half_isa follows DSGD_CPU_ISA (exact name, or the widest at or
     below the CPU backend's choice).
   The kernels that ran are printed.

   Build: make test (this file compiles the implementation itself: it reads
   the private kernel table).
   distsgd-test: own-implementation */
/* the CPU kernels only: the parts a strategy adds are left out, which
   takes about a third off this file's compile */
#define DSGD_NO_SIMNET
#define DSGD_NO_PS
#define DSGD_NO_COMPRESS
#define DSGD_NO_ELASTIC
#define DSGD_NO_LOCAL
#define DSGD_NO_TF_CONFIG
#define DISTSGD_IMPLEMENTATION /* the kernels' table */
#include "harness.h"

#define NHK ((int)(sizeof(dsgd__half_kernels) / sizeof(dsgd__half_kernels[0])))
static const dsgd__half_kernel *portable_k(void) { return &dsgd__half_kernels[NHK - 1]; }

static uint32_t f2u(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value of fp16 h by the format's definition. */
static double f16_value(uint16_t h) {
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
    v = e ? ldexp(1.0 + m / 1024.0, e - 15) : ldexp((double)m, -24);
    return s ? -v : v;
}
static double bf16_value(uint16_t b) { return (double)u2f((uint32_t)b << 16); }

/* ---------------------------------------------------------------- fp16 -> fp32 */

static void test_f16_to_f32_all(void **state) {
    uint16_t *h = (uint16_t *)malloc(65536 * sizeof(uint16_t));
    float *want = (float *)malloc(65536 * sizeof(float)), *got = (float *)malloc(65536 * sizeof(float));
    int k;
    uint32_t i;
    (void)state;
    assert_non_null(h);
    assert_non_null(want);
    assert_non_null(got);
    for (i = 0; i < 65536; ++i) h[i] = (uint16_t)i;
    portable_k()->from_f16(h, want, 65536);
    for (i = 0; i < 65536; ++i) {
        double v = f16_value((uint16_t)i);
        if (isnan(v)) {
            assert_true(isnan(want[i]));
            assert_int_equal(f2u(want[i]) >> 31, i >> 15);
        } else if ((double)want[i] != v || !signbit(want[i]) != !signbit(v)) {
            fail_msg("fp16 0x%04x: portable gives %.9g, the format says %.9g", (unsigned)i, (double)want[i], v);
        }
    }
    portable_k()->from_bf16(h, want, 65536);
    for (i = 0; i < 65536; ++i) assert_int_equal(f2u(want[i]), i << 16);
    portable_k()->from_f16(h, want, 65536);
    for (k = 0; k < NHK; ++k) {
        const dsgd__half_kernel *K = &dsgd__half_kernels[k];
        if (!K->supported()) continue;
        K->from_f16(h, got, 65536);
        for (i = 0; i < 65536; ++i)
            if (f2u(got[i]) != f2u(want[i]))
                fail_msg("%s: fp16 0x%04x -> 0x%08x, portable 0x%08x", K->name, (unsigned)i, (unsigned)f2u(got[i]),
                         (unsigned)f2u(want[i]));
        print_message("fp16 -> fp32: %s matches portable on all 65536\n", K->name);
    }
    free(h);
    free(want);
    free(got);
}

/* ---------------------------------------------------------------- fp32 -> half */

typedef struct sample {
    float *x;
    size_t n, cap;
} sample;

static void push(sample *s, uint32_t u) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 1 << 16;
        s->x = (float *)realloc(s->x, s->cap * sizeof(float));
        assert_non_null(s->x);
    }
    s->x[s->n++] = u2f(u);
}

/* Every half value of the format (bf16: is_bf 1), the midpoints between
   neighbours and one fp32 ulp either side, both signs; the edges; NaNs;
   random patterns. */
static void build_sample(sample *s, int is_bf) {
    uint32_t i, sg;
    uint64_t rng = 12345;
    static const uint32_t edges[] = {
        0x00000000u, 0x00000001u, 0x00000002u, 0x007FFFFFu, 0x00800000u, 0x00800001u, /* fp32 zero, subnormals */
        0x33000000u, 0x32FFFFFFu, 0x33000001u, 0x33800000u, 0x33C00000u, 0x33A00000u, /* 2^-25, 2^-24, 1.5 * 2^-24 */
        0x387FC000u, 0x387FE000u, 0x387FFFFFu, 0x38800000u, /* the fp16 subnormal / normal boundary */
        0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x477FF001u, 0x47800000u, /* 65504, the midpoint 65520, 65536 */
        0x7F7FFFFFu, 0x7F7F8000u, 0x7F7F7FFFu, 0x7F800000u, /* FLT_MAX, bf16's overflow midpoint, Inf */
        0x7F800001u, 0x7FA00000u, 0x7FBFFFFFu, 0x7FC00000u, 0x7FC00001u, 0x7FFFFFFFu, 0x7F802000u, 0x7F801FFFu,
        0x7F810000u, 0x7F80FFFFu, 0x3F800000u, 0x3F808000u, 0x3F818000u, 0x3F801000u, 0x3F803000u};
    for (sg = 0; sg < 2; ++sg) {
        uint32_t S = sg << 31;
        for (i = 0; i < sizeof(edges) / sizeof(edges[0]); ++i) push(s, S | edges[i]);
        for (i = 0; i < (is_bf ? 0x7F80u : 0x7C00u); ++i) {
            uint32_t a, mid;
            if (is_bf) {
                a = i << 16;
                mid = a + 0x8000u; /* halfway to the next (past the last: the overflow midpoint) */
            } else {
                float lo = (float)f16_value((uint16_t)i);
                float hi = i + 1 < 0x7C00u ? (float)f16_value((uint16_t)(i + 1)) : 65536.0f;
                a = f2u(lo);
                mid = f2u((lo + hi) * 0.5f); /* exact: both have few bits */
            }
            push(s, S | a);
            push(s, S | mid);
            push(s, S | (mid - 1));
            push(s, S | (mid + 1));
        }
    }
    for (i = 0; i < (1u << 22); ++i) {
        uint64_t r = dsgd_rng_next(&rng);
        push(s, (uint32_t)r);
    }
}

/* The portable result r for x is round-to-nearest-even in the format
   (value(h), magnitudes counted 0..max finite, then Inf). */
static void check_rne(float x, uint16_t r, int is_bf) {
    double (*val)(uint16_t) = is_bf ? bf16_value : f16_value;
    const uint16_t inf = is_bf ? 0x7F80u : 0x7C00u;
    uint16_t mag = r & 0x7FFFu, sgn = r & 0x8000u;
    double xv = (double)x, v, d;
    if (isnan(x)) {
        if (!isnan(val(r))) fail_msg("%s: NaN 0x%08x gave 0x%04x", is_bf ? "bf16" : "fp16", (unsigned)f2u(x), r);
        if ((unsigned)(r >> 15) != f2u(x) >> 31) fail_msg("NaN 0x%08x lost its sign", (unsigned)f2u(x));
        return;
    }
    if ((sgn != 0) != (signbit(x) != 0)) fail_msg("0x%08x gave 0x%04x: the sign", (unsigned)f2u(x), r);
    if (mag == inf) {
        /* Inf only from Inf or at or past the midpoint above the largest finite value */
        double top = val((uint16_t)(inf - 1)), ulp = top - val((uint16_t)(inf - 2));
        if (!(isinf(x) || fabs(xv) >= top + ulp / 2))
            fail_msg("%s: 0x%08x (%.9g) overflowed to Inf", is_bf ? "bf16" : "fp16", (unsigned)f2u(x), xv);
        return;
    }
    assert_true(mag < inf);
    v = val(r);
    d = fabs(xv - v);
    if (mag + 1 == inf) { /* the largest finite value: below the overflow midpoint */
        double top = fabs(v), ulp = top - fabs(val((uint16_t)(sgn | (mag - 1))));
        if (!(fabs(xv) < top + ulp / 2))
            fail_msg("%s: 0x%08x (%.12g) should overflow to Inf", is_bf ? "bf16" : "fp16", (unsigned)f2u(x), xv);
    } else {
        double du = fabs(xv - val((uint16_t)(sgn | (mag + 1))));
        if (du < d || (du == d && (mag & 1)))
            fail_msg("%s: 0x%08x (%.12g) gave 0x%04x (%.12g); the next one up is nearer or even",
                     is_bf ? "bf16" : "fp16", (unsigned)f2u(x), xv, r, v);
    }
    if (mag > 0) {
        double dd = fabs(xv - val((uint16_t)(sgn | (mag - 1))));
        if (dd < d || (dd == d && (mag & 1)))
            fail_msg("%s: 0x%08x (%.12g) gave 0x%04x (%.12g); the next one down is nearer or even",
                     is_bf ? "bf16" : "fp16", (unsigned)f2u(x), xv, r, v);
    }
}

static void to_half_case(int is_bf) {
    sample s;
    uint16_t *want, *got;
    size_t i;
    int k;
    memset(&s, 0, sizeof(s));
    build_sample(&s, is_bf);
    want = (uint16_t *)malloc(s.n * sizeof(uint16_t));
    got = (uint16_t *)malloc(s.n * sizeof(uint16_t));
    assert_non_null(want);
    assert_non_null(got);
    (is_bf ? portable_k()->to_bf16 : portable_k()->to_f16)(s.x, want, s.n);
    for (i = 0; i < s.n; ++i) check_rne(s.x[i], want[i], is_bf);
    for (k = 0; k < NHK; ++k) {
        const dsgd__half_kernel *K = &dsgd__half_kernels[k];
        if (!K->supported()) continue;
        memset(got, 0xAB, s.n * sizeof(uint16_t));
        (is_bf ? K->to_bf16 : K->to_f16)(s.x, got, s.n);
        for (i = 0; i < s.n; ++i)
            if (got[i] != want[i])
                fail_msg("%s: %s of 0x%08x = 0x%04x, portable 0x%04x", K->name, is_bf ? "bf16" : "fp16",
                         (unsigned)f2u(s.x[i]), got[i], want[i]);
        print_message("fp32 -> %s: %s matches portable on %zu values\n", is_bf ? "bf16" : "fp16", K->name, s.n);
        if (!is_bf) { /* the largest finite exponent (a wire's scale), over windows of the sample */
            size_t o;
            for (o = 0; o + 4096 <= s.n; o += 4093) {
                size_t len = 1 + (o * 7919) % 4095;
                uint32_t w = portable_k()->exp_max(s.x + o, len), g = K->exp_max(s.x + o, len), m = 0;
                for (i = 0; i < len; ++i) {
                    uint32_t e = f2u(s.x[o + i]) >> 23 & 0xFFu;
                    if (e != 0xFFu && e > m) m = e;
                }
                if (w != m || g != m)
                    fail_msg("%s: exp_max at %zu (+%zu) = %u, portable %u, want %u", K->name, o, len, g, w, m);
            }
        }
    }
    free(want);
    free(got);
    free(s.x);
}

static void test_f32_to_f16(void **state) {
    (void)state;
    to_half_case(0);
}
static void test_f32_to_bf16(void **state) {
    (void)state;
    to_half_case(1);
}

/* half -> fp32 -> half is the identity except on NaNs (made quiet). */
static void test_round_trips(void **state) {
    uint16_t h[65536], back[65536];
    float f[65536];
    int k, is_bf;
    uint32_t i;
    (void)state;
    for (i = 0; i < 65536; ++i) h[i] = (uint16_t)i;
    for (k = 0; k < NHK; ++k) {
        const dsgd__half_kernel *K = &dsgd__half_kernels[k];
        if (!K->supported()) continue;
        for (is_bf = 0; is_bf < 2; ++is_bf) {
            (is_bf ? K->from_bf16 : K->from_f16)(h, f, 65536);
            (is_bf ? K->to_bf16 : K->to_f16)(f, back, 65536);
            for (i = 0; i < 65536; ++i) {
                int nan = is_bf ? (i & 0x7F80u) == 0x7F80u && (i & 0x7Fu) : (i & 0x7C00u) == 0x7C00u && (i & 0x3FFu);
                if (nan) {
                    uint16_t q = (uint16_t)(i | (is_bf ? 0x40u : 0x200u));
                    if (back[i] != q) fail_msg("%s %s: NaN 0x%04x came back as 0x%04x, not 0x%04x", K->name,
                                               is_bf ? "bf16" : "fp16", (unsigned)i, back[i], q);
                } else if (back[i] != i) {
                    fail_msg("%s %s: 0x%04x came back as 0x%04x", K->name, is_bf ? "bf16" : "fp16", (unsigned)i,
                             back[i]);
                }
            }
        }
    }
}

/* The vector loops' tails and unaligned pointers. */
static void test_lengths(void **state) {
    float x[80], f1[80], f2[80];
    uint16_t a[80], b[80];
    uint64_t rng = 99;
    int k, off, n, i;
    (void)state;
    for (i = 0; i < 80; ++i) x[i] = (float)(dsgd_rng_uniform(&rng) * 200.0 - 100.0) * (i % 5 == 0 ? 1e-6f : 1.0f);
    for (k = 0; k < NHK; ++k) {
        const dsgd__half_kernel *K = &dsgd__half_kernels[k];
        if (!K->supported()) continue;
        for (off = 0; off < 4; ++off)
            for (n = 0; n <= 70; ++n) {
                int bf;
                for (bf = 0; bf < 2; ++bf) {
                    memset(a, 0x5A, sizeof(a));
                    memset(b, 0x5A, sizeof(b));
                    (bf ? portable_k()->to_bf16 : portable_k()->to_f16)(x + off, a + off, (size_t)n);
                    (bf ? K->to_bf16 : K->to_f16)(x + off, b + off, (size_t)n);
                    assert_memory_equal(a, b, sizeof(a)); /* nothing outside [off, off + n) written */
                    memset(f1, 0x5A, sizeof(f1));
                    memset(f2, 0x5A, sizeof(f2));
                    (bf ? portable_k()->from_bf16 : portable_k()->from_f16)(a + off, f1 + off, (size_t)n);
                    (bf ? K->from_bf16 : K->from_f16)(a + off, f2 + off, (size_t)n);
                    assert_memory_equal(f1, f2, sizeof(f1));
                }
            }
    }
}

/* dsgd_half_isa and the public functions follow DSGD_CPU_ISA. */
static void test_isa_choice(void **state) {
    const char *widest = NULL;
    float x[33], y[33];
    uint16_t h[33];
    int k, i;
    (void)state;
    for (k = 0; k < NHK && !widest; ++k)
        if (dsgd__half_kernels[k].supported()) widest = dsgd__half_kernels[k].name;
    assert_int_equal(unsetenv("DSGD_CPU_ISA"), 0);
    assert_string_equal(dsgd_half_isa(), widest);
    print_message("default: %s (the CPU backend's: %s)\n", dsgd_half_isa(), dsgd_cpu_isa());
    assert_int_equal(setenv("DSGD_CPU_ISA", "no-such-isa", 1), 0);
    assert_string_equal(dsgd_half_isa(), widest);
    for (k = 0; k < NHK; ++k) {
        const dsgd__half_kernel *K = &dsgd__half_kernels[k];
        assert_int_equal(setenv("DSGD_CPU_ISA", K->name, 1), 0);
        if (K->supported()) assert_string_equal(dsgd_half_isa(), K->name);
        for (i = 0; i < 33; ++i) x[i] = (float)i * 0.3f - 4.0f;
        dsgd_f32_to_f16(x, h, 33);
        dsgd_f16_to_f32(h, y, 33);
        for (i = 0; i < 33; ++i) assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-11f);
        dsgd_f32_to_bf16(x, h, 33);
        dsgd_bf16_to_f32(h, y, 33);
        for (i = 0; i < 33; ++i) assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) * 0x1p-8f);
    }
    /* the CPU backend's "avx2" rules out the AVX-512 kernels */
    assert_int_equal(setenv("DSGD_CPU_ISA", "avx2", 1), 0);
    assert_null(strstr(dsgd_half_isa(), "avx512"));
    assert_int_equal(setenv("DSGD_CPU_ISA", "portable", 1), 0);
    assert_string_equal(dsgd_half_isa(), "portable");
    dsgd_f32_to_f16(NULL, NULL, 0);
    dsgd_bf16_to_f32(NULL, NULL, 0);
    assert_int_equal(unsetenv("DSGD_CPU_ISA"), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_to_f32_all), cmocka_unit_test(test_f32_to_f16), cmocka_unit_test(test_f32_to_bf16),
        cmocka_unit_test(test_round_trips),    cmocka_unit_test(test_lengths),    cmocka_unit_test(test_isa_choice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
