/* CPU kernels that make workers wait for each other: the conditional accumulators and the
 * token queue of synchronous replicas (TensorFlow's conditional_accumulator_base.cc and
 * FIFOQueue, for int64 tokens), and the coordinator of an elastic group (ElasticRendezvous,
 * docs/ELASTIC.md).
 *
 * Resources live in the task's resource manager under (kind, shared_name) and are reference
 * counted: the manager holds one reference, each kernel instance one, each waiting kernel one,
 * so a wait that ends after its graph is gone still finds its lock.
 *
 * TakeGradient and Dequeue are asynchronous: when they cannot finish at once they park a
 * *waiter* on their resource and return, so no thread blocks. A waiter ends exactly once, by
 * whichever comes first: the resource (enough gradients, a token, a close), its deadline (the
 * process-wide timer), or the abort of its step (a canceller registered with the step's
 * rendezvous). The one that ends it sets `done` under the resource's lock; registrations are
 * complete (`registered`) before anyone but the starter may finish it, so every finisher
 * removes the timer and the canceller before calling exec_async_done, after which nothing
 * touches the step or its rendezvous. References on the waiter: the starter's, the wait
 * list's, the timer's and the canceller's, each dropped by its holder. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base_impl.h"
#include "cpu_impl.h"
#include "exec_executor_impl.h"
#include "exec_kernel_registry_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_resources_impl.h"
#include "status_impl.h"
#include "exec_collective_group_impl.h"
#include "timer_impl.h"

// ---- resources and waiters ----
typedef struct waiter waiter;

typedef struct resource {
    atomic_int refs;
    pthread_mutex_t mu;
    char *name;                // shared_name, owned
    waiter *waiters;           // FIFO, under mu
    void (*free_fn)(struct resource *r);
} resource;

struct waiter {
    atomic_int refs;
    waiter *next;              // in res->waiters, under res->mu
    resource *res;             // one reference held
    exec_async_handle h;
    exec_rendezvous *rv;       // NULL: the step cannot be aborted from outside (local run)
    int64_t step_id;
    int64_t timeout_ms;        // 0: no deadline
    bool done;                 // under res->mu: ended, by whoever set it
    bool registered;           // under res->mu: timer and canceller fields final
    uint64_t timer;            // under res->mu
    int64_t cancel_token;      // under res->mu
    dg_status err;             // an end that came before `registered` (the starter reports it)
    int num_required;          // TakeGradient
    int total_replicas;        // TakeGradient: replica ids 0..total-1 expected
    int64_t task, kind, epoch_seen;   // ElasticRendezvous: who arrived, and why
    // Writes the deadline error into st (called under res->mu).
    void (*deadline_error)(waiter *w, dg_status *st);
};

static void res_ref(resource *r) { atomic_fetch_add(&r->refs, 1); }

static void res_unref(resource *r) {
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) {
        pthread_mutex_destroy(&r->mu);
        free(r->name);
        r->free_fn(r);
    }
}

static void res_destroy(void *obj) { res_unref(obj); }

static bool res_init(resource *r, const char *name, void (*free_fn)(resource *)) {
    atomic_init(&r->refs, 1);
    pthread_mutex_init(&r->mu, NULL);
    r->free_fn = free_fn;
    r->name = strdup(name);
    return r->name != NULL;
}

static void waiter_unref(waiter *w) {
    if (atomic_fetch_sub(&w->refs, 1) == 1) {
        res_unref(w->res);
        status_impl_clear(&w->err);
        free(w);
    }
}

// Called under res->mu.
static void unlink_waiter(resource *r, waiter *w) {
    for (waiter **pp = &r->waiters; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            w->next = NULL;
            return;
        }
}

static void append_waiter(resource *r, waiter *w) {
    waiter **pp = &r->waiters;
    while (*pp) pp = &(*pp)->next;
    w->next = NULL;
    *pp = w;
}

// Ends a waiter this thread has marked done (with `registered` set): drops its timer and
// canceller (and their references), then completes the kernel with out (consumed) or st.
static void finish(waiter *w, uint64_t timer, int64_t token, dg_tensor *out, const dg_status *st) {
    if (timer && exec_timer_cancel(timer)) waiter_unref(w);
    if (token && exec_rendezvous_forget_cancel(w->rv, token)) waiter_unref(w);
    exec_async_done(w->h, out, st);
}

// The end of a wait by its deadline or by its step's abort: whoever wins finishes.
static void end_by(waiter *w, const dg_status *why, bool is_deadline) {
    resource *r = w->res;
    dg_status err = DG_STATUS_INIT;
    pthread_mutex_lock(&r->mu);
    bool win = !w->done, in_list = false, registered = w->registered;
    uint64_t timer = w->timer;
    int64_t token = w->cancel_token;
    if (win) {
        w->done = true;
        for (waiter *x = r->waiters; x; x = x->next) in_list = in_list || x == w;
        unlink_waiter(r, w);
        if (is_deadline) w->deadline_error(w, &err);
        else dg_status_copy(&err, why);
        // Before registration is complete the starter reports the end.
        if (!registered) dg_status_copy(&w->err, &err);
    }
    pthread_mutex_unlock(&r->mu);
    if (win && registered) {
        finish(w, timer, token, NULL, &err);
        if (in_list) waiter_unref(w);
    }
    status_impl_clear(&err);
}

static void on_deadline(void *arg) {
    waiter *w = arg;
    end_by(w, NULL, true);
    waiter_unref(w);   // the timer's reference
}

static void on_cancel(void *arg, const dg_status *why) {
    waiter *w = arg;
    end_by(w, why, false);
    waiter_unref(w);   // the canceller's reference
}

// A kernel cannot finish now: make a waiter (two references: the starter's and the one the
// list will hold). Returns NULL after completing the kernel with RESOURCE_EXHAUSTED.
static waiter *waiter_new(resource *r, exec_ctx *ctx, exec_async_handle h, int64_t timeout_ms) {
    waiter *w = calloc(1, sizeof *w);
    if (!w) {
        // Not ctx->st: the executor does not release it after an async start.
        dg_status err = DG_STATUS_INIT;
        dg_status_set(&err, DG_RESOURCE_EXHAUSTED, "out of memory for a waiting kernel");
        exec_async_done(h, NULL, &err);
        status_impl_clear(&err);
        return NULL;
    }
    atomic_init(&w->refs, 2);
    res_ref(r);
    w->res = r;
    w->h = h;
    const exec_step_options *o = exec_step_opts(ctx->step);
    w->rv = o->rendezvous;
    w->step_id = o->step_id;
    w->timeout_ms = timeout_ms;
    return w;
}

// Tries to finish w now; called under res->mu. Returns true when it did: *out or *st set.
typedef bool (*try_fn)(resource *r, waiter *w, dg_tensor **out, dg_status *st);

// Registers w's deadline and canceller, then (under the lock) either finishes it at once
// (ended meanwhile, aborted, or try succeeds) or parks it in the wait list.
static void park(waiter *w, try_fn try_now) {
    resource *r = w->res;
    uint64_t timer = 0;
    int64_t token = 0;
    dg_status aborted = DG_STATUS_INIT;
    if (w->timeout_ms > 0) {
        atomic_fetch_add(&w->refs, 1);
        if (!(timer = exec_timer_add(w->timeout_ms, on_deadline, w))) {
            atomic_fetch_sub(&w->refs, 1);
            dg_status_set(&aborted, DG_RESOURCE_EXHAUSTED, "cannot start the deadline timer");
        }
    }
    if (w->rv && dg_status_ok(&aborted)) {
        atomic_fetch_add(&w->refs, 1);
        if (!(token = exec_rendezvous_on_cancel(w->rv, w->step_id, on_cancel, w, &aborted)))
            atomic_fetch_sub(&w->refs, 1);
    }
    dg_tensor *out = NULL;
    dg_status st = DG_STATUS_INIT;
    pthread_mutex_lock(&r->mu);
    w->timer = timer;
    w->cancel_token = token;
    w->registered = true;
    bool finish_now = true;
    if (w->done) dg_status_copy(&st, &w->err);             // deadline or abort came first
    else if (!dg_status_ok(&aborted)) dg_status_copy(&st, &aborted);
    else if (!try_now(r, w, &out, &st)) finish_now = false;   // still nothing: wait
    if (finish_now) w->done = true;
    else append_waiter(r, w);
    pthread_mutex_unlock(&r->mu);
    if (finish_now) {
        finish(w, timer, token, out, dg_status_ok(&st) ? NULL : &st);
        waiter_unref(w);   // the list's reference: never used
    }
    status_impl_clear(&st);
    status_impl_clear(&aborted);
    waiter_unref(w);   // the starter's
}

// Finishes waiters the resource has ended (done set and unlinked under the lock by the
// caller, which then released it). outs[i] consumed; sts[i] NULL for success.
static void finish_taken(waiter **ws, dg_tensor **outs, const dg_status *st, int n) {
    for (int i = 0; i < n; i++) {
        finish(ws[i], ws[i]->timer, ws[i]->cancel_token, outs ? outs[i] : NULL, st);
        waiter_unref(ws[i]);   // the list's reference
    }
}

static bool attr_int(const dg_node *n, const char *name, int64_t dflt, int64_t *out) {
    if (!dg_node_attr_int(n, name, out)) *out = dflt;
    return true;
}

// ---- the conditional accumulator ----
typedef struct accum {
    resource base;             // first: resource* and accum* convert
    dg_dtype dtype;
    dg_shape shape;
    int64_t n;                 // elements
    double *sum;               // running sum of the accepted gradients (in double)
    int count;                 // gradients in sum
    int64_t oldest, newest;    // the smallest and largest local step in sum (count > 0)
    int64_t global_step;       // gradients of older local steps are stale
    int64_t *last_step;        // per replica id: the last local step it contributed; -1 never
    int n_replicas;
    int live;                  // AccumulatorSetLiveReplicas: a take needs at most this many; 0: no cap
} accum;

static void accum_free(resource *r) {
    accum *a = (accum *)r;
    free(a->sum);
    free(a->last_step);
    free(a);
}

typedef struct accum_arg {
    const char *name;
    dg_dtype dtype;
    dg_shape shape;
} accum_arg;

static void *accum_create(void *arg, dg_status *st) {
    accum_arg *aa = arg;
    accum *a = calloc(1, sizeof *a);
    int64_t n = dg_shape_num_elements(&aa->shape);
    if (!a || !(a->sum = calloc((size_t)(n > 0 ? n : 1), sizeof *a->sum)) ||
        !res_init(&a->base, aa->name, accum_free)) {
        if (a) {
            free(a->sum);
            free(a->base.name);
        }
        free(a);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "accumulator \"%s\": out of memory", aa->name);
        return NULL;
    }
    a->dtype = aa->dtype;
    a->shape = aa->shape;
    a->n = n;
    return a;
}

typedef struct accum_kernel {
    accum *a;                  // one reference held
    int64_t replica;           // ApplyGradient: the worker's task index (-1 unknown)
    int64_t timeout_ms;        // TakeGradient
    int64_t total_replicas;    // TakeGradient
} accum_kernel;

static void accum_kernel_free(void *state) {
    accum_kernel *k = state;
    res_unref(&k->a->base);
    free(k);
}

static void *accum_kernel_create(const dg_node *n, const exec_env *env, dg_status *st) {
    accum_arg aa = {dg_node_attr_string(n, "shared_name"), DG_INVALID_DTYPE, dg_shape_unknown()};
    if (!aa.name || !dg_node_attr_type(n, "dtype", &aa.dtype) || !dg_node_attr_shape(n, "shape", &aa.shape)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "accumulator op needs shared_name, dtype and shape");
        return NULL;
    }
    accum *a = exec_resources_object(env->rm, "sync_accumulator", aa.name, accum_create, &aa, res_destroy, st);
    if (!a) return NULL;
    if (a->dtype != aa.dtype || !dg_shape_equal(&a->shape, &aa.shape)) {
        char x[128], y[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "accumulator \"%s\" on %s holds %s %s gradients; this op "
                       "declares %s %s", aa.name, env->device ? env->device : "this task", dg_dtype_name(a->dtype),
                       dg_shape_str(&a->shape, x, sizeof x), dg_dtype_name(aa.dtype),
                       dg_shape_str(&aa.shape, y, sizeof y));
        return NULL;
    }
    accum_kernel *k = calloc(1, sizeof *k);
    if (!k) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "accumulator kernel: out of memory");
        return NULL;
    }
    res_ref(&a->base);
    k->a = a;
    attr_int(n, "replica", -1, &k->replica);
    attr_int(n, "timeout_ms", 0, &k->timeout_ms);
    attr_int(n, "total_replicas", 0, &k->total_replicas);
    return k;
}

// Takes the average if enough gradients are in; called under the lock.
static bool accum_try_take(resource *r, waiter *w, dg_tensor **out, dg_status *st) {
    accum *a = (accum *)r;
    int need = a->live > 0 && a->live < w->num_required ? a->live : w->num_required;
    if (a->count < need) return false;
    dg_tensor *t = dg_tensor_new(a->dtype, a->shape, st);
    if (!t) {
        dg_status_prepend(st, "accumulator \"%s\"", r->name);
        return true;
    }
    double inv = 1.0 / a->count;
    if (a->dtype == DG_FLOAT64)
        for (int64_t i = 0; i < a->n; i++) ((double *)t->data)[i] = a->sum[i] * inv;
    else
        for (int64_t i = 0; i < a->n; i++) ((float *)t->data)[i] = (float)(a->sum[i] * inv);
    memset(a->sum, 0, (size_t)a->n * sizeof *a->sum);
    a->count = 0;
    a->global_step++;
    *out = t;
    return true;
}

// Under the lock: the first waiting take, ended if the accumulator can now serve it (its
// average in *out, or an error in st); NULL when there is none or it must wait on.
static waiter *serve_waiting(accum *a, dg_tensor **out, dg_status *st) {
    waiter *w = a->base.waiters;
    if (!w || !accum_try_take(&a->base, w, out, st)) return NULL;
    w->done = true;
    unlink_waiter(&a->base, w);
    return w;
}

// After the lock: gives a take served by serve_waiting its average or error.
static void finish_served(waiter *taken, dg_tensor *out, dg_status *st) {
    if (taken) finish_taken(&taken, &out, dg_status_ok(st) ? NULL : st, 1);
    status_impl_clear(st);
}

static void take_deadline_error(waiter *w, dg_status *st) {
    accum *a = (accum *)w->res;
    size_t cap = 256 + 64 * (size_t)(w->total_replicas > 0 ? w->total_replicas : 0);
    char *missing = malloc(cap);
    if (!missing) {
        dg_status_setf(st, DG_DEADLINE_EXCEEDED, "sync replicas: global step %lld: got %d of %d gradients within %lld ms",
                       (long long)a->global_step, a->count, w->num_required, (long long)w->timeout_ms);
        return;
    }
    size_t len = 0;
    int n_missing = 0;
    missing[0] = 0;
    for (int r = 0; r < w->total_replicas; r++) {
        int64_t last = r < a->n_replicas ? a->last_step[r] : -1;
        if (last >= a->global_step) continue;
        char when[64];
        if (last < 0) snprintf(when, sizeof when, "never contributed");
        else snprintf(when, sizeof when, "last contributed at step %lld", (long long)last);
        len += (size_t)snprintf(missing + len, cap - len, "%sworker task %d (%s)", n_missing ? ", " : "", r, when);
        n_missing++;
    }
    dg_status_setf(st, DG_DEADLINE_EXCEEDED,
                   "sync replicas: global step %lld: got %d of %d gradients within %lld ms%s%s (accumulator \"%s\")",
                   (long long)a->global_step, a->count, w->num_required, (long long)w->timeout_ms,
                   n_missing ? "; no gradient from " : "", missing, a->base.name);
    free(missing);
}

static void take_start(void *state, exec_ctx *ctx, exec_async_handle h) {
    accum_kernel *k = state;
    accum *a = k->a;
    int64_t want = IN(0)->dtype == DG_INT32 ? dg_tensor_i32(IN(0))[0] : -1;
    if (want < 1 || IN(0)->n_elements != 1) {
        dg_status err = DG_STATUS_INIT;
        dg_status_setf(&err, DG_INVALID_ARGUMENT, "accumulator \"%s\": num_required must be >= 1, got %lld",
                       a->base.name, (long long)want);
        exec_async_done(h, NULL, &err);
        status_impl_clear(&err);
        return;
    }
    waiter *w = waiter_new(&a->base, ctx, h, k->timeout_ms);
    if (!w) return;
    w->num_required = (int)want;
    w->total_replicas = (int)k->total_replicas;
    w->deadline_error = take_deadline_error;
    park(w, accum_try_take);
}

static bool apply_gradient_compute(void *state, exec_ctx *ctx) {
    accum_kernel *k = state;
    accum *a = k->a;
    dg_tensor *g = IN(1);
    if (IN(0)->dtype != DG_INT64 || IN(0)->n_elements != 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "accumulator \"%s\": local_step must be an int64 scalar",
                         a->base.name);
    if (g->dtype != a->dtype || !dg_shape_equal(&g->shape, &a->shape)) {
        char x[128], y[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "accumulator \"%s\" holds %s %s gradients, got %s %s",
                         a->base.name, dg_dtype_name(a->dtype), dg_shape_str(&a->shape, x, sizeof x),
                         dg_dtype_name(g->dtype), dg_shape_str(&g->shape, y, sizeof y));
    }
    int64_t local_step = dg_tensor_i64(IN(0))[0];
    waiter *taken = NULL;
    dg_tensor *out = NULL;
    dg_status st = DG_STATUS_INIT;
    pthread_mutex_lock(&a->base.mu);
    if (k->replica >= 0 && k->replica >= a->n_replicas) {
        int n = (int)k->replica + 1;
        int64_t *ls = realloc(a->last_step, (size_t)n * sizeof *ls);
        if (!ls) {
            pthread_mutex_unlock(&a->base.mu);
            return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "accumulator \"%s\": out of memory", a->base.name);
        }
        for (int i = a->n_replicas; i < n; i++) ls[i] = -1;
        a->last_step = ls;
        a->n_replicas = n;
    }
    // A gradient computed from parameters older than the accumulator's step is stale: dropped.
    if (local_step >= a->global_step) {
        if (a->dtype == DG_FLOAT64)
            for (int64_t i = 0; i < a->n; i++) a->sum[i] += ((const double *)g->data)[i];
        else
            for (int64_t i = 0; i < a->n; i++) a->sum[i] += ((const float *)g->data)[i];
        if (a->count == 0 || local_step < a->oldest) a->oldest = local_step;
        if (a->count == 0 || local_step > a->newest) a->newest = local_step;
        a->count++;
        if (k->replica >= 0) a->last_step[k->replica] = local_step;
        taken = serve_waiting(a, &out, &st);
    }
    pthread_mutex_unlock(&a->base.mu);
    finish_served(taken, out, &st);
    return true;
}

static bool set_global_step_compute(void *state, exec_ctx *ctx) {
    accum_kernel *k = state;
    accum *a = k->a;
    if (IN(0)->dtype != DG_INT64 || IN(0)->n_elements != 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "accumulator \"%s\": the new global step must be an int64 "
                         "scalar", a->base.name);
    int64_t step = dg_tensor_i64(IN(0))[0];
    pthread_mutex_lock(&a->base.mu);
    // Gradients computed at another step are stale once the step moves; those computed at
    // exactly the new one are kept. After a restart a worker can apply its first gradient (at
    // the restored step) before the chief sets the step of the fresh accumulator: dropping it
    // would leave the chief's take one gradient short while that worker waits for a token.
    if (a->count > 0 && (a->oldest != step || a->newest != step)) {
        memset(a->sum, 0, (size_t)a->n * sizeof *a->sum);
        a->count = 0;
    }
    a->global_step = step;
    pthread_mutex_unlock(&a->base.mu);
    return true;
}

// How many replicas are alive (the chief's hook probes them): a take waiting for more
// gradients than that ends with those it has, when it has that many.
static bool set_live_compute(void *state, exec_ctx *ctx) {
    accum_kernel *k = state;
    accum *a = k->a;
    if (IN(0)->dtype != DG_INT32 || IN(0)->n_elements != 1 || dg_tensor_i32(IN(0))[0] < 0)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "accumulator \"%s\": the live replica count must be an int32 "
                         "scalar >= 0", a->base.name);
    dg_tensor *out = NULL;
    dg_status st = DG_STATUS_INIT;
    pthread_mutex_lock(&a->base.mu);
    a->live = dg_tensor_i32(IN(0))[0];
    waiter *taken = serve_waiting(a, &out, &st);
    pthread_mutex_unlock(&a->base.mu);
    finish_served(taken, out, &st);
    return true;
}

static bool num_accumulated_compute(void *state, exec_ctx *ctx) {
    accum_kernel *k = state;
    dg_tensor *o = exec_alloc_output(ctx, 0, DG_INT32, dg_shape_scalar());
    if (!o) return false;
    pthread_mutex_lock(&k->a->base.mu);
    dg_tensor_i32(o)[0] = k->a->count;
    pthread_mutex_unlock(&k->a->base.mu);
    return true;
}

// Ends every waiting take of a resource with st.
static void cancel_all(resource *r, const dg_status *st) {
    int n = 0, cap = 0;
    waiter **ws = NULL;
    pthread_mutex_lock(&r->mu);
    for (waiter *w = r->waiters; w; w = w->next) cap++;
    ws = calloc((size_t)cap + 1, sizeof *ws);
    if (ws)
        while (r->waiters) {
            waiter *w = r->waiters;
            r->waiters = w->next;
            w->next = NULL;
            w->done = true;
            ws[n++] = w;
        }
    pthread_mutex_unlock(&r->mu);
    finish_taken(ws, NULL, st, n);
    free(ws);
}

static bool cancel_take_compute(void *state, exec_ctx *ctx) {
    accum_kernel *k = state;
    dg_status st = DG_STATUS_INIT;
    dg_status_setf(&st, DG_CANCELLED, "accumulator \"%s\": the take was cancelled (the sync replicas apply loop "
                   "is stopping)", k->a->base.name);
    cancel_all(&k->a->base, &st);
    status_impl_clear(&st);
    return true;
}

// ---- the token queue: a FIFO of int64 ----
typedef struct tqueue {
    resource base;
    int64_t *items;            // ring buffer
    size_t head, count, cap;
    bool closed;
    dg_code close_code;        // OK: closed normally (an empty queue then fails OUT_OF_RANGE)
    char *close_msg;           // the reason given, owned; NULL: none
} tqueue;

static void queue_free(resource *r) {
    tqueue *q = (tqueue *)r;
    free(q->items);
    free(q->close_msg);
    free(q);
}

static void *queue_create(void *arg, dg_status *st) {
    const char *name = arg;
    tqueue *q = calloc(1, sizeof *q);
    if (!q || !res_init(&q->base, name, queue_free)) {
        free(q);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "queue \"%s\": out of memory", name);
        return NULL;
    }
    return q;
}

typedef struct queue_kernel {
    tqueue *q;                 // one reference held
    int64_t timeout_ms;        // Dequeue
} queue_kernel;

static void queue_kernel_free(void *state) {
    queue_kernel *k = state;
    res_unref(&k->q->base);
    free(k);
}

static void *queue_kernel_create(const dg_node *n, const exec_env *env, dg_status *st) {
    const char *name = dg_node_attr_string(n, "shared_name");
    if (!name || !*name) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "queue op needs a shared_name");
        return NULL;
    }
    tqueue *q = exec_resources_object(env->rm, "sync_token_queue", name, queue_create, (void *)name, res_destroy, st);
    queue_kernel *k = q ? calloc(1, sizeof *k) : NULL;
    if (!k) {
        if (q) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "queue kernel: out of memory");
        return NULL;
    }
    res_ref(&q->base);
    k->q = q;
    attr_int(n, "timeout_ms", 0, &k->timeout_ms);
    return k;
}

// The error of a dequeue from a closed queue; called under the lock.
static void closed_error(tqueue *q, dg_status *st) {
    if (q->close_code != DG_OK)
        dg_status_setf(st, q->close_code, "queue \"%s\" was closed: %s", q->base.name,
                       q->close_msg ? q->close_msg : "(no reason given)");
    else
        dg_status_setf(st, DG_OUT_OF_RANGE, "queue \"%s\" is closed and empty%s%s", q->base.name,
                       q->close_msg ? ": " : "", q->close_msg ? q->close_msg : "");
}

static bool queue_try_dequeue(resource *r, waiter *w, dg_tensor **out, dg_status *st) {
    tqueue *q = (tqueue *)r;
    // Closed with an error: the cause wins over tokens still queued.
    if (q->closed && (q->close_code != DG_OK || q->count == 0)) {
        closed_error(q, st);
        return true;
    }
    if (q->count == 0) return false;
    int64_t v = q->items[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    if (!(*out = dg_tensor_scalar_i64(v))) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "queue: out of memory");
    return true;
}

static void dequeue_deadline_error(waiter *w, dg_status *st) {
    dg_status_setf(st, DG_DEADLINE_EXCEEDED, "queue \"%s\": nothing to dequeue within %lld ms (sync replicas: "
                   "the chief enqueues tokens after each step; is it alive?)", w->res->name,
                   (long long)w->timeout_ms);
}

static void dequeue_start(void *state, exec_ctx *ctx, exec_async_handle h) {
    queue_kernel *k = state;
    waiter *w = waiter_new(&k->q->base, ctx, h, k->timeout_ms);
    if (!w) return;
    w->deadline_error = dequeue_deadline_error;
    // Fast path: a token is there (or the queue is closed), no timer or canceller needed.
    dg_tensor *out = NULL;
    dg_status st = DG_STATUS_INIT;
    pthread_mutex_lock(&k->q->base.mu);
    bool now = !k->q->base.waiters && queue_try_dequeue(&k->q->base, w, &out, &st);
    if (now) {
        w->done = true;
        w->registered = true;
    }
    pthread_mutex_unlock(&k->q->base.mu);
    if (now) {
        exec_async_done(h, out, dg_status_ok(&st) ? NULL : &st);
        status_impl_clear(&st);
        waiter_unref(w);
        waiter_unref(w);
        return;
    }
    status_impl_clear(&st);
    park(w, queue_try_dequeue);
}

static bool enqueue_many_compute(void *state, exec_ctx *ctx) {
    queue_kernel *k = state;
    tqueue *q = k->q;
    dg_tensor *v = IN(0);
    if (v->dtype != DG_INT64 || dg_tensor_rank(v) != 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "queue \"%s\": values must be an int64 vector", q->base.name);
    int64_t n = v->n_elements;
    waiter **ws = NULL;
    dg_tensor **outs = NULL;
    int n_taken = 0;
    pthread_mutex_lock(&q->base.mu);
    if (q->closed) {
        pthread_mutex_unlock(&q->base.mu);
        return exec_fail(ctx, DG_CANCELLED, "queue \"%s\" is closed", q->base.name);
    }
    if (q->count + (size_t)n > q->cap) {
        size_t cap = q->cap ? q->cap : 16;
        while (cap < q->count + (size_t)n) cap *= 2;
        int64_t *items = malloc(cap * sizeof *items);
        if (!items) {
            pthread_mutex_unlock(&q->base.mu);
            return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "queue \"%s\": %zu bytes", q->base.name, cap * sizeof *items);
        }
        for (size_t i = 0; i < q->count; i++) items[i] = q->items[(q->head + i) % q->cap];
        free(q->items);
        q->items = items;
        q->head = 0;
        q->cap = cap;
    }
    for (int64_t i = 0; i < n; i++) q->items[(q->head + q->count++) % q->cap] = dg_tensor_i64(v)[i];
    int n_waiting = 0;
    for (waiter *w = q->base.waiters; w; w = w->next) n_waiting++;
    if (n_waiting > 0 && q->count > 0) {
        ws = calloc((size_t)n_waiting, sizeof *ws);
        outs = calloc((size_t)n_waiting, sizeof *outs);
    }
    dg_status st = DG_STATUS_INIT;
    while (ws && outs && q->base.waiters && q->count > 0) {
        waiter *w = q->base.waiters;
        queue_try_dequeue(&q->base, w, &outs[n_taken], &st);
        if (!outs[n_taken]) break;   // out of memory: the token stays for a later dequeue
        q->base.waiters = w->next;
        w->next = NULL;
        w->done = true;
        ws[n_taken++] = w;
    }
    pthread_mutex_unlock(&q->base.mu);
    finish_taken(ws, outs, NULL, n_taken);
    free(ws);
    free(outs);
    status_impl_clear(&st);
    return true;
}

static bool queue_size_compute(void *state, exec_ctx *ctx) {
    queue_kernel *k = state;
    dg_tensor *o = exec_alloc_output(ctx, 0, DG_INT32, dg_shape_scalar());
    if (!o) return false;
    pthread_mutex_lock(&k->q->base.mu);
    dg_tensor_i32(o)[0] = (int32_t)k->q->count;
    pthread_mutex_unlock(&k->q->base.mu);
    return true;
}

// code < 0: reopen (empty, not closed); 0: close normally; > 0: close with that error code.
// The first close wins; waiting dequeues fail with the close's status.
static bool queue_close_compute(void *state, exec_ctx *ctx) {
    queue_kernel *k = state;
    tqueue *q = k->q;
    if (IN(0)->dtype != DG_INT32 || IN(0)->n_elements != 1 || IN(1)->dtype != DG_UINT8)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "queue \"%s\": close takes an int32 code and a uint8 reason",
                         q->base.name);
    int32_t code = dg_tensor_i32(IN(0))[0];
    if (code > DG_DATA_LOSS)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "queue \"%s\": close code %d is not a status code",
                         q->base.name, code);
    char *reason = NULL;
    if (IN(1)->n_elements > 0) {
        reason = malloc((size_t)IN(1)->n_elements + 1);
        if (!reason) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "queue close: out of memory");
        memcpy(reason, IN(1)->data, (size_t)IN(1)->n_elements);
        reason[IN(1)->n_elements] = 0;
    }
    pthread_mutex_lock(&q->base.mu);
    if (code < 0) {
        q->closed = false;
        q->count = 0;
        q->head = 0;
        q->close_code = DG_OK;
        free(q->close_msg);
        q->close_msg = NULL;
        pthread_mutex_unlock(&q->base.mu);
        free(reason);
        return true;
    }
    bool was_closed = q->closed;
    if (!was_closed) {
        q->closed = true;
        q->close_code = (dg_code)code;
        q->close_msg = reason;
        reason = NULL;
    }
    dg_status st = DG_STATUS_INIT;
    closed_error(q, &st);
    pthread_mutex_unlock(&q->base.mu);
    free(reason);
    // A queue with waiting dequeues is empty, so every one of them fails.
    cancel_all(&q->base, &st);
    status_impl_clear(&st);
    return true;
}


// ---- the coordinator of an elastic group (ElasticRendezvous) ----
// Workers arrive with their task, why they come (ELASTIC_*) and the epoch they are in. A
// round ends when every member of the epoch in force has arrived, except those reported lost
// (or, barrier_timeout_ms after the first arrival, with those that came): all arrivals get the
// same answer, [epoch, members...]. The epoch stays when only its members came, each at a
// commit of that epoch, with nobody lost; otherwise a new epoch begins: the members that came
// with their state (not joining), in their old order, then the others by task index. The first
// epoch forms once min_members tasks have come.
enum { ELASTIC_COMMIT = 0, ELASTIC_JOIN = 1, ELASTIC_REFORM = 2, ELASTIC_DONE = 3 };

typedef struct elastic_coord {
    resource base;             // first: resource* and elastic_coord* convert
    int min_members;
    int64_t barrier_timeout_ms;
    int64_t epoch;             // -1 before the first
    int *members;              // of epoch, rank order
    int n_members;
    int *lost;                 // members reported lost in this round
    int n_lost, cap_lost;
    bool change;               // a joiner, a loss or a stale epoch came in this round
    uint64_t barrier_timer;    // pending round deadline, 0: none
    int64_t round;             // rounds ended so far: a deadline of an ended round does nothing
    struct barrier_arg *barrier_arg;   // the pending deadline's argument
    waiter **ready;            // ended by the round, finished after the lock is released
    dg_tensor **ready_outs;
    int n_ready, cap_ready, cap_ready_outs;
    bool log;                  // a line on stderr per epoch (attribute "log")
    bool finished;             // a member came with ELASTIC_DONE: the job has ended; joiners get [-2]
    bool has_fingerprint;      // of the members' variables (names, types, shapes), set by the first
    int64_t fingerprint;
} elastic_coord;

static void elastic_free(resource *r) {
    elastic_coord *c = (elastic_coord *)r;
    free(c->members);
    free(c->lost);
    free(c->ready);
    free(c->ready_outs);
    free(c);
}

typedef struct elastic_attrs {
    const char *name;
    int64_t min_members, barrier_timeout_ms, log;
} elastic_attrs;

static void *elastic_create(void *arg, dg_status *st) {
    const elastic_attrs *a = arg;
    elastic_coord *c = calloc(1, sizeof *c);
    if (!c || !res_init(&c->base, a->name, elastic_free)) {
        free(c);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "elastic coordinator \"%s\": out of memory", a->name);
        return NULL;
    }
    c->min_members = (int)a->min_members;
    c->barrier_timeout_ms = a->barrier_timeout_ms;
    c->log = a->log != 0;
    c->epoch = -1;
    return c;
}

static bool in_list(const int *xs, int n, int x) {
    for (int i = 0; i < n; i++)
        if (xs[i] == x) return true;
    return false;
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

// Whether task has arrived: a waiter in the list, or extra (the arrival being started).
static const waiter *arrival_of(elastic_coord *c, const waiter *extra, int64_t task) {
    if (extra && extra->task == task) return extra;
    for (waiter *w = c->base.waiters; w; w = w->next)
        if (w->task == task) return w;
    return NULL;
}

static void barrier_deadline(void *arg);

// Ends the round if it can (under the lock): every arrival but extra is moved to c->ready with
// its answer, extra's answer goes to *extra_out. force: the round's deadline passed, so the
// members missing are left out. Returns whether it ended.
static bool elastic_round(elastic_coord *c, waiter *extra, dg_tensor **extra_out, bool force, dg_status *st) {
    int n_arrived = 0;
    for (waiter *w = c->base.waiters; w; w = w->next) n_arrived++;
    if (extra) n_arrived++;
    if (n_arrived == 0) return false;
    bool change = c->change || c->epoch < 0;
    if (c->epoch < 0) {
        // Each task waits once (elastic_start replaces an earlier wait of its task).
        if (n_arrived < c->min_members) return false;
    } else {
        for (waiter *w = c->base.waiters; w; w = w->next)
            if (w->kind != ELASTIC_COMMIT || w->epoch_seen != c->epoch) change = true;
        if (extra && (extra->kind != ELASTIC_COMMIT || extra->epoch_seen != c->epoch)) change = true;
        for (int i = 0; i < c->n_members; i++) {
            int m = c->members[i];
            if (in_list(c->lost, c->n_lost, m)) {
                change = true;
                continue;
            }
            if (arrival_of(c, extra, m)) continue;
            if (!force) return false;
            change = true;   // missing at the deadline: left out
        }
    }
    int *next = malloc((size_t)(n_arrived > 0 ? n_arrived : 1) * sizeof *next);
    if (!next) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "elastic coordinator: out of memory");
        return false;
    }
    int n_next = 0;
    if (!change) {
        memcpy(next, c->members, (size_t)c->n_members * sizeof *next);
        n_next = c->n_members;
    } else {
        // The members that came with their state keep their order (the first is rank 0, whose
        // values the others take), then the rest by task index.
        for (int i = 0; i < c->n_members; i++) {
            const waiter *a = arrival_of(c, extra, c->members[i]);
            if (a && a->kind != ELASTIC_JOIN && !in_list(c->lost, c->n_lost, c->members[i]))
                next[n_next++] = c->members[i];
        }
        int first_new = n_next;
        for (waiter *w = c->base.waiters;; w = w->next) {
            const waiter *a = w ? w : extra;
            if (!a) break;
            if (!in_list(next, n_next, (int)a->task)) next[n_next++] = (int)a->task;
            if (!w) break;
        }
        qsort(next + first_new, (size_t)(n_next - first_new), sizeof *next, cmp_int);
        if (c->log) {
            // One line per epoch on the coordinator's stderr: who is in, who came new, who left.
            char in[512], came[256], left[256];
            size_t a = 0, b = 0, d = 0;
            in[0] = came[0] = left[0] = 0;
            for (int i = 0; i < n_next && a + 16 < sizeof in; i++)
                a += (size_t)snprintf(in + a, sizeof in - a, "%s%d", i ? "," : "", next[i]);
            for (int i = first_new; i < n_next && b + 16 < sizeof came; i++)
                b += (size_t)snprintf(came + b, sizeof came - b, "%s%d", b ? "," : "", next[i]);
            for (int i = 0; i < c->n_members && d + 16 < sizeof left; i++)
                if (!in_list(next, n_next, c->members[i]))
                    d += (size_t)snprintf(left + d, sizeof left - d, "%s%d", d ? "," : "", c->members[i]);
            struct timespec wall;
            clock_gettime(CLOCK_REALTIME, &wall);   // Unix time, as the workers' lines
            fprintf(stderr, "%.6f: elastic coordinator %s: epoch %lld: members [%s]; new [%s]; left [%s]%s\n",
                    (double)wall.tv_sec + wall.tv_nsec * 1e-9, c->base.name, (long long)c->epoch + 1, in, came, left,
                    force ? " (at the commit deadline: the members missing were left out)" : "");
        }
        free(c->members);
        c->members = malloc((size_t)n_next * sizeof *c->members);
        if (!c->members) abort();
        memcpy(c->members, next, (size_t)n_next * sizeof *next);
        c->n_members = n_next;
        c->epoch++;
    }
    free(next);
    c->n_lost = 0;
    c->change = false;
    c->round++;
    // A cancelled deadline gives back its argument here; one running now frees it itself.
    if (c->barrier_timer && exec_timer_cancel(c->barrier_timer)) {
        free(c->barrier_arg);
        res_unref(&c->base);   // never the last: the resources and the kernels hold it
    }
    c->barrier_timer = 0;
    c->barrier_arg = NULL;
    // The answer, one tensor per arrival.
    for (waiter *w = c->base.waiters;; w = w->next) {
        dg_tensor *t = dg_tensor_new(DG_INT64, dg_shape1(1 + c->n_members), NULL);
        if (!t) abort();
        dg_tensor_i64(t)[0] = c->epoch;
        for (int i = 0; i < c->n_members; i++) dg_tensor_i64(t)[1 + i] = c->members[i];
        if (!w) {
            if (extra) *extra_out = t;
            else dg_tensor_unref(t);
            break;
        }
        w->done = true;
        int k = c->n_ready;
        BASE_PUSH(c->ready_outs, k, c->cap_ready_outs, t);
        BASE_PUSH(c->ready, c->n_ready, c->cap_ready, w);
    }
    c->base.waiters = NULL;
    return true;
}

// Finishes the arrivals a round ended (not under the lock).
static void elastic_flush(elastic_coord *c) {
    pthread_mutex_lock(&c->base.mu);
    waiter **ws = c->ready;
    dg_tensor **outs = c->ready_outs;
    int n = c->n_ready;
    c->ready = NULL;
    c->ready_outs = NULL;
    c->n_ready = c->cap_ready = c->cap_ready_outs = 0;
    pthread_mutex_unlock(&c->base.mu);
    finish_taken(ws, outs, NULL, n);
    free(ws);
    free(outs);
}

// A round's deadline: the coordinator (one reference held) and the round it belongs to.
typedef struct barrier_arg {
    elastic_coord *c;
    int64_t round;
} barrier_arg;

static void barrier_deadline(void *arg) {
    barrier_arg *b = arg;
    elastic_coord *c = b->c;
    dg_status st = DG_STATUS_INIT;
    pthread_mutex_lock(&c->base.mu);
    if (c->round == b->round) {   // not ended meanwhile (a cancel that came too late)
        c->barrier_timer = 0;
        c->barrier_arg = NULL;
        elastic_round(c, NULL, NULL, true, &st);
    }
    pthread_mutex_unlock(&c->base.mu);
    elastic_flush(c);
    status_impl_clear(&st);
    res_unref(&c->base);
    free(b);
}

// park's try for an arrival (under the lock): the arrival's lost reports count, then the round
// ends if it can; if not, the round's deadline starts with its first arrival.
static bool elastic_try(resource *r, waiter *w, dg_tensor **out, dg_status *st) {
    elastic_coord *c = (elastic_coord *)r;
    if (elastic_round(c, w, out, false, st)) return true;
    if (!dg_status_ok(st)) return true;
    if (c->epoch >= 0 && !c->barrier_timer) {
        barrier_arg *b = malloc(sizeof *b);
        if (!b) abort();
        *b = (barrier_arg){c, c->round};
        res_ref(&c->base);
        if (!(c->barrier_timer = exec_timer_add(c->barrier_timeout_ms, barrier_deadline, b))) {
            res_unref(&c->base);
            free(b);
        } else {
            c->barrier_arg = b;
        }
    }
    return false;
}

typedef struct elastic_kernel {
    elastic_coord *c;          // one reference held
    int64_t timeout_ms;
} elastic_kernel;

static void elastic_kernel_free(void *state) {
    elastic_kernel *k = state;
    res_unref(&k->c->base);
    free(k);
}

static void *elastic_kernel_create(const dg_node *n, const exec_env *env, dg_status *st) {
    elastic_attrs a = {dg_node_attr_string(n, "shared_name"), 1, 10000, 0};
    attr_int(n, "min_members", 1, &a.min_members);
    attr_int(n, "log", 0, &a.log);
    attr_int(n, "barrier_timeout_ms", 10000, &a.barrier_timeout_ms);
    if (!a.name || !*a.name || a.min_members < 1 || a.barrier_timeout_ms < 1) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "elastic coordinator: needs a shared_name, min_members >= 1 and "
                      "barrier_timeout_ms >= 1");
        return NULL;
    }
    elastic_coord *c = exec_resources_object(env->rm, "elastic_coordinator", a.name, elastic_create, &a,
                                             res_destroy, st);
    elastic_kernel *k = c ? calloc(1, sizeof *k) : NULL;
    if (!k) {
        if (c) dg_status_set(st, DG_RESOURCE_EXHAUSTED, "elastic coordinator kernel: out of memory");
        return NULL;
    }
    res_ref(&c->base);
    k->c = c;
    attr_int(n, "timeout_ms", 0, &k->timeout_ms);
    return k;
}

static void elastic_deadline_error(waiter *w, dg_status *st) {
    dg_status_setf(st, DG_DEADLINE_EXCEEDED,
                   "elastic coordinator \"%s\": task %lld waited %lld ms for the group's next round (are the "
                   "other members alive, and do they reach their commits?)",
                   w->res->name, (long long)w->task, (long long)w->timeout_ms);
}

// [v]: an answer without members (the epoch to a finished member, -2 to a late joiner).
static dg_tensor *answer1(int64_t v) {
    dg_tensor *t = dg_tensor_new(DG_INT64, dg_shape1(1), NULL);
    if (!t) abort();
    dg_tensor_i64(t)[0] = v;
    return t;
}

static void elastic_start(void *state, exec_ctx *ctx, exec_async_handle h) {
    elastic_kernel *k = state;
    elastic_coord *c = k->c;
    dg_status err = DG_STATUS_INIT;
    const dg_tensor *lost = IN(3);
    if (IN(0)->dtype != DG_INT64 || IN(0)->n_elements != 1 || IN(1)->dtype != DG_INT64 || IN(1)->n_elements != 1 ||
        IN(2)->dtype != DG_INT64 || IN(2)->n_elements != 1 || lost->dtype != DG_INT64 || dg_tensor_rank(lost) != 1)
        dg_status_setf(&err, DG_INVALID_ARGUMENT, "elastic coordinator \"%s\": needs int64 task, kind and epoch "
                       "scalars and an int64 vector of lost tasks", c->base.name);
    int64_t task = dg_status_ok(&err) ? dg_tensor_i64(IN(0))[0] : 0;
    int64_t kind = dg_status_ok(&err) ? dg_tensor_i64(IN(1))[0] : 0;
    if (dg_status_ok(&err) && (task < 0 || task > INT32_MAX || kind < ELASTIC_COMMIT || kind > ELASTIC_DONE ||
                               lost->n_elements > EXEC_COLL_MAX_MEMBERS || IN(4)->dtype != DG_INT64 ||
                               IN(4)->n_elements != 1))
        dg_status_setf(&err, DG_INVALID_ARGUMENT, "elastic coordinator \"%s\": task %lld, kind %lld, %lld lost "
                       "tasks or the fingerprint out of range", c->base.name, (long long)task, (long long)kind,
                       (long long)lost->n_elements);
    if (dg_status_ok(&err)) {
        // Every member trains the same variables: a worker built from another graph is refused,
        // here and in its own error.
        int64_t fp = dg_tensor_i64(IN(4))[0];
        pthread_mutex_lock(&c->base.mu);
        if (!c->has_fingerprint) {
            c->has_fingerprint = true;
            c->fingerprint = fp;
        } else if (c->fingerprint != fp) {
            dg_status_setf(&err, DG_FAILED_PRECONDITION,
                           "elastic coordinator \"%s\": refused task %lld: its variables (names, types, shapes: "
                           "fingerprint %016llx) are not the group's (%016llx); is it running another model?",
                           c->base.name, (long long)task, (unsigned long long)fp, (unsigned long long)c->fingerprint);
            fprintf(stderr, "distgraph: %s\n", dg_status_message(&err));
        }
        pthread_mutex_unlock(&c->base.mu);
    }
    if (!dg_status_ok(&err)) {
        exec_async_done(h, NULL, &err);
        status_impl_clear(&err);
        return;
    }
    if (kind == ELASTIC_DONE || kind == ELASTIC_JOIN) {
        // A member that finished the job: it holds no round up any more, and the joiners
        // waiting (and any that come later) are told the job has ended, [-2].
        waiter **ended = NULL;
        dg_tensor **outs = NULL;
        int n_ended = 0, cap_ended = 0, cap_outs = 0;
        pthread_mutex_lock(&c->base.mu);
        bool answer_now = kind == ELASTIC_DONE || c->finished;
        if (kind == ELASTIC_DONE) {
            c->finished = true;
            if (in_list(c->members, c->n_members, (int)task) && !in_list(c->lost, c->n_lost, (int)task))
                BASE_PUSH(c->lost, c->n_lost, c->cap_lost, (int)task);
            for (waiter **pp = &c->base.waiters; *pp;) {
                waiter *x = *pp;
                if (x->kind != ELASTIC_JOIN) {
                    pp = &x->next;
                    continue;
                }
                *pp = x->next;
                x->next = NULL;
                x->done = true;
                int k2 = n_ended;
                BASE_PUSH(outs, k2, cap_outs, answer1(-2));
                BASE_PUSH(ended, n_ended, cap_ended, x);
            }
            dg_status ignore = DG_STATUS_INIT;
            elastic_round(c, NULL, NULL, false, &ignore);   // the others may wait for it no longer
            status_impl_clear(&ignore);
        }
        pthread_mutex_unlock(&c->base.mu);
        finish_taken(ended, outs, NULL, n_ended);
        free(ended);
        free(outs);
        elastic_flush(c);
        if (answer_now) {
            exec_async_done(h, answer1(kind == ELASTIC_DONE ? c->epoch : -2), NULL);
            return;
        }
    }
    waiter *w = waiter_new(&c->base, ctx, h, k->timeout_ms);
    if (!w) return;
    w->deadline_error = elastic_deadline_error;
    w->task = task;
    w->kind = kind;
    w->epoch_seen = dg_tensor_i64(IN(2))[0];
    pthread_mutex_lock(&c->base.mu);
    // A task that waits again (a new incarnation, or a retry) replaces its earlier wait.
    waiter *old = NULL;
    for (waiter **pp = &c->base.waiters; *pp; pp = &(*pp)->next)
        if ((*pp)->task == task) {
            old = *pp;
            *pp = old->next;
            old->next = NULL;
            old->done = true;
            break;
        }
    // Reported losses count for members of the epoch only (others cannot hold a round up, and
    // a worker's old marks of tasks long gone change nothing).
    for (int64_t i = 0; i < lost->n_elements; i++) {
        int64_t t = dg_tensor_i64(lost)[i];
        if (t >= 0 && t <= INT32_MAX && t != task && in_list(c->members, c->n_members, (int)t) &&
            !in_list(c->lost, c->n_lost, (int)t)) {
            BASE_PUSH(c->lost, c->n_lost, c->cap_lost, (int)t);
            c->change = true;
        }
    }
    if (kind != ELASTIC_COMMIT) c->change = true;
    pthread_mutex_unlock(&c->base.mu);
    if (old) {
        dg_status_setf(&err, DG_ABORTED, "elastic coordinator \"%s\": task %lld arrived again", c->base.name,
                       (long long)task);
        finish_taken(&old, NULL, &err, 1);
        status_impl_clear(&err);
    }
    park(w, elastic_try);
    elastic_flush(c);
}

#define SK(op, mask, create, compute, destroy, start) {op, "CPU", mask, create, compute, destroy, false, false, false, start, false}

static const exec_kernel_def sync_kernels[] = {
    SK("AccumulatorApplyGradient", DT_ALL, accum_kernel_create, apply_gradient_compute, accum_kernel_free, NULL),
    SK("AccumulatorTakeGradient", DT_ALL, accum_kernel_create, NULL, accum_kernel_free, take_start),
    SK("AccumulatorSetGlobalStep", DT_ALL, accum_kernel_create, set_global_step_compute, accum_kernel_free, NULL),
    SK("AccumulatorNumAccumulated", DT_ALL, accum_kernel_create, num_accumulated_compute, accum_kernel_free, NULL),
    SK("AccumulatorCancelTake", DT_ALL, accum_kernel_create, cancel_take_compute, accum_kernel_free, NULL),
    SK("AccumulatorSetLiveReplicas", DT_ALL, accum_kernel_create, set_live_compute, accum_kernel_free, NULL),
    SK("QueueEnqueueMany", DT_ALL, queue_kernel_create, enqueue_many_compute, queue_kernel_free, NULL),
    SK("QueueDequeue", DT_ALL, queue_kernel_create, NULL, queue_kernel_free, dequeue_start),
    SK("QueueSize", DT_ALL, queue_kernel_create, queue_size_compute, queue_kernel_free, NULL),
    SK("QueueClose", DT_ALL, queue_kernel_create, queue_close_compute, queue_kernel_free, NULL),
    SK("ElasticRendezvous", DT_ALL, elastic_kernel_create, NULL, elastic_kernel_free, elastic_start),
};

void cpu_register_sync_kernels(void) {
    exec_register_kernels(sync_kernels, (int)(sizeof sync_kernels / sizeof sync_kernels[0]));
}
