"""Records TensorFlow's answers for cluster specs and TF_CONFIG into the tables that
tests/placer/test_tf_cluster_conformance.c checks distgraph against.

Run it with the Python of a TensorFlow installation (the tables are committed, so CI needs
no TensorFlow):

    git show HEAD:tensorflow_estimator/python/estimator/run_config.py > /tmp/run_config.py
    "$TF_PYTHON" tests/tf_conformance/gen_cluster_tables.py --run-config /tmp/run_config.py

The estimator's RunConfig left TensorFlow in 2.16; its source (github.com/tensorflow/estimator)
is loaded from --run-config with stand-ins for its two estimator-only imports. Without the
flag the run configuration table is left as it is. --random N --out DIR adds N random cases to
each table and writes them elsewhere, to look for disagreements beyond the committed cases
(DG_SOURCE_DIR=D test_tf_cluster_conformance reads D/tests/tf_conformance/).

Tables (JSON lines, one case each; "expect" is TensorFlow's answer, "dg" a deliberate
difference: "tag" names it in docs/TF_COMPAT.md, "expect" is then distgraph's answer):
  cluster_specs.jsonl             tf.train.ClusterSpec(json.loads(text)): jobs, tasks, lookups,
                                  len(job_tasks()), as_dict()
  cluster_spec_strings.jsonl      parse_cluster_spec ("job|h:p;h:p,job|h:p") into a ClusterDef
  cluster_server_defs.jsonl       the ServerDef that tf.distribute.Server builds (defaults)
  cluster_multi_worker.jsonl      multi_worker_util: validation, is_chief, worker_count,
                                  id_in_cluster, collective_leader, coordination_leader
  tf_config_resolver.jsonl        TFConfigClusterResolver: cluster_spec, task_type, task_id,
                                  rpc_layer, environment, master(...), num_accelerators(...)
  tf_config_run_config.jsonl      RunConfig's distributed settings from TF_CONFIG

Errors are recorded as the exception's type and the distgraph status code it maps to: a
lookup of a job or task that the cluster lacks (ClusterSpec's "No such job", "No task with
index", a KeyError on the job) is NOT_FOUND, any other refusal INVALID_ARGUMENT.
"""

import argparse
import importlib.util
import json
import os
import random
import re
import sys
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import cluster_pb2  # noqa: E402
from tensorflow.python.debug.lib import grpc_tensorflow_server  # noqa: E402
from tensorflow.python.distribute import multi_worker_util  # noqa: E402
from tensorflow.python.distribute.cluster_resolver import cluster_resolver as cr_base  # noqa: E402
from tensorflow.python.distribute.cluster_resolver import tfconfig_cluster_resolver as tfcr  # noqa: E402
from tensorflow.python.eager import context  # noqa: E402
from tensorflow.python.framework import config as tf_config_mod  # noqa: E402
from tensorflow.python.training import server_lib  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- outcomes ------------------------------------------------------------------------------

def code_of(exc):
    msg = str(exc)
    if isinstance(exc, KeyError):
        return "NOT_FOUND"
    if isinstance(exc, ValueError) and (msg.startswith("No such job in cluster") or
                                        msg.startswith("No task with index")):
        return "NOT_FOUND"
    return "INVALID_ARGUMENT"


def error_of(exc):
    return {"error": type(exc).__name__, "code": code_of(exc)}


def run(fn):
    """("ok", value) or ("error", {...})."""
    try:
        return True, fn()
    except Exception as e:  # pylint: disable=broad-except
        return False, error_of(e)


def pystr(v):
    """How a value TF hands back reads as text: None stays None, anything else is str()."""
    return None if v is None else str(v)


def cluster_value(spec):
    """A ClusterSpec as {"jobs": {name: [[index, address], ...]}} (tasks by index)."""
    jobs = {}
    for job in spec.jobs:
        jobs[job] = [[i, spec.task_address(job, i)] for i in spec.task_indices(job)]
    return {"jobs": jobs}


def cluster_from_def(cluster_def):
    return tf.train.ClusterSpec(cluster_def)


# ---- deliberate differences ----------------------------------------------------------------
# distgraph's documented departures (docs/TF_COMPAT.md). Each returns a tag or None.

def _walk_strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _walk_strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _walk_strings(x)


class DupKey(Exception):
    pass


