/* The registry of device types (device.h): the CPU always, the CUDA GPU when built with it.
 * This table is the one place that knows which device types a build has. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distgraph/device_name.h"
#include "distgraph/placer.h"
#include "status_impl.h"
#include "tensor_impl.h"

static const exec_device_type *const types[] = {
    &exec_cpu_device_type,
#ifdef DG_WITH_CUDA
    &exec_cuda_device_type,
#endif
};

#define N_TYPES ((int)(sizeof types / sizeof types[0]))

int exec_num_device_types(void) { return N_TYPES; }

const exec_device_type *exec_device_type_at(int i) {
    return i >= 0 && i < N_TYPES ? types[i] : NULL;
}

const exec_device_type *exec_device_type_find(const char *name) {
    for (int i = 0; name && i < N_TYPES; i++)
        if (strcmp(types[i]->name, name) == 0) return types[i];
    return NULL;
}

int exec_device_count(const char *name) {
    const exec_device_type *t = exec_device_type_find(name);
    return t ? t->count() : 0;
}

char **exec_local_device_names(const char *task, int n_virtual_cpus, int *n) {
    *n = 0;
    int counts[N_TYPES], total = 0;
    for (int i = 0; i < N_TYPES; i++) {
        // types[0] is the CPU: CPU:0 and the virtual CPUs.
        counts[i] = i == 0 ? 1 + (n_virtual_cpus > 0 ? n_virtual_cpus : 0) : types[i]->count();
        total += counts[i];
    }
    char **list = calloc((size_t)total + 1, sizeof *list);
    if (!list) return NULL;
    int k = 0;
    for (int i = 0; i < N_TYPES; i++) {
        for (int id = 0; id < counts[i]; id++) {
            if (asprintf(&list[k], "%s/device:%s:%d", task, types[i]->name, id) < 0) {
                list[k] = NULL;
                dg_device_list_free(list, k);
                return NULL;
            }
            k++;
        }
    }
    *n = k;
    return list;
}

bool exec_device_name_is_accelerator(const char *device_name) {
    dg_device_name dn;
    dg_status st = DG_STATUS_INIT;
    bool ok = device_name && dg_device_name_parse(device_name, &dn, &st);
    status_impl_clear(&st);
    return ok && dn.has_type && strcmp(dn.type, exec_cpu_device_type.name) != 0;
}

void exec_devices_configure(const exec_device_config *c) {
    for (int i = 0; i < N_TYPES; i++)
        if (types[i]->configure) types[i]->configure(c);
}

dg_tensor *exec_tensor_to_host(dg_tensor *t, dg_status *st) {
    if (!t || tensor_on_host(t)) return dg_tensor_ref(t);
    // The type whose memory holds it, by name.
    for (int i = 0; i < N_TYPES; i++)
        if (strcmp(types[i]->name, t->mem.type) == 0 && !types[i]->host_memory && types[i]->to_host)
            return types[i]->to_host(t, st);
    dg_status_setf(st, DG_INTERNAL, "a tensor in the memory of %s:%d, but this build has no such "
                   "device type with memory of its own", t->mem.type, t->mem.index);
    return NULL;
}

int64_t exec_devices_release_all(void) {
    int64_t left = 0;
    for (int i = 0; i < N_TYPES; i++)
        if (types[i]->release_all) left += types[i]->release_all();
    return left;
}
