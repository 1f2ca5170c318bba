/* distsgd/checkpoint.h - checkpoints: the file format, atomic writes, a model's and optimizer's state
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   CHECKPOINTS

     dsgd_model_save(m, opt, path, &extra) writes everything a run needs to
     go on bit for bit, and dsgd_model_restore(m, opt, path, &extra) puts it
     back into a model (and optimizer, and sampler) created with the same
     description: the parameters; the optimizer's slots, step count (which
     is the learning-rate schedule's position) and last gradient norm; the
     metrics accumulators; the sampler's epoch and cursor (its permutation
     is a function of (seed, epoch), so that is all of its state); and an
     opaque section of the caller's (its own RNG states, a step counter,
     ...). The library keeps no other random state: every other stream it
     draws from (initial weights, shuffles, the simulated faults) is a
     function of a seed and an index. dsgd_strategy_save and
     dsgd_strategy_restore (strategy_checkpoint.h) add the distributed
     variables and every replica's metrics, and dsgd_ps_*_save the
     parameter servers' shards.

     The file (format version DSGD_CHECKPOINT_VERSION, little-endian):

       header   32 bytes: "DSGDCKPT", u32 version, u32 sections, u64 file
                size, u32 flags (0), u32 CRC32C of the 28 bytes before it
       section  16-byte name (a..z, 0..9, '_', '/', NUL-padded), u64 size,
                size bytes, u32 CRC32C of name, size and bytes; sections
                follow one another to the end of the file, names unique

     Integers are little-endian, floats IEEE-754 binary32 (binary64 for
     doubles) in little-endian byte order. The sections: "model" (the
     variables' names, offsets and shapes), "params", "optimizer" (kind,
     step, last norm, slots), "metrics" (each replica's accumulators),
     "sampler", "user", and the strategy's and servers' own.

     Reading validates everything before it changes anything: the header,
     the file size, every section's bounds and checksum, the names, then
     every size and shape against the objects given. Any flaw is
     DSGD_ERR_FORMAT (a corrupt or truncated file; the message says where),
     a file of another model or optimizer DSGD_ERR_SHAPE naming the
     mismatch; either way nothing was touched. No allocation is sized from
     a field of the file: the file is read whole (its size from the file
     system), and the sections are used where they lie. A backend failing
     while the checked state is being written is the one failure that
     leaves a model partly restored.

     Several processes: every replica holds the same parameters and
     optimizer state, so one file serves them all. A multi-process run
     (MPI) has rank 0 write it and every rank restore from it,
     each parameter server writing and reading its own shards' file
     (dsgd_ps_server_save); a section per process is never needed.

     Writing is atomic: the image goes to a temporary file beside path
     (path.tmp.HOST.PID.XXXXXX, mode 0600: HOST this machine's name with
     every character but letters, digits and '-' made '_', PID the writing
     process), which is flushed to disk (fsync), renamed over path, and the
     directory is flushed too. A crash at any point leaves either the old
     checkpoint or the new one under path, and at worst that temporary
     file. The next save to path removes such leftovers first: each
     temporary of path named for this machine whose process no longer
     exists. A temporary of a live process (another save to path under
     way, in this process or another), one named for another machine
     (whose processes this one cannot see) and every other file are left
     alone; a leftover that cannot be removed is left too, silently.
*/
#ifndef DSGD__PART_CHECKPOINT_DECL
#define DSGD__PART_CHECKPOINT_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- checkpoints */

/* The format version this library writes and the only one it reads. */
#define DSGD_CHECKPOINT_VERSION 1

/* What a checkpoint holds besides the model and optimizer; every member is
   optional (NULL, 0). */
typedef struct dsgd_checkpoint_extra {
    dsgd_sampler *sampler; /* its epoch and cursor; on restore the sampler must
                              have been initialised with the same number of
                              samples, seed and shuffle (the batch may differ:
                              the cursor counts samples) */
    void *user;            /* user_bytes bytes saved as they are; on restore
                              filled from the file, which must hold exactly
                              user_bytes */
    size_t user_bytes;
} dsgd_checkpoint_extra;

/* Saves m's parameters and metrics, opt's state (opt may be NULL: none) and
   extra (may be NULL) to path, atomically (see CHECKPOINTS). Waits for m's
   queued work.
   Errors (recorded on m's ctx): DSGD_ERR_INVALID_ARGUMENT (m NULL, nothing
   recorded; path NULL or empty; opt not m's; user_bytes > 0 with user
   NULL), DSGD_ERR_IO (naming the file and the system's reason),
   DSGD_ERR_OUT_OF_MEMORY, backend errors. path is then unchanged.
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_save(dsgd_model *m, dsgd_optimizer *opt, const char *path,
                                     const dsgd_checkpoint_extra *extra);
/* Restores what dsgd_model_save (or dsgd_strategy_save: replica 0's view,
   with every replica's metrics summed into m's) wrote into m, opt and
   extra, which must be of the same shapes; opt NULL and extra NULL skip
   those parts, but a part asked for must be in the file.
   Errors (recorded on m's ctx): DSGD_ERR_INVALID_ARGUMENT (as save),
   DSGD_ERR_IO (cannot read), DSGD_ERR_FORMAT (not a checkpoint, another
   version, truncated, a checksum or a size that does not match: the file
   is damaged), DSGD_ERR_SHAPE (a checkpoint of another model, optimizer
   kind, sampler or user size, or without a part asked for: the message
   names it); after any of these m, opt and extra are untouched. Backend
   errors while writing (m partly restored).
   Thread safety: the model's thread. */
DSGD_API dsgd_result dsgd_model_restore(dsgd_model *m, dsgd_optimizer *opt, const char *path,
                                        const dsgd_checkpoint_extra *extra);
/* Checks that path is a whole, undamaged checkpoint (header, size and every
   section's checksum), without a model: what a restore checks first.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (path NULL),
   DSGD_ERR_IO, DSGD_ERR_FORMAT, DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: the context's thread. */
DSGD_API dsgd_result dsgd_checkpoint_verify(dsgd_ctx *ctx, const char *path);
/* CRC32C (Castagnoli, reflected 0x82F63B78, the checksum of iSCSI and
   ext4) of size bytes at data, continuing from crc (0 to start). Uses the
   SSE4.2 instruction where the CPU has it.
   Errors: none. Thread safety: any thread. */
DSGD_API uint32_t dsgd_crc32c(uint32_t crc, const void *data, size_t size);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_CHECKPOINT_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD__PART_CHECKPOINT_IMPL)
#define DSGD__PART_CHECKPOINT_IMPL

/* >>crc32c ------------------------------------------------------------------ */

static uint32_t dsgd__crc_table[256];
static pthread_once_t dsgd__crc_once = PTHREAD_ONCE_INIT;

