/* The typed client of a task's worker service: everything a master asks of the tasks it
 * drives (register, deregister and run a partition, abort a step, list devices, wait until a
 * task answers). The master never builds a wire message itself; this file does. Every call
 * names the task by its endpoint ("tcp://host:port") and goes through the transport of the
 * master's own task. */
#ifndef DG_WORKER_CLIENT_IMPL_H
#define DG_WORKER_CLIENT_IMPL_H

#include "distgraph/graph.h"
#include "transport_impl.h"

// Registers partition g with the task; *handle names it there. Borrows g for the call.
bool wc_register_graph(rt_transport *tp, const char *endpoint, const dg_graph *g, int64_t timeout_ms,
                       int64_t *handle, dg_status *st);
// Forgets a registered partition. One-way and without waiting: a task that is gone must not
// delay whoever closes.
void wc_deregister_graph(rt_transport *tp, const char *endpoint, int64_t handle);
// Runs a registered partition for step_id; done runs once with the answer or the failure
// (its arguments as rt_response_cb's). trace: the task notes the step and answers with its
// notes as the blob (step_trace_impl.h). parts: how many partitions of this step the task runs
// (the task ends the step when the last of them is done: a value one sends another stays).
void wc_run_graph(rt_transport *tp, const char *endpoint, int64_t handle, int64_t step_id, int64_t timeout_ms,
                  bool trace, int parts, rt_response_cb done, void *arg);
// PINGs the task; done runs once with the answer or the failure (as rt_response_cb's).
void wc_ping(rt_transport *tp, const char *endpoint, int64_t timeout_ms, rt_response_cb done, void *arg);
// Aborts step_id on the task (one-way): its waiting receives fail with why.
void wc_abort_step(rt_transport *tp, const char *endpoint, int64_t step_id, const dg_status *why);
// The task's devices, canonical names. Returns: new array of new strings (*n of them), free
// with dg_device_list_free(); NULL with st set.
char **wc_list_devices(rt_transport *tp, const char *endpoint, int64_t timeout_ms, int *n, dg_status *st);
// Waits until the task answers a PING. Logs on stderr every log_every_ms (0: never) which task
// at which address it still waits for, as TensorFlow's master does. max_wait_ms <= 0: no
// limit. Fails UNAVAILABLE naming the task and address when the limit passes. stopped (may be
// NULL) is asked between attempts (at most 1.2 s apart); when it returns true the wait fails
// with the status it set.
bool wc_wait_for_task(rt_transport *tp, const char *endpoint, const char *task, int64_t max_wait_ms,
                      int64_t log_every_ms, const char *who, bool (*stopped)(void *arg, dg_status *why),
                      void *stop_arg, dg_status *st);

#endif
