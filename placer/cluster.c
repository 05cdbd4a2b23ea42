/* Cluster specs and TF_CONFIG with TensorFlow's semantics: ClusterSpec (server_lib.py), the
 * cluster spec string of grpc_tensorflow_server, ServerDef's defaults, TFConfigClusterResolver
 * (tfconfig_cluster_resolver.py), the estimator's RunConfig (run_config.py) and
 * multi_worker_util.py. TensorFlow reads TF_CONFIG as loosely typed Python values; the
 * placer_json_py_* helpers (json.c) give those values' str(), int(), truthiness and `in`, so
 * each rule below reads as its Python original does, and fails where it raises.
 *
 * A cluster is data: names and addresses are kept as given and judged only where they are
 * used (dg_cluster_check_task). Jobs are kept sorted by name and tasks by index, so the
 * accessors index directly and every printed form is deterministic. Internal helpers set
 * messages without a prefix; each public entry point prepends what it was reading. */
#include "base_impl.h"
#include "distgraph/cluster.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"
#include "json_impl.h"
#include "status_impl.h"

#define JOB_NAME_MAX 63   // bytes of a job name in the older spec string (dg_device_name.job)

typedef struct cl_task {
    int index;
    char *addr;   // owned, any UTF-8 text
} cl_task;

typedef struct cl_job {
    char *name;       // owned, any UTF-8 text
    cl_task *tasks;   // sorted by index
    int n_tasks;
    int cap;
} cl_job;

struct dg_cluster {
    cl_job *jobs;   // sorted by name (bytewise, which is code point order for UTF-8)
    int n_jobs;
    int cap;
};

// ---- text checks ----

static bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Well-formed UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. TensorFlow keeps
// names and addresses in protobuf strings, which must be UTF-8.
static bool utf8_valid(const char *s) {
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

static int find_task(const cl_job *j, int task) {
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
static bool check_text(const char *what, const char *s, dg_status *st) {
    if (!s) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s must not be NULL", what);
        return false;
    }
    if (!utf8_valid(s)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s \"%.40s\" is not UTF-8 text", what, s);
        return false;
    }
    return true;
}

