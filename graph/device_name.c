/* Device names: TensorFlow's two grammars (the C++ runtime's DeviceNameUtils and Python's
 * DeviceSpec), the canonical string, merging and matching. Parsers work on a local copy and
 * only write the caller's struct on success, so a failed parse never leaves a half-filled name
 * behind. Behaviour is pinned by tests/tf_conformance/ (tables of TensorFlow's own answers);
 * docs/TF_COMPAT.md lists the deliberate differences. */
#include "distgraph/device_name.h"

#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alnum_(char c) { return is_alpha(c) || is_digit(c) || c == '_'; }

static bool bad(dg_status *st, const char *s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
// Sets INVALID_ARGUMENT: device "<s>": <message>.
static bool bad(dg_status *st, const char *s, const char *fmt, ...) {
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    va_end(ap);
    dg_status_setf(st, DG_INVALID_ARGUMENT, "device \"%s\": %s", s, msg ? msg : fmt);
    free(msg);
    return false;
}

// Length of the text from p up to (not including) the next byte of stops, or the end.
static size_t span_to(const char *p, const char *stops) { return strcspn(p, stops); }

// ---------------------------------------------------------------------------------------------
// The runtime's grammar. ParseFullName consumes known prefixes ("/job:", "/replica:", ...) in
// a loop and fails when a pass makes no progress, so a field's value ends where its grammar
// ends, not at the next '/': "/task:1a" fails on the "a", "/job:a:b" on the ':'.

static bool consume(const char **p, const char *lit) {
    size_t n = strlen(lit);
    if (strncmp(*p, lit, n) != 0) return false;
    *p += n;
    return true;
}

// A job name: a letter, then letters, digits, '_' or '-' up to the next '/'. TensorFlow allows
// no '-'; distgraph does because its cluster specs do (docs/TF_COMPAT.md).
static bool consume_job(const char **p, dg_device_name *d, const char *s, dg_status *st) {
    const char *v = *p;
    size_t n = span_to(v, "/");
    bool ok = n > 0 && is_alpha(v[0]);
    for (size_t i = 1; ok && i < n; i++) ok = is_alnum_(v[i]) || v[i] == '-';
    if (!ok) return bad(st, s, "bad job name \"%.*s\"", (int)n, v);
    if (n >= DG_DEVICE_JOB_MAX)
        return bad(st, s, "job name \"%.*s\" is longer than %d bytes", (int)n, v, DG_DEVICE_JOB_MAX - 1);
    memcpy(d->job, v, n);
    d->job[n] = '\0';
    *p = v + n;
    return true;
}

// A device type: a letter, then letters, digits or '_' up to the next '/' or ':'.
static bool consume_type(const char **p, char *type, const char *s, dg_status *st) {
    const char *v = *p;
    size_t n = span_to(v, "/:");
    bool ok = n > 0 && is_alpha(v[0]);
    for (size_t i = 1; ok && i < n; i++) ok = is_alnum_(v[i]);
    if (!ok) return bad(st, s, "bad device type \"%.*s\"", (int)n, v);
    if (n >= DG_DEVICE_TYPE_MAX)
        return bad(st, s, "device type \"%.*s\" is longer than %d bytes", (int)n, v,
                   DG_DEVICE_TYPE_MAX - 1);
    memcpy(type, v, n);
    type[n] = '\0';
    *p = v + n;
    return true;
}

// Leading decimal digits (ConsumeNumber). TensorFlow reads them as a uint64 (failing on
// overflow) and stores it in an int, so values above INT_MAX wrap around; distgraph rejects
// them instead (docs/TF_COMPAT.md).
static bool consume_number(const char **p, int *out, const char *what, const char *s,
                           dg_status *st) {
    const char *v = *p;
    size_t n = 0;
    uint64_t x = 0;
    bool fits = true;
    while (is_digit(v[n])) {
        if (x > (UINT64_MAX - 9) / 10) fits = false;
        else x = x * 10 + (uint64_t)(v[n] - '0');
        n++;
    }
    if (n == 0) return bad(st, s, "bad %s \"%.*s\"", what, (int)span_to(v, "/"), v);
    if (!fits || x > INT_MAX)
        return bad(st, s, "%s %.*s is out of range (at most %d)", what, (int)n, v, INT_MAX);
    *out = (int)x;
    *p = v + n;
    return true;
}

// "*" (unset) or a number; for the replica, task and id fields.
static bool consume_index(const char **p, bool *has, int *val, const char *what, const char *s,
                          dg_status *st) {
    *has = !consume(p, "*");
    return !*has || consume_number(p, val, what, s, st);
}

// The error for a pass that made no progress at p; field is the last field read ("task
// index" for "/task:") and value where its value began, NULL before the first field.
static bool no_progress(const char *s, const char *p, const char *field, const char *value,
                        dg_status *st) {
    if (p == s && *p != '/') return bad(st, s, "must start with '/'");
    // Text after a field's value, as the "a" of "/task:1a": the value is bad. (p is past the
    // start, so a field was read.)
    if (*p != '/' && field) return bad(st, s, "bad %s \"%.*s\"", field, (int)span_to(value, "/"), value);
    size_t n = span_to(p + 1, "/");
    if (n == 0) return bad(st, s, "empty field at offset %zu", (size_t)(p + 1 - s));
    return bad(st, s, "unknown field \"%.*s\" (expected job:, replica:, task:, device:, cpu: or gpu:)",
               (int)n, p + 1);
}

static bool parse_full(const char *s, dg_device_name *d, dg_status *st) {
    memset(d, 0, sizeof *d);
    if (strcmp(s, "/") == 0) return true;
    const char *p = s;
    const char *field = NULL, *value = NULL;
    while (*p) {
        bool progress = false;
        if (consume(&p, "/job:")) {
            field = "job name";
            value = p;
            d->has_job = !consume(&p, "*");
            if (d->has_job && !consume_job(&p, d, s, st)) return false;
            progress = true;
        }
        if (consume(&p, "/replica:")) {
            field = "replica index";
            value = p;
            if (!consume_index(&p, &d->has_replica, &d->replica, field, s, st)) return false;
            progress = true;
        }
        if (consume(&p, "/task:")) {
            field = "task index";
            value = p;
            if (!consume_index(&p, &d->has_task, &d->task, field, s, st)) return false;
            progress = true;
        }
        if (consume(&p, "/device:")) {
            field = "device";
            value = p;
            d->has_type = !consume(&p, "*");
            if (d->has_type && !consume_type(&p, d->type, s, st)) return false;
            if (!consume(&p, ":")) d->has_id = false;
            else if (!consume_index(&p, &d->has_id, &d->id, "device id", s, st)) return false;
            progress = true;
        }
        // The legacy short forms, in exactly these two spellings each.
        static const struct {
            const char *lower, *upper, *type;
        } legacy[] = {{"/cpu:", "/CPU:", DG_DEVICE_TYPE_CPU}, {"/gpu:", "/GPU:", DG_DEVICE_TYPE_GPU}};
        for (size_t i = 0; i < sizeof legacy / sizeof legacy[0]; i++)
            if (consume(&p, legacy[i].lower) || consume(&p, legacy[i].upper)) {
                field = "device id";
                value = p;
                d->has_type = true;
                snprintf(d->type, sizeof d->type, "%s", legacy[i].type);
                if (!consume_index(&p, &d->has_id, &d->id, field, s, st)) return false;
                progress = true;
            }
        if (!progress) return no_progress(s, p, field, value, st);
    }
    return true;
}

static bool parse_local(const char *s, dg_device_name *d, dg_status *st) {
    memset(d, 0, sizeof *d);
    const char *p = s;
    if (!consume_type(&p, d->type, s, st)) return false;
    d->has_type = true;
    if (!consume(&p, ":")) return bad(st, s, "a local name is <type>:<id>");
    if (!consume_number(&p, &d->id, "device id", s, st)) return false;
    d->has_id = true;
    if (*p) return bad(st, s, "unexpected \"%s\" after the device id", p);
    return true;
}

bool dg_device_name_parse(const char *s, dg_device_name *out, dg_status *st) {
    dg_status_reset(st);
    dg_device_name d;
    if (!parse_full(s ? s : "", &d, st)) return false;
    if (out) *out = d;
    return true;
}

bool dg_device_name_parse_local(const char *s, dg_device_name *out, dg_status *st) {
    dg_status_reset(st);
    dg_device_name d;
    if (!parse_local(s ? s : "", &d, st)) return false;
    if (out) *out = d;
    return true;
}

bool dg_device_name_parse_full_or_local(const char *s, dg_device_name *out, dg_status *st) {
    dg_status_reset(st);
    if (!s) s = "";
    dg_device_name d;
    // Full names start with '/' (or are empty), local ones with a letter: report the error of
    // the grammar the string was meant for.
    bool ok = s[0] == '/' || s[0] == '\0' ? parse_full(s, &d, st) : parse_local(s, &d, st);
    if (!ok) return false;
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
    if (n->has_job) ok = append(buf, cap, &len, "/job:%.*s", DG_DEVICE_JOB_MAX - 1, n->job);
    if (ok && n->has_replica) ok = append(buf, cap, &len, "/replica:%d", n->replica);
    if (ok && n->has_task) ok = append(buf, cap, &len, "/task:%d", n->task);
    // As TensorFlow: a type without an id prints "*"; an id without a type does not print.
    if (ok && n->has_type && n->has_id)
        ok = append(buf, cap, &len, "/device:%.*s:%d", DG_DEVICE_TYPE_MAX - 1, n->type, n->id);
    else if (ok && n->has_type)
        ok = append(buf, cap, &len, "/device:%.*s:*", DG_DEVICE_TYPE_MAX - 1, n->type);
    if (!ok) {
        buf[0] = '\0';
        return -1;
    }
    return (int)len;
}

char *dg_device_name_str(const dg_device_name *n, char *buf, size_t cap) {
    return write_name(n, buf, cap) < 0 ? NULL : buf;
}

// Writes n's canonical form to buf, or sets st naming s and the size needed.
static bool write_or_fail(const dg_device_name *n, const char *s, char *buf, size_t cap,
                          dg_status *st) {
    if (write_name(n, buf, cap) >= 0) return true;
    char tmp[DG_DEVICE_NAME_MAX];
    int need = write_name(n, tmp, sizeof tmp);
    dg_status_setf(st, DG_INVALID_ARGUMENT,
                   "device \"%s\": canonical name \"%s\" needs %d bytes, buffer has %zu", s,
                   need < 0 ? "" : tmp, need + 1, cap);
    return false;
}

bool dg_device_name_canonicalize(const char *s, char *buf, size_t cap, dg_status *st) {
    dg_status_reset(st);
    dg_device_name d;
    if (!parse_full(s ? s : "", &d, st)) return false;
    return write_or_fail(&d, s ? s : "", buf, cap, st);
}

bool dg_device_name_split(const char *s, char *task, size_t task_cap, char *local,
                          size_t local_cap, dg_status *st) {
    dg_status_reset(st);
    if (!s) s = "";
    dg_device_name d;
    if (!parse_full(s, &d, st)) return false;
    if (!d.has_type || !d.has_id) return bad(st, s, "names no single device (it needs a type and an id)");
    dg_device_name t = d;
    t.has_type = t.has_id = false;
    if (write_name(&t, task, task_cap) < 0 || !task ||
        !local || local_cap == 0 || snprintf(local, local_cap, "%s:%d", d.type, d.id) >= (int)local_cap) {
        if (local && local_cap) local[0] = '\0';
        return bad(st, s, "task or local part does not fit buffers of %zu and %zu bytes", task_cap,
                   local_cap);
    }
    return true;
}

int dg_device_name_lookup_names(const dg_device_name *n, char (*names)[DG_DEVICE_NAME_MAX],
                                int cap) {
    if (!n->has_type || !n->has_id) return 0;
    bool full = n->has_job && n->has_replica && n->has_task;
    char all[DG_DEVICE_LOOKUP_NAMES][DG_DEVICE_NAME_MAX];
    int k = 0;
    if (full) {
        if (write_name(n, all[k++], DG_DEVICE_NAME_MAX) < 0) return -1;
        // The legacy full name spells the type in lower case: /job:w/replica:0/task:0/cpu:0.
        char lower[DG_DEVICE_TYPE_MAX];
        size_t i = 0;
        for (; n->type[i] && i + 1 < sizeof lower; i++)
            lower[i] = (n->type[i] >= 'A' && n->type[i] <= 'Z') ? (char)(n->type[i] - 'A' + 'a') : n->type[i];
        lower[i] = '\0';
        if (snprintf(all[k++], DG_DEVICE_NAME_MAX, "/job:%s/replica:%d/task:%d/%s:%d", n->job,
                     n->replica, n->task, lower, n->id) >= DG_DEVICE_NAME_MAX)
            return -1;
    }
    snprintf(all[k++], DG_DEVICE_NAME_MAX, "/device:%s:%d", n->type, n->id);
    snprintf(all[k++], DG_DEVICE_NAME_MAX, "%s:%d", n->type, n->id);
    for (int i = 0; i < k && i < cap && names; i++) memcpy(names[i], all[i], DG_DEVICE_NAME_MAX);
    return k;
}

// ---------------------------------------------------------------------------------------------
// Python's DeviceSpec. from_string splits on '/' and then on ':' and looks at the pieces, so
// job and type text is anything without those two characters; indices go through int().

// Unicode data for int() and str.upper(), from Python 3.11 (Unicode 14.0); regenerate with
// tests/tf_conformance/gen_device_tables.py --c-tables.
// The code points with decimal value 0; each starts a run of ten (0..9).
static const uint32_t py_digit_zeros[] = {
    0x30, 0x660, 0x6f0, 0x7c0, 0x966, 0x9e6, 0xa66, 0xae6, 0xb66, 0xbe6, 0xc66, 0xce6, 0xd66,
    0xde6, 0xe50, 0xed0, 0xf20, 0x1040, 0x1090, 0x17e0, 0x1810, 0x1946, 0x19d0, 0x1a80, 0x1a90,
    0x1b50, 0x1bb0, 0x1c40, 0x1c50, 0xa620, 0xa8d0, 0xa900, 0xa9d0, 0xa9f0, 0xaa50, 0xabf0,
    0xff10, 0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0, 0x112f0, 0x11450, 0x114d0,
    0x11650, 0x116c0, 0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0, 0x16a60, 0x16ac0,
    0x16b50, 0x1d7ce, 0x1d7d8, 0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e950, 0x1fbf0,
};
static const uint32_t py_spaces[] = {
    0x9, 0xa, 0xb, 0xc, 0xd, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001,
    0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029,
    0x202f, 0x205f, 0x3000,
};
// Code points above 0x7f that str.upper() changes: {first, last, step}.
static const uint32_t py_changes_in_upper[][3] = {
    {0xb5, 0xb5, 1}, {0xdf, 0xf6, 1}, {0xf8, 0xff, 1}, {0x101, 0x137, 2}, {0x13a, 0x148, 2},
    {0x149, 0x177, 2}, {0x17a, 0x17e, 2}, {0x17f, 0x180, 1}, {0x183, 0x185, 2},
    {0x188, 0x188, 1}, {0x18c, 0x18c, 1}, {0x192, 0x192, 1}, {0x195, 0x195, 1},
    {0x199, 0x19a, 1}, {0x19e, 0x19e, 1}, {0x1a1, 0x1a5, 2}, {0x1a8, 0x1a8, 1},
    {0x1ad, 0x1ad, 1}, {0x1b0, 0x1b0, 1}, {0x1b4, 0x1b6, 2}, {0x1b9, 0x1b9, 1},
    {0x1bd, 0x1bf, 2}, {0x1c5, 0x1c6, 1}, {0x1c8, 0x1c9, 1}, {0x1cb, 0x1cc, 1},
    {0x1ce, 0x1dc, 2}, {0x1dd, 0x1ef, 2}, {0x1f0, 0x1f2, 2}, {0x1f3, 0x1f5, 2},
    {0x1f9, 0x21f, 2}, {0x223, 0x233, 2}, {0x23c, 0x23c, 1}, {0x23f, 0x240, 1},
    {0x242, 0x242, 1}, {0x247, 0x24f, 2}, {0x250, 0x254, 1}, {0x256, 0x257, 1},
    {0x259, 0x25b, 2}, {0x25c, 0x25c, 1}, {0x260, 0x261, 1}, {0x263, 0x265, 2},
    {0x266, 0x268, 2}, {0x269, 0x26c, 1}, {0x26f, 0x271, 2}, {0x272, 0x272, 1},
    {0x275, 0x275, 1}, {0x27d, 0x27d, 1}, {0x280, 0x282, 2}, {0x283, 0x283, 1},
    {0x287, 0x28c, 1}, {0x292, 0x292, 1}, {0x29d, 0x29e, 1}, {0x345, 0x345, 1},
    {0x371, 0x373, 2}, {0x377, 0x377, 1}, {0x37b, 0x37d, 1}, {0x390, 0x390, 1},
    {0x3ac, 0x3ce, 1}, {0x3d0, 0x3d1, 1}, {0x3d5, 0x3d7, 1}, {0x3d9, 0x3ef, 2},
    {0x3f0, 0x3f3, 1}, {0x3f5, 0x3f5, 1}, {0x3f8, 0x3f8, 1}, {0x3fb, 0x3fb, 1},
    {0x430, 0x45f, 1}, {0x461, 0x481, 2}, {0x48b, 0x4bf, 2}, {0x4c2, 0x4ce, 2},
    {0x4cf, 0x52f, 2}, {0x561, 0x587, 1}, {0x10d0, 0x10fa, 1}, {0x10fd, 0x10ff, 1},
    {0x13f8, 0x13fd, 1}, {0x1c80, 0x1c88, 1}, {0x1d79, 0x1d79, 1}, {0x1d7d, 0x1d7d, 1},
    {0x1d8e, 0x1d8e, 1}, {0x1e01, 0x1e95, 2}, {0x1e96, 0x1e9b, 1}, {0x1ea1, 0x1eff, 2},
    {0x1f00, 0x1f07, 1}, {0x1f10, 0x1f15, 1}, {0x1f20, 0x1f27, 1}, {0x1f30, 0x1f37, 1},
    {0x1f40, 0x1f45, 1}, {0x1f50, 0x1f57, 1}, {0x1f60, 0x1f67, 1}, {0x1f70, 0x1f7d, 1},
    {0x1f80, 0x1fb4, 1}, {0x1fb6, 0x1fb7, 1}, {0x1fbc, 0x1fbe, 2}, {0x1fc2, 0x1fc4, 1},
    {0x1fc6, 0x1fc7, 1}, {0x1fcc, 0x1fcc, 1}, {0x1fd0, 0x1fd3, 1}, {0x1fd6, 0x1fd7, 1},
    {0x1fe0, 0x1fe7, 1}, {0x1ff2, 0x1ff4, 1}, {0x1ff6, 0x1ff7, 1}, {0x1ffc, 0x1ffc, 1},
    {0x214e, 0x214e, 1}, {0x2170, 0x217f, 1}, {0x2184, 0x2184, 1}, {0x24d0, 0x24e9, 1},
    {0x2c30, 0x2c5f, 1}, {0x2c61, 0x2c61, 1}, {0x2c65, 0x2c66, 1}, {0x2c68, 0x2c6c, 2},
    {0x2c73, 0x2c73, 1}, {0x2c76, 0x2c76, 1}, {0x2c81, 0x2ce3, 2}, {0x2cec, 0x2cee, 2},
    {0x2cf3, 0x2cf3, 1}, {0x2d00, 0x2d25, 1}, {0x2d27, 0x2d27, 1}, {0x2d2d, 0x2d2d, 1},
    {0xa641, 0xa66d, 2}, {0xa681, 0xa69b, 2}, {0xa723, 0xa72f, 2}, {0xa733, 0xa76f, 2},
    {0xa77a, 0xa77c, 2}, {0xa77f, 0xa787, 2}, {0xa78c, 0xa78c, 1}, {0xa791, 0xa793, 2},
    {0xa794, 0xa794, 1}, {0xa797, 0xa7a9, 2}, {0xa7b5, 0xa7c3, 2}, {0xa7c8, 0xa7ca, 2},
    {0xa7d1, 0xa7d1, 1}, {0xa7d7, 0xa7d9, 2}, {0xa7f6, 0xa7f6, 1}, {0xab53, 0xab53, 1},
    {0xab70, 0xabbf, 1}, {0xfb00, 0xfb06, 1}, {0xfb13, 0xfb17, 1}, {0xff41, 0xff5a, 1},
    {0x10428, 0x1044f, 1}, {0x104d8, 0x104fb, 1}, {0x10597, 0x105a1, 1}, {0x105a3, 0x105b1, 1},
    {0x105b3, 0x105b9, 1}, {0x105bb, 0x105bc, 1}, {0x10cc0, 0x10cf2, 1}, {0x118c0, 0x118df, 1},
    {0x16e60, 0x16e7f, 1}, {0x1e922, 0x1e943, 1},
};

// Decodes one UTF-8 code point at *p (advancing it); an invalid or truncated sequence reads as
// one byte with the value 0xFFFFFFFF, which no table holds (Python strings cannot hold it).
static uint32_t utf8_next(const char **pp, const char *end) {
    const unsigned char *p = (const unsigned char *)*pp;
    unsigned char c = p[0];
    int n = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
    uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1Fu) : n == 2 ? (c & 0x0Fu) : (c & 0x07u);
    bool ok = n >= 0 && (const char *)p + n < end;
    for (int i = 1; ok && i <= n; i++) {
        ok = (p[i] & 0xC0) == 0x80;
        cp = (cp << 6) | (p[i] & 0x3Fu);
    }
    static const uint32_t min_cp[] = {0, 0x80, 0x800, 0x10000};
    if (!ok || cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        *pp += 1;
        return 0xFFFFFFFFu;
    }
    *pp += n + 1;
    return cp;
}

