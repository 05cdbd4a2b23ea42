/* The CPU GEMM, and what runs it on this machine.
 *
 * float32 goes to oneDNN when built with it (DG_WITH_DNNL): it picks its JIT kernels from
 * CPUID when it runs (AVX-512 with VNNI, BF16 or AMX, AVX2, SSE4.1), so a CPU newer than the
 * system's OpenBLAS still gets its widest vectors; Debian's OpenBLAS 0.3.21 falls back to its
 * SSE3 kernels on a CPU it does not know. Measured on an AVX-512 Xeon (bench/gemm_bench, one
 * thread): oneDNN 100-128 GFLOP/s on the MLP's shapes and 126-128 on large squares, OpenBLAS
 * with the right core 87-101 and 116-120, against a peak of about 145-149. float64 (tests and
 * small models) goes to OpenBLAS; without either library, a plain loop.
 *
 * DG_GEMM=openblas takes OpenBLAS for float32 too (a comparison; and memcheck, which reports
 * oneDNN's JIT kernels reading whole vectors past the end of its own buffers, by design, and
 * runs them slowly: scripts/test.sh sets it for its valgrind pass).
 *
 * DG_MAX_CPU_ISA (avx512, avx2, sse41) caps the vector instructions the GEMM may use, as if
 * the CPU had no wider ones: the narrower paths can be tested on a wide machine. An unknown
 * value is ignored with a warning.
 *
 * Threads: cpu_gemm splits a product of at least GEMM_SPLIT_MACS multiply-adds by rows (or by
 * columns when it has few rows) over up to exec_cpu_threads() threads of its own pool, which
 * sleep between products. Each piece runs one-threaded in oneDNN (its OpenMP team is held
 * to one thread per calling thread: OpenMP's waiting threads spin for a while after each
 * product, which on a host shared by several tasks costs more than it gains). A call that finds
 * the pool taken by another thread runs alone on its own thread. The default count is the
 * cores this process may use, or DG_INTRA_OP_THREADS (1-64) where set: dg-launch sets it to
 * share the cores among the tasks it starts on one host, since tasks that each take every core
 * preempt one another's executors. */
#include <cpuid.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>
#include <unistd.h>

#include "cpu_impl.h"
#include "exec_cpu_impl.h"
#include "exec_executor_impl.h"
#include "exec_fp_impl.h"
#ifdef DG_WITH_BLAS
#include <cblas.h>
#endif
#ifdef DG_WITH_DNNL
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#ifndef DG_WITH_BLAS
// C = alpha op(A) op(B) + beta C, row-major; the loop order keeps B and C rows streaming. A zero
// of A is multiplied like any value (0 x inf is a NaN, as in the libraries' kernels).
#define DEFINE_GEMM(T, NAME)                                                                      \
    static void NAME(bool ta, bool tb, int64_t M, int64_t N, int64_t K, T alpha, const T *A,      \
                     int64_t lda, const T *B, int64_t ldb, T beta, T *C, int64_t ldc) {            \
        for (int64_t i = 0; i < M; i++) {                                                         \
            T *c = C + i * ldc;                                                                   \
            for (int64_t j = 0; j < N; j++) c[j] = beta == 0 ? 0 : beta * c[j];                   \
            for (int64_t k = 0; k < K; k++) {                                                     \
                T a = alpha * (ta ? A[k * lda + i] : A[i * lda + k]);                             \
                if (tb)                                                                           \
                    for (int64_t j = 0; j < N; j++) c[j] += a * B[j * ldb + k];                   \
                else                                                                              \
                    for (int64_t j = 0; j < N; j++) c[j] += a * B[k * ldb + j];                   \
            }                                                                                     \
        }                                                                                         \
    }
DEFINE_GEMM(float, gemm_reference_f32)
DEFINE_GEMM(double, gemm_reference_f64)
#endif

// Products smaller than this many multiply-adds run on the calling thread alone.
#define GEMM_SPLIT_MACS ((int64_t)1 << 21)
#define GEMM_MAX_THREADS 64

// ---- what the CPU offers ----

static cpu_isa isa_of_cpu(bool *bf16, bool *fp16, bool *amx, bool *vnni) {
    *bf16 = *fp16 = *amx = *vnni = false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    unsigned a, b, c, d;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
        *vnni = (c >> 11) & 1;
        *fp16 = (d >> 23) & 1;
        *amx = (d >> 24) & 1;   // AMX-TILE
    }
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) *bf16 = (a >> 5) & 1;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CPU_ISA_AVX2;
    if (__builtin_cpu_supports("sse4.1")) return CPU_ISA_SSE41;
