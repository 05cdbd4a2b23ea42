/* Tests for runtime/session.c (the local session): feeds, fetches and targets, pruning,
 * the per-signature cache, variables and random initializers, threading, forward values of
 * ops against hand-computed references, and every error a caller can trigger, after
 * TensorFlow's session_test.py and the forward tests of its kernel tests. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dg_output NUL = {NULL, 0};

// ---------------------------------------------------------------------------------------
// Helpers

static dg_session *new_session_threads(dg_graph *g, int inter) {
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.inter_op_threads = inter;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_ok(st);
    assert_non_null(s);
    dg_status_free(&st);
    return s;
}

static dg_session *new_session(dg_graph *g) { return new_session_threads(g, 1); }

static dg_tensor *tf64(dg_shape s, const double *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, s, v, st);
    assert_ok(st);
    dg_status_free(&st);
    return t;
}

static dg_tensor *tf32(dg_shape s, const float *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT32, s, v, st);
    assert_ok(st);
    dg_status_free(&st);
    return t;
}

static dg_tensor *ti64(dg_shape s, const int64_t *v) {
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_from_data(DG_INT64, s, v, st);
    assert_ok(st);
    dg_status_free(&st);
    return t;
}

static dg_output cf64(dg_graph *g, const char *name, dg_shape s, const double *v) {
    dg_tensor *t = tf64(s, v);
    dg_output o = dg_const(g, name, t);
    dg_tensor_unref(t);
    return o;
}

static void run_ok(dg_session *s, const dg_output *feeds, dg_tensor *const *vals, int n_feeds,
                   const dg_output *fetches, dg_tensor **out, int n_fetches,
                   dg_node *const *targets, int n_targets) {
    dg_status *st = dg_status_new();
    bool ok = dg_session_run(s, feeds, vals, n_feeds, fetches, out, n_fetches, targets, n_targets, st);
    assert_ok(st);
    assert_true(ok);
    dg_status_free(&st);
}

// One fetch, no feeds.
static dg_tensor *fetch1(dg_session *s, dg_output o) {
    dg_tensor *t = NULL;
    run_ok(s, NULL, NULL, 0, &o, &t, 1, NULL, 0);
    assert_non_null(t);
    return t;
}

static void target_ok(dg_session *s, dg_node *n) {
    dg_status *st = dg_status_new();
    assert_true(dg_session_run_target(s, n, st));
    assert_ok(st);
    dg_status_free(&st);
}

// Runs and expects failure with code and needle; fetched entries must stay untouched.
static void run_fails(dg_session *s, const dg_output *feeds, dg_tensor *const *vals, int n_feeds,
                      const dg_output *fetches, int n_fetches, dg_node *const *targets,
                      int n_targets, dg_code code, const char *needle) {
    dg_status *st = dg_status_new();
    dg_tensor *out[4] = {NULL, NULL, NULL, NULL};
    assert_true(n_fetches <= 4);
    bool ok = dg_session_run(s, feeds, vals, n_feeds, fetches, n_fetches ? out : NULL, n_fetches,
                             targets, n_targets, st);
    assert_false(ok);
    assert_status(st, code, needle);
    for (int i = 0; i < 4; i++) assert_null(out[i]);
    dg_status_free(&st);
}

static void assert_f64s(const dg_tensor *t, const double *want, int n, double tol) {
    assert_int_equal(dg_tensor_dtype(t), DG_FLOAT64);
    assert_int_equal(dg_tensor_num_elements(t), n);
    for (int i = 0; i < n; i++) {
        double got = dg_tensor_f64(t)[i];
        if (!dg_test_is_close(got, want[i], tol, tol))
            fail_msg("element %d: got %.17g, want %.17g", i, got, want[i]);
    }
}

static void assert_shape(const dg_tensor *t, int rank, const int64_t *dims) {
    assert_int_equal(dg_tensor_rank(t), rank);
    for (int i = 0; i < rank; i++) assert_int_equal(dg_tensor_dim(t, i), dims[i]);
}

// ---------------------------------------------------------------------------------------
// Errors

static void test_session_new_errors(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    assert_null(dg_session_new(NULL, "local", NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "graph is NULL");
    dg_graph *g = dg_graph_new();
    dg_status_reset(st);
    assert_null(dg_session_new(g, "grpc://localhost:2222", NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"grpc://localhost:2222\"");
    // A dg:// target with no server of this process is a remote master; nobody answers there.
    dg_status_reset(st);
    dg_session_options wo = dg_session_options_default();
    wo.wait_for_tasks_ms = 300;
    assert_null(dg_session_new(g, "dg://127.0.0.1:1", &wo, st));
    assert_status(st, DG_UNAVAILABLE, "the master at tcp://127.0.0.1:1 did not answer within 300 ms");
    dg_status_reset(st);
    assert_null(dg_session_new(g, "dg://127.0.0.1", &wo, st));
    assert_status(st, DG_INVALID_ARGUMENT, "address \"dg://127.0.0.1\": expected \"host:port\" or \"dg://host:port\"");
    // "" and NULL mean local.
    dg_status_reset(st);
    dg_session *s = dg_session_new(g, "", NULL, st);
    assert_ok(st);
    dg_session_free(&s);
    assert_null(s);
    s = dg_session_new(g, NULL, NULL, st);
    assert_ok(st);
    dg_session_free(&s);
    dg_session_free(&s);
    dg_session_free(NULL);
    dg_status_free(&st);
    dg_graph_free(&g);
}

// MatMul [2,3] x [4,5]: the builder fails naming the node; runs report the build error.
static void test_shape_mismatch_at_build(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(2, 3));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT32, dg_shape2(4, 5));
    dg_output mm = dg_matmul(g, "dense/mm", a, b, false, false);
    assert_null(mm.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "node \"dense/mm\" (MatMul): inner dimensions differ, 3 vs 4");
    // Later builders return the null output, the first error stays.
    dg_output r = dg_relu(g, "r", a);
    assert_null(r.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "inner dimensions");
    // A session can be made, but every run reports the sticky error.
    dg_session *s = new_session(g);
    run_fails(s, NULL, NULL, 0, &a, 1, NULL, 0, DG_INVALID_ARGUMENT,
              "the graph has an error from building it: node \"dense/mm\" (MatMul): inner dimensions");
    dg_session_free(&s);
    dg_graph_free(&g);
}

// A null output given to a builder is a sticky error; lookups by name say NOT_FOUND.
static void test_unknown_input(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    dg_output missing = dg_graph_output(g, "nope", st);
    assert_null(missing.node);
    assert_status(st, DG_NOT_FOUND, "\"nope\"");
    assert_true(dg_graph_ok(g));   // lookups do not touch the graph's status
    dg_output y = dg_exp(g, "e", missing);
    assert_null(y.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "Exp: an input is the null output");
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(2));
    dg_output xs[2] = {x, NUL};
    assert_null(dg_add_n(g, "sum", xs, 2).node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "AddN: an input is the null output");
    dg_graph_free(&g);

    g = dg_graph_new();
    assert_null(dg_const(g, "c", NULL).node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "Const \"c\": value is NULL");
    dg_graph_free(&g);
    dg_status_free(&st);
}

// Two Identity nodes made into a cycle with a control edge.
static void test_cycle(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(2));
    dg_output a = dg_identity(g, "a", x);
    dg_output b = dg_identity(g, "b", a);
    dg_node_add_control_input(a.node, b.node);
    dg_session *s = new_session(g);
    double v[2] = {1, 2};
    dg_tensor *xv = tf64(dg_shape1(2), v);
    run_fails(s, &x, &xv, 1, &b, 1, NULL, 0, DG_INVALID_ARGUMENT, "cycle");
    // The error names one of the nodes on the cycle; it does not stay cached.
    run_fails(s, &x, &xv, 1, &b, 1, NULL, 0, DG_INVALID_ARGUMENT, "depends on itself");
    // A fetch that does not need the cycle still runs.
    dg_output c = dg_identity(g, "c", x);
    dg_tensor *out;
    run_ok(s, &x, &xv, 1, &c, &out, 1, NULL, 0);
    assert_f64s(out, v, 2, 0);
    dg_tensor_unref(out);
    dg_tensor_unref(xv);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_bad_fetches_and_targets(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph *other = dg_graph_new();
    dg_output c = dg_scalar(g, "c", DG_FLOAT64, 1);
    dg_output oc = dg_scalar(other, "oc", DG_FLOAT64, 1);
    dg_session *s = new_session(g);
    run_fails(s, NULL, NULL, 0, &NUL, 1, NULL, 0, DG_INVALID_ARGUMENT, "fetch 0 is not an output of this session's graph");
    run_fails(s, NULL, NULL, 0, &oc, 1, NULL, 0, DG_INVALID_ARGUMENT, "fetch 0 is not an output");
    dg_output bad_index = {c.node, 1};
    dg_output two[2] = {c, bad_index};
    run_fails(s, NULL, NULL, 0, two, 2, NULL, 0, DG_INVALID_ARGUMENT, "fetch 1 is not an output");
    dg_node *nt = NULL;
    run_fails(s, NULL, NULL, 0, NULL, 0, &nt, 1, DG_INVALID_ARGUMENT, "target 0 is not a node of this session's graph");
    run_fails(s, NULL, NULL, 0, NULL, 0, &oc.node, 1, DG_INVALID_ARGUMENT, "target 0 is not a node");
    dg_status *st = dg_status_new();
    assert_false(dg_session_run_target(s, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "target is NULL");
    assert_false(dg_session_run(NULL, NULL, NULL, 0, NULL, NULL, 0, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "session is NULL");
    assert_false(dg_session_run(s, NULL, NULL, 0, &c, NULL, 1, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "an array is NULL");
    assert_false(dg_session_run(s, NULL, NULL, -1, NULL, NULL, 0, NULL, 0, st));
    assert_status(st, DG_INVALID_ARGUMENT, "a count is negative");
    // Looking a node up by a missing name.
    dg_status_reset(st);
    dg_output m = dg_graph_output(g, "missing_node:0", st);
    assert_null(m.node);
    assert_status(st, DG_NOT_FOUND, "no node named \"missing_node\"");
    // A run with nothing to do succeeds.
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, NULL, 0, st));
    dg_status_free(&st);
    dg_session_free(&s);
    dg_graph_free(&other);
    dg_graph_free(&g);
}

static void test_bad_feeds(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 3));
    dg_output y = dg_relu(g, "y", x);
    dg_session *s = new_session(g);
    double d6[6] = {0};
    float f6[6] = {0}, f8[8] = {0};
    dg_tensor *wrong_type = tf64(dg_shape2(2, 3), d6);
    run_fails(s, &x, &wrong_type, 1, &y, 1, NULL, 0, DG_INVALID_ARGUMENT,
              "feed for \"x:0\": expected float32, got float64");
    dg_tensor *wrong_shape = tf32(dg_shape2(2, 4), f8);
    run_fails(s, &x, &wrong_shape, 1, &y, 1, NULL, 0, DG_INVALID_ARGUMENT,
              "feed for \"x:0\": expected shape [?,3], got [2,4]");
    dg_tensor *wrong_rank = tf32(dg_shape1(6), f6);
    run_fails(s, &x, &wrong_rank, 1, &y, 1, NULL, 0, DG_INVALID_ARGUMENT, "expected shape [?,3], got [6]");
    dg_tensor *good = tf32(dg_shape2(2, 3), f6);
    dg_output twice[2] = {x, x};
    dg_tensor *vals[2] = {good, good};
    run_fails(s, twice, vals, 2, &y, 1, NULL, 0, DG_INVALID_ARGUMENT, "\"x:0\" is fed twice");
    dg_tensor *nullv = NULL;
    run_fails(s, &x, &nullv, 1, &y, 1, NULL, 0, DG_INVALID_ARGUMENT, "feed 0 (\"x\"): value is NULL");
    run_fails(s, &NUL, &good, 1, &y, 1, NULL, 0, DG_INVALID_ARGUMENT, "feed 0 is not an output of this session's graph");
    // Not feeding a placeholder that the fetch needs.
    run_fails(s, NULL, NULL, 0, &y, 1, NULL, 0, DG_INVALID_ARGUMENT,
              "you must feed a value for placeholder \"x\" (float32 [?,3])");
    // The same signature works once fed correctly.
    dg_tensor *out;
    run_ok(s, &x, &good, 1, &y, &out, 1, NULL, 0);
    int64_t dims[2] = {2, 3};
    assert_shape(out, 2, dims);
    dg_tensor_unref(out);
    dg_tensor_unref(wrong_type);
    dg_tensor_unref(wrong_shape);
    dg_tensor_unref(wrong_rank);
    dg_tensor_unref(good);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// Kernel errors at run time name the node and keep their code.
static void test_run_time_errors(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT64, dg_shape2(-1, -1));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT64, dg_shape2(-1, -1));
    dg_output mm = dg_matmul(g, "mm", a, b, false, false);
    dg_output labels = dg_placeholder(g, "labels", DG_INT64, dg_shape1(-1));
    dg_output xent = dg_sparse_softmax_cross_entropy_with_logits(g, "xent", a, labels);
    dg_output ia = dg_placeholder(g, "ia", DG_INT64, dg_shape1(2));
    dg_output idiv = dg_div(g, "idiv", ia, ia);
    assert_true(dg_graph_ok(g));
    dg_session *s = new_session(g);
    double v6[6] = {1, 2, 3, 4, 5, 6};
    dg_tensor *t23 = tf64(dg_shape2(2, 3), v6);
    dg_output ab[2] = {a, b};
    dg_tensor *vals[2] = {t23, t23};
    run_fails(s, ab, vals, 2, &mm, 1, NULL, 0, DG_INVALID_ARGUMENT, "node \"mm\" (MatMul)");
    run_fails(s, ab, vals, 2, &mm, 1, NULL, 0, DG_INVALID_ARGUMENT, "inner dimensions differ, 3 vs 2");
    int64_t lv[2] = {0, 3};
    dg_tensor *lt = ti64(dg_shape1(2), lv);
    dg_output al[2] = {a, labels};
    dg_tensor *alv[2] = {t23, lt};
    run_fails(s, al, alv, 2, &xent, 1, NULL, 0, DG_INVALID_ARGUMENT, "label 3 at row 1 is outside [0, 3)");
    int64_t zv[2] = {1, 0};
    dg_tensor *zt = ti64(dg_shape1(2), zv);
    run_fails(s, &ia, &zt, 1, &idiv, 1, NULL, 0, DG_INVALID_ARGUMENT, "node \"idiv\" (Div)");
    run_fails(s, &ia, &zt, 1, &idiv, 1, NULL, 0, DG_INVALID_ARGUMENT, "integer division by zero");
    dg_tensor_unref(zt);
    dg_tensor_unref(lt);
    dg_tensor_unref(t23);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_uninitialized_variable(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(2), dg_init_ones());
    dg_output y = dg_mul(g, "y", v, dg_scalar(g, NULL, DG_FLOAT64, 2));
    dg_output inc = dg_assign_add(g, "inc", v, dg_ones_like(g, NULL, v));
    dg_output rd = dg_identity(g, "read", v);
    dg_session *s = new_session(g);
    run_fails(s, NULL, NULL, 0, &y, 1, NULL, 0, DG_FAILED_PRECONDITION,
              "attempting to use uninitialized value \"v\"");
    run_fails(s, NULL, NULL, 0, &y, 1, NULL, 0, DG_FAILED_PRECONDITION, "node \"y\" (Mul)");
    run_fails(s, NULL, NULL, 0, &inc, 1, NULL, 0, DG_FAILED_PRECONDITION, "uninitialized");
    run_fails(s, NULL, NULL, 0, &rd, 1, NULL, 0, DG_FAILED_PRECONDITION, "uninitialized");
    run_fails(s, NULL, NULL, 0, &v, 1, NULL, 0, DG_FAILED_PRECONDITION, "uninitialized value \"v\"");
    target_ok(s, dg_global_variables_initializer(g));
    dg_tensor *out = fetch1(s, y);
    double want[2] = {2, 2};
    assert_f64s(out, want, 2, 0);
    dg_tensor_unref(out);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Feeds, fetches, targets, pruning, caching

static void test_feeds_fetches_targets(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape1(3));
    dg_output e = dg_exp(g, "e", x);
    dg_output y = dg_add(g, "y", e, x);
    dg_output cnt = dg_variable(g, "count", DG_FLOAT64, dg_shape_scalar(), dg_init_zeros());
    dg_output bump = dg_assign_add(g, "bump", cnt, dg_scalar(g, NULL, DG_FLOAT64, 1));
    dg_session *s = new_session(g);
    target_ok(s, dg_global_variables_initializer(g));
    double xv[3] = {0, 1, -1};
    dg_tensor *xt = tf64(dg_shape1(3), xv), *out[3];
    dg_output fetches[3] = {y, e, x};
    run_ok(s, &x, &xt, 1, fetches, out, 3, &bump.node, 1);
    double wy[3], we[3];
    for (int i = 0; i < 3; i++) {
        we[i] = exp(xv[i]);
        wy[i] = we[i] + xv[i];
    }
    assert_f64s(out[0], wy, 3, 0);
    assert_f64s(out[1], we, 3, 0);
    assert_f64s(out[2], xv, 3, 0);   // a fed value can be fetched
    for (int i = 0; i < 3; i++) dg_tensor_unref(out[i]);
    dg_tensor *c = fetch1(s, cnt);
    assert_true(dg_tensor_f64(c)[0] == 1);
    dg_tensor_unref(c);
    // Feeding an intermediate output replaces it: x is then not needed for y's e.
    double ev[3] = {10, 20, 30};
    dg_tensor *et = tf64(dg_shape1(3), ev);
    dg_output feeds[2] = {x, e};
    dg_tensor *vals[2] = {xt, et};
    run_ok(s, feeds, vals, 2, &y, out, 1, NULL, 0);
    double w2[3] = {10, 21, 29};
    assert_f64s(out[0], w2, 3, 0);
    dg_tensor_unref(out[0]);
    // The same fetch, twice in one run.
    dg_output same[2] = {e, e};
    run_ok(s, &x, &xt, 1, same, out, 2, NULL, 0);
    assert_f64s(out[0], we, 3, 0);
    assert_f64s(out[1], we, 3, 0);
    dg_tensor_unref(out[0]);
    dg_tensor_unref(out[1]);
    // Targets alone, several times: the counter advances once per run.
    for (int i = 0; i < 3; i++) target_ok(s, bump.node);
    c = fetch1(s, cnt);
    assert_true(dg_tensor_f64(c)[0] == 4);
    dg_tensor_unref(c);
    dg_tensor_unref(xt);
    dg_tensor_unref(et);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// An unfed placeholder the fetch does not need is pruned away; so is a node that would fail.
static void test_pruning(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT64, dg_shape1(2));
    dg_output unfed = dg_placeholder(g, "unfed", DG_FLOAT64, dg_shape1(2));
    dg_output bad = dg_exp(g, "uses_unfed", unfed);
    dg_output uninit = dg_variable(g, "never_initialized", DG_FLOAT64, dg_shape1(2), dg_init_zeros());
    dg_output uses_var = dg_add(g, "uses_var", uninit, a);
    (void)bad;
    (void)uses_var;
    dg_output y = dg_neg(g, "y", a);
    dg_session *s = new_session(g);
    double av[2] = {1, -2}, want[2] = {-1, 2};
    dg_tensor *at = tf64(dg_shape1(2), av), *out;
    run_ok(s, &a, &at, 1, &y, &out, 1, NULL, 0);
    assert_f64s(out, want, 2, 0);
    dg_tensor_unref(out);
    // A fed placeholder that nothing needs is fine too.
    dg_output feeds[2] = {a, unfed};
    dg_tensor *vals[2] = {at, at};
    run_ok(s, feeds, vals, 2, &y, &out, 1, NULL, 0);
    assert_f64s(out, want, 2, 0);
    dg_tensor_unref(out);
    // Control inputs are followed: a target whose control input needs "unfed" fails.
    dg_node *after = dg_no_op(g, "after");
    dg_node_add_control_input(after, bad.node);
    run_fails(s, &a, &at, 1, NULL, 0, &after, 1, DG_INVALID_ARGUMENT, "placeholder \"unfed\"");
    dg_tensor_unref(at);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// The same signature twice gives the same results; nodes added between runs are usable.
static void test_cache_reuse(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(2, 2));
    dg_output y = dg_matmul(g, "y", x, x, false, false);
    dg_session *s = new_session(g);
    double xv[4] = {1, 2, 3, 4}, want[4] = {7, 10, 15, 22};
    dg_tensor *xt = tf64(dg_shape2(2, 2), xv);
    dg_tensor *first, *second;
    run_ok(s, &x, &xt, 1, &y, &first, 1, NULL, 0);
    run_ok(s, &x, &xt, 1, &y, &second, 1, NULL, 0);
    assert_f64s(first, want, 4, 0);
    assert_f64s(second, want, 4, 0);
    // The first result is ours: a later run does not overwrite it.
    double xv2[4] = {0, 0, 0, 0};
    dg_tensor *zt = tf64(dg_shape2(2, 2), xv2), *third;
    run_ok(s, &x, &zt, 1, &y, &third, 1, NULL, 0);
    assert_f64s(first, want, 4, 0);
    assert_f64s(second, want, 4, 0);
    assert_f64s(third, xv2, 4, 0);
    dg_tensor_unref(first);
    dg_tensor_unref(second);
    dg_tensor_unref(third);
    // A node added after the first run.
    dg_output z = dg_add(g, "z", y, x);
    dg_tensor *zz;
    run_ok(s, &x, &xt, 1, &z, &zz, 1, NULL, 0);
    double wz[4] = {8, 12, 18, 26};
    assert_f64s(zz, wz, 4, 0);
    dg_tensor_unref(zz);
    // Many runs of one signature.
    for (int i = 0; i < 50; i++) {
        run_ok(s, &x, &xt, 1, &y, &first, 1, NULL, 0);
        assert_f64s(first, want, 4, 0);
        dg_tensor_unref(first);
    }
    dg_tensor_unref(xt);
    dg_tensor_unref(zt);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Variables

static void test_variables_persist_and_assign(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double v0[3] = {1, 2, 3};
    dg_tensor *t0 = tf64(dg_shape1(3), v0);
    dg_output v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(3), dg_init_tensor(t0));
    dg_tensor_unref(t0);   // the variable's initializer keeps its own reference
    double d[3] = {10, 20, 30};
    dg_output delta = cf64(g, "delta", dg_shape1(3), d);
    dg_output add = dg_assign_add(g, "add", v, delta);
    dg_output sub = dg_assign_sub(g, "sub", v, delta);
    dg_output set = dg_assign(g, "set", v, dg_mul(g, NULL, v, dg_scalar(g, NULL, DG_FLOAT64, 2)));
    dg_output is_init = dg_is_variable_initialized(g, "is_init", v);
    assert_true(dg_graph_ok(g));
    assert_int_equal(dg_output_dtype(is_init), DG_BOOL);
    dg_session *s = new_session(g);

    dg_tensor *b = fetch1(s, is_init);
    assert_int_equal(dg_tensor_dtype(b), DG_BOOL);
    assert_false(((uint8_t *)dg_tensor_data(b))[0]);
    dg_tensor_unref(b);
    target_ok(s, dg_variable_initializer(v));
    b = fetch1(s, is_init);
    assert_true(((uint8_t *)dg_tensor_data(b))[0]);
    dg_tensor_unref(b);

    dg_tensor *out = fetch1(s, add);   // the op's output is the new value
    double w1[3] = {11, 22, 33};
    assert_f64s(out, w1, 3, 0);
    dg_tensor_unref(out);
    out = fetch1(s, v);   // kept between runs
    assert_f64s(out, w1, 3, 0);
    dg_tensor_unref(out);
    target_ok(s, sub.node);
    target_ok(s, sub.node);
    out = fetch1(s, v);
    double w2[3] = {-9, -18, -27};
    assert_f64s(out, w2, 3, 0);
    dg_tensor_unref(out);
    out = fetch1(s, set);
    double w3[3] = {-18, -36, -54};
    assert_f64s(out, w3, 3, 0);
    dg_tensor_unref(out);
    // Re-running the initializer restores the initial value.
    target_ok(s, dg_variable_initializer(v));
    out = fetch1(s, v);
    assert_f64s(out, v0, 3, 0);
    dg_tensor_unref(out);
    // A second session has its own variables.
    dg_session *s2 = new_session(g);
    run_fails(s2, NULL, NULL, 0, &v, 1, NULL, 0, DG_FAILED_PRECONDITION, "uninitialized");
    dg_session_free(&s2);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_assign_errors(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(3), dg_init_zeros());
    dg_output a = dg_assign(g, "a", v, dg_const_i64s(g, NULL, (const int64_t[]){1, 2, 3}, 3));
    assert_null(a.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "node \"a\" (Assign): inputs 0 and 1 must have the same dtype");
    dg_graph_free(&g);

    g = dg_graph_new();
    v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(3), dg_init_zeros());
    dg_output p = dg_placeholder(g, "p", DG_FLOAT64, dg_shape1(4));
    a = dg_assign_add(g, "a", v, p);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "variable \"v\" has shape [3], value has shape [4]");
    dg_graph_free(&g);

    // A value of unknown shape is checked when it arrives.
    g = dg_graph_new();
    v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(3), dg_init_zeros());
    p = dg_placeholder(g, "p", DG_FLOAT64, dg_shape_unknown());
    a = dg_assign(g, "a", v, p);
    dg_session *s = new_session(g);
    double d4[4] = {0};
    dg_tensor *t4 = tf64(dg_shape1(4), d4);
    run_fails(s, &p, &t4, 1, NULL, 0, &a.node, 1, DG_INVALID_ARGUMENT,
              "assigning shape [4] to variable \"v\" of shape [3]");
    dg_tensor_unref(t4);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// A fetched value is a snapshot: later updates of the variable do not change it.
static void test_fetch_is_a_copy(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output v = dg_variable(g, "v", DG_FLOAT64, dg_shape1(2), dg_init_constant(5));
    dg_output rd = dg_identity(g, "read", v);
    dg_output rs = dg_reshape(g, "rs", v, (const int64_t[]){2, 1}, 2);
    dg_output inc = dg_assign_add(g, "inc", v, dg_ones_like(g, NULL, v));
    dg_session *s = new_session(g);
    target_ok(s, dg_global_variables_initializer(g));
    dg_tensor *direct = fetch1(s, v), *through_identity = fetch1(s, rd), *through_reshape = fetch1(s, rs);
    dg_tensor *from_update = fetch1(s, inc);   // 6
    target_ok(s, inc.node);                     // 7
    target_ok(s, dg_global_variables_initializer(g));   // 5 again
    target_ok(s, inc.node);                     // 6
    double five[2] = {5, 5}, six[2] = {6, 6};
    assert_f64s(direct, five, 2, 0);
    assert_f64s(through_identity, five, 2, 0);
    assert_f64s(through_reshape, five, 2, 0);
    assert_f64s(from_update, six, 2, 0);
    // Writing into a fetched tensor does not change the variable either.
    dg_tensor_f64(direct)[0] = 100;
    dg_tensor_f64(through_identity)[0] = 100;
    dg_tensor *now = fetch1(s, v);
    assert_f64s(now, six, 2, 0);
    dg_tensor_unref(now);
    dg_tensor_unref(direct);
    dg_tensor_unref(through_identity);
    dg_tensor_unref(through_reshape);
    dg_tensor_unref(from_update);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Random initializers and ops

// Builds a graph with one variable initialised by init and returns its value.
static dg_tensor *init_value(dg_initializer init, dg_dtype dt, int64_t graph_seed, int n_before) {
    dg_graph *g = dg_graph_new();
    if (graph_seed) dg_graph_set_random_seed(g, graph_seed);
    for (int i = 0; i < n_before; i++) dg_no_op(g, NULL);
    dg_output v = dg_variable(g, "v", dt, dg_shape2(20, 50), init);
    dg_session *s = new_session(g);
    target_ok(s, dg_global_variables_initializer(g));
    dg_tensor *t = fetch1(s, v);
    dg_session_free(&s);
    dg_graph_free(&g);
    return t;
}

static bool same_values(const dg_tensor *a, const dg_tensor *b) {
    return dg_tensor_nbytes(a) == dg_tensor_nbytes(b) &&
           memcmp(dg_tensor_data(a), dg_tensor_data(b), dg_tensor_nbytes(a)) == 0;
}

static void test_random_initializers_reproducible(void **state) {
    (void)state;
    dg_initializer inits[3] = {dg_init_random_uniform(-1, 1, 7), dg_init_random_normal(0, 1, 7),
                               dg_init_truncated_normal(0, 1, 7)};
    for (int k = 0; k < 3; k++)
        for (int d = 0; d < 2; d++) {
            dg_dtype dt = d ? DG_FLOAT64 : DG_FLOAT32;
            dg_tensor *a = init_value(inits[k], dt, 0, 0), *b = init_value(inits[k], dt, 0, 0);
            dg_initializer other = inits[k];
            other.seed = 8;
            dg_tensor *c = init_value(other, dt, 0, 0);
            assert_true(same_values(a, b));
            assert_false(same_values(a, c));
            // Not constant.
            bool varied = false;
            for (int64_t i = 1; i < 1000 && !varied; i++)
                varied = dg_tensor_get_as_double(a, i) != dg_tensor_get_as_double(a, 0);
            assert_true(varied);
            dg_tensor_unref(a);
            dg_tensor_unref(b);
            dg_tensor_unref(c);
        }
    // Seed 0: from the graph seed and the creation order, deterministically.
    dg_initializer z = dg_init_random_uniform(0, 1, 0);
    dg_tensor *a = init_value(z, DG_FLOAT64, 5, 0), *b = init_value(z, DG_FLOAT64, 5, 0);
    dg_tensor *c = init_value(z, DG_FLOAT64, 6, 0), *d = init_value(z, DG_FLOAT64, 5, 3);
    assert_true(same_values(a, b));
    assert_false(same_values(a, c));
    assert_false(same_values(a, d));
    dg_tensor_unref(a);
    dg_tensor_unref(b);
    dg_tensor_unref(c);
    dg_tensor_unref(d);
}

static void test_random_value_ranges(void **state) {
    (void)state;
    // Uniform in [lo, hi).
    dg_tensor *u = init_value(dg_init_random_uniform(2, 3, 11), DG_FLOAT64, 0, 0);
    double sum = 0;
    for (int64_t i = 0; i < 1000; i++) {
        double x = dg_tensor_f64(u)[i];
        assert_true(x >= 2 && x < 3);
        sum += x;
    }
    assert_close(sum / 1000, 2.5, 0.05, 0);
    dg_tensor_unref(u);
    // Normal: mean and stddev roughly right.
    dg_tensor *n = init_value(dg_init_random_normal(1, 2, 12), DG_FLOAT64, 0, 0);
    double m = 0, m2 = 0;
    for (int64_t i = 0; i < 1000; i++) m += dg_tensor_f64(n)[i];
    m /= 1000;
    for (int64_t i = 0; i < 1000; i++) m2 += pow(dg_tensor_f64(n)[i] - m, 2);
    assert_close(m, 1, 0.25, 0);
    assert_close(sqrt(m2 / 999), 2, 0.25, 0);
    dg_tensor_unref(n);
    // Truncated normal: within two standard deviations of the mean.
    for (int d = 0; d < 2; d++) {
        dg_tensor *t = init_value(dg_init_truncated_normal(1, 0.5, 13), d ? DG_FLOAT64 : DG_FLOAT32, 0, 0);
        double lo = 1e9, hi = -1e9;
        for (int64_t i = 0; i < 1000; i++) {
            double x = dg_tensor_get_as_double(t, i);
            if (!(x >= 0 && x <= 2)) fail_msg("truncated normal element %lld is %g", (long long)i, x);
            if (x < lo) lo = x;
            if (x > hi) hi = x;
        }
        assert_true(lo < 0.2 && hi > 1.8);   // and not squeezed
        dg_tensor_unref(t);
    }
}

// Random ops draw anew on every run, reproducibly across sessions.
static void test_random_ops_per_run(void **state) {
    (void)state;
    dg_tensor *runs[2][2];
    for (int k = 0; k < 2; k++) {
        dg_graph *g = dg_graph_new();
        dg_output r = dg_random_normal(g, "r", DG_FLOAT64, dg_shape1(8), 0, 1, 99);
        dg_session *s = new_session(g);
        runs[k][0] = fetch1(s, r);
        runs[k][1] = fetch1(s, r);
        dg_session_free(&s);
        dg_graph_free(&g);
    }
    assert_false(same_values(runs[0][0], runs[0][1]));
    assert_true(same_values(runs[0][0], runs[1][0]));
    assert_true(same_values(runs[0][1], runs[1][1]));
    for (int k = 0; k < 2; k++) {
        dg_tensor_unref(runs[k][0]);
        dg_tensor_unref(runs[k][1]);
    }
    dg_graph *g = dg_graph_new();
    dg_output bad = dg_random_uniform(g, "r", DG_INT64, dg_shape1(2), 0, 1, 1);
    assert_null(bad.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "random ops need a float dtype and a fully defined shape");
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Threads

// Eight independent branches of matmuls joined at the end.
static dg_output branches(dg_graph *g, dg_output x) {
    dg_output parts[8];
    for (int b = 0; b < 8; b++) {
        dg_output h = x;
        for (int d = 0; d < 3; d++) {
            h = dg_tanh(g, NULL, dg_matmul(g, NULL, h, x, false, b % 2 == 1));
            h = dg_mul(g, NULL, h, dg_scalar(g, NULL, DG_FLOAT64, 0.5 + 0.1 * b));
        }
        int64_t axis = b % 2;
        parts[b] = dg_sum(g, NULL, h, &axis, 1, false);
    }
    return dg_add_n(g, "total", parts, 8);
}

#define TN 24

static dg_tensor *branch_input(int seed) {
    uint64_t rng = (uint64_t)seed * 1000 + 1;
    double v[TN * TN];
    for (int i = 0; i < TN * TN; i++) v[i] = dg_test_uniform(&rng, -0.3, 0.3);
    return tf64(dg_shape2(TN, TN), v);
}

static void test_inter_op_threads_match_inline(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(TN, TN));
    dg_output total = branches(g, x);
    assert_true(dg_graph_ok(g));
    dg_session *inl = new_session_threads(g, 1), *par = new_session_threads(g, 2);
    dg_session *many = new_session_threads(g, 4);
    for (int k = 0; k < 4; k++) {
        dg_tensor *xt = branch_input(k), *a, *b, *c;
        run_ok(inl, &x, &xt, 1, &total, &a, 1, NULL, 0);
        run_ok(par, &x, &xt, 1, &total, &b, 1, NULL, 0);
        run_ok(many, &x, &xt, 1, &total, &c, 1, NULL, 0);
        assert_true(same_values(a, b));
        assert_true(same_values(a, c));
        dg_tensor_unref(a);
        dg_tensor_unref(b);
        dg_tensor_unref(c);
        dg_tensor_unref(xt);
    }
    // Errors come back from pool threads too.
    run_fails(par, NULL, NULL, 0, &total, 1, NULL, 0, DG_INVALID_ARGUMENT, "you must feed");
    dg_session_free(&inl);
    dg_session_free(&par);
    dg_session_free(&many);
    dg_graph_free(&g);
}

typedef struct worker {
    dg_session *s;
    dg_output x, fetch;
    dg_tensor *inputs[3];
    dg_tensor *want[3];
    int n_runs;
    int failures;
    char msg[256];
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    dg_status *st = dg_status_new();
    for (int r = 0; r < w->n_runs; r++) {
        int k = r % 3;
        dg_tensor *out = NULL;
        if (!dg_session_run(w->s, &w->x, &w->inputs[k], 1, &w->fetch, &out, 1, NULL, 0, st)) {
            if (!w->failures++) snprintf(w->msg, sizeof w->msg, "run %d: %s", r, dg_status_message(st));
            continue;
        }
        if (!same_values(out, w->want[k]) && !w->failures++)
            snprintf(w->msg, sizeof w->msg, "run %d: wrong values", r);
        dg_tensor_unref(out);
    }
    dg_status_free(&st);
    return NULL;
}

// Two threads call dg_session_run on one session at once: one signature shared, one not.
static void test_concurrent_runs(void **state) {
    (void)state;
    for (int inter = 1; inter <= 2; inter++) {
        dg_graph *g = dg_graph_new();
        dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(TN, TN));
        dg_output total = branches(g, x);
        dg_output other = dg_sum(g, "other", dg_exp(g, NULL, x), NULL, 0, false);
        dg_session *ref = new_session(g);
        dg_session *s = new_session_threads(g, inter);
        worker w[3];
        memset(w, 0, sizeof w);
        for (int t = 0; t < 3; t++) {
            w[t].s = s;
            w[t].x = x;
            w[t].fetch = t == 2 ? other : total;
            w[t].n_runs = 30;
            for (int k = 0; k < 3; k++) {
                w[t].inputs[k] = branch_input(k + 3 * t);
                run_ok(ref, &x, &w[t].inputs[k], 1, &w[t].fetch, &w[t].want[k], 1, NULL, 0);
            }
        }
        pthread_t th[3];
        for (int t = 0; t < 3; t++) assert_int_equal(pthread_create(&th[t], NULL, worker_main, &w[t]), 0);
        for (int t = 0; t < 3; t++) pthread_join(th[t], NULL);
        for (int t = 0; t < 3; t++) {
            if (w[t].failures) fail_msg("thread %d: %d failures, first: %s", t, w[t].failures, w[t].msg);
            for (int k = 0; k < 3; k++) {
                dg_tensor_unref(w[t].inputs[k]);
                dg_tensor_unref(w[t].want[k]);
            }
        }
        dg_session_free(&ref);
        dg_session_free(&s);
        dg_graph_free(&g);
    }
}

#define RAND_N 1024

typedef struct rand_worker {
    dg_session *s;
    dg_output r;
    double *draws;   // n_runs * RAND_N values
    int n_runs;
    int failures;
} rand_worker;

static void *rand_worker_main(void *arg) {
    rand_worker *w = arg;
    dg_status *st = dg_status_new();
    for (int i = 0; i < w->n_runs; i++) {
        dg_tensor *out = NULL;
        if (!dg_session_run(w->s, NULL, NULL, 0, &w->r, &out, 1, NULL, 0, st)) {
            w->failures++;
            continue;
        }
        memcpy(w->draws + RAND_N * i, dg_tensor_f64(out), RAND_N * sizeof(double));
        dg_tensor_unref(out);
    }
    dg_status_free(&st);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Two threads draw from one random op at once: every draw is in range and none repeats
// (the generator's state is not shared unguarded).
static void test_concurrent_random_ops(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output r = dg_random_uniform(g, "r", DG_FLOAT64, dg_shape1(RAND_N), 0, 1, 5);
    dg_session *s = new_session(g);
    enum { RUNS = 40 };
    rand_worker w[2];
    double *all = calloc(2 * RUNS * RAND_N, sizeof *all);
    assert_non_null(all);
    pthread_t th[2];
    for (int t = 0; t < 2; t++) {
        w[t] = (rand_worker){s, r, all + t * RUNS * RAND_N, RUNS, 0};
        assert_int_equal(pthread_create(&th[t], NULL, rand_worker_main, &w[t]), 0);
    }
    for (int t = 0; t < 2; t++) pthread_join(th[t], NULL);
    assert_int_equal(w[0].failures + w[1].failures, 0);
    for (int i = 0; i < 2 * RUNS * RAND_N; i++) assert_true(all[i] >= 0 && all[i] < 1);
    qsort(all, 2 * RUNS * RAND_N, sizeof *all, cmp_double);
    for (int i = 1; i < 2 * RUNS * RAND_N; i++)
        if (all[i] == all[i - 1]) fail_msg("draw %.17g repeats", all[i]);
    free(all);
    dg_session_free(&s);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Forward values against hand-computed references

static void test_forward_softmax_xent(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double lv[6] = {1, 2, 3, 0, 0, 0}, pv[6] = {0, 0, 1, 0.5, 0.5, 0};
    dg_output logits = cf64(g, "logits", dg_shape2(2, 3), lv);
    dg_output labels = cf64(g, "labels", dg_shape2(2, 3), pv);
    int64_t idv[2] = {2, 0};
    dg_tensor *idt = ti64(dg_shape1(2), idv);
    dg_output ids = dg_const(g, "ids", idt);
    dg_tensor_unref(idt);
    dg_output sm = dg_softmax(g, NULL, logits);
    dg_output lsm = dg_log_softmax(g, NULL, logits);
    dg_output xent = dg_softmax_cross_entropy_with_logits(g, "xent", logits, labels);
    dg_output sxent = dg_sparse_softmax_cross_entropy_with_logits(g, "sxent", logits, ids);
    dg_output loss = dg_sparse_softmax_cross_entropy(g, NULL, logits, ids);
    dg_output bp = {xent.node, 1};
    assert_true(dg_graph_ok(g));
    assert_int_equal(dg_node_num_outputs(xent.node), 2);
    dg_session *s = new_session(g);
    dg_output fetches[6] = {sm, lsm, xent, sxent, loss, bp};
    dg_tensor *out[6];
    run_ok(s, NULL, NULL, 0, fetches, out, 6, NULL, 0);
    double z = exp(1) + exp(2) + exp(3);
    double wsm[6] = {exp(1) / z, exp(2) / z, exp(3) / z, 1.0 / 3, 1.0 / 3, 1.0 / 3};
    double wlsm[6];
    for (int i = 0; i < 6; i++) wlsm[i] = log(wsm[i]);
    double wx[2] = {-log(wsm[2]), -0.5 * log(1.0 / 3) * 2};
    double wsx[2] = {-log(wsm[2]), -log(1.0 / 3)};
    double wloss = (wsx[0] + wsx[1]) / 2;
    double wbp[6];
    for (int i = 0; i < 6; i++) wbp[i] = wsm[i] - pv[i];
    assert_f64s(out[0], wsm, 6, 1e-15);
    assert_f64s(out[1], wlsm, 6, 1e-15);
    assert_f64s(out[2], wx, 2, 1e-15);
    assert_f64s(out[3], wsx, 2, 1e-15);
    assert_f64s(out[4], &wloss, 1, 1e-15);
    assert_int_equal(dg_tensor_rank(out[4]), 0);
    assert_f64s(out[5], wbp, 6, 1e-15);
    for (int i = 0; i < 6; i++) dg_tensor_unref(out[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_forward_reductions(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double xv[6] = {1, 2, 3, 4, 5, 6};
    dg_output x = cf64(g, "x", dg_shape2(2, 3), xv);
    int64_t a0 = 0, a1 = 1, am1 = -1;
    dg_output f[7] = {
        dg_sum(g, NULL, x, &a0, 1, false), dg_sum(g, NULL, x, &a1, 1, false),
        dg_mean(g, NULL, x, NULL, 0, false), dg_max(g, NULL, x, &a1, 1, true),
        dg_sum(g, NULL, x, NULL, 0, true), dg_mean(g, NULL, x, &am1, 1, false),
        dg_max(g, NULL, x, NULL, 0, false),
    };
    assert_true(dg_graph_ok(g));
    // Static shapes agree with the values'.
    assert_int_equal(dg_output_shape(f[3]).rank, 2);
    assert_int_equal(dg_output_shape(f[3]).dims[1], 1);
    dg_session *s = new_session(g);
    dg_tensor *out[7];
    run_ok(s, NULL, NULL, 0, f, out, 7, NULL, 0);
    double w0[3] = {5, 7, 9}, w1[2] = {6, 15}, w2 = 3.5, w3[2] = {3, 6}, w4 = 21, w5[2] = {2, 5}, w6 = 6;
    int64_t d3[1] = {3}, d2[1] = {2}, d21[2] = {2, 1}, d11[2] = {1, 1};
    assert_f64s(out[0], w0, 3, 0);
    assert_shape(out[0], 1, d3);
    assert_f64s(out[1], w1, 2, 0);
    assert_shape(out[1], 1, d2);
    assert_f64s(out[2], &w2, 1, 0);
    assert_shape(out[2], 0, NULL);
    assert_f64s(out[3], w3, 2, 0);
    assert_shape(out[3], 2, d21);
    assert_f64s(out[4], &w4, 1, 0);
    assert_shape(out[4], 2, d11);
    assert_f64s(out[5], w5, 2, 0);
    assert_f64s(out[6], &w6, 1, 0);
    for (int i = 0; i < 7; i++) dg_tensor_unref(out[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_forward_argmax_equal_cast(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double xv[6] = {1, 3, 2, 7, 5, 6}, yv[6] = {1, 0, 2, 0, 5, 0}, cv[4] = {1.7, -1.7, 0, 2.5};
    dg_output x = cf64(g, "x", dg_shape2(2, 3), xv);
    dg_output y = cf64(g, "y", dg_shape2(2, 3), yv);
    dg_output c = cf64(g, "c", dg_shape1(4), cv);
    dg_output am1 = dg_argmax(g, NULL, x, 1), am0 = dg_argmax(g, NULL, x, 0);
    dg_output eq = dg_equal(g, NULL, x, y);
    dg_output to_i = dg_cast(g, NULL, c, DG_INT64);
    dg_output back = dg_cast(g, NULL, to_i, DG_FLOAT64);
    dg_output to_b = dg_cast(g, NULL, c, DG_BOOL);
    dg_output to_f = dg_cast(g, NULL, c, DG_FLOAT32);
    // The usual accuracy: mean(cast(equal(argmax(logits), labels))).
    int64_t lab[2] = {1, 2};
    dg_tensor *lt = ti64(dg_shape1(2), lab);
    dg_output acc = dg_mean(g, NULL, dg_cast(g, NULL, dg_equal(g, NULL, am1, dg_const(g, NULL, lt)), DG_FLOAT64),
                            NULL, 0, false);
    dg_tensor_unref(lt);
    assert_true(dg_graph_ok(g));
    assert_int_equal(dg_output_dtype(am1), DG_INT64);
    assert_int_equal(dg_output_dtype(eq), DG_BOOL);
    dg_session *s = new_session(g);
    dg_output f[8] = {am1, am0, eq, to_i, back, to_b, to_f, acc};
    dg_tensor *out[8];
    run_ok(s, NULL, NULL, 0, f, out, 8, NULL, 0);
    int64_t w_am1[2] = {1, 0}, w_am0[3] = {1, 1, 1}, w_i[4] = {1, -1, 0, 2};
    uint8_t w_eq[6] = {1, 0, 1, 0, 1, 0}, w_b[4] = {1, 1, 0, 1};
    for (int i = 0; i < 2; i++) assert_int_equal(dg_tensor_i64(out[0])[i], w_am1[i]);
    for (int i = 0; i < 3; i++) assert_int_equal(dg_tensor_i64(out[1])[i], w_am0[i]);
    assert_int_equal(dg_tensor_dtype(out[2]), DG_BOOL);
    assert_memory_equal(dg_tensor_data(out[2]), w_eq, 6);
    for (int i = 0; i < 4; i++) assert_int_equal(dg_tensor_i64(out[3])[i], w_i[i]);
    double w_back[4] = {1, -1, 0, 2};
    assert_f64s(out[4], w_back, 4, 0);
    assert_memory_equal(dg_tensor_data(out[5]), w_b, 4);
    assert_int_equal(dg_tensor_dtype(out[6]), DG_FLOAT32);
    for (int i = 0; i < 4; i++) assert_true(dg_tensor_f32(out[6])[i] == (float)cv[i]);
    double w_acc = 0.5;
    assert_f64s(out[7], &w_acc, 1, 0);
    for (int i = 0; i < 8; i++) dg_tensor_unref(out[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_forward_shapes(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double xv[6] = {1, 2, 3, 4, 5, 6}, yv[2] = {7, 8};
    dg_output x = cf64(g, "x", dg_shape2(2, 3), xv);
    dg_output y = cf64(g, "y", dg_shape2(2, 1), yv);
    dg_output xs[2] = {x, y};
    dg_output cat1 = dg_concat(g, NULL, xs, 2, 1);   // [2,4]
    dg_output xx[2] = {x, x};
    dg_output cat0 = dg_concat(g, NULL, xx, 2, -2);   // [4,3]
    dg_output parts[3];
    assert_true(dg_split(g, NULL, x, 1, 3, parts));
    int64_t b[2] = {0, 1}, sz[2] = {-1, 2};
    dg_output sl = dg_slice(g, NULL, x, b, sz, 2);
    int64_t flat[1] = {-1}, r3[2] = {3, -1};
    dg_output rf = dg_reshape(g, NULL, x, flat, 1), r32 = dg_reshape(g, NULL, x, r3, 2);
    dg_output shp = dg_shape_of(g, NULL, r32);
    dg_output fill = dg_fill(g, NULL, dg_const_i64s(g, NULL, (const int64_t[]){2, 2}, 2),
                             dg_scalar(g, NULL, DG_FLOAT64, 1.5));
    assert_true(dg_graph_ok(g));
    assert_int_equal(dg_output_shape(r32).dims[1], 2);   // inferred statically
    assert_int_equal(dg_output_shape(cat1).dims[1], 4);
    dg_session *s = new_session(g);
    dg_output f[9] = {cat1, cat0, parts[0], parts[2], sl, rf, r32, shp, fill};
    dg_tensor *out[9];
    run_ok(s, NULL, NULL, 0, f, out, 9, NULL, 0);
    double w_cat1[8] = {1, 2, 3, 7, 4, 5, 6, 8};
    double w_cat0[12] = {1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6};
    double w_p0[2] = {1, 4}, w_p2[2] = {3, 6}, w_sl[4] = {2, 3, 5, 6}, w_fill[4] = {1.5, 1.5, 1.5, 1.5};
    int64_t d24[2] = {2, 4}, d43[2] = {4, 3}, d21[2] = {2, 1}, d22[2] = {2, 2}, d6[1] = {6}, d32[2] = {3, 2};
    assert_f64s(out[0], w_cat1, 8, 0);
    assert_shape(out[0], 2, d24);
    assert_f64s(out[1], w_cat0, 12, 0);
    assert_shape(out[1], 2, d43);
    assert_f64s(out[2], w_p0, 2, 0);
    assert_shape(out[2], 2, d21);
    assert_f64s(out[3], w_p2, 2, 0);
    assert_f64s(out[4], w_sl, 4, 0);
    assert_shape(out[4], 2, d22);
    assert_f64s(out[5], xv, 6, 0);
    assert_shape(out[5], 1, d6);
    assert_f64s(out[6], xv, 6, 0);
    assert_shape(out[6], 2, d32);
    assert_int_equal(dg_tensor_dtype(out[7]), DG_INT64);
    assert_int_equal(dg_tensor_i64(out[7])[0], 3);
    assert_int_equal(dg_tensor_i64(out[7])[1], 2);
    assert_f64s(out[8], w_fill, 4, 0);
    assert_shape(out[8], 2, d22);
    for (int i = 0; i < 9; i++) dg_tensor_unref(out[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
}

static void test_forward_math(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    double xv[6] = {1, -2, 3, -4, 5, -6}, rv[3] = {10, 20, 30}, cv[2] = {100, 200};
    dg_output x = cf64(g, "x", dg_shape2(2, 3), xv);
    dg_output row = cf64(g, "row", dg_shape1(3), rv);
    dg_output col = cf64(g, "col", dg_shape2(2, 1), cv);
    dg_output crow = cf64(g, "crow", dg_shape2(1, 3), rv);
    dg_output f[10] = {
        dg_add(g, NULL, x, row),                    // [2,3] + [3]
        dg_add(g, NULL, col, crow),                 // [2,1] + [1,3]
        dg_sub(g, NULL, dg_scalar(g, NULL, DG_FLOAT64, 1), x),
        dg_maximum(g, NULL, x, dg_scalar(g, NULL, DG_FLOAT64, 0)),
        dg_relu(g, NULL, x),
        dg_bias_add(g, NULL, x, row),
        dg_matmul(g, NULL, x, x, false, true),      // x x^T [2,2]
        dg_matmul(g, NULL, x, x, true, false),      // x^T x [3,3]
        dg_clip_by_value(g, NULL, x, dg_scalar(g, NULL, DG_FLOAT64, -2), dg_scalar(g, NULL, DG_FLOAT64, 3)),
        dg_div(g, NULL, row, col),                  // [3] / [2,1]
    };
    assert_true(dg_graph_ok(g));
    dg_session *s = new_session(g);
    dg_tensor *out[10];
    run_ok(s, NULL, NULL, 0, f, out, 10, NULL, 0);
    double w0[6] = {11, 18, 33, 6, 25, 24};
    double w1[6] = {110, 120, 130, 210, 220, 230};
    double w2[6] = {0, 3, -2, 5, -4, 7};
    double w3[6] = {1, 0, 3, 0, 5, 0};
    double w6[4] = {14, -32, -32, 77};
    double w7[9] = {17, -22, 27, -22, 29, -36, 27, -36, 45};
    double w8[6] = {1, -2, 3, -2, 3, -2};
    double w9[6] = {0.1, 0.2, 0.3, 0.05, 0.1, 0.15};
    int64_t d23[2] = {2, 3}, d22[2] = {2, 2}, d33[2] = {3, 3};
    assert_f64s(out[0], w0, 6, 0);
    assert_f64s(out[1], w1, 6, 0);
    assert_shape(out[1], 2, d23);
    assert_f64s(out[2], w2, 6, 0);
    assert_f64s(out[3], w3, 6, 0);
    assert_f64s(out[4], w3, 6, 0);
    assert_f64s(out[5], w0, 6, 0);
    assert_f64s(out[6], w6, 4, 1e-15);
    assert_shape(out[6], 2, d22);
    assert_f64s(out[7], w7, 9, 1e-15);
    assert_shape(out[7], 2, d33);
    assert_f64s(out[8], w8, 6, 0);
    assert_f64s(out[9], w9, 6, 1e-15);
    assert_shape(out[9], 2, d23);
    for (int i = 0; i < 10; i++) dg_tensor_unref(out[i]);
    dg_session_free(&s);
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_new_errors),
        cmocka_unit_test(test_shape_mismatch_at_build),
        cmocka_unit_test(test_unknown_input),
        cmocka_unit_test(test_cycle),
        cmocka_unit_test(test_bad_fetches_and_targets),
        cmocka_unit_test(test_bad_feeds),
        cmocka_unit_test(test_run_time_errors),
        cmocka_unit_test(test_uninitialized_variable),
        cmocka_unit_test(test_feeds_fetches_targets),
        cmocka_unit_test(test_pruning),
        cmocka_unit_test(test_cache_reuse),
        cmocka_unit_test(test_variables_persist_and_assign),
        cmocka_unit_test(test_assign_errors),
        cmocka_unit_test(test_fetch_is_a_copy),
        cmocka_unit_test(test_random_initializers_reproducible),
        cmocka_unit_test(test_random_value_ranges),
        cmocka_unit_test(test_random_ops_per_run),
        cmocka_unit_test(test_inter_op_threads_match_inline),
        cmocka_unit_test(test_concurrent_runs),
        cmocka_unit_test(test_concurrent_random_ops),
        cmocka_unit_test(test_forward_softmax_xent),
        cmocka_unit_test(test_forward_reductions),
        cmocka_unit_test(test_forward_argmax_equal_cast),
        cmocka_unit_test(test_forward_shapes),
        cmocka_unit_test(test_forward_math),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
