/* dtypes, shapes and reference-counted tensors. */
#include "tensor_impl.h"
#include "tensor_cache_impl.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t dg_dtype_size(dg_dtype t) {
    switch (t) {
    case DG_FLOAT32: return 4;
    case DG_FLOAT64: return 8;
    case DG_INT32: return 4;
    case DG_UINT8: return 1;
    case DG_INT64: return 8;
    case DG_BOOL: return 1;
    case DG_BFLOAT16: return 2;
    case DG_FLOAT16: return 2;
    default: return 0;
    }
}

const char *dg_dtype_name(dg_dtype t) {
    switch (t) {
    case DG_FLOAT32: return "float32";
    case DG_FLOAT64: return "float64";
    case DG_INT32: return "int32";
    case DG_UINT8: return "uint8";
    case DG_INT64: return "int64";
    case DG_BOOL: return "bool";
    case DG_BFLOAT16: return "bfloat16";
    case DG_FLOAT16: return "float16";
    default: return "invalid";
    }
}

bool dg_dtype_is_valid(dg_dtype t) { return dg_dtype_size(t) != 0; }
bool dg_dtype_is_float(dg_dtype t) { return t == DG_FLOAT32 || t == DG_FLOAT64; }
bool dg_dtype_is_float16_family(dg_dtype t) { return t == DG_BFLOAT16 || t == DG_FLOAT16; }

uint16_t dg_float_to_bfloat16(float v) { return tensor_f32_to_bf16(v); }
float dg_bfloat16_to_float(uint16_t b) { return tensor_bf16_to_f32(b); }
uint16_t dg_float_to_float16(float v) { return tensor_f32_to_f16(v); }
float dg_float16_to_float(uint16_t h) { return tensor_f16_to_f32(h); }

dg_shape dg_shape_unknown(void) {
    dg_shape s;
    memset(&s, 0, sizeof s);
    s.rank = -1;
    return s;
}
dg_shape dg_shape_scalar(void) {
    dg_shape s;
    memset(&s, 0, sizeof s);
    return s;
}
dg_shape dg_shape_make(int n, const int64_t *dims) {
    if (n < 0 || n > DG_MAX_RANK) return dg_shape_unknown();
    dg_shape s = dg_shape_scalar();
    s.rank = n;
    for (int i = 0; i < n; i++) s.dims[i] = dims[i] < 0 ? -1 : dims[i];
    return s;
}
dg_shape dg_shape1(int64_t d0) { return dg_shape_make(1, &d0); }
dg_shape dg_shape2(int64_t d0, int64_t d1) {
    int64_t d[2] = {d0, d1};
    return dg_shape_make(2, d);
}
dg_shape dg_shape3(int64_t d0, int64_t d1, int64_t d2) {
    int64_t d[3] = {d0, d1, d2};
    return dg_shape_make(3, d);
}

bool dg_shape_is_fully_defined(const dg_shape *s) {
    if (s->rank < 0 || s->rank > DG_MAX_RANK) return false;
    for (int i = 0; i < s->rank; i++)
        if (s->dims[i] < 0) return false;
    return true;
}

int64_t tensor_shape_elements(const dg_shape *s) {
    if (!dg_shape_is_fully_defined(s)) return -1;
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++) {
        if (s->dims[i] != 0 && n > INT64_MAX / s->dims[i]) return -1;
        n *= s->dims[i];
    }
    return n;
}

int64_t dg_shape_num_elements(const dg_shape *s) { return tensor_shape_elements(s); }

bool dg_shape_equal(const dg_shape *a, const dg_shape *b) {
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

bool dg_shape_compatible(const dg_shape *a, const dg_shape *b) {
    if (a->rank < 0 || b->rank < 0) return true;
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] >= 0 && b->dims[i] >= 0 && a->dims[i] != b->dims[i]) return false;
    return true;
}

