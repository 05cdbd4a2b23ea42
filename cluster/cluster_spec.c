/* Cluster specs with TensorFlow's semantics: ClusterSpec (server_lib.py) and its forms, JSON
 * as json.dumps prints as_dict(), the cluster spec string of grpc_tensorflow_server and the
 * --ps_hosts/--worker_hosts flags.
 *
 * A cluster is data: names and addresses are kept as given and judged only where they are
 * used (dg_cluster_check_task). Jobs are kept sorted by name and tasks by index, so the
 * accessors index directly and every printed form is deterministic. Internal helpers set
 * messages without a prefix; each public entry point prepends what it was reading. */
#include "base_impl.h"
#include "distgraph/cluster_spec.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster_impl.h"
#include "distgraph/device_name.h"
#include "json_impl.h"
#include "status_impl.h"

#define JOB_NAME_MAX 63   // bytes of a job name in the older spec string (dg_device_name.job)

static bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Well-formed UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. TensorFlow keeps
// names and addresses in protobuf strings, which must be UTF-8.
bool cluster_utf8_valid(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        unsigned char c = *u;
        size_t n;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            u++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (u[1] < lo || u[1] > hi) return false;
        for (size_t k = 2; k < n; k++)
            if (u[k] < 0x80 || u[k] > 0xBF) return false;
        u += n;
    }
    return true;
}

// The job names of distgraph's older spec string: the device-name grammar. The rule that tells
// that form from TensorFlow's rests on it, so it is spelt out here rather than borrowed from
// the device-name parser, which may grow.
static bool is_device_job_name(const char *job, size_t len) {
    bool ok = len > 0 && len <= JOB_NAME_MAX && is_alpha(job[0]);
    for (size_t i = 1; ok && i < len; i++)
        ok = is_alpha(job[i]) || is_digit(job[i]) || job[i] == '_' || job[i] == '-';
    return ok;
}

// Host characters: printable ASCII without spaces, quotes or the separators of the spec
// formats (",;|/"), so an address survives every format we print and parse.
static bool is_host_char(char c) {
    unsigned char u = (unsigned char)c;
    return u > 0x20 && u < 0x7f && !strchr(",;|/\"'\\[]:", c);
}

// "host:port" with a nonempty host (a bracketed "[v6]" host may hold ':') and a decimal
// port in 1..65535: what a server can bind and a client connect to.
static bool check_address(const char *addr, dg_status *st) {
    const char *colon = strrchr(addr, ':');
    if (!colon) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "address \"%s\" has no \":port\"", addr);
        return false;
    }
    size_t hlen = (size_t)(colon - addr);
    if (hlen == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "address \"%s\" has an empty host", addr);
        return false;
    }
    bool host_ok = true;
    if (addr[0] == '[') {
        // "[::1]": hex digits, ':' and '.' inside the brackets.
        host_ok = hlen > 2 && addr[hlen - 1] == ']';
        for (size_t i = 1; host_ok && i + 1 < hlen; i++) {
            char c = addr[i];
            host_ok = is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                      c == ':' || c == '.';
        }
    } else {
        for (size_t i = 0; host_ok && i < hlen; i++) host_ok = is_host_char(addr[i]);
    }
    if (!host_ok) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "address \"%s\": bad host \"%.*s\"", addr,
                       (int)hlen, addr);
        return false;
    }
    const char *port = colon + 1;
    long v = 0;
    bool port_ok = *port != '\0';
    for (const char *q = port; port_ok && *q; q++) {
        port_ok = is_digit(*q);
        if (port_ok) v = v * 10 + (*q - '0');
        if (v > 65535) port_ok = false;
    }
    if (!port_ok || v < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "address \"%s\": port \"%s\" is not a number in 1..65535", addr, port);
        return false;
    }
    return true;
}

bool cluster_refuse(dg_status *st, const char *what, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, DG_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    if (what) dg_status_prepend(st, "%s", what);
    return false;
}

// ---- storage ----

dg_cluster *dg_cluster_new(void) { return calloc(1, sizeof(dg_cluster)); }

