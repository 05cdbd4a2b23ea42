/* TensorBoard event files (distgraph/summary.h). Messages are encoded by protobuf-c from
 * proto/tensorboard.proto. Records are TensorFlow's record format: uint64 length (little
 * endian), masked CRC32C of those 8 bytes, the message, masked CRC32C of the message. The
 * CRC32C (Castagnoli) is computed here, table-driven: Debian has no library for it, and zlib's
 * crc32 uses another polynomial. */
#include <errno.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base_impl.h"
#include "distgraph/summary.h"
#include "status_impl.h"
#include "tensorboard.pb-c.h"
#include "training_impl.h"

// ---- CRC32C ----

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82f63b78u : c >> 1;   // reflected 0x1EDC6F41
        crc_table[i] = c;
    }
}

static uint32_t crc32c(const uint8_t *p, size_t n) {
    pthread_once(&crc_once, crc_init);
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xffffffffu;
}

// TensorFlow's masking: a CRC stored inside data that is itself checksummed stays distinct.
static uint32_t masked_crc(const uint8_t *p, size_t n) {
    uint32_t c = crc32c(p, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_u32(uint8_t *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *b) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | b[i];
    return v;
}
static uint64_t get_u64(const uint8_t *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

// ---- writing ----

struct dg_event_writer {
    FILE *f;
    char *path;
    double last_flush;   // monotonic seconds
};

const char *dg_event_writer_path(const dg_event_writer *w) { return w ? w->path : NULL; }

static bool io_fail(const dg_event_writer *w, const char *what, int e, dg_status *st) {
    dg_status_setf(st, e == ENOSPC || e == EDQUOT ? DG_RESOURCE_EXHAUSTED : DG_INTERNAL, "event file \"%s\": %s: %s",
                   w->path, what, strerror(e));
    return false;
}

bool dg_event_writer_flush(dg_event_writer *w, dg_status *st) {
    dg_status_reset(st);
    if (!w) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "event writer: NULL");
        return false;
    }
    w->last_flush = base_now_s();
    if (fflush(w->f) != 0 || ferror(w->f)) {
        int e = errno;
        clearerr(w->f);
        return io_fail(w, "writing", e ? e : EIO, st);
    }
    return true;
}

static bool write_event(dg_event_writer *w, Dgtb__Event *ev, bool flush, dg_status *st) {
    size_t n = dgtb__event__get_packed_size(ev);
    uint8_t *buf = malloc(n + 16);
    if (!buf) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "event file \"%s\": %zu bytes for an event", w->path, n);
        return false;
    }
    put_u64(buf, (uint64_t)n);
    put_u32(buf + 8, masked_crc(buf, 8));
    dgtb__event__pack(ev, buf + 12);
    put_u32(buf + 12 + n, masked_crc(buf + 12, n));
    size_t wrote = fwrite(buf, 1, n + 16, w->f);
    int e = errno;
    free(buf);
    if (wrote != n + 16) {
        clearerr(w->f);
        return io_fail(w, "writing", e ? e : EIO, st);
    }
    if (flush || base_now_s() - w->last_flush >= 1.0) return dg_event_writer_flush(w, st);
    return true;
}

dg_event_writer *dg_event_writer_new(const char *logdir, dg_status *st) {
    dg_status_reset(st);
    if (!logdir || !*logdir) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "event writer: no log directory given");
        return NULL;
    }
    if (!training_make_dir(logdir, "log directory", logdir, st)) return NULL;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    dg_event_writer *w = calloc(1, sizeof *w);
    if (!w || asprintf(&w->path, "%s/events.out.tfevents.%lld.%s.%ld", logdir, (long long)time(NULL), host,
                       (long)getpid()) < 0) {
        free(w);
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "event writer: out of memory");
        return NULL;
    }
    if (!(w->f = fopen(w->path, "wbx"))) {
        int e = errno;
        dg_status_setf(st, e == EACCES || e == EROFS ? DG_PERMISSION_DENIED : DG_FAILED_PRECONDITION,
                       "event file \"%s\": cannot create it: %s", w->path, strerror(e));
        free(w->path);
        free(w);
        return NULL;
    }
    w->last_flush = base_now_s();
    Dgtb__Event ev = DGTB__EVENT__INIT;
    ev.wall_time = training_wall_s();
    ev.what_case = DGTB__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    if (!write_event(w, &ev, true, st)) dg_event_writer_free(&w);
    return w;
}