static void dsgd__crc_init(void) {
    uint32_t i, k, c;
    for (i = 0; i < 256; ++i) {
        for (c = i, k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        dsgd__crc_table[i] = c;
    }
}

static uint32_t dsgd__crc_soft(uint32_t c, const unsigned char *p, size_t n) {
    pthread_once(&dsgd__crc_once, dsgd__crc_init);
    while (n--) c = dsgd__crc_table[(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(DSGD_CPU_NO_DISPATCH)
/* a * b modulo the polynomial, in the reflected order (bit 31 is x^0). */
static uint32_t dsgd__crc_mul(uint32_t a, uint32_t b) {
    uint32_t prod = 0;
    int i;
    for (i = 31; i >= 0; --i) {
        if (a & (1u << i)) prod ^= b;
        b = (b & 1u) ? (b >> 1) ^ 0x82F63B78u : b >> 1; /* b *= x */
    }
    return prod;
}

/* x^(8 bytes) modulo the polynomial: what appending that many zero bytes
   multiplies a CRC register by. */
static uint32_t dsgd__crc_xpow(uint64_t bytes) {
    uint32_t result = 0x80000000u, base = 0x40000000u; /* x^0, x^1 */
    uint64_t n = bytes * 8;
    for (; n; n >>= 1) {
        if (n & 1) result = dsgd__crc_mul(result, base);
        base = dsgd__crc_mul(base, base);
    }
    return result;
}

/* The register c after n bytes at p. Long inputs run as three lanes at
   once (the instruction's latency is three times its throughput): with
   registers a, b, c after lanes A, B, C of k bytes each (B and C started
   from 0), the register after A B C is ((a x^8k) ^ b) x^8k ^ c, since the
   register is linear in its start and the bytes. */
__attribute__((target("sse4.2"))) static uint32_t dsgd__crc_sse42(uint32_t c, const unsigned char *p, size_t n) {
    unsigned long long c0 = c, c1 = 0, c2 = 0, v0, v1, v2;
    if (n >= 3 * 1024) {
        size_t k = (n / 3) & ~(size_t)7, i;
        uint32_t shift;
        for (i = 0; i < k; i += 8) {
            memcpy(&v0, p + i, 8); /* the instruction takes the bytes in memory order, as the table does */
            memcpy(&v1, p + k + i, 8);
            memcpy(&v2, p + 2 * k + i, 8);
            c0 = __builtin_ia32_crc32di(c0, v0);
            c1 = __builtin_ia32_crc32di(c1, v1);
            c2 = __builtin_ia32_crc32di(c2, v2);
        }
        shift = dsgd__crc_xpow(k);
        c0 = dsgd__crc_mul(dsgd__crc_mul((uint32_t)c0, shift) ^ (uint32_t)c1, shift) ^ (uint32_t)c2;
        p += 3 * k;
        n -= 3 * k;
    }
    for (; n >= 8; n -= 8, p += 8) {
        memcpy(&v0, p, 8);
        c0 = __builtin_ia32_crc32di(c0, v0);
    }
    c = (uint32_t)c0;
    for (; n > 0; --n) c = __builtin_ia32_crc32qi(c, *p++);
    return c;
}
static int dsgd__crc_hw(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#else
#define dsgd__crc_hw() 0
#define dsgd__crc_sse42 dsgd__crc_soft
#endif


DSGD_API uint32_t dsgd_crc32c(uint32_t crc, const void *data, size_t size) {
    const unsigned char *p = (const unsigned char *)data;
    uint32_t c = ~crc;
    if (!p || size == 0) return crc;
    c = dsgd__crc_hw() ? dsgd__crc_sse42(c, p, size) : dsgd__crc_soft(c, p, size);
    return ~c;
}

/* >>ck_format --------------------------------------------------------------- */

#define DSGD__CK_MAGIC "DSGDCKPT"
#define DSGD__CK_HEADER 32
#define DSGD__CK_NAME 16
#define DSGD__CK_MAX_SECTIONS 64

static void dsgd__ck_put32(unsigned char *p, uint32_t v) {
    int i;
    for (i = 0; i < 4; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static void dsgd__ck_put64(unsigned char *p, uint64_t v) {
    int i;
    for (i = 0; i < 8; ++i) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t dsgd__ck_get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t dsgd__ck_get64(const unsigned char *p) {
    return (uint64_t)dsgd__ck_get32(p) | (uint64_t)dsgd__ck_get32(p + 4) << 32;
}

/* 1 on a little-endian host, whose floats are stored as they are. */
static int dsgd__ck_little_endian(void) {
    const uint32_t one = 1;
    return *(const unsigned char *)&one == 1;
}

/* Floats are stored little-endian: on a big-endian host, swap each. */
static void dsgd__ck_swap_floats(void *data, size_t count) {
    unsigned char *p = (unsigned char *)data, t;
    size_t i;
    if (dsgd__ck_little_endian()) return;
    for (i = 0; i < count; ++i, p += 4) {
        t = p[0], p[0] = p[3], p[3] = t;
        t = p[1], p[1] = p[2], p[2] = t;
    }
}

/* ---- writing: the whole image in memory, then one atomic file write */

typedef struct dsgd__ck_writer {
    dsgd_ctx *ctx;
    const char *what;
    unsigned char *buf;
    size_t len, cap;
    size_t sec;     /* the open section's start */
    uint32_t nsec;
    dsgd_result res; /* the first failure; later calls do nothing */
} dsgd__ck_writer;

/* n more bytes at the end of the image (valid until the next grow), or
   NULL after a failure. */
static unsigned char *dsgd__ckw_grow(dsgd__ck_writer *w, size_t n) {
    unsigned char *p;
    if (w->res != DSGD_OK) return NULL;
    if (n > SIZE_MAX / 2 - w->len) {
        w->res = dsgd_ctx_set_error(w->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: a checkpoint of over %zu bytes", w->what,
                                    w->len);
        return NULL;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n) cap = cap < SIZE_MAX / 4 ? cap * 2 : w->len + n;
        if (!(p = (unsigned char *)DSGD_REALLOC(w->buf, cap))) {
            w->res = dsgd_ctx_set_error(w->ctx, DSGD_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", w->what, cap);
            return NULL;
        }
        w->buf = p;
        w->cap = cap;
    }
    p = w->buf + w->len;
    w->len += n;
    return p;
}

/* Starts an image of about `expect` bytes (allocated at once: growing it
   would copy it). */
static void dsgd__ckw_init(dsgd__ck_writer *w, dsgd_ctx *ctx, const char *what, size_t expect) {
    memset(w, 0, sizeof(*w));
    w->ctx = ctx;
    w->what = what;
    if (dsgd__ckw_grow(w, expect)) w->len = 0;
    dsgd__ckw_grow(w, DSGD__CK_HEADER);
}

/* The bytes of a model's and optimizer's sections, with room for the rest. */
static size_t dsgd__ck_expect(const dsgd_model *m, int slots, size_t more) {
    return 65536 + dsgd_model_num_params(m) * sizeof(float) * (size_t)(1 + slots) + more;
}

static void dsgd__ckw_u32(dsgd__ck_writer *w, uint32_t v) {
    unsigned char *p = dsgd__ckw_grow(w, 4);
    if (p) dsgd__ck_put32(p, v);
}
static void dsgd__ckw_u64(dsgd__ck_writer *w, uint64_t v) {
    unsigned char *p = dsgd__ckw_grow(w, 8);
    if (p) dsgd__ck_put64(p, v);
}
static void dsgd__ckw_f64(dsgd__ck_writer *w, double v) {
    uint64_t u;
    memcpy(&u, &v, 8);
    dsgd__ckw_u64(w, u);
}
static void dsgd__ckw_str(dsgd__ck_writer *w, const char *s) {
    size_t n = strlen(s);
    unsigned char *p;
    dsgd__ckw_u32(w, (uint32_t)n);
    if ((p = dsgd__ckw_grow(w, n))) memcpy(p, s, n);
}
DSGD__PRIVATE void dsgd__ckw_floats(dsgd__ck_writer *w, const float *v, size_t count) {
    unsigned char *p = dsgd__ckw_grow(w, count * sizeof(float));
    if (!p) return;
    memcpy(p, v, count * sizeof(float));
    dsgd__ck_swap_floats(p, count);
}
/* count floats read from a backend buffer straight into the image. */
static void dsgd__ckw_read(dsgd__ck_writer *w, const dsgd_backend_i *be, dsgd_ref ref, size_t count) {
    unsigned char *p = dsgd__ckw_grow(w, count * sizeof(float));
    dsgd_result r;
    if (!p || count == 0) return;
    if ((r = be->read(be->impl, ref, (float *)(void *)p, count)) != DSGD_OK) {
        w->res = r;
        return;
    }
    dsgd__ck_swap_floats(p, count);
}

static void dsgd__ckw_begin(dsgd__ck_writer *w, const char *name) {
    unsigned char *p;
    w->sec = w->len;
    if (!(p = dsgd__ckw_grow(w, DSGD__CK_NAME + 8))) return;
    memset(p, 0, DSGD__CK_NAME + 8);
    memcpy(p, name, strlen(name)); /* names are ours, < 16 bytes */
}
static void dsgd__ckw_end(dsgd__ck_writer *w) {
    uint32_t crc;
    if (w->res != DSGD_OK) return;
    dsgd__ck_put64(w->buf + w->sec + DSGD__CK_NAME, (uint64_t)(w->len - w->sec - DSGD__CK_NAME - 8));
    crc = dsgd_crc32c(0, w->buf + w->sec, w->len - w->sec);
    dsgd__ckw_u32(w, crc);
    w->nsec++;
}

/* >>atomic-write ------------------------------------------------------------ */

#include <dirent.h>
#include <signal.h>

/* This machine's name as it goes into temporary names: letters, digits and
   '-' kept, anything else '_', at most 64 characters ("unknown" when the
   system will not say). It holds no '.', so a name parses from its dots. */
static void dsgd__ck_host(char out[65]) {
    char h[256];
    size_t i;
    if (gethostname(h, sizeof(h) - 1) != 0 || h[0] == '\0') strcpy(h, "unknown");
    h[sizeof(h) - 1] = '\0';
    for (i = 0; h[i] && i < 64; ++i) {
        char ch = h[i];
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '-';
        out[i] = keep ? ch : '_';
    }
    out[i] = '\0';
}

/* The writer's pid if name is a temporary of ours for the file base on host
   (base.tmp.host.pid.XXXXXX, the mkstemp suffix letters and digits), else 0. */
static pid_t dsgd__ck_temp_pid(const char *name, const char *base, const char *host) {
    size_t bl = strlen(base), hl = strlen(host), i, nd;
    const char *p = name;
    long pid = 0;
    if (strncmp(p, base, bl) != 0 || strncmp(p + bl, ".tmp.", 5) != 0) return 0;
    p += bl + 5;
    if (strncmp(p, host, hl) != 0 || p[hl] != '.') return 0;
    p += hl + 1;
    for (nd = 0; p[nd] >= '0' && p[nd] <= '9'; ++nd) {
        if (nd == 9 || (nd == 0 && p[0] == '0')) return 0; /* no leading zero; under 10^9 */
        pid = pid * 10 + (p[nd] - '0');
    }
    if (nd == 0 || p[nd] != '.') return 0;
    p += nd + 1;
    for (i = 0; i < 6; ++i)
        if (!((p[i] >= 'a' && p[i] <= 'z') || (p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= '0' && p[i] <= '9')))
            return 0;
    if (p[6] != '\0' || (long)(pid_t)pid != pid) return 0;
    return (pid_t)pid;
}

/* Removes the temporaries that killed writers of base (in dir) left behind:
   those of this machine whose process no longer exists. A live writer's,
   another machine's and any other file stay. Best effort: a directory that
   cannot be read, or a file that cannot be removed, is left as it is. */
static void dsgd__ck_remove_stale(const char *dir, const char *base, const char *host) {
    DIR *d = opendir(dir);
    struct dirent *e;
    size_t dl = strlen(dir);
    if (!d) return;
    while ((e = readdir(d)) != NULL) {
        pid_t pid = dsgd__ck_temp_pid(e->d_name, base, host);
        char *full;
        if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) continue; /* not ours, alive, or not ours to know */
        if (!(full = (char *)DSGD_MALLOC(dl + strlen(e->d_name) + 2))) continue;
        memcpy(full, dir, dl);
        full[dl] = '/';
        strcpy(full + dl + 1, e->d_name);
        unlink(full);
        DSGD_FREE(full);
    }
    closedir(d);
}

/* Writes data to path atomically (see CHECKPOINTS): first the stale
   temporaries of path go, then a temporary file beside it, fsync, rename,
   fsync of the directory. */
static char *dsgd__ck_temp_template(dsgd_ctx *ctx, const char *what, const char *path) {
    char host[65], *tmp;
    size_t cap;
    dsgd__ck_host(host);
    cap = strlen(path) + 5 + strlen(host) + 1 + 20 + 8; /* path.tmp.host.pid.XXXXXX */
    if ((tmp = (char *)dsgd__alloc(ctx, cap, what)) != NULL)
        snprintf(tmp, cap, "%s.tmp.%s.%ld.XXXXXX", path, host, (long)getpid());
    return tmp;
}

/* DSGD_ERR_IO (recorded: "nothing was saved") unless a file can be made
   beside path, tried with a temporary of the name dsgd__write_atomic uses
   (so a later save removes one a kill left behind), then removed: for a
   save that must know before it stops anything. */
DSGD__PRIVATE dsgd_result dsgd__ck_can_create(dsgd_ctx *ctx, const char *what, const char *path) {
    char *tmp = dsgd__ck_temp_template(ctx, what, path);
    dsgd_result r = DSGD_OK;
    int fd;
    if (!tmp) return DSGD_ERR_OUT_OF_MEMORY;
    if ((fd = mkstemp(tmp)) < 0)
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: %s: cannot create a file beside it: %s; nothing was saved", what,
                               path, strerror(errno));
    else {
        close(fd);
        unlink(tmp);
    }
    DSGD_FREE(tmp);
    return r;
}

static dsgd_result dsgd__write_atomic(dsgd_ctx *ctx, const char *what, const char *path, const void *data,
                                      size_t len) {
    size_t plen = strlen(path), done = 0;
    char host[65], *tmp, *dir;
    const char *slash = strrchr(path, '/');
    dsgd_result r = DSGD_OK;
    int fd, dfd, e;
    dsgd__ck_host(host);
    if (!(tmp = dsgd__ck_temp_template(ctx, what, path))) return DSGD_ERR_OUT_OF_MEMORY;
    if (!(dir = (char *)dsgd__alloc(ctx, plen + 2, what))) {
        DSGD_FREE(tmp);
        return DSGD_ERR_OUT_OF_MEMORY;
    }
    if (!slash) strcpy(dir, ".");
    else if (slash == path) strcpy(dir, "/");
    else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
    }
    dsgd__ck_remove_stale(dir, slash ? slash + 1 : path, host);
    if ((fd = mkstemp(tmp)) < 0) {
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: %s: cannot create a temporary file beside it: %s", what, path,
                               strerror(errno));
        DSGD_FREE(tmp);
        DSGD_FREE(dir);
        return r;
    }
    while (done < len) {
        ssize_t k = write(fd, (const char *)data + done, len - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        done += (size_t)k;
    }
    if (done < len || fsync(fd) != 0) {
        e = errno;
        close(fd);
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: %s: cannot write %s: %s", what, path, tmp, strerror(e));
    } else if (close(fd) != 0 || rename(tmp, path) != 0) {
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: %s: cannot put %s in its place: %s", what, path, tmp,
                               strerror(errno));
    }
    if (r != DSGD_OK) unlink(tmp);
    /* the rename is durable once the directory is */
    if (r == DSGD_OK && (dfd = open(dir, O_RDONLY)) >= 0) {
        if (fsync(dfd) != 0 && errno != EINVAL && errno != EBADF) /* some file systems cannot sync a directory */
            r = dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: %s: cannot flush directory %s: %s", what, path, dir,
                                   strerror(errno));
        close(dfd);
    }
    DSGD_FREE(tmp);
    DSGD_FREE(dir);
    return r;
}

/* Fills the header and writes the image to path; frees it. */
static dsgd_result dsgd__ckw_commit(dsgd__ck_writer *w, const char *path) {
    dsgd_result r = w->res;
    if (r == DSGD_OK) {
        memcpy(w->buf, DSGD__CK_MAGIC, 8);
        dsgd__ck_put32(w->buf + 8, DSGD_CHECKPOINT_VERSION);
        dsgd__ck_put32(w->buf + 12, w->nsec);
        dsgd__ck_put64(w->buf + 16, (uint64_t)w->len);
        dsgd__ck_put32(w->buf + 24, 0);
        dsgd__ck_put32(w->buf + 28, dsgd_crc32c(0, w->buf, 28));
        r = dsgd__write_atomic(w->ctx, w->what, path, w->buf, w->len);
    }
    DSGD_FREE(w->buf);
    w->buf = NULL;
    return r;
}

/* ---- reading: the image in memory, its sections located and checked */

typedef struct dsgd__ck_section {
    char name[DSGD__CK_NAME + 1];
    const unsigned char *data;
    size_t size;
} dsgd__ck_section;

typedef struct dsgd__ck_file {
    dsgd_ctx *ctx;
    const char *what, *path; /* for messages */
    const unsigned char *image;
    unsigned char *owned;    /* the image, when read from a file */
    size_t size;
    dsgd__ck_section sec[DSGD__CK_MAX_SECTIONS];
    int n;
} dsgd__ck_file;

static dsgd_result dsgd__ck_bad(const dsgd__ck_file *f, size_t at, const char *why) {
    return dsgd_ctx_set_error(f->ctx, DSGD_ERR_FORMAT, "%s: %s: not a valid checkpoint: %s at byte %zu", f->what,
                              f->path, why, at);
}

/* Locates and checks every section of the image f->image[0..size). */
static dsgd_result dsgd__ck_parse(dsgd__ck_file *f) {
    const unsigned char *b = f->image;
    size_t at = DSGD__CK_HEADER, size = f->size;
    uint32_t nsec, i, k;
    if (size < DSGD__CK_HEADER) return dsgd__ck_bad(f, size, "the file ends inside the 32-byte header");
    if (memcmp(b, DSGD__CK_MAGIC, 8) != 0) return dsgd__ck_bad(f, 0, "no \"DSGDCKPT\" magic");
    if (dsgd__ck_get32(b + 28) != dsgd_crc32c(0, b, 28)) return dsgd__ck_bad(f, 28, "the header's checksum does not match");
    if (dsgd__ck_get32(b + 8) != DSGD_CHECKPOINT_VERSION)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_FORMAT, "%s: %s: checkpoint format version %u; this library reads %d",
                                  f->what, f->path, (unsigned)dsgd__ck_get32(b + 8), DSGD_CHECKPOINT_VERSION);
    if (dsgd__ck_get64(b + 16) != (uint64_t)size)
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_FORMAT,
                                  "%s: %s: not a valid checkpoint: the header says %llu bytes, the file has %zu "
                                  "(truncated or extended)",
                                  f->what, f->path, (unsigned long long)dsgd__ck_get64(b + 16), size);
    if (dsgd__ck_get32(b + 24) != 0) return dsgd__ck_bad(f, 24, "unknown flags");
    nsec = dsgd__ck_get32(b + 12);
    if (nsec > DSGD__CK_MAX_SECTIONS) return dsgd__ck_bad(f, 12, "more than 64 sections");
    for (i = 0; i < nsec; ++i) {
        dsgd__ck_section *s = &f->sec[i];
        uint64_t len;
        if (size - at < DSGD__CK_NAME + 8 + 4) return dsgd__ck_bad(f, at, "the file ends inside a section header");
        for (k = 0; k < DSGD__CK_NAME && b[at + k]; ++k) {
            unsigned char c = b[at + k];
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '/'))
                return dsgd__ck_bad(f, at + k, "a section name with a character outside a-z 0-9 _ /");
        }
        if (k == 0) return dsgd__ck_bad(f, at, "an empty section name");
        for (; k < DSGD__CK_NAME; ++k)
            if (b[at + k]) return dsgd__ck_bad(f, at + k, "a section name not padded with NUL bytes");
        len = dsgd__ck_get64(b + at + DSGD__CK_NAME);
        if (len > (uint64_t)(size - at - DSGD__CK_NAME - 8 - 4))
            return dsgd__ck_bad(f, at + DSGD__CK_NAME, "a section longer than the rest of the file");
        if (dsgd__ck_get32(b + at + DSGD__CK_NAME + 8 + len) != dsgd_crc32c(0, b + at, DSGD__CK_NAME + 8 + (size_t)len))
            return dsgd__ck_bad(f, at, "a section's checksum does not match");
        memcpy(s->name, b + at, DSGD__CK_NAME);
        s->name[DSGD__CK_NAME] = '\0';
        s->data = b + at + DSGD__CK_NAME + 8;
        s->size = (size_t)len;
        for (k = 0; k < i; ++k)
            if (strcmp(f->sec[k].name, s->name) == 0) return dsgd__ck_bad(f, at, "a section name used twice");
        at += DSGD__CK_NAME + 8 + (size_t)len + 4;
    }
    f->n = (int)nsec;
    if (at != size) return dsgd__ck_bad(f, at, "bytes after the last section");
    return DSGD_OK;
}

