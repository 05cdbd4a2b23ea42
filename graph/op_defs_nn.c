/* Op definitions of convolutional networks: Conv2D with its two gradients, MaxPool and
 * AvgPool with theirs (TensorFlow's ops, NHWC only), and Dropout. Window rules in nn_impl.h.
 *
 * The gradient ops take the shape they produce as their first (or, for the filter, second)
 * input, an int32/int64 vector, as TensorFlow's do: the gradient functions pass Shape(x),
 * which stays in host memory on every device. Shape inference reads it statically when it is
 * a Shape or a Const node.
 *
 * Dropout(x, training) is this project's: y = x * mask, mask = (u >= rate) / (1 - rate) with u
 * uniform from the node's Philox stream (attributes "rate", "seed", "seed2"), as
 * tf.nn.dropout computes it; training (a bool scalar) false makes y = x and mask ones. Its
 * second output is the mask, which the gradient multiplies by. */
#include <stdio.h>
#include <string.h>

#include "nn_impl.h"

static dg_dtype in_dt(const dg_node *n, int i) { return dg_output_dtype(n->inputs[i]); }
static dg_shape in_sh(const dg_node *n, int i) { return dg_output_shape(n->inputs[i]); }
static const dg_output NULL_OUT = {NULL, 0};

// ---- windows ----

static bool attr4(const dg_node *n, const char *name, int64_t *a, int64_t *b, dg_status *st) {
    int count = 0;
    const int64_t *v = graph_node_attr_ints(n, name, &count);
    if (!v || count != 4) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "\"%s\" must be 4 integers [1, h, w, 1] (NHWC)", name);
        return false;
    }
    if (v[0] != 1 || v[3] != 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "\"%s\" [%lld, %lld, %lld, %lld]: the batch and channel entries must be 1", name,
                       (long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3]);
        return false;
    }
    if (v[1] < 1 || v[2] < 1 || v[1] > (1 << 20) || v[2] > (1 << 20)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "\"%s\" [1, %lld, %lld, 1]: entries must be 1 to 1048576",
                       name, (long long)v[1], (long long)v[2]);
        return false;
    }
    *a = v[1];
    *b = v[2];
    return true;
}

bool graph_window_attrs(const dg_node *n, bool pool, graph_window *w, dg_status *st) {
    memset(w, 0, sizeof *w);
    if (!attr4(n, "strides", &w->sh, &w->sw, st)) return false;
    if (pool && !attr4(n, "ksize", &w->kh, &w->kw, st)) return false;
    const char *p = dg_node_attr_string(n, "padding");
    if (!p || (strcmp(p, "SAME") != 0 && strcmp(p, "VALID") != 0)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "\"padding\" must be \"SAME\" or \"VALID\", got %s%s%s",
                       p ? "\"" : "", p ? p : "none", p ? "\"" : "");
        return false;
    }
    w->same = strcmp(p, "SAME") == 0;
    return true;
}

bool graph_window_dim(int64_t in, int64_t k, int64_t s, bool same, const char *axis,
                      int64_t *out, int64_t *pad_before, dg_status *st) {
    *pad_before = 0;
    if (in < 0) {
        *out = -1;
        return true;
    }
    if (same) {
        *out = (in + s - 1) / s;
        int64_t need = (*out - 1) * s + k - in;
        *pad_before = need > 0 ? need / 2 : 0;
        return true;
    }
    if (k > in) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "the window (%lld) is larger than the input's %s (%lld) with VALID padding",
                       (long long)k, axis, (long long)in);
        return false;
    }
    *out = (in - k) / s + 1;
    return true;
}

bool graph_conv_geom_make(const dg_shape *x, const graph_window *w, int64_t oc,
                          graph_conv_geom *g, dg_status *st) {
    if (x->rank != 4) {
        char b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "the input must be NHWC of rank 4, got shape %s",
                       dg_shape_str(x, b, sizeof b));
        return false;
    }
    memset(g, 0, sizeof *g);
    g->n = x->dims[0];
    g->h = x->dims[1];
    g->w = x->dims[2];
    g->c = x->dims[3];
    g->kh = w->kh;
    g->kw = w->kw;
    g->sh = w->sh;
    g->sw = w->sw;
    g->oc = oc;
    return graph_window_dim(g->h, w->kh, w->sh, w->same, "height", &g->oh, &g->pad_top, st) &&
           graph_window_dim(g->w, w->kw, w->sw, w->same, "width", &g->ow, &g->pad_left, st);
}

