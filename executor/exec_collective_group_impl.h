/* A task's view of its collective groups (collective_group.c): which tasks an elastic group
 * has now (its membership, numbered by epochs), which tasks of the cluster are lost (their
 * connection closed), and the collective executions running now, so that losing a member ends
 * them at once instead of after their timeout. One per task, kept in its resources; the
 * server feeds the losses (runtime/server/server.c), the collective kernels
 * (executor/cpu/kernels_collective.c) read it. docs/ELASTIC.md describes the protocol. */
#ifndef DG_EXEC_COLLECTIVE_GROUP_IMPL_H
#define DG_EXEC_COLLECTIVE_GROUP_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "distgraph/status.h"
#include "exec_resources_impl.h"

// Most members an elastic group may have.
#define EXEC_COLL_MAX_MEMBERS 1024

typedef struct exec_coll_groups exec_coll_groups;

// The task's registry, made on first use. Returns: borrowed, lives as long as rm; NULL with
// st set when it cannot be made.
exec_coll_groups *exec_coll_groups_of(exec_resources *rm, dg_status *st);

// Sets the members of job's elastic group for epoch: tasks, in rank order (no repeats, each
// >= 0, at most EXEC_COLL_MAX_MEMBERS). An epoch older than the one set is FAILED_PRECONDITION;
// the same epoch again must name the same tasks. Setting a membership clears the lost marks of
// its members (they were seen again by whoever formed it).
bool exec_coll_set_members(exec_coll_groups *g, const char *job, int64_t epoch, const int *tasks, int n,
                           dg_status *st);
// Copies job's elastic membership: *epoch, and up to cap tasks into tasks (*n: how many there
// are). false when none was set.
bool exec_coll_members(exec_coll_groups *g, const char *job, int64_t *epoch, int *tasks, int cap, int *n);

// An execution among tasks of job (borrowed for the call) is told through on_lost(arg) when one
// of them is lost (called with the registry's lock held: it must not block or call back into
// the registry). Returns a token for exec_coll_unwatch (after which on_lost is not called).
int64_t exec_coll_watch(exec_coll_groups *g, const char *job, const int *tasks, int n, void (*on_lost)(void *arg),
                        void *arg);
void exec_coll_unwatch(exec_coll_groups *g, int64_t token);
// false with st (may be NULL) UNAVAILABLE naming the first of tasks of job that is lost now;
// true if none is.
bool exec_coll_none_lost(exec_coll_groups *g, const char *job, const int *tasks, int n, dg_status *st);

// The connection to task of job closed (why: what the transport saw). Marks it lost until it
// is seen again and tells the executions among it. Any thread.
void exec_coll_task_lost(exec_coll_groups *g, const char *job, int task, const char *why);
// A value or a handshake came from task of job: it is not lost (any more). Cheap when nothing
// is lost. Any thread.
void exec_coll_task_seen(exec_coll_groups *g, const char *job, int task);
// The tasks of job marked lost now: up to cap of them into tasks. Returns how many there are.
int exec_coll_lost_tasks(exec_coll_groups *g, const char *job, int *tasks, int cap);
// How many tasks are marked lost now (for tests and counters).
int exec_coll_num_lost(exec_coll_groups *g);

#endif
