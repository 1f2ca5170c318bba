/* distsgd/base.h - API decoration, results, context, RNG, clock
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   CONFIGURATION

     Objects are configured by *_desc structs in which a zero field means "the
     default" (documented beside each field), so `dsgd_x_desc d = {0};` (`{}`
     in C++) plus the fields that have no default (a model's input_dim and
     layers, a variable's name and count) is valid. A function's comment says when its
     desc pointer may be NULL (all defaults).

     Compile-time options, before every include of the header:
       DISTSGD_STATIC      make the API static (private to the translation
                           unit, which must then define DISTSGD_IMPLEMENTATION)
       DSGD_API            the decoration of every public function (default
                           extern; static with DISTSGD_STATIC)
     and before the include that has DISTSGD_IMPLEMENTATION:
       DSGD_USE_CBLAS      the CPU backend's GEMM calls cblas_sgemm (link e.g.
                           -lopenblas); otherwise a portable cache-blocked GEMM
       DSGD_ASSERT(c)      replaces assert() for internal invariants (never used
                           to check user input)
       DSGD_MALLOC(sz), DSGD_REALLOC(p,sz), DSGD_FREE(p)
                           replace the allocator: define all three or none
                           (#error otherwise); distsgd_cl.h uses them too
     The implementation needs POSIX.1-2008 (clock_gettime, pthreads). Unless a
     feature macro is already set it defines _POSIX_C_SOURCE 200809L, which
     works only when distsgd.h is the first header of that file; otherwise
     compile it with -D_POSIX_C_SOURCE=200809L.

   ERRORS

     Every fallible call returns a dsgd_result: DSGD_OK (0) or a negative code.
     dsgd_result_string() names a code. The dsgd_ctx passed to (or owned by) the
     object that failed keeps a message saying what failed, where and why, read
     with dsgd_ctx_last_error(); a logger callback set in dsgd_ctx_desc also
     receives it. A strategy copies the failing replica's message (which names
     the replica) to its own context. Calls with nowhere to record return the
     code alone: a NULL object argument (dsgd_allreduce(NULL, ...)),
     dsgd_ctx_create, dsgd_dataset_gather. The library never calls exit() or
     abort() on bad input, and never sizes an allocation from an unchecked
     file header.

     Above each function, "Errors:" lists the codes it returns and when.
     "Backend errors" are those of the model's backend, recorded on the
     backend's context (DSGD_ERR_BACKEND, DSGD_ERR_OUT_OF_MEMORY, or
     DSGD_ERR_INVALID_ARGUMENT for a range outside a buffer). Getters that
     cannot fail say what they return for a NULL object or an index out of
     range.

     What a caller can do about a failure of a group of ranks:
       DSGD_ERR_TIMEOUT  a peer did not come in time; the message names it.
                         The group is unusable: recreate it (or give up).
       DSGD_ERR_ABORTED  the group was aborted (a peer failed and stopped
                         everyone, or a peer gave up mid-way): recreate it.
       DSGD_ERR_DESYNC   the ranks disagree on the call (a bug in the
                         program); the communicator stays usable when the
                         agreement caught it, and every rank got the same
                         message.
       DSGD_ERR_SYSTEM   a thread, lock or other OS resource failed: give up.
       DSGD_ERR_STATE    the object was misused, e.g. called again after it
                         failed: recreate it.
*/
#ifndef DSGD__PART_BASE_DECL
#define DSGD__PART_BASE_DECL

/* The implementation needs POSIX.1-2008 (clock_gettime, pthreads). Under a
   strict -std=c99 the feature macro must precede the first system header, so
   it is set here; include distsgd.h before other headers in the file that
   defines DISTSGD_IMPLEMENTATION, or compile with -D_POSIX_C_SOURCE=200809L. */
#if (defined(DISTSGD_IMPLEMENTATION) || defined(DISTSGD_CL_IMPLEMENTATION) || defined(DISTSGD_MPI_IMPLEMENTATION)) && \
    !defined(_POSIX_C_SOURCE) && !defined(_GNU_SOURCE) && !defined(_WIN32)
#define _POSIX_C_SOURCE 200809L
#endif

#include <stddef.h>
#include <stdint.h>

