/* The blob of trace notes a task sends with its answer to a traced request (docs/PROTOCOL.md,
 * section 4b, "Step traces"): a msgpack map {"recv": T2, "reply": T3, "ev": [[kind, name, op, task,
 * device, peer, start, end, bytes, thread], ...], "tasks": [[name, offset, uncertainty], ...]}.
 * The worker service encodes its notes; the master encodes a whole trace for a client in
 * another process; the master's step traces read both (runtime/master/step_trace.c). */
#ifndef DG_TRACE_BLOB_IMPL_H
#define DG_TRACE_BLOB_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "distgraph/trace_event.h"
#include "exec_trace_impl.h"

// A task's clock in a blob: its offset from the sender's clock and how uncertain that is.
typedef struct rt_trace_task {
    char *name;
    int64_t offset_ns, uncertainty_ns;
} rt_trace_task;

// Encodes n events (times moved by +shift) and n_tasks task clocks, with recv_ns and reply_ns
// (when the sender got the request and when it answers). Returns: new buffer (caller frees)
// and its length.
char *rt_trace_blob_encode(const dg_trace_event *ev, int n, int64_t shift, const rt_trace_task *tasks, int n_tasks,
                           int64_t recv_ns, int64_t reply_ns, size_t *len);
// A task's own notes (its events on its clock, no task clocks) as a blob.
char *rt_trace_blob_encode_notes(const exec_trace *t, int64_t recv_ns, int64_t reply_ns, size_t *len);

#endif
