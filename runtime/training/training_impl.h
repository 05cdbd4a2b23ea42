/* Internals shared by the files of runtime/training/. */
#ifndef DG_TRAINING_IMPL_H
#define DG_TRAINING_IMPL_H

#include <stdbool.h>
#include <time.h>

#include "distgraph/monitored_session.h"
#include "distgraph/status.h"

// A hook named name around ctx, its callbacks for the caller to set. Out of memory:
// RESOURCE_EXHAUSTED, free_ctx(ctx) called, NULL. Returns: new, free with dg_session_hook_free().
dg_session_hook *training_new_hook(const char *name, void *ctx, void (*free_ctx)(void *), dg_status *st);

// Makes directory dir and its missing parents (mkdir -p), or checks that it is a directory this
// user can write to. Errors name "<what> \"<name>\"" and the directory: PERMISSION_DENIED or
// FAILED_PRECONDITION with the system's reason (checkpoint.c).
bool training_make_dir(const char *dir, const char *what, const char *name, dg_status *st);

// Seconds since the Unix epoch (what summaries and events record as wall time).
static inline double training_wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#endif