#ifndef DSGD_API
#ifdef DISTSGD_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define DSGD_API static __attribute__((unused)) /* a program need not call every function */
#else
#define DSGD_API static
#endif
#else
#define DSGD_API extern
#endif
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- results */

/* X(name, value, description): one list makes the enum and its strings. */
#define DSGD__RESULT_LIST(X)                                                   \
    X(DSGD_OK, 0, "ok")                                                        \
    X(DSGD_ERR_INVALID_ARGUMENT, -1, "invalid argument")                       \
    X(DSGD_ERR_OUT_OF_MEMORY, -2, "out of memory")                             \
    X(DSGD_ERR_IO, -3, "input/output error")                                   \
    X(DSGD_ERR_FORMAT, -4, "malformed input file")                             \
    X(DSGD_ERR_SHAPE, -5, "shape mismatch")                                    \
    X(DSGD_ERR_NON_FINITE, -6, "non-finite value")                             \
    X(DSGD_ERR_TIMEOUT, -7, "deadline expired")                                \
    X(DSGD_ERR_BACKEND, -8, "backend failure")                                 \
    X(DSGD_ERR_UNSUPPORTED, -9, "unsupported operation")                       \
    X(DSGD_ERR_STATE, -10, "invalid state")                                   \
    X(DSGD_ERR_DESYNC, -11, "ranks disagree on a collective")                  \
    X(DSGD_ERR_ABORTED, -12, "the group was aborted")                          \
    X(DSGD_ERR_SYSTEM, -13, "system failure")

typedef enum dsgd_result {
#define DSGD__RESULT_ENUM(name, value, text) name = value,
    DSGD__RESULT_LIST(DSGD__RESULT_ENUM)
#undef DSGD__RESULT_ENUM
    DSGD__RESULT_LAST_ = -11
} dsgd_result;

/* The fixed description of a result code ("invalid argument"); "unknown
   result code" for any other value. Never NULL.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_result_string(dsgd_result r);

/* ---------------------------------------------------------------- context */

typedef enum dsgd_log_level {
    DSGD_LOG_ERROR = 0,
    DSGD_LOG_WARN = 1,
    DSGD_LOG_INFO = 2,
    DSGD_LOG_DEBUG = 3
} dsgd_log_level;

typedef struct dsgd_logger {
    /* Called with every error message the context records, and with warnings
       and information; NULL: no logging. May be called from the thread that
       uses the context. */
    void (*func)(void *user_data, dsgd_log_level level, const char *message);
    void *user_data;
} dsgd_logger;

typedef struct dsgd_ctx_desc {
    dsgd_logger logger;
    const char *label; /* prefixed to messages, e.g. "replica 2"; NULL: none */
} dsgd_ctx_desc;

typedef struct dsgd_ctx dsgd_ctx;

/* Creates a context. desc may be NULL (all defaults); the label is copied
   (up to 63 bytes).
   Errors: DSGD_ERR_INVALID_ARGUMENT (out NULL), DSGD_ERR_OUT_OF_MEMORY;
   nothing is recorded (there is no context yet).
   Thread safety: any thread; the context is then used by one thread at a time. */
DSGD_API dsgd_result dsgd_ctx_create(const dsgd_ctx_desc *desc, dsgd_ctx **out);
/* Frees ctx (NULL: nothing). Objects created with ctx keep a pointer to it:
   destroy them first.
   Thread safety: the context's thread. */
DSGD_API void dsgd_ctx_destroy(dsgd_ctx *ctx);
/* The message of the last error recorded on ctx ("" when none, or ctx NULL).
   The pointer points into ctx: its text changes with the next error recorded
   on ctx (or dsgd_ctx_clear_error), and it dies with ctx.
   Errors: none. Thread safety: the context's thread. */
DSGD_API const char *dsgd_ctx_last_error(const dsgd_ctx *ctx);
/* The result code of the last error recorded on ctx (DSGD_OK when none, or
   ctx NULL).
   Errors: none (it returns the recorded code). Thread safety: the context's
   thread. */
