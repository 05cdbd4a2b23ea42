/* The CPU GEMM (executor/cpu/gemm.c) against a float64 reference computed here from the
 * definition: float32 and float64, every transpose, alpha and beta, leading dimensions wider
 * than the matrices, shapes of the MLP, the CNN and a transformer, and products large enough
 * to be split over threads (by rows, and by columns when the rows are few), with one thread and
 * with several. And what runs it: the GEMM must use the widest vectors the CPU offers, or
 * those DG_MAX_CPU_ISA caps it to (CTest runs this test a second time with
 * DG_MAX_CPU_ISA=avx2: test_cpu_gemm_avx2). */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "exec_cpu_impl.h"
#include "testutil.h"

#include "cpu/cpu_impl.h"

typedef struct shape {
    bool ta, tb;
    int64_t M, N, K;
} shape;

// C = alpha op(A) op(B) + beta C0 in float64; A, B, C0 as stored (float32 or float64).
static void reference(dg_dtype t, const shape *s, double alpha, const void *A, int64_t lda, const void *B,
                      int64_t ldb, double beta, const void *C0, int64_t ldc, double *out, double *scale) {
    for (int64_t i = 0; i < s->M; i++)
        for (int64_t j = 0; j < s->N; j++) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < s->K; k++) {
                int64_t ai = s->ta ? k * lda + i : i * lda + k, bi = s->tb ? j * ldb + k : k * ldb + j;
                double a = t == DG_FLOAT32 ? ((const float *)A)[ai] : ((const double *)A)[ai];
                double b = t == DG_FLOAT32 ? ((const float *)B)[bi] : ((const double *)B)[bi];
                acc += a * b;
                mag += fabs(a * b);
            }
            double c = t == DG_FLOAT32 ? ((const float *)C0)[i * ldc + j] : ((const double *)C0)[i * ldc + j];
            out[i * s->N + j] = alpha * acc + (beta == 0 ? 0 : beta * c);
            double sc = fabs(alpha) * mag + fabs(beta * c);
            if (!(sc <= *scale)) *scale = sc;   // a NaN sticks (and then fails every comparison)
        }
}

static void *randoms(dg_dtype t, int64_t n, uint64_t *seed) {
    size_t e = t == DG_FLOAT32 ? sizeof(float) : sizeof(double);
    void *p = malloc((size_t)n * e + 1);
    assert_non_null(p);
    for (int64_t i = 0; i < n; i++) {
        double v = dg_test_uniform(seed, -1, 1);
        if (t == DG_FLOAT32) ((float *)p)[i] = (float)v;
        else ((double *)p)[i] = v;
    }
    return p;
}

