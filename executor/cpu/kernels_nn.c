/* CPU kernels for softmax, cross entropy, reductions and their gradients, and the
 * broadcasting helpers the gradients use (SumToShape, BroadcastTo). */
#include <stdio.h>
#include <stdlib.h>

#include "cpu_impl.h"

// ---- softmax family, over the last axis ----
#define SOFTMAX_ROWS(T, EXP, LOG)                                                   \
    do {                                                                            \
        const T *x = in->data;                                                      \
        T *y = o->data;                                                             \
        for (int64_t r = 0; r < rows; r++) {                                        \
            const T *xr = x + r * C;                                                \
            T *yr = y + r * C;                                                      \
            T m = xr[0];                                                            \
            for (int64_t c = 1; c < C; c++) m = xr[c] > m ? xr[c] : m;              \
            T s = 0;                                                                \
            for (int64_t c = 0; c < C; c++) s += EXP(xr[c] - m);                    \
            if (is_log) {                                                           \
                T ls = LOG(s) + m;                                                  \
                for (int64_t c = 0; c < C; c++) yr[c] = xr[c] - ls;                 \
            } else {                                                                \
                T inv = 1 / s;                                                      \
                for (int64_t c = 0; c < C; c++) yr[c] = EXP(xr[c] - m) * inv;       \
            }                                                                       \
        }                                                                           \
    } while (0)

static bool last_axis(exec_ctx *ctx, const dg_tensor *t, int64_t *rows, int64_t *C) {
    if (t->shape.rank < 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "needs rank >= 1, got a scalar");
    *C = t->shape.dims[t->shape.rank - 1];
    *rows = *C ? t->n_elements / *C : 0;
    return true;
}

static bool softmax_compute(void *state, exec_ctx *ctx) {
    bool is_log = state != NO_STATE;
    dg_tensor *in = IN(0);
    int64_t rows = 0, C = 0;
    if (!last_axis(ctx, in, &rows, &C)) return false;
    dg_tensor *o = exec_alloc_output(ctx, 0, in->dtype, in->shape);
    if (!o) return false;
    if (C == 0) return true;
    if (in->dtype == DG_FLOAT32)
        SOFTMAX_ROWS(float, expf, logf);
    else
        SOFTMAX_ROWS(double, exp, log);
    return true;
}

static void *log_softmax_create(const dg_node *n, const exec_env *env, dg_status *st) {
    return (void *)2;
}

// SoftmaxGrad(y, dy): (dy - sum(dy*y)) * y.  LogSoftmaxGrad(y, dy): dy - exp(y) * sum(dy).
#define SOFTMAX_GRAD_ROWS(T, EXP)                                                   \
    do {                                                                            \
        const T *yv = y->data, *g = dy->data;                                       \
        T *dx = o->data;                                                            \
        for (int64_t r = 0; r < rows; r++) {                                        \
            const T *yr = yv + r * C, *gr = g + r * C;                              \
            T *dr = dx + r * C;                                                     \
            T s = 0;                                                                \
            if (is_log) {                                                           \
                for (int64_t c = 0; c < C; c++) s += gr[c];                         \
                for (int64_t c = 0; c < C; c++) dr[c] = gr[c] - EXP(yr[c]) * s;     \
            } else {                                                                \
                for (int64_t c = 0; c < C; c++) s += gr[c] * yr[c];                 \
                for (int64_t c = 0; c < C; c++) dr[c] = (gr[c] - s) * yr[c];        \
            }                                                                       \
        }                                                                           \
    } while (0)

static bool softmax_grad_compute(void *state, exec_ctx *ctx) {
    bool is_log = state != NO_STATE;
    dg_tensor *y = IN(0), *dy = IN(1);
    int64_t rows = 0, C = 0;
    if (!last_axis(ctx, y, &rows, &C)) return false;
    if (!dg_shape_equal(&y->shape, &dy->shape))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "y and dy differ in shape");
    dg_tensor *o = exec_alloc_output(ctx, 0, y->dtype, y->shape);
    if (!o) return false;
    if (y->dtype == DG_FLOAT32)
        SOFTMAX_GRAD_ROWS(float, expf);
    else
        SOFTMAX_GRAD_ROWS(double, exp);
    return true;
}

// ---- cross entropy: loss [N] and backprop [N, C] = softmax - labels ----

