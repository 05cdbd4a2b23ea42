/* CPU kernels of the embedding and sparse ops (graph/op_defs_sparse.c): Gather,
 * UnsortedSegmentSum, ScatterAdd/Sub/Update, SparseApplyAdagrad, SparseApplyAdam,
 * DynamicPartition, DynamicStitch and EmbeddingPartitionIds. Every index is checked before
 * anything is written, so a bad index fails the step and leaves variables as they were. */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"
#include "exec_kernel_registry_impl.h"

// Index i of an int32 or int64 tensor.
static inline int64_t index_at(const dg_tensor *t, int64_t i) {
    return t->dtype == DG_INT32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
}

static bool need_ints(exec_ctx *ctx, const dg_tensor *t, const char *what) {
    if (t->dtype == DG_INT32 || t->dtype == DG_INT64) return true;
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must be int32 or int64, got %s", what, dg_dtype_name(t->dtype));
}

// Every index of t in [0, limit); else a failure naming the first one outside.
static bool check_indices(exec_ctx *ctx, const dg_tensor *t, int64_t limit, const char *what) {
    for (int64_t i = 0; i < t->n_elements; i++) {
        int64_t v = index_at(t, i);
        if (v < 0 || v >= limit)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s[%lld] = %lld is not in [0, %lld)", what, (long long)i,
                             (long long)v, (long long)limit);
    }
    return true;
}

// The number of elements of a row of t (its shape after the first axis).
static int64_t row_elems(const dg_tensor *t) {
    int64_t r = 1;
    for (int k = 1; k < t->shape.rank; k++) r *= t->shape.dims[k];
    return r;
}

// rows (shape: indices' shape then the row shape of table) checked against table and indices.
static bool check_rows(exec_ctx *ctx, const dg_tensor *table, const dg_tensor *indices, const dg_tensor *rows,
                       const char *what) {
    bool ok = rows->dtype == table->dtype && rows->shape.rank == indices->shape.rank + table->shape.rank - 1;
    for (int k = 0; ok && k < indices->shape.rank; k++) ok = rows->shape.dims[k] == indices->shape.dims[k];
    for (int k = 1; ok && k < table->shape.rank; k++) ok = rows->shape.dims[indices->shape.rank + k - 1] == table->shape.dims[k];
    if (ok) return true;
    char a[128], b[128], c[128];
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s is %s %s; indices %s into %s %s need one row per index", what,
                     dg_dtype_name(rows->dtype), dg_shape_str(&rows->shape, a, sizeof a),
                     dg_shape_str(&indices->shape, b, sizeof b), dg_dtype_name(table->dtype),
                     dg_shape_str(&table->shape, c, sizeof c));
}

static bool need_table(exec_ctx *ctx, const dg_tensor *t, const char *what) {
    if (t && t->shape.rank >= 1) return true;
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s must have rank >= 1 (rows)", what);
}

// ---- Gather ----

bool cpu_gather_shape(exec_ctx *ctx, dg_shape *out) {
    const dg_tensor *p = IN(0), *idx = IN(1);
    if (!need_table(ctx, p, "params") || !need_ints(ctx, idx, "indices")) return false;
    if (idx->shape.rank + p->shape.rank - 1 > DG_MAX_RANK)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "the result would pass rank %d", DG_MAX_RANK);
    int64_t rows = p->shape.dims[0];
    if (!check_indices(ctx, idx, rows, "indices")) return false;
    *out = idx->shape;
    for (int k = 1; k < p->shape.rank; k++) out->dims[out->rank++] = p->shape.dims[k];
    return true;
}

static bool gather_compute(void *state, exec_ctx *ctx) {
    (void)state;
    const dg_tensor *p = IN(0), *idx = IN(1);
    dg_shape os;
    if (!cpu_gather_shape(ctx, &os)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, p->dtype, os);
    if (!o) return false;
    size_t row = (size_t)row_elems(p) * dg_dtype_size(p->dtype);
    for (int64_t i = 0; i < idx->n_elements; i++)
        memcpy((char *)o->data + (size_t)i * row, (const char *)p->data + (size_t)index_at(idx, i) * row, row);
    return true;
}

// ---- UnsortedSegmentSum ----

