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
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));

#define PIX_BLOCK 7

// Unaligned loads and stores (macros: a function passing vectors by value would change the
// calling convention between the clones).
#define load16(p) (*(const v16u *)(p))
#define store16(p, v) (*(v16u *)(p) = (v))
#define add16(p, v) (*(v16u *)(p) += (v))

static bool cpu_conv_direct_applies(const graph_conv_geom *g, int64_t oc) {
    return g->sh == 1 && g->sw == 1 && oc % 16 == 0 && oc > 0 && g->c > 0 && g->kh > 0 && g->kw > 0 &&
           g->n > 0 && g->oh > 0 && g->ow > 0;
}

// x [n, h, w, c] into xp [n, hp, wp, c] with zeros around: pt rows above, pl columns left.
static float *pad_input(const float *x, int64_t n, int64_t h, int64_t w, int64_t c, int64_t pt, int64_t pl,
                        int64_t hp, int64_t wp) {
    float *xp = calloc((size_t)(n * hp * wp * c) + 16, sizeof *xp);
    if (!xp) return NULL;
    for (int64_t b = 0; b < n; b++)
        for (int64_t y = 0; y < h; y++) {
            int64_t py = y + pt;
            if (py < 0 || py >= hp) continue;
            int64_t x0 = 0, x1 = w;   // columns that land inside the padded row
            if (pl < 0) x0 = -pl;
            if (x1 + pl > wp) x1 = wp - pl;
            if (x1 > x0)
                memcpy(xp + ((b * hp + py) * wp + x0 + pl) * c, x + ((b * h + y) * w + x0) * c,
                       (size_t)((x1 - x0) * c) * sizeof *x);
        }
    return xp;
}

// One row of output pixels [ox0, ox0 + P) of 16 * J channels from oc0: acc over kh window
// rows of kq = kw * c contiguous inputs each. xr: the padded input at (row oy, column ox0),
// wp * c floats per padded row; f: the filter [kh][kq][oc].
#define DEFINE_FWD_BLOCK(P, J)                                                                      \
    static inline __attribute__((always_inline)) void fwd_block_##P##_##J(const float *xr, int64_t row, int64_t c, int64_t kh, int64_t kq, \
                                           const float *f, int64_t oc, int64_t oc0, float *y) {     \
        v16 acc[P][J];                                                                              \
        _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                                                                 \
            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[p][j] = (v16){0};                                       \
        for (int64_t ky = 0; ky < kh; ky++) {                                                       \
            const float *xk = xr + ky * row, *fk = f + ky * kq * oc + oc0;                          \
            for (int64_t q = 0; q < kq; q++) {                                                      \
                v16 fv[J];                                                                          \
                _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) fv[j] = load16(fk + q * oc + 16 * j);                   \
                _Pragma("GCC unroll 16") for (int p = 0; p < P; p++) {                                                       \
                    float xv = xk[p * c + q];                                                       \
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[p][j] += xv * fv[j];                            \
                }                                                                                   \
            }                                                                                       \
        }                                                                                           \
        _Pragma("GCC unroll 16") for (int p = 0; p < P; p++)                                                                 \
            _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) store16(y + p * oc + oc0 + 16 * j, acc[p][j]);              \
    }
DEFINE_FWD_BLOCK(7, 2)   // PIX_BLOCK
DEFINE_FWD_BLOCK(7, 1)
DEFINE_FWD_BLOCK(1, 2)
DEFINE_FWD_BLOCK(1, 1)

// y [n, oh, ow, oc] from the padded input xp [n, hp, wp, c] and filter f [kh][kw][c][oc].
CPU_CLONES static void fwd_padded(const float *xp, int64_t n, int64_t hp, int64_t wp, int64_t c, const float *f,
                                  int64_t kh, int64_t kw, int64_t oh, int64_t ow, int64_t oc, float *y) {
    const int64_t kq = kw * c, row = wp * c;
    for (int64_t b = 0; b < n; b++)
        for (int64_t oy = 0; oy < oh; oy++) {
            const float *xr = xp + (b * hp + oy) * row;
            float *yr = y + (b * oh + oy) * ow * oc;
            int64_t ox = 0;
            for (; ox + PIX_BLOCK <= ow; ox += PIX_BLOCK) {
                int64_t oc0 = 0;
                for (; oc0 + 32 <= oc; oc0 += 32)
                    fwd_block_7_2(xr + ox * c, row, c, kh, kq, f, oc, oc0, yr + ox * oc);
                if (oc0 < oc) fwd_block_7_1(xr + ox * c, row, c, kh, kq, f, oc, oc0, yr + ox * oc);
            }
            for (; ox < ow; ox++) {
                int64_t oc0 = 0;
                for (; oc0 + 32 <= oc; oc0 += 32) fwd_block_1_2(xr + ox * c, row, c, kh, kq, f, oc, oc0, yr + ox * oc);
                if (oc0 < oc) fwd_block_1_1(xr + ox * c, row, c, kh, kq, f, oc, oc0, yr + ox * oc);
            }
        }
}

