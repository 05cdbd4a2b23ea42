/* CUDA kernels of ScaledDotProductAttention and its gradient (launch_attention.h): tiled, in
 * FlashAttention's manner, so that the Tq x Tk scores never reach memory.
 *
 * A block is kRows threads; each thread owns one row (a query row forward and for dq, a key
 * row for dk and dv) and keeps its accumulators in shared memory. The block walks over tiles of
 * the other side's rows, which it loads into shared memory together; the tile's length is what
 * the 48 KiB of shared memory leave (att_tile). Forward, each query row keeps a running
 * maximum and sum (the online softmax) and rescales its output accumulator when the maximum
 * grows; it writes out and the log-sum-exp. Backward recomputes each probability from the
 * log-sum-exp: one kernel gives dk and dv (a thread per key row, over all query rows that see
 * it), another dq (a thread per query row): no atomics, the same result every run.
 *
 * Rows and the batch index are grid-stride loops. Sums are in T (float accumulates in float,
 * as FlashAttention does). The CPU kernel (executor/cpu/kernels_transformer.c) computes the
 * same values by blocks of GEMMs. */
#include <math.h>
#include <stdint.h>

#include "launch_attention.h"

namespace {

constexpr int kRows = 32;                 // threads (owned rows) per block
constexpr int64_t kShared = 48 * 1024;    // bytes of shared memory a block may use without opting in
constexpr int64_t kMaxTile = 64;
constexpr unsigned kMaxGrid = 65535;

__device__ __forceinline__ float dexp(float v) { return expf(v); }
__device__ __forceinline__ double dexp(double v) { return exp(v); }
__device__ __forceinline__ float dlog(float v) { return logf(v); }
__device__ __forceinline__ double dlog(double v) { return log(v); }

// The keys query row i sees.
__device__ __forceinline__ int64_t keys_seen(bool causal, int64_t i, int64_t Tq, int64_t Tk) {
    if (!causal) return Tk;
    int64_t lim = i + Tk - Tq + 1;
    return lim < 0 ? 0 : lim > Tk ? Tk : lim;
}

// The first query row that sees key j (causal), Tq when none does.
__device__ __forceinline__ int64_t first_query(bool causal, int64_t j, int64_t Tq, int64_t Tk) {
    if (!causal) return 0;
    int64_t i = j - (Tk - Tq);
    return i < 0 ? 0 : i > Tq ? Tq : i;
}

// The tile length that fits: per_row elements a thread owns (kRows of them, each padded by 1),
// per_tile elements a tile row holds. 0 when not even one row fits.
int64_t att_tile(int64_t per_row, int64_t per_tile, size_t es) {
    int64_t left = kShared / (int64_t)es - kRows * (per_row + 1);
    if (left < per_tile) return 0;
    int64_t t = per_tile ? left / per_tile : kMaxTile;
    return t > kMaxTile ? kMaxTile : t;
}

dim3 att_grid(int64_t rows, int64_t batches) {
    int64_t x = (rows + kRows - 1) / kRows;
    return dim3((unsigned)(x < 1 ? 1 : x > kMaxGrid ? kMaxGrid : x),
                (unsigned)(batches < 1 ? 1 : batches > kMaxGrid ? kMaxGrid : batches));
}

template <class T>
__global__ void att_fwd(const T *q, const T *k, const T *v, T *out, T *lse, int64_t batches, int64_t Tq,
                        int64_t Tk, int64_t D, int64_t Dv, T scale, bool causal, int64_t tile) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *acc = reinterpret_cast<T *>(smem_raw);   // [kRows][Dv + 1]
    T *kt = acc + kRows * (Dv + 1);             // [tile][D]
    T *vt = kt + tile * D;                      // [tile][Dv]
    const int t = threadIdx.x;
    T *a = acc + t * (Dv + 1);
    for (int64_t b = blockIdx.y; b < batches; b += gridDim.y) {
        const T *qb = q + b * Tq * D, *kb = k + b * Tk * D, *vb = v + b * Tk * Dv;
        for (int64_t i0 = (int64_t)blockIdx.x * kRows; i0 < Tq; i0 += (int64_t)gridDim.x * kRows) {
            const int64_t i = i0 + t, last = (i0 + kRows < Tq ? i0 + kRows : Tq) - 1;
            const bool active = i < Tq;
            const int64_t lim = active ? keys_seen(causal, i, Tq, Tk) : 0, kend = keys_seen(causal, last, Tq, Tk);
            const T *qi = qb + (active ? i : 0) * D;
            for (int64_t c = 0; c < Dv; c++) a[c] = 0;
            T m = -INFINITY, l = 0;
            for (int64_t j0 = 0; j0 < kend; j0 += tile) {
                const int64_t n = kend - j0 < tile ? kend - j0 : tile;
                __syncthreads();   // the previous tile is no longer read
                for (int64_t e = t; e < n * D; e += kRows) kt[e] = kb[j0 * D + e];
                for (int64_t e = t; e < n * Dv; e += kRows) vt[e] = vb[j0 * Dv + e];
                __syncthreads();
                for (int64_t jj = 0; jj < n && j0 + jj < lim; jj++) {
                    T s = 0;
                    for (int64_t c = 0; c < D; c++) s += qi[c] * kt[jj * D + c];
                    s *= scale;
                    if (s > m) {   // the maximum grows: what was summed shrinks by exp(m - s)
                        const T r = m == -INFINITY ? (T)0 : dexp(m - s);
                        l *= r;
                        for (int64_t c = 0; c < Dv; c++) a[c] *= r;
                        m = s;
                    }
                    // NaN scores stay NaN; a score of -inf weighs 0 (exp(-inf - -inf) would be NaN).
                    const T p = s != s ? s : s == (T)-INFINITY ? (T)0 : dexp(s - m);
                    l += p;
                    for (int64_t c = 0; c < Dv; c++) a[c] += p * vt[jj * Dv + c];
                }
            }
            if (active) {
                const T inv = lim ? (T)1 / l : (T)0;
                for (int64_t c = 0; c < Dv; c++) out[(b * Tq + i) * Dv + c] = a[c] * inv;
                lse[b * Tq + i] = lim ? m + dlog(l) : (T)-INFINITY;
            }
            __syncthreads();
        }
    }
}

