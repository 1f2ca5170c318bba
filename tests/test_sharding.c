/* test_sharding.c - partitioners and the shard map (distsgd/sharding.h).

   - The examples in TensorFlow's partitioner docs, literally: FixedShards(2)
     on [10, 3] float32 is 2; MinSize(4 bytes, max 2) on [6, 1] is 2, with max
     10 it is 6; MaxSize(4 bytes) on [6, 1] is 6, with max 2 it is 2, and
     MaxSize(1024) is 1; min_max_variable_partitioner's docstring: [1024, 1024]
     float32 at 256 KiB is 16 shards, or max_partitions when that is below.
   - Every kind against a second, independent computation of TF's Python
     formulas in double (ceil/floor of true quotients), over seeded random
     shapes and settings.
   - The "div" rule (TF's own example: 10 rows in 4 shards are 3, 3, 2, 2 at
     offsets 0, 3, 6, 8) and round-robin placement with one counter across
     variables; every map tiles each variable exactly (no float in two shards,
     none left out), and each server's float count is the sum of its shards.
   - A real model's variables, shards checked against the model's buffer.
   - Errors: each bad argument is refused with a message naming it.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

static int shards_of(const dsgd_partitioner *p, int rank, int d0, int d1) {
    int shape[2] = {d0, d1}, n = -1;
    dsgd_result r = dsgd_partitioner_num_shards(NULL, p, rank, shape, 4, &n);
    if (r != DSGD_OK) fail_msg("dsgd_partitioner_num_shards -> %s", dsgd_result_string(r));
    return n;
}

static dsgd_partitioner fixed(int k) {
    dsgd_partitioner p;
    memset(&p, 0, sizeof p);
    p.kind = DSGD_PARTITIONER_FIXED_SHARDS;
    p.num_shards = k;
    return p;
}

static dsgd_partitioner min_size(size_t bytes, int max_shards) {
    dsgd_partitioner p;
    memset(&p, 0, sizeof p);
    p.kind = DSGD_PARTITIONER_MIN_SIZE;
    p.min_shard_bytes = bytes;
    p.max_shards = max_shards;
    return p;
}

static dsgd_partitioner max_size(size_t bytes, int max_shards) {
    dsgd_partitioner p;
    memset(&p, 0, sizeof p);
    p.kind = DSGD_PARTITIONER_MAX_SIZE;
    p.max_shard_bytes = bytes;
    p.max_shards = max_shards;
    return p;
}

static void test_tf_doc_examples(void **state) {
    dsgd_partitioner p;
    (void)state;
    p = fixed(2);
    assert_int_equal(shards_of(&p, 2, 10, 3), 2);
    p = min_size(4, 2);
    assert_int_equal(shards_of(&p, 2, 6, 1), 2);
    p = min_size(4, 10);
    assert_int_equal(shards_of(&p, 2, 6, 1), 6);
    p = max_size(4, 0);
    assert_int_equal(shards_of(&p, 2, 6, 1), 6);
    p = max_size(4, 2);
    assert_int_equal(shards_of(&p, 2, 6, 1), 2);
    p = max_size(1024, 0);
    assert_int_equal(shards_of(&p, 2, 6, 1), 1);
    /* min_max_variable_partitioner: (1024 * 1024 * 4) / (256 * 1024) = 16 */
    p = min_size(256 << 10, 16);
    assert_int_equal(shards_of(&p, 2, 1024, 1024), 16);
    p = min_size(256 << 10, 100);
    assert_int_equal(shards_of(&p, 2, 1024, 1024), 16);
    p = min_size(256 << 10, 7);
    assert_int_equal(shards_of(&p, 2, 1024, 1024), 7);
    /* MinSize's defaults are TF's: 256 KiB, at most 1 shard */
    p = min_size(0, 0);
    assert_int_equal(shards_of(&p, 2, 1024, 1024), 1);
    p = min_size(0, 64);
    assert_int_equal(shards_of(&p, 2, 1024, 1024), 16);
    /* FixedShards is capped by the rows; rank 0 and NONE never cut */
    p = fixed(5);
    assert_int_equal(shards_of(&p, 2, 3, 4), 3);
    assert_int_equal(shards_of(&p, 0, 0, 0), 1);
    assert_int_equal(shards_of(NULL, 2, 100, 100), 1);
    p.kind = DSGD_PARTITIONER_NONE;
    assert_int_equal(shards_of(&p, 1, 100, 0), 1);
}

