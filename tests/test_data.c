/* test_data.c - datasets: IDX and CSV loaders, split, gather, sampler.

   Small IDX and CSV files are written to a fresh directory under /tmp. Good
   files must load with exact values (IDX pixels / 255); every kind of
   malformed file must be rejected with DSGD_ERR_FORMAT (DSGD_ERR_IO for a
   missing file) and a message naming the file (and, for CSV, the line and
   column). Headers whose sizes overflow or exceed the file are rejected
   without allocating from them: run the ASan build, which aborts on absurd
   allocation sizes. A seeded mutation loop (truncations, byte flips,
   appended bytes) checks that every mutated file either loads with sane
   sizes or fails with a code and a message. The vendored digits file loads
   as 1797 x 64 with 10 classes. Workers' shards of a sampler's epochs
   (dsgd_sampler_worker_batch) are its batches w, w + W, ..., disjoint.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

#include <signal.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- fixture */

typedef struct fx {
    dsgd_ctx *ctx;
    char dir[64];
} fx;

static int setup(void **state) {
    fx *f = (fx *)calloc(1, sizeof *f);
    if (!f) return -1;
    if (dsgd_ctx_create(NULL, &f->ctx) != DSGD_OK) return -1;
    strcpy(f->dir, "/tmp/dsgd_test_XXXXXX");
    if (!mkdtemp(f->dir)) return -1;
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fx *f = (fx *)*state;
    tu_rmdir(f->dir);
    dsgd_ctx_destroy(f->ctx);
    free(f);
    return 0;
}

/* ---------------------------------------------------------------- IDX builders */

typedef struct bytes {
    unsigned char d[4096];
    size_t n;
} bytes;

static void put_u8(bytes *b, unsigned v) {
    assert_true(b->n < sizeof b->d);
    b->d[b->n++] = (unsigned char)v;
}

static void put_be32(bytes *b, uint32_t v) {
    put_u8(b, (v >> 24) & 255);
    put_u8(b, (v >> 16) & 255);
    put_u8(b, (v >> 8) & 255);
    put_u8(b, v & 255);
}

/* magic 0x0000TTDD then the dims */
static void idx_header(bytes *b, unsigned type, unsigned ndims, const uint32_t *dims) {
    unsigned i;
    b->n = 0;
    put_u8(b, 0);
    put_u8(b, 0);
    put_u8(b, type);
    put_u8(b, ndims);
    for (i = 0; i < ndims; ++i) put_be32(b, dims[i]);
}

/* A good pair: n images of rows x cols with pixel k = (k*37 + 255) % 256
   except pixel 1, which is 0 (so both 255 and 0 occur); labels (i*7) % 10. */
static void good_images(bytes *b, uint32_t n, uint32_t rows, uint32_t cols) {
    uint32_t dims[3];
    size_t i;
    dims[0] = n;
    dims[1] = rows;
    dims[2] = cols;
    idx_header(b, 0x08, 3, dims);
    for (i = 0; i < (size_t)n * rows * cols; ++i) put_u8(b, (unsigned)((i * 37 + 255) % 256));
    if ((size_t)n * rows * cols > 1) b->d[16 + 1] = 0;
}

static void good_labels(bytes *b, uint32_t n) {
    uint32_t i;
    idx_header(b, 0x08, 1, &n);
    for (i = 0; i < n; ++i) put_u8(b, (i * 7) % 10);
}

static dsgd_result load_idx(fx *f, const bytes *img, const bytes *lbl, int num_classes,
                            dsgd_dataset *out) {
    char ip[256], lp[256];
    tu_write_file(f->dir, "imgs.idx", img->d, img->n, ip, sizeof ip);
    tu_write_file(f->dir, "lbls.idx", lbl->d, lbl->n, lp, sizeof lp);
    memset(out, 0, sizeof *out);
    dsgd_ctx_clear_error(f->ctx);
    return dsgd_dataset_load_idx(f->ctx, ip, lp, num_classes, out);
}

/* Expects failure `want` with a message naming `file` (and containing
   `also` when non-NULL); nothing is left allocated in out. */
static void expect_idx_fail(fx *f, const bytes *img, const bytes *lbl, int num_classes,
                            dsgd_result want, const char *file, const char *what) {
    dsgd_dataset ds;
    dsgd_result r = load_idx(f, img, lbl, num_classes, &ds);
    const char *msg = dsgd_ctx_last_error(f->ctx);
    if (r != want)
        fail_msg("%s: load_idx -> %s (%d), want %s; message '%s'", what, dsgd_result_string(r),
                 (int)r, dsgd_result_string(want), msg);
    if (!strstr(msg, file)) fail_msg("%s: message does not name %s: '%s'", what, file, msg);
    if (ds.x || ds.y) fail_msg("%s: failed load left buffers in the dataset", what);
    print_message("    %-34s %s\n", what, msg);
}

/* ---------------------------------------------------------------- IDX */

static void test_idx_good(void **state) {
    fx *f = (fx *)*state;
    bytes img, lbl;
    dsgd_dataset ds;
    size_t i;
    good_images(&img, 3, 2, 3);
    good_labels(&lbl, 3);
    TU_OK(f->ctx, load_idx(f, &img, &lbl, 0, &ds));
    assert_int_equal(ds.n, 3);
    assert_int_equal(ds.dim, 6);
    assert_int_equal(ds.target_dim, 1);
    assert_int_equal(ds.num_classes, 10);
    for (i = 0; i < 18; ++i) {
        unsigned px = img.d[16 + i];
        TU_NEAR(ds.x[i], px / 255.0, 1e-7);
    }
    assert_true(ds.x[0] == 1.0f && ds.x[1] == 0.0f);
    for (i = 0; i < 3; ++i) assert_true(ds.y[i] == (float)((i * 7) % 10));
    dsgd_dataset_free(&ds);
    assert_null(ds.x); /* free resets the dataset */

    /* num_classes given: labels must fit (max label here is 7) */
    good_labels(&lbl, 3);
    TU_OK(f->ctx, load_idx(f, &img, &lbl, 8, &ds));
    assert_int_equal(ds.num_classes, 8);
    dsgd_dataset_free(&ds);

    /* a 1x1 image and a single sample */
    good_images(&img, 1, 1, 1);
    good_labels(&lbl, 1);
    TU_OK(f->ctx, load_idx(f, &img, &lbl, 0, &ds));
    assert_int_equal(ds.n, 1);
    assert_int_equal(ds.dim, 1);
    TU_NEAR(ds.x[0], 1.0, 0);
    dsgd_dataset_free(&ds);
    dsgd_dataset_free(&ds); /* twice is harmless */
}

