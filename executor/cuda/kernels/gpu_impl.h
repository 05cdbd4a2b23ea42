/* Shared by the GPU kernels (the C files of executor/cuda/kernels/). These C files hold the kernels' host side
 * (checking inputs, allocating outputs, naming the node in errors) and call launchers in
 * executor/cuda/ *.cu, which only queue work on the device's stream.
 *
 * Memory rule: on a GPU device float32 and float64 tensors live in device memory; int32,
 * int64, uint8 and bool tensors live in host memory (TensorFlow's HostMemory convention for
 * int32, extended to every non-float dtype). Shapes, axes, labels and indices therefore reach
 * a GPU kernel as host tensors it reads directly, and a node whose outputs are not floats
 * runs on a GPU only when its kernel says so (exec_kernel_def.host_outputs; e.g. Shape).
 *
 * Order: every GPU kernel of a device queues its work on the device's one stream and returns;
 * nothing waits for the GPU except a copy to the host (_Send off the device, fetches). */
#ifndef DG_GPU_IMPL_H
#define DG_GPU_IMPL_H

#include "cuda_alloc.h"
#include "cuda_impl.h"
#include "exec_kernel_impl.h"

// True for the dtypes that live in device memory on a GPU: the floats, 16-bit ones too.
static inline bool gpu_dtype_on_device(dg_dtype t) {
    return t == DG_FLOAT32 || t == DG_FLOAT64 || t == DG_BFLOAT16 || t == DG_FLOAT16;
}

// The GPU a node is assigned to ("/job:w/replica:0/task:0/device:GPU:1" -> GPU 1), opened on
// first use and kept for the life of the process. Returns: borrowed; NULL with st set.
exec_cuda_device *gpu_node_device(const dg_node *n, dg_status *st);
// GPU id's process-wide device, opened on first use. Returns: borrowed; NULL with st set.
exec_cuda_device *gpu_device(int id, dg_status *st);

// A kernel create() for kernels whose only state is their device: returns the
// exec_cuda_device (borrowed; destroy must be NULL), which GPU_DEV(state) gives back in
// compute. Kernels with more state keep a struct holding the device and free it in destroy.
void *gpu_dev_create(const dg_node *n, const exec_env *env, dg_status *st);
#define GPU_DEV(state) ((exec_cuda_device *)(state))

// True when t's buffer is GPU memory (of any GPU).
bool gpu_tensor_on_device(const dg_tensor *t);
// The memory identity of dev's tensors (dg_tensor.mem: the GPU device type and dev's id).
tensor_mem gpu_mem(const exec_cuda_device *dev);
// True when t's buffer is dev's memory.
bool gpu_tensor_in(const dg_tensor *t, const exec_cuda_device *dev);
// A tensor in dev's memory (uninitialised; poisoned under DG_GPU_POISON=1).
// Returns: new, caller releases with dg_tensor_unref(); NULL with st set.
dg_tensor *gpu_tensor_new(exec_cuda_device *dev, dg_dtype dtype, dg_shape shape, dg_status *st);
// Output i: in dev's memory for float dtypes, in host memory otherwise (exec_alloc_output).
// Reuses the slot's buffer from the last step when it is free and of the same size and kind.
// Returns: borrowed, held by the step; NULL with ctx->st set (naming the output).
dg_tensor *gpu_alloc_output(exec_cuda_device *dev, exec_ctx *ctx, int i, dg_dtype dtype,
                            dg_shape shape);
// A host copy of t (t itself, with a new reference, when it is already in host memory). Waits
// for the copy. The copy's buffer is pinned memory. Returns: new; NULL with st set.
dg_tensor *gpu_to_host(exec_cuda_device *dev, dg_tensor *t, dg_status *st);
// A device copy of t (t itself, with a new reference, when it is already in dev's memory or
// its dtype lives on the host). The copy is queued. Returns: new; NULL with st set.
dg_tensor *gpu_to_device(exec_cuda_device *dev, dg_tensor *t, dg_status *st);