static bool py_isspace(uint32_t c) {
    for (size_t i = 0; i < sizeof py_spaces / sizeof py_spaces[0]; i++)
        if (py_spaces[i] == c) return true;
    return false;
}

// The decimal value of c (Python's Py_UNICODE_TODECIMAL), -1 if none.
static int py_decimal(uint32_t c) {
    for (size_t i = 0; i < sizeof py_digit_zeros / sizeof py_digit_zeros[0]; i++)
        if (c >= py_digit_zeros[i] && c < py_digit_zeros[i] + 10) return (int)(c - py_digit_zeros[i]);
    return -1;
}

// int(text) for text [p, p+n): surrounding whitespace, a sign, digits with single '_' between
// them, at most 4300 digits (Python's default limit). Fails if Python raises or if the value
// is outside int (distgraph's limit, docs/TF_COMPAT.md); *why then says which.
static bool py_int(const char *p, size_t n, int *out, const char **why) {
    const char *end = p + n;
    // Python first maps Unicode spaces to ' ' and decimal digits to ASCII, then parses ASCII.
    size_t n_digits = 0;
    int64_t value = 0;
    bool big = false;
    enum { LEAD, SIGN, DIGITS, UNDERSCORE, TRAIL } state = LEAD;
    bool negative = false;
    *why = "is not an integer";
    while (p < end) {
        uint32_t c = utf8_next(&p, end);
        int d = py_decimal(c);
        char a = py_isspace(c) ? ' ' : d >= 0 ? (char)('0' + d) : c < 0x80 ? (char)c : '?';
        if (a == ' ') {
            if (state == SIGN || state == UNDERSCORE) return false;
            if (state == DIGITS) state = TRAIL;
        } else if (a == '+' || a == '-') {
            if (state != LEAD) return false;
            negative = a == '-';
            state = SIGN;
        } else if (a >= '0' && a <= '9') {
            if (state == TRAIL) return false;
            state = DIGITS;
            n_digits++;
            if (value > (INT64_MAX - 9) / 10) big = true;
            else value = value * 10 + (a - '0');
        } else if (a == '_') {
            if (state != DIGITS) return false;
            state = UNDERSCORE;
        } else {
            return false;
        }
    }
    if (state != DIGITS && state != TRAIL) return false;
    if (n_digits > 4300) {
        *why = "has more than 4300 digits (Python's limit for int())";
        return false;
    }
    if (negative) value = -value;
    if (big || value > INT_MAX || value < INT_MIN) {
        *why = "is out of range for an int";
        return false;
    }
    *out = (int)value;
    return true;
}

