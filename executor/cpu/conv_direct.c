/* Direct float32 convolutions for stride 1 and output channels in multiples of 16, NHWC: the
 * forward pass, the input gradient (the forward pass of the output gradient with the filter
 * turned round and its channels swapped) and the filter gradient, without im2col. The input
 * is copied once into a zero-padded buffer, so a window row at any position is kw * c
 * contiguous floats and the inner loops test no bounds.
 *
 * The register blocks hold PIX_BLOCK output pixels times 16 or 32 output channels (forward)
 * and up to 8 window entries times 16 or 32 output channels (filter gradient) in 16-float
 * vectors (GCC's vector extension: one AVX-512 register, two AVX2 ones), so each filter or
 * gradient vector loaded is used for a block of fused multiply-adds with broadcast inputs.
 * cpu_conv_direct_*_f32 return false when they do not apply; the caller uses im2col then. */
#include <float.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int32_t v16iu __attribute__((vector_size(64), aligned(4)));

// Unaligned loads and stores (macros: a function passing vectors by value would change the
// calling convention between the clones).
#define load16(p) (*(const v16u *)(p))
#define store16(p, v) (*(v16u *)(p) = (v))
#define add16(p, v) (*(v16u *)(p) += (v))

static bool cpu_conv_direct_applies(const graph_conv_geom *g, int64_t oc) {
    return g->sh == 1 && g->sw == 1 && oc % 16 == 0 && oc > 0 && g->c > 0 && g->kh > 0 && g->kw > 0 &&
           g->n > 0 && g->oh > 0 && g->ow > 0;
}

// Scratch for the padded copies, kept between calls since a step runs the same shapes again
// (a fresh multi-megabyte allocation costs its page faults every time): a few slots, each
// taken and given back without a lock; a call that finds none allocates. A buffer is laid
// out as its capacity in floats, then the floats from SCRATCH_HEAD on. Buffers above
// SCRATCH_KEEP_MAX are freed after use rather than kept.
#define SCRATCH_SLOTS 8
#define SCRATCH_HEAD 16
#define SCRATCH_KEEP_MAX ((size_t)64 << 20)
static _Atomic(float *) scratch_slot[SCRATCH_SLOTS];

static size_t scratch_cap(const float *b) {
    size_t cap;
    memcpy(&cap, b, sizeof cap);
    return cap;
}

static float *scratch_take(size_t n) {
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        float *b = atomic_exchange(&scratch_slot[i], NULL);
        if (!b) continue;
        if (scratch_cap(b) >= n) return b + SCRATCH_HEAD;
        free(b);
        break;
    }
    // 64-byte aligned (SCRATCH_HEAD floats are 64 bytes): a 16-float vector at a multiple of 16
    // floats is then one cache line, not two.
    float *b = aligned_alloc(64, (n + SCRATCH_HEAD + 15) / 16 * 16 * sizeof *b);
    if (!b) return NULL;
    memcpy(b, &n, sizeof n);
    return b + SCRATCH_HEAD;
}

static void scratch_give(float *p) {
    if (!p) return;
    float *b = p - SCRATCH_HEAD;
    if (scratch_cap(b) * sizeof *b <= SCRATCH_KEEP_MAX)
        for (int i = 0; i < SCRATCH_SLOTS; i++) {
            float *none = NULL;
            if (atomic_compare_exchange_strong(&scratch_slot[i], &none, b)) return;
        }
    free(b);
}

// x [n, h, w, c] into xp [n, hp, wp, c] (scratch) with zeros around: pt rows above, pl columns
// left (negative: rows or columns of x cut off). *rlo, *rhi: the padded rows that hold rows of x;
// *clo, *chi: the padded columns that do.
static float *pad_input(const float *x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pt, int64_t pl,
                        int64_t hp, int64_t wp, int64_t *rlo, int64_t *rhi, int64_t *clo, int64_t *chi) {
    float *xp = scratch_take((size_t)(n * hp * wp * c) + 16);
    if (!xp) return NULL;
    int64_t x0 = pl < 0 ? -pl : 0, x1 = w + pl > wp ? wp - pl : w;   // columns of x inside a padded row
    if (x1 < x0) x1 = x0;
    *clo = x0 + pl;
    *chi = x1 + pl;
    *rlo = pt < 0 ? 0 : pt > hp ? hp : pt;
    *rhi = pt + h > hp ? hp : pt + h < *rlo ? *rlo : pt + h;
    const size_t row = (size_t)(wp * c);
    for (int64_t b = 0; b < n; b++) {
        float *img = xp + (size_t)(b * hp) * row;
        memset(img, 0, (size_t)*rlo * row * sizeof *xp);
        for (int64_t py = *rlo; py < *rhi; py++) {
            float *r = img + (size_t)py * row;
            memset(r, 0, (size_t)((x0 + pl) * c) * sizeof *r);
            memcpy(r + (x0 + pl) * c, x + ((b * h + py - pt) * w + x0) * c, (size_t)((x1 - x0) * c) * sizeof *x);
            memset(r + (x1 + pl) * c, 0, (size_t)((wp - x1 - pl) * c) * sizeof *r);
        }
        memset(img + (size_t)*rhi * row, 0, (size_t)(hp - *rhi) * row * sizeof *xp);
    }
    memset(xp + (size_t)(n * hp) * row, 0, 16 * sizeof *xp);
    return xp;
}

