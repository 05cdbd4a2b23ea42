/* The master: compiles a graph's steps and runs them (docs/ARCHITECTURE.md, "The master").
 * One pipeline serves every session: prune to what the step needs, place over the devices
 * (this process's, or every task's of a cluster), partition with a client device (feeds enter
 * and fetches leave there), register the partitions of other tasks with them through the
 * worker client, compile this process's partitions into one executable; a step runs them all
 * under one step id and aborts everywhere on the first failure. Closing deregisters every
 * partition the master registered. A master session may be run from several threads. */
#ifndef DG_MASTER_IMPL_H
#define DG_MASTER_IMPL_H

#include "distgraph/server.h"
#include "distgraph/session.h"
#include "distgraph/trace.h"
#include "server_impl.h"

typedef struct master_session master_session;

// task NULL: a local master over this process's devices. Otherwise the master of the task's
// cluster (a server's rt_server_env), that task being the client. Borrows g (and task) until
// master_session_free.
// Returns: new, caller frees with master_session_free(); NULL with st set.
master_session *master_session_new(dg_graph *g, const rt_task_env *task, const dg_session_options *opts,
                                   dg_status *st);
// Deregisters every partition it registered (without waiting) and frees.
void master_session_free(master_session **m);
// Checks feeds, fetches and targets against the graph (the session's argument checks).
bool master_check_args(const dg_graph *g, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                       const dg_output *fetches, int n_fetches, dg_node *const *targets, int n_targets,
                       dg_status *st);
// One step; arguments already checked. As dg_session_run. trace (NULL: not traced) receives the
// notes of every task that ran a part of the step, on this process's clock (step_trace_impl.h;
// the caller finishes it).
bool master_session_run(master_session *m, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                        const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                        int n_targets, dg_step_trace *trace, dg_status *st);
// A master serving a remote client (the master service): the lines log_device_placement
// prints go to the client instead of this process's stderr. They wait, at most 20000 (then a
// count), until taken.
void master_session_collect_placement(master_session *m);
// The placement lines waiting for the client; *lines is new (free each and the array; NULL
// when there are none). Returns their number.
int master_session_take_placement(master_session *m, char ***lines);
// The session is going away: the steps running now fail with why on every task, later steps
// fail at once, and a wait for a task not up yet ends. Never blocks on a running step or wait.
void master_session_abort(master_session *m, const dg_status *why);

#endif
