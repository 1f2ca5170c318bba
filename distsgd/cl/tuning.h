/* distsgd/cl/tuning.h - GEMM tuning: parameters, measurement, the per-device cache
   Part of distsgd's OpenCL add-on (see ../../distsgd_cl.h, which includes the parts in order).

   GEMM TUNING

     CLBlast's stock GEMM parameters are tuned for known GPUs; on other devices
     (PoCL on a CPU above all) they can be several times slower than good ones.
     tools/cl_tune searches CLBlast's Xgemm parameters (register-tiled
     candidates made for the device's float vector width,
     dsgd_cl_device_info.vector_width, among them) and the size below which
     CLBlast's single-kernel "direct" GEMM is used (XGEMM_MIN_INDIRECT_SIZE),
     at the shapes a model uses, within a time bound. It times candidates
     with dsgd_cl_gemm_measure (back-to-back GEMMs with one finish per
     sample, as in a training step), checks every candidate's results, and
     writes the winner to a per-device cache file:

         $DSGD_CL_TUNE_CACHE            a file, or a directory (ends with '/'
                                        or exists as one)
         else $XDG_CACHE_HOME/distsgd/  else ~/.cache/distsgd/
         file: clblast-gemm-<device>-<hash of platform, device, driver>.txt

     dsgd_cl_context_desc.tune_cache overrides the environment. At context
     creation each device's file is read and applied with
     CLBlastOverrideParameters. A file that is missing, unreadable, corrupt or
     made for another device (platform name, device name and driver version are
     compared) leaves CLBlast's defaults in place and logs a DSGD_LOG_WARN
     message saying why; desc.tuning = DSGD_CL_TUNING_OFF skips the file
     (no warning). Overrides are process-wide per device (CLBlast keeps them
     in a global table and has no call to undo them), so once a context has
     applied tuned parameters, later contexts on that device in the same
     process use them too.

   COLD START (PoCL)

     CLBlast compiles its GEMM kernels on the first call with a given set of
     parameters: about 7 s per routine on PoCL, then ~40 ms from PoCL's
     on-disk kernel cache. POCL_CACHE_DIR must name a writable directory, or
     PoCL drops the device silently (POCL_DEBUG=err says why); our own kernels
     are built once per context and cached by PoCL the same way. Each tuning
     candidate is a new compile, which is what bounds the tuner's speed.
*/
#ifndef DSGD_CL__PART_TUNING_DECL
#define DSGD_CL__PART_TUNING_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- GEMM tuning */

#define DSGD_CL_XGEMM_NPARAMS 16
#define DSGD_CL_DIRECT_NPARAMS 10

/* A set of CLBlast GEMM parameters for one device (single precision). */
typedef struct dsgd_cl_gemm_params {
    int xgemm_set; /* non-zero: xgemm[] holds Xgemm's parameters in the order of
                      dsgd_cl_xgemm_param_name(): GEMMK KREG KWG KWI MDIMA MDIMC
                      MWG NDIMB NDIMC NWG SA SB STRM STRN VWM VWN */
    size_t xgemm[DSGD_CL_XGEMM_NPARAMS];
    int direct_set; /* XgemmDirect: KWID MDIMAD MDIMCD NDIMBD NDIMCD PADA PADB
                       VWMD VWND WGD */
    size_t direct[DSGD_CL_DIRECT_NPARAMS];
    int min_indirect_set; /* GemmRoutine's XGEMM_MIN_INDIRECT_SIZE: GEMMs with
                             m*n*k below its cube use the direct kernel */
    size_t min_indirect;
} dsgd_cl_gemm_params;

/* Parameter names ("GEMMK", ...; "KWID", ...), NULL when i is out of range.
   Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_cl_xgemm_param_name(int i);
DSGD_API const char *dsgd_cl_direct_param_name(int i);
/* Checks the divisibility rules CLBlast's kernels need, and the limits of
   its GEMMK=1 kernel found by testing (square tiles of 16 or more); a
   rejected set would fail to build, crash or compute wrong results.
   Returns 1 when valid, 0 otherwise (and for p NULL).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cl_gemm_params_valid(const dsgd_cl_gemm_params *p);

/* Applies p to device i of c with CLBlastOverrideParameters (the parts whose
   *_set is non-zero) and marks the device tuned (dsgd_cl_context_gemm_tuned).
   Process-wide for that device; takes effect at the next GEMM (which
   compiles the kernels for the new parameters).
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c or p NULL, device
   out of range, a set dsgd_cl_gemm_params_valid rejects), DSGD_ERR_BACKEND
   (CLBlast refused; parts applied before stay applied).
   Thread safety: any thread (that may use ctx); CLBlast calls are
   serialised by the library's lock, but not concurrently with another
   apply on c or with dsgd_cl_context_gemm_tuned. */
