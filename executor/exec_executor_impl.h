/* The executor (executor.c): compiles one device's subgraph into an executable (exec_graph)
 * and runs it for a step, on the caller's thread and a pool's. */
#ifndef DG_EXEC_EXECUTOR_IMPL_H
#define DG_EXEC_EXECUTOR_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/graph.h"
#include "distgraph/status.h"
#include "distgraph/tensor.h"
#include "exec_kernel_impl.h"

typedef struct exec_pool exec_pool;               // exec_pool_impl.h
typedef struct exec_rendezvous exec_rendezvous;   // exec_rendezvous_impl.h
typedef struct exec_trace exec_trace;             // exec_trace_impl.h

typedef struct exec_graph exec_graph;

typedef struct exec_step_options {
    int64_t step_id;
    exec_rendezvous *rendezvous;   // for _Send/_Recv kernels; borrowed
    int64_t timeout_ms;     // 0: none
    exec_trace *trace;      // NULL: not traced; else each node's run is noted there (borrowed)
} exec_step_options;

// Compiles nodes (any order; their inputs outside the set must be fed) into an executable.
// Each node runs on its assigned device (env->device when it has none): kernels are looked
// up by that device's type, so the partitions of several devices can share one executable. feeds are outputs whose values the caller supplies; fetches are outputs
// returned after each run. Kernels are created once here. Returns: new, caller frees with
// exec_graph_free(); NULL on error (unknown kernel, a cycle, a missing input).
exec_graph *exec_graph_new(dg_node *const *nodes, int n_nodes, const dg_output *feeds, int n_feeds,
                           const dg_output *fetches, int n_fetches, const exec_env *env,
                           exec_pool *pool, dg_status *st);
void exec_graph_free(exec_graph **eg);
// Runs one step. feed_values[i] is borrowed; fetched[i] receives a new reference (caller
// unrefs). On failure no fetched tensor is set.
bool exec_graph_run(exec_graph *eg, dg_tensor *const *feed_values, dg_tensor **fetched,
                    const exec_step_options *opts, dg_status *st);
// Starts a step and returns without waiting: done(arg, st) runs exactly once, when every node
// has finished, on whichever thread finishes the last one (st NULL on success; borrowed for
// the call). The step's nodes run on the calling thread until they wait for an asynchronous
// kernel; its completion runs what it made ready on the completing thread when the graph is
// light (exec_graph_is_light), else on the pool. For graphs without feeds and fetches (a
// task's registered partitions); returns false (st set, done not called) otherwise.
typedef void (*exec_done_fn)(void *arg, const dg_status *st);
bool exec_graph_start(exec_graph *eg, const exec_step_options *opts, exec_done_fn done, void *arg,
                      dg_status *st);
// A graph compiled without a pool (no inter-op threads) still continues its async completions
// (a _Recv's value arriving on an I/O thread) on this pool when it is not light, so that the
// I/O thread goes back to its messages. Borrowed; set before the first step.
void exec_graph_set_completion_pool(exec_graph *eg, exec_pool *pool);
// No expensive kernel and at most about a million output elements (by static shapes): cheap
// enough to run on an I/O thread.
bool exec_graph_is_light(const exec_graph *eg);
int exec_graph_num_nodes(const exec_graph *eg);
int exec_graph_num_fetches(const exec_graph *eg);
// Options the step was run with (kernels such as _Send/_Recv read it).
const exec_step_options *exec_step_opts(const exec_step *s);
// Threads of this process computing right now: kernels inside their compute function (an
// asynchronous kernel waiting for its value does not count) and the intra-op helpers a kernel
// split its work over (cpu_parallel_for). The transport's I/O thread polls busily only while
// this leaves it a CPU of its own. exec_threads_computing_add: d more (or fewer) of them.
int exec_threads_computing(void);
void exec_threads_computing_add(int d);

#endif