// One product checked: every element within the rounding of a K-term sum in the dtype. With
// density > 0, only about that fraction of A's entries is nonzero (some zeros are -0), as
// behind a ReLU or in an image's background.
static void check_sparse(dg_dtype t, const shape *s, double alpha, double beta, int pad, double density,
                         uint64_t *seed) {
    int64_t arows = s->ta ? s->K : s->M, acols = s->ta ? s->M : s->K;
    int64_t brows = s->tb ? s->N : s->K, bcols = s->tb ? s->K : s->N;
    int64_t lda = acols + pad, ldb = bcols + pad, ldc = s->N + pad;
    void *A = randoms(t, arows * lda, seed), *B = randoms(t, brows * ldb, seed);
    for (int64_t i = 0; density > 0 && i < arows * lda; i++) {
        double u = dg_test_uniform(seed, 0, 1);
        if (u < density) continue;
        double z = u < density + (1 - density) / 8 ? -0.0 : 0.0;
        if (t == DG_FLOAT32) ((float *)A)[i] = (float)z;
        else ((double *)A)[i] = z;
    }
    void *C = randoms(t, s->M * ldc, seed), *C0 = randoms(t, s->M * ldc, seed);
    size_t e = t == DG_FLOAT32 ? sizeof(float) : sizeof(double);
    memcpy(C0, C, (size_t)(s->M * ldc) * e);
    double *want = malloc((size_t)(s->M * s->N) * sizeof *want + 1);
    assert_non_null(want);
    double scale = 0;
    reference(t, s, alpha, A, lda, B, ldb, beta, C0, ldc, want, &scale);
    cpu_gemm(t, s->ta, s->tb, s->M, s->N, s->K, alpha, A, lda, B, ldb, beta, C, ldc);
    double eps = t == DG_FLOAT32 ? 0x1p-23 : 0x1p-52;
    // A blocked sum's error grows with the number of terms, at worst like K eps; the bound is
    // a few times what a float32 sum of K terms can do, far below one wrong term's size.
    double atol = 4 * (double)(s->K + 2) * eps * scale + 1e-30;
    for (int64_t i = 0; i < s->M; i++) {
        double got_row[4096];
        for (int64_t j = 0; j < s->N; j++)
            got_row[j] = t == DG_FLOAT32 ? ((float *)C)[i * ldc + j] : ((double *)C)[i * ldc + j];
        int64_t far = dg_test_first_far_f64(got_row, want + i * s->N, s->N, atol, 0);
        if (far >= 0)
            fail_msg("%s %c%c M=%lld N=%lld K=%lld alpha=%g beta=%g pad=%d threads=%d: C[%lld][%lld] = %.9g, "
                     "want %.9g (atol %.3g)",
                     t == DG_FLOAT32 ? "float32" : "float64", s->ta ? 'T' : 'N', s->tb ? 'T' : 'N',
                     (long long)s->M, (long long)s->N, (long long)s->K, alpha, beta, pad, exec_cpu_threads(),
                     (long long)i, (long long)far, got_row[far], want[i * s->N + far], atol);
        // The padding of each row of C is not written.
        for (int64_t j = s->N; j < ldc; j++) {
            double got = t == DG_FLOAT32 ? ((float *)C)[i * ldc + j] : ((double *)C)[i * ldc + j];
            double was = t == DG_FLOAT32 ? ((float *)C0)[i * ldc + j] : ((double *)C0)[i * ldc + j];
            if (memcmp(&got, &was, sizeof got) != 0) fail_msg("C[%lld][%lld], past N, was written", (long long)i, (long long)j);
        }
    }
    free(A);
    free(B);
    free(C);
    free(C0);
    free(want);
}

static void check(dg_dtype t, const shape *s, double alpha, double beta, int pad, uint64_t *seed) {
    check_sparse(t, s, alpha, beta, pad, 0, seed);
}

// Kept small enough for memcheck (the reference is a triple loop): the split ones hold just
// over GEMM_SPLIT_MACS (2^21) multiply-adds.
static const shape shapes[] = {
    {false, false, 1, 1, 1},      {false, false, 7, 5, 3},     {true, false, 13, 17, 9},
    {false, true, 33, 31, 65},    {true, true, 16, 48, 16},    {false, false, 100, 100, 784},   // MLP forward
    {true, false, 200, 100, 100}, {false, true, 100, 200, 100}, {false, false, 100, 10, 100},  // MLP gradients, logits
    {false, false, 256, 32, 400},   // CNN (im2col of 5x5x16)
    {false, false, 700, 37, 100},   {false, true, 37, 700, 100},   // split by rows / by columns
    {true, true, 130, 130, 131},
};

static void run_all(dg_dtype t, int threads) {
    exec_cpu_set_threads(threads);
    uint64_t seed = 5 + (uint64_t)threads;
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape *s = &shapes[i];
        check(t, s, 1.0, 0.0, 0, &seed);
        if (s->M * s->N * s->K <= ((int64_t)1 << 22)) check(t, s, -0.5, 1.25, 3, &seed);
    }
    exec_cpu_set_threads(0);
}

static void test_f32_one_thread(void **state) {
    (void)state;
    run_all(DG_FLOAT32, 1);
}

static void test_f32_threads(void **state) {
    (void)state;
    run_all(DG_FLOAT32, 4);
}

static void test_f64(void **state) {
    (void)state;
    run_all(DG_FLOAT64, 1);
    run_all(DG_FLOAT64, 3);
}

// A NaN or an infinity in an input reaches the outputs that depend on it (no kernel may skip a
// multiply by a zero and so drop it).
static void test_nan_propagates(void **state) {
    (void)state;
    enum { M = 64, N = 64, K = 64 };
    static float A[M * K], B[K * N], C[M * N];
    for (int i = 0; i < M * K; i++) A[i] = 0;
    for (int i = 0; i < K * N; i++) B[i] = 1;
    A[3 * K + 5] = NAN;
    cpu_gemm(DG_FLOAT32, false, false, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            if (i == 3) assert_true(isnan(C[i * N + j]));
            else assert_true(C[i * N + j] == 0);
        }
}

