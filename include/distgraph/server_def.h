/* The server definition tf.distribute.Server builds (tf.train.ServerDef with its defaults): a
 * cluster, this server's job and task, and the protocol. */
#ifndef DISTGRAPH_SERVER_DEF_H
#define DISTGRAPH_SERVER_DEF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "distgraph/cluster_spec.h"
#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- server definitions (tf.train.ServerDef as tf.distribute.Server fills it) ----

typedef struct dg_server_def dg_server_def;
typedef struct dg_server_def_options {
    const char *job_name;   // NULL: the cluster's only job (else INVALID_ARGUMENT)
    bool has_task_index;    // false: the job's only task (else INVALID_ARGUMENT)
    int task_index;
    const char *protocol;   // NULL: "grpc", TensorFlow's default (a name only: distgraph's
                            // servers speak ZeroMQ whatever it says)
} dg_server_def_options;
dg_server_def_options dg_server_def_options_default(void);
// The definition of a server of cluster c: as TensorFlow, a given job or task need not be in
// the cluster (the server refuses it when it starts); an omitted task index of a job the cluster
// lacks is NOT_FOUND. Borrows c for the duration of the call. Returns: new, caller frees with
// dg_server_def_free(); NULL on error.
dg_server_def *dg_server_def_new(const dg_cluster *c, const dg_server_def_options *o,
                                 dg_status *st);
void dg_server_def_free(dg_server_def **d);
// Returns: borrowed, valid until dg_server_def_free().
const dg_cluster *dg_server_def_cluster(const dg_server_def *d);
// Returns: borrowed, valid until dg_server_def_free().
const char *dg_server_def_job_name(const dg_server_def *d);
int dg_server_def_task_index(const dg_server_def *d);
// Returns: borrowed, valid until dg_server_def_free().
const char *dg_server_def_protocol(const dg_server_def *d);

#ifdef __cplusplus
}
#endif
#endif
