/* Data types, shapes and tensors.
 * dg_shape is a small value type (rank up to DG_MAX_RANK; -1 marks an unknown dimension,
 * rank -1 an unknown rank). dg_tensor is reference counted: dg_tensor_ref/dg_tensor_unref;
 * the buffer may wrap caller memory released through a deallocator. Reference counting is
 * atomic, so tensors may be shared between threads; their contents are not locked. */
#ifndef DISTGRAPH_TENSOR_H
#define DISTGRAPH_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// Element types. Numbers match TensorFlow's DataType and go into checkpoints and the
// wire: never renumber.
typedef enum dg_dtype {
    DG_INVALID_DTYPE = 0,
    DG_FLOAT32 = 1,
    DG_FLOAT64 = 2,
    DG_INT32 = 3,
    DG_UINT8 = 4,
    DG_INT64 = 9,
    DG_BOOL = 10,
    DG_BFLOAT16 = 14,   // 8 exponent bits and 7 fraction bits: float32's range, 2-3 digits
    DG_FLOAT16 = 19,    // IEEE 754 binary16 (TensorFlow's "half"): 5 exponent bits, 10 fraction bits
} dg_dtype;

// Bytes per element, 0 for an unknown dtype.
size_t dg_dtype_size(dg_dtype t);
// "float32", "float64", ...; "invalid" for anything else. Returns: a static string.
const char *dg_dtype_name(dg_dtype t);
bool dg_dtype_is_valid(dg_dtype t);
// float32 or float64, the types arithmetic ops compute in.
bool dg_dtype_is_float(dg_dtype t);
// bfloat16 or float16: 16-bit floats, stored, cast, sent and checkpointed (Cast converts them
// to and from the other types); ops that compute say where they take them.
bool dg_dtype_is_float16_family(dg_dtype t);

// Conversions of one 16-bit float, bits in a uint16_t: to 16 bits rounds to the nearest, ties
// to even; infinities stay infinite, NaN stays NaN (quiet, sign kept); float16 overflows to
// infinity and has subnormals; to float is exact.
uint16_t dg_float_to_bfloat16(float v);
float dg_bfloat16_to_float(uint16_t b);
uint16_t dg_float_to_float16(float v);
float dg_float16_to_float(uint16_t h);

#define DG_MAX_RANK 8

typedef struct dg_shape {
    int rank;                    // -1: unknown rank
    int64_t dims[DG_MAX_RANK];   // -1: unknown dimension
} dg_shape;

dg_shape dg_shape_unknown(void);
dg_shape dg_shape_scalar(void);
dg_shape dg_shape1(int64_t d0);
dg_shape dg_shape2(int64_t d0, int64_t d1);
dg_shape dg_shape3(int64_t d0, int64_t d1, int64_t d2);
// A shape from n dims (n <= DG_MAX_RANK, else an unknown shape).
dg_shape dg_shape_make(int n, const int64_t *dims);
// True when the rank and every dimension are known.
bool dg_shape_is_fully_defined(const dg_shape *s);
// Product of the dims; -1 if any is unknown.
int64_t dg_shape_num_elements(const dg_shape *s);
bool dg_shape_equal(const dg_shape *a, const dg_shape *b);
// True when a and b could describe the same concrete shape (unknowns match anything).
bool dg_shape_compatible(const dg_shape *a, const dg_shape *b);
// Writes "[100,784]", "[?,10]" or "<unknown>" into buf. Returns: buf (the caller's).
char *dg_shape_str(const dg_shape *s, char *buf, size_t cap);

typedef struct dg_tensor dg_tensor;

// Called once when the last reference to a tensor wrapping caller memory goes.
typedef void (*dg_deallocator)(void *data, size_t n_bytes, void *arg);

