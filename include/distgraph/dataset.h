/* Input pipelines (TensorFlow's tf.data): a dg_dataset describes where elements come from
 * (TFRecord files, text lines, fixed-size binary records, IDX arrays, tensors in memory) and
 * how they are transformed (map, filter, shuffle, batch, repeat, shard, interleave, prefetch);
 * a dg_iterator walks one. An element is a tuple of tensors (dg_element). An iterator's
 * position serializes to bytes that a checkpoint keeps beside the variables, and a restored
 * iterator yields exactly the elements an uninterrupted one would have. TFRecord files are
 * written with dg_tfrecord_writer. Guide, record layouts and guarantees: docs/DATASETS.md.
 * A dataset may be iterated by several iterators; one iterator is used by one thread at a
 * time (its map and prefetch stages run threads of their own). */
#ifndef DISTGRAPH_DATASET_H
#define DISTGRAPH_DATASET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/checkpoint.h"
#include "distgraph/graph.h"
#include "distgraph/monitored_session.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_dataset dg_dataset;
typedef struct dg_iterator dg_iterator;

// ---- elements ----
#define DG_ELEMENT_MAX_COMPONENTS 16

// A tuple of n tensors. An element handed to the caller holds one reference to each component.
typedef struct dg_element {
    int n;                                                  // 0 to DG_ELEMENT_MAX_COMPONENTS
    dg_tensor *components[DG_ELEMENT_MAX_COMPONENTS];
} dg_element;

// Releases the components' references and sets n to 0. NULL does nothing.
void dg_element_clear(dg_element *e);

// ---- sources ----
// Every constructor returns: new, caller frees with dg_dataset_free() (or hands it to a
// transformation, which consumes it); NULL on error. File names are copied; files are opened
// when an iterator reaches them (a missing file is NOT_FOUND then, naming it).

// Options of the file sources (TFRecord, text lines, fixed-size records).
typedef struct dg_file_source_options {
    bool skip_corrupt;         // damaged records are skipped and counted (dg_iterator_skipped)
                               // instead of failing the iterator with DATA_LOSS
    int64_t max_record_bytes;  // a record (or line) claiming more bytes is refused; default 256 MiB
} dg_file_source_options;
dg_file_source_options dg_file_source_options_default(void);
// A file that is a pipe or a device (/dev/stdin, a FIFO fed by another program) is a stream:
// read to its end, which falls between records (a record cut short there is DATA_LOSS). The
// position of an iterator that has read from a stream is saved, but restoring it is
// FAILED_PRECONDITION naming the file (a stream cannot go back); a fixed-record stream may
// have a header, not a footer (INVALID_ARGUMENT), and IDX files must be regular files.

// The records of TFRecord files, in file order: each element is one uint8 tensor [length] of
// the record's bytes. A damaged record (a CRC mismatch, a length or data cut short, a length
// over max_record_bytes or past the file's end) is DATA_LOSS naming the file and the record's
// byte offset; with skip_corrupt, a record whose length is over max_record_bytes is skipped
// alone (its length passed its CRC), other damage to a length ends the file. opts may be NULL
// for the defaults. Borrows files for the call.
dg_dataset *dg_dataset_tfrecord(const char *const *files, int n_files, const dg_file_source_options *opts,
                                dg_status *st);
// The lines of text files: each element is one uint8 tensor [length] of a line's bytes,
// without its "\n" (or "\r\n"); a last line without "\n" counts. A regular file is read up to
// the size it had when the iterator opened it. A line over max_record_bytes is RESOURCE_EXHAUSTED naming
// the file and offset; a read error is DATA_LOSS and, with skip_corrupt, ends that file.
dg_dataset *dg_dataset_text_lines(const char *const *files, int n_files, const dg_file_source_options *opts,
                                  dg_status *st);
// Records of record_bytes bytes each (> 0) after header_bytes and before footer_bytes of each
// file (tf.data's FixedLengthRecordDataset): each element is one uint8 tensor [record_bytes].
// A body that is not a whole number of records, or a file shorter than header and footer, is
// DATA_LOSS naming the file (with skip_corrupt, the partial record or the file is skipped and
// counted). header_bytes + footer_bytes must not overflow int64 (INVALID_ARGUMENT).
dg_dataset *dg_dataset_fixed_records(const char *const *files, int n_files, int64_t record_bytes,
                                     int64_t header_bytes, int64_t footer_bytes,
                                     const dg_file_source_options *opts, dg_status *st);
// IDX files (the MNIST format: two zero bytes, a type byte, the number of dimensions, then
// each dimension as a big-endian uint32, then the values big-endian). Element i is the tuple
// (files[0][i], files[1][i], ...): for the images and labels of MNIST, a uint8 [28, 28] and a
// uint8 scalar. Types: uint8 (0x08), int32 (0x0C), float32 (0x0D), float64 (0x0E); others are
// UNIMPLEMENTED. Headers are read now: a missing file is NOT_FOUND, a malformed header (bad
// magic, no dimensions, a size that does not match the file's) INVALID_ARGUMENT naming the file,
// files of different first dimensions INVALID_ARGUMENT naming both. Borrows files for the call.
dg_dataset *dg_dataset_idx(const char *const *files, int n_files, dg_status *st);
// The slices along dimension 0 of tensors in memory: element i is (components[0][i], ...).
// All must have rank >= 1 and the same first dimension. Takes a reference to each component.
dg_dataset *dg_dataset_from_tensors(dg_tensor *const *components, int n, dg_status *st);