/* TF's Python formulas, in double, written apart from the library's. */
static int tf_formula(const dsgd_partitioner *p, int rows, int cols) {
    double elems = (double)rows * cols, bytes = elems * 4.0, k;
    switch (p->kind) {
    case DSGD_PARTITIONER_FIXED_SHARDS: return p->num_shards < rows ? p->num_shards : rows;
    case DSGD_PARTITIONER_MIN_SIZE:
        k = ceil(bytes / (double)(p->min_shard_bytes ? p->min_shard_bytes : 256 << 10));
        if (k > rows) k = rows;
        if (k > (p->max_shards ? p->max_shards : 1)) k = p->max_shards ? p->max_shards : 1;
        return k < 1 ? 1 : (int)k;
    case DSGD_PARTITIONER_MAX_SIZE: {
        double per_slice = elems / rows * 4.0, per_shard = floor((double)p->max_shard_bytes / per_slice);
        if (per_shard < 1) per_shard = 1;
        k = ceil((double)rows / per_shard);
        if (p->max_shards && k > p->max_shards) k = p->max_shards;
        return (int)k;
    }
    default: return 1;
    }
}

static void test_formulas_against_tf(void **state) {
    uint64_t rng = 20261124;
    int i;
    (void)state;
    for (i = 0; i < 20000; i++) {
        int rows = 1 + (int)(dsgd_rng_next(&rng) % 3000);
        int cols = 1 + (int)(dsgd_rng_next(&rng) % 600);
        size_t bytes = 1 + (size_t)(dsgd_rng_next(&rng) % (1u << 22));
        int maxs = (int)(dsgd_rng_next(&rng) % 40);
        dsgd_partitioner p;
        switch (i % 3) {
        case 0: p = fixed(1 + (int)(dsgd_rng_next(&rng) % 64)); break;
        case 1: p = min_size(i % 7 ? bytes : 0, maxs); break;
        default: p = max_size(bytes, maxs); break;
        }
        if (shards_of(&p, 2, rows, cols) != tf_formula(&p, rows, cols))
            fail_msg("%s num %d min %zu max %zu max_shards %d on [%d, %d]: %d, TF's formula %d",
                     dsgd_partitioner_kind_name(p.kind), p.num_shards, p.min_shard_bytes, p.max_shard_bytes,
                     p.max_shards, rows, cols, shards_of(&p, 2, rows, cols), tf_formula(&p, rows, cols));
    }
}

static dsgd_variable var(const char *name, size_t offset, int rank, int d0, int d1) {
    dsgd_variable v;
    memset(&v, 0, sizeof v);
    snprintf(v.name, sizeof v.name, "%s", name);
    v.offset = offset;
    v.rank = rank;
    v.shape[0] = d0;
    v.shape[1] = rank == 2 ? d1 : 0;
    v.count = (size_t)d0 * (size_t)(rank == 2 ? d1 : 1);
    return v;
}

/* Every shard lies in its variable, rows and floats agree, shards of one
   variable are consecutive in rows and tile it; servers are round-robin in
   list order from 0; server floats are the sums. */
static void check_map(const dsgd_shard_map *m, const dsgd_variable *vars, int n, int servers) {
    size_t *sum = (size_t *)calloc((size_t)servers, sizeof *sum);
    int v, i, at = 0;
    assert_non_null(sum);
    assert_int_equal(dsgd_shard_map_num_servers(m), servers);
    for (v = 0; v < n; v++) {
        int k = -1, row = 0;
        const dsgd_shard *s = dsgd_shard_map_variable_shards(m, v, &k);
        size_t row_floats = vars[v].count / (size_t)vars[v].shape[0];
        assert_non_null(s);
        assert_true(k >= 1);
        assert_ptr_equal(s, dsgd_shard_map_shard(m, at));
        for (i = 0; i < k; i++, at++) {
            assert_int_equal(s[i].variable, v);
            assert_int_equal(s[i].part, i);
            assert_int_equal(s[i].server, at % servers);
            assert_int_equal(s[i].row_begin, row);
            assert_true(s[i].rows >= 1);
            assert_true(s[i].rows == vars[v].shape[0] / k || s[i].rows == vars[v].shape[0] / k + 1);
            assert_true(i == 0 || s[i].rows <= s[i - 1].rows);
            assert_true(s[i].offset == vars[v].offset + (size_t)row * row_floats);
            assert_true(s[i].count == (size_t)s[i].rows * row_floats);
            sum[s[i].server] += s[i].count;
            row += s[i].rows;
        }
        assert_int_equal(row, vars[v].shape[0]);
    }
    assert_int_equal(at, dsgd_shard_map_num_shards(m));
    for (i = 0; i < servers; i++) assert_true(sum[i] == dsgd_shard_map_server_floats(m, i));
    free(sum);
}

