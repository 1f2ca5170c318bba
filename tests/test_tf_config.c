/* test_tf_config.c - TF_CONFIG parsing (distsgd/tf_config.h).

   - Valid configs, as TF's docs and multi_worker_util write them: with and
     without a chief, with parameter servers, with an evaluator, a single
     worker, none at all; each with its addresses, counts, the rank layout
     (chief, workers, ps; the evaluator apart), num_workers_total and
     is_chief (TF's is_chief: the chief, the evaluator, or worker 0 when
     there is no chief).
   - The evaluator: rank 0 of 1 and a chief of its own beside any training
     cluster (TF's id_in_cluster, worker_count and is_chief for it); one
     missing from the cluster refused with a message naming TF's
     worker_count, where TF refuses it.
   - Every rule of TF's _validate_cluster_spec and of this part, each
     refused with DSGD_ERR_INVALID_ARGUMENT and a message naming it.
   - Malformed JSON at many places (DSGD_ERR_FORMAT with the byte offset),
     and every prefix of a valid config refused without a crash or a leak.
   - Escapes (\uXXXX to UTF-8, surrogate pairs; lone surrogates refused),
     nesting up to and past DSGD_TF_CONFIG_MAX_DEPTH, huge numbers,
     duplicate keys (refused), ignored keys, and dsgd_tf_config_from_env.

   Build: make test (this file is compiled without the implementation and
   linked against the library built once per variant). */
#include "harness.h"

static dsgd_ctx *make_ctx(void) {
    dsgd_ctx *ctx = NULL;
    if (dsgd_ctx_create(NULL, &ctx) != DSGD_OK) fail_msg("dsgd_ctx_create");
    return ctx;
}

/* Parses s, fails unless DSGD_OK. */
static void parse_ok(dsgd_ctx *ctx, const char *s, dsgd_cluster_config *c) {
    dsgd_result r = dsgd_tf_config_parse(ctx, s, strlen(s), c);
    if (r != DSGD_OK) fail_msg("%s -> %s: %s", s, dsgd_result_string(r), dsgd_ctx_last_error(ctx));
}

/* Parses s, fails unless it gives want with a message holding msg; *out
   must be left empty. */
static void parse_fails(dsgd_ctx *ctx, const char *s, size_t len, dsgd_result want, const char *msg) {
    dsgd_cluster_config c;
    int t;
    dsgd_result r = dsgd_tf_config_parse(ctx, s, len, &c);
    if (r != want)
        fail_msg("%.*s -> %s (%s), want %s", (int)len, s, dsgd_result_string(r), dsgd_ctx_last_error(ctx),
                 dsgd_result_string(want));
    if (msg && !strstr(dsgd_ctx_last_error(ctx), msg))
        fail_msg("%.*s: message \"%s\" lacks \"%s\"", (int)len, s, dsgd_ctx_last_error(ctx), msg);
    assert_null(c.storage);
    assert_null(c.rpc_layer);
    for (t = 0; t < DSGD_TASK_TYPE_COUNT; ++t) {
        assert_int_equal(c.num_tasks[t], 0);
        assert_null(c.addresses[t]);
    }
    dsgd_cluster_config_free(&c);
}

static void fails(dsgd_ctx *ctx, const char *s, dsgd_result want, const char *msg) {
    parse_fails(ctx, s, strlen(s), want, msg);
}

typedef struct valid_case {
    const char *json;
    int chief, worker, ps, evaluator; /* job sizes */
    dsgd_task_type type;
    int index, rank, total, is_chief;
    const char *rpc;                  /* NULL: none */
    const char *first_worker;         /* addresses[WORKER][0], or NULL */
} valid_case;

