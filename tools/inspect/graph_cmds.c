/* dg-inspect's commands on graph files: graph (the nodes), place (node -> device on a
 * cluster's devices), partition (per-device graphs and their Send/Recv pairs) and svg (the
 * partitioned graph drawn by svg_layout.c). Placing and partitioning are the library's own
 * (dg_place, dg_partition), so what is shown is what a session would run. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "svg_layout.h"

static void outputs_str(const dg_node *n, inspect_sbuf *b) {
    if (dg_node_num_outputs(n) == 0) inspect_sb_printf(b, "-");
    for (int i = 0; i < dg_node_num_outputs(n); i++) {
        char sh[160];
        dg_shape s = dg_node_output_shape(n, i);
        inspect_sb_printf(b, "%s%s%s", i ? " " : "", dg_dtype_name(dg_node_output_dtype(n, i)),
                          dg_shape_str(&s, sh, sizeof sh));
    }
}

static void inputs_str(const dg_node *n, inspect_sbuf *b) {
    for (int i = 0; i < dg_node_num_inputs(n); i++) {
        char buf[512];
        inspect_sb_printf(b, "%s%s", i ? ", " : "", dg_output_str(dg_node_input(n, i), buf, sizeof buf));
    }
    for (int i = 0; i < dg_node_num_control_inputs(n); i++)
        inspect_sb_printf(b, "%s^%s", i || dg_node_num_inputs(n) ? ", " : "",
                          dg_node_name(dg_node_control_input(n, i)));
}

// ---- graph ----

int inspect_cmd_graph(const inspect_options *o, dg_graph *g) {
    int n = dg_graph_num_nodes(g);
    if (o->json) {
        printf("[");
        for (int i = 0; i < n; i++) {
            const dg_node *nd = dg_graph_node(g, i);
            printf("%s\n  {\"name\": ", i ? "," : "");
            inspect_json_str(stdout, dg_node_name(nd));
            printf(", \"op\": ");
            inspect_json_str(stdout, dg_node_op_type(nd));
            printf(", \"inputs\": [");
            for (int k = 0; k < dg_node_num_inputs(nd); k++) {
                char buf[512];
                printf("%s", k ? ", " : "");
                inspect_json_str(stdout, dg_output_str(dg_node_input(nd, k), buf, sizeof buf));
            }
            printf("], \"control_inputs\": [");
            for (int k = 0; k < dg_node_num_control_inputs(nd); k++) {
                printf("%s", k ? ", " : "");
                inspect_json_str(stdout, dg_node_name(dg_node_control_input(nd, k)));
            }
            printf("], \"colocation\": [");
            for (int k = 0; k < dg_node_num_colocations(nd); k++) {
                printf("%s", k ? ", " : "");
                inspect_json_str(stdout, dg_node_colocation(nd, k));
            }
            printf("], \"requested_device\": ");
            inspect_json_str(stdout, dg_node_requested_device(nd));
            printf(", \"assigned_device\": ");
            inspect_json_str(stdout, dg_node_assigned_device(nd));
            printf(", \"outputs\": [");
            for (int k = 0; k < dg_node_num_outputs(nd); k++) {
                dg_shape s = dg_node_output_shape(nd, k);
                printf("%s{\"dtype\": \"%s\", \"shape\": ", k ? ", " : "",
                       dg_dtype_name(dg_node_output_dtype(nd, k)));
                if (s.rank < 0) {
                    printf("null}");
                    continue;
                }
                printf("[");
                for (int d = 0; d < s.rank; d++) printf("%s%lld", d ? ", " : "", (long long)s.dims[d]);
                printf("]}");
            }
            printf("]}");
        }
        printf("%s]\n", n ? "\n" : "");
        return 0;
    }
    enum { NC = 7 };
    static const char *const head[NC] = {"#", "name", "op", "outputs", "requested device",
                                         "assigned device", "inputs (^control)"};
    inspect_table t;
    inspect_table_init(&t, head, NC);
    for (int i = 0; i < n; i++) {
        const dg_node *nd = dg_graph_node(g, i);
        char **r = inspect_table_add(&t);
        char num[32];
        snprintf(num, sizeof num, "%d", i);
        inspect_sbuf outs = {0}, ins = {0};
        outputs_str(nd, &outs);
        inputs_str(nd, &ins);
        r[0] = inspect_xstrdup(num);
        r[1] = inspect_xstrdup(dg_node_name(nd));
        r[2] = inspect_xstrdup(dg_node_op_type(nd));
        r[3] = inspect_xstrdup(inspect_sb_str(&outs));
        r[4] = inspect_xstrdup(*dg_node_requested_device(nd) ? dg_node_requested_device(nd) : "-");
        r[5] = inspect_xstrdup(*dg_node_assigned_device(nd) ? dg_node_assigned_device(nd) : "-");
        r[6] = inspect_xstrdup(inspect_sb_str(&ins));
        free(outs.s);
        free(ins.s);
    }
    inspect_table_print(&t, NC);
    inspect_table_free(&t);
    printf("%d nodes\n", n);
    return 0;
}

// ---- placement and partitioning ----

typedef struct placed {
    dg_cluster *cluster;
    char **devices;
    int n_devices;
    dg_node **nodes;
    int n_nodes;
    dg_partitions *parts;
    bool have_report;
    dg_auto_place_report report;   // --auto
} placed;

static void placed_free(placed *p) {
    dg_partitions_free(&p->parts);
    if (p->have_report) dg_auto_place_report_clear(&p->report);
    if (p->devices) dg_device_list_free(p->devices, p->n_devices);
    dg_cluster_free(&p->cluster);
    free(p->nodes);
}

// --auto: dg_auto_place with the calibration, caps and unknown dimension asked for.
static bool auto_place(const inspect_options *o, placed *p, const dg_placement_options *po, dg_status *st) {
    dg_cost_model *cost = dg_cost_model_new();
    if (!cost) {
        fprintf(stderr, "dg-inspect: cost model: out of memory\n");
        return false;
    }
    bool ok = (!o->cost_file || dg_cost_model_load(cost, o->cost_file, st)) && dg_cost_model_set_hosts(cost, p->cluster, st);
    if (!ok) {
        inspect_die_status("--cost", st);
        dg_cost_model_free(&cost);
        return false;
    }
    int64_t *caps = inspect_xcalloc((size_t)p->n_devices + 1, sizeof *caps);
    for (int d = 0; d < p->n_devices; d++) caps[d] = o->memory_cap;
    dg_auto_place_options ao = dg_auto_place_options_default();
    ao.placement = *po;
    ao.cost = cost;
    ao.memory_caps = caps;
    ao.unknown_dim = o->unknown_dim;
    ok = dg_auto_place_nodes(p->nodes, p->n_nodes, (const char *const *)p->devices, p->n_devices, &ao, &p->report, st);
    p->have_report = ok;
    if (!ok) inspect_die_status("automatic placement", st);
    free(caps);
    dg_cost_model_free(&cost);
    return ok;
}

// What --auto predicts: the step, the placers' candidates, each device's load and memory.
static void print_report(const placed *p, bool json) {
    const dg_auto_place_report *r = &p->report;
    const dg_step_estimate *e = &r->estimate;
    if (json) {
        printf("\"auto\": {\"placer\": \"%s\", \"predicted_step_ms\": %.6g, \"placement_s\": %.3f, "
               "\"transfers\": %lld, \"transfer_bytes\": %lld, \"candidates_ms\": {",
               dg_auto_placer_name(r->chosen), r->predicted_step_s * 1e3, r->seconds, (long long)e->n_transfers,
               (long long)e->transfer_bytes);
        bool first = true;
        for (int k = 1; k < 5; k++)
            if (r->candidate_step_s[k] > 0) {
                printf("%s\"%s\": %.6g", first ? "" : ", ", dg_auto_placer_name((dg_auto_placer)k),
                       r->candidate_step_s[k] * 1e3);
                first = false;
            }
        printf("}, \"devices\": [");
        for (int d = 0; d < e->n_devices; d++) {
            printf("%s{\"device\": ", d ? ", " : "");
            inspect_json_str(stdout, p->devices[d]);
            printf(", \"busy_ms\": %.6g, \"load\": %.4f, \"static_bytes\": %lld, \"peak_bytes\": %lld}",
                   e->busy_s[d] * 1e3, e->step_s > 0 ? e->busy_s[d] / e->step_s : 0, (long long)e->static_bytes[d],
                   (long long)e->peak_bytes[d]);
        }
        printf("]}");
        return;
    }
    printf("automatic placement (%s, %.2f s): predicted step %.3f ms, %lld transfers of %.1f MB in all\n",
           dg_auto_placer_name(r->chosen), r->seconds, r->predicted_step_s * 1e3, (long long)e->n_transfers,
           (double)e->transfer_bytes / 1e6);
    printf("candidates:");
    for (int k = 1; k < 5; k++)
        if (r->candidate_step_s[k] > 0) printf(" %s %.3f ms", dg_auto_placer_name((dg_auto_placer)k), r->candidate_step_s[k] * 1e3);
    printf("\n");
    static const char *const head[5] = {"device", "busy ms", "load", "bytes held", "peak bytes"};
    inspect_table t;
    inspect_table_init(&t, head, 5);
    for (int d = 0; d < e->n_devices; d++) {
        char **row = inspect_table_add(&t);
        char buf[64];
        row[0] = inspect_xstrdup(p->devices[d]);
        snprintf(buf, sizeof buf, "%.3f", e->busy_s[d] * 1e3);
        row[1] = inspect_xstrdup(buf);
        snprintf(buf, sizeof buf, "%.0f%%", e->step_s > 0 ? 100 * e->busy_s[d] / e->step_s : 0);
        row[2] = inspect_xstrdup(buf);
        snprintf(buf, sizeof buf, "%lld", (long long)e->static_bytes[d]);
        row[3] = inspect_xstrdup(buf);
        snprintf(buf, sizeof buf, "%lld", (long long)e->peak_bytes[d]);
        row[4] = inspect_xstrdup(buf);
    }
    inspect_table_print(&t, 5);
    inspect_table_free(&t);
}

static bool place(const inspect_options *o, dg_graph *g, placed *p, bool partition, dg_status *st) {
    memset(p, 0, sizeof *p);
    if (!o->cluster_spec) {
        fprintf(stderr, "dg-inspect: %s needs --cluster_spec\n", o->cmd);
        return false;
    }
    p->cluster = dg_cluster_from_spec_string(o->cluster_spec, st);
    if (!p->cluster) {
        inspect_die_status("--cluster_spec", st);
        return false;
    }
    p->n_devices = dg_cluster_devices(p->cluster, o->gpus_per_task, &p->devices, st);
    if (p->n_devices < 0) {
        p->n_devices = 0;
        inspect_die_status("cluster devices", st);
        return false;
    }
    p->n_nodes = dg_graph_num_nodes(g);
    p->nodes = inspect_xcalloc((size_t)p->n_nodes, sizeof *p->nodes);
    for (int i = 0; i < p->n_nodes; i++) p->nodes[i] = dg_graph_node(g, i);
    dg_placement_options po = dg_placement_options_default();
    po.allow_soft_placement = o->soft_placement;
    if (o->auto_place) {
        if (!auto_place(o, p, &po, st)) return false;
    } else if (!dg_place(p->nodes, p->n_nodes, (const char *const *)p->devices, p->n_devices, &po, st)) {
        inspect_die_status("placing", st);
        return false;
    }
    if (!partition) return true;
    p->parts = dg_partition(p->nodes, p->n_nodes, NULL, 0, 1, st);
    if (!p->parts) {
        inspect_die_status("partitioning", st);
        return false;
    }
    return true;
}

int inspect_cmd_place(const inspect_options *o, dg_graph *g, dg_status *st) {
    placed p;
    int rc = 1;
    if (!place(o, g, &p, false, st)) goto out;
    if (o->json) {
        // With --auto: {"placement": {node: device, ...}, "auto": {what it predicts}}.
        if (p.have_report) printf("{\"placement\": ");
        printf("{");
        for (int i = 0; i < p.n_nodes; i++) {
            printf("%s\n  ", i ? "," : "");
            inspect_json_str(stdout, dg_node_name(p.nodes[i]));
            printf(": ");
            inspect_json_str(stdout, dg_node_assigned_device(p.nodes[i]));
        }
        printf("%s}", p.n_nodes ? "\n" : "");
        if (p.have_report) {
            printf(",\n");
            print_report(&p, true);
            printf("}");
        }
        printf("\n");
    } else {
        inspect_table t;
        inspect_table_init(&t, NULL, 4);
        for (int i = 0; i < p.n_nodes; i++) {
            char **r = inspect_table_add(&t);
            r[0] = inspect_xstrdup(dg_node_name(p.nodes[i]));
            r[1] = inspect_xstrdup(dg_node_op_type(p.nodes[i]));
            r[2] = inspect_xstrdup("->");
            r[3] = inspect_xstrdup(dg_node_assigned_device(p.nodes[i]));
        }
        inspect_table_print(&t, 4);
        inspect_table_free(&t);
        printf("%d nodes placed on %d devices\n", p.n_nodes, p.n_devices);
        if (p.have_report) print_report(&p, false);
    }
    rc = 0;
out:
    placed_free(&p);
    return rc;
}

static bool is_transfer(const dg_node *n, bool send) {
    return strcmp(dg_node_op_type(n), send ? "_Send" : "_Recv") == 0;
}

static const char *attr_s(const dg_node *n, const char *name) {
    const char *s = dg_node_attr_string(n, name);
    return s ? s : "?";
}

int inspect_cmd_partition(const inspect_options *o, dg_graph *g, dg_status *st) {
    placed p;
    int rc = 1;
    if (!place(o, g, &p, true, st)) goto out;
    int np = dg_partitions_count(p.parts);
    if (o->json) {
        printf("{\"devices\": [");
        for (int i = 0; i < np; i++) {
            dg_graph *pg = dg_partitions_graph(p.parts, i);
            printf("%s\n  {\"device\": ", i ? "," : "");
            inspect_json_str(stdout, dg_partitions_device(p.parts, i));
            printf(", \"nodes\": [");
            for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
                const dg_node *n = dg_graph_node(pg, k);
                printf("%s{\"name\": ", k ? ", " : "");
                inspect_json_str(stdout, dg_node_name(n));
                printf(", \"op\": ");
                inspect_json_str(stdout, dg_node_op_type(n));
                printf("}");
            }
            printf("]}");
        }
        printf("],\n \"transfers\": [");
        int t = 0;
        for (int i = 0; i < np; i++) {
            dg_graph *pg = dg_partitions_graph(p.parts, i);
            for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
                const dg_node *n = dg_graph_node(pg, k);
                if (!is_transfer(n, true)) continue;
                printf("%s\n  {\"tensor\": ", t++ ? "," : "");
                inspect_json_str(stdout, attr_s(n, "tensor_name"));
                printf(", \"from\": ");
                inspect_json_str(stdout, attr_s(n, "send_device"));
                printf(", \"to\": ");
                inspect_json_str(stdout, attr_s(n, "recv_device"));
                printf(", \"send\": ");
                inspect_json_str(stdout, dg_node_name(n));
                printf("}");
            }
        }
        printf("]}\n");
        rc = 0;
        goto out;
    }
    for (int i = 0; i < np; i++) {
        dg_graph *pg = dg_partitions_graph(p.parts, i);
        printf("%s (%d nodes)\n", dg_partitions_device(p.parts, i), dg_graph_num_nodes(pg));
        for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
            const dg_node *n = dg_graph_node(pg, k);
            if (is_transfer(n, true))
                printf("  %s (_Send %s to %s)\n", dg_node_name(n), attr_s(n, "tensor_name"),
                       attr_s(n, "recv_device"));
            else if (is_transfer(n, false))
                printf("  %s (_Recv %s from %s)\n", dg_node_name(n), attr_s(n, "tensor_name"),
                       attr_s(n, "send_device"));
            else
                printf("  %s (%s)\n", dg_node_name(n), dg_node_op_type(n));
        }
    }
    printf("Send/Recv pairs (%d):\n", dg_partitions_num_sends(p.parts));
    for (int i = 0; i < np; i++) {
        dg_graph *pg = dg_partitions_graph(p.parts, i);
        for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
            const dg_node *n = dg_graph_node(pg, k);
            if (is_transfer(n, true))
                printf("  %s: %s -> %s\n", attr_s(n, "tensor_name"), attr_s(n, "send_device"),
                       attr_s(n, "recv_device"));
        }
    }
    rc = 0;
out:
    placed_free(&p);
    return rc;
}

// ---- svg ----

// Pointer -> index map (open addressing) for nodes of the partition graphs.
typedef struct ptrmap {
    const void **keys;
    int *vals;
    size_t cap;
} ptrmap;

static size_t ptr_hash(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static void pm_init(ptrmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n + 2) m->cap *= 2;
    m->keys = inspect_xcalloc(m->cap, sizeof *m->keys);
    m->vals = inspect_xcalloc(m->cap, sizeof *m->vals);
}

static void pm_put(ptrmap *m, const void *k, int v) {
    size_t i = ptr_hash(k) & (m->cap - 1);
    while (m->keys[i] && m->keys[i] != k) i = (i + 1) & (m->cap - 1);
    m->keys[i] = k;
    m->vals[i] = v;
}

static int pm_get(const ptrmap *m, const void *k) {
    size_t i = ptr_hash(k) & (m->cap - 1);
    while (m->keys[i]) {
        if (m->keys[i] == k) return m->vals[i];
        i = (i + 1) & (m->cap - 1);
    }
    return -1;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static bool is_init_name(const char *name) {
    return strstr(name, "/Initializer/") || ends_with(name, "/Assign") || strcmp(name, "init") == 0;
}

// The partitioner's stand-in for a cross-device control edge: a Const run after the source.
static bool is_ctrl_dummy(const dg_node *n) {
    return strncmp(dg_node_name(n), "_ctrl_", 6) == 0 && strcmp(dg_node_op_type(n), "Const") == 0 &&
           dg_node_num_control_inputs(n) > 0;
}

static bool same_transfer(const dg_node *send, const dg_node *recv) {
    return strcmp(attr_s(send, "tensor_name"), attr_s(recv, "tensor_name")) == 0 &&
           strcmp(attr_s(send, "send_device"), attr_s(recv, "send_device")) == 0 &&
           strcmp(attr_s(send, "recv_device"), attr_s(recv, "recv_device")) == 0;
}

// The SVG shows the partitions as the devices will run them, with the partitioner's helper
// nodes folded into edges: a _Send becomes the dashed edge from the tensor's producer to its
// _Recv, and a control dummy (plus its _Send) the dotted edge from the control source.
int inspect_cmd_svg(const inspect_options *o, dg_graph *g, dg_status *st) {
    if (!o->out) {
        fprintf(stderr, "dg-inspect: svg needs -o OUT.svg\n");
        return 2;
    }
    placed p;
    int rc = 1;
    svg_layout L;
    memset(&L, 0, sizeof L);
    ptrmap pm = {0};
    bool *hidden = NULL;
    const dg_node **all = NULL, **producer = NULL;
    const char **devices = NULL;
    int *part_of = NULL, *vid = NULL, *send_of = NULL;
    bool *via_ctrl = NULL;
    if (!place(o, g, &p, true, st)) goto out;
    int np = dg_partitions_count(p.parts), total = 0;
    for (int i = 0; i < np; i++) total += dg_graph_num_nodes(dg_partitions_graph(p.parts, i));
    all = inspect_xcalloc((size_t)total, sizeof *all);
    part_of = inspect_xcalloc((size_t)total, sizeof *part_of);
    hidden = inspect_xcalloc((size_t)total, sizeof *hidden);
    send_of = inspect_xcalloc((size_t)total, sizeof *send_of);
    producer = inspect_xcalloc((size_t)total, sizeof *producer);
    via_ctrl = inspect_xcalloc((size_t)total, sizeof *via_ctrl);
    vid = inspect_xcalloc((size_t)total, sizeof *vid);
    pm_init(&pm, (size_t)total);
    int k = 0;
    for (int i = 0; i < np; i++) {
        dg_graph *pg = dg_partitions_graph(p.parts, i);
        for (int j = 0; j < dg_graph_num_nodes(pg); j++, k++) {
            all[k] = dg_graph_node(pg, j);
            part_of[k] = i;
            pm_put(&pm, all[k], k);
        }
    }
    // Each _Recv's _Send and the node whose value (or completion) it carries.
    for (int i = 0; i < total; i++) {
        send_of[i] = -1;
        if (!is_transfer(all[i], false)) continue;
        for (int j = 0; j < total && send_of[i] < 0; j++)
            if (is_transfer(all[j], true) && same_transfer(all[j], all[i])) send_of[i] = j;
        if (send_of[i] < 0) continue;
        const dg_node *src = dg_node_input(all[send_of[i]], 0).node;
        if (src && is_ctrl_dummy(src)) {
            src = dg_node_control_input(src, 0);
            via_ctrl[i] = true;
        }
        producer[i] = src;
    }
    // Hidden: initializers by name (when asked), every _Send and control dummy (drawn as
    // edges), and a _Recv whose producer is hidden.
    for (int i = 0; i < total; i++) {
        const dg_node *n = all[i];
        if (is_transfer(n, true) || is_ctrl_dummy(n)) hidden[i] = true;
        else if (o->hide_init && !is_transfer(n, false)) hidden[i] = is_init_name(dg_node_name(n));
    }
    for (int i = 0; i < total; i++)
        if (is_transfer(all[i], false) && o->hide_init)
            hidden[i] = !producer[i] || is_init_name(dg_node_name(producer[i]));
    // Visible nodes.
    L.v = inspect_xcalloc((size_t)total, sizeof *L.v);
    for (int i = 0; i < total; i++) {
        vid[i] = -1;
        if (hidden[i]) continue;
        vid[i] = L.n_v++;
        // A _Recv shows what it yields: the tensor, or ^node for a control edge.
        char label[600];
        if (!is_transfer(all[i], false)) snprintf(label, sizeof label, "%s", dg_node_name(all[i]));
        else if (via_ctrl[i] && producer[i]) snprintf(label, sizeof label, "^%s", dg_node_name(producer[i]));
        else snprintf(label, sizeof label, "%s", attr_s(all[i], "tensor_name"));
        svg_layout_node_init(&L.v[vid[i]], all[i], part_of[i], label);
    }
    // Edges between visible nodes.
    int cap_e = 16;
    for (int i = 0; i < total; i++) cap_e += dg_node_num_inputs(all[i]) + dg_node_num_control_inputs(all[i]) + 1;
    L.e = inspect_xcalloc((size_t)cap_e, sizeof *L.e);
    for (int i = 0; i < total; i++) {
        if (vid[i] < 0) continue;
        const dg_node *n = all[i];
        for (int j = 0; j < dg_node_num_inputs(n); j++) {
            int s = pm_get(&pm, dg_node_input(n, j).node);
            if (s >= 0 && vid[s] >= 0) L.e[L.n_e++] = (svg_vedge){.from = vid[s], .to = vid[i], .kind = SVG_E_DATA};
        }
        for (int j = 0; j < dg_node_num_control_inputs(n); j++) {
            int s = pm_get(&pm, dg_node_control_input(n, j));
            if (s >= 0 && vid[s] >= 0 && s != i)
                L.e[L.n_e++] = (svg_vedge){.from = vid[s], .to = vid[i], .kind = SVG_E_CTRL};
        }
        if (is_transfer(n, false) && producer[i]) {
            int s = pm_get(&pm, producer[i]);
            if (s >= 0 && vid[s] >= 0) {
                svg_vedge e = {.from = vid[s], .to = vid[i], .kind = via_ctrl[i] ? SVG_E_XFER_CTRL : SVG_E_XFER};
                const char *t = attr_s(n, "tensor_name"), *pn = dg_node_name(producer[i]);
                size_t len = (via_ctrl[i] ? strlen(pn) + 1 : strlen(t)) + 1;
                e.label = inspect_xcalloc(len, 1);
                if (via_ctrl[i]) snprintf(e.label, len, "^%s", pn);
                else snprintf(e.label, len, "%s", t);
                L.e[L.n_e++] = e;
            }
        }
    }
    L.n_parts = np;
    devices = inspect_xcalloc((size_t)np + 1, sizeof *devices);
    for (int c = 0; c < np; c++) devices[c] = dg_partitions_device(p.parts, c);
    svg_layout_arrange(&L, devices);
    FILE *f = fopen(o->out, "w");
    if (!f) {
        fprintf(stderr, "dg-inspect: cannot write %s: %s\n", o->out, strerror(errno));
        goto out;
    }
    char title[512];
    snprintf(title, sizeof title, "%s placed on %s", o->file, o->cluster_spec);
    bool ok = svg_layout_write(f, &L, devices, title);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "dg-inspect: writing %s failed\n", o->out);
        goto out;
    }
    int n_x = 0;
    for (int i = 0; i < L.n_e; i++) n_x += L.e[i].kind >= SVG_E_XFER;
    printf("wrote %s: %d devices, %d of %d nodes drawn, %d Send/Recv edges, %.0fx%.0f px\n", o->out, np,
           L.n_v, total, n_x, L.width, L.height);
    rc = 0;
out:
    svg_layout_free(&L);
    free(devices);
    free(pm.keys);
    free(pm.vals);
    free(hidden);
    free(all);
    free(part_of);
    free(vid);
    free(send_of);
    free(producer);
    free(via_ctrl);
    placed_free(&p);
    return rc;
}