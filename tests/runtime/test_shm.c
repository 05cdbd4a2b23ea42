/* runtime/shm.c: slots in a shared-memory region, read by another process (fork), descriptors
 * checked before anything is followed, slots freed by the reader and reused. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm_impl.h"

static void fill(unsigned char *p, size_t n, unsigned seed) {
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (unsigned char)(x >> 16);
    }
}

// Another process maps the region, finds the bytes, and frees the slot.
static void test_other_process_reads(void **state) {
    dg_status *st = dg_status_new();
    rt_shm_pool *p = rt_shm_pool_new(st);
    assert_ok(st);
    size_t n = 200000;
    unsigned char *src = malloc(n);
    fill(src, n, 1);
    unsigned char desc[RT_SHM_DESC_BYTES];
    assert_true(rt_shm_put(p, src, n, desc));
    assert_int_equal(rt_shm_pool_in_use(p), 1);
    assert_true(rt_shm_is_desc(desc, sizeof desc, n));
    assert_false(rt_shm_is_desc(desc, sizeof desc, 1000));   // too small to be a descriptor's
    pid_t child = fork();
    if (child == 0) {
        dg_status *cst = dg_status_new();
        dg_tensor *t = rt_shm_tensor(desc, DG_UINT8, dg_shape1((int64_t)n), n, cst);
        int rc = !t ? 2 : memcmp(dg_tensor_data(t), src, n) != 0 ? 3 : 0;
        dg_tensor_unref(t);   // frees the slot
        // What the child inherited, released so that leak checkers stay quiet in it too (the
        // pool's name is removed early; the parent's mapping stays).
        dg_status_free(&cst);
        dg_status_free(&st);
        free(src);
        rt_shm_pool_free(&p);
        _exit(rc);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_int_equal(rt_shm_pool_in_use(p), 0);
    free(src);
    rt_shm_pool_free(&p);
    dg_status_free(&st);
}

// Sizes outside the slot range are refused; all slots held: refused until one is freed.
static void test_limits_and_reuse(void **state) {
    dg_status *st = dg_status_new();
    rt_shm_pool *p = rt_shm_pool_new(st);
    assert_ok(st);
    unsigned char *buf = calloc(1, RT_SHM_SLOT_BYTES + 8);
    unsigned char desc[RT_SHM_SLOTS][RT_SHM_DESC_BYTES];
    assert_false(rt_shm_put(p, buf, RT_SHM_MIN_BYTES - 1, desc[0]));
    assert_false(rt_shm_put(p, buf, RT_SHM_SLOT_BYTES + 1, desc[0]));
    for (int i = 0; i < RT_SHM_SLOTS; i++) assert_true(rt_shm_put(p, buf, RT_SHM_SLOT_BYTES, desc[i]));
    unsigned char extra[RT_SHM_DESC_BYTES];
    assert_false(rt_shm_put(p, buf, RT_SHM_MIN_BYTES, extra));
    void *data, *slot;
    assert_true(rt_shm_get(desc[5], RT_SHM_SLOT_BYTES, &data, &slot, st));
    assert_ok(st);
    rt_shm_release(slot);
    assert_int_equal(rt_shm_pool_in_use(p), RT_SHM_SLOTS - 1);
    assert_true(rt_shm_put(p, buf, RT_SHM_MIN_BYTES, extra));
    // A freed slot is not held: its old descriptor no longer resolves.
    assert_true(rt_shm_get(desc[6], RT_SHM_SLOT_BYTES, &data, &slot, st));
    rt_shm_release(slot);
    assert_false(rt_shm_get(desc[6], RT_SHM_SLOT_BYTES, &data, &slot, st));
    assert_status(st, DG_INVALID_ARGUMENT, "is not held");
    dg_status_reset(st);
    // A descriptor sent twice is read once: the second reader must not see a slot the first
    // reader's release may hand back to the sender.
    assert_true(rt_shm_get(desc[7], RT_SHM_SLOT_BYTES, &data, &slot, st));
    void *data2, *slot2;
    assert_false(rt_shm_get(desc[7], RT_SHM_SLOT_BYTES, &data2, &slot2, st));
    assert_status(st, DG_INVALID_ARGUMENT, "was read already");
    rt_shm_release(slot);
    free(buf);
    rt_shm_pool_free(&p);
    dg_status_free(&st);
}

// Descriptors that disagree with the tensor, name no region or point outside it.
static void test_bad_descriptors(void **state) {
    dg_status *st = dg_status_new();
    rt_shm_pool *p = rt_shm_pool_new(st);
    unsigned char *buf = calloc(1, 1 << 17);
    unsigned char d[RT_SHM_DESC_BYTES], bad[RT_SHM_DESC_BYTES];
    assert_true(rt_shm_put(p, buf, 1 << 17, d));
    void *data, *slot;
    assert_false(rt_shm_get(d, (1 << 17) + 8, &data, &slot, st));   // another length
    assert_status(st, DG_INVALID_ARGUMENT, "for a tensor of");
    dg_status_reset(st);
    memcpy(bad, d, sizeof bad);
    bad[0] = 'X';
    assert_false(rt_shm_get(bad, 1 << 17, &data, &slot, st));
    assert_status(st, DG_INVALID_ARGUMENT, "bad magic");
    dg_status_reset(st);
    memcpy(bad, d, sizeof bad);
    uint32_t slot_no = RT_SHM_SLOTS;
    memcpy(bad + 32, &slot_no, 4);
    assert_false(rt_shm_get(bad, 1 << 17, &data, &slot, st));
    assert_status(st, DG_INVALID_ARGUMENT, "slot 64");
    dg_status_reset(st);
    memcpy(bad, d, sizeof bad);
    uint64_t off = 12345;
    memcpy(bad + 16, &off, 8);
    assert_false(rt_shm_get(bad, 1 << 17, &data, &slot, st));
    assert_status(st, DG_INVALID_ARGUMENT, "offset 12345");
    dg_status_reset(st);
    memcpy(bad, d, sizeof bad);
    bad[36] ^= 1;   // the nonce of another region of this name
    assert_false(rt_shm_get(bad, 1 << 17, &data, &slot, st));
    assert_status(st, DG_INVALID_ARGUMENT, "not the region the descriptor names");
    dg_status_reset(st);
    memcpy(bad, d, sizeof bad);
    uint32_t region = 999999;
    memcpy(bad + 12, &region, 4);
    assert_false(rt_shm_get(bad, 1 << 17, &data, &slot, st));
    assert_status(st, DG_INVALID_ARGUMENT, "shared memory /dg-shm-");
    free(buf);
    rt_shm_pool_free(&p);
    dg_status_free(&st);
}

// A region of a child that exits: read while the child lives, released by its reader, then
// unmapped by the sweep once the child is gone (a restarted peer's old region does not stay).
// The bytes are mapped read-only: a write into them faults.
static void test_dead_sender_unmapped(void **state) {
    (void)state;
    int fds[2], done[2];
    assert_int_equal(pipe(fds), 0);
    assert_int_equal(pipe(done), 0);
    size_t n = 100000;
    pid_t child = fork();
    if (child == 0) {
        dg_status *st = dg_status_new();
        rt_shm_pool *p = rt_shm_pool_new(st);
        unsigned char *src = malloc(n);
        fill(src, n, 5);
        unsigned char desc[RT_SHM_DESC_BYTES];
        if (!p || !rt_shm_put(p, src, n, desc) || write(fds[1], desc, sizeof desc) != (ssize_t)sizeof desc) _exit(1);
        char c;
        if (read(done[0], &c, 1) != 1) _exit(2);   // the parent has read the bytes
        raise(SIGKILL);   // a crash: the region stays behind (and no leak check under valgrind)
        _exit(3);
    }
    unsigned char desc[RT_SHM_DESC_BYTES];
    assert_int_equal(read(fds[0], desc, sizeof desc), (ssize_t)sizeof desc);
    int before = rt_shm_num_mappings();
    dg_status *st = dg_status_new();
    dg_tensor *t = rt_shm_tensor(desc, DG_UINT8, dg_shape1((int64_t)n), n, st);
    assert_ok(st);
    assert_non_null(t);
    unsigned char *want = malloc(n);
    fill(want, n, 5);
    assert_memory_equal(dg_tensor_data(t), want, n);
    assert_int_equal(rt_shm_num_mappings(), before + 1);
    pid_t writer = fork();   // writing into the sender's bytes must fault
    if (writer == 0) {
        signal(SIGSEGV, SIG_DFL);   // cmocka catches it in the test process
        ((volatile unsigned char *)dg_tensor_data(t))[0] = 1;
        _exit(0);
    }
    int ws;
    assert_int_equal(waitpid(writer, &ws, 0), writer);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGSEGV);
    assert_int_equal(write(done[1], "x", 1), 1);
    assert_int_equal(waitpid(child, &ws, 0), child);
    assert_true(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGKILL);
    assert_int_equal(rt_shm_sweep(), 0);   // still held by the tensor
    assert_int_equal(rt_shm_num_mappings(), before + 1);
    dg_tensor_unref(t);
    assert_int_equal(rt_shm_sweep(), 1);
    assert_int_equal(rt_shm_num_mappings(), before);
    free(want);
    dg_status_free(&st);
    close(fds[0]);
    close(fds[1]);
    close(done[0]);
    close(done[1]);
}

// A region file others may write (mode 0644 here) is refused, whatever it holds.
static void test_region_permissions(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    rt_shm_pool *p = rt_shm_pool_new(st);
    assert_ok(st);
    size_t n = 100000;
    unsigned char *src = calloc(1, n);
    unsigned char desc[RT_SHM_DESC_BYTES];
    assert_true(rt_shm_put(p, src, n, desc));
    uint32_t pid, region;
    memcpy(&pid, desc + 8, 4);
    memcpy(&region, desc + 12, 4);
    char name[64];
    snprintf(name, sizeof name, "/dev/shm/dg-shm-%u-%u", pid, region);
    assert_int_equal(chmod(name, 0644), 0);
    dg_tensor *t = rt_shm_tensor(desc, DG_UINT8, dg_shape1((int64_t)n), n, st);
    assert_null(t);
    assert_status(st, DG_PERMISSION_DENIED, "mode 644");
    rt_shm_pool_free(&p);
    free(src);
    dg_status_free(&st);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_other_process_reads),
        cmocka_unit_test(test_limits_and_reuse),
        cmocka_unit_test(test_dead_sender_unmapped),
        cmocka_unit_test(test_region_permissions),
        cmocka_unit_test(test_bad_descriptors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