#define SEGMENT_SUM(T)                                                                        \
    do {                                                                                      \
        T *y = o->data;                                                                       \
        const T *x = d->data;                                                                 \
        for (int64_t i = 0; i < ids->n_elements; i++) {                                       \
            T *dst = y + index_at(ids, i) * r;                                                \
            const T *src = x + i * r;                                                         \
            for (int64_t k = 0; k < r; k++) dst[k] += src[k];                                 \
        }                                                                                     \
    } while (0)

bool cpu_segment_sum_shape(exec_ctx *ctx, dg_shape *out) {
    const dg_tensor *d = IN(0), *ids = IN(1), *num = IN(2);
    if (!need_table(ctx, d, "data") || !need_ints(ctx, ids, "segment_ids") || !need_ints(ctx, num, "num_segments"))
        return false;
    if (ids->shape.rank != 1 || ids->shape.dims[0] != d->shape.dims[0] || num->n_elements != 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "segment_ids must hold one id per row of data (%lld) and "
                         "num_segments one value", (long long)d->shape.dims[0]);
    int64_t n = index_at(num, 0);
    if (n < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "num_segments is %lld", (long long)n);
    if (!check_indices(ctx, ids, n, "segment_ids")) return false;
    *out = d->shape;
    out->dims[0] = n;
    return true;
}

static bool segment_sum_compute(void *state, exec_ctx *ctx) {
    (void)state;
    const dg_tensor *d = IN(0), *ids = IN(1);
    dg_shape os;
    if (!cpu_segment_sum_shape(ctx, &os)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, d->dtype, os);
    if (!o) return false;
    memset(o->data, 0, o->nbytes);
    int64_t r = row_elems(d);
    if (d->dtype == DG_FLOAT32)
        SEGMENT_SUM(float);
    else
        SEGMENT_SUM(double);
    return true;
}

// ---- ScatterAdd, ScatterSub, ScatterUpdate ----

typedef enum scatter_op { SCATTER_ADD, SCATTER_SUB, SCATTER_UPDATE } scatter_op;

static void *scatter_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    (void)st;
    const char *op = n->op->name;
    return (void *)(intptr_t)(1 + (strcmp(op, "ScatterAdd") == 0   ? SCATTER_ADD
                                   : strcmp(op, "ScatterSub") == 0 ? SCATTER_SUB
                                                                   : SCATTER_UPDATE));
}

#define SCATTER(T)                                                                            \
    do {                                                                                      \
        T *w = var->data;                                                                     \
        const T *u = up->data;                                                                \
        for (int64_t i = 0; i < idx->n_elements; i++) {                                       \
            T *dst = w + index_at(idx, i) * r;                                                \
            const T *src = u + i * r;                                                         \
            if (op == SCATTER_ADD)                                                            \
                for (int64_t k = 0; k < r; k++) dst[k] += src[k];                             \
            else if (op == SCATTER_SUB)                                                       \
                for (int64_t k = 0; k < r; k++) dst[k] -= src[k];                             \
            else                                                                              \
                memcpy(dst, src, (size_t)r * sizeof *dst);                                    \
        }                                                                                     \
    } while (0)

bool cpu_scatter_check(exec_ctx *ctx) {
    const dg_tensor *var = IN(0), *idx = IN(1), *up = IN(2);
    return need_table(ctx, var, "the variable") && need_ints(ctx, idx, "indices") &&
           check_rows(ctx, var, idx, up, "updates") && check_indices(ctx, idx, var->shape.dims[0], "indices");
}

static bool scatter_compute(void *state, exec_ctx *ctx) {
    scatter_op op = (scatter_op)((intptr_t)state - 1);
    dg_tensor *var = IN(0);
    const dg_tensor *idx = IN(1), *up = IN(2);
    if (!cpu_scatter_check(ctx)) return false;
    int64_t r = row_elems(var);
    switch (var->dtype) {
    case DG_FLOAT32: SCATTER(float); break;
    case DG_FLOAT64: SCATTER(double); break;
    case DG_INT32: SCATTER(int32_t); break;
    case DG_INT64: SCATTER(int64_t); break;
    default: return exec_fail(ctx, DG_INVALID_ARGUMENT, "unsupported dtype %s", dg_dtype_name(var->dtype));
    }
    exec_set_output(ctx, 0, var);
    return true;
}

// ---- SparseApplyAdagrad, SparseApplyAdam ----

