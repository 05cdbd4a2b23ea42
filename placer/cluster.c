/* Cluster specs and TF_CONFIG (TensorFlow's ClusterSpec, TFConfigClusterResolver and the
 * checks of multi_worker_util). Jobs are kept sorted by name and tasks by index, so the
 * accessors index directly and every printed form is deterministic. Internal helpers set
 * messages without a prefix; each public entry point prepends what it was parsing. */
#include "distgraph/cluster.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

#define JOB_NAME_MAX 63   // bytes; job names must fit dg_device_name.job and task_type

typedef struct cl_task {
    int index;
    char *addr;   // owned, validated "host:port"
} cl_task;

typedef struct cl_job {
    char *name;       // owned
    cl_task *tasks;   // sorted by index
    int n_tasks;
    int cap;
} cl_job;

struct dg_cluster {
    cl_job *jobs;   // sorted by name
    int n_jobs;
    int cap;
};

// ---- validation ----

static bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Job names follow the device-name grammar so that every job can be named in a device
// string: a letter, then letters, digits, '_' or '-'.
static bool check_job_name(const char *job, size_t len, dg_status *st) {
    bool ok = len > 0 && len <= JOB_NAME_MAX && is_alpha(job[0]);
    for (size_t i = 1; ok && i < len; i++)
        ok = is_alpha(job[i]) || is_digit(job[i]) || job[i] == '_' || job[i] == '-';
    if (!ok) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "job name \"%.*s\" is invalid: want [A-Za-z][A-Za-z0-9_-]*, at most %d "
                       "bytes",
                       (int)len, job, JOB_NAME_MAX);
    }
    return ok;
}

// Host characters: printable ASCII without spaces, quotes or the separators of the spec
// formats (",;|/"), so an address survives every format we print and parse.
static bool is_host_char(char c) {
    unsigned char u = (unsigned char)c;
    return u > 0x20 && u < 0x7f && !strchr(",;|/\"'\\[]:", c);
}

// "host:port" with a nonempty host (a bracketed "[v6]" host may hold ':') and a decimal
// port in 1..65535.
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

static bool oom(dg_status *st, size_t n_bytes) {
    dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "cluster: out of memory allocating %zu bytes",
                   n_bytes);
    return false;
}

// Returns the job, creating it (empty) if needed; NULL on a bad name or out of memory.
static cl_job *get_or_add_job(dg_cluster *c, const char *job, dg_status *st) {
    if (!check_job_name(job, strlen(job), st)) return NULL;
    int pos = find_job(c, job);
    if (pos >= 0) return &c->jobs[pos];
    pos = -pos - 1;
    if (c->n_jobs == c->cap) {
        int ncap = c->cap ? c->cap * 2 : 4;
        cl_job *nj = realloc(c->jobs, (size_t)ncap * sizeof *nj);
        if (!nj) {
            oom(st, (size_t)ncap * sizeof *nj);
            return NULL;
        }
        c->jobs = nj;
        c->cap = ncap;
    }
    char *name = strdup(job);
    if (!name) {
        oom(st, strlen(job) + 1);
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
    if (!job || !addr) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "job and address must not be NULL");
        return false;
    }
    if (!check_job_name(job, strlen(job), st)) return false;
    if (task < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" task %d: index must be >= 0", job,
                       task);
        return false;
    }
    if (!check_address(addr, st)) {
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
    cl_job *j = get_or_add_job(c, job, st);
    if (!j) return false;
    if (j->n_tasks == j->cap) {
        int ncap = j->cap ? j->cap * 2 : 4;
        cl_task *nt = realloc(j->tasks, (size_t)ncap * sizeof *nt);
        if (!nt) return oom(st, (size_t)ncap * sizeof *nt);
        j->tasks = nt;
        j->cap = ncap;
    }
    char *a = strdup(addr);
    if (!a) return oom(st, strlen(addr) + 1);
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

// ---- accessors ----

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
        dg_status_setf(st, DG_NOT_FOUND, "cluster: no job \"%s\"", job ? job : "(null)");
        return NULL;
    }
    int pos = find_task(j, task);
    if (pos < 0) {
        dg_status_setf(st, DG_NOT_FOUND, "cluster: job \"%s\" has no task %d", job, task);
        return NULL;
    }
    return j->tasks[pos].addr;
}

int dg_cluster_total_tasks(const dg_cluster *c) {
    int n = 0;
    for (int j = 0; c && j < c->n_jobs; j++) n += c->jobs[j].n_tasks;
    return n;
}

