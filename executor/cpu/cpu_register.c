/* Registers the CPU kernels. */
#include <math.h>

#include "cpu_impl.h"
#include "exec_cpu_impl.h"
#include "exec_kernel_registry_impl.h"

void exec_cpu_register(void) {
    exec_register_kernels(cpu_state_kernels, cpu_n_state_kernels);
    exec_register_kernels(cpu_math_kernels, cpu_n_math_kernels);
    exec_register_kernels(cpu_nn_kernels, cpu_n_nn_kernels);
    exec_register_kernels(cpu_conv_kernels, cpu_n_conv_kernels);
    exec_register_kernels(cpu_index_kernels, cpu_n_index_kernels);
    exec_register_kernels(cpu_array_kernels, cpu_n_array_kernels);
    exec_register_kernels(cpu_sendrecv_kernels, cpu_n_sendrecv_kernels);
    cpu_register_collective_kernels();   // kernels_collective.c
    cpu_register_sync_kernels();         // kernels_sync.c
    cpu_register_local_reduce_kernels(); // kernels_local_reduce.c
    cpu_register_sparse_kernels();       // kernels_sparse.c
    cpu_register_transformer_kernels();  // kernels_transformer.c
    cpu_register_16_kernels();           // kernels_16.c
}

bool cpu_read_dims(const dg_tensor *t, int64_t *dims, int *rank, int max_rank) {
    if (t->shape.rank != 1 || t->n_elements > max_rank) return false;
    if (t->dtype != DG_INT32 && t->dtype != DG_INT64) return false;
    *rank = (int)t->n_elements;
    for (int i = 0; i < *rank; i++)
        dims[i] = t->dtype == DG_INT32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
    return true;
}

void cpu_strides(const dg_shape *s, int64_t *out) {
    int64_t acc = 1;
    for (int i = s->rank - 1; i >= 0; i--) {
        out[i] = acc;
        acc *= s->dims[i];
    }
}

bool cpu_broadcast_strides(const dg_shape *src, const dg_shape *dst, int64_t *st_out) {
    if (src->rank > dst->rank) return false;
    int64_t s[DG_MAX_RANK];
    cpu_strides(src, s);
    int off = dst->rank - src->rank;
    for (int i = 0; i < dst->rank; i++) {
        if (i < off) {
            st_out[i] = 0;
            continue;
        }
        int64_t d = src->dims[i - off];
        if (d == dst->dims[i]) st_out[i] = s[i - off];
        else if (d == 1) st_out[i] = 0;
        else return false;
    }
    return true;
}

// Calls visit(dst_index, src_index) over dst in row-major order.
#define ITERATE(dst_shape, sstr, BODY)                                            \
    do {                                                                          \
        int r_ = (dst_shape)->rank;                                               \
        int64_t idx_[DG_MAX_RANK] = {0};                                          \
        int64_t n_ = tensor_shape_elements(dst_shape);                            \
        int64_t so_ = 0;                                                          \
        for (int64_t di_ = 0; di_ < n_; di_++) {                                  \
            int64_t d_i = di_, s_i = so_;                                         \
            BODY;                                                                 \
            for (int k_ = r_ - 1; k_ >= 0; k_--) {                                \
                if (++idx_[k_] < (dst_shape)->dims[k_]) {                         \
                    so_ += (sstr)[k_];                                            \
                    break;                                                        \
                }                                                                 \
                so_ -= (sstr)[k_] * (idx_[k_] - 1);                               \
                idx_[k_] = 0;                                                     \
            }                                                                     \
        }                                                                         \
    } while (0)

bool cpu_broadcast_into(const dg_tensor *src, dg_tensor *dst, dg_status *st) {
    int64_t ss[DG_MAX_RANK];
    char a[128], b[128];
    if (!cpu_broadcast_strides(&src->shape, &dst->shape, ss)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cannot broadcast %s to %s",
                       dg_shape_str(&src->shape, a, sizeof a), dg_shape_str(&dst->shape, b, sizeof b));
        return false;
    }
    size_t es = dg_dtype_size(dst->dtype);
    const char *s = src->data;
    char *d = dst->data;
    if (es == 4) ITERATE(&dst->shape, ss, memcpy(d + d_i * 4, s + s_i * 4, 4));
    else if (es == 8) ITERATE(&dst->shape, ss, memcpy(d + d_i * 8, s + s_i * 8, 8));
    else ITERATE(&dst->shape, ss, d[d_i] = s[s_i]);
    return true;
}

