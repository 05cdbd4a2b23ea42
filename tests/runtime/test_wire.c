/* Message headers (runtime/wire.c): every field survives a round trip, and every malformed
 * header a peer could send is refused with INVALID_ARGUMENT (UNIMPLEMENTED for another
 * protocol version) and a message naming the fault, without crashing and without large
 * allocations. */
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "wire_impl.h"

// ---- helpers ----

static bool same_str(const char *a, const char *b) {
    return (!a && !b) || (a && b && strcmp(a, b) == 0);
}

// Compares the fields rt_header_encode writes.
static void assert_same_header(const rt_header *a, const rt_header *b) {
    assert_int_equal(a->version, b->version);
    assert_int_equal(a->type, b->type);
    assert_true(a->id == b->id);
    assert_int_equal(a->code, b->code);
    assert_true(same_str(a->message, b->message));
    assert_true(a->step_id == b->step_id);
    assert_true(a->handle == b->handle);
    assert_true(same_str(a->key, b->key));
    assert_true(same_str(a->from, b->from));
    assert_int_equal(a->n_names, b->n_names);
    for (int i = 0; i < a->n_names; i++) assert_string_equal(a->names[i], b->names[i]);
    assert_true(a->n_feeds == b->n_feeds);
    assert_int_equal(a->n_tensors, b->n_tensors);
    for (int i = 0; i < a->n_tensors; i++) {
        assert_int_equal(a->tensors[i].dtype, b->tensors[i].dtype);
        assert_true(dg_shape_equal(&a->tensors[i].shape, &b->tensors[i].shape));
        assert_true(a->tensors[i].nbytes == b->tensors[i].nbytes);
    }
    assert_int_equal(a->blob == NULL, b->blob == NULL);
    assert_int_equal(a->blob_len, b->blob_len);
    if (a->blob_len) assert_memory_equal(a->blob, b->blob, a->blob_len);
    if (a->type == RT_TENSOR_CHUNK) {
        assert_true(a->xfer == b->xfer);
        assert_true(a->offset == b->offset);
        assert_true(a->total == b->total);
    }
    assert_true(a->deadline_ms == b->deadline_ms);
    assert_true(a->parts == b->parts);
}

static void round_trip(const rt_header *h) {
    size_t len = 0;
    char *buf = rt_header_encode(h, &len);
    assert_non_null(buf);
    rt_header g;
    dg_status *st = dg_status_new();
    assert_true(rt_header_decode(buf, len, &g, st));
    assert_ok(st);
    assert_same_header(h, &g);
    rt_header_clear(&g);
    dg_status_free(&st);
    free(buf);
}

static bool is_cleared(const rt_header *h) {
    static const rt_header zero;
    return memcmp(h, &zero, sizeof *h) == 0;
}

// Decoding buf must fail with code and a message containing needle, leaving h cleared.
static void expect_fail_at(const void *buf, size_t len, dg_code code, const char *needle, int line) {
    rt_header h;
    memset(&h, 0x5a, sizeof h);
    dg_status *st = dg_status_new();
    bool ok = rt_header_decode(buf, len, &h, st);
    if (ok) {
        rt_header_clear(&h);
        fail_msg("line %d: decoding succeeded, expected %s \"%s\"", line, dg_code_name(code), needle);
    }
    dg_test_assert_status(st, code, needle, __FILE__, line);
    if (strncmp(dg_status_message(st), "header: ", 8) != 0)
        fail_msg("line %d: message \"%s\" does not start with \"header: \"", line, dg_status_message(st));
    if (!is_cleared(&h)) fail_msg("line %d: header not cleared after a failed decode", line);
    dg_status_free(&st);
}
#define expect_fail(buf, len, code, needle) expect_fail_at((buf), (len), (code), (needle), __LINE__)

// A msgpack writer for hand-made headers.
typedef struct mp {
    msgpack_sbuffer sb;
    msgpack_packer pk;
} mp;

static void mp_init(mp *m) {
    msgpack_sbuffer_init(&m->sb);
    msgpack_packer_init(&m->pk, &m->sb, msgpack_sbuffer_write);
}
static void mp_destroy(mp *m) { msgpack_sbuffer_destroy(&m->sb); }
static void mp_strn(mp *m, const char *s, size_t n) {
    msgpack_pack_str(&m->pk, n);
    msgpack_pack_str_body(&m->pk, s, n);
}
static void mp_str(mp *m, const char *s) { mp_strn(m, s, strlen(s)); }
// Starts a map of n_extra + 2 entries holding v = 1 and t = type.
static void mp_head(mp *m, int type, int n_extra) {
    mp_init(m);
    msgpack_pack_map(&m->pk, (size_t)(2 + n_extra));
    mp_str(m, "v");
    msgpack_pack_int(&m->pk, RT_PROTOCOL_VERSION);
    mp_str(m, "t");
    msgpack_pack_int(&m->pk, type);
}

// ---- round trips ----

