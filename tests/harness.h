/* tests/harness.h - the prelude and helpers of every distsgd cmocka test.

   A test file starts with

       #include "harness.h"          (first: it sets _POSIX_C_SOURCE)
       #include "../distsgd_cl.h"    (only the OpenCL tests)

   and is compiled WITHOUT the implementation macros: make links it against
   the library compiled once per build variant (plain, ASan+UBSan, TSan), as
   a user's second translation unit is. A test that needs the implementation's
   private parts defines DISTSGD_IMPLEMENTATION before this include and says
   "distsgd-test: own-implementation" in its first comment (make then links
   no library object into it).

   Markers the Makefile reads from a test's first comment:
       distsgd-test: tsan                 also built and run under TSan
       distsgd-test: own-implementation   compiles the library itself
   A test that includes distsgd_cl.h is built with OpenCL and CLBlast and
   linked against the OpenCL add-on's object too.

   Helpers are static functions (TU_FN) and macros prefixed TU_ / tu_. */
#ifndef DSGD_TEST_HARNESS_H
#define DSGD_TEST_HARNESS_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp, nanosleep, clock_gettime under -std=c99 */
#endif

#include <dirent.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "../distsgd.h"

#if defined(__GNUC__) || defined(__clang__)
#define TU_FN static __attribute__((unused))
#else
#define TU_FN static
#endif

/* TU_TSAN: 1 when built with ThreadSanitizer (about 10x slower: tests use it
   to shrink their largest cases). */
#if defined(__SANITIZE_THREAD__)
#define TU_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TU_TSAN 1
#endif
#endif
#ifndef TU_TSAN
#define TU_TSAN 0
#endif

/* TU_ASAN: 1 when built with AddressSanitizer (about 2x slower: statistical
   tests take smaller samples there; the plain build checks the statistics
   at full size). */
#if defined(__SANITIZE_ADDRESS__)
#define TU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TU_ASAN 1
#endif
#endif
#ifndef TU_ASAN
#define TU_ASAN 0
#endif

/* tu_full(): 1 when DSGD_TEST_FULL=1 is in the environment (make test-full
   sets it), else 0 (make test). make test runs each distinct case once: a
   sweep's corners and the points where its behaviour changes, a statistic
   at a sample that still fails on a wrong mean. make test-full adds the
   repetitions: every point of a sweep, more seeds, the full samples.
   TU_PICK(full, quick) is the count for this tier. */
TU_FN int tu_full(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("DSGD_TEST_FULL");
        v = e && e[0] == '1' && e[1] == '\0';
    }
    return v;
}
#define TU_PICK(full, quick) (tu_full() ? (full) : (quick))

/* ---------------------------------------------------------------- watchdog */

/* A hung test must fail the run, not block it: tu_watchdog(s) arms SIGALRM
   for s seconds (4 s under TSan), 0 disarms; when it fires, the program
   writes what hung (tu_watchdog_for's `what`, else the binary) and exits
   98. Worker threads never call cmocka's asserts (they longjmp), so a stuck
   rank shows up here. */
static char tu_watchdog_what_[160];

TU_FN void tu_watchdog_fire_(int sig) {
    static const char head[] = "\nwatchdog: a test hung: ";
    (void)sig;
    if (write(2, head, sizeof head - 1) < 0) _exit(98);
    if (write(2, tu_watchdog_what_, strlen(tu_watchdog_what_)) < 0) _exit(98);
    if (write(2, "\n", 1) < 0) _exit(98);
    _exit(98);
}

TU_FN void tu_watchdog_for(const char *what, unsigned seconds) {
    snprintf(tu_watchdog_what_, sizeof tu_watchdog_what_, "%s", what ? what : "(unnamed)");
    if (seconds) signal(SIGALRM, tu_watchdog_fire_);
    alarm(TU_TSAN ? seconds * 4 : seconds);
}

TU_FN void tu_watchdog(unsigned seconds) { tu_watchdog_for(NULL, seconds); }

/* ---------------------------------------------------------------- asserts */

/* Fails the test with both values printed when |got - want| > tol. */
#define TU_NEAR(got, want, tol)                                                    \
    do {                                                                           \
        double tu_g_ = (double)(got), tu_w_ = (double)(want), tu_t_ = (double)(tol); \
        if (!(fabs(tu_g_ - tu_w_) <= tu_t_))                                       \
            fail_msg("%s = %.10g, want %.10g (|diff| %.3g > tol %.3g)", #got, tu_g_, \
                     tu_w_, fabs(tu_g_ - tu_w_), tu_t_);                           \
    } while (0)

/* Fails with the result name and the context's message unless expr is DSGD_OK. */
#define TU_OK(ctx, expr)                                                           \
    do {                                                                           \
        dsgd_result tu_r_ = (expr);                                                \
        if (tu_r_ != DSGD_OK)                                                      \
            fail_msg("%s -> %s (%d): %s", #expr, dsgd_result_string(tu_r_),        \
                     (int)tu_r_, (ctx) ? dsgd_ctx_last_error(ctx) : "(no ctx)");   \
    } while (0)

/* Fails unless expr returns `want` and, when ctx is non-NULL, the context's
   last error message is non-empty. */