static void test_valid_configs(void **state) {
    static const valid_case cases[] = {
        /* MultiWorkerMirroredStrategy: no chief, worker 0 is the chief. */
        {"{\"cluster\": {\"worker\": [\"localhost:12345\", \"localhost:23456\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}",
         0, 2, 0, 0, DSGD_TASK_WORKER, 0, 0, 2, 1, NULL, "localhost:12345"},
        {"{\"cluster\": {\"worker\": [\"localhost:12345\", \"localhost:23456\"]}, \"task\": {\"type\": \"worker\", \"index\": 1}}",
         0, 2, 0, 0, DSGD_TASK_WORKER, 1, 1, 2, 0, NULL, "localhost:12345"},
        /* With a chief: the chief is rank 0 and workers follow it. */
        {"{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w0:2\",\"w1:3\",\"w2:4\"]},\"task\":{\"type\":\"chief\",\"index\":0}}",
         1, 3, 0, 0, DSGD_TASK_CHIEF, 0, 0, 4, 1, NULL, "w0:2"},
        {"{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w0:2\",\"w1:3\",\"w2:4\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
         1, 3, 0, 0, DSGD_TASK_WORKER, 0, 1, 4, 0, NULL, "w0:2"},
        {"{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w0:2\",\"w1:3\",\"w2:4\"]},\"task\":{\"type\":\"worker\",\"index\":2}}",
         1, 3, 0, 0, DSGD_TASK_WORKER, 2, 3, 4, 0, NULL, "w0:2"},
        /* ParameterServerStrategy: ps after chief and workers. */
        {"{\"cluster\":{\"worker\":[\"w0:1\",\"w1:1\"],\"ps\":[\"p0:1\",\"p1:1\"],\"chief\":[\"c:1\"]},"
         "\"task\":{\"type\":\"ps\",\"index\":1},\"rpc_layer\":\"grpc\"}",
         1, 2, 2, 0, DSGD_TASK_PS, 1, 4, 3, 0, "grpc", "w0:1"},
        {"{\"cluster\":{\"worker\":[\"w0:1\"],\"ps\":[\"p0:1\"]},\"task\":{\"type\":\"ps\",\"index\":0}}",
         0, 1, 1, 0, DSGD_TASK_PS, 0, 1, 1, 0, NULL, "w0:1"},
        /* The evaluator stands apart, in a cluster of its own: rank 0 of 1,
           a chief of its own (TF's id_in_cluster, worker_count, is_chief). */
        {"{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w:1\"],\"evaluator\":[\"e:1\"]},\"task\":{\"type\":\"evaluator\",\"index\":0}}",
         1, 1, 0, 1, DSGD_TASK_EVALUATOR, 0, 0, 1, 1, NULL, "w:1"},
        {"{\"cluster\":{\"evaluator\":[\"e:1\"]},\"task\":{\"type\":\"evaluator\",\"index\":0}}",
         0, 0, 0, 1, DSGD_TASK_EVALUATOR, 0, 0, 1, 1, NULL, NULL},
        /* A ps-only cluster with a chief task elsewhere is fine too. */
        {"{\"cluster\":{\"chief\":[\"c:1\"],\"ps\":[\"p:1\"]},\"task\":{\"type\":\"chief\",\"index\":0}}",
         1, 0, 1, 0, DSGD_TASK_CHIEF, 0, 0, 1, 1, NULL, NULL},
        /* Single process: nothing, or only ignored keys, or an empty cluster. */
        {"{}", 0, 0, 0, 0, DSGD_TASK_NONE, 0, 0, 1, 1, NULL, NULL},
        {" \t\r\n{ \"environment\" : \"cloud\" , \"session_master\": \"grpc://x:1\" } \n", 0, 0, 0, 0, DSGD_TASK_NONE,
         0, 0, 1, 1, NULL, NULL},
        {"{\"cluster\":{}}", 0, 0, 0, 0, DSGD_TASK_NONE, 0, 0, 1, 1, NULL, NULL},
        {"{\"rpc_layer\":null}", 0, 0, 0, 0, DSGD_TASK_NONE, 0, 0, 1, 1, NULL, NULL},
        /* Ignored keys of any shape, in the top level and in the task; -0 is 0. */
        {"{\"x\":[1,-2.5e+3,true,false,null,{\"a\":[[]]},\"\\u0000\"],\"task\":{\"trial\":\"t\",\"type\":\"worker\","
         "\"index\":-0},\"cluster\":{\"worker\":[\"w:1\"]},\"rpc_layer\":\"grpc+verbs\"}",
         0, 1, 0, 0, DSGD_TASK_WORKER, 0, 0, 1, 1, "grpc+verbs", "w:1"},
        /* An empty job is a job of no tasks (a task of another type works). */
        {"{\"cluster\":{\"worker\":[\"w:1\"],\"ps\":[]},\"task\":{\"index\":0,\"type\":\"worker\"}}",
         0, 1, 0, 0, DSGD_TASK_WORKER, 0, 0, 1, 1, NULL, "w:1"},
    };
    dsgd_ctx *ctx = make_ctx();
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        const valid_case *k = &cases[i];
        dsgd_cluster_config c;
        parse_ok(ctx, k->json, &c);
        assert_int_equal(c.num_tasks[DSGD_TASK_CHIEF], k->chief);
        assert_int_equal(c.num_tasks[DSGD_TASK_WORKER], k->worker);
        assert_int_equal(c.num_tasks[DSGD_TASK_PS], k->ps);
        assert_int_equal(c.num_tasks[DSGD_TASK_EVALUATOR], k->evaluator);
        assert_int_equal(c.task_type, k->type);
        assert_int_equal(c.task_index, k->index);
        assert_int_equal(c.rank, k->rank);
        assert_int_equal(c.num_workers_total, k->total);
        assert_int_equal(c.is_chief, k->is_chief);
        if (k->rpc) assert_string_equal(c.rpc_layer, k->rpc);
        else assert_null(c.rpc_layer);
        if (k->first_worker) assert_string_equal(c.addresses[DSGD_TASK_WORKER][0], k->first_worker);
        else assert_null(c.addresses[DSGD_TASK_WORKER]);
        dsgd_cluster_config_free(&c);
        assert_null(c.storage);
        dsgd_cluster_config_free(&c); /* twice is fine */
    }
    dsgd_ctx_destroy(ctx);
}