// ---- JSON output ----

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 256;
        while (ncap < b->len + n + 1) ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_json_string(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            sb_put(b, esc, 2);
        } else if (c < 0x20) {
            char esc[8];
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_str(b, esc);
        } else {
            sb_put(b, s, 1);
        }
    }
    sb_put(b, "\"", 1);
}

char *dg_cluster_to_json(const dg_cluster *c) {
    sbuf b = {0};
    sb_str(&b, "{");
    for (int j = 0; c && j < c->n_jobs; j++) {
        const cl_job *job = &c->jobs[j];
        if (j) sb_str(&b, ", ");
        sb_json_string(&b, job->name);
        // Dense indices print as a list, sparse ones as an object keyed by index.
        bool dense = job->n_tasks == 0 || job->tasks[job->n_tasks - 1].index == job->n_tasks - 1;
        sb_str(&b, dense ? ": [" : ": {");
        for (int t = 0; t < job->n_tasks; t++) {
            if (t) sb_str(&b, ", ");
            if (!dense) {
                char key[24];
                snprintf(key, sizeof key, "\"%d\": ", job->tasks[t].index);
                sb_str(&b, key);
            }
            sb_json_string(&b, job->tasks[t].addr);
        }
        sb_str(&b, dense ? "]" : "}");
    }
    sb_str(&b, "}");
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

// Parses a decimal task index written without sign or leading zeros.
static bool parse_task_key(const char *s, size_t len, int *out) {
    if (len == 0 || (len > 1 && s[0] == '0')) return false;
    long long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!is_digit(s[i])) return false;
        v = v * 10 + (s[i] - '0');
        if (v > INT_MAX) return false;
    }
    *out = (int)v;
    return true;
}

// Fills c from a JSON object of jobs. Messages are relative (the caller prefixes them).
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
        if (strlen(m->key) != m->key_len) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "job name \"%s...\" contains a NUL byte",
                           m->key);
            return false;
        }
        if (!check_job_name(m->key, m->key_len, st)) return false;
        const placer_json *v = m->value;
        if (v->kind == PLACER_JSON_ARRAY) {
            if (!get_or_add_job(c, m->key, st)) return false;
            for (size_t t = 0; t < v->n; t++) {
                const placer_json *a = v->items[t];
                if (!placer_json_is_cstring(a)) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "job \"%s\" task %zu must be a \"host:port\" string, got %s",
                                   m->key, t, raw(src, a, r, sizeof r));
                    return false;
                }
                if (t > INT_MAX || !add_task(c, m->key, (int)t, a->str, st)) {
                    if (t > INT_MAX)
                        dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\": too many tasks",
                                       m->key);
                    return false;
                }
            }
        } else if (v->kind == PLACER_JSON_OBJECT) {
            if (!get_or_add_job(c, m->key, st)) return false;
            for (size_t t = 0; t < v->n; t++) {
                const placer_json_member *tm = &v->members[t];
                int index;
                if (!parse_task_key(tm->key, tm->key_len, &index)) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "job \"%s\": task index \"%.*s\" is not a non-negative "
                                   "integer",
                                   m->key, (int)(tm->key_len > 40 ? 40 : tm->key_len), tm->key);
                    return false;
                }
                if (!placer_json_is_cstring(tm->value)) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT,
                                   "job \"%s\" task %d must be a \"host:port\" string, got %s",
                                   m->key, index, raw(src, tm->value, r, sizeof r));
                    return false;
                }
                if (!add_task(c, m->key, index, tm->value->str, st)) return false;
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
        oom(st, sizeof *c);
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

// Adds the comma-separated addresses in [s, s+len) as tasks 0.. of job.
static bool add_host_list(dg_cluster *c, const char *job, const char *s, size_t len,
                          dg_status *st) {
    if (!get_or_add_job(c, job, st)) return false;
    int index = 0;
    size_t i = 0;
    for (;;) {
        size_t start = i;
        while (i < len && s[i] != ',') i++;
        if (i == start) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "job \"%s\" task %d: empty address", job,
                           index);
            return false;
        }
        char *addr = strndup(s + start, i - start);
        if (!addr) return oom(st, i - start + 1);
        bool ok = add_task(c, job, index, addr, st);
        free(addr);
        if (!ok) return false;
        index++;
        if (i == len) break;
        i++;   // the ','; a trailing one leaves an empty address and fails above
    }
    return true;
}