// One row of output pixels [ox0, ox0 + P) of 16 * J channels from oc0: acc over window rows
// [ky0, ky1), each of the window entries [q0, q1) of kq = kw * c contiguous inputs (the others
// read padding only). xr: the padded input at (row oy, column ox0), row floats per padded row;
// f: the filter [kh][kq][oc]. add: the sums start from y's values (an earlier pass over other
// window rows) rather than 0. ep (may be NULL): applied before the store.
#define DEFINE_FWD_BLOCK(P, J)                                                                    \
    static inline __attribute__((always_inline)) void fwd_block_##P##_##J(                        \
        const float *xr, int64_t row, int64_t c, int64_t ky0, int64_t ky1, int64_t q0, int64_t q1, \
        int64_t kq, const float *f, int64_t oc, int64_t oc0, bool add, const cpu_conv_epilogue *ep, \
        float *y) {                                                                               \
        v16 acc[P][J];                                                                            \
        _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                                      \
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)                                       \
            acc[p][j] = add ? load16(y + p * oc + oc0 + 16 * j) : (v16){0};                       \
        for (int64_t ky = ky0; ky < ky1; ky++) {                                                  \
            const float *xk = xr + ky * row, *fk = f + ky * kq * oc + oc0;                        \
            for (int64_t q = q0; q < q1; q++) {                                                   \
                v16 fv[J];                                                                        \
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) fv[j] = load16(fk + q * oc + 16 * j); \
                _Pragma("GCC unroll 16") for (int p = 0; p < P; p++) {                            \
                    float xv = xk[p * c + q];                                                     \
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[p][j] += xv * fv[j];  \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        if (ep) {                                                                                 \
            v16 bv[J];                                                                            \
            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++)                                   \
                bv[j] = ep->bias ? load16(ep->bias + oc0 + 16 * j) : (v16){0};                    \
            _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                                  \
            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) {                                 \
                v16 v = acc[p][j] + bv[j];                                                        \
                acc[p][j] = ep->relu ? (v16)((v16i)v & (v > 0)) : v;                              \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                                      \
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) store16(y + p * oc + oc0 + 16 * j, acc[p][j]); \
    }
DEFINE_FWD_BLOCK(7, 2)
DEFINE_FWD_BLOCK(14, 1)
DEFINE_FWD_BLOCK(7, 1)
DEFINE_FWD_BLOCK(1, 2)
DEFINE_FWD_BLOCK(1, 1)

// P output pixels from ox, all channels, window rows [ky0, ky1) and columns [kx0, kx1).
#define FWD_PIXELS(P, PJ1, kx0, kx1)                                                              \
    do {                                                                                          \
        int64_t oc0 = 0, q0_ = (kx0) * c, q1_ = (kx1) > (kx0) ? (kx1) * c : q0_;                   \
        for (; oc0 + 32 <= oc; oc0 += 32)                                                         \
            fwd_block_##P##_2(xr + ox * c, row, c, ky0, ky1, q0_, q1_, kq, f, oc, oc0, add, ep_, yr + ox * oc); \
        if (oc0 < oc)                                                                             \
            fwd_block_##PJ1##_1(xr + ox * c, row, c, ky0, ky1, q0_, q1_, kq, f, oc, oc0, add, ep_, yr + ox * oc); \
    } while (0)

// One output row yr from the padded rows from xr over window rows [ky0, ky1): blocks of 7 pixels
// (of 14 where 16 channels are all there are: a 16-channel block needs more pixels for enough
// independent sums), then single pixels. Window columns where all of a block's pixels read
// padding are skipped. (Smaller blocks at the edges would skip more but run slower: fewer
// independent sums than the multiply-add latency needs.)
static inline __attribute__((always_inline)) void fwd_row(const float *xr, int64_t row, int64_t clo, int64_t chi,
                                                          int64_t ky0, int64_t ky1, int64_t kw, const float *f,
                                                          int64_t ow, int64_t oc, bool add,
                                                          const cpu_conv_epilogue *ep_, float *yr, int64_t c) {
    const int64_t kq = kw * c;
#define KX0(last) (clo - (last) > 0 ? clo - (last) : 0)
#define KX1(first) (chi - (first) < kw ? chi - (first) : kw)
    int64_t ox = 0;
    if (oc == 16)
        for (; ox + 14 <= ow; ox += 14) FWD_PIXELS(7, 14, KX0(ox + 13), KX1(ox));
    for (; ox + 7 <= ow; ox += 7) FWD_PIXELS(7, 7, KX0(ox + 6), KX1(ox));
    for (; ox < ow; ox++) FWD_PIXELS(1, 1, KX0(ox), KX1(ox));
#undef KX0
#undef KX1
}

// The filter bytes above which the window rows go in the outer loop: each row's slice of the
// filter then stays in the level-1 cache across a whole image, and the sums go through y
// between rows (a filter streamed from level 2 for every block of pixels held the forward pass
// of cnn_replica's second convolution, a 51 KB filter, to half the core's speed).
#define FWD_FILTER_L1 (16 << 10)