/* The evaluator, as TF's multi_worker_util counts it: worker_count is the
   size of the "evaluator" job (1), id_in_cluster its index (0), is_chief
   true, whatever the training cluster beside it; its cluster check lets a
   missing evaluator pass, worker_count refuses it. */
static void test_evaluator_apart(void **state) {
    static const char *const clusters[] = {
        "{\"evaluator\":[\"e:1\"]}",
        "{\"chief\":[\"c:1\"],\"worker\":[\"w:1\",\"w:2\",\"w:3\"],\"evaluator\":[\"e:1\"]}",
        "{\"worker\":[\"w:1\",\"w:2\"],\"ps\":[\"p:1\",\"p:2\"],\"evaluator\":[\"e:1\"]}",
    };
    dsgd_ctx *ctx = make_ctx();
    char json[256];
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(clusters) / sizeof(clusters[0]); ++i) {
        dsgd_cluster_config c;
        snprintf(json, sizeof(json), "{\"cluster\":%s,\"task\":{\"type\":\"evaluator\",\"index\":0}}", clusters[i]);
        parse_ok(ctx, json, &c);
        assert_int_equal(c.task_type, DSGD_TASK_EVALUATOR);
        assert_int_equal(c.rank, 0);
        assert_int_equal(c.num_workers_total, 1);
        assert_true(c.rank < c.num_workers_total);
        assert_int_equal(c.is_chief, 1);
        assert_string_equal(c.addresses[DSGD_TASK_EVALUATOR][0], "e:1");
        dsgd_cluster_config_free(&c);
    }
    /* the training cluster beside it still counts its own workers */
    {
        dsgd_cluster_config c;
        parse_ok(ctx, "{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w:1\",\"w:2\",\"w:3\"],\"evaluator\":[\"e:1\"]},"
                      "\"task\":{\"type\":\"worker\",\"index\":2}}", &c);
        assert_int_equal(c.rank, 3);
        assert_int_equal(c.num_workers_total, 4);
        assert_int_equal(c.is_chief, 0);
        dsgd_cluster_config_free(&c);
    }
    /* missing: refused, the message saying where TF refuses it */
    fails(ctx, "{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"evaluator\",\"index\":0}}",
          DSGD_ERR_INVALID_ARGUMENT,
          "TF_CONFIG: the task's type \"evaluator\" is not a job of the cluster (TF's worker_count refuses that)");
    /* present: its index is checked as any job's (at most one evaluator) */
    fails(ctx, "{\"cluster\":{\"evaluator\":[\"e:1\"]},\"task\":{\"type\":\"evaluator\",\"index\":1}}",
          DSGD_ERR_INVALID_ARGUMENT, "the task's index 1 exceeds the largest index of job \"evaluator\" (0)");
    /* the other jobs' message is unchanged */
    fails(ctx, "{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"chief\",\"index\":0}}",
          DSGD_ERR_INVALID_ARGUMENT, "the task's type \"chief\" is not a job of the cluster");
    assert_null(strstr(dsgd_ctx_last_error(ctx), "worker_count"));
    dsgd_ctx_destroy(ctx);
}

