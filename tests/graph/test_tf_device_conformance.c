/* Device names against TensorFlow's own answers: the tables in tests/tf_conformance/
 * (written by gen_device_tables.py from TensorFlow's C++ DeviceNameUtils, DeviceSpec and
 * device_util). Every cell is checked; a cell tagged "column:reason" is a deliberate
 * difference (docs/TF_COMPAT.md), where distgraph must answer otherwise, and in the documented
 * way. Mismatches are listed all at once before the test fails. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CELLS 12
#define LOCAL_CPU "/job:localhost/replica:0/task:0/device:CPU:0"

static int n_failures;

static void mismatch(const char *table, int line, const char *what, const char *input,
                     const char *want, const char *got) {
    if (++n_failures <= 60)
        print_error("%s:%d %s of \"%s\": TensorFlow says \"%s\", distgraph \"%s\"\n", table, line,
                    what, input, want, got);
}


static FILE *open_table(const char *name) {
    const char *root = getenv("DG_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/tf_conformance/%s", root ? root : ".", name);
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("cannot open %s (set DG_SOURCE_DIR to the source tree)", path);
    return f;
}

// A line of a table: long enough for the 4300-digit inputs.
static char *read_line(FILE *f, char **buf, size_t *cap) {
    ssize_t n = getline(buf, cap, f);
    return n < 0 ? NULL : *buf;
}

// The reason tag for column in a diff cell ("cpp:int_range,spec:int_range"), or NULL.
static const char *tag_for(const char *diff, const char *column, char *reason, size_t cap) {
    size_t cl = strlen(column);
    for (const char *p = diff; p && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > cl && strncmp(p, column, cl) == 0 && p[cl] == ':') {
            snprintf(reason, cap, "%.*s", (int)(n - cl - 1), p + cl + 1);
            return reason;
        }
        p = end ? end + 1 : NULL;
    }
    return NULL;
}

// Checks one answer: equal to TensorFlow's, or, for a tagged cell, different in the
// documented way.
static void check(const char *table, int line, const char *column, const char *input,
                  const char *diff, const char *want, const char *got) {
    char reason[64];
    if (!tag_for(diff, column, reason, sizeof reason)) {
        if (strcmp(want, got) != 0) mismatch(table, line, column, input, want, got);
        return;
    }
    bool got_error = strcmp(got, "ERROR") == 0;
    bool ok;
    if (strcmp(reason, "int_range") == 0 || strcmp(reason, "long_name") == 0)
        ok = got_error;   // distgraph rejects what does not fit its fields
    else if (strcmp(reason, "job_dash") == 0)
        ok = !got_error;  // distgraph accepts '-' in job names
    else if (strcmp(reason, "empty_scope") == 0)
        ok = !got_error;  // a "" scope is a barrier in distgraph, a no-op merge in TensorFlow
    else
        ok = false;
    if (!ok || strcmp(want, got) == 0) {
        char what[96];
        snprintf(what, sizeof what, "%s (tagged %s)", column, reason);
        mismatch(table, line, what, input, want, got);
    }
}

// An error must be INVALID_ARGUMENT with a message naming the input.
static void check_error_status(const char *table, int line, const char *input, const dg_status *st) {
    if (dg_status_code(st) != DG_INVALID_ARGUMENT || !strstr(dg_status_message(st), "device \"")) {
        char got[256];
        snprintf(got, sizeof got, "code %d: %s", (int)dg_status_code(st), dg_status_message(st));
        mismatch(table, line, "error status", input, "INVALID_ARGUMENT naming the device", got);
    }
}

static void test_device_names(void **state) {
    (void)state;
    FILE *f = open_table("device_names.tsv");
    dg_status *st = dg_status_new();
    dg_device_name cpu;
    assert_true(dg_device_name_parse(LOCAL_CPU, &cpu, st));
    char *buf = NULL;
    size_t cap = 0;
    int line = 0, rows = 0, tagged = 0;
    bool header = false;
    char *l;
    while ((l = read_line(f, &buf, &cap))) {
        line++;
        if (l[0] == '#') continue;
        if (!header) {   // the column names
            header = true;
            continue;
        }
        char *c[MAX_CELLS];
        assert_int_equal(dg_test_tsv_split(l, c, MAX_CELLS), 8);
        const char *in = dg_test_tsv_unescape(c[0]);
        const char *want_cpp = dg_test_tsv_unescape(c[1]), *want_spec = dg_test_tsv_unescape(c[5]);
        const char *want_canon = dg_test_tsv_unescape(c[6]);
        const char *diff = c[7];
        rows++;
        tagged += strcmp(diff, "-") != 0;
        char reason[64];

        // C++ ParseFullName and ParsedNameToString.
        char got[DG_DEVICE_NAME_MAX];
        dg_device_name d;
        bool parsed = dg_device_name_parse(in, &d, st);
        if (parsed) dg_device_name_str(&d, got, sizeof got);
        else check_error_status("device_names.tsv", line, in, st);
        check("device_names.tsv", line, "cpp", in, diff, want_cpp, parsed ? got : "ERROR");
        // The eager placer puts the op on the host CPU when the canonical name matches it.
        if (parsed && strcmp(c[4], "-") != 0 && !tag_for(diff, "cpp", reason, sizeof reason)) {
            dg_device_name again;
            assert_true(dg_device_name_parse(got, &again, st));
            const char *m = dg_device_name_matches(&again, &cpu) ? "1" : "0";
            if (strcmp(m, c[4]) != 0) mismatch("device_names.tsv", line, "place_cpu", in, c[4], m);
        }

        // ParseFullOrLocalName, and AreCompatibleDevNames with the host CPU.
        dg_device_name fl;
        bool fl_ok = dg_device_name_parse_full_or_local(in, &fl, st);
        if (!fl_ok) check_error_status("device_names.tsv", line, in, st);
        check("device_names.tsv", line, "cpp_or_local", in, diff, c[2], fl_ok ? "OK" : "ERROR");
        if (fl_ok && strcmp(c[3], "-") != 0 && !tag_for(diff, "cpp_or_local", reason, sizeof reason)) {
            const char *m = dg_device_name_compatible(&fl, &cpu) ? "1" : "0";
            if (strcmp(m, c[3]) != 0) mismatch("device_names.tsv", line, "compat_cpu", in, c[3], m);
        }

        // DeviceSpec.from_string(...).to_string().
        bool spec_ok = dg_device_spec_canonical_name(in, got, sizeof got, st);
        if (!spec_ok) check_error_status("device_names.tsv", line, in, st);
        check("device_names.tsv", line, "spec", in, diff, want_spec, spec_ok ? got : "ERROR");

        // device_util.canonicalize(...).
        bool canon_ok = dg_device_spec_canonicalize(in, NULL, got, sizeof got, st);
        if (!canon_ok) check_error_status("device_names.tsv", line, in, st);
        check("device_names.tsv", line, "canon", in, diff, want_canon, canon_ok ? got : "ERROR");
    }
    free(buf);
    fclose(f);
    dg_status_free(&st);
    print_message("device_names.tsv: %d rows (%d with deliberate differences), %d mismatches\n",
                  rows, tagged, n_failures);
    assert_true(rows > 2000);
    assert_int_equal(n_failures, 0);
}

static void test_merge_and_defaults(void **state) {
    (void)state;
    FILE *f = open_table("device_merge.tsv");
    dg_status *st = dg_status_new();
    char *buf = NULL;
    size_t cap = 0;
    int line = 0, rows = 0;
    bool header = false;
    char *l;
    n_failures = 0;
    while ((l = read_line(f, &buf, &cap))) {
        line++;
        if (l[0] == '#') continue;
        if (!header) {
            header = true;
            continue;
        }
        char *c[MAX_CELLS];
        assert_int_equal(dg_test_tsv_split(l, c, MAX_CELLS), 5);
        const char *a = dg_test_tsv_unescape(c[1]), *b = dg_test_tsv_unescape(c[2]);
        const char *want = dg_test_tsv_unescape(c[3]), *diff = c[4];
        char got[DG_DEVICE_NAME_MAX] = "ERROR";
        char input[2 * DG_DEVICE_NAME_MAX + 8];
        snprintf(input, sizeof input, "%s | %s", a, b);
        rows++;
        if (strcmp(c[0], "merge") == 0) {
            dg_device_name x, y;
            if (dg_device_spec_from_string(a, &x, st) && dg_device_spec_from_string(b, &y, st)) {
                dg_device_name_merge_override(&x, &y);   // x.make_merged_spec(y)
                dg_device_name_str(&x, got, sizeof got);
            }
            check("device_merge.tsv", line, "merge", input, diff, want, got);
        } else if (strcmp(c[0], "scope") == 0) {
            // Nested device scopes: graph.c reads them as tf.device() does.
            dg_graph *g = dg_graph_new();
            dg_graph_push_device(g, a);
            dg_graph_push_device(g, b);
            dg_output x = dg_scalar(g, "c", DG_FLOAT32, 1);
            if (dg_graph_ok(g) && x.node) snprintf(got, sizeof got, "%s", dg_node_requested_device(x.node));
            else assert_int_equal(dg_status_code(dg_graph_status(g)), DG_INVALID_ARGUMENT);
            dg_graph_free(&g);
            check("device_merge.tsv", line, "scope", input, diff, want, got);
        } else {
            assert_string_equal(c[0], "canon");
            if (!dg_device_spec_canonicalize(a, b, got, sizeof got, st)) {
                snprintf(got, sizeof got, "ERROR");
                assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
            }
            check("device_merge.tsv", line, "canon", input, diff, want, got);
        }
    }
    free(buf);
    fclose(f);
    dg_status_free(&st);
    print_message("device_merge.tsv: %d rows, %d mismatches\n", rows, n_failures);
    assert_true(rows > 1000);
    assert_int_equal(n_failures, 0);
}

// DeviceMgr::LookupDevice: the names the host CPU is found by.
static void test_lookup_names(void **state) {
    (void)state;
    FILE *f = open_table("device_lookup.tsv");
    dg_status *st = dg_status_new();
    dg_device_name cpu;
    assert_true(dg_device_name_parse(LOCAL_CPU, &cpu, st));
    char names[DG_DEVICE_LOOKUP_NAMES][DG_DEVICE_NAME_MAX];
    int n = dg_device_name_lookup_names(&cpu, names, DG_DEVICE_LOOKUP_NAMES);
    assert_int_equal(n, 4);
    char *buf = NULL;
    size_t cap = 0;
    int line = 0, rows = 0;
    bool header = false;
    char *l;
    n_failures = 0;
    while ((l = read_line(f, &buf, &cap))) {
        line++;
        if (l[0] == '#') continue;
        if (!header) {
            header = true;
            continue;
        }
        char *c[MAX_CELLS];
        assert_int_equal(dg_test_tsv_split(l, c, MAX_CELLS), 2);
        const char *name = dg_test_tsv_unescape(c[0]);
        bool found = false;
        for (int i = 0; i < n; i++) found = found || strcmp(names[i], name) == 0;
        if (found != (strcmp(c[1], "1") == 0))
            mismatch("device_lookup.tsv", line, "lookup", name, c[1], found ? "1" : "0");
        rows++;
    }
    free(buf);
    fclose(f);
    dg_status_free(&st);
    assert_true(rows > 20);
    assert_int_equal(n_failures, 0);
}

// Strategies read their device list as TensorFlow's do (device_util.canonicalize reads with
// DeviceSpec): "/device:gpu:0" and "GPU:1" are GPUs.
static void test_strategy_devices(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    const char *devs[] = {"/device:gpu:0", "GPU:1", "/Gpu:2"};
    dg_strategy *s = dg_strategy_new(g, DG_STRATEGY_MIRRORED, devs, 3, st);
    assert_ok(st);
    assert_non_null(s);
    assert_string_equal(dg_strategy_device(s, 0), "/device:GPU:0");
    assert_string_equal(dg_strategy_device(s, 1), "/device:GPU:1");
    assert_string_equal(dg_strategy_device(s, 2), "/device:GPU:2");
    dg_strategy_free(&s);
    const char *bad_devs[] = {"/device:GPU:0", "/cpu:0/gpu:1"};
    assert_null(dg_strategy_new(g, DG_STRATEGY_MIRRORED, bad_devs, 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "strategy: device 1: device \"/cpu:0/gpu:1\": multiple device types");
    dg_status_free(&st);
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_device_names),
        cmocka_unit_test(test_merge_and_defaults),
        cmocka_unit_test(test_lookup_names),
        cmocka_unit_test(test_strategy_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