static void test_idx_malformed(void **state) {
    fx *f = (fx *)*state;
    bytes img, lbl, gi, gl;
    uint32_t dims[3];
    good_images(&gi, 3, 2, 3);
    good_labels(&gl, 3);

    /* truncated headers */
    img = gi;
    img.n = 6;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: truncated magic");
    img.n = 12; /* magic and two of three dims */
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: truncated dims");
    img.n = 0;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: empty file");
    lbl = gl;
    lbl.n = 5;
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: truncated header");

    /* truncated data */
    img = gi;
    img.n -= 1;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: truncated data");
    img.n = 16;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: header only");
    lbl = gl;
    lbl.n -= 1;
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: truncated data");

    /* wrong magic */
    img = gi;
    img.d[0] = 0x1f; /* a gzip file */
    img.d[1] = 0x8b;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: gzip magic");
    expect_idx_fail(f, &gl, &gi, 0, DSGD_ERR_FORMAT, "imgs.idx", "files swapped");
    lbl = gl;
    lbl.d[1] = 1;
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: wrong magic");

    /* unsupported data type byte: 0x0D is float, 0x09 signed byte */
    img = gi;
    img.d[2] = 0x0D;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: float type");
    lbl = gl;
    lbl.d[2] = 0x09;
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: signed type");

    /* wrong number of dims */
    dims[0] = 3;
    dims[1] = 6;
    idx_header(&img, 0x08, 2, dims);
    memcpy(img.d + img.n, gi.d + 16, 18);
    img.n += 18;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: 2 dims");
    dims[0] = 3;
    dims[1] = 1;
    idx_header(&lbl, 0x08, 2, dims);
    put_u8(&lbl, 1);
    put_u8(&lbl, 2);
    put_u8(&lbl, 3);
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: 2 dims");
    idx_header(&img, 0x08, 0, dims);
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: 0 dims");

    /* sizes that overflow size_t, or that are absurd for the file: these
       must be caught from the header, not by trying to allocate */
    dims[0] = 0xFFFFFFFFu;
    dims[1] = 0xFFFFFFFFu;
    dims[2] = 0xFFFFFFFFu;
    idx_header(&img, 0x08, 3, dims);
    put_u8(&img, 1);
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: dims overflow");
    dims[0] = 0x7FFFFFFFu;
    dims[1] = 0x10000u;
    dims[2] = 0x10000u;
    idx_header(&img, 0x08, 3, dims);
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: 2^63 pixels");
    dims[0] = 0x7FFFFFFFu;
    dims[1] = 28;
    dims[2] = 28;
    idx_header(&img, 0x08, 3, dims);
    memcpy(img.d + img.n, gi.d + 16, 18);
    img.n += 18;
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: 1.7e12 pixels");
    dims[0] = 0xFFFFFFFFu;
    idx_header(&lbl, 0x08, 1, dims);
    put_u8(&lbl, 1);
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: 4e9 labels");

    /* image/label count mismatch (each file consistent on its own) */
    good_labels(&lbl, 2);
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "count mismatch 3 vs 2");
    good_labels(&lbl, 4);
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "count mismatch 3 vs 4");

    /* label out of range */
    lbl = gl;
    lbl.d[8 + 1] = 10;
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "label 10, 10 classes");
    lbl.d[8 + 1] = 255;
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "label 255");
    lbl = gl; /* labels 0, 7, 4 */
    expect_idx_fail(f, &gi, &lbl, 5, DSGD_ERR_FORMAT, "lbls.idx", "label 7, 5 classes");

    /* trailing garbage */
    img = gi;
    put_u8(&img, 0);
    expect_idx_fail(f, &img, &gl, 0, DSGD_ERR_FORMAT, "imgs.idx", "images: trailing byte");
    lbl = gl;
    put_u8(&lbl, 1);
    put_u8(&lbl, 2);
    expect_idx_fail(f, &gi, &lbl, 0, DSGD_ERR_FORMAT, "lbls.idx", "labels: trailing bytes");

    /* missing files */
    {
        char ip[256], lp[256], missing[256];
        dsgd_dataset ds;
        dsgd_result r;
        tu_write_file(f->dir, "imgs.idx", gi.d, gi.n, ip, sizeof ip);
        tu_write_file(f->dir, "lbls.idx", gl.d, gl.n, lp, sizeof lp);
        snprintf(missing, sizeof missing, "%s/no_such_file.idx", f->dir);
        memset(&ds, 0, sizeof ds);
        r = dsgd_dataset_load_idx(f->ctx, missing, lp, 0, &ds);
        assert_int_equal(r, DSGD_ERR_IO);
        assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "no_such_file.idx"));
        r = dsgd_dataset_load_idx(f->ctx, ip, missing, 0, &ds);
        assert_int_equal(r, DSGD_ERR_IO);
        assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "no_such_file.idx"));
        /* bad arguments */
        assert_int_equal(dsgd_dataset_load_idx(f->ctx, NULL, lp, 0, &ds),
                         DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsgd_dataset_load_idx(f->ctx, ip, lp, 0, NULL),
                         DSGD_ERR_INVALID_ARGUMENT);
        assert_int_equal(dsgd_dataset_load_idx(f->ctx, ip, lp, -1, &ds),
                         DSGD_ERR_INVALID_ARGUMENT);
        assert_null(ds.x);
    }
}

/* ---------------------------------------------------------------- CSV */

static dsgd_result load_csv(fx *f, const char *name, const char *text, const dsgd_csv_desc *d,
                            dsgd_dataset *out) {
    char p[256];
    tu_write_file(f->dir, name, text, strlen(text), p, sizeof p);
    memset(out, 0, sizeof *out);
    dsgd_ctx_clear_error(f->ctx);
    return dsgd_dataset_load_csv(f->ctx, p, d, out);
}

static dsgd_csv_desc csv_desc(int label_column, int num_classes, int header_lines, float scale) {
    dsgd_csv_desc d;
    memset(&d, 0, sizeof d);
    d.label_column = label_column;
    d.num_classes = num_classes;
    d.header_lines = header_lines;
    d.feature_scale = scale;
    return d;
}

/* Does msg mention the number v as a whole token right after one of the
   words (e.g. "line 3", "line: 3", or "file.csv:3")? */
static int mentions(const char *msg, const char *word, long v) {
    const char *p = msg;
    size_t wl = strlen(word);
    while ((p = strstr(p, word)) != NULL) {
        const char *q = p + wl;
        char *end;
        long got;
        while (*q == ' ' || *q == ':' || *q == '=') ++q;
        got = strtol(q, &end, 10);
        if (end != q && got == v && !(*end >= '0' && *end <= '9')) return 1;
        p += wl;
    }
    return 0;
}

