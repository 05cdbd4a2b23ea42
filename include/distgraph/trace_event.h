/* The events of a step timeline (distgraph/trace.h): what happened, where and when. A header
 * of its own because two layers use it: the executor notes these events while a traced step
 * runs on a task, and the runtime gathers every task's events into a step trace (trace.h,
 * which includes this header; users include that one or distgraph/session.h). */
#ifndef DISTGRAPH_TRACE_EVENT_H
#define DISTGRAPH_TRACE_EVENT_H

#include <stdint.h>

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

#ifdef __cplusplus
}
#endif
#endif
