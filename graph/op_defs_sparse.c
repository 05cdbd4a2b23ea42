/* Op definitions for embeddings and sparse updates, as TensorFlow's:
 *   Gather(params, indices)                      rows of params (axis 0) at indices
 *   UnsortedSegmentSum(data, segment_ids, num_segments)   rows of data added at their ids
 *   ScatterAdd / ScatterSub / ScatterUpdate(ref, indices, updates)   rows of a variable in place
 *   SparseApplyAdagrad(var, accum, lr, grad, indices)      TensorFlow's kernel
 *   SparseApplyMomentum(var, accum, lr, grad, indices, momentum), attr use_nesterov: TensorFlow's
 *   SparseApplyAdam(var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, indices)
 *       TensorFlow 1 AdamOptimizer's sparse update (_apply_sparse_shared) in one kernel
 *   DynamicPartition(data, partitions) num_partitions outputs; DynamicStitch(indices..., data...)
 *   EmbeddingPartitionIds(ids) -> (partition, id within it, position): embedding_lookup's
 *       routing of ids to the shards of a partitioned variable ("mod" or "div"), in one op
 *
 * The gradient of Gather with respect to params is sparse, TensorFlow's IndexedSlices: an
 * UnsortedSegmentSum(values, indices, rows) node marked "_sparse_gradient". Run, it gives the
 * dense gradient, so any reader is right; the optimizers and the gradient driver read its
 * inputs instead (dg_gradient_is_sparse), so only the touched rows are computed and travel. */
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

static bool int_input(const dg_node *n, int i, const char *what, dg_status *st) {
    dg_dtype t = in_dt(n, i);
    if (t == DG_INT32 || t == DG_INT64) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (%s, \"%s\") must be int32 or int64, got %s", i, what,
                   n->inputs[i].node->name, dg_dtype_name(t));
    return false;
}

static bool float_input(const dg_node *n, int i, const char *what, dg_status *st) {
    if (dg_dtype_is_float(in_dt(n, i))) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (%s, \"%s\") must be float32 or float64, got %s", i, what,
                   n->inputs[i].node->name, dg_dtype_name(in_dt(n, i)));
    return false;
}

// Rows of x at indices: indices' shape, then x's shape after its first axis.
static bool rows_shape(dg_shape x, dg_shape idx, dg_shape *o, dg_status *st) {
    if (x.rank == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "params must have rank >= 1 (rows to gather)");
        return false;
    }
    if (x.rank < 0 || idx.rank < 0) {
        *o = dg_shape_unknown();
        return true;
    }
    if (idx.rank + x.rank - 1 > DG_MAX_RANK) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "the result would have rank %d (at most %d)", idx.rank + x.rank - 1,
                       DG_MAX_RANK);
        return false;
    }
    *o = idx;
    for (int k = 1; k < x.rank; k++) o->dims[o->rank++] = x.dims[k];
    return true;
}

static bool infer_gather(dg_node *n, dg_status *st) {   // params, indices
    dg_shape o;
    return int_input(n, 1, "indices", st) && rows_shape(in_sh(n, 0), in_sh(n, 1), &o, st) &&
           out1(n, in_dt(n, 0), o, st);
}

static bool infer_segment_sum(dg_node *n, dg_status *st) {   // data, segment_ids, num_segments
    if (!float_input(n, 0, "data", st) || !int_input(n, 1, "segment_ids", st) ||
        !int_input(n, 2, "num_segments", st))
        return false;
    dg_shape d = in_sh(n, 0), ids = in_sh(n, 1), o = dg_shape_unknown();
    if (ids.rank > 1 || (ids.rank == 1 && d.rank == 0)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "segment_ids must be a vector of one id per row of data");
        return false;
    }
    const dg_tensor *cv = dg_node_const_value(n->inputs[2].node);
    if (d.rank >= 1) {
        o = d;
        o.dims[0] = cv ? (int64_t)dg_tensor_get_as_double(cv, 0) : -1;
        if (cv && o.dims[0] < 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "num_segments is %lld (must be >= 0)", (long long)o.dims[0]);
            return false;
        }
    }
    return out1(n, in_dt(n, 0), o, st);
}

static bool var_input(const dg_node *n, int i, dg_status *st) {
    if (strcmp(n->inputs[i].node->op->name, "VariableV2") == 0) return true;
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d must be a variable, got \"%s\" (%s)", i,
                   n->inputs[i].node->name, n->inputs[i].node->op->name);
    return false;
}

