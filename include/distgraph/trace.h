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
 * kernel and one counter per transfer.
 *
 * The events themselves (dg_trace_kind, dg_trace_event) are in distgraph/trace_event.h, which
 * this header includes: the executor notes them, the runtime gathers them into a step trace. */
#ifndef DISTGRAPH_TRACE_H
#define DISTGRAPH_TRACE_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/auto_place.h"
#include "distgraph/status.h"
#include "distgraph/trace_event.h"

#ifdef __cplusplus
extern "C" {
#endif

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

// Gives the automatic placer's cost model each op's measured time (dg_cost_model_set_measured:
// its kernel's duration, for its device's type) and, from the step's transfers between tasks
// (at least 3 of a link kind), that link's latency under load: the median of their times beyond
// their bytes at the link's bandwidth (which holds the receiving task's wait for a thread when
// its cores are busy); from the ops handed to a thread that ran nothing while they waited (at
// least 3 of a device type), the type's wake time (dg_cost_model_set_wake: their median); and it
// gives the model this executor's rule of which ops a thread hands over (dg_cost_model_set_handoff).
// Profile a step on one placement, then place (docs/PLACEMENT.md). Returns the
// ops measured; -1 with st set on error.
int dg_step_trace_measure(const dg_step_trace *t, dg_cost_model *m, dg_status *st);
// The same over several traced steps of one placement: each op's time is its median over the
// steps that ran it (one slow step, a page fault or the other device's burst, moves none), and
// each link's latency the median over all the steps' transfers. Returns the ops measured.
int dg_step_traces_measure(const dg_step_trace *const *traces, int n_traces, dg_cost_model *m, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
