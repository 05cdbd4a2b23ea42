/* JSON parser reading what Python's json.loads reads (see json_impl.h), and Python's view of
 * the values it returns. Recursive descent; recursion depth is bounded by
 * CLUSTER_JSON_MAX_DEPTH, so hostile input cannot exhaust the stack. */
#include "base_impl.h"
#include "json_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
    const char *s;
    size_t len;
    size_t pos;
    int depth;
    const char *what;
    dg_status *st;
} parser;

static void *fail(parser *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void *fail(parser *p, size_t at, const char *fmt, ...) {
    char msg[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dg_status_setf(p->st, DG_INVALID_ARGUMENT, "%s: offset %zu: %s", p->what, at, msg);
    return NULL;
}

static void *oom(parser *p, size_t n_bytes) {
    base_oom(p->st, p->what, n_bytes);
    return NULL;
}

// A printable rendering of the byte at pos for messages ("'x'", "byte 0x01", "end of input").
static const char *describe(const parser *p, size_t pos, char *buf, size_t cap) {
    if (pos >= p->len) {
        snprintf(buf, cap, "end of input");
    } else {
        unsigned char c = (unsigned char)p->s[pos];
        if (c >= 0x20 && c < 0x7f)
            snprintf(buf, cap, "'%c'", c);
        else
            snprintf(buf, cap, "byte 0x%02x", c);
    }
    return buf;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static cluster_json *new_value(parser *p, cluster_json_kind kind, size_t offset) {
    cluster_json *v = calloc(1, sizeof *v);
    if (!v) return oom(p, sizeof *v);
    v->kind = kind;
    v->offset = offset;
    return v;
}

void cluster_json_free(cluster_json **vp) {
    if (!vp || !*vp) return;
    cluster_json *v = *vp;
    free(v->str);
    for (size_t i = 0; v->items && i < v->n; i++) cluster_json_free(&v->items[i]);
    free(v->items);
    for (size_t i = 0; v->members && i < v->n; i++) {
        free(v->members[i].key);
        cluster_json_free(&v->members[i].value);
    }
    free(v->members);
    free(v);
    *vp = NULL;
}

static cluster_json *parse_value(parser *p);

static bool match_word(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return false;
    p->pos += n;
    return true;
}

static cluster_json *parse_number(parser *p) {
    size_t start = p->pos;
    const char *s = p->s;
    size_t i = start;
    char d[24];
    if (i < p->len && s[i] == '-') i++;
    if (i < p->len && s[i] == 'I') {   // -Infinity
        p->pos = i;
        if (!match_word(p, "Infinity"))
            return fail(p, start, "unexpected '-' (expected a value)");
        cluster_json *v = new_value(p, CLUSTER_JSON_NUMBER, start);
        if (!v) return NULL;
        v->number = -INFINITY;
        v->is_float = true;
        v->src_len = p->pos - start;
        if (!(v->str = strndup(s + start, v->src_len))) {
            size_t n_bytes = v->src_len + 1;
            free(v);
            return oom(p, n_bytes);
        }
        v->str_len = v->src_len;
        return v;
    }
    if (i >= p->len || s[i] < '0' || s[i] > '9')
        return fail(p, i, "expected a digit, got %s", describe(p, i, d, sizeof d));
    if (s[i] == '0') {
        i++;
        if (i < p->len && s[i] >= '0' && s[i] <= '9')
            return fail(p, start, "number with a leading zero");
    } else {
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    bool is_int = true;
    if (i < p->len && s[i] == '.') {
        is_int = false;
        i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, i, "expected a digit after '.', got %s", describe(p, i, d, sizeof d));
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    if (i < p->len && (s[i] == 'e' || s[i] == 'E')) {
        is_int = false;
        i++;
        if (i < p->len && (s[i] == '+' || s[i] == '-')) i++;
        if (i >= p->len || s[i] < '0' || s[i] > '9')
            return fail(p, i, "expected a digit in exponent, got %s",
                        describe(p, i, d, sizeof d));
        while (i < p->len && s[i] >= '0' && s[i] <= '9') i++;
    }
    size_t n = i - start;

    cluster_json *v = new_value(p, CLUSTER_JSON_NUMBER, start);
    if (!v) return NULL;
    // The literal, kept for str() of integers past int64; strtod needs it terminated anyway.
    v->str = malloc(n + 1);
    if (!v->str) {
        free(v);
        return oom(p, n + 1);
    }
    memcpy(v->str, s + start, n);
    v->str[n] = '\0';
    v->str_len = n;
    // Past the double range Python's float() gives an infinity (and 1e-400 gives 0.0).
    v->number = strtod(v->str, NULL);
    v->is_float = !is_int;
    if (is_int) {
        // Exact int64 conversion of the digits; strtod would lose precision past 2^53.
        bool neg = s[start] == '-';
        uint64_t mag = 0;
        uint64_t limit = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
        bool fits = true;
        for (size_t k = start + (neg ? 1 : 0); k < i; k++) {
            unsigned dig = (unsigned)(s[k] - '0');
            if (mag > (limit - dig) / 10) {
                fits = false;
                break;
            }
            mag = mag * 10 + dig;
        }
        if (fits) {
            v->is_int = true;
            v->integer = neg ? (mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag)
                             : (int64_t)mag;
        }
    }
    p->pos = i;
    v->src_len = n;
    return v;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Reads the four hex digits of a \u escape at pos (just after "\u").
static bool read_hex4(parser *p, size_t pos, unsigned *out) {
    if (p->len - pos < 4) return false;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        int h = hex_digit(p->s[pos + (size_t)k]);
        if (h < 0) return false;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return true;
}

static size_t put_utf8(char *out, unsigned cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Length of the valid UTF-8 sequence starting at s[0] (a byte >= 0x80), 0 if invalid.
static size_t utf8_seq_len(const unsigned char *s, size_t avail) {
    unsigned char c = s[0];
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;   // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;          // no overlong forms
        if (c == 0xED) hi = 0x9F;          // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;          // nothing above U+10FFFF
    } else {
        return 0;
    }
    if (avail < n) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t k = 2; k < n; k++)
        if (s[k] < 0x80 || s[k] > 0xBF) return 0;
    return n;
}

// Parses a string at p->pos (the opening quote). On success *out is a new buffer and
// *is_utf8 tells whether it is Unicode text. Python keeps a lone surrogate escape as it is, and
// reads each byte of the environment that is not UTF-8 as the lone surrogate U+DC80 + byte
// (surrogateescape); both are kept here in WTF-8 (the 3-byte form of the surrogate).
static bool parse_string_raw(parser *p, char **out, size_t *out_len, bool *is_utf8) {
    size_t start = p->pos;
    size_t i = start + 1;
    // First pass: find the closing quote, so the buffer can be sized; decoding makes a string
    // at most three times as long as its source (a stray byte becomes a 3-byte surrogate).
    while (i < p->len && p->s[i] != '"') {
        if (p->s[i] == '\\') i++;
        i++;
    }
    if (i >= p->len) {
        fail(p, start, "unterminated string");
        return false;
    }
    size_t cap = 3 * (i - start) + 1;
    char *buf = malloc(cap);
    if (!buf) {
        oom(p, cap);
        return false;
    }
    size_t n = 0;
    size_t k = start + 1;
    char d[24];
    *is_utf8 = true;
    while (p->s[k] != '"') {
        unsigned char c = (unsigned char)p->s[k];
        if (c < 0x20) {
            fail(p, k, "control character (%s) in string", describe(p, k, d, sizeof d));
            goto fail;
        }
        if (c >= 0x80) {
            size_t sl = utf8_seq_len((const unsigned char *)p->s + k, p->len - k);
            if (sl == 0) {
                n += put_utf8(buf + n, 0xDC00u + c);
                *is_utf8 = false;
                k++;
                continue;
            }
            memcpy(buf + n, p->s + k, sl);
            n += sl;
            k += sl;
            continue;
        }
        if (c != '\\') {
            buf[n++] = (char)c;
            k++;
            continue;
        }
        char e = p->s[k + 1];
        switch (e) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            unsigned cp;
            if (!read_hex4(p, k + 2, &cp)) {
                fail(p, k, "bad \\u escape");
                goto fail;
            }
            size_t esc_len = 6;
            unsigned lo;
            if (cp >= 0xD800 && cp <= 0xDBFF && p->len - k >= 12 && p->s[k + 6] == '\\' &&
                p->s[k + 7] == 'u' && read_hex4(p, k + 8, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                esc_len = 12;
            } else if (cp >= 0xD800 && cp <= 0xDFFF) {
                *is_utf8 = false;
            }
            n += put_utf8(buf + n, cp);
            k += esc_len;
            continue;
        }
        default:
            fail(p, k, "bad escape \\%s", describe(p, k + 1, d, sizeof d));
            goto fail;
        }
        k += 2;
    }
    buf[n] = '\0';
    p->pos = k + 1;
    *out = buf;
    *out_len = n;
    return true;
fail:
    free(buf);
    return false;
}

static cluster_json *parse_string(parser *p) {
    size_t start = p->pos;
    cluster_json *v = new_value(p, CLUSTER_JSON_STRING, start);
    if (!v) return NULL;
    if (!parse_string_raw(p, &v->str, &v->str_len, &v->str_is_utf8)) {
        free(v);
        return NULL;
    }
    v->src_len = p->pos - start;
    return v;
}

// Grows *arr (of elem-size items) so that it holds at least need items.
static bool grow(parser *p, void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 4;
    while (ncap < need) ncap *= 2;
    void *np = realloc(*arr, ncap * elem);
    if (!np) {
        oom(p, ncap * elem);
        return false;
    }
    *arr = np;
    *cap = ncap;
    return true;
}

static cluster_json *parse_array(parser *p) {
    size_t start = p->pos;
    cluster_json *v = new_value(p, CLUSTER_JSON_ARRAY, start);
    if (!v) return NULL;
    size_t cap = 0;
    char d[24];
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
        v->src_len = p->pos - start;
        return v;
    }
    for (;;) {
        skip_ws(p);
        cluster_json *item = parse_value(p);
        if (!item) goto fail;
        if (!grow(p, (void **)&v->items, &cap, v->n + 1, sizeof *v->items)) {
            cluster_json_free(&item);
            goto fail;
        }
        v->items[v->n++] = item;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            break;
        }
        fail(p, p->pos, "expected ',' or ']' in array, got %s", describe(p, p->pos, d, sizeof d));
        goto fail;
    }
    v->src_len = p->pos - start;
    return v;
fail:
    cluster_json_free(&v);
    return NULL;
}

static int cmp_member(const void *a, const void *b) {
    const cluster_json_member *x = *(cluster_json_member *const *)a;
    const cluster_json_member *y = *(cluster_json_member *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    if (c) return c;
    return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

// Duplicate keys are an error: Python keeps the last one silently, which hides mistakes
// in hand-written TF_CONFIG. Sorting keeps this O(n log n) on huge objects.
static bool check_duplicates(parser *p, cluster_json *v) {
    if (v->n < 2) return true;
    cluster_json_member **sorted = malloc(v->n * sizeof *sorted);
    if (!sorted) {
        oom(p, v->n * sizeof *sorted);
        return false;
    }
    for (size_t i = 0; i < v->n; i++) sorted[i] = &v->members[i];
    qsort(sorted, v->n, sizeof *sorted, cmp_member);
    bool ok = true;
    for (size_t i = 1; i < v->n; i++) {
        if (cmp_member(&sorted[i - 1], &sorted[i]) == 0) {
            // Report the later occurrence in the source.
            const cluster_json_member *dup =
                sorted[i]->key_offset > sorted[i - 1]->key_offset ? sorted[i] : sorted[i - 1];
            fail(p, dup->key_offset, "duplicate key \"%.*s\" in object",
                 (int)(dup->key_len > 60 ? 60 : dup->key_len), dup->key);
            ok = false;
            break;
        }
    }
    free(sorted);
    return ok;
}

static cluster_json *parse_object(parser *p) {
    size_t start = p->pos;
    cluster_json *v = new_value(p, CLUSTER_JSON_OBJECT, start);
    if (!v) return NULL;
    size_t cap = 0;
    char d[24];
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
        v->src_len = p->pos - start;
        return v;
    }
    for (;;) {
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"') {
            fail(p, p->pos, "expected a string key in object, got %s",
                 describe(p, p->pos, d, sizeof d));
            goto fail;
        }
        char *key;
        size_t key_len;
        bool key_is_utf8;
        size_t key_offset = p->pos;
        if (!parse_string_raw(p, &key, &key_len, &key_is_utf8)) goto fail;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            free(key);
            fail(p, p->pos, "expected ':' after object key, got %s",
                 describe(p, p->pos, d, sizeof d));
            goto fail;
        }
        p->pos++;
        skip_ws(p);
        cluster_json *val = parse_value(p);
        if (!val) {
            free(key);
            goto fail;
        }
        if (!grow(p, (void **)&v->members, &cap, v->n + 1, sizeof *v->members)) {
            free(key);
            cluster_json_free(&val);
            goto fail;
        }
        v->members[v->n].key = key;
        v->members[v->n].key_len = key_len;
        v->members[v->n].key_is_utf8 = key_is_utf8;
        v->members[v->n].key_offset = key_offset;
        v->members[v->n].value = val;
        v->n++;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') {
            p->pos++;
            break;
        }
        fail(p, p->pos, "expected ',' or '}' in object, got %s", describe(p, p->pos, d, sizeof d));
        goto fail;
    }
    if (!check_duplicates(p, v)) goto fail;
    v->src_len = p->pos - start;
    return v;