DSGD_API dsgd_result dsgd_ctx_last_result(const dsgd_ctx *ctx);
/* Forgets the last error: dsgd_ctx_last_result gives DSGD_OK and
   dsgd_ctx_last_error "" until the next one. ctx NULL: nothing.
   Thread safety: the context's thread. */
DSGD_API void dsgd_ctx_clear_error(dsgd_ctx *ctx);
/* dsgd_ctx_logger: the logger ctx was created with (func NULL when none, or
   ctx NULL), to give a context of your own, on another thread, the same
   logger (see THREAD SAFETY in distsgd.h: it is then called from both).
   dsgd_ctx_label: the label that prefixes ctx's messages, as copied ("" when
   none, or ctx NULL); the pointer dies with ctx.
   Errors: none. Thread safety: any thread, while ctx lives (creation fixes
   both). */
DSGD_API dsgd_logger dsgd_ctx_logger(const dsgd_ctx *ctx);
DSGD_API const char *dsgd_ctx_label(const dsgd_ctx *ctx);
/* Records an error on ctx (printf-style message, prefixed with the context's
   label and cut at 1023 bytes), passes it to the logger at DSGD_LOG_ERROR,
   and returns r. Backends and transports written outside this file use it
   too. ctx may be NULL: then only r is returned.
   Errors: none of its own: it returns r.
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_ctx_set_error(dsgd_ctx *ctx, dsgd_result r, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Sends a message (printf-style, prefixed with the label) to the context's
   logger at `level`; nothing when ctx is NULL or has no logger. Records
   nothing. Thread safety: the context's thread. */
