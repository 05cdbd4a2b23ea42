/* place_bench: placement plus partitioning time for graphs of 100k and 1M nodes over a
 * cluster of 2 ps and 4 worker tasks (variables on ps tasks through the replica device
 * setter, compute spread over the workers), and how the time grows. JSON lines. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distgraph/distgraph.h"
#include "flags.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Builds n nodes: every 16th a variable (placed by the setter), the rest Add/Mul/Relu of two
// recent outputs, each pinned to one of 4 worker tasks in blocks, so many edges cross.
static int64_t block_size = 1024;

static dg_graph *build(int64_t n, dg_status *st) {
    dg_graph *g = dg_graph_new();
    dg_replica_device_setter_options o = dg_replica_device_setter_options_default();
    o.ps_tasks = 2;
    o.worker_device = "";
    dg_device_fn *setter = dg_replica_device_setter_new(&o, st);
    if (!setter) return g;
    dg_graph_push_device_fn(g, setter);
    dg_output *outs = malloc((size_t)n * sizeof *outs);
    int64_t k = 0;
    uint64_t rng = 12345;
    char dev[64];
    while (k < n) {
        int64_t block = k / block_size;
        snprintf(dev, sizeof dev, "/job:worker/task:%d", (int)(block % 4));
        dg_graph_push_device(g, dev);
        for (int64_t j = 0; j < block_size && k < n; j++) {
            if (k < 2 || k % 16 == 0) {
                outs[k] = dg_variable_ex(g, NULL, DG_FLOAT32, dg_shape1(8), dg_init_zeros(), false);
                k += 1;
                continue;
            }
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            int64_t a = k - 1 - (int64_t)((rng >> 33) % (uint64_t)(k < 200 ? k : 200));
            int64_t b = k - 1 - (int64_t)((rng >> 13) % (uint64_t)(k < 10 ? k : 10));
            int op = (int)((rng >> 50) % 3);
            outs[k] = op == 0 ? dg_add(g, NULL, outs[a], outs[b])
                      : op == 1 ? dg_mul(g, NULL, outs[a], outs[b]) : dg_relu(g, NULL, outs[a]);
            k++;
        }
        dg_graph_pop_device(g);
    }
    dg_graph_pop_device_fn(g);
    dg_device_fn_free(&setter);
    free(outs);
    return g;
}

static bool measure(int64_t n, double *place_s, double *part_s, int *n_nodes, int *sends, dg_status *st) {
    dg_graph *g = build(n, st);
    if (!dg_graph_check(g, st)) {
        dg_graph_free(&g);
        return false;
    }
    dg_cluster *c = dg_cluster_from_spec_string("ps|127.0.0.1:1,127.0.0.1:2;worker|127.0.0.1:3,127.0.0.1:4,"
                                                "127.0.0.1:5,127.0.0.1:6", st);
    char **devs = NULL;
    int n_devs = c ? dg_cluster_devices(c, 0, &devs, st) : -1;
    *n_nodes = dg_graph_num_nodes(g);
    dg_node **nodes = malloc((size_t)*n_nodes * sizeof *nodes);
    for (int i = 0; i < *n_nodes; i++) nodes[i] = dg_graph_node(g, i);
    bool ok = n_devs > 0;
    dg_partitions *p = NULL;
    if (ok) {
        double t0 = now_s();
        ok = dg_place(nodes, *n_nodes, (const char *const *)devs, n_devs, NULL, st);
        double t1 = now_s();
        p = ok ? dg_partition(nodes, *n_nodes, NULL, 0, 1, st) : NULL;
        double t2 = now_s();
        ok = ok && p;
        *place_s = t1 - t0;
        *part_s = t2 - t1;
        if (p) *sends = dg_partitions_num_sends(p);
    }
    dg_partitions_free(&p);
    free(nodes);
    dg_device_list_free(devs, n_devs);
    dg_cluster_free(&c);
    dg_graph_free(&g);
    return ok;
}

int main(int argc, char **argv) {
    int64_t small = 100000, large = 1000000;
    flag_def defs[] = {
        {"small", FLAG_INT, &small, "nodes in the small graph (default 100000)"},
        {"large", FLAG_INT, &large, "nodes in the large graph (default 1000000)"},
        {"block", FLAG_INT, &block_size, "consecutive ops on one worker task (default 1024)"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, 3, "usage: place_bench [flags]", &help)) return 2;
    if (help) return 0;
    if (small < 100 || large < small || large > 20000000 || block_size < 1) {
        fprintf(stderr, "place_bench: need 100 <= small <= large <= 20000000\n");
        return 2;
    }
    dg_status *st = dg_status_new();
    double t[2] = {0, 0};
    int64_t sizes[2] = {small, large};
    for (int i = 0; i < 2; i++) {
        double pl, pa;
        int nn = 0, sends = 0;
        if (!measure(sizes[i], &pl, &pa, &nn, &sends, st)) {
            fprintf(stderr, "place_bench: %s\n", dg_status_message(st));
            dg_status_free(&st);
            return 1;
        }
        t[i] = pl + pa;
        printf("{\"bench\": \"place_bench\", \"metric\": \"place_and_partition\", \"value\": %.3f, \"unit\": \"s\", "
               "\"nodes\": %d, \"place_s\": %.3f, \"partition_s\": %.3f, \"send_recv_pairs\": %d}\n",
               t[i], nn, pl, pa, sends);
        fflush(stdout);
    }
    printf("{\"bench\": \"place_bench\", \"metric\": \"growth\", \"value\": %.2f, \"unit\": \"x time for %.0fx nodes\"}\n",
           t[1] / t[0], (double)large / (double)small);
    dg_status_free(&st);
    return 0;
}
