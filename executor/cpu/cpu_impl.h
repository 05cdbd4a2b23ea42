/* Helpers shared by the CPU kernels. */
#ifndef DG_CPU_IMPL_H
#define DG_CPU_IMPL_H

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "exec_kernel_impl.h"
#include "exec_philox_impl.h"
#include "nn_impl.h"

#define IN(i) (ctx->inputs[i])
#define F32(t) ((float *)(t)->data)
#define F64(t) ((double *)(t)->data)

// Hot loops are compiled for AVX-512, AVX2 and baseline x86-64, picked at load time, so one
// binary is fast on any x86-64 machine it is carried to.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(DG_SANITIZE_BUILD)
#define CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CPU_CLONES
#endif

// Row reductions in CPU_LANES independent lanes, combined pairwise at the end: independent
// lanes the compiler turns into vector instructions in each clone of the caller, where one
// running sum is a chain of dependent adds (four cycles each). Sums run in float64.
#define CPU_LANES 8
static inline double cpu_lanes_total(const double *p) {
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}
// cpu_sum_float / cpu_sum_double: the sum of x[0..n) in float64. cpu_max_float / _double: the
// largest of x[0..n), n >= 1 (a NaN is skipped unless it is x[0], as `x > m ? x : m` does).
#define CPU_ROW_REDUCERS(T)                                                                        \
    static inline double cpu_sum_##T(const T *x, int64_t n) {                                      \
        double p[CPU_LANES] = {0};                                                                 \
        int64_t i = 0;                                                                             \
        for (; i + CPU_LANES <= n; i += CPU_LANES)                                                 \
            for (int j = 0; j < CPU_LANES; j++) p[j] += (double)x[i + j];                          \
        for (int j = 0; i < n; i++, j++) p[j] += (double)x[i];                                     \
        return cpu_lanes_total(p);                                                                 \
    }                                                                                              \
    static inline T cpu_max_##T(const T *x, int64_t n) {                                           \
        T p[CPU_LANES];                                                                            \
        for (int j = 0; j < CPU_LANES; j++) p[j] = x[0];                                           \
        int64_t i = 0;                                                                             \
        for (; i + CPU_LANES <= n; i += CPU_LANES)                                                 \
            for (int j = 0; j < CPU_LANES; j++) p[j] = x[i + j] > p[j] ? x[i + j] : p[j];          \
        for (int j = 0; i < n; i++, j++) p[j] = x[i] > p[j] ? x[i] : p[j];                         \
        T m = p[0];                                                                                \
        for (int j = 1; j < CPU_LANES; j++) m = p[j] > m ? p[j] : m;                               \
        return m;                                                                                  \
    }
CPU_ROW_REDUCERS(float)
CPU_ROW_REDUCERS(double)

// Direct float32 convolutions (conv_direct.c) for stride 1 and output channels in multiples of
// 16 (the input gradient also needs input channels in multiples of 16): false when they do not
// apply or their scratch cannot be had, and the caller takes the im2col path.
// What the forward pass does to each output before storing it: adds bias [oc] (NULL: none),
// then takes max(v, 0) when relu (NaN becomes 0, as the Relu kernel). NULL: nothing.
typedef struct cpu_conv_epilogue {
    const float *bias;
    bool relu;
} cpu_conv_epilogue;
bool cpu_conv_direct_fwd_f32(const graph_conv_geom *g, const float *x, const float *f, const cpu_conv_epilogue *ep,
                             float *y);
bool cpu_conv_direct_bp_input_f32(const graph_conv_geom *g, const float *f, const float *dy, float *dx);
bool cpu_conv_direct_bp_filter_f32(const graph_conv_geom *g, const float *x, const float *dy, float *df);
// How many gradients this thread has computed with the kernels for a mostly-zero dy (the tests
// check which kernels ran).
extern _Thread_local int64_t cpu_conv_sparse_calls;
// Max pooling and its gradient over windows that tile the input (stride = window, no padding,
// sizes divisible) with channels in multiples of 16 (cpu_max_pool_tiles), float32.
bool cpu_max_pool_tiles(const graph_conv_geom *g);
void cpu_max_pool_tiled_f32(const graph_conv_geom *g, const float *x, float *y);
// relu: the gradient reaches only inputs above 0 (MaxPoolGrad then ReluGrad of x, fused).
void cpu_max_pool_grad_tiled_f32(const graph_conv_geom *g, const float *x, const float *y, const float *dy, bool relu,
                                 float *dx);