#define TU_ERR(ctx, want, expr)                                                    \
    do {                                                                           \
        dsgd_result tu_r_ = (expr);                                                \
        if (tu_r_ != (want))                                                       \
            fail_msg("%s -> %s (%d), want %s", #expr, dsgd_result_string(tu_r_),   \
                     (int)tu_r_, dsgd_result_string(want));                        \
        if ((ctx) && dsgd_ctx_last_error(ctx)[0] == '\0')                          \
            fail_msg("%s: failed with an empty last-error message", #expr);        \
    } while (0)

/* ---------------------------------------------------------------- random */

/* xorshift64* with a SplitMix-style seed scramble: the tests' own generator,
   independent of the library's, so test data does not move when it changes. */
typedef struct tu_rng {
    uint64_t s;
} tu_rng;

TU_FN tu_rng tu_rng_make(uint64_t seed) {
    tu_rng r;
    uint64_t z = seed + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    r.s = z ? z : 1;
    return r;
}

TU_FN uint64_t tu_next(tu_rng *r) {
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1Dull;
}

/* Uniform double in [0, 1). */
TU_FN double tu_unit(tu_rng *r) { return (double)(tu_next(r) >> 11) * (1.0 / 9007199254740992.0); }

TU_FN float tu_uniform(tu_rng *r, float lo, float hi) {
    return (float)(lo + (hi - lo) * tu_unit(r));
}

/* Uniform integer in [0, n). */
TU_FN size_t tu_below(tu_rng *r, size_t n) { return n ? (size_t)(tu_next(r) % n) : 0; }

TU_FN void tu_fill(tu_rng *r, float *x, size_t n, float lo, float hi) {
    size_t i;
    for (i = 0; i < n; ++i) x[i] = tu_uniform(r, lo, hi);
}

/* ---------------------------------------------------------------- memory */

TU_FN void *tu_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fail_msg("out of memory (%zu bytes)", bytes);
    return p;
}

TU_FN float *tu_floats(size_t n) { return (float *)tu_alloc(n * sizeof(float)); }

/* ---------------------------------------------------------------- context */

TU_FN dsgd_ctx *tu_ctx(void) {
    dsgd_ctx *ctx = NULL;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    assert_non_null(ctx);
    return ctx;
}

/* ---------------------------------------------------------------- comparisons */

/* One global relative error: max_i |got_i - want_i| / max_i |want_i| (the
   absolute maximum when want is all zeros); INFINITY when a difference is NaN. */
TU_FN double tu_rel_err(const float *got, const float *want, size_t n) {
    double md = 0.0, mw = 0.0;
    size_t i;
    for (i = 0; i < n; ++i) {
        double d = fabs((double)got[i] - (double)want[i]);
        if (d != d) return INFINITY;
        if (d > md) md = d;
        if (fabs((double)want[i]) > mw) mw = fabs((double)want[i]);
    }
    return mw > 0.0 ? md / mw : md;
}

/* Fails unless every replica of s holds replica 0's parameters, bit for bit. */
TU_FN void tu_assert_replicas_identical(dsgd_ctx *ctx, dsgd_strategy *s) {
    size_t p = dsgd_model_num_params(dsgd_strategy_model(s, 0));
    float *p0 = tu_floats(p), *pr = tu_floats(p);
    int r;
    TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, 0), p0, p));
    for (r = 1; r < dsgd_strategy_num_replicas(s); ++r) {
        TU_OK(ctx, dsgd_model_get_params(dsgd_strategy_model(s, r), pr, p));
        if (memcmp(p0, pr, p * sizeof(float)) != 0) fail_msg("replica %d's parameters differ from replica 0's", r);
    }
    free(p0);
    free(pr);
}

/* ---------------------------------------------------------------- files */

/* Creates a fresh directory under /tmp; path must hold 64 chars. */
TU_FN void tu_mkdtemp(char *path) {
    strcpy(path, "/tmp/dsgd_test_XXXXXX");
    if (!mkdtemp(path)) fail_msg("mkdtemp failed");
}

/* Removes the files in dir (not subdirectories), then dir itself. */
TU_FN void tu_rmdir_files(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[512];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.') {
            snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
            unlink(path);
        }
    if (d) closedir(d);
    rmdir(dir);
}

/* Writes len bytes to dir/name and returns the full path in out (cap bytes). */
TU_FN void tu_write_file(const char *dir, const char *name, const void *data, size_t len,
                         char *out, size_t cap) {
    FILE *f;
    int w = snprintf(out, cap, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= cap) fail_msg("path too long");
    f = fopen(out, "wb");
    if (!f) fail_msg("cannot create %s", out);
    if (len && fwrite(data, 1, len, f) != len) fail_msg("cannot write %s", out);
    if (fclose(f) != 0) fail_msg("cannot close %s", out);
}

/* Reads the whole file at path into a malloc'd buffer (free it); its size
   in *len. Fails the test when it cannot. */
TU_FN unsigned char *tu_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    unsigned char *buf;
    long n = -1;
    if (!f) fail_msg("cannot open %s", path);
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) fail_msg("cannot size %s", path);
    buf = (unsigned char *)tu_alloc((size_t)n + 1);
    if (n && fread(buf, 1, (size_t)n, f) != (size_t)n) fail_msg("cannot read %s", path);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Removes every plain file in dir, then dir itself (the tests create no
   subdirectories). */
TU_FN void tu_rmdir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[512];
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* The final path component. */
TU_FN const char *tu_basename(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* Finds a file that tests read from the repository (they normally run from
   its root via make; also tried: one and two levels below it). Returns 1 and
   the path in out, or 0. */
TU_FN int tu_find_repo_file(const char *rel, char *out, size_t cap) {
    static const char *prefixes[] = {"", "../", "../../"};
    size_t i;
    for (i = 0; i < sizeof prefixes / sizeof prefixes[0]; ++i) {
        FILE *f;
        snprintf(out, cap, "%s%s", prefixes[i], rel);
        f = fopen(out, "rb");
        if (f) {
            fclose(f);
            return 1;
        }
    }
    return 0;
}

#endif /* DSGD_TEST_HARNESS_H */