// y [n, oh, ow, oc] from the padded input xp [n, hp, wp, c] and filter f [kh][kw][c][oc]. Rows of
// xp outside [rlo, rhi) and columns outside [clo, chi) are padding: a block skips the window
// rows and columns where all its pixels read padding only.
// no-predictive-commoning (also on bpf_padded): with one input channel, neighbouring pixels'
// windows overlap, and GCC then carries the inputs from one window entry to the next in registers, moves and
// register broadcasts (port 5) that ran the first layer at 0.42 of peak instead of embedded
// broadcasts from memory.
CPU_CLONES __attribute__((optimize("no-predictive-commoning"))) static void fwd_padded(const float *xp, int64_t n, int64_t hp, int64_t wp, int64_t c, int64_t rlo,
                                  int64_t rhi, int64_t clo, int64_t chi, const float *f, int64_t kh, int64_t kw,
                                  int64_t oh, int64_t ow, int64_t oc, const cpu_conv_epilogue *ep, float *y) {
    const int64_t kq = kw * c, row = wp * c;
    bool rows_outer = (size_t)(kh * kq * oc) * sizeof *f > FWD_FILTER_L1 && kh > 1;
    // The common channel counts as constants (1: an image's first layer): the inputs of a block's pixels are then fixed
    // offsets from one pointer (with c a variable, GCC keeps a pointer per pixel, more than
    // there are registers).
#define FWD_ROW(...)                                                                              \
    do {                                                                                          \
        if (c == 1) fwd_row(__VA_ARGS__, 1);                                                      \
        else if (c == 16) fwd_row(__VA_ARGS__, 16);                                               \
        else if (c == 32) fwd_row(__VA_ARGS__, 32);                                               \
        else fwd_row(__VA_ARGS__, c);                                                             \
    } while (0)
    // Rows outer: window row ky of every output row, then the next (passes = kh); otherwise one
    // pass takes all of an output row's window rows. Output row oy takes window rows [ky0, ky1)
    // (the others read padding only): the first pass over them starts its sums from 0, the last
    // applies the epilogue; a row that takes none gets the epilogue of 0. (One loop, so that each
    // channel constant's row is compiled once.)
    int64_t passes = rows_outer ? kh : 1;
    for (int64_t b = 0; b < n; b++)
        for (int64_t pass = 0; pass < passes; pass++)
            for (int64_t oy = 0; oy < oh; oy++) {
                int64_t ky0 = rlo - oy > 0 ? rlo - oy : 0, ky1 = rhi - oy < kh ? rhi - oy : kh;
                if (ky1 < ky0) ky1 = ky0;
                int64_t k0 = ky0, k1 = ky1;   // this pass's window rows
                if (rows_outer) {
                    if (ky1 > ky0 && (pass < ky0 || pass >= ky1)) continue;
                    if (ky1 == ky0 && pass != 0) continue;
                    if (ky1 > ky0) k0 = pass, k1 = pass + 1;
                }
                FWD_ROW(xp + (b * hp + oy) * row, row, clo, chi, k0, k1, kw, f, ow, oc, k0 > ky0,
                        k1 >= ky1 ? ep : NULL, y + (b * oh + oy) * ow * oc);
            }
#undef FWD_ROW
}

bool cpu_conv_direct_fwd_f32(const graph_conv_geom *g, const float *x, const float *f, const cpu_conv_epilogue *ep,
                             float *y) {
    if (!cpu_conv_direct_applies(g, g->oc)) return false;
    // Padded so that every window of every output position lies inside.
    int64_t hp = g->oh + g->kh - 1, wp = g->ow + g->kw - 1, rlo, rhi, clo, chi;
    float *xp = pad_input(x, g->n, g->h, g->w, g->c, g->pad_top, g->pad_left, hp, wp, &rlo, &rhi, &clo, &chi);
    if (!xp) return false;
    fwd_padded(xp, g->n, hp, wp, g->c, rlo, rhi, clo, chi, f, g->kh, g->kw, g->oh, g->ow, g->oc, ep, y);
    scratch_give(xp);
    return true;
}

// ---- the two gradients from a mostly-zero dy ----
// Behind a max pool and a ReLU most of a convolution's output gradient is zero: a 2 x 2 pool
// passes each window's gradient to one of its four positions, so at least three entries in four
// are zero. The gradients then visit only dy's nonzero entries, per image and output channel,
// with vectors along the input channels (16, 32 or 64 of them; windows of 3 x 3 or 5 x 5), and do the
// dense kernels' multiply-adds times the fraction of nonzeros. As the reference BLAS skips
// zeros of B, a zero entry is skipped even where what it would multiply is not finite; a NaN
// in dy is not zero and is carried.

// One nonzero dy entry of an image: its value and the offset (in floats) of its window's
// first element in the padded image [hp][wp][c].
_Thread_local int64_t cpu_conv_sparse_calls;

typedef struct sparse_entry {
    uint32_t off;
    float g;
} sparse_entry;
_Static_assert(sizeof(sparse_entry) == 8, "an entry is written as one 64-bit word");

// Use the sparse kernels below this fraction of nonzeros (the input gradient's scatter does a
// load and a store per multiply-add, so it wins later than the filter gradient).
#define SPARSE_BPF_DENSITY 0.45
#define SPARSE_BPI_DENSITY 0.35

static bool sparse_applies(const graph_conv_geom *g, int64_t hp, int64_t wp, const float *dy, double limit) {
    if (!(g->c == 16 || g->c == 32 || g->c == 64) || !((g->kh == 5 && g->kw == 5) || (g->kh == 3 && g->kw == 3)) ||
        (double)hp * (double)wp * (double)g->c >= 4e9)
        return false;
    // The fraction of nonzeros in the first images (up to a quarter of the batch, at least one):
    // the images of a batch went through the same layers.
    int64_t images = g->n < 4 ? 1 : g->n / 4;
    int64_t total = images * g->oh * g->ow * g->oc, nz = 0;
    for (int64_t i = 0; i < total; i++) nz += dy[i] != 0;
    return (double)nz < limit * (double)total;
}

