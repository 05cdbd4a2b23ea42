#!/usr/bin/env python3
"""Writes TensorFlow's answers about device names and the replica device setter into the
tables that tests/graph/test_tf_device_conformance.c and
tests/placer/test_tf_setter_conformance.c check distgraph against. Run it from the repository
root with the Python of a TensorFlow installation (TF_PYTHON); it is deterministic:

    "$TF_PYTHON" tests/tf_conformance/gen_device_tables.py [outdir]
    "$TF_PYTHON" tests/tf_conformance/gen_device_tables.py --c-tables   # graph/device_name.c's
                                                                      # Unicode tables

The tables are committed, so CI needs no TensorFlow. Every answer comes from TensorFlow itself:

* C++ DeviceNameUtils through the eager runtime. An op executed with a raw device string has it
  parsed by ParseFullName in EagerOperation::SetDeviceName (a malformed one fails there), which
  keeps ParsedNameToString of the result; an op with a bad attribute then fails before placement
  could overwrite that name, and the thread's next op, with a malformed name, prints it in its
  debug string. Executing the op for real, with soft placement off, says whether the name puts
  it on the host CPU. TFE_GetMemoryInfo parses with ParseFullOrLocalName and matches the host
  CPU with AreCompatibleDevNames; TFE_TensorHandleCopyToDevice looks a name up in the DeviceMgr.
* Python: DeviceSpec.from_string / to_string / make_merged_spec, device_util.canonicalize (graph
  mode), nested tf.device() scopes and training.device_setter.replica_device_setter.

GreedyLoadBalancingStrategy left TensorFlow with tf.contrib; the copy below follows TF 1.15's
tensorflow/contrib/training/python/training/device_setter.py (np.argmin over float64 loads) and is
handed to TensorFlow's own replica_device_setter as its ps_strategy.

Cells where distgraph deliberately gives another answer carry a reason tag in the last column
("column:reason", see docs/TF_COMPAT.md); the generator sets the tags by rule, and the C tests
check that distgraph really differs there and in the documented way.
"""
import json
import os
import random
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import node_def_pb2  # noqa: E402
from tensorflow.python import pywrap_tfe  # noqa: E402
from tensorflow.python.distribute import device_util  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402
from tensorflow.python.framework import device_spec  # noqa: E402
from tensorflow.python.framework import ops  # noqa: E402
from tensorflow.python.training import device_setter  # noqa: E402

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
JOB_MAX_BYTES = 63    # DG_DEVICE_JOB_MAX - 1
TYPE_MAX_BYTES = 31   # DG_DEVICE_TYPE_MAX - 1
LOCAL_CPU = "/job:localhost/replica:0/task:0/device:CPU:0"
SPEC = device_spec.DeviceSpecV2


# ---------------------------------------------------------------------------------------------
# Cell escaping: backslash, tab, CR, LF and other control characters as C escapes; the rest
# (non-ASCII included) as UTF-8.

def esc(s):
    out = []
    for ch in s:
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        else:
            out.append(ch)
    r = "".join(out)
    return r if r else "\\e"   # "\e": the empty string, so that no cell is empty


# ---------------------------------------------------------------------------------------------
# C++ probes through the eager runtime.

tf.config.set_soft_device_placement(False)
CTX = context.context()
CTX.ensure_initialized()
_T = tf.constant(1.0)
_MALFORMED = "/job:-"   # ParseFullName rejects it: a job name starts with a letter
_DEVNAME = re.compile(r"Device Name: \[([^\]]*)\]")
_NOMATCH = re.compile(r"Could not satisfy device specification '([^']*)'")


def _execute(device, dtype=None):
    return pywrap_tfe.TFE_Py_Execute(CTX._handle, device, "Identity", [_T],
                                     ("T", _T.dtype.as_datatype_enum if dtype is None else dtype), 1)


def cpp_parse(s):
    """(ParsedNameToString(ParseFullName(s)) or None, placed on the host CPU 1/0 or None)."""
    # A bad attribute fails the op after SetDeviceName parsed s and before placement could
    # overwrite the name, so the thread's cached op keeps the canonical name; the next op, with
    # a malformed name, fails in SetDeviceName and prints it.
    try:
        _execute(s, dtype="not a dtype")
        raise RuntimeError("op with a bad attribute ran")
    except Exception as e:  # noqa: BLE001
        if "Malformed device specification" in str(e):
            return None, None
        if "Expecting a DType" not in str(e):
            raise
    try:
        _execute(_MALFORMED)
        raise RuntimeError("probe %r was accepted" % _MALFORMED)
    except Exception as e:  # noqa: BLE001
        m = _DEVNAME.search(str(e))
        if not m:
            raise RuntimeError("no device name in %s" % e)
        canon = m.group(1)
    # Placement with soft placement off: the host CPU, or "Could not satisfy" quoting the name.
    try:
        _execute(s)
        placed = 1
    except Exception as e:  # noqa: BLE001
        m = _NOMATCH.search(str(e))
        if not m:
            raise RuntimeError("unexpected answer for %r: %s" % (s, e))
        if m.group(1) != canon:
            raise RuntimeError("%r: probes disagree: %r vs %r" % (s, m.group(1), canon))
        placed = 0
    return canon, placed