static bool same_table(exec_ctx *ctx, const dg_tensor *var, const dg_tensor *slot, const char *what) {
    if (slot && slot->dtype == var->dtype && dg_shape_equal(&slot->shape, &var->shape)) return true;
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "%s does not match the variable (dtype or shape)", what);
}

// TensorFlow's SparseApplyAdagrad, index by index in order (a repeated index updates twice):
// accum[r] += g^2; var[r] -= lr * g / sqrt(accum[r]).
#define ADAGRAD(T, SQRT)                                                                      \
    do {                                                                                      \
        T *w = var->data, *a = acc->data, l = (T)lr;                                          \
        const T *gr = grad->data;                                                             \
        for (int64_t i = 0; i < idx->n_elements; i++) {                                       \
            int64_t o = index_at(idx, i) * r;                                                 \
            for (int64_t k = 0; k < r; k++) {                                                 \
                T g = gr[i * r + k];                                                          \
                a[o + k] += g * g;                                                            \
                w[o + k] -= l * g / SQRT(a[o + k]);                                           \
            }                                                                                 \
        }                                                                                     \
    } while (0)

bool cpu_sparse_adagrad_check(exec_ctx *ctx) {
    const dg_tensor *var = IN(0), *acc = IN(1), *grad = IN(3), *idx = IN(4);
    if (!need_table(ctx, var, "the variable") || !same_table(ctx, var, acc, "accum") || !need_ints(ctx, idx, "indices"))
        return false;
    if (idx->shape.rank != 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "indices must be a vector");
    return check_rows(ctx, var, idx, grad, "grad") && check_indices(ctx, idx, var->shape.dims[0], "indices");
}

static bool sparse_adagrad_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *var = IN(0), *acc = IN(1);
    const dg_tensor *grad = IN(3), *idx = IN(4);
    if (!cpu_sparse_adagrad_check(ctx)) return false;
    double lr = dg_tensor_get_as_double(IN(2), 0);
    int64_t r = row_elems(var);
    if (var->dtype == DG_FLOAT32)
        ADAGRAD(float, sqrtf);
    else
        ADAGRAD(double, sqrt);
    exec_set_output(ctx, 0, var);
    return true;
}

// TensorFlow's SparseApplyMomentum, index by index in order (a repeated index updates twice):
// accum[r] = accum[r] * momentum + g; var[r] -= lr * accum[r], or with use_nesterov var[r] -=
// g * lr + accum[r] * momentum * lr (the dense ApplyMomentum's expressions). Rows not in the
// batch neither decay nor move, as TensorFlow's.
#define SPARSE_MOMENTUM(T)                                                                    \
    do {                                                                                      \
        T *w = var->data, *a = acc->data, l = (T)lr, mo = (T)mom;                             \
        const T *gr = grad->data;                                                             \
        for (int64_t i = 0; i < idx->n_elements; i++) {                                       \
            int64_t o = index_at(idx, i) * r;                                                 \
            for (int64_t k = 0; k < r; k++) {                                                 \
                T g = gr[i * r + k];                                                          \
                a[o + k] = a[o + k] * mo + g;                                                 \
                w[o + k] -= nesterov ? g * l + a[o + k] * mo * l : a[o + k] * l;              \
            }                                                                                 \
        }                                                                                     \
    } while (0)

static void *sparse_momentum_create(const dg_node *n, const exec_env *env, dg_status *st) {   // use_nesterov
    (void)env;
    bool *nesterov = calloc(1, sizeof *nesterov);
    if (!nesterov) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "SparseApplyMomentum: out of memory");
        return NULL;
    }
    dg_node_attr_bool(n, "use_nesterov", nesterov);
    return nesterov;
}

static bool sparse_momentum_compute(void *state, exec_ctx *ctx) {
    bool nesterov = *(bool *)state;
    dg_tensor *var = IN(0), *acc = IN(1);
    const dg_tensor *grad = IN(3), *idx = IN(4);
    if (!cpu_sparse_adagrad_check(ctx)) return false;   // inputs 0..4 as SparseApplyAdagrad's
    double lr = dg_tensor_get_as_double(IN(2), 0), mom = dg_tensor_get_as_double(IN(5), 0);
    int64_t r = row_elems(var);
    if (var->dtype == DG_FLOAT32)
        SPARSE_MOMENTUM(float);
    else
        SPARSE_MOMENTUM(double);
    exec_set_output(ctx, 0, var);
    return true;
}

