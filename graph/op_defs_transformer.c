/* Op definitions of transformer layers: a fused layer normalisation and its gradient.
 *
 * LayerNorm(x, gamma, beta) normalises x over its last axis (of size C) and scales and shifts
 * the result: y = (x - mean) * rstd * gamma + beta, with mean and the variance (the biased one,
 * divided by C) of each row and rstd = 1 / sqrt(var + epsilon) (attribute "epsilon", default
 * 1e-5). Its outputs are y, mean and rstd (the last two of shape x[:-1]), as PyTorch's
 * native_layer_norm: the gradient reads them instead of computing them again. TensorFlow has
 * no such op (Keras's LayerNormalization composes moments and batch_normalization); the values
 * and gradients are that composition's.
 *
 * BatchMatMulV2(x, y) is TensorFlow's: x [..., M, K] (adj_x: [..., K, M]) times y [..., K, N]
 * (adj_y: [..., N, K]) for every index of the batch dimensions, which broadcast as elementwise
 * ops' shapes do; the output is [batch..., M, N].
 *
 * LayerNormGrad(dy, x, gamma, mean, rstd) gives dx, dgamma and dbeta in one pass over the rows:
 * with xhat = (x - mean) * rstd and g = dy * gamma, dx = rstd * (g - mean(g) - xhat *
 * mean(g * xhat)) per row, dgamma = sum over rows of dy * xhat, dbeta = sum over rows of dy.
 *
 * ScaledDotProductAttention(q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv]) is PyTorch's
 * F.scaled_dot_product_attention: softmax(scale * q k^T) v, masked as below, for every index of the batch
 * dimensions (equal in all three), scale the attribute "scale" (0, the default: 1 / sqrt(D)).
 * With "causal" true, query row i sees key j only if j <= i + Tk - Tq (the rows aligned to the
 * end of the keys, as FlashAttention does; PyTorch's top-left alignment is the same for Tq =
 * Tk); a row that sees no key is 0. Output 1 is each row's log-sum-exp of its scaled scores
 * (-inf for a row that sees no key), [..., Tq]: the gradient recomputes the probabilities from
 * it instead of keeping the Tq x Tk matrix. TensorFlow composes the same from BatchMatMul,
 * a mask and Softmax; the values and gradients are that composition's.
 *
 * An optional fourth input, a boolean mask that broadcasts to [..., Tq, Tk] (NumPy's rules,
 * aligned at the right), lets query row i see key j only where it is true, on top of the causal
 * rule; a row left with no key is 0 as above. TensorFlow adds the same as -inf to the scores.
 *
 * ScaledDotProductAttentionGrad(dout, q, k, v, out, lse[, mask]) gives dq, dk and dv.
 *
 * Non-finite inputs: a NaN score makes its row NaN on both devices. A NaN or infinity in a key
 * or value row that a query does not see (causal) can still reach that query on the CPU, whose
 * GEMMs cover the keys of the last row of its block of 64 (0 x NaN); the GPU never reads them. */
#include <stdio.h>
#include <string.h>

#include "grad_impl.h"

static dg_dtype in_dt(const dg_node *n, int i) { return dg_output_dtype(n->inputs[i]); }
static dg_shape in_sh(const dg_node *n, int i) { return dg_output_shape(n->inputs[i]); }

// x float of rank >= 1; each of the inputs named in vec ([C]: gamma, beta) of x's dtype and
// shape [C]; each in rows (mean, rstd) of x's dtype and shape x[:-1].
// The dtype of a LayerNorm's mean and rstd (and attention's lse) for inputs of dtype dt:
// float32 for the 16-bit floats (the gradient reads them back), else dt.
static dg_dtype stats_dtype(dg_dtype dt) { return dg_dtype_is_float16_family(dt) ? DG_FLOAT32 : dt; }