def cpp_full_or_local(s):
    """(parsed by ParseFullOrLocalName, compatible with the host CPU or None)."""
    try:
        tf.config.experimental.get_memory_info(s)
        return True, 1
    except ValueError as e:
        msg = str(e)
        if "Failed parsing device name" in msg:
            return False, None
        if "No matching devices" in msg:
            return True, 0
        raise


def cpp_lookup(s):
    try:
        _T._copy_to_device(s)
        return 1
    except Exception as e:  # noqa: BLE001
        if "unknown device" in str(e):
            return 0
        raise


# ---------------------------------------------------------------------------------------------
# Python probes.

def py_spec(s):
    try:
        return SPEC.from_string(s)
    except (ValueError, TypeError):
        return None


def py_canon(s, default=None):
    with ops.Graph().as_default():
        try:
            return device_util.canonicalize(s, default=default)
        except (ValueError, AssertionError, TypeError):
            return None


# ---------------------------------------------------------------------------------------------
# Deliberate differences, by rule.

def spec_out_of_range(spec):
    for v in (spec.replica, spec.task, spec.device_index):
        if v is not None and not INT_MIN <= v <= INT_MAX:
            return True
    return False


def spec_too_long(spec):
    return ((spec.job is not None and len(spec.job.encode()) > JOB_MAX_BYTES) or
            (spec.device_type is not None and len(spec.device_type.encode()) > TYPE_MAX_BYTES))


def canon_too_long(canon):
    m = re.search(r"/job:([^/]*)", canon)
    if m and len(m.group(1).encode()) > JOB_MAX_BYTES:
        return True
    m = re.search(r"/device:([^:/]*)", canon)
    return bool(m and len(m.group(1).encode()) > TYPE_MAX_BYTES)


def cpp_wraps(s):
    # ConsumeNumber reads a uint64 and stores it in an int: values above INT_MAX wrap.
    return any(int(d.lstrip("0") or "0") > INT_MAX for d in re.findall(r":([0-9]+)", s))


def spec_tags(spec, column):
    tags = []
    if spec is not None and spec_out_of_range(spec):
        tags.append(column + ":int_range")
    elif spec is not None and spec_too_long(spec):
        tags.append(column + ":long_name")
    return tags


# ---------------------------------------------------------------------------------------------
# Inputs.