static rt_header *full_header(int type) {
    rt_header *h = calloc(1, sizeof *h);
    rt_header_init(h, type);
    h->id = UINT64_MAX;
    h->code = DG_DATA_LOSS;
    rt_header_set_message(h, "boom: \xc3\xbcnicode and \"quotes\"");
    h->step_id = INT64_MIN;
    h->handle = INT64_MAX;
    h->key = strdup("/job:a/replica:0/task:0/device:CPU:0;1;/job:b/replica:0/task:0/device:CPU:0;x:0;0:0");
    h->from = strdup("/job:worker/replica:0/task:3");
    rt_header_add_name(h, "feed:0");
    rt_header_add_name(h, "");
    rt_header_add_name(h, "fetch:1");
    h->n_feeds = 2;
    dg_status *st = dg_status_new();
    int64_t dims8[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    dg_tensor *ts[] = {
        dg_tensor_new(DG_FLOAT32, dg_shape2(2, 3), st),
        dg_tensor_new(DG_INT64, dg_shape_scalar(), st),
        dg_tensor_new(DG_UINT8, dg_shape1(0), st),
        dg_tensor_new(DG_BOOL, dg_shape_make(8, dims8), st),
        dg_tensor_new(DG_FLOAT64, dg_shape3(4, 0, 7), st),
        dg_tensor_new(DG_INT32, dg_shape1(1 << 20), st),
        dg_tensor_new(DG_BFLOAT16, dg_shape2(3, 5), st),
        dg_tensor_new(DG_FLOAT16, dg_shape1(7), st),
    };
    assert_ok(st);
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        rt_header_add_tensor(h, ts[i]);
        dg_tensor_unref(ts[i]);
    }
    const unsigned char blob[] = {0, 1, 2, 0, 0xff, 0xc1, 0};
    rt_header_set_blob(h, blob, sizeof blob);
    h->xfer = 77;
    h->offset = 3 << 20;
    h->total = (uint64_t)1 << 40;
    h->deadline_ms = 30000;
    h->parts = RT_MAX_STEP_PARTS;
    dg_status_free(&st);
    return h;
}

static void test_round_trip_all_fields(void **state) {
    for (int type = 1; type <= RT_TYPE_MAX; type++) {
        rt_header *h = full_header(type);
        round_trip(h);
        rt_header_clear(h);
        free(h);
    }
}

static void test_round_trip_each_field_alone(void **state) {
    rt_header *full = full_header(RT_TENSOR_CHUNK);
    // Field k alone on top of v and t; k == 0 is the minimal header.
    for (int k = 0; k <= 15; k++) {
        rt_header h;
        rt_header_init(&h, k >= 12 ? RT_TENSOR_CHUNK : RT_RUN_GRAPH);
        switch (k) {
        case 1: h.id = 1; break;
        case 2: h.code = DG_UNAUTHENTICATED; break;
        case 3: rt_header_set_message(&h, ""); break;
        case 4: h.step_id = -1; break;
        case 5: h.handle = 42; break;
        case 6: h.key = strdup("k"); break;
        case 7: h.from = strdup("f"); break;
        case 8: rt_header_add_name(&h, "only"); break;
        case 9:
            rt_header_add_name(&h, "a");
            h.n_feeds = 1;
            break;
        case 10:
            h.tensors = malloc(sizeof *h.tensors);
            h.tensors[0] = full->tensors[0];
            h.n_tensors = 1;
            break;
        case 11: rt_header_set_blob(&h, NULL, 0); break;
        case 12: h.xfer = UINT64_MAX; break;
        case 13:
            h.offset = 5;
            h.total = 5;
            break;
        case 14: h.deadline_ms = INT64_MAX; break;
        case 15: h.parts = 2; break;
        default: break;
        }
        round_trip(&h);
        rt_header_clear(&h);
    }
    rt_header_clear(full);
    free(full);
}

static void test_type_names(void **state) {
    assert_string_equal(rt_type_name(RT_PING), "PING");
    assert_string_equal(rt_type_name(RT_GET_VARIABLES), "GET_VARIABLES");
    assert_string_equal(rt_type_name(0), "UNKNOWN");
    assert_string_equal(rt_type_name(RT_TYPE_MAX + 1), "UNKNOWN");
    assert_string_equal(rt_type_name(-3), "UNKNOWN");
}

static void test_unknown_and_non_string_keys_are_ignored(void **state) {
    mp m;
    mp_head(&m, RT_PING, 3);
    mp_str(&m, "future_field");
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_nil(&m.pk);
    msgpack_pack_double(&m.pk, 1.5);
    msgpack_pack_int(&m.pk, 7);   // a key that is not a string
    mp_str(&m, "x");
    mp_str(&m, "V");              // keys are case-sensitive
    mp_str(&m, "y");
    rt_header h;
    dg_status *st = dg_status_new();
    assert_true(rt_header_decode(m.sb.data, m.sb.size, &h, st));
    assert_ok(st);
    assert_int_equal(h.type, RT_PING);
    rt_header_clear(&h);
    dg_status_free(&st);
    mp_destroy(&m);
}

// ---- structural errors ----