/* Parses an image in memory (not copied: it must outlive f). */
DSGD__PRIVATE dsgd_result dsgd__ck_from_memory(dsgd__ck_file *f, dsgd_ctx *ctx, const char *what, const char *name,
                                        const void *image, size_t size) {
    memset(f, 0, sizeof(*f));
    f->ctx = ctx;
    f->what = what;
    f->path = name;
    f->image = (const unsigned char *)image;
    f->size = size;
    return dsgd__ck_parse(f);
}

/* Reads path whole and parses it. Free with dsgd__ck_close. */
static dsgd_result dsgd__ck_open(dsgd__ck_file *f, dsgd_ctx *ctx, const char *what, const char *path) {
    size_t len = 0;
    unsigned char *image;
    dsgd_result r;
    memset(f, 0, sizeof(*f)); /* so that dsgd__ck_close is safe after any failure */
    if (!path || !*path) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: path is NULL or empty", what);
    if (!(image = (unsigned char *)dsgd__read_file(ctx, path, &len))) return dsgd_ctx_last_result(ctx);
    r = dsgd__ck_from_memory(f, ctx, what, path, image, len);
    f->owned = image;
    return r;
}

static void dsgd__ck_close(dsgd__ck_file *f) {
    DSGD_FREE(f->owned);
    f->owned = NULL;
    f->image = NULL;
}

