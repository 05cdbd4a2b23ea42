/* Tensor internals shared by the layers (a tensor is opaque to users). */
#ifndef DG_TENSOR_IMPL_H
#define DG_TENSOR_IMPL_H

#include <stdatomic.h>
#include <string.h>

#include "distgraph/tensor.h"

// The memory a tensor's data lives in: the host's, or that of one device, named by its device
// type and index ("GPU", 1), as in device names (executor/device.h, exec_device_type.name). The
// graph layer only carries it and prints it.
typedef struct tensor_mem {
    const char *type;   // NULL: host memory; else a static string
    int index;          // the device's index within its type; 0 for the host
} tensor_mem;
#define TENSOR_MEM_HOST ((tensor_mem){NULL, 0})

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
    tensor_mem mem;           // whose memory holds data (host unless a device's kernels set
                              // it). Host code must not read device memory: dg_tensor_copy
                              // refuses, exec_tensor_to_host copies it
};

// Whether two tensors' data live in the same memory (the host, or the same device).
static inline bool tensor_mem_same(tensor_mem a, tensor_mem b) {
    if (!a.type || !b.type) return a.type == b.type;
    return a.index == b.index && (a.type == b.type || strcmp(a.type, b.type) == 0);
}
static inline bool tensor_on_host(const dg_tensor *t) { return !t->mem.type; }

// The 16-bit floats' conversions (dg_float_to_bfloat16 and its siblings, tensor.h), inline so
// that the loops of Cast and of the 16-bit GEMM vectorise.
static inline uint32_t tensor_float_bits(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static inline float tensor_bits_float(uint32_t u) {
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static inline uint16_t tensor_f32_to_bf16(float v) {
    uint32_t u = tensor_float_bits(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);   // NaN, made quiet
    // Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even; a carry out
    // of the fraction raises the exponent, and from the largest finite values gives infinity.
    u += 0x7fffu + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static inline float tensor_bf16_to_f32(uint16_t b) { return tensor_bits_float((uint32_t)b << 16); }

static inline uint16_t tensor_f32_to_f16(float v) {
    uint32_t u = tensor_float_bits(v), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));   // NaN, quiet
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   // rounds to 65520 or more: infinity
    if (a < 0x38800000u) {
        // Below float16's smallest normal (2^-14): a multiple of 2^-24. Adding 0.5 moves the
        // value so that float32's own rounding (to nearest, ties to even) rounds it at 2^-24.
        float r = tensor_bits_float(a) + 0.5f;
        return (uint16_t)(sign | (tensor_float_bits(r) - tensor_float_bits(0.5f)));
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped fraction bits.
    uint32_t m = a - 0x38000000u;
    m += 0xfffu + ((m >> 13) & 1);
    return (uint16_t)(sign | (m >> 13));
}

static inline float tensor_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return tensor_bits_float(sign | 0x7f800000u | (m << 13));   // infinity or NaN
    if (e == 0) {
        float v = (float)m * 0x1p-24f;   // zero or subnormal: exact
        return tensor_bits_float(sign | tensor_float_bits(v));
    }
    return tensor_bits_float(sign | ((e + 112) << 23) | (m << 13));
}

// A tensor sharing t's buffer with another shape (same element count).
// Returns: new, caller releases with dg_tensor_unref().
dg_tensor *tensor_view(dg_tensor *t, dg_shape shape, dg_status *st);
// True when t is the only holder of its buffer (no other refs, not a view, owns its data):
// its buffer may be overwritten.
bool tensor_is_exclusive(const dg_tensor *t);
// Element count of a fully-defined shape, -1 on overflow or an unknown dim.
int64_t tensor_shape_elements(const dg_shape *s);

#endif