static void test_truncated_at_every_length(void **state) {
    rt_header *h = full_header(RT_TENSOR_CHUNK);
    size_t len = 0;
    char *buf = rt_header_encode(h, &len);
    assert_true(len > 100);
    dg_status *st = dg_status_new();
    for (size_t n = 0; n < len; n++) {
        // Exact-size copies so the sanitizers see any read past the end.
        char *cut = malloc(n ? n : 1);
        memcpy(cut, buf, n);
        rt_header g;
        dg_status_reset(st);
        assert_false(rt_header_decode(cut, n, &g, st));
        assert_int_equal(dg_status_code(st), DG_INVALID_ARGUMENT);
        const char *msg = dg_status_message(st);
        if (!strstr(msg, "not a complete msgpack value") && !strstr(msg, "declares"))
            fail_msg("length %zu of %zu: unexpected message \"%s\"", n, len, msg);
        assert_true(is_cleared(&g));
        free(cut);
    }
    // One byte too many.
    char *more = malloc(len + 1);
    memcpy(more, buf, len);
    more[len] = 0;
    expect_fail(more, len + 1, DG_INVALID_ARGUMENT, "1 trailing bytes");
    free(more);
    dg_status_free(&st);
    free(buf);
    rt_header_clear(h);
    free(h);
}

static void test_garbage(void **state) {
    const unsigned char c1[] = {0xc1};
    expect_fail(c1, sizeof c1, DG_INVALID_ARGUMENT, "byte 0xc1 at offset 0 is not msgpack");
    const unsigned char inner_c1[] = {0x81, 0xa1, 'v', 0xc1};
    expect_fail(inner_c1, sizeof inner_c1, DG_INVALID_ARGUMENT, "byte 0xc1 at offset 3");
    const char text[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    expect_fail(text, sizeof text - 1, DG_INVALID_ARGUMENT, "header: ");
    expect_fail("", 0, DG_INVALID_ARGUMENT, "not a complete msgpack value");
    uint64_t rng = 12345;
    for (int i = 0; i < 2000; i++) {
        unsigned char buf[64];
        size_t n = 1 + (size_t)dg_test_uniform(&rng, 0, sizeof buf);
        for (size_t k = 0; k < n; k++) buf[k] = (unsigned char)dg_test_uniform(&rng, 0, 256);
        rt_header h;
        dg_status *st = dg_status_new();
        if (rt_header_decode(buf, n, &h, st)) {
            rt_header_clear(&h);   // a random valid header is possible in principle
        } else {
            assert_true(strncmp(dg_status_message(st), "header: ", 8) == 0);
            assert_true(is_cleared(&h));
        }
        dg_status_free(&st);
    }
}

static void test_not_a_map(void **state) {
    mp m;
    mp_init(&m);
    msgpack_pack_array(&m.pk, 2);
    msgpack_pack_int(&m.pk, 1);
    msgpack_pack_int(&m.pk, 2);
    expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "header: not a map");
    mp_destroy(&m);
    const unsigned char scalars[][1] = {{0x05}, {0xc0}, {0xc3}, {0xa0}, {0xe0}};
    for (size_t i = 0; i < sizeof scalars / sizeof *scalars; i++)
        expect_fail(scalars[i], 1, DG_INVALID_ARGUMENT, "header: not a map");
}

static void test_missing_version_or_type(void **state) {
    mp m;
    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    mp_str(&m, "t");
    msgpack_pack_int(&m.pk, RT_PING);
    expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "missing \"v\"");
    mp_destroy(&m);
    mp_init(&m);
    msgpack_pack_map(&m.pk, 1);
    mp_str(&m, "v");
    msgpack_pack_int(&m.pk, 1);
    expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "missing \"t\"");
    mp_destroy(&m);
    const unsigned char empty_map[] = {0x80};
    expect_fail(empty_map, 1, DG_INVALID_ARGUMENT, "missing");
}

static void test_wrong_version(void **state) {
    const int64_t versions[] = {0, 2, -1, 1000000, INT64_MAX};
    for (size_t i = 0; i < sizeof versions / sizeof *versions; i++) {
        mp m;
        mp_init(&m);
        msgpack_pack_map(&m.pk, 2);
        mp_str(&m, "v");
        msgpack_pack_int64(&m.pk, versions[i]);
        mp_str(&m, "t");
        msgpack_pack_int(&m.pk, RT_PING);
        char want[96];
        snprintf(want, sizeof want, "protocol version %lld, this build speaks 1", (long long)versions[i]);
        expect_fail(m.sb.data, m.sb.size, DG_UNIMPLEMENTED, want);
        mp_destroy(&m);
    }
}

static void test_unknown_type(void **state) {
    const int64_t types[] = {0, -1, RT_TYPE_MAX + 1, 99, INT32_MAX + 1LL};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) {
        mp m;
        mp_init(&m);
        msgpack_pack_map(&m.pk, 2);
        mp_str(&m, "v");
        msgpack_pack_int(&m.pk, 1);
        mp_str(&m, "t");
        msgpack_pack_int64(&m.pk, types[i]);
        expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "field \"t\" has the wrong type or an out-of-range value");
        mp_destroy(&m);
    }
}

// ---- field types ----