def name_inputs():
    out = []

    def add(*xs):
        for x in xs:
            if "\0" not in x and x not in seen:
                seen.add(x)
                out.append(x)

    seen = set()
    jobs = ["/job:worker", "/job:ps", "/job:w_1", "/job:W", "/job:localhost", "/job:a-b",
            "/job:my-job", "/job:1a", "/job:", "/job:*", "/job:*x", "/job:a b", "/job: a",
            "/job:wörker", "/job:a.b", "/job:_a", "/job:a:b", "/job:A9_z", "/job:-", "/job:a-",
            "/job:" + "j" * 63, "/job:" + "j" * 64, "/job:" + "j" * 100, "/job:a/b"]
    reps = ["/replica:0", "/replica:1", "/replica:01", "/replica:007", "/replica:-1",
            "/replica:*", "/replica:", "/replica:x", "/replica: 1", "/replica:1 ", "/replica:+1",
            "/replica:1_0", "/replica:1__0", "/replica:_1", "/replica:1a", "/replica:2147483647",
            "/replica:2147483648", "/replica:-2147483648", "/replica:-2147483649",
            "/replica:4294967296", "/replica:4294967297", "/replica:18446744073709551615",
            "/replica:18446744073709551616", "/replica:99999999999999999999999",
            "/replica:\u0661", "/replica:\uff12", "/replica:0x1", "/replica:1.0", "/replica:*1",
            "/replica:\u00a01", "/replica:\u20031\u3000", "/replica:\t2\n", "/replica:" + "0" * 4300 + "7",
            "/replica:" + "0" * 4301 + "7"]
    tasks = ["/task:0", "/task:3", "/task:01", "/task:-1", "/task:*", "/task:", "/task:x",
             "/task:2147483647", "/task:2147483648", "/task:4294967297", "/task: 3",
             "/task:\u0663", "/task:1_000", "/task:*3"]
    devs = ["/device:CPU:0", "/device:GPU:1", "/device:cpu:0", "/device:gpu:1", "/device:Gpu:1",
            "/device:gPU:2", "/device:TPU:0", "/device:tpu:0", "/device:CPU", "/device:CPU:*",
            "/device:*:0", "/device:*:*", "/device:*", "/device:", "/device::0", "/device:CPU:",
            "/device:CPU:x", "/device:CPU:0:1", "/device:1CPU:0", "/device:C-PU:0",
            "/device:XLA_CPU:0", "/device:CUSTOM:0", "/device:GPÜ:0", "/device:gpü:0",
            "/device:É:0", "/device:CPU:-1", "/device:CPU: 0", "/device:CPU:\uff11",
            "/device:cpu", "/device:CPU:2147483648", "/device:CPU:00", "/device:CPU:*0",
            "/device:*CPU:0", "/device:C PU:0", "/device:_X:0", "/device:a:1", "/device:" + "T" * 31 + ":0",
            "/device:" + "T" * 32 + ":0", "/device:GPU:1:2", "/device:GPU:1/", "/device:TPU_SYSTEM:0",
            "/device:ǅ:0", "/device:ß:0", "/device:SS:0"]
    legacy = ["/cpu:0", "/CPU:0", "/Cpu:0", "/cPU:0", "/gpu:1", "/GPU:1", "/gPu:1", "/tpu:0",
              "/TPU:0", "/custom:0", "/epu:0", "/EPU:3", "/cpu", "/gpu", "/cpu:*", "/gpu:*",
              "/cpu:", "/cpu:x", "/cpu:-1", "/xla_cpu:0", "/cu\u017ftom:0", "/cu\ufb06om:0",
              "/cu\ufb05om:1", "/ｃｐｕ:0", "/cpu:0:1", "/cpu: 1", "/cpu:2147483648",
              "/cpu:*0", "/gpu:01", "/GPU:*", "/cpu:\u0661", "/tpu", "/TPU:*"]
    local = ["CPU:0", "cpu:0", "GPU:1", "gpu:1", "CPU:*", "CPU", "CPU:", "CPU:0/", "CPU:0:1",
             "XLA_CPU:3", "1CPU:0", "CPU:x", "CPU:01", "C_1:2", "CPU:2147483648", "Cpu:0",
             "device:CPU:0", "job:worker", "job:worker/task:1", "task:1", "replica:0",
             "CPU:0/job:w", "CPU :0", "CPU:-1", "tpu:0", "TPU:0", "custom:0"]
    structure = ["", "/", "//", "///", "/job:a/", "/job:a//task:1", "job:a", " /job:a", "/job:a ",
                 "/job:a/ ", "\t", " ", "/ ", "/job:a\n", "\n", "/:", "/:0", "/::", "/:a:b:c",
                 "/job", "/replica", "/task", "/device", "/job:a/task", "/bogus:1", "/Job:w",
                 "/JOB:w", "/Task:1", "/job:a/bogus:1", "/job:a/replica:0/task:0/foo",
                 "/job:a:/task:1", "/job:a\\b", "/job:a\x01b", "/task:1\x7f", "*", "/*", "/job:*/*",
                 ":", "/job:a/:", "/job:a/:/task:1", "/device:CPU:0/"]
    repeats = ["/job:a/job:b", "/job:a/job:*", "/job:*/job:a", "/task:1/task:2", "/task:1/task:*",
               "/replica:0/replica:1", "/device:CPU:0/device:GPU:1", "/cpu:0/gpu:1",
               "/device:CPU:0/cpu:1", "/cpu:0/device:GPU:0", "/gpu:0/gpu:1", "/cpu:0/cpu:0",
               "/device:GPU:0/device:*:1", "/device:*:1/device:GPU:*", "/cpu:0/CPU:1",
               "/device:GPU/device:CPU", "/job:a/replica:1/job:b/replica:2",
               "/device:gpu:0/cpu:1", "/job:a/task:1/job:b/task:2/device:CPU:0/device:CPU:1"]
    orders = ["/device:GPU:0/task:1/job:w", "/task:1/job:w", "/replica:2/job:w/task:3",
              "/cpu:0/job:w", "/gpu:1/replica:0", "/device:CPU:0/replica:1/job:x/task:2",
              "/task:0/device:GPU:3/replica:1"]
    add(*jobs, *reps, *tasks, *devs, *legacy, *local, *structure, *repeats, *orders)

    # Combinations of well-formed and odd fields.
    cj = ["", "/job:worker", "/job:ps", "/job:*", "/job:a-b", "/job:"]
    cr = ["", "/replica:0", "/replica:*", "/replica:-1"]
    ct = ["", "/task:1", "/task:*", "/task:2147483648"]
    cd = ["", "/device:GPU:0", "/device:gpu:*", "/cpu:1", "/GPU:*", "/device:*:2", "/device:CPU",
          "/device:Tpu:0", "CPU:0"]
    for j in cj:
        for r in cr:
            for t in ct:
                for d in cd:
                    add(j + r + t + d)
    # Every field permutation of one full name.
    import itertools
    parts = ["/job:w", "/replica:1", "/task:2", "/device:GPU:3"]
    for p in itertools.permutations(parts):
        add("".join(p))

    # Token soup from a fixed seed: many near-misses of the grammar.
    tokens = ["/", "/", "/", ":", ":", "job", "replica", "task", "device", "cpu", "CPU", "gpu",
              "GPU", "Gpu", "tpu", "*", "0", "1", "12", "-", "_", " ", "x", "ö", "\u0661", "a",
              "device:", "job:", "/job:", "/task:", "/device:", "/cpu:", "/GPU:", "99999999999"]
    rng = random.Random(20240607)
    for _ in range(1500):
        n = rng.randint(1, 9)
        add("".join(rng.choice(tokens) for _ in range(n)))
    return out


