/* Step traces (distgraph/trace.h, step_trace_impl.h): the tasks' notes put on one clock, the
 * halves of each transfer paired, and the Chrome trace-event file. */
#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/device_name.h"
#include "exec_kernel_registry_impl.h"
#include "status_impl.h"
#include "step_trace_impl.h"
#include "trace_blob_impl.h"
#include "wire_impl.h"

#define MAX_EVENTS 1000000   // in one blob

typedef rt_trace_task task_clock;

struct dg_step_trace {
    exec_trace *ev;        // before finish: times on this clock; after: from the origin
    int64_t origin_ns, step_ns;
    int64_t end_ns;        // when the step ended, if the master said (step_trace_set_end); else 0
    bool finished;
    task_clock *tasks;
    int n_tasks, cap_tasks;
};

dg_step_trace *step_trace_new(int64_t origin_ns) {
    dg_step_trace *tr = calloc(1, sizeof *tr);
    if (!tr) return NULL;
    if (!(tr->ev = exec_trace_new())) {
        free(tr);
        return NULL;
    }
    tr->origin_ns = origin_ns;
    return tr;
}

void dg_step_trace_free(dg_step_trace **tp) {
    if (!tp || !*tp) return;
    dg_step_trace *tr = *tp;
    exec_trace_free(&tr->ev);
    for (int i = 0; i < tr->n_tasks; i++) free(tr->tasks[i].name);
    free(tr->tasks);
    free(tr);
    *tp = NULL;
}

static void add_task(dg_step_trace *tr, const char *name, int64_t offset, int64_t unc) {
    for (int i = 0; i < tr->n_tasks; i++)
        if (strcmp(tr->tasks[i].name, name) == 0) return;
    if (!BASE_GROW(tr->tasks, tr->n_tasks, tr->cap_tasks, 1, "step trace tasks", NULL)) return;
    char *copy = strdup(name);
    if (!copy) return;
    tr->tasks[tr->n_tasks++] = (task_clock){copy, offset, unc};
}

void step_trace_add(dg_step_trace *tr, const dg_trace_event *e) { exec_trace_add(tr->ev, e); }

void step_trace_set_end(dg_step_trace *tr, int64_t end_ns) { tr->end_ns = end_ns; }

int64_t step_trace_end(const dg_step_trace *tr) { return tr->end_ns; }

int64_t step_trace_origin(const dg_step_trace *tr) { return tr->origin_ns; }

void step_trace_add_local(dg_step_trace *tr, const exec_trace *t, const char *task) {
    add_task(tr, task, 0, 0);
    const dg_trace_event *ev = exec_trace_events(t);
    for (int i = 0; i < exec_trace_num_events(t); i++) {
        dg_trace_event e = ev[i];
        if (!*e.task) e.task = task;
        exec_trace_add(tr->ev, &e);
    }
}

// ---- the blob (trace_blob_impl.h) ----

char *step_trace_encode(const dg_step_trace *tr, int64_t recv_ns, int64_t reply_ns, size_t *len) {
    return rt_trace_blob_encode(exec_trace_events(tr->ev), exec_trace_num_events(tr->ev),
                                tr->finished ? tr->origin_ns : 0, tr->tasks, tr->n_tasks, recv_ns, reply_ns, len);
}

// A string of at most RT_MAX_STRING bytes without NUL, copied into buf (cap RT_MAX_STRING + 1).
static bool get_s(const msgpack_object *o, char *buf) {
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > RT_MAX_STRING) return false;
    if (memchr(o->via.str.ptr, 0, o->via.str.size)) return false;
    memcpy(buf, o->via.str.ptr, o->via.str.size);
    buf[o->via.str.size] = 0;
    return true;
}

static bool kind_ok(int64_t k) {
    return (k >= DG_TRACE_OP && k <= DG_TRACE_QUEUED) || k == EXEC_TRACE_SENT || k == EXEC_TRACE_ARRIVED;
}

