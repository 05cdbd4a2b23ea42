/* Checkpoints in one SQLite file (WAL mode). A save writes every tensor and the global step
 * in one transaction, so a crash at any moment leaves either the new checkpoint or none of
 * it; restore reads the newest complete checkpoint (or a given step). The schema is in
 * docs/CHECKPOINT.md. A dg_checkpoint_store is used by one thread at a time. */
#ifndef DISTGRAPH_CHECKPOINT_H
#define DISTGRAPH_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/status.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_checkpoint_store dg_checkpoint_store;

// Opens (create: creates if missing) the checkpoint file at path. A file that is not a
// distgraph checkpoint (not SQLite, another schema, corrupt) is DATA_LOSS or
// FAILED_PRECONDITION naming the file; it is never modified. Returns: new, caller frees
// with dg_checkpoint_close(); NULL on error.
dg_checkpoint_store *dg_checkpoint_open(const char *path, bool create, dg_status *st);
void dg_checkpoint_close(dg_checkpoint_store **s);

// Saves n named tensors (names unique) as the checkpoint of global_step, in one
// transaction; then keeps only the newest max_to_keep checkpoints (0: keep all). Saving a
// step that exists replaces it. On failure (disk full, read-only file) the checkpoints
// already there are unchanged. Borrows names and values for the call.
bool dg_checkpoint_save(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                        dg_tensor *const *values, int n, int max_to_keep, dg_status *st);

// The newest checkpoint's step; -1 (and st OK) when there is none.
int64_t dg_checkpoint_latest_step(dg_checkpoint_store *s, dg_status *st);

// Steps of all checkpoints, oldest first. *steps: new array, caller frees with free().
// Returns the count, -1 on error.
int dg_checkpoint_list(dg_checkpoint_store *s, int64_t **steps, dg_status *st);

typedef struct dg_checkpoint_var {
    char name[256];
    dg_dtype dtype;
    dg_shape shape;
} dg_checkpoint_var;

// The variables of the checkpoint of step (-1: newest). *vars: new array, caller frees with
// free(). Returns the count, -1 on error (NOT_FOUND for a missing step).
int dg_checkpoint_variables(dg_checkpoint_store *s, int64_t step, dg_checkpoint_var **vars,
                            dg_status *st);

// Reads the named tensors of the checkpoint of step (-1: newest) into out[i] (new
// references; caller unrefs). A name missing from the checkpoint is NOT_FOUND naming it and
// the file; stored bytes that do not match their dtype and shape are DATA_LOSS.
// *restored_step (may be NULL) receives the step read.
bool dg_checkpoint_restore(dg_checkpoint_store *s, int64_t step, const char *const *names, int n,
                           dg_tensor **out, int64_t *restored_step, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
