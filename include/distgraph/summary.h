/* TensorBoard event files: what `tensorboard --logdir DIR` shows. A writer appends events to
 * one file "events.out.tfevents.<unix seconds>.<host>.<pid>" in a log directory: the file
 * version first, then scalars, histograms and graphs (TensorBoard's graph view shows each
 * node's device), each a record of TensorBoard's format (a little-endian length, its masked
 * CRC32C, an Event protocol-buffer message, its masked CRC32C). The monitored session writes
 * one with dg_mts_options.logdir (the chief: the DG_SUMMARIES scalars every
 * save_summaries_steps and the placed graph after the first step). Thread safety: a writer may
 * be used from one thread at a time. */
#ifndef DISTGRAPH_SUMMARY_H
#define DISTGRAPH_SUMMARY_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_event_writer dg_event_writer;

// Creates logdir (and its parents) when missing and a new event file in it, whose first event
// holds the file version. A directory that cannot be made or written is FAILED_PRECONDITION
// naming it and the system's reason. Returns: new, caller frees with dg_event_writer_free();
// NULL with st set.
dg_event_writer *dg_event_writer_new(const char *logdir, dg_status *st);
// The file's path. Returns: borrowed, valid until the writer is freed.
const char *dg_event_writer_path(const dg_event_writer *w);
// A scalar (TensorBoard's scalars dashboard): tag, the global step, the value.
bool dg_event_writer_add_scalar(dg_event_writer *w, const char *tag, int64_t step, double value, dg_status *st);
// A histogram of n values (TensorBoard's histograms dashboard), in buckets growing by 10% from
// 1e-12, as TensorFlow's; NaN values are left out. n 0 writes an empty histogram.
bool dg_event_writer_add_histogram(dg_event_writer *w, const char *tag, int64_t step, const double *values,
                                   int64_t n, dg_status *st);
// The graph as TensorBoard's graph view reads it: each node's name, op, inputs ("x", "x:1",
// "^ctrl") and device (the one it was placed on, else the one it asked for).
bool dg_event_writer_add_graph(dg_event_writer *w, const dg_graph *g, int64_t step, dg_status *st);
// Writes buffered events to the file (the writer flushes after each graph and every second).
// An error (a full disk: RESOURCE_EXHAUSTED) names the file; the events since the last flush
// may be lost, the file stays readable up to its last whole record.
bool dg_event_writer_flush(dg_event_writer *w, dg_status *st);
// Flushes and closes. NULL or a pointer to NULL does nothing.
void dg_event_writer_free(dg_event_writer **w);

// One event read back: kind is "file_version", "graph", "scalar" or "histogram"; for scalars
// tag and value, for histograms tag and value = the number of values, for the file version
// tag = the version string, for graphs value = the number of nodes.
typedef struct dg_event {
    double wall_time;
    int64_t step;
    const char *kind;
    const char *tag;
    double value;
} dg_event;

// Reads every event of an event file in order, calling fn (ctx, event) for each, or for each
// value of a summary with several (fn returning false stops the reading, with true returned).
// Every record's two checksums are verified: a damaged record is DATA_LOSS naming the file and
// the record's byte offset, a file ending inside a record is DATA_LOSS "truncated" (a writer
// killed mid-record), a record that is no Event protocol buffer is DATA_LOSS too. *n_events
// (may be NULL) counts the events read before any error. fn may be NULL (a check).
bool dg_event_file_read(const char *path, bool (*fn)(void *ctx, const dg_event *e), void *ctx,
                        int64_t *n_events, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
