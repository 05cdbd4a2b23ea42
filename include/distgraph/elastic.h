/* Elastic training on all-reduce: workers leave and join while the job runs (Horovod Elastic's
 * model). Every worker trains with an elastic group (DG_COLLECTIVE_ELASTIC,
 * distgraph/collective.h) and adds the elastic hook to its monitored session. The hook commits
 * the variables in memory every commit_steps steps; a coordinator task hands out the group's
 * members, numbered by epochs. When a member is lost, the collectives waiting on it fail at once
 * (UNAVAILABLE), the monitored session recovers, and the hook rolls back to the last commit,
 * forms the next epoch with the live members and gives them rank 0's values; a new worker joins
 * at the next commit. The learning rate and each worker's batch stay as they are (the gradient is
 * the mean over the members of the epoch), unless the learning rate is made to follow
 * dg_elastic_members. docs/ELASTIC.md has the details. */
#ifndef DISTGRAPH_ELASTIC_H
#define DISTGRAPH_ELASTIC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "distgraph/monitored_session.h"
#include "distgraph/server.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dg_elastic_options {
    dg_server *server;            // this worker's task server (its group members are set there); borrowed
    const char *job;              // the group's job; NULL: "worker"
    // The task that coordinates the group ("/job:ps/task:0"): it must outlive the job. NULL:
    // task 0 of job.
    const char *coordinator;
    int min_workers;              // the first epoch waits for this many workers (>= 1)
    int64_t commit_steps;         // the variables are committed every this many steps (>= 1)
    // At a commit, members wait for each other this long after the first came; those that did
    // not come are left out of the next epoch.
    int64_t barrier_timeout_ms;
    int64_t join_timeout_ms;      // how long the waits for one epoch may take in all; 0: no limit
    FILE *log;                    // one line per epoch and rollback; NULL: stdout
    bool coordinator_log;         // the coordinator writes a line per epoch on its stderr (default true)
} dg_elastic_options;

// {server NULL, job NULL, coordinator NULL, min_workers 1, commit_steps 10,
//  barrier_timeout_ms 10000, join_timeout_ms 0, log NULL, coordinator_log true}.
dg_elastic_options dg_elastic_options_default(void);

// The hook (order DG_HOOK_ORDER_SETUP: after a creation it brings the variables and the global
// step before other hooks read them). Its begin adds to the graph: the coordinator's op on the
// coordinator task, the commit's rollback and the broadcast of the global variables over the
// elastic group. Borrows o for the call (the server must outlive the hook). Returns: new, caller
// frees with dg_session_hook_free(); NULL with st set (INVALID_ARGUMENT naming the option).
dg_session_hook *dg_elastic_hook_new(const dg_elastic_options *o, dg_status *st);

// The number of members of the epoch this worker is in, as a float32 scalar: a local variable
// of this worker that the elastic hook sets in every epoch it enters (before any step of it).
// For a learning rate that follows the group's size, Horovod's rule (lr * members /
// reference_workers: the gradient averages over more examples with more members) with
// dg_optimizer.learning_rate_tensor; docs/ELASTIC.md. Call it under the worker's device scope
// before the monitored session is made (the hook finds it when it begins); a second call
// returns the same output. Read only in a session with the elastic hook (it initializes it).
// Returns: borrowed, valid until the graph is freed; {NULL, 0} with st set on error.
dg_output dg_elastic_members(dg_graph *g, dg_status *st);

// What the hook has seen so far.
typedef struct dg_elastic_stats {
    int64_t epoch;                // the epoch in force (-1 before the first)
    int n_members;                // its members
    int rank;                     // this worker's rank in it
    int64_t epochs_joined;        // epochs this worker has been in
    int64_t commits;
    int64_t rollbacks;            // recoveries that went back to a commit
    int64_t steps_rolled_back;    // global steps undone by them
} dg_elastic_stats;

// Fills *out; false when h is not an elastic hook.
bool dg_elastic_hook_stats(const dg_session_hook *h, dg_elastic_stats *out);

#ifdef __cplusplus
}
#endif
#endif
