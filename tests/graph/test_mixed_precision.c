/* Mixed precision while building (dg_graph_set_mixed_precision): a float32 MatMul becomes casts
 * to bfloat16, a bfloat16 MatMul and a cast back; each float32 value is cast once; the product
 * and the weight's gradient equal float64 products of the bfloat16-rounded operands within
 * bfloat16's half ulp (2^-8) plus the float32 sums' error; a least-squares fit trained so ends
 * near float32's fit with float32 variables. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

enum { B = 24, K = 40, N = 6 };

static double bf(float v) { return dg_bfloat16_to_float(dg_float_to_bfloat16(v)); }

static int count_op(const dg_graph *g, const char *op) {
    int c = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) c += strcmp(dg_node_op_type(dg_graph_node(g, i)), op) == 0;
    return c;
}

static void test_setting(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    assert_int_equal(dg_graph_mixed_precision(g), DG_INVALID_DTYPE);
    assert_false(dg_graph_set_mixed_precision(g, DG_FLOAT64, st));
    assert_status(st, DG_INVALID_ARGUMENT, "float64 is not bfloat16 or float16");
    dg_status_reset(st);
    assert_true(dg_graph_set_mixed_precision(g, DG_FLOAT16, st));
    assert_int_equal(dg_graph_mixed_precision(g), DG_FLOAT16);
    assert_true(dg_graph_set_mixed_precision(g, DG_INVALID_DTYPE, st));
    assert_int_equal(dg_graph_mixed_precision(g), DG_INVALID_DTYPE);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// y = x w and z = x2 w in bfloat16; the gradient of sum(y) by w.
static void test_product_and_gradient(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    assert_true(dg_graph_set_mixed_precision(g, DG_BFLOAT16, st));
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(B, K));
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(K, N), dg_init_random_uniform(-1, 1, 7));
    dg_output y = dg_matmul(g, "y", x, w, false, false), z = dg_matmul(g, "z", dg_square(g, NULL, x), w, false, false);
    assert_int_equal(dg_output_dtype(y), DG_FLOAT32);
    assert_int_equal(dg_output_dtype(dg_node_input(y.node, 0)), DG_BFLOAT16);
    assert_int_equal(count_op(g, "MatMul"), 2);
    assert_int_equal(count_op(g, "Cast"), 5);   // x, x^2 and w (once for both), y and z back
    // y and z are casts back of the two products, whose second operand is the one cast of w.
    dg_node *my = dg_node_input(y.node, 0).node, *mz = dg_node_input(z.node, 0).node;
    assert_string_equal(dg_node_op_type(my), "MatMul");
    assert_ptr_equal(dg_node_input(my, 1).node, dg_node_input(mz, 1).node);
    dg_output loss = dg_sum(g, "loss", y, NULL, 0, false), gw;
    assert_true(dg_gradients(g, &loss, 1, &w, 1, NULL, &gw));
    assert_ok(dg_graph_status(g));
    assert_int_equal(dg_output_dtype(gw), DG_FLOAT32);
    dg_node *init = dg_global_variables_initializer(g);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_ok(st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    float xv[B * K];
    uint64_t seed = 5;
    for (int i = 0; i < B * K; i++) xv[i] = (float)dg_test_uniform(&seed, -3, 3);
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(B, K), xv, st), *out[3] = {0};
    dg_output fetch[] = {y, gw, w};
    assert_true(dg_session_run(s, &x, &xt, 1, fetch, out, 3, NULL, 0, st));
    assert_ok(st);
    const float *yv = dg_tensor_f32(out[0]), *gv = dg_tensor_f32(out[1]), *wv = dg_tensor_f32(out[2]);
    for (int i = 0; i < B; i++)
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                ref += bf(xv[i * K + k]) * bf(wv[k * N + j]);
                mag += fabs(bf(xv[i * K + k]) * bf(wv[k * N + j]));
            }
            double tol = 0x1p-8 * fabs(ref) + (K + 2) * 0x1p-24 * mag;
            if (!(fabs(yv[i * N + j] - ref) <= tol)) fail_msg("y[%d,%d] = %.9g, want %.9g", i, j, yv[i * N + j], ref);
        }
    // d sum(y) / dw[k][j] = sum over i of x[i][k] (the seed, ones, is exact in bfloat16).
    for (int k = 0; k < K; k++) {
        double ref = 0, mag = 0;
        for (int i = 0; i < B; i++) {
            ref += bf(xv[i * K + k]);
            mag += fabs(bf(xv[i * K + k]));
        }
        for (int j = 0; j < N; j++) {
            double tol = 0x1p-8 * fabs(ref) + (B + 2) * 0x1p-24 * mag;
            if (!(fabs(gv[k * N + j] - ref) <= tol)) fail_msg("dw[%d,%d] = %.9g, want %.9g", k, j, gv[k * N + j], ref);
        }
    }
    for (int i = 0; i < 3; i++) dg_tensor_unref(out[i]);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// Least squares, x w ~ t with t = x w* exactly, by gradient descent: the final mean squared
// error over the initial one, in float32 or with bfloat16 products.
enum { FB = 128, FK = 16, FN = 4 };

static double fit(bool mixed) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    if (mixed) assert_true(dg_graph_set_mixed_precision(g, DG_BFLOAT16, st));
    float xv[FB * FK], wstar[FK * FN], tv[FB * FN];
    uint64_t seed = 11;
    for (int i = 0; i < FB * FK; i++) xv[i] = (float)dg_test_uniform(&seed, -1, 1);
    for (int i = 0; i < FK * FN; i++) wstar[i] = (float)dg_test_uniform(&seed, -1, 1);
    for (int i = 0; i < FB; i++)
        for (int j = 0; j < FN; j++) {
            double acc = 0;
            for (int k = 0; k < FK; k++) acc += (double)xv[i * FK + k] * wstar[k * FN + j];
            tv[i * FN + j] = (float)acc;
        }
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(FB, FK), xv, st);
    dg_tensor *tt = dg_tensor_from_data(DG_FLOAT32, dg_shape2(FB, FN), tv, st);
    dg_output x = dg_const(g, "x", xt), t = dg_const(g, "t", tt);
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(FK, FN), dg_init_zeros());
    dg_output loss = dg_mean(g, "loss", dg_square(g, NULL, dg_sub(g, NULL, dg_matmul(g, NULL, x, w, false, false), t)),
                             NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.5);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    dg_node *init = dg_global_variables_initializer(g);
    assert_ok(dg_graph_status(g));
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &init, 1, st));
    dg_tensor *l0 = NULL, *l1 = NULL, *wt = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &loss, &l0, 1, NULL, 0, st));
    for (int step = 0; step < 300; step++) assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &train, 1, st));
    assert_true(dg_session_run(s, NULL, NULL, 0, &loss, &l1, 1, NULL, 0, st));
    assert_true(dg_session_run(s, NULL, NULL, 0, &w, &wt, 1, NULL, 0, st));
    assert_ok(st);
    assert_int_equal(dg_tensor_dtype(wt), DG_FLOAT32);   // the master weights
    double ratio = dg_tensor_f32(l1)[0] / dg_tensor_f32(l0)[0];
    dg_tensor_unref(l0);
    dg_tensor_unref(l1);
    dg_tensor_unref(wt);
    dg_tensor_unref(xt);
    dg_tensor_unref(tt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
    return ratio;
}

static void test_training(void **state) {
    (void)state;
    double f32 = fit(false), bf16 = fit(true);
    print_message("least squares, final / initial error: float32 %.3g, bfloat16 products %.3g\n", f32, bf16);
    assert_true(f32 < 1e-6);
    // bfloat16 operands leave about 2^-8 of each product: an error floor near 2^-16 of the start.
    assert_true(bf16 < 1e-4);
    assert_true(bf16 > f32);   // the bfloat16 products did run
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_setting),
        cmocka_unit_test(test_product_and_gradient),
        cmocka_unit_test(test_training),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