/* Expects DSGD_ERR_FORMAT naming the file and, when line > 0, the line (and
   the column when col > 0). */
static void expect_csv_fail(fx *f, const char *text, const dsgd_csv_desc *d, int line, int col,
                            const char *what) {
    dsgd_dataset ds;
    dsgd_result r = load_csv(f, "bad.csv", text, d, &ds);
    const char *msg = dsgd_ctx_last_error(f->ctx);
    char lc[64];
    if (r != DSGD_ERR_FORMAT)
        fail_msg("%s: load_csv -> %s (%d), want malformed input; message '%s'", what,
                 dsgd_result_string(r), (int)r, msg);
    if (!strstr(msg, "bad.csv")) fail_msg("%s: message does not name the file: '%s'", what, msg);
    snprintf(lc, sizeof lc, "bad.csv:%d:%d", line, col);
    if (line > 0 && !mentions(msg, "line", line) && !mentions(msg, "bad.csv:", line))
        fail_msg("%s: message does not say line %d: '%s'", what, line, msg);
    if (col > 0 && !mentions(msg, "column", col) && !mentions(msg, "col", col) &&
        !mentions(msg, "field", col) && !strstr(msg, lc))
        fail_msg("%s: message does not say column %d: '%s'", what, col, msg);
    if (ds.x || ds.y) fail_msg("%s: failed load left buffers in the dataset", what);
    print_message("    %-34s %s\n", what, msg);
}

static void test_csv_good(void **state) {
    fx *f = (fx *)*state;
    dsgd_dataset ds;
    dsgd_csv_desc d;
    static const float want_x[6] = {1.0f, -3.5f, 0.01f, 4.0f, 1000.0f, 0.0f};

    /* last column is the label by default; classes = largest + 1 */
    TU_OK(f->ctx, load_csv(f, "a.csv", "1,-3.5,1e-2,0\n4,1000,0,2\n", NULL, &ds));
    assert_int_equal(ds.n, 2);
    assert_int_equal(ds.dim, 3);
    assert_int_equal(ds.target_dim, 1);
    assert_int_equal(ds.num_classes, 3);
    {
        int i;
        for (i = 0; i < 6; ++i) TU_NEAR(ds.x[i], want_x[i], 1e-7 * fabs(want_x[i]));
    }
    assert_true(ds.y[0] == 0.0f && ds.y[1] == 2.0f);
    dsgd_dataset_free(&ds);

    /* no final newline; a blank trailing line; CRLF */
    TU_OK(f->ctx, load_csv(f, "b.csv", "1,2,0\n3,4,1", NULL, &ds));
    assert_int_equal(ds.n, 2);
    assert_true(ds.x[3] == 4.0f && ds.y[1] == 1.0f);
    dsgd_dataset_free(&ds);
    TU_OK(f->ctx, load_csv(f, "c.csv", "1,2,0\n3,4,1\n\n", NULL, &ds));
    assert_int_equal(ds.n, 2);
    dsgd_dataset_free(&ds);
    TU_OK(f->ctx, load_csv(f, "d.csv", "1,2,0\r\n3,4,1\r\n", NULL, &ds));
    assert_int_equal(ds.n, 2);
    assert_int_equal(ds.dim, 2);
    assert_true(ds.x[1] == 2.0f && ds.y[0] == 0.0f && ds.y[1] == 1.0f);
    dsgd_dataset_free(&ds);
    TU_OK(f->ctx, load_csv(f, "d2.csv", "1,2,0\r\n3,4,1\r\n\r\n", NULL, &ds));
    assert_int_equal(ds.n, 2);
    dsgd_dataset_free(&ds);

    /* header lines skipped */
    d = csv_desc(0, 0, 2, 0.0f);
    TU_OK(f->ctx, load_csv(f, "e.csv", "# digits\nf1,f2,label\n5,6,1\n", &d, &ds));
    assert_int_equal(ds.n, 1);
    assert_true(ds.x[0] == 5.0f && ds.x[1] == 6.0f && ds.y[0] == 1.0f);
    assert_int_equal(ds.num_classes, 2);
    dsgd_dataset_free(&ds);

    /* label first; label in the middle */
    d = csv_desc(1, 0, 0, 0.0f);
    TU_OK(f->ctx, load_csv(f, "f.csv", "0,1,2\n1,3,4\n", &d, &ds));
    assert_int_equal(ds.dim, 2);
    assert_true(ds.x[0] == 1.0f && ds.x[1] == 2.0f && ds.x[2] == 3.0f && ds.x[3] == 4.0f);
    assert_true(ds.y[0] == 0.0f && ds.y[1] == 1.0f);
    dsgd_dataset_free(&ds);
    d = csv_desc(2, 0, 0, 0.0f);
    TU_OK(f->ctx, load_csv(f, "g.csv", "1,7,2\n", &d, &ds));
    assert_true(ds.x[0] == 1.0f && ds.x[1] == 2.0f && ds.y[0] == 7.0f);
    assert_int_equal(ds.num_classes, 8);
    dsgd_dataset_free(&ds);
    d = csv_desc(3, 0, 0, 0.0f); /* explicit last */
    TU_OK(f->ctx, load_csv(f, "g2.csv", "1,7,2\n", &d, &ds));
    assert_true(ds.x[0] == 1.0f && ds.x[1] == 7.0f && ds.y[0] == 2.0f);
    dsgd_dataset_free(&ds);

    /* feature_scale applies to features only; num_classes fixed */
    d = csv_desc(0, 5, 0, 0.5f);
    TU_OK(f->ctx, load_csv(f, "h.csv", "16,3,4\n", &d, &ds));
    assert_true(ds.x[0] == 8.0f && ds.x[1] == 1.5f && ds.y[0] == 4.0f);
    assert_int_equal(ds.num_classes, 5);
    dsgd_dataset_free(&ds);
    /* a label written as 2.0 is an integer */
    TU_OK(f->ctx, load_csv(f, "i.csv", "1,2.0\n", NULL, &ds));
    assert_true(ds.y[0] == 2.0f);
    dsgd_dataset_free(&ds);
}