void dg_cluster_free(dg_cluster **cp) {
    if (!cp || !*cp) return;
    dg_cluster *c = *cp;
    for (int j = 0; j < c->n_jobs; j++) {
        for (int t = 0; t < c->jobs[j].n_tasks; t++) free(c->jobs[j].tasks[t].addr);
        free(c->jobs[j].tasks);
        free(c->jobs[j].name);
    }
    free(c->jobs);
    free(c);
    *cp = NULL;
}

// Binary search; returns the position of job, or -(insertion point) - 1.
static int find_job(const dg_cluster *c, const char *job) {
    int lo = 0, hi = c->n_jobs;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        int cmp = strcmp(c->jobs[mid].name, job);
        if (cmp == 0) return mid;
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -lo - 1;
}

int cluster_find_task(const cl_job *j, int task) {
    int lo = 0, hi = j->n_tasks;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (j->tasks[mid].index == task) return mid;
        if (j->tasks[mid].index < task)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -lo - 1;
}

// Names and addresses are text: UTF-8 (TensorFlow keeps them in protobuf strings).
bool cluster_check_text(const char *what, const char *s, dg_status *st) {
    if (!s) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s must not be NULL", what);
        return false;
    }
    if (!cluster_utf8_valid(s)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s \"%.40s\" is not UTF-8 text", what, s);
        return false;
    }
    return true;
}

// Returns the job, creating it (empty) if needed; NULL on bad text or out of memory.
static cl_job *get_or_add_job(dg_cluster *c, const char *job, dg_status *st) {
    if (!cluster_check_text("job name", job, st)) return NULL;
    int pos = find_job(c, job);
    if (pos >= 0) return &c->jobs[pos];
    pos = -pos - 1;
    if (!BASE_GROW(c->jobs, c->n_jobs, c->cap, 1, "cluster", st)) return NULL;
    char *name = strdup(job);
    if (!name) {
        base_oom(st, "cluster", strlen(job) + 1);
        return NULL;
    }
    memmove(&c->jobs[pos + 1], &c->jobs[pos], (size_t)(c->n_jobs - pos) * sizeof *c->jobs);
    memset(&c->jobs[pos], 0, sizeof c->jobs[pos]);
    c->jobs[pos].name = name;
    c->n_jobs++;
    return &c->jobs[pos];
}

static bool add_task(dg_cluster *c, const char *job, int task, const char *addr,
                     dg_status *st) {
    if (!cluster_check_text("job name", job, st)) return false;
    if (!cluster_check_text("address", addr, st)) {
        dg_status_prepend(st, "job \"%s\" task %d", job, task);
        return false;
    }
    int jpos = find_job(c, job);
    if (jpos >= 0) {
        int tpos = cluster_find_task(&c->jobs[jpos], task);
        if (tpos >= 0) {
            dg_status_setf(st, DG_ALREADY_EXISTS, "job \"%s\" task %d already exists (at \"%s\")",
                           job, task, c->jobs[jpos].tasks[tpos].addr);
            return false;
        }
    }
    char *a = strdup(addr);
    if (!a) return base_oom(st, "cluster", strlen(addr) + 1);
    cl_job *j = get_or_add_job(c, job, st);
    if (!j) {
        free(a);
        return false;
    }
    if (!BASE_GROW(j->tasks, j->n_tasks, j->cap, 1, "cluster", st)) {
        free(a);
        return false;
    }
    int tpos = -cluster_find_task(j, task) - 1;
    memmove(&j->tasks[tpos + 1], &j->tasks[tpos], (size_t)(j->n_tasks - tpos) * sizeof *j->tasks);
    j->tasks[tpos].index = task;
    j->tasks[tpos].addr = a;
    j->n_tasks++;
    return true;
}

bool dg_cluster_add_task(dg_cluster *c, const char *job, int task, const char *addr,
                         dg_status *st) {
    dg_status_reset(st);
    if (!c) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster: NULL cluster");
        return false;
    }
    if (!add_task(c, job, task, addr, st)) {
        dg_status_prepend(st, "cluster");
        return false;
    }
    return true;
}