static const dsgd__ck_section *dsgd__ck_find(const dsgd__ck_file *f, const char *name) {
    int i;
    for (i = 0; i < f->n; ++i)
        if (strcmp(f->sec[i].name, name) == 0) return &f->sec[i];
    return NULL;
}

/* A section that must be there (for what the caller asked to restore). */
static const dsgd__ck_section *dsgd__ck_need(const dsgd__ck_file *f, const char *name, const char *for_what) {
    const dsgd__ck_section *s = dsgd__ck_find(f, name);
    if (!s)
        dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE, "%s: %s: the checkpoint has no \"%s\" section, needed for %s",
                           f->what, f->path, name, for_what);
    return s;
}

/* A cursor over a section's bytes; reading past its end sets bad and gives
   zeros, so a parser checks bad once at the end of a record. */
typedef struct dsgd__ck_cur {
    const unsigned char *p;
    size_t left;
    int bad;
} dsgd__ck_cur;

static dsgd__ck_cur dsgd__ck_cursor(const dsgd__ck_section *s) {
    dsgd__ck_cur c;
    c.p = s->data;
    c.left = s->size;
    c.bad = 0;
    return c;
}
static const unsigned char *dsgd__ck_take(dsgd__ck_cur *c, size_t n) {
    const unsigned char *p = c->p;
    if (c->bad || n > c->left) {
        c->bad = 1;
        return NULL;
    }
    c->p += n;
    c->left -= n;
    return p;
}
static uint32_t dsgd__ckr_u32(dsgd__ck_cur *c) {
    const unsigned char *p = dsgd__ck_take(c, 4);
    return p ? dsgd__ck_get32(p) : 0;
}
static uint64_t dsgd__ckr_u64(dsgd__ck_cur *c) {
    const unsigned char *p = dsgd__ck_take(c, 8);
    return p ? dsgd__ck_get64(p) : 0;
}
static double dsgd__ckr_f64(dsgd__ck_cur *c) {
    uint64_t u = dsgd__ckr_u64(c);
    double v;
    memcpy(&v, &u, 8);
    return v;
}
/* A string of at most cap - 1 bytes into out (NUL-terminated). */
static void dsgd__ckr_str(dsgd__ck_cur *c, char *out, size_t cap) {
    uint32_t n = dsgd__ckr_u32(c);
    const unsigned char *p;
    out[0] = '\0';
    if (n >= cap) {
        c->bad = 1;
        return;
    }
    if (!(p = dsgd__ck_take(c, n))) return;
    memcpy(out, p, n);
    out[n] = '\0';
}
/* count floats: a pointer into the image, or NULL (bad) when fewer remain. */
DSGD__PRIVATE const unsigned char *dsgd__ckr_floats(dsgd__ck_cur *c, uint64_t count) {
    if (count > (uint64_t)(c->left / sizeof(float))) {
        c->bad = 1;
        return NULL;
    }
    return dsgd__ck_take(c, (size_t)count * sizeof(float));
}
/* Copies count stored floats to host memory. */
static void dsgd__ck_copy_floats(float *dst, const unsigned char *src, size_t count) {
    memcpy(dst, src, count * sizeof(float));
    dsgd__ck_swap_floats(dst, count);
}

