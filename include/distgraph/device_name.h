/* Device names in TensorFlow's grammar:
 *   /job:<name>/replica:<r>/task:<t>/device:<TYPE>:<id>
 * with the legacy forms /cpu:0 and /gpu:1 (any case), partial specifications (any field may
 * be missing) and "*" wildcards for the type and id. The canonical form prints the fields in
 * that order with the type upper-case ("/job:worker/replica:0/task:1/device:GPU:0"). */
#ifndef DISTGRAPH_DEVICE_NAME_H
#define DISTGRAPH_DEVICE_NAME_H

#include <stdbool.h>
#include <stddef.h>

#include "distgraph/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DG_DEVICE_JOB_MAX 64
#define DG_DEVICE_TYPE_MAX 32
#define DG_DEVICE_NAME_MAX 192   // bytes, NUL included, of any canonical name

// The device types of this library, as canonical names spell them: the host's processors and
// the CUDA GPU (/device:GPU:0, also written /gpu:0).
#define DG_DEVICE_TYPE_CPU "CPU"
#define DG_DEVICE_TYPE_GPU "GPU"

// A parsed (possibly partial) device name. A field is set when has_<field> is true;
// a wildcard ("*") type or id leaves it unset.
typedef struct dg_device_name {
    bool has_job, has_replica, has_task, has_type, has_id;
    char job[DG_DEVICE_JOB_MAX];
    int replica;
    int task;
    char type[DG_DEVICE_TYPE_MAX];   // upper-case: "CPU", "GPU"
    int id;
} dg_device_name;

// Parses s ("" and "/" give an all-unset name). Fields may come in any order; a repeated
// field overrides the earlier one (as TensorFlow). Job names are [A-Za-z][A-Za-z0-9_-]*,
// at most DG_DEVICE_JOB_MAX-1 bytes; types [A-Za-z][A-Za-z0-9_]* (stored upper-case).
// Returns false and sets st (INVALID_ARGUMENT, quoting s and the bad part) on a malformed
// string; out is only written on success.
bool dg_device_name_parse(const char *s, dg_device_name *out, dg_status *st);
// Canonical string of n into buf (at most cap bytes); returns buf. Unset fields are omitted,
// except that a type without an id prints as "/device:GPU:*" and an id without a type as
// "/device:*:0" (TensorFlow's form). Returns NULL (buf "" if cap > 0) if it does not fit;
// DG_DEVICE_NAME_MAX always suffices.
char *dg_device_name_str(const dg_device_name *n, char *buf, size_t cap);
// Parses s and writes its canonical form to buf. Returns false and sets st
// (INVALID_ARGUMENT) if malformed or if the canonical form does not fit in cap.
bool dg_device_name_canonicalize(const char *s, char *buf, size_t cap, dg_status *st);

// Merges other into target where target's field is unset (TensorFlow's MergeDevNames).
// A conflict in job, replica or task is an error; a conflict in type or id is an error
// unless allow_soft_placement, in which case target's conflicting type/id is cleared.
// On failure (INVALID_ARGUMENT naming both devices) target is unchanged.
bool dg_device_name_merge(dg_device_name *target, const dg_device_name *other,
                          bool allow_soft_placement, dg_status *st);
// Fields set in over replace target's (nested device scopes; DeviceSpec.make_merged_spec).
void dg_device_name_merge_override(dg_device_name *target, const dg_device_name *over);
// True when every field set in spec equals the device's field (concrete matches spec).
bool dg_device_name_matches(const dg_device_name *spec, const dg_device_name *device);
// True when a and b could name the same device (no set field disagrees).
bool dg_device_name_compatible(const dg_device_name *a, const dg_device_name *b);
// True when job, replica, task, type and id are all set.
bool dg_device_name_is_complete(const dg_device_name *n);
// True when a and b are in the same task (job, replica, task all set and equal).
bool dg_device_name_same_task(const dg_device_name *a, const dg_device_name *b);

#ifdef __cplusplus
}
#endif
#endif
