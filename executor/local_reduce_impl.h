/* LocalAllReduce: the devices of one task sum (or average) a tensor each, and each gets the
 * result on its own device. One node per device, all sharing a group name; each is an async
 * kernel that arrives at the group's round for its step, and the last to arrive reduces for
 * all. CPU devices reduce on the host in device order; a device type with memory of its own
 * may plug in a reducer for rounds of its devices only (the GPU kernel in
 * executor/cuda/kernels/: NCCL). An aborted step fails the participants that wait and those
 * that come later. */
#ifndef DG_LOCAL_REDUCE_IMPL_H
#define DG_LOCAL_REDUCE_IMPL_H

#include "exec_kernel_impl.h"

typedef struct lar_round lar_round;

// What a participant's kernel keeps; a device kernel's state starts with this struct.
typedef struct lar_kernel {
    int rank, size;
    bool mean;
    char *shared_name;            // owned
    void *group;                  // borrowed from the resources
    void *device;                 // the kernel's device (its type's ctx), NULL on a CPU
    // Device kernels: reduce a round whose participants are all devices with this reducer
    // (GPUs: NCCL); false with st UNIMPLEMENTED leaves it to the host path. Sets outs[r] (new
    // references) or st.
    bool (*device_reduce)(dg_tensor *const *ins, void *const *devices, int n, bool mean,
                          dg_tensor **outs, dg_status *st);
    // Device kernels: the host result moved to this participant's device (a new reference).
    dg_tensor *(*to_device)(void *device, dg_tensor *host, dg_status *st);
} lar_kernel;

// Reads the attributes and finds the group; fills k. false with st set.
bool lar_kernel_init(lar_kernel *k, const dg_node *n, const exec_env *env, dg_status *st);
void lar_kernel_clear(lar_kernel *k);
// The participant's arrival (its start_async).
void lar_arrive(lar_kernel *k, exec_ctx *ctx, exec_async_handle h);

#endif
