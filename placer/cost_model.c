/* The cost model of the automatic placer: an op's time on a device type is its measured time
 * when one was given, else its overhead plus the longer of its FLOPs over the type's compute
 * rate and its bytes over the type's memory rate (a roofline); a transfer is a link's latency
 * plus bytes over its bandwidth, the link chosen by whether the two devices share a task or a
 * host. The figures come from a calibration file or are nominal. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "distgraph/device_name.h"
#include "graph_impl.h"
#include "json_impl.h"
#include "placer_impl.h"

static const char *const link_names[3] = {"same_task", "same_host", "other_host"};

dg_cost_model *dg_cost_model_new(void) {
    dg_cost_model *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    snprintf(m->types[0], sizeof m->types[0], "CPU");
    m->perf[0] = (dg_device_perf){50e9, 10e9, 2e-6};
    snprintf(m->types[1], sizeof m->types[1], "GPU");
    m->perf[1] = (dg_device_perf){50e12, 2e12, 8e-6};
    m->n_types = 2;
    m->links[DG_LINK_SAME_TASK] = (dg_link_perf){2e-6, 20e9};
    m->links[DG_LINK_SAME_HOST] = (dg_link_perf){20e-6, 5e9};
    m->links[DG_LINK_OTHER_HOST] = (dg_link_perf){100e-6, 1.25e9};
    return m;
}

void dg_cost_model_free(dg_cost_model **mp) {
    if (!mp || !*mp) return;
    dg_cost_model *m = *mp;
    for (int i = 0; i < m->n_hosts; i++) free(m->hosts[i].job);
    free(m->hosts);
    for (int i = 0; i < m->n_measured; i++) free(m->measured_items[i].key);
    free(m->measured_items);
    graph_strmap_clear(&m->measured);
    free(m);
    *mp = NULL;
}

// Rates from 1 to 1e18 a second, times from 0 to 1e4 s: figures a machine can have, and that
// keep every product of the simulator finite.
static bool rate_ok(double v) { return v >= 1 && v <= 1e18; }
static bool time_ok(double v) { return v >= 0 && v <= 1e4; }

bool dg_cost_model_set_device(dg_cost_model *m, const char *type, dg_device_perf perf, dg_status *st) {
    dg_status_reset(st);
    if (!m || !type || !type[0] || strlen(type) >= sizeof m->types[0]) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "cost model: a device type is a non-empty name of under 32 bytes");
        return false;
    }
    if (!rate_ok(perf.flops_per_s) || !rate_ok(perf.bytes_per_s) || !time_ok(perf.op_overhead_s)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "cost model: device type %s: flops_per_s and bytes_per_s must be positive (1 to 1e18) "
                       "and op_overhead_s from 0 to 1e4 seconds (got %g, %g, %g)",
                       type, perf.flops_per_s, perf.bytes_per_s, perf.op_overhead_s);
        return false;
    }
    int t;
    for (t = 0; t < m->n_types && strcmp(m->types[t], type) != 0; t++) {}
    if (t == m->n_types) {
        if (t == PLACER_MAX_TYPES) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "cost model: at most %d device types", PLACER_MAX_TYPES);
            return false;
        }
        snprintf(m->types[t], sizeof m->types[t], "%s", type);
        m->n_types++;
    }
    m->perf[t] = perf;
    return true;
}

bool dg_cost_model_set_link(dg_cost_model *m, dg_link_kind kind, dg_link_perf perf, dg_status *st) {
    dg_status_reset(st);
    if (!m || (int)kind < 0 || (int)kind > 2) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model: no link kind %d", (int)kind);
        return false;
    }
    if (!rate_ok(perf.bytes_per_s) || !time_ok(perf.latency_s)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "cost model: link %s: bytes_per_s must be positive (1 to 1e18) and latency_s from 0 to "
                       "1e4 seconds (got %g, %g)",
                       link_names[kind], perf.bytes_per_s, perf.latency_s);
        return false;
    }
    m->links[kind] = perf;
    return true;
}

bool dg_cost_model_set_hosts(dg_cost_model *m, const dg_cluster *c, dg_status *st) {
    dg_status_reset(st);
    for (int i = 0; i < m->n_hosts; i++) free(m->hosts[i].job);
    m->n_hosts = 0;
    char **names = NULL;
    int n_names = 0, cap_names = 0;
    bool ok = true;
    for (int j = 0; ok && j < dg_cluster_num_jobs(c); j++) {
        const char *job = dg_cluster_job(c, j);
        for (int k = 0; ok && k < dg_cluster_num_tasks(c, job); k++) {
            int task = dg_cluster_task_index(c, job, k);
            const char *addr = dg_cluster_task_address(c, job, task, NULL);
            if (!addr) continue;
            const char *colon = strrchr(addr, ':');
            size_t len = colon ? (size_t)(colon - addr) : strlen(addr);
            int h;
            for (h = 0; h < n_names && !(strlen(names[h]) == len && memcmp(names[h], addr, len) == 0); h++) {}
            if (h == n_names) {
                if (n_names >= PLACER_MAX_HOSTS || !BASE_GROW(names, n_names, cap_names, 1, "cost model hosts", st)) {
                    if (n_names >= PLACER_MAX_HOSTS)
                        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "cost model: more than %d hosts", PLACER_MAX_HOSTS);
                    ok = false;
                    break;
                }
                if (!(names[n_names] = strndup(addr, len))) {
                    ok = base_oom(st, "cost model hosts", len);
                    break;
                }
                n_names++;
            }
            if (!BASE_GROW(m->hosts, m->n_hosts, m->cap_hosts, 1, "cost model tasks", st)) {
                ok = false;
                break;
            }
            char *jc = strdup(job);
            if (!jc) {
                ok = base_oom(st, "cost model tasks", strlen(job));
                break;
            }
            m->hosts[m->n_hosts++] = (placer_host){jc, task, h};
        }
    }
    for (int h = 0; h < n_names; h++) free(names[h]);
    free(names);
    return ok;
}

int placer_task_host(const dg_cost_model *m, const char *job, int task) {
    for (int i = 0; i < m->n_hosts; i++)
        if (m->hosts[i].task == task && strcmp(m->hosts[i].job, job) == 0) return m->hosts[i].host;
    return -1;
}

bool dg_cost_model_set_measured(dg_cost_model *m, const char *node_name, const char *type, double seconds,
                                dg_status *st) {
    dg_status_reset(st);
    if (!node_name || !type || !type[0] || strchr(type, '\t') || !time_ok(seconds)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model: a measured time needs a node, a device type (no tab) "
                       "and a time from 0 to 1e4 seconds (node %s: %g)", node_name ? node_name : "(null)", seconds);
        return false;
    }
    char *key = malloc(strlen(type) + strlen(node_name) + 2);
    if (!key) return base_oom(st, "cost model", strlen(node_name));
    sprintf(key, "%s\t%s", type, node_name);
    void *v = graph_strmap_get(&m->measured, key);
    if (v) {
        m->measured_items[(intptr_t)v - 1].s = seconds;
        free(key);
        return true;
    }
    if (!BASE_GROW(m->measured_items, m->n_measured, m->cap_measured, 1, "cost model", st) ||
        !graph_strmap_put(&m->measured, key, (void *)(intptr_t)(m->n_measured + 1))) {
        free(key);
        if (dg_status_ok(st)) base_oom(st, "cost model", 0);
        return false;
    }
    m->measured_items[m->n_measured++] = (struct placer_measured){key, seconds};
    return true;
}

const dg_device_perf *placer_device_perf(const dg_cost_model *m, const char *type) {
    for (int t = 0; t < m->n_types; t++)
        if (strcmp(m->types[t], type) == 0) return &m->perf[t];
    for (int t = 0; t < m->n_types; t++)
        if (strcasecmp(m->types[t], type) == 0) return &m->perf[t];
    return &m->perf[0];
}

// ---- work of an op ----

// Elements of s (unknown dimensions as unknown_dim); -1 when unknown; capped at 2^50 (a size
// no device holds, which keeps every sum of them far from overflowing).
static int64_t elements(dg_shape s, int64_t unknown_dim) {
    if (s.rank < 0) return -1;
    const int64_t cap = (int64_t)1 << 50;
    int64_t e = 1;
    for (int i = 0; i < s.rank; i++) {
        int64_t d = s.dims[i] >= 0 ? s.dims[i] : unknown_dim;
        if (d <= 0 && s.dims[i] < 0) return -1;
        if (__builtin_mul_overflow(e, d, &e) || e > cap) e = cap;
    }
    return e;
}

int64_t placer_output_bytes(const dg_node *n, int i, int64_t unknown_dim) {
    int64_t e = elements(n->out_shapes[i], unknown_dim);
    if (e < 0) return -1;
    size_t sz = dg_dtype_size(n->out_dtypes[i]);
    return e * (int64_t)(sz ? sz : 8);   // at most 2^53
}

static int64_t input_bytes(const dg_node *n, int i, int64_t unknown_dim) {
    return placer_output_bytes(n->inputs[i].node, n->inputs[i].index, unknown_dim);
}

static int64_t dim(dg_shape s, int i, int64_t unknown_dim) {
    if (i < 0) i += s.rank;
    if (i < 0 || i >= s.rank) return -1;
    return s.dims[i] >= 0 ? s.dims[i] : (unknown_dim > 0 ? unknown_dim : -1);
}

bool placer_op_is_free(const dg_node *n) {
    static const char *const free_ops[] = {"Const", "Placeholder", "VariableV2", "NoOp", "Identity",
                                           "Reshape", "Shape", "StopGradient", "_Send", "_Recv",
                                           "IsVariableInitialized"};
    for (size_t i = 0; i < sizeof free_ops / sizeof *free_ops; i++)
        if (strcmp(n->op->name, free_ops[i]) == 0) return true;
    return false;
}

bool placer_op_work(const dg_node *n, int64_t unknown_dim, double *flops_out, double *bytes_out) {
    double flops = 0, bytes = 0;
    *flops_out = *bytes_out = 0;
    if (placer_op_is_free(n)) return true;
    for (int i = 0; i < n->n_inputs; i++) {
        int64_t b = input_bytes(n, i, unknown_dim);
        if (b < 0) return false;
        bytes += (double)b;
    }
    double out_elems = 0;
    for (int i = 0; i < n->n_outputs; i++) {
        int64_t b = placer_output_bytes(n, i, unknown_dim);
        if (b < 0) return false;
        bytes += (double)b;
        out_elems += (double)elements(n->out_shapes[i], unknown_dim);
    }
    const char *op = n->op->name;
    if (strcmp(op, "MatMul") == 0 || strcmp(op, "BatchMatMulV2") == 0) {
        bool ta = false;
        dg_node_attr_bool(n, strcmp(op, "MatMul") == 0 ? "transpose_a" : "adj_x", &ta);
        int64_t k = dim(dg_output_shape(n->inputs[0]), ta ? -2 : -1, unknown_dim);
        if (k < 0) return false;
        flops = 2.0 * out_elems * (double)k;
    } else if (strcmp(op, "Conv2D") == 0 || strcmp(op, "Conv2DBackpropInput") == 0 ||
               strcmp(op, "Conv2DBackpropFilter") == 0) {
        // Filter [kh, kw, ci, co]: 2 kh kw ci FLOPs per element of the forward output.
        dg_shape f = strcmp(op, "Conv2DBackpropFilter") == 0 ? n->out_shapes[0] : dg_output_shape(n->inputs[1]);
        dg_shape y = strcmp(op, "Conv2D") == 0 ? n->out_shapes[0] : dg_output_shape(n->inputs[2]);
        int64_t kh = dim(f, 0, unknown_dim), kw = dim(f, 1, unknown_dim), ci = dim(f, 2, unknown_dim);
        int64_t ye = elements(y, unknown_dim);
        if (kh < 0 || kw < 0 || ci < 0 || ye < 0) return false;
        flops = 2.0 * (double)ye * (double)(kh * kw * ci);
    } else if (strcmp(op, "ScaledDotProductAttention") == 0 || strcmp(op, "ScaledDotProductAttentionGrad") == 0) {
        // q [..., Tq, D], k [..., Tk, D]: scores and the weighted sum, 4 Tq Tk D a batch-head;
        // the gradient twice that.
        bool grad = strcmp(op, "ScaledDotProductAttentionGrad") == 0;
        dg_shape q = dg_output_shape(n->inputs[grad ? 1 : 0]), k = dg_output_shape(n->inputs[grad ? 2 : 1]);
        int64_t qe = elements(q, unknown_dim), tk = dim(k, -2, unknown_dim);
        if (qe < 0 || tk < 0) return false;
        flops = (grad ? 8.0 : 4.0) * (double)qe * (double)tk;
    } else {
        flops = out_elems;   // an operation or so an element: the bytes decide
    }
    *flops_out = flops;
    *bytes_out = bytes;
    return true;
}

double dg_cost_model_op_seconds(const dg_cost_model *m, const dg_node *n, const char *type, double *flops,
                                double *bytes) {
    return placer_op_seconds(m, n, type, 1, flops, bytes);
}

double placer_op_seconds(const dg_cost_model *m, const dg_node *n, const char *type, int64_t unknown_dim,
                         double *flops, double *bytes) {
    double f = 0, b = 0;
    bool known = placer_op_work(n, unknown_dim > 0 ? unknown_dim : 1, &f, &b);
    if (flops) *flops = known ? f : -1;
    if (bytes) *bytes = known ? b : -1;
    if (m->n_measured > 0) {
        size_t len = strlen(type) + strlen(n->name) + 2;
        char small[256], *key = len <= sizeof small ? small : malloc(len);
        void *v = NULL;
        if (key) {
            size_t tl = strlen(type);
            memcpy(key, type, tl);
            key[tl] = '\t';
            memcpy(key + tl + 1, n->name, len - tl - 1);   // with its NUL
            v = graph_strmap_get(&m->measured, key);
            if (key != small) free(key);
        }
        if (v) return m->measured_items[(intptr_t)v - 1].s;
    }
    const dg_device_perf *p = placer_device_perf(m, type);
    if (placer_op_is_free(n)) return p->op_overhead_s * 0.25;
    double c = f / p->flops_per_s, t = b / p->bytes_per_s;
    return p->op_overhead_s + (c > t ? c : t);
}

dg_link_kind dg_cost_model_link_kind(const dg_cost_model *m, const char *a, const char *b) {
    dg_device_name da, db;
    if (!a || !b || !dg_device_name_parse(a, &da, NULL) || !dg_device_name_parse(b, &db, NULL)) return DG_LINK_OTHER_HOST;
    if (strcmp(da.job, db.job) == 0 && da.task == db.task && da.replica == db.replica) return DG_LINK_SAME_TASK;
    int ha = placer_task_host(m, da.job, da.task), hb = placer_task_host(m, db.job, db.task);
    return ha >= 0 && hb >= 0 && ha != hb ? DG_LINK_OTHER_HOST : DG_LINK_SAME_HOST;
}

dg_link_perf dg_cost_model_link(const dg_cost_model *m, dg_link_kind kind) {
    return m->links[(int)kind >= 0 && (int)kind <= 2 ? kind : DG_LINK_OTHER_HOST];
}

dg_link_perf placer_link(const dg_cost_model *m, const char *a, const char *b) {
    return m->links[dg_cost_model_link_kind(m, a, b)];
}

double dg_cost_model_transfer_seconds(const dg_cost_model *m, const char *a, const char *b, double bytes) {
    if (strcmp(a, b) == 0) return 0;
    dg_link_perf l = placer_link(m, a, b);
    return l.latency_s + bytes / l.bytes_per_s;
}
// The index of device type `type` in m, or -1 (m or type NULL, or not known).
static int type_index(const dg_cost_model *m, const char *type) {
    for (int k = 0; m && type && k < m->n_types; k++)
        if (strcmp(m->types[k], type) == 0) return k;
    return -1;
}

bool dg_cost_model_set_task_streams(dg_cost_model *m, const char *type, int n, dg_status *st) {
    dg_status_reset(st);
    int t = type_index(m, type);
    if (t < 0 || n < 0 || n > PLACER_MAX_TASK_STREAMS) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "cost model: task streams of device type %s: the type must be known and the count from 0 "
                       "to %d (got %d)", type ? type : "(null)", PLACER_MAX_TASK_STREAMS, n);
        return false;
    }
    m->task_streams[t] = n;
    return true;
}

int dg_cost_model_task_streams(const dg_cost_model *m, const char *type) {
    int t = type_index(m, type);
    return t < 0 ? 0 : m->task_streams[t];
}

void dg_cost_model_set_handoff(dg_cost_model *m, dg_op_handoff_fn handoff, void *ctx) {
    if (!m) return;
    m->handoff = handoff;
    m->handoff_ctx = handoff ? ctx : NULL;
}

bool dg_cost_model_set_wake(dg_cost_model *m, const char *type, double seconds, dg_status *st) {
    dg_status_reset(st);
    int t = type_index(m, type);
    if (t < 0 || !(seconds >= 0 && seconds <= 1)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "cost model: wake time of device type %s: the type must be known and the time from 0 to 1 "
                       "second (got %g)", type ? type : "(null)", seconds);
        return false;
    }
    m->wake_s[t] = seconds;
    return true;
}

double dg_cost_model_wake(const dg_cost_model *m, const char *type) {
    int t = type_index(m, type);
    return t < 0 ? 0 : m->wake_s[t];
}

// ---- calibration files ----

static bool read_number(const cluster_json *o, const char *key, const char *where, const char *path, double *out,
                        dg_status *st) {
    const cluster_json *v = cluster_json_get(o, key);
    if (!v || v->kind != CLUSTER_JSON_NUMBER) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: %s.%s must be a number", path, where, key);
        return false;
    }
    *out = v->number;
    return true;
}

bool dg_cost_model_load(dg_cost_model *m, const char *path, dg_status *st) {
    dg_status_reset(st);
    FILE *f = fopen(path, "rb");
    if (!f) {
        dg_status_setf(st, DG_NOT_FOUND, "cost model file %s: %s", path, strerror(errno));
        return false;
    }
    char *text = NULL;
    size_t len = 0, cap = 0;
    bool ok = true;
    for (;;) {
        if (len + 4096 > cap) {
            if (cap >= (size_t)16 << 20) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: larger than 16 MiB", path);
                ok = false;
                break;
            }
            cap = cap ? cap * 2 : 8192;
            char *p = realloc(text, cap);
            if (!p) {
                ok = base_oom(st, "cost model file", cap);
                break;
            }
            text = p;
        }
        size_t r = fread(text + len, 1, cap - len, f);
        len += r;
        if (r == 0) break;
    }
    fclose(f);
    cluster_json *root = ok ? cluster_json_parse(text, len, path, st) : NULL;
    free(text);
    if (!root) return false;
    // Read into a copy: a file wrong half way changes nothing.
    dg_cost_model tmp = *m;
    if (root->kind != CLUSTER_JSON_OBJECT) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: the top level must be an object", path);
        ok = false;
    }
    const cluster_json *devs = ok ? cluster_json_get(root, "devices") : NULL;
    if (ok && devs && devs->kind != CLUSTER_JSON_OBJECT) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: \"devices\" must be an object", path);
        ok = false;
    }
    for (size_t i = 0; ok && devs && i < devs->n; i++) {
        const cluster_json_member *mb = &devs->members[i];
        char where[96];
        snprintf(where, sizeof where, "devices.%.40s", mb->key);
        dg_device_perf p;
        if (strlen(mb->key) != mb->key_len) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: a device type holds a NUL character", path);
            ok = false;
            break;
        }
        ok = mb->value->kind == CLUSTER_JSON_OBJECT &&
             read_number(mb->value, "flops_per_s", where, path, &p.flops_per_s, st) &&
             read_number(mb->value, "bytes_per_s", where, path, &p.bytes_per_s, st) &&
             read_number(mb->value, "op_overhead_s", where, path, &p.op_overhead_s, st);
        if (!ok && dg_status_ok(st))
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: %s must be an object", path, where);
        if (ok && !dg_cost_model_set_device(&tmp, mb->key, p, st)) {
            dg_status_prepend(st, "cost model file %s", path);
            ok = false;
        }
        // Optional: how many streams a task's devices of the type share.
        const cluster_json *ts = ok ? cluster_json_get(mb->value, "task_streams") : NULL;
        if (ts && (ts->kind != CLUSTER_JSON_NUMBER || ts->number != floor(ts->number) || ts->number < 0 ||
                   ts->number > PLACER_MAX_TASK_STREAMS)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: %s.task_streams must be a whole number from 0 "
                           "to %d", path, where, PLACER_MAX_TASK_STREAMS);
            ok = false;
        } else if (ts) {
            dg_cost_model_set_task_streams(&tmp, mb->key, (int)ts->number, NULL);
        }
        // Optional: how long a sleeping thread of those streams takes to start an op.
        const cluster_json *wk = ok ? cluster_json_get(mb->value, "wake_s") : NULL;
        if (wk && (wk->kind != CLUSTER_JSON_NUMBER || !(wk->number >= 0 && wk->number <= 1))) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: %s.wake_s must be a number of seconds from 0 "
                           "to 1", path, where);
            ok = false;
        } else if (wk) {
            dg_cost_model_set_wake(&tmp, mb->key, wk->number, NULL);
        }
    }
    const cluster_json *links = ok ? cluster_json_get(root, "links") : NULL;
    if (links && links->kind != CLUSTER_JSON_OBJECT) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: \"links\" must be an object", path);
        ok = false;
    }
    for (int k = 0; ok && links && k < 3; k++) {
        const cluster_json *l = cluster_json_get(links, link_names[k]);
        if (!l) continue;
        char where[48];
        snprintf(where, sizeof where, "links.%s", link_names[k]);
        dg_link_perf p;
        ok = read_number(l, "latency_s", where, path, &p.latency_s, st) &&
             read_number(l, "bytes_per_s", where, path, &p.bytes_per_s, st);
        if (ok && !dg_cost_model_set_link(&tmp, (dg_link_kind)k, p, st)) {
            dg_status_prepend(st, "cost model file %s", path);
            ok = false;
        }
    }
    // Measured times: checked whole first, so that a wrong one changes nothing.
    const cluster_json *meas = ok ? cluster_json_get(root, "measured") : NULL;
    if (ok && meas && meas->kind != CLUSTER_JSON_OBJECT) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: \"measured\" must be an object", path);
        ok = false;
    }
    for (size_t i = 0; ok && meas && i < meas->n; i++) {
        const cluster_json_member *ty = &meas->members[i];
        if (ty->value->kind != CLUSTER_JSON_OBJECT || strlen(ty->key) != ty->key_len || !ty->key[0]) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "cost model file %s: measured.%.40s must be an object", path, ty->key);
            ok = false;
        }
        for (size_t k = 0; ok && k < ty->value->n; k++) {
            const cluster_json_member *nm = &ty->value->members[k];
            double v = nm->value->kind == CLUSTER_JSON_NUMBER ? nm->value->number : -1;
            if (!time_ok(v) || strlen(nm->key) != nm->key_len || strchr(ty->key, '\t')) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "cost model file %s: measured.%.40s.%.80s must be a finite number of seconds, from 0 "
                               "to 1e4",
                               path, ty->key, nm->key);
                ok = false;
            }
        }
    }
    if (ok) *m = tmp;
    for (size_t i = 0; ok && meas && i < meas->n; i++) {
        const cluster_json_member *ty = &meas->members[i];
        for (size_t k = 0; ok && k < ty->value->n; k++)
            ok = dg_cost_model_set_measured(m, ty->value->members[k].key, ty->key, ty->value->members[k].value->number, st);
    }
    cluster_json_free(&root);
    return ok;
}

// len bytes of s as a JSON string.
static void json_string(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

bool dg_cost_model_save(const dg_cost_model *m, const char *path, dg_status *st) {
    dg_status_reset(st);
    FILE *f = fopen(path, "w");
    if (!f) {
        dg_status_setf(st, DG_UNAVAILABLE, "cost model file %s: %s", path, strerror(errno));
        return false;
    }
    fprintf(f, "{\"devices\": {");
    for (int t = 0; t < m->n_types; t++) {
        fprintf(f, "%s", t ? ", " : "");
        json_string(f, m->types[t], strlen(m->types[t]));
        fprintf(f, ": {\"flops_per_s\": %.6g, \"bytes_per_s\": %.6g, \"op_overhead_s\": %.6g",
                m->perf[t].flops_per_s, m->perf[t].bytes_per_s, m->perf[t].op_overhead_s);
        if (m->task_streams[t] > 0) fprintf(f, ", \"task_streams\": %d", m->task_streams[t]);
        if (m->wake_s[t] > 0) fprintf(f, ", \"wake_s\": %.6g", m->wake_s[t]);
        fprintf(f, "}");
    }
    fprintf(f, "}, \"links\": {");
    for (int k = 0; k < 3; k++)
        fprintf(f, "%s\"%s\": {\"latency_s\": %.6g, \"bytes_per_s\": %.6g}", k ? ", " : "", link_names[k],
                m->links[k].latency_s, m->links[k].bytes_per_s);
    fprintf(f, "}");
    // Measured times: "measured": {"CPU": {"node name": seconds, ...}, ...}.
    if (m->n_measured > 0) {
        fprintf(f, ", \"measured\": {");
        // One object per device type (each key is "type\tname"), in the order first measured:
        // an item starts its type's object when no earlier item has that type.
        int n_done = 0;
        for (int i = 0; i < m->n_measured; i++) {
            const char *key = m->measured_items[i].key, *tab = strchr(key, '\t');
            size_t tl = (size_t)(tab - key);
            bool seen = false;
            for (int k = 0; k < i && !seen; k++) seen = strncmp(m->measured_items[k].key, key, tl + 1) == 0;
            if (seen) continue;
            fprintf(f, "%s", n_done++ ? ", " : "");
            json_string(f, key, tl);
            fprintf(f, ": {");
            bool first = true;
            for (int j = i; j < m->n_measured; j++) {
                const char *kj = m->measured_items[j].key;
                if (strncmp(kj, key, tl + 1) != 0) continue;
                fprintf(f, "%s", first ? "" : ", ");
                json_string(f, kj + tl + 1, strlen(kj + tl + 1));
                fprintf(f, ": %.6g", m->measured_items[j].s);
                first = false;
            }
            fprintf(f, "}");
        }
        fprintf(f, "}");
    }
    fprintf(f, "}\n");
    if (fclose(f) != 0) {
        dg_status_setf(st, DG_UNAVAILABLE, "cost model file %s: %s", path, strerror(errno));
        return false;
    }
    return true;
}