static void test_csv_malformed(void **state) {
    fx *f = (fx *)*state;
    dsgd_csv_desc d;
    dsgd_dataset ds;
    char p[256];

    expect_csv_fail(f, "1,2,0\n4,x,1\n", NULL, 2, 2, "non-numeric field");
    expect_csv_fail(f, "1,2,0\n3,4,1\n5,6abc,1\n", NULL, 3, 2, "number with junk");
    expect_csv_fail(f, "f1,f2,label\n1,2,0\n", NULL, 1, 1, "unskipped header");
    expect_csv_fail(f, "1,,0\n", NULL, 1, 2, "empty field");
    expect_csv_fail(f, "1,2,0\n3,4\n", NULL, 2, 0, "ragged line (short)");
    expect_csv_fail(f, "1,2,0\n3,4,1\n5,6,7,1\n", NULL, 3, 0, "ragged line (long)");
    expect_csv_fail(f, "1,2,0,\n", NULL, 1, 0, "trailing comma");
    expect_csv_fail(f, "1,2,0\n3,4,0.5\n", NULL, 2, 3, "non-integer label");
    expect_csv_fail(f, "1,2,-1\n", NULL, 1, 3, "negative label");
    d = csv_desc(0, 3, 0, 0.0f);
    expect_csv_fail(f, "1,2,0\n1,2,2\n1,2,3\n", &d, 3, 3, "label 3 with 3 classes");
    d = csv_desc(1, 2, 0, 0.0f);
    expect_csv_fail(f, "0,5,5\n7,5,5\n", &d, 2, 1, "label 7 in column 1, 2 classes");
    expect_csv_fail(f, "", NULL, 0, 0, "empty file");
    expect_csv_fail(f, "\n\n", NULL, 0, 0, "blank lines only");
    d = csv_desc(0, 0, 1, 0.0f);
    expect_csv_fail(f, "a,b,label\n", &d, 0, 0, "only a header");
    d = csv_desc(0, 0, 3, 0.0f);
    expect_csv_fail(f, "1,2,0\n3,4,1\n", &d, 0, 0, "more header lines than lines");

    /* a label column that does not exist */
    d = csv_desc(4, 0, 0, 0.0f);
    dsgd_ctx_clear_error(f->ctx);
    assert_true(load_csv(f, "bad.csv", "1,2,0\n", &d, &ds) < 0);
    assert_true(dsgd_ctx_last_error(f->ctx)[0] != '\0');
    assert_null(ds.x);
    /* missing file */
    snprintf(p, sizeof p, "%s/missing.csv", f->dir);
    memset(&ds, 0, sizeof ds);
    assert_int_equal(dsgd_dataset_load_csv(f->ctx, p, NULL, &ds), DSGD_ERR_IO);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "missing.csv"));
    /* with no context to record on, still an error (it was DSGD_OK once) */
    assert_int_equal(dsgd_dataset_load_csv(NULL, p, NULL, &ds), DSGD_ERR_IO);
    assert_null(ds.x);
    /* valid numbers that are not finite as floats, or once scaled: an
       error naming line and column, never +-inf in the features */
    expect_csv_fail(f, "1,2,0\n1e300,2,1\n", NULL, 2, 1, "1e300 overflows a float");
    expect_csv_fail(f, "1,2,0\n3,-3.5e38,1\n", NULL, 2, 2, "-3.5e38 overflows a float");
    d = csv_desc(0, 0, 0, 1e30f);
    expect_csv_fail(f, "1,2,0\n3,1e10,1\n", &d, 2, 2, "1e10 times scale 1e30");
    d = csv_desc(0, 0, 0, 1e30f);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_OK); /* 1e30 and 2e30 fit */
    assert_true(ds.x[0] == 1e30f && ds.x[1] == 2e30f);
    dsgd_dataset_free(&ds);
    /* bad descs: a negative, NaN or infinite scale */
    d = csv_desc(0, 0, 0, -2.0f);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "feature_scale"));
    assert_null(ds.x);
    d = csv_desc(0, 0, 0, NAN);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_ERR_INVALID_ARGUMENT);
    d = csv_desc(0, 0, 0, INFINITY);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_ERR_INVALID_ARGUMENT);
    d = csv_desc(-1, 0, 0, 0.0f);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_ERR_INVALID_ARGUMENT);
    d = csv_desc(0, -2, 0, 0.0f);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_ERR_INVALID_ARGUMENT);
    d = csv_desc(0, 0, -1, 0.0f);
    assert_int_equal(load_csv(f, "ok.csv", "1,2,0\n", &d, &ds), DSGD_ERR_INVALID_ARGUMENT);
}

/* The vendored UCI digits: 1797 samples of 64 pixels in 0..16, labels 0..9. */
static void test_csv_digits(void **state) {
    fx *f = (fx *)*state;
    char path[256], line[1024];
    dsgd_dataset ds;
    size_t i, counts[10] = {0};
    float mx = 0;
    FILE *fp;
    if (!tu_find_repo_file("examples/data/digits.csv", path, sizeof path))
        fail_msg("examples/data/digits.csv not found (run from the repository root)");
    TU_OK(f->ctx, dsgd_dataset_load_csv(f->ctx, path, NULL, &ds));
    assert_int_equal(ds.n, 1797);
    assert_int_equal(ds.dim, 64);
    assert_int_equal(ds.target_dim, 1);
    assert_int_equal(ds.num_classes, 10);
    for (i = 0; i < ds.n * 64; ++i) {
        assert_true(ds.x[i] >= 0.0f && ds.x[i] <= 16.0f && ds.x[i] == floorf(ds.x[i]));
        if (ds.x[i] > mx) mx = ds.x[i];
    }
    assert_true(mx == 16.0f);
    for (i = 0; i < ds.n; ++i) {
        int c = (int)ds.y[i];
        assert_true(ds.y[i] == (float)c && c >= 0 && c < 10);
        counts[c]++;
    }
    for (i = 0; i < 10; ++i) assert_true(counts[i] >= 170 && counts[i] <= 190);
    /* the first row is the file's first line */
    fp = fopen(path, "r");
    assert_non_null(fp);
    assert_non_null(fgets(line, sizeof line, fp));
    fclose(fp);
    {
        char *s = line;
        for (i = 0; i < 65; ++i) {
            double v = strtod(s, &s);
            if (i < 64)
                assert_true(ds.x[i] == (float)v);
            else
                assert_true(ds.y[0] == (float)v);
            if (*s == ',') ++s;
        }
    }
    dsgd_dataset_free(&ds);
}

/* ---------------------------------------------------------------- datasets */

static void make_ids(fx *f, dsgd_dataset *ds, size_t n) {
    size_t i;
    TU_OK(f->ctx, dsgd_dataset_alloc(f->ctx, n, 2, 1, 5, ds));
    for (i = 0; i < n; ++i) {
        ds->x[2 * i] = (float)i; /* the id */
        ds->x[2 * i + 1] = (float)i + 0.5f;
        ds->y[i] = (float)(i % 5);
    }
}

