/* Tests for graph/device_name.c, after TensorFlow's device_name_utils_test.cc,
 * device_spec_test.py and device_util_test.py. test_tf_device_conformance.c checks the same
 * functions against tables of TensorFlow's answers; these tests pin the API around them
 * (messages, buffers, out untouched on failure, NULL arguments). */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dg_device_name parse_ok(const char *s) {
    dg_status *st = dg_status_new();
    dg_device_name n;
    memset(&n, 0x5a, sizeof n);
    bool ok = dg_device_name_parse(s, &n, st);
    assert_ok(st);
    assert_true(ok);
    dg_status_free(&st);
    return n;
}

static void expect_canon(const char *in, const char *want) {
    dg_status *st = dg_status_new();
    char buf[DG_DEVICE_NAME_MAX];
    bool ok = dg_device_name_canonicalize(in, buf, sizeof buf, st);
    assert_ok(st);
    assert_true(ok);
    assert_string_equal(buf, want);
    dg_status_free(&st);
}

static void expect_bad(const char *in, const char *needle) {
    dg_status *st = dg_status_new();
    dg_device_name n;
    memset(&n, 0, sizeof n);
    n.has_job = true;
    strcpy(n.job, "untouched");
    assert_false(dg_device_name_parse(in, &n, st));
    assert_status(st, DG_INVALID_ARGUMENT, needle);
    // The whole string is quoted.
    char quoted[512];
    snprintf(quoted, sizeof quoted, "device \"%s\"", in);
    assert_status(st, DG_INVALID_ARGUMENT, quoted);
    // out is not written on failure.
    assert_true(n.has_job);
    assert_string_equal(n.job, "untouched");
    dg_status_free(&st);
}

static void test_parse_full(void **state) {
    (void)state;
    dg_device_name n = parse_ok("/job:worker/replica:1/task:2/device:GPU:3");
    assert_true(n.has_job && n.has_replica && n.has_task && n.has_type && n.has_id);
    assert_string_equal(n.job, "worker");
    assert_int_equal(n.replica, 1);
    assert_int_equal(n.task, 2);
    assert_string_equal(n.type, "GPU");
    assert_int_equal(n.id, 3);
    assert_true(dg_device_name_is_complete(&n));
}

static void test_parse_empty(void **state) {
    (void)state;
    dg_device_name n = parse_ok("");
    assert_false(n.has_job || n.has_replica || n.has_task || n.has_type || n.has_id);
    n = parse_ok("/");
    assert_false(n.has_job || n.has_replica || n.has_task || n.has_type || n.has_id);
    n = parse_ok(NULL);
    assert_false(n.has_job || n.has_type);
    assert_false(dg_device_name_is_complete(&n));
    expect_canon("", "");
    expect_canon("/", "");
}

static void test_parse_partial(void **state) {
    (void)state;
    dg_device_name n = parse_ok("/job:ps");
    assert_true(n.has_job);
    assert_false(n.has_replica || n.has_task || n.has_type || n.has_id);
    assert_string_equal(n.job, "ps");

    n = parse_ok("/task:7");
    assert_true(n.has_task);
    assert_int_equal(n.task, 7);
    assert_false(n.has_job);

    n = parse_ok("/device:CPU:0");
    assert_true(n.has_type && n.has_id);
    assert_string_equal(n.type, "CPU");
    assert_int_equal(n.id, 0);

    n = parse_ok("/device:GPU");
    assert_true(n.has_type);
    assert_false(n.has_id);

    // '-' in job names: distgraph's extension (docs/TF_COMPAT.md), as its cluster specs allow it.
    n = parse_ok("/job:a_b-1/replica:0");
    assert_string_equal(n.job, "a_b-1");
    assert_true(n.has_replica);
    assert_int_equal(n.replica, 0);
}

static void test_parse_wildcards(void **state) {
    (void)state;
    dg_device_name n = parse_ok("/job:*/replica:*/task:*/device:*:*");
    assert_false(n.has_job || n.has_replica || n.has_task || n.has_type || n.has_id);

    n = parse_ok("/job:worker/device:GPU:*");
    assert_true(n.has_type);
    assert_false(n.has_id);
    assert_string_equal(n.type, "GPU");

    n = parse_ok("/device:*:2");
    assert_false(n.has_type);
    assert_true(n.has_id);
    assert_int_equal(n.id, 2);

    n = parse_ok("/gpu:*");
    assert_true(n.has_type);
    assert_false(n.has_id);
    assert_string_equal(n.type, "GPU");
}

