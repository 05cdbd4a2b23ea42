/* GPU kernels for the embedding and sparse ops of the CPU's kernels_sparse.c: Gather,
 * UnsortedSegmentSum, ScatterAdd/Sub/Update, SparseApplyAdagrad, SparseApplyMomentum, SparseApplyAdam and
 * DynamicStitch. Each checks its inputs with the CPU kernel's own function (cpu_gather_shape,
 * cpu_scatter_check, ...), so the errors are the same and come in the same order, and every
 * index is checked before any work is queued: a bad index fails the step and leaves variables
 * as they were. The work is queued through the launchers of sparse.cu.
 *
 * Memory rule (gpu_impl.h): indices, segment ids and num_segments are int tensors in host
 * memory, read here. Gather's indices go to the device as a staged copy per step, as OneHot's
 * do (kernels_gpu_index.c). The ops that may meet a row more than once (UnsortedSegmentSum,
 * the scatters, the sparse optimizers) send a plan instead: the positions of the indices
 * grouped by row, in their order (group_rows), with which sparse.cu gathers rather than
 * scatters, so results do not depend on thread timing and equal the CPU's. DynamicStitch
 * sends, per output row, the device address of the row that lands there (the last one given,
 * as on the CPU). Every copy goes into a block of the device's cache, given back as soon as the
 * work is queued (safe by stream order). Float values (tables, rows, learning rates and other
 * scalars) are device memory, read only there; an empty scalar reads as 0, as the CPU's
 * dg_tensor_get_as_double gives.
 *
 * As on the CPU a kernel is chosen by input 0's dtype: by the float table or data for all but
 * DynamicStitch, which is chosen by its int32 indices. The placer offers them only for nodes
 * whose outputs are floats (exec_kernel_supports), so a DynamicStitch of ints stays on the
 * CPU. DynamicPartition and EmbeddingPartitionIds have no GPU kernel: in a sharded lookup
 * they route and split ids and positions, ints that a GPU keeps in host memory, so they run
 * on the CPU (the placer offers a node only to devices with a kernel for it). */
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "gpu_impl.h"
#include "launch_sparse.h"

static bool is_f64(const dg_tensor *t) { return t->dtype == DG_FLOAT64; }

static bool launched(exec_ctx *ctx, exec_cuda_device *dev, cudaError_t err) {
    return gpu_check_launch(ctx, dev, err, ctx->node->op->name);
}

// Index i of an int32 or int64 tensor.
static int64_t index_at(const dg_tensor *t, int64_t i) {
    return t->dtype == DG_INT32 ? ((const int32_t *)t->data)[i] : ((const int64_t *)t->data)[i];
}

// The number of elements of a row of t (its shape after the first axis).
static int64_t row_elems(const dg_tensor *t) {
    int64_t r = 1;
    for (int k = 1; k < t->shape.rank; k++) r *= t->shape.dims[k];
    return r;
}

// A float scalar operand for the device: its element, or NULL (read as 0) when it is empty.
static const void *scalar_ptr(const dg_tensor *t) { return t->n_elements > 0 ? t->data : NULL; }

// ---- indices grouped by row ----

typedef struct index_pos {
    int64_t index, pos;
} index_pos;

