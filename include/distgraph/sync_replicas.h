/* Synchronous replicas (TensorFlow's SyncReplicasOptimizer), as graph construction plus a
 * monitored-session hook. Each worker wraps its optimizer: its train op pushes the gradients to
 * one conditional accumulator per variable (on the variable's ps, colocated with it), then
 * waits for a token from the token queue (on the global step's ps) that carries the global step
 * its next gradients will be computed at. The chief (worker 0) also runs an apply loop on its
 * own thread: it takes replicas_to_aggregate gradients from every accumulator, applies their
 * average with the wrapped optimizer (incrementing the global step) and enqueues
 * total_num_replicas tokens. Gradients older than the accumulator's step are dropped, so with
 * total_num_replicas > replicas_to_aggregate the slowest workers are backups.
 * Main objects: dg_sync_replicas (the ops of one worker's graph); its hook, which runs them, is
 * dg_sync_replicas_hook_new in distgraph/monitored_session.h (the runtime). Ps tasks need
 * service_threads >= total_num_replicas + 3: each worker's step waits there for its token.
 * Thread-safety: build from one thread; the ops run concurrently like any other. */
#ifndef DISTGRAPH_SYNC_REPLICAS_H
#define DISTGRAPH_SYNC_REPLICAS_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"
#include "distgraph/train.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_sync_replicas dg_sync_replicas;

typedef struct dg_sync_replicas_options {
    int replicas_to_aggregate;   // gradients averaged per step (>= 1)
    int total_num_replicas;      // workers (>= replicas_to_aggregate); 0: replicas_to_aggregate
    int task_index;              // this worker's index in its job (its replica id)
    int64_t timeout_ms;          // the chief's take of one step's gradients (0: no deadline)
    int64_t token_timeout_ms;    // a worker's wait for its token; 0: 2 * timeout_ms (none when
                                 // timeout_ms is 0)
} dg_sync_replicas_options;

// replicas_to_aggregate 1, total_num_replicas 0, task_index 0, timeout_ms 0, token_timeout_ms 0.
dg_sync_replicas_options dg_sync_replicas_options_default(void);

// Wraps opt (copied; its graph is where the ops go). Nothing is added to the graph yet.
// INVALID_ARGUMENT for bad options. Returns: new, caller frees with dg_sync_replicas_free().
dg_sync_replicas *dg_sync_replicas_new(const dg_optimizer *opt, const dg_sync_replicas_options *o,
                                       dg_status *st);
void dg_sync_replicas_free(dg_sync_replicas **sr);

// Builds every op for (grads[i], vars[i]) and the global step, under the current scopes (the
// worker's device; accumulators and queue ops are colocated with their variables), and returns
// the worker's train op: ApplyGradient to every accumulator with this worker's local step, then
// a dequeued token becomes the local step. Also builds the chief's apply op with the wrapped
// optimizer (its slots are ordinary global variables) and the init ops. Call once. Returns:
// borrowed, valid until the graph is freed; NULL on error (the graph's sticky error or st).
dg_node *dg_sync_replicas_apply_gradients(dg_sync_replicas *sr, const dg_output *grads, const dg_output *vars,
                                          int n, dg_output global_step, dg_status *st);
// compute_gradients over the trainable variables, then apply_gradients. Returns: the train op,
// borrowed, valid until the graph is freed; NULL with st set on error.
dg_node *dg_sync_replicas_minimize(dg_sync_replicas *sr, dg_output loss, dg_output global_step, dg_status *st);
// minimize with dynamic loss scaling (dg_optimizer_minimize_with_loss_scale, o NULL: its
// defaults): each worker pushes the gradients of the loss times the scale (a variable with the
// global step), and the chief checks the averages it takes: when any is not finite the step is
// skipped for everyone (no variable or slot changes, the global step advances) and the scale
// halves. *ls (may be NULL) gets the scaler's outputs. Call instead of minimize.
dg_node *dg_sync_replicas_minimize_with_loss_scale(dg_sync_replicas *sr, dg_output loss, dg_output global_step,
                                                  const dg_loss_scale_options *o, dg_loss_scale *ls, dg_status *st);

// The ops, NULL (or the null output) before apply_gradients. Returns: borrowed, valid until
// the graph is freed.
dg_node *dg_sync_replicas_train_op(const dg_sync_replicas *sr);
// Chief: takes the gradients (feed num_required), applies them, enqueues the tokens. Fetch
// dg_sync_replicas_new_global_step in the same run for the step it made.
dg_node *dg_sync_replicas_chief_apply_op(const dg_sync_replicas *sr);
dg_output dg_sync_replicas_num_required(const dg_sync_replicas *sr);     // int32 placeholder
dg_output dg_sync_replicas_new_global_step(const dg_sync_replicas *sr);  // after the apply
// Chief init: every accumulator's step and the local step := the global step. Returns (this
// and the ops below): borrowed, valid until the graph is freed; NULL before apply_gradients.
dg_node *dg_sync_replicas_chief_init_op(const dg_sync_replicas *sr);
// Non-chief init: the local step := the global step.
dg_node *dg_sync_replicas_local_step_init_op(const dg_sync_replicas *sr);
dg_output dg_sync_replicas_local_step(const dg_sync_replicas *sr);
// Closes the token queue: feed the code (int32 scalar; -1 reopens and empties the queue, 0
// closes it so that an empty queue fails dequeues with OUT_OF_RANGE, > 0 fails them with that
// code) and the reason (uint8 vector of message bytes).
dg_node *dg_sync_replicas_close_queue_op(const dg_sync_replicas *sr, dg_output *code, dg_output *reason);
// Fails the takes waiting on the accumulators with CANCELLED (stops a blocked apply loop).
dg_node *dg_sync_replicas_cancel_take_op(const dg_sync_replicas *sr);
// Following the live workers (dg_sync_replicas_hook_follow_live_workers does it): the op sets,
// on every accumulator, how many workers are alive (feed *live, an int32 scalar; 0: no cap); a
// take then needs min(num_required, live) gradients, and one waiting ends as soon as it has
// that many. It also sets the number of tokens an apply enqueues (read once its takes are
// done): live, or total_num_replicas for 0 (the chief init sets that).
dg_node *dg_sync_replicas_set_live_op(const dg_sync_replicas *sr, dg_output *live);
// Enqueues the tokens fed to *tokens (int64 [n], the global steps they carry): one for each
// worker that came back, whose first gradients an apply may have taken with fewer tokens.
dg_node *dg_sync_replicas_enqueue_tokens_op(const dg_sync_replicas *sr, dg_output *tokens);
// The queue's size (int32 scalar) and the number of gradients in accumulator i.
dg_output dg_sync_replicas_queue_size(const dg_sync_replicas *sr);
dg_output dg_sync_replicas_num_accumulated(const dg_sync_replicas *sr, int i);
int dg_sync_replicas_num_variables(const dg_sync_replicas *sr);
// Returns: borrowed, valid until dg_sync_replicas_free().
const dg_sync_replicas_options *dg_sync_replicas_options_of(const dg_sync_replicas *sr);


#ifdef __cplusplus
}
#endif
#endif