static void test_parse_case_and_legacy(void **state) {
    (void)state;
    // Types keep their case: "gpu" is not "GPU" (TensorFlow's ParseFullName).
    dg_device_name n = parse_ok("/device:cpu:1");
    assert_string_equal(n.type, "cpu");
    n = parse_ok("/device:tpu_v2:1");
    assert_string_equal(n.type, "tpu_v2");
    // The legacy forms name CPU and GPU, in exactly two spellings each.
    n = parse_ok("/job:w/cpu:0");
    assert_true(n.has_type && n.has_id);
    assert_string_equal(n.type, "CPU");
    assert_int_equal(n.id, 0);
    n = parse_ok("/GPU:1");
    assert_string_equal(n.type, "GPU");
    assert_int_equal(n.id, 1);
    n = parse_ok("/CPU:*");
    assert_string_equal(n.type, "CPU");
    assert_false(n.has_id);
    expect_bad("/gPu:4", "unknown field \"gPu:4\"");
    expect_bad("/Cpu:0", "unknown field \"Cpu:0\"");
    expect_bad("/tpu:0", "unknown field \"tpu:0\"");

    expect_canon("/job:w/replica:0/task:1/gpu:2", "/job:w/replica:0/task:1/device:GPU:2");
    expect_canon("/cpu:0", "/device:CPU:0");
    expect_canon("/device:gpu:3", "/device:gpu:3");

    // Matching compares types exactly.
    dg_device_name gpu = parse_ok("/job:w/replica:0/task:0/device:GPU:0");
    n = parse_ok("/device:gpu:0");
    assert_false(dg_device_name_matches(&n, &gpu));
    n = parse_ok("/gpu:0");
    assert_true(dg_device_name_matches(&n, &gpu));
}

static void test_parse_order_and_repeat(void **state) {
    (void)state;
    // TensorFlow accepts fields in any order; a repeated field overrides.
    expect_canon("/device:GPU:0/task:1/job:w", "/job:w/task:1/device:GPU:0");
    expect_canon("/job:a/job:b", "/job:b");
    expect_canon("/device:GPU:0/cpu:1", "/device:CPU:1");
    expect_canon("/cpu:0/gpu:1", "/device:GPU:1");
    expect_canon("/task:01", "/task:1");
    expect_canon("/job:a/job:*", "");
}

static void test_canonical_strings(void **state) {
    (void)state;
    expect_canon("/job:worker/replica:0/task:1/device:GPU:0",
                 "/job:worker/replica:0/task:1/device:GPU:0");
    expect_canon("/job:ps", "/job:ps");
    expect_canon("/job:ps/device:CPU", "/job:ps/device:CPU:*");
    // An id without a type does not print (TensorFlow's ParsedNameToString).
    expect_canon("/device:*:3", "");
    expect_canon("/job:w/device:*:3", "/job:w");
    expect_canon("/job:*/task:2", "/task:2");
    expect_canon("/replica:2147483647", "/replica:2147483647");

    dg_device_name n;
    memset(&n, 0, sizeof n);
    char buf[DG_DEVICE_NAME_MAX];
    assert_ptr_equal(dg_device_name_str(&n, buf, sizeof buf), buf);
    assert_string_equal(buf, "");
    n = parse_ok("/job:localhost/replica:0/task:0/device:CPU:0");
    assert_ptr_equal(dg_device_name_str(&n, buf, sizeof buf), buf);
    assert_string_equal(buf, "/job:localhost/replica:0/task:0/device:CPU:0");
}

static void test_str_buffer_too_small(void **state) {
    (void)state;
    dg_device_name n = parse_ok("/job:worker/task:1");
    char buf[8];
    memset(buf, 'x', sizeof buf);
    assert_null(dg_device_name_str(&n, buf, sizeof buf));
    assert_string_equal(buf, "");
    assert_null(dg_device_name_str(&n, buf, 0));
    char exact[19];   // "/job:worker/task:1" is 18 bytes
    assert_non_null(dg_device_name_str(&n, exact, sizeof exact));
    assert_string_equal(exact, "/job:worker/task:1");
    assert_null(dg_device_name_str(&n, exact, 18));

    dg_status *st = dg_status_new();
    assert_false(dg_device_name_canonicalize("/job:worker/task:1", buf, sizeof buf, st));
    assert_status(st, DG_INVALID_ARGUMENT, "needs 19 bytes, buffer has 8");
    dg_status_free(&st);

    // The longest possible canonical name fits DG_DEVICE_NAME_MAX.
    char longest[256];
    snprintf(longest, sizeof longest,
             "/job:%.*s/replica:2147483647/task:2147483647/device:%.*s:2147483647",
             DG_DEVICE_JOB_MAX - 1,
             "jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj",
             DG_DEVICE_TYPE_MAX - 1, "TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT");
    char out[DG_DEVICE_NAME_MAX];
    st = dg_status_new();
    assert_true(dg_device_name_canonicalize(longest, out, sizeof out, st));
    assert_ok(st);
    assert_string_equal(out, longest);
    dg_status_free(&st);
}

