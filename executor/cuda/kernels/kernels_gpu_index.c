/* GPU kernels for Tile, Select and OneHot, the array ops of the CPU's kernels_index.c that
 * had none (Transpose's is a box copy in kernels_gpu_nn.c). Each checks its inputs with the
 * CPU kernel's own functions (cpu_tile_shape, cpu_select_plan, cpu_one_hot_shape), so the
 * errors are the same, and queues the work through the launchers of index.cu.
 *
 * Memory rule (gpu_impl.h): multiples and depth are int tensors in host memory, read here.
 * Select's bool condition and OneHot's int indices are host memory too; the kernel reads them
 * on the device, so they go there as a staged copy into a block of the device's cache, given
 * back as soon as the work is queued (safe by stream order). The float values (x, t, e,
 * on_value, off_value) are device memory, read only there. As on the CPU a kernel is chosen by
 * input 0's dtype: Tile by x (floats only), Select by its bool condition and OneHot by its int
 * indices (the CPU's masks). The placer offers them only for nodes whose output is a float
 * (exec_kernel_supports), so a Select or OneHot of another dtype stays on the CPU too. */
#include "cpu_impl.h"
#include "gpu_impl.h"
#include "launch_index.h"

_Static_assert(DG_MAX_RANK <= CUDA_INDEX_MAX_RANK, "index.cu takes DG_MAX_RANK dims");

static bool is_f64(const dg_tensor *t) { return t->dtype == DG_FLOAT64; }

static bool launched(exec_ctx *ctx, exec_cuda_device *dev, cudaError_t err) {
    return gpu_check_launch(ctx, dev, err, ctx->node->op->name);
}

static bool tile_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    dg_tensor *x = IN(0);
    dg_shape os;
    if (!gpu_prepare_inputs(ctx, dev, 1) || !cpu_tile_shape(ctx, &os)) return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, x->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    return launched(ctx, dev, cuda_launch_tile(is_f64(x), x->data, x->shape.dims, o->data,
                                               os.dims, os.rank, dev->stream));
}

// Select(cond, t, e): t and e are floats of one dtype in dev's memory, cond a host bool.
static bool select_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    dg_tensor *c = IN(0), *t = IN(1), *e = IN(2);
    dg_shape os;
    int64_t strides[3][DG_MAX_RANK];
    if (!cpu_select_plan(ctx, &os, strides) || !gpu_prepare_input_range(ctx, dev, 1, 2))
        return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, t->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    uint8_t *cond = gpu_host_input_to_device(ctx, dev, c, "the condition");
    if (!cond) return false;
    cudaError_t err = cuda_launch_select(is_f64(t), cond, strides[0], t->data, strides[1],
                                         e->data, strides[2], o->data, os.rank, os.dims,
                                         dev->stream);
    exec_cuda_mem_free(dev, cond);   // safe by stream order
    return launched(ctx, dev, err);
}

// OneHot(indices, depth, on_value, off_value): indices and depth host ints, on_value and
// off_value float scalars in dev's memory, read by the kernel.
static bool one_hot_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    dg_tensor *ix = IN(0), *on = IN(2);
    if (ix->dtype != DG_INT32 && ix->dtype != DG_INT64)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "indices are %s, need int32 or int64",
                         dg_dtype_name(ix->dtype));
    dg_shape os;
    if (!cpu_one_hot_shape(ctx, &os) || !gpu_prepare_input_range(ctx, dev, 2, 2)) return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, on->dtype, os);
    if (!o || o->n_elements == 0) return o != NULL;
    void *indices = gpu_host_input_to_device(ctx, dev, ix, "the indices");
    if (!indices) return false;
    cudaError_t err = cuda_launch_one_hot(is_f64(on), indices, ix->dtype == DG_INT64,
                                          ix->n_elements, os.dims[os.rank - 1], on->data,
                                          IN(3)->data, o->data, dev->stream);
    exec_cuda_mem_free(dev, indices);   // safe by stream order
    return launched(ctx, dev, err);
}

const exec_kernel_def gpu_index_kernels[] = {
    GPU_KERNEL("Tile", DT_FLOATS, gpu_dev_create, tile_compute, NULL),
    GPU_KERNEL("Select", DT_BIT(DG_BOOL), gpu_dev_create, select_compute, NULL),
    GPU_KERNEL("OneHot", DT_BIT(DG_INT32) | DT_BIT(DG_INT64), gpu_dev_create, one_hot_compute,
               NULL),
};
const int gpu_n_index_kernels = sizeof gpu_index_kernels / sizeof gpu_index_kernels[0];
