/* A task's server as users make it (distgraph/server.h): the server room's core with the
 * worker service (runtime/server/server.c) and this room's master service entered in its
 * dispatch table, so that clients in other processes can run sessions on any task. */
#include "master_service_impl.h"

dg_server *dg_server_new(const dg_cluster *c, const char *job, int task, const dg_server_options *opts,
                         dg_status *st) {
    static const rt_service_start services[] = {master_service_start};
    return rt_server_new(c, job, task, opts, services, 1, st);
}
