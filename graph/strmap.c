#include "strmap_impl.h"

#include <stdlib.h>
#include <string.h>

uint64_t graph_str_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;   // FNV-1a
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h ? h : 1;   // 0 marks an empty slot
}

static bool grow(graph_strmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 16;
    const char **keys = calloc(ncap, sizeof *keys);
    void **vals = calloc(ncap, sizeof *vals);
    uint64_t *hashes = calloc(ncap, sizeof *hashes);
    if (!keys || !vals || !hashes) {
        free(keys);
        free(vals);
        free(hashes);
        return false;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->hashes[i]) continue;
        size_t j = m->hashes[i] & (ncap - 1);
        while (hashes[j]) j = (j + 1) & (ncap - 1);
        hashes[j] = m->hashes[i];
        keys[j] = m->keys[i];
        vals[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    free(m->hashes);
    m->keys = keys;
    m->vals = vals;
    m->hashes = hashes;
    m->cap = ncap;
    return true;
}

bool graph_strmap_put(graph_strmap *m, const char *key, void *val) {
    if ((m->count + 1) * 4 > m->cap * 3 && !grow(m)) return false;
    uint64_t h = graph_str_hash(key);
    size_t j = h & (m->cap - 1);
    while (m->hashes[j]) {
        if (m->hashes[j] == h && strcmp(m->keys[j], key) == 0) {
            m->vals[j] = val;   // the stored key stays: it is equal and already owned
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->hashes[j] = h;
    m->keys[j] = key;
    m->vals[j] = val;
    m->count++;
    return true;
}

void *graph_strmap_get(const graph_strmap *m, const char *key) {
    if (!m->cap) return NULL;
    uint64_t h = graph_str_hash(key);
    size_t j = h & (m->cap - 1);
    while (m->hashes[j]) {
        if (m->hashes[j] == h && strcmp(m->keys[j], key) == 0) return m->vals[j];
        j = (j + 1) & (m->cap - 1);
    }
    return NULL;
}

void graph_strmap_clear(graph_strmap *m) {
    free(m->keys);
    free(m->vals);
    free(m->hashes);
    memset(m, 0, sizeof *m);
}
