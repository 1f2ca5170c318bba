/* distsgd/tf_config.h - TF_CONFIG: the cluster and this task, parsed from JSON with TensorFlow's rules
   Part of distsgd (see ../distsgd.h, which includes the parts in order).

   TF_CONFIG. TensorFlow's multi-worker strategies learn the cluster from the
   environment variable TF_CONFIG, a JSON object such as

       {"cluster": {"chief": ["host0:2222"],
                    "worker": ["host1:2222", "host2:2222"],
                    "ps": ["host3:2222"]},
        "task": {"type": "worker", "index": 1},
        "rpc_layer": "grpc"}

   This part reads that string (from memory or from the environment) into a
   dsgd_cluster_config, with a small strict JSON parser of its own (libc
   only), and applies the checks of TF's multi_worker_util: it is the parser
   only; multi-worker training over it is still to come.

   - Keys: "cluster" (an object: job name -> array of "host:port" strings),
     "task" (an object: "type" a string, "index" a non-negative integer;
     other keys of "task" are ignored) and "rpc_layer" (a string, or null
     for none). Other top-level keys ("environment", "session_master", ...)
     are ignored, as TF ignores them. No "cluster" (or an empty one) and no
     "task" is a single process: rank 0 of 1, the chief.
   - The rules (DSGD_ERR_INVALID_ARGUMENT, the message naming the rule):
     the top level is an object; job names and the task's type are "chief",
     "worker", "ps" or "evaluator" (TF refuses any other task type; a job of
     another name is refused too, since no rank could be given to it); a job
     is an array of strings (TF's sparse {"index": address} form is not
     read); at most one chief and at most one evaluator; the task's type is
     a job of the cluster (TF's _validate_cluster_spec lets a missing
     evaluator pass, but TF's worker_count then refuses it, and
     num_workers_total is that count, so it is refused here at once); its
     index is an integer below the job's size
     (1.0, 1e0, -1 and anything above INT_MAX are refused); a cluster with
     jobs needs a task, and a task needs both "type" and "index"; a key
     given twice in the top level, "cluster" or "task" is refused (Python
     keeps the last; refusing cannot pick the wrong one); a kept string
     (an address, the type, rpc_layer) may not hold U+0000.
   - The JSON (DSGD_ERR_FORMAT, with the byte offset): RFC 8259 strictly:
     no comments, no trailing commas, no raw control characters in strings,
     nothing after the value but whitespace; \uXXXX escapes become UTF-8,
     a surrogate pair one code point, and a lone surrogate is refused (it
     has no UTF-8 form); other bytes >= 0x80 are kept as they are. Values
     nest at most DSGD_TF_CONFIG_MAX_DEPTH deep. A malformed input is
     DSGD_ERR_FORMAT even when it also breaks a rule.
   - Memory: one block, sized from the input's length only (never from a
     number in it), freed by dsgd_cluster_config_free; nothing is left
     allocated after an error.

   THE RANK LAYOUT. The chief (if any) is rank 0, then the workers in order,
   then the parameter servers: rank = chief + index for a worker, chief +
   workers + index for a ps (TF's id_in_cluster for chief and worker).
   num_workers_total = chiefs + workers (TF's worker_count; for a ps, which
   TF's worker_count refuses, the same count of the training cluster). The
   evaluator stands apart, in a cluster of its own as in TF: rank 0 (TF's
   id_in_cluster, its index, and there is at most one) of num_workers_total
   1 (TF's worker_count for it: the size of the "evaluator" job).
   is_chief is TF's multi_worker_util.is_chief: the chief task, the
   evaluator, or worker 0 when the cluster has no chief.
*/
#ifndef DSGD__PART_TF_CONFIG_DECL
#define DSGD__PART_TF_CONFIG_DECL

