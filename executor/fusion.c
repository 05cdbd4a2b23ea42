/* Kernel fusion when an executable is compiled, as TensorFlow's remapper does before a graph
 * runs: a chain of nodes whose intermediate values nobody else reads becomes one node that
 * makes the last value in one pass over memory. The user's graph is not changed; the fused
 * node is the executor's own, standing in for the chain in this executable only.
 *
 *   Conv2D -> BiasAdd [-> Relu]         _FusedConv2DBias[Relu] (x, filter, bias)
 *   MaxPoolGrad(x, y, dy) -> ReluGrad(., x)   _FusedMaxPoolGradReluGrad (x, y, dy)
 *
 * A chain fuses only when every node in it runs on a CPU in float32, the values it hides
 * are neither fed nor fetched and have exactly one reader (the next node) and no control
 * successors. DG_FUSION=0 in the environment turns fusion off (for comparisons). */
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"
#include "exec_fusion_impl.h"
#include "exec_kernel_registry_impl.h"
#include "graph_impl.h"
#include "ptrmap_impl.h"
#include "status_impl.h"

static const graph_op_def fused_conv_bias = {.name = "_FusedConv2DBias", .min_inputs = 3, .max_inputs = 3};
static const graph_op_def fused_conv_bias_relu = {.name = "_FusedConv2DBiasRelu", .min_inputs = 3, .max_inputs = 3};
static const graph_op_def fused_pool_grad_relu = {.name = "_FusedMaxPoolGradReluGrad", .min_inputs = 3,
                                                  .max_inputs = 3};

bool exec_fusion_enabled(void) {
    const char *e = getenv("DG_FUSION");
    return !e || strcmp(e, "0") != 0;
}

// What the pass knows of each node of the list: its index by address, how many data inputs of
// listed nodes read it, the last such reader, whether a listed node names it as a control
// input, whether it was fused into another node.
typedef struct fuse_info {
    ptrmap index;
    int *readers;
    int *reader;       // index of the last reader
    bool *ctrl_succ;
    bool *gone;
} fuse_info;

static int find(const fuse_info *fi, const void *k) { return ptrmap_get(&fi->index, k); }

static bool is_fed(const dg_output *feeds, int n_feeds, const dg_node *n) {
    for (int i = 0; i < n_feeds; i++)
        if (feeds[i].node == n) return true;
    return false;
}

static bool is_fetched(const dg_output *fetches, int n_fetches, const dg_node *n) {
    for (int i = 0; i < n_fetches; i++)
        if (fetches[i].node == n) return true;
    return false;
}

static bool on_cpu_f32(const dg_node *n, const char *default_type) {
    if (exec_kernel_dtype(n) != DG_FLOAT32) return false;
    if (!n->assigned_device || !n->assigned_device[0]) return strcmp(default_type, DG_DEVICE_TYPE_CPU) == 0;
    dg_device_name dn;
    dg_status tmp = DG_STATUS_INIT;
    bool ok = dg_device_name_parse(n->assigned_device, &dn, &tmp);
    status_impl_clear(&tmp);
    return ok && strcmp(dn.has_type ? dn.type : default_type, DG_DEVICE_TYPE_CPU) == 0;
}

static bool same_device(const dg_node *a, const dg_node *b) {
    const char *x = a->assigned_device ? a->assigned_device : "", *y = b->assigned_device ? b->assigned_device : "";
    return strcmp(x, y) == 0;
}

// Node p (index pi) hands its only output to node i as input 0 and to nobody else, and its
// value is private to the chain.
static bool private_to(const fuse_info *fi, int pi, int i, dg_node *const *nodes, const dg_output *feeds,
                       int n_feeds, const dg_output *fetches, int n_fetches) {
    const dg_node *p = nodes[pi];
    return pi >= 0 && !fi->gone[pi] && p->n_outputs == 1 && fi->readers[pi] == 1 && fi->reader[pi] == i &&
           !fi->ctrl_succ[pi] && !is_fed(feeds, n_feeds, p) && !is_fetched(fetches, n_fetches, p) &&
           same_device(p, nodes[i]);
}

// A node of the executor's own, computing last's output from inputs; its name and attributes
// are first's, its outputs last's. Control inputs: those of every node of the chain.
static dg_node *make_fused(const graph_op_def *op, dg_node *const *chain, int n_chain, const dg_output *inputs,
                           int n_inputs) {
    dg_node *first = chain[0], *last = chain[n_chain - 1];
    dg_node *f = calloc(1, sizeof *f);
    if (!f) return NULL;
    int n_ctrl = 0;
    for (int c = 0; c < n_chain; c++) n_ctrl += chain[c]->n_ctrl;
    f->inputs = malloc((size_t)n_inputs * sizeof *f->inputs);
    f->ctrl_inputs = malloc(((size_t)n_ctrl + 1) * sizeof *f->ctrl_inputs);
    if (!f->inputs || !f->ctrl_inputs) {
        free(f->inputs);
        free(f->ctrl_inputs);
        free(f);
        return NULL;
    }
    memcpy(f->inputs, inputs, (size_t)n_inputs * sizeof *inputs);
    f->n_inputs = f->cap_inputs = n_inputs;
    for (int c = 0; c < n_chain; c++)
        for (int k = 0; k < chain[c]->n_ctrl; k++) f->ctrl_inputs[f->n_ctrl++] = chain[c]->ctrl_inputs[k];
    f->cap_ctrl = f->n_ctrl;
    f->graph = first->graph;
    f->id = first->id;
    f->name = first->name;
    f->op = op;
    f->attrs = first->attrs;
    f->n_attrs = f->cap_attrs = first->n_attrs;
    f->n_outputs = last->n_outputs;
    f->out_dtypes = last->out_dtypes;
    f->out_shapes = last->out_shapes;
    f->requested_device = first->requested_device;
    f->assigned_device = first->assigned_device;
    f->shadow = true;
    return f;
}