static void test_dataset_alloc_split_gather(void **state) {
    fx *f = (fx *)*state;
    dsgd_dataset src, a, b, a2, b2;
    size_t i, seen[20] = {0}, idx[4] = {4, 0, 4, 2};
    float gx[8], gy[4];
    int moved = 0;

    TU_OK(f->ctx, dsgd_dataset_alloc(f->ctx, 5, 3, 2, 0, &src));
    assert_int_equal(src.n, 5);
    assert_int_equal(src.dim, 3);
    assert_int_equal(src.target_dim, 2);
    assert_int_equal(src.num_classes, 0);
    for (i = 0; i < 15; ++i) assert_true(src.x[i] == 0.0f);
    for (i = 0; i < 10; ++i) assert_true(src.y[i] == 0.0f);
    dsgd_dataset_free(&src);

    make_ids(f, &src, 20);
    TU_OK(f->ctx, dsgd_dataset_split(f->ctx, &src, 7, 99, &a, &b));
    assert_int_equal(a.n, 7);
    assert_int_equal(b.n, 13);
    assert_int_equal(a.dim, 2);
    assert_int_equal(b.target_dim, 1);
    assert_int_equal(a.num_classes, 5);
    /* a + b is a permutation of src, rows intact */
    for (i = 0; i < 20; ++i) {
        const dsgd_dataset *d = i < 7 ? &a : &b;
        size_t r = i < 7 ? i : i - 7, id = (size_t)d->x[2 * r];
        assert_true(id < 20);
        assert_true(d->x[2 * r + 1] == (float)id + 0.5f);
        assert_true(d->y[r] == (float)(id % 5));
        seen[id]++;
        moved += id != i;
    }
    for (i = 0; i < 20; ++i) assert_int_equal(seen[i], 1);
    assert_true(moved > 0); /* shuffled */
    /* same seed, same split; another seed, another split */
    TU_OK(f->ctx, dsgd_dataset_split(f->ctx, &src, 7, 99, &a2, &b2));
    assert_memory_equal(a.x, a2.x, 7 * 2 * sizeof(float));
    assert_memory_equal(b.y, b2.y, 13 * sizeof(float));
    dsgd_dataset_free(&a2);
    dsgd_dataset_free(&b2);
    TU_OK(f->ctx, dsgd_dataset_split(f->ctx, &src, 7, 100, &a2, &b2));
    assert_memory_not_equal(a.x, a2.x, 7 * 2 * sizeof(float));
    dsgd_dataset_free(&a2);
    dsgd_dataset_free(&b2);
    dsgd_dataset_free(&a);
    dsgd_dataset_free(&b);
    /* all to a */
    TU_OK(f->ctx, dsgd_dataset_split(f->ctx, &src, 20, 1, &a, &b));
    assert_int_equal(a.n, 20);
    assert_int_equal(b.n, 0);
    dsgd_dataset_free(&a);
    dsgd_dataset_free(&b);
    /* first > n */
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    dsgd_ctx_clear_error(f->ctx);
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_dataset_split(f->ctx, &src, 21, 1, &a, &b));
    assert_null(a.x);
    assert_null(b.x);

    /* gather copies rows idx[...] */
    dsgd_dataset_gather(&src, idx, 4, gx, gy);
    for (i = 0; i < 4; ++i) {
        assert_true(gx[2 * i] == (float)idx[i]);
        assert_true(gx[2 * i + 1] == (float)idx[i] + 0.5f);
        assert_true(gy[i] == (float)(idx[i] % 5));
    }
    dsgd_dataset_free(&src);
}

/* ---------------------------------------------------------------- sampler */

static void collect(const dsgd_sampler *s, size_t *out, size_t n) {
    size_t b, k = 0, nb = dsgd_sampler_num_batches(s);
    for (b = 0; b < nb; ++b) {
        const size_t *idx = NULL;
        size_t c = dsgd_sampler_batch(s, b, &idx), i;
        assert_true(c > 0 && c <= s->batch);
        assert_non_null(idx);
        for (i = 0; i < c; ++i) {
            assert_true(k < n);
            out[k++] = idx[i];
        }
    }
}

static int is_perm(const size_t *p, size_t n) {
    char seen[1000] = {0};
    size_t i;
    for (i = 0; i < n; ++i) {
        if (p[i] >= n || seen[p[i]]) return 0;
        seen[p[i]] = 1;
    }
    return 1;
}