// glibc's libmvec (2.35 on) has vector exp and expf, which <math.h> declares only under
// -ffast-math; declared here, the row's exponentials run 8 or 16 at a time.
#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 35))
__attribute__((simd("notinbranch"))) float expf(float);
__attribute__((simd("notinbranch"))) double exp(double);
#endif

// One row of logits: *m its maximum, br[c] = exp(xr[c] - m), and the sum of those returned
// (the maximum and the sum in lanes, cpu_impl.h, so that they vectorize too).
#define XENT_EXP_ROW(T, EXP)                                                                     \
    CPU_CLONES static T xent_exp_row_##T(const T *xr, T *br, int64_t C, T *m_out) {              \
        T m = cpu_max_##T(xr, C);                                                                \
        for (int64_t c = 0; c < C; c++) br[c] = EXP(xr[c] - m);                                  \
        *m_out = m;                                                                              \
        return (T)cpu_sum_##T(br, C);                                                            \
    }
XENT_EXP_ROW(float, expf)
XENT_EXP_ROW(double, exp)

#define XENT_ROWS(T, EXP, LOG, LABEL_P, LABEL_ID)                                       \
    do {                                                                                \
        const T *x = logits->data;                                                      \
        T *loss = o0->data, *bp = o1->data;                                             \
        for (int64_t r = 0; r < N; r++) {                                               \
            const T *xr = x + r * C;                                                    \
            T *br = bp + r * C;                                                         \
            T m, s = xent_exp_row_##T(xr, br, C, &m);                                   \
            T ls = LOG(s), inv = 1 / s, l = 0;                                          \
            if (sparse) {                                                               \
                int64_t id = LABEL_ID(r);                                               \
                if (id < 0 || id >= C)                                                  \
                    return exec_fail(ctx, DG_INVALID_ARGUMENT, "label %lld at row %lld is " \
                                     "outside [0, %lld)", (long long)id, (long long)r,  \
                                     (long long)C);                                     \
                for (int64_t c = 0; c < C; c++) br[c] *= inv;                           \
                br[id] -= 1;                                                            \
                l = ls - (xr[id] - m);                                                  \
            } else {                                                                    \
                for (int64_t c = 0; c < C; c++) {                                       \
                    T p = LABEL_P(r, c);                                                \
                    l += p * (ls - (xr[c] - m));                                        \
                    br[c] = br[c] * inv - p;                                            \
                }                                                                       \
            }                                                                           \
            loss[r] = l;                                                                \
        }                                                                               \
    } while (0)

static bool xent_compute(void *state, exec_ctx *ctx) {
    bool sparse = state != NO_STATE;
    dg_tensor *logits = IN(0), *labels = IN(1);
    if (logits->shape.rank != 2)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "logits must be a matrix, got rank %d",
                         logits->shape.rank);
    int64_t N = logits->shape.dims[0], C = logits->shape.dims[1];
    if (sparse ? (labels->shape.rank != 1 || labels->shape.dims[0] != N)
               : !dg_shape_equal(&labels->shape, &logits->shape)) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "labels %s do not match logits %s",
                         dg_shape_str(&labels->shape, a, sizeof a), dg_shape_str(&logits->shape, b, sizeof b));
    }
    if (C == 0 && N > 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "logits have zero classes");
    dg_tensor *o0 = exec_alloc_output(ctx, 0, logits->dtype, dg_shape1(N));
    dg_tensor *o1 = o0 ? exec_alloc_output(ctx, 1, logits->dtype, logits->shape) : NULL;
    if (!o1) return false;
    const int32_t *l32 = labels->data;
    const int64_t *l64 = labels->data;
    bool is32 = labels->dtype == DG_INT32;
#define LID(r) (is32 ? (int64_t)l32[r] : l64[r])
#define LP32(r, c) (((const float *)labels->data)[(r) * C + (c)])
#define LP64(r, c) (((const double *)labels->data)[(r) * C + (c)])
    if (logits->dtype == DG_FLOAT32)
        XENT_ROWS(float, expf, logf, LP32, LID);
    else
        XENT_ROWS(double, exp, log, LP64, LID);
    return true;
}

static void *sparse_create(const dg_node *n, const exec_env *env, dg_status *st) { return (void *)2; }

