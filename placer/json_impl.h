/* A small strict JSON (RFC 8259) parser producing a DOM, for cluster specs and TF_CONFIG.
 * Rejects anything outside the grammar: trailing commas, comments, leading zeros, control
 * characters and invalid UTF-8 in strings, lone surrogates, duplicate object keys, nesting
 * deeper than PLACER_JSON_MAX_DEPTH. Errors are INVALID_ARGUMENT with the byte offset.
 * Every value remembers the span of source text it came from, so errors about a value can
 * quote it. Values are immutable after parsing; a tree is freed in one call. */
#ifndef DG_PLACER_JSON_IMPL_H
#define DG_PLACER_JSON_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"

#define PLACER_JSON_MAX_DEPTH 64

typedef enum placer_json_kind {
    PLACER_JSON_NULL,
    PLACER_JSON_BOOL,
    PLACER_JSON_NUMBER,
    PLACER_JSON_STRING,
    PLACER_JSON_ARRAY,
    PLACER_JSON_OBJECT,
} placer_json_kind;

typedef struct placer_json placer_json;

typedef struct placer_json_member {
    char *key;          // NUL-terminated UTF-8; may contain NUL from \u0000 (see key_len)
    size_t key_len;
    size_t key_offset;  // byte offset of the key's opening quote in the source
    placer_json *value;
} placer_json_member;

struct placer_json {
    placer_json_kind kind;
    size_t offset;        // byte offset of the value's first character in the source
    size_t src_len;       // bytes of source text the value spans
    bool boolean;
    double number;
    bool is_int;          // number written without fraction/exponent and fits int64
    int64_t integer;      // valid when is_int
    char *str;            // STRING: decoded UTF-8, NUL-terminated
    size_t str_len;       // bytes in str, excluding the terminator (str may hold NULs)
    size_t n;             // ARRAY: items; OBJECT: members
    placer_json **items;             // ARRAY
    placer_json_member *members;     // OBJECT, in source order
};

// Parses len bytes of text (embedded NULs are an error). `what` prefixes error messages
// ("cluster JSON"), e.g. `cluster JSON: offset 7: expected ':' after object key`.
// Returns: new, caller frees with placer_json_free(); NULL (st set) on error.
placer_json *placer_json_parse(const char *text, size_t len, const char *what, dg_status *st);
void placer_json_free(placer_json **v);

// Member `key` of an object. Returns: borrowed, valid until the tree is freed; NULL if v
// is not an object or has no such key.
const placer_json *placer_json_get(const placer_json *v, const char *key);
// Name of a kind for messages: "null", "boolean", "number", "string", "array", "object".
const char *placer_json_kind_name(placer_json_kind k);
// True when a string value holds no NUL bytes (so it can be used as a C string).
bool placer_json_is_cstring(const placer_json *v);

#endif
