/* GPU kernels for MatMul (cuBLAS), elementwise ops with broadcasting, activations and their
 * gradients, BiasAdd(Grad), AddN, ClipByValue(Grad), Cast between float32 and float64, and the
 * in-place optimizer updates (ApplyGradientDescent, ApplyMomentum, ApplyAdam, AssignAdd,
 * AssignSub). Each checks its inputs as the CPU kernel of its op does
 * (executor/cpu/kernels_math.c, kernels_state.c) and queues the work on its device's stream
 * through the launchers of math.cu. Comparisons stay on the CPU: their bool outputs would be
 * host memory and the placer keeps them there.
 *
 * Scalar inputs (learning rates, momentum, beta powers, clip bounds) are float tensors and so
 * device memory: their pointers go to the device, which reads them; the host never does. */
#include <stdlib.h>
#include <string.h>

#include "cpu_impl.h"
#include "exec_kernel_registry_impl.h"
#include "gpu_impl.h"
#include "launch_math.h"

#define IN(i) (ctx->inputs[i])

_Static_assert(DG_MAX_RANK <= CUDA_MATH_MAX_RANK, "cuda_bcast holds DG_MAX_RANK dims");

static cuda_math_dtype cdt(dg_dtype t) { return t == DG_FLOAT64 ? CUDA_MATH_F64 : CUDA_MATH_F32; }

// Inputs [0, n) are float tensors of one dtype in dev's memory (gpu_prepare_inputs).
static bool prepare(exec_ctx *ctx, exec_cuda_device *dev, int n) {
    if (ctx->n_inputs < n)
        return exec_fail(ctx, DG_INTERNAL, "%d inputs, the kernel reads %d", ctx->n_inputs, n);
    return gpu_prepare_inputs(ctx, dev, n);
}

// A scalar operand (read on the device at element 0) must have an element.
static bool need_scalar(exec_ctx *ctx, int i, const char *what) {
    if (IN(i)->n_elements >= 1) return true;
    char b[128];
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d (%s) must be a scalar, got shape %s", i,
                     what, dg_shape_str(&IN(i)->shape, b, sizeof b));
}

// Input i must have as many elements as input 0 (the variable).
static bool need_var_size(exec_ctx *ctx, int i, const char *what) {
    if (IN(i)->n_elements == IN(0)->n_elements) return true;
    char a[128], b[128];
    return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d (%s) has shape %s, variable has %s", i,
                     what, dg_shape_str(&IN(i)->shape, a, sizeof a),
                     dg_shape_str(&IN(0)->shape, b, sizeof b));
}

// ---- state ----
typedef struct math_state {
    exec_cuda_device *dev;   // borrowed; first member (gpu_impl.h)
    int op;                  // cuda_binop or cuda_unop
    bool ta, tb;             // MatMul transpose_a, transpose_b
    bool nesterov;           // ApplyMomentum use_nesterov
    dg_dtype to;             // Cast
} math_state;

// Returns: new, freed by the kernel's destroy (free); NULL with st set.
static math_state *state_new(const dg_node *n, const exec_env *env, dg_status *st) {
    exec_cuda_device *dev = gpu_dev_create(n, env, st);
    if (!dev) return NULL;
    math_state *s = calloc(1, sizeof *s);
    if (!s) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "%s kernel: %zu bytes", n->op->name, sizeof *s);
        return NULL;
    }
    s->dev = dev;
    return s;
}

// ---- MatMul ----
static void *matmul_create(const dg_node *n, const exec_env *env, dg_status *st) {
    math_state *s = state_new(n, env, st);
    if (!s) return NULL;
    dg_node_attr_bool(n, "transpose_a", &s->ta);
    dg_node_attr_bool(n, "transpose_b", &s->tb);
    return s;
}