#endif
    return CPU_ISA_BASELINE;
}

static void cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "unknown CPU");
#if defined(__x86_64__) || defined(__i386__)
    unsigned regs[12];
    if (__get_cpuid_max(0x80000000, NULL) < 0x80000004) return;
    for (unsigned i = 0; i < 3; i++)
        __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    char brand[49];
    memcpy(brand, regs, 48);
    brand[48] = 0;
    const char *s = brand;
    while (*s == ' ') s++;
    size_t n = strlen(s);
    while (n && s[n - 1] == ' ') n--;
    if (n) snprintf(out, cap, "%.*s", (int)n, s);
#endif
}

const char *cpu_isa_name(cpu_isa i) {
    switch (i) {
    case CPU_ISA_AVX512: return "avx512";
    case CPU_ISA_AVX2: return "avx2";
    case CPU_ISA_SSE41: return "sse41";
    default: return "baseline";
    }
}

static bool isa_from_name(const char *s, cpu_isa *out) {
    for (int i = CPU_ISA_BASELINE; i <= CPU_ISA_AVX512; i++)
        if (strcmp(s, cpu_isa_name((cpu_isa)i)) == 0) {
            *out = (cpu_isa)i;
            return true;
        }
    return false;
}

// ---- the providers ----

static cpu_gemm_info info;
static pthread_once_t info_once = PTHREAD_ONCE_INIT;

#ifdef DG_WITH_DNNL
// oneDNN's name for the instructions it runs, and their width in our terms.
static const char *dnnl_isa_name(dnnl_cpu_isa_t i, cpu_isa *width) {
    switch ((int)i) {
    case dnnl_cpu_isa_sse41: *width = CPU_ISA_SSE41; return "sse41";
    case dnnl_cpu_isa_avx: *width = CPU_ISA_SSE41; return "avx";
    case dnnl_cpu_isa_avx2: *width = CPU_ISA_AVX2; return "avx2";
#if DNNL_VERSION_MAJOR > 2 || (DNNL_VERSION_MAJOR == 2 && DNNL_VERSION_MINOR >= 5)
    case dnnl_cpu_isa_avx2_vnni: *width = CPU_ISA_AVX2; return "avx2_vnni";
#endif
    case dnnl_cpu_isa_avx512_core: *width = CPU_ISA_AVX512; return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: *width = CPU_ISA_AVX512; return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: *width = CPU_ISA_AVX512; return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: *width = CPU_ISA_AVX512; return "avx512_core_amx";
    default: *width = CPU_ISA_BASELINE; return "unknown";
    }
}

static dnnl_cpu_isa_t dnnl_cap(cpu_isa i) {
    switch (i) {
    case CPU_ISA_AVX512: return dnnl_cpu_isa_all;
    case CPU_ISA_AVX2: return dnnl_cpu_isa_avx2;
    case CPU_ISA_SSE41: return dnnl_cpu_isa_sse41;
    default: return dnnl_cpu_isa_sse41;   // oneDNN's narrowest
    }
}
#endif

