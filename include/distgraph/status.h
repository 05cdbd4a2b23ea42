/* Status: the error channel of every fallible call.
 * A dg_status holds a code (TensorFlow's codes, same numbers) and a message that names
 * what is at fault. Fallible calls take `dg_status *st` last and also return a value that
 * can be tested (NULL, false or -1). A dg_status is not thread-safe; use one per thread. */
#ifndef DISTGRAPH_STATUS_H
#define DISTGRAPH_STATUS_H

#include <stdarg.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

// Error codes. Numbers match TensorFlow's and go on the wire: never renumber.
typedef enum dg_code {
    DG_OK = 0,
    DG_CANCELLED = 1,
    DG_UNKNOWN = 2,
    DG_INVALID_ARGUMENT = 3,
    DG_DEADLINE_EXCEEDED = 4,
    DG_NOT_FOUND = 5,
    DG_ALREADY_EXISTS = 6,
    DG_PERMISSION_DENIED = 7,
    DG_RESOURCE_EXHAUSTED = 8,
    DG_FAILED_PRECONDITION = 9,
    DG_ABORTED = 10,
    DG_OUT_OF_RANGE = 11,
    DG_UNIMPLEMENTED = 12,
    DG_INTERNAL = 13,
    DG_UNAVAILABLE = 14,
    DG_DATA_LOSS = 15,
    DG_UNAUTHENTICATED = 16,
} dg_code;

typedef struct dg_status dg_status;

// Returns: new, caller frees with dg_status_free(). Starts as DG_OK.
dg_status *dg_status_new(void);
// Frees *st and sets it to NULL; NULL or a pointer to NULL does nothing.
void dg_status_free(dg_status **st);

dg_code dg_status_code(const dg_status *st);
bool dg_status_ok(const dg_status *st);
// Returns: borrowed, valid until the next change to st. "" when OK.
const char *dg_status_message(const dg_status *st);
// Name of a code, e.g. "INVALID_ARGUMENT". Returns: a static string.
const char *dg_code_name(dg_code code);

// Sets code and message (printf-style). st may be NULL, then nothing happens.
void dg_status_set(dg_status *st, dg_code code, const char *msg);
void dg_status_setf(dg_status *st, dg_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void dg_status_vsetf(dg_status *st, dg_code code, const char *fmt, va_list ap);
// Prepends context to a non-OK status: "<context>: <old message>". Keeps the code.
void dg_status_prepend(dg_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
// Copies code and message from src into dst.
void dg_status_copy(dg_status *dst, const dg_status *src);
// Back to DG_OK with an empty message.
void dg_status_reset(dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
