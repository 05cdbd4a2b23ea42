/* Hooks over a server's transport (ping.c): a PING echo and one-way pushes, for the
 * transport's tests and bench/transport_bench.c; the sync replicas chief probes its workers
 * with the PING (runtime/training/sync_replicas_hook.c). Not public: the installed headers and
 * the shared library leave them out. The task address is "host:port" as in a cluster spec
 * ("tcp://" and "dg://" prefixes are accepted). */
#ifndef DG_PING_IMPL_H
#define DG_PING_IMPL_H

#include "distgraph/server.h"

// Sends a PING carrying tensors from client's transport to the task and waits up to timeout_ms
// for the echo. Borrows tensors for the duration of the call. On success *echo (may be NULL
// to discard) is a new array of n_echo new tensors: the caller unrefs each and frees the array.
// An unreachable task is UNAVAILABLE once the deadline passes.
bool rt_server_ping(dg_server *client, const char *target_task_address, dg_tensor *const *tensors, int n,
                    int64_t timeout_ms, dg_tensor ***echo, int *n_echo, dg_status *st);
// Pushes t n_pushes times one way to the task as rendezvous values of a step that is aborted
// first (the task drops them as they arrive; tensors over 4 MiB travel in 1 MiB chunks), then
// waits for a PING, which the task answers after it has taken in every push. Borrows t.
bool rt_server_push_bench(dg_server *client, const char *target_task_address, dg_tensor *t, int n_pushes,
                          int64_t timeout_ms, dg_status *st);

#endif