bool dg_cluster_add_job(dg_cluster *c, const char *job, dg_status *st) {
    dg_status_reset(st);
    if (!c) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster: NULL cluster");
        return false;
    }
    if (!get_or_add_job(c, job, st)) {
        dg_status_prepend(st, "cluster");
        return false;
    }
    return true;
}

dg_cluster *dg_cluster_copy(const dg_cluster *c) {
    dg_cluster *n = dg_cluster_new();
    if (!n || !c) return n;
    for (int j = 0; j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        if (!get_or_add_job(n, job->name, NULL)) goto fail;
        for (int t = 0; t < job->n_tasks; t++)
            if (!add_task(n, job->name, job->tasks[t].index, job->tasks[t].addr, NULL)) goto fail;
    }
    return n;
fail:
    dg_cluster_free(&n);
    return NULL;
}

// ---- lookups ----

int dg_cluster_num_jobs(const dg_cluster *c) { return c ? c->n_jobs : 0; }

const char *dg_cluster_job(const dg_cluster *c, int i) {
    if (!c || i < 0 || i >= c->n_jobs) return NULL;
    return c->jobs[i].name;
}

const cl_job *cluster_lookup_job(const dg_cluster *c, const char *job) {
    if (!c || !job) return NULL;
    int pos = find_job(c, job);
    return pos >= 0 ? &c->jobs[pos] : NULL;
}

bool dg_cluster_has_job(const dg_cluster *c, const char *job) {
    return cluster_lookup_job(c, job) != NULL;
}

int dg_cluster_num_tasks(const dg_cluster *c, const char *job) {
    const cl_job *j = cluster_lookup_job(c, job);
    return j ? j->n_tasks : 0;
}

static bool no_job(dg_status *st, const char *job) {
    dg_status_setf(st, DG_NOT_FOUND, "cluster: no job \"%s\"", job ? job : "(null)");
    return false;
}

int dg_cluster_job_num_tasks(const dg_cluster *c, const char *job, dg_status *st) {
    dg_status_reset(st);
    const cl_job *j = cluster_lookup_job(c, job);
    if (!j) {
        no_job(st, job);
        return -1;
    }
    return j->n_tasks;
}

// len(job_tasks(job)): job_tasks lays the addresses out in a list of the highest index + 1
// entries, assigning each index (a negative one counts from the end), so it fails for a job
// without tasks (max() of nothing) and for an index below -(highest + 1).
int64_t cluster_task_span(const cl_job *j, dg_status *st) {
    if (j->n_tasks == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" has no tasks", j->name);
        return -1;
    }
    int64_t span = (int64_t)j->tasks[j->n_tasks - 1].index + 1;
    if (span < 1 || j->tasks[0].index < -span) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "job \"%s\": task %d does not fit its list of tasks 0..%lld", j->name,
                       j->tasks[0].index, (long long)span - 1);
        return -1;
    }
    return span;
}

int64_t dg_cluster_job_task_span(const dg_cluster *c, const char *job, dg_status *st) {
    dg_status_reset(st);
    const cl_job *j = cluster_lookup_job(c, job);
    if (!j) {
        no_job(st, job);
        return -1;
    }
    int64_t n = cluster_task_span(j, st);
    if (n < 0) dg_status_prepend(st, "cluster");
    return n;
}

int dg_cluster_task_index(const dg_cluster *c, const char *job, int i) {
    const cl_job *j = cluster_lookup_job(c, job);
    if (!j || i < 0 || i >= j->n_tasks) return -1;
    return j->tasks[i].index;
}

const char *dg_cluster_task_address(const dg_cluster *c, const char *job, int task,
                                    dg_status *st) {
    dg_status_reset(st);
    const cl_job *j = cluster_lookup_job(c, job);
    if (!j) {
        no_job(st, job);
        return NULL;
    }
    int pos = cluster_find_task(j, task);
    if (pos < 0) {
        dg_status_setf(st, DG_NOT_FOUND, "cluster: job \"%s\" has no task %d", job, task);
        return NULL;
    }
    return j->tasks[pos].addr;
}

