/* The graph: node storage, naming, scopes, device functions, collections and the builder
 * protocol every op builder goes through. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"
#include "graph_impl.h"
#include "status_impl.h"

typedef struct device_entry {
    char *spec;          // a device scope (owned), or NULL for a function
    dg_device_fn *fn;    // borrowed
} device_entry;

typedef struct ctrl_frame {
    dg_node **deps;
    int n;
} ctrl_frame;

typedef struct var_scope {
    char *name;   // full variable-scope path (owned)
    bool reuse;
} var_scope;

typedef struct collection {
    char *name;
    dg_node **nodes;
    int n, cap;
    graph_strmap index;   // node name -> node
} collection;

typedef struct cast_entry {
    dg_output from, to;
} cast_entry;

struct dg_graph {
    dg_node **nodes;
    int n_nodes, cap_nodes;
    graph_strmap by_name;     // node name -> node
    graph_strmap name_next;   // base name -> next suffix (intptr), keys in owned_keys
    char **owned_keys;
    int n_owned_keys, cap_owned_keys;
    graph_strmap interned;    // string -> itself; keys in interned_keys
    char **interned_keys;
    int n_interned, cap_interned;
    dg_status *status;

    char **name_scopes;       // full prefixes, "" for none
    int n_name_scopes, cap_name_scopes;
    device_entry *devices;
    int n_devices, cap_devices;
    ctrl_frame *ctrl;
    int n_ctrl, cap_ctrl;
    dg_node **coloc;
    int n_coloc, cap_coloc;
    var_scope *var_scopes;
    int n_var_scopes, cap_var_scopes;
    collection **collections;
    int n_collections, cap_collections;
    int64_t seed;
    bool has_seed;
    char *unique_last;        // last dg_graph_unique_name result
    dg_dtype mixed;           // dg_graph_set_mixed_precision; DG_INVALID_DTYPE: off
    cast_entry *casts;        // mixed precision's casts, one per (source output, dtype): graph_cast_remember
    int n_casts, cap_casts;
    int rewritten;            // dg_graph_rewrite_mixed_precision: the nodes it has seen
};

#define GROW(arr, n, cap)                                                       \
    ((n) < (cap) ? true                                                         \
                 : ((cap) = (cap) ? (cap) * 2 : 4,                              \
                    (arr) = realloc_or_keep((arr), (size_t)(cap) * sizeof *(arr)), \
                    (arr) != NULL))

static void *realloc_or_keep(void *p, size_t size) {
    void *q = realloc(p, size);
    if (!q) abort();   // out of memory while building a graph: an internal failure
    return q;
}

dg_graph *dg_graph_new(void) {
    dg_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->status = dg_status_new();
    if (!g->status) {
        free(g);
        return NULL;
    }
    return g;
}

static void free_attr_value(graph_attr *a) {
    if (a->kind == GA_STRING && !a->borrowed_value) free(a->u.s);
    if (a->kind == GA_INTS) free(a->u.ints.v);
    if (a->kind == GA_TENSOR) dg_tensor_unref(a->u.t);
}

static void node_free(dg_node *n) {
    if (!n) return;
    free(n->inputs);
    free(n->ctrl_inputs);
    if (!n->shadow) {
        free(n->name);
        for (int i = 0; i < n->n_attrs; i++) free_attr_value(&n->attrs[i]);
        free(n->attrs);
        free(n->out_dtypes);
        free(n->out_shapes);
        for (int i = 0; i < n->n_coloc; i++) free(n->coloc[i]);
        free(n->coloc);
    }
    free(n);
}

void dg_graph_free(dg_graph **gp) {
    if (!gp || !*gp) return;
    dg_graph *g = *gp;
    for (int i = 0; i < g->n_nodes; i++) node_free(g->nodes[i]);
    free(g->nodes);
    graph_strmap_clear(&g->by_name);
    graph_strmap_clear(&g->name_next);
    for (int i = 0; i < g->n_owned_keys; i++) free(g->owned_keys[i]);
    free(g->owned_keys);
    graph_strmap_clear(&g->interned);
    for (int i = 0; i < g->n_interned; i++) free(g->interned_keys[i]);
    free(g->interned_keys);
    dg_status_free(&g->status);
    for (int i = 0; i < g->n_name_scopes; i++) free(g->name_scopes[i]);
    free(g->name_scopes);
    for (int i = 0; i < g->n_devices; i++) free(g->devices[i].spec);
    free(g->devices);
    for (int i = 0; i < g->n_ctrl; i++) free(g->ctrl[i].deps);
    free(g->ctrl);
    free(g->coloc);
    for (int i = 0; i < g->n_var_scopes; i++) free(g->var_scopes[i].name);
    free(g->var_scopes);
    for (int i = 0; i < g->n_collections; i++) {
        free(g->collections[i]->name);
        free(g->collections[i]->nodes);
        graph_strmap_clear(&g->collections[i]->index);
        free(g->collections[i]);
    }
    free(g->collections);
    free(g->unique_last);
    free(g->casts);
    free(g);
    *gp = NULL;
}

const char *graph_intern(dg_graph *g, const char *str) {
    const char *v = graph_strmap_get(&g->interned, str);
    if (v) return v;
    char *copy = strdup(str);
    if (!copy) abort();
    GROW(g->interned_keys, g->n_interned, g->cap_interned);
    g->interned_keys[g->n_interned++] = copy;
    graph_strmap_put(&g->interned, copy, copy);
    return copy;
}

const dg_status *dg_graph_status(const dg_graph *g) { return g->status; }
bool dg_graph_ok(const dg_graph *g) { return dg_status_ok(g->status); }
bool dg_graph_check(const dg_graph *g, dg_status *st) {
    dg_status_reset(st);
    if (dg_status_ok(g->status)) return true;
    dg_status_copy(st, g->status);
    return false;
}

void dg_graph_set_error(dg_graph *g, dg_code code, const char *fmt, ...) {
    if (!dg_status_ok(g->status)) return;
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(g->status, code, fmt, ap);
    va_end(ap);
}

void graph_node_error(dg_graph *g, const dg_node *n, dg_code code, const char *fmt, ...) {
    if (!dg_status_ok(g->status)) return;
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    va_end(ap);
    dg_status_setf(g->status, code, "node \"%s\" (%s): %s", n && n->name ? n->name : "?",
                   n && n->op ? n->op->name : "?", msg ? msg : "");
    free(msg);
}

int dg_graph_num_nodes(const dg_graph *g) { return g->n_nodes; }
dg_node *dg_graph_node(const dg_graph *g, int i) {
    return i >= 0 && i < g->n_nodes ? g->nodes[i] : NULL;
}
dg_node *dg_graph_find(const dg_graph *g, const char *name) {
    return name ? graph_strmap_get(&g->by_name, name) : NULL;
}

dg_output dg_graph_output(const dg_graph *g, const char *name, dg_status *st) {
    dg_status_reset(st);
    dg_output o = {NULL, 0};
    if (!name) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "output name is NULL");
        return o;
    }
    char buf[512];
    snprintf(buf, sizeof buf, "%s", name);
    int index = 0;
    char *colon = strrchr(buf, ':');
    if (colon && colon[1]) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (!*end && v >= 0 && v < 1000000) {
            *colon = 0;
            index = (int)v;
        }
    }
    dg_node *n = dg_graph_find(g, buf);
    if (!n) {
        dg_status_setf(st, DG_NOT_FOUND, "no node named \"%s\" in the graph", buf);
        return o;
    }
    if (index >= n->n_outputs) {
        dg_status_setf(st, DG_NOT_FOUND, "node \"%s\" (%s) has %d outputs, asked for output %d",
                       buf, n->op->name, n->n_outputs, index);
        return o;
    }
    o.node = n;
    o.index = index;
    return o;
}

char *dg_output_str(dg_output o, char *buf, size_t cap) {
    if (!o.node)
        snprintf(buf, cap, "<null>");
    else if (o.index == 0)
        snprintf(buf, cap, "%s", o.node->name);
    else
        snprintf(buf, cap, "%s:%d", o.node->name, o.index);
    return buf;
}

// ---- accessors ----
const char *dg_node_name(const dg_node *n) { return n->name; }
const char *dg_node_op_type(const dg_node *n) { return n->op->name; }
void dg_graph_clear_devices(dg_graph *g) {
    if (!g) return;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        dg_node *n = dg_graph_node(g, i);
        n->requested_device = "";
        n->assigned_device = NULL;
    }
}

const char *dg_node_requested_device(const dg_node *n) {
    return n->requested_device ? n->requested_device : "";
}
const char *dg_node_assigned_device(const dg_node *n) {
    return n->assigned_device ? n->assigned_device : "";
}
int dg_node_num_inputs(const dg_node *n) { return n->n_inputs; }
dg_output dg_node_input(const dg_node *n, int i) {
    dg_output o = {NULL, 0};
    return i >= 0 && i < n->n_inputs ? n->inputs[i] : o;
}
int dg_node_num_outputs(const dg_node *n) { return n->n_outputs; }
dg_dtype dg_node_output_dtype(const dg_node *n, int i) {
    return i >= 0 && i < n->n_outputs ? n->out_dtypes[i] : DG_INVALID_DTYPE;
}
dg_shape dg_node_output_shape(const dg_node *n, int i) {
    return i >= 0 && i < n->n_outputs ? n->out_shapes[i] : dg_shape_unknown();
}
int dg_node_num_control_inputs(const dg_node *n) { return n->n_ctrl; }
dg_node *dg_node_control_input(const dg_node *n, int i) {
    return i >= 0 && i < n->n_ctrl ? n->ctrl_inputs[i] : NULL;
}
int dg_node_num_colocations(const dg_node *n) { return n->n_coloc; }
const char *dg_node_colocation(const dg_node *n, int i) {
    return i >= 0 && i < n->n_coloc ? n->coloc[i] : NULL;
}

const graph_attr *graph_node_attr(const dg_node *n, const char *name) {
    for (int i = 0; i < n->n_attrs; i++)
        if (strcmp(n->attrs[i].name, name) == 0) return &n->attrs[i];
    return NULL;
}

#define ATTR_GETTER(fn, type, kind_, field)                           \
    bool fn(const dg_node *n, const char *name, type *out) {          \
        const graph_attr *a = graph_node_attr(n, name);               \
        if (!a || a->kind != kind_) return false;                     \
        *out = a->u.field;                                            \
        return true;                                                  \
    }
ATTR_GETTER(dg_node_attr_int, int64_t, GA_INT, i)
ATTR_GETTER(dg_node_attr_float, double, GA_FLOAT, f)
ATTR_GETTER(dg_node_attr_bool, bool, GA_BOOL, b)
ATTR_GETTER(dg_node_attr_type, dg_dtype, GA_TYPE, type)
ATTR_GETTER(dg_node_attr_shape, dg_shape, GA_SHAPE, shape)

const char *dg_node_attr_string(const dg_node *n, const char *name) {
    const graph_attr *a = graph_node_attr(n, name);
    return a && a->kind == GA_STRING ? a->u.s : NULL;
}
const int64_t *graph_node_attr_ints(const dg_node *n, const char *name, int *count) {
    const graph_attr *a = graph_node_attr(n, name);
    if (!a || a->kind != GA_INTS) {
        *count = 0;
        return NULL;
    }
    *count = a->u.ints.n;
    return a->u.ints.v;
}
const dg_tensor *dg_node_const_value(const dg_node *n) {
    if (strcmp(n->op->name, "Const") != 0) return NULL;
    const graph_attr *a = graph_node_attr(n, "value");
    return a && a->kind == GA_TENSOR ? a->u.t : NULL;
}

// ---- naming ----
static bool valid_name(const char *s) {
    const char *start = s;
    if (!*s) return false;
    if (!(isalnum((unsigned char)*s) || *s == '.' || *s == '_')) return false;
    for (; *s; s++)
        if (!(isalnum((unsigned char)*s) || *s == '_' || *s == '.' || *s == '-' || *s == '/'))
            return false;
    return !strstr(start, "//");
}

static const char *current_scope(const dg_graph *g) {
    return g->n_name_scopes ? g->name_scopes[g->n_name_scopes - 1] : "";
}

static bool name_taken(dg_graph *g, const char *name) {
    return graph_strmap_get(&g->by_name, name) || graph_strmap_get(&g->name_next, name);
}

static void mark_used(dg_graph *g, const char *name, intptr_t next) {
    char *key = strdup(name);
    if (!key) abort();
    GROW(g->owned_keys, g->n_owned_keys, g->cap_owned_keys);
    g->owned_keys[g->n_owned_keys++] = key;
    graph_strmap_put(&g->name_next, key, (void *)next);
}

// Makes scope/base unique the way TensorFlow does (base, base_1, base_2, ...).
// Returns: new heap string, caller frees.
static char *make_unique(dg_graph *g, const char *base) {
    const char *scope = current_scope(g);
    char *full = NULL;
    if (asprintf(&full, "%s%s%s", scope, *scope ? "/" : "", base) < 0) abort();
    if (!name_taken(g, full)) {
        mark_used(g, full, 1);
        return full;
    }
    intptr_t next = (intptr_t)graph_strmap_get(&g->name_next, full);
    bool known = next > 0;
    if (next < 1) next = 1;
    char *cand = NULL;
    for (;; next++) {
        free(cand);
        if (asprintf(&cand, "%s_%ld", full, (long)next) < 0) abort();
        if (!name_taken(g, cand)) break;
    }
    // Replacing keeps the stored key, so the local string is never kept by the map.
    if (known)
        graph_strmap_put(&g->name_next, full, (void *)(next + 1));
    else
        mark_used(g, full, next + 1);
    mark_used(g, cand, 1);
    free(full);
    return cand;
}

const char *dg_graph_unique_name(dg_graph *g, const char *base) {
    free(g->unique_last);
    g->unique_last = make_unique(g, base);
    return g->unique_last;
}

void dg_graph_push_name_scope(dg_graph *g, const char *name) {
    GROW(g->name_scopes, g->n_name_scopes, g->cap_name_scopes);
    char *full;
    if (!name || !*name) {
        full = strdup(current_scope(g));
    } else if (!valid_name(name)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "name scope \"%s\" is not a valid name", name);
        full = strdup(current_scope(g));
    } else {
        full = make_unique(g, name);
    }
    if (!full) abort();
    g->name_scopes[g->n_name_scopes++] = full;
}

void graph_push_absolute_scope(dg_graph *g, const char *full) {
    GROW(g->name_scopes, g->n_name_scopes, g->cap_name_scopes);
    g->name_scopes[g->n_name_scopes] = strdup(full);
    if (!g->name_scopes[g->n_name_scopes]) abort();
    g->n_name_scopes++;
}

void dg_graph_pop_name_scope(dg_graph *g) {
    if (g->n_name_scopes == 0) {
        dg_graph_set_error(g, DG_FAILED_PRECONDITION, "pop_name_scope without a matching push");
        return;
    }
    free(g->name_scopes[--g->n_name_scopes]);
}

// ---- device scopes ----
void dg_graph_push_device(dg_graph *g, const char *device) {
    GROW(g->devices, g->n_devices, g->cap_devices);
    device_entry e = {NULL, NULL};
    if (device && *device) {
        // Scopes read device strings as tf.device() does (DeviceSpec.from_string).
        dg_device_name dn;
        dg_status *st = dg_status_new();
        if (!dg_device_spec_from_string(device, &dn, st)) {
            dg_graph_set_error(g, dg_status_code(st), "device scope: %s", dg_status_message(st));
            device = "";
        }
        dg_status_free(&st);
        e.spec = strdup(device);
        if (!e.spec) abort();
    }
    // device NULL or "" is a barrier: outer scopes and functions no longer apply.
    g->devices[g->n_devices++] = e;
}

void dg_graph_pop_device(dg_graph *g) {
    if (g->n_devices == 0 || (g->devices[g->n_devices - 1].fn && !g->devices[g->n_devices - 1].spec)) {
        dg_graph_set_error(g, DG_FAILED_PRECONDITION, "pop_device without a matching push_device");
        return;
    }
    free(g->devices[--g->n_devices].spec);
}

void dg_graph_push_device_fn(dg_graph *g, dg_device_fn *fn) {
    if (!fn) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "push_device_fn: NULL device function");
        return;
    }
    GROW(g->devices, g->n_devices, g->cap_devices);
    device_entry e = {NULL, fn};
    g->devices[g->n_devices++] = e;
}

void dg_graph_pop_device_fn(dg_graph *g) {
    if (g->n_devices == 0 || !g->devices[g->n_devices - 1].fn) {
        dg_graph_set_error(g, DG_FAILED_PRECONDITION,
                           "pop_device_fn without a matching push_device_fn");
        return;
    }
    g->n_devices--;
}

void dg_device_fn_free(dg_device_fn **fn) {
    if (!fn || !*fn) return;
    if ((*fn)->free_ctx) (*fn)->free_ctx((*fn)->ctx);
    free(*fn);
    *fn = NULL;
}

// Applies device entries innermost first, each seeing the result so far (TensorFlow 1.x's
// _apply_device_functions): a scope merges its spec under the current device (the current
// device's fields win), a function returns the new device.
static bool apply_devices(dg_graph *g, dg_node *n) {
    if (g->n_devices == 0) {
        n->requested_device = graph_intern(g, "");
        return true;
    }
    char cur[DG_DEVICE_NAME_MAX] = "";
    char out[DG_DEVICE_NAME_MAX];
    dg_status *st = dg_status_new();
    bool ok = true;
    for (int i = g->n_devices - 1; i >= 0 && ok; i--) {
        device_entry *e = &g->devices[i];
        if (!e->spec && !e->fn) break;
        if (e->spec) {
            dg_device_name spec, curn;
            ok = dg_device_spec_from_string(e->spec, &spec, st) &&
                 dg_device_spec_from_string(cur, &curn, st);
            if (!ok) break;
            dg_device_name_merge_override(&spec, &curn);
            dg_device_name_str(&spec, cur, sizeof cur);
        } else {
            out[0] = 0;
            ok = e->fn->choose(e->fn->ctx, n, cur, out, sizeof out, st);
            if (!ok) break;
            if (!dg_device_name_canonicalize(out, cur, sizeof cur, st)) {
                ok = false;
                dg_status_prepend(st, "device function result");
            }
        }
    }
    if (!ok) graph_node_error(g, n, dg_status_code(st), "%s", dg_status_message(st));
    else n->requested_device = graph_intern(g, cur);
    dg_status_free(&st);
    return ok;
}

// ---- control dependencies ----
void dg_graph_push_control_deps(dg_graph *g, dg_node *const *deps, int n_deps) {
    GROW(g->ctrl, g->n_ctrl, g->cap_ctrl);
    ctrl_frame f = {NULL, 0};
    if (n_deps > 0) {
        f.deps = malloc((size_t)n_deps * sizeof *f.deps);
        if (!f.deps) abort();
        for (int i = 0; i < n_deps; i++) {
            if (!deps[i]) {
                dg_graph_set_error(g, DG_INVALID_ARGUMENT, "control dependency %d is NULL", i);
                continue;
            }
            f.deps[f.n++] = deps[i];
        }
    }
    g->ctrl[g->n_ctrl++] = f;
}

void dg_graph_pop_control_deps(dg_graph *g) {
    if (g->n_ctrl == 0) {
        dg_graph_set_error(g, DG_FAILED_PRECONDITION, "pop_control_deps without a matching push");
        return;
    }
    free(g->ctrl[--g->n_ctrl].deps);
}

void dg_node_add_control_input(dg_node *n, dg_node *dep) {
    if (!n || !dep) return;
    for (int i = 0; i < n->n_ctrl; i++)
        if (n->ctrl_inputs[i] == dep) return;
    GROW(n->ctrl_inputs, n->n_ctrl, n->cap_ctrl);
    n->ctrl_inputs[n->n_ctrl++] = dep;
}

// ---- colocation ----
void dg_graph_push_colocate_with(dg_graph *g, dg_node *op) {
    if (!op) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "colocate_with: NULL node");
        return;
    }
    GROW(g->coloc, g->n_coloc, g->cap_coloc);
    g->coloc[g->n_coloc++] = op;
}

void dg_graph_pop_colocate_with(dg_graph *g) {
    if (g->n_coloc == 0) {
        dg_graph_set_error(g, DG_FAILED_PRECONDITION, "pop_colocate_with without a matching push");
        return;
    }
    g->n_coloc--;
}

static void add_coloc(dg_node *n, const char *name) {
    for (int i = 0; i < n->n_coloc; i++)
        if (strcmp(n->coloc[i], name) == 0) return;
    n->coloc = realloc_or_keep(n->coloc, (size_t)(n->n_coloc + 1) * sizeof *n->coloc);
    n->coloc[n->n_coloc] = strdup(name);
    if (!n->coloc[n->n_coloc]) abort();
    n->n_coloc++;
}

// ---- collections ----
static collection *find_collection(const dg_graph *g, const char *name) {
    for (int i = 0; i < g->n_collections; i++)
        if (strcmp(g->collections[i]->name, name) == 0) return g->collections[i];
    return NULL;
}

void dg_graph_add_to_collection(dg_graph *g, const char *name, dg_node *n) {
    if (!name || !n) return;
    collection *c = find_collection(g, name);
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) abort();
        c->name = strdup(name);
        GROW(g->collections, g->n_collections, g->cap_collections);
        g->collections[g->n_collections++] = c;
    }
    // Duplicates are found by name in the collection's index, so adding stays O(1).
    if (graph_strmap_get(&c->index, n->name)) return;
    graph_strmap_put(&c->index, n->name, n);
    GROW(c->nodes, c->n, c->cap);
    c->nodes[c->n++] = n;
}

int dg_graph_collection_size(const dg_graph *g, const char *name) {
    collection *c = find_collection(g, name);
    return c ? c->n : 0;
}

dg_node *dg_graph_collection_get(const dg_graph *g, const char *name, int i) {
    collection *c = find_collection(g, name);
    return c && i >= 0 && i < c->n ? c->nodes[i] : NULL;
}

// ---- variable scopes ----
void dg_graph_push_variable_scope(dg_graph *g, const char *name, bool reuse) {
    GROW(g->var_scopes, g->n_var_scopes, g->cap_var_scopes);
    const char *outer = g->n_var_scopes ? g->var_scopes[g->n_var_scopes - 1].name : "";
    bool outer_reuse = g->n_var_scopes ? g->var_scopes[g->n_var_scopes - 1].reuse : false;
    var_scope s;
    if (!name || !valid_name(name)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "variable scope \"%s\" is not a valid name",
                           name ? name : "(null)");
        name = "invalid";
    }
    if (asprintf(&s.name, "%s%s%s", outer, *outer ? "/" : "", name) < 0) abort();
    s.reuse = reuse || outer_reuse;
    g->var_scopes[g->n_var_scopes++] = s;
    dg_graph_push_name_scope(g, name);
}

void graph_push_variable_reuse(dg_graph *g) {
    GROW(g->var_scopes, g->n_var_scopes, g->cap_var_scopes);
    var_scope s = {strdup(g->n_var_scopes ? g->var_scopes[g->n_var_scopes - 1].name : ""), true};
    if (!s.name) abort();
    g->var_scopes[g->n_var_scopes++] = s;
    graph_push_absolute_scope(g, current_scope(g));
}

void dg_graph_pop_variable_scope(dg_graph *g) {
    if (g->n_var_scopes == 0) {
        dg_graph_set_error(g, DG_FAILED_PRECONDITION, "pop_variable_scope without a matching push");
        return;
    }
    free(g->var_scopes[--g->n_var_scopes].name);
    dg_graph_pop_name_scope(g);
}

const char *graph_variable_scope(const dg_graph *g, bool *reuse) {
    *reuse = g->n_var_scopes ? g->var_scopes[g->n_var_scopes - 1].reuse : false;
    return g->n_var_scopes ? g->var_scopes[g->n_var_scopes - 1].name : "";
}

void dg_graph_set_random_seed(dg_graph *g, int64_t seed) {
    g->seed = seed;
    g->has_seed = true;
}

int64_t graph_random_seed(const dg_graph *g, bool *has_seed) {
    *has_seed = g->has_seed;
    return g->seed;
}

// ---- builder protocol ----
static dg_node *node_alloc(dg_graph *g, const char *type) {
    const graph_op_def *def = graph_op_lookup(type);
    if (!def) {
        dg_graph_set_error(g, DG_NOT_FOUND, "unknown op type \"%s\"", type);
        return NULL;
    }
    dg_node *n = calloc(1, sizeof *n);
    if (!n) abort();
    n->graph = g;
    n->op = def;
    n->id = -1;
    return n;
}

dg_node *graph_begin(dg_graph *g, const char *type, const char *name) {
    if (!dg_graph_ok(g)) return NULL;
    if (name && !valid_name(name)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "\"%s\" is not a valid node name (op %s)",
                           name, type);
        return NULL;
    }
    dg_node *n = node_alloc(g, type);
    if (!n) return NULL;
    n->name = make_unique(g, name ? name : type);
    return n;
}

dg_node *graph_begin_absolute(dg_graph *g, const char *type, const char *full_name) {
    if (!dg_graph_ok(g)) return NULL;
    if (!full_name || !valid_name(full_name)) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "\"%s\" is not a valid node name (op %s)",
                           full_name ? full_name : "(null)", type);
        return NULL;
    }
    if (name_taken(g, full_name)) {
        dg_graph_set_error(g, DG_ALREADY_EXISTS, "a node named \"%s\" already exists", full_name);
        return NULL;
    }
    dg_node *n = node_alloc(g, type);
    if (!n) return NULL;
    mark_used(g, full_name, 1);
    n->name = strdup(full_name);
    if (!n->name) abort();
    return n;
}

void graph_add_input(dg_node *n, dg_output in) {
    if (!n) return;
    GROW(n->inputs, n->n_inputs, n->cap_inputs);
    n->inputs[n->n_inputs++] = in;
}

static graph_attr *attr_slot(dg_node *n, const char *name) {
    for (int i = 0; i < n->n_attrs; i++)
        if (strcmp(n->attrs[i].name, name) == 0) {
            graph_attr *a = &n->attrs[i];
            free_attr_value(a);
            a->borrowed_value = false;
            return a;
        }
    GROW(n->attrs, n->n_attrs, n->cap_attrs);
    graph_attr *a = &n->attrs[n->n_attrs++];
    memset(a, 0, sizeof *a);
    a->name = graph_intern(n->graph, name);
    return a;
}

#define ATTR_SETTER(fn, type, kind_, field)              \
    void fn(dg_node *n, const char *name, type v) {      \
        if (!n) return;                                  \
        graph_attr *a = attr_slot(n, name);              \
        a->kind = kind_;                                 \
        a->u.field = v;                                  \
    }
ATTR_SETTER(graph_set_attr_int, int64_t, GA_INT, i)
ATTR_SETTER(graph_set_attr_float, double, GA_FLOAT, f)
ATTR_SETTER(graph_set_attr_bool, bool, GA_BOOL, b)
ATTR_SETTER(graph_set_attr_type, dg_dtype, GA_TYPE, type)
ATTR_SETTER(graph_set_attr_shape, dg_shape, GA_SHAPE, shape)

void graph_set_attr_string(dg_node *n, const char *name, const char *v) {
    if (!n) return;
    graph_attr *a = attr_slot(n, name);
    a->kind = GA_STRING;
    a->u.s = strdup(v ? v : "");
    if (!a->u.s) abort();
}

void graph_set_attr_string_interned(dg_node *n, const char *name, const char *interned) {
    if (!n) return;
    graph_attr *a = attr_slot(n, name);
    a->kind = GA_STRING;
    a->u.s = (char *)interned;
    a->borrowed_value = true;
}

void graph_set_attr_ints(dg_node *n, const char *name, const int64_t *v, int count) {
    if (!n) return;
    graph_attr *a = attr_slot(n, name);
    a->kind = GA_INTS;
    a->u.ints.n = count > 0 ? count : 0;
    a->u.ints.v = malloc((size_t)(a->u.ints.n ? a->u.ints.n : 1) * sizeof(int64_t));
    if (!a->u.ints.v) abort();
    if (count > 0) memcpy(a->u.ints.v, v, (size_t)count * sizeof(int64_t));
}

void graph_set_attr_tensor(dg_node *n, const char *name, dg_tensor *t) {
    if (!n) return;
    graph_attr *a = attr_slot(n, name);
    a->kind = GA_TENSOR;
    a->u.t = dg_tensor_ref(t);
}

bool graph_set_num_outputs(dg_node *n, int count, dg_status *st) {
    free(n->out_dtypes);
    free(n->out_shapes);
    n->n_outputs = count;
    n->out_dtypes = calloc((size_t)(count ? count : 1), sizeof *n->out_dtypes);
    n->out_shapes = calloc((size_t)(count ? count : 1), sizeof *n->out_shapes);
    if (!n->out_dtypes || !n->out_shapes) abort();
    for (int i = 0; i < count; i++) n->out_shapes[i] = dg_shape_unknown();
    return true;
}

void graph_set_output(dg_node *n, int i, dg_dtype dtype, dg_shape shape) {
    if (i < 0 || i >= n->n_outputs) return;
    n->out_dtypes[i] = dtype;
    n->out_shapes[i] = shape;
}

void graph_set_assigned_device(dg_node *n, const char *device) {
    n->assigned_device = device ? graph_intern(n->graph, device) : NULL;
}

static void discard(dg_graph *g, dg_node *n) {
    (void)g;
    node_free(n);
}

dg_node *graph_finish(dg_node *n) {
    if (!n) return NULL;
    dg_graph *g = n->graph;
    if (!dg_graph_ok(g)) {
        discard(g, n);
        return NULL;
    }
    const graph_op_def *def = n->op;
    if (n->n_inputs < def->min_inputs || (def->max_inputs >= 0 && n->n_inputs > def->max_inputs)) {
        if (def->max_inputs == def->min_inputs)
            graph_node_error(g, n, DG_INVALID_ARGUMENT, "takes %d inputs, got %d", def->min_inputs,
                             n->n_inputs);
        else
            graph_node_error(g, n, DG_INVALID_ARGUMENT, "takes at least %d inputs, got %d",
                             def->min_inputs, n->n_inputs);
        discard(g, n);
        return NULL;
    }
    for (int i = 0; i < n->n_inputs; i++) {
        dg_output in = n->inputs[i];
        if (!in.node) {
            graph_node_error(g, n, DG_INVALID_ARGUMENT, "input %d is the null output (an earlier "
                             "builder call failed or the input was never created)", i);
            discard(g, n);
            return NULL;
        }
        if (in.node->graph != g) {
            graph_node_error(g, n, DG_INVALID_ARGUMENT, "input %d (\"%s\") belongs to another graph",
                             i, in.node->name);
            discard(g, n);
            return NULL;
        }
        if (in.index < 0 || in.index >= in.node->n_outputs) {
            graph_node_error(g, n, DG_INVALID_ARGUMENT, "input %d asks for output %d of \"%s\", "
                             "which has %d outputs", i, in.index, in.node->name, in.node->n_outputs);
            discard(g, n);
            return NULL;
        }
    }
    if (def->ref_inputs > 0 && strcmp(n->inputs[0].node->op->name, "VariableV2") != 0) {
        graph_node_error(g, n, DG_INVALID_ARGUMENT, "input 0 must be a variable, got \"%s\" (%s)",
                         n->inputs[0].node->name, n->inputs[0].node->op->name);
        discard(g, n);
        return NULL;
    }
    // A value the mixed-precision rewrite made 16-bit reads as it was built, float32, through
    // its cast back: a node built after the rewrite sees the graph's dtypes unchanged.
    for (int i = 0; i < n->n_inputs; i++)
        if (n->inputs[i].node->mixed == GRAPH_MIXED_LOW && dg_dtype_is_float16_family(dg_output_dtype(n->inputs[i]))) {
            dg_output c = graph_insert_cast(g, n->inputs[i], DG_FLOAT32, NULL);
            if (!c.node) {
                discard(g, n);
                return NULL;
            }
            n->inputs[i] = c;
        }
    dg_status st = DG_STATUS_INIT;
    if (def->infer && !def->infer(n, &st)) {
        graph_node_error(g, n, dg_status_code(&st), "%s", dg_status_message(&st));
        status_impl_clear(&st);
        discard(g, n);
        return NULL;
    }
    status_impl_clear(&st);
    // Control dependencies of enclosing scopes.
    for (int f = 0; f < g->n_ctrl; f++)
        for (int i = 0; i < g->ctrl[f].n; i++) {
            dg_node *dep = g->ctrl[f].deps[i];
            bool is_input = false;
            for (int j = 0; j < n->n_inputs && !is_input; j++) is_input = n->inputs[j].node == dep;
            if (!is_input) dg_node_add_control_input(n, dep);
        }
    // Devices: colocation wins over device scopes and functions, as in TensorFlow.
    if (g->n_coloc > 0) {
        for (int i = 0; i < g->n_coloc; i++) {
            dg_node *c = g->coloc[i];
            if (c->n_coloc)
                for (int j = 0; j < c->n_coloc; j++) add_coloc(n, c->coloc[j]);
            else
                add_coloc(n, c->name);
        }
        dg_node *inner = g->coloc[g->n_coloc - 1];
        n->requested_device = graph_intern(g, inner->requested_device ? inner->requested_device : "");
    } else if (!apply_devices(g, n)) {
        discard(g, n);
        return NULL;
    }
    GROW(g->nodes, g->n_nodes, g->cap_nodes);
    n->id = g->n_nodes;
    g->nodes[g->n_nodes++] = n;
    graph_strmap_put(&g->by_name, n->name, n);
    return n;
}

static dg_node *insert_node(dg_graph *g, dg_node *n) {
    GROW(g->nodes, g->n_nodes, g->cap_nodes);
    n->id = g->n_nodes;
    g->nodes[g->n_nodes++] = n;
    // by_name alone keeps the name taken; partitions need no uniquifying counters.
    graph_strmap_put(&g->by_name, n->name, n);
    return n;
}

dg_node *graph_insert_copy(dg_graph *g, const dg_node *src, const dg_output *inputs, int n_inputs) {
    if (!dg_graph_ok(g)) return NULL;
    if (graph_strmap_get(&g->by_name, src->name)) {
        dg_graph_set_error(g, DG_ALREADY_EXISTS, "a node named \"%s\" already exists", src->name);
        return NULL;
    }
    dg_node *n = calloc(1, sizeof *n);
    if (!n) abort();
    n->graph = g;
    n->op = src->op;
    n->shadow = true;
    n->name = src->name;
    n->attrs = src->attrs;
    n->n_attrs = n->cap_attrs = src->n_attrs;
    n->n_outputs = src->n_outputs;
    n->out_dtypes = src->out_dtypes;
    n->out_shapes = src->out_shapes;
    n->coloc = src->coloc;
    n->n_coloc = src->n_coloc;
    n->var_initializer = NULL;
    if (n_inputs > 0) {
        n->inputs = malloc((size_t)n_inputs * sizeof *n->inputs);
        if (!n->inputs) abort();
        memcpy(n->inputs, inputs, (size_t)n_inputs * sizeof *n->inputs);
    }
    n->n_inputs = n->cap_inputs = n_inputs;
    n->requested_device = graph_intern(g, src->requested_device ? src->requested_device : "");
    n->assigned_device = src->assigned_device ? graph_intern(g, src->assigned_device) : NULL;
    return insert_node(g, n);
}

dg_node *graph_insert_raw(dg_graph *g, const graph_op_def *def, const char *name, int n_attrs) {
    if (!dg_graph_ok(g)) return NULL;
    if (name_taken(g, name)) {
        dg_graph_set_error(g, DG_ALREADY_EXISTS, "a node named \"%s\" already exists", name);
        return NULL;
    }
    dg_node *n = calloc(1, sizeof *n);
    if (!n || !(n->name = strdup(name))) abort();
    n->graph = g;
    n->op = def;
    n->requested_device = graph_intern(g, "");
    if (n_attrs > 0) {
        n->attrs = calloc((size_t)n_attrs, sizeof *n->attrs);
        if (!n->attrs) abort();
        n->cap_attrs = n_attrs;
    }
    return insert_node(g, n);
}

// ---- mixed precision ----

bool dg_graph_set_mixed_precision(dg_graph *g, dg_dtype dtype, dg_status *st) {
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "mixed precision: graph is NULL");
        return false;
    }
    if (dtype != DG_INVALID_DTYPE && !dg_dtype_is_float16_family(dtype)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "mixed precision: %s is not bfloat16 or float16", dg_dtype_name(dtype));
        return false;
    }
    g->mixed = dtype;
    return true;
}

dg_dtype dg_graph_mixed_precision(const dg_graph *g) { return g ? g->mixed : DG_INVALID_DTYPE; }

dg_output graph_cast_lookup(const dg_graph *g, dg_output x, dg_dtype to) {
    for (int i = 0; i < g->n_casts; i++)
        if (g->casts[i].from.node == x.node && g->casts[i].from.index == x.index &&
            dg_output_dtype(g->casts[i].to) == to)
            return g->casts[i].to;
    return (dg_output){NULL, 0};
}

void graph_cast_remember(dg_graph *g, dg_output x, dg_output cast) {
    GROW(g->casts, g->n_casts, g->cap_casts);
    g->casts[g->n_casts++] = (cast_entry){x, cast};
}

int graph_rewritten(const dg_graph *g) { return g->rewritten; }

bool graph_has_builder_casts(const dg_graph *g) {
    for (int i = 0; i < g->n_casts; i++)
        if (g->casts[i].to.node->mixed != GRAPH_MIXED_CAST) return true;
    return false;
}
void graph_set_rewritten(dg_graph *g, int n) { g->rewritten = n; }

dg_output graph_insert_cast(dg_graph *g, dg_output x, dg_dtype to, const dg_node *ctrl_from) {
    dg_output c = ctrl_from ? (dg_output){NULL, 0} : graph_cast_lookup(g, x, to);
    if (c.node) c.node->mixed = GRAPH_MIXED_CAST;
    if (c.node || !dg_graph_ok(g)) return c;
    const char *what = to == DG_BFLOAT16 ? "CastToBfloat16" : to == DG_FLOAT16 ? "CastToFloat16" : "CastToFloat32";
    char *base = NULL, *name = NULL;
    if ((x.index ? asprintf(&base, "%s_%d/%s", x.node->name, x.index, what)
                 : asprintf(&base, "%s/%s", x.node->name, what)) < 0)
        abort();
    if (!name_taken(g, base)) {
        name = base;
        base = NULL;
    }
    for (int i = 1; !name; i++) {
        if (asprintf(&name, "%s_%d", base, i) < 0) abort();
        if (name_taken(g, name)) {
            free(name);
            name = NULL;
        }
    }
    free(base);
    dg_node *n = node_alloc(g, "Cast");
    if (!n) {
        free(name);
        return c;
    }
    mark_used(g, name, 1);
    n->name = name;
    graph_add_input(n, x);
    graph_set_attr_type(n, "DstT", to);
    dg_status st = DG_STATUS_INIT;
    if (!n->op->infer(n, &st)) {
        graph_node_error(g, n, dg_status_code(&st), "%s", dg_status_message(&st));
        status_impl_clear(&st);
        discard(g, n);
        return c;
    }
    status_impl_clear(&st);
    n->requested_device = x.node->requested_device ? x.node->requested_device : graph_intern(g, "");
    if (ctrl_from)
        for (int i = 0; i < ctrl_from->n_ctrl; i++) dg_node_add_control_input(n, ctrl_from->ctrl_inputs[i]);
    n->mixed = GRAPH_MIXED_CAST;
    c = (dg_output){insert_node(g, n), 0};
    if (!ctrl_from) graph_cast_remember(g, x, c);
    return c;
}

void graph_reorder_tail(dg_graph *g, int from, dg_node *const *order) {
    for (int i = from; i < g->n_nodes; i++) {
        g->nodes[i] = order[i - from];
        g->nodes[i]->id = i;
    }
}