static void info_init(void) {
    cpu_model(info.model, sizeof info.model);
    info.cpu = isa_of_cpu(&info.has_bf16, &info.has_fp16, &info.has_amx, &info.has_vnni);
    info.cap = info.cpu;
    const char *env = getenv("DG_MAX_CPU_ISA");
    if (env && *env) {
        cpu_isa c;
        if (!isa_from_name(env, &c))
            fprintf(stderr, "distgraph: DG_MAX_CPU_ISA=\"%s\" is not one of avx512, avx2, sse41, baseline: ignored\n",
                    env);
        else if (c < info.cap) {
            info.cap = c;
            info.capped = true;
        }
    }
    const char *sparse = getenv("DG_GEMM_SPARSE");
    info.f32_sparse = !(sparse && strcmp(sparse, "0") == 0);
    if (sparse && *sparse && strcmp(sparse, "0") != 0 && strcmp(sparse, "1") != 0)
        fprintf(stderr, "distgraph: DG_GEMM_SPARSE=\"%s\" is not 0 or 1: ignored\n", sparse);
    snprintf(info.f32_provider, sizeof info.f32_provider, "reference loops");
    snprintf(info.f32_kernel, sizeof info.f32_kernel, "compiler's %s", "baseline");
    info.f32_isa = CPU_ISA_BASELINE;
#ifdef DG_WITH_BLAS
    snprintf(info.f64_provider, sizeof info.f64_provider, "OpenBLAS");
    const char *core = openblas_get_corename();
    snprintf(info.f64_kernel, sizeof info.f64_kernel, "%s", core ? core : "unknown");
    // OpenBLAS names the core whose kernels it took; the generic x86-64 ones are SSE2/SSE3.
    // (and Sandybridge's are AVX: below AVX2, counted with them).
    static const char *const sse_cores[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Atom",
                                            "Katmai", "Coppermine", "Northwood", "Banias", "Opteron", "Barcelona",
                                            "Sandybridge", "Bulldozer", NULL};
    info.f64_isa = CPU_ISA_AVX2;
    for (int i = 0; core && sse_cores[i]; i++)
        if (strcasecmp(core, sse_cores[i]) == 0) info.f64_isa = CPU_ISA_SSE41;
    if (core && (strcasecmp(core, "SkylakeX") == 0 || strcasecmp(core, "Cooperlake") == 0 ||
                 strcasecmp(core, "SapphireRapids") == 0))
        info.f64_isa = CPU_ISA_AVX512;
    snprintf(info.f32_provider, sizeof info.f32_provider, "OpenBLAS");
    snprintf(info.f32_kernel, sizeof info.f32_kernel, "%s", info.f64_kernel);
    info.f32_isa = info.f64_isa;
#else
    snprintf(info.f64_provider, sizeof info.f64_provider, "reference loops");
    snprintf(info.f64_kernel, sizeof info.f64_kernel, "compiler's baseline");
    info.f64_isa = CPU_ISA_BASELINE;
#endif
#ifdef DG_WITH_DNNL
    const char *pick = getenv("DG_GEMM");
    if (pick && *pick && strcmp(pick, "onednn") != 0) {
#ifdef DG_WITH_BLAS
        if (strcmp(pick, "openblas") == 0) {
            info.f32_openblas = true;
            return;
        }
#endif
        fprintf(stderr, "distgraph: DG_GEMM=\"%s\" is not one of onednn, openblas (when built with it): ignored\n",
                pick);
    }
    // Before oneDNN's first product: it fixes its instructions then.
    if (info.cap < info.cpu) dnnl_set_max_cpu_isa(dnnl_cap(info.cap));
    const dnnl_version_t *v = dnnl_version();
    snprintf(info.f32_provider, sizeof info.f32_provider, "oneDNN %d.%d.%d", v->major, v->minor, v->patch);
    cpu_isa w;
    const char *k = dnnl_isa_name(dnnl_get_effective_cpu_isa(), &w);
    snprintf(info.f32_kernel, sizeof info.f32_kernel, "%s", k);
    info.f32_isa = w;
#endif
}

const cpu_gemm_info *cpu_gemm_get_info(void) {
    pthread_once(&info_once, info_init);
    return &info;
}

void cpu_gemm_set_sparse(bool on) {
    cpu_gemm_get_info();
    info.f32_sparse = on;
}

// ---- threads ----

static atomic_int gemm_threads;   // 0: not set, the default

// DG_INTRA_OP_THREADS: a count in 1..GEMM_MAX_THREADS, or 0 (unset, or not such a count,
// which is warned of once).
static int env_threads(void) {
    static atomic_int warned;
    const char *e = getenv("DG_INTRA_OP_THREADS");
    if (!e || !*e) return 0;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end == 0 && v >= 1 && v <= GEMM_MAX_THREADS) return (int)v;
    if (!atomic_exchange(&warned, 1))
        fprintf(stderr, "distgraph: DG_INTRA_OP_THREADS=%s is not a thread count in 1..%d; ignored\n", e,
                GEMM_MAX_THREADS);
    return 0;
}

int exec_cpu_default_threads(void) {
    int from_env = env_threads();
    if (from_env > 0) return from_env;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n < GEMM_MAX_THREADS ? n : GEMM_MAX_THREADS;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n < GEMM_MAX_THREADS ? (int)n : GEMM_MAX_THREADS;
}

void exec_cpu_set_threads(int n) {
    if (n <= 0) n = exec_cpu_default_threads();
    if (n > GEMM_MAX_THREADS) n = GEMM_MAX_THREADS;
    atomic_store(&gemm_threads, n);
#ifdef DG_WITH_BLAS
    openblas_set_num_threads(1);   // the splitting is ours
#endif
}

