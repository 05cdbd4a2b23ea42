/* Tests for placer/cluster.c and its JSON parser placer/json.c, after TensorFlow's
 * server_lib_test.py (ClusterSpec), tfconfig_cluster_resolver_test.py and
 * multi_worker_util_test.py. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

// ---------------------------------------------------------------------------------------
// JSON parser

static placer_json *json_ok(const char *text) {
    dg_status *st = dg_status_new();
    placer_json *v = placer_json_parse(text, strlen(text), "JSON", st);
    assert_ok(st);
    assert_non_null(v);
    dg_status_free(&st);
    return v;
}

static void json_bad(const char *text, size_t len, const char *needle) {
    dg_status *st = dg_status_new();
    placer_json *v = placer_json_parse(text, len, "JSON", st);
    assert_null(v);
    assert_status(st, DG_INVALID_ARGUMENT, needle);
    dg_status_free(&st);
}

static void json_bad_s(const char *text, const char *needle) { json_bad(text, strlen(text), needle); }

static void test_json_scalars(void **state) {
    (void)state;
    placer_json *v = json_ok(" null ");
    assert_int_equal(v->kind, PLACER_JSON_NULL);
    assert_int_equal(v->offset, 1);
    assert_int_equal(v->src_len, 4);
    placer_json_free(&v);
    assert_null(v);
    placer_json_free(&v);
    placer_json_free(NULL);

    v = json_ok("true");
    assert_int_equal(v->kind, PLACER_JSON_BOOL);
    assert_true(v->boolean);
    placer_json_free(&v);
    v = json_ok("false");
    assert_false(v->boolean);
    placer_json_free(&v);

    v = json_ok("-12");
    assert_int_equal(v->kind, PLACER_JSON_NUMBER);
    assert_true(v->is_int);
    assert_int_equal(v->integer, -12);
    assert_true(v->number == -12.0);
    placer_json_free(&v);

    v = json_ok("1.5e2");
    assert_false(v->is_int);
    assert_true(v->number == 150.0);
    placer_json_free(&v);

    v = json_ok("0");
    assert_true(v->is_int);
    assert_int_equal(v->integer, 0);
    placer_json_free(&v);

    v = json_ok("9223372036854775807");
    assert_true(v->is_int);
    assert_true(v->integer == INT64_MAX);
    placer_json_free(&v);
    v = json_ok("-9223372036854775808");
    assert_true(v->is_int);
    assert_true(v->integer == INT64_MIN);
    placer_json_free(&v);
    v = json_ok("9223372036854775808");   // valid JSON, but not an int64
    assert_false(v->is_int);
    placer_json_free(&v);
    v = json_ok("1E-400");   // underflow is fine
    placer_json_free(&v);
}

static void test_json_strings(void **state) {
    (void)state;
    placer_json *v = json_ok("\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"");
    assert_int_equal(v->kind, PLACER_JSON_STRING);
    assert_string_equal(v->str, "a\"b\\c/d\b\f\n\r\t");
    placer_json_free(&v);

    v = json_ok("\"\\u0041\\u00e9\\u20AC\\ud83d\\ude00\"");
    assert_string_equal(v->str, "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
    assert_int_equal(v->str_len, 1 + 2 + 3 + 4);
    assert_true(placer_json_is_cstring(v));
    placer_json_free(&v);

    v = json_ok("\"x\\u0000y\"");
    assert_int_equal(v->str_len, 3);
    assert_false(placer_json_is_cstring(v));
    placer_json_free(&v);

    v = json_ok("\"caf\xc3\xa9 \xf0\x9f\x98\x80\"");   // raw UTF-8 passes through
    assert_string_equal(v->str, "caf\xc3\xa9 \xf0\x9f\x98\x80");
    placer_json_free(&v);

    v = json_ok("\"\"");
    assert_string_equal(v->str, "");
    placer_json_free(&v);
}

static void test_json_containers(void **state) {
    (void)state;
    placer_json *v = json_ok("{\"a\": [1, 2, {\"b\": null}], \"c\": {}, \"d\": []}");
    assert_int_equal(v->kind, PLACER_JSON_OBJECT);
    assert_int_equal(v->n, 3);
    assert_string_equal(v->members[0].key, "a");
    const placer_json *a = placer_json_get(v, "a");
    assert_non_null(a);
    assert_int_equal(a->kind, PLACER_JSON_ARRAY);
    assert_int_equal(a->n, 3);
    assert_int_equal(a->items[1]->integer, 2);
    assert_int_equal(a->offset, 6);
    assert_int_equal(a->src_len, strlen("[1, 2, {\"b\": null}]"));
    assert_non_null(placer_json_get(a->items[2], "b"));
    assert_null(placer_json_get(a, "b"));
    assert_null(placer_json_get(v, "zz"));
    assert_int_equal(placer_json_get(v, "c")->kind, PLACER_JSON_OBJECT);
    assert_int_equal(placer_json_get(v, "c")->n, 0);
    assert_int_equal(placer_json_get(v, "d")->n, 0);
    placer_json_free(&v);

    assert_string_equal(placer_json_kind_name(PLACER_JSON_ARRAY), "array");
    assert_string_equal(placer_json_kind_name(PLACER_JSON_BOOL), "boolean");
}

static void test_json_depth(void **state) {
    (void)state;
    char buf[300];
    int depth = PLACER_JSON_MAX_DEPTH;
    for (int i = 0; i < depth; i++) buf[i] = '[';
    for (int i = 0; i < depth; i++) buf[depth + i] = ']';
    buf[2 * depth] = '\0';
    placer_json *v = json_ok(buf);
    placer_json_free(&v);

    depth = PLACER_JSON_MAX_DEPTH + 1;
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
    json_bad_s("1e999", "number 1e999 is out of range");
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
    json_bad_s("\"\\udc00\"", "lone low surrogate \\uDC00");
    json_bad_s("\"\\ud800\"", "high surrogate \\uD800 not followed by a low surrogate");
    json_bad_s("\"\\ud800\\u0041\"", "not followed by a low surrogate");
    json_bad_s("\"\xff\"", "offset 1: invalid UTF-8");
    json_bad_s("\"\xc0\xaf\"", "invalid UTF-8");          // overlong '/'
    json_bad_s("\"\xed\xa0\x80\"", "invalid UTF-8");      // encoded surrogate
    json_bad_s("\"\xf4\x90\x80\x80\"", "invalid UTF-8");  // above U+10FFFF
    json_bad_s("\"\xe2\x82\"", "invalid UTF-8");          // truncated
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
    assert_true(dg_cluster_add_task(c, "worker", 0, "localhost:1", st));
    assert_true(dg_cluster_add_task(c, "w_2-x", 0, "10.0.0.1:65535", st));
    assert_true(dg_cluster_add_task(c, "w", 0, "my-host.example.com:443", st));

    assert_false(dg_cluster_add_task(c, "worker", 0, "other:2", st));
    assert_status(st, DG_ALREADY_EXISTS, "job \"worker\" task 0 already exists (at \"localhost:1\")");
    assert_false(dg_cluster_add_task(c, "", 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "job name \"\" is invalid");
    assert_false(dg_cluster_add_task(c, "9ps", 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "job name \"9ps\" is invalid");
    assert_false(dg_cluster_add_task(c, "a b", 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "job name \"a b\" is invalid");
    assert_false(dg_cluster_add_task(c,
                                     "j123456789012345678901234567890123456789012345678901234567890123",
                                     0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "at most 63 bytes");
    assert_false(dg_cluster_add_task(c, "ps", -1, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "job \"ps\" task -1: index must be >= 0");
    assert_false(dg_cluster_add_task(c, NULL, 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "must not be NULL");
    assert_false(dg_cluster_add_task(c, "ps", 0, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "must not be NULL");

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
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_status_reset(st);
        assert_false(dg_cluster_add_task(c, "ps", 0, bad[i].addr, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
        assert_status(st, DG_INVALID_ARGUMENT, "cluster: job \"ps\" task 0: address");
    }
    // Nothing was added by the failures.
    assert_false(dg_cluster_has_job(c, "ps"));
    assert_int_equal(dg_cluster_total_tasks(c), 3);
    assert_false(dg_cluster_add_task(NULL, "ps", 0, "h:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL cluster");
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
    assert_string_equal(js, "{\"ps\": [\"h:1\", \"h:2\"], \"worker\": {\"0\": \"h:3\", \"2\": "
                            "\"h:4\"}, \"x\": []}");
    free(js);
    dg_cluster_free(&c);

    c = dg_cluster_from_json("{}", st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_num_jobs(c), 0);
    dg_cluster_free(&c);

    struct {
        const char *json, *needle;
        dg_code code;
    } bad[] = {
        {"[\"h:1\"]", "cluster JSON: must be an object of jobs, got [\"h:1\"]", DG_INVALID_ARGUMENT},
        {"{\"ps\": \"h:1\"}", "cluster JSON: job \"ps\" must be a list or an object of addresses, "
                              "got \"h:1\"", DG_INVALID_ARGUMENT},
        {"{\"ps\": null}", "job \"ps\" must be a list or an object", DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"h:1\", 7]}", "job \"ps\" task 1 must be a \"host:port\" string, got 7",
         DG_INVALID_ARGUMENT},
        {"{\"ps\": {\"0\": [1]}}", "job \"ps\" task 0 must be a \"host:port\" string, got [1]",
         DG_INVALID_ARGUMENT},
        {"{\"ps\": {\"x\": \"h:1\"}}", "job \"ps\": task index \"x\" is not a non-negative integer",
         DG_INVALID_ARGUMENT},
        {"{\"ps\": {\"-1\": \"h:1\"}}", "task index \"-1\"", DG_INVALID_ARGUMENT},
        {"{\"ps\": {\"01\": \"h:1\"}}", "task index \"01\"", DG_INVALID_ARGUMENT},
        {"{\"ps\": {\"99999999999\": \"h:1\"}}", "task index \"99999999999\"", DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"h\"]}", "cluster JSON: job \"ps\" task 0: address \"h\" has no \":port\"",
         DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"h:0\"]}", "port \"0\"", DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"h:1\\u0000x\"]}", "job \"ps\" task 0 must be a \"host:port\" string",
         DG_INVALID_ARGUMENT},
        {"{\"p s\": []}", "cluster JSON: job name \"p s\" is invalid", DG_INVALID_ARGUMENT},
        {"{\"a\\u0000b\": []}", "contains a NUL byte", DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"h:1\"], \"ps\": [\"h:2\"]}", "cluster JSON: offset 16: duplicate key \"ps\"",
         DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"h:1\"", "cluster JSON: offset 13: expected ',' or ']'", DG_INVALID_ARGUMENT},
        {"", "cluster JSON: offset 0: unexpected end of input", DG_INVALID_ARGUMENT},
        {"{\"ps\": [\"a-very-long-host-name-that-goes-on-and-on:1\", 3]}",
         "got 3", DG_INVALID_ARGUMENT},
        {"{\"ps\": {\"0\": \"h:1\", \"1\": {\"a-very-long-host-name-that-goes-on\": 12345}}}",
         "got {\"a-very-long-host-name-that-goes-on\"...", DG_INVALID_ARGUMENT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_status_reset(st);
        c = dg_cluster_from_json(bad[i].json, st);
        assert_null(c);
        assert_status(st, bad[i].code, bad[i].needle);
    }
    assert_null(dg_cluster_from_json(NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL string");
    dg_status_free(&st);
}

static void test_cluster_from_spec_string(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string("ps|h:1,h:2;worker|h:3", st);
    assert_ok(st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_num_jobs(c), 2);
    assert_int_equal(dg_cluster_num_tasks(c, "ps"), 2);
    assert_string_equal(dg_cluster_task_address(c, "ps", 1, st), "h:2");
    assert_string_equal(dg_cluster_task_address(c, "worker", 0, st), "h:3");
    dg_cluster_free(&c);

    c = dg_cluster_from_spec_string("local|localhost:2222", st);
    assert_non_null(c);
    assert_int_equal(dg_cluster_total_tasks(c), 1);
    dg_cluster_free(&c);

    struct {
        const char *spec, *needle;
    } bad[] = {
        {"ps|h:1;worker", "cluster spec \"ps|h:1;worker\": job \"worker\" has no \"|\""},
        {"", "cluster spec \"\": empty"},
        {"ps|h:1;", "cluster spec \"ps|h:1;\": empty job at offset 7"},
        {";ps|h:1", "empty job at offset 0"},
        {"ps|h:1;;worker|h:2", "empty job at offset 7"},
        {"ps|", "cluster spec \"ps|\": job \"ps\" has no tasks"},
        {"|h:1", "cluster spec \"|h:1\": job name \"\" is invalid"},
        {"p s|h:1", "job name \"p s\" is invalid"},
        {"ps|h:1;ps|h:2", "cluster spec \"ps|h:1;ps|h:2\": job \"ps\" appears twice"},
        {"ps|h:1,,h:2", "cluster spec \"ps|h:1,,h:2\": job \"ps\" task 1: empty address"},
        {"ps|h:1,", "job \"ps\" task 1: empty address"},
        {"ps|,h:1", "job \"ps\" task 0: empty address"},
        {"ps|h:1,h", "cluster spec \"ps|h:1,h\": job \"ps\" task 1: address \"h\" has no \":port\""},
        {"ps|h:1|h:2", "job \"ps\" task 0: address \"h:1|h:2\""},
        {"ps|h:70000", "port \"70000\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dg_status_reset(st);
        assert_null(dg_cluster_from_spec_string(bad[i].spec, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad[i].needle);
    }
    assert_null(dg_cluster_from_spec_string(NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "NULL string");
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

    assert_null(dg_cluster_from_flags("p0:1,,p1:1", "w:1", st));
    assert_status(st, DG_INVALID_ARGUMENT, "--ps_hosts \"p0:1,,p1:1\": job \"ps\" task 1: empty address");
    assert_null(dg_cluster_from_flags("p0:1", "w0:1,w1", st));
    assert_status(st, DG_INVALID_ARGUMENT,
                  "--worker_hosts \"w0:1,w1\": job \"worker\" task 1: address \"w1\" has no \":port\"");
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

static void test_tf_config_errors(void **state) {
    (void)state;
    struct {
        const char *json, *needle;
    } bad[] = {
        {"[]", "TF_CONFIG: must be a JSON object, got []"},
        {"{\"cluster\": ", "TF_CONFIG: offset 12: unexpected end of input"},
        {"{\"cluster\": [\"w:1\"]}", "TF_CONFIG: \"cluster\": must be an object of jobs, got [\"w:1\"]"},
        {"{\"cluster\": {\"worker\": [\"w\"]}}",
         "TF_CONFIG: \"cluster\": job \"worker\" task 0: address \"w\" has no \":port\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": []}", "TF_CONFIG: \"task\" must be an object, got []"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"index\": 0}}",
         "TF_CONFIG: \"task\" has no \"type\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\"}}",
         "TF_CONFIG: \"task\" has no \"index\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": \"abc\"}}",
         "TF_CONFIG: \"task.index\" must be an integer, got \"abc\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": \"0\"}}",
         "\"task.index\" must be an integer, got \"0\""},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 1.5}}",
         "\"task.index\" must be an integer, got 1.5"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0.0}}",
         "\"task.index\" must be an integer, got 0.0"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": null}}",
         "\"task.index\" must be an integer, got null"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": -1}}",
         "TF_CONFIG: \"task.index\" must be in 0..2147483647, got -1"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 3000000000}}",
         "\"task.index\" must be in 0..2147483647, got 3000000000"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": 1, \"index\": 0}}",
         "TF_CONFIG: \"task.type\" must be a string, got 1"},
        {"{\"cluster\": {\"worker\": [\"w:1\"]}, \"task\": {\"type\": \"\", \"index\": 0}}",
         "TF_CONFIG: \"task.type\" is empty"},
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
        {"{\"cluster\": {\"evaluator\": [\"e:1\", \"e:2\"]}}",
         "job \"evaluator\" has 2 tasks, at most 1 is allowed"},
        {"{\"rpc_layer\": 5}", "TF_CONFIG: \"rpc_layer\" must be a string, got 5"},
        {"{\"rpc_layer\": \"grpc+verbs+something+very+long+indeed\"}",
         "TF_CONFIG: \"rpc_layer\" \"grpc+verbs+something+very+long+indeed\" is longer than 31 bytes"},
        {"{\"task\": {\"type\": \"worker\", \"index\": 0}, \"task\": {}}",
         "TF_CONFIG: offset 41: duplicate key \"task\""},
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
        placer_json *v = placer_json_parse(exact, n, "JSON", st);
        if (v) {
            n_json_ok++;
            assert_true(v->offset + v->src_len <= n);
        } else {
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        }
        placer_json_free(&v);
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

        dg_status_reset(st);
        c = dg_cluster_from_spec_string(s, st);
        if (c) {
            n_spec_ok++;
            assert_true(dg_cluster_total_tasks(c) > 0);
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
        cmocka_unit_test(test_cluster_accessors),
        cmocka_unit_test(test_cluster_add_errors),
        cmocka_unit_test(test_cluster_copy_and_json_roundtrip),
        cmocka_unit_test(test_cluster_from_json),
        cmocka_unit_test(test_cluster_from_spec_string),
        cmocka_unit_test(test_cluster_from_flags),
        cmocka_unit_test(test_tf_config_valid),
        cmocka_unit_test(test_tf_config_errors),
        cmocka_unit_test(test_tf_config_from_env),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
