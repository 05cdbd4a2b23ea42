/* Collective builders and data-parallel training on them: the public functions of
 * distgraph/collective.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/collective.h"
#include "graph_impl.h"
#include "train_impl.h"

dg_collective_group dg_collective_group_make(const char *job, int size) {
    dg_collective_group grp = {job, size, 0, 0};
    return grp;
}

// The collective of this graph, other than nd, with op type (any collective when type is NULL)
// and instance key key, or NULL.
static const dg_node *key_user(const dg_graph *g, const char *type, int64_t key) {
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        const dg_node *o = dg_graph_node(g, i);
        int64_t k;
        const char *t = dg_node_op_type(o);
        if (strncmp(t, "Collective", 10) != 0 || (type && strcmp(t, type) != 0)) continue;
        if (dg_node_attr_int(o, "instance_key", &k) && k == key) return o;
    }
    return NULL;
}

// DG_COLLECTIVE_KEY_AUTO: FNV-1a of the node's unique name, folded into the upper half of the
// keys (hand-given keys are usually small), then the next key no collective of the graph has.
// Every rank builds the same names in the same order, so every rank finds the same key.
static int64_t auto_key(const dg_graph *g, const char *name) {
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 16777619u;
    int64_t key = (int64_t)(0x40000000u | (h & 0x3FFFFFFFu));
    while (key_user(g, NULL, key)) key = key == INT32_MAX ? 0x40000000 : key + 1;
    return key;
}

static dg_node *build(dg_graph *g, const char *type, const char *name, const dg_output *xs, int n,
                      const dg_collective_group *group, int64_t instance_key) {
    if (!dg_graph_ok(g)) return NULL;
    if (!group || !group->job || n < 1 || !xs) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": needs a group and at least one input", type,
                           name ? name : type);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!xs[i].node) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "%s \"%s\": input %d is the null output", type,
                               name ? name : type, i);
            return NULL;
        }
    dg_node *nd = graph_begin(g, type, name);
    if (!nd) return NULL;
    if (instance_key == DG_COLLECTIVE_KEY_AUTO) {
        instance_key = auto_key(g, dg_node_name(nd));
    } else {
        const dg_node *other = key_user(g, type, instance_key);
        if (other) {
            dg_graph_set_error(g, DG_ALREADY_EXISTS, "%s \"%s\": instance key %lld is already the key of "
                               "\"%s\" in this graph (give each collective its own key, or "
                               "DG_COLLECTIVE_KEY_AUTO)", type, dg_node_name(nd), (long long)instance_key,
                               dg_node_name(other));
            graph_finish(nd);   // discards it: the graph has an error
            return NULL;
        }
    }
    for (int i = 0; i < n; i++) graph_add_input(nd, xs[i]);
    graph_set_attr_string(nd, "group_job", group->job);
    graph_set_attr_int(nd, "group_size", group->size);
    graph_set_attr_int(nd, "instance_key", instance_key);
    if (group->timeout_ms) graph_set_attr_int(nd, "timeout_ms", group->timeout_ms);
    return nd;
}

static bool finish(dg_node *nd, int n, dg_output *out) {
    nd = graph_finish(nd);
    for (int i = 0; i < n; i++) {
        out[i].node = nd;
        out[i].index = nd ? i : 0;
    }
    return nd != NULL;
}

bool dg_collective_all_reduce(dg_graph *g, const char *name, const dg_output *xs, int n,
                              const dg_collective_group *group, int64_t instance_key,
                              dg_reduce_op op, const char *hint, dg_output *out) {
    dg_node *nd = build(g, "CollectiveAllReduce", name, xs, n, group, instance_key);
    if (!nd) {
        for (int i = 0; i < n; i++) out[i] = (dg_output){NULL, 0};
        return false;
    }
    graph_set_attr_string(nd, "final_op", op == DG_REDUCE_MEAN ? "Div" : "Id");
    if (hint) graph_set_attr_string(nd, "communication_hint", hint);
    if (group->wire_dtype == DG_BFLOAT16) {
        graph_set_attr_string(nd, "wire_dtype", "bfloat16");
    } else if (group->wire_dtype != 0 && group->wire_dtype != DG_FLOAT32) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "all-reduce \"%s\": the group's wire_dtype is %s; it takes "
                           "float32 (0: as computed) or bfloat16", dg_node_name(nd), dg_dtype_name(group->wire_dtype));
        graph_finish(nd);   // discards it: the graph has an error
        for (int i = 0; i < n; i++) out[i] = (dg_output){NULL, 0};
        return false;
    }
    return finish(nd, n, out);
}

bool dg_collective_broadcast(dg_graph *g, const char *name, const dg_output *xs, int n,
                             const dg_collective_group *group, int64_t instance_key,
                             dg_output *out) {
    dg_node *nd = build(g, "CollectiveBroadcast", name, xs, n, group, instance_key);
    if (!nd) {
        for (int i = 0; i < n; i++) out[i] = (dg_output){NULL, 0};
        return false;
    }
    return finish(nd, n, out);
}

bool dg_local_all_reduce(dg_graph *g, const char *name, const dg_output *xs,
                         const char *const *devices, int n, dg_reduce_op op, dg_output *out) {
    return graph_local_all_reduce(g, name, xs, devices, n, op == DG_REDUCE_MEAN, out);
}

dg_node *dg_all_reduce_minimize(const dg_optimizer *opt, dg_output loss, const dg_output *vars,
                                int n_vars, dg_output global_step, const dg_collective_group *group,
                                int64_t instance_key) {
    dg_graph *g = opt->graph;
    if (!dg_graph_ok(g)) return NULL;
    if (!graph_no_gradient_wire(opt, "all_reduce_minimize", "set the group's wire_dtype instead")) return NULL;
    int cap = vars ? n_vars : dg_graph_collection_size(g, DG_TRAINABLE_VARIABLES);
    dg_output *grads = calloc((size_t)(cap > 0 ? cap : 1), sizeof *grads);
    dg_output *used = calloc((size_t)(cap > 0 ? cap : 1), sizeof *used);
    dg_output *mean = calloc((size_t)(cap > 0 ? cap : 1), sizeof *mean);
    if (!grads || !used || !mean) abort();
    dg_node *train = NULL;
    int n = dg_optimizer_compute_gradients(opt, loss, vars, n_vars, grads, used, cap);
    if (n == 0)
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "all_reduce_minimize: no gradients (does the loss "
                           "depend on any of the variables?)");
    if (n > 0 && dg_collective_all_reduce(g, "allreduce_gradients", grads, n, group, instance_key,
                                          DG_REDUCE_MEAN, NULL, mean))
        train = dg_optimizer_apply_gradients(opt, mean, used, n, global_step, NULL);
    free(grads);
    free(used);
    free(mean);
    return train;
}

typedef struct reduce_ctx {
    const dg_collective_group *group;
    int64_t instance_key;
} reduce_ctx;

// The loss scaler's gradients, averaged over the group in place.
static bool all_reduce_gradients(void *ctx, dg_graph *g, dg_output *grads, int n) {
    const reduce_ctx *r = ctx;
    dg_output *mean = calloc((size_t)n, sizeof *mean);
    if (!mean) abort();
    bool ok = dg_collective_all_reduce(g, "allreduce_gradients", grads, n, r->group, r->instance_key, DG_REDUCE_MEAN,
                                       NULL, mean);
    if (ok) memcpy(grads, mean, (size_t)n * sizeof *grads);
    free(mean);
    return ok;
}

dg_node *dg_all_reduce_minimize_with_loss_scale(const dg_optimizer *opt, dg_output loss, dg_output global_step,
                                                const dg_collective_group *group, int64_t instance_key,
                                                const dg_loss_scale_options *o, dg_loss_scale *ls) {
    if (!group) {
        if (ls) memset(ls, 0, sizeof *ls);
        dg_graph_set_error(opt->graph, DG_INVALID_ARGUMENT, "all_reduce_minimize_with_loss_scale: no group");
        return NULL;
    }
    if (!graph_no_gradient_wire(opt, "all_reduce_minimize_with_loss_scale", "set the group's wire_dtype instead")) {
        if (ls) memset(ls, 0, sizeof *ls);
        return NULL;
    }
    reduce_ctx r = {group, instance_key};
    return graph_minimize_with_loss_scale(opt, loss, global_step, o, ls, all_reduce_gradients, &r);
}

dg_node *dg_collective_broadcast_variables(dg_graph *g, const dg_output *vars, int n_vars,
                                           const dg_collective_group *group, int64_t instance_key) {
    if (!dg_graph_ok(g)) return NULL;
    int cap = vars ? n_vars : dg_graph_collection_size(g, DG_GLOBAL_VARIABLES);
    dg_output *vs = calloc((size_t)(cap > 0 ? cap : 1), sizeof *vs);
    dg_output *out = calloc((size_t)(cap > 0 ? cap : 1), sizeof *out);
    dg_node **assigns = calloc((size_t)(cap > 0 ? cap : 1), sizeof *assigns);
    if (!vs || !out || !assigns) abort();
    int n = 0;
    for (int i = 0; i < cap; i++) {
        dg_output v = vars ? vars[i] : (dg_output){dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, i), 0};
        if (!v.node || strcmp(dg_node_op_type(v.node), "VariableV2") != 0) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "broadcast_variables: entry %d is not a variable", i);
            n = -1;
            break;
        }
        dg_dtype t = dg_output_dtype(v);
        if (dg_dtype_is_float(t) || t == DG_INT32 || t == DG_INT64) vs[n++] = v;   // the global step too
    }
    dg_node *done = NULL;
    if (n > 0) {
        dg_graph_push_name_scope(g, "broadcast_variables");
        bool ok = dg_collective_broadcast(g, "broadcast", vs, n, group, instance_key, out);
        for (int i = 0; i < n && ok; i++) {
            char nm[64];
            snprintf(nm, sizeof nm, "assign_%d", i);
            assigns[i] = dg_assign(g, nm, vs[i], out[i]).node;
            ok = assigns[i] != NULL;
        }
        if (ok) done = dg_group(g, "done", assigns, n);
        dg_graph_pop_name_scope(g);
    } else if (n == 0) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "broadcast_variables: no float variables to broadcast");
    }
    free(vs);
    free(out);
    free(assigns);
    return dg_graph_ok(g) ? done : NULL;
}
