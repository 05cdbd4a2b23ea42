/* Launchers of the GPU math kernels (math.cu): elementwise ops with broadcasting, activations
 * and their gradients, BiasAddGrad's column sums, AddN, ClipByValue, Cast and the optimizer
 * updates. Each only queues work on `stream` and returns the launch error; every pointer is
 * device memory of the stream's GPU, scalar operands (learning rates, clip bounds) included:
 * the kernels read them on the device. Element counts of 0 queue nothing.
 * Usable from C and CUDA C++. */
#ifndef DG_EXEC_CUDA_LAUNCH_MATH_H
#define DG_EXEC_CUDA_LAUNCH_MATH_H

#include <stdbool.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum cuda_math_dtype { CUDA_MATH_F32, CUDA_MATH_F64 } cuda_math_dtype;

// Binary ops; the *_GRAD ones take (a, b) in the CPU kernels' order: ReluGrad(dy, y),
// SigmoidGrad(y, dy), TanhGrad(y, dy), SqrtGrad(y, dy), RsqrtGrad(y, dy), GeluGrad(dy, x).
typedef enum cuda_binop {
    CUDA_BIN_ADD, CUDA_BIN_SUB, CUDA_BIN_MUL, CUDA_BIN_DIV, CUDA_BIN_MAX, CUDA_BIN_MIN,
    CUDA_BIN_RELU_GRAD, CUDA_BIN_SIGMOID_GRAD, CUDA_BIN_TANH_GRAD, CUDA_BIN_SQRT_GRAD,
    CUDA_BIN_POW,   // in double for float32 too, as the CPU kernel
    CUDA_BIN_RSQRT_GRAD,
    CUDA_BIN_GELU_GRAD, CUDA_BIN_GELU_TANH_GRAD,   // in double, as the CPU kernel
} cuda_binop;

typedef enum cuda_unop {
    CUDA_UN_RELU, CUDA_UN_SIGMOID, CUDA_UN_TANH, CUDA_UN_EXP, CUDA_UN_LOG, CUDA_UN_SQUARE,
    CUDA_UN_SQRT, CUDA_UN_NEG, CUDA_UN_RSQRT, CUDA_UN_ERF,
    CUDA_UN_GELU, CUDA_UN_GELU_TANH,   // in double, as the CPU kernel
    CUDA_UN_SIN, CUDA_UN_COS,
} cuda_unop;

// How an operand of a fast-path binary op is indexed for output element i of an output seen
// as [n / inner, inner]: FULL x[i], SCALAR x[0], ROW x[i % inner] (a row vector repeated down
// the rows), COL x[i / inner] (a column vector repeated across the columns).
typedef enum cuda_operand {
    CUDA_OPND_FULL, CUDA_OPND_SCALAR, CUDA_OPND_ROW, CUDA_OPND_COL,
} cuda_operand;

#define CUDA_MATH_MAX_RANK 8

// A general broadcast: output dims (row-major) and each operand's element strides per output
// dim (0 where the operand is broadcast).
typedef struct cuda_bcast {
    int rank;                              // 1..CUDA_MATH_MAX_RANK
    int64_t dims[CUDA_MATH_MAX_RANK];
    int64_t a_strides[CUDA_MATH_MAX_RANK];
    int64_t b_strides[CUDA_MATH_MAX_RANK];
} cuda_bcast;

// out[i] = op(a[ia], b[ib]) for i < n, operands indexed as ka and kb say; inner > 0 (the row
// length for ROW and COL operands, ignored otherwise).
cudaError_t cuda_launch_binary(cuda_math_dtype dt, cuda_binop op, const void *a, cuda_operand ka,
                               const void *b, cuda_operand kb, void *out, int64_t n,
                               int64_t inner, cudaStream_t stream);
// The same through a general broadcast; n is the product of bc->dims.
cudaError_t cuda_launch_binary_strided(cuda_math_dtype dt, cuda_binop op, const void *a,
                                       const void *b, void *out, int64_t n,
                                       const cuda_bcast *bc, cudaStream_t stream);