// TensorFlow 1 AdamOptimizer on a sparse gradient (_apply_sparse_shared): m = beta1 m, then
// m[indices] += (1 - beta1) g; v = beta2 v, then v[indices] += (1 - beta2) g^2 (repeated
// indices adding up); var -= lr_t m / (sqrt(v) + epsilon) with lr_t = lr sqrt(1 - beta2_power)
// / (1 - beta1_power). The decay and the step touch every row, as TensorFlow's.
#define SPARSE_ADAM(T, SQRT)                                                                  \
    do {                                                                                      \
        T *w = var->data, *m = mt->data, *v = vt->data;                                       \
        const T *gr = grad->data;                                                             \
        T b1 = (T)beta1, b2 = (T)beta2, l = (T)lr_t, e = (T)eps;                              \
        for (int64_t i = 0; i < n; i++) {                                                     \
            m[i] *= b1;                                                                       \
            v[i] *= b2;                                                                       \
        }                                                                                     \
        for (int64_t i = 0; i < idx->n_elements; i++) {                                       \
            int64_t o = index_at(idx, i) * r;                                                 \
            for (int64_t k = 0; k < r; k++) {                                                 \
                T g = gr[i * r + k];                                                          \
                m[o + k] += g * (1 - b1);                                                     \
                v[o + k] += g * g * (1 - b2);                                                 \
            }                                                                                 \
        }                                                                                     \
        for (int64_t i = 0; i < n; i++) w[i] -= l * m[i] / (SQRT(v[i]) + e);                  \
    } while (0)

bool cpu_sparse_adam_check(exec_ctx *ctx) {
    const dg_tensor *var = IN(0), *mt = IN(1), *vt = IN(2), *grad = IN(9), *idx = IN(10);
    if (!need_table(ctx, var, "the variable") || !same_table(ctx, var, mt, "m") || !same_table(ctx, var, vt, "v") ||
        !need_ints(ctx, idx, "indices"))
        return false;
    if (idx->shape.rank != 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "indices must be a vector");
    return check_rows(ctx, var, idx, grad, "grad") && check_indices(ctx, idx, var->shape.dims[0], "indices");
}

static bool sparse_adam_compute(void *state, exec_ctx *ctx) {
    (void)state;
    dg_tensor *var = IN(0), *mt = IN(1), *vt = IN(2);
    const dg_tensor *grad = IN(9), *idx = IN(10);
    if (!cpu_sparse_adam_check(ctx)) return false;
    double b1p = dg_tensor_get_as_double(IN(3), 0), b2p = dg_tensor_get_as_double(IN(4), 0);
    double lr = dg_tensor_get_as_double(IN(5), 0), beta1 = dg_tensor_get_as_double(IN(6), 0);
    double beta2 = dg_tensor_get_as_double(IN(7), 0), eps = dg_tensor_get_as_double(IN(8), 0);
    double lr_t = lr * sqrt(1 - b2p) / (1 - b1p);
    int64_t n = var->n_elements, r = row_elems(var);
    if (var->dtype == DG_FLOAT32)
        SPARSE_ADAM(float, sqrtf);
    else
        SPARSE_ADAM(double, sqrt);
    exec_set_output(ctx, 0, var);
    return true;
}

// ---- DynamicPartition, DynamicStitch ----

static bool dynamic_partition_compute(void *state, exec_ctx *ctx) {
    (void)state;
    const dg_tensor *d = IN(0), *p = IN(1);
    int np = ctx->n_outputs;
    if (p->dtype != DG_INT32 || p->shape.rank != 1 || d->shape.rank < 1 || d->shape.dims[0] != p->shape.dims[0])
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "partitions must be an int32 vector of one entry per row of data");
    int64_t *count = calloc((size_t)np, sizeof *count);
    if (!count) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "%d partitions", np);
    const int32_t *pv = p->data;
    for (int64_t i = 0; i < p->n_elements; i++) {
        if (pv[i] < 0 || pv[i] >= np) {
            free(count);
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "partitions[%lld] = %d is not in [0, %d)", (long long)i,
                             pv[i], np);
        }
        count[pv[i]]++;
    }
    size_t row = (size_t)row_elems(d) * dg_dtype_size(d->dtype);
    char **dst = calloc((size_t)np, sizeof *dst);
    bool ok = dst != NULL;
    for (int k = 0; ok && k < np; k++) {
        dg_shape s = d->shape;
        s.dims[0] = count[k];
        dg_tensor *o = exec_alloc_output(ctx, k, d->dtype, s);
        ok = o != NULL;
        if (ok) dst[k] = o->data;
    }
    for (int64_t i = 0; ok && i < p->n_elements; i++) {
        memcpy(dst[pv[i]], (const char *)d->data + (size_t)i * row, row);
        dst[pv[i]] += row;
    }
    free(dst);
    free(count);
    return ok;
}

