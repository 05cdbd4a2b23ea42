/* Tests for cluster/ (cluster specs, TF_CONFIG) and its JSON parser cluster/json.c, after TensorFlow's
 * server_lib_test.py (ClusterSpec), tfconfig_cluster_resolver_test.py, run_config_test.py and
 * multi_worker_util_test.py. test_tf_cluster_conformance.c holds the same functions to
 * TensorFlow's recorded answers; this file covers the API's own contract: messages, ownership,
 * NULL arguments, robustness. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

// ---------------------------------------------------------------------------------------
// JSON parser

static cluster_json *json_ok(const char *text) {
    dg_status *st = dg_status_new();
    cluster_json *v = cluster_json_parse(text, strlen(text), "JSON", st);
    assert_ok(st);
    assert_non_null(v);
    dg_status_free(&st);
    return v;
}

static void json_bad(const char *text, size_t len, const char *needle) {
    dg_status *st = dg_status_new();
    cluster_json *v = cluster_json_parse(text, len, "JSON", st);
    assert_null(v);
    assert_status(st, DG_INVALID_ARGUMENT, needle);
    dg_status_free(&st);
}

static void json_bad_s(const char *text, const char *needle) { json_bad(text, strlen(text), needle); }

static void test_json_scalars(void **state) {
    (void)state;
    cluster_json *v = json_ok(" null ");
    assert_int_equal(v->kind, CLUSTER_JSON_NULL);
    assert_int_equal(v->offset, 1);
    assert_int_equal(v->src_len, 4);
    cluster_json_free(&v);
    assert_null(v);
    cluster_json_free(&v);
    cluster_json_free(NULL);

    v = json_ok("true");
    assert_int_equal(v->kind, CLUSTER_JSON_BOOL);
    assert_true(v->boolean);
    cluster_json_free(&v);
    v = json_ok("false");
    assert_false(v->boolean);
    cluster_json_free(&v);

    v = json_ok("-12");
    assert_int_equal(v->kind, CLUSTER_JSON_NUMBER);
    assert_true(v->is_int);
    assert_int_equal(v->integer, -12);
    assert_true(v->number == -12.0);
    cluster_json_free(&v);

    v = json_ok("1.5e2");
    assert_false(v->is_int);
    assert_true(v->number == 150.0);
    cluster_json_free(&v);

    v = json_ok("0");
    assert_true(v->is_int);
    assert_int_equal(v->integer, 0);
    cluster_json_free(&v);

    v = json_ok("9223372036854775807");
    assert_true(v->is_int);
    assert_true(v->integer == INT64_MAX);
    cluster_json_free(&v);
    v = json_ok("-9223372036854775808");
    assert_true(v->is_int);
    assert_true(v->integer == INT64_MIN);
    cluster_json_free(&v);
    v = json_ok("9223372036854775808");   // valid JSON, but not an int64
    assert_false(v->is_int);
    cluster_json_free(&v);
    v = json_ok("1E-400");   // underflow is fine
    cluster_json_free(&v);
}

static void test_json_strings(void **state) {
    (void)state;
    cluster_json *v = json_ok("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"");
    assert_int_equal(v->kind, CLUSTER_JSON_STRING);
    assert_string_equal(v->str, "a\"b\\c/d\b\f\n\r\t");
    cluster_json_free(&v);

    v = json_ok("\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\"");
    assert_string_equal(v->str, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_int_equal(v->str_len, 1 + 2 + 3 + 4);
    assert_true(cluster_json_is_cstring(v));
    cluster_json_free(&v);

    v = json_ok("\"x\\u0000y\"");
    assert_int_equal(v->str_len, 3);
    assert_false(cluster_json_is_cstring(v));
    cluster_json_free(&v);

    v = json_ok("\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");   // raw UTF-8 passes through
    assert_string_equal(v->str, "caf\xc3\xa9 \xf0\x9f\x98\x80");
    cluster_json_free(&v);

    v = json_ok("\"\"");
    assert_string_equal(v->str, "");
    cluster_json_free(&v);
}

static void test_json_containers(void **state) {
    (void)state;
    cluster_json *v = json_ok("{\"a\": [1, 2, {\"b\": null}], \"c\": {}, \"d\": []}");
    assert_int_equal(v->kind, CLUSTER_JSON_OBJECT);
    assert_int_equal(v->n, 3);
    assert_string_equal(v->members[0].key, "a");
    const cluster_json *a = cluster_json_get(v, "a");
    assert_non_null(a);
    assert_int_equal(a->kind, CLUSTER_JSON_ARRAY);
    assert_int_equal(a->n, 3);
    assert_int_equal(a->items[1]->integer, 2);
    assert_int_equal(a->offset, 6);
    assert_int_equal(a->src_len, strlen("[1, 2, {\"b\": null}]"));
    assert_non_null(cluster_json_get(a->items[2], "b"));
    assert_null(cluster_json_get(a, "b"));
    assert_null(cluster_json_get(v, "zz"));
    assert_int_equal(cluster_json_get(v, "c")->kind, CLUSTER_JSON_OBJECT);
    assert_int_equal(cluster_json_get(v, "c")->n, 0);
    assert_int_equal(cluster_json_get(v, "d")->n, 0);
    cluster_json_free(&v);

    assert_string_equal(cluster_json_kind_name(CLUSTER_JSON_ARRAY), "array");
    assert_string_equal(cluster_json_kind_name(CLUSTER_JSON_BOOL), "boolean");
}

// What Python's json.loads reads beyond RFC 8259, as TensorFlow reads TF_CONFIG with it.
static void test_json_python(void **state) {
    (void)state;
    cluster_json *v = json_ok("[NaN, Infinity, -Infinity, 1e999, -1e999, 1E-400]");
    assert_true(isnan(v->items[0]->number) && v->items[0]->is_float);
    assert_true(isinf(v->items[1]->number) && v->items[1]->number > 0);
    assert_true(isinf(v->items[2]->number) && v->items[2]->number < 0);
    assert_true(isinf(v->items[3]->number) && v->items[3]->is_float);
    assert_true(isinf(v->items[4]->number) && v->items[4]->number < 0);
    assert_true(v->items[5]->number == 0.0);
    cluster_json_free(&v);

    // Lone surrogates and bytes that are not UTF-8 are kept (WTF-8) and marked.
    struct {
        const char *json, *want;
        bool is_utf8;
    } strs[] = {
        {"\"\\ud800\"", "\xed\xa0\x80", false},
        {"\"a\\udc00b\"", "a\xed\xb0\x80" "b", false},
        {"\"\\ud800\\u0041\"", "\xed\xa0\x80" "A", false},
        {"\"\xff\"", "\xed\xb3\xbf", false},                 // surrogateescape: U+DCFF
        {"\"\xc0\xaf\"", "\xed\xb3\x80\xed\xb2\xaf", false},   // overlong '/'
        {"\"\xe2\x82\"", "\xed\xb3\xa2\xed\xb2\x82", false},   // truncated
        {"\"\\ud83d\\ude00\"", "\xf0\x9f\x98\x80", true},
    };
    for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
        v = json_ok(strs[i].json);
        assert_string_equal(v->str, strs[i].want);
        assert_int_equal(v->str_is_utf8, strs[i].is_utf8);
        assert_int_equal(cluster_json_is_cstring(v), strs[i].is_utf8);
        cluster_json_free(&v);
    }
    v = json_ok("{\"\\udc80\": 1}");
    assert_false(v->members[0].key_is_utf8);
    cluster_json_free(&v);

    // str(), int(), truthiness and `in`, as Python answers for the loaded value.
    struct {
        const char *json, *str;
    } strs2[] = {
        {"null", "None"}, {"true", "True"}, {"false", "False"}, {"-0", "0"}, {"12", "12"},
        {"123456789012345678901234567890", "123456789012345678901234567890"}, {"1.0", "1.0"},
        {"1e16", "1e+16"}, {"1e15", "1000000000000000.0"}, {"0.0001", "0.0001"}, {"1e-5", "1e-05"},
        {"-0.0", "-0.0"}, {"0.1", "0.1"}, {"1e400", "inf"}, {"NaN", "nan"}, {"2.5e-300", "2.5e-300"},
        {"\"a\\u0000b\"", "a"}, {"[]", "[]"}, {"{}", "{}"},
        {"[\"a\", \"b'c\", \"d\\\"e\", \"x'y\\\"z\", 1, null, true, 2.5, {\"k\": []}]",
         "['a', \"b'c\", 'd\"e', 'x\\'y\"z', 1, None, True, 2.5, {'k': []}]"},
        {"[\"\\u0000\\u007f\\u0080\\u00a0\\u00e9\\u2028\\ud800\\t\\\\\"]",
         "['\\x00\\x7f\\x80\\xa0\xc3\xa9\\u2028\\ud800\\t\\\\']"},
    };
    for (size_t i = 0; i < sizeof strs2 / sizeof *strs2; i++) {
        v = json_ok(strs2[i].json);
        char *s = cluster_json_py_str(v);
        if (strcmp(s, strs2[i].str) != 0) fail_msg("str(%s) = %s, want %s", strs2[i].json, s, strs2[i].str);
        free(s);
        cluster_json_free(&v);
    }
    struct {
        const char *json;
        cluster_py_int r;
        int64_t want;
    } ints[] = {
        {"7", CLUSTER_PY_INT_OK, 7}, {"true", CLUSTER_PY_INT_OK, 1}, {"1.9", CLUSTER_PY_INT_OK, 1},
        {"-0.5", CLUSTER_PY_INT_OK, 0}, {"\" -1_0 \"", CLUSTER_PY_INT_OK, -10}, {"\"\\u0661\\u0662\"", CLUSTER_PY_INT_OK, 12},
        {"\"\\u00a05\\u3000\"", CLUSTER_PY_INT_OK, 5}, {"\"\\uff13\"", CLUSTER_PY_INT_OK, 3},
        {"\"1.0\"", CLUSTER_PY_INT_VALUE_ERROR, 0}, {"\"1__0\"", CLUSTER_PY_INT_VALUE_ERROR, 0},
        {"\"_1\"", CLUSTER_PY_INT_VALUE_ERROR, 0}, {"\"\\u001c1\"", CLUSTER_PY_INT_VALUE_ERROR, 0},
        {"\"\"", CLUSTER_PY_INT_VALUE_ERROR, 0}, {"\"0x10\"", CLUSTER_PY_INT_VALUE_ERROR, 0},
        {"NaN", CLUSTER_PY_INT_VALUE_ERROR, 0}, {"Infinity", CLUSTER_PY_INT_OVERFLOW, 0},
        {"null", CLUSTER_PY_INT_TYPE_ERROR, 0}, {"[1]", CLUSTER_PY_INT_TYPE_ERROR, 0},
        {"9223372036854775807", CLUSTER_PY_INT_OK, INT64_MAX}, {"9223372036854775808", CLUSTER_PY_INT_TOO_BIG, INT64_MAX},
        {"-1e19", CLUSTER_PY_INT_TOO_BIG, INT64_MIN}, {"\"99999999999999999999\"", CLUSTER_PY_INT_TOO_BIG, INT64_MAX},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        v = json_ok(ints[i].json);
        int64_t got = 0;
        cluster_py_int r = cluster_json_py_int(v, &got);
        if (r != ints[i].r || (r == CLUSTER_PY_INT_OK && got != ints[i].want))
            fail_msg("int(%s): %d %lld, want %d %lld", ints[i].json, r, (long long)got, ints[i].r, (long long)ints[i].want);
        cluster_json_free(&v);
    }
    v = json_ok("{\"a\": [\"task\"], \"b\": \"prototype\", \"c\": 0, \"d\": NaN, \"e\": -0.0, \"f\": \"\"}");
    assert_int_equal(cluster_json_py_contains(v, "a"), 1);
    assert_int_equal(cluster_json_py_contains(v, "z"), 0);
    assert_int_equal(cluster_json_py_contains(cluster_json_get(v, "a"), "task"), 1);
    assert_int_equal(cluster_json_py_contains(cluster_json_get(v, "b"), "type"), 1);
    assert_int_equal(cluster_json_py_contains(cluster_json_get(v, "c"), "type"), -1);
    assert_false(cluster_json_py_truthy(cluster_json_get(v, "c")));
    assert_true(cluster_json_py_truthy(cluster_json_get(v, "d")));
    assert_false(cluster_json_py_truthy(cluster_json_get(v, "e")));
    assert_false(cluster_json_py_truthy(cluster_json_get(v, "f")));
    assert_true(cluster_json_py_truthy(v));
    assert_string_equal(cluster_json_py_type(cluster_json_get(v, "d")), "float");
    cluster_json_free(&v);
}

static void test_json_depth(void **state) {
    (void)state;
    char buf[300];
    int depth = CLUSTER_JSON_MAX_DEPTH;
    for (int i = 0; i < depth; i++) buf[i] = '[';
    for (int i = 0; i < depth; i++) buf[depth + i] = ']';
    buf[2 * depth] = '\0';
    cluster_json *v = json_ok(buf);
    cluster_json_free(&v);

    depth = CLUSTER_JSON_MAX_DEPTH + 1;
    for (int i = 0; i < depth; i++) buf[i] = '[';
    for (int i = 0; i < depth; i++) buf[depth + i] = ']';
    buf[2 * depth] = '\0';
    json_bad_s(buf, "offset 64: nesting deeper than 64 levels");

    // Deep objects too; and a huge depth does not recurse.
    char *deep = malloc(500001);
    for (int i = 0; i < 100000; i++) memcpy(deep + 5 * i, "{\"a\":", 5);
    deep[500000] = '\0';
    json_bad_s(deep, "nesting deeper than 64");
    free(deep);
}

static void test_json_errors(void **state) {
    (void)state;
    json_bad_s("", "offset 0: unexpected end of input");
    json_bad_s("   ", "offset 3: unexpected end of input");
    json_bad_s("[1,]", "offset 3: unexpected ']' (expected a value)");
    json_bad_s("{\"a\":1,}", "offset 7: expected a string key in object, got '}'");
    json_bad_s("{\"a\" 1}", "offset 5: expected ':' after object key, got '1'");
    json_bad_s("{a:1}", "offset 1: expected a string key");
    json_bad_s("[1 2]", "offset 3: expected ',' or ']' in array, got '2'");
    json_bad_s("{\"a\":1 \"b\":2}", "offset 7: expected ',' or '}' in object");
    json_bad_s("[1", "offset 2: expected ',' or ']' in array, got end of input");
    json_bad_s("{\"a\":1", "expected ',' or '}' in object, got end of input");
    json_bad_s("\"abc", "offset 0: unterminated string");
    json_bad_s("\"abc\\", "offset 0: unterminated string");
    json_bad_s("01", "offset 0: number with a leading zero");
    json_bad_s("-", "offset 1: expected a digit, got end of input");
    json_bad_s("-a", "offset 1: expected a digit, got 'a'");
    json_bad_s("1.", "offset 2: expected a digit after '.'");
    json_bad_s(".5", "offset 0: unexpected '.'");
    json_bad_s("1e", "offset 2: expected a digit in exponent");
    json_bad_s("+1", "unexpected '+'");
    json_bad_s("tru", "offset 0: unexpected 't'");
    json_bad_s("nul", "unexpected 'n'");
    json_bad_s("True", "unexpected 'T'");
    json_bad_s("[1] x", "offset 4: unexpected 'x' after the value");
    json_bad_s("{} {}", "after the value");
    json_bad_s("// c\n{}", "unexpected '/'");
    json_bad_s("'a'", "unexpected '''");
    json_bad_s("\"a\tb\"", "offset 2: control character (byte 0x09) in string");
    json_bad_s("\"a\\xb\"", "offset 2: bad escape \\'x'");
    json_bad_s("\"\\u12g4\"", "offset 1: bad \\u escape");
    json_bad_s("\"\\u12\"", "bad \\u escape");
    json_bad_s("\xff", "offset 0: unexpected byte 0xff");   // not UTF-8 outside a string
    json_bad_s("Nan", "offset 0: unexpected 'N'");
    json_bad_s("-Inf", "offset 0: unexpected '-'");
    json_bad_s("infinity", "unexpected 'i'");
    json_bad_s("{\"a\":1,\"b\":2,\"a\":3}", "offset 13: duplicate key \"a\" in object");
    json_bad("[1]\0", 4, "offset 3: unexpected byte 0x00 after the value");
    json_bad("\"a\0b\"", 5, "control character (byte 0x00)");
    json_bad_s("\x01", "unexpected byte 0x01");
}

// ---------------------------------------------------------------------------------------
// Cluster API

static dg_cluster *example_cluster(void) {
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_new();
    assert_true(dg_cluster_add_task(c, "worker", 0, "w0:2222", st));
    assert_true(dg_cluster_add_task(c, "ps", 1, "p1:2222", st));
    assert_true(dg_cluster_add_task(c, "worker", 2, "w2:2222", st));
    assert_true(dg_cluster_add_task(c, "ps", 0, "p0:2222", st));
    assert_true(dg_cluster_add_task(c, "chief", 0, "[::1]:80", st));
    assert_ok(st);
    dg_status_free(&st);
    return c;
}

static void test_cluster_accessors(void **state) {
    (void)state;
    dg_cluster *c = example_cluster();
    assert_int_equal(dg_cluster_num_jobs(c), 3);
    assert_string_equal(dg_cluster_job(c, 0), "chief");
    assert_string_equal(dg_cluster_job(c, 1), "ps");
    assert_string_equal(dg_cluster_job(c, 2), "worker");
    assert_null(dg_cluster_job(c, 3));
    assert_null(dg_cluster_job(c, -1));
    assert_true(dg_cluster_has_job(c, "ps"));
    assert_false(dg_cluster_has_job(c, "evaluator"));
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    assert_int_equal(dg_cluster_num_tasks(c, "worker"), 2);
    assert_int_equal(dg_cluster_num_tasks(c, "nope"), 0);
    assert_int_equal(dg_cluster_task_index(c, "worker", 0), 0);
    assert_int_equal(dg_cluster_task_index(c, "worker", 1), 2);
    assert_int_equal(dg_cluster_task_index(c, "worker", 2), -1);
    assert_int_equal(dg_cluster_task_index(c, "nope", 0), -1);
    assert_int_equal(dg_cluster_total_tasks(c), 5);

    dg_status *st = dg_status_new();
    assert_string_equal(dg_cluster_task_address(c, "ps", 1, st), "p1:2222");
    assert_string_equal(dg_cluster_task_address(c, "chief", 0, NULL), "[::1]:80");
    assert_null(dg_cluster_task_address(c, "worker", 1, st));
    assert_status(st, DG_NOT_FOUND, "job \"worker\" has no task 1");
    assert_null(dg_cluster_task_address(c, "evaluator", 0, st));
    assert_status(st, DG_NOT_FOUND, "no job \"evaluator\"");
    assert_null(dg_cluster_task_address(c, "evaluator", 0, NULL));
    dg_status_free(&st);

    dg_cluster *empty = dg_cluster_new();
    assert_int_equal(dg_cluster_num_jobs(empty), 0);
    assert_int_equal(dg_cluster_total_tasks(empty), 0);
    char *js = dg_cluster_to_json(empty);
    assert_string_equal(js, "{}");
    free(js);
    dg_cluster_free(&empty);
    assert_null(empty);
    dg_cluster_free(&empty);
    dg_cluster_free(NULL);
    dg_cluster_free(&c);
}

static void test_cluster_add_errors(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_new();
    // A cluster is data: TensorFlow's ClusterSpec takes any name, index and address.
    assert_true(dg_cluster_add_task(c, "worker", 0, "localhost:1", st));
    assert_true(dg_cluster_add_task(c, "w_2-x", 0, "10.0.0.1:65535", st));
    assert_true(dg_cluster_add_task(c, "", 0, "h:1", st));
    assert_true(dg_cluster_add_task(c, "9ps", 0, "nohost", st));
    assert_true(dg_cluster_add_task(c, "a b", -3, "", st));
    assert_true(dg_cluster_add_task(c, "caf\xc3\xa9", 7, "\xe4\xb8\xbb:1", st));
    assert_true(dg_cluster_add_job(c, "empty", st));
    assert_true(dg_cluster_add_job(c, "worker", st));   // exists: left as it is
    assert_ok(st);
    assert_int_equal(dg_cluster_num_tasks(c, "worker"), 1);
    assert_int_equal(dg_cluster_num_tasks(c, "empty"), 0);
    assert_int_equal(dg_cluster_task_index(c, "a b", 0), -3);
    assert_string_equal(dg_cluster_job(c, 0), "");

    assert_false(dg_cluster_add_task(c, "worker", 0, "other:2", st));
    assert_status(st, DG_ALREADY_EXISTS, "job \"worker\" task 0 already exists (at \"localhost:1\")");
    assert_false(dg_cluster_add_task(c, NULL, 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "job name must not be NULL");
    assert_false(dg_cluster_add_task(c, "ps", 0, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "cluster: job \"ps\" task 0: address must not be NULL");
    assert_false(dg_cluster_add_task(c, "p\xff", 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "job name \"p\xff\" is not UTF-8 text");
    assert_false(dg_cluster_add_task(c, "ps", 0, "h\xed\xa0\x80:1", st));   // a surrogate
    assert_status(st, DG_INVALID_ARGUMENT, "address \"h\xed\xa0\x80:1\" is not UTF-8 text");
    assert_false(dg_cluster_add_job(c, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "must not be NULL");
    assert_false(dg_cluster_add_job(NULL, "ps", st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL cluster");
    // Nothing was added by the failures.
    assert_false(dg_cluster_has_job(c, "ps"));
    assert_int_equal(dg_cluster_total_tasks(c), 6);
    assert_false(dg_cluster_add_task(NULL, "ps", 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL cluster");
    dg_cluster_free(&c);
    dg_status_free(&st);
}

// Addresses and names are judged where a server binds or a client connects.
static void test_cluster_check_task(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_new();
    const char *good[] = {"localhost:1", "10.0.0.1:65535", "my-host.example.com:443", "[::1]:80", "[fe80::1]:2"};
    for (int i = 0; i < 5; i++) assert_true(dg_cluster_add_task(c, "ok", i, good[i], st));
    for (int i = 0; i < 5; i++) {
        assert_string_equal(dg_cluster_check_task(c, "ok", i, st), good[i]);
        assert_ok(st);
    }
    struct {
        const char *addr, *needle;
    } bad[] = {
        {"host", "address \"host\" has no \":port\""},
        {"", "address \"\" has no \":port\""},
        {":80", "address \":80\" has an empty host"},
        {"h:", "address \"h:\": port \"\" is not a number in 1..65535"},
        {"h:0", "port \"0\" is not a number in 1..65535"},
        {"h:65536", "port \"65536\" is not"},
        {"h:99999999999999999999", "is not a number"},
        {"h:-1", "port \"-1\""},
        {"h:8x", "port \"8x\""},
        {"h :1", "bad host \"h \""},
        {"a,b:1", "bad host \"a,b\""},
        {"a:b:1", "bad host \"a:b\""},
        {"[::1:1", "bad host \"[::1\""},
        {"[]:1", "bad host \"[]\""},
        {"[zz]:1", "bad host \"[zz]\""},
        {"h\"x:1", "bad host"},
        {"caf\xc3\xa9:1", "bad host"},
        {"grpc://h:1", "bad host \"grpc"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_true(dg_cluster_add_task(c, "ps", (int)i, bad[i].addr, st));
        assert_null(dg_cluster_check_task(c, "ps", (int)i, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
        char want[64];
        snprintf(want, sizeof want, "cluster: job \"ps\" task %zu: address", i);
        assert_status(st, DG_INVALID_ARGUMENT, want);
    }
    const char *bad_jobs[] = {"", "9ps", "a b", "w.1", "caf\xc3\xa9",
                              "j123456789012345678901234567890123456789012345678901234567890123"};
    for (size_t i = 0; i < sizeof bad_jobs / sizeof *bad_jobs; i++) {
        assert_true(dg_cluster_add_task(c, bad_jobs[i], 0, "h:1", st));
        assert_null(dg_cluster_check_task(c, bad_jobs[i], 0, st));
        assert_status(st, DG_INVALID_ARGUMENT, "cannot be served");
    }
    assert_null(dg_cluster_check_task(c, "w_2-X", 0, st));
    assert_status(st, DG_NOT_FOUND, "no job \"w_2-X\"");
    assert_null(dg_cluster_check_task(c, "ok", 9, st));
    assert_status(st, DG_NOT_FOUND, "job \"ok\" has no task 9");
    dg_cluster_free(&c);
    dg_status_free(&st);
}

static void test_cluster_copy_and_json_roundtrip(void **state) {
    (void)state;
    dg_cluster *c = example_cluster();
    dg_cluster *d = dg_cluster_copy(c);
    dg_cluster_free(&c);
    assert_non_null(d);
    assert_int_equal(dg_cluster_total_tasks(d), 5);
    char *js = dg_cluster_to_json(d);
    assert_string_equal(js, "{\"chief\": [\"[::1]:80\"], \"ps\": [\"p0:2222\", \"p1:2222\"], "
                            "\"worker\": {\"0\": \"w0:2222\", \"2\": \"w2:2222\"}}");
    dg_status *st = dg_status_new();
    dg_cluster *e = dg_cluster_from_json(js, st);
    assert_ok(st);
    char *js2 = dg_cluster_to_json(e);
    assert_string_equal(js, js2);
    free(js);
    free(js2);
    dg_cluster_free(&d);
    dg_cluster_free(&e);

    dg_cluster *n = dg_cluster_copy(NULL);
    assert_non_null(n);
    assert_int_equal(dg_cluster_num_jobs(n), 0);
    dg_cluster_free(&n);
    dg_status_free(&st);
}

static void test_cluster_from_json(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_json(
        "{\"ps\": [\"h:1\", \"h:2\"], \"worker\": {\"0\": \"h:3\", \"2\": \"h:4\"}, \"x\": []}", st);
    assert_ok(st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    assert_string_equal(dg_cluster_task_address(c, "ps", 1, st), "h:2");
    assert_string_equal(dg_cluster_task_address(c, "worker", 2, st), "h:4");
    assert_int_equal(dg_cluster_task_index(c, "worker", 1), 2);
    assert_true(dg_cluster_has_job(c, "x"));   // an empty job exists, as in TensorFlow
    assert_int_equal(dg_cluster_num_tasks(c, "x"), 0);
    char *js = dg_cluster_to_json(c);
    // As json.dumps prints as_dict(): an empty job is {}.
    assert_string_equal(js, "{\"ps\": [\"h:1\", \"h:2\"], \"worker\": {\"0\": \"h:3\", \"2\": "
                            "\"h:4\"}, \"x\": {}}");
    free(js);
    assert_int_equal(dg_cluster_job_num_tasks(c, "worker", st), 2);
    assert_int_equal(dg_cluster_job_task_span(c, "worker", st), 3);
    assert_int_equal(dg_cluster_job_num_tasks(c, "x", st), 0);
    assert_int_equal(dg_cluster_job_task_span(c, "x", st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "cluster: job \"x\" has no tasks");
    assert_int_equal(dg_cluster_job_num_tasks(c, "nojob", st), -1);
    assert_status(st, DG_NOT_FOUND, "no job \"nojob\"");
    assert_int_equal(dg_cluster_job_task_span(c, "nojob", st), -1);
    assert_status(st, DG_NOT_FOUND, "no job \"nojob\"");
    dg_cluster_free(&c);

    // Sparse keys as Python's int() reads them; names and addresses as they are.
    c = dg_cluster_from_json("{\"w\": {\" 1 \": \"a\", \"+2\": \"b\", \"03\": \"c\", \"1_0\": \"d\", \"-1\": \"e\", "
                             "\"\\u0665\": \"f\"}, \"my job\": [\"\", \"caf\\u00e9\"], \"\": {}}", st);
    assert_ok(st);
    assert_int_equal(dg_cluster_num_tasks(c, "w"), 6);
    assert_string_equal(dg_cluster_task_address(c, "w", 10, st), "d");
    assert_string_equal(dg_cluster_task_address(c, "w", 5, st), "f");
    assert_string_equal(dg_cluster_task_address(c, "w", -1, st), "e");
    assert_int_equal(dg_cluster_job_task_span(c, "w", st), 11);
    assert_string_equal(dg_cluster_task_address(c, "my job", 1, st), "caf\xc3\xa9");
    js = dg_cluster_to_json(c);
    assert_string_equal(js, "{\"\": {}, \"my job\": [\"\", \"caf\\u00e9\"], \"w\": {\"-1\": \"e\", \"1\": \"a\", "
                            "\"2\": \"b\", \"3\": \"c\", \"5\": \"f\", \"10\": \"d\"}}");
    dg_cluster *back = dg_cluster_from_json(js, st);
    char *js2 = dg_cluster_to_json(back);
    assert_string_equal(js, js2);
    free(js2);
    free(js);
    dg_cluster_free(&back);
    dg_cluster_free(&c);
    c = dg_cluster_from_json("{\"w\": {\"-5\": \"a\", \"1\": \"b\"}}", st);
    assert_int_equal(dg_cluster_job_task_span(c, "w", st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "task -5 does not fit its list of tasks 0..1");
    dg_cluster_free(&c);

    c = dg_cluster_from_json("{}", st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_num_jobs(c), 0);
    dg_cluster_free(&c);

    struct {
        const char *json, *needle;
    } bad[] = {
        {"[\"h:1\"]", "cluster JSON: must be an object of jobs, got [\"h:1\"]"},
        {"{\"ps\": \"h:1\"}", "cluster JSON: job \"ps\" must be a list or an object of addresses, got \"h:1\""},
        {"{\"ps\": null}", "job \"ps\" must be a list or an object"},
        {"{\"ps\": [\"h:1\", 7]}", "job \"ps\" task 1: the address must be a string, got 7"},
        {"{\"ps\": {\"0\": [1]}}", "job \"ps\" task 0: the address must be a string, got [1]"},
        {"{\"ps\": {\"x\": \"h:1\"}}", "job \"ps\": task index \"x\" is not an integer"},
        {"{\"ps\": {\"1.0\": \"h:1\"}}", "task index \"1.0\" is not an integer"},
        {"{\"ps\": {\"99999999999\": \"h:1\"}}", "task index \"99999999999\" is out of range (int32)"},
        {"{\"ps\": {\"1\": \"h:1\", \"01\": \"h:2\"}}", "job \"ps\": task index 1 is given twice (as \"01\" too)"},
        {"{\"ps\": [\"h:1\\u0000x\"]}", "job \"ps\" task 0: address \"h:1...\" contains a NUL byte"},
        {"{\"ps\": [\"\\ud800:1\"]}", "job \"ps\" task 0: address \"\xed\xa0\x80:1\" is not Unicode text"},
        {"{\"a\\u0000b\": []}", "job name \"a...\" contains a NUL byte"},
        {"{\"\\udc80\": []}", "job name \"\xed\xb2\x80\" is not Unicode text"},
        {"{\"ps\": [\"h:1\"], \"ps\": [\"h:2\"]}", "cluster JSON: offset 16: duplicate key \"ps\""},
        {"{\"ps\": [\"h:1\"", "cluster JSON: offset 13: expected ',' or ']'"},
        {"", "cluster JSON: offset 0: unexpected end of input"},
        {"{\"ps\": [\"a-very-long-host-name-that-goes-on-and-on:1\", 3]}", "got 3"},
        {"{\"ps\": {\"0\": \"h:1\", \"1\": {\"a-very-long-host-name-that-goes-on\": 12345}}}",
         "got {\"a-very-long-host-name-that-goes-on\"..."},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_status_reset(st);
        c = dg_cluster_from_json(bad[i].json, st);
        assert_null(c);
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
    }
    assert_null(dg_cluster_from_json(NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL string");
    dg_status_free(&st);
}

static void test_cluster_from_spec_string(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    // TensorFlow's form: jobs by ',', tasks by ';'.
    dg_cluster *c = dg_cluster_from_spec_string("worker|h:3,ps|h:1;h:2", st);
    assert_ok(st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_num_jobs(c), 2);
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    assert_string_equal(dg_cluster_task_address(c, "ps", 1, st), "h:2");
    assert_string_equal(dg_cluster_task_address(c, "worker", 0, st), "h:3");
    char *spec = dg_cluster_to_spec_string(c, st);
    assert_string_equal(spec, "ps|h:1;h:2,worker|h:3");
    free(spec);
    dg_cluster_free(&c);

    // distgraph's older form, jobs by ';' and tasks by ',', is still read: where TensorFlow's
    // reading fails, or gives job names no device string can hold ("h:2;worker" here).
    c = dg_cluster_from_spec_string("ps|h:1,h:2;worker|h:3", st);
    assert_ok(st);
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    assert_int_equal(dg_cluster_num_tasks(c, "worker"), 1);
    dg_cluster_free(&c);
    c = dg_cluster_from_spec_string("ps|h:1,worker", st);   // TensorFlow: "worker" has no '|'
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    dg_cluster_free(&c);

    c = dg_cluster_from_spec_string("local|localhost:2222", st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_total_tasks(c), 1);
    dg_cluster_free(&c);
    // Names and addresses are data, as in TensorFlow.
    c = dg_cluster_from_spec_string("my job|nohost;h:99999", st);
    assert_non_null(c);
    assert_string_equal(dg_cluster_task_address(c, "my job", 1, st), "h:99999");
    dg_cluster_free(&c);

    struct {
        const char *spec, *needle;
    } bad[] = {
        {"", "cluster spec \"\": empty"},
        {"ps|h:1,worker;x", "cluster spec \"ps|h:1,worker;x\": job \"worker;x\" at offset 7 has no '|'"},
        {"ps|h:1,", "job \"\" at offset 7 has no '|'"},
        {",ps|h:1", "job \"\" at offset 0 has no '|'"},
        {"ps|", "job \"ps\" task 0: empty address"},
        {"|h:1", "cluster spec \"|h:1\": empty job name at offset 0"},
        {"ps|h:1,ps|h:2", "cluster spec \"ps|h:1,ps|h:2\": job \"ps\" appears twice"},
        {"ps|h:1;;h:2", "job \"ps\" task 1: empty address"},
        {"ps|h:1;", "job \"ps\" task 1: empty address"},
        {"ps|;h:1", "job \"ps\" task 0: empty address"},
        {"ps|h:1|h:2", "job \"ps|h:1|h:2\" at offset 0 has more than one '|'"},
        {"ps|\xff", "not UTF-8 text"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_status_reset(st);
        assert_null(dg_cluster_from_spec_string(bad[i].spec, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
    }
    assert_null(dg_cluster_from_spec_string(NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL string");

    // What the string cannot say.
    struct {
        const char *json, *needle;
    } unsayable[] = {
        {"{}", "the cluster has no jobs"},
        {"{\"ps\": []}", "job \"ps\" has no tasks"},
        {"{\"ps\": {\"1\": \"h:1\"}}", "job \"ps\" has indices other than 0..n-1"},
        {"{\"ps\": {\"-1\": \"h:1\", \"0\": \"h:2\"}}", "has indices other than 0..n-1"},
        {"{\"\": [\"h:1\"]}", "has a name that is empty or holds"},
        {"{\"a,b\": [\"h:1\"]}", "has a name that is empty or holds"},
        {"{\"ps\": [\"h;1\"]}", "has an address that is empty or holds"},
        {"{\"ps\": [\"\"]}", "has an address that is empty or holds"},
    };
    for (size_t i = 0; i < sizeof unsayable / sizeof *unsayable; i++) {
        c = dg_cluster_from_json(unsayable[i].json, st);
        assert_non_null(c);
        assert_null(dg_cluster_to_spec_string(c, st));
        assert_status(st, DG_INVALID_ARGUMENT, unsayable[i].needle);
        dg_cluster_free(&c);
    }
    assert_null(dg_cluster_to_spec_string(NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "no jobs");
    dg_status_free(&st);
}

static void test_cluster_from_flags(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_flags("p0:1,p1:1", "w0:1,w1:1,w2:1", st);
    assert_ok(st);
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    assert_int_equal(dg_cluster_num_tasks(c, "worker"), 3);
    assert_string_equal(dg_cluster_task_address(c, "worker", 2, st), "w2:1");
    dg_cluster_free(&c);

    c = dg_cluster_from_flags(NULL, "w0:1", st);
    assert_int_equal(dg_cluster_num_jobs(c), 1);
    assert_false(dg_cluster_has_job(c, "ps"));
    dg_cluster_free(&c);
    c = dg_cluster_from_flags("", "", st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_num_jobs(c), 0);
    dg_cluster_free(&c);
    c = dg_cluster_from_flags("p0", "w1", st);   // checked when used
    assert_non_null(c);
    dg_cluster_free(&c);

    assert_null(dg_cluster_from_flags("p0:1,,p1:1", "w:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "--ps_hosts \"p0:1,,p1:1\": job \"ps\" task 1: empty address");
    assert_null(dg_cluster_from_flags("p0:1", "w0:1,", st));
    assert_status(st, DG_INVALID_ARGUMENT, "--worker_hosts \"w0:1,\": job \"worker\" task 1: empty");
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// TF_CONFIG

static void tf_ok(const char *json, dg_tf_config *cfg) {
    dg_status *st = dg_status_new();
    bool ok = dg_tf_config_parse(json, cfg, st);
    assert_ok(st);
    assert_true(ok);
    dg_status_free(&st);
}

static void test_tf_config_valid(void **state) {
    (void)state;
    dg_tf_config cfg;
    tf_ok("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w0:1\", \"w1:1\"], "
          "\"ps\": [\"p:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1}, "
          "\"rpc_layer\": \"grpc\", \"environment\": \"cloud\"}",
          &cfg);
    assert_non_null(cfg.cluster);
    assert_int_equal(dg_cluster_num_jobs(cfg.cluster), 3);
    assert_string_equal(cfg.task_type, "worker");
    assert_int_equal(cfg.task_index, 1);
    assert_false(cfg.is_chief);
    assert_string_equal(cfg.rpc_layer, "grpc");
    dg_tf_config_clear(&cfg);
    assert_null(cfg.cluster);
    assert_int_equal(cfg.task_index, -1);
    assert_string_equal(cfg.task_type, "");
    dg_tf_config_clear(&cfg);   // twice is fine
    dg_tf_config_clear(NULL);

    // The chief task is the chief; worker 0 is not when there is a chief job.
    tf_ok("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w0:1\"]}, "
          "\"task\": {\"type\": \"chief\", \"index\": 0}}", &cfg);
    assert_true(cfg.is_chief);
    dg_tf_config_clear(&cfg);
    tf_ok("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w0:1\"]}, "
          "\"task\": {\"type\": \"worker\", \"index\": 0}}", &cfg);
    assert_false(cfg.is_chief);
    dg_tf_config_clear(&cfg);

    // Without a chief job, worker 0 is the chief.
    tf_ok("{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"], \"ps\": [\"p:1\"]}, "
          "\"task\": {\"type\": \"worker\", \"index\": 0}}", &cfg);
    assert_true(cfg.is_chief);
    assert_string_equal(cfg.rpc_layer, "");
    dg_tf_config_clear(&cfg);
    tf_ok("{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"], \"ps\": [\"p:1\"]}, "
          "\"task\": {\"type\": \"ps\", \"index\": 0}}", &cfg);
    assert_false(cfg.is_chief);
    dg_tf_config_clear(&cfg);

    // The evaluator need not be in the cluster and is not the chief.
    tf_ok("{\"cluster\": {\"worker\": [\"w0:1\"]}, \"task\": {\"type\": \"evaluator\", "
          "\"index\": 0}}", &cfg);
    assert_string_equal(cfg.task_type, "evaluator");
    assert_false(cfg.is_chief);
    dg_tf_config_clear(&cfg);
    tf_ok("{\"task\": {\"type\": \"evaluator\", \"index\": 0}}", &cfg);
    assert_null(cfg.cluster);
    dg_tf_config_clear(&cfg);

    // No task: cluster only. No cluster: nothing at all.
    tf_ok("{\"cluster\": {\"worker\": [\"w0:1\"]}}", &cfg);
    assert_string_equal(cfg.task_type, "");
    assert_int_equal(cfg.task_index, -1);
    assert_false(cfg.is_chief);
    dg_tf_config_clear(&cfg);
    tf_ok("{}", &cfg);
    assert_null(cfg.cluster);
    assert_int_equal(cfg.task_index, -1);
    dg_tf_config_clear(&cfg);

    // Sparse jobs: the index must name an existing task.
    tf_ok("{\"cluster\": {\"worker\": {\"1\": \"w1:1\", \"3\": \"w3:1\"}}, "
          "\"task\": {\"type\": \"worker\", \"index\": 3}}", &cfg);
    assert_int_equal(cfg.task_index, 3);
    assert_true(!cfg.is_chief);
    dg_tf_config_clear(&cfg);
}

static void test_tf_config_loose_types(void **state) {
    (void)state;
    // TensorFlow reads task.index with int() and task.type with str(); a missing or non-object
    // "task" is no task.
    struct {
        const char *task;
        const char *type;
        int index;
    } ok[] = {
        {"{\"type\": \"worker\", \"index\": \"1\"}", "worker", 1},
        {"{\"type\": \"worker\", \"index\": \" 1 \"}", "worker", 1},
        {"{\"type\": \"worker\", \"index\": 1.0}", "worker", 1},
        {"{\"type\": \"worker\", \"index\": 1.9}", "worker", 1},
        {"{\"type\": \"worker\", \"index\": true}", "worker", 1},
        {"{\"type\": \"worker\", \"index\": false}", "worker", 0},
        {"{\"type\": \"worker\", \"index\": -0.5}", "worker", 0},
        {"[]", "", -1},
        {"\"worker\"", "", -1},
        {"{}", "", -1},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char json[256];
        snprintf(json, sizeof json, "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"]}, \"task\": %s}", ok[i].task);
        dg_tf_config cfg;
        tf_ok(json, &cfg);
        assert_string_equal(cfg.task_type, ok[i].type);
        assert_int_equal(cfg.task_index, ok[i].index);
        dg_tf_config_clear(&cfg);
    }
    dg_tf_config cfg;
    tf_ok("[]", &cfg);   // json.loads gives a list: nothing in it
    assert_null(cfg.cluster);
    dg_tf_config_clear(&cfg);
    tf_ok("{\"cluster\": {\"w\": [\"a:1\"]}, \"task\": {\"type\": \"w\", \"index\": 0}, \"rpc_layer\": 5}", &cfg);
    assert_string_equal(cfg.rpc_layer, "5");
    dg_tf_config_clear(&cfg);
    tf_ok("{\"cluster\": {\"w\": [\"a:1\"]}, \"task\": {\"type\": \"w\", \"index\": 0}, \"rpc_layer\": null}", &cfg);
    assert_string_equal(cfg.rpc_layer, "");
    dg_tf_config_clear(&cfg);
    // Negative indices are TensorFlow data too.
    tf_ok("{\"cluster\": {\"w\": {\"-1\": \"a:1\"}}, \"task\": {\"type\": \"w\", \"index\": -1}}", &cfg);
    assert_int_equal(cfg.task_index, -1);
    assert_string_equal(cfg.task_type, "w");
    dg_tf_config_clear(&cfg);
}

static void test_tf_config_errors(void **state) {
    (void)state;
    struct {
        const char *json, *needle;
    } bad[] = {
        {"{\"cluster\": ", "TF_CONFIG: offset 12: unexpected end of input"},
        {"", "TF_CONFIG: offset 0: unexpected end of input"},
        {"5", "TF_CONFIG must be an object to hold \"cluster\", got int (number)"},
        {"[\"cluster\"]", "TF_CONFIG must be an object to hold \"cluster\", got a array that contains it"},
        {"{\"cluster\": [\"w:1\"]}", "TF_CONFIG: \"cluster\": must be an object of jobs, got [\"w:1\"]"},
        {"{\"cluster\": null}", "TF_CONFIG: \"cluster\": must be an object of jobs, got null"},
        {"{\"cluster\": {\"worker\": [1]}}", "TF_CONFIG: \"cluster\": job \"worker\" task 0: the address must be a string"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": 5}",
         "TF_CONFIG \"task\" must be an object to hold \"type\", got int (number)"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": \"prototype\"}",
         "TF_CONFIG \"task\" must be an object to hold \"type\", got a string that contains it"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"index\": 0}}", "TF_CONFIG: \"task\" has no \"type\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\"}}", "TF_CONFIG: \"task\" has no \"index\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": \"abc\"}}",
         "TF_CONFIG: \"task.index\" must be an integer, got \"abc\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": \"1.0\"}}",
         "\"task.index\" must be an integer, got \"1.0\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": null}}",
         "\"task.index\" must be an integer, got null"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": NaN}}",
         "\"task.index\" must be an integer, got NaN"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1e999}}",
         "\"task.index\" must be an integer, got 1e999"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1.5}}",
         "TF_CONFIG: \"task.index\" 1 is out of range: job \"worker\" has 1 task"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": -1}}",
         "TF_CONFIG: \"task.index\" -1 is out of range: job \"worker\" has 1 task"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 3000000000}}",
         "\"task.index\" is out of range for job \"worker\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 99999999999999999999}}",
         "\"task.index\" is out of range for job \"worker\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": 1, \"index\": 0}}",
         "TF_CONFIG: \"task.type\" \"1\" is not a job in \"cluster\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": null, \"index\": 0}}",
         "TF_CONFIG: \"task.type\" \"None\" is not a job in \"cluster\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"\", \"index\": 0}}", "TF_CONFIG: \"task.type\" is empty"},
        {"{\"task\": {\"type\": \"w0123456789012345678901234567890123456789012345678901234567890123\", "
         "\"index\": 0}}",
         "is longer than 63 bytes"},
        {"{\"cluster\": {\"worker\": [\"w:1\", \"w:2\"]}, \"task\": {\"type\": \"worker\", \"index\": 2}}",
         "TF_CONFIG: \"task.index\" 2 is out of range: job \"worker\" has 2 tasks"},
        {"{\"cluster\": {\"worker\": {\"0\": \"w:1\", \"2\": \"w:2\"}}, \"task\": {\"type\": \"worker\", "
         "\"index\": 1}}",
         "TF_CONFIG: \"task.index\" 1 is out of range: job \"worker\" has no task 1"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
         "TF_CONFIG: \"task.type\" \"ps\" is not a job in \"cluster\""},
        {"{\"task\": {\"type\": \"worker\", \"index\": 0}}",
         "TF_CONFIG: \"task.type\" is \"worker\" but there is no \"cluster\""},
        {"{\"cluster\": {\"chief\": [\"c:1\", \"c:2\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}",
         "TF_CONFIG: \"cluster\": job \"chief\" has 2 tasks, at most 1 is allowed"},
        {"{\"cluster\": {\"evaluator\": [\"e:1\", \"e:2\"]}}", "job \"evaluator\" has 2 tasks, at most 1 is allowed"},
        {"{\"rpc_layer\": \"grpc+verbs+something+very+long+indeed\"}",
         "TF_CONFIG: \"rpc_layer\" \"grpc+verbs+something+very+long+indeed\" is longer than 31 bytes"},
        {"{\"task\": {\"type\": \"worker\", \"index\": 0}, \"task\": {}}", "TF_CONFIG: offset 41: duplicate key \"task\""},
        {"{\"clsuter\": {\"worker\": [\"w:1\"]}}", "unknown key \"clsuter\" at byte 1 (did you mean \"cluster\"?)"},
    };
    dg_status *st = dg_status_new();
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_tf_config cfg;
        memset(&cfg, 0x7f, sizeof cfg);
        dg_status_reset(st);
        assert_false(dg_tf_config_parse(bad[i].json, &cfg, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
        // A failed parse leaves a cleared config that needs no freeing.
        assert_null(cfg.cluster);
        assert_int_equal(cfg.task_index, -1);
        assert_string_equal(cfg.task_type, "");
        dg_tf_config_clear(&cfg);
    }
    dg_tf_config cfg;
    assert_false(dg_tf_config_parse(NULL, &cfg, st));
    assert_status(st, DG_INVALID_ARGUMENT, "TF_CONFIG: NULL string");
    assert_false(dg_tf_config_parse("{}", NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL output");
    dg_status_free(&st);
}

static void test_tf_config_from_env(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_tf_config cfg;
    unsetenv("TF_CONFIG");
    assert_false(dg_tf_config_from_env(&cfg, st));
    assert_status(st, DG_NOT_FOUND, "TF_CONFIG is not set");
    assert_null(cfg.cluster);
    setenv("TF_CONFIG", "", 1);
    assert_false(dg_tf_config_from_env(&cfg, st));
    assert_status(st, DG_NOT_FOUND, "TF_CONFIG is empty");

    setenv("TF_CONFIG",
           "{\"cluster\": {\"ps\": [\"p:1\"], \"worker\": [\"w:1\"]}, "
           "\"task\": {\"type\": \"ps\", \"index\": 0}}",
           1);
    dg_status_reset(st);
    assert_true(dg_tf_config_from_env(&cfg, st));
    assert_ok(st);
    assert_string_equal(cfg.task_type, "ps");
    assert_int_equal(dg_cluster_total_tasks(cfg.cluster), 2);
    dg_tf_config_clear(&cfg);

    setenv("TF_CONFIG", "{\"task\": {\"type\": \"ps\"}}", 1);
    assert_false(dg_tf_config_from_env(&cfg, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"task\" has no \"index\"");
    unsetenv("TF_CONFIG");
    dg_status_free(&st);
}

static void test_server_def(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_json("{\"worker\": {\"3\": \"w3:1\"}}", st);
    // TensorFlow's defaults: the only job, its only task, "grpc".
    dg_server_def *d = dg_server_def_new(c, NULL, st);
    assert_ok(st);
    assert_string_equal(dg_server_def_job_name(d), "worker");
    assert_int_equal(dg_server_def_task_index(d), 3);
    assert_string_equal(dg_server_def_protocol(d), "grpc");
    assert_true(dg_cluster_num_jobs(dg_server_def_cluster(d)) == 1);
    dg_server_def_free(&d);
    assert_null(d);
    dg_server_def_free(&d);
    dg_server_def_free(NULL);
    // Given values are taken as they are; the server judges them when it starts.
    dg_server_def_options o = dg_server_def_options_default();
    o.job_name = "ps";
    o.has_task_index = true;
    o.task_index = 9;
    o.protocol = "grpc+verbs";
    d = dg_server_def_new(c, &o, st);
    assert_ok(st);
    assert_string_equal(dg_server_def_job_name(d), "ps");
    assert_int_equal(dg_server_def_task_index(d), 9);
    assert_string_equal(dg_server_def_protocol(d), "grpc+verbs");
    dg_server_def_free(&d);
    dg_cluster_free(&c);

    c = dg_cluster_from_json("{\"ps\": [\"p:1\"], \"worker\": [\"w0:1\", \"w1:1\"]}", st);
    assert_null(dg_server_def_new(c, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "server definition: the cluster has 2 jobs: give the job name");
    o = dg_server_def_options_default();
    o.job_name = "worker";
    assert_null(dg_server_def_new(c, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "job \"worker\" has 2 tasks: give the task index");
    o.job_name = "chief";
    assert_null(dg_server_def_new(c, &o, st));
    assert_status(st, DG_NOT_FOUND, "server definition: no job \"chief\" in the cluster");
    o.job_name = "w\xff";
    o.has_task_index = true;
    assert_null(dg_server_def_new(c, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "server definition: job name \"w\xff\" is not UTF-8 text");
    assert_null(dg_server_def_new(NULL, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL cluster");
    assert_null(dg_server_def_cluster(NULL));
    dg_cluster_free(&c);
    dg_status_free(&st);
}

static void test_resolver(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    const char *cfg = "{\"cluster\": {\"ps\": [\"p0:1\"], \"worker\": [\"w0:1\", \"w1:1\"]}, "
                      "\"task\": {\"type\": \"worker\", \"index\": \"1\"}, \"rpc_layer\": \"grpc\", "
                      "\"environment\": \"cloud\"}";
    dg_tf_resolver *r = dg_tf_resolver_new(cfg, NULL, st);
    assert_ok(st);
    const char *s = NULL;
    bool has = false;
    int64_t id = -1;
    assert_true(dg_tf_resolver_task_type(r, &s, st));
    assert_string_equal(s, "worker");
    assert_true(dg_tf_resolver_task_id(r, &has, &id, st));
    assert_true(has);
    assert_int_equal(id, 1);
    assert_true(dg_tf_resolver_rpc_layer(r, &s, st));
    assert_string_equal(s, "grpc");
    assert_null(dg_tf_resolver_environment(r));   // TF_CONFIG's "environment" is not the resolver's
    char *m = dg_tf_resolver_master(r, NULL, false, 0, NULL, st);
    assert_string_equal(m, "grpc://w1:1");
    free(m);
    m = dg_tf_resolver_master(r, "ps", true, 0, "dg", st);
    assert_string_equal(m, "dg://p0:1");
    free(m);
    m = dg_tf_resolver_master(r, "ps", true, 0, "", st);
    assert_string_equal(m, "p0:1");
    free(m);
    assert_null(dg_tf_resolver_master(r, "chief", true, 0, NULL, st));
    assert_status(st, DG_NOT_FOUND, "TF_CONFIG: no job \"chief\" in the cluster");
    assert_null(dg_tf_resolver_master(r, "worker", true, 5, NULL, st));
    assert_status(st, DG_NOT_FOUND, "TF_CONFIG: job \"worker\" has no task 5");
    const char *devs[] = {"/job:worker/replica:0/task:1/device:GPU:0", "/job:worker/replica:0/task:1/device:GPU:1",
                          "/job:worker/replica:0/task:1/device:CPU:0", "/job:worker/replica:0/task:0/device:TPU:0"};
    dg_accelerator_count counts[4];
    assert_int_equal(dg_tf_resolver_num_accelerators(r, NULL, false, 0, devs, 4, counts, 4, st), 1);
    assert_string_equal(counts[0].device_type, "GPU");
    assert_int_equal(counts[0].count, 2);
    assert_int_equal(dg_tf_resolver_num_accelerators(r, "worker", true, 0, devs, 4, counts, 0, st), 1);
    const char *bad_devs[] = {"/job:worker/bogus:1"};
    assert_int_equal(dg_tf_resolver_num_accelerators(r, NULL, false, 0, bad_devs, 1, counts, 4, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "num_accelerators");
    dg_cluster *c = dg_tf_resolver_cluster_spec(r, st);
    assert_int_equal(dg_cluster_total_tasks(c), 3);
    dg_cluster_free(&c);
    dg_tf_resolver_free(&r);
    assert_null(r);
    dg_tf_resolver_free(&r);
    dg_tf_resolver_free(NULL);

    // Overrides, as TFConfigClusterResolver(task_type=..., ...) takes them.
    dg_tf_resolver_options o = dg_tf_resolver_options_default();
    o.task_type = "ps";
    o.has_task_id = true;
    o.task_id = 0;
    o.rpc_layer = "";
    o.environment = "google";
    r = dg_tf_resolver_new(cfg, &o, st);
    m = dg_tf_resolver_master(r, NULL, false, 0, NULL, st);
    assert_string_equal(m, "p0:1");
    free(m);
    assert_string_equal(dg_tf_resolver_environment(r), "google");
    dg_tf_resolver_free(&r);

    // Unset: no cluster, no task, master "" (in process).
    r = dg_tf_resolver_new(NULL, NULL, st);
    assert_true(dg_tf_resolver_task_type(r, &s, st));
    assert_null(s);
    assert_true(dg_tf_resolver_task_id(r, &has, &id, st));
    assert_false(has);
    m = dg_tf_resolver_master(r, NULL, false, 0, NULL, st);
    assert_string_equal(m, "");
    free(m);
    dg_tf_resolver_free(&r);

    // Each property fails as TensorFlow's does, the others still answer.
    r = dg_tf_resolver_new("{\"cluster\": {\"w\": [\"a:1\", \"b:1\"]}, \"task\": {\"type\": \"w\", \"index\": \"x\"}}",
                           NULL, st);
    assert_true(dg_tf_resolver_task_type(r, &s, st));
    assert_false(dg_tf_resolver_task_id(r, &has, &id, st));
    assert_status(st, DG_INVALID_ARGUMENT, "TF_CONFIG: \"task.index\" must be an integer, got \"x\"");
    assert_null(dg_tf_resolver_master(r, NULL, false, 0, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"task.index\" must be an integer");
    m = dg_tf_resolver_master(r, NULL, true, 1, NULL, st);
    assert_string_equal(m, "b:1");
    free(m);
    dg_tf_resolver_free(&r);

    assert_null(dg_tf_resolver_new("{\"task\": ", NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "TF_CONFIG: offset 9: unexpected end of input");
    assert_null(dg_tf_resolver_new("", NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "TF_CONFIG: offset 0");
    assert_false(dg_tf_resolver_task_type(NULL, &s, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    assert_null(dg_tf_resolver_cluster_spec(NULL, st));
    assert_null(dg_tf_resolver_master(NULL, NULL, false, 0, NULL, st));
    assert_null(dg_tf_resolver_environment(NULL));

    setenv("TF_CONFIG", "{\"task\": {\"type\": \"chief\", \"index\": 0}}", 1);
    r = dg_tf_resolver_from_env(NULL, st);
    assert_true(dg_tf_resolver_task_type(r, &s, st));
    assert_string_equal(s, "chief");
    dg_tf_resolver_free(&r);
    setenv("TF_CONFIG", "", 1);
    assert_null(dg_tf_resolver_from_env(NULL, st));   // TensorFlow: not JSON
    assert_status(st, DG_INVALID_ARGUMENT, "TF_CONFIG: offset 0: unexpected end of input");
    unsetenv("TF_CONFIG");
    dg_status_free(&st);
}

static void test_run_config(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_run_config rc;
    const char *cl = "{\"cluster\": {\"chief\": [\"host0:2222\"], \"ps\": [\"host1:2222\", \"host2:2222\"], "
                     "\"worker\": [\"host3:2222\", \"host4:2222\", \"host5:2222\"]}, ";
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s\"task\": {\"type\": \"worker\", \"index\": 1}}", cl);
    assert_true(dg_run_config_parse(cfg, &rc, st));
    assert_ok(st);
    assert_string_equal(rc.task_type, "worker");
    assert_int_equal(rc.task_id, 1);
    assert_false(rc.is_chief);
    assert_string_equal(rc.master, "grpc://host4:2222");
    assert_string_equal(rc.evaluation_master, "");
    assert_int_equal(rc.num_ps_replicas, 2);
    assert_int_equal(rc.num_worker_replicas, 4);
    assert_true(rc.has_global_id);
    assert_int_equal(rc.global_id_in_cluster, 2);   // the run_config.py docstring's table
    assert_null(rc.model_dir);
    dg_run_config_clear(&rc);
    assert_null(rc.cluster);
    dg_run_config_clear(&rc);
    dg_run_config_clear(NULL);
    snprintf(cfg, sizeof cfg, "%s\"task\": {\"type\": \"ps\", \"index\": 1}}", cl);
    assert_true(dg_run_config_parse(cfg, &rc, st));
    assert_int_equal(rc.global_id_in_cluster, 5);
    dg_run_config_clear(&rc);
    snprintf(cfg, sizeof cfg, "%s\"task\": {\"type\": \"evaluator\", \"index\": 0}, \"eval_session_master\": \"e:1\"}",
             cl);
    assert_true(dg_run_config_parse(cfg, &rc, st));
    assert_false(rc.has_global_id);
    assert_int_equal(dg_cluster_num_jobs(rc.cluster), 0);
    assert_string_equal(rc.evaluation_master, "e:1");
    assert_int_equal(rc.num_worker_replicas, 0);
    dg_run_config_clear(&rc);
    // Local mode.
    assert_true(dg_run_config_parse(NULL, &rc, st));
    assert_true(rc.is_chief);
    assert_string_equal(rc.task_type, "worker");
    assert_int_equal(rc.num_worker_replicas, 1);
    assert_string_equal(rc.master, "");
    dg_run_config_clear(&rc);
    assert_true(dg_run_config_parse("{\"session_master\": null, \"model_dir\": \"/m\"}", &rc, st));
    assert_null(rc.master);
    assert_string_equal(rc.model_dir, "/m");
    dg_run_config_clear(&rc);

    struct {
        const char *json, *needle;
    } bad[] = {
        {"[]", "TF_CONFIG: the document must be an object, got list (array)"},
        {"{\"model_dir\": \"\"}", "TF_CONFIG: \"model_dir\" must not be empty"},
        {"{\"service\": 1}", "TF_CONFIG: \"service\" must be an object, got a int"},
        {"{\"task\": {\"type\": \"ps\", \"index\": 0}}", "without a \"cluster\", \"task.type\" must be \"worker\""},
        {"{\"task\": {\"index\": 2}}", "without a \"cluster\", \"task.index\" must be 0"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}",
         "TF_CONFIG: \"cluster\" must have one \"chief\" task"},
        {"{\"cluster\": {\"chief\": [\"c:1\", \"c:2\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}",
         "must have only one \"chief\" task, its tasks span 0..1"},
        {"{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"index\": 0}}", "with a \"cluster\", \"task.type\" must be set"},
        {"{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"chief\"}}", "\"task.index\" must be set"},
        {"{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"chief\", \"index\": -1}}",
         "\"task.index\" must not be negative, got -1"},
        {"{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
         "\"task.type\" \"ps\" is not a job of \"cluster\""},
        {"{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 1}}",
         "\"task.index\" 1 is not a task of job \"chief\" (0..0)"},
        {"{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": {\"0\": \"a:1\", \"2\": \"b:1\"}}, "
         "\"task\": {\"type\": \"worker\", \"index\": 1}}",
         "job \"worker\" has no task 1 to be the master"},
        {"{\"cluster\": {\"master\": [\"m:1\"], \"chief\": [\"c:1\"]}, \"task\": {\"type\": \"master\", \"index\": 0}}",
         "with a \"master\" job, a \"chief\" job is not supported"},
        {"{\"cluster\": {\"master\": [\"m:1\"]}, \"task\": {\"type\": \"evaluator\", \"index\": 0}}",
         "with a \"master\" job, the evaluator is not supported"},
        {"{", "TF_CONFIG: offset 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        memset(&rc, 0x7f, sizeof rc);
        assert_false(dg_run_config_parse(bad[i].json, &rc, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
        assert_null(rc.cluster);
        assert_null(rc.task_type);
        dg_run_config_clear(&rc);
    }
    assert_false(dg_run_config_parse("{}", NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL output");
    setenv("TF_CONFIG", "{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}", 1);
    assert_true(dg_run_config_from_env(&rc, st));
    assert_true(rc.is_chief);
    assert_string_equal(rc.master, "");   // one task: in process
    dg_run_config_clear(&rc);
    unsetenv("TF_CONFIG");
    dg_status_free(&st);
}

static void test_multi_worker(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_json("{\"chief\": [\"c:1\"], \"worker\": [\"w0:1\", \"w1:1\"], \"ps\": [\"p:1\"]}", st);
    bool chief = false;
    int64_t id = -1;
    assert_true(dg_multi_worker_validate(c, "worker", 1, st));
    assert_true(dg_multi_worker_is_chief(c, "chief", 0, &chief, st));
    assert_true(chief);
    assert_true(dg_multi_worker_is_chief(c, "worker", 0, &chief, st));
    assert_false(chief);
    assert_true(dg_multi_worker_is_chief(c, "evaluator", 0, &chief, st));
    assert_true(chief);   // multi_worker_util: the evaluator is a chief of its own
    assert_int_equal(dg_multi_worker_count(c, "worker", st), 3);
    assert_true(dg_multi_worker_id_in_cluster(c, "worker", 1, &id, st));
    assert_int_equal(id, 2);
    assert_string_equal(dg_multi_worker_collective_leader(c, "worker", 0, st), "/job:chief/replica:0/task:0");
    assert_string_equal(dg_multi_worker_coordination_leader(c, st), "/job:ps/replica:0/task:0");

    assert_false(dg_multi_worker_validate(c, "worker", 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "multi-worker: task id 2 is past the last task of job \"worker\" (2 tasks)");
    assert_false(dg_multi_worker_validate(c, "master", 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "task type \"master\" is not \"chief\", \"worker\", \"evaluator\" or \"ps\"");
    assert_int_equal(dg_multi_worker_count(c, "ps", st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "worker_count is for \"chief\", \"worker\" and \"evaluator\" tasks, not \"ps\"");
    assert_int_equal(dg_multi_worker_count(c, "evaluator", st), -1);
    assert_status(st, DG_NOT_FOUND, "the cluster has no \"evaluator\" job");
    assert_false(dg_multi_worker_id_in_cluster(c, "ps", 0, &id, st));
    assert_status(st, DG_INVALID_ARGUMENT, "there is no id for task type \"ps\"");
    assert_false(dg_multi_worker_is_chief(c, "worker", 0, NULL, st));
    assert_false(dg_multi_worker_id_in_cluster(c, "worker", 0, NULL, st));
    dg_cluster_free(&c);

    c = dg_cluster_from_json("{\"ps\": [\"p:1\"], \"localhost\": [\"l:1\"]}", st);
    assert_false(dg_multi_worker_validate(c, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "job \"localhost\" is not allowed");
    dg_cluster_free(&c);
    c = dg_cluster_from_json("{\"ps\": [\"p:1\"]}", st);
    assert_null(dg_multi_worker_collective_leader(c, "ps", 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "neither a \"chief\" nor a \"worker\" job");
    dg_cluster_free(&c);
    c = dg_cluster_new();
    assert_string_equal(dg_multi_worker_collective_leader(c, "worker", 0, st), "");
    assert_string_equal(dg_multi_worker_coordination_leader(c, st), "");
    dg_cluster_free(&c);
    assert_false(dg_multi_worker_validate(NULL, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL cluster");
    assert_null(dg_multi_worker_coordination_leader(NULL, st));
    dg_status_free(&st);
}

// A call that succeeds leaves its status OK, whatever it held before (tests/runtime/test_contract.c).
static void test_status_cleared_on_success(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
#define DIRTY() dg_status_set(st, DG_INTERNAL, "left over")
    const char *cfg = "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\"]}, "
                      "\"task\": {\"type\": \"worker\", \"index\": 99999999999999999999999}}";
    DIRTY();
    dg_cluster *c = dg_cluster_from_json("{\"chief\": [\"c:1\"], \"worker\": [\"w:1\"]}", st);
    assert_ok(st);
    DIRTY();
    assert_int_equal(dg_cluster_job_num_tasks(c, "worker", st), 1);
    assert_ok(st);
    DIRTY();
    assert_int_equal(dg_cluster_job_task_span(c, "worker", st), 1);
    assert_ok(st);
    DIRTY();
    assert_non_null(dg_cluster_check_task(c, "worker", 0, st));
    assert_ok(st);
    DIRTY();
    char *spec = dg_cluster_to_spec_string(c, st);
    assert_ok(st);
    free(spec);
    DIRTY();
    assert_true(dg_cluster_add_job(c, "ps", st));
    assert_ok(st);
    DIRTY();
    dg_server_def_options o = dg_server_def_options_default();
    o.job_name = "chief";
    dg_server_def *d = dg_server_def_new(c, &o, st);
    assert_ok(st);
    dg_server_def_free(&d);
    bool b;
    int64_t id;
    DIRTY();
    assert_true(dg_multi_worker_is_chief(c, "worker", 0, &b, st));
    assert_ok(st);
    DIRTY();
    assert_int_equal(dg_multi_worker_count(c, "worker", st), 2);
    assert_ok(st);
    DIRTY();
    assert_true(dg_multi_worker_id_in_cluster(c, "worker", 0, &id, st));
    assert_ok(st);
    DIRTY();
    assert_non_null(dg_multi_worker_collective_leader(c, "worker", 0, st));
    assert_ok(st);
    DIRTY();
    assert_non_null(dg_multi_worker_coordination_leader(c, st));
    assert_ok(st);
    dg_cluster_free(&c);

    // A task index past int64 fails task_id only; the other properties answer with OK.
    DIRTY();
    dg_tf_resolver *r = dg_tf_resolver_new(cfg, NULL, st);
    assert_ok(st);
    const char *s = NULL;
    DIRTY();
    assert_true(dg_tf_resolver_task_type(r, &s, st));
    assert_ok(st);
    DIRTY();
    assert_true(dg_tf_resolver_rpc_layer(r, &s, st));
    assert_ok(st);
    DIRTY();
    c = dg_tf_resolver_cluster_spec(r, st);
    assert_ok(st);
    dg_cluster_free(&c);
    DIRTY();
    char *m = dg_tf_resolver_master(r, "chief", true, 0, NULL, st);
    assert_ok(st);
    free(m);
    DIRTY();
    assert_null(dg_tf_resolver_master(r, NULL, false, 0, NULL, st));
    assert_status(st, DG_NOT_FOUND, "job \"worker\" has no task with that index");
    DIRTY();
    const char *devs[] = {"/job:chief/task:0/device:GPU:0"};
    dg_accelerator_count counts[2];
    assert_int_equal(dg_tf_resolver_num_accelerators(r, "chief", true, 0, devs, 1, counts, 2, st), 1);
    assert_ok(st);
    dg_tf_resolver_free(&r);
    DIRTY();
    dg_run_config rc;
    assert_true(dg_run_config_parse("{\"task\": {\"index\": \"0\"}}", &rc, st));
    assert_ok(st);
    dg_run_config_clear(&rc);
    DIRTY();
    dg_tf_config tc;
    assert_true(dg_tf_config_parse("{\"cluster\": {\"w\": [\"a:1\"]}, \"task\": {\"type\": \"w\", \"index\": 0}}", &tc, st));
    assert_ok(st);
    dg_tf_config_clear(&tc);
#undef DIRTY
    dg_status_free(&st);
}

// ---------------------------------------------------------------------------------------
// Robustness: random and truncated input must fail cleanly, never crash or leak.

static void fill_random(char *s, size_t n, uint64_t *rng, const char *alphabet) {
    size_t na = strlen(alphabet);
    for (size_t i = 0; i < n; i++) {
        if (alphabet[0] == '\0')
            s[i] = (char)(1 + (int)dg_test_uniform(rng, 0, 255));
        else
            s[i] = alphabet[(size_t)dg_test_uniform(rng, 0, (double)na)];
    }
    s[n] = '\0';
}

static void test_fuzz(void **state) {
    (void)state;
    static const char *seeds[] = {
        "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": {\"0\": \"w0:1\", \"3\": \"w3:2\"}, "
        "\"ps\": [\"[::1]:5\"]}, \"task\": {\"type\": \"worker\", \"index\": 3}, "
        "\"rpc_layer\": \"grpc\"}",
        "[1, -2.5e+3, true, false, null, \"\\u00e9\\ud83d\\ude00\\n\", {\"a\": [[]]}]",
        "{\"task\": {\"type\": \"evaluator\", \"index\": 0}}",
    };
    static const char *spec_seeds[] = {"ps|h:1,h:2;worker|h:3", "a|[::1]:80;b|x:65535,y:1"};
    static const char json_alpha[] = "{}[]\":,0123456789-+.eEtrufalsn \\u/ab\xc3\xa9\xff";
    static const char spec_alpha[] = "psworker|;,:h0129[]. ";
    uint64_t rng = 987654321;
    dg_status *st = dg_status_new();
    char s[256];
    int n_json_ok = 0, n_tf_ok = 0, n_spec_ok = 0;
    for (int iter = 0; iter < 30000; iter++) {
        size_t n;
        int mode = iter % 5;
        if (mode <= 1) {
            // Truncated and mutated seeds.
            const char *seed = seeds[(size_t)iter / 5 % (sizeof seeds / sizeof seeds[0])];
            size_t len = strlen(seed);
            n = iter % 10 == 0 ? len : (size_t)dg_test_uniform(&rng, 0, (double)len + 1);
            memcpy(s, seed, n);
            s[n] = '\0';
            if (mode == 1 && n > 0) {
                for (int f = 0; f < 3; f++) {
                    size_t at = (size_t)dg_test_uniform(&rng, 0, (double)n);
                    char c = json_alpha[(size_t)dg_test_uniform(&rng, 0, sizeof json_alpha - 1)];
                    s[at] = c;
                }
            }
        } else if (mode == 2) {
            n = (size_t)dg_test_uniform(&rng, 0, 64);
            fill_random(s, n, &rng, json_alpha);
        } else if (mode == 3) {
            n = (size_t)dg_test_uniform(&rng, 0, 64);
            fill_random(s, n, &rng, "");
        } else {
            const char *seed = spec_seeds[(size_t)iter / 5 % 2];
            n = strlen(seed);
            memcpy(s, seed, n + 1);
            if (iter % 2) {
                n = (size_t)dg_test_uniform(&rng, 0, (double)n + 1);
                s[n] = '\0';
            }
            for (int f = 0; f < 2 && n > 0; f++)
                s[(size_t)dg_test_uniform(&rng, 0, (double)n)] =
                    spec_alpha[(size_t)dg_test_uniform(&rng, 0, sizeof spec_alpha - 1)];
            if (iter % 7 == 0) {
                n = (size_t)dg_test_uniform(&rng, 0, 40);
                fill_random(s, n, &rng, spec_alpha);
            }
        }

        // Raw parser, with the exact length (the buffer is not read past it).
        dg_status_reset(st);
        char *exact = malloc(n ? n : 1);
        memcpy(exact, s, n);
        cluster_json *v = cluster_json_parse(exact, n, "JSON", st);
        if (v) {
            n_json_ok++;
            assert_true(v->offset + v->src_len <= n);
        } else {
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        }
        cluster_json_free(&v);
        free(exact);

        dg_status_reset(st);
        dg_cluster *c = dg_cluster_from_json(s, st);
        if (c) {
            char *js = dg_cluster_to_json(c);
            dg_cluster *again = dg_cluster_from_json(js, st);
            assert_non_null(again);
            char *js2 = dg_cluster_to_json(again);
            assert_string_equal(js, js2);
            free(js);
            free(js2);
            dg_cluster_free(&again);
        } else {
            assert_true(dg_status_code(st) == DG_INVALID_ARGUMENT);
        }
        dg_cluster_free(&c);

        dg_status_reset(st);
        dg_tf_config cfg;
        if (dg_tf_config_parse(s, &cfg, st))
            n_tf_ok++;
        else
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        dg_tf_config_clear(&cfg);

        // The resolver's and RunConfig's readings of any text fail cleanly or answer.
        dg_tf_resolver *r = dg_tf_resolver_new(s, NULL, st);
        if (r) {
            const char *ts = NULL;
            bool has = false;
            int64_t tid = 0;
            dg_cluster *rc_cluster = dg_tf_resolver_cluster_spec(r, st);
            dg_cluster_free(&rc_cluster);
            (void)dg_tf_resolver_task_type(r, &ts, st);
            (void)dg_tf_resolver_task_id(r, &has, &tid, st);
            (void)dg_tf_resolver_rpc_layer(r, &ts, st);
            free(dg_tf_resolver_master(r, NULL, false, 0, NULL, st));
            free(dg_tf_resolver_master(r, "worker", true, 3, "grpc", st));
            dg_tf_resolver_free(&r);
        } else {
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        }
        dg_run_config rcfg;
        if (!dg_run_config_parse(s, &rcfg, st)) assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        dg_run_config_clear(&rcfg);

        dg_status_reset(st);
        c = dg_cluster_from_spec_string(s, st);
        if (c) {
            n_spec_ok++;
            assert_true(dg_cluster_total_tasks(c) > 0);
            // The string form reads back as the same cluster, where it can say it.
            char *spec = dg_cluster_to_spec_string(c, st);
            if (spec) {
                dg_cluster *again = dg_cluster_from_spec_string(spec, st);
                assert_non_null(again);
                char *j1 = dg_cluster_to_json(c), *j2 = dg_cluster_to_json(again);
                assert_string_equal(j1, j2);
                free(j1);
                free(j2);
                dg_cluster_free(&again);
            } else {
                assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
            }
            free(spec);
        } else {
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        }
        dg_cluster_free(&c);

        dg_status_reset(st);
        c = dg_cluster_from_flags(s, s, st);
        dg_cluster_free(&c);
    }
    // The seeds keep a fair share of inputs valid, so the success paths are exercised too.
    assert_true(n_json_ok > 100);
    assert_true(n_tf_ok > 100);
    assert_true(n_spec_ok > 100);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_scalars),
        cmocka_unit_test(test_json_strings),
        cmocka_unit_test(test_json_containers),
        cmocka_unit_test(test_json_depth),
        cmocka_unit_test(test_json_errors),
        cmocka_unit_test(test_json_python),
        cmocka_unit_test(test_cluster_accessors),
        cmocka_unit_test(test_cluster_add_errors),
        cmocka_unit_test(test_cluster_check_task),
        cmocka_unit_test(test_cluster_copy_and_json_roundtrip),
        cmocka_unit_test(test_cluster_from_json),
        cmocka_unit_test(test_cluster_from_spec_string),
        cmocka_unit_test(test_cluster_from_flags),
        cmocka_unit_test(test_tf_config_valid),
        cmocka_unit_test(test_tf_config_loose_types),
        cmocka_unit_test(test_tf_config_errors),
        cmocka_unit_test(test_tf_config_from_env),
        cmocka_unit_test(test_server_def),
        cmocka_unit_test(test_resolver),
        cmocka_unit_test(test_run_config),
        cmocka_unit_test(test_multi_worker),
        cmocka_unit_test(test_status_cleared_on_success),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