// ---- reductions ----
typedef struct reduce_state {
    int kind;   // 0 sum, 1 mean, 2 max
    bool keep;
    int n_axes;
    int64_t axes[DG_MAX_RANK];
    bool all;
} reduce_state;

static void *reduce_create(const dg_node *n, const exec_env *env, dg_status *st) {
    reduce_state *r = calloc(1, sizeof *r);
    if (!r) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    const char *op = n->op->name;
    r->kind = strcmp(op, "Mean") == 0 ? 1 : strcmp(op, "Max") == 0 ? 2 : 0;
    if (strcmp(op, "SumGrad") == 0) {
        bool mean = false;
        dg_node_attr_bool(n, "mean", &mean);
        r->kind = mean ? 1 : 0;
    }
    dg_node_attr_bool(n, "keep_dims", &r->keep);
    int count;
    const int64_t *axes = graph_node_attr_ints(n, "axes", &count);
    if (count > DG_MAX_RANK) {
        free(r);
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%d reduction axes is more than rank %d", count, DG_MAX_RANK);
        return NULL;
    }
    r->all = count == 0;
    r->n_axes = count;
    for (int i = 0; i < count; i++) r->axes[i] = axes[i];
    return r;
}

static bool mask_of(exec_ctx *ctx, const reduce_state *r, int rank, uint32_t *mask) {
    return cpu_axes_mask(ctx, r->all, r->axes, r->n_axes, rank, mask);
}

static dg_shape reduced_shape(const dg_shape *x, uint32_t mask, bool keep) {
    return cpu_reduced_shape(x, mask, keep);
}

static dg_shape keep_shape(const dg_shape *x, uint32_t mask) { return reduced_shape(x, mask, true); }

#define REDUCE_LOOP(T, INIT, ACC)                                                        \
    do {                                                                                 \
        const T *x = in->data;                                                           \
        T *y = o->data;                                                                  \
        for (int64_t i = 0; i < o->n_elements; i++) y[i] = INIT;                         \
        int64_t os[DG_MAX_RANK], ks[DG_MAX_RANK];                                        \
        cpu_strides(&ksh, ks);                                                           \
        for (int d = 0; d < rank; d++) os[d] = (mask & (1u << d)) ? 0 : ks[d];           \
        int64_t idx[DG_MAX_RANK] = {0}, off = 0;                                         \
        for (int64_t i = 0; i < in->n_elements; i++) {                                   \
            ACC(y[off], x[i]);                                                           \
            for (int k = rank - 1; k >= 0; k--) {                                        \
                if (++idx[k] < in->shape.dims[k]) {                                      \
                    off += os[k];                                                        \
                    break;                                                               \
                }                                                                        \
                off -= os[k] * (idx[k] - 1);                                             \
                idx[k] = 0;                                                              \
            }                                                                            \
        }                                                                                \
    } while (0)
#define ACC_SUM(a, b) ((a) += (b))
#define ACC_MAX(a, b) ((a) = (b) > (a) ? (b) : (a))

// Sums over the trailing axes (each output the sum of `count` adjacent inputs) in float64 lanes
// (cpu_sum_*, cpu_impl.h), where the odometer loop above adds one element at a time (a
// gradient's squared norm for clipping took 60 us that way); over the leading axes, whole rows
// added in the odometer's order. Each output is divided by div (Mean's count, or 1).
#define SUM_ROWS(T)                                                                              \
    CPU_CLONES static void sum_rows_##T(const T *x, T *y, int64_t groups, int64_t count, double div) { \
        for (int64_t g = 0; g < groups; g++, x += count) y[g] = (T)(cpu_sum_##T(x, count) / div); \
    }                                                                                            \
    CPU_CLONES static void sum_cols_##T(const T *x, T *y, int64_t outer, int64_t inner, double div) { \
        memset(y, 0, (size_t)inner * sizeof *y);                                                 \
        for (int64_t i = 0; i < outer; i++, x += inner)                                          \
            for (int64_t j = 0; j < inner; j++) y[j] += x[j];                                    \
        if (div != 1)                                                                            \
            for (int64_t j = 0; j < inner; j++) y[j] /= (T)div;                                  \
    }
SUM_ROWS(float)
SUM_ROWS(double)

