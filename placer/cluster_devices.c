/* The device list of a cluster, for the placer. */
#include <stdio.h>
#include <stdlib.h>

#include "distgraph/cluster_spec.h"
#include "distgraph/device_name.h"
#include "distgraph/placer.h"

int dg_cluster_devices(const dg_cluster *c, int gpus_per_task, char ***out, dg_status *st) {
    dg_status_reset(st);
    *out = NULL;
    if (!c || gpus_per_task < 0 || gpus_per_task > 1024) {
        dg_status_setf(st, DG_INVALID_ARGUMENT, "cluster devices: %s",
                       !c ? "cluster is NULL" : "gpus_per_task must be in 0..1024");
        return -1;
    }
    int total = dg_cluster_total_tasks(c) * (1 + gpus_per_task), n = 0;
    char **list = calloc((size_t)total + 1, sizeof *list);
    if (!list) {
        dg_status_set(st, DG_RESOURCE_EXHAUSTED, "cluster devices: out of memory");
        return -1;
    }
    for (int j = 0; j < dg_cluster_num_jobs(c); j++) {
        const char *job = dg_cluster_job(c, j);
        for (int t = 0; t < dg_cluster_num_tasks(c, job); t++) {
            int task = dg_cluster_task_index(c, job, t);
            for (int d = -1; d < gpus_per_task; d++) {
                if (asprintf(&list[n], "/job:%s/replica:0/task:%d/device:%s:%d", job, task,
                             d < 0 ? DG_DEVICE_TYPE_CPU : DG_DEVICE_TYPE_GPU, d < 0 ? 0 : d) < 0) {
                    dg_device_list_free(list, n);
                    dg_status_set(st, DG_RESOURCE_EXHAUSTED, "cluster devices: out of memory");
                    return -1;
                }
                n++;
            }
        }
    }
    *out = list;
    return n;
}

void dg_device_list_free(char **list, int n) {
    if (!list) return;
    for (int i = 0; i < n; i++) free(list[i]);
    free(list);
}
