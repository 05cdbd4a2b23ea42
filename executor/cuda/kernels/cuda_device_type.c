/* The GPU's device type (executor/device.h): what the executor and the runtime know of the
 * CUDA device. Float tensors live in the GPU's memory (dg_tensor.mem: "GPU" and the GPU's id),
 * every other dtype in host memory (gpu_impl.h). */
#include "distgraph/device_name.h"
#include "gpu_impl.h"
#include "graph_impl.h"

// Only float tensors live in the GPU's memory: a node with another output dtype runs here only
// when its kernel keeps such outputs on the host. A 16-bit float output needs a kernel that
// says it takes 16-bit floats: a kernel chosen by an int or bool input 0 (Fill, Select,
// OneHot, Conv2DBackpropInput, DynamicStitch) computes in float32 or float64 only.
static bool supports(const exec_kernel_def *k, const dg_node *n) {
    if (k->host_outputs) return true;
    for (int i = 0; i < n->n_outputs; i++) {
        dg_dtype t = n->out_dtypes[i];
        if (!gpu_dtype_on_device(t)) return false;
        if (dg_dtype_is_float16_family(t) && !(k->dtype_mask & DT_FLOAT16S)) return false;
    }
    return true;
}

static void *open_gpu(int id, dg_status *st) { return gpu_device(id, st); }

static void configure(const exec_device_config *c) { exec_cuda_set_allow_tf32(c->allow_tf32); }

const exec_device_type exec_cuda_device_type = {
    .name = DG_DEVICE_TYPE_GPU,
    .host_memory = false,
    .supports = supports,
    .count = exec_cuda_device_count,
    .unavailable_reason = exec_cuda_unavailable_reason,
    .register_kernels = exec_cuda_register,
    .ops = exec_cuda_device_ops,
    .open = open_gpu,
    .to_host = gpu_any_to_host,
    .configure = configure,
    .release_all = exec_cuda_release_all,
};
