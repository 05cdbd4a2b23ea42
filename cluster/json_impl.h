/* A small JSON parser producing a DOM, for cluster specs and TF_CONFIG, that reads what
 * Python's json.loads reads (TensorFlow reads TF_CONFIG with it): RFC 8259 plus NaN, Infinity
 * and -Infinity, numbers past the double range (as infinities), and strings that are not
 * Unicode text (a lone surrogate escape such as "\ud800", or bytes that are not UTF-8, which
 * Python reads from the environment as lone surrogates): those are kept, WTF-8 encoded, and
 * marked. It rejects what json.loads rejects (trailing commas, comments, leading zeros,
 * control characters in strings) and, unlike json.loads, duplicate object keys, which hide
 * mistakes in hand-written TF_CONFIG (Python keeps the last one silently). Nesting deeper than
 * CLUSTER_JSON_MAX_DEPTH is refused. Errors are INVALID_ARGUMENT with the byte offset. Every
 * value remembers the span of source text it came from, so errors can quote it. Values are
 * immutable after parsing; a tree is freed in one call.
 *
 * The cluster_json_py_* functions answer as Python does for the value json.loads returns
 * (str(), int(), truthiness, `key in v`), so TF_CONFIG's loosely typed fields read as in
 * TensorFlow. */
#ifndef DG_CLUSTER_JSON_IMPL_H
#define DG_CLUSTER_JSON_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"

#define CLUSTER_JSON_MAX_DEPTH 64

// A growing NUL-terminated string (p; len bytes). Out of memory sets failed and drops the
// rest. Start it zeroed; free(p) when done.
typedef struct cluster_buf {
    char *p;
    size_t len, cap;
    bool failed;
} cluster_buf;
void cluster_buf_put(cluster_buf *b, const char *s, size_t n);
void cluster_buf_str(cluster_buf *b, const char *s);

typedef enum cluster_json_kind {
    CLUSTER_JSON_NULL,
    CLUSTER_JSON_BOOL,
    CLUSTER_JSON_NUMBER,
    CLUSTER_JSON_STRING,
    CLUSTER_JSON_ARRAY,
    CLUSTER_JSON_OBJECT,
} cluster_json_kind;

typedef struct cluster_json cluster_json;

typedef struct cluster_json_member {
    char *key;          // NUL-terminated; may contain NUL from \u0000 (see key_len)
    size_t key_len;
    bool key_is_utf8;   // false: holds lone surrogates (WTF-8), not Unicode text
    size_t key_offset;  // byte offset of the key's opening quote in the source
    cluster_json *value;
} cluster_json_member;

struct cluster_json {
    cluster_json_kind kind;
    size_t offset;        // byte offset of the value's first character in the source
    size_t src_len;       // bytes of source text the value spans
    bool boolean;
    double number;        // NUMBER: as Python's float() reads the literal (inf past the range)
    bool is_float;        // NUMBER: a Python float (fraction, exponent, NaN or Infinity);
                          // else a Python int, exact in `integer` when is_int
    bool is_int;          // number written without fraction/exponent and fits int64
    int64_t integer;      // valid when is_int
    char *str;            // STRING: decoded, NUL-terminated; NUMBER: the literal as written
    size_t str_len;       // bytes in str, excluding the terminator (str may hold NULs)
    bool str_is_utf8;     // STRING: false when it holds lone surrogates (WTF-8)
    size_t n;             // ARRAY: items; OBJECT: members
    cluster_json **items;             // ARRAY
    cluster_json_member *members;     // OBJECT, in source order
};

// Parses len bytes of text (embedded NULs are an error). `what` prefixes error messages
// ("cluster JSON"), e.g. `cluster JSON: offset 7: expected ':' after object key`.
// Returns: new, caller frees with cluster_json_free(); NULL (st set) on error.
cluster_json *cluster_json_parse(const char *text, size_t len, const char *what, dg_status *st);
void cluster_json_free(cluster_json **v);

// Member `key` of an object. Returns: borrowed, valid until the tree is freed; NULL if v
// is not an object or has no such key.
const cluster_json *cluster_json_get(const cluster_json *v, const char *key);
// Name of a kind for messages: "null", "boolean", "number", "string", "array", "object".
const char *cluster_json_kind_name(cluster_json_kind k);
// True when a string value is Unicode text without NUL bytes (usable as a C string).
bool cluster_json_is_cstring(const cluster_json *v);

// ---- Python's view of a value ----

// Python's name for the value's type: "NoneType", "bool", "int", "float", "str", "list",
// "dict".
const char *cluster_json_py_type(const cluster_json *v);
// bool(v).
bool cluster_json_py_truthy(const cluster_json *v);
// `key in v` for a str key: 1 or 0; -1 where Python raises TypeError (v is None, a bool or a
// number). A dict looks up its keys, a list compares its items, a str looks for a substring.
int cluster_json_py_contains(const cluster_json *v, const char *key);
// True when v is a str equal to s.
bool cluster_json_py_str_eq(const cluster_json *v, const char *s);
// str(v), as Python prints it (repr() inside lists and dicts). Returns: new, caller frees
// with free(); NULL when out of memory.
char *cluster_json_py_str(const cluster_json *v);
// The outcome of Python's int().
typedef enum cluster_py_int {
    CLUSTER_PY_INT_OK,
    CLUSTER_PY_INT_TYPE_ERROR,    // None, list, dict
    CLUSTER_PY_INT_VALUE_ERROR,   // a str that is not a decimal integer, NaN
    CLUSTER_PY_INT_OVERFLOW,      // an infinity
    CLUSTER_PY_INT_TOO_BIG,       // Python's answer does not fit int64 (*out saturated)
} cluster_py_int;
// int(v) for a parsed value (bools are 0 and 1, floats truncate toward zero).
cluster_py_int cluster_json_py_int(const cluster_json *v, int64_t *out);
// int(s) for len bytes of UTF-8 text: surrounding whitespace, a sign, decimal digits of any
// script with single '_' between them, as Python's int() reads a str.
cluster_py_int cluster_py_int_from_text(const char *s, size_t len, int64_t *out);
// Appends Python's repr() of a double to buf (at most 32 bytes with the NUL): the shortest
// digits that read back the same, "1e+16" past 16 digits, "1.0", "inf", "nan".
void cluster_py_float_repr(double x, char *buf, size_t cap);

#endif