def cpp_tags(s, canon):
    tags = []
    if canon is not None and cpp_wraps(s):
        tags.append("cpp:int_range")
    elif canon is not None and canon_too_long(canon):
        tags.append("cpp:long_name")
    return tags


def write_names(path):
    rows = []
    n_diff = 0
    for s in name_inputs():
        canon, placed = cpp_parse(s)
        fol, compat = cpp_full_or_local(s)
        spec = py_spec(s)
        cz = py_canon(s)
        tags = cpp_tags(s, canon)
        if canon is None and fol is False and "-" in s:
            # A job name with '-': distgraph's ParseFullName accepts it (see TF_COMPAT.md).
            alt, _ = cpp_parse(s.replace("-", "_"))
            if (alt is not None and not cpp_wraps(s) and not canon_too_long(alt) and
                    re.search(r"/job:[A-Za-z][A-Za-z0-9_-]*-", s)):
                tags.append("cpp:job_dash")
                tags.append("cpp_or_local:job_dash")
        if fol and cpp_wraps(s):
            # The local/compat answers come from the same wrapped number.
            tags.append("cpp_or_local:int_range")
        elif fol and ((canon is not None and canon_too_long(canon)) or
                      (canon is None and len(s.split(":")[0].encode()) > TYPE_MAX_BYTES)):
            tags.append("cpp_or_local:long_name")
        tags += spec_tags(spec, "spec")
        if spec is not None and cz is not None:
            if spec_out_of_range(spec):
                tags.append("canon:int_range")
            elif spec_too_long(spec):
                tags.append("canon:long_name")
        n_diff += bool(tags)
        rows.append("\t".join([
            esc(s),
            "ERROR" if canon is None else esc(canon),
            "OK" if fol else "ERROR",
            "-" if compat is None else str(compat),
            "-" if placed is None else str(placed),
            "ERROR" if spec is None else esc(spec.to_string()),
            "ERROR" if cz is None else esc(cz),
            ",".join(tags) if tags else "-",
        ]))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("# TensorFlow %s answers for device-name strings; written by gen_device_tables.py.\n"
                % tf.__version__)
        f.write("# input: the string (C escapes, \\e = empty)\n")
        f.write("# cpp: DeviceNameUtils::ParseFullName, then ParsedNameToString (ERROR: rejected)\n")
        f.write("# cpp_or_local: ParseFullOrLocalName accepts it (OK/ERROR)\n")
        f.write("# compat_cpu: AreCompatibleDevNames(parsed, %s) (1/0; - if not parsed)\n" % LOCAL_CPU)
        f.write("# place_cpu: the eager placer puts the ParseFullName result on that CPU (1/0; -)\n")
        f.write("# spec: DeviceSpec.from_string(input).to_string() (ERROR: ValueError)\n")
        f.write("# canon: device_util.canonicalize(input) in graph mode (ERROR: raises)\n")
        f.write("# diff: column:reason where distgraph deliberately answers otherwise (docs/TF_COMPAT.md)\n")
        f.write("input\tcpp\tcpp_or_local\tcompat_cpu\tplace_cpu\tspec\tcanon\tdiff\n")
        for r in rows:
            f.write(r + "\n")
    return len(rows), n_diff