void dg_event_writer_free(dg_event_writer **pw) {
    if (!pw || !*pw) return;
    dg_event_writer *w = *pw;
    fclose(w->f);
    free(w->path);
    free(w);
    *pw = NULL;
}

static bool summary_event(dg_event_writer *w, int64_t step, Dgtb__SummaryValue *v, dg_status *st) {
    Dgtb__Summary s = DGTB__SUMMARY__INIT;
    s.n_value = 1;
    s.value = &v;
    Dgtb__Event ev = DGTB__EVENT__INIT;
    ev.wall_time = training_wall_s();
    ev.step = step;
    ev.what_case = DGTB__EVENT__WHAT_SUMMARY;
    ev.summary = &s;
    return write_event(w, &ev, false, st);
}

static bool check_args(const dg_event_writer *w, const char *tag, dg_status *st) {
    dg_status_reset(st);
    if (w && tag && *tag) return true;
    dg_status_set(st, DG_INVALID_ARGUMENT, "event writer: needs a writer and a non-empty tag");
    return false;
}

bool dg_event_writer_add_scalar(dg_event_writer *w, const char *tag, int64_t step, double value, dg_status *st) {
    if (!check_args(w, tag, st)) return false;
    Dgtb__SummaryValue v = DGTB__SUMMARY_VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = DGTB__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    return summary_event(w, step, &v, st);
}

// TensorFlow's default bucket limits: -DBL_MAX, -1e20 < ... < -1e-12, 0, 1e-12 < ... < 1e20
// (each 1.1 times the last), DBL_MAX.
static double limits_store[1600];
static int limits_count;

static void init_limits(void) {
    double pos[800];
    int k = 0;
    for (double v = 1e-12; v < 1e20 && k < 799; v *= 1.1) pos[k++] = v;
    pos[k++] = DBL_MAX;
    int n = 0;
    for (int i = k - 1; i >= 0; i--) limits_store[n++] = -pos[i];
    limits_store[n++] = 0.0;
    for (int i = 0; i < k; i++) limits_store[n++] = pos[i];
    limits_count = n;
}

bool dg_event_writer_add_histogram(dg_event_writer *w, const char *tag, int64_t step, const double *values,
                                   int64_t n, dg_status *st) {
    if (!check_args(w, tag, st)) return false;
    if (n < 0 || (n > 0 && !values)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "event writer: histogram \"%s\" of %lld values", tag, (long long)n);
        return false;
    }
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_limits);
    const double *lim = limits_store;
    int nl = limits_count;
    double *counts = calloc((size_t)nl, sizeof *counts), *out_lim = calloc((size_t)nl, sizeof *out_lim),
           *out_cnt = calloc((size_t)nl, sizeof *out_cnt);
    if (!counts || !out_lim || !out_cnt) {
        free(counts);
        free(out_lim);
        free(out_cnt);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "event writer: histogram \"%s\"", tag);
        return false;
    }
    Dgtb__HistogramProto h = DGTB__HISTOGRAM_PROTO__INIT;
    h.min = DBL_MAX;
    h.max = -DBL_MAX;
    for (int64_t i = 0; i < n; i++) {
        double v = values[i];
        if (isnan(v)) continue;
        // The first limit above v (the bucket (lim[k-1], lim[k]] of TensorFlow's upper_bound).
        int lo = 0, hi = nl - 1;
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (lim[mid] > v) hi = mid;
            else lo = mid + 1;
        }
        counts[lo] += 1;
        h.num += 1;
        h.sum += v;
        h.sum_squares += v * v;
        if (v < h.min) h.min = v;
        if (v > h.max) h.max = v;
    }
    if (h.num == 0) h.min = h.max = 0;
    // Runs of empty buckets collapse into one (its right limit kept), as TensorFlow writes them.
    size_t m = 0;
    for (int k = 0; k < nl; k++) {
        if (counts[k] == 0 && (k + 1 < nl && counts[k + 1] == 0)) continue;
        if (counts[k] == 0 && (m == 0 || k + 1 == nl)) continue;
        out_lim[m] = lim[k];
        out_cnt[m++] = counts[k];
    }
    h.n_bucket_limit = h.n_bucket = m;
    h.bucket_limit = out_lim;
    h.bucket = out_cnt;
    Dgtb__SummaryValue v = DGTB__SUMMARY_VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = DGTB__SUMMARY_VALUE__VALUE_HISTO;
    v.histo = &h;
    bool ok = summary_event(w, step, &v, st);
    free(counts);
    free(out_lim);
    free(out_cnt);
    return ok;
}

