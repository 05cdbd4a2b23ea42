/* Step traces on a task (trace.c): what one task notes during a traced step, in the event
 * vocabulary of distgraph/trace_event.h; the runtime gathers the notes of every task
 * (runtime/master/step_trace.c). */
#ifndef DG_EXEC_TRACE_IMPL_H
#define DG_EXEC_TRACE_IMPL_H

#include <stdint.h>

#include "distgraph/trace_event.h"

typedef struct exec_trace exec_trace;   // a task's notes of a traced step

// Events with times on this process's monotonic clock (exec_trace_now_ns). Besides the public
// kinds, a task notes the two halves of a transfer, paired by the master (step_trace.c).
#define EXEC_TRACE_SENT 16      // name: rendezvous key; start: handed to the transport
#define EXEC_TRACE_ARRIVED 17   // name: rendezvous key; start: arrived from another task
// Returns: new, caller frees with exec_trace_free(); NULL when out of memory.
exec_trace *exec_trace_new(void);
void exec_trace_free(exec_trace **t);
int64_t exec_trace_now_ns(void);
// This thread's number in the process (1, 2, ... in order of first use).
int exec_trace_thread(void);
// Appends e, copying its strings (NULL ones become ""). Thread-safe; out of memory drops it.
void exec_trace_add(exec_trace *t, const dg_trace_event *e);
int exec_trace_num_events(const exec_trace *t);
// Returns: borrowed, valid until the next add or the free.
const dg_trace_event *exec_trace_events(const exec_trace *t);

#endif