// Adds the events of ev (an array) moved by -offset; false names what is wrong in *bad.
static bool add_events(dg_step_trace *tr, const msgpack_object *ev, const char *task, int64_t offset,
                       const char **bad) {
    if (ev->type != MSGPACK_OBJECT_ARRAY || ev->via.array.size > MAX_EVENTS) {
        *bad = "\"ev\" is not an array of at most a million events";
        return false;
    }
    char *s[5];
    for (int k = 0; k < 5; k++)
        if (!(s[k] = malloc(RT_MAX_STRING + 1))) abort();
    bool ok = true;
    for (uint32_t i = 0; i < ev->via.array.size && ok; i++) {
        const msgpack_object *a = &ev->via.array.ptr[i];
        int64_t kind, start, end, bytes, thread;
        ok = a->type == MSGPACK_OBJECT_ARRAY && a->via.array.size == 10;
        if (ok) {
            const msgpack_object *f = a->via.array.ptr;
            ok = rt_msgpack_int(&f[0], &kind) && kind_ok(kind) && get_s(&f[1], s[0]) && get_s(&f[2], s[1]) &&
                 get_s(&f[3], s[2]) && get_s(&f[4], s[3]) && get_s(&f[5], s[4]) && rt_msgpack_int(&f[6], &start) &&
                 rt_msgpack_int(&f[7], &end) && end >= start && rt_msgpack_int(&f[8], &bytes) && bytes >= 0 &&
                 rt_msgpack_int(&f[9], &thread) && thread >= 0 && thread <= INT32_MAX;
        }
        if (!ok) {
            *bad = "an event is not [kind, name, op, task, device, peer, start, end, bytes, thread]";
            break;
        }
        dg_trace_event e = {(dg_trace_kind)kind, s[0], s[1], *s[2] ? s[2] : task, s[3], s[4],
                            start - offset, end - offset, (uint64_t)bytes, (int)thread};
        exec_trace_add(tr->ev, &e);
    }
    for (int k = 0; k < 5; k++) free(s[k]);
    return ok;
}

static bool add_tasks(dg_step_trace *tr, const msgpack_object *ts, int64_t offset, int64_t unc, const char **bad) {
    if (ts->type != MSGPACK_OBJECT_ARRAY || ts->via.array.size > 100000) {
        *bad = "\"tasks\" is not an array";
        return false;
    }
    char *name = malloc(RT_MAX_STRING + 1);
    if (!name) abort();
    bool ok = true;
    for (uint32_t i = 0; i < ts->via.array.size && ok; i++) {
        const msgpack_object *a = &ts->via.array.ptr[i];
        int64_t off, u;
        ok = a->type == MSGPACK_OBJECT_ARRAY && a->via.array.size == 3 && get_s(&a->via.array.ptr[0], name) &&
             rt_msgpack_int(&a->via.array.ptr[1], &off) && rt_msgpack_int(&a->via.array.ptr[2], &u) && u >= 0;
        if (ok) add_task(tr, name, off + offset, u + unc);
        else *bad = "a task is not [name, offset, uncertainty]";
    }
    free(name);
    return ok;
}

bool step_trace_add_remote(dg_step_trace *tr, const void *blob, size_t len, const char *task,
                           const char *master_task, const char *request, int64_t sent_ns,
                           int64_t answered_ns, dg_status *st) {
    if (!blob || len == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "step trace from %s: the answer has no notes", task);
        return false;
    }
    if (!rt_msgpack_prescan(blob, len, st)) {
        dg_status_prepend(st, "step trace from %s", task);
        return false;
    }
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    const char *bad = NULL;
    const msgpack_object *ev = NULL, *tasks = NULL;
    int64_t recv = 0, reply = 0;
    bool has_recv = false, has_reply = false;
    if (msgpack_unpack_next(&up, blob, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len ||
        up.data.type != MSGPACK_OBJECT_MAP) {
        bad = "not one msgpack map";
    } else {
        for (uint32_t i = 0; i < up.data.via.map.size && !bad; i++) {
            const msgpack_object *k = &up.data.via.map.ptr[i].key, *v = &up.data.via.map.ptr[i].val;
            if (rt_msgpack_key_is(k, "recv")) has_recv = rt_msgpack_int(v, &recv);
            else if (rt_msgpack_key_is(k, "reply")) has_reply = rt_msgpack_int(v, &reply);
            else if (rt_msgpack_key_is(k, "ev")) ev = v;
            else if (rt_msgpack_key_is(k, "tasks")) tasks = v;
        }
        if (!has_recv || !has_reply || reply < recv) bad = "\"recv\" and \"reply\" are not two times in order";
        else if (!ev) bad = "no \"ev\"";
    }
    if (!bad) {
        // NTP's estimate (trace.h): the task's clock minus ours.
        int64_t offset = ((recv - sent_ns) + (reply - answered_ns)) / 2;
        int64_t unc = ((answered_ns - sent_ns) - (reply - recv)) / 2;
        if (unc < 0) unc = 0;
        add_task(tr, master_task, 0, 0);   // this side: on this clock
        add_task(tr, task, offset, unc);
        if (add_events(tr, ev, task, offset, &bad) && tasks) add_tasks(tr, tasks, offset, unc, &bad);
        if (!bad) {
            char answer[64];
            snprintf(answer, sizeof answer, "%s answer", request);
            dg_trace_event to = {.kind = DG_TRACE_MESSAGE, .name = request, .task = task, .peer = master_task,
                                 .start_ns = sent_ns, .end_ns = recv - offset};
            dg_trace_event back = {.kind = DG_TRACE_MESSAGE, .name = answer, .task = master_task, .peer = task,
                                   .start_ns = reply - offset, .end_ns = answered_ns};
            if (to.end_ns < to.start_ns) to.end_ns = to.start_ns;
            if (back.start_ns > back.end_ns) back.start_ns = back.end_ns;
            exec_trace_add(tr->ev, &to);
            exec_trace_add(tr->ev, &back);
        }
    }
    msgpack_unpacked_destroy(&up);
    if (bad) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "step trace from %s: %s", task, bad);
        return false;
    }
    return true;
}