// merged[indices[k][i]] = data[k][i]; rows no index names are zeros. The largest index must
// be below the number of indices (a deliberate difference from TensorFlow, which allows any):
// so a stray large index cannot make the kernel allocate beyond what its inputs hold.
bool cpu_dynamic_stitch_shape(exec_ctx *ctx, dg_shape *out) {
    int h = ctx->n_inputs / 2;
    const dg_tensor *d0 = IN(h);
    int64_t total = 0, max = -1;
    for (int k = 0; k < h; k++) {
        const dg_tensor *ix = IN(k), *d = IN(h + k);
        bool ok = ix->dtype == DG_INT32 && d->dtype == d0->dtype && d->shape.rank == ix->shape.rank + d0->shape.rank - IN(0)->shape.rank;
        for (int j = 0; ok && j < ix->shape.rank; j++) ok = d->shape.dims[j] == ix->shape.dims[j];
        for (int j = ix->shape.rank; ok && j < d->shape.rank; j++)
            ok = d->shape.dims[j] == d0->shape.dims[IN(0)->shape.rank + j - ix->shape.rank];
        if (!ok)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "data %d does not have one row of data 0's row shape per index "
                             "of indices %d", k, k);
        for (int64_t i = 0; i < ix->n_elements; i++) {
            int32_t v = ((const int32_t *)ix->data)[i];
            if (v < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "indices %d[%lld] = %d is negative", k, (long long)i, v);
            if (v > max) max = v;
        }
        total += ix->n_elements;
    }
    if (max >= total)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "index %lld leaves rows without a value (%lld indices in all)",
                         (long long)max, (long long)total);
    *out = dg_shape_make(1, (int64_t[]){max + 1});
    for (int j = IN(0)->shape.rank; j < d0->shape.rank; j++) out->dims[out->rank++] = d0->shape.dims[j];
    return true;
}

static bool dynamic_stitch_compute(void *state, exec_ctx *ctx) {
    (void)state;
    int h = ctx->n_inputs / 2;
    const dg_tensor *d0 = IN(h);
    dg_shape os;
    if (!cpu_dynamic_stitch_shape(ctx, &os)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, d0->dtype, os);
    if (!o) return false;
    memset(o->data, 0, o->nbytes);
    int64_t re = 1;
    for (int j = 1; j < os.rank; j++) re *= os.dims[j];
    size_t row = (size_t)re * dg_dtype_size(d0->dtype);
    for (int k = 0; k < h; k++)
        for (int64_t i = 0; i < IN(k)->n_elements; i++)
            memcpy((char *)o->data + (size_t)((const int32_t *)IN(k)->data)[i] * row,
                   (const char *)IN(h + k)->data + (size_t)i * row, row);
    return true;
}

// ---- EmbeddingPartitionIds ----

typedef struct route_state {
    int n;              // parts
    int64_t *offsets;   // n + 1
    bool mod;
} route_state;

static void route_destroy(void *state) {
    route_state *r = state;
    if (!r) return;
    free(r->offsets);
    free(r);
}

