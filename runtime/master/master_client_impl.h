/* The master client: a session whose master is the master service of a task in another
 * process (master_service_impl.h). It owns a client-only transport (no port of its own),
 * sends the graph when the session is created and again when it has grown, runs steps with
 * their feeds and fetches in the messages, and keeps the session alive with a KEEPALIVE every
 * second from its own thread. */
#ifndef DG_MASTER_CLIENT_IMPL_H
#define DG_MASTER_CLIENT_IMPL_H

#include "distgraph/server.h"
#include "distgraph/session.h"
#include "distgraph/trace.h"

typedef struct master_client master_client;

// target: "dg://host:port". Waits for the master as opts->wait_for_tasks_ms says. Borrows g
// until master_client_free. Returns: new, caller frees with master_client_free(); NULL with
// st set.
master_client *master_client_new(dg_graph *g, const char *target, const dg_session_options *opts, dg_status *st);
// Closes the session on the master (which frees what it registered) and frees.
void master_client_free(master_client **c);
// One step; arguments already checked against the graph. As dg_session_run; trace as
// master_session_run's (the master's trace comes back with the answer).
bool master_client_run(master_client *c, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                       const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                       int n_targets, dg_step_trace *trace, dg_status *st);
// RESET through the master at target.
bool master_client_reset(const char *target, const dg_session_options *opts, dg_status *st);
// (dg_server_query_stats, the SERVER_STATUS of a task, is implemented here too.)

#endif