DSGD_API dsgd_result dsgd_cl_apply_gemm_params(dsgd_ctx *ctx, dsgd_cl_context *c, int device,
                                               const dsgd_cl_gemm_params *p);
/* The tuning cache file for device i: desc_path, else $DSGD_CL_TUNE_CACHE,
   taken as is when it names a file, or a directory (it ends with '/' or
   exists as one) that gets the device's file name; else that name in
   $XDG_CACHE_HOME/distsgd (when absolute) or ~/.cache/distsgd. Writes it,
   NUL-terminated, to buf.
   Errors (nothing recorded: no context): DSGD_ERR_INVALID_ARGUMENT (c NULL
   or no device i, buf NULL or cap 0, no HOME and no absolute
   XDG_CACHE_HOME, a path that does not fit in buf).
   Thread safety: any thread (it reads the environment). */
DSGD_API dsgd_result dsgd_cl_tune_cache_path(const dsgd_cl_context *c, int device,
                                             const char *desc_path, char *buf, size_t cap);
/* Reads a cache file and checks that it was made for device i of c; *out is
   zeroed on failure.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c NULL or no device
   i, path or out NULL), DSGD_ERR_IO (cannot open), DSGD_ERR_FORMAT (corrupt,
   a read error or parameters dsgd_cl_gemm_params_valid rejects: with the
   line and what is wrong), DSGD_ERR_STATE (made for another device: the
   message names both).
   Thread safety: any thread (that may use ctx). */
DSGD_API dsgd_result dsgd_cl_load_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device,
                                              const char *path, dsgd_cl_gemm_params *out);
/* Writes a cache file for device i (creating missing directories),
   atomically (path.tmp, then rename). note, if non-NULL, is stored as a
   comment line.
   Errors (recorded on ctx): DSGD_ERR_INVALID_ARGUMENT (c NULL or no device
   i, path or p NULL, a path of 1024 bytes or more, a set
   dsgd_cl_gemm_params_valid rejects), DSGD_ERR_IO (a directory, the file or
   the rename failed).
   Thread safety: any thread (that may use ctx); two writers of one path at
   once race on path.tmp. */
DSGD_API dsgd_result dsgd_cl_save_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device,
                                              const char *path, const dsgd_cl_gemm_params *p,
                                              const char *note);

/* One GEMM shape: C(m,n) = op(A)(m,k) op(B)(k,n), row-major, dense. */
typedef struct dsgd_cl_gemm_shape {
    int trans_a, trans_b;
    int m, n, k;
} dsgd_cl_gemm_shape;

/* The GEMMs of one training step of the 784-512-512-10 MLP at batch 256, plus
   the first layer's input gradient (256x784x512 NT): forward NN, weight
   gradient TN, input gradient NT per layer. Copies up to cap shapes into out
   (out may be NULL) and returns how many there are (9).
   Errors: none. Thread safety: any thread. */
DSGD_API int dsgd_cl_mlp_gemm_shapes(dsgd_cl_gemm_shape *out, int cap);

/* Times b's gemm at each shape: one warm-up call (which compiles), one
   timed call that sizes the samples, then `repeats` samples, each the mean
   time per call of back-to-back calls with one finish at the end, as many
   as last about 10 ms (at most 1000), as in a training step whose queue
   stays full; median_s[i] gets the median sample, in seconds per call.
   When max_rel_err is non-NULL the warm-up result is checked against a
   double-precision host product on seeded random inputs and *max_rel_err is
   the largest |C - ref| / sum_k |a||b| over all shapes (NaN when any
   entry is NaN). b may be any backend.
   Errors: DSGD_ERR_INVALID_ARGUMENT (b, shapes or median_s NULL, num_shapes
   or repeats < 1, a shape with m, n or k < 1) and DSGD_ERR_OUT_OF_MEMORY,
   recorded on ctx; backend errors, recorded on b's context.
   Thread safety: b's thread. */
DSGD_API dsgd_result dsgd_cl_gemm_measure(dsgd_ctx *ctx, const dsgd_backend_i *b,
                                          const dsgd_cl_gemm_shape *shapes, int num_shapes,
                                          int repeats, double *median_s, double *max_rel_err);

#ifdef __cplusplus
}
#endif

#endif /* DSGD_CL__PART_TUNING_DECL */

#if defined(DISTSGD_CL_IMPLEMENTATION) && !defined(DSGD_CL__PART_TUNING_IMPL)
#define DSGD_CL__PART_TUNING_IMPL

/* >>tuning ------------------------------------------------------------------ */

static const char *const dsgd_cl__xgemm_names[DSGD_CL_XGEMM_NPARAMS] = {
    "GEMMK", "KREG", "KWG", "KWI", "MDIMA", "MDIMC", "MWG", "NDIMB",
    "NDIMC", "NWG",  "SA",  "SB",  "STRM",  "STRN",  "VWM", "VWN"};
