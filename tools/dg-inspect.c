/* dg-inspect: looks inside graph files (written by dg_graph_save, e.g. by dg-mlp-graph).
 *   dg-inspect graph FILE [--json]                 nodes: inputs, devices, output dtype/shape
 *   dg-inspect place FILE --cluster_spec SPEC      node -> device on SPEC's devices
 *   dg-inspect partition FILE --cluster_spec SPEC  per-device node lists and Send/Recv pairs
 *   dg-inspect svg FILE --cluster_spec SPEC -o OUT.svg
 * SPEC is "ps|h:1,h:2;worker|h:3"; every task has /device:CPU:0 and --gpus_per_task GPUs.
 * Errors print the status and exit 1; bad usage exits 2. Uses the public API only. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <distgraph/distgraph.h>

typedef struct options {
    const char *cmd, *file, *cluster_spec, *out;
    int gpus_per_task;
    bool json, soft_placement, hide_init;
} options;

static int usage(FILE *f) {
    fprintf(f,
            "usage: dg-inspect COMMAND FILE [options]\n"
            "commands:\n"
            "  graph FILE [--json]             list nodes: op, inputs, devices, outputs\n"
            "  place FILE --cluster_spec SPEC  place the graph on SPEC's devices\n"
            "  partition FILE --cluster_spec SPEC\n"
            "                                  per-device node lists and Send/Recv pairs\n"
            "  svg FILE --cluster_spec SPEC -o OUT.svg\n"
            "                                  draw the placed, partitioned graph\n"
            "options:\n"
            "  --cluster_spec SPEC   \"ps|host:port,host:port;worker|host:port\"\n"
            "  --gpus_per_task N     GPUs per task besides /device:CPU:0 (default 0)\n"
            "  --no_soft_placement   fail instead of falling back to another device\n"
            "  --json                JSON instead of a table (graph, place, partition)\n"
            "  -o, --output FILE     where svg writes\n"
            "  --show_init           svg: also draw initializers (hidden by default: nodes\n"
            "                        named */Initializer/*, */Assign and init)\n");
    return f == stdout ? 0 : 2;
}

static void die_status(const char *what, const dg_status *st) {
    fprintf(stderr, "dg-inspect: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "dg-inspect: out of memory\n");
        exit(1);
    }
    return p;
}

// ---- output helpers ----

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

static void xml_str(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) fputc('?', f);
            else fputc(*s, f);
        }
    }
}

// A growable string.
typedef struct sbuf {
    char *s;
    size_t n, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = realloc(b->s, b->cap);
        if (!b->s) {
            fprintf(stderr, "dg-inspect: out of memory\n");
            exit(1);
        }
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static const char *sb_str(sbuf *b) { return b->s ? b->s : ""; }

static void outputs_str(const dg_node *n, sbuf *b) {
    if (dg_node_num_outputs(n) == 0) sb_printf(b, "-");
    for (int i = 0; i < dg_node_num_outputs(n); i++) {
        char sh[160];
        dg_shape s = dg_node_output_shape(n, i);
        sb_printf(b, "%s%s%s", i ? " " : "", dg_dtype_name(dg_node_output_dtype(n, i)),
                  dg_shape_str(&s, sh, sizeof sh));
    }
}

static void inputs_str(const dg_node *n, sbuf *b) {
    for (int i = 0; i < dg_node_num_inputs(n); i++) {
        char buf[512];
        sb_printf(b, "%s%s", i ? ", " : "", dg_output_str(dg_node_input(n, i), buf, sizeof buf));
    }
    for (int i = 0; i < dg_node_num_control_inputs(n); i++)
        sb_printf(b, "%s^%s", i || dg_node_num_inputs(n) ? ", " : "", dg_node_name(dg_node_control_input(n, i)));
}

// Prints rows of n_cols cells as a table; the last column is not padded.
static void print_table(char ***rows, int n_rows, int n_cols) {
    size_t *w = xcalloc((size_t)n_cols, sizeof *w);
    for (int r = 0; r < n_rows; r++)
        for (int c = 0; c < n_cols; c++)
            if (strlen(rows[r][c]) > w[c]) w[c] = strlen(rows[r][c]);
    for (int r = 0; r < n_rows; r++) {
        for (int c = 0; c < n_cols; c++) {
            if (c == n_cols - 1) printf("%s", rows[r][c]);
            else printf("%-*s  ", (int)w[c], rows[r][c]);
        }
        printf("\n");
    }
    free(w);
}

static char *xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) {
        fprintf(stderr, "dg-inspect: out of memory\n");
        exit(1);
    }
    return d;
}

// ---- graph ----