// Products whose A is mostly zero visit only its nonzeros (executor/cpu/gemm_sparse.c): A B and
// A^T B, widths that are and are not multiples of 16, one panel and several, chunks of B's rows
// with and without a remainder, padded leading dimensions, one thread and pieces on several.
// Each must agree with float64, and the sparse kernels must have run (the counter), except
// where they must not: alpha or beta not (1, 0), B transposed, A dense, N or K below 16.
static const struct sparse_case {
    shape s;
    double density;
    bool sparse;   // the sparse kernels must run
} sparse_cases[] = {
    {{false, false, 100, 100, 784}, 0.5, true},   {{true, false, 784, 100, 100}, 0.5, true},   // the MLP's
    {{false, false, 37, 16, 16}, 0.3, true},      {{true, false, 33, 17, 19}, 0.3, true},
    {{false, false, 20, 130, 70}, 0.4, true},     {{true, false, 45, 300, 40}, 0.2, true},
    {{false, false, 64, 1000, 33}, 0.5, true},    {{false, false, 17, 64, 200}, 0.05, true},
    {{false, false, 50, 100, 100}, 0.9, false},   {{false, true, 50, 100, 100}, 0.3, false},
    {{false, false, 50, 15, 100}, 0.3, false},    {{false, false, 50, 100, 15}, 0.3, false},
    {{false, false, 700, 40, 100}, 0.3, true},    {{true, false, 700, 40, 100}, 0.3, true},   // split over threads
    {{false, false, 20, 700, 160}, 0.3, true},    // split by columns (few rows)
    {{false, false, 20, 130, 200}, 0.4, true},    {{true, false, 45, 300, 200}, 0.3, true},   // panels and chunks
    {{false, false, 30, 100, 128}, 0.4, true},    // K two whole chunks (of 64 rows, for 7 vectors)
};

static void test_sparse_products(void **state) {
    (void)state;
    uint64_t seed = 77;
    for (int threads = 1; threads <= 4; threads += 3) {
        exec_cpu_set_threads(threads);
        for (size_t i = 0; i < sizeof sparse_cases / sizeof *sparse_cases; i++) {
            const struct sparse_case *c = &sparse_cases[i];
            for (int pad = 0; pad <= 5; pad += 5) {
                int64_t before = atomic_load(&cpu_gemm_sparse_calls);
                check_sparse(DG_FLOAT32, &c->s, 1.0, 0.0, pad, c->density, &seed);
                bool ran = atomic_load(&cpu_gemm_sparse_calls) > before;
                if (ran != c->sparse)
                    fail_msg("case %zu (%c M=%lld N=%lld K=%lld density %.2f pad %d threads %d): the sparse kernels %s",
                             i, c->s.ta ? 'T' : 'N', (long long)c->s.M, (long long)c->s.N, (long long)c->s.K,
                             c->density, pad, threads, ran ? "ran" : "did not run");
            }
            // alpha and beta other than (1, 0) go to the dense GEMM, and are right there.
            int64_t before = atomic_load(&cpu_gemm_sparse_calls);
            check_sparse(DG_FLOAT32, &c->s, -0.5, 1.25, 3, c->density, &seed);
            assert_int_equal(atomic_load(&cpu_gemm_sparse_calls), before);
        }
    }
    // Turned off, they never run.
    cpu_gemm_set_sparse(false);
    int64_t before = atomic_load(&cpu_gemm_sparse_calls);
    check_sparse(DG_FLOAT32, &sparse_cases[0].s, 1.0, 0.0, 0, 0.5, &seed);
    assert_int_equal(atomic_load(&cpu_gemm_sparse_calls), before);
    cpu_gemm_set_sparse(true);
    exec_cpu_set_threads(0);
}

