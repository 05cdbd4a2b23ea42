/* The host buffers of tensors (graph/tensor_cache.c): large ones kept for reuse. */
#ifndef DG_TENSOR_CACHE_IMPL_H
#define DG_TENSOR_CACHE_IMPL_H

#include <stddef.h>

// Buffers this large or larger go through the cache.
#define TENSOR_CACHE_MIN ((size_t)64 << 10)

// The bytes a buffer of n bytes takes: its size class from TENSOR_CACHE_MIN up, else n rounded
// to 64 (never 0). What tensor_cache_alloc(n) returns holds that many.
size_t tensor_cache_bytes(size_t n);
// A 64-byte aligned buffer of tensor_cache_bytes(n) bytes, uninitialised; NULL when out of memory.
void *tensor_cache_alloc(size_t n);
// Gives back p, from tensor_cache_alloc(n) with the same n.
void tensor_cache_free(void *p, size_t n);

#endif
