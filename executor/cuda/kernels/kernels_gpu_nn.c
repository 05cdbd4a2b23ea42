/* GPU kernels for softmax and cross entropy, the reductions and their gradients (Sum, Mean,
 * Max, SumGrad, MaxGrad, SumToShape, BroadcastTo) and the array ops (Reshape, Shape, Fill,
 * ZerosLike, OnesLike, Concat, Split, Slice, SliceGrad). Each checks its inputs as the CPU
 * kernel of its op does (executor/cpu/kernels_nn.c, kernels_array.c), with the same errors,
 * and queues the work on its device's stream through the launchers of nn.cu.
 *
 * Float tensors are device memory; shapes, labels and dims (int tensors) are host memory and
 * read here directly. Shape never touches the device: its int64 output is host memory
 * (host_outputs). ArgMax stays on the CPU (its int64 output would be a host tensor computed
 * from device data). */
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "gpu_impl.h"
#include "launch_nn.h"

// ---- shared checks ----

// Inputs [0, n) are float tensors of one dtype in dev's memory (gpu_prepare_inputs).
static bool prepare(exec_ctx *ctx, exec_cuda_device *dev, int n) { return gpu_prepare_inputs(ctx, dev, n); }

static bool is_f64(const dg_tensor *t) { return t->dtype == DG_FLOAT64; }

// Element off of t's buffer (device pointers too: only arithmetic, no access).
static void *elem(const dg_tensor *t, int64_t off) {
    return (char *)t->data + off * (int64_t)dg_dtype_size(t->dtype);
}

static bool launched(exec_ctx *ctx, exec_cuda_device *dev, cudaError_t err) {
    return gpu_check_launch(ctx, dev, err, ctx->node->op->name);
}

// ---- kernel state: the device, and the attributes an op reads ----
typedef struct nn_state {
    exec_cuda_device *dev;   // borrowed; first member (gpu_impl.h)
    bool is_log;             // LogSoftmax, LogSoftmaxGrad
    bool sparse;             // SparseSoftmaxCrossEntropyWithLogits
    bool ones;               // OnesLike
    int kind;                // reductions: CUDA_REDUCE_SUM, _MEAN or _MAX
    bool keep;               // keep_dims
    bool all;                // no "axes": reduce every axis
    int n_axes;
    int64_t axes[DG_MAX_RANK];
    int64_t axis;            // Concat, Split
    int n_begin;             // Slice, SliceGrad: begin and size (-1: to the end)
    int64_t begin[DG_MAX_RANK], size[DG_MAX_RANK];
} nn_state;

// Returns: new, freed by the kernel's destroy (free); NULL with st set.
static void *nn_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    nn_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s kernel: %zu bytes", n->op->name, sizeof *s);
        return NULL;
    }
    s->dev = dev;
    const char *op = n->op->name;
    s->is_log = strcmp(op, "LogSoftmax") == 0 || strcmp(op, "LogSoftmaxGrad") == 0;
    s->sparse = strcmp(op, "SparseSoftmaxCrossEntropyWithLogits") == 0;
    s->ones = strcmp(op, "OnesLike") == 0;
    return s;
}

// Sum, Mean, Max, SumGrad, MaxGrad: attributes as the CPU's reduce_create reads them.
static void *reduce_create(const dg_node *n, const exec_env *env, dg_status *st) {
    nn_state *s = nn_create(n, env, st);
    if (!s) return NULL;
    const char *op = n->op->name;
    s->kind = strcmp(op, "Mean") == 0  ? CUDA_REDUCE_MEAN
              : strcmp(op, "Max") == 0 ? CUDA_REDUCE_MAX
                                       : CUDA_REDUCE_SUM;
    if (strcmp(op, "SumGrad") == 0) {
        bool mean = false;
        dg_node_attr_bool(n, "mean", &mean);
        s->kind = mean ? CUDA_REDUCE_MEAN : CUDA_REDUCE_SUM;
    }
    dg_node_attr_bool(n, "keep_dims", &s->keep);
    int count;
    const int64_t *axes = graph_node_attr_ints(n, "axes", &count);
    if (count > DG_MAX_RANK) {
        free(s);
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%d reduction axes is more than rank %d", count,
                       DG_MAX_RANK);
        return NULL;
    }
    s->all = count == 0;
    s->n_axes = count;
    for (int i = 0; i < count; i++) s->axes[i] = axes[i];
    return s;
}

