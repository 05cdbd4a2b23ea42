/* Encoding and strict decoding of message headers. A peer can send anything: every count,
 * size, dtype and shape is checked before it is used. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_impl.h"
#include "wire_impl.h"

const char *rt_type_name(int type) {
    static const char *names[] = {"?", "RESPONSE", "PING", "LIST_DEVICES", "REGISTER_GRAPH",
                                  "DEREGISTER_GRAPH", "RUN_GRAPH", "TENSOR", "TENSOR_CHUNK",
                                  "ABORT_STEP", "END_STEP", "GET_VARIABLES", "CREATE_SESSION",
                                  "EXTEND_SESSION", "RUN_STEP", "CLOSE_SESSION", "KEEPALIVE", "RESET",
                                  "SERVER_STATUS", "ATTACH_CHANNEL", "TAKE_ANSWER"};
    return type > 0 && type <= RT_TYPE_MAX ? names[type] : "UNKNOWN";
}

void rt_header_init(rt_header *h, int type) {
    memset(h, 0, sizeof *h);
    h->version = RT_PROTOCOL_VERSION;
    h->type = type;
}

void rt_header_clear(rt_header *h) {
    free(h->message);
    free(h->key);
    free(h->from);
    for (int i = 0; i < h->n_names; i++) free(h->names[i]);
    free(h->names);
    free(h->tensors);
    free(h->blob);
    memset(h, 0, sizeof *h);
}

void rt_header_add_name(rt_header *h, const char *name) {
    char **nn = realloc(h->names, (size_t)(h->n_names + 1) * sizeof *nn);
    if (!nn || !(nn[h->n_names] = strdup(name))) abort();
    h->names = nn;
    h->n_names++;
}

void rt_header_add_tensor(rt_header *h, const dg_tensor *t) {
    rt_tensor_desc *nt = realloc(h->tensors, (size_t)(h->n_tensors + 1) * sizeof *nt);
    if (!nt) abort();
    h->tensors = nt;
    nt[h->n_tensors].dtype = t->dtype;
    nt[h->n_tensors].shape = t->shape;
    nt[h->n_tensors].nbytes = t->nbytes;
    h->n_tensors++;
}

void rt_header_set_blob(rt_header *h, const void *data, size_t len) {
    free(h->blob);
    h->blob = malloc(len ? len : 1);
    if (!h->blob) abort();
    if (len) memcpy(h->blob, data, len);
    h->blob_len = len;
}

void rt_header_set_message(rt_header *h, const char *msg) {
    free(h->message);
    h->message = msg ? strdup(msg) : NULL;
}

static void pack_str(msgpack_packer *pk, const char *s) {
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_key(msgpack_packer *pk, const char *k) { pack_str(pk, k); }

char *rt_header_encode(const rt_header *h, size_t *len) {
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    int n = 2 + (h->id != 0) + (h->code != 0) + (h->message != NULL) + (h->step_id != 0) +
            (h->handle != 0) + (h->key != NULL) + (h->from != NULL) + (h->n_names > 0) +
            (h->n_feeds != 0) + (h->n_tensors > 0) + (h->blob != NULL) + (h->type == RT_TENSOR_CHUNK ? 3 : 0) +
            (h->deadline_ms != 0) + (h->incarnation != 0) + (h->trace != 0) + (h->parts != 0);
    msgpack_pack_map(&pk, (size_t)n);
    pack_key(&pk, "v");
    msgpack_pack_int64(&pk, h->version);
    pack_key(&pk, "t");
    msgpack_pack_int(&pk, h->type);
    if (h->id) { pack_key(&pk, "id"); msgpack_pack_uint64(&pk, h->id); }
    if (h->code) { pack_key(&pk, "code"); msgpack_pack_int(&pk, h->code); }
    if (h->message) { pack_key(&pk, "msg"); pack_str(&pk, h->message); }
    if (h->step_id) { pack_key(&pk, "step"); msgpack_pack_int64(&pk, h->step_id); }
    if (h->handle) { pack_key(&pk, "h"); msgpack_pack_int64(&pk, h->handle); }
    if (h->key) { pack_key(&pk, "key"); pack_str(&pk, h->key); }
    if (h->from) { pack_key(&pk, "from"); pack_str(&pk, h->from); }
    if (h->n_names > 0) {
        pack_key(&pk, "names");
        msgpack_pack_array(&pk, (size_t)h->n_names);
        for (int i = 0; i < h->n_names; i++) pack_str(&pk, h->names[i]);
    }
    if (h->n_feeds) { pack_key(&pk, "nf"); msgpack_pack_int64(&pk, h->n_feeds); }
    if (h->n_tensors > 0) {
        pack_key(&pk, "tensors");
        msgpack_pack_array(&pk, (size_t)h->n_tensors);
        for (int i = 0; i < h->n_tensors; i++) {
            const rt_tensor_desc *d = &h->tensors[i];
            msgpack_pack_array(&pk, 3);
            msgpack_pack_int(&pk, d->dtype);
            msgpack_pack_array(&pk, (size_t)d->shape.rank);
            for (int k = 0; k < d->shape.rank; k++) msgpack_pack_int64(&pk, d->shape.dims[k]);
            msgpack_pack_uint64(&pk, d->nbytes);
        }
    }
    if (h->blob) {
        pack_key(&pk, "blob");
        msgpack_pack_bin(&pk, h->blob_len);
        msgpack_pack_bin_body(&pk, h->blob, h->blob_len);
    }
    if (h->type == RT_TENSOR_CHUNK) {
        pack_key(&pk, "xfer");
        msgpack_pack_uint64(&pk, h->xfer);
        pack_key(&pk, "off");
        msgpack_pack_uint64(&pk, h->offset);
        pack_key(&pk, "total");
        msgpack_pack_uint64(&pk, h->total);
    }
    if (h->deadline_ms) { pack_key(&pk, "dl"); msgpack_pack_int64(&pk, h->deadline_ms); }
    if (h->incarnation) { pack_key(&pk, "inc"); msgpack_pack_uint64(&pk, h->incarnation); }
    if (h->trace) { pack_key(&pk, "tr"); msgpack_pack_int64(&pk, h->trace); }
    if (h->parts) { pack_key(&pk, "np"); msgpack_pack_int64(&pk, h->parts); }
    *len = sb.size;
    return sb.data;   // sbuffer memory is malloc'd; the caller frees it
}

// ---- decoding ----

bool rt_msgpack_int(const msgpack_object *o, int64_t *v) {
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)o->via.u64;
        return true;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *v = o->via.i64;
        return true;
    }
    return false;
}

static bool get_u64(const msgpack_object *o, uint64_t *v) {
    if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER) return false;
    *v = o->via.u64;
    return true;
}

static char *get_str(const msgpack_object *o) {
    if (o->type != MSGPACK_OBJECT_STR || o->via.str.size > RT_MAX_STRING) return NULL;
    if (memchr(o->via.str.ptr, 0, o->via.str.size)) return NULL;
    char *s = malloc(o->via.str.size + 1);
    if (!s) return NULL;
    memcpy(s, o->via.str.ptr, o->via.str.size);
    s[o->via.str.size] = 0;
    return s;
}

bool rt_msgpack_key_is(const msgpack_object *k, const char *name) {
    size_t n = strlen(name);
    return k->type == MSGPACK_OBJECT_STR && k->via.str.size == n && memcmp(k->via.str.ptr, name, n) == 0;
}

static bool decode_tensor(const msgpack_object *o, rt_tensor_desc *d, int i, dg_status *st) {
    if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size != 3) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: tensors[%d] must be [dtype, dims, bytes]", i);
        return false;
    }
    const msgpack_object *a = o->via.array.ptr;
    int64_t dt;
    if (!rt_msgpack_int(&a[0], &dt) || dt < 0 || dt > 64 || !dg_dtype_is_valid((dg_dtype)dt)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: tensors[%d] has an unknown dtype", i);
        return false;
    }
    if (a[1].type != MSGPACK_OBJECT_ARRAY || a[1].via.array.size > DG_MAX_RANK) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: tensors[%d] dims must be a list of at most %d",
                       i, DG_MAX_RANK);
        return false;
    }
    d->dtype = (dg_dtype)dt;
    d->shape = dg_shape_scalar();
    d->shape.rank = (int)a[1].via.array.size;
    for (int k = 0; k < d->shape.rank; k++) {
        int64_t v;
        if (!rt_msgpack_int(&a[1].via.array.ptr[k], &v) || v < 0 || v > ((int64_t)1 << 40)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "header: tensors[%d] dimension %d is not a size", i, k);
            return false;
        }
        d->shape.dims[k] = v;
    }
    int64_t n = tensor_shape_elements(&d->shape);
    if (!get_u64(&a[2], &d->nbytes) || n < 0 ||
        (uint64_t)n > UINT64_MAX / dg_dtype_size(d->dtype) ||
        (uint64_t)n * dg_dtype_size(d->dtype) != d->nbytes) {
        char b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: tensors[%d]: byte count does not match %s %s",
                       i, dg_dtype_name(d->dtype), dg_shape_str(&d->shape, b, sizeof b));
        return false;
    }
    return true;
}

// At most this many msgpack values in one header: far above what names and tensors allow,
// far below what a 256 MiB header could declare.
#define MAX_HEADER_VALUES ((uint64_t)RT_MAX_NAMES + 16 * (uint64_t)RT_MAX_TENSORS + 65536)

static uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | p[i];
    return v;
}

// Walks the first msgpack value of buf without building it. msgpack-c allocates an array or
// map's element table from its declared count before reading the elements, so 5 bytes can
// ask for gigabytes; here every declared count must fit in the bytes that remain (each value
// takes at least one byte) and the total is capped, so the unpacker's allocations stay within
// a small multiple of len.
static bool prescan(const unsigned char *p, size_t len, dg_status *st) {
    uint64_t pending = 1, n_values = 0;
    size_t pos = 0;
    while (pending > 0) {
        if (pos >= len) goto truncated;
        unsigned c = p[pos];
        pending--;
        if (++n_values > MAX_HEADER_VALUES) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "header: more than %llu msgpack values",
                           (unsigned long long)MAX_HEADER_VALUES);
            return false;
        }
        size_t head = 1;        // type byte plus length bytes
        uint64_t body = 0;      // payload bytes
        uint64_t children = 0;  // values that follow as elements
        if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) {
        } else if (c <= 0x8f) {
            children = 2 * (uint64_t)(c & 0x0f);
        } else if (c <= 0x9f) {
            children = c & 0x0f;
        } else if (c <= 0xbf) {
            body = c & 0x1f;
        } else {
            static const signed char lenbytes[32] = {
                // c0 .. cf: nil, (never used), false, true, bin8/16/32, ext8/16/32, float32/64,
                // uint8/16/32/64
                0, -1, 0, 0, 1, 2, 4, 1, 2, 4, 0, 0, 0, 0, 0, 0,
                // d0 .. df: int8/16/32/64, fixext1/2/4/8/16, str8/16/32, array16/32, map16/32
                0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 2, 4, 2, 4};
            static const unsigned char fixed[32] = {
                0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 4, 8, 1, 2, 4, 8,
                1, 2, 4, 8, 2, 3, 5, 9, 17, 0, 0, 0, 0, 0, 0, 0};
            int lb = lenbytes[c - 0xc0];
            if (lb < 0) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "header: byte 0x%02x at offset %zu is not msgpack",
                               c, pos);
                return false;
            }
            head += (size_t)lb;
            if (pos + head > len) goto truncated;
            uint64_t n = be(p + pos + 1, lb);
            body = fixed[c - 0xc0];
            if (c == 0xdc || c == 0xdd) children = n;
            else if (c == 0xde || c == 0xdf) children = 2 * n;
            else body += n;   // bin, ext (fixed counts the ext type byte), str
        }
        if (pos + head > len || body > len - pos - head) goto truncated;
        pos += head + (size_t)body;
        if (children > len - pos || pending + children > len - pos) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "header: a list or map declares %llu elements "
                           "with only %zu bytes left", (unsigned long long)children, len - pos);
            return false;
        }
        pending += children;
    }
    return true;
truncated:
    dg_status_set(st, DG_INVALID_ARGUMENT, "header: not a complete msgpack value");
    return false;
}

bool rt_msgpack_prescan(const void *buf, size_t len, dg_status *st) { return prescan(buf, len, st); }

bool rt_header_decode(const void *buf, size_t len, rt_header *h, dg_status *st) {
    memset(h, 0, sizeof *h);
    if (len > RT_MAX_HEADER_BYTES) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: %zu bytes is over the limit of %u", len,
                       RT_MAX_HEADER_BYTES);
        return false;
    }
    if (!prescan(buf, len, st)) return false;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    bool ok = false;
    if (msgpack_unpack_next(&up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "header: not a complete msgpack value");
        goto done;
    }
    if (off != len) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: %zu trailing bytes", len - off);
        goto done;
    }
    const msgpack_object *root = &up.data;
    if (root->type != MSGPACK_OBJECT_MAP) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "header: not a map");
        goto done;
    }
    bool has_v = false, has_t = false;
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object *k = &root->via.map.ptr[i].key, *v = &root->via.map.ptr[i].val;
        int64_t iv;
        const char *bad = NULL;
        if (rt_msgpack_key_is(k, "v")) {
            if (!rt_msgpack_int(v, &h->version)) bad = "v";
            has_v = true;
        } else if (rt_msgpack_key_is(k, "t")) {
            if (!rt_msgpack_int(v, &iv) || iv < 1 || iv > RT_TYPE_MAX) bad = "t";
            else h->type = (int)iv;
            has_t = true;
        } else if (rt_msgpack_key_is(k, "id")) {
            if (!get_u64(v, &h->id)) bad = "id";
        } else if (rt_msgpack_key_is(k, "code")) {
            if (!rt_msgpack_int(v, &iv) || iv < 0 || iv > 16) bad = "code";
            else h->code = (int)iv;
        } else if (rt_msgpack_key_is(k, "msg")) {
            if (h->message || !(h->message = get_str(v))) bad = "msg";
        } else if (rt_msgpack_key_is(k, "step")) {
            if (!rt_msgpack_int(v, &h->step_id)) bad = "step";
        } else if (rt_msgpack_key_is(k, "h")) {
            if (!rt_msgpack_int(v, &h->handle)) bad = "h";
        } else if (rt_msgpack_key_is(k, "key")) {
            if (h->key || !(h->key = get_str(v))) bad = "key";
        } else if (rt_msgpack_key_is(k, "from")) {
            if (h->from || !(h->from = get_str(v))) bad = "from";
        } else if (rt_msgpack_key_is(k, "nf")) {
            if (!rt_msgpack_int(v, &h->n_feeds) || h->n_feeds < 0) bad = "nf";
        } else if (rt_msgpack_key_is(k, "names")) {
            if (h->names || v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > RT_MAX_NAMES) {
                bad = "names";
            } else {
                h->names = calloc((size_t)v->via.array.size + 1, sizeof *h->names);
                if (!h->names) bad = "names";
                for (uint32_t j = 0; j < v->via.array.size && !bad; j++) {
                    if (!(h->names[j] = get_str(&v->via.array.ptr[j]))) bad = "names";
                    else h->n_names++;
                }
            }
        } else if (rt_msgpack_key_is(k, "tensors")) {
            if (h->tensors || v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size > RT_MAX_TENSORS) {
                bad = "tensors";
            } else {
                h->tensors = calloc((size_t)v->via.array.size + 1, sizeof *h->tensors);
                if (!h->tensors) bad = "tensors";
                for (uint32_t j = 0; j < v->via.array.size && !bad; j++) {
                    if (!decode_tensor(&v->via.array.ptr[j], &h->tensors[j], (int)j, st)) goto done;
                    h->n_tensors++;
                }
            }
        } else if (rt_msgpack_key_is(k, "blob")) {
            if (h->blob || v->type != MSGPACK_OBJECT_BIN) bad = "blob";
            else rt_header_set_blob(h, v->via.bin.ptr, v->via.bin.size);
        } else if (rt_msgpack_key_is(k, "xfer")) {
            if (!get_u64(v, &h->xfer)) bad = "xfer";
        } else if (rt_msgpack_key_is(k, "off")) {
            if (!get_u64(v, &h->offset)) bad = "off";
        } else if (rt_msgpack_key_is(k, "total")) {
            if (!get_u64(v, &h->total) || h->total > ((uint64_t)1 << 40)) bad = "total";
        } else if (rt_msgpack_key_is(k, "dl")) {
            if (!rt_msgpack_int(v, &h->deadline_ms) || h->deadline_ms < 0) bad = "dl";
        } else if (rt_msgpack_key_is(k, "inc")) {
            if (!get_u64(v, &h->incarnation)) bad = "inc";
        } else if (rt_msgpack_key_is(k, "tr")) {
            if (!rt_msgpack_int(v, &h->trace) || h->trace < 0 || h->trace > 1) bad = "tr";
        } else if (rt_msgpack_key_is(k, "np")) {
            if (!rt_msgpack_int(v, &h->parts) || h->parts < 0 || h->parts > RT_MAX_STEP_PARTS) bad = "np";
        } else {
            // Unknown keys are ignored, so newer peers may add fields.
        }
        if (bad) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "header: field \"%s\" has the wrong type or an "
                           "out-of-range value", bad);
            goto done;
        }
    }
    if (!has_v || !has_t) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: missing \"%s\"", has_v ? "t" : "v");
        goto done;
    }
    if (h->version != RT_PROTOCOL_VERSION) {
        dg_status_setf(st, DG_UNIMPLEMENTED, "header: protocol version %lld, this build speaks %d",
                       (long long)h->version, RT_PROTOCOL_VERSION);
        goto done;
    }
    if (h->n_feeds > h->n_names) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "header: %lld feeds but only %d names",
                       (long long)h->n_feeds, h->n_names);
        goto done;
    }
    if (h->type == RT_TENSOR_CHUNK && (h->offset > h->total)) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "header: chunk offset past the total");
        goto done;
    }
    ok = true;
done:
    msgpack_unpacked_destroy(&up);
    if (!ok) rt_header_clear(h);
    return ok;
}
