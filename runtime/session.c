/* The local session: prunes the graph to what a run needs, compiles it once per signature
 * and runs it on this process's CPU device. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "distgraph/session.h"
#include "exec_impl.h"
#include "graph_impl.h"

typedef struct compiled {
    char *key;
    exec_graph *eg;
} compiled;

struct dg_session {
    dg_graph *graph;
    dg_session_options opts;
    exec_resources *rm;
    exec_pool *pool;
    pthread_mutex_t mu;
    compiled *cache;
    int n_cache, cap_cache;
    int64_t next_step_id;
};

void exec_cpu_set_threads(int n);

dg_session_options dg_session_options_default(void) {
    dg_session_options o;
    memset(&o, 0, sizeof o);
    o.allow_soft_placement = true;
    return o;
}

dg_session *dg_session_new(dg_graph *g, const char *target, const dg_session_options *opts,
                           dg_status *st) {
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session: graph is NULL");
        return NULL;
    }
    if (target && *target && strcmp(target, "local") != 0) {
        dg_status_setf(st, DG_UNIMPLEMENTED, "session target \"%s\": only \"local\" is supported "
                       "by this build", target);
        return NULL;
    }
    dg_session *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    s->graph = g;
    s->opts = opts ? *opts : dg_session_options_default();
    pthread_mutex_init(&s->mu, NULL);
    s->rm = exec_resources_new();
    int inter = s->opts.inter_op_threads;
    if (inter <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        inter = n > 0 ? (int)n : 1;
    }
    if (inter > 1 && !(s->pool = exec_pool_new(inter - 1, st))) {
        dg_session_free(&s);
        return NULL;
    }
    exec_cpu_set_threads(s->opts.intra_op_threads > 0 ? s->opts.intra_op_threads : 1);
    if (!s->rm) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        dg_session_free(&s);
        return NULL;
    }
    return s;
}

void dg_session_free(dg_session **sp) {
    if (!sp || !*sp) return;
    dg_session *s = *sp;
    for (int i = 0; i < s->n_cache; i++) {
        free(s->cache[i].key);
        exec_graph_free(&s->cache[i].eg);
    }
    free(s->cache);
    exec_pool_free(&s->pool);
    exec_resources_free(&s->rm);
    pthread_mutex_destroy(&s->mu);
    free(s);
    *sp = NULL;
}

static char *signature(const dg_output *feeds, int n_feeds, const dg_output *fetches, int n_fetches,
                       dg_node *const *targets, int n_targets) {
    size_t cap = 64, len = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    buf[0] = 0;
    for (int part = 0; part < 3; part++) {
        int n = part == 0 ? n_feeds : part == 1 ? n_fetches : n_targets;
        for (int i = 0; i < n; i++) {
            const char *name;
            int idx = 0;
            if (part == 2) {
                name = targets[i]->name;
            } else {
                dg_output o = part == 0 ? feeds[i] : fetches[i];
                name = o.node->name;
                idx = o.index;
            }
            size_t need = strlen(name) + 24;
            if (len + need >= cap) {
                cap = (len + need) * 2;
                char *nb = realloc(buf, cap);
                if (!nb) {
                    free(buf);
                    return NULL;
                }
                buf = nb;
            }
            len += (size_t)snprintf(buf + len, cap - len, "%c%s:%d,", "FOT"[part], name, idx);
        }
    }
    return buf;
}

static bool is_fed(const dg_output *feeds, int n_feeds, dg_node *n, int index) {
    for (int f = 0; f < n_feeds; f++)
        if (feeds[f].node == n && feeds[f].index == index) return true;
    return false;
}

// Nodes needed for the fetches and targets, stopping at fed outputs.
static dg_node **prune(dg_graph *g, const dg_output *feeds, int n_feeds, const dg_output *fetches,
                       int n_fetches, dg_node *const *targets, int n_targets, int *n_out) {
    int n_nodes = dg_graph_num_nodes(g);
    unsigned char *seen = calloc((size_t)n_nodes + 1, 1);
    dg_node **stack = malloc(((size_t)n_nodes + 1) * sizeof *stack);
    if (!seen || !stack) abort();
    int top = 0;
    for (int i = 0; i < n_fetches; i++) {
        dg_output o = fetches[i];
        if (is_fed(feeds, n_feeds, o.node, o.index) || seen[o.node->id]) continue;
        seen[o.node->id] = 1;
        stack[top++] = o.node;
    }
    for (int i = 0; i < n_targets; i++)
        if (!seen[targets[i]->id]) {
            seen[targets[i]->id] = 1;
            stack[top++] = targets[i];
        }
    while (top > 0) {
        dg_node *n = stack[--top];
        for (int k = 0; k < n->n_inputs; k++) {
            dg_output in = n->inputs[k];
            if (is_fed(feeds, n_feeds, in.node, in.index) || seen[in.node->id]) continue;
            seen[in.node->id] = 1;
            stack[top++] = in.node;
        }
        for (int k = 0; k < n->n_ctrl; k++)
            if (!seen[n->ctrl_inputs[k]->id]) {
                seen[n->ctrl_inputs[k]->id] = 1;
                stack[top++] = n->ctrl_inputs[k];
            }
    }
    int k = 0;
    for (int i = 0; i < n_nodes; i++)
        if (seen[i]) stack[k++] = dg_graph_node(g, i);
    free(seen);
    *n_out = k;
    return stack;
}

static bool check_args(dg_session *s, const dg_output *feeds, dg_tensor *const *feed_values,
                       int n_feeds, const dg_output *fetches, int n_fetches,
                       dg_node *const *targets, int n_targets, dg_status *st) {
    if (!dg_graph_check(s->graph, st)) {
        dg_status_prepend(st, "the graph has an error from building it");
        return false;
    }
    char a[128], b[128];
    for (int i = 0; i < n_feeds; i++) {
        dg_output o = feeds[i];
        if (!o.node || o.node->graph != s->graph || o.index < 0 || o.index >= o.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed %d is not an output of this session's graph", i);
            return false;
        }
        const dg_tensor *t = feed_values[i];
        if (!t) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed %d (\"%s\"): value is NULL", i, o.node->name);
            return false;
        }
        dg_dtype want = o.node->out_dtypes[o.index];
        dg_shape ws = o.node->out_shapes[o.index];
        if (t->dtype != want) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed for \"%s:%d\": expected %s, got %s",
                           o.node->name, o.index, dg_dtype_name(want), dg_dtype_name(t->dtype));
            return false;
        }
        if (!dg_shape_compatible(&ws, &t->shape)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "feed for \"%s:%d\": expected shape %s, got %s",
                           o.node->name, o.index, dg_shape_str(&ws, a, sizeof a),
                           dg_shape_str(&t->shape, b, sizeof b));
            return false;
        }
        for (int j = 0; j < i; j++)
            if (feeds[j].node == o.node && feeds[j].index == o.index) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "\"%s:%d\" is fed twice", o.node->name, o.index);
                return false;
            }
    }
    for (int i = 0; i < n_fetches; i++) {
        dg_output o = fetches[i];
        if (!o.node || o.node->graph != s->graph || o.index < 0 || o.index >= o.node->n_outputs) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "fetch %d is not an output of this session's graph "
                           "(a null output from a failed builder call?)", i);
            return false;
        }
    }
    for (int i = 0; i < n_targets; i++)
        if (!targets[i] || targets[i]->graph != s->graph) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "target %d is not a node of this session's graph", i);
            return false;
        }
    return true;
}

static exec_graph *lookup_or_compile(dg_session *s, const dg_output *feeds, int n_feeds,
                                     const dg_output *fetches, int n_fetches,
                                     dg_node *const *targets, int n_targets, dg_status *st) {
    char *key = signature(feeds, n_feeds, fetches, n_fetches, targets, n_targets);
    if (!key) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "session: out of memory");
        return NULL;
    }
    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n_cache; i++)
        if (strcmp(s->cache[i].key, key) == 0) {
            exec_graph *eg = s->cache[i].eg;
            pthread_mutex_unlock(&s->mu);
            free(key);
            return eg;
        }
    int n_run;
    dg_node **run = prune(s->graph, feeds, n_feeds, fetches, n_fetches, targets, n_targets, &n_run);
    exec_env env = {s->rm, "/job:localhost/replica:0/task:0/device:CPU:0",
                    s->opts.intra_op_threads};
    exec_graph *eg = exec_graph_new(run, n_run, feeds, n_feeds, fetches, n_fetches, &env, s->pool, st);
    free(run);
    if (eg) {
        if (s->n_cache == s->cap_cache) {
            s->cap_cache = s->cap_cache ? s->cap_cache * 2 : 8;
            compiled *nc = realloc(s->cache, (size_t)s->cap_cache * sizeof *nc);
            if (!nc) abort();
            s->cache = nc;
        }
        s->cache[s->n_cache].key = key;
        s->cache[s->n_cache].eg = eg;
        s->n_cache++;
        key = NULL;
    }
    pthread_mutex_unlock(&s->mu);
    free(key);
    return eg;
}

bool dg_session_run(dg_session *s, const dg_output *feeds, dg_tensor *const *feed_values,
                    int n_feeds, const dg_output *fetches, dg_tensor **fetched, int n_fetches,
                    dg_node *const *targets, int n_targets, dg_status *st) {
    if (!s) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session is NULL");
        return false;
    }
    if (n_feeds < 0 || n_fetches < 0 || n_targets < 0 || (n_feeds && (!feeds || !feed_values)) ||
        (n_fetches && (!fetches || !fetched)) || (n_targets && !targets)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "session run: a count is negative or an array is NULL");
        return false;
    }
    if (!check_args(s, feeds, feed_values, n_feeds, fetches, n_fetches, targets, n_targets, st))
        return false;
    exec_graph *eg = lookup_or_compile(s, feeds, n_feeds, fetches, n_fetches, targets, n_targets, st);
    if (!eg) return false;
    exec_step_options o = {__atomic_add_fetch(&s->next_step_id, 1, __ATOMIC_RELAXED), NULL, 0};
    return exec_graph_run(eg, feed_values, fetched, &o, st);
}

bool dg_session_run_target(dg_session *s, dg_node *target, dg_status *st) {
    if (!target) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "run_target: target is NULL (did building it fail?)");
        return false;
    }
    return dg_session_run(s, NULL, NULL, 0, NULL, NULL, 0, &target, 1, st);
}
