/* dg-inspect: looks inside graph files (written by dg_graph_save, e.g. by dg-mlp-graph) and
 * checkpoint files (written by dg_checkpoint_save and the summary saver hook).
 *   dg-inspect graph FILE [--json]                 nodes: inputs, devices, output dtype/shape
 *   dg-inspect place FILE --cluster_spec SPEC      node -> device on SPEC's devices
 *   dg-inspect partition FILE --cluster_spec SPEC  per-device node lists and Send/Recv pairs
 *   dg-inspect svg FILE --cluster_spec SPEC -o OUT.svg
 *   dg-inspect checkpoints CKPT [--json]           step, time written, variables, bytes
 *   dg-inspect variables CKPT [--step N] [--values K] [--json]
 *                                                  name, dtype, shape, step, bytes (, values)
 *   dg-inspect summaries CKPT [--json]             scalar summary tags: count, step range
 *   dg-inspect plot CKPT --tag T [--tag U ...] -o OUT.svg|OUT.png
 *                                                  value against step, as SVG or PNG (800x480)
 *   dg-inspect server dg://HOST:PORT [--json]     a running task's counters: registered
 *                                                  partitions, remote sessions, running steps
 * SPEC is "ps|h:1,h:2;worker|h:3"; every task has /device:CPU:0 and --gpus_per_task GPUs.
 * Errors print the status and exit 1; bad usage exits 2. Graphs and checkpoints go through the
 * public API; only the tables the API does not cover (summaries, checkpoint creation times)
 * are read with SQLite directly, read-only. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <sqlite3.h>
#include <zlib.h>

#include <distgraph/distgraph.h>

typedef struct options {
    const char *cmd, *file, *cluster_spec, *out;
    int gpus_per_task;
    bool json, soft_placement, hide_init;
    int64_t step;       // variables: --step, -1 the newest
    int64_t n_values;   // variables: --values, 0 none
    const char **tags;  // plot: --tag, in order, without repeats (borrowed from argv)
    int n_tags;
} options;

static int usage(FILE *f) {
    fprintf(f,
            "usage: dg-inspect COMMAND FILE [options]\n"
            "commands on graph files:\n"
            "  graph FILE [--json]             list nodes: op, inputs, devices, outputs\n"
            "  place FILE --cluster_spec SPEC  place the graph on SPEC's devices\n"
            "  partition FILE --cluster_spec SPEC\n"
            "                                  per-device node lists and Send/Recv pairs\n"
            "  svg FILE --cluster_spec SPEC -o OUT.svg\n"
            "                                  draw the placed, partitioned graph\n"
            "commands on checkpoint files:\n"
            "  checkpoints FILE [--json]       list checkpoints: step, time written, variables,\n"
            "                                  bytes; the newest marked\n"
            "  variables FILE [--step N] [--values K] [--json]\n"
            "                                  the variables of the newest checkpoint (or of\n"
            "                                  step N): name, dtype, shape, step, bytes\n"
            "  summaries FILE [--json]         scalar summary tags: count, steps, last value\n"
            "  plot FILE --tag TAG [--tag TAG ...] -o OUT.svg|OUT.png\n"
            "                                  line chart of value against step, 800x480\n"
            "commands on TensorBoard event files:\n"
            "  events FILE [--json]            every event: wall time, step, kind, tag, value;\n"
            "                                  checks each record's checksums\n"
            "commands on running servers:\n"
            "  server dg://HOST:PORT [--json]  registered partitions, remote clients' sessions\n"
            "                                  and running steps of the task at that address\n"
            "options:\n"
            "  --cluster_spec SPEC   \"ps|host:port,host:port;worker|host:port\"\n"
            "  --gpus_per_task N     GPUs per task besides /device:CPU:0 (default 0)\n"
            "  --no_soft_placement   fail instead of falling back to another device\n"
            "  --json                JSON instead of a table (all but svg and plot)\n"
            "  -o, --output FILE     where svg and plot write (plot: .svg or .png)\n"
            "  --step N              variables: the checkpoint of global step N\n"
            "  --values K            variables: also print each variable's first K values\n"
            "  --tag TAG             plot: a summary tag to draw (repeat for several)\n"
            "  --show_init           svg: also draw initializers (hidden by default: nodes\n"
            "                        named */Initializer/*, */Assign and init)\n"
            "  -h, --help, --version\n"
            "Exit status: 0 on success, 1 when a file or server cannot be read (the message\n"
            "says why), 2 for bad usage.\n");
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
        int last = n_cols - 1;   // no padding after the last non-empty cell
        while (last > 0 && !rows[r][last][0]) last--;
        for (int c = 0; c <= last; c++) {
            if (c == last) printf("%s", rows[r][c]);
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
        double r[4] = {0, 0, (double)strlen(e->label) * 6.1 + 8, 13}, best[4] = {0, 0, 0, 0};
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

// ---- checkpoints and summaries ----
// The checkpoint listing and the variables come from the public checkpoint API. The file's
// other tables are read through a read-only SQLite connection of our own: the summaries
// table that the summary saver hook writes, and the checkpoints' creation times, which the
// API does not return (shown only when the table has them).

static dg_checkpoint_store *open_store(const char *file, dg_status *st) {
    dg_checkpoint_store *s = dg_checkpoint_store_new(file, false, st);
    if (!s) die_status("opening", st);
    return s;
}

// Percent-encodes path for an SQLite "file:" URI.
static char *file_uri(const char *path, const char *query) {
    sbuf b = {0};
    sb_printf(&b, "file:");
    for (const unsigned char *p = (const unsigned char *)path; *p; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("/._-~", *p))
            sb_printf(&b, "%c", *p);
        else
            sb_printf(&b, "%%%02X", *p);
    }
    sb_printf(&b, "?%s", query);
    return b.s;
}

// A read-only connection to file, opened while a store holds it open (so the WAL's -shm
// exists). In a directory we may not write, SQLite refuses to read a WAL file even
// read-only; the store then reads it as immutable, and so do we. NULL (and a message in
// err) on failure.
static sqlite3 *open_ro(const char *file, char *err, size_t cap) {
    sqlite3 *db = NULL;
    int rc = sqlite3_open_v2(file, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
    if (rc == SQLITE_OK) rc = sqlite3_exec(db, "SELECT 1 FROM sqlite_master LIMIT 1", NULL, NULL, NULL);
    if (rc != SQLITE_OK && strncmp(file, "file:", 5) != 0) {
        sqlite3_close(db);
        db = NULL;
        char *uri = file_uri(file, "immutable=1");
        rc = sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, NULL);
        if (rc == SQLITE_OK) rc = sqlite3_exec(db, "SELECT 1 FROM sqlite_master LIMIT 1", NULL, NULL, NULL);
        free(uri);
    }
    if (rc != SQLITE_OK) {
        snprintf(err, cap, "%s", db ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 10000);
    return db;
}

static void human_bytes(int64_t n, char *buf, size_t cap) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%lld B", (long long)n);
    else snprintf(buf, cap, "%.1f %s", v, unit[u]);
}

static int64_t var_bytes(const dg_checkpoint_var *v) {
    int64_t n = dg_shape_num_elements(&v->shape);
    return n < 0 ? 0 : n * (int64_t)dg_dtype_size(v->dtype);
}

static void json_shape(FILE *f, const dg_shape *s) {
    fputc('[', f);
    for (int d = 0; d < s->rank; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)s->dims[d]);
    fputc(']', f);
}

