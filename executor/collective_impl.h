/* Collectives (CollectiveAllReduce, CollectiveBroadcast) on the wire: step ids, keys and
 * tuning constants shared by the CPU kernels (executor/cpu/kernels_collective.c) and their
 * tests. docs/COLLECTIVES.md describes the protocol. */
#ifndef DG_COLLECTIVE_IMPL_H
#define DG_COLLECTIVE_IMPL_H

#include <stdint.h>

// Values of one execution of one instance travel in the task's rendezvous under a step id of
// their own: the sign bit set, the instance key in bits 32..62, the execution number (how
// many times this task ran the instance before, mod 2^32) below. Session step ids are
// non-negative, so the two spaces never meet.
static inline int64_t coll_step_id(int64_t instance_key, int64_t execution) {
    uint64_t v = (1ull << 63) | ((uint64_t)(instance_key & 0x7FFFFFFF) << 32) |
                 ((uint64_t)execution & 0xFFFFFFFFull);
    return (int64_t)v;
}

// Pieces of a ring all-reduce (and of a broadcast) are at most this many bytes, so each
// travels as one held-back TENSOR message (the server sends values over 4 MiB at once, in
// 1 MiB TENSOR_CHUNKs reassembled before delivery, which would stop the pipeline).
// DG_COLLECTIVE_CHUNK_BYTES overrides it (rounded down to a multiple of 8, at least 4096).
#define COLL_CHUNK_BYTES_DEFAULT ((size_t)1 << 20)
// "auto" all-reduces use the direct exchange (every rank sends its whole buffer to every
// other one: one round trip instead of 2(n-1)) when a rank sends at most this many bytes,
// i.e. buffer bytes * (n - 1) <= this. DG_COLLECTIVE_DIRECT_BYTES overrides it.
#define COLL_DIRECT_BYTES_DEFAULT ((size_t)1 << 20)
#define COLL_DEFAULT_TIMEOUT_MS 60000

#endif