static int cmd_graph(const options *o, dg_graph *g) {
    int n = dg_graph_num_nodes(g);
    if (o->json) {
        printf("[");
        for (int i = 0; i < n; i++) {
            const dg_node *nd = dg_graph_node(g, i);
            printf("%s\n  {\"name\": ", i ? "," : "");
            json_str(stdout, dg_node_name(nd));
            printf(", \"op\": ");
            json_str(stdout, dg_node_op_type(nd));
            printf(", \"inputs\": [");
            for (int k = 0; k < dg_node_num_inputs(nd); k++) {
                char buf[512];
                printf("%s", k ? ", " : "");
                json_str(stdout, dg_output_str(dg_node_input(nd, k), buf, sizeof buf));
            }
            printf("], \"control_inputs\": [");
            for (int k = 0; k < dg_node_num_control_inputs(nd); k++) {
                printf("%s", k ? ", " : "");
                json_str(stdout, dg_node_name(dg_node_control_input(nd, k)));
            }
            printf("], \"colocation\": [");
            for (int k = 0; k < dg_node_num_colocations(nd); k++) {
                printf("%s", k ? ", " : "");
                json_str(stdout, dg_node_colocation(nd, k));
            }
            printf("], \"requested_device\": ");
            json_str(stdout, dg_node_requested_device(nd));
            printf(", \"assigned_device\": ");
            json_str(stdout, dg_node_assigned_device(nd));
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
    char ***rows = xcalloc((size_t)n + 1, sizeof *rows);
    static const char *const head[NC] = {"#", "name", "op", "outputs", "requested device",
                                         "assigned device", "inputs (^control)"};
    rows[0] = xcalloc(NC, sizeof **rows);
    for (int c = 0; c < NC; c++) rows[0][c] = xstrdup(head[c]);
    for (int i = 0; i < n; i++) {
        const dg_node *nd = dg_graph_node(g, i);
        char **r = rows[i + 1] = xcalloc(NC, sizeof **rows);
        char num[32];
        snprintf(num, sizeof num, "%d", i);
        sbuf outs = {0}, ins = {0};
        outputs_str(nd, &outs);
        inputs_str(nd, &ins);
        r[0] = xstrdup(num);
        r[1] = xstrdup(dg_node_name(nd));
        r[2] = xstrdup(dg_node_op_type(nd));
        r[3] = xstrdup(sb_str(&outs));
        r[4] = xstrdup(*dg_node_requested_device(nd) ? dg_node_requested_device(nd) : "-");
        r[5] = xstrdup(*dg_node_assigned_device(nd) ? dg_node_assigned_device(nd) : "-");
        r[6] = xstrdup(sb_str(&ins));
        free(outs.s);
        free(ins.s);
    }
    print_table(rows, n + 1, NC);
    for (int i = 0; i <= n; i++) {
        for (int c = 0; c < NC; c++) free(rows[i][c]);
        free(rows[i]);
    }
    free(rows);
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
} placed;

static void placed_free(placed *p) {
    dg_partitions_free(&p->parts);
    if (p->devices) dg_device_list_free(p->devices, p->n_devices);
    dg_cluster_free(&p->cluster);
    free(p->nodes);
}

static bool place(const options *o, dg_graph *g, placed *p, bool partition, dg_status *st) {
    memset(p, 0, sizeof *p);
    if (!o->cluster_spec) {
        fprintf(stderr, "dg-inspect: %s needs --cluster_spec\n", o->cmd);
        return false;
    }
    p->cluster = dg_cluster_from_spec_string(o->cluster_spec, st);
    if (!p->cluster) {
        die_status("--cluster_spec", st);
        return false;
    }
    p->n_devices = dg_cluster_devices(p->cluster, o->gpus_per_task, &p->devices, st);
    if (p->n_devices < 0) {
        p->n_devices = 0;
        die_status("cluster devices", st);
        return false;
    }
    p->n_nodes = dg_graph_num_nodes(g);
    p->nodes = xcalloc((size_t)p->n_nodes, sizeof *p->nodes);
    for (int i = 0; i < p->n_nodes; i++) p->nodes[i] = dg_graph_node(g, i);
    dg_placement_options po = dg_placement_options_default();
    po.allow_soft_placement = o->soft_placement;
    if (!dg_place(p->nodes, p->n_nodes, (const char *const *)p->devices, p->n_devices, &po, st)) {
        die_status("placing", st);
        return false;
    }
    if (!partition) return true;
    p->parts = dg_partition(p->nodes, p->n_nodes, NULL, 0, 1, st);
    if (!p->parts) {
        die_status("partitioning", st);
        return false;
    }
    return true;
}

static int cmd_place(const options *o, dg_graph *g, dg_status *st) {
    placed p;
    int rc = 1;
    if (!place(o, g, &p, false, st)) goto out;
    if (o->json) {
        printf("{");
        for (int i = 0; i < p.n_nodes; i++) {
            printf("%s\n  ", i ? "," : "");
            json_str(stdout, dg_node_name(p.nodes[i]));
            printf(": ");
            json_str(stdout, dg_node_assigned_device(p.nodes[i]));
        }
        printf("%s}\n", p.n_nodes ? "\n" : "");
    } else {
        char ***rows = xcalloc((size_t)p.n_nodes, sizeof *rows);
        for (int i = 0; i < p.n_nodes; i++) {
            rows[i] = xcalloc(4, sizeof **rows);
            rows[i][0] = xstrdup(dg_node_name(p.nodes[i]));
            rows[i][1] = xstrdup(dg_node_op_type(p.nodes[i]));
            rows[i][2] = xstrdup("->");
            rows[i][3] = xstrdup(dg_node_assigned_device(p.nodes[i]));
        }
        print_table(rows, p.n_nodes, 4);
        for (int i = 0; i < p.n_nodes; i++) {
            for (int c = 0; c < 4; c++) free(rows[i][c]);
            free(rows[i]);
        }
        free(rows);
        printf("%d nodes placed on %d devices\n", p.n_nodes, p.n_devices);
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

static int cmd_partition(const options *o, dg_graph *g, dg_status *st) {
    placed p;
    int rc = 1;
    if (!place(o, g, &p, true, st)) goto out;
    int np = dg_partitions_count(p.parts);
    if (o->json) {
        printf("{\"devices\": [");
        for (int i = 0; i < np; i++) {
            dg_graph *pg = dg_partitions_graph(p.parts, i);
            printf("%s\n  {\"device\": ", i ? "," : "");
            json_str(stdout, dg_partitions_device(p.parts, i));
            printf(", \"nodes\": [");
            for (int k = 0; k < dg_graph_num_nodes(pg); k++) {
                const dg_node *n = dg_graph_node(pg, k);
                printf("%s{\"name\": ", k ? ", " : "");
                json_str(stdout, dg_node_name(n));
                printf(", \"op\": ");
                json_str(stdout, dg_node_op_type(n));
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
                json_str(stdout, attr_s(n, "tensor_name"));
                printf(", \"from\": ");
                json_str(stdout, attr_s(n, "send_device"));
                printf(", \"to\": ");
                json_str(stdout, attr_s(n, "recv_device"));
                printf(", \"send\": ");
                json_str(stdout, dg_node_name(n));
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
    m->keys = xcalloc(m->cap, sizeof *m->keys);
    m->vals = xcalloc(m->cap, sizeof *m->vals);
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

enum { K_OTHER, K_VARIABLE, K_RECV, K_UPDATE, K_GRADIENT, K_INPUT, K_CONST, N_KINDS };
static const char *const kind_fill[N_KINDS] = {"#ffffff", "#fff2cc", "#fde0c5", "#d5e8d4",
                                                "#dae8fc", "#e1d5e7", "#f2f2f2"};
static const char *const kind_stroke[N_KINDS] = {"#666666", "#b7950b", "#e6550d", "#5d9b4f",
                                                  "#5b7fb5", "#8e6aa3", "#999999"};
static const char *const kind_name[N_KINDS] = {"op", "variable", "_Recv", "variable update",
                                                "gradient", "placeholder", "constant"};

#define MAX_LINES 4
#define LINE_CHARS 26
#define CHAR_W 6.7    // monospace at 11px
#define LINE_H 13.0
#define NODE_GAP 14.0
#define ROW_GAP 44.0
#define COL_GAP 150.0
#define COL_PAD 16.0
#define TITLE_H 34.0
#define MAX_ROW_W 900.0   // a layer's nodes wrap onto more lines past this width

enum { E_DATA, E_CTRL, E_XFER, E_XFER_CTRL, N_EDGE_KINDS };
static const char *const edge_style[N_EDGE_KINDS] = {
    "stroke=\"#555\" stroke-width=\"1.1\"",
    "stroke=\"#aaa\" stroke-width=\"0.9\" stroke-dasharray=\"2,3\"",
    "stroke=\"#e6550d\" stroke-width=\"2\" stroke-dasharray=\"8,4\"",
    "stroke=\"#fd8d3c\" stroke-width=\"1.4\" stroke-dasharray=\"3,3\""};
static const char *const edge_marker[N_EDGE_KINDS] = {"arrow-data", "arrow-ctrl", "arrow-xfer",
                                                       "arrow-xfer-ctrl"};
static const char *const edge_color[N_EDGE_KINDS] = {"#555", "#aaa", "#e6550d", "#fd8d3c"};
static const char *const edge_name[N_EDGE_KINDS] = {"data", "control", "Send/Recv: tensor",
                                                     "Send/Recv: control"};

typedef struct vnode {
    const dg_node *n;
    int part, layer, order;
    int subline;   // long rows wrap onto several lines within their layer
    int kind;
    char lines[MAX_LINES][LINE_CHARS + 4];
    int n_lines;   // name lines; the op goes on one more
    double w, h, x, y;   // x, y: top-left
    double key;
} vnode;

typedef struct vedge {
    int from, to;
    int kind;
    char *label;   // owned; Send/Recv edges only
    double pts[6][2];   // Send/Recv edges: the corners of their route
} vedge;

typedef struct layout {
    vnode *v;
    int n_v;
    vedge *e;
    int n_e;
    int n_parts, n_layers;
    int *col_of;          // partition -> column
    double *col_x, *col_w, *row_y, *row_h;   // by column / by row
    double width, height;
} layout;

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

static int node_kind(const dg_node *n) {
    const char *op = dg_node_op_type(n);
    if (strcmp(op, "VariableV2") == 0) return K_VARIABLE;
    if (strcmp(op, "_Recv") == 0) return K_RECV;
    if (strncmp(op, "Apply", 5) == 0 || strncmp(op, "Assign", 6) == 0) return K_UPDATE;
    if (strncmp(dg_node_name(n), "gradients/", 10) == 0) return K_GRADIENT;
    if (strcmp(op, "Placeholder") == 0) return K_INPUT;
    if (strcmp(op, "Const") == 0) return K_CONST;
    return K_OTHER;
}

// Splits text at '/' into lines of at most LINE_CHARS; keeps the last MAX_LINES - 1 lines
// (the op takes one more), marking a cut with "...".
static void wrap_label(vnode *v, const char *text) {
    char lines[64][LINE_CHARS + 4];
    int n = 0;
    lines[0][0] = 0;
    const char *p = text;
    while (*p && n < 63) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) + 1 : strlen(p);
        size_t cur = strlen(lines[n]);
        if (cur + len <= LINE_CHARS) {
            memcpy(lines[n] + cur, p, len);
            lines[n][cur + len] = 0;
            p += len;
        } else if (cur == 0) {
            memcpy(lines[n], p, LINE_CHARS);
            lines[n][LINE_CHARS] = 0;
            p += LINE_CHARS;
            lines[++n][0] = 0;
        } else {
            lines[++n][0] = 0;
        }
    }
    if (lines[n][0]) n++;
    int keep = n < MAX_LINES - 1 ? n : MAX_LINES - 1, first = n - keep;
    v->n_lines = keep;
    for (int i = 0; i < keep; i++) {
        if (i == 0 && first > 0) snprintf(v->lines[i], sizeof v->lines[i], "...%.*s", LINE_CHARS - 3, lines[first]);
        else snprintf(v->lines[i], sizeof v->lines[i], "%s", lines[first + i]);
    }
}

// Sort helper: indices by vnode key, then by current order.
static vnode *sort_nodes;
static int cmp_idx(const void *a, const void *b) {
    const vnode *x = &sort_nodes[*(const int *)a], *y = &sort_nodes[*(const int *)b];
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

// Places the nodes of each (partition, row) cell left to right in array order, centred in
// the column.
static void place_x(layout *L, int **cells, const int *cell_n) {
    for (int c = 0; c < L->n_parts; c++)
        for (int r = 0; r < L->n_layers; r++) {
            const int *ids = cells[c * L->n_layers + r];
            int k = cell_n[c * L->n_layers + r];
            int col = L->col_of[c];
            for (int i = 0, line = 0; i < k; line++) {
                // Greedy lines no wider than the column; each line centred.
                int j = i;
                double total = L->v[ids[j++]].w;
                while (j < k && total + NODE_GAP + L->v[ids[j]].w <= L->col_w[col]) total += NODE_GAP + L->v[ids[j++]].w;
                double x = L->col_x[col] + COL_PAD + (L->col_w[col] - total) / 2;
                for (; i < j; i++) {
                    L->v[ids[i]].x = x;
                    L->v[ids[i]].order = i;
                    L->v[ids[i]].subline = line;
                    x += L->v[ids[i]].w + NODE_GAP;
                }
            }
        }
}

// Columns: the order of devices that keeps heavily connected devices next to each other
// (fewest Send/Recv edges crossing another device's box), by trying every order up to 7
// devices; ties keep the sorted device order.
static void order_columns(layout *L) {
    int n = L->n_parts;
    for (int i = 0; i < n; i++) L->col_of[i] = i;
    if (n < 3 || n > 7) return;
    int *w = xcalloc((size_t)(n * n), sizeof *w);
    for (int k = 0; k < L->n_e; k++)
        if (L->e[k].kind >= E_XFER) {
            int a = L->v[L->e[k].from].part, b = L->v[L->e[k].to].part;
            w[a * n + b]++;
            w[b * n + a]++;
        }
    int perm[7], best[7];
    long best_cost = -1;
    for (int i = 0; i < n; i++) perm[i] = i;
    for (;;) {
        long cost = 0;
        for (int a = 0; a < n; a++)
            for (int b = a + 1; b < n; b++) cost += (long)w[a * n + b] * labs((long)(perm[a] - perm[b]));
        if (best_cost < 0 || cost < best_cost) {
            best_cost = cost;
            memcpy(best, perm, sizeof perm);
        }
        // Next permutation (lexicographic).
        int i = n - 2;
        while (i >= 0 && perm[i] >= perm[i + 1]) i--;
        if (i < 0) break;
        int j = n - 1;
        while (perm[j] <= perm[i]) j--;
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        for (int a = i + 1, b = n - 1; a < b; a++, b--) {
            t = perm[a];
            perm[a] = perm[b];
            perm[b] = t;
        }
    }
    for (int i = 0; i < n; i++) L->col_of[i] = best[i];
    free(w);
}

static void layout_graph(layout *L) {
    int n = L->n_v;
    // Layers: longest path over every edge, Send/Recv included, so a device's nodes line up
    // with what they wait for on other devices. Kahn's order; a node left on a control cycle
    // is taken in index order.
    int *indeg = xcalloc((size_t)n, sizeof *indeg), *queue = xcalloc((size_t)n + 1, sizeof *queue);
    int *out_start = xcalloc((size_t)n + 1, sizeof *out_start), *out = xcalloc((size_t)L->n_e + 1, sizeof *out);
    int *fill = xcalloc((size_t)n, sizeof *fill), *left = xcalloc((size_t)n, sizeof *left);
    bool *done = xcalloc((size_t)n, sizeof *done);
    for (int i = 0; i < L->n_e; i++) {
        indeg[L->e[i].to]++;
        out_start[L->e[i].from + 1]++;
    }
    for (int i = 0; i < n; i++) out_start[i + 1] += out_start[i];
    for (int i = 0; i < L->n_e; i++) out[out_start[L->e[i].from] + fill[L->e[i].from]++] = L->e[i].to;
    memcpy(left, indeg, (size_t)n * sizeof *left);
    int head = 0, tail = 0, n_done = 0, next_forced = 0;
    for (int i = 0; i < n; i++) {
        L->v[i].layer = 0;
        if (left[i] == 0) queue[tail++] = i;
    }
    while (n_done < n) {
        if (head == tail) {
            while (done[next_forced]) next_forced++;
            head = tail = 0;
            queue[tail++] = next_forced;
        }
        int u = queue[head++];
        if (done[u]) continue;
        done[u] = true;
        n_done++;
        for (int k = out_start[u]; k < out_start[u + 1]; k++) {
            int w = out[k];
            if (done[w]) continue;
            if (L->v[w].layer < L->v[u].layer + 1) L->v[w].layer = L->v[u].layer + 1;
            if (--left[w] == 0) queue[tail++] = w;
        }
    }
    // Sources sit just above their first consumer.
    for (int u = 0; u < n; u++) {
        if (indeg[u] != 0 || out_start[u] == out_start[u + 1]) continue;
        int m = -1;
        for (int k = out_start[u]; k < out_start[u + 1]; k++)
            if (m < 0 || L->v[out[k]].layer < m) m = L->v[out[k]].layer;
        if (m - 1 > L->v[u].layer) L->v[u].layer = m - 1;
    }
    // Drop empty layers.
    int max_layer = 0;
    for (int i = 0; i < n; i++)
        if (L->v[i].layer > max_layer) max_layer = L->v[i].layer;
    int *remap = xcalloc((size_t)max_layer + 1, sizeof *remap);
    for (int i = 0; i < n; i++) remap[L->v[i].layer] = 1;
    int n_layers = 0;
    for (int l = 0; l <= max_layer; l++) remap[l] = remap[l] ? n_layers++ : -1;
    for (int i = 0; i < n; i++) L->v[i].layer = remap[L->v[i].layer];
    L->n_layers = n_layers ? n_layers : 1;
    free(remap);

    // Cells (partition x row) in index order.
    int n_cells = L->n_parts * L->n_layers;
    int *cell_n = xcalloc((size_t)n_cells, sizeof *cell_n);
    int **cells = xcalloc((size_t)n_cells, sizeof *cells);
    for (int i = 0; i < n; i++) cell_n[L->v[i].part * L->n_layers + L->v[i].layer]++;
    for (int c = 0; c < n_cells; c++) cells[c] = xcalloc((size_t)cell_n[c] + 1, sizeof **cells);
    memset(cell_n, 0, (size_t)n_cells * sizeof *cell_n);
    for (int i = 0; i < n; i++) {
        int c = L->v[i].part * L->n_layers + L->v[i].layer;
        cells[c][cell_n[c]++] = i;
    }
    // Column widths from the widest row; row heights from the tallest node.
    for (int c = 0; c < L->n_parts; c++)
        for (int r = 0; r < L->n_layers; r++) {
            double total = 0;
            for (int i = 0; i < cell_n[c * L->n_layers + r]; i++)
                total += L->v[cells[c * L->n_layers + r][i]].w + (i ? NODE_GAP : 0);
            if (total > MAX_ROW_W) total = MAX_ROW_W;
            for (int i = 0; i < cell_n[c * L->n_layers + r]; i++)   // the widest node always fits
                if (L->v[cells[c * L->n_layers + r][i]].w > total) total = L->v[cells[c * L->n_layers + r][i]].w;
            if (total > L->col_w[L->col_of[c]]) L->col_w[L->col_of[c]] = total;
        }
    double x = 20;
    for (int col = 0; col < L->n_parts; col++) {
        L->col_x[col] = x;
        x += L->col_w[col] + 2 * COL_PAD + COL_GAP;
    }
    L->width = x - COL_GAP + 20;
    // Barycentre sweeps, alternately down and up, to cut crossings.
    place_x(L, cells, cell_n);
    sort_nodes = L->v;
    int *cnt = xcalloc((size_t)n, sizeof *cnt);
    double *sum = xcalloc((size_t)n, sizeof *sum);
    for (int sweep = 0; sweep < 12; sweep++) {
        bool down = sweep % 2 == 0;
        memset(cnt, 0, (size_t)n * sizeof *cnt);
        memset(sum, 0, (size_t)n * sizeof *sum);
        for (int k = 0; k < L->n_e; k++) {
            int at = down ? L->e[k].to : L->e[k].from, nb = down ? L->e[k].from : L->e[k].to;
            sum[at] += L->v[nb].x + L->v[nb].w / 2;
            cnt[at]++;
        }
        for (int i = 0; i < n; i++) L->v[i].key = cnt[i] ? sum[i] / cnt[i] : L->v[i].x + L->v[i].w / 2;
        for (int c = 0; c < n_cells; c++) qsort(cells[c], (size_t)cell_n[c], sizeof **cells, cmp_idx);
        place_x(L, cells, cell_n);
    }
    free(cnt);
    free(sum);
    // Rows: each wrapped line as tall as its tallest node; a layer as tall as its tallest cell.
    double *line_h = xcalloc((size_t)n + 1, sizeof *line_h), *line_y = xcalloc((size_t)n + 1, sizeof *line_y);
    double y = 20 + TITLE_H;
    for (int r = 0; r < L->n_layers; r++) {
        L->row_y[r] = y;
        L->row_h[r] = 0;
        for (int c = 0; c < L->n_parts; c++) {
            int *ids = cells[c * L->n_layers + r], k = cell_n[c * L->n_layers + r];
            for (int i = 0; i < k; i++) line_h[i] = 0;
            for (int i = 0; i < k; i++)
                if (L->v[ids[i]].h > line_h[L->v[ids[i]].subline]) line_h[L->v[ids[i]].subline] = L->v[ids[i]].h;
            double h = 0;
            for (int i = 0; i < k; i++) {
                line_y[i] = h;
                if (line_h[i] > 0) h += line_h[i] + 12;
            }
            h -= k ? 12 : 0;
            for (int i = 0; i < k; i++) {
                vnode *v = &L->v[ids[i]];
                v->y = y + line_y[v->subline] + (line_h[v->subline] - v->h) / 2;
            }
            if (h > L->row_h[r]) L->row_h[r] = h;
        }
        y += L->row_h[r] + ROW_GAP;
    }
    L->height = y;
    free(line_h);
    free(line_y);
    for (int c = 0; c < n_cells; c++) free(cells[c]);
    free(cells);
    free(cell_n);
    free(indeg);
    free(queue);
    free(out_start);
    free(out);
    free(done);
    free(fill);
    free(left);
}

// Send/Recv edges run in the gaps, so they never cross a node: down from the producer into
// the gap under its row, along it to the corridor between its device and the next one toward
// the _Recv, down the corridor to the gap above the _Recv's row, along it, and down into the
// _Recv. Each edge gets its own lane in every gap and corridor it uses.
static void route_transfers(layout *L) {
    int nb = L->n_layers, nc = L->n_parts;
    int *band_n = xcalloc((size_t)nb + 1, sizeof *band_n), *band_i = xcalloc((size_t)nb + 1, sizeof *band_i);
    int *corr_n = xcalloc((size_t)nc + 1, sizeof *corr_n), *corr_i = xcalloc((size_t)nc + 1, sizeof *corr_i);
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < L->n_e; k++) {
            vedge *e = &L->e[k];
            if (e->kind < E_XFER) continue;
            const vnode *a = &L->v[e->from], *b = &L->v[e->to];
            int ca = L->col_of[a->part], cb = L->col_of[b->part];
            int out_band = a->layer, in_band = b->layer > 0 ? b->layer - 1 : 0;
            int corr = cb > ca ? ca : ca - 1;
            if (corr < 0) corr = 0;
            if (pass == 0) {
                band_n[out_band]++;
                if (in_band != out_band) band_n[in_band]++;
                corr_n[corr]++;
                continue;
            }
            // Lane positions: evenly spread over the gap (bands) and the corridor.
            double top_out = L->row_y[out_band] + L->row_h[out_band];
            double sp_out = (ROW_GAP - 12) / (band_n[out_band] > 1 ? band_n[out_band] - 1 : 1);
            if (sp_out > 6) sp_out = 6;
            double y_out = top_out + 6 + sp_out * band_i[out_band]++;
            double y_in = y_out;
            if (in_band != out_band) {
                double top_in = L->row_y[in_band] + L->row_h[in_band];
                double sp_in = (ROW_GAP - 12) / (band_n[in_band] > 1 ? band_n[in_band] - 1 : 1);
                if (sp_in > 6) sp_in = 6;
                y_in = top_in + 6 + sp_in * band_i[in_band]++;
            }
            double corr_left = L->col_x[corr] + L->col_w[corr] + 2 * COL_PAD;
            double sp_c = (COL_GAP - 30) / (corr_n[corr] > 1 ? corr_n[corr] - 1 : 1);
            if (sp_c > 8) sp_c = 8;
            double x_c = corr_left + 15 + sp_c * corr_i[corr]++;
            double xa = a->x + a->w / 2, xb = b->x + b->w / 2;
            double pts[6][2] = {{xa, a->y + a->h}, {xa, y_out}, {x_c, y_out}, {x_c, y_in}, {xb, y_in}, {xb, b->y}};
            memcpy(e->pts, pts, sizeof pts);
        }
    free(band_n);
    free(band_i);
    free(corr_n);
    free(corr_i);
}

static void svg_edge(FILE *f, const layout *L, const vedge *e) {
    const vnode *a = &L->v[e->from], *b = &L->v[e->to];
    if (e->kind >= E_XFER) {
        // The route's corners rounded off with quadratic curves.
        fprintf(f, "<path d=\"M%.1f,%.1f", e->pts[0][0], e->pts[0][1]);
        for (int i = 1; i < 5; i++) {
            double px = e->pts[i][0], py = e->pts[i][1];
            double ix = e->pts[i - 1][0] - px, iy = e->pts[i - 1][1] - py;
            double ox = e->pts[i + 1][0] - px, oy = e->pts[i + 1][1] - py;
            double li = sqrt(ix * ix + iy * iy), lo = sqrt(ox * ox + oy * oy);
            double r = 6;
            if (li / 2 < r) r = li / 2;
            if (lo / 2 < r) r = lo / 2;
            if (li < 1e-6 || lo < 1e-6) continue;
            fprintf(f, " L%.1f,%.1f Q%.1f,%.1f %.1f,%.1f", px + ix / li * r, py + iy / li * r, px, py,
                    px + ox / lo * r, py + oy / lo * r);
        }
        fprintf(f, " L%.1f,%.1f\" fill=\"none\" %s marker-end=\"url(#%s)\"/>\n", e->pts[5][0], e->pts[5][1],
                edge_style[e->kind], edge_marker[e->kind]);
        return;
    }
    double x1 = a->x + a->w / 2, y1 = a->y + a->h, x2 = b->x + b->w / 2, y2 = b->y;
    double dy = (y2 - y1) / 2;
    if (dy < 20) dy = 20;
    fprintf(f, "<path d=\"M%.1f,%.1f C%.1f,%.1f %.1f,%.1f %.1f,%.1f\" fill=\"none\" %s "
               "marker-end=\"url(#%s)\"/>\n", x1, y1, x1, y1 + dy, x2, y2 - dy, x2, y2, edge_style[e->kind],
            edge_marker[e->kind]);
}

static bool rect_overlap(const double a[4], const double b[4]) {
    return a[0] < b[0] + b[2] && b[0] < a[0] + a[2] && a[1] < b[1] + b[3] && b[1] < a[1] + a[3];
}

// Labels of Send/Recv edges sit on the last horizontal run, before the edge drops into its
// _Recv: at the first spot along it (from the middle out) that covers no node and no label.
static void svg_edge_labels(FILE *f, const layout *L) {
    static const double ts[] = {0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.1, 0.9, 0.0, 1.0};
    double (*placed)[4] = xcalloc((size_t)L->n_e + 1, sizeof *placed);
    int n_placed = 0;
    for (int i = 0; i < L->n_e; i++) {
        const vedge *e = &L->e[i];
        if (e->kind < E_XFER) continue;
        double r[4] = {0, 0, (double)strlen(e->label) * 6.1 + 8, 13}, best[4];
        double x0 = e->pts[3][0], x1 = e->pts[4][0], y = e->pts[4][1];
        bool found = false;
        for (size_t k = 0; k < sizeof ts / sizeof ts[0] && !found; k++) {
            double x = x0 + (x1 - x0) * ts[k];
            r[0] = x - r[2] / 2;
            r[1] = y - 6.5;
            if (k == 0) memcpy(best, r, sizeof best);
            bool clear = true;
            for (int j = 0; j < L->n_v && clear; j++) {
                double nr[4] = {L->v[j].x - 2, L->v[j].y - 2, L->v[j].w + 4, L->v[j].h + 4};
                clear = !rect_overlap(r, nr);
            }
            for (int j = 0; j < n_placed && clear; j++) clear = !rect_overlap(r, placed[j]);
            if (clear) {
                memcpy(best, r, sizeof best);
                found = true;
            }
        }
        memcpy(placed[n_placed++], best, sizeof best);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"13\" rx=\"3\" fill=\"#ffffff\" "
                   "stroke=\"%s\" stroke-width=\"0.8\"/>\n", best[0], best[1], best[2], edge_color[e->kind]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\" fill=\"#a63603\">",
                best[0] + best[2] / 2, best[1] + 9.8);
        xml_str(f, e->label);
        fprintf(f, "</text>\n");
    }
    free(placed);
}

static void svg_node(FILE *f, const vnode *v) {
    fprintf(f, "<g><title>");
    xml_str(f, dg_node_name(v->n));
    fprintf(f, " (");
    xml_str(f, dg_node_op_type(v->n));
    fprintf(f, ")</title>\n");
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"7\" fill=\"%s\" stroke=\"%s\" "
               "stroke-width=\"1.2\"/>\n", v->x, v->y, v->w, v->h, kind_fill[v->kind], kind_stroke[v->kind]);
    double cx = v->x + v->w / 2, y = v->y + 5 + LINE_H - 3;
    for (int i = 0; i < v->n_lines; i++, y += LINE_H) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" fill=\"#111\">", cx, y);
        xml_str(f, v->lines[i]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\" fill=\"#666\" "
               "font-style=\"italic\">", cx, y);
    xml_str(f, dg_node_op_type(v->n));
    fprintf(f, "</text></g>\n");
}

static bool write_svg(FILE *f, const layout *L, const placed *p, const char *title) {
    double legend_h = 36;
    double W = L->width < 900 ? 900 : L->width, H = L->height + legend_h;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\">\n", W, H, W, H);
    fprintf(f, "<title>");
    xml_str(f, title);
    fprintf(f, "</title>\n<defs>\n");
    for (int k = 0; k < N_EDGE_KINDS; k++)
        fprintf(f, "<marker id=\"%s\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"%d\" "
                   "markerHeight=\"%d\" markerUnits=\"userSpaceOnUse\" orient=\"auto\">"
                   "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"%s\"/></marker>\n",
                edge_marker[k], k >= E_XFER ? 11 : 8, k >= E_XFER ? 11 : 8, edge_color[k]);
    fprintf(f, "</defs>\n<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, H);
    // One box per device.
    for (int c = 0; c < L->n_parts; c++) {
        int col = L->col_of[c];
        double x = L->col_x[col], w = L->col_w[col] + 2 * COL_PAD;
        fprintf(f, "<g><rect x=\"%.1f\" y=\"10\" width=\"%.1f\" height=\"%.1f\" rx=\"10\" fill=\"#f7f7f7\" "
                   "stroke=\"#444\" stroke-width=\"1.5\"/>\n", x, w, L->height - 20);
        fprintf(f, "<text x=\"%.1f\" y=\"32\" font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\" "
                   "fill=\"#222\">", x + w / 2);
        xml_str(f, dg_partitions_device(p->parts, c));
        fprintf(f, "</text></g>\n");
    }
    static const int edge_order[N_EDGE_KINDS] = {E_CTRL, E_DATA, E_XFER_CTRL, E_XFER};
    for (int k = 0; k < N_EDGE_KINDS; k++)
        for (int i = 0; i < L->n_e; i++)
            if (L->e[i].kind == edge_order[k]) svg_edge(f, L, &L->e[i]);
    for (int i = 0; i < L->n_v; i++) svg_node(f, &L->v[i]);
    svg_edge_labels(f, L);
    // Legend.
    double x = 20, y = L->height + 6;
    for (int k = 0; k < N_KINDS; k++) {
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"22\" height=\"14\" rx=\"4\" fill=\"%s\" stroke=\"%s\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#333\">%s</text>\n",
                x, y, kind_fill[k], kind_stroke[k], x + 27, y + 11, kind_name[k]);
        x += 40 + CHAR_W * (double)strlen(kind_name[k]);
    }
    for (int k = 0; k < N_EDGE_KINDS; k++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" %s marker-end=\"url(#%s)\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#333\">%s</text>\n",
                x, y + 7, x + 34, y + 7, edge_style[k], edge_marker[k], x + 40, y + 11, edge_name[k]);
        x += 56 + CHAR_W * (double)strlen(edge_name[k]);
    }
    fprintf(f, "</svg>\n");
    return !ferror(f);
}

static bool same_transfer(const dg_node *send, const dg_node *recv) {
    return strcmp(attr_s(send, "tensor_name"), attr_s(recv, "tensor_name")) == 0 &&
           strcmp(attr_s(send, "send_device"), attr_s(recv, "send_device")) == 0 &&
           strcmp(attr_s(send, "recv_device"), attr_s(recv, "recv_device")) == 0;
}

// The SVG shows the partitions as the devices will run them, with the partitioner's helper
// nodes folded into edges: a _Send becomes the dashed edge from the tensor's producer to its
// _Recv, and a control dummy (plus its _Send) the dotted edge from the control source.
static int cmd_svg(const options *o, dg_graph *g, dg_status *st) {
    if (!o->out) {
        fprintf(stderr, "dg-inspect: svg needs -o OUT.svg\n");
        return 2;
    }
    placed p;
    int rc = 1;
    layout L;
    memset(&L, 0, sizeof L);
    ptrmap pm = {0};
    bool *hidden = NULL;
    const dg_node **all = NULL, **producer = NULL;
    int *part_of = NULL, *vid = NULL, *send_of = NULL;
    bool *via_ctrl = NULL;
    if (!place(o, g, &p, true, st)) goto out;
    int np = dg_partitions_count(p.parts), total = 0;
    for (int i = 0; i < np; i++) total += dg_graph_num_nodes(dg_partitions_graph(p.parts, i));
    all = xcalloc((size_t)total, sizeof *all);
    part_of = xcalloc((size_t)total, sizeof *part_of);
    hidden = xcalloc((size_t)total, sizeof *hidden);
    send_of = xcalloc((size_t)total, sizeof *send_of);
    producer = xcalloc((size_t)total, sizeof *producer);
    via_ctrl = xcalloc((size_t)total, sizeof *via_ctrl);
    vid = xcalloc((size_t)total, sizeof *vid);
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
    L.v = xcalloc((size_t)total, sizeof *L.v);
    for (int i = 0; i < total; i++) {
        vid[i] = -1;
        if (hidden[i]) continue;
        vnode *v = &L.v[L.n_v];
        vid[i] = L.n_v++;
        v->n = all[i];
        v->part = part_of[i];
        v->kind = node_kind(all[i]);
        if (is_transfer(all[i], false)) {
            // A _Recv shows what it yields: the tensor, or ^node for a control edge.
            char label[600];
            if (via_ctrl[i] && producer[i]) snprintf(label, sizeof label, "^%s", dg_node_name(producer[i]));
            else snprintf(label, sizeof label, "%s", attr_s(all[i], "tensor_name"));
            wrap_label(v, label);
        } else {
            wrap_label(v, dg_node_name(all[i]));
        }
        size_t wmax = strlen(dg_node_op_type(all[i]));
        for (int l = 0; l < v->n_lines; l++)
            if (strlen(v->lines[l]) > wmax) wmax = strlen(v->lines[l]);
        v->w = (double)wmax * CHAR_W + 18;
        if (v->w < 64) v->w = 64;
        v->h = (v->n_lines + 1) * LINE_H + 10;
    }
    // Edges between visible nodes.
    int cap_e = 16;
    for (int i = 0; i < total; i++) cap_e += dg_node_num_inputs(all[i]) + dg_node_num_control_inputs(all[i]) + 1;
    L.e = xcalloc((size_t)cap_e, sizeof *L.e);
    for (int i = 0; i < total; i++) {
        if (vid[i] < 0) continue;
        const dg_node *n = all[i];
        for (int j = 0; j < dg_node_num_inputs(n); j++) {
            int s = pm_get(&pm, dg_node_input(n, j).node);
            if (s >= 0 && vid[s] >= 0) L.e[L.n_e++] = (vedge){.from = vid[s], .to = vid[i], .kind = E_DATA};
        }
        for (int j = 0; j < dg_node_num_control_inputs(n); j++) {
            int s = pm_get(&pm, dg_node_control_input(n, j));
            if (s >= 0 && vid[s] >= 0 && s != i) L.e[L.n_e++] = (vedge){.from = vid[s], .to = vid[i], .kind = E_CTRL};
        }
        if (is_transfer(n, false) && producer[i]) {
            int s = pm_get(&pm, producer[i]);
            if (s >= 0 && vid[s] >= 0) {
                vedge e = {.from = vid[s], .to = vid[i], .kind = via_ctrl[i] ? E_XFER_CTRL : E_XFER};
                const char *t = attr_s(n, "tensor_name"), *pn = dg_node_name(producer[i]);
                size_t len = (via_ctrl[i] ? strlen(pn) + 1 : strlen(t)) + 1;
                e.label = xcalloc(len, 1);
                if (via_ctrl[i]) snprintf(e.label, len, "^%s", pn);
                else snprintf(e.label, len, "%s", t);
                L.e[L.n_e++] = e;
            }
        }
    }
    L.n_parts = np;
    L.col_of = xcalloc((size_t)np + 1, sizeof *L.col_of);
    L.col_x = xcalloc((size_t)np + 1, sizeof *L.col_x);
    L.col_w = xcalloc((size_t)np + 1, sizeof *L.col_w);
    order_columns(&L);
    for (int c = 0; c < np; c++) L.col_w[L.col_of[c]] = (double)strlen(dg_partitions_device(p.parts, c)) * 8.0;
    L.row_y = xcalloc((size_t)L.n_v + 1, sizeof *L.row_y);
    L.row_h = xcalloc((size_t)L.n_v + 1, sizeof *L.row_h);
    layout_graph(&L);
    route_transfers(&L);
    FILE *f = fopen(o->out, "w");
    if (!f) {
        fprintf(stderr, "dg-inspect: cannot write %s: %s\n", o->out, strerror(errno));
        goto out;
    }
    char title[512];
    snprintf(title, sizeof title, "%s placed on %s", o->file, o->cluster_spec);
    bool ok = write_svg(f, &L, &p, title);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "dg-inspect: writing %s failed\n", o->out);
        goto out;
    }
    int n_x = 0;
    for (int i = 0; i < L.n_e; i++) n_x += L.e[i].kind >= E_XFER;
    printf("wrote %s: %d devices, %d of %d nodes drawn, %d Send/Recv edges, %.0fx%.0f px\n", o->out, np,
           L.n_v, total, n_x, L.width, L.height);
    rc = 0;