// Turns a launcher's result into the kernel's status: "GPU:<id>: <what> at <file>:<line>:
// <CUDA error>". Returns false on error (ctx->st set), true on cudaSuccess.
#define gpu_check_launch(ctx, dev, err, what) \
    gpu_check_launch_at((ctx), (dev), (err), (what), __FILE__, __LINE__)
bool gpu_check_launch_at(exec_ctx *ctx, exec_cuda_device *dev, cudaError_t err,
                         const char *what, const char *file, int line);
// Checks that inputs [0, n) are float tensors of input 0's dtype in dev's memory (an empty
// tensor may be anywhere) and makes dev the thread's current GPU for the launches. false with
// ctx->st set naming the input.
bool gpu_prepare_inputs(exec_ctx *ctx, exec_cuda_device *dev, int n);
// The same for inputs [first, first + n), of input first's dtype: the float inputs of a kernel
// whose leading inputs are host memory (Select's condition, OneHot's indices and depth).
bool gpu_prepare_input_range(exec_ctx *ctx, exec_cuda_device *dev, int first, int n);
// Row-major C = op(A) op(B) (m x n, sums over k) in dtype (float32, float64, or bfloat16 and
// float16 with float32 sums) on dev's stream; a, b, c are device memory. false with ctx->st set
// (the caller prepends its op).
bool gpu_gemm(exec_ctx *ctx, exec_cuda_device *dev, dg_dtype dtype, bool trans_a, bool trans_b, int64_t m,
              int64_t n, int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc);
// A host copy of t whichever GPU holds it (a new reference to t when it is host memory).
dg_tensor *gpu_any_to_host(dg_tensor *t, dg_status *st);
// A copy of n_bytes (> 0) of host memory at src in dev's memory, queued on its stream (src may
// be freed on return: the copy is staged); what names it in errors. Host-memory inputs that a
// kernel reads on the device (Select's condition, indices) and plans built on the host go
// there this way, once per step. Returns: new, release with exec_cuda_mem_free() (at once is
// safe: the block goes only to work queued later); NULL with ctx->st set.
void *gpu_host_bytes_to_device(exec_ctx *ctx, exec_cuda_device *dev, const void *src,
                               size_t n_bytes, const char *what);
// The same for the bytes of host tensor t (non-empty; INTERNAL when t is device memory).
void *gpu_host_input_to_device(exec_ctx *ctx, exec_cuda_device *dev, const dg_tensor *t,
                               const char *what);

// A kernel table entry for the GPU: (op, dtype mask, create, compute, destroy).
#define GPU_KERNEL(op, mask, create, compute, destroy) \
    {(op), "GPU", (mask), (create), (compute), (destroy), false, false, false, NULL, false}

// The kernel groups; gpu_register.c registers them all.
extern const exec_kernel_def gpu_state_kernels[];     // kernels_gpu_state.c
extern const int gpu_n_state_kernels;
extern const exec_kernel_def gpu_sendrecv_kernels[];  // kernels_gpu_sendrecv.c
extern const int gpu_n_sendrecv_kernels;
extern const exec_kernel_def gpu_math_kernels[];      // kernels_gpu_math.c
extern const int gpu_n_math_kernels;
extern const exec_kernel_def gpu_nn_kernels[];        // kernels_gpu_nn.c
extern const int gpu_n_nn_kernels;
extern const exec_kernel_def gpu_index_kernels[];     // kernels_gpu_index.c
extern const int gpu_n_index_kernels;
extern const exec_kernel_def gpu_sparse_kernels[];    // kernels_gpu_sparse.c
extern const int gpu_n_sparse_kernels;
extern const exec_kernel_def gpu_conv_kernels[];      // kernels_gpu_conv.c
extern const int gpu_n_conv_kernels;
extern const exec_kernel_def gpu_collective_kernels[];  // kernels_gpu_collective.c
extern const int gpu_n_collective_kernels;
extern const exec_kernel_def gpu_transformer_kernels[];  // kernels_gpu_transformer.c
extern const int gpu_n_transformer_kernels;

#endif
