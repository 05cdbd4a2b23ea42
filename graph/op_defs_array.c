/* Op definitions of the array ops a TensorFlow user reaches for first: Transpose(x, perm),
 * Tile(x, multiples), StopGradient(x), Select(cond, t, e) (tf.where with NumPy broadcasting
 * of all three, TensorFlow's SelectV2) and OneHot(indices, depth, on_value, off_value). perm,
 * multiples and depth are int32/int64 tensors, as in TensorFlow; shape inference reads them
 * when they are constants. Gradients: Transpose by the inverse permutation, Tile by summing
 * the tiles (a Reshape to [m0, d0, m1, d1, ...] and a Sum), Select by routing dy to the side
 * the condition picked; StopGradient and OneHot have none. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "grad_impl.h"

static dg_dtype in_dt(const dg_node *n, int i) { return dg_output_dtype(n->inputs[i]); }
static dg_shape in_sh(const dg_node *n, int i) { return dg_output_shape(n->inputs[i]); }
static const dg_output NULL_OUT = {NULL, 0};

static bool out1(dg_node *n, dg_dtype dt, dg_shape sh, dg_status *st) {
    if (!graph_set_num_outputs(n, 1, st)) return false;
    graph_set_output(n, 0, dt, sh);
    return true;
}

// Input i's constant int values (up to DG_MAX_RANK of them) when it is a Const; -1 when it
// is not; false with st set when it is not an int vector.
static bool const_ints(const dg_node *n, int i, const char *what, int64_t *v, int *count, dg_status *st) {
    dg_dtype t = in_dt(n, i);
    dg_shape s = in_sh(n, i);
    if ((t != DG_INT32 && t != DG_INT64) || s.rank > 1) {
        char b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (%s, \"%s\") must be an int32 or int64 vector, got %s %s", i,
                       what, n->inputs[i].node->name, dg_dtype_name(t), dg_shape_str(&s, b, sizeof b));
        return false;
    }
    *count = -1;
    const dg_tensor *cv = dg_node_const_value(n->inputs[i].node);
    if (!cv) return true;
    if (cv->n_elements > DG_MAX_RANK) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s has %lld entries (at most %d)", what, (long long)cv->n_elements,
                       DG_MAX_RANK);
        return false;
    }
    *count = (int)cv->n_elements;
    for (int k = 0; k < *count; k++) v[k] = (int64_t)dg_tensor_get_as_double(cv, k);
    return true;
}

bool graph_check_perm(const int64_t *perm, int n, int rank, dg_status *st) {
    if (rank >= 0 && n != rank) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "perm has %d entries for an input of rank %d", n, rank);
        return false;
    }
    bool seen[DG_MAX_RANK] = {false};
    for (int k = 0; k < n; k++) {
        if (perm[k] < 0 || perm[k] >= n || seen[perm[k]]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "perm is not a permutation of 0..%d (entry %d is %lld)", n - 1, k,
                           (long long)perm[k]);
            return false;
        }
        seen[perm[k]] = true;
    }
    return true;
}

static bool infer_transpose(dg_node *n, dg_status *st) {   // x, perm
    int64_t perm[DG_MAX_RANK];
    int count;
    if (!const_ints(n, 1, "perm", perm, &count, st)) return false;
    dg_shape x = in_sh(n, 0);
    if (count < 0) {
        dg_shape o = dg_shape_unknown();
        if (x.rank >= 0) {
            o = x;
            for (int k = 0; k < x.rank; k++) o.dims[k] = -1;
        }
        return out1(n, in_dt(n, 0), o, st);
    }
    if (!graph_check_perm(perm, count, x.rank, st)) return false;
    dg_shape o = dg_shape_unknown();
    if (x.rank >= 0) {
        o = x;
        for (int k = 0; k < count; k++) o.dims[k] = x.dims[perm[k]];
    }
    return out1(n, in_dt(n, 0), o, st);
}

static bool infer_tile(dg_node *n, dg_status *st) {   // x, multiples
    int64_t m[DG_MAX_RANK];
    int count;
    if (!const_ints(n, 1, "multiples", m, &count, st)) return false;
    dg_shape x = in_sh(n, 0), o = x;
    if (count >= 0) {
        if (x.rank >= 0 && count != x.rank) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "multiples has %d entries for an input of rank %d", count, x.rank);
            return false;
        }
        for (int k = 0; k < count; k++)
            if (m[k] < 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "multiples[%d] is %lld (must be >= 0)", k, (long long)m[k]);
                return false;
            }
    }
    for (int k = 0; x.rank >= 0 && k < x.rank; k++) o.dims[k] = count < 0 || x.dims[k] < 0 ? -1 : x.dims[k] * m[k];
    return out1(n, in_dt(n, 0), o, st);
}

static bool infer_stop_gradient(dg_node *n, dg_status *st) { return out1(n, in_dt(n, 0), in_sh(n, 0), st); }

static bool infer_select(dg_node *n, dg_status *st) {   // cond, t, e
    if (in_dt(n, 0) != DG_BOOL) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input 0 (the condition, \"%s\") must be bool, got %s",
                       n->inputs[0].node->name, dg_dtype_name(in_dt(n, 0)));
        return false;
    }
    if (in_dt(n, 1) != in_dt(n, 2)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "inputs 1 and 2 must have the same dtype, got %s and %s",
                       dg_dtype_name(in_dt(n, 1)), dg_dtype_name(in_dt(n, 2)));
        return false;
    }
    dg_shape a, o;
    return graph_broadcast_shapes(in_sh(n, 1), in_sh(n, 2), &a, st) &&
           graph_broadcast_shapes(in_sh(n, 0), a, &o, st) && out1(n, in_dt(n, 1), o, st);
}

static bool infer_one_hot(dg_node *n, dg_status *st) {   // indices, depth, on_value, off_value
    dg_dtype t = in_dt(n, 0);
    if (t != DG_INT32 && t != DG_INT64) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input 0 (indices, \"%s\") must be int32 or int64, got %s",
                       n->inputs[0].node->name, dg_dtype_name(t));
        return false;
    }
    dg_shape ds = in_sh(n, 1), on = in_sh(n, 2), off = in_sh(n, 3);
    if ((in_dt(n, 1) != DG_INT32 && in_dt(n, 1) != DG_INT64) || ds.rank > 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "input 1 (depth) must be an int32 or int64 scalar");
        return false;
    }
    if (in_dt(n, 2) != in_dt(n, 3) || !dg_dtype_is_float(in_dt(n, 2)) || on.rank > 0 || off.rank > 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT,
                      "inputs 2 and 3 (on_value, off_value) must be float32 or float64 scalars of one dtype");
        return false;
    }
    const dg_tensor *dv = dg_node_const_value(n->inputs[1].node);
    int64_t depth = dv ? (int64_t)dg_tensor_get_as_double(dv, 0) : -1;
    if (dv && depth < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "depth is %lld (must be >= 0)", (long long)depth);
        return false;
    }
    dg_shape x = in_sh(n, 0), o = dg_shape_unknown();
    if (x.rank >= 0) {
        if (x.rank >= DG_MAX_RANK) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "indices of rank %d: the result would pass rank %d", x.rank,
                           DG_MAX_RANK);
            return false;
        }
        o = x;
        o.rank = x.rank + 1;
        o.dims[x.rank] = depth;
    }
    return out1(n, in_dt(n, 2), o, st);
}

// ---- gradients ----

static bool grad_transpose(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    const dg_tensor *cv = dg_node_const_value(n->inputs[1].node);
    if (!cv) {
        dg_graph_set_error(g, DG_UNIMPLEMENTED, "gradient of Transpose \"%s\": perm must be a constant", n->name);
        return false;
    }
    int64_t inv[DG_MAX_RANK];
    for (int k = 0; k < (int)cv->n_elements; k++) inv[(int64_t)dg_tensor_get_as_double(cv, k)] = k;
    dx[0] = dg_transpose(g, NULL, dy[0], inv, (int)cv->n_elements);
    dx[1] = NULL_OUT;
    return dg_graph_ok(g);
}

static bool grad_tile(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    const dg_tensor *cv = dg_node_const_value(n->inputs[1].node);
    dg_shape x = in_sh(n, 0);
    if (!cv || !dg_shape_is_fully_defined(&x) || 2 * x.rank > DG_MAX_RANK) {
        dg_graph_set_error(g, DG_UNIMPLEMENTED,
                           "gradient of Tile \"%s\": needs constant multiples and an input shape known when built, of "
                           "rank at most %d", n->name, DG_MAX_RANK / 2);
        return false;
    }
    // dy [m0 d0, m1 d1, ...] -> [m0, d0, m1, d1, ...], summed over the m axes.
    int64_t split[DG_MAX_RANK], axes[DG_MAX_RANK / 2];
    for (int k = 0; k < x.rank; k++) {
        split[2 * k] = (int64_t)dg_tensor_get_as_double(cv, k);
        split[2 * k + 1] = x.dims[k];
        axes[k] = 2 * k;
    }
    dg_output r = dg_reshape(g, NULL, dy[0], split, 2 * x.rank);
    dx[0] = x.rank ? dg_sum(g, NULL, r, axes, x.rank, false) : dy[0];
    dx[1] = NULL_OUT;
    return dg_graph_ok(g);
}

// Range's length, as TensorFlow's: ceil(|limit - start| / |delta|); false with st naming the
// problem (delta 0, a limit on the wrong side, a length over 2^48).
bool graph_range_size(double start, double limit, double delta, bool ints, int64_t *n, dg_status *st) {
    if (!(delta != 0) || start != start || limit != limit) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "Range: delta must not be 0 (and no input NaN), got start %g, limit "
                       "%g, delta %g", start, limit, delta);
        return false;
    }
    if ((delta > 0 && start > limit) || (delta < 0 && start < limit)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "Range: start %g is %s limit %g while delta is %g", start,
                       delta > 0 ? "above" : "below", limit, delta);
        return false;
    }
    double len = ints ? floor((fabs(limit - start) + fabs(delta) - 1) / fabs(delta)) : ceil(fabs((limit - start) / delta));
    if (!(len <= 281474976710656.0)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "Range: %g elements (start %g, limit %g, delta %g) is over 2^48", len,
                       start, limit, delta);
        return false;
    }
    *n = (int64_t)len;
    return true;
}

static bool infer_range(dg_node *n, dg_status *st) {
    dg_dtype t = in_dt(n, 0);
    if ((t != DG_INT32 && t != DG_INT64 && t != DG_FLOAT32 && t != DG_FLOAT64) || in_dt(n, 1) != t || in_dt(n, 2) != t) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "Range: start, limit and delta must be one of int32, int64, float32, "
                       "float64, got %s, %s, %s", dg_dtype_name(t), dg_dtype_name(in_dt(n, 1)),
                       dg_dtype_name(in_dt(n, 2)));
        return false;
    }
    double v[3];
    bool known = true;
    for (int i = 0; i < 3; i++) {
        dg_shape s = in_sh(n, i);
        if (s.rank > 0) {
            char b[128];
            dg_status_setf(st, DG_INVALID_ARGUMENT, "Range: input %d must be a scalar, got shape %s", i,
                           dg_shape_str(&s, b, sizeof b));
            return false;
        }
        const dg_tensor *cv = dg_node_const_value(n->inputs[i].node);
        if (cv && cv->n_elements == 1) v[i] = dg_tensor_get_as_double(cv, 0);
        else known = false;
    }
    int64_t len = -1;
    if (known && !graph_range_size(v[0], v[1], v[2], t == DG_INT32 || t == DG_INT64, &len, st)) return false;
    if (!graph_set_num_outputs(n, 1, st)) return false;
    graph_set_output(n, 0, t, dg_shape1(len));
    return true;
}

static const graph_op_def array_op_defs[] = {
    GRAPH_OP("Range", 3, 3, false, false, true, infer_range, NULL),
    GRAPH_OP("Transpose", 2, 2, false, false, false, infer_transpose, grad_transpose),
    GRAPH_OP("Tile", 2, 2, false, false, false, infer_tile, grad_tile),
    GRAPH_OP("StopGradient", 1, 1, false, false, true, infer_stop_gradient, NULL),
    GRAPH_OP("Select", 3, 3, false, false, false, infer_select, grad_Select),
    GRAPH_OP("OneHot", 4, 4, false, false, true, infer_one_hot, NULL),
};

int graph_array_op_defs(const graph_op_def **defs) {
    *defs = array_op_defs;
    return (int)(sizeof array_op_defs / sizeof array_op_defs[0]);
}