static void *axis_create(const dg_node *n, const exec_env *env, dg_status *st) {
    nn_state *s = nn_create(n, env, st);
    if (!s) return NULL;
    s->axis = 0;
    dg_node_attr_int(n, "axis", &s->axis);
    return s;
}

static void *slice_create(const dg_node *n, const exec_env *env, dg_status *st) {
    nn_state *s = nn_create(n, env, st);
    if (s && !cpu_slice_attrs(n, s->begin, s->size, &s->n_begin, st)) {
        free(s);
        return NULL;
    }
    return s;
}

// ---- softmax family, over the last axis ----

static bool last_axis(exec_ctx *ctx, const dg_tensor *t, int64_t *rows, int64_t *C) {
    if (t->shape.rank < 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "needs rank >= 1, got a scalar");
    *C = t->shape.dims[t->shape.rank - 1];
    *rows = *C ? t->n_elements / *C : 0;
    return true;
}

static bool softmax_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *in = IN(0);
    int64_t rows = 0, C = 0;
    if (!prepare(ctx, s->dev, 1) || !last_axis(ctx, in, &rows, &C)) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, in->dtype, in->shape);
    if (!o) return false;
    return launched(ctx, s->dev, cuda_launch_softmax(is_f64(in), in->data, o->data, rows, C,
                                                     s->is_log, s->dev->stream));
}

static bool softmax_grad_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *y = IN(0), *dy = IN(1);
    int64_t rows = 0, C = 0;
    if (!prepare(ctx, s->dev, 2) || !last_axis(ctx, y, &rows, &C)) return false;
    if (!dg_shape_equal(&y->shape, &dy->shape))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "y and dy differ in shape");
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, y->dtype, y->shape);
    if (!o) return false;
    return launched(ctx, s->dev, cuda_launch_softmax_grad(is_f64(y), y->data, dy->data, o->data,
                                                          rows, C, s->is_log, s->dev->stream));
}

// ---- cross entropy: loss [N] and backprop [N, C] = softmax - labels ----

// The sparse labels (host int32/int64 [N]) as int64 in a new device buffer, each checked to be
// in [0, C) as the CPU does, row by row. Returns: new, release with exec_cuda_mem_free(); NULL
// with ctx->st set.
static int64_t *labels_to_device(exec_ctx *ctx, exec_cuda_device *dev, const dg_tensor *labels,
                                 int64_t N, int64_t C) {
    bool is32 = labels->dtype == DG_INT32;
    if (!is32 && labels->dtype != DG_INT64) {
        exec_fail(ctx, DG_INVALID_ARGUMENT, "labels are %s, need int32 or int64",
                  dg_dtype_name(labels->dtype));
        return NULL;
    }
    const int32_t *l32 = labels->data;
    const int64_t *l64 = labels->data;
    for (int64_t r = 0; r < N; r++) {
        int64_t id = is32 ? (int64_t)l32[r] : l64[r];
        if (id < 0 || id >= C) {
            exec_fail(ctx, DG_INVALID_ARGUMENT, "label %lld at row %lld is outside [0, %lld)",
                      (long long)id, (long long)r, (long long)C);
            return NULL;
        }
    }
    size_t n_bytes = (size_t)N * sizeof(int64_t);
    int64_t *wide = NULL;
    if (is32) {
        wide = malloc(n_bytes);
        if (!wide) {
            exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "labels: %zu bytes", n_bytes);
            return NULL;
        }
        for (int64_t r = 0; r < N; r++) wide[r] = l32[r];
    }
    int64_t *d = exec_cuda_mem_alloc(dev, n_bytes, ctx->st);
    // The host buffer may go as soon as the copy is queued (it is staged).
    if (d && !exec_cuda_memcpy_to_device(dev, d, is32 ? (const void *)wide : (const void *)l64,
                                         n_bytes, ctx->st)) {
        exec_cuda_mem_free(dev, d);
        d = NULL;
    }
    free(wide);
    return d;
}