// ---- pairing transfers ----

// The n-th ';'-separated field of a rendezvous key (send_device;incarnation;recv_device;
// tensor;frame) into buf.
static void key_field(const char *key, int n, char *buf, size_t cap) {
    const char *p = key;
    for (int i = 0; i < n && p; i++) {
        p = strchr(p, ';');
        if (p) p++;
    }
    if (!p) {
        snprintf(buf, cap, "%s", n == 3 ? key : "");
        return;
    }
    const char *end = strchr(p, ';');
    snprintf(buf, cap, "%.*s", end ? (int)(end - p) : (int)strlen(p), p);
}

static void task_of(const char *device, char *buf, size_t cap) {
    const char *d = strstr(device, "/device:");
    snprintf(buf, cap, "%.*s", d ? (int)(d - device) : (int)strlen(device), device);
}

static int cmp_start(const void *a, const void *b) {
    const dg_trace_event *x = a, *y = b;
    return x->start_ns < y->start_ns ? -1 : x->start_ns > y->start_ns ? 1 : 0;
}

// The two halves of a transfer: the SENT event j for ARRIVED event i, or -1.
static int sent_half(const dg_trace_event *ev, int n, int i) {
    for (int j = 0; j < n; j++)
        if (ev[j].kind == EXEC_TRACE_SENT && strcmp(ev[j].name, ev[i].name) == 0) return j;
    return -1;
}

static bool is_reference(const dg_step_trace *tr, const char *task) {
    for (int i = 0; i < tr->n_tasks; i++)
        if (strcmp(tr->tasks[i].name, task) == 0) return tr->tasks[i].uncertainty_ns == 0;
    return false;
}

// Narrows the estimate of each task's clock offset with its transfers to and from the tasks
// on this clock: a value arrives after it was sent, so each transfer bounds the offset from
// one side, as the RUN_GRAPH request and answer do (trace.h). The offset moves to the middle
// of the narrowed range, and the task's events with it.
static void refine_offsets(dg_step_trace *tr) {
    dg_trace_event *ev = (dg_trace_event *)exec_trace_events(tr->ev);
    int n = exec_trace_num_events(tr->ev);
    for (int x = 0; x < tr->n_tasks; x++) {
        task_clock *tc = &tr->tasks[x];
        if (tc->uncertainty_ns == 0) continue;
        int64_t lo = -tc->uncertainty_ns, hi = tc->uncertainty_ns;   // the correction d
        for (int i = 0; i < n; i++) {
            if (ev[i].kind != EXEC_TRACE_ARRIVED) continue;
            int j = sent_half(ev, n, i);
            if (j < 0) continue;
            // x's times move by -d: sent on x: arrived >= sent - d; arrived on x: arrived - d >= sent.
            if (strcmp(ev[j].task, tc->name) == 0 && is_reference(tr, ev[i].task)) {
                int64_t b = ev[j].start_ns - ev[i].start_ns;
                if (b > lo) lo = b;
            } else if (strcmp(ev[i].task, tc->name) == 0 && is_reference(tr, ev[j].task)) {
                int64_t b = ev[i].start_ns - ev[j].start_ns;
                if (b < hi) hi = b;
            }
        }
        if (lo > hi) continue;   // contradictory (a clock that jumped): keep the estimate
        int64_t d = lo + (hi - lo) / 2;
        tc->offset_ns += d;
        tc->uncertainty_ns = (hi - lo) / 2;
        for (int i = 0; i < n; i++) {
            dg_trace_event *e = &ev[i];
            if (e->kind == DG_TRACE_MESSAGE) {
                // The request ends, and the answer starts, on x's clock.
                if (strcmp(e->task, tc->name) == 0) e->end_ns -= d;
                else if (strcmp(e->peer, tc->name) == 0) e->start_ns -= d;
                if (e->end_ns < e->start_ns) e->end_ns = e->start_ns;
            } else if (strcmp(e->task, tc->name) == 0) {
                e->start_ns -= d;
                e->end_ns -= d;
            }
        }
    }
}

