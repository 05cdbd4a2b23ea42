/* executor/device.c and executor/cpu/cpu_device.c: the registry of device types (the CPU
 * first, every type complete and consistent), the CPU's device table, this process's device
 * names, which device names are accelerators, host copies of host tensors, and the memory a
 * tensor names. Holds with or
 * without CUDA and with or without a GPU. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "exec_kernel_registry_impl.h"

static void test_registry(void **state) {
    (void)state;
    int n = exec_num_device_types();
    assert_true(n >= 1);
    assert_ptr_equal(exec_device_type_at(0), &exec_cpu_device_type);
    assert_null(exec_device_type_at(-1));
    assert_null(exec_device_type_at(n));
    for (int i = 0; i < n; i++) {
        const exec_device_type *t = exec_device_type_at(i);
        assert_non_null(t->name);
        assert_ptr_equal(exec_device_type_find(t->name), t);
        assert_non_null(t->count);
        assert_true(t->count() >= 0);
        assert_non_null(t->register_kernels);
        assert_non_null(t->open);
        assert_non_null(t->to_host);
        const exec_device_ops *ops = t->ops();
        assert_non_null(ops);
        assert_int_equal(ops->version, EXEC_DEVICE_OPS_VERSION);
        assert_string_equal(ops->type, t->name);
        assert_true(ops->alloc && ops->free && ops->copy_to_device && ops->copy_to_host &&
                    ops->synchronize);
        for (int j = 0; j < i; j++) assert_string_not_equal(exec_device_type_at(j)->name, t->name);
    }
    const exec_device_type *cpu = exec_device_type_find(DG_DEVICE_TYPE_CPU);
    assert_ptr_equal(cpu, &exec_cpu_device_type);
    assert_true(cpu->host_memory);
    assert_null(cpu->supports);   // the CPU runs every node it has a kernel for
    assert_null(exec_device_type_find("NOPE"));
    assert_null(exec_device_type_find("cpu"));   // names are canonical: upper-case
    assert_null(exec_device_type_find(NULL));
    assert_int_equal(exec_device_count(DG_DEVICE_TYPE_CPU), 1);
    assert_int_equal(exec_device_count("NOPE"), 0);
}

static void test_cpu_table(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    const exec_device_ops *ops = exec_cpu_device_type.ops();
    void *dev = exec_cpu_device_type.open(0, st);
    assert_non_null(dev);
    assert_ok(st);
    assert_null(exec_cpu_device_type.open(-1, st));
    assert_status(st, DG_INVALID_ARGUMENT, "CPU:-1");
    dg_status_reset(st);
    assert_null(ops->alloc(dev, 0, st));
    assert_ok(st);
    const char src[8] = "abcdefg";
    char back[8] = {0};
    char *p = ops->alloc(dev, sizeof src, st);
    assert_non_null(p);
    assert_true(ops->copy_to_device(dev, p, src, sizeof src, st));
    assert_true(ops->copy_to_host(dev, back, p, sizeof src, st));
    assert_true(ops->synchronize(dev, st));
    assert_ok(st);
    assert_memory_equal(back, src, sizeof src);
    ops->free(dev, p);
    ops->free(dev, NULL);
    assert_null(ops->event_record);
    dg_status_free(&st);
}

static void test_local_device_names(void **state) {
    (void)state;
    int n = -1;
    char **names = exec_local_device_names("/job:w/replica:0/task:1", 2, &n);
    assert_non_null(names);
    int want = 3;
    for (int i = 1; i < exec_num_device_types(); i++) want += exec_device_type_at(i)->count();
    assert_int_equal(n, want);
    assert_string_equal(names[0], "/job:w/replica:0/task:1/device:CPU:0");
    assert_string_equal(names[1], "/job:w/replica:0/task:1/device:CPU:1");
    assert_string_equal(names[2], "/job:w/replica:0/task:1/device:CPU:2");
    // Then each other type's devices, ids from 0, all accelerators.
    int k = 3;
    for (int i = 1; i < exec_num_device_types(); i++) {
        const exec_device_type *t = exec_device_type_at(i);
        for (int id = 0; id < t->count(); id++, k++) {
            char want_name[128];
            snprintf(want_name, sizeof want_name, "/job:w/replica:0/task:1/device:%s:%d", t->name, id);
            assert_string_equal(names[k], want_name);
            assert_true(exec_device_name_is_accelerator(names[k]));
        }
    }
    for (int i = 0; i < 3; i++) assert_false(exec_device_name_is_accelerator(names[i]));
    dg_device_list_free(names, n);
    names = exec_local_device_names("/job:localhost/replica:0/task:0", 0, &n);
    assert_non_null(names);
    assert_int_equal(n, want - 2);
    assert_string_equal(names[0], "/job:localhost/replica:0/task:0/device:CPU:0");
    dg_device_list_free(names, n);
}

static void test_is_accelerator(void **state) {
    (void)state;
    assert_true(exec_device_name_is_accelerator("/gpu:0"));
    assert_true(exec_device_name_is_accelerator("/GPU:1"));
    assert_true(exec_device_name_is_accelerator("/job:worker/task:1/device:GPU:0"));
    assert_true(exec_device_name_is_accelerator("/device:gpu:*"));
    assert_true(exec_device_name_is_accelerator("/device:TPU:0"));   // any type but the CPU
    assert_false(exec_device_name_is_accelerator("/cpu:0"));
    assert_false(exec_device_name_is_accelerator("/job:ps/replica:0/task:0/device:CPU:3"));
    assert_false(exec_device_name_is_accelerator("/job:gpu/task:0"));   // no type
    assert_false(exec_device_name_is_accelerator("/device:*:0"));
    assert_false(exec_device_name_is_accelerator(""));
    assert_false(exec_device_name_is_accelerator(NULL));
    assert_false(exec_device_name_is_accelerator("gpu:0"));   // malformed
}

static void test_host_tensor_to_host(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    dg_tensor *t = dg_tensor_scalar_f32(2.5f);
    dg_tensor *h = exec_tensor_to_host(t, st);
    assert_ok(st);
    assert_ptr_equal(h, t);   // host memory: the same tensor, one more reference
    dg_tensor_unref(h);
    assert_true(dg_tensor_f32(t)[0] == 2.5f);
    dg_tensor_unref(t);
    assert_null(exec_tensor_to_host(NULL, st));
    assert_ok(st);
    dg_status_free(&st);
}

// A tensor names the memory that holds it by device type and index (dg_tensor.mem): views keep
// it, and host code refuses to read memory no device type of this build owns, naming it.
static void test_memory_identity(void **state) {
    (void)state;
    dg_status *st = dg_status_new();
    float v[4] = {1, 2, 3, 4};
    dg_tensor *t = dg_tensor_from_data(DG_FLOAT32, dg_shape_make(1, (int64_t[]){4}), v, st);
    assert_ok(st);
    assert_true(tensor_on_host(t));
    assert_true(tensor_mem_same(t->mem, TENSOR_MEM_HOST));
    static const char elsewhere[] = "ELSEWHERE";   // a type name no device type of the build has
    t->mem = (tensor_mem){elsewhere, 3};
    assert_false(tensor_on_host(t));
    assert_false(tensor_mem_same(t->mem, TENSOR_MEM_HOST));
    assert_false(tensor_mem_same(t->mem, (tensor_mem){elsewhere, 2}));
    assert_true(tensor_mem_same(t->mem, (tensor_mem){elsewhere, 3}));
    // Types are compared by name, not by where the name is stored.
    char copy[sizeof elsewhere];
    memcpy(copy, elsewhere, sizeof elsewhere);
    assert_true(tensor_mem_same(t->mem, (tensor_mem){copy, 3}));
    copy[0] = 'X';
    assert_false(tensor_mem_same(t->mem, (tensor_mem){copy, 3}));
    dg_tensor *view = tensor_view(t, dg_shape_make(2, (int64_t[]){2, 2}), st);
    assert_ok(st);
    assert_true(tensor_mem_same(view->mem, t->mem));
    assert_null(exec_tensor_to_host(view, st));
    assert_status(st, DG_INTERNAL, "ELSEWHERE:3");
    assert_null(dg_tensor_copy(t, st));
    assert_status(st, DG_INTERNAL, "ELSEWHERE:3");
    // A GPU tensor names the GPU type and its id; the CPU's memory is the host's.
    const exec_device_type *gpu = exec_device_type_find(DG_DEVICE_TYPE_GPU);
    if (gpu) assert_false(gpu->host_memory);
    assert_true(exec_cpu_device_type.host_memory);
    t->mem = TENSOR_MEM_HOST;
    dg_tensor_unref(view);
    dg_tensor_unref(t);
    dg_status_free(&st);
}

static void test_configure_and_release(void **state) {
    (void)state;
    exec_devices_configure(&(exec_device_config){.allow_tf32 = false});
    // Nothing of this process uses a device: nothing is handed out.
    assert_int_equal(exec_devices_release_all(), 0);
}

// The kernel registry grows: a thousand kernels more than the types registered are all found
// (it kept 512 and dropped the rest without a word).
static void test_kernel_registry_grows(void **state) {
    (void)state;
    int before = exec_num_kernels();
    assert_true(before > 100);
    enum { N = 1000 };
    static exec_kernel_def defs[N];
    static char names[N][24];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "TestOp%d", i);
        defs[i] = (exec_kernel_def){.op = names[i], .device_type = DG_DEVICE_TYPE_CPU,
                                    .dtype_mask = DT_BIT(DG_FLOAT32)};
    }
    exec_register_kernels(defs, N);
    assert_int_equal(exec_num_kernels(), before + N);
    for (int i = 0; i < N; i += 111)
        assert_ptr_equal(exec_kernel_find(names[i], DG_DEVICE_TYPE_CPU, DG_FLOAT32), &defs[i]);
    assert_ptr_equal(exec_kernel_find("TestOp999", DG_DEVICE_TYPE_CPU, DG_FLOAT32), &defs[N - 1]);
    assert_null(exec_kernel_find("TestOp999", DG_DEVICE_TYPE_CPU, DG_FLOAT64));
    assert_non_null(exec_kernel_find("MatMul", DG_DEVICE_TYPE_CPU, DG_FLOAT32));   // the types' own still there
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_cpu_table),
        cmocka_unit_test(test_local_device_names),
        cmocka_unit_test(test_is_accelerator),
        cmocka_unit_test(test_host_tensor_to_host),
        cmocka_unit_test(test_memory_identity),
        cmocka_unit_test(test_configure_and_release),
        cmocka_unit_test(test_kernel_registry_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
