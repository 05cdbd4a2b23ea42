/* What one task notes during a traced step (exec_trace_impl.h). Only traced steps
 * come here, so the notes may allocate: one step is traced at a time, not every step. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base_impl.h"
#include "exec_trace_impl.h"

// Notes kept per step at most: a step's own nodes and transfers are far fewer, and a peer
// sending values under a traced step's id must not grow them without bound.
#define MAX_NOTES (1 << 20)

struct exec_trace {
    pthread_mutex_t mu;
    dg_trace_event *ev;
    int n, cap;
};

exec_trace *exec_trace_new(void) {
    exec_trace *t = calloc(1, sizeof *t);
    if (t) pthread_mutex_init(&t->mu, NULL);
    return t;
}

static void free_strings(dg_trace_event *e) {
    free((char *)e->name);
    free((char *)e->op);
    free((char *)e->task);
    free((char *)e->device);
    free((char *)e->peer);
}

void exec_trace_free(exec_trace **tp) {
    if (!tp || !*tp) return;
    exec_trace *t = *tp;
    for (int i = 0; i < t->n; i++) free_strings(&t->ev[i]);
    free(t->ev);
    pthread_mutex_destroy(&t->mu);
    free(t);
    *tp = NULL;
}

int64_t exec_trace_now_ns(void) { return base_now_ns(); }

int exec_trace_thread(void) {
    static atomic_int next;
    static _Thread_local int mine;
    if (!mine) mine = atomic_fetch_add(&next, 1) + 1;
    return mine;
}

void exec_trace_add(exec_trace *t, const dg_trace_event *e) {
    dg_trace_event c = *e;
    c.name = strdup(e->name ? e->name : "");
    c.op = strdup(e->op ? e->op : "");
    c.task = strdup(e->task ? e->task : "");
    c.device = strdup(e->device ? e->device : "");
    c.peer = strdup(e->peer ? e->peer : "");
    pthread_mutex_lock(&t->mu);
    // Past MAX_NOTES, or out of memory, the event is dropped without a word.
    bool kept = c.name && c.op && c.task && c.device && c.peer && t->n < MAX_NOTES &&
                BASE_GROW(t->ev, t->n, t->cap, 1, "trace", NULL);
    if (kept) t->ev[t->n++] = c;
    pthread_mutex_unlock(&t->mu);
    if (!kept) free_strings(&c);
}

int exec_trace_num_events(const exec_trace *t) { return t->n; }

const dg_trace_event *exec_trace_events(const exec_trace *t) { return t->ev; }
