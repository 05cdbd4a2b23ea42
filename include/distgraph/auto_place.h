/* Placement without scopes: a cost model (each op's time on a device type, from measured times
 * or from its FLOPs and bytes against the type's throughput; links as latency plus bytes over
 * bandwidth), a step simulator (one compute stream per device, or streams a task's devices
 * share; one channel per direction of each device pair; memory by liveness), and placers that choose devices by them: Baechi's
 * m-TOPO, m-ETF and m-SCT, METIS's balanced cut of fewest bytes, and the automatic placer (the
 * best of those, improved under the simulator within a time budget). docs/PLACEMENT.md says how
 * each works and what it honours.
 * A cost model is not thread-safe while it is changed; reading it from threads is. */
#ifndef DISTGRAPH_AUTO_PLACE_H
#define DISTGRAPH_AUTO_PLACE_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/placer.h"

#ifdef __cplusplus
extern "C" {
#endif

// What a device type does per second, and what each op costs it whatever its size.
typedef struct dg_device_perf {
    double flops_per_s;     // dense arithmetic: MatMul, BatchMatMul, Conv2D, attention
    double bytes_per_s;     // memory traffic: every other op reads its inputs, writes its outputs
    double op_overhead_s;   // launching one op
} dg_device_perf;

// A transfer of b bytes takes latency_s + b / bytes_per_s.
typedef struct dg_link_perf {
    double latency_s;
    double bytes_per_s;
} dg_link_perf;

typedef enum dg_link_kind {
    DG_LINK_SAME_TASK = 0,    // two devices of one process
    DG_LINK_SAME_HOST = 1,    // two processes of one host (shared memory)
    DG_LINK_OTHER_HOST = 2,   // the network
} dg_link_kind;

typedef struct dg_cost_model dg_cost_model;

// Nominal figures: CPU 50 GFLOP/s, 10 GB/s, 2 us an op; GPU 50 TFLOP/s, 2 TB/s, 8 us; links
// 2 us + 20 GB/s in a task, 20 us + 5 GB/s on a host, 100 us + 1.25 GB/s between hosts; every
// task on one host. A calibration (dg_cost_model_load) replaces them with measured ones.
// Returns: new, caller frees with dg_cost_model_free().
dg_cost_model *dg_cost_model_new(void);
void dg_cost_model_free(dg_cost_model **m);
// Sets the figures of a device type ("CPU", "GPU"); each must be positive and finite.
bool dg_cost_model_set_device(dg_cost_model *m, const char *device_type, dg_device_perf perf, dg_status *st);
bool dg_cost_model_set_link(dg_cost_model *m, dg_link_kind kind, dg_link_perf perf, dg_status *st);
// How many compute streams the devices of device_type in one task share (0 to 1024; 0, the
// default: each device has a stream of its own). The CPUs of one process run their ops on the
// session's inter-op threads, whichever device an op is placed on: with n of them, n streams
// shared by the task's CPUs model it (an op takes the first stream free). False when the type is
// unknown or n out of range. Calibration files hold it as "task_streams" of a device type.
bool dg_cost_model_set_task_streams(dg_cost_model *m, const char *device_type, int n, dg_status *st);
int dg_cost_model_task_streams(const dg_cost_model *m, const char *device_type);
// How an executor shares those threads out, so that the simulator runs a step as the executor
// does (without it, an op ready on a task's shared streams takes the first one free, at once):
// the task's root ops start on its first thread; a thread goes on with what its op made ready
// itself, and hands to another thread only the ops that handoff says to (distgraph's and
// TensorFlow's executors: an expensive kernel, beyond the first op made ready); an op handed
// over, or made ready by a value from another device, waits the type's wake time
// (dg_cost_model_set_wake) when no thread is running. handoff(ctx, n, device_type) is called
// while a placement problem is built; NULL restores the default. dg_step_traces_measure installs
// distgraph's executor's; a calibration file does not hold it.
typedef bool (*dg_op_handoff_fn)(void *ctx, const dg_node *n, const char *device_type);
void dg_cost_model_set_handoff(dg_cost_model *m, dg_op_handoff_fn handoff, void *ctx);
// The time a sleeping thread of a task's shared streams takes to start an op handed to it (0 to
// 1 s; default 0). Calibration files hold it as "wake_s" of a device type.
bool dg_cost_model_set_wake(dg_cost_model *m, const char *device_type, double seconds, dg_status *st);
double dg_cost_model_wake(const dg_cost_model *m, const char *device_type);
// The host of each task, from the cluster's addresses (the part before the last ':'): tasks of
// different hosts talk over DG_LINK_OTHER_HOST. Borrows c for the duration of the call.
bool dg_cost_model_set_hosts(dg_cost_model *m, const dg_cluster *c, dg_status *st);
// A measured time of the node named node_name on device_type (from a step timeline), which
// replaces the estimate from FLOPs and bytes.
bool dg_cost_model_set_measured(dg_cost_model *m, const char *node_name, const char *device_type,
                                double seconds, dg_status *st);
// Reads a calibration file (JSON: {"devices": {"CPU": {"flops_per_s": .., "bytes_per_s": ..,
// "op_overhead_s": ..}}, "links": {"same_task": {"latency_s": .., "bytes_per_s": ..}, ...}}),
// naming the file and key of what is wrong. Writes the model's figures in the same form.
bool dg_cost_model_load(dg_cost_model *m, const char *path, dg_status *st);
bool dg_cost_model_save(const dg_cost_model *m, const char *path, dg_status *st);

// The estimate for node n on a device of device_type (measured, else the roofline of its FLOPs
// and bytes plus the overhead), and the FLOPs and bytes it was made of (either may be NULL).
double dg_cost_model_op_seconds(const dg_cost_model *m, const dg_node *n, const char *device_type,
                                double *flops, double *bytes);
// Which link joins devices (or tasks: "/job:ps/replica:0/task:0") a and b.
dg_link_kind dg_cost_model_link_kind(const dg_cost_model *m, const char *a, const char *b);
// The figures of a link kind.
dg_link_perf dg_cost_model_link(const dg_cost_model *m, dg_link_kind kind);
// A transfer of bytes from device a to device b (complete names); 0 when a equals b.
double dg_cost_model_transfer_seconds(const dg_cost_model *m, const char *a, const char *b, double bytes);

// A simulated step of placed nodes (each with its assigned device, one of devices).
typedef struct dg_step_estimate {
    double step_s;              // from the first op's start to the last op's end
    int n_devices;
    double *busy_s;             // per device: the time its stream computed
    int64_t *peak_bytes;        // per device: the most bytes alive at once (variables always;
                                // each output from its op's start to its last local reader's end)
    int64_t *static_bytes;      // per device: variables plus every output, none freed (the
                                // bound the placers keep under the caps)
    int64_t transfer_bytes, n_transfers;
    int64_t n_ops;
} dg_step_estimate;

// Simulates one step of nodes (a whole graph's, or what a session would run) as placed: an op
// starts on its device's stream when its inputs are there, in the order they became ready; each
// tensor crosses to each other device once, on the channel of that direction, one transfer
// after another. Deterministic. Fills est (free with dg_step_estimate_clear); false and st
// naming the node when a node is unplaced or on a device not in devices.
bool dg_simulate_step(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
                      const dg_cost_model *m, dg_step_estimate *est, dg_status *st);
void dg_step_estimate_clear(dg_step_estimate *est);

typedef enum dg_auto_placer {
    DG_AUTO_PLACER_AUTO = 0,   // the best of the four below, refined under the simulator
    DG_AUTO_PLACER_M_TOPO = 1,
    DG_AUTO_PLACER_M_ETF = 2,
    DG_AUTO_PLACER_M_SCT = 3,
    DG_AUTO_PLACER_METIS = 4,  // METIS's k-way cut of fewest bytes, balanced (libmetis)
} dg_auto_placer;

typedef struct dg_auto_place_options {
    dg_auto_placer placer;
    const dg_cost_model *cost;      // NULL: the nominal model
    const int64_t *memory_caps;     // per device (n_devices), bytes; NULL or 0 entries: no cap
    double time_budget_s;           // refinement; 0: by graph size (the whole placement 40 us
                                    // a node, 0.8 s to 8 s, at least 0.2 s of it refining);
                                    // negative: none
    uint64_t seed;                  // refinement's random moves
    int64_t unknown_dim;            // what an unknown dimension stands for; 0: an unknown
                                    // shape is an error naming the node
    dg_placement_options placement; // soft placement, default device, filters, kernels
    // The step's fetches and targets (the train op): only the nodes they need are costed,
    // simulated and kept under the caps; the others (initializers) go beside their readers.
    // NULL: every node but the variables' initializers (and what only they read) is in it.
    const dg_node *const *targets;
    int n_targets;
    // Nodes already placed (an assigned device among devices) keep their device, and so does
    // the rest of their colocation group: a graph placed before grows without moving.
    bool keep_assigned;
} dg_auto_place_options;

dg_auto_place_options dg_auto_place_options_default(void);

typedef struct dg_auto_place_report {
    dg_auto_placer chosen;          // which placer's result was kept (AUTO: the refined one)
    double predicted_step_s;        // of the placement made
    double candidate_step_s[5];     // indexed by dg_auto_placer: each placer's prediction, 0 when
                                    // not run or infeasible
    double critical_path_s;         // the longest path of op times (fastest devices, no
                                    // transfers): no placement's step is shorter
    double seconds;                 // wall time of the whole placement
    int n_moves;                    // refinement moves kept
    int n_simulations;              // steps simulated, and ops simulated a second in them
    double simulated_ops_per_s;
    dg_step_estimate estimate;      // the simulated step of the placement made
} dg_auto_place_report;

// Places nodes on devices (complete names) without needing device scopes: requests, colocation,
// device filters and kernels are honoured as dg_place honours them, and every device's static
// bytes stay under its cap. Sets each node's assigned device. report may be NULL; else fill it
// (free with dg_auto_place_report_clear). False, nothing assigned, and st naming what when a
// node cannot be placed, a cap no placement fits (the node and bytes), or a node with an
// unknown shape on a path that needs its size.
bool dg_auto_place_nodes(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
                         const dg_auto_place_options *opts, dg_auto_place_report *report, dg_status *st);
// The same over every node of g.
bool dg_auto_place(dg_graph *g, const char *const *devices, int n_devices, const dg_auto_place_options *opts,
                   dg_auto_place_report *report, dg_status *st);
void dg_auto_place_report_clear(dg_auto_place_report *r);
const char *dg_auto_placer_name(dg_auto_placer p);

#ifdef __cplusplus
}
#endif
#endif