// [p, p+n) == lit
static bool span_is(const char *p, size_t n, const char *lit) {
    return strlen(lit) == n && memcmp(p, lit, n) == 0;
}

// Python's y.upper() in {"CPU", "GPU", "TPU", "CUSTOM", "EPU"} for the text [p, p+n): writes
// the upper-case name to type. Besides ASCII, the only characters whose upper case is ASCII
// are U+00DF (SS), U+0131 (I), U+017F (S) and the ligatures U+FB00..U+FB06 (FF, FI, FL, FFI,
// FFL, ST, ST): "/cu\u017ftom:0" is a CUSTOM device in TensorFlow.
static bool py_short_type(const char *p, size_t n, char *type) {
    static const char *const valid[] = {"CPU", "GPU", "TPU", "CUSTOM", "EPU"};
    static const struct {
        uint32_t cp;
        const char *upper;
    } special[] = {{0xdf, "SS"},   {0x131, "I"},   {0x17f, "S"},   {0xfb00, "FF"}, {0xfb01, "FI"},
                   {0xfb02, "FL"}, {0xfb03, "FFI"}, {0xfb04, "FFL"}, {0xfb05, "ST"}, {0xfb06, "ST"}};
    char up[16];
    size_t len = 0;
    const char *end = p + n;
    while (p < end) {
        uint32_t c = utf8_next(&p, end);
        const char *add = NULL;
        char one[2] = {0, 0};
        if (c < 0x80) {
            one[0] = (c >= 'a' && c <= 'z') ? (char)(c - 'a' + 'A') : (char)c;
            add = one;
        }
        for (size_t i = 0; !add && i < sizeof special / sizeof special[0]; i++)
            if (special[i].cp == c) add = special[i].upper;
        if (!add) return false;   // the upper case is not ASCII: no valid type
        size_t k = strlen(add);
        if (len + k >= sizeof up) return false;
        memcpy(up + len, add, k);
        len += k;
    }
    up[len] = '\0';
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++)
        if (strcmp(up, valid[i]) == 0) {
            snprintf(type, DG_DEVICE_TYPE_MAX, "%s", valid[i]);
            return true;
        }
    return false;
}