/* The error for a section whose size or records do not parse. */
static dsgd_result dsgd__ck_bad_section(const dsgd__ck_file *f, const dsgd__ck_section *s, const char *why) {
    return dsgd_ctx_set_error(f->ctx, DSGD_ERR_FORMAT, "%s: %s: not a valid checkpoint: section \"%s\" (%zu bytes): %s",
                              f->what, f->path, s->name, s->size, why);
}

/* >>ck_model ---------------------------------------------------------------- */
/* The sections of a model's state, shared by the model's, the strategy's
   and the servers' checkpoints: put_* write one; check_* validate one
   against the objects without touching them; apply_* write it into them. */

/* "model": the variables' layout (the model's identity for a restore). */
static void dsgd__ck_put_model(dsgd__ck_writer *w, const dsgd_model *m) {
    int i, k;
    dsgd__ckw_begin(w, "model");
    dsgd__ckw_u64(w, (uint64_t)dsgd_model_num_params(m));
    dsgd__ckw_u32(w, (uint32_t)dsgd_model_num_variables(m));
    for (i = 0; i < dsgd_model_num_variables(m); ++i) {
        const dsgd_variable *v = dsgd_model_variable(m, i);
        dsgd__ckw_str(w, v->name);
        dsgd__ckw_u64(w, (uint64_t)v->offset);
        dsgd__ckw_u32(w, (uint32_t)v->rank);
        for (k = 0; k < v->rank; ++k) dsgd__ckw_u32(w, (uint32_t)v->shape[k]);
    }
    dsgd__ckw_end(w);
}

/* "2x3" into buf. */
static const char *dsgd__ck_shape_text(char *buf, size_t cap, const uint32_t *shape, int rank) {
    size_t used = 0;
    int k;
    buf[0] = '\0';
    for (k = 0; k < rank && used < cap; ++k) {
        int n = snprintf(buf + used, cap - used, "%s%u", k ? "x" : "", (unsigned)shape[k]);
        if (n < 0) break;
        used += (size_t)n;
    }
    return buf;
}

