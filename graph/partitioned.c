/* Partitioned variables: the public functions of distgraph/partitioned.h. The parts are made
 * by dg_get_variable, so they are variables like any other (collections, initializers,
 * device functions); the save-slice attributes are set on each VariableV2 right after it is
 * built, before anything reads the graph. The partitioners follow TensorFlow's
 * python/ops/partitioned_variables.py for axis 0. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/partitioned.h"
#include "graph_impl.h"

#define ATTR_FULL_NAME "_save_slice_full_name"
#define ATTR_FULL_SHAPE "_save_slice_full_shape"
#define ATTR_OFFSET "_save_slice_offset"

enum { KIND_FIXED = 1, KIND_MIN_MAX = 2 };

dg_partitioner dg_fixed_size_partitioner(int64_t num_shards) {
    dg_partitioner p = {KIND_FIXED, num_shards, 0, 0};
    return p;
}

dg_partitioner dg_min_max_variable_partitioner(int64_t max_partitions, int64_t min_slice_bytes) {
    dg_partitioner p = {KIND_MIN_MAX, 0, max_partitions, min_slice_bytes};
    return p;
}

int dg_partitioner_num_parts(dg_partitioner p, dg_dtype dtype, dg_shape shape, dg_status *st) {
    dg_status_reset(st);
    char sb[128];
    dg_shape_str(&shape, sb, sizeof sb);
    if (!dg_shape_is_fully_defined(&shape)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "the shape %s is not fully defined", sb);
        return -1;
    }
    if (shape.rank < 1) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "a partitioned variable needs rank 1 or more, the shape is %s", sb);
        return -1;
    }
    if (!dg_dtype_is_valid(dtype)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "invalid dtype %d", (int)dtype);
        return -1;
    }
    int64_t rows = shape.dims[0];
    if (p.kind == KIND_FIXED) {
        if (p.num_shards < 1 || p.num_shards > DG_MAX_PARTITIONS) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "fixed_size_partitioner(%" PRId64 "): num_shards must be 1 to %d",
                           p.num_shards, DG_MAX_PARTITIONS);
            return -1;
        }
        // TensorFlow: min(num_shards, rows), and zero partitions is an error.
        if (rows == 0) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "fixed_size_partitioner(%" PRId64 "): cannot split %s: it has 0 rows", p.num_shards, sb);
            return -1;
        }
        return (int)(p.num_shards < rows ? p.num_shards : rows);
    }
    if (p.kind == KIND_MIN_MAX) {
        if (p.max_partitions < 1 || p.min_slice_bytes < 1) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "min_max_variable_partitioner(%" PRId64 ", %" PRId64 "): max_partitions and "
                           "min_slice_bytes must be >= 1", p.max_partitions, p.min_slice_bytes);
            return -1;
        }
        // ceil(bytes / min_slice_bytes) in integers; a byte count beyond int64 only makes it
        // larger than the other two bounds.
        int64_t bytes = (int64_t)dg_dtype_size(dtype), wanted = INT64_MAX;
        bool overflow = false;
        for (int d = 0; d < shape.rank && !overflow; d++) {
            if (shape.dims[d] && bytes > INT64_MAX / shape.dims[d]) overflow = true;
            else bytes *= shape.dims[d];
        }
        if (!overflow) wanted = bytes / p.min_slice_bytes + (bytes % p.min_slice_bytes != 0);
        int64_t n = rows;
        if (p.max_partitions < n) n = p.max_partitions;
        if (wanted < n) n = wanted;
        if (n < 1) n = 1;
        if (n > DG_MAX_PARTITIONS) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "min_max_variable_partitioner(%" PRId64 ", %" PRId64 "): %s %s needs %" PRId64
                           " parts, more than DG_MAX_PARTITIONS (%d)", p.max_partitions, p.min_slice_bytes,
                           dg_dtype_name(dtype), sb, n, DG_MAX_PARTITIONS);
            return -1;
        }
        return (int)n;
    }
    dg_status_setf(st, DG_INVALID_ARGUMENT, "not a partitioner (kind %d): make one with dg_fixed_size_partitioner "
                   "or dg_min_max_variable_partitioner", p.kind);
    return -1;
}

// ---- initializers of the parts ----

// A seed for part i > 0 from the variable's seed: splitmix64 of both, positive and non-zero
// (0 would mean "draw one"), so parts of one variable differ and seeds of neighbouring
// variables (1, 2, ...) do not collide with each other's parts.
static int64_t part_seed(int64_t seed, int i) {
    if (i == 0) return seed;
    uint64_t z = (uint64_t)seed + 0x9E3779B97F4A7C15ull * (uint64_t)i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    z &= (uint64_t)INT64_MAX;
    return z ? (int64_t)z : 1;
}


// The initializer of part i (rows [row0, row0 + part.dims[0])). A DG_INIT_TENSOR part gets a
// new tensor of its rows in *owned (the caller unrefs it after building the part).
static bool part_initializer(const dg_partitioned_variable *pv, dg_initializer init, int i, dg_shape part,
                             int64_t row0, dg_initializer *out, dg_tensor **owned, dg_status *st) {
    *out = init;
    *owned = NULL;
    switch (init.kind) {
    case DG_INIT_RANDOM_UNIFORM:
    case DG_INIT_RANDOM_NORMAL:
    case DG_INIT_TRUNCATED_NORMAL:
        out->seed = init.seed ? part_seed(init.seed, i) : 0;
        return true;
    case DG_INIT_GLOROT_UNIFORM:
    case DG_INIT_GLOROT_NORMAL:
    case DG_INIT_HE_UNIFORM:
    case DG_INIT_HE_NORMAL: {
        // The scale comes from the whole variable (TensorFlow's partition_info.full_shape):
        // the parts draw from the distribution the unpartitioned variable would.
        double fan_in, fan_out;
        graph_compute_fans(pv->full_shape, &fan_in, &fan_out);
        bool he = init.kind == DG_INIT_HE_UNIFORM || init.kind == DG_INIT_HE_NORMAL;
        double scale = he ? 2.0 : 1.0, n = he ? fan_in : (fan_in + fan_out) / 2;
        if (n < 1) n = 1;
        int64_t seed = init.seed ? part_seed(init.seed, i) : 0;
        if (init.kind == DG_INIT_GLOROT_UNIFORM || init.kind == DG_INIT_HE_UNIFORM) {
            double limit = sqrt(3.0 * scale / n);
            *out = dg_init_random_uniform(-limit, limit, seed);
        } else {
            *out = dg_init_truncated_normal(0, sqrt(scale / n) / 0.87962566103423978, seed);
        }
        return true;
    }
    case DG_INIT_TENSOR: {
        const dg_tensor *v = init.value;
        char a[128], b[128];
        if (!v) {
            dg_status_set(st, DG_INVALID_ARGUMENT, "the DG_INIT_TENSOR initializer has no value");
            return false;
        }
        if (dg_tensor_dtype(v) != pv->dtype || !dg_shape_equal(dg_tensor_shape(v), &pv->full_shape)) {
            dg_status_setf(st, DG_INVALID_ARGUMENT,
                           "the initial value is %s %s, the variable %s %s (give the whole variable's value)",
                           dg_dtype_name(dg_tensor_dtype(v)), dg_shape_str(dg_tensor_shape(v), a, sizeof a),
                           dg_dtype_name(pv->dtype), dg_shape_str(&pv->full_shape, b, sizeof b));
            return false;
        }
        // Rows are contiguous in row-major order.
        size_t row_bytes = pv->full_shape.dims[0] ? dg_tensor_nbytes(v) / (size_t)pv->full_shape.dims[0] : 0;
        const unsigned char *src = dg_tensor_data(v);
        *owned = dg_tensor_from_data(pv->dtype, part, src ? src + (size_t)row0 * row_bytes : NULL, st);
        if (!*owned) return false;
        out->value = *owned;
        return true;
    }
    default:
        return true;   // constants fill any shape; an unknown kind fails in dg_get_variable
    }
}

// ---- building ----

static dg_partitioned_variable failed(dg_partitioned_variable pv) {
    memset(pv.parts, 0, sizeof pv.parts);
    memset(pv.offsets, 0, sizeof pv.offsets);
    pv.n = 0;
    return pv;
}

static void set_slice_attrs(dg_node *n, const char *full, dg_shape full_shape, int64_t row0) {
    int64_t off[DG_MAX_RANK] = {0};
    off[0] = row0;
    graph_set_attr_string(n, ATTR_FULL_NAME, full);
    graph_set_attr_shape(n, ATTR_FULL_SHAPE, full_shape);
    graph_set_attr_ints(n, ATTR_OFFSET, off, full_shape.rank);
}

// Reuse: the parts "full/part_<i>" must be there, n of them, slices of full with this shape
// and dtype, cut where this partitioner cuts.
static bool find_parts(dg_graph *g, const char *full, dg_partitioned_variable *pv) {
    char pname[600], a[128], b[128];
    int found = 0;
    for (;; found++) {
        snprintf(pname, sizeof pname, "%s/part_%d", full, found);
        if (!dg_graph_find(g, pname)) break;
    }
    if (found == 0) {
        dg_graph_set_error(g, DG_NOT_FOUND, "partitioned variable \"%s\": reuse is on, but \"%s\" is missing (the "
                           "variable was never made)", full, pname);
        return false;
    }
    if (found != pv->n) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "partitioned variable \"%s\": reuse with %d parts, but it has %d",
                           full, pv->n, found);
        return false;
    }
    for (int i = 0; i < pv->n; i++) {
        snprintf(pname, sizeof pname, "%s/part_%d", full, i);
        dg_node *v = dg_graph_find(g, pname);
        dg_status *st = dg_status_new();
        dg_variable_slice sl;
        int has = dg_variable_save_slice(v, &sl, st);
        dg_status_free(&st);
        if (has != 1 || strcmp(sl.full_name, full) != 0) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "partitioned variable \"%s\": reuse is on, but \"%s\" is not "
                               "a part of it", full, pname);
            return false;
        }
        dg_shape want = pv->full_shape;
        want.dims[0] = pv->offsets[i + 1] - pv->offsets[i];
        dg_shape got = dg_node_output_shape(v, 0);
        if (!dg_shape_equal(&sl.full_shape, &pv->full_shape) || dg_node_output_dtype(v, 0) != pv->dtype) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "partitioned variable \"%s\": is %s %s, asked for %s %s", full,
                               dg_dtype_name(dg_node_output_dtype(v, 0)), dg_shape_str(&sl.full_shape, a, sizeof a),
                               dg_dtype_name(pv->dtype), dg_shape_str(&pv->full_shape, b, sizeof b));
            return false;
        }
        if (sl.offset[0] != pv->offsets[i] || !dg_shape_equal(&got, &want)) {
            dg_graph_set_error(g, DG_INVALID_ARGUMENT, "partitioned variable \"%s\": part %d holds rows [%" PRId64
                               ", %" PRId64 ") instead of [%" PRId64 ", %" PRId64 ")",
                               full, i, sl.offset[0], sl.offset[0] + got.dims[0], pv->offsets[i], pv->offsets[i + 1]);
            return false;
        }
        pv->parts[i] = (dg_output){v, 0};
    }
    return true;
}

dg_partitioned_variable dg_partitioned_variable_new(dg_graph *g, const char *name, dg_dtype dtype,
                                                    dg_shape full_shape, dg_initializer init,
                                                    dg_partitioner p) {
    dg_partitioned_variable pv;
    memset(&pv, 0, sizeof pv);
    pv.full_shape = full_shape;
    pv.dtype = dtype;
    if (!g || !dg_graph_ok(g)) return pv;
    if (!name || !*name) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "partitioned variable: the name is empty");
        return pv;
    }
    bool reuse;
    const char *scope = graph_variable_scope(g, &reuse);
    char full[512];
    if (snprintf(full, sizeof full, "%s%s%s", scope, *scope ? "/" : "", name) >= (int)sizeof full - 32) {
        dg_graph_set_error(g, DG_INVALID_ARGUMENT, "partitioned variable \"%s\": the name is too long", name);
        return pv;
    }
    dg_status *st = dg_status_new();
    if (!st) abort();
    int n = dg_partitioner_num_parts(p, dtype, full_shape, st);
    if (n < 0) {
        dg_graph_set_error(g, dg_status_code(st), "partitioned variable \"%s\": %s", full, dg_status_message(st));
        dg_status_free(&st);
        return pv;
    }
    // TensorFlow's _iter_slices: the first rows % n parts take one row more.
    int64_t rows = full_shape.dims[0], base = rows / n, extra = rows % n;
    pv.n = n;
    pv.offsets[0] = 0;
    for (int i = 0; i < n; i++) pv.offsets[i + 1] = pv.offsets[i] + base + (i < extra);
    if (reuse) {
        dg_status_free(&st);
        return find_parts(g, full, &pv) ? pv : failed(pv);
    }
    dg_node *existing = dg_graph_find(g, full);
    char pname[600];
    snprintf(pname, sizeof pname, "%s/part_0", full);
    if (existing || dg_graph_find(g, pname)) {
        dg_graph_set_error(g, DG_ALREADY_EXISTS, "partitioned variable \"%s\": \"%s\" already exists; set reuse on "
                           "the variable scope to share it", full, existing ? full : pname);
        dg_status_free(&st);
        return failed(pv);
    }
    for (int i = 0; i < n; i++) {
        dg_shape part = full_shape;
        part.dims[0] = pv.offsets[i + 1] - pv.offsets[i];
        dg_initializer pinit;
        dg_tensor *owned = NULL;
        if (!part_initializer(&pv, init, i, part, pv.offsets[i], &pinit, &owned, st)) {
            dg_graph_set_error(g, dg_status_code(st), "partitioned variable \"%s\": %s", full, dg_status_message(st));
            dg_status_free(&st);
            return failed(pv);
        }
        snprintf(pname, sizeof pname, "%s/part_%d", name, i);
        dg_output v = dg_get_variable(g, pname, dtype, part, pinit);
        dg_tensor_unref(owned);
        if (!v.node) {
            dg_status_free(&st);
            return failed(pv);
        }
        set_slice_attrs(v.node, full, full_shape, pv.offsets[i]);
        pv.parts[i] = v;
    }
    dg_status_free(&st);
    return pv;
}

int dg_variable_save_slice(const dg_node *var, dg_variable_slice *out, dg_status *st) {
    dg_status_reset(st);
    if (!var || !out || strcmp(var->op->name, "VariableV2") != 0) return 0;
    const graph_attr *name_a = graph_node_attr(var, ATTR_FULL_NAME);
    const graph_attr *shape_a = graph_node_attr(var, ATTR_FULL_SHAPE);
    int n_off = 0;
    const int64_t *off = graph_node_attr_ints(var, ATTR_OFFSET, &n_off);
    if (!name_a && !shape_a && !off) return 0;
    dg_shape sh = var->n_outputs > 0 ? var->out_shapes[0] : dg_shape_unknown();
    const char *why = NULL;
    if (!name_a || name_a->kind != GA_STRING || !name_a->u.s || !*name_a->u.s) why = "no full name";
    else if (!shape_a || shape_a->kind != GA_SHAPE || !dg_shape_is_fully_defined(&shape_a->u.shape))
        why = "no fully defined full shape";
    else if (!off) why = "no offsets";
    else if (shape_a->u.shape.rank < 1 || shape_a->u.shape.rank != sh.rank || n_off != sh.rank)
        why = "the ranks of the full shape, the offsets and the variable differ";
    char a[128], b[128];
    for (int d = 0; !why && d < sh.rank; d++)
        if (off[d] < 0 || sh.dims[d] < 0 || off[d] > shape_a->u.shape.dims[d] - sh.dims[d])
            why = "the variable does not fit the full shape at its offset";
    if (why) {
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "variable \"%s\": bad save-slice attributes (%s): variable %s, full shape %s", var->name, why,
                       dg_shape_str(&sh, a, sizeof a),
                       shape_a && shape_a->kind == GA_SHAPE ? dg_shape_str(&shape_a->u.shape, b, sizeof b) : "none");
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->full_name = name_a->u.s;
    out->full_shape = shape_a->u.shape;
    for (int d = 0; d < sh.rank; d++) out->offset[d] = off[d];
    return 1;
}