// ---- checks ----

// Conv2D and its gradients take the 16-bit floats too (executor/cpu/kernels_conv.c).
static bool takes_16(const dg_node *n) { return strncmp(n->op->name, "Conv2D", 6) == 0; }

static bool float_rank4(const dg_node *n, int i, const char *what, dg_status *st) {
    dg_shape s = in_sh(n, i);
    bool dt_ok = dg_dtype_is_float(in_dt(n, i)) || (dg_dtype_is_float16_family(in_dt(n, i)) && takes_16(n));
    if (dt_ok && (s.rank < 0 || s.rank == 4)) return true;
    char b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (%s, \"%s\") must be a float32 or float64 tensor of rank 4, "
                   "got %s %s", i, what, n->inputs[i].node->name, dg_dtype_name(in_dt(n, i)),
                   dg_shape_str(&s, b, sizeof b));
    return false;
}

static bool same_dt(const dg_node *n, int a, int b, dg_status *st) {
    if (in_dt(n, a) == in_dt(n, b)) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "inputs %d and %d must have the same dtype, got %s and %s", a, b,
                   dg_dtype_name(in_dt(n, a)), dg_dtype_name(in_dt(n, b)));
    return false;
}

static bool sizes_input(const dg_node *n, int i, dg_status *st) {
    dg_dtype t = in_dt(n, i);
    dg_shape s = in_sh(n, i);
    if ((t == DG_INT32 || t == DG_INT64) && (s.rank < 0 || (s.rank == 1 && (s.dims[0] < 0 || s.dims[0] == 4))))
        return true;
    char b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be a shape: an int32 or int64 vector of 4, got %s %s",
                   i, n->inputs[i].node->name, dg_dtype_name(t), dg_shape_str(&s, b, sizeof b));
    return false;
}

// The shape a sizes input holds when the graph knows it (a Shape of a node, or a Const);
// unknown of rank 4 otherwise.
static dg_shape static_sizes(const dg_node *n, int i) {
    const dg_node *src = n->inputs[i].node;
    if (strcmp(src->op->name, "Shape") == 0) return in_sh(src, 0);
    const graph_attr *a = strcmp(src->op->name, "Const") == 0 ? graph_node_attr(src, "value") : NULL;
    if (a && a->kind == GA_TENSOR && dg_tensor_num_elements(a->u.t) == 4) {
        int64_t d[4];
        for (int k = 0; k < 4; k++)
            d[k] = a->u.t->dtype == DG_INT32 ? dg_tensor_i32(a->u.t)[k] : dg_tensor_i64(a->u.t)[k];
        return dg_shape_make(4, d);
    }
    int64_t u[4] = {-1, -1, -1, -1};
    return dg_shape_make(4, u);
}

static bool out1(dg_node *n, dg_dtype dt, dg_shape sh, dg_status *st) {
    if (!graph_set_num_outputs(n, 1, st)) return false;
    graph_set_output(n, 0, dt, sh);
    return true;
}

static dg_shape shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
    int64_t v[4] = {a, b, c, d};
    return dg_shape_make(4, v);
}

// The static output shape of a window op over input shape x with output channels oc.
static bool window_out(const dg_shape *x, const graph_window *w, int64_t oc, dg_shape *out, dg_status *st) {
    int64_t oh, ow, pad;
    if (x->rank < 0) {
        *out = shape4(-1, -1, -1, oc);
        return true;
    }
    if (!graph_window_dim(x->dims[1], w->kh, w->sh, w->same, "height", &oh, &pad, st) ||
        !graph_window_dim(x->dims[2], w->kw, w->sw, w->same, "width", &ow, &pad, st))
        return false;
    *out = shape4(x->dims[0], oh, ow, oc);
    return true;
}

