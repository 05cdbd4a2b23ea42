/* CUDA kernels of convolutional networks (launch_conv.h). One thread per output element,
 * grid-stride loops. The gradients gather: a thread owns one input element and visits the
 * output positions whose windows hold it, in row-major order, which is the order the CPU's
 * scatter adds them in. */
#include <stdint.h>

#include "launch_conv.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

unsigned grid_for(int64_t n) {
    int64_t b = (n + kThreads - 1) / kThreads;
    if (b < 1) b = 1;
    if (b > kMaxBlocks) b = kMaxBlocks;
    return (unsigned)b;
}

#define GRID_LOOP(i, n) \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n); i += (int64_t)gridDim.x * blockDim.x)

// The output positions [lo, hi) along one axis whose windows hold input index i.
__device__ __forceinline__ void covering(int64_t i, int64_t pad, int64_t k, int64_t s, int64_t out,
                                         int64_t *lo, int64_t *hi) {
    int64_t p = i + pad;   // the index in the padded input
    // o covers p when o * s <= p < o * s + k.
    int64_t first = p - k + 1 <= 0 ? 0 : (p - k + 1 + s - 1) / s;
    int64_t last = p / s;   // p >= 0
    *lo = first;
    *hi = last + 1 < out ? last + 1 : out;
}

// The clipped window of output position (oy, ox).
__device__ __forceinline__ void window(const cuda_window g, int64_t oy, int64_t ox, int64_t *y0, int64_t *y1,
                                       int64_t *x0, int64_t *x1) {
    *y0 = oy * g.sh - g.pad_top;
    *x0 = ox * g.sw - g.pad_left;
    *y1 = *y0 + g.kh < g.h ? *y0 + g.kh : g.h;
    *x1 = *x0 + g.kw < g.w ? *x0 + g.kw : g.w;
    if (*y0 < 0) *y0 = 0;
    if (*x0 < 0) *x0 = 0;
}

template <class T>
__global__ void im2col_kernel(const cuda_window g, const T *x, T *col) {
    const int64_t K = g.kh * g.kw * g.c, total = g.n * g.oh * g.ow * K;
    GRID_LOOP(i, total) {
        int64_t row = i / K, k = i % K;
        int64_t c = k % g.c, kx = (k / g.c) % g.kw, ky = k / (g.c * g.kw);
        int64_t ox = row % g.ow, oy = (row / g.ow) % g.oh, n = row / (g.ow * g.oh);
        int64_t iy = oy * g.sh - g.pad_top + ky, ix = ox * g.sw - g.pad_left + kx;
        col[i] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? x[((n * g.h + iy) * g.w + ix) * g.c + c] : T(0);
    }
}

template <class T>
__global__ void col2im_kernel(const cuda_window g, const T *col, T *dx) {
    const int64_t K = g.kh * g.kw * g.c, total = g.n * g.h * g.w * g.c;
    GRID_LOOP(i, total) {
        int64_t c = i % g.c, ix = (i / g.c) % g.w, iy = (i / (g.c * g.w)) % g.h, n = i / (g.c * g.w * g.h);
        int64_t oy0, oy1, ox0, ox1;
        covering(iy, g.pad_top, g.kh, g.sh, g.oh, &oy0, &oy1);
        covering(ix, g.pad_left, g.kw, g.sw, g.ow, &ox0, &ox1);
        T acc = 0;
        for (int64_t oy = oy0; oy < oy1; oy++)
            for (int64_t ox = ox0; ox < ox1; ox++) {
                int64_t ky = iy + g.pad_top - oy * g.sh, kx = ix + g.pad_left - ox * g.sw;
                acc += col[((n * g.oh + oy) * g.ow + ox) * K + (ky * g.kw + kx) * g.c + c];
            }
        dx[i] = acc;
    }
}

template <class T>
__global__ void pool_kernel(const cuda_window g, bool max, const T *x, T *y) {
    const int64_t total = g.n * g.oh * g.ow * g.c;
    GRID_LOOP(i, total) {
        int64_t c = i % g.c, ox = (i / g.c) % g.ow, oy = (i / (g.c * g.ow)) % g.oh, n = i / (g.c * g.ow * g.oh);
        int64_t y0, y1, x0, x1;
        window(g, oy, ox, &y0, &y1, &x0, &x1);
        T acc = 0;
        bool first = true;
        for (int64_t iy = y0; iy < y1; iy++)
            for (int64_t ix = x0; ix < x1; ix++) {
                T v = x[((n * g.h + iy) * g.w + ix) * g.c + c];
                if (max) {
                    acc = first || v > acc ? v : acc;
                    first = false;
                } else {
                    acc += v;
                }
            }
        y[i] = max ? acc : acc * (T(1) / T((y1 - y0) * (x1 - x0)));
    }
}