static bool xent_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *logits = IN(0), *labels = IN(1);
    if (!prepare(ctx, s->dev, s->sparse ? 1 : 2)) return false;
    if (logits->shape.rank != 2)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "logits must be a matrix, got rank %d",
                         logits->shape.rank);
    int64_t N = logits->shape.dims[0], C = logits->shape.dims[1];
    if (s->sparse ? (labels->shape.rank != 1 || labels->shape.dims[0] != N)
                  : !dg_shape_equal(&labels->shape, &logits->shape)) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "labels %s do not match logits %s",
                         dg_shape_str(&labels->shape, a, sizeof a),
                         dg_shape_str(&logits->shape, b, sizeof b));
    }
    if (C == 0 && N > 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "logits have zero classes");
    dg_tensor *o0 = gpu_alloc_output(s->dev, ctx, 0, logits->dtype, dg_shape1(N));
    dg_tensor *o1 = o0 ? gpu_alloc_output(s->dev, ctx, 1, logits->dtype, logits->shape) : NULL;
    if (!o1) return false;
    if (N == 0) return true;
    if (!s->sparse)
        return launched(ctx, s->dev, cuda_launch_xent(is_f64(logits), logits->data, labels->data,
                                                      NULL, o0->data, o1->data, N, C,
                                                      s->dev->stream));
    int64_t *ids = labels_to_device(ctx, s->dev, labels, N, C);
    if (!ids) return false;
    cudaError_t err = cuda_launch_xent(is_f64(logits), logits->data, NULL, ids, o0->data,
                                       o1->data, N, C, s->dev->stream);
    exec_cuda_mem_free(s->dev, ids);   // safe: later users of the block queue after the kernel
    return launched(ctx, s->dev, err);
}

// ---- reductions ----

static bool mask_of(exec_ctx *ctx, const nn_state *s, int rank, uint32_t *mask) {
    return cpu_axes_mask(ctx, s->all, s->axes, s->n_axes, rank, mask);
}

static dg_shape reduced_shape(const dg_shape *x, uint32_t mask, bool keep) {
    return cpu_reduced_shape(x, mask, keep);
}

// Queues o = reduce(x over mask) with a scratch buffer when the launcher wants one.
static bool run_reduce(exec_ctx *ctx, exec_cuda_device *dev, int kind, const dg_tensor *x,
                       uint32_t mask, dg_tensor *o) {
    bool f64 = is_f64(x);
    int rank = x->shape.rank;
    size_t n_scratch = cuda_reduce_scratch_bytes(f64, kind, rank, x->shape.dims, mask);
    void *scratch = NULL;
    if (n_scratch && !(scratch = exec_cuda_mem_alloc(dev, n_scratch, ctx->st))) return false;
    cudaError_t err = cuda_launch_reduce(f64, kind, x->data, o->data, rank, x->shape.dims, mask,
                                         scratch, dev->stream);
    exec_cuda_mem_free(dev, scratch);   // safe by stream order
    return launched(ctx, dev, err);
}

static bool reduce_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *in = IN(0);
    uint32_t mask;
    if (!prepare(ctx, s->dev, 1) || !mask_of(ctx, s, in->shape.rank, &mask)) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, in->dtype,
                                    reduced_shape(&in->shape, mask, s->keep));
    if (!o) return false;
    if (s->kind == CUDA_REDUCE_MAX && in->n_elements == 0 && o->n_elements > 0)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "max of an empty tensor");
    return run_reduce(ctx, s->dev, s->kind, in, mask, o);
}

// Row-major strides of s, with 0 on the axes in zero_mask.
static void strides_of(const dg_shape *s, uint32_t zero_mask, int64_t *out) {
    cpu_strides(s, out);
    for (int d = 0; d < s->rank; d++)
        if (zero_mask & (1u << d)) out[d] = 0;
}

// SumGrad(dy, x_shape): dy broadcast back over the reduced axes (divided by the count for Mean).
static bool sum_grad_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *dy = IN(0);
    if (!prepare(ctx, s->dev, 1)) return false;
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "shape input is not an int vector of rank <= %d",
                         DG_MAX_RANK);
    dg_shape xs = dg_shape_make(rank, dims);
    uint32_t mask;
    if (!mask_of(ctx, s, rank, &mask)) return false;
    dg_shape ksh = reduced_shape(&xs, mask, true);
    if (tensor_shape_elements(&ksh) != dy->n_elements)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "gradient has %lld elements, reduction gives %lld",
                         (long long)dy->n_elements, (long long)tensor_shape_elements(&ksh));
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, dy->dtype, xs);
    if (!o) return false;
    // dy read as the kept shape: stride 0 along the reduced axes.
    int64_t src_str[DG_MAX_RANK], dst_str[DG_MAX_RANK];
    strides_of(&ksh, mask, src_str);
    strides_of(&xs, 0, dst_str);
    int64_t divisor = 0;
    if (s->kind == CUDA_REDUCE_MEAN) divisor = dy->n_elements ? o->n_elements / dy->n_elements : 1;
    return launched(ctx, s->dev, cuda_launch_copy_box(is_f64(dy), o->data, dst_str, dy->data,
                                                      src_str, rank, xs.dims, divisor,
                                                      s->dev->stream));
}