// An A too long for one block of lists (gemm_sparse.c lists 2^20 of A's entries at a time):
// its rows go in two blocks.
static void test_sparse_blocks(void **state) {
    (void)state;
    exec_cpu_set_threads(1);
    uint64_t seed = 78;
    const shape s[] = {{false, false, 150, 16, 8000}, {true, false, 150, 16, 8000}, {false, false, 150, 20, 8000}};
    for (int i = 0; i < 3; i++) {
        int64_t before = atomic_load(&cpu_gemm_sparse_calls);
        check_sparse(DG_FLOAT32, &s[i], 1.0, 0.0, 0, 0.3, &seed);
        assert_int_equal(atomic_load(&cpu_gemm_sparse_calls), before + 1);
    }
    exec_cpu_set_threads(0);
}

// Rows whose nonzeros all fall in some chunks of B's rows: a row of C with none in the first
// chunk must still start from zero, one with none in a later chunk keeps its sums. C starts as
// garbage; A's row r is nonzero only in k of [64 (r % 4), 64 (r % 4) + 20), and row 5 is all
// zeros.
static void test_sparse_empty_chunks(void **state) {
    (void)state;
    exec_cpu_set_threads(1);
    enum { M = 8, N = 100, K = 256 };
    static float A[M * K], B[K * N], C[M * N];
    for (int r = 0; r < M; r++)
        for (int k = 0; k < K; k++)
            A[r * K + k] = r != 5 && k >= 64 * (r % 4) && k < 64 * (r % 4) + 20 ? (float)(1 + (r + k) % 3) : 0.0f;
    for (int i = 0; i < K * N; i++) B[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < M * N; i++) C[i] = 12345.0f;
    int64_t before = atomic_load(&cpu_gemm_sparse_calls);
    cpu_gemm(DG_FLOAT32, false, false, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
    assert_int_equal(atomic_load(&cpu_gemm_sparse_calls), before + 1);
    for (int r = 0; r < M; r++)
        for (int j = 0; j < N; j++) {
            double want = 0;   // small integers: exact in float32 in any order
            for (int k = 0; k < K; k++) want += (double)A[r * K + k] * B[k * N + j];
            if (C[r * N + j] != want) fail_msg("C[%d][%d] = %g, want %g", r, j, (double)C[r * N + j], want);
        }
    exec_cpu_set_threads(0);
}

// A zero of A times an infinity or a NaN of B is a NaN, as in the dense product: where B is
// not finite, the product is the dense GEMM's. A NaN of A is not zero and is carried.
static void test_sparse_not_finite(void **state) {
    (void)state;
    exec_cpu_set_threads(1);
    enum { M = 48, N = 40, K = 64 };
    static float A[M * K], B[K * N], C[M * N];
    const float bad[] = {INFINITY, -INFINITY, NAN};
    for (int v = 0; v < 3; v++) {
        for (int i = 0; i < M * K; i++) A[i] = i % 4 == 0 ? 1.0f : 0.0f;   // column 5 of A is all zeros
        for (int i = 0; i < K * N; i++) B[i] = 0.5f;
        B[5 * N + 7] = bad[v];   // meets only zeros of A
        int64_t before = atomic_load(&cpu_gemm_sparse_calls);
        cpu_gemm(DG_FLOAT32, false, false, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
        assert_int_equal(atomic_load(&cpu_gemm_sparse_calls), before);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                if (j == 7) assert_true(isnan(C[i * N + j]));
                else assert_true(C[i * N + j] == 16 * 0.5f);
            }
    }
    for (int i = 0; i < K * N; i++) B[i] = 0.5f;
    A[3 * K + 8] = NAN;
    int64_t before = atomic_load(&cpu_gemm_sparse_calls);
    cpu_gemm(DG_FLOAT32, false, false, M, N, K, 1.0, A, K, B, N, 0.0, C, N);
    assert_int_equal(atomic_load(&cpu_gemm_sparse_calls), before + 1);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            if (i == 3) assert_true(isnan(C[i * N + j]));
            else assert_true(C[i * N + j] == 16 * 0.5f);
        }
    exec_cpu_set_threads(0);
}