bool cpu_sum_into(const dg_tensor *src, dg_tensor *dst, dg_status *st) {
    int64_t ds[DG_MAX_RANK];
    char a[128], b[128];
    if (!cpu_broadcast_strides(&dst->shape, &src->shape, ds)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cannot sum %s down to %s",
                       dg_shape_str(&src->shape, a, sizeof a), dg_shape_str(&dst->shape, b, sizeof b));
        return false;
    }
    memset(dst->data, 0, dst->nbytes);
    // Iterate over src; ds maps src positions to dst offsets.
    if (src->dtype == DG_FLOAT32) {
        const float *s = src->data;
        float *d = dst->data;
        ITERATE(&src->shape, ds, d[s_i] += s[d_i]);
    } else if (src->dtype == DG_FLOAT64) {
        const double *s = src->data;
        double *d = dst->data;
        ITERATE(&src->shape, ds, d[s_i] += s[d_i]);
    } else if (src->dtype == DG_INT32) {
        const int32_t *s = src->data;
        int32_t *d = dst->data;
        ITERATE(&src->shape, ds, d[s_i] += s[d_i]);
    } else if (src->dtype == DG_INT64) {
        const int64_t *s = src->data;
        int64_t *d = dst->data;
        ITERATE(&src->shape, ds, d[s_i] += s[d_i]);
    } else {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cannot sum %s", dg_dtype_name(src->dtype));
        return false;
    }
    return true;
}

bool cpu_axes_mask(exec_ctx *ctx, bool all, const int64_t *axes, int n_axes, int rank, uint32_t *mask) {
    *mask = 0;
    if (all) {
        *mask = rank ? (uint32_t)((1u << rank) - 1) : 0;
        return true;
    }
    for (int i = 0; i < n_axes; i++) {
        int64_t a = axes[i];
        if (a < -rank || a >= rank)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %lld out of range for rank %d", (long long)a, rank);
        *mask |= 1u << (a < 0 ? a + rank : a);
    }
    return true;
}

dg_shape cpu_reduced_shape(const dg_shape *x, uint32_t mask, bool keep) {
    dg_shape o = dg_shape_scalar();
    for (int i = 0; i < x->rank; i++) {
        if (mask & (1u << i)) {
            if (keep) o.dims[o.rank++] = 1;
        } else {
            o.dims[o.rank++] = x->dims[i];
        }
    }
    return o;
}

bool cpu_matmul_dims(exec_ctx *ctx, const dg_tensor *a, const dg_tensor *b, bool ta, bool tb,
                     int64_t *M, int64_t *N, int64_t *K) {
    if (a->shape.rank != 2 || b->shape.rank != 2)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "MatMul needs matrices, got ranks %d and %d",
                         a->shape.rank, b->shape.rank);
    *M = ta ? a->shape.dims[1] : a->shape.dims[0];
    *K = ta ? a->shape.dims[0] : a->shape.dims[1];
    int64_t Kb = tb ? b->shape.dims[1] : b->shape.dims[0];
    *N = tb ? b->shape.dims[0] : b->shape.dims[1];
    if (*K != Kb)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "inner dimensions differ, %lld vs %lld",
                         (long long)*K, (long long)Kb);
    return true;
}

bool cpu_slice_attrs(const dg_node *n, int64_t *begin, int64_t *size, int *count, dg_status *st) {
    int nb, ns;
    const int64_t *b = graph_node_attr_ints(n, "begin", &nb);
    const int64_t *z = graph_node_attr_ints(n, "size", &ns);
    if (nb > DG_MAX_RANK || (z && ns != nb)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "slice: begin and size disagree or are too long");
        return false;
    }
    *count = nb;
    for (int i = 0; i < nb; i++) {
        begin[i] = b[i];
        size[i] = z ? z[i] : -1;
    }
    return true;
}