static const char *const dsgd_cl__direct_names[DSGD_CL_DIRECT_NPARAMS] = {
    "KWID", "MDIMAD", "MDIMCD", "NDIMBD", "NDIMCD", "PADA", "PADB", "VWMD", "VWND", "WGD"};

enum {
    DSGD_CL__GEMMK = 0, DSGD_CL__KREG, DSGD_CL__KWG, DSGD_CL__KWI, DSGD_CL__MDIMA, DSGD_CL__MDIMC,
    DSGD_CL__MWG, DSGD_CL__NDIMB, DSGD_CL__NDIMC, DSGD_CL__NWG, DSGD_CL__SA, DSGD_CL__SB,
    DSGD_CL__STRM, DSGD_CL__STRN, DSGD_CL__VWM, DSGD_CL__VWN
};
enum {
    DSGD_CL__KWID = 0, DSGD_CL__MDIMAD, DSGD_CL__MDIMCD, DSGD_CL__NDIMBD, DSGD_CL__NDIMCD,
    DSGD_CL__PADA, DSGD_CL__PADB, DSGD_CL__VWMD, DSGD_CL__VWND, DSGD_CL__WGD
};

DSGD_API const char *dsgd_cl_xgemm_param_name(int i) {
    return i >= 0 && i < DSGD_CL_XGEMM_NPARAMS ? dsgd_cl__xgemm_names[i] : NULL;
}

DSGD_API const char *dsgd_cl_direct_param_name(int i) {
    return i >= 0 && i < DSGD_CL_DIRECT_NPARAMS ? dsgd_cl__direct_names[i] : NULL;
}

static int dsgd_cl__pow2(size_t v) { return v >= 1 && v <= 1024 && (v & (v - 1)) == 0; }

DSGD_API int dsgd_cl_gemm_params_valid(const dsgd_cl_gemm_params *p) {
    if (!p) return 0;
    if (p->xgemm_set) {
        const size_t *x = p->xgemm;
        int i;
        static const int pow2_params[] = {DSGD_CL__KWG, DSGD_CL__KWI, DSGD_CL__MDIMA, DSGD_CL__MDIMC,
                                          DSGD_CL__MWG, DSGD_CL__NDIMB, DSGD_CL__NDIMC, DSGD_CL__NWG,
                                          DSGD_CL__VWM, DSGD_CL__VWN, DSGD_CL__KREG};
        for (i = 0; i < (int)(sizeof(pow2_params) / sizeof(pow2_params[0])); ++i)
            if (!dsgd_cl__pow2(x[pow2_params[i]])) return 0;
        if (x[DSGD_CL__GEMMK] > 1 || x[DSGD_CL__SA] > 1 || x[DSGD_CL__SB] > 1 || x[DSGD_CL__STRM] > 1 ||
            x[DSGD_CL__STRN] > 1 || x[DSGD_CL__VWM] > 16 || x[DSGD_CL__VWN] > 16)
            return 0;
        if (x[DSGD_CL__KWG] % x[DSGD_CL__KWI]) return 0;
        if (x[DSGD_CL__MWG] % (x[DSGD_CL__MDIMC] * x[DSGD_CL__VWM])) return 0;
        if (x[DSGD_CL__NWG] % (x[DSGD_CL__NDIMC] * x[DSGD_CL__VWN])) return 0;
        if (x[DSGD_CL__MWG] % (x[DSGD_CL__MDIMA] * x[DSGD_CL__VWM])) return 0;
        if (x[DSGD_CL__NWG] % (x[DSGD_CL__NDIMB] * x[DSGD_CL__VWN])) return 0;
        if (x[DSGD_CL__GEMMK] == 0) {
            size_t t = x[DSGD_CL__MDIMC] * x[DSGD_CL__NDIMC];
            if (t % x[DSGD_CL__MDIMA] || t % x[DSGD_CL__NDIMB]) return 0;
            if (x[DSGD_CL__KWG] % (t / x[DSGD_CL__MDIMA]) || x[DSGD_CL__KWG] % (t / x[DSGD_CL__NDIMB])) return 0;
        } else {
            if (x[DSGD_CL__KREG] % x[DSGD_CL__VWN]) return 0;
            if (x[DSGD_CL__MDIMA] != x[DSGD_CL__MDIMC] || x[DSGD_CL__NDIMB] != x[DSGD_CL__NDIMC]) return 0;
            /* CLBlast 1.5.3's GEMMK=1 path computes wrong values on padded
               (non-multiple) sizes unless the tile is square, and crashes
               with tiles below 16 (found by tools/cl_tune's checks on PoCL) */
            if (x[DSGD_CL__MWG] != x[DSGD_CL__NWG] || x[DSGD_CL__MWG] < 16) return 0;
        }
    }
    if (p->direct_set) {
        const size_t *x = p->direct;
        int i;
        for (i = 0; i < DSGD_CL_DIRECT_NPARAMS; ++i) {
            if (i == DSGD_CL__PADA || i == DSGD_CL__PADB) {
                if (x[i] > 1) return 0;
            } else if (!dsgd_cl__pow2(x[i])) {
                return 0;
            }
        }
        if (x[DSGD_CL__WGD] % x[DSGD_CL__KWID]) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__MDIMCD] * x[DSGD_CL__VWMD])) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__NDIMCD] * x[DSGD_CL__VWND])) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__MDIMAD] * x[DSGD_CL__VWMD])) return 0;
        if (x[DSGD_CL__WGD] % (x[DSGD_CL__NDIMBD] * x[DSGD_CL__VWND])) return 0;
        {
            size_t t = x[DSGD_CL__MDIMCD] * x[DSGD_CL__NDIMCD];
            if (t % x[DSGD_CL__MDIMAD] || t % x[DSGD_CL__NDIMBD]) return 0;
            if (x[DSGD_CL__WGD] % (t / x[DSGD_CL__MDIMAD]) || x[DSGD_CL__WGD] % (t / x[DSGD_CL__NDIMBD])) return 0;
        }
    }
    if (p->min_indirect_set && p->min_indirect > 100000) return 0;
    return 1;
}