out:
    for (int i = 0; i < L.n_e; i++) free(L.e[i].label);
    free(L.v);
    free(L.e);
    free(L.col_of);
    free(L.col_x);
    free(L.col_w);
    free(L.row_y);
    free(L.row_h);
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

int main(int argc, char **argv) {
    options o;
    memset(&o, 0, sizeof o);
    o.soft_placement = true;
    o.hide_init = true;
    if (argc < 2) return usage(stderr);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) return usage(stdout);
    o.cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) return usage(stdout);
        if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--no_soft_placement") == 0) {
            o.soft_placement = false;
        } else if (strcmp(a, "--hide_init") == 0) {
            o.hide_init = true;
        } else if (strcmp(a, "--show_init") == 0 || strcmp(a, "--nohide_init") == 0 ||
                   strcmp(a, "--hide_init=false") == 0) {
            o.hide_init = false;
        } else if (strncmp(a, "--cluster_spec=", 15) == 0) {
            o.cluster_spec = a + 15;
        } else if (strncmp(a, "--gpus_per_task=", 16) == 0) {
            val = a + 16;
        } else if (strncmp(a, "--output=", 9) == 0) {
            o.out = a + 9;
        } else if (strcmp(a, "--cluster_spec") == 0 || strcmp(a, "--gpus_per_task") == 0 ||
                   strcmp(a, "-o") == 0 || strcmp(a, "--output") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dg-inspect: %s needs a value\n", a);
                return 2;
            }
            if (a[1] == 'o' || strcmp(a, "--output") == 0) o.out = argv[++i];
            else if (strcmp(a, "--cluster_spec") == 0) o.cluster_spec = argv[++i];
            else val = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dg-inspect: unknown option \"%s\"\n", a);
            return usage(stderr);
        } else if (!o.file) {
            o.file = a;
        } else {
            fprintf(stderr, "dg-inspect: unexpected argument \"%s\"\n", a);
            return usage(stderr);
        }
        if (val) {
            char *end;
            long v = strtol(val, &end, 10);
            if (!*val || *end || v < 0 || v > 1024) {
                fprintf(stderr, "dg-inspect: --gpus_per_task must be in 0..1024, got \"%s\"\n", val);
                return 2;
            }
            o.gpus_per_task = (int)v;
        }
    }
    bool known = strcmp(o.cmd, "graph") == 0 || strcmp(o.cmd, "place") == 0 ||
                 strcmp(o.cmd, "partition") == 0 || strcmp(o.cmd, "svg") == 0;
    if (!known) {
        fprintf(stderr, "dg-inspect: unknown command \"%s\"\n", o.cmd);
        return usage(stderr);
    }
    if (!o.file) {
        fprintf(stderr, "dg-inspect: %s needs a graph FILE\n", o.cmd);
        return usage(stderr);
    }
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_load(o.file, st);
    int rc = 1;
    if (!g) {
        die_status("loading", st);
    } else if (strcmp(o.cmd, "graph") == 0) {
        rc = cmd_graph(&o, g);
    } else if (strcmp(o.cmd, "place") == 0) {
        rc = cmd_place(&o, g, st);
    } else if (strcmp(o.cmd, "partition") == 0) {
        rc = cmd_partition(&o, g, st);
    } else {
        rc = cmd_svg(&o, g, st);
    }
    dg_graph_free(&g);
    dg_status_free(&st);
    return rc;
}