fail:
    cluster_json_free(&v);
    return NULL;
}

static cluster_json *parse_value(parser *p) {
    char d[24];
    if (p->pos >= p->len) return fail(p, p->pos, "unexpected end of input");
    size_t start = p->pos;
    char c = p->s[p->pos];
    switch (c) {
    case '{':
    case '[': {
        if (p->depth >= CLUSTER_JSON_MAX_DEPTH)
            return fail(p, start, "nesting deeper than %d levels", CLUSTER_JSON_MAX_DEPTH);
        p->depth++;
        cluster_json *v = c == '{' ? parse_object(p) : parse_array(p);
        p->depth--;
        return v;
    }
    case '"':
        return parse_string(p);
    case 'N':
    case 'I': {
        const char *word = c == 'N' ? "NaN" : "Infinity";
        if (!match_word(p, word))
            return fail(p, start, "unexpected %s (expected a value)", describe(p, start, d, sizeof d));
        cluster_json *v = new_value(p, CLUSTER_JSON_NUMBER, start);
        if (!v) return NULL;
        v->number = c == 'N' ? NAN : INFINITY;
        v->is_float = true;
        v->src_len = p->pos - start;
        if (!(v->str = strdup(word))) {
            free(v);
            return oom(p, strlen(word) + 1);
        }
        v->str_len = v->src_len;
        return v;
    }
    case 't':
    case 'f':
    case 'n': {
        cluster_json_kind kind = c == 'n' ? CLUSTER_JSON_NULL : CLUSTER_JSON_BOOL;
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        if (!match_word(p, word))
            return fail(p, start, "unexpected %s (expected a value)",
                        describe(p, start, d, sizeof d));
        cluster_json *v = new_value(p, kind, start);
        if (!v) return NULL;
        v->boolean = c == 't';
        v->src_len = p->pos - start;
        return v;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
        return fail(p, start, "unexpected %s (expected a value)", describe(p, start, d, sizeof d));
    }
}

cluster_json *cluster_json_parse(const char *text, size_t len, const char *what, dg_status *st) {
    parser p = {.s = text ? text : "", .len = text ? len : 0, .what = what ? what : "JSON",
                .st = st};
    skip_ws(&p);
    cluster_json *v = parse_value(&p);
    if (!v) return NULL;
    skip_ws(&p);
    if (p.pos < p.len) {
        char d[24];
        fail(&p, p.pos, "unexpected %s after the value", describe(&p, p.pos, d, sizeof d));
        cluster_json_free(&v);
        return NULL;
    }
    return v;
}

const cluster_json *cluster_json_get(const cluster_json *v, const char *key) {
    if (!v || v->kind != CLUSTER_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < v->n; i++)
        if (v->members[i].key_len == n && memcmp(v->members[i].key, key, n) == 0)
            return v->members[i].value;
    return NULL;
}

const char *cluster_json_kind_name(cluster_json_kind k) {
    switch (k) {
    case CLUSTER_JSON_NULL: return "null";
    case CLUSTER_JSON_BOOL: return "boolean";
    case CLUSTER_JSON_NUMBER: return "number";
    case CLUSTER_JSON_STRING: return "string";
    case CLUSTER_JSON_ARRAY: return "array";
    case CLUSTER_JSON_OBJECT: return "object";
    }
    return "unknown";
}

bool cluster_json_is_cstring(const cluster_json *v) {
    return v && v->kind == CLUSTER_JSON_STRING && v->str_is_utf8 && strlen(v->str) == v->str_len;
}

// ---- Python's view of a value ----

const char *cluster_json_py_type(const cluster_json *v) {
    switch (v->kind) {
    case CLUSTER_JSON_NULL: return "NoneType";
    case CLUSTER_JSON_BOOL: return "bool";
    case CLUSTER_JSON_NUMBER: return v->is_float ? "float" : "int";
    case CLUSTER_JSON_STRING: return "str";
    case CLUSTER_JSON_ARRAY: return "list";
    case CLUSTER_JSON_OBJECT: return "dict";
    }
    return "object";
}

bool cluster_json_py_truthy(const cluster_json *v) {
    switch (v->kind) {
    case CLUSTER_JSON_NULL: return false;
    case CLUSTER_JSON_BOOL: return v->boolean;
    case CLUSTER_JSON_NUMBER: return v->is_float ? v->number != 0.0 || isnan(v->number)
                                                : !(v->is_int && v->integer == 0);
    case CLUSTER_JSON_STRING: return v->str_len > 0;
    case CLUSTER_JSON_ARRAY:
    case CLUSTER_JSON_OBJECT: return v->n > 0;
    }
    return false;
}

bool cluster_json_py_str_eq(const cluster_json *v, const char *s) {
    return v->kind == CLUSTER_JSON_STRING && v->str_len == strlen(s) && memcmp(v->str, s, v->str_len) == 0;
}

int cluster_json_py_contains(const cluster_json *v, const char *key) {
    size_t n = strlen(key);
    switch (v->kind) {
    case CLUSTER_JSON_OBJECT:
        return cluster_json_get(v, key) != NULL;
    case CLUSTER_JSON_ARRAY:
        for (size_t i = 0; i < v->n; i++)
            if (cluster_json_py_str_eq(v->items[i], key)) return 1;
        return 0;
    case CLUSTER_JSON_STRING:
        if (n == 0) return 1;
        for (size_t i = 0; i + n <= v->str_len; i++)
            if (memcmp(v->str + i, key, n) == 0) return 1;
        return 0;
    default:
        return -1;
    }
}

// ---- int() ----

// The code points whose decimal value is 0: each starts a run of the ten digits 0..9 of a
// script (Unicode 14, the database of the Pythons TensorFlow 2.21 runs on).
static const uint32_t digit_zeros[] = {
    0x30,    0x660,   0x6f0,   0x7c0,   0x966,   0x9e6,   0xa66,   0xae6,   0xb66,   0xbe6,
    0xc66,   0xce6,   0xd66,   0xde6,   0xe50,   0xed0,   0xf20,   0x1040,  0x1090,  0x17e0,
    0x1810,  0x1946,  0x19d0,  0x1a80,  0x1a90,  0x1b50,  0x1bb0,  0x1c40,  0x1c50,  0xa620,
    0xa8d0,  0xa900,  0xa9d0,  0xa9f0,  0xaa50,  0xabf0,  0xff10,  0x104a0, 0x10d30, 0x11066,
    0x110f0, 0x11136, 0x111d0, 0x112f0, 0x11450, 0x114d0, 0x11650, 0x116c0, 0x11730, 0x118e0,
    0x11950, 0x11c50, 0x11d50, 0x11da0, 0x16a60, 0x16ac0, 0x16b50, 0x1d7ce, 0x1d7d8, 0x1d7e2,
    0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e950, 0x1fbf0,
};

static int unicode_digit(uint32_t cp) {
    for (size_t i = 0; i < sizeof digit_zeros / sizeof *digit_zeros; i++)
        if (cp >= digit_zeros[i] && cp < digit_zeros[i] + 10) return (int)(cp - digit_zeros[i]);
    return -1;
}

// Python's str.isspace() beyond ASCII (int() reads these as spaces).
static bool unicode_space(uint32_t cp) {
    return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

// Decodes one code point of WTF-8 at s (len > 0 bytes left); *n gets its length. Anything
// malformed reads as one byte, U+FFFD.
static uint32_t decode_cp(const unsigned char *s, size_t len, size_t *n) {
    unsigned char c = s[0];
    size_t want = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (want == 0 || want > len) {
        *n = 1;
        return want == 1 ? c : 0xFFFD;
    }
    uint32_t cp = want == 1 ? c : want == 2 ? c & 0x1Fu : want == 3 ? c & 0x0Fu : c & 0x07u;
    for (size_t k = 1; k < want; k++) {
        if ((s[k] & 0xC0) != 0x80) {
            *n = 1;
            return 0xFFFD;
        }
        cp = cp << 6 | (s[k] & 0x3Fu);
    }
    *n = want;
    return cp;
}

cluster_py_int cluster_py_int_from_text(const char *text, size_t len, int64_t *out) {
    // As CPython: non-ASCII spaces become ' ' and digits of any script their ASCII digit
    // (anything else non-ASCII makes the text invalid), then ASCII whitespace around an
    // optionally signed run of digits with single underscores between them.
    char *t = malloc(len + 1);
    if (!t) return CLUSTER_PY_INT_VALUE_ERROR;
    size_t m = 0;
    const unsigned char *s = (const unsigned char *)text;
    for (size_t i = 0; i < len;) {
        size_t k;
        uint32_t cp = decode_cp(s + i, len - i, &k);
        i += k;
        if (cp < 0x80) {
            t[m++] = (char)cp;
        } else if (unicode_space(cp)) {
            t[m++] = ' ';
        } else {
            int dig = unicode_digit(cp);
            t[m++] = dig < 0 ? '?' : (char)('0' + dig);
        }
    }
    size_t a = 0, b = m;
    while (a < b && strchr(" \t\n\v\f\r", t[a]) && t[a]) a++;
    while (b > a && strchr(" \t\n\v\f\r", t[b - 1]) && t[b - 1]) b--;
    bool neg = false;
    if (a < b && (t[a] == '+' || t[a] == '-')) neg = t[a++] == '-';
    cluster_py_int r = CLUSTER_PY_INT_OK;
    uint64_t mag = 0;
    bool big = false, any = false, prev_digit = false;
    for (size_t i = a; i < b; i++) {
        char c = t[i];
        if (c == '_' && prev_digit && i + 1 < b && t[i + 1] >= '0' && t[i + 1] <= '9') {
            prev_digit = false;
            continue;
        }
        if (c < '0' || c > '9') {
            r = CLUSTER_PY_INT_VALUE_ERROR;
            break;
        }
        prev_digit = any = true;
        if (!big) {
            if (mag > (UINT64_MAX - (uint64_t)(c - '0')) / 10)
                big = true;
            else
                mag = mag * 10 + (uint64_t)(c - '0');
        }
    }
    free(t);
    // Python refuses integers of more than 4300 digits too; either way it is no index.
    if (r != CLUSTER_PY_INT_OK || !any) return CLUSTER_PY_INT_VALUE_ERROR;
    if (big || mag > (neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX)) {
        *out = neg ? INT64_MIN : INT64_MAX;
        return CLUSTER_PY_INT_TOO_BIG;
    }
    *out = neg ? (mag == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
    return CLUSTER_PY_INT_OK;
}

cluster_py_int cluster_json_py_int(const cluster_json *v, int64_t *out) {
    switch (v->kind) {
    case CLUSTER_JSON_BOOL:
        *out = v->boolean;
        return CLUSTER_PY_INT_OK;
    case CLUSTER_JSON_NUMBER:
        if (!v->is_float) {
            if (v->is_int) {
                *out = v->integer;
                return CLUSTER_PY_INT_OK;
            }
            *out = v->str[0] == '-' ? INT64_MIN : INT64_MAX;
            return CLUSTER_PY_INT_TOO_BIG;
        }
        if (isnan(v->number)) return CLUSTER_PY_INT_VALUE_ERROR;
        if (isinf(v->number)) return CLUSTER_PY_INT_OVERFLOW;
        if (v->number >= 9223372036854775808.0 || v->number < -9223372036854775808.0) {
            *out = v->number < 0 ? INT64_MIN : INT64_MAX;
            return CLUSTER_PY_INT_TOO_BIG;
        }
        *out = (int64_t)trunc(v->number);
        return CLUSTER_PY_INT_OK;
    case CLUSTER_JSON_STRING:
        return cluster_py_int_from_text(v->str, v->str_len, out);
    default:
        return CLUSTER_PY_INT_TYPE_ERROR;
    }
}

// ---- str() and repr() ----

void cluster_py_float_repr(double x, char *buf, size_t cap) {
    if (isnan(x)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(x)) {
        snprintf(buf, cap, x < 0 ? "-inf" : "inf");
        return;
    }
    // The shortest digits that read back as x (Python's repr), then its layout: positional
    // when the decimal exponent is in -4..15, else scientific with a signed 2+ digit exponent.
    char e[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, x);
        if (strtod(e, NULL) == x) break;
    }
    // e: [-]d[.ddd]e[+-]xx
    const char *p = e;
    bool neg = *p == '-';
    if (neg) p++;
    char digits[24];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    char out[64];
    size_t o = 0;
    if (neg) out[o++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int z = 0; z < -exp10 - 1; z++) out[o++] = '0';
            for (size_t k = 0; k < nd; k++) out[o++] = digits[k];
        } else {
            for (int k = 0; k <= exp10; k++) out[o++] = (size_t)k < nd ? digits[k] : '0';
            out[o++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t k = (size_t)exp10 + 1; k < nd; k++) out[o++] = digits[k];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t k = 1; k < nd; k++) out[o++] = digits[k];
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(buf, cap, "%s", out);
}

void cluster_buf_put(cluster_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 64;
        while (ncap < b->len + n + 1) ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->failed = true;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void cluster_buf_str(cluster_buf *b, const char *s) { cluster_buf_put(b, s, strlen(s)); }

// Python's str.isprintable(), except that unassigned code points count as printable (they
// would need Unicode's full tables; Python escapes them).
static bool py_printable(uint32_t cp) {
    static const uint32_t ranges[][2] = {
        {0x0, 0x1f},         {0x7f, 0xa0},       {0xad, 0xad},       {0x600, 0x605},
        {0x61c, 0x61c},      {0x6dd, 0x6dd},     {0x70f, 0x70f},     {0x890, 0x891},
        {0x8e2, 0x8e2},      {0x1680, 0x1680},   {0x180e, 0x180e},   {0x2000, 0x200f},
        {0x2028, 0x202f},    {0x205f, 0x2064},   {0x2066, 0x206f},   {0x3000, 0x3000},
        {0xd800, 0xf8ff},    {0xfeff, 0xfeff},   {0xfff9, 0xfffb},   {0x110bd, 0x110bd},
        {0x110cd, 0x110cd},  {0x13430, 0x13438}, {0x1bca0, 0x1bca3}, {0x1d173, 0x1d17a},
        {0xe0001, 0xe0001},  {0xe0020, 0xe007f}, {0xf0000, 0x10ffff},
    };
    for (size_t i = 0; i < sizeof ranges / sizeof *ranges; i++)
        if (cp >= ranges[i][0] && cp <= ranges[i][1]) return false;
    return true;
}

static void py_repr_str(cluster_buf *b, const char *s, size_t len) {
    bool has_single = memchr(s, '\'', len) != NULL, has_double = memchr(s, '"', len) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    cluster_buf_put(b, &quote, 1);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        size_t k;
        uint32_t cp = decode_cp(u + i, len - i, &k);
        char esc[16];
        if (cp == (uint32_t)quote || cp == '\\') {
            esc[0] = '\\';
            esc[1] = (char)cp;
            cluster_buf_put(b, esc, 2);
        } else if (cp == '\t' || cp == '\n' || cp == '\r') {
            esc[0] = '\\';
            esc[1] = cp == '\t' ? 't' : cp == '\n' ? 'n' : 'r';
            cluster_buf_put(b, esc, 2);
        } else if (cp < 0x20 || cp == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", cp);
            cluster_buf_str(b, esc);
        } else if (cp < 0x7f || py_printable(cp)) {
            cluster_buf_put(b, s + i, k);
        } else {
            snprintf(esc, sizeof esc, cp <= 0xff ? "\\x%02x" : cp <= 0xffff ? "\\u%04x" : "\\U%08x", cp);
            cluster_buf_str(b, esc);
        }
        i += k;
    }
    cluster_buf_put(b, &quote, 1);
}

static void py_format(cluster_buf *b, const cluster_json *v, bool repr) {
    char num[40];
    switch (v->kind) {
    case CLUSTER_JSON_NULL: cluster_buf_str(b, "None"); return;
    case CLUSTER_JSON_BOOL: cluster_buf_str(b, v->boolean ? "True" : "False"); return;
    case CLUSTER_JSON_NUMBER:
        if (v->is_float) {
            cluster_py_float_repr(v->number, num, sizeof num);
            cluster_buf_str(b, num);
        } else {
            cluster_buf_str(b, strcmp(v->str, "-0") == 0 ? "0" : v->str);   // json.loads reads -0 as 0
        }
        return;
    case CLUSTER_JSON_STRING:
        if (repr)
            py_repr_str(b, v->str, v->str_len);
        else
            cluster_buf_put(b, v->str, v->str_len);
        return;
    case CLUSTER_JSON_ARRAY:
        cluster_buf_str(b, "[");
        for (size_t i = 0; i < v->n; i++) {
            if (i) cluster_buf_str(b, ", ");
            py_format(b, v->items[i], true);
        }
        cluster_buf_str(b, "]");
        return;
    case CLUSTER_JSON_OBJECT:
        cluster_buf_str(b, "{");
        for (size_t i = 0; i < v->n; i++) {
            if (i) cluster_buf_str(b, ", ");
            py_repr_str(b, v->members[i].key, v->members[i].key_len);
            cluster_buf_str(b, ": ");
            py_format(b, v->members[i].value, true);
        }
        cluster_buf_str(b, "}");
        return;
    }
}

char *cluster_json_py_str(const cluster_json *v) {
    cluster_buf b = {0};
    cluster_buf_put(&b, "", 0);
    py_format(&b, v, false);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
