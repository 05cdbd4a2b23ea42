/* Registers the GPU kernels. Tensors are host memory at this stage (exec_alloc_output
 * allocates on the host), so a GPU kernel could not honour its placement yet: none is
 * registered, the placer finds no (op, "GPU") pair and soft placement keeps ops on CPU.
 * GPU kernels arrive with device-resident tensors, as tables passed to
 * exec_register_kernels() like executor/cpu/cpu_register.c. */
#include "cuda_device.h"

void exec_cuda_register(void) {}
