/* What every GPU kernel shares: the process's GPU devices, tensors in device memory, outputs
 * that reuse their buffers between steps, copies on and off the device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"
#include "gpu_impl.h"
#include "status_impl.h"
#include "graph_impl.h"

// ---- devices: opened on first use, kept for the life of the process ----

#define GPU_MAX_DEVICES 64

static pthread_mutex_t devices_mu = PTHREAD_MUTEX_INITIALIZER;
static exec_cuda_device *devices[GPU_MAX_DEVICES];

exec_cuda_device *gpu_device(int id, dg_status *st) {
    if (id < 0 || id >= GPU_MAX_DEVICES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d: ids run from 0 to %d", id,
                       GPU_MAX_DEVICES - 1);
        return NULL;
    }
    pthread_mutex_lock(&devices_mu);
    exec_cuda_device *dev = devices[id];
    if (!dev) dev = devices[id] = exec_cuda_device_new(id, st);
    pthread_mutex_unlock(&devices_mu);
    return dev;
}

int64_t exec_cuda_release_all(void) {
    if (exec_cuda_device_count() == 0) return 0;
    exec_cuda_nccl_release();
    pthread_mutex_lock(&devices_mu);
    for (int id = 0; id < GPU_MAX_DEVICES; id++) exec_cuda_device_free(&devices[id]);
    pthread_mutex_unlock(&devices_mu);
    return cuda_mem_release_all();
}

exec_cuda_device *gpu_node_device(const dg_node *n, dg_status *st) {
    const char *name = n->assigned_device && *n->assigned_device ? n->assigned_device
                                                                  : n->requested_device;
    dg_device_name dn;
    if (!name || !dg_device_name_parse(name, &dn, st)) {
        dg_status_prepend(st, "node \"%s\" (%s)", n->name, n->op->name);
        return NULL;
    }
    if (!dn.has_type || strcmp(dn.type, "GPU") != 0) {
        dg_status_setf(st, DG_INTERNAL, "node \"%s\" (%s): a GPU kernel for a node on \"%s\"",
                       n->name, n->op->name, name);
        return NULL;
    }
    exec_cuda_device *dev = gpu_device(dn.has_id ? dn.id : 0, st);
    if (!dev) dg_status_prepend(st, "node \"%s\" (%s) on %s", n->name, n->op->name, name);
    return dev;
}

void *gpu_dev_create(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)env;
    return gpu_node_device(n, st);
}

// ---- tensors in device memory ----

// The GPU device type's name (exec_cuda_device_type.name) names the memory of its tensors.
bool gpu_tensor_on_device(const dg_tensor *t) {
    return t && t->mem.type && strcmp(t->mem.type, DG_DEVICE_TYPE_GPU) == 0;
}

tensor_mem gpu_mem(const exec_cuda_device *dev) { return (tensor_mem){DG_DEVICE_TYPE_GPU, dev->id}; }

bool gpu_tensor_in(const dg_tensor *t, const exec_cuda_device *dev) {
    return t && tensor_mem_same(t->mem, gpu_mem(dev));
}

static void release_block(void *data, size_t n_bytes, void *arg) {
    (void)n_bytes;
    exec_cuda_mem_free(arg, data);
}

dg_tensor *gpu_tensor_new(exec_cuda_device *dev, dg_dtype dtype, dg_shape shape, dg_status *st) {
    int64_t n = tensor_shape_elements(&shape);
    if (n < 0 || !dg_dtype_is_valid(dtype)) {
        char b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "GPU:%d: no tensor of %s %s", dev->id,
                       dg_dtype_name(dtype), dg_shape_str(&shape, b, sizeof b));
        return NULL;
    }
    size_t nbytes = (size_t)n * dg_dtype_size(dtype);
    void *p = NULL;
    if (nbytes > 0 && !(p = exec_cuda_mem_alloc(dev, nbytes, st))) return NULL;
    dg_tensor *t = dg_tensor_wrap(dtype, shape, p, nbytes, nbytes ? release_block : NULL, dev, st);
    if (!t) {
        exec_cuda_mem_free(dev, p);
        return NULL;
    }
    t->mem = gpu_mem(dev);
    return t;
}

dg_tensor *gpu_alloc_output(exec_cuda_device *dev, exec_ctx *ctx, int i, dg_dtype dtype,
                            dg_shape shape) {
    if (!gpu_dtype_on_device(dtype)) return exec_alloc_output(ctx, i, dtype, shape);
    // The slot's buffer is reused when nothing else holds it: same GPU, same byte count.
    // Under DG_GPU_POISON=1 a reused buffer is poisoned like a fresh one.
    dg_tensor *t = exec_reuse_output(ctx, i, dtype, shape, gpu_mem(dev));
    if (t) return exec_cuda_poison(dev, t->data, t->nbytes, ctx->st) ? t : NULL;
    return exec_adopt_output(ctx, i, gpu_tensor_new(dev, dtype, shape, ctx->st));
}

// ---- copies on and off the device ----



static void release_pinned(void *data, size_t n_bytes, void *arg) {
    (void)n_bytes;
    (void)arg;
    exec_cuda_host_free(data);
}

dg_tensor *gpu_to_host(exec_cuda_device *dev, dg_tensor *t, dg_status *st) {
    if (!t || tensor_on_host(t)) return dg_tensor_ref(t);
    if (!gpu_tensor_in(t, dev)) {
        dg_status_setf(st, DG_INTERNAL, "GPU:%d: a tensor of %s:%d to copy to the host", dev->id,
                       t->mem.type, t->mem.index);
        return NULL;
    }
    void *p = NULL;
    if (t->nbytes && !(p = exec_cuda_host_alloc(t->nbytes, st))) return NULL;
    dg_tensor *h = dg_tensor_wrap(t->dtype, t->shape, p, t->nbytes, p ? release_pinned : NULL,
                                  NULL, st);
    if (!h) {
        exec_cuda_host_free(p);
        return NULL;
    }
    if (t->nbytes && !exec_cuda_memcpy_to_host(dev, p, t->data, t->nbytes, st)) {
        dg_tensor_unref(h);
        return NULL;
    }
    return h;
}

dg_tensor *gpu_to_device(exec_cuda_device *dev, dg_tensor *t, dg_status *st) {
    if (!t || gpu_tensor_in(t, dev) || !gpu_dtype_on_device(t->dtype))
        return dg_tensor_ref(t);
    if (!tensor_on_host(t)) {
        dg_status_setf(st, DG_UNIMPLEMENTED, "GPU:%d: a tensor of %s:%d: copies between devices go "
                       "through the host", dev->id, t->mem.type, t->mem.index);
        return NULL;
    }
    dg_tensor *d = gpu_tensor_new(dev, t->dtype, t->shape, st);
    if (!d) return NULL;
    if (t->nbytes && !exec_cuda_memcpy_to_device(dev, d->data, t->data, t->nbytes, st)) {
        dg_tensor_unref(d);
        return NULL;
    }
    return d;
}

void *gpu_host_bytes_to_device(exec_ctx *ctx, exec_cuda_device *dev, const void *src,
                               size_t n_bytes, const char *what) {
    void *d = exec_cuda_mem_alloc(dev, n_bytes, ctx->st);
    if (d && !exec_cuda_memcpy_to_device(dev, d, src, n_bytes, ctx->st)) {
        exec_cuda_mem_free(dev, d);
        d = NULL;
    }
    if (!d) dg_status_prepend(ctx->st, "copying %s to GPU:%d", what, dev->id);
    return d;
}

void *gpu_host_input_to_device(exec_ctx *ctx, exec_cuda_device *dev, const dg_tensor *t,
                               const char *what) {
    if (!tensor_on_host(t)) {
        exec_fail(ctx, DG_INTERNAL, "%s (%s) is not in host memory", what,
                  dg_dtype_name(t->dtype));
        return NULL;
    }
    return gpu_host_bytes_to_device(ctx, dev, t->data, t->nbytes, what);
}

bool gpu_gemm(exec_ctx *ctx, exec_cuda_device *dev, dg_dtype dtype, bool trans_a, bool trans_b, int64_t m,
              int64_t n, int64_t k, const void *a, int64_t lda, const void *b, int64_t ldb, void *c, int64_t ldc) {
    switch (dtype) {
    case DG_FLOAT32:
        return exec_cuda_sgemm(dev, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, ctx->st);
    case DG_FLOAT64:
        return exec_cuda_dgemm(dev, trans_a, trans_b, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc, ctx->st);
    case DG_BFLOAT16:
    case DG_FLOAT16:
        return exec_cuda_gemm16(dev, dtype == DG_BFLOAT16, trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c,
                                ldc, ctx->st);
    default:
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "a GPU GEMM of %s", dg_dtype_name(dtype));
    }
}

bool gpu_check_launch_at(exec_ctx *ctx, exec_cuda_device *dev, cudaError_t err,
                        const char *what, const char *file, int line) {
    if (err == cudaSuccess) return true;
    cuda_set_status(ctx->st, err, what, file, line);
    dg_status_prepend(ctx->st, "GPU:%d", dev->id);
    return false;
}

bool gpu_prepare_input_range(exec_ctx *ctx, exec_cuda_device *dev, int first, int n) {
    const dg_tensor *x0 = ctx->inputs[first];
    for (int i = first; i < first + n; i++) {
        const dg_tensor *x = ctx->inputs[i];
        if (!x) return exec_fail(ctx, DG_FAILED_PRECONDITION, "input %d has no value", i);
        if (!gpu_dtype_on_device(x->dtype) || x->dtype != x0->dtype)
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d is %s, the GPU kernel takes %s",
                             i, dg_dtype_name(x->dtype),
                             gpu_dtype_on_device(x0->dtype) ? dg_dtype_name(x0->dtype)
                                                            : "float32 or float64");
        if (x->n_elements > 0 && !gpu_tensor_in(x, dev))
            return exec_fail(ctx, DG_INTERNAL, "input %d (%s, %lld elements) is not in the "
                             "memory of GPU:%d", i, dg_dtype_name(x->dtype),
                             (long long)x->n_elements, dev->id);
    }
    return gpu_check_launch(ctx, dev, cudaSetDevice(dev->id), "cudaSetDevice");
}

bool gpu_prepare_inputs(exec_ctx *ctx, exec_cuda_device *dev, int n) {
    return gpu_prepare_input_range(ctx, dev, 0, n);
}

// ---- host copies for code outside the kernels (exec_tensor_to_host) ----

dg_tensor *gpu_any_to_host(dg_tensor *t, dg_status *st) {
    if (!t || tensor_on_host(t)) return dg_tensor_ref(t);
    if (!gpu_tensor_on_device(t)) {
        dg_status_setf(st, DG_INTERNAL, "the GPU asked to copy a tensor of %s:%d", t->mem.type, t->mem.index);
        return NULL;
    }
    exec_cuda_device *dev = gpu_device(t->mem.index, st);
    return dev ? gpu_to_host(dev, t, st) : NULL;
}