#ifdef __cplusplus
extern "C" {
#endif

/* --------------------------------------------------------------- tf_config */

typedef enum dsgd_task_type {
    DSGD_TASK_NONE = -1, /* no task: a single process */
    DSGD_TASK_CHIEF = 0,
    DSGD_TASK_WORKER = 1,
    DSGD_TASK_PS = 2,
    DSGD_TASK_EVALUATOR = 3
} dsgd_task_type;
#define DSGD_TASK_TYPE_COUNT (DSGD_TASK_EVALUATOR + 1)

/* Values nest at most this deep (the top-level object is depth 1). */
#define DSGD_TF_CONFIG_MAX_DEPTH 64

typedef struct dsgd_cluster_config {
    int num_tasks[DSGD_TASK_TYPE_COUNT];     /* per job (by dsgd_task_type); 0: not in the cluster */
    char **addresses[DSGD_TASK_TYPE_COUNT];  /* num_tasks[t] NUL-terminated "host:port" strings; NULL when 0 */
    dsgd_task_type task_type;                /* DSGD_TASK_NONE: no task (single process) */
    int task_index;                          /* 0 with no task */
    char *rpc_layer;                         /* NULL when absent or null */
    int rank;                                /* see THE RANK LAYOUT; 0 with no task */
    int num_workers_total;                   /* chiefs + workers; 1 for the evaluator and with no task */
    int is_chief;                            /* 1 or 0; 1 with no task */
    void *storage;                           /* private: the one block that holds the rest */
} dsgd_cluster_config;

/* "chief", "worker", "ps", "evaluator"; "none" for DSGD_TASK_NONE; "?" for
   other values. Errors: none. Thread safety: any thread. */
DSGD_API const char *dsgd_task_type_name(dsgd_task_type t);

/* Parses json[0..len) (no NUL needed; a NUL byte inside is malformed) into
   *out. On error *out is left empty (safe to free).
   Errors (recorded on ctx, which may be NULL): DSGD_ERR_INVALID_ARGUMENT
   (out NULL, json NULL with len > 0, a rule above broken), DSGD_ERR_FORMAT
   (malformed JSON, with the byte offset), DSGD_ERR_OUT_OF_MEMORY.
   Thread safety: ctx's thread. */
DSGD_API dsgd_result dsgd_tf_config_parse(dsgd_ctx *ctx, const char *json, size_t len, dsgd_cluster_config *out);

/* dsgd_tf_config_parse on getenv("TF_CONFIG"). When TF_CONFIG is not set,
   the result is DSGD_OK and the single-process config ("{}"), as TF reads a
   missing TF_CONFIG as "{}"; set but empty is malformed (as in TF).
   Errors: as dsgd_tf_config_parse.
   Thread safety: ctx's thread, while no thread changes the environment. */
DSGD_API dsgd_result dsgd_tf_config_from_env(dsgd_ctx *ctx, dsgd_cluster_config *out);

/* Frees what a parse kept and empties *c; c NULL or empty: nothing.
   Errors: none. Thread safety: the thread that owns c. */
DSGD_API void dsgd_cluster_config_free(dsgd_cluster_config *c);

#ifdef __cplusplus
}
#endif

#endif /* DSGD__PART_TF_CONFIG_DECL */

#if defined(DISTSGD_IMPLEMENTATION) && !defined(DSGD_NO_TF_CONFIG) && !defined(DSGD__PART_TF_CONFIG_IMPL)
#define DSGD__PART_TF_CONFIG_IMPL

/* >>tf_config */

typedef struct dsgd__tfc {
    dsgd_ctx *ctx;
    const char *s;
    size_t len, pos;
    int depth;
    dsgd_result err;   /* the first DSGD_ERR_FORMAT (or out of memory); parsing stops */
    char rule[160];    /* the first rule broken; parsing goes on, so a later format error wins */
    char *chars;       /* decoded strings, at most len bytes in all */
    size_t chars_used, chars_cap;
    char **ptrs;       /* every address, job after job */
    size_t ptrs_used, ptrs_cap;
    size_t job_first[DSGD_TASK_TYPE_COUNT];
    int seen_job[DSGD_TASK_TYPE_COUNT];
    int seen_cluster, seen_task, seen_rpc, seen_type, seen_index;
    dsgd_cluster_config *out;
} dsgd__tfc;

