/* Layout and SVG of a placed, partitioned graph (svg_layout.h), written by hand rather than
 * handed to Graphviz (libgvc/libcgraph, the `dot` layout). What the picture must show is
 * specific to a partitioned graph: one column per device, in an order chosen to keep heavily
 * connected devices side by side; rows shared by all columns (a node's row is its longest
 * path over every edge, Send/Recv included, so a _Recv sits below what it waits for on
 * another device); and Send/Recv edges that never cross a box, each in its own lane of the
 * gaps between rows and of the corridors between columns, labelled with its tensor where
 * the label covers nothing. dot ranks clusters globally too, but keeps neither clusters as
 * ordered columns nor edges out of other clusters' boxes without invisible-edge tricks, its
 * SVG would change what readers of ours rely on (marker ids, text labels, the legend), and
 * libgvc loads its layouts as plugins and pulls in some 17 libraries (gd, pango, X11, ...)
 * for one subcommand. The layout here is a Sugiyama-style pass small enough to read:
 * longest-path layers, barycentre sweeps to cut crossings, greedy wrapping of wide rows, and
 * channel routing for the Send/Recv edges. */
#include "svg_layout.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

enum { K_OTHER, K_VARIABLE, K_RECV, K_UPDATE, K_GRADIENT, K_INPUT, K_CONST, N_KINDS };
static const char *const kind_fill[N_KINDS] = {"#ffffff", "#fff2cc", "#fde0c5", "#d5e8d4",
                                                "#dae8fc", "#e1d5e7", "#f2f2f2"};
static const char *const kind_stroke[N_KINDS] = {"#666666", "#b7950b", "#e6550d", "#5d9b4f",
                                                  "#5b7fb5", "#8e6aa3", "#999999"};
static const char *const kind_name[N_KINDS] = {"op", "variable", "_Recv", "variable update",
                                                "gradient", "placeholder", "constant"};

#define CHAR_W 6.7    // monospace at 11px
#define LINE_H 13.0
#define NODE_GAP 14.0
#define ROW_GAP 44.0
#define COL_GAP 150.0
#define COL_PAD 16.0
#define TITLE_H 34.0
#define MAX_ROW_W 900.0   // a layer's nodes wrap onto more lines past this width

static const char *const edge_style[SVG_N_EDGE_KINDS] = {
    "stroke=\"#555\" stroke-width=\"1.1\"",
    "stroke=\"#aaa\" stroke-width=\"0.9\" stroke-dasharray=\"2,3\"",
    "stroke=\"#e6550d\" stroke-width=\"2\" stroke-dasharray=\"8,4\"",
    "stroke=\"#fd8d3c\" stroke-width=\"1.4\" stroke-dasharray=\"3,3\""};
static const char *const edge_marker[SVG_N_EDGE_KINDS] = {"arrow-data", "arrow-ctrl", "arrow-xfer",
                                                           "arrow-xfer-ctrl"};
static const char *const edge_color[SVG_N_EDGE_KINDS] = {"#555", "#aaa", "#e6550d", "#fd8d3c"};
static const char *const edge_name[SVG_N_EDGE_KINDS] = {"data", "control", "Send/Recv: tensor",
                                                         "Send/Recv: control"};

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

// Splits text at '/' into lines of at most SVG_LINE_CHARS; keeps the last SVG_MAX_LINES - 1 lines
// (the op takes one more), marking a cut with "...".
static void wrap_label(svg_vnode *v, const char *text) {
    char lines[64][SVG_LINE_CHARS + 4];
    int n = 0;
    lines[0][0] = 0;
    const char *p = text;
    while (*p && n < 63) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) + 1 : strlen(p);
        size_t cur = strlen(lines[n]);
        if (cur + len <= SVG_LINE_CHARS) {
            memcpy(lines[n] + cur, p, len);
            lines[n][cur + len] = 0;
            p += len;
        } else if (cur == 0) {
            memcpy(lines[n], p, SVG_LINE_CHARS);
            lines[n][SVG_LINE_CHARS] = 0;
            p += SVG_LINE_CHARS;
            lines[++n][0] = 0;
        } else {
            lines[++n][0] = 0;
        }
    }
    if (lines[n][0]) n++;
    int keep = n < SVG_MAX_LINES - 1 ? n : SVG_MAX_LINES - 1, first = n - keep;
    v->n_lines = keep;
    for (int i = 0; i < keep; i++) {
        if (i == 0 && first > 0) snprintf(v->lines[i], sizeof v->lines[i], "...%.*s", SVG_LINE_CHARS - 3, lines[first]);
        else snprintf(v->lines[i], sizeof v->lines[i], "%s", lines[first + i]);
    }
}

// Sort helper: indices by svg_vnode key, then by current order.
static svg_vnode *sort_nodes;
static int cmp_idx(const void *a, const void *b) {
    const svg_vnode *x = &sort_nodes[*(const int *)a], *y = &sort_nodes[*(const int *)b];
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->order > y->order) - (x->order < y->order);
}

