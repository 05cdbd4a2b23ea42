/* Kernel fusion (executor/fusion.c): a small CNN's loss and gradients with fusion on equal
 * those with it off (DG_FUSION=0, every op its own kernel, the path the float64 gradient
 * checks cover), on the direct convolution (16 input channels) and on the im2col one (3);
 * a step's trace shows which fused kernels ran, and fetching a value inside a chain keeps
 * that chain unfused with the value right. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { N_OUT = 4 };   // loss, d kernel, d bias, d input

typedef struct net {
    dg_graph *g;
    dg_output x, pre_relu;
    dg_output out[N_OUT];
} net;

static dg_output const_f32(dg_graph *g, const char *name, dg_shape shape, uint64_t *seed) {
    int64_t n = 1;
    for (int i = 0; i < shape.rank; i++) n *= shape.dims[i];
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) v[i] = (float)dg_test_uniform(seed, -1, 1);
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT32, shape, v, st);
    assert_non_null(t);
    dg_output o = dg_const(g, name, t);
    dg_tensor_unref(t);
    dg_status_free(&st);
    free(v);
    return o;
}

// conv (5x5 SAME, 32 filters) + bias + relu, 2x2 max pool, a sum of squares as the loss.
static net build(int64_t in_ch) {
    net m;
    m.g = dg_graph_new();
    uint64_t seed = 7;
    m.x = const_f32(m.g, "x", dg_shape_make(4, (int64_t[]){3, 10, 12, in_ch}), &seed);
    dg_output k = const_f32(m.g, "k", dg_shape_make(4, (int64_t[]){5, 5, in_ch, 32}), &seed);
    dg_output b = const_f32(m.g, "b", dg_shape1(32), &seed);
    m.pre_relu = dg_bias_add(m.g, "pre", dg_conv2d(m.g, "conv", m.x, k, 1, 1, DG_PADDING_SAME), b);
    dg_output h = dg_max_pool(m.g, "pool", dg_relu(m.g, "relu", m.pre_relu), 2, 2, 2, 2, DG_PADDING_VALID);
    m.out[0] = dg_sum(m.g, "loss", dg_square(m.g, NULL, h), NULL, 0, false);
    dg_output xs[3] = {k, b, m.x};
    assert_true(dg_gradients(m.g, &m.out[0], 1, xs, 3, NULL, m.out + 1));
    dg_status *st = dg_status_new();
    assert_true(dg_graph_check(m.g, st));
    dg_status_free(&st);
    return m;
}

// Runs the fetches once with DG_FUSION set to fusion; counts the trace's ops named op_a, op_b.
static void run(const net *m, const dg_output *fetches, int n, bool fusion, dg_tensor **out, int *n_a,
                const char *op_a, int *n_b, const char *op_b) {
    setenv("DG_FUSION", fusion ? "1" : "0", 1);
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(m->g, "local", NULL, st);
    assert_non_null(s);
    dg_step_trace *trace = NULL;
    dg_run_options ro = {.trace = true};
    if (!dg_session_run_with_options(s, &ro, NULL, NULL, 0, fetches, out, n, NULL, 0, &trace, st))
        fail_msg("run: %s", dg_status_message(st));
    *n_a = *n_b = 0;
    for (int i = 0; trace && i < dg_step_trace_num_events(trace); i++) {
        const dg_trace_event *e = dg_step_trace_event(trace, i);
        if (e->kind != DG_TRACE_OP) continue;
        *n_a += strcmp(e->op, op_a) == 0;
        *n_b += strcmp(e->op, op_b) == 0;
    }
    dg_step_trace_free(&trace);
    dg_session_free(&s);
    dg_status_free(&st);
    unsetenv("DG_FUSION");
}

static void expect_close(const dg_tensor *got, const dg_tensor *want, const char *what) {
    int64_t n = dg_tensor_num_elements(want);
    assert_int_equal(dg_tensor_num_elements(got), n);
    // The unfused result is the reference, read as float64 (exactly).
    double *b = malloc((size_t)n * sizeof *b);
    assert_non_null(b);
    for (int64_t i = 0; i < n; i++) b[i] = dg_tensor_f32(want)[i];
    double scale = dg_test_max_abs_f64(b, n);
    assert_true(scale > 0);
    int64_t far = dg_test_first_far_f32(dg_tensor_f32(got), b, n, 1e-5 * scale, 1e-5);
    if (far >= 0)
        fail_msg("%s element %lld of %lld: fused %.9g, unfused %.9g", what, (long long)far, (long long)n,
                 dg_tensor_f32(got)[far], b[far]);
    free(b);
}

static void check_net(int64_t in_ch) {
    net m = build(in_ch);
    dg_tensor *fused[N_OUT] = {0}, *plain[N_OUT] = {0};
    int conv_f, pool_f, conv_p, pool_p;
    run(&m, m.out, N_OUT, true, fused, &conv_f, "_FusedConv2DBiasRelu", &pool_f, "_FusedMaxPoolGradReluGrad");
    run(&m, m.out, N_OUT, false, plain, &conv_p, "_FusedConv2DBiasRelu", &pool_p, "_FusedMaxPoolGradReluGrad");
    assert_int_equal(conv_f, 1);
    assert_int_equal(pool_f, 1);
    assert_int_equal(conv_p, 0);
    assert_int_equal(pool_p, 0);
    const char *what[N_OUT] = {"loss", "d kernel", "d bias", "d input"};
    for (int i = 0; i < N_OUT; i++) {
        expect_close(fused[i], plain[i], what[i]);
        dg_tensor_unref(fused[i]);
        dg_tensor_unref(plain[i]);
    }
    dg_graph_free(&m.g);
}

static void test_direct_conv(void **state) {
    (void)state;
    check_net(16);
}

static void test_im2col_conv(void **state) {
    (void)state;
    check_net(3);
}

// The BiasAdd's value fetched: Conv2D + BiasAdd + Relu stay apart (the pooling gradient still
// fuses), and the fetched value is the unfused one.
static void test_fetched_value_not_fused(void **state) {
    (void)state;
    net m = build(16);
    dg_output fetches[2] = {m.out[1], m.pre_relu};
    dg_tensor *fused[2] = {0}, *plain[2] = {0};
    int conv_f, pool_f, conv_p, pool_p;
    run(&m, fetches, 2, true, fused, &conv_f, "_FusedConv2DBiasRelu", &pool_f, "_FusedMaxPoolGradReluGrad");
    run(&m, fetches, 2, false, plain, &conv_p, "Conv2D", &pool_p, "BiasAdd");
    assert_int_equal(conv_f, 0);
    assert_int_equal(pool_f, 1);
    assert_int_equal(conv_p, 1);
    assert_int_equal(pool_p, 1);
    for (int i = 0; i < 2; i++) {
        expect_close(fused[i], plain[i], i ? "pre-activation" : "d kernel");
        dg_tensor_unref(fused[i]);
        dg_tensor_unref(plain[i]);
    }
    dg_graph_free(&m.g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_direct_conv),
        cmocka_unit_test(test_im2col_conv),
        cmocka_unit_test(test_fetched_value_not_fused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
