/* The trace hook (dg_trace_hook_new, TensorFlow's ProfilerHook for one run): asks for a
 * timeline of one run and writes it as a Chrome trace-event file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/monitored_session.h"
#include "status_impl.h"
#include "training_impl.h"

typedef struct trace_hook {
    int64_t at_run, runs;
    char *path;
    FILE *out;
} trace_hook;

static bool trace_before_run(void *ctx, const dg_run_context *rc, dg_hook_run_args *args, dg_status *st) {
    (void)rc;
    (void)st;
    trace_hook *h = ctx;
    args->trace = ++h->runs == h->at_run;
    return true;
}

static bool trace_after_run(void *ctx, const dg_run_context *rc, dg_tensor *const *values, int n, dg_status *st) {
    (void)values;
    (void)n;
    (void)st;
    trace_hook *h = ctx;
    if (h->runs != h->at_run || !rc->trace) return true;
    dg_status w = DG_STATUS_INIT;
    if (dg_step_trace_write_chrome(rc->trace, h->path, &w)) {
        FILE *f = h->out ? h->out : stdout;
        fprintf(f, "%.0f: wrote the timeline of run %lld (step %.3f ms, events account for %.3f ms) to %s\n",
                training_wall_s(), (long long)h->runs, (double)dg_step_trace_step_ns(rc->trace) / 1e6,
                (double)dg_step_trace_busy_ns(rc->trace) / 1e6, h->path);
        fflush(f);
    } else {
        fprintf(stderr, "distgraph: warning: trace hook: %s; training goes on\n", dg_status_message(&w));
    }
    status_impl_clear(&w);
    return true;
}

static void trace_free(void *ctx) {
    trace_hook *h = ctx;
    free(h->path);
    free(h);
}

dg_session_hook *dg_trace_hook_new(int64_t at_run, const char *path, FILE *out, dg_status *st) {
    dg_status_reset(st);
    if (at_run < 1 || !path || !*path) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "trace hook: need at_run >= 1 (got %lld) and a path",
                       (long long)at_run);
        return NULL;
    }
    trace_hook *c = calloc(1, sizeof *c);
    char *copy = strdup(path);
    if (!c || !copy) {
        free(c);
        free(copy);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "trace hook: out of memory");
        return NULL;
    }
    *c = (trace_hook){.at_run = at_run, .path = copy, .out = out};
    dg_session_hook *h = training_new_hook("trace", c, trace_free, st);
    if (!h) return NULL;
    h->before_run = trace_before_run;
    h->after_run = trace_after_run;
    return h;
}
