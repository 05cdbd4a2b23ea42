/* The data room's inside (distgraph/dataset.h outside): a dataset is a chain of stage
 * descriptions, each knowing how to make its stage iterator; an iterator is the chain of
 * stage iterators, each pulling from the one below. Every stage iterator can write its state
 * (data_wr) and read it back into a fresh stage (data_rd), which is how dg_iterator_save and
 * dg_iterator_restore work: dataset.c owns the chain, the state's framing and elements'
 * encoding; sources.c the file and memory sources; transforms.c the synchronous
 * transformations; threads.c the parallel map and prefetch. */
#ifndef DG_DATA_IMPL_H
#define DG_DATA_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/dataset.h"

// ---- state encoding: little-endian integers, length-prefixed bytes ----
typedef struct data_wr {
    unsigned char *buf;
    int len, cap;          // a state is at most 2 GiB less a byte
    bool failed;           // out of memory: every later put does nothing
    size_t need;           // the size the failed put asked for
} data_wr;
// A failed writer's RESOURCE_EXHAUSTED for what, naming the bytes it needed. Returns false.
bool data_wr_oom(const data_wr *w, const char *what, dg_status *st);
void data_put_u64(data_wr *w, uint64_t v);
void data_put_i64(data_wr *w, int64_t v);
void data_put_bytes(data_wr *w, const void *p, size_t n);   // length, then the bytes
void data_put_str(data_wr *w, const char *s);
bool data_put_element(data_wr *w, const dg_element *e);

// A reader over borrowed bytes; a read past the end or a value out of range is
// INVALID_ARGUMENT "iterator state: ..." into st and returns false.
typedef struct data_rd {
    const unsigned char *p;
    size_t len, off;
} data_rd;
bool data_get_u64(data_rd *r, uint64_t *v, dg_status *st);
bool data_get_i64(data_rd *r, int64_t *v, dg_status *st);
// *p borrowed from r's bytes.
bool data_get_bytes(data_rd *r, const unsigned char **p, size_t *n, dg_status *st);
// Reads a string and checks it equals want (a stage's name and arguments), else
// INVALID_ARGUMENT naming what differs.
bool data_expect_str(data_rd *r, const char *want, dg_status *st);
bool data_get_element(data_rd *r, dg_element *e, dg_status *st);

// ---- the shared context of one iterator ----
typedef struct data_ctx {
    atomic_llong n_skipped;   // damaged records skipped by sources
} data_ctx;

// ---- stage iterators ----
typedef struct data_iter data_iter;
typedef struct data_iter_ops {
    // 1: an element into *out (n 0 on entry); 0: end of sequence; -1: error in st.
    int (*next)(data_iter *it, dg_element *out, dg_status *st);
    // Writes the stage's state, then its input's.
    bool (*save)(data_iter *it, data_wr *w, dg_status *st);
    // Reads what save wrote into a fresh stage (no element taken yet), then its input's.
    bool (*restore)(data_iter *it, data_rd *r, dg_status *st);
    void (*free)(data_iter *it);   // also frees the input's stage
} data_iter_ops;
struct data_iter {
    const data_iter_ops *ops;
    data_ctx *ctx;   // borrowed from the dg_iterator
};
static inline void data_iter_free(data_iter *it) {
    if (it) it->ops->free(it);
}

// ---- dataset descriptions ----
struct dg_dataset {
    // Makes the stage for pass `epoch` of the repeat above it (0 without one).
    data_iter *(*make)(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st);
    void (*free_params)(dg_dataset *ds);
    dg_dataset *input;   // owned; NULL for a source
    void *params;        // the kind's own, freed by free_params
    char desc[160];      // the stage's name and arguments: saved states must match it
    bool is_file_source; // dg_dataset_interleave may apply
};
// A new description over input (consumed), or NULL (input freed) out of memory.
dg_dataset *data_dataset_new(dg_dataset *input, void *params, void (*free_params)(dg_dataset *),
                             data_iter *(*make)(const dg_dataset *, data_ctx *, int64_t, dg_status *),
                             dg_status *st);
// The stage of ds->input for the pass epoch.
data_iter *data_make_input(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st);

// ---- elements ----
// Moves src's components into dst (dst cleared first); src is left empty.
void data_element_move(dg_element *dst, dg_element *src);

// Sets the interleave of a file source description (sources.c).
bool data_file_source_interleave(dg_dataset *ds, int cycle_length, int block_length, dg_status *st);

#endif