typedef enum kind {
    K_STR, K_STR_NUL, K_STR_LONG, K_NEG, K_ZERO, K_U64_MAX, K_FLOAT, K_NIL, K_BOOL, K_ARRAY_INT,
    K_ARRAY_NUL_STR, K_MAP, K_BIN, K_17, K_TYPE_PAST_MAX, K_2POW40_PLUS1, K_EXT,
} kind;

static void pack_kind(mp *m, kind k) {
    static char long_str[RT_MAX_STRING + 1];
    switch (k) {
    case K_STR: mp_str(m, "x"); break;
    case K_STR_NUL: mp_strn(m, "a\0b", 3); break;
    case K_STR_LONG:
        memset(long_str, 'a', sizeof long_str);
        mp_strn(m, long_str, sizeof long_str);
        break;
    case K_NEG: msgpack_pack_int(&m->pk, -1); break;
    case K_ZERO: msgpack_pack_int(&m->pk, 0); break;
    case K_U64_MAX: msgpack_pack_uint64(&m->pk, UINT64_MAX); break;
    case K_FLOAT: msgpack_pack_double(&m->pk, 1.0); break;
    case K_NIL: msgpack_pack_nil(&m->pk); break;
    case K_BOOL: msgpack_pack_true(&m->pk); break;
    case K_ARRAY_INT:
        msgpack_pack_array(&m->pk, 1);
        msgpack_pack_int(&m->pk, 1);
        break;
    case K_ARRAY_NUL_STR:
        msgpack_pack_array(&m->pk, 2);
        mp_str(m, "fine");
        mp_strn(m, "bad\0name", 8);
        break;
    case K_MAP: msgpack_pack_map(&m->pk, 0); break;
    case K_BIN:
        msgpack_pack_bin(&m->pk, 1);
        msgpack_pack_bin_body(&m->pk, "x", 1);
        break;
    case K_17: msgpack_pack_int(&m->pk, 17); break;
    case K_TYPE_PAST_MAX: msgpack_pack_int(&m->pk, RT_TYPE_MAX + 1); break;
    case K_2POW40_PLUS1: msgpack_pack_uint64(&m->pk, ((uint64_t)1 << 40) + 1); break;
    case K_EXT:
        msgpack_pack_ext(&m->pk, 1, 5);
        msgpack_pack_ext_body(&m->pk, "x", 1);
        break;
    }
}

static void test_wrong_types_for_every_field(void **state) {
    static const struct {
        const char *key;
        kind kinds[8];
        int n;
    } cases[] = {
        {"v", {K_STR, K_FLOAT, K_NIL, K_U64_MAX, K_ARRAY_INT}, 5},
        {"t", {K_STR, K_FLOAT, K_NIL, K_U64_MAX, K_NEG, K_ZERO, K_TYPE_PAST_MAX}, 7},
        {"id", {K_STR, K_NEG, K_FLOAT, K_NIL, K_BOOL}, 5},
        {"code", {K_STR, K_NEG, K_17, K_FLOAT}, 4},
        {"msg", {K_ZERO, K_NIL, K_BIN, K_STR_NUL, K_STR_LONG, K_EXT}, 6},
        {"step", {K_STR, K_FLOAT, K_U64_MAX, K_NIL}, 4},
        {"h", {K_STR, K_FLOAT, K_U64_MAX, K_MAP}, 4},
        {"key", {K_ZERO, K_STR_NUL, K_STR_LONG, K_BIN, K_NIL}, 5},
        {"from", {K_ZERO, K_STR_NUL, K_STR_LONG, K_NIL}, 4},
        {"nf", {K_STR, K_NEG, K_FLOAT, K_U64_MAX}, 4},
        {"names", {K_STR, K_ZERO, K_MAP, K_ARRAY_INT, K_ARRAY_NUL_STR, K_NIL}, 6},
        {"tensors", {K_STR, K_ZERO, K_MAP, K_NIL}, 4},
        {"blob", {K_STR, K_ZERO, K_NIL, K_ARRAY_INT}, 4},
        {"xfer", {K_STR, K_NEG, K_FLOAT}, 3},
        {"off", {K_STR, K_NEG, K_FLOAT}, 3},
        {"total", {K_STR, K_NEG, K_2POW40_PLUS1, K_U64_MAX}, 4},
        {"dl", {K_STR, K_NEG, K_FLOAT, K_U64_MAX}, 4},
        {"np", {K_STR, K_NEG, K_FLOAT, K_U64_MAX, K_2POW40_PLUS1}, 5},
    };
    int checked = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++)
        for (int k = 0; k < cases[c].n; k++) {
            mp m;
            mp_init(&m);
            bool is_vt = strcmp(cases[c].key, "v") == 0 || strcmp(cases[c].key, "t") == 0;
            msgpack_pack_map(&m.pk, is_vt ? 2 : 3);
            // The bad field comes first and also once after v and t, so order does not matter.
            if (strcmp(cases[c].key, "v") != 0) {
                mp_str(&m, "v");
                msgpack_pack_int(&m.pk, 1);
            }
            if (strcmp(cases[c].key, "t") != 0) {
                mp_str(&m, "t");
                msgpack_pack_int(&m.pk, RT_RUN_GRAPH);
            }
            mp_str(&m, cases[c].key);
            pack_kind(&m, cases[c].kinds[k]);
            char want[96];
            snprintf(want, sizeof want, "field \"%s\" has the wrong type or an out-of-range value", cases[c].key);
            expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, want);
            mp_destroy(&m);
            checked++;
        }
    assert_true(checked >= 70);
}

