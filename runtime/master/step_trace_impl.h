/* Building a step trace (distgraph/trace.h) from the notes of the tasks a step ran on. A task
 * sends its notes (exec_trace) with its answer as a blob: its events on its own clock and the
 * times it got the request and answered. The master adds the blob with the times it sent the
 * request and got the answer on its clock, which give the task's offset (trace.h says how),
 * then pairs the two halves of every transfer. The master service sends the finished trace to
 * a client in another process the same way, its own events then on its own clock. */
#ifndef DG_STEP_TRACE_IMPL_H
#define DG_STEP_TRACE_IMPL_H

#include "distgraph/trace.h"
#include "exec_trace_impl.h"

// A trace of a step that began at origin_ns on this clock. Returns: new, caller frees with
// dg_step_trace_free(); NULL when out of memory.
dg_step_trace *step_trace_new(int64_t origin_ns);
// An event on this clock (strings copied; "" task: own_task).
void step_trace_add(dg_step_trace *tr, const dg_trace_event *e);
// The step ended at end_ns on this clock; what follows (merging the notes) is tracing's own
// cost and is left out of the step's time.
void step_trace_set_end(dg_step_trace *tr, int64_t end_ns);
// What step_trace_set_end said, or 0.
int64_t step_trace_end(const dg_step_trace *tr);
// When the step began (step_trace_new's origin_ns), on this clock.
int64_t step_trace_origin(const dg_step_trace *tr);
// This process's notes: events on this clock whose task is "" get task.
void step_trace_add_local(dg_step_trace *tr, const exec_trace *t, const char *task);
// A blob of notes (step_trace_encode) in the answer of task to the request named request
// ("RUN_GRAPH") this side (master_task) sent at sent_ns and whose answer came at answered_ns,
// both on this clock. Adds the task's events on this clock, its clock's offset (and the offsets
// of the tasks the blob names, moved by it) and the two messages. A malformed blob is
// INVALID_ARGUMENT naming task.
bool step_trace_add_remote(dg_step_trace *tr, const void *blob, size_t len, const char *task,
                           const char *master_task, const char *request, int64_t sent_ns,
                           int64_t answered_ns, dg_status *st);
// The step ended at end_ns on this clock (unless step_trace_set_end said earlier): narrows the
// tasks' clock offsets with their transfers, pairs transfer halves, moves times to the origin.
void step_trace_finish(dg_step_trace *tr, int64_t end_ns);
// Encodes the trace's events (a finished trace's moved back by its origin) and, for a
// finished trace, its tasks' offsets, with recv_ns and reply_ns (when this side got the
// request and when it answers) as a blob (trace_blob_impl.h). Returns: new buffer (caller
// frees) and its length.
char *step_trace_encode(const dg_step_trace *tr, int64_t recv_ns, int64_t reply_ns, size_t *len);

// distgraph's executor's hand-over rule for the simulator (dg_cost_model_set_handoff): a node
// goes to another thread when its kernel on device_type is an expensive one (exec_kernel_def).
bool step_trace_executor_handoff(void *ctx, const dg_node *n, const char *device_type);

#endif