static void test_div_rule_and_round_robin(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_shard_map *m = NULL;
    dsgd_variable vars[3];
    dsgd_partitioner p = fixed(4);
    const dsgd_shard *s;
    int k;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    vars[0] = var("a", 0, 2, 10, 3);  /* 4 shards: 3, 3, 2, 2 rows */
    vars[1] = var("b", 30, 1, 2, 0);  /* 2 shards (capped by rows) */
    vars[2] = var("c", 32, 2, 4, 5);  /* 4 shards of 1 row */
    TU_OK(ctx, dsgd_shard_map_create(ctx, vars, 3, 3, &p, &m));
    s = dsgd_shard_map_variable_shards(m, 0, &k);
    assert_int_equal(k, 4);
    assert_int_equal(s[0].rows, 3); assert_int_equal(s[1].rows, 3);
    assert_int_equal(s[2].rows, 2); assert_int_equal(s[3].rows, 2);
    assert_int_equal(s[0].row_begin, 0); assert_int_equal(s[1].row_begin, 3);
    assert_int_equal(s[2].row_begin, 6); assert_int_equal(s[3].row_begin, 8);
    assert_true(s[2].offset == 18 && s[2].count == 6);
    /* one counter across variables: a on 0 1 2 0, b on 1 2, c on 0 1 2 0 */
    assert_int_equal(s[3].server, 0);
    s = dsgd_shard_map_variable_shards(m, 1, &k);
    assert_int_equal(k, 2);
    assert_int_equal(s[0].server, 1); assert_int_equal(s[1].server, 2);
    assert_true(s[1].offset == 31 && s[1].count == 1);
    s = dsgd_shard_map_variable_shards(m, 2, &k);
    assert_int_equal(k, 4);
    assert_int_equal(s[0].server, 0); assert_int_equal(s[3].server, 0);
    /* server 0: a0 (9) + a3 (6) + c0 (5) + c3 (5) = 25; 1: a1 9 + b0 1 + c1 5; 2: a2 6 + b1 1 + c2 5 */
    assert_true(dsgd_shard_map_server_floats(m, 0) == 25);
    assert_true(dsgd_shard_map_server_floats(m, 1) == 15);
    assert_true(dsgd_shard_map_server_floats(m, 2) == 12);
    check_map(m, vars, 3, 3);
    dsgd_shard_map_destroy(m);
    /* whole variables (NULL partitioner): one shard each, servers 0 1 0 */
    TU_OK(ctx, dsgd_shard_map_create(ctx, vars, 3, 2, NULL, &m));
    assert_int_equal(dsgd_shard_map_num_shards(m), 3);
    assert_int_equal(dsgd_shard_map_shard(m, 2)->server, 0);
    assert_true(dsgd_shard_map_server_floats(m, 0) == 50 && dsgd_shard_map_server_floats(m, 1) == 2);
    check_map(m, vars, 3, 2);
    assert_null(dsgd_shard_map_shard(m, 3));
    assert_null(dsgd_shard_map_shard(m, -1));
    assert_null(dsgd_shard_map_variable_shards(m, 3, &k));
    assert_int_equal(k, 0);
    dsgd_shard_map_destroy(m);
    dsgd_ctx_destroy(ctx);
}