static int cmd_checkpoints(const options *o) {
    dg_status *st = dg_status_new();
    int64_t *steps = NULL, *created_ms = NULL, *n_bytes = NULL;
    int *n_vars = NULL;
    bool *gone = NULL;
    sqlite3 *db = NULL;
    int rc = 1, n = -1;
    dg_checkpoint_store *s = open_store(o->file, st);
    if (!s) goto out;
    if ((n = dg_checkpoint_list(s, &steps, st)) < 0) {
        die_status("listing checkpoints", st);
        goto out;
    }
    if (n == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": holds no checkpoints\n", o->file);
        goto out;
    }
    int64_t newest = dg_checkpoint_latest_step(s, st);
    if (!dg_status_ok(st)) {
        die_status("finding the newest checkpoint", st);
        goto out;
    }
    created_ms = xcalloc((size_t)n, sizeof *created_ms);
    n_bytes = xcalloc((size_t)n, sizeof *n_bytes);
    n_vars = xcalloc((size_t)n, sizeof *n_vars);
    gone = xcalloc((size_t)n, sizeof *gone);
    for (int i = 0; i < n; i++) created_ms[i] = -1;
    char err[256];
    sqlite3_stmt *q = NULL;
    if ((db = open_ro(o->file, err, sizeof err)) &&
        sqlite3_prepare_v2(db, "SELECT global_step, created_unix_ms FROM checkpoints", -1, &q, NULL) == SQLITE_OK) {
        while (sqlite3_step(q) == SQLITE_ROW)
            for (int i = 0; i < n; i++)
                if (steps[i] == sqlite3_column_int64(q, 0) && sqlite3_column_type(q, 1) == SQLITE_INTEGER)
                    created_ms[i] = sqlite3_column_int64(q, 1);
    }
    sqlite3_finalize(q);
    int n_shown = 0;
    for (int i = 0; i < n; i++) {
        dg_checkpoint_var *vars = NULL;
        int k = dg_checkpoint_variables(s, steps[i], &vars, st);
        if (k < 0 && dg_status_code(st) == DG_NOT_FOUND && steps[i] != newest) {
            gone[i] = true;   // pruned by a writer since the listing
            dg_status_set(st, DG_OK, "");
            continue;
        }
        if (k < 0) {
            die_status("reading the variables", st);
            goto out;
        }
        n_vars[i] = k;
        for (int j = 0; j < k; j++) n_bytes[i] += var_bytes(&vars[j]);
        free(vars);
        n_shown++;
    }
    if (o->json) {
        printf("{\"file\": ");
        json_str(stdout, o->file);
        printf(", \"newest_step\": %lld, \"checkpoints\": [", (long long)newest);
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (gone[i]) continue;
            printf("%s\n  {\"step\": %lld, \"created_unix_ms\": ", k++ ? "," : "", (long long)steps[i]);
            if (created_ms[i] >= 0) printf("%lld", (long long)created_ms[i]);
            else printf("null");
            printf(", \"n_variables\": %d, \"n_bytes\": %lld, \"newest\": %s}", n_vars[i],
                   (long long)n_bytes[i], steps[i] == newest ? "true" : "false");
        }
        printf("\n]}\n");
        rc = 0;
        goto out;
    }
    enum { NC = 5 };
    char ***rows = xcalloc((size_t)n + 1, sizeof *rows);
    static const char *const head[NC] = {"step", "written (UTC)", "variables", "bytes", ""};
    rows[0] = xcalloc(NC, sizeof **rows);
    for (int c = 0; c < NC; c++) rows[0][c] = xstrdup(head[c]);
    int n_rows = 1;
    for (int i = 0; i < n; i++) {
        if (gone[i]) continue;
        char **r = rows[n_rows++] = xcalloc(NC, sizeof **rows);
        char buf[96], hb[32];
        snprintf(buf, sizeof buf, "%lld", (long long)steps[i]);
        r[0] = xstrdup(buf);
        strcpy(buf, "-");
        if (created_ms[i] >= 0) {
            time_t t = (time_t)(created_ms[i] / 1000);
            struct tm tmv;
            if (gmtime_r(&t, &tmv)) strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tmv);
        }
        r[1] = xstrdup(buf);
        snprintf(buf, sizeof buf, "%d", n_vars[i]);
        r[2] = xstrdup(buf);
        human_bytes(n_bytes[i], hb, sizeof hb);
        snprintf(buf, sizeof buf, "%lld (%s)", (long long)n_bytes[i], hb);
        r[3] = xstrdup(buf);
        r[4] = xstrdup(steps[i] == newest ? "<- newest" : "");
    }
    print_table(rows, n_rows, NC);
    for (int i = 0; i < n_rows; i++) {
        for (int c = 0; c < NC; c++) free(rows[i][c]);
        free(rows[i]);
    }
    free(rows);
    printf("%d checkpoint%s in %s, newest: step %lld\n", n_shown, n_shown == 1 ? "" : "s", o->file,
           (long long)newest);
    rc = 0;
out:
    sqlite3_close(db);
    free(gone);
    free(n_vars);
    free(n_bytes);
    free(created_ms);
    free(steps);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// Element i of t as text; JSON writes non-finite floats as null.
static void value_str(const dg_tensor *t, int64_t i, bool json, char *buf, size_t cap) {
    const void *d = dg_tensor_data(t);
    double v;
    switch (dg_tensor_dtype(t)) {
    case DG_FLOAT32: v = ((const float *)d)[i]; break;
    case DG_FLOAT64: v = ((const double *)d)[i]; break;
    case DG_INT32: snprintf(buf, cap, "%d", (int)((const int32_t *)d)[i]); return;
    case DG_UINT8: snprintf(buf, cap, "%u", (unsigned)((const uint8_t *)d)[i]); return;
    case DG_INT64: snprintf(buf, cap, "%lld", (long long)((const int64_t *)d)[i]); return;
    case DG_BOOL: snprintf(buf, cap, "%s", ((const uint8_t *)d)[i] ? "true" : "false"); return;
    default: v = dg_tensor_get_as_double(t, i); break;
    }
    if (json && !isfinite(v)) snprintf(buf, cap, "null");
    else if (json) snprintf(buf, cap, "%.*g", dg_tensor_dtype(t) == DG_FLOAT32 ? 9 : 17, v);
    else snprintf(buf, cap, "%g", v);
}

// The first k values of variable name of step, as a list; false (and a message) on error.
static bool first_values(dg_checkpoint_store *s, int64_t step, const char *name, int64_t k, bool json,
                         sbuf *b, dg_status *st) {
    dg_tensor *t = NULL;
    if (!dg_checkpoint_restore(s, step, &name, 1, &t, NULL, st)) return false;
    int64_t n = dg_tensor_num_elements(t), m = n < k ? n : k;
    sb_printf(b, "%s", json ? "[" : "");
    for (int64_t i = 0; i < m; i++) {
        char v[64];
        value_str(t, i, json, v, sizeof v);
        sb_printf(b, "%s%s", i ? ", " : "", v);
    }
    if (json) sb_printf(b, "]");
    else if (m < n) sb_printf(b, "%s... (%lld more)", m ? ", " : "", (long long)(n - m));
    else if (n == 0) sb_printf(b, "(empty)");
    dg_tensor_unref(t);
    return true;
}