// ---- transformations ----
// Each consumes input, also on failure, and returns: new, caller frees with dg_dataset_free();
// NULL on error (INVALID_ARGUMENT naming the bad argument).

// Fills *out (n = 0 on entry) with new references from in (borrowed). Returning false with st
// set fails the iterator's next with st's code and the message prefixed by "map (element N)".
// Called from several threads at once when parallelism > 1: it must be thread-safe.
typedef bool (*dg_map_fn)(void *ctx, const dg_element *in, dg_element *out, dg_status *st);
// Applies fn to each element, up to parallelism (>= 1) elements at once on threads of the
// iterator's own; the output keeps the input's order. ctx is borrowed for the dataset's life.
dg_dataset *dg_dataset_map(dg_dataset *input, dg_map_fn fn, void *ctx, int parallelism, dg_status *st);

// Sets *keep; false with st set fails next like dg_map_fn. Called from one thread at a time:
// the one calling dg_iterator_next, or a prefetch stage's thread when one is above the filter
// (then not the caller's thread).
typedef bool (*dg_filter_fn)(void *ctx, const dg_element *e, bool *keep, dg_status *st);
dg_dataset *dg_dataset_filter(dg_dataset *input, dg_filter_fn fn, void *ctx, dg_status *st);

// Shuffles through a buffer of buffer_size (>= 1) elements: each output is a random element of
// the buffer, replaced by the next input. The order is a function of seed and of the epoch
// (the count of dg_dataset_repeat passes above this shuffle), so each epoch is shuffled anew
// and the same seed gives the same order every run.
dg_dataset *dg_dataset_shuffle(dg_dataset *input, int64_t buffer_size, uint64_t seed, dg_status *st);

// Stacks batch_size (>= 1) consecutive elements into one: each component gains a leading
// dimension. Components must agree in dtype and shape across the batch (INVALID_ARGUMENT at
// next, naming the component and both shapes). The last, smaller batch is kept unless
// drop_remainder.
dg_dataset *dg_dataset_batch(dg_dataset *input, int64_t batch_size, bool drop_remainder, dg_status *st);

// dg_dataset_batch where components may differ in shape (not in rank or dtype): each is padded
// at the end of each dimension to padded_shapes[c] (a dimension of -1: the batch's largest;
// padded_shapes NULL: the largest in every dimension) with padding_values[c] (NULL: zeros).
// An element larger than its padded shape is INVALID_ARGUMENT at next. A component's padded
// batch over 1 GiB (its size follows the data: one long line pads every other) is
// RESOURCE_EXHAUSTED at next, naming the sizes, before it is allocated. Borrows the arrays
// for the call (n_components entries each; n_components 0 when both are NULL).
dg_dataset *dg_dataset_padded_batch(dg_dataset *input, int64_t batch_size, bool drop_remainder,
                                    const dg_shape *padded_shapes, const double *padding_values,
                                    int n_components, dg_status *st);
// Options of a padded batch.
typedef struct dg_padded_batch_options {
    int64_t max_batch_bytes;   // a component's batch over this (>= 1) is RESOURCE_EXHAUSTED; default 1 GiB
} dg_padded_batch_options;
dg_padded_batch_options dg_padded_batch_options_default(void);
// dg_dataset_padded_batch with options (NULL: the defaults; borrowed for the call).
dg_dataset *dg_dataset_padded_batch_with_options(dg_dataset *input, int64_t batch_size, bool drop_remainder,
                                                 const dg_shape *padded_shapes, const double *padding_values,
                                                 int n_components, const dg_padded_batch_options *opts,
                                                 dg_status *st);

// Repeats the input count times (-1: forever). A pass that yields nothing ends the repetition.
dg_dataset *dg_dataset_repeat(dg_dataset *input, int64_t count, dg_status *st);

// Keeps every num_shards-th element starting at index (0 <= index < num_shards): TensorFlow's
// shard, the way each of num_shards workers takes its own part of the data.
dg_dataset *dg_dataset_shard(dg_dataset *input, int64_t num_shards, int64_t index, dg_status *st);

// Reads cycle_length (>= 1) files of a file source at once, block_length (>= 1) elements from
// each in turn; a file that ends is replaced by the next file in the list (tf.data's
// deterministic interleave of the file list). input must be a file source (TFRecord, text
// lines, fixed records) not yet interleaved, else INVALID_ARGUMENT.
dg_dataset *dg_dataset_interleave(dg_dataset *input, int cycle_length, int block_length, dg_status *st);

