/* dg-inspect's commands on the checkpoints of a checkpoint file: checkpoints (step, when
 * written, variables, bytes) and variables (name, dtype, shape, bytes, where a slice lies in
 * its full variable, first values), all through the public checkpoint API
 * (distgraph/checkpoint.h). Nothing is written to the file. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inspect.h"

static void human_bytes(int64_t n, char *buf, size_t cap) {
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0) snprintf(buf, cap, "%lld B", (long long)n);
    else snprintf(buf, cap, "%.1f %s", v, unit[u]);
}

static int64_t var_bytes(const dg_checkpoint_var *v) {
    int64_t n = dg_shape_num_elements(&v->shape);
    return n < 0 ? 0 : n * (int64_t)dg_dtype_size(v->dtype);
}

static void json_shape(FILE *f, const dg_shape *s) {
    fputc('[', f);
    for (int d = 0; d < s->rank; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)s->dims[d]);
    fputc(']', f);
}

int inspect_cmd_checkpoints(const inspect_options *o) {
    dg_status *st = dg_status_new();
    dg_checkpoint_info *info = NULL;
    int64_t *n_bytes = NULL;
    int *n_vars = NULL;
    bool *gone = NULL;
    int rc = 1, n = -1;
    dg_checkpoint_store *s = inspect_open_checkpoint(o->file, st);
    if (!s) goto out;
    if ((n = dg_checkpoint_list_info(s, &info, st)) < 0) {
        inspect_die_status("listing checkpoints", st);
        goto out;
    }
    if (n == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": holds no checkpoints\n", o->file);
        goto out;
    }
    int64_t newest = dg_checkpoint_latest_step(s, st);
    if (!dg_status_ok(st)) {
        inspect_die_status("finding the newest checkpoint", st);
        goto out;
    }
    n_bytes = inspect_xcalloc((size_t)n, sizeof *n_bytes);
    n_vars = inspect_xcalloc((size_t)n, sizeof *n_vars);
    gone = inspect_xcalloc((size_t)n, sizeof *gone);
    int n_shown = 0;
    for (int i = 0; i < n; i++) {
        dg_checkpoint_var *vars = NULL;
        int k = dg_checkpoint_variables(s, info[i].step, &vars, st);
        if (k < 0 && dg_status_code(st) == DG_NOT_FOUND && info[i].step != newest) {
            gone[i] = true;   // pruned by a writer since the listing
            dg_status_set(st, DG_OK, "");
            continue;
        }
        if (k < 0) {
            inspect_die_status("reading the variables", st);
            goto out;
        }
        n_vars[i] = k;
        for (int j = 0; j < k; j++) n_bytes[i] += var_bytes(&vars[j]);
        free(vars);
        n_shown++;
    }
    if (o->json) {
        printf("{\"file\": ");
        inspect_json_str(stdout, o->file);
        printf(", \"newest_step\": %lld, \"checkpoints\": [", (long long)newest);
        int k = 0;
        for (int i = 0; i < n; i++) {
            if (gone[i]) continue;
            printf("%s\n  {\"step\": %lld, \"created_unix_ms\": %lld", k++ ? "," : "", (long long)info[i].step,
                   (long long)info[i].created_unix_ms);
            printf(", \"n_variables\": %d, \"n_bytes\": %lld, \"newest\": %s}", n_vars[i],
                   (long long)n_bytes[i], info[i].step == newest ? "true" : "false");
        }
        printf("\n]}\n");
        rc = 0;
        goto out;
    }
    enum { NC = 5 };
    static const char *const head[NC] = {"step", "written (UTC)", "variables", "bytes", ""};
    inspect_table t;
    inspect_table_init(&t, head, NC);
    for (int i = 0; i < n; i++) {
        if (gone[i]) continue;
        char **r = inspect_table_add(&t);
        char buf[96], hb[32];
        snprintf(buf, sizeof buf, "%lld", (long long)info[i].step);
        r[0] = inspect_xstrdup(buf);
        strcpy(buf, "-");
        time_t when = (time_t)(info[i].created_unix_ms / 1000);
        struct tm tmv;
        if (info[i].created_unix_ms >= 0 && gmtime_r(&when, &tmv))
            strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tmv);
        r[1] = inspect_xstrdup(buf);
        snprintf(buf, sizeof buf, "%d", n_vars[i]);
        r[2] = inspect_xstrdup(buf);
        human_bytes(n_bytes[i], hb, sizeof hb);
        snprintf(buf, sizeof buf, "%lld (%s)", (long long)n_bytes[i], hb);
        r[3] = inspect_xstrdup(buf);
        r[4] = inspect_xstrdup(info[i].step == newest ? "<- newest" : "");
    }
    inspect_table_print(&t, NC);
    inspect_table_free(&t);
    printf("%d checkpoint%s in %s, newest: step %lld\n", n_shown, n_shown == 1 ? "" : "s", o->file,
           (long long)newest);
    rc = 0;
out:
    free(gone);
    free(n_vars);
    free(n_bytes);
    free(info);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}

// Element i of t as text; JSON writes non-finite floats as null.
static void value_str(const dg_tensor *t, int64_t i, bool json, char *buf, size_t cap) {
    const void *d = dg_tensor_data(t);
    double v;
    switch (dg_tensor_dtype(t)) {
    case DG_FLOAT32: v = ((const float *)d)[i]; break;
    case DG_FLOAT64: v = ((const double *)d)[i]; break;
    case DG_INT32: snprintf(buf, cap, "%d", (int)((const int32_t *)d)[i]); return;
    case DG_UINT8: snprintf(buf, cap, "%u", (unsigned)((const uint8_t *)d)[i]); return;
    case DG_INT64: snprintf(buf, cap, "%lld", (long long)((const int64_t *)d)[i]); return;
    case DG_BOOL: snprintf(buf, cap, "%s", ((const uint8_t *)d)[i] ? "true" : "false"); return;
    default: v = dg_tensor_get_as_double(t, i); break;
    }
    if (json && !isfinite(v)) snprintf(buf, cap, "null");
    else if (json) snprintf(buf, cap, "%.*g", dg_tensor_dtype(t) == DG_FLOAT64 ? 17 : 9, v);
    else snprintf(buf, cap, "%g", v);
}

// The first k values of variable name of step, as a list; false (and a message) on error.
static bool first_values(dg_checkpoint_store *s, int64_t step, const char *name, int64_t k, bool json,
                         inspect_sbuf *b, dg_status *st) {
    dg_tensor *t = NULL;
    if (!dg_checkpoint_restore(s, step, &name, 1, &t, NULL, st)) return false;
    int64_t n = dg_tensor_num_elements(t), m = n < k ? n : k;
    inspect_sb_printf(b, "%s", json ? "[" : "");
    for (int64_t i = 0; i < m; i++) {
        char v[64];
        value_str(t, i, json, v, sizeof v);
        inspect_sb_printf(b, "%s%s", i ? ", " : "", v);
    }
    if (json) inspect_sb_printf(b, "]");
    else if (m < n) inspect_sb_printf(b, "%s... (%lld more)", m ? ", " : "", (long long)(n - m));
    else if (n == 0) inspect_sb_printf(b, "(empty)");
    dg_tensor_unref(t);
    return true;
}

int inspect_cmd_variables(const inspect_options *o) {
    dg_status *st = dg_status_new();
    dg_checkpoint_var *vars = NULL;
    dg_checkpoint_slice *slices = NULL;
    int64_t *steps = NULL;
    enum { NC = 6 };
    static const char *const head[NC] = {"name", "dtype", "shape", "step", "bytes", "values"};
    // With slices (parts of partitioned variables) in the checkpoint: where each lies.
    static const char *const head_sliced[NC + 1] = {"name", "dtype", "shape", "step", "bytes", "slice of", "values"};
    int nc = NC;
    inspect_table t;
    inspect_table_init(&t, head, NC);
    int rc = 1, n = 0;
    dg_checkpoint_store *s = inspect_open_checkpoint(o->file, st);
    if (!s) goto out;
    int n_ckpt = dg_checkpoint_list(s, &steps, st);
    if (n_ckpt < 0) {
        inspect_die_status("listing checkpoints", st);
        goto out;
    }
    if (n_ckpt == 0) {
        fprintf(stderr, "dg-inspect: \"%s\": holds no checkpoints\n", o->file);
        goto out;
    }
    int64_t newest = dg_checkpoint_latest_step(s, st);
    int64_t step = o->step >= 0 ? o->step : newest;
    bool have = false;
    for (int i = 0; i < n_ckpt; i++) have |= steps[i] == step;
    if (dg_status_ok(st) && !have) {
        // Name what is there, as the fix is to pick one of them.
        char list[256] = "";
        size_t used = 0;
        for (int i = 0; i < n_ckpt && used < sizeof list - 24; i++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%lld", i ? ", " : "", (long long)steps[i]);
        if (used >= sizeof list - 24 && n_ckpt > 0) snprintf(list + used, sizeof list - used, ", ...");
        fprintf(stderr, "dg-inspect: \"%s\" has no checkpoint of global step %lld; it holds step%s %s (--step N picks "
                        "one; without --step, the newest)\n", o->file, (long long)step, n_ckpt == 1 ? "" : "s", list);
        goto out;
    }
    if (!dg_status_ok(st) || (n = dg_checkpoint_variables_sliced(s, step, &vars, &slices, st)) < 0) {
        n = 0;
        inspect_die_status("reading the variables", st);
        goto out;
    }
    for (int i = 0; i < n && nc == NC; i++)
        if (slices[i].full_name) {
            inspect_table_free(&t);
            inspect_table_init(&t, head_sliced, NC + 1);
            nc = NC + 1;
        }
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += var_bytes(&vars[i]);
    if (o->json) {
        printf("{\"file\": ");
        inspect_json_str(stdout, o->file);
        printf(", \"step\": %lld, \"newest\": %s, \"n_bytes\": %lld, \"variables\": [", (long long)step,
               step == newest ? "true" : "false", (long long)total);
        for (int i = 0; i < n; i++) {
            printf("%s\n  {\"name\": ", i ? "," : "");
            inspect_json_str(stdout, vars[i].name);
            printf(", \"dtype\": \"%s\", \"shape\": ", dg_dtype_name(vars[i].dtype));
            json_shape(stdout, &vars[i].shape);
            printf(", \"step\": %lld, \"n_bytes\": %lld", (long long)step, (long long)var_bytes(&vars[i]));
            if (slices[i].full_name) {
                dg_shape off = dg_shape_make(vars[i].shape.rank, slices[i].offset);
                printf(", \"slice\": {\"full_name\": ");
                inspect_json_str(stdout, slices[i].full_name);
                printf(", \"full_shape\": ");
                json_shape(stdout, &slices[i].full_shape);
                printf(", \"offset\": ");
                json_shape(stdout, &off);
                printf("}");
            }
            if (o->n_values > 0) {
                inspect_sbuf b = {0};
                if (!first_values(s, step, vars[i].name, o->n_values, true, &b, st)) {
                    free(b.s);
                    printf("}\n");
                    inspect_die_status("reading values", st);
                    goto out;
                }
                printf(", \"values\": %s", inspect_sb_str(&b));
                free(b.s);
            }
            printf("}");
        }
        printf("%s]}\n", n ? "\n" : "");
        rc = 0;
        goto out;
    }
    for (int i = 0; i < n; i++) {
        char **r = inspect_table_add(&t);
        char buf[256];
        r[0] = inspect_xstrdup(vars[i].name);
        r[1] = inspect_xstrdup(dg_dtype_name(vars[i].dtype));
        r[2] = inspect_xstrdup(dg_shape_str(&vars[i].shape, buf, sizeof buf));
        snprintf(buf, sizeof buf, "%lld", (long long)step);
        r[3] = inspect_xstrdup(buf);
        snprintf(buf, sizeof buf, "%lld", (long long)var_bytes(&vars[i]));
        r[4] = inspect_xstrdup(buf);
        if (nc > NC) {
            buf[0] = '\0';
            if (slices[i].full_name) {
                char fs[128], os[128];
                dg_shape off = dg_shape_make(vars[i].shape.rank, slices[i].offset);
                snprintf(buf, sizeof buf, "%.100s %s at %s", slices[i].full_name,
                         dg_shape_str(&slices[i].full_shape, fs, sizeof fs), dg_shape_str(&off, os, sizeof os));
            }
            r[5] = inspect_xstrdup(buf);
        }
        inspect_sbuf b = {0};
        if (o->n_values > 0 && !first_values(s, step, vars[i].name, o->n_values, false, &b, st)) {
            free(b.s);
            inspect_die_status("reading values", st);
            goto out;
        }
        r[nc - 1] = inspect_xstrdup(inspect_sb_str(&b));
        free(b.s);
    }
    printf("checkpoint of step %lld%s in %s\n", (long long)step, step == newest ? " (newest)" : "", o->file);
    inspect_table_print(&t, o->n_values > 0 ? nc : nc - 1);
    char hb[32];
    human_bytes(total, hb, sizeof hb);
    printf("%d variable%s, %lld bytes (%s)\n", n, n == 1 ? "" : "s", (long long)total, hb);
    rc = 0;
out:
    inspect_table_free(&t);
    free(vars);
    free(slices);
    free(steps);
    dg_checkpoint_store_free(&s);
    dg_status_free(&st);
    return rc;
}