static int by_index_then_pos(const void *a, const void *b) {
    const index_pos *x = a, *y = b;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

// *g: the positions of idx (n > 0 int32 or int64 values, each checked to be in [0, limit))
// grouped by the row each names, in their order within a row (cuda_row_groups), built here and
// copied to dev: counted (one count per row of the table) when the table has at most
// 2n + 4096 rows, else sorted. *block: the device copy, release with exec_cuda_mem_free() once
// the work that reads it is queued. false with ctx->st set.
static bool group_rows(exec_ctx *ctx, exec_cuda_device *dev, const dg_tensor *idx,
                       int64_t limit, cuda_row_groups *g, void **block) {
    const int64_t n = idx->n_elements;
    // rows (n slots), first (n + 1) and pos (n); compacted below to rows, first, pos.
    int64_t *h = malloc((size_t)(3 * n + 1) * sizeof *h);
    if (!h) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "grouping %lld indices", (long long)n);
    int64_t *rows = h, *first = h + n, *pos = h + 2 * n + 1;
    if (limit <= 2 * n + 4096) {
        // Counting: start[r] is where row r's positions begin in pos; i ascending keeps order.
        int64_t *start = calloc((size_t)limit + 1, sizeof *start);
        if (!start) {
            free(h);
            return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "grouping %lld indices into %lld rows",
                             (long long)n, (long long)limit);
        }
        for (int64_t i = 0; i < n; i++) start[index_at(idx, i) + 1]++;
        for (int64_t r = 0; r < limit; r++) start[r + 1] += start[r];
        for (int64_t i = 0; i < n; i++) pos[start[index_at(idx, i)]++] = i;
        free(start);
    } else {
        index_pos *p = malloc((size_t)n * sizeof *p);
        if (!p) {
            free(h);
            return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "grouping %lld indices", (long long)n);
        }
        for (int64_t i = 0; i < n; i++) p[i] = (index_pos){index_at(idx, i), i};
        qsort(p, (size_t)n, sizeof *p, by_index_then_pos);
        for (int64_t j = 0; j < n; j++) pos[j] = p[j].pos;
        free(p);
    }
    int64_t ng = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t r = index_at(idx, pos[j]);
        if (ng == 0 || r != rows[ng - 1]) {
            rows[ng] = r;
            first[ng++] = j;
        }
    }
    first[ng] = n;
    // One block: rows [ng], first [ng + 1], pos [n].
    memmove(h + ng, first, (size_t)(ng + 1) * sizeof *h);
    memmove(h + 2 * ng + 1, pos, (size_t)n * sizeof *h);
    size_t n_words = (size_t)(2 * ng + 1 + n);
    int64_t *d = gpu_host_bytes_to_device(ctx, dev, h, n_words * sizeof *h, "the indices");
    free(h);
    if (!d) return false;
    *g = (cuda_row_groups){ng, d, d + ng, d + 2 * ng + 1};
    *block = d;
    return true;
}

// ---- Gather, UnsortedSegmentSum ----

static bool gather_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    const dg_tensor *p = IN(0), *idx = IN(1);
    dg_shape os;
    if (!cpu_gather_shape(ctx, &os) || !gpu_prepare_input_range(ctx, dev, 0, 1)) return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, p->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    void *indices = gpu_host_input_to_device(ctx, dev, idx, "the indices");
    if (!indices) return false;
    cudaError_t err = cuda_launch_gather(is_f64(p), p->data, indices, idx->dtype == DG_INT64,
                                         idx->n_elements, row_elems(p), o->data, dev->stream);
    exec_cuda_mem_free(dev, indices);   // safe by stream order
    return launched(ctx, dev, err);
}

static bool segment_sum_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    const dg_tensor *d = IN(0), *ids = IN(1);
    dg_shape os;
    if (!cpu_segment_sum_shape(ctx, &os) || !gpu_prepare_input_range(ctx, dev, 0, 1))
        return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, d->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    cuda_row_groups g = {0, NULL, NULL, NULL};
    void *block = NULL;
    if (ids->n_elements > 0 && !group_rows(ctx, dev, ids, os.dims[0], &g, &block)) return false;
    cudaError_t err = cuda_launch_segment_sum(is_f64(d), d->data, g, row_elems(d), o->data,
                                              os.dims[0], dev->stream);
    exec_cuda_mem_free(dev, block);   // safe by stream order
    return launched(ctx, dev, err);
}

// ---- ScatterAdd, ScatterSub, ScatterUpdate: in place on input 0, the variable ----

typedef struct scatter_state {
    exec_cuda_device *dev;
    cuda_scatter_op op;
} scatter_state;

