/* Tests for graph/device_name.c, after TensorFlow's device_name_utils_test.cc and
 * device_spec_test.py. */
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
    dg_device_name n = parse_ok("/device:cpu:1");
    assert_string_equal(n.type, "CPU");
    n = parse_ok("/job:w/cpu:0");
    assert_true(n.has_type && n.has_id);
    assert_string_equal(n.type, "CPU");
    assert_int_equal(n.id, 0);
    n = parse_ok("/GPU:1");
    assert_string_equal(n.type, "GPU");
    assert_int_equal(n.id, 1);
    n = parse_ok("/gPu:4");
    assert_string_equal(n.type, "GPU");
    n = parse_ok("/device:tpu_v2:1");
    assert_string_equal(n.type, "TPU_V2");

    expect_canon("/job:w/replica:0/task:1/gpu:2", "/job:w/replica:0/task:1/device:GPU:2");
    expect_canon("/cpu:0", "/device:CPU:0");
    expect_canon("/device:gpu:3", "/device:GPU:3");
}

static void test_parse_order_and_repeat(void **state) {
    (void)state;
    // TensorFlow accepts fields in any order; a repeated field overrides.
    expect_canon("/device:GPU:0/task:1/job:w", "/job:w/task:1/device:GPU:0");
    expect_canon("/job:a/job:b", "/job:b");
    expect_canon("/device:GPU:0/cpu:1", "/device:CPU:1");
    expect_canon("/task:01", "/task:1");
}

static void test_canonical_strings(void **state) {
    (void)state;
    expect_canon("/job:worker/replica:0/task:1/device:GPU:0",
                 "/job:worker/replica:0/task:1/device:GPU:0");
    expect_canon("/job:ps", "/job:ps");
    expect_canon("/job:ps/device:CPU", "/job:ps/device:CPU:*");
    expect_canon("/device:*:3", "/device:*:3");
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
    expect_bad("/task:2147483648", "bad task index \"2147483648\"");
    expect_bad("/replica:q", "bad replica index \"q\"");
    expect_bad("/job:123/replica:1/task:2/gpu:0", "bad job name \"123\"");
    expect_bad("/job:", "bad job name \"\"");
    expect_bad("/job:a b", "bad job name \"a b\"");
    expect_bad("/job:w:1", "bad job name \"w:1\"");
    expect_bad("/device:GPU:x", "bad device id \"x\"");
    expect_bad("/device:GPU:0:1", "bad device id \"0:1\"");
    expect_bad("/device:", "bad device type \"\"");
    expect_bad("/device:1GPU:0", "bad device type \"1GPU\"");
    expect_bad("/device:G-PU:0", "bad device type \"G-PU\"");
    expect_bad("/gpu:a", "bad device id \"a\"");
    expect_bad("/cpu:", "bad device id \"\"");
    expect_bad("/foo:1", "unknown field \"foo:1\"");
    expect_bad("/Job:w", "unknown field \"Job:w\"");
    expect_bad("/job:w/device", "bad field (expected job:, replica:, task: or device:) \"device\"");
    expect_bad("/GPU", "bad field");
    expect_bad("job:w", "must start with '/'");
    expect_bad("CPU:0", "must start with '/'");
    expect_bad("/job:w/", "empty field at offset 7");
    expect_bad("//job:w", "empty field at offset 1");
    expect_bad("/job:w//task:1", "empty field");
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
                  "\"/job:foo/task:0/device:GPU:0\" and \"/job:bar/task:0\"");
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

    t = parse_ok("");
    o = parse_ok("/replica:4/device:*:1");
    dg_device_name_merge_override(&t, &o);
    assert_string_equal(dg_device_name_str(&t, buf, sizeof buf), "/replica:4/device:*:1");
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

static void test_fuzz(void **state) {
    (void)state;
    static const char alphabet[] = "/:*jobreplicatskdevCPUGgpu0123456789_-x \xff";
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
        cmocka_unit_test(test_fuzz),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