static dsgd_result dsgd__ck_check_model(const dsgd__ck_file *f, const dsgd_model *m) {
    const dsgd__ck_section *s = dsgd__ck_need(f, "model", "the model");
    dsgd__ck_cur c;
    uint64_t np;
    uint32_t nv, i, k;
    if (!s) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(s);
    np = dsgd__ckr_u64(&c);
    nv = dsgd__ckr_u32(&c);
    if (c.bad) return dsgd__ck_bad_section(f, s, "cut short");
    for (i = 0; i < nv; ++i) {
        char name[DSGD_MAX_NAME + 1], a[64], b[64];
        uint32_t shape[DSGD_MAX_RANK], mshape[DSGD_MAX_RANK];
        uint64_t off;
        uint32_t rank;
        const dsgd_variable *v = i < (uint32_t)dsgd_model_num_variables(m) ? dsgd_model_variable(m, (int)i) : NULL;
        dsgd__ckr_str(&c, name, sizeof(name));
        off = dsgd__ckr_u64(&c);
        rank = dsgd__ckr_u32(&c);
        if (rank > DSGD_MAX_RANK) return dsgd__ck_bad_section(f, s, "a variable of rank above DSGD_MAX_RANK");
        for (k = 0; k < rank; ++k) shape[k] = dsgd__ckr_u32(&c);
        if (c.bad) return dsgd__ck_bad_section(f, s, "cut short");
        if (!v)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: the checkpoint's model has %u variables, this model %d (\"%s\" is "
                                      "extra)",
                                      f->what, f->path, (unsigned)nv, dsgd_model_num_variables(m), name);
        for (k = 0; (int)k < v->rank; ++k) mshape[k] = (uint32_t)v->shape[k];
        if (strcmp(name, v->name) != 0 || (int)rank != v->rank || memcmp(shape, mshape, rank * sizeof(uint32_t)) != 0 ||
            off != (uint64_t)v->offset)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: another model: variable %u is \"%s\" %s in the checkpoint, \"%s\" %s "
                                      "in this model",
                                      f->what, f->path, (unsigned)i, name, dsgd__ck_shape_text(a, sizeof(a), shape, (int)rank),
                                      v->name, dsgd__ck_shape_text(b, sizeof(b), mshape, v->rank));
    }
    if (c.left != 0) return dsgd__ck_bad_section(f, s, "bytes after the last variable");
    if (nv != (uint32_t)dsgd_model_num_variables(m) || np != (uint64_t)dsgd_model_num_params(m))
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: another model: the checkpoint has %u variables and %llu parameters, this "
                                  "model %d and %zu",
                                  f->what, f->path, (unsigned)nv, (unsigned long long)np, dsgd_model_num_variables(m),
                                  dsgd_model_num_params(m));
    return DSGD_OK;
}

/* "params": the flat parameter buffer. */
/* What a checkpoint holds of the variables beside the model's layout: n
   parameters at params on be, and an optimizer at work over them (NULL:
   none). A model and its optimizer give one (dsgd__ck_vars_of); central
   storage's host copy another, with no model. */
typedef struct dsgd__ck_vars {
    dsgd_ctx *ctx; /* where an allocation's error is recorded */
    const dsgd_backend_i *be;
    dsgd_ref params;
    size_t n;
    dsgd__opt_run *opt;
} dsgd__ck_vars;

static dsgd__ck_vars dsgd__ck_vars_of(dsgd_model *m, dsgd_optimizer *o) {
    dsgd__ck_vars v;
    v.ctx = dsgd_model_ctx(m);
    v.be = dsgd_model_backend(m);
    v.params = dsgd_model_params(m);
    v.n = dsgd_model_num_params(m);
    v.opt = o ? dsgd__optimizer_run(o) : NULL;
    return v;
}

static void dsgd__ck_put_params(dsgd__ck_writer *w, const dsgd__ck_vars *v) {
    dsgd__ckw_begin(w, "params");
    dsgd__ckw_read(w, v->be, v->params, v->n);
    dsgd__ckw_end(w);
}

static dsgd_result dsgd__ck_check_params(const dsgd__ck_file *f, size_t n) {
    const dsgd__ck_section *s = dsgd__ck_need(f, "params", "the parameters");
    if (!s) return DSGD_ERR_SHAPE;
    if (s->size != n * sizeof(float)) return dsgd__ck_bad_section(f, s, "not the model's parameter count");
    return DSGD_OK;
}

/* Writes count stored floats at src to dst in v's backend: straight from
   the image where it is aligned and the host little-endian, else through a
   copy. */
static dsgd_result dsgd__ck_write_buffer(const dsgd__ck_vars *v, const char *what, dsgd_ref dst,
                                         const unsigned char *src, size_t count) {
    float *tmp;
    dsgd_result r;
    if (count == 0) return DSGD_OK;
    if (dsgd__ck_little_endian() && (uintptr_t)src % sizeof(float) == 0)
        return v->be->write(v->be->impl, dst, (const float *)(const void *)src, count);
    if (!(tmp = (float *)dsgd__alloc(v->ctx, count * sizeof(float), what))) return DSGD_ERR_OUT_OF_MEMORY;
    dsgd__ck_copy_floats(tmp, src, count);
    r = v->be->write(v->be->impl, dst, tmp, count);
    DSGD_FREE(tmp);
    return r;
}

static dsgd_result dsgd__ck_apply_params(const dsgd__ck_file *f, const dsgd__ck_vars *v) {
    return dsgd__ck_write_buffer(v, f->what, v->params, dsgd__ck_find(f, "params")->data, v->n);
}

/* "optimizer": kind, steps, last norm, slots. */
static void dsgd__ck_put_optimizer(dsgd__ck_writer *w, const dsgd__ck_vars *v) {
    const dsgd__opt_run *o = v->opt;
    int k, n = dsgd__opt_state_slots(&o->st);
    dsgd__ckw_begin(w, "optimizer");
    dsgd__ckw_u32(w, (uint32_t)o->st.d.kind);
    dsgd__ckw_u64(w, (uint64_t)o->t);
    dsgd__ckw_f64(w, o->last_norm);
    dsgd__ckw_u32(w, (uint32_t)n);
    dsgd__ckw_u64(w, (uint64_t)v->n);
    for (k = 0; k < n; ++k) dsgd__ckw_read(w, v->be, dsgd__ref(o->st.slot[k], 0), v->n);
    dsgd__ckw_end(w);
}

/* The parsed "optimizer" section. */
typedef struct dsgd__ck_opt {
    uint32_t kind, nslots;
    int64_t t;
    double last_norm;
    const unsigned char *slots; /* nslots x params floats */
} dsgd__ck_opt;

static const char *dsgd__opt_kind_text(uint32_t k) {
    static const char *const names[] = {"SGD", "MOMENTUM", "ADAM", "ADAMW"};
    return k < 4 ? names[k] : "unknown";
}

static dsgd_result dsgd__ck_check_optimizer(const dsgd__ck_file *f, const dsgd__ck_vars *v, dsgd__ck_opt *out) {
    const dsgd__ck_section *s = dsgd__ck_need(f, "optimizer", "the optimizer");
    const dsgd__opt_run *o = v->opt;
    dsgd__ck_cur c;
    uint64_t np, t;
    if (!s) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(s);
    out->kind = dsgd__ckr_u32(&c);
    t = dsgd__ckr_u64(&c);
    out->last_norm = dsgd__ckr_f64(&c);
    out->nslots = dsgd__ckr_u32(&c);
    np = dsgd__ckr_u64(&c);
    if (c.bad) return dsgd__ck_bad_section(f, s, "cut short");
    if (t > (uint64_t)INT64_MAX) return dsgd__ck_bad_section(f, s, "a negative step count");
    out->t = (int64_t)t;
    if (out->nslots > 2 || np != (uint64_t)v->n || c.left != (size_t)out->nslots * v->n * sizeof(float))
        return dsgd__ck_bad_section(f, s, "slots of the wrong size");
    if (out->kind != (uint32_t)o->st.d.kind || (int)out->nslots != dsgd__opt_state_slots(&o->st))
        return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                  "%s: %s: the checkpoint holds the state of a %s optimizer, this one is %s", f->what,
                                  f->path, dsgd__opt_kind_text(out->kind), dsgd__opt_kind_text((uint32_t)o->st.d.kind));
    out->slots = c.p;
    return DSGD_OK;
}