# ---------------------------------------------------------------------------------------------
# Merges and canonicalize with a default.

MERGE_SPECS = ["", "/job:w", "/job:ps/task:1", "/replica:0", "/task:2", "/device:GPU:1",
               "/device:CPU:*", "/cpu:0", "/gpu:*", "/job:w/replica:1/task:2/device:GPU:3",
               "/job:*", "/device:*:*", "/device:*:0", "/job:/task:0", "/device:gpu:0",
               "/device:Tpu:2", "/replica:-1", "CPU:1", "/job:a-b/device:TPU:0",
               "/job:x/task:3/device:CPU:0", "/task:2147483648", "/bogus:1"]
DEFAULTS = ["", "/job:d", "/job:d/task:3", "/replica:2/task:1", "/device:GPU:0",
            "/job:d/replica:1/task:2/device:GPU:3", "/gpu:1", "/device:*:*", "/device:tpu:1",
            "/job:", "/task:-2", "/bogus:1", "CPU:4", "/job:" + "j" * 70]


def tf_scopes(a, b):
    """op.device of an op made inside tf.device(a) and, within it, tf.device(b)."""
    with ops.Graph().as_default():
        try:
            with tf.device(a):
                with tf.device(b):
                    return tf.constant(1.0).op.device
        except (ValueError, TypeError):
            return None


def write_merge(path):
    rows = []
    n_diff = 0
    for a in MERGE_SPECS:
        for b in MERGE_SPECS:
            sa, sb = py_spec(a), py_spec(b)
            tags = []
            if sa is None or sb is None:
                out = "ERROR"
            else:
                m = sa.make_merged_spec(sb)
                out = esc(m.to_string())
                tags += spec_tags(sa, "merge") or spec_tags(sb, "merge")
            n_diff += bool(tags)
            rows.append("\t".join(["merge", esc(a), esc(b), out, ",".join(tags) or "-"]))
    for d in MERGE_SPECS + ["/device:GPU:0", "/job:w/gpu:1", "/device:Gpu:0", "/device:ǅ:0"]:
        for dflt in DEFAULTS:
            out = py_canon(d, dflt)
            tags = []
            sd, sdef = py_spec(d), py_spec(dflt)
            if out is not None:
                if (sd is not None and spec_out_of_range(sd)) or (
                        sdef is not None and dflt and spec_out_of_range(sdef)):
                    tags.append("canon:int_range")
                elif (sd is not None and spec_too_long(sd)) or (
                        sdef is not None and dflt and spec_too_long(sdef)):
                    tags.append("canon:long_name")
            n_diff += bool(tags)
            rows.append("\t".join(["canon", esc(d), esc(dflt), "ERROR" if out is None else esc(out),
                                   ",".join(tags) or "-"]))
    for a in MERGE_SPECS + ["/job:w/gpu:0"]:
        for b in MERGE_SPECS + ["/device:gpu:1"]:
            out = tf_scopes(a, b)
            tags = []
            sa, sb = py_spec(a), py_spec(b)
            if out is not None and ((sa is not None and spec_out_of_range(sa)) or
                                    (sb is not None and spec_out_of_range(sb))):
                tags.append("scope:int_range")
            elif "" in (a, b):
                # distgraph's "" scope is a barrier, TensorFlow's (None is) a no-op merge.
                alt = tf_scopes(a, None) if b == "" else tf_scopes(None, b)
                if alt != out:
                    tags.append("scope:empty_scope")
            n_diff += bool(tags)
            rows.append("\t".join(["scope", esc(a), esc(b), "ERROR" if out is None else esc(out),
                                   ",".join(tags) or "-"]))
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("# TensorFlow %s: DeviceSpec merges and device_util.canonicalize with a default.\n"
                % tf.__version__)
        f.write("# scope a b: the device of an op made under tf.device(a): tf.device(b): (graph mode)\n")
        f.write("# merge a b: DeviceSpec.from_string(a).make_merged_spec(from_string(b)).to_string()\n")
        f.write("# canon d default: device_util.canonicalize(d, default=default), graph mode\n")
        f.write("kind\ta\tb\tanswer\tdiff\n")
        for r in rows:
            f.write(r + "\n")
    return len(rows), n_diff


