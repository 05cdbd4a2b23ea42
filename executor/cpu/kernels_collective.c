/* CPU kernels of the collectives: CollectiveAllReduce (sum or mean over the tasks of a job)
 * and CollectiveBroadcast (rank 0's values to every rank). Values travel through the task's
 * rendezvous like _Send/_Recv values, under step ids of their own (collective_impl.h), so the
 * server's router carries them to the peer tasks. A kernel blocks its thread on a condition
 * variable while it waits for a peer; it gives up after timeout_ms without data.
 *
 * All inputs are packed into one byte buffer, float64 inputs first and then float32 ones, so
 * one exchange serves them all. The ring all-reduce cuts that buffer into n segments on
 * 8-byte boundaries, and each segment into chunks of at most COLL_CHUNK_BYTES; a chunk is
 * reduced and sent on as soon as it arrives, while the transport's I/O thread moves the
 * others. Every element is summed in one fixed order (the ring order starting at the rank
 * after its segment's owner), and the owner's final value is what every rank copies, so the
 * results are bit-identical on every rank. */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "collective_impl.h"
#include "cpu_impl.h"
#include "exec_collective_group_impl.h"
#include "distgraph/device_name.h"
#include "exec_executor_impl.h"
#include "exec_kernel_registry_impl.h"
#include "exec_rendezvous_impl.h"
#include "exec_resources_impl.h"
#include "status_impl.h"
#include "tensor_impl.h"

// ---- the execution counter, one per (op, instance) and task, kept in the resources ----
typedef struct coll_counter {
    pthread_mutex_t mu;
    int64_t next;
    int64_t epoch;   // an elastic group's: the count starts again with each epoch
} coll_counter;

static void *counter_create(void *arg, dg_status *st) {
    (void)arg;
    coll_counter *c = calloc(1, sizeof *c);
    if (!c) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "collective counter: out of memory");
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

static void counter_destroy(void *obj) {
    coll_counter *c = obj;
    pthread_mutex_destroy(&c->mu);
    free(c);
}

// ---- kernel state ----
typedef struct coll_kernel {
    bool is_broadcast;
    bool mean;                 // final_op "Div"
    int algorithm;             // ALG_*
    bool elastic;              // members from the task's collective groups, per execution
    int size, rank;
    int64_t instance;
    int64_t timeout_ms;
    size_t chunk_bytes, direct_bytes;
    char *job;                 // owned
    int own_task;
    int64_t epoch;             // of the members below (elastic), -1 before the first
    int *tasks;                // rank -> task index, owned
    char **devices;            // rank -> "/job:J/replica:0/task:t/device:CPU:0", owned
    coll_counter *counter;     // borrowed from the resources
    exec_coll_groups *groups;  // borrowed from the resources
    pthread_mutex_t busy;      // one execution of this node at a time
    dg_tensor *pack_in, *pack_out;   // packed buffers reused between steps (multi-input)
    bool wire16;               // wire_dtype "bfloat16": float32 values travel as bfloat16
} coll_kernel;

enum { ALG_AUTO, ALG_RING, ALG_DIRECT };

static void coll_destroy(void *state) {
    coll_kernel *k = state;
    if (!k) return;
    if (k->devices)
        for (int r = 0; r < k->size; r++) free(k->devices[r]);
    free(k->devices);
    free(k->tasks);
    free(k->job);
    dg_tensor_unref(k->pack_in);
    dg_tensor_unref(k->pack_out);
    pthread_mutex_destroy(&k->busy);
    free(k);
}

static size_t env_bytes(const char *name, size_t dflt, size_t lo) {
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v < lo) return dflt;
    return (size_t)v & ~(size_t)7;
}

// Makes tasks (rank order, n of them) the members the next executions run among, with their
// device names. false when out of memory (the old members are gone then).
static bool set_members(coll_kernel *k, const int *tasks, int n) {
    if (k->devices)
        for (int r = 0; r < k->size; r++) free(k->devices[r]);
    free(k->devices);
    free(k->tasks);
    k->size = 0;
    k->devices = calloc((size_t)(n > 0 ? n : 1), sizeof *k->devices);
    k->tasks = malloc((size_t)(n > 0 ? n : 1) * sizeof *k->tasks);
    if (!k->devices || !k->tasks) return false;
    for (int r = 0; r < n; r++) {
        k->tasks[r] = tasks[r];
        if (asprintf(&k->devices[r], "/job:%s/replica:0/task:%d/device:CPU:0", k->job, tasks[r]) < 0) {
            k->devices[r] = NULL;
            k->size = r;
            return false;
        }
        if (tasks[r] == k->own_task) k->rank = r;
    }
    k->size = n;
    return true;
}

