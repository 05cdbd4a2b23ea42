/* A map from addresses to indices (linear probing, sized once): the executor's node -> index
 * table, and the fusion pass's (executor.c, fusion.c). */
#ifndef DG_EXEC_PTRMAP_IMPL_H
#define DG_EXEC_PTRMAP_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// Node -> index, by address: the nodes of one executable may come from several graphs
// (the partitions of a step), whose ids overlap. Holds up to half its capacity: init with the
// most keys it will hold.
typedef struct ptrmap {
    const void **keys;
    int *vals;
    size_t mask;
} ptrmap;

static inline bool ptrmap_init(ptrmap *m, int n) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    m->keys = calloc(cap, sizeof *m->keys);
    m->vals = malloc(cap * sizeof *m->vals);
    m->mask = cap - 1;
    return m->keys && m->vals;
}

static inline size_t ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return (size_t)x;
}

static inline void ptrmap_put(ptrmap *m, const void *k, int v) {
    size_t j = ptr_hash(k) & m->mask;
    while (m->keys[j] && m->keys[j] != k) j = (j + 1) & m->mask;
    m->keys[j] = k;
    m->vals[j] = v;
}

static inline int ptrmap_get(const ptrmap *m, const void *k) {
    size_t j = ptr_hash(k) & m->mask;
    while (m->keys[j]) {
        if (m->keys[j] == k) return m->vals[j];
        j = (j + 1) & m->mask;
    }
    return -1;
}

static inline void ptrmap_free(ptrmap *m) {
    free(m->keys);
    free(m->vals);
}

#endif