static void test_parse_errors(void **state) {
    (void)state;
    expect_bad("/job:ps/task:x", "bad task index \"x\"");
    expect_bad("/job:ps/task:", "bad task index \"\"");
    expect_bad("/job:ps/task:-1", "bad task index \"-1\"");
    expect_bad("/task:1a", "bad task index \"1a\"");
    expect_bad("/task: 1", "bad task index \" 1\"");
    expect_bad("/replica:q", "bad replica index \"q\"");
    expect_bad("/job:123/replica:1/task:2/gpu:0", "bad job name \"123\"");
    expect_bad("/job:", "bad job name \"\"");
    expect_bad("/job:a b", "bad job name \"a b\"");
    expect_bad("/job:w:1", "bad job name \"w:1\"");
    expect_bad("/job:w\xc3\xb6", "bad job name");
    expect_bad("/device:GPU:x", "bad device id \"x\"");
    expect_bad("/device:GPU:0:1", "bad device \"GPU:0:1\"");
    expect_bad("/device:CPU:", "bad device id \"\"");
    expect_bad("/device:", "bad device type \"\"");
    expect_bad("/device:1GPU:0", "bad device type \"1GPU\"");
    expect_bad("/device:G-PU:0", "bad device type \"G-PU\"");
    expect_bad("/gpu:a", "bad device id \"a\"");
    expect_bad("/cpu:", "bad device id \"\"");
    expect_bad("/cpu:0:1", "bad device id \"0:1\"");
    expect_bad("/foo:1", "unknown field \"foo:1\"");
    expect_bad("/Job:w", "unknown field \"Job:w\"");
    expect_bad("/job:w/device", "unknown field \"device\"");
    expect_bad("/GPU", "unknown field \"GPU\"");
    expect_bad("job:w", "must start with '/'");
    expect_bad("CPU:0", "must start with '/'");
    expect_bad("/job:w/", "empty field at offset 7");
    expect_bad("//job:w", "empty field at offset 1");
    expect_bad("/job:w//task:1", "empty field");
    expect_bad("/job:*x", "bad job name \"*x\"");
    // Indices above INT_MAX: TensorFlow wraps them around, distgraph refuses them.
    expect_bad("/task:2147483648", "task index 2147483648 is out of range (at most 2147483647)");
    expect_bad("/replica:99999999999999999999999", "replica index 99999999999999999999999 is out of range");
    expect_bad("/device:CPU:4294967297", "device id 4294967297 is out of range");
    expect_canon("/task:2147483647", "/task:2147483647");
    expect_canon("/task:00000000000000000000000000000000000007", "/task:7");
}

static void test_parse_too_long(void **state) {
    (void)state;
    char s[256];
    char job[DG_DEVICE_JOB_MAX + 1];
    memset(job, 'j', sizeof job - 1);
    job[sizeof job - 1] = '\0';   // 64 chars: one too many
    snprintf(s, sizeof s, "/job:%s/task:0", job);
    expect_bad(s, "is longer than 63 bytes");
    job[DG_DEVICE_JOB_MAX - 1] = '\0';   // 63 chars: fits
    snprintf(s, sizeof s, "/job:%s", job);
    dg_device_name n = parse_ok(s);
    assert_int_equal(strlen(n.job), DG_DEVICE_JOB_MAX - 1);

    char type[DG_DEVICE_TYPE_MAX + 1];
    memset(type, 'T', sizeof type - 1);
    type[sizeof type - 1] = '\0';
    snprintf(s, sizeof s, "/device:%s:0", type);
    expect_bad(s, "device type");
    type[DG_DEVICE_TYPE_MAX - 1] = '\0';
    snprintf(s, sizeof s, "/device:%s:0", type);
    n = parse_ok(s);
    assert_int_equal(strlen(n.type), DG_DEVICE_TYPE_MAX - 1);
}

static void test_merge(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char buf[DG_DEVICE_NAME_MAX];

    // Unset fields of target are filled from other.
    dg_device_name t = parse_ok("/job:foo/replica:1");
    dg_device_name o = parse_ok("/task:2/device:GPU:3");
    assert_true(dg_device_name_merge(&t, &o, false, st));
    assert_ok(st);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf),
                        "/job:foo/replica:1/task:2/device:GPU:3");

    // Equal fields are fine.
    t = parse_ok("/job:foo/device:GPU:0");
    o = parse_ok("/job:foo/replica:0/device:GPU:0");
    assert_true(dg_device_name_merge(&t, &o, false, st));
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf),
                        "/job:foo/replica:0/device:GPU:0");

    // Set fields of target survive when other's are unset.
    t = parse_ok("/job:foo/task:1/device:CPU:0");
    o = parse_ok("");
    assert_true(dg_device_name_merge(&t, &o, false, st));
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/job:foo/task:1/device:CPU:0");

    // Conflicts in job, replica and task are errors even with soft placement; target is
    // left unchanged.
    const char *cases[][3] = {
        {"/job:foo", "/job:bar", "incompatible jobs"},
        {"/replica:0/task:1", "/task:1/replica:1", "incompatible replicas"},
        {"/job:a/task:0", "/job:a/task:1", "incompatible tasks"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        for (int soft = 0; soft < 2; soft++) {
            t = parse_ok(cases[i][0]);
            dg_device_name before = t;
            o = parse_ok(cases[i][1]);
            dg_status_reset(st);
            assert_false(dg_device_name_merge(&t, &o, soft != 0, st));
            assert_status(st, DG_INVALID_ARGUMENT, cases[i][2]);
            assert_memory_equal(&t, &before, sizeof t);
        }
    }
    t = parse_ok("/job:foo/task:0/device:GPU:0");
    o = parse_ok("/job:bar/task:0");
    dg_status_reset(st);
    assert_false(dg_device_name_merge(&t, &o, false, st));
    assert_status(st, DG_INVALID_ARGUMENT,
                  "Cannot merge devices with incompatible jobs: '/job:foo/task:0/device:GPU:0' and "
                  "'/job:bar/task:0'");
    // A partly compatible merge that fails later does not modify target either.
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/job:foo/task:0/device:GPU:0");
    t = parse_ok("/device:GPU:0");
    o = parse_ok("/job:w/device:GPU:1");
    dg_status_reset(st);
    assert_false(dg_device_name_merge(&t, &o, false, st));
    assert_status(st, DG_INVALID_ARGUMENT, "incompatible ids");
    assert_false(t.has_job);

    // Type conflicts: error without soft placement, cleared type and id with it.
    t = parse_ok("/job:foo/device:GPU:0");
    o = parse_ok("/device:CPU:0");
    dg_status_reset(st);
    assert_false(dg_device_name_merge(&t, &o, false, st));
    assert_status(st, DG_INVALID_ARGUMENT, "incompatible types");
    dg_status_reset(st);
    assert_true(dg_device_name_merge(&t, &o, true, st));
    assert_ok(st);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/job:foo");

    // Id conflicts: error without soft placement, cleared id with it.
    t = parse_ok("/job:foo/device:GPU:0");
    o = parse_ok("/device:GPU:1");
    dg_status_reset(st);
    assert_false(dg_device_name_merge(&t, &o, false, st));
    assert_status(st, DG_INVALID_ARGUMENT, "incompatible ids");
    assert_true(dg_device_name_merge(&t, &o, true, st));
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/job:foo/device:GPU:*");

    dg_status_free(&st);
}