static bool matmul_compute(void *state, exec_ctx *ctx) {
    math_state *s = state;
    exec_cuda_device *dev = s->dev;
    if (!prepare(ctx, dev, 2)) return false;
    dg_tensor *a = IN(0), *b = IN(1);
    int64_t M, N, K;
    if (!cpu_matmul_dims(ctx, a, b, s->ta, s->tb, &M, &N, &K)) return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, a->dtype, dg_shape2(M, N));
    if (!o) return false;
    if (M == 0 || N == 0) return true;
    if (K == 0)   // an empty sum: zeros (all-zero bytes are 0.0), as the CPU kernel gives
        return gpu_check_launch(ctx, dev, cudaMemsetAsync(o->data, 0, o->nbytes, dev->stream),
                                "cudaMemsetAsync");
    // Row-major leading dimensions: the stored row lengths, as the CPU's cblas call passes.
    int64_t lda = a->shape.dims[1], ldb = b->shape.dims[1];
    bool ok = gpu_gemm(ctx, dev, a->dtype, s->ta, s->tb, M, N, K, a->data, lda, b->data, ldb, o->data, N);
    if (!ok) dg_status_prepend(ctx->st, "MatMul");
    return ok;
}

// ---- binary elementwise ops with broadcasting ----
static void *bin_create(const dg_node *n, const exec_env *env, dg_status *st) {
    static const struct {
        const char *name;
        cuda_binop op;
    } map[] = {{"Add", CUDA_BIN_ADD},
               {"Sub", CUDA_BIN_SUB},
               {"Mul", CUDA_BIN_MUL},
               {"Div", CUDA_BIN_DIV},
               {"Maximum", CUDA_BIN_MAX},
               {"Minimum", CUDA_BIN_MIN},
               {"ReluGrad", CUDA_BIN_RELU_GRAD},
               {"SigmoidGrad", CUDA_BIN_SIGMOID_GRAD},
               {"TanhGrad", CUDA_BIN_TANH_GRAD},
               {"SqrtGrad", CUDA_BIN_SQRT_GRAD},
               {"Pow", CUDA_BIN_POW},
               {"RsqrtGrad", CUDA_BIN_RSQRT_GRAD},
               {"GeluGrad", CUDA_BIN_GELU_GRAD}};
    bool approximate = false;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].name, n->op->name) == 0) {
            math_state *s = state_new(n, env, st);
            if (s) s->op = (int)map[i].op;
            if (s && map[i].op == CUDA_BIN_GELU_GRAD && dg_node_attr_bool(n, "approximate", &approximate) &&
                approximate)
                s->op = (int)CUDA_BIN_GELU_TANH_GRAD;
            return s;
        }
    dg_status_setf(st, DG_INTERNAL, "no binary GPU kernel for %s", n->op->name);
    return NULL;
}

// The output's dims with each operand's element strides (0 where it is broadcast), after
// dropping dims of size 1 and merging neighbours that both operands walk contiguously: an
// outer dim of stride s_o merges with the next (size d, stride s) when s_o == s * d for both.
typedef struct bin_plan {
    int rank;   // 0 when the output has one element
    int64_t dims[DG_MAX_RANK], sa[DG_MAX_RANK], sb[DG_MAX_RANK];
} bin_plan;

// Element strides of an operand of shape x aligned to the right of an output of rank r;
// 0 for dims x lacks or has as 1 (the CPU kernel's broadcast strides).
static void operand_strides(const dg_shape *x, int r, int64_t *out) {
    int64_t step = 1;
    for (int i = r - 1; i >= 0; i--) {
        int ix = i - (r - x->rank);
        if (ix < 0 || x->dims[ix] == 1) {
            out[i] = 0;
            continue;
        }
        out[i] = step;
        step *= x->dims[ix];
    }
}

static void plan_broadcast(const dg_shape *as, const dg_shape *bs, const dg_shape *os,
                           bin_plan *p) {
    int64_t sa[DG_MAX_RANK], sb[DG_MAX_RANK];
    operand_strides(as, os->rank, sa);
    operand_strides(bs, os->rank, sb);
    p->rank = 0;
    for (int i = 0; i < os->rank; i++) {
        int64_t d = os->dims[i];
        if (d == 1) continue;
        int k = p->rank;
        if (k > 0 && p->sa[k - 1] == sa[i] * d && p->sb[k - 1] == sb[i] * d) {
            p->dims[k - 1] *= d;
            p->sa[k - 1] = sa[i];
            p->sb[k - 1] = sb[i];
        } else {
            p->dims[k] = d;
            p->sa[k] = sa[i];
            p->sb[k] = sb[i];
            p->rank++;
        }
    }
}