DSGD_API dsgd_result dsgd_cl_apply_gemm_params(dsgd_ctx *ctx, dsgd_cl_context *c, int device,
                                               const dsgd_cl_gemm_params *p) {
    CLBlastStatusCode st;
    if (!c || !p || device < 0 || device >= c->num_devices)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_apply_gemm_params: bad arguments");
    if (!dsgd_cl_gemm_params_valid(p))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_apply_gemm_params: the parameters break CLBlast's rules");
    if (p->xgemm_set) {
        pthread_mutex_lock(&dsgd_cl__clblast_lock);
        st = CLBlastOverrideParameters(c->devices[device], "Xgemm", CLBlastPrecisionSingle, DSGD_CL_XGEMM_NPARAMS,
                                       (const char **)dsgd_cl__xgemm_names, p->xgemm);
        pthread_mutex_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "Xgemm");
    }
    if (p->direct_set) {
        pthread_mutex_lock(&dsgd_cl__clblast_lock);
        st = CLBlastOverrideParameters(c->devices[device], "XgemmDirect", CLBlastPrecisionSingle,
                                       DSGD_CL_DIRECT_NPARAMS, (const char **)dsgd_cl__direct_names, p->direct);
        pthread_mutex_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "XgemmDirect");
    }
    if (p->min_indirect_set) {
        const char *name[1];
        size_t v[1];
        name[0] = "XGEMM_MIN_INDIRECT_SIZE";
        v[0] = p->min_indirect;
        pthread_mutex_lock(&dsgd_cl__clblast_lock);
        st = CLBlastOverrideParameters(c->devices[device], "GemmRoutine", CLBlastPrecisionSingle, 1, name, v);
        pthread_mutex_unlock(&dsgd_cl__clblast_lock);
        if (st != CLBlastSuccess) return dsgd_cl__fail(ctx, (int)st, "CLBlastOverrideParameters", "GemmRoutine");
    }
    if (p->xgemm_set || p->direct_set || p->min_indirect_set) c->tuned[device] = 1;
    return DSGD_OK;
}

/* FNV-1a, 64-bit: names the cache file after the device's identity. */
static uint64_t dsgd_cl__fnv(uint64_t h, const char *s) {
    if (h == 0) h = 1469598103934665603ull;
    for (; *s; ++s) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    h ^= 0xff; /* field separator */
    h *= 1099511628211ull;
    return h;
}

