/* A cluster from a Slurm allocation, as TensorFlow's SlurmClusterResolver makes it. */
#ifndef DISTGRAPH_SLURM_H
#define DISTGRAPH_SLURM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/status.h"
#include "distgraph/tf_config.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- Slurm ----
// A cluster from a Slurm allocation, as TensorFlow's SlurmClusterResolver makes it: the nodes
// of the node list, in order, each with its tasks per node, give the slots host:port_base,
// host:port_base+1, ...; the jobs, in name order ("ps" before "worker"), take consecutive
// slots; this process's rank (SLURM_PROCID) is its slot, hence its job and task index.
#define DG_SLURM_DEFAULT_PORT_BASE 8888
typedef struct dg_slurm_options {
    const char *jobs;       // tasks of each job, "ps:1,worker:3" (required)
    int port_base;          // first port on each node; 0: DG_SLURM_DEFAULT_PORT_BASE
    int tasks_per_node;     // slots on every node; 0: from the allocation's tasks per node
} dg_slurm_options;
// Expands a Slurm node list: "node[01-04,07],gpu5" is node01..node04, node07, gpu5 (a range
// keeps its start's leading zeros; several bracket groups in one name multiply). *hosts gets a
// new array of new strings (free with dg_slurm_hosts_free). Returns the count; -1 with
// INVALID_ARGUMENT naming the byte at fault (an empty name, '[' without ']', a backward or
// non-numeric range, more than 65536 hosts).
int dg_slurm_expand_nodelist(const char *nodelist, char ***hosts, dg_status *st);
void dg_slurm_hosts_free(char **hosts, int n);
// Resolves from given values: the node list, the tasks per node as Slurm writes them ("2(x3),1":
// 2 on each of three nodes, then 1; ignored when o->tasks_per_node is set) and this process's
// rank. out is filled as dg_tf_config_parse fills it (out->cluster new: dg_tf_config_clear).
// INVALID_ARGUMENT for a malformed list or jobs, tasks per node that do not match the nodes,
// more tasks asked than slots, ports past 65535, or a rank beyond the jobs' tasks.
bool dg_slurm_resolve(const dg_slurm_options *o, const char *nodelist, const char *tasks_per_node, int rank,
                      dg_tf_config *out, dg_status *st);
// The same from the environment of a Slurm job step: SLURM_STEP_NODELIST (else
// SLURM_JOB_NODELIST), SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE), SLURM_PROCID.
// NOT_FOUND outside a Slurm job step.
bool dg_slurm_from_env(const dg_slurm_options *o, dg_tf_config *out, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
