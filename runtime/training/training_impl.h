/* Internals shared by the files of runtime/training/. */
#ifndef DG_TRAINING_IMPL_H
#define DG_TRAINING_IMPL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "distgraph/monitored_session.h"
#include "distgraph/status.h"

// What a monitored session's hooks may read and set of it (TensorFlow's SessionRunContext):
// the first member of struct dg_monitored_session, so run_context.c reaches it from the
// session's pointer without the session's file.
typedef struct training_run_state {
    dg_saver *saver;
    _Atomic int64_t restored_step;   // written by the creating thread, read by anyone
    atomic_bool stop_requested, last_run_failed, closed;
} training_run_state;

// dg_saver_add_blob, with release(ctx) (may be NULL) called when the saver lets go of ctx:
// dg_saver_remove_blob or dg_saver_free. A source that must not outlive its context (an
// iterator, runtime/data/dataset.c) learns so that it need not detach from a freed saver.
// restore (may be NULL) is called by every dg_saver_restore after the variables are assigned,
// with the blob's bytes in the checkpoint restored (borrowed for the call), or NULL and 0 when
// that checkpoint has none: the state it had when the variables had those values.
typedef bool (*training_blob_restore_fn)(void *ctx, const void *bytes, size_t n_bytes, dg_status *st);
bool training_saver_add_blob(dg_saver *sv, const char *name, dg_saver_blob_fn fn, training_blob_restore_fn restore,
                             void *ctx, void (*release)(void *ctx), dg_status *st);

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

// A growable message buffer; out of memory while formatting a message is an internal failure.
typedef struct strbuf {
    char *p;
    size_t len, cap;
} strbuf;

static inline void sb_addf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void sb_addf(strbuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) abort();
        if (b->p && (size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = (b->len + (size_t)n + 1) * 2;
        char *np = realloc(b->p, cap);
        if (!np) abort();
        b->p = np;
        b->cap = cap;
    }
}

static inline const char *sb_str(const strbuf *b) { return b->p ? b->p : ""; }

// The saver's variable i (a VariableV2 output), 0 <= i < dg_saver_num_variables (saver.c).
dg_output training_saver_variable(const dg_saver *sv, int i);

#endif