static bool check_inputs(const dg_node *n, int x, const int *vec, int n_vec, const int *rows, int n_rows,
                         dg_status *st) {
    dg_dtype dt = in_dt(n, x);
    dg_shape xs = in_sh(n, x);
    char a[128], b[128];
    if (dt != DG_FLOAT32 && dt != DG_FLOAT64 && !dg_dtype_is_float16_family(dt)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: x must be float32, float64, bfloat16 or float16, got %s",
                       n->op->name, dg_dtype_name(dt));
        return false;
    }
    if (xs.rank == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: x must have rank >= 1 (it is normalised over its last axis)",
                       n->op->name);
        return false;
    }
    int64_t C = xs.rank > 0 ? xs.dims[xs.rank - 1] : -1;
    for (int k = 0; k < n_vec + n_rows; k++) {
        int i = k < n_vec ? vec[k] : rows[k - n_vec];
        if (in_dt(n, i) != (k < n_vec ? dt : stats_dtype(dt))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: input %d is %s, x is %s", n->op->name, i,
                           dg_dtype_name(in_dt(n, i)), dg_dtype_name(dt));
            return false;
        }
        dg_shape s = in_sh(n, i), want;
        if (k < n_vec) {
            want = dg_shape1(C);
        } else {
            want = xs;
            if (xs.rank > 0) want.rank--;
        }
        if (s.rank >= 0 && want.rank >= 0 && !dg_shape_compatible(&s, &want)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: input %d has shape %s, x %s needs %s", n->op->name, i,
                           dg_shape_str(&s, a, sizeof a), dg_shape_str(&xs, b, sizeof b),
                           k < n_vec ? "[C], C its last dimension" : "x's shape without its last axis");
            return false;
        }
    }
    return true;
}

static bool check_epsilon(const dg_node *n, dg_status *st) {
    double eps = 1e-5;
    (void)dg_node_attr_float(n, "epsilon", &eps);
    if (!(eps >= 0) || eps > 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: epsilon %g must be in [0, 1]", n->op->name, eps);
        return false;
    }
    return true;
}

static dg_shape without_last(dg_shape s) {
    if (s.rank > 0) s.rank--;
    return s;
}

static bool infer_layer_norm(dg_node *n, dg_status *st) {
    static const int vec[] = {1, 2};
    if (!check_inputs(n, 0, vec, 2, NULL, 0, st) || !check_epsilon(n, st)) return false;
    dg_dtype dt = in_dt(n, 0);
    dg_shape xs = in_sh(n, 0);
    if (!graph_set_num_outputs(n, 3, st)) return false;
    graph_set_output(n, 0, dt, xs);
    graph_set_output(n, 1, stats_dtype(dt), without_last(xs));
    graph_set_output(n, 2, stats_dtype(dt), without_last(xs));
    return true;
}

static bool infer_layer_norm_grad(dg_node *n, dg_status *st) {
    static const int vec[] = {2}, rows[] = {3, 4};
    if (!check_inputs(n, 1, vec, 1, rows, 2, st)) return false;
    dg_dtype dt = in_dt(n, 1);
    dg_shape xs = in_sh(n, 1), dys = in_sh(n, 0);
    char a[128], b[128];
    if (in_dt(n, 0) != dt || !dg_shape_compatible(&dys, &xs)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "LayerNormGrad: dy (%s %s) must be x's dtype and shape (%s %s)",
                       dg_dtype_name(in_dt(n, 0)), dg_shape_str(&dys, a, sizeof a), dg_dtype_name(dt),
                       dg_shape_str(&xs, b, sizeof b));
        return false;
    }
    if (!graph_set_num_outputs(n, 3, st)) return false;
    int64_t C = xs.rank > 0 ? xs.dims[xs.rank - 1] : -1;
    graph_set_output(n, 0, dt, xs);
    graph_set_output(n, 1, dt, dg_shape1(C));
    graph_set_output(n, 2, dt, dg_shape1(C));
    return true;
}