// The state for kernels that need none.
#define NO_STATE ((void *)1)

static inline void *cpu_no_state(const dg_node *n, const exec_env *env, dg_status *st) {
    (void)n;
    (void)env;
    (void)st;
    return NO_STATE;
}

// Reads an int32/int64 vector tensor into dims; false if it is not one or too long.
bool cpu_read_dims(const dg_tensor *t, int64_t *dims, int *rank, int max_rank);
// Row-major strides of shape s into out (elements).
void cpu_strides(const dg_shape *s, int64_t *out);
// Strides (elements) of shape src seen in dst's rank: 0 where src broadcasts. False if the
// shapes do not broadcast.
bool cpu_broadcast_strides(const dg_shape *src, const dg_shape *dst, int64_t *strides);
// Broadcasts src (shape aligned to the right of dst's rank, 1s broadcast) into dst.
bool cpu_broadcast_into(const dg_tensor *src, dg_tensor *dst, dg_status *st);
// Sums src into dst whose shape src broadcasts from (dst zeroed first).
bool cpu_sum_into(const dg_tensor *src, dg_tensor *dst, dg_status *st);

extern const exec_kernel_def cpu_state_kernels[];
extern const int cpu_n_state_kernels;
extern const exec_kernel_def cpu_math_kernels[];
extern const int cpu_n_math_kernels;
extern const exec_kernel_def cpu_nn_kernels[];
extern const int cpu_n_nn_kernels;
extern const exec_kernel_def cpu_sendrecv_kernels[];
extern const int cpu_n_sendrecv_kernels;
// Kernel groups kept in their own files register themselves.
void cpu_register_collective_kernels(void);   // kernels_collective.c
void cpu_register_sync_kernels(void);         // kernels_sync.c
void cpu_register_local_reduce_kernels(void); // kernels_local_reduce.c
void cpu_register_sparse_kernels(void);       // kernels_sparse.c
void cpu_register_transformer_kernels(void);  // kernels_transformer.c
void cpu_register_16_kernels(void);           // kernels_16.c: 16-bit floats through float32
// Runs a float32 kernel's compute on ctx's inputs with each 16-bit float input widened to
// float32, each float32 output rounded once to the node's 16-bit dtype (kernels_16.c).
bool cpu_compute_via_f32(bool (*compute)(void *state, exec_ctx *ctx), void *state, exec_ctx *ctx);
// Checks and shapes shared by the CPU and GPU kernels of an op (cpu_register.c).
// The reduced-axis mask: every axis when all, else axes[0..n_axes) (negative ones count from
// the end) against rank. false with ctx->st naming the axis.
bool cpu_axes_mask(exec_ctx *ctx, bool all, const int64_t *axes, int n_axes, int rank, uint32_t *mask);
// The shape x reduces to over mask: kept dims, with 1s where reduced if keep.
dg_shape cpu_reduced_shape(const dg_shape *x, uint32_t mask, bool keep);
// MatMul of a and b (transposed as ta, tb): M x K times K x N. false with ctx->st set.
bool cpu_matmul_dims(exec_ctx *ctx, const dg_tensor *a, const dg_tensor *b, bool ta, bool tb,
                     int64_t *M, int64_t *N, int64_t *K);
// BatchMatMulV2 of x and y: the output's shape, the matrices' sizes and, for each of the
// output's batch indices, where x's and y's matrices start (cpu_bmm_offsets).
typedef struct cpu_bmm_plan {
    int64_t M, N, K, lda, ldb;   // op(x) M x K, op(y) K x N; lda, ldb: x's and y's last dimension
    int64_t batches;             // output matrices
    dg_shape out;                // [batch..., M, N]
    int nb;                      // the output's batch rank
    int64_t bdims[DG_MAX_RANK], xs[DG_MAX_RANK], ys[DG_MAX_RANK];   // batch dims; strides in matrices
} cpu_bmm_plan;
// Checks x and y (rank >= 2, one float dtype, inner dimensions equal, batch dimensions that
// broadcast) and fills p. false with ctx->st naming the shapes.
bool cpu_bmm_plan_make(exec_ctx *ctx, const dg_tensor *x, const dg_tensor *y, bool adj_x, bool adj_y,
                       cpu_bmm_plan *p);
