/* Sessions (distgraph/session.h): a thin front over a master (master_iface_impl.h): "local"
 * and a server in this process get an in-process master; any other "dg://host:port" gets the
 * master service of that task through the master client. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/session.h"
#include "exec_cpu_impl.h"
#include "graph_impl.h"
#include "master_iface_impl.h"
#include "master_impl.h"
#include "step_trace_impl.h"

struct dg_session {
    dg_graph *graph;
    master_iface *master;   // in this process or in another
    // opts.mixed_precision, copied (its strings owned): the graph is rewritten when the session
    // is made and, for nodes added since, before a step.
    bool mixed;
    dg_mixed_precision_options mp;
    pthread_mutex_t mp_mu;
};

static char **mp_field(dg_mixed_precision_options *o, int i) {
    const char **f[] = {&o->allow_add, &o->allow_remove, &o->infer_add, &o->infer_remove,
                        &o->clear_add, &o->clear_remove, &o->deny_add, &o->deny_remove};
    return i < 8 ? (char **)f[i] : NULL;
}

static void mp_clear(dg_session *s) {
    for (int i = 0; i < 8; i++) free(*mp_field(&s->mp, i));
    if (s->mixed) pthread_mutex_destroy(&s->mp_mu);
    s->mixed = false;
}

// The rewrite of what the graph gained since the last one; each one that converts nodes says
// so on standard error.
static bool mp_rewrite(dg_session *s, dg_status *st) {
    pthread_mutex_lock(&s->mp_mu);
    bool ok = true;
    if (graph_rewritten(s->graph) < dg_graph_num_nodes(s->graph)) {
        dg_mixed_precision_report r;
        ok = dg_graph_rewrite_mixed_precision(s->graph, &s->mp, &r, st);
        if (ok && r.nodes_converted > 0)
            fprintf(stderr, "distgraph: mixed precision: %d nodes compute in %s, %d casts added\n",
                    r.nodes_converted, dg_dtype_name(s->mp.dtype), r.casts_added);
        if (!ok) dg_status_prepend(st, "session");
    }
    pthread_mutex_unlock(&s->mp_mu);
    return ok;
}

// A float32 feed of a value the rewrite made 16-bit, rounded to that dtype (to nearest, ties
// to even). Returns: new, or NULL with st set.
static dg_tensor *round_feed(const dg_tensor *x, dg_dtype to, dg_status *st) {
    dg_tensor *y = dg_tensor_new(to, *dg_tensor_shape(x), st);
    if (!y) return NULL;
    const float *src = dg_tensor_f32(x);
    uint16_t *dst = dg_tensor_data(y);
    int64_t n = dg_tensor_num_elements(x);
    for (int64_t i = 0; i < n; i++)
        dst[i] = to == DG_BFLOAT16 ? dg_float_to_bfloat16(src[i]) : dg_float_to_float16(src[i]);
    return y;
}

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
    if (opts && opts->mixed_precision) {
        s->mixed = true;
        pthread_mutex_init(&s->mp_mu, NULL);
        s->mp = *opts->mixed_precision;
        for (int i = 0; i < 8; i++) {
            char **f = mp_field(&s->mp, i);
            if (*f && !(*f = strdup(*f))) abort();
        }
        if (!mp_rewrite(s, st)) {
            mp_clear(s);
            free(s);
            return NULL;
        }
    }
    if (!(s->master = master_iface_open(g, target, opts, st))) {
        mp_clear(s);
        free(s);
        return NULL;
    }
    return s;
}

void dg_session_free(dg_session **sp) {
    if (!sp || !*sp) return;
    master_iface_free(&(*sp)->master);
    mp_clear(*sp);
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
    // Under mixed precision a fetch of a value the rewrite made 16-bit reads its cast back (made
    // by the rewrite: nothing changes the graph here), and a float32 feed of such a value is
    // rounded to its dtype.
    dg_output *mapped = NULL;
    dg_tensor **fed = NULL;
    if (s->mixed) {
        if (!mp_rewrite(s, st)) return false;
        for (int i = 0; i < n_fetches; i++) {
            if (!fetches[i].node || fetches[i].node->mixed != GRAPH_MIXED_LOW) continue;
            if (!mapped) {
                if (!(mapped = malloc((size_t)n_fetches * sizeof *mapped))) abort();
                memcpy(mapped, fetches, (size_t)n_fetches * sizeof *mapped);
            }
            mapped[i] = graph_mixed_precision_fetch(s->graph, fetches[i]);
        }
        if (mapped) fetches = mapped;
        for (int i = 0; i < n_feeds; i++) {
            dg_dtype want = feeds[i].node ? dg_output_dtype(feeds[i]) : DG_INVALID_DTYPE;
            if (!feeds[i].node || feeds[i].node->mixed != GRAPH_MIXED_LOW || !dg_dtype_is_float16_family(want) ||
                !feed_values[i] || dg_tensor_dtype(feed_values[i]) != DG_FLOAT32)
                continue;
            if (!fed && !(fed = calloc((size_t)n_feeds, sizeof *fed))) abort();
            if (!(fed[i] = round_feed(feed_values[i], want, st))) break;
        }
        if (fed)
            for (int i = 0; i < n_feeds; i++)
                if (!fed[i]) fed[i] = dg_tensor_ref(feed_values[i]);
    }
    bool ok = dg_status_ok(st) &&
              master_check_args(s->graph, feeds, fed ? fed : feed_values, n_feeds, fetches, n_fetches, targets,
                                n_targets, st);
    dg_step_trace *trace = ok && ro && ro->trace ? step_trace_new(exec_trace_now_ns()) : NULL;
    ok = ok && master_iface_run(s->master, feeds, fed ? fed : feed_values, n_feeds, fetches, fetched, n_fetches,
                                targets, n_targets, trace, st);
    free(mapped);
    for (int i = 0; fed && i < n_feeds; i++) dg_tensor_unref(fed[i]);
    free(fed);
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