static void *scatter_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    scatter_state *s = malloc(sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "scatter: out of memory");
        return NULL;
    }
    const char *op = n->op->name;
    s->dev = dev;
    s->op = strcmp(op, "ScatterAdd") == 0   ? CUDA_SCATTER_ADD
            : strcmp(op, "ScatterSub") == 0 ? CUDA_SCATTER_SUB
                                            : CUDA_SCATTER_UPDATE;
    return s;
}

static bool scatter_compute(void *state, exec_ctx *ctx) {
    scatter_state *s = state;
    exec_cuda_device *dev = s->dev;
    dg_tensor *var = IN(0);
    const dg_tensor *idx = IN(1), *up = IN(2);
    if (!cpu_scatter_check(ctx) || !gpu_prepare_input_range(ctx, dev, 0, 1) ||
        !gpu_prepare_input_range(ctx, dev, 2, 1))
        return false;
    int64_t row = row_elems(var);
    if (idx->n_elements > 0 && row > 0) {
        cuda_row_groups g;
        void *block;
        if (!group_rows(ctx, dev, idx, var->shape.dims[0], &g, &block)) return false;
        cudaError_t err = cuda_launch_scatter(is_f64(var), s->op, var->data, g, up->data, row,
                                              dev->stream);
        exec_cuda_mem_free(dev, block);   // safe by stream order
        if (!launched(ctx, dev, err)) return false;
    }
    exec_set_output(ctx, 0, var);
    return true;
}

// ---- SparseApplyAdagrad, SparseApplyMomentum, SparseApplyAdam: in place on the variable and its slots ----

typedef struct accum_state {
    exec_cuda_device *dev;
    cuda_accum_rule rule;
} accum_state;

static void *sparse_accum_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    accum_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s: out of memory", n->op->name);
        return NULL;
    }
    s->dev = dev;
    bool nesterov = false;
    if (strcmp(n->op->name, "SparseApplyMomentum") == 0) {
        dg_node_attr_bool(n, "use_nesterov", &nesterov);
        s->rule = nesterov ? CUDA_ACCUM_NESTEROV : CUDA_ACCUM_MOMENTUM;
    } else {
        s->rule = CUDA_ACCUM_ADAGRAD;
    }
    return s;
}

// SparseApplyAdagrad (var, accum, lr, grad, indices) and SparseApplyMomentum (the same, then
// momentum): a repeated index is applied once per occurrence, in order.
static bool sparse_accum_compute(void *state, exec_ctx *ctx) {
    accum_state *s = state;
    exec_cuda_device *dev = s->dev;
    dg_tensor *var = IN(0), *acc = IN(1);
    const dg_tensor *grad = IN(3), *idx = IN(4);
    bool momentum = s->rule != CUDA_ACCUM_ADAGRAD;
    if (!cpu_sparse_adagrad_check(ctx) || !gpu_prepare_input_range(ctx, dev, 0, 4) ||
        (momentum && !gpu_prepare_input_range(ctx, dev, 5, 1)))   // the indices (4) are host memory
        return false;
    int64_t row = row_elems(var);
    if (idx->n_elements > 0 && row > 0) {
        cuda_row_groups g;
        void *block;
        if (!group_rows(ctx, dev, idx, var->shape.dims[0], &g, &block)) return false;
        cudaError_t err = cuda_launch_sparse_accum(is_f64(var), s->rule, var->data, acc->data, scalar_ptr(IN(2)),
                                                   momentum ? scalar_ptr(IN(5)) : NULL, g, grad->data, row,
                                                   dev->stream);
        exec_cuda_mem_free(dev, block);   // safe by stream order
        if (!launched(ctx, dev, err)) return false;
    }
    exec_set_output(ctx, 0, var);
    return true;
}