static void *coll_create(const dg_node *n, const exec_env *env, dg_status *st) {
    coll_kernel *k = calloc(1, sizeof *k);
    if (!k) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "collective: out of memory");
        return NULL;
    }
    pthread_mutex_init(&k->busy, NULL);
    k->is_broadcast = strcmp(n->op->name, "CollectiveBroadcast") == 0;
    const char *job = dg_node_attr_string(n, "group_job");
    int64_t size = 1, timeout = COLL_DEFAULT_TIMEOUT_MS;
    dg_node_attr_int(n, "group_size", &size);
    dg_node_attr_int(n, "instance_key", &k->instance);
    dg_node_attr_int(n, "timeout_ms", &timeout);
    const char *final_op = dg_node_attr_string(n, "final_op");
    const char *hint = dg_node_attr_string(n, "communication_hint");
    k->mean = final_op && strcmp(final_op, "Div") == 0;
    const char *wire = dg_node_attr_string(n, "wire_dtype");
    k->wire16 = !k->is_broadcast && wire && strcmp(wire, "bfloat16") == 0;
    k->algorithm = hint && strcmp(hint, "ring") == 0     ? ALG_RING
                   : hint && strcmp(hint, "direct") == 0 ? ALG_DIRECT
                                                         : ALG_AUTO;
    k->elastic = size == 0;
    k->size = k->elastic ? 0 : (int)size;
    k->epoch = -1;
    k->timeout_ms = timeout;
    k->chunk_bytes = env_bytes("DG_COLLECTIVE_CHUNK_BYTES", COLL_CHUNK_BYTES_DEFAULT, 4096);
    k->direct_bytes = env_bytes("DG_COLLECTIVE_DIRECT_BYTES", COLL_DIRECT_BYTES_DEFAULT, 0);
    const char *dev = n->assigned_device && *n->assigned_device ? n->assigned_device : env->device;
    dg_device_name dn;
    if (!(k->job = strdup(job ? job : ""))) goto oom;
    if (k->size > 1 || k->elastic) {
        if (!dg_device_name_parse(dev ? dev : "", &dn, st)) goto fail;
        if (k->elastic && (!dn.has_job || !job || strcmp(dn.job, job) != 0 || !dn.has_task)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "runs on \"%s\", which is not a task of the elastic group's job %s",
                           dev ? dev : "", job ? job : "");
            goto fail;
        }
        if (!k->elastic && (!dn.has_job || !job || strcmp(dn.job, job) != 0 || !dn.has_task || dn.task >= k->size)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "runs on \"%s\", which is not one of the group's tasks /job:%s/task:0..%d",
                           dev ? dev : "", job ? job : "", k->size - 1);
            goto fail;
        }
        k->own_task = dn.task;
        k->rank = dn.task;
    }
    if (!k->elastic) {
        int *tasks = malloc((size_t)(k->size > 0 ? k->size : 1) * sizeof *tasks);
        if (!tasks) goto oom;
        for (int r = 0; r < k->size; r++) tasks[r] = r;
        bool made = set_members(k, tasks, k->size);
        free(tasks);
        if (!made) goto oom;
    }
    char name[64];
    snprintf(name, sizeof name, "%s/%" PRId64, n->op->name, k->instance);
    k->counter = env->rm ? exec_resources_object(env->rm, "collective", name, counter_create, NULL,
                                                 counter_destroy, st)
                         : NULL;
    if (!k->counter) {
        if (dg_status_ok(st)) dg_status_set(st, DG_INTERNAL, "collective: no resource manager");
        goto fail;
    }
    if (!(k->groups = exec_coll_groups_of(env->rm, st))) goto fail;
    return k;
oom:
    dg_status_set(st, DG_RESOURCE_EXHAUSTED, "collective: out of memory");
fail:
    coll_destroy(k);
    return NULL;
}

// ---- typed arithmetic over the packed layout ----
// The packed buffer holds float64 values in [0, f64_end) and float32 values after. Every
// range handed to these starts on an 8-byte boundary.
CPU_CLONES static void add_f64(double *restrict o, const double *restrict a, const double *restrict b,
                               size_t n, double div) {
    if (div == 1)
        for (size_t i = 0; i < n; i++) o[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) o[i] = (a[i] + b[i]) / div;
}

CPU_CLONES static void add_f32(float *restrict o, const float *restrict a, const float *restrict b,
                               size_t n, float div) {
    if (div == 1)
        for (size_t i = 0; i < n; i++) o[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) o[i] = (a[i] + b[i]) / div;
}

CPU_CLONES static void acc_f64(double *restrict o, const double *restrict b, size_t n, double div) {
    if (div == 1)
        for (size_t i = 0; i < n; i++) o[i] += b[i];
    else
        for (size_t i = 0; i < n; i++) o[i] = (o[i] + b[i]) / div;
}

CPU_CLONES static void acc_f32(float *restrict o, const float *restrict b, size_t n, float div) {
    if (div == 1)
        for (size_t i = 0; i < n; i++) o[i] += b[i];
    else
        for (size_t i = 0; i < n; i++) o[i] = (o[i] + b[i]) / div;
}

// out[off, off+len) = a + b (a NULL: out + b), divided by div, where out, a and b point at
// byte off of their buffers.
static void combine(size_t f64_end, size_t off, size_t len, char *out, const char *a, const char *b,
                    int div) {
    size_t n64 = off < f64_end ? (f64_end - off < len ? f64_end - off : len) : 0;
    if (n64) {
        if (a) add_f64((double *)out, (const double *)a, (const double *)b, n64 / 8, div);
        else acc_f64((double *)out, (const double *)b, n64 / 8, div);
    }
    size_t n32 = len - n64;
    if (n32) {
        if (a) add_f32((float *)(out + n64), (const float *)(a + n64), (const float *)(b + n64), n32 / 4, (float)div);
        else acc_f32((float *)(out + n64), (const float *)(b + n64), n32 / 4, (float)div);
    }
}

// ---- bfloat16 on the wire (wire_dtype "bfloat16"; every value float32) ----
// What travels is each float32 rounded to bfloat16 (to nearest, ties to even); what arrives is
// widened and summed in float32. The ranks agree bit for bit as without it: the ring's owner of
// a segment keeps its final value as it sends it (a bfloat16 value), and the direct exchange
// sums the same widened values, this rank's own rounded alike, in rank order.
// o = (a + widened b) / div, a NULL: o += widened b.
CPU_CLONES static void add_wire16(float *restrict o, const float *restrict a, const uint16_t *restrict b, size_t n,
                                  float div) {
    for (size_t i = 0; i < n; i++) o[i] = ((a ? a[i] : o[i]) + tensor_bf16_to_f32(b[i])) / div;
}