static const char *const dsgd__tfc_names[DSGD_TASK_TYPE_COUNT] = {"chief", "worker", "ps", "evaluator"};

DSGD_API const char *dsgd_task_type_name(dsgd_task_type t) {
    if (t == DSGD_TASK_NONE) return "none";
    return (int)t >= 0 && (int)t < DSGD_TASK_TYPE_COUNT ? dsgd__tfc_names[t] : "?";
}

static int dsgd__tfc_type_of(const char *k, size_t n) {
    int t;
    for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t)
        if (strlen(dsgd__tfc_names[t]) == n && memcmp(dsgd__tfc_names[t], k, n) == 0) return t;
    return -1;
}

static int dsgd__tfc_key_is(const char *k, size_t n, const char *name) {
    return strlen(name) == n && memcmp(name, k, n) == 0;
}

/* Malformed JSON at the current offset; returns 0 so callers can `return`. */
static int dsgd__tfc_bad(dsgd__tfc *p, const char *what) {
    if (p->err == DSGD_OK)
        p->err = dsgd_ctx_set_error(p->ctx, DSGD_ERR_FORMAT, "TF_CONFIG: malformed JSON at byte %zu: %s", p->pos,
                                    what);
    return 0;
}

/* A broken rule: the first one is kept, parsing goes on. */
static void dsgd__tfc_rule(dsgd__tfc *p, const char *fmt, ...)
#if defined(__GNUC__) || defined(__clang__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void dsgd__tfc_rule(dsgd__tfc *p, const char *fmt, ...) {
    va_list ap;
    if (p->rule[0]) return;
    va_start(ap, fmt);
    vsnprintf(p->rule, sizeof(p->rule), fmt, ap);
    va_end(ap);
}

static void dsgd__tfc_ws(dsgd__tfc *p) {
    while (p->pos < p->len &&
           (p->s[p->pos] == ' ' || p->s[p->pos] == '\t' || p->s[p->pos] == '\n' || p->s[p->pos] == '\r'))
        ++p->pos;
}

static int dsgd__tfc_peek(dsgd__tfc *p) {
    dsgd__tfc_ws(p);
    return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1;
}

static int dsgd__tfc_hex4(dsgd__tfc *p, unsigned *v) {
    size_t i;
    *v = 0;
    if (p->len - p->pos < 4) {
        p->pos = p->len;
        return dsgd__tfc_bad(p, "a \\u escape needs four hex digits");
    }
    for (i = 0; i < 4; ++i) {
        char c = p->s[p->pos];
        unsigned d;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else return dsgd__tfc_bad(p, "a \\u escape needs four hex digits");
        *v = *v * 16 + d;
        ++p->pos;
    }
    return 1;
}

/* A string at p->pos (after whitespace). keep: decode it into p->chars,
   NUL-terminated, *str and *n its start and decoded length; else only
   check it.
   *has_nul: it held \u0000. Returns 1, or 0 on malformed JSON. */
