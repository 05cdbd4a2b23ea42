/* The drawing of a placed, partitioned graph (dg-inspect svg): one column per device, boxes
 * for the nodes in rows by dependency depth, edges within a device as curves, Send/Recv edges
 * routed between the columns with their tensor as a label. graph_cmds.c decides which nodes
 * and edges there are (it folds the partitioner's helper nodes into edges); this module
 * places them and writes the SVG. */
#ifndef DG_INSPECT_SVG_LAYOUT_H
#define DG_INSPECT_SVG_LAYOUT_H

#include <stdbool.h>
#include <stdio.h>

#include <distgraph/distgraph.h>

#define SVG_MAX_LINES 4    // lines of a box: up to 3 of its name, then its op
#define SVG_LINE_CHARS 26

enum { SVG_E_DATA, SVG_E_CTRL, SVG_E_XFER, SVG_E_XFER_CTRL, SVG_N_EDGE_KINDS };

// A node's box. Set by svg_layout_node_init; positions by svg_layout_arrange.
typedef struct svg_vnode {
    const dg_node *n;   // borrowed: the node of a partition graph
    int part, layer, order;
    int subline;        // long rows wrap onto several lines within their layer
    int kind;           // the colour: variable, _Recv, update, gradient, ...
    char lines[SVG_MAX_LINES][SVG_LINE_CHARS + 4];
    int n_lines;        // name lines; the op goes on one more
    double w, h, x, y;  // pixels; x, y: top-left
    double key;         // barycentre while ordering a row
} svg_vnode;

typedef struct svg_vedge {
    int from, to;       // indices into svg_layout.v
    int kind;           // SVG_E_*
    char *label;        // owned; Send/Recv edges only
    double pts[6][2];   // Send/Recv edges: the corners of their route
} svg_vedge;

// What to draw (v, e, n_parts: filled by the caller, arrays from malloc, owned by the layout)
// and where it goes (the rest: filled by svg_layout_arrange).
typedef struct svg_layout {
    svg_vnode *v;
    int n_v;
    svg_vedge *e;
    int n_e;
    int n_parts, n_layers;
    int *col_of;                               // partition -> column
    double *col_x, *col_w, *row_y, *row_h;     // by column / by row
    double width, height;
} svg_layout;

// Sets up the box of node n of partition part, showing label (split at '/', the end kept
// when too long) above the node's op. Borrows n until the layout is freed.
void svg_layout_node_init(svg_vnode *v, const dg_node *n, int part, const char *label);
// Places every box and routes every edge. devices: n_parts names, one per partition (the
// column titles). Borrows devices for the call.
void svg_layout_arrange(svg_layout *L, const char *const *devices);
// Writes the arranged layout as an SVG document with title; false when writing failed.
bool svg_layout_write(FILE *f, const svg_layout *L, const char *const *devices, const char *title);
// Frees what the layout owns (boxes, edges, labels, positions). Leaves L zeroed.
void svg_layout_free(svg_layout *L);

#endif