// The fast-path indexing of an operand with strides st in plan p, or -1 when there is none.
// Rank 2 is [rows, cols] with cols = p->dims[1].
static int fast_kind(const bin_plan *p, const int64_t *st) {
    if (p->rank == 0) return CUDA_OPND_FULL;
    if (p->rank == 1) return st[0] == 1 ? CUDA_OPND_FULL : st[0] == 0 ? CUDA_OPND_SCALAR : -1;
    if (p->rank == 2) {
        int64_t cols = p->dims[1];
        if (st[0] == cols && st[1] == 1) return CUDA_OPND_FULL;
        if (st[0] == 0 && st[1] == 0) return CUDA_OPND_SCALAR;
        if (st[0] == 0 && st[1] == 1) return CUDA_OPND_ROW;
        if (st[0] == 1 && st[1] == 0) return CUDA_OPND_COL;
    }
    return -1;
}

// out = op(a, b) with a, b, out already checked: out has the broadcast shape of a and b.
static bool bin_launch(exec_ctx *ctx, exec_cuda_device *dev, cuda_binop op, const dg_tensor *a,
                       const dg_tensor *b, dg_tensor *o) {
    int64_t n = o->n_elements;
    if (n == 0) return true;
    cuda_math_dtype dt = cdt(o->dtype);
    cudaError_t err;
    if (a->n_elements == n && b->n_elements == n) {
        err = cuda_launch_binary(dt, op, a->data, CUDA_OPND_FULL, b->data, CUDA_OPND_FULL, o->data,
                                 n, n, dev->stream);
    } else {
        bin_plan p;
        plan_broadcast(&a->shape, &b->shape, &o->shape, &p);
        int ka = fast_kind(&p, p.sa), kb = fast_kind(&p, p.sb);
        if (ka >= 0 && kb >= 0) {
            int64_t inner = p.rank == 2 ? p.dims[1] : n;
            err = cuda_launch_binary(dt, op, a->data, (cuda_operand)ka, b->data, (cuda_operand)kb,
                                     o->data, n, inner, dev->stream);
        } else {
            cuda_bcast bc;
            memset(&bc, 0, sizeof bc);
            bc.rank = p.rank;
            for (int d = 0; d < p.rank; d++) {
                bc.dims[d] = p.dims[d];
                bc.a_strides[d] = p.sa[d];
                bc.b_strides[d] = p.sb[d];
            }
            err = cuda_launch_binary_strided(dt, op, a->data, b->data, o->data, n, &bc,
                                             dev->stream);
        }
    }
    return gpu_check_launch(ctx, dev, err, ctx->node->op->name);
}

static bool bin_compute(void *state, exec_ctx *ctx) {
    math_state *s = state;
    exec_cuda_device *dev = s->dev;
    if (!prepare(ctx, dev, 2)) return false;
    dg_tensor *a = IN(0), *b = IN(1);
    dg_shape os;
    if (dg_shape_equal(&a->shape, &b->shape)) {
        os = a->shape;
    } else if (!graph_broadcast_shapes(a->shape, b->shape, &os, ctx->st)) {
        return false;
    }
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, a->dtype, os);
    if (!o) return false;
    return bin_launch(ctx, dev, (cuda_binop)s->op, a, b, o);
}

// ReluGrad and the like: two inputs of one shape.
static bool grad2_compute(void *state, exec_ctx *ctx) {
    if (ctx->n_inputs >= 2 && IN(0) && IN(1) && !dg_shape_equal(&IN(0)->shape, &IN(1)->shape)) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "inputs differ in shape: %s vs %s",
                         dg_shape_str(&IN(0)->shape, a, sizeof a),
                         dg_shape_str(&IN(1)->shape, b, sizeof b));
    }
    return bin_compute(state, ctx);
}

