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

// An rt_service_start (server_impl.h): the master service of the task env describes, its lease
// and threads from the server's options (client_lease_ms, master_threads). It answers CREATE_SESSION ..
// TAKE_ANSWER and adds master_sessions, local_channels and local_channel_steps to
// SERVER_STATUS.
bool master_service_start(const rt_task_env *env, rt_service *out, dg_status *st);

#endif
