/* A cluster from a Slurm allocation, after TensorFlow's SlurmClusterResolver: the allocation's
 * node list and tasks per node give an ordered list of slots (host:port_base, host:port_base+1,
 * ... for each node in order); the jobs, taken in name order, get consecutive slots; this
 * process's rank (SLURM_PROCID) names its slot, hence its job and index. */
#include "base_impl.h"
#include "distgraph/slurm.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HOSTS 65536        // more is a malformed list ("n[0-999999999]"), not a cluster
#define MAX_HOST_LEN 255

typedef struct hostvec {
    char **v;
    int n, cap;
} hostvec;

static bool push_host(hostvec *h, const char *s, size_t len, dg_status *st) {
    if (h->n >= MAX_HOSTS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "more than %d hosts", MAX_HOSTS);
        return false;
    }
    char *c = malloc(len + 1);
    if (!c) abort();
    memcpy(c, s, len);
    c[len] = '\0';
    BASE_PUSH(h->v, h->n, h->cap, c);   // at most MAX_HOSTS
    return true;
}

void dg_slurm_hosts_free(char **hosts, int n) {
    for (int i = 0; i < n; i++) free(hosts[i]);
    free(hosts);
}

// A decimal number of 1 to 9 digits at s[*i]; its digit count in *width.
static bool number(const char *s, size_t *i, long *out, int *width) {
    size_t j = *i;
    while (isdigit((unsigned char)s[j]) && j - *i < 10) j++;
    if (j == *i || j - *i > 9) return false;
    *out = strtol(s + *i, NULL, 10);
    *width = (int)(j - *i);
    *i = j;
    return true;
}

// Expands one host expression (no top-level comma) of length len: text with bracket groups
// "[1-3,07]", each group multiplying the names (leading zeros of a range's start kept, as
// Slurm writes them). Appends to h.
static bool expand_one(const char *e, size_t len, hostvec *h, size_t *bad, dg_status *st) {
    // Where the first bracket group is; none: a plain name.
    size_t open = 0;
    while (open < len && e[open] != '[') {
        if (e[open] == ']' || isspace((unsigned char)e[open])) {
            *bad = open;
            dg_status_setf(st, DG_INVALID_ARGUMENT, "unexpected '%c'", e[open]);
            return false;
        }
        open++;
    }
    if (open == len) {
        if (len == 0) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "an empty host name");
            return false;
        }
        if (len > MAX_HOST_LEN) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "a host name longer than %d bytes", MAX_HOST_LEN);
            return false;
        }
        return push_host(h, e, len, st);
    }
    size_t close = open + 1;
    while (close < len && e[close] != ']') close++;
    if (close == len) {
        *bad = open;
        dg_status_set(st, DG_INVALID_ARGUMENT, "'[' without ']'");
        return false;
    }
    if (close == open + 1) {
        *bad = open;
        dg_status_set(st, DG_INVALID_ARGUMENT, "an empty range \"[]\"");
        return false;
    }
    // Each value of the group, then the rest of the expression after it.
    size_t i = open + 1;
    while (i < close) {
        long lo, hi;
        int width, w2;
        size_t at = i;
        if (!number(e, &i, &lo, &width)) {
            *bad = at;
            dg_status_set(st, DG_INVALID_ARGUMENT, "a range must hold numbers of at most 9 digits");
            return false;
        }
        hi = lo;
        if (e[i] == '-') {
            i++;
            size_t at2 = i;
            if (!number(e, &i, &hi, &w2)) {
                *bad = at2;
                dg_status_set(st, DG_INVALID_ARGUMENT, "a range needs a number after '-'");
                return false;
            }
            if (hi < lo) {
                *bad = at;
                dg_status_setf(st, DG_INVALID_ARGUMENT, "the range %ld-%ld runs backwards", lo, hi);
                return false;
            }
        }
        if (e[i] != ',' && i != close) {
            *bad = i;
            dg_status_setf(st, DG_INVALID_ARGUMENT, "unexpected '%c' in a range", e[i]);
            return false;
        }
        if (e[i] == ',') {
            i++;
            if (i == close) {
                *bad = i;
                dg_status_set(st, DG_INVALID_ARGUMENT, "a range ends with ','");
                return false;
            }
        }
        if (hi - lo >= MAX_HOSTS) {
            *bad = at;
            dg_status_setf(st, DG_INVALID_ARGUMENT, "more than %d hosts", MAX_HOSTS);
            return false;
        }
        for (long v = lo; v <= hi; v++) {
            char buf[MAX_HOST_LEN + 32];
            int n = snprintf(buf, sizeof buf, "%.*s%0*ld", (int)open, e, width, v);
            size_t rest = len - close - 1;
            if ((size_t)n + rest > MAX_HOST_LEN) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "a host name longer than %d bytes", MAX_HOST_LEN);
                return false;
            }
            memcpy(buf + n, e + close + 1, rest);
            size_t sub_bad = 0;
            if (!expand_one(buf, (size_t)n + rest, h, &sub_bad, st)) {
                // Offsets in the rest of the expression map back past the group.
                *bad = sub_bad >= (size_t)n ? close + 1 + (sub_bad - (size_t)n) : close;
                return false;
            }
        }
    }
    return true;
}