// A background thread runs the input ahead, holding up to buffer_size elements
// (DG_PREFETCH_AUTO: 2).
#define DG_PREFETCH_AUTO 0
dg_dataset *dg_dataset_prefetch(dg_dataset *input, int buffer_size, dg_status *st);

void dg_dataset_free(dg_dataset **ds);

// ---- iterators ----

// An iterator at the start of ds. Borrows ds until dg_iterator_free(). Returns: new, caller
// frees with dg_iterator_free(); NULL on error.
dg_iterator *dg_iterator_new(const dg_dataset *ds, dg_status *st);
void dg_iterator_free(dg_iterator **it);

// The next element into *out (its previous components are released first), or
// *end_of_sequence true and out->n 0 when the data are exhausted (then every later call says so
// again). Returns false on an error (st: a damaged or missing file, a map function's error, ...);
// an error ends the iterator: later calls fail again with the same code and message.
bool dg_iterator_next(dg_iterator *it, dg_element *out, bool *end_of_sequence, dg_status *st);

// How many elements next has handed out (since the start, through restores).
int64_t dg_iterator_position(const dg_iterator *it);
// How many damaged records the sources skipped (with skip_corrupt), through restores.
int64_t dg_iterator_skipped(const dg_iterator *it);

// Fills feed_values[i] (borrowed from e, valid until e is cleared or refilled) from
// e->components[i] for i < n, for dg_session_run(s, feeds, feed_values, n, ...): the feeds
// array holds the placeholders in the element's order. An element of another number of
// components, or a component whose dtype or shape the placeholder cannot take, is
// INVALID_ARGUMENT naming the placeholder.
bool dg_element_feed(const dg_element *e, const dg_output *feeds, int n, dg_tensor **feed_values, dg_status *st);

// ---- resuming ----

// The iterator's position as bytes: the files' offsets, the interleave cycle, shuffle buffers
// with their random state, elements buffered by map and prefetch, epochs, counters. *bytes:
// new, caller frees with free(). Waits for the work in flight of map and prefetch stages.
bool dg_iterator_save(dg_iterator *it, unsigned char **bytes, size_t *n_bytes, dg_status *st);
// Puts the iterator where the saved one was; it must walk the same dataset description (the
// same stages and arguments; a file source's description holds a hash of its files' names and
// their sizes when the dataset was made), else INVALID_ARGUMENT naming the first stage that
// differs. A file open in the state whose size changed since is FAILED_PRECONDITION naming it.
// Bytes that fail their checksum are DATA_LOSS. Borrows bytes for the call.
bool dg_iterator_restore(dg_iterator *it, const void *bytes, size_t n_bytes, dg_status *st);

// Saves the iterator's position under name (1 to 255 bytes) with every checkpoint sv saves,
// in the same transaction as the variables (dg_saver_add_blob), and puts it back whenever sv
// restores variables (dg_saver_restore; a monitored session's recovery): to the position saved
// in that checkpoint, or to the start when the checkpoint has none (it was saved before the
// iterator was attached); a position that does not restore fails dg_saver_restore, naming the
// blob. Restoring the first time, before attaching, is dg_iterator_restore_checkpoint's work.
// Either may be freed first:
// dg_iterator_free removes the blob from sv (dg_saver_remove_blob), and a freed saver leaves
// the iterator nothing to detach. Borrows sv until then.
bool dg_iterator_attach_saver(dg_iterator *it, dg_saver *sv, const char *name, dg_status *st);
// Restores the position saved under name in the checkpoint of step (-1: newest) of store;
// NOT_FOUND when the checkpoint holds none. Pass the step the variables came from (the
// restored_step of dg_saver_restore, or dg_monitored_session_restored_step), not -1: a
// checkpoint written since (by another process) would pair the variables of one step with the
// input position of another. Borrows store for the call.
bool dg_iterator_restore_checkpoint(dg_iterator *it, dg_checkpoint_store *store, int64_t step, const char *name,
                                    dg_status *st);

// ---- TFRecord writing ----
typedef struct dg_tfrecord_writer dg_tfrecord_writer;

// Creates (truncates) path. A directory that does not exist is NOT_FOUND, one we may not write
// FAILED_PRECONDITION, naming the file. Returns: new, caller frees with dg_tfrecord_writer_free()
// (which closes the file without reporting; call dg_tfrecord_writer_close to know it is written).
dg_tfrecord_writer *dg_tfrecord_writer_new(const char *path, dg_status *st);
// Appends one record: the length, its masked CRC-32C, the bytes, their masked CRC-32C. After a
// failed write (which may leave part of a record in the file) every later write, and the
// close, is FAILED_PRECONDITION naming the file.
bool dg_tfrecord_writer_write(dg_tfrecord_writer *w, const void *data, size_t n_bytes, dg_status *st);
// Flushes and closes the file (fsync when sync); a full disk is RESOURCE_EXHAUSTED naming it.
bool dg_tfrecord_writer_close(dg_tfrecord_writer *w, bool sync, dg_status *st);
void dg_tfrecord_writer_free(dg_tfrecord_writer **w);

#ifdef __cplusplus
}
#endif
#endif
