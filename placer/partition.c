/* The partitioner: one graph per device; each cross-device data edge becomes one
 * _Send/_Recv pair per (tensor, destination device), and each cross-device control edge a
 * dummy constant sent over the same way. Nodes are copied in id order (a topological order)
 * and partitions are sorted by device name, so the output is deterministic. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/placer.h"
#include "graph_impl.h"

struct dg_partitions {
    int n;
    char **devices;      // sorted
    dg_graph **graphs;
    graph_strmap by_device;   // device -> index + 1
    int n_send, n_recv;
};

void dg_partitions_free(dg_partitions **pp) {
    if (!pp || !*pp) return;
    dg_partitions *p = *pp;
    for (int i = 0; i < p->n; i++) {
        free(p->devices[i]);
        dg_graph_free(&p->graphs[i]);
    }
    free(p->devices);
    free(p->graphs);
    graph_strmap_clear(&p->by_device);
    free(p);
    *pp = NULL;
}

int dg_partitions_count(const dg_partitions *p) { return p->n; }
const char *dg_partitions_device(const dg_partitions *p, int i) {
    return i >= 0 && i < p->n ? p->devices[i] : NULL;
}
dg_graph *dg_partitions_graph(const dg_partitions *p, int i) {
    return i >= 0 && i < p->n ? p->graphs[i] : NULL;
}
int dg_partitions_num_sends(const dg_partitions *p) { return p->n_send; }
int dg_partitions_num_recvs(const dg_partitions *p) { return p->n_recv; }

dg_node *dg_partitions_find(const dg_partitions *p, const dg_node *orig) {
    if (!orig->assigned_device) return NULL;
    intptr_t k = (intptr_t)graph_strmap_get(&p->by_device, orig->assigned_device);
    return k > 0 ? dg_graph_find(p->graphs[k - 1], orig->name) : NULL;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int cmp_id(const void *a, const void *b) {
    int x = (*(dg_node *const *)a)->id, y = (*(dg_node *const *)b)->id;
    return (x > y) - (x < y);
}

typedef struct ctx {
    dg_partitions *p;
    int64_t incarnation;
    graph_strmap pairs;     // "src#idx>dst" -> recv node
    char **keys;
    int n_keys, cap_keys;
} ctx;

static const char *keep_key(ctx *c, char *key) {
    BASE_PUSH(c->keys, c->n_keys, c->cap_keys, key);
    return key;
}

static const graph_op_def *op_send, *op_recv, *op_const;

// A node with a fresh name based on base (base, base_1, ...) in g.
static dg_node *raw_node(dg_graph *g, const graph_op_def *def, char *base) {
    int n_attrs = def == op_recv ? 6 : 5;
    if (!dg_graph_find(g, base)) return graph_insert_raw(g, def, base, n_attrs);
    for (int k = 1;; k++) {
        char *name = NULL;
        if (asprintf(&name, "%s_%d", base, k) < 0) abort();
        if (!dg_graph_find(g, name)) {
            dg_node *n = graph_insert_raw(g, def, name, n_attrs);
            free(name);
            return n;
        }
        free(name);
    }
}

static void set_pair_attrs(dg_node *n, ctx *c, const char *tensor, int sp, int dst) {
    graph_set_attr_string(n, "tensor_name", tensor);
    graph_set_attr_string_interned(n, "send_device", graph_intern(n->graph, c->p->devices[sp]));
    graph_set_attr_string_interned(n, "recv_device", graph_intern(n->graph, c->p->devices[dst]));
    graph_set_attr_int(n, "send_device_incarnation", c->incarnation);
}

// The _Recv in partition dst for output src (a node of partition sp), made on first use
// together with its _Send. control: the dummy for a control edge from src.
// A fed value crossing from the client's partition keeps the prefix "feed" in its names.
static dg_node *recv_for_kind(ctx *c, dg_node *src_copy, int index, int sp, int dst, bool control,
                              bool feed, dg_status *st);

static dg_node *recv_for(ctx *c, dg_node *src_copy, int index, int sp, int dst, bool control,
                         dg_status *st) {
    return recv_for_kind(c, src_copy, index, sp, dst, control, false, st);
}

static dg_node *recv_for_kind(ctx *c, dg_node *src_copy, int index, int sp, int dst, bool control,
                              bool feed, dg_status *st) {
    char *key = NULL;
    if (asprintf(&key, "%s%s#%d%s>%d", feed ? "feed:" : "", src_copy->name, index, control ? "c" : "",
                 dst) < 0)
        abort();
    dg_node *r = graph_strmap_get(&c->pairs, key);
    if (r) {
        free(key);
        return r;
    }
    dg_graph *sg = c->p->graphs[sp], *dg = c->p->graphs[dst];
    dg_output value = {src_copy, index};
    char *tensor = NULL, *name = NULL;
    if (control) {
        // A dummy scalar that runs after src, carried across so dst can wait for it.
        if (asprintf(&name, "_ctrl_%s_to_%d", src_copy->name, dst) < 0) abort();
        dg_node *d = raw_node(sg, op_const, name);
        free(name);
        name = NULL;
        if (!d) goto fail;
        dg_tensor *zero = dg_tensor_scalar_f32(0);
        graph_set_attr_tensor(d, "value", zero);
        graph_set_attr_type(d, "dtype", DG_FLOAT32);
        dg_tensor_unref(zero);
        graph_set_num_outputs(d, 1, NULL);
        graph_set_output(d, 0, DG_FLOAT32, dg_shape_scalar());
        dg_node_add_control_input(d, src_copy);
        graph_set_assigned_device(d, c->p->devices[sp]);
        value.node = d;
        value.index = 0;
    }
    if (asprintf(&tensor, "%s%s:%d", feed ? "feed/" : "", value.node->name, value.index) < 0) abort();
    if (asprintf(&name, "_send_%s%s_%d_to_%d", feed ? "feed_" : "", value.node->name, value.index, dst) < 0)
        abort();
    dg_node *s = raw_node(sg, op_send, name);
    free(name);
    if (asprintf(&name, "_recv_%s%s_%d_from_%d", feed ? "feed_" : "", value.node->name, value.index, sp) < 0)
        abort();
    r = s ? raw_node(dg, op_recv, name) : NULL;
    free(name);
    if (!s || !r) {
        free(tensor);
        goto fail;
    }
    graph_add_input(s, value);
    set_pair_attrs(s, c, tensor, sp, dst);
    graph_set_attr_type(s, "T", dg_output_dtype(value));
    set_pair_attrs(r, c, tensor, sp, dst);
    graph_set_attr_type(r, "tensor_type", dg_output_dtype(value));
    graph_set_attr_shape(r, "shape", dg_output_shape(value));
    graph_set_num_outputs(r, 1, NULL);
    graph_set_output(r, 0, dg_output_dtype(value), dg_output_shape(value));
    free(tensor);
    graph_set_assigned_device(s, c->p->devices[sp]);
    graph_set_assigned_device(r, c->p->devices[dst]);
    c->p->n_send++;
    c->p->n_recv++;
    graph_strmap_put(&c->pairs, keep_key(c, key), r);
    return r;
fail:
    free(key);
    if (!dg_graph_check(sg, st)) dg_status_prepend(st, "partition %s", c->p->devices[sp]);
    else if (!dg_graph_check(dg, st)) dg_status_prepend(st, "partition %s", c->p->devices[dst]);
    return NULL;
}

static bool is_fed(const dg_output *feeds, int n_feeds, dg_output o) {
    for (int f = 0; f < n_feeds; f++)
        if (feeds[f].node == o.node && feeds[f].index == o.index) return true;
    return false;
}

dg_partitions *dg_partition(dg_node *const *nodes_in, int n_nodes, const dg_output *feeds, int n_feeds,
                            int64_t incarnation, dg_status *st) {
    dg_status_reset(st);
    return dg_partition_ex(nodes_in, n_nodes, feeds, n_feeds, NULL, 0, NULL, incarnation, NULL, st);
}

dg_partitions *dg_partition_ex(dg_node *const *nodes_in, int n_nodes, const dg_output *feeds,
                               int n_feeds, const dg_output *fetches, int n_fetches,
                               const char *client_device, int64_t incarnation, dg_output *fetch_out,
                               dg_status *st) {
    dg_status_reset(st);
    dg_partitions *p = calloc(1, sizeof *p);
    dg_node **nodes = malloc(((size_t)n_nodes + 1) * sizeof *nodes);
    int *part = malloc(((size_t)n_nodes + 1) * sizeof *part);
    dg_node **copy = calloc((size_t)n_nodes + 1, sizeof *copy);
    int *local = NULL;
    dg_output *ins = NULL;
    int cap_ins = 0;
    bool ok = false;
    ctx c;
    memset(&c, 0, sizeof c);
    op_send = graph_op_lookup("_Send");
    op_recv = graph_op_lookup("_Recv");
    op_const = graph_op_lookup("Const");
    c.p = p;
    c.incarnation = incarnation;
    if (!p || !nodes || !part || !copy) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "partitioner: out of memory");
        goto fail;
    }
    memcpy(nodes, nodes_in, (size_t)n_nodes * sizeof *nodes);
    qsort(nodes, (size_t)n_nodes, sizeof *nodes, cmp_id);
    // Devices, sorted.
    graph_strmap seen = {0};
    char **devs = NULL;
    int n_devs = 0, cap_devs = 0;
    for (int i = 0; i < n_nodes; i++) {
        const char *d = nodes[i]->assigned_device;
        if (!d || !*d) {
            graph_strmap_clear(&seen);
            free(devs);
            dg_status_setf(st, DG_FAILED_PRECONDITION, "partitioner: node \"%s\" (%s) is not placed",
                           nodes[i]->name, nodes[i]->op->name);
            goto fail;
        }
        if (graph_strmap_get(&seen, d)) continue;
        graph_strmap_put(&seen, d, (void *)1);
        BASE_PUSH(devs, n_devs, cap_devs, strdup(d));
    }
    if (client_device && !graph_strmap_get(&seen, client_device)) {
        BASE_PUSH(devs, n_devs, cap_devs, strdup(client_device));
    }
    graph_strmap_clear(&seen);
    qsort(devs, (size_t)n_devs, sizeof *devs, cmp_str);
    p->n = n_devs;
    p->devices = devs;
    p->graphs = calloc((size_t)n_devs + 1, sizeof *p->graphs);
    if (!p->graphs) abort();
    for (int d = 0; d < n_devs; d++) {
        p->graphs[d] = dg_graph_new();
        graph_strmap_put(&p->by_device, p->devices[d], (void *)(intptr_t)(d + 1));
    }
    int client = client_device
                     ? (int)(intptr_t)graph_strmap_get(&p->by_device, client_device) - 1 : -1;
    int max_id = n_nodes ? nodes[n_nodes - 1]->id : 0;
    local = malloc(((size_t)max_id + 2) * sizeof *local);
    if (!local) abort();
    for (int i = 0; i <= max_id; i++) local[i] = -1;
    for (int i = 0; i < n_nodes; i++) {
        local[nodes[i]->id] = i;
        part[i] = (int)(intptr_t)graph_strmap_get(&p->by_device, nodes[i]->assigned_device) - 1;
    }
    // Data edges.
    for (int i = 0; i < n_nodes; i++) {
        dg_node *n = nodes[i];
        base_reserve((void **)&ins, sizeof *ins, 0, &cap_ins, n->n_inputs);
        for (int k = 0; k < n->n_inputs; k++) {
            dg_output in = n->inputs[k];
            if (is_fed(feeds, n_feeds, in)) {
                ins[k] = in;
                if (client != -1 && part[i] != client) {
                    // The value lives with the client: send it over.
                    dg_node *r = recv_for_kind(&c, in.node, in.index, client, part[i], false, true, st);
                    if (!r) goto fail;
                    ins[k].node = r;
                    ins[k].index = 0;
                }
                continue;
            }
            int j = in.node->id <= max_id ? local[in.node->id] : -1;
            if (j < 0 || nodes[j] != in.node || !copy[j]) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "partitioner: input %d of node \"%s\" comes "
                               "from \"%s\", which is neither in the graph nor fed", k, n->name,
                               in.node->name);
                goto fail;
            }
            if (part[j] == part[i]) {
                ins[k].node = copy[j];
                ins[k].index = in.index;
            } else {
                dg_node *r = recv_for(&c, copy[j], in.index, part[j], part[i], false, st);
                if (!r) goto fail;
                ins[k].node = r;
                ins[k].index = 0;
            }
        }
        copy[i] = graph_insert_copy(p->graphs[part[i]], n, ins, n->n_inputs);
        if (!copy[i]) {
            dg_graph_check(p->graphs[part[i]], st);
            goto fail;
        }
    }
    // Control edges.
    for (int i = 0; i < n_nodes; i++) {
        dg_node *n = nodes[i];
        for (int k = 0; k < n->n_ctrl; k++) {
            dg_node *dep = n->ctrl_inputs[k];
            int j = dep->id <= max_id ? local[dep->id] : -1;
            if (j < 0 || nodes[j] != dep) continue;   // outside the run set
            if (part[j] == part[i]) {
                dg_node_add_control_input(copy[i], copy[j]);
            } else {
                // A value of dep already crossing to this partition orders it just as well.
                dg_node *r = NULL;
                for (int o = 0; o < dep->n_outputs && !r; o++) {
                    char *key = NULL;
                    if (asprintf(&key, "%s#%d>%d", copy[j]->name, o, part[i]) < 0) abort();
                    r = graph_strmap_get(&c.pairs, key);
                    free(key);
                }
                if (r) {
                    dg_node_add_control_input(copy[i], r);
                    continue;
                }
                r = recv_for(&c, copy[j], 0, part[j], part[i], true, st);
                if (!r) goto fail;
                dg_node_add_control_input(copy[i], r);
            }
        }
    }
    // Fetches: read in the client's partition, sent over when computed elsewhere.
    for (int f = 0; f < n_fetches && fetch_out; f++) {
        dg_output o = fetches[f];
        fetch_out[f] = o;
        if (is_fed(feeds, n_feeds, o)) continue;
        int j = o.node->id <= max_id ? local[o.node->id] : -1;
        if (j < 0 || nodes[j] != o.node) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "partitioner: fetch %d (\"%s\") is not in the graph", f,
                           o.node->name);
            goto fail;
        }
        fetch_out[f].node = copy[j];
        if (client != -1 && part[j] != client) {
            dg_node *r = recv_for(&c, copy[j], o.index, part[j], client, false, st);
            if (!r) goto fail;
            fetch_out[f].node = r;
            fetch_out[f].index = 0;
        }
    }
    ok = true;
fail:
    graph_strmap_clear(&c.pairs);
    for (int i = 0; i < c.n_keys; i++) free(c.keys[i]);
    free(c.keys);
    free(nodes);
    free(part);
    free(copy);
    free(local);
    free(ins);
    if (!ok) dg_partitions_free(&p);
    return p;
}
