/* What the placers share: colocation groups and the devices each group may take. dg_place
 * (placer.c) takes each group's first allowed device; the automatic placer (auto_place.c)
 * chooses among the allowed ones under a cost model. */
#ifndef DG_PLACER_IMPL_H
#define DG_PLACER_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/auto_place.h"
#include "distgraph/placer.h"
#include "strmap_impl.h"

typedef struct placer_groups {
    int n_nodes, n_groups, n_devices;
    int *group_of;      // node (index into the nodes given) -> group, groups numbered in order
                        // of their oldest member
    uint8_t *allowed;   // n_groups x n_devices: 1 where the group may go (request, soft
                        // placement, filters and kernels all met)
    int *first;         // n_groups: dg_place's choice (accelerators first, then given order)
    bool *pinned;       // n_groups: some member requested a device (job, task, type or id)
} placer_groups;

// Unites colocation groups (explicit lists, ops with their variables by reference), merges
// each group's requests and finds the devices it may take. On failure sets st naming the node
// and the devices there were, as dg_place reports it. Returns false then, with *out empty.
bool placer_groups_build(dg_node *const *nodes, int n_nodes, const char *const *devices, int n_devices,
                         const dg_placement_options *opts, placer_groups *out, dg_status *st);
void placer_groups_clear(placer_groups *g);


// ---- the cost model (cost_model.c) ----

enum { PLACER_MAX_TYPES = 8, PLACER_MAX_HOSTS = 4096, PLACER_MAX_TASK_STREAMS = 1024 };

typedef struct placer_host {
    char *job;     // owned
    int task;
    int host;      // index among distinct hosts
} placer_host;

struct dg_cost_model {
    char types[PLACER_MAX_TYPES][32];
    dg_device_perf perf[PLACER_MAX_TYPES];
    int task_streams[PLACER_MAX_TYPES];   // > 0: a task's devices of the type share this many
                                          // streams (dg_cost_model_set_task_streams); 0: one each
    double wake_s[PLACER_MAX_TYPES];      // a sleeping thread of those streams takes this long
                                          // to start an op handed to it (dg_cost_model_set_wake)
    dg_op_handoff_fn handoff;             // NULL: any ready op on any free stream, at once
    void *handoff_ctx;
    int n_types;
    dg_link_perf links[3];
    placer_host *hosts;   // owned; empty: every task on one host
    int n_hosts, cap_hosts;
    graph_strmap measured;   // "type\tnode name" -> 1 + index into measured_items
    struct placer_measured { char *key; double s; } *measured_items;   // keys owned
    int n_measured, cap_measured;
};

// The figures of device_type (a known one, else the CPU's).
const dg_device_perf *placer_device_perf(const dg_cost_model *m, const char *device_type);
// The link between devices a and b (complete names; an unreadable one: other hosts).
dg_link_perf placer_link(const dg_cost_model *m, const char *a, const char *b);
// The host number of /job:J/task:T (-1 when not known: the same host as every other).
int placer_task_host(const dg_cost_model *m, const char *job, int task);
// An output's bytes: its shape's elements (unknown dimensions as unknown_dim) times its dtype's
// size; -1 when a dimension is unknown and unknown_dim is 0.
int64_t placer_output_bytes(const dg_node *n, int i, int64_t unknown_dim);
// Node n's FLOPs and bytes (unknown dimensions as unknown_dim); false when a size it needs is
// unknown.
bool placer_op_work(const dg_node *n, int64_t unknown_dim, double *flops, double *bytes);
// dg_cost_model_op_seconds with unknown dimensions as unknown_dim (0: as 1).
double placer_op_seconds(const dg_cost_model *m, const dg_node *n, const char *device_type, int64_t unknown_dim,
                         double *flops, double *bytes);
// Whether n costs nothing but its overhead (constants, variables, views, NoOp).
bool placer_op_is_free(const dg_node *n);

// ---- a placement problem and its simulation (simulate.c) ----

