/* Training basics built from existing ops (issue "Real models, part 1", the first pieces):
 * variance-scaling initializers, the dense layer, a learning rate that is a tensor with
 * exponential decay. Each is checked against its formula computed here in float64. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

// Runs the initializers and fetches v into a new array of doubles.
static double *init_and_fetch(dg_graph *g, dg_output v, int64_t *n) {
    dg_status *st = dg_status_new();
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_check(g, st));
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_non_null(s);
    assert_true(dg_session_run_target(s, init, st));
    dg_tensor *t = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &v, &t, 1, NULL, 0, st));
    *n = dg_tensor_num_elements(t);
    double *out = malloc((size_t)*n * sizeof *out);
    for (int64_t i = 0; i < *n; i++) out[i] = dg_tensor_get_as_double(t, i);
    dg_tensor_unref(t);
    dg_session_free(&s);
    dg_status_free(&st);
    return out;
}

static void test_variance_scaling(void **state) {
    (void)state;
    struct {
        dg_initializer init;
        int64_t rows, cols;
        double want_var;   // scale / n
        double limit;      // uniform: the bound; normal: 2 standard deviations of the untruncated
    } cases[] = {
        {dg_init_glorot_uniform(3), 300, 200, 1.0 / 250, sqrt(3.0 / 250)},
        {dg_init_glorot_normal(4), 300, 200, 1.0 / 250, 2 * sqrt(1.0 / 250) / 0.87962566103423978},
        {dg_init_he_uniform(5), 400, 100, 2.0 / 400, sqrt(6.0 / 400)},
        {dg_init_he_normal(6), 400, 100, 2.0 / 400, 2 * sqrt(2.0 / 400) / 0.87962566103423978},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        dg_graph *g = dg_graph_new();
        dg_output v = dg_variable(g, "w", DG_FLOAT64, dg_shape2(cases[c].rows, cases[c].cols), cases[c].init);
        int64_t n;
        double *x = init_and_fetch(g, v, &n);
        double mean = 0, var = 0, maxabs = dg_test_max_abs_f64(x, n);   // NaN if any is not finite
        for (int64_t i = 0; i < n; i++) mean += x[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
        var /= (double)(n - 1);
        if (!dg_test_is_close(var, cases[c].want_var, 0, 0.03) ||
            !dg_test_is_close(mean, 0, 4 * sqrt(cases[c].want_var / (double)n), 0) ||
            !(maxabs <= cases[c].limit * (1 + 1e-9)))
            fail_msg("case %zu: mean %g, variance %g (want %g), max |x| %g (limit %g)", c, mean, var,
                     cases[c].want_var, maxabs, cases[c].limit);
        free(x);
        dg_graph_free(&g);
    }
    // Fans of a convolution kernel [3, 3, 16, 32]: 3*3*16 in, 3*3*32 out.
    dg_graph *g = dg_graph_new();
    int64_t dims[4] = {3, 3, 16, 32};
    dg_output v = dg_variable(g, "k", DG_FLOAT64, dg_shape_make(4, dims), dg_init_glorot_uniform(9));
    int64_t n;
    double *x = init_and_fetch(g, v, &n);
    double limit = sqrt(3.0 / ((144.0 + 288.0) / 2)), maxabs = dg_test_max_abs_f64(x, n);
    assert_true(maxabs <= limit && maxabs > 0.9 * limit);
    free(x);
    dg_graph_free(&g);
}

static void test_dense(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, 3));
    dg_output y = dg_dense(g, "hidden", x, 4, DG_ACT_TANH, dg_init_glorot_uniform(1));
    assert_non_null(dg_graph_find(g, "hidden/kernel"));
    assert_non_null(dg_graph_find(g, "hidden/bias"));
    assert_int_equal(dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES), 2);
    dg_output kernel = {dg_graph_find(g, "hidden/kernel"), 0}, bias = {dg_graph_find(g, "hidden/bias"), 0};
    dg_node *init = dg_global_variables_initializer(g);
    // Bad input: units < 1, and an input whose last dimension is unknown.
    dg_graph *bad = dg_graph_new();
    dg_output bx = dg_placeholder(bad, "x", DG_FLOAT32, dg_shape2(-1, -1));
    assert_null(dg_dense(bad, NULL, bx, 4, DG_ACT_NONE, dg_init_zeros()).node);
    assert_status(dg_graph_status(bad), DG_INVALID_ARGUMENT, "last dimension is known");
    dg_graph_free(&bad);
    assert_true(dg_graph_check(g, st));
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run_target(s, init, st));
    double xv[6] = {0.5, -1, 2, 0.25, 0.75, -0.5};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(2, 3), xv, st);
    dg_output fetch[3] = {y, kernel, bias};
    dg_tensor *got[3] = {NULL, NULL, NULL};
    assert_true(dg_session_run(s, &x, &xt, 1, fetch, got, 3, NULL, 0, st));
    const double *k = dg_tensor_f64(got[1]), *b = dg_tensor_f64(got[2]), *out = dg_tensor_f64(got[0]);
    for (int r = 0; r < 2; r++)
        for (int u = 0; u < 4; u++) {
            double want = b[u];
            for (int i = 0; i < 3; i++) want += xv[r * 3 + i] * k[i * 4 + u];
            want = tanh(want);
            assert_close(out[r * 4 + u], want, 1e-12, 0);
        }
    for (int i = 0; i < 3; i++) dg_tensor_unref(got[i]);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// SGD with an exponentially decaying rate on loss = w (gradient 1): each step lowers w by the
// rate at the step's global step, so w after n steps is -sum of the rates, computed here.
static void test_exponential_decay(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    dg_output gs = dg_global_step(g);
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape_scalar(), dg_init_zeros());
    dg_output lr = dg_exponential_decay(g, 0.1, gs, 10, 0.5);
    dg_optimizer opt = dg_gradient_descent(g, 123.0);   // ignored: the tensor wins
    opt.learning_rate_tensor = lr;
    dg_node *train = dg_optimizer_minimize(&opt, dg_identity(g, "loss", w), gs);
    dg_node *init = dg_global_variables_initializer(g);
    assert_true(dg_graph_check(g, st));
    dg_session *s = dg_session_new(g, "local", NULL, st);
    assert_true(dg_session_run_target(s, init, st));
    double want = 0;
    for (int step = 0; step < 25; step++) {
        dg_tensor *rate = NULL;
        assert_true(dg_session_run(s, NULL, NULL, 0, &lr, &rate, 1, NULL, 0, st));
        double expect = 0.1 * pow(0.5, step / 10.0);
        assert_close(dg_tensor_get_as_double(rate, 0), expect, 1e-7 * expect, 0);
        dg_tensor_unref(rate);
        assert_true(dg_session_run_target(s, train, st));
        want -= (double)(float)expect;   // the rate travels as float32, as TensorFlow's
    }
    dg_tensor *wv = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &w, &wv, 1, NULL, 0, st));
    assert_close(dg_tensor_f64(wv)[0], want, 1e-12, 0);
    dg_tensor_unref(wv);
    dg_session_free(&s);
    // Bad input names what is wrong.
    dg_graph *bad = dg_graph_new();
    assert_null(dg_exponential_decay(bad, 0.1, dg_global_step(bad), 0, 0.5).node);
    assert_status(dg_graph_status(bad), DG_INVALID_ARGUMENT, "decay_steps > 0");
    dg_graph_free(&bad);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// The composed losses and helpers against their formulas in float64, at values where a naive
// formula would overflow (|x| = 50, 800) too; and their bad input.
static void test_losses_and_helpers(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_new();
    enum { N = 8 };
    const double xs[N] = {-800, -50, -2.5, -0.1, 0, 0.3, 4, 800}, zs[N] = {0, 1, 0.25, 1, 0.5, 0, 0.75, 1};
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(N)), z = dg_placeholder(g, "z", DG_FLOAT64, dg_shape1(N));
    dg_output fetch[6];
    fetch[0] = dg_sigmoid_cross_entropy_with_logits(g, NULL, z, x);
    fetch[1] = dg_l2_loss(g, NULL, z);
    fetch[2] = dg_abs(g, NULL, x);
    dg_output two[2] = {z, dg_expand_dims(g, NULL, z, 0)}, clipped[2], norm;
    dg_clip_by_global_norm(g, two, 2, 1.0, clipped, &norm);
    fetch[3] = clipped[1];
    fetch[4] = norm;
    fetch[5] = dg_squeeze(g, NULL, clipped[1], NULL, 0);
    assert_true(dg_graph_check(g, st));
    assert_int_equal(dg_output_shape(fetch[3]).rank, 2);
    assert_int_equal(dg_output_shape(fetch[5]).rank, 1);
    dg_session *s = dg_session_new(g, "local", NULL, st);
    dg_tensor *xv = dg_tensor_from_data(DG_FLOAT64, dg_shape1(N), xs, st);
    dg_tensor *zv = dg_tensor_from_data(DG_FLOAT64, dg_shape1(N), zs, st);
    dg_output feeds[2] = {x, z};
    dg_tensor *vals[2] = {xv, zv}, *got[6] = {NULL};
    assert_true(dg_session_run(s, feeds, vals, 2, fetch, got, 6, NULL, 0, st));
    double l2 = 0, sq = 0;
    for (int i = 0; i < N; i++) {
        // log(1 + exp(x)) - x z, written for large |x| without overflow: for x > 0,
        // x + log1p(exp(-x)) - x z.
        double want = xs[i] > 0 ? xs[i] - xs[i] * zs[i] + log1p(exp(-xs[i])) : log1p(exp(xs[i])) - xs[i] * zs[i];
        double gotv = dg_tensor_f64(got[0])[i];
        if (!dg_test_is_close(gotv, want, 1e-12, 1e-12)) fail_msg("x %g z %g: %g, want %g", xs[i], zs[i], gotv, want);
        assert_true(dg_tensor_f64(got[2])[i] == fabs(xs[i]));
        l2 += zs[i] * zs[i] / 2;
        sq += 2 * zs[i] * zs[i];   // z appears twice among the clipped tensors
    }
    assert_close(dg_tensor_f64(got[1])[0], l2, 1e-12, 0);
    double gn = sqrt(sq);
    assert_close(dg_tensor_f64(got[4])[0], gn, 1e-12, 0);
    for (int i = 0; i < N; i++) {
        assert_close(dg_tensor_f64(got[3])[i], zs[i] / gn, 1e-12, 0);   // gn > 1: clipped
        assert_true(dg_tensor_f64(got[5])[i] == dg_tensor_f64(got[3])[i]);
    }
    for (int i = 0; i < 6; i++) dg_tensor_unref(got[i]);
    dg_tensor_unref(xv);
    dg_tensor_unref(zv);
    dg_session_free(&s);
    dg_graph_free(&g);

    // Bad input: each a status naming the fault, never a crash.
    struct {
        int which;
        const char *needle;
    } bad[] = {
        {0, "squeeze: axis 0 of shape [3,4] is not a dimension of size 1"},
        {1, "expand_dims: axis 3 of an input of rank 2"},
        {2, "clip_norm > 0"},
        {3, "unknown dimensions (at most one)"},
    };
    for (size_t c = 0; c < sizeof bad / sizeof *bad; c++) {
        dg_graph *b = dg_graph_new();
        dg_output m = dg_placeholder(b, "m", DG_FLOAT32, dg_shape2(3, 4));
        dg_output q = dg_placeholder(b, "q", DG_FLOAT32, dg_shape2(-1, -1));
        const int64_t ax0[] = {0};
        dg_output o;
        switch (bad[c].which) {
        case 0: dg_squeeze(b, NULL, m, ax0, 1); break;
        case 1: dg_expand_dims(b, NULL, m, 3); break;
        case 2: dg_clip_by_global_norm(b, &m, 1, 0, &o, NULL); break;
        case 3: dg_expand_dims(b, NULL, q, 0); break;
        }
        assert_status(dg_graph_status(b), DG_INVALID_ARGUMENT, bad[c].needle);
        dg_graph_free(&b);
    }
    dg_status_free(&st);
}

// Adagrad and RMSProp against TensorFlow 1's update rules run here in float64, five steps on
// loss = sum((w - target)^2) / 2 (gradient w - target).
static void test_adagrad_rmsprop(void **state) {
    (void)state;
    const double w0[3] = {0.5, -1.0, 2.0}, target[3] = {1.5, 0.25, -0.75};
    for (int kind = 0; kind < 2; kind++) {
        dg_status *st = dg_status_new();
        dg_graph *g = dg_graph_new();
        dg_tensor *init = dg_tensor_from_data(DG_FLOAT64, dg_shape1(3), w0, st);
        dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape1(3), dg_init_tensor(init));
        dg_tensor_unref(init);
        dg_tensor *tt = dg_tensor_from_data(DG_FLOAT64, dg_shape1(3), target, st);
        dg_output diff = dg_sub(g, NULL, w, dg_const(g, "target", tt));
        dg_tensor_unref(tt);
        dg_output loss = dg_mul(g, NULL, dg_sum(g, NULL, dg_square(g, NULL, diff), NULL, 0, false),
                                dg_scalar(g, NULL, DG_FLOAT64, 0.5));
        const double lr = 0.3, acc0 = 0.1, rho = 0.9, mom = 0.5, eps = 1e-10;
        dg_optimizer opt = kind == 0 ? dg_adagrad(g, lr, acc0) : dg_rmsprop(g, lr, rho, mom, eps);
        dg_node *train = dg_optimizer_minimize(&opt, loss, dg_global_step(g));
        dg_node *vinit = dg_global_variables_initializer(g);
        assert_true(dg_graph_check(g, st));
        assert_non_null(dg_graph_find(g, kind == 0 ? "w/Adagrad" : "w/RMSProp_1"));
        dg_session *s = dg_session_new(g, "local", NULL, st);
        assert_true(dg_session_run_target(s, vinit, st));
        double ref[3], a1[3], a2[3];
        for (int i = 0; i < 3; i++) ref[i] = w0[i], a1[i] = kind == 0 ? acc0 : 1.0, a2[i] = 0;
        for (int step = 0; step < 5; step++) {
            assert_true(dg_session_run_target(s, train, st));
            for (int i = 0; i < 3; i++) {
                double gr = ref[i] - target[i];
                if (kind == 0) {
                    a1[i] += gr * gr;
                    ref[i] -= lr * gr / sqrt(a1[i]);
                } else {
                    a1[i] = rho * a1[i] + (1 - rho) * gr * gr;
                    a2[i] = mom * a2[i] + lr * gr / sqrt(a1[i] + eps);
                    ref[i] -= a2[i];
                }
            }
            dg_tensor *wv = NULL;
            assert_true(dg_session_run(s, NULL, NULL, 0, &w, &wv, 1, NULL, 0, st));
            for (int i = 0; i < 3; i++)
                if (!dg_test_is_close(dg_tensor_f64(wv)[i], ref[i], 1e-12, 0))
                    fail_msg("%s step %d w[%d]: %.17g, want %.17g", kind == 0 ? "Adagrad" : "RMSProp", step, i,
                             dg_tensor_f64(wv)[i], ref[i]);
            dg_tensor_unref(wv);
        }
        dg_session_free(&s);
        dg_graph_free(&g);
        // Bad hyperparameters name the rule broken.
        g = dg_graph_new();
        dg_output v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(2), dg_init_ones());
        dg_optimizer badopt = kind == 0 ? dg_adagrad(g, 0.1, 0) : dg_rmsprop(g, 0.1, 1.5, 0, 1e-10);
        assert_null(dg_optimizer_minimize(&badopt, dg_sum(g, NULL, v, NULL, 0, false), (dg_output){NULL, 0}));
        assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, kind == 0 ? "initial_accumulator_value" : "rho in");
        dg_graph_free(&g);
        dg_status_free(&st);
    }
}

// A gradient whose shape was unknown when the graph was built, fed with the wrong number of
// elements: each dense update fails naming the input, and the variable keeps its value (before
// the check, the kernels read past the gradient).
static void test_update_shape_checked(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) {
        dg_graph *g = dg_graph_new();
        dg_output v = dg_variable(g, "w", DG_FLOAT32, dg_shape1(4), dg_init_constant(2.0));
        dg_output grad = dg_placeholder(g, "grad", DG_FLOAT32, dg_shape_unknown());
        dg_optimizer opt = k == 0 ? dg_gradient_descent(g, 0.1) : k == 1 ? dg_momentum(g, 0.1, 0.9, false) : dg_adam(g, 0.1);
        dg_node *train = dg_optimizer_apply_gradients(&opt, &grad, &v, 1, (dg_output){NULL, 0}, NULL);
        dg_node *init = dg_global_variables_initializer(g);
        assert_non_null(train);
        dg_status *st = dg_status_new();
        dg_session *s = dg_session_new(g, "local", NULL, st);
        assert_true(dg_session_run_target(s, init, st));
        float two[2] = {1, 1};
        dg_tensor *t = dg_tensor_from_data(DG_FLOAT32, dg_shape1(2), two, st);
        assert_false(dg_session_run(s, &grad, &t, 1, NULL, NULL, 0, &train, 1, st));
        assert_status(st, DG_INVALID_ARGUMENT, "(\"grad\") is float32 [2]; the variable is float32 [4]");
        dg_tensor *out = NULL;
        assert_true(dg_session_run(s, NULL, NULL, 0, &v, &out, 1, NULL, 0, st));
        for (int i = 0; i < 4; i++) assert_true(dg_tensor_f32(out)[i] == 2.0f);
        dg_tensor_unref(out);
        dg_tensor_unref(t);
        dg_session_free(&s);
        dg_status_free(&st);
        dg_graph_free(&g);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_variance_scaling),
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_exponential_decay),
        cmocka_unit_test(test_losses_and_helpers),
        cmocka_unit_test(test_adagrad_rmsprop),
        cmocka_unit_test(test_update_shape_checked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