static int dsgd_cl__is_dir(const char *path) {
    struct stat st;
    size_t n = strlen(path);
    if (n > 0 && path[n - 1] == '/') return 1;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

DSGD_API dsgd_result dsgd_cl_tune_cache_path(const dsgd_cl_context *c, int device, const char *desc_path,
                                             char *buf, size_t cap) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(c, device);
    const char *base = desc_path, *sep;
    char dir[1024], name[96];
    uint64_t h;
    size_t j = 0;
    const char *s;
    int k;
    if (!info || !buf || cap == 0) return DSGD_ERR_INVALID_ARGUMENT;
    buf[0] = '\0';
    if (!base || !*base) base = getenv("DSGD_CL_TUNE_CACHE");
    if (base && *base && !dsgd_cl__is_dir(base)) {
        k = snprintf(buf, cap, "%s", base);
        return (k < 0 || (size_t)k >= cap) ? DSGD_ERR_INVALID_ARGUMENT : DSGD_OK;
    }
    if (base && *base) {
        k = snprintf(dir, sizeof(dir), "%s", base);
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && xdg[0] == '/')
            k = snprintf(dir, sizeof(dir), "%s/distsgd", xdg);
        else if (home && *home)
            k = snprintf(dir, sizeof(dir), "%s/.cache/distsgd", home);
        else
            return DSGD_ERR_INVALID_ARGUMENT;
    }
    if (k < 0 || (size_t)k >= sizeof(dir)) return DSGD_ERR_INVALID_ARGUMENT;
    /* a readable slug of the device name, then a hash of its identity */
    for (s = info->device_name; *s && j < 40; ++s) {
        char ch = *s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '.' || ch == '-')
            name[j++] = ch;
        else if (ch >= 'A' && ch <= 'Z')
            name[j++] = (char)(ch - 'A' + 'a');
        else if (j > 0 && name[j - 1] != '_')
            name[j++] = '_';
    }
    name[j] = '\0';
    h = dsgd_cl__fnv(0, info->platform_name);
    h = dsgd_cl__fnv(h, info->device_name);
    h = dsgd_cl__fnv(h, info->driver_version);
    sep = (dir[0] && dir[strlen(dir) - 1] == '/') ? "" : "/";
    k = snprintf(buf, cap, "%s%sclblast-gemm-%s-%08lx%08lx.txt", dir, sep, name,
                 (unsigned long)(h >> 32), (unsigned long)(h & 0xffffffffu));
    return (k < 0 || (size_t)k >= cap) ? DSGD_ERR_INVALID_ARGUMENT : DSGD_OK;
}

#define DSGD_CL__CACHE_MAGIC "distsgd-clblast-gemm-cache 1"

/* Parses "NAME=VALUE NAME=VALUE ..." into vals[] following names[]; every
   name exactly once. */
static int dsgd_cl__parse_kv(const char *s, const char *const *names, int count, size_t *vals) {
    int seen[32], i, total = 0;
    memset(seen, 0, sizeof(seen));
    while (*s) {
        const char *eq, *end;
        size_t n;
        unsigned long v = 0;
        int digits = 0;
        while (*s == ' ') ++s;
        if (!*s) break;
        eq = strchr(s, '=');
        if (!eq) return 0;
        n = (size_t)(eq - s);
        for (i = 0; i < count; ++i)
            if (strlen(names[i]) == n && strncmp(names[i], s, n) == 0) break;
        if (i == count || seen[i]) return 0;
        for (end = eq + 1; *end >= '0' && *end <= '9'; ++end) {
            if (++digits > 6) return 0;
            v = v * 10 + (unsigned long)(*end - '0');
        }
        if (digits == 0 || (*end != ' ' && *end != '\0')) return 0;
        vals[i] = (size_t)v;
        seen[i] = 1;
        ++total;
        s = end;
    }
    return total == count;
}

DSGD_API dsgd_result dsgd_cl_load_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device, const char *path,
                                              dsgd_cl_gemm_params *out) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(c, device);
    FILE *f;
    char line[1024], plat[DSGD_CL_MAX_NAME], dev[DSGD_CL_MAX_NAME], drv[DSGD_CL_MAX_NAME];
    int lineno = 0, have_end = 0, have_plat = 0, have_dev = 0, have_drv = 0;
    dsgd_cl_gemm_params p;
    if (!info || !path || !out)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_load_gemm_params: bad arguments");
    memset(&p, 0, sizeof(p));
    memset(out, 0, sizeof(*out));
    f = fopen(path, "r");
    if (!f) return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
