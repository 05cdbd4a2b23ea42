/* Tests for placer/device_setter.c, after TensorFlow's device_setter_test.py. Graphs are
 * built through the public API; devices are read back with dg_node_requested_device. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static dg_cluster *cluster_of(const char *spec) {
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    assert_ok(st);
    dg_status_free(&st);
    return c;
}

static dg_device_fn *setter(const dg_replica_device_setter_options *o) {
    dg_status *st = dg_status_new();
    dg_device_fn *fn = dg_replica_device_setter_new(o, st);
    assert_ok(st);
    assert_non_null(fn);
    dg_status_free(&st);
    return fn;
}

static dg_output var(dg_graph *g, const char *name, dg_shape shape) {
    dg_output v = dg_variable(g, name, DG_FLOAT32, shape, dg_init_zeros());
    if (!dg_graph_ok(g))
        fail_msg("dg_variable(%s): %s", name, dg_status_message(dg_graph_status(g)));
    assert_true(dg_output_ok(v));
    return v;
}

static const char *dev(dg_output o) { return dg_node_requested_device(o.node); }
static const char *init_dev(dg_output v) {
    return dg_node_requested_device(dg_variable_initializer(v));
}

static void expect_graph_ok(const dg_graph *g) {
    const dg_status *st = dg_graph_status(g);
    assert_ok(st);
}

// The fixture of most tests here: a graph with the setter of o pushed (*fn: the setter, new),
// the end of its scope (the setter popped, the graph checked), and both freed.
static dg_graph *setter_graph(const dg_replica_device_setter_options *o, dg_device_fn **fn) {
    *fn = setter(o);
    dg_graph *g = dg_graph_new();
    dg_graph_push_device_fn(g, *fn);
    return g;
}

static void end_setter(dg_graph *g) {
    dg_graph_pop_device_fn(g);
    expect_graph_ok(g);
}

static void free_setter_graph(dg_graph **g, dg_device_fn **fn) {
    dg_graph_free(g);
    dg_device_fn_free(fn);
    assert_null(*fn);
}

// testPS2TasksWithClusterSpecClass
static void test_round_robin_with_cluster(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("ps|ps0:2222,ps1:2222;worker|worker0:2222,worker1:2222,worker2:2222");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    dg_device_fn *fn = setter(&o);
    dg_cluster_free(&c);   // the cluster is only borrowed for the call

    dg_graph *g = dg_graph_new();
    dg_graph_push_device_fn(g, fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_output w = var(g, "w", dg_shape1(2));
    dg_output a = dg_add(g, "a", v, w);
    dg_output x = var(g, "x", dg_shape1(2));
    dg_graph_pop_device_fn(g);
    dg_output b = dg_add(g, "b", v, x);
    expect_graph_ok(g);
    assert_string_equal(dev(v), "/job:ps/task:0");
    assert_string_equal(init_dev(v), "/job:ps/task:0");
    assert_string_equal(dev(w), "/job:ps/task:1");
    assert_string_equal(init_dev(w), "/job:ps/task:1");
    assert_string_equal(dev(a), "/job:worker");
    assert_string_equal(dev(x), "/job:ps/task:0");   // wraps around
    assert_string_equal(dev(b), "");                  // outside the setter
    free_setter_graph(&g, &fn);
    assert_null(fn);
}

// ps_tasks given directly, no cluster.
static void test_round_robin_ps_tasks(void **state) {
    (void)state;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 3;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    const char *want[] = {"/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:2", "/job:ps/task:0"};
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "v%d", i);
        dg_output v = var(g, name, dg_shape1(1));
        assert_string_equal(dev(v), want[i]);
    }
    end_setter(g);
    free_setter_graph(&g, &fn);
}

// testCPUOverride
static void test_cpu_override(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("ps|ps0:2222,ps1:2222;worker|worker0:2222,worker1:2222,worker2:2222");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_graph_push_device(g, "/cpu:0");
    dg_output v = var(g, "v", dg_shape1(2));
    dg_graph_pop_device(g);
    dg_output w = var(g, "w", dg_shape1(2));
    dg_graph_push_device(g, "/cpu:0");
    dg_output a = dg_add(g, "a", v, w);
    dg_graph_pop_device(g);
    end_setter(g);
    assert_string_equal(dev(v), "/job:ps/task:0/device:CPU:0");
    assert_string_equal(init_dev(v), "/job:ps/task:0/device:CPU:0");
    assert_string_equal(dev(w), "/job:ps/task:1");
    assert_string_equal(init_dev(w), "/job:ps/task:1");
    assert_string_equal(dev(a), "/job:worker/device:CPU:0");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
}

// testPS2TasksPinVariableToJob
static void test_pin_variable_to_job(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("ps|ps0:2222,ps1:2222;worker|worker0:2222");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_graph_push_device(g, "/job:moon");
    dg_output w = var(g, "w", dg_shape1(2));
    dg_graph_push_device(g, "/job:ps");   // an explicit ps job still gets a task
    dg_output x = var(g, "x", dg_shape1(2));
    dg_graph_pop_device(g);
    dg_graph_pop_device(g);
    dg_output a = dg_add(g, "a", dg_add(g, NULL, v, w), x);
    end_setter(g);
    assert_string_equal(dev(v), "/job:ps/task:0");
    assert_string_equal(init_dev(v), "/job:ps/task:0");
    assert_string_equal(dev(w), "/job:moon");
    assert_string_equal(init_dev(w), "/job:moon");
    assert_string_equal(dev(x), "/job:ps/task:1");
    assert_string_equal(init_dev(x), "/job:ps/task:1");
    assert_string_equal(dev(a), "/job:worker");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
}

// testPS2TasksUseCpuForPS
static void test_cpu_ps_device(void **state) {
    (void)state;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 1;
    o.ps_device = "/cpu:0";
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_graph_push_device(g, "/job:moon");
    dg_output w = var(g, "w", dg_shape1(2));
    dg_graph_pop_device(g);
    dg_output a = dg_add(g, "a", v, w);
    end_setter(g);
    assert_string_equal(dev(v), "/device:CPU:0");
    assert_string_equal(init_dev(v), "/device:CPU:0");
    assert_string_equal(dev(w), "/job:moon/device:CPU:0");
    assert_string_equal(init_dev(w), "/job:moon/device:CPU:0");
    assert_string_equal(dev(a), "/job:worker");
    free_setter_graph(&g, &fn);
}

// testPS2TasksNoMerging
static void test_no_merging(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("ps|ps0:2222,ps1:2222;worker|worker0:2222");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.merge_devices = false;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_graph_push_device(g, "/job:ps");   // kept as is: no task without merging
    dg_output w = var(g, "w", dg_shape1(2));
    dg_graph_pop_device(g);
    dg_output a = dg_add(g, "a", v, w);
    dg_graph_push_device(g, "/device:GPU:1");
    dg_output b = dg_add(g, "b", v, w);
    dg_graph_pop_device(g);
    dg_output x = var(g, "x", dg_shape1(2));
    end_setter(g);
    assert_string_equal(dev(v), "/job:ps/task:0");
    assert_string_equal(init_dev(v), "/job:ps/task:0");
    assert_string_equal(dev(w), "/job:ps");
    assert_string_equal(init_dev(w), "/job:ps");
    assert_string_equal(dev(a), "/job:worker");
    assert_string_equal(dev(b), "/device:GPU:1");
    assert_string_equal(dev(x), "/job:ps/task:1");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
}

// testPS2TasksWithDevice and testPS2TasksWithCPUConstraint: custom job names.
static void test_custom_jobs(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("sun|sun0:2222,sun1:2222,sun2:2222;moon|moon0:2222,moon1:2222");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.ps_device = "/job:moon";
    o.worker_device = "/job:sun";
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_output w = var(g, "w", dg_shape1(2));
    dg_output a = dg_add(g, "a", v, w);
    end_setter(g);
    assert_string_equal(dev(v), "/job:moon/task:0");
    assert_string_equal(init_dev(v), "/job:moon/task:0");
    assert_string_equal(dev(w), "/job:moon/task:1");
    assert_string_equal(dev(a), "/job:sun");
    free_setter_graph(&g, &fn);

    o.ps_device = "/job:moon/cpu:0";
    g = setter_graph(&o, &fn);
    v = var(g, "v", dg_shape1(2));
    w = var(g, "w", dg_shape1(2));
    a = dg_add(g, "a", v, w);
    end_setter(g);
    assert_string_equal(dev(v), "/job:moon/task:0/device:CPU:0");
    assert_string_equal(init_dev(v), "/job:moon/task:0/device:CPU:0");
    assert_string_equal(dev(w), "/job:moon/task:1/device:CPU:0");
    assert_string_equal(dev(a), "/job:sun");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
}

// A worker device with a task and a GPU merges under the op's own device fields.
static void test_worker_device_merge(void **state) {
    (void)state;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.worker_device = "/job:worker/task:3/device:GPU:0";
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_output a = dg_add(g, "a", v, v);
    dg_graph_push_device(g, "/device:CPU:0");
    dg_output b = dg_add(g, "b", v, v);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/job:other/task:1");
    dg_output d = dg_add(g, "d", v, v);
    dg_graph_pop_device(g);
    end_setter(g);
    assert_string_equal(dev(v), "/job:ps/task:0");
    assert_string_equal(dev(a), "/job:worker/task:3/device:GPU:0");
    assert_string_equal(dev(b), "/job:worker/task:3/device:CPU:0");
    assert_string_equal(dev(d), "/job:other/task:1/device:GPU:0");
    free_setter_graph(&g, &fn);

    // An empty worker_device leaves non-ps ops alone.
    o.worker_device = "";
    g = setter_graph(&o, &fn);
    v = var(g, "v", dg_shape1(2));
    a = dg_add(g, "a", v, v);
    dg_graph_push_device(g, "/device:GPU:2");
    b = dg_add(g, "b", v, v);
    dg_graph_pop_device(g);
    end_setter(g);
    assert_string_equal(dev(v), "/job:ps/task:0");
    assert_string_equal(dev(a), "");
    assert_string_equal(dev(b), "/device:GPU:2");
    free_setter_graph(&g, &fn);

    // An empty ps_device turns ps placement off: variables go to the worker device too.
    o.worker_device = NULL;   // the default "/job:worker"
    o.ps_device = "";
    g = setter_graph(&o, &fn);
    v = var(g, "v", dg_shape1(2));
    end_setter(g);
    assert_string_equal(dev(v), "/job:worker");
    free_setter_graph(&g, &fn);
}

// No ps tasks: TensorFlow returns no device function, so nothing is placed.
static void test_no_ps_tasks(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("worker|w0:1,w1:1");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.ps_tasks = 5;   // the cluster wins, and it has no ps job
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v = var(g, "v", dg_shape1(2));
    dg_output a = dg_add(g, "a", v, v);
    dg_graph_push_device(g, "/job:x/device:GPU:0");
    dg_output b = dg_add(g, "b", v, v);
    dg_graph_pop_device(g);
    end_setter(g);
    assert_string_equal(dev(v), "");
    assert_string_equal(dev(a), "");
    assert_string_equal(dev(b), "/job:x/device:GPU:0");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);

    // Defaults: ps_tasks 0 and no cluster; NULL options mean the defaults.
    dg_device_fn *fns[2];
    dg_replica_device_setter_options d = dg_replica_device_setter_options_default();
    fns[0] = setter(&d);
    fns[1] = setter(NULL);
    for (int i = 0; i < 2; i++) {
        g = dg_graph_new();
        dg_graph_push_device_fn(g, fns[i]);
        v = var(g, "v", dg_shape1(2));
        end_setter(g);
        assert_string_equal(dev(v), "");
        dg_graph_free(&g);
        dg_device_fn_free(&fns[i]);
    }

    // A ps_device without a job cannot be looked up in a cluster: no ps placement.
    c = cluster_of("ps|p:1;worker|w:1");
    o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.ps_device = "/device:CPU:0";
    g = setter_graph(&o, &fn);
    v = var(g, "v", dg_shape1(2));
    end_setter(g);
    assert_string_equal(dev(v), "");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
}

// A sparse ps job: slots map to the job's real task indices.
static void test_sparse_ps_job(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_json(
        "{\"ps\": {\"1\": \"p1:1\", \"4\": \"p4:1\"}, \"worker\": [\"w:1\"]}", st);
    assert_ok(st);
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output v0 = var(g, "v0", dg_shape1(2));
    dg_output v1 = var(g, "v1", dg_shape1(2));
    dg_output v2 = var(g, "v2", dg_shape1(2));
    end_setter(g);
    assert_string_equal(dev(v0), "/job:ps/task:1");
    assert_string_equal(dev(v1), "/job:ps/task:4");
    assert_string_equal(dev(v2), "/job:ps/task:1");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

// Only the listed op types go to the ps.
static void test_custom_ps_ops(void **state) {
    (void)state;
    const char *ops[] = {"Placeholder"};
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.ps_ops = ops;
    o.n_ps_ops = 1;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape1(2));
    dg_output v = var(g, "v", dg_shape1(2));
    dg_output q = dg_placeholder(g, "q", DG_FLOAT32, dg_shape1(2));
    end_setter(g);
    assert_string_equal(dev(p), "/job:ps/task:0");
    assert_string_equal(dev(v), "/job:worker");
    assert_string_equal(dev(q), "/job:ps/task:1");
    free_setter_graph(&g, &fn);

    // No ps ops at all: everything goes to the worker.
    o.n_ps_ops = 0;
    g = setter_graph(&o, &fn);
    v = var(g, "v", dg_shape1(2));
    end_setter(g);
    assert_string_equal(dev(v), "/job:worker");
    free_setter_graph(&g, &fn);
}

// testByteSizeLoadFn: GreedyLoadBalancingStrategy with byte_size_load_fn.
static void test_greedy_bytes(void **state) {
    (void)state;
    dg_cluster *c = cluster_of("ps|p0:1,p1:1,p2:1;worker|w:1");
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.strategy = DG_PS_GREEDY_BYTES;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    // float32: bytes = 4 * elements. Loads after each step in brackets.
    dg_output u = var(g, "u", dg_shape2(100, 10));   // 4000 -> task 0 [4000, 0, 0]
    dg_output v = var(g, "v", dg_shape1(10));        // 40 -> task 1 [4000, 40, 0]
    dg_output w = var(g, "w", dg_shape1(20));        // 80 -> task 2 [4000, 40, 80]
    dg_output x = var(g, "x", dg_shape1(50));        // 200 -> task 1 [4000, 240, 80]
    dg_output y = var(g, "y", dg_shape_scalar());    // 4 -> task 2 [4000, 240, 84]
    dg_output z = var(g, "z", dg_shape2(1000, 1));   // 4000 -> task 2 [4000, 240, 4084]
    dg_output a = dg_add(g, "a", v, v);
    end_setter(g);
    assert_string_equal(dev(u), "/job:ps/task:0");
    assert_string_equal(dev(v), "/job:ps/task:1");
    assert_string_equal(dev(w), "/job:ps/task:2");
    assert_string_equal(dev(x), "/job:ps/task:1");
    assert_string_equal(dev(y), "/job:ps/task:2");
    assert_string_equal(dev(z), "/job:ps/task:2");
    assert_string_equal(init_dev(z), "/job:ps/task:2");
    assert_string_equal(dev(a), "/job:worker");
    free_setter_graph(&g, &fn);

    // Ties go to the lowest task; float64 counts 8 bytes per element.
    g = setter_graph(&o, &fn);
    dg_output d0 = dg_variable(g, "d0", DG_FLOAT64, dg_shape1(5), dg_init_zeros());   // 40
    dg_output f0 = var(g, "f0", dg_shape1(10));                                        // 40
    dg_output f1 = var(g, "f1", dg_shape1(10));                                        // 40
    dg_output f2 = var(g, "f2", dg_shape1(1));                                         // 4
    end_setter(g);
    assert_string_equal(dev(d0), "/job:ps/task:0");
    assert_string_equal(dev(f0), "/job:ps/task:1");
    assert_string_equal(dev(f1), "/job:ps/task:2");
    assert_string_equal(dev(f2), "/job:ps/task:0");
    free_setter_graph(&g, &fn);
    dg_cluster_free(&c);
}

// byte_size_load_fn errors reach the graph's sticky status.
static void test_greedy_errors(void **state) {
    (void)state;
    const char *ops[] = {"Placeholder", "NoOp"};
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.ps_ops = ops;
    o.n_ps_ops = 2;
    o.strategy = DG_PS_GREEDY_BYTES;
    dg_device_fn *fn = setter(&o);

    dg_graph *g = dg_graph_new();
    dg_graph_push_device_fn(g, fn);
    dg_output p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape2(-1, 10));
    assert_false(dg_output_ok(p));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "op \"p\" (Placeholder): shape [?,10] is not fully defined");
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "replica_device_setter");
    dg_graph_free(&g);

    g = dg_graph_new();
    dg_graph_push_device_fn(g, fn);
    dg_node *n = dg_no_op(g, "noop");
    assert_null(n);
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "op \"noop\" (NoOp) must have a single output for byte-size load balancing, "
                  "has 0");
    dg_graph_free(&g);

    // Round robin does not need sizes, so the same ops are fine there.
    o.strategy = DG_PS_ROUND_ROBIN;
    dg_device_fn *rr = setter(&o);
    g = dg_graph_new();
    dg_graph_push_device_fn(g, rr);
    p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape2(-1, 10));
    n = dg_no_op(g, "noop");
    end_setter(g);
    assert_string_equal(dev(p), "/job:ps/task:0");
    assert_string_equal(dg_node_requested_device(n), "/job:ps/task:1");
    dg_graph_free(&g);
    dg_device_fn_free(&rr);
    dg_device_fn_free(&fn);
}

static void test_option_errors(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = -1;
    assert_null(dg_replica_device_setter_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replica_device_setter: ps_tasks must be >= 0, got -1");

    // With a cluster, ps_device is read at once (for its job).
    dg_cluster *c = cluster_of("ps|p:1;worker|w:1");
    o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.ps_device = "/job:ps/task:x";
    assert_null(dg_replica_device_setter_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT,
                  "replica_device_setter: ps_device: device \"/job:ps/task:x\": task \"x\" is not an "
                  "integer");
    dg_cluster_free(&c);

    o = dg_replica_device_setter_options_default();
    o.strategy = (dg_ps_strategy)7;
    assert_null(dg_replica_device_setter_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replica_device_setter: unknown strategy 7");
    o.strategy = DG_PS_GREEDY;
    assert_null(dg_replica_device_setter_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replica_device_setter: the greedy strategy needs a load_fn");

    const char *ops[] = {"VariableV2", NULL};
    o = dg_replica_device_setter_options_default();
    o.ps_ops = ops;
    o.n_ps_ops = 2;
    assert_null(dg_replica_device_setter_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replica_device_setter: ps_ops[1] is NULL");
    o.n_ps_ops = -1;
    assert_null(dg_replica_device_setter_new(&o, st));
    assert_status(st, DG_INVALID_ARGUMENT, "replica_device_setter: n_ps_ops must be >= 0, got -1");
    dg_status_free(&st);
}

// Without a cluster TensorFlow reads ps_device and worker_device when an op needs them: a
// malformed one fails those ops only, naming the option.
static void test_malformed_devices_fail_their_ops(void **state) {
    (void)state;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.ps_device = "/job:ps/task:x";
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    dg_output p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape1(2));
    expect_graph_ok(g);
    assert_string_equal(dev(p), "/job:worker");
    dg_output v = dg_variable(g, "v", DG_FLOAT32, dg_shape1(2), dg_init_zeros());
    assert_false(dg_output_ok(v));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "replica_device_setter: ps_device: device \"/job:ps/task:x\": task \"x\" is not "
                  "an integer");
    free_setter_graph(&g, &fn);

    o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.worker_device = "/bogus:1";
    g = setter_graph(&o, &fn);
    v = var(g, "v", dg_shape1(2));
    assert_string_equal(dev(v), "/job:ps/task:0");
    p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape1(2));
    assert_false(dg_output_ok(p));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT,
                  "replica_device_setter: worker_device: device \"/bogus:1\": unknown attribute \"bogus\"");
    free_setter_graph(&g, &fn);

    // A setter with no ps tasks never reads them at all, as TensorFlow returns no function.
    o.ps_tasks = 0;
    g = setter_graph(&o, &fn);
    p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape1(2));
    expect_graph_ok(g);
    assert_string_equal(dev(p), "");
    free_setter_graph(&g, &fn);
}

// Device strings are read as DeviceSpec reads them: "gpu" is GPU, local names work.
static void test_device_spec_reading(void **state) {
    (void)state;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.ps_device = "/job:ps/device:gpu:0";
    o.worker_device = "CPU:1";
    dg_device_fn *fn = setter(&o);
    dg_graph *g = dg_graph_new();
    dg_output v = var(g, "v", dg_shape1(2));
    dg_output p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape1(2));
    dg_status *st = dg_status_new();
    char out[DG_DEVICE_NAME_MAX];
    assert_true(fn->choose(fn->ctx, v.node, "", out, sizeof out, st));
    assert_string_equal(out, "/job:ps/task:0/device:GPU:0");
    assert_true(fn->choose(fn->ctx, v.node, "/device:gpu:1", out, sizeof out, st));
    assert_string_equal(out, "/job:ps/task:1/device:GPU:1");
    assert_true(fn->choose(fn->ctx, p.node, "/Gpu:2", out, sizeof out, st));
    assert_string_equal(out, "/device:GPU:2");
    assert_true(fn->choose(fn->ctx, p.node, "/job:w/task:1", out, sizeof out, st));
    assert_string_equal(out, "/job:w/task:1/device:CPU:1");
    // An empty job is "no job" for the task choice but still a job of the result.
    assert_true(fn->choose(fn->ctx, v.node, "/job:", out, sizeof out, st));
    assert_string_equal(out, "/job:/task:0/device:GPU:0");
    assert_false(fn->choose(fn->ctx, p.node, "/cpu:0/gpu:0", out, sizeof out, st));
    assert_status(st, DG_INVALID_ARGUMENT,
                  "replica_device_setter: op \"p\": device \"/cpu:0/gpu:0\": multiple device types");
    dg_status_free(&st);
    free_setter_graph(&g, &fn);
}

static void test_standard_ps_ops(void **state) {
    (void)state;
    int n = 0;
    const char *const *ops = dg_standard_ps_ops(&n);
    assert_int_equal(n, 14);
    assert_string_equal(ops[0], "Variable");
    assert_string_equal(ops[1], "VariableV2");
    bool has_handle = false, has_table = false;
    for (int i = 0; i < n; i++) {
        has_handle = has_handle || strcmp(ops[i], "VarHandleOp") == 0;
        has_table = has_table || strcmp(ops[i], "MutableHashTableV2") == 0;
    }
    assert_true(has_handle && has_table);
    assert_non_null(dg_standard_ps_ops(NULL));
}

typedef struct load_ctx {
    const double *loads;   // handed out in order
    int next;
    int fail_at;           // -1: never
} load_ctx;

static bool table_load(void *ctx, const dg_node *op, double *load, dg_status *st) {
    load_ctx *c = ctx;
    if (c->next == c->fail_at) {
        c->next++;
        dg_status_setf(st, DG_INVALID_ARGUMENT, "no load for \"%s\"", dg_node_name(op));
        return false;
    }
    *load = c->loads[c->next++];
    return true;
}

// GreedyLoadBalancingStrategy with a user load function: the least-loaded task (first on
// ties, first NaN as numpy's argmin), then its load grows.
static void test_greedy_user_load(void **state) {
    (void)state;
    static const double loads[] = {5, 1, 0.5, -2, 0, 10, 0.0 / 0.0, 3, 1};
    // Loads [0,0,0] -> t0 [5,0,0] -> t1 [5,1,0] -> t2 [5,1,.5] -> t2 [5,1,-1.5] -> t2 [5,1,-1.5]
    // -> t2 [5,1,8.5] -> t1 [5,NaN,8.5] -> t1 (NaN) -> t1
    static const int want[] = {0, 1, 2, 2, 2, 2, 1, 1, 1};
    load_ctx lc = {loads, 0, -1};
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 3;
    o.strategy = DG_PS_GREEDY;
    o.load_fn = table_load;
    o.load_ctx = &lc;
    dg_device_fn *fn;
    dg_graph *g = setter_graph(&o, &fn);
    for (int i = 0; i < 9; i++) {
        char name[8], want_dev[32];
        snprintf(name, sizeof name, "v%d", i);
        dg_output v = var(g, name, dg_shape1(1));
        snprintf(want_dev, sizeof want_dev, "/job:ps/task:%d", want[i]);
        assert_string_equal(dev(v), want_dev);
    }
    // Non-ps ops and ps ops pinned to another job do not consult the load function.
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape1(1));
    dg_graph_push_device(g, "/job:other");
    dg_output w = var(g, "w", dg_shape1(1));
    dg_graph_pop_device(g);
    end_setter(g);
    assert_string_equal(dev(a), "/job:worker");
    assert_string_equal(dev(w), "/job:other");
    assert_int_equal(lc.next, 9);
    free_setter_graph(&g, &fn);

    // A failing load function fails the node, naming it.
    lc.next = 0;
    lc.fail_at = 1;
    g = setter_graph(&o, &fn);
    (void)var(g, "v0", dg_shape1(1));
    dg_output v1 = dg_variable(g, "v1", DG_FLOAT32, dg_shape1(1), dg_init_zeros());
    assert_false(dg_output_ok(v1));
    assert_status(dg_graph_status(g), DG_INVALID_ARGUMENT, "replica_device_setter: no load for \"v1\"");
    free_setter_graph(&g, &fn);
}

static void test_byte_size_load_fn(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_status *st = dg_status_new();
    double load = -1;
    dg_output v = dg_variable(g, "v", DG_FLOAT64, dg_shape2(3, 5), dg_init_zeros());
    assert_true(dg_byte_size_load_fn(NULL, v.node, &load, st));
    assert_ok(st);
    assert_true(load == 120.0);
    dg_output s = dg_variable(g, "s", DG_INT32, dg_shape_scalar(), dg_init_zeros());
    assert_true(dg_byte_size_load_fn(NULL, s.node, &load, st));
    assert_true(load == 4.0);
    dg_output p = dg_placeholder(g, "p", DG_FLOAT32, dg_shape2(-1, 3));
    assert_false(dg_byte_size_load_fn(NULL, p.node, &load, st));
    assert_status(st, DG_INVALID_ARGUMENT, "op \"p\" (Placeholder): shape [?,3] is not fully defined");
    dg_node *n = dg_no_op(g, "n");
    assert_false(dg_byte_size_load_fn(NULL, n, &load, st));
    assert_status(st, DG_INVALID_ARGUMENT, "op \"n\" (NoOp) must have a single output");
    dg_status_free(&st);
    dg_graph_free(&g);
}

// The device function called directly: a malformed current device and a small buffer.
static void test_choose_direct(void **state) {
    (void)state;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    dg_device_fn *fn = setter(&o);
    dg_graph *g = dg_graph_new();
    dg_output v = var(g, "v", dg_shape1(2));
    dg_status *st = dg_status_new();
    char out[DG_DEVICE_NAME_MAX];
    assert_false(fn->choose(fn->ctx, v.node, "/job:ps/task:x", out, sizeof out, st));
    assert_status(st, DG_INVALID_ARGUMENT,
                  "replica_device_setter: op \"v\": device \"/job:ps/task:x\": task \"x\" is not an integer");
    dg_status_reset(st);
    assert_true(fn->choose(fn->ctx, v.node, "", out, sizeof out, st));
    assert_ok(st);
    assert_string_equal(out, "/job:ps/task:0");
    assert_true(fn->choose(fn->ctx, v.node, NULL, out, sizeof out, st));
    assert_string_equal(out, "/job:ps/task:1");
    char tiny[6];
    assert_false(fn->choose(fn->ctx, v.node, "/device:GPU:0", tiny, sizeof tiny, st));
    assert_status(st, DG_INVALID_ARGUMENT, "does not fit 6 bytes");
    dg_status_free(&st);
    free_setter_graph(&g, &fn);
    dg_device_fn_free(&fn);
    dg_device_fn_free(NULL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_robin_with_cluster),
        cmocka_unit_test(test_round_robin_ps_tasks),
        cmocka_unit_test(test_cpu_override),
        cmocka_unit_test(test_pin_variable_to_job),
        cmocka_unit_test(test_cpu_ps_device),
        cmocka_unit_test(test_no_merging),
        cmocka_unit_test(test_custom_jobs),
        cmocka_unit_test(test_worker_device_merge),
        cmocka_unit_test(test_no_ps_tasks),
        cmocka_unit_test(test_sparse_ps_job),
        cmocka_unit_test(test_custom_ps_ops),
        cmocka_unit_test(test_greedy_bytes),
        cmocka_unit_test(test_greedy_errors),
        cmocka_unit_test(test_option_errors),
        cmocka_unit_test(test_malformed_devices_fail_their_ops),
        cmocka_unit_test(test_device_spec_reading),
        cmocka_unit_test(test_standard_ps_ops),
        cmocka_unit_test(test_greedy_user_load),
        cmocka_unit_test(test_byte_size_load_fn),
        cmocka_unit_test(test_choose_direct),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