// ---- unary ----
static void *un_create(const dg_node *n, const exec_env *env, dg_status *st) {
    static const struct {
        const char *name;
        cuda_unop op;
    } map[] = {{"Relu", CUDA_UN_RELU}, {"Sigmoid", CUDA_UN_SIGMOID}, {"Tanh", CUDA_UN_TANH},
               {"Exp", CUDA_UN_EXP},   {"Log", CUDA_UN_LOG},         {"Square", CUDA_UN_SQUARE},
               {"Sqrt", CUDA_UN_SQRT}, {"Neg", CUDA_UN_NEG},         {"Rsqrt", CUDA_UN_RSQRT},
               {"Erf", CUDA_UN_ERF},   {"Gelu", CUDA_UN_GELU},       {"Sin", CUDA_UN_SIN},
               {"Cos", CUDA_UN_COS}};
    bool approximate = false;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].name, n->op->name) == 0) {
            math_state *s = state_new(n, env, st);
            if (s) s->op = (int)map[i].op;
            if (s && map[i].op == CUDA_UN_GELU && dg_node_attr_bool(n, "approximate", &approximate) && approximate)
                s->op = (int)CUDA_UN_GELU_TANH;
            return s;
        }
    dg_status_setf(st, DG_INTERNAL, "no unary GPU kernel for %s", n->op->name);
    return NULL;
}

static bool un_compute(void *state, exec_ctx *ctx) {
    math_state *s = state;
    exec_cuda_device *dev = s->dev;
    if (!prepare(ctx, dev, 1)) return false;
    dg_tensor *x = IN(0);
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, x->dtype, x->shape);
    if (!o) return false;
    cudaError_t err = cuda_launch_unary(cdt(x->dtype), (cuda_unop)s->op, x->data, o->data,
                                        x->n_elements, dev->stream);
    return gpu_check_launch(ctx, dev, err, ctx->node->op->name);
}

// ---- BiasAdd, BiasAddGrad, AddN ----
static bool bias_add_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    if (!prepare(ctx, dev, 2)) return false;
    dg_tensor *v = IN(0), *b = IN(1);
    int64_t C = v->shape.rank > 0 ? v->shape.dims[v->shape.rank - 1] : -1;
    if (b->shape.rank != 1 || b->shape.dims[0] != C)
        return exec_fail(ctx, DG_INVALID_ARGUMENT,
                         "bias has %lld elements, value's last dimension is %lld",
                         (long long)b->n_elements, (long long)C);
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, v->dtype, v->shape);
    if (!o) return false;
    if (o->n_elements == 0) return true;
    // y[r, c] = x[r, c] + bias[c]: the bias is a row vector repeated down the rows.
    cudaError_t err = cuda_launch_binary(cdt(v->dtype), CUDA_BIN_ADD, v->data, CUDA_OPND_FULL,
                                         b->data, CUDA_OPND_ROW, o->data, o->n_elements, C,
                                         dev->stream);
    return gpu_check_launch(ctx, dev, err, "BiasAdd");
}

static bool bias_add_grad_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    if (!prepare(ctx, dev, 1)) return false;
    dg_tensor *dy = IN(0);
    if (dy->shape.rank < 1)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "BiasAddGrad needs rank >= 1");
    int64_t C = dy->shape.dims[dy->shape.rank - 1];
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, dy->dtype, dg_shape1(C));
    if (!o) return false;
    if (C == 0) return true;
    int64_t rows = dy->n_elements / C;
    int64_t n_scratch = cuda_bias_grad_scratch_elems(rows, C);
    double *scratch = NULL;
    if (n_scratch > 0 &&
        !(scratch = exec_cuda_mem_alloc(dev, (size_t)n_scratch * sizeof(double), ctx->st))) {
        dg_status_prepend(ctx->st, "BiasAddGrad: partial sums of %lld rows x %lld columns",
                          (long long)rows, (long long)C);
        return false;
    }
    cudaError_t err =
        cuda_launch_bias_grad(cdt(dy->dtype), dy->data, o->data, rows, C, scratch, dev->stream);
    // Freeing a block the queued work still uses is safe: stream order (cuda_alloc.h).
    exec_cuda_mem_free(dev, scratch);
    return gpu_check_launch(ctx, dev, err, "BiasAddGrad");
}

