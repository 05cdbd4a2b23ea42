/* The master service of a task: sessions of clients in other processes (docs/PROTOCOL.md,
 * "The master service"). A client creates a session with its graph (CREATE_SESSION), sends
 * the graph again when it has grown (EXTEND_SESSION), runs steps with feeds and fetches in the
 * message (RUN_STEP) and closes it (CLOSE_SESSION); meanwhile it sends a KEEPALIVE every
 * second. Each remote session is a master session (master_impl.h) of this task's cluster, so
 * variables live on the tasks and outlive it. A session whose client falls silent for the
 * lease is closed: its running steps are aborted on every task and its partitions
 * deregistered. Steps run on the service's own threads, never on the I/O thread. */
#ifndef DG_MASTER_SERVICE_IMPL_H
#define DG_MASTER_SERVICE_IMPL_H

#include "server_impl.h"

typedef struct master_service master_service;

// Returns: new, caller frees with master_service_free(); NULL with st set.
master_service *master_service_new(dg_server *server, int64_t lease_ms, int n_threads, dg_status *st);
// Closes every session (aborting running steps) and waits for the service's threads. The
// server's transport must still be up.
void master_service_free(master_service **ms);
// A request for the master service (CREATE_SESSION .. KEEPALIVE, RESET). Runs on the I/O
// thread; consumes peer, h and the tensors.
void master_service_handle(master_service *ms, rt_peer *peer, rt_header *h, dg_tensor **ts, int n);
int64_t master_service_num_sessions(master_service *ms);
// Local channels open now, and steps run through them since the start (SERVER_STATUS).
int64_t master_service_num_channels(master_service *ms);
int64_t master_service_channel_steps(master_service *ms);

#endif