// Gradients flow from y only: mean and rstd are the forward pass's notes for its gradient. A
// graph that differentiates through them is refused (UNIMPLEMENTED) rather than given zeros.
static bool grad_layer_norm(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    if (dy[1].node || dy[2].node) {
        graph_node_error(g, n, DG_UNIMPLEMENTED, "gradients through LayerNorm's mean and rstd outputs are not "
                         "supported (only through y)");
        return false;
    }
    if (!dy[0].node) return true;
    dg_node *gn = graph_begin(g, "LayerNormGrad", NULL);
    graph_add_input(gn, dy[0]);
    graph_add_input(gn, n->inputs[0]);
    graph_add_input(gn, n->inputs[1]);
    graph_add_input(gn, (dg_output){n, 1});
    graph_add_input(gn, (dg_output){n, 2});
    dg_node *r = graph_finish(gn);
    if (!r) return false;
    for (int i = 0; i < 3; i++) dx[i] = (dg_output){r, i};
    return dg_graph_ok(g);
}

static bool infer_batch_matmul(dg_node *n, dg_status *st) {
    dg_dtype dt = in_dt(n, 0);
    if ((dt != DG_FLOAT32 && dt != DG_FLOAT64 && !dg_dtype_is_float16_family(dt)) || in_dt(n, 1) != dt) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "BatchMatMulV2: x and y must be one float dtype, got %s and %s",
                       dg_dtype_name(dt), dg_dtype_name(in_dt(n, 1)));
        return false;
    }
    bool adj_x = false, adj_y = false;
    (void)dg_node_attr_bool(n, "adj_x", &adj_x);
    (void)dg_node_attr_bool(n, "adj_y", &adj_y);
    dg_shape x = in_sh(n, 0), y = in_sh(n, 1);
    char a[128], b[128];
    if ((x.rank >= 0 && x.rank < 2) || (y.rank >= 0 && y.rank < 2)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "BatchMatMulV2: x %s and y %s must have rank >= 2",
                       dg_shape_str(&x, a, sizeof a), dg_shape_str(&y, b, sizeof b));
        return false;
    }
    if (x.rank < 0 || y.rank < 0) {   // the batch's rank is unknown: so is the output's
        if (!graph_set_num_outputs(n, 1, st)) return false;
        graph_set_output(n, 0, dt, dg_shape_unknown());
        return true;
    }
    int64_t m = x.dims[x.rank - (adj_x ? 1 : 2)], kx = x.dims[x.rank - (adj_x ? 2 : 1)];
    int64_t ky = y.dims[y.rank - (adj_y ? 1 : 2)], nn = y.dims[y.rank - (adj_y ? 2 : 1)];
    if (kx >= 0 && ky >= 0 && kx != ky) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "BatchMatMulV2: inner dimensions differ, %lld vs %lld (x %s, y %s)",
                       (long long)kx, (long long)ky, dg_shape_str(&x, a, sizeof a), dg_shape_str(&y, b, sizeof b));
        return false;
    }
    dg_shape xb = x, yb = y, ob;
    xb.rank -= 2;
    yb.rank -= 2;
    if (!graph_broadcast_shapes(xb, yb, &ob, st)) {
        dg_status_prepend(st, "BatchMatMulV2: batch dimensions of x %s and y %s", dg_shape_str(&x, a, sizeof a),
                          dg_shape_str(&y, b, sizeof b));
        return false;
    }
    if (ob.rank + 2 > DG_MAX_RANK) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "BatchMatMulV2: output rank %d is over %d", ob.rank + 2, DG_MAX_RANK);
        return false;
    }
    ob.dims[ob.rank++] = m;
    ob.dims[ob.rank++] = nn;
    if (!graph_set_num_outputs(n, 1, st)) return false;
    graph_set_output(n, 0, dt, ob);
    return true;
}

static bool dim_ok(int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; }