// One image's nonzero entries by output channel: channel o's are e[start[o] .. start[o + 1]),
// in position order; e holds oh * ow * oc + 1 entries. Branch-free, one channel at a time (its
// count stays in a register): at a fifth of nonzeros a branch per entry would mispredict often.
static inline __attribute__((always_inline)) void sparse_lists(const float *dy, int64_t oh, int64_t ow, int64_t oc,
                                                               int64_t wp, int64_t c, int64_t *start, sparse_entry *e) {
    int64_t k = 0;
    for (int64_t o = 0; o < oc; o++) {
        start[o] = k;
        for (int64_t oy = 0; oy < oh; oy++) {
            const float *d = dy + oy * ow * oc + o;
            uint32_t off = (uint32_t)(oy * wp * c);
            for (int64_t ox = 0; ox < ow; ox++, off += (uint32_t)c) {
                // Written whatever the value, kept if not zero; -0 counts as zero. Integer
                // operations: a float comparison would need a second test for NaN.
                uint32_t bits;
                memcpy(&bits, d + ox * oc, sizeof bits);
                uint64_t word = (uint64_t)bits << 32 | off;
                memcpy(e + k, &word, sizeof word);
                k += (bits << 1) != 0;
            }
        }
    }
    start[oc] = k;
}

// The pointer's value hidden from the optimiser: each window row's pointer is then one add per
// entry, and the row's inputs are read at constant displacements from it, where GCC would
// otherwise keep the window's 25 offsets, more than the general registers, on the stack.
#define SPARSE_OPAQUE(p) __asm__("" : "+r"(p))

// Filter gradient of a R x S window, 16 input channels from xb: acc [R * S][c] (at the block's
// first channel) += each entry's value times the inputs of its window.
#define DEFINE_SPARSE_BPF(R, S, c)                                                                \
    static inline __attribute__((always_inline)) void sparse_bpf_##R##_##S##_##c(                 \
        const float *xb, int64_t row, const sparse_entry *e, const sparse_entry *end, float *acc_out) { \
        v16 acc[R][S];                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                       \
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) acc[r][s] = load16(acc_out + (r * S + s) * c); \
        for (; e < end; e++) {                                                                    \
            const float *xs = xb + e->off;                                                        \
            v16 gv = (v16){0} + e->g;                                                             \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                 \
                _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) acc[r][s] += gv * load16(xs + s * c); \
                xs += row;                                                                        \
                SPARSE_OPAQUE(xs);                                                                \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                       \
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) store16(acc_out + (r * S + s) * c, acc[r][s]); \
    }
DEFINE_SPARSE_BPF(5, 5, 16)
DEFINE_SPARSE_BPF(5, 5, 32)
DEFINE_SPARSE_BPF(5, 5, 64)
DEFINE_SPARSE_BPF(3, 3, 16)
DEFINE_SPARSE_BPF(3, 3, 32)
DEFINE_SPARSE_BPF(3, 3, 64)

// One image's nonzero entries by position: position p's are e[start[p] .. start[p + 1]), each
// with the offset o * taps * c of its channel's vectors in ft [oc][taps][c]. Branch-free over dy's
// contiguous rows; e holds oh * ow * oc + 1 entries.
static inline __attribute__((always_inline)) void sparse_pixel_lists(const float *dy, int64_t pixels, int64_t oc,
                                                                     int64_t step, int64_t *start, sparse_entry *e) {
    int64_t k = 0;
    for (int64_t p = 0; p < pixels; p++) {
        start[p] = k;
        const float *d = dy + p * oc;
        for (int64_t o = 0; o < oc; o++) {
            uint32_t bits;
            memcpy(&bits, d + o, sizeof bits);
            uint64_t word = (uint64_t)bits << 32 | (uint32_t)(o * step);
            memcpy(e + k, &word, sizeof word);
            k += (bits << 1) != 0;
        }
    }
    start[pixels] = k;
}

// Input gradient of a R x S window, 16 input channels: the window of dxb [hp][wp][c] (at the
// block's first channel) that one position reaches, held in registers while each of the
// position's nonzero channels adds its value times its filter vectors ft [taps][c] (at e->off).
#define DEFINE_SPARSE_BPI(R, S, c)                                                                \
    static inline __attribute__((always_inline)) void sparse_bpi_##R##_##S##_##c(                 \
        float *xs, int64_t row, const sparse_entry *e, const sparse_entry *end, const float *ft) { \
        v16 acc[R][S];                                                                            \
        float *xr = xs;                                                                           \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                     \
            _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) acc[r][s] = load16(xr + s * c);   \
            xr += row;                                                                            \
            SPARSE_OPAQUE(xr);                                                                    \
        }                                                                                         \
        for (; e < end; e++) {                                                                    \
            const float *f = ft + e->off;                                                         \
            v16 gv = (v16){0} + e->g;                                                             \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                   \
            _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) acc[r][s] += gv * load16(f + (r * S + s) * c); \
        }                                                                                         \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                     \
            _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) store16(xs + s * c, acc[r][s]);   \
            xs += row;                                                                            \
            SPARSE_OPAQUE(xs);                                                                    \
        }                                                                                         \
    }
DEFINE_SPARSE_BPI(5, 5, 16)
DEFINE_SPARSE_BPI(5, 5, 32)
DEFINE_SPARSE_BPI(5, 5, 64)
DEFINE_SPARSE_BPI(3, 3, 16)
DEFINE_SPARSE_BPI(3, 3, 32)
DEFINE_SPARSE_BPI(3, 3, 64)