static int dsgd__tfc_string(dsgd__tfc *p, int keep, char **str, size_t *n, int *has_nul) {
    char *o = keep ? p->chars + p->chars_used : NULL;
    size_t w = 0;
    if (has_nul) *has_nul = 0;
    if (dsgd__tfc_peek(p) != '"') return dsgd__tfc_bad(p, "expected a string");
    ++p->pos;
    for (;;) {
        unsigned char c;
        unsigned cp;
        if (p->pos >= p->len) return dsgd__tfc_bad(p, "unterminated string");
        c = (unsigned char)p->s[p->pos];
        if (c == '"') {
            ++p->pos;
            break;
        }
        if (c < 0x20) return dsgd__tfc_bad(p, "a control character inside a string");
        if (c != '\\') {
            if (o) o[w] = (char)c;
            ++w;
            ++p->pos;
            continue;
        }
        if (++p->pos >= p->len) return dsgd__tfc_bad(p, "unterminated escape");
        c = (unsigned char)p->s[p->pos++];
        switch (c) {
        case '"': case '\\': case '/': cp = c; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u':
            if (!dsgd__tfc_hex4(p, &cp)) return 0;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                p->pos -= 6;
                return dsgd__tfc_bad(p, "a lone low surrogate");
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->len - p->pos < 2 || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    p->pos -= 6;
                    return dsgd__tfc_bad(p, "a high surrogate without its low surrogate");
                }
                p->pos += 2;
                if (!dsgd__tfc_hex4(p, &lo)) return 0;
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    p->pos -= 12;
                    return dsgd__tfc_bad(p, "a high surrogate without its low surrogate");
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            break;
        default:
            --p->pos;
            return dsgd__tfc_bad(p, "an unknown escape");
        }
        if (cp == 0 && has_nul) *has_nul = 1;
        /* UTF-8: never longer than the escape it came from. */
        if (cp < 0x80) {
            if (o) o[w] = (char)cp;
            w += 1;
        } else if (cp < 0x800) {
            if (o) { o[w] = (char)(0xC0 | (cp >> 6)); o[w + 1] = (char)(0x80 | (cp & 0x3F)); }
            w += 2;
        } else if (cp < 0x10000) {
            if (o) {
                o[w] = (char)(0xE0 | (cp >> 12));
                o[w + 1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[w + 2] = (char)(0x80 | (cp & 0x3F));
            }
            w += 3;
        } else {
            if (o) {
                o[w] = (char)(0xF0 | (cp >> 18));
                o[w + 1] = (char)(0x80 | ((cp >> 12) & 0x3F));
                o[w + 2] = (char)(0x80 | ((cp >> 6) & 0x3F));
                o[w + 3] = (char)(0x80 | (cp & 0x3F));
            }
            w += 4;
        }
    }
    if (o) {
        o[w] = '\0';
        p->chars_used += w + 1;
        *str = o;
        *n = w;
    }
    return 1;
}

/* A number at p->pos. *integer: it has no fraction or exponent; *value its
   magnitude, capped at INT_MAX + 1; *negative: a '-' before it. Returns 1,
   or 0 on malformed JSON. */
static int dsgd__tfc_number(dsgd__tfc *p, int *integer, long long *value, int *negative) {
    const char *s = p->s;
    *integer = 1;
    *value = 0;
    *negative = 0;
    if (p->pos < p->len && s[p->pos] == '-') {
        *negative = 1;
        ++p->pos;
    }
    if (p->pos >= p->len || s[p->pos] < '0' || s[p->pos] > '9') return dsgd__tfc_bad(p, "a number needs a digit");
    if (s[p->pos] == '0') {
        ++p->pos;
    } else {
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9') {
            if (*value <= (long long)INT_MAX) *value = *value * 10 + (s[p->pos] - '0');
            if (*value > (long long)INT_MAX) *value = (long long)INT_MAX + 1;
            ++p->pos;
        }
    }
    if (p->pos < p->len && s[p->pos] == '.') {
        *integer = 0;
        ++p->pos;
        if (p->pos >= p->len || s[p->pos] < '0' || s[p->pos] > '9')
            return dsgd__tfc_bad(p, "a fraction needs a digit");
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9') ++p->pos;
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        *integer = 0;
        ++p->pos;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-')) ++p->pos;
        if (p->pos >= p->len || s[p->pos] < '0' || s[p->pos] > '9')
            return dsgd__tfc_bad(p, "an exponent needs a digit");
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9') ++p->pos;
    }
    return 1;
}

static int dsgd__tfc_literal(dsgd__tfc *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return dsgd__tfc_bad(p, "an unknown literal");
    p->pos += n;
    return 1;
}

static int dsgd__tfc_enter(dsgd__tfc *p) {
    if (++p->depth > DSGD_TF_CONFIG_MAX_DEPTH) return dsgd__tfc_bad(p, "nested deeper than DSGD_TF_CONFIG_MAX_DEPTH");
    return 1;
}

/* Object members, with one callback per member: at '{' on entry. member()
   is called with the key decoded (in p->chars, given back afterwards) and
   p->pos at the value, which it must consume. */
