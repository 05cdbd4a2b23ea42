/* The placer: requests honoured, colocation groups kept together, soft placement, default
 * device, device filters, kernel support, and the errors for what cannot be placed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static const char *DEVS[] = {
    "/job:ps/replica:0/task:0/device:CPU:0",     "/job:ps/replica:0/task:1/device:CPU:0",
    "/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:0/device:GPU:0",
    "/job:worker/replica:0/task:1/device:CPU:0",
};
#define N_DEVS 5

static dg_node **all_nodes(dg_graph *g, int *n) {
    *n = dg_graph_num_nodes(g);
    dg_node **nodes = malloc((size_t)*n * sizeof *nodes);
    for (int i = 0; i < *n; i++) nodes[i] = dg_graph_node(g, i);
    return nodes;
}

static bool place(dg_graph *g, const dg_placement_options *o, dg_status *st) {
    int n;
    dg_node **nodes = all_nodes(g, &n);
    bool ok = dg_place(nodes, n, DEVS, N_DEVS, o, st);
    free(nodes);
    return ok;
}

static bool cpu_only(void *ctx, const dg_node *n, const char *type) {
    (void)ctx;
    (void)n;
    return strcmp(type, "CPU") == 0;
}

static void test_requests_and_colocation(void **state) {
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:1");
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(2, 2), dg_init_zeros());
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:1");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 2));
    dg_output loss = dg_sum(g, NULL, dg_matmul(g, NULL, x, w, false, false), NULL, 0, false);
    dg_optimizer opt = dg_adam(g, 0.1);
    dg_node *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    dg_graph_pop_device(g);
    assert_non_null(train);
    dg_status *st = dg_status_new();
    assert_true(place(g, NULL, st));
    assert_ok(st);
    // The variable, its initializer, its Adam slots and its update op share the ps task.
    const char *ps1 = "/job:ps/replica:0/task:1/device:CPU:0";
    assert_string_equal(dg_node_assigned_device(w.node), ps1);
    assert_string_equal(dg_node_assigned_device(dg_variable_initializer(w)), ps1);
    assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "w/Adam")), ps1);
    assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "w/Adam_1")), ps1);
    assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "Adam/update_w/ApplyAdam")), ps1);
    // Compute stays where it was asked for; a GPU exists on worker 0 only.
    assert_string_equal(dg_node_assigned_device(x.node), "/job:worker/replica:0/task:1/device:CPU:0");
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_soft_placement_and_default(void **state) {
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:1/device:GPU:0");   // task 1 has no GPU
    dg_output a = dg_scalar(g, "a", DG_FLOAT32, 1);
    dg_graph_pop_device(g);
    dg_output b = dg_scalar(g, "b", DG_FLOAT32, 2);   // unconstrained
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output c = dg_add(g, "c", a, b);
    dg_graph_pop_device(g);
    dg_status *st = dg_status_new();
    dg_placement_options o = dg_placement_options_default();
    o.default_device = "/job:worker/task:0";
    o.supports = cpu_only;   // no GPU kernels: GPU requests fall back to the task's CPU
    assert_true(place(g, &o, st));
    assert_string_equal(dg_node_assigned_device(a.node), "/job:worker/replica:0/task:1/device:CPU:0");
    assert_string_equal(dg_node_assigned_device(b.node), "/job:worker/replica:0/task:0/device:CPU:0");
    assert_string_equal(dg_node_assigned_device(c.node), "/job:worker/replica:0/task:0/device:CPU:0");
    // With GPU kernels, an unconstrained node on worker 0 prefers its GPU.
    o.supports = NULL;
    assert_true(place(g, &o, st));
    assert_string_equal(dg_node_assigned_device(b.node), "/job:worker/replica:0/task:0/device:GPU:0");
    // Without soft placement the impossible request is an error naming node, request, devices.
    o.allow_soft_placement = false;
    assert_false(place(g, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "node \"a\" (Const)");
    assert_non_null(strstr(dg_status_message(st), "/job:worker/task:1/device:GPU:0"));
    assert_non_null(strstr(dg_status_message(st), "soft placement is off"));
    assert_non_null(strstr(dg_status_message(st), "/job:ps/replica:0/task:0/device:CPU:0"));
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_unsatisfiable_colocation(void **state) {
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:ps/task:0");
    dg_output v = dg_variable(g, "v", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    dg_graph_pop_device(g);
    // Colocated with v but pinned to another task: no device satisfies both.
    dg_graph_push_colocate_with(g, v.node);
    dg_output r = dg_identity(g, "r", v);
    dg_graph_pop_colocate_with(g);
    dg_node *rn = r.node;
    // Re-request another task for the colocated node by hand (as a graph file could).
    dg_status *st = dg_status_new();
    dg_graph *g2 = dg_graph_new();
    dg_graph_push_device(g2, "/job:ps/task:0");
    dg_output v2 = dg_variable(g2, "v", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    dg_graph_pop_device(g2);
    dg_graph_push_device(g2, "/job:ps/task:1");
    dg_output a2 = dg_assign(g2, "bad_assign", v2, dg_zeros(g2, NULL, DG_FLOAT32, dg_shape1(3)));
    dg_graph_pop_device(g2);
    assert_non_null(a2.node);
    // dg_assign colocates with the variable, overriding the scope: place succeeds on ps 0.
    assert_true(place(g2, NULL, st));
    assert_string_equal(dg_node_assigned_device(a2.node), "/job:ps/replica:0/task:0/device:CPU:0");
    // A node that takes v by reference but asks for another task cannot be placed.
    dg_graph *g3 = dg_graph_new();
    dg_graph_push_device(g3, "/job:ps/task:0");
    dg_output v3 = dg_variable(g3, "v", DG_FLOAT32, dg_shape1(3), dg_init_zeros());
    dg_graph_pop_device(g3);
    dg_graph_push_device(g3, "/job:ps/task:1");
    dg_output one = dg_ones(g3, NULL, DG_FLOAT32, dg_shape1(3));
    dg_graph_pop_device(g3);
    assert_non_null(one.node);
    assert_non_null(rn);
    // Put a ref op into another task's scope without colocate_with: build through a device fn.
    dg_graph_push_device(g3, "/job:ps/task:1");
    dg_graph_push_colocate_with(g3, one.node);
    dg_output add = dg_assign_add(g3, "add", v3, one);   // dg_assign_add colocates with v3 (innermost)
    dg_graph_pop_colocate_with(g3);
    dg_graph_pop_device(g3);
    assert_non_null(add.node);
    // "one" requests ps 1; "add" is in v's group and in one's group through the outer scope:
    // the group joins ps 0 and ps 1 requests.
    assert_false(place(g3, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "cannot colocate");
    assert_non_null(strstr(dg_status_message(st), "/job:ps/task:"));
    dg_graph_free(&g);
    dg_graph_free(&g2);
    dg_graph_free(&g3);
    dg_status_free(&st);
}

static void test_filters_and_bad_devices(void **state) {
    dg_graph *g = dg_graph_new();
    dg_output a = dg_scalar(g, "a", DG_FLOAT32, 1);
    dg_status *st = dg_status_new();
    dg_placement_options o = dg_placement_options_default();
    const char *filters[] = {"/job:worker/task:1"};
    o.device_filters = filters;
    o.n_device_filters = 1;
    assert_true(place(g, &o, st));
    assert_string_equal(dg_node_assigned_device(a.node), "/job:worker/replica:0/task:1/device:CPU:0");
    const char *bad_filter[] = {"/job:worker/task:x"};
    o.device_filters = bad_filter;
    assert_false(place(g, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "device filter 0");
    int n;
    dg_node **nodes = all_nodes(g, &n);
    const char *partial[] = {"/job:worker/task:0"};
    assert_false(dg_place(nodes, n, partial, 1, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "not a complete device name");
    assert_false(dg_place(nodes, n, partial, 0, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "no devices");
    // A task index out of range for the cluster: no such device.
    dg_graph *g2 = dg_graph_new();
    dg_graph_push_device(g2, "/job:ps/task:7");
    dg_scalar(g2, "far", DG_FLOAT32, 1);
    dg_graph_pop_device(g2);
    assert_false(place(g2, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "node \"far\"");
    assert_non_null(strstr(dg_status_message(st), "/job:ps/task:7"));
    free(nodes);
    dg_graph_free(&g);
    dg_graph_free(&g2);
    dg_status_free(&st);
}

// The task part of a device name ("/job:ps/replica:0/task:0" of ".../device:CPU:0").
static void task_of(const char *dev, char *out, size_t cap) {
    snprintf(out, cap, "%s", dev);
    char *d = strstr(out, "/device:");
    if (d) *d = 0;
}

// The forward node whose gradient built node n ("gradients/<fwd>_grad/..."), or NULL for a
// node that is not a gradient node.
static dg_node *forward_of(dg_graph *g, const dg_node *n) {
    const char *name = dg_node_name(n), *last = NULL;
    if (strncmp(name, "gradients/", 10) != 0) return NULL;
    for (const char *p = strstr(name, "_grad/"); p; p = strstr(p + 1, "_grad/")) last = p;
    if (!last) return NULL;
    char fwd[256];
    snprintf(fwd, sizeof fwd, "%.*s", (int)(last - name - 10), name + 10);
    return dg_graph_find(g, fwd);
}

// A model split over two tasks (the hidden layer on worker 0, the output layer and the loss on
// ps 1), minimized from worker 0's scope, placed. Counts the gradient nodes on each forward
// node's task (*beside) and elsewhere (*away), and those on ps 1 (*on_ps).
static void split_model_gradients(bool colocate, int *beside, int *away, int *on_ps) {
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 4));
    dg_output y = dg_placeholder(g, "y", DG_INT64, dg_shape1(-1));
    dg_output w1 = dg_variable(g, "w1", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros());
    dg_output h = dg_relu(g, "h", dg_matmul(g, NULL, x, w1, false, false));
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:ps/task:1");
    dg_output w2 = dg_variable(g, "w2", DG_FLOAT32, dg_shape2(3, 2), dg_init_zeros());
    dg_output b2 = dg_variable(g, "b2", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    dg_output logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, h, w2, false, false), b2);
    dg_output loss = dg_sparse_softmax_cross_entropy(g, "loss", logits, y);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_optimizer opt = dg_adam(g, 0.1);
    opt.colocate_gradients_with_ops = colocate;
    assert_non_null(dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0}));
    dg_graph_pop_device(g);
    dg_status *st = dg_status_new();
    dg_placement_options o = dg_placement_options_default();
    o.default_device = "/job:worker/task:0";
    assert_true(place(g, &o, st));
    assert_ok(st);
    *beside = *away = *on_ps = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i), *f = forward_of(g, n);
        if (!f) continue;
        char tn[DG_DEVICE_NAME_MAX], tf[DG_DEVICE_NAME_MAX];
        task_of(dg_node_assigned_device(n), tn, sizeof tn);
        task_of(dg_node_assigned_device(f), tf, sizeof tf);
        if (strcmp(tn, tf) == 0) ++*beside;
        else ++*away;
        if (strcmp(tn, "/job:ps/replica:0/task:1") == 0) ++*on_ps;
    }
    dg_status_free(&st);
    dg_graph_free(&g);
}

// colocate_gradients_with_ops: every gradient node runs on its forward node's task (the output
// layer's backward pass on ps 1); without it, all of them run on the caller's task, worker 0.
static void test_gradients_beside_their_ops(void **state) {
    (void)state;
    int beside, away, on_ps, beside0, away0, on_ps0;
    split_model_gradients(true, &beside, &away, &on_ps);
    split_model_gradients(false, &beside0, &away0, &on_ps0);
    print_message("colocated: %d gradient nodes beside their op, %d away, %d on ps 1; not colocated: %d beside, "
                  "%d away, %d on ps 1\n", beside, away, on_ps, beside0, away0, on_ps0);
    assert_int_equal(away, 0);
    assert_int_equal(on_ps0, 0);
    assert_true(away0 > 0);                      // the output layer's and the loss's, on worker 0
    assert_int_equal(beside + away, beside0 + away0);   // the same gradient nodes either way
    assert_int_equal(on_ps, away0);              // exactly those move, to ps 1
}

// gradient_wire_dtype bfloat16: the model split over worker 0 and ps 1, minimized from worker
// 0's scope (every gradient computed there). The gradients of ps 1's variables (w2, b2) leave
// worker 0 as bfloat16 (a Cast placed on worker 0) and are widened on ps 1 (a Cast placed there,
// feeding the update); w1's gradient stays on worker 0 and gets no cast.
static void test_gradient_wire_bfloat16_casts(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 4));
    dg_output w1 = dg_variable(g, "w1", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros());
    dg_output h = dg_relu(g, "h", dg_matmul(g, NULL, x, w1, false, false));
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:ps/task:1");
    dg_output w2 = dg_variable(g, "w2", DG_FLOAT32, dg_shape2(3, 2), dg_init_zeros());
    dg_output b2 = dg_variable(g, "b2", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:0");
    dg_output logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, h, w2, false, false), b2);
    dg_output loss = dg_mean(g, "loss", dg_square(g, NULL, logits), NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    opt.gradient_wire_dtype = DG_BFLOAT16;
    assert_non_null(dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0}));
    dg_graph_pop_device(g);
    dg_status *st = dg_status_new();
    dg_placement_options o = dg_placement_options_default();
    assert_true(place(g, &o, st));
    assert_ok(st);
    const char *wire_names[] = {"w2/gradient_wire_bfloat16", "b2/gradient_wire_bfloat16"};
    for (int i = 0; i < 2; i++) {
        dg_node *half = dg_graph_find(g, wire_names[i]);
        assert_non_null(half);
        assert_string_equal(dg_node_op_type(half), "Cast");
        assert_int_equal(dg_node_output_dtype(half, 0), DG_BFLOAT16);
        assert_non_null(strstr(dg_node_assigned_device(half), "/job:worker/replica:0/task:0/"));
        // Its one consumer widens it on ps 1.
        int consumers = 0;
        for (int k = 0; k < dg_graph_num_nodes(g); k++) {
            dg_node *n = dg_graph_node(g, k);
            for (int j = 0; j < dg_node_num_inputs(n); j++)
                if (dg_node_input(n, j).node == half) {
                    consumers++;
                    assert_string_equal(dg_node_op_type(n), "Cast");
                    assert_int_equal(dg_node_output_dtype(n, 0), DG_FLOAT32);
                    assert_non_null(strstr(dg_node_assigned_device(n), "/job:ps/replica:0/task:1/"));
                }
        }
        assert_int_equal(consumers, 1);
    }
    assert_null(dg_graph_find(g, "w1/gradient_wire_bfloat16"));   // no crossing, no cast
    dg_status_free(&st);
    dg_graph_free(&g);
    // Another dtype is refused, named.
    g = dg_graph_new();
    w1 = dg_variable(g, "w1", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    opt = dg_gradient_descent(g, 0.1);
    opt.gradient_wire_dtype = DG_FLOAT16;
    assert_null(dg_optimizer_minimize(&opt, dg_mean(g, NULL, w1, NULL, 0, false), (dg_output){NULL, 0}));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "gradient_wire_dtype is float16");
    dg_graph_free(&g);
}

static bool floats_on_gpu(void *ctx, const dg_node *n, const char *type) {
    (void)ctx;
    if (strcmp(type, "GPU") != 0) return true;
    for (int i = 0; i < dg_node_num_outputs(n); i++)
        if (!dg_dtype_is_float(dg_node_output_dtype(n, i))) return false;
    return true;
}

// A gradient node the GPU cannot run (integer shape arithmetic) falls back to its task's CPU;
// the forward op keeps the GPU, and float gradient nodes join it there.
static void test_colocated_gradients_leave_ops_on_gpu(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:0/device:GPU:0");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, 4));
    dg_output w = dg_variable(g, "w", DG_FLOAT32, dg_shape2(4, 3), dg_init_zeros());
    dg_output m = dg_matmul(g, "m", x, w, false, false);
    dg_output loss = dg_mean(g, "loss", m, NULL, 0, false);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:worker/task:1");
    dg_optimizer opt = dg_gradient_descent(g, 0.1);
    opt.colocate_gradients_with_ops = true;
    assert_non_null(dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0}));
    dg_graph_pop_device(g);
    dg_status *st = dg_status_new();
    dg_placement_options o = dg_placement_options_default();
    o.supports = floats_on_gpu;
    assert_true(place(g, &o, st));
    assert_ok(st);
    const char *gpu = "/job:worker/replica:0/task:0/device:GPU:0", *cpu = "/job:worker/replica:0/task:0/device:CPU:0";
    assert_string_equal(dg_node_assigned_device(m.node), gpu);
    int on_gpu = 0, on_cpu = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        if (!forward_of(g, n)) continue;
        const char *d = dg_node_assigned_device(n);
        if (strcmp(d, gpu) == 0) on_gpu++;
        else if (strcmp(d, cpu) == 0) on_cpu++;
        else fail_msg("gradient node %s on %s, off worker 0", dg_node_name(n), d);
    }
    assert_true(on_gpu > 0);
    assert_true(on_cpu > 0);
    dg_status_free(&st);
    dg_graph_free(&g);
}

// Kernels are checked on every device, past the 64th too: with 70 GPUs and an op only the CPU
// runs, a request for GPU:66 is refused without soft placement and lands on the CPU with it.
static void test_kernels_checked_on_many_devices(void **state) {
    (void)state;
    char names[71][64];
    const char *devs[71];
    for (int i = 0; i < 70; i++) {
        snprintf(names[i], sizeof names[i], "/job:worker/replica:0/task:0/device:GPU:%d", i);
        devs[i] = names[i];
    }
    devs[70] = "/job:worker/replica:0/task:0/device:CPU:0";
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:0/device:GPU:66");
    dg_relu(g, "r", dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(4)));
    dg_graph_pop_device(g);
    int n;
    dg_node **nodes = all_nodes(g, &n);
    dg_status *st = dg_status_new();
    dg_placement_options o = dg_placement_options_default();
    o.supports = cpu_only;
    o.allow_soft_placement = false;
    assert_false(dg_place(nodes, n, devs, 71, &o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "cannot place node");
    o.allow_soft_placement = true;
    assert_true(dg_place(nodes, n, devs, 71, &o, st));
    assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "r")), devs[70]);
    free(nodes);
    dg_status_free(&st);
    dg_graph_free(&g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_requests_and_colocation),
        cmocka_unit_test(test_soft_placement_and_default),
        cmocka_unit_test(test_unsatisfiable_colocation),
        cmocka_unit_test(test_filters_and_bad_devices),
        cmocka_unit_test(test_gradients_beside_their_ops),
        cmocka_unit_test(test_gradient_wire_bfloat16_casts),
        cmocka_unit_test(test_colocated_gradients_leave_ops_on_gpu),
        cmocka_unit_test(test_kernels_checked_on_many_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