def write_lookup(path):
    names = ["/job:localhost/replica:0/task:0/device:CPU:0", "/job:localhost/replica:0/task:0/cpu:0",
             "/device:CPU:0", "CPU:0", "cpu:0", "/device:cpu:0", "/cpu:0", "/CPU:0",
             "/job:localhost/replica:0/task:0/CPU:0", "/job:localhost/replica:0/task:0/device:CPU:00",
             "/job:localhost/replica:0/task:0/device:cpu:0", "/job:localhost/task:0/device:CPU:0",
             "/job:localhost/replica:0/task:0", "/job:localhost", "CPU:1", "CPU:00", "GPU:0",
             "/device:CPU:1", "/job:localhost/replica:0/task:0/cpu:1", "device:CPU:0",
             "/job:localhost/replica:0/task:0/device:CPU:0/", " CPU:0", "CPU:0 ",
             "/job:localhost/replica:0/task:0/Cpu:0", "/replica:0/task:0/device:CPU:0"]
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("# TensorFlow %s: does DeviceMgr::LookupDevice find the host CPU %s by this name?\n"
                % (tf.__version__, LOCAL_CPU))
        f.write("name\tfound\n")
        for n in names:
            f.write("%s\t%d\n" % (esc(n), cpp_lookup(n)))
    return len(names)


# ---------------------------------------------------------------------------------------------
# The replica device setter.

class GreedyLoadBalancingStrategy(object):
    """TF 1.15 contrib's strategy: the least-loaded task (first on ties), then add the load."""

    def __init__(self, num_tasks, load_fn):
        self._load_fn = load_fn
        self._ps_loads = np.zeros(num_tasks)

    def __call__(self, op):
        task = np.argmin(self._ps_loads)
        self._ps_loads[task] += self._load_fn(op)
        return task


class _RoundRobinOver(object):
    """Round robin over the given task ids: what distgraph does for a sparse ps job."""

    def __init__(self, ids):
        self._ids = ids
        self._next = 0

    def __call__(self, unused_op):
        t = self._ids[self._next]
        self._next = (self._next + 1) % len(self._ids)
        return t


OPS_ROUND = [
    ("VariableV2", ""), ("VariableV2", ""), ("Placeholder", ""), ("VariableV2", ""),
    ("VariableV2", "/job:ps"), ("VariableV2", "/job:moon"), ("VariableV2", "/job:ps/task:7"),
    ("VariableV2", "/cpu:0"), ("VariableV2", "/device:GPU:1"), ("VariableV2", "/device:gpu:0"),
    ("VariableV2", "CPU:0"), ("Const", "/job:worker/task:1"), ("Const", "/device:GPU:1"),
    ("Identity", "/job:x/replica:2/task:3/device:CPU:4"), ("NoOp", ""), ("Add", "/gpu:1"),
    ("VariableV2", "/job:"), ("VariableV2", "/job:*"), ("Identity", "/job:"), ("VariableV2", "/job:ps/task:x"),
    ("Identity", "/bogus:1"), ("VariableV2", "/job:/task:1"), ("Placeholder", "/job:ps"),
    ("VariableV2", "/replica:3"), ("VariableV2", "/device:*:1"), ("Identity", "/task:-1"),
    ("VariableV2", "/job:ps/device:CPU:0"), ("VariableV2", ""),
]

CLUSTER_PS_WORKER = {"ps": ["ps0:2222", "ps1:2222"],
                     "worker": ["worker0:2222", "worker1:2222", "worker2:2222"]}
CLUSTER_SUN_MOON = {"sun": ["sun0:2222", "sun1:2222", "sun2:2222"],
                    "moon": ["moon0:2222", "moon1:2222"]}