// s == s.upper() in Python.
static bool py_is_upper(const char *s) {
    const char *end = s + strlen(s);
    while (s < end) {
        uint32_t c = utf8_next(&s, end);
        if (c >= 'a' && c <= 'z') return false;
        if (c < 0x80 || c == 0xFFFFFFFFu) continue;
        for (size_t i = 0; i < sizeof py_changes_in_upper / sizeof py_changes_in_upper[0]; i++) {
            const uint32_t *r = py_changes_in_upper[i];
            if (c >= r[0] && c <= r[1] && (c - r[0]) % r[2] == 0) return false;
        }
    }
    return true;
}

static bool set_text(char *dst, size_t cap, const char *p, size_t n, const char *what,
                     const char *s, dg_status *st) {
    if (n >= cap) return bad(st, s, "%s \"%.*s\" is longer than %zu bytes", what, (int)n, p, cap - 1);
    memcpy(dst, p, n);
    dst[n] = '\0';
    return true;
}

static bool spec_index(const char *p, size_t n, int *out, const char *what, const char *s,
                       dg_status *st) {
    const char *why;
    if (py_int(p, n, out, &why)) return true;
    // The whole string is quoted already; a long value is cut short here.
    return bad(st, s, "%s \"%.*s%s\" %s", what, n > 40 ? 40 : (int)n, p, n > 40 ? "..." : "", why);
}

