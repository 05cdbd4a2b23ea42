/* CPU kernels of the array ops of graph/op_defs_array.c: Transpose, Tile, StopGradient,
 * Select (with NumPy broadcasting) and OneHot. Each walks its output in row-major order with
 * a counter per dimension and moves whole elements (any dtype). */
#include <stdlib.h>

#include "cpu_impl.h"

// Moves to the next output index; each input offset follows its strides. rank 0: one element.
static inline void step_index(int rank, const int64_t *dims, int64_t *idx, int n_in, int64_t (*strides)[DG_MAX_RANK],
                              int64_t *off) {
    for (int k = rank - 1; k >= 0; k--) {
        for (int i = 0; i < n_in; i++) off[i] += strides[i][k];
        if (++idx[k] < dims[k]) return;
        for (int i = 0; i < n_in; i++) off[i] -= strides[i][k] * dims[k];
        idx[k] = 0;
    }
}

static void copy_elem(void *dst, const void *src, size_t es) {
    if (es == 4)
        *(uint32_t *)dst = *(const uint32_t *)src;
    else if (es == 8)
        *(uint64_t *)dst = *(const uint64_t *)src;
    else
        memcpy(dst, src, es);
}

// perm or multiples: an int vector of x's rank.
static bool read_vector(exec_ctx *ctx, const char *what, int rank, int64_t *v) {
    int n = 0;
    if (!cpu_read_dims(IN(1), v, &n, DG_MAX_RANK) || n != rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must be an int vector of %d entries (the input's rank)", what, rank);
    return true;
}

bool cpu_transpose_plan(exec_ctx *ctx, dg_shape *out, int64_t *src_strides) {
    const dg_tensor *x = IN(0);
    int64_t perm[DG_MAX_RANK], xs[DG_MAX_RANK];
    if (!read_vector(ctx, "perm", x->shape.rank, perm)) return false;
    if (!graph_check_perm(perm, x->shape.rank, x->shape.rank, ctx->st)) {
        dg_status_prepend(ctx->st, "node \"%s\" (Transpose)", ctx->node->name);
        return false;
    }
    cpu_strides(&x->shape, xs);
    *out = x->shape;
    for (int k = 0; k < x->shape.rank; k++) {
        out->dims[k] = x->shape.dims[perm[k]];
        src_strides[k] = xs[perm[k]];
    }
    return true;
}

static bool transpose_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *x = IN(0);
    dg_shape os;
    int64_t strides[1][DG_MAX_RANK];
    if (!cpu_transpose_plan(ctx, &os, strides[0])) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, os);
    if (!o) return false;
    size_t es = dg_dtype_size(x->dtype);
    if (o->n_elements == 0) return true;
    if (os.rank == 0) {
        memcpy(o->data, x->data, es);
        return true;
    }
    // A row of the output's last dimension at a time: one copy when it is contiguous in x
    // (the last axis stays last, as in [B, T, H, D] -> [B, H, T, D]), else a strided loop.
    int r = os.rank;
    int64_t inner = os.dims[r - 1], step = strides[0][r - 1], rows = o->n_elements / inner;
    int64_t idx[DG_MAX_RANK] = {0}, off = 0;
    for (int64_t row = 0; row < rows; row++) {
        const char *src = (const char *)x->data + (size_t)off * es;
        char *dst = (char *)o->data + (size_t)(row * inner) * es;
        if (step == 1)
            memcpy(dst, src, (size_t)inner * es);
        else if (es == 4)
            for (int64_t j = 0; j < inner; j++) ((uint32_t *)dst)[j] = *(const uint32_t *)(src + (size_t)(j * step) * 4);
        else if (es == 8)
            for (int64_t j = 0; j < inner; j++) ((uint64_t *)dst)[j] = *(const uint64_t *)(src + (size_t)(j * step) * 8);
        else
            for (int64_t j = 0; j < inner; j++) copy_elem(dst + (size_t)j * es, src + (size_t)(j * step) * es, es);
        step_index(r - 1, os.dims, idx, 1, strides, &off);
    }
    return true;
}

// Range: the length as the graph computes it, then start + i * delta (ints in int64).
static bool range_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *in[3] = {IN(0), IN(1), IN(2)};
    dg_dtype t = in[0]->dtype;
    for (int i = 0; i < 3; i++)
        if (in[i]->n_elements != 1 || in[i]->dtype != t)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "start, limit and delta must be scalars of one dtype");
    double v[3];
    for (int i = 0; i < 3; i++) v[i] = dg_tensor_get_as_double(in[i], 0);
    bool ints = t == DG_INT32 || t == DG_INT64;
    int64_t n = 0;
    if (!graph_range_size(v[0], v[1], v[2], ints, &n, ctx->st)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, t, dg_shape1(n));
    if (!o) return false;
    if (ints) {
        int64_t s = t == DG_INT32 ? dg_tensor_i32(in[0])[0] : dg_tensor_i64(in[0])[0];
        int64_t d = t == DG_INT32 ? dg_tensor_i32(in[2])[0] : dg_tensor_i64(in[2])[0];
        for (int64_t i = 0; i < n; i++) {
            if (t == DG_INT32) dg_tensor_i32(o)[i] = (int32_t)(s + i * d);
            else dg_tensor_i64(o)[i] = s + i * d;
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            if (t == DG_FLOAT32) dg_tensor_f32(o)[i] = (float)(v[0] + (double)i * v[2]);
            else dg_tensor_f64(o)[i] = v[0] + (double)i * v[2];
        }
    }
    return true;
}