// updates (input u) hold rows of the variable (input 0) for each of indices (input i).
static bool rows_of_var(const dg_node *n, int u, int i, dg_status *st) {
    dg_shape v = in_sh(n, 0), up = in_sh(n, u), want;
    if (in_dt(n, u) != in_dt(n, 0)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") is %s, variable \"%s\" is %s", u,
                       n->inputs[u].node->name, dg_dtype_name(in_dt(n, u)), n->inputs[0].node->name,
                       dg_dtype_name(in_dt(n, 0)));
        return false;
    }
    if (!rows_shape(v, in_sh(n, i), &want, st)) return false;
    if (dg_shape_compatible(&want, &up)) return true;
    char a[128], b[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") has shape %s; the indices ask for rows %s", u,
                   n->inputs[u].node->name, dg_shape_str(&up, a, sizeof a), dg_shape_str(&want, b, sizeof b));
    return false;
}

static bool scalar_like_var(const dg_node *n, int i, dg_status *st) {
    dg_shape x = in_sh(n, i);
    if (in_dt(n, i) == in_dt(n, 0) && x.rank <= 0) return true;
    char a[128];
    dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (\"%s\") must be a %s scalar, got %s %s", i,
                   n->inputs[i].node->name, dg_dtype_name(in_dt(n, 0)), dg_dtype_name(in_dt(n, i)),
                   dg_shape_str(&x, a, sizeof a));
    return false;
}

static bool same_as_var(const dg_node *n, int i, dg_status *st) {
    dg_shape v = in_sh(n, 0), x = in_sh(n, i);
    if (var_input(n, i, st) && in_dt(n, i) == in_dt(n, 0) && dg_shape_compatible(&v, &x)) return true;
    if (dg_status_ok(st))
        dg_status_setf(st, DG_INVALID_ARGUMENT, "slot \"%s\" does not match variable \"%s\"", n->inputs[i].node->name,
                       n->inputs[0].node->name);
    return false;
}

static bool infer_scatter(dg_node *n, dg_status *st) {   // ref, indices, updates
    return int_input(n, 1, "indices", st) && rows_of_var(n, 2, 1, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_sparse_adagrad(dg_node *n, dg_status *st) {   // var, accum, lr, grad, indices
    return float_input(n, 0, "var", st) && same_as_var(n, 1, st) && scalar_like_var(n, 2, st) &&
           int_input(n, 4, "indices", st) && rows_of_var(n, 3, 4, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_sparse_momentum(dg_node *n, dg_status *st) {   // var, accum, lr, grad, indices, momentum
    return float_input(n, 0, "var", st) && same_as_var(n, 1, st) && scalar_like_var(n, 2, st) &&
           int_input(n, 4, "indices", st) && rows_of_var(n, 3, 4, st) && scalar_like_var(n, 5, st) &&
           out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_sparse_adam(dg_node *n, dg_status *st) {
    // var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, indices
    if (!float_input(n, 0, "var", st) || !same_as_var(n, 1, st) || !same_as_var(n, 2, st)) return false;
    for (int i = 3; i <= 8; i++)
        if (!scalar_like_var(n, i, st)) return false;
    return int_input(n, 10, "indices", st) && rows_of_var(n, 9, 10, st) && out1(n, in_dt(n, 0), in_sh(n, 0), st);
}

static bool infer_dynamic_partition(dg_node *n, dg_status *st) {   // data, partitions
    int64_t np;
    if (!dg_node_attr_int(n, "num_partitions", &np) || np < 1 || np > 4096) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "num_partitions must be in 1..4096");
        return false;
    }
    if (in_dt(n, 1) != DG_INT32) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "partitions must be int32, got %s", dg_dtype_name(in_dt(n, 1)));
        return false;
    }
    dg_shape d = in_sh(n, 0), p = in_sh(n, 1), o = dg_shape_unknown();
    if (d.rank >= 0 && p.rank >= 0) {
        if (p.rank > d.rank) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "partitions has a higher rank than data");
            return false;
        }
        o.rank = 1 + d.rank - p.rank;
        o.dims[0] = -1;
        for (int k = p.rank; k < d.rank; k++) o.dims[1 + k - p.rank] = d.dims[k];
    }
    if (!graph_set_num_outputs(n, (int)np, st)) return false;
    for (int i = 0; i < np; i++) graph_set_output(n, i, in_dt(n, 0), o);
    return true;
}

static bool infer_dynamic_stitch(dg_node *n, dg_status *st) {   // indices[N], data[N]
    if (n->n_inputs % 2 != 0 || n->n_inputs < 2) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "DynamicStitch takes N index tensors then N data tensors");
        return false;
    }
    int h = n->n_inputs / 2;
    for (int i = 0; i < h; i++) {
        if (in_dt(n, i) != DG_INT32) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "input %d (indices) must be int32", i);
            return false;
        }
        if (in_dt(n, h + i) != in_dt(n, h)) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "the data tensors must share one dtype");
            return false;
        }
    }
    dg_shape d = in_sh(n, h), ix = in_sh(n, 0), o = dg_shape_unknown();
    if (d.rank >= 0 && ix.rank >= 0 && d.rank >= ix.rank) {
        o.rank = 1 + d.rank - ix.rank;
        o.dims[0] = -1;
        for (int k = ix.rank; k < d.rank; k++) o.dims[1 + k - ix.rank] = d.dims[k];
    }
    return out1(n, in_dt(n, h), o, st);
}