static int cmd_variables(const options *o) {
    dg_status *st = dg_status_new();
    dg_checkpoint_var *vars = NULL;
    int64_t *steps = NULL;
    char ***rows = NULL;
    int rc = 1, n = 0, n_rows = 0;
    enum { NC = 6 };
    dg_checkpoint_store *s = open_store(o->file, st);
    if (!s) goto out;
    int n_ckpt = dg_checkpoint_list(s, &steps, st);
    if (n_ckpt < 0) {
        die_status("listing checkpoints", st);
        goto out;
    }
    if (n_ckpt == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": holds no checkpoints\n", o->file);
        goto out;
    }
    int64_t newest = dg_checkpoint_latest_step(s, st);
    int64_t step = o->step >= 0 ? o->step : newest;
    bool have = false;
    for (int i = 0; i < n_ckpt; i++) have |= steps[i] == step;
    if (dg_status_ok(st) && !have) {
        // Name what is there, as the fix is to pick one of them.
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; i < n_ckpt && used < sizeof list - 24; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%lld", i ? ", " : "", (long long)steps[i]);
        if (used >= sizeof list - 24 && n_ckpt > 0) snprintf(list + used, sizeof list - used, ", ...");
        fprintf(stderr, "dg-inspect: \"%s\" has no checkpoint of global step %lld; it holds step%s %s (--step N picks "
                        "one; without --step, the newest)\n", o->file, (long long)step, n_ckpt == 1 ? "" : "s", list);
        goto out;
    }
    if (!dg_status_ok(st) || (n = dg_checkpoint_variables(s, step, &vars, st)) < 0) {
        n = 0;
        die_status("reading the variables", st);
        goto out;
    }
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += var_bytes(&vars[i]);
    if (o->json) {
        printf("{\"file\": ");
        json_str(stdout, o->file);
        printf(", \"step\": %lld, \"newest\": %s, \"n_bytes\": %lld, \"variables\": [", (long long)step,
               step == newest ? "true" : "false", (long long)total);
        for (int i = 0; i < n; i++) {
            printf("%s\n  {\"name\": ", i ? "," : "");
            json_str(stdout, vars[i].name);
            printf(", \"dtype\": \"%s\", \"shape\": ", dg_dtype_name(vars[i].dtype));
            json_shape(stdout, &vars[i].shape);
            printf(", \"step\": %lld, \"n_bytes\": %lld", (long long)step, (long long)var_bytes(&vars[i]));
            if (o->n_values > 0) {
                sbuf b = {0};
                if (!first_values(s, step, vars[i].name, o->n_values, true, &b, st)) {
                    free(b.s);
                    printf("}\n");
                    die_status("reading values", st);
                    goto out;
                }
                printf(", \"values\": %s", sb_str(&b));
                free(b.s);
            }
            printf("}");
        }
        printf("%s]}\n", n ? "\n" : "");
        rc = 0;
        goto out;
    }
    int nc = o->n_values > 0 ? NC : NC - 1;
    rows = xcalloc((size_t)n + 1, sizeof *rows);
    static const char *const head[NC] = {"name", "dtype", "shape", "step", "bytes", "values"};
    rows[n_rows] = xcalloc(NC, sizeof **rows);
    for (int c = 0; c < NC; c++) rows[n_rows][c] = xstrdup(head[c]);
    n_rows++;
    for (int i = 0; i < n; i++) {
        char **r = rows[n_rows++] = xcalloc(NC, sizeof **rows);
        char buf[256];
        r[0] = xstrdup(vars[i].name);
        r[1] = xstrdup(dg_dtype_name(vars[i].dtype));
        r[2] = xstrdup(dg_shape_str(&vars[i].shape, buf, sizeof buf));
        snprintf(buf, sizeof buf, "%lld", (long long)step);
        r[3] = xstrdup(buf);
        snprintf(buf, sizeof buf, "%lld", (long long)var_bytes(&vars[i]));
        r[4] = xstrdup(buf);
        sbuf b = {0};
        if (o->n_values > 0 && !first_values(s, step, vars[i].name, o->n_values, false, &b, st)) {
            free(b.s);
            die_status("reading values", st);
            goto out;
        }
        r[5] = xstrdup(sb_str(&b));
        free(b.s);
    }
    printf("checkpoint of step %lld%s in %s\n", (long long)step, step == newest ? " (newest)" : "", o->file);
    print_table(rows, n_rows, nc);
    char hb[32];
    human_bytes(total, hb, sizeof hb);
    printf("%d variable%s, %lld bytes (%s)\n", n, n == 1 ? "" : "s", (long long)total, hb);
    rc = 0;
out:
    for (int i = 0; rows && i < n_rows; i++) {
        for (int c = 0; c < NC; c++) free(rows[i][c]);
        free(rows[i]);
    }
    free(rows);
    free(vars);
    free(steps);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// Opens file as a checkpoint file (whose errors name the file) and then read-only for the
// summaries table. NULL, after printing why, when either fails or the table is missing.
static sqlite3 *open_summaries(const char *file, dg_checkpoint_store **s, dg_status *st) {
    if (!(*s = open_store(file, st))) return NULL;
    char err[256];
    sqlite3 *db = open_ro(file, err, sizeof err);
    if (!db) {
        fprintf(stderr, "dg-inspect: \"%s\": cannot read the file: %s\n", file, err);
        return NULL;
    }
    sqlite3_stmt *q = NULL;
    bool has_table = sqlite3_prepare_v2(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'summaries'",
                                        -1, &q, NULL) == SQLITE_OK && sqlite3_step(q) == SQLITE_ROW;
    sqlite3_finalize(q);
    if (!has_table) {
        fprintf(stderr, "dg-inspect: \"%s\": no summaries table (no summary saver has written to this file)\n", file);
        sqlite3_close(db);
        return NULL;
    }
    return db;
}

// A value the summaries table holds that is not a finite number: +-inf (NaN cannot be stored;
// SQLite turns it into NULL), NULL or text.
#define SQL_NONFINITE "CASE WHEN typeof(value) IN ('real', 'integer') AND abs(value) < 9e999 THEN 0 ELSE 1 END"

static bool sql_prepare(sqlite3 *db, const char *file, const char *sql, sqlite3_stmt **q) {
    if (sqlite3_prepare_v2(db, sql, -1, q, NULL) == SQLITE_OK) return true;
    fprintf(stderr, "dg-inspect: \"%s\": reading the summaries table: %s\n", file, sqlite3_errmsg(db));
    return false;
}

static double column_value(sqlite3_stmt *q, int col) {
    int t = sqlite3_column_type(q, col);
    return t == SQLITE_FLOAT || t == SQLITE_INTEGER ? sqlite3_column_double(q, col) : NAN;
}

static int cmd_summaries(const options *o) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = NULL;
    sqlite3_stmt *q = NULL, *last = NULL;
    char ***rows = NULL;
    int rc = 1, n_rows = 0, cap_rows = 0, n_tags = 0;
    enum { NC = 5 };
    sqlite3 *db = open_summaries(o->file, &s, st);
    if (!db) goto out;
    if (!sql_prepare(db, o->file, "SELECT tag, COUNT(*), COUNT(DISTINCT step), MIN(step), MAX(step), SUM(" SQL_NONFINITE
                     ") FROM summaries GROUP BY tag ORDER BY tag", &q) ||
        !sql_prepare(db, o->file, "SELECT value FROM summaries WHERE tag = ?1 ORDER BY step DESC, rowid DESC LIMIT 1",
                     &last))
        goto out;
    sqlite3_stmt *any = NULL;
    if (!sql_prepare(db, o->file, "SELECT 1 FROM summaries LIMIT 1", &any)) goto out;
    int any_rc = sqlite3_step(any);
    sqlite3_finalize(any);
    if (any_rc == SQLITE_DONE) {
        fprintf(stderr, "dg-inspect: \"%s\": the summaries table is empty\n", o->file);
        goto out;
    }
    if (o->json) {
        printf("{\"file\": ");
        json_str(stdout, o->file);
        printf(", \"tags\": [");
    } else {
        cap_rows = 16;
        rows = xcalloc((size_t)cap_rows, sizeof *rows);
        static const char *const head[NC] = {"tag", "count", "steps", "last value", "non-finite"};
        rows[n_rows] = xcalloc(NC, sizeof **rows);
        for (int c = 0; c < NC; c++) rows[n_rows][c] = xstrdup(head[c]);
        n_rows++;
    }
    int step_rc;
    while ((step_rc = sqlite3_step(q)) == SQLITE_ROW) {
        const char *tag = (const char *)sqlite3_column_text(q, 0);
        if (!tag) tag = "";
        long long count = sqlite3_column_int64(q, 1), n_steps = sqlite3_column_int64(q, 2);
        long long first = sqlite3_column_int64(q, 3), end = sqlite3_column_int64(q, 4);
        long long n_nonfinite = sqlite3_column_int64(q, 5);
        double v = NAN;
        sqlite3_reset(last);
        sqlite3_bind_text(last, 1, tag, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(last) == SQLITE_ROW) v = column_value(last, 0);
        if (o->json) {
            printf("%s\n  {\"tag\": ", n_tags ? "," : "");
            json_str(stdout, tag);
            printf(", \"count\": %lld, \"n_steps\": %lld, \"first_step\": %lld, \"last_step\": %lld, "
                   "\"last_value\": ", count, n_steps, first, end);
            if (isfinite(v)) printf("%.17g", v);
            else printf("null");
            printf(", \"n_nonfinite\": %lld}", n_nonfinite);
        } else {
            if (n_rows == cap_rows) {
                cap_rows *= 2;
                rows = realloc(rows, (size_t)cap_rows * sizeof *rows);
                if (!rows) {
                    fprintf(stderr, "dg-inspect: out of memory\n");
                    exit(1);
                }
            }
            char **r = rows[n_rows++] = xcalloc(NC, sizeof **rows);
            char buf[96];
            r[0] = xstrdup(tag);
            if (count == n_steps) snprintf(buf, sizeof buf, "%lld", count);
            else snprintf(buf, sizeof buf, "%lld (%lld steps)", count, n_steps);
            r[1] = xstrdup(buf);
            snprintf(buf, sizeof buf, "%lld..%lld", first, end);
            r[2] = xstrdup(buf);
            snprintf(buf, sizeof buf, "%g", v);
            r[3] = xstrdup(buf);
            snprintf(buf, sizeof buf, "%lld", n_nonfinite);
            r[4] = xstrdup(buf);
        }
        n_tags++;
    }
    if (step_rc != SQLITE_DONE) {
        if (o->json) printf("\n]}\n");
        fprintf(stderr, "dg-inspect: \"%s\": reading the summaries table: %s\n", o->file, sqlite3_errmsg(db));
        goto out;
    }
    if (o->json) {
        printf("%s]}\n", n_tags ? "\n" : "");
    } else {
        print_table(rows, n_rows, NC);
        printf("%d tag%s in %s\n", n_tags, n_tags == 1 ? "" : "s", o->file);
    }
    rc = 0;