const char *dg_cluster_check_task(const dg_cluster *c, const char *job, int task, dg_status *st) {
    const char *addr = dg_cluster_task_address(c, job, task, st);
    if (!addr) return NULL;
    // The task's devices are named "/job:<job>/replica:0/task:<task>/...": the device-name
    // parser is the judge of the name (TensorFlow's server stops the process on a bad one).
    char dev[DG_DEVICE_NAME_MAX];
    dg_device_name dn;
    dg_status dev_st = DG_STATUS_INIT;
    int n = snprintf(dev, sizeof dev, "/job:%s/replica:0/task:%d", job, task);
    bool named = n > 0 && (size_t)n < sizeof dev && dg_device_name_parse(dev, &dn, &dev_st) && dn.has_job &&
                 strcmp(dn.job, job) == 0;
    status_impl_clear(&dev_st);
    if (!named) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "cluster: job name \"%s\" cannot be served: a task's job must be a name device strings "
                       "can hold ([A-Za-z][A-Za-z0-9_-]*, at most %d bytes)",
                       job, DG_DEVICE_JOB_MAX - 1);
        return NULL;
    }
    if (!check_address(addr, st)) {
        dg_status_prepend(st, "cluster: job \"%s\" task %d", job, task);
        return NULL;
    }
    return addr;
}

int dg_cluster_total_tasks(const dg_cluster *c) {
    int n = 0;
    for (int j = 0; c && j < c->n_jobs; j++) n += c->jobs[j].n_tasks;
    return n;
}

// as_dict() builds each job's list through job_tasks() when its indices look dense (highest + 1
// equals the count), which fails for a negative index below -count.
bool cluster_as_dict_ok(const dg_cluster *c, dg_status *st) {
    for (int j = 0; j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        if (job->n_tasks > 0 && (int64_t)job->tasks[job->n_tasks - 1].index + 1 == job->n_tasks &&
            cluster_task_span(job, st) < 0)
            return false;
    }
    return true;
}

// ---- JSON output ----

static void sb_printf(cluster_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(cluster_buf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) cluster_buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// A JSON string as json.dumps writes it (ensure_ascii): short escapes for the usual controls,
// \u00XX for the others and DEL, \uXXXX (surrogate pairs past U+FFFF) for non-ASCII.
static void sb_json_string(cluster_buf *b, const char *s) {
    cluster_buf_put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        unsigned char c = *u;
        if (c < 0x80) {
            const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (esc)
                cluster_buf_str(b, esc);
            else if (c < 0x20 || c == 0x7f)
                sb_printf(b, "\\u%04x", c);
            else
                cluster_buf_put(b, (const char *)u, 1);
            u++;
            continue;
        }
        // Valid UTF-8 (names and addresses are checked when added).
        size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
        uint32_t cp = n == 4 ? c & 0x07u : n == 3 ? c & 0x0Fu : c & 0x1Fu;
        for (size_t k = 1; k < n; k++) cp = cp << 6 | (u[k] & 0x3Fu);
        if (cp >= 0x10000) {
            cp -= 0x10000;
            sb_printf(b, "\\u%04x\\u%04x", 0xD800u + (cp >> 10), 0xDC00u + (cp & 0x3FFu));
        } else {
            sb_printf(b, "\\u%04x", cp);
        }
        u += n;
    }
    cluster_buf_put(b, "\"", 1);
}