static void test_model_variables(void **state) {
    static const dsgd_layer_desc layers[3] = {{64, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {33, DSGD_ACT_RELU, DSGD_INIT_AUTO},
                                              {10, DSGD_ACT_NONE, DSGD_INIT_AUTO}};
    dsgd_ctx *ctx = NULL;
    dsgd_model *model = NULL;
    dsgd_model_desc md;
    dsgd_variable vars[6];
    dsgd_partitioner parts[4];
    int servers, i, pi;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    memset(&md, 0, sizeof md);
    md.input_dim = 50;
    md.layers = layers;
    md.num_layers = 3;
    md.seed = 1;
    TU_OK(ctx, dsgd_model_create(ctx, &md, &model));
    assert_int_equal(dsgd_model_num_variables(model), 6);
    for (i = 0; i < 6; i++) vars[i] = *dsgd_model_variable(model, i);
    memset(&parts[0], 0, sizeof parts[0]);
    parts[1] = fixed(3);
    parts[2] = min_size(1000, 4);
    parts[3] = max_size(512, 0);
    for (pi = 0; pi < 4; pi++)
        for (servers = 1; servers <= 5; servers++) {
            dsgd_shard_map *m = NULL;
            size_t total = 0;
            TU_OK(ctx, dsgd_shard_map_create(ctx, vars, 6, servers, &parts[pi], &m));
            check_map(m, vars, 6, servers);
            for (i = 0; i < servers; i++) total += dsgd_shard_map_server_floats(m, i);
            assert_true(total == dsgd_model_num_params(model));
            dsgd_shard_map_destroy(m);
        }
    dsgd_model_destroy(model);
    dsgd_ctx_destroy(ctx);
}

static void expect_error(dsgd_ctx *ctx, dsgd_result got, const char *needle) {
    if (got != DSGD_ERR_INVALID_ARGUMENT)
        fail_msg("got %s, want DSGD_ERR_INVALID_ARGUMENT (%s)", dsgd_result_string(got), needle);
    if (!strstr(dsgd_ctx_last_error(ctx), needle))
        fail_msg("message \"%s\" lacks \"%s\"", dsgd_ctx_last_error(ctx), needle);
}

static void test_errors(void **state) {
    dsgd_ctx *ctx = NULL;
    dsgd_shard_map *m = NULL;
    dsgd_variable vars[2];
    dsgd_partitioner p;
    int shape[2] = {4, 4}, bad[2] = {4, 0}, n;
    (void)state;
    TU_OK(NULL, dsgd_ctx_create(NULL, &ctx));
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, NULL, 2, shape, 4, NULL), "out is NULL");
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, NULL, 2, bad, 4, &n), "axis 1 is 0");
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, NULL, 2, NULL, 4, &n), "rank 2");
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, NULL, 9, shape, 4, &n), "rank 9");
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, NULL, 2, shape, 0, &n), "elem_bytes 0");
    p = fixed(0);
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, &p, 2, shape, 4, &n), "num_shards >= 1, not 0");
    p = min_size(4, -1);
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, &p, 2, shape, 4, &n), "MIN_SIZE needs max_shards >= 0");
    p = max_size(0, 0);
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, &p, 2, shape, 4, &n), "max_shard_bytes >= 1");
    p.kind = (dsgd_partitioner_kind)9;
    expect_error(ctx, dsgd_partitioner_num_shards(ctx, &p, 2, shape, 4, &n), "unknown partitioner kind 9");
    assert_string_equal(dsgd_partitioner_kind_name(p.kind), "?");
    assert_string_equal(dsgd_partitioner_kind_name(DSGD_PARTITIONER_MAX_SIZE), "MAX_SIZE");

    vars[0] = var("w", 0, 2, 4, 4);
    vars[1] = var("b", 15, 1, 4, 0);
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 2, NULL, &m), "variables 0 (\"w\") and 1 (\"b\") overlap");
    assert_null(m);
    vars[1] = var("b", 16, 1, 4, 0);
    vars[1].count = 5;
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 2, NULL, &m), "variable 1 (\"b\") has count 5");
    vars[1] = var("b", 16, 1, 4, 0);
    vars[1].rank = DSGD_MAX_RANK + 1;
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 2, NULL, &m), "variable 1 (\"b\") has rank 5");
    vars[1] = var("b", 16, 1, 4, 0);
    vars[1].shape[0] = -4;
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 2, NULL, &m), "axis 0 = -4");
    vars[1] = var("b", 16, 1, 4, 0);
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 0, NULL, &m), "num_servers >= 1 (got 0)");
    expect_error(ctx, dsgd_shard_map_create(ctx, NULL, 2, 1, NULL, &m), "need vars");
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 1, NULL, NULL), "out is NULL");
    p = fixed(-2);
    expect_error(ctx, dsgd_shard_map_create(ctx, vars, 2, 1, &p, &m), "num_shards >= 1, not -2");
    assert_null(m);
    /* no variables: an empty map */
    TU_OK(ctx, dsgd_shard_map_create(ctx, NULL, 0, 2, NULL, &m));
    assert_int_equal(dsgd_shard_map_num_shards(m), 0);
    assert_true(dsgd_shard_map_server_floats(m, 1) == 0);
    dsgd_shard_map_destroy(m);
    dsgd_shard_map_destroy(NULL);
    assert_int_equal(dsgd_shard_map_num_shards(NULL), 0);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tf_doc_examples),
        cmocka_unit_test(test_formulas_against_tf),
        cmocka_unit_test(test_div_rule_and_round_robin),
        cmocka_unit_test(test_model_variables),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
