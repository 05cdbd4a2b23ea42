/* Placement and partitioning (TensorFlow's placer.cc and graph_partition.cc).
 * dg_place gives every node of a set one concrete device of a device list, keeping
 * colocation groups together; dg_partition cuts the placed nodes into one graph per device,
 * replacing each cross-device edge by a _Send/_Recv pair. Both run in time linear in the
 * number of nodes and edges (times the number of devices for placement). */
#ifndef DISTGRAPH_PLACER_H
#define DISTGRAPH_PLACER_H

#include <stdbool.h>

#include "distgraph/cluster.h"
#include "distgraph/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_placement_options {
    bool allow_soft_placement;   // a request no device can meet falls back (same task, CPU)
    const char *default_device;  // merged under every node's request; NULL: none
    const char *const *device_filters;   // only devices matching one of these; NULL: all
    int n_device_filters;
    // Whether a device type has a kernel for node n. NULL: every op runs everywhere.
    bool (*supports)(void *ctx, const dg_node *n, const char *device_type);
    void *supports_ctx;
} dg_placement_options;

dg_placement_options dg_placement_options_default(void);

// Assigns a device from devices (complete canonical names) to each of nodes, stored on the
// node (dg_node_assigned_device). Returns false and sets st naming the node, its request and
// the devices available when a node cannot be placed or a colocation group is unsatisfiable.
bool dg_place(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
              const dg_placement_options *opts, dg_status *st);

typedef struct dg_partitions dg_partitions;

// Cuts placed nodes into one graph per device. Inputs from outputs listed in feeds stay as
// references to the original (fed) nodes. Each cross-device data edge becomes one
// _Send/_Recv pair per (tensor, destination device), however many consumers; a cross-device
// control edge is carried by a dummy tensor. Output is deterministic.
// Returns: new, caller frees with dg_partitions_free(); NULL on error.
dg_partitions *dg_partition(dg_node *const *nodes, int n_nodes, const dg_output *feeds, int n_feeds,
                            int64_t incarnation, dg_status *st);
// The same, for a client on client_device (a complete device name): fed values consumed on
// other devices are sent from the client's partition, and fetches computed elsewhere are
// sent to it. fetch_out[i] (n_fetches long) receives the output to read for fetches[i]
// (in the client's partition, or the fed original). Returns: new; NULL on error.
dg_partitions *dg_partition_ex(dg_node *const *nodes, int n_nodes, const dg_output *feeds,
                               int n_feeds, const dg_output *fetches, int n_fetches,
                               const char *client_device, int64_t incarnation, dg_output *fetch_out,
                               dg_status *st);
void dg_partitions_free(dg_partitions **p);
int dg_partitions_count(const dg_partitions *p);
// Device and graph of partition i (sorted by device name). Returns: borrowed, valid until
// dg_partitions_free().
const char *dg_partitions_device(const dg_partitions *p, int i);
dg_graph *dg_partitions_graph(const dg_partitions *p, int i);
// The copy of an original node in its partition, or NULL. Returns: borrowed.
dg_node *dg_partitions_find(const dg_partitions *p, const dg_node *original);
int dg_partitions_num_sends(const dg_partitions *p);
int dg_partitions_num_recvs(const dg_partitions *p);

// The devices of every task of a cluster: "/job:J/replica:0/task:T/device:CPU:0" and
// GPU:0 .. GPU:gpus_per_task-1, jobs sorted by name, tasks ascending. Returns the count and
// sets *out to a new array of new strings (free with dg_device_list_free); -1 on error.
int dg_cluster_devices(const dg_cluster *c, int gpus_per_task, char ***out, dg_status *st);
void dg_device_list_free(char **list, int n);

#ifdef __cplusplus
}
#endif
#endif
