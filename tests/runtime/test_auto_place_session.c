/* Sessions with automatic placement (dg_session_options.auto_place): a model with parallel
 * branches and no device scope spreads over a session's virtual CPUs, trains to the same
 * numbers as the same model on one device, and keeps its variables where they were placed when
 * the graph grows. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct model {
    dg_graph *g;
    dg_output x, loss, w[4];
    dg_node *train, *init;
} model;

// Four branches of three MatMuls each from one input, summed: independent work to spread.
static void build(model *m) {
    m->g = dg_graph_new();
    dg_graph *g = m->g;
    m->x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(32, 48));
    dg_output outs[4];
    for (int b = 0; b < 4; b++) {
        char name[16];
        snprintf(name, sizeof name, "w%d", b);
        m->w[b] = dg_variable(g, name, DG_FLOAT32, dg_shape2(48, 48), dg_init_random_normal(0, 0.2, 11 + b));
        dg_output h = m->x;
        for (int l = 0; l < 3; l++) h = dg_tanh(g, NULL, dg_matmul(g, NULL, h, m->w[b], false, false));
        outs[b] = h;
    }
    m->loss = dg_sum(g, "loss", dg_square(g, NULL, dg_add_n(g, NULL, outs, 4)), NULL, 0, false);
    dg_optimizer opt = dg_gradient_descent(g, 0.001);
    m->train = dg_optimizer_minimize(&opt, m->loss, (dg_output){NULL, 0});
    m->init = dg_global_variables_initializer(g);
    assert_true(dg_graph_ok(g));
}

// Three steps; the loss of each and the weights after.
static void train(dg_session *s, model *m, double *losses, float *w_after) {
    dg_status *st = dg_status_new();
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &m->init, 1, st));
    dg_tensor *xv = dg_tensor_new(DG_FLOAT32, dg_shape2(32, 48), st);
    float *x = dg_tensor_data(xv);
    for (int i = 0; i < 32 * 48; i++) x[i] = (float)sin(0.37 * i);
    for (int k = 0; k < 3; k++) {
        dg_tensor *lv = NULL;
        assert_true(dg_session_run(s, &m->x, &xv, 1, &m->loss, &lv, 1, &m->train, 1, st));
        assert_ok(st);
        losses[k] = *(float *)dg_tensor_data(lv);
        dg_tensor_free(&lv);
    }
    dg_tensor *wv = NULL;
    assert_true(dg_session_run(s, NULL, NULL, 0, &m->w[2], &wv, 1, NULL, 0, st));
    memcpy(w_after, dg_tensor_data(wv), 48 * 48 * sizeof(float));
    dg_tensor_free(&wv);
    dg_tensor_free(&xv);
    dg_status_free(&st);
}

static void test_auto_placed_session_trains_as_one_device(void **state) {
    (void)state;
    model a, b;
    build(&a);
    build(&b);
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.n_virtual_cpus = 3;
    o.auto_place = true;
    dg_session *sa = dg_session_new(a.g, "local", &o, st);
    assert_ok(st);
    dg_session *sb = dg_session_new(b.g, "local", NULL, st);
    assert_ok(st);
    double la[3], lb[3];
    float *wa = malloc(48 * 48 * sizeof *wa), *wb = malloc(48 * 48 * sizeof *wb);
    train(sa, &a, la, wa);
    train(sb, &b, lb, wb);
    // The one-device run is the reference: same numbers within float32 rounding of sums
    // taken in another order.
    for (int k = 0; k < 3; k++) assert_true(isfinite(lb[k]) && dg_test_is_close(la[k], lb[k], 0, 1e-5));
    double *ref = malloc(48 * 48 * sizeof *ref);
    for (int i = 0; i < 48 * 48; i++) ref[i] = wb[i];
    assert_close_f32(wa, ref, 48 * 48, 1e-6, 1e-5);
    // The branches went to more than one device.
    int n = dg_graph_num_nodes(a.g), devs = 0;
    const char *seen[4] = {0};
    for (int i = 0; i < n; i++) {
        const char *d = dg_node_assigned_device(dg_graph_node(a.g, i));
        if (!d[0]) continue;
        int j;
        for (j = 0; j < devs && strcmp(seen[j], d) != 0; j++) {}
        if (j == devs && devs < 4) seen[devs++] = d;
    }
    assert_true(devs >= 2);
    // The graph grows: the new node is placed, the variables stay.
    char before[4][128];
    for (int bi = 0; bi < 4; bi++) snprintf(before[bi], sizeof before[bi], "%s", dg_node_assigned_device(a.w[bi].node));
    dg_output doubled = dg_add(a.g, "doubled", a.w[1], a.w[3]);
    dg_tensor *dv = NULL;
    assert_true(dg_session_run(sa, NULL, NULL, 0, &doubled, &dv, 1, NULL, 0, st));
    assert_ok(st);
    dg_tensor_free(&dv);
    assert_true(dg_node_assigned_device(doubled.node)[0] != 0);
    for (int bi = 0; bi < 4; bi++) assert_string_equal(before[bi], dg_node_assigned_device(a.w[bi].node));
    free(ref);
    free(wa);
    free(wb);
    dg_session_free(&sa);
    dg_session_free(&sb);
    dg_graph_free(&a.g);
    dg_graph_free(&b.g);
    dg_status_free(&st);
}

// A traced step's kernel times become the cost model's measured times, op by op; over several
// traced steps, each op's median.
static void test_measured_from_a_trace(void **state) {
    (void)state;
    model m;
    build(&m);
    dg_status *st = dg_status_new();
    dg_session *s = dg_session_new(m.g, "local", NULL, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &m.init, 1, st));
    dg_tensor *xv = dg_tensor_new_zeros(DG_FLOAT32, dg_shape2(32, 48), st);
    dg_run_options ro = {.trace = true};
    dg_step_trace *tr = NULL;
    assert_true(dg_session_run_with_options(s, &ro, &m.x, &xv, 1, NULL, NULL, 0, &m.train, 1, &tr, st));
    assert_non_null(tr);
    dg_cost_model *cm = dg_cost_model_new();
    int n = dg_step_trace_measure(tr, cm, st);
    assert_ok(st);
    int ops = 0;
    for (int i = 0; i < dg_step_trace_num_events(tr); i++) {
        const dg_trace_event *e = dg_step_trace_event(tr, i);
        if (e->kind != DG_TRACE_OP) continue;
        ops++;
        dg_node *node = dg_graph_find(m.g, e->name);
        if (!node) continue;   // a fused kernel's name
        double want = (double)(e->end_ns - e->start_ns) * 1e-9;
        assert_true(fabs(dg_cost_model_op_seconds(cm, node, "CPU", NULL, NULL) - want) <= 1e-12);
    }
    assert_true(ops > 10);
    assert_int_equal(n, ops);
    assert_int_equal(dg_step_trace_measure(tr, NULL, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "no trace or no cost model");
    // Three more traced steps: each op's time is the median of its three, computed here from
    // the events.
    dg_step_trace *three[3] = {NULL};
    for (int k = 0; k < 3; k++) {
        assert_true(dg_session_run_with_options(s, &ro, &m.x, &xv, 1, NULL, NULL, 0, &m.train, 1, &three[k], st));
        assert_non_null(three[k]);
    }
    dg_cost_model *cm3 = dg_cost_model_new();
    int n3 = dg_step_traces_measure((const dg_step_trace *const *)three, 3, cm3, st);
    assert_ok(st);
    assert_int_equal(n3, ops);
    int checked = 0;
    for (int i = 0; i < dg_step_trace_num_events(three[0]); i++) {
        const dg_trace_event *e = dg_step_trace_event(three[0], i);
        dg_node *node = e->kind == DG_TRACE_OP ? dg_graph_find(m.g, e->name) : NULL;
        if (!node) continue;
        double d[3];
        for (int k = 0; k < 3; k++) {
            d[k] = -1;
            for (int j = 0; j < dg_step_trace_num_events(three[k]); j++) {
                const dg_trace_event *f = dg_step_trace_event(three[k], j);
                if (f->kind == DG_TRACE_OP && strcmp(f->name, e->name) == 0) d[k] = (double)(f->end_ns - f->start_ns) * 1e-9;
            }
            assert_true(d[k] >= 0);
        }
        // The middle of three by swaps (durations, never NaN: each was checked >= 0 above).
        if (d[0] > d[1]) { double t = d[0]; d[0] = d[1]; d[1] = t; }
        if (d[1] > d[2]) { double t = d[1]; d[1] = d[2]; d[2] = t; }
        if (d[0] > d[1]) { double t = d[0]; d[0] = d[1]; d[1] = t; }
        double median = d[1];
        assert_true(fabs(dg_cost_model_op_seconds(cm3, node, "CPU", NULL, NULL) - median) <= 1e-12);
        checked++;
    }
    assert_int_equal(checked, ops);
    const dg_step_trace *holed[2] = {three[0], NULL};
    assert_int_equal(dg_step_traces_measure(holed, 2, cm3, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "trace 1 is NULL");
    assert_int_equal(dg_step_traces_measure(holed, 0, cm3, st), -1);
    assert_status(st, DG_INVALID_ARGUMENT, "no traces");
    for (int k = 0; k < 3; k++) dg_step_trace_free(&three[k]);
    dg_cost_model_free(&cm3);
    dg_cost_model_free(&cm);
    dg_step_trace_free(&tr);
    dg_tensor_free(&xv);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// What a traced step says of the executor's threads: the wake time is the median wait of the
// ops handed to a thread that ran nothing while they waited (computed here from the events), and
// the cost model learns which ops the executor hands over (a MatMul, not a Relu).
static void test_threads_from_a_trace(void **state) {
    (void)state;
    model m;
    build(&m);
    dg_status *st = dg_status_new();
    dg_session_options so = dg_session_options_default();
    so.inter_op_threads = 2;
    so.intra_op_threads = 1;
    dg_session *s = dg_session_new(m.g, "local", &so, st);
    assert_true(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &m.init, 1, st));
    dg_tensor *xv = dg_tensor_new_zeros(DG_FLOAT32, dg_shape2(32, 48), st);
    dg_run_options ro = {.trace = true};
    enum { N = 6 };
    dg_step_trace *tr[N] = {NULL};
    double waits[4096];
    int n_waits = 0;
    for (int k = 0; k < N; k++) {
        assert_true(dg_session_run_with_options(s, &ro, &m.x, &xv, 1, NULL, NULL, 0, &m.train, 1, &tr[k], st));
        assert_non_null(tr[k]);
        int ne = dg_step_trace_num_events(tr[k]);
        for (int i = 0; i < ne; i++) {
            const dg_trace_event *q = dg_step_trace_event(tr[k], i);
            if (q->kind != DG_TRACE_QUEUED || q->end_ns <= q->start_ns) continue;
            bool ran = false;
            for (int j = 0; j < ne; j++) {
                const dg_trace_event *e = dg_step_trace_event(tr[k], j);
                if (e->kind == DG_TRACE_OP && e->thread == q->thread && strcmp(e->task, q->task) == 0 &&
                    e->start_ns < q->end_ns && e->end_ns > q->start_ns)
                    ran = true;
            }
            if (!ran && n_waits < 4096) waits[n_waits++] = (double)(q->end_ns - q->start_ns) * 1e-9;
        }
    }
    // Four branches of MatMuls on two threads hand ops to the pool thread every step, which
    // mostly sleeps when they come (not under valgrind, whose threads take turns: then fewer
    // than 3 such waits, and no wake time is set).
    qsort(waits, (size_t)n_waits, sizeof *waits, cmp_double);
    double median = n_waits < 3 ? 0
                    : n_waits % 2 ? waits[n_waits / 2]
                                  : 0.5 * (waits[n_waits / 2 - 1] + waits[n_waits / 2]);
    dg_cost_model *cm = dg_cost_model_new();
    assert_true(dg_cost_model_wake(cm, "CPU") == 0);
    assert_true(dg_step_traces_measure((const dg_step_trace *const *)tr, N, cm, st) > 0);
    assert_ok(st);
    assert_true(fabs(dg_cost_model_wake(cm, "CPU") - (median < 1 ? median : 1)) < 1e-12);
    // The rule: on a task's two shared threads, x's thread runs two Relus itself, one after the
    // other (2 ms), and hands the second of two MatMuls to the other thread (1 ms).
    const char *dev = "/job:localhost/replica:0/task:0/device:CPU:0";
    assert_true(dg_cost_model_set_task_streams(cm, "CPU", 2, st));
    assert_true(dg_cost_model_set_wake(cm, "CPU", 0, st));
    for (int kind = 0; kind < 2; kind++) {
        dg_graph *g = dg_graph_new();
        dg_graph_push_device(g, dev);
        dg_output x = dg_placeholder(g, "px", DG_FLOAT32, dg_shape2(8, 8));
        dg_output a = kind ? dg_matmul(g, "pa", x, x, false, false) : dg_relu(g, "pa", x);
        dg_output b = kind ? dg_matmul(g, "pb", x, x, false, false) : dg_relu(g, "pb", x);
        (void)a;
        (void)b;
        dg_graph_pop_device(g);
        dg_node *nodes[3] = {x.node, a.node, b.node};
        assert_true(dg_place(nodes, 3, &dev, 1, NULL, st));
        assert_true(dg_cost_model_set_measured(cm, "px", "CPU", 0, st));
        assert_true(dg_cost_model_set_measured(cm, "pa", "CPU", 1e-3, st));
        assert_true(dg_cost_model_set_measured(cm, "pb", "CPU", 1e-3, st));
        dg_step_estimate est;
        assert_true(dg_simulate_step(nodes, 3, &dev, 1, cm, &est, st));
        assert_true(fabs(est.step_s - (kind ? 1e-3 : 2e-3)) < 1e-12);
        dg_step_estimate_clear(&est);
        dg_graph_free(&g);
    }
    dg_cost_model_free(&cm);
    for (int k = 0; k < N; k++) dg_step_trace_free(&tr[k]);
    dg_tensor_free(&xv);
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}


// Two tasks in this process: a traced step whose tensors cross between them sets the same-host
// link's latency to the median of the transfers' times beyond their bytes, computed
// here again from the trace's own events; the bandwidth stays.
static void test_link_latency_from_a_trace(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char spec[96];
    snprintf(spec, sizeof spec, "worker|127.0.0.1:%d;127.0.0.1:%d", dg_test_free_port(), dg_test_free_port());
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    assert_non_null(c);
    dg_server_options so = dg_server_options_default();
    so.quiet = true;
    dg_server *sv[2];
    for (int t = 0; t < 2; t++) {
        sv[t] = dg_server_new(c, "worker", t, &so, st);
        assert_ok(st);
    }
    dg_graph *g = dg_graph_new();
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape1(4096));
    dg_output h = x;
    for (int k = 0; k < 8; k++) {
        dg_graph_push_device(g, k % 2 ? "/job:worker/task:1" : "/job:worker/task:0");
        h = dg_tanh(g, NULL, dg_add(g, NULL, h, x));
        dg_graph_pop_device(g);
    }
    dg_session *s = dg_session_new(g, dg_server_target(sv[0]), NULL, st);
    assert_ok(st);
    dg_tensor *xv = dg_tensor_new_zeros(DG_FLOAT32, dg_shape1(4096), st);
    dg_run_options ro = {.trace = true};
    dg_step_trace *tr = NULL;
    assert_true(dg_session_run_with_options(s, &ro, &x, &xv, 1, NULL, NULL, 0, &h.node, 1, &tr, st));
    assert_non_null(tr);
    dg_cost_model *cm = dg_cost_model_new();
    assert_true(dg_cost_model_set_hosts(cm, c, st));
    dg_link_perf before = dg_cost_model_link(cm, DG_LINK_SAME_HOST);
    double extra[256];
    int n = 0;
    for (int i = 0; i < dg_step_trace_num_events(tr) && n < 256; i++) {
        const dg_trace_event *e = dg_step_trace_event(tr, i);
        if (e->kind != DG_TRACE_TRANSFER || !e->peer[0] || strcmp(e->peer, e->task) == 0) continue;
        extra[n++] = (double)(e->end_ns - e->start_ns) * 1e-9 - (double)e->bytes / before.bytes_per_s;
    }
    assert_true(n >= 3);
    qsort(extra, (size_t)n, sizeof *extra, cmp_double);
    double mid = n % 2 ? extra[n / 2] : 0.5 * (extra[n / 2 - 1] + extra[n / 2]);
    double want = mid > 0 ? mid : 0;
    assert_true(dg_step_trace_measure(tr, cm, st) > 0);
    dg_link_perf after = dg_cost_model_link(cm, DG_LINK_SAME_HOST);
    assert_true(fabs(after.latency_s - want) <= 1e-12);
    assert_true(after.bytes_per_s == before.bytes_per_s);
    dg_link_perf task = dg_cost_model_link(cm, DG_LINK_SAME_TASK);
    assert_true(task.latency_s == 2e-6);   // no transfer inside a task: unchanged
    dg_cost_model_free(&cm);
    dg_step_trace_free(&tr);
    dg_tensor_free(&xv);
    dg_session_free(&s);
    dg_graph_free(&g);
    for (int t = 0; t < 2; t++) dg_server_free(&sv[t]);
    dg_cluster_free(&c);
    dg_status_free(&st);
}

static void test_auto_place_bad_cost_file(void **state) {
    (void)state;
    model m;
    build(&m);
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.auto_place = true;
    o.auto_place_cost_file = "/nonexistent/cost.json";
    dg_session *s = dg_session_new(m.g, "local", &o, st);
    assert_ok(st);
    assert_false(dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &m.init, 1, st));
    assert_status(st, DG_NOT_FOUND, "auto_place_cost_file");
    dg_session_free(&s);
    dg_graph_free(&m.g);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_placed_session_trains_as_one_device),
        cmocka_unit_test(test_measured_from_a_trace),
        cmocka_unit_test(test_threads_from_a_trace),
        cmocka_unit_test(test_link_latency_from_a_trace),
        cmocka_unit_test(test_auto_place_bad_cost_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
