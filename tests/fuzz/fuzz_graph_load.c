/* libFuzzer target for the graph-file loader (graph/serialize.c): any bytes must give either
 * a graph that serializes again, or NULL with an INVALID_ARGUMENT / DATA_LOSS status whose
 * message starts with "graph file: ". Built by hand, not by CMake: see README.md here. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/distgraph.h"
#include "distgraph/serialize.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dg_status *st = dg_status_new();
    dg_graph *g = dg_graph_from_msgpack(data, size, st);
    if (g) {
        if (!dg_status_ok(st)) abort();
        char *buf = NULL;
        size_t len = 0;
        // A loaded graph is a valid graph: it must serialize, and load again.
        if (!dg_graph_to_msgpack(g, &buf, &len, st)) abort();
        dg_graph *g2 = dg_graph_from_msgpack(buf, len, st);
        if (!g2 || dg_graph_num_nodes(g2) != dg_graph_num_nodes(g)) abort();
        dg_graph_free(&g2);
        free(buf);
        dg_graph_free(&g);
    } else {
        dg_code c = dg_status_code(st);
        if (c != DG_INVALID_ARGUMENT && c != DG_DATA_LOSS) abort();
        if (strncmp(dg_status_message(st), "graph file: ", 12) != 0) abort();
    }
    dg_status_free(&st);
    return 0;
}