// MaxGrad(dy, x, y): dy goes to the maxima of each group, split evenly between ties.
static bool max_grad_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *dy = IN(0), *x = IN(1), *y = IN(2);
    uint32_t mask;
    if (!prepare(ctx, s->dev, 3) || !mask_of(ctx, s, x->shape.rank, &mask)) return false;
    dg_shape ksh = reduced_shape(&x->shape, mask, true);
    if (tensor_shape_elements(&ksh) != y->n_elements || y->n_elements != dy->n_elements)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "max gradient inputs disagree in size");
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, x->dtype, x->shape);
    if (!o) return false;
    if (x->n_elements == 0) return true;
    size_t n_scratch = cuda_max_grad_scratch_bytes(x->shape.rank, x->shape.dims, mask);
    void *scratch = exec_cuda_mem_alloc(s->dev, n_scratch, ctx->st);
    if (!scratch) return false;
    cudaError_t err = cuda_launch_max_grad(is_f64(x), dy->data, x->data, y->data, o->data,
                                           x->shape.rank, x->shape.dims, mask, scratch,
                                           s->dev->stream);
    exec_cuda_mem_free(s->dev, scratch);   // safe by stream order
    return launched(ctx, s->dev, err);
}

// ---- SumToShape / BroadcastTo (x, shape) ----

static bool target_shape(exec_ctx *ctx, dg_shape *s) {
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "shape input is not an int vector of rank <= %d",
                         DG_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "negative dimension %lld", (long long)dims[i]);
    *s = dg_shape_make(rank, dims);
    return true;
}

// Strides of small viewed in big's rank (0 where small broadcasts) as the CPU's
// bcast_strides; false if small does not broadcast to big.
static bool bcast_strides(const dg_shape *small, const dg_shape *big, int64_t *out) {
    if (small->rank > big->rank) return false;
    int64_t s[DG_MAX_RANK];
    cpu_strides(small, s);
    int off = big->rank - small->rank;
    for (int i = 0; i < big->rank; i++) {
        if (i < off) {
            out[i] = 0;
            continue;
        }
        int64_t d = small->dims[i - off];
        if (d == big->dims[i]) out[i] = s[i - off];
        else if (d == 1) out[i] = 0;
        else return false;
    }
    return true;
}

static bool sum_to_shape_compute(void *state, exec_ctx *ctx) {
    nn_state *ns = state;
    dg_shape s;
    if (!prepare(ctx, ns->dev, 1) || !target_shape(ctx, &s)) return false;
    dg_tensor *x = IN(0);
    if (dg_shape_equal(&s, &x->shape)) {
        exec_set_output(ctx, 0, x);
        return true;
    }
    int64_t str[DG_MAX_RANK];
    if (!bcast_strides(&s, &x->shape, str)) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "cannot sum %s down to %s",
                         dg_shape_str(&x->shape, a, sizeof a), dg_shape_str(&s, b, sizeof b));
    }
    // Reduced: the axes s lacks, and those where s has 1 and x more.
    uint32_t mask = 0;
    int off = x->shape.rank - s.rank;
    for (int d = 0; d < x->shape.rank; d++)
        if (d < off || (s.dims[d - off] == 1 && x->shape.dims[d] != 1)) mask |= 1u << d;
    dg_tensor *o = gpu_alloc_output(ns->dev, ctx, 0, x->dtype, s);
    return o && run_reduce(ctx, ns->dev, CUDA_REDUCE_SUM, x, mask, o);
}