// The kernel for the window (kh: 3 or 5) and the channel count (16, 32 or 64), which the
// kernels take as constants: the 25 offsets of a window then fit in the instructions.
#define SPARSE_CALL(KIND, kh, c, ...)                                                             \
    do {                                                                                          \
        if ((kh) == 5 && (c) == 16) sparse_##KIND##_5_5_16(__VA_ARGS__);                          \
        else if ((kh) == 5 && (c) == 32) sparse_##KIND##_5_5_32(__VA_ARGS__);                     \
        else if ((kh) == 5) sparse_##KIND##_5_5_64(__VA_ARGS__);                                  \
        else if ((c) == 16) sparse_##KIND##_3_3_16(__VA_ARGS__);                                  \
        else if ((c) == 32) sparse_##KIND##_3_3_32(__VA_ARGS__);                                  \
        else sparse_##KIND##_3_3_64(__VA_ARGS__);                                                 \
    } while (0)

// df [kh][kw][c][oc] from the padded input: sums per channel in acc [oc][kh * kw][c], turned
// round at the end.
CPU_CLONES static void bpf_sparse(const float *xp, int64_t n, int64_t hp, int64_t wp, int64_t c, const float *dy,
                                  int64_t kh, int64_t kw, int64_t oh, int64_t ow, int64_t oc, float *acc,
                                  int64_t *start, sparse_entry *e, float *df) {
    const int64_t taps = kh * kw, row = wp * c;
    memset(acc, 0, (size_t)(oc * taps * c) * sizeof *acc);
    for (int64_t b = 0; b < n; b++) {
        sparse_lists(dy + b * oh * ow * oc, oh, ow, oc, wp, c, start, e);
        const float *xb = xp + b * hp * row;
        for (int64_t o = 0; o < oc; o++)
            for (int64_t i0 = 0; i0 < c; i0 += 16) {
                float *a = acc + o * taps * c + i0;
                SPARSE_CALL(bpf, kh, c, xb + i0, row, e + start[o], e + start[o + 1], a);
            }
    }
    for (int64_t t = 0; t < taps; t++)
        for (int64_t i = 0; i < c; i++)
            for (int64_t o = 0; o < oc; o++) df[(t * c + i) * oc + o] = acc[(o * taps + t) * c + i];
}

// dx [n, h, w, c]: each image's gradient gathered in a padded image dxb [hp][wp][c] (input row
// iy at padded row iy + pt, column ix at ix + pl), a position's window at a time, then cut out.
// ft [oc][kh * kw][c]: the filter with each output channel's vectors together.
CPU_CLONES static void bpi_sparse(const float *dy, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pt,
                                  int64_t pl, int64_t hp, int64_t wp, int64_t kh, int64_t kw, int64_t oh, int64_t ow,
                                  int64_t oc, const float *ft, float *dxb, int64_t *start, sparse_entry *e,
                                  float *dx) {
    const int64_t taps = kh * kw, row = wp * c;
    for (int64_t b = 0; b < n; b++) {
        sparse_pixel_lists(dy + b * oh * ow * oc, oh * ow, oc, taps * c, start, e);
        memset(dxb, 0, (size_t)(hp * row) * sizeof *dxb);
        for (int64_t oy = 0; oy < oh; oy++)
            for (int64_t ox = 0; ox < ow; ox++) {
                int64_t p = oy * ow + ox;
                if (start[p] == start[p + 1]) continue;
                for (int64_t i0 = 0; i0 < c; i0 += 16)
                    SPARSE_CALL(bpi, kh, c, dxb + (oy * wp + ox) * c + i0, row, e + start[p], e + start[p + 1], ft + i0);
            }
        // Input columns [x0, x1) lie in the padded image (all of them unless a padding is negative).
        int64_t x0 = pl < 0 ? -pl : 0, x1 = w + pl > wp ? wp - pl : w;
        if (x1 < x0) x1 = x0;
        for (int64_t iy = 0; iy < h; iy++) {
            float *d = dx + ((b * h + iy) * w) * c;
            int64_t py = iy + pt;
            if (py < 0 || py >= hp) {
                memset(d, 0, (size_t)(w * c) * sizeof *d);
                continue;
            }
            memset(d, 0, (size_t)(x0 * c) * sizeof *d);
            memcpy(d + x0 * c, dxb + (py * wp + x0 + pl) * c, (size_t)((x1 - x0) * c) * sizeof *d);
            memset(d + x1 * c, 0, (size_t)((w - x1) * c) * sizeof *d);
        }
    }
}

// The entry lists' scratch: start [oc + 1] or [oh * ow + 1], one image's entries plus a spare.
static bool sparse_scratch(const graph_conv_geom *g, int64_t **start, sparse_entry **e) {
    int64_t lists = g->oc > g->oh * g->ow ? g->oc : g->oh * g->ow;
    *start = malloc((size_t)(lists + 1) * sizeof **start);
    *e = malloc((size_t)(g->oh * g->ow * g->oc + 1) * sizeof **e);
    if (*start && *e) return true;
    free(*start);
    free(*e);
    return false;
}

static bool bp_filter_sparse(const graph_conv_geom *g, const float *xp, int64_t hp, int64_t wp, const float *dy,
                             float *df) {
    int64_t *start;
    sparse_entry *e;
    if (!sparse_scratch(g, &start, &e)) return false;
    float *acc = aligned_alloc(64, (size_t)(g->oc * g->kh * g->kw * g->c) * sizeof *acc);
    bool ok = acc != NULL;
    if (ok) bpf_sparse(xp, g->n, hp, wp, g->c, dy, g->kh, g->kw, g->oh, g->ow, g->oc, acc, start, e, df);
    free(acc);
    free(start);
    free(e);
    cpu_conv_sparse_calls += ok;
    return ok;
}