dg_cluster *dg_cluster_from_spec_string(const char *spec, dg_status *st) {
    dg_status_reset(st);
    if (!spec) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec: NULL string");
        return NULL;
    }
    dg_cluster *c = dg_cluster_new();
    char *job = NULL;
    if (!c) {
        oom(st, sizeof *c);
        return NULL;
    }
    if (spec[0] == '\0') {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec \"\": empty");
        goto fail;
    }
    const char *p = spec;
    for (;;) {
        const char *end = strchr(p, ';');
        if (!end) end = p + strlen(p);
        size_t len = (size_t)(end - p);
        if (len == 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec \"%s\": empty job at offset %zu",
                           spec, (size_t)(p - spec));
            goto fail;
        }
        const char *bar = memchr(p, '|', len);
        if (!bar) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec \"%s\": job \"%.*s\" has no \"|\"",
                           spec, (int)len, p);
            goto fail;
        }
        size_t jlen = (size_t)(bar - p);
        job = strndup(p, jlen);
        if (!job) {
            oom(st, jlen + 1);
            goto fail;
        }
        if (!check_job_name(job, jlen, st)) {
            dg_status_prepend(st, "cluster spec \"%s\"", spec);
            goto fail;
        }
        if (dg_cluster_has_job(c, job)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec \"%s\": job \"%s\" appears twice",
                           spec, job);
            goto fail;
        }
        size_t tlen = len - jlen - 1;
        if (tlen == 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster spec \"%s\": job \"%s\" has no tasks",
                           spec, job);
            goto fail;
        }
        if (!add_host_list(c, job, bar + 1, tlen, st)) {
            dg_status_prepend(st, "cluster spec \"%s\"", spec);
            goto fail;
        }
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

dg_cluster *dg_cluster_from_flags(const char *ps_hosts, const char *worker_hosts,
                                  dg_status *st) {
    dg_status_reset(st);
    dg_cluster *c = dg_cluster_new();
    if (!c) {
        oom(st, sizeof *c);
        return NULL;
    }
    if (ps_hosts && *ps_hosts && !add_host_list(c, "ps", ps_hosts, strlen(ps_hosts), st)) {
        dg_status_prepend(st, "--ps_hosts \"%s\"", ps_hosts);
        goto fail;
    }
    if (worker_hosts && *worker_hosts &&
        !add_host_list(c, "worker", worker_hosts, strlen(worker_hosts), st)) {
        dg_status_prepend(st, "--worker_hosts \"%s\"", worker_hosts);
        goto fail;
    }
    return c;
fail:
    dg_cluster_free(&c);
    return NULL;
}

// ---- TF_CONFIG ----

