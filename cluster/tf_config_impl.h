/* TF_CONFIG's one parser and the Python rules it reads by. dg_tf_resolver reads the text once
 * (tf_resolver.c); RunConfig (run_config.c) and dg_tf_config (tf_config.c) apply their rules to
 * what it read: its document and its cluster. The cluster_tf_* helpers answer as Python's dict access
 * on json.loads' values does (tf_python.c). Messages are relative: each public entry point
 * prepends what it was reading. */
#ifndef DG_TF_CONFIG_IMPL_H
#define DG_TF_CONFIG_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster_impl.h"
#include "distgraph/tf_config.h"
#include "json_impl.h"
#include "status_impl.h"   // dg_status is a complete type here

struct dg_tf_resolver {
    char *text;                 // owned: the TF_CONFIG text ("{}" when unset)
    cluster_json *doc;           // owned
    char *environment;          // owned override, NULL: none
    // Each property as TensorFlow computes it, with its error.
    dg_cluster *cluster;
    dg_status cluster_st;
    char *task_type;            // NULL: None
    dg_status task_type_st;
    bool has_task_id, task_id_big;
    int64_t task_id;
    dg_status task_id_st;
    char *rpc_layer;            // NULL: None
    bool rpc_truthy;
    dg_status rpc_st;
    bool has_session_master;
    char *session_master;       // str() of it
    dg_status session_master_st;
};

// Replays a property's stored outcome into st: true when it succeeded.
bool cluster_tf_replay(const dg_status *stored, dg_status *st);
// The single-task rule: a cluster of no jobs, or of one job whose task list holds one entry,
// runs in process (master ""). -1 on error (the span of an empty job), else 0 or 1.
int cluster_tf_single_task(const dg_cluster *c, dg_status *st);

// `v[key] if key in v else default` (_get_value_in_tfconfig): 1 with *out set, 0 when absent,
// -1 where Python raises TypeError (`in` on a number, or indexing a list or str by a str).
int cluster_tf_lookup(const cluster_json *v, const char *key, const cluster_json **out, const char *where,
                 dg_status *st);
// `v.get(key)`: only dicts have it (AttributeError otherwise). 1 found, 0 absent, -1 error.
int cluster_tf_dict_get(const cluster_json *v, const char *key, const cluster_json **out, const char *where,
                   dg_status *st);
// str(v) into *out (new), NULL for None. False only when out of memory.
bool cluster_tf_str_or_none(const cluster_json *v, char **out, dg_status *st);
// int(v) with TensorFlow's errors; a value beyond int64 is refused (a distgraph limit) but
// reported through *big (may be NULL) so lookups can still fail as TensorFlow's do.
bool cluster_tf_int_field(const char *src, const char *what, const cluster_json *v, int64_t *out, bool *big,
                     dg_status *st);

#endif