// A float Sum or Mean (mean: divide by the count) whose reduced axes are the last ones or the
// first ones: the loops above. False: the odometer loop's case.
static bool reduce_sum_fast(const dg_tensor *in, uint32_t mask, bool mean, dg_tensor *o) {
    int rank = in->shape.rank, k = 0;
    if ((in->dtype != DG_FLOAT32 && in->dtype != DG_FLOAT64) || rank == 0 || o->n_elements == 0 ||
        in->n_elements == 0)
        return false;
    while (k < rank && !(mask & (1u << k))) k++;       // first reduced axis
    int e = k;
    while (e < rank && (mask & (1u << e))) e++;         // one past the last of that run
    if (e != rank && k != 0) return false;              // neither a suffix nor a prefix
    if (e != rank && (mask >> e)) return false;         // a prefix run then more reduced axes
    int64_t outer = 1, inner = 1, split = e == rank ? k : e;
    for (int d = 0; d < rank; d++) {
        if (d < split) outer *= in->shape.dims[d];
        else inner *= in->shape.dims[d];
    }
    bool f32 = in->dtype == DG_FLOAT32;
    if (e == rank) {   // the last axes from k: outer groups of inner elements
        double div = mean ? (double)inner : 1;
        if (f32) sum_rows_float(in->data, o->data, outer, inner, div);
        else sum_rows_double(in->data, o->data, outer, inner, div);
    } else {           // the first e axes: outer rows of inner elements each, summed
        double div = mean ? (double)outer : 1;
        if (f32) sum_cols_float(in->data, o->data, outer, inner, div);
        else sum_cols_double(in->data, o->data, outer, inner, div);
    }
    return true;
}

static bool reduce_compute(void *state, exec_ctx *ctx) {
    reduce_state *r = state;
    dg_tensor *in = IN(0);
    int rank = in->shape.rank;
    uint32_t mask;
    if (!mask_of(ctx, r, rank, &mask)) return false;
    dg_shape ksh = keep_shape(&in->shape, mask);
    dg_tensor *o = exec_alloc_output(ctx, 0, in->dtype, reduced_shape(&in->shape, mask, r->keep));
    if (!o) return false;
    if (r->kind == 2 && in->n_elements == 0 && o->n_elements > 0)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "max of an empty tensor");
    int64_t count = o->n_elements ? in->n_elements / o->n_elements : 0;
    if (r->kind != 2 && reduce_sum_fast(in, mask, r->kind == 1, o)) return true;
    switch (in->dtype) {
    case DG_FLOAT32:
        if (r->kind == 2) REDUCE_LOOP(float, -INFINITY, ACC_MAX);
        else REDUCE_LOOP(float, 0, ACC_SUM);
        if (r->kind == 1 && count) for (int64_t i = 0; i < o->n_elements; i++) F32(o)[i] /= (float)count;
        break;
    case DG_FLOAT64:
        if (r->kind == 2) REDUCE_LOOP(double, -INFINITY, ACC_MAX);
        else REDUCE_LOOP(double, 0, ACC_SUM);
        if (r->kind == 1 && count) for (int64_t i = 0; i < o->n_elements; i++) F64(o)[i] /= (double)count;
        break;
    case DG_INT32:
        if (r->kind == 2) REDUCE_LOOP(int32_t, INT32_MIN, ACC_MAX);
        else REDUCE_LOOP(int32_t, 0, ACC_SUM);
        if (r->kind == 1 && count) for (int64_t i = 0; i < o->n_elements; i++) ((int32_t *)o->data)[i] /= (int32_t)count;
        break;
    case DG_INT64:
        if (r->kind == 2) REDUCE_LOOP(int64_t, INT64_MIN, ACC_MAX);
        else REDUCE_LOOP(int64_t, 0, ACC_SUM);
        if (r->kind == 1 && count) for (int64_t i = 0; i < o->n_elements; i++) ((int64_t *)o->data)[i] /= count;
        break;
    default: return exec_fail(ctx, DG_INVALID_ARGUMENT, "unsupported dtype %s", dg_dtype_name(in->dtype));
    }
    return true;
}