static void test_addresses_and_names(void **state) {
    dsgd_ctx *ctx = make_ctx();
    dsgd_cluster_config c;
    (void)state;
    parse_ok(ctx,
             "{\"cluster\":{\"chief\":[\"c.example:2222\"],\"worker\":[\"w0:2222\",\"w1:2222\",\"w2:2222\"],"
             "\"ps\":[\"p0:2222\",\"p1:2222\"],\"evaluator\":[\"e:2222\"]},\"task\":{\"type\":\"worker\",\"index\":2}}",
             &c);
    assert_string_equal(c.addresses[DSGD_TASK_CHIEF][0], "c.example:2222");
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][0], "w0:2222");
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][1], "w1:2222");
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][2], "w2:2222");
    assert_string_equal(c.addresses[DSGD_TASK_PS][0], "p0:2222");
    assert_string_equal(c.addresses[DSGD_TASK_PS][1], "p1:2222");
    assert_string_equal(c.addresses[DSGD_TASK_EVALUATOR][0], "e:2222");
    assert_int_equal(c.rank, 3);
    assert_int_equal(c.num_workers_total, 4);
    assert_false(c.is_chief);
    dsgd_cluster_config_free(&c);
    assert_string_equal(dsgd_task_type_name(DSGD_TASK_CHIEF), "chief");
    assert_string_equal(dsgd_task_type_name(DSGD_TASK_WORKER), "worker");
    assert_string_equal(dsgd_task_type_name(DSGD_TASK_PS), "ps");
    assert_string_equal(dsgd_task_type_name(DSGD_TASK_EVALUATOR), "evaluator");
    assert_string_equal(dsgd_task_type_name(DSGD_TASK_NONE), "none");
    assert_string_equal(dsgd_task_type_name((dsgd_task_type)7), "?");
    dsgd_ctx_destroy(ctx);
}

static void test_escapes(void **state) {
    dsgd_ctx *ctx = make_ctx();
    dsgd_cluster_config c;
    (void)state;
    /* Escapes in addresses and keys: \" \\ \/ \b \f \n \r \t, \u to 1-4 UTF-8 bytes. */
    parse_ok(ctx,
             "{\"clu\\u0073ter\":{\"w\\u006frker\":[\"a\\\"b\\\\c\\/d\", \"\\b\\f\\n\\r\\t\", \"\\u00e9\\u20AC\\ud83d\\ude00\","
             "\"\\u0041\\u007f\\u0080\\u07ff\\u0800\\uffff\"]},\"task\":{\"type\":\"\\u0077orker\",\"index\":3}}",
             &c);
    assert_int_equal(c.num_tasks[DSGD_TASK_WORKER], 4);
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][0], "a\"b\\c/d");
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][1], "\b\f\n\r\t");
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][2], "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][3], "A\x7f\xc2\x80\xdf\xbf\xe0\xa0\x80\xef\xbf\xbf");
    assert_int_equal(c.rank, 3);
    dsgd_cluster_config_free(&c);
    /* Raw UTF-8 bytes pass through. */
    parse_ok(ctx, "{\"cluster\":{\"worker\":[\"h\xc3\xa9:1\"]},\"task\":{\"type\":\"worker\",\"index\":0}}", &c);
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][0], "h\xc3\xa9:1");
    dsgd_cluster_config_free(&c);
    /* Bad escapes are malformed JSON. */
    fails(ctx, "{\"a\":\"\\ud800\"}", DSGD_ERR_FORMAT, "high surrogate without its low");
    fails(ctx, "{\"a\":\"\\ud800\\u0041\"}", DSGD_ERR_FORMAT, "high surrogate without its low");
    fails(ctx, "{\"a\":\"\\udc00\"}", DSGD_ERR_FORMAT, "lone low surrogate");
    fails(ctx, "{\"a\":\"\\u12g4\"}", DSGD_ERR_FORMAT, "four hex digits");
    fails(ctx, "{\"a\":\"\\u12\"}", DSGD_ERR_FORMAT, "four hex digits");
    fails(ctx, "{\"a\":\"\\x\"}", DSGD_ERR_FORMAT, "at byte 7: an unknown escape");
    fails(ctx, "{\"a\":\"\t\"}", DSGD_ERR_FORMAT, "control character");
    /* U+0000 in a kept string is refused; in an ignored one it is fine. */
    fails(ctx, "{\"cluster\":{\"worker\":[\"a\\u0000b\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
                DSGD_ERR_INVALID_ARGUMENT, "holds U+0000");
    fails(ctx, "{\"rpc_layer\":\"\\u0000\"}", DSGD_ERR_INVALID_ARGUMENT, "\"rpc_layer\" holds U+0000");
    fails(ctx, "{\"task\":{\"type\":\"worker\\u0000x\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
                "unrecognized task type");
    dsgd_ctx_destroy(ctx);
}