int dg_slurm_expand_nodelist(const char *nodelist, char ***hosts, dg_status *st) {
    dg_status_reset(st);
    if (hosts) *hosts = NULL;
    if (!nodelist || !hosts) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Slurm node list: no list given");
        return -1;
    }
    hostvec h = {0};
    size_t n = strlen(nodelist), start = 0;
    if (n == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Slurm node list is empty");
        return -1;
    }
    int depth = 0;
    for (size_t i = 0; i <= n; i++) {
        char c = nodelist[i];
        if (c == '[') depth++;
        if (c == ']') depth--;
        if ((c == ',' && depth == 0) || c == '\0') {
            size_t bad = 0;
            if (depth != 0 && c == '\0') depth = 0;   // expand_one names the open bracket
            if (!expand_one(nodelist + start, i - start, &h, &bad, st)) {
                dg_status_prepend(st, "Slurm node list \"%s\" at byte %zu", nodelist, start + bad);
                dg_slurm_hosts_free(h.v, h.n);
                return -1;
            }
            start = i + 1;
        }
    }
    *hosts = h.v;
    return h.n;
}

// "2(x3),1" (SLURM_TASKS_PER_NODE) into n per-node counts. Returns the count of nodes it
// describes, -1 on error.
static int expand_tasks_per_node(const char *spec, int **out, dg_status *st) {
    *out = NULL;
    int *v = NULL, n = 0, cap = 0;
    size_t i = 0, len = strlen(spec);
    if (len == 0) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "tasks per node \"\" is empty");
        return -1;
    }
    while (i < len) {
        long count, times = 1;
        int w;
        size_t at = i;
        if (!number(spec, &i, &count, &w) || count < 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "tasks per node \"%s\" at byte %zu: expected a count of 1 or more",
                           spec, at);
            free(v);
            return -1;
        }
        if (spec[i] == '(') {
            size_t at2 = i;
            i++;
            if (spec[i] != 'x' || (i++, !number(spec, &i, &times, &w)) || times < 1 || spec[i] != ')') {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "tasks per node \"%s\" at byte %zu: a repeat is written \"(xN)\", N >= 1", spec, at2);
                free(v);
                return -1;
            }
            i++;
        }
        if (spec[i] == ',') {
            i++;
            if (i == len) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "tasks per node \"%s\" ends with ','", spec);
                free(v);
                return -1;
            }
        } else if (i < len) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "tasks per node \"%s\" at byte %zu: unexpected '%c'", spec, i,
                           spec[i]);
            free(v);
            return -1;
        }
        if (n + times > MAX_HOSTS) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "tasks per node \"%s\" describes more than %d nodes", spec,
                           MAX_HOSTS);
            free(v);
            return -1;
        }
        base_reserve((void **)&v, sizeof *v, n, &cap, (int)times);   // at most MAX_HOSTS in all
        for (long k = 0; k < times; k++) v[n++] = (int)count;
    }
    *out = v;
    return n;
}

