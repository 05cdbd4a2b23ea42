/* gemm_bench: float32 GEMM throughput on the shapes distgraph's models run, beside the core's
 * measured peak. JSON lines:
 *   {"bench": "gemm_bench", "metric": "fma_peak", "isa": "avx512", "value": ..., "unit": "GFLOP/s"}
 *   one line per shape and provider: "distgraph" (cpu_gemm: the dispatch of executor/cpu/gemm.c,
 *   whatever it chose) and "openblas" (cblas_sgemm as the system's OpenBLAS comes, when built
 *   with it), with GFLOP/s and the fraction of the widest peak.
 * The peak is a loop of independent fused multiply-adds on 12 registers (no memory), the most a
 * core can do; a GEMM's fraction of it says how much of the machine it uses. A virtual
 * machine's core can run at half speed for seconds while its host is busy elsewhere, so each
 * shape's fraction is taken against the peak measured just before and just after it (the
 * larger), and each timing is the best of 10 batches.
 * Shapes (M x N x K): the MLP's three products for a batch of 100 (784-100-10), the CNN's
 * im2col and dense products (cnn_replica, batch 100), a transformer layer's (768 x 128 x 384,
 * 768 x 512 x 128) and large squares.
 *   build/bin/gemm_bench [--threads N] [--seconds S]     (default 1 thread, 0.3 s a shape)
 * The first line says which CPU and kernels ran (dg_cpu_summary). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_impl.h"
#include "distgraph/distgraph.h"
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
} shape;

static const shape shapes[] = {
    {"mlp_forward_100x784x100", false, false, 100, 100, 784},
    {"mlp_weight_grad_784x100x100", true, false, 784, 100, 100},
    {"mlp_input_grad_100x784x100", false, true, 100, 784, 100},
    {"mlp_logits_100x10x100", false, false, 100, 10, 100},
    {"cnn_im2col_conv1_4096x16x25", false, false, 4096, 16, 25},
    {"cnn_im2col_conv2_1310x32x400", false, false, 1310, 32, 400},
    {"cnn_dense_100x128x1568", false, false, 100, 128, 1568},
    {"transformer_768x128x384", false, false, 768, 128, 384},
    {"transformer_768x512x128", false, false, 768, 512, 128},
    {"square_512", false, false, 512, 512, 512},
    {"square_1024", false, false, 1024, 1024, 1024},
    {"square_2048", false, false, 2048, 2048, 2048},
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

// GFLOP/s: the best of 10 timed batches of repeats, each about seconds / 10 long.
static double time_gemm(gemm_fn f, const shape *s, double seconds) {
    float *A = malloc((size_t)(s->M * s->K) * sizeof *A), *B = malloc((size_t)(s->K * s->N) * sizeof *B);
    float *C = malloc((size_t)(s->M * s->N) * sizeof *C);
    if (!A || !B || !C) {
        fprintf(stderr, "gemm_bench: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < s->M * s->K; i++) A[i] = (float)((i * 7919) % 13) * 0.1f - 0.6f;
    for (int64_t i = 0; i < s->K * s->N; i++) B[i] = (float)((i * 104729) % 11) * 0.1f - 0.5f;
    double flops = 2.0 * (double)s->M * (double)s->N * (double)s->K;
    f(s, A, B, C);   // warm: JIT, pages, caches
    double t0 = now();
    f(s, A, B, C);
    double one = now() - t0;
    long reps = (long)(seconds / 10 / (one > 1e-7 ? one : 1e-7));
    if (reps < 1) reps = 1;
    double best = INFINITY;
    for (int b = 0; b < 10; b++) {
        t0 = now();
        for (long r = 0; r < reps; r++) f(s, A, B, C);
        double t = (now() - t0) / (double)reps;
        if (t < best) best = t;
    }
    if (!isfinite(C[0])) {   // the inputs are small: a wrong kernel would show
        fprintf(stderr, "gemm_bench: %s gave a non-finite result\n", s->name);
        exit(1);
    }
    free(A);
    free(B);
    free(C);
    return flops / best / 1e9;
}

int main(int argc, char **argv) {
    int threads = 1;
    double seconds = 0.3;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = atoi(argv[++i]);
        else if (strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) seconds = atof(argv[++i]);
        else {
            fprintf(stderr, "usage: gemm_bench [--threads N] [--seconds S]\n");
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
#ifdef DG_WITH_BLAS
                     {"openblas", run_openblas}
#endif
    };
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++)
        for (size_t p = 0; p < sizeof providers / sizeof *providers; p++) {
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
    return 0;
}
