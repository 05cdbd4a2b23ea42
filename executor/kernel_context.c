/* What kernels call on their context (exec_ctx, exec_kernel_impl.h): their outputs and their errors.
 * Kept out of executor.c so that the kernel tables depend on this file, not on the scheduler
 * that runs them. Output slots keep their buffers between steps: an output is reused in place
 * when the step's slot allocated it and nothing else holds it. */
#include <stdarg.h>
#include <stdatomic.h>

#include "exec_kernel_impl.h"
#include "status_impl.h"
#include "tensor_impl.h"

bool exec_fail(exec_ctx *ctx, dg_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(ctx->st, code, fmt, ap);
    va_end(ap);
    return false;
}

dg_tensor *exec_reuse_output(exec_ctx *ctx, int i, dg_dtype dtype, dg_shape shape, tensor_mem mem) {
    dg_tensor *t = ctx->outputs[i];
    // A device buffer is wrapped (it goes back to the device's cache), a host one is the tensor's.
    if (t && ctx->owned[i] && t->dtype == dtype && tensor_mem_same(t->mem, mem) &&
        (mem.type ? !t->base && atomic_load_explicit(&t->refs, memory_order_acquire) == 1
                    : tensor_is_exclusive(t))) {
        int64_t n = tensor_shape_elements(&shape);
        if (n >= 0 && (size_t)n * dg_dtype_size(dtype) == t->nbytes) {
            t->shape = shape;
            t->n_elements = n;
            return t;
        }
    }
    dg_tensor_unref(t);
    ctx->outputs[i] = NULL;
    ctx->owned[i] = false;
    return NULL;
}

dg_tensor *exec_adopt_output(exec_ctx *ctx, int i, dg_tensor *t) {
    if (!t) {
        dg_status_prepend(ctx->st, "output %d", i);
        return NULL;
    }
    ctx->outputs[i] = t;
    ctx->owned[i] = true;
    return t;
}

dg_tensor *exec_alloc_output(exec_ctx *ctx, int i, dg_dtype dtype, dg_shape shape) {
    dg_tensor *t = exec_reuse_output(ctx, i, dtype, shape, TENSOR_MEM_HOST);
    return t ? t : exec_adopt_output(ctx, i, dg_tensor_new(dtype, shape, ctx->st));
}

void exec_set_output(exec_ctx *ctx, int i, dg_tensor *t) {
    dg_tensor_ref(t);
    dg_tensor_unref(ctx->outputs[i]);
    ctx->outputs[i] = t;
    ctx->owned[i] = false;
}

int exec_update_skipped(exec_ctx *ctx, int i) {
    if (ctx->n_inputs <= i) return 0;
    const dg_tensor *gate = ctx->inputs[i];
    if (gate->dtype != DG_BOOL || gate->n_elements != 1 || !tensor_on_host(gate)) {
        exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d, whether to apply, must be a bool scalar in host memory, got "
                  "%s with %lld elements", i, dg_dtype_name(gate->dtype), (long long)gate->n_elements);
        return -1;
    }
    if (((const bool *)gate->data)[0]) return 0;
    exec_set_output(ctx, 0, ctx->inputs[0]);
    return 1;
}