void step_trace_finish(dg_step_trace *tr, int64_t end_ns) {
    refine_offsets(tr);
    const dg_trace_event *ev = exec_trace_events(tr->ev);
    int n = exec_trace_num_events(tr->ev);
    exec_trace *out = exec_trace_new();
    bool *used = calloc((size_t)n + 1, sizeof *used);
    if (!out || !used) abort();
    char tensor[512], sdev[256], rdev[256], stask[256], rtask[256];
    for (int i = 0; i < n; i++) {
        const dg_trace_event *a = &ev[i];
        if (a->kind != EXEC_TRACE_ARRIVED && a->kind != EXEC_TRACE_SENT) {
            dg_trace_event e = *a;
            e.start_ns -= tr->origin_ns;
            e.end_ns -= tr->origin_ns;
            exec_trace_add(out, &e);
            continue;
        }
        if (a->kind != EXEC_TRACE_ARRIVED) continue;
        const dg_trace_event *sent = NULL;
        for (int j = 0; j < n && !sent; j++)
            if (!used[j] && ev[j].kind == EXEC_TRACE_SENT && strcmp(ev[j].name, a->name) == 0) {
                used[j] = true;
                sent = &ev[j];
            }
        key_field(a->name, 0, sdev, sizeof sdev);
        key_field(a->name, 2, rdev, sizeof rdev);
        key_field(a->name, 3, tensor, sizeof tensor);
        task_of(sdev, stask, sizeof stask);
        int64_t start = sent ? sent->start_ns : a->start_ns;
        dg_trace_event e = {DG_TRACE_TRANSFER, tensor, "", a->task, rdev, stask,
                            (start < a->start_ns ? start : a->start_ns) - tr->origin_ns, a->start_ns - tr->origin_ns,
                            a->bytes, 0};
        exec_trace_add(out, &e);
    }
    // Sent values whose arrival nobody noted (the receiver was not traced): no time on the wire.
    for (int j = 0; j < n; j++) {
        if (used[j] || ev[j].kind != EXEC_TRACE_SENT) continue;
        key_field(ev[j].name, 2, rdev, sizeof rdev);
        key_field(ev[j].name, 3, tensor, sizeof tensor);
        task_of(rdev, rtask, sizeof rtask);
        dg_trace_event e = {DG_TRACE_TRANSFER, tensor, "", rtask, rdev, ev[j].task,
                            ev[j].start_ns - tr->origin_ns, ev[j].start_ns - tr->origin_ns, ev[j].bytes, 0};
        exec_trace_add(out, &e);
    }
    free(used);
    exec_trace_free(&tr->ev);
    tr->ev = out;
    qsort((dg_trace_event *)exec_trace_events(out), (size_t)exec_trace_num_events(out), sizeof(dg_trace_event),
          cmp_start);
    tr->step_ns = (tr->end_ns ? tr->end_ns : end_ns) - tr->origin_ns;
    tr->finished = true;
}

// ---- the public accessors ----

int64_t dg_step_trace_step_ns(const dg_step_trace *t) { return t ? t->step_ns : 0; }
int dg_step_trace_num_events(const dg_step_trace *t) { return t ? exec_trace_num_events(t->ev) : 0; }

const dg_trace_event *dg_step_trace_event(const dg_step_trace *t, int i) {
    if (!t || i < 0 || i >= exec_trace_num_events(t->ev)) return NULL;
    return &exec_trace_events(t->ev)[i];
}

int dg_step_trace_num_tasks(const dg_step_trace *t) { return t ? t->n_tasks : 0; }

const char *dg_step_trace_task(const dg_step_trace *t, int i, int64_t *offset_ns, int64_t *uncertainty_ns) {
    if (!t || i < 0 || i >= t->n_tasks) return NULL;
    if (offset_ns) *offset_ns = t->tasks[i].offset_ns;
    if (uncertainty_ns) *uncertainty_ns = t->tasks[i].uncertainty_ns;
    return t->tasks[i].name;
}