static void test_merge_override(void **state) {
    (void)state;
    char buf[DG_DEVICE_NAME_MAX];
    // DeviceSpec.make_merged_spec: fields set in `over` win.
    dg_device_name t = parse_ok("/job:worker/replica:0/task:1/device:GPU:0");
    dg_device_name o = parse_ok("/job:ps/device:CPU:*");
    dg_device_name_merge_override(&t, &o);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf),
                        "/job:ps/replica:0/task:1/device:CPU:0");

    t = parse_ok("/job:worker");
    o = parse_ok("/task:3/device:GPU:2");
    dg_device_name_merge_override(&t, &o);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/job:worker/task:3/device:GPU:2");

    t = parse_ok("/job:worker/task:3");
    o = parse_ok("");
    dg_device_name_merge_override(&t, &o);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/job:worker/task:3");

    t = parse_ok("/device:GPU");
    o = parse_ok("/replica:4/device:*:1");
    dg_device_name_merge_override(&t, &o);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/replica:4/device:GPU:1");
}

static void test_matches(void **state) {
    (void)state;
    dg_device_name dev = parse_ok("/job:work/replica:1/task:3/device:GPU:2");
    const char *yes[] = {"", "/job:work", "/job:work/replica:1", "/job:work/replica:1/task:3",
                         "/job:work/replica:1/task:3/device:GPU:2", "/device:GPU:*",
                         "/device:*:2", "/job:*/replica:*/task:*/device:*:*", "/gpu:2",
                         "/task:3"};
    const char *no[] = {"/job:worker", "/replica:0", "/task:2", "/device:CPU:*",
                        "/device:GPU:1", "/job:work/replica:1/task:3/device:GPU:3",
                        "/job:work/replica:1/task:3/device:CPU:2"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++) {
        dg_device_name spec = parse_ok(yes[i]);
        assert_true(dg_device_name_matches(&spec, &dev));
    }
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++) {
        dg_device_name spec = parse_ok(no[i]);
        assert_false(dg_device_name_matches(&spec, &dev));
    }
    // A spec field the device lacks does not match.
    dg_device_name partial = parse_ok("/job:work");
    dg_device_name spec = parse_ok("/job:work/task:0");
    assert_false(dg_device_name_matches(&spec, &partial));
    assert_true(dg_device_name_matches(&partial, &dev));
}

static void test_compatible(void **state) {
    (void)state;
    struct {
        const char *a, *b;
        bool ok;
    } cases[] = {
        {"", "/job:w/task:1/device:GPU:0", true},
        {"/job:w", "/task:1", true},
        {"/job:w/device:GPU:*", "/job:w/device:GPU:3", true},
        {"/job:w", "/job:ps", false},
        {"/replica:0", "/replica:1", false},
        {"/task:0", "/task:1", false},
        {"/device:GPU:0", "/device:CPU:0", false},
        {"/device:GPU:0", "/device:GPU:1", false},
        {"/device:*:0", "/device:CPU:0", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dg_device_name a = parse_ok(cases[i].a), b = parse_ok(cases[i].b);
        assert_int_equal(dg_device_name_compatible(&a, &b), cases[i].ok);
        assert_int_equal(dg_device_name_compatible(&b, &a), cases[i].ok);
    }
}

static void test_is_complete(void **state) {
    (void)state;
    dg_device_name n = parse_ok("/job:w/replica:0/task:0/device:CPU:0");
    assert_true(dg_device_name_is_complete(&n));
    const char *partial[] = {"/replica:0/task:0/device:CPU:0", "/job:w/task:0/device:CPU:0",
                             "/job:w/replica:0/device:CPU:0", "/job:w/replica:0/task:0/device:CPU",
                             "/job:w/replica:0/task:0/device:*:0"};
    for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++) {
        n = parse_ok(partial[i]);
        assert_false(dg_device_name_is_complete(&n));
    }
}