#define DSGD_CL__BAD(why)                                                                         \
    do {                                                                                          \
        fclose(f);                                                                                \
        return dsgd_ctx_set_error(ctx, DSGD_ERR_FORMAT, "%s:%d: %s", path, lineno, why);          \
    } while (0)
    while (fgets(line, sizeof(line), f)) {
        size_t n = strlen(line);
        ++lineno;
        if (n == sizeof(line) - 1 && line[n - 1] != '\n') DSGD_CL__BAD("line too long");
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (have_end) {
            if (n) DSGD_CL__BAD("text after 'end'");
            continue;
        }
        if (lineno == 1) {
            if (strcmp(line, DSGD_CL__CACHE_MAGIC) != 0)
                DSGD_CL__BAD("not a distsgd CLBlast tuning file (first line is not '" DSGD_CL__CACHE_MAGIC "')");
            continue;
        }
        if (n == 0 || line[0] == '#') continue;
        if (strncmp(line, "platform ", 9) == 0) {
            dsgd_cl__copy_str(plat, sizeof(plat), line + 9);
            have_plat = 1;
        } else if (strncmp(line, "device ", 7) == 0) {
            dsgd_cl__copy_str(dev, sizeof(dev), line + 7);
            have_dev = 1;
        } else if (strncmp(line, "driver ", 7) == 0) {
            dsgd_cl__copy_str(drv, sizeof(drv), line + 7);
            have_drv = 1;
        } else if (strncmp(line, "clblast ", 8) == 0) {
            /* informational */
        } else if (strncmp(line, "Xgemm ", 6) == 0) {
            if (p.xgemm_set || !dsgd_cl__parse_kv(line + 6, dsgd_cl__xgemm_names, DSGD_CL_XGEMM_NPARAMS, p.xgemm))
                DSGD_CL__BAD("bad Xgemm line (want each of GEMMK KREG KWG KWI MDIMA MDIMC MWG NDIMB NDIMC NWG SA SB "
                             "STRM STRN VWM VWN once, as NAME=VALUE)");
            p.xgemm_set = 1;
        } else if (strncmp(line, "XgemmDirect ", 12) == 0) {
            if (p.direct_set ||
                !dsgd_cl__parse_kv(line + 12, dsgd_cl__direct_names, DSGD_CL_DIRECT_NPARAMS, p.direct))
                DSGD_CL__BAD("bad XgemmDirect line");
            p.direct_set = 1;
        } else if (strncmp(line, "GemmRoutine ", 12) == 0) {
            static const char *const mi[1] = {"XGEMM_MIN_INDIRECT_SIZE"};
            if (p.min_indirect_set || !dsgd_cl__parse_kv(line + 12, mi, 1, &p.min_indirect))
                DSGD_CL__BAD("bad GemmRoutine line");
            p.min_indirect_set = 1;
        } else if (strcmp(line, "end") == 0) {
            have_end = 1;
        } else {
            DSGD_CL__BAD("unknown line");
        }
    }
    if (ferror(f)) DSGD_CL__BAD("read error");
    if (lineno == 0) DSGD_CL__BAD("empty file");
    if (!have_end) DSGD_CL__BAD("no 'end' line (truncated?)");
    if (!have_plat || !have_dev || !have_drv) DSGD_CL__BAD("missing platform, device or driver line");
    if (!dsgd_cl_gemm_params_valid(&p)) DSGD_CL__BAD("parameters break CLBlast's divisibility rules");
#undef DSGD_CL__BAD
    fclose(f);
    if (strcmp(plat, info->platform_name) != 0 || strcmp(dev, info->device_name) != 0 ||
        strcmp(drv, info->driver_version) != 0)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_STATE,
                                  "%s was tuned for '%s' (driver %s, platform '%s'), not for this device '%s' "
                                  "(driver %s, platform '%s')",
                                  path, dev, drv, plat, info->device_name, info->driver_version,
                                  info->platform_name);
    *out = p;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_cl_save_gemm_params(dsgd_ctx *ctx, const dsgd_cl_context *c, int device, const char *path,
                                              const dsgd_cl_gemm_params *p, const char *note) {
    const dsgd_cl_device_info *info = dsgd_cl_context_device_info(c, device);
    char tmp[1100], dir[1024];
    FILE *f;
    int i, ok;
    char *slash;
    if (!info || !path || !p || strlen(path) >= sizeof(dir))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_save_gemm_params: bad arguments");
    if (!dsgd_cl_gemm_params_valid(p))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT,
                                  "dsgd_cl_save_gemm_params: the parameters break CLBlast's rules");
    dsgd_cl__copy_str(dir, sizeof(dir), path);
    slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        /* mkdir -p of the file's directory */
        char *q;
        *slash = '\0';
        for (q = dir + 1;; ++q) {
            if (*q == '/' || *q == '\0') {
                char keep = *q;
                *q = '\0';
                if (mkdir(dir, 0755) != 0 && errno != EEXIST)
                    return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot create the directory: %s", dir,
                                              strerror(errno));
                *q = keep;
                if (keep == '\0') break;
            }
        }
    }
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f) return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    fprintf(f, "%s\n", DSGD_CL__CACHE_MAGIC);
    fprintf(f, "# CLBlast GEMM parameters for one OpenCL device, written by distsgd's tuner.\n");
    if (note) {
        const char *s = note;
        fputs("# ", f);
        for (; *s; ++s) fputc(*s == '\n' ? ' ' : *s, f);
        fputc('\n', f);
    }
    fprintf(f, "platform %s\ndevice %s\ndriver %s\nclblast %d.%d.%d\n", info->platform_name, info->device_name,
            info->driver_version, CLBLAST_VERSION_MAJOR, CLBLAST_VERSION_MINOR, CLBLAST_VERSION_PATCH);
    if (p->xgemm_set) {
        fputs("Xgemm", f);
        for (i = 0; i < DSGD_CL_XGEMM_NPARAMS; ++i)
            fprintf(f, " %s=%lu", dsgd_cl__xgemm_names[i], (unsigned long)p->xgemm[i]);
        fputc('\n', f);
    }
    if (p->direct_set) {
        fputs("XgemmDirect", f);
        for (i = 0; i < DSGD_CL_DIRECT_NPARAMS; ++i)
            fprintf(f, " %s=%lu", dsgd_cl__direct_names[i], (unsigned long)p->direct[i]);
        fputc('\n', f);
    }
    if (p->min_indirect_set) fprintf(f, "GemmRoutine XGEMM_MIN_INDIRECT_SIZE=%lu\n", (unsigned long)p->min_indirect);
    fputs("end\n", f);
    ok = !ferror(f);
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return dsgd_ctx_set_error(ctx, DSGD_ERR_IO, "%s: cannot write: %s", path, strerror(e));
    }
    return DSGD_OK;
}