int64_t dg_step_trace_busy_ns(const dg_step_trace *t) {
    if (!t) return 0;
    // Events are sorted by start: sweep, merging overlaps, clipped to the step.
    const dg_trace_event *ev = exec_trace_events(t->ev);
    int64_t busy = 0, cur_s = 0, cur_e = -1;
    for (int i = 0; i < exec_trace_num_events(t->ev); i++) {
        if (ev[i].kind == DG_TRACE_WAIT) continue;
        int64_t s = ev[i].start_ns < 0 ? 0 : ev[i].start_ns;
        int64_t e = ev[i].end_ns > t->step_ns ? t->step_ns : ev[i].end_ns;
        if (e <= s) continue;
        if (s > cur_e) {
            if (cur_e > cur_s) busy += cur_e - cur_s;
            cur_s = s;
            cur_e = e;
        } else if (e > cur_e) {
            cur_e = e;
        }
    }
    if (cur_e > cur_s) busy += cur_e - cur_s;
    return busy;
}

// ---- Chrome trace-event JSON ----

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

// A lane: a thread track of one task. Events of one lane must not overlap (trace viewers
// draw one stack per thread), so each group of lanes (a device's thread, waits, transfers)
// takes a new lane when an event would overlap the last one.
typedef struct lane {
    int pid, tid;
    char group[300];
    int64_t last_end;
} lane;

typedef struct lanes {
    lane *l;
    int n, cap;
    int next_tid;
} lanes;

// rank orders the lanes of a task: ops, ready queues, waits, transfers, the master's.
static int lane_for(lanes *L, int pid, const char *group, int rank, int64_t start, int64_t end, FILE *f) {
    for (int i = 0; i < L->n; i++)
        if (L->l[i].pid == pid && strcmp(L->l[i].group, group) == 0 && L->l[i].last_end <= start) {
            L->l[i].last_end = end;
            return L->l[i].tid;
        }
    base_reserve((void **)&L->l, sizeof *L->l, L->n, &L->cap, 1);
    lane *x = &L->l[L->n++];
    x->pid = pid;
    x->tid = ++L->next_tid;
    snprintf(x->group, sizeof x->group, "%s", group);
    x->last_end = end;
    fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":", pid, x->tid);
    json_str(f, group);
    fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"thread_sort_index\",\"pid\":%d,\"tid\":%d,\"args\":{\"sort_index\":%d}}",
            pid, x->tid, rank * 100000 + x->tid);
    return x->tid;
}

static int pid_of(const dg_step_trace *t, const char *task) {
    for (int i = 0; i < t->n_tasks; i++)
        if (strcmp(t->tasks[i].name, task) == 0) return i + 1;
    return t->n_tasks + 1;   // a task that sent no notes (named by a transfer)
}

static const char *const kind_name[] = {"op", "wait", "transfer", "message", "master", "queued"};

static void short_device(const char *device, char *buf, size_t cap) {
    const char *d = strstr(device, "/device:");
    snprintf(buf, cap, "%s", d ? d + 8 : device);
}

