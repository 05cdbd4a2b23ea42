/* Sessions (distgraph/session.h): a thin front over the master. "local" and a server in
 * this process get an in-process master (master_impl.h); any other "dg://host:port" gets
 * the master service of that task through the master client (master_client_impl.h). */
#include <stdlib.h>
#include <string.h>

#include "distgraph/session.h"
#include "exec_impl.h"
#include "master_client_impl.h"
#include "master_impl.h"
#include "server_impl.h"
#include "step_trace_impl.h"

struct dg_session {
    dg_graph *graph;
    master_session *master;   // local, or the master of a server in this process
    master_client *remote;    // a master in another process
};

const char *dg_cpu_summary(void) { return exec_cpu_summary(); }

dg_session *dg_session_new(dg_graph *g, const char *target, const dg_session_options *opts, dg_status *st) {
    dg_status_reset(st);
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session: graph is NULL");
        return NULL;
    }
    bool local = !target || !*target || strcmp(target, "local") == 0;
    if (!local && strncmp(target, "dg://", 5) != 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "session target \"%s\": expected \"local\" or \"dg://host:port\"",
                       target);
        return NULL;
    }
    dg_session *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    s->graph = g;
    dg_server *server = local ? NULL : rt_server_find(target);
    if (local || server) s->master = master_session_new(g, server, opts, st);
    else s->remote = master_client_new(g, target, opts, st);
    if (!s->master && !s->remote) {
        free(s);
        return NULL;
    }
    return s;
}

void dg_session_free(dg_session **sp) {
    if (!sp || !*sp) return;
    master_session_free(&(*sp)->master);
    master_client_free(&(*sp)->remote);
    free(*sp);
    *sp = NULL;
}

bool dg_session_run(dg_session *s, const dg_output *feeds, dg_tensor *const *feed_values, int n_feeds,
                    const dg_output *fetches, dg_tensor **fetched, int n_fetches, dg_node *const *targets,
                    int n_targets, dg_status *st) {
    return dg_session_run_with_options(s, NULL, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, targets,
                                       n_targets, NULL, st);
}

bool dg_session_run_with_options(dg_session *s, const dg_run_options *ro, const dg_output *feeds,
                                 dg_tensor *const *feed_values, int n_feeds, const dg_output *fetches,
                                 dg_tensor **fetched, int n_fetches, dg_node *const *targets, int n_targets,
                                 dg_step_trace **trace_out, dg_status *st) {
    dg_status_reset(st);
    if (trace_out) *trace_out = NULL;
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session is NULL");
        return false;
    }
    if (n_feeds < 0 || n_fetches < 0 || n_targets < 0 || (n_feeds && (!feeds || !feed_values)) ||
        (n_fetches && (!fetches || !fetched)) || (n_targets && !targets)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session run: a count is negative or an array is NULL");
        return false;
    }
    if (!master_check_args(s->graph, feeds, feed_values, n_feeds, fetches, n_fetches, targets, n_targets, st))
        return false;
    dg_step_trace *trace = ro && ro->trace ? step_trace_new(exec_trace_now_ns()) : NULL;
    bool ok = s->master ? master_session_run(s->master, feeds, feed_values, n_feeds, fetches, fetched, n_fetches,
                                             targets, n_targets, trace, st)
                        : master_client_run(s->remote, feeds, feed_values, n_feeds, fetches, fetched, n_fetches,
                                            targets, n_targets, trace, st);
    if (trace) {
        step_trace_finish(trace, exec_trace_now_ns());
        if (trace_out) *trace_out = trace;
        else dg_step_trace_free(&trace);
    }
    return ok;
}

bool dg_session_run_target(dg_session *s, dg_node *target, dg_status *st) {
    dg_status_reset(st);
    if (!target) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "run_target: target is NULL (did building it fail?)");
        return false;
    }
    return dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &target, 1, st);
}

bool dg_session_reset(const char *target, const dg_session_options *opts, dg_status *st) {
    dg_status_reset(st);
    return master_client_reset(target, opts, st);
}
