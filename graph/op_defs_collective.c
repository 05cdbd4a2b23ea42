/* Op definitions of the collectives (all-reduce across workers). */
#include "graph_impl.h"

int graph_collective_op_defs(const graph_op_def **defs) {
    *defs = NULL;
    return 0;
}
