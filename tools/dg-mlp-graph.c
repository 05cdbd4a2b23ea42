/* dg-mlp-graph: writes the MNIST-replica MLP (784 -> 100 ReLU -> 10, sparse softmax cross
 * entropy, Adam, global step; the model of examples/common/mlp_model.c) built under a replica
 * device setter to a graph file, for dg-inspect and the docs.
 *   dg-mlp-graph FILE [--cluster_spec 'ps|h:1,h:2;worker|h:3'] [--hidden_units N] [--no_devices]
 * The default cluster has two ps tasks and one worker; variables go round robin over the ps
 * tasks in creation order, everything else to /job:worker/task:0. --no_devices: no setter, no
 * node asks for a device (for dg-inspect place --auto). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

#define DEFAULT_CLUSTER "ps|127.0.0.1:2222,127.0.0.1:2223;worker|127.0.0.1:2224"

static int usage(FILE *f) {
    fprintf(f, "usage: dg-mlp-graph FILE [--cluster_spec SPEC] [--hidden_units N] [--no_devices]\n"
               "  writes the MNIST-replica MLP (Adam, global step) placed by a replica device\n"
               "  setter over SPEC's ps tasks (default \"%s\")\n"
               "  --hidden_units N   hidden layer width (default 100)\n"
               "  --no_devices       no setter: no node asks for a device\n"
               "  --help, --version\n"
               "Exit status: 0 when the file is written, 1 when it cannot be, 2 for bad arguments.\n",
               DEFAULT_CLUSTER);
    return f == stdout ? 0 : 2;
}

// The model of examples/common/mlp_model.c, with the same names.
static bool build_mlp(dg_graph *g, int64_t pixels, int64_t hidden, double lr, int64_t seed,
                      dg_status *st) {
    dg_output x = dg_placeholder(g, "x", DG_FLOAT32, dg_shape2(-1, pixels));
    dg_output y_ = dg_placeholder(g, "y_", DG_INT64, dg_shape1(-1));
    dg_output hid_w = dg_variable(g, "hid_w", DG_FLOAT32, dg_shape2(pixels, hidden),
                                  dg_init_truncated_normal(0, 1.0 / sqrt((double)pixels), seed));
    dg_output hid_b = dg_variable(g, "hid_b", DG_FLOAT32, dg_shape1(hidden), dg_init_zeros());
    dg_output sm_w = dg_variable(g, "sm_w", DG_FLOAT32, dg_shape2(hidden, 10),
                                 dg_init_truncated_normal(0, 1.0 / sqrt((double)hidden), seed + 1));
    dg_output sm_b = dg_variable(g, "sm_b", DG_FLOAT32, dg_shape1(10), dg_init_zeros());
    dg_output hid = dg_relu(g, "hid", dg_bias_add(g, "hid_lin", dg_matmul(g, NULL, x, hid_w, false, false), hid_b));
    dg_output logits = dg_bias_add(g, "logits", dg_matmul(g, NULL, hid, sm_w, false, false), sm_b);
    dg_output loss = dg_sparse_softmax_cross_entropy(g, "cross_entropy", logits, y_);
    dg_output global_step = dg_global_step(g);
    dg_optimizer opt = dg_adam(g, lr);
    dg_optimizer_minimize(&opt, loss, global_step);
    dg_output correct = dg_equal(g, "correct", dg_argmax(g, NULL, logits, 1), y_);
    dg_mean(g, "accuracy", dg_cast(g, NULL, correct, DG_FLOAT32), NULL, 0, false);
    dg_global_variables_initializer(g);
    return dg_graph_check(g, st);
}

int main(int argc, char **argv) {
    const char *path = NULL, *spec = DEFAULT_CLUSTER;
    long hidden = 100;
    bool no_devices = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return usage(stdout);
        if (strcmp(a, "--version") == 0) {
            printf("dg-mlp-graph (distgraph) %s\n", dg_version());
            return 0;
        }
        // "dg-mlp-graph help" asks for help; it must not write a graph file named "help".
        if (strcmp(a, "help") == 0 || strcmp(a, "version") == 0) {
            fprintf(stderr, "dg-mlp-graph: \"%s\" is not a file to write (did you mean --%s?)\n", a, a);
            return 2;
        }
        if (strcmp(a, "--cluster_spec") == 0 && i + 1 < argc) {
            spec = argv[++i];
        } else if (strncmp(a, "--cluster_spec=", 15) == 0) {
            spec = a + 15;
        } else if (strcmp(a, "--no_devices") == 0) {
            no_devices = true;
        } else if (strcmp(a, "--hidden_units") == 0 && i + 1 < argc) {
            char *end;
            hidden = strtol(argv[++i], &end, 10);
            if (*end || hidden < 1 || hidden > 100000) {
                fprintf(stderr, "dg-mlp-graph: --hidden_units must be in 1..100000, got \"%s\"\n", argv[i]);
                return 2;
            }
        } else if (a[0] == '-' || path) {
            fprintf(stderr, "dg-mlp-graph: unexpected argument \"%s\"\n", a);
            return usage(stderr);
        } else {
            path = a;
        }
    }
    if (!path) return usage(stderr);
    int rc = 1;
    dg_status *st = dg_status_new();
    dg_cluster *c = dg_cluster_from_spec_string(spec, st);
    dg_graph *g = NULL;
    dg_device_fn *fn = NULL;
    if (!c) goto out;
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.cluster = c;
    o.worker_device = "/job:worker/task:0";
    fn = dg_replica_device_setter_new(&o, st);
    if (!fn) goto out;
    g = dg_graph_new();
    if (!no_devices) dg_graph_push_device_fn(g, fn);
    bool ok = build_mlp(g, 784, hidden, 0.01, 1, st);
    if (!no_devices) dg_graph_pop_device_fn(g);
    if (!ok || !dg_graph_save(g, path, st)) goto out;
    printf("wrote %s: %d nodes, %d ps tasks\n", path, dg_graph_num_nodes(g), dg_cluster_num_tasks(c, "ps"));
    rc = 0;
out:
    if (rc) fprintf(stderr, "dg-mlp-graph: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
    dg_graph_free(&g);
    dg_device_fn_free(&fn);
    dg_cluster_free(&c);
    dg_status_free(&st);
    return rc;
}