SETTER_CASES = [
    # id, options
    ("ps_tasks2", dict(ps_tasks=2)),
    ("ps_tasks3", dict(ps_tasks=3)),
    ("cluster", dict(cluster=CLUSTER_PS_WORKER)),
    ("cluster_wins", dict(cluster=CLUSTER_PS_WORKER, ps_tasks=5)),
    ("custom_jobs", dict(cluster=CLUSTER_SUN_MOON, ps_device="/job:moon", worker_device="/job:sun")),
    ("custom_jobs_cpu", dict(cluster=CLUSTER_SUN_MOON, ps_device="/job:moon/cpu:0",
                             worker_device="/job:sun")),
    ("cpu_ps", dict(ps_tasks=1, ps_device="/cpu:0")),
    ("no_merge", dict(cluster=CLUSTER_PS_WORKER, merge_devices=False)),
    ("worker_gpu", dict(ps_tasks=2, worker_device="/job:worker/task:3/device:GPU:0")),
    ("worker_empty", dict(ps_tasks=2, worker_device="")),
    ("ps_empty", dict(ps_tasks=2, ps_device="")),
    ("no_tasks", dict(ps_tasks=0)),
    ("no_ps_job", dict(cluster={"worker": ["w0:1", "w1:1"]}, ps_tasks=5)),
    ("cluster_jobless_ps", dict(cluster={"ps": ["p:1"], "worker": ["w:1"]}, ps_device="/device:CPU:0")),
    ("custom_ops", dict(ps_tasks=2, ps_ops=["Placeholder"])),
    ("no_ops", dict(ps_tasks=2, ps_ops=[])),
    ("ps_with_task", dict(ps_tasks=2, ps_device="/job:ps/task:5")),
    ("ps_empty_job", dict(ps_tasks=2, ps_device="/job:")),
    ("ps_local", dict(ps_tasks=2, ps_device="CPU:0")),
    ("ps_lower_gpu", dict(ps_tasks=2, ps_device="/job:ps/device:gpu:0", worker_device="/gpu:0")),
    ("ps_bad", dict(ps_tasks=2, ps_device="/job:ps/task:x")),
    ("worker_bad", dict(ps_tasks=2, worker_device="/bogus:1")),
    ("both_odd", dict(ps_tasks=2, ps_device="/job:ps/replica:-1", worker_device="/job:w/device:*:*")),
    ("sparse", dict(cluster={"ps": {1: "p1:1", 4: "p4:1"}, "worker": ["w:1"]})),
    ("cluster_ps_bad", dict(cluster=CLUSTER_PS_WORKER, ps_device="/job:ps/task:x")),
    ("cluster_ps_odd", dict(cluster=CLUSTER_PS_WORKER, ps_device="/job:ps/device:tpu:0",
                            worker_device="/job:worker/cpu:*")),
    ("neg_tasks", dict(ps_tasks=-2)),
]

GREEDY_CASES = [
    ("greedy_bytes", 3, [4000, 40, 80, 200, 4, 4000]),
    ("greedy_ties", 3, [40, 40, 40, 4, 4, 4, 0, 0]),
    ("greedy_odd", 2, [0.5, -1, 2.25, 0, -3, 1e300, 7]),
    ("greedy_one", 1, [5, 6, 7]),
    ("greedy_uniform", 2, [1, 1, 1, 1, 1]),
]


_LOADS = {}


def _node(op_type, device, load=None):
    # The load goes by node name: an attr would round it to float32.
    name = "n%d" % len(_LOADS)
    _LOADS[name] = load
    return node_def_pb2.NodeDef(op=op_type, name=name, device=device)


def _run_setter(fn, op_type, device, load=None):
    if fn is None:   # no device function: the op keeps its device
        return device
    try:
        out = fn(_node(op_type, device, load))
    except (ValueError, TypeError):
        return None
    return out if isinstance(out, str) else out.to_string()


def _setter(opts, strategy=None):
    kw = dict(opts)
    if "cluster" in kw:
        kw["cluster"] = tf.train.ClusterSpec(kw["cluster"])
    if strategy is not None:
        kw["ps_strategy"] = strategy
    return device_setter.replica_device_setter(**kw)


def _cell_opts(opts):
    cl = opts.get("cluster")
    if cl is not None:
        cl = json.dumps({k: ({str(i): a for i, a in v.items()} if isinstance(v, dict) else v)
                         for k, v in cl.items()}, sort_keys=True)
    ops_ = opts.get("ps_ops")
    return [str(opts.get("ps_tasks", 0)), esc(opts.get("ps_device", "/job:ps")),
            esc(opts.get("worker_device", "/job:worker")),
            "1" if opts.get("merge_devices", True) else "0",
            "-" if cl is None else cl,
            "<standard>" if ops_ is None else (",".join(ops_) if ops_ else "<none>")]