static bool tf_err(dg_status *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool tf_err(dg_status *st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dg_status_vsetf(st, DG_INVALID_ARGUMENT, fmt, ap);
    va_end(ap);
    dg_status_prepend(st, "TF_CONFIG");
    return false;
}

// Validates the task against the cluster as multi_worker_util._validate_cluster_spec.
static bool check_task(const dg_tf_config *cfg, dg_status *st) {
    const dg_cluster *c = cfg->cluster;
    if (dg_cluster_num_tasks(c, "chief") > 1)
        return tf_err(st, "\"cluster\": job \"chief\" has %d tasks, at most 1 is allowed",
                      dg_cluster_num_tasks(c, "chief"));
    if (dg_cluster_num_tasks(c, "evaluator") > 1)
        return tf_err(st, "\"cluster\": job \"evaluator\" has %d tasks, at most 1 is allowed",
                      dg_cluster_num_tasks(c, "evaluator"));
    if (cfg->task_type[0] == '\0') return true;
    const cl_job *j = lookup_job(c, cfg->task_type);
    if (!j) {
        // The evaluator runs beside the cluster and need not be listed in it.
        if (strcmp(cfg->task_type, "evaluator") == 0) return true;
        if (!c) return tf_err(st, "\"task.type\" is \"%s\" but there is no \"cluster\"",
                              cfg->task_type);
        return tf_err(st, "\"task.type\" \"%s\" is not a job in \"cluster\"", cfg->task_type);
    }
    if (find_task(j, cfg->task_index) < 0) {
        bool dense = j->n_tasks == 0 || j->tasks[j->n_tasks - 1].index == j->n_tasks - 1;
        if (dense)
            return tf_err(st, "\"task.index\" %d is out of range: job \"%s\" has %d task%s",
                          cfg->task_index, j->name, j->n_tasks, j->n_tasks == 1 ? "" : "s");
        return tf_err(st, "\"task.index\" %d is out of range: job \"%s\" has no task %d",
                      cfg->task_index, j->name, cfg->task_index);
    }
    return true;
}

static bool parse_task(dg_tf_config *out, const char *json, const placer_json *task,
                       dg_status *st) {
    char r[48];
    if (task->kind != PLACER_JSON_OBJECT)
        return tf_err(st, "\"task\" must be an object, got %s", raw(json, task, r, sizeof r));
    const placer_json *type = placer_json_get(task, "type");
    const placer_json *index = placer_json_get(task, "index");
    if (!type) return tf_err(st, "\"task\" has no \"type\"");
    if (!index) return tf_err(st, "\"task\" has no \"index\"");
    if (!placer_json_is_cstring(type))
        return tf_err(st, "\"task.type\" must be a string, got %s", raw(json, type, r, sizeof r));
    if (type->str_len == 0) return tf_err(st, "\"task.type\" is empty");
    if (type->str_len >= sizeof out->task_type)
        return tf_err(st, "\"task.type\" \"%.40s...\" is longer than %zu bytes", type->str,
                      sizeof out->task_type - 1);
    if (index->kind != PLACER_JSON_NUMBER || !index->is_int)
        return tf_err(st, "\"task.index\" must be an integer, got %s",
                      raw(json, index, r, sizeof r));
    if (index->integer < 0 || index->integer > INT_MAX)
        return tf_err(st, "\"task.index\" must be in 0..%d, got %s", INT_MAX,
                      raw(json, index, r, sizeof r));
    memcpy(out->task_type, type->str, type->str_len + 1);
    out->task_index = (int)index->integer;
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

bool dg_tf_config_parse(const char *json, dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    char r[48];
    if (!out) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "TF_CONFIG: NULL output");
        return false;
    }
    tf_config_reset(out);
    if (!json) return tf_err(st, "NULL string");
    placer_json *root = placer_json_parse(json, strlen(json), "TF_CONFIG", st);
    if (!root) return false;
    if (root->kind != PLACER_JSON_OBJECT) {
        tf_err(st, "must be a JSON object, got %s", raw(json, root, r, sizeof r));
        goto fail;
    }
    // Other keys ("environment", "session_master", ...) are TensorFlow's business, not ours,
    // but one a letter or two away from a key we read is a typo that would silently drop it.
    for (size_t i = 0; i < root->n; i++) {
        const char *k = root->members[i].key;
        static const char *const ours[] = {"cluster", "task", "rpc_layer"};
        for (size_t j = 0; j < sizeof ours / sizeof *ours; j++) {
            if (strcmp(k, ours[j]) != 0 && !placer_json_get(root, ours[j]) && edit_distance_at_most2(k, ours[j])) {
                tf_err(st, "unknown key \"%s\" at byte %zu (did you mean \"%s\"?)", k, root->members[i].key_offset,
                       ours[j]);
                goto fail;
            }
        }
    }
    const placer_json *cluster = placer_json_get(root, "cluster");
    if (cluster) {
        out->cluster = dg_cluster_new();
        if (!out->cluster) {
            oom(st, sizeof(dg_cluster));
            goto fail;
        }
        if (!cluster_from_dom(out->cluster, json, cluster, st)) {
            dg_status_prepend(st, "TF_CONFIG: \"cluster\"");
            goto fail;
        }
    }
    const placer_json *task = placer_json_get(root, "task");
    if (task && !parse_task(out, json, task, st)) goto fail;
    const placer_json *rpc = placer_json_get(root, "rpc_layer");
    if (rpc) {
        if (!placer_json_is_cstring(rpc)) {
            tf_err(st, "\"rpc_layer\" must be a string, got %s", raw(json, rpc, r, sizeof r));
            goto fail;
        }
        if (rpc->str_len >= sizeof out->rpc_layer) {
            tf_err(st, "\"rpc_layer\" \"%s\" is longer than %zu bytes", rpc->str,
                   sizeof out->rpc_layer - 1);
            goto fail;
        }
        memcpy(out->rpc_layer, rpc->str, rpc->str_len + 1);
    }
    if (!check_task(out, st)) goto fail;
    // multi_worker_util.is_chief, except that the evaluator is not a chief here: in a
    // parameter-server cluster it must not initialize or save the variables.
    out->is_chief = strcmp(out->task_type, "chief") == 0 ||
                    (strcmp(out->task_type, "worker") == 0 && out->task_index == 0 &&
                     !dg_cluster_has_job(out->cluster, "chief"));
    placer_json_free(&root);
    return true;
fail:
    placer_json_free(&root);
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
