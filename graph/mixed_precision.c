/* Automatic mixed precision as a rewrite of a built graph (TensorFlow's grappler pass
 * AutoMixedPrecision, reached through enable_mixed_precision_graph_rewrite; our own rules,
 * below). Four lists of op types:
 *   allow  compute in 16 bits whatever their neighbours (MatMul, BatchMatMulV2, Conv2D and its
 *          gradients: where the time goes);
 *   infer  compute in 16 bits when an input already is (elementwise ops after a product);
 *   clear  move values without arithmetic: 16 bits when all their float inputs are;
 *   deny   stay float32, and so do infer and clear ops fed by them (exp, log, softmax, losses,
 *          sums: their ranges or their rounding need float32). LayerNorm and attention compute
 *          in float32 inside and keep their statistics float32, so they may infer. A node
 *          whose builder marked it GRAPH_ATTR_KEEP_FLOAT32 counts as denied (the loss
 *          scaler's unscaling).
 * Nodes are decided in id order (a topological order), only those whose float outputs are all
 * float32 and whose float inputs are float32 or 16-bit from the rewrite: allow ops convert,
 * infer ops when one float input is converted and none comes from a deny op, clear ops when all
 * their float inputs are converted.
 * Then a converted node's float32 inputs go through a Cast to 16 bits, and an unconverted
 * node's inputs from converted ones through a Cast back to float32; each cast is made once per
 * source output and shared (graph_insert_cast), so a variable is cast once per step for every
 * product that reads it (a reader with control inputs gets its own cast, which waits for
 * them). Variables, their updates and everything off the lists stay float32. Every converted
 * value also gets its cast back made, for fetches. The casts are placed in the node order just
 * before their first reader (the unread ones at the end), so ids stay a topological order;
 * nodes added later are rewritten by the next call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/graph.h"
#include "graph_impl.h"
#include "status_impl.h"
#include "strmap_impl.h"

enum { L_NONE = 0, L_ALLOW, L_INFER, L_CLEAR, L_DENY };
static const char *const list_names[] = {"", "allow", "infer", "clear", "deny"};

static const char *const default_allow[] = {"MatMul", "BatchMatMulV2", "Conv2D", "Conv2DBackpropInput",
                                            "Conv2DBackpropFilter"};
static const char *const default_infer[] = {"Add", "Sub", "Mul", "Maximum", "Minimum", "Neg", "AddN", "BiasAdd",
                                            "Sigmoid", "SigmoidGrad", "Tanh", "TanhGrad", "Gelu", "GeluGrad",
                                            "ScaledDotProductAttention", "ScaledDotProductAttentionGrad", "LayerNorm",
                                            "LayerNormGrad"};
static const char *const default_clear[] = {"Identity", "Reshape", "StopGradient", "Transpose", "Relu", "ReluGrad"};
static const char *const default_deny[] = {"Exp", "Log", "Pow", "Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits",
                                           "SparseSoftmaxCrossEntropyWithLogits", "Sum", "Mean"};

dg_mixed_precision_options dg_mixed_precision_options_default(dg_dtype dtype) {
    dg_mixed_precision_options o;
    memset(&o, 0, sizeof o);
    o.dtype = dtype;
    return o;
}

// Ops that can hold or compute a 16-bit float, so may go on the allow, infer or clear list.
static bool takes_16(const char *op) {
    return graph_op_computes_16(op) || strcmp(op, "MatMul") == 0 || strcmp(op, "BatchMatMulV2") == 0 ||
           strncmp(op, "Conv2D", 6) == 0 || strcmp(op, "Identity") == 0 || strcmp(op, "Reshape") == 0 ||
           strcmp(op, "StopGradient") == 0 || strcmp(op, "Transpose") == 0;
}

typedef struct lists {
    graph_strmap map;   // op type (interned by the op table) -> list (intptr)
} lists;

static void put_all(lists *l, const char *const *names, size_t n, intptr_t which) {
    for (size_t i = 0; i < n; i++) {
        const graph_op_def *d = graph_op_lookup(names[i]);
        if (d && !graph_strmap_put(&l->map, d->name, (void *)which)) abort();
    }
}

// Applies one change ("A, B" of op types) to the lists: add puts each op on `which` (off any
// other), remove takes it off `which`.
static bool change(lists *l, const char *spec, intptr_t which, bool add, const char *field, dg_status *st) {
    if (!spec) return true;
    const char *p = spec;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        if (t > p) {
            char name[128];
            if ((size_t)(t - p) >= sizeof name) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "mixed precision: %s: an op type of %d characters", field,
                               (int)(t - p));
                return false;
            }
            memcpy(name, p, (size_t)(t - p));
            name[t - p] = 0;
            const graph_op_def *d = graph_op_lookup(name);
            if (!d) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "mixed precision: %s: unknown op type \"%s\"", field, name);
                return false;
            }
            if (add && which != L_DENY && !takes_16(d->name)) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "mixed precision: %s: %s has no 16-bit kernel, so it cannot "
                               "go on the %s list", field, name, list_names[which]);
                return false;
            }
            intptr_t now = (intptr_t)graph_strmap_get(&l->map, d->name);
            if (add) {
                if (!graph_strmap_put(&l->map, d->name, (void *)which)) abort();
            } else if (now == which) {
                if (!graph_strmap_put(&l->map, d->name, (void *)(intptr_t)L_NONE)) abort();
            }
        }
        p = e;
    }
    return true;
}

static bool lists_build(lists *l, const dg_mixed_precision_options *o, dg_status *st) {
    memset(l, 0, sizeof *l);
    put_all(l, default_allow, sizeof default_allow / sizeof *default_allow, L_ALLOW);
    put_all(l, default_infer, sizeof default_infer / sizeof *default_infer, L_INFER);
    put_all(l, default_clear, sizeof default_clear / sizeof *default_clear, L_CLEAR);
    put_all(l, default_deny, sizeof default_deny / sizeof *default_deny, L_DENY);
    struct {
        const char *spec, *field;
        intptr_t which;
        bool add;
    } ch[] = {
        {o->allow_remove, "allow_remove", L_ALLOW, false}, {o->infer_remove, "infer_remove", L_INFER, false},
        {o->clear_remove, "clear_remove", L_CLEAR, false}, {o->deny_remove, "deny_remove", L_DENY, false},
        {o->allow_add, "allow_add", L_ALLOW, true},        {o->infer_add, "infer_add", L_INFER, true},
        {o->clear_add, "clear_add", L_CLEAR, true},        {o->deny_add, "deny_add", L_DENY, true},
    };
    for (size_t i = 0; i < sizeof ch / sizeof ch[0]; i++)
        if (!change(l, ch[i].spec, ch[i].which, ch[i].add, ch[i].field, st)) {
            graph_strmap_clear(&l->map);
            return false;
        }
    return true;
}

static bool is_float_dtype(dg_dtype t) { return dg_dtype_is_float(t) || dg_dtype_is_float16_family(t); }

// Outputs a converted op keeps float32: LayerNorm's mean and rstd, attention's lse.
static bool stays_float32_output(const dg_node *n, int k) {
    return k > 0 && (strcmp(n->op->name, "LayerNorm") == 0 || strcmp(n->op->name, "ScaledDotProductAttention") == 0);
}

// A cast back to float32 of a converted value (made for a reader off the lists, a fetch, or a
// node built after the rewrite): a converted reader reads the value itself.
static bool is_cast_back(const dg_node *src) {
    return src->mixed == GRAPH_MIXED_CAST && src->n_inputs == 1 && src->out_dtypes[0] == DG_FLOAT32 &&
           src->inputs[0].node->mixed == GRAPH_MIXED_LOW;
}

// The verdict on n (GRAPH_MIXED_*), its inputs decided.
static uint8_t decide(const dg_node *n, int list, dg_dtype low) {
    bool keep = false;
    if (list == L_DENY || (dg_node_attr_bool(n, GRAPH_ATTR_KEEP_FLOAT32, &keep) && keep)) return GRAPH_MIXED_DENY;
    if (list == L_NONE || n->n_outputs == 0) return GRAPH_MIXED_NONE;
    bool f32_out = false;
    for (int i = 0; i < n->n_outputs; i++) {
        dg_dtype t = n->out_dtypes[i];
        if (t == DG_FLOAT32) f32_out = true;
        else if (is_float_dtype(t)) return GRAPH_MIXED_NONE;
    }
    if (!f32_out) return GRAPH_MIXED_NONE;
    int n_float = 0, n_low = 0, n_deny = 0;
    for (int i = 0; i < n->n_inputs; i++) {
        const dg_node *src = n->inputs[i].node;
        dg_dtype t = dg_output_dtype(n->inputs[i]);
        if (!is_float_dtype(t)) continue;
        n_float++;
        bool from_low = src->mixed == GRAPH_MIXED_LOW && !stays_float32_output(src, n->inputs[i].index);
        if ((from_low && (t == low || t == DG_FLOAT32)) || is_cast_back(src))
            n_low++;   // converted, or to be
        else if (t != DG_FLOAT32) return GRAPH_MIXED_NONE;   // float64, or 16 bits the user chose
        else if (src->mixed == GRAPH_MIXED_DENY) n_deny++;
    }
    if (list == L_ALLOW) return GRAPH_MIXED_LOW;
    if (n_deny > 0) return GRAPH_MIXED_DENY;   // an infer or clear op fed by a deny op
    if (list == L_INFER) return n_low > 0 ? GRAPH_MIXED_LOW : GRAPH_MIXED_NONE;
    return n_low > 0 && n_low == n_float ? GRAPH_MIXED_LOW : GRAPH_MIXED_NONE;   // clear
}

// A converted node: its float32 inputs through casts, its outputs inferred again (their shapes
// kept: inference may know less than the builder did).
// Inputs a converted op reads in float32 whatever its dtype: the forward pass's statistics
// that LayerNorm's and attention's gradients recompute from.
static bool keeps_float32(const dg_node *n, int i) {
    if (strcmp(n->op->name, "LayerNormGrad") == 0) return i == 3 || i == 4;   // mean, rstd
    if (strcmp(n->op->name, "ScaledDotProductAttentionGrad") == 0) return i == 5;   // lse
    return false;
}

static bool convert(dg_graph *g, dg_node *n, dg_dtype low) {
    for (int i = 0; i < n->n_inputs; i++) {
        if (keeps_float32(n, i)) continue;
        if (is_cast_back(n->inputs[i].node) && dg_output_dtype(n->inputs[i].node->inputs[0]) == low) {
            n->inputs[i] = n->inputs[i].node->inputs[0];
            continue;
        }
        if (dg_output_dtype(n->inputs[i]) != DG_FLOAT32) continue;
        // A variable read by a node with control inputs gets a cast of its own that waits for
        // them too: a shared cast could read the variable before an update the node waits for.
        const dg_node *src = n->inputs[i].node;
        const dg_node *ctrl = n->n_ctrl > 0 && strcmp(src->op->name, "VariableV2") == 0 ? n : NULL;
        dg_output c = graph_insert_cast(g, n->inputs[i], low, ctrl);
        if (!c.node) return false;
        n->inputs[i] = c;
    }
    int k = n->n_outputs;
    dg_shape *shapes = malloc(((size_t)k + 1) * sizeof *shapes);
    if (!shapes) abort();
    memcpy(shapes, n->out_shapes, (size_t)k * sizeof *shapes);
    dg_status st = DG_STATUS_INIT;
    bool ok = n->op->infer(n, &st);
    if (!ok || n->n_outputs != k) {
        graph_node_error(g, n, ok ? DG_INTERNAL : dg_status_code(&st), "mixed precision: %s",
                         ok ? "the outputs changed in number" : dg_status_message(&st));
        ok = false;
    } else {
        memcpy(n->out_shapes, shapes, (size_t)k * sizeof *shapes);
    }
    status_impl_clear(&st);
    free(shapes);
    return ok;
}

// An unconverted node's inputs from nodes this call converted (from id `from` on), back to
// float32 through casts; a node built after an earlier call read its 16 bits knowingly. Shape
// reads no values, so it reads the 16-bit tensor itself.
static bool widen_inputs(dg_graph *g, dg_node *n, dg_dtype low, int from) {
    if (strcmp(n->op->name, "Shape") == 0) return true;
    for (int i = 0; i < n->n_inputs; i++) {
        const dg_node *src = n->inputs[i].node;
        if (src->mixed != GRAPH_MIXED_LOW || src->id < from || dg_output_dtype(n->inputs[i]) != low) continue;
        dg_output c = graph_insert_cast(g, n->inputs[i], DG_FLOAT32, NULL);
        if (!c.node) return false;
        n->inputs[i] = c;
    }
    return true;
}

bool dg_graph_rewrite_mixed_precision(dg_graph *g, const dg_mixed_precision_options *o,
                                      dg_mixed_precision_report *report, dg_status *st) {
    dg_status_reset(st);
    if (report) memset(report, 0, sizeof *report);
    if (!g || !o) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "mixed precision: the graph or the options are NULL");
        return false;
    }
    if (!dg_dtype_is_float16_family(o->dtype)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "mixed precision: dtype must be bfloat16 or float16, got %s",
                       dg_dtype_name(o->dtype));
        return false;
    }
    if (!dg_graph_check(g, st)) return false;
    if (graph_has_builder_casts(g)) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "mixed precision: the graph already holds the casts of "
                      "dg_graph_set_mixed_precision; use the rewrite or that, not both");
        return false;
    }
    lists l;
    if (!lists_build(&l, o, st)) return false;
    int from = graph_rewritten(g), n = dg_graph_num_nodes(g);
    int converted = 0;
    for (int i = from; i < n; i++) {
        dg_node *node = dg_graph_node(g, i);
        if (node->mixed == GRAPH_MIXED_CAST) continue;   // a cast made for a fetch
        node->mixed = decide(node, (int)(intptr_t)graph_strmap_get(&l.map, node->op->name), o->dtype);
        converted += node->mixed == GRAPH_MIXED_LOW;
    }
    graph_strmap_clear(&l.map);
    bool ok = true;
    for (int i = from; i < n && ok; i++) {
        dg_node *node = dg_graph_node(g, i);
        if (node->mixed == GRAPH_MIXED_CAST) continue;
        ok = node->mixed == GRAPH_MIXED_LOW ? convert(g, node, o->dtype) : widen_inputs(g, node, o->dtype, from);
    }
    // Every converted value's cast back to float32, made now (placed at the end, read by
    // nothing until fetched): a fetch through a session then finds it, and no step's fetch
    // changes the graph while other threads may be running it.
    for (int i = from; i < n && ok; i++) {
        dg_node *node = dg_graph_node(g, i);
        if (node->mixed != GRAPH_MIXED_LOW) continue;
        for (int k = 0; k < node->n_outputs && ok; k++) {
            if (node->out_dtypes[k] != o->dtype) continue;
            ok = graph_insert_cast(g, (dg_output){node, k}, DG_FLOAT32, NULL).node != NULL;
        }
    }
    int total = dg_graph_num_nodes(g);
    if (ok && total > n) {
        // Each new cast just before its first reader (its source comes earlier still).
        dg_node **order = malloc((size_t)(total - from) * sizeof *order);
        bool *placed = calloc((size_t)(total - n), sizeof *placed);
        if (!order || !placed) abort();
        int k = 0;
        for (int i = from; i < n; i++) {
            dg_node *node = dg_graph_node(g, i);
            for (int j = 0; j < node->n_inputs; j++) {
                int id = node->inputs[j].node->id;
                if (id >= n && !placed[id - n]) {
                    placed[id - n] = true;
                    order[k++] = node->inputs[j].node;
                }
            }
            order[k++] = node;
        }
        for (int i = n; i < total; i++)
            if (!placed[i - n]) order[k++] = dg_graph_node(g, i);
        graph_reorder_tail(g, from, order);
        free(order);
        free(placed);
    }
    graph_set_rewritten(g, total);
    if (!dg_graph_check(g, st)) return false;   // the error a conversion recorded
    if (!ok) {
        dg_status_set(st, DG_INTERNAL, "mixed precision: a conversion failed without an error");
        return false;
    }
    if (report) {
        report->nodes_converted = converted;
        report->casts_added = total - n;   // every node the call added is a cast
    }
    return true;
}

dg_output graph_mixed_precision_fetch(const dg_graph *g, dg_output x) {
    if (!x.node || x.node->mixed != GRAPH_MIXED_LOW || !dg_dtype_is_float16_family(dg_output_dtype(x))) return x;
    dg_output c = graph_cast_lookup(g, x, DG_FLOAT32);   // made by the rewrite
    return c.node ? c : x;
}