static void test_same_task(void **state) {
    (void)state;
    dg_device_name a = parse_ok("/job:w/replica:0/task:1/device:CPU:0");
    dg_device_name b = parse_ok("/job:w/replica:0/task:1/device:GPU:3");
    assert_true(dg_device_name_same_task(&a, &b));
    b = parse_ok("/job:w/replica:0/task:2/device:CPU:0");
    assert_false(dg_device_name_same_task(&a, &b));
    b = parse_ok("/job:w/replica:1/task:1/device:CPU:0");
    assert_false(dg_device_name_same_task(&a, &b));
    b = parse_ok("/job:v/replica:0/task:1/device:CPU:0");
    assert_false(dg_device_name_same_task(&a, &b));
    // Unset fields never count as equal.
    b = parse_ok("/job:w/task:1");
    assert_false(dg_device_name_same_task(&a, &b));
    a = parse_ok("/job:w/task:1");
    assert_false(dg_device_name_same_task(&a, &b));
}


static void test_parse_local(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_device_name n;
    assert_true(dg_device_name_parse_local("GPU:1", &n, st));
    assert_ok(st);
    assert_true(n.has_type && n.has_id);
    assert_false(n.has_job || n.has_replica || n.has_task);
    assert_string_equal(n.type, "GPU");
    assert_int_equal(n.id, 1);
    assert_true(dg_device_name_parse_local("cpu:007", &n, st));
    assert_string_equal(n.type, "cpu");
    assert_int_equal(n.id, 7);
    const char *bad_local[][2] = {
        {"CPU:*", "bad device id \"*\""},   {"CPU", "a local name is <type>:<id>"},
        {"CPU:", "bad device id \"\""},     {"CPU:0/", "unexpected \"/\" after the device id"},
        {"CPU:0:1", "after the device id"}, {"/device:CPU:0", "bad device type \"\""},
        {"1CPU:0", "bad device type"},      {"", "bad device type \"\""},
        {"CPU:2147483648", "out of range"},
    };
    for (size_t i = 0; i < sizeof bad_local / sizeof bad_local[0]; i++) {
        memset(&n, 0, sizeof n);
        assert_false(dg_device_name_parse_local(bad_local[i][0], &n, st));
        assert_status(st, DG_INVALID_ARGUMENT, bad_local[i][1]);
        assert_false(n.has_type);   // out untouched
    }
    // Full or local: a full name first, else a local one; the error is the intended grammar's.
    assert_true(dg_device_name_parse_full_or_local("CPU:0", &n, st));
    assert_true(n.has_type && n.has_id && !n.has_job);
    assert_true(dg_device_name_parse_full_or_local("/job:w/cpu:1", &n, st));
    assert_true(n.has_job && n.id == 1);
    assert_true(dg_device_name_parse_full_or_local("", &n, st));
    assert_true(dg_device_name_parse_full_or_local(NULL, NULL, st));
    assert_false(dg_device_name_parse_full_or_local("CPU:x", &n, st));
    assert_status(st, DG_INVALID_ARGUMENT, "device \"CPU:x\": bad device id \"x\"");
    assert_false(dg_device_name_parse_full_or_local("/bogus:1", &n, st));
    assert_status(st, DG_INVALID_ARGUMENT, "unknown field \"bogus:1\"");
    dg_status_free(&st);
}

static void test_split(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char task[DG_DEVICE_NAME_MAX], local[DG_DEVICE_NAME_MAX];
    assert_true(dg_device_name_split("/job:w/replica:0/task:1/device:GPU:2", task, sizeof task,
                                     local, sizeof local, st));
    assert_ok(st);
    assert_string_equal(task, "/job:w/replica:0/task:1");
    assert_string_equal(local, "GPU:2");
    assert_true(dg_device_name_split("/cpu:3", task, sizeof task, local, sizeof local, st));
    assert_string_equal(task, "");
    assert_string_equal(local, "CPU:3");
    assert_true(dg_device_name_split("/task:4/device:xla_cpu:0", task, sizeof task, local,
                                     sizeof local, st));
    assert_string_equal(task, "/task:4");
    assert_string_equal(local, "xla_cpu:0");
    assert_false(dg_device_name_split("/job:w/device:GPU:*", task, sizeof task, local, sizeof local, st));
    assert_status(st, DG_INVALID_ARGUMENT, "names no single device");
    assert_false(dg_device_name_split("/job:w", task, sizeof task, local, sizeof local, st));
    assert_status(st, DG_INVALID_ARGUMENT, "names no single device");
    assert_false(dg_device_name_split("GPU:0", task, sizeof task, local, sizeof local, st));
    assert_status(st, DG_INVALID_ARGUMENT, "must start with '/'");
    char tiny[4];
    assert_false(dg_device_name_split("/job:w/gpu:0", tiny, sizeof tiny, local, sizeof local, st));
    assert_status(st, DG_INVALID_ARGUMENT, "does not fit");
    assert_false(dg_device_name_split("/job:w/gpu:10", task, sizeof task, tiny, sizeof tiny, st));
    assert_status(st, DG_INVALID_ARGUMENT, "does not fit");
    dg_status_free(&st);
}