static void test_repeated_fields(void **state) {
    const char *keys[] = {"msg", "key", "from", "names", "tensors", "blob"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        mp m;
        mp_head(&m, RT_RUN_GRAPH, 2);
        for (int r = 0; r < 2; r++) {
            mp_str(&m, keys[i]);
            if (!strcmp(keys[i], "names") || !strcmp(keys[i], "tensors")) msgpack_pack_array(&m.pk, 0);
            else if (!strcmp(keys[i], "blob")) pack_kind(&m, K_BIN);
            else mp_str(&m, "s");
        }
        char want[64];
        snprintf(want, sizeof want, "field \"%s\"", keys[i]);
        expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, want);
        mp_destroy(&m);
    }
}

static void test_cross_field_checks(void **state) {
    mp m;
    mp_head(&m, RT_RUN_GRAPH, 2);
    mp_str(&m, "names");
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "a");
    mp_str(&m, "nf");
    msgpack_pack_int(&m.pk, 2);
    expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "2 feeds but only 1 names");
    mp_destroy(&m);

    mp_head(&m, RT_TENSOR_CHUNK, 3);
    mp_str(&m, "xfer");
    msgpack_pack_int(&m.pk, 1);
    mp_str(&m, "off");
    msgpack_pack_int(&m.pk, 11);
    mp_str(&m, "total");
    msgpack_pack_int(&m.pk, 10);
    expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "chunk offset past the total");
    mp_destroy(&m);

    // A header over the size limit is refused before a byte of it is read.
    char one = 0;
    expect_fail(&one, (size_t)RT_MAX_HEADER_BYTES + 1, DG_INVALID_ARGUMENT, "over the limit of 268435456");
}

// ---- tensor descriptions ----

typedef struct desc {
    int64_t dtype;
    int rank;          // -1: dims is not a list (an int)
    int64_t dims[10];
    int64_t nbytes;    // packed as int64 (negative allowed)
} desc;

static void pack_desc(mp *m, const desc *d) {
    msgpack_pack_array(&m->pk, 3);
    msgpack_pack_int64(&m->pk, d->dtype);
    if (d->rank < 0) {
        msgpack_pack_int(&m->pk, 3);
    } else {
        msgpack_pack_array(&m->pk, (size_t)d->rank);
        for (int i = 0; i < d->rank; i++) msgpack_pack_int64(&m->pk, d->dims[i]);
    }
    msgpack_pack_int64(&m->pk, d->nbytes);
}

static void expect_desc_fail(const desc *d, int index, const char *needle, int line) {
    mp m;
    mp_head(&m, RT_PING, 1);
    mp_str(&m, "tensors");
    msgpack_pack_array(&m.pk, (size_t)index + 1);
    const desc good = {DG_FLOAT32, 1, {2}, 8};
    for (int i = 0; i < index; i++) pack_desc(&m, &good);
    pack_desc(&m, d);
    expect_fail_at(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, needle, line);
    mp_destroy(&m);
}

