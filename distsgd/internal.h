/* distsgd/internal.h - private helpers shared by the core and its add-ons (compiled for either implementation)
   Part of distsgd (see ../distsgd.h, which includes the parts in order).
*/

#if (defined(DISTSGD_IMPLEMENTATION) || defined(DISTSGD_CL_IMPLEMENTATION) || defined(DISTSGD_MPI_IMPLEMENTATION)) && \
    !defined(DSGD__PART_INTERNAL_IMPL)
#define DSGD__PART_INTERNAL_IMPL

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

/* A standard normal deviate (Box-Muller; one of the pair is discarded so the
   stream position depends only on the number of draws). */
DSGD__PRIVATE double dsgd__rng_normal(uint64_t *state) {
    double u1 = dsgd_rng_uniform(state), u2 = dsgd_rng_uniform(state);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* Uniform integer in [0, n) without modulo bias. */
DSGD__PRIVATE size_t dsgd__rng_below(uint64_t *state, size_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % (uint64_t)n, r;
    do {
        r = dsgd_rng_next(state);
    } while (r >= limit);
    return (size_t)(r % (uint64_t)n);
}

/* A seed derived from a base seed and a stream index. */
DSGD__PRIVATE uint64_t dsgd__seed_mix(uint64_t seed, uint64_t stream) {
    uint64_t s = seed ^ (stream * 0xD1B54A32D192ED03ull);
    return dsgd_rng_next(&s);
}

DSGD__PRIVATE void *dsgd__alloc(dsgd_ctx *ctx, size_t bytes, const char *what) {
    void *p = DSGD_MALLOC(bytes ? bytes : 1);
    if (!p) dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", what, bytes);
    return p;
}

/* *out = a * b; returns 1 (leaving *out unset) when that overflows size_t, 0 otherwise. */
DSGD__PRIVATE int dsgd__mul_overflows(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return 1;
    *out = a * b;
    return 0;
}

/* A mutex and two condition variables, all or none: on failure nothing is
   left initialised and a DSGD_ERR_SYSTEM naming `what` is recorded. */
DSGD__PRIVATE dsgd_result dsgd__lock_init(dsgd_ctx *ctx, pthread_mutex_t *mu, pthread_cond_t *a, pthread_cond_t *b,
                                          const char *what) {
    if (pthread_mutex_init(mu, NULL) != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: pthread_mutex_init failed", what);
    if (pthread_cond_init(a, NULL) != 0) {
        pthread_mutex_destroy(mu);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: pthread_cond_init failed", what);
    }
    if (pthread_cond_init(b, NULL) != 0) {
        pthread_cond_destroy(a);
        pthread_mutex_destroy(mu);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_SYSTEM, "%s: pthread_cond_init failed", what);
    }
    return DSGD_OK;
}

/* >>atomics ---------------------------------------------------------------- */
/* GCC/Clang builtins (C and C++ alike; no <stdatomic.h>, so C++11 users
   compile this too). Sequentially consistent where a sleeper and a waker
   must see each other's stores (the "sleeping" flag against the queue
   indices); acquire/release elsewhere. */
#if defined(__GNUC__) || defined(__clang__)
#define DSGD__LOAD_RLX(p) __atomic_load_n((p), __ATOMIC_RELAXED)
#define DSGD__LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define DSGD__LOAD_SC(p) __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define DSGD__STORE_RLX(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)
#define DSGD__STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define DSGD__STORE_SC(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define DSGD__FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define DSGD__CAS(p, expected, desired) \
    __atomic_compare_exchange_n((p), (expected), (desired), 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)
#else
#error "distsgd: the loopback transport needs GCC or Clang (__atomic builtins)"
#endif

#if defined(__x86_64__) || defined(__i386__)
#define DSGD__PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__) || defined(__arm__)
#define DSGD__PAUSE() __asm__ __volatile__("yield" ::: "memory")
#else
#define DSGD__PAUSE() ((void)0)
#endif

/* >>files ------------------------------------------------------------------ */

/* Opens path and returns its size, or records an error. Only regular files:
   the open is non-blocking, so a FIFO with no writer (or a device) fails at
   once instead of blocking in open(); the type is checked on the opened
   descriptor, so a path swapped after the check cannot slip through. */
DSGD__PRIVATE FILE *dsgd__open_sized(dsgd_ctx *ctx, const char *path, size_t *size) {
    FILE *f;
    long end;
    struct stat st;
    int fd, flags;
    if (!path) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "file path is NULL");
        return NULL;
    }
    fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0 || !(f = fdopen(fd, "rb"))) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (end = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot determine the file size", path);
        fclose(f);
        return NULL;
    }
    *size = (size_t)end;
    return f;
}

/* Reads a whole file into a buffer with a NUL after its size bytes. */
DSGD__PRIVATE char *dsgd__read_file(dsgd_ctx *ctx, const char *path, size_t *len) {
    size_t size = 0;
    char *text;
    FILE *f = dsgd__open_sized(ctx, path, &size);
    if (!f) return NULL;
    if (size == SIZE_MAX) {
        fclose(f);
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: too large", path);
        return NULL;
    }
    text = (char *)dsgd__alloc(ctx, size + 1, path);
    if (text && fread(text, 1, size, f) != size) {
        dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: read failed", path);
        DSGD_FREE(text);
        text = NULL;
    }
    fclose(f);
    if (text) {
        text[size] = '\0';
        *len = size;
    }
    return text;
}

#endif /* DSGD__PART_INTERNAL_IMPL */