bool dg_step_trace_write_chrome(const dg_step_trace *t, const char *path, dg_status *st) {
    if (!t || !path) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "step trace: the trace or the path is NULL");
        return false;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "step trace: cannot write %s: %s", path, strerror(errno));
        return false;
    }
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"step_us\":%.3f,\"busy_us\":%.3f,\"clocks\":\"",
            (double)t->step_ns / 1e3, (double)dg_step_trace_busy_ns(t) / 1e3);
    for (int i = 0; i < t->n_tasks; i++)
        fprintf(f, "%s%s offset %+.1f us +- %.1f us", i ? "; " : "", t->tasks[i].name,
                (double)t->tasks[i].offset_ns / 1e3, (double)t->tasks[i].uncertainty_ns / 1e3);
    fprintf(f, "\"},\n\"traceEvents\":[\n");
    fprintf(f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"(other tasks)\"}}",
            t->n_tasks + 1);
    for (int i = 0; i < t->n_tasks; i++) {
        fprintf(f, ",\n{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":", i + 1);
        json_str(f, t->tasks[i].name);
        fprintf(f, "}},\n{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":%d,\"tid\":0,"
                   "\"args\":{\"sort_index\":%d}}", i + 1, i + 1);
    }
    lanes L = {0};
    int flow = 0;
    const dg_trace_event *ev = exec_trace_events(t->ev);
    for (int i = 0; i < exec_trace_num_events(t->ev); i++) {
        const dg_trace_event *e = &ev[i];
        if ((int)e->kind < 0 || e->kind > DG_TRACE_QUEUED) continue;
        char group[300], dev[200];
        short_device(e->device, dev, sizeof dev);
        static const int rank[] = {[DG_TRACE_OP] = 0, [DG_TRACE_QUEUED] = 1, [DG_TRACE_WAIT] = 2,
                                   [DG_TRACE_TRANSFER] = 3, [DG_TRACE_MESSAGE] = 5, [DG_TRACE_MASTER] = 6};
        switch (e->kind) {
        case DG_TRACE_OP: snprintf(group, sizeof group, "%s thread %d", dev, e->thread); break;
        case DG_TRACE_WAIT: snprintf(group, sizeof group, "%s waits", dev); break;
        case DG_TRACE_TRANSFER: snprintf(group, sizeof group, "transfers in"); break;
        case DG_TRACE_MESSAGE: snprintf(group, sizeof group, "master messages"); break;
        case DG_TRACE_QUEUED: snprintf(group, sizeof group, "%s ready, waiting for a thread", dev); break;
        default: snprintf(group, sizeof group, "master"); break;
        }
        int pid = pid_of(t, e->task);
        int64_t dur = e->end_ns - e->start_ns;
        int tid = lane_for(&L, pid, group, rank[e->kind], e->start_ns, e->end_ns, f);
        fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"%s\",\"name\":", kind_name[e->kind]);
        json_str(f, e->name);
        fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{", pid, tid, (double)e->start_ns / 1e3,
                (double)dur / 1e3);
        bool comma = false;
        if (*e->op) {
            fprintf(f, "\"op\":");
            json_str(f, e->op);
            comma = true;
        }
        if (*e->device) {
            fprintf(f, "%s\"device\":", comma ? "," : "");
            json_str(f, e->device);
            comma = true;
        }
        if (*e->peer) {
            fprintf(f, "%s\"%s\":", comma ? "," : "", e->kind == DG_TRACE_TRANSFER ? "from" : "peer");
            json_str(f, e->peer);
            comma = true;
        }
        if (e->kind == DG_TRACE_TRANSFER) fprintf(f, "%s\"bytes\":%llu", comma ? "," : "", (unsigned long long)e->bytes);
        fprintf(f, "}}");
        if (e->kind == DG_TRACE_TRANSFER && *e->peer) {
            // An arrow from the sender: a short slice there to start it from.
            int spid = pid_of(t, e->peer);
            int stid = lane_for(&L, spid, "transfers out", 4, e->start_ns, e->start_ns + 1000, f);
            flow++;
            fprintf(f, ",\n{\"ph\":\"X\",\"cat\":\"transfer\",\"name\":");
            json_str(f, e->name);
            fprintf(f, ",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":1,\"args\":{\"bytes\":%llu}}", spid, stid,
                    (double)e->start_ns / 1e3, (unsigned long long)e->bytes);
            fprintf(f, ",\n{\"ph\":\"s\",\"cat\":\"transfer\",\"name\":\"transfer\",\"id\":%d,\"pid\":%d,\"tid\":%d,"
                       "\"ts\":%.3f}", flow, spid, stid, (double)e->start_ns / 1e3);
            fprintf(f, ",\n{\"ph\":\"f\",\"bp\":\"e\",\"cat\":\"transfer\",\"name\":\"transfer\",\"id\":%d,\"pid\":%d,"
                       "\"tid\":%d,\"ts\":%.3f}", flow, pid, tid, (double)e->start_ns / 1e3);
        }
    }
    free(L.l);
    fprintf(f, "\n]}\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "step trace: writing %s failed: %s", path, strerror(errno));
        return false;
    }
    return true;
}

// A link kind's transfers in a step: each one's time beyond its bytes at the link's bandwidth.
typedef struct link_samples {
    double *extra;
    int n, cap;
} link_samples;

