/* Gradient functions registered with the op definitions (graph/op_defs.c). Each builds the
 * gradient of one op type as graph nodes; see graph_grad_fn in graph_impl.h. */
#ifndef DG_GRAD_IMPL_H
#define DG_GRAD_IMPL_H

#include "graph_impl.h"

#define GRAD_FNS(X)                                                                  \
    X(Identity) X(MatMul) X(Add) X(Sub) X(Mul) X(Div) X(Maximum) X(Minimum) X(AddN)  \
    X(BiasAdd) X(Relu) X(Sigmoid) X(Tanh) X(Exp) X(Log) X(Square) X(Sqrt) X(Neg) X(Rsqrt) X(Erf) X(Sin) X(Cos) X(Gelu) X(BatchMatMulV2) \
    X(ClipByValue) X(Softmax) X(LogSoftmax) X(SoftmaxCrossEntropyWithLogits)         \
    X(SparseSoftmaxCrossEntropyWithLogits) X(Sum) X(Mean) X(Max) X(Reshape) X(Cast)  \
    X(Concat) X(Split) X(Slice) X(Fill) X(BroadcastTo) X(SumToShape) X(Pow) X(Select)

// Gradients flow through float32, float64 and the 16-bit floats (an op computing in a 16-bit
// float has its gradient in it; a Cast's gradient casts back); not through integers or bool.
static inline bool graph_dtype_differentiable(dg_dtype t) { return dg_dtype_is_float(t) || dg_dtype_is_float16_family(t); }

#define DECLARE_GRAD(op) bool grad_##op(dg_graph *g, dg_node *n, const dg_output *dy, dg_output *dx);
GRAD_FNS(DECLARE_GRAD)
#undef DECLARE_GRAD

#endif