/* Context creation: reads device i's cache file and applies it, or logs a
   warning saying why not and leaves CLBlast's defaults. The failure is not
   recorded as the caller's error: a scratch context collects its message. */
static void dsgd_cl__apply_cache(dsgd_ctx *ctx, dsgd_cl_context *c, int i, const char *desc_path) {
    char path[1100];
    dsgd_cl_gemm_params p;
    dsgd_ctx *scratch = NULL;
    dsgd_result r;
    const char *dev = c->info[i].device_name, *why;
    if (dsgd_cl_tune_cache_path(c, i, desc_path, path, sizeof(path)) != DSGD_OK) {
        dsgd_ctx_log(ctx, DSGD_LOG_WARN,
                     "no GEMM tuning cache location for %s (set DSGD_CL_TUNE_CACHE or HOME); using CLBlast's "
                     "default GEMM parameters",
                     dev);
        return;
    }
    if (dsgd_ctx_create(NULL, &scratch) != DSGD_OK) scratch = NULL;
    r = dsgd_cl_load_gemm_params(scratch, c, i, path, &p);
    if (r == DSGD_OK) r = dsgd_cl_apply_gemm_params(scratch, c, i, &p);
    if (r == DSGD_OK) {
        dsgd_ctx_log(ctx, DSGD_LOG_INFO, "applied tuned CLBlast GEMM parameters for %s from %s", dev, path);
    } else {
        why = r == DSGD_ERR_IO ? "missing" : r == DSGD_ERR_STATE ? "for another device" : "corrupt";
        dsgd_ctx_log(ctx, DSGD_LOG_WARN,
                     "GEMM tuning cache %s (%s): %s; using CLBlast's default GEMM parameters for %s (tools/cl_tune "
                     "tunes this device)",
                     why, dsgd_result_string(r), scratch ? dsgd_ctx_last_error(scratch) : path, dev);
    }
    dsgd_ctx_destroy(scratch);
}

DSGD_API int dsgd_cl_mlp_gemm_shapes(dsgd_cl_gemm_shape *out, int cap) {
    /* trans_a, trans_b, m, n, k */
    static const int s[9][5] = {{0, 0, 256, 512, 784}, {1, 0, 784, 512, 256}, {0, 1, 256, 784, 512},
                                {0, 0, 256, 512, 512}, {1, 0, 512, 512, 256}, {0, 1, 256, 512, 512},
                                {0, 0, 256, 10, 512},  {1, 0, 512, 10, 256},  {0, 1, 256, 512, 10}};
    int i;
    for (i = 0; out && i < 9 && i < cap; ++i) {
        out[i].trans_a = s[i][0];
        out[i].trans_b = s[i][1];
        out[i].m = s[i][2];
        out[i].n = s[i][3];
        out[i].k = s[i][4];
    }
    return 9;
}

static int dsgd_cl__cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define DSGD_CL__SAMPLE_S 0.01 /* seconds of back-to-back GEMMs per timed sample */