// (var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad, indices): m and v
// decay and var steps on every row, also when no index is given, as on the CPU.
static bool sparse_adam_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    dg_tensor *var = IN(0);
    const dg_tensor *grad = IN(9), *idx = IN(10);
    if (!cpu_sparse_adam_check(ctx) || !gpu_prepare_input_range(ctx, dev, 0, 10)) return false;
    int64_t row = row_elems(var);
    if (var->n_elements > 0) {
        cuda_row_groups g = {0, NULL, NULL, NULL};
        void *block = NULL;
        if (idx->n_elements > 0 && !group_rows(ctx, dev, idx, var->shape.dims[0], &g, &block))
            return false;
        const void *scalars[6];
        for (int i = 0; i < 6; i++) scalars[i] = scalar_ptr(IN(3 + i));
        cudaError_t err = cuda_launch_sparse_adam(is_f64(var), var->data, IN(1)->data,
                                                  IN(2)->data, scalars, g, grad->data, row,
                                                  var->n_elements, dev->stream);
        exec_cuda_mem_free(dev, block);   // safe by stream order
        if (!launched(ctx, dev, err)) return false;
    }
    exec_set_output(ctx, 0, var);
    return true;
}

// ---- DynamicStitch(indices[N], data[N]): int32 indices (host), float data (device) ----

static bool dynamic_stitch_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    int h = ctx->n_inputs / 2;
    dg_shape os;
    if (!cpu_dynamic_stitch_shape(ctx, &os) || !gpu_prepare_input_range(ctx, dev, h, h))
        return false;
    const dg_tensor *d0 = IN(h);
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, d0->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    int64_t rows = os.dims[0], row = o->n_elements / rows;
    size_t row_bytes = (size_t)row * dg_dtype_size(d0->dtype);
    // Per output row, the device address of its row: the last given wins, as the CPU's copies
    // in this order; rows given by no index stay NULL (zeros).
    const void **src = calloc((size_t)rows, sizeof *src);
    if (!src) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "stitching %lld rows", (long long)rows);
    for (int k = 0; k < h; k++) {
        const int32_t *ix = IN(k)->data;
        for (int64_t i = 0; i < IN(k)->n_elements; i++)
            src[ix[i]] = (const char *)IN(h + k)->data + (size_t)i * row_bytes;
    }
    void *d = gpu_host_bytes_to_device(ctx, dev, src, (size_t)rows * sizeof *src, "the rows");
    free(src);
    if (!d) return false;
    cudaError_t err = cuda_launch_dynamic_stitch(is_f64(d0), d, rows, row, o->data, dev->stream);
    exec_cuda_mem_free(dev, d);   // safe by stream order
    return launched(ctx, dev, err);
}

// The updates alias their variable (output_is_ref), as the CPU kernels.
#define GPU_SPARSE_REF_KERNEL(op, create, compute, destroy) \
    {(op), "GPU", DT_FLOATS, (create), (compute), (destroy), false, true, false, NULL, false}

const exec_kernel_def gpu_sparse_kernels[] = {
    GPU_KERNEL("Gather", DT_FLOATS, gpu_dev_create, gather_compute, NULL),
    GPU_KERNEL("UnsortedSegmentSum", DT_FLOATS, gpu_dev_create, segment_sum_compute, NULL),
    GPU_SPARSE_REF_KERNEL("ScatterAdd", scatter_create, scatter_compute, free),
    GPU_SPARSE_REF_KERNEL("ScatterSub", scatter_create, scatter_compute, free),
    GPU_SPARSE_REF_KERNEL("ScatterUpdate", scatter_create, scatter_compute, free),
    GPU_SPARSE_REF_KERNEL("SparseApplyAdagrad", sparse_accum_create, sparse_accum_compute, free),
    GPU_SPARSE_REF_KERNEL("SparseApplyAdam", gpu_dev_create, sparse_adam_compute, NULL),
    GPU_SPARSE_REF_KERNEL("SparseApplyMomentum", sparse_accum_create, sparse_accum_compute, free),
    GPU_KERNEL("DynamicStitch", DT_BIT(DG_INT32), gpu_dev_create, dynamic_stitch_compute, NULL),
};
const int gpu_n_sparse_kernels = sizeof gpu_sparse_kernels / sizeof gpu_sparse_kernels[0];