bool cpu_conv_direct_fwd_f32(const graph_conv_geom *g, const float *x, const float *f, float *y) {
    if (!cpu_conv_direct_applies(g, g->oc)) return false;
    // Padded so that every window of every output position lies inside.
    int64_t hp = g->oh + g->kh - 1, wp = g->ow + g->kw - 1;
    float *xp = pad_input(x, g->n, g->h, g->w, g->c, g->pad_top, g->pad_left, hp, wp);
    if (!xp) return false;
    fwd_padded(xp, g->n, hp, wp, g->c, f, g->kh, g->kw, g->oh, g->ow, g->oc, y);
    free(xp);
    return true;
}

// dx [n, h, w, c] = the forward pass of dy [n, oh, ow, oc] with the filter turned round
// (ky -> kh-1-ky, kx -> kw-1-kx) and its channels swapped: fr [kh][kw][oc][c]. Needs c % 16.
bool cpu_conv_direct_bp_input_f32(const graph_conv_geom *g, const float *f, const float *dy, float *dx) {
    if (!cpu_conv_direct_applies(g, g->oc) || g->c % 16 != 0 || g->h <= 0 || g->w <= 0) return false;
    int64_t kh = g->kh, kw = g->kw, c = g->c, oc = g->oc;
    float *fr = malloc((size_t)(kh * kw * c * oc) * sizeof *fr);
    if (!fr) return false;
    for (int64_t ky = 0; ky < kh; ky++)
        for (int64_t kx = 0; kx < kw; kx++)
            for (int64_t i = 0; i < c; i++)
                for (int64_t o = 0; o < oc; o++)
                    fr[((ky * kw + kx) * oc + o) * c + i] = f[(((kh - 1 - ky) * kw + (kw - 1 - kx)) * c + i) * oc + o];
    // dy padded so that input position (iy, ix) reads dy rows iy + pt - (kh - 1) .. iy + pt.
    int64_t pt = kh - 1 - g->pad_top, pl = kw - 1 - g->pad_left;
    int64_t hp = g->h + kh - 1, wp = g->w + kw - 1;
    float *dyp = pad_input(dy, g->n, g->oh, g->ow, oc, pt, pl, hp, wp);
    if (!dyp) {
        free(fr);
        return false;
    }
    fwd_padded(dyp, g->n, hp, wp, oc, fr, kh, kw, g->h, g->w, c, dx);
    free(dyp);
    free(fr);
    return true;
}