DSGD_API void dsgd_ctx_log(dsgd_ctx *ctx, dsgd_log_level level, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---------------------------------------------------------------- utilities */

/* dsgd_rng_next: SplitMix64 (Steele et al. 2014), the library's only random
   number source: advances *state and returns the next 64 bits.
   dsgd_rng_uniform: a double uniform in [0, 1) (53 bits) from the same stream.
   dsgd_now: CLOCK_MONOTONIC in seconds.
   Errors: none. Thread safety: any thread (the state is the caller's). */
DSGD_API uint64_t dsgd_rng_next(uint64_t *state);
DSGD_API double dsgd_rng_uniform(uint64_t *state);
DSGD_API double dsgd_now(void);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_BASE_DECL */

/* Configuration and system headers of every implementation, the core's and
   the add-ons' (which may be compiled in another file than the core's). */
#if (defined(DISTSGD_IMPLEMENTATION) || defined(DISTSGD_CL_IMPLEMENTATION) || defined(DISTSGD_MPI_IMPLEMENTATION)) && \
    !defined(DSGD__PART_BASE_PRIVATE)
#define DSGD__PART_BASE_PRIVATE

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/stat.h>

#if defined(DSGD_MALLOC) && defined(DSGD_REALLOC) && defined(DSGD_FREE)
/* all three overridden */
#elif !defined(DSGD_MALLOC) && !defined(DSGD_REALLOC) && !defined(DSGD_FREE)
#define DSGD_MALLOC(sz) malloc(sz)
#define DSGD_REALLOC(p, sz) realloc(p, sz)
#define DSGD_FREE(p) free(p)
#else
#error "distsgd: define all of DSGD_MALLOC, DSGD_REALLOC and DSGD_FREE, or none"
#endif

#ifdef DSGD_USE_CBLAS
#include <cblas.h>
#endif

#ifndef DSGD_ASSERT
#include <assert.h>
#define DSGD_ASSERT(c) assert(c)
#endif

#ifdef __cplusplus
#define DSGD__RESTRICT __restrict
#define DSGD__ZERO_INIT {}
#else
#define DSGD__RESTRICT restrict
#define DSGD__ZERO_INIT {0}
#endif

#define DSGD__UNUSED(x) ((void)(x))
#define DSGD__MIN(a, b) ((a) < (b) ? (a) : (b))
#define DSGD__MAX(a, b) ((a) > (b) ? (a) : (b))

/* A private helper of the implementation: static, and not a warning in a
   file that does not call it (an add-on's implementation file). */
#if defined(__GNUC__) || defined(__clang__)
#define DSGD__PRIVATE static __attribute__((unused))
#else
#define DSGD__PRIVATE static
#endif
#endif /* DSGD__PART_BASE_PRIVATE */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_BASE_IMPL)
#define DSGD__PART_BASE_IMPL

/* >>results ---------------------------------------------------------------- */

DSGD_API const char *dsgd_result_string(dsgd_result r) {
    switch (r) {
#define DSGD__RESULT_CASE(name, value, text) \
    case name:                               \
        return text;
        DSGD__RESULT_LIST(DSGD__RESULT_CASE)
#undef DSGD__RESULT_CASE
    default:
        return "unknown result code";
    }
}

/* >>context ---------------------------------------------------------------- */

#define DSGD__MSG_MAX 1024

struct dsgd_ctx {
    dsgd_logger logger;
    char label[64];
    dsgd_result last_result;
    char last_error[DSGD__MSG_MAX];
};

DSGD_API dsgd_result dsgd_ctx_create(const dsgd_ctx_desc *desc, dsgd_ctx **out) {
    dsgd_ctx *ctx;
    if (!out) return DSGD_ERR_INVALID_ARGUMENT;
    *out = NULL;
    ctx = (dsgd_ctx *)DSGD_MALLOC(sizeof(*ctx));
    if (!ctx) return DSGD_ERR_OUT_OF_MEMORY;
    memset(ctx, 0, sizeof(*ctx));
    if (desc) {
        ctx->logger = desc->logger;
        if (desc->label) {
            strncpy(ctx->label, desc->label, sizeof(ctx->label) - 1);
        }
    }
    *out = ctx;
    return DSGD_OK;
}

DSGD_API void dsgd_ctx_destroy(dsgd_ctx *ctx) { DSGD_FREE(ctx); }

DSGD_API const char *dsgd_ctx_last_error(const dsgd_ctx *ctx) {
    return ctx ? ctx->last_error : "";
}

DSGD_API dsgd_result dsgd_ctx_last_result(const dsgd_ctx *ctx) {
    return ctx ? ctx->last_result : DSGD_OK;
}

DSGD_API void dsgd_ctx_clear_error(dsgd_ctx *ctx) {
    if (!ctx) return;
    ctx->last_result = DSGD_OK;
    ctx->last_error[0] = '\0';
}

DSGD_API dsgd_logger dsgd_ctx_logger(const dsgd_ctx *ctx) {
    dsgd_logger none;
    if (ctx) return ctx->logger;
    memset(&none, 0, sizeof(none));
    return none;
}

DSGD_API const char *dsgd_ctx_label(const dsgd_ctx *ctx) { return ctx ? ctx->label : ""; }

static void dsgd__vformat(dsgd_ctx *ctx, char *dst, size_t cap, const char *fmt, va_list ap) {
    size_t used = 0;
    if (ctx->label[0]) {
        int k = snprintf(dst, cap, "%s: ", ctx->label);
        used = k > 0 ? (size_t)k : 0;
        if (used >= cap) used = cap - 1;
    }
    vsnprintf(dst + used, cap - used, fmt, ap);
}

DSGD_API dsgd_result dsgd_ctx_set_error(dsgd_ctx *ctx, dsgd_result r, const char *fmt, ...) {
    va_list ap;
    if (!ctx) return r;
    va_start(ap, fmt);
    dsgd__vformat(ctx, ctx->last_error, sizeof(ctx->last_error), fmt, ap);
    va_end(ap);
    ctx->last_result = r;
    if (ctx->logger.func) ctx->logger.func(ctx->logger.user_data, DSGD_LOG_ERROR, ctx->last_error);
    return r;
}

DSGD_API void dsgd_ctx_log(dsgd_ctx *ctx, dsgd_log_level level, const char *fmt, ...) {
    char msg[DSGD__MSG_MAX];
    va_list ap;
    if (!ctx || !ctx->logger.func) return;
    va_start(ap, fmt);
    dsgd__vformat(ctx, msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctx->logger.func(ctx->logger.user_data, level, msg);
}

/* >>utilities -------------------------------------------------------------- */

DSGD_API uint64_t dsgd_rng_next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

DSGD_API double dsgd_rng_uniform(uint64_t *state) {
    return (double)(dsgd_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

DSGD_API double dsgd_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif /* DSGD__PART_BASE_IMPL */