char *dg_cluster_to_json(const dg_cluster *c) {
    cluster_buf b = {0};
    cluster_buf_str(&b, "{");
    for (int j = 0; c && j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        if (j) cluster_buf_str(&b, ", ");
        sb_json_string(&b, job->name);
        // as_dict(): indices 0..n-1 as a list, any other set (none at all too) keyed by
        // index. (With negative indices TensorFlow's as_dict() folds them into its list or
        // fails; here every task is printed, keyed by its index.)
        bool dense = job->n_tasks > 0 && job->tasks[0].index == 0 &&
                     job->tasks[job->n_tasks - 1].index == job->n_tasks - 1;
        cluster_buf_str(&b, dense ? ": [" : ": {");
        for (int t = 0; t < job->n_tasks; t++) {
            if (t) cluster_buf_str(&b, ", ");
            if (!dense) sb_printf(&b, "\"%d\": ", job->tasks[t].index);
            sb_json_string(&b, job->tasks[t].addr);
        }
        cluster_buf_str(&b, dense ? "]" : "}");
    }
    cluster_buf_str(&b, "}");
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

// ---- JSON input ----

// Quotes at most 40 bytes of the source text of v for messages.
const char *cluster_raw(const char *src, const cluster_json *v, char *buf, size_t cap) {
    size_t n = v->src_len;
    if (n > 40)
        snprintf(buf, cap, "%.37s...", src + v->offset);
    else
        snprintf(buf, cap, "%.*s", (int)n, src + v->offset);
    return buf;
}

// A name or address from JSON: TensorFlow encodes it to UTF-8 (a lone surrogate fails there);
// a NUL byte, which TensorFlow would keep, cannot live in a C string.
static bool json_text_ok(const char *what, const char *s, size_t len, bool is_utf8, dg_status *st) {
    if (!is_utf8) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s \"%.40s\" is not Unicode text (a lone surrogate)",
                       what, s);
        return false;
    }
    if (strlen(s) != len) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s \"%s...\" contains a NUL byte", what, s);
        return false;
    }
    return true;
}

static bool json_address(const char *src, const char *job, int index, const cluster_json *a,
                         dg_status *st) {
    char r[48];
    if (a->kind != CLUSTER_JSON_STRING) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" task %d: the address must be a string, got %s",
                       job, index, cluster_raw(src, a, r, sizeof r));
        return false;
    }
    if (!json_text_ok("address", a->str, a->str_len, a->str_is_utf8, st)) {
        dg_status_prepend(st, "job \"%s\" task %d", job, index);
        return false;
    }
    return true;
}

// Fills c from a JSON object of jobs, as tf.train.ClusterSpec reads the dict. Messages are
// relative (the caller prefixes them).
bool cluster_from_dom(dg_cluster *c, const char *src, const cluster_json *root,
                             dg_status *st) {
    char r[48];
    if (root->kind != CLUSTER_JSON_OBJECT) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "must be an object of jobs, got %s",
                       cluster_raw(src, root, r, sizeof r));
        return false;
    }
    for (size_t j = 0; j < root->n; j++) {
        const cluster_json_member *m = &root->members[j];
        if (!json_text_ok("job name", m->key, m->key_len, m->key_is_utf8, st)) return false;
        const cluster_json *v = m->value;
        if (v->kind == CLUSTER_JSON_ARRAY) {
            if (!get_or_add_job(c, m->key, st)) return false;
            if (v->n > (size_t)INT_MAX + 1u) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\": more than 2^31 tasks", m->key);
                return false;
            }
            for (size_t t = 0; t < v->n; t++) {
                if (!json_address(src, m->key, (int)t, v->items[t], st) ||
                    !add_task(c, m->key, (int)t, v->items[t]->str, st))
                    return false;
            }
        } else if (v->kind == CLUSTER_JSON_OBJECT) {
            if (!get_or_add_job(c, m->key, st)) return false;
            for (size_t t = 0; t < v->n; t++) {
                const cluster_json_member *tm = &v->members[t];
                int64_t index = 0;
                cluster_py_int pr = cluster_py_int_from_text(tm->key, tm->key_len, &index);
                if (pr != CLUSTER_PY_INT_OK && pr != CLUSTER_PY_INT_TOO_BIG) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "job \"%s\": task index \"%.*s\" is not an integer", m->key,
                                   (int)(tm->key_len > 40 ? 40 : tm->key_len), tm->key);
                    return false;
                }
                if (pr == CLUSTER_PY_INT_TOO_BIG || index < INT_MIN || index > INT_MAX) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "job \"%s\": task index \"%.*s\" is out of range (int32)",
                                   m->key, (int)(tm->key_len > 40 ? 40 : tm->key_len), tm->key);
                    return false;
                }
                if (!json_address(src, m->key, (int)index, tm->value, st)) return false;
                if (!add_task(c, m->key, (int)index, tm->value->str, st)) {
                    // Two keys for one index ("1" and "01"): TensorFlow keeps the last.
                    if (dg_status_code(st) == DG_ALREADY_EXISTS)
                        dg_status_setf(st, DG_INVALID_ARGUMENT,
                                       "job \"%s\": task index %d is given twice (as \"%.*s\" too)",
                                       m->key, (int)index, (int)(tm->key_len > 40 ? 40 : tm->key_len),
                                       tm->key);
                    return false;
                }
            }
        } else {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "job \"%s\" must be a list or an object of addresses, got %s", m->key,
                           cluster_raw(src, v, r, sizeof r));
            return false;
        }
    }
    return true;
}

