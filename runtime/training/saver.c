/* The saver (distgraph/monitored_session.h; TensorFlow's Saver): the graph's variables, the
 * ops that restore them, and saving and restoring them through a checkpoint store, whole or as
 * the slices of partitioned variables. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/monitored_session.h"
#include "distgraph/ops.h"
#include "distgraph/partitioned.h"
#include "base_impl.h"
#include "status_impl.h"
#include "training_impl.h"

typedef struct saver_blob_source {
    char name[256];
    dg_saver_blob_fn fn;
    training_blob_restore_fn restore;   // may be NULL: dg_saver_restore leaves the blob alone
    void *ctx;                    // borrowed
    void (*release)(void *ctx);   // called when the saver lets go of ctx; may be NULL
} saver_blob_source;

struct dg_saver {
    dg_graph *g;           // borrowed
    int n;
    dg_output *vars;       // VariableV2 outputs, in DG_GLOBAL_VARIABLES order
    dg_output *values;     // the placeholders fed on restore, one per variable
    dg_node *restore_all;  // NoOp after every restore Assign
    int global_step;       // index of the global step in vars, -1 if none
    dg_checkpoint_slice *slices;   // one per variable: its save-slice attributes (full_name
                                   // borrowed from the graph), full_name NULL when it has none
    bool has_slices;               // whether any variable is a slice (a partitioned variable's part)
    bool convert_dtypes;           // dg_saver_set_convert_dtypes
    saver_blob_source *blobs;      // dg_saver_add_blob, in the order added
    int n_blobs, cap_blobs;
};

bool training_saver_add_blob(dg_saver *sv, const char *name, dg_saver_blob_fn fn, training_blob_restore_fn restore,
                             void *ctx, void (*release)(void *ctx), dg_status *st) {
    dg_status_reset(st);
    size_t len = name ? strlen(name) : 0;
    if (!sv || !fn || len < 1 || len > 255) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "saver add blob: NULL saver or function, or a name of %zu bytes "
                       "(1 to 255)", len);
        return false;
    }
    for (int i = 0; i < sv->n_blobs; i++)
        if (strcmp(sv->blobs[i].name, name) == 0) {
            dg_status_setf(st, DG_ALREADY_EXISTS, "saver add blob: \"%s\" is added already", name);
            return false;
        }
    saver_blob_source b = {.fn = fn, .restore = restore, .ctx = ctx, .release = release};
    memcpy(b.name, name, len + 1);
    BASE_PUSH(sv->blobs, sv->n_blobs, sv->cap_blobs, b);
    return true;
}

bool dg_saver_add_blob(dg_saver *sv, const char *name, dg_saver_blob_fn fn, void *ctx, dg_status *st) {
    return training_saver_add_blob(sv, name, fn, NULL, ctx, NULL, st);
}

bool dg_saver_remove_blob(dg_saver *sv, const char *name, dg_status *st) {
    dg_status_reset(st);
    if (!sv || !name) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "saver remove blob: NULL saver or name");
        return false;
    }
    for (int i = 0; i < sv->n_blobs; i++) {
        if (strcmp(sv->blobs[i].name, name) != 0) continue;
        saver_blob_source b = sv->blobs[i];
        // Kept in the order added: saves call the sources in that order.
        memmove(&sv->blobs[i], &sv->blobs[i + 1], (size_t)(sv->n_blobs - i - 1) * sizeof *sv->blobs);
        sv->n_blobs--;
        if (b.release) b.release(b.ctx);
        return true;
    }
    dg_status_setf(st, DG_NOT_FOUND, "saver remove blob: no blob \"%s\" is added", name);
    return false;
}

void dg_saver_set_convert_dtypes(dg_saver *sv, bool convert) {
    if (sv) sv->convert_dtypes = convert;
}

static bool float_dtype(dg_dtype t) { return dg_dtype_is_float(t) || dg_dtype_is_float16_family(t); }

// dst (a float dtype) = src (another float dtype, as many elements), as Cast converts: through
// float32 into a 16-bit float, rounding to nearest, ties to even.
static void convert_floats(const dg_tensor *src, dg_tensor *dst) {
    void *d = dg_tensor_data(dst);
    for (int64_t i = 0; i < dg_tensor_num_elements(dst); i++) {
        double v = dg_tensor_get_as_double(src, i);
        switch (dg_tensor_dtype(dst)) {
        case DG_FLOAT32: ((float *)d)[i] = (float)v; break;
        case DG_FLOAT64: ((double *)d)[i] = v; break;
        case DG_BFLOAT16: ((uint16_t *)d)[i] = dg_float_to_bfloat16((float)v); break;
        default: ((uint16_t *)d)[i] = dg_float_to_float16((float)v); break;
        }
    }
}

dg_saver *dg_saver_new(dg_graph *g, dg_status *st) {
    dg_status_reset(st);
    if (!g) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "saver: graph is NULL");
        return NULL;
    }
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "saver: the graph has an error from building it");
        return NULL;
    }
    int n = dg_graph_collection_size(g, DG_GLOBAL_VARIABLES);
    if (n == 0) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "saver: the graph has no variables (DG_GLOBAL_VARIABLES "
                      "is empty)");
        return NULL;
    }
    dg_saver *sv = calloc(1, sizeof *sv);
    dg_node **assigns = calloc((size_t)n, sizeof *assigns);
    if (sv) {
        sv->vars = calloc((size_t)n, sizeof *sv->vars);
        sv->values = calloc((size_t)n, sizeof *sv->values);
        sv->slices = calloc((size_t)n, sizeof *sv->slices);
    }
    if (!sv || !assigns || !sv->vars || !sv->values || !sv->slices) {
        free(assigns);
        dg_saver_free(&sv);
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "saver: out of memory for %d variables", n);
        return NULL;
    }
    sv->g = g;
    sv->n = n;
    sv->global_step = -1;
    dg_node *gs = dg_graph_collection_size(g, DG_GLOBAL_STEP) ? dg_graph_collection_get(g, DG_GLOBAL_STEP, 0)
                                                              : NULL;
    // Slice attributes first: a malformed one fails before the graph gets any save op.
    for (int i = 0; i < n; i++) {
        dg_variable_slice vs;
        int has = dg_variable_save_slice(dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, i), &vs, st);
        if (has < 0) {
            free(assigns);
            dg_saver_free(&sv);
            dg_status_prepend(st, "saver");
            return NULL;
        }
        if (has) {
            sv->slices[i].full_name = vs.full_name;
            sv->slices[i].full_shape = vs.full_shape;
            memcpy(sv->slices[i].offset, vs.offset, sizeof vs.offset);
            sv->has_slices = true;
        }
    }
    dg_graph_push_name_scope(g, "save");
    for (int i = 0; i < n; i++) {
        dg_node *v = dg_graph_collection_get(g, DG_GLOBAL_VARIABLES, i);
        sv->vars[i] = (dg_output){v, 0};
        if (v == gs) sv->global_step = i;
        char *pname = NULL, *aname = NULL;
        if (asprintf(&pname, "restore_%s/value", dg_node_name(v)) < 0 ||
            asprintf(&aname, "restore_%s", dg_node_name(v)) < 0)
            abort();
        // The fed value enters at the client and crosses to the variable's task once.
        dg_graph_push_colocate_with(g, v);
        sv->values[i] = dg_placeholder(g, pname, dg_node_output_dtype(v, 0), dg_node_output_shape(v, 0));
        assigns[i] = dg_assign(g, aname, sv->vars[i], sv->values[i]).node;
        dg_graph_pop_colocate_with(g);
        free(pname);
        free(aname);
    }
    sv->restore_all = dg_group(g, "restore_all", assigns, n);
    dg_graph_pop_name_scope(g);
    free(assigns);
    if (!dg_graph_check(g, st)) {
        dg_status_prepend(st, "saver: building the restore ops");
        dg_saver_free(&sv);
        return NULL;
    }
    return sv;
}

void dg_saver_free(dg_saver **svp) {
    if (!svp || !*svp) return;
    dg_saver *sv = *svp;
    free(sv->vars);
    free(sv->values);
    free(sv->slices);
    for (int i = 0; i < sv->n_blobs; i++)
        if (sv->blobs[i].release) sv->blobs[i].release(sv->blobs[i].ctx);
    free(sv->blobs);
    free(sv);
    *svp = NULL;
}

int dg_saver_num_variables(const dg_saver *sv) { return sv ? sv->n : 0; }

const char *dg_saver_variable_name(const dg_saver *sv, int i) {
    return sv && i >= 0 && i < sv->n ? dg_node_name(sv->vars[i].node) : NULL;
}

static const char **saver_names(const dg_saver *sv) {
    const char **names = malloc((size_t)sv->n * sizeof *names);
    if (!names) abort();
    for (int i = 0; i < sv->n; i++) names[i] = dg_node_name(sv->vars[i].node);
    return names;
}

bool dg_saver_save(dg_saver *sv, dg_session *sess, dg_checkpoint_store *store, int64_t step,
                   int max_to_keep, int64_t *saved_step, dg_status *st) {
    dg_status_reset(st);
    if (!sv || !sess || !store) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "saver save: saver, session or store is NULL");
        return false;
    }
    if (step < 0 && sv->global_step < 0) {
        dg_status_set(st, DG_FAILED_PRECONDITION, "saver save: no step given and the graph has no global step "
                      "(create it with dg_global_step)");
        return false;
    }
    dg_tensor **vals = calloc((size_t)sv->n, sizeof *vals);
    const char **names = saver_names(sv);
    dg_checkpoint_blob *blobs = calloc((size_t)(sv->n_blobs ? sv->n_blobs : 1), sizeof *blobs);
    if (!vals || !blobs) abort();
    bool ok = dg_session_run(sess, NULL, NULL, 0, sv->vars, vals, sv->n, NULL, 0, st);
    if (!ok) dg_status_prepend(st, "saver save: fetching the variables");
    for (int i = 0; ok && i < sv->n_blobs; i++) {
        unsigned char *bytes = NULL;
        blobs[i].name = sv->blobs[i].name;
        ok = sv->blobs[i].fn(sv->blobs[i].ctx, &bytes, &blobs[i].n_bytes, st);
        blobs[i].data = bytes;
        if (!ok) dg_status_prepend(st, "saver save: blob \"%s\"", sv->blobs[i].name);
    }
    if (ok) {
        if (step < 0) step = dg_tensor_i64(vals[sv->global_step])[0];
        // Parts of partitioned variables go in as slices of their full variables; the blobs
        // go in the same transaction.
        ok = dg_checkpoint_save_with_blobs(store, step, names, vals, sv->has_slices ? sv->slices : NULL, sv->n, blobs,
                                           sv->n_blobs, max_to_keep, st);
        if (ok && saved_step) *saved_step = step;
        if (!ok) dg_status_prepend(st, "saver save: checkpoint of step %lld", (long long)step);
    }
    for (int i = 0; i < sv->n; i++) dg_tensor_unref(vals[i]);
    for (int i = 0; i < sv->n_blobs; i++) free((void *)blobs[i].data);
    free(blobs);
    free(vals);
    free(names);
    return ok;
}

// Whether checkpoint entry k holds part of the full variable full_name: a slice of it, or it
// saved whole.
static bool holds_part_of(const dg_checkpoint_var *cv, const dg_checkpoint_slice *cs, int k, const char *full_name) {
    return cs[k].full_name ? strcmp(cs[k].full_name, full_name) == 0 : strcmp(cv[k].name, full_name) == 0;
}

// Plans the restore into req (one entry per saver variable): req[i].full_name NULL reads the
// tensor of the variable's name; otherwise the region req[i] of a full variable, assembled
// from whatever of it the checkpoint holds. That is a part of a partitioned variable (its
// slice attributes), or a whole variable the checkpoint holds only as slices (TensorFlow
// restores a variable whatever partitioning it was saved with). The checkpoint must hold
// exactly the saver's variables: every difference is named. The dtypes, shapes and rows of
// slices are checked by the store, whose errors name the file.
static bool plan_restore(const dg_saver *sv, const dg_checkpoint_var *cv, const dg_checkpoint_slice *cs, int n_cv,
                         int64_t step, dg_checkpoint_slice *req, dg_dtype *load, dg_status *st) {
    strbuf missing = {0}, extra = {0}, differ = {0};
    int n_missing = 0, n_extra = 0, n_differ = 0;
    char a[128], b[128];
    bool *used = calloc((size_t)(n_cv ? n_cv : 1), sizeof *used);
    if (!used) abort();
    for (int i = 0; i < sv->n; i++) {
        const char *name = dg_node_name(sv->vars[i].node);
        dg_dtype dt = dg_output_dtype(sv->vars[i]);
        dg_shape sh = dg_output_shape(sv->vars[i]);
        req[i] = sv->slices[i];
        load[i] = dt;
        if (!req[i].full_name) {
            int found = -1;
            for (int k = 0; k < n_cv && found < 0; k++)
                if (strcmp(cv[k].name, name) == 0) found = k;
            if (found >= 0) {
                used[found] = true;
                // Another float dtype, converted on restore when the saver is asked to.
                if (sv->convert_dtypes && cv[found].dtype != dt && float_dtype(cv[found].dtype) && float_dtype(dt) &&
                    dg_shape_equal(&cv[found].shape, &sh)) {
                    load[i] = cv[found].dtype;
                    continue;
                }
                if (cv[found].dtype != dt || !dg_shape_equal(&cv[found].shape, &sh))
                    sb_addf(&differ, "%s%s (graph %s %s, checkpoint %s %s)", n_differ++ ? ", " : "", name,
                            dg_dtype_name(dt), dg_shape_str(&sh, a, sizeof a), dg_dtype_name(cv[found].dtype),
                            dg_shape_str(&cv[found].shape, b, sizeof b));
                continue;
            }
            bool as_slices = false;
            for (int k = 0; k < n_cv && !as_slices; k++)
                as_slices = cs[k].full_name && strcmp(cs[k].full_name, name) == 0;
            if (!as_slices || sh.rank < 1) {
                sb_addf(&missing, "%s%s", n_missing++ ? ", " : "", name);
                continue;
            }
            req[i].full_name = name;
            req[i].full_shape = sh;
            memset(req[i].offset, 0, sizeof req[i].offset);
        }
        bool any = false;
        dg_dtype saved = dt;
        for (int k = 0; k < n_cv; k++)
            if (holds_part_of(cv, cs, k, req[i].full_name)) {
                used[k] = any = true;
                saved = cv[k].dtype;
            }
        if (!any) sb_addf(&missing, "%s%s (a slice of %s)", n_missing++ ? ", " : "", name, req[i].full_name);
        // Saved in another float dtype: read in it and converted, when the saver is asked to
        // (parts that disagree on their dtype are refused by the store).
        if (any && sv->convert_dtypes && saved != dt && float_dtype(saved) && float_dtype(dt)) load[i] = saved;
    }
    for (int k = 0; k < n_cv; k++)
        if (!used[k]) sb_addf(&extra, "%s%s", n_extra++ ? ", " : "", cv[k].name);
    free(used);
    bool ok = n_missing + n_extra + n_differ == 0;
    if (!ok) {
        strbuf msg = {0};
        sb_addf(&msg, "the checkpoint of step %lld does not match the graph's variables", (long long)step);
        if (n_missing) sb_addf(&msg, "; missing from the checkpoint: %s", sb_str(&missing));
        if (n_extra) sb_addf(&msg, "; in the checkpoint but not in the graph: %s", sb_str(&extra));
        if (n_differ)
            sb_addf(&msg, "; of another dtype or shape: %s%s", sb_str(&differ),
                    sv->convert_dtypes ? "" : " (dg_saver_set_convert_dtypes converts between float dtypes)");
        dg_status_set(st, DG_INVALID_ARGUMENT, sb_str(&msg));
        free(msg.p);
    }
    free(missing.p);
    free(extra.p);
    free(differ.p);
    return ok;
}

// Gives each blob source that restores (an iterator) its blob of the checkpoint of step, or
// NULL when the checkpoint has none.
static bool restore_blobs(dg_saver *sv, dg_checkpoint_store *store, int64_t step, dg_status *st) {
    for (int i = 0; i < sv->n_blobs; i++) {
        const saver_blob_source *b = &sv->blobs[i];
        if (!b->restore) continue;
        void *bytes = NULL;
        size_t n = 0;
        bool ok = dg_checkpoint_read_blob(store, step, b->name, &bytes, &n, NULL, st);
        // A checkpoint without the blob (saved before it was added) is an answer; a checkpoint
        // gone since the variables were read (pruned by another process) is not.
        if (!ok && dg_status_code(st) == DG_NOT_FOUND && strstr(dg_status_message(st), "holds no blob")) {
            dg_status_reset(st);
            ok = true;
        }
        ok = ok && b->restore(b->ctx, bytes, n, st);
        free(bytes);
        if (!ok) {
            dg_status_prepend(st, "saver restore: blob \"%s\" of the checkpoint of step %lld", b->name, (long long)step);
            return false;
        }
    }
    return true;
}

bool dg_saver_restore(dg_saver *sv, dg_session *sess, dg_checkpoint_store *store, int64_t step,
                      int64_t *restored_step, dg_status *st) {
    dg_status_reset(st);
    if (!sv || !sess || !store) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "saver restore: saver, session or store is NULL");
        return false;
    }
    if (step < 0) {
        // A fixed step from here on: a save by another process must not slip in between.
        step = dg_checkpoint_latest_step(store, st);
        if (step < 0) {
            if (dg_status_ok(st)) dg_status_set(st, DG_NOT_FOUND, "saver restore: there is no checkpoint");
            return false;
        }
    }
    dg_checkpoint_var *cv = NULL;
    dg_checkpoint_slice *cs = NULL;
    int n_cv = dg_checkpoint_variables_sliced(store, step, &cv, &cs, st);
    if (n_cv < 0) return false;
    dg_checkpoint_slice *req = calloc((size_t)sv->n, sizeof *req);
    dg_tensor **vals = calloc((size_t)sv->n, sizeof *vals);
    dg_dtype *load = calloc((size_t)sv->n + 1, sizeof *load);   // the dtype each is read in
    if (!req || !vals || !load) abort();
    // req's full names point into the graph, never into cs.
    bool ok = plan_restore(sv, cv, cs, n_cv, step, req, load, st);
    free(cv);
    free(cs);
    const char **names = saver_names(sv);
    for (int i = 0; ok && i < sv->n; i++) {
        vals[i] = dg_tensor_new(load[i], dg_output_shape(sv->vars[i]), st);
        if (!vals[i]) {
            dg_status_prepend(st, "saver restore: variable \"%s\"", names[i]);
            ok = false;
        }
    }
    int64_t got = step;
    if (ok) ok = dg_checkpoint_restore_slices(store, step, names, req, vals, sv->n, &got, st);
    for (int i = 0; ok && i < sv->n; i++) {
        if (load[i] == dg_output_dtype(sv->vars[i])) continue;
        dg_tensor *t = dg_tensor_new(dg_output_dtype(sv->vars[i]), dg_output_shape(sv->vars[i]), st);
        if (!t) {
            dg_status_prepend(st, "saver restore: variable \"%s\"", names[i]);
            ok = false;
            break;
        }
        convert_floats(vals[i], t);
        dg_tensor_unref(vals[i]);
        vals[i] = t;
    }
    if (ok) {
        ok = dg_session_run(sess, sv->values, vals, sv->n, NULL, NULL, 0, &sv->restore_all, 1, st);
        if (!ok) dg_status_prepend(st, "assigning the checkpoint of step %lld", (long long)got);
    }
    ok = ok && restore_blobs(sv, store, got, st);
    if (ok && restored_step) *restored_step = got;
    for (int i = 0; i < sv->n; i++) dg_tensor_unref(vals[i]);
    free(vals);
    free(req);
    free(load);
    free(names);
    return ok;
}


dg_output training_saver_variable(const dg_saver *sv, int i) { return sv->vars[i]; }
