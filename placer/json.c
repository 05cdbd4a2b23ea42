/* Strict JSON parser (see json_impl.h). Recursive descent; recursion depth is bounded by
 * PLACER_JSON_MAX_DEPTH, so hostile input cannot exhaust the stack. */
#include "json_impl.h"

#include <errno.h>
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
    dg_status_setf(p->st, DG_RESOURCE_EXHAUSTED, "%s: out of memory allocating %zu bytes",
                   p->what, n_bytes);
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

static placer_json *new_value(parser *p, placer_json_kind kind, size_t offset) {
    placer_json *v = calloc(1, sizeof *v);
    if (!v) return oom(p, sizeof *v);
    v->kind = kind;
    v->offset = offset;
    return v;
}

void placer_json_free(placer_json **vp) {
    if (!vp || !*vp) return;
    placer_json *v = *vp;
    free(v->str);
    for (size_t i = 0; v->items && i < v->n; i++) placer_json_free(&v->items[i]);
    free(v->items);
    for (size_t i = 0; v->members && i < v->n; i++) {
        free(v->members[i].key);
        placer_json_free(&v->members[i].value);
    }
    free(v->members);
    free(v);
    *vp = NULL;
}

static placer_json *parse_value(parser *p);

static bool match_word(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return false;
    p->pos += n;
    return true;
}