static void test_sampler(void **state) {
    fx *f = (fx *)*state;
    dsgd_sampler s, t;
    size_t e0[1000], e1[1000], again[1000], other[1000], i;
    const size_t *idx = NULL;
    int identity;

    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 10, 3, 7, 1, 0));
    assert_int_equal(dsgd_sampler_num_batches(&s), 4);
    assert_int_equal(dsgd_sampler_batch(&s, 0, &idx), 3);
    assert_int_equal(dsgd_sampler_batch(&s, 3, &idx), 1); /* the short last batch */
    assert_true(idx[0] == s.order[9]);
    assert_int_equal(dsgd_sampler_batch(&s, 4, &idx), 0);
    collect(&s, e0, 10);
    assert_true(is_perm(e0, 10));
    assert_memory_equal(e0, s.order, 10 * sizeof(size_t));
    dsgd_sampler_set_epoch(&s, 1);
    collect(&s, e1, 10);
    assert_true(is_perm(e1, 10));
    assert_memory_not_equal(e0, e1, 10 * sizeof(size_t));
    dsgd_sampler_set_epoch(&s, 0);
    collect(&s, again, 10);
    assert_memory_equal(e0, again, 10 * sizeof(size_t));
    dsgd_sampler_free(&s);

    /* drop_last: 3 full batches */
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 10, 3, 7, 1, 1));
    assert_int_equal(dsgd_sampler_num_batches(&s), 3);
    assert_int_equal(dsgd_sampler_batch(&s, 2, &idx), 3);
    assert_int_equal(dsgd_sampler_batch(&s, 3, &idx), 0);
    /* the order depends only on (seed, epoch), not on batch or drop_last */
    assert_memory_equal(s.order, e0, 10 * sizeof(size_t));
    dsgd_sampler_free(&s);
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 10, 5, 7, 1, 0));
    assert_int_equal(dsgd_sampler_num_batches(&s), 2);
    assert_memory_equal(s.order, e0, 10 * sizeof(size_t));
    dsgd_sampler_free(&s);
    /* exact multiple: no short batch either way */
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 12, 4, 7, 1, 0));
    assert_int_equal(dsgd_sampler_num_batches(&s), 3);
    assert_int_equal(dsgd_sampler_batch(&s, 2, &idx), 4);
    dsgd_sampler_free(&s);
    /* batch larger than n */
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 5, 8, 7, 1, 0));
    assert_int_equal(dsgd_sampler_num_batches(&s), 1);
    assert_int_equal(dsgd_sampler_batch(&s, 0, &idx), 5);
    dsgd_sampler_free(&s);
    /* ...with drop_last there is no batch at all: either an error at init
       or a sampler with zero batches */
    memset(&s, 0, sizeof s);
    dsgd_ctx_clear_error(f->ctx);
    if (dsgd_sampler_init(f->ctx, &s, 5, 8, 7, 1, 1) == DSGD_OK) {
        assert_int_equal(dsgd_sampler_num_batches(&s), 0);
        assert_int_equal(dsgd_sampler_batch(&s, 0, &idx), 0);
        dsgd_sampler_free(&s);
    } else {
        assert_int_equal(dsgd_ctx_last_result(f->ctx), DSGD_ERR_INVALID_ARGUMENT);
        assert_true(dsgd_ctx_last_error(f->ctx)[0] != '\0');
    }

    /* two samplers, same seed and epoch: same order; another seed: another */
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 1000, 32, 123, 1, 0));
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &t, 1000, 32, 123, 1, 0));
    dsgd_sampler_set_epoch(&s, 5);
    dsgd_sampler_set_epoch(&t, 5);
    collect(&s, e0, 1000);
    collect(&t, again, 1000);
    assert_true(is_perm(e0, 1000));
    assert_memory_equal(e0, again, 1000 * sizeof(size_t));
    dsgd_sampler_set_epoch(&t, 3); /* going through other epochs first changes nothing */
    dsgd_sampler_set_epoch(&t, 5);
    collect(&t, again, 1000);
    assert_memory_equal(e0, again, 1000 * sizeof(size_t));
    identity = 1;
    for (i = 0; i < 1000; ++i) identity &= e0[i] == i;
    assert_false(identity);
    dsgd_sampler_free(&t);
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &t, 1000, 32, 124, 1, 0));
    dsgd_sampler_set_epoch(&t, 5);
    collect(&t, other, 1000);
    assert_memory_not_equal(e0, other, 1000 * sizeof(size_t));
    dsgd_sampler_free(&t);
    assert_int_equal(dsgd_sampler_num_batches(&s), 32); /* 31 full + 8 */
    assert_int_equal(dsgd_sampler_batch(&s, 31, &idx), 8);
    dsgd_sampler_free(&s);

    /* shuffle off: identity order every epoch */
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 7, 2, 1, 0, 0));
    dsgd_sampler_set_epoch(&s, 3);
    collect(&s, e0, 7);
    for (i = 0; i < 7; ++i) assert_int_equal(e0[i], i);
    dsgd_sampler_free(&s);

    /* errors */
    dsgd_ctx_clear_error(f->ctx);
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_sampler_init(f->ctx, &s, 0, 4, 1, 1, 0));
    dsgd_ctx_clear_error(f->ctx);
    TU_ERR(f->ctx, DSGD_ERR_INVALID_ARGUMENT, dsgd_sampler_init(f->ctx, &s, 4, 0, 1, 1, 0));
}

/* Workers' shards (dsgd_sampler_worker_batch): 3 workers over 100 samples
   in batches of 7 (14 batches, 4 each per epoch, batches 12 and 13 left
   over): worker w's batch k is batch w + 3 (k % 4) of epoch k / 4, the
   shards of an epoch are disjoint, and the walk moves through the epochs. */
static void test_sampler_worker_batch(void **state) {
    fx *f = (fx *)*state;
    dsgd_sampler s, ref;
    const size_t *idx = NULL, *want = NULL;
    char seen[100];
    int w, k, i;
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &s, 100, 7, 9, 1, 1));
    TU_OK(f->ctx, dsgd_sampler_init(f->ctx, &ref, 100, 7, 9, 1, 1));
    for (w = 0; w < 3; ++w)
        for (k = 0; k < 12; ++k) { /* three epochs */
            size_t n = dsgd_sampler_worker_batch(&s, w, 3, (uint64_t)k, &idx);
            dsgd_sampler_set_epoch(&ref, (uint64_t)(k / 4));
            assert_int_equal(dsgd_sampler_batch(&ref, (size_t)(w + 3 * (k % 4)), &want), 7);
            assert_int_equal(n, 7);
            assert_int_equal(s.epoch, k / 4);
            assert_memory_equal(idx, want, 7 * sizeof(size_t));
        }
    /* epoch 1's shards: disjoint, 84 of the 100 samples */
    memset(seen, 0, sizeof seen);
    for (w = 0; w < 3; ++w)
        for (k = 4; k < 8; ++k) {
            assert_int_equal(dsgd_sampler_worker_batch(&s, w, 3, (uint64_t)k, &idx), 7);
            for (i = 0; i < 7; ++i) {
                assert_true(idx[i] < 100 && !seen[idx[i]]);
                seen[idx[i]] = 1;
            }
        }
    for (i = k = 0; i < 100; ++i) k += seen[i];
    assert_int_equal(k, 84);
    /* a worker out of range, more workers than batches, no sampler: 0 */
    assert_int_equal(dsgd_sampler_worker_batch(&s, 3, 3, 0, &idx), 0);
    assert_int_equal(dsgd_sampler_worker_batch(&s, -1, 3, 0, &idx), 0);
    assert_int_equal(dsgd_sampler_worker_batch(&s, 0, 15, 0, &idx), 0);
    assert_int_equal(dsgd_sampler_worker_batch(NULL, 0, 1, 0, &idx), 0);
    /* one worker takes every batch in order; idx may be NULL */
    assert_int_equal(dsgd_sampler_worker_batch(&s, 0, 1, 13, NULL), 7);
    assert_int_equal(s.epoch, 0);
    assert_int_equal(dsgd_sampler_worker_batch(&s, 0, 1, 14, &idx), 7);
    assert_int_equal(s.epoch, 1);
    dsgd_sampler_set_epoch(&ref, 1);
    assert_int_equal(dsgd_sampler_batch(&ref, 0, &want), 7);
    assert_memory_equal(idx, want, 7 * sizeof(size_t));
    dsgd_sampler_free(&s);
    dsgd_sampler_free(&ref);
}

/* ---------------------------------------------------------------- fuzz */