// SumGrad(dy, x_shape): dy broadcast back over the reduced axes (divided by the count for Mean).
static bool sum_grad_compute(void *state, exec_ctx *ctx) {
    reduce_state *r = state;
    dg_tensor *dy = IN(0);
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "shape input is not an int vector of rank <= %d", DG_MAX_RANK);
    dg_shape xs = dg_shape_make(rank, dims);
    uint32_t mask;
    if (!mask_of(ctx, r, rank, &mask)) return false;
    dg_shape ksh = keep_shape(&xs, mask);
    if (tensor_shape_elements(&ksh) != dy->n_elements)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "gradient has %lld elements, reduction gives %lld",
                         (long long)dy->n_elements, (long long)tensor_shape_elements(&ksh));
    dg_tensor *o = exec_alloc_output(ctx, 0, dy->dtype, xs);
    if (!o) return false;
    dg_tensor *view = tensor_view(dy, ksh, ctx->st);
    if (!view) return false;
    bool ok = cpu_broadcast_into(view, o, ctx->st);
    dg_tensor_unref(view);
    if (ok && r->kind == 1) {
        int64_t count = dy->n_elements ? o->n_elements / dy->n_elements : 1;
        if (o->dtype == DG_FLOAT32) for (int64_t i = 0; i < o->n_elements; i++) F32(o)[i] /= (float)count;
        else for (int64_t i = 0; i < o->n_elements; i++) F64(o)[i] /= (double)count;
    }
    return ok;
}

// MaxGrad(dy, x, y): dy goes to the maxima of each group, split evenly between ties.
static bool max_grad_compute(void *state, exec_ctx *ctx) {
    reduce_state *r = state;
    dg_tensor *dy = IN(0), *x = IN(1), *y = IN(2);
    uint32_t mask;
    if (!mask_of(ctx, r, x->shape.rank, &mask)) return false;
    dg_shape ksh = keep_shape(&x->shape, mask);
    if (tensor_shape_elements(&ksh) != y->n_elements || y->n_elements != dy->n_elements)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "max gradient inputs disagree in size");
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, x->shape);
    if (!o) return false;
    dg_tensor *yb = dg_tensor_new(x->dtype, x->shape, ctx->st);
    dg_tensor *gb = yb ? dg_tensor_new(x->dtype, x->shape, ctx->st) : NULL;
    dg_tensor *cnt = gb ? dg_tensor_new(x->dtype, ksh, ctx->st) : NULL;
    dg_tensor *yv = cnt ? tensor_view(y, ksh, ctx->st) : NULL;
    dg_tensor *gv = yv ? tensor_view(dy, ksh, ctx->st) : NULL;
    dg_tensor *mask_t = gv ? dg_tensor_new(x->dtype, x->shape, ctx->st) : NULL;
    dg_tensor *cb = mask_t ? dg_tensor_new(x->dtype, x->shape, ctx->st) : NULL;
    bool ok = cb && cpu_broadcast_into(yv, yb, ctx->st) && cpu_broadcast_into(gv, gb, ctx->st);
    if (ok) {
        for (int64_t i = 0; i < x->n_elements; i++) {
            double m = dg_tensor_get_as_double(x, i) == dg_tensor_get_as_double(yb, i);
            if (x->dtype == DG_FLOAT32) F32(mask_t)[i] = (float)m;
            else F64(mask_t)[i] = m;
        }
        ok = cpu_sum_into(mask_t, cnt, ctx->st) && cpu_broadcast_into(cnt, cb, ctx->st);
    }
    if (ok)
        for (int64_t i = 0; i < x->n_elements; i++) {
            double v = dg_tensor_get_as_double(mask_t, i) * dg_tensor_get_as_double(gb, i) /
                       dg_tensor_get_as_double(cb, i);
            if (x->dtype == DG_FLOAT32) F32(o)[i] = (float)v;
            else F64(o)[i] = v;
        }
    dg_tensor_unref(yb);
    dg_tensor_unref(gb);
    dg_tensor_unref(cnt);
    dg_tensor_unref(yv);
    dg_tensor_unref(gv);
    dg_tensor_unref(mask_t);
    dg_tensor_unref(cb);
    return ok;
}

static void *argmax_create(const dg_node *n, const exec_env *env, dg_status *st) {
    int64_t axis = 0;
    dg_node_attr_int(n, "axis", &axis);
    int64_t *a = malloc(sizeof *a);
    if (!a) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    *a = axis;
    return a;
}