// Rounds p to the values bfloat16 holds.
static void round16(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = tensor_bf16_to_f32(tensor_f32_to_bf16(p[i]));
}

// ---- one execution ----
struct view_tracker;

typedef struct coll_run {
    const coll_kernel *k;
    exec_rendezvous *rv;
    int64_t step_id, execution;
    pthread_mutex_t mu;
    pthread_cond_t cv;      // on CLOCK_MONOTONIC
    dg_tensor *got;         // the value the posted receive delivered
    bool has_result;        // the posted receive's callback ran
    int outstanding;        // posted receives whose callback has not run (0 or 1)
    dg_status err;          // the posted receive's error
    dg_status *st;          // the kernel's status
    struct view_tracker *views;   // one reference held
    int64_t lost_events;    // members of the execution lost so far (exec_coll_task_lost), under mu
} coll_run;

// A member of the execution was lost: a receive waiting for it looks (exec_coll_watch's
// callback, under the registry's lock: it only wakes the waiter).
static void on_member_lost(void *arg) {
    coll_run *r = arg;
    pthread_mutex_lock(&r->mu);
    r->lost_events++;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static const char *op_word(const coll_kernel *k) { return k->is_broadcast ? "broadcast" : "all-reduce"; }

// The task part of a device name ("/job:worker/replica:0/task:1"), for messages.
static int task_len(const char *dev) {
    const char *d = strstr(dev, "/device:");
    return d ? (int)(d - dev) : (int)strlen(dev);
}

static void on_recv(void *arg, int unused, dg_tensor *t, const dg_status *st) {
    (void)unused;
    coll_run *r = arg;
    pthread_mutex_lock(&r->mu);
    if (t) r->got = t;
    else dg_status_copy(&r->err, st);
    r->has_result = true;
    r->outstanding--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static void make_key(char *buf, size_t cap, const coll_run *r, int from, int to, const char *tag) {
    snprintf(buf, cap, "%s;0000000000000001;%s;coll:%s;0:0", r->k->devices[from], r->k->devices[to], tag);
}

// Counts the views an execution has sent that the transport still holds. It outlives the
// execution when a view does (a peer that stopped reading): the last holder frees it.
typedef struct view_tracker {
    pthread_mutex_t mu;
    pthread_cond_t cv;      // on CLOCK_MONOTONIC
    int in_flight;
    int refs;               // the execution, plus one per view in flight
} view_tracker;

static void tracker_unref(view_tracker *tr) {
    pthread_mutex_lock(&tr->mu);
    bool last = --tr->refs == 0;
    pthread_mutex_unlock(&tr->mu);
    if (!last) return;
    pthread_mutex_destroy(&tr->mu);
    pthread_cond_destroy(&tr->cv);
    free(tr);
}

typedef struct view_ref {
    dg_tensor *base;
    view_tracker *tr;
} view_ref;

// Runs when the transport lets go of a view (on its I/O thread, or here on failure).
static void view_released(void *data, size_t n_bytes, void *arg) {
    (void)data;
    (void)n_bytes;
    view_ref *v = arg;
    dg_tensor_unref(v->base);
    pthread_mutex_lock(&v->tr->mu);
    v->tr->in_flight--;
    pthread_cond_broadcast(&v->tr->cv);
    pthread_mutex_unlock(&v->tr->mu);
    tracker_unref(v->tr);
    free(v);
}

// Sends data[0, len) inside base as a view (no copy) to rank `to` under tag. The value
// leaves at the next flush; the view holds a reference to base until the transport is done.
static bool send_view(coll_run *r, dg_tensor *base, const char *data, size_t len, int to, const char *tag) {
    char key[512];
    make_key(key, sizeof key, r, r->k->rank, to, tag);
    view_ref *ref = malloc(sizeof *ref);
    if (!ref) {
        dg_status_set(r->st, DG_RESOURCE_EXHAUSTED, "collective: out of memory");
        return false;
    }
    ref->base = dg_tensor_ref(base);
    ref->tr = r->views;
    pthread_mutex_lock(&r->views->mu);
    r->views->in_flight++;
    r->views->refs++;
    pthread_mutex_unlock(&r->views->mu);
    dg_tensor *v = dg_tensor_wrap(DG_UINT8, dg_shape1((int64_t)len), (void *)data, len, view_released, ref, r->st);
    if (!v) {
        view_released(NULL, 0, ref);
        return false;
    }
    bool ok = exec_rendezvous_send(r->rv, r->step_id, key, v, r->st);
    dg_tensor_unref(v);
    if (!ok)
        dg_status_prepend(r->st, "%s instance %" PRId64 " (execution %" PRId64 "): sending to %.*s",
                          op_word(r->k), r->k->instance, r->execution, task_len(r->k->devices[to]),
                          r->k->devices[to]);
    return ok;
}

// Passes a received value on unchanged (as a view, so the execution waits for it too).
static bool send_tensor(coll_run *r, dg_tensor *t, int to, const char *tag) {
    return send_view(r, t, t->data, t->nbytes, to, tag);
}

// Sends the float32 values data[0, len) (bytes) as bfloat16: len / 2 bytes.
static bool send_wire16(coll_run *r, const char *data, size_t len, int to, const char *tag) {
    dg_tensor *t = dg_tensor_new(DG_UINT8, dg_shape1((int64_t)(len / 2)), r->st);
    if (!t) return false;
    cpu_f32_to_f16s(DG_BFLOAT16, (const float *)data, t->data, (int64_t)(len / 4));
    bool ok = send_tensor(r, t, to, tag);
    dg_tensor_unref(t);
    return ok;
}

// Fails the posted receive (if its callback has not run) and waits until no callback can
// touch r any more. The step stays aborted in the rendezvous, so values peers send for it
// later are dropped instead of kept.
static void cancel_receive(coll_run *r, const dg_status *why) {
    exec_rendezvous_abort(r->rv, r->step_id, why);
    pthread_mutex_lock(&r->mu);
    // A delivery that took the entry before the abort finishes its callback soon.
    while (r->outstanding > 0) pthread_cond_wait(&r->cv, &r->mu);
    dg_tensor_free(&r->got);
    pthread_mutex_unlock(&r->mu);
}

// Now plus ms on CLOCK_MONOTONIC, for pthread_cond_timedwait.
static struct timespec timeout_deadline(int64_t ms) {
    struct timespec d;
    clock_gettime(CLOCK_MONOTONIC, &d);
    d.tv_sec += ms / 1000;
    d.tv_nsec += (ms % 1000) * 1000000;
    if (d.tv_nsec >= 1000000000) {
        d.tv_sec++;
        d.tv_nsec -= 1000000000;
    }
    return d;
}

// Receives the value rank `from` sent under tag, waiting at most timeout_ms for it. The
// value must hold exactly len bytes. Returns: new reference, NULL with r->st set.
static dg_tensor *recv_from(coll_run *r, int from, const char *tag, size_t len) {
    const coll_kernel *k = r->k;
    char key[512];
    make_key(key, sizeof key, r, from, k->rank, tag);
    pthread_mutex_lock(&r->mu);
    r->has_result = false;
    r->outstanding++;
    pthread_mutex_unlock(&r->mu);
    exec_rendezvous_recv_async(r->rv, r->step_id, key, on_recv, r, 0);
    struct timespec deadline = timeout_deadline(k->timeout_ms);
    // A value already here is taken even from a member lost since (it finished and left); one
    // not here from a lost member never comes: that ends the wait at once.
    dg_status lost = DG_STATUS_INIT;
    bool from_lost = false;
    pthread_mutex_lock(&r->mu);
    int rc = 0;
    int64_t seen = -1;
    while (!r->has_result && rc != ETIMEDOUT) {
        if (r->lost_events != seen) {
            seen = r->lost_events;
            pthread_mutex_unlock(&r->mu);
            status_impl_clear(&lost);
            from_lost = !exec_coll_none_lost(k->groups, k->job, &k->tasks[from], 1, &lost);
            pthread_mutex_lock(&r->mu);
            if (from_lost) break;
            continue;
        }
        rc = pthread_cond_timedwait(&r->cv, &r->mu, &deadline);
    }
    bool arrived = r->has_result;
    dg_tensor *t = r->got;
    r->got = NULL;
    pthread_mutex_unlock(&r->mu);
    int tl = task_len(k->devices[from]);
    if (!arrived && from_lost) {
        dg_status_setf(r->st, DG_UNAVAILABLE, "%s instance %" PRId64 " (execution %" PRId64 "): %s", op_word(k),
                       k->instance, r->execution, dg_status_message(&lost));
        status_impl_clear(&lost);
        cancel_receive(r, r->st);
        return NULL;
    }
    status_impl_clear(&lost);
    if (!arrived) {
        dg_status_setf(r->st, DG_DEADLINE_EXCEEDED,
                       "%s instance %" PRId64 " (execution %" PRId64 "): no data from %.*s within %" PRId64 " ms",
                       op_word(k), k->instance, r->execution, tl, k->devices[from], k->timeout_ms);
        cancel_receive(r, r->st);
        return NULL;
    }
    if (!t) {
        dg_status_setf(r->st, dg_status_code(&r->err) != DG_OK ? dg_status_code(&r->err) : DG_INTERNAL,
                       "%s instance %" PRId64 " (execution %" PRId64 "): waiting for %.*s: %s", op_word(k),
                       k->instance, r->execution, tl, k->devices[from], dg_status_message(&r->err));
        return NULL;
    }
    if (t->nbytes != len) {
        dg_status_setf(r->st, DG_INVALID_ARGUMENT,
                       "%s instance %" PRId64 " (execution %" PRId64 "): %.*s sent %zu bytes for \"%s\", "
                       "expected %zu (do all ranks give the same shapes?)",
                       op_word(k), k->instance, r->execution, tl, k->devices[from], t->nbytes, tag, len);
        dg_tensor_unref(t);
        return NULL;
    }
    return t;
}

// ---- ring all-reduce ----
// Segment j of n over a buffer of total bytes, cut on 8-byte boundaries.
static void segment(size_t total, int n, int j, size_t *off, size_t *len) {
    size_t units = (total + 7) / 8;
    size_t a = units * (size_t)j / (size_t)n * 8, b = units * (size_t)(j + 1) / (size_t)n * 8;
    if (a > total) a = total;
    if (b > total) b = total;
    *off = a;
    *len = b - a;
}

static size_t n_chunks(size_t len, size_t chunk) { return (len + chunk - 1) / chunk; }

static int mod(int a, int n) { return ((a % n) + n) % n; }

// Phases 0..n-2 reduce-scatter, n-1..2n-3 all-gather. In phase p a rank sends segment
// send_seg(p) to its right neighbour and receives segment send_seg(p) - 1 from its left.
static int send_seg(int r, int n, int p) { return p < n - 1 ? mod(r - p, n) : mod(r + 1 - (p - (n - 1)), n); }

static bool ring(coll_run *r, dg_tensor *in_base, const char *in, dg_tensor *out_base, char *out,
                 size_t total, size_t f64_end) {
    const coll_kernel *k = r->k;
    int n = k->size, me = k->rank, right = mod(me + 1, n), left = mod(me - 1, n);
    size_t chunk = k->chunk_bytes;
    char tag[64];
    size_t off, len;
    bool w16 = k->wire16;   // values travel as bfloat16: half the bytes of float32
    // Phase 0 sends this rank's own segment of the input as it is.
    segment(total, n, send_seg(me, n, 0), &off, &len);
    for (size_t c = 0; c < n_chunks(len, chunk); c++) {
        size_t a = off + c * chunk, l = len - c * chunk < chunk ? len - c * chunk : chunk;
        snprintf(tag, sizeof tag, "r0.%zu", c);
        if (!(w16 ? send_wire16(r, in + a, l, right, tag) : send_view(r, in_base, in + a, l, right, tag))) return false;
    }
    exec_rendezvous_flush(r->rv, r->step_id);
    int last = 2 * n - 3;
    for (int p = 0; p <= last; p++) {
        segment(total, n, mod(send_seg(me, n, p) - 1, n), &off, &len);
        for (size_t c = 0; c < n_chunks(len, chunk); c++) {
            size_t a = off + c * chunk, l = len - c * chunk < chunk ? len - c * chunk : chunk;
            snprintf(tag, sizeof tag, "r%d.%zu", p, c);
            dg_tensor *t = recv_from(r, left, tag, w16 ? l / 2 : l);
            if (!t) return false;
            bool ok = true;
            snprintf(tag, sizeof tag, "r%d.%zu", p + 1, c);
            if (p < n - 1 && w16) {
                // The same in float32 from the widened sum so far; the owner keeps its final value
                // as the others will receive it.
                add_wire16((float *)(out + a), (const float *)(in + a), t->data, l / 4,
                           p == n - 2 && k->mean ? (float)n : 1.0f);
                if (p == n - 2) round16((float *)(out + a), l / 4);
                if (p < last) ok = send_wire16(r, out + a, l, right, tag);
            } else if (p < n - 1) {
                // Reduce-scatter: the sum so far plus this rank's input; the owner (phase n-2)
                // also applies the final op before anyone sees the value.
                combine(f64_end, a, l, out + a, in + a, t->data, p == n - 2 && k->mean ? n : 1);
                if (p < last) ok = send_view(r, out_base, out + a, l, right, tag);
            } else if (w16) {
                cpu_f16s_to_f32(DG_BFLOAT16, t->data, (float *)(out + a), (int64_t)(l / 4));
                if (p < last) ok = send_tensor(r, t, right, tag);
            } else {
                // All-gather: the owner's final value, copied and passed on unchanged.
                memcpy(out + a, t->data, l);
                if (p < last) ok = send_tensor(r, t, right, tag);
            }
            dg_tensor_unref(t);
            if (!ok) return false;
            exec_rendezvous_flush(r->rv, r->step_id);
        }
    }
    return true;
}

// ---- direct exchange: every rank sends everything to every other and sums in rank order ----
// Every rank's value is asked for at once, so that a member lost before sending fails the
// execution as soon as that is known, whichever value this rank would have waited for first
// (a live member may have given up on this execution: it failed where this rank did not).
typedef struct direct_slot {
    coll_run *r;
    dg_tensor *got;
    bool done;
    dg_status err;
} direct_slot;

static void on_recv_slot(void *arg, int unused, dg_tensor *t, const dg_status *st) {
    (void)unused;
    direct_slot *d = arg;
    coll_run *r = d->r;
    pthread_mutex_lock(&r->mu);
    if (t) d->got = t;
    else dg_status_copy(&d->err, st);
    d->done = true;
    r->outstanding--;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

// The values of every other rank (got[from], new references), each exactly len bytes; false
// with r->st set (DEADLINE_EXCEEDED, a lost member UNAVAILABLE, or a receive's error).
static bool recv_all(coll_run *r, dg_tensor **got, size_t len) {
    const coll_kernel *k = r->k;
    int n = k->size;
    direct_slot *slots = calloc((size_t)n, sizeof *slots);
    bool *waiting = calloc((size_t)n, sizeof *waiting);
    if (!slots || !waiting) {
        free(slots);
        free(waiting);
        dg_status_set(r->st, DG_RESOURCE_EXHAUSTED, "all-reduce: out of memory");
        return false;
    }
    for (int from = 0; from < n; from++) {
        slots[from].r = r;
        slots[from].done = from == k->rank;
    }
    pthread_mutex_lock(&r->mu);
    r->outstanding += n - 1;
    pthread_mutex_unlock(&r->mu);
    for (int from = 0; from < n; from++) {
        if (from == k->rank) continue;
        char key[512];
        make_key(key, sizeof key, r, from, k->rank, "d");
        exec_rendezvous_recv_async(r->rv, r->step_id, key, on_recv_slot, &slots[from], 0);
    }
    struct timespec deadline = timeout_deadline(k->timeout_ms);
    dg_status lost = DG_STATUS_INIT;
    int lost_from = -1, missing = -1, rc = 0;
    int64_t seen = -1;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        missing = -1;
        for (int from = 0; from < n && missing < 0; from++)
            if (!slots[from].done) missing = from;
        if (missing < 0 || rc == ETIMEDOUT) break;
        if (r->lost_events != seen) {
            // A member whose value has not come and who is lost: it never will.
            seen = r->lost_events;
            for (int from = 0; from < n; from++) waiting[from] = !slots[from].done;
            pthread_mutex_unlock(&r->mu);
            for (int from = 0; from < n && lost_from < 0; from++)
                if (waiting[from] && !exec_coll_none_lost(k->groups, k->job, &k->tasks[from], 1, &lost)) lost_from = from;
            pthread_mutex_lock(&r->mu);
            if (lost_from >= 0 && !slots[lost_from].done) break;
            if (lost_from >= 0) {   // it came meanwhile
                lost_from = -1;
                status_impl_clear(&lost);
            }
            continue;
        }
        rc = pthread_cond_timedwait(&r->cv, &r->mu, &deadline);
    }
    pthread_mutex_unlock(&r->mu);
    bool ok = missing < 0;
    if (!ok) {
        if (lost_from >= 0)
            dg_status_setf(r->st, DG_UNAVAILABLE, "all-reduce instance %" PRId64 " (execution %" PRId64 "): %s",
                           k->instance, r->execution, dg_status_message(&lost));
        else
            dg_status_setf(r->st, DG_DEADLINE_EXCEEDED,
                           "all-reduce instance %" PRId64 " (execution %" PRId64 "): no data from %.*s within %" PRId64 " ms",
                           k->instance, r->execution, task_len(k->devices[missing]), k->devices[missing], k->timeout_ms);
        // Ends the receives still posted, and waits until no callback can touch the slots.
        exec_rendezvous_abort(r->rv, r->step_id, r->st);
        pthread_mutex_lock(&r->mu);
        while (r->outstanding > 0) pthread_cond_wait(&r->cv, &r->mu);
        pthread_mutex_unlock(&r->mu);
    }
    status_impl_clear(&lost);
    for (int from = 0; from < n; from++) {
        if (from == k->rank) continue;
        direct_slot *d = &slots[from];
        if (ok && !d->got) {
            dg_status_setf(r->st, dg_status_code(&d->err) != DG_OK ? dg_status_code(&d->err) : DG_INTERNAL,
                           "all-reduce instance %" PRId64 " (execution %" PRId64 "): waiting for %.*s: %s", k->instance,
                           r->execution, task_len(k->devices[from]), k->devices[from], dg_status_message(&d->err));
            ok = false;
        } else if (ok && d->got->nbytes != len) {
            dg_status_setf(r->st, DG_INVALID_ARGUMENT,
                           "all-reduce instance %" PRId64 " (execution %" PRId64 "): %.*s sent %zu bytes for \"d\", "
                           "expected %zu (do all ranks give the same shapes?)",
                           k->instance, r->execution, task_len(k->devices[from]), k->devices[from], d->got->nbytes, len);
            ok = false;
        }
        if (ok) got[from] = d->got;
        else dg_tensor_unref(d->got);
        status_impl_clear(&d->err);
    }
    if (!ok)
        for (int from = 0; from < n; from++) {
            if (from != k->rank && got[from]) {
                dg_tensor_unref(got[from]);
                got[from] = NULL;
            }
        }
    free(slots);
    free(waiting);
    return ok;
}

static bool direct(coll_run *r, dg_tensor *in_base, const char *in, char *out, size_t total,
                   size_t f64_end) {
    const coll_kernel *k = r->k;
    int n = k->size;
    for (int to = 0; to < n; to++)
        if (to != k->rank &&
            !(k->wire16 ? send_wire16(r, in, total, to, "d") : send_view(r, in_base, in, total, to, "d")))
            return false;
    exec_rendezvous_flush(r->rv, r->step_id);
    dg_tensor **got = calloc((size_t)(n > 0 ? n : 1), sizeof *got);
    if (!got) {
        dg_status_set(r->st, DG_RESOURCE_EXHAUSTED, "all-reduce: out of memory");
        return false;
    }
    bool ok = recv_all(r, got, k->wire16 ? total / 2 : total);
    if (ok && k->wire16) {
        // Every rank's value as the others receive it, this rank's own rounded alike, summed in
        // float32 in rank order.
        float *mine = malloc(total ? total : 1);
        if (!mine) abort();
        memcpy(mine, in, total);
        round16(mine, total / 4);
        for (int j = 0; j < n; j++) {
            float *o = (float *)out;
            float div = j == n - 1 && k->mean ? (float)n : 1.0f;
            if (j == 0 && k->rank == 0) memcpy(o, mine, total);
            else if (j == 0) cpu_f16s_to_f32(DG_BFLOAT16, got[0]->data, o, (int64_t)(total / 4));
            else if (j == k->rank) acc_f32(o, mine, total / 4, div);
            else add_wire16(o, NULL, got[j]->data, total / 4, div);
        }
        free(mine);
    } else if (ok) {
        // ((x0 + x1) + x2) + ...: the same order, so the same bits, on every rank.
        const char *x0 = k->rank == 0 ? in : got[0]->data;
        const char *x1 = k->rank == 1 ? in : got[1]->data;
        combine(f64_end, 0, total, out, x0, x1, n == 2 && k->mean ? n : 1);
        for (int j = 2; j < n; j++)
            combine(f64_end, 0, total, out, NULL, k->rank == j ? in : got[j]->data,
                    j == n - 1 && k->mean ? n : 1);
    }
    for (int j = 0; j < n; j++) dg_tensor_unref(got[j]);
    free(got);
    return ok;
}

// ---- broadcast: rank 0 sends its buffer, in chunks, to every other rank ----
static bool broadcast(coll_run *r, dg_tensor *base, char *buf, size_t total) {
    const coll_kernel *k = r->k;
    size_t chunk = k->chunk_bytes;
    char tag[64];
    for (size_t c = 0; c < n_chunks(total, chunk); c++) {
        size_t a = c * chunk, l = total - a < chunk ? total - a : chunk;
        snprintf(tag, sizeof tag, "b%zu", c);
        if (k->rank == 0) {
            for (int to = 1; to < k->size; to++)
                if (!send_view(r, base, buf + a, l, to, tag)) return false;
            exec_rendezvous_flush(r->rv, r->step_id);
        } else {
            dg_tensor *t = recv_from(r, 0, tag, l);
            if (!t) return false;
            memcpy(buf + a, t->data, l);
            dg_tensor_unref(t);
        }
    }
    return true;
}

// Waits (at most timeout_ms) until the transport has let go of every view sent, so the
// output buffer is free for the next step (and no buffer changes under a send in flight).
// The peers have the values by then or will soon: only the last few pieces can be in flight.
static void wait_for_views(coll_run *r) {
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += r->k->timeout_ms / 1000 + 1;
    pthread_mutex_lock(&r->views->mu);
    int rc = 0;
    while (r->views->in_flight > 0 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&r->views->cv, &r->views->mu, &deadline);
    pthread_mutex_unlock(&r->views->mu);
}

// A buffer of `bytes` bytes for *slot: the one kept from the last execution when nobody
// else (a send still in flight) holds it. Returns: borrowed from *slot.
static dg_tensor *scratch(dg_tensor **slot, size_t bytes, dg_status *st) {
    if (*slot && (*slot)->nbytes == bytes && tensor_is_exclusive(*slot)) return *slot;
    dg_tensor_free(slot);
    *slot = dg_tensor_new(DG_UINT8, dg_shape1((int64_t)bytes), st);
    return *slot;
}

// When the step running a collective is aborted (a peer's partition failed, the master gave
// up), the collective's own step id is aborted too, so its wait ends at once with the cause
// instead of running out its timeout. Shared by the registration and the kernel.
typedef struct coll_cancel {
    atomic_int refs;
    exec_rendezvous *rv;
    int64_t coll_step_id;
} coll_cancel;

static void coll_cancel_unref(coll_cancel *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1) free(c);
}

static void on_step_abort(void *arg, const dg_status *why) {
    coll_cancel *c = arg;
    exec_rendezvous_abort(c->rv, c->coll_step_id, why);
    coll_cancel_unref(c);
}

// An elastic group: the members in force now, from the task's collective groups. This task
// must be one of them.
static bool elastic_members(coll_kernel *k, exec_ctx *ctx) {
    int64_t epoch = -1;
    int n = 0;
    int *tasks = malloc(EXEC_COLL_MAX_MEMBERS * sizeof *tasks);
    if (!tasks) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "collective: out of memory");
    if (!exec_coll_members(k->groups, k->job, &epoch, tasks, EXEC_COLL_MAX_MEMBERS, &n)) {
        free(tasks);
        return exec_fail(ctx, DG_FAILED_PRECONDITION,
                         "%s instance %" PRId64 ": the elastic group of job %s has no members yet on this task "
                         "(dg_server_set_collective_members)",
                         op_word(k), k->instance, k->job);
    }
    bool ok = true;
    if (epoch != k->epoch) {
        int r = -1;
        for (int i = 0; i < n; i++)
            if (tasks[i] == k->own_task) r = i;
        if (r < 0)
            ok = exec_fail(ctx, DG_FAILED_PRECONDITION,
                           "%s instance %" PRId64 ": /job:%s/task:%d is not a member of its group in epoch %" PRId64,
                           op_word(k), k->instance, k->job, k->own_task, epoch);
        else if (!set_members(k, tasks, n)) {
            k->epoch = -1;
            ok = exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "collective: out of memory");
        }
        else
            k->epoch = epoch;
    }
    free(tasks);
    return ok;
}