out:
    for (int i = 0; i < n_rows; i++) {
        for (int c = 0; c < NC; c++) free(rows[i][c]);
        free(rows[i]);
    }
    free(rows);
    sqlite3_finalize(last);
    sqlite3_finalize(q);
    sqlite3_close(db);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// ---- plot ----

typedef struct series {
    const char *tag;   // borrowed from argv
    int n;             // finite points, by increasing step
    double *x, *y;
    int n_nonfinite;   // points skipped
} series;

// Reads tag's points: one per step, the row written last where a step repeats (after a
// restart from an older checkpoint the steps after it are written again). -1: error, else
// the number of rows (0: unknown tag).
static int load_series(sqlite3 *db, const char *file, series *sr) {
    sqlite3_stmt *q = NULL;
    if (!sql_prepare(db, file, "SELECT step, value, MAX(rowid) FROM summaries WHERE tag = ?1 GROUP BY step ORDER BY step",
                     &q))
        return -1;
    sqlite3_bind_text(q, 1, sr->tag, -1, SQLITE_STATIC);
    int cap = 0, n_rows = 0, rc;
    while ((rc = sqlite3_step(q)) == SQLITE_ROW) {
        n_rows++;
        double v = column_value(q, 1);
        if (!isfinite(v)) {
            sr->n_nonfinite++;
            continue;
        }
        if (sr->n == cap) {
            cap = cap ? 2 * cap : 256;
            sr->x = realloc(sr->x, (size_t)cap * sizeof *sr->x);
            sr->y = realloc(sr->y, (size_t)cap * sizeof *sr->y);
            if (!sr->x || !sr->y) {
                fprintf(stderr, "dg-inspect: out of memory\n");
                exit(1);
            }
        }
        sr->x[sr->n] = (double)sqlite3_column_int64(q, 0);
        sr->y[sr->n++] = v;
    }
    if (rc != SQLITE_DONE) {
        fprintf(stderr, "dg-inspect: \"%s\": reading tag \"%s\": %s\n", file, sr->tag, sqlite3_errmsg(db));
        n_rows = -1;
    }
    sqlite3_finalize(q);
    return n_rows;
}

// Prints the tags the table holds, for an unknown-tag message.
static void print_known_tags(sqlite3 *db) {
    sqlite3_stmt *q = NULL;
    if (sqlite3_prepare_v2(db, "SELECT DISTINCT tag FROM summaries ORDER BY tag LIMIT 21", -1, &q, NULL) != SQLITE_OK)
        return;
    int k = 0;
    while (sqlite3_step(q) == SQLITE_ROW) {
        const char *t = (const char *)sqlite3_column_text(q, 0);
        fprintf(stderr, "%s%s", k ? ", " : " (known tags: ", k < 20 ? (t ? t : "") : "...");
        k++;
    }
    if (k) fputc(')', stderr);
    sqlite3_finalize(q);
}

#define CHART_W 800
#define CHART_H 480
#define MAX_TICKS 32
#define MARKER_MAX_POINTS 60   // series with at most this many points get a marker per point

typedef struct axis {
    double lo, hi;            // data values at the plot area's edges
    double tick[MAX_TICKS];
    int n_ticks;
    double tick_step;
} axis;

typedef struct chart {
    double left, top, right, bottom;   // the plot area, in pixels
    axis x, y;
    char title[512], y_label[256], note[512];
} chart;

static const uint32_t palette[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                   0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};
#define N_COLORS ((int)(sizeof palette / sizeof palette[0]))

// 1, 2 or 5 times a power of ten, near range / target.
static double nice_step(double range, int target) {
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

// Extends [lo, hi] to whole ticks. A single value gets room around it; steps (integral) get
// ticks at whole numbers only.
static void axis_make(axis *a, double lo, double hi, bool integral) {
    if (!(hi > lo)) {
        double d = integral || lo == 0 ? 1 : fabs(lo) * 0.1;
        lo -= d;
        hi += d;
    } else if (!integral) {
        double pad = (hi - lo) * 0.05;
        lo -= pad;
        hi += pad;
    }
    double step = nice_step(hi - lo, 6);
    if (integral && step < 1) step = 1;
    if (isfinite(step) && step > 0 && isfinite(lo / step) && isfinite(hi / step) && (hi - lo) / step < MAX_TICKS - 1) {
        a->lo = floor(lo / step) * step;
        a->hi = ceil(hi / step) * step;
    } else {   // ranges near the largest doubles: just the ends
        a->lo = lo;
        a->hi = hi;
        step = hi - lo;
    }
    a->tick_step = step;
    a->n_ticks = 0;
    for (int k = 0; k < MAX_TICKS; k++) {
        double v = a->lo + k * step;
        if (v > a->hi + step * 1e-6 || !isfinite(v)) break;
        a->tick[a->n_ticks++] = fabs(v) < step * 1e-9 ? 0 : v;
    }
}

static void tick_label(const axis *a, double v, char *buf, size_t cap) {
    double big = fmax(fabs(a->lo), fabs(a->hi));
    if (big >= 1e6 || a->tick_step < 1e-4 || !isfinite(a->tick_step)) {
        snprintf(buf, cap, "%.4g", v);
    } else {
        int dec = a->tick_step >= 1 ? 0 : (int)ceil(-log10(a->tick_step) - 1e-9);
        snprintf(buf, cap, "%.*f", dec, v);
    }
}

static double chart_px(const chart *c, double x) {
    return c->left + (x - c->x.lo) / (c->x.hi - c->x.lo) * (c->right - c->left);
}

static double chart_py(const chart *c, double y) {
    return c->bottom - (y - c->y.lo) / (c->y.hi - c->y.lo) * (c->bottom - c->top);
}

// ---- plot: SVG ----

static bool write_chart_svg(FILE *f, const chart *c, const series *sr, int n_series) {
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n<title>", CHART_W, CHART_H, CHART_W,
            CHART_H);
    xml_str(f, c->title);
    fprintf(f, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", CHART_W, CHART_H);
    fprintf(f, "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n");
    for (int i = 0; i < c->x.n_ticks; i++) {
        double x = chart_px(c, c->x.tick[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", x, c->top, x, c->bottom);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        double y = chart_py(c, c->y.tick[i]);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", c->left, y, c->right, y);
    }
    fprintf(f, "</g>\n<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#333\"/>\n",
            c->left, c->top, c->right - c->left, c->bottom - c->top);
    fprintf(f, "<g font-size=\"12\" fill=\"#333\">\n");
    for (int i = 0; i < c->x.n_ticks; i++) {
        char lab[64];
        double x = chart_px(c, c->x.tick[i]);
        tick_label(&c->x, c->x.tick[i], lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
                x, c->bottom, x, c->bottom + 5, x, c->bottom + 19, lab);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        char lab[64];
        double y = chart_py(c, c->y.tick[i]);
        tick_label(&c->y, c->y.tick[i], lab, sizeof lab);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
                c->left - 5, y, c->left, y, c->left - 8, y + 4, lab);
    }
    fprintf(f, "</g>\n<text x=\"%.1f\" y=\"%d\" font-size=\"13\" text-anchor=\"middle\" fill=\"#222\">step</text>\n",
            (c->left + c->right) / 2, CHART_H - 26);
    fprintf(f, "<text x=\"18\" y=\"%.1f\" font-size=\"13\" text-anchor=\"middle\" fill=\"#222\" "
               "transform=\"rotate(-90 18 %.1f)\">", (c->top + c->bottom) / 2, (c->top + c->bottom) / 2);
    xml_str(f, c->y_label);
    fprintf(f, "</text>\n<text x=\"%d\" y=\"28\" font-size=\"16\" font-weight=\"bold\" text-anchor=\"middle\" "
               "fill=\"#111\">", CHART_W / 2);
    xml_str(f, c->title);
    fprintf(f, "</text>\n");
    for (int k = 0; k < n_series; k++) {
        const series *s = &sr[k];
        unsigned col = palette[k % N_COLORS];
        fprintf(f, "<g><title>");
        xml_str(f, s->tag);
        fprintf(f, "</title>\n<polyline class=\"series\" data-tag=\"");
        xml_str(f, s->tag);
        fprintf(f, "\" fill=\"none\" stroke=\"#%06x\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"", col);
        for (int i = 0; i < s->n; i++)
            fprintf(f, "%s%.2f,%.2f", i ? " " : "", chart_px(c, s->x[i]), chart_py(c, s->y[i]));
        fprintf(f, "\"/>\n");
        if (s->n <= MARKER_MAX_POINTS)
            for (int i = 0; i < s->n; i++)
                fprintf(f, "<circle cx=\"%.2f\" cy=\"%.2f\" r=\"%s\" fill=\"#%06x\"/>\n", chart_px(c, s->x[i]),
                        chart_py(c, s->y[i]), s->n == 1 ? "4" : "2.5", col);
        fprintf(f, "</g>\n");
    }
    if (n_series > 1) {
        size_t w_max = 0;
        for (int k = 0; k < n_series; k++) w_max = strlen(sr[k].tag) > w_max ? strlen(sr[k].tag) : w_max;
        double w = 40 + 7.0 * (double)w_max, x = c->right - 10 - w, y = c->top + 10;
        fprintf(f, "<g class=\"legend\" font-size=\"12\"><rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" "
                   "fill=\"#ffffff\" fill-opacity=\"0.85\" stroke=\"#999\"/>\n", x, y, w, 8 + 18 * n_series);
        for (int k = 0; k < n_series; k++) {
            double ly = y + 13 + 18 * k;
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#%06x\" stroke-width=\"2.5\"/>"
                       "<text x=\"%.1f\" y=\"%.1f\" fill=\"#222\">", x + 8, ly, x + 28, ly, palette[k % N_COLORS],
                    x + 34, ly + 4);
            xml_str(f, sr[k].tag);
            fprintf(f, "</text>\n");
        }
        fprintf(f, "</g>\n");
    }
    if (c->note[0]) {
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" font-size=\"11\" fill=\"#a00\">", c->left, CHART_H - 8);
        xml_str(f, c->note);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "</svg>\n");
    return !ferror(f);
}

