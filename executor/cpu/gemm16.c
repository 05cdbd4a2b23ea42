/* The CPU GEMM of the 16-bit floats: C = op(A) op(B) with A, B and C all bfloat16 or all
 * float16, row-major, sums kept in float32 and rounded once into C.
 *
 * bfloat16 goes to oneDNN's matmul primitive (DG_WITH_DNNL) where oneDNN has a kernel for it
 * on this CPU: AVX512_BF16's dot products of bfloat16 pairs (vdpbf16ps, twice the float32
 * multiply-adds per instruction), AMX's tiles, or on plain AVX-512 its conversions. Which one
 * it took is asked once, on a probe product, and said by dg-inspect cpu; when it would take a
 * reference (scalar) kernel, or for float16 (oneDNN 2.6 has float16 kernels only for
 * AVX512_FP16), under DG_GEMM=openblas and without oneDNN, the portable path: the operands converted to float32 in
 * blocks of rows, cpu_gemm's float32 product, C rounded back (to nearest, ties to even).
 *
 * A product of at least 2^21 multiply-adds is split, as cpu_gemm's, into bands of rows of C (of
 * columns when it has few rows) over the intra-op threads (cpu_parallel_for, gemm.c's pool).
 * Primitives are kept per thread for the last few shapes (a primitive's creation costs tens
 * of microseconds), each with its three memory objects, whose buffers are set at each call. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#ifdef DG_WITH_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

// ---- portable: through float32 ----

CPU_CLONES void cpu_f16s_to_f32(dg_dtype t, const uint16_t *s, float *d, int64_t n) {
    if (t == DG_BFLOAT16)
        for (int64_t i = 0; i < n; i++) d[i] = tensor_bf16_to_f32(s[i]);
    else
        for (int64_t i = 0; i < n; i++) d[i] = tensor_f16_to_f32(s[i]);
}

CPU_CLONES void cpu_f32_to_f16s(dg_dtype t, const float *s, uint16_t *d, int64_t n) {
    if (t == DG_BFLOAT16)
        for (int64_t i = 0; i < n; i++) d[i] = tensor_f32_to_bf16(s[i]);
    else
        for (int64_t i = 0; i < n; i++) d[i] = tensor_f32_to_f16(s[i]);
}

// An r x c matrix with leading dimension ld, as float32 with leading dimension c.
static float *widen(dg_dtype t, const uint16_t *m, int64_t r, int64_t c, int64_t ld) {
    float *w = malloc((size_t)(r * c + 1) * sizeof *w);
    if (!w) return NULL;
    for (int64_t i = 0; i < r; i++) cpu_f16s_to_f32(t, m + i * ld, w + i * c, c);
    return w;
}

static bool gemm16_portable(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A,
                            int64_t lda, const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc) {
    // A is M x K (K x M when transposed) as stored; B likewise.
    float *a = widen(t, A, ta ? K : M, ta ? M : K, lda), *b = widen(t, B, tb ? N : K, tb ? K : N, ldb);
    float *c = malloc((size_t)(M * N + 1) * sizeof *c);
    bool ok = a && b && c;
    if (ok) {
        cpu_gemm(DG_FLOAT32, ta, tb, M, N, K, 1.0, a, ta ? M : K, b, tb ? K : N, 0.0, c, N);
        for (int64_t i = 0; i < M; i++) cpu_f32_to_f16s(t, c + i * N, C + i * ldc, N);
    }
    free(a);
    free(b);
    free(c);
    return ok;
}

// ---- oneDNN's matmul ----

#ifdef DG_WITH_DNNL
static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void) {
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success) engine = NULL;
}

typedef struct mm_key {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
} mm_key;

typedef struct mm_entry {
    mm_key key;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
    uint64_t used;   // a clock of uses: the least recently used entry goes first
} mm_entry;

#define MM_CACHE 8
typedef struct mm_cache {
    mm_entry e[MM_CACHE];
    uint64_t clock;
    dnnl_stream_t stream;
} mm_cache;

static __thread mm_cache *thread_cache;
static pthread_key_t cache_key;
static pthread_once_t cache_key_once = PTHREAD_ONCE_INIT;

static void entry_clear(mm_entry *e) {
    if (e->prim) dnnl_primitive_destroy(e->prim);
    if (e->a) dnnl_memory_destroy(e->a);
    if (e->b) dnnl_memory_destroy(e->b);
    if (e->c) dnnl_memory_destroy(e->c);
    memset(e, 0, sizeof *e);
}

static void cache_free(void *p) {
    mm_cache *c = p;
    for (int i = 0; i < MM_CACHE; i++) entry_clear(&c->e[i]);
    if (c->stream) dnnl_stream_destroy(c->stream);
    free(c);
}

static void cache_key_init(void) { pthread_key_create(&cache_key, cache_free); }

// A row-major r x c matrix with leading dimension ld (read transposed when t).
static bool md_init(dnnl_memory_desc_t *md, int64_t r, int64_t c, int64_t ld, bool t) {
    dnnl_dims_t dims = {r, c}, strides = {t ? 1 : ld, t ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_bf16, strides) == dnnl_success;
}

// The primitive for k (made and kept when new), or NULL; *impl (may be NULL) gets its
// implementation's name.
static mm_entry *mm_get(const mm_key *k, const char **impl) {
    pthread_once(&engine_once, engine_init);
    if (!engine) return NULL;
    mm_cache *c = thread_cache;
    if (!c) {
        pthread_once(&cache_key_once, cache_key_init);
        c = calloc(1, sizeof *c);
        if (!c) return NULL;
        if (dnnl_stream_create(&c->stream, engine, dnnl_stream_default_flags) != dnnl_success) {
            free(c);
            return NULL;
        }
        thread_cache = c;
        pthread_setspecific(cache_key, c);
    }
    mm_entry *victim = &c->e[0];
    for (int i = 0; i < MM_CACHE; i++) {
        mm_entry *e = &c->e[i];
        if (e->prim && memcmp(&e->key, k, sizeof *k) == 0) {
            e->used = ++c->clock;
            if (impl) *impl = NULL;
            return e;
        }
        if (e->used < victim->used) victim = e;
    }
    entry_clear(victim);
    dnnl_memory_desc_t a, b, d;
    dnnl_matmul_desc_t desc;
    dnnl_primitive_desc_t pd = NULL;
    if (!md_init(&a, k->M, k->K, k->lda, k->ta) || !md_init(&b, k->K, k->N, k->ldb, k->tb) ||
        !md_init(&d, k->M, k->N, k->ldc, false) || dnnl_matmul_desc_init(&desc, &a, &b, NULL, &d) != dnnl_success ||
        dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL) != dnnl_success)
        return NULL;
    const char *name = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    if (impl) *impl = name;
    bool ok = dnnl_primitive_create(&victim->prim, pd) == dnnl_success &&
              dnnl_memory_create(&victim->a, &a, engine, DNNL_MEMORY_NONE) == dnnl_success &&
              dnnl_memory_create(&victim->b, &b, engine, DNNL_MEMORY_NONE) == dnnl_success &&
              dnnl_memory_create(&victim->c, &d, engine, DNNL_MEMORY_NONE) == dnnl_success;
    dnnl_primitive_desc_destroy(pd);
    if (!ok) {
        entry_clear(victim);
        return NULL;
    }
    victim->key = *k;
    victim->used = ++c->clock;
    return victim;
}

static bool gemm16_dnnl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                        const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc) {
    static __thread bool one_thread;
    if (!one_thread) {
        omp_set_num_threads(1);   // as gemm.c: our threads, not OpenMP's
        one_thread = true;
    }
    mm_key k = {ta, tb, M, N, K, lda, ldb, ldc};
    mm_entry *e = mm_get(&k, NULL);
    if (!e) return false;
    dnnl_memory_set_data_handle(e->a, (void *)A);
    dnnl_memory_set_data_handle(e->b, (void *)B);
    dnnl_memory_set_data_handle(e->c, C);
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->a}, {DNNL_ARG_WEIGHTS, e->b}, {DNNL_ARG_DST, e->c}};
    return dnnl_primitive_execute(e->prim, thread_cache->stream, 3, args) == dnnl_success &&
           dnnl_stream_wait(thread_cache->stream) == dnnl_success;
}
#endif

// ---- which path ----

static struct {
    bool dnnl_bf16;     // oneDNN has a kernel for bfloat16 here
    char bf16[80];      // what runs bfloat16, in words
} which;
static pthread_once_t which_once = PTHREAD_ONCE_INIT;

static void which_init(void) {
    snprintf(which.bf16, sizeof which.bf16, "through float32");
#ifdef DG_WITH_DNNL
    // oneDNN capped (DG_MAX_CPU_ISA) before its first primitive; DG_GEMM=openblas keeps it out.
    if (cpu_gemm_get_info()->f32_openblas) return;
    // A probe product's implementation: oneDNN names its reference kernels "ref:...".
    mm_key probe = {false, false, 64, 64, 64, 64, 64, 64};
    const char *impl = NULL;
    mm_entry *e = mm_get(&probe, &impl);
    if (e && impl && strncmp(impl, "ref", 3) != 0) {
        which.dnnl_bf16 = true;
        const dnnl_version_t *v = dnnl_version();
        snprintf(which.bf16, sizeof which.bf16, "oneDNN %d.%d.%d %s", v->major, v->minor, v->patch, impl);
    }
#endif
}

const char *cpu_gemm16_summary(dg_dtype t) {
    pthread_once(&which_once, which_init);
    return t == DG_BFLOAT16 ? which.bf16 : "through float32";
}

static bool gemm16_one(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda,
                       const uint16_t *B, int64_t ldb, uint16_t *C, int64_t ldc) {
#ifdef DG_WITH_DNNL
    if (t == DG_BFLOAT16 && which.dnnl_bf16 && gemm16_dnnl(ta, tb, M, N, K, A, lda, B, ldb, C, ldc)) return true;
#endif
    return gemm16_portable(t, ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
}

// ---- over the intra-op threads: bands of rows of C (of columns when it has few rows), as
// cpu_gemm splits ----

typedef struct gemm16_job {
    dg_dtype t;
    bool ta, tb, by_rows;
    int64_t M, N, K, lda, ldb, ldc;
    const uint16_t *A, *B;
    uint16_t *C;
    atomic_bool failed;
} gemm16_job;

static void gemm16_piece(void *ctx, int i, int n) {
    gemm16_job *j = ctx;
    int64_t lo, hi;
    cpu_piece_range(j->by_rows ? j->M : j->N, i, n, &lo, &hi);
    if (lo >= hi) return;
    bool ok;
    if (j->by_rows)
        ok = gemm16_one(j->t, j->ta, j->tb, hi - lo, j->N, j->K, j->A + (j->ta ? lo : lo * j->lda), j->lda, j->B,
                        j->ldb, j->C + lo * j->ldc, j->ldc);
    else
        ok = gemm16_one(j->t, j->ta, j->tb, j->M, hi - lo, j->K, j->A, j->lda, j->B + (j->tb ? lo * j->ldb : lo),
                        j->ldb, j->C + lo, j->ldc);
    if (!ok) atomic_store(&j->failed, true);
}

bool cpu_gemm16(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                const void *B, int64_t ldb, void *C, int64_t ldc) {
    if (M == 0 || N == 0) return true;
    if (K == 0) {
        for (int64_t i = 0; i < M; i++) memset((uint16_t *)C + i * ldc, 0, (size_t)N * sizeof(uint16_t));
        return true;
    }
    pthread_once(&which_once, which_init);
    int n = cpu_gemm_split_pieces(M, N, K);
    if (n > 1) {
        gemm16_job j = {t, ta, tb, cpu_gemm_split_by_rows(M, N, n), M, N, K, lda, ldb, ldc, A, B, C, false};
        if (cpu_parallel_for(n, gemm16_piece, &j)) return !atomic_load(&j.failed);
    }
    return gemm16_one(t, ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
}