// The median of n sorted values, the first at first and each stride bytes after the one before.
static double median_sorted(const double *first, size_t stride, int n) {
    const char *b = (const char *)first;
    double hi = *(const double *)(b + (size_t)(n / 2) * stride);
    return n % 2 ? hi : 0.5 * (*(const double *)(b + (size_t)(n / 2 - 1) * stride) + hi);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The latency: the median of the transfers' extra time. A transfer's recorded time also holds
// its wait behind the tensors sent before it on the same link, which the simulator adds itself,
// and its wait for the receiving task's threads when its cores are busy, which it does not
// (on two cores under load, 0.1 ms at the 10th percentile, 0.9 ms at the median): the median
// counts that wait as part of the link, where the fastest transfers alone predicted steps up to
// half too short.
static void link_samples_set(dg_cost_model *m, dg_link_kind kind, link_samples *ls) {
    if (ls->n < 3) return;
    qsort(ls->extra, (size_t)ls->n, sizeof *ls->extra, cmp_double);
    dg_link_perf out = dg_cost_model_link(m, kind);
    double lat = median_sorted(ls->extra, sizeof *ls->extra, ls->n);
    out.latency_s = lat > 0 ? lat : 0;
    dg_cost_model_set_link(m, kind, out, NULL);   // out of range: the figures stay
}

// One op's time in one traced step.
typedef struct op_sample {
    char type[DG_DEVICE_TYPE_MAX];
    const char *name;   // borrowed from the trace's event
    double s;
} op_sample;

static int cmp_op_sample(const void *a, const void *b) {
    const op_sample *x = a, *y = b;
    int c = strcmp(x->type, y->type);
    if (!c) c = strcmp(x->name, y->name);
    return c ? c : (x->s > y->s) - (x->s < y->s);
}

bool step_trace_executor_handoff(void *ctx, const dg_node *n, const char *device_type) {
    (void)ctx;
    const exec_kernel_def *k = exec_kernel_find(dg_node_op_type(n), device_type, exec_kernel_dtype(n));
    return k && k->expensive;
}

// A device type's wake time: how long an op handed to a thread that was not running waited
// (a QUEUED event on a thread with no op of its own during the wait).
typedef struct wake_sample {
    char type[DG_DEVICE_TYPE_MAX];
    double s;
} wake_sample;

static int cmp_wake_sample(const void *a, const void *b) {
    const wake_sample *x = a, *y = b;
    int c = strcmp(x->type, y->type);
    return c ? c : (x->s > y->s) - (x->s < y->s);
}

// An op's run on a thread, for finding whether the thread ran anything in a time window.
typedef struct thread_run {
    const char *task;
    int thread;
    int64_t start, end;
    int64_t max_end;   // the latest end of this run and those before it on the same thread
} thread_run;

static int cmp_thread_run(const void *a, const void *b) {
    const thread_run *x = a, *y = b;
    int c = strcmp(x->task, y->task);
    if (c) return c;
    if (x->thread != y->thread) return x->thread < y->thread ? -1 : 1;
    return (x->start > y->start) - (x->start < y->start);
}

// Whether thread (task, thread) ran an op overlapping [start, end): among its runs (sorted, in
// runs[0..n)), the last one starting before end, and the latest end up to it.
static bool thread_busy(const thread_run *runs, int n, const char *task, int thread, int64_t start, int64_t end) {
    int lo = 0, hi = n;   // the first run not before (task, thread, end)
    thread_run key = {task, thread, end, 0, 0};
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (cmp_thread_run(&runs[mid], &key) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo == 0) return false;
    const thread_run *r = &runs[lo - 1];
    return r->thread == thread && strcmp(r->task, task) == 0 && r->max_end > start;
}

// Appends trace t's waits of ops handed to an idle thread to *w. O(E log E) in the events.
static bool wake_samples_add(const dg_step_trace *t, wake_sample **w, int *n, int *cap, dg_status *st) {
    int ne = dg_step_trace_num_events(t), nr = 0;
    thread_run *runs = malloc(((size_t)ne + 1) * sizeof *runs);
    if (!runs) return base_oom(st, "step trace wake times", (size_t)ne * sizeof *runs);
    for (int j = 0; j < ne; j++) {
        const dg_trace_event *e = dg_step_trace_event(t, j);
        if (e->kind == DG_TRACE_OP && e->task) runs[nr++] = (thread_run){e->task, e->thread, e->start_ns, e->end_ns, 0};
    }
    if (nr > 1) qsort(runs, (size_t)nr, sizeof *runs, cmp_thread_run);
    for (int j = 0; j < nr; j++) {
        bool same = j > 0 && runs[j - 1].thread == runs[j].thread && strcmp(runs[j - 1].task, runs[j].task) == 0;
        runs[j].max_end = same && runs[j - 1].max_end > runs[j].end ? runs[j - 1].max_end : runs[j].end;
    }
    bool ok = true;
    for (int i = 0; i < ne && ok; i++) {
        const dg_trace_event *q = dg_step_trace_event(t, i);
        if (q->kind != DG_TRACE_QUEUED || !q->device || !q->device[0] || !q->task || q->end_ns <= q->start_ns)
            continue;
        dg_device_name dn;
        if (!dg_device_name_parse(q->device, &dn, NULL) || !dn.has_type) continue;
        // Did the thread that took it run an op while it waited?
        if (thread_busy(runs, nr, q->task, q->thread, q->start_ns, q->end_ns)) continue;
        ok = BASE_GROW(*w, *n, *cap, 1, "step trace wake times", st);
        if (!ok) break;
        memcpy((*w)[*n].type, dn.type, sizeof dn.type);
        (*w)[(*n)++].s = (double)(q->end_ns - q->start_ns) * 1e-9;
    }
    free(runs);
    return ok;
}

int dg_step_trace_measure(const dg_step_trace *t, dg_cost_model *m, dg_status *st) {
    if (!t || !m) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "dg_step_trace_measure: no trace or no cost model");
        return -1;
    }
    return dg_step_traces_measure(&t, 1, m, st);
}

