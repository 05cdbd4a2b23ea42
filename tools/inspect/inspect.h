/* dg-inspect's shared parts: the parsed command line, the subcommands main.c dispatches to,
 * and the output helpers every subcommand uses (JSON and XML string escaping, aligned tables,
 * status messages, allocation that exits on out-of-memory). Files: main.c (arguments, usage,
 * dispatch), graph_cmds.c (graph, place, partition, svg) over svg_layout.c, checkpoint_cmds.c
 * (checkpoints, variables), summaries_cmds.c (summaries, plot) over chart.c, events_cmd.c,
 * server_cmd.c. Exit codes of every subcommand: 0 done, 1 a file or server could not be read
 * (the message says why), 2 bad usage. */
#ifndef DG_INSPECT_H
#define DG_INSPECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <distgraph/distgraph.h>

typedef struct inspect_options {
    const char *cmd, *file, *cluster_spec, *out;   // borrowed from argv
    int gpus_per_task;
    bool json, soft_placement, hide_init;
    bool auto_place;            // place, partition, svg: --auto (dg_auto_place)
    const char *cost_file;      // --cost: a calibration for --auto
    int64_t memory_cap;         // --memory_cap: bytes a device may hold under --auto, 0 none
    int64_t unknown_dim;        // --unknown_dim: what an unknown dimension stands for, 0 an error
    dg_dtype mixed_precision;   // --mixed_precision: rewrite the graph first; DG_INVALID_DTYPE: no
    int64_t step;       // variables: --step, -1 the newest
    int64_t n_values;   // variables: --values, 0 none
    const char **tags;  // plot: --tag, in order, without repeats (strings borrowed from argv)
    int n_tags;
} inspect_options;

// ---- subcommands: each returns the exit status ----
int inspect_cmd_graph(const inspect_options *o, dg_graph *g);
int inspect_cmd_place(const inspect_options *o, dg_graph *g, dg_status *st);
int inspect_cmd_partition(const inspect_options *o, dg_graph *g, dg_status *st);
int inspect_cmd_svg(const inspect_options *o, dg_graph *g, dg_status *st);
int inspect_cmd_checkpoints(const inspect_options *o);
int inspect_cmd_variables(const inspect_options *o);
int inspect_cmd_summaries(const inspect_options *o);
int inspect_cmd_plot(const inspect_options *o);
int inspect_cmd_events(const inspect_options *o);
int inspect_cmd_server(const inspect_options *o);
int inspect_cmd_calibrate(const inspect_options *o);

// ---- helpers (inspect.c) ----

// Prints "dg-inspect: <what>: <CODE>: <message>" to stderr.
void inspect_die_status(const char *what, const dg_status *st);
// calloc, strdup and realloc that print a message and exit(1) when memory runs out.
// Returns: new, caller frees with free().
void *inspect_xcalloc(size_t n, size_t size);
char *inspect_xstrdup(const char *s);
void *inspect_xrealloc(void *p, size_t size);

// s as a JSON string, quotes included (bytes outside printable ASCII as \u00XX).
void inspect_json_str(FILE *f, const char *s);
// s escaped for XML text and attribute values (bytes outside printable ASCII as '?').
void inspect_xml_str(FILE *f, const char *s);

// A growable string: zero-initialise, append with inspect_sb_printf, free(b.s) at the end.
typedef struct inspect_sbuf {
    char *s;
    size_t n, cap;
} inspect_sbuf;
void inspect_sb_printf(inspect_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// The text so far ("" before the first append). Returns: borrowed, valid until the next append.
const char *inspect_sb_str(const inspect_sbuf *b);

// A table of rows of n_cols cells, printed with aligned columns.
typedef struct inspect_table {
    char ***rows;   // rows[r][c]: owned
    int n_rows, cap_rows, n_cols;
} inspect_table;
// Starts a table of n_cols columns whose first row is head (n_cols cells, copied; NULL: no
// head row).
void inspect_table_init(inspect_table *t, const char *const *head, int n_cols);
// Appends an empty row. Returns: borrowed, the row's cells (each NULL, to be filled with new
// strings, e.g. inspect_xstrdup), valid until the next append or inspect_table_free.
char **inspect_table_add(inspect_table *t);
// Prints the first n_cols columns; the last non-empty cell of a row is not padded.
void inspect_table_print(const inspect_table *t, int n_cols);
void inspect_table_free(inspect_table *t);

// Opens a checkpoint file for reading (dg_checkpoint_store_new without create); on failure
// prints "opening: <status>" and returns NULL. Returns: new, caller frees with
// dg_checkpoint_store_free().
dg_checkpoint_store *inspect_open_checkpoint(const char *file, dg_status *st);

// Whether path ends in ext, ignoring case (".png" matches "A.PNG"), with something before it.
bool inspect_has_ext(const char *path, const char *ext);

#endif
