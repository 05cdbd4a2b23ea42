/* LocalAllReduce on GPUs: when every participant of a round is a GPU, the inputs are copied
 * into fresh device buffers and NCCL all-reduces them in place, queued on each device's
 * stream; otherwise (a CPU among them, or no NCCL) the host reduces and each GPU gets a copy
 * (executor/cpu/kernels_local_reduce.c). */
#include <stdlib.h>

#include "gpu_impl.h"
#include "local_reduce_impl.h"
#include "tensor_impl.h"

typedef struct gpu_lar {
    lar_kernel k;   // first: the group code sees a lar_kernel
    exec_cuda_device *dev;
} gpu_lar;

static bool nccl_reduce(dg_tensor *const *ins, void *const *devices, int n, bool mean,
                        dg_tensor **outs, dg_status *st) {
    // NCCL needs one distinct GPU per participant (ncclCommInitAll rejects a repeated device)
    // and each input in its participant's memory (the copies below are on that GPU's stream).
    // Otherwise the host reduces: UNIMPLEMENTED sends reduce_round down that path.
    if (n < 1) {
        dg_status_setf(st, DG_INTERNAL, "LocalAllReduce: %d participants", n);
        return false;
    }
    for (int i = 0; i < n; i++) {
        const exec_cuda_device *di = devices[i];
        bool usable = ins[i]->n_elements == 0 || gpu_tensor_in(ins[i], di);
        for (int j = 0; j < i && usable; j++)
            usable = ((const exec_cuda_device *)devices[j])->id != di->id;
        if (!usable) {
            dg_status_set(st, DG_UNIMPLEMENTED,
                          "LocalAllReduce: NCCL needs one GPU per participant");
            return false;
        }
    }
    exec_cuda_device **devs = calloc((size_t)n, sizeof *devs);
    void **bufs = calloc((size_t)n, sizeof *bufs);
    bool ok = devs && bufs;
    if (!ok) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "LocalAllReduce: out of memory");
    for (int i = 0; i < n && ok; i++) {
        devs[i] = devices[i];
        outs[i] = gpu_tensor_new(devs[i], ins[i]->dtype, ins[i]->shape, st);
        ok = outs[i] && exec_cuda_memcpy_device(devs[i], outs[i]->data, ins[i]->data,
                                                ins[i]->nbytes, st);
        if (outs[i]) bufs[i] = outs[i]->data;
    }
    if (ok && ins[0]->n_elements > 0)
        ok = exec_cuda_nccl_all_reduce(devs, bufs, n, ins[0]->n_elements,
                                       ins[0]->dtype == DG_FLOAT64, mean, st);
    if (!ok)
        for (int i = 0; i < n; i++) dg_tensor_free(&outs[i]);
    free(devs);
    free(bufs);
    return ok;
}

static dg_tensor *to_device(void *device, dg_tensor *host, dg_status *st) {
    return gpu_to_device(device, host, st);
}

static void *lar_gpu_create(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_node_device(n, st);
    if (!dev) return NULL;
    gpu_lar *g = malloc(sizeof *g);
    if (!g) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    if (!lar_kernel_init(&g->k, n, env, st)) {
        free(g);
        return NULL;
    }
    g->dev = dev;
    g->k.device = dev;
    g->k.device_reduce = nccl_reduce;
    g->k.to_device = to_device;
    return g;
}

static void lar_gpu_destroy(void *state) {
    gpu_lar *g = state;
    lar_kernel_clear(&g->k);
    free(g);
}

static void lar_gpu_start(void *state, exec_ctx *ctx, exec_async_handle h) {
    gpu_lar *g = state;
    lar_arrive(&g->k, ctx, h);
}

const exec_kernel_def gpu_collective_kernels[] = {
    {"LocalAllReduce", "GPU", DT_FLOATS, lar_gpu_create, NULL, lar_gpu_destroy, true, false, false,
     lar_gpu_start, false},
};
const int gpu_n_collective_kernels = sizeof gpu_collective_kernels / sizeof gpu_collective_kernels[0];
