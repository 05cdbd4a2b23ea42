/* The cluster coordinator of the ps_coordinator distribution (coordinator.c): closures (training
 * steps) scheduled by the program, run on whichever worker task is free, given back to the
 * queue when a worker fails. Thread-safe; the program schedules from one thread. */
#ifndef DG_COORDINATOR_IMPL_H
#define DG_COORDINATOR_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/session.h"
#include "distgraph/tensor.h"

typedef struct training_coordinator training_coordinator;

// One thread per worker (targets "dg://host:port") opens a session on its master over g, whose
// steps run train; so as for any session (NULL: the defaults). probe (the global step) is
// fetched through a worker whose step failed: the worker is lost only when that fails too. A worker that is not up takes
// work when it answers; when none has answered for no_worker_timeout_ms, the calls below fail
// with UNAVAILABLE. log: a line on stderr when a worker is not up, fails or comes back, and the
// steps each ran at the end. Borrows g and train until
// training_coordinator_free. Returns: new, caller frees with training_coordinator_free(); NULL
// with st set.
training_coordinator *training_coordinator_new(dg_graph *g, dg_node *train, dg_output probe,
                                               const char *const *worker_targets,
                                               int n_workers, const dg_session_options *so,
                                               int64_t no_worker_timeout_ms, bool log, dg_status *st);
// Frees; a step running on a worker finishes first, the steps still queued are dropped.
void training_coordinator_free(training_coordinator **c);

// Queues a step: the feeds (values copied) and fetches, run with the train target on the next
// free worker. Waits while a step already waits for each live worker. Fails with the first
// error a step met that is not a lost worker's, or a step's fifth failure (kept: every later
// call fails with it), or
// UNAVAILABLE when no worker has answered for no_worker_timeout_ms (since the start or since
// the last one failed).
bool training_coordinator_schedule(training_coordinator *c, const dg_output *feeds, dg_tensor *const *values,
                                   int n_feeds, const dg_output *fetches, int n_fetches, dg_status *st);
// The fetches of the newest step (in the order scheduled) that finished since the last call,
// when it fetched these n: fetched[0..n-1] receive them (caller unrefs) and n is returned;
// otherwise 0 and nothing set.
int training_coordinator_take_latest(training_coordinator *c, const dg_output *fetches, dg_tensor **fetched, int n);
// Waits until no step is queued or running; fails as training_coordinator_schedule.
bool training_coordinator_wait(training_coordinator *c, dg_status *st);

#endif
