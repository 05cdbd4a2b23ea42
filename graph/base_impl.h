/* The plumbing every layer shares (each layer sees graph/, the bottom one): a monotonic clock,
 * allocation failure reported as a status, growable arrays. One copy here instead of a private
 * one in each file that needs it. */
#ifndef DG_BASE_IMPL_H
#define DG_BASE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "distgraph/status.h"

// Monotonic time (CLOCK_MONOTONIC): for deadlines and durations, never for wall time.
static inline int64_t base_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
static inline int64_t base_now_ms(void) { return base_now_ns() / 1000000; }
static inline double base_now_s(void) { return (double)base_now_ns() * 1e-9; }

// Wall time (CLOCK_REALTIME) in seconds since the Unix epoch: for log lines and records people
// read beside other machines' clocks, never for durations.
static inline double base_unix_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Sleeps ms milliseconds (the whole time, through signals); nothing for ms <= 0.
static inline void base_sleep_ms(int64_t ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

// An allocation of n_bytes for `what` failed: RESOURCE_EXHAUSTED "<what>: out of memory
// allocating N bytes" into st. Returns false (for `return base_oom(...)`).
static inline bool base_oom(dg_status *st, const char *what, size_t n_bytes) {
    dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s: out of memory allocating %zu bytes", what, n_bytes);
    return false;
}

// Makes room for `more` elements after the first `count` of a growable array: *items of
// capacity *cap elements of elem bytes, grown by doubling (from 8). Out of memory aborts: this
// is for bookkeeping a program cannot go on without, not for data a user sized.
static inline void base_reserve(void **items, size_t elem, int count, int *cap, int more) {
    if (count + more <= *cap) return;
    int c = *cap > 0 ? *cap : 8;
    while (c < count + more) c *= 2;
    void *p = realloc(*items, (size_t)c * elem);
    if (!p) abort();
    *items = p;
    *cap = c;
}
// The same for an array whose size comes from input (a user's graph or spec, a file, a peer):
// out of memory, or a count past INT_MAX, is RESOURCE_EXHAUSTED naming what (st may be NULL),
// and leaves *items and *cap as they were. Returns false then.
static inline bool base_grow(void **items, size_t elem, int count, int *cap, int more, const char *what,
                             dg_status *st) {
    if (count + (int64_t)more <= *cap) return true;
    int64_t c = *cap > 0 ? *cap : 8;
    while (c < count + (int64_t)more) c *= 2;
    if (c > INT32_MAX) c = INT32_MAX;
    void *p = c >= count + (int64_t)more && (size_t)c <= SIZE_MAX / elem ? realloc(*items, (size_t)c * elem) : NULL;
    if (!p) return base_oom(st, what, (size_t)c * elem);
    *items = p;
    *cap = (int)c;
    return true;
}
// BASE_GROW(items, count, cap, more, what, st): base_grow with the element size of items.
#define BASE_GROW(items, count, cap, more, what, st) \
    base_grow((void **)&(items), sizeof *(items), (count), &(cap), (more), (what), (st))
// BASE_PUSH(items, count, cap, value): appends value (count and cap are int lvalues).
#define BASE_PUSH(items, count, cap, value)                                           \
    do {                                                                              \
        base_reserve((void **)&(items), sizeof *(items), (count), &(cap), 1);         \
        (items)[(count)++] = (value);                                                 \
    } while (0)

#endif