// The element offsets of x's and y's matrices for output matrix b.
void cpu_bmm_offsets(const cpu_bmm_plan *p, int64_t b, int64_t *xo, int64_t *yo);
// LayerNorm's and LayerNormGrad's inputs: x of rank >= 1 (rows x C), gamma and beta (either may
// be NULL: not checked) [C], dy x's shape, mean and rstd one value a row, all of x's dtype.
// false with ctx->st naming the input.
bool cpu_layer_norm_check(exec_ctx *ctx, const dg_tensor *x, const dg_tensor *gamma, const dg_tensor *beta,
                          const dg_tensor *dy, const dg_tensor *mean, const dg_tensor *rstd, int64_t *rows,
                          int64_t *C);
// GELU and its gradient over n elements (gelu.c), the erf form or with tanh_form the tanh one,
// in float64 (float32 rounded once).
void cpu_gelu_f32(const float *x, float *y, int64_t n, bool tanh_form);
void cpu_gelu_f64(const double *x, double *y, int64_t n, bool tanh_form);
void cpu_gelu_grad_f32(const float *dy, const float *x, float *dx, int64_t n, bool tanh_form);
void cpu_gelu_grad_f64(const double *dy, const double *x, double *dx, int64_t n, bool tanh_form);
// ScaledDotProductAttention's sizes: batches (the product of the batch dimensions), the query
// and key lengths, q's and v's widths, and the outputs' shapes.
typedef struct cpu_attention_dims {
    int64_t batches, Tq, Tk, D, Dv;
    dg_shape out, lse;   // [..., Tq, Dv] and [..., Tq]
    // The boolean mask, broadcast to [..., Tq, Tk] (NULL: none): element (b, i, j) at
    // mask[cpu_attention_mask_base(d, b) + i * mask_row + j * mask_col].
    const uint8_t *mask;
    int64_t mask_row, mask_col;
    int n_batch_dims;
    int64_t batch_dims[DG_MAX_RANK], mask_batch_stride[DG_MAX_RANK];
} cpu_attention_dims;
// Checks q, k, v, the mask (NULL: none) and (where not NULL, for the gradient) dout, out and
// lse: one float dtype, one rank >= 2, equal batch dimensions, q and k of one width, k and v of
// one length, a bool mask broadcasting to [..., Tq, Tk], dout and out of the output's shape, lse
// of [..., Tq]. false with ctx->st naming the input and the sizes.
bool cpu_attention_check(exec_ctx *ctx, const dg_tensor *q, const dg_tensor *k, const dg_tensor *v,
                         const dg_tensor *mask, const dg_tensor *dout, const dg_tensor *out, const dg_tensor *lse,
                         cpu_attention_dims *d);