static bool broadcast_to_compute(void *state, exec_ctx *ctx) {
    nn_state *ns = state;
    dg_shape s;
    if (!prepare(ctx, ns->dev, 1) || !target_shape(ctx, &s)) return false;
    dg_tensor *x = IN(0);
    if (dg_shape_equal(&s, &x->shape)) {
        exec_set_output(ctx, 0, x);
        return true;
    }
    int64_t src_str[DG_MAX_RANK], dst_str[DG_MAX_RANK];
    if (!bcast_strides(&x->shape, &s, src_str)) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "cannot broadcast %s to %s",
                         dg_shape_str(&x->shape, a, sizeof a), dg_shape_str(&s, b, sizeof b));
    }
    dg_tensor *o = gpu_alloc_output(ns->dev, ctx, 0, x->dtype, s);
    if (!o) return false;
    strides_of(&s, 0, dst_str);
    return launched(ctx, ns->dev, cuda_launch_copy_box(is_f64(x), o->data, dst_str, x->data,
                                                       src_str, s.rank, s.dims, 0,
                                                       ns->dev->stream));
}

// ---- Reshape, Shape, Fill, ZerosLike, OnesLike ----

// Reshape and Shape touch no element: the CPU kernels' compute serves (a Reshape is a view of
// its input, which keeps the input's GPU; Shape's int64 output is host memory).
// Fill(dims, value): dims is host memory; a float value is device memory and read there.
static bool fill_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(0), dims, &rank, DG_MAX_RANK))
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "dims must be an int vector of at most %d entries",
                         DG_MAX_RANK);
    for (int i = 0; i < rank; i++)
        if (dims[i] < 0) return exec_fail(ctx, DG_INVALID_ARGUMENT, "dimension %d is negative", i);
    dg_tensor *v = IN(1);
    if (v->n_elements != 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "value must be a scalar");
    // This GPU current before gpu_alloc_output, which may queue a poison fill on its stream.
    if (!launched(ctx, s->dev, cudaSetDevice(s->dev->id))) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, v->dtype, dg_shape_make(rank, dims));
    if (!o) return false;
    if (!gpu_dtype_on_device(v->dtype)) {   // a host value fills a host output, as on the CPU
        size_t es = dg_dtype_size(o->dtype);
        for (int64_t i = 0; i < o->n_elements; i++)
            memcpy((char *)o->data + i * (int64_t)es, v->data, es);
        return true;
    }
    if (!gpu_tensor_in(v, s->dev))
        return exec_fail(ctx, DG_INTERNAL, "value (%s) is not in the memory of GPU:%d",
                         dg_dtype_name(v->dtype), s->dev->id);
    return launched(ctx, s->dev, cuda_launch_fill_from(is_f64(v), o->data, o->n_elements, v->data,
                                                       s->dev->stream));
}

static bool like_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *x = IN(0);
    if (!prepare(ctx, s->dev, 1)) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, x->dtype, x->shape);
    if (!o) return false;
    if (s->ones)
        return launched(ctx, s->dev, cuda_launch_fill_value(is_f64(x), o->data, o->n_elements, 1.0,
                                                            s->dev->stream));
    if (o->nbytes == 0) return true;
    return launched(ctx, s->dev, cudaMemsetAsync(o->data, 0, o->nbytes, s->dev->stream));
}

// ---- Concat / Split along an axis: outer blocks of (axis size * inner) elements ----

static bool concat_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *x0 = IN(0);
    int rank = x0->shape.rank;
    int64_t axis = s->axis;
    if (axis < -rank || axis >= rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %lld out of range for rank %d",
                         (long long)axis, rank);
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
                             dg_shape_str(&x->shape, a, sizeof a),
                             dg_shape_str(&x0->shape, b, sizeof b));
        }
        os.dims[axis] += x->shape.dims[axis];
    }
    if (!prepare(ctx, s->dev, ctx->n_inputs)) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, x0->dtype, os);
    if (!o) return false;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= os.dims[d];
    for (int d = (int)axis + 1; d < rank; d++) inner *= os.dims[d];
    int64_t orow = os.dims[axis] * inner, off = 0;
    for (int k = 0; k < ctx->n_inputs; k++) {
        dg_tensor *x = IN(k);
        int64_t row = x->shape.dims[axis] * inner;
        int64_t box[2] = {outer, row}, src_str[2] = {row, 1}, dst_str[2] = {orow, 1};
        if (!launched(ctx, s->dev, cuda_launch_copy_box(is_f64(x), elem(o, off), dst_str, x->data,
                                                        src_str, 2, box, 0, s->dev->stream)))
            return false;
        off += row;
    }
    return true;
}

