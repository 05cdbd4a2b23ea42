/* Step timelines (TensorFlow's RunOptions.FULL_TRACE and its timeline): one step recorded on
 * every task it ran on. Each task notes when each of its kernels started and ended, when it
 * handed a tensor to the transport and when a tensor from another task arrived; the tasks send
 * their notes back with their answers, and the master puts them on its own clock and pairs the
 * two ends of every transfer. dg_step_trace_write_chrome writes the result as a Chrome
 * trace-event file that Perfetto (ui.perfetto.dev) and chrome://tracing open.
 *
 * Clocks: each task notes times on its own monotonic clock. The master estimates a task's
 * offset from the RUN_GRAPH call, as NTP does: with T1 the master's time when it sent the
 * request, T2 and T3 the task's times when it got the request and when it answered, and T4 the
 * master's time when the answer came, offset = ((T2 - T1) + (T3 - T4)) / 2, off by at most
 * half the time the two messages spent in flight ((T4 - T1) - (T3 - T2)) / 2, which
 * dg_step_trace_task gives as the uncertainty. A session whose master is in another process
 * puts the master's clock on its own the same way.
 *
 * Tracing costs nothing while it is off: a step that is not traced checks one pointer per
 * kernel and one counter per transfer. */
#ifndef DISTGRAPH_TRACE_H
#define DISTGRAPH_TRACE_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_trace_kind {
    DG_TRACE_OP = 0,        // a kernel computed: name, op, device, on task
    DG_TRACE_WAIT = 1,      // an asynchronous kernel (a _Recv, a queue take) waited for its value
    DG_TRACE_TRANSFER = 2,  // a tensor travelled from peer to task: from when the sender handed
                            // it to the transport to when it arrived; name: the tensor, bytes
    DG_TRACE_MESSAGE = 3,   // a message between the master's task (peer) and task: name
                            // "RUN_GRAPH" (to the task) or "RUN_GRAPH answer" (back)
    DG_TRACE_MASTER = 4,    // the master's (or a remote client's) own work: "check and compile",
                            // "dispatch", "finish"; "RUN_STEP: prepare" on a client, "RUN_STEP:
                            // read the request" and "tracing: merge the notes" on a remote master
    DG_TRACE_QUEUED = 5,    // a node was ready and waited for a thread to run it (name, op,
                            // device: the node's); on a busy machine, time spent waiting for a core
} dg_trace_kind;

// One thing that happened during the step. Times are nanoseconds from the start of the step
// (when dg_session_run_with_options began) on the caller's clock.
typedef struct dg_trace_event {
    dg_trace_kind kind;
    const char *name;
    const char *op;        // DG_TRACE_OP and DG_TRACE_WAIT: the node's op; else ""
    const char *task;      // where it happened ("/job:ps/replica:0/task:0"); transfers: the receiver
    const char *device;    // ops: the node's device; else ""
    const char *peer;      // transfers: the sending task; messages: the master's task; else ""
    int64_t start_ns, end_ns;
    uint64_t bytes;        // transfers: the tensor's bytes
    int thread;            // a number of the thread within its task's process (a lane)
} dg_trace_event;

typedef struct dg_step_trace dg_step_trace;

typedef struct dg_run_options {
    bool trace;            // record a timeline of the step
} dg_run_options;

// The step's wall time as the session measured it, nanoseconds.
int64_t dg_step_trace_step_ns(const dg_step_trace *t);
int dg_step_trace_num_events(const dg_step_trace *t);
// Event i, 0 <= i < dg_step_trace_num_events. Returns: borrowed, valid until the trace is freed.
const dg_trace_event *dg_step_trace_event(const dg_step_trace *t, int i);
// The tasks that sent notes: task i's name, the estimated offset of its clock from the
// caller's (its time minus the caller's) and the bound on that estimate's error, both ns.
// The caller's own task has offset and uncertainty 0. Returns: borrowed; NULL when i is out
// of range.
int dg_step_trace_num_tasks(const dg_step_trace *t);
const char *dg_step_trace_task(const dg_step_trace *t, int i, int64_t *offset_ns, int64_t *uncertainty_ns);
// How much of the step the events account for: the length of the union of every event's
// interval except waits (DG_TRACE_WAIT), ns. Gaps are time in which no recorded work, transfer
// or message was under way (threads waking up, queues).
int64_t dg_step_trace_busy_ns(const dg_step_trace *t);
// Writes the trace as a Chrome trace-event JSON file (the "JSON object format"): one process
// per task, one thread lane per thread of that task, transfers and messages in lanes of their
// own with flow arrows from sender to receiver, times in microseconds. A file that cannot be
// written is an error naming it and the system's reason.
bool dg_step_trace_write_chrome(const dg_step_trace *t, const char *path, dg_status *st);
void dg_step_trace_free(dg_step_trace **t);

#ifdef __cplusplus
}
#endif
#endif