// ---- plot: PNG ----
// A small rasteriser: axis-aligned rectangles, anti-aliased lines after Wu, discs, and text in
// a 5x7 bitmap font (ASCII; other bytes draw as '?').

typedef struct canvas {
    int w, h;
    unsigned char *rgb;   // w * h * 3 bytes, rows top to bottom
} canvas;

// Printable ASCII 0x20..0x7e, 5 columns each, bit 0 the top row.
static const unsigned char font5x7[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, {0x00, 0x00, 0x5f, 0x00, 0x00}, {0x00, 0x07, 0x00, 0x07, 0x00},
    {0x14, 0x7f, 0x14, 0x7f, 0x14}, {0x24, 0x2a, 0x7f, 0x2a, 0x12}, {0x23, 0x13, 0x08, 0x64, 0x62},
    {0x36, 0x49, 0x55, 0x22, 0x50}, {0x00, 0x05, 0x03, 0x00, 0x00}, {0x00, 0x1c, 0x22, 0x41, 0x00},
    {0x00, 0x41, 0x22, 0x1c, 0x00}, {0x14, 0x08, 0x3e, 0x08, 0x14}, {0x08, 0x08, 0x3e, 0x08, 0x08},
    {0x00, 0x50, 0x30, 0x00, 0x00}, {0x08, 0x08, 0x08, 0x08, 0x08}, {0x00, 0x60, 0x60, 0x00, 0x00},
    {0x20, 0x10, 0x08, 0x04, 0x02}, {0x3e, 0x51, 0x49, 0x45, 0x3e}, {0x00, 0x42, 0x7f, 0x40, 0x00},
    {0x42, 0x61, 0x51, 0x49, 0x46}, {0x21, 0x41, 0x45, 0x4b, 0x31}, {0x18, 0x14, 0x12, 0x7f, 0x10},
    {0x27, 0x45, 0x45, 0x45, 0x39}, {0x3c, 0x4a, 0x49, 0x49, 0x30}, {0x01, 0x71, 0x09, 0x05, 0x03},
    {0x36, 0x49, 0x49, 0x49, 0x36}, {0x06, 0x49, 0x49, 0x29, 0x1e}, {0x00, 0x36, 0x36, 0x00, 0x00},
    {0x00, 0x56, 0x36, 0x00, 0x00}, {0x08, 0x14, 0x22, 0x41, 0x00}, {0x14, 0x14, 0x14, 0x14, 0x14},
    {0x00, 0x41, 0x22, 0x14, 0x08}, {0x02, 0x01, 0x51, 0x09, 0x06}, {0x32, 0x49, 0x79, 0x41, 0x3e},
    {0x7e, 0x11, 0x11, 0x11, 0x7e}, {0x7f, 0x49, 0x49, 0x49, 0x36}, {0x3e, 0x41, 0x41, 0x41, 0x22},
    {0x7f, 0x41, 0x41, 0x22, 0x1c}, {0x7f, 0x49, 0x49, 0x49, 0x41}, {0x7f, 0x09, 0x09, 0x09, 0x01},
    {0x3e, 0x41, 0x49, 0x49, 0x7a}, {0x7f, 0x08, 0x08, 0x08, 0x7f}, {0x00, 0x41, 0x7f, 0x41, 0x00},
    {0x20, 0x40, 0x41, 0x3f, 0x01}, {0x7f, 0x08, 0x14, 0x22, 0x41}, {0x7f, 0x40, 0x40, 0x40, 0x40},
    {0x7f, 0x02, 0x0c, 0x02, 0x7f}, {0x7f, 0x04, 0x08, 0x10, 0x7f}, {0x3e, 0x41, 0x41, 0x41, 0x3e},
    {0x7f, 0x09, 0x09, 0x09, 0x06}, {0x3e, 0x41, 0x51, 0x21, 0x5e}, {0x7f, 0x09, 0x19, 0x29, 0x46},
    {0x46, 0x49, 0x49, 0x49, 0x31}, {0x01, 0x01, 0x7f, 0x01, 0x01}, {0x3f, 0x40, 0x40, 0x40, 0x3f},
    {0x1f, 0x20, 0x40, 0x20, 0x1f}, {0x3f, 0x40, 0x38, 0x40, 0x3f}, {0x63, 0x14, 0x08, 0x14, 0x63},
    {0x07, 0x08, 0x70, 0x08, 0x07}, {0x61, 0x51, 0x49, 0x45, 0x43}, {0x00, 0x7f, 0x41, 0x41, 0x00},
    {0x02, 0x04, 0x08, 0x10, 0x20}, {0x00, 0x41, 0x41, 0x7f, 0x00}, {0x04, 0x02, 0x01, 0x02, 0x04},
    {0x40, 0x40, 0x40, 0x40, 0x40}, {0x00, 0x01, 0x02, 0x04, 0x00}, {0x20, 0x54, 0x54, 0x54, 0x78},
    {0x7f, 0x48, 0x44, 0x44, 0x38}, {0x38, 0x44, 0x44, 0x44, 0x20}, {0x38, 0x44, 0x44, 0x48, 0x7f},
    {0x38, 0x54, 0x54, 0x54, 0x18}, {0x08, 0x7e, 0x09, 0x01, 0x02}, {0x0c, 0x52, 0x52, 0x52, 0x3e},
    {0x7f, 0x08, 0x04, 0x04, 0x78}, {0x00, 0x44, 0x7d, 0x40, 0x00}, {0x20, 0x40, 0x44, 0x3d, 0x00},
    {0x7f, 0x10, 0x28, 0x44, 0x00}, {0x00, 0x41, 0x7f, 0x40, 0x00}, {0x7c, 0x04, 0x18, 0x04, 0x78},
    {0x7c, 0x08, 0x04, 0x04, 0x78}, {0x38, 0x44, 0x44, 0x44, 0x38}, {0x7c, 0x14, 0x14, 0x14, 0x08},
    {0x08, 0x14, 0x14, 0x18, 0x7c}, {0x7c, 0x08, 0x04, 0x04, 0x08}, {0x48, 0x54, 0x54, 0x54, 0x20},
    {0x04, 0x3f, 0x44, 0x40, 0x20}, {0x3c, 0x40, 0x40, 0x20, 0x7c}, {0x1c, 0x20, 0x40, 0x20, 0x1c},
    {0x3c, 0x40, 0x30, 0x40, 0x3c}, {0x44, 0x28, 0x10, 0x28, 0x44}, {0x0c, 0x50, 0x50, 0x50, 0x3c},
    {0x44, 0x64, 0x54, 0x4c, 0x44}, {0x00, 0x08, 0x36, 0x41, 0x00}, {0x00, 0x00, 0x7f, 0x00, 0x00},
    {0x00, 0x41, 0x36, 0x08, 0x00}, {0x08, 0x04, 0x08, 0x10, 0x08},
};
#define GLYPH_ADVANCE 6   // 5 columns and a gap, at scale 1