def _no_dups(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise DupKey()
    return dict(pairs)


def has_duplicate_keys(text):
    try:
        json.loads(text, object_pairs_hook=_no_dups)
    except DupKey:
        return True
    except Exception:  # pylint: disable=broad-except
        return False
    return False


def sparse_index_collision(cluster):
    """Two keys of a sparse job that name one index ("1" and "01")."""
    if not isinstance(cluster, dict):
        return False
    for tasks in cluster.values():
        if isinstance(tasks, dict):
            seen = set()
            for k in tasks:
                try:
                    i = int(k)
                except Exception:  # pylint: disable=broad-except
                    continue
                if i in seen:
                    return True
                seen.add(i)
    return False


def big_int_in(v):
    """An integer that does not fit 64 bits, where distgraph reads an index."""
    return isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63


def nul_in(v):
    return any("\x00" in s for s in _walk_strings(v))


def tf_config_diff(text):
    """The tag of a TF_CONFIG text distgraph refuses where TensorFlow reads it."""
    if text is None:
        return None
    if has_duplicate_keys(text):
        return "duplicate-keys"
    try:
        doc = json.loads(text)
    except Exception:  # pylint: disable=broad-except
        return None
    if isinstance(doc, dict) and sparse_index_collision(doc.get("cluster")):
        return "duplicate-keys"
    return None


def cluster_diff(text, cluster):
    if has_duplicate_keys(text) or sparse_index_collision(cluster):
        return "duplicate-keys"
    if isinstance(cluster, dict) and nul_in(cluster):
        return "nul-in-string"
    return None


# ---- random cases (--random N: exploration, not the committed tables) ----------------------

RNG = random.Random(0)
N_RANDOM = 0

JOBS = ["chief", "worker", "ps", "evaluator", "master", "", "w-1", "my job", "localhost"]
KEYS = ["0", "1", "2", "3", "01", " 1", "-1", "+2", "1_0", "x", "1.0", "", "\u0661", "2147483648"]
ADDRS = ["h:1", "w0:2222", "", "nohost", "h:0", "[::1]:80", "caf\u00e9:1", "a,b:1", "x|y", "h;1"]


def r_scalar():
    return RNG.choice([None, True, False, 0, 1, -1, 2, 1.0, 1.5, -0.0, 1e16, "", "0", "1", " 1 ",
                       "x", "worker", "chief", "ps", "evaluator", 2**40, [], {}, ["worker"],
                       {"type": "worker"}])


def r_job_value():
    k = RNG.random()
    if k < 0.45:
        return [RNG.choice(ADDRS) for _ in range(RNG.randint(0, 3))]
    if k < 0.85:
        return {RNG.choice(KEYS): RNG.choice(ADDRS) for _ in range(RNG.randint(0, 3))}
    return RNG.choice([None, 1, "h:1", [1], [None], {"0": 5}])


def r_cluster(jobs=tuple(JOBS)):
    return {RNG.choice(jobs): r_job_value() for _ in range(RNG.randint(0, 4))}


def r_task():
    if RNG.random() < 0.8:
        t = {}
        if RNG.random() < 0.85:
            t["type"] = RNG.choice(JOBS[:5] + [r_scalar()])
        if RNG.random() < 0.85:
            t["index"] = RNG.choice([0, 1, 2, -1, "1", 1.7, True, None, "x", 9, r_scalar()])
        return t
    return r_scalar()


def r_tf_config():
    if RNG.random() < 0.03:
        return json.dumps(r_scalar())
    doc = {}
    if RNG.random() < 0.85:
        doc["cluster"] = r_cluster(JOBS[:5]) if RNG.random() < 0.9 else r_scalar()
    if RNG.random() < 0.85:
        doc["task"] = r_task()
    for key in ["rpc_layer", "session_master", "eval_session_master", "environment", "model_dir",
                "service"]:
        if RNG.random() < 0.15:
            doc[key] = r_scalar()
    return json.dumps(doc)


def r_spec_string():
    return "".join(RNG.choice("ps|w,;:h1 |,;") for _ in range(RNG.randint(0, 14)))


# ---- 1. cluster specs from JSON ------------------------------------------------------------

def probe_cluster(spec, extra_jobs=("nojob",)):
    """TF's answers to the lookups the C test repeats."""
    out = {"cluster": cluster_value(spec)}
    spans, lookups, num_tasks = {}, [], {}
    for job in list(spec.jobs) + list(extra_jobs):
        num_tasks[job] = run(lambda: spec.num_tasks(job))[1]  # pylint: disable=cell-var-from-loop
        spans[job] = run(lambda: len(spec.job_tasks(job)))[1]  # pylint: disable=cell-var-from-loop
        indices = spec.task_indices(job) if job in spec.jobs else []
        probes = sorted(set(indices) | {0, 1, 2, -1, max(indices + [0]) + 1})
        for i in probes:
            lookups.append([job, i, run(lambda: spec.task_address(job, i))[1]])  # pylint: disable=cell-var-from-loop
    out["num_tasks"] = num_tasks
    out["spans"] = spans
    out["lookups"] = lookups
    ok, v = run(lambda: json.dumps({j: spec.as_dict()[j] for j in sorted(spec.as_dict())}))
    out["as_json"] = v
    return out


def cluster_cases():
    c = []
    add = c.append
    # Lists, sparse dicts, empty jobs.
    add('{"ps": ["ps0:2222", "ps1:2222"], "worker": ["w0:2222", "w1:2222", "w2:2222"]}')
    add('{"worker": ["localhost:12345", "localhost:23456"]}')
    add('{"chief": ["host0:2222"], "ps": ["host1:2222", "host2:2222"], '
        '"worker": ["host3:2222", "host4:2222", "host5:2222"]}')
    add('{"worker": {"1": "worker1.example.com:2222"}, "ps": ["ps0.example.com:2222", "ps1:2222"]}')
    add('{"worker": {"0": "a:1", "2": "c:3"}}')
    add('{"worker": {"3": "d:4"}}')
    add('{"worker": {"0": "a:1"}}')
    add('{"worker": {"1": "b:2", "0": "a:1"}}')
    add('{"ps": []}')
    add('{"ps": {}}')
    add('{"ps": [], "worker": ["w:1"]}')
    add('{}')
    add('{"local": ["localhost:0"]}')
    add('{"localhost": ["localhost:2222"]}')
    # Addresses are data: anything TF takes.
    for addr in ["nohost", "", ":80", "h:", "h:0", "h:65536", "h:99999999999999999999", "h:-1",
                 "h:8x", "h :1", "a,b:1", "a:b:1", "[::1]:80", "[::1:1", "[]:1", "[zz]:1",
                 "h\"x:1", "h|x:1", "h;x:1", "grpc://h:1", "dg://h:1", "  spaced  ",
                 "caf\u00e9:1", "\u4e3b\u673a:2222", "emoji\U0001F600:1", "tab\there:1",
                 "new\nline:1", "127.0.0.1:2222", "0.0.0.0:1", "/unix/socket", "a" * 300 + ":1"]:
        add(json.dumps({"worker": [addr]}))
    # Job names are data too.
    for job in ["", "my job", "w-1", "w_1", "1w", "W", "j" * 70, "caf\u00e9", "a|b", "a,b",
                "a;b", "a/b", "job:x", "\u4e3b", "evaluator", "master", "x" * 64]:
        add(json.dumps({job: ["h:1"]}))
    # Values TF refuses.
    for v in ['"h:1"', "null", "1", "true", "1.5", '[1]', '[null]', '[true]', '[["h:1"]]',
              '[{"a": 1}]', '{"0": 1}', '{"0": null}', '{"0": ["h:1"]}', '[1.5]']:
        add('{"ps": %s}' % v)
    for top in ['[]', '["h:1"]', 'null', '"ps"', '1', 'true', '[["ps", ["h:1"]]]']:
        add(top)
    # Sparse keys as Python's int() reads them.
    for key in ["01", "00", "+1", "-1", "-0", " 1 ", "\t2\n", "1_0", "_1", "1_", "1__0",
                "0x10", "1.0", "1e2", "", " ", "+", "x", "\u0661", "\u0661\u0662", "\uff13",
                "\u00a05", "\u20074", "\x1c1", "2147483647", "2147483648", "-2147483648",
                "-2147483649", "99999999999", "9" * 30, "\U0001D7D9"]:
        add(json.dumps({"worker": {key: "h:1"}}))
    add(json.dumps({"worker": {"-1": "a:1", "1": "b:1"}}))
    add(json.dumps({"worker": {"-5": "a:1", "1": "b:1"}}))
    add(json.dumps({"worker": {"-1": "a:1", "0": "b:1"}}))
    add(json.dumps({"worker": {"-2": "a:1", "0": "b:1"}}))
    add(json.dumps({"worker": {"-3": "a:1"}}))
    add(json.dumps({"worker": {"5": "a:1", "-1": "b:1", "2": "c:1"}}))
    # Duplicates (TF keeps the last; distgraph refuses).
    add('{"ps": ["h:1"], "ps": ["h:2"]}')
    add('{"ps": {"0": "h:1", "0": "h:2"}}')
    add('{"ps": {"1": "h:1", "01": "h:2"}}')
    # Embedded NUL bytes (C strings cannot hold them).
    add('{"ps": ["h:1\\u0000x"]}')
    add('{"a\\u0000b": ["h:1"]}')
    # Lone surrogates: valid JSON, but not UTF-8 text.
    add('{"ps": ["\\ud800:1"]}')
    add('{"\\udc80": ["h:1"]}')
    add('{"ps": ["\\ud83d\\ude00:1"]}')
    # JSON that Python reads and a strict reader might not.
    add('{"ps": ["h:1"], "worker": {"0": "w:1"}, "x": NaN}')
    add('{"ps": [NaN]}')
    add('{"ps": [Infinity]}')
    add('{"ps": [1e400]}')
    add(' \n\t{"ps": ["h:1"]}\r\n ')
    # Not JSON.
    for bad in ['', '{', '{"ps": ["h:1",]}', "{'ps': ['h:1']}", '{"ps": ["h:1"]} x', '// c\n{}',
                '{"ps": ["h:1"\n}', '\ufeff{}', '[1] [2]']:
        add(bad)
    # Many tasks, many jobs.
    add(json.dumps({"worker": ["w%d:%d" % (i, 2000 + i) for i in range(40)]}))
    add(json.dumps({"j%02d" % i: ["h%d:1" % i] for i in range(20)}))
    add(json.dumps({"worker": {str(i * 7): "w%d:1" % i for i in range(12)}}))
    c.extend(json.dumps(r_cluster()) for _ in range(N_RANDOM))
    return c


def gen_cluster_specs():
    rows = []
    for n, text in enumerate(cluster_cases()):
        row = {"id": "cluster-%03d" % n, "json": text}
        try:
            value = json.loads(text)
        except Exception as e:  # pylint: disable=broad-except
            row["expect"] = error_of(e)
            rows.append(row)
            continue
        ok, spec = run(lambda: tf.train.ClusterSpec(value))
        row["expect"] = probe_cluster(spec) if ok else spec
        tag = cluster_diff(text, value)
        if tag == "duplicate-keys" or tag == "nul-in-string":
            row["dg"] = {"tag": tag, "expect": {"error": "-", "code": "INVALID_ARGUMENT"}}
        elif ok:
            neg = any(i < 0 for j in spec.jobs for i in spec.task_indices(j))
            if neg:
                # as_dict() folds negative indices into a list (or fails); distgraph prints
                # every task, keyed by its index.
                row["dg"] = {"tag": "negative-index-as-dict", "expect": "as_json-by-index"}
        rows.append(row)
    return rows


# ---- 2. spec strings -----------------------------------------------------------------------

def spec_string_cases():
    c = ["ps|h:1;h:2,worker|h:3", "local|localhost:2222;localhost:2223", "worker|h:1",
         "ps|ps0:2222;ps1:2222,worker|w0:2222;w1:2222;w2:2222", "a|x:1,b|y:2,c|z:3",
         "worker|127.0.0.1:2222", "", "ps", "ps|", "|h:1", "ps|h:1;", "ps|;h:1", "ps|h:1;;h:2",
         "ps|h:1,", ",ps|h:1", "ps|h:1,,worker|h:2", "ps|h:1|h:2", "ps||h:1",
         "ps|h:1,ps|h:2", "my job|h:1", "ps|nohost", "ps|h:99999", "ps|h:0", "ps| h:1 ",
         " ps|h:1", "ps|[::1]:80;[::2]:81", "w\u00e9|h:1", "ps|h\u00e9:1", "ps|a:1,b;c|d:1",
         # distgraph's older form (jobs by ';', tasks by ','): TF reads it otherwise or not at all.
         "ps|h:1,h:2;worker|h:3", "ps|127.0.0.1:2222,127.0.0.1:2223;worker|127.0.0.1:2224",
         "ps|h:1;worker|h:2,h:3", "ps|h:1;worker|h:2", "a|[::1]:80;b|x:65535,y:1",
         "ps|h:1;ps|h:2", "ps|h:1;;worker|h:2", "1ps|h:1,h:2;worker|h:3"]
    c.extend(r_spec_string() for _ in range(N_RANDOM))
    return c


def legacy_parse(s):
    """distgraph's older form, with its job-name rule; None where it does not apply."""
    if not s:
        return None
    jobs = {}
    for part in s.split(";"):
        if part.count("|") != 1:
            return None
        name, tasks = part.split("|")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,62}", name) or name in jobs:
            return None
        hosts = tasks.split(",")
        if any(h == "" for h in hosts):
            return None
        jobs[name] = [[i, h] for i, h in enumerate(hosts)]
    return jobs


