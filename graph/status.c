/* dg_status: a code plus a heap message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_impl.h"

dg_status *dg_status_new(void) { return calloc(1, sizeof(dg_status)); }

void dg_status_free(dg_status **st) {
    if (!st || !*st) return;
    free((*st)->msg);
    free(*st);
    *st = NULL;
}

dg_code dg_status_code(const dg_status *st) { return st ? st->code : DG_OK; }
bool dg_status_ok(const dg_status *st) { return !st || st->code == DG_OK; }
const char *dg_status_message(const dg_status *st) {
    return st && st->msg ? st->msg : "";
}

const char *dg_code_name(dg_code code) {
    static const char *const names[] = {
        "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
        "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",
        "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED"};
    if ((int)code < 0 || (size_t)code >= sizeof names / sizeof names[0]) return "UNKNOWN_CODE";
    return names[code];
}

void dg_status_set(dg_status *st, dg_code code, const char *msg) {
    if (!st) return;
    char *copy = NULL;
    if (msg && *msg) copy = strdup(msg);
    free(st->msg);
    st->msg = copy;
    st->code = code;
}

void dg_status_vsetf(dg_status *st, dg_code code, const char *fmt, va_list ap) {
    if (!st) return;
    char *buf = NULL;
    if (vasprintf(&buf, fmt, ap) < 0) buf = NULL;
    free(st->msg);
    st->msg = buf;
    st->code = code;
}

void dg_status_setf(dg_status *st, dg_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, code, fmt, ap);
    va_end(ap);
}

void dg_status_prepend(dg_status *st, const char *fmt, ...) {
    if (!st || st->code == DG_OK) return;
    char *ctx = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&ctx, fmt, ap) < 0) ctx = NULL;
    va_end(ap);
    if (!ctx) return;
    char *joined = NULL;
    if (asprintf(&joined, "%s: %s", ctx, st->msg ? st->msg : "") >= 0) {
        free(st->msg);
        st->msg = joined;
    }
    free(ctx);
}

void dg_status_copy(dg_status *dst, const dg_status *src) {
    if (!dst || dst == src) return;
    dg_status_set(dst, dg_status_code(src), dg_status_message(src));
}

void dg_status_reset(dg_status *st) { dg_status_set(st, DG_OK, NULL); }

bool status_impl_debug_errors(void) {
    static int cached = -1;   // -1: not read yet
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        const char *e = getenv("DG_DEBUG_ERRORS");
        v = e && strcmp(e, "1") == 0;
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}
