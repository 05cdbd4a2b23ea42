/* A kernel as the executor sees it: its definition (exec_kernel_def, what a device type
 * registers, exec_kernel_registry_impl.h), the context it computes on (exec_ctx), what it
 * calls on that context (kernel_context.c) and how an asynchronous kernel finishes
 * (exec_async_done, executor.c). Every kernel file includes this header. */
#ifndef DG_EXEC_KERNEL_IMPL_H
#define DG_EXEC_KERNEL_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"
#include "tensor_impl.h"   // tensor_mem

typedef struct exec_resources exec_resources;   // exec_resources_impl.h
typedef struct exec_step exec_step;             // one step of an executable (executor.c)

// Identifies one node's run in one step, for kernels that finish later (async kernels).
typedef struct exec_async_handle {
    exec_step *step;
    int node;
} exec_async_handle;

typedef struct exec_ctx {
    dg_tensor **inputs;     // borrowed, n_inputs
    int n_inputs;
    dg_tensor **outputs;    // the step's value slots for this node's outputs
    bool *owned;            // per output: allocated by exec_alloc_output
    int n_outputs;
    const dg_node *node;
    exec_step *step;
    dg_status *st;          // per-step scratch status for kernel errors
} exec_ctx;

typedef struct exec_env {
    exec_resources *rm;     // borrowed
    const char *device;     // canonical device name
    int intra_op_threads;
} exec_env;

typedef struct exec_kernel_def {
    const char *op;
    const char *device_type;   // its device type's name (exec_device_type.name)
    uint32_t dtype_mask;       // bit (1u << dtype) of supported dtypes of the op's type dtype
    // Reads attributes once per graph; returns the kernel's state (may be (void*)1 when it
    // needs none) or NULL with st set.
    void *(*create)(const dg_node *n, const exec_env *env, dg_status *st);
    // Computes one step. Returns false after setting ctx->st.
    bool (*compute)(void *state, exec_ctx *ctx);
    void (*destroy)(void *state);
    bool expensive;       // worth handing to another thread; also set for kernels that block
                          // their thread (collectives): never run on an I/O thread
    bool output_is_ref;   // outputs alias a variable's buffer: copy on fetch
    bool takes_uninit;    // input 0 may be an uninitialised variable (NULL tensor)
    // Async kernels (compute NULL): start the work and return; whoever finishes it calls
    // exec_async_done exactly once. ctx is valid only during the call.
    void (*start_async)(void *state, exec_ctx *ctx, exec_async_handle h);
    // The kernel keeps outputs whose dtype its device's memory does not hold in host memory, so
    // the node may run on a device that holds only floats (the GPU: its device type's supports,
    // executor/cuda/kernels/gpu_impl.h). Without it such a kernel is offered to the placer only
    // for nodes whose outputs are all floats.
    bool host_outputs;
} exec_kernel_def;

// Completes an async kernel: out (consumed; NULL on error) becomes output 0; st (NULL: OK)
// fails the step. May be called from any thread, also from inside start_async.
void exec_async_done(exec_async_handle h, dg_tensor *out, const dg_status *st);

// Masks of dtypes (exec_kernel_def.dtype_mask).
#define DT_BIT(t) (1u << (t))
#define DT_FLOATS (DT_BIT(DG_FLOAT32) | DT_BIT(DG_FLOAT64))
#define DT_NUMERIC (DT_FLOATS | DT_BIT(DG_INT32) | DT_BIT(DG_INT64))
#define DT_ALL (DT_NUMERIC | DT_BIT(DG_BOOL) | DT_BIT(DG_UINT8))
// The 16-bit floats, and every dtype: kernels that move, store or convert values whatever
// they are take DT_STORAGE; kernels that compute list the 16-bit floats where they take them.
#define DT_FLOAT16S (DT_BIT(DG_BFLOAT16) | DT_BIT(DG_FLOAT16))
#define DT_STORAGE (DT_ALL | DT_FLOAT16S)

// ---- what kernels call on their context (kernel_context.c) ----
// An output tensor of the given dtype and shape in host memory, reusing the slot's buffer from
// the last step when it is free. Returns: borrowed, held by the step; NULL with ctx->st set on
// failure.
dg_tensor *exec_alloc_output(exec_ctx *ctx, int i, dg_dtype dtype, dg_shape shape);
// The two halves of it, for devices with memory of their own. exec_reuse_output: the tensor
// in output slot i when it can take dtype and shape in place (allocated by the slot, held by
// nobody else, same dtype and byte count, in the memory mem names: dg_tensor.mem), reshaped;
// otherwise the slot is emptied and NULL returned.
// exec_adopt_output: puts t, newly made for slot i, in it and returns it; NULL t (making it
// failed) prefixes "output i" to the status.
dg_tensor *exec_reuse_output(exec_ctx *ctx, int i, dg_dtype dtype, dg_shape shape, tensor_mem mem);
dg_tensor *exec_adopt_output(exec_ctx *ctx, int i, dg_tensor *t);
// Sets output i to t (takes a new reference), e.g. forwarding an input.
void exec_set_output(exec_ctx *ctx, int i, dg_tensor *t);
// The optional last input of an optimizer update (input i, when given): a bool scalar in host
// memory, false to leave the variable and its slots as they are this step (the loss scaler's
// skip). 1: skipped, output 0 forwards input 0; 0: apply; -1: not a bool scalar in host memory
// (ctx->st set).
int exec_update_skipped(exec_ctx *ctx, int i);
// Sets an error on the kernel context naming the node. Returns false.
bool exec_fail(exec_ctx *ctx, dg_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
