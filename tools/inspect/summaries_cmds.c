/* dg-inspect's commands on the scalar summaries of a checkpoint file: summaries (per tag:
 * rows, steps, last value, non-finite values) and plot (a chart of chart.c). The rows come
 * from dg_checkpoint_store_read_summaries, ordered by tag, then step, then write order; where
 * a step was written more than once (a run restarted from an older checkpoint writes the
 * steps after it again), the row written last is the step's value. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chart.h"
#include "inspect.h"

// ---- summaries ----

typedef struct tag_stats {
    char *tag;               // owned
    long long count;         // rows
    long long n_steps;       // distinct steps
    long long n_nonfinite;   // rows whose value is NaN or infinite
    int64_t first_step, last_step;
    double last_value;       // of the last row of the last step
} tag_stats;

typedef struct stats_list {
    tag_stats *t;
    int n, cap;
} stats_list;

static bool add_to_stats(void *ctx, const dg_checkpoint_summary *row) {
    stats_list *l = ctx;
    tag_stats *t = l->n ? &l->t[l->n - 1] : NULL;
    if (!t || strcmp(t->tag, row->tag) != 0) {   // rows come tag by tag
        if (l->n == l->cap) {
            l->cap = l->cap ? 2 * l->cap : 16;
            l->t = inspect_xrealloc(l->t, (size_t)l->cap * sizeof *l->t);
        }
        t = &l->t[l->n++];
        memset(t, 0, sizeof *t);
        t->tag = inspect_xstrdup(row->tag);
        t->first_step = row->step;
    }
    if (t->count == 0 || row->step != t->last_step) t->n_steps++;
    t->count++;
    t->last_step = row->step;
    t->last_value = row->value;
    if (!isfinite(row->value)) t->n_nonfinite++;
    return true;
}

int inspect_cmd_summaries(const inspect_options *o) {
    dg_status *st = dg_status_new();
    stats_list l = {0};
    int rc = 1;
    dg_checkpoint_store *s = inspect_open_checkpoint(o->file, st);
    if (!s) goto out;
    if (!dg_checkpoint_store_read_summaries(s, NULL, add_to_stats, &l, st)) {
        inspect_die_status("reading the summaries", st);
        goto out;
    }
    if (l.n == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": the summaries table is empty\n", o->file);
        goto out;
    }
    if (o->json) {
        printf("{\"file\": ");
        inspect_json_str(stdout, o->file);
        printf(", \"tags\": [");
        for (int i = 0; i < l.n; i++) {
            const tag_stats *t = &l.t[i];
            printf("%s\n  {\"tag\": ", i ? "," : "");
            inspect_json_str(stdout, t->tag);
            printf(", \"count\": %lld, \"n_steps\": %lld, \"first_step\": %lld, \"last_step\": %lld, "
                   "\"last_value\": ", t->count, t->n_steps, (long long)t->first_step, (long long)t->last_step);
            if (isfinite(t->last_value)) printf("%.17g", t->last_value);
            else printf("null");
            printf(", \"n_nonfinite\": %lld}", t->n_nonfinite);
        }
        printf("\n]}\n");
    } else {
        enum { NC = 5 };
        static const char *const head[NC] = {"tag", "count", "steps", "last value", "non-finite"};
        inspect_table tab;
        inspect_table_init(&tab, head, NC);
        for (int i = 0; i < l.n; i++) {
            const tag_stats *t = &l.t[i];
            char **r = inspect_table_add(&tab);
            char buf[96];
            r[0] = inspect_xstrdup(t->tag);
            if (t->count == t->n_steps) snprintf(buf, sizeof buf, "%lld", t->count);
            else snprintf(buf, sizeof buf, "%lld (%lld steps)", t->count, t->n_steps);
            r[1] = inspect_xstrdup(buf);
            snprintf(buf, sizeof buf, "%lld..%lld", (long long)t->first_step, (long long)t->last_step);
            r[2] = inspect_xstrdup(buf);
            snprintf(buf, sizeof buf, "%g", t->last_value);
            r[3] = inspect_xstrdup(buf);
            snprintf(buf, sizeof buf, "%lld", t->n_nonfinite);
            r[4] = inspect_xstrdup(buf);
        }
        inspect_table_print(&tab, NC);
        inspect_table_free(&tab);
        printf("%d tag%s in %s\n", l.n, l.n == 1 ? "" : "s", o->file);
    }
    rc = 0;
out:
    for (int i = 0; i < l.n; i++) free(l.t[i].tag);
    free(l.t);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// ---- plot ----

// Collects one tag's points: one per step, the row written last where a step repeats.
typedef struct series_reader {
    chart_series *s;
    int cap;
    long long n_rows;
    int64_t last_step;
    bool last_is_finite;   // whether the last row read is among s's points
} series_reader;

static bool add_point(void *ctx, const dg_checkpoint_summary *row) {
    series_reader *r = ctx;
    chart_series *s = r->s;
    if (r->n_rows++ > 0 && row->step == r->last_step) {   // a later row of the same step wins
        if (r->last_is_finite) s->n--;
        else s->n_nonfinite--;
    }
    r->last_step = row->step;
    r->last_is_finite = isfinite(row->value);
    if (!r->last_is_finite) {
        s->n_nonfinite++;
        return true;
    }
    if (s->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 256;
        s->x = inspect_xrealloc(s->x, (size_t)r->cap * sizeof *s->x);
        s->y = inspect_xrealloc(s->y, (size_t)r->cap * sizeof *s->y);
    }
    s->x[s->n] = (double)row->step;
    s->y[s->n++] = row->value;
    return true;
}

// Prints the tags the file holds (at most 20), for an unknown-tag message.
static void print_known_tags(dg_checkpoint_store *s) {
    dg_status *st = dg_status_new();
    char **tags = NULL;
    int n = dg_checkpoint_store_summary_tags(s, &tags, st);
    for (int k = 0; k < n && k <= 20; k++)
        fprintf(stderr, "%s%s", k ? ", " : " (known tags: ", k < 20 ? tags[k] : "...");
    if (n > 0) fputc(')', stderr);
    free(tags);
    dg_status_free(&st);
}

int inspect_cmd_plot(const inspect_options *o) {
    dg_status *st = dg_status_new();
    chart_series *sr = inspect_xcalloc((size_t)o->n_tags, sizeof *sr);
    inspect_sbuf note = {0}, title = {0}, skipped = {0};
    int rc = 1, n_points = 0, n_nonfinite = 0;
    double x_lo = INFINITY, x_hi = -INFINITY;
    dg_checkpoint_store *s = inspect_open_checkpoint(o->file, st);
    if (!s) goto out;
    for (int k = 0; k < o->n_tags; k++) {
        series_reader r = {.s = &sr[k]};
        sr[k].tag = o->tags[k];
        if (!dg_checkpoint_store_read_summaries(s, sr[k].tag, add_point, &r, st)) {
            inspect_die_status("reading the summaries", st);
            goto out;
        }
        if (r.n_rows == 0) {
            fprintf(stderr, "dg-inspect: \"%s\": no summaries with tag \"%s\"", o->file, sr[k].tag);
            print_known_tags(s);
            fputc('\n', stderr);
            goto out;
        }
        for (int i = 0; i < sr[k].n; i++) {
            x_lo = fmin(x_lo, sr[k].x[i]);
            x_hi = fmax(x_hi, sr[k].x[i]);
        }
        n_points += sr[k].n;
        if (sr[k].n_nonfinite)
            inspect_sb_printf(&skipped, "%s%s: %d", n_nonfinite ? ", " : "", sr[k].tag, sr[k].n_nonfinite);
        n_nonfinite += sr[k].n_nonfinite;
    }
    for (int k = 0; k < o->n_tags; k++) inspect_sb_printf(&title, "%s%s", k ? ", " : "", o->tags[k]);
    if (n_points == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": nothing to plot: every value of %s is non-finite\n", o->file,
                inspect_sb_str(&title));
        goto out;
    }
    if (n_nonfinite)
        inspect_sb_printf(&note, "%d non-finite value%s skipped (%s)", n_nonfinite, n_nonfinite == 1 ? "" : "s",
                          inspect_sb_str(&skipped));
    const char *base = strrchr(o->file, '/');
    inspect_sb_printf(&title, " (%s)", base ? base + 1 : o->file);
    chart c;
    chart_init(&c, sr, o->n_tags, inspect_sb_str(&title), o->n_tags == 1 ? o->tags[0] : "value",
               inspect_sb_str(&note));
    FILE *f = fopen(o->out, "wb");
    if (!f) {
        fprintf(stderr, "dg-inspect: cannot write %s: %s\n", o->out, strerror(errno));
        goto out;
    }
    char why[256] = "";
    bool ok = inspect_has_ext(o->out, ".png") ? chart_write_png(f, &c, why, sizeof why) : chart_write_svg(f, &c);
    if (fclose(f) != 0) ok = false;
    if (!ok) {
        fprintf(stderr, "dg-inspect: writing %s failed%s%s\n", o->out, why[0] ? ": " : "", why);
        remove(o->out);
        goto out;
    }
    printf("wrote %s: %d tag%s, %d point%s, steps %.0f..%.0f, %dx%d px%s%s\n", o->out, o->n_tags,
           o->n_tags == 1 ? "" : "s", n_points, n_points == 1 ? "" : "s", x_lo, x_hi, CHART_W, CHART_H,
           c.note[0] ? "; " : "", c.note);
    rc = 0;
out:
    for (int k = 0; k < o->n_tags; k++) {
        free(sr[k].x);
        free(sr[k].y);
    }
    free(sr);
    free(title.s);
    free(note.s);
    free(skipped.s);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}