static bool bp_input_sparse(const graph_conv_geom *g, const float *f, const float *dy, float *dx) {
    int64_t kh = g->kh, kw = g->kw, c = g->c, oc = g->oc, taps = kh * kw;
    int64_t hp = g->oh + kh - 1, wp = g->ow + kw - 1;
    int64_t *start;
    sparse_entry *e;
    if (!sparse_scratch(g, &start, &e)) return false;
    // 64-byte aligned, as c is a multiple of 16: each vector is one cache line.
    float *ft = aligned_alloc(64, (size_t)(oc * taps * c) * sizeof *ft);
    float *dxb = aligned_alloc(64, (size_t)(hp * wp * c) * sizeof *dxb);
    bool ok = ft && dxb;
    if (ok) {
        for (int64_t t = 0; t < taps; t++)
            for (int64_t i = 0; i < c; i++)
                for (int64_t o = 0; o < oc; o++) ft[(o * taps + t) * c + i] = f[(t * c + i) * oc + o];
        bpi_sparse(dy, g->n, g->h, g->w, c, g->pad_top, g->pad_left, hp, wp, kh, kw, g->oh, g->ow, oc, ft, dxb, start, e, dx);
    }
    free(ft);
    free(dxb);
    free(start);
    free(e);
    cpu_conv_sparse_calls += ok;
    return ok;
}

// dx [n, h, w, c] = the forward pass of dy [n, oh, ow, oc] with the filter turned round
// (ky -> kh-1-ky, kx -> kw-1-kx) and its channels swapped: fr [kh][kw][oc][c]. Needs c % 16.
bool cpu_conv_direct_bp_input_f32(const graph_conv_geom *g, const float *f, const float *dy, float *dx) {
    if (!cpu_conv_direct_applies(g, g->oc) || g->c % 16 != 0 || g->h <= 0 || g->w <= 0) return false;
    if (sparse_applies(g, g->oh + g->kh - 1, g->ow + g->kw - 1, dy, SPARSE_BPI_DENSITY) && bp_input_sparse(g, f, dy, dx))
        return true;
    int64_t kh = g->kh, kw = g->kw, c = g->c, oc = g->oc;
    // 64-byte aligned, as tensors are: each filter vector the inner loop loads is then one
    // cache line, not two.
    float *fr = aligned_alloc(64, (size_t)((kh * kw * c * oc + 15) / 16 * 16) * sizeof *fr);
    if (!fr) return false;
    for (int64_t ky = 0; ky < kh; ky++)
        for (int64_t kx = 0; kx < kw; kx++)
            for (int64_t i = 0; i < c; i++)
                for (int64_t o = 0; o < oc; o++)
                    fr[((ky * kw + kx) * oc + o) * c + i] = f[(((kh - 1 - ky) * kw + (kw - 1 - kx)) * c + i) * oc + o];
    // dy padded so that input position (iy, ix) reads dy rows iy + pt - (kh - 1) .. iy + pt.
    int64_t pt = kh - 1 - g->pad_top, pl = kw - 1 - g->pad_left;
    int64_t hp = g->h + kh - 1, wp = g->w + kw - 1, rlo, rhi, clo, chi;
    float *dyp = pad_input(dy, g->n, g->oh, g->ow, oc, pt, pl, hp, wp, &rlo, &rhi, &clo, &chi);
    if (!dyp) {
        free(fr);
        return false;
    }
    fwd_padded(dyp, g->n, hp, wp, oc, rlo, rhi, clo, chi, fr, kh, kw, g->h, g->w, c, NULL, dx);
    scratch_give(dyp);
    free(fr);
    return true;
}

// The filter gradient of one window row ky over the positions of one image: df[ky] [kq][oc]
// += sum over positions of the window row (kq contiguous inputs) times dy's oc values, for
// window entries [q0, q0 + Q) and channels [oc0, oc0 + 16 J), over the output rows [oy0, oy1)
// and columns [ox0, ox1) (the others read padding only). S streams of accumulators take
// S neighbouring positions, so that small blocks still have enough independent sums to keep
// the multiply-add units busy.
#define DEFINE_BPF_BLOCK(Q, J, S)                                                                 \
    static inline __attribute__((always_inline)) void bpf_block_##Q##_##J(                        \
        const float *xr, int64_t row, int64_t c, int64_t oy0, int64_t oy1, int64_t ox0, int64_t ox1, \
        int64_t ow, const float *dy, int64_t oc, int64_t oc0, int64_t q0, float *dfk) {           \
        v16 acc[S][Q][J];                                                                         \
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++)                                       \
        _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                                       \
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[s][q][j] = (v16){0};              \
        for (int64_t oy = oy0; oy < oy1; oy++) {                                                   \
            const float *xs = xr + oy * row + q0 + ox0 * c;                                       \
            const float *d = dy + (oy * ow + ox0) * oc + oc0;                                     \
            int64_t ox = ox0;                                                                     \
            for (; ox + S <= ox1; ox += S, xs += S * c, d += S * oc) {                            \
                _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) {                             \
                    v16 dv[J];                                                                    \
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) dv[j] = load16(d + s * oc + 16 * j); \
                    _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                           \
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[s][q][j] += xs[s * c + q] * dv[j]; \
                }                                                                                 \
            }                                                                                     \
            for (; ox < ox1; ox++, xs += c, d += oc) {                                            \
                v16 dv[J];                                                                        \
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) dv[j] = load16(d + 16 * j);   \
                _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                               \
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[0][q][j] += xs[q] * dv[j]; \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 8") for (int s = 1; s < S; s++)                                       \
        _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                                       \
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[0][q][j] += acc[s][q][j];         \
        _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                                       \
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) add16(dfk + (q0 + q) * oc + oc0 + 16 * j, acc[0][q][j]); \
    }