static bool addn_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    int k_n = ctx->n_inputs;
    if (k_n < 1) return exec_fail(ctx, DG_INVALID_ARGUMENT, "AddN needs at least one input");
    if (!prepare(ctx, dev, k_n)) return false;
    dg_tensor *a = IN(0);
    for (int k = 1; k < k_n; k++)
        if (!dg_shape_equal(&IN(k)->shape, &a->shape)) {
            char x[128], y[128];
            return exec_fail(ctx, DG_INVALID_ARGUMENT, "input %d has shape %s, input 0 has %s",
                             k, dg_shape_str(&IN(k)->shape, x, sizeof x),
                             dg_shape_str(&a->shape, y, sizeof y));
        }
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, a->dtype, a->shape);
    if (!o) return false;
    if (o->n_elements == 0) return true;
    const void *local[32];
    const void **xs = local;
    if (k_n > (int)(sizeof local / sizeof local[0]) && !(xs = malloc((size_t)k_n * sizeof *xs)))
        return exec_fail(ctx, DG_RESOURCE_EXHAUSTED, "AddN: %d input pointers", k_n);
    for (int k = 0; k < k_n; k++) xs[k] = IN(k)->data;
    cudaError_t err = cuda_launch_addn(cdt(a->dtype), xs, k_n, o->data, o->n_elements, dev->stream);
    if (xs != local) free(xs);
    return gpu_check_launch(ctx, dev, err, "AddN");
}

// ---- ClipByValue and its gradient ----
static bool bounds_ok(exec_ctx *ctx, const dg_tensor *x, const dg_tensor *b) {
    if (b->n_elements == 1 || dg_shape_equal(&b->shape, &x->shape)) return true;
    return exec_fail(ctx, DG_UNIMPLEMENTED, "clip bounds must be scalars or have the shape of x");
}

static bool clip_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    if (!prepare(ctx, dev, 3)) return false;
    dg_tensor *x = IN(0), *lo = IN(1), *hi = IN(2);
    if (!bounds_ok(ctx, x, lo) || !bounds_ok(ctx, x, hi)) return false;
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, x->dtype, x->shape);
    if (!o) return false;
    cudaError_t err = cuda_launch_clip(cdt(x->dtype), x->data, lo->data, lo->n_elements == 1,
                                       hi->data, hi->n_elements == 1, o->data, x->n_elements,
                                       dev->stream);
    return gpu_check_launch(ctx, dev, err, "ClipByValue");
}

static bool clip_grad_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    if (!prepare(ctx, dev, 4)) return false;
    dg_tensor *dy = IN(0), *x = IN(1), *lo = IN(2), *hi = IN(3);
    if (!bounds_ok(ctx, x, lo) || !bounds_ok(ctx, x, hi)) return false;
    if (dy->n_elements != x->n_elements) {
        char a[128], b[128];
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "dy has shape %s, x has %s",
                         dg_shape_str(&dy->shape, a, sizeof a),
                         dg_shape_str(&x->shape, b, sizeof b));
    }
    dg_tensor *o[3];
    for (int k = 0; k < 3; k++)
        if (!(o[k] = gpu_alloc_output(dev, ctx, k, x->dtype, x->shape))) return false;
    cudaError_t err = cuda_launch_clip_grad(cdt(x->dtype), dy->data, x->data, lo->data,
                                            lo->n_elements == 1, hi->data, hi->n_elements == 1,
                                            o[0]->data, o[1]->data, o[2]->data, x->n_elements,
                                            dev->stream);
    return gpu_check_launch(ctx, dev, err, "ClipByValueGrad");
}

// ---- Cast between the floats (float32, float64, bfloat16, float16; same-type copies); other
// pairs run on the CPU ----
static cuda_float_kind float_kind(dg_dtype t) {
    return t == DG_FLOAT64 ? CUDA_FLOAT_F64 : t == DG_BFLOAT16 ? CUDA_FLOAT_BF16 : t == DG_FLOAT16 ? CUDA_FLOAT_F16
                                                                                                : CUDA_FLOAT_F32;
}

static void *cast_create(const dg_node *n, const exec_env *env, dg_status *st) {
    dg_dtype from = exec_kernel_dtype(n), to = n->n_outputs > 0 ? n->out_dtypes[0] : DG_INVALID_DTYPE;
    if (!gpu_dtype_on_device(from) || !gpu_dtype_on_device(to)) {
        dg_status_setf(st, DG_UNIMPLEMENTED,
                       "Cast from %s to %s on a GPU: only float32, float64, bfloat16 and float16 are supported",
                       dg_dtype_name(from), dg_dtype_name(to));
        return NULL;
    }
    math_state *s = state_new(n, env, st);
    if (s) s->to = to;
    return s;
}