// ---- inference ----

static bool infer_conv2d(dg_node *n, dg_status *st) {   // input, filter
    graph_window w;
    if (!float_rank4(n, 0, "input", st) || !float_rank4(n, 1, "filter", st) || !same_dt(n, 0, 1, st) ||
        !graph_window_attrs(n, false, &w, st))
        return false;
    dg_shape x = in_sh(n, 0), f = in_sh(n, 1);
    if (f.rank < 0) return out1(n, in_dt(n, 0), shape4(x.rank < 0 ? -1 : x.dims[0], -1, -1, -1), st);
    if (x.rank == 4 && x.dims[3] >= 0 && f.dims[2] >= 0 && x.dims[3] != f.dims[2]) {
        char a[128], b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "the input has %lld channels but the filter expects %lld "
                       "(input %s, filter [height, width, in, out] %s)", (long long)x.dims[3], (long long)f.dims[2],
                       dg_shape_str(&x, a, sizeof a), dg_shape_str(&f, b, sizeof b));
        return false;
    }
    w.kh = f.dims[0];
    w.kw = f.dims[1];
    if (w.kh < 0 || w.kw < 0) return out1(n, in_dt(n, 0), shape4(x.rank < 0 ? -1 : x.dims[0], -1, -1, f.dims[3]), st);
    dg_shape o;
    return window_out(&x, &w, f.dims[3], &o, st) && out1(n, in_dt(n, 0), o, st);
}

static bool infer_conv2d_bp_input(dg_node *n, dg_status *st) {   // input_sizes, filter, out_backprop
    graph_window w;
    return sizes_input(n, 0, st) && float_rank4(n, 1, "filter", st) && float_rank4(n, 2, "out_backprop", st) &&
           same_dt(n, 1, 2, st) && graph_window_attrs(n, false, &w, st) && out1(n, in_dt(n, 1), static_sizes(n, 0), st);
}

static bool infer_conv2d_bp_filter(dg_node *n, dg_status *st) {   // input, filter_sizes, out_backprop
    graph_window w;
    return float_rank4(n, 0, "input", st) && sizes_input(n, 1, st) && float_rank4(n, 2, "out_backprop", st) &&
           same_dt(n, 0, 2, st) && graph_window_attrs(n, false, &w, st) && out1(n, in_dt(n, 0), static_sizes(n, 1), st);
}

static bool infer_pool(dg_node *n, dg_status *st) {
    graph_window w;
    if (!float_rank4(n, 0, "input", st) || !graph_window_attrs(n, true, &w, st)) return false;
    dg_shape x = in_sh(n, 0), o;
    return window_out(&x, &w, x.rank < 0 ? -1 : x.dims[3], &o, st) && out1(n, in_dt(n, 0), o, st);
}

static bool infer_max_pool_grad(dg_node *n, dg_status *st) {   // orig_input, orig_output, grad
    graph_window w;
    return float_rank4(n, 0, "orig_input", st) && float_rank4(n, 1, "orig_output", st) &&
           float_rank4(n, 2, "grad", st) && same_dt(n, 0, 1, st) && same_dt(n, 0, 2, st) &&
           graph_window_attrs(n, true, &w, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_avg_pool_grad(dg_node *n, dg_status *st) {   // orig_input_shape, grad
    graph_window w;
    return sizes_input(n, 0, st) && float_rank4(n, 1, "grad", st) && graph_window_attrs(n, true, &w, st) &&
           out1(n, in_dt(n, 1), static_sizes(n, 0), st);
}

static bool infer_dropout(dg_node *n, dg_status *st) {   // x, training
    double rate;
    if (!dg_dtype_is_float(in_dt(n, 0))) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input 0 (\"%s\") must be float32 or float64, got %s",
                       n->inputs[0].node->name, dg_dtype_name(in_dt(n, 0)));
        return false;
    }
    dg_shape t = in_sh(n, 1);
    if (in_dt(n, 1) != DG_BOOL || t.rank > 0) {
        char b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input 1 (training, \"%s\") must be a bool scalar, got %s %s",
                       n->inputs[1].node->name, dg_dtype_name(in_dt(n, 1)), dg_shape_str(&t, b, sizeof b));
        return false;
    }
    if (!dg_node_attr_float(n, "rate", &rate) || !(rate >= 0 && rate < 1)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "\"rate\" must be in [0, 1)");
        return false;
    }
    if (!graph_set_num_outputs(n, 2, st)) return false;
    graph_set_output(n, 0, in_dt(n, 0), in_sh(n, 0));
    graph_set_output(n, 1, in_dt(n, 0), in_sh(n, 0));
    return true;
}

