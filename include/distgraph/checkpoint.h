/* Checkpoints in one SQLite file (WAL mode). A save writes every tensor and the global step
 * in one transaction, so a crash at any moment leaves either the new checkpoint or none of
 * it; restore reads the newest complete checkpoint (or a given step). "Newest" means most
 * recently saved (TensorFlow's latest_checkpoint), which is the highest step unless a lower
 * step was saved later. Every tensor carries a CRC-32 checked on restore. The file may also
 * hold scalar summaries (step, tag, value, wall time), beside the checkpoints and untouched by
 * saves and pruning. A tensor may be saved as a slice of a larger variable (the parts of a
 * partitioned variable) and restored into other slices. The schema and the guarantees are in
 * docs/CHECKPOINT.md. A dg_checkpoint_store is used by one thread at a time; other processes
 * may read the file meanwhile. */
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

// Opens (create: creates if missing) the checkpoint file at path, which may also be an
// SQLite "file:" URI (e.g. "file:ckpt.db?mode=ro"). A missing file without create is
// NOT_FOUND. A file that is not a distgraph checkpoint is never modified: not SQLite,
// damaged or truncated is DATA_LOSS; an SQLite database of another schema, an empty one
// (without create) or a newer format version is FAILED_PRECONDITION; all name the file.
// A file or directory we may not write opens read-only (saves then fail). Returns: new,
// caller frees with dg_checkpoint_store_free(); NULL on error.
dg_checkpoint_store *dg_checkpoint_store_new(const char *path, bool create, dg_status *st);
void dg_checkpoint_store_free(dg_checkpoint_store **s);

// Saves n named tensors (names unique, 1 to 255 bytes) as the checkpoint of global_step
// (>= 0), in one transaction; in the same transaction keeps only the newest max_to_keep
// checkpoints (0: keep all). Saving a step that exists replaces it (and makes it the
// newest). When it returns true the checkpoint is on disk (fsynced). On failure the
// checkpoints already there are unchanged: INVALID_ARGUMENT for bad names or tensors,
// FAILED_PRECONDITION for a read-only file, RESOURCE_EXHAUSTED for a full disk, each naming
// the file. Borrows names and values for the call.
bool dg_checkpoint_save(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                        dg_tensor *const *values, int n, int max_to_keep, dg_status *st);

// The newest checkpoint's step; -1 (and st OK) when there is none.
int64_t dg_checkpoint_latest_step(dg_checkpoint_store *s, dg_status *st);

// Steps of all checkpoints, oldest first. *steps: new array, caller frees with free().
// Returns the count, -1 on error.
int dg_checkpoint_list(dg_checkpoint_store *s, int64_t **steps, dg_status *st);

typedef struct dg_checkpoint_info {
    int64_t step;              // the global step
    int64_t created_unix_ms;   // when it was saved: milliseconds since the Unix epoch
} dg_checkpoint_info;

// Like dg_checkpoint_list, with when each checkpoint was saved. *infos: new array, caller
// frees with free(). Returns the count, -1 on error.
int dg_checkpoint_list_info(dg_checkpoint_store *s, dg_checkpoint_info **infos, dg_status *st);

typedef struct dg_checkpoint_var {
    char name[256];   // NUL-terminated
    dg_dtype dtype;
    dg_shape shape;
} dg_checkpoint_var;

// The variables of the checkpoint of step (-1: newest). *vars: new array, caller frees with
// free(). Returns the count, -1 on error (NOT_FOUND for a missing step).
int dg_checkpoint_variables(dg_checkpoint_store *s, int64_t step, dg_checkpoint_var **vars,
                            dg_status *st);

// Reads the named tensors of the checkpoint of step (-1: newest) into out[i] (new
// references; caller unrefs), all from one snapshot of the file. A missing step, or a name
// missing from the checkpoint, is NOT_FOUND naming it and the file; stored bytes that fail
// their checksum or do not match their dtype and shape are DATA_LOSS naming the variable
// and the file. On failure every out[i] is NULL. Comparing dtypes and shapes with the
// graph's variables is the caller's job. *restored_step (may be NULL) receives the step read.
bool dg_checkpoint_restore(dg_checkpoint_store *s, int64_t step, const char *const *names, int n,
                           dg_tensor **out, int64_t *restored_step, dg_status *st);

