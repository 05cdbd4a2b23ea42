/* The server room: a task's server core (its transport, rendezvous, resources, service
 * threads, registered graphs and the worker service) and what the rooms above use of it. The
 * server answers messages through a dispatch table (message type -> service) that each
 * service enters itself into when the server is made (rt_server_new): the worker service of
 * this file, and the master service of runtime/master/ (the public dg_server_new, in
 * runtime/master/task.c, makes a server with it). */
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
// A service of a task's server: the message types it answers and its handler.
typedef struct rt_service {
    const char *name;
    const rt_type *types;
    int n_types;
    // Runs on the transport's I/O thread; consumes peer, h and the tensors (rt_transport's
    // handler contract): it answers, or hands them to its own threads.
    void (*handle)(void *ctx, rt_peer *peer, rt_header *h, dg_tensor **ts, int n);
    // Adds its "name=value" counters to a SERVER_STATUS answer; NULL: none.
    void (*add_counters)(void *ctx, rt_header *answer);
    // At dg_server_free, before its running steps are waited for and while the transport still
    // answers; frees ctx. NULL: nothing to free.
    void (*close)(void *ctx);
    void *ctx;
} rt_service;

// Makes a service of server s (its options, cluster and transport accessors are usable; it
// does not listen yet). false with st set.
typedef bool (*rt_service_start)(dg_server *s, rt_service *out, dg_status *st);

#define RT_SERVER_MAX_SERVICES 8

// A server with the worker service and n_services more (at most RT_SERVER_MAX_SERVICES - 1),
// entered in its dispatch table before it listens. Two services claiming one message type
// is an INTERNAL error. Returns: new, free with dg_server_free(); NULL with st set.
dg_server *rt_server_new(const dg_cluster *c, const char *job, int task, const dg_server_options *opts,
                         const rt_service_start *services, int n_services, dg_status *st);
// The options the server was made with (defaults filled in).
const dg_server_options *rt_server_options(dg_server *s);

// A step id no other master uses: random high bits, a counter below.
int64_t rt_new_step_id(void);

#endif