// The nodes to place as arrays the simulator and placers walk: edges by index, each op's time
// on each device, each output's bytes, each device pair's link.
typedef struct placer_problem {
    int n, n_dev;
    dg_node *const *nodes;
    const char *const *devices;
    int *dev_type;           // n_dev: index into the cost model's types
    int n_types;
    double *cost;            // n x n_types seconds
    int *out_start;          // n + 1: node u's outputs are gid out_start[u] .. out_start[u+1]-1,
                             // the last of them its control "output"
    int64_t *gid_bytes;      // bytes of each output (control: 4, a dummy scalar)
    int *succ_start, *succ, *succ_gid;   // CSR, each node's out-edges sorted by output
    int *pred_start, *pred, *pred_gid;   // CSR, in-edges
    int *n_in;               // in-edges per node
    int64_t *persist;        // n: bytes of the variable a VariableV2 holds (never freed)
    int64_t *static_bytes;   // n: persist plus the outputs
    double *lat, *inv_bw;    // n_dev x n_dev links (0 on the diagonal)
    double *copy;            // n_dev x n_dev: seconds a byte keeps each end's stream busy (CPUs of
                             // two tasks copy what they send and receive), 0 where none
    int *stream_first, *stream_count;   // n_dev: the device's streams are slots stream_first ..
                                        // + stream_count - 1; devices sharing streams share slots
    int n_slots;
    int *topo;               // a topological order (by id where free)
    // The executor's threads (dg_cost_model_set_handoff), for devices whose streams are a task's
    // shared threads: pool[d] says so, wake[d] is their wake-up time, handoff[v] marks an op
    // handed to another thread (not run by the thread that made it ready, unless it came first).
    unsigned char *pool, *handoff;
    double *wake;
} placer_problem;

// Builds the problem of nodes over devices (complete names); unknown dimensions stand for
// unknown_dim (0: an error naming the node and output). False with st set on error.
bool placer_problem_build(placer_problem *p, dg_node *const *nodes, int n, const char *const *devices, int n_dev,
                          const dg_cost_model *m, int64_t unknown_dim, dg_status *st);
void placer_problem_clear(placer_problem *p);

// One simulation's scratch and results, reused between runs.
typedef struct placer_sim {
    double *start, *finish;  // per node
    int *crit;               // per node: the predecessor whose arrival made it ready, -1 none
    int *blocker;            // per node: the op its stream ran before it, when the node, ready,
                             // waited for that stream; else -1 (also when it waited for a copy
                             // between tasks, which is no op)
    int *slot_last;          // per stream slot: the op it ran last (scratch)
    int *pending;            // scratch
    double *slot_free, *chan_free, *busy;   // slot_free: per stream slot (placer_problem)
    int *slot_of;            // per node: the stream slot it ran on
    int *stamp_gid, *stamp_xfer;   // per device: the last transfer made, for one per tensor
    struct placer_xfer { int gid, src, dst; double start, end, arrive; } *xfers;
    int n_xfers, cap_xfers;
    int *edge_xfer;          // per out-edge: its transfer, -1 local
    struct placer_event { double t; int64_t seq; int kind, id; } *heap;
    int n_heap, cap_heap;
    double step_s;
    int last;                // the node that finished last
    int runs;                // simulations run, and their seconds in all
    double run_s;
    int64_t ops_run;         // ops those simulations finished (a bounded one stops early)
} placer_sim;

// The bytes each device holds with node i on dev[i] (used, n_dev long): its nodes' static
// bytes, and one copy of each tensor it receives from another device.
void placer_static_usage(const placer_problem *p, const int *dev, int64_t *used, int *stamp);

// Simulates the problem with node i on device dev[i]. Returns the step time; -1 when a
// cycle leaves nodes that never run. The simulation's times stay in sim.
double placer_simulate(const placer_problem *p, const int *dev, placer_sim *sim);
// The same, stopped at the first event after bound: then it returns that event's time (the
// step is at least that long) and sim holds a partial run.
double placer_simulate_bounded(const placer_problem *p, const int *dev, placer_sim *sim, double bound);
void placer_sim_clear(placer_sim *sim);
// The bytes alive at once on each device (peak, n_dev long) of the last simulation.
bool placer_sim_peak_memory(const placer_problem *p, const int *dev, placer_sim *sim, int64_t *peak, dg_status *st);