def sane_names(spec):
    return all(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,62}", j) for j in spec.jobs)


def gen_spec_strings():
    rows = []
    for n, s in enumerate(spec_string_cases()):
        row = {"id": "spec-%03d" % n, "spec": s}

        def parse():
            cd = cluster_pb2.ClusterDef()
            grpc_tensorflow_server.parse_cluster_spec(s, cd)
            names = [j.name for j in cd.job]
            return cd, names

        ok, v = run(parse)
        if ok:
            cd, names = v
            spec = cluster_from_def(cd)
            row["expect"] = {"cluster": cluster_value(spec)}
            if len(set(names)) != len(names):
                row["dg"] = {"tag": "duplicate-keys",
                             "expect": {"error": "-", "code": "INVALID_ARGUMENT"}}
            elif not sane_names(spec) and legacy_parse(s) is not None:
                row["dg"] = {"tag": "legacy-spec-string",
                             "expect": {"cluster": {"jobs": legacy_parse(s)}}}
        else:
            row["expect"] = v
            legacy = legacy_parse(s)
            if legacy is not None:
                row["dg"] = {"tag": "legacy-spec-string",
                             "expect": {"cluster": {"jobs": legacy}}}
        rows.append(row)
    return rows


# ---- 3. server definitions -----------------------------------------------------------------