// Blends colour rgb over pixel (x, y) with coverage a in [0, 1]; outside the canvas: nothing.
static void cv_blend(canvas *c, int x, int y, uint32_t rgb, double a) {
    if (x < 0 || y < 0 || x >= c->w || y >= c->h || !(a > 0)) return;
    if (a > 1) a = 1;
    unsigned char *p = c->rgb + ((size_t)y * (size_t)c->w + (size_t)x) * 3;
    for (int k = 0; k < 3; k++) {
        double v = (double)((rgb >> (16 - 8 * k)) & 0xff);
        p[k] = (unsigned char)lround(p[k] * (1 - a) + v * a);
    }
}

static void cv_rect(canvas *c, int x0, int y0, int x1, int y1, uint32_t rgb) {   // inclusive
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++) cv_blend(c, x, y, rgb, 1);
}

// Wu's anti-aliased line, two pixels wide: along the major axis every pixel gets its two
// neighbours across the line weighted by the distance to it, plus the full pixel between.
static void cv_line(canvas *c, double x0, double y0, double x1, double y1, uint32_t rgb) {
    bool steep = fabs(y1 - y0) > fabs(x1 - x0);
    double t;
    if (steep) {
        t = x0, x0 = y0, y0 = t;
        t = x1, x1 = y1, y1 = t;
    }
    if (x0 > x1) {
        t = x0, x0 = x1, x1 = t;
        t = y0, y0 = y1, y1 = t;
    }
    double g = x1 - x0 < 1e-9 ? 0 : (y1 - y0) / (x1 - x0);
    for (long x = lround(x0); x <= lround(x1); x++) {
        double y = y0 + g * ((double)x - x0) - 0.5, ip = floor(y), fr = y - ip;
        int ix = (int)x, iy = (int)ip;
        if (steep) {
            cv_blend(c, iy, ix, rgb, 1 - fr);
            cv_blend(c, iy + 1, ix, rgb, 1);
            cv_blend(c, iy + 2, ix, rgb, fr);
        } else {
            cv_blend(c, ix, iy, rgb, 1 - fr);
            cv_blend(c, ix, iy + 1, rgb, 1);
            cv_blend(c, ix, iy + 2, rgb, fr);
        }
    }
}

static void cv_disc(canvas *c, double cx, double cy, double r, uint32_t rgb) {
    for (int y = (int)floor(cy - r - 1); y <= (int)ceil(cy + r + 1); y++)
        for (int x = (int)floor(cx - r - 1); x <= (int)ceil(cx + r + 1); x++) {
            double d = hypot(x + 0.5 - cx, y + 0.5 - cy);
            cv_blend(c, x, y, rgb, r + 0.5 - d);
        }
}

static int text_width(const char *s, int scale) { return (int)strlen(s) * GLYPH_ADVANCE * scale - scale; }

// Draws s with its top at y; align: 0 left of x, 1 centred on x, 2 right of x. vertical:
// rotated a quarter turn anticlockwise (reading upwards), centred on (x, y).
static void cv_text(canvas *c, int x, int y, const char *s, uint32_t rgb, int scale, int align, bool vertical) {
    int w = text_width(s, scale);
    if (!vertical) x -= align == 1 ? w / 2 : align == 2 ? w : 0;
    else y += w / 2;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        const unsigned char *gl = font5x7[(ch >= 0x20 && ch < 0x7f ? ch : '?') - 0x20];
        for (int col = 0; col < 5; col++)
            for (int row = 0; row < 7; row++) {
                if (!((gl[col] >> row) & 1)) continue;
                if (vertical) cv_rect(c, x + row * scale, y - (col + 1) * scale + 1, x + (row + 1) * scale - 1,
                                      y - col * scale, rgb);
                else cv_rect(c, x + col * scale, y + row * scale, x + (col + 1) * scale - 1,
                             y + (row + 1) * scale - 1, rgb);
            }
        if (vertical) y -= GLYPH_ADVANCE * scale;
        else x += GLYPH_ADVANCE * scale;
    }
}

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static bool png_chunk(FILE *f, const char *type, const unsigned char *data, size_t n) {
    unsigned char len[4], crc[4];
    put_be32(len, (uint32_t)n);
    uLong sum = crc32(0L, (const Bytef *)type, 4);
    if (n) sum = crc32(sum, data, (uInt)n);
    put_be32(crc, (uint32_t)sum);
    return fwrite(len, 1, 4, f) == 4 && fwrite(type, 1, 4, f) == 4 && (n == 0 || fwrite(data, 1, n, f) == n) &&
           fwrite(crc, 1, 4, f) == 4;
}

// An 8-bit RGB PNG, one IDAT with every row unfiltered (filter type 0).
static bool write_png(FILE *f, const canvas *c) {
    size_t row = 1 + (size_t)c->w * 3, n_raw = row * (size_t)c->h;
    unsigned char *raw = xcalloc(n_raw, 1);
    for (int y = 0; y < c->h; y++) memcpy(raw + (size_t)y * row + 1, c->rgb + (size_t)y * (size_t)c->w * 3, row - 1);
    uLongf n_z = compressBound((uLong)n_raw);
    unsigned char *z = xcalloc(n_z, 1);
    bool ok = compress2(z, &n_z, raw, (uLong)n_raw, 9) == Z_OK;
    unsigned char ihdr[13] = {0};
    put_be32(ihdr, (uint32_t)c->w);
    put_be32(ihdr + 4, (uint32_t)c->h);
    ihdr[8] = 8;   // bits per sample
    ihdr[9] = 2;   // colour type: RGB
    static const unsigned char sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    ok = ok && fwrite(sig, 1, 8, f) == 8 && png_chunk(f, "IHDR", ihdr, sizeof ihdr) && png_chunk(f, "IDAT", z, n_z) &&
         png_chunk(f, "IEND", NULL, 0);
    free(z);
    free(raw);
    return ok && !ferror(f);
}

