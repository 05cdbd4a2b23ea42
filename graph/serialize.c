/* Graph files (msgpack). The writer walks the nodes in creation order. The loader treats its
 * input as hostile: it first checks the whole buffer's structure with a scanner that
 * allocates nothing (truncation, nesting depth, and that no container declares more elements
 * than bytes remain), then decodes one node at a time with msgpack-c and rebuilds it through
 * the builder protocol, so shape inference checks it like any built node. The scanner's
 * element check matters: msgpack-c allocates a container's object array from its declared
 * count before reading the elements, so without it a five-byte array header could ask for
 * 100 GB; with it, the objects of one node take at most a constant factor of its bytes. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base_impl.h"
#include "distgraph/device_name.h"
#include "distgraph/serialize.h"
#include "graph_impl.h"

#define MAGIC "distgraph-graph"
#define MAX_DEPTH 24            // nesting of the whole document; a graph needs 6
#define MAX_ATTRS_PER_NODE 256  // setting an attribute is linear in the node's attributes

static const char *const builtin_collections[] = {DG_GLOBAL_VARIABLES, DG_TRAINABLE_VARIABLES,
                                                  DG_GLOBAL_STEP, DG_SUMMARIES};
#define N_BUILTIN_COLLECTIONS ((int)(sizeof builtin_collections / sizeof builtin_collections[0]))

static bool host_is_little_endian(void) {
    const uint16_t one = 1;
    uint8_t first;
    memcpy(&first, &one, 1);
    return first == 1;
}

// Copies n_bytes of elements of elem_bytes each, reversing the bytes of every element when
// the host is big-endian (files hold little-endian elements).
static void copy_le(void *dst, const void *src, size_t n_bytes, size_t elem_bytes) {
    if (host_is_little_endian() || elem_bytes <= 1) {
        if (n_bytes) memcpy(dst, src, n_bytes);
        return;
    }
    const uint8_t *s = src;
    uint8_t *d = dst;
    for (size_t i = 0; i < n_bytes; i += elem_bytes)
        for (size_t k = 0; k < elem_bytes; k++) d[i + k] = s[i + elem_bytes - 1 - k];
}

static dg_code errno_code(int e) {
    switch (e) {
    case ENOENT:
    case ENOTDIR: return DG_NOT_FOUND;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
    case ENOMEM: return DG_RESOURCE_EXHAUSTED;
    case EACCES:
    case EPERM:
    case EROFS: return DG_FAILED_PRECONDITION;
    case EISDIR: return DG_INVALID_ARGUMENT;
    default: return DG_UNAVAILABLE;
    }
}

// ==== writer ====

typedef struct writer {
    msgpack_sbuffer sbuf;
    msgpack_packer pk;
    dg_status *st;
} writer;

// msgpack-c's pack calls fail only when the sbuffer cannot grow.
#define MP_CHECK(w, call)                                                                  \
    do {                                                                                   \
        if ((call) != 0) {                                                                 \
            dg_status_setf((w)->st, DG_RESOURCE_EXHAUSTED,                                 \
                           "graph file: out of memory while writing (%zu bytes so far)",   \
                           (w)->sbuf.size);                                               \
            goto fail;                                                                     \
        }                                                                                  \
    } while (0)

static int pack_cstr(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    if (n > UINT32_MAX) return -1;
    int rc = msgpack_pack_str(pk, n);
    return rc ? rc : msgpack_pack_str_body(pk, s, n);
}

static bool write_shape(writer *w, const dg_shape *s) {
    if (s->rank < 0) {
        MP_CHECK(w, msgpack_pack_nil(&w->pk));
        return true;
    }
    MP_CHECK(w, msgpack_pack_array(&w->pk, (size_t)s->rank));
    for (int i = 0; i < s->rank; i++) MP_CHECK(w, msgpack_pack_int64(&w->pk, s->dims[i]));
    return true;
fail:
    return false;
}

static bool write_dtype(writer *w, dg_dtype t) {
    if (dg_dtype_is_valid(t))
        MP_CHECK(w, pack_cstr(&w->pk, dg_dtype_name(t)));
    else
        MP_CHECK(w, msgpack_pack_int(&w->pk, (int)t));
    return true;
fail:
    return false;
}

static bool write_tensor(writer *w, const dg_node *n, const graph_attr *a) {
    const dg_tensor *t = a->u.t;
    size_t n_bytes = dg_tensor_nbytes(t);
    if (n_bytes > UINT32_MAX) {
        dg_status_setf(w->st, DG_INVALID_ARGUMENT, "graph file: node \"%s\": attr \"%s\": a %zu-byte "
                       "tensor does not fit in a msgpack bin", n->name, a->name, n_bytes);
        return false;
    }
    MP_CHECK(w, msgpack_pack_map(&w->pk, 3));
    MP_CHECK(w, pack_cstr(&w->pk, "dtype"));
    if (!write_dtype(w, dg_tensor_dtype(t))) return false;
    MP_CHECK(w, pack_cstr(&w->pk, "shape"));
    if (!write_shape(w, dg_tensor_shape(t))) return false;
    MP_CHECK(w, pack_cstr(&w->pk, "data"));
    MP_CHECK(w, msgpack_pack_bin(&w->pk, n_bytes));
    if (host_is_little_endian() || n_bytes == 0) {
        MP_CHECK(w, msgpack_pack_bin_body(&w->pk, dg_tensor_data(t), n_bytes));
    } else {
        void *le = malloc(n_bytes);
        if (!le) {
            dg_status_setf(w->st, DG_RESOURCE_EXHAUSTED, "graph file: %zu bytes for a tensor", n_bytes);
            return false;
        }
        copy_le(le, dg_tensor_data(t), n_bytes, dg_dtype_size(dg_tensor_dtype(t)));
        int rc = msgpack_pack_bin_body(&w->pk, le, n_bytes);
        free(le);
        MP_CHECK(w, rc);
    }
    return true;
fail:
    return false;
}

static bool write_attr(writer *w, const dg_node *n, const graph_attr *a) {
    MP_CHECK(w, msgpack_pack_map(&w->pk, 1));
    switch (a->kind) {
    case GA_INT:
        MP_CHECK(w, pack_cstr(&w->pk, "int"));
        MP_CHECK(w, msgpack_pack_int64(&w->pk, a->u.i));
        break;
    case GA_FLOAT:
        MP_CHECK(w, pack_cstr(&w->pk, "float"));
        MP_CHECK(w, msgpack_pack_double(&w->pk, a->u.f));
        break;
    case GA_BOOL:
        MP_CHECK(w, pack_cstr(&w->pk, "bool"));
        MP_CHECK(w, a->u.b ? msgpack_pack_true(&w->pk) : msgpack_pack_false(&w->pk));
        break;
    case GA_TYPE:
        MP_CHECK(w, pack_cstr(&w->pk, "type"));
        return write_dtype(w, a->u.type);
    case GA_SHAPE:
        MP_CHECK(w, pack_cstr(&w->pk, "shape"));
        return write_shape(w, &a->u.shape);
    case GA_STRING:
        MP_CHECK(w, pack_cstr(&w->pk, "string"));
        MP_CHECK(w, pack_cstr(&w->pk, a->u.s ? a->u.s : ""));
        break;
    case GA_INTS:
        MP_CHECK(w, pack_cstr(&w->pk, "ints"));
        MP_CHECK(w, msgpack_pack_array(&w->pk, (size_t)a->u.ints.n));
        for (int i = 0; i < a->u.ints.n; i++) MP_CHECK(w, msgpack_pack_int64(&w->pk, a->u.ints.v[i]));
        break;
    case GA_TENSOR:
        MP_CHECK(w, pack_cstr(&w->pk, "tensor"));
        return write_tensor(w, n, a);
    default:
        dg_status_setf(w->st, DG_INTERNAL, "graph file: node \"%s\": attr \"%s\" has unknown kind %d",
                       n->name, a->name, (int)a->kind);
        return false;
    }
    return true;
fail:
    return false;
}

static bool write_node(writer *w, const dg_graph *g, const dg_node *n) {
    const char *assigned = dg_node_assigned_device(n);
    dg_output self = {(dg_node *)n, 0};
    const dg_node *init = strcmp(dg_node_op_type(n), "VariableV2") == 0 ? dg_variable_initializer(self) : NULL;
    if (init && init->graph != g) init = NULL;
    size_t n_keys = 7 + (*assigned ? 1 : 0) + (init ? 1 : 0);
    MP_CHECK(w, msgpack_pack_map(&w->pk, n_keys));
    MP_CHECK(w, pack_cstr(&w->pk, "name"));
    MP_CHECK(w, pack_cstr(&w->pk, dg_node_name(n)));
    MP_CHECK(w, pack_cstr(&w->pk, "op"));
    MP_CHECK(w, pack_cstr(&w->pk, dg_node_op_type(n)));
    MP_CHECK(w, pack_cstr(&w->pk, "inputs"));
    MP_CHECK(w, msgpack_pack_array(&w->pk, (size_t)dg_node_num_inputs(n)));
    for (int i = 0; i < dg_node_num_inputs(n); i++) {
        dg_output in = dg_node_input(n, i);
        if (!in.node || in.node->graph != g) {
            dg_status_setf(w->st, DG_INVALID_ARGUMENT, "graph file: node \"%s\": input %d (\"%s\") "
                           "belongs to another graph", n->name, i, in.node ? in.node->name : "<null>");
            return false;
        }
        // "name" for output 0, "name:i" otherwise; node names never contain ':'.
        char idx[16] = "";
        if (in.index != 0) snprintf(idx, sizeof idx, ":%d", in.index);
        size_t nl = strlen(in.node->name), il = strlen(idx);
        MP_CHECK(w, msgpack_pack_str(&w->pk, nl + il));
        MP_CHECK(w, msgpack_pack_str_body(&w->pk, in.node->name, nl));
        MP_CHECK(w, msgpack_pack_str_body(&w->pk, idx, il));
    }
    MP_CHECK(w, pack_cstr(&w->pk, "control_inputs"));
    MP_CHECK(w, msgpack_pack_array(&w->pk, (size_t)dg_node_num_control_inputs(n)));
    for (int i = 0; i < dg_node_num_control_inputs(n); i++) {
        const dg_node *dep = dg_node_control_input(n, i);
        if (dep->graph != g) {
            dg_status_setf(w->st, DG_INVALID_ARGUMENT, "graph file: node \"%s\": control input %d "
                           "(\"%s\") belongs to another graph", n->name, i, dep->name);
            return false;
        }
        MP_CHECK(w, pack_cstr(&w->pk, dep->name));
    }
    MP_CHECK(w, pack_cstr(&w->pk, "device"));
    MP_CHECK(w, pack_cstr(&w->pk, dg_node_requested_device(n)));
    if (*assigned) {
        MP_CHECK(w, pack_cstr(&w->pk, "assigned_device"));
        MP_CHECK(w, pack_cstr(&w->pk, assigned));
    }
    MP_CHECK(w, pack_cstr(&w->pk, "colocation"));
    MP_CHECK(w, msgpack_pack_array(&w->pk, (size_t)dg_node_num_colocations(n)));
    for (int i = 0; i < dg_node_num_colocations(n); i++)
        MP_CHECK(w, pack_cstr(&w->pk, dg_node_colocation(n, i)));
    MP_CHECK(w, pack_cstr(&w->pk, "attrs"));
    MP_CHECK(w, msgpack_pack_map(&w->pk, (size_t)n->n_attrs));
    for (int i = 0; i < n->n_attrs; i++) {
        MP_CHECK(w, pack_cstr(&w->pk, n->attrs[i].name));
        if (!write_attr(w, n, &n->attrs[i])) return false;
    }
    if (init) {
        MP_CHECK(w, pack_cstr(&w->pk, "initializer"));
        MP_CHECK(w, pack_cstr(&w->pk, init->name));
    }
    return true;
fail:
    return false;
}

bool dg_graph_to_msgpack(const dg_graph *g, char **buf, size_t *len, dg_status *st) {
    dg_status_reset(st);
    if (!g || !buf || !len) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "graph file: graph, buf and len must not be NULL");
        return false;
    }
    if (!dg_graph_ok(g)) {
        dg_status_setf(st, DG_FAILED_PRECONDITION, "graph file: the graph holds a builder error: %s",
                       dg_status_message(dg_graph_status(g)));
        return false;
    }
    writer w;
    msgpack_sbuffer_init(&w.sbuf);
    msgpack_packer_init(&w.pk, &w.sbuf, msgpack_sbuffer_write);
    w.st = st;
    bool has_seed;
    int64_t seed = graph_random_seed(g, &has_seed);
    int n_coll = 0;
    for (int c = 0; c < N_BUILTIN_COLLECTIONS; c++)
        if (dg_graph_collection_size(g, builtin_collections[c]) > 0) n_coll++;
    MP_CHECK(&w, msgpack_pack_map(&w.pk, 3 + (has_seed ? 1 : 0) + (n_coll ? 1 : 0)));
    MP_CHECK(&w, pack_cstr(&w.pk, "format"));
    MP_CHECK(&w, pack_cstr(&w.pk, MAGIC));
    MP_CHECK(&w, pack_cstr(&w.pk, "version"));
    MP_CHECK(&w, msgpack_pack_int(&w.pk, DG_GRAPH_FILE_VERSION));
    if (has_seed) {
        MP_CHECK(&w, pack_cstr(&w.pk, "random_seed"));
        MP_CHECK(&w, msgpack_pack_int64(&w.pk, seed));
    }
    MP_CHECK(&w, pack_cstr(&w.pk, "nodes"));
    int n_nodes = dg_graph_num_nodes(g);
    MP_CHECK(&w, msgpack_pack_array(&w.pk, (size_t)n_nodes));
    for (int i = 0; i < n_nodes; i++)
        if (!write_node(&w, g, dg_graph_node(g, i))) goto fail;
    if (n_coll) {
        MP_CHECK(&w, pack_cstr(&w.pk, "collections"));
        MP_CHECK(&w, msgpack_pack_map(&w.pk, (size_t)n_coll));
        for (int c = 0; c < N_BUILTIN_COLLECTIONS; c++) {
            int size = dg_graph_collection_size(g, builtin_collections[c]);
            if (size == 0) continue;
            MP_CHECK(&w, pack_cstr(&w.pk, builtin_collections[c]));
            MP_CHECK(&w, msgpack_pack_array(&w.pk, (size_t)size));
            for (int i = 0; i < size; i++)
                MP_CHECK(&w, pack_cstr(&w.pk, dg_graph_collection_get(g, builtin_collections[c], i)->name));
        }
    }
    if (w.sbuf.size > DG_GRAPH_FILE_MAX_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "graph file: the graph takes %zu bytes, more than the "
                       "%zu a graph file may hold", w.sbuf.size, DG_GRAPH_FILE_MAX_BYTES);
        goto fail;
    }
    *len = w.sbuf.size;
    *buf = msgpack_sbuffer_release(&w.sbuf);
    return true;
fail:
    msgpack_sbuffer_destroy(&w.sbuf);
    return false;
}

// ==== structure scanner ====

// Sets *off past the msgpack value at *off (within len). Checks truncation, nesting and that
// the elements every container declares could fit in the bytes left. Allocates nothing.
static bool scan_value(const uint8_t *p, size_t len, size_t *off_io, const char *label, dg_status *st) {
    uint64_t rem[MAX_DEPTH + 1];
    int depth = 0;
    rem[0] = 1;
    uint64_t pending = 1;   // items not yet read on every level; each takes at least one byte
    size_t off = *off_io;
    for (;;) {
        while (depth > 0 && rem[depth] == 0) depth--;
        if (rem[depth] == 0) break;
        rem[depth]--;
        pending--;
        if (off >= len) goto truncated;
        size_t start = off;
        uint8_t b = p[off];
        size_t n_len = 0;         // bytes of the length field after the type byte
        size_t fixed = 0;         // payload bytes after the type byte (fixed-size types)
        size_t ext_type = 0;      // 1 for ext: a type byte after the length
        int container = 0;        // 1: array, 2: map
        uint64_t count = 0;
        if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
        } else if (b <= 0x8f) {
            container = 2;
            count = b & 0x0f;
        } else if (b <= 0x9f) {
            container = 1;
            count = b & 0x0f;
        } else if (b <= 0xbf) {
            fixed = b & 0x1f;
        } else {
            switch (b) {
            case 0xc4: case 0xd9: n_len = 1; break;
            case 0xc5: case 0xda: n_len = 2; break;
            case 0xc6: case 0xdb: n_len = 4; break;
            case 0xc7: n_len = 1; ext_type = 1; break;
            case 0xc8: n_len = 2; ext_type = 1; break;
            case 0xc9: n_len = 4; ext_type = 1; break;
            case 0xca: fixed = 4; break;
            case 0xcb: fixed = 8; break;
            case 0xcc: case 0xd0: fixed = 1; break;
            case 0xcd: case 0xd1: fixed = 2; break;
            case 0xce: case 0xd2: fixed = 4; break;
            case 0xcf: case 0xd3: fixed = 8; break;
            case 0xd4: fixed = 2; break;
            case 0xd5: fixed = 3; break;
            case 0xd6: fixed = 5; break;
            case 0xd7: fixed = 9; break;
            case 0xd8: fixed = 17; break;
            case 0xdc: n_len = 2; container = 1; break;
            case 0xdd: n_len = 4; container = 1; break;
            case 0xde: n_len = 2; container = 2; break;
            case 0xdf: n_len = 4; container = 2; break;
            default:
                dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: byte %zu: 0x%02x is not a msgpack type",
                               label, off, b);
                return false;
            }
        }
        off++;
        if (n_len) {
            if (len - off < n_len) goto truncated;
            uint64_t v = 0;
            for (size_t k = 0; k < n_len; k++) v = v << 8 | p[off + k];
            off += n_len;
            if (container) count = v;
            else fixed = (size_t)v + ext_type;
        }
        if (fixed > len - off) goto truncated;
        off += fixed;
        if (!container || count == 0) continue;
        uint64_t items = container == 2 ? 2 * count : count;
        if (items > len - off) {
            dg_status_setf(st, DG_DATA_LOSS, "%s: truncated or corrupt: the %s at byte %zu declares "
                           "%" PRIu64 " %s, more than the %zu bytes left can hold", label,
                           container == 2 ? "map" : "array", start, count,
                           container == 2 ? "entries" : "elements", len - off);
            return false;
        }
        if (pending + items > len - off) {
            dg_status_setf(st, DG_DATA_LOSS, "%s: truncated or corrupt: the %s at byte %zu declares "
                           "%" PRIu64 " %s; with the %" PRIu64 " values still expected around it, that "
                           "is more than the %zu bytes left can hold", label,
                           container == 2 ? "map" : "array", start, count,
                           container == 2 ? "entries" : "elements", pending, len - off);
            return false;
        }
        if (depth == MAX_DEPTH) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: byte %zu: nested more than %d levels deep",
                           label, start, MAX_DEPTH);
            return false;
        }
        rem[++depth] = items;
        pending += items;
    }
    *off_io = off;
    return true;
truncated:
    dg_status_setf(st, DG_DATA_LOSS, "%s: truncated: a value at byte %zu runs past the end of the "
                   "%zu-byte buffer", label, off < len ? off : len, len);
    return false;
}

// Header readers for the top level of an already scanned buffer (the magic check runs
// before the scan, so they check bounds too). Return false if the next value is another type.
static bool rd_header(const uint8_t *p, size_t len, size_t *off, bool is_map, uint64_t *n) {
    if (*off >= len) return false;
    uint8_t b = p[*off];
    size_t n_len = 0;
    if (is_map && b >= 0x80 && b <= 0x8f) *n = b & 0x0f;
    else if (!is_map && b >= 0x90 && b <= 0x9f) *n = b & 0x0f;
    else if (b == (is_map ? 0xde : 0xdc)) n_len = 2;
    else if (b == (is_map ? 0xdf : 0xdd)) n_len = 4;
    else return false;
    if (n_len) {
        if (len - *off - 1 < n_len) return false;
        uint64_t v = 0;
        for (size_t k = 0; k < n_len; k++) v = v << 8 | p[*off + 1 + k];
        *n = v;
    }
    *off += 1 + n_len;
    return true;
}

static bool rd_str(const uint8_t *p, size_t len, size_t *off, const char **s, size_t *n) {
    if (*off >= len) return false;
    uint8_t b = p[*off];
    size_t n_len = 0;
    uint64_t v = 0;
    if (b >= 0xa0 && b <= 0xbf) v = b & 0x1f;
    else if (b == 0xd9) n_len = 1;
    else if (b == 0xda) n_len = 2;
    else if (b == 0xdb) n_len = 4;
    else return false;
    if (len - *off - 1 < n_len) return false;
    for (size_t k = 0; k < n_len; k++) v = v << 8 | p[*off + 1 + k];
    size_t start = *off + 1 + n_len;
    if (v > len - start) return false;
    *s = (const char *)p + start;
    *n = (size_t)v;
    *off = start + (size_t)v;
    return true;
}

static bool str_is(const char *s, size_t n, const char *lit) {
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

// ==== loader ====

typedef struct pending {
    dg_node *owner;
    char *name;     // owned
    bool is_initializer;   // else a control input
} pending;

typedef struct loader {
    const char *data;
    size_t len;
    const char *label;   // "graph file" or "graph file \"path\""
    dg_status *st;
    dg_graph *g;
    msgpack_unpacked up;
    int node_index;      // node being decoded, -1 outside nodes
    char name_q[128];    // its name, quoted for messages ("" if not known yet)
    char *device;        // the device scope pushed on g (owned), NULL if none
    pending *pend;
    int n_pend, cap_pend;
} loader;

// Writes s (n bytes) as a quoted, escaped, shortened string for messages.
static const char *quote(char *buf, size_t cap, const char *s, size_t n) {
    size_t o = 0;
    buf[o++] = '"';
    for (size_t i = 0; i < n && o + 8 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (o + 12 >= cap) {
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

static const char *quote_c(char *buf, size_t cap, const char *s) { return quote(buf, cap, s, strlen(s)); }

static bool fail(loader *L, dg_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail(loader *L, dg_code code, const char *fmt, ...) {
    char *msg = NULL;
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
    va_end(ap);
    if (L->node_index >= 0 && L->name_q[0])
        dg_status_setf(L->st, code, "%s: node %d (%s): %s", L->label, L->node_index, L->name_q,
                       msg ? msg : "");
    else if (L->node_index >= 0)
        dg_status_setf(L->st, code, "%s: node %d: %s", L->label, L->node_index, msg ? msg : "");
    else
        dg_status_setf(L->st, code, "%s: %s", L->label, msg ? msg : "");
    free(msg);
    return false;
}

static const char *type_name(const msgpack_object *o) {
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "bool";
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "int";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "str";
    case MSGPACK_OBJECT_BIN: return "bin";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    default: return "ext";
    }
}

static bool want(loader *L, const msgpack_object *o, msgpack_object_type t, const char *what,
                 const char *expected) {
    if (o->type == t) return true;
    return fail(L, DG_INVALID_ARGUMENT, "%s: expected %s, got %s", what, expected, type_name(o));
}

static bool get_i64(loader *L, const msgpack_object *o, const char *what, int64_t *out) {
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > INT64_MAX)
            return fail(L, DG_INVALID_ARGUMENT, "%s: %" PRIu64 " does not fit in int64", what, o->via.u64);
        *out = (int64_t)o->via.u64;
        return true;
    }
    return fail(L, DG_INVALID_ARGUMENT, "%s: expected int, got %s", what, type_name(o));
}

// A NUL-terminated copy of a str object (a NUL byte inside is an error).
static char *dup_str(loader *L, const msgpack_object *o, const char *what) {
    if (!want(L, o, MSGPACK_OBJECT_STR, what, "str")) return NULL;
    if (memchr(o->via.str.ptr, 0, o->via.str.size)) {
        fail(L, DG_INVALID_ARGUMENT, "%s: contains a NUL byte", what);
        return NULL;
    }
    char *s = malloc((size_t)o->via.str.size + 1);
    if (!s) {
        fail(L, DG_RESOURCE_EXHAUSTED, "%s: cannot allocate %u bytes", what, o->via.str.size + 1);
        return NULL;
    }
    if (o->via.str.size) memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = 0;
    return s;
}

static bool parse_dtype(loader *L, const msgpack_object *o, const char *what, bool allow_invalid,
                        dg_dtype *out) {
    if (o->type == MSGPACK_OBJECT_STR) {
        for (int t = 1; t < 64; t++)
            if (dg_dtype_is_valid((dg_dtype)t) && str_is(o->via.str.ptr, o->via.str.size, dg_dtype_name((dg_dtype)t))) {
                *out = (dg_dtype)t;
                return true;
            }
        char q[128];
        return fail(L, DG_INVALID_ARGUMENT, "%s: unknown dtype %s", what,
                    quote(q, sizeof q, o->via.str.ptr, o->via.str.size));
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 < 64 &&
        (dg_dtype_is_valid((dg_dtype)o->via.u64) || (allow_invalid && o->via.u64 == 0))) {
        *out = (dg_dtype)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER || o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
        return fail(L, DG_INVALID_ARGUMENT, "%s: %lld is not a dtype code", what,
                    o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (long long)o->via.i64 : (long long)(o->via.u64 > INT64_MAX ? INT64_MAX : o->via.u64));
    return fail(L, DG_INVALID_ARGUMENT, "%s: expected a dtype name, got %s", what, type_name(o));
}

// A shape: nil (unknown rank, if allowed) or an array of at most DG_MAX_RANK dims, each
// >= min_dim (-1: unknown allowed, 0: fully defined).
static bool parse_shape(loader *L, const msgpack_object *o, const char *what, bool allow_unknown,
                        int64_t min_dim, dg_shape *out) {
    if (o->type == MSGPACK_OBJECT_NIL && allow_unknown) {
        *out = dg_shape_unknown();
        return true;
    }
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return fail(L, DG_INVALID_ARGUMENT, "%s: expected %s, got %s", what,
                    allow_unknown ? "an array of dims or nil" : "an array of dims", type_name(o));
    if (o->via.array.size > DG_MAX_RANK)
        return fail(L, DG_INVALID_ARGUMENT, "%s: rank %u is more than %d", what, o->via.array.size,
                    DG_MAX_RANK);
    dg_shape s = dg_shape_scalar();
    s.rank = (int)o->via.array.size;
    for (int i = 0; i < s.rank; i++) {
        if (!get_i64(L, &o->via.array.ptr[i], what, &s.dims[i])) return false;
        if (s.dims[i] < min_dim)
            return fail(L, DG_INVALID_ARGUMENT, "%s: dimension %d is %lld (must be >= %lld)", what, i,
                        (long long)s.dims[i], (long long)min_dim);
    }
    *out = s;
    return true;
}

static dg_tensor *parse_tensor(loader *L, const msgpack_object *o, const char *what) {
    if (!want(L, o, MSGPACK_OBJECT_MAP, what, "a map {dtype, shape, data}")) return NULL;
    const msgpack_object *fields[3] = {NULL, NULL, NULL};
    static const char *const names[3] = {"dtype", "shape", "data"};
    char sub[300];
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        int f = -1;
        for (int j = 0; j < 3 && k->type == MSGPACK_OBJECT_STR; j++)
            if (str_is(k->via.str.ptr, k->via.str.size, names[j])) f = j;
        if (f < 0) {
            char q[128];
            fail(L, DG_INVALID_ARGUMENT, "%s: unknown tensor field %s", what,
                 k->type == MSGPACK_OBJECT_STR ? quote(q, sizeof q, k->via.str.ptr, k->via.str.size)
                                               : type_name(k));
            return NULL;
        }
        if (fields[f]) {
            fail(L, DG_INVALID_ARGUMENT, "%s: tensor field \"%s\" appears twice", what, names[f]);
            return NULL;
        }
        fields[f] = &o->via.map.ptr[i].val;
    }
    for (int j = 0; j < 3; j++)
        if (!fields[j]) {
            fail(L, DG_INVALID_ARGUMENT, "%s: tensor has no \"%s\"", what, names[j]);
            return NULL;
        }
    dg_dtype dt;
    dg_shape shape;
    snprintf(sub, sizeof sub, "%s: tensor dtype", what);
    if (!parse_dtype(L, fields[0], sub, false, &dt)) return NULL;
    snprintf(sub, sizeof sub, "%s: tensor shape", what);
    if (!parse_shape(L, fields[1], sub, false, 0, &shape)) return NULL;
    snprintf(sub, sizeof sub, "%s: tensor data", what);
    if (!want(L, fields[2], MSGPACK_OBJECT_BIN, sub, "bin")) return NULL;
    size_t have = fields[2]->via.bin.size, elem = dg_dtype_size(dt);
    // Element count with overflow checks; anything past `have` bytes cannot match anyway.
    uint64_t n = 1;
    bool too_big = false;
    for (int i = 0; i < shape.rank; i++) {
        uint64_t d = (uint64_t)shape.dims[i];
        if (d == 0) {
            n = 0;
            too_big = false;
            break;
        }
        if (n > UINT64_MAX / d) too_big = true;
        else n *= d;
    }
    char sb[160];
    if (too_big || n > UINT64_MAX / elem) {
        fail(L, DG_INVALID_ARGUMENT, "%s: tensor data has %zu bytes, but %s %s needs more than 2^64",
             what, have, dg_dtype_name(dt), dg_shape_str(&shape, sb, sizeof sb));
        return NULL;
    }
    if (n * elem != have) {
        fail(L, DG_INVALID_ARGUMENT, "%s: tensor data has %zu bytes, but %s %s needs %" PRIu64, what,
             have, dg_dtype_name(dt), dg_shape_str(&shape, sb, sizeof sb), n * elem);
        return NULL;
    }
    const uint8_t *bytes = (const uint8_t *)fields[2]->via.bin.ptr;
    if (dt == DG_BOOL)
        for (size_t i = 0; i < have; i++)
            if (bytes[i] > 1) {
                fail(L, DG_INVALID_ARGUMENT, "%s: bool tensor element %zu is %u, not 0 or 1", what, i,
                     bytes[i]);
                return NULL;
            }
    dg_status *tst = dg_status_new();
    dg_tensor *t = tst ? dg_tensor_new(dt, shape, tst) : NULL;
    if (!t) {
        fail(L, tst ? dg_status_code(tst) : DG_RESOURCE_EXHAUSTED, "%s: %s", what,
             tst ? dg_status_message(tst) : "out of memory");
        dg_status_free(&tst);
        return NULL;
    }
    dg_status_free(&tst);
    copy_le(dg_tensor_data(t), bytes, have, elem);
    return t;
}

static bool load_attr(loader *L, dg_node *n, const char *aname, const msgpack_object *v) {
    char what[200], aq[128];
    snprintf(what, sizeof what, "attr %s", quote_c(aq, sizeof aq, aname));
    if (v->type != MSGPACK_OBJECT_MAP || v->via.map.size != 1 ||
        v->via.map.ptr[0].key.type != MSGPACK_OBJECT_STR)
        return fail(L, DG_INVALID_ARGUMENT, "%s: expected a map with one entry {kind: value}, got %s%s",
                    what, type_name(v), v->type == MSGPACK_OBJECT_MAP ? " of another form" : "");
    const msgpack_object_str *k = &v->via.map.ptr[0].key.via.str;
    const msgpack_object *x = &v->via.map.ptr[0].val;
    if (str_is(k->ptr, k->size, "int")) {
        int64_t i;
        if (!get_i64(L, x, what, &i)) return false;
        graph_set_attr_int(n, aname, i);
    } else if (str_is(k->ptr, k->size, "float")) {
        double f;
        if (x->type == MSGPACK_OBJECT_FLOAT32 || x->type == MSGPACK_OBJECT_FLOAT64) f = x->via.f64;
        else if (x->type == MSGPACK_OBJECT_POSITIVE_INTEGER) f = (double)x->via.u64;
        else if (x->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) f = (double)x->via.i64;
        else return fail(L, DG_INVALID_ARGUMENT, "%s: expected float, got %s", what, type_name(x));
        graph_set_attr_float(n, aname, f);
    } else if (str_is(k->ptr, k->size, "bool")) {
        if (!want(L, x, MSGPACK_OBJECT_BOOLEAN, what, "bool")) return false;
        graph_set_attr_bool(n, aname, x->via.boolean);
    } else if (str_is(k->ptr, k->size, "type")) {
        dg_dtype t;
        if (!parse_dtype(L, x, what, true, &t)) return false;
        graph_set_attr_type(n, aname, t);
    } else if (str_is(k->ptr, k->size, "shape")) {
        dg_shape s;
        if (!parse_shape(L, x, what, true, -1, &s)) return false;
        graph_set_attr_shape(n, aname, s);
    } else if (str_is(k->ptr, k->size, "string")) {
        char *s = dup_str(L, x, what);
        if (!s) return false;
        graph_set_attr_string(n, aname, s);
        free(s);
    } else if (str_is(k->ptr, k->size, "ints")) {
        if (!want(L, x, MSGPACK_OBJECT_ARRAY, what, "an array of ints")) return false;
        uint32_t count = x->via.array.size;
        if (count > INT_MAX) return fail(L, DG_INVALID_ARGUMENT, "%s: %u ints is too many", what, count);
        int64_t *v64 = malloc(((size_t)count + 1) * sizeof *v64);
        if (!v64) return fail(L, DG_RESOURCE_EXHAUSTED, "%s: cannot allocate %u ints", what, count);
        for (uint32_t i = 0; i < count; i++)
            if (!get_i64(L, &x->via.array.ptr[i], what, &v64[i])) {
                free(v64);
                return false;
            }
        graph_set_attr_ints(n, aname, v64, (int)count);
        free(v64);
    } else if (str_is(k->ptr, k->size, "tensor")) {
        dg_tensor *t = parse_tensor(L, x, what);
        if (!t) return false;
        graph_set_attr_tensor(n, aname, t);
        dg_tensor_unref(t);
    } else {
        char q[128];
        return fail(L, DG_INVALID_ARGUMENT, "%s: unknown kind %s (expected int, float, bool, type, "
                    "shape, string, ints or tensor)", what, quote(q, sizeof q, k->ptr, k->size));
    }
    return true;
}

static bool add_pending(loader *L, dg_node *owner, const msgpack_object *o, const char *what,
                        bool is_initializer) {
    char *name = dup_str(L, o, what);
    if (!name) return false;
    if (!BASE_GROW(L->pend, L->n_pend, L->cap_pend, 1, what, NULL)) {
        free(name);
        return fail(L, DG_RESOURCE_EXHAUSTED, "%s: out of memory", what);
    }
    pending p = {owner, name, is_initializer};
    L->pend[L->n_pend++] = p;
    return true;
}

// Resolves an input reference: "name", "name:idx" or [name, idx].
static bool parse_input(loader *L, const msgpack_object *o, int i, dg_output *out) {
    char what[64], q[128];
    snprintf(what, sizeof what, "input %d", i);
    const msgpack_object *name_o = o;
    int64_t idx = 0;
    bool has_idx = false;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        if (o->via.array.size != 2)
            return fail(L, DG_INVALID_ARGUMENT, "%s: expected [name, index], got an array of %u",
                        what, o->via.array.size);
        name_o = &o->via.array.ptr[0];
        if (!get_i64(L, &o->via.array.ptr[1], what, &idx)) return false;
        has_idx = true;
    } else if (o->type != MSGPACK_OBJECT_STR) {
        return fail(L, DG_INVALID_ARGUMENT, "%s: expected \"name:index\" or [name, index], got %s",
                    what, type_name(o));
    }
    char *name = dup_str(L, name_o, what);
    if (!name) return false;
    if (!has_idx) {
        char *colon = strrchr(name, ':');
        if (colon) {
            char *end = NULL;
            errno = 0;
            long v = colon[1] >= '0' && colon[1] <= '9' ? strtol(colon + 1, &end, 10) : -1;
            if (v < 0 || errno || *end || v > INT_MAX) {
                fail(L, DG_INVALID_ARGUMENT, "%s: %s has a malformed output index", what,
                     quote_c(q, sizeof q, name));
                free(name);
                return false;
            }
            *colon = 0;
            idx = v;
        }
    }
    if (idx < 0 || idx > INT_MAX) {
        fail(L, DG_INVALID_ARGUMENT, "%s: output index %lld is out of range", what, (long long)idx);
        free(name);
        return false;
    }
    dg_node *src = dg_graph_find(L->g, name);
    if (!src) {
        fail(L, DG_INVALID_ARGUMENT, "%s names %s, which is not an earlier node in the file (inputs "
             "must come before their consumers)", what, quote_c(q, sizeof q, name));
        free(name);
        return false;
    }
    free(name);
    out->node = src;
    out->index = (int)idx;
    return true;
}

enum { F_NAME, F_OP, F_INPUTS, F_CTRL, F_DEVICE, F_ASSIGNED, F_COLOC, F_ATTRS, F_INIT, N_FIELDS };
static const char *const field_names[N_FIELDS] = {
    "name", "op", "inputs", "control_inputs", "device", "assigned_device", "colocation", "attrs",
    "initializer"};

// Stops building n after an error: a sticky graph error makes graph_finish discard it.
static bool abandon(loader *L, dg_node *n) {
    dg_graph_set_error(L->g, DG_ABORTED, "graph file: loading stopped");
    graph_finish(n);
    return false;
}

// The graph's sticky error (from graph_begin_absolute / graph_finish) as the load error.
static bool graph_fail(loader *L) {
    char saved[128];
    memcpy(saved, L->name_q, sizeof saved);
    L->name_q[0] = 0;   // the graph's message names the node itself
    fail(L, DG_INVALID_ARGUMENT, "%s", dg_status_message(dg_graph_status(L->g)));
    memcpy(L->name_q, saved, sizeof saved);
    return false;
}

static bool set_device_scope(loader *L, const char *dev) {
    if (strcmp(L->device ? L->device : "", dev) == 0) return true;
    if (L->device) {
        dg_graph_pop_device(L->g);
        free(L->device);
        L->device = NULL;
    }
    if (!*dev) return true;
    L->device = strdup(dev);
    if (!L->device) return fail(L, DG_RESOURCE_EXHAUSTED, "device: out of memory");
    dg_graph_push_device(L->g, dev);
    return true;
}

static bool check_device(loader *L, const char *dev, const char *what) {
    dg_device_name dn;
    dg_status *ds = dg_status_new();
    bool ok = ds && dg_device_name_parse(dev, &dn, ds);
    if (!ok) fail(L, DG_INVALID_ARGUMENT, "%s: %s", what, ds ? dg_status_message(ds) : "out of memory");
    dg_status_free(&ds);
    return ok;
}

static bool load_node(loader *L, const msgpack_object *o) {
    L->name_q[0] = 0;
    if (o->type != MSGPACK_OBJECT_MAP)
        return fail(L, DG_INVALID_ARGUMENT, "expected a map, got %s", type_name(o));
    const msgpack_object *f[N_FIELDS] = {NULL};
    // The name first, so every later message can quote it.
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key, *v = &o->via.map.ptr[i].val;
        if (k->type == MSGPACK_OBJECT_STR && str_is(k->via.str.ptr, k->via.str.size, "name") &&
            v->type == MSGPACK_OBJECT_STR) {
            quote(L->name_q, sizeof L->name_q, v->via.str.ptr, v->via.str.size);
            break;
        }
    }
    for (uint32_t i = 0; i < o->via.map.size; i++) {
        const msgpack_object *k = &o->via.map.ptr[i].key;
        if (k->type != MSGPACK_OBJECT_STR)
            return fail(L, DG_INVALID_ARGUMENT, "field %u: expected a str key, got %s", i, type_name(k));
        int fi = -1;
        for (int j = 0; j < N_FIELDS; j++)
            if (str_is(k->via.str.ptr, k->via.str.size, field_names[j])) fi = j;
        char q[128];
        if (fi < 0)
            return fail(L, DG_INVALID_ARGUMENT, "unknown field %s",
                        quote(q, sizeof q, k->via.str.ptr, k->via.str.size));
        if (f[fi]) return fail(L, DG_INVALID_ARGUMENT, "field \"%s\" appears twice", field_names[fi]);
        f[fi] = &o->via.map.ptr[i].val;
    }
    if (!f[F_NAME]) return fail(L, DG_INVALID_ARGUMENT, "has no \"name\"");
    if (!f[F_OP]) return fail(L, DG_INVALID_ARGUMENT, "has no \"op\"");
    char *name = dup_str(L, f[F_NAME], "field \"name\"");
    char *op = name ? dup_str(L, f[F_OP], "field \"op\"") : NULL;
    char *device = NULL, *assigned = NULL;
    dg_output *ins = NULL;
    dg_node *n = NULL;
    bool ok = false;
    char q[128];
    if (!op) goto done;
    const graph_op_def *def = graph_op_lookup(op);
    if (!def) {
        fail(L, DG_INVALID_ARGUMENT, "field \"op\": unknown op type %s", quote_c(q, sizeof q, op));
        goto done;
    }
    dg_node *dup = dg_graph_find(L->g, name);
    if (dup) {
        fail(L, DG_INVALID_ARGUMENT, "duplicate node name (node %d has it too)", dup->id);
        goto done;
    }
    device = f[F_DEVICE] ? dup_str(L, f[F_DEVICE], "field \"device\"") : strdup("");
    if (!device || !check_device(L, device, "field \"device\"")) goto done;
    if (f[F_ASSIGNED]) {
        assigned = dup_str(L, f[F_ASSIGNED], "field \"assigned_device\"");
        if (!assigned || (*assigned && !check_device(L, assigned, "field \"assigned_device\"")))
            goto done;
    }
    // Validate the shapes of the list fields before creating the node.
    static const int list_fields[] = {F_INPUTS, F_CTRL, F_COLOC};
    for (int j = 0; j < 3; j++) {
        char what[64];
        snprintf(what, sizeof what, "field \"%s\"", field_names[list_fields[j]]);
        if (f[list_fields[j]] && !want(L, f[list_fields[j]], MSGPACK_OBJECT_ARRAY, what, "an array"))
            goto done;
    }
    if (f[F_ATTRS] && !want(L, f[F_ATTRS], MSGPACK_OBJECT_MAP, "field \"attrs\"", "a map"))
        goto done;
    if (f[F_ATTRS] && f[F_ATTRS]->via.map.size > MAX_ATTRS_PER_NODE) {
        fail(L, DG_INVALID_ARGUMENT, "field \"attrs\": %u attributes, more than the %d a node may "
             "have", f[F_ATTRS]->via.map.size, MAX_ATTRS_PER_NODE);
        goto done;
    }
    if (f[F_INIT] && strcmp(op, "VariableV2") != 0) {
        fail(L, DG_INVALID_ARGUMENT, "field \"initializer\" is only for VariableV2 nodes");
        goto done;
    }
    uint32_t n_ins = f[F_INPUTS] ? f[F_INPUTS]->via.array.size : 0;
    ins = malloc(((size_t)n_ins + 1) * sizeof *ins);
    if (!ins) {
        fail(L, DG_RESOURCE_EXHAUSTED, "field \"inputs\": cannot allocate %u inputs", n_ins);
        goto done;
    }
    for (uint32_t i = 0; i < n_ins; i++)
        if (!parse_input(L, &f[F_INPUTS]->via.array.ptr[i], (int)i, &ins[i])) goto done;

    n = graph_begin_absolute(L->g, op, name);
    if (!n) {
        graph_fail(L);
        goto done;
    }
    for (uint32_t i = 0; i < n_ins; i++) graph_add_input(n, ins[i]);
    if (f[F_COLOC] && f[F_COLOC]->via.array.size > 0) {
        // Kept verbatim, like the builder's list: the names of the group, in order.
        uint32_t k = f[F_COLOC]->via.array.size;
        n->coloc = calloc(k, sizeof *n->coloc);
        if (!n->coloc) {
            fail(L, DG_RESOURCE_EXHAUSTED, "field \"colocation\": cannot allocate %u names", k);
            abandon(L, n);
            goto done;
        }
        for (uint32_t i = 0; i < k; i++) {
            char what[64];
            snprintf(what, sizeof what, "field \"colocation\": entry %u", i);
            n->coloc[i] = dup_str(L, &f[F_COLOC]->via.array.ptr[i], what);
            if (!n->coloc[i]) {
                abandon(L, n);
                goto done;
            }
            n->n_coloc = (int)i + 1;
        }
    }
    if (f[F_ATTRS]) {
        const msgpack_object_map *m = &f[F_ATTRS]->via.map;
        for (uint32_t i = 0; i < m->size; i++) {
            char what[64];
            snprintf(what, sizeof what, "attr %u name", i);
            char *aname = dup_str(L, &m->ptr[i].key, what);
            if (!aname) {
                abandon(L, n);
                goto done;
            }
            if (graph_node_attr(n, aname)) {
                fail(L, DG_INVALID_ARGUMENT, "attr %s appears twice", quote_c(q, sizeof q, aname));
                free(aname);
                abandon(L, n);
                goto done;
            }
            bool aok = load_attr(L, n, aname, &m->ptr[i].val);
            free(aname);
            if (!aok) {
                abandon(L, n);
                goto done;
            }
        }
    }
    if (!set_device_scope(L, device)) {
        abandon(L, n);
        goto done;
    }
    n = graph_finish(n);
    if (!n) {
        graph_fail(L);
        goto done;
    }
    if (assigned && *assigned) graph_set_assigned_device(n, assigned);
    if (f[F_CTRL])
        for (uint32_t i = 0; i < f[F_CTRL]->via.array.size; i++) {
            char what[64];
            snprintf(what, sizeof what, "control input %u", i);
            if (!add_pending(L, n, &f[F_CTRL]->via.array.ptr[i], what, false)) goto done;
        }
    if (f[F_INIT] && !add_pending(L, n, f[F_INIT], "field \"initializer\"", true)) goto done;
    ok = true;
done:
    free(name);
    free(op);
    free(device);
    free(assigned);
    free(ins);
    return ok;
}

// Control inputs and initializers may name later nodes, so they are resolved after every
// node exists. Control cycles are kept: loading never walks them.
static bool resolve_pending(loader *L) {
    int n_nodes = dg_graph_num_nodes(L->g);
    int *stamp = calloc((size_t)n_nodes + 1, sizeof *stamp);   // owner id + 1 of the last add
    if (!stamp) return fail(L, DG_RESOURCE_EXHAUSTED, "out of memory for %d nodes", n_nodes);
    bool ok = false;
    int i = 0;
    while (i < L->n_pend) {
        dg_node *owner = L->pend[i].owner;
        int j = i;
        while (j < L->n_pend && L->pend[j].owner == owner) j++;
        L->node_index = owner->id;
        quote_c(L->name_q, sizeof L->name_q, dg_node_name(owner));
        // dg_node_add_control_input dedups by a linear scan; a stamp keeps this linear.
        size_t want_n = (size_t)owner->n_ctrl + (size_t)(j - i);
        if (want_n > (size_t)owner->cap_ctrl) {
            dg_node **nc = realloc(owner->ctrl_inputs, want_n * sizeof *nc);
            if (!nc) {
                fail(L, DG_RESOURCE_EXHAUSTED, "out of memory for %zu control inputs", want_n);
                goto done;
            }
            owner->ctrl_inputs = nc;
            owner->cap_ctrl = (int)want_n;
        }
        for (int k = 0; k < owner->n_ctrl; k++) stamp[owner->ctrl_inputs[k]->id] = owner->id + 1;
        int ctrl_i = 0;
        for (int k = i; k < j; k++) {
            pending *p = &L->pend[k];
            dg_node *target = dg_graph_find(L->g, p->name);
            char q[128];
            if (!target) {
                if (p->is_initializer)
                    fail(L, DG_INVALID_ARGUMENT, "field \"initializer\" names %s, which is not a node "
                         "in the file", quote_c(q, sizeof q, p->name));
                else
                    fail(L, DG_INVALID_ARGUMENT, "control input %d names %s, which is not a node in "
                         "the file", ctrl_i, quote_c(q, sizeof q, p->name));
                goto done;
            }
            if (p->is_initializer) {
                owner->var_initializer = target;
                continue;
            }
            ctrl_i++;
            if (stamp[target->id] == owner->id + 1) continue;
            stamp[target->id] = owner->id + 1;
            owner->ctrl_inputs[owner->n_ctrl++] = target;
        }
        i = j;
    }
    ok = true;
done:
    free(stamp);
    L->node_index = -1;
    L->name_q[0] = 0;
    return ok;
}

static bool load_collections(loader *L, const msgpack_object *o) {
    if (!want(L, o, MSGPACK_OBJECT_MAP, "\"collections\"", "a map")) return false;
    int n_nodes = dg_graph_num_nodes(L->g);
    int *stamp = calloc((size_t)n_nodes + 1, sizeof *stamp);
    if (!stamp) return fail(L, DG_RESOURCE_EXHAUSTED, "out of memory for %d nodes", n_nodes);
    bool ok = false;
    char *cname = NULL;
    for (uint32_t c = 0; c < o->via.map.size; c++) {
        free(cname);
        cname = dup_str(L, &o->via.map.ptr[c].key, "\"collections\": name");
        if (!cname) goto done;
        char q[128], what[200];
        snprintf(what, sizeof what, "collection %s", quote_c(q, sizeof q, cname));
        const msgpack_object *list = &o->via.map.ptr[c].val;
        if (!want(L, list, MSGPACK_OBJECT_ARRAY, what, "an array of node names")) goto done;
        for (uint32_t i = 0; i < list->via.array.size; i++) {
            char *name = dup_str(L, &list->via.array.ptr[i], what);
            if (!name) goto done;
            dg_node *n = dg_graph_find(L->g, name);
            if (!n) {
                fail(L, DG_INVALID_ARGUMENT, "%s: entry %u names %s, which is not a node in the file",
                     what, i, quote_c(q, sizeof q, name));
                free(name);
                goto done;
            }
            free(name);
            // The graph dedups by a linear scan; skip repeats here so they cost nothing.
            if (stamp[n->id] == (int)c + 1) continue;
            stamp[n->id] = (int)c + 1;
            dg_graph_add_to_collection(L->g, cname, n);
        }
    }
    ok = true;
done:
    free(cname);
    free(stamp);
    return ok;
}

// Decodes the one value at *off with msgpack-c (the buffer is already scanned, so this only
// fails on out of memory).
static const msgpack_object *unpack_at(loader *L, size_t *off, const char *what) {
    msgpack_unpack_return rc = msgpack_unpack_next(&L->up, L->data, L->len, off);
    if (rc == MSGPACK_UNPACK_SUCCESS || rc == MSGPACK_UNPACK_EXTRA_BYTES) return &L->up.data;
    fail(L, rc == MSGPACK_UNPACK_NOMEM_ERROR ? DG_RESOURCE_EXHAUSTED : DG_DATA_LOSS,
         "%s: msgpack-c could not decode it (msgpack_unpack_next returned %d)", what, (int)rc);
    return NULL;
}

static dg_graph *load(const void *buf, size_t len, const char *label, dg_status *st) {
    loader L;
    memset(&L, 0, sizeof L);
    L.data = buf;
    L.len = len;
    L.label = label;
    L.st = st;
    L.node_index = -1;
    msgpack_unpacked_init(&L.up);
    const uint8_t *p = buf;
    if (!buf && len > 0) {
        fail(&L, DG_INVALID_ARGUMENT, "buffer is NULL");
        return NULL;
    }
    if (len > DG_GRAPH_FILE_MAX_BYTES) {
        fail(&L, DG_INVALID_ARGUMENT, "%zu bytes is more than the %zu a graph file may hold", len,
             DG_GRAPH_FILE_MAX_BYTES);
        return NULL;
    }
    if (len == 0) {
        fail(&L, DG_DATA_LOSS, "empty (0 bytes)");
        return NULL;
    }
    // Magic: a map whose first entry is "format": "distgraph-graph".
    size_t off = 0;
    uint64_t n_keys = 0;
    const char *s;
    size_t sn;
    bool magic = rd_header(p, len, &off, true, &n_keys) && n_keys > 0 &&
                 rd_str(p, len, &off, &s, &sn) && str_is(s, sn, "format") &&
                 rd_str(p, len, &off, &s, &sn) && str_is(s, sn, MAGIC);
    if (!magic) {
        // A prefix of a good header is a truncated file, anything else is not a graph file.
        static const uint8_t good[] = "\x85\xa6" "format" "\xaf" MAGIC;
        bool prefix = len < sizeof good - 1 && memcmp(p + 1, good + 1, len - 1) == 0 &&
                      ((p[0] >= 0x81 && p[0] <= 0x8f) || p[0] == 0xde || p[0] == 0xdf);
        if (prefix) fail(&L, DG_DATA_LOSS, "truncated after %zu bytes", len);
        else fail(&L, DG_DATA_LOSS, "not a distgraph graph (no \"format\": \"" MAGIC "\" at the start)");
        return NULL;
    }
    size_t end = 0;
    if (!scan_value(p, len, &end, label, st)) return NULL;
    if (end != len) {
        fail(&L, DG_INVALID_ARGUMENT, "%zu unexpected bytes after the graph (it ends at byte %zu)",
             len - end, end);
        return NULL;
    }
    L.g = dg_graph_new();
    if (!L.g) {
        fail(&L, DG_RESOURCE_EXHAUSTED, "out of memory for a graph");
        return NULL;
    }
    size_t nodes_off = 0, coll_off = 0;
    bool has_version = false;
    bool ok = false;
    // Top-level keys; "format" was read above.
    for (uint64_t k = 1; k < n_keys; k++) {
        if (!rd_str(p, len, &off, &s, &sn)) {
            fail(&L, DG_INVALID_ARGUMENT, "top-level key %" PRIu64 " is not a str", k);
            goto done;
        }
        char q[128];
        if (str_is(s, sn, "version")) {
            if (has_version) {
                fail(&L, DG_INVALID_ARGUMENT, "\"version\" appears twice");
                goto done;
            }
            const msgpack_object *v = unpack_at(&L, &off, "\"version\"");
            int64_t version = 0;
            if (!v || !get_i64(&L, v, "\"version\"", &version)) goto done;
            if (version != DG_GRAPH_FILE_VERSION) {
                fail(&L, DG_INVALID_ARGUMENT, "version %lld is not supported (this build reads "
                     "version %d)", (long long)version, DG_GRAPH_FILE_VERSION);
                goto done;
            }
            has_version = true;
        } else if (str_is(s, sn, "random_seed")) {
            const msgpack_object *v = unpack_at(&L, &off, "\"random_seed\"");
            int64_t seed;
            if (!v || !get_i64(&L, v, "\"random_seed\"", &seed)) goto done;
            dg_graph_set_random_seed(L.g, seed);
        } else if (str_is(s, sn, "nodes") || str_is(s, sn, "collections")) {
            size_t *where = str_is(s, sn, "nodes") ? &nodes_off : &coll_off;
            if (*where) {
                fail(&L, DG_INVALID_ARGUMENT, "%s appears twice", quote(q, sizeof q, s, sn));
                goto done;
            }
            *where = off;
            if (!scan_value(p, len, &off, label, st)) goto done;
        } else {
            fail(&L, DG_INVALID_ARGUMENT, "unknown top-level key %s", quote(q, sizeof q, s, sn));
            goto done;
        }
    }
    if (!has_version) {
        fail(&L, DG_INVALID_ARGUMENT, "no \"version\"");
        goto done;
    }
    if (!nodes_off) {
        fail(&L, DG_INVALID_ARGUMENT, "no \"nodes\"");
        goto done;
    }
    off = nodes_off;
    uint64_t n_nodes = 0;
    if (!rd_header(p, len, &off, false, &n_nodes)) {
        size_t o2 = nodes_off;
        const msgpack_object *v = unpack_at(&L, &o2, "\"nodes\"");
        if (v) fail(&L, DG_INVALID_ARGUMENT, "\"nodes\": expected an array, got %s", type_name(v));
        goto done;
    }
    if (n_nodes > DG_GRAPH_FILE_MAX_NODES) {
        fail(&L, DG_INVALID_ARGUMENT, "%" PRIu64 " nodes is more than the %d a graph file may hold",
             n_nodes, DG_GRAPH_FILE_MAX_NODES);
        goto done;
    }
    for (uint64_t i = 0; i < n_nodes; i++) {
        L.node_index = (int)i;
        L.name_q[0] = 0;
        const msgpack_object *o = unpack_at(&L, &off, "node");
        if (!o || !load_node(&L, o)) goto done;
    }
    L.node_index = -1;
    L.name_q[0] = 0;
    if (L.device) {
        dg_graph_pop_device(L.g);
        free(L.device);
        L.device = NULL;
    }
    if (!resolve_pending(&L)) goto done;
    if (coll_off) {
        off = coll_off;
        const msgpack_object *o = unpack_at(&L, &off, "\"collections\"");
        if (!o || !load_collections(&L, o)) goto done;
    }
    if (!dg_graph_ok(L.g)) {
        graph_fail(&L);
        goto done;
    }
    ok = true;
done:
    msgpack_unpacked_destroy(&L.up);
    for (int i = 0; i < L.n_pend; i++) free(L.pend[i].name);
    free(L.pend);
    free(L.device);
    if (!ok) dg_graph_free(&L.g);
    return L.g;
}

dg_graph *dg_graph_from_msgpack(const void *buf, size_t len, dg_status *st) {
    dg_status_reset(st);
    return load(buf, len, "graph file", st);
}

// ==== files ====

bool dg_graph_save(const dg_graph *g, const char *path, dg_status *st) {
    dg_status_reset(st);
    if (!path || !*path) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "graph file: empty path");
        return false;
    }
    char *buf = NULL, *tmp = NULL;
    size_t len = 0;
    int fd = -1;
    bool ok = false;
    if (!dg_graph_to_msgpack(g, &buf, &len, st)) {
        dg_status_prepend(st, "saving \"%s\"", path);
        return false;
    }
    if (asprintf(&tmp, "%s.tmp.XXXXXX", path) < 0) {
        tmp = NULL;
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "saving \"%s\": out of memory", path);
        goto done;
    }
    fd = mkstemp(tmp);
    if (fd < 0) {
        dg_status_setf(st, errno_code(errno), "saving \"%s\": creating %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    for (size_t o = 0; o < len;) {
        ssize_t w = write(fd, buf + o, len - o);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            dg_status_setf(st, errno_code(w < 0 ? errno : EIO), "saving \"%s\": writing %s: %s", path,
                           tmp, strerror(w < 0 ? errno : EIO));
            goto done;
        }
        o += (size_t)w;
    }
    if (fchmod(fd, 0644) != 0 || close(fd) != 0) {
        fd = -1;
        dg_status_setf(st, errno_code(errno), "saving \"%s\": closing %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    fd = -1;
    if (rename(tmp, path) != 0) {
        dg_status_setf(st, errno_code(errno), "saving \"%s\": renaming %s: %s", path, tmp, strerror(errno));
        goto done;
    }
    ok = true;
done:
    if (fd >= 0) close(fd);
    if (!ok && tmp) unlink(tmp);
    free(tmp);
    free(buf);
    return ok;
}

dg_graph *dg_graph_load(const char *path, dg_status *st) {
    dg_status_reset(st);
    if (!path || !*path) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "graph file: empty path");
        return NULL;
    }
    char *label = NULL, *buf = NULL;
    dg_graph *g = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        dg_status_setf(st, errno_code(errno), "graph file \"%s\": %s", path, strerror(errno));
        return NULL;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        dg_status_setf(st, errno_code(errno), "graph file \"%s\": %s", path, strerror(errno));
        goto done;
    }
    if (S_ISDIR(sb.st_mode)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "graph file \"%s\": is a directory", path);
        goto done;
    }
    if (S_ISREG(sb.st_mode) && (uint64_t)sb.st_size > DG_GRAPH_FILE_MAX_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "graph file \"%s\": %lld bytes is more than the %zu "
                       "a graph file may hold", path, (long long)sb.st_size, DG_GRAPH_FILE_MAX_BYTES);
        goto done;
    }
    // Read to the end (the size may change, or the file may be a pipe), never past the limit.
    size_t cap = S_ISREG(sb.st_mode) ? (size_t)sb.st_size + 1 : 65536, len = 0;
    buf = malloc(cap);
    if (!buf) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "graph file \"%s\": cannot allocate %zu bytes", path, cap);
        goto done;
    }
    for (;;) {
        if (len == cap) {
            if (cap > DG_GRAPH_FILE_MAX_BYTES) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "graph file \"%s\": more than the %zu bytes a "
                               "graph file may hold", path, DG_GRAPH_FILE_MAX_BYTES);
                goto done;
            }
            size_t ncap = cap * 2 > DG_GRAPH_FILE_MAX_BYTES + 1 ? DG_GRAPH_FILE_MAX_BYTES + 1 : cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "graph file \"%s\": cannot allocate %zu bytes",
                               path, ncap);
                goto done;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            dg_status_setf(st, errno_code(errno), "graph file \"%s\": reading: %s", path, strerror(errno));
            goto done;
        }
        if (r == 0) break;
        len += (size_t)r;
    }
    if (asprintf(&label, "graph file \"%s\"", path) < 0) {
        label = NULL;
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "graph file \"%s\": out of memory", path);
        goto done;
    }
    g = load(buf, len, label, st);
done:
    close(fd);
    free(buf);
    free(label);
    return g;
}
