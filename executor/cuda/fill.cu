/* Fill kernel: dst[i] = value. The first .cu of the CUDA device; it keeps nvcc in the build
 * and backs exec_cuda_fill_f32. */
#include "cuda_impl.h"

namespace {

__global__ void fill_f32(float *dst, int64_t n, float value) {
    int64_t stride = (int64_t)blockDim.x * gridDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = value;
}

}  // namespace

extern "C" cudaError_t cuda_launch_fill_f32(float *dst, int64_t n, float value,
                                            cudaStream_t stream) {
    if (n <= 0) return cudaSuccess;
    const int threads = 256;
    // Grid-stride loop: a bounded grid covers any n.
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks > 65535) blocks = 65535;
    fill_f32<<<(unsigned)blocks, threads, 0, stream>>>(dst, n, value);
    return cudaGetLastError();
}