static bool infer_partition_ids(dg_node *n, dg_status *st) {   // ids -> partition, id, position
    const graph_attr *offs = graph_node_attr(n, "offsets");
    const char *strategy = dg_node_attr_string(n, "partition_strategy");
    if (!offs || !strategy || (strcmp(strategy, "mod") != 0 && strcmp(strategy, "div") != 0)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "EmbeddingPartitionIds needs \"offsets\" and a partition_strategy "
                      "\"mod\" or \"div\"");
        return false;
    }
    if (!int_input(n, 0, "ids", st)) return false;
    dg_shape s = in_sh(n, 0), flat = dg_shape_unknown();
    flat.rank = 1;
    flat.dims[0] = dg_shape_is_fully_defined(&s) ? dg_shape_num_elements(&s) : -1;
    if (!graph_set_num_outputs(n, 3, st)) return false;
    graph_set_output(n, 0, DG_INT32, flat);
    graph_set_output(n, 1, DG_INT64, flat);
    graph_set_output(n, 2, DG_INT32, flat);
    return true;
}

// ---- gradients ----

static bool grad_gather(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    // IndexedSlices: dy's rows (one per index, indices flattened) at the indices.
    dg_shape p = in_sh(n, 0);
    int64_t rows_shape_v[DG_MAX_RANK];
    rows_shape_v[0] = -1;
    for (int k = 1; k < p.rank; k++) {
        if (p.dims[k] < 0) {
            dg_graph_set_error(g, DG_UNIMPLEMENTED, "gradient of Gather \"%s\": params' row shape must be known when "
                               "built", n->name);
            return false;
        }
        rows_shape_v[k] = p.dims[k];
    }
    if (p.rank < 1 || p.dims[0] < 0) {
        dg_graph_set_error(g, DG_UNIMPLEMENTED, "gradient of Gather \"%s\": params' shape must be known when built",
                           n->name);
        return false;
    }
    int64_t minus1 = -1;
    dg_output values = dg_reshape(g, NULL, dy[0], rows_shape_v, p.rank);
    dg_output indices = dg_reshape(g, NULL, n->inputs[1], &minus1, 1);
    if (in_dt(n, 1) != DG_INT64) indices = dg_cast(g, NULL, indices, DG_INT64);   // one dtype to concatenate
    dx[0] = graph_sparse_gradient(g, values, indices, p.dims[0]);
    dx[1] = NULL_OUT;
    return dg_graph_ok(g);
}

static bool grad_dynamic_stitch(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    int h = n->n_inputs / 2;
    for (int i = 0; i < h; i++) {
        dx[i] = NULL_OUT;
        dx[h + i] = dg_gather(g, NULL, dy[0], n->inputs[i]);
    }
    return dg_graph_ok(g);
}

static bool grad_segment_sum(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    dx[0] = dg_gather(g, NULL, dy[0], n->inputs[1]);
    dx[1] = dx[2] = NULL_OUT;
    return dg_graph_ok(g);
}

static const graph_op_def sparse_op_defs[] = {
    GRAPH_OP("Gather", 2, 2, false, false, false, infer_gather, grad_gather),
    GRAPH_OP("UnsortedSegmentSum", 3, 3, false, false, false, infer_segment_sum, grad_segment_sum),
    GRAPH_OP("ScatterAdd", 3, 3, true, true, true, infer_scatter, NULL),
    GRAPH_OP("ScatterSub", 3, 3, true, true, true, infer_scatter, NULL),
    GRAPH_OP("ScatterUpdate", 3, 3, true, true, true, infer_scatter, NULL),
    GRAPH_OP("SparseApplyAdagrad", 5, 5, true, 2, true, infer_sparse_adagrad, NULL),
    GRAPH_OP("SparseApplyAdam", 11, 11, true, 3, true, infer_sparse_adam, NULL),
    GRAPH_OP("SparseApplyMomentum", 6, 6, true, 2, true, infer_sparse_momentum, NULL),
    GRAPH_OP("DynamicPartition", 2, 2, false, false, false, infer_dynamic_partition, NULL),
    GRAPH_OP("DynamicStitch", 2, -1, false, false, false, infer_dynamic_stitch, grad_dynamic_stitch),
    GRAPH_OP("EmbeddingPartitionIds", 1, 1, false, false, true, infer_partition_ids, NULL),
};

int graph_sparse_op_defs(const graph_op_def **defs) {
    *defs = sparse_op_defs;
    return (int)(sizeof sparse_op_defs / sizeof sparse_op_defs[0]);
}
