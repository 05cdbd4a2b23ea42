/* Output helpers shared by dg-inspect's subcommands (inspect.h). A tool prints and exits, so
 * running out of memory here ends the process with a message instead of threading a status
 * through every printer. */
#include "inspect.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void out_of_memory(void) {
    fprintf(stderr, "dg-inspect: out of memory\n");
    exit(1);
}

void inspect_die_status(const char *what, const dg_status *st) {
    fprintf(stderr, "dg-inspect: %s: %s: %s\n", what, dg_code_name(dg_status_code(st)), dg_status_message(st));
}

void *inspect_xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory();
    return p;
}

char *inspect_xstrdup(const char *s) {
    char *d = strdup(s);
    if (!d) out_of_memory();
    return d;
}

void *inspect_xrealloc(void *p, size_t size) {
    void *q = realloc(p, size ? size : 1);
    if (!q) out_of_memory();
    return q;
}

void inspect_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

void inspect_xml_str(FILE *f, const char *s) {
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default:
            if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f) fputc('?', f);
            else fputc(*s, f);
        }
    }
}

void inspect_sb_printf(inspect_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = inspect_xrealloc(b->s, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, b->cap - b->n, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

const char *inspect_sb_str(const inspect_sbuf *b) { return b->s ? b->s : ""; }

void inspect_table_init(inspect_table *t, const char *const *head, int n_cols) {
    memset(t, 0, sizeof *t);
    t->n_cols = n_cols;
    if (!head) return;
    char **r = inspect_table_add(t);
    for (int c = 0; c < n_cols; c++) r[c] = inspect_xstrdup(head[c]);
}

char **inspect_table_add(inspect_table *t) {
    if (t->n_rows == t->cap_rows) {
        t->cap_rows = t->cap_rows ? 2 * t->cap_rows : 16;
        t->rows = inspect_xrealloc(t->rows, (size_t)t->cap_rows * sizeof *t->rows);
    }
    return t->rows[t->n_rows++] = inspect_xcalloc((size_t)t->n_cols, sizeof **t->rows);
}

static const char *cell(const inspect_table *t, int r, int c) { return t->rows[r][c] ? t->rows[r][c] : ""; }

void inspect_table_print(const inspect_table *t, int n_cols) {
    if (n_cols > t->n_cols) n_cols = t->n_cols;
    size_t *w = inspect_xcalloc((size_t)n_cols, sizeof *w);
    for (int r = 0; r < t->n_rows; r++)
        for (int c = 0; c < n_cols; c++)
            if (strlen(cell(t, r, c)) > w[c]) w[c] = strlen(cell(t, r, c));
    for (int r = 0; r < t->n_rows; r++) {
        int last = n_cols - 1;   // no padding after the last non-empty cell
        while (last > 0 && !cell(t, r, last)[0]) last--;
        for (int c = 0; c <= last; c++) {
            if (c == last) printf("%s", cell(t, r, c));
            else printf("%-*s  ", (int)w[c], cell(t, r, c));
        }
        printf("\n");
    }
    free(w);
}

void inspect_table_free(inspect_table *t) {
    for (int r = 0; r < t->n_rows; r++) {
        for (int c = 0; c < t->n_cols; c++) free(t->rows[r][c]);
        free(t->rows[r]);
    }
    free(t->rows);
    memset(t, 0, sizeof *t);
}

dg_checkpoint_store *inspect_open_checkpoint(const char *file, dg_status *st) {
    dg_checkpoint_store *s = dg_checkpoint_store_new(file, false, st);
    if (!s) inspect_die_status("opening", st);
    return s;
}

bool inspect_has_ext(const char *path, const char *ext) {
    size_t n = strlen(path), k = strlen(ext);
    return n > k && strcasecmp(path + n - k, ext) == 0;
}
