/* Server internals the master side of a session uses. */
#ifndef DG_SERVER_IMPL_H
#define DG_SERVER_IMPL_H

#include "distgraph/server.h"
#include "exec_impl.h"
#include "transport_impl.h"

// The server in this process whose target is `target` ("dg://host:port"), or NULL.
dg_server *rt_server_find(const char *target);
rt_transport *rt_server_transport(dg_server *s);
exec_resources *rt_server_resources(dg_server *s);
exec_rendezvous *rt_server_rendezvous(dg_server *s);
exec_pool *rt_server_pool(dg_server *s);
const dg_cluster *rt_server_cluster(dg_server *s);
int64_t rt_server_timeout_ms(dg_server *s);
// "tcp://host:port" of a task named by a device or task name, or NULL (st set).
char *rt_server_task_endpoint(dg_server *s, const char *device, dg_status *st);
// Adds this task's devices to h's names, as LIST_DEVICES answers: CPU:0, then each
// accelerator (exec_local_device_names).
void rt_server_add_devices(dg_server *s, rt_header *h);
// The task part of a device name ("/job:ps/replica:0/task:0"), into buf.
bool rt_task_of_device(const char *device, char *buf, size_t cap);
// This task's devices, as LIST_DEVICES answers. Returns: new array of new strings (*n),
// free with dg_device_list_free().
char **rt_server_device_list(dg_server *s, int *n);
// Replies to a request unless the server's transport is already gone. Consume peer and r.
void rt_server_reply(dg_server *s, rt_peer *peer, uint64_t id, rt_header *r, dg_tensor *const *ts, int n);
void rt_server_reply_error(dg_server *s, rt_peer *peer, uint64_t id, const dg_status *st);
bool rt_server_quiet(dg_server *s);
// A step id no other master uses: random high bits, a counter below.
int64_t rt_new_step_id(void);

#endif