static void test_lookup_names(void **state) {
    (void)state;
    char names[DG_DEVICE_LOOKUP_NAMES][DG_DEVICE_NAME_MAX];
    dg_device_name n = parse_ok("/job:worker/replica:1/task:2/device:XLA_GPU:3");
    assert_int_equal(dg_device_name_lookup_names(&n, names, DG_DEVICE_LOOKUP_NAMES), 4);
    assert_string_equal(names[0], "/job:worker/replica:1/task:2/device:XLA_GPU:3");
    assert_string_equal(names[1], "/job:worker/replica:1/task:2/xla_gpu:3");
    assert_string_equal(names[2], "/device:XLA_GPU:3");
    assert_string_equal(names[3], "XLA_GPU:3");
    // Fewer slots: the count stays, only cap names are written.
    char two[2][DG_DEVICE_NAME_MAX];
    assert_int_equal(dg_device_name_lookup_names(&n, two, 2), 4);
    assert_string_equal(two[1], "/job:worker/replica:1/task:2/xla_gpu:3");
    assert_int_equal(dg_device_name_lookup_names(&n, NULL, 0), 4);
    // Type and id only: the local names.
    n = parse_ok("/task:1/device:CPU:0");
    assert_int_equal(dg_device_name_lookup_names(&n, names, DG_DEVICE_LOOKUP_NAMES), 2);
    assert_string_equal(names[0], "/device:CPU:0");
    assert_string_equal(names[1], "CPU:0");
    n = parse_ok("/job:w/replica:0/task:0/device:CPU:*");
    assert_int_equal(dg_device_name_lookup_names(&n, names, DG_DEVICE_LOOKUP_NAMES), 0);
}

static dg_device_name spec_ok(const char *s) {
    dg_status *st = dg_status_new();
    dg_device_name n;
    memset(&n, 0x5a, sizeof n);
    bool ok = dg_device_spec_from_string(s, &n, st);
    assert_ok(st);
    assert_true(ok);
    dg_status_free(&st);
    return n;
}

static void expect_spec(const char *in, const char *want) {
    dg_status *st = dg_status_new();
    char buf[DG_DEVICE_NAME_MAX];
    bool ok = dg_device_spec_canonical_name(in, buf, sizeof buf, st);
    if (!ok) fail_msg("DeviceSpec \"%s\": %s", in, dg_status_message(st));
    assert_string_equal(buf, want);
    dg_status_free(&st);
}

static void expect_spec_bad(const char *in, const char *needle) {
    dg_status *st = dg_status_new();
    dg_device_name n;
    memset(&n, 0, sizeof n);
    assert_false(dg_device_spec_from_string(in, &n, st));
    assert_status(st, DG_INVALID_ARGUMENT, needle);
    char quoted[512];
    snprintf(quoted, sizeof quoted, "device \"%s\"", in);
    assert_status(st, DG_INVALID_ARGUMENT, quoted);
    assert_false(n.has_job || n.has_type);   // out untouched
    dg_status_free(&st);
}

// DeviceSpec.from_string: the cases of device_spec_test.py and the corners of its grammar.
static void test_spec_from_string(void **state) {
    (void)state;
    dg_device_name n = spec_ok("/job:foo/replica:0/task:3/device:CPU:0");
    assert_true(dg_device_name_is_complete(&n));
    assert_string_equal(n.job, "foo");
    assert_int_equal(n.task, 3);
    n = spec_ok("/job:foo/device:GPU:*");
    assert_true(n.has_type && !n.has_id);
    n = spec_ok(NULL);
    assert_false(n.has_job || n.has_replica || n.has_task || n.has_type || n.has_id);
    // Short and local forms, any case; exactly "cpu"/"gpu" of the long form become upper case.
    expect_spec("CPU:0", "/device:CPU:0");
    expect_spec("/Gpu:1", "/device:GPU:1");
    expect_spec("/tpu", "/device:TPU:*");
    expect_spec("/cu\xc5\xbftom:2", "/device:CUSTOM:2");   // U+017F upper-cases to 'S'
    expect_spec("/device:gpu:0", "/device:GPU:0");
    expect_spec("/device:Gpu:0", "/device:Gpu:0");
    expect_spec("/device:tpu:0", "/device:tpu:0");
    // Text fields are anything without '/' or ':'; empty fields are skipped.
    expect_spec("/job:my job", "/job:my job");
    expect_spec("/job:", "/job:");
    expect_spec("/job:*", "/job:*");
    expect_spec("/device:*:*", "/device:*:*");
    expect_spec("//job:a//task:1/", "/job:a/task:1");
    expect_spec("job:a/:x:y", "/job:a");
    expect_spec("/job:a/job:b/task:1/task:2", "/job:b/task:2");
    // Indices as Python's int() reads them.
    expect_spec("/task: 3\t", "/task:3");
    expect_spec("/task:+3", "/task:3");
    expect_spec("/task:-3", "/task:-3");
    expect_spec("/task:1_000", "/task:1000");
    expect_spec("/task:\xd9\xa3", "/task:3");         // ARABIC-INDIC DIGIT THREE
    expect_spec("/task:\xef\xbc\x97", "/task:7");     // FULLWIDTH DIGIT SEVEN
    expect_spec("/task:\xe3\x80\x80" "5", "/task:5"); // IDEOGRAPHIC SPACE
    expect_spec("/task:-2147483648", "/task:-2147483648");
    n = spec_ok("/replica:-1/device:CPU:-2");
    assert_int_equal(n.replica, -1);
    assert_int_equal(n.id, -2);

    expect_spec_bad("/job:a:b", "unknown attribute \"job\"");
    expect_spec_bad("/device:CPU", "unknown attribute \"device\"");
    expect_spec_bad("/bogus:1", "unknown attribute \"bogus\"");
    expect_spec_bad(" /cpu:0", "unknown attribute \" \"");
    expect_spec_bad("/cpu:0/gpu:0", "multiple device types are not allowed");
    expect_spec_bad("/device:CPU:0/cpu:1", "multiple device types are not allowed");
    expect_spec_bad("/replica:*", "replica \"*\" is not an integer");
    expect_spec_bad("/task:", "task \"\" is not an integer");
    expect_spec_bad("/task:1__0", "is not an integer");
    expect_spec_bad("/task:_1", "is not an integer");
    expect_spec_bad("/task:1_", "is not an integer");
    expect_spec_bad("/task:- 1", "is not an integer");
    expect_spec_bad("/task:0x1", "is not an integer");
    expect_spec_bad("/cpu:", "device index \"\" is not an integer");
    expect_spec_bad("/device:CPU:0:1", "unknown attribute \"device\"");
    expect_spec_bad("/task:\xff", "is not an integer");   // not UTF-8
    // distgraph's limits (docs/TF_COMPAT.md): ints, 63-byte jobs, 31-byte types.
    expect_spec_bad("/task:2147483648", "task \"2147483648\" is out of range for an int");
    expect_spec_bad("/task:-2147483649", "is out of range for an int");
    expect_spec_bad("/device:CPU:99999999999999999999", "is out of range for an int");
    expect_spec_bad("/job:jjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjjj",
                    "is longer than 63 bytes");
    expect_spec_bad("/device:TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT:0", "is longer than 31 bytes");
    // Python limits int() to 4300 digits.
    char big[4400];
    memcpy(big, "/task:", 6);
    memset(big + 6, '0', 4300);
    big[4306] = '\0';
    expect_spec(big, "/task:0");
    big[4306] = '0';
    big[4307] = '\0';
    expect_spec_bad(big, "has more than 4300 digits");

    dg_status *st = dg_status_new();
    char small[8];
    assert_false(dg_device_spec_canonical_name("/job:worker", small, sizeof small, st));
    assert_status(st, DG_INVALID_ARGUMENT, "needs 12 bytes, buffer has 8");
    dg_status_free(&st);
}

