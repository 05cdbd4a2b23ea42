/* The local rendezvous: where a _Send leaves a tensor and the matching _Recv picks it up,
 * keyed by (step id, rendezvous key). Whichever side comes first waits in the table. A step
 * that fails is aborted: its waiting receivers are called with the error and later sends and
 * receives of that step fail at once, so no receiver waits forever on a dead sender. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_trace_impl.h"
#include "status_impl.h"
#include "strmap_impl.h"

typedef struct entry {
    struct entry *next;
    int64_t step_id;
    char *key;
    dg_tensor *value;        // sent, not yet received
    exec_recv_cb cb;         // a receiver waiting
    void *cb_arg;
    int cb_node;
    int64_t since_ms;        // when the value came (monotonic)
} entry;

// A waiting kernel's cancel callback (exec_rendezvous_on_cancel).
typedef struct canceller {
    struct canceller *next;
    int64_t step_id;
    int64_t token;
    exec_cancel_fn fn;
    void *arg;
} canceller;

// Abort marks: a hash set by step id (a server may hold many: ABORT_STEP from masters whose
// steps never end here), also kept in arrival order so that past MAX_ABORTED the oldest go.
typedef struct aborted {
    struct aborted *next;              // in its bucket
    struct aborted *older, *newer;     // arrival order
    int64_t step_id;
    dg_status status;
} aborted;

#define N_BUCKETS 1024
#define N_ABORT_BUCKETS 4096
#define MAX_ABORTED 100000
#define MAX_TRACED 64

struct exec_rendezvous {
    exec_route_fn route;     // sends values bound for other tasks; NULL: all local
    exec_flush_fn flush;
    exec_abort_remote_fn abort_remote;   // NULL: no other task to tell
    void *route_ctx;
    pthread_mutex_t mu;
    entry *buckets[N_BUCKETS];
    aborted *abort_buckets[N_ABORT_BUCKETS];
    aborted *oldest, *newest;
    int n_aborted;
    bool closed;             // every step fails from now on
    dg_status close_status;
    canceller *cancellers;   // few: one per waiting kernel
    int64_t next_token;
    atomic_int n_traced;     // steps being traced (exec_rendezvous_trace); 0: nothing to note
    struct { int64_t step_id; exec_trace *t; } traced[MAX_TRACED];   // under mu
};

exec_rendezvous *exec_rendezvous_new(void) {
    exec_rendezvous *r = calloc(1, sizeof *r);
    if (r) pthread_mutex_init(&r->mu, NULL);
    return r;
}

static void free_entry(entry *e) {
    dg_tensor_unref(e->value);
    free(e->key);
    free(e);
}

void exec_rendezvous_free(exec_rendezvous **rp) {
    if (!rp || !*rp) return;
    exec_rendezvous *r = *rp;
    for (int b = 0; b < N_BUCKETS; b++)
        for (entry *e = r->buckets[b], *next; e; e = next) {
            next = e->next;
            free_entry(e);
        }
    for (aborted *a = r->oldest, *next; a; a = next) {
        next = a->newer;
        status_impl_clear(&a->status);
        free(a);
    }
    for (canceller *c = r->cancellers, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    status_impl_clear(&r->close_status);
    pthread_mutex_destroy(&r->mu);
    free(r);
    *rp = NULL;
}

static unsigned bucket(int64_t step_id, const char *key) {
    return (unsigned)((graph_str_hash(key) ^ (uint64_t)step_id * 0x9E3779B97F4A7C15ull) % N_BUCKETS);
}

// Removes and returns the entry for (step, key), or NULL.
static entry *take(exec_rendezvous *r, int64_t step_id, const char *key) {
    entry **pp = &r->buckets[bucket(step_id, key)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->step_id == step_id && strcmp((*pp)->key, key) == 0) {
            entry *e = *pp;
            *pp = e->next;
            return e;
        }
    return NULL;
}

static bool put(exec_rendezvous *r, entry *e) {
    unsigned b = bucket(e->step_id, e->key);
    e->next = r->buckets[b];
    r->buckets[b] = e;
    return true;
}

static unsigned abort_bucket(int64_t step_id) {
    return (unsigned)(((uint64_t)step_id * 0x9E3779B97F4A7C15ull) >> 52) % N_ABORT_BUCKETS;
}

static const dg_status *abort_status(exec_rendezvous *r, int64_t step_id) {
    if (r->closed) return &r->close_status;
    for (aborted *a = r->abort_buckets[abort_bucket(step_id)]; a; a = a->next)
        if (a->step_id == step_id) return &a->status;
    return NULL;
}

// Takes a out of its bucket and the arrival order and frees it. Called with mu held.
static void drop_abort_mark(exec_rendezvous *r, aborted *a) {
    for (aborted **pp = &r->abort_buckets[abort_bucket(a->step_id)]; *pp; pp = &(*pp)->next)
        if (*pp == a) {
            *pp = a->next;
            break;
        }
    if (a->older) a->older->newer = a->newer;
    else r->oldest = a->newer;
    if (a->newer) a->newer->older = a->older;
    else r->newest = a->older;
    r->n_aborted--;
    status_impl_clear(&a->status);
    free(a);
}

int exec_rendezvous_num_abort_marks(exec_rendezvous *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->n_aborted;
    pthread_mutex_unlock(&r->mu);
    return n;
}

void exec_rendezvous_set_router(exec_rendezvous *r, exec_route_fn fn, exec_flush_fn flush, void *ctx) {
    r->route = fn;
    r->flush = flush;
    r->route_ctx = ctx;
}

void exec_rendezvous_set_remote_abort(exec_rendezvous *r, exec_abort_remote_fn fn) { r->abort_remote = fn; }

void exec_rendezvous_abort_remote(exec_rendezvous *r, int64_t step_id, const char *device, const dg_status *why) {
    if (r->abort_remote && device) r->abort_remote(r->route_ctx, step_id, device, why);
}

void exec_rendezvous_flush(exec_rendezvous *r, int64_t step_id) {
    if (r->flush) r->flush(r->route_ctx, step_id);
}

void exec_rendezvous_trace(exec_rendezvous *r, int64_t step_id, exec_trace *t) {
    pthread_mutex_lock(&r->mu);
    int n = atomic_load(&r->n_traced);
    if (t && n < MAX_TRACED) {
        r->traced[n].step_id = step_id;
        r->traced[n].t = t;
        atomic_store(&r->n_traced, n + 1);
    } else if (!t) {
        for (int i = 0; i < n; i++)
            if (r->traced[i].step_id == step_id) {
                r->traced[i] = r->traced[n - 1];
                atomic_store(&r->n_traced, n - 1);
                break;
            }
    }
    pthread_mutex_unlock(&r->mu);
}

static void note(exec_rendezvous *r, int kind, int64_t step_id, const char *key, uint64_t bytes) {
    if (atomic_load_explicit(&r->n_traced, memory_order_relaxed) == 0) return;
    int64_t now = exec_trace_now_ns();
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < atomic_load(&r->n_traced); i++)
        if (r->traced[i].step_id == step_id) {
            dg_trace_event e = {.kind = (dg_trace_kind)kind, .name = key, .start_ns = now, .end_ns = now,
                                .bytes = bytes, .thread = exec_trace_thread()};
            exec_trace_add(r->traced[i].t, &e);
            break;
        }
    pthread_mutex_unlock(&r->mu);
}

void exec_rendezvous_note_arrival(exec_rendezvous *r, int64_t step_id, const char *key, uint64_t bytes) {
    note(r, EXEC_TRACE_ARRIVED, step_id, key, bytes);
}

bool exec_rendezvous_send(exec_rendezvous *r, int64_t step_id, const char *key, dg_tensor *t,
                          dg_status *st) {
    if (r->route) {
        int rc = r->route(r->route_ctx, step_id, key, t, st);
        if (rc > 0) note(r, EXEC_TRACE_SENT, step_id, key, dg_tensor_nbytes(t));
        if (rc != 0) return rc > 0;
    }
    return exec_rendezvous_deliver(r, step_id, key, t, st);
}

bool exec_rendezvous_deliver(exec_rendezvous *r, int64_t step_id, const char *key, dg_tensor *t,
                             dg_status *st) {
    pthread_mutex_lock(&r->mu);
    const dg_status *ab = abort_status(r, step_id);
    if (ab) {
        dg_status_setf(st, DG_ABORTED, "step %lld was aborted: %s", (long long)step_id,
                       dg_status_message(ab));
        pthread_mutex_unlock(&r->mu);
        return false;
    }
    entry *e = take(r, step_id, key);
    if (e && e->cb) {
        pthread_mutex_unlock(&r->mu);
        e->cb(e->cb_arg, e->cb_node, dg_tensor_ref(t), NULL);
        free_entry(e);
        return true;
    }
    if (e) {
        put(r, e);
        pthread_mutex_unlock(&r->mu);
        dg_status_setf(st, DG_INTERNAL, "rendezvous key \"%s\" sent twice in step %lld", key,
                       (long long)step_id);
        return false;
    }
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
        free(e);
        pthread_mutex_unlock(&r->mu);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "rendezvous: out of memory");
        return false;
    }
    e->step_id = step_id;
    e->value = dg_tensor_ref(t);
    e->since_ms = base_now_ms();
    put(r, e);
    pthread_mutex_unlock(&r->mu);
    return true;
}

void exec_rendezvous_recv_async(exec_rendezvous *r, int64_t step_id, const char *key,
                                exec_recv_cb cb, void *arg, int node) {
    pthread_mutex_lock(&r->mu);
    const dg_status *ab = abort_status(r, step_id);
    if (ab) {
        dg_status err = DG_STATUS_INIT;
        dg_status_setf(&err, DG_ABORTED, "step %lld was aborted: %s", (long long)step_id,
                       dg_status_message(ab));
        pthread_mutex_unlock(&r->mu);
        cb(arg, node, NULL, &err);
        status_impl_clear(&err);
        return;
    }
    entry *e = take(r, step_id, key);
    if (e && e->value) {
        dg_tensor *t = e->value;
        e->value = NULL;
        pthread_mutex_unlock(&r->mu);
        free_entry(e);
        cb(arg, node, t, NULL);
        return;
    }
    if (e) {   // a second receiver for the same key
        put(r, e);
        pthread_mutex_unlock(&r->mu);
        dg_status err = DG_STATUS_INIT;
        dg_status_setf(&err, DG_INTERNAL, "rendezvous key \"%s\" received twice in step %lld", key,
                       (long long)step_id);
        cb(arg, node, NULL, &err);
        status_impl_clear(&err);
        return;
    }
    e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
        free(e);
        pthread_mutex_unlock(&r->mu);
        dg_status err = DG_STATUS_INIT;
        dg_status_set(&err, DG_RESOURCE_EXHAUSTED, "rendezvous: out of memory");
        cb(arg, node, NULL, &err);
        status_impl_clear(&err);
        return;
    }
    e->step_id = step_id;
    e->cb = cb;
    e->cb_arg = arg;
    e->cb_node = node;
    put(r, e);
    pthread_mutex_unlock(&r->mu);
}

// Fails the receives taken out of the table (waiting) and runs the cancellers taken out of
// their list (cancel) with err, freeing both lists. Called without the lock.
static void fail_waiting(entry *waiting, canceller *cancel, const dg_status *err) {
    for (entry *e = waiting, *next; e; e = next) {
        next = e->next;
        e->cb(e->cb_arg, e->cb_node, NULL, err);
        free_entry(e);
    }
    for (canceller *c = cancel, *next; c; c = next) {
        next = c->next;
        c->fn(c->arg, err);
        free(c);
    }
}

void exec_rendezvous_abort(exec_rendezvous *r, int64_t step_id, const dg_status *why) {
    entry *waiting = NULL;
    pthread_mutex_lock(&r->mu);
    if (!abort_status(r, step_id)) {
        aborted *a = calloc(1, sizeof *a);
        if (a) {
            a->step_id = step_id;
            dg_status_set(&a->status, dg_status_code(why), dg_status_message(why));
            unsigned b = abort_bucket(step_id);
            a->next = r->abort_buckets[b];
            r->abort_buckets[b] = a;
            a->older = r->newest;
            if (r->newest) r->newest->newer = a;
            else r->oldest = a;
            r->newest = a;
            if (++r->n_aborted > MAX_ABORTED) drop_abort_mark(r, r->oldest);
        }
    }
    for (int b = 0; b < N_BUCKETS; b++)
        for (entry **pp = &r->buckets[b]; *pp;) {
            entry *e = *pp;
            if (e->step_id == step_id && e->cb) {
                *pp = e->next;
                e->next = waiting;
                waiting = e;
            } else {
                pp = &e->next;
            }
        }
    canceller *cancel = NULL;
    for (canceller **pp = &r->cancellers; *pp;) {
        canceller *c = *pp;
        if (c->step_id == step_id) {
            *pp = c->next;
            c->next = cancel;
            cancel = c;
        } else {
            pp = &c->next;
        }
    }
    pthread_mutex_unlock(&r->mu);
    dg_status err = DG_STATUS_INIT;
    dg_status_setf(&err, DG_ABORTED, "step %lld was aborted: %s", (long long)step_id,
                   dg_status_message(why));
    fail_waiting(waiting, cancel, &err);
    status_impl_clear(&err);
}

void exec_rendezvous_end_step(exec_rendezvous *r, int64_t step_id) {
    entry *dead = NULL, *waiting = NULL;
    canceller *cancel = NULL;
    pthread_mutex_lock(&r->mu);
    for (int b = 0; b < N_BUCKETS; b++)
        for (entry **pp = &r->buckets[b]; *pp;) {
            entry *e = *pp;
            if (e->step_id == step_id) {
                *pp = e->next;
                // A receive still waiting (a step ended while it ran: only a peer that sends
                // END_STEP out of turn does that) is failed, not dropped, or its step never ends.
                if (e->cb) {
                    e->next = waiting;
                    waiting = e;
                } else {
                    e->next = dead;
                    dead = e;
                }
            } else {
                pp = &e->next;
            }
        }
    if (waiting)
        for (canceller **pp = &r->cancellers; *pp;) {
            canceller *c = *pp;
            if (c->step_id == step_id) {
                *pp = c->next;
                c->next = cancel;
                cancel = c;
            } else {
                pp = &c->next;
            }
        }
    for (aborted *a = r->abort_buckets[abort_bucket(step_id)]; a; a = a->next)
        if (a->step_id == step_id) {
            drop_abort_mark(r, a);
            break;
        }
    pthread_mutex_unlock(&r->mu);
    for (entry *e = dead, *next; e; e = next) {
        next = e->next;
        free_entry(e);
    }
    if (!waiting) return;
    dg_status err = DG_STATUS_INIT;
    dg_status_setf(&err, DG_ABORTED, "step %lld was ended while it still waited for a value", (long long)step_id);
    fail_waiting(waiting, cancel, &err);
    status_impl_clear(&err);
}

void exec_rendezvous_close(exec_rendezvous *r, const dg_status *why) {
    entry *waiting = NULL;
    pthread_mutex_lock(&r->mu);
    r->closed = true;
    dg_status_set(&r->close_status, dg_status_code(why), dg_status_message(why));
    for (int b = 0; b < N_BUCKETS; b++)
        for (entry **pp = &r->buckets[b]; *pp;) {
            entry *e = *pp;
            if (e->cb) {
                *pp = e->next;
                e->next = waiting;
                waiting = e;
            } else {
                pp = &e->next;
            }
        }
    canceller *cancel = r->cancellers;
    r->cancellers = NULL;
    pthread_mutex_unlock(&r->mu);
    fail_waiting(waiting, cancel, why);
}

int64_t exec_rendezvous_on_cancel(exec_rendezvous *r, int64_t step_id, exec_cancel_fn fn, void *arg,
                                  dg_status *why) {
    canceller *c = calloc(1, sizeof *c);
    if (!c) {
        if (why) dg_status_set(why, DG_RESOURCE_EXHAUSTED, "rendezvous: out of memory");
        return 0;
    }
    pthread_mutex_lock(&r->mu);
    const dg_status *ab = abort_status(r, step_id);
    if (ab) {
        if (why) dg_status_setf(why, r->closed ? dg_status_code(ab) : DG_ABORTED, "%s%s",
                                r->closed ? "" : "step was aborted: ", dg_status_message(ab));
        pthread_mutex_unlock(&r->mu);
        free(c);
        return 0;
    }
    c->step_id = step_id;
    c->token = ++r->next_token;
    c->fn = fn;
    c->arg = arg;
    c->next = r->cancellers;
    r->cancellers = c;
    int64_t token = c->token;
    pthread_mutex_unlock(&r->mu);
    return token;
}

bool exec_rendezvous_forget_cancel(exec_rendezvous *r, int64_t token) {
    if (token <= 0) return false;
    canceller *found = NULL;
    pthread_mutex_lock(&r->mu);
    for (canceller **pp = &r->cancellers; *pp; pp = &(*pp)->next)
        if ((*pp)->token == token) {
            found = *pp;
            *pp = found->next;
            break;
        }
    pthread_mutex_unlock(&r->mu);
    free(found);
    return found != NULL;
}

int exec_rendezvous_drop_stale(exec_rendezvous *r, int64_t older_than_ms, bool (*running)(void *ctx, int64_t step_id),
                               void *ctx) {
    int64_t now = base_now_ms();
    int64_t *steps = NULL;
    int n = 0, cap = 0;
    pthread_mutex_lock(&r->mu);
    for (int b = 0; b < N_BUCKETS; b++)
        for (entry *e = r->buckets[b]; e; e = e->next) {
            if (!e->value || e->cb || now - e->since_ms < older_than_ms) continue;
            bool seen = false;
            for (int i = 0; i < n && !seen; i++) seen = steps[i] == e->step_id;
            if (seen) continue;
            if (!BASE_GROW(steps, n, cap, 1, "stale steps", NULL)) break;   // the rest wait for a later sweep
            steps[n++] = e->step_id;
        }
    pthread_mutex_unlock(&r->mu);
    int dropped = 0;
    for (int i = 0; i < n; i++) {
        if (running && running(ctx, steps[i])) continue;
        dg_status why = DG_STATUS_INIT;
        dg_status_setf(&why, DG_ABORTED, "its values waited %lld ms or more for a step that never ran here",
                       (long long)older_than_ms);
        exec_rendezvous_abort(r, steps[i], &why);   // a late start fails at once
        status_impl_clear(&why);
        entry *gone = NULL;
        pthread_mutex_lock(&r->mu);
        for (int b = 0; b < N_BUCKETS; b++)
            for (entry **pp = &r->buckets[b]; *pp;) {
                entry *e = *pp;
                if (e->step_id == steps[i] && e->value && !e->cb) {
                    *pp = e->next;
                    e->next = gone;
                    gone = e;
                } else {
                    pp = &e->next;
                }
            }
        pthread_mutex_unlock(&r->mu);
        for (entry *e = gone, *next; e; e = next) {
            next = e->next;
            free_entry(e);
            dropped++;
        }
    }
    free(steps);
    return dropped;
}
