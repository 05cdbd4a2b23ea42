/* Internals shared by the files of runtime/training/. */
#ifndef DG_TRAINING_IMPL_H
#define DG_TRAINING_IMPL_H

#include <stdbool.h>

#include "distgraph/status.h"

// Makes directory dir and its missing parents (mkdir -p), or checks that it is a directory this
// user can write to. Errors name "<what> \"<name>\"" and the directory: PERMISSION_DENIED or
// FAILED_PRECONDITION with the system's reason (checkpoint.c).
bool training_make_dir(const char *dir, const char *what, const char *name, dg_status *st);

#endif
