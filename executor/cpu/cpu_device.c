/* The CPU device type (executor/device.h): one device, CPU:0, whose memory is the host's.
 * Its table moves bytes with malloc and memcpy and has nothing to wait for. Virtual CPUs
 * (dg_session_options.n_virtual_cpus) are names over this same device. */
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "device.h"
#include "distgraph/device_name.h"
#include "exec_cpu_impl.h"

// The ctx open gives for every CPU id (virtual CPUs share the host): the table's entries
// ignore it, but an opened device is never NULL.
static int host;

static void *cpu_alloc(void *ctx, size_t n_bytes, dg_status *st) {
    (void)ctx;
    if (n_bytes == 0) return NULL;
    void *p = malloc(n_bytes);
    if (!p)
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "CPU:0: out of memory allocating %zu bytes",
                       n_bytes);
    return p;
}

static void cpu_free(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static bool cpu_copy(void *ctx, void *dst, const void *src, size_t n_bytes, dg_status *st) {
    (void)ctx;
    (void)st;
    if (n_bytes) memcpy(dst, src, n_bytes);
    return true;
}

static bool cpu_synchronize(void *ctx, dg_status *st) {
    (void)ctx;
    (void)st;
    return true;
}

static const exec_device_ops cpu_ops = {
    .version = EXEC_DEVICE_OPS_VERSION,
    .type = DG_DEVICE_TYPE_CPU,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy_to_device = cpu_copy,
    .copy_to_host = cpu_copy,
    .synchronize = cpu_synchronize,
};

static const exec_device_ops *cpu_table(void) { return &cpu_ops; }

static int cpu_count(void) { return 1; }

static void *cpu_open(int id, dg_status *st) {
    if (id < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "CPU:%d: ids are not negative", id);
        return NULL;
    }
    return &host;
}

static dg_tensor *cpu_to_host(dg_tensor *t, dg_status *st) {
    (void)st;
    return dg_tensor_ref(t);
}

const exec_device_type exec_cpu_device_type = {
    .name = DG_DEVICE_TYPE_CPU,
    .host_memory = true,
    .count = cpu_count,
    .register_kernels = exec_cpu_register,
    .ops = cpu_table,
    .open = cpu_open,
    .to_host = cpu_to_host,
};