typedef int (*dsgd__tfc_member_fn)(dsgd__tfc *p, const char *key, size_t n);

static int dsgd__tfc_value(dsgd__tfc *p); /* checks and skips any value */

static int dsgd__tfc_object(dsgd__tfc *p, dsgd__tfc_member_fn member) {
    if (!dsgd__tfc_enter(p)) return 0;
    ++p->pos; /* '{' */
    if (dsgd__tfc_peek(p) == '}') {
        ++p->pos;
        --p->depth;
        return 1;
    }
    for (;;) {
        char *key = NULL;
        size_t n = 0;
        int ok;
        if (!dsgd__tfc_string(p, 1, &key, &n, NULL)) return 0;
        if (dsgd__tfc_peek(p) != ':') return dsgd__tfc_bad(p, "expected ':' after a key");
        ++p->pos;
        /* The key's bytes are not given back: a value kept after it
           follows it in p->chars (all of them fit: see the parse). */
        ok = member ? member(p, key, n) : dsgd__tfc_value(p);
        if (!ok) return 0;
        switch (dsgd__tfc_peek(p)) {
        case ',': ++p->pos; break;
        case '}': ++p->pos; --p->depth; return 1;
        default: return dsgd__tfc_bad(p, "expected ',' or '}' in an object");
        }
    }
}

static int dsgd__tfc_value(dsgd__tfc *p) {
    int c = dsgd__tfc_peek(p), integer, negative;
    long long v;
    if (c == '{') return dsgd__tfc_object(p, NULL);
    if (c == '[') {
        if (!dsgd__tfc_enter(p)) return 0;
        ++p->pos;
        if (dsgd__tfc_peek(p) == ']') {
            ++p->pos;
            --p->depth;
            return 1;
        }
        for (;;) {
            if (!dsgd__tfc_value(p)) return 0;
            switch (dsgd__tfc_peek(p)) {
            case ',': ++p->pos; break;
            case ']': ++p->pos; --p->depth; return 1;
            default: return dsgd__tfc_bad(p, "expected ',' or ']' in an array");
            }
        }
    }
    if (c == '"') return dsgd__tfc_string(p, 0, NULL, NULL, NULL);
    if (c == '-' || (c >= '0' && c <= '9')) return dsgd__tfc_number(p, &integer, &v, &negative);
    if (c == 't') return dsgd__tfc_literal(p, "true");
    if (c == 'f') return dsgd__tfc_literal(p, "false");
    if (c == 'n') return dsgd__tfc_literal(p, "null");
    if (c < 0) return dsgd__tfc_bad(p, "unexpected end of input");
    return dsgd__tfc_bad(p, "unexpected character");
}

/* A job's array of addresses, stored after the jobs before it. */
static int dsgd__tfc_job(dsgd__tfc *p, int t, const char *name) {
    size_t first = p->ptrs_used;
    if (!dsgd__tfc_enter(p)) return 0;
    ++p->pos; /* '[' */
    if (dsgd__tfc_peek(p) == ']') {
        ++p->pos;
        --p->depth;
        return 1;
    }
    for (;;) {
        if (dsgd__tfc_peek(p) == '"') {
            char *a = NULL;
            size_t n = 0;
            int nul = 0;
            if (!dsgd__tfc_string(p, 1, &a, &n, &nul)) return 0;
            if (nul) dsgd__tfc_rule(p, "TF_CONFIG: an address of job \"%s\" holds U+0000", name);
            if (p->ptrs_used >= p->ptrs_cap) return dsgd__tfc_bad(p, "too many addresses"); /* cannot happen */
            p->ptrs[p->ptrs_used++] = a;
        } else {
            dsgd__tfc_rule(p, "TF_CONFIG: job \"%s\" must be an array of \"host:port\" strings", name);
            if (!dsgd__tfc_value(p)) return 0;
        }
        switch (dsgd__tfc_peek(p)) {
        case ',': ++p->pos; break;
        case ']':
            ++p->pos;
            --p->depth;
            if (t >= 0) {
                p->job_first[t] = first;
                p->out->num_tasks[t] = (int)(p->ptrs_used - first);
            }
            return 1;
        default: return dsgd__tfc_bad(p, "expected ',' or ']' in an array");
        }
    }
}