/* Mutates buf (length *n, capacity cap) in one of four ways. */
static void mutate(tu_rng *r, unsigned char *buf, size_t *n, size_t cap, int text) {
    static const char alphabet[] = "0123456789,.-+eE \n\r\tx";
    size_t k, i;
    switch (tu_below(r, 4)) {
    case 0: /* truncate */
        *n = tu_below(r, *n);
        break;
    case 1: /* replace 1..4 bytes anywhere */
        k = 1 + tu_below(r, 4);
        for (i = 0; i < k && *n; ++i) {
            size_t at = tu_below(r, *n);
            buf[at] = text ? (unsigned char)alphabet[tu_below(r, sizeof alphabet - 1)]
                           : (unsigned char)tu_below(r, 256);
        }
        break;
    case 2: /* replace one byte near the start (IDX header, CSV first line) */
        if (*n) {
            size_t at = tu_below(r, *n < 16 ? *n : 16);
            buf[at] = text ? (unsigned char)alphabet[tu_below(r, sizeof alphabet - 1)]
                           : (unsigned char)(tu_below(r, 2) ? 0xFF : tu_below(r, 256));
        }
        break;
    default: /* append 1..8 bytes */
        k = 1 + tu_below(r, 8);
        for (i = 0; i < k && *n < cap; ++i)
            buf[(*n)++] = text ? (unsigned char)alphabet[tu_below(r, sizeof alphabet - 1)]
                               : (unsigned char)tu_below(r, 256);
        break;
    }
}

static void check_outcome(fx *f, dsgd_result r, const dsgd_dataset *ds, size_t file_bytes,
                          int iter, const char *kind) {
    size_t i;
    const char *msg = dsgd_ctx_last_error(f->ctx);
    if (r != DSGD_OK) {
        if (r >= 0) fail_msg("%s mutation %d: result %d", kind, iter, (int)r);
        if (msg[0] == '\0') fail_msg("%s mutation %d: %s without a message", kind, iter,
                                     dsgd_result_string(r));
        if (ds->x || ds->y) fail_msg("%s mutation %d: failed load left buffers", kind, iter);
        return;
    }
    /* success: sizes consistent with the file and values in range */
    if (!(ds->n >= 1 && ds->dim >= 1 && ds->target_dim == 1 && ds->num_classes >= 1))
        fail_msg("%s mutation %d: loaded n=%zu dim=%d target_dim=%d classes=%d", kind, iter,
                 ds->n, ds->dim, ds->target_dim, ds->num_classes);
    if (ds->n > file_bytes || (size_t)ds->dim > file_bytes || ds->n * (size_t)ds->dim > file_bytes)
        fail_msg("%s mutation %d: %zu x %d from a %zu-byte file", kind, iter, ds->n, ds->dim,
                 file_bytes);
    for (i = 0; i < ds->n; ++i) {
        float y = ds->y[i];
        if (!(y >= 0 && y < (float)ds->num_classes && y == floorf(y)))
            fail_msg("%s mutation %d: label %g with %d classes", kind, iter, y, ds->num_classes);
    }
    if (strcmp(kind, "idx") == 0)
        for (i = 0; i < ds->n * (size_t)ds->dim; ++i)
            if (!(ds->x[i] >= 0.0f && ds->x[i] <= 1.0f))
                fail_msg("idx mutation %d: pixel %g", iter, ds->x[i]);
}

static void test_fuzz_loaders(void **state) {
    fx *f = (fx *)*state;
    static const char csv[] = "0.5,1,2,0\n3,4.25,5,1\n6,7,8e-1,2\n-9,10,11,1\n12,13,14,0\n";
    bytes gi, gl;
    unsigned char buf[4096 + 64], lbuf[4096 + 64];
    tu_rng r = tu_rng_make(2718);
    int iter, ok[3] = {0, 0, 0}, bad[3] = {0, 0, 0};
    char ip[256], lp[256], cp[256];
    good_images(&gi, 5, 3, 4);
    good_labels(&gl, 5);

    for (iter = 0; iter < 600; ++iter) {
        dsgd_dataset ds;
        dsgd_result res;
        int which = iter % 3; /* 0: images mutated, 1: labels mutated, 2: CSV */
        memset(&ds, 0, sizeof ds);
        dsgd_ctx_clear_error(f->ctx);
        if (which < 2) {
            size_t ni = gi.n, nl = gl.n;
            memcpy(buf, gi.d, gi.n);
            memcpy(lbuf, gl.d, gl.n);
            if (which == 0)
                mutate(&r, buf, &ni, sizeof buf, 0);
            else
                mutate(&r, lbuf, &nl, sizeof lbuf, 0);
            if (tu_below(&r, 4) == 0) { /* sometimes both */
                if (which == 0)
                    mutate(&r, lbuf, &nl, sizeof lbuf, 0);
                else
                    mutate(&r, buf, &ni, sizeof buf, 0);
            }
            tu_write_file(f->dir, "fz_imgs.idx", buf, ni, ip, sizeof ip);
            tu_write_file(f->dir, "fz_lbls.idx", lbuf, nl, lp, sizeof lp);
            /* num_classes: mostly the default (10), sometimes 1..11 */
            res = dsgd_dataset_load_idx(f->ctx, ip, lp,
                                        tu_below(&r, 3) ? 0 : 1 + (int)tu_below(&r, 11), &ds);
            check_outcome(f, res, &ds, ni, iter, "idx");
        } else {
            size_t n = strlen(csv);
            dsgd_csv_desc d = csv_desc(tu_below(&r, 2) ? 1 : 0, (int)tu_below(&r, 5), 0, 0.0f);
            memcpy(buf, csv, n);
            mutate(&r, buf, &n, sizeof buf, 1);
            if (tu_below(&r, 2)) mutate(&r, buf, &n, sizeof buf, 1);
            tu_write_file(f->dir, "fz.csv", buf, n, cp, sizeof cp);
            res = dsgd_dataset_load_csv(f->ctx, cp, &d, &ds);
            check_outcome(f, res, &ds, n, iter, "csv");
        }
        if (res == DSGD_OK)
            ok[which]++;
        else
            bad[which]++;
        dsgd_dataset_free(&ds);
    }
    print_message("    mutations accepted/rejected: images %d/%d, labels %d/%d, csv %d/%d\n",
                  ok[0], bad[0], ok[1], bad[1], ok[2], bad[2]);
    /* both outcomes occurred, so the loop exercised the loaders */
    assert_true(bad[0] > 0 && bad[1] > 0 && bad[2] > 0);
    assert_true(ok[0] + ok[1] > 0 && ok[2] > 0);
}

/* Paths that are not regular files: a directory must give an error (IO or
   FORMAT), never an allocation sized from what ftell reports for it (on
   ext4 that is up to 2^63). */
static void test_not_a_regular_file(void **state) {
    fx *f = (fx *)*state;
    dsgd_dataset ds;
    dsgd_result r;
    bytes gl;
    char lp[256];
    good_labels(&gl, 3);
    tu_write_file(f->dir, "lbls.idx", gl.d, gl.n, lp, sizeof lp);
    memset(&ds, 0, sizeof ds);
    dsgd_ctx_clear_error(f->ctx);
    r = dsgd_dataset_load_csv(f->ctx, f->dir, NULL, &ds);
    if (r != DSGD_ERR_IO && r != DSGD_ERR_FORMAT)
        fail_msg("load_csv(directory) -> %s: %s", dsgd_result_string(r), dsgd_ctx_last_error(f->ctx));
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), f->dir));
    assert_null(ds.x);
    dsgd_ctx_clear_error(f->ctx);
    r = dsgd_dataset_load_idx(f->ctx, f->dir, lp, 0, &ds);
    if (r != DSGD_ERR_IO && r != DSGD_ERR_FORMAT)
        fail_msg("load_idx(directory) -> %s: %s", dsgd_result_string(r), dsgd_ctx_last_error(f->ctx));
    assert_null(ds.x);
}

