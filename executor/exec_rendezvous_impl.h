/* The rendezvous (rendezvous.c): Send/Recv hand-off by (step id, key), the routing of values
 * to other tasks, aborted steps, and the cancellation of kernels that wait by step. */
#ifndef DG_EXEC_RENDEZVOUS_IMPL_H
#define DG_EXEC_RENDEZVOUS_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/status.h"
#include "distgraph/tensor.h"

typedef struct exec_trace exec_trace;   // a task's notes of a traced step (exec_trace_impl.h)

typedef struct exec_rendezvous exec_rendezvous;
// Called once with the tensor (a reference the callee owns) or with an error status.
typedef void (*exec_recv_cb)(void *arg, int node, dg_tensor *t, const dg_status *st);
exec_rendezvous *exec_rendezvous_new(void);
void exec_rendezvous_free(exec_rendezvous **r);
// Decides where a sent value goes: returns 1 when it sent it to another task, 0 when the
// value is for this task, -1 on failure (st set).
typedef int (*exec_route_fn)(void *ctx, int64_t step_id, const char *key, dg_tensor *t,
                             dg_status *st);
// Sends what the router held back for a step (called when an executor runs out of ready
// nodes, so values leave together rather than one message each).
typedef void (*exec_flush_fn)(void *ctx, int64_t step_id);
void exec_rendezvous_set_router(exec_rendezvous *r, exec_route_fn fn, exec_flush_fn flush, void *ctx);
// Tells the task of device (another task's, or this one's: then nothing) that step_id failed
// with why, so that its receives for the step fail at once (the router's ctx; set by the
// server). A collective that fails tells its other members this way.
typedef void (*exec_abort_remote_fn)(void *ctx, int64_t step_id, const char *device, const dg_status *why);
void exec_rendezvous_set_remote_abort(exec_rendezvous *r, exec_abort_remote_fn fn);
void exec_rendezvous_abort_remote(exec_rendezvous *r, int64_t step_id, const char *device, const dg_status *why);
void exec_rendezvous_flush(exec_rendezvous *r, int64_t step_id);
// Puts a value into this task's table (values arriving from other tasks come in here).
bool exec_rendezvous_deliver(exec_rendezvous *r, int64_t step_id, const char *key, dg_tensor *t,
                             dg_status *st);
// Routes (see exec_rendezvous_set_router) or delivers. Takes a new reference to t. Fails if
// the step was aborted or the key was already sent.
bool exec_rendezvous_send(exec_rendezvous *r, int64_t step_id, const char *key, dg_tensor *t,
                          dg_status *st);
// cb runs now if the value is there (or the step aborted), else when it is sent.
void exec_rendezvous_recv_async(exec_rendezvous *r, int64_t step_id, const char *key,
                                exec_recv_cb cb, void *arg, int node);
// Fails the step's waiting and future receivers with ABORTED carrying why.
void exec_rendezvous_abort(exec_rendezvous *r, int64_t step_id, const dg_status *why);
// Fails every waiting and future receiver (shutdown).
void exec_rendezvous_close(exec_rendezvous *r, const dg_status *why);
// Notes the step's transfers in t (t NULL: stops): values this task hands to the router for
// another task (EXEC_TRACE_SENT) and values arriving from others (exec_rendezvous_note_arrival).
// t is borrowed until the call with NULL returns. At most 64 steps are traced at once (more are
// not noted).
void exec_rendezvous_trace(exec_rendezvous *r, int64_t step_id, exec_trace *t);
// A value from another task arrived for step_id (the transport calls it before delivering).
void exec_rendezvous_note_arrival(exec_rendezvous *r, int64_t step_id, const char *key, uint64_t bytes);
// Drops whatever the step left behind; a receive of it still waiting fails (ABORTED), and so
// do its cancellers, so that the step ends.
void exec_rendezvous_end_step(exec_rendezvous *r, int64_t step_id);
// Abort marks held (a hash set by step id; past 100000 the oldest are dropped).
int exec_rendezvous_num_abort_marks(exec_rendezvous *r);
// Drops the values that have waited older_than_ms or more for their receiver, of the steps
// running (may be NULL) says are not running here: a step whose master died before starting
// it never takes them. Those steps are marked aborted (a late start fails at once). running is
// called without the rendezvous's lock held. Returns the number of values dropped.
int exec_rendezvous_drop_stale(exec_rendezvous *r, int64_t older_than_ms, bool (*running)(void *ctx, int64_t step_id),
                               void *ctx);

// ---- cancellation of waiting kernels (by step, through the rendezvous) ----
// Kernels that wait for something other than a rendezvous value (a sync-replicas take or
// dequeue) register here so that an aborted step (ABORT_STEP, a failed node, a missed deadline)
// or a closed rendezvous (server shutdown) ends their wait. fn is called at most once, on the
// aborting thread, with the cause; it must not block.
typedef void (*exec_cancel_fn)(void *arg, const dg_status *why);
// Registers fn for step_id. Returns a token (> 0) for exec_rendezvous_forget_cancel; 0 when the
// step is already aborted or the rendezvous closed (then fn is not registered and why, which
// may be NULL, receives the cause) or on out of memory (why gets RESOURCE_EXHAUSTED).
int64_t exec_rendezvous_on_cancel(exec_rendezvous *r, int64_t step_id, exec_cancel_fn fn, void *arg,
                                  dg_status *why);
// Unregisters token. Returns true when fn will not be called; false when it has been or is
// being called (or token is 0 or unknown). Never waits.
bool exec_rendezvous_forget_cancel(exec_rendezvous *r, int64_t token);

#endif
