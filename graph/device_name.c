/* Device names: parsing, printing, merging and matching (TensorFlow's DeviceNameUtils and
 * Python DeviceSpec). The parser works on a local copy and only writes the caller's struct
 * on success, so a failed parse never leaves a half-filled name behind. */
#include "distgraph/device_name.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static char to_upper(char c) { return (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : c; }

static bool span_eq(const char *p, size_t n, const char *lit) {
    return strlen(lit) == n && memcmp(p, lit, n) == 0;
}

static bool span_eq_nocase(const char *p, size_t n, const char *lit) {
    if (strlen(lit) != n) return false;
    for (size_t i = 0; i < n; i++)
        if (to_upper(p[i]) != to_upper(lit[i])) return false;
    return true;
}

// A non-negative decimal int (leading zeros allowed, as TensorFlow's ConsumeNumber).
static bool parse_index(const char *p, size_t n, int *out) {
    if (n == 0) return false;
    long long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!is_digit(p[i])) return false;
        v = v * 10 + (p[i] - '0');
        if (v > INT_MAX) return false;
    }
    *out = (int)v;
    return true;
}

// Job names: a letter, then letters, digits, '_' or '-'. TensorFlow allows no '-', but the
// cluster spec does, and a job that cannot be named in a device string would be useless.
static bool is_job_name(const char *p, size_t n) {
    if (n == 0 || !is_alpha(p[0])) return false;
    for (size_t i = 1; i < n; i++)
        if (!is_alpha(p[i]) && !is_digit(p[i]) && p[i] != '_' && p[i] != '-') return false;
    return true;
}

// Device types: a letter, then letters, digits or '_'.
static bool is_type_name(const char *p, size_t n) {
    if (n == 0 || !is_alpha(p[0])) return false;
    for (size_t i = 1; i < n; i++)
        if (!is_alpha(p[i]) && !is_digit(p[i]) && p[i] != '_') return false;
    return true;
}

static bool is_star(const char *p, size_t n) { return n == 1 && p[0] == '*'; }

// Sets the error for field [p, p+n) of device string s.
static bool bad(dg_status *st, const char *s, const char *what, const char *p, size_t n) {
    dg_status_setf(st, DG_INVALID_ARGUMENT, "device \"%s\": %s \"%.*s\"", s, what, (int)n, p);
    return false;
}

static bool parse_id_part(const char *s, const char *p, size_t n, bool *has, int *id,
                          dg_status *st) {
    if (is_star(p, n)) {
        *has = false;
        return true;
    }
    if (!parse_index(p, n, id)) return bad(st, s, "bad device id", p, n);
    *has = true;
    return true;
}

// One "/key:value" field; [p, p+n) is the text between the slashes.
static bool parse_field(const char *s, const char *p, size_t n, dg_device_name *d,
                        dg_status *st) {
    const char *colon = memchr(p, ':', n);
    if (!colon)
        return bad(st, s, "bad field (expected job:, replica:, task: or device:)", p, n);
    size_t klen = (size_t)(colon - p);
    const char *v = colon + 1;
    size_t vlen = n - klen - 1;

    if (span_eq(p, klen, "job")) {
        if (is_star(v, vlen)) {
            d->has_job = false;
            return true;
        }
        if (!is_job_name(v, vlen)) return bad(st, s, "bad job name", v, vlen);
        if (vlen >= DG_DEVICE_JOB_MAX) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "device \"%s\": job name \"%.*s\" is longer than %d bytes", s,
                           (int)vlen, v, DG_DEVICE_JOB_MAX - 1);
            return false;
        }
        memcpy(d->job, v, vlen);
        d->job[vlen] = '\0';
        d->has_job = true;
        return true;
    }
    if (span_eq(p, klen, "replica") || span_eq(p, klen, "task")) {
        bool is_task = klen == 4;
        bool *has = is_task ? &d->has_task : &d->has_replica;
        int *val = is_task ? &d->task : &d->replica;
        if (is_star(v, vlen)) {
            *has = false;
            return true;
        }
        if (!parse_index(v, vlen, val))
            return bad(st, s, is_task ? "bad task index" : "bad replica index", v, vlen);
        *has = true;
        return true;
    }
    if (span_eq(p, klen, "device")) {
        const char *c2 = memchr(v, ':', vlen);
        size_t tlen = c2 ? (size_t)(c2 - v) : vlen;
        if (is_star(v, tlen)) {
            d->has_type = false;
        } else {
            if (!is_type_name(v, tlen)) return bad(st, s, "bad device type", v, tlen);
            if (tlen >= DG_DEVICE_TYPE_MAX) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "device \"%s\": device type \"%.*s\" is longer than %d bytes",
                               s, (int)tlen, v, DG_DEVICE_TYPE_MAX - 1);
                return false;
            }
            for (size_t i = 0; i < tlen; i++) d->type[i] = to_upper(v[i]);
            d->type[tlen] = '\0';
            d->has_type = true;
        }
        if (!c2) {
            d->has_id = false;
            return true;
        }
        return parse_id_part(s, c2 + 1, vlen - tlen - 1, &d->has_id, &d->id, st);
    }
    // TensorFlow's legacy short forms of the CPU and GPU types, /cpu:0 and /gpu:1 in any case
    // for /device:CPU:0 and /device:GPU:1. Other types have only the long form, so that a
    // misspelt key ("/foo:1", "/Job:w") stays an error.
    static const char *const legacy_types[] = {DG_DEVICE_TYPE_CPU, DG_DEVICE_TYPE_GPU};
    for (size_t i = 0; i < sizeof legacy_types / sizeof legacy_types[0]; i++)
        if (span_eq_nocase(p, klen, legacy_types[i])) {
            memcpy(d->type, legacy_types[i], klen + 1);   // canonical: upper-case
            d->has_type = true;
            return parse_id_part(s, v, vlen, &d->has_id, &d->id, st);
        }
    return bad(st, s, "unknown field", p, n);
}

