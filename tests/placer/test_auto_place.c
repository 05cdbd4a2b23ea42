/* The automatic placer's parts: the cost model's FLOPs and bytes (against counts by hand), its
 * calibration files and their errors, the step simulator (hand-computed steps and memory, and on
 * random graphs a schedule checked for validity independently of how it was made), the placers
 * (requests, colocation, caps, never slower than their start) and their errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"
#include "placer_impl.h"
#include "testutil.h"

#define D0 "/job:worker/replica:0/task:0/device:CPU:0"
#define D1 "/job:worker/replica:0/task:0/device:CPU:1"
#define D2 "/job:worker/replica:0/task:1/device:CPU:0"
static const char *DEVS[] = {D0, D1, D2};

// 1 GFLOP/s, 1 GB/s, no overhead; links 10 us + 1 GB/s: times easy to add by hand.
static dg_cost_model *simple_model(void) {
    dg_cost_model *m = dg_cost_model_new();
    dg_status *st = dg_status_new();
    assert_true(dg_cost_model_set_device(m, "CPU", (dg_device_perf){1e9, 1e9, 0}, st));
    for (int k = 0; k < 3; k++) assert_true(dg_cost_model_set_link(m, (dg_link_kind)k, (dg_link_perf){1e-5, 1e9}, st));
    dg_status_free(&st);
    return m;
}

static dg_node **all_nodes(dg_graph *g, int *n) {
    *n = dg_graph_num_nodes(g);
    dg_node **nodes = malloc((size_t)*n * sizeof *nodes);
    for (int i = 0; i < *n; i++) nodes[i] = dg_graph_node(g, i);
    return nodes;
}

static void place_as_requested(dg_graph *g) {
    int n;
    dg_node **nodes = all_nodes(g, &n);
    dg_status *st = dg_status_new();
    assert_true(dg_place(nodes, n, DEVS, 3, NULL, st));
    free(nodes);
    dg_status_free(&st);
}

static void simulate(dg_graph *g, const dg_cost_model *m, dg_step_estimate *est) {
    int n;
    dg_node **nodes = all_nodes(g, &n);
    dg_status *st = dg_status_new();
    bool ok = dg_simulate_step(nodes, n, DEVS, 3, m, est, st);
    assert_ok(st);
    assert_true(ok);
    free(nodes);
    dg_status_free(&st);
}

static void test_op_work(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output a = dg_placeholder(g, "a", DG_FLOAT32, dg_shape2(7, 5));
    dg_output b = dg_placeholder(g, "b", DG_FLOAT32, dg_shape2(5, 3));
    dg_output mm = dg_matmul(g, "mm", a, b, false, false);
    dg_output at = dg_placeholder(g, "at", DG_FLOAT32, dg_shape2(5, 7));
    dg_output mt = dg_matmul(g, "mt", at, b, true, false);
    int64_t xd[4] = {2, 9, 9, 3}, fd[4] = {3, 3, 3, 4};
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape_make(4, xd));
    dg_output f = dg_placeholder(g, "f", DG_FLOAT32, dg_shape_make(4, fd));
    dg_output y = dg_conv2d(g, "y", x, f, 1, 1, DG_PADDING_VALID);
    dg_output r = dg_relu(g, "r", mm);
    assert_true(dg_graph_ok(g));
    dg_cost_model *m = dg_cost_model_new();
    double fl, by;
    // [7,5] x [5,3]: 7*3 outputs of 5 multiply-adds; bytes: 35 + 15 read, 21 written, 4 each.
    dg_cost_model_op_seconds(m, mm.node, "CPU", &fl, &by);
    assert_true(fl == 2.0 * 7 * 3 * 5);
    assert_true(by == 4.0 * (35 + 15 + 21));
    dg_cost_model_op_seconds(m, mt.node, "CPU", &fl, &by);
    assert_true(fl == 2.0 * 7 * 3 * 5);
    // VALID 3x3 over 9x9: 7x7 outputs, 4 channels, each 3*3*3 multiply-adds, batch 2.
    dg_cost_model_op_seconds(m, y.node, "CPU", &fl, &by);
    assert_true(fl == 2.0 * (2 * 7 * 7 * 4) * (3 * 3 * 3));
    // Relu of 21 floats: 21 read, 21 written; its time is the bytes' at 10 GB/s plus 2 us.
    double t = dg_cost_model_op_seconds(m, r.node, "CPU", &fl, &by);
    assert_true(by == 4.0 * 42);
    assert_true(fabs(t - (2e-6 + 168 / 10e9)) < 1e-15);
    // A measured time replaces the estimate, for its device type only.
    dg_status *st = dg_status_new();
    assert_true(dg_cost_model_set_measured(m, "r", "CPU", 0.25, st));
    assert_true(dg_cost_model_op_seconds(m, r.node, "CPU", NULL, NULL) == 0.25);
    assert_true(dg_cost_model_op_seconds(m, r.node, "GPU", NULL, NULL) < 0.001);
    assert_false(dg_cost_model_set_measured(m, "r", "CPU", NAN, st));
    assert_status(st, DG_INVALID_ARGUMENT, "from 0 to 1e4 seconds");
    // Figures that would make the simulator's products infinite are refused.
    assert_false(dg_cost_model_set_device(m, "CPU", (dg_device_perf){1e-310, 1e9, 0}, st));
    assert_status(st, DG_INVALID_ARGUMENT, "1 to 1e18");
    assert_false(dg_cost_model_set_link(m, DG_LINK_SAME_HOST, (dg_link_perf){1e300, 1e9}, st));
    assert_status(st, DG_INVALID_ARGUMENT, "latency_s from 0 to 1e4");
    // An unknown batch stands for unknown_dim in FLOPs as in bytes: [?, 5] x [5, 3] at 32 rows.
    dg_output ub = dg_placeholder(g, "ub", DG_FLOAT32, dg_shape2(-1, 5));
    dg_output umm = dg_matmul(g, "umm", ub, b, false, false);
    placer_op_seconds(m, umm.node, "CPU", 32, &fl, &by);
    assert_true(fl == 2.0 * 32 * 3 * 5);
    assert_true(by == 4.0 * (32 * 5 + 15 + 32 * 3));
    // Links: same task, same host, other hosts (from the cluster's addresses).
    assert_true(dg_cost_model_transfer_seconds(m, D0, D0, 1e6) == 0);
    assert_true(fabs(dg_cost_model_transfer_seconds(m, D0, D1, 2e4) - (2e-6 + 2e4 / 20e9)) < 1e-15);
    assert_true(fabs(dg_cost_model_transfer_seconds(m, D0, D2, 5e3) - (20e-6 + 5e3 / 5e9)) < 1e-15);
    dg_cluster *c = dg_cluster_from_spec_string("worker|10.0.0.1:2222;10.0.0.2:2222", st);
    assert_non_null(c);
    assert_true(dg_cost_model_set_hosts(m, c, st));
    assert_true(fabs(dg_cost_model_transfer_seconds(m, D0, D2, 5e3) - (100e-6 + 5e3 / 1.25e9)) < 1e-15);
    dg_cluster_free(&c);
    dg_status_free(&st);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_calibration_files(void **state) {
    dg_test_tmpdir *t = *state;
    char path[512];
    snprintf(path, sizeof path, "%s/cost.json", t->dir);
    dg_cost_model *m = dg_cost_model_new();
    dg_status *st = dg_status_new();
    assert_true(dg_cost_model_set_device(m, "CPU", (dg_device_perf){3e10, 4e9, 5e-6}, st));
    assert_true(dg_cost_model_set_link(m, DG_LINK_SAME_HOST, (dg_link_perf){7e-6, 3e9}, st));
    assert_true(dg_cost_model_save(m, path, st));
    dg_cost_model *m2 = dg_cost_model_new();
    assert_true(dg_cost_model_load(m2, path, st));
    assert_ok(st);
    const dg_device_perf *p = placer_device_perf(m2, "CPU");
    assert_true(p->flops_per_s == 3e10 && p->bytes_per_s == 4e9 && p->op_overhead_s == 5e-6);
    assert_true(m2->links[DG_LINK_SAME_HOST].latency_s == 7e-6 && m2->links[DG_LINK_SAME_HOST].bytes_per_s == 3e9);
    // Measured times go through the file, node names with quotes included.
    assert_true(dg_cost_model_set_measured(m, "a \"quoted\" node", "CPU", 0.125, st));
    assert_true(dg_cost_model_set_measured(m, "b", "GPU", 0.5, st));
    assert_true(dg_cost_model_save(m, path, st));
    dg_cost_model *m3 = dg_cost_model_new();
    assert_true(dg_cost_model_load(m3, path, st));
    assert_int_equal(m3->n_measured, 2);
    assert_int_equal(dg_cost_model_task_streams(m3, "CPU"), 0);
    dg_cost_model_free(&m3);
    // Shared streams go through the file too.
    assert_true(dg_cost_model_set_task_streams(m, "CPU", 3, st));
    assert_true(dg_cost_model_save(m, path, st));
    m3 = dg_cost_model_new();
    assert_true(dg_cost_model_load(m3, path, st));
    assert_int_equal(dg_cost_model_task_streams(m3, "CPU"), 3);
    dg_cost_model_free(&m3);
    // And the wake time of those streams' threads.
    assert_true(dg_cost_model_set_wake(m, "CPU", 4.5e-5, st));
    assert_true(dg_cost_model_save(m, path, st));
    m3 = dg_cost_model_new();
    assert_true(dg_cost_model_load(m3, path, st));
    assert_true(fabs(dg_cost_model_wake(m3, "CPU") - 4.5e-5) < 1e-12);
    dg_cost_model_free(&m3);
    // Wrong files name the file and key, and change nothing.
    write_file(path, "{\"devices\": {\"CPU\": {\"flops_per_s\": 9e9, \"bytes_per_s\": 1e9, \"op_overhead_s\": 0}}, "
                     "\"measured\": {\"CPU\": {\"n\": -1}}}");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "measured.CPU.n must be a finite number of seconds");
    assert_true(placer_device_perf(m2, "CPU")->flops_per_s == 3e10);
    write_file(path, "{\"devices\": {\"CPU\": {\"flops_per_s\": -1, \"bytes_per_s\": 1, \"op_overhead_s\": 0}}}");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "positive");
    assert_true(placer_device_perf(m2, "CPU")->flops_per_s == 3e10);
    write_file(path, "{\"devices\": {\"CPU\": {\"flops_per_s\": 9e9, \"bytes_per_s\": 1e9, \"op_overhead_s\": 0, "
                     "\"task_streams\": 1.5}}}");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "devices.CPU.task_streams must be a whole number from 0 to 1024");
    assert_true(placer_device_perf(m2, "CPU")->flops_per_s == 3e10);
    write_file(path, "{\"devices\": {\"CPU\": {\"flops_per_s\": 9e9, \"bytes_per_s\": 1e9, \"op_overhead_s\": 0, "
                     "\"wake_s\": 5}}}");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "devices.CPU.wake_s must be a number of seconds from 0 to 1");
    assert_true(placer_device_perf(m2, "CPU")->flops_per_s == 3e10);
    write_file(path, "{\"devices\": {\"CPU\": {\"flops_per_s\": \"fast\"}}}");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "devices.CPU.flops_per_s must be a number");
    write_file(path, "{\"links\": {\"same_task\": {\"latency_s\": 1e-6}}}");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "links.same_task.bytes_per_s");
    write_file(path, "{\"devices\": [1, 2");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "cost.json");
    write_file(path, "[]");
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_INVALID_ARGUMENT, "top level");
    snprintf(path, sizeof path, "%s/none.json", t->dir);
    assert_false(dg_cost_model_load(m2, path, st));
    assert_status(st, DG_NOT_FOUND, "none.json");
    dg_status_free(&st);
    dg_cost_model_free(&m);
    dg_cost_model_free(&m2);
}

// A chain x -> r1 on D0, then r2 and r3 of r1 on D1 and their sum s: Relu of 1000 floats
// reads and writes 8000 bytes, 8 us at 1 GB/s; the transfer of r1's 4000 bytes takes 10 us +
// 4 us, once for both readers; the Add reads 8000 and writes 4000 bytes, 12 us.
static void test_simulated_chain(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, D0);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(1000));
    dg_output r1 = dg_relu(g, "r1", x);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, D1);
    dg_output r2 = dg_relu(g, "r2", r1);
    dg_output r3 = dg_relu(g, "r3", r1);
    dg_add(g, "s", r2, r3);
    dg_graph_pop_device(g);
    place_as_requested(g);
    dg_cost_model *m = simple_model();
    dg_step_estimate est;
    simulate(g, m, &est);
    // r1 ends at 8 us, arrives at 22 us; r2 runs 22-30, r3 30-38, s 38-50.
    assert_true(fabs(est.step_s - 50e-6) < 1e-12);
    assert_int_equal(est.n_transfers, 1);
    assert_int_equal(est.transfer_bytes, 4000);
    assert_true(fabs(est.busy_s[0] - 8e-6) < 1e-12 && fabs(est.busy_s[1] - 28e-6) < 1e-12);
    // Memory on D0: x and r1 (8000) while r1 runs. D1: the received r1 with r2 and r3 (12000)
    // until r3 ends; then r2, r3 and s.
    assert_int_equal(est.peak_bytes[0], 8000);
    assert_int_equal(est.peak_bytes[1], 12000);
    // Bytes held without freeing: outputs, and D1's copy of r1.
    assert_int_equal(est.static_bytes[0], 8000);
    assert_int_equal(est.static_bytes[1], 16000);
    dg_step_estimate_clear(&est);
    // On one device: 8 + 8 + 8 + 12 us, no transfer; r1, r2 and r3 alive at once (12000).
    dg_graph_clear_devices(g);
    dg_graph *h = g;
    int n;
    dg_node **nodes = all_nodes(h, &n);
    dg_status *st = dg_status_new();
    const char *one[1] = {D0};
    assert_true(dg_place(nodes, n, one, 1, NULL, st));
    assert_true(dg_simulate_step(nodes, n, one, 1, m, &est, st));
    assert_true(fabs(est.step_s - 36e-6) < 1e-12);
    assert_int_equal(est.n_transfers, 0);
    assert_int_equal(est.peak_bytes[0], 12000);
    dg_step_estimate_clear(&est);
    free(nodes);
    dg_status_free(&st);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

// Two tensors from D0 to D1 share one channel: the second waits for the first's bytes.
static void test_simulated_channel_contention(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, D0);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(1000));
    dg_output y = dg_placeholder(g, "y", DG_FLOAT32, dg_shape1(1000));
    dg_graph_pop_device(g);
    dg_graph_push_device(g, D1);
    dg_output s = dg_add(g, "s", x, y);
    dg_graph_pop_device(g);
    (void)s;
    place_as_requested(g);
    dg_cost_model *m = simple_model();
    dg_step_estimate est;
    simulate(g, m, &est);
    // x: 0-4 us on the wire, arrives 14; y: 4-8, arrives 18; Add reads 8000 and writes 4000
    // bytes: 12 us. Step 30 us.
    assert_true(fabs(est.step_s - 30e-6) < 1e-12);
    assert_int_equal(est.n_transfers, 2);
    // A variable stays: its bytes count on its device from the start.
    dg_step_estimate_clear(&est);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

// A task's CPUs sharing two streams (a process's two inter-op threads): three Relus of x on
// D0 and one on D1 (task 0), two Relus of y on D2 (task 1, streams of its own). Each Relu of
// 1000 floats takes 8 us; x reaches D1 after 10 + 4 us.
static void test_simulated_shared_streams(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, D0);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(1000));
    dg_relu(g, "r1", x);
    dg_relu(g, "r2", x);
    dg_relu(g, "r3", x);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, D1);
    dg_relu(g, "r4", x);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, D2);
    dg_output y = dg_placeholder(g, "y", DG_FLOAT32, dg_shape1(1000));
    dg_relu(g, "q1", y);
    dg_relu(g, "q2", y);
    dg_graph_pop_device(g);
    place_as_requested(g);
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    dg_step_estimate est;
    // A stream per device: D0 runs its three one after another (24 us), D1 14-22, D2 0-16.
    assert_int_equal(dg_cost_model_task_streams(m, "CPU"), 0);
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 24e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // Two streams per task: r1 and r2 0-8, r3 8-16; r4, ready at 14, on the stream free since 8:
    // 14-22. Task 1's two streams are its own: q1 and q2 0-8. Busy time stays per device.
    assert_true(dg_cost_model_set_task_streams(m, "CPU", 2, st));
    assert_int_equal(dg_cost_model_task_streams(m, "CPU"), 2);
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 22e-6) < 1e-12);
    assert_true(fabs(est.busy_s[0] - 24e-6) < 1e-12 && fabs(est.busy_s[1] - 8e-6) < 1e-12 &&
                fabs(est.busy_s[2] - 16e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // Errors: an unknown type, a count out of range; nothing changes.
    assert_false(dg_cost_model_set_task_streams(m, "TPU", 2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "task streams of device type TPU");
    assert_false(dg_cost_model_set_task_streams(m, "CPU", -1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "from 0 to 1024");
    assert_false(dg_cost_model_set_task_streams(m, "CPU", 1025, st));
    assert_int_equal(dg_cost_model_task_streams(m, "CPU"), 2);
    assert_int_equal(dg_cost_model_task_streams(m, "TPU"), 0);
    dg_status_free(&st);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

// The executor's rule for the simulator: hands over the ops whose names start with 'h'.
static bool hand_over_h(void *ctx, const dg_node *n, const char *device_type) {
    (void)device_type;
    (*(int *)ctx)++;
    return dg_node_name(n)[0] == 'h';
}

static bool hand_over_none(void *ctx, const dg_node *n, const char *device_type) {
    (void)ctx;
    (void)n;
    (void)device_type;
    return false;
}

// A task's two CPUs share two threads, run as the executor runs them (dg_cost_model_set_handoff):
// x on D0 (free) makes r1 and h2 ready there (Relu, 8 us each), r4 on D1 reads x over the link
// (10 us + 4 us: ready at 14).
static void test_simulated_executor_threads(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, D0);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(1000));
    dg_relu(g, "r1", x);
    dg_relu(g, "h2", x);
    dg_graph_pop_device(g);
    place_as_requested(g);
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    dg_step_estimate est;
    assert_true(dg_cost_model_set_task_streams(m, "CPU", 2, st));
    // No rule: any op on the first thread free, at once: r1 and h2 side by side, 0-8.
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 8e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // The thread that ran x keeps the first op it made ready (r1, 0-8) and hands h2 over to the
    // idle thread: 0-8 too, with no wake time.
    int asked = 0;
    dg_cost_model_set_handoff(m, hand_over_h, &asked);
    simulate(g, m, &est);
    assert_true(asked > 0);
    assert_true(fabs(est.step_s - 8e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // The idle thread wakes in 5 us: h2 5-13.
    assert_true(dg_cost_model_set_wake(m, "CPU", 5e-6, st));
    assert_true(dg_cost_model_wake(m, "CPU") == 5e-6);
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 13e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // A rule that hands nothing over: x's thread runs r1 then h2, 0-16, and no wake time.
    dg_cost_model_set_handoff(m, hand_over_none, NULL);
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 16e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // A value from the other device is handed over: r4 on D1, ready at 14, goes to thread 1
    // (thread 0 runs r1 and h2 until 16), which sleeps and wakes first: 19-27.
    dg_graph_push_device(g, D1);
    dg_relu(g, "r4", x);
    dg_graph_pop_device(g);
    place_as_requested(g);
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 27e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // Without the rule: r1, h2 0-8 on two threads, r4 at 14, at once: 14-22.
    dg_cost_model_set_handoff(m, NULL, NULL);
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 22e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    // Errors: an unknown type, a time out of range or not a number; nothing changes.
    assert_false(dg_cost_model_set_wake(m, "TPU", 1e-6, st));
    assert_status(st, DG_INVALID_ARGUMENT, "wake time of device type TPU");
    assert_false(dg_cost_model_set_wake(m, "CPU", -1e-6, st));
    assert_status(st, DG_INVALID_ARGUMENT, "from 0 to 1 second");
    assert_false(dg_cost_model_set_wake(m, "CPU", NAN, st));
    assert_false(dg_cost_model_set_wake(m, "CPU", 2, st));
    assert_true(dg_cost_model_wake(m, "CPU") == 5e-6);
    assert_true(dg_cost_model_wake(m, "TPU") == 0);
    dg_status_free(&st);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

// Random graphs, random placements on three CPUs of one task (no copies between tasks, which
// test_simulated_copies_between_tasks covers): the schedule the simulator made must be valid
// (every op starts after its inputs are on its device; a device runs one op at a time) and
// work-conserving (a device is not idle while an op waits for it), checked from its times alone.
static const char *TASK0[] = {D0, D1, "/job:worker/replica:0/task:0/device:CPU:2"};
static void test_simulated_schedules_are_valid(void **state) {
    (void)state;
    uint64_t rng = 99;
    for (int trial = 0; trial < 40; trial++) {
        dg_graph *g = dg_graph_new();
        int n = 5 + (int)dg_test_uniform(&rng, 0, 40);
        dg_output *outs = malloc((size_t)n * sizeof *outs);
        for (int i = 0; i < n; i++) {
            int64_t len = 100 * (1 + (int64_t)dg_test_uniform(&rng, 0, 20));
            if (i < 3) {
                outs[i] = dg_placeholder(g, NULL, DG_FLOAT32, dg_shape2(len, 10));
                continue;
            }
            dg_output a = outs[(int)dg_test_uniform(&rng, 0, i)];
            dg_output b = outs[(int)dg_test_uniform(&rng, 0, i)];
            dg_shape sa = dg_output_shape(a), sb = dg_output_shape(b);
            outs[i] = sa.dims[0] == sb.dims[0] ? dg_add(g, NULL, a, b) : dg_relu(g, NULL, a);
        }
        assert_true(dg_graph_ok(g));
        int nn;
        dg_node **nodes = all_nodes(g, &nn);
        dg_cost_model *m = simple_model();
        placer_problem p;
        dg_status *st = dg_status_new();
        assert_true(placer_problem_build(&p, nodes, nn, TASK0, 3, m, 0, st));
        int *dev = malloc((size_t)nn * sizeof *dev);
        for (int i = 0; i < nn; i++) dev[i] = (int)dg_test_uniform(&rng, 0, 3);
        placer_sim sim;
        memset(&sim, 0, sizeof sim);
        double step = placer_simulate(&p, dev, &sim);
        assert_true(step > 0);
        double max_finish = 0;
        for (int v = 0; v < nn; v++) {
            double c = p.cost[(size_t)v * p.n_types + p.dev_type[dev[v]]];
            assert_true(fabs(sim.finish[v] - sim.start[v] - c) < 1e-15);
            if (sim.finish[v] > max_finish) max_finish = sim.finish[v];
            // Inputs there: a local one when its op ends, a remote one when a transfer of that
            // tensor to this device has arrived.
            double ready = 0;
            for (int e = p.pred_start[v]; e < p.pred_start[v + 1]; e++) {
                int u = p.pred[e];
                double arr = sim.finish[u];
                if (dev[u] != dev[v]) {
                    arr = INFINITY;
                    for (int x = 0; x < sim.n_xfers; x++)
                        if (sim.xfers[x].gid == p.pred_gid[e] && sim.xfers[x].dst == dev[v]) {
                            assert_true(sim.xfers[x].start >= sim.finish[u] - 1e-15);
                            arr = sim.xfers[x].arrive;
                        }
                }
                assert_true(isfinite(arr));
                if (arr > ready) ready = arr;
            }
            assert_true(sim.start[v] >= ready - 1e-15);
            // Idle only if busy: when v waited past its ready time, some op of its device ran
            // just before it started.
            if (sim.start[v] > ready + 1e-15) {
                bool busy = false;
                for (int w = 0; w < nn && !busy; w++)
                    busy = w != v && dev[w] == dev[v] && sim.start[w] < sim.start[v] &&
                           fabs(sim.finish[w] - sim.start[v]) < 1e-15;
                assert_true(busy);
                // And the simulation names that op as what v waited for.
                int b = sim.blocker[v];
                assert_true(b >= 0 && b != v && dev[b] == dev[v]);
                assert_true(fabs(sim.finish[b] - sim.start[v]) < 1e-15);
            } else {
                assert_int_equal(sim.blocker[v], -1);
            }
            for (int w = 0; w < nn; w++)
                if (w != v && dev[w] == dev[v])
                    assert_true(sim.finish[w] <= sim.start[v] + 1e-15 || sim.finish[v] <= sim.start[w] + 1e-15);
        }
        assert_true(step == max_finish);
        // The same placement simulates to the same step (deterministic).
        assert_true(placer_simulate(&p, dev, &sim) == step);
        // Bounded: the whole step when it ends within the bound, else a time past the bound
        // and no later than the step's end.
        assert_true(placer_simulate_bounded(&p, dev, &sim, step) == step);
        double cut = placer_simulate_bounded(&p, dev, &sim, step * 0.5);
        assert_true(cut > step * 0.5 && cut <= step);
        placer_sim_clear(&sim);
        placer_problem_clear(&p);
        free(dev);
        free(nodes);
        free(outs);
        dg_status_free(&st);
        dg_cost_model_free(&m);
        dg_graph_free(&g);
    }
}

// A two-layer model with Adam: the placers keep each variable with its update and slots, keep
// pinned nodes where they were asked, stay under the caps, and AUTO is never slower than the
// best of the three.
// What a run of target needs (inputs and control inputs, transitively), in id order.
static dg_node **needed(dg_graph *g, dg_node *target, int *n_out) {
    int n = dg_graph_num_nodes(g);
    char *mark = calloc((size_t)n, 1);
    mark[target->id] = 1;
    for (int id = target->id; id >= 0; id--) {
        if (!mark[id]) continue;
        dg_node *x = dg_graph_node(g, id);
        for (int i = 0; i < x->n_inputs; i++) mark[x->inputs[i].node->id] = 1;
        for (int i = 0; i < x->n_ctrl; i++) mark[x->ctrl_inputs[i]->id] = 1;
    }
    dg_node **out = malloc((size_t)n * sizeof *out);
    int m = 0;
    for (int id = 0; id < n; id++)
        if (mark[id]) out[m++] = dg_graph_node(g, id);
    free(mark);
    *n_out = m;
    return out;
}

static dg_node *model_train;   // the last model()'s train op

static dg_graph *model(bool pin) {
    dg_graph *g = dg_graph_new();
    if (pin) dg_graph_push_device(g, "/job:worker/task:1");
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(64, 256));
    if (pin) dg_graph_pop_device(g);
    dg_output h = x;
    for (int l = 0; l < 4; l++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", l);
        dg_output w = dg_variable(g, name, DG_FLOAT32, dg_shape2(256, 256), dg_init_zeros());
        h = dg_relu(g, NULL, dg_matmul(g, NULL, h, w, false, false));
    }
    dg_output loss = dg_sum(g, "loss", h, NULL, 0, false);
    dg_optimizer opt = dg_adam(g, 0.1);
    model_train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    assert_non_null(model_train);
    assert_true(dg_graph_ok(g));
    return g;
}

static int dev_index(const char *d) {
    for (int i = 0; i < 3; i++)
        if (strcmp(DEVS[i], d) == 0) return i;
    return -1;
}

static void test_placers_honour_constraints(void **state) {
    (void)state;
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    for (int k = 0; k <= 4; k++) {
        dg_graph *g = model(true);
        // Total static bytes on one device, then caps of 45% of it on each of three.
        dg_auto_place_options o = dg_auto_place_options_default();
        o.cost = m;
        o.placer = DG_AUTO_PLACER_M_TOPO;
        o.time_budget_s = -1;
        dg_auto_place_report r;
        assert_true(dg_auto_place(g, DEVS, 3, &o, &r, st));
        int64_t total = r.estimate.static_bytes[0] + r.estimate.static_bytes[1] + r.estimate.static_bytes[2];
        dg_auto_place_report_clear(&r);
        int64_t caps[3] = {total * 45 / 100, total * 45 / 100, total * 45 / 100};
        o.placer = (dg_auto_placer)k;
        o.memory_caps = caps;
        const dg_node *targets[1] = {model_train};
        o.targets = targets;
        o.n_targets = 1;
        o.time_budget_s = 0.2;
        char w0_before[128];
        snprintf(w0_before, sizeof w0_before, "%s", dg_node_assigned_device(dg_graph_find(g, "w0")));
        bool ok = dg_auto_place(g, DEVS, 3, &o, &r, st);
        if (!ok && k != DG_AUTO_PLACER_AUTO) {
            // A list placer may miss caps this tight; it says so and changes nothing. AUTO,
            // with METIS among its starts, must not.
            assert_status(st, DG_RESOURCE_EXHAUSTED, "cap");
            assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "w0")), w0_before);
            dg_graph_free(&g);
            continue;
        }
        assert_ok(st);
        assert_true(ok);
        for (int d = 0; d < 3; d++) assert_true(r.estimate.static_bytes[d] <= caps[d]);
        for (int d = 0; d < 3; d++) assert_true(r.estimate.peak_bytes[d] <= r.estimate.static_bytes[d]);
        const char *w0 = dg_node_assigned_device(dg_graph_find(g, "w0"));
        assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "w0/Adam")), w0);
        assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "Adam/update_w0/ApplyAdam")), w0);
        assert_string_equal(dg_node_assigned_device(dg_graph_find(g, "x")), D2);
        // The simulation of the nodes a training step runs (without initializers, as the
        // placer took the step) agrees with the report's.
        dg_step_estimate est;
        int n_step;
        dg_node **step = needed(g, model_train, &n_step);
        assert_true(dg_simulate_step(step, n_step, DEVS, 3, m, &est, st));
        assert_true(fabs(est.step_s - r.predicted_step_s) <= 1e-12 * r.predicted_step_s);
        for (int d = 0; d < 3; d++) assert_int_equal(est.static_bytes[d], r.estimate.static_bytes[d]);
        dg_step_estimate_clear(&est);
        free(step);
        if (k == DG_AUTO_PLACER_AUTO) {
            double best = INFINITY;
            for (int j = 1; j <= 4; j++)
                if (r.candidate_step_s[j] > 0 && r.candidate_step_s[j] < best) best = r.candidate_step_s[j];
            assert_true(isfinite(best));
            assert_true(r.predicted_step_s <= best);
        } else {
            assert_true(r.chosen == (dg_auto_placer)k);
            assert_true(r.predicted_step_s == r.candidate_step_s[k]);
        }
        dg_auto_place_report_clear(&r);
        dg_graph_free(&g);
    }
    dg_status_free(&st);
    dg_cost_model_free(&m);
}

// Parallel branches of equal work: m-ETF spreads them; a single device would take four times.
static void test_etf_spreads_parallel_work(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(64, 64));
    dg_output outs[4];
    for (int b = 0; b < 4; b++) {
        dg_output w = dg_placeholder(g, NULL, DG_FLOAT32, dg_shape2(64, 64));
        dg_output h = x;
        for (int l = 0; l < 8; l++) h = dg_matmul(g, NULL, h, w, false, false);
        outs[b] = h;
    }
    dg_output s = dg_add(g, NULL, dg_add(g, NULL, outs[0], outs[1]), dg_add(g, NULL, outs[2], outs[3]));
    (void)s;
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    dg_auto_place_options o = dg_auto_place_options_default();
    o.cost = m;
    o.placer = DG_AUTO_PLACER_M_ETF;
    dg_auto_place_report r;
    assert_true(dg_auto_place(g, DEVS, 3, &o, &r, st));
    // One MatMul: 2*64^3 FLOPs at 1 GFLOP/s = 524 us; 32 of them on one device: 16.8 ms.
    double serial = 32 * 2.0 * 64 * 64 * 64 / 1e9;
    assert_true(r.predicted_step_s < 0.5 * serial);
    int used[3] = {0, 0, 0};
    for (int i = 0; i < dg_graph_num_nodes(g); i++) used[dev_index(dg_node_assigned_device(dg_graph_node(g, i)))]++;
    assert_true(used[0] > 0 && used[1] > 0 && used[2] > 0);
    dg_auto_place_report_clear(&r);
    dg_status_free(&st);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

// Between the CPUs of two tasks each end copies the bytes: x -> r1 on D0 (task 0), r2 on D2
// (task 1). r1 ends at 8 us; D0 copies r1 out from 8 to 12 us (4000 bytes at 1 GB/s); it arrives
// at 8 + 4 + 10 = 22 us; D2 copies it in from 22 to 26 us; r2 runs 26-34 us.
static void test_simulated_copies_between_tasks(void **state) {
    (void)state;
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, D0);
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(1000));
    dg_output r1 = dg_relu(g, "r1", x);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, D2);
    dg_relu(g, "r2", r1);
    dg_graph_pop_device(g);
    place_as_requested(g);
    dg_cost_model *m = simple_model();
    dg_step_estimate est;
    simulate(g, m, &est);
    assert_true(fabs(est.step_s - 34e-6) < 1e-12);
    assert_true(fabs(est.busy_s[0] - 12e-6) < 1e-12 && fabs(est.busy_s[2] - 12e-6) < 1e-12);
    dg_step_estimate_clear(&est);
    dg_cost_model_free(&m);
    dg_graph_free(&g);
}

// No placement's step is shorter than the critical path the report gives: over random graphs,
// every placer's prediction, and random placements simulated directly, are at least it.
static void test_critical_path_bounds_every_step(void **state) {
    (void)state;
    uint64_t rng = 7;
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    for (int trial = 0; trial < 20; trial++) {
        dg_graph *g = dg_graph_new();
        int n = 6 + (int)dg_test_uniform(&rng, 0, 30);
        dg_output outs[64];
        for (int i = 0; i < n; i++) {
            if (i < 2) {
                outs[i] = dg_placeholder(g, NULL, DG_FLOAT32, dg_shape2(32, 32));
                continue;
            }
            dg_output a = outs[(int)dg_test_uniform(&rng, 0, i)], b = outs[(int)dg_test_uniform(&rng, 0, i)];
            outs[i] = dg_test_uniform(&rng, 0, 1) < 0.5 ? dg_matmul(g, NULL, a, b, false, false) : dg_add(g, NULL, a, b);
        }
        dg_auto_place_options o = dg_auto_place_options_default();
        o.cost = m;
        o.time_budget_s = 0.01;
        dg_auto_place_report r;
        assert_true(dg_auto_place(g, DEVS, 3, &o, &r, st));
        assert_true(r.critical_path_s > 0);
        assert_true(r.critical_path_s <= r.predicted_step_s * (1 + 1e-12));
        for (int k = 1; k <= 4; k++)
            if (r.candidate_step_s[k] > 0) assert_true(r.critical_path_s <= r.candidate_step_s[k] * (1 + 1e-12));
        // The critical path by hand: each op's time (all CPUs alike) after its inputs' longest.
        int nn;
        dg_node **nodes = all_nodes(g, &nn);
        double *done = calloc((size_t)nn, sizeof *done), longest = 0;
        for (int i = 0; i < nn; i++) {
            double start = 0;
            for (int k = 0; k < dg_node_num_inputs(nodes[i]); k++) {
                dg_node *u = dg_node_input(nodes[i], k).node;
                if (done[u->id] > start) start = done[u->id];
            }
            done[i] = start + dg_cost_model_op_seconds(m, nodes[i], "CPU", NULL, NULL);
            if (done[i] > longest) longest = done[i];
        }
        assert_true(fabs(longest - r.critical_path_s) <= 1e-12 * longest);
        free(done);
        free(nodes);
        dg_auto_place_report_clear(&r);
        dg_graph_free(&g);
    }
    dg_status_free(&st);
    dg_cost_model_free(&m);
}

// A chain of layers whose weights do not fit on one device: the automatic placement is at
// least as fast as the expert's layer-wise split of the same model (units in equal runs,
// gradients beside their ops), and under the caps.
static dg_graph *chain_model(const char *const *unit_dev, int n_units, dg_node **train) {
    dg_graph *g = dg_graph_new();
    dg_output h = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(16, 128));
    for (int l = 0; l < 8; l++) {
        if (unit_dev) dg_graph_push_device(g, unit_dev[l * n_units / 8]);
        char name[16];
        snprintf(name, sizeof name, "w%d", l);
        dg_output w = dg_variable(g, name, DG_FLOAT32, dg_shape2(128, 128), dg_init_zeros());
        h = dg_tanh(g, NULL, dg_matmul(g, NULL, h, w, false, false));
        if (unit_dev) dg_graph_pop_device(g);
    }
    dg_output loss = dg_sum(g, "loss", h, NULL, 0, false);
    dg_optimizer opt = dg_momentum(g, 0.1, 0.9, false);
    opt.colocate_gradients_with_ops = true;
    *train = dg_optimizer_minimize(&opt, loss, (dg_output){NULL, 0});
    assert_non_null(*train);
    return g;
}

static void test_chain_at_least_as_fast_as_expert(void **state) {
    (void)state;
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    dg_node *train;
    dg_graph *ge = chain_model(DEVS, 3, &train);
    int n;
    dg_node **step = needed(ge, train, &n);
    assert_true(dg_place(step, n, DEVS, 3, NULL, st));
    dg_step_estimate ex;
    assert_true(dg_simulate_step(step, n, DEVS, 3, m, &ex, st));
    int64_t total = ex.static_bytes[0] + ex.static_bytes[1] + ex.static_bytes[2], caps[3];
    for (int d = 0; d < 3; d++) caps[d] = total / 2;
    dg_graph *ga = chain_model(NULL, 0, &train);
    dg_auto_place_options o = dg_auto_place_options_default();
    o.cost = m;
    o.memory_caps = caps;
    const dg_node *targets[1] = {train};
    o.targets = targets;
    o.n_targets = 1;
    dg_auto_place_report r;
    assert_true(dg_auto_place(ga, DEVS, 3, &o, &r, st));
    assert_ok(st);
    for (int d = 0; d < 3; d++) assert_true(r.estimate.static_bytes[d] <= caps[d]);
    assert_true(r.predicted_step_s <= ex.step_s * (1 + 1e-9));
    dg_auto_place_report_clear(&r);
    dg_step_estimate_clear(&ex);
    free(step);
    dg_graph_free(&ge);
    dg_graph_free(&ga);
    dg_status_free(&st);
    dg_cost_model_free(&m);
}

// Two recurrent layers unrolled over time, each step of layer 1 reading layer 0's output of the
// same step: on one device they run one after the other; with layer l on device l, layer 1's
// step t overlaps layer 0's step t + 1. The weights (read by every step) tie each layer
// together, so METIS's two parts are the layers, and the cluster moves find the split that a
// single move of one group at a time could not: from everything on one device, the layers'
// own split, as fast as the expert's by the same simulator.
static dg_graph *rnn_model(const char *const *layer_dev, bool with_other) {
    dg_graph *g = dg_graph_new();
    enum { T = 8, B = 4, H = 128 };
    dg_output in[T], zero = dg_placeholder(g, "zero", DG_FLOAT32, dg_shape2(B, H));
    for (int t = 0; t < T; t++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", t);
        in[t] = dg_placeholder(g, name, DG_FLOAT32, dg_shape2(B, H));
    }
    for (int l = 0; l < 2; l++) {
        if (layer_dev) dg_graph_push_device(g, layer_dev[l]);
        char name[16];
        snprintf(name, sizeof name, "w%d", l);
        dg_output w = dg_variable(g, name, DG_FLOAT32, dg_shape2(2 * H, H), dg_init_zeros());
        dg_output h = zero;
        for (int t = 0; t < T; t++) {
            dg_output xh[2] = {in[t], h};
            h = dg_tanh(g, NULL, dg_matmul(g, NULL, dg_concat(g, NULL, xh, 2, 1), w, false, false));
            in[t] = h;
        }
        if (layer_dev) dg_graph_pop_device(g);
    }
    dg_output top = dg_add_n(g, "top", in, T);
    dg_sum(g, "loss", top, NULL, 0, false);
    if (with_other) {   // a third layer's work of its own, on its own inputs
        dg_output w = dg_variable(g, "w2", DG_FLOAT32, dg_shape2(2 * H, H), dg_init_zeros()), h = zero;
        dg_output outs[T];
        for (int t = 0; t < T; t++) {
            char name[16];
            snprintf(name, sizeof name, "y%d", t);
            dg_output xh[2] = {dg_placeholder(g, name, DG_FLOAT32, dg_shape2(B, H)), h};
            outs[t] = h = dg_tanh(g, NULL, dg_matmul(g, NULL, dg_concat(g, NULL, xh, 2, 1), w, false, false));
        }
        dg_sum(g, "other", dg_add_n(g, NULL, outs, T), NULL, 0, false);
    }
    assert_true(dg_graph_ok(g));
    return g;
}

static int var_dev(dg_node **nodes, int n, const int *dev, const char *name) {
    for (int v = 0; v < n; v++)
        if (strcmp(nodes[v]->name, name) == 0) return dev[v];
    return -1;
}

// A placer's state over all of g's nodes on devs: its groups, problem and state (no caps).
typedef struct placer_fixture {
    dg_node **nodes;
    int n;
    placer_groups pg;
    placer_problem p;
    placer_state a;
} placer_fixture;

static void fixture_init(placer_fixture *f, dg_graph *g, const char *const *devs, int nd, const dg_cost_model *m) {
    dg_status *st = dg_status_new();
    f->nodes = all_nodes(g, &f->n);
    assert_true(placer_groups_build(f->nodes, f->n, devs, nd, NULL, &f->pg, st));
    assert_true(placer_problem_build(&f->p, f->nodes, f->n, devs, nd, m, 0, st));
    assert_true(placer_state_init(&f->a, &f->p, &f->pg, NULL, st));
    dg_status_free(&st);
}

static void fixture_clear(placer_fixture *f) {
    placer_state_clear(&f->a);
    placer_problem_clear(&f->p);
    placer_groups_clear(&f->pg);
    free(f->nodes);
}

static void test_cluster_moves_split_layers(void **state) {
    (void)state;
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    // The expert's split, placed and simulated.
    const char *layer_dev[2] = {D0, D1};
    dg_graph *ge = rnn_model(layer_dev, false);
    int ne;
    dg_node **enodes = all_nodes(ge, &ne);
    assert_true(dg_place(enodes, ne, TASK0, 2, NULL, st));
    dg_step_estimate ex;
    assert_true(dg_simulate_step(enodes, ne, TASK0, 2, m, &ex, st));
    // The same model without scopes, everything on device 0 to start.
    dg_graph *g = rnn_model(NULL, false);
    placer_fixture f;
    fixture_init(&f, g, TASK0, 2, m);
    placer_state *a = &f.a;
    placer_reset(a);
    for (int gi = 0; gi < f.pg.n_groups; gi++) placer_put(a, gi, 0);
    placer_sim sim;
    memset(&sim, 0, sizeof sim);
    double one = placer_simulate(&f.p, a->dev, &sim), step = one;
    assert_true(placer_cluster_refine(a, a, 2, &sim, &step, 1e300, 1) >= 1);
    // What it reports is what its placement simulates to, and within 1% of the expert's (METIS
    // may cut a layer's first or last op to the other side).
    assert_true(placer_simulate(&f.p, a->dev, &sim) == step);
    assert_true(step <= ex.step_s * 1.01);
    assert_true(step < 0.75 * one);
    // Each layer's ops on one device, the two layers apart.
    int d0 = var_dev(f.nodes, f.n, a->dev, "w0"), d1 = var_dev(f.nodes, f.n, a->dev, "w1");
    assert_true(d0 >= 0 && d1 >= 0 && d0 != d1);
    // Fewer than two parts: nothing to move.
    double before = step;
    assert_int_equal(placer_cluster_refine(a, a, 1, &sim, &step, 1e300, 1), 0);
    assert_true(step == before);
    placer_sim_clear(&sim);
    fixture_clear(&f);
    dg_step_estimate_clear(&ex);
    free(enodes);
    dg_graph_free(&g);
    dg_graph_free(&ge);
    dg_status_free(&st);
    dg_cost_model_free(&m);
}

// Swaps where a cap forbids a move: three devices that each hold one layer's bytes, the two
// recurrent layers on the first and the third (another task, over a slow link) and a third
// layer's own work on the second. Moving a recurrent layer to the second device does not fit,
// nor does moving the other work away; swapping it with the layer on the third does, and puts
// the two recurrent layers beside each other over the fast link.
static void test_cluster_swaps_under_caps(void **state) {
    (void)state;
    dg_cost_model *m = simple_model();
    dg_status *st = dg_status_new();
    assert_true(dg_cost_model_set_link(m, DG_LINK_SAME_HOST, (dg_link_perf){1e-3, 1e7}, st));
    dg_graph *g = rnn_model(NULL, true);
    placer_fixture f;
    fixture_init(&f, g, DEVS, 3, m);
    // The layers as METIS's three parts, which the cluster moves use too (same seed).
    int ng = f.pg.n_groups;
    int *part = malloc((size_t)ng * sizeof *part);
    // Part counts METIS cannot make are refused, named.
    assert_false(placer_metis_parts(&f.a, 1, 1.5, 1, part, st));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_non_null(strstr(dg_status_message(st), "1 parts"));
    assert_false(placer_metis_parts(&f.a, ng + 1, 1.5, 1, part, st));
    assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
    assert_true(placer_metis_parts(&f.a, 3, 1.5, 1, part, st));
    int pw[3];
    for (int l = 0; l < 3; l++) {
        char name[8];
        snprintf(name, sizeof name, "w%d", l);
        pw[l] = -1;
        for (int v = 0; v < f.n; v++)
            if (strcmp(f.nodes[v]->name, name) == 0) pw[l] = part[f.pg.group_of[v]];
    }
    assert_true(pw[0] >= 0 && pw[1] >= 0 && pw[2] >= 0 && pw[0] != pw[1] && pw[1] != pw[2] && pw[0] != pw[2]);
    int64_t bytes[3] = {0, 0, 0};
    for (int gi = 0; gi < ng; gi++) bytes[part[gi]] += f.a.group_bytes[gi];
    int64_t most = bytes[0] > bytes[1] ? bytes[0] : bytes[1];
    if (bytes[2] > most) most = bytes[2];
    // Room for one part and the copies it receives, not for two.
    int64_t caps[3] = {most * 3 / 2, most * 3 / 2, most * 3 / 2};
    placer_state a;
    assert_true(placer_state_init(&a, &f.p, &f.pg, caps, st));
    placer_reset(&a);
    int start_dev[3];
    start_dev[pw[0]] = 0;
    start_dev[pw[1]] = 2;
    start_dev[pw[2]] = 1;
    for (int gi = 0; gi < ng; gi++) placer_put(&a, gi, start_dev[part[gi]]);
    int stamp[3];
    int64_t usage[3];
    placer_static_usage(&f.p, a.dev, usage, stamp);
    for (int d = 0; d < 3; d++) assert_true(usage[d] <= caps[d]);
    placer_static_usage(&f.p, a.dev, a.used, stamp);
    placer_sim sim;
    memset(&sim, 0, sizeof sim);
    double start = placer_simulate(&f.p, a.dev, &sim), step = start;
    assert_true(placer_cluster_refine(&a, &a, 3, &sim, &step, 1e300, 1) >= 1);
    assert_true(step < start);
    assert_true(placer_simulate(&f.p, a.dev, &sim) == step);
    placer_static_usage(&f.p, a.dev, usage, stamp);
    for (int d = 0; d < 3; d++) assert_true(usage[d] <= caps[d]);
    // The recurrent layers on the two CPUs of task 0, the other work on task 1.
    int d0 = var_dev(f.nodes, f.n, a.dev, "w0"), d1 = var_dev(f.nodes, f.n, a.dev, "w1");
    assert_true(d0 != d1 && d0 != 2 && d1 != 2);
    assert_int_equal(var_dev(f.nodes, f.n, a.dev, "w2"), 2);
    placer_sim_clear(&sim);
    placer_state_clear(&a);
    fixture_clear(&f);
    free(part);
    dg_graph_free(&g);
    dg_status_free(&st);
    dg_cost_model_free(&m);
}

static void test_bad_input(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_auto_place_options o = dg_auto_place_options_default();
    // Caps no placement fits: the variable and its Adam slots need 3 x 256 KiB together.
    dg_graph *g = model(false);
    int64_t caps[3] = {100000, 100000, 100000};
    o.memory_caps = caps;
    assert_false(dg_auto_place(g, DEVS, 3, &o, NULL, st));
    assert_status(st, DG_RESOURCE_EXHAUSTED, "under the memory caps");
    assert_status(st, DG_RESOURCE_EXHAUSTED, "bytes");
    for (int i = 0; i < dg_graph_num_nodes(g); i++) assert_string_equal(dg_node_assigned_device(dg_graph_node(g, i)), "");
    caps[1] = -5;
    assert_false(dg_auto_place(g, DEVS, 3, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "negative");
    o.memory_caps = NULL;
    assert_false(dg_auto_place(g, DEVS, 0, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "no devices");
    o.n_targets = 2;   // and no array of them
    assert_false(dg_auto_place(g, DEVS, 3, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "2 targets and no array of them");
    o.n_targets = 0;
    dg_graph_free(&g);
    // A node pinned to a device that does not exist.
    g = dg_graph_new();
    dg_graph_push_device(g, "/job:worker/task:7");
    dg_relu(g, "lost", dg_placeholder(g, "p", DG_FLOAT32, dg_shape1(4)));
    dg_graph_pop_device(g);
    assert_false(dg_auto_place(g, DEVS, 3, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "task:7");
    dg_graph_free(&g);
    // Unknown shapes: named, unless unknown_dim stands for them.
    g = dg_graph_new();
    dg_output p = dg_placeholder(g, "batch", DG_FLOAT32, dg_shape2(-1, 8));
    dg_relu(g, "act", p);
    assert_false(dg_auto_place(g, DEVS, 3, &o, NULL, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"batch\" (Placeholder) output 0 has shape [?, 8]");
    o.unknown_dim = 32;
    assert_true(dg_auto_place(g, DEVS, 3, &o, NULL, st));
    assert_ok(st);
    // Simulating nodes not placed, or placed off the list.
    int n;
    dg_node **nodes = all_nodes(g, &n);
    dg_step_estimate est;
    dg_graph *g2 = dg_graph_new();
    dg_output q = dg_placeholder(g2, "q", DG_FLOAT32, dg_shape1(3));
    dg_relu(g2, "unplaced", q);
    int n2;
    dg_node **nodes2 = all_nodes(g2, &n2);
    assert_false(dg_simulate_step(nodes2, n2, DEVS, 3, NULL, &est, st));
    assert_status(st, DG_INVALID_ARGUMENT, "\"q\" (Placeholder) is not placed");
    const char *other[1] = {"/job:ps/replica:0/task:0/device:CPU:0"};
    assert_true(dg_place(nodes2, n2, DEVS, 3, NULL, st));
    assert_false(dg_simulate_step(nodes2, n2, other, 1, NULL, &est, st));
    assert_status(st, DG_INVALID_ARGUMENT, "which is not among the devices given");
    free(nodes2);
    dg_graph_free(&g2);
    free(nodes);
    dg_graph_free(&g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_work),
        cmocka_unit_test_setup_teardown(test_calibration_files, dg_test_tmpdir_setup, dg_test_tmpdir_teardown),
        cmocka_unit_test(test_simulated_chain),
        cmocka_unit_test(test_simulated_channel_contention),
        cmocka_unit_test(test_simulated_shared_streams),
        cmocka_unit_test(test_simulated_executor_threads),
        cmocka_unit_test(test_simulated_schedules_are_valid),
        cmocka_unit_test(test_placers_honour_constraints),
        cmocka_unit_test(test_etf_spreads_parallel_work),
        cmocka_unit_test(test_simulated_copies_between_tasks),
        cmocka_unit_test(test_critical_path_bounds_every_step),
        cmocka_unit_test(test_chain_at_least_as_fast_as_expert),
        cmocka_unit_test(test_cluster_moves_split_layers),
        cmocka_unit_test(test_cluster_swaps_under_caps),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
