/* CPU kernels that move or describe data: Reshape, Shape, Fill, ZerosLike, OnesLike,
 * Concat, Split, Slice and SliceGrad. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"

bool cpu_reshape_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "shape must be an int vector of at most %d entries",
                         DG_MAX_RANK);
    int unknown = -1;
    int64_t prod = 1;
    for (int i = 0; i < rank; i++) {
        if (dims[i] == -1) {
            if (unknown >= 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "only one dimension may be -1");
            unknown = i;
        } else if (dims[i] < 0) {
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "dimension %d is %lld", i, (long long)dims[i]);
        } else {
            prod *= dims[i];
        }
    }
    if (unknown >= 0) {
        if (prod == 0 || x->n_elements % prod != 0)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "cannot reshape %lld elements with a -1 "
                             "dimension and the others multiplying to %lld", (long long)x->n_elements,
                             (long long)prod);
        dims[unknown] = x->n_elements / prod;
    } else if (prod != x->n_elements) {
        char a[128];
        dg_shape s = dg_shape_make(rank, dims);
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "cannot reshape %lld elements to %s (%lld)",
                         (long long)x->n_elements, dg_shape_str(&s, a, sizeof a), (long long)prod);
    }
    dg_tensor *v = tensor_view(x, dg_shape_make(rank, dims), ctx->st);
    if (!v) return false;
    exec_set_output(ctx, 0, v);
    dg_tensor_unref(v);
    return true;
}

bool cpu_shape_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    dg_tensor *o = exec_alloc_output(ctx, 0, DG_INT64, dg_shape1(x->shape.rank));
    if (!o) return false;
    for (int i = 0; i < x->shape.rank; i++) ((int64_t *)o->data)[i] = x->shape.dims[i];
    return true;
}

static bool fill_with(exec_ctx *ctx, dg_tensor *o, double v) {
    for (int64_t i = 0; i < o->n_elements; i++) {
        switch (o->dtype) {
        case DG_FLOAT32: F32(o)[i] = (float)v; break;
        case DG_FLOAT64: F64(o)[i] = v; break;
        case DG_INT32: ((int32_t *)o->data)[i] = (int32_t)v; break;
        case DG_INT64: ((int64_t *)o->data)[i] = (int64_t)v; break;
        default: ((uint8_t *)o->data)[i] = (uint8_t)v; break;
        }
    }
    return true;
}

static bool fill_compute(void *state, exec_ctx *ctx) {
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(0), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "dims must be an int vector of at most %d entries", DG_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "dimension %d is negative", i);
    if (IN(1)->n_elements != 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "value must be a scalar");
    dg_tensor *o = exec_alloc_output(ctx, 0, IN(1)->dtype, dg_shape_make(rank, dims));
    if (!o) return false;
    size_t es = dg_dtype_size(o->dtype);
    for (int64_t i = 0; i < o->n_elements; i++) memcpy((char *)o->data + i * (int64_t)es, IN(1)->data, es);
    return true;
}

static bool like_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    return o && fill_with(ctx, o, state == NO_STATE ? 0.0 : 1.0);
}

static void *ones_create(const dg_node *n, const exec_env *env, dg_status *st) { return (void *)2; }

// ---- Concat / Split along an axis: outer blocks of (axis size * inner) elements ----
static void *axis_create(const dg_node *n, const exec_env *env, dg_status *st) {
    int64_t *a = malloc(sizeof *a);
    if (!a) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *a = 0;
    dg_node_attr_int(n, "axis", a);
    return a;
}

static bool concat_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x0 = IN(0);
    int rank = x0->shape.rank;
    int64_t axis = *(int64_t *)state;
    if (axis < -rank || axis >= rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %lld out of range for rank %d", (long long)axis, rank);
    if (axis < 0) axis += rank;
    dg_shape os = x0->shape;
    os.dims[axis] = 0;
    for (int k = 0; k < ctx->n_inputs; k++) {
        dg_tensor *x = IN(k);
        bool same = x->shape.rank == rank && x->dtype == x0->dtype;
        for (int d = 0; d < rank && same; d++) same = d == axis || x->shape.dims[d] == x0->shape.dims[d];
        if (!same) {
            char a[128], b[128];
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d has shape %s, input 0 has %s", k,
                             dg_shape_str(&x->shape, a, sizeof a), dg_shape_str(&x0->shape, b, sizeof b));
        }
        os.dims[axis] += x->shape.dims[axis];
    }
    dg_tensor *o = exec_alloc_output(ctx, 0, x0->dtype, os);
    if (!o) return false;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= os.dims[d];
    for (int d = (int)axis + 1; d < rank; d++) inner *= os.dims[d];
    size_t es = dg_dtype_size(o->dtype);
    size_t orow = (size_t)(os.dims[axis] * inner) * es;
    size_t off = 0;
    for (int k = 0; k < ctx->n_inputs; k++) {
        dg_tensor *x = IN(k);
        size_t row = (size_t)(x->shape.dims[axis] * inner) * es;
        for (int64_t p = 0; p < outer; p++)
            memcpy((char *)o->data + (size_t)p * orow + off, (const char *)x->data + (size_t)p * row, row);
        off += row;
    }
    return true;
}

static bool split_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    int rank = x->shape.rank;
    int64_t axis = *(int64_t *)state;
    if (axis < -rank || axis >= rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %lld out of range for rank %d", (long long)axis, rank);
    if (axis < 0) axis += rank;
    int k = ctx->n_outputs;
    if (x->shape.dims[axis] % k != 0)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "dimension %lld of size %lld does not split into %d",
                         (long long)axis, (long long)x->shape.dims[axis], k);
    dg_shape ps = x->shape;
    ps.dims[axis] /= k;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= ps.dims[d];
    for (int d = (int)axis + 1; d < rank; d++) inner *= ps.dims[d];
    size_t es = dg_dtype_size(x->dtype);
    size_t row = (size_t)(ps.dims[axis] * inner) * es, xrow = row * (size_t)k;
    for (int i = 0; i < k; i++) {
        dg_tensor *o = exec_alloc_output(ctx, i, x->dtype, ps);
        if (!o) return false;
        for (int64_t p = 0; p < outer; p++)
            memcpy((char *)o->data + (size_t)p * row, (const char *)x->data + (size_t)p * xrow + (size_t)i * row, row);
    }
    return true;
}

// ---- Slice / SliceGrad: copy a box between a big and a small tensor ----
typedef struct slice_state {
    int n;
    int64_t begin[DG_MAX_RANK], size[DG_MAX_RANK];
} slice_state;

static void *slice_create(const dg_node *n, const exec_env *env, dg_status *st) {
    slice_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (!cpu_slice_attrs(n, s->begin, s->size, &s->n, st)) {
        free(s);
        return NULL;
    }
    return s;
}

// Copies between big (shape bs) and small (shape ss) at offset begin; to_small picks direction.
static void box_copy(char *big, const dg_shape *bs, char *small, const dg_shape *ss,
                     const int64_t *begin, size_t es, bool to_small) {
    int r = ss->rank;
    int64_t n = tensor_shape_elements(ss);
    if (n == 0) return;
    if (r == 0) {
        if (to_small) memcpy(small, big, es);
        else memcpy(big, small, es);
        return;
    }
    int64_t bstr[DG_MAX_RANK];
    cpu_strides(bs, bstr);
    int64_t inner = ss->dims[r - 1], rows = n / inner;
    int64_t idx[DG_MAX_RANK] = {0};
    for (int64_t row = 0; row < rows; row++) {
        int64_t off = begin[r - 1];
        for (int d = 0; d < r - 1; d++) off += (begin[d] + idx[d]) * bstr[d];
        char *bp = big + off * (int64_t)es, *sp = small + row * inner * (int64_t)es;
        if (to_small) memcpy(sp, bp, (size_t)inner * es);
        else memcpy(bp, sp, (size_t)inner * es);
        for (int d = r - 2; d >= 0; d--) {
            if (++idx[d] < ss->dims[d]) break;
            idx[d] = 0;
        }
    }
}

static bool box_check(exec_ctx *ctx, const slice_state *s, const dg_shape *big, dg_shape *small) {
    if (s->n != big->rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "slice has %d axes, input rank %d", s->n, big->rank);
    *small = dg_shape_scalar();
    small->rank = s->n;
    for (int i = 0; i < s->n; i++) {
        int64_t b = s->begin[i], z = s->size[i] < 0 ? big->dims[i] - b : s->size[i];
        if (b < 0 || z < 0 || b + z > big->dims[i])
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %d: begin %lld size %lld out of range for "
                             "dimension %lld", i, (long long)b, (long long)z, (long long)big->dims[i]);
        small->dims[i] = z;
    }
    return true;
}

static bool slice_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    dg_shape ss;
    if (!box_check(ctx, state, &x->shape, &ss)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, ss);
    if (!o) return false;
    box_copy(x->data, &x->shape, o->data, &ss, ((slice_state *)state)->begin, dg_dtype_size(x->dtype), true);
    return true;
}

static bool slice_grad_compute(void *state, exec_ctx *ctx) {
    slice_state s = *(slice_state *)state;
    dg_tensor *dy = IN(0);
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK) || rank != s.n || rank != dy->shape.rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "slice gradient: shape input disagrees with begin");
    dg_shape big = dg_shape_make(rank, dims), ss;
    for (int i = 0; i < rank; i++) s.size[i] = dy->shape.dims[i];
    if (!box_check(ctx, &s, &big, &ss)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, dy->dtype, big);
    if (!o) return false;
    memset(o->data, 0, o->nbytes);
    box_copy(o->data, &big, dy->data, &ss, s.begin, dg_dtype_size(dy->dtype), false);
    return true;
}

#define K(op, mask, create, compute, destroy) \
    {op, "CPU", mask, create, compute, destroy, false, false, false, NULL, false}

const exec_kernel_def cpu_array_kernels[] = {
    K("Reshape", DT_STORAGE, cpu_no_state, cpu_reshape_compute, NULL),
    K("Shape", DT_STORAGE, cpu_no_state, cpu_shape_compute, NULL),
    K("Fill", DT_BIT(DG_INT32) | DT_BIT(DG_INT64), cpu_no_state, fill_compute, NULL),
    K("ZerosLike", DT_ALL, cpu_no_state, like_compute, NULL),
    K("OnesLike", DT_ALL, ones_create, like_compute, NULL),
    K("Concat", DT_ALL, axis_create, concat_compute, free),
    K("Split", DT_ALL, axis_create, split_compute, free),
    K("Slice", DT_ALL, slice_create, slice_compute, free),
    K("SliceGrad", DT_ALL, slice_create, slice_grad_compute, free),
};
const int cpu_n_array_kernels = sizeof cpu_array_kernels / sizeof cpu_array_kernels[0];