// "name", "name:k" for output k > 0.
static char *input_name(dg_output o) {
    char *s = NULL;
    if (o.index == 0 ? asprintf(&s, "%s", dg_node_name(o.node)) < 0
                     : asprintf(&s, "%s:%d", dg_node_name(o.node), o.index) < 0)
        return NULL;
    return s;
}

bool dg_event_writer_add_graph(dg_event_writer *w, const dg_graph *g, int64_t step, dg_status *st) {
    dg_status_reset(st);
    if (!w || !g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "event writer: needs a writer and a graph");
        return false;
    }
    int n = dg_graph_num_nodes(g);
    Dgtb__NodeDef *nodes = calloc((size_t)n + 1, sizeof *nodes);
    Dgtb__NodeDef **ptrs = calloc((size_t)n + 1, sizeof *ptrs);
    bool ok = nodes && ptrs;
    for (int i = 0; ok && i < n; i++) {
        const dg_node *node = dg_graph_node(g, i);
        Dgtb__NodeDef *d = &nodes[i];
        dgtb__node_def__init(d);
        ptrs[i] = d;
        d->name = (char *)dg_node_name(node);
        d->op = (char *)dg_node_op_type(node);
        const char *dev = dg_node_assigned_device(node);
        d->device = (char *)(dev && *dev ? dev : dg_node_requested_device(node) ? dg_node_requested_device(node) : "");
        int ni = dg_node_num_inputs(node), nc = dg_node_num_control_inputs(node);
        d->input = calloc((size_t)(ni + nc) + 1, sizeof *d->input);
        ok = d->input != NULL;
        for (int k = 0; ok && k < ni; k++) ok = (d->input[d->n_input++] = input_name(dg_node_input(node, k))) != NULL;
        for (int k = 0; ok && k < nc; k++)
            ok = asprintf(&d->input[d->n_input++], "^%s", dg_node_name(dg_node_control_input(node, k))) >= 0;
    }
    Dgtb__GraphDef gd = DGTB__GRAPH_DEF__INIT;
    Dgtb__VersionDef ver = DGTB__VERSION_DEF__INIT;
    ver.producer = 22;
    gd.versions = &ver;
    gd.n_node = (size_t)n;
    gd.node = ptrs;
    uint8_t *buf = NULL;
    size_t len = 0;
    if (ok) {
        len = dgtb__graph_def__get_packed_size(&gd);
        ok = (buf = malloc(len + 1)) != NULL;
    }
    if (!ok) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "event file \"%s\": out of memory for a graph of %d nodes", w->path, n);
    } else {
        dgtb__graph_def__pack(&gd, buf);
        Dgtb__Event ev = DGTB__EVENT__INIT;
        ev.wall_time = training_wall_s();
        ev.step = step;
        ev.what_case = DGTB__EVENT__WHAT_GRAPH_DEF;
        ev.graph_def.data = buf;
        ev.graph_def.len = len;
        ok = write_event(w, &ev, true, st);
    }
    free(buf);
    for (int i = 0; nodes && i < n; i++) {
        for (size_t k = 0; k < nodes[i].n_input; k++) free(nodes[i].input[k]);
        free(nodes[i].input);
    }
    free(nodes);
    free(ptrs);
    return ok;
}

// ---- reading ----