// Returns the job, creating it (empty) if needed; NULL on bad text or out of memory.
static cl_job *get_or_add_job(dg_cluster *c, const char *job, dg_status *st) {
    if (!check_text("job name", job, st)) return NULL;
    int pos = find_job(c, job);
    if (pos >= 0) return &c->jobs[pos];
    pos = -pos - 1;
    if (c->n_jobs == c->cap) {
        int ncap = c->cap ? c->cap * 2 : 4;
        cl_job *nj = realloc(c->jobs, (size_t)ncap * sizeof *nj);
        if (!nj) {
            base_oom(st, "cluster", (size_t)ncap * sizeof *nj);
            return NULL;
        }
        c->jobs = nj;
        c->cap = ncap;
    }
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
    if (!check_text("job name", job, st)) return false;
    if (!check_text("address", addr, st)) {
        dg_status_prepend(st, "job \"%s\" task %d", job, task);
        return false;
    }
    int jpos = find_job(c, job);
    if (jpos >= 0) {
        int tpos = find_task(&c->jobs[jpos], task);
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
    if (j->n_tasks == j->cap) {
        int ncap = j->cap ? j->cap * 2 : 4;
        cl_task *nt = realloc(j->tasks, (size_t)ncap * sizeof *nt);
        if (!nt) {
            free(a);
            return base_oom(st, "cluster", (size_t)ncap * sizeof *nt);
        }
        j->tasks = nt;
        j->cap = ncap;
    }
    int tpos = -find_task(j, task) - 1;
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

static const cl_job *lookup_job(const dg_cluster *c, const char *job) {
    if (!c || !job) return NULL;
    int pos = find_job(c, job);
    return pos >= 0 ? &c->jobs[pos] : NULL;
}

bool dg_cluster_has_job(const dg_cluster *c, const char *job) {
    return lookup_job(c, job) != NULL;
}

int dg_cluster_num_tasks(const dg_cluster *c, const char *job) {
    const cl_job *j = lookup_job(c, job);
    return j ? j->n_tasks : 0;
}

static bool no_job(dg_status *st, const char *job) {
    dg_status_setf(st, DG_NOT_FOUND, "cluster: no job \"%s\"", job ? job : "(null)");
    return false;
}

int dg_cluster_job_num_tasks(const dg_cluster *c, const char *job, dg_status *st) {
    dg_status_reset(st);
    const cl_job *j = lookup_job(c, job);
    if (!j) {
        no_job(st, job);
        return -1;
    }
    return j->n_tasks;
}

// len(job_tasks(job)): job_tasks lays the addresses out in a list of the highest index + 1
// entries, assigning each index (a negative one counts from the end), so it fails for a job
// without tasks (max() of nothing) and for an index below -(highest + 1).
static int64_t task_span(const cl_job *j, dg_status *st) {
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
    const cl_job *j = lookup_job(c, job);
    if (!j) {
        no_job(st, job);
        return -1;
    }
    int64_t n = task_span(j, st);
    if (n < 0) dg_status_prepend(st, "cluster");
    return n;
}

int dg_cluster_task_index(const dg_cluster *c, const char *job, int i) {
    const cl_job *j = lookup_job(c, job);
    if (!j || i < 0 || i >= j->n_tasks) return -1;
    return j->tasks[i].index;
}

const char *dg_cluster_task_address(const dg_cluster *c, const char *job, int task,
                                    dg_status *st) {
    dg_status_reset(st);
    const cl_job *j = lookup_job(c, job);
    if (!j) {
        no_job(st, job);
        return NULL;
    }
    int pos = find_task(j, task);
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

// ---- JSON output ----

static void sb_printf(placer_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(placer_buf *b, const char *fmt, ...) {
    char tmp[64];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0) placer_buf_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

// A JSON string as json.dumps writes it (ensure_ascii): short escapes for the usual controls,
// \u00XX for the others and DEL, \uXXXX (surrogate pairs past U+FFFF) for non-ASCII.
static void sb_json_string(placer_buf *b, const char *s) {
    placer_buf_put(b, "\"", 1);
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        unsigned char c = *u;
        if (c < 0x80) {
            const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
            if (esc)
                placer_buf_str(b, esc);
            else if (c < 0x20 || c == 0x7f)
                sb_printf(b, "\\u%04x", c);
            else
                placer_buf_put(b, (const char *)u, 1);
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
    placer_buf_put(b, "\"", 1);
}

char *dg_cluster_to_json(const dg_cluster *c) {
    placer_buf b = {0};
    placer_buf_str(&b, "{");
    for (int j = 0; c && j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        if (j) placer_buf_str(&b, ", ");
        sb_json_string(&b, job->name);
        // as_dict(): indices 0..n-1 as a list, any other set (none at all too) keyed by
        // index. (With negative indices TensorFlow's as_dict() folds them into its list or
        // fails; here every task is printed, keyed by its index.)
        bool dense = job->n_tasks > 0 && job->tasks[0].index == 0 &&
                     job->tasks[job->n_tasks - 1].index == job->n_tasks - 1;
        placer_buf_str(&b, dense ? ": [" : ": {");
        for (int t = 0; t < job->n_tasks; t++) {
            if (t) placer_buf_str(&b, ", ");
            if (!dense) sb_printf(&b, "\"%d\": ", job->tasks[t].index);
            sb_json_string(&b, job->tasks[t].addr);
        }
        placer_buf_str(&b, dense ? "]" : "}");
    }
    placer_buf_str(&b, "}");
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

// ---- JSON input ----

// Quotes at most 40 bytes of the source text of v for messages.
static const char *raw(const char *src, const placer_json *v, char *buf, size_t cap) {
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

static bool json_address(const char *src, const char *job, int index, const placer_json *a,
                         dg_status *st) {
    char r[48];
    if (a->kind != PLACER_JSON_STRING) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" task %d: the address must be a string, got %s",
                       job, index, raw(src, a, r, sizeof r));
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
static bool cluster_from_dom(dg_cluster *c, const char *src, const placer_json *root,
                             dg_status *st) {
    char r[48];
    if (root->kind != PLACER_JSON_OBJECT) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "must be an object of jobs, got %s",
                       raw(src, root, r, sizeof r));
        return false;
    }
    for (size_t j = 0; j < root->n; j++) {
        const placer_json_member *m = &root->members[j];
        if (!json_text_ok("job name", m->key, m->key_len, m->key_is_utf8, st)) return false;
        const placer_json *v = m->value;
        if (v->kind == PLACER_JSON_ARRAY) {
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
        } else if (v->kind == PLACER_JSON_OBJECT) {
            if (!get_or_add_job(c, m->key, st)) return false;
            for (size_t t = 0; t < v->n; t++) {
                const placer_json_member *tm = &v->members[t];
                int64_t index = 0;
                placer_py_int pr = placer_py_int_from_text(tm->key, tm->key_len, &index);
                if (pr != PLACER_PY_INT_OK && pr != PLACER_PY_INT_TOO_BIG) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "job \"%s\": task index \"%.*s\" is not an integer", m->key,
                                   (int)(tm->key_len > 40 ? 40 : tm->key_len), tm->key);
                    return false;
                }
                if (pr == PLACER_PY_INT_TOO_BIG || index < INT_MIN || index > INT_MAX) {
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
                           raw(src, v, r, sizeof r));
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
    placer_json *root = placer_json_parse(json, strlen(json), "cluster JSON", st);
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
    placer_json_free(&root);
    return c;
fail:
    dg_cluster_free(&c);
    placer_json_free(&root);
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
    if (!utf8_valid(spec)) {
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
    placer_buf b = {0};
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
        if (j) placer_buf_str(&b, ",");
        placer_buf_str(&b, job->name);
        placer_buf_str(&b, "|");
        for (int t = 0; t < job->n_tasks; t++) {
            if (t) placer_buf_str(&b, ";");
            placer_buf_str(&b, job->tasks[t].addr);
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

// ---- server definitions ----

struct dg_server_def {
    dg_cluster *cluster;   // owned copy
    char *job_name;        // owned
    int task_index;
    char *protocol;        // owned
};

dg_server_def_options dg_server_def_options_default(void) {
    dg_server_def_options o = {.job_name = NULL, .has_task_index = false, .task_index = 0,
                               .protocol = NULL};
    return o;
}

void dg_server_def_free(dg_server_def **dp) {
    if (!dp || !*dp) return;
    dg_server_def *d = *dp;
    dg_cluster_free(&d->cluster);
    free(d->job_name);
    free(d->protocol);
    free(d);
    *dp = NULL;
}

dg_server_def *dg_server_def_new(const dg_cluster *c, const dg_server_def_options *o,
                                 dg_status *st) {
    dg_status_reset(st);
    dg_server_def_options opts = o ? *o : dg_server_def_options_default();
    if (!c) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "server definition: NULL cluster");
        return NULL;
    }
    const char *job = opts.job_name;
    if (!job) {
        if (c->n_jobs != 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "server definition: the cluster has %d jobs: give the job name", c->n_jobs);
            return NULL;
        }
        job = c->jobs[0].name;
    }
    int task = opts.task_index;
    if (!opts.has_task_index) {
        const cl_job *j = lookup_job(c, job);
        if (!j) {
            dg_status_setf(st, DG_NOT_FOUND, "server definition: no job \"%s\" in the cluster", job);
            return NULL;
        }
        if (j->n_tasks != 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "server definition: job \"%s\" has %d tasks: give the task index", job, j->n_tasks);
            return NULL;
        }
        task = j->tasks[0].index;
    }
    dg_status text_st = DG_STATUS_INIT;
    bool text_ok = check_text("job name", job, &text_st) &&
                   (!opts.protocol || check_text("protocol", opts.protocol, &text_st));
    if (!text_ok) {
        dg_status_copy(st, &text_st);
        status_impl_clear(&text_st);
        dg_status_prepend(st, "server definition");
        return NULL;
    }
    status_impl_clear(&text_st);
    dg_server_def *d = calloc(1, sizeof *d);
    if (!d) {
        base_oom(st, "cluster", sizeof *d);
        return NULL;
    }
    d->cluster = dg_cluster_copy(c);
    d->job_name = strdup(job);
    d->protocol = strdup(opts.protocol ? opts.protocol : "grpc");
    d->task_index = task;
    if (!d->cluster || !d->job_name || !d->protocol) {
        dg_server_def_free(&d);
        base_oom(st, "cluster", 0);
        return NULL;
    }
    return d;
}

const dg_cluster *dg_server_def_cluster(const dg_server_def *d) { return d ? d->cluster : NULL; }
const char *dg_server_def_job_name(const dg_server_def *d) { return d ? d->job_name : NULL; }
int dg_server_def_task_index(const dg_server_def *d) { return d ? d->task_index : -1; }
const char *dg_server_def_protocol(const dg_server_def *d) { return d ? d->protocol : NULL; }

// ---- Python's dict access on TF_CONFIG ----

static bool py_error(dg_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool py_error(dg_status *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, DG_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    return false;
}

// `v[key] if key in v else default` (_get_value_in_tfconfig): 1 with *out set, 0 when absent,
// -1 where Python raises TypeError (`in` on a number, or indexing a list or str by a str).
static int py_lookup(const placer_json *v, const char *key, const placer_json **out, const char *where,
                     dg_status *st) {
    int in = placer_json_py_contains(v, key);
    if (in < 0) {
        py_error(st, "%s must be an object to hold \"%s\", got %s (%s)", where, key, placer_json_py_type(v),
                 placer_json_kind_name(v->kind));
        return -1;
    }
    if (in == 0) return 0;
    if (v->kind != PLACER_JSON_OBJECT) {
        py_error(st, "%s must be an object to hold \"%s\", got a %s that contains it", where, key,
                 placer_json_kind_name(v->kind));
        return -1;
    }
    *out = placer_json_get(v, key);
    return 1;
}

// `v.get(key)`: only dicts have it (AttributeError otherwise). 1 found, 0 absent, -1 error.
static int py_dict_get(const placer_json *v, const char *key, const placer_json **out, const char *where,
                       dg_status *st) {
    if (v->kind != PLACER_JSON_OBJECT) {
        py_error(st, "%s must be an object, got %s (%s)", where, placer_json_py_type(v),
                 placer_json_kind_name(v->kind));
        return -1;
    }
    *out = placer_json_get(v, key);
    return *out != NULL;
}

// str(v), NULL for None (and, with st set, when out of memory).
static bool py_str_or_none(const placer_json *v, char **out, dg_status *st) {
    *out = NULL;
    if (!v || v->kind == PLACER_JSON_NULL) return true;
    if (!(*out = placer_json_py_str(v))) return base_oom(st, "cluster", v->src_len);
    return true;
}

// int(v) with TensorFlow's errors; a value beyond int64 is refused (a distgraph limit) but
// reported through *big so lookups can still fail as TensorFlow's do (no such task).
static bool py_int_field(const char *src, const char *what, const placer_json *v, int64_t *out, bool *big,
                         dg_status *st) {
    char r[48];
    if (big) *big = false;
    switch (placer_json_py_int(v, out)) {
    case PLACER_PY_INT_OK: return true;
    case PLACER_PY_INT_TOO_BIG:
        if (big) *big = true;
        return py_error(st, "%s %s does not fit 64 bits", what, raw(src, v, r, sizeof r));
    case PLACER_PY_INT_OVERFLOW:
    case PLACER_PY_INT_VALUE_ERROR:
    case PLACER_PY_INT_TYPE_ERROR: break;
    }
    return py_error(st, "%s must be an integer, got %s", what, raw(src, v, r, sizeof r));
}

// ---- TFConfigClusterResolver ----

struct dg_tf_resolver {
    char *text;                 // owned: the TF_CONFIG text ("{}" when unset)
    placer_json *doc;           // owned
    char *environment;          // owned override, NULL: none
    // Each property as TensorFlow computes it, with its error.
    dg_cluster *cluster;
    dg_status cluster_st;
    char *task_type;            // NULL: None
    dg_status task_type_st;
    bool has_task_id, task_id_big;
    int64_t task_id;
    dg_status task_id_st;
    char *rpc_layer;            // NULL: None
    bool rpc_truthy;
    dg_status rpc_st;
    bool has_session_master;
    char *session_master;       // str() of it
    dg_status session_master_st;
};

dg_tf_resolver_options dg_tf_resolver_options_default(void) {
    dg_tf_resolver_options o = {.task_type = NULL, .has_task_id = false, .task_id = 0, .rpc_layer = NULL,
                                .environment = NULL};
    return o;
}

void dg_tf_resolver_free(dg_tf_resolver **rp) {
    if (!rp || !*rp) return;
    dg_tf_resolver *r = *rp;
    free(r->text);
    placer_json_free(&r->doc);
    free(r->environment);
    dg_cluster_free(&r->cluster);
    status_impl_clear(&r->cluster_st);
    free(r->task_type);
    status_impl_clear(&r->task_type_st);
    status_impl_clear(&r->task_id_st);
    free(r->rpc_layer);
    status_impl_clear(&r->rpc_st);
    free(r->session_master);
    status_impl_clear(&r->session_master_st);
    free(r);
    *rp = NULL;
}

// cluster_spec(): ClusterSpec(tf_config['cluster']) when present, else an empty one.
static void resolve_cluster(dg_tf_resolver *r) {
    const placer_json *cl = NULL;
    int found = py_lookup(r->doc, "cluster", &cl, "TF_CONFIG", &r->cluster_st);
    if (found < 0) return;
    dg_cluster *c = dg_cluster_new();
    if (!c) {
        base_oom(&r->cluster_st, "cluster", sizeof *c);
        return;
    }
    if (found && !cluster_from_dom(c, r->text, cl, &r->cluster_st)) {
        dg_status_prepend(&r->cluster_st, "TF_CONFIG: \"cluster\"");
        dg_cluster_free(&c);
        return;
    }
    r->cluster = c;
}

// The "task" entry's field key: 1 with *out, 0 for None, -1 on error.
static int task_field(const dg_tf_resolver *r, const char *key, const placer_json **out, dg_status *st) {
    const placer_json *task = NULL;
    int found = py_lookup(r->doc, "task", &task, "TF_CONFIG", st);
    if (found <= 0) return found;   // absent: {} has no fields
    return py_lookup(task, key, out, "TF_CONFIG \"task\"", st);
}

static void resolve_task(dg_tf_resolver *r, const dg_tf_resolver_options *o) {
    const placer_json *v = NULL;
    if (o->task_type) {
        if (!(r->task_type = strdup(o->task_type))) base_oom(&r->task_type_st, "cluster", strlen(o->task_type) + 1);
    } else if (task_field(r, "type", &v, &r->task_type_st) > 0) {
        if (!(r->task_type = placer_json_py_str(v))) base_oom(&r->task_type_st, "cluster", v->src_len);   // null: "None"
    }
    if (o->has_task_id) {
        r->has_task_id = true;
        r->task_id = o->task_id;
    } else if (task_field(r, "index", &v, &r->task_id_st) > 0) {
        r->has_task_id = py_int_field(r->text, "TF_CONFIG: \"task.index\"", v, &r->task_id, &r->task_id_big,
                                      &r->task_id_st);
        if (r->task_id_big) r->has_task_id = true;
    }
}

static void resolve_rpc(dg_tf_resolver *r, const dg_tf_resolver_options *o) {
    if (o->rpc_layer) {
        if (!(r->rpc_layer = strdup(o->rpc_layer))) base_oom(&r->rpc_st, "cluster", strlen(o->rpc_layer) + 1);
        r->rpc_truthy = o->rpc_layer[0] != '\0';
        return;
    }
    const placer_json *v = NULL;
    if (py_lookup(r->doc, "rpc_layer", &v, "TF_CONFIG", &r->rpc_st) > 0) {
        py_str_or_none(v, &r->rpc_layer, &r->rpc_st);
        r->rpc_truthy = placer_json_py_truthy(v);
    }
}

static void resolve_session_master(dg_tf_resolver *r) {
    const placer_json *v = NULL;
    if (py_lookup(r->doc, "session_master", &v, "TF_CONFIG", &r->session_master_st) > 0 &&
        v->kind != PLACER_JSON_NULL) {
        r->has_session_master = py_str_or_none(v, &r->session_master, &r->session_master_st);
    }
}

dg_tf_resolver *dg_tf_resolver_new(const char *tf_config, const dg_tf_resolver_options *o,
                                   dg_status *st) {
    dg_status_reset(st);
    dg_tf_resolver_options opts = o ? *o : dg_tf_resolver_options_default();
    dg_tf_resolver *r = calloc(1, sizeof *r);
    if (!r) {
        base_oom(st, "cluster", sizeof *r);
        return NULL;
    }
    r->text = strdup(tf_config ? tf_config : "{}");
    if (!r->text || (opts.environment && !(r->environment = strdup(opts.environment)))) {
        base_oom(st, "cluster", 0);
        goto fail;
    }
    if (!(r->doc = placer_json_parse(r->text, strlen(r->text), "TF_CONFIG", st))) goto fail;
    resolve_cluster(r);
    resolve_task(r, &opts);
    resolve_rpc(r, &opts);
    resolve_session_master(r);
    return r;
fail:
    dg_tf_resolver_free(&r);
    return NULL;
}

dg_tf_resolver *dg_tf_resolver_from_env(const dg_tf_resolver_options *o, dg_status *st) {
    return dg_tf_resolver_new(getenv("TF_CONFIG"), o, st);
}

// Replays a property's stored outcome into st: true when it succeeded.
static bool replay(const dg_status *stored, dg_status *st) {
    if (dg_status_ok(stored)) return true;
    dg_status_copy(st, stored);
    return false;
}

dg_cluster *dg_tf_resolver_cluster_spec(const dg_tf_resolver *r, dg_status *st) {
    dg_status_reset(st);
    if (!r) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "TF_CONFIG resolver: NULL");
        return NULL;
    }
    if (!replay(&r->cluster_st, st)) return NULL;
    dg_cluster *c = dg_cluster_copy(r->cluster);
    if (!c) base_oom(st, "cluster", 0);
    return c;
}

bool dg_tf_resolver_task_type(const dg_tf_resolver *r, const char **task_type, dg_status *st) {
    dg_status_reset(st);
    if (task_type) *task_type = NULL;
    if (!r || !task_type) return py_error(st, "TF_CONFIG resolver: NULL argument");
    if (!replay(&r->task_type_st, st)) return false;
    *task_type = r->task_type;
    return true;
}

bool dg_tf_resolver_task_id(const dg_tf_resolver *r, bool *has_id, int64_t *task_id, dg_status *st) {
    dg_status_reset(st);
    if (!r || !has_id || !task_id) return py_error(st, "TF_CONFIG resolver: NULL argument");
    *has_id = false;
    *task_id = 0;
    if (!replay(&r->task_id_st, st)) return false;
    *has_id = r->has_task_id;
    *task_id = r->task_id;
    return true;
}

bool dg_tf_resolver_rpc_layer(const dg_tf_resolver *r, const char **rpc_layer, dg_status *st) {
    dg_status_reset(st);
    if (rpc_layer) *rpc_layer = NULL;
    if (!r || !rpc_layer) return py_error(st, "TF_CONFIG resolver: NULL argument");
    if (!replay(&r->rpc_st, st)) return false;
    *rpc_layer = r->rpc_layer;
    return true;
}

const char *dg_tf_resolver_environment(const dg_tf_resolver *r) { return r ? r->environment : NULL; }

// The single-task rule: a cluster of no jobs, or of one job whose task list holds one entry,
// runs in process (master ""). -1 on error (the span of an empty job), else 0 or 1.
static int single_task(const dg_cluster *c, dg_status *st) {
    if (c->n_jobs == 0) return 1;
    if (c->n_jobs > 1) return 0;
    int64_t span = task_span(&c->jobs[0], st);
    if (span < 0) return -1;
    return span == 1;
}

// The task a master() call means, as TensorFlow's arguments and properties give it.
typedef struct tf_task {
    const char *type;    // NULL: None
    bool has_id, id_big;
    int64_t id;
} tf_task;

static bool resolve_call_task(const dg_tf_resolver *r, const char *task_type, bool has_task_id,
                              int64_t task_id, tf_task *t, dg_status *st) {
    t->type = task_type;
    if (!task_type) {
        if (!replay(&r->task_type_st, st)) return false;
        t->type = r->task_type;
    }
    t->has_id = has_task_id;
    t->id = task_id;
    t->id_big = false;
    if (!has_task_id) {
        // A TensorFlow integer past int64 is still an index: it names no task.
        if (!r->task_id_big && !replay(&r->task_id_st, st)) return false;
        t->has_id = r->has_task_id;
        t->id = r->task_id;
        t->id_big = r->task_id_big;
    }
    return true;
}

static char *master_of(const dg_tf_resolver *r, const tf_task *t, const char *rpc_layer, dg_status *st) {
    if (!replay(&r->session_master_st, st)) return NULL;
    if (r->has_session_master) {
        char *s = strdup(r->session_master);
        if (!s) base_oom(st, "cluster", 0);
        return s;
    }
    if (!replay(&r->cluster_st, st)) return NULL;
    int single = single_task(r->cluster, st);
    if (single < 0) {
        dg_status_prepend(st, "TF_CONFIG: \"cluster\"");
        return NULL;
    }
    if (single) {
        char *s = strdup("");
        if (!s) base_oom(st, "cluster", 1);
        return s;
    }
    const char *rpc = rpc_layer;
    bool rpc_truthy = rpc && rpc[0];
    if (!rpc) {
        if (!replay(&r->rpc_st, st)) return NULL;
        rpc = r->rpc_layer;
        rpc_truthy = r->rpc_truthy;
    }
    const cl_job *j = lookup_job(r->cluster, t->type);
    if (!j) {
        dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG: no job \"%s\" in the cluster",
                       t->type ? t->type : "None");
        return NULL;
    }
    int pos = t->has_id && !t->id_big && t->id >= INT_MIN && t->id <= INT_MAX ? find_task(j, (int)t->id) : -1;
    if (pos < 0) {
        if (t->has_id && !t->id_big)
            dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG: job \"%s\" has no task %lld", j->name, (long long)t->id);
        else
            dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG: job \"%s\" has no task %s", j->name,
                           t->id_big ? "with that index" : "None");
        return NULL;
    }
    char *s = NULL;
    if (asprintf(&s, "%s%s%s", rpc_truthy ? rpc : "", rpc_truthy ? "://" : "", j->tasks[pos].addr) < 0) {
        base_oom(st, "cluster", 0);
        return NULL;
    }
    return s;
}

char *dg_tf_resolver_master(const dg_tf_resolver *r, const char *task_type, bool has_task_id,
                            int64_t task_id, const char *rpc_layer, dg_status *st) {
    dg_status_reset(st);
    if (!r) {
        py_error(st, "TF_CONFIG resolver: NULL");
        return NULL;
    }
    // As TensorFlow: session_master first, then the cluster and the single-task rule, and only
    // then the task (so a broken task does not matter to a single-task cluster).
    if (!replay(&r->session_master_st, st)) return NULL;
    if (!r->has_session_master) {
        if (!replay(&r->cluster_st, st)) return NULL;
        dg_status tmp = DG_STATUS_INIT;
        int single = single_task(r->cluster, &tmp);
        status_impl_clear(&tmp);
        if (single == 0) {
            tf_task t;
            if (!resolve_call_task(r, task_type, has_task_id, task_id, &t, st)) return NULL;
            return master_of(r, &t, rpc_layer, st);
        }
    }
    tf_task none = {0};
    return master_of(r, &none, rpc_layer, st);
}

static int cmp_accel(const void *a, const void *b) {
    return strcmp(((const dg_accelerator_count *)a)->device_type, ((const dg_accelerator_count *)b)->device_type);
}

int dg_tf_resolver_num_accelerators(const dg_tf_resolver *r, const char *task_type,
                                    bool has_task_id, int64_t task_id,
                                    const char *const *devices, int n_devices,
                                    dg_accelerator_count *counts, int max_counts,
                                    dg_status *st) {
    dg_status_reset(st);
    if (!r || (n_devices > 0 && !devices) || n_devices < 0) {
        py_error(st, "TF_CONFIG resolver: NULL or negative argument");
        return -1;
    }
    // task_type and task_id default to the resolver's; TensorFlow then asks master() for the
    // target to list devices on, which can fail on its own.
    tf_task t;
    if (!resolve_call_task(r, task_type, has_task_id, task_id, &t, st)) return -1;
    if (t.id_big) {
        py_error(st, "TF_CONFIG: \"task.index\" does not fit 64 bits");
        return -1;
    }
    char *master = dg_tf_resolver_master(r, t.type, t.has_id, t.id, NULL, st);
    if (!master) return -1;
    free(master);
    char *job_part = NULL, task_part[32];
    bool filter = t.type && t.has_id;
    if (filter) {
        if (asprintf(&job_part, "/job:%s", t.type) < 0) {
            base_oom(st, "cluster", strlen(t.type) + 6);
            return -1;
        }
        snprintf(task_part, sizeof task_part, "/task:%lld", (long long)t.id);
    }
    dg_accelerator_count found[64];
    int n_found = 0;
    for (int i = 0; i < n_devices; i++) {
        dg_device_name dn;
        if (!devices[i] || !dg_device_name_parse(devices[i], &dn, st) || !dn.has_type) {
            if (dg_status_ok(st))
                dg_status_setf(st, DG_INVALID_ARGUMENT, "device \"%s\" names no device type",
                               devices[i] ? devices[i] : "(null)");
            dg_status_prepend(st, "num_accelerators");
            free(job_part);
            return -1;
        }
        if (strcmp(dn.type, "CPU") == 0 || strcmp(dn.type, "XLA_CPU") == 0) continue;
        if (filter && (!strstr(devices[i], job_part) || !strstr(devices[i], task_part))) continue;
        int k = 0;
        while (k < n_found && strcmp(found[k].device_type, dn.type) != 0) k++;
        if (k == n_found) {
            if (n_found == (int)(sizeof found / sizeof *found)) continue;
            snprintf(found[k].device_type, sizeof found[k].device_type, "%s", dn.type);
            found[k].count = 0;
            n_found++;
        }
        found[k].count++;
    }
    free(job_part);
    qsort(found, (size_t)n_found, sizeof *found, cmp_accel);
    for (int k = 0; k < n_found && k < max_counts && counts; k++) counts[k] = found[k];
    return n_found;
}

// ---- RunConfig ----

static bool rc_err(dg_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool rc_err(dg_status *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, DG_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    dg_status_prepend(st, "TF_CONFIG");
    return false;
}

// as_dict() builds each job's list through job_tasks() when its indices look dense (highest + 1
// equals the count), which fails for a negative index below -count.
static bool as_dict_ok(const dg_cluster *c, dg_status *st) {
    for (int j = 0; j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        if (job->n_tasks > 0 && (int64_t)job->tasks[job->n_tasks - 1].index + 1 == job->n_tasks &&
            task_span(job, st) < 0)
            return false;
    }
    return true;
}

// The address at index i of job_tasks(job), the list TensorFlow indexes by task id: negative
// indices wrap into it (TensorFlow assigns them in dict order; here in index order). NULL: None.
static const char *job_tasks_at(const cl_job *j, int64_t span, int64_t i) {
    const char *at = NULL;
    for (int t = 0; t < j->n_tasks; t++) {
        int64_t slot = j->tasks[t].index < 0 ? j->tasks[t].index + span : j->tasks[t].index;
        if (slot == i) at = j->tasks[t].addr;
    }
    return at;
}

// _validate_task_type_and_task_id: the task of task_env, checked against the cluster.
static bool rc_validate_task(const dg_cluster *c, const char *src, const placer_json *task_env,
                             const char *chief, const placer_json **type_out, int64_t *id_out,
                             dg_status *st) {
    const cl_job *cj = lookup_job(c, chief);
    if (!cj) return rc_err(st, "\"cluster\" must have one \"%s\" task", chief);
    int64_t span = task_span(cj, st);
    if (span < 0) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    if (span > 1)
        return rc_err(st, "\"cluster\" must have only one \"%s\" task, its tasks span 0..%lld", chief,
                      (long long)span - 1);
    const placer_json *type = NULL, *index = NULL;
    if (py_dict_get(task_env, "type", &type, "\"task\"", st) < 0 ||
        py_dict_get(task_env, "index", &index, "\"task\"", st) < 0)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    if (!type || !placer_json_py_truthy(type)) return rc_err(st, "with a \"cluster\", \"task.type\" must be set");
    if (!index || index->kind == PLACER_JSON_NULL) return rc_err(st, "with a \"cluster\", \"task.index\" must be set");
    int64_t id;
    bool big;
    if (!py_int_field(src, "\"task.index\"", index, &id, &big, st) && !big)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    if (id < 0) return rc_err(st, "\"task.index\" must not be negative, got %lld", (long long)id);
    *type_out = type;
    *id_out = id;
    if (placer_json_py_str_eq(type, "evaluator")) {
        if (big) return dg_status_prepend(st, "TF_CONFIG"), false;
        dg_status_reset(st);
        return true;
    }
    const cl_job *tj = type->kind == PLACER_JSON_STRING && placer_json_is_cstring(type) ? lookup_job(c, type->str)
                                                                                          : NULL;
    char r[48];
    if (!tj) return rc_err(st, "\"task.type\" %s is not a job of \"cluster\"", raw(src, type, r, sizeof r));
    int64_t tspan = task_span(tj, st);
    if (tspan < 0) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    if (big || id >= tspan)
        return rc_err(st, "\"task.index\" %s is not a task of job \"%s\" (0..%lld)", raw(src, index, r, sizeof r),
                      tj->name, (long long)tspan - 1);
    dg_status_reset(st);
    return true;
}

// _get_session_master for a validated task of the cluster.
static bool rc_session_master(const dg_cluster *c, const placer_json *root, const char *type, int64_t id,
                              char **out, dg_status *st) {
    const placer_json *sm = placer_json_get(root, "session_master");
    if (sm) return py_str_or_none(sm, out, st);
    int single = single_task(c, st);
    if (single < 0) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    if (single) return (*out = strdup("")) != NULL || base_oom(st, "cluster", 1);
    const cl_job *j = lookup_job(c, type);
    const char *addr = job_tasks_at(j, task_span(j, st), id);
    if (!addr) return rc_err(st, "job \"%s\" has no task %lld to be the master", type, (long long)id);
    if (asprintf(out, "grpc://%s", addr) < 0) return base_oom(st, "cluster", 0);
    return true;
}

// _get_global_id_in_cluster: the chief first, then the other jobs by name, "ps" last, each
// counted by its task span.
static bool rc_global_id(const dg_cluster *c, const char *chief, const char *type, int64_t id, int64_t *out,
                         dg_status *st) {
    int64_t next = 0;
    const cl_job *cj = lookup_job(c, chief);
    if (strcmp(type, chief) == 0) return *out = next + id, true;
    int64_t span = task_span(cj, st);
    if (span < 0) return false;
    next += span;
    for (int pass = 0; pass < 2; pass++) {
        for (int j = 0; j < c->n_jobs; j++) {
            const cl_job *job = &c->jobs[j];
            if (strcmp(job->name, chief) == 0 || (strcmp(job->name, "ps") == 0) != (pass == 1)) continue;
            if (strcmp(job->name, type) == 0) return *out = next + id, true;
            if ((span = task_span(job, st)) < 0) return false;
            next += span;
        }
    }
    return rc_err(st, "task type \"%s\" is not in the cluster", type);
}

static bool rc_text(const placer_json *root, const char *key, char **out, dg_status *st) {
    const placer_json *v = placer_json_get(root, key);
    if (!v) return (*out = strdup("")) != NULL || base_oom(st, "cluster", 1);
    return py_str_or_none(v, out, st);
}

static void run_config_reset(dg_run_config *rc) { memset(rc, 0, sizeof *rc); }

void dg_run_config_clear(dg_run_config *rc) {
    if (!rc) return;
    dg_cluster_free(&rc->cluster);
    free(rc->task_type);
    free(rc->master);
    free(rc->evaluation_master);
    free(rc->model_dir);
    run_config_reset(rc);
}

// The training cluster's settings: a "chief" (or legacy "master") job and a task of it.
static bool rc_distributed(dg_run_config *out, const char *src, const placer_json *root, const placer_json *task_env,
                           const char *chief, dg_status *st) {
    dg_cluster *c = out->cluster;
    const placer_json *type = NULL;
    int64_t id = 0;
    if (!rc_validate_task(c, src, task_env, chief, &type, &id, st)) return false;
    bool evaluator = placer_json_py_str_eq(type, "evaluator");
    bool master_mode = strcmp(chief, "master") == 0;
    if (evaluator && master_mode) return rc_err(st, "with a \"master\" job, the evaluator is not supported");
    if (!(out->task_type = strdup(type->str))) return base_oom(st, "cluster", type->str_len + 1);
    out->task_id = id;
    out->is_chief = strcmp(out->task_type, chief) == 0;
    if (evaluator) {
        // The evaluator is not part of the training cluster.
        if (!rc_text(root, "eval_session_master", &out->evaluation_master, st)) return false;
        dg_cluster_free(&out->cluster);
        if (!(out->cluster = dg_cluster_new()) || !(out->master = strdup(""))) return base_oom(st, "cluster", 0);
        return true;
    }
    if (!(out->evaluation_master = strdup(""))) return base_oom(st, "cluster", 1);
    if (!rc_session_master(c, root, out->task_type, id, &out->master, st)) return false;
    if (!as_dict_ok(c, st)) return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    out->num_ps_replicas = dg_cluster_num_tasks(c, "ps");
    out->num_worker_replicas = dg_cluster_num_tasks(c, "worker") + dg_cluster_num_tasks(c, chief);
    if (!rc_global_id(c, chief, out->task_type, id, &out->global_id_in_cluster, st))
        return dg_status_prepend(st, "TF_CONFIG: \"cluster\""), false;
    out->has_global_id = true;
    return true;
}

// Without a cluster: one local worker, the chief.
static bool rc_local(dg_run_config *out, const char *src, const placer_json *root, const placer_json *task_env,
                     dg_status *st) {
    const placer_json *type = NULL, *index = NULL;
    if (py_dict_get(task_env, "type", &type, "\"task\"", st) < 0 ||
        py_dict_get(task_env, "index", &index, "\"task\"", st) < 0)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    int64_t id = 0;
    bool big = false;
    if (index && !py_int_field(src, "\"task.index\"", index, &id, &big, st) && !big)
        return dg_status_prepend(st, "TF_CONFIG"), false;
    dg_status_reset(st);
    if (type && !placer_json_py_str_eq(type, "worker")) return rc_err(st, "without a \"cluster\", \"task.type\" must be \"worker\"");
    if (big || id != 0) return rc_err(st, "without a \"cluster\", \"task.index\" must be 0");
    if (!(out->task_type = strdup("worker"))) return base_oom(st, "cluster", 7);
    out->is_chief = true;
    out->num_worker_replicas = 1;
    out->has_global_id = true;
    return rc_text(root, "session_master", &out->master, st) &&
           rc_text(root, "eval_session_master", &out->evaluation_master, st);
}

bool dg_run_config_parse(const char *tf_config, dg_run_config *out, dg_status *st) {
    dg_status_reset(st);
    if (!out) return py_error(st, "TF_CONFIG: NULL output");
    run_config_reset(out);
    const char *src = tf_config ? tf_config : "{}";
    placer_json *root = placer_json_parse(src, strlen(src), "TF_CONFIG", st);
    if (!root) return false;
    bool ok = false;
    const placer_json *v = NULL;
    // RunConfig calls tf_config.get(...): the document must be a dict.
    if (py_dict_get(root, "model_dir", &v, "the document", st) < 0) {
        dg_status_prepend(st, "TF_CONFIG");
        goto out;
    }
    if (v && v->kind != PLACER_JSON_NULL) {
        if (!placer_json_py_truthy(v)) {
            rc_err(st, "\"model_dir\" must not be empty");
            goto out;
        }
        if (!py_str_or_none(v, &out->model_dir, st)) goto out;
    }
    v = placer_json_get(root, "service");
    if (v && v->kind != PLACER_JSON_NULL && v->kind != PLACER_JSON_OBJECT) {
        rc_err(st, "\"service\" must be an object, got a %s", placer_json_py_type(v));
        goto out;
    }
    if (!(out->cluster = dg_cluster_new())) {
        base_oom(st, "cluster", 0);
        goto out;
    }
    v = placer_json_get(root, "cluster");
    if (v && !cluster_from_dom(out->cluster, src, v, st)) {
        dg_status_prepend(st, "TF_CONFIG: \"cluster\"");
        goto out;
    }
    static const placer_json empty_task = {.kind = PLACER_JSON_OBJECT};
    const placer_json *task_env = placer_json_get(root, "task");
    if (!task_env) task_env = &empty_task;
    if (out->cluster->n_jobs > 0 && dg_cluster_has_job(out->cluster, "master")) {
        if (dg_cluster_has_job(out->cluster, "chief")) {
            rc_err(st, "with a \"master\" job, a \"chief\" job is not supported");
            goto out;
        }
        ok = rc_distributed(out, src, root, task_env, "master", st);
    } else if (out->cluster->n_jobs > 0) {
        ok = rc_distributed(out, src, root, task_env, "chief", st);
    } else {
        ok = rc_local(out, src, root, task_env, st);
    }
out:
    placer_json_free(&root);
    if (!ok) dg_run_config_clear(out);
    return ok;
}

bool dg_run_config_from_env(dg_run_config *out, dg_status *st) {
    return dg_run_config_parse(getenv("TF_CONFIG"), out, st);
}

// ---- multi_worker_util ----

static bool mw_err(dg_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool mw_err(dg_status *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, DG_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    dg_status_prepend(st, "multi-worker");
    return false;
}

static bool mw_allowed(const char *type) {
    return strcmp(type, "chief") == 0 || strcmp(type, "worker") == 0 || strcmp(type, "evaluator") == 0 ||
           strcmp(type, "ps") == 0;
}

bool dg_multi_worker_validate(const dg_cluster *c, const char *task_type, int64_t task_id, dg_status *st) {
    dg_status_reset(st);
    if (!c) return mw_err(st, "NULL cluster");
    for (int j = 0; j < c->n_jobs; j++)
        if (!mw_allowed(c->jobs[j].name))
            return mw_err(st, "job \"%s\" is not allowed: jobs are \"chief\", \"worker\", \"evaluator\" and \"ps\"",
                          c->jobs[j].name);
    if (task_type && !mw_allowed(task_type))
        return mw_err(st, "task type \"%s\" is not \"chief\", \"worker\", \"evaluator\" or \"ps\"", task_type);
    if (task_type && !dg_cluster_has_job(c, task_type) && strcmp(task_type, "evaluator") != 0)
        return mw_err(st, "task type \"%s\" is not a job of the cluster", task_type);
    if (dg_cluster_num_tasks(c, "chief") > 1) return mw_err(st, "there must be at most one \"chief\" task");
    if (dg_cluster_num_tasks(c, "evaluator") > 1) return mw_err(st, "there must be at most one \"evaluator\" task");
    if (task_type && dg_cluster_has_job(c, task_type) && task_id >= dg_cluster_num_tasks(c, task_type))
        return mw_err(st, "task id %lld is past the last task of job \"%s\" (%d tasks)", (long long)task_id, task_type,
                      dg_cluster_num_tasks(c, task_type));
    return true;
}

static bool mw_validated(const dg_cluster *c, const char *task_type, int64_t task_id, dg_status *st) {
    if (!dg_multi_worker_validate(c, task_type, task_id, st)) return false;
    if (!as_dict_ok(c, st)) return dg_status_prepend(st, "multi-worker"), false;
    return true;
}

static bool type_is(const char *type, const char *want) { return type && strcmp(type, want) == 0; }

bool dg_multi_worker_is_chief(const dg_cluster *c, const char *task_type, int64_t task_id, bool *is_chief,
                              dg_status *st) {
    dg_status_reset(st);
    if (is_chief) *is_chief = false;
    if (!is_chief) return mw_err(st, "NULL output");
    if (!mw_validated(c, task_type, task_id, st)) return false;
    *is_chief = type_is(task_type, "chief") || type_is(task_type, "evaluator") ||
                (!dg_cluster_has_job(c, "chief") && type_is(task_type, "worker") && task_id == 0);
    return true;
}

int dg_multi_worker_count(const dg_cluster *c, const char *task_type, dg_status *st) {
    dg_status_reset(st);
    if (!mw_validated(c, task_type, 0, st)) return -1;
    if (!type_is(task_type, "chief") && !type_is(task_type, "worker") && !type_is(task_type, "evaluator")) {
        mw_err(st, "worker_count is for \"chief\", \"worker\" and \"evaluator\" tasks, not \"%s\"",
               task_type ? task_type : "None");
        return -1;
    }
    if (type_is(task_type, "evaluator")) {
        if (!dg_cluster_has_job(c, "evaluator")) {
            dg_status_setf(st, DG_NOT_FOUND, "multi-worker: the cluster has no \"evaluator\" job");
            return -1;
        }
        return dg_cluster_num_tasks(c, "evaluator");
    }
    return dg_cluster_num_tasks(c, "chief") + dg_cluster_num_tasks(c, "worker");
}

bool dg_multi_worker_id_in_cluster(const dg_cluster *c, const char *task_type, int64_t task_id, int64_t *id,
                                   dg_status *st) {
    dg_status_reset(st);
    if (!id) return mw_err(st, "NULL output");
    *id = -1;
    if (!mw_validated(c, task_type, task_id, st)) return false;
    if (type_is(task_type, "chief")) return *id = 0, true;
    if (type_is(task_type, "worker")) return *id = task_id + dg_cluster_num_tasks(c, "chief"), true;
    if (type_is(task_type, "evaluator")) return *id = task_id, true;
    return mw_err(st, "there is no id for task type \"%s\"", task_type ? task_type : "None");
}

const char *dg_multi_worker_collective_leader(const dg_cluster *c, const char *task_type, int64_t task_id,
                                              dg_status *st) {
    dg_status_reset(st);
    if (!c) return mw_err(st, "NULL cluster"), NULL;
    if (!as_dict_ok(c, st)) return dg_status_prepend(st, "multi-worker"), NULL;
    if (c->n_jobs == 0) return "";
    if (!dg_multi_worker_validate(c, task_type, task_id, st)) return NULL;
    if (type_is(task_type, "evaluator")) return "";
    if (dg_cluster_has_job(c, "chief")) return "/job:chief/replica:0/task:0";
    if (dg_cluster_has_job(c, "worker")) return "/job:worker/replica:0/task:0";
    return mw_err(st, "the cluster has neither a \"chief\" nor a \"worker\" job to lead collectives"), NULL;
}

const char *dg_multi_worker_coordination_leader(const dg_cluster *c, dg_status *st) {
    dg_status_reset(st);
    if (!c) return mw_err(st, "NULL cluster"), NULL;
    if (!as_dict_ok(c, st)) return dg_status_prepend(st, "multi-worker"), NULL;
    if (c->n_jobs == 0) return "";
    if (dg_cluster_has_job(c, "ps")) return "/job:ps/replica:0/task:0";
    if (dg_cluster_has_job(c, "chief")) return "/job:chief/replica:0/task:0";
    if (dg_cluster_has_job(c, "worker")) return "/job:worker/replica:0/task:0";
    return mw_err(st, "the cluster has no \"ps\", \"chief\" or \"worker\" job to lead coordination"), NULL;
}

// ---- dg_tf_config ----

static bool tf_err(dg_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool tf_err(dg_status *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, DG_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    dg_status_prepend(st, "TF_CONFIG");
    return false;
}

// The task a server starts for: in the cluster (the evaluator may stand beside it), and
// multi_worker_util's limits of one chief and one evaluator.
static bool check_task(const dg_tf_config *cfg, bool index_big, dg_status *st) {
    const dg_cluster *c = cfg->cluster;
    if (dg_cluster_num_tasks(c, "chief") > 1)
        return tf_err(st, "\"cluster\": job \"chief\" has %d tasks, at most 1 is allowed",
                      dg_cluster_num_tasks(c, "chief"));
    if (dg_cluster_num_tasks(c, "evaluator") > 1)
        return tf_err(st, "\"cluster\": job \"evaluator\" has %d tasks, at most 1 is allowed",
                      dg_cluster_num_tasks(c, "evaluator"));
    if (cfg->task_type[0] == '\0') return true;
    const cl_job *j = lookup_job(c, cfg->task_type);
    bool evaluator = strcmp(cfg->task_type, "evaluator") == 0;
    if (index_big)
        return tf_err(st, "\"task.index\" is out of range for job \"%s\"", cfg->task_type);
    if (!j) {
        // The evaluator runs beside the cluster and need not be listed in it.
        if (evaluator) return true;
        if (!c) return tf_err(st, "\"task.type\" is \"%s\" but there is no \"cluster\"",
                              cfg->task_type);
        return tf_err(st, "\"task.type\" \"%s\" is not a job in \"cluster\"", cfg->task_type);
    }
    if (find_task(j, cfg->task_index) < 0) {
        bool dense = j->n_tasks == 0 || (j->tasks[0].index == 0 && j->tasks[j->n_tasks - 1].index == j->n_tasks - 1);
        if (dense)
            return tf_err(st, "\"task.index\" %d is out of range: job \"%s\" has %d task%s",
                          cfg->task_index, j->name, j->n_tasks, j->n_tasks == 1 ? "" : "s");
        return tf_err(st, "\"task.index\" %d is out of range: job \"%s\" has no task %d",
                      cfg->task_index, j->name, cfg->task_index);
    }
    return true;
}

// Whether a and b are within two edits (insertions, deletions, substitutions, adjacent swaps)
// of each other: "clsuter" and "cluster", "taks" and "task".
static bool edit_distance_at_most2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 32 || lb > 32 || (la > lb ? la - lb : lb - la) > 2) return false;
    int d[34][34];
    for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= la; i++)
        for (size_t j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < c)
                c = d[i - 2][j - 2] + 1;
            d[i][j] = c;
        }
    return d[la][lb] <= 2 && !(lb <= 4 && d[la][lb] == 2 && la < 3);
}