bool cpu_tile_shape(exec_ctx *ctx, dg_shape *out) {
    const dg_tensor *x = IN(0);
    int64_t m[DG_MAX_RANK];
    int r = x->shape.rank;
    if (!read_vector(ctx, "multiples", r, m)) return false;
    *out = x->shape;
    for (int k = 0; k < r; k++) {
        if (m[k] < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "multiples[%d] is %lld (must be >= 0)", k, (long long)m[k]);
        if (m[k] > 0 && x->shape.dims[k] > INT64_MAX / m[k] / 2)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "multiples[%d] = %lld overflows the output", k, (long long)m[k]);
        out->dims[k] = x->shape.dims[k] * m[k];
    }
    return true;
}

static bool tile_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *x = IN(0);
    int64_t xs[DG_MAX_RANK];
    int r = x->shape.rank;
    dg_shape os;
    if (!cpu_tile_shape(ctx, &os)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    cpu_strides(&x->shape, xs);
    size_t es = dg_dtype_size(x->dtype);
    // Output index i_k reads x at i_k mod d_k.
    int64_t idx[DG_MAX_RANK] = {0};
    for (int64_t i = 0; i < o->n_elements; i++) {
        int64_t off = 0;
        for (int k = 0; k < r; k++) off += (idx[k] % x->shape.dims[k]) * xs[k];
        copy_elem((char *)o->data + (size_t)i * es, (const char *)x->data + (size_t)off * es, es);
        for (int k = r - 1; k >= 0; k--) {
            if (++idx[k] < os.dims[k]) break;
            idx[k] = 0;
        }
    }
    return true;
}

bool cpu_select_plan(exec_ctx *ctx, dg_shape *out, int64_t (*strides)[DG_MAX_RANK]) {
    const dg_tensor *c = IN(0), *t = IN(1), *e = IN(2);
    dg_shape a;
    dg_status *st = ctx->st;
    if (c->dtype != DG_BOOL || t->dtype != e->dtype)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "the condition must be bool and the two values of one dtype");
    if (!graph_broadcast_shapes(t->shape, e->shape, &a, st) || !graph_broadcast_shapes(c->shape, a, out, st))
        return false;   // the executor names the node
    if (!cpu_broadcast_strides(&c->shape, out, strides[0]) || !cpu_broadcast_strides(&t->shape, out, strides[1]) ||
        !cpu_broadcast_strides(&e->shape, out, strides[2]))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "inputs do not broadcast together");
    return true;
}

static bool select_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *c = IN(0), *t = IN(1), *e = IN(2);
    dg_shape os;
    int64_t strides[3][DG_MAX_RANK];
    if (!cpu_select_plan(ctx, &os, strides)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, t->dtype, os);
    if (!o) return false;
    size_t es = dg_dtype_size(t->dtype);
    const uint8_t *cond = c->data;
    int64_t idx[DG_MAX_RANK] = {0}, off[3] = {0, 0, 0};
    for (int64_t i = 0; i < o->n_elements; i++) {
        const char *src = cond[off[0]] ? (const char *)t->data + (size_t)off[1] * es : (const char *)e->data + (size_t)off[2] * es;
        copy_elem((char *)o->data + (size_t)i * es, src, es);
        step_index(os.rank, os.dims, idx, 3, strides, off);
    }
    return true;
}

bool cpu_one_hot_shape(exec_ctx *ctx, dg_shape *out) {
    const dg_tensor *ix = IN(0), *on = IN(2), *off = IN(3);
    if (IN(1)->n_elements != 1 || on->n_elements != 1 || off->n_elements != 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "depth, on_value and off_value must be scalars");
    int64_t depth = (int64_t)dg_tensor_get_as_double(IN(1), 0);
    if (depth < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "depth is %lld (must be >= 0)", (long long)depth);
    if (ix->shape.rank >= DG_MAX_RANK)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "indices of rank %d: the result would pass rank %d", ix->shape.rank,
                         DG_MAX_RANK);
    *out = ix->shape;
    out->rank++;
    out->dims[ix->shape.rank] = depth;
    return true;
}

static bool one_hot_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *ix = IN(0), *on = IN(2), *off = IN(3);
    dg_shape os;
    if (!cpu_one_hot_shape(ctx, &os)) return false;
    int64_t depth = os.dims[os.rank - 1];
    dg_tensor *o = exec_alloc_output(ctx, 0, on->dtype, os);
    if (!o) return false;
    double v_on = dg_tensor_get_as_double(on, 0), v_off = dg_tensor_get_as_double(off, 0);
    for (int64_t i = 0; i < ix->n_elements; i++) {
        int64_t k = ix->dtype == DG_INT32 ? ((const int32_t *)ix->data)[i] : ((const int64_t *)ix->data)[i];
        for (int64_t j = 0; j < depth; j++) {
            double v = j == k ? v_on : v_off;
            if (o->dtype == DG_FLOAT32)
                F32(o)[i * depth + j] = (float)v;
            else
                F64(o)[i * depth + j] = v;
        }
    }
    return true;
}

#define K(op, mask, compute) {op, "CPU", mask, cpu_no_state, compute, NULL, false, false, false, NULL, false}

const exec_kernel_def cpu_index_kernels[] = {
    K("Range", DT_NUMERIC, range_compute),
    K("Transpose", DT_STORAGE, transpose_compute),
    K("Tile", DT_ALL, tile_compute),
    K("StopGradient", DT_STORAGE, cpu_identity_compute),
    // Chosen by input 0's dtype: the condition's, and the indices'.
    K("Select", DT_BIT(DG_BOOL), select_compute),
    K("OneHot", DT_BIT(DG_INT32) | DT_BIT(DG_INT64), one_hot_compute),
};
const int cpu_n_index_kernels = sizeof cpu_index_kernels / sizeof cpu_index_kernels[0];