char *dg_shape_str(const dg_shape *s, char *buf, size_t cap) {
    if (!cap) return buf;
    if (s->rank < 0) {
        snprintf(buf, cap, "<unknown>");
        return buf;
    }
    size_t o = 0;
    buf[0] = 0;
    o += (size_t)snprintf(buf + o, cap - o, "[");
    for (int i = 0; i < s->rank && o < cap; i++) {
        if (s->dims[i] < 0)
            o += (size_t)snprintf(buf + o, cap - o, "%s?", i ? "," : "");
        else
            o += (size_t)snprintf(buf + o, cap - o, "%s%lld", i ? "," : "", (long long)s->dims[i]);
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

static dg_tensor *tensor_alloc_header(dg_dtype dtype, dg_shape shape, dg_status *st) {
    if (!dg_dtype_is_valid(dtype)) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "tensor: invalid dtype %d", (int)dtype);
        return NULL;
    }
    int64_t n = tensor_shape_elements(&shape);
    char sb[128];
    if (n < 0) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "tensor: shape %s is not fully defined or too large",
                       dg_shape_str(&shape, sb, sizeof sb));
        return NULL;
    }
    if ((uint64_t)n > SIZE_MAX / 16) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "tensor: %lld elements is too many", (long long)n);
        return NULL;
    }
    dg_tensor *t = calloc(1, sizeof *t);
    if (!t) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "tensor: out of memory for header");
        return NULL;
    }
    atomic_init(&t->refs, 1);
    t->dtype = dtype;
    t->shape = shape;
    t->n_elements = n;
    t->nbytes = (size_t)n * dg_dtype_size(dtype);
    return t;
}

// The bytes of live buffers dg_tensor_new made, and the most at once (dg_tensor_memory).
static _Atomic int64_t live_bytes, peak_bytes;

static size_t buffer_bytes(size_t nbytes) { return tensor_cache_bytes(nbytes); }

static void note_alloc(size_t bytes) {
    int64_t now = atomic_fetch_add_explicit(&live_bytes, (int64_t)bytes, memory_order_relaxed) + (int64_t)bytes;
    int64_t peak = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&peak_bytes, &peak, now, memory_order_relaxed, memory_order_relaxed)) {
    }
}

void dg_tensor_memory(int64_t *live, int64_t *peak) {
    if (live) *live = atomic_load_explicit(&live_bytes, memory_order_relaxed);
    if (peak) *peak = atomic_load_explicit(&peak_bytes, memory_order_relaxed);
}

void dg_tensor_memory_reset_peak(void) {
    atomic_store_explicit(&peak_bytes, atomic_load_explicit(&live_bytes, memory_order_relaxed), memory_order_relaxed);
}

dg_tensor *dg_tensor_new(dg_dtype dtype, dg_shape shape, dg_status *st) {
    dg_status_reset(st);
    dg_tensor *t = tensor_alloc_header(dtype, shape, st);
    if (!t) return NULL;
    size_t alloc = buffer_bytes(t->nbytes);
    t->data = tensor_cache_alloc(t->nbytes);
    if (!t->data) {
        char sb[128];
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "tensor: cannot allocate %zu bytes for %s %s",
                       t->nbytes, dg_dtype_name(dtype), dg_shape_str(&shape, sb, sizeof sb));
        free(t);
        return NULL;
    }
    t->owns_data = true;
    note_alloc(alloc);
    return t;
}

dg_tensor *dg_tensor_new_zeros(dg_dtype dtype, dg_shape shape, dg_status *st) {
    dg_status_reset(st);
    dg_tensor *t = dg_tensor_new(dtype, shape, st);
    if (t) memset(t->data, 0, t->nbytes);
    return t;
}

dg_tensor *dg_tensor_wrap(dg_dtype dtype, dg_shape shape, void *data, size_t n_bytes,
                          dg_deallocator dealloc, void *dealloc_arg, dg_status *st) {
    dg_status_reset(st);
    dg_tensor *t = tensor_alloc_header(dtype, shape, st);
    if (!t) return NULL;
    if (t->nbytes != n_bytes) {
        char sb[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT,
                       "tensor: %zu bytes given for %s %s, which needs %zu", n_bytes,
                       dg_dtype_name(dtype), dg_shape_str(&shape, sb, sizeof sb), t->nbytes);
        free(t);
        return NULL;
    }
    t->data = data;
    t->dealloc = dealloc;
    t->dealloc_arg = dealloc_arg;
    return t;
}

dg_tensor *dg_tensor_from_data(dg_dtype dtype, dg_shape shape, const void *data, dg_status *st) {
    dg_status_reset(st);
    dg_tensor *t = dg_tensor_new(dtype, shape, st);
    if (t && t->nbytes) memcpy(t->data, data, t->nbytes);
    return t;
}

static dg_tensor *scalar(dg_dtype dt, const void *v) {
    return dg_tensor_from_data(dt, dg_shape_scalar(), v, NULL);
}
dg_tensor *dg_tensor_scalar_f32(float v) { return scalar(DG_FLOAT32, &v); }
dg_tensor *dg_tensor_scalar_f64(double v) { return scalar(DG_FLOAT64, &v); }
dg_tensor *dg_tensor_scalar_i64(int64_t v) { return scalar(DG_INT64, &v); }

