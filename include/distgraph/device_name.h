/* Device names, read and written as TensorFlow reads and writes them. One value type,
 * dg_device_name, and two grammars, because TensorFlow has two:
 *  - the runtime's (C++ DeviceNameUtils::ParseFullName), used by the placer, the executor and
 *    everything that reads assigned devices: "/job:<name>/replica:<r>/task:<t>/device:<type>:<id>"
 *    with fields in any order, "*" wildcards and the legacy "/cpu:<id>", "/gpu:<id>";
 *  - Python's DeviceSpec.from_string, what tf.device() scopes, device functions and
 *    device_util.canonicalize read (dg_device_spec_*): more lenient ("CPU:0", "/tpu:1",
 *    "/job:a b", "/task: 3"), stricter elsewhere (one device type per string).
 * Device types keep the case they were written in: "/device:gpu:0" has type "gpu" (a different
 * type from "GPU", as in TensorFlow). Only the legacy forms name "CPU"/"GPU"/..., and
 * DeviceSpec turns exactly "cpu" and "gpu" into "CPU" and "GPU". Both print the same canonical
 * form (ParsedNameToString, DeviceSpec.to_string): "/job:worker/replica:0/task:1/device:GPU:0".
 * docs/TF_COMPAT.md lists where distgraph deliberately answers otherwise. All functions are
 * pure and thread-safe. */
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

// A parsed (possibly partial) device name. A field is set when has_<field> is true; a "*"
// wildcard leaves it unset in the runtime grammar. Names from dg_device_name_parse hold only
// what that grammar accepts; DeviceSpec values may hold any job or type text and negative
// indices, as Python's DeviceSpec does.
typedef struct dg_device_name {
    bool has_job, has_replica, has_task, has_type, has_id;
    char job[DG_DEVICE_JOB_MAX];     // UTF-8 as written; may be "" in a DeviceSpec
    int replica;
    int task;
    char type[DG_DEVICE_TYPE_MAX];   // as written: "CPU", "GPU", "gpu", "XLA_CPU", ...
    int id;
} dg_device_name;

// ---- the runtime's grammar (DeviceNameUtils) ----

// Parses s as ParseFullName ("" and "/" give an all-unset name, NULL is ""). Fields come in
// any order and a repeated field overrides the earlier one; "/cpu:<id>" and "/CPU:<id>"
// (likewise gpu/GPU, no other spelling) mean /device:CPU:<id>. Job names are
// [A-Za-z][A-Za-z0-9_-]*, types [A-Za-z][A-Za-z0-9_]*, indices decimal digits. Returns false
// and sets st (INVALID_ARGUMENT quoting s and the bad part) on a malformed string or an index
// above INT_MAX; out (may be NULL) is only written on success.
bool dg_device_name_parse(const char *s, dg_device_name *out, dg_status *st);
// Parses a local name "<type>:<id>" ("GPU:1", "cpu:0") as ParseLocalName: type and id are set,
// nothing else; no wildcards, nothing after the id. Same failure behaviour as parse.
bool dg_device_name_parse_local(const char *s, dg_device_name *out, dg_status *st);
// ParseFullOrLocalName: a full name, else a local one.
bool dg_device_name_parse_full_or_local(const char *s, dg_device_name *out, dg_status *st);
// Canonical string of n into buf (at most cap bytes); returns buf. Unset fields are omitted;
// a type without an id prints as "/device:GPU:*"; an id without a type does not print.
// Returns NULL (buf "" if cap > 0) if it does not fit; DG_DEVICE_NAME_MAX always suffices.
char *dg_device_name_str(const dg_device_name *n, char *buf, size_t cap);
// Parses s (dg_device_name_parse) and writes its canonical form to buf. Returns false and
// sets st (INVALID_ARGUMENT) if malformed or if the canonical form does not fit in cap.
bool dg_device_name_canonicalize(const char *s, char *buf, size_t cap, dg_status *st);
// SplitDeviceName: the task part of a full name with a type and an id ("/job:w/replica:0/task:1",
// only the fields it has) and its local part ("GPU:0"). Returns false and sets st
// (INVALID_ARGUMENT) if s is malformed, lacks a type or id, or a part does not fit its buffer.
bool dg_device_name_split(const char *s, char *task, size_t task_cap, char *local,
                          size_t local_cap, dg_status *st);