DSGD_API dsgd_result dsgd_cl_gemm_measure(dsgd_ctx *ctx, const dsgd_backend_i *be, const dsgd_cl_gemm_shape *shapes,
                                          int num_shapes, int repeats, double *median_s, double *max_rel_err) {
    size_t amax = 0, bmax = 0, cmax = 0, i;
    dsgd_buffer *ba = NULL, *bb = NULL, *bc = NULL;
    float *ha = NULL, *hb = NULL, *hc = NULL;
    double *times = NULL, worst = 0.0;
    dsgd_result r = DSGD_OK;
    uint64_t rng = 12345;
    int s, t, calls;
    if (!be || !shapes || num_shapes < 1 || repeats < 1 || !median_s)
        return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_gemm_measure: bad arguments");
    for (s = 0; s < num_shapes; ++s) {
        const dsgd_cl_gemm_shape *g = &shapes[s];
        if (g->m < 1 || g->n < 1 || g->k < 1)
            return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_cl_gemm_measure: shape %d is empty", s);
        if ((size_t)g->m * g->k > amax) amax = (size_t)g->m * g->k;
        if ((size_t)g->k * g->n > bmax) bmax = (size_t)g->k * g->n;
        if ((size_t)g->m * g->n > cmax) cmax = (size_t)g->m * g->n;
    }
    ha = (float *)DSGD_CL__MALLOC(amax * sizeof(float));
    hb = (float *)DSGD_CL__MALLOC(bmax * sizeof(float));
    hc = (float *)DSGD_CL__MALLOC(cmax * sizeof(float));
    times = (double *)DSGD_CL__MALLOC((size_t)repeats * sizeof(double));
    if (!ha || !hb || !hc || !times) {
        r = dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_cl_gemm_measure");
        goto done;
    }
    for (i = 0; i < amax; ++i) ha[i] = (float)(dsgd_rng_uniform(&rng) * 2.0 - 1.0);
    for (i = 0; i < bmax; ++i) hb[i] = (float)(dsgd_rng_uniform(&rng) * 2.0 - 1.0);
    if ((r = be->buffer_create(be->impl, amax, &ba)) != DSGD_OK ||
        (r = be->buffer_create(be->impl, bmax, &bb)) != DSGD_OK ||
        (r = be->buffer_create(be->impl, cmax, &bc)) != DSGD_OK)
        goto done;
    {
        dsgd_ref ra, rb;
        ra.buf = ba;
        ra.off = 0;
        rb.buf = bb;
        rb.off = 0;
        if ((r = be->write(be->impl, ra, ha, amax)) != DSGD_OK || (r = be->write(be->impl, rb, hb, bmax)) != DSGD_OK)
            goto done;
    }
    for (s = 0; s < num_shapes; ++s) {
        const dsgd_cl_gemm_shape *g = &shapes[s];
        int lda = g->trans_a ? g->m : g->k, ldb = g->trans_b ? g->k : g->n;
        dsgd_ref ra, rb, rc;
        ra.buf = ba;
        ra.off = 0;
        rb.buf = bb;
        rb.off = 0;
        rc.buf = bc;
        rc.off = 0;
        /* warm-up (compiles), then check it */
        r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc, g->n);
        if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
        if (r != DSGD_OK) goto done;
        if (max_rel_err) {
            int row, col, p;
            if ((r = be->read(be->impl, rc, hc, (size_t)g->m * g->n)) != DSGD_OK) goto done;
            for (row = 0; row < g->m; ++row) {
                for (col = 0; col < g->n; ++col) {
                    double acc = 0.0, mag = 0.0, e;
                    for (p = 0; p < g->k; ++p) {
                        double av = g->trans_a ? ha[(size_t)p * lda + row] : ha[(size_t)row * lda + p];
                        double bv = g->trans_b ? hb[(size_t)col * ldb + p] : hb[(size_t)p * ldb + col];
                        acc += av * bv;
                        mag += fabs(av * bv);
                    }
                    e = fabs((double)hc[(size_t)row * g->n + col] - acc) / (mag > 1e-30 ? mag : 1e-30);
                    if (worst == worst && !(e <= worst)) worst = e; /* a NaN becomes, and stays, the worst */
                }
            }
        }
        /* A sample is the mean of `calls` back-to-back calls with one finish
           at the end, as in a training step whose queue stays full; timing
           single calls to completion would add the device's wake-up and
           dispatch latency to every call (on PoCL, more than the variation
           between good candidates). calls is sized from one timed call so
           that a sample lasts about DSGD_CL__SAMPLE_S. */
        {
            double t0 = dsgd_now(), one;
            r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc, g->n);
            if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
            if (r != DSGD_OK) goto done;
            one = dsgd_now() - t0;
            calls = one >= DSGD_CL__SAMPLE_S ? 1 : (int)(DSGD_CL__SAMPLE_S / (one > 1e-6 ? one : 1e-6));
            if (calls > 1000) calls = 1000;
        }
        for (t = 0; t < repeats; ++t) {
            double t0 = dsgd_now();
            int c;
            for (c = 0; c < calls && r == DSGD_OK; ++c)
                r = be->gemm(be->impl, g->trans_a, g->trans_b, g->m, g->n, g->k, 1.0f, ra, lda, rb, ldb, 0.0f, rc,
                             g->n);
            if (r == DSGD_OK && be->finish) r = be->finish(be->impl);
            if (r != DSGD_OK) goto done;
            times[t] = (dsgd_now() - t0) / calls;
        }
        qsort(times, (size_t)repeats, sizeof(double), dsgd_cl__cmp_double);
        median_s[s] = repeats % 2 ? times[repeats / 2] : 0.5 * (times[repeats / 2 - 1] + times[repeats / 2]);
    }
    if (max_rel_err) *max_rel_err = worst;
done:
    if (ba) be->buffer_destroy(be->impl, ba);
    if (bb) be->buffer_destroy(be->impl, bb);
    if (bc) be->buffer_destroy(be->impl, bc);
    DSGD_CL__FREE(ha);
    DSGD_CL__FREE(hb);
    DSGD_CL__FREE(hc);
    DSGD_CL__FREE(times);
    return r;
}

#endif /* DSGD_CL__PART_TUNING_IMPL */
