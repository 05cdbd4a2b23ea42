/* Kernel fusion when an executable is compiled (fusion.c): chains of nodes that run as one
 * kernel, in this executable only. */
#ifndef DG_EXEC_FUSION_IMPL_H
#define DG_EXEC_FUSION_IMPL_H

#include <stdbool.h>

#include "distgraph/graph.h"

// nodes is the list to run, where each made node stands for the chain of nodes that ends in
// stands_for (whose outputs it computes; the chain's other nodes are left out). All arrays
// owned.
typedef struct exec_fused {
    dg_node **nodes;
    int n;
    dg_node **made;
    dg_node **stands_for;
    int n_made;
} exec_fused;
// False (out emptied) only when out of memory. default_type: the device type of nodes that
// name none.
bool exec_fuse(dg_node *const *nodes, int n, const dg_output *feeds, int n_feeds, const dg_output *fetches,
               int n_fetches, const char *default_type, exec_fused *out);
void exec_fused_free(exec_fused *f);
// False when DG_FUSION=0 is in the environment.
bool exec_fusion_enabled(void);

#endif