DEFINE_BPF_BLOCK(8, 2, 1)
DEFINE_BPF_BLOCK(4, 2, 2)
DEFINE_BPF_BLOCK(2, 2, 4)
DEFINE_BPF_BLOCK(1, 2, 8)
DEFINE_BPF_BLOCK(8, 1, 2)
DEFINE_BPF_BLOCK(4, 1, 4)
DEFINE_BPF_BLOCK(2, 1, 8)
DEFINE_BPF_BLOCK(1, 1, 8)

// The filter gradient of a whole R x Q window (kh = R, kw * c = Q: a small window over few
// channels, an image's first layer) for 16 channels from oc0 over all positions of one image:
// R * Q sums held at once, so each position's dy vector is loaded once for all of them (the
// window-row blocks above would pass over dy once per window row). Positions whose window
// reaches into the padding read its zeros.
#define DEFINE_BPF_WINDOW(R, Q)                                                                   \
    static inline __attribute__((always_inline)) void bpf_window_##R##_##Q(                       \
        const float *xb, int64_t row, int64_t c, int64_t oh, int64_t ow, const float *dy, int64_t oc, \
        int64_t oc0, float *df) {                                                                 \
        v16 acc[R][Q];                                                                            \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                       \
        _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++) acc[r][q] = (v16){0};                 \
        for (int64_t oy = 0; oy < oh; oy++) {                                                     \
            /* A pointer per window row: GCC would keep each (r, q) offset in a register. */      \
            const float *xs[R], *d = dy + oy * ow * oc + oc0;                                     \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) xs[r] = xb + (oy + r) * row;      \
            for (int64_t ox = 0; ox < ow; ox++, d += oc) {                                        \
                v16 dv = load16(d);                                                               \
                _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                             \
                    _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++) acc[r][q] += xs[r][q] * dv; \
                    xs[r] += c;                                                                   \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++)                                       \
        _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++) add16(df + (r * Q + q) * oc + oc0, acc[r][q]); \
    }
DEFINE_BPF_WINDOW(5, 5)
DEFINE_BPF_WINDOW(3, 3)

// Window entries [q0, q0 + Q) read columns q0 / c .. (q0 + Q - 1) / c of a window: the output
// columns whose window puts one of them on a column of x.
#define BPF_BLOCK(Q, J)                                                                           \
    do {                                                                                          \
        int64_t ka = q0 / c, kb = (q0 + (Q) - 1) / c;                                             \
        int64_t ox0 = clo - kb > 0 ? clo - kb : 0, ox1 = chi - ka < ow ? chi - ka : ow;            \
        if (ox1 > ox0) bpf_block_##Q##_##J(xr, row, c, oy0, oy1, ox0, ox1, ow, d, oc, oc0, q0, dfk); \
    } while (0)
#define BPF_CHANNELS(J)                                                                           \
    do {                                                                                          \
        int64_t q0 = 0;                                                                           \
        for (; q0 + 8 <= kq; q0 += 8) BPF_BLOCK(8, J);                                            \
        if (q0 + 4 <= kq) { BPF_BLOCK(4, J); q0 += 4; }                                           \
        if (q0 + 2 <= kq) { BPF_BLOCK(2, J); q0 += 2; }                                           \
        if (q0 < kq) BPF_BLOCK(1, J);                                                             \
    } while (0)

// df [kh][kw][c][oc] (zeroed here) from the padded input and dy, one image at a time so that
// its rows stay in cache across the window rows.
// Window row ky at output row oy reads padded row oy + ky: only output rows whose padded row
// lies in [rlo, rhi) contribute, and only columns whose padded column lies in [clo, chi).
CPU_CLONES __attribute__((optimize("no-predictive-commoning"))) static void bpf_padded(const float *xp, int64_t n, int64_t hp, int64_t wp, int64_t c, int64_t rlo,
                                  int64_t rhi, int64_t clo, int64_t chi, const float *dy, int64_t kh, int64_t kw, int64_t oh, int64_t ow,
                                  int64_t oc, float *df) {
    const int64_t kq = kw * c, row = wp * c;
    memset(df, 0, (size_t)(kh * kq * oc) * sizeof *df);
    for (int64_t b = 0; b < n; b++) {
        const float *d = dy + b * oh * ow * oc;
        if ((kh == 5 && kq == 5) || (kh == 3 && kq == 3)) {
            for (int64_t oc0 = 0; oc0 < oc; oc0 += 16)
                if (kh == 5)
                    bpf_window_5_5(xp + b * hp * row, row, c, oh, ow, d, oc, oc0, df);
                else
                    bpf_window_3_3(xp + b * hp * row, row, c, oh, ow, d, oc, oc0, df);
            continue;
        }
        for (int64_t ky = 0; ky < kh; ky++) {
            const float *xr = xp + (b * hp + ky) * row;
            float *dfk = df + ky * kq * oc;
            int64_t oy0 = rlo - ky > 0 ? rlo - ky : 0, oy1 = rhi - ky < oh ? rhi - ky : oh;
            if (oy1 <= oy0) continue;
            int64_t oc0 = 0;
            for (; oc0 + 32 <= oc; oc0 += 32) BPF_CHANNELS(2);
            if (oc0 < oc) BPF_CHANNELS(1);
        }
    }
}