// How many names a device is looked up by (DG_DEVICE_LOOKUP_NAMES) and the names themselves:
// for a complete name the full name, its legacy form with the type in lower case
// (".../task:0/cpu:0"), then "/device:CPU:0" and "CPU:0" (TensorFlow's DeviceMgr names); for a
// name with only type and id the last two; otherwise none. Writes at most cap names; returns
// how many n has (or -1 if one does not fit DG_DEVICE_NAME_MAX, which cannot happen for
// parsed names).
#define DG_DEVICE_LOOKUP_NAMES 4
int dg_device_name_lookup_names(const dg_device_name *n, char (*names)[DG_DEVICE_NAME_MAX],
                                int cap);

// Merges other into target where target's field is unset (TensorFlow's MergeDevNames).
// A conflict in job, replica or task is an error; a conflict in type or id is an error
// unless allow_soft_placement, in which case target's type and id (type conflict) or id (id
// conflict) are cleared and the merge stops there. On failure (INVALID_ARGUMENT "Cannot merge
// devices with incompatible <field>s: '<target>' and '<other>'") target is unchanged.
bool dg_device_name_merge(dg_device_name *target, const dg_device_name *other,
                          bool allow_soft_placement, dg_status *st);
// Fields set in over replace target's: DeviceSpec.make_merged_spec (target is self, over is
// dev) and nested device scopes.
void dg_device_name_merge_override(dg_device_name *target, const dg_device_name *over);
// True when every field set in spec equals the device's field (IsSpecification). Types
// compare case-sensitively, as in TensorFlow.
bool dg_device_name_matches(const dg_device_name *spec, const dg_device_name *device);
// True when a and b could name the same device: no field set in both differs
// (AreCompatibleDevNames).
bool dg_device_name_compatible(const dg_device_name *a, const dg_device_name *b);
// True when job, replica, task, type and id are all set.
bool dg_device_name_is_complete(const dg_device_name *n);
// True when a and b are in the same task: job, replica, task all set and equal
// (IsSameAddressSpace).
bool dg_device_name_same_task(const dg_device_name *a, const dg_device_name *b);

// ---- Python's DeviceSpec and device_util ----

// DeviceSpec.from_string(s) (and check_valid: it fails exactly when TensorFlow raises):
// "/"-separated fields "job:<text>", "replica:<int>", "task:<int>",
// "device:<type>:<int or *>", or a short "<type>[:<int or *>]" where <type> is CPU, GPU,
// TPU, CUSTOM or EPU in any case (stored upper-case); empty fields are skipped; a later job,
// replica or task overrides, a second device type is an error. Indices are read as Python's
// int() reads them ("+1", " 2 ", "1_0", Unicode digits; negative allowed). The long form's
// type is kept as written except exactly "cpu" and "gpu", which become "CPU" and "GPU".
// Indices outside int, jobs over 63 bytes and types over 31 bytes are INVALID_ARGUMENT (a
// deliberate difference). out (may be NULL) is only written on success. NULL s is "".
// DeviceSpec.to_string is dg_device_name_str; make_merged_spec is dg_device_name_merge_override.
bool dg_device_spec_from_string(const char *s, dg_device_name *out, dg_status *st);
// tensorflow.python.framework.device.canonical_name(s): from_string, then to_string.
bool dg_device_spec_canonical_name(const char *s, char *buf, size_t cap, dg_status *st);
// device_util.canonicalize(d, default_device) in graph mode: the fields d leaves unset come
// from default_device (NULL or "": none), and those it leaves unset from
// "/replica:0/task:0/device:CPU:0". A device type of d that is not all upper-case (Python's
// str.upper()) is INVALID_ARGUMENT, as TensorFlow's assertion. device_util.resolve(d) is this
// with the current device scope's device as default_device.
bool dg_device_spec_canonicalize(const char *d, const char *default_device, char *buf,
                                 size_t cap, dg_status *st);

#ifdef __cplusplus
}
#endif
#endif