// y[i] = op(x[i]).
cudaError_t cuda_launch_unary(cuda_math_dtype dt, cuda_unop op, const void *x, void *y, int64_t n,
                              cudaStream_t stream);
// y = xs[0] + xs[1] + ... + xs[n_inputs - 1], added left to right. Borrows xs for the call.
cudaError_t cuda_launch_addn(cuda_math_dtype dt, const void *const *xs, int n_inputs, void *y,
                             int64_t n, cudaStream_t stream);

// Column sums of dy seen as [rows, cols] into out[cols] (zeros when rows is 0), accumulated
// in double. scratch holds cuda_bias_grad_scratch_elems(rows, cols) doubles (may be NULL when
// that is 0) and must stay allocated until the work has run (stream order suffices).
int64_t cuda_bias_grad_scratch_elems(int64_t rows, int64_t cols);
cudaError_t cuda_launch_bias_grad(cuda_math_dtype dt, const void *dy, void *out, int64_t rows,
                                  int64_t cols, double *scratch, cudaStream_t stream);

// ClipByValue: y[i] = x < lo ? lo : x > hi ? hi : x; a bound marked scalar is read at [0],
// otherwise at [i].
cudaError_t cuda_launch_clip(cuda_math_dtype dt, const void *x, const void *lo, bool lo_scalar,
                             const void *hi, bool hi_scalar, void *y, int64_t n,
                             cudaStream_t stream);
// ClipByValueGrad: dx = dy where lo <= x <= hi, dlo = dy where x < lo, dhi = dy where x > hi,
// 0 elsewhere.
cudaError_t cuda_launch_clip_grad(cuda_math_dtype dt, const void *dy, const void *x,
                                  const void *lo, bool lo_scalar, const void *hi, bool hi_scalar,
                                  void *dx, void *dlo, void *dhi, int64_t n, cudaStream_t stream);
// The float types Cast converts between on a GPU.
typedef enum cuda_float_kind { CUDA_FLOAT_F32, CUDA_FLOAT_F64, CUDA_FLOAT_BF16, CUDA_FLOAT_F16 } cuda_float_kind;
// Converts n elements between float types (copies when from == to), bit for bit as the CPU's
// Cast: to a 16-bit float through float32 (from float64 that rounds twice), to nearest with
// ties to even, NaN kept quiet with its leading payload bits, too large to infinity; from a
// 16-bit float exactly.
cudaError_t cuda_launch_cast(cuda_float_kind from, const void *x, cuda_float_kind to, void *y,
                             int64_t n, cudaStream_t stream);

// ---- in-place updates of a variable's buffer; scalars are one-element device buffers ----
// var -= alpha[0] * delta
cudaError_t cuda_launch_apply_gd(cuda_math_dtype dt, void *var, const void *alpha,
                                 const void *delta, int64_t n, cudaStream_t stream);
// accum = accum * momentum + grad; var -= nesterov ? grad * lr + accum * momentum * lr
//                                                  : accum * lr
cudaError_t cuda_launch_apply_momentum(cuda_math_dtype dt, void *var, void *accum, const void *lr,
                                       const void *grad, const void *momentum, bool nesterov,
                                       int64_t n, cudaStream_t stream);
// Adam as the CPU kernel computes it (lr_t in double from the scalars, then the moments).
cudaError_t cuda_launch_apply_adam(cuda_math_dtype dt, void *var, void *m, void *v,
                                   const void *beta1_power, const void *beta2_power,
                                   const void *lr, const void *beta1, const void *beta2,
                                   const void *epsilon, const void *grad, int64_t n,
                                   cudaStream_t stream);
// var += val (var -= val when subtract).
cudaError_t cuda_launch_assign_update(cuda_math_dtype dt, void *var, const void *val,
                                      bool subtract, int64_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