static bool coll_compute(void *state, exec_ctx *ctx) {
    coll_kernel *k = state;
    int n_in = ctx->n_inputs;
    // Packed layout: float64 inputs first, then float32, each input contiguous.
    size_t *pos = malloc((size_t)n_in * sizeof *pos);
    if (!pos) return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "collective: out of memory");
    size_t total = 0, f64_end = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < n_in; i++)
            if ((IN(i)->dtype == DG_FLOAT64) == (pass == 0)) {
                pos[i] = total;
                total += IN(i)->nbytes;
            }
        if (pass == 0) f64_end = total;
    }
    if (k->wire16 && f64_end > 0) {
        free(pos);
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "all-reduce instance %" PRId64 ": wire_dtype bfloat16 takes "
                         "float32 values only", k->instance);
    }
    pthread_mutex_lock(&k->busy);
    bool ok = true;
    dg_tensor *in_base, *out_base;
    const exec_step_options *o = exec_step_opts(ctx->step);
    if (k->elastic && !elastic_members(k, ctx)) {
        ok = false;
        goto out;
    }
    pthread_mutex_lock(&k->counter->mu);
    if (k->elastic && k->counter->epoch != k->epoch) {
        k->counter->epoch = k->epoch;
        k->counter->next = 0;
    }
    int64_t execution = k->counter->next++;
    pthread_mutex_unlock(&k->counter->mu);
    // An elastic group's executions are numbered within their epoch, which the step id
    // carries too: values of an epoch that ended never meet those of the next.
    int64_t wire_execution = k->elastic ? ((k->epoch & 0xFFF) << 20) | (execution & 0xFFFFF) : execution;
    if (k->size > 1 && total > 0 && !o->rendezvous) {
        ok = exec_fail(ctx, DG_FAILED_PRECONDITION,
                       "%s instance %" PRId64 " of %d tasks needs a rendezvous: run it in a session "
                       "whose target is its task's server", op_word(k), k->instance, k->size);
        goto out;
    }
    if (n_in == 1 && !k->is_broadcast) {
        // One input: sent from where it is, reduced straight into the output.
        in_base = IN(0);
        out_base = exec_alloc_output(ctx, 0, IN(0)->dtype, IN(0)->shape);
        if (!out_base) {
            ok = false;
            goto out;
        }
    } else {
        // A broadcast packs even one input, so what it sends is never a variable's buffer
        // that a later step could change while the transport still reads it.
        in_base = scratch(&k->pack_in, total, ctx->st);
        out_base = k->is_broadcast ? in_base : scratch(&k->pack_out, total, ctx->st);
        if (!in_base || !out_base) {
            ok = false;
            goto out;
        }
        for (int i = 0; i < n_in; i++) memcpy((char *)in_base->data + pos[i], IN(i)->data, IN(i)->nbytes);
    }
    coll_run run;
    memset(&run, 0, sizeof run);
    run.k = k;
    run.rv = o->rendezvous;
    run.step_id = coll_step_id(k->instance, wire_execution);
    run.execution = execution;
    run.st = ctx->st;
    pthread_mutex_init(&run.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run.cv, &ca);
    run.views = calloc(1, sizeof *run.views);
    if (!run.views) abort();
    run.views->refs = 1;
    pthread_mutex_init(&run.views->mu, NULL);
    pthread_cond_init(&run.views->cv, &ca);
    pthread_condattr_destroy(&ca);
    coll_cancel *cancel = NULL;
    int64_t cancel_token = 0;
    if (run.rv && k->size > 1 && total > 0) {
        cancel = malloc(sizeof *cancel);
        if (!cancel) abort();
        atomic_init(&cancel->refs, 2);
        cancel->rv = run.rv;
        cancel->coll_step_id = run.step_id;
        dg_status why = DG_STATUS_INIT;
        cancel_token = exec_rendezvous_on_cancel(run.rv, o->step_id, on_step_abort, cancel, &why);
        if (!cancel_token) {
            atomic_fetch_sub(&cancel->refs, 1);   // not registered
            ok = exec_fail(ctx, dg_status_code(&why) != DG_OK ? dg_status_code(&why) : DG_ABORTED, "%s: %s",
                           op_word(k), dg_status_message(&why));
        }
        status_impl_clear(&why);
    }
    // A member lost now or later ends a receive still waiting for it at once (recv_from).
    int64_t watch_token = 0;
    if (ok && run.rv && k->size > 1 && total > 0)
        watch_token = exec_coll_watch(k->groups, k->job, k->tasks, k->size, on_member_lost, &run);
    if (!ok) {
        // The step was aborted before the collective began.
    } else if (k->is_broadcast) {
        if (k->size > 1 && total > 0) ok = broadcast(&run, in_base, in_base->data, total);
    } else if (k->size == 1 || total == 0) {
        if (out_base->data != in_base->data) memcpy(out_base->data, in_base->data, total);
    } else {
        // Direct when what each rank sends (its buffer to each peer) is small: one round trip
        // beats 2(n-1) of the ring's.
        bool use_direct = k->algorithm == ALG_DIRECT ||
                          (k->algorithm == ALG_AUTO && total * (size_t)(k->size - 1) <= k->direct_bytes);
        ok = use_direct ? direct(&run, in_base, in_base->data, out_base->data, total, f64_end)
                        : ring(&run, in_base, in_base->data, out_base, out_base->data, total, f64_end);
    }
    if (ok) wait_for_views(&run);
    if (watch_token) exec_coll_unwatch(k->groups, watch_token);
    tracker_unref(run.views);
    if (cancel) {
        if (cancel_token && exec_rendezvous_forget_cancel(run.rv, cancel_token)) coll_cancel_unref(cancel);
        coll_cancel_unref(cancel);
    }
    if (!ok && run.rv) {
        // Drop what peers sent for this execution, and whatever they send for it later.
        exec_rendezvous_end_step(run.rv, run.step_id);
        exec_rendezvous_abort(run.rv, run.step_id, ctx->st);
        // The other members may wait for this one, some of them for nobody they know is lost
        // (in a ring only the neighbours of a lost member see it go): their receives of this
        // execution fail now, with this failure, instead of at their timeout.
        if (k->size > 1 && total > 0)
            for (int m = 0; m < k->size; m++)
                if (m != k->rank) exec_rendezvous_abort_remote(run.rv, run.step_id, k->devices[m], ctx->st);
    }
    pthread_mutex_destroy(&run.mu);
    pthread_cond_destroy(&run.cv);
    status_impl_clear(&run.err);
    if (ok && !(n_in == 1 && !k->is_broadcast)) {
        for (int i = 0; i < n_in && ok; i++) {
            dg_tensor *t = exec_alloc_output(ctx, i, IN(i)->dtype, IN(i)->shape);
            if (t) memcpy(t->data, (char *)out_base->data + pos[i], t->nbytes);
            else ok = false;
        }
    }
out:
    pthread_mutex_unlock(&k->busy);
    free(pos);
    return ok;
}

static const exec_kernel_def collective_kernels[] = {
    {"CollectiveAllReduce", "CPU", DT_FLOATS, coll_create, coll_compute, coll_destroy, true, false, false, NULL, false},
    {"CollectiveBroadcast", "CPU", DT_NUMERIC, coll_create, coll_compute, coll_destroy, true, false, false, NULL, false},
};

void cpu_register_collective_kernels(void) {
    exec_register_kernels(collective_kernels, (int)(sizeof collective_kernels / sizeof collective_kernels[0]));
}
