/* gemm_bench: float32 GEMM throughput on the shapes distgraph's models run, beside the core's
 * measured peak. JSON lines:
 *   {"bench": "gemm_bench", "metric": "fma_peak", "isa": "avx512", "value": ..., "unit": "GFLOP/s"}
 *   one line per shape and provider: "distgraph" (cpu_gemm: the dispatch of executor/cpu/gemm.c,
 *   whatever it chose) and "openblas" (cblas_sgemm as the system's OpenBLAS comes, when built
 *   with it), with GFLOP/s and the fraction of the widest peak. Shapes whose A is mostly zero
 *   (*_sparse*) also run as "distgraph_dense": cpu_gemm without its sparse products. Their
 *   GFLOP/s count the dense product's multiply-adds, the zeros' too.
 * The peak is a loop of independent fused multiply-adds on 12 registers (no memory), the most a
 * core can do; a GEMM's fraction of it says how much of the machine it uses. A virtual
 * machine's core can run at half speed for seconds while its host is busy elsewhere, so each
 * shape's fraction is taken against the peak measured just before and just after it (the
 * larger), and each timing is the best of 10 batches.
 * Shapes (M x N x K): the MLP's three products for a batch of 100 (784-100-10), the CNN's
 * im2col and dense products (cnn_replica, batch 100), a transformer layer's (768 x 128 x 384,
 * 768 x 512 x 128) and large squares.
 *   build/bin/gemm_bench [--threads N] [--seconds S]     (default 1 thread, 0.3 s a shape)
 * Then the direct convolutions of cnn_replica (executor/cpu/conv_direct.c: forward, input and
 * filter gradients; one thread, as they run), as GFLOP/s of the im2col GEMM they stand for.
 *   build/bin/gemm_bench --conv_only      (just those; --only NAME_PART: the shapes so named)
 * Then bfloat16 and float16 products (cpu_gemm16) beside float32 on the same shapes, with the
 * kernel that ran them.
 * The first line says which CPU and kernels ran (dg_cpu_summary). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_impl.h"
#include "distgraph/distgraph.h"
#include "exec_cpu_impl.h"
#ifdef DG_WITH_BLAS
#include <cblas.h>
#endif

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
// 12 independent chains of fused multiply-adds per iteration, no memory traffic.
#define FMA12(R)                                                                                   \
    "vfmadd231ps %%" R "1,%%" R "1,%%" R "2\n vfmadd231ps %%" R "1,%%" R "1,%%" R "3\n"          \
    "vfmadd231ps %%" R "1,%%" R "1,%%" R "4\n vfmadd231ps %%" R "1,%%" R "1,%%" R "5\n"          \
    "vfmadd231ps %%" R "1,%%" R "1,%%" R "6\n vfmadd231ps %%" R "1,%%" R "1,%%" R "7\n"          \
    "vfmadd231ps %%" R "1,%%" R "1,%%" R "8\n vfmadd231ps %%" R "1,%%" R "1,%%" R "9\n"          \
    "vfmadd231ps %%" R "1,%%" R "1,%%" R "10\n vfmadd231ps %%" R "1,%%" R "1,%%" R "11\n"        \
    "vfmadd231ps %%" R "1,%%" R "1,%%" R "12\n vfmadd231ps %%" R "1,%%" R "1,%%" R "13\n"
#define CLOBBERS "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "cc"

__attribute__((target("avx512f"))) static double peak_avx512(long iters) {
    double t0 = now();
    __asm__ volatile("vxorps %%zmm1,%%zmm1,%%zmm1\n1:\n" FMA12("zmm") "dec %0\n jnz 1b\n"
                     : "+r"(iters)::CLOBBERS);
    return now() - t0;
}

__attribute__((target("avx2,fma"))) static double peak_avx2(long iters) {
    double t0 = now();
    __asm__ volatile("vxorps %%ymm1,%%ymm1,%%ymm1\n1:\n" FMA12("ymm") "dec %0\n jnz 1b\n"
                     : "+r"(iters)::CLOBBERS);
    return now() - t0;
}
#endif

// GFLOP/s of the fused multiply-add loop for isa (16 or 8 floats a register), best of 5
// (about 50 ms in all).
static double fma_peak(cpu_isa isa) {
#if defined(__x86_64__)
    long iters = 4000000;
    double best = INFINITY;
    for (int r = 0; r < 5; r++) {
        double t = isa == CPU_ISA_AVX512 ? peak_avx512(iters) : peak_avx2(iters);
        if (t < best) best = t;
    }
    int lanes = isa == CPU_ISA_AVX512 ? 16 : 8;
    return 2.0 * lanes * 12 * (double)iters / best / 1e9;
#else
    (void)isa;
    return NAN;
#endif
}

typedef struct shape {
    const char *name;
    bool ta, tb;
    int64_t M, N, K;
    double density;   // > 0: only this fraction of A's entries is nonzero (spread at random)
} shape;

static const shape shapes[] = {
    {"mlp_forward_100x784x100", false, false, 100, 100, 784, 0},
    {"mlp_weight_grad_784x100x100", true, false, 784, 100, 100, 0},
    {"mlp_input_grad_100x784x100", false, true, 100, 784, 100, 0},
    {"mlp_logits_100x10x100", false, false, 100, 10, 100, 0},
    {"cnn_im2col_conv1_4096x16x25", false, false, 4096, 16, 25, 0},
    {"cnn_im2col_conv2_1310x32x400", false, false, 1310, 32, 400, 0},
    {"cnn_dense_100x128x1568", false, false, 100, 128, 1568, 0},
    {"transformer_768x128x384", false, false, 768, 128, 384, 0},
    {"transformer_768x512x128", false, false, 768, 512, 128, 0},
    {"gpt_qkv_768x384x128", false, false, 768, 384, 128, 0},
    {"gpt_fc_768x512x128", false, false, 768, 512, 128, 0},
    {"gpt_mlp_proj_768x128x512", false, false, 768, 128, 512, 0},
    {"gpt_qkv_input_grad_768x128x384", false, true, 768, 128, 384, 0},
    {"gpt_mlp_proj_input_grad_768x512x128", false, true, 768, 512, 128, 0},
    {"gpt_qkv_weight_grad_128x384x768", true, false, 128, 384, 768, 0},
    {"gpt_fc_weight_grad_128x512x768", true, false, 128, 512, 768, 0},
    {"gpt_mlp_proj_weight_grad_512x128x768", true, false, 512, 128, 768, 0},
    // Fashion-MNIST's pixels are half zeros: the MLP's first layer on them, and around the
    // density where executor/cpu/gemm_sparse.c gives way to the dense GEMM.
    {"mlp_forward_sparse50_100x100x784", false, false, 100, 100, 784, 0.5},
    {"mlp_weight_grad_sparse50_784x100x100", true, false, 784, 100, 100, 0.5},
    {"mlp_forward_sparse30_100x100x784", false, false, 100, 100, 784, 0.3},
    {"mlp_forward_sparse58_100x100x784", false, false, 100, 100, 784, 0.58},
    {"mlp_weight_grad_sparse58_784x100x100", true, false, 784, 100, 100, 0.58},
    {"transformer_sparse50_768x512x128", false, false, 768, 512, 128, 0.5},
    {"square_512", false, false, 512, 512, 512, 0},
    {"square_1024", false, false, 1024, 1024, 1024, 0},
    {"square_2048", false, false, 2048, 2048, 2048, 0},
};

typedef void (*gemm_fn)(const shape *s, const float *A, const float *B, float *C);

static void run_ours(const shape *s, const float *A, const float *B, float *C) {
    cpu_gemm(DG_FLOAT32, s->ta, s->tb, s->M, s->N, s->K, 1.0, A, s->ta ? s->M : s->K, B, s->tb ? s->K : s->N, 0.0,
             C, s->N);
}

#ifdef DG_WITH_BLAS
static void run_openblas(const shape *s, const float *A, const float *B, float *C) {
    cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans, s->tb ? CblasTrans : CblasNoTrans, (int)s->M,
                (int)s->N, (int)s->K, 1.0f, A, (int)(s->ta ? s->M : s->K), B, (int)(s->tb ? s->K : s->N), 0.0f, C,
                (int)s->N);
}
#endif

static float *filled(int64_t n, int64_t mul, int mod, float off) {
    float *a = malloc((size_t)n * sizeof *a);
    if (!a) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) a[i] = (float)((i * mul) % mod) * 0.1f - off;
    return a;
}

// Seconds per call of f(ctx): the best of 10 timed batches of repeats, each about seconds / 10
// long, after a warm call (JIT, pages, caches).
static double time_best(void (*f)(void *), void *ctx, double seconds) {
    f(ctx);
    double t0 = now();
    f(ctx);
    double one = now() - t0;
    long reps = (long)(seconds / 10 / (one > 1e-7 ? one : 1e-7));
    if (reps < 1) reps = 1;
    double best = INFINITY;
    for (int b = 0; b < 10; b++) {
        t0 = now();
        for (long r = 0; r < reps; r++) f(ctx);
        double t = (now() - t0) / (double)reps;
        if (t < best) best = t;
    }
    return best;
}

typedef struct gemm_call {
    gemm_fn f;
    const shape *s;
    const float *A, *B;
    float *C;
} gemm_call;

static void call_gemm(void *ctx) {
    gemm_call *c = ctx;
    c->f(c->s, c->A, c->B, c->C);
}

// The dense GEMM alone (cpu_gemm with the sparse products turned off), beside run_ours on
// the shapes with a mostly-zero A.
static void run_dense(const shape *s, const float *A, const float *B, float *C) {
    cpu_gemm_set_sparse(false);
    run_ours(s, A, B, C);
    cpu_gemm_set_sparse(true);
}

// GFLOP/s of f on shape s.
static double time_gemm(gemm_fn f, const shape *s, double seconds) {
    float *A = filled(s->M * s->K, 7919, 13, 0.6f), *B = filled(s->K * s->N, 104729, 11, 0.5f);
    uint64_t h = 88172645463325252u;   // xorshift
    for (int64_t i = 0; s->density > 0 && i < s->M * s->K; i++) {
        h ^= h << 13, h ^= h >> 7, h ^= h << 17;
        if ((double)(h >> 11) * 0x1p-53 >= s->density) A[i] = 0;
        else if (A[i] == 0) A[i] = 0.25f;
    }
    float *C = filled(s->M * s->N, 1, 1, 0.0f);
    gemm_call c = {f, s, A, B, C};
    double best = time_best(call_gemm, &c, seconds);
    if (!isfinite(C[0])) {   // the inputs are small: a wrong kernel would show
        fprintf(stderr, "gemm_bench: %s gave a non-finite result\n", s->name);
        exit(1);
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * (double)s->M * (double)s->N * (double)s->K / best / 1e9;
}

// GFLOP/s of cpu_gemm16 (executor/cpu/gemm16.c) on shape s in dtype t, the inputs those of
// time_gemm rounded to t.
typedef struct gemm16_call {
    dg_dtype t;
    const shape *s;
    const uint16_t *A, *B;
    uint16_t *C;
} gemm16_call;

static void call_gemm16(void *ctx) {
    gemm16_call *c = ctx;
    const shape *s = c->s;
    if (!cpu_gemm16(c->t, s->ta, s->tb, s->M, s->N, s->K, c->A, s->ta ? s->M : s->K, c->B, s->tb ? s->K : s->N,
                    c->C, s->N)) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        exit(1);
    }
}

static uint16_t *filled16(dg_dtype t, int64_t n, int64_t mul, int mod, float off) {
    float *f = filled(n, mul, mod, off);
    uint16_t *h = malloc((size_t)n * sizeof *h);
    if (!h) exit(1);
    for (int64_t i = 0; i < n; i++) h[i] = t == DG_BFLOAT16 ? dg_float_to_bfloat16(f[i]) : dg_float_to_float16(f[i]);
    free(f);
    return h;
}

static double time_gemm16(dg_dtype t, const shape *s, double seconds) {
    uint16_t *A = filled16(t, s->M * s->K, 7919, 13, 0.6f), *B = filled16(t, s->K * s->N, 104729, 11, 0.5f);
    uint16_t *C = filled16(t, s->M * s->N, 1, 1, 0.0f);
    gemm16_call c = {t, s, A, B, C};
    double best = time_best(call_gemm16, &c, seconds);
    float c0 = t == DG_BFLOAT16 ? dg_bfloat16_to_float(C[0]) : dg_float16_to_float(C[0]);
    if (!isfinite(c0)) {
        fprintf(stderr, "gemm_bench: %s in %s gave a non-finite result\n", s->name, dg_dtype_name(t));
        exit(1);
    }
    free(A);
    free(B);
    free(C);
    return 2.0 * (double)s->M * (double)s->N * (double)s->K / best / 1e9;
}

// The 16-bit products timed beside float32 on the same shapes (a 1024-wide MLP layer at batch
// 256, its weight gradient, a transformer's, a large square).
static const shape shapes16[] = {
    {"mlp1024_forward_256x1024x1024", false, false, 256, 1024, 1024, 0},
    {"mlp1024_weight_grad_1024x1024x256", true, false, 1024, 1024, 256, 0},
    {"transformer_768x128x384", false, false, 768, 128, 384, 0},
    {"square_1024", false, false, 1024, 1024, 1024, 0},
};

// The direct convolutions (executor/cpu/conv_direct.c) on cnn_replica's two layers, batch 100:
// 5 x 5 windows, stride 1, 'SAME' padding; 1 -> 16 channels at 28 x 28, 16 -> 32 at 14 x 14.
typedef enum { CONV_FWD, CONV_BP_INPUT, CONV_BP_FILTER } conv_pass;
typedef struct conv_case {
    const char *name;
    conv_pass pass;
    graph_conv_geom g;
    bool pooled;   // dy as a 2 x 2 max pool's gradient behind a ReLU leaves it (see pooled_dy)
} conv_case;
#define CNN_CONV1 {100, 28, 28, 1, 5, 5, 1, 1, 28, 28, 16, 2, 2}
#define CNN_CONV2 {100, 14, 14, 16, 5, 5, 1, 1, 14, 14, 32, 2, 2}
static const conv_case convs[] = {
    {"cnn_conv1_forward", CONV_FWD, CNN_CONV1, false},
    {"cnn_conv1_filter_grad", CONV_BP_FILTER, CNN_CONV1, false},
    {"cnn_conv2_forward", CONV_FWD, CNN_CONV2, false},
    {"cnn_conv2_input_grad", CONV_BP_INPUT, CNN_CONV2, false},
    {"cnn_conv2_filter_grad", CONV_BP_FILTER, CNN_CONV2, false},
    {"cnn_conv2_input_grad_pooled", CONV_BP_INPUT, CNN_CONV2, true},
    {"cnn_conv2_filter_grad_pooled", CONV_BP_FILTER, CNN_CONV2, true},
};

// Zeros dy [n, oh, ow, oc] as cnn_replica's step leaves it: in each 2 x 2 window of each channel
// one position (chosen by a hash) keeps its value, and of those 3 in 10 are zero (a ReLU's dead
// units): 0.175 of the entries, as the CNN's conv2 gradient has (0.17 to 0.19 measured).
static void pooled_dy(const graph_conv_geom *g, float *dy) {
    for (int64_t b = 0; b < g->n; b++)
        for (int64_t y = 0; y < g->oh; y++)
            for (int64_t x = 0; x < g->ow; x++)
                for (int64_t o = 0; o < g->oc; o++) {
                    uint32_t w = (uint32_t)(((b * g->oh + y / 2) * g->ow + x / 2) * g->oc + o) * 2654435761u;
                    bool kept = (int64_t)(w >> 30) == (y % 2) * 2 + x % 2 && (w >> 8) % 10 < 7;
                    if (!kept) dy[((b * g->oh + y) * g->ow + x) * g->oc + o] = 0;
                }
}

typedef struct conv_call {
    const conv_case *cc;
    const float *x, *f, *dy;
    float *out;
    bool ok;
} conv_call;

static void call_conv(void *ctx) {
    conv_call *c = ctx;
    const graph_conv_geom *g = &c->cc->g;
    switch (c->cc->pass) {
    case CONV_FWD: c->ok = cpu_conv_direct_fwd_f32(g, c->x, c->f, NULL, c->out); break;
    case CONV_BP_INPUT: c->ok = cpu_conv_direct_bp_input_f32(g, c->f, c->dy, c->out); break;
    case CONV_BP_FILTER: c->ok = cpu_conv_direct_bp_filter_f32(g, c->x, c->dy, c->out); break;
    }
}

// GFLOP/s of one pass (counting every window entry, padding too, as a GEMM of the im2col
// matrix would); NAN where the direct kernel does not apply.
static double time_conv(const conv_case *cc, double seconds) {
    const graph_conv_geom *g = &cc->g;
    int64_t nx = g->n * g->h * g->w * g->c, nf = g->kh * g->kw * g->c * g->oc, ny = g->n * g->oh * g->ow * g->oc;
    float *x = filled(nx, 7919, 13, 0.6f), *f = filled(nf, 104729, 11, 0.5f), *dy = filled(ny, 31, 7, 0.3f);
    int64_t nout = cc->pass == CONV_FWD ? ny : cc->pass == CONV_BP_INPUT ? nx : nf;
    float *out = filled(nout, 1, 1, 0.0f);
    if (cc->pooled) pooled_dy(g, dy);
    conv_call c = {cc, x, f, dy, out, false};
    double best = time_best(call_conv, &c, seconds);
    if (c.ok && !isfinite(out[nout / 2])) {
        fprintf(stderr, "gemm_bench: %s gave a non-finite result\n", cc->name);
        exit(1);
    }
    free(x);
    free(f);
    free(dy);
    free(out);
    return c.ok ? 2.0 * (double)(ny * g->kh * g->kw * g->c) / best / 1e9 : NAN;
}

int main(int argc, char **argv) {
    int threads = 1;
    double seconds = 0.3;
    bool conv_only = false;
    const char *only = NULL;   // a part of the names to run
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
        else if (strcmp(argv[i], "--conv_only") == 0) conv_only = true;
        else if (strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: gemm_bench [--threads N] [--seconds S] [--conv_only] [--only NAME_PART]\n");
            return 2;
        }
    }
    if (threads < 1 || threads > 64 || !(seconds > 0)) {
        fprintf(stderr, "gemm_bench: --threads takes 1..64 and --seconds a positive number\n");
        return 2;
    }
    exec_cpu_set_threads(threads);   // (it holds OpenBLAS to one thread: the splitting is distgraph's)
#ifdef DG_WITH_BLAS
    openblas_set_num_threads(threads);   // OpenBLAS as it comes: its own threads
#endif
    const cpu_gemm_info *info = cpu_gemm_get_info();
    printf("{\"bench\": \"gemm_bench\", \"metric\": \"setup\", \"cpu\": \"%s\", \"summary\": \"%s\", \"threads\": %d}\n",
           info->model, dg_cpu_summary(), threads);
    const char *peak_isa = "none";
    for (cpu_isa isa = CPU_ISA_AVX2; isa <= CPU_ISA_AVX512 && isa <= info->cap; isa++) {
        printf("{\"bench\": \"gemm_bench\", \"metric\": \"fma_peak\", \"isa\": \"%s\", \"value\": %.1f, \"unit\": "
               "\"GFLOP/s\", \"threads\": 1}\n",
               cpu_isa_name(isa), fma_peak(isa));
        peak_isa = cpu_isa_name(isa);
    }
    cpu_isa widest = info->cap >= CPU_ISA_AVX512 ? CPU_ISA_AVX512 : CPU_ISA_AVX2;
    bool has_peak = info->cap >= CPU_ISA_AVX2;
    struct {
        const char *name;
        gemm_fn f;
    } providers[] = {{"distgraph", run_ours},
                     {"distgraph_dense", run_dense},
#ifdef DG_WITH_BLAS
                     {"openblas", run_openblas}
#endif
    };
    for (size_t s = 0; s < (conv_only ? 0 : sizeof shapes / sizeof *shapes); s++)
        for (size_t p = 0; p < sizeof providers / sizeof *providers; p++) {
            if (only && !strstr(shapes[s].name, only)) continue;
            if (providers[p].f == run_dense && !(shapes[s].density > 0)) continue;   // the same as ours
            double before = has_peak ? fma_peak(widest) : NAN;
            double g = time_gemm(providers[p].f, &shapes[s], seconds);
            double after = has_peak ? fma_peak(widest) : NAN;
            // The peak of all the threads: one core's times the threads (each on its own core).
            double peak_all = (before > after ? before : after) * threads;
            printf("{\"bench\": \"gemm_bench\", \"metric\": \"%s\", \"provider\": \"%s\", \"M\": %lld, \"N\": %lld, "
                   "\"K\": %lld, \"value\": %.1f, \"unit\": \"GFLOP/s\", \"of_peak\": %.3f, \"peak\": %.1f, "
                   "\"peak_isa\": \"%s\", \"threads\": %d}\n",
                   shapes[s].name, providers[p].name, (long long)shapes[s].M, (long long)shapes[s].N,
                   (long long)shapes[s].K, g, g / peak_all, peak_all, peak_isa, threads);
            fflush(stdout);
        }
    for (size_t s = 0; s < (conv_only ? 0 : sizeof shapes16 / sizeof *shapes16); s++) {
        if (only && !strstr(shapes16[s].name, only)) continue;
        double f32 = time_gemm(run_ours, &shapes16[s], seconds);
        for (dg_dtype t = DG_BFLOAT16; t <= DG_FLOAT16; t = t == DG_BFLOAT16 ? DG_FLOAT16 : DG_FLOAT16 + 1) {
            double g = time_gemm16(t, &shapes16[s], seconds);
            double peak = has_peak ? fma_peak(widest) * threads : NAN;
            printf("{\"bench\": \"gemm_bench\", \"metric\": \"%s\", \"provider\": \"distgraph\", \"dtype\": \"%s\", "
                   "\"kernel\": \"%s\", \"value\": %.1f, \"unit\": \"GFLOP/s\", \"float32_value\": %.1f, "
                   "\"vs_float32\": %.2f, \"of_float32_peak\": %.3f, \"threads\": %d}\n",
                   shapes16[s].name, dg_dtype_name(t), cpu_gemm16_summary(t), g, f32, g / f32, g / peak, threads);
            fflush(stdout);
        }
    }
    for (size_t i = 0; i < sizeof convs / sizeof *convs; i++) {
        if (only && !strstr(convs[i].name, only)) continue;
        double before = has_peak ? fma_peak(widest) : NAN;
        double g = time_conv(&convs[i], seconds);
        double after = has_peak ? fma_peak(widest) : NAN;
        double peak = before > after ? before : after;
        if (isnan(g)) {
            printf("{\"bench\": \"gemm_bench\", \"metric\": \"%s\", \"provider\": \"distgraph_direct\", "
                   "\"skipped\": \"the direct kernel does not apply\"}\n", convs[i].name);
            continue;
        }
        printf("{\"bench\": \"gemm_bench\", \"metric\": \"%s\", \"provider\": \"distgraph_direct\", \"value\": %.1f, "
               "\"unit\": \"GFLOP/s\", \"of_peak\": %.3f, \"peak\": %.1f, \"peak_isa\": \"%s\", \"threads\": 1}\n",
               convs[i].name, g, g / peak, peak, peak_isa);
        fflush(stdout);
    }
    return 0;
}
