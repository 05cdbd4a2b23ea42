/* The server room: a task's server core (its transport, rendezvous, resources, service
 * threads, registered graphs and the worker service) and what the rooms above use of it. The
 * server answers messages through a dispatch table (message type -> service) that each
 * service enters itself into when the server is made (rt_server_new): the worker service of
 * this file, and the master service of runtime/master/ (the public dg_server_new, in
 * runtime/master/task.c, makes a server with it). */
#ifndef DG_SERVER_IMPL_H
#define DG_SERVER_IMPL_H

#include "distgraph/server.h"
#include "exec_pool_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_resources_impl.h"
#include "transport_impl.h"

// What a service, or a master running in this task, needs of its task (TensorFlow's
// WorkerEnv/MasterEnv): filled by the server when it is made; transport is set before the
// server answers its first message and cleared when it is freed.
typedef struct rt_task_env {
    dg_server *server;               // for rt_server_reply and rt_server_reply_error
    const char *task_name;           // "/job:ps/replica:0/task:0"
    const dg_cluster *cluster;
    rt_transport *transport;
    exec_resources *resources;       // variables and shared objects, by name
    exec_rendezvous *rendezvous;
    exec_pool *pool;                 // the worker service's threads
    int64_t rpc_timeout_ms;          // deadline of a call to another task
    bool quiet;                      // no log lines
    const dg_server_options *options;
} rt_task_env;

// The server in this process whose target is `target` ("dg://host:port"), or NULL.
dg_server *rt_server_find(const char *target);
// Its task environment, valid until dg_server_free().
const rt_task_env *rt_server_env(dg_server *s);
// "tcp://host:port" of a task of env's cluster named by a device or task name, or NULL (st set).
char *rt_task_endpoint(const rt_task_env *env, const char *device, dg_status *st);
// Adds this task's devices to h's names, as LIST_DEVICES answers: CPU:0, then each
// accelerator (exec_local_device_names).
void rt_server_add_devices(dg_server *s, rt_header *h);
// The task part of a device name ("/job:ps/replica:0/task:0"), into buf.
bool rt_task_of_device(const char *device, char *buf, size_t cap);
// The task's devices, as LIST_DEVICES answers. Returns: new array of new strings (*n),
// free with dg_device_list_free().
char **rt_task_device_list(const rt_task_env *env, int *n);
// Replies to a request unless the server's transport is already gone. Consume peer and r.
void rt_server_reply(dg_server *s, rt_peer *peer, uint64_t id, rt_header *r, dg_tensor *const *ts, int n);
void rt_server_reply_error(dg_server *s, rt_peer *peer, uint64_t id, const dg_status *st);
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

// Makes a service of the task env describes (its transport is not up yet: the service keeps
// env, which stays valid, and reads the transport when it needs it). false with st set.
typedef bool (*rt_service_start)(const rt_task_env *env, rt_service *out, dg_status *st);

#define RT_SERVER_MAX_SERVICES 8

// A server with the worker service and n_services more (at most RT_SERVER_MAX_SERVICES - 1),
// entered in its dispatch table before it listens. Two services claiming one message type
// is an INTERNAL error. Returns: new, free with dg_server_free(); NULL with st set.
dg_server *rt_server_new(const dg_cluster *c, const char *job, int task, const dg_server_options *opts,
                         const rt_service_start *services, int n_services, dg_status *st);

// A step id no other master uses: random high bits, a counter below.
int64_t rt_new_step_id(void);

#endif
