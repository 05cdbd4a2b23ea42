/* The executor's device interface (after ggml's backend interface). A
 * device type is one table, exec_device_type: its name in device names, how many devices of it
 * this process has, its memory and ordering primitives (exec_device_ops), its kernel table, and
 * host copies of its tensors. The registry lists the types this build has, the CPU first and
 * always, then the CUDA GPU when built with it (the one #ifdef DG_WITH_CUDA, in device.c). Code
 * outside executor/cuda/ knows a device only through these tables.
 * Thread safety: the tables are immutable and every function here may be called from any
 * thread. No CUDA header is needed to include this file (the .cu files include it too). */
#ifndef DG_EXEC_DEVICE_H
#define DG_EXEC_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- a device's memory and ordering primitives ----

#define EXEC_DEVICE_OPS_VERSION 1

// One device type's memory and ordering primitives. A device is the table plus the ctx
// passed as every entry's first argument (exec_device_type.open gives it). Entries after
// `synchronize` are optional and may be NULL: the fallback for missing events is synchronize.
// Copies are asynchronous and ordered on the device's stream: the host buffer of a copy
// must stay valid and unchanged, and a device->host destination must not be read, until
// synchronize returns.
typedef struct exec_device_ops {
    int version;                 // EXEC_DEVICE_OPS_VERSION when the table was built
    const char *type;            // device type in device names (exec_device_type.name)
    // Returns: new device memory, release with free(); NULL with st set (out of memory is
    // RESOURCE_EXHAUSTED naming the size and device). n_bytes 0 returns NULL and st OK.
    void *(*alloc)(void *ctx, size_t n_bytes, dg_status *st);
    // Releases memory from alloc; NULL does nothing. Waits for work queued on the device.
    void (*free)(void *ctx, void *ptr);
    bool (*copy_to_device)(void *ctx, void *dst, const void *src, size_t n_bytes,
                           dg_status *st);
    bool (*copy_to_host)(void *ctx, void *dst, const void *src, size_t n_bytes,
                         dg_status *st);
    // Waits for everything queued on the device so far; reports errors of queued work.
    bool (*synchronize)(void *ctx, dg_status *st);
    // Optional. event_record returns a new event marking the work queued so far (release
    // with event_free, also while pending); event_wait makes work queued on ctx's device
    // after it wait for the event, without blocking the host. The event may come from
    // another device of the same type.
    void *(*event_record)(void *ctx, dg_status *st);
    bool (*event_wait)(void *ctx, void *event, dg_status *st);
    void (*event_free)(void *ctx, void *event);
} exec_device_ops;

// ---- device types ----

// Process-wide settings a session passes to every device type (exec_devices_configure).
typedef struct exec_device_config {
    bool allow_tf32;   // MatMul may use TF32 (dg_session_options.gpu_allow_tf32)
} exec_device_config;

// One kind of device. Entries marked optional may be NULL.
struct exec_kernel_def;   // exec_kernel_impl.h

typedef struct exec_device_type {
    const char *name;             // the type in device names, upper-case ("CPU", ...)
    bool host_memory;             // its tensors live in host memory; else its kernels mark theirs
                                  // with its name and the device's index (dg_tensor.mem)
    // Optional: whether node n, which has kernel k of this type, may run on this type (the
    // placer asks through exec_kernel_supports); NULL: every node with a kernel may. The GPU
    // keeps only floats in its memory, so it refuses a node with another output dtype unless
    // its kernel keeps such outputs on the host (exec_kernel_def.host_outputs).
    bool (*supports)(const struct exec_kernel_def *k, const dg_node *n);
    // Devices of this type in this process (ids 0 .. count-1); never prints or aborts.
    int (*count)(void);
    // Optional: why count() is 0 ("" when it is not). Returns: borrowed, static.
    const char *(*unavailable_reason)(void);
    // Registers the type's kernels (exec_register_kernels); called once, by the registry.
    void (*register_kernels)(void);
    // The type's device table (a device is the table plus the ctx open gives).
    // Returns: borrowed, static.
    const exec_device_ops *(*ops)(void);
    // Device id's process-wide ctx for ops, opened on first use and kept for the life of the
    // process. Returns: borrowed; NULL with st set (an id out of range, a device that fails).
    void *(*open)(int id, dg_status *st);
    // A host copy of t, which is in host memory or in the memory of a device of this type
    // (t itself with a new reference when it is already host memory). Waits for the copy.
    // Returns: new; NULL with st set.
    dg_tensor *(*to_host)(dg_tensor *t, dg_status *st);
    // Optional: applies c to every device of the type, present and future.
    void (*configure)(const exec_device_config *c);
    // Optional: gives back what the process holds on devices of this type (cached memory,
    // streams, communicators), for the end of a program or a test; only when nothing uses them
    // any more. Returns the bytes still handed out (a leak), 0 when none.
    int64_t (*release_all)(void);
} exec_device_type;

// The types, defined next to their kernels (executor/cpu/cpu_device.c,
// executor/cuda/kernels/cuda_device_type.c); the second exists only when built with CUDA.
extern const exec_device_type exec_cpu_device_type;
extern const exec_device_type exec_cuda_device_type;

// ---- the registry ----

// Number of device types in this build and the i-th (0: the CPU). A type without host_memory
// marks its tensors with its name (dg_tensor.mem.type) and the device's index. Returns:
// borrowed, static.
int exec_num_device_types(void);
const exec_device_type *exec_device_type_at(int i);
// The type named name (exact, upper-case as in canonical device names), or NULL when this
// build has none. Returns: borrowed, static.
const exec_device_type *exec_device_type_find(const char *name);
// Devices of the type named name in this process; 0 for a type this build lacks.
int exec_device_count(const char *name);
// This process's devices under task (e.g. "/job:localhost/replica:0/task:0"):
// "<task>/device:CPU:0", the virtual CPUs "<task>/device:CPU:1" .. n_virtual_cpus, then
// every device of every other type, in registry order. Returns: new array of *n new strings,
// free with dg_device_list_free(); NULL (*n 0) when out of memory.
char **exec_local_device_names(const char *task, int n_virtual_cpus, int *n);
// True when device_name parses and names a device type other than the CPU (an accelerator,
// which this process or another task may have).
bool exec_device_name_is_accelerator(const char *device_name);
// Applies c to every device type (their configure entries).
void exec_devices_configure(const exec_device_config *c);
// t itself (a new reference) when it is in host memory, else a host copy of it made by the
// device type whose memory holds it. t may be NULL (returns NULL, st OK). Returns: new; NULL
// with st set.
dg_tensor *exec_tensor_to_host(dg_tensor *t, dg_status *st);
// Every type's release_all (see there). Returns the sum of the bytes still handed out.
int64_t exec_devices_release_all(void);

#ifdef __cplusplus
}
#endif
#endif