// device_util.canonicalize, graph mode (device_util_test.py).
static void test_spec_canonicalize(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char buf[DG_DEVICE_NAME_MAX];
    const char *cases[][3] = {
        {"/cpu:0", NULL, "/replica:0/task:0/device:CPU:0"},
        {"/job:worker/task:1/gpu:2", NULL, "/job:worker/replica:0/task:1/device:GPU:2"},
        {"", NULL, "/replica:0/task:0/device:CPU:0"},
        {"/gpu:0", "", "/replica:0/task:0/device:GPU:0"},
        {"/cpu:0", "/job:worker/task:1", "/job:worker/replica:0/task:1/device:CPU:0"},
        {"/cpu:0", "/job:worker", "/job:worker/replica:0/task:0/device:CPU:0"},
        {"/job:ps/device:GPU:*", "/job:w/replica:2/task:3/device:GPU:1",
         "/job:ps/replica:2/task:3/device:GPU:1"},
        {"/device:*:0", "/device:tpu:5", "/replica:0/task:0/device:*:0"},
        {"CPU:3", "/device:Gpu:1", "/replica:0/task:0/device:CPU:3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool ok = dg_device_spec_canonicalize(cases[i][0], cases[i][1], buf, sizeof buf, st);
        if (!ok) fail_msg("canonicalize(%s, %s): %s", cases[i][0], cases[i][1], dg_status_message(st));
        assert_string_equal(buf, cases[i][2]);
    }
    assert_true(dg_device_spec_canonicalize(NULL, NULL, buf, sizeof buf, st));
    assert_string_equal(buf, "/replica:0/task:0/device:CPU:0");
    assert_false(dg_device_spec_canonicalize("/device:Gpu:0", NULL, buf, sizeof buf, st));
    assert_status(st, DG_INVALID_ARGUMENT, "device \"/device:Gpu:0\": device type \"Gpu\" must be all-caps");
    assert_false(dg_device_spec_canonicalize("/device:GP\xc3\xbc:0", NULL, buf, sizeof buf, st));
    assert_status(st, DG_INVALID_ARGUMENT, "must be all-caps");
    assert_true(dg_device_spec_canonicalize("/device:GP\xc3\x9c:0", NULL, buf, sizeof buf, st));
    assert_false(dg_device_spec_canonicalize("/bogus:0", NULL, buf, sizeof buf, st));
    assert_status(st, DG_INVALID_ARGUMENT, "unknown attribute \"bogus\"");
    assert_false(dg_device_spec_canonicalize("/cpu:0", "/bogus:0", buf, sizeof buf, st));
    assert_status(st, DG_INVALID_ARGUMENT, "default device: device \"/bogus:0\"");
    char small[10];
    assert_false(dg_device_spec_canonicalize("/cpu:0", NULL, small, sizeof small, st));
    assert_status(st, DG_INVALID_ARGUMENT, "buffer has 10");
    dg_status_free(&st);
}

// A call that succeeds leaves its status OK, whatever it held before.
static void test_status_reset(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_device_name n;
    char buf[DG_DEVICE_NAME_MAX], buf2[DG_DEVICE_NAME_MAX];
#define AFTER_FAILURE(call)                                                   \
    do {                                                                      \
        dg_status_set(st, DG_INTERNAL, "left over from an earlier call");     \
        assert_true(call);                                                    \
        assert_ok(st);                                                        \
        assert_string_equal(dg_status_message(st), "");                      \
    } while (0)
    AFTER_FAILURE(dg_device_name_parse("/job:w", &n, st));
    AFTER_FAILURE(dg_device_name_parse_local("CPU:0", &n, st));
    AFTER_FAILURE(dg_device_name_parse_full_or_local("CPU:0", &n, st));
    AFTER_FAILURE(dg_device_name_canonicalize("/cpu:0", buf, sizeof buf, st));
    AFTER_FAILURE(dg_device_name_split("/cpu:0", buf, sizeof buf, buf2, sizeof buf2, st));
    AFTER_FAILURE(dg_device_spec_from_string("CPU:0", &n, st));
    AFTER_FAILURE(dg_device_spec_canonical_name("CPU:0", buf, sizeof buf, st));
    AFTER_FAILURE(dg_device_spec_canonicalize("CPU:0", "/job:w", buf, sizeof buf, st));
    dg_device_name a = parse_ok("/job:w"), b = parse_ok("/task:1");
    AFTER_FAILURE(dg_device_name_merge(&a, &b, false, st));
#undef AFTER_FAILURE
    dg_status_free(&st);
}

static void test_fuzz(void **state) {
    (void)state;
    static const char alphabet[] = "/:*jobreplicatskdevCPUGgpu0123456789_-+x \t\xff\xc5\xbf\xd9\xa3";
    static const char *seeds[] = {
        "/job:worker/replica:0/task:1/device:GPU:0", "/job:ps/task:*", "/cpu:0",
        "/device:*:*", "/gpu:12", "/job:a/job:b/device:tpu:1",
    };
    uint64_t rng = 12345;
    dg_status *st = dg_status_new();
    char buf[DG_DEVICE_NAME_MAX];
    char s[96];
    for (int iter = 0; iter < 20000; iter++) {
        size_t n;
        if (iter % 2 == 0) {
            // Mutated or truncated seed.
            const char *seed = seeds[iter / 2 % (sizeof seeds / sizeof seeds[0])];
            n = strlen(seed);
            memcpy(s, seed, n);
            size_t cut = (size_t)dg_test_uniform(&rng, 0, (double)n + 1);
            n = cut;
            int flips = (int)dg_test_uniform(&rng, 0, 3);
            for (int f = 0; f < flips && n > 0; f++) {
                size_t at = (size_t)dg_test_uniform(&rng, 0, (double)n);
                s[at] = alphabet[(size_t)dg_test_uniform(&rng, 0, sizeof alphabet - 1)];
            }
        } else {
            n = (size_t)dg_test_uniform(&rng, 0, sizeof s - 1);
            for (size_t i = 0; i < n; i++) {
                if (iter % 4 == 1)
                    s[i] = (char)(1 + (int)dg_test_uniform(&rng, 0, 255));
                else
                    s[i] = alphabet[(size_t)dg_test_uniform(&rng, 0, sizeof alphabet - 1)];
            }
        }
        s[n] = '\0';
        dg_device_name d;
        dg_status_reset(st);
        if (dg_device_name_parse(s, &d, st)) {
            assert_ok(st);
            // A parsed name prints and re-parses to itself.
            assert_non_null(dg_device_name_str(&d, buf, sizeof buf));
            dg_device_name again;
            assert_true(dg_device_name_parse(buf, &again, st));
            char buf2[DG_DEVICE_NAME_MAX];
            assert_string_equal(dg_device_name_str(&again, buf2, sizeof buf2), buf);
        } else {
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        }
        char small[12];
        dg_status_reset(st);
        (void)dg_device_name_canonicalize(s, small, sizeof small, st);
        (void)dg_device_name_parse_full_or_local(s, NULL, st);
        // A DeviceSpec prints and re-reads to itself too.
        if (dg_device_spec_from_string(s, &d, st)) {
            assert_non_null(dg_device_name_str(&d, buf, sizeof buf));
            dg_device_name again;
            assert_true(dg_device_spec_from_string(buf, &again, st));
            char buf2[DG_DEVICE_NAME_MAX];
            assert_string_equal(dg_device_name_str(&again, buf2, sizeof buf2), buf);
        } else {
            assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        }
        (void)dg_device_spec_canonicalize(s, s, small, sizeof small, st);
    }
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_full),
        cmocka_unit_test(test_parse_empty),
        cmocka_unit_test(test_parse_partial),
        cmocka_unit_test(test_parse_wildcards),
        cmocka_unit_test(test_parse_case_and_legacy),
        cmocka_unit_test(test_parse_order_and_repeat),
        cmocka_unit_test(test_canonical_strings),
        cmocka_unit_test(test_str_buffer_too_small),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_parse_too_long),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_merge_override),
        cmocka_unit_test(test_matches),
        cmocka_unit_test(test_compatible),
        cmocka_unit_test(test_is_complete),
        cmocka_unit_test(test_same_task),
        cmocka_unit_test(test_parse_local),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_lookup_names),
        cmocka_unit_test(test_spec_from_string),
        cmocka_unit_test(test_spec_canonicalize),
        cmocka_unit_test(test_status_reset),
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