typedef struct slurm_job {
    char name[64];
    int tasks;
} slurm_job;

static int job_cmp(const void *a, const void *b) {
    return strcmp(((const slurm_job *)a)->name, ((const slurm_job *)b)->name);
}

// "ps:1,worker:3" into jobs sorted by name.
static int parse_jobs(const char *spec, slurm_job **out, dg_status *st) {
    *out = NULL;
    if (!spec || !*spec) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Slurm jobs: none given (e.g. \"ps:1,worker:3\")");
        return -1;
    }
    int n = 0, cap = 0;
    slurm_job *v = NULL;
    const char *p = spec;
    while (*p) {
        const char *colon = strchr(p, ':'), *comma = strchr(p, ',');
        if (!comma) comma = p + strlen(p);
        if (!colon || colon > comma || colon == p || (size_t)(colon - p) >= sizeof v->name) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm jobs \"%s\": \"%.*s\" is not JOB:COUNT", spec,
                           (int)(comma - p), p);
            free(v);
            return -1;
        }
        char *end;
        errno = 0;
        long count = strtol(colon + 1, &end, 10);
        if (end != comma || colon + 1 == comma || errno || count < 1 || count > MAX_HOSTS) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm jobs \"%s\": the count of \"%.*s\" must be 1 to %d", spec,
                           (int)(colon - p), p, MAX_HOSTS);
            free(v);
            return -1;
        }
        base_reserve((void **)&v, sizeof *v, n, &cap, 1);   // a job per comma of a short string
        snprintf(v[n].name, sizeof v[n].name, "%.*s", (int)(colon - p), p);
        v[n].tasks = (int)count;
        for (int k = 0; k < n; k++)
            if (strcmp(v[k].name, v[n].name) == 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm jobs \"%s\": job \"%s\" is listed twice", spec,
                               v[n].name);
                free(v);
                return -1;
            }
        n++;
        p = *comma ? comma + 1 : comma;
        if (*comma && !*p) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm jobs \"%s\" ends with ','", spec);
            free(v);
            return -1;
        }
    }
    qsort(v, (size_t)n, sizeof *v, job_cmp);
    *out = v;
    return n;
}