typedef struct bad_case {
    const char *json;
    dsgd_result want;
    const char *msg;
} bad_case;

static void test_rules(void **state) {
    static const bad_case cases[] = {
        /* _validate_cluster_spec */
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"master\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "unrecognized task type \"master\""},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"chief\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "the task's type \"chief\" is not a job of the cluster"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"evaluator\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "the task's type \"evaluator\" is not a job of the cluster (TF's worker_count refuses that)"},
        {"{\"task\":{\"type\":\"worker\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT, "is not a job of the cluster"},
        {"{\"cluster\":{\"worker\":[\"w:1\"],\"ps\":[]},\"task\":{\"type\":\"ps\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "the task's type \"ps\" is not a job of the cluster"},
        {"{\"cluster\":{\"chief\":[\"a:1\",\"b:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "there must be at most one chief (2 given)"},
        {"{\"cluster\":{\"evaluator\":[\"a:1\",\"b:1\",\"c:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "there must be at most one evaluator (3 given)"},
        {"{\"cluster\":{\"worker\":[\"w:1\",\"w:2\"]},\"task\":{\"type\":\"worker\",\"index\":2}}",
         DSGD_ERR_INVALID_ARGUMENT, "the task's index 2 exceeds the largest index of job \"worker\" (1)"},
        {"{\"cluster\":{\"chief\":[\"c:1\"]},\"task\":{\"type\":\"chief\",\"index\":1}}", DSGD_ERR_INVALID_ARGUMENT,
         "index 1 exceeds"},
        /* The index */
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":-1}}", DSGD_ERR_INVALID_ARGUMENT,
         "\"index\" -1 must be >= 0"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0.0}}", DSGD_ERR_INVALID_ARGUMENT,
         "\"index\" 0.0 must be an integer"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":1e0}}", DSGD_ERR_INVALID_ARGUMENT,
         "must be an integer"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":\"0\"}}",
         DSGD_ERR_INVALID_ARGUMENT, "\"index\" must be an integer"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":2147483648}}",
         DSGD_ERR_INVALID_ARGUMENT, "2147483648 is too large"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":"
         "99999999999999999999999999999999999999999999999999}}",
         DSGD_ERR_INVALID_ARGUMENT, "is too large"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":2147483647}}",
         DSGD_ERR_INVALID_ARGUMENT, "index 2147483647 exceeds"},
        /* Shapes */
        {"[]", DSGD_ERR_INVALID_ARGUMENT, "the top level must be a JSON object"},
        {"\"x\"", DSGD_ERR_INVALID_ARGUMENT, "the top level must be a JSON object"},
        {"{\"cluster\":[\"w:1\"]}", DSGD_ERR_INVALID_ARGUMENT, "\"cluster\" must be an object"},
        {"{\"cluster\":{\"worker\":\"w:1\"},\"task\":{\"type\":\"worker\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "job \"worker\" must be an array"},
        {"{\"cluster\":{\"worker\":{\"0\":\"w:1\"}},\"task\":{\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "job \"worker\" must be an array"},
        {"{\"cluster\":{\"worker\":[\"w:1\",2]},\"task\":{\"type\":\"worker\",\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "job \"worker\" must be an array"},
        {"{\"cluster\":{\"master\":[\"m:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "unknown job \"master\""},
        {"{\"task\":[]}", DSGD_ERR_INVALID_ARGUMENT, "\"task\" must be an object"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":1,\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "\"type\" must be a string"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"index\":0}}", DSGD_ERR_INVALID_ARGUMENT,
         "the task has no \"type\""},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\"}}", DSGD_ERR_INVALID_ARGUMENT,
         "the task has no \"index\""},
        {"{\"cluster\":{\"worker\":[\"w:1\",\"w:2\"]}}", DSGD_ERR_INVALID_ARGUMENT, "a cluster of 2 tasks needs a \"task\""},
        {"{\"rpc_layer\":5}", DSGD_ERR_INVALID_ARGUMENT, "\"rpc_layer\" must be a string or null"},
        /* Duplicate keys are refused */
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "\"cluster\" is given twice"},
        {"{\"cluster\":{\"worker\":[\"w:1\"],\"worker\":[\"w:2\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "job \"worker\" is given twice"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"type\":\"worker\",\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "\"type\" is given twice"},
        {"{\"cluster\":{\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0,\"index\":0}}",
         DSGD_ERR_INVALID_ARGUMENT, "\"index\" is given twice"},
        {"{\"task\":{\"type\":\"worker\",\"index\":0},\"task\":{}}", DSGD_ERR_INVALID_ARGUMENT, "\"task\" is given twice"},
        {"{\"rpc_layer\":\"a\",\"rpc_layer\":\"b\"}", DSGD_ERR_INVALID_ARGUMENT, "\"rpc_layer\" is given twice"},
        /* A format error wins over an earlier rule */
        {"{\"cluster\":{\"master\":[\"m:1\"]},", DSGD_ERR_FORMAT, "malformed JSON at byte 30"},
    };
    dsgd_ctx *ctx = make_ctx();
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i)
        fails(ctx, cases[i].json, cases[i].want, cases[i].msg);
    dsgd_ctx_destroy(ctx);
}

