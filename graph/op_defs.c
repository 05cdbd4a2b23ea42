/* Op definitions: arity, statefulness, shape inference and gradient function of every op
 * type. Shape inference runs when a node is built, so errors name the node at build time. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_impl.h"
#include "graph_impl.h"

static dg_dtype in_dt(const dg_node *n, int i) { return dg_output_dtype(n->inputs[i]); }
static dg_shape in_sh(const dg_node *n, int i) { return dg_output_shape(n->inputs[i]); }

static bool out1(dg_node *n, dg_dtype dt, dg_shape sh, dg_status *st) {
    graph_set_num_outputs(n, 1, st);
    graph_set_output(n, 0, dt, sh);
    return true;
}

// Ops whose CPU kernels compute in bfloat16 and float16 too (executor/cpu/kernels_16.c: each
// input widened to float32, the float32 kernel, each output rounded once), besides MatMul,
// which has 16-bit kernels of its own. The mixed-precision rewrite's infer list draws on them.
static const char *const ops_16[] = {"Add", "Sub", "Mul", "Maximum", "Minimum", "Neg", "AddN", "BiasAdd",
                                     "Relu", "ReluGrad", "Sigmoid", "SigmoidGrad", "Tanh", "TanhGrad",
                                     "Gelu", "GeluGrad", "Conv2DBackpropFilter", "ScaledDotProductAttention",
                                     "ScaledDotProductAttentionGrad", "LayerNorm", "LayerNormGrad", "SumToShape"};

int graph_ops_16(const char *const **names) {
    *names = ops_16;
    return (int)(sizeof ops_16 / sizeof ops_16[0]);
}

bool graph_op_computes_16(const char *op) {
    for (size_t i = 0; i < sizeof ops_16 / sizeof ops_16[0]; i++)
        if (strcmp(ops_16[i], op) == 0) return true;
    return false;
}

static bool takes_16(const dg_node *n, int i) {
    return dg_dtype_is_float16_family(in_dt(n, i)) && graph_op_computes_16(n->op->name);
}

static bool need_float(const dg_node *n, int i, dg_status *st) {
    if (dg_dtype_is_float(in_dt(n, i)) || takes_16(n, i)) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be float32 or float64, got %s",
                   i, n->inputs[i].node->name, dg_dtype_name(in_dt(n, i)));
    return false;
}

// float32, float64 or a 16-bit float: ops with kernels for all of them (MatMul).
static bool need_float_or_16(const dg_node *n, int i, dg_status *st) {
    if (dg_dtype_is_float(in_dt(n, i)) || dg_dtype_is_float16_family(in_dt(n, i))) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be float32, float64, bfloat16 or float16, got %s",
                   i, n->inputs[i].node->name, dg_dtype_name(in_dt(n, i)));
    return false;
}

static bool need_numeric(const dg_node *n, int i, dg_status *st) {
    dg_dtype t = in_dt(n, i);
    if (t == DG_FLOAT32 || t == DG_FLOAT64 || t == DG_INT32 || t == DG_INT64 || takes_16(n, i)) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be numeric, got %s", i,
                   n->inputs[i].node->name, dg_dtype_name(t));
    return false;
}

static bool need_int(const dg_node *n, int i, dg_status *st) {
    dg_dtype t = in_dt(n, i);
    if (t == DG_INT32 || t == DG_INT64) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be int32 or int64, got %s", i,
                   n->inputs[i].node->name, dg_dtype_name(t));
    return false;
}

static bool same_dtype(const dg_node *n, int a, int b, dg_status *st) {
    if (in_dt(n, a) == in_dt(n, b)) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "inputs %d and %d must have the same dtype, got %s and %s",
                   a, b, dg_dtype_name(in_dt(n, a)), dg_dtype_name(in_dt(n, b)));
    return false;
}

static bool need_rank(const dg_node *n, int i, int rank, dg_status *st) {
    dg_shape s = in_sh(n, i);
    if (s.rank < 0 || s.rank == rank) return true;
    char b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must have rank %d, got shape %s", i,
                   n->inputs[i].node->name, rank, dg_shape_str(&s, b, sizeof b));
    return false;
}

// NumPy broadcasting of two static shapes, unknown dims allowed.
bool graph_broadcast_shapes(dg_shape a, dg_shape b, dg_shape *out, dg_status *st) {
    if (a.rank < 0 || b.rank < 0) {
        *out = dg_shape_unknown();
        return true;
    }
    int r = a.rank > b.rank ? a.rank : b.rank;
    dg_shape o = dg_shape_scalar();
    o.rank = r;
    for (int i = 0; i < r; i++) {
        int ia = i - (r - a.rank), ib = i - (r - b.rank);
        int64_t da = ia >= 0 ? a.dims[ia] : 1, db = ib >= 0 ? b.dims[ib] : 1;
        int64_t d;
        if (da == 1) d = db;
        else if (db == 1) d = da;
        else if (da < 0) d = db >= 0 ? db : -1;
        else if (db < 0) d = da;
        else if (da == db) d = da;
        else {
            char x[128], y[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT, "incompatible shapes for broadcasting: %s and %s",
                           dg_shape_str(&a, x, sizeof x), dg_shape_str(&b, y, sizeof y));
            return false;
        }
        o.dims[i] = d;
    }
    *out = o;
    return true;
}

// ---- inference functions ----
static bool infer_const(dg_node *n, dg_status *st) {
    const graph_attr *a = graph_node_attr(n, "value");
    if (!a || a->kind != GA_TENSOR) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Const needs a \"value\" tensor attribute");
        return false;
    }
    return out1(n, a->u.t->dtype, a->u.t->shape, st);
}

static bool attr_dtype_shape(dg_node *n, const char *what, dg_dtype *dt, dg_shape *sh, dg_status *st) {
    if (!dg_node_attr_type(n, "dtype", dt) || !dg_dtype_is_valid(*dt)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s needs a valid \"dtype\" attribute", what);
        return false;
    }
    if (!dg_node_attr_shape(n, "shape", sh)) *sh = dg_shape_unknown();
    return true;
}

static bool infer_placeholder(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    return attr_dtype_shape(n, "Placeholder", &dt, &sh, st) && out1(n, dt, sh, st);
}

static bool infer_variable(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    if (!attr_dtype_shape(n, "VariableV2", &dt, &sh, st)) return false;
    if (!dg_shape_is_fully_defined(&sh)) {
        char b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "variable shape must be fully defined, got %s",
                       dg_shape_str(&sh, b, sizeof b));
        return false;
    }
    return out1(n, dt, sh, st);
}

static bool infer_random(dg_node *n, dg_status *st) {
    dg_dtype dt;
    dg_shape sh;
    if (!attr_dtype_shape(n, "random op", &dt, &sh, st)) return false;
    if (!dg_dtype_is_float(dt) || !dg_shape_is_fully_defined(&sh)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "random ops need a float dtype and a fully defined shape");
        return false;
    }
    return out1(n, dt, sh, st);
}

static bool infer_assign(dg_node *n, dg_status *st) {
    if (!same_dtype(n, 0, 1, st)) return false;
    dg_shape v = in_sh(n, 0), x = in_sh(n, 1);
    bool is_assign = strcmp(n->op->name, "Assign") == 0;
    if (!dg_shape_compatible(&v, &x)) {
        char a[128], b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "variable \"%s\" has shape %s, value has shape %s",
                       n->inputs[0].node->name, dg_shape_str(&v, a, sizeof a),
                       dg_shape_str(&x, b, sizeof b));
        return false;
    }
    if (!is_assign && !need_numeric(n, 0, st)) return false;
    return out1(n, in_dt(n, 0), v, st);
}

static bool infer_is_init(dg_node *n, dg_status *st) {
    return out1(n, DG_BOOL, dg_shape_scalar(), st);
}

static bool infer_identity(dg_node *n, dg_status *st) {
    return out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_noop(dg_node *n, dg_status *st) { return graph_set_num_outputs(n, 0, st); }

static bool infer_unary_float(dg_node *n, dg_status *st) {
    return need_float(n, 0, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_unary_numeric(dg_node *n, dg_status *st) {
    return need_numeric(n, 0, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_binary(dg_node *n, dg_status *st) {
    dg_shape o;
    if (!need_numeric(n, 0, st) || !same_dtype(n, 0, 1, st)) return false;
    if (!graph_broadcast_shapes(in_sh(n, 0), in_sh(n, 1), &o, st)) return false;
    return out1(n, in_dt(n, 0), o, st);
}

static bool infer_compare(dg_node *n, dg_status *st) {
    dg_shape o;
    if (!same_dtype(n, 0, 1, st)) return false;
    if (!graph_broadcast_shapes(in_sh(n, 0), in_sh(n, 1), &o, st)) return false;
    return out1(n, DG_BOOL, o, st);
}

// Gradient helpers like ReluGrad(dy, x): two float inputs of one shape.
static bool infer_grad2(dg_node *n, dg_status *st) {
    if (!need_float(n, 0, st) || !same_dtype(n, 0, 1, st)) return false;
    dg_shape a = in_sh(n, 0), b = in_sh(n, 1);
    if (!dg_shape_compatible(&a, &b)) {
        char x[128], y[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "inputs must have one shape, got %s and %s",
                       dg_shape_str(&a, x, sizeof x), dg_shape_str(&b, y, sizeof y));
        return false;
    }
    return out1(n, in_dt(n, 0), a.rank >= 0 ? a : b, st);
}

static bool infer_addn(dg_node *n, dg_status *st) {
    dg_shape s = in_sh(n, 0);
    if (!need_numeric(n, 0, st)) return false;
    for (int i = 1; i < n->n_inputs; i++) {
        dg_shape si = in_sh(n, i);
        if (!same_dtype(n, 0, i, st)) return false;
        if (!dg_shape_compatible(&s, &si)) {
            char x[128], y[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d has shape %s, input 0 has %s", i,
                           dg_shape_str(&si, x, sizeof x), dg_shape_str(&s, y, sizeof y));
            return false;
        }
        if (s.rank < 0) s = si;
    }
    return out1(n, in_dt(n, 0), s, st);
}

static bool infer_matmul(dg_node *n, dg_status *st) {
    if (!need_float_or_16(n, 0, st) || !same_dtype(n, 0, 1, st)) return false;
    if (!need_rank(n, 0, 2, st) || !need_rank(n, 1, 2, st)) return false;
    bool ta = false, tb = false;
    dg_node_attr_bool(n, "transpose_a", &ta);
    dg_node_attr_bool(n, "transpose_b", &tb);
    dg_shape a = in_sh(n, 0), b = in_sh(n, 1);
    int64_t m = -1, ka = -1, kb = -1, nn = -1;
    if (a.rank == 2) {
        m = ta ? a.dims[1] : a.dims[0];
        ka = ta ? a.dims[0] : a.dims[1];
    }
    if (b.rank == 2) {
        kb = tb ? b.dims[1] : b.dims[0];
        nn = tb ? b.dims[0] : b.dims[1];
    }
    if (ka >= 0 && kb >= 0 && ka != kb) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "inner dimensions differ, %lld vs %lld "
                       "(\"%s\" and \"%s\")", (long long)ka, (long long)kb,
                       n->inputs[0].node->name, n->inputs[1].node->name);
        return false;
    }
    return out1(n, in_dt(n, 0), dg_shape2(m, nn), st);
}

static bool infer_bias_add(dg_node *n, dg_status *st) {
    if (!need_float(n, 0, st) || !same_dtype(n, 0, 1, st) || !need_rank(n, 1, 1, st)) return false;
    dg_shape v = in_sh(n, 0), b = in_sh(n, 1);
    if (v.rank == 0 || (v.rank > 0 && b.rank == 1 && v.dims[v.rank - 1] >= 0 && b.dims[0] >= 0 &&
                        v.dims[v.rank - 1] != b.dims[0])) {
        char x[128], y[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "bias %s does not match the last dimension of %s",
                       dg_shape_str(&b, x, sizeof x), dg_shape_str(&v, y, sizeof y));
        return false;
    }
    return out1(n, in_dt(n, 0), v, st);
}

static bool infer_bias_add_grad(dg_node *n, dg_status *st) {
    dg_shape v = in_sh(n, 0);
    if (!need_float(n, 0, st)) return false;
    if (v.rank == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "BiasAddGrad needs rank >= 1");
        return false;
    }
    return out1(n, in_dt(n, 0), dg_shape1(v.rank > 0 ? v.dims[v.rank - 1] : -1), st);
}

static bool infer_clip(dg_node *n, dg_status *st) {
    dg_shape o;
    if (!need_float(n, 0, st) || !same_dtype(n, 0, 1, st) || !same_dtype(n, 0, 2, st)) return false;
    if (!graph_broadcast_shapes(in_sh(n, 0), in_sh(n, 1), &o, st) ||
        !graph_broadcast_shapes(o, in_sh(n, 2), &o, st))
        return false;
    dg_shape x = in_sh(n, 0);
    if (x.rank >= 0 && o.rank >= 0 && !dg_shape_equal(&o, &x) && dg_shape_is_fully_defined(&x)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "clip bounds must broadcast to the shape of x");
        return false;
    }
    return out1(n, in_dt(n, 0), x, st);
}

static bool infer_clip_grad(dg_node *n, dg_status *st) {
    // (dy, x, lo, hi) -> dx, dlo (x-shaped), dhi (x-shaped)
    graph_set_num_outputs(n, 3, st);
    for (int i = 0; i < 3; i++) graph_set_output(n, i, in_dt(n, 0), in_sh(n, 1));
    return true;
}

static bool infer_softmax(dg_node *n, dg_status *st) {
    dg_shape s = in_sh(n, 0);
    if (!need_float(n, 0, st)) return false;
    if (s.rank == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "softmax needs rank >= 1, got a scalar");
        return false;
    }
    return out1(n, in_dt(n, 0), s, st);
}

static bool infer_xent(dg_node *n, dg_status *st) {
    bool sparse = strcmp(n->op->name, "SparseSoftmaxCrossEntropyWithLogits") == 0;
    if (!need_float(n, 0, st) || !need_rank(n, 0, 2, st)) return false;
    dg_shape l = in_sh(n, 0), y = in_sh(n, 1);
    char a[128], b[128];
    if (sparse) {
        if (!need_int(n, 1, st) || !need_rank(n, 1, 1, st)) return false;
        if (l.rank == 2 && y.rank == 1 && l.dims[0] >= 0 && y.dims[0] >= 0 && l.dims[0] != y.dims[0]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "logits %s and labels %s disagree on the batch size",
                           dg_shape_str(&l, a, sizeof a), dg_shape_str(&y, b, sizeof b));
            return false;
        }
    } else {
        if (!same_dtype(n, 0, 1, st) || !dg_shape_compatible(&l, &y)) {
            if (dg_status_ok(st))
                dg_status_setf(st, DG_INVALID_ARGUMENT, "logits %s and labels %s must have one shape",
                               dg_shape_str(&l, a, sizeof a), dg_shape_str(&y, b, sizeof b));
            return false;
        }
    }
    int64_t batch = l.rank == 2 ? l.dims[0] : (y.rank >= 1 ? y.dims[0] : -1);
    graph_set_num_outputs(n, 2, st);
    graph_set_output(n, 0, in_dt(n, 0), dg_shape1(batch));
    graph_set_output(n, 1, in_dt(n, 0), l.rank == 2 ? l : dg_shape2(batch, -1));
    return true;
}

// Normalises the "axes" attr of a reduction against rank r into a bitmask.
bool graph_reduction_mask(const dg_node *n, int r, uint32_t *mask, dg_status *st) {
    int count;
    const int64_t *axes = graph_node_attr_ints(n, "axes", &count);
    *mask = 0;
    if (!axes || count == 0) {
        *mask = r >= 0 ? (uint32_t)((1u << r) - 1) : 0xFFFFFFFFu;
        return true;
    }
    for (int i = 0; i < count; i++) {
        int64_t a = axes[i];
        if (r >= 0 && (a < -r || a >= r)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "axis %lld is out of range for rank %d",
                           (long long)a, r);
            return false;
        }
        if (r < 0) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "reduction over given axes needs a known rank");
            return false;
        }
        *mask |= 1u << (a < 0 ? a + r : a);
    }
    return true;
}

static bool infer_reduce(dg_node *n, dg_status *st) {
    dg_shape x = in_sh(n, 0);
    if (!need_numeric(n, 0, st)) return false;
    bool keep = false;
    dg_node_attr_bool(n, "keep_dims", &keep);
    uint32_t mask;
    if (!graph_reduction_mask(n, x.rank, &mask, st)) return false;
    if (x.rank < 0) return out1(n, in_dt(n, 0), dg_shape_unknown(), st);
    dg_shape o = dg_shape_scalar();
    for (int i = 0; i < x.rank; i++) {
        if (mask & (1u << i)) {
            if (keep) o.dims[o.rank++] = 1;
        } else {
            o.dims[o.rank++] = x.dims[i];
        }
    }
    return out1(n, in_dt(n, 0), o, st);
}

static bool infer_argmax(dg_node *n, dg_status *st) {
    dg_shape x = in_sh(n, 0);
    int64_t axis = 0;
    if (!need_numeric(n, 0, st)) return false;
    dg_node_attr_int(n, "axis", &axis);
    if (x.rank < 0) return out1(n, DG_INT64, dg_shape_unknown(), st);
    if (axis < -x.rank || axis >= x.rank || x.rank == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "axis %lld is out of range for rank %d",
                       (long long)axis, x.rank);
        return false;
    }
    if (axis < 0) axis += x.rank;
    dg_shape o = dg_shape_scalar();
    for (int i = 0; i < x.rank; i++)
        if (i != axis) o.dims[o.rank++] = x.dims[i];
    return out1(n, DG_INT64, o, st);
}

static bool infer_cast(dg_node *n, dg_status *st) {
    dg_dtype to;
    if (!dg_node_attr_type(n, "DstT", &to) || !dg_dtype_is_valid(to)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Cast needs a valid \"DstT\" attribute");
        return false;
    }
    return out1(n, to, in_sh(n, 0), st);
}

// A shape from a constant int vector input, if it is a Const; else unknown of rank len.
static dg_shape shape_from_input(const dg_node *n, int i) {
    dg_output in = n->inputs[i];
    dg_shape s = dg_output_shape(in);
    const dg_tensor *t = dg_node_const_value(in.node);
    if (t && t->shape.rank == 1 && t->n_elements <= DG_MAX_RANK) {
        int64_t d[DG_MAX_RANK];
        for (int k = 0; k < t->n_elements; k++)
            d[k] = t->dtype == DG_INT64 ? ((const int64_t *)t->data)[k]
                   : t->dtype == DG_INT32 ? ((const int32_t *)t->data)[k] : -1;
        return dg_shape_make((int)t->n_elements, d);
    }
    if (s.rank == 1 && s.dims[0] >= 0 && s.dims[0] <= DG_MAX_RANK) {
        dg_shape o = dg_shape_scalar();
        o.rank = (int)s.dims[0];
        for (int k = 0; k < o.rank; k++) o.dims[k] = -1;
        // The Shape op of a known-shape tensor gives its shape statically.
        if (strcmp(in.node->op->name, "Shape") == 0) return dg_output_shape(in.node->inputs[0]);
        return o;
    }
    if (strcmp(in.node->op->name, "Shape") == 0) return dg_output_shape(in.node->inputs[0]);
    return dg_shape_unknown();
}

static bool infer_reshape(dg_node *n, dg_status *st) {
    if (!need_int(n, 1, st) || !need_rank(n, 1, 1, st)) return false;
    dg_shape x = in_sh(n, 0), t = shape_from_input(n, 1);
    if (t.rank > DG_MAX_RANK) t = dg_shape_unknown();
    const dg_tensor *cv = dg_node_const_value(n->inputs[1].node);
    if (cv && t.rank >= 0) {
        // -1 marks one dimension to infer.
        int unknown = -1;
        int64_t prod = 1;
        for (int i = 0; i < t.rank; i++) {
            int64_t d = cv->dtype == DG_INT64 ? ((const int64_t *)cv->data)[i]
                        : cv->dtype == DG_INT32 ? ((const int32_t *)cv->data)[i] : -2;
            if (d == -1) {
                if (unknown >= 0) {
                    dg_status_set(st, DG_INVALID_ARGUMENT, "reshape: only one dimension may be -1");
                    return false;
                }
                unknown = i;
            } else if (d < 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "reshape: dimension %d is %lld", i, (long long)d);
                return false;
            } else if (d != 0 && prod > INT64_MAX / d) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "reshape: the dimensions overflow");
                return false;
            } else {
                prod *= d;
            }
        }
        int64_t nx = dg_shape_num_elements(&x);
        if (nx >= 0) {
            char a[128], b[128];
            if (unknown >= 0 && prod > 0 && nx % prod == 0) t.dims[unknown] = nx / prod;
            else if ((unknown >= 0 && (prod == 0 || nx % prod != 0)) || (unknown < 0 && prod != nx)) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "cannot reshape %s (%lld elements) to %s",
                               dg_shape_str(&x, a, sizeof a), (long long)nx, dg_shape_str(&t, b, sizeof b));
                return false;
            }
        }
    }
    return out1(n, in_dt(n, 0), t, st);
}

static bool infer_shape(dg_node *n, dg_status *st) {
    dg_shape x = in_sh(n, 0);
    return out1(n, DG_INT64, dg_shape1(x.rank >= 0 ? x.rank : -1), st);
}

static bool infer_fill(dg_node *n, dg_status *st) {
    if (!need_int(n, 0, st) || !need_rank(n, 0, 1, st)) return false;
    if (in_sh(n, 1).rank > 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Fill value must be a scalar");
        return false;
    }
    return out1(n, in_dt(n, 1), shape_from_input(n, 0), st);
}

static bool infer_shape_to(dg_node *n, dg_status *st) {
    // (x, shape) -> x's dtype with the given shape: BroadcastTo, SumToShape, SumGrad, SliceGrad
    if (!need_int(n, 1, st) || !need_rank(n, 1, 1, st)) return false;
    return out1(n, in_dt(n, 0), shape_from_input(n, 1), st);
}

static bool infer_max_grad(dg_node *n, dg_status *st) {
    return out1(n, in_dt(n, 1), in_sh(n, 1), st);   // (dy, x, y) -> like x
}

static bool infer_concat(dg_node *n, dg_status *st) {
    int64_t axis = 0;
    dg_node_attr_int(n, "axis", &axis);
    dg_shape s = in_sh(n, 0);
    if (s.rank < 0) return out1(n, in_dt(n, 0), s, st);
    if (axis < -s.rank || axis >= s.rank) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "axis %lld is out of range for rank %d",
                       (long long)axis, s.rank);
        return false;
    }
    if (axis < 0) axis += s.rank;
    dg_shape o = s;
    for (int i = 1; i < n->n_inputs; i++) {
        dg_shape si = in_sh(n, i);
        if (!same_dtype(n, 0, i, st)) return false;
        char a[128], b[128];
        if (si.rank != s.rank) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d has shape %s, input 0 has %s", i,
                           dg_shape_str(&si, a, sizeof a), dg_shape_str(&s, b, sizeof b));
            return false;
        }
        for (int d = 0; d < s.rank; d++) {
            if (d == axis) {
                o.dims[d] = (o.dims[d] < 0 || si.dims[d] < 0) ? -1 : o.dims[d] + si.dims[d];
            } else if (o.dims[d] >= 0 && si.dims[d] >= 0 && o.dims[d] != si.dims[d]) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "input %d has shape %s, input 0 has %s: dimension %d differs", i,
                               dg_shape_str(&si, a, sizeof a), dg_shape_str(&s, b, sizeof b), d);
                return false;
            } else if (o.dims[d] < 0) {
                o.dims[d] = si.dims[d];
            }
        }
    }
    return out1(n, in_dt(n, 0), o, st);
}

static bool infer_split(dg_node *n, dg_status *st) {
    int64_t axis = 0, k = 0;
    dg_node_attr_int(n, "axis", &axis);
    dg_node_attr_int(n, "num_split", &k);
    dg_shape s = in_sh(n, 0);
    if (k < 1 || k > 65536) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "num_split must be in 1..65536, got %lld", (long long)k);
        return false;
    }
    if (s.rank >= 0 && (axis < -s.rank || axis >= s.rank)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "axis %lld is out of range for rank %d",
                       (long long)axis, s.rank);
        return false;
    }
    if (s.rank >= 0) {
        if (axis < 0) axis += s.rank;
        if (s.dims[axis] >= 0) {
            if (s.dims[axis] % k != 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "dimension %lld (size %lld) does not split "
                               "into %lld equal parts", (long long)axis, (long long)s.dims[axis], (long long)k);
                return false;
            }
            s.dims[axis] /= k;
        }
    }
    graph_set_num_outputs(n, (int)k, st);
    for (int i = 0; i < k; i++) graph_set_output(n, i, in_dt(n, 0), s);
    return true;
}

static bool infer_slice(dg_node *n, dg_status *st) {
    dg_shape s = in_sh(n, 0);
    int nb, ns;
    const int64_t *begin = graph_node_attr_ints(n, "begin", &nb);
    const int64_t *size = graph_node_attr_ints(n, "size", &ns);
    if (nb != ns || nb > DG_MAX_RANK || (s.rank >= 0 && nb != s.rank)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "slice: begin has %d entries, size %d, input rank %d",
                       nb, ns, s.rank);
        return false;
    }
    dg_shape o = dg_shape_scalar();
    o.rank = nb;
    for (int i = 0; i < nb; i++) {
        int64_t d = s.rank >= 0 ? s.dims[i] : -1;
        if (begin[i] < 0 || size[i] < -1 || (d >= 0 && (begin[i] > d || (size[i] >= 0 && begin[i] + size[i] > d)))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "slice: axis %d: begin %lld size %lld out of range "
                           "for dimension %lld", i, (long long)begin[i], (long long)size[i], (long long)d);
            return false;
        }
        o.dims[i] = size[i] >= 0 ? size[i] : (d >= 0 ? d - begin[i] : -1);
    }
    return out1(n, in_dt(n, 0), o, st);
}

static bool var_input(const dg_node *n, int i, dg_status *st) {
    if (strcmp(n->inputs[i].node->op->name, "VariableV2") == 0) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d must be a variable, got \"%s\" (%s)", i,
                   n->inputs[i].node->name, n->inputs[i].node->op->name);
    return false;
}

static bool same_shape_as_var(const dg_node *n, int i, dg_status *st) {
    dg_shape v = in_sh(n, 0), x = in_sh(n, i);
    if (dg_shape_compatible(&v, &x) && in_dt(n, i) == in_dt(n, 0)) return true;
    char a[128], b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") is %s %s, variable \"%s\" is %s %s", i,
                   n->inputs[i].node->name, dg_dtype_name(in_dt(n, i)), dg_shape_str(&x, a, sizeof a),
                   n->inputs[0].node->name, dg_dtype_name(in_dt(n, 0)), dg_shape_str(&v, b, sizeof b));
    return false;
}

static bool scalar_like_var(const dg_node *n, int i, dg_status *st) {
    dg_shape x = in_sh(n, i);
    if (in_dt(n, i) == in_dt(n, 0) && (x.rank == 0 || x.rank < 0)) return true;
    char a[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be a %s scalar, got %s %s", i,
                   n->inputs[i].node->name, dg_dtype_name(in_dt(n, 0)), dg_dtype_name(in_dt(n, i)),
                   dg_shape_str(&x, a, sizeof a));
    return false;
}

// The optional last input of ApplyGradientDescent, ApplyMomentum and ApplyAdam (input i when
// given): a bool scalar, false to leave the variable and its slots as they are this step (the
// loss scaler's skip, dg_minimize_with_loss_scale).
static bool optional_gate(const dg_node *n, int i, dg_status *st) {
    if (n->n_inputs <= i) return true;
    dg_shape s = in_sh(n, i);
    if (in_dt(n, i) == DG_BOOL && (s.rank == 0 || s.rank < 0)) return true;
    char a[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\"), whether to apply, must be a bool scalar, got %s %s", i,
                   n->inputs[i].node->name, dg_dtype_name(in_dt(n, i)), dg_shape_str(&s, a, sizeof a));
    return false;
}

static bool infer_apply_gd(dg_node *n, dg_status *st) {   // var, alpha, delta[, apply]
    return need_float(n, 0, st) && scalar_like_var(n, 1, st) && same_shape_as_var(n, 2, st) &&
           optional_gate(n, 3, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_apply_momentum(dg_node *n, dg_status *st) {   // var, accum, lr, grad, momentum[, apply]
    return need_float(n, 0, st) && var_input(n, 1, st) && same_shape_as_var(n, 1, st) &&
           scalar_like_var(n, 2, st) && same_shape_as_var(n, 3, st) && scalar_like_var(n, 4, st) &&
           optional_gate(n, 5, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_apply_adam(dg_node *n, dg_status *st) {
    // var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad[, apply]
    if (!need_float(n, 0, st) || !var_input(n, 1, st) || !var_input(n, 2, st) || !optional_gate(n, 10, st))
        return false;
    if (!same_shape_as_var(n, 1, st) || !same_shape_as_var(n, 2, st) || !same_shape_as_var(n, 9, st))
        return false;
    for (int i = 3; i <= 8; i++)
        if (!scalar_like_var(n, i, st)) return false;
    return out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_send(dg_node *n, dg_status *st) {
    if (!dg_node_attr_string(n, "tensor_name") || !dg_node_attr_string(n, "send_device") ||
        !dg_node_attr_string(n, "recv_device")) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "_Send needs tensor_name, send_device and recv_device");
        return false;
    }
    return graph_set_num_outputs(n, 0, st);
}

static bool infer_recv(dg_node *n, dg_status *st) {
    dg_dtype t;
    dg_shape sh;
    if (!dg_node_attr_type(n, "tensor_type", &t) || !dg_dtype_is_valid(t) ||
        !dg_node_attr_string(n, "tensor_name") || !dg_node_attr_string(n, "send_device") ||
        !dg_node_attr_string(n, "recv_device")) {
        dg_status_set(st, DG_INVALID_ARGUMENT,
                      "_Recv needs tensor_type, tensor_name, send_device and recv_device");
        return false;
    }
    if (!dg_node_attr_shape(n, "shape", &sh)) sh = dg_shape_unknown();
    return out1(n, t, sh, st);
}

static const graph_op_def op_defs[] = {
    GRAPH_OP("Const", 0, 0, false, false, true, infer_const, NULL),
    GRAPH_OP("Placeholder", 0, 0, false, false, true, infer_placeholder, NULL),
    GRAPH_OP("VariableV2", 0, 0, true, false, true, infer_variable, NULL),
    GRAPH_OP("Assign", 2, 2, true, true, true, infer_assign, NULL),
    GRAPH_OP("AssignAdd", 2, 2, true, true, true, infer_assign, NULL),
    GRAPH_OP("AssignSub", 2, 2, true, true, true, infer_assign, NULL),
    GRAPH_OP("IsVariableInitialized", 1, 1, true, true, true, infer_is_init, NULL),
    GRAPH_OP("RandomUniform", 0, 0, true, false, true, infer_random, NULL),
    GRAPH_OP("RandomStandardNormal", 0, 0, true, false, true, infer_random, NULL),
    GRAPH_OP("TruncatedNormal", 0, 0, true, false, true, infer_random, NULL),
    GRAPH_OP("Identity", 1, 1, false, false, false, infer_identity, grad_Identity),
    GRAPH_OP("NoOp", 0, 0, false, false, true, infer_noop, NULL),
    GRAPH_OP("MatMul", 2, 2, false, false, false, infer_matmul, grad_MatMul),
    GRAPH_OP("Add", 2, 2, false, false, false, infer_binary, grad_Add),
    GRAPH_OP("Sub", 2, 2, false, false, false, infer_binary, grad_Sub),
    GRAPH_OP("Mul", 2, 2, false, false, false, infer_binary, grad_Mul),
    GRAPH_OP("Div", 2, 2, false, false, false, infer_binary, grad_Div),
    GRAPH_OP("Maximum", 2, 2, false, false, false, infer_binary, grad_Maximum),
    GRAPH_OP("Minimum", 2, 2, false, false, false, infer_binary, grad_Minimum),
    GRAPH_OP("Pow", 2, 2, false, false, false, infer_binary, grad_Pow),
    GRAPH_OP("AddN", 1, -1, false, false, false, infer_addn, grad_AddN),
    GRAPH_OP("BiasAdd", 2, 2, false, false, false, infer_bias_add, grad_BiasAdd),
    GRAPH_OP("BiasAddGrad", 1, 1, false, false, false, infer_bias_add_grad, NULL),
    GRAPH_OP("Relu", 1, 1, false, false, false, infer_unary_float, grad_Relu),
    GRAPH_OP("ReluGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("Sigmoid", 1, 1, false, false, false, infer_unary_float, grad_Sigmoid),
    GRAPH_OP("SigmoidGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("Tanh", 1, 1, false, false, false, infer_unary_float, grad_Tanh),
    GRAPH_OP("TanhGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("Exp", 1, 1, false, false, false, infer_unary_float, grad_Exp),
    GRAPH_OP("Log", 1, 1, false, false, false, infer_unary_float, grad_Log),
    GRAPH_OP("Square", 1, 1, false, false, false, infer_unary_numeric, grad_Square),
    GRAPH_OP("Sqrt", 1, 1, false, false, false, infer_unary_float, grad_Sqrt),
    GRAPH_OP("SqrtGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("Rsqrt", 1, 1, false, false, false, infer_unary_float, grad_Rsqrt),
    GRAPH_OP("RsqrtGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("Erf", 1, 1, false, false, false, infer_unary_float, grad_Erf),
    GRAPH_OP("Sin", 1, 1, false, false, false, infer_unary_float, grad_Sin),
    GRAPH_OP("Cos", 1, 1, false, false, false, infer_unary_float, grad_Cos),
    GRAPH_OP("Gelu", 1, 1, false, false, false, infer_unary_float, grad_Gelu),
    GRAPH_OP("GeluGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("Neg", 1, 1, false, false, false, infer_unary_numeric, grad_Neg),
    GRAPH_OP("ClipByValue", 3, 3, false, false, false, infer_clip, grad_ClipByValue),
    GRAPH_OP("ClipByValueGrad", 4, 4, false, false, false, infer_clip_grad, NULL),
    GRAPH_OP("Softmax", 1, 1, false, false, false, infer_softmax, grad_Softmax),
    GRAPH_OP("SoftmaxGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("LogSoftmax", 1, 1, false, false, false, infer_softmax, grad_LogSoftmax),
    GRAPH_OP("LogSoftmaxGrad", 2, 2, false, false, false, infer_grad2, NULL),
    GRAPH_OP("SoftmaxCrossEntropyWithLogits", 2, 2, false, false, false, infer_xent,
       grad_SoftmaxCrossEntropyWithLogits),
    GRAPH_OP("SparseSoftmaxCrossEntropyWithLogits", 2, 2, false, false, false, infer_xent,
       grad_SparseSoftmaxCrossEntropyWithLogits),
    GRAPH_OP("Sum", 1, 1, false, false, false, infer_reduce, grad_Sum),
    GRAPH_OP("Mean", 1, 1, false, false, false, infer_reduce, grad_Mean),
    GRAPH_OP("Max", 1, 1, false, false, false, infer_reduce, grad_Max),
    GRAPH_OP("SumGrad", 2, 2, false, false, false, infer_shape_to, NULL),
    GRAPH_OP("MaxGrad", 3, 3, false, false, false, infer_max_grad, NULL),
    GRAPH_OP("ArgMax", 1, 1, false, false, true, infer_argmax, NULL),
    GRAPH_OP("Equal", 2, 2, false, false, true, infer_compare, NULL),
    GRAPH_OP("Greater", 2, 2, false, false, true, infer_compare, NULL),
    GRAPH_OP("GreaterEqual", 2, 2, false, false, true, infer_compare, NULL),
    GRAPH_OP("Less", 2, 2, false, false, true, infer_compare, NULL),
    GRAPH_OP("LessEqual", 2, 2, false, false, true, infer_compare, NULL),
    GRAPH_OP("Cast", 1, 1, false, false, false, infer_cast, grad_Cast),
    GRAPH_OP("Reshape", 2, 2, false, false, false, infer_reshape, grad_Reshape),
    GRAPH_OP("Shape", 1, 1, false, false, true, infer_shape, NULL),
    GRAPH_OP("Fill", 2, 2, false, false, false, infer_fill, grad_Fill),
    GRAPH_OP("ZerosLike", 1, 1, false, false, true, infer_identity, NULL),
    GRAPH_OP("OnesLike", 1, 1, false, false, true, infer_identity, NULL),
    GRAPH_OP("BroadcastTo", 2, 2, false, false, false, infer_shape_to, grad_BroadcastTo),
    GRAPH_OP("SumToShape", 2, 2, false, false, false, infer_shape_to, grad_SumToShape),
    GRAPH_OP("Concat", 1, -1, false, false, false, infer_concat, grad_Concat),
    GRAPH_OP("Split", 1, 1, false, false, false, infer_split, grad_Split),
    GRAPH_OP("Slice", 1, 1, false, false, false, infer_slice, grad_Slice),
    GRAPH_OP("SliceGrad", 2, 2, false, false, false, infer_shape_to, NULL),
    GRAPH_OP("ApplyGradientDescent", 3, 4, true, true, true, infer_apply_gd, NULL),
    GRAPH_OP("ApplyMomentum", 5, 6, true, 2, true, infer_apply_momentum, NULL),
    GRAPH_OP("ApplyAdam", 10, 11, true, 3, true, infer_apply_adam, NULL),
    GRAPH_OP("_Send", 1, 1, true, false, true, infer_send, NULL),
    GRAPH_OP("_Recv", 0, 0, true, false, true, infer_recv, NULL),
};

static graph_strmap op_index;
static pthread_once_t op_index_once = PTHREAD_ONCE_INIT;

// The core table above, then the tables kept in their own files.
typedef int (*table_fn)(const graph_op_def **defs);
static int core_op_defs(const graph_op_def **defs) {
    *defs = op_defs;
    return (int)(sizeof op_defs / sizeof op_defs[0]);
}
static const table_fn op_tables[] = {core_op_defs, graph_collective_op_defs, graph_sync_op_defs,
                                     graph_nn_op_defs, graph_array_op_defs, graph_sparse_op_defs,
                                     graph_transformer_op_defs};
#define N_TABLES ((int)(sizeof op_tables / sizeof op_tables[0]))

static void build_index(void) {
    for (int t = 0; t < N_TABLES; t++) {
        const graph_op_def *defs;
        int n = op_tables[t](&defs);
        for (int i = 0; i < n; i++)
            if (!graph_strmap_put(&op_index, defs[i].name, (void *)&defs[i])) abort();
    }
}

int graph_num_ref_inputs(const dg_node *n) { return n->op->ref_inputs; }

const graph_op_def *graph_op_lookup(const char *type) {
    if (!type) return NULL;
    pthread_once(&op_index_once, build_index);
    return graph_strmap_get(&op_index, type);
}

int graph_num_op_defs(void) {
    int total = 0;
    for (int t = 0; t < N_TABLES; t++) {
        const graph_op_def *defs;
        total += op_tables[t](&defs);
    }
    return total;
}

const graph_op_def *graph_op_def_at(int i) {
    if (i < 0) return NULL;
    for (int t = 0; t < N_TABLES; t++) {
        const graph_op_def *defs;
        int n = op_tables[t](&defs);
        if (i < n) return &defs[i];
        i -= n;
    }
    return NULL;
}
