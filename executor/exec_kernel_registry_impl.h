/* The kernel registry (kernel_registry.c), keyed by (op, device type, dtype): device types add
 * their kernels, the executor and the placer look them up. */
#ifndef DG_EXEC_KERNEL_REGISTRY_IMPL_H
#define DG_EXEC_KERNEL_REGISTRY_IMPL_H

#include <stdbool.h>

#include "distgraph/graph.h"
#include "distgraph/tensor.h"
#include "exec_kernel_impl.h"

// The dtype a kernel is chosen by: input 0's, or output 0's for ops without inputs.
dg_dtype exec_kernel_dtype(const dg_node *n);
// The kernel for (op, device type, dtype), or NULL.
const exec_kernel_def *exec_kernel_find(const char *op, const char *device_type, dg_dtype t);
// Adds kernels to the registry; a device type's register_kernels calls it (the registry
// calls those once, on the first lookup). defs is borrowed for the life of the process.
void exec_register_kernels(const exec_kernel_def *defs, int n);
// Kernels registered (after the device types have registered theirs).
int exec_num_kernels(void);
// A placer callback: is there a kernel for n on device_type, and does the type take n
// (exec_device_type.supports)?
bool exec_kernel_supports(void *ctx, const dg_node *n, const char *device_type);

#endif