static bool data_loss(dg_status *st, const char *path, long off, const char *what) {
    dg_status_setf(st, DG_DATA_LOSS, "event file \"%s\": the record at byte %ld %s", path, off, what);
    return false;
}

bool dg_event_file_read(const char *path, bool (*fn)(void *ctx, const dg_event *e), void *ctx, int64_t *n_events,
                        dg_status *st) {
    dg_status_reset(st);
    if (n_events) *n_events = 0;
    if (!path) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "event file: no path");
        return false;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        dg_status_setf(st, e == ENOENT ? DG_NOT_FOUND : DG_FAILED_PRECONDITION, "event file \"%s\": %s", path,
                       strerror(e));
        return false;
    }
    bool ok = true, stop = false;
    uint8_t *data = NULL;
    int64_t count = 0;
    while (ok && !stop) {
        long off = ftell(f);
        uint8_t head[12], tail[4];
        size_t got = fread(head, 1, sizeof head, f);
        if (got == 0 && feof(f)) break;
        if (got != sizeof head) {
            ok = data_loss(st, path, off, "is truncated (in its length)");
            break;
        }
        if (get_u32(head + 8) != masked_crc(head, 8)) {
            ok = data_loss(st, path, off, "has a damaged length (checksum mismatch)");
            break;
        }
        uint64_t len = get_u64(head);
        struct stat sb;
        if (fstat(fileno(f), &sb) != 0 || len > (uint64_t)sb.st_size) {
            ok = data_loss(st, path, off, "is truncated (its length passes the end of the file)");
            break;
        }
        uint8_t *d = realloc(data, (size_t)len + 1);
        if (!d) {
            dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "event file \"%s\": %llu bytes for a record", path,
                           (unsigned long long)len);
            ok = false;
            break;
        }
        data = d;
        if (fread(data, 1, (size_t)len, f) != len || fread(tail, 1, 4, f) != 4) {
            ok = data_loss(st, path, off, "is truncated");
            break;
        }
        if (get_u32(tail) != masked_crc(data, (size_t)len)) {
            ok = data_loss(st, path, off, "is damaged (checksum mismatch)");
            break;
        }
        Dgtb__Event *ev = dgtb__event__unpack(NULL, (size_t)len, data);
        if (!ev) {
            ok = data_loss(st, path, off, "holds no event message");
            break;
        }
        dg_event e = {ev->wall_time, ev->step, NULL, "", 0};
        count++;
        switch (ev->what_case) {
        case DGTB__EVENT__WHAT_FILE_VERSION:
            e.kind = "file_version";
            e.tag = ev->file_version;
            stop = fn && !fn(ctx, &e);
            break;
        case DGTB__EVENT__WHAT_GRAPH_DEF: {
            e.kind = "graph";
            Dgtb__GraphDef *gd = dgtb__graph_def__unpack(NULL, ev->graph_def.len, ev->graph_def.data);
            if (!gd) {
                ok = data_loss(st, path, off, "holds a graph that is no GraphDef message");
                break;
            }
            e.value = (double)gd->n_node;
            dgtb__graph_def__free_unpacked(gd, NULL);
            stop = fn && !fn(ctx, &e);
            break;
        }
        case DGTB__EVENT__WHAT_SUMMARY:
            for (size_t i = 0; !stop && ev->summary && i < ev->summary->n_value; i++) {
                const Dgtb__SummaryValue *v = ev->summary->value[i];
                e.tag = v->tag;
                if (v->value_case == DGTB__SUMMARY_VALUE__VALUE_SIMPLE_VALUE) {
                    e.kind = "scalar";
                    e.value = v->simple_value;
                } else if (v->value_case == DGTB__SUMMARY_VALUE__VALUE_HISTO && v->histo) {
                    e.kind = "histogram";
                    e.value = v->histo->num;
                } else {
                    continue;   // a kind this reader does not know
                }
                stop = fn && !fn(ctx, &e);
            }
            break;
        default:
            break;   // events of other kinds are skipped
        }
        dgtb__event__free_unpacked(ev, NULL);
    }
    free(data);
    fclose(f);
    if (n_events) *n_events = count;
    return ok;
}