// dk and dv: a thread per key row j, over the query rows that see it, in tiles of q, dout,
// lse and rowsum(dout * out).
template <class T>
__global__ void att_bwd_kv(const T *dout, const T *q, const T *k, const T *v, const T *out, const T *lse, T *dk,
                           T *dv, int64_t batches, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, T scale,
                           bool causal, int64_t tile) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *acc = reinterpret_cast<T *>(smem_raw);   // [kRows][D + Dv + 1]: dk, then dv
    T *qt = acc + kRows * (D + Dv + 1);         // [tile][D]
    T *dt = qt + tile * D;                      // [tile][Dv]
    T *lt = dt + tile * Dv;                     // [tile]: lse
    T *di = lt + tile;                          // [tile]: rowsum(dout * out)
    const int t = threadIdx.x;
    T *adk = acc + t * (D + Dv + 1), *adv = adk + D;
    for (int64_t b = blockIdx.y; b < batches; b += gridDim.y) {
        const T *qb = q + b * Tq * D, *db = dout + b * Tq * Dv, *ob = out + b * Tq * Dv;
        const T *kb = k + b * Tk * D, *vb = v + b * Tk * Dv;
        for (int64_t j0 = (int64_t)blockIdx.x * kRows; j0 < Tk; j0 += (int64_t)gridDim.x * kRows) {
            const int64_t j = j0 + t;
            const bool active = j < Tk;
            const T *kj = kb + (active ? j : 0) * D, *vj = vb + (active ? j : 0) * Dv;
            const int64_t start = first_query(causal, j0, Tq, Tk);   // the block's first key's
            const int64_t mine = active ? first_query(causal, j, Tq, Tk) : Tq;
            for (int64_t c = 0; c < D + Dv; c++) adk[c] = 0;
            for (int64_t i0 = start; i0 < Tq; i0 += tile) {
                const int64_t n = Tq - i0 < tile ? Tq - i0 : tile;
                __syncthreads();
                for (int64_t e = t; e < n * D; e += kRows) qt[e] = qb[i0 * D + e];
                for (int64_t e = t; e < n * Dv; e += kRows) dt[e] = db[i0 * Dv + e];
                for (int64_t r = t; r < n; r += kRows) {
                    lt[r] = lse[b * Tq + i0 + r];
                    T s = 0;
                    for (int64_t c = 0; c < Dv; c++) s += db[(i0 + r) * Dv + c] * ob[(i0 + r) * Dv + c];
                    di[r] = s;
                }
                __syncthreads();
                for (int64_t r = mine > i0 ? mine - i0 : 0; r < n && active; r++) {
                    T s = 0, dp = 0;
                    for (int64_t c = 0; c < D; c++) s += qt[r * D + c] * kj[c];
                    for (int64_t c = 0; c < Dv; c++) dp += dt[r * Dv + c] * vj[c];
                    const T p = dexp(s * scale - lt[r]);
                    const T ds = p * (dp - di[r]) * scale;
                    for (int64_t c = 0; c < Dv; c++) adv[c] += p * dt[r * Dv + c];
                    for (int64_t c = 0; c < D; c++) adk[c] += ds * qt[r * D + c];
                }
            }
            if (active) {
                for (int64_t c = 0; c < D; c++) dk[(b * Tk + j) * D + c] = adk[c];
                for (int64_t c = 0; c < Dv; c++) dv[(b * Tk + j) * Dv + c] = adv[c];
            }
            __syncthreads();
        }
    }
}

