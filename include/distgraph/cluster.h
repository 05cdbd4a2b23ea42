/* Cluster configuration, all of it: cluster specs (distgraph/cluster_spec.h), server
 * definitions (distgraph/server_def.h), TF_CONFIG read as TensorFlow's resolver, RunConfig and
 * multi_worker_util read it (distgraph/tf_config.h), and Slurm allocations
 * (distgraph/slurm.h). Each may be included alone. */
#ifndef DISTGRAPH_CLUSTER_H
#define DISTGRAPH_CLUSTER_H

#include "distgraph/cluster_spec.h"
#include "distgraph/server_def.h"
#include "distgraph/slurm.h"
#include "distgraph/tf_config.h"

#endif
