/* float32 products C = op(A) B whose left operand is mostly zero, visiting only its nonzero
 * entries: an MLP's first layer on images (Fashion-MNIST's pixels are half zeros: its
 * forward product X W and its weight gradient X^T dY), or a layer behind a ReLU.
 *
 * Each row of C is built from the list of the nonzero entries of its row of op(A): for C = A^T
 * B, A is first turned round into scratch. An entry adds its value times B's row k to the
 * row's sums, held in up to 8 16-float vectors (GCC's vector extension: one AVX-512 register,
 * two AVX2 ones). Each entry loads as many vectors of B as it does multiply-adds, so B must
 * come from L1: it is copied, aligned, in chunks of rows and panels of columns small enough
 * for L1 (CHUNK_BYTES), and each chunk serves every row of C (in blocks of SCRATCH_ENTRIES
 * listed entries), whose sums pass through C between chunks. A panel's last vector ends at its
 * last column (it overlaps the one before when the width is not a multiple of 16): no load past
 * B's rows and no masked tail, and an overlapped column gets the same sums in the same order
 * either way.
 *
 * The result is the dense product's, rounded in another order: a zero of A multiplies only
 * finite values of B here, since a B with an infinity or a NaN (seen as it is copied) goes to
 * the dense GEMM after all, where 0 x inf is a NaN. cpu_gemm_sparse_f32 says first whether it
 * applies: A's nonzeros counted on its first rows, below SPARSE_GEMM_DENSITY of them. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(DG_SANITIZE_BUILD)
#include <immintrin.h>
#define SPARSE_AVX512 1
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define load16(p) (*(const v16u *)(p))
#define store16(p, v) (*(v16u *)(p) = (v))

// Below this fraction of nonzeros in A the lists win over the dense GEMM (bench/gemm_bench's
// *_sparse* shapes).
#define SPARSE_GEMM_DENSITY 0.6
#define SCRATCH_ENTRIES ((int64_t)1 << 20)   // A's entries listed at once (8 MB of lists)
#define CHUNK_BYTES 28672     // a chunk of a panel of B
#define MAX_CHUNK_ROWS 64     // a chunk's rows before its panel is narrowed

_Atomic int64_t cpu_gemm_sparse_calls;

static inline __attribute__((always_inline)) uint32_t bits_of(const float *p) {
    uint32_t b;
    memcpy(&b, p, sizeof b);
    return b;
}

// The nonzeros of rows of op(A), one list after another: their indices k and values, in order
// of k; row r's entries before k = 16 q are start[r * (Q + 1) + q], Q = ceil(K / 16).
typedef struct row_lists {
    uint32_t *k;
    float *val;
    int32_t *start;
    int64_t q;   // Q
} row_lists;

// Lists a[0 .. K) from entry n on (the arrays hold 16 entries past the last); returns the end.
// Branch-free: at half zeros a branch per entry would mispredict often. -0 counts as zero;
// integer tests, as a float comparison would need a second one for NaN.
static int32_t list_scalar(const float *a, int64_t K, int32_t n, uint32_t *ks, float *val, int32_t *start) {
    for (int64_t k = 0; k < K; k++) {
        if (k % 16 == 0) start[k / 16] = n;
        uint32_t bits = bits_of(a + k);
        ks[n] = (uint32_t)k;
        memcpy(val + n, &bits, sizeof bits);
        n += (bits << 1) != 0;
    }
    start[(K + 15) / 16] = n;
    return n;
}

#ifdef SPARSE_AVX512
// The same, 16 entries at a time: the nonzeros' lanes compressed to the front of a register.
__attribute__((target("avx512f"))) static int32_t list_avx512(const float *a, int64_t K, int32_t n, uint32_t *ks,
                                                              float *val, int32_t *start) {
    __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i step = _mm512_set1_epi32(16);
    for (int64_t k = 0; k < K; k += 16) {
        start[k / 16] = n;
        __mmask16 in = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
        __m512i v = _mm512_maskz_loadu_epi32(in, a + k);
        __mmask16 nz = _mm512_test_epi32_mask(_mm512_slli_epi32(v, 1), _mm512_set1_epi32(-1));
        _mm512_storeu_si512(ks + n, _mm512_maskz_compress_epi32(nz, idx));
        _mm512_storeu_si512(val + n, _mm512_maskz_compress_epi32(nz, v));
        n += __builtin_popcount(nz);
        idx = _mm512_add_epi32(idx, step);
    }
    start[(K + 15) / 16] = n;
    return n;
}
#endif

// Lists rows [0, M) of a (row stride lda) into l.
static void list_rows(const float *a, int64_t M, int64_t K, int64_t lda, const row_lists *l, cpu_isa cap) {
    int32_t n = 0;
#ifdef SPARSE_AVX512
    if (cap >= CPU_ISA_AVX512) {
        for (int64_t r = 0; r < M; r++) n = list_avx512(a + r * lda, K, n, l->k, l->val, l->start + r * (l->q + 1));
        return;
    }
#endif
    for (int64_t r = 0; r < M; r++) n = list_scalar(a + r * lda, K, n, l->k, l->val, l->start + r * (l->q + 1));
}

// c[0 .. w) (+)= sum over entries [lo, hi) of val * bc[(k - k0) * 16 NV][0 .. w), 16 <= w <=
// 16 NV, in NV vectors; the sums start from zero when first, else from c. bc's vectors are
// aligned.
#define DEFINE_PANEL(NV)                                                                           \
    static inline __attribute__((always_inline)) void panel_##NV(const row_lists *l, int32_t lo, int32_t hi, \
                                                                 const float *bc, uint32_t k0, int64_t w,      \
                                                                 bool first, float *c) {                       \
        const int64_t last = w - 16;                                                               \
        v16 acc[NV];                                                                               \
        for (int v = 0; v < NV - 1; v++) acc[v] = first ? (v16){0} : load16(c + 16 * v);           \
        acc[NV - 1] = first ? (v16){0} : load16(c + last);                                         \
        for (int32_t i = lo; i < hi; i++) {                                                        \
            const float x = l->val[i];                                                             \
            const v16 a = {x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};                         \
            const v16 *b = (const v16 *)(bc + (size_t)(l->k[i] - k0) * (16 * NV));                 \
            for (int v = 0; v < NV; v++) acc[v] += a * b[v];                                       \
        }                                                                                          \
        for (int v = 0; v < NV - 1; v++) store16(c + 16 * v, acc[v]);                              \
        store16(c + last, acc[NV - 1]);                                                            \
    }
DEFINE_PANEL(1)
DEFINE_PANEL(2)
DEFINE_PANEL(3)
DEFINE_PANEL(4)
DEFINE_PANEL(5)
DEFINE_PANEL(6)
DEFINE_PANEL(7)
DEFINE_PANEL(8)

// How C's columns and B's rows are cut: panels of at most nv vectors, as even as they go, and
// chunks of rows, so that a chunk of a panel (rows x nv x 64 bytes) stays in L1 beside the rows
// of C it is adding to.
typedef struct sparse_plan {
    int64_t panels, chunk_rows;
} sparse_plan;

static sparse_plan plan_of(int64_t N, int64_t K) {
    int64_t vectors = (N + 15) / 16, rows = (K + 15) / 16 * 16;
    if (rows > MAX_CHUNK_ROWS) rows = MAX_CHUNK_ROWS;
    int64_t nv = CHUNK_BYTES / (rows * 64);
    if (nv > 8) nv = 8;
    if (nv < 1) nv = 1;
    int64_t panels = (vectors + nv - 1) / nv;
    nv = (vectors + panels - 1) / panels;
    int64_t chunk = CHUNK_BYTES / (nv * 64) / 16 * 16;
    if (chunk < 16) chunk = 16;
    return (sparse_plan){panels, chunk};
}

// Rows [0, M) of C from their lists, N >= 16 columns, B of K rows; bc: CHUNK_BYTES, 64-byte
// aligned. A chunk of a panel of B is copied into bc, each vector where the panel kernel reads
// it (the last one ending at the panel's last column), and serves every row. False when B
// holds an infinity or a NaN (C is then written, but not with the product).
CPU_CLONES static bool sparse_rows(const row_lists *l, int64_t M, int64_t N, int64_t K, const float *B,
                                   int64_t ldb, float *C, int64_t ldc, float *bc) {
    sparse_plan p = plan_of(N, K);
    int64_t vectors = (N + 15) / 16;
    v16i bad = {0};
    for (int64_t pi = 0, v0 = 0; pi < p.panels; pi++) {
        int64_t nv = (vectors - v0 + (p.panels - pi) - 1) / (p.panels - pi);   // the rest, evenly
        int64_t j0 = 16 * v0, w = 16 * nv;
        v0 += nv;
        if (j0 + w > N) {   // the last panel ends at N
            w = N - j0;
            if (w < 16) {
                j0 = N - 16;
                w = 16;
            }
        }
        for (int64_t k0 = 0; k0 < K; k0 += p.chunk_rows) {
            int64_t k1 = k0 + p.chunk_rows < K ? k0 + p.chunk_rows : K;
            for (int64_t k = k0; k < k1; k++) {
                const float *b = B + k * ldb + j0;
                v16 *d = (v16 *)(bc + (k - k0) * 16 * nv);
                for (int64_t v = 0; v < nv; v++) {
                    v16 x = load16(b + (v < nv - 1 ? 16 * v : w - 16));
                    bad |= ((v16i)x & 0x7f800000) == 0x7f800000;   // exponent all ones: inf or NaN
                    d[v] = x;
                }
            }
            int64_t q0 = k0 / 16, q1 = (k1 + 15) / 16;
            for (int64_t r = 0; r < M; r++) {
                const int32_t *st = l->start + r * (l->q + 1);
                int32_t lo = st[q0], hi = st[q1];
                if (lo == hi && k0 > 0) continue;
                float *c = C + r * ldc + j0;
                switch (nv) {
                case 1: panel_1(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                case 2: panel_2(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                case 3: panel_3(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                case 4: panel_4(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                case 5: panel_5(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                case 6: panel_6(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                case 7: panel_7(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                default: panel_8(l, lo, hi, bc, (uint32_t)k0, w, k0 == 0, c); break;
                }
            }
        }
    }
    int32_t any = 0;
    for (int i = 0; i < 16; i++) any |= bad[i];
    return !any;
}

// at [M][K] = A^T, A stored K x M: tiles of 16 x 16.
static void turn_round_scalar(int64_t m0, int64_t m1, int64_t k0, int64_t k1, int64_t K, const float *A, int64_t lda,
                              float *at) {
    for (int64_t k = k0; k < k1; k++)
        for (int64_t m = m0; m < m1; m++) at[m * K + k] = A[k * lda + m];
}

#ifdef SPARSE_AVX512
// One whole tile in registers: pairs of rows interleaved by 32, then 64 bits, then 128-bit
// lanes gathered twice.
__attribute__((target("avx512f"))) static void tile_avx512(const float *a, int64_t lda, float *t, int64_t ldt) {
    __m512 r[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(a + i * lda);
    for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4)   // r[i + c]: column c (mod 4) of rows i .. i + 3, per lane
        for (int h = 0; h < 2; h++) {
            __m512d x = _mm512_castps_pd(u[i + h]), y = _mm512_castps_pd(u[i + h + 2]);
            r[i + 2 * h] = _mm512_castpd_ps(_mm512_unpacklo_pd(x, y));
            r[i + 2 * h + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x, y));
        }
    for (int c = 0; c < 4; c++) {
        // lanes 0 and 2 (columns c, 8 + c), 1 and 3 (4 + c, 12 + c) of rows 0-3 and 4-7; 8-11 and 12-15
        __m512 lo0 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), lo1 = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        __m512 hi0 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88),
               hi1 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        _mm512_storeu_ps(t + c * ldt, _mm512_shuffle_f32x4(lo0, hi0, 0x88));
        _mm512_storeu_ps(t + (8 + c) * ldt, _mm512_shuffle_f32x4(lo0, hi0, 0xDD));
        _mm512_storeu_ps(t + (4 + c) * ldt, _mm512_shuffle_f32x4(lo1, hi1, 0x88));
        _mm512_storeu_ps(t + (12 + c) * ldt, _mm512_shuffle_f32x4(lo1, hi1, 0xDD));
    }
}
#endif

static void turn_round(int64_t M, int64_t K, const float *A, int64_t lda, float *at, cpu_isa cap) {
    int64_t m16 = 0, k16 = 0;
#ifdef SPARSE_AVX512
    if (cap >= CPU_ISA_AVX512) {
        m16 = M / 16 * 16;
        k16 = K / 16 * 16;
        for (int64_t m0 = 0; m0 < m16; m0 += 16)
            for (int64_t k0 = 0; k0 < k16; k0 += 16) tile_avx512(A + k0 * lda + m0, lda, at + m0 * K + k0, K);
    }
#endif
    turn_round_scalar(0, m16, k16, K, K, A, lda, at);   // the rows of A below the tiles
    turn_round_scalar(m16, M, 0, K, K, A, lda, at);     // the columns right of them
}

// The nonzeros among the first rows of op(A) (an eighth of them, at least one), below
// SPARSE_GEMM_DENSITY of the entries.
CPU_CLONES static bool mostly_zero(bool ta, int64_t M, int64_t K, const float *A, int64_t lda) {
    int64_t rows = M < 8 ? 1 : M / 8, total = rows * K, nz = 0;
    if (!ta)
        for (int64_t i = 0; i < rows; i++)
            for (int64_t k = 0; k < K; k++) nz += (bits_of(A + i * lda + k) << 1) != 0;
    else
        for (int64_t k = 0; k < K; k++)
            for (int64_t i = 0; i < rows; i++) nz += (bits_of(A + k * lda + i) << 1) != 0;
    return (double)nz < SPARSE_GEMM_DENSITY * (double)total;
}

bool cpu_gemm_sparse_f32(bool ta, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, cpu_isa cap) {
    if (N < 16 || K < 16 || M < 1 || K > SCRATCH_ENTRIES || !mostly_zero(ta, M, K, A, lda)) return false;
    // Rows of C a block at a time, so the lists (and A turned round) take at most about 12 MB
    // however large A is.
    int64_t block = SCRATCH_ENTRIES / K;
    if (block < 1) block = 1;
    if (block > M) block = M;
    row_lists l = {.q = (K + 15) / 16};
    size_t entries = (size_t)(block * K + 16), bc_bytes = CHUNK_BYTES;
    size_t at_bytes = ta ? (size_t)(block * K) * sizeof(float) : 0;
    size_t bytes = bc_bytes + at_bytes + entries * (sizeof *l.k + sizeof *l.val) +
                   (size_t)(block * (l.q + 1)) * sizeof *l.start;
    char *scratch = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!scratch) return false;
    float *bc = (float *)scratch, *at = (float *)(scratch + bc_bytes);
    l.k = (uint32_t *)(scratch + bc_bytes + at_bytes);
    l.val = (float *)(l.k + entries);
    l.start = (int32_t *)(l.val + entries);
    bool finite = true;
    for (int64_t i0 = 0; i0 < M && finite; i0 += block) {
        int64_t rows = M - i0 < block ? M - i0 : block;
        if (ta) {
            turn_round(rows, K, A + i0, lda, at, cap);
            list_rows(at, rows, K, K, &l, cap);
        } else {
            list_rows(A + i0 * lda, rows, K, lda, &l, cap);
        }
        finite = sparse_rows(&l, rows, N, K, B, ldb, C + i0 * ldc, ldc, bc);
    }
    free(scratch);
    if (finite) atomic_fetch_add_explicit(&cpu_gemm_sparse_calls, 1, memory_order_relaxed);
    return finite;   // else the dense GEMM writes C again
}
