/* The executor's thread pool (pool.c): workers sleep on a condition variable, never spin. */
#ifndef DG_EXEC_POOL_IMPL_H
#define DG_EXEC_POOL_IMPL_H

#include <stdbool.h>

#include "distgraph/status.h"

typedef struct exec_pool exec_pool;
typedef void (*exec_task_fn)(void *arg, int a);
exec_pool *exec_pool_new(int n_threads, dg_status *st);
void exec_pool_free(exec_pool **p);
int exec_pool_size(const exec_pool *p);
// Queues fn(arg, a). Never blocks.
void exec_pool_submit(exec_pool *p, exec_task_fn fn, void *arg, int a);
// Takes back the oldest queued task that would call fn(arg, ...), not started by any thread:
// true with its int in *a. A thread that waits for that work runs it itself instead.
bool exec_pool_take(exec_pool *p, exec_task_fn fn, void *arg, int *a);

#endif
