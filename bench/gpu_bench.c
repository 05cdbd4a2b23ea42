/* gpu_bench: the GPU device against its baselines. Prints JSON lines:
 *   {"bench": "gpu", "metric": ..., "value": ..., "unit": ..., ...}
 * (a) MatMul of two n x n float32 matrices (--sizes, default 1024,2048,4096,8192): through
 *     the executor (a local session on /gpu:0, soft placement off, multiplying two variables
 *     that live on the GPU; one session run per MatMul, targets only, then one run fetching a
 *     1x1 slice of the product to wait for the GPU) and raw cuBLAS sgemm on the same sizes;
 *     TFLOP/s for both and their ratio. Every run's executor overhead is inside the time.
 *     --dtype bfloat16 (or float16) times the same MatMuls in that dtype with float32 sums
 *     (cublasGemmEx on tensor cores, its operands Consts that the executor copies to the GPU
 *     once) against raw cublasGemmEx.
 * (b) the MNIST-replica training step (784-100-10, ReLU, softmax cross entropy, Adam, as
 *     examples/mlp_local.c) on /gpu:0 at batch 100, 1000, 10000 (--batches) with synthetic data
 *     fed from host memory every step: ms/step and steps/s, and how many of the step's nodes
 *     ran on the GPU. The PyTorch peer is bench/peers/torch_mlp_cuda.py (command printed).
 * (c) the fused causal attention (ScaledDotProductAttention, float32) alone, q, k and v
 *     [batch, 6 heads, T, 64] variables on /gpu:0, T = 256 (batch 64) and 1024 (batch 16)
 *     (--attn_t; batch 16384 / T): the forward pass, and the forward with the gradients for a
 *     given output gradient, ms per run. The PyTorch peer (F.scaled_dot_product_attention,
 *     is_causal) is bench/peers/torch_attention_cuda.py.
 * Without a GPU (or built without CUDA) it prints one line {"bench": "gpu", "skipped": ...}
 * and exits 0. --probe prints only {"bench": "gpu", "gpus": N} (and the reason when N is 0). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flags.h"
#include "mlp_model.h"
#ifdef DG_WITH_CUDA
#include "cuda_device.h"
#endif

// Prints s as a JSON string.
static void json_str(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20) printf("\\u%04x", ch);
        else putchar(ch);
    }
    putchar('"');
}

static void skipped(const char *reason) {
    printf("{\"bench\": \"gpu\", \"skipped\": ");
    json_str(reason);
    printf("}\n");
}

// Parses "a,b,c" into at most cap positive integers. Returns the count, -1 on bad input.
static int parse_list(const char *s, int64_t *out, int cap) {
    int n = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1 || n == cap || (*end && *end != ',')) return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

#ifdef DG_WITH_CUDA

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng_next(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}
static float rng_unit(uint64_t *x) { return (float)(rng_next(x) >> 40) / (float)(1 << 24); }

// How many nodes were placed, and how many of them on a GPU.
static void count_placed(dg_graph *g, int *placed, int *on_gpu) {
    *placed = *on_gpu = 0;
    for (int i = 0; i < dg_graph_num_nodes(g); i++) {
        const char *d = dg_node_assigned_device(dg_graph_node(g, i));
        if (!d || !*d) continue;
        (*placed)++;
        if (strstr(d, "/device:GPU:")) (*on_gpu)++;
    }
}

// MatMuls of n x n: enough to keep the GPU busy about a second at ~50 TFLOP/s.
static int64_t auto_reps(int64_t n) {
    double flops = 2.0 * (double)n * (double)n * (double)n;
    int64_t r = (int64_t)(5e13 / flops);
    return r < 10 ? 10 : r > 2000 ? 2000 : r;
}

// One n x n GEMM of dtype (float32, or a 16-bit float with float32 sums) on dev.
static bool gemm_once(exec_cuda_device *dev, dg_dtype dtype, int64_t n, void *const *d, dg_status *st) {
    if (dtype == DG_FLOAT32)
        return exec_cuda_sgemm(dev, false, false, n, n, n, 1.0f, d[0], n, d[1], n, 0.0f, d[2], n, st);
    return exec_cuda_gemm16(dev, dtype == DG_BFLOAT16, false, false, n, n, n, 1.0f, d[0], n, d[1], n, 0.0f, d[2], n,
                            st);
}

// Raw cuBLAS: reps + 1 GEMMs of n x n in dtype on a fresh device handle. Returns seconds per
// GEMM, or -1 with st set.
static double time_cublas(int64_t n, dg_dtype dtype, int64_t reps, bool tf32, dg_status *st) {
    const exec_device_ops *ops = exec_cuda_device_ops();
    exec_cuda_set_allow_tf32(tf32);
    exec_cuda_device *dev = exec_cuda_device_new(0, st);
    if (!dev) return -1;
    size_t n_bytes = (size_t)(n * n) * dg_dtype_size(dtype);
    double per = -1;
    float *host = malloc((size_t)(n * n) * sizeof(float));
    void *d[3] = {NULL, NULL, NULL};
    if (!host) {
        dg_status_setf(st, DG_RESOURCE_EXHAUSTED, "gpu_bench: %zu bytes of host memory", n_bytes);
        goto out;
    }
    uint64_t x = 88172645463325252ULL + (uint64_t)n;
    for (int k = 0; k < 3; k++) {
        if (!(d[k] = ops->alloc(dev, n_bytes, st))) goto out;
        for (int64_t i = 0; i < n * n; i++) {
            float v = rng_unit(&x) * 2.0f - 1.0f;
            if (dtype == DG_FLOAT32) host[i] = v;
            else ((uint16_t *)host)[i] = dtype == DG_BFLOAT16 ? dg_float_to_bfloat16(v) : dg_float_to_float16(v);
        }
        if (!ops->copy_to_device(dev, d[k], host, n_bytes, st) || !ops->synchronize(dev, st)) goto out;
    }
    for (int w = 0; w < 2; w++)
        if (!gemm_once(dev, dtype, n, d, st)) goto out;
    if (!ops->synchronize(dev, st)) goto out;
    double t0 = now_s();
    for (int64_t r = 0; r <= reps; r++)
        if (!gemm_once(dev, dtype, n, d, st)) goto out;
    if (!ops->synchronize(dev, st)) goto out;
    per = (now_s() - t0) / (double)(reps + 1);
out:
    for (int k = 0; k < 3; k++) ops->free(dev, d[k]);
    free(host);
    exec_cuda_device_free(&dev);
    return per;
}

// Through the executor: reps runs of the MatMul as a target, then one run fetching a 1x1
// slice of the product (one more MatMul, and the wait for the GPU). Returns seconds per
// MatMul, or -1 with st set.
// A Const n x n of dtype (16-bit) with entries uniform in [-a, a).
static dg_output const16(dg_graph *g, const char *name, dg_dtype dtype, int64_t n, double a, uint64_t seed,
                         dg_status *st) {
    dg_tensor *t = dg_tensor_new(dtype, dg_shape2(n, n), st);
    if (!t) return (dg_output){NULL, 0};
    uint16_t *p = dg_tensor_data(t);
    uint64_t x = 88172645463325252ULL ^ seed;
    for (int64_t i = 0; i < n * n; i++) {
        float v = (float)((rng_unit(&x) * 2.0 - 1.0) * a);
        p[i] = dtype == DG_BFLOAT16 ? dg_float_to_bfloat16(v) : dg_float_to_float16(v);
    }
    dg_output o = dg_const(g, name, t);
    dg_tensor_unref(t);
    return o;
}

static double time_executor(int64_t n, dg_dtype dtype, int64_t reps, bool tf32, int *placed, int *on_gpu,
                            dg_status *st) {
    dg_graph *g = dg_graph_new();
    dg_session *s = NULL;
    dg_tensor *corner = NULL;
    double per = -1;
    // b's entries have variance 1/n, so the product's stay near a's whatever the size.
    double a = sqrt(3.0 / (double)n);
    dg_graph_push_device(g, "/gpu:0");
    dg_output x, y;
    if (dtype == DG_FLOAT32) {
        x = dg_variable(g, "a", DG_FLOAT32, dg_shape2(n, n), dg_init_random_uniform(-1, 1, 1));
        y = dg_variable(g, "b", DG_FLOAT32, dg_shape2(n, n), dg_init_random_uniform(-a, a, 2));
    } else {   // Consts: the executor copies them to the GPU once, when the kernel is created
        x = const16(g, "a", dtype, n, 1.0, 1, st);
        y = const16(g, "b", dtype, n, a, 2, st);
        if (!x.node || !y.node) {
            dg_graph_pop_device(g);
            goto out;
        }
    }
    dg_output mm = dg_matmul(g, "mm", x, y, false, false);
    const int64_t begin[2] = {0, 0}, size[2] = {1, 1};
    // Slice takes no 16-bit floats: the last run casts the product to float32 (a pass over it,
    // in one run of reps + 1).
    dg_output c = dg_slice(g, "corner", dtype == DG_FLOAT32 ? mm : dg_cast(g, NULL, mm, DG_FLOAT32), begin, size, 2);
    dg_node *init = dg_global_variables_initializer(g);
    dg_graph_pop_device(g);
    if (!dg_graph_check(g, st)) goto out;
    dg_session_options o = dg_session_options_default();
    o.allow_soft_placement = false;   // it runs on the GPU or fails
    o.gpu_allow_tf32 = tf32;
    o.inter_op_threads = 1;
    if (!(s = dg_session_new(g, "local", &o, st))) goto out;
    if (dtype == DG_FLOAT32 && !dg_session_run_target(s, init, st)) goto out;
    for (int w = 0; w < 3; w++)
        if (!dg_session_run_target(s, mm.node, st)) goto out;
    if (!dg_session_run(s, NULL, NULL, 0, &c, &corner, 1, NULL, 0, st)) goto out;
    dg_tensor_free(&corner);
    double t0 = now_s();
    for (int64_t r = 0; r < reps; r++)
        if (!dg_session_run_target(s, mm.node, st)) goto out;
    if (!dg_session_run(s, NULL, NULL, 0, &c, &corner, 1, NULL, 0, st)) goto out;
    per = (now_s() - t0) / (double)(reps + 1);
    count_placed(g, placed, on_gpu);
out:
    dg_tensor_free(&corner);
    dg_session_free(&s);
    dg_graph_free(&g);
    return per;
}

// The MNIST-replica training step at one batch size: ms per step over `steps` steps after
// `warmup`, the last timed step fetching the loss (the wait for the GPU). Returns ms, or -1.
static double time_mlp(int64_t batch, int64_t steps, int64_t warmup, int *placed, int *on_gpu,
                       double *loss_out, dg_status *st) {
    const int64_t pixels = 784;
    dg_graph *g = dg_graph_new();
    dg_session *s = NULL;
    dg_tensor *xt = NULL, *yt = NULL, *loss = NULL;
    double ms = -1;
    mlp_model m;
    dg_graph_push_device(g, "/gpu:0");
    bool built = mlp_build(g, pixels, 100, 0.01, 1, &m, st);
    dg_graph_pop_device(g);
    if (!built) goto out;
    dg_session_options o = dg_session_options_default();   // soft: int64 bookkeeping may stay on CPU
    o.inter_op_threads = 1;
    if (!(s = dg_session_new(g, "local", &o, st)) || !dg_session_run_target(s, m.init, st)) goto out;
    if (!(xt = dg_tensor_new(DG_FLOAT32, dg_shape2(batch, pixels), st))) goto out;
    if (!(yt = dg_tensor_new(DG_INT64, dg_shape1(batch), st))) goto out;
    uint64_t x = 0x2545F4914F6CDD1DULL;
    for (int64_t i = 0; i < batch * pixels; i++) dg_tensor_f32(xt)[i] = rng_unit(&x);
    for (int64_t i = 0; i < batch; i++) dg_tensor_i64(yt)[i] = (int64_t)(rng_next(&x) % 10);
    dg_output feeds[2] = {m.x, m.y_};
    dg_tensor *vals[2] = {xt, yt};
    for (int64_t i = 0; i < warmup; i++)
        if (!dg_session_run(s, feeds, vals, 2, NULL, NULL, 0, &m.train, 1, st)) goto out;
    if (!dg_session_run(s, feeds, vals, 2, &m.loss, &loss, 1, NULL, 0, st)) goto out;
    dg_tensor_free(&loss);
    double t0 = now_s();
    for (int64_t i = 0; i < steps; i++) {
        bool last = i == steps - 1;
        if (!dg_session_run(s, feeds, vals, 2, &m.loss, &loss, last ? 1 : 0, &m.train, 1, st)) goto out;
    }
    ms = (now_s() - t0) * 1e3 / (double)steps;
    *loss_out = dg_tensor_f32(loss)[0];
    count_placed(g, placed, on_gpu);
out:
    dg_tensor_free(&loss);
    dg_tensor_unref(xt);
    dg_tensor_unref(yt);
    dg_session_free(&s);
    dg_graph_free(&g);
    return ms;
}

// The fused causal attention on /gpu:0: q, k, v and the output gradient dy [b, h, t, d]
// variables; reps runs of the forward pass (then of the three gradients) as targets, then one
// run fetching a single element (the wait for the GPU). Sets *fwd_ms and *bwd_ms (the forward
// with the gradients) per run. Returns false with st set.
static bool time_attention(int64_t b, int64_t h, int64_t t, int64_t d, int64_t reps, double *fwd_ms, double *bwd_ms,
                           int *placed, int *on_gpu, dg_status *st) {
    dg_graph *g = dg_graph_new();
    dg_session *s = NULL;
    dg_tensor *corner = NULL;
    bool ok = false;
    const int64_t dims[4] = {b, h, t, d};
    dg_shape shape = dg_shape_make(4, dims);
    dg_graph_push_device(g, "/gpu:0");
    dg_output q = dg_variable(g, "q", DG_FLOAT32, shape, dg_init_random_uniform(-1, 1, 1));
    dg_output k = dg_variable(g, "k", DG_FLOAT32, shape, dg_init_random_uniform(-1, 1, 2));
    dg_output v = dg_variable(g, "v", DG_FLOAT32, shape, dg_init_random_uniform(-1, 1, 3));
    dg_output dy = dg_variable(g, "dy", DG_FLOAT32, shape, dg_init_random_uniform(-1, 1, 4));
    dg_output y = dg_attention(g, "attn", q, k, v, true, 0);
    dg_output xs[3] = {q, k, v}, dx[3];
    bool grads = dg_gradients(g, &y, 1, xs, 3, &dy, dx);
    const int64_t begin[4] = {0, 0, 0, 0}, size[4] = {1, 1, 1, 1};
    dg_output cy = dg_slice(g, "corner_y", y, begin, size, 4);
    dg_output cq = cy;
    dg_node *gall = NULL;
    if (grads) {
        dg_node *gdeps[3] = {dx[0].node, dx[1].node, dx[2].node};
        cq = dg_slice(g, "corner_dq", dx[0], begin, size, 4);
        gall = dg_group(g, "grads", gdeps, 3);
    }
    dg_node *init = dg_global_variables_initializer(g);
    dg_graph_pop_device(g);
    if (!grads) {
        dg_status_set(st, DG_INTERNAL, "gpu_bench: the attention's gradient could not be built");
        goto out;
    }
    if (!dg_graph_check(g, st)) goto out;
    dg_session_options o = dg_session_options_default();
    o.allow_soft_placement = false;   // it runs on the GPU or fails
    o.inter_op_threads = 1;
    if (!(s = dg_session_new(g, "local", &o, st)) || !dg_session_run_target(s, init, st)) goto out;
    for (int pass = 0; pass < 2; pass++) {
        dg_node *target = pass == 0 ? y.node : gall;
        dg_output *c = pass == 0 ? &cy : &cq;
        for (int w = 0; w < 3; w++)
            if (!dg_session_run_target(s, target, st)) goto out;
        if (!dg_session_run(s, NULL, NULL, 0, c, &corner, 1, NULL, 0, st)) goto out;
        dg_tensor_free(&corner);
        double t0 = now_s();
        for (int64_t r = 0; r < reps; r++)
            if (!dg_session_run_target(s, target, st)) goto out;
        if (!dg_session_run(s, NULL, NULL, 0, c, &corner, 1, NULL, 0, st)) goto out;
        double ms = (now_s() - t0) * 1e3 / (double)(reps + 1);
        if (!isfinite(dg_tensor_f32(corner)[0])) {
            dg_status_set(st, DG_INTERNAL, "gpu_bench: the attention gave a value that is not finite");
            goto out;
        }
        dg_tensor_free(&corner);
        *(pass == 0 ? fwd_ms : bwd_ms) = ms;
    }
    count_placed(g, placed, on_gpu);
    ok = true;
out:
    dg_tensor_free(&corner);
    dg_session_free(&s);
    dg_graph_free(&g);
    return ok;
}

#endif

int main(int argc, char **argv) {
    const char *sizes_s = "1024,2048,4096,8192", *batches_s = "100,1000,10000", *attn_s = "256,1024";
    int64_t reps = 0, steps = 200, warmup = 20;
    bool probe = false, no_matmul = false, no_mlp = false, no_attention = false, tf32 = false;
    const char *dtype_s = "float32";
    flag_def defs[] = {
        {"sizes", FLAG_STRING, &sizes_s, "MatMul sizes n (n x n times n x n), comma-separated"},
        {"reps", FLAG_INT, &reps, "MatMuls per size (default 0: about a second of GPU work)"},
        {"batches", FLAG_STRING, &batches_s, "MLP batch sizes, comma-separated (default 100,1000,10000)"},
        {"steps", FLAG_INT, &steps, "timed MLP steps per batch size (default 200)"},
        {"warmup", FLAG_INT, &warmup, "untimed MLP steps first (default 20)"},
        {"dtype", FLAG_STRING, &dtype_s, "MatMul dtype: float32 (default), bfloat16 or float16 (float32 sums)"},
        {"tf32", FLAG_BOOL, &tf32, "MatMuls (executor and cuBLAS) may use TF32 tensor cores (default off)"},
        {"no_matmul", FLAG_BOOL, &no_matmul, "skip the MatMul part"},
        {"no_mlp", FLAG_BOOL, &no_mlp, "skip the MLP part"},
        {"attn_t", FLAG_STRING, &attn_s, "attention lengths T, comma-separated (batch 16384 / T; default 256,1024)"},
        {"no_attention", FLAG_BOOL, &no_attention, "skip the attention part"},
        {"probe", FLAG_BOOL, &probe, "print the number of usable GPUs and exit"},
    };
    bool help;
    if (!flags_parse(argc, argv, defs, sizeof defs / sizeof defs[0], "usage: gpu_bench [flags]", &help))
        return 2;
    if (help) return 0;
    int64_t sizes[16], batches[16];
    int64_t attn_t[16];
    int n_sizes = parse_list(sizes_s, sizes, 16), n_batches = parse_list(batches_s, batches, 16),
        n_attn = parse_list(attn_s, attn_t, 16);
    if (n_sizes < 0 || n_batches < 0 || n_attn < 0 || reps < 0 || steps < 1 || warmup < 0) {
        fprintf(stderr, "gpu_bench: --sizes, --batches and --attn_t are lists of positive integers (at most 16), "
                        "--reps >= 0, --steps >= 1, --warmup >= 0\n");
        return 2;
    }
    for (int i = 0; i < n_sizes; i++)
        if (sizes[i] > 65536) {
            fprintf(stderr, "gpu_bench: size %lld is more than 65536\n", (long long)sizes[i]);
            return 2;
        }
    dg_dtype mm_dtype = strcmp(dtype_s, "float32") == 0    ? DG_FLOAT32
                        : strcmp(dtype_s, "bfloat16") == 0 ? DG_BFLOAT16
                        : strcmp(dtype_s, "float16") == 0  ? DG_FLOAT16
                                                           : DG_INVALID_DTYPE;
    if (mm_dtype == DG_INVALID_DTYPE) {
        fprintf(stderr, "gpu_bench: --dtype \"%s\" is not float32, bfloat16 or float16\n", dtype_s);
        return 2;
    }
    for (int i = 0; i < n_attn; i++)
        if (attn_t[i] > 16384) {
            fprintf(stderr, "gpu_bench: --attn_t %lld is more than 16384\n", (long long)attn_t[i]);
            return 2;
        }
#ifndef DG_WITH_CUDA
    if (probe) printf("{\"bench\": \"gpu\", \"gpus\": 0, \"reason\": \"built without CUDA\"}\n");
    else skipped("built without CUDA (DG_WITH_CUDA is off or no toolkit was found)");
    return 0;
#else
    int n_gpus = exec_cuda_device_count();
    if (probe) {
        printf("{\"bench\": \"gpu\", \"gpus\": %d", n_gpus);
        if (n_gpus == 0) {
            printf(", \"reason\": ");
            json_str(exec_cuda_unavailable_reason());
        }
        printf("}\n");
        return 0;
    }
    if (n_gpus == 0) {
        skipped(exec_cuda_unavailable_reason());
        return 0;
    }
    dg_status *st = dg_status_new();
    char name[256] = "";
    int64_t mem = 0;
    if (!exec_cuda_device_info(0, name, sizeof name, &mem, st)) goto fail;
    printf("{\"bench\": \"gpu\", \"device\": ");
    json_str(name);
    printf(", \"memory_mib\": %lld, \"gpus\": %d}\n", (long long)(mem >> 20), n_gpus);
    fflush(stdout);
    for (int i = 0; !no_matmul && i < n_sizes; i++) {
        int64_t n = sizes[i], r = reps ? reps : auto_reps(n);
        double flops = 2.0 * (double)n * (double)n * (double)n;
        double blas = time_cublas(n, mm_dtype, r, tf32, st);
        if (blas < 0) goto fail;
        int placed = 0, on_gpu = 0;
        double exe = time_executor(n, mm_dtype, r, tf32, &placed, &on_gpu, st);
        if (exe < 0) goto fail;
        printf("{\"bench\": \"gpu\", \"metric\": \"matmul\", \"dtype\": \"%s\", \"n\": %lld, \"reps\": %lld, \"tf32\": %s, "
               "\"executor_tflops\": %.3f, \"cublas_tflops\": %.3f, \"ratio\": %.4f, "
               "\"executor_ms\": %.4f, \"cublas_ms\": %.4f, \"nodes_on_gpu\": %d, \"nodes\": %d}\n",
               dg_dtype_name(mm_dtype), (long long)n, (long long)r, tf32 ? "true" : "false", flops / exe * 1e-12, flops / blas * 1e-12, blas / exe,
               exe * 1e3, blas * 1e3, on_gpu, placed);
        fflush(stdout);
    }
    for (int i = 0; !no_mlp && i < n_batches; i++) {
        int placed = 0, on_gpu = 0;
        double loss = 0;
        double ms = time_mlp(batches[i], steps, warmup, &placed, &on_gpu, &loss, st);
        if (ms < 0) goto fail;
        printf("{\"bench\": \"gpu\", \"metric\": \"mlp_step\", \"batch\": %lld, \"value\": %.4f, "
               "\"unit\": \"ms\", \"steps_per_s\": %.1f, \"steps\": %lld, \"loss\": %.4f, "
               "\"nodes_on_gpu\": %d, \"nodes\": %d}\n",
               (long long)batches[i], ms, 1e3 / ms, (long long)steps, loss, on_gpu, placed);
        fflush(stdout);
    }
    for (int i = 0; !no_attention && i < n_attn; i++) {
        int64_t t = attn_t[i], b = t >= 16384 ? 1 : 16384 / t, h = 6, d = 64;
        int placed = 0, on_gpu = 0;
        double fwd = 0, bwd = 0;
        if (!time_attention(b, h, t, d, reps ? reps : 50, &fwd, &bwd, &placed, &on_gpu, st)) goto fail;
        // Causal: half the scores; the forward's two products then take 2 b h t^2 d flops.
        double flops = 2.0 * (double)b * (double)h * (double)t * (double)t * (double)d;
        printf("{\"bench\": \"gpu\", \"metric\": \"attention\", \"batch\": %lld, \"heads\": %lld, \"t\": %lld, "
               "\"d\": %lld, \"causal\": true, \"fwd_ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"fwd_tflops\": %.2f, "
               "\"nodes_on_gpu\": %d, \"nodes\": %d}\n",
               (long long)b, (long long)h, (long long)t, (long long)d, fwd, bwd, flops / fwd * 1e-9, on_gpu, placed);
        fflush(stdout);
    }
    if (!no_attention)
        printf("{\"bench\": \"gpu\", \"peer\": \"python3 bench/peers/torch_attention_cuda.py --t %s\", "
               "\"compare\": \"attention fwd_ms and fwd_bwd_ms per t\"}\n", attn_s);
    if (!no_mlp)
        printf("{\"bench\": \"gpu\", \"peer\": \"python3 bench/peers/torch_mlp_cuda.py --batches %s "
               "--steps %lld --warmup %lld\", \"compare\": \"mlp_step value (ms) per batch\"}\n",
               batches_s, (long long)steps, (long long)warmup);
    dg_status_free(&st);
    return 0;
fail:
    fprintf(stderr, "gpu_bench: %s: %s\n", dg_code_name(dg_status_code(st)), dg_status_message(st));
    dg_status_free(&st);
    return 1;
#endif
}