int exec_cpu_threads(void) {
    int n = atomic_load(&gemm_threads);
    if (n > 0) return n;
    // Not set (a process that made no session, such as a worker-only dg-server): the default,
    // kept, so that each product does not read the environment and the affinity mask again.
    int none = 0;
    n = exec_cpu_default_threads();
    atomic_compare_exchange_strong(&gemm_threads, &none, n);
    return atomic_load(&gemm_threads);
}

typedef struct gemm_args {
    dg_dtype t;
    bool ta, tb;
    int64_t M, N, K;
    double alpha, beta;
    const void *A, *B;
    void *C;
    int64_t lda, ldb, ldc;
    bool dense;   // never the sparse products (cpu_gemm_dense)
} gemm_args;

static void gemm_one(const gemm_args *g) {
    int64_t M = g->M, N = g->N, K = g->K;
    if (g->t == DG_FLOAT32 && info.f32_sparse && !g->dense && !g->tb && g->alpha == 1 && g->beta == 0 &&
        cpu_gemm_sparse_f32(g->ta, M, N, K, g->A, g->lda, g->B, g->ldb, g->C, g->ldc, info.cap))
        return;
#ifdef DG_WITH_DNNL
    if (g->t == DG_FLOAT32 && !info.f32_openblas) {
        static __thread bool one_thread;
        if (!one_thread) {
            omp_set_num_threads(1);
            one_thread = true;
        }
        dnnl_sgemm(g->ta ? 'T' : 'N', g->tb ? 'T' : 'N', M, N, K, (float)g->alpha, g->A, g->lda, g->B, g->ldb,
                   (float)g->beta, g->C, g->ldc);
        return;
    }
#endif
#ifdef DG_WITH_BLAS
    CBLAS_TRANSPOSE a = g->ta ? CblasTrans : CblasNoTrans, b = g->tb ? CblasTrans : CblasNoTrans;
    if (g->t == DG_FLOAT32)
        cblas_sgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, (float)g->alpha, g->A, (int)g->lda, g->B,
                    (int)g->ldb, (float)g->beta, g->C, (int)g->ldc);
    else
        cblas_dgemm(CblasRowMajor, a, b, (int)M, (int)N, (int)K, g->alpha, g->A, (int)g->lda, g->B, (int)g->ldb,
                    g->beta, g->C, (int)g->ldc);
#else
    if (g->t == DG_FLOAT32)
        gemm_reference_f32(g->ta, g->tb, M, N, K, (float)g->alpha, g->A, g->lda, g->B, g->ldb, (float)g->beta,
                               g->C, g->ldc);
    else
        gemm_reference_f64(g->ta, g->tb, M, N, K, g->alpha, g->A, g->lda, g->B, g->ldb, g->beta, g->C, g->ldc);
#endif
}

// Piece i of n of g: a band of rows (or of columns) of C.
void cpu_piece_range(int64_t total, int i, int n, int64_t *lo, int64_t *hi) {
    int64_t step = (total + n - 1) / n;
    if (step > 16) step = (step + 15) / 16 * 16;   // whole vectors and kernel blocks
    *lo = step * i;
    *hi = *lo + step < total ? *lo + step : total;
    if (*lo > total) *lo = total;
}

bool cpu_gemm_split_by_rows(int64_t M, int64_t N, int n) { return M >= N || M >= 64 * n; }

int cpu_gemm_split_pieces(int64_t M, int64_t N, int64_t K) {
    int n = exec_cpu_threads();
    if (n < 2 || M * N * K < GEMM_SPLIT_MACS) return 1;
    // Pieces of at least 16 rows or columns, and of at least GEMM_SPLIT_MACS / 2 each.
    int64_t by_size = M * N * K / (GEMM_SPLIT_MACS / 2), by_shape = (M > N ? M : N) / 16;
    if (by_size < n) n = (int)by_size;
    if (by_shape < n) n = (int)by_shape;
    return n > 1 ? n : 1;
}

