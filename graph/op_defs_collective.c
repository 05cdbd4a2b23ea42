/* Op definitions of the collectives (all-reduce and broadcast across the tasks of a job, as
 * TensorFlow's CollectiveReduce/CollectiveBcast). Both are variadic: n float32/float64 inputs
 * (a broadcast also takes int32/int64) give n outputs of the same dtypes and shapes. Attributes are checked here, when the node
 * is built, so a bad group is an error naming the node rather than a hang at run time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"

static bool attr_int(const dg_node *n, const char *name, int64_t lo, int64_t hi, bool required,
                     int64_t *out, dg_status *st) {
    if (!dg_node_attr_int(n, name, out)) {
        if (!required) return true;
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s needs an int attribute \"%s\"", n->op->name, name);
        return false;
    }
    if (*out < lo || *out > hi) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: attribute \"%s\" is %lld, must be in [%lld, %lld]",
                       n->op->name, name, (long long)*out, (long long)lo, (long long)hi);
        return false;
    }
    return true;
}

// Checks the group attributes shared by both ops and sets the outputs like the inputs.
static bool infer_collective(dg_node *n, dg_status *st) {
    const char *job = dg_node_attr_string(n, "group_job");
    if (!job || !*job || strchr(job, '/') || strchr(job, ';')) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s needs a job name in \"group_job\", got \"%s\"",
                       n->op->name, job ? job : "");
        return false;
    }
    int64_t v;
    if (!attr_int(n, "group_size", 0, 1 << 20, true, &v, st)) return false;   // 0: elastic
    if (!attr_int(n, "instance_key", 0, INT32_MAX, true, &v, st)) return false;
    if (!attr_int(n, "timeout_ms", 1, INT32_MAX, false, &v, st)) return false;
    const char *final_op = dg_node_attr_string(n, "final_op");
    if (final_op && strcmp(final_op, "Id") != 0 && strcmp(final_op, "Div") != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: \"final_op\" must be \"Id\" or \"Div\", got \"%s\"",
                       n->op->name, final_op);
        return false;
    }
    const char *hint = dg_node_attr_string(n, "communication_hint");
    if (hint && strcmp(hint, "auto") != 0 && strcmp(hint, "ring") != 0 && strcmp(hint, "direct") != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "%s: \"communication_hint\" must be \"auto\", \"ring\" or \"direct\", got \"%s\"",
                       n->op->name, hint);
        return false;
    }
    const char *wire = dg_node_attr_string(n, "wire_dtype");
    bool wire16 = wire && strcmp(wire, "bfloat16") == 0;
    if (wire && strcmp(wire, "float32") != 0 && !(wire16 && strcmp(n->op->name, "CollectiveAllReduce") == 0)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: \"wire_dtype\" must be \"float32\"%s, got \"%s\"", n->op->name,
                       strcmp(n->op->name, "CollectiveAllReduce") == 0 ? " or \"bfloat16\"" : "", wire);
        return false;
    }
    if (!graph_set_num_outputs(n, n->n_inputs, st)) return false;
    for (int i = 0; i < n->n_inputs; i++) {
        dg_output in = n->inputs[i];
        dg_dtype t = dg_output_dtype(in);
        // A broadcast only moves bytes: integers too (a global step).
        bool bcast = strcmp(n->op->name, "CollectiveBroadcast") == 0;
        if (t != DG_FLOAT32 && t != DG_FLOAT64 && !(bcast && (t == DG_INT32 || t == DG_INT64))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be float32 or float64%s, got %s",
                           i, in.node->name, bcast ? " (or int32, int64)" : "", dg_dtype_name(t));
            return false;
        }
        if (wire16 && t != DG_FLOAT32) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") is %s: wire_dtype bfloat16 takes float32 "
                           "values only", i, in.node->name, dg_dtype_name(t));
            return false;
        }
        graph_set_output(n, i, t, dg_output_shape(in));
    }
    return true;
}

// LocalAllReduce(x): one node per device of a task, sharing "shared_name"; each outputs the
// sum ("reduction" "sum") or mean ("mean") of the group's inputs, on its own device.
static bool infer_local_all_reduce(dg_node *n, dg_status *st) {
    int64_t size, rank;
    if (!attr_int(n, "num_devices", 1, 4096, true, &size, st)) return false;
    if (!attr_int(n, "rank", 0, size - 1, true, &rank, st)) return false;
    const char *shared = dg_node_attr_string(n, "shared_name");
    if (!shared || !*shared) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s needs a group name in \"shared_name\"", n->op->name);
        return false;
    }
    const char *red = dg_node_attr_string(n, "reduction");
    if (!red || (strcmp(red, "sum") != 0 && strcmp(red, "mean") != 0)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: \"reduction\" must be \"sum\" or \"mean\", got \"%s\"",
                       n->op->name, red ? red : "");
        return false;
    }
    dg_output in = n->inputs[0];
    dg_dtype t = dg_output_dtype(in);
    if (t != DG_FLOAT32 && t != DG_FLOAT64) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input (\"%s\") must be float32 or float64, got %s",
                       in.node->name, dg_dtype_name(t));
        return false;
    }
    if (!graph_set_num_outputs(n, 1, st)) return false;
    graph_set_output(n, 0, t, dg_output_shape(in));
    return true;
}

// The nodes of one LocalAllReduce group (dg_local_all_reduce; gradients.c builds the group of
// a group's gradient with it): node r on devices[r] with input xs[r], named "<name>_<r>", the
// group named after the first node.
bool graph_local_all_reduce(dg_graph *g, const char *name, const dg_output *xs, const char *const *devices, int n,
                            bool mean, dg_output *out) {
    for (int i = 0; out && i < n; i++) out[i] = (dg_output){NULL, 0};
    if (!dg_graph_ok(g)) return false;
    if (n < 1 || !xs || !devices || !out) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "LocalAllReduce \"%s\": needs at least one input "
                           "and device, and an output array", name ? name : "LocalAllReduce");
        return false;
    }
    // The group is named after the first node, which the graph makes unique.
    char shared[512] = "";
    for (int r = 0; r < n; r++) {
        if (!xs[r].node || !devices[r]) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "LocalAllReduce \"%s\": input or device %d is "
                               "missing", name ? name : "LocalAllReduce", r);
            return false;
        }
        char node_name[640];
        snprintf(node_name, sizeof node_name, "%s_%d", name ? name : "LocalAllReduce", r);
        dg_graph_push_device(g, devices[r]);
        dg_node *nd = graph_begin(g, "LocalAllReduce", node_name);
        if (nd) {
            if (r == 0) snprintf(shared, sizeof shared, "%s", nd->name);
            graph_add_input(nd, xs[r]);
            graph_set_attr_int(nd, "num_devices", n);
            graph_set_attr_int(nd, "rank", r);
            graph_set_attr_string(nd, "shared_name", shared);
            graph_set_attr_string(nd, "reduction", mean ? "mean" : "sum");
            nd = graph_finish(nd);
        }
        dg_graph_pop_device(g);
        if (!nd) return false;
        out[r] = (dg_output){nd, 0};
    }
    return true;
}

// graph_impl.h: the LocalAllReduce groups of the first n_nodes nodes as rings.
void graph_local_all_reduce_rings(dg_graph *g, int n_nodes, int *next) {
    int *ids = malloc(((size_t)n_nodes + 1) * sizeof *ids), n = 0;
    if (!ids) abort();
    for (int id = 0; id < n_nodes; id++) {
        next[id] = -1;
        if (strcmp(dg_graph_node(g, id)->op->name, "LocalAllReduce") == 0) ids[n++] = id;
    }
    for (int i = 0; i < n; i++) {
        if (next[ids[i]] >= 0) continue;
        const char *si = dg_node_attr_string(dg_graph_node(g, ids[i]), "shared_name");
        int prev = ids[i];
        for (int j = i + 1; j < n && si; j++) {
            const char *sj = dg_node_attr_string(dg_graph_node(g, ids[j]), "shared_name");
            if (sj && strcmp(si, sj) == 0) {
                next[prev] = ids[j];
                prev = ids[j];
            }
        }
        next[prev] = ids[i];
    }
    free(ids);
}

// Stateful: a collective is never pruned as constant or merged with another node, since
// every rank must run each instance exactly once per step.
static const graph_op_def collective_op_defs[] = {
    GRAPH_OP("CollectiveAllReduce", 1, -1, true, false, true, infer_collective, NULL),
    GRAPH_OP("CollectiveBroadcast", 1, -1, true, false, true, infer_collective, NULL),
    GRAPH_OP("LocalAllReduce", 1, 1, true, false, true, infer_local_all_reduce, NULL),
};

int graph_collective_op_defs(const graph_op_def **defs) {
    *defs = collective_op_defs;
    return (int)(sizeof collective_op_defs / sizeof collective_op_defs[0]);
}
