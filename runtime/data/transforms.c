/* The synchronous transformations (distgraph/dataset.h): filter, shuffle, batch, padded batch,
 * repeat, shard, and the interleave of file sources (carried out by the file source itself,
 * sources.c). Each stage pulls from its input in the caller's thread; its state is what it
 * holds between two elements (a shuffle's buffer and random state, a repeat's pass, a shard's
 * count), followed by its input's. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base_impl.h"
#include "data_impl.h"

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A stage of one input and small parameters: the common part of the stages below.
typedef struct unary_iter {
    data_iter base;
    const dg_dataset *ds;
    data_iter *input;
} unary_iter;

static void *unary_new(size_t size, const data_iter_ops *ops, const dg_dataset *ds, data_ctx *ctx, int64_t epoch,
                       bool make_input, dg_status *st) {
    unary_iter *u = calloc(1, size);
    if (!u) {
        base_oom(st, ds->desc, size);
        return NULL;
    }
    u->base.ops = ops;
    u->base.ctx = ctx;
    u->ds = ds;
    if (make_input) {
        u->input = data_make_input(ds, ctx, epoch, st);
        if (!u->input) {
            free(u);
            return NULL;
        }
    }
    return u;
}

static void unary_free(data_iter *base) {
    data_iter_free(((unary_iter *)base)->input);
    free(base);
}

static bool input_save(data_iter *base, data_wr *w, dg_status *st) {
    unary_iter *u = (unary_iter *)base;
    return u->input->ops->save(u->input, w, st);
}
static bool input_restore(data_iter *base, data_rd *r, dg_status *st) {
    unary_iter *u = (unary_iter *)base;
    return u->input->ops->restore(u->input, r, st);
}

// A transformation's description over input (consumed also on failure); params freed with
// free() unless free_params.
static dg_dataset *transform(dg_dataset *input, void *params, void (*free_params)(dg_dataset *),
                             data_iter *(*make)(const dg_dataset *, data_ctx *, int64_t, dg_status *), dg_status *st,
                             const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void free_plain(dg_dataset *ds) { free(ds->params); }

static dg_dataset *transform(dg_dataset *input, void *params, void (*free_params)(dg_dataset *),
                             data_iter *(*make)(const dg_dataset *, data_ctx *, int64_t, dg_status *), dg_status *st,
                             const char *fmt, ...) {
    dg_dataset *ds = data_dataset_new(input, params, free_params ? free_params : free_plain, make, st);
    if (!ds) {
        free(params);
        return NULL;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ds->desc, sizeof ds->desc, fmt, ap);
    va_end(ap);
    return ds;
}

// The checks every transformation starts with: input present (else INVALID_ARGUMENT), params
// allocated (else RESOURCE_EXHAUSTED). On failure frees input and params.
static bool start(const char *what, dg_dataset **input, void *params, bool args_ok, const char *bad, dg_status *st) {
    dg_status_reset(st);
    if (!*input) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: input dataset is NULL", what);
    } else if (!args_ok) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: %s", what, bad);
    } else if (!params) {
        base_oom(st, what, 64);
    } else {
        return true;
    }
    dg_dataset_free(input);
    free(params);
    return false;
}

// ---- filter ----

typedef struct filter_params {
    dg_filter_fn fn;
    void *ctx;
} filter_params;

typedef struct filter_iter {
    unary_iter u;
    int64_t n_seen;   // input elements, for messages
} filter_iter;

static int filter_next(data_iter *base, dg_element *out, dg_status *st) {
    filter_iter *it = (filter_iter *)base;
    const filter_params *p = it->u.ds->params;
    for (;;) {
        int r = it->u.input->ops->next(it->u.input, out, st);
        if (r <= 0) return r;
        bool keep = false;
        int64_t k = it->n_seen++;
        if (!p->fn(p->ctx, out, &keep, st)) {
            if (dg_status_ok(st)) dg_status_set(st, DG_UNKNOWN, "the predicate failed without a message");
            dg_status_prepend(st, "filter (element %lld)", (long long)k);
            dg_element_clear(out);
            return -1;
        }
        if (keep) return 1;
        dg_element_clear(out);
    }
}
static bool filter_save(data_iter *base, data_wr *w, dg_status *st) {
    data_put_i64(w, ((filter_iter *)base)->n_seen);
    return input_save(base, w, st);
}
static bool filter_restore(data_iter *base, data_rd *r, dg_status *st) {
    return data_get_i64(r, &((filter_iter *)base)->n_seen, st) && input_restore(base, r, st);
}
static const data_iter_ops filter_ops = {filter_next, filter_save, filter_restore, unary_free};
static data_iter *filter_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    return unary_new(sizeof(filter_iter), &filter_ops, ds, ctx, epoch, true, st);
}

dg_dataset *dg_dataset_filter(dg_dataset *input, dg_filter_fn fn, void *ctx, dg_status *st) {
    filter_params *p = calloc(1, sizeof *p);
    if (!start("filter", &input, p, fn != NULL, "fn is NULL", st)) return NULL;
    p->fn = fn;
    p->ctx = ctx;
    return transform(input, p, NULL, filter_make, st, "filter");
}

// ---- shuffle ----

typedef struct shuffle_params {
    int64_t buffer_size;
    uint64_t seed;
} shuffle_params;

typedef struct shuffle_iter {
    unary_iter u;
    dg_element *buf;
    int n, cap;
    uint64_t rng;
    bool input_done;
} shuffle_iter;

static int shuffle_next(data_iter *base, dg_element *out, dg_status *st) {
    shuffle_iter *it = (shuffle_iter *)base;
    const shuffle_params *p = it->u.ds->params;
    while (!it->input_done && it->n < p->buffer_size) {
        if (!BASE_GROW(it->buf, it->n, it->cap, 1, "shuffle buffer", st)) return -1;
        it->buf[it->n].n = 0;
        int r = it->u.input->ops->next(it->u.input, &it->buf[it->n], st);
        if (r < 0) {
            dg_element_clear(&it->buf[it->n]);   // a part the input made before failing
            return -1;
        }
        if (r == 0) it->input_done = true;
        else it->n++;
    }
    if (it->n == 0) return 0;
    int j = (int)(splitmix64(&it->rng) % (uint64_t)it->n);
    *out = it->buf[j];
    it->buf[j] = it->buf[--it->n];
    return 1;
}
static bool shuffle_save(data_iter *base, data_wr *w, dg_status *st) {
    shuffle_iter *it = (shuffle_iter *)base;
    data_put_u64(w, it->rng);
    data_put_u64(w, it->input_done);
    data_put_u64(w, (uint64_t)it->n);
    for (int i = 0; i < it->n; i++)
        if (!data_put_element(w, &it->buf[i])) return data_wr_oom(w, "shuffle state", st);
    return input_save(base, w, st);
}
static bool shuffle_restore(data_iter *base, data_rd *r, dg_status *st) {
    shuffle_iter *it = (shuffle_iter *)base;
    const shuffle_params *p = it->u.ds->params;
    uint64_t done, n;
    if (!data_get_u64(r, &it->rng, st) || !data_get_u64(r, &done, st) || !data_get_u64(r, &n, st)) return false;
    if (n > (uint64_t)p->buffer_size) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: a shuffle buffer of %llu elements (size %lld)",
                       (unsigned long long)n, (long long)p->buffer_size);
        return false;
    }
    it->input_done = done != 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!BASE_GROW(it->buf, it->n, it->cap, 1, "shuffle buffer", st)) return false;
        it->buf[it->n].n = 0;
        if (!data_get_element(r, &it->buf[it->n], st)) return false;
        it->n++;
    }
    return input_restore(base, r, st);
}
static void shuffle_free(data_iter *base) {
    shuffle_iter *it = (shuffle_iter *)base;
    for (int i = 0; i < it->n; i++) dg_element_clear(&it->buf[i]);
    free(it->buf);
    unary_free(base);
}
static const data_iter_ops shuffle_ops = {shuffle_next, shuffle_save, shuffle_restore, shuffle_free};
static data_iter *shuffle_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    shuffle_iter *it = unary_new(sizeof *it, &shuffle_ops, ds, ctx, epoch, true, st);
    if (!it) return NULL;
    // The order is a function of (seed, epoch) alone: each pass of a repeat above reshuffles,
    // and every run with the same seed repeats it.
    const shuffle_params *p = ds->params;
    uint64_t x = p->seed;
    uint64_t e = (uint64_t)epoch ^ 0x5DEECE66Dull;
    it->rng = splitmix64(&x) ^ splitmix64(&e);
    return &it->u.base;
}

dg_dataset *dg_dataset_shuffle(dg_dataset *input, int64_t buffer_size, uint64_t seed, dg_status *st) {
    shuffle_params *p = calloc(1, sizeof *p);
    char bad[96];
    snprintf(bad, sizeof bad, "buffer_size %lld must be 1 to %d", (long long)buffer_size, INT32_MAX);
    if (!start("shuffle", &input, p, buffer_size >= 1 && buffer_size <= INT32_MAX, bad, st)) return NULL;
    p->buffer_size = buffer_size;
    p->seed = seed;
    return transform(input, p, NULL, shuffle_make, st, "shuffle(buffer %lld, seed %llu)", (long long)buffer_size,
                     (unsigned long long)seed);
}

// ---- batch and padded batch ----

typedef struct batch_params {
    int64_t batch_size;
    bool drop_remainder;
    bool padded;
    int n_shapes;                                    // padded_shapes given for n components
    int n_values;                                    // padding_values given for n components
    int64_t max_batch_bytes;                         // a padded batch's limit per component
    dg_shape shapes[DG_ELEMENT_MAX_COMPONENTS];
    double values[DG_ELEMENT_MAX_COMPONENTS];        // padding values (zeros when not given)
} batch_params;

typedef struct batch_iter {
    unary_iter u;
    bool input_done;
    dg_element *parts;   // batch_size elements being stacked
} batch_iter;

static void set_value(dg_dtype t, unsigned char *p, double v) {
    switch (t) {
    case DG_FLOAT32: { float f = (float)v; memcpy(p, &f, 4); break; }
    case DG_FLOAT64: memcpy(p, &v, 8); break;
    case DG_INT32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
    case DG_INT64: { int64_t i = (int64_t)v; memcpy(p, &i, 8); break; }
    case DG_UINT8: *p = (unsigned char)v; break;
    case DG_BOOL: *p = v != 0; break;
    case DG_BFLOAT16: { uint16_t h = dg_float_to_bfloat16((float)v); memcpy(p, &h, 2); break; }
    case DG_FLOAT16: { uint16_t h = dg_float_to_float16((float)v); memcpy(p, &h, 2); break; }
    default: memset(p, 0, dg_dtype_size(t)); break;
    }
}

// Copies src (shape s) into the top-left corner of dst (shape t, same rank, t >= s).
static void copy_padded(unsigned char *dst, const dg_shape *t, const unsigned char *src, const dg_shape *s, size_t esize) {
    int r = s->rank;
    if (r == 0) {
        memcpy(dst, src, esize);
        return;
    }
    int64_t rows = 1;
    for (int d = 0; d < r - 1; d++) rows *= s->dims[d];
    size_t row_bytes = (size_t)s->dims[r - 1] * esize;
    int64_t idx[DG_MAX_RANK] = {0};
    for (int64_t k = 0; k < rows; k++) {
        int64_t off = 0;
        for (int d = 0; d < r - 1; d++) off = off * t->dims[d] + idx[d];
        off *= t->dims[r - 1];
        if (row_bytes) memcpy(dst + (size_t)off * esize, src + (size_t)k * row_bytes, row_bytes);
        for (int d = r - 2; d >= 0; d--) {
            if (++idx[d] < s->dims[d]) break;
            idx[d] = 0;
        }
    }
}

static int batch_next(data_iter *base, dg_element *out, dg_status *st) {
    batch_iter *it = (batch_iter *)base;
    const batch_params *p = it->u.ds->params;
    int64_t k = 0;
    int ret = -1;
    while (!it->input_done && k < p->batch_size) {
        int r = it->u.input->ops->next(it->u.input, &it->parts[k], st);
        if (r < 0) {
            dg_element_clear(&it->parts[k]);   // a part the input made before failing
            goto done;
        }
        if (r == 0) it->input_done = true;
        else k++;
    }
    if (k == 0 || (k < p->batch_size && p->drop_remainder)) {
        ret = 0;
        goto done;
    }
    const dg_element *e0 = &it->parts[0];
    for (int c = 0; c < e0->n; c++) {
        const dg_tensor *t0 = e0->components[c];
        dg_dtype dt = dg_tensor_dtype(t0);
        dg_shape s0 = *dg_tensor_shape(t0);
        dg_shape target = s0;
        char a[96], b[96];
        if (s0.rank >= DG_MAX_RANK) {
            dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: component %d has rank %d; batching makes it %d, over %d",
                           it->u.ds->desc, c, s0.rank, s0.rank + 1, DG_MAX_RANK);
            goto done;
        }
        for (int64_t i = 1; i < k; i++) {
            const dg_element *e = &it->parts[i];
            const dg_shape *si = e->n == e0->n ? dg_tensor_shape(e->components[c]) : NULL;
            if (!si || dg_tensor_dtype(e->components[c]) != dt) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: element %lld of the batch differs from element 0 in its "
                               "number of components or component %d's dtype", it->u.ds->desc, (long long)i, c);
                goto done;
            }
            if (!p->padded ? !dg_shape_equal(si, &s0) : si->rank != s0.rank) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: component %d has shape %s in element 0 of the batch, %s in "
                               "element %lld%s", it->u.ds->desc, c, dg_shape_str(&s0, a, sizeof a),
                               dg_shape_str(si, b, sizeof b), (long long)i,
                               p->padded ? " (padding keeps the rank)" : " (padded batch pads them)");
                goto done;
            }
            for (int d = 0; d < si->rank; d++)
                if (si->dims[d] > target.dims[d]) target.dims[d] = si->dims[d];
        }
        if (p->padded && c < p->n_shapes) {
            const dg_shape *ps = &p->shapes[c];
            if (ps->rank != s0.rank) {
                dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: padded shape %s of component %d has another rank than its "
                               "elements' %s", it->u.ds->desc, dg_shape_str(ps, a, sizeof a), c,
                               dg_shape_str(&s0, b, sizeof b));
                goto done;
            }
            for (int d = 0; d < ps->rank; d++) {
                if (ps->dims[d] < 0) continue;
                if (target.dims[d] > ps->dims[d]) {
                    dg_status_setf(st, DG_INVALID_ARGUMENT, "%s: component %d has dimension %d of %lld in the batch, "
                                   "over its padded shape %s", it->u.ds->desc, c, d, (long long)target.dims[d],
                                   dg_shape_str(ps, a, sizeof a));
                    goto done;
                }
                target.dims[d] = ps->dims[d];
            }
        }
        int64_t dims[DG_MAX_RANK];
        dims[0] = k;
        for (int d = 0; d < target.rank; d++) dims[d + 1] = target.dims[d];
        if (p->padded) {
            // The padded size comes from the data (the largest element) or from the padded
            // shapes: checked before it is allocated.
            int64_t bytes = k;
            bool over = __builtin_mul_overflow(bytes, (int64_t)dg_dtype_size(dt), &bytes);
            for (int d = 0; d < target.rank && !over; d++) over = __builtin_mul_overflow(bytes, target.dims[d], &bytes);
            if (over || bytes > p->max_batch_bytes) {
                char nb[32];
                if (over) snprintf(nb, sizeof nb, "over 2^63");
                else snprintf(nb, sizeof nb, "%lld", (long long)bytes);
                dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s: component %d: a batch of %lld x %s %s is %s bytes, over "
                               "max_batch_bytes %lld", it->u.ds->desc, c, (long long)k,
                               dg_shape_str(&target, a, sizeof a), dg_dtype_name(dt), nb, (long long)p->max_batch_bytes);
                goto done;
            }
        }
        dg_tensor *t = dg_tensor_new(dt, dg_shape_make(target.rank + 1, dims), st);
        if (!t) goto done;
        out->components[out->n++] = t;
        unsigned char *dst = dg_tensor_data(t);
        size_t esize = dg_dtype_size(dt);
        size_t slot = (size_t)dg_shape_num_elements(&target) * esize;
        if (p->padded) {
            double v = c < p->n_values ? p->values[c] : 0.0;
            if (v == 0.0) {
                memset(dst, 0, slot * (size_t)k);
            } else {
                for (int64_t i = 0; i < dg_shape_num_elements(&target) * k; i++) set_value(dt, dst + (size_t)i * esize, v);
            }
            for (int64_t i = 0; i < k; i++) {
                const dg_tensor *src = it->parts[i].components[c];
                copy_padded(dst + (size_t)i * slot, &target, dg_tensor_data(src), dg_tensor_shape(src), esize);
            }
        } else {
            for (int64_t i = 0; i < k; i++) memcpy(dst + (size_t)i * slot, dg_tensor_data(it->parts[i].components[c]), slot);
        }
    }
    ret = 1;
done:
    if (ret < 0) dg_element_clear(out);
    for (int64_t i = 0; i < k; i++) dg_element_clear(&it->parts[i]);
    return ret;
}
static bool batch_save(data_iter *base, data_wr *w, dg_status *st) {
    data_put_u64(w, ((batch_iter *)base)->input_done);
    return input_save(base, w, st);
}
static bool batch_restore(data_iter *base, data_rd *r, dg_status *st) {
    uint64_t d;
    if (!data_get_u64(r, &d, st)) return false;
    ((batch_iter *)base)->input_done = d != 0;
    return input_restore(base, r, st);
}
static void batch_free(data_iter *base) {
    free(((batch_iter *)base)->parts);
    unary_free(base);
}
static const data_iter_ops batch_ops = {batch_next, batch_save, batch_restore, batch_free};
static data_iter *batch_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    const batch_params *p = ds->params;
    batch_iter *it = unary_new(sizeof *it, &batch_ops, ds, ctx, epoch, true, st);
    if (!it) return NULL;
    it->parts = calloc((size_t)p->batch_size, sizeof *it->parts);
    if (!it->parts) {
        unary_free(&it->u.base);
        base_oom(st, "batch", (size_t)p->batch_size * sizeof(dg_element));
        return NULL;
    }
    return &it->u.base;
}

#define MAX_BATCH ((int64_t)1 << 24)

dg_dataset *dg_dataset_batch(dg_dataset *input, int64_t batch_size, bool drop_remainder, dg_status *st) {
    batch_params *p = calloc(1, sizeof *p);
    char bad[96];
    snprintf(bad, sizeof bad, "batch_size %lld must be 1 to %lld", (long long)batch_size, (long long)MAX_BATCH);
    if (!start("batch", &input, p, batch_size >= 1 && batch_size <= MAX_BATCH, bad, st)) return NULL;
    p->batch_size = batch_size;
    p->drop_remainder = drop_remainder;
    return transform(input, p, NULL, batch_make, st, "batch(%lld%s)", (long long)batch_size,
                     drop_remainder ? ", drop remainder" : "");
}

#define DEFAULT_MAX_BATCH_BYTES ((int64_t)1 << 30)

dg_padded_batch_options dg_padded_batch_options_default(void) {
    return (dg_padded_batch_options){.max_batch_bytes = DEFAULT_MAX_BATCH_BYTES};
}

dg_dataset *dg_dataset_padded_batch(dg_dataset *input, int64_t batch_size, bool drop_remainder,
                                    const dg_shape *padded_shapes, const double *padding_values,
                                    int n_components, dg_status *st) {
    return dg_dataset_padded_batch_with_options(input, batch_size, drop_remainder, padded_shapes, padding_values,
                                                n_components, NULL, st);
}

dg_dataset *dg_dataset_padded_batch_with_options(dg_dataset *input, int64_t batch_size, bool drop_remainder,
                                                 const dg_shape *padded_shapes, const double *padding_values,
                                                 int n_components, const dg_padded_batch_options *opts,
                                                 dg_status *st) {
    dg_padded_batch_options o = opts ? *opts : dg_padded_batch_options_default();
    batch_params *p = calloc(1, sizeof *p);
    char bad[192];
    snprintf(bad, sizeof bad, "batch_size %lld (1 to %lld), %d components (0 to %d), max_batch_bytes %lld (>= 1)",
             (long long)batch_size, (long long)MAX_BATCH, n_components, DG_ELEMENT_MAX_COMPONENTS,
             (long long)o.max_batch_bytes);
    bool ok = batch_size >= 1 && batch_size <= MAX_BATCH && n_components >= 0 &&
              n_components <= DG_ELEMENT_MAX_COMPONENTS && (n_components == 0 || padded_shapes || padding_values) &&
              o.max_batch_bytes >= 1;
    for (int c = 0; ok && padded_shapes && c < n_components; c++)
        if (padded_shapes[c].rank < 0 || padded_shapes[c].rank >= DG_MAX_RANK) ok = false;
    if (!start("padded batch", &input, p, ok, bad, st)) return NULL;
    p->batch_size = batch_size;
    p->drop_remainder = drop_remainder;
    p->padded = true;
    p->max_batch_bytes = o.max_batch_bytes;
    // Without shapes every dimension pads to the batch's largest; without values, zeros.
    p->n_shapes = padded_shapes ? n_components : 0;
    p->n_values = padding_values ? n_components : 0;
    for (int c = 0; c < n_components; c++) {
        if (padded_shapes) p->shapes[c] = padded_shapes[c];
        if (padding_values) p->values[c] = padding_values[c];
    }
    char shapes[96] = "";
    for (int c = 0, k = 0; c < p->n_shapes && k < (int)sizeof shapes - 24; c++) {
        char b[48];
        k += snprintf(shapes + k, sizeof shapes - (size_t)k, " %s", dg_shape_str(&p->shapes[c], b, sizeof b));
    }
    return transform(input, p, NULL, batch_make, st, "padded batch(%lld%s;%s)", (long long)batch_size,
                     drop_remainder ? ", drop remainder" : "", shapes);
}

// ---- repeat ----

typedef struct repeat_iter {
    unary_iter u;
    int64_t parent_epoch;   // the pass of a repeat above this one
    int64_t epoch;          // this repeat's pass
    bool produced;          // the current pass gave an element
    bool done;
} repeat_iter;

// The epoch handed to the input: this repeat's pass, mixed with the passes of repeats above.
static int64_t child_epoch(const repeat_iter *it) {
    if (it->parent_epoch == 0) return it->epoch;
    uint64_t x = (uint64_t)it->parent_epoch * 0x9E3779B97F4A7C15ull + (uint64_t)it->epoch;
    return (int64_t)(splitmix64(&x) >> 1);
}

static int repeat_next(data_iter *base, dg_element *out, dg_status *st) {
    repeat_iter *it = (repeat_iter *)base;
    int64_t count = *(const int64_t *)it->u.ds->params;
    for (;;) {
        if (it->done || (count >= 0 && it->epoch >= count)) return 0;
        if (!it->u.input) {
            it->u.input = data_make_input(it->u.ds, it->u.base.ctx, child_epoch(it), st);
            if (!it->u.input) return -1;
        }
        int r = it->u.input->ops->next(it->u.input, out, st);
        if (r != 0) {
            if (r > 0) it->produced = true;
            return r;
        }
        data_iter_free(it->u.input);
        it->u.input = NULL;
        // A pass without elements would repeat forever without one.
        if (!it->produced) {
            it->done = true;
            return 0;
        }
        it->produced = false;
        it->epoch++;
    }
}
static bool repeat_save(data_iter *base, data_wr *w, dg_status *st) {
    repeat_iter *it = (repeat_iter *)base;
    data_put_i64(w, it->epoch);
    data_put_u64(w, (uint64_t)it->produced | (uint64_t)it->done << 1 | (uint64_t)(it->u.input != NULL) << 2);
    return !it->u.input || input_save(base, w, st);
}
static bool repeat_restore(data_iter *base, data_rd *r, dg_status *st) {
    repeat_iter *it = (repeat_iter *)base;
    uint64_t flags;
    if (!data_get_i64(r, &it->epoch, st) || !data_get_u64(r, &flags, st)) return false;
    if (it->epoch < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: repeat pass %lld", (long long)it->epoch);
        return false;
    }
    it->produced = flags & 1;
    it->done = flags & 2;
    if (!(flags & 4)) return true;
    it->u.input = data_make_input(it->u.ds, it->u.base.ctx, child_epoch(it), st);
    return it->u.input && input_restore(base, r, st);
}
static const data_iter_ops repeat_ops = {repeat_next, repeat_save, repeat_restore, unary_free};
static data_iter *repeat_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    repeat_iter *it = unary_new(sizeof *it, &repeat_ops, ds, ctx, epoch, false, st);
    if (it) it->parent_epoch = epoch;
    return it ? &it->u.base : NULL;
}

dg_dataset *dg_dataset_repeat(dg_dataset *input, int64_t count, dg_status *st) {
    int64_t *p = calloc(1, sizeof *p);
    char bad[64];
    snprintf(bad, sizeof bad, "count %lld must be >= 0, or -1 for forever", (long long)count);
    if (!start("repeat", &input, p, count >= -1, bad, st)) return NULL;
    *p = count;
    return transform(input, p, NULL, repeat_make, st, "repeat(%lld)", (long long)count);
}

// ---- shard ----

typedef struct shard_params {
    int64_t num_shards, index;
} shard_params;

typedef struct shard_iter {
    unary_iter u;
    int64_t n_seen;   // input elements read
} shard_iter;

static int shard_next(data_iter *base, dg_element *out, dg_status *st) {
    shard_iter *it = (shard_iter *)base;
    const shard_params *p = it->u.ds->params;
    for (;;) {
        int r = it->u.input->ops->next(it->u.input, out, st);
        if (r <= 0) return r;
        if (it->n_seen++ % p->num_shards == p->index) return 1;
        dg_element_clear(out);
    }
}
static bool shard_save(data_iter *base, data_wr *w, dg_status *st) {
    data_put_i64(w, ((shard_iter *)base)->n_seen);
    return input_save(base, w, st);
}
static bool shard_restore(data_iter *base, data_rd *r, dg_status *st) {
    shard_iter *it = (shard_iter *)base;
    if (!data_get_i64(r, &it->n_seen, st)) return false;
    if (it->n_seen < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "iterator state: shard count %lld", (long long)it->n_seen);
        return false;
    }
    return input_restore(base, r, st);
}
static const data_iter_ops shard_ops = {shard_next, shard_save, shard_restore, unary_free};
static data_iter *shard_make(const dg_dataset *ds, data_ctx *ctx, int64_t epoch, dg_status *st) {
    return unary_new(sizeof(shard_iter), &shard_ops, ds, ctx, epoch, true, st);
}

dg_dataset *dg_dataset_shard(dg_dataset *input, int64_t num_shards, int64_t index, dg_status *st) {
    shard_params *p = calloc(1, sizeof *p);
    char bad[96];
    snprintf(bad, sizeof bad, "num_shards %lld must be >= 1 and index %lld in [0, num_shards)", (long long)num_shards,
             (long long)index);
    if (!start("shard", &input, p, num_shards >= 1 && index >= 0 && index < num_shards, bad, st)) return NULL;
    p->num_shards = num_shards;
    p->index = index;
    return transform(input, p, NULL, shard_make, st, "shard(%lld of %lld)", (long long)index, (long long)num_shards);
}

// ---- interleave (of a file source) ----

dg_dataset *dg_dataset_interleave(dg_dataset *input, int cycle_length, int block_length, dg_status *st) {
    dg_status_reset(st);
    if (!input) {
        dg_status_set(st, DG_INVALID_ARGUMENT, "interleave: input dataset is NULL");
        return NULL;
    }
    if (!data_file_source_interleave(input, cycle_length, block_length, st)) {
        dg_dataset_free(&input);
        return NULL;
    }
    return input;
}