static void test_malformed(void **state) {
    static const bad_case cases[] = {
        {"", DSGD_ERR_FORMAT, "at byte 0: unexpected end of input"},
        {"   ", DSGD_ERR_FORMAT, "at byte 3"},
        {"{", DSGD_ERR_FORMAT, "at byte 1: expected a string"},
        {"{}x", DSGD_ERR_FORMAT, "at byte 2: text after the JSON value"},
        {"{}{}", DSGD_ERR_FORMAT, "text after the JSON value"},
        {"{,}", DSGD_ERR_FORMAT, "at byte 1"},
        {"{\"a\":1,}", DSGD_ERR_FORMAT, "at byte 7: expected a string"},
        {"{\"a\" 1}", DSGD_ERR_FORMAT, "expected ':'"},
        {"{\"a\":1 \"b\":2}", DSGD_ERR_FORMAT, "expected ',' or '}'"},
        {"{\"a\":[1,]}", DSGD_ERR_FORMAT, "at byte 8: unexpected character"},
        {"{\"a\":[1 2]}", DSGD_ERR_FORMAT, "expected ',' or ']'"},
        {"{a:1}", DSGD_ERR_FORMAT, "expected a string"},
        {"{'a':1}", DSGD_ERR_FORMAT, "expected a string"},
        {"{\"a\":tru}", DSGD_ERR_FORMAT, "unknown literal"},
        {"{\"a\":nul}", DSGD_ERR_FORMAT, "unknown literal"},
        {"{\"a\":True}", DSGD_ERR_FORMAT, "unexpected character"},
        {"{\"a\":01}", DSGD_ERR_FORMAT, "expected ',' or '}'"},
        {"{\"a\":-}", DSGD_ERR_FORMAT, "a number needs a digit"},
        {"{\"a\":1.}", DSGD_ERR_FORMAT, "a fraction needs a digit"},
        {"{\"a\":.5}", DSGD_ERR_FORMAT, "unexpected character"},
        {"{\"a\":1e}", DSGD_ERR_FORMAT, "an exponent needs a digit"},
        {"{\"a\":+1}", DSGD_ERR_FORMAT, "unexpected character"},
        {"{\"a\":NaN}", DSGD_ERR_FORMAT, "unexpected character"},
        {"{\"a\":\"x}", DSGD_ERR_FORMAT, "unterminated string"},
        {"{\"a\":1}/*c*/", DSGD_ERR_FORMAT, "text after the JSON value"},
        {"{\"cluster\":{\"worker\":[\"w:1\"}}", DSGD_ERR_FORMAT, "expected ',' or ']'"},
        {"{\"task\":{\"type\":\"worker\",\"index\":}}", DSGD_ERR_FORMAT, "\"index\" must be an integer"},
    };
    dsgd_ctx *ctx = make_ctx();
    size_t i;
    (void)state;
    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); ++i) {
        /* the "index": } case: a rule first, then the value is malformed */
        dsgd_result want = cases[i].want;
        const char *msg = cases[i].msg;
        if (strstr(cases[i].json, "\"index\":}")) msg = "unexpected character";
        fails(ctx, cases[i].json, want, msg);
    }
    /* A NUL byte inside the length is malformed, as is any byte after the value. */
    parse_fails(ctx, "{}\0", 3, DSGD_ERR_FORMAT, "at byte 2");
    parse_fails(ctx, "{\"a\":\"x\0y\"}", 11, DSGD_ERR_FORMAT, "control character");
    /* The length bounds the input: a prefix of a valid text is not read past. */
    parse_fails(ctx, "{\"a\":1}", 6, DSGD_ERR_FORMAT, "at byte 6");
    /* Arguments. */
    assert_int_equal(dsgd_tf_config_parse(ctx, "{}", 2, NULL), DSGD_ERR_INVALID_ARGUMENT);
    parse_fails(ctx, NULL, 1, DSGD_ERR_INVALID_ARGUMENT, "json is NULL");
    {
        dsgd_cluster_config c;
        assert_int_equal(dsgd_tf_config_parse(NULL, NULL, 0, &c), DSGD_ERR_FORMAT);
        dsgd_cluster_config_free(&c);
        dsgd_cluster_config_free(NULL);
    }
    dsgd_ctx_destroy(ctx);
}