static bool split_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *x = IN(0);
    int rank = x->shape.rank;
    int64_t axis = s->axis;
    if (axis < -rank || axis >= rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %lld out of range for rank %d",
                         (long long)axis, rank);
    if (axis < 0) axis += rank;
    int k = ctx->n_outputs;
    if (x->shape.dims[axis] % k != 0)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "dimension %lld of size %lld does not split into %d",
                         (long long)axis, (long long)x->shape.dims[axis], k);
    if (!prepare(ctx, s->dev, 1)) return false;
    dg_shape ps = x->shape;
    ps.dims[axis] /= k;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; d++) outer *= ps.dims[d];
    for (int d = (int)axis + 1; d < rank; d++) inner *= ps.dims[d];
    int64_t row = ps.dims[axis] * inner;
    for (int i = 0; i < k; i++) {
        dg_tensor *o = gpu_alloc_output(s->dev, ctx, i, x->dtype, ps);
        if (!o) return false;
        int64_t box[2] = {outer, row}, src_str[2] = {row * k, 1}, dst_str[2] = {row, 1};
        if (!launched(ctx, s->dev, cuda_launch_copy_box(is_f64(x), o->data, dst_str,
                                                        elem(x, (int64_t)i * row), src_str, 2, box,
                                                        0, s->dev->stream)))
            return false;
    }
    return true;
}

// ---- Slice / SliceGrad: copy a box between a big and a small tensor ----

static bool box_check(exec_ctx *ctx, const nn_state *s, const dg_shape *big, dg_shape *small) {
    if (s->n_begin != big->rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "slice has %d axes, input rank %d", s->n_begin,
                         big->rank);
    *small = dg_shape_scalar();
    small->rank = s->n_begin;
    for (int i = 0; i < s->n_begin; i++) {
        int64_t b = s->begin[i], z = s->size[i] < 0 ? big->dims[i] - b : s->size[i];
        if (b < 0 || z < 0 || b + z > big->dims[i])
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "axis %d: begin %lld size %lld out of range "
                             "for dimension %lld", i, (long long)b, (long long)z,
                             (long long)big->dims[i]);
        small->dims[i] = z;
    }
    return true;
}

// Offset of begin in big (elements) and big's strides.
static int64_t box_offset(const dg_shape *big, const int64_t *begin, int64_t *big_str) {
    cpu_strides(big, big_str);
    int64_t off = 0;
    for (int d = 0; d < big->rank; d++) off += begin[d] * big_str[d];
    return off;
}

static bool slice_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *x = IN(0);
    dg_shape ss;
    if (!prepare(ctx, s->dev, 1) || !box_check(ctx, s, &x->shape, &ss)) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, x->dtype, ss);
    if (!o || o->n_elements == 0) return o != NULL;
    int64_t big_str[DG_MAX_RANK], small_str[DG_MAX_RANK];
    int64_t off = box_offset(&x->shape, s->begin, big_str);
    strides_of(&ss, 0, small_str);
    return launched(ctx, s->dev, cuda_launch_copy_box(is_f64(x), o->data, small_str, elem(x, off),
                                                      big_str, ss.rank, ss.dims, 0, s->dev->stream));
}

static bool slice_grad_compute(void *state, exec_ctx *ctx) {
    nn_state s = *(nn_state *)state;
    dg_tensor *dy = IN(0);
    if (!prepare(ctx, s.dev, 1)) return false;
    int64_t dims[DG_MAX_RANK];
    int rank;
    if (!cpu_read_dims(IN(1), dims, &rank, DG_MAX_RANK) || rank != s.n_begin ||
        rank != dy->shape.rank)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "slice gradient: shape input disagrees with begin");
    dg_shape big = dg_shape_make(rank, dims), ss;
    for (int i = 0; i < rank; i++) s.size[i] = dy->shape.dims[i];
    if (!box_check(ctx, &s, &big, &ss)) return false;
    dg_tensor *o = gpu_alloc_output(s.dev, ctx, 0, dy->dtype, big);
    if (!o) return false;
    if (o->nbytes == 0) return true;
    if (!launched(ctx, s.dev, cudaMemsetAsync(o->data, 0, o->nbytes, s.dev->stream))) return false;
    if (dy->n_elements == 0) return true;
    int64_t big_str[DG_MAX_RANK], small_str[DG_MAX_RANK];
    int64_t off = box_offset(&big, s.begin, big_str);
    strides_of(&ss, 0, small_str);
    return launched(ctx, s.dev, cuda_launch_copy_box(is_f64(dy), elem(o, off), big_str, dy->data,
                                                     small_str, ss.rank, ss.dims, 0, s.dev->stream));
}

