/* Tests for graph/graph.c: naming, name scopes, device scopes and functions, control
 * dependencies, colocation, collections and variable scopes, after TensorFlow's
 * ops_test.py (name_scope, device, control_dependencies, colocate_with, collections) and
 * variable_scope_test.py. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dg_output ph(dg_graph *g, const char *name) {
    return dg_placeholder(g, name, DG_FLOAT32, dg_shape1(2));
}

static const char *name_of(dg_output o) {
    assert_non_null(o.node);
    return dg_node_name(o.node);
}

static void assert_graph_ok(const dg_graph *g) { assert_ok(dg_graph_status(g)); }

// ---------------------------------------------------------------------------------------
// Names and name scopes

static void test_unique_names(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "a");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "a_1");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "a_2");
    // No name: the op type.
    assert_string_equal(name_of(dg_identity(g, NULL, x)), "Identity");
    assert_string_equal(name_of(dg_identity(g, NULL, x)), "Identity_1");
    // An explicit "b_1" is taken first: "b" then skips to "b_2".
    assert_string_equal(name_of(dg_identity(g, "b_1", x)), "b_1");
    assert_string_equal(name_of(dg_identity(g, "b", x)), "b");
    assert_string_equal(name_of(dg_identity(g, "b", x)), "b_2");
    // Asking for a generated name again uniquifies it too.
    assert_string_equal(name_of(dg_identity(g, "a_1", x)), "a_1_1");
    assert_string_equal(dg_graph_unique_name(g, "a"), "a_3");
    assert_string_equal(dg_graph_unique_name(g, "fresh"), "fresh");
    assert_string_equal(dg_graph_unique_name(g, "fresh"), "fresh_1");
    assert_graph_ok(g);
    assert_int_equal(dg_graph_num_nodes(g), 10);
    assert_non_null(dg_graph_find(g, "a_2"));
    assert_null(dg_graph_find(g, "fresh"));   // reserved, but no node
    assert_null(dg_graph_find(g, "nope"));
    assert_null(dg_graph_find(g, NULL));
    // Creation order.
    assert_string_equal(dg_node_name(dg_graph_node(g, 0)), "x");
    assert_string_equal(dg_node_name(dg_graph_node(g, 1)), "a");
    assert_null(dg_graph_node(g, 10));
    assert_null(dg_graph_node(g, -1));
    dg_graph_free(&g);
    assert_null(g);
    dg_graph_free(&g);
    dg_graph_free(NULL);
}

static void test_name_scopes(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    dg_graph_push_name_scope(g, "s");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "s/a");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "s/a_1");
    dg_graph_push_name_scope(g, "t");
    assert_string_equal(name_of(dg_identity(g, NULL, x)), "s/t/Identity");
    assert_string_equal(dg_graph_unique_name(g, "u"), "s/t/u");
    dg_graph_pop_name_scope(g);
    assert_string_equal(name_of(dg_identity(g, "b", x)), "s/b");
    dg_graph_pop_name_scope(g);
    assert_string_equal(name_of(dg_identity(g, "a", x)), "a");
    // The same scope again is made unique, like a node name.
    dg_graph_push_name_scope(g, "s");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "s_1/a");
    dg_graph_pop_name_scope(g);
    dg_graph_push_name_scope(g, "s");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "s_2/a");
    dg_graph_pop_name_scope(g);
    // A scope named like an existing node is made unique too.
    dg_graph_push_name_scope(g, "x");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "x_1/a");
    dg_graph_pop_name_scope(g);
    // Inside a scope, repeated inner scopes are unique per level.
    dg_graph_push_name_scope(g, "outer");
    dg_graph_push_name_scope(g, "inner");
    dg_graph_pop_name_scope(g);
    dg_graph_push_name_scope(g, "inner");
    assert_string_equal(name_of(dg_identity(g, "a", x)), "outer/inner_1/a");
    dg_graph_pop_name_scope(g);
    dg_graph_pop_name_scope(g);
    // Op builders that make several nodes put them under their own scope.
    dg_output z = dg_zeros(g, NULL, DG_FLOAT32, dg_shape1(2));
    assert_string_equal(name_of(z), "zeros/Const");
    assert_graph_ok(g);
    dg_graph_free(&g);
}

static void test_name_scope_errors(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_pop_name_scope(g);
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "pop_name_scope without a matching push");
    assert_false(dg_graph_ok(g));
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_graph_push_name_scope(g, "bad scope");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "name scope \"bad scope\" is not a valid name");
    dg_graph_pop_name_scope(g);   // balanced: the push still pushed
    dg_graph_free(&g);
}

static void expect_bad_name(const char *name) {
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    dg_output y = dg_identity(g, name, x);
    assert_null(y.node);
    char needle[128];
    snprintf(needle, sizeof needle, "\"%s\" is not a valid node name", name);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, needle);
    assert_int_equal(dg_graph_num_nodes(g), 1);
    dg_graph_free(&g);
}

static void test_invalid_node_names(void **state) {
    (void)state;
    expect_bad_name("");
    expect_bad_name("a b");
    expect_bad_name("-a");
    expect_bad_name("/a");
    expect_bad_name("a:0");
    expect_bad_name("a//b");
    expect_bad_name("caf\xc3\xa9");
    // The same rules hold for the names builders make under a name.
    dg_graph *g0 = dg_graph_new();
    dg_output x0 = ph(g0, "x");
    int64_t dims[1] = {-1};
    dg_output r = dg_reshape(g0, "flat", x0, dims, 1);
    assert_string_equal(name_of(r), "flat");
    assert_string_equal(dg_node_name(dg_node_input(r.node, 1).node), "flat/shape");
    dg_graph_free(&g0);
    // Valid ones.
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    assert_string_equal(name_of(dg_identity(g, "a-b.c_d/e", x)), "a-b.c_d/e");
    assert_string_equal(name_of(dg_identity(g, ".dot", x)), ".dot");
    assert_string_equal(name_of(dg_identity(g, "9lives", x)), "9lives");
    assert_graph_ok(g);
    dg_graph_free(&g);
}

// After the first error builders return the null output and add nothing.
static void test_sticky_error(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(2, 3));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT32, dg_shape2(4, 5));
    dg_output mm = dg_matmul(g, "mm", a, b, false, false);
    assert_null(mm.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "node \"mm\" (MatMul): inner dimensions differ, 3 vs 4");
    int n = dg_graph_num_nodes(g);
    dg_output ok_in_clean_graph = dg_identity(g, "id", a);
    assert_null(ok_in_clean_graph.node);
    assert_int_equal(dg_graph_num_nodes(g), n);
    // The first error stays.
    dg_graph_set_error(g, DG_INTERNAL, "later");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "inner dimensions");
    dg_status *st = dg_status_new();
    assert_false(dg_graph_check(g, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"mm\"");
    dg_status_free(&st);
    dg_graph_free(&g);
}

static void test_graph_output_lookup(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(6));
    dg_output parts[3];
    assert_true(dg_split(g, "sp", x, 0, 3, parts));
    dg_status *st = dg_status_new();
    dg_output o = dg_graph_output(g, "sp:2", st);
    assert_ok(st);
    assert_true(o.node == parts[2].node && o.index == 2);
    o = dg_graph_output(g, "sp", st);
    assert_true(o.node == parts[0].node && o.index == 0);
    char buf[64];
    assert_string_equal(dg_output_str(parts[1], buf, sizeof buf), "sp:1");
    assert_string_equal(dg_output_str(parts[0], buf, sizeof buf), "sp");
    dg_output nul = {NULL, 0};
    assert_string_equal(dg_output_str(nul, buf, sizeof buf), "<null>");
    o = dg_graph_output(g, "nope", st);
    assert_null(o.node);
    assert_status(st, DG_NOT_FOUND, "no node named \"nope\"");
    dg_status_reset(st);
    o = dg_graph_output(g, "sp:3", st);
    assert_null(o.node);
    assert_status(st, DG_NOT_FOUND, "\"sp\" (Split) has 3 outputs, asked for output 3");
    dg_status_reset(st);
    o = dg_graph_output(g, NULL, st);
    assert_status(st, DG_INVALID_ARGUMENT, "NULL");
    // Node accessors.
    dg_node *n = parts[0].node;
    assert_string_equal(dg_node_op_type(n), "Split");
    assert_int_equal(dg_node_num_outputs(n), 3);
    assert_int_equal(dg_node_num_inputs(n), 1);
    assert_true(dg_node_input(n, 0).node == x.node);
    assert_null(dg_node_input(n, 1).node);
    assert_int_equal(dg_node_output_dtype(n, 1), DG_FLOAT32);
    assert_int_equal(dg_node_output_dtype(n, 3), DG_INVALID_DTYPE);
    dg_shape s = dg_node_output_shape(n, 2);
    assert_int_equal(s.rank, 1);
    assert_int_equal(s.dims[0], 2);
    int64_t k = 0;
    assert_true(dg_node_attr_int(n, "num_split", &k));
    assert_int_equal(k, 3);
    bool bv;
    assert_false(dg_node_attr_bool(n, "num_split", &bv));   // wrong kind
    assert_false(dg_node_attr_int(n, "missing", &k));
    assert_null(dg_node_attr_string(n, "missing"));
    assert_null(dg_node_const_value(n));
    assert_string_equal(dg_node_requested_device(n), "");
    assert_string_equal(dg_node_assigned_device(n), "");
    dg_status_free(&st);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Devices

static const char *dev_of(dg_output o) { return dg_node_requested_device(o.node); }

static void test_device_scopes(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    assert_string_equal(dev_of(x), "");
    dg_graph_push_device(g, "/job:worker");
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/job:worker");
    dg_graph_push_device(g, "/device:GPU:0");
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/job:worker/device:GPU:0");
    // Inner fields win; outer fields the inner scope leaves unset stay.
    dg_graph_push_device(g, "/job:ps/task:1/cpu:0");
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/job:ps/task:1/device:CPU:0");
    dg_graph_pop_device(g);
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/job:worker/device:GPU:0");
    dg_graph_pop_device(g);
    // Canonical form: fields in order, type upper-case, legacy names converted.
    dg_graph_push_device(g, "/gpu:1/replica:0");
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/job:worker/replica:0/device:GPU:1");
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "");
    assert_graph_ok(g);
    dg_graph_pop_device(g);
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "pop_device without a matching push_device");
    dg_graph_free(&g);
}

static void test_device_scope_clears(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_graph_push_device(g, "");
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "");
    dg_graph_push_device(g, "/device:GPU:0");
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/device:GPU:0");
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
    assert_string_equal(dev_of(dg_identity(g, NULL, x)), "/job:worker/task:0");
    dg_graph_pop_device(g);
    assert_graph_ok(g);
    dg_graph_free(&g);
}

static void test_device_scope_malformed(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/bogus:1");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "device scope");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "/job:worker/bogus:1");
    dg_output x = ph(g, "x");
    assert_null(x.node);
    dg_graph_pop_device(g);
    dg_graph_free(&g);
}

// A device function sees the device the scopes asked for and picks the final one.
typedef struct fn_ctx {
    int calls;
    char seen[64];
    const char *answer;   // NULL: fail
} fn_ctx;

static bool choose_device(void *ctx, const dg_node *node, const char *current, char *out,
                          size_t out_cap, dg_status *st) {
    fn_ctx *c = ctx;
    c->calls++;
    snprintf(c->seen, sizeof c->seen, "%s", current);
    if (!c->answer) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "no device for %s", dg_node_op_type(node));
        return false;
    }
    snprintf(out, out_cap, "%s", c->answer);
    return true;
}

static void free_ctx(void *ctx) { free(ctx); }

static void test_device_functions(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    dg_device_fn *fn = calloc(1, sizeof *fn);
    fn_ctx *c = calloc(1, sizeof *c);
    assert_true(fn && c);
    c->answer = "/job:ps/task:0";
    fn->choose = choose_device;
    fn->ctx = c;
    fn->free_ctx = free_ctx;
    dg_graph_push_device(g, "/device:GPU:1");
    dg_graph_push_device_fn(g, fn);
    dg_output y = dg_identity(g, NULL, x);
    assert_int_equal(c->calls, 1);
    assert_string_equal(c->seen, "");   // the function runs first (innermost)
    assert_string_equal(dev_of(y), "/job:ps/task:0/device:GPU:1");
    // A scope inside the function's applies before it.
    dg_graph_push_device(g, "/job:worker");
    y = dg_identity(g, NULL, x);
    assert_string_equal(c->seen, "/job:worker");
    dg_graph_pop_device(g);
    // Popping in the wrong order is an error.
    dg_graph_pop_device(g);
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "pop_device without a matching push_device");
    dg_graph_free(&g);
    dg_device_fn_free(&fn);
    assert_null(fn);

    // A failing device function fails the node, naming it.
    g = dg_graph_new();
    x = ph(g, "x");
    fn = calloc(1, sizeof *fn);
    c = calloc(1, sizeof *c);
    fn->choose = choose_device;
    fn->ctx = c;
    fn->free_ctx = free_ctx;
    dg_graph_push_device_fn(g, fn);
    y = dg_identity(g, "ident", x);
    assert_null(y.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "node \"ident\" (Identity): no device for Identity");
    dg_graph_pop_device_fn(g);
    dg_graph_free(&g);
    dg_device_fn_free(&fn);

    // A malformed answer.
    g = dg_graph_new();
    x = ph(g, "x");
    fn = calloc(1, sizeof *fn);
    c = calloc(1, sizeof *c);
    c->answer = "/job:";
    fn->choose = choose_device;
    fn->ctx = c;
    fn->free_ctx = free_ctx;
    dg_graph_push_device_fn(g, fn);
    y = dg_identity(g, "ident", x);
    assert_null(y.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "device function result");
    dg_graph_pop_device_fn(g);
    dg_graph_pop_device_fn(g);
    dg_graph_free(&g);
    dg_device_fn_free(&fn);

    g = dg_graph_new();
    dg_graph_push_device_fn(g, NULL);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "NULL device function");
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Control dependencies

static bool has_ctrl(const dg_node *n, const dg_node *dep) {
    for (int i = 0; i < dg_node_num_control_inputs(n); i++)
        if (dg_node_control_input(n, i) == dep) return true;
    return false;
}

static void test_control_dependencies(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = ph(g, "x");
    dg_node *a = dg_no_op(g, "a"), *b = dg_no_op(g, "b");
    dg_graph_push_control_deps(g, &a, 1);
    dg_output y = dg_identity(g, NULL, x);
    assert_int_equal(dg_node_num_control_inputs(y.node), 1);
    assert_true(has_ctrl(y.node, a));
    dg_graph_push_control_deps(g, &b, 1);
    dg_output z = dg_identity(g, NULL, x);
    assert_int_equal(dg_node_num_control_inputs(z.node), 2);
    assert_true(has_ctrl(z.node, a) && has_ctrl(z.node, b));
    // A dependency that is already a data input is not repeated as a control input.
    dg_graph_push_control_deps(g, &y.node, 1);
    dg_output w = dg_identity(g, NULL, y);
    assert_int_equal(dg_node_num_control_inputs(w.node), 2);
    assert_false(has_ctrl(w.node, y.node));
    dg_graph_pop_control_deps(g);
    dg_graph_pop_control_deps(g);
    dg_output v = dg_identity(g, NULL, x);
    assert_int_equal(dg_node_num_control_inputs(v.node), 1);
    dg_graph_pop_control_deps(g);
    dg_output u = dg_identity(g, NULL, x);
    assert_int_equal(dg_node_num_control_inputs(u.node), 0);
    assert_null(dg_node_control_input(u.node, 0));
    // dg_node_add_control_input adds once.
    dg_node_add_control_input(u.node, a);
    dg_node_add_control_input(u.node, a);
    dg_node_add_control_input(u.node, NULL);
    assert_int_equal(dg_node_num_control_inputs(u.node), 1);
    // Groups depend on their members.
    dg_node *deps[2] = {y.node, z.node};
    dg_node *grp = dg_group(g, "grp", deps, 2);
    assert_non_null(grp);
    assert_string_equal(dg_node_op_type(grp), "NoOp");
    assert_int_equal(dg_node_num_control_inputs(grp), 2);
    assert_graph_ok(g);
    dg_graph_pop_control_deps(g);
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "pop_control_deps without a matching push");
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_node *nul = NULL;
    dg_graph_push_control_deps(g, &nul, 1);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "control dependency 0 is NULL");
    dg_graph_pop_control_deps(g);
    dg_graph_free(&g);

    g = dg_graph_new();
    assert_null(dg_group(g, "grp", &nul, 1));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "group: dependency 0 is NULL");
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Colocation

static void test_colocate_with(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0");
    dg_output v = dg_variable(g, "v", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    dg_graph_pop_device(g);
    assert_string_equal(dev_of(v), "/job:ps/task:0");
    assert_int_equal(dg_node_num_colocations(v.node), 0);
    // The initializer ops are colocated with the variable.
    dg_node *init = dg_variable_initializer(v);
    assert_non_null(init);
    assert_string_equal(dg_node_name(init), "v/Assign");
    assert_int_equal(dg_node_num_colocations(init), 1);
    assert_string_equal(dg_node_colocation(init, 0), "v");
    assert_string_equal(dg_node_requested_device(init), "/job:ps/task:0");

    dg_graph_push_device(g, "/job:worker/device:GPU:0");
    dg_graph_push_colocate_with(g, v.node);
    dg_output r = dg_identity(g, "read", v);
    dg_graph_pop_colocate_with(g);
    dg_output other = dg_identity(g, "other", v);
    dg_graph_pop_device(g);
    // Colocation wins over the device scope.
    assert_int_equal(dg_node_num_colocations(r.node), 1);
    assert_string_equal(dg_node_colocation(r.node, 0), "v");
    assert_null(dg_node_colocation(r.node, 1));
    assert_string_equal(dev_of(r), "/job:ps/task:0");
    assert_int_equal(dg_node_num_colocations(other.node), 0);
    assert_string_equal(dev_of(other), "/job:worker/device:GPU:0");

    // Colocating with a node that is itself colocated joins its group.
    dg_graph_push_colocate_with(g, r.node);
    dg_output r2 = dg_identity(g, "read2", v);
    dg_graph_pop_colocate_with(g);
    assert_int_equal(dg_node_num_colocations(r2.node), 1);
    assert_string_equal(dg_node_colocation(r2.node, 0), "v");
    // Nested: both groups, device of the innermost.
    dg_output w = dg_placeholder(g, "w", DG_FLOAT32, dg_shape1(2));
    dg_graph_push_colocate_with(g, v.node);
    dg_graph_push_colocate_with(g, w.node);
    dg_output both = dg_add(g, "both", v, w);
    dg_graph_pop_colocate_with(g);
    dg_graph_pop_colocate_with(g);
    assert_int_equal(dg_node_num_colocations(both.node), 2);
    assert_string_equal(dg_node_colocation(both.node, 0), "v");
    assert_string_equal(dg_node_colocation(both.node, 1), "w");
    assert_string_equal(dev_of(both), "");
    assert_graph_ok(g);
    dg_graph_pop_colocate_with(g);
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "pop_colocate_with without a matching push");
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_graph_push_colocate_with(g, NULL);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "colocate_with: NULL node");
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Collections

static void test_collections(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    assert_int_equal(dg_graph_collection_size(g, "losses"), 0);
    assert_null(dg_graph_collection_get(g, "losses", 0));
    dg_node *a = dg_no_op(g, "a"), *b = dg_no_op(g, "b");
    dg_graph_add_to_collection(g, "losses", a);
    dg_graph_add_to_collection(g, "losses", b);
    dg_graph_add_to_collection(g, "losses", a);   // kept once
    dg_graph_add_to_collection(g, "other", a);
    dg_graph_add_to_collection(g, "other", NULL);
    dg_graph_add_to_collection(g, NULL, a);
    assert_int_equal(dg_graph_collection_size(g, "losses"), 2);
    assert_true(dg_graph_collection_get(g, "losses", 0) == a);
    assert_true(dg_graph_collection_get(g, "losses", 1) == b);
    assert_null(dg_graph_collection_get(g, "losses", 2));
    assert_null(dg_graph_collection_get(g, "losses", -1));
    assert_int_equal(dg_graph_collection_size(g, "other"), 1);

    // Variables go into the global collection, and the trainable one unless told not to.
    dg_output v = dg_variable(g, "v", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    dg_output u = dg_variable_ex(g, "u", DG_FLOAT32, dg_shape1(2), dg_init_zeros(), false);
    assert_int_equal(dg_graph_collection_size(g, DG_GLOBAL_VARIABLES), 2);
    assert_true(dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, 0) == v.node);
    assert_true(dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, 1) == u.node);
    assert_int_equal(dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES), 1);
    assert_true(dg_graph_collection_get(g, DG_TRAINABLE_VARIABLES, 0) == v.node);
    dg_node *init = dg_global_variables_initializer(g);
    assert_non_null(init);
    assert_int_equal(dg_node_num_control_inputs(init), 2);
    assert_true(has_ctrl(init, dg_variable_initializer(v)));
    assert_true(has_ctrl(init, dg_variable_initializer(u)));
    assert_null(dg_variable_initializer((dg_output){a, 0}));
    assert_graph_ok(g);
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Variable scopes and get_variable

static void test_variable_scopes(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_variable_scope(g, "layer", false);
    dg_output w = dg_get_variable(g, "w", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros());
    assert_string_equal(name_of(w), "layer/w");
    // A variable scope is also a name scope.
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(4, 2));
    assert_string_equal(name_of(x), "layer/x");
    dg_graph_push_variable_scope(g, "inner", false);
    dg_output b = dg_get_variable(g, "b", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    assert_string_equal(name_of(b), "layer/inner/b");
    dg_graph_pop_variable_scope(g);
    dg_graph_pop_variable_scope(g);

    // Reuse finds the same variables; the name scope is new ("layer_1").
    dg_graph_push_variable_scope(g, "layer", true);
    dg_output w2 = dg_get_variable(g, "w", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros());
    assert_true(w2.node == w.node);
    dg_output y = dg_matmul(g, "mm", x, w2, false, false);
    assert_string_equal(name_of(y), "layer_1/mm");
    // reuse is inherited by inner scopes.
    dg_graph_push_variable_scope(g, "inner", false);
    dg_output b2 = dg_get_variable(g, "b", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    assert_true(b2.node == b.node);
    dg_graph_pop_variable_scope(g);
    dg_graph_pop_variable_scope(g);
    // Top level.
    dg_output t = dg_get_variable(g, "top", DG_FLOAT64, dg_shape_scalar(), dg_init_ones());
    assert_string_equal(name_of(t), "top");
    assert_int_equal(dg_graph_collection_size(g, DG_GLOBAL_VARIABLES), 3);
    assert_graph_ok(g);
    dg_graph_pop_variable_scope(g);
    assert_status(dg_graph_status(g), DG_FAILED_PRECONDITION, "pop_variable_scope without a matching push");
    dg_graph_free(&g);
}

static dg_graph *graph_with_var(void) {
    dg_graph *g = dg_graph_new();
    dg_graph_push_variable_scope(g, "s", false);
    dg_output v = dg_get_variable(g, "v", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros());
    assert_non_null(v.node);
    dg_graph_pop_variable_scope(g);
    return g;
}

static void test_get_variable_errors(void **state) {
    (void)state;
    // Exists, reuse off.
    dg_graph *g = graph_with_var();
    dg_graph_push_variable_scope(g, "s", false);
    dg_output v = dg_get_variable(g, "v", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros());
    assert_null(v.node);
    assert_status(dg_graph_status(g), DG_ALREADY_EXISTS, "variable \"s/v\" already exists");
    dg_graph_free(&g);

    // Missing, reuse on.
    g = graph_with_var();
    dg_graph_push_variable_scope(g, "s", true);
    v = dg_get_variable(g, "missing", DG_FLOAT32, dg_shape2(2, 3), dg_init_zeros());
    assert_null(v.node);
    assert_status(dg_graph_status(g), DG_NOT_FOUND, "variable \"s/missing\" does not exist");
    dg_graph_free(&g);

    // Shape mismatch.
    g = graph_with_var();
    dg_graph_push_variable_scope(g, "s", true);
    v = dg_get_variable(g, "v", DG_FLOAT32, dg_shape2(3, 2), dg_init_zeros());
    assert_null(v.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "variable \"s/v\" is float32 [2,3], asked for float32 [3,2]");
    dg_graph_free(&g);

    // Dtype mismatch.
    g = graph_with_var();
    dg_graph_push_variable_scope(g, "s", true);
    v = dg_get_variable(g, "v", DG_FLOAT64, dg_shape2(2, 3), dg_init_zeros());
    assert_null(v.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "asked for float64 [2,3]");
    dg_graph_free(&g);

    // A node that is not a variable is not found by reuse.
    g = dg_graph_new();
    dg_graph_push_variable_scope(g, "s", false);
    ph(g, "p");
    dg_graph_pop_variable_scope(g);
    dg_graph_push_variable_scope(g, "s", true);
    v = dg_get_variable(g, "p", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    assert_status(dg_graph_status(g), DG_NOT_FOUND, "\"s/p\"");
    dg_graph_free(&g);

    // Without reuse, a plain node of that name is in the way as well.
    g = dg_graph_new();
    ph(g, "p");
    v = dg_get_variable(g, "p", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    assert_status(dg_graph_status(g), DG_ALREADY_EXISTS, "\"p\"");
    dg_graph_free(&g);

    // Invalid scope names and variable shapes.
    g = dg_graph_new();
    dg_graph_push_variable_scope(g, "bad scope", false);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "variable scope \"bad scope\" is not a valid name");
    dg_graph_free(&g);
    g = dg_graph_new();
    v = dg_get_variable(g, "v", DG_FLOAT32, dg_shape2(-1, 3), dg_init_zeros());
    assert_null(v.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "variable shape must be fully defined, got [?,3]");
    dg_graph_free(&g);
}

// ---------------------------------------------------------------------------------------
// Builder errors name the node and the values.

static void test_builder_errors(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT32, dg_shape1(5));
    dg_output s = dg_add(g, "s", a, b);
    assert_null(s.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "node \"s\" (Add): incompatible shapes for broadcasting: [3,4] and [5]");
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    b = dg_placeholder(g, "b", DG_FLOAT64, dg_shape2(3, 4));
    s = dg_mul(g, "m", a, b);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "same dtype, got float32 and float64");
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_output nul = {NULL, 0};
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    s = dg_add(g, "s", a, nul);
    assert_null(s.node);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "Add: an input is the null output");
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    dg_graph *other = dg_graph_new();
    dg_output c = dg_placeholder(other, "c", DG_FLOAT32, dg_shape2(3, 4));
    s = dg_add(g, "s", a, c);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "input 1 (\"c\") belongs to another graph");
    dg_graph_free(&other);
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    dg_output parts[3];
    assert_false(dg_split(g, "sp", a, 1, 3, parts));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "dimension 1 (size 4) does not split into 3 equal parts");
    assert_null(parts[0].node);
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    int64_t dims[2] = {5, -1};
    s = dg_reshape(g, "r", a, dims, 2);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "node \"r\" (Reshape): cannot reshape [3,4] (12 elements) to [5,?]");
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    int64_t axes[1] = {2};
    s = dg_sum(g, "sum", a, axes, 1, false);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "node \"sum\" (Sum): axis 2 is out of range for rank 2");
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(3, 4));
    s = dg_assign(g, "as", a, a);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "input 0 must be a variable, got \"a\" (Placeholder)");
    dg_graph_free(&g);

    g = dg_graph_new();
    a = dg_placeholder(g, "a", DG_INT64, dg_shape1(3));
    s = dg_exp(g, "e", a);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "input 0 (\"a\") must be float32 or float64, got int64");
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unique_names),
        cmocka_unit_test(test_name_scopes),
        cmocka_unit_test(test_name_scope_errors),
        cmocka_unit_test(test_invalid_node_names),
        cmocka_unit_test(test_sticky_error),
        cmocka_unit_test(test_graph_output_lookup),
        cmocka_unit_test(test_device_scopes),
        cmocka_unit_test(test_device_scope_clears),
        cmocka_unit_test(test_device_scope_malformed),
        cmocka_unit_test(test_device_functions),
        cmocka_unit_test(test_control_dependencies),
        cmocka_unit_test(test_colocate_with),
        cmocka_unit_test(test_collections),
        cmocka_unit_test(test_variable_scopes),
        cmocka_unit_test(test_get_variable_errors),
        cmocka_unit_test(test_builder_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
