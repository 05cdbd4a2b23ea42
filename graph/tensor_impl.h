/* Tensor internals shared by the layers (a tensor is opaque to users). */
#ifndef DG_TENSOR_IMPL_H
#define DG_TENSOR_IMPL_H

#include <stdatomic.h>

#include "distgraph/tensor.h"

struct dg_tensor {
    atomic_int refs;
    dg_dtype dtype;
    dg_shape shape;
    int64_t n_elements;
    size_t nbytes;
    void *data;
    dg_deallocator dealloc;   // NULL with owns_data: free(); NULL without: nothing
    void *dealloc_arg;
    dg_tensor *base;          // a view holds one reference to the tensor it aliases
    bool owns_data;           // data came from our aligned allocator
    int device_mem;           // 0: data is host memory; 1 + id: memory of device id of the
                              // one device type with memory of its own (executor/device.h;
                              // set by its kernels). Host code must not read such data:
                              // dg_tensor_copy refuses, exec_tensor_to_host copies it
};

// A tensor sharing t's buffer with another shape (same element count).
// Returns: new, caller releases with dg_tensor_unref().
dg_tensor *tensor_view(dg_tensor *t, dg_shape shape, dg_status *st);
// True when t is the only holder of its buffer (no other refs, not a view, owns its data):
// its buffer may be overwritten.
bool tensor_is_exclusive(const dg_tensor *t);
// Element count of a fully-defined shape, -1 on overflow or an unknown dim.
int64_t tensor_shape_elements(const dg_shape *s);

#endif