// dq: a thread per query row, over the keys it sees, in tiles of k and v.
template <class T>
__global__ void att_bwd_q(const T *dout, const T *q, const T *k, const T *v, const T *out, const T *lse, T *dq,
                          int64_t batches, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv, T scale, bool causal,
                          int64_t tile) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T *acc = reinterpret_cast<T *>(smem_raw);   // [kRows][D + 1]
    T *kt = acc + kRows * (D + 1);              // [tile][D]
    T *vt = kt + tile * D;                      // [tile][Dv]
    const int t = threadIdx.x;
    T *a = acc + t * (D + 1);
    for (int64_t b = blockIdx.y; b < batches; b += gridDim.y) {
        const T *kb = k + b * Tk * D, *vb = v + b * Tk * Dv;
        for (int64_t i0 = (int64_t)blockIdx.x * kRows; i0 < Tq; i0 += (int64_t)gridDim.x * kRows) {
            const int64_t i = i0 + t, last = (i0 + kRows < Tq ? i0 + kRows : Tq) - 1;
            const bool active = i < Tq;
            const int64_t row = b * Tq + (active ? i : 0);
            const int64_t lim = active ? keys_seen(causal, i, Tq, Tk) : 0, kend = keys_seen(causal, last, Tq, Tk);
            const T *qi = q + row * D, *doi = dout + row * Dv, *oi = out + row * Dv;
            const T l = lse[row];
            T di = 0;
            for (int64_t c = 0; c < Dv; c++) di += doi[c] * oi[c];
            for (int64_t c = 0; c < D; c++) a[c] = 0;
            for (int64_t j0 = 0; j0 < kend; j0 += tile) {
                const int64_t n = kend - j0 < tile ? kend - j0 : tile;
                __syncthreads();
                for (int64_t e = t; e < n * D; e += kRows) kt[e] = kb[j0 * D + e];
                for (int64_t e = t; e < n * Dv; e += kRows) vt[e] = vb[j0 * Dv + e];
                __syncthreads();
                for (int64_t jj = 0; jj < n && j0 + jj < lim; jj++) {
                    T s = 0, dp = 0;
                    for (int64_t c = 0; c < D; c++) s += qi[c] * kt[jj * D + c];
                    for (int64_t c = 0; c < Dv; c++) dp += doi[c] * vt[jj * Dv + c];
                    const T p = dexp(s * scale - l);
                    const T ds = p * (dp - di) * scale;
                    for (int64_t c = 0; c < D; c++) a[c] += ds * kt[jj * D + c];
                }
            }
            if (active)
                for (int64_t c = 0; c < D; c++) dq[row * D + c] = a[c];
            __syncthreads();
        }
    }
}

}  // namespace

