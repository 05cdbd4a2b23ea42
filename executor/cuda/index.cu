/* CUDA kernels for Tile, Select and OneHot (launch_index.h). Each thread writes whole output
 * elements, found from the output's linear index, so results are exact copies of input
 * elements (no arithmetic on the values) and do not depend on the launch shape.
 *
 * Tile and Select first drop the output's dims of size 1 and merge neighbouring dims that
 * every operand walks contiguously, as the strided box copy of nn.cu does: a Select without
 * broadcasting, or a Tile whose multiples are all 1, becomes one flat dim and needs no division
 * per element. All loops are grid-stride loops over a bounded grid. */
#include <stdint.h>

#include "launch_index.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
constexpr int kMaxDims = CUDA_INDEX_MAX_RANK;

unsigned grid_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > kMaxBlocks) b = kMaxBlocks;
    return (unsigned)b;
}

// ---- Tile ----

// The output's dims od[] with x's dims xd[] (od a multiple of xd) and x's strides xs[].
struct TileBox {
    int n;
    int64_t od[kMaxDims], xd[kMaxDims], xs[kMaxDims];
};

// B = the tiling without output dims of 1, untiled neighbours merged; *n the output's element
// count. Returns -1 for a bad rank or dims, 0 for an empty output.
int make_tile(int rank, const int64_t *x_dims, const int64_t *out_dims, TileBox *B, int64_t *n) {
    if (rank < 0 || rank > kMaxDims) return -1;
    int64_t xs[kMaxDims];
    int64_t step = 1;
    for (int d = rank - 1; d >= 0; d--) {
        xs[d] = step;
        step *= x_dims[d] > 0 ? x_dims[d] : 1;
    }
    B->n = 0;
    *n = 1;
    bool empty = false;
    for (int d = 0; d < rank; d++) {
        if (out_dims[d] < 0 || x_dims[d] < 0) return -1;
        if (out_dims[d] == 0) {
            empty = true;
            continue;
        }
        if (x_dims[d] == 0 || out_dims[d] % x_dims[d] != 0) return -1;
        *n *= out_dims[d];
        if (out_dims[d] == 1) continue;
        const int k = B->n - 1;
        // x is row-major, so an untiled dim after an untiled one continues it contiguously.
        if (k >= 0 && B->od[k] == B->xd[k] && out_dims[d] == x_dims[d]) {
            B->od[k] *= out_dims[d];
            B->xd[k] = B->od[k];
            B->xs[k] = xs[d];
            continue;
        }
        B->od[B->n] = out_dims[d];
        B->xd[B->n] = x_dims[d];
        B->xs[B->n] = xs[d];
        B->n++;
    }
    return empty ? 0 : 1;
}

template <class T>
__global__ void tile_k(const T *x, T *out, TileBox B, int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t idx = i, off = 0;
        for (int k = B.n - 1; k >= 0; k--) {
            const int64_t q = k > 0 ? idx / B.od[k] : 0;
            const int64_t c = idx - q * B.od[k];
            off += (c < B.xd[k] ? c : c % B.xd[k]) * B.xs[k];
            idx = q;
        }
        out[i] = x[off];
    }
}

// ---- Select ----

// The output's dims d[] with the strides of the condition, t and e.
struct SelectBox {
    int n;
    int64_t d[kMaxDims], sc[kMaxDims], st[kMaxDims], se[kMaxDims];
};

// B = dims[0..rank) without its 1s, neighbours merged where all three operands step over them
// contiguously (broadcast neighbours, stride 0, merge too); *n the element count. Returns -1
// for a bad rank or dim, 0 for an empty output.
int make_select(int rank, const int64_t *dims, const int64_t *sc, const int64_t *st,
                const int64_t *se, SelectBox *B, int64_t *n) {
    if (rank < 0 || rank > kMaxDims) return -1;
    B->n = 0;
    *n = 1;
    bool empty = false;
    for (int d = 0; d < rank; d++) {
        if (dims[d] < 0) return -1;
        if (dims[d] == 0) empty = true;
        if (dims[d] <= 1) continue;
        *n *= dims[d];
        const int k = B->n - 1;
        if (k >= 0 && B->sc[k] == sc[d] * dims[d] && B->st[k] == st[d] * dims[d] &&
            B->se[k] == se[d] * dims[d]) {
            B->d[k] *= dims[d];
            B->sc[k] = sc[d];
            B->st[k] = st[d];
            B->se[k] = se[d];
            continue;
        }
        B->d[B->n] = dims[d];
        B->sc[B->n] = sc[d];
        B->st[B->n] = st[d];
        B->se[B->n] = se[d];
        B->n++;
    }
    return empty ? 0 : 1;
}