// ---- Sliced variables ----
// A tensor may be saved as a slice of a larger variable (a part of a partitioned variable,
// partitioned.h): the checkpoint records where it lies in the whole, and a restore of any
// region of the whole assembles it from whatever slices of it the checkpoint holds (any
// number, any boundaries), or from the whole saved unsliced. The tensor keeps its own name
// too: readers that know nothing of slices (dg_checkpoint_variables, dg_checkpoint_restore,
// earlier releases) see it as an ordinary tensor. Schema and rules: docs/CHECKPOINT.md.

// Where a tensor lies in a larger variable: the region [offset[d], offset[d] + shape[d]) of
// full_name's full_shape in each dimension d, shape being the tensor's own.
typedef struct dg_checkpoint_slice {
    const char *full_name;          // the whole variable, 1 to 255 bytes; NULL: not a slice
    dg_shape full_shape;            // the whole variable's shape: rank >= 1, the tensor's rank
    int64_t offset[DG_MAX_RANK];    // the slice's first index in each dimension
} dg_checkpoint_slice;

// dg_checkpoint_save where values[i] is saved as the slice slices[i] of a larger variable;
// slices may be NULL, and an entry whose full_name is NULL saves a whole tensor, as
// dg_checkpoint_save does. Also INVALID_ARGUMENT, naming the tensor: a slice that does not fit
// its full shape (rank, offsets), slices of one full name that differ in full shape or dtype
// or overlap, a full name that is also the name of a whole tensor of the save. Borrows names,
// values and slices for the call.
bool dg_checkpoint_save_slices(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                               dg_tensor *const *values, const dg_checkpoint_slice *slices, int n,
                               int max_to_keep, dg_status *st);

// dg_checkpoint_variables, and for each variable i, (*slices)[i] says where it lies when it was
// saved as a slice (full_name NULL: a whole tensor). *vars and *slices: new, caller frees each
// with free() (the full names live in the *slices block); both NULL when the count is 0 or -1.
// A slice description that does not parse or fit is DATA_LOSS naming the variable and the file.
int dg_checkpoint_variables_sliced(dg_checkpoint_store *s, int64_t step, dg_checkpoint_var **vars,
                                   dg_checkpoint_slice **slices, dg_status *st);

// Fills the caller's tensors from the checkpoint of step (-1: newest), all from one snapshot.
// values[i]'s dtype and shape say what is read: the tensor names[i] when slices is NULL or
// slices[i].full_name is NULL, else the region slices[i] of the variable full_name, assembled
// from the slices of it the checkpoint holds or from full_name saved whole (names[i] then only
// names the request in messages). Errors name the variable and the file: NOT_FOUND for a
// missing step, a missing variable, or rows of the region that no saved slice holds (the
// message lists them); INVALID_ARGUMENT for bad arguments and for a saved dtype, shape or full
// shape other than asked; DATA_LOSS for damaged bytes and for saved slices that overlap,
// disagree on the full shape or dtype, or do not fit it. On failure the values' contents are
// unspecified. *restored_step (may be NULL) receives the step read. Borrows every argument
// for the call.
bool dg_checkpoint_restore_slices(dg_checkpoint_store *s, int64_t step, const char *const *names,
                                  const dg_checkpoint_slice *slices, dg_tensor *const *values, int n,
                                  int64_t *restored_step, dg_status *st);

// ---- Named blobs ----
// Bytes saved with a checkpoint under a name (an input pipeline's position, dataset.h), in the
// same transaction as its tensors: a checkpoint has its blobs or does not exist. They go with
// their checkpoint when it is replaced or pruned. Readers that know nothing of blobs
// (dg_checkpoint_variables, dg_saver_restore, earlier releases) do not see them.