bool dg_slurm_resolve(const dg_slurm_options *o, const char *nodelist, const char *tasks_per_node, int rank,
                      dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    if (!o || !out) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "Slurm: options and out are required");
        return false;
    }
    memset(out, 0, sizeof *out);
    out->task_index = -1;
    int port_base = o->port_base ? o->port_base : DG_SLURM_DEFAULT_PORT_BASE;
    if (port_base < 1 || port_base > 65535) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm: port base %d is not a port (1..65535)", port_base);
        return false;
    }
    char **hosts = NULL;
    int *per = NULL;
    slurm_job *jobs = NULL;
    dg_cluster *c = NULL;
    bool ok = false;
    int n_hosts = dg_slurm_expand_nodelist(nodelist, &hosts, st);
    if (n_hosts < 0) goto out;
    if (o->tasks_per_node > 0) {
        per = malloc((size_t)n_hosts * sizeof *per);
        if (!per) abort();
        for (int i = 0; i < n_hosts; i++) per[i] = o->tasks_per_node;
    } else {
        if (!tasks_per_node) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "Slurm: tasks per node unknown (no SLURM_TASKS_PER_NODE, no option)");
            goto out;
        }
        int n_per = expand_tasks_per_node(tasks_per_node, &per, st);
        if (n_per < 0) {
            dg_status_prepend(st, "Slurm");
            goto out;
        }
        if (n_per != n_hosts) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "Slurm: tasks per node \"%s\" describes %d node%s, the node list \"%s\" has %d", tasks_per_node,
                           n_per, n_per == 1 ? "" : "s", nodelist, n_hosts);
            goto out;
        }
    }
    int n_jobs = parse_jobs(o->jobs, &jobs, st);
    if (n_jobs < 0) goto out;
    long slots = 0, wanted = 0;
    for (int i = 0; i < n_hosts; i++) {
        if (port_base + per[i] - 1 > 65535) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm: %d tasks on %s from port %d run past port 65535", per[i],
                           hosts[i], port_base);
            goto out;
        }
        slots += per[i];
    }
    for (int j = 0; j < n_jobs; j++) wanted += jobs[j].tasks;
    if (wanted > slots) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "Slurm: the jobs \"%s\" ask for %ld tasks, the allocation has %ld slot%s (%d node%s)", o->jobs,
                       wanted, slots, slots == 1 ? "" : "s", n_hosts, n_hosts == 1 ? "" : "s");
        goto out;
    }
    if (rank < 0 || rank >= wanted) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "Slurm: this process's rank (SLURM_PROCID) %d has no task: the jobs \"%s\" take ranks 0 to %ld",
                       rank, o->jobs, wanted - 1);
        goto out;
    }
    // Slots in order, jobs in name order.
    c = dg_cluster_new();
    int host = 0, slot_on_host = 0;
    long r = 0;
    for (int j = 0; j < n_jobs; j++) {
        for (int t = 0; t < jobs[j].tasks; t++, r++) {
            while (slot_on_host >= per[host]) {
                host++;
                slot_on_host = 0;
            }
            char addr[MAX_HOST_LEN + 16];
            snprintf(addr, sizeof addr, "%s:%d", hosts[host], port_base + slot_on_host);
            slot_on_host++;
            if (!dg_cluster_add_task(c, jobs[j].name, t, addr, st)) {
                dg_status_prepend(st, "Slurm");
                goto out;
            }
            if (r == rank) {
                snprintf(out->task_type, sizeof out->task_type, "%s", jobs[j].name);
                out->task_index = t;
            }
        }
    }
    out->is_chief = strcmp(out->task_type, "chief") == 0 ||
                    (strcmp(out->task_type, "worker") == 0 && out->task_index == 0 && !dg_cluster_has_job(c, "chief"));
    out->cluster = c;
    c = NULL;
    ok = true;
out:
    dg_cluster_free(&c);
    if (hosts) dg_slurm_hosts_free(hosts, n_hosts);
    free(per);
    free(jobs);
    if (!ok) {
        out->task_type[0] = '\0';
        out->task_index = -1;
    }
    return ok;
}

static const char *env_first(const char *a, const char *b) {
    const char *v = getenv(a);
    if (v && *v) return v;
    v = getenv(b);
    return v && *v ? v : NULL;
}

bool dg_slurm_from_env(const dg_slurm_options *o, dg_tf_config *out, dg_status *st) {
    dg_status_reset(st);
    // A job step's variables first (srun), as TensorFlow's resolver reads them.
    const char *nodes = env_first("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST");
    const char *per = env_first("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE");
    const char *procid = getenv("SLURM_PROCID");
    if (out) {
        memset(out, 0, sizeof *out);
        out->task_index = -1;
    }
    if (!nodes || !procid || !*procid) {
        dg_status_set(st, DG_NOT_FOUND,
                      "Slurm: not inside a Slurm job step (SLURM_JOB_NODELIST and SLURM_PROCID are not set; start "
                      "the tasks with srun)");
        return false;
    }
    char *end;
    errno = 0;
    long rank = strtol(procid, &end, 10);
    if (*end || errno || rank < 0 || rank > INT_MAX) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "Slurm: SLURM_PROCID \"%s\" is not a rank", procid);
        return false;
    }
    return dg_slurm_resolve(o, nodes, per, (int)rank, out, st);
}