dg_cluster *dg_cluster_from_json(const char *json, dg_status *st) {
    dg_status_reset(st);
    if (!json) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster JSON: NULL string");
        return NULL;
    }
    cluster_json *root = cluster_json_parse(json, strlen(json), "cluster JSON", st);
    if (!root) return NULL;
    dg_cluster *c = dg_cluster_new();
    if (!c) {
        base_oom(st, "cluster", sizeof *c);
        goto fail;
    }
    if (!cluster_from_dom(c, json, root, st)) {
        dg_status_prepend(st, "cluster JSON");
        goto fail;
    }
    cluster_json_free(&root);
    return c;
fail:
    dg_cluster_free(&c);
    cluster_json_free(&root);
    return NULL;
}

// ---- spec strings and flags ----

// Adds the sep-separated addresses in [s, s+len) as tasks 0.. of job; an empty one fails.
static bool add_host_list(dg_cluster *c, const char *job, const char *s, size_t len, char sep,
                          dg_status *st) {
    if (!get_or_add_job(c, job, st)) return false;
    int index = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        while (i < len && s[i] != sep) i++;
        if (i == start) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" task %d: empty address", job,
                           index);
            return false;
        }
        char *addr = strndup(s + start, i - start);
        if (!addr) return base_oom(st, "cluster", i - start + 1);
        bool ok = add_task(c, job, index, addr, st);
        free(addr);
        if (!ok) return false;
        index++;
        if (i == len) break;
        i++;   // the separator; a trailing one leaves an empty address and fails above
    }
    return true;
}

// Reads spec with jobs separated by job_sep and tasks by task_sep. TensorFlow's form is
// (',', ';'); distgraph's older one (';', ','), whose job names follow the device grammar.
static dg_cluster *parse_spec(const char *spec, char job_sep, char task_sep, bool device_names,
                              dg_status *st) {
    dg_cluster *c = dg_cluster_new();
    char *job = NULL;
    if (!c) {
        base_oom(st, "cluster", sizeof *c);
        return NULL;
    }
    if (spec[0] == '\0') {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "empty");
        goto fail;
    }
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, job_sep);
        if (!end) end = p + strlen(p);
        size_t len = (size_t)(end - p);
        const char *bar = memchr(p, '|', len);
        if (!bar || memchr(bar + 1, '|', (size_t)(end - bar - 1))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%.*s\" at offset %zu has %s '|'", (int)len, p,
                           (size_t)(p - spec), bar ? "more than one" : "no");
            goto fail;
        }
        size_t jlen = (size_t)(bar - p);
        if (jlen == 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "empty job name at offset %zu", (size_t)(p - spec));
            goto fail;
        }
        job = strndup(p, jlen);
        if (!job) {
            base_oom(st, "cluster", jlen + 1);
            goto fail;
        }
        if (device_names && !is_device_job_name(job, jlen)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "job name \"%s\" is not [A-Za-z][A-Za-z0-9_-]*", job);
            goto fail;
        }
        if (dg_cluster_has_job(c, job)) {
            // TensorFlow adds a second job of the name to its ClusterDef and the last wins.
            dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" appears twice", job);
            goto fail;
        }
        if (!add_host_list(c, job, bar + 1, len - jlen - 1, task_sep, st)) goto fail;
        free(job);
        job = NULL;
        if (*end == '\0') break;
        p = end + 1;
    }
    return c;