static bool write_chart_png(FILE *f, const chart *c, const series *sr, int n_series) {
    canvas cv = {CHART_W, CHART_H, xcalloc((size_t)CHART_W * CHART_H * 3, 1)};
    memset(cv.rgb, 0xff, (size_t)CHART_W * CHART_H * 3);
    int l = (int)c->left, r = (int)c->right, t = (int)c->top, b = (int)c->bottom;
    char lab[64];
    for (int i = 0; i < c->x.n_ticks; i++) {
        int x = (int)lround(chart_px(c, c->x.tick[i]));
        cv_rect(&cv, x, t, x, b, 0xe6e6e6);
        cv_rect(&cv, x, b, x, b + 4, 0x333333);
        tick_label(&c->x, c->x.tick[i], lab, sizeof lab);
        cv_text(&cv, x, b + 9, lab, 0x333333, 1, 1, false);
    }
    for (int i = 0; i < c->y.n_ticks; i++) {
        int y = (int)lround(chart_py(c, c->y.tick[i]));
        cv_rect(&cv, l, y, r, y, 0xe6e6e6);
        cv_rect(&cv, l - 4, y, l, y, 0x333333);
        tick_label(&c->y, c->y.tick[i], lab, sizeof lab);
        cv_text(&cv, l - 8, y - 3, lab, 0x333333, 1, 2, false);
    }
    cv_rect(&cv, l, t, r, t, 0x333333);
    cv_rect(&cv, l, b, r, b, 0x333333);
    cv_rect(&cv, l, t, l, b, 0x333333);
    cv_rect(&cv, r, t, r, b, 0x333333);
    cv_text(&cv, (l + r) / 2, CHART_H - 34, "step", 0x222222, 1, 1, false);
    cv_text(&cv, 14, (t + b) / 2, c->y_label, 0x222222, 1, 1, true);
    cv_text(&cv, CHART_W / 2, 14, c->title, 0x111111, 2, 1, false);
    for (int k = 0; k < n_series; k++) {
        const series *s = &sr[k];
        uint32_t col = palette[k % N_COLORS];
        for (int i = 1; i < s->n; i++)
            cv_line(&cv, chart_px(c, s->x[i - 1]), chart_py(c, s->y[i - 1]), chart_px(c, s->x[i]), chart_py(c, s->y[i]),
                    col);
        if (s->n <= MARKER_MAX_POINTS)
            for (int i = 0; i < s->n; i++) cv_disc(&cv, chart_px(c, s->x[i]), chart_py(c, s->y[i]), s->n == 1 ? 3.5 : 2.2, col);
    }
    if (n_series > 1) {
        int w_max = 0;
        for (int k = 0; k < n_series; k++) w_max = text_width(sr[k].tag, 1) > w_max ? text_width(sr[k].tag, 1) : w_max;
        int w = 40 + w_max, x = r - 10 - w, y = t + 10, h = 8 + 16 * n_series;
        cv_rect(&cv, x, y, x + w, y + h, 0x999999);
        cv_rect(&cv, x + 1, y + 1, x + w - 1, y + h - 1, 0xffffff);
        for (int k = 0; k < n_series; k++) {
            int ly = y + 12 + 16 * k;
            cv_rect(&cv, x + 8, ly - 1, x + 28, ly + 1, palette[k % N_COLORS]);
            cv_text(&cv, x + 34, ly - 3, sr[k].tag, 0x222222, 1, 0, false);
        }
    }
    if (c->note[0]) cv_text(&cv, l, CHART_H - 14, c->note, 0xaa0000, 1, 0, false);
    bool ok = write_png(f, &cv);
    free(cv.rgb);
    return ok;
}

static bool has_ext(const char *path, const char *ext) {
    size_t n = strlen(path), k = strlen(ext);
    return n > k && strcasecmp(path + n - k, ext) == 0;
}

static int cmd_plot(const options *o) {
    dg_status *st = dg_status_new();
    dg_checkpoint_store *s = NULL;
    series *sr = xcalloc((size_t)o->n_tags, sizeof *sr);
    sbuf note = {0}, title = {0};
    int rc = 1, n_points = 0;
    sqlite3 *db = open_summaries(o->file, &s, st);
    if (!db) goto out;
    chart c;
    memset(&c, 0, sizeof c);
    double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
    int n_nonfinite = 0;
    for (int k = 0; k < o->n_tags; k++) {
        sr[k].tag = o->tags[k];
        int n_rows = load_series(db, o->file, &sr[k]);
        if (n_rows < 0) goto out;
        if (n_rows == 0) {
            fprintf(stderr, "dg-inspect: \"%s\": no summaries with tag \"%s\"", o->file, sr[k].tag);
            print_known_tags(db);
            fputc('\n', stderr);
            goto out;
        }
        for (int i = 0; i < sr[k].n; i++) {
            x_lo = fmin(x_lo, sr[k].x[i]);
            x_hi = fmax(x_hi, sr[k].x[i]);
            y_lo = fmin(y_lo, sr[k].y[i]);
            y_hi = fmax(y_hi, sr[k].y[i]);
        }
        n_points += sr[k].n;
        if (sr[k].n_nonfinite)
            sb_printf(&note, "%s%s: %d", n_nonfinite ? ", " : "", sr[k].tag, sr[k].n_nonfinite);
        n_nonfinite += sr[k].n_nonfinite;
    }
    for (int k = 0; k < o->n_tags; k++) sb_printf(&title, "%s%s", k ? ", " : "", o->tags[k]);
    if (n_points == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": nothing to plot: every value of %s is non-finite\n", o->file,
                sb_str(&title));
        goto out;
    }
    if (n_nonfinite)
        snprintf(c.note, sizeof c.note, "%d non-finite value%s skipped (%s)", n_nonfinite, n_nonfinite == 1 ? "" : "s",
                 sb_str(&note));
    snprintf(c.y_label, sizeof c.y_label, "%s", o->n_tags == 1 ? o->tags[0] : "value");
    const char *base = strrchr(o->file, '/');
    sb_printf(&title, " (%s)", base ? base + 1 : o->file);
    snprintf(c.title, sizeof c.title, "%s", sb_str(&title));
    c.left = 84;
    c.right = CHART_W - 24;
    c.top = 44;
    c.bottom = CHART_H - 66;
    axis_make(&c.x, x_lo, x_hi, true);
    axis_make(&c.y, y_lo, y_hi, false);
    FILE *f = fopen(o->out, "wb");
    if (!f) {
        fprintf(stderr, "dg-inspect: cannot write %s: %s\n", o->out, strerror(errno));
        goto out;
    }
    bool png = has_ext(o->out, ".png");
    bool ok = png ? write_chart_png(f, &c, sr, o->n_tags) : write_chart_svg(f, &c, sr, o->n_tags);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "dg-inspect: writing %s failed\n", o->out);
        remove(o->out);
        goto out;
    }
    printf("wrote %s: %d tag%s, %d point%s, steps %.0f..%.0f, %dx%d px%s%s\n", o->out, o->n_tags,
           o->n_tags == 1 ? "" : "s", n_points, n_points == 1 ? "" : "s", x_lo, x_hi, CHART_W, CHART_H,
           c.note[0] ? "; " : "", c.note);
    rc = 0;
out:
    for (int k = 0; k < o->n_tags; k++) {
        free(sr[k].x);
        free(sr[k].y);
    }
    free(sr);
    free(title.s);
    free(note.s);
    sqlite3_close(db);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// Parses a count option's value: an integer in [lo, hi]; false (after a message) otherwise.
static bool parse_int(const char *opt, const char *val, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(val, &end, 10);
    if (!*val || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "dg-inspect: %s must be an integer in %lld..%lld, got \"%s\"\n", opt, (long long)lo,
                (long long)hi, val);
        return false;
    }
    *out = v;
    return true;
}

