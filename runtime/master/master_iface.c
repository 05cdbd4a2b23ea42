/* The two masters a session may have behind one interface (master_iface_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "master_client_impl.h"
#include "master_iface_impl.h"
#include "master_impl.h"

struct master_iface {
    master_session *in_process;   // local, or the master of a server in this process
    master_client *remote;        // a master in another process
};

master_iface *master_iface_open(dg_graph *g, const char *target, const dg_session_options *opts, dg_status *st) {
    bool local = !target || !*target || strcmp(target, "local") == 0;
    if (!local && strncmp(target, "dg://", 5) != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "session target \"%s\": expected \"local\" or \"dg://host:port\"",
                       target);
        return NULL;
    }
    master_iface *m = calloc(1, sizeof *m);
    if (!m) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    dg_server *server = local ? NULL : rt_server_find(target);
    if (local || server) m->in_process = master_session_new(g, server ? rt_server_env(server) : NULL, opts, st);
    else m->remote = master_client_new(g, target, opts, st);
    if (!m->in_process && !m->remote) {
        free(m);
        return NULL;
    }
    return m;
}

bool master_iface_run(master_iface *m, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                      const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                      int n_targets, dg_step_trace *trace, dg_status *st) {
    if (m->in_process)
        return master_session_run(m->in_process, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, targets,
                                  n_targets, trace, st);
    return master_client_run(m->remote, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, targets, n_targets,
                             trace, st);
}

bool master_iface_reset(const char *target, const dg_session_options *opts, dg_status *st) {
    return master_client_reset(target, opts, st);
}

void master_iface_free(master_iface **mp) {
    if (!mp || !*mp) return;
    master_session_free(&(*mp)->in_process);
    master_client_free(&(*mp)->remote);
    free(*mp);
    *mp = NULL;
}