static placer_json *parse_number(parser *p) {
    size_t start = p->pos;
    const char *s = p->s;
    size_t i = start;
    char d[24];
    if (i < p->len && s[i] == '-') i++;
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

    placer_json *v = new_value(p, PLACER_JSON_NUMBER, start);
    if (!v) return NULL;
    // strtod needs a terminated copy; the source need not be terminated after the number.
    char small[64];
    char *copy = n < sizeof small ? small : malloc(n + 1);
    if (!copy) {
        free(v);
        return oom(p, n + 1);
    }
    memcpy(copy, s + start, n);
    copy[n] = '\0';
    errno = 0;
    v->number = strtod(copy, NULL);
    bool overflow = errno == ERANGE && isinf(v->number);
    if (copy != small) free(copy);
    if (overflow) {
        free(v);
        return fail(p, start, "number %.*s is out of range", (int)(n > 40 ? 40 : n), s + start);
    }
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

// Parses a string at p->pos (the opening quote). On success *out is a new buffer.
static bool parse_string_raw(parser *p, char **out, size_t *out_len) {
    size_t start = p->pos;
    size_t i = start + 1;
    // First pass: find the closing quote, so the buffer can be sized; decoding never
    // makes a string longer than its source.
    while (i < p->len && p->s[i] != '"') {
        if (p->s[i] == '\\') i++;
        i++;
    }
    if (i >= p->len) {
        fail(p, start, "unterminated string");
        return false;
    }
    size_t cap = i - start;
    char *buf = malloc(cap);
    if (!buf) {
        oom(p, cap);
        return false;
    }
    size_t n = 0;
    size_t k = start + 1;
    char d[24];
    while (p->s[k] != '"') {
        unsigned char c = (unsigned char)p->s[k];
        if (c < 0x20) {
            fail(p, k, "control character (%s) in string", describe(p, k, d, sizeof d));
            goto fail;
        }
        if (c >= 0x80) {
            size_t sl = utf8_seq_len((const unsigned char *)p->s + k, p->len - k);
            if (sl == 0) {
                fail(p, k, "invalid UTF-8 in string");
                goto fail;
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
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                fail(p, k, "lone low surrogate \\u%04X", cp);
                goto fail;
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned lo;
                if (p->len - k < 12 || p->s[k + 6] != '\\' || p->s[k + 7] != 'u' ||
                    !read_hex4(p, k + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
                    fail(p, k, "high surrogate \\u%04X not followed by a low surrogate", cp);
                    goto fail;
                }
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                esc_len = 12;
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

static placer_json *parse_string(parser *p) {
    size_t start = p->pos;
    placer_json *v = new_value(p, PLACER_JSON_STRING, start);
    if (!v) return NULL;
    if (!parse_string_raw(p, &v->str, &v->str_len)) {
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

static placer_json *parse_array(parser *p) {
    size_t start = p->pos;
    placer_json *v = new_value(p, PLACER_JSON_ARRAY, start);
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
        placer_json *item = parse_value(p);
        if (!item) goto fail;
        if (!grow(p, (void **)&v->items, &cap, v->n + 1, sizeof *v->items)) {
            placer_json_free(&item);
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
    placer_json_free(&v);
    return NULL;
}

static int cmp_member(const void *a, const void *b) {
    const placer_json_member *x = *(placer_json_member *const *)a;
    const placer_json_member *y = *(placer_json_member *const *)b;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->key, y->key, n);
    if (c) return c;
    return (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

// Duplicate keys are an error: Python keeps the last one silently, which hides mistakes
// in hand-written TF_CONFIG. Sorting keeps this O(n log n) on huge objects.
static bool check_duplicates(parser *p, placer_json *v) {
    if (v->n < 2) return true;
    placer_json_member **sorted = malloc(v->n * sizeof *sorted);
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
            const placer_json_member *dup =
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

static placer_json *parse_object(parser *p) {
    size_t start = p->pos;
    placer_json *v = new_value(p, PLACER_JSON_OBJECT, start);
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
        size_t key_offset = p->pos;
        if (!parse_string_raw(p, &key, &key_len)) goto fail;
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':') {
            free(key);
            fail(p, p->pos, "expected ':' after object key, got %s",
                 describe(p, p->pos, d, sizeof d));
            goto fail;
        }
        p->pos++;
        skip_ws(p);
        placer_json *val = parse_value(p);
        if (!val) {
            free(key);
            goto fail;
        }
        if (!grow(p, (void **)&v->members, &cap, v->n + 1, sizeof *v->members)) {
            free(key);
            placer_json_free(&val);
            goto fail;
        }
        v->members[v->n].key = key;
        v->members[v->n].key_len = key_len;
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
    placer_json_free(&v);
    return NULL;
}

static placer_json *parse_value(parser *p) {
    char d[24];
    if (p->pos >= p->len) return fail(p, p->pos, "unexpected end of input");
    size_t start = p->pos;
    char c = p->s[p->pos];
    switch (c) {
    case '{':
    case '[': {
        if (p->depth >= PLACER_JSON_MAX_DEPTH)
            return fail(p, start, "nesting deeper than %d levels", PLACER_JSON_MAX_DEPTH);
        p->depth++;
        placer_json *v = c == '{' ? parse_object(p) : parse_array(p);
        p->depth--;
        return v;
    }
    case '"':
        return parse_string(p);
    case 't':
    case 'f':
    case 'n': {
        placer_json_kind kind = c == 'n' ? PLACER_JSON_NULL : PLACER_JSON_BOOL;
        const char *word = c == 't' ? "true" : c == 'f' ? "false" : "null";
        if (!match_word(p, word))
            return fail(p, start, "unexpected %s (expected a value)",
                        describe(p, start, d, sizeof d));
        placer_json *v = new_value(p, kind, start);
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

placer_json *placer_json_parse(const char *text, size_t len, const char *what, dg_status *st) {
    parser p = {.s = text ? text : "", .len = text ? len : 0, .what = what ? what : "JSON",
                .st = st};
    skip_ws(&p);
    placer_json *v = parse_value(&p);
    if (!v) return NULL;
    skip_ws(&p);
    if (p.pos < p.len) {
        char d[24];
        fail(&p, p.pos, "unexpected %s after the value", describe(&p, p.pos, d, sizeof d));
        placer_json_free(&v);
        return NULL;
    }
    return v;
}

const placer_json *placer_json_get(const placer_json *v, const char *key) {
    if (!v || v->kind != PLACER_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < v->n; i++)
        if (v->members[i].key_len == n && memcmp(v->members[i].key, key, n) == 0)
            return v->members[i].value;
    return NULL;
}

const char *placer_json_kind_name(placer_json_kind k) {
    switch (k) {
    case PLACER_JSON_NULL: return "null";
    case PLACER_JSON_BOOL: return "boolean";
    case PLACER_JSON_NUMBER: return "number";
    case PLACER_JSON_STRING: return "string";
    case PLACER_JSON_ARRAY: return "array";
    case PLACER_JSON_OBJECT: return "object";
    }
    return "unknown";
}

bool placer_json_is_cstring(const placer_json *v) {
    return v && v->kind == PLACER_JSON_STRING && strlen(v->str) == v->str_len;
}
