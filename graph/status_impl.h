/* The layout of dg_status, so hot paths can keep one on the stack without a malloc.
 * Initialise with DG_STATUS_INIT and release with status_impl_clear(). */
#ifndef DG_STATUS_IMPL_H
#define DG_STATUS_IMPL_H

#include <stdbool.h>
#include <stdlib.h>

#include "distgraph/status.h"

struct dg_status {
    dg_code code;
    char *msg;     // heap, NUL-terminated; NULL means ""
};

#define DG_STATUS_INIT {DG_OK, NULL}

// Whether messages may carry where in the code a failure was met (a source file and line, the
// library call that failed): only with DG_DEBUG_ERRORS=1 in the environment. Users get what is
// wrong and how to fix it; developers ask for the rest.
bool status_impl_debug_errors(void);

static inline void status_impl_clear(dg_status *st) {
    free(st->msg);
    st->msg = NULL;
    st->code = DG_OK;
}

#endif