bool cpu_conv_direct_bp_filter_f32(const graph_conv_geom *g, const float *x, const float *dy, float *df) {
    if (!cpu_conv_direct_applies(g, g->oc)) return false;
    int64_t hp = g->oh + g->kh - 1, wp = g->ow + g->kw - 1, rlo, rhi, clo, chi;
    float *xp = pad_input(x, g->n, g->h, g->w, g->c, g->pad_top, g->pad_left, hp, wp, &rlo, &rhi, &clo, &chi);
    if (!xp) return false;
    if (sparse_applies(g, hp, wp, dy, SPARSE_BPF_DENSITY) && bp_filter_sparse(g, xp, hp, wp, dy, df)) {
        scratch_give(xp);
        return true;
    }
    bpf_padded(xp, g->n, hp, wp, g->c, rlo, rhi, clo, chi, dy, g->kh, g->kw, g->oh, g->ow, g->oc, df);
    scratch_give(xp);
    return true;
}

// ---- max pooling over windows that tile the input, 16 channels at a time ----

bool cpu_max_pool_tiles(const graph_conv_geom *g) {
    return g->kh == g->sh && g->kw == g->sw && g->pad_top == 0 && g->pad_left == 0 && g->h == g->oh * g->kh &&
           g->w == g->ow * g->kw && g->c % 16 == 0 && g->c > 0;
}

// Tiled max pooling over windows of KH x KW, and its gradient; defined twice, for 2 x 2 windows
// (constants) and for any. Macros, not inline functions: GCC lowers the vector operations of a
// function for its own target before inlining it into the clones. The gradient's window loops
// stay loops: GCC 12 turns the unrolled chain of comparisons into scalar ones in the clones.
#define DEFINE_MAX_POOL(NAME, KH, KW)                                                             \
    CPU_CLONES static void NAME(const graph_conv_geom *g, const float *x, float *y) {             \
        const int64_t c = g->c;                                                                   \
        for (int64_t n = 0; n < g->n; n++)                                                        \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    float *o = y + ((n * g->oh + oy) * g->ow + ox) * c;                           \
                    const float *base = x + ((n * g->h + oy * (KH)) * g->w + ox * (KW)) * c;      \
                    for (int64_t k = 0; k < c; k += 16) {                                         \
                        v16 m = (v16){0} - FLT_MAX;   /* NaN never wins, as the general kernel */ \
                        for (int64_t iy = 0; iy < (KH); iy++)                                     \
                            for (int64_t ix = 0; ix < (KW); ix++) {                               \
                                v16 v = load16(base + (iy * g->w + ix) * c + k);                  \
                                v16i gt = v > m;                                                  \
                                m = (v16)(((v16i)v & gt) | ((v16i)m & ~gt));                      \
                            }                                                                     \
                        store16(o + k, m);                                                        \
                    }                                                                             \
                }                                                                                 \
    }
DEFINE_MAX_POOL(max_pool_2x2, 2, 2)
DEFINE_MAX_POOL(max_pool_any, g->kh, g->kw)

void cpu_max_pool_tiled_f32(const graph_conv_geom *g, const float *x, float *y) {
    if (g->kh == 2 && g->kw == 2)
        max_pool_2x2(g, x, y);
    else
        max_pool_any(g, x, y);
}

// The gradient goes to the first input of each window (row-major) equal to its maximum, as
// TensorFlow's CPU kernel; every input is written (0 where no gradient goes). relu: only to
// inputs above 0 (MaxPoolGrad then ReluGrad of x, fused).
#define DEFINE_MAX_POOL_GRAD(NAME, KH, KW)                                                        \
    CPU_CLONES static void NAME(const graph_conv_geom *g, const float *x, const float *y, const float *dy, \
                                bool relu, float *dx) {                                           \
        const int64_t c = g->c;                                                                   \
        for (int64_t n = 0; n < g->n; n++)                                                        \
            for (int64_t oy = 0; oy < g->oh; oy++)                                                \
                for (int64_t ox = 0; ox < g->ow; ox++) {                                          \
                    int64_t at = ((n * g->oh + oy) * g->ow + ox) * c;                             \
                    int64_t i0 = ((n * g->h + oy * (KH)) * g->w + ox * (KW)) * c;                 \
                    for (int64_t k = 0; k < c; k += 16) {                                         \
                        v16 m = load16(y + at + k), d = load16(dy + at + k);                      \
                        v16i done = {0};                                                          \
                        _Pragma("GCC unroll 1") for (int64_t iy = 0; iy < (KH); iy++)             \
                            _Pragma("GCC unroll 1") for (int64_t ix = 0; ix < (KW); ix++) {       \
                                int64_t i = i0 + (iy * g->w + ix) * c + k;                        \
                                v16 xv = load16(x + i);                                           \
                                v16i hit = (xv == m) & ~done;                                     \
                                *(v16iu *)(dx + i) = (v16i)d & hit & (relu ? xv > 0 : ~(v16i){0}); \
                                done |= hit;                                                      \
                            }                                                                     \
                    }                                                                             \
                }                                                                                 \
    }
DEFINE_MAX_POOL_GRAD(max_pool_grad_2x2, 2, 2)
DEFINE_MAX_POOL_GRAD(max_pool_grad_any, g->kh, g->kw)

void cpu_max_pool_grad_tiled_f32(const graph_conv_geom *g, const float *x, const float *y, const float *dy,
                                 bool relu, float *dx) {
    if (g->kh == 2 && g->kw == 2)
        max_pool_grad_2x2(g, x, y, dy, relu, dx);
    else
        max_pool_grad_any(g, x, y, dy, relu, dx);
}