static dsgd_result dsgd__ck_apply_optimizer(const dsgd__ck_file *f, const dsgd__ck_vars *v, const dsgd__ck_opt *st) {
    uint32_t k;
    dsgd_result r = DSGD_OK;
    for (k = 0; k < st->nslots && r == DSGD_OK; ++k)
        r = dsgd__ck_write_buffer(v, f->what, dsgd__ref(v->opt->st.slot[k], 0), st->slots + (size_t)k * v->n * sizeof(float),
                                  v->n);
    if (r == DSGD_OK) {
        v->opt->t = st->t;
        v->opt->last_norm = st->last_norm;
    }
    return r;
}

/* "metrics": each replica's accumulators (train loss, correct, eval loss,
   correct as floats; train and eval counts as doubles). */
#define DSGD__CK_METRICS_BYTES 32
#define DSGD__CK_MAX_RECORDS 65536

/* One replica's accumulators, as the record holds them. */
typedef struct dsgd__ck_mrec {
    float st[4];
    double count[2];
} dsgd__ck_mrec;

/* Reads model m's accumulators (a custom model's host part folded in first). */
static dsgd_result dsgd__ck_mrec_get(dsgd_model *m, dsgd__ck_mrec *out) {
    return dsgd__model_read_accumulators(m, out->st, out->count);
}

static void dsgd__ckw_mrec(dsgd__ck_writer *w, const dsgd__ck_mrec *rec) {
    dsgd__ckw_floats(w, rec->st, 4);
    dsgd__ckw_f64(w, rec->count[0]);
    dsgd__ckw_f64(w, rec->count[1]);
}

static void dsgd__ck_put_metrics(dsgd__ck_writer *w, dsgd_model *const *models, int n) {
    int r;
    dsgd__ckw_begin(w, "metrics");
    dsgd__ckw_u32(w, (uint32_t)n);
    for (r = 0; r < n; ++r) {
        dsgd__ck_mrec rec;
        dsgd_result fr = dsgd__ck_mrec_get(models[r], &rec);
        if (fr != DSGD_OK && w->res == DSGD_OK) w->res = fr;
        dsgd__ckw_mrec(w, &rec);
    }
    dsgd__ckw_end(w);
}

/* Validates "metrics"; *records gets where its records start, *saved their number. */
static dsgd_result dsgd__ck_check_metrics(const dsgd__ck_file *f, const unsigned char **records, uint32_t *saved) {
    const dsgd__ck_section *s = dsgd__ck_need(f, "metrics", "the metrics");
    dsgd__ck_cur c;
    if (!s) return DSGD_ERR_SHAPE;
    c = dsgd__ck_cursor(s);
    *saved = dsgd__ckr_u32(&c);
    if (c.bad || *saved == 0 || *saved > DSGD__CK_MAX_RECORDS || c.left != (size_t)*saved * DSGD__CK_METRICS_BYTES)
        return dsgd__ck_bad_section(f, s, "not 1..65536 records of 32 bytes");
    *records = c.p;
    return DSGD_OK;
}

/* Writes the saved accumulators into n models, global replicas first ..
   first + n - 1 of world: record first + r into model r when the counts
   agree; otherwise their sums (in record order) into global replica 0's
   model, and zeros into the others. */
static dsgd_result dsgd__ck_apply_metrics(const unsigned char *records, uint32_t saved, dsgd_model *const *models,
                                          int n, int first, int world) {
    int r, k;
    dsgd_result res = DSGD_OK;
    for (r = 0; r < n && res == DSGD_OK; ++r) {
        float st[4] = {0, 0, 0, 0};
        double cnt[2] = {0, 0};
        uint32_t lo = (uint32_t)(first + r), hi = lo + 1, i;
        dsgd__ck_cur c;
        if ((uint32_t)world != saved) lo = 0, hi = first + r == 0 ? saved : 0;
        for (i = lo; i < hi; ++i) {
            float v[4];
            c.p = records + (size_t)i * DSGD__CK_METRICS_BYTES;
            c.left = DSGD__CK_METRICS_BYTES;
            c.bad = 0;
            dsgd__ck_copy_floats(v, dsgd__ck_take(&c, 16), 4);
            for (k = 0; k < 4; ++k) st[k] += v[k];
            cnt[0] += dsgd__ckr_f64(&c);
            cnt[1] += dsgd__ckr_f64(&c);
        }
        res = dsgd__model_write_accumulators(models[r], st, cnt);
    }
    return res;
}

/* "sampler" and "user": the caller's extra state. */
static void dsgd__ck_put_extra(dsgd__ck_writer *w, const dsgd_checkpoint_extra *x) {
    unsigned char *p;
    if (!x) return;
    if (x->sampler) {
        const dsgd_sampler *s = x->sampler;
        dsgd__ckw_begin(w, "sampler");
        dsgd__ckw_u64(w, (uint64_t)s->n);
        dsgd__ckw_u64(w, (uint64_t)s->batch);
        dsgd__ckw_u64(w, s->seed);
        dsgd__ckw_u32(w, (uint32_t)(s->shuffle != 0));
        dsgd__ckw_u32(w, (uint32_t)(s->drop_last != 0));
        dsgd__ckw_u64(w, s->epoch);
        dsgd__ckw_u64(w, (uint64_t)s->cursor);
        dsgd__ckw_end(w);
    }
    if (x->user_bytes > 0) {
        dsgd__ckw_begin(w, "user");
        if ((p = dsgd__ckw_grow(w, x->user_bytes))) memcpy(p, x->user, x->user_bytes);
        dsgd__ckw_end(w);
    }
}

/* The sampler's saved position. */
typedef struct dsgd__ck_pos {
    uint64_t epoch, cursor;
} dsgd__ck_pos;

