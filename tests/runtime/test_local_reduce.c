/* LocalAllReduce across the devices of one task (dg_local_all_reduce) on virtual CPU devices:
 * sums and means against a float64 reference, the same bits on every device, bad groups, and
 * a step whose participant fails: the others must not wait forever. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOCAL "/job:localhost/replica:0/task:0/device:CPU:"

// n devices each feed a [rows, cols] tensor; every output must equal the float64 sum (or
// mean) of the inputs, bit for bit the same on every device.
static void check_reduce(int n, dg_dtype dtype, dg_reduce_op op, int threads) {
    enum { ROWS = 7, COLS = 33 };
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output xs[8], outs[8];
    char *devs[8];
    for (int r = 0; r < n; r++) {
        if (asprintf(&devs[r], LOCAL "%d", r) < 0) abort();
        dg_graph_push_device(g, devs[r]);
        char name[16];
        snprintf(name, sizeof name, "x%d", r);
        xs[r] = dg_placeholder(g, name, dtype, dg_shape2(ROWS, COLS));
        dg_graph_pop_device(g);
    }
    assert_true(dg_local_all_reduce(g, "ar", xs, (const char *const *)devs, n, op, outs));
    assert_ok(dg_graph_status(g));
    dg_session *s = dg_test_local_session(g, n, threads, st);
    uint64_t rng = 99 + (uint64_t)n;
    dg_tensor *vals[8];
    double want[ROWS * COLS] = {0};
    for (int r = 0; r < n; r++) {
        vals[r] = dg_tensor_new(dtype, dg_shape2(ROWS, COLS), st);
        for (int i = 0; i < ROWS * COLS; i++) {
            double v = dg_test_uniform(&rng, -3, 3);
            if (dtype == DG_FLOAT32) dg_tensor_f32(vals[r])[i] = (float)v;
            else dg_tensor_f64(vals[r])[i] = v;
            want[i] += dtype == DG_FLOAT32 ? (double)(float)v : v;
        }
    }
    for (int step = 0; step < 3; step++) {
        dg_tensor *got[8] = {0};
        assert_true(dg_session_run(s, xs, vals, n, outs, got, n, NULL, 0, st));
        assert_ok(st);
        for (int r = 0; r < n; r++) {
            assert_int_equal(dg_tensor_dtype(got[r]), dtype);
            assert_memory_equal(dg_tensor_data(got[r]), dg_tensor_data(got[0]), dg_tensor_nbytes(got[0]));
        }
        for (int i = 0; i < ROWS * COLS; i++) {
            double w = op == DG_REDUCE_MEAN ? want[i] / n : want[i];
            double v = dg_tensor_get_as_double(got[0], i);
            double tol = dtype == DG_FLOAT32 ? 1e-5 * n * 3 : 1e-12 * n * 3;
            if (!dg_test_is_close(v, w, tol, 0)) fail_msg("element %d: %g, want %g", i, v, w);
        }
        for (int r = 0; r < n; r++) dg_tensor_unref(got[r]);
    }
    for (int r = 0; r < n; r++) {
        dg_tensor_unref(vals[r]);
        free(devs[r]);
    }
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_sum_f32(void **state) { check_reduce(3, DG_FLOAT32, DG_REDUCE_SUM, 1); }
static void test_mean_f64(void **state) { check_reduce(4, DG_FLOAT64, DG_REDUCE_MEAN, 4); }
static void test_one_device(void **state) { check_reduce(1, DG_FLOAT64, DG_REDUCE_SUM, 1); }
static void test_threads(void **state) { check_reduce(8, DG_FLOAT32, DG_REDUCE_MEAN, 3); }

// Inputs of different shapes: the step fails naming the group.
static void test_mismatch(void **state) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    const char *devs[] = {LOCAL "0", LOCAL "1"};
    dg_output xs[2], outs[2];
    dg_graph_push_device(g, devs[0]);
    xs[0] = dg_placeholder(g, "a", DG_FLOAT32, dg_shape1(-1));
    dg_graph_pop_device(g);
    dg_graph_push_device(g, devs[1]);
    xs[1] = dg_placeholder(g, "b", DG_FLOAT32, dg_shape1(-1));
    dg_graph_pop_device(g);
    assert_true(dg_local_all_reduce(g, "ar", xs, devs, 2, DG_REDUCE_SUM, outs));
    dg_session *s = dg_test_local_session(g, 2, 2, st);
    dg_tensor *vals[2] = {dg_tensor_new_zeros(DG_FLOAT32, dg_shape1(3), st),
                          dg_tensor_new_zeros(DG_FLOAT32, dg_shape1(4), st)};
    dg_tensor *got[2] = {0};
    assert_false(dg_session_run(s, xs, vals, 2, outs, got, 2, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "unlike the others");
    // The session still works with agreeing inputs.
    dg_status_reset(st);
    dg_tensor_unref(vals[1]);
    vals[1] = dg_tensor_new_zeros(DG_FLOAT32, dg_shape1(3), st);
    assert_true(dg_session_run(s, xs, vals, 2, outs, got, 2, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < 2; i++) {
        dg_tensor_unref(got[i]);
        dg_tensor_unref(vals[i]);
    }
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// One participant's input fails (a Reshape to a fed, impossible shape on device 1): the step
// fails with that error and the participants that arrived are released, not left waiting.
static void test_failed_participant(void **state) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    const char *devs[] = {LOCAL "0", LOCAL "1", LOCAL "2"};
    dg_output xs[3], outs[3];
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(6));
    dg_output shape = dg_placeholder(g, "shape", DG_INT64, dg_shape1(1));
    for (int r = 0; r < 3; r++) {
        dg_graph_push_device(g, devs[r]);
        char name[16];
        snprintf(name, sizeof name, "in%d", r);
        xs[r] = r == 1 ? dg_reshape_to(g, name, x, shape) : dg_identity(g, name, x);
        dg_graph_pop_device(g);
    }
    assert_true(dg_local_all_reduce(g, "ar", xs, devs, 3, DG_REDUCE_SUM, outs));
    assert_ok(dg_graph_status(g));
    dg_session *s = dg_test_local_session(g, 3, 3, st);
    dg_output feeds[] = {x, shape};
    dg_tensor *xv = dg_tensor_new_zeros(DG_FLOAT32, dg_shape1(6), st);
    dg_tensor *bad = dg_tensor_new(DG_INT64, dg_shape1(1), st);
    dg_tensor_i64(bad)[0] = 7;   // 6 elements cannot be viewed as 7
    dg_tensor *vals[] = {xv, bad};
    dg_tensor *got[3] = {0};
    for (int round = 0; round < 3; round++) {
        assert_false(dg_session_run(s, feeds, vals, 2, outs, got, 3, NULL, 0, st));
        assert_false(dg_status_ok(st));
        assert_non_null(strstr(dg_status_message(st), "in1"));
        dg_status_reset(st);
    }
    dg_tensor_i64(bad)[0] = 6;
    assert_true(dg_session_run(s, feeds, vals, 2, outs, got, 3, NULL, 0, st));
    assert_ok(st);
    for (int i = 0; i < 3; i++) dg_tensor_unref(got[i]);
    dg_tensor_unref(xv);
    dg_tensor_unref(bad);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// Bad groups are refused when the node is built.
static void test_bad_build(void **state) {
    dg_graph *g = dg_graph_new();
    dg_output i = dg_placeholder(g, "i", DG_INT32, dg_shape1(2));
    const char *devs[] = {LOCAL "0"};
    dg_output out[1];
    assert_false(dg_local_all_reduce(g, "ar", &i, devs, 1, DG_REDUCE_SUM, out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "float32 or float64");
    dg_graph_free(&g);
    g = dg_graph_new();
    assert_false(dg_local_all_reduce(g, "ar", NULL, devs, 1, DG_REDUCE_SUM, out));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "at least one input");
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sum_f32),           cmocka_unit_test(test_mean_f64),
        cmocka_unit_test(test_one_device),        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_mismatch),          cmocka_unit_test(test_failed_participant),
        cmocka_unit_test(test_bad_build),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
