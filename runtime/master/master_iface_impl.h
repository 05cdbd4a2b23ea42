/* What a session runs its steps through (TensorFlow's MasterInterface): a master in this
 * process (master_impl.h), local or the master of a server of this process, or the master
 * service of a task in another process through the master client (master_client_impl.h).
 * The session (runtime/session/session.c) sees only this. */
#ifndef DG_MASTER_IFACE_IMPL_H
#define DG_MASTER_IFACE_IMPL_H

#include "distgraph/session.h"
#include "distgraph/trace.h"

typedef struct master_iface master_iface;

// A master for g at target: NULL, "" or "local": a local master over this process's devices;
// "dg://host:port" of a server of this process: its master; any other "dg://host:port": the
// master service there. Borrows g until master_iface_free. Returns: new, caller frees with
// master_iface_free(); NULL with st set (INVALID_ARGUMENT for another kind of target).
master_iface *master_iface_open(dg_graph *g, const char *target, const dg_session_options *opts, dg_status *st);
// One step; arguments already checked against the graph (master_check_args). As
// dg_session_run; trace (may be NULL) gets the step's events.
bool master_iface_run(master_iface *m, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                      const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                      int n_targets, dg_step_trace *trace, dg_status *st);
// RESET through the master at target ("dg://host:port"): clears the task's variables and
// shared objects and closes its master sessions (dg_session_reset).
bool master_iface_reset(const char *target, const dg_session_options *opts, dg_status *st);
// Closes the master's session (it frees what it registered on the tasks) and frees m.
void master_iface_free(master_iface **m);

#endif
