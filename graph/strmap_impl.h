/* A string -> pointer hash map (open addressing, linear probing). Keys are borrowed: the
 * caller keeps them alive while they are in the map. Used for node names, collections and
 * op registries, so lookups stay O(1) on graphs of millions of nodes. */
#ifndef DG_STRMAP_IMPL_H
#define DG_STRMAP_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct graph_strmap {
    const char **keys;
    void **vals;
    uint64_t *hashes;
    size_t cap;     // power of two, 0 when empty
    size_t count;
} graph_strmap;

uint64_t graph_str_hash(const char *s);
// Inserts or replaces. Returns false on out of memory.
bool graph_strmap_put(graph_strmap *m, const char *key, void *val);
// NULL when absent.
void *graph_strmap_get(const graph_strmap *m, const char *key);
void graph_strmap_clear(graph_strmap *m);

#endif