bool dg_device_name_parse(const char *s, dg_device_name *out, dg_status *st) {
    dg_status_reset(st);
    dg_device_name d;
    memset(&d, 0, sizeof d);
    if (!s) s = "";
    // "" and "/" are both the empty specification, as in TensorFlow.
    if (s[0] != '\0' && strcmp(s, "/") != 0) {
        if (s[0] != '/') {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "device \"%s\": must start with '/'", s);
            return false;
        }
        const char *p = s;
        while (*p == '/') {
            const char *start = p + 1;
            const char *end = strchr(start, '/');
            if (!end) end = start + strlen(start);
            if (end == start) {
                dg_status_setf(st, DG_INVALID_ARGUMENT,
                               "device \"%s\": empty field at offset %zu", s,
                               (size_t)(start - s));
                return false;
            }
            // Later fields override earlier ones of the same kind, as in TensorFlow.
            if (!parse_field(s, start, (size_t)(end - start), &d, st)) return false;
            p = end;
        }
    }
    if (out) *out = d;
    return true;
}

// Appends printf output at *len; false if it would not fit in cap.
static bool append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool append(char *buf, size_t cap, size_t *len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) return false;
    *len += (size_t)n;
    return true;
}

// Writes the canonical name; returns the bytes needed (NUL excluded), or -1 if it does not
// fit in cap (buf then holds "" when cap > 0).
static int write_name(const dg_device_name *n, char *buf, size_t cap) {
    if (!buf || cap == 0) return -1;
    size_t len = 0;
    bool ok = true;
    buf[0] = '\0';
    if (n->has_job)
        ok = ok && append(buf, cap, &len, "/job:%.*s", DG_DEVICE_JOB_MAX - 1, n->job);
    if (ok && n->has_replica) ok = append(buf, cap, &len, "/replica:%d", n->replica);
    if (ok && n->has_task) ok = append(buf, cap, &len, "/task:%d", n->task);
    // As TensorFlow: an unset id next to a set type prints as "*", and vice versa.
    if (ok && n->has_type && n->has_id)
        ok = append(buf, cap, &len, "/device:%.*s:%d", DG_DEVICE_TYPE_MAX - 1, n->type, n->id);
    else if (ok && n->has_type)
        ok = append(buf, cap, &len, "/device:%.*s:*", DG_DEVICE_TYPE_MAX - 1, n->type);
    else if (ok && n->has_id)
        ok = append(buf, cap, &len, "/device:*:%d", n->id);
    if (!ok) {
        buf[0] = '\0';
        return -1;
    }
    return (int)len;
}

char *dg_device_name_str(const dg_device_name *n, char *buf, size_t cap) {
    return write_name(n, buf, cap) < 0 ? NULL : buf;
}

bool dg_device_name_canonicalize(const char *s, char *buf, size_t cap, dg_status *st) {
    dg_status_reset(st);
    dg_device_name d;
    if (!dg_device_name_parse(s, &d, st)) return false;
    if (write_name(&d, buf, cap) < 0) {
        char tmp[DG_DEVICE_NAME_MAX];
        int need = write_name(&d, tmp, sizeof tmp);
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "device \"%s\": canonical name \"%s\" needs %d bytes, buffer has %zu",
                       s, need < 0 ? "" : tmp, need + 1, cap);
        return false;
    }
    return true;
}