/* Every prefix of valid configs is refused (a clean error, no crash, no
   leak: run under ASan), and every one-byte change is answered with one of
   the allowed results. */
static void test_truncation_and_mutation(void **state) {
    static const char *const texts[] = {
        "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w\\u00e9:2\", \"w1:3\"], \"ps\": [\"p:4\"], "
        "\"evaluator\": [\"e:5\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}, \"rpc_layer\": \"grpc\", "
        "\"environment\": {\"x\": [true, false, null, -1.5e-3, \"\\ud83d\\ude00\"]}}",
        "{\"task\":{\"type\":\"worker\",\"index\":1},\"cluster\":{\"worker\":[\"a:1\",\"b:2\"]}}",
    };
    dsgd_ctx *ctx = make_ctx();
    size_t i, n, k;
    (void)state;
    for (i = 0; i < sizeof(texts) / sizeof(texts[0]); ++i) {
        size_t len = strlen(texts[i]);
        char *buf = (char *)malloc(len);
        dsgd_cluster_config c;
        assert_non_null(buf);
        parse_ok(ctx, texts[i], &c);
        dsgd_cluster_config_free(&c);
        for (n = 0; n < len; ++n) {
            /* exact-size copies, so ASan sees any read past the length */
            char *pre = (char *)malloc(n ? n : 1);
            dsgd_result r;
            assert_non_null(pre);
            memcpy(pre, texts[i], n);
            r = dsgd_tf_config_parse(ctx, pre, n, &c);
            if (r != DSGD_ERR_FORMAT) fail_msg("prefix %zu of text %zu -> %s", n, i, dsgd_result_string(r));
            assert_null(c.storage);
            free(pre);
        }
        for (n = 0; n < len; ++n) {
            static const char subs[] = {'\0', '"', '\\', '{', '}', '[', ']', ',', ':', '0', '-', 'x', ' '};
            for (k = 0; k < sizeof(subs); ++k) {
                dsgd_result r;
                memcpy(buf, texts[i], len);
                buf[n] = subs[k];
                r = dsgd_tf_config_parse(ctx, buf, len, &c);
                if (r != DSGD_OK && r != DSGD_ERR_FORMAT && r != DSGD_ERR_INVALID_ARGUMENT)
                    fail_msg("byte %zu = %d -> %s", n, subs[k], dsgd_result_string(r));
                dsgd_cluster_config_free(&c);
            }
        }
        free(buf);
    }
    dsgd_ctx_destroy(ctx);
}

static char *nested(int depth, const char *inner) {
    size_t len = 2 * (size_t)depth + strlen(inner) + 16, w = 0;
    char *s = (char *)malloc(len);
    int i;
    if (!s) return NULL;
    /* depth 1 is the top-level object; the rest are arrays under "x" */
    w += (size_t)sprintf(s + w, "{\"x\":");
    for (i = 1; i < depth; ++i) s[w++] = '[';
    w += (size_t)sprintf(s + w, "%s", inner);
    for (i = 1; i < depth; ++i) s[w++] = ']';
    s[w++] = '}';
    s[w] = '\0';
    return s;
}

static void test_nesting(void **state) {
    dsgd_ctx *ctx = make_ctx();
    dsgd_cluster_config c;
    char *s;
    (void)state;
    s = nested(DSGD_TF_CONFIG_MAX_DEPTH, "1");
    assert_non_null(s);
    parse_ok(ctx, s, &c);
    assert_int_equal(c.task_type, DSGD_TASK_NONE);
    dsgd_cluster_config_free(&c);
    free(s);
    s = nested(DSGD_TF_CONFIG_MAX_DEPTH, "{}"); /* one deeper */
    fails(ctx, s, DSGD_ERR_FORMAT, "nested deeper than DSGD_TF_CONFIG_MAX_DEPTH");
    free(s);
    s = nested(100000, "1");
    fails(ctx, s, DSGD_ERR_FORMAT, "nested deeper");
    free(s);
    /* a deep value as a job */
    fails(ctx, "{\"cluster\":{\"worker\":[[[[]]]]},\"task\":{\"type\":\"worker\",\"index\":0}}",
                DSGD_ERR_INVALID_ARGUMENT, "job \"worker\" must be an array");
    dsgd_ctx_destroy(ctx);
}