// A tensor with a fresh, 64-byte aligned, uninitialised host buffer. The shape must be
// fully defined. Returns: new (one reference), caller releases with dg_tensor_unref().
dg_tensor *dg_tensor_new(dg_dtype dtype, dg_shape shape, dg_status *st);
// The host memory of the buffers dg_tensor_new made (kernels' outputs included) that are alive
// in this process: *live bytes now and *peak, the most at once since the process started or
// since the last dg_tensor_memory_reset_peak. Either pointer may be NULL. A task's server
// reports both ("tensor_bytes", "tensor_bytes_peak": dg_server_query_counters).
void dg_tensor_memory(int64_t *live, int64_t *peak);
// Sets the peak to the bytes alive now.
void dg_tensor_memory_reset_peak(void);
// Freed tensor buffers of 64 KiB or more are kept for the next tensor of their size class
// (eight classes a doubling, a buffer at most 12.5% larger than asked; dg_tensor_memory counts
// the class sizes), so a step's activations do not fault in fresh pages every step. The cache
// holds at most DG_TENSOR_CACHE_MB MiB (read once; 0 turns it off), else 1 GiB or an eighth of
// the machine's memory, whichever is less; when full, buffers of other classes make room. A
// reused buffer holds an earlier tensor's bytes, as small ones from malloc always did: kernels
// write every byte of their outputs. dg_tensor_cache_held says how many bytes it holds now;
// dg_tensor_cache_release frees them all and returns how many.
size_t dg_tensor_cache_held(void);
size_t dg_tensor_cache_release(void);
// Same, buffer filled with zeros. Returns: new (one reference), caller releases with
// dg_tensor_unref().
dg_tensor *dg_tensor_new_zeros(dg_dtype dtype, dg_shape shape, dg_status *st);
// A tensor over caller memory; dealloc (may be NULL) runs when the last reference goes.
// n_bytes must equal the shape's element count times the dtype size.
// Returns: new (one reference), caller releases with dg_tensor_unref().
dg_tensor *dg_tensor_wrap(dg_dtype dtype, dg_shape shape, void *data, size_t n_bytes,
                          dg_deallocator dealloc, void *dealloc_arg, dg_status *st);
// A tensor holding a copy of data. Returns: new, caller releases with dg_tensor_unref().
dg_tensor *dg_tensor_from_data(dg_dtype dtype, dg_shape shape, const void *data,
                               dg_status *st);
// Scalar helpers. Returns: new, caller releases with dg_tensor_unref().
dg_tensor *dg_tensor_scalar_f32(float v);
dg_tensor *dg_tensor_scalar_f64(double v);
dg_tensor *dg_tensor_scalar_i64(int64_t v);
// A deep copy. Returns: new, caller releases with dg_tensor_unref().
dg_tensor *dg_tensor_copy(const dg_tensor *t, dg_status *st);

// Adds a reference. Returns: t, now with one more reference for the caller to release.
dg_tensor *dg_tensor_ref(dg_tensor *t);
// Drops one reference; the last frees the tensor. NULL does nothing.
void dg_tensor_unref(dg_tensor *t);
// Drops the reference held by *t and sets it to NULL.
void dg_tensor_free(dg_tensor **t);

dg_dtype dg_tensor_dtype(const dg_tensor *t);
// Returns: borrowed, valid while the tensor lives.
const dg_shape *dg_tensor_shape(const dg_tensor *t);
int dg_tensor_rank(const dg_tensor *t);
int64_t dg_tensor_dim(const dg_tensor *t, int i);
int64_t dg_tensor_num_elements(const dg_tensor *t);
size_t dg_tensor_nbytes(const dg_tensor *t);
// Returns: borrowed host pointer, valid while the tensor lives.
void *dg_tensor_data(const dg_tensor *t);
// Typed views of the host buffer. Returns: borrowed, valid while the tensor lives.
float *dg_tensor_f32(const dg_tensor *t);
double *dg_tensor_f64(const dg_tensor *t);
int32_t *dg_tensor_i32(const dg_tensor *t);
int64_t *dg_tensor_i64(const dg_tensor *t);
// Element i of a numeric tensor as double (bool as 0/1, 16-bit floats exactly).
double dg_tensor_get_as_double(const dg_tensor *t, int64_t i);

#ifdef __cplusplus
}
#endif
#endif
