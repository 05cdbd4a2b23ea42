/* Reverse-mode differentiation as graph construction (TensorFlow's gradients_impl), and the
 * gradient function of every differentiable op. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/train.h"
#include "grad_impl.h"

static const dg_output NUL = {NULL, 0};

static dg_output in(const dg_node *n, int i) { return n->inputs[i]; }
static dg_output out(dg_node *n, int i) {
    dg_output o = {n, i};
    return o;
}

static dg_output shape_to(dg_graph *g, const char *type, dg_output x, dg_output shape) {
    dg_output ins[2] = {x, shape};
    return graph_build(g, type, NULL, ins, 2);
}

// Sums grad down to the shape of x (undoes broadcasting); grad itself when the static
// shapes already agree.
static dg_output sum_to(dg_graph *g, dg_output grad, dg_output x) {
    dg_shape gs = dg_output_shape(grad), xs = dg_output_shape(x);
    if (dg_shape_is_fully_defined(&gs) && dg_shape_equal(&gs, &xs)) return grad;
    return shape_to(g, "SumToShape", grad, dg_shape_of(g, NULL, x));
}

static dg_output scalar_like(dg_graph *g, dg_output x, double v) {
    return dg_scalar(g, NULL, dg_output_dtype(x), v);
}

bool grad_Identity(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dy[0];
    return true;
}

bool grad_MatMul(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    bool ta = false, tb = false;
    dg_node_attr_bool(n, "transpose_a", &ta);
    dg_node_attr_bool(n, "transpose_b", &tb);
    dg_output a = in(n, 0), b = in(n, 1), d = dy[0];
    if (!ta && !tb) {
        dx[0] = dg_matmul(g, NULL, d, b, false, true);
        dx[1] = dg_matmul(g, NULL, a, d, true, false);
    } else if (!ta && tb) {
        dx[0] = dg_matmul(g, NULL, d, b, false, false);
        dx[1] = dg_matmul(g, NULL, d, a, true, false);
    } else if (ta && !tb) {
        dx[0] = dg_matmul(g, NULL, b, d, false, true);
        dx[1] = dg_matmul(g, NULL, a, d, false, false);
    } else {
        dx[0] = dg_matmul(g, NULL, b, d, true, true);
        dx[1] = dg_matmul(g, NULL, d, a, true, true);
    }
    return dg_graph_ok(g);
}

// TensorFlow's _BatchMatMulV2Grad: MatMul's four cases with adjoints, each summed back over the
// batch dimensions its input was broadcast along.
bool grad_BatchMatMulV2(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    bool ax = false, ay = false;
    dg_node_attr_bool(n, "adj_x", &ax);
    dg_node_attr_bool(n, "adj_y", &ay);
    dg_output x = in(n, 0), y = in(n, 1), d = dy[0], gx, gy;
    if (!ax && !ay) {
        gx = dg_batch_matmul(g, NULL, d, y, false, true);
        gy = dg_batch_matmul(g, NULL, x, d, true, false);
    } else if (!ax && ay) {
        gx = dg_batch_matmul(g, NULL, d, y, false, false);
        gy = dg_batch_matmul(g, NULL, d, x, true, false);
    } else if (ax && !ay) {
        gx = dg_batch_matmul(g, NULL, y, d, false, true);
        gy = dg_batch_matmul(g, NULL, x, d, false, false);
    } else {
        gx = dg_batch_matmul(g, NULL, y, d, true, true);
        gy = dg_batch_matmul(g, NULL, d, x, true, true);
    }
    dx[0] = sum_to(g, gx, x);
    dx[1] = sum_to(g, gy, y);
    return dg_graph_ok(g);
}

bool grad_Add(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = sum_to(g, dy[0], in(n, 0));
    dx[1] = sum_to(g, dy[0], in(n, 1));
    return dg_graph_ok(g);
}

bool grad_Sub(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = sum_to(g, dy[0], in(n, 0));
    dx[1] = sum_to(g, dg_neg(g, NULL, dy[0]), in(n, 1));
    return dg_graph_ok(g);
}

bool grad_Mul(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = sum_to(g, dg_mul(g, NULL, dy[0], in(n, 1)), in(n, 0));
    dx[1] = sum_to(g, dg_mul(g, NULL, dy[0], in(n, 0)), in(n, 1));
    return dg_graph_ok(g);
}

bool grad_Div(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output x = in(n, 0), y = in(n, 1);
    dx[0] = sum_to(g, dg_div(g, NULL, dy[0], y), x);
    // d(x/y)/dy = -x/y^2 = -(x/y)/y
    dg_output q = dg_div(g, NULL, dg_div(g, NULL, x, y), y);
    dx[1] = sum_to(g, dg_neg(g, NULL, dg_mul(g, NULL, dy[0], q)), y);
    return dg_graph_ok(g);
}

static bool select_grad(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx,
                        const char *x_wins_cmp) {
    dg_output x = in(n, 0), y = in(n, 1);
    dg_dtype t = dg_output_dtype(x);
    dg_output ins[2] = {x, y};
    dg_output xmask = dg_cast(g, NULL, graph_build(g, x_wins_cmp, NULL, ins, 2), t);
    dg_output ymask = dg_sub(g, NULL, scalar_like(g, x, 1.0), xmask);
    dx[0] = sum_to(g, dg_mul(g, NULL, dy[0], xmask), x);
    dx[1] = sum_to(g, dg_mul(g, NULL, dy[0], ymask), y);
    return dg_graph_ok(g);
}

// d(x^y)/dx = y x^(y-1); d(x^y)/dy = x^y log(x) where x > 0, else 0 (TensorFlow's choice).
bool grad_Pow(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output x = in(n, 0), y = in(n, 1), z = out(n, 0);
    dg_output ym1 = dg_sub(g, NULL, y, scalar_like(g, y, 1.0));
    dx[0] = sum_to(g, dg_mul(g, NULL, dy[0], dg_mul(g, NULL, y, dg_pow(g, NULL, x, ym1))), x);
    dg_output pos = dg_greater(g, NULL, x, scalar_like(g, x, 0.0));
    dg_output safe_x = dg_where(g, NULL, pos, x, dg_ones_like(g, NULL, x));
    dg_output log_x = dg_where(g, NULL, pos, dg_log(g, NULL, safe_x), dg_zeros_like(g, NULL, x));
    dx[1] = sum_to(g, dg_mul(g, NULL, dy[0], dg_mul(g, NULL, z, log_x)), y);
    return dg_graph_ok(g);
}

// Select(c, t, e): dy goes to t where c holds, to e elsewhere.
bool grad_Select(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output c = in(n, 0), zeros = dg_zeros_like(g, NULL, dy[0]);
    dx[0] = NUL;
    dx[1] = sum_to(g, dg_where(g, NULL, c, dy[0], zeros), in(n, 1));
    dx[2] = sum_to(g, dg_where(g, NULL, c, zeros, dy[0]), in(n, 2));
    return dg_graph_ok(g);
}

bool grad_Maximum(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    return select_grad(g, n, dy, dx, "GreaterEqual");
}
bool grad_Minimum(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    return select_grad(g, n, dy, dx, "LessEqual");
}

bool grad_AddN(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    for (int i = 0; i < n->n_inputs; i++) dx[i] = dy[0];
    return true;
}

bool grad_BiasAdd(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dy[0];
    dx[1] = graph_build(g, "BiasAddGrad", NULL, dy, 1);
    return dg_graph_ok(g);
}

static dg_output op2(dg_graph *g, const char *type, dg_output a, dg_output b) {
    dg_output ins[2] = {a, b};
    return graph_build(g, type, NULL, ins, 2);
}

bool grad_Relu(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "ReluGrad", dy[0], out(n, 0));
    return dg_graph_ok(g);
}
bool grad_Sigmoid(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "SigmoidGrad", out(n, 0), dy[0]);
    return dg_graph_ok(g);
}
bool grad_Tanh(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "TanhGrad", out(n, 0), dy[0]);
    return dg_graph_ok(g);
}
bool grad_Exp(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_mul(g, NULL, dy[0], out(n, 0));
    return dg_graph_ok(g);
}
bool grad_Log(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_div(g, NULL, dy[0], in(n, 0));
    return dg_graph_ok(g);
}
bool grad_Square(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_mul(g, NULL, dy[0], dg_mul(g, NULL, in(n, 0), scalar_like(g, in(n, 0), 2.0)));
    return dg_graph_ok(g);
}
bool grad_Sqrt(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "SqrtGrad", out(n, 0), dy[0]);
    return dg_graph_ok(g);
}
// TensorFlow's RsqrtGrad(y, dy) = dy * -0.5 * y^3.
bool grad_Rsqrt(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "RsqrtGrad", out(n, 0), dy[0]);
    return dg_graph_ok(g);
}
// d erf(x) = 2 / sqrt(pi) * exp(-x^2), composed as TensorFlow's _ErfGrad.
bool grad_Erf(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_output x = in(n, 0);
    dg_output e = dg_exp(g, NULL, dg_neg(g, NULL, dg_square(g, NULL, x)));
    dx[0] = dg_mul(g, NULL, dy[0], dg_mul(g, NULL, scalar_like(g, x, 1.1283791670955126), e));
    return dg_graph_ok(g);
}
// TensorFlow's _SinGrad and _CosGrad: dy cos(x) and -dy sin(x).
bool grad_Sin(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_mul(g, NULL, dy[0], dg_cos(g, NULL, in(n, 0)));
    return dg_graph_ok(g);
}
bool grad_Cos(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_neg(g, NULL, dg_mul(g, NULL, dy[0], dg_sin(g, NULL, in(n, 0))));
    return dg_graph_ok(g);
}
// GeluGrad(dy, x) with the forward op's form (approximate: tanh).
bool grad_Gelu(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    bool approximate = false;
    (void)dg_node_attr_bool(n, "approximate", &approximate);
    dg_node *gn = graph_begin(g, "GeluGrad", NULL);
    graph_add_input(gn, dy[0]);
    graph_add_input(gn, in(n, 0));
    graph_set_attr_bool(gn, "approximate", approximate);
    dx[0] = (dg_output){graph_finish(gn), 0};
    return dg_graph_ok(g);
}
bool grad_Neg(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_neg(g, NULL, dy[0]);
    return dg_graph_ok(g);
}

bool grad_ClipByValue(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_node *cg = graph_begin(g, "ClipByValueGrad", NULL);
    graph_add_input(cg, dy[0]);
    for (int i = 0; i < 3; i++) graph_add_input(cg, in(n, i));
    cg = graph_finish(cg);
    if (!cg) return false;
    dx[0] = out(cg, 0);
    dx[1] = sum_to(g, out(cg, 1), in(n, 1));
    dx[2] = sum_to(g, out(cg, 2), in(n, 2));
    return dg_graph_ok(g);
}

bool grad_Softmax(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "SoftmaxGrad", out(n, 0), dy[0]);
    return dg_graph_ok(g);
}
bool grad_LogSoftmax(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = op2(g, "LogSoftmaxGrad", out(n, 0), dy[0]);
    return dg_graph_ok(g);
}

// dy [N] as a column [N, 1].
static dg_output column(dg_graph *g, dg_output v) {
    int64_t d[2] = {-1, 1};
    return dg_reshape(g, NULL, v, d, 2);
}

bool grad_SoftmaxCrossEntropyWithLogits(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    if (!dy[0].node) return true;   // only the backprop output was used: no gradient
    dg_output col = column(g, dy[0]);
    dx[0] = dg_mul(g, NULL, col, out(n, 1));
    dx[1] = dg_mul(g, NULL, col, dg_neg(g, NULL, dg_log_softmax(g, NULL, in(n, 0))));
    return dg_graph_ok(g);
}

bool grad_SparseSoftmaxCrossEntropyWithLogits(dg_graph *g, dg_node *n, const dg_output *dy,
                                              dg_output *dx) {
    if (!dy[0].node) return true;
    dx[0] = dg_mul(g, NULL, column(g, dy[0]), out(n, 1));
    return dg_graph_ok(g);
}

static bool reduce_grad(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx, bool mean) {
    dg_node *sg = graph_begin(g, "SumGrad", NULL);
    graph_add_input(sg, dy[0]);
    graph_add_input(sg, dg_shape_of(g, NULL, in(n, 0)));
    int count;
    const int64_t *axes = graph_node_attr_ints(n, "axes", &count);
    graph_set_attr_ints(sg, "axes", axes, count);
    bool keep = false;
    dg_node_attr_bool(n, "keep_dims", &keep);
    graph_set_attr_bool(sg, "keep_dims", keep);
    graph_set_attr_bool(sg, "mean", mean);
    sg = graph_finish(sg);
    dx[0] = out(sg, 0);
    return sg != NULL;
}

bool grad_Sum(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    return reduce_grad(g, n, dy, dx, false);
}
bool grad_Mean(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    return reduce_grad(g, n, dy, dx, true);
}

bool grad_Max(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_node *mg = graph_begin(g, "MaxGrad", NULL);
    graph_add_input(mg, dy[0]);
    graph_add_input(mg, in(n, 0));
    graph_add_input(mg, out(n, 0));
    int count;
    const int64_t *axes = graph_node_attr_ints(n, "axes", &count);
    graph_set_attr_ints(mg, "axes", axes, count);
    bool keep = false;
    dg_node_attr_bool(n, "keep_dims", &keep);
    graph_set_attr_bool(mg, "keep_dims", keep);
    mg = graph_finish(mg);
    dx[0] = out(mg, 0);
    return mg != NULL;
}

bool grad_Reshape(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_reshape_to(g, NULL, dy[0], dg_shape_of(g, NULL, in(n, 0)));
    return dg_graph_ok(g);
}

bool grad_Cast(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_dtype src = dg_output_dtype(in(n, 0));
    if (graph_dtype_differentiable(src) && graph_dtype_differentiable(dg_output_dtype(dy[0])))
        dx[0] = dg_cast(g, NULL, dy[0], src);
    return dg_graph_ok(g);
}

bool grad_Concat(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    int64_t axis = 0;
    dg_node_attr_int(n, "axis", &axis);
    dg_shape s0 = dg_output_shape(in(n, 0));
    if (s0.rank < 0) {
        graph_node_error(g, n, DG_UNIMPLEMENTED, "gradient of Concat needs known input ranks");
        return false;
    }
    if (axis < 0) axis += s0.rank;
    int64_t offset = 0;
    for (int i = 0; i < n->n_inputs; i++) {
        dg_shape si = dg_output_shape(in(n, i));
        if (si.dims[axis] < 0) {
            graph_node_error(g, n, DG_UNIMPLEMENTED,
                             "gradient of Concat needs the size of input %d along axis %lld", i,
                             (long long)axis);
            return false;
        }
        int64_t begin[DG_MAX_RANK], size[DG_MAX_RANK];
        for (int d = 0; d < s0.rank; d++) {
            begin[d] = d == axis ? offset : 0;
            size[d] = d == axis ? si.dims[d] : -1;
        }
        dx[i] = dg_slice(g, NULL, dy[0], begin, size, s0.rank);
        offset += si.dims[axis];
    }
    return dg_graph_ok(g);
}

bool grad_Split(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    int64_t axis = 0;
    dg_node_attr_int(n, "axis", &axis);
    dg_output *parts = calloc((size_t)n->n_outputs, sizeof *parts);
    if (!parts) abort();
    for (int i = 0; i < n->n_outputs; i++)
        parts[i] = dy[i].node ? dy[i] : dg_zeros_like(g, NULL, out(n, i));
    dx[0] = dg_concat(g, NULL, parts, n->n_outputs, axis);
    free(parts);
    return dg_graph_ok(g);
}

bool grad_Slice(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dg_node *sg = graph_begin(g, "SliceGrad", NULL);
    graph_add_input(sg, dy[0]);
    graph_add_input(sg, dg_shape_of(g, NULL, in(n, 0)));
    int count;
    const int64_t *begin = graph_node_attr_ints(n, "begin", &count);
    graph_set_attr_ints(sg, "begin", begin, count);
    sg = graph_finish(sg);
    dx[0] = out(sg, 0);
    return sg != NULL;
}

bool grad_Fill(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[1] = dg_sum(g, NULL, dy[0], NULL, 0, false);
    return dg_graph_ok(g);
}

bool grad_BroadcastTo(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = sum_to(g, dy[0], in(n, 0));
    return dg_graph_ok(g);
}

bool grad_SumToShape(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = shape_to(g, "BroadcastTo", dy[0], dg_shape_of(g, NULL, in(n, 0)));
    return dg_graph_ok(g);
}

// ---- the driver ----

typedef struct contrib {
    dg_output *items;
    int n, cap;
} contrib;

static void add_contrib(contrib *c, dg_output o) { BASE_PUSH(c->items, c->n, c->cap, o); }

// The sum of a node output's gradient contributions. Sparse ones of one table (IndexedSlices)
// add up as TensorFlow's do: their rows and indices concatenated, still sparse; otherwise AddN
// (a sparse one read densely).
static dg_output aggregate(dg_graph *g, const contrib *c) {
    if (c->n == 0) return NUL;
    if (c->n == 1) return c->items[0];
    dg_output *values = calloc((size_t)c->n, sizeof *values), *indices = calloc((size_t)c->n, sizeof *indices);
    if (!values || !indices) abort();
    bool sparse = true;
    int64_t rows = -1;
    for (int i = 0; i < c->n && sparse; i++) {
        dg_shape s = dg_output_shape(c->items[i]);
        sparse = dg_gradient_is_sparse(c->items[i], &values[i], &indices[i]) && s.rank >= 1 &&
                 (i == 0 || s.dims[0] == rows);
        rows = s.rank >= 1 ? s.dims[0] : -1;
    }
    dg_output sum = sparse ? graph_sparse_gradient(g, dg_concat(g, NULL, values, c->n, 0),
                                                   dg_concat(g, NULL, indices, c->n, 0), rows)
                           : dg_add_n(g, NULL, c->items, c->n);
    free(values);
    free(indices);
    return sum;
}

// Under colocate_gradients_with_ops, the device the gradient nodes of nd ask for: nd's own
// request or, when it asks for none, that of the first node it is colocated with (a variable's
// read goes with its variable). The request, not a place in nd's colocation group as in
// TensorFlow: a gradient node this device cannot run (integer shape arithmetic on a GPU) then
// falls back to its task's CPU under soft placement instead of taking nd off its device.
static const char *forward_device(const dg_graph *g, const dg_node *nd) {
    const char *dev = dg_node_requested_device(nd);
    for (int i = 0; !dev[0] && i < dg_node_num_colocations(nd); i++) {
        const dg_node *c = dg_graph_find(g, dg_node_colocation(nd, i));
        if (c) dev = dg_node_requested_device(c);
    }
    return dev;
}

// Pushes the scope the gradient nodes of nd are built under: a barrier (the caller's device
// scopes and functions no longer apply) and nd's device. Pops with pop_beside.
static void push_beside(dg_graph *g, const dg_node *nd, bool colocate) {
    if (!colocate) return;
    const char *dev = forward_device(g, nd);
    dg_graph_push_device(g, "");
    if (dev[0]) dg_graph_push_device(g, dev);
}

static void pop_beside(dg_graph *g, const dg_node *nd, bool colocate) {
    if (!colocate) return;
    if (forward_device(g, nd)[0]) dg_graph_pop_device(g);
    dg_graph_pop_device(g);
}

// The gradient of a LocalAllReduce group (every member outputs the sum, or mean, of every
// member's input): each input's gradient is the same reduction of every member's output
// gradient, one LocalAllReduce group on the members' devices (a member no gradient reaches
// gives zeros). Built once, when the first member is met (all members' consumers are newer
// than every member, so their gradients are complete); group_dx[member id] keeps the answers,
// and each member's contributions are replaced by their sum, so it is not built twice.
static bool local_all_reduce_grad(dg_graph *g, dg_node *nd, contrib **grads, dg_output *group_dx,
                                  const unsigned char *mark, const int *ring) {
    if (group_dx[nd->id].node) return true;
    int64_t size = 0;
    dg_node_attr_int(nd, "num_devices", &size);
    const char *red = dg_node_attr_string(nd, "reduction");
    if (ring[nd->id] < 0 || size < 1 || size > 4096) {
        graph_node_error(g, nd, DG_INTERNAL, "a LocalAllReduce without its group");
        return false;
    }
    dg_node **members = calloc((size_t)size, sizeof *members);
    dg_output *dys = calloc((size_t)size, sizeof *dys), *outs = calloc((size_t)size, sizeof *outs);
    const char **devs = calloc((size_t)size, sizeof *devs);
    if (!members || !dys || !outs || !devs) abort();
    int id = nd->id;
    do {
        dg_node *m = dg_graph_node(g, id);
        int64_t rank;
        if (dg_node_attr_int(m, "rank", &rank) && rank >= 0 && rank < size) members[rank] = m;
        id = ring[id];
    } while (id != nd->id);
    bool ok = true;
    for (int64_t r = 0; r < size && ok; r++) {
        dg_node *m = members[r];
        if (!m) {
            graph_node_error(g, nd, DG_INTERNAL, "rank %lld of its LocalAllReduce group is not in the graph",
                             (long long)r);
            ok = false;
            break;
        }
        devs[r] = m->requested_device;
        contrib *c = grads[m->id];
        dys[r] = c ? aggregate(g, c) : NUL;
        if (c && c->n > 1) {   // its own turn finds the sum
            c->items[0] = dys[r];
            c->n = 1;
        }
        if (!dys[r].node) {
            dg_graph_push_device(g, "");
            dg_graph_push_device(g, devs[r]);
            dys[r] = dg_zeros_like(g, NULL, (dg_output){m, 0});
            dg_graph_pop_device(g);
            dg_graph_pop_device(g);
        }
    }
    if (ok) {
        dg_graph_push_device(g, "");
        ok = graph_local_all_reduce(g, "LocalAllReduceGrad", dys, devs, (int)size, red && strcmp(red, "mean") == 0,
                                    outs);
        dg_graph_pop_device(g);
        for (int64_t r = 0; ok && r < size; r++) {
            group_dx[members[r]->id] = outs[r];
            // Every member's input gets its gradient now: a member whose own output no
            // gradient reaches is never visited.
            dg_output in = members[r]->inputs[0];
            if ((mark[in.node->id] & 3) != 3 || !graph_dtype_differentiable(dg_output_dtype(in))) continue;
            if (!grads[in.node->id]) {
                grads[in.node->id] = calloc((size_t)in.node->n_outputs, sizeof(contrib));
                if (!grads[in.node->id]) abort();
            }
            add_contrib(&grads[in.node->id][in.index], outs[r]);
        }
    }
    free(members);
    free(dys);
    free(outs);
    free(devs);
    return ok && dg_graph_ok(g);
}

bool dg_gradients(dg_graph *g, const dg_output *ys, int n_ys, const dg_output *xs, int n_xs,
                  const dg_output *grad_ys, dg_output *dx) {
    return dg_gradients_ex(g, ys, n_ys, xs, n_xs, grad_ys, NULL, dx);
}

bool dg_gradients_ex(dg_graph *g, const dg_output *ys, int n_ys, const dg_output *xs, int n_xs,
                     const dg_output *grad_ys, const dg_gradients_options *opts, dg_output *dx) {
    bool colocate = opts && opts->colocate_gradients_with_ops;
    for (int i = 0; i < n_xs; i++) dx[i] = NUL;
    if (!dg_graph_ok(g)) return false;
    for (int i = 0; i < n_ys; i++)
        if (!ys[i].node) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gradients: y %d is the null output", i);
            return false;
        }
    for (int i = 0; i < n_xs; i++)
        if (!xs[i].node) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "gradients: x %d is the null output", i);
            return false;
        }
    int n_nodes = dg_graph_num_nodes(g);
    // Nodes are created after their data inputs, so ids order the graph topologically.
    unsigned char *mark = calloc((size_t)n_nodes, 1);   // 1: from xs, 2: to ys
    contrib **grads = calloc((size_t)n_nodes, sizeof *grads);
    dg_output *group_dx = calloc((size_t)n_nodes + 1, sizeof *group_dx);   // LocalAllReduce members'
    if (!mark || !grads || !group_dx) abort();
    int lo = n_nodes;
    for (int i = 0; i < n_xs; i++) {
        mark[xs[i].node->id] |= 1;
        if (xs[i].node->id < lo) lo = xs[i].node->id;
    }
    // The members of each LocalAllReduce group, linked in a ring (lar_next; -1: not a member):
    // every member's output depends on every member's input.
    int *lar_next = malloc(((size_t)n_nodes + 1) * sizeof *lar_next);
    if (!lar_next) abort();
    graph_local_all_reduce_rings(g, n_nodes, lar_next);
    for (int id = lo; id < n_nodes; id++) {
        dg_node *nd = dg_graph_node(g, id);
        if (mark[id] & 1) continue;
        for (int k = 0; k < nd->n_inputs; k++)
            if (mark[nd->inputs[k].node->id] & 1) {
                mark[id] |= 1;
                break;
            }
        if ((mark[id] & 1) && lar_next[id] >= 0)
            for (int m = lar_next[id]; m != id; m = lar_next[m]) mark[m] |= 1;
    }
    int hi = -1;
    for (int i = 0; i < n_ys; i++) {
        mark[ys[i].node->id] |= 2;
        if (ys[i].node->id > hi) hi = ys[i].node->id;
    }
    for (int id = hi; id >= 0; id--) {
        if (!(mark[id] & 2)) continue;
        dg_node *nd = dg_graph_node(g, id);
        for (int k = 0; k < nd->n_inputs; k++) mark[nd->inputs[k].node->id] |= 2;
        if (lar_next[id] >= 0)
            for (int m = lar_next[id]; m != id; m = lar_next[m]) {
                mark[m] |= 2;
                dg_node *mn = dg_graph_node(g, m);
                for (int k = 0; k < mn->n_inputs; k++) mark[mn->inputs[k].node->id] |= 2;
            }
    }

    // The mixed-precision rewrite's nodes have no float32 gradients to give: gradients are
    // built before it, as TensorFlow's grappler pass sees them.
    for (int id = 0; id < n_nodes; id++)
        if (mark[id] == 3 && dg_graph_node(g, id)->mixed != GRAPH_MIXED_NONE &&
            dg_graph_node(g, id)->mixed != GRAPH_MIXED_DENY) {
            dg_graph_set_error(g, DG_FAILED_PRECONDITION, "gradients: \"%s\" on the path was converted by the "
                               "mixed-precision rewrite; build gradients and updates before the rewrite (before "
                               "the session that applies it is made)", dg_graph_node(g, id)->name);
            free(mark);
            free(grads);
            free(group_dx);
            free(lar_next);
            return false;
        }
    bool ok = true;
    dg_graph_push_name_scope(g, "gradients");
    for (int i = 0; i < n_ys; i++) {
        dg_node *yn = ys[i].node;
        if (!grads[yn->id]) {
            grads[yn->id] = calloc((size_t)yn->n_outputs, sizeof(contrib));
            if (!grads[yn->id]) abort();
        }
        dg_output seed = grad_ys && grad_ys[i].node ? grad_ys[i] : NUL;
        if (!seed.node) {
            push_beside(g, yn, colocate);
            seed = dg_ones_like(g, NULL, ys[i]);
            pop_beside(g, yn, colocate);
        }
        add_contrib(&grads[yn->id][ys[i].index], seed);
    }
    dg_output *dy = NULL, *dxs = NULL;
    for (int id = hi; id >= 0 && ok; id--) {
        if (mark[id] != 3 || !grads[id]) continue;
        dg_node *nd = dg_graph_node(g, id);
        dy = realloc(dy, (size_t)(nd->n_outputs ? nd->n_outputs : 1) * sizeof *dy);
        if (!dy) abort();
        bool any = false;
        char scope[600];
        snprintf(scope, sizeof scope, "%s_grad", nd->name);
        dg_graph_push_name_scope(g, scope);
        push_beside(g, nd, colocate);
        for (int o = 0; o < nd->n_outputs; o++) {
            contrib *c = &grads[id][o];
            dy[o] = aggregate(g, c);
            any |= c->n > 0;
        }
        // The aggregated gradient of an x is its answer (x may also feed other xs).
        for (int i = 0; i < n_xs; i++)
            if (xs[i].node == nd) dx[i] = dy[xs[i].index];
        bool has_float_input = false;
        for (int k = 0; k < nd->n_inputs; k++)
            if ((mark[nd->inputs[k].node->id] & 3) == 3 && graph_dtype_differentiable(dg_output_dtype(nd->inputs[k])))
                has_float_input = true;
        bool group = strcmp(nd->op->name, "LocalAllReduce") == 0;
        if (any && group) {
            ok = local_all_reduce_grad(g, nd, grads, group_dx, mark, lar_next);
        } else if (any && has_float_input) {
            if (!nd->op->grad) {
                if (!nd->op->no_gradient)
                    graph_node_error(g, nd, DG_INVALID_ARGUMENT,
                                     "no gradient is defined for op type %s, which lies between "
                                     "the ys and the xs", nd->op->name);
                ok = nd->op->no_gradient;
            } else {
                dxs = realloc(dxs, (size_t)(nd->n_inputs ? nd->n_inputs : 1) * sizeof *dxs);
                if (!dxs) abort();
                for (int k = 0; k < nd->n_inputs; k++) dxs[k] = NUL;
                ok = nd->op->grad(g, nd, dy, dxs) && dg_graph_ok(g);
                for (int k = 0; k < nd->n_inputs && ok; k++) {
                    dg_output src = nd->inputs[k];
                    if (!dxs[k].node || (mark[src.node->id] & 3) != 3) continue;
                    if (!graph_dtype_differentiable(dg_output_dtype(src))) continue;
                    if (!grads[src.node->id]) {
                        grads[src.node->id] = calloc((size_t)src.node->n_outputs, sizeof(contrib));
                        if (!grads[src.node->id]) abort();
                    }
                    add_contrib(&grads[src.node->id][src.index], dxs[k]);
                }
            }
        }
        pop_beside(g, nd, colocate);
        dg_graph_pop_name_scope(g);
    }
    dg_graph_pop_name_scope(g);
    free(dy);
    free(dxs);
    for (int id = 0; id < n_nodes; id++) {
        if (!grads[id]) continue;
        dg_node *nd = dg_graph_node(g, id);
        for (int o = 0; o < nd->n_outputs; o++) free(grads[id][o].items);
        free(grads[id]);
    }
    free(grads);
    free(group_dx);
    free(lar_next);
    free(mark);
    return ok && dg_graph_ok(g);
}