// What runs the GEMM: never narrower vectors than the CPU has, unless DG_MAX_CPU_ISA says so.
static void test_widest_isa(void **state) {
    (void)state;
    const cpu_gemm_info *i = cpu_gemm_get_info();
    const char *cap = getenv("DG_MAX_CPU_ISA");
    print_message("CPU %s: %s; cap %s; float32 GEMM %s %s (%s); float64 %s %s (%s)\n", i->model,
                  cpu_isa_name(i->cpu), cpu_isa_name(i->cap), i->f32_provider, i->f32_kernel, cpu_isa_name(i->f32_isa),
                  i->f64_provider, i->f64_kernel, cpu_isa_name(i->f64_isa));
    if (cap && *cap && strcmp(cap, cpu_isa_name(i->cpu)) != 0) {
        // Capped below what the CPU has: the cap must be what runs.
        if (strcmp(cap, "avx2") == 0 && i->cpu >= CPU_ISA_AVX2) {
            assert_int_equal(i->cap, CPU_ISA_AVX2);
            assert_true(i->capped);
        }
    } else {
        assert_int_equal(i->cap, i->cpu);
        assert_false(i->capped);
    }
#ifdef DG_WITH_DNNL_EXPECTED
    const char *pick = getenv("DG_GEMM");
    if (!pick || strcmp(pick, "openblas") != 0) assert_true(strncmp(i->f32_provider, "oneDNN", 6) == 0);
    else assert_true(strcmp(i->f32_provider, "OpenBLAS") == 0);
#endif
    // Our own dispatch must use the widest vectors; OpenBLAS asked for by name (DG_GEMM=openblas)
    // runs the kernels it picked when it loaded, narrower on a CPU it does not know (Debian's
    // falls back to SSE3 on some: what dg-inspect cpu then calls NARROWER).
    const char *forced = getenv("DG_GEMM");
    bool openblas_forced = forced && strcmp(forced, "openblas") == 0;
    if (i->f32_isa < i->cap && !openblas_forced)
        fail_msg("the float32 GEMM (%s %s) runs %s vectors where the CPU offers %s", i->f32_provider, i->f32_kernel,
                 cpu_isa_name(i->f32_isa), cpu_isa_name(i->cap));
    // oneDNN takes the cap; OpenBLAS cannot (it fixes its kernels when it loads).
    if (i->cap < i->cpu && i->f32_isa > i->cap && strncmp(i->f32_provider, "oneDNN", 6) == 0)
        fail_msg("the float32 GEMM (%s %s) runs %s vectors above DG_MAX_CPU_ISA=%s", i->f32_provider,
                 i->f32_kernel, cpu_isa_name(i->f32_isa), cpu_isa_name(i->cap));
    // The summary says what runs.
    const char *line = dg_cpu_summary();
    assert_non_null(strstr(line, i->f32_kernel));
    assert_non_null(strstr(line, cpu_isa_name(i->cpu)));
}

// DG_INTRA_OP_THREADS sets the default thread count (what dg-launch gives its tasks); a value
// that is not a count in 1..64 is ignored, and the default is the cores again.
static void test_threads_from_env(void **state) {
    (void)state;
    unsetenv("DG_INTRA_OP_THREADS");
    int cores = exec_cpu_default_threads();
    assert_true(cores >= 1 && cores <= 64);
    setenv("DG_INTRA_OP_THREADS", "3", 1);
    assert_int_equal(exec_cpu_default_threads(), 3);
    exec_cpu_set_threads(0);
    assert_int_equal(exec_cpu_threads(), 3);
    exec_cpu_set_threads(2);   // the session's option wins
    assert_int_equal(exec_cpu_threads(), 2);
    const char *bad[] = {"0", "65", "-1", "2x", "", "many"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("DG_INTRA_OP_THREADS", bad[i], 1);
        assert_int_equal(exec_cpu_default_threads(), cores);
    }
    unsetenv("DG_INTRA_OP_THREADS");
    exec_cpu_set_threads(0);
    assert_int_equal(exec_cpu_threads(), cores);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_widest_isa),     cmocka_unit_test(test_f32_one_thread), cmocka_unit_test(test_f32_threads),
        cmocka_unit_test(test_f64),            cmocka_unit_test(test_nan_propagates),
        cmocka_unit_test(test_threads_from_env), cmocka_unit_test(test_sparse_products),
        cmocka_unit_test(test_sparse_blocks),  cmocka_unit_test(test_sparse_empty_chunks),
        cmocka_unit_test(test_sparse_not_finite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