// The filter gradient of one window row ky over the positions of one image: df[ky] [kq][oc]
// += sum over positions of the window row (kq contiguous inputs) times dy's oc values, for
// window entries [q0, q0 + Q) and channels [oc0, oc0 + 16 J). S streams of accumulators take
// S neighbouring positions, so that small blocks still have enough independent sums to keep
// the multiply-add units busy.
#define DEFINE_BPF_BLOCK(Q, J, S)                                                                 \
    static inline __attribute__((always_inline)) void bpf_block_##Q##_##J(                        \
        const float *xr, int64_t row, int64_t c, int64_t oh, int64_t ow, const float *dy, int64_t oc, \
        int64_t oc0, int64_t q0, float *dfk) {                                                     \
        v16 acc[S][Q][J];                                                                         \
        _Pragma("GCC unroll 8") for (int s = 0; s < S; s++)                                       \
        _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                                       \
        _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[s][q][j] = (v16){0};              \
        for (int64_t oy = 0; oy < oh; oy++) {                                                     \
            const float *xs = xr + oy * row + q0;                                                 \
            const float *d = dy + oy * ow * oc + oc0;                                             \
            int64_t ox = 0;                                                                       \
            for (; ox + S <= ow; ox += S, xs += S * c, d += S * oc) {                             \
                _Pragma("GCC unroll 8") for (int s = 0; s < S; s++) {                             \
                    v16 dv[J];                                                                    \
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) dv[j] = load16(d + s * oc + 16 * j); \
                    _Pragma("GCC unroll 8") for (int q = 0; q < Q; q++)                           \
                    _Pragma("GCC unroll 4") for (int j = 0; j < J; j++) acc[s][q][j] += xs[s * c + q] * dv[j]; \
                }                                                                                 \
            }                                                                                     \
            for (; ox < ow; ox++, xs += c, d += oc) {                                             \
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

#define BPF_CHANNELS(J)                                                                     \
    do {                                                                                    \
        int64_t q0 = 0;                                                                     \
        for (; q0 + 8 <= kq; q0 += 8) bpf_block_8_##J(xr, row, c, oh, ow, d, oc, oc0, q0, dfk); \
        if (q0 + 4 <= kq) { bpf_block_4_##J(xr, row, c, oh, ow, d, oc, oc0, q0, dfk); q0 += 4; } \
        if (q0 + 2 <= kq) { bpf_block_2_##J(xr, row, c, oh, ow, d, oc, oc0, q0, dfk); q0 += 2; } \
        if (q0 < kq) bpf_block_1_##J(xr, row, c, oh, ow, d, oc, oc0, q0, dfk);               \
    } while (0)

// df [kh][kw][c][oc] (zeroed here) from the padded input and dy, one image at a time so that
// its rows stay in cache across the window rows.
CPU_CLONES static void bpf_padded(const float *xp, int64_t n, int64_t hp, int64_t wp, int64_t c, const float *dy,
                                  int64_t kh, int64_t kw, int64_t oh, int64_t ow, int64_t oc, float *df) {
    const int64_t kq = kw * c, row = wp * c;
    memset(df, 0, (size_t)(kh * kq * oc) * sizeof *df);
    for (int64_t b = 0; b < n; b++) {
        const float *d = dy + b * oh * ow * oc;
        for (int64_t ky = 0; ky < kh; ky++) {
            const float *xr = xp + (b * hp + ky) * row;
            float *dfk = df + ky * kq * oc;
            int64_t oc0 = 0;
            for (; oc0 + 32 <= oc; oc0 += 32) BPF_CHANNELS(2);
            if (oc0 < oc) BPF_CHANNELS(1);
        }
    }
}

bool cpu_conv_direct_bp_filter_f32(const graph_conv_geom *g, const float *x, const float *dy, float *df) {
    if (!cpu_conv_direct_applies(g, g->oc)) return false;
    int64_t hp = g->oh + g->kh - 1, wp = g->ow + g->kw - 1;
    float *xp = pad_input(x, g->n, g->h, g->w, g->c, g->pad_top, g->pad_left, hp, wp);
    if (!xp) return false;
    bpf_padded(xp, g->n, hp, wp, g->c, dy, g->kh, g->kw, g->oh, g->ow, g->oc, df);
    free(xp);
    return true;
}

// ---- max pooling over windows that tile the input, 16 channels at a time ----

typedef int32_t v16i __attribute__((vector_size(64)));
typedef int32_t v16iu __attribute__((vector_size(64), aligned(4)));

bool cpu_max_pool_tiles(const graph_conv_geom *g) {
    return g->kh == g->sh && g->kw == g->sw && g->pad_top == 0 && g->pad_left == 0 && g->h == g->oh * g->kh &&
           g->w == g->ow * g->kw && g->c % 16 == 0 && g->c > 0;
}

CPU_CLONES void cpu_max_pool_tiled_f32(const graph_conv_geom *g, const float *x, float *y) {
    const int64_t c = g->c;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++) {
                float *o = y + ((n * g->oh + oy) * g->ow + ox) * c;
                const float *base = x + ((n * g->h + oy * g->kh) * g->w + ox * g->kw) * c;
                for (int64_t k = 0; k < c; k += 16) {
                    v16 m = (v16){0} - FLT_MAX;   // as the general kernel: NaN never wins
                    for (int64_t iy = 0; iy < g->kh; iy++)
                        for (int64_t ix = 0; ix < g->kw; ix++) {
                            v16 v = load16(base + (iy * g->w + ix) * c + k);
                            v16i gt = v > m;
                            m = (v16)(((v16i)v & gt) | ((v16i)m & ~gt));
                        }
                    store16(o + k, m);
                }
            }
}

// The gradient goes to the first input of each window (row-major) equal to its maximum, as
// TensorFlow's CPU kernel; every input is written (0 where no gradient goes).
CPU_CLONES void cpu_max_pool_grad_tiled_f32(const graph_conv_geom *g, const float *x, const float *y,
                                            const float *dy, float *dx) {
    const int64_t c = g->c;
    for (int64_t n = 0; n < g->n; n++)
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t at = ((n * g->oh + oy) * g->ow + ox) * c;
                int64_t i0 = ((n * g->h + oy * g->kh) * g->w + ox * g->kw) * c;
                for (int64_t k = 0; k < c; k += 16) {
                    v16 m = load16(y + at + k), d = load16(dy + at + k);
                    v16i done = {0};
                    for (int64_t iy = 0; iy < g->kh; iy++)
                        for (int64_t ix = 0; ix < g->kw; ix++) {
                            int64_t i = i0 + (iy * g->w + ix) * c + k;
                            v16i hit = (load16(x + i) == m) & ~done;
                            *(v16iu *)(dx + i) = (v16i)d & hit;
                            done |= hit;
                        }
                }
            }
}