bool cpu_layer_norm_check(exec_ctx *ctx, const dg_tensor *x, const dg_tensor *gamma, const dg_tensor *beta,
                          const dg_tensor *dy, const dg_tensor *mean, const dg_tensor *rstd, int64_t *rows,
                          int64_t *C) {
    if (x->shape.rank < 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "x needs rank >= 1, got a scalar");
    *C = x->shape.dims[x->shape.rank - 1];
    *rows = 1;   // the leading dims' product: rows of width 0 still have a mean and an rstd
    for (int i = 0; i + 1 < x->shape.rank; i++) *rows *= x->shape.dims[i];
    const dg_tensor *vec[2] = {gamma, beta}, *row[2] = {mean, rstd};
    static const char *const vec_name[2] = {"gamma", "beta"}, *const row_name[2] = {"mean", "rstd"};
    for (int i = 0; i < 2; i++) {
        if (vec[i] && (vec[i]->shape.rank != 1 || vec[i]->shape.dims[0] != *C || vec[i]->dtype != x->dtype))
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must be a %s vector of %lld elements (x's last dimension)",
                             vec_name[i], dg_dtype_name(x->dtype), (long long)*C);
        if (row[i] && (row[i]->n_elements != *rows || row[i]->dtype != x->dtype))
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must hold %lld %s values (one a row of x)", row_name[i],
                             (long long)*rows, dg_dtype_name(x->dtype));
    }
    if (dy && (!dg_shape_equal(&dy->shape, &x->shape) || dy->dtype != x->dtype))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "dy must have x's dtype and shape");
    return true;
}

// The mask's strides: NumPy broadcasting to [batch..., Tq, Tk], aligned at the right.
static bool attention_mask_strides(exec_ctx *ctx, const dg_tensor *mask, const dg_tensor *q, cpu_attention_dims *d) {
    d->mask = NULL;
    d->mask_row = d->mask_col = 0;
    d->n_batch_dims = q->shape.rank - 2;
    for (int i = 0; i < d->n_batch_dims; i++) {
        d->batch_dims[i] = q->shape.dims[i];
        d->mask_batch_stride[i] = 0;
    }
    if (!mask) return true;
    char a[128], b[128], c[128];
    const dg_shape *ms = &mask->shape;
    int r = q->shape.rank;
    dg_shape target = q->shape;
    target.dims[r - 1] = d->Tk;
    bool ok = mask->dtype == DG_BOOL && ms->rank <= r;
    int64_t stride = 1;
    for (int i = ms->rank - 1; ok && i >= 0; i--) {
        int t = r - ms->rank + i;
        int64_t m = ms->dims[i];
        ok = m == 1 || m == target.dims[t];
        int64_t s = m == 1 ? 0 : stride;
        if (t == r - 1) d->mask_col = s;
        else if (t == r - 2) d->mask_row = s;
        else d->mask_batch_stride[t] = s;
        stride *= m;
    }
    if (!ok)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "the mask %s %s does not broadcast to [..., Tq, Tk] = %s (q %s); "
                         "it must be bool", dg_dtype_name(mask->dtype), dg_shape_str(ms, a, sizeof a),
                         dg_shape_str(&target, b, sizeof b), dg_shape_str(&q->shape, c, sizeof c));
    d->mask = mask->data;
    return true;
}

int64_t cpu_attention_mask_base(const cpu_attention_dims *d, int64_t b) {
    int64_t off = 0;
    for (int i = d->n_batch_dims - 1; i >= 0; i--) {
        int64_t n = d->batch_dims[i] > 0 ? d->batch_dims[i] : 1;
        off += (b % n) * d->mask_batch_stride[i];
        b /= n;
    }
    return off;
}

bool cpu_attention_check(exec_ctx *ctx, const dg_tensor *q, const dg_tensor *k, const dg_tensor *v,
                         const dg_tensor *mask, const dg_tensor *dout, const dg_tensor *out, const dg_tensor *lse,
                         cpu_attention_dims *d) {
    char a[128], b[128], c[128], e[128];
    const dg_shape *qs = &q->shape, *ks = &k->shape, *vs = &v->shape;
    int r = qs->rank;
    bool ok = r >= 2 && ks->rank == r && vs->rank == r && k->dtype == q->dtype && v->dtype == q->dtype;
    d->batches = 1;
    for (int i = 0; ok && i < r - 2; i++) {
        ok = ks->dims[i] == qs->dims[i] && vs->dims[i] == qs->dims[i];
        d->batches *= qs->dims[i];
    }
    ok = ok && ks->dims[r - 1] == qs->dims[r - 1] && vs->dims[r - 2] == ks->dims[r - 2];
    if (!ok)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "q %s %s, k %s %s and v %s %s must be one dtype, [..., Tq, D], "
                         "[..., Tk, D] and [..., Tk, Dv] with the same batch dimensions", dg_dtype_name(q->dtype),
                         dg_shape_str(qs, a, sizeof a), dg_dtype_name(k->dtype), dg_shape_str(ks, b, sizeof b),
                         dg_dtype_name(v->dtype), dg_shape_str(vs, c, sizeof c));
    d->Tq = qs->dims[r - 2];
    d->Tk = ks->dims[r - 2];
    d->D = qs->dims[r - 1];
    d->Dv = vs->dims[r - 1];
    d->out = *qs;
    d->out.dims[r - 1] = d->Dv;
    d->lse = *qs;
    d->lse.rank--;
    const dg_tensor *t[3] = {dout, out, lse};
    const dg_shape *want[3] = {&d->out, &d->out, &d->lse};
    static const char *const name[3] = {"dout", "out", "lse"};
    for (int i = 0; i < 3; i++)
        if (t[i] && (t[i]->dtype != q->dtype || !dg_shape_equal(&t[i]->shape, want[i])))
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s is %s %s, q %s and v %s need %s %s", name[i],
                             dg_dtype_name(t[i]->dtype), dg_shape_str(&t[i]->shape, a, sizeof a),
                             dg_shape_str(qs, b, sizeof b), dg_shape_str(vs, c, sizeof c), dg_dtype_name(q->dtype),
                             dg_shape_str(want[i], e, sizeof e));
    return attention_mask_strides(ctx, mask, q, d);
}