static void tf_config_reset(dg_tf_config *cfg) {
    cfg->cluster = NULL;
    cfg->task_type[0] = '\0';
    cfg->task_index = -1;
    cfg->is_chief = false;
    cfg->rpc_layer[0] = '\0';
}

// Other keys ("environment", "session_master", ...) are TensorFlow's business, not a server's,
// but one a letter or two away from a key we read is a typo that would silently drop it.
static bool check_typos(const placer_json *root, dg_status *st) {
    if (root->kind != PLACER_JSON_OBJECT) return true;
    static const char *const ours[] = {"cluster", "task", "rpc_layer"};
    for (size_t i = 0; i < root->n; i++) {
        const char *k = root->members[i].key;
        for (size_t j = 0; j < sizeof ours / sizeof *ours; j++) {
            if (strcmp(k, ours[j]) != 0 && !placer_json_get(root, ours[j]) && edit_distance_at_most2(k, ours[j]))
                return tf_err(st, "unknown key \"%s\" at byte %zu (did you mean \"%s\"?)", k,
                              root->members[i].key_offset, ours[j]);
        }
    }
    return true;
}

bool dg_tf_config_parse(const char *json, dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    if (!out) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "TF_CONFIG: NULL output");
        return false;
    }
    tf_config_reset(out);
    if (!json) return tf_err(st, "NULL string");
    dg_tf_resolver *r = dg_tf_resolver_new(json, NULL, st);
    if (!r) return false;
    if (!check_typos(r->doc, st)) goto fail;
    // The cluster, as the resolver reads it; NULL when TF_CONFIG has none.
    const placer_json *cl = NULL;
    if (py_lookup(r->doc, "cluster", &cl, "TF_CONFIG", st) < 0) {
        dg_status_prepend(st, "TF_CONFIG");
        goto fail;
    }
    if (cl) {
        if (!replay(&r->cluster_st, st)) goto fail;
        out->cluster = r->cluster;
        r->cluster = NULL;
    }
    // The task: both fields or neither (TensorFlow fails later, when a strategy or a server
    // needs the missing one).
    const char *type = NULL;
    bool has_id;
    int64_t id;
    if (!dg_tf_resolver_task_type(r, &type, st)) goto fail;
    if (!dg_tf_resolver_task_id(r, &has_id, &id, st) && !r->task_id_big) goto fail;
    dg_status_reset(st);
    if (type || r->has_task_id) {
        if (!type) {
            tf_err(st, "\"task\" has no \"type\"");
            goto fail;
        }
        if (!r->has_task_id) {
            tf_err(st, "\"task\" has no \"index\"");
            goto fail;
        }
        if (type[0] == '\0') {
            tf_err(st, "\"task.type\" is empty");
            goto fail;
        }
        if (strlen(type) >= sizeof out->task_type) {
            tf_err(st, "\"task.type\" \"%.40s...\" is longer than %zu bytes", type, sizeof out->task_type - 1);
            goto fail;
        }
        if (!utf8_valid(type)) {
            tf_err(st, "\"task.type\" \"%s\" is not Unicode text", type);
            goto fail;
        }
        memcpy(out->task_type, type, strlen(type) + 1);
        out->task_index = !r->task_id_big && r->task_id >= INT_MIN && r->task_id <= INT_MAX ? (int)r->task_id : -1;
    }
    const char *rpc = NULL;
    if (!dg_tf_resolver_rpc_layer(r, &rpc, st)) goto fail;
    if (rpc) {
        if (strlen(rpc) >= sizeof out->rpc_layer) {
            tf_err(st, "\"rpc_layer\" \"%s\" is longer than %zu bytes", rpc, sizeof out->rpc_layer - 1);
            goto fail;
        }
        memcpy(out->rpc_layer, rpc, strlen(rpc) + 1);
    }
    bool index_big = out->task_type[0] && (r->task_id_big || r->task_id < INT_MIN || r->task_id > INT_MAX);
    if (!check_task(out, index_big, st)) goto fail;
    // multi_worker_util.is_chief, except that the evaluator is not a chief here: in a
    // parameter-server cluster it must not initialize or save the variables.
    out->is_chief = strcmp(out->task_type, "chief") == 0 ||
                    (strcmp(out->task_type, "worker") == 0 && out->task_index == 0 &&
                     !dg_cluster_has_job(out->cluster, "chief"));
    dg_tf_resolver_free(&r);
    return true;
fail:
    dg_tf_resolver_free(&r);
    dg_tf_config_clear(out);
    return false;
}

bool dg_tf_config_from_env(dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    const char *env = getenv("TF_CONFIG");
    if (!env || !*env) {
        if (out) tf_config_reset(out);
        dg_status_setf(st, DG_NOT_FOUND, "TF_CONFIG is %s", env ? "empty" : "not set");
        return false;
    }
    return dg_tf_config_parse(env, out, st);
}

void dg_tf_config_clear(dg_tf_config *cfg) {
    if (!cfg) return;
    dg_cluster_free(&cfg->cluster);
    tf_config_reset(cfg);
}
