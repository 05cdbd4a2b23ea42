/* Kernel registry keyed by (op, device type, dtype). Registration is explicit and happens
 * once, on the first lookup: each device type of the registry (device.h) registers its own
 * kernels, so this file names no device. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "device.h"
#include "exec_kernel_registry_impl.h"
#include "graph_impl.h"

static void init(void) {
    for (int i = 0; i < exec_num_device_types(); i++) exec_device_type_at(i)->register_kernels();
}

static const exec_kernel_def **kernels;   // grows as device types register theirs
static int n_kernels, cap_kernels;
static pthread_once_t once = PTHREAD_ONCE_INIT;

void exec_register_kernels(const exec_kernel_def *defs, int n) {
    base_reserve((void **)&kernels, sizeof *kernels, n_kernels, &cap_kernels, n);
    for (int i = 0; i < n; i++) kernels[n_kernels++] = &defs[i];
}

int exec_num_kernels(void) {
    pthread_once(&once, init);
    return n_kernels;
}


bool exec_kernel_supports(void *ctx, const dg_node *n, const char *device_type) {
    (void)ctx;
    const exec_kernel_def *k = exec_kernel_find(n->op->name, device_type, exec_kernel_dtype(n));
    if (!k) return false;
    const exec_device_type *type = exec_device_type_find(device_type);   // its own rules (device.h)
    return !type || !type->supports || type->supports(k, n);
}

dg_dtype exec_kernel_dtype(const dg_node *n) {
    if (n->n_inputs > 0) return dg_output_dtype(n->inputs[0]);
    return n->n_outputs > 0 ? n->out_dtypes[0] : DG_INVALID_DTYPE;
}

const exec_kernel_def *exec_kernel_find(const char *op, const char *device_type, dg_dtype t) {
    pthread_once(&once, init);
    for (int i = 0; i < n_kernels; i++) {
        const exec_kernel_def *k = kernels[i];
        if (strcmp(k->op, op) != 0 || strcmp(k->device_type, device_type) != 0) continue;
        if (t == DG_INVALID_DTYPE || (k->dtype_mask & DT_BIT(t))) return k;
    }
    return NULL;
}