def gen_server_defs():
    clusters = ['{"worker": ["a:1"]}', '{"worker": ["a:1", "b:1"]}', '{"worker": {"3": "a:1"}}',
                '{"worker": []}', '{}', '{"ps": ["p:1"], "worker": ["w:1"]}',
                '{"localhost": ["localhost:0"]}']
    args = [(None, None, None), ("worker", None, None), ("worker", 0, None), ("worker", 1, None),
            ("ps", None, None), ("ps", 0, None), ("nojob", 5, None), (None, 0, None),
            ("worker", 0, "grpc+verbs"), ("worker", 0, ""), ("worker", -7, None),
            ("worker", 2**31, None), ("", 0, None), (None, None, "grpc")]
    rows = []
    for ci, text in enumerate(clusters):
        for ai, (job, task, proto) in enumerate(args):
            row = {"id": "serverdef-%d-%02d" % (ci, ai), "cluster": text, "job_name": job,
                   "task_index": task, "protocol": proto}
            spec = tf.train.ClusterSpec(json.loads(text))
            ok, v = run(lambda: server_lib._make_server_def(spec, job, task, proto, None))  # pylint: disable=protected-access
            if ok:
                row["expect"] = {"job_name": v.job_name, "task_index": v.task_index,
                                 "protocol": v.protocol, "port": v.port,
                                 "cluster": cluster_value(tf.train.ClusterSpec(v.cluster))}
            else:
                row["expect"] = v
            rows.append(row)
    return rows


# ---- 4. multi_worker_util ------------------------------------------------------------------