def write_setter(path):
    lines = []
    n_ops = 0
    n_diff = 0
    for cid, opts in SETTER_CASES:
        lines.append("\t".join(["setter", cid] + _cell_opts(opts) + ["round_robin"]))
        try:
            fn = _setter(opts)
            made = True
        except (ValueError, TypeError):
            fn, made = None, False
        # distgraph refuses a negative ps_tasks, which TensorFlow accepts.
        made_tag = "neg_ps_tasks" if opts.get("ps_tasks", 0) < 0 and "cluster" not in opts else "-"
        n_diff += made_tag != "-"
        lines.append("\t".join(["made", cid, "1" if made else "0", made_tag]))
        dg_fn = None
        if cid == "sparse":
            dg_fn = _setter(opts, _RoundRobinOver([1, 4]))
        for op_type, cur in OPS_ROUND:
            out = _run_setter(fn, op_type, cur) if made else None
            tag = "-"
            if dg_fn is not None:
                alt = _run_setter(dg_fn, op_type, cur)
                if alt != out:
                    tag = "sparse_ps:" + ("ERROR" if alt is None else esc(alt))
                    n_diff += 1
            lines.append("\t".join(["op", cid, op_type, esc(cur), "-",
                                    "ERROR" if out is None else esc(out), tag]))
            n_ops += 1
    for cid, n, loads in GREEDY_CASES:
        opts = dict(ps_tasks=n)
        lines.append("\t".join(["setter", cid] + _cell_opts(opts) + ["greedy"]))
        fn = _setter(opts, GreedyLoadBalancingStrategy(n, lambda op: _LOADS[op.name]))
        lines.append("\t".join(["made", cid, "1", "-"]))
        curs = ["", "/job:ps", "/device:CPU:0", "/job:other", "/job:ps/task:9"]
        for i, load in enumerate(loads):
            cur = curs[i % len(curs)]
            for op_type in ("VariableV2", "Identity"):
                out = _run_setter(fn, op_type, cur, float(load))
                lines.append("\t".join(["op", cid, op_type, esc(cur), repr(float(load)),
                                        "ERROR" if out is None else esc(out), "-"]))
                n_ops += 1
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("# TensorFlow %s: training.device_setter.replica_device_setter; written by "
                "gen_device_tables.py.\n" % tf.__version__)
        f.write("# setter id ps_tasks ps_device worker_device merge cluster(json|-) ps_ops strategy\n")
        f.write("# made id 1|0 diff: replica_device_setter(...) returned (0: it raised); diff\n"
                "#   neg_ps_tasks: distgraph refuses the options (its op rows are not checked)\n")
        f.write("# op id op_type current load answer diff: the device function's answer for a "
                "NodeDef of op_type whose device is current\n")
        f.write("#   (ERROR: it raised; a setter that is None leaves the device as it is);\n")
        f.write("#   diff sparse_ps:<answer>: distgraph's answer (docs/TF_COMPAT.md)\n")
        f.write("# standard_ps_ops " + ",".join(device_setter.STANDARD_PS_OPS) + "\n")
        for line in lines:
            f.write(line + "\n")
    return n_ops, n_diff


def print_c_tables():
    """The Unicode data graph/device_name.c needs to read numbers and case as Python does."""
    import unicodedata
    print("// Python %s, Unicode %s" % (sys.version.split()[0], unicodedata.unidata_version))
    zeros = [c for c in range(0x110000) if unicodedata.decimal(chr(c), -1) == 0]
    assert all(unicodedata.decimal(chr(z + i), -1) == i for z in zeros for i in range(10))
    assert sum(unicodedata.decimal(chr(c), -1) >= 0 for c in range(0x110000)) == 10 * len(zeros)
    print("static const uint32_t py_digit_zeros[] = {")
    print(wrap(["0x%x" % z for z in zeros]))
    print("};")
    spaces = [c for c in range(0x110000) if chr(c).isspace()]
    print("static const uint32_t py_spaces[] = {")
    print(wrap(["0x%x" % c for c in spaces]))
    print("};")
    cased = [c for c in range(0x80, 0x110000) if chr(c).upper() != chr(c)]
    runs = []
    i = 0
    while i < len(cased):
        j, step = i, 1
        if i + 1 < len(cased) and cased[i + 1] - cased[i] in (1, 2):
            step = cased[i + 1] - cased[i]
            while j + 1 < len(cased) and cased[j + 1] - cased[j] == step:
                j += 1
        runs.append((cased[i], cased[j], step))
        i = j + 1
    print("static const uint32_t py_changes_in_upper[][3] = {")
    print(wrap(["{0x%x, 0x%x, %d}" % r for r in runs]))
    print("};")


def wrap(items, width=96):
    lines, cur = [], "   "
    for it in items:
        if len(cur) + len(it) + 2 > width:
            lines.append(cur)
            cur = "   "
        cur += " " + it + ","
    lines.append(cur)
    return "\n".join(lines)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--c-tables":
        print_c_tables()
        return
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    n, d = write_names(os.path.join(outdir, "device_names.tsv"))
    print("device_names.tsv: %d rows, %d with deliberate differences" % (n, d))
    n, d = write_merge(os.path.join(outdir, "device_merge.tsv"))
    print("device_merge.tsv: %d rows, %d with deliberate differences" % (n, d))
    n = write_lookup(os.path.join(outdir, "device_lookup.tsv"))
    print("device_lookup.tsv: %d rows" % n)
    n, d = write_setter(os.path.join(outdir, "device_setter.tsv"))
    print("device_setter.tsv: %d ops, %d with deliberate differences" % (n, d))


if __name__ == "__main__":
    main()