static bool spec_parse(const char *s, dg_device_name *d, dg_status *st) {
    memset(d, 0, sizeof *d);
    // replica and task are converted after the loop, as DeviceSpec.__init__ does.
    const char *rep = NULL, *task = NULL;
    size_t rep_n = 0, task_n = 0;
    const char *p = s;
    for (;;) {
        size_t n = span_to(p, "/");
        // The piece [p, p+n) split on ':' into at most 4 parts: with 4 or more, every rule
        // below fails alike.
        const char *part[4];
        size_t len[4];
        int k = 0;
        const char *q = p, *end = p + n;
        for (;;) {
            size_t m = span_to(q, ":/");
            part[k] = q;
            len[k] = k == 3 ? (size_t)(end - q) : m;
            k++;
            if (k == 4 || q + m >= end) break;
            q += m + 1;
        }
        if (k == 2 && span_is(part[0], len[0], "job")) {
            if (!set_text(d->job, sizeof d->job, part[1], len[1], "job name", s, st)) return false;
            d->has_job = true;
        } else if (k == 2 && span_is(part[0], len[0], "replica")) {
            rep = part[1];
            rep_n = len[1];
        } else if (k == 2 && span_is(part[0], len[0], "task")) {
            task = part[1];
            task_n = len[1];
        } else if (k <= 2 && py_short_type(part[0], len[0], d->type)) {
            if (d->has_type) return bad(st, s, "multiple device types are not allowed");
            d->has_type = true;
            if (k == 2 && !span_is(part[1], len[1], "*")) {
                if (!spec_index(part[1], len[1], &d->id, "device index", s, st)) return false;
                d->has_id = true;
            }
        } else if (k == 3 && span_is(part[0], len[0], "device")) {
            if (d->has_type) return bad(st, s, "multiple device types are not allowed");
            if (!set_text(d->type, sizeof d->type, part[1], len[1], "device type", s, st)) return false;
            d->has_type = true;
            if (!span_is(part[2], len[2], "*")) {
                if (!spec_index(part[2], len[2], &d->id, "device index", s, st)) return false;
                d->has_id = true;
            }
        } else if (len[0] > 0) {
            return bad(st, s, "unknown attribute \"%.*s\"", (int)len[0], part[0]);
        }
        if (!p[n]) break;
        p += n + 1;
    }
    if (rep) {
        if (!spec_index(rep, rep_n, &d->replica, "replica", s, st)) return false;
        d->has_replica = true;
    }
    if (task) {
        if (!spec_index(task, task_n, &d->task, "task", s, st)) return false;
        d->has_task = true;
    }
    // For backwards compatibility DeviceSpec upper-cases exactly these two spellings.
    if (d->has_type && (strcmp(d->type, "cpu") == 0 || strcmp(d->type, "gpu") == 0))
        for (char *c = d->type; *c; c++) *c = (char)(*c - 'a' + 'A');
    return true;
}