// ---- gradients ----

static dg_output shape_of(dg_graph *g, dg_output x) { return graph_build(g, "Shape", NULL, &x, 1); }

// A node of type with inputs ins and the window attributes of n.
static dg_output build_window_op(dg_graph *g, const char *type, const dg_node *n, const dg_output *ins, int k) {
    dg_node *m = graph_begin(g, type, NULL);
    if (!m) return NULL_OUT;
    for (int i = 0; i < k; i++) graph_add_input(m, ins[i]);
    int count;
    const int64_t *v = graph_node_attr_ints(n, "strides", &count);
    if (v) graph_set_attr_ints(m, "strides", v, count);
    if ((v = graph_node_attr_ints(n, "ksize", &count))) graph_set_attr_ints(m, "ksize", v, count);
    const char *p = dg_node_attr_string(n, "padding");
    if (p) graph_set_attr_string(m, "padding", p);
    m = graph_finish(m);
    return m ? (dg_output){m, 0} : NULL_OUT;
}

static bool grad_conv2d(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output x = n->inputs[0], f = n->inputs[1];
    dg_output a[3] = {shape_of(g, x), f, dy[0]};
    dx[0] = build_window_op(g, "Conv2DBackpropInput", n, a, 3);
    dg_output b[3] = {x, shape_of(g, f), dy[0]};
    dx[1] = build_window_op(g, "Conv2DBackpropFilter", n, b, 3);
    return dg_graph_ok(g);
}

static bool grad_max_pool(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output a[3] = {n->inputs[0], {n, 0}, dy[0]};
    dx[0] = build_window_op(g, "MaxPoolGrad", n, a, 3);
    return dg_graph_ok(g);
}

static bool grad_avg_pool(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output a[2] = {shape_of(g, n->inputs[0]), dy[0]};
    dx[0] = build_window_op(g, "AvgPoolGrad", n, a, 2);
    return dg_graph_ok(g);
}

static bool grad_dropout(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dy[0].node ? dg_mul(g, NULL, dy[0], (dg_output){n, 1}) : NULL_OUT;
    dx[1] = NULL_OUT;
    return dg_graph_ok(g);
}

static const graph_op_def nn_op_defs[] = {
    GRAPH_OP("Conv2D", 2, 2, false, false, false, infer_conv2d, grad_conv2d),
    GRAPH_OP("Conv2DBackpropInput", 3, 3, false, false, false, infer_conv2d_bp_input, NULL),
    GRAPH_OP("Conv2DBackpropFilter", 3, 3, false, false, false, infer_conv2d_bp_filter, NULL),
    GRAPH_OP("MaxPool", 1, 1, false, false, false, infer_pool, grad_max_pool),
    GRAPH_OP("MaxPoolGrad", 3, 3, false, false, false, infer_max_pool_grad, NULL),
    GRAPH_OP("AvgPool", 1, 1, false, false, false, infer_pool, grad_avg_pool),
    GRAPH_OP("AvgPoolGrad", 2, 2, false, false, false, infer_avg_pool_grad, NULL),
    // Stateful: its random stream advances every step, so it is never folded or merged.
    GRAPH_OP("Dropout", 2, 2, true, false, false, infer_dropout, grad_dropout),
};

int graph_nn_op_defs(const graph_op_def **defs) {
    *defs = nn_op_defs;
    return (int)(sizeof nn_op_defs / sizeof nn_op_defs[0]);
}