static void merge_error(dg_status *st, const char *what, const dg_device_name *a,
                        const dg_device_name *b) {
    char sa[DG_DEVICE_NAME_MAX], sb[DG_DEVICE_NAME_MAX];
    if (write_name(a, sa, sizeof sa) < 0) sa[0] = '\0';
    if (write_name(b, sb, sizeof sb) < 0) sb[0] = '\0';
    dg_status_setf(st, DG_INVALID_ARGUMENT,
                   "cannot merge devices with incompatible %s: \"%s\" and \"%s\"", what, sa, sb);
}

bool dg_device_name_merge(dg_device_name *target, const dg_device_name *other,
                          bool allow_soft_placement, dg_status *st) {
    dg_status_reset(st);
    // Work on a copy so that a failed merge leaves target as it was (TensorFlow may leave
    // it half merged).
    dg_device_name t = *target;
    if (other->has_job) {
        if (t.has_job && strcmp(t.job, other->job) != 0) {
            merge_error(st, "jobs", target, other);
            return false;
        }
        t.has_job = true;
        memcpy(t.job, other->job, sizeof t.job);
    }
    if (other->has_replica) {
        if (t.has_replica && t.replica != other->replica) {
            merge_error(st, "replicas", target, other);
            return false;
        }
        t.has_replica = true;
        t.replica = other->replica;
    }
    if (other->has_task) {
        if (t.has_task && t.task != other->task) {
            merge_error(st, "tasks", target, other);
            return false;
        }
        t.has_task = true;
        t.task = other->task;
    }
    if (other->has_type) {
        if (t.has_type && strcmp(t.type, other->type) != 0) {
            if (!allow_soft_placement) {
                merge_error(st, "types", target, other);
                return false;
            }
            // Soft placement: forget the device entirely and let the placer choose.
            t.has_type = false;
            t.has_id = false;
            *target = t;
            return true;
        }
        t.has_type = true;
        memcpy(t.type, other->type, sizeof t.type);
    }
    if (other->has_id) {
        if (t.has_id && t.id != other->id) {
            if (!allow_soft_placement) {
                merge_error(st, "ids", target, other);
                return false;
            }
            t.has_id = false;
            *target = t;
            return true;
        }
        t.has_id = true;
        t.id = other->id;
    }
    *target = t;
    return true;
}

void dg_device_name_merge_override(dg_device_name *target, const dg_device_name *over) {
    if (over->has_job) {
        target->has_job = true;
        memcpy(target->job, over->job, sizeof target->job);
    }
    if (over->has_replica) {
        target->has_replica = true;
        target->replica = over->replica;
    }
    if (over->has_task) {
        target->has_task = true;
        target->task = over->task;
    }
    if (over->has_type) {
        target->has_type = true;
        memcpy(target->type, over->type, sizeof target->type);
    }
    if (over->has_id) {
        target->has_id = true;
        target->id = over->id;
    }
}

static bool job_eq(const dg_device_name *a, const dg_device_name *b) {
    return strncmp(a->job, b->job, DG_DEVICE_JOB_MAX) == 0;
}

static bool type_eq(const dg_device_name *a, const dg_device_name *b) {
    return strncmp(a->type, b->type, DG_DEVICE_TYPE_MAX) == 0;
}

bool dg_device_name_matches(const dg_device_name *spec, const dg_device_name *device) {
    if (spec->has_job && (!device->has_job || !job_eq(spec, device))) return false;
    if (spec->has_replica && (!device->has_replica || spec->replica != device->replica))
        return false;
    if (spec->has_task && (!device->has_task || spec->task != device->task)) return false;
    if (spec->has_type && (!device->has_type || !type_eq(spec, device))) return false;
    if (spec->has_id && (!device->has_id || spec->id != device->id)) return false;
    return true;
}

bool dg_device_name_compatible(const dg_device_name *a, const dg_device_name *b) {
    if (a->has_job && b->has_job && !job_eq(a, b)) return false;
    if (a->has_replica && b->has_replica && a->replica != b->replica) return false;
    if (a->has_task && b->has_task && a->task != b->task) return false;
    if (a->has_type && b->has_type && !type_eq(a, b)) return false;
    if (a->has_id && b->has_id && a->id != b->id) return false;
    return true;
}

bool dg_device_name_is_complete(const dg_device_name *n) {
    return n->has_job && n->has_replica && n->has_task && n->has_type && n->has_id;
}

bool dg_device_name_same_task(const dg_device_name *a, const dg_device_name *b) {
    return a->has_job && b->has_job && job_eq(a, b) && a->has_replica && b->has_replica &&
           a->replica == b->replica && a->has_task && b->has_task && a->task == b->task;
}