// Places the nodes of each (partition, row) cell left to right in array order, centred in
// the column.
static void place_x(svg_layout *L, int **cells, const int *cell_n) {
    for (int c = 0; c < L->n_parts; c++)
        for (int r = 0; r < L->n_layers; r++) {
            const int *ids = cells[c * L->n_layers + r];
            int k = cell_n[c * L->n_layers + r];
            int col = L->col_of[c];
            for (int i = 0, line = 0; i < k; line++) {
                // Greedy lines no wider than the column; each line centred.
                int j = i;
                double total = L->v[ids[j++]].w;
                while (j < k && total + NODE_GAP + L->v[ids[j]].w <= L->col_w[col])
                    total += NODE_GAP + L->v[ids[j++]].w;
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
static void order_columns(svg_layout *L) {
    int n = L->n_parts;
    for (int i = 0; i < n; i++) L->col_of[i] = i;
    if (n < 3 || n > 7) return;
    int *w = inspect_xcalloc((size_t)(n * n), sizeof *w);
    for (int k = 0; k < L->n_e; k++)
        if (L->e[k].kind >= SVG_E_XFER) {
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

static void layout_graph(svg_layout *L) {
    int n = L->n_v;
    // Layers: longest path over every edge, Send/Recv included, so a device's nodes line up
    // with what they wait for on other devices. Kahn's order; a node left on a control cycle
    // is taken in index order.
    int *indeg = inspect_xcalloc((size_t)n, sizeof *indeg), *queue = inspect_xcalloc((size_t)n + 1, sizeof *queue);
    int *out_start = inspect_xcalloc((size_t)n + 1, sizeof *out_start);
    int *out = inspect_xcalloc((size_t)L->n_e + 1, sizeof *out);
    int *fill = inspect_xcalloc((size_t)n, sizeof *fill), *left = inspect_xcalloc((size_t)n, sizeof *left);
    bool *done = inspect_xcalloc((size_t)n, sizeof *done);
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
    int *remap = inspect_xcalloc((size_t)max_layer + 1, sizeof *remap);
    for (int i = 0; i < n; i++) remap[L->v[i].layer] = 1;
    int n_layers = 0;
    for (int l = 0; l <= max_layer; l++) remap[l] = remap[l] ? n_layers++ : -1;
    for (int i = 0; i < n; i++) L->v[i].layer = remap[L->v[i].layer];
    L->n_layers = n_layers ? n_layers : 1;
    free(remap);

    // Cells (partition x row) in index order.
    int n_cells = L->n_parts * L->n_layers;
    int *cell_n = inspect_xcalloc((size_t)n_cells, sizeof *cell_n);
    int **cells = inspect_xcalloc((size_t)n_cells, sizeof *cells);
    for (int i = 0; i < n; i++) cell_n[L->v[i].part * L->n_layers + L->v[i].layer]++;
    for (int c = 0; c < n_cells; c++) cells[c] = inspect_xcalloc((size_t)cell_n[c] + 1, sizeof **cells);
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
    int *cnt = inspect_xcalloc((size_t)n, sizeof *cnt);
    double *sum = inspect_xcalloc((size_t)n, sizeof *sum);
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
    double *line_h = inspect_xcalloc((size_t)n + 1, sizeof *line_h);
    double *line_y = inspect_xcalloc((size_t)n + 1, sizeof *line_y);
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
                svg_vnode *v = &L->v[ids[i]];
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
static void route_transfers(svg_layout *L) {
    int nb = L->n_layers, nc = L->n_parts;
    int *band_n = inspect_xcalloc((size_t)nb + 1, sizeof *band_n);
    int *band_i = inspect_xcalloc((size_t)nb + 1, sizeof *band_i);
    int *corr_n = inspect_xcalloc((size_t)nc + 1, sizeof *corr_n);
    int *corr_i = inspect_xcalloc((size_t)nc + 1, sizeof *corr_i);
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < L->n_e; k++) {
            svg_vedge *e = &L->e[k];
            if (e->kind < SVG_E_XFER) continue;
            const svg_vnode *a = &L->v[e->from], *b = &L->v[e->to];
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

static void svg_edge(FILE *f, const svg_layout *L, const svg_vedge *e) {
    const svg_vnode *a = &L->v[e->from], *b = &L->v[e->to];
    if (e->kind >= SVG_E_XFER) {
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
static void svg_edge_labels(FILE *f, const svg_layout *L) {
    static const double ts[] = {0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.1, 0.9, 0.0, 1.0};
    double (*placed)[4] = inspect_xcalloc((size_t)L->n_e + 1, sizeof *placed);
    int n_placed = 0;
    for (int i = 0; i < L->n_e; i++) {
        const svg_vedge *e = &L->e[i];
        if (e->kind < SVG_E_XFER) continue;
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
        inspect_xml_str(f, e->label);
        fprintf(f, "</text>\n");
    }
    free(placed);
}

static void svg_node(FILE *f, const svg_vnode *v) {
    fprintf(f, "<g><title>");
    inspect_xml_str(f, dg_node_name(v->n));
    fprintf(f, " (");
    inspect_xml_str(f, dg_node_op_type(v->n));
    fprintf(f, ")</title>\n");
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" rx=\"7\" fill=\"%s\" stroke=\"%s\" "
               "stroke-width=\"1.2\"/>\n", v->x, v->y, v->w, v->h, kind_fill[v->kind], kind_stroke[v->kind]);
    double cx = v->x + v->w / 2, y = v->y + 5 + LINE_H - 3;
    for (int i = 0; i < v->n_lines; i++, y += LINE_H) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" fill=\"#111\">", cx, y);
        inspect_xml_str(f, v->lines[i]);
        fprintf(f, "</text>\n");
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\" fill=\"#666\" "
               "font-style=\"italic\">", cx, y);
    inspect_xml_str(f, dg_node_op_type(v->n));
    fprintf(f, "</text></g>\n");
}

bool svg_layout_write(FILE *f, const svg_layout *L, const char *const *devices, const char *title) {
    double legend_h = 36;
    double W = L->width < 900 ? 900 : L->width, H = L->height + legend_h;
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
               "font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\">\n", W, H, W, H);
    fprintf(f, "<title>");
    inspect_xml_str(f, title);
    fprintf(f, "</title>\n<defs>\n");
    for (int k = 0; k < SVG_N_EDGE_KINDS; k++)
        fprintf(f, "<marker id=\"%s\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"%d\" "
                   "markerHeight=\"%d\" markerUnits=\"userSpaceOnUse\" orient=\"auto\">"
                   "<path d=\"M0,0 L10,5 L0,10 z\" fill=\"%s\"/></marker>\n",
                edge_marker[k], k >= SVG_E_XFER ? 11 : 8, k >= SVG_E_XFER ? 11 : 8, edge_color[k]);
    fprintf(f, "</defs>\n<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#ffffff\"/>\n", W, H);
    // One box per device.
    for (int c = 0; c < L->n_parts; c++) {
        int col = L->col_of[c];
        double x = L->col_x[col], w = L->col_w[col] + 2 * COL_PAD;
        fprintf(f, "<g><rect x=\"%.1f\" y=\"10\" width=\"%.1f\" height=\"%.1f\" rx=\"10\" fill=\"#f7f7f7\" "
                   "stroke=\"#444\" stroke-width=\"1.5\"/>\n", x, w, L->height - 20);
        fprintf(f, "<text x=\"%.1f\" y=\"32\" font-size=\"13\" font-weight=\"bold\" text-anchor=\"middle\" "
                   "fill=\"#222\">", x + w / 2);
        inspect_xml_str(f, devices[c]);
        fprintf(f, "</text></g>\n");
    }
    static const int edge_order[SVG_N_EDGE_KINDS] = {SVG_E_CTRL, SVG_E_DATA, SVG_E_XFER_CTRL, SVG_E_XFER};
    for (int k = 0; k < SVG_N_EDGE_KINDS; k++)
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
    for (int k = 0; k < SVG_N_EDGE_KINDS; k++) {
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" %s marker-end=\"url(#%s)\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#333\">%s</text>\n",
                x, y + 7, x + 34, y + 7, edge_style[k], edge_marker[k], x + 40, y + 11, edge_name[k]);
        x += 56 + CHAR_W * (double)strlen(edge_name[k]);
    }
    fprintf(f, "</svg>\n");
    return !ferror(f);
}

void svg_layout_node_init(svg_vnode *v, const dg_node *n, int part, const char *label) {
    memset(v, 0, sizeof *v);
    v->n = n;
    v->part = part;
    v->kind = node_kind(n);
    wrap_label(v, label);
    size_t wmax = strlen(dg_node_op_type(n));
    for (int l = 0; l < v->n_lines; l++)
        if (strlen(v->lines[l]) > wmax) wmax = strlen(v->lines[l]);
    v->w = (double)wmax * CHAR_W + 18;
    if (v->w < 64) v->w = 64;
    v->h = (v->n_lines + 1) * LINE_H + 10;
}

void svg_layout_arrange(svg_layout *L, const char *const *devices) {
    int np = L->n_parts;
    L->col_of = inspect_xcalloc((size_t)np + 1, sizeof *L->col_of);
    L->col_x = inspect_xcalloc((size_t)np + 1, sizeof *L->col_x);
    L->col_w = inspect_xcalloc((size_t)np + 1, sizeof *L->col_w);
    order_columns(L);
    // A column is at least as wide as its title (bold 13px: about 8px a character).
    for (int c = 0; c < np; c++) L->col_w[L->col_of[c]] = (double)strlen(devices[c]) * 8.0;
    L->row_y = inspect_xcalloc((size_t)L->n_v + 1, sizeof *L->row_y);
    L->row_h = inspect_xcalloc((size_t)L->n_v + 1, sizeof *L->row_h);
    layout_graph(L);
    route_transfers(L);
}

void svg_layout_free(svg_layout *L) {
    for (int i = 0; i < L->n_e; i++) free(L->e[i].label);
    free(L->v);
    free(L->e);
    free(L->col_of);
    free(L->col_x);
    free(L->col_w);
    free(L->row_y);
    free(L->row_h);
    memset(L, 0, sizeof *L);
}