static void test_tensor_descriptions(void **state) {
    int64_t big = (int64_t)1 << 40;
    const struct {
        desc d;
        const char *needle;
    } cases[] = {
        {{DG_FLOAT32, 2, {2, 3}, 23}, "tensors[0]: byte count does not match float32 [2,3]"},
        {{DG_FLOAT32, 2, {2, 3}, 25}, "byte count does not match float32 [2,3]"},
        {{DG_FLOAT64, 1, {4}, 16}, "byte count does not match float64 [4]"},
        {{DG_FLOAT64, 0, {0}, 0}, "byte count does not match float64 []"},
        {{DG_INT64, 1, {0}, 8}, "byte count does not match int64 [0]"},
        {{DG_UINT8, 1, {5}, -1}, "byte count does not match uint8 [5]"},
        {{DG_INT64, 3, {big, big, big}, 0}, "byte count does not match int64"},
        {{DG_BOOL, 2, {big, 1 << 24}, 0}, "byte count does not match bool"},
        {{DG_BFLOAT16, 1, {3}, 12}, "byte count does not match bfloat16 [3]"},
        {{DG_FLOAT16, 2, {2, 2}, 4}, "byte count does not match float16 [2,2]"},
        {{15, 1, {2}, 4}, "unknown dtype"},
        {{DG_FLOAT32, 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 4}, "dims must be a list of at most 8"},
        {{DG_FLOAT32, -1, {0}, 4}, "dims must be a list of at most 8"},
        {{DG_FLOAT32, 2, {2, -1}, 8}, "tensors[0] dimension 1 is not a size"},
        {{DG_FLOAT32, 1, {-5}, 0}, "dimension 0 is not a size"},
        {{DG_FLOAT32, 1, {big + 1}, 0}, "dimension 0 is not a size"},
        {{0, 1, {2}, 8}, "tensors[0] has an unknown dtype"},
        {{5, 1, {2}, 8}, "unknown dtype"},
        {{65, 1, {2}, 8}, "unknown dtype"},
        {{-1, 1, {2}, 8}, "unknown dtype"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) expect_desc_fail(&cases[i].d, 0, cases[i].needle, __LINE__);
    const desc bad = {DG_FLOAT32, 1, {3}, 8};
    expect_desc_fail(&bad, 2, "tensors[2]: byte count does not match float32 [3]", __LINE__);

    // Descriptions that are not [dtype, dims, bytes].
    for (int variant = 0; variant < 5; variant++) {
        mp m;
        mp_head(&m, RT_PING, 1);
        mp_str(&m, "tensors");
        msgpack_pack_array(&m.pk, 1);
        switch (variant) {
        case 0: msgpack_pack_int(&m.pk, 1); break;
        case 1:
            msgpack_pack_array(&m.pk, 2);
            msgpack_pack_int(&m.pk, 1);
            msgpack_pack_array(&m.pk, 0);
            break;
        case 2:
            msgpack_pack_array(&m.pk, 4);
            for (int k = 0; k < 4; k++) msgpack_pack_int(&m.pk, 1);
            break;
        case 3: msgpack_pack_map(&m.pk, 0); break;
        case 4:
            msgpack_pack_array(&m.pk, 3);
            mp_str(&m, "float32");
            msgpack_pack_array(&m.pk, 0);
            msgpack_pack_int(&m.pk, 4);
            break;
        }
        expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT,
                    variant == 4 ? "tensors[0] has an unknown dtype" : "tensors[0] must be [dtype, dims, bytes]");
        mp_destroy(&m);
    }
    // Types inside a description: dims of strings, bytes as a string or a float.
    mp m;
    mp_head(&m, RT_PING, 1);
    mp_str(&m, "tensors");
    msgpack_pack_array(&m.pk, 1);
    msgpack_pack_array(&m.pk, 3);
    msgpack_pack_int(&m.pk, DG_FLOAT32);
    msgpack_pack_array(&m.pk, 1);
    mp_str(&m, "2");
    msgpack_pack_int(&m.pk, 8);
    expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "dimension 0 is not a size");
    mp_destroy(&m);
    for (int variant = 0; variant < 2; variant++) {
        mp_head(&m, RT_PING, 1);
        mp_str(&m, "tensors");
        msgpack_pack_array(&m.pk, 1);
        msgpack_pack_array(&m.pk, 3);
        msgpack_pack_int(&m.pk, DG_FLOAT32);
        msgpack_pack_array(&m.pk, 1);
        msgpack_pack_int(&m.pk, 2);
        if (variant == 0) mp_str(&m, "8");
        else msgpack_pack_double(&m.pk, 8.0);
        expect_fail(m.sb.data, m.sb.size, DG_INVALID_ARGUMENT, "byte count does not match float32 [2]");
        mp_destroy(&m);
    }
    // The largest legal description decodes: rank 8, bytes exactly dtype * elements.
    mp_head(&m, RT_PING, 1);
    mp_str(&m, "tensors");
    msgpack_pack_array(&m.pk, 1);
    const desc ok = {DG_FLOAT64, 8, {2, 2, 2, 2, 2, 2, 2, 1 << 20}, (int64_t)8 << 27};
    pack_desc(&m, &ok);
    rt_header h;
    dg_status *st = dg_status_new();
    assert_true(rt_header_decode(m.sb.data, m.sb.size, &h, st));
    assert_int_equal(h.tensors[0].shape.rank, 8);
    assert_true(h.tensors[0].nbytes == (uint64_t)8 << 27);
    rt_header_clear(&h);
    dg_status_free(&st);
    mp_destroy(&m);
}

// ---- huge declared sizes ----

// Tiny buffers that declare enormous lists, maps, strings or blobs.
typedef struct hostile {
    unsigned char b[48];
    size_t n;
    const char *needle;
} hostile;