// The mask (input m, when the node has it): bool, broadcasting to [batch..., Tq, Tk] of q and k.
static bool check_attention_mask(const dg_node *n, int m, dg_shape q, dg_shape k, dg_status *st) {
    if (n->n_inputs <= m) return true;
    char a[128], b[128], c[128];
    if (in_dt(n, m) != DG_BOOL) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: the mask must be bool, got %s", n->op->name,
                       dg_dtype_name(in_dt(n, m)));
        return false;
    }
    dg_shape ms = in_sh(n, m);
    if (ms.rank < 0 || q.rank < 2 || k.rank != q.rank) return true;   // checked when the kernel runs
    bool ok = ms.rank <= q.rank;
    for (int i = 0; ok && i < ms.rank; i++) {
        int t = q.rank - ms.rank + i;   // the target axis, aligned at the right
        int64_t want = t == q.rank - 1 ? k.dims[k.rank - 2] : q.dims[t];
        ok = ms.dims[i] < 0 || want < 0 || ms.dims[i] == 1 || ms.dims[i] == want;
    }
    if (!ok) {
        dg_shape target = q;
        target.dims[q.rank - 1] = k.dims[k.rank - 2];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: the mask %s does not broadcast to [..., Tq, Tk] = %s (q %s)",
                       n->op->name, dg_shape_str(&ms, a, sizeof a), dg_shape_str(&target, b, sizeof b),
                       dg_shape_str(&q, c, sizeof c));
        return false;
    }
    return true;
}

// q, k, v (and, for the gradient, dout, out, lse): one float dtype, one rank >= 2, the batch
// dimensions equal, q and k of one width D, k and v of one length Tk; the mask as above.
static bool check_attention(const dg_node *n, int first, dg_status *st) {
    dg_dtype dt = in_dt(n, first);
    dg_shape q = in_sh(n, first), k = in_sh(n, first + 1), v = in_sh(n, first + 2);
    char a[128], b[128], c[128];
    if (dt != DG_FLOAT32 && dt != DG_FLOAT64 && !dg_dtype_is_float16_family(dt)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: q must be float32, float64, bfloat16 or float16, got %s",
                       n->op->name, dg_dtype_name(dt));
        return false;
    }
    int mask_at = first ? 6 : 3;   // the mask's input, when there is one
    for (int i = 0; i < n->n_inputs && i < mask_at; i++)
        if (in_dt(n, i) != dt && !(first && i == 5 && in_dt(n, i) == stats_dtype(dt))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: input %d is %s, q is %s", n->op->name, i,
                           dg_dtype_name(in_dt(n, i)), dg_dtype_name(dt));
            return false;
        }
    if (q.rank < 0 || k.rank < 0 || v.rank < 0) return check_attention_mask(n, mask_at, q, k, st);
    bool ok = q.rank >= 2 && k.rank == q.rank && v.rank == q.rank;
    for (int i = 0; ok && i < q.rank - 2; i++)
        ok = dim_ok(q.dims[i], k.dims[i]) && dim_ok(q.dims[i], v.dims[i]);
    int r = q.rank;
    ok = ok && dim_ok(q.dims[r - 1], k.dims[r - 1]) && dim_ok(k.dims[r - 2], v.dims[r - 2]);
    if (!ok) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: q %s, k %s and v %s must be [..., Tq, D], [..., Tk, D] and "
                       "[..., Tk, Dv] with the same batch dimensions", n->op->name, dg_shape_str(&q, a, sizeof a),
                       dg_shape_str(&k, b, sizeof b), dg_shape_str(&v, c, sizeof c));
        return false;
    }
    double scale = 0;
    if (dg_node_attr_float(n, "scale", &scale) && !(scale >= 0 && scale < 1e30)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: scale %g must be finite and >= 0 (0: 1 / sqrt(D))",
                       n->op->name, scale);
        return false;
    }
    return check_attention_mask(n, mask_at, q, k, st);
}

// The output's shape: q's with v's last dimension.
static dg_shape attention_out_shape(dg_shape q, dg_shape v) {
    if (q.rank >= 2 && v.rank == q.rank) q.dims[q.rank - 1] = v.dims[v.rank - 1];
    else q = dg_shape_unknown();
    return q;
}