static bool cast_compute(void *state, exec_ctx *ctx) {
    math_state *s = state;
    exec_cuda_device *dev = s->dev;
    if (!prepare(ctx, dev, 1)) return false;
    dg_tensor *x = IN(0);
    dg_tensor *o = gpu_alloc_output(dev, ctx, 0, s->to, x->shape);
    if (!o) return false;
    cudaError_t err = cuda_launch_cast(float_kind(x->dtype), x->data, float_kind(s->to), o->data, x->n_elements,
                                       dev->stream);
    return gpu_check_launch(ctx, dev, err, "Cast");
}

// ---- optimizer updates and AssignAdd/AssignSub: in place on input 0, the variable ----
static bool apply_gd_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    int skipped = exec_update_skipped(ctx, 3);
    if (skipped) return skipped > 0;
    if (!prepare(ctx, dev, 3)) return false;
    dg_tensor *var = IN(0), *alpha = IN(1), *delta = IN(2);
    if (!need_scalar(ctx, 1, "alpha") || !need_var_size(ctx, 2, "delta")) return false;
    cudaError_t err = cuda_launch_apply_gd(cdt(var->dtype), var->data, alpha->data, delta->data,
                                           var->n_elements, dev->stream);
    if (!gpu_check_launch(ctx, dev, err, "ApplyGradientDescent")) return false;
    exec_set_output(ctx, 0, var);
    return true;
}

static void *momentum_create(const dg_node *n, const exec_env *env, dg_status *st) {
    math_state *s = state_new(n, env, st);
    if (s) dg_node_attr_bool(n, "use_nesterov", &s->nesterov);
    return s;
}

static bool apply_momentum_compute(void *state, exec_ctx *ctx) {
    math_state *s = state;
    exec_cuda_device *dev = s->dev;
    int skipped = exec_update_skipped(ctx, 5);
    if (skipped) return skipped > 0;
    if (!prepare(ctx, dev, 5)) return false;
    dg_tensor *var = IN(0), *accum = IN(1), *lr = IN(2), *grad = IN(3), *mom = IN(4);
    if (!need_var_size(ctx, 1, "accum") || !need_scalar(ctx, 2, "lr") ||
        !need_var_size(ctx, 3, "grad") || !need_scalar(ctx, 4, "momentum"))
        return false;
    cudaError_t err = cuda_launch_apply_momentum(cdt(var->dtype), var->data, accum->data, lr->data,
                                                 grad->data, mom->data, s->nesterov,
                                                 var->n_elements, dev->stream);
    if (!gpu_check_launch(ctx, dev, err, "ApplyMomentum")) return false;
    exec_set_output(ctx, 0, var);
    return true;
}

static bool apply_adam_compute(void *state, exec_ctx *ctx) {
    exec_cuda_device *dev = GPU_DEV(state);
    int skipped = exec_update_skipped(ctx, 10);
    if (skipped) return skipped > 0;
    if (!prepare(ctx, dev, 10)) return false;
    static const char *scalars[] = {"beta1_power", "beta2_power", "lr", "beta1", "beta2",
                                    "epsilon"};
    if (!need_var_size(ctx, 1, "m") || !need_var_size(ctx, 2, "v") ||
        !need_var_size(ctx, 9, "grad"))
        return false;
    for (int i = 3; i <= 8; i++)
        if (!need_scalar(ctx, i, scalars[i - 3])) return false;
    dg_tensor *var = IN(0);
    cudaError_t err = cuda_launch_apply_adam(cdt(var->dtype), var->data, IN(1)->data, IN(2)->data,
                                             IN(3)->data, IN(4)->data, IN(5)->data, IN(6)->data,
                                             IN(7)->data, IN(8)->data, IN(9)->data,
                                             var->n_elements, dev->stream);
    if (!gpu_check_launch(ctx, dev, err, "ApplyAdam")) return false;
    exec_set_output(ctx, 0, var);
    return true;
}