static int hostile_cases(hostile *out) {
    int n = 0;
    // {v:1, t:2, names: <array32 of 4294967295>}
    hostile h0 = {{0x83, 0xa1, 'v', 1, 0xa1, 't', 2, 0xa5, 'n', 'a', 'm', 'e', 's', 0xdd, 0xff, 0xff, 0xff, 0xff},
                  18, "declares 4294967295 elements"};
    out[n++] = h0;
    hostile h1 = {{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'v'}, 7, "declares 8589934590 elements"};
    out[n++] = h1;
    // An unknown key holding a 100M-element list (2.4 GB of msgpack objects).
    hostile h2 = {{0x83, 0xa1, 'v', 1, 0xa1, 't', 2, 0xa2, 'z', 'z', 0xdd, 0x05, 0xf5, 0xe1, 0x00, 1, 2, 3},
                  18, "declares 100000000 elements"};
    out[n++] = h2;
    hostile h3 = {{0x81, 0xa7, 't', 'e', 'n', 's', 'o', 'r', 's', 0xdd, 0x00, 0x10, 0x00, 0x00}, 14,
                  "declares 1048576 elements"};
    out[n++] = h3;
    // Strings, blobs and extensions longer than the buffer.
    hostile h4 = {{0x81, 0xa3, 'm', 's', 'g', 0xdb, 0xff, 0xff, 0xff, 0xff, 'a'}, 11, "not a complete msgpack value"};
    out[n++] = h4;
    hostile h5 = {{0x81, 0xa4, 'b', 'l', 'o', 'b', 0xc6, 0x7f, 0xff, 0xff, 0xff, 0}, 12, "not a complete msgpack value"};
    out[n++] = h5;
    hostile h6 = {{0x81, 0xa1, 'x', 0xc9, 0xff, 0xff, 0xff, 0xff, 1}, 9, "not a complete msgpack value"};
    out[n++] = h6;
    // Nested lists, each too long for what is left.
    hostile h7 = {{0x81, 0xa1, 'x', 0xdc, 0xff, 0xff, 0xdc, 0xff, 0xff, 0xdc, 0xff, 0xff}, 12, "declares 65535 elements"};
    out[n++] = h7;
    // A map16 of 65535 pairs in 10 bytes.
    hostile h8 = {{0xde, 0xff, 0xff, 0xa1, 'v', 1, 0xa1, 't', 2, 0}, 10, "declares 131070 elements"};
    out[n++] = h8;
    return n;
}

static long vm_peak_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long v = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmPeak: %ld kB", &v) == 1) break;
    fclose(f);
    return v;
}

static void test_huge_declared_sizes(void **state) {
    hostile cases[16];
    int n = hostile_cases(cases);
    for (int i = 0; i < n; i++) expect_fail(cases[i].b, cases[i].n, DG_INVALID_ARGUMENT, cases[i].needle);
}

// In a child: the decoder's peak address-space growth on the hostile buffers stays small, and
// with the address space capped (RLIMIT_AS) it still gives the same answers, while a plain
// 1 GiB malloc under the cap fails (so the cap is real).
static void test_huge_declared_sizes_do_not_allocate(void **state) {
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        hostile cases[16];
        int n = hostile_cases(cases);
        dg_status *st = dg_status_new();
        long before = vm_peak_kib();
        bool as_expected = true;
        for (int i = 0; i < n; i++) {
            rt_header h;
            dg_status_reset(st);
            if (rt_header_decode(cases[i].b, cases[i].n, &h, st) || !strstr(dg_status_message(st), cases[i].needle))
                as_expected = false;
        }
        long grew = vm_peak_kib() - before;
        if (before < 0 || grew > 64 * 1024) {
            fprintf(stderr, "decoding tiny hostile headers raised VmPeak by %ld KiB\n", grew);
            _exit(2);
        }
        if (!as_expected) _exit(10);
#ifndef DG_SANITIZE_BUILD   // the sanitizers reserve terabytes of address space up front
        long vm_kib = 0;
        FILE *f = fopen("/proc/self/status", "r");
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (sscanf(line, "VmSize: %ld kB", &vm_kib) == 1) break;
        if (f) fclose(f);
        struct rlimit r = {(rlim_t)vm_kib * 1024 + (256u << 20), (rlim_t)vm_kib * 1024 + (256u << 20)};
        if (setrlimit(RLIMIT_AS, &r) != 0) _exit(3);
        void *probe = malloc((size_t)1 << 30);
        if (probe) _exit(4);
        for (int i = 0; i < n; i++) {
            rt_header h;
            dg_status_reset(st);
            if (rt_header_decode(cases[i].b, cases[i].n, &h, st) || !strstr(dg_status_message(st), cases[i].needle))
                _exit(40 + i);
        }
        // An honest header with many names still decodes under the cap.
        rt_header big;
        rt_header_init(&big, RT_GET_VARIABLES);
        for (int i = 0; i < 20000; i++) {
            char name[32];
            snprintf(name, sizeof name, "layer%d/kernel", i);
            rt_header_add_name(&big, name);
        }
        size_t len;
        char *buf = rt_header_encode(&big, &len);
        rt_header back;
        if (!rt_header_decode(buf, len, &back, st) || back.n_names != 20000) _exit(5);
        rt_header_clear(&back);
        rt_header_clear(&big);
        free(buf);
#endif
        dg_status_free(&st);
        _exit(0);
    }
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_deep_nesting(void **state) {
    // 200 nested lists under an unknown key: refused, not a stack overflow.
    unsigned char buf[256];
    size_t n = 0;
    const unsigned char head[] = {0x83, 0xa1, 'v', 1, 0xa1, 't', 2, 0xa1, 'x'};
    memcpy(buf, head, sizeof head);
    n = sizeof head;
    for (int i = 0; i < 200; i++) buf[n++] = 0x91;
    buf[n++] = 0xc0;
    rt_header h;
    dg_status *st = dg_status_new();
    assert_false(rt_header_decode(buf, n, &h, st));
    assert_status(st, DG_INVALID_ARGUMENT, "header: ");
    dg_status_free(&st);
}

// ---- random mutations ----

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