// server: a running task's counters, asked over the wire.
static int cmd_server(const options *o) {
    dg_status *st = dg_status_new();
    dg_server_stats s;
    int rc = 1;
    if (!dg_server_query_stats(o->file, NULL, NULL, 5000, &s, st)) {
        die_status("asking the server", st);
    } else {
        const struct { const char *name; int64_t v; } f[] = {
            {"registered_graphs", s.registered_graphs}, {"master_sessions", s.master_sessions},
            {"running_steps", s.running_steps}, {"graphs_orphaned", s.graphs_orphaned},
            {"values_expired", s.values_expired}, {"abort_marks", s.abort_marks}, {"connections", s.connections},
            {"max_connections", s.max_connections}, {"connections_closed", s.connections_closed},
            {"accept_failures", s.accept_failures}, {"inflight_bytes", s.inflight_bytes},
            {"transfers_refused", s.transfers_refused}, {"transfers_expired", s.transfers_expired},
            {"transfers_abandoned", s.transfers_abandoned}, {"replies_dropped", s.replies_dropped},
            {"requests_refused", s.requests_refused},
            {"bad_messages", s.bad_messages}, {"shm_frames_sent", s.shm_frames_sent},
            {"shm_frames_received", s.shm_frames_received},
        };
        size_t n = sizeof f / sizeof f[0];
        if (o->json) printf("{\"target\": \"%s\"", o->file);
        for (size_t i = 0; i < n; i++)
            printf(o->json ? ", \"%s\": %lld" : "%s %lld\n", f[i].name, (long long)f[i].v);
        if (o->json) printf("}\n");
        rc = 0;
    }
    dg_status_free(&st);
    return rc;
}

// ---- events ----

static bool print_event(void *ctx, const dg_event *e) {
    const options *o = ctx;
    if (o->json)
        printf("{\"wall_time\": %.6f, \"step\": %lld, \"kind\": \"%s\", \"tag\": \"%s\", \"value\": %.9g}\n",
               e->wall_time, (long long)e->step, e->kind, e->tag, e->value);
    else
        printf("%.6f %8lld %-12s %-32s %.9g\n", e->wall_time, (long long)e->step, e->kind, e->tag, e->value);
    return true;
}

static int cmd_events(const options *o) {
    dg_status *st = dg_status_new();
    int64_t n = 0;
    if (!o->json) printf("%-17s %8s %-12s %-32s %s\n", "wall time", "step", "kind", "tag", "value");
    bool ok = dg_event_file_read(o->file, print_event, (void *)o, &n, st);
    if (!ok) fprintf(stderr, "dg-inspect: %s: %s (after %lld good events)\n", dg_code_name(dg_status_code(st)),
                     dg_status_message(st), (long long)n);
    dg_status_free(&st);
    return ok ? 0 : 1;
}

static bool is_cmd(const char *cmd, const char *const *names) {
    for (; *names; names++)
        if (strcmp(cmd, *names) == 0) return true;
    return false;
}

int main(int argc, char **argv) {
    static const char *const graph_cmds[] = {"graph", "place", "partition", "svg", NULL};
    static const char *const ckpt_cmds[] = {"checkpoints", "variables", "summaries", "plot", NULL};
    options o;
    memset(&o, 0, sizeof o);
    o.soft_placement = true;
    o.hide_init = true;
    o.step = -1;
    if (argc < 2) return usage(stderr);
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) return usage(stdout);
    if (strcmp(argv[1], "--version") == 0) {
        printf("dg-inspect (distgraph) %s\n", dg_version());
        return 0;
    }
    o.cmd = argv[1];
    o.tags = xcalloc((size_t)argc, sizeof *o.tags);
    bool has_step = false, has_values = false;
    int rc = 2;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *opt = a, *val = NULL;
        static const char *const valued[] = {"--cluster_spec", "--gpus_per_task", "-o", "--output",
                                             "--step", "--values", "--tag", NULL};
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            rc = usage(stdout);
            goto done;
        }
        // "--opt=value" and "--opt value" alike.
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        char name[32] = "";
        if (eq && (size_t)(eq - a) < sizeof name) {
            memcpy(name, a, (size_t)(eq - a));
            name[eq - a] = '\0';
            if (is_cmd(name, valued)) {
                opt = name;
                val = eq + 1;
            }
        }
        if (!val && is_cmd(a, valued)) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dg-inspect: %s needs a value\n", a);
                goto done;
            }
            val = argv[++i];
        }
        if (val) {
            int64_t v = 0;
            if (strcmp(opt, "-o") == 0 || strcmp(opt, "--output") == 0) {
                o.out = val;
            } else if (strcmp(opt, "--cluster_spec") == 0) {
                o.cluster_spec = val;
            } else if (strcmp(opt, "--gpus_per_task") == 0) {
                if (!parse_int(opt, val, 0, 1024, &v)) goto done;
                o.gpus_per_task = (int)v;
            } else if (strcmp(opt, "--step") == 0) {
                if (!parse_int(opt, val, 0, INT64_MAX, &o.step)) goto done;
                has_step = true;
            } else if (strcmp(opt, "--values") == 0) {
                if (!parse_int(opt, val, 0, INT64_MAX, &o.n_values)) goto done;
                has_values = true;
            } else {
                if (!*val) {
                    fprintf(stderr, "dg-inspect: --tag needs a non-empty tag\n");
                    goto done;
                }
                bool seen = false;
                for (int k = 0; k < o.n_tags; k++) seen = seen || strcmp(o.tags[k], val) == 0;
                if (!seen) o.tags[o.n_tags++] = val;
            }
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--no_soft_placement") == 0) {
            o.soft_placement = false;
        } else if (strcmp(a, "--hide_init") == 0) {
            o.hide_init = true;
        } else if (strcmp(a, "--show_init") == 0 || strcmp(a, "--nohide_init") == 0 ||
                   strcmp(a, "--hide_init=false") == 0) {
            o.hide_init = false;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "dg-inspect: unknown option \"%s\"\n", a);
            rc = usage(stderr);
            goto done;
        } else if (!o.file) {
            o.file = a;
        } else {
            fprintf(stderr, "dg-inspect: unexpected argument \"%s\"\n", a);
            rc = usage(stderr);
            goto done;
        }
    }
    bool is_graph = is_cmd(o.cmd, graph_cmds), is_ckpt = is_cmd(o.cmd, ckpt_cmds);
    if (strcmp(o.cmd, "events") == 0) {
        if (!o.file) {
            fprintf(stderr, "dg-inspect: events needs an event FILE\n");
            goto done;
        }
        rc = cmd_events(&o);
        goto done;
    }
    if (strcmp(o.cmd, "server") == 0) {
        if (!o.file) {
            fprintf(stderr, "dg-inspect: server needs a target dg://HOST:PORT\n");
            goto done;
        }
        rc = cmd_server(&o);
        goto done;
    }
    if (!is_graph && !is_ckpt) {
        fprintf(stderr, "dg-inspect: unknown command \"%s\"\n", o.cmd);
        rc = usage(stderr);
        goto done;
    }
    if (!o.file) {
        fprintf(stderr, "dg-inspect: %s needs a %s FILE\n", o.cmd, is_graph ? "graph" : "checkpoint");
        rc = usage(stderr);
        goto done;
    }
    bool is_variables = strcmp(o.cmd, "variables") == 0, is_plot = strcmp(o.cmd, "plot") == 0;
    if ((has_step || has_values) && !is_variables) {
        fprintf(stderr, "dg-inspect: %s applies to variables only\n", has_step ? "--step" : "--values");
        goto done;
    }
    if (o.n_tags && !is_plot) {
        fprintf(stderr, "dg-inspect: --tag applies to plot only\n");
        goto done;
    }
    if (is_plot) {
        if (!o.n_tags || !o.out) {
            fprintf(stderr, "dg-inspect: plot needs --tag TAG and -o OUT.svg|OUT.png\n");
            goto done;
        }
        if (!has_ext(o.out, ".svg") && !has_ext(o.out, ".png")) {
            fprintf(stderr, "dg-inspect: plot writes SVG or PNG, by the extension of -o: got \"%s\"\n", o.out);
            goto done;
        }
        if (o.json) {
            fprintf(stderr, "dg-inspect: plot has no --json\n");
            goto done;
        }
    }
    if (is_ckpt) {
        if (strcmp(o.cmd, "checkpoints") == 0) rc = cmd_checkpoints(&o);
        else if (is_variables) rc = cmd_variables(&o);
        else if (strcmp(o.cmd, "summaries") == 0) rc = cmd_summaries(&o);
        else rc = cmd_plot(&o);
        goto done;
    }
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_load(o.file, st);
    rc = 1;
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
done:
    free(o.tags);
    return rc;
}