// (op, dtype mask, create, compute, host_outputs); every state is freed with free().
#define NN_KERNEL(op, mask, create, compute, host_outputs) \
    {(op), "GPU", (mask), (create), (compute), free, false, false, false, NULL, (host_outputs)}

// Transpose: a box copy whose source strides are the input's, permuted.
static bool transpose_compute(void *state, exec_ctx *ctx) {
    nn_state *s = state;
    dg_tensor *x = IN(0);
    dg_shape os;
    int64_t src_str[DG_MAX_RANK], dst_str[DG_MAX_RANK];
    if (!prepare(ctx, s->dev, 1) || !cpu_transpose_plan(ctx, &os, src_str)) return false;
    dg_tensor *o = gpu_alloc_output(s->dev, ctx, 0, x->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    strides_of(&os, 0, dst_str);
    return launched(ctx, s->dev, cuda_launch_copy_box(is_f64(x), o->data, dst_str, x->data, src_str, os.rank,
                                                      os.dims, 0, s->dev->stream));
}

const exec_kernel_def gpu_nn_kernels[] = {
    NN_KERNEL("Transpose", DT_FLOATS, nn_create, transpose_compute, false),
    NN_KERNEL("Softmax", DT_FLOATS, nn_create, softmax_compute, false),
    NN_KERNEL("LogSoftmax", DT_FLOATS, nn_create, softmax_compute, false),
    NN_KERNEL("SoftmaxGrad", DT_FLOATS, nn_create, softmax_grad_compute, false),
    NN_KERNEL("LogSoftmaxGrad", DT_FLOATS, nn_create, softmax_grad_compute, false),
    NN_KERNEL("SoftmaxCrossEntropyWithLogits", DT_FLOATS, nn_create, xent_compute, false),
    NN_KERNEL("SparseSoftmaxCrossEntropyWithLogits", DT_FLOATS, nn_create, xent_compute, false),
    NN_KERNEL("Sum", DT_FLOATS, reduce_create, reduce_compute, false),
    NN_KERNEL("Mean", DT_FLOATS, reduce_create, reduce_compute, false),
    NN_KERNEL("Max", DT_FLOATS, reduce_create, reduce_compute, false),
    NN_KERNEL("SumGrad", DT_FLOATS, reduce_create, sum_grad_compute, false),
    NN_KERNEL("MaxGrad", DT_FLOATS, reduce_create, max_grad_compute, false),
    NN_KERNEL("SumToShape", DT_FLOATS, nn_create, sum_to_shape_compute, false),
    NN_KERNEL("BroadcastTo", DT_FLOATS, nn_create, broadcast_to_compute, false),
    NN_KERNEL("Reshape", DT_FLOATS | DT_FLOAT16S, nn_create, cpu_reshape_compute, false),
    NN_KERNEL("Shape", DT_STORAGE, nn_create, cpu_shape_compute, true),
    NN_KERNEL("Fill", DT_BIT(DG_INT32) | DT_BIT(DG_INT64), nn_create, fill_compute, false),
    NN_KERNEL("ZerosLike", DT_FLOATS, nn_create, like_compute, false),
    NN_KERNEL("OnesLike", DT_FLOATS, nn_create, like_compute, false),
    NN_KERNEL("Concat", DT_FLOATS, axis_create, concat_compute, false),
    NN_KERNEL("Split", DT_FLOATS, axis_create, split_compute, false),
    NN_KERNEL("Slice", DT_FLOATS, slice_create, slice_compute, false),
    NN_KERNEL("SliceGrad", DT_FLOATS, slice_create, slice_grad_compute, false),
};
const int gpu_n_nn_kernels = sizeof gpu_nn_kernels / sizeof gpu_nn_kernels[0];
