/* Python's dict access on TF_CONFIG: TensorFlow reads the document with json.loads and then
 * indexes it as loosely typed Python values; these answer (and fail) as those expressions do,
 * over the cluster_json_py_* helpers (json.c). */
#include "base_impl.h"
#include "tf_config_impl.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_impl.h"

// `v[key] if key in v else default` (_get_value_in_tfconfig): 1 with *out set, 0 when absent,
// -1 where Python raises TypeError (`in` on a number, or indexing a list or str by a str).
int cluster_tf_lookup(const cluster_json *v, const char *key, const cluster_json **out, const char *where,
                     dg_status *st) {
    int in = cluster_json_py_contains(v, key);
    if (in < 0) {
        cluster_refuse(st, NULL, "%s must be an object to hold \"%s\", got %s (%s)", where, key, cluster_json_py_type(v),
                 cluster_json_kind_name(v->kind));
        return -1;
    }
    if (in == 0) return 0;
    if (v->kind != CLUSTER_JSON_OBJECT) {
        cluster_refuse(st, NULL, "%s must be an object to hold \"%s\", got a %s that contains it", where, key,
                 cluster_json_kind_name(v->kind));
        return -1;
    }
    *out = cluster_json_get(v, key);
    return 1;
}

// `v.get(key)`: only dicts have it (AttributeError otherwise). 1 found, 0 absent, -1 error.
int cluster_tf_dict_get(const cluster_json *v, const char *key, const cluster_json **out, const char *where,
                       dg_status *st) {
    if (v->kind != CLUSTER_JSON_OBJECT) {
        cluster_refuse(st, NULL, "%s must be an object, got %s (%s)", where, cluster_json_py_type(v),
                 cluster_json_kind_name(v->kind));
        return -1;
    }
    *out = cluster_json_get(v, key);
    return *out != NULL;
}

// str(v), NULL for None (and, with st set, when out of memory).
bool cluster_tf_str_or_none(const cluster_json *v, char **out, dg_status *st) {
    *out = NULL;
    if (!v || v->kind == CLUSTER_JSON_NULL) return true;
    if (!(*out = cluster_json_py_str(v))) return base_oom(st, "cluster", v->src_len);
    return true;
}

// int(v) with TensorFlow's errors; a value beyond int64 is refused (a distgraph limit) but
// reported through *big so lookups can still fail as TensorFlow's do (no such task).
bool cluster_tf_int_field(const char *src, const char *what, const cluster_json *v, int64_t *out, bool *big,
                         dg_status *st) {
    char r[48];
    if (big) *big = false;
    switch (cluster_json_py_int(v, out)) {
    case CLUSTER_PY_INT_OK: return true;
    case CLUSTER_PY_INT_TOO_BIG:
        if (big) *big = true;
        return cluster_refuse(st, NULL, "%s %s does not fit 64 bits", what, cluster_raw(src, v, r, sizeof r));
    case CLUSTER_PY_INT_OVERFLOW:
    case CLUSTER_PY_INT_VALUE_ERROR:
    case CLUSTER_PY_INT_TYPE_ERROR: break;
    }
    return cluster_refuse(st, NULL, "%s must be an integer, got %s", what, cluster_raw(src, v, r, sizeof r));
}
