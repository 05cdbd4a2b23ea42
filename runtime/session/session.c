/* Sessions (distgraph/session.h): a thin front over a master (master_iface_impl.h): "local"
 * and a server in this process get an in-process master; any other "dg://host:port" gets the
 * master service of that task through the master client. */
#include <stdlib.h>
#include <string.h>

#include "distgraph/session.h"
#include "exec_cpu_impl.h"
#include "master_iface_impl.h"
#include "master_impl.h"
#include "step_trace_impl.h"

struct dg_session {
    dg_graph *graph;
    master_iface *master;   // in this process or in another
};

const char *dg_cpu_summary(void) { return exec_cpu_summary(); }

dg_session *dg_session_new(dg_graph *g, const char *target, const dg_session_options *opts, dg_status *st) {
    dg_status_reset(st);
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session: graph is NULL");
        return NULL;
    }
    dg_session *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    s->graph = g;
    if (!(s->master = master_iface_open(g, target, opts, st))) {
        free(s);
        return NULL;
    }
    return s;
}

void dg_session_free(dg_session **sp) {
    if (!sp || !*sp) return;
    master_iface_free(&(*sp)->master);
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
    bool ok = master_iface_run(s->master, feeds, feed_values, n_feeds, fetches, fetched, n_fetches, targets,
                               n_targets, trace, st);
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
    return master_iface_reset(target, opts, st);
}