int dg_step_traces_measure(const dg_step_trace *const *traces, int n_traces, dg_cost_model *m, dg_status *st) {
    dg_status_reset(st);
    if (!traces || n_traces < 1 || !m) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "dg_step_traces_measure: no traces or no cost model");
        return -1;
    }
    for (int k = 0; k < n_traces; k++)
        if (!traces[k]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "dg_step_traces_measure: trace %d is NULL", k);
            return -1;
        }
    int n = -1, n_samples = 0, cap_samples = 0, n_wake = 0, cap_wake = 0;
    op_sample *samples = NULL;
    wake_sample *wake = NULL;
    link_samples links[3];
    memset(links, 0, sizeof links);
    for (int k = 0; k < n_traces; k++) {
        const dg_step_trace *t = traces[k];
        if (!wake_samples_add(t, &wake, &n_wake, &cap_wake, st)) goto out;
        for (int i = 0; i < dg_step_trace_num_events(t); i++) {
            const dg_trace_event *e = dg_step_trace_event(t, i);
            if (e->kind == DG_TRACE_TRANSFER && e->peer && e->peer[0] && e->task && strcmp(e->peer, e->task) != 0 &&
                e->end_ns >= e->start_ns) {
                dg_link_kind lk = dg_cost_model_link_kind(m, e->peer, e->task);
                double d = (double)(e->end_ns - e->start_ns) * 1e-9 -
                           (double)e->bytes / dg_cost_model_link(m, lk).bytes_per_s;
                if (!BASE_GROW(links[lk].extra, links[lk].n, links[lk].cap, 1, "step trace links", st)) goto out;
                links[lk].extra[links[lk].n++] = d;
                continue;
            }
            if (e->kind != DG_TRACE_OP || !e->name || !e->device || !e->device[0]) continue;
            dg_device_name dn;
            if (!dg_device_name_parse(e->device, &dn, NULL) || !dn.has_type) continue;
            if (!BASE_GROW(samples, n_samples, cap_samples, 1, "step trace ops", st)) goto out;
            double s = (double)(e->end_ns - e->start_ns) * 1e-9;
            op_sample *o = &samples[n_samples++];
            memcpy(o->type, dn.type, sizeof o->type);
            o->name = e->name;
            o->s = s > 0 ? s : 0;
        }
    }
    // Each op's median over the steps that ran it: one slow step (a page fault, the other
    // device's burst) moves no op's time.
    if (n_samples > 1) qsort(samples, (size_t)n_samples, sizeof *samples, cmp_op_sample);
    n = 0;
    for (int i = 0; i < n_samples;) {
        int j = i + 1;
        while (j < n_samples && !strcmp(samples[j].type, samples[i].type) && !strcmp(samples[j].name, samples[i].name))
            j++;
        double med = median_sorted(&samples[i].s, sizeof *samples, j - i);
        if (!dg_cost_model_set_measured(m, samples[i].name, samples[i].type, med, st)) {
            n = -1;
            goto out;
        }
        n++;
        i = j;
    }
    for (int k = 0; k < 3; k++) link_samples_set(m, (dg_link_kind)k, &links[k]);
    // Each type's wake time: the median of its hand-overs to an idle thread (at least 3), and the
    // executor's rule of which ops it hands over.
    if (n_wake > 1) qsort(wake, (size_t)n_wake, sizeof *wake, cmp_wake_sample);
    for (int i = 0; i < n_wake;) {
        int j = i + 1;
        while (j < n_wake && !strcmp(wake[j].type, wake[i].type)) j++;
        if (j - i >= 3) {
            double med = median_sorted(&wake[i].s, sizeof *wake, j - i);
            dg_cost_model_set_wake(m, wake[i].type, med < 1 ? med : 1, NULL);   // an unknown type: none
        }
        i = j;
    }
    dg_cost_model_set_handoff(m, step_trace_executor_handoff, NULL);
out:
    for (int k = 0; k < 3; k++) free(links[k].extra);
    free(samples);
    free(wake);
    return n;
}