fail:
    free(job);
    dg_cluster_free(&c);
    return NULL;
}

static bool all_device_job_names(const dg_cluster *c) {
    for (int j = 0; j < c->n_jobs; j++)
        if (!is_device_job_name(c->jobs[j].name, strlen(c->jobs[j].name))) return false;
    return true;
}

dg_cluster *dg_cluster_from_spec_string(const char *spec, dg_status *st) {
    dg_status_reset(st);
    if (!spec) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec: NULL string");
        return NULL;
    }
    if (!cluster_utf8_valid(spec)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec \"%s\": not UTF-8 text", spec);
        return NULL;
    }
    // TensorFlow's reading, unless it fails or makes odd job names of what reads cleanly in the
    // older form ("ps|a,b;worker|c" is ps: a and a job "b;worker" to TensorFlow). With device
    // job names at most one of the two readings succeeds when the string has a separator.
    dg_cluster *tf = parse_spec(spec, ',', ';', false, st);
    if (tf && all_device_job_names(tf)) return tf;
    dg_status legacy_st = DG_STATUS_INIT;
    dg_cluster *legacy = parse_spec(spec, ';', ',', true, &legacy_st);
    status_impl_clear(&legacy_st);
    if (legacy) {
        dg_cluster_free(&tf);
        dg_status_reset(st);
        return legacy;
    }
    if (tf) return tf;
    dg_status_prepend(st, "cluster spec \"%s\"", spec);
    return NULL;
}

char *dg_cluster_to_spec_string(const dg_cluster *c, dg_status *st) {
    dg_status_reset(st);
    if (!c || c->n_jobs == 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec string: the cluster has no jobs");
        return NULL;
    }
    cluster_buf b = {0};
    for (int j = 0; j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        const char *why = NULL;
        if (job->n_tasks == 0)
            why = "has no tasks";
        else if (job->tasks[0].index != 0 || job->tasks[job->n_tasks - 1].index != job->n_tasks - 1)
            why = "has indices other than 0..n-1";
        else if (!job->name[0] || strpbrk(job->name, ",;|"))
            why = "has a name that is empty or holds ',', ';' or '|'";
        for (int t = 0; !why && t < job->n_tasks; t++)
            if (!job->tasks[t].addr[0] || strpbrk(job->tasks[t].addr, ",;|"))
                why = "has an address that is empty or holds ',', ';' or '|'";
        if (why) {
            free(b.p);
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec string: job \"%s\" %s", job->name, why);
            return NULL;
        }
        if (j) cluster_buf_str(&b, ",");
        cluster_buf_str(&b, job->name);
        cluster_buf_str(&b, "|");
        for (int t = 0; t < job->n_tasks; t++) {
            if (t) cluster_buf_str(&b, ";");
            cluster_buf_str(&b, job->tasks[t].addr);
        }
    }
    if (b.failed) {
        free(b.p);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "cluster spec string: out of memory");
        return NULL;
    }
    return b.p;
}

dg_cluster *dg_cluster_from_flags(const char *ps_hosts, const char *worker_hosts,
                                  dg_status *st) {
    dg_status_reset(st);
    dg_cluster *c = dg_cluster_new();
    if (!c) {
        base_oom(st, "cluster", sizeof *c);
        return NULL;
    }
    if (ps_hosts && *ps_hosts && !add_host_list(c, "ps", ps_hosts, strlen(ps_hosts), ',', st)) {
        dg_status_prepend(st, "--ps_hosts \"%s\"", ps_hosts);
        goto fail;
    }
    if (worker_hosts && *worker_hosts &&
        !add_host_list(c, "worker", worker_hosts, strlen(worker_hosts), ',', st)) {
        dg_status_prepend(st, "--worker_hosts \"%s\"", worker_hosts);
        goto fail;
    }
    return c;
fail:
    dg_cluster_free(&c);
    return NULL;
}