typedef struct dg_checkpoint_blob {
    const char *name;    // 1 to 255 bytes, unique in one save
    const void *data;    // n_bytes bytes (may be NULL when n_bytes is 0)
    size_t n_bytes;      // at most 512 MiB
} dg_checkpoint_blob;

// dg_checkpoint_save_slices, and n_blobs blobs saved with the checkpoint in the same
// transaction (blobs may be NULL when n_blobs is 0). Also INVALID_ARGUMENT naming a blob of a
// bad name or size, or a name given twice. Borrows every argument for the call.
bool dg_checkpoint_save_with_blobs(dg_checkpoint_store *s, int64_t global_step, const char *const *names,
                                   dg_tensor *const *values, const dg_checkpoint_slice *slices, int n,
                                   const dg_checkpoint_blob *blobs, int n_blobs, int max_to_keep, dg_status *st);

// Reads the blob name of the checkpoint of step (-1: newest). *data: new, caller frees with
// free() (NULL on error); *n_bytes its size. NOT_FOUND for a missing step or a checkpoint
// without that blob, DATA_LOSS for bytes that fail their CRC-32; all name the file.
// *read_step (may be NULL) receives the step read.
bool dg_checkpoint_read_blob(dg_checkpoint_store *s, int64_t step, const char *name, void **data, size_t *n_bytes,
                             int64_t *read_step, dg_status *st);

// ---- Scalar summaries ----
// What the summary saver hook (monitored_session.h) writes and dg-inspect reads: rows of
// (global step, tag, value, wall time) in the table `summaries` of the file, made by the first
// dg_checkpoint_store_add_summaries. A step written again (after a restart from an older
// checkpoint) adds rows; readers get every row, in write order within a step.

// Appends one row per tag for step (>= 0), all with wall_time (Unix seconds), in one
// transaction that is on disk when it returns true. NaN is stored as no number and reads back
// as NaN; infinities are kept. tags[i] (not NULL) names values[i]. INVALID_ARGUMENT for bad
// arguments (and for NaN in a table made elsewhere with value NOT NULL), FAILED_PRECONDITION
// for a read-only file or a summaries table of other columns, RESOURCE_EXHAUSTED for a full
// disk, each naming the file; on failure nothing is written. Borrows tags and values for the
// call.
bool dg_checkpoint_store_add_summaries(dg_checkpoint_store *s, int64_t step, const char *const *tags,
                                       const double *values, int n, double wall_time, dg_status *st);

// One summary row read back. tag: borrowed, valid during the callback.
typedef struct dg_checkpoint_summary {
    int64_t step;
    const char *tag;
    double value;       // NaN where the file holds no number
    double wall_time;   // Unix seconds
} dg_checkpoint_summary;

// Called for each row; returning false stops the reading (which then returns true). It must
// not call into the store.
typedef bool (*dg_checkpoint_summary_fn)(void *ctx, const dg_checkpoint_summary *row);

// Calls fn(ctx, row) for each summary row of tag (NULL: every tag), ordered by tag, then
// step, then write order, all from one snapshot of the file. A file without summaries is
// NOT_FOUND ("no summaries table"); a table of other columns is FAILED_PRECONDITION, a row
// whose step, tag, value or wall time is not of its column's type DATA_LOSS naming the row;
// all name the file. An empty table, or a tag without rows, calls fn never and returns true.
bool dg_checkpoint_store_read_summaries(dg_checkpoint_store *s, const char *tag, dg_checkpoint_summary_fn fn,
                                        void *ctx, dg_status *st);

// The distinct tags of the summary rows, sorted (bytewise), followed by NULL. *tags: new,
// caller frees with free() (one block: the strings live in it); NULL on error. Returns the
// count (0: an empty table), -1 on error, with the codes of dg_checkpoint_store_read_summaries.
int dg_checkpoint_store_summary_tags(dg_checkpoint_store *s, char ***tags, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