// ---- one run of a placer (auto_place.c, metis_place.c) ----

typedef struct placer_state {
    const placer_problem *p;
    const placer_groups *pg;
    const int64_t *caps;     // n_dev, 0: none; NULL: none
    int64_t *group_bytes;    // per group: its members' static bytes
    int *member_start, *members;   // CSR: each group's nodes
    int64_t *used;           // per device: static bytes placed there
    int *gdev;               // per group, -1 before
    int *dev;                // per node, -1 before
    uint64_t *recv;          // per output: the devices (of the first 64) charged a copy of it
    int *gid_mark;           // per output: scratch marks, gid_mark_next a fresh value
    int gid_mark_next;
    struct placer_metis_graph *metis;   // the groups as METIS's graph, once built (metis_place.c)
} placer_state;

// A state's groups as METIS's graph: its idx_t arrays (metis_place.c builds and reads them;
// placer_state_clear frees them) and the groups' bytes in all.
typedef struct placer_metis_graph {
    void *xadj, *adj, *adjw, *vw;
    double btot;
} placer_metis_graph;

// A state over problem p with groups pg (their bytes and members); caps borrowed.
bool placer_state_init(placer_state *a, const placer_problem *p, const placer_groups *pg, const int64_t *caps,
                       dg_status *st);
void placer_state_clear(placer_state *a);
bool placer_allowed(const placer_state *a, int g, int d);
// Whether group g fits under device d's cap.
bool placer_fits(const placer_state *a, int g, int d);
void placer_put(placer_state *a, int g, int d);
void placer_reset(placer_state *a);
// Groups not placed yet, each on the allowed device with the fewest bytes that has room.
bool placer_place_leftovers(placer_state *a, dg_status *st);
// RESOURCE_EXHAUSTED naming node v, its group's bytes and each allowed device's room.
bool placer_no_room(const placer_state *a, int v, dg_status *st);
// Whether v is a free op without inputs that asked for no device (it waits for its reader).
bool placer_is_lazy(const placer_state *a, int v);
// The bytes device d takes if v goes there (d -1: without copies of inputs).
int64_t placer_need_bytes(const placer_state *a, int v, int d);
bool placer_room_for(const placer_state *a, int v, int d);
// Group g onto d with the copies of what it reads from outside (a reservation).
void placer_put_charged(placer_state *a, int g, int d);
// v is on d: its waiting inputs' groups go there too where they may; d holds copies of the
// rest of its inputs from elsewhere.
void placer_pull_inputs(placer_state *a, int v, int d);
void placer_charge_inputs(placer_state *a, int v, int d);
// Moves of whole clusters (auto_place.c): METIS's k parts of the groups of `by`, each a union
// of a's groups (by may be a), each part tried on every other device (where a cap forbids it,
// swapped with each part that is mostly there) and kept when the simulated step gets shorter
// than *step and every cap holds, in sweeps until one keeps nothing
// or the deadline (base_now_s) passes. a and sim are left at the placement kept, *step its
// simulated step. Returns the moves kept.
int placer_cluster_refine(placer_state *a, placer_state *by, int k, placer_sim *sim, double *step, double deadline,
                          uint64_t seed);
// METIS (metis_place.c): the groups cut into k parts (2 <= k <= devices) with the fewest bytes
// between them, balancing compute within imbalance ub_compute and bytes under the caps; parts
// mapped to devices, then groups a device may not take or has no room for moved. False with
// st set when the caps cannot be met that way.
bool placer_metis(placer_state *a, int k, double ub_compute, uint64_t seed, dg_status *st);
// METIS's k parts of a's groups alone (part: n_groups long; 2 <= k <= 64 and at most the
// groups), balancing compute within ub_compute and bytes under the caps. False with st set when
// k is out of range, the caps cannot hold k parts of equal bytes, or METIS fails.
bool placer_metis_parts(placer_state *a, int k, double ub_compute, uint64_t seed, int *part, dg_status *st);

#endif