// The mask's offset of batch index b (row-major over the batch dimensions).
int64_t cpu_attention_mask_base(const cpu_attention_dims *d, int64_t b);
// The attention's scale: the attribute, or 1 / sqrt(D) where it is 0.
double cpu_attention_scale(double attr, int64_t D);
// Slice's "begin" and "size" attributes (size -1 where absent). false with st set.
bool cpu_slice_attrs(const dg_node *n, int64_t *begin, int64_t *size, int *count, dg_status *st);
// Reshape (a view of input 0) and Shape (int64 host output): they touch no element, so the GPU
// kernels of these ops use them too (kernels_array.c).
bool cpu_reshape_compute(void *state, exec_ctx *ctx);
bool cpu_shape_compute(void *state, exec_ctx *ctx);
// The same for kernels that touch no element (kernels_state.c).
bool cpu_placeholder_compute(void *state, exec_ctx *ctx);
bool cpu_identity_compute(void *state, exec_ctx *ctx);
bool cpu_noop_compute(void *state, exec_ctx *ctx);
bool cpu_is_init_compute(void *state, exec_ctx *ctx);
extern const exec_kernel_def cpu_array_kernels[];
extern const int cpu_n_array_kernels;
extern const exec_kernel_def cpu_conv_kernels[];
extern const int cpu_n_conv_kernels;
extern const exec_kernel_def cpu_index_kernels[];   // kernels_index.c
extern const int cpu_n_index_kernels;
// Transpose's output shape and, per output dimension, the input's stride (elements), from its
// inputs (x, perm); false with ctx->st naming the node (kernels_index.c; the GPU kernel too).
bool cpu_transpose_plan(exec_ctx *ctx, dg_shape *out, int64_t *src_strides);
// The checks and output shapes of Tile (x, multiples), Select (cond, t, e; strides[0..2]: the
// element strides of cond, t and e per output dimension, 0 where one is broadcast) and OneHot
// (indices, depth, on_value, off_value; the depth is the last output dimension). They read only
// shapes and the int inputs (multiples, depth), never a float value; false with ctx->st set
// (kernels_index.c; the GPU kernels too).
bool cpu_tile_shape(exec_ctx *ctx, dg_shape *out);
bool cpu_select_plan(exec_ctx *ctx, dg_shape *out, int64_t (*strides)[DG_MAX_RANK]);
bool cpu_one_hot_shape(exec_ctx *ctx, dg_shape *out);

// ---- embeddings and sparse updates (kernels_sparse.c), shared with the GPU kernels ----
// The checks of Gather (params, indices), UnsortedSegmentSum (data, segment_ids, num_segments),
// ScatterAdd/Sub/Update (ref, indices, updates), SparseApplyAdagrad (var, accum, lr, grad,
// indices), SparseApplyAdam (var, m, v, 6 scalars, grad, indices) and DynamicStitch (N int32
// indices, N data), in the CPU kernels' order, every index included, and the output shapes of
// those with an output of their own. They read shapes, dtypes and the int inputs, never a
// float value; false with ctx->st set.
bool cpu_gather_shape(exec_ctx *ctx, dg_shape *out);
bool cpu_segment_sum_shape(exec_ctx *ctx, dg_shape *out);
bool cpu_scatter_check(exec_ctx *ctx);
bool cpu_sparse_adagrad_check(exec_ctx *ctx);
bool cpu_sparse_adam_check(exec_ctx *ctx);
// SparseApplyMomentum's inputs 0..4 are SparseApplyAdagrad's (cpu_sparse_adagrad_check);
// momentum, input 5, is read as lr is.
bool cpu_dynamic_stitch_shape(exec_ctx *ctx, dg_shape *out);