static int dsgd__tfc_cluster_member(dsgd__tfc *p, const char *key, size_t n) {
    int t = dsgd__tfc_type_of(key, n);
    if (t < 0) {
        dsgd__tfc_rule(p, "TF_CONFIG: unknown job \"%.40s\" in \"cluster\" (known: chief, worker, ps, evaluator)", key);
        return dsgd__tfc_value(p);
    }
    if (p->seen_job[t]) {
        dsgd__tfc_rule(p, "TF_CONFIG: job \"%s\" is given twice in \"cluster\"", dsgd__tfc_names[t]);
        return dsgd__tfc_value(p);
    }
    p->seen_job[t] = 1;
    if (dsgd__tfc_peek(p) != '[') {
        dsgd__tfc_rule(p, "TF_CONFIG: job \"%s\" must be an array of \"host:port\" strings", dsgd__tfc_names[t]);
        return dsgd__tfc_value(p);
    }
    return dsgd__tfc_job(p, t, dsgd__tfc_names[t]);
}

static int dsgd__tfc_task_member(dsgd__tfc *p, const char *key, size_t n) {
    if (dsgd__tfc_key_is(key, n, "type")) {
        if (p->seen_type++) {
            dsgd__tfc_rule(p, "TF_CONFIG: \"type\" is given twice in \"task\"");
            return dsgd__tfc_value(p);
        }
        if (dsgd__tfc_peek(p) == '"') {
            size_t mark = p->chars_used, m = 0;
            char *s = NULL;
            int t;
            if (!dsgd__tfc_string(p, 1, &s, &m, NULL)) return 0;
            t = dsgd__tfc_type_of(s, m);
            if (t < 0)
                dsgd__tfc_rule(p, "TF_CONFIG: unrecognized task type \"%.40s\" (valid: chief, worker, ps, evaluator)",
                               s);
            else
                p->out->task_type = (dsgd_task_type)t;
            p->chars_used = mark;
            return 1;
        }
        dsgd__tfc_rule(p, "TF_CONFIG: the task's \"type\" must be a string");
        return dsgd__tfc_value(p);
    }
    if (dsgd__tfc_key_is(key, n, "index")) {
        int c = dsgd__tfc_peek(p), integer, negative;
        size_t at = p->pos;
        long long v;
        if (p->seen_index++) {
            dsgd__tfc_rule(p, "TF_CONFIG: \"index\" is given twice in \"task\"");
            return dsgd__tfc_value(p);
        }
        if (c != '-' && !(c >= '0' && c <= '9')) {
            dsgd__tfc_rule(p, "TF_CONFIG: the task's \"index\" must be an integer");
            return dsgd__tfc_value(p);
        }
        if (!dsgd__tfc_number(p, &integer, &v, &negative)) return 0;
        if (!integer)
            dsgd__tfc_rule(p, "TF_CONFIG: the task's \"index\" %.*s must be an integer", (int)(p->pos - at > 32 ? 32 : p->pos - at),
                           p->s + at);
        else if (negative && v != 0)
            dsgd__tfc_rule(p, "TF_CONFIG: the task's \"index\" %.*s must be >= 0", (int)(p->pos - at > 32 ? 32 : p->pos - at),
                           p->s + at);
        else if (v > (long long)INT_MAX)
            dsgd__tfc_rule(p, "TF_CONFIG: the task's \"index\" %.*s is too large", (int)(p->pos - at > 32 ? 32 : p->pos - at),
                           p->s + at);
        else
            p->out->task_index = (int)v;
        return 1;
    }
    return dsgd__tfc_value(p); /* TF ignores the task's other keys */
}

