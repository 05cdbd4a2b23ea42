/* Partitioner and multi-device local runs: random float64 graphs split over 2 to 4 devices
 * compute exactly what the unpartitioned graph computes, with one Send/Recv pair per
 * (tensor, destination device). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define MAX_NODES 64

typedef struct built {
    dg_graph *g;
    dg_output outs[MAX_NODES];
    int n_outs;
    dg_output fetch[8];
    int n_fetch;
    dg_node *ctrl_target;
} built;

// A random graph of n ops; with_devices pins each op to /device:CPU:k, k < n_devices.
static void build(built *b, uint64_t seed, int n_ops, int n_devices, bool with_devices) {
    memset(b, 0, sizeof *b);
    b->g = dg_graph_new();
    uint64_t rng = seed;
    for (int i = 0; i < 3; i++) {
        double v[16];
        for (int k = 0; k < 16; k++) v[k] = dg_test_uniform(&rng, -1, 1);
        char dev[64];
        snprintf(dev, sizeof dev, "/device:CPU:%d", (int)dg_test_uniform(&rng, 0, n_devices));
        if (with_devices) dg_graph_push_device(b->g, dev);
        dg_tensor *t = dg_tensor_from_data(DG_FLOAT64, dg_shape2(4, 4), v, NULL);
        b->outs[b->n_outs++] = dg_const(b->g, NULL, t);
        dg_tensor_unref(t);
        if (with_devices) dg_graph_pop_device(b->g);
    }
    for (int i = 0; i < n_ops && b->n_outs < MAX_NODES; i++) {
        char dev[64];
        snprintf(dev, sizeof dev, "/device:CPU:%d", (int)dg_test_uniform(&rng, 0, n_devices));
        dg_output a = b->outs[(int)dg_test_uniform(&rng, 0, b->n_outs)];
        dg_output c = b->outs[(int)dg_test_uniform(&rng, 0, b->n_outs)];
        int op = (int)dg_test_uniform(&rng, 0, 6);
        if (with_devices) dg_graph_push_device(b->g, dev);
        dg_output o;
        switch (op) {
        case 0: o = dg_add(b->g, NULL, a, c); break;
        case 1: o = dg_mul(b->g, NULL, a, c); break;
        case 2: o = dg_matmul(b->g, NULL, a, c, false, true); break;
        case 3: o = dg_tanh(b->g, NULL, a); break;
        case 4: o = dg_sub(b->g, NULL, a, c); break;
        default: o = dg_identity(b->g, NULL, a); break;
        }
        if (with_devices) dg_graph_pop_device(b->g);
        b->outs[b->n_outs++] = o;
    }
    // A control edge across devices: a NoOp on the last device after an early op.
    char dev[64];
    snprintf(dev, sizeof dev, "/device:CPU:%d", n_devices - 1);
    if (with_devices) dg_graph_push_device(b->g, dev);
    dg_node *dep = b->outs[3].node;
    b->ctrl_target = dg_group(b->g, "after", &dep, 1);
    if (with_devices) dg_graph_pop_device(b->g);
    for (int i = 0; i < 4; i++) b->fetch[b->n_fetch++] = b->outs[b->n_outs - 1 - 3 * i];
}

static void run(built *b, int n_virtual, dg_tensor **out) {
    dg_status *st = dg_status_new();
    dg_session_options o = dg_session_options_default();
    o.n_virtual_cpus = n_virtual;
    o.allow_soft_placement = false;
    dg_session *s = dg_session_new(b->g, "local", &o, st);
    assert_ok(st);
    dg_session_run(s, NULL, NULL, 0, b->fetch, out, b->n_fetch, &b->ctrl_target, 1, st);
    assert_ok(st);
    dg_session_free(&s);
    dg_status_free(&st);
}

static void test_random_graphs_match_unpartitioned(void **state) {
    for (int trial = 0; trial < 30; trial++) {
        int n_devices = 2 + trial % 3;
        built a, b;
        build(&a, 1000 + trial, 40, n_devices, true);
        build(&b, 1000 + trial, 40, n_devices, false);
        assert_ok(dg_graph_status(a.g));
        dg_tensor *ra[8], *rb[8];
        run(&a, n_devices - 1, ra);
        run(&b, 0, rb);
        for (int i = 0; i < a.n_fetch; i++) {
            assert_int_equal(dg_tensor_nbytes(ra[i]), dg_tensor_nbytes(rb[i]));
            assert_memory_equal(dg_tensor_data(ra[i]), dg_tensor_data(rb[i]), dg_tensor_nbytes(ra[i]));
            dg_tensor_unref(ra[i]);
            dg_tensor_unref(rb[i]);
        }
        dg_graph_free(&a.g);
        dg_graph_free(&b.g);
    }
}

// Expected pairs: distinct (source output, destination device) over cross-device data edges,
// plus distinct (source node, destination device) over cross-device control edges whose
// source sends no data to that device (a data Recv orders the consumer just as well).
static int expected_pairs(dg_graph *g) {
    int n = dg_graph_num_nodes(g), count = 0;
    char (*seen)[256] = calloc(4096, sizeof *seen);
    int n_seen = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            dg_node *d = dg_graph_node(g, i);
            int n_edges = pass == 0 ? dg_node_num_inputs(d) : dg_node_num_control_inputs(d);
            for (int k = 0; k < n_edges; k++) {
                dg_node *src = pass == 0 ? dg_node_input(d, k).node : dg_node_control_input(d, k);
                int idx = pass == 0 ? dg_node_input(d, k).index : -1;
                if (strcmp(dg_node_assigned_device(src), dg_node_assigned_device(d)) == 0) continue;
                char key[256];
                snprintf(key, sizeof key, "%s#%d>%s", dg_node_name(src), idx, dg_node_assigned_device(d));
                bool dup = false;
                for (int j = 0; j < n_seen && !dup; j++) {
                    dup = strcmp(seen[j], key) == 0;
                    if (pass == 1 && !dup) {
                        // any data pair from src to this device
                        char pre[256], post[256];
                        snprintf(pre, sizeof pre, "%s#", dg_node_name(src));
                        snprintf(post, sizeof post, ">%s", dg_node_assigned_device(d));
                        size_t lp = strlen(seen[j]), lq = strlen(post);
                        dup = strncmp(seen[j], pre, strlen(pre)) == 0 && lp >= lq &&
                              strcmp(seen[j] + lp - lq, post) == 0 && !strstr(seen[j], "#-1>");
                    }
                }
                if (!dup) {
                    snprintf(seen[n_seen++], sizeof seen[0], "%s", key);
                    count++;
                }
            }
        }
    free(seen);
    return count;
}

static void test_send_recv_counts(void **state) {
    const char *devs[4] = {"/job:localhost/replica:0/task:0/device:CPU:0",
                           "/job:localhost/replica:0/task:0/device:CPU:1",
                           "/job:localhost/replica:0/task:0/device:CPU:2",
                           "/job:localhost/replica:0/task:0/device:CPU:3"};
    for (int trial = 0; trial < 20; trial++) {
        int n_devices = 2 + trial % 3;
        built a;
        build(&a, 5000 + trial, 30, n_devices, true);
        dg_status *st = dg_status_new();
        int n = dg_graph_num_nodes(a.g);
        dg_node **nodes = malloc((size_t)n * sizeof *nodes);
        for (int i = 0; i < n; i++) nodes[i] = dg_graph_node(a.g, i);
        dg_placement_options po = dg_placement_options_default();
        po.allow_soft_placement = false;
        assert_true(dg_place(nodes, n, devs, n_devices, &po, st));
        assert_ok(st);
        dg_partitions *p = dg_partition(nodes, n, NULL, 0, 1, st);
        assert_ok(st);
        int want = expected_pairs(a.g);
        assert_int_equal(dg_partitions_num_sends(p), want);
        assert_int_equal(dg_partitions_num_recvs(p), want);
        // Every original node has exactly one copy, on its device.
        int total = 0;
        for (int i = 0; i < dg_partitions_count(p); i++) {
            dg_graph *pg = dg_partitions_graph(p, i);
            for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
                dg_node *c = dg_graph_node(pg, k);
                assert_string_equal(dg_node_assigned_device(c), dg_partitions_device(p, i));
                const char *op = dg_node_op_type(c);
                if (strcmp(op, "_Send") && strcmp(op, "_Recv") && strncmp(dg_node_name(c), "_ctrl_", 6)) total++;
            }
        }
        assert_int_equal(total, n);
        for (int i = 0; i < n; i++) assert_non_null(dg_partitions_find(p, nodes[i]));
        // Deterministic: a second partitioning gives the same node names in the same order.
        dg_partitions *q = dg_partition(nodes, n, NULL, 0, 1, st);
        assert_int_equal(dg_partitions_count(p), dg_partitions_count(q));
        for (int i = 0; i < dg_partitions_count(p); i++) {
            dg_graph *x = dg_partitions_graph(p, i), *y = dg_partitions_graph(q, i);
            assert_int_equal(dg_graph_num_nodes(x), dg_graph_num_nodes(y));
            for (int k = 0; k < dg_graph_num_nodes(x); k++)
                assert_string_equal(dg_node_name(dg_graph_node(x, k)), dg_node_name(dg_graph_node(y, k)));
        }
        dg_partitions_free(&q);
        dg_partitions_free(&p);
        free(nodes);
        dg_graph_free(&a.g);
        dg_status_free(&st);
    }
}

// One tensor consumed by three ops on another device crosses once.
static void test_dedup_per_destination(void **state) {
    dg_graph *g = dg_graph_new();
    dg_graph_push_device(g, "/device:CPU:0");
    dg_output x = dg_scalar(g, "x", DG_FLOAT64, 3);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/device:CPU:1");
    dg_output a = dg_add(g, "a", x, x);
    dg_output b = dg_mul(g, "b", x, a);
    dg_output c = dg_neg(g, "c", x);
    dg_graph_pop_device(g);
    dg_graph_push_device(g, "/device:CPU:2");
    dg_output d = dg_sub(g, "d", x, c);
    dg_graph_pop_device(g);
    dg_status *st = dg_status_new();
    const char *devs[3] = {"/job:localhost/replica:0/task:0/device:CPU:0",
                           "/job:localhost/replica:0/task:0/device:CPU:1",
                           "/job:localhost/replica:0/task:0/device:CPU:2"};
    int n = dg_graph_num_nodes(g);
    dg_node **nodes = malloc((size_t)n * sizeof *nodes);
    for (int i = 0; i < n; i++) nodes[i] = dg_graph_node(g, i);
    assert_true(dg_place(nodes, n, devs, 3, NULL, st));
    dg_partitions *p = dg_partition(nodes, n, NULL, 0, 7, st);
    assert_ok(st);
    // x -> CPU:1 (once for a, b, c), x -> CPU:2, c -> CPU:2
    assert_int_equal(dg_partitions_num_sends(p), 3);
    dg_partitions_free(&p);
    // Values through a session with the same placement.
    dg_session_options o = dg_session_options_default();
    o.n_virtual_cpus = 2;
    dg_session *s = dg_session_new(g, "local", &o, st);
    dg_output f[2] = {b, d};
    dg_tensor *out[2];
    assert_true(dg_session_run(s, NULL, NULL, 0, f, out, 2, NULL, 0, st));
    assert_true(dg_tensor_f64(out[0])[0] == 18.0);
    assert_true(dg_tensor_f64(out[1])[0] == 6.0);
    dg_tensor_unref(out[0]);
    dg_tensor_unref(out[1]);
    dg_session_free(&s);
    free(nodes);
    dg_graph_free(&g);
    dg_status_free(&st);
}

// Training across two devices: variables on CPU:1, compute on CPU:0, same result as one device.
static void train(bool split, double *w_out) {
    dg_graph *g = dg_graph_new();
    if (split) dg_graph_push_device(g, "/device:CPU:1");
    dg_output w = dg_variable(g, "w", DG_FLOAT64, dg_shape2(3, 2), dg_init_random_normal(0, 1, 7));
    if (split) {
        dg_graph_pop_device(g);
        dg_graph_push_device(g, "/device:CPU:0");
    }
    dg_output x = dg_placeholder(g, "x", DG_FLOAT64, dg_shape2(-1, 3));
    dg_output y = dg_matmul(g, NULL, x, w, false, false);
    dg_output loss = dg_sum(g, NULL, dg_square(g, NULL, y), NULL, 0, false);
    dg_optimizer opt = dg_adam(g, 0.1);
    dg_node *train = dg_optimizer_minimize(&opt, loss, dg_global_step(g));
    if (split) dg_graph_pop_device(g);
    dg_node *init = dg_global_variables_initializer(g);
    dg_status *st = dg_status_new();
    assert_ok(dg_graph_status(g));
    dg_session_options o = dg_session_options_default();
    o.n_virtual_cpus = 1;
    dg_session *s = dg_session_new(g, "local", &o, st);
    assert_true(dg_session_run_target(s, init, st));
    double xv[6] = {1, 2, 3, -1, 0.5, 2};
    dg_tensor *xt = dg_tensor_from_data(DG_FLOAT64, dg_shape2(2, 3), xv, st);
    for (int i = 0; i < 5; i++) {
        assert_true(dg_session_run(s, &x, &xt, 1, NULL, NULL, 0, &train, 1, st));
        assert_ok(st);
    }
    dg_tensor *wv;
    assert_true(dg_session_run(s, NULL, NULL, 0, &w, &wv, 1, NULL, 0, st));
    memcpy(w_out, dg_tensor_data(wv), 6 * sizeof(double));
    if (split) assert_string_equal(dg_node_assigned_device(w.node), "/job:localhost/replica:0/task:0/device:CPU:1");
    dg_tensor_unref(wv);
    dg_tensor_unref(xt);
    dg_session_free(&s);
    dg_graph_free(&g);
    dg_status_free(&st);
}

static void test_training_across_devices(void **state) {
    double a[6], b[6];
    train(true, a);
    train(false, b);
    assert_memory_equal(a, b, sizeof a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs_match_unpartitioned),
        cmocka_unit_test(test_send_recv_counts),
        cmocka_unit_test(test_dedup_per_destination),
        cmocka_unit_test(test_training_across_devices),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