static bool assign_update(exec_ctx *ctx, void *state, bool subtract) {
    exec_cuda_device *dev = GPU_DEV(state);
    if (!prepare(ctx, dev, 2)) return false;
    dg_tensor *var = IN(0), *val = IN(1);
    if (var->n_elements != val->n_elements)
        return exec_fail(ctx, DG_INVALID_ARGUMENT, "value has %lld elements, variable %lld",
                         (long long)val->n_elements, (long long)var->n_elements);
    cudaError_t err = cuda_launch_assign_update(cdt(var->dtype), var->data, val->data, subtract,
                                                var->n_elements, dev->stream);
    if (!gpu_check_launch(ctx, dev, err, subtract ? "AssignSub" : "AssignAdd")) return false;
    exec_set_output(ctx, 0, var);
    return true;
}

static bool assign_add_compute(void *state, exec_ctx *ctx) {
    return assign_update(ctx, state, false);
}

static bool assign_sub_compute(void *state, exec_ctx *ctx) {
    return assign_update(ctx, state, true);
}

// MatMul is expensive like its CPU kernel; the updates alias their variable (output_is_ref).
#define GPU_EXPENSIVE_KERNEL(op, create, compute, destroy) \
    {(op), "GPU", DT_FLOATS | DT_FLOAT16S, (create), (compute), (destroy), true, false, false, NULL, false}
#define GPU_REF_KERNEL(op, create, compute, destroy) \
    {(op), "GPU", DT_FLOATS, (create), (compute), (destroy), false, true, false, NULL, false}

const exec_kernel_def gpu_math_kernels[] = {
    GPU_EXPENSIVE_KERNEL("MatMul", matmul_create, matmul_compute, free),
    GPU_KERNEL("Add", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("Sub", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("Mul", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("Div", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("Maximum", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("Minimum", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("Pow", DT_FLOATS, bin_create, bin_compute, free),
    GPU_KERNEL("ReluGrad", DT_FLOATS, bin_create, grad2_compute, free),
    GPU_KERNEL("SigmoidGrad", DT_FLOATS, bin_create, grad2_compute, free),
    GPU_KERNEL("TanhGrad", DT_FLOATS, bin_create, grad2_compute, free),
    GPU_KERNEL("SqrtGrad", DT_FLOATS, bin_create, grad2_compute, free),
    GPU_KERNEL("RsqrtGrad", DT_FLOATS, bin_create, grad2_compute, free),
    GPU_KERNEL("GeluGrad", DT_FLOATS, bin_create, grad2_compute, free),
    GPU_KERNEL("Relu", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Sigmoid", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Tanh", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Exp", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Log", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Square", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Sqrt", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Neg", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Rsqrt", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Erf", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Sin", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Cos", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("Gelu", DT_FLOATS, un_create, un_compute, free),
    GPU_KERNEL("BiasAdd", DT_FLOATS, gpu_dev_create, bias_add_compute, NULL),
    GPU_KERNEL("BiasAddGrad", DT_FLOATS, gpu_dev_create, bias_add_grad_compute, NULL),
    GPU_KERNEL("AddN", DT_FLOATS, gpu_dev_create, addn_compute, NULL),
    GPU_KERNEL("ClipByValue", DT_FLOATS, gpu_dev_create, clip_compute, NULL),
    GPU_KERNEL("ClipByValueGrad", DT_FLOATS, gpu_dev_create, clip_grad_compute, NULL),
    GPU_KERNEL("Cast", DT_FLOATS | DT_FLOAT16S, cast_create, cast_compute, free),
    GPU_REF_KERNEL("ApplyGradientDescent", gpu_dev_create, apply_gd_compute, NULL),
    GPU_REF_KERNEL("ApplyMomentum", momentum_create, apply_momentum_compute, free),
    GPU_REF_KERNEL("ApplyAdam", gpu_dev_create, apply_adam_compute, NULL),
    GPU_REF_KERNEL("AssignAdd", gpu_dev_create, assign_add_compute, NULL),
    GPU_REF_KERNEL("AssignSub", gpu_dev_create, assign_sub_compute, NULL),
};
const int gpu_n_math_kernels = sizeof gpu_math_kernels / sizeof gpu_math_kernels[0];