template <class T>
__global__ void select_k(const uint8_t *cond, const T *t, const T *e, T *out, SelectBox B,
                         int64_t n) {
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        int64_t idx = i, oc = 0, ot = 0, oe = 0;
        for (int k = B.n - 1; k >= 0; k--) {
            const int64_t q = k > 0 ? idx / B.d[k] : 0;
            const int64_t c = idx - q * B.d[k];
            oc += c * B.sc[k];
            ot += c * B.st[k];
            oe += c * B.se[k];
            idx = q;
        }
        out[i] = cond[oc] ? t[ot] : e[oe];
    }
}

// ---- OneHot ----

template <class T, class I>
__global__ void one_hot_k(const I *indices, int64_t depth, const T *on, const T *off, T *out,
                          int64_t n) {
    const T v_on = *on, v_off = *off;
    const int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int64_t r = i / depth;
        out[i] = (int64_t)indices[r] == i - r * depth ? v_on : v_off;
    }
}

template <class T>
cudaError_t tile_t(const void *x, void *out, const TileBox &B, int64_t n, cudaStream_t stream) {
    // Nothing tiled: a plain copy.
    if (B.n == 0 || (B.n == 1 && B.od[0] == B.xd[0] && B.xs[0] == 1))
        return cudaMemcpyAsync(out, x, (size_t)n * sizeof(T), cudaMemcpyDeviceToDevice, stream);
    tile_k<T><<<grid_for(n), kThreads, 0, stream>>>((const T *)x, (T *)out, B, n);
    return cudaGetLastError();
}

}  // namespace

// ---- launchers ----

extern "C" cudaError_t cuda_launch_tile(bool f64, const void *x, const int64_t *x_dims, void *out,
                                        const int64_t *out_dims, int rank, cudaStream_t stream) {
    TileBox B;
    int64_t n;
    const int got = make_tile(rank, x_dims, out_dims, &B, &n);
    if (got < 0) return cudaErrorInvalidValue;
    if (got == 0) return cudaSuccess;
    return f64 ? tile_t<double>(x, out, B, n, stream) : tile_t<float>(x, out, B, n, stream);
}

extern "C" cudaError_t cuda_launch_select(bool f64, const uint8_t *cond,
                                          const int64_t *cond_strides, const void *t,
                                          const int64_t *t_strides, const void *e,
                                          const int64_t *e_strides, void *out, int rank,
                                          const int64_t *dims, cudaStream_t stream) {
    SelectBox B;
    int64_t n;
    const int got = make_select(rank, dims, cond_strides, t_strides, e_strides, &B, &n);
    if (got < 0) return cudaErrorInvalidValue;
    if (got == 0) return cudaSuccess;
    const unsigned grid = grid_for(n);
    if (f64)
        select_k<double><<<grid, kThreads, 0, stream>>>(cond, (const double *)t, (const double *)e,
                                                        (double *)out, B, n);
    else
        select_k<float><<<grid, kThreads, 0, stream>>>(cond, (const float *)t, (const float *)e,
                                                       (float *)out, B, n);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_one_hot(bool f64, const void *indices, bool idx64,
                                           int64_t n_indices, int64_t depth, const void *on_value,
                                           const void *off_value, void *out,
                                           cudaStream_t stream) {
    if (n_indices < 0 || depth < 0) return cudaErrorInvalidValue;
    if (n_indices == 0 || depth == 0) return cudaSuccess;
    const int64_t n = n_indices * depth;
    const unsigned grid = grid_for(n);
#define ONE_HOT(T, I)                                                                    \
    one_hot_k<T, I><<<grid, kThreads, 0, stream>>>((const I *)indices, depth, (const T *)on_value, \
                                                   (const T *)off_value, (T *)out, n)
    if (f64) {
        if (idx64) ONE_HOT(double, int64_t);
        else ONE_HOT(double, int32_t);
    } else {
        if (idx64) ONE_HOT(float, int64_t);
        else ONE_HOT(float, int32_t);
    }
#undef ONE_HOT
    return cudaGetLastError();
}