template <class T>
__global__ void max_pool_grad_kernel(const cuda_window g, const T *x, const T *y, const T *dy, T *dx) {
    const int64_t total = g.n * g.h * g.w * g.c;
    GRID_LOOP(i, total) {
        int64_t c = i % g.c, ix = (i / g.c) % g.w, iy = (i / (g.c * g.w)) % g.h, n = i / (g.c * g.w * g.h);
        int64_t oy0, oy1, ox0, ox1;
        covering(iy, g.pad_top, g.kh, g.sh, g.oh, &oy0, &oy1);
        covering(ix, g.pad_left, g.kw, g.sw, g.ow, &ox0, &ox1);
        T acc = 0;
        for (int64_t oy = oy0; oy < oy1; oy++)
            for (int64_t ox = ox0; ox < ox1; ox++) {
                int64_t at = ((n * g.oh + oy) * g.ow + ox) * g.c + c;
                T m = y[at];
                // Is this element the first in its window equal to the maximum?
                int64_t y0, y1, x0, x1;
                window(g, oy, ox, &y0, &y1, &x0, &x1);
                int64_t hit = -1;
                for (int64_t wy = y0; wy < y1 && hit < 0; wy++)
                    for (int64_t wx = x0; wx < x1; wx++)
                        if (x[((n * g.h + wy) * g.w + wx) * g.c + c] == m) {
                            hit = wy * g.w + wx;
                            break;
                        }
                if (hit == iy * g.w + ix) acc += dy[at];
            }
        dx[i] = acc;
    }
}

template <class T>
__global__ void avg_pool_grad_kernel(const cuda_window g, const T *dy, T *dx) {
    const int64_t total = g.n * g.h * g.w * g.c;
    GRID_LOOP(i, total) {
        int64_t c = i % g.c, ix = (i / g.c) % g.w, iy = (i / (g.c * g.w)) % g.h, n = i / (g.c * g.w * g.h);
        int64_t oy0, oy1, ox0, ox1;
        covering(iy, g.pad_top, g.kh, g.sh, g.oh, &oy0, &oy1);
        covering(ix, g.pad_left, g.kw, g.sw, g.ow, &ox0, &ox1);
        T acc = 0;
        for (int64_t oy = oy0; oy < oy1; oy++)
            for (int64_t ox = ox0; ox < ox1; ox++) {
                int64_t y0, y1, x0, x1;
                window(g, oy, ox, &y0, &y1, &x0, &x1);
                acc += dy[((n * g.oh + oy) * g.ow + ox) * g.c + c] * (T(1) / T((y1 - y0) * (x1 - x0)));
            }
        dx[i] = acc;
    }
}

template <class T>
__global__ void mul_kernel(const T *a, const T *b, T *y, int64_t n) {
    GRID_LOOP(i, n) y[i] = a[i] * b[i];
}

}  // namespace

extern "C" cudaError_t cuda_launch_im2col(bool f64, const cuda_window *g, const void *x, void *col,
                                          cudaStream_t stream) {
    int64_t total = g->n * g->oh * g->ow * g->kh * g->kw * g->c;
    if (total == 0) return cudaSuccess;
    if (f64)
        im2col_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(*g, (const double *)x, (double *)col);
    else
        im2col_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(*g, (const float *)x, (float *)col);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_col2im(bool f64, const cuda_window *g, const void *col, void *dx,
                                          cudaStream_t stream) {
    int64_t total = g->n * g->h * g->w * g->c;
    if (total == 0) return cudaSuccess;
    if (f64)
        col2im_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(*g, (const double *)col, (double *)dx);
    else
        col2im_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(*g, (const float *)col, (float *)dx);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_pool(bool f64, bool max, const cuda_window *g, const void *x, void *y,
                                        cudaStream_t stream) {
    int64_t total = g->n * g->oh * g->ow * g->c;
    if (total == 0) return cudaSuccess;
    if (f64)
        pool_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(*g, max, (const double *)x, (double *)y);
    else
        pool_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(*g, max, (const float *)x, (float *)y);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_max_pool_grad(bool f64, const cuda_window *g, const void *x, const void *y,
                                                 const void *dy, void *dx, cudaStream_t stream) {
    int64_t total = g->n * g->h * g->w * g->c;
    if (total == 0) return cudaSuccess;
    if (f64)
        max_pool_grad_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(
            *g, (const double *)x, (const double *)y, (const double *)dy, (double *)dx);
    else
        max_pool_grad_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(
            *g, (const float *)x, (const float *)y, (const float *)dy, (float *)dx);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_avg_pool_grad(bool f64, const cuda_window *g, const void *dy, void *dx,
                                                 cudaStream_t stream) {
    int64_t total = g->n * g->h * g->w * g->c;
    if (total == 0) return cudaSuccess;
    if (f64)
        avg_pool_grad_kernel<double><<<grid_for(total), kThreads, 0, stream>>>(*g, (const double *)dy, (double *)dx);
    else
        avg_pool_grad_kernel<float><<<grid_for(total), kThreads, 0, stream>>>(*g, (const float *)dy, (float *)dx);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_mul_n(bool f64, const void *a, const void *b, void *y, int64_t n,
                                         cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    if (f64)
        mul_kernel<double><<<grid_for(n), kThreads, 0, stream>>>((const double *)a, (const double *)b, (double *)y, n);
    else
        mul_kernel<float><<<grid_for(n), kThreads, 0, stream>>>((const float *)a, (const float *)b, (float *)y, n);
    return cudaGetLastError();
}