extern "C" bool cuda_attention_fits(bool f64, int64_t D, int64_t Dv) {
    size_t es = f64 ? sizeof(double) : sizeof(float);
    return att_tile(Dv, D + Dv, es) > 0 && att_tile(D + Dv, D + Dv + 2, es) > 0 && att_tile(D, D + Dv, es) > 0;
}

extern "C" cudaError_t cuda_launch_attention(bool f64, const void *q, const void *k, const void *v, void *out,
                                             void *lse, int64_t batches, int64_t Tq, int64_t Tk, int64_t D,
                                             int64_t Dv, double scale, bool causal, cudaStream_t stream) {
    if (batches <= 0 || Tq <= 0) return cudaSuccess;
    size_t es = f64 ? sizeof(double) : sizeof(float);
    int64_t tile = att_tile(Dv, D + Dv, es);
    if (tile <= 0) return cudaErrorInvalidValue;
    size_t shm = (size_t)(kRows * (Dv + 1) + tile * (D + Dv)) * es;
    dim3 grid = att_grid(Tq, batches);
    if (f64)
        att_fwd<double><<<grid, kRows, shm, stream>>>((const double *)q, (const double *)k, (const double *)v,
                                                      (double *)out, (double *)lse, batches, Tq, Tk, D, Dv, scale,
                                                      causal, tile);
    else
        att_fwd<float><<<grid, kRows, shm, stream>>>((const float *)q, (const float *)k, (const float *)v,
                                                     (float *)out, (float *)lse, batches, Tq, Tk, D, Dv,
                                                     (float)scale, causal, tile);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_launch_attention_grad(bool f64, const void *dout, const void *q, const void *k,
                                                  const void *v, const void *out, const void *lse, void *dq,
                                                  void *dk, void *dv, int64_t batches, int64_t Tq, int64_t Tk,
                                                  int64_t D, int64_t Dv, double scale, bool causal,
                                                  cudaStream_t stream) {
    if (batches <= 0) return cudaSuccess;
    size_t es = f64 ? sizeof(double) : sizeof(float);
    int64_t tkv = att_tile(D + Dv, D + Dv + 2, es), tq = att_tile(D, D + Dv, es);
    if (tkv <= 0 || tq <= 0) return cudaErrorInvalidValue;
    size_t shm_kv = (size_t)(kRows * (D + Dv + 1) + tkv * (D + Dv + 2)) * es;
    size_t shm_q = (size_t)(kRows * (D + 1) + tq * (D + Dv)) * es;
    if (Tk > 0) {
        dim3 grid = att_grid(Tk, batches);
        if (f64)
            att_bwd_kv<double><<<grid, kRows, shm_kv, stream>>>(
                (const double *)dout, (const double *)q, (const double *)k, (const double *)v, (const double *)out,
                (const double *)lse, (double *)dk, (double *)dv, batches, Tq, Tk, D, Dv, scale, causal, tkv);
        else
            att_bwd_kv<float><<<grid, kRows, shm_kv, stream>>>(
                (const float *)dout, (const float *)q, (const float *)k, (const float *)v, (const float *)out,
                (const float *)lse, (float *)dk, (float *)dv, batches, Tq, Tk, D, Dv, (float)scale, causal, tkv);
        cudaError_t err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    if (Tq > 0) {
        dim3 grid = att_grid(Tq, batches);
        if (f64)
            att_bwd_q<double><<<grid, kRows, shm_q, stream>>>(
                (const double *)dout, (const double *)q, (const double *)k, (const double *)v, (const double *)out,
                (const double *)lse, (double *)dq, batches, Tq, Tk, D, Dv, scale, causal, tq);
        else
            att_bwd_q<float><<<grid, kRows, shm_q, stream>>>(
                (const float *)dout, (const float *)q, (const float *)k, (const float *)v, (const float *)out,
                (const float *)lse, (float *)dq, batches, Tq, Tk, D, Dv, (float)scale, causal, tq);
    }
    return cudaGetLastError();
}