static int dsgd__tfc_top_member(dsgd__tfc *p, const char *key, size_t n) {
    if (dsgd__tfc_key_is(key, n, "cluster")) {
        if (p->seen_cluster++) {
            dsgd__tfc_rule(p, "TF_CONFIG: \"cluster\" is given twice");
            return dsgd__tfc_value(p);
        }
        if (dsgd__tfc_peek(p) != '{') {
            dsgd__tfc_rule(p, "TF_CONFIG: \"cluster\" must be an object of job name -> addresses");
            return dsgd__tfc_value(p);
        }
        return dsgd__tfc_object(p, dsgd__tfc_cluster_member);
    }
    if (dsgd__tfc_key_is(key, n, "task")) {
        if (p->seen_task++) {
            dsgd__tfc_rule(p, "TF_CONFIG: \"task\" is given twice");
            return dsgd__tfc_value(p);
        }
        if (dsgd__tfc_peek(p) != '{') {
            dsgd__tfc_rule(p, "TF_CONFIG: \"task\" must be an object with \"type\" and \"index\"");
            return dsgd__tfc_value(p);
        }
        return dsgd__tfc_object(p, dsgd__tfc_task_member);
    }
    if (dsgd__tfc_key_is(key, n, "rpc_layer")) {
        int c = dsgd__tfc_peek(p);
        if (p->seen_rpc++) {
            dsgd__tfc_rule(p, "TF_CONFIG: \"rpc_layer\" is given twice");
            return dsgd__tfc_value(p);
        }
        if (c == '"') {
            size_t m = 0;
            int nul = 0;
            if (!dsgd__tfc_string(p, 1, &p->out->rpc_layer, &m, &nul)) return 0;
            if (nul) dsgd__tfc_rule(p, "TF_CONFIG: \"rpc_layer\" holds U+0000");
            return 1;
        }
        if (c != 'n') dsgd__tfc_rule(p, "TF_CONFIG: \"rpc_layer\" must be a string or null");
        return dsgd__tfc_value(p);
    }
    return dsgd__tfc_value(p); /* "environment", "session_master", ...: ignored, as in TF */
}

/* TF's _validate_cluster_spec and the derived fields, on a well-formed parse. */
static void dsgd__tfc_check(dsgd__tfc *p) {
    dsgd_cluster_config *c = p->out;
    int t, jobs = 0, chiefs = c->num_tasks[DSGD_TASK_CHIEF], workers = c->num_tasks[DSGD_TASK_WORKER];
    for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t) jobs += c->num_tasks[t];
    if (chiefs > 1) dsgd__tfc_rule(p, "TF_CONFIG: there must be at most one chief (%d given)", chiefs);
    if (c->num_tasks[DSGD_TASK_EVALUATOR] > 1)
        dsgd__tfc_rule(p, "TF_CONFIG: there must be at most one evaluator (%d given)",
                       c->num_tasks[DSGD_TASK_EVALUATOR]);
    if (!p->seen_task) {
        if (jobs > 0) dsgd__tfc_rule(p, "TF_CONFIG: a cluster of %d tasks needs a \"task\"", jobs);
        c->task_type = DSGD_TASK_NONE;
        c->rank = 0;
        c->num_workers_total = 1;
        c->is_chief = 1;
        return;
    }
    if (!p->seen_type) dsgd__tfc_rule(p, "TF_CONFIG: the task has no \"type\"");
    if (!p->seen_index) dsgd__tfc_rule(p, "TF_CONFIG: the task has no \"index\"");
    if (p->rule[0]) return;
    t = (int)c->task_type;
    if (c->num_tasks[t] == 0) {
        /* TF's cluster check exempts the evaluator; its worker_count, which
           num_workers_total is, does not */
        dsgd__tfc_rule(p, "TF_CONFIG: the task's type \"%s\" is not a job of the cluster%s", dsgd__tfc_names[t],
                       t == DSGD_TASK_EVALUATOR ? " (TF's worker_count refuses that)" : "");
        return;
    }
    if (c->task_index >= c->num_tasks[t]) {
        dsgd__tfc_rule(p, "TF_CONFIG: the task's index %d exceeds the largest index of job \"%s\" (%d)",
                       c->task_index, dsgd__tfc_names[t], c->num_tasks[t] - 1);
        return;
    }
    c->num_workers_total = chiefs + workers;
    switch (c->task_type) {
    case DSGD_TASK_CHIEF: c->rank = 0; c->is_chief = 1; break;
    case DSGD_TASK_WORKER: c->rank = chiefs + c->task_index; c->is_chief = chiefs == 0 && c->task_index == 0; break;
    case DSGD_TASK_PS: c->rank = chiefs + workers + c->task_index; c->is_chief = 0; break;
    default: /* the evaluator: a cluster of its own, of the one evaluator */
        c->rank = c->task_index;
        c->num_workers_total = c->num_tasks[DSGD_TASK_EVALUATOR];
        c->is_chief = 1;
        break;
    }
}

