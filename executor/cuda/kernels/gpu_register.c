/* Registers the GPU kernels (called once, from executor/kernel_registry.c). */
#include "exec_kernel_registry_impl.h"
#include "gpu_impl.h"

void exec_cuda_register(void) {
    exec_register_kernels(gpu_state_kernels, gpu_n_state_kernels);
    exec_register_kernels(gpu_sendrecv_kernels, gpu_n_sendrecv_kernels);
    exec_register_kernels(gpu_math_kernels, gpu_n_math_kernels);
    exec_register_kernels(gpu_nn_kernels, gpu_n_nn_kernels);
    exec_register_kernels(gpu_index_kernels, gpu_n_index_kernels);
    exec_register_kernels(gpu_sparse_kernels, gpu_n_sparse_kernels);
    exec_register_kernels(gpu_conv_kernels, gpu_n_conv_kernels);
    exec_register_kernels(gpu_collective_kernels, gpu_n_collective_kernels);
    exec_register_kernels(gpu_transformer_kernels, gpu_n_transformer_kernels);
}