static gemm_args gemm_piece(const gemm_args *g, int i, int n) {
    gemm_args p = *g;
    size_t elem = g->t == DG_FLOAT32 ? sizeof(float) : sizeof(double);
    bool by_rows = cpu_gemm_split_by_rows(g->M, g->N, n);
    int64_t lo, hi;
    cpu_piece_range(by_rows ? g->M : g->N, i, n, &lo, &hi);
    if (by_rows) {
        p.M = hi - lo;
        p.A = (const char *)g->A + (size_t)(g->ta ? lo : lo * g->lda) * elem;
        p.C = (char *)g->C + (size_t)(lo * g->ldc) * elem;
    } else {
        p.N = hi - lo;
        p.B = (const char *)g->B + (size_t)(g->tb ? lo * g->ldb : lo) * elem;
        p.C = (char *)g->C + (size_t)lo * elem;
    }
    return p;
}

// The pool: threads that sleep until a job (a product, or any work in pieces) is split among
// them.
static struct {
    pthread_mutex_t busy;   // held by the thread whose job the pool runs
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int n_threads;          // started so far
    uint64_t generation;
    void (*fn)(void *ctx, int i, int n);   // the job: piece i of n; NULL between jobs
    void *ctx;
    int n_pieces, next_piece, finished;
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
          0, 0, NULL, NULL, 0, 0, 0};

static bool take_piece(int *i) {
    // under pool.mu
    if (!pool.fn || pool.next_piece >= pool.n_pieces) return false;
    *i = pool.next_piece++;
    return true;
}

// Runs pieces of the pool's job while any are left; called and returns with pool.mu held.
static void run_pieces_locked(void) {
    int i;
    while (take_piece(&i)) {
        void (*fn)(void *, int, int) = pool.fn;
        void *ctx = pool.ctx;
        int n = pool.n_pieces;
        pthread_mutex_unlock(&pool.mu);
        fn(ctx, i, n);
        pthread_mutex_lock(&pool.mu);
        if (++pool.finished == pool.n_pieces) pthread_cond_broadcast(&pool.done);
    }
}

// Piece i of n of the product ctx (a gemm_args).
static void gemm_piece_run(void *ctx, int i, int n) {
    gemm_args p = gemm_piece(ctx, i, n);
    if (p.M > 0 && p.N > 0) gemm_one(&p);
}

static void *pool_main(void *arg) {
    (void)arg;
    exec_fp_enter();   // this thread runs only kernels: flushed for its life
    pthread_mutex_lock(&pool.mu);
    uint64_t seen = pool.generation;
    for (;;) {
        while (pool.generation == seen) pthread_cond_wait(&pool.go, &pool.mu);
        seen = pool.generation;
        run_pieces_locked();
    }
    return NULL;
}

bool cpu_parallel_for(int n, void (*fn)(void *ctx, int i, int n), void *ctx) {
    if (n < 2 || pthread_mutex_trylock(&pool.busy) != 0) return false;
    pthread_mutex_lock(&pool.mu);
    while (pool.n_threads < n - 1) {
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        bool ok = pthread_create(&th, &at, pool_main, NULL) == 0;
        pthread_attr_destroy(&at);
        if (!ok) break;
        pool.n_threads++;
    }
    if (pool.n_threads == 0) {
        pthread_mutex_unlock(&pool.mu);
        pthread_mutex_unlock(&pool.busy);
        return false;
    }
    if (n > pool.n_threads + 1) n = pool.n_threads + 1;
    pool.fn = fn;
    pool.ctx = ctx;
    pool.n_pieces = n;
    pool.next_piece = 0;
    pool.finished = 0;
    pool.generation++;
    exec_threads_computing_add(n - 1);   // the helpers (the caller is counted as its kernel)
    pthread_cond_broadcast(&pool.go);
    run_pieces_locked();
    while (pool.finished < pool.n_pieces) pthread_cond_wait(&pool.done, &pool.mu);
    exec_threads_computing_add(-(n - 1));
    pool.fn = NULL;
    pool.ctx = NULL;
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.busy);
    return true;
}

static void gemm_run(gemm_args *g) {
    if (g->M == 0 || g->N == 0) return;
    cpu_gemm_get_info();   // oneDNN capped before its first product
    int n = cpu_gemm_split_pieces(g->M, g->N, g->K);
    if (n > 1 && cpu_parallel_for(n, gemm_piece_run, g)) return;
    gemm_one(g);
}

void cpu_gemm(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
              int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    gemm_args g = {t, ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, false};
    gemm_run(&g);
}

void cpu_gemm_dense(dg_dtype t, bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const void *A,
                    int64_t lda, const void *B, int64_t ldb, double beta, void *C, int64_t ldc) {
    gemm_args g = {t, ta, tb, M, N, K, alpha, beta, A, B, C, lda, ldb, ldc, true};
    gemm_run(&g);
}