static void *route_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    const graph_attr *a = graph_node_attr(n, "offsets");
    const char *strategy = dg_node_attr_string(n, "partition_strategy");
    route_state *r = calloc(1, sizeof *r);
    if (!r) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "EmbeddingPartitionIds: out of memory");
        return NULL;
    }
    bool ok = a && a->kind == GA_INTS && a->u.ints.n >= 2 && strategy;
    if (ok) {
        r->n = a->u.ints.n - 1;
        r->mod = strcmp(strategy, "mod") == 0;
        r->offsets = malloc((size_t)(r->n + 1) * sizeof *r->offsets);
        ok = r->offsets && a->u.ints.v[0] == 0;
        for (int k = 0; ok && k <= r->n; k++) {
            r->offsets[k] = a->u.ints.v[k];
            ok = k == 0 || r->offsets[k] >= r->offsets[k - 1];
        }
    }
    if (!ok) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "EmbeddingPartitionIds: offsets must rise from 0, one per part and "
                      "the total");
        route_destroy(r);
        return NULL;
    }
    return r;
}

static bool route_compute(void *state, exec_ctx *ctx) {
    route_state *r = state;
    const dg_tensor *ids = IN(0);
    if (!need_ints(ctx, ids, "ids")) return false;
    int64_t n = ids->n_elements, total = r->offsets[r->n];
    if (n > INT32_MAX) return exec_fail(ctx, DG_INVALID_ARGUMENT, "%lld ids (at most 2^31 - 1)", (long long)n);
    if (!check_indices(ctx, ids, total, "ids")) return false;
    dg_shape s = dg_shape_make(1, (int64_t[]){n});
    dg_tensor *po = exec_alloc_output(ctx, 0, DG_INT32, s);
    dg_tensor *lo = po ? exec_alloc_output(ctx, 1, DG_INT64, s) : NULL;
    dg_tensor *pos = lo ? exec_alloc_output(ctx, 2, DG_INT32, s) : NULL;
    if (!pos) return false;
    int32_t *pv = po->data, *qv = pos->data;
    int64_t *lv = lo->data;
    for (int64_t i = 0; i < n; i++) {
        int64_t id = index_at(ids, i), p, local;
        if (r->mod) {
            p = id % r->n;
            local = id / r->n;
            if (local >= r->offsets[p + 1] - r->offsets[p])
                return exec_fail(ctx, DG_INVALID_ARGUMENT, "ids[%lld] = %lld falls past the end of part %lld (\"mod\" "
                                 "needs the parts TensorFlow's partitioners make)", (long long)i, (long long)id,
                                 (long long)p);
        } else {   // the part whose rows hold id: the last offset <= id
            int64_t a = 0, b = r->n;   // offsets[a] <= id < offsets[b]
            while (b - a > 1) {
                int64_t m = (a + b) / 2;
                if (r->offsets[m] <= id)
                    a = m;
                else
                    b = m;
            }
            p = a;
            local = id - r->offsets[a];
        }
        pv[i] = (int32_t)p;
        lv[i] = local;
        qv[i] = (int32_t)i;
    }
    return true;
}

#define K(op, mask, create, compute, destroy, is_ref) \
    {op, "CPU", mask, create, compute, destroy, false, is_ref, false, NULL, false}

static const exec_kernel_def sparse_kernels[] = {
    K("Gather", DT_ALL, cpu_no_state, gather_compute, NULL, false),
    K("UnsortedSegmentSum", DT_FLOATS, cpu_no_state, segment_sum_compute, NULL, false),
    K("ScatterAdd", DT_NUMERIC, scatter_create, scatter_compute, NULL, true),
    K("ScatterSub", DT_NUMERIC, scatter_create, scatter_compute, NULL, true),
    K("ScatterUpdate", DT_NUMERIC, scatter_create, scatter_compute, NULL, true),
    K("SparseApplyAdagrad", DT_FLOATS, cpu_no_state, sparse_adagrad_compute, NULL, true),
    K("SparseApplyAdam", DT_FLOATS, cpu_no_state, sparse_adam_compute, NULL, true),
    K("SparseApplyMomentum", DT_FLOATS, sparse_momentum_create, sparse_momentum_compute, free, true),
    K("DynamicPartition", DT_ALL, cpu_no_state, dynamic_partition_compute, NULL, false),
    K("DynamicStitch", DT_BIT(DG_INT32), cpu_no_state, dynamic_stitch_compute, NULL, false),
    K("EmbeddingPartitionIds", DT_BIT(DG_INT32) | DT_BIT(DG_INT64), route_create, route_compute, route_destroy, false),
};

void cpu_register_sparse_kernels(void) {
    exec_register_kernels(sparse_kernels, (int)(sizeof sparse_kernels / sizeof sparse_kernels[0]));
}
