/* The training input of a replica example read through a dataset (distgraph/dataset.h,
 * docs/DATASETS.md) instead of arrays in memory: the files a flag names, the iterator over the
 * model's pipeline with its position kept in the chief's checkpoints and restored with the
 * variables, the time spent waiting for each batch, and a hash of each batch for comparing runs.
 * mnist_replica, cnn_replica (mnist_replica_model.c) and gpt_replica use it. */
#ifndef DG_REPLICA_INPUT_H
#define DG_REPLICA_INPUT_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/distgraph.h"

// The name of the iterator's blob in the chief's checkpoints.
#define REPLICA_INPUT_BLOB "input"

typedef struct replica_input {
    int64_t task;
    dg_dataset *ds;
    dg_iterator *it;
    dg_element batch;          // the element of the latest replica_input_next
    bool print_hash;           // a line per batch: its local step and a hash of its components
    int64_t n_next;            // batches taken by this process
    double first_wait_s;       // the first batch's wait (the pipeline filling up)
    double wait_s;             // the waits of the later batches, summed
    double first_call_s, last_call_s;   // when the first and the latest replica_input_next began
} replica_input;

// The files pattern names, sorted: a directory's regular files (those whose name ends in
// suffix, when suffix is not NULL; names starting with "." left out), else the glob pattern's
// matches. None is NOT_FOUND naming pattern. *files: new, free with replica_input_files_free.
bool replica_input_files(const char *pattern, const char *suffix, char ***files, int *n_files, dg_status *st);
void replica_input_files_free(char **files, int n_files);

// Starts in's iterator over ds (consumed, also on failure; in keeps it until replica_input_free).
// On the chief (dg_monitored_session_is_chief) with a checkpoint_path, the iterator's position
// goes into every checkpoint the monitored session's saver writes, and when the session restored
// the variables of a checkpoint, the position saved in that same checkpoint is restored and a
// line says so ("input position restored from the checkpoint of global step N: batch K"); a
// checkpoint without one (the one saved at the first session's creation) leaves the iterator at
// the start, and says so too. Other workers' iterators start at the beginning of their shard.
bool replica_input_start(replica_input *in, dg_dataset *ds, dg_monitored_session *ms, const char *checkpoint_path,
                         dg_status *st);
// The next batch into in->batch, timing the wait; the end of the data (a pipeline that does not
// repeat) is OUT_OF_RANGE.
bool replica_input_next(replica_input *in, dg_status *st);
// Prints the mean wait for a batch and the mean step (from one replica_input_next to the next,
// the first batch left out) when batches were taken.
void replica_input_report(const replica_input *in);
void replica_input_free(replica_input *in);

#endif