bool dg_device_spec_from_string(const char *s, dg_device_name *out, dg_status *st) {
    dg_status_reset(st);
    dg_device_name d;
    if (!spec_parse(s ? s : "", &d, st)) return false;
    if (out) *out = d;
    return true;
}

bool dg_device_spec_canonical_name(const char *s, char *buf, size_t cap, dg_status *st) {
    dg_status_reset(st);
    if (!s) s = "";
    dg_device_name d;
    return spec_parse(s, &d, st) && write_or_fail(&d, s, buf, cap, st);
}

bool dg_device_spec_canonicalize(const char *d, const char *default_device, char *buf,
                                 size_t cap, dg_status *st) {
    dg_status_reset(st);
    if (!d) d = "";
    dg_device_name dn, result, dflt;
    if (!spec_parse(d, &dn, st)) return false;
    if (dn.has_type && !py_is_upper(dn.type))
        return bad(st, d, "device type \"%s\" must be all-caps", dn.type);
    memset(&result, 0, sizeof result);
    result.has_replica = result.has_task = result.has_type = result.has_id = true;
    snprintf(result.type, sizeof result.type, "%s", DG_DEVICE_TYPE_CPU);
    if (default_device && default_device[0]) {
        if (!spec_parse(default_device, &dflt, st)) {
            dg_status_prepend(st, "default device");
            return false;
        }
        dg_device_name_merge_override(&result, &dflt);
    }
    dg_device_name_merge_override(&result, &dn);
    return write_or_fail(&result, d, buf, cap, st);
}

// ---------------------------------------------------------------------------------------------
// Merging and matching (DeviceNameUtils).

static void merge_error(dg_status *st, const char *what, const dg_device_name *a,
                        const dg_device_name *b) {
    char sa[DG_DEVICE_NAME_MAX], sb[DG_DEVICE_NAME_MAX];
    if (write_name(a, sa, sizeof sa) < 0) sa[0] = '\0';
    if (write_name(b, sb, sizeof sb) < 0) sb[0] = '\0';
    dg_status_setf(st, DG_INVALID_ARGUMENT, "Cannot merge devices with incompatible %s: '%s' and '%s'",
                   what, sa, sb);
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