dg_tensor *dg_tensor_copy(const dg_tensor *t, dg_status *st) {
    dg_status_reset(st);
    if (!tensor_on_host(t)) {
        dg_status_setf(st, DG_INTERNAL, "tensor: a %s tensor in the memory of %s:%d cannot be "
                       "copied on the host (it should have been copied off the device first)",
                       dg_dtype_name(t->dtype), t->mem.type, t->mem.index);
        return NULL;
    }
    return dg_tensor_from_data(t->dtype, t->shape, t->data, st);
}

dg_tensor *tensor_view(dg_tensor *t, dg_shape shape, dg_status *st) {
    dg_tensor *v = tensor_alloc_header(t->dtype, shape, st);
    if (!v) return NULL;
    if (v->n_elements != t->n_elements) {
        char a[128], b[128];
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cannot view %s as %s: %lld vs %lld elements",
                       dg_shape_str(&t->shape, a, sizeof a), dg_shape_str(&shape, b, sizeof b),
                       (long long)t->n_elements, (long long)v->n_elements);
        free(v);
        return NULL;
    }
    v->data = t->data;
    v->mem = t->mem;
    v->base = dg_tensor_ref(t);
    return v;
}

bool tensor_is_exclusive(const dg_tensor *t) {
    return t->owns_data && !t->base && atomic_load_explicit(&t->refs, memory_order_acquire) == 1;
}

dg_tensor *dg_tensor_ref(dg_tensor *t) {
    if (t) atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
    return t;
}

void dg_tensor_unref(dg_tensor *t) {
    if (!t) return;
    if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) != 1) return;
    if (t->base)
        dg_tensor_unref(t->base);
    else if (t->owns_data) {
        tensor_cache_free(t->data, t->nbytes);
        atomic_fetch_sub_explicit(&live_bytes, (int64_t)buffer_bytes(t->nbytes), memory_order_relaxed);
    }
    else if (t->dealloc)
        t->dealloc(t->data, t->nbytes, t->dealloc_arg);
    free(t);
}

void dg_tensor_free(dg_tensor **t) {
    if (!t) return;
    dg_tensor_unref(*t);
    *t = NULL;
}

dg_dtype dg_tensor_dtype(const dg_tensor *t) { return t->dtype; }
const dg_shape *dg_tensor_shape(const dg_tensor *t) { return &t->shape; }
int dg_tensor_rank(const dg_tensor *t) { return t->shape.rank; }
int64_t dg_tensor_dim(const dg_tensor *t, int i) {
    return i >= 0 && i < t->shape.rank ? t->shape.dims[i] : -1;
}
int64_t dg_tensor_num_elements(const dg_tensor *t) { return t->n_elements; }
size_t dg_tensor_nbytes(const dg_tensor *t) { return t->nbytes; }
void *dg_tensor_data(const dg_tensor *t) { return t->data; }
float *dg_tensor_f32(const dg_tensor *t) { return t->dtype == DG_FLOAT32 ? t->data : NULL; }
double *dg_tensor_f64(const dg_tensor *t) { return t->dtype == DG_FLOAT64 ? t->data : NULL; }
int32_t *dg_tensor_i32(const dg_tensor *t) { return t->dtype == DG_INT32 ? t->data : NULL; }
int64_t *dg_tensor_i64(const dg_tensor *t) { return t->dtype == DG_INT64 ? t->data : NULL; }

double dg_tensor_get_as_double(const dg_tensor *t, int64_t i) {
    if (i < 0 || i >= t->n_elements) return 0;
    switch (t->dtype) {
    case DG_FLOAT32: return ((const float *)t->data)[i];
    case DG_FLOAT64: return ((const double *)t->data)[i];
    case DG_INT32: return ((const int32_t *)t->data)[i];
    case DG_UINT8: return ((const uint8_t *)t->data)[i];
    case DG_INT64: return (double)((const int64_t *)t->data)[i];
    case DG_BOOL: return ((const uint8_t *)t->data)[i] ? 1 : 0;
    case DG_BFLOAT16: return dg_bfloat16_to_float(((const uint16_t *)t->data)[i]);
    case DG_FLOAT16: return dg_float16_to_float(((const uint16_t *)t->data)[i]);
    default: return 0;
    }
}