static bool infer_attention(dg_node *n, dg_status *st) {
    if (!check_attention(n, 0, st)) return false;
    dg_dtype dt = in_dt(n, 0);
    dg_shape q = in_sh(n, 0);
    if (!graph_set_num_outputs(n, 2, st)) return false;
    graph_set_output(n, 0, dt, attention_out_shape(q, in_sh(n, 2)));
    graph_set_output(n, 1, stats_dtype(dt), q.rank >= 0 ? without_last(q) : q);
    return true;
}

static bool infer_attention_grad(dg_node *n, dg_status *st) {
    if (!check_attention(n, 1, st)) return false;
    dg_dtype dt = in_dt(n, 1);
    dg_shape q = in_sh(n, 1), want = attention_out_shape(q, in_sh(n, 3)), lw = q.rank >= 0 ? without_last(q) : q;
    dg_shape d = in_sh(n, 0), o = in_sh(n, 4), l = in_sh(n, 5);
    char a[128], b[128];
    const dg_shape *got[3] = {&d, &o, &l}, *need[3] = {&want, &want, &lw};
    static const char *const name[3] = {"dout", "out", "lse"};
    for (int i = 0; i < 3; i++)
        if (got[i]->rank >= 0 && need[i]->rank >= 0 && !dg_shape_compatible(got[i], need[i])) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: %s has shape %s, q and v need %s", n->op->name, name[i],
                           dg_shape_str(got[i], a, sizeof a), dg_shape_str(need[i], b, sizeof b));
            return false;
        }
    if (!graph_set_num_outputs(n, 3, st)) return false;
    for (int i = 0; i < 3; i++) graph_set_output(n, i, dt, in_sh(n, 1 + i));
    return true;
}

// Gradients flow from the output only (lse is the forward pass's note for its gradient).
static bool grad_attention(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx) {
    if (dy[1].node) {
        graph_node_error(g, n, DG_UNIMPLEMENTED, "gradients through ScaledDotProductAttention's lse output are "
                         "not supported (only through its output 0)");
        return false;
    }
    if (!dy[0].node) return true;
    dg_node *gn = graph_begin(g, "ScaledDotProductAttentionGrad", NULL);
    graph_add_input(gn, dy[0]);
    for (int i = 0; i < 3; i++) graph_add_input(gn, n->inputs[i]);
    graph_add_input(gn, (dg_output){n, 0});
    graph_add_input(gn, (dg_output){n, 1});
    if (n->n_inputs > 3) graph_add_input(gn, n->inputs[3]);   // the mask: no gradient of its own
    bool causal = false;
    double scale = 0;
    (void)dg_node_attr_bool(n, "causal", &causal);
    (void)dg_node_attr_float(n, "scale", &scale);
    graph_set_attr_bool(gn, "causal", causal);
    graph_set_attr_float(gn, "scale", scale);
    dg_node *r = graph_finish(gn);
    if (!r) return false;
    for (int i = 0; i < 3; i++) dx[i] = (dg_output){r, i};
    return dg_graph_ok(g);
}

static const graph_op_def transformer_op_defs[] = {
    GRAPH_OP("BatchMatMulV2", 2, 2, false, false, false, infer_batch_matmul, grad_BatchMatMulV2),
    GRAPH_OP("LayerNorm", 3, 3, false, false, false, infer_layer_norm, grad_layer_norm),
    GRAPH_OP("LayerNormGrad", 5, 5, false, false, false, infer_layer_norm_grad, NULL),
    GRAPH_OP("ScaledDotProductAttention", 3, 4, false, false, false, infer_attention, grad_attention),
    GRAPH_OP("ScaledDotProductAttentionGrad", 6, 7, false, false, false, infer_attention_grad, NULL),
};

int graph_transformer_op_defs(const graph_op_def **defs) {
    *defs = transformer_op_defs;
    return (int)(sizeof transformer_op_defs / sizeof transformer_op_defs[0]);
}