static void test_many_tasks(void **state) {
    /* 10000 workers, densely packed: the most addresses per byte. */
    enum { N = 10000 };
    size_t cap = (size_t)N * 16 + 128, w = 0;
    char *s = (char *)malloc(cap);
    dsgd_ctx *ctx = make_ctx();
    dsgd_cluster_config c;
    int i;
    (void)state;
    assert_non_null(s);
    w += (size_t)sprintf(s + w, "{\"cluster\":{\"worker\":[");
    for (i = 0; i < N; ++i) w += (size_t)sprintf(s + w, i ? ",\"%d\"" : "\"%d\"", i);
    w += (size_t)sprintf(s + w, "],\"ps\":[\"\",\"\",\"\"]},\"task\":{\"type\":\"ps\",\"index\":2}}");
    parse_ok(ctx, s, &c);
    assert_int_equal(c.num_tasks[DSGD_TASK_WORKER], N);
    assert_int_equal(c.num_tasks[DSGD_TASK_PS], 3);
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][N - 1], "9999");
    assert_string_equal(c.addresses[DSGD_TASK_PS][2], "");
    assert_int_equal(c.rank, N + 2);
    assert_int_equal(c.num_workers_total, N);
    dsgd_cluster_config_free(&c);
    /* The densest: only empty strings. */
    parse_ok(ctx, "{\"cluster\":{\"worker\":[\"\",\"\",\"\",\"\"]},\"task\":{\"type\":\"worker\",\"index\":3}}", &c);
    assert_int_equal(c.num_tasks[DSGD_TASK_WORKER], 4);
    assert_string_equal(c.addresses[DSGD_TASK_WORKER][3], "");
    dsgd_cluster_config_free(&c);
    free(s);
    dsgd_ctx_destroy(ctx);
}

static void test_from_env(void **state) {
    dsgd_ctx *ctx = make_ctx();
    dsgd_cluster_config c;
    (void)state;
    assert_int_equal(unsetenv("TF_CONFIG"), 0);
    TU_OK(ctx, dsgd_tf_config_from_env(ctx, &c));
    assert_int_equal(c.task_type, DSGD_TASK_NONE);
    assert_int_equal(c.rank, 0);
    assert_int_equal(c.num_workers_total, 1);
    assert_true(c.is_chief);
    dsgd_cluster_config_free(&c);
    assert_int_equal(setenv("TF_CONFIG",
                            "{\"cluster\":{\"chief\":[\"c:1\"],\"worker\":[\"w:1\"]},\"task\":{\"type\":\"worker\",\"index\":0}}",
                            1),
                     0);
    TU_OK(ctx, dsgd_tf_config_from_env(ctx, &c));
    assert_int_equal(c.task_type, DSGD_TASK_WORKER);
    assert_int_equal(c.rank, 1);
    assert_int_equal(c.num_workers_total, 2);
    assert_false(c.is_chief);
    assert_string_equal(c.addresses[DSGD_TASK_CHIEF][0], "c:1");
    dsgd_cluster_config_free(&c);
    assert_int_equal(setenv("TF_CONFIG", "", 1), 0);
    assert_int_equal(dsgd_tf_config_from_env(ctx, &c), DSGD_ERR_FORMAT);
    assert_int_equal(setenv("TF_CONFIG", "{\"task\":{\"type\":\"worker\",\"index\":0}}", 1), 0);
    assert_int_equal(dsgd_tf_config_from_env(ctx, &c), DSGD_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(dsgd_ctx_last_error(ctx), "not a job of the cluster"));
    assert_int_equal(unsetenv("TF_CONFIG"), 0);
    dsgd_ctx_destroy(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_configs),
        cmocka_unit_test(test_evaluator_apart),
        cmocka_unit_test(test_addresses_and_names),
        cmocka_unit_test(test_escapes),
        cmocka_unit_test(test_rules),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_truncation_and_mutation),
        cmocka_unit_test(test_nesting),
        cmocka_unit_test(test_many_tasks),
        cmocka_unit_test(test_from_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