static bool argmax_compute(void *state, exec_ctx *ctx) {
    dg_tensor *x = IN(0);
    int rank = x->shape.rank;
    int64_t axis = *(int64_t *)state;
    if (rank == 0 || axis < -rank || axis >= rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %lld out of range for rank %d", (long long)axis, rank);
    if (axis < 0) axis += rank;
    int64_t outer = 1, inner = 1, A = x->shape.dims[axis];
    for (int i = 0; i < axis; i++) outer *= x->shape.dims[i];
    for (int i = (int)axis + 1; i < rank; i++) inner *= x->shape.dims[i];
    if (A == 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "argmax over an empty axis");
    dg_shape os = dg_shape_scalar();
    for (int i = 0; i < rank; i++)
        if (i != axis) os.dims[os.rank++] = x->shape.dims[i];
    dg_tensor *o = exec_alloc_output(ctx, 0, DG_INT64, os);
    if (!o) return false;
    int64_t *y = o->data;
    for (int64_t p = 0; p < outer; p++)
        for (int64_t q = 0; q < inner; q++) {
            int64_t best = 0;
            double bv = dg_tensor_get_as_double(x, p * A * inner + q);
            for (int64_t a = 1; a < A; a++) {
                double v = dg_tensor_get_as_double(x, (p * A + a) * inner + q);
                if (v > bv) {
                    bv = v;
                    best = a;
                }
            }
            y[p * inner + q] = best;
        }
    return true;
}

// ---- SumToShape / BroadcastTo (x, shape) ----
static bool target_shape(exec_ctx *ctx, dg_shape *s) {
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "shape input is not an int vector of rank <= %d", DG_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "negative dimension %lld", (long long)dims[i]);
    *s = dg_shape_make(rank, dims);
    return true;
}

static bool sum_to_shape_compute(void *state, exec_ctx *ctx) {
    dg_shape s;
    if (!target_shape(ctx, &s)) return false;
    dg_tensor *x = IN(0);
    if (dg_shape_equal(&s, &x->shape)) {
        exec_set_output(ctx, 0, x);
        return true;
    }
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, s);
    return o && cpu_sum_into(x, o, ctx->st);
}

static bool broadcast_to_compute(void *state, exec_ctx *ctx) {
    dg_shape s;
    if (!target_shape(ctx, &s)) return false;
    dg_tensor *x = IN(0);
    if (dg_shape_equal(&s, &x->shape)) {
        exec_set_output(ctx, 0, x);
        return true;
    }
    dg_tensor *o = exec_alloc_output(ctx, 0, x->dtype, s);
    return o && cpu_broadcast_into(x, o, ctx->st);
}

#define K(op, mask, create, compute, destroy) \
    {op, "CPU", mask, create, compute, destroy, false, false, false, NULL, false}

const exec_kernel_def cpu_nn_kernels[] = {
    K("Softmax", DT_FLOATS, cpu_no_state, softmax_compute, NULL),
    K("LogSoftmax", DT_FLOATS, log_softmax_create, softmax_compute, NULL),
    K("SoftmaxGrad", DT_FLOATS, cpu_no_state, softmax_grad_compute, NULL),
    K("LogSoftmaxGrad", DT_FLOATS, log_softmax_create, softmax_grad_compute, NULL),
    K("SoftmaxCrossEntropyWithLogits", DT_FLOATS, cpu_no_state, xent_compute, NULL),
    K("SparseSoftmaxCrossEntropyWithLogits", DT_FLOATS, sparse_create, xent_compute, NULL),
    K("Sum", DT_NUMERIC, reduce_create, reduce_compute, free),
    K("Mean", DT_NUMERIC, reduce_create, reduce_compute, free),
    K("Max", DT_NUMERIC, reduce_create, reduce_compute, free),
    K("SumGrad", DT_FLOATS, reduce_create, sum_grad_compute, free),
    K("MaxGrad", DT_FLOATS, reduce_create, max_grad_compute, free),
    K("ArgMax", DT_NUMERIC, argmax_create, argmax_compute, free),
    K("SumToShape", DT_NUMERIC, cpu_no_state, sum_to_shape_compute, NULL),
    K("BroadcastTo", DT_ALL, cpu_no_state, broadcast_to_compute, NULL),
};
const int cpu_n_nn_kernels = sizeof cpu_nn_kernels / sizeof cpu_nn_kernels[0];
