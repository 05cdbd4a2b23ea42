/* Tests for executor/cuda/: discovery, the GPU device table, the fill kernel, cuBLAS sgemm,
 * NCCL, and GPU memory (cuda_alloc.h: the caching allocator, poisoning, pinned host buffers,
 * staged copies). Without a GPU only the no-device behaviour is checked (zero GPUs, statuses
 * instead of aborts), then the test exits 77 so that CTest reports it skipped. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DG_WITH_CUDA
#include <limits.h>
#include <math.h>

#include "cuda_alloc.h"
#include "cuda_device.h"
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif

// ---- without a GPU (also run with one, where they apply) ----

static void test_table(void **state) {
    (void)state;
    const exec_device_ops *ops = exec_cuda_device_ops();
    assert_non_null(ops);
    assert_int_equal(ops->version, EXEC_DEVICE_OPS_VERSION);
    assert_string_equal(ops->type, "GPU");
    assert_non_null(ops->alloc);
    assert_non_null(ops->free);
    assert_non_null(ops->copy_to_device);
    assert_non_null(ops->copy_to_host);
    assert_non_null(ops->synchronize);
    // Events are optional, but the GPU table has them (all or none).
    assert_true((ops->event_record && ops->event_wait && ops->event_free) ||
                (!ops->event_record && !ops->event_wait && !ops->event_free));
}

// cuBLAS is opened at run time (cuda_blas.c): the name and path the build recorded must load,
// with every entry point, on the machine that built it (no GPU needed). Not under valgrind,
// where mapping cuBLAS alone takes half a minute.
static void test_blas_loads(void **state) {
    (void)state;
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
    if (RUNNING_ON_VALGRIND) {
        printf("(under valgrind: cuBLAS not loaded)\n");
        return;
    }
#endif
#endif
    dg_status *st = dg_status_new();
    assert_true(exec_cuda_blas_load(st));
    assert_ok(st);
    assert_true(exec_cuda_blas_load(st));   // once per process; the second call is free
    // By its versioned SONAME (what the runtime package ships), not the development link
    // "libcublas.so", which may be absent or another major version.
    const char *lib = exec_cuda_blas_library(), *so = strstr(lib, "libcublas.so.");
    printf("cuBLAS opened as %s\n", lib);
    assert_non_null(so);
    assert_true(so[strlen("libcublas.so.")] >= '0' && so[strlen("libcublas.so.")] <= '9');
    dg_status_free(&st);
}

static void test_free_null(void **state) {
    (void)state;
    exec_cuda_device *dev = NULL;
    exec_cuda_device_free(NULL);
    exec_cuda_device_free(&dev);
    assert_null(dev);
}

static void test_nccl_version(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    int version = -1;
    if (exec_cuda_nccl_version(&version, st)) {
        assert_ok(st);
        assert_true(version >= 20000);   // NCCL 2.x encodes as MAJOR*10000 + MINOR*100 + PATCH
    } else {
        assert_status(st, DG_UNIMPLEMENTED, "without NCCL");
    }
    dg_status_free(&st);
}

static void test_no_device(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    assert_int_equal(exec_cuda_device_count(), 0);
    assert_int_equal(exec_cuda_device_count(), 0);   // cached, still 0
    assert_true(strlen(exec_cuda_unavailable_reason()) > 0);

    char name[64] = "untouched";
    int64_t mem = -7;
    assert_false(exec_cuda_device_info(0, name, sizeof name, &mem, st));
    assert_status(st, DG_UNAVAILABLE, "GPU:0: no CUDA device: ");
    assert_string_equal(name, "untouched");
    assert_int_equal(mem, -7);

    dg_status_reset(st);
    assert_null(exec_cuda_device_new(0, st));
    assert_status(st, DG_UNAVAILABLE, "no CUDA device");
    dg_status_reset(st);
    assert_null(exec_cuda_device_new(-1, st));
    assert_status(st, DG_UNAVAILABLE, "GPU:-1");
    dg_status_free(&st);
}


// Pinned host memory without a GPU: a status, no crash; the lookups answer false.
static void test_no_device_memory(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    assert_null(exec_cuda_host_alloc(0, st));
    assert_ok(st);
    assert_null(exec_cuda_host_alloc(100, st));
    assert_false(dg_status_ok(st));
    if (!strstr(dg_status_message(st), "pinned host memory: allocating 100 bytes: CUDA: ") ||
        !strstr(dg_status_message(st), "[cudaHostAlloc at cuda_alloc.c:"))
        fail_msg("message: %s", dg_status_message(st));
    char local[8];
    assert_false(exec_cuda_host_is_pinned(local));
    assert_false(exec_cuda_host_is_pinned(NULL));
    exec_cuda_host_free(NULL);
    exec_cuda_host_free(local);   // not ours: ignored
    exec_cuda_mem_free(NULL, local);
    dg_status_free(&st);
}

// ---- with a GPU: device 0 ----

static int open_gpu(void **state) {
    dg_status *st = dg_status_new();
    *state = exec_cuda_device_new(0, st);
    if (!*state) fprintf(stderr, "opening GPU:0: %s\n", dg_status_message(st));
    dg_status_free(&st);
    return *state ? 0 : -1;
}

static int close_gpu(void **state) {
    exec_cuda_device *dev = *state;
    exec_cuda_device_free(&dev);
    return 0;
}

static void fill_random(float *p, int64_t n, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) p[i] = (float)dg_test_uniform(&seed, -1.0, 1.0);
}

static void test_info(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char name[128] = "";
    int64_t mem = 0;
    assert_true(exec_cuda_device_info(0, name, sizeof name, &mem, st));
    assert_ok(st);
    assert_true(strlen(name) > 0);
    assert_true(mem > 0);
    print_message("GPU:0: %s, %lld MiB, %d GPU(s)\n", name, (long long)(mem >> 20),
                  exec_cuda_device_count());
    assert_string_equal(exec_cuda_unavailable_reason(), "");

    char small[4];
    assert_true(exec_cuda_device_info(0, small, sizeof small, NULL, st));
    assert_int_equal(strlen(small), 3);

    int n = exec_cuda_device_count();
    assert_false(exec_cuda_device_info(n, name, sizeof name, &mem, st));
    assert_status(st, DG_INVALID_ARGUMENT, "does not exist");
    dg_status_reset(st);
    assert_null(exec_cuda_device_new(-1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "GPU:-1 does not exist");
    dg_status_free(&st);
}

static void test_round_trip(void **state) {
    exec_cuda_device *dev = *state;
    const exec_device_ops *ops = exec_cuda_device_ops();
    dg_status *st = dg_status_new();
    const int64_t n = (1 << 20) + 3;
    const size_t n_bytes = (size_t)n * sizeof(float);
    float *host = malloc(n_bytes), *back = malloc(n_bytes);
    assert_non_null(host);
    assert_non_null(back);
    fill_random(host, n, 42);
    memset(back, 0, n_bytes);

    float *d = ops->alloc(dev, n_bytes, st);
    assert_ok(st);
    assert_non_null(d);
    assert_true(ops->copy_to_device(dev, d, host, n_bytes, st));
    assert_true(ops->copy_to_host(dev, back, d, n_bytes, st));
    assert_true(ops->synchronize(dev, st));
    assert_ok(st);
    assert_memory_equal(host, back, n_bytes);

    // Zero bytes: no allocation, no error; zero-byte copies are no-ops.
    assert_null(ops->alloc(dev, 0, st));
    assert_ok(st);
    assert_true(ops->copy_to_device(dev, d, NULL, 0, st));
    // A NULL buffer with bytes to copy is INVALID_ARGUMENT, not a crash.
    assert_false(ops->copy_to_host(dev, NULL, d, 16, st));
    assert_status(st, DG_INVALID_ARGUMENT, "GPU:0: copying 16 bytes device to host");
    dg_status_reset(st);

    // Events order the stream; waiting on our own event is allowed.
    void *ev = ops->event_record(dev, st);
    assert_ok(st);
    assert_non_null(ev);
    assert_true(ops->event_wait(dev, ev, st));
    ops->event_free(dev, ev);
    assert_true(ops->synchronize(dev, st));

    ops->free(dev, d);
    ops->free(dev, NULL);
    free(back);
    free(host);
    dg_status_free(&st);
}

static void test_out_of_memory(void **state) {
    exec_cuda_device *dev = *state;
    const exec_device_ops *ops = exec_cuda_device_ops();
    dg_status *st = dg_status_new();
    const size_t huge = (size_t)1 << 50;   // 1 PiB
    assert_null(ops->alloc(dev, huge, st));
    assert_status(st, DG_RESOURCE_EXHAUSTED, "GPU:0: allocating 1125899906842624 bytes: ");
    assert_status(st, DG_RESOURCE_EXHAUSTED, "cudaMalloc(&p, n_bytes) at cuda_device.c:");
    assert_status(st, DG_RESOURCE_EXHAUSTED, "cudaErrorMemoryAllocation");
    // The error does not stick: the device still works.
    dg_status_reset(st);
    void *p = ops->alloc(dev, 1024, st);
    assert_ok(st);
    assert_non_null(p);
    assert_true(ops->synchronize(dev, st));
    ops->free(dev, p);
    dg_status_free(&st);
}

static void test_fill(void **state) {
    exec_cuda_device *dev = *state;
    const exec_device_ops *ops = exec_cuda_device_ops();
    dg_status *st = dg_status_new();
    // More than one grid's worth (65535 blocks x 256 threads) to cover the grid-stride loop.
    const int64_t n = 65535LL * 256 * 2 + 17;
    const size_t n_bytes = (size_t)n * sizeof(float);
    float *back = malloc(n_bytes);
    assert_non_null(back);
    float *d = ops->alloc(dev, n_bytes, st);
    assert_ok(st);
    assert_true(exec_cuda_fill_f32(dev, d, n, 3.5f, st));
    assert_true(exec_cuda_fill_f32(dev, d + 10, 5, -2.0f, st));   // a sub-range
    assert_true(exec_cuda_fill_f32(dev, d, 0, 9.0f, st));         // nothing
    assert_true(ops->copy_to_host(dev, back, d, n_bytes, st));
    assert_true(ops->synchronize(dev, st));
    assert_ok(st);
    for (int64_t i = 0; i < n; i++) {
        float want = (i >= 10 && i < 15) ? -2.0f : 3.5f;
        if (back[i] != want) fail_msg("element %lld: %g, want %g", (long long)i, back[i], want);
    }
    assert_false(exec_cuda_fill_f32(dev, d, -1, 0.0f, st));
    assert_status(st, DG_INVALID_ARGUMENT, "fill of -1 floats");
    ops->free(dev, d);
    free(back);
    dg_status_free(&st);
}

// Row-major reference: C = alpha op(A) op(B) + beta C.
static void sgemm_ref(bool ta, bool tb, int m, int n, int k, float alpha, const float *a,
                      int lda, const float *b, int ldb, float beta, float *c, int ldc) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = 0;
            for (int p = 0; p < k; p++) {
                double av = ta ? a[p * lda + i] : a[i * lda + p];
                double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
                acc += av * bv;
            }
            c[i * ldc + j] = (float)(alpha * acc + beta * c[i * ldc + j]);
        }
}

static void test_sgemm(void **state) {
    exec_cuda_device *dev = *state;
    const exec_device_ops *ops = exec_cuda_device_ops();
    dg_status *st = dg_status_new();
    const int m = 37, n = 29, k = 53;
    const float alpha = 1.5f, beta = 0.5f;
    // Buffers large enough for either layout of each operand.
    float a[53 * 37], b[53 * 29], c[37 * 29], want[37 * 29], got[37 * 29];
    fill_random(a, m * k, 1);
    fill_random(b, k * n, 2);
    fill_random(c, m * n, 3);
    float *da = ops->alloc(dev, sizeof a, st);
    float *db = ops->alloc(dev, sizeof b, st);
    float *dc = ops->alloc(dev, sizeof c, st);
    assert_ok(st);
    assert_true(ops->copy_to_device(dev, da, a, sizeof a, st));
    assert_true(ops->copy_to_device(dev, db, b, sizeof b, st));
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        int lda = ta ? m : k, ldb = tb ? k : n, ldc = n;
        memcpy(want, c, sizeof c);
        sgemm_ref(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc);
        assert_true(ops->copy_to_device(dev, dc, c, sizeof c, st));
        assert_true(exec_cuda_sgemm(dev, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc,
                                    ldc, st));
        assert_ok(st);
        assert_true(ops->copy_to_host(dev, got, dc, sizeof got, st));
        assert_true(ops->synchronize(dev, st));
        for (int i = 0; i < m * n; i++)
            if (!dg_test_is_close(got[i], want[i], 1e-4, 1e-4))
                fail_msg("trans_a=%d trans_b=%d: C[%d] = %.7g, want %.7g", ta, tb, i, got[i],
                         want[i]);
    }
    // Dimensions beyond cuBLAS's int are refused before any call.
    assert_false(exec_cuda_sgemm(dev, false, false, (int64_t)INT_MAX + 1, 1, 1, 1.0f, da, 1,
                                 db, 1, 0.0f, dc, 1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "m=2147483648");
    // A bad leading dimension comes back from cuBLAS as a status naming the call.
    dg_status_reset(st);
    assert_false(exec_cuda_sgemm(dev, false, false, m, n, k, alpha, da, 1, db, n, beta, dc, n,
                                 st));
    assert_status(st, DG_INVALID_ARGUMENT, "cublas.sgemm(");
    assert_status(st, DG_INVALID_ARGUMENT, "CUBLAS_STATUS_INVALID_VALUE");
    ops->free(dev, dc);
    ops->free(dev, db);
    ops->free(dev, da);
    dg_status_free(&st);
}

static void test_all_reduce(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    int version = 0;
    if (!exec_cuda_nccl_version(&version, st)) {
        print_message("SKIP: all-reduce: no NCCL: %s\n", dg_status_message(st));
        dg_status_free(&st);
        skip();
    }
    const exec_device_ops *ops = exec_cuda_device_ops();
    int n_devs = exec_cuda_device_count() < 2 ? exec_cuda_device_count() : 2;
    exec_cuda_device *devs[2] = {NULL, NULL};
    float *bufs[2] = {NULL, NULL};
    const int64_t n = 1000;
    float host[1000];
    for (int i = 0; i < n_devs; i++) {
        devs[i] = exec_cuda_device_new(i, st);
        assert_ok(st);
        bufs[i] = ops->alloc(devs[i], sizeof host, st);
        assert_ok(st);
        assert_true(exec_cuda_fill_f32(devs[i], bufs[i], n, (float)(i + 1), st));
        assert_true(ops->synchronize(devs[i], st));
    }
    assert_true(exec_cuda_all_reduce_sum_f32(devs, bufs, n_devs, n, st));
    assert_ok(st);
    float want = n_devs == 1 ? 1.0f : 3.0f;
    for (int i = 0; i < n_devs; i++) {
        assert_true(ops->copy_to_host(devs[i], host, bufs[i], sizeof host, st));
        assert_true(ops->synchronize(devs[i], st));
        for (int j = 0; j < n; j++)
            if (host[j] != want) fail_msg("GPU:%d [%d] = %g, want %g", i, j, host[j], want);
        ops->free(devs[i], bufs[i]);
        exec_cuda_device_free(&devs[i]);
    }
    assert_false(exec_cuda_all_reduce_sum_f32(devs, bufs, 0, n, st));
    assert_status(st, DG_INVALID_ARGUMENT, "over 0 devices");
    dg_status_free(&st);
    // With one GPU the reduction is the identity: nothing crossed devices, so the case is
    // reported skipped, not passed.
    if (n_devs < 2) {
        print_message("SKIP: all-reduce across GPUs needs two, this machine has %d\n", n_devs);
        skip();
    }
}


// ---- GPU memory (cuda_alloc.h); main sets DG_GPU_POISON=1 before the first allocation ----

#define MiB ((size_t)1 << 20)

static void test_mem_steady_state(void **state) {
    exec_cuda_device *dev = *state;
    dg_status *st = dg_status_new();
    const size_t sizes[] = {4, 1000, 4096, 100000, MiB, 3 * MiB + 1, 10 * MiB, 10 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *ptrs[N];
    exec_cuda_mem_stats before, first, s;
    exec_cuda_mem_stats_get(dev, &before);
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < N; i++) {
            ptrs[i] = exec_cuda_mem_alloc(dev, sizes[i], st);
            assert_ok(st);
            assert_non_null(ptrs[i]);
            assert_int_equal((uintptr_t)ptrs[i] % 256, 0);
        }
        exec_cuda_mem_stats_get(dev, &s);
        assert_true(s.bytes_in_use >= before.bytes_in_use + 24 * (int64_t)MiB);
        for (int i = 0; i < N; i++) exec_cuda_mem_free(dev, ptrs[(i * 3) % N]);
        if (round == 0) exec_cuda_mem_stats_get(dev, &first);
    }
    exec_cuda_mem_stats_get(dev, &s);
    assert_int_equal(s.device_mallocs, first.device_mallocs);   // no cudaMalloc after round 0
    assert_int_equal(s.allocs, before.allocs + 10 * N);
    assert_int_equal(s.bytes_in_use, before.bytes_in_use);
    assert_true(s.bytes_cached >= 24 * (int64_t)MiB);
    print_message("GPU:0 cache: %lld cudaMalloc calls for %lld allocs, %lld bytes cached\n",
                  (long long)s.device_mallocs, (long long)s.allocs, (long long)s.bytes_cached);

    assert_null(exec_cuda_mem_alloc(dev, 0, st));   // zero bytes: NULL and OK
    assert_ok(st);
    exec_cuda_mem_free(dev, NULL);
    int foreign;
    exec_cuda_mem_free(dev, &foreign);   // not from the cache: ignored
    exec_cuda_mem_trim(dev);
    exec_cuda_mem_stats_get(dev, &s);
    assert_int_equal(s.bytes_cached, 0);
    assert_true(exec_cuda_device_ops()->synchronize(dev, st));
    dg_status_free(&st);
}

static void test_mem_out_of_memory(void **state) {
    exec_cuda_device *dev = *state;
    dg_status *st = dg_status_new();
    void *cached = exec_cuda_mem_alloc(dev, 8 * MiB, st);
    assert_ok(st);
    exec_cuda_mem_free(dev, cached);
    assert_null(exec_cuda_mem_alloc(dev, (size_t)1 << 50, st));   // 1 PiB
    assert_status(st, DG_RESOURCE_EXHAUSTED, "GPU:0: allocating 1125899906842624 bytes: ");
    assert_status(st, DG_RESOURCE_EXHAUSTED, "cudaMalloc at cuda_alloc.c:");
    assert_status(st, DG_RESOURCE_EXHAUSTED, "cudaErrorMemoryAllocation");
    exec_cuda_mem_stats s;
    exec_cuda_mem_stats_get(dev, &s);
    assert_int_equal(s.bytes_cached, 0);   // the failure gave the cache back before retrying
    dg_status_reset(st);
    void *p = exec_cuda_mem_alloc(dev, 1024, st);   // the error does not stick
    assert_ok(st);
    assert_non_null(p);
    assert_true(exec_cuda_device_ops()->synchronize(dev, st));
    exec_cuda_mem_free(dev, p);
    dg_status_free(&st);
}

static void test_mem_poison(void **state) {
    exec_cuda_device *dev = *state;
    dg_status *st = dg_status_new();
    const int64_t n = 300000;
    const size_t n_bytes = (size_t)n * sizeof(float);
    unsigned char *back = malloc(n_bytes);
    assert_non_null(back);
    for (int round = 0; round < 2; round++) {
        // Round 1 gets round 0's block back from the cache, after it was filled with 1.0.
        float *d = exec_cuda_mem_alloc(dev, n_bytes, st);
        assert_ok(st);
        memset(back, 0, n_bytes);
        assert_true(exec_cuda_memcpy_to_host(dev, back, d, n_bytes, st));
        assert_ok(st);
        for (size_t i = 0; i < n_bytes; i++)
            if (back[i] != 0xff) fail_msg("round %d: byte %zu is 0x%02x, want 0xff", round, i, back[i]);
        assert_true(exec_cuda_fill_f32(dev, d, n, 1.0f, st));
        exec_cuda_mem_free(dev, d);
    }
    free(back);
    dg_status_free(&st);
}

static void test_pinned(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    char *p = exec_cuda_host_alloc(1000, st);
    assert_ok(st);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    memset(p, 7, 1000);
    assert_true(exec_cuda_host_is_pinned(p));
    assert_true(exec_cuda_host_is_pinned(p + 999));
    char *q = malloc(1000);
    assert_non_null(q);
    assert_false(exec_cuda_host_is_pinned(q));
    exec_cuda_host_free(q);   // not pinned: ignored
    exec_cuda_host_free(p);
    assert_false(exec_cuda_host_is_pinned(p));   // back in the cache: no longer the caller's
    char *again = exec_cuda_host_alloc(600, st);   // the same size class: the same buffer
    assert_ptr_equal(again, p);
    exec_cuda_host_free(again);
    exec_cuda_host_free(NULL);
    free(q);
    dg_status_free(&st);
}

static void fill_bytes(unsigned char *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        p[i] = (unsigned char)(seed >> 24);
    }
}

// host -> device -> (device -> device) -> host for one size and one kind of host buffers.
static void round_trip(exec_cuda_device *dev, size_t n, bool is_src_pinned, bool is_dst_pinned,
                       size_t dst_offset) {
    dg_status *st = dg_status_new();
    size_t cap = n + dst_offset + 1;
    unsigned char *want = malloc(cap);
    unsigned char *src = is_src_pinned ? exec_cuda_host_alloc(cap, st) : malloc(cap);
    unsigned char *dst0 = is_dst_pinned ? exec_cuda_host_alloc(cap, st) : malloc(cap);
    assert_ok(st);
    assert_true(want && src && dst0);
    unsigned char *dst = dst0 + dst_offset;
    fill_bytes(want, cap, 0x1234567 + n);
    memcpy(src, want, cap);
    memset(dst0, 0, cap);

    void *d = exec_cuda_mem_alloc(dev, n, st);
    void *d2 = exec_cuda_mem_alloc(dev, n, st);
    assert_ok(st);
    assert_true(exec_cuda_memcpy_to_device(dev, d, src, n, st));
    assert_ok(st);
    memset(src, 0xab, cap);   // the source may be reused as soon as the copy call returns
    assert_true(exec_cuda_memcpy_device(dev, d2, d, n, st));
    assert_true(exec_cuda_memcpy_to_host(dev, dst, d2, n, st));
    assert_ok(st);
    if (n > 0 && memcmp(dst, want, n) != 0) {
        size_t i = 0;
        while (dst[i] == want[i]) i++;
        fail_msg("%zu bytes, source %s, destination %s+%zu: byte %zu is 0x%02x, want 0x%02x", n,
                 is_src_pinned ? "pinned" : "pageable", is_dst_pinned ? "pinned" : "pageable",
                 dst_offset, i, dst[i], want[i]);
    }
    // Nothing written past the end.
    assert_int_equal(dst[n], 0);
    exec_cuda_mem_free(dev, d2);
    exec_cuda_mem_free(dev, d);
    if (is_dst_pinned) exec_cuda_host_free(dst0);
    else free(dst0);
    if (is_src_pinned) exec_cuda_host_free(src);
    else free(src);
    free(want);
    dg_status_free(&st);
}

static void test_mem_round_trips(void **state) {
    exec_cuda_device *dev = *state;
    // Around the small-copy limit (64 KiB) and the staging chunk (4 MiB); 22 MiB + 5 uses
    // more chunks than a copy to the device has staging slots.
    const size_t sizes[] = {0, 1, 1000, 65535, 65536, 4 * MiB, 4 * MiB + 1, 10 * MiB + 3,
                            22 * MiB + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int kind = 0; kind < 4; kind++) {
            round_trip(dev, sizes[i], kind & 1, kind & 2, 0);
            if (kind & 2) round_trip(dev, sizes[i], kind & 1, true, 3);   // inside a pinned block
        }
    // Many copies to the device in a row without waiting: staging buffers come back to the
    // cache from the stream, and the results are still right.
    dg_status *st = dg_status_new();
    const size_t n = 5 * MiB + 11;
    unsigned char *src = malloc(n), *back = malloc(n), *want = malloc(n);
    void *d = exec_cuda_mem_alloc(dev, 8 * n, st);
    assert_ok(st);
    assert_true(src && back && want);
    for (int k = 0; k < 8; k++) {
        fill_bytes(src, n, (uint64_t)k + 99);
        assert_true(exec_cuda_memcpy_to_device(dev, (char *)d + (size_t)k * n, src, n, st));
    }
    for (int k = 0; k < 8; k++) {
        fill_bytes(want, n, (uint64_t)k + 99);
        assert_true(exec_cuda_memcpy_to_host(dev, back, (char *)d + (size_t)k * n, n, st));
        assert_memory_equal(back, want, n);
    }
    // NULL buffers with bytes to copy are INVALID_ARGUMENT; zero bytes are no-ops.
    assert_false(exec_cuda_memcpy_to_host(dev, NULL, d, 16, st));
    assert_status(st, DG_INVALID_ARGUMENT, "GPU:0: copying 16 bytes device to host: NULL");
    dg_status_reset(st);
    assert_false(exec_cuda_memcpy_to_device(dev, d, NULL, 16, st));
    assert_status(st, DG_INVALID_ARGUMENT, "GPU:0: copying 16 bytes host to device: NULL source");
    dg_status_reset(st);
    assert_false(exec_cuda_memcpy_device(dev, NULL, d, 16, st));
    assert_status(st, DG_INVALID_ARGUMENT, "device to device: NULL destination");
    dg_status_reset(st);
    assert_true(exec_cuda_memcpy_to_device(dev, d, NULL, 0, st));
    assert_true(exec_cuda_memcpy_to_host(dev, NULL, d, 0, st));
    assert_true(exec_cuda_memcpy_device(dev, NULL, NULL, 0, st));
    assert_ok(st);
    exec_cuda_mem_free(dev, d);
    free(want);
    free(back);
    free(src);
    dg_status_free(&st);
}

int main(void) {
    // Some cases look for the failing CUDA call and its place in the message, which the
    // library adds only for developers.
    setenv("DG_DEBUG_ERRORS", "1", 1);
    const struct CMUnitTest common[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_blas_loads),
        cmocka_unit_test(test_free_null),
        cmocka_unit_test(test_nccl_version),
    };
    if (exec_cuda_device_count() == 0) {
        const struct CMUnitTest no_device[] = {
            cmocka_unit_test(test_no_device),
            cmocka_unit_test(test_no_device_memory),
        };
        int failed = cmocka_run_group_tests_name("common", common, NULL, NULL);
        failed += cmocka_run_group_tests_name("no_device", no_device, NULL, NULL);
        if (failed) return 1;
        printf("no CUDA device: %s\n", exec_cuda_unavailable_reason());
        return 77;
    }
    const struct CMUnitTest gpu[] = {
        cmocka_unit_test(test_info),
        cmocka_unit_test_setup_teardown(test_round_trip, open_gpu, close_gpu),
        cmocka_unit_test_setup_teardown(test_out_of_memory, open_gpu, close_gpu),
        cmocka_unit_test_setup_teardown(test_fill, open_gpu, close_gpu),
        cmocka_unit_test_setup_teardown(test_sgemm, open_gpu, close_gpu),
        cmocka_unit_test(test_all_reduce),
        cmocka_unit_test_setup_teardown(test_mem_steady_state, open_gpu, close_gpu),
        cmocka_unit_test_setup_teardown(test_mem_out_of_memory, open_gpu, close_gpu),
        cmocka_unit_test_setup_teardown(test_mem_poison, open_gpu, close_gpu),
        cmocka_unit_test(test_pinned),
        cmocka_unit_test_setup_teardown(test_mem_round_trips, open_gpu, close_gpu),
    };
    // Poisoned fresh blocks (read once, at the first allocation); the other tests overwrite
    // every byte they read.
    setenv("DG_GPU_POISON", "1", 1);
    int failed = cmocka_run_group_tests_name("common", common, NULL, NULL);
    failed += cmocka_run_group_tests_name("gpu", gpu, NULL, NULL);
    int64_t left = exec_cuda_release_all();
    if (left != 0) {
        printf("GPU memory: %lld bytes still handed out after every test freed its blocks\n",
               (long long)left);
        failed++;
    }
    return failed ? 1 : 0;
}

#else

int main(void) {
    printf("no CUDA device: built without CUDA (DG_WITH_CUDA is off or no toolkit was found)\n");
    return 77;
}

#endif