double cpu_attention_scale(double attr, int64_t D) { return attr > 0 ? attr : D > 0 ? 1 / sqrt((double)D) : 1; }

bool cpu_bmm_plan_make(exec_ctx *ctx, const dg_tensor *x, const dg_tensor *y, bool adj_x, bool adj_y,
                       cpu_bmm_plan *p) {
    char a[128], b[128];
    const dg_shape *xs = &x->shape, *ys = &y->shape;
    if (xs->rank < 2 || ys->rank < 2 || x->dtype != y->dtype)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "x %s %s and y %s %s must be of one dtype and rank >= 2",
                         dg_dtype_name(x->dtype), dg_shape_str(xs, a, sizeof a), dg_dtype_name(y->dtype),
                         dg_shape_str(ys, b, sizeof b));
    int rx = xs->rank, ry = ys->rank;
    p->lda = xs->dims[rx - 1];
    p->ldb = ys->dims[ry - 1];
    p->M = adj_x ? xs->dims[rx - 1] : xs->dims[rx - 2];
    p->K = adj_x ? xs->dims[rx - 2] : xs->dims[rx - 1];
    int64_t ky = adj_y ? ys->dims[ry - 1] : ys->dims[ry - 2];
    p->N = adj_y ? ys->dims[ry - 2] : ys->dims[ry - 1];
    if (ky != p->K)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "inner dimensions differ, %lld vs %lld (x %s, y %s)",
                         (long long)p->K, (long long)ky, dg_shape_str(xs, a, sizeof a), dg_shape_str(ys, b, sizeof b));
    dg_shape xb = *xs, yb = *ys, ob;
    xb.rank -= 2;
    yb.rank -= 2;
    dg_status *st = ctx->st;
    if (!graph_broadcast_shapes(xb, yb, &ob, st)) {
        dg_status_prepend(st, "batch dimensions of x %s and y %s", dg_shape_str(xs, a, sizeof a),
                          dg_shape_str(ys, b, sizeof b));
        return false;
    }
    // Strides (in matrices) of x's and y's batch dims, aligned to the right of the output's.
    if (!cpu_broadcast_strides(&xb, &ob, p->xs) || !cpu_broadcast_strides(&yb, &ob, p->ys))
        return exec_fail(ctx, DG_INTERNAL, "batch dimensions do not broadcast");
    p->nb = ob.rank;
    p->batches = 1;
    for (int i = 0; i < ob.rank; i++) {
        p->bdims[i] = ob.dims[i];
        p->batches *= ob.dims[i];
    }
    p->out = ob;
    p->out.dims[p->out.rank++] = p->M;
    p->out.dims[p->out.rank++] = p->N;
    return true;
}

void cpu_bmm_offsets(const cpu_bmm_plan *p, int64_t b, int64_t *xo, int64_t *yo) {
    int64_t mx = 0, my = 0;
    for (int i = p->nb - 1; i >= 0; i--) {
        int64_t c = b % p->bdims[i];
        b /= p->bdims[i];
        mx += c * p->xs[i];
        my += c * p->ys[i];
    }
    *xo = mx * p->M * p->K;
    *yo = my * p->K * p->N;
}