static dsgd_result dsgd__ck_check_extra(const dsgd__ck_file *f, const dsgd_checkpoint_extra *x, dsgd__ck_pos *pos) {
    const dsgd__ck_section *s;
    if (!x) return DSGD_OK;
    if (x->sampler) {
        const dsgd_sampler *smp = x->sampler;
        uint64_t n, seed;
        uint32_t shuffle;
        dsgd__ck_cur c;
        if (!(s = dsgd__ck_need(f, "sampler", "the sampler"))) return DSGD_ERR_SHAPE;
        c = dsgd__ck_cursor(s);
        n = dsgd__ckr_u64(&c);
        (void)dsgd__ckr_u64(&c); /* the batch then; it may differ now */
        seed = dsgd__ckr_u64(&c);
        shuffle = dsgd__ckr_u32(&c);
        (void)dsgd__ckr_u32(&c); /* drop_last then */
        pos->epoch = dsgd__ckr_u64(&c);
        pos->cursor = dsgd__ckr_u64(&c);
        if (c.bad || c.left != 0 || shuffle > 1 || pos->cursor > n)
            return dsgd__ck_bad_section(f, s, "not a sampler's position");
        if (!smp->order || n != (uint64_t)smp->n || seed != smp->seed || shuffle != (uint32_t)(smp->shuffle != 0))
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE,
                                      "%s: %s: the checkpoint's sampler has %llu samples, seed %llu, shuffle %u; this "
                                      "one %zu, %llu, %d (initialise it as the saved run did)",
                                      f->what, f->path, (unsigned long long)n, (unsigned long long)seed,
                                      (unsigned)shuffle, smp->n, (unsigned long long)smp->seed, smp->shuffle != 0);
    }
    if (x->user_bytes > 0) {
        if (!(s = dsgd__ck_need(f, "user", "the user section"))) return DSGD_ERR_SHAPE;
        if (s->size != x->user_bytes)
            return dsgd_ctx_set_error(f->ctx, DSGD_ERR_SHAPE, "%s: %s: the checkpoint's user section has %zu bytes, not %zu",
                                      f->what, f->path, s->size, x->user_bytes);
    }
    return DSGD_OK;
}

static void dsgd__ck_apply_extra(const dsgd__ck_file *f, const dsgd_checkpoint_extra *x, const dsgd__ck_pos *pos) {
    if (!x) return;
    if (x->sampler) {
        dsgd_sampler_set_epoch(x->sampler, pos->epoch);
        x->sampler->cursor = (size_t)pos->cursor;
    }
    if (x->user_bytes > 0) memcpy(x->user, dsgd__ck_find(f, "user")->data, x->user_bytes);
}

/* The arguments every save and restore share. */
static dsgd_result dsgd__ck_check_args(dsgd_ctx *ctx, const char *what, const char *path,
                                       const dsgd_checkpoint_extra *x) {
    if (!path || !*path) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: path is NULL or empty", what);
    if (x && x->user_bytes > 0 && !x->user)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: extra->user is NULL with user_bytes %zu", what,
                                  x->user_bytes);
    if (x && x->sampler && !x->sampler->order)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s: extra->sampler is not initialised", what);
    return DSGD_OK;
}

/* As dsgd__ck_check_args, for a model and its optimizer (opt may be NULL). */
static dsgd_result dsgd__ck_model_args(dsgd_model *m, const dsgd_optimizer *opt, const char *what, const char *path,
                                       const dsgd_checkpoint_extra *x) {
    dsgd_result r = dsgd__ck_check_args(dsgd_model_ctx(m), what, path, x);
    if (r == DSGD_OK && opt && dsgd_optimizer_model(opt) != m)
        r = dsgd_ctx_set_error(dsgd_model_ctx(m), DSGD_ERR_INVALID_ARGUMENT, "%s: the optimizer belongs to another model", what);
    return r;
}

/* The model-level sections of a checkpoint, checked against a model's
   layout, the variables v (their optimizer may be NULL) and extra: what
   the apply functions then write. */
typedef struct dsgd__ck_state {
    dsgd__ck_opt opt;
    dsgd__ck_pos pos;
    const unsigned char *metrics; /* the records */
    uint32_t replicas;            /* their number */
} dsgd__ck_state;

static dsgd_result dsgd__ck_check_state(const dsgd__ck_file *f, const dsgd_model *m, const dsgd__ck_vars *v,
                                        const dsgd_checkpoint_extra *extra, dsgd__ck_state *st) {
    dsgd_result r;
    if ((r = dsgd__ck_check_model(f, m)) != DSGD_OK || (r = dsgd__ck_check_params(f, v->n)) != DSGD_OK ||
        (v->opt && (r = dsgd__ck_check_optimizer(f, v, &st->opt)) != DSGD_OK) ||
        (r = dsgd__ck_check_metrics(f, &st->metrics, &st->replicas)) != DSGD_OK)
        return r;
    return dsgd__ck_check_extra(f, extra, &st->pos);
}

/* >>ck_api ------------------------------------------------------------------ */

DSGD_API dsgd_result dsgd_model_save(dsgd_model *m, dsgd_optimizer *opt, const char *path,
                                     const dsgd_checkpoint_extra *extra) {
    const char *what = "dsgd_model_save";
    dsgd__ck_vars v;
    dsgd__ck_writer w;
    dsgd_result r;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ck_model_args(m, opt, what, path, extra)) != DSGD_OK) return r;
    dsgd__ckw_init(&w, dsgd_model_ctx(m), what,
                   dsgd__ck_expect(m, dsgd_optimizer_num_slots(opt), extra ? extra->user_bytes : 0));
    dsgd__ck_put_model(&w, m);
    v = dsgd__ck_vars_of(m, opt);
    dsgd__ck_put_params(&w, &v);
    if (opt) dsgd__ck_put_optimizer(&w, &v);
    dsgd__ck_put_metrics(&w, &m, 1);
    dsgd__ck_put_extra(&w, extra);
    return dsgd__ckw_commit(&w, path);
}

/* Checks the parsed checkpoint f against m, opt and extra, then restores it. */
static dsgd_result dsgd__model_restore_from(const dsgd__ck_file *f, dsgd_model *m, dsgd_optimizer *opt,
                                            const dsgd_checkpoint_extra *extra) {
    dsgd__ck_vars v = dsgd__ck_vars_of(m, opt);
    dsgd__ck_state st;
    dsgd_result r;
    if ((r = dsgd__ck_check_state(f, m, &v, extra, &st)) != DSGD_OK) return r;
    /* everything checked: now write */
    r = dsgd__ck_apply_params(f, &v);
    if (r == DSGD_OK && opt) r = dsgd__ck_apply_optimizer(f, &v, &st.opt);
    if (r == DSGD_OK) r = dsgd__ck_apply_metrics(st.metrics, st.replicas, &m, 1, 0, 1);
    if (r == DSGD_OK) dsgd__ck_apply_extra(f, extra, &st.pos);
    return r;
}

DSGD_API dsgd_result dsgd_model_restore(dsgd_model *m, dsgd_optimizer *opt, const char *path,
                                        const dsgd_checkpoint_extra *extra) {
    const char *what = "dsgd_model_restore";
    dsgd__ck_file f;
    dsgd_result r;
    if (!m) return DSGD_ERR_INVALID_ARGUMENT;
    if ((r = dsgd__ck_model_args(m, opt, what, path, extra)) != DSGD_OK) return r;
    if ((r = dsgd__ck_open(&f, dsgd_model_ctx(m), what, path)) == DSGD_OK)
        r = dsgd__model_restore_from(&f, m, opt, extra);
    dsgd__ck_close(&f);
    return r;
}

DSGD_API dsgd_result dsgd_checkpoint_verify(dsgd_ctx *ctx, const char *path) {
    dsgd__ck_file f;
    dsgd_result r = dsgd__ck_open(&f, ctx, "dsgd_checkpoint_verify", path);
    dsgd__ck_close(&f);
    return r;
}

#endif /* DSGD__PART_CHECKPOINT_IMPL */
