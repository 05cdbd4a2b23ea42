/* The placer: colocation groups by union-find, one merged device request per group, the
 * devices each group may take (placer_groups_build, shared with the automatic placer), then the
 * first device (accelerators before CPUs, then in the given order) that matches the request, passes
 * the filters and has a kernel for every member. Linear in nodes + edges, times devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/device_name.h"
#include "distgraph/placer.h"
#include "graph_impl.h"
#include "placer_impl.h"

dg_placement_options dg_placement_options_default(void) {
    dg_placement_options o;
    memset(&o, 0, sizeof o);
    o.allow_soft_placement = true;
    return o;
}

static int find(int *parent, int x) {
    while (parent[x] != x) {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    return x;
}

static void unite(int *parent, int a, int b) {
    a = find(parent, a);
    b = find(parent, b);
    if (a != b) parent[a < b ? b : a] = a < b ? a : b;   // the older node is the root
}

// Devices are tried accelerators (any type but the CPU) first, then CPUs.
static int type_rank(const char *type) { return strcmp(type, DG_DEVICE_TYPE_CPU) == 0 ? 1 : 0; }

typedef struct group {
    dg_device_name spec;
    int first_requester;   // local index of the node whose request set the spec, -1 if none
    int index;             // the group's number (placer_groups), -1 before
} group;

static void list_devices(char *buf, size_t cap, const char *const *devices, const int *order, int n) {
    size_t o = 0;
    buf[0] = 0;
    for (int i = 0; i < n && o < cap; i++) {
        if (i == 8) {
            snprintf(buf + o, cap - o, ", ... (%d in all)", n);
            return;
        }
        o += (size_t)snprintf(buf + o, cap - o, "%s%s", i ? ", " : "", devices[order[i]]);
    }
    if (n == 0) snprintf(buf, cap, "none");
}

bool placer_groups_build(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
                         const dg_placement_options *opts_in, placer_groups *out, dg_status *st) {
    memset(out, 0, sizeof *out);
    dg_placement_options opts = opts_in ? *opts_in : dg_placement_options_default();
    bool ok = false;
    dg_device_name *devs = calloc((size_t)n_devices + 1, sizeof *devs);
    int *order = calloc((size_t)n_devices + 1, sizeof *order);
    int *parent = malloc(((size_t)n_nodes + 1) * sizeof *parent);
    int *spec_of = malloc(((size_t)n_nodes + 1) * sizeof *spec_of);   // index into specs
    group *groups = calloc((size_t)n_nodes + 1, sizeof *groups);
    int max_id = -1;
    for (int i = 0; i < n_nodes; i++)
        if (nodes[i]->id > max_id) max_id = nodes[i]->id;
    int *local = malloc(((size_t)max_id + 2) * sizeof *local);
    int *head = malloc(((size_t)n_nodes + 1) * sizeof *head);
    int *next_member = malloc(((size_t)n_nodes + 1) * sizeof *next_member);
    dg_device_name *specs = NULL;
    int n_specs = 0, cap_specs = 0;
    graph_strmap spec_index = {0}, coloc_index = {0};
    char (*types)[DG_DEVICE_TYPE_MAX] = NULL;
    int *type_of = NULL;
    bool *type_ok = NULL;
    if (!devs || !order || !parent || !spec_of || !groups || !local || !head || !next_member) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "placer: out of memory");
        goto done;
    }
    if (n_devices == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "placer: no devices to place on");
        goto done;
    }
    // Devices: complete names, filtered, accelerators first (stable).
    int n_order = 0;
    for (int d = 0; d < n_devices; d++) {
        if (!dg_device_name_parse(devices[d], &devs[d], st)) goto done;
        if (!dg_device_name_is_complete(&devs[d])) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "placer: device \"%s\" is not a complete device name",
                           devices[d]);
            goto done;
        }
        bool pass = opts.n_device_filters == 0;
        for (int f = 0; f < opts.n_device_filters && !pass; f++) {
            dg_device_name filt;
            if (!dg_device_name_parse(opts.device_filters[f], &filt, st)) {
                dg_status_prepend(st, "device filter %d", f);
                goto done;
            }
            pass = dg_device_name_matches(&filt, &devs[d]);
        }
        if (pass) order[n_order++] = d;
    }
    for (int i = 1; i < n_order; i++)
        for (int j = i; j > 0 && type_rank(devs[order[j]].type) < type_rank(devs[order[j - 1]].type); j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (int i = 0; i <= max_id; i++) local[i] = -1;
    for (int i = 0; i < n_nodes; i++) {
        local[nodes[i]->id] = i;
        parent[i] = i;
    }
    // Colocation: explicit groups, and ops that take variables by reference.
    for (int i = 0; i < n_nodes; i++) {
        dg_node *n = nodes[i];
        for (int c = 0; c < n->n_coloc; c++) {
            const char *name = n->coloc[c];
            void *v = graph_strmap_get(&coloc_index, name);
            if (v) unite(parent, i, (int)(intptr_t)v - 1);
            else graph_strmap_put(&coloc_index, name, (void *)(intptr_t)(i + 1));
        }
        for (int k = 0, refs = graph_num_ref_inputs(n); k < refs && k < n->n_inputs; k++) {
            dg_node *src = n->inputs[k].node;
            if (strcmp(src->op->name, "VariableV2") == 0 && src->id <= max_id && local[src->id] >= 0 &&
                nodes[local[src->id]] == src)
                unite(parent, i, local[src->id]);
        }
    }
    // A node named in colocation lists joins the group of those naming it.
    for (int i = 0; i < n_nodes; i++) {
        void *v = graph_strmap_get(&coloc_index, nodes[i]->name);
        if (v) unite(parent, i, (int)(intptr_t)v - 1);
    }
    // Requested devices, parsed once per distinct string.
    for (int i = 0; i < n_nodes; i++) {
        const char *req = nodes[i]->requested_device ? nodes[i]->requested_device : "";
        void *v = graph_strmap_get(&spec_index, req);
        if (v) {
            spec_of[i] = (int)(intptr_t)v - 1;
            continue;
        }
        base_reserve((void **)&specs, sizeof *specs, n_specs, &cap_specs, 1);
        if (!dg_device_name_parse(req, &specs[n_specs], st)) {
            dg_status_prepend(st, "node \"%s\" (%s)", nodes[i]->name, nodes[i]->op->name);
            goto done;
        }
        graph_strmap_put(&spec_index, req, (void *)(intptr_t)(n_specs + 1));
        spec_of[i] = n_specs++;
    }
    for (int i = 0; i < n_nodes; i++) {
        groups[i].first_requester = -1;
        groups[i].index = -1;
        head[i] = -1;
    }
    for (int i = 0; i < n_nodes; i++) {
        int r = find(parent, i);
        const dg_device_name *s = &specs[spec_of[i]];
        if (!s->has_job && !s->has_replica && !s->has_task && !s->has_type && !s->has_id) continue;
        group *gr = &groups[r];
        if (gr->first_requester < 0) {
            gr->spec = *s;
            gr->first_requester = i;
            continue;
        }
        dg_device_name merged = gr->spec;
        if (!dg_device_name_merge(&merged, s, opts.allow_soft_placement, st)) {
            dg_node *a = nodes[i], *b = nodes[gr->first_requester];
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "cannot colocate node \"%s\" (%s, requested \"%s\") with node \"%s\" (%s, "
                           "requested \"%s\"): the requests conflict and the two must share a device",
                           a->name, a->op->name, a->requested_device, b->name, b->op->name,
                           b->requested_device);
            goto done;
        }
        gr->spec = merged;
    }
    dg_device_name defspec;
    memset(&defspec, 0, sizeof defspec);
    if (opts.default_device && !dg_device_name_parse(opts.default_device, &defspec, st)) {
        dg_status_prepend(st, "default device");
        goto done;
    }
    // Members of each group as linked lists, so each group's kernel check is linear.
    for (int i = n_nodes - 1; i >= 0; i--) {
        int r = find(parent, i);
        next_member[i] = head[r];
        head[r] = i;
    }
    // Device types, each checked once per group (every device's, however many).
    types = malloc(((size_t)n_order + 1) * sizeof *types);
    type_of = malloc(((size_t)n_order + 1) * sizeof *type_of);
    type_ok = malloc(((size_t)n_order + 1) * sizeof *type_ok);
    if (!types || !type_of || !type_ok) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "placer: out of memory");
        goto done;
    }
    int n_types = 0;
    for (int k = 0; k < n_order; k++) {
        int d = order[k], t;
        for (t = 0; t < n_types && strcmp(types[t], devs[d].type) != 0; t++) {}
        if (t == n_types) snprintf(types[n_types++], DG_DEVICE_TYPE_MAX, "%s", devs[d].type);
        type_of[k] = t;
    }
    // The devices each group may take: those meeting its request (or, under soft placement
    // when none does, its task), and dg_place's choice among them.
    int n_groups = 0;
    for (int i = 0; i < n_nodes; i++)
        if (find(parent, i) == i) groups[i].index = n_groups++;
    out->n_nodes = n_nodes;
    out->n_groups = n_groups;
    out->n_devices = n_devices;
    out->group_of = malloc(((size_t)n_nodes + 1) * sizeof *out->group_of);
    out->allowed = calloc(((size_t)n_groups + 1) * (size_t)n_devices, 1);
    out->first = malloc(((size_t)n_groups + 1) * sizeof *out->first);
    out->pinned = calloc((size_t)n_groups + 1, sizeof *out->pinned);
    if (!out->group_of || !out->allowed || !out->first || !out->pinned) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "placer: out of memory");
        goto done;
    }
    for (int i = 0; i < n_nodes; i++) out->group_of[i] = groups[find(parent, i)].index;
    for (int i = 0; i < n_nodes; i++) {
        int r = find(parent, i);
        if (r != i) continue;
        group *gr = &groups[r];
        int gi = gr->index;
        uint8_t *allow = out->allowed + (size_t)gi * (size_t)n_devices;
        out->first[gi] = -1;
        out->pinned[gi] = gr->first_requester >= 0;
        for (int t = 0; t < n_types; t++) {
            type_ok[t] = true;
            if (opts.supports)
                for (int j = head[r]; j >= 0 && type_ok[t]; j = next_member[j])
                    type_ok[t] = opts.supports(opts.supports_ctx, nodes[j], types[t]);
        }
        dg_device_name want = gr->spec;
        if (opts.default_device) {
            dg_device_name tmp = defspec;
            dg_device_name_merge_override(&tmp, &want);
            want = tmp;
        }
        for (int attempt = 0; attempt < 2 && out->first[gi] < 0; attempt++) {
            if (attempt == 1) {
                if (!opts.allow_soft_placement) break;
                want.has_type = want.has_id = false;   // soft placement: any device of the task
            }
            for (int k = 0; k < n_order; k++) {
                int d = order[k];
                bool kernel = type_ok[type_of[k]];
                if (!kernel || !dg_device_name_matches(&want, &devs[d])) continue;
                allow[d] = 1;
                if (out->first[gi] < 0) out->first[gi] = d;
            }
        }
    }
    // Report the first node whose group has no device.
    for (int i = 0; i < n_nodes; i++) {
        int r = find(parent, i);
        if (out->first[groups[r].index] >= 0) continue;
        char avail[1024];
        list_devices(avail, sizeof avail, devices, order, n_order);
        dg_node *n = nodes[i];
        char req[DG_DEVICE_NAME_MAX];
        dg_device_name_str(&groups[r].spec, req, sizeof req);
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "cannot place node \"%s\" (%s): its colocation group requests \"%s\"%s; no "
                       "device matches it%s. Devices: %s",
                       n->name, n->op->name, req[0] ? req : "any device",
                       groups[r].first_requester >= 0 && nodes[groups[r].first_requester] != n ? " (set by "
                       "a colocated node)" : "",
                       opts.allow_soft_placement ? " even under soft placement" : " (soft placement is off)",
                       avail);
        goto done;
    }
    ok = true;
done:
    free(devs);
    free(order);
    free(parent);
    free(spec_of);
    free(groups);
    free(local);
    free(head);
    free(next_member);
    free(specs);
    graph_strmap_clear(&spec_index);
    graph_strmap_clear(&coloc_index);
    free(types);
    free(type_of);
    free(type_ok);
    if (!ok) placer_groups_clear(out);
    return ok;
}

void placer_groups_clear(placer_groups *g) {
    free(g->group_of);
    free(g->allowed);
    free(g->first);
    free(g->pinned);
    memset(g, 0, sizeof *g);
}

bool dg_place(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
              const dg_placement_options *opts, dg_status *st) {
    dg_status_reset(st);
    placer_groups pg;
    if (!placer_groups_build(nodes, n_nodes, devices, n_devices, opts, &pg, st)) return false;
    for (int i = 0; i < n_nodes; i++) {
        const char *dev = devices[pg.first[pg.group_of[i]]];
        if (!nodes[i]->assigned_device || strcmp(nodes[i]->assigned_device, dev) != 0)
            graph_set_assigned_device(nodes[i], dev);
    }
    placer_groups_clear(&pg);
    return true;
}