/* A FIFO with no writer: open() of it for reading blocks until a writer
   comes, so a loader that opened before checking the type hung forever. Both
   must say DSGD_ERR_IO at once; an alarm fails the test instead of hanging. */
static void on_fifo_alarm(int sig) {
    static const char msg[] = "test_fifo: a loader blocked on a FIFO for 10 s\n";
    (void)sig;
    if (write(2, msg, sizeof msg - 1) < 0) _exit(2);
    _exit(1);
}

static void test_fifo(void **state) {
    fx *f = (fx *)*state;
    dsgd_dataset ds;
    bytes gl;
    char fifo[256], lp[256];
    good_labels(&gl, 3);
    tu_write_file(f->dir, "lbls.idx", gl.d, gl.n, lp, sizeof lp);
    snprintf(fifo, sizeof fifo, "%s/fifo", f->dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    signal(SIGALRM, on_fifo_alarm);
    alarm(10);
    memset(&ds, 0, sizeof ds);
    assert_int_equal(dsgd_dataset_load_csv(f->ctx, fifo, NULL, &ds), DSGD_ERR_IO);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "not a regular file"));
    assert_null(ds.x);
    assert_int_equal(dsgd_dataset_load_idx(f->ctx, fifo, lp, 0, &ds), DSGD_ERR_IO);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "fifo: not a regular file"));
    assert_int_equal(dsgd_dataset_load_idx(f->ctx, lp, fifo, 0, &ds), DSGD_ERR_IO);
    assert_null(ds.x);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    unlink(fifo);
}

/* The loaders from memory give what the file loaders give on the same bytes
   (the file loaders now parse a file's bytes with them), read only their
   len bytes (no NUL needed), and name "CSV text" / "IDX images" in
   messages. */
static void same_dataset(const dsgd_dataset *a, const dsgd_dataset *b) {
    assert_int_equal(a->n, b->n);
    assert_int_equal(a->dim, b->dim);
    assert_int_equal(a->target_dim, b->target_dim);
    assert_int_equal(a->num_classes, b->num_classes);
    assert_memory_equal(a->x, b->x, a->n * (size_t)a->dim * sizeof(float));
    assert_memory_equal(a->y, b->y, a->n * (size_t)a->target_dim * sizeof(float));
}

static void test_parse_from_memory(void **state) {
    fx *f = (fx *)*state;
    static const char text[] = "0.5,2,1\n-3,4e-2,0\r\n\n7,8,2\nTRAILING,junk";
    size_t len = sizeof(text) - 1 - strlen("TRAILING,junk"); /* stop before the junk */
    dsgd_csv_desc d = csv_desc(0, 0, 0, 2.0f);
    dsgd_dataset a, b;
    bytes img, lbl;
    char copy[64];
    /* CSV: the same as the file loader on the same bytes */
    memcpy(copy, text, len);
    copy[len] = '\0';
    TU_OK(f->ctx, dsgd_dataset_parse_csv(f->ctx, text, len, &d, &a));
    TU_OK(f->ctx, load_csv(f, "mem.csv", copy, &d, &b));
    same_dataset(&a, &b);
    assert_int_equal(a.n, 3);
    assert_true(a.x[0] == 1.0f && a.x[3] == 0.08f && a.y[2] == 2.0f && a.num_classes == 3);
    dsgd_dataset_free(&a);
    dsgd_dataset_free(&b);
    /* the whole text, junk included, is an error naming the line */
    assert_int_equal(dsgd_dataset_parse_csv(f->ctx, text, sizeof(text) - 1, &d, &a), DSGD_ERR_FORMAT);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "CSV text: line 5"));
    assert_null(a.x);
    assert_int_equal(dsgd_dataset_parse_csv(f->ctx, NULL, 3, NULL, &a), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_dataset_parse_csv(f->ctx, NULL, 0, NULL, &a), DSGD_ERR_FORMAT); /* no data lines */
    d.feature_scale = -1.0f;
    assert_int_equal(dsgd_dataset_parse_csv(f->ctx, text, len, &d, &a), DSGD_ERR_INVALID_ARGUMENT);
    /* IDX */
    good_images(&img, 4, 3, 2);
    good_labels(&lbl, 4);
    TU_OK(f->ctx, dsgd_dataset_parse_idx(f->ctx, img.d, img.n, lbl.d, lbl.n, 0, &a));
    TU_OK(f->ctx, load_idx(f, &img, &lbl, 0, &b));
    same_dataset(&a, &b);
    assert_int_equal(a.n, 4);
    assert_int_equal(a.dim, 6);
    dsgd_dataset_free(&a);
    dsgd_dataset_free(&b);
    assert_int_equal(dsgd_dataset_parse_idx(f->ctx, img.d, img.n - 1, lbl.d, lbl.n, 0, &a), DSGD_ERR_FORMAT);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "IDX images: truncated"));
    assert_int_equal(dsgd_dataset_parse_idx(f->ctx, img.d, img.n, lbl.d, 3, 0, &a), DSGD_ERR_FORMAT);
    assert_non_null(strstr(dsgd_ctx_last_error(f->ctx), "IDX labels: truncated IDX header"));
    assert_int_equal(dsgd_dataset_parse_idx(f->ctx, NULL, 16, lbl.d, lbl.n, 0, &a), DSGD_ERR_INVALID_ARGUMENT);
    assert_int_equal(dsgd_dataset_parse_idx(f->ctx, NULL, 0, NULL, 0, 0, &a), DSGD_ERR_FORMAT);
    assert_int_equal(dsgd_dataset_parse_idx(f->ctx, img.d, img.n, lbl.d, lbl.n, 300, &a), DSGD_ERR_INVALID_ARGUMENT);
    assert_null(a.x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_idx_good, setup, teardown),
        cmocka_unit_test_setup_teardown(test_idx_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_csv_good, setup, teardown),
        cmocka_unit_test_setup_teardown(test_csv_malformed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_csv_digits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dataset_alloc_split_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sampler, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sampler_worker_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fuzz_loaders, setup, teardown),
        cmocka_unit_test_setup_teardown(test_not_a_regular_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parse_from_memory, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