// ---- convolutional networks (kernels_conv.c), shared with the GPU kernels ----
// C = alpha op(A) op(B) + beta C, row-major, float32 or float64 (t), split over the intra-op
// threads when large (gemm.c says what runs it).
void cpu_gemm(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
              int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
// The same without the products that visit only A's nonzeros (gemm_sparse.c): for callers
// whose A has zeros in a known pattern the dense GEMM handles better (the attention's causal
// probabilities, small blocks where listing the nonzeros costs more than it saves).
void cpu_gemm_dense(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc);
// The vector instructions of x86-64, narrowest first.
typedef enum cpu_isa { CPU_ISA_BASELINE, CPU_ISA_SSE41, CPU_ISA_AVX2, CPU_ISA_AVX512 } cpu_isa;
const char *cpu_isa_name(cpu_isa i);
// What the CPU offers and what runs the GEMM (gemm.c).
typedef struct cpu_gemm_info {
    char model[64];                 // the CPU's brand string
    cpu_isa cpu;                    // the widest vectors the CPU offers
    cpu_isa cap;                    // the widest the GEMM may use (DG_MAX_CPU_ISA)
    bool capped;                    // cap < cpu
    bool has_vnni, has_bf16, has_fp16, has_amx;
    char f32_provider[32], f32_kernel[48];   // e.g. "oneDNN 2.6.3", "avx512_core_vnni"
    cpu_isa f32_isa;
    bool f32_openblas;              // DG_GEMM=openblas
    bool f32_sparse;                // cpu_gemm_sparse_f32 tried first (DG_GEMM_SPARSE=0: never)
    char f64_provider[32], f64_kernel[48];   // e.g. "OpenBLAS", "SkylakeX"
    cpu_isa f64_isa;
} cpu_gemm_info;
// Filled once per process. Returns: borrowed, static.
const cpu_gemm_info *cpu_gemm_get_info(void);
// Runs fn(ctx, i, n') for i in [0, n') on gemm.c's pool of intra-op threads and the calling
// thread, n' <= n being the pieces the pool can take (its threads plus one), each piece once,
// and returns when all are done. False, with nothing run, when n < 2 or the pool is running
// another thread's job: the caller then does the work itself.
bool cpu_parallel_for(int n, void (*fn)(void *ctx, int i, int n), void *ctx);
// Piece i of n of [0, total): [*lo, *hi), pieces of whole 16s (vectors and kernel blocks).
void cpu_piece_range(int64_t total, int i, int n, int64_t *lo, int64_t *hi);
// How many pieces an M x N x K product splits into over the intra-op threads (1: none; at least
// 2^21 multiply-adds, pieces of at least 16 rows or columns), and whether by rows of C (else by
// columns, when it has few rows).
int cpu_gemm_split_pieces(int64_t M, int64_t N, int64_t K);
bool cpu_gemm_split_by_rows(int64_t M, int64_t N, int n);
// C = op(A) B in float32 (alpha 1, beta 0) from A's nonzero entries alone, when A is mostly
// zero and B finite, with vectors up to cap where it picks them (gemm_sparse.c; its kernels'
// clones pick theirs from the CPU itself); false when that does not apply, C then unwritten or,
// for a B found not finite on the way, written with something else (the dense GEMM writes it
// again).
// cpu_gemm_sparse_calls counts the products so run, in every thread.
bool cpu_gemm_sparse_f32(bool ta, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, const float *B,
                         int64_t ldb, float *C, int64_t ldc, cpu_isa cap);
extern _Atomic int64_t cpu_gemm_sparse_calls;
// Turns cpu_gemm's use of cpu_gemm_sparse_f32 off or back on, for the whole process (benches
// and tests set it between products).
void cpu_gemm_set_sparse(bool on);
// The 16-bit floats (t: bfloat16 or float16) to and from float32, n values (gemm16.c; loops the
// compiler vectorises).
void cpu_f16s_to_f32(dg_dtype t, const uint16_t *s, float *d, int64_t n);
void cpu_f32_to_f16s(dg_dtype t, const float *s, uint16_t *d, int64_t n);
// C = op(A) op(B), all three bfloat16 or all float16 (t), row-major, sums in float32 rounded
// once into C (gemm16.c). False when out of memory.
bool cpu_gemm16(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const void *A, int64_t lda,
                const void *B, int64_t ldb, void *C, int64_t ldc);
// What runs t's products, in words ("oneDNN 2.6.3 brg:avx512_core_bf16", "through float32").
const char *cpu_gemm16_summary(dg_dtype t);
// The cores this process may run on (its affinity mask), at most 64.
int exec_cpu_default_threads(void);
// The threads a large GEMM is split over (exec_cpu_set_threads, exec_cpu_impl.h).
int exec_cpu_threads(void);
// The state of every window op's kernel: its graph_window (free() destroys it).
void *cpu_window_create(const dg_node *n, const exec_env *env, dg_status *st);
// The geometry of this run of a window op (Conv2D, its two gradients, the pools and their
// gradients) from its inputs, every shape checked; false with ctx->st naming the node.
bool cpu_window_geom(exec_ctx *ctx, const graph_window *w, graph_conv_geom *g);
// Dropout's state: its rate and random stream (one per node, shared by concurrent steps).
typedef struct cpu_dropout_state {
    pthread_mutex_t mu;
    exec_philox rng;
    double rate;
} cpu_dropout_state;
void *cpu_dropout_create(const dg_node *n, const exec_env *env, dg_status *st);
void cpu_dropout_destroy(void *state);
// Reads Dropout's training input (a bool scalar in host memory).
bool cpu_dropout_training(exec_ctx *ctx, bool *training);
// The next n mask values of type t: 1 / (1 - rate) where kept, 0 where dropped; all 1 when
// not training (the stream does not advance then).
void cpu_dropout_draw(cpu_dropout_state *d, dg_dtype t, bool training, void *mask, int64_t n);

#endif