static void free_made(dg_node *f) {
    if (!f) return;
    free(f->inputs);
    free(f->ctrl_inputs);
    free(f);
}

void exec_fused_free(exec_fused *out) {
    for (int i = 0; i < out->n_made; i++) free_made(out->made[i]);
    free(out->made);
    free(out->stands_for);
    free(out->nodes);
    memset(out, 0, sizeof *out);
}

static bool add_made(exec_fused *out, dg_node *f, dg_node *stands_for) {
    if (!f) return false;
    out->made[out->n_made] = f;
    out->stands_for[out->n_made++] = stands_for;
    return true;
}

bool exec_fuse(dg_node *const *nodes, int n, const dg_output *feeds, int n_feeds, const dg_output *fetches,
               int n_fetches, const char *default_type, exec_fused *out) {
    memset(out, 0, sizeof *out);
    fuse_info fi = {0};
    bool index_ok = ptrmap_init(&fi.index, n);
    fi.readers = calloc((size_t)n + 1, sizeof *fi.readers);
    fi.reader = calloc((size_t)n + 1, sizeof *fi.reader);
    fi.ctrl_succ = calloc((size_t)n + 1, sizeof *fi.ctrl_succ);
    fi.gone = calloc((size_t)n + 1, sizeof *fi.gone);
    out->nodes = malloc(((size_t)n + 1) * sizeof *out->nodes);
    out->made = calloc((size_t)n + 1, sizeof *out->made);
    out->stands_for = calloc((size_t)n + 1, sizeof *out->stands_for);
    bool ok = index_ok && fi.readers && fi.reader && fi.ctrl_succ && fi.gone && out->nodes && out->made &&
              out->stands_for;
    if (ok) {
        for (int i = 0; i < n; i++) ptrmap_put(&fi.index, nodes[i], i);
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < nodes[i]->n_inputs; k++) {
                int p = find(&fi, nodes[i]->inputs[k].node);
                if (p >= 0) {
                    fi.readers[p]++;
                    fi.reader[p] = i;
                }
            }
            for (int k = 0; k < nodes[i]->n_ctrl; k++) {
                int p = find(&fi, nodes[i]->ctrl_inputs[k]);
                if (p >= 0) fi.ctrl_succ[p] = true;
            }
        }
    }
    // Each fused node takes the place of the chain's last node; its other nodes are dropped.
    // Chains ending in Relu first, so that a BiasAdd alone fuses only when no Relu follows.
    dg_node **at = calloc((size_t)n + 1, sizeof *at);
    ok = ok && at;
    bool enabled = exec_fusion_enabled();
    for (int pass = 0; ok && enabled && pass < 2; pass++)
        for (int i = 0; ok && i < n; i++) {
            dg_node *nd = nodes[i];
            const char *op = nd->op->name;
            if (fi.gone[i] || !on_cpu_f32(nd, default_type)) continue;
            bool relu = pass == 0 && strcmp(op, "Relu") == 0;
            if (relu || (pass == 1 && strcmp(op, "BiasAdd") == 0)) {
                int bi = relu ? find(&fi, nd->inputs[0].node) : i;
                if (relu && !private_to(&fi, bi, i, nodes, feeds, n_feeds, fetches, n_fetches)) continue;
                if (strcmp(nodes[bi]->op->name, "BiasAdd") != 0 || !on_cpu_f32(nodes[bi], default_type)) continue;
                int ci = find(&fi, nodes[bi]->inputs[0].node);
                if (!private_to(&fi, ci, bi, nodes, feeds, n_feeds, fetches, n_fetches) ||
                    strcmp(nodes[ci]->op->name, "Conv2D") != 0 || !on_cpu_f32(nodes[ci], default_type))
                    continue;
                dg_node *chain[3] = {nodes[ci], nodes[bi], nd};
                dg_output in[3] = {nodes[ci]->inputs[0], nodes[ci]->inputs[1], nodes[bi]->inputs[1]};
                ok = add_made(out, make_fused(relu ? &fused_conv_bias_relu : &fused_conv_bias, chain, relu ? 3 : 2,
                                              in, 3), nd);
                if (!ok) break;
                fi.gone[ci] = fi.gone[bi] = fi.gone[i] = true;
                at[i] = out->made[out->n_made - 1];
            } else if (pass == 0 && strcmp(op, "ReluGrad") == 0) {
                int pi = find(&fi, nd->inputs[0].node);
                if (!private_to(&fi, pi, i, nodes, feeds, n_feeds, fetches, n_fetches) ||
                    strcmp(nodes[pi]->op->name, "MaxPoolGrad") != 0 || !on_cpu_f32(nodes[pi], default_type) ||
                    nodes[pi]->inputs[0].node != nd->inputs[1].node ||
                    nodes[pi]->inputs[0].index != nd->inputs[1].index)
                    continue;
                dg_node *chain[2] = {nodes[pi], nd};
                ok = add_made(out, make_fused(&fused_pool_grad_relu, chain, 2, nodes[pi]->inputs, 3), nd);
                if (!ok) break;
                fi.gone[pi] = fi.gone[i] = true;
                at[i] = out->made[out->n_made - 1];
            }
        }
    if (ok)
        for (int i = 0; i < n; i++) {
            if (at[i])
                out->nodes[out->n++] = at[i];
            else if (!fi.gone[i])
                out->nodes[out->n++] = nodes[i];
        }
    free(at);
    ptrmap_free(&fi.index);
    free(fi.readers);
    free(fi.reader);
    free(fi.ctrl_succ);
    free(fi.gone);
    if (!ok) exec_fused_free(out);
    return ok;
}