DSGD_API dsgd_result dsgd_tf_config_parse(dsgd_ctx *ctx, const char *json, size_t len, dsgd_cluster_config *out) {
    dsgd__tfc p;
    size_t ptrs_cap, bytes;
    int t;
    if (!out) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_tf_config_parse: out is NULL");
    memset(out, 0, sizeof(*out));
    out->task_type = DSGD_TASK_NONE;
    if (!json && len) return dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "dsgd_tf_config_parse: json is NULL");
    /* Every address takes 3 bytes of input at least ("", and a separator),
       and every kept string decodes to no more bytes (with its NUL) than it
       took: one block of pointers then chars, from len alone. */
    ptrs_cap = len / 3 + 1;
    if (len > (SIZE_MAX - 16) / 2 / sizeof(char *))
        return dsgd_ctx_set_error(ctx, DSGD_ERR_OUT_OF_MEMORY, "dsgd_tf_config_parse: %zu bytes are too many", len);
    bytes = ptrs_cap * sizeof(char *) + len + 1;
    memset(&p, 0, sizeof(p));
    p.ctx = ctx;
    p.s = json ? json : "";
    p.len = len;
    p.out = out;
    p.err = DSGD_OK;
    out->storage = dsgd__alloc(ctx, bytes, "dsgd_tf_config_parse");
    if (!out->storage) return DSGD_ERR_OUT_OF_MEMORY;
    p.ptrs = (char **)out->storage;
    p.ptrs_cap = ptrs_cap;
    p.chars = (char *)(p.ptrs + ptrs_cap);
    p.chars_cap = len + 1;
    if (dsgd__tfc_peek(&p) == '{') {
        dsgd__tfc_object(&p, dsgd__tfc_top_member);
    } else if (dsgd__tfc_value(&p)) {
        dsgd__tfc_rule(&p, "TF_CONFIG: the top level must be a JSON object");
    }
    if (p.err == DSGD_OK && dsgd__tfc_peek(&p) >= 0) dsgd__tfc_bad(&p, "text after the JSON value");
    if (p.err == DSGD_OK && !p.rule[0]) dsgd__tfc_check(&p);
    if (p.err == DSGD_OK && p.rule[0]) p.err = dsgd_ctx_set_error(ctx, DSGD_ERR_INVALID_ARGUMENT, "%s", p.rule);
    if (p.err != DSGD_OK) {
        DSGD_FREE(out->storage);
        memset(out, 0, sizeof(*out));
        out->task_type = DSGD_TASK_NONE;
        return p.err;
    }
    for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t)
        out->addresses[t] = out->num_tasks[t] ? p.ptrs + p.job_first[t] : NULL;
    return DSGD_OK;
}

DSGD_API dsgd_result dsgd_tf_config_from_env(dsgd_ctx *ctx, dsgd_cluster_config *out) {
    const char *s = getenv("TF_CONFIG");
    if (!s) s = "{}"; /* TF reads a missing TF_CONFIG as "{}" */
    return dsgd_tf_config_parse(ctx, s, strlen(s), out);
}

DSGD_API void dsgd_cluster_config_free(dsgd_cluster_config *c) {
    if (!c) return;
    DSGD_FREE(c->storage);
    memset(c, 0, sizeof(*c));
    c->task_type = DSGD_TASK_NONE;
}

#endif /* DSGD__PART_TF_CONFIG_IMPL */