// On success the decoded header is consistent and encodes to itself; on failure the status
// is one of the two codes with a "header: " message and h is cleared.
static bool check_decode(const unsigned char *buf, size_t n) {
    rt_header h;
    dg_status *st = dg_status_new();
    bool ok = rt_header_decode(buf, n, &h, st);
    if (ok) {
        assert_ok(st);
        assert_int_equal(h.version, RT_PROTOCOL_VERSION);
        assert_true(h.type >= 1 && h.type <= RT_TYPE_MAX);
        assert_true(h.n_feeds >= 0 && h.n_feeds <= h.n_names);
        for (int i = 0; i < h.n_tensors; i++) {
            int64_t el = dg_shape_num_elements(&h.tensors[i].shape);
            assert_true(el >= 0);
            assert_true((uint64_t)el * dg_dtype_size(h.tensors[i].dtype) == h.tensors[i].nbytes);
        }
        round_trip(&h);
        rt_header_clear(&h);
    } else {
        dg_code c = dg_status_code(st);
        assert_true(c == DG_INVALID_ARGUMENT || c == DG_UNIMPLEMENTED);
        assert_true(strncmp(dg_status_message(st), "header: ", 8) == 0);
        assert_true(is_cleared(&h));
    }
    dg_status_free(&st);
    return ok;
}

static void test_random_mutations(void **state) {
    char *seeds[4];
    size_t seed_len[4];
    rt_header *full = full_header(RT_RUN_GRAPH);
    seeds[0] = rt_header_encode(full, &seed_len[0]);
    rt_header_clear(full);
    free(full);
    full = full_header(RT_TENSOR_CHUNK);
    seeds[1] = rt_header_encode(full, &seed_len[1]);
    rt_header_clear(full);
    free(full);
    rt_header p;
    rt_header_init(&p, RT_PING);
    p.id = 9;
    seeds[2] = rt_header_encode(&p, &seed_len[2]);
    rt_header_init(&p, RT_RESPONSE);
    p.code = DG_NOT_FOUND;
    rt_header_set_message(&p, "no such thing");
    rt_header_add_name(&p, "n");
    seeds[3] = rt_header_encode(&p, &seed_len[3]);
    rt_header_clear(&p);

    static const unsigned char interesting[] = {0x00, 0x01, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf, 0xc0,
                                                0xc1, 0xc4, 0xc6, 0xc9, 0xcf, 0xd3, 0xd8, 0xd9, 0xdb, 0xdc,
                                                0xdd, 0xde, 0xdf, 0xe0, 0xff};
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    int n_ok = 0, n_cases = 20000;
    for (int iter = 0; iter < n_cases; iter++) {
        int s = (int)(next_rand(&rng) % 4);
        size_t cap = seed_len[s] + 64, n = seed_len[s];
        unsigned char *buf = malloc(cap);
        memcpy(buf, seeds[s], n);
        int n_mut = 1 + (int)(next_rand(&rng) % 4);
        for (int m = 0; m < n_mut && n > 0; m++) {
            size_t at = next_rand(&rng) % n;
            switch (next_rand(&rng) % 7) {
            case 0: buf[at] ^= (unsigned char)(1u << (next_rand(&rng) % 8)); break;
            case 1: buf[at] = interesting[next_rand(&rng) % sizeof interesting]; break;
            case 2:   // insert a byte
                if (n < cap) {
                    memmove(buf + at + 1, buf + at, n - at);
                    buf[at] = (unsigned char)next_rand(&rng);
                    n++;
                }
                break;
            case 3:   // delete a byte
                memmove(buf + at, buf + at + 1, n - at - 1);
                n--;
                break;
            case 4: n = at; break;   // truncate
            case 5:   // a huge length field
                if (n + 5 <= cap) {
                    memmove(buf + at + 5, buf + at, n - at);
                    const unsigned char huge[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
                    memcpy(buf + at, huge, 5);
                    n += 5;
                }
                break;
            case 6:   // overwrite a byte with a small integer (counts, dtypes, versions)
                buf[at] = (unsigned char)(next_rand(&rng) % 20);
                break;
            }
        }
        // Exact-size copy, so reading past the end is caught by the sanitizers.
        unsigned char *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        if (check_decode(exact, n)) n_ok++;
        free(exact);
        free(buf);
    }
    // Both outcomes occur: the mutations neither always break nor never break a header.
    assert_true(n_ok > 100);
    assert_true(n_ok < n_cases - 100);
    for (int i = 0; i < 4; i++) free(seeds[i]);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_all_fields),
        cmocka_unit_test(test_round_trip_each_field_alone),
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_unknown_and_non_string_keys_are_ignored),
        cmocka_unit_test(test_truncated_at_every_length),
        cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_not_a_map),
        cmocka_unit_test(test_missing_version_or_type),
        cmocka_unit_test(test_wrong_version),
        cmocka_unit_test(test_unknown_type),
        cmocka_unit_test(test_wrong_types_for_every_field),
        cmocka_unit_test(test_repeated_fields),
        cmocka_unit_test(test_cross_field_checks),
        cmocka_unit_test(test_tensor_descriptions),
        cmocka_unit_test(test_huge_declared_sizes),
        cmocka_unit_test(test_huge_declared_sizes_do_not_allocate),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_random_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