def gen_multi_worker():
    clusters = [
        '{"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p0:1", "p1:1"]}',
        '{"worker": ["w0:1", "w1:1", "w2:1"]}',
        '{"worker": ["w0:1"], "evaluator": ["e:1"]}',
        '{"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]}',
        '{"chief": ["c:1", "c2:1"], "worker": ["w:1"]}',
        '{"worker": ["w:1"], "evaluator": ["e:1", "e2:1"]}',
        '{"worker": ["w:1"], "master": ["m:1"]}',
        '{"ps": ["p:1"]}',
        '{"chief": ["c:1"]}',
        '{"worker": {"0": "w0:1", "2": "w2:1"}}',
        '{"worker": {"1": "w1:1"}}',
        '{"worker": []}',
        '{"chief": [], "worker": ["w:1"]}',
        '{}',
        '{"evaluator": ["e:1"]}',
        '{"worker": {"-1": "a:1", "1": "b:1"}, "chief": ["c:1"]}',
        '{"ps": ["p:1"], "worker": ["w:1"]}',
    ]
    for _ in range(N_RANDOM // 10):
        cl = r_cluster(JOBS[:5])
        try:
            tf.train.ClusterSpec(cl)
            clusters.append(json.dumps(cl))
        except Exception:  # pylint: disable=broad-except
            pass
    tasks = [(None, 0), ("chief", 0), ("chief", 1), ("worker", 0), ("worker", 1), ("worker", 2),
             ("worker", 5), ("worker", -1), ("ps", 0), ("ps", 1), ("evaluator", 0),
             ("evaluator", 3), ("master", 0), ("client", 0), ("", 0), ("worker", 2**40)]
    rows = []
    for ci, text in enumerate(clusters):
        for ti, (tt, tid) in enumerate(tasks):
            row = {"id": "mw-%02d-%02d" % (ci, ti), "cluster": text, "task_type": tt,
                   "task_id": tid}
            spec = tf.train.ClusterSpec(json.loads(text))
            exp = {}
            for name, fn in [
                ("validate", lambda: multi_worker_util._validate_cluster_spec(spec, tt, tid)),  # pylint: disable=protected-access
                ("is_chief", lambda: multi_worker_util.is_chief(spec, tt, tid)),
                ("worker_count", lambda: multi_worker_util.worker_count(spec, tt)),
                ("id_in_cluster", lambda: multi_worker_util.id_in_cluster(spec, tt, tid)),
                ("collective_leader", lambda: multi_worker_util.collective_leader(spec, tt, tid)),
                ("coordination_leader", lambda: multi_worker_util.coordination_leader(spec)),
                ("task_count", lambda: multi_worker_util.task_count(spec, tt)),
            ]:
                ok, v = run(fn)
                exp[name] = {"value": v} if ok else v
            row["expect"] = exp
            rows.append(row)
    return rows


# ---- 5. TFConfigClusterResolver ------------------------------------------------------------

_fake_devices = []


def _fake_list_logical_devices(device_type=None):
    del device_type
    return [context.LogicalDevice(name=n, device_type=t) for n, t in _fake_devices]


DEVICE_SETS = [
    [],
    [["/job:worker/replica:0/task:0/device:CPU:0", "CPU"],
     ["/job:worker/replica:0/task:0/device:GPU:0", "GPU"],
     ["/job:worker/replica:0/task:0/device:GPU:1", "GPU"],
     ["/job:worker/replica:0/task:1/device:GPU:0", "GPU"],
     ["/job:worker/replica:0/task:10/device:GPU:0", "GPU"],
     ["/job:worker2/replica:0/task:0/device:TPU:0", "TPU"],
     ["/job:ps/replica:0/task:0/device:GPU:0", "GPU"],
     ["/job:worker/replica:0/task:0/device:XLA_CPU:0", "XLA_CPU"],
     ["/job:localhost/replica:0/task:0/device:GPU:0", "GPU"]],
]


def resolver_cases():
    c = []

    def add(cfg, override=None, env_bytes=None):
        c.append((cfg, override or {}, env_bytes))

    cl = {"ps": ["p0:1", "p1:1"], "worker": ["w0:1", "w1:1"]}
    one = {"worker": ["w0:1"]}
    add(None)
    add("{}")
    add("")
    add("   ")
    add("not json")
    for task in [{"type": "worker", "index": 0}, {"type": "worker", "index": 1},
                 {"type": "ps", "index": 1}, {"type": "worker", "index": "1"},
                 {"type": "worker", "index": " 1 "}, {"type": "worker", "index": "1.0"},
                 {"type": "worker", "index": 1.0}, {"type": "worker", "index": 1.9},
                 {"type": "worker", "index": -0.5}, {"type": "worker", "index": True},
                 {"type": "worker", "index": False}, {"type": "worker", "index": None},
                 {"type": "worker", "index": "abc"}, {"type": "worker", "index": []},
                 {"type": "worker", "index": {}}, {"type": "worker", "index": -1},
                 {"type": "worker", "index": 5}, {"type": "worker", "index": 2**40},
                 {"type": "worker", "index": 2**70}, {"type": "worker", "index": "1_0"},
                 {"type": "worker", "index": "\u0661"},
                 {"type": "worker"}, {"index": 0}, {}, {"type": 0, "index": 0},
                 {"type": None, "index": 0}, {"type": True, "index": 0},
                 {"type": 1.5, "index": 0}, {"type": 1e16, "index": 0},
                 {"type": 1e-7, "index": 0}, {"type": -0.0, "index": 0},
                 {"type": ["worker"], "index": 0}, {"type": {"a": 1}, "index": 0},
                 {"type": "", "index": 0}, {"type": "chief", "index": 0},
                 {"type": "evaluator", "index": 0}, {"type": "nojob", "index": 0},
                 {"type": "Worker", "index": 0}, {"type": "w\u00e9", "index": 0},
                 {"type": ["a", "b'c", "d\"e", 1, None, True, 2.5, {"k": []}], "index": 0},
                 {"type": "worker", "index": 0, "extra": 1}]:
        add(json.dumps({"cluster": cl, "task": task}))
    add('{"cluster": %s, "task": {"type": "worker", "index": NaN}}' % json.dumps(cl))
    add('{"cluster": %s, "task": {"type": "worker", "index": Infinity}}' % json.dumps(cl))
    add('{"cluster": %s, "task": {"type": "worker", "index": -Infinity}}' % json.dumps(cl))
    add('{"cluster": %s, "task": {"type": "worker", "index": 1e400}}' % json.dumps(cl))
    add('{"cluster": %s, "task": {"type": "worker", "index": 1E1}}' % json.dumps(cl))
    add('{"cluster": %s, "task": {"type": "worker", "index": -0}}' % json.dumps(cl))
    add('{"cluster": %s, "task": {"type": "worker", "index": 12345678901234567890123}}'
        % json.dumps(cl))
    # task as something other than an object.
    for task in ['"worker"', '"type index"', '"prototype"', '[]', '["type"]', '["index", "x"]',
                 'null', '1', 'true', '[["type", "worker"]]']:
        add('{"cluster": %s, "task": %s}' % (json.dumps(cl), task))
    # Top level other than an object.
    for top in ['[]', '["cluster"]', '["task"]', '"task"', '"xyz"', '"cluster"', '5', 'null',
                'true', '1.5', '["rpc_layer"]', '"session_master"']:
        add(top)
    # rpc_layer and session_master.
    for rpc in ["grpc", "grpc+verbs", "", None, 5, 0, True, False, [], ["a"], {}, "dg"]:
        add(json.dumps({"cluster": cl, "task": {"type": "worker", "index": 1}, "rpc_layer": rpc}))
    for sm in ["grpc://master:1", "", None, 7, "local"]:
        add(json.dumps({"cluster": cl, "task": {"type": "worker", "index": 1},
                        "session_master": sm}))
    add(json.dumps({"cluster": one, "task": {"type": "worker", "index": 0}, "rpc_layer": "grpc"}))
    add(json.dumps({"cluster": one, "task": {"type": "worker", "index": 0},
                    "session_master": "x:1"}))
    # environment: not read by the resolver (only the override counts).
    for env in ["cloud", "google", "", None, 1]:
        add(json.dumps({"cluster": cl, "task": {"type": "worker", "index": 0}, "environment": env}))
    # Single-task and empty clusters (master() gives "").
    for cluster in [one, {"worker": {"0": "w0:1"}}, {"worker": {"1": "w1:1"}}, {"worker": []},
                    {"ps": [], "worker": ["w:1"]}, {}, {"chief": ["c:1"]},
                    {"chief": ["c:1"], "worker": ["w:1"]}, {"evaluator": ["e:1"]},
                    {"worker": {"-1": "a:1"}}, {"worker": ["w0:1", "w1:1"]}]:
        for task in [{"type": "worker", "index": 0}, {"type": "chief", "index": 0}, None]:
            doc = {"cluster": cluster}
            if task is not None:
                doc["task"] = task
            add(json.dumps(doc))
    add(json.dumps({"task": {"type": "worker", "index": 0}}))
    add(json.dumps({"cluster": None, "task": {"type": "worker", "index": 0}}))
    add(json.dumps({"cluster": ["w:1"], "task": {"type": "worker", "index": 0}}))
    add(json.dumps({"cluster": {"worker": [1]}, "task": {"type": "worker", "index": 0}}))
    # Overrides (TFConfigClusterResolver(task_type=..., task_id=..., rpc_layer=..., environment=...)).
    base = json.dumps({"cluster": cl, "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc"})
    for ov in [{"task_type": "ps"}, {"task_id": 0}, {"task_type": "ps", "task_id": 1},
               {"rpc_layer": "dg"}, {"rpc_layer": ""}, {"environment": "google"},
               {"task_type": "nojob", "task_id": 0}, {"task_id": 9}, {"task_type": ""}]:
        add(base, ov)
    add(None, {"task_type": "worker", "task_id": 0, "rpc_layer": "grpc"})
    # Real launchers: Kubeflow TFJob, SageMaker, Vertex/Cloud ML Engine.
    add(json.dumps({"cluster": {"chief": ["tfjob-chief-0.ns.svc:2222"],
                                "worker": ["tfjob-worker-0.ns.svc:2222",
                                           "tfjob-worker-1.ns.svc:2222"],
                                "ps": ["tfjob-ps-0.ns.svc:2222"]},
                    "task": {"type": "worker", "index": 1}, "environment": "cloud"}))
    add(json.dumps({"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                                "worker": ["algo-2:2222"]},
                    "environment": "cloud", "task": {"index": 0, "type": "master"}}))
    add(json.dumps({"cluster": {"chief": ["cmle-training-master-0:2222"],
                                "worker": ["cmle-training-worker-0:2222"]},
                    "environment": "cloud", "task": {"type": "chief", "index": 0},
                    "job": {"job_name": "x"}}))
    # Bytes that are not UTF-8 (TensorFlow reads them with surrogateescape).
    add(None, None, b'{"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker", '
                    b'"index": 1}, "note": "\xff\xfe"}')
    add(None, None, b'{"cluster": {"worker": ["w\xff:1", "w:2"]}, "task": {"type": "worker", '
                    b'"index": 1}}')
    add(None, None, b'{"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "w\xe9", '
                    b'"index": 1}}')
    add('{"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "\\ud800", "index": 1}}')
    # Duplicate keys.
    add('{"cluster": {"worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 1}, '
        '"task": {"type": "worker", "index": 0}}')
    for _ in range(N_RANDOM):
        ov = {}
        if RNG.random() < 0.1:
            ov["task_type"] = RNG.choice(JOBS)
        if RNG.random() < 0.1:
            ov["task_id"] = RNG.choice([0, 1, 3])
        if RNG.random() < 0.1:
            ov["rpc_layer"] = RNG.choice(["", "grpc"])
        add(r_tf_config(), ov)
    return c


def master_calls(cfg_value):
    calls = [{}, {"task_type": "worker", "task_id": 0}, {"task_type": "worker", "task_id": 1},
             {"task_type": "ps", "task_id": 0, "rpc_layer": "grpc"},
             {"task_type": "nojob", "task_id": 0}, {"task_type": "worker", "task_id": 7},
             {"rpc_layer": "dg"}, {"rpc_layer": ""}, {"task_type": "chief", "task_id": 0}]
    del cfg_value
    return calls


def accel_calls():
    calls = []
    for ds in range(len(DEVICE_SETS)):
        calls.append({"devices": ds})
        calls.append({"devices": ds, "task_type": "worker", "task_id": 0})
        calls.append({"devices": ds, "task_type": "worker", "task_id": 1})
        calls.append({"devices": ds, "task_type": "ps", "task_id": 0})
    return calls


def set_env(cfg, env_bytes):
    if env_bytes is not None:
        os.environb[b"TF_CONFIG"] = env_bytes
    elif cfg is None:
        os.environ.pop("TF_CONFIG", None)
    else:
        os.environ["TF_CONFIG"] = cfg


def resolver_diff(cfg, env_bytes):
    text = cfg
    if env_bytes is not None:
        text = env_bytes.decode("utf-8", "surrogateescape")
    return tf_config_diff(text)


def gen_resolver():
    rows = []
    tf_config_mod.list_logical_devices = _fake_list_logical_devices
    cr_base.config.list_logical_devices = _fake_list_logical_devices
    for n, (cfg, ov, env_bytes) in enumerate(resolver_cases()):
        set_env(cfg, env_bytes)
        row = {"id": "resolver-%03d" % n, "tf_config": cfg}
        if env_bytes is not None:
            row["tf_config"] = None
            row["tf_config_hex"] = env_bytes.hex()
        row["override"] = ov
        r = tfcr.TFConfigClusterResolver(**ov)
        exp = {}
        ok, v = run(lambda: cluster_value(r.cluster_spec()))
        exp["cluster"] = v
        ok, v = run(lambda: r.task_type)
        exp["task_type"] = {"value": v} if ok else v
        ok, v = run(lambda: r.task_id)
        if ok and big_int_in(v):
            row["dg_task_id_big"] = True
        exp["task_id"] = {"value": v} if ok else v
        ok, v = run(lambda: pystr(r.rpc_layer))
        exp["rpc_layer"] = {"value": v} if ok else v
        exp["environment"] = {"value": pystr(r.environment)}
        masters = []
        for call in master_calls(cfg):
            ok, v = run(lambda: pystr(r.master(**call)))
            masters.append({"args": call, "expect": {"value": v} if ok else v})
        exp["master"] = masters
        accels = []
        for call in accel_calls():
            _fake_devices[:] = DEVICE_SETS[call["devices"]]
            args = {k: call[k] for k in ("task_type", "task_id") if k in call}
            ok, v = run(lambda: dict(sorted(r.num_accelerators(**args).items())))
            accels.append({"args": call, "expect": {"value": v} if ok else v})
        exp["num_accelerators"] = accels
        row["device_sets"] = [[n for n, _ in ds] for ds in DEVICE_SETS]
        row["expect"] = exp
        tag = resolver_diff(cfg, env_bytes)
        if tag:
            row["dg"] = {"tag": tag, "expect": {"error": "-", "code": "INVALID_ARGUMENT"}}
        elif row.get("dg_task_id_big"):
            row["dg"] = {"tag": "int64-index", "expect": "task_id-error"}
        row.pop("dg_task_id_big", None)
        rows.append(row)
    os.environ.pop("TF_CONFIG", None)
    return rows


# ---- 6. RunConfig --------------------------------------------------------------------------

def load_run_config(path):
    """The estimator's run_config module from its source, with stand-ins for the imports that
    only the estimator package provides."""
    for name in ["tensorflow_estimator", "tensorflow_estimator.python",
                 "tensorflow_estimator.python.estimator"]:
        sys.modules.setdefault(name, types.ModuleType(name))
    exp = types.ModuleType("tensorflow_estimator.python.estimator.estimator_export")
    exp.estimator_export = lambda *a, **k: (lambda obj: obj)
    sys.modules[exp.__name__] = exp
    try:
        from tensorflow.python.distribute import estimator_training  # noqa: F401 pylint: disable=unused-import,import-outside-toplevel
    except ImportError:
        et = types.ModuleType("tensorflow.python.distribute.estimator_training")
        et.init_run_config = lambda *a, **k: None
        sys.modules[et.__name__] = et
        import tensorflow.python.distribute as tpd  # pylint: disable=import-outside-toplevel
        tpd.estimator_training = et
    spec = importlib.util.spec_from_file_location("run_config_src", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_config_cases():
    c = []
    add = c.append
    cl = {"chief": ["host0:2222"], "ps": ["host1:2222", "host2:2222"],
          "worker": ["host3:2222", "host4:2222", "host5:2222"]}
    add(None)
    add("{}")
    add("")
    add("[]")
    add("5")
    add("null")
    for task in [{"type": "chief", "index": 0}, {"type": "worker", "index": 0},
                 {"type": "worker", "index": 2}, {"type": "worker", "index": 3},
                 {"type": "ps", "index": 1}, {"type": "ps", "index": "1"},
                 {"type": "worker", "index": 1.7}, {"type": "worker", "index": True},
                 {"type": "worker", "index": -1}, {"type": "worker", "index": "x"},
                 {"type": "worker", "index": None}, {"type": "worker"}, {"index": 0},
                 {"type": "", "index": 0}, {"type": 0, "index": 0}, {"type": None, "index": 0},
                 {"type": "evaluator", "index": 0}, {"type": "evaluator", "index": 7},
                 {"type": "evaluator", "index": -1}, {"type": "nojob", "index": 0},
                 {"type": ["worker"], "index": 0}, {"type": "chief", "index": 1}, {}]:
        add(json.dumps({"cluster": cl, "task": task}))
    for task in ['[]', '"worker"', 'null', '5']:
        add('{"cluster": %s, "task": %s}' % (json.dumps(cl), task))
    add(json.dumps({"cluster": cl}))
    add(json.dumps({"cluster": cl, "task": {"type": "worker", "index": 1},
                    "session_master": "sm:1", "eval_session_master": "esm:1"}))
    add(json.dumps({"cluster": cl, "task": {"type": "evaluator", "index": 0},
                    "session_master": "sm:1", "eval_session_master": "esm:1"}))
    add(json.dumps({"cluster": cl, "task": {"type": "evaluator", "index": 0},
                    "eval_session_master": 5}))
    add(json.dumps({"cluster": cl, "task": {"type": "worker", "index": 1}, "session_master": None}))
    add(json.dumps({"cluster": cl, "task": {"type": "worker", "index": 1}, "session_master": 7}))
    # Local mode (no cluster, or an empty one).
    for doc in [{"task": {"type": "worker", "index": 0}}, {"task": {"type": "worker", "index": 1}},
                {"task": {"type": "chief", "index": 0}}, {"task": {"index": "0"}},
                {"task": {"type": "worker", "index": False}}, {"task": {}}, {"task": None},
                {"task": []}, {"cluster": {}, "task": {"type": "worker", "index": 0}},
                {"session_master": "local:1", "eval_session_master": "e:1"},
                {"session_master": None}, {"cluster": None}, {"cluster": []},
                {"task": {"type": "worker", "index": "x"}}]:
        add(json.dumps(doc))
    # Cluster shapes.
    for cluster, task in [
            ({"chief": ["c:1"]}, {"type": "chief", "index": 0}),
            ({"worker": ["w:1"]}, {"type": "worker", "index": 0}),
            ({"chief": ["c:1", "c:2"], "worker": ["w:1"]}, {"type": "chief", "index": 0}),
            ({"chief": [], "worker": ["w:1"]}, {"type": "worker", "index": 0}),
            ({"chief": {"1": "c:1"}, "worker": ["w:1"]}, {"type": "chief", "index": 0}),
            ({"chief": {"0": "c:1"}}, {"type": "chief", "index": 0}),
            ({"chief": ["c:1"], "worker": {"0": "w0:1", "2": "w2:1"}}, {"type": "worker", "index": 1}),
            ({"chief": ["c:1"], "worker": {"0": "w0:1", "2": "w2:1"}}, {"type": "worker", "index": 2}),
            ({"chief": ["c:1"], "worker": {"0": "w0:1", "2": "w2:1"}}, {"type": "worker", "index": 3}),
            ({"chief": ["c:1"], "worker": []}, {"type": "worker", "index": 0}),
            ({"chief": ["c:1"], "ps": [], "worker": ["w:1"]}, {"type": "ps", "index": 0}),
            ({"chief": ["c:1"], "zeta": ["z:1"], "alpha": ["a:1", "a:2"], "ps": ["p:1"],
              "worker": ["w:1"]}, {"type": "zeta", "index": 0}),
            ({"chief": ["c:1"], "zeta": ["z:1"], "alpha": ["a:1", "a:2"], "ps": ["p:1"],
              "worker": ["w:1"]}, {"type": "ps", "index": 0}),
            ({"chief": ["c:1"], "zeta": ["z:1"], "alpha": ["a:1", "a:2"], "ps": ["p:1"],
              "worker": ["w:1"]}, {"type": "alpha", "index": 1}),
            ({"chief": ["c:1"], "evaluator": ["e:1"], "worker": ["w:1"]}, {"type": "worker", "index": 0}),
            ({"chief": ["c:1"], "evaluator": ["e:1"], "worker": ["w:1"]}, {"type": "evaluator", "index": 0}),
            ({"chief": ["c:1"], "worker": {"-1": "a:1", "1": "b:1"}}, {"type": "chief", "index": 0}),
            ({"chief": ["c:1"], "worker": {"-5": "a:1", "1": "b:1"}}, {"type": "chief", "index": 0}),
            ({"chief": ["c:1"], "worker": {"-5": "a:1", "1": "b:1"}}, {"type": "worker", "index": 1}),
            ({"chief": ["c:1"], "ps": {"-5": "a:1", "1": "b:1"}}, {"type": "chief", "index": 0}),
            ({"chief": ["c:1"], "worker": ["w:1"], "ps": {"3": "p:1"}}, {"type": "ps", "index": 3}),
            # Legacy "master" clusters.
            ({"master": ["m:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]}, {"type": "master", "index": 0}),
            ({"master": ["m:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]}, {"type": "worker", "index": 1}),
            ({"master": ["m:1"], "ps": ["p:1"], "worker": ["w:1", "w:2"]}, {"type": "ps", "index": 0}),
            ({"master": ["m:1"], "worker": ["w:1"]}, {"type": "evaluator", "index": 0}),
            ({"master": ["m:1"], "chief": ["c:1"]}, {"type": "master", "index": 0}),
            ({"master": ["m:1", "m:2"]}, {"type": "master", "index": 0}),
            ({"master": ["m:1"]}, {"type": "master", "index": 0}),
    ]:
        add(json.dumps({"cluster": cluster, "task": task}))
    # service and model_dir.
    for extra in [{"service": {"name": "x"}}, {"service": "x"}, {"service": None},
                  {"service": []}, {"model_dir": "/tmp/m"}, {"model_dir": ""},
                  {"model_dir": None}, {"model_dir": 0}, {"model_dir": 5}, {"model_dir": []},
                  {"environment": "cloud"}, {"rpc_layer": "grpc"}]:
        doc = {"cluster": cl, "task": {"type": "worker", "index": 0}}
        doc.update(extra)
        add(json.dumps(doc))
    # SageMaker-style TF_CONFIG.
    add(json.dumps({"cluster": {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                                "worker": ["algo-2:2222"]},
                    "environment": "cloud", "task": {"index": 0, "type": "worker"}}))
    add('{"cluster": %s, "task": {"type": "worker", "index": 0}, "task": {"type": "ps", '
        '"index": 0}}' % json.dumps(cl))
    c.extend(r_tf_config() for _ in range(N_RANDOM))
    return c


def gen_run_config(path):
    mod = load_run_config(path)
    rows = []
    for n, cfg in enumerate(run_config_cases()):
        set_env(cfg, None)
        row = {"id": "runconfig-%03d" % n, "tf_config": cfg}

        def make():
            rc = mod.RunConfig()
            return {"cluster": cluster_value(rc.cluster_spec), "task_type": pystr(rc.task_type),
                    "task_id": rc.task_id, "is_chief": rc.is_chief, "master": pystr(rc.master),
                    "evaluation_master": pystr(rc.evaluation_master),
                    "num_ps_replicas": rc.num_ps_replicas,
                    "num_worker_replicas": rc.num_worker_replicas,
                    "global_id_in_cluster": rc.global_id_in_cluster,
                    "model_dir": pystr(rc.model_dir)}

        ok, v = run(make)
        row["expect"] = v
        if tf_config_diff(cfg):
            row["dg"] = {"tag": "duplicate-keys",
                         "expect": {"error": "-", "code": "INVALID_ARGUMENT"}}
        rows.append(row)
    os.environ.pop("TF_CONFIG", None)
    return rows


# ---- output --------------------------------------------------------------------------------

OUT = HERE


def write(name, rows):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="ascii") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, allow_nan=False) + "\n")
    print("%s: %d rows" % (name, len(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run-config", help="tensorflow_estimator's run_config.py")
    ap.add_argument("--random", type=int, default=0, metavar="N",
                    help="add N random cases to each table (to explore; commit the tables without)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=HERE, help="where to write the tables (default: beside this)")
    args = ap.parse_args()
    global N_RANDOM, OUT  # pylint: disable=global-statement
    N_RANDOM = args.random
    RNG.seed(args.seed)
    OUT = args.out
    context.ensure_initialized()
    write("cluster_specs.jsonl", gen_cluster_specs())
    write("cluster_spec_strings.jsonl", gen_spec_strings())
    write("cluster_server_defs.jsonl", gen_server_defs())
    write("cluster_multi_worker.jsonl", gen_multi_worker())
    write("tf_config_resolver.jsonl", gen_resolver())
    if args.run_config:
        write("tf_config_run_config.jsonl", gen_run_config(args.run_config))
    else:
        print("tf_config_run_config.jsonl: kept (no --run-config)")
    print("TensorFlow %s" % tf.__version__)


if __name__ == "__main__":
    main()
