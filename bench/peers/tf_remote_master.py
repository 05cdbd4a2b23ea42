#!/usr/bin/env python3
"""Real-TensorFlow peer: what TensorFlow's client/master split costs.

TensorFlow 1.x lets a client process drive a graph through a *remote* master:
`tf.compat.v1.Session("grpc://host:port")` sends every step to a standing
`tf.distribute.Server` as a RunStep RPC (feeds in the request, fetches in the
reply). This script measures that with the real TensorFlow (tf.compat.v1 graph
mode), in two modes:

  trivial  One standing server (job "worker", 1 task) in its own process. The
           client runs a scalar float32 placeholder fed and `x + 1.0` fetched,
           pinned to /job:worker/task:0: 200 warm-up runs, then --trivial_steps
           timed runs -> metric "trivial_step_us" (median and p90). The same
           graph in an in-process `tf.compat.v1.Session()` (no target) ->
           metric "trivial_step_local_us", for reference.

  mnist    mnist_replica with existing servers: 1 ps + 2 workers as standing
           servers (separate processes, server.join()), then 2 client processes,
           one per worker task, that create no server. Each builds the model of
           the peer tf_mnist_replica.py (784-100-10 MLP, Adam lr 0.01, batch 100,
           replica_device_setter, worker_device /job:worker/task:i) and trains
           under MonitoredTrainingSession(master="grpc://127.0.0.1:<its worker
           port>", is_chief=(i == 0), StopAtStepHook(last_step=--train_steps)).
           The non-chief polls every 50 ms until the chief has initialized the
           variables. -> metric "existing_servers_global_steps_per_s" =
           train_steps / (last client's end - first client's begin), with the
           chief's accuracy on the 10,000 test images ("test_accuracy").

Every process uses 1 intra-op and 1 inter-op thread (--threads). Data:
Fashion-MNIST from Debian's dataset-fashion-mnist, read with fmnist_common.py
from --peer_dir (default: shared/peers next to the repository, i.e.
<repository>/../shared/peers).

Output: JSON lines only on stdout, one object per line:
  {"bench": "tf_remote_master", "impl": "tensorflow", "metric": ...,
   "value": ..., "unit": ..., <details>}
Logs go to stderr.

Run with the interpreter of a virtualenv that has tensorflow-cpu (the peers'
TF_PYTHON convention: TF_PYTHON=VENV/bin/python):
  VENV/bin/python bench/peers/tf_remote_master.py --mode all
  VENV/bin/python bench/peers/tf_remote_master.py --mode trivial --trivial_steps 5000
  VENV/bin/python bench/peers/tf_remote_master.py --mode mnist --train_steps 3000

Processes and ports. Ports are free 127.0.0.1 ports and every address handed
to TensorFlow is 127.0.0.1. TensorFlow's gRPC server itself always listens on
the wildcard address (GrpcServer hard-codes "0.0.0.0:<port>"), so by default
(--isolate auto) the script first moves itself into a private network
namespace whose only interface is loopback; the servers and clients it starts
inherit it, so nothing they open is reachable from outside the machine (or
from other processes on it). If no namespace can be made (no privileges, no
user namespaces), auto goes on with a warning and reports
"listen": "all-interfaces"; --isolate netns makes that an error instead.
Every child is killed when the script exits, however it exits (try/finally,
atexit, SIGINT/SIGTERM/SIGHUP handlers; each child also asks the kernel for
SIGKILL should the script die first). After --max_seconds (default 300) the
script kills everything and exits with status 124.
"""
import argparse
import atexit
import ctypes
import fcntl
import json
import math
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # hide TF's INFO lines, keep warnings

BENCH = "tf_remote_master"
SCRIPT = os.path.abspath(__file__)
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(SCRIPT)))
DEFAULT_PEER_DIR = os.path.normpath(os.path.join(REPO_ROOT, "..", "shared", "peers"))

_json_out = sys.stdout  # replaced in the parent by a private copy of fd 1


def log(msg):
    sys.stderr.write("[%s %s] %s\n" % (BENCH, time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def emit(metric, value, unit, **details):
    rec = {"bench": BENCH, "impl": "tensorflow", "metric": metric, "value": value, "unit": unit}
    rec.update(details)
    _json_out.write(json.dumps(rec) + "\n")
    _json_out.flush()


# --------------------------------------------------------------------------
# Child processes: started, tracked and always stopped by the parent.

class Children:
    """Every process the script starts. kill_all() is idempotent and may be
    called from the main thread, the watchdog thread, atexit or a signal."""

    def __init__(self):
        self.lock = threading.RLock()
        self.procs = []
        self.closing = False

    def spawn(self, argv, **kw):
        with self.lock:
            if self.closing:
                raise RuntimeError("shutting down; not starting %s" % argv[2:4])
            # Own session: a terminal's Ctrl-C reaches only the script, which
            # then stops the children itself.
            p = subprocess.Popen(argv, start_new_session=True, **kw)
            self.procs.append(p)
            return p

    def kill_all(self, grace_s=3.0, final=True):
        """Stop every child still running: SIGTERM, then SIGKILL after grace_s.
        final=False (between modes) still allows new children afterwards."""
        with self.lock:
            self.closing = self.closing or final
            live = [p for p in self.procs if p.poll() is None]
            for p in live:
                try:
                    p.terminate()
                except OSError:
                    pass
            deadline = time.monotonic() + grace_s
            for p in live:
                try:
                    p.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for p in live:
                if p.poll() is None:
                    try:
                        p.kill()
                    except OSError:
                        pass
                    p.wait()
            self.procs = [p for p in self.procs if p.poll() is None]


CHILDREN = Children()


def die_with_parent(parent_pid):
    """In a child: have the kernel SIGKILL us if the parent dies, and exit at
    once if it already has."""
    PR_SET_PDEATHSIG = 1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent_pid and os.getppid() != parent_pid:
        os._exit(1)


def free_loopback_ports(n):
    """n distinct free TCP ports on 127.0.0.1 (all held open until all chosen)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_for_port(port, proc, deadline, what):
    while True:
        if proc.poll() is not None:
            raise RuntimeError("%s exited with status %s before listening" % (what, proc.returncode))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("%s not listening on 127.0.0.1:%d in time" % (what, port))
        time.sleep(0.05)


# --------------------------------------------------------------------------
# Loopback-only networking: a private network namespace.

def enter_private_netns():
    """Move this (still single-threaded) process into a new network namespace
    and bring its loopback interface up. Returns None, or why it failed."""
    CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as e:
        return "no libc: %s" % e
    if libc.unshare(CLONE_NEWNET) != 0:
        err1 = os.strerror(ctypes.get_errno())
        # Unprivileged: a user namespace gives the capabilities for its own
        # network namespace. Keep our uid/gid mapped to themselves.
        uid, gid = os.getuid(), os.getgid()
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            return "unshare(net): %s; unshare(user+net): %s" % (err1, os.strerror(ctypes.get_errno()))
        try:
            for path, text in (("/proc/self/setgroups", "deny"),
                               ("/proc/self/uid_map", "%d %d 1" % (uid, uid)),
                               ("/proc/self/gid_map", "%d %d 1" % (gid, gid))):
                with open(path, "w") as f:
                    f.write(text)
        except OSError as e:
            return "user namespace id maps: %s" % e
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14x", b"lo", 0))
            flags = struct.unpack("16sH14x", ifr)[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        free_loopback_ports(1)  # loopback usable?
    except OSError as e:
        return "bringing up lo in the new namespace: %s" % e
    return None


# --------------------------------------------------------------------------
# Child roles (hidden flags): a standing server, an mnist client.

def thread_config(tf1, threads, **kw):
    return tf1.ConfigProto(intra_op_parallelism_threads=threads,
                           inter_op_parallelism_threads=threads, **kw)


def run_server(args):
    """A standing tf.distribute.Server for one task; serves until killed."""
    die_with_parent(args.parent_pid)
    import tensorflow as tf
    tf1 = tf.compat.v1
    cluster = tf1.train.ClusterSpec(json.loads(args.cluster_spec))
    server = tf1.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index,
                                   config=thread_config(tf1, args.threads))
    log("server /job:%s/task:%d up (%s)" % (args.job_name, args.task_index, server.target))
    server.join()


def run_mnist_client(args):
    """One client process of the existing-servers mnist_replica: connects to
    its worker task's standing server, creates no server of its own."""
    die_with_parent(args.parent_pid)
    sys.path.insert(0, args.peer_dir)
    import fmnist_common as fc  # numpy only
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    tf1.logging.set_verbosity(tf1.logging.WARN)

    spec = json.loads(args.cluster_spec)
    cluster = tf1.train.ClusterSpec(spec)
    task = args.task_index
    is_chief = task == 0
    target = "grpc://" + spec["worker"][task]
    me = "client %d (%s)" % (task, "chief" if is_chief else "non-chief")

    xtr, ytr, xte, yte = fc.load_fmnist(args.data_dir)
    batches = fc.BatchSampler(range(len(xtr)), args.batch_size, args.seed + task)
    tf1.set_random_seed(args.seed)

    pixels, hidden, classes = fc.IMAGE_PIXELS, args.hidden_units, fc.NUM_CLASSES
    with tf1.device(tf1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % task, ps_device="/job:ps/cpu:0",
            cluster=cluster)):
        global_step = tf1.train.get_or_create_global_step()
        hid_w = tf1.Variable(tf1.truncated_normal([pixels, hidden], stddev=1.0 / math.sqrt(pixels)),
                             name="hid_w")
        hid_b = tf1.Variable(tf1.zeros([hidden]), name="hid_b")
        sm_w = tf1.Variable(tf1.truncated_normal([hidden, classes], stddev=1.0 / math.sqrt(hidden)),
                            name="sm_w")
        sm_b = tf1.Variable(tf1.zeros([classes]), name="sm_b")

        x = tf1.placeholder(tf.float32, [None, pixels], name="x")
        y_ = tf1.placeholder(tf.int64, [None], name="y_")
        hid = tf.nn.relu(tf1.nn.xw_plus_b(x, hid_w, hid_b))
        logits = tf1.nn.xw_plus_b(hid, sm_w, sm_b)
        per_example_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=logits)
        loss = tf.reduce_mean(per_example_ce)
        train_op = tf1.train.AdamOptimizer(args.learning_rate).minimize(loss, global_step=global_step)
        # For the evaluation, summed over a chunk of the test set.
        n_correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1), y_), tf.float32))
        ce_sum = tf.reduce_sum(per_example_ce)

    config = thread_config(tf1, args.threads,
                           device_filters=["/job:ps", "/job:worker/task:%d" % task])

    # The non-chief's session manager would re-check readiness only every 30 s:
    # poll faster here until the chief has initialized the variables.
    if not is_chief:
        uninitialized = tf1.report_uninitialized_variables(tf1.global_variables())
        with tf1.Session(target, config=config) as sess:
            while len(sess.run(uninitialized)):
                time.sleep(0.05)

    hooks = [tf1.train.StopAtStepHook(last_step=args.train_steps)]
    with tf1.train.MonitoredTrainingSession(master=target, is_chief=is_chief, hooks=hooks,
                                            config=config, stop_grace_period_secs=1) as sess:
        step_begin = sess.run(global_step)
        time_begin = time.time()
        local_steps = 0
        while not sess.should_stop():
            idx = batches.next()
            sess.run(train_op, feed_dict={x: xtr[idx], y_: ytr[idx]})
            local_steps += 1
        time_end = time.time()
    log("%s: training began at %.3f, ended at %.3f (%.3f s, %d local steps, global step %d at begin)"
        % (me, time_begin, time_end, time_end - time_begin, local_steps, step_begin))

    result = dict(task=task, is_chief=is_chief, time_begin=time_begin, time_end=time_end,
                  local_steps=local_steps, global_step_begin=int(step_begin))
    with tf1.Session(target, config=config) as sess:
        result["global_step_end"] = int(sess.run(global_step))
        if is_chief:  # the variables on the ps, on all 10k test images
            correct = ce = 0.0
            for i in range(0, len(xte), 1000):
                c, s = sess.run([n_correct, ce_sum], feed_dict={x: xte[i:i + 1000], y_: yte[i:i + 1000]})
                correct += float(c)
                ce += float(s)
            result["test_accuracy"] = correct / len(xte)
            result["test_ce"] = ce / len(xte)
            log("%s: test accuracy %.4f, cross-entropy %.4f"
                % (me, result["test_accuracy"], result["test_ce"]))
    with open(args.result_file, "w") as f:
        json.dump(result, f)


# --------------------------------------------------------------------------
# Parent: the two modes.

def start_servers(spec, args):
    """One standing server process per task of spec; returns when all listen."""
    procs = []
    for job in sorted(spec):
        for i, addr in enumerate(spec[job]):
            argv = [sys.executable, SCRIPT, "--serve", "--cluster_spec", json.dumps(spec),
                    "--job_name", job, "--task_index", str(i), "--threads", str(args.threads),
                    "--parent_pid", str(os.getpid())]
            p = CHILDREN.spawn(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno())
            procs.append(("/job:%s/task:%d" % (job, i), int(addr.rsplit(":", 1)[1]), p))
    deadline = time.monotonic() + 120
    for what, port, p in procs:
        wait_for_port(port, p, deadline, "server " + what)
    return [p for _, _, p in procs]


def timed_runs_us(sess, y, x, warmup, steps):
    for i in range(warmup):
        sess.run(y, feed_dict={x: float(i)})
    times = []
    v = None
    for i in range(steps):
        t0 = time.perf_counter_ns()
        v = sess.run(y, feed_dict={x: float(i)})
        times.append((time.perf_counter_ns() - t0) / 1e3)
    if abs(float(v) - (steps - 1 + 1.0)) > 1e-3:
        raise RuntimeError("trivial graph returned %r, expected %r" % (v, steps))
    return times


def summary(times):
    s = sorted(times)
    return dict(median_us=round(statistics.median(s), 2),
                p90_us=round(s[max(0, math.ceil(0.9 * len(s)) - 1)], 2),
                mean_us=round(statistics.fmean(s), 2), min_us=round(s[0], 2))


def mode_trivial(args, common):
    t_mode = time.monotonic()
    import tensorflow as tf
    tf1 = tf.compat.v1
    tf1.disable_eager_execution()
    port, = free_loopback_ports(1)
    spec = {"worker": ["127.0.0.1:%d" % port]}
    log("trivial: starting a standing server for /job:worker/task:0 on 127.0.0.1:%d" % port)
    start_servers(spec, args)
    target = "grpc://127.0.0.1:%d" % port

    remote_graph = tf1.Graph()
    with remote_graph.as_default(), tf1.device("/job:worker/task:0"):
        rx = tf1.placeholder(tf.float32, shape=[], name="x")
        ry = rx + 1.0
    local_graph = tf1.Graph()
    with local_graph.as_default():
        lx = tf1.placeholder(tf.float32, shape=[], name="x")
        ly = lx + 1.0
    config = thread_config(tf1, args.threads)

    with tf1.Session(target, graph=remote_graph, config=config) as sess:
        # Check where the add ran: in a partition graph of the worker task.
        meta = tf1.RunMetadata()
        v = sess.run(ry, feed_dict={rx: 41.0},
                     options=tf1.RunOptions(output_partition_graphs=True), run_metadata=meta)
        devices = [n.device for g in meta.partition_graphs for n in g.node if n.op in ("AddV2", "Add")]
        if v != 42.0 or not devices or not all("/job:worker/replica:0/task:0" in d for d in devices):
            raise RuntimeError("remote trivial graph: value %r, add placed on %s" % (v, devices))
        log("trivial: remote session on %s, add placed on %s; %d warm-up + %d timed runs"
            % (target, devices[0], args.trivial_warmup, args.trivial_steps))
        remote = timed_runs_us(sess, ry, rx, args.trivial_warmup, args.trivial_steps)
    with tf1.Session(graph=local_graph, config=config) as sess:
        log("trivial: in-process session; %d warm-up + %d timed runs"
            % (args.trivial_warmup, args.trivial_steps))
        local = timed_runs_us(sess, ly, lx, args.trivial_warmup, args.trivial_steps)
    CHILDREN.kill_all(final=False)  # the server is no longer needed

    rs, ls = summary(remote), summary(local)
    shared = dict(steps=args.trivial_steps, warmup=args.trivial_warmup, **common)
    emit("trivial_step_us", rs["median_us"], "us", session="grpc remote master", **rs,
         local_median_us=ls["median_us"],
         overhead_us=round(rs["median_us"] - ls["median_us"], 2), **shared)
    emit("trivial_step_local_us", ls["median_us"], "us", session="in-process", **ls, **shared)
    log("trivial: remote median %.1f us (p90 %.1f), local median %.1f us (p90 %.1f); mode took %.1f s"
        % (rs["median_us"], rs["p90_us"], ls["median_us"], ls["p90_us"], time.monotonic() - t_mode))


def mode_mnist(args, common, tmpdir):
    t_mode = time.monotonic()
    ports = free_loopback_ports(3)
    spec = {"ps": ["127.0.0.1:%d" % ports[0]],
            "worker": ["127.0.0.1:%d" % p for p in ports[1:]]}
    log("mnist: starting standing servers: ps %s, workers %s" % (spec["ps"], spec["worker"]))
    servers = start_servers(spec, args)
    log("mnist: servers listening after %.1f s; starting 2 clients (%d global steps)"
        % (time.monotonic() - t_mode, args.train_steps))
    clients = []
    for i in range(len(spec["worker"])):
        result_file = os.path.join(tmpdir, "client%d.json" % i)
        argv = [sys.executable, SCRIPT, "--client", "--cluster_spec", json.dumps(spec),
                "--job_name", "worker", "--task_index", str(i), "--threads", str(args.threads),
                "--parent_pid", str(os.getpid()), "--result_file", result_file,
                "--peer_dir", args.peer_dir, "--data_dir", args.data_dir,
                "--train_steps", str(args.train_steps), "--batch_size", str(args.batch_size),
                "--hidden_units", str(args.hidden_units),
                "--learning_rate", repr(args.learning_rate), "--seed", str(args.seed)]
        p = CHILDREN.spawn(argv, stdin=subprocess.DEVNULL, stdout=sys.stderr.fileno())
        clients.append((p, result_file))

    while any(p.poll() is None for p, _ in clients):
        for i, (p, _) in enumerate(clients):
            if p.poll() not in (None, 0):
                raise RuntimeError("mnist client %d exited with status %d" % (i, p.returncode))
        for p in servers:
            if p.poll() is not None:
                raise RuntimeError("a standing server exited (status %d) during training" % p.returncode)
        time.sleep(0.1)
    results = []
    for i, (p, result_file) in enumerate(clients):
        if p.returncode != 0:
            raise RuntimeError("mnist client %d exited with status %d" % (i, p.returncode))
        with open(result_file) as f:
            results.append(json.load(f))
    CHILDREN.kill_all(final=False)

    first_begin = min(r["time_begin"] for r in results)
    last_end = max(r["time_end"] for r in results)
    chief = results[0]
    train_s = last_end - first_begin
    emit("existing_servers_global_steps_per_s", round(args.train_steps / train_s, 2), "global_steps/s",
         ps=1, workers=2, test_accuracy=round(chief["test_accuracy"], 4),
         test_ce=round(chief["test_ce"], 4), train_steps=args.train_steps, train_s=round(train_s, 3),
         global_step_end=max(r["global_step_end"] for r in results),
         local_steps=[r["local_steps"] for r in results],
         client_train_s=[round(r["time_end"] - r["time_begin"], 3) for r in results],
         client_begin_offset_s=[round(r["time_begin"] - first_begin, 3) for r in results],
         batch_size=args.batch_size, learning_rate=args.learning_rate,
         hidden_units=args.hidden_units, **common)
    log("mnist: %.1f global steps/s over %.3f s, chief test accuracy %.4f; mode took %.1f s"
        % (args.train_steps / train_s, train_s, chief["test_accuracy"], time.monotonic() - t_mode))
    if chief["test_accuracy"] < 0.5:
        raise RuntimeError("implausible test accuracy %.4f" % chief["test_accuracy"])


def isolate(args):
    """Returns the "listen" detail, or None if --isolate netns cannot be met."""
    if args.isolate == "none":
        return "all-interfaces"
    why = enter_private_netns()
    if why is None:
        log("in a private network namespace with loopback only")
        return "loopback-only (private network namespace)"
    if args.isolate == "netns":
        log("cannot make a private network namespace: %s" % why)
        return None
    log("WARNING: cannot make a private network namespace (%s); TensorFlow's servers "
        "will listen on all interfaces (the addresses used are 127.0.0.1)" % why)
    return "all-interfaces"


def run_parent(args, listen):
    global _json_out
    # stdout carries JSON lines only: keep a private copy of fd 1 for them and
    # point fd 1 (anything a library might print there) at stderr.
    sys.stdout.flush()
    _json_out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    t_start = time.monotonic()
    timed_out = threading.Event()

    def on_timeout():
        timed_out.set()
        log("TIMEOUT: --max_seconds %d reached; killing every child" % args.max_seconds)
        CHILDREN.kill_all(grace_s=1.0)
        os._exit(124)

    watchdog = threading.Timer(args.max_seconds, on_timeout)
    watchdog.daemon = True

    def on_signal(signum, _frame):
        log("signal %d: stopping" % signum)
        CHILDREN.kill_all(grace_s=1.0)
        raise SystemExit(128 + signum)

    atexit.register(CHILDREN.kill_all)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    watchdog.start()
    tmpdir = tempfile.mkdtemp(prefix="tf_remote_master.")
    try:
        import tensorflow as tf
        common = dict(tf_version=tf.__version__, threads=args.threads, listen=listen)
        log("TensorFlow %s; mode %s; max %d s" % (tf.__version__, args.mode, args.max_seconds))
        if args.mode in ("trivial", "all"):
            mode_trivial(args, common)
        if args.mode in ("mnist", "all"):
            mode_mnist(args, common, tmpdir)
        log("done in %.1f s" % (time.monotonic() - t_start))
        return 0
    except Exception as e:  # noqa: BLE001  (report, stop everything, exit 1)
        if timed_out.is_set():  # the watchdog killed the children under us
            return 124
        log("FAILED: %s: %s" % (type(e).__name__, e))
        return 1
    finally:
        watchdog.cancel()
        CHILDREN.kill_all()
        shutil.rmtree(tmpdir, ignore_errors=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Real-TensorFlow peer: the cost of TensorFlow's client/master split "
                    "(a trivial step through a remote master, and mnist_replica with "
                    "existing servers). JSON lines on stdout, logs on stderr.")
    ap.add_argument("--mode", choices=["trivial", "mnist", "all"], default="all")
    ap.add_argument("--trivial_steps", type=int, default=2000, help="timed runs of the trivial graph")
    ap.add_argument("--trivial_warmup", type=int, default=200, help="warm-up runs before timing")
    ap.add_argument("--train_steps", type=int, default=3000, help="global steps to train (mnist)")
    ap.add_argument("--batch_size", type=int, default=100)
    ap.add_argument("--hidden_units", type=int, default=100)
    ap.add_argument("--learning_rate", type=float, default=0.01, help="Adam learning rate")
    ap.add_argument("--seed", type=int, default=1, help="graph seed; batch seed is seed + task")
    ap.add_argument("--threads", type=int, default=1, help="intra- and inter-op threads per process")
    ap.add_argument("--peer_dir", default=DEFAULT_PEER_DIR,
                    help="folder with fmnist_common.py (default: ../shared/peers from the "
                         "repository root)")
    ap.add_argument("--data_dir", default=None,
                    help="Fashion-MNIST IDX .gz files (default: fmnist_common's, "
                         "the Debian dataset-fashion-mnist folder or $FMNIST_DIR)")
    ap.add_argument("--max_seconds", type=int, default=300,
                    help="kill everything and exit 124 after this long")
    ap.add_argument("--isolate", choices=["auto", "netns", "none"], default="auto",
                    help="run everything in a private loopback-only network namespace: "
                         "auto = if possible, netns = required, none = never")
    # Internal: the roles of the child processes.
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cluster_spec", help=argparse.SUPPRESS)
    ap.add_argument("--job_name", help=argparse.SUPPRESS)
    ap.add_argument("--task_index", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--parent_pid", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--result_file", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if min(args.trivial_steps, args.train_steps, args.batch_size, args.threads,
           args.max_seconds) < 1 or args.trivial_warmup < 0:
        ap.error("step counts, --batch_size, --threads and --max_seconds must be positive")
    args.peer_dir = os.path.abspath(args.peer_dir)
    return args


def main():
    args = parse_args()
    if args.serve:
        run_server(args)
        return 0
    if args.client:
        run_mnist_client(args)
        return 0
    # Namespace first, before anything starts a thread (numpy's BLAS pool,
    # TensorFlow): unshare(CLONE_NEWUSER) needs a single-threaded process.
    listen = isolate(args)
    if listen is None:
        return 1
    if args.mode in ("mnist", "all"):
        if not os.path.isfile(os.path.join(args.peer_dir, "fmnist_common.py")):
            log("no fmnist_common.py in --peer_dir %s" % args.peer_dir)
            return 2
        if args.data_dir is None:
            sys.path.insert(0, args.peer_dir)
            import fmnist_common as fc  # numpy only
            args.data_dir = fc.DATA_DIR
        if not os.path.isfile(os.path.join(args.data_dir, "t10k-images-idx3-ubyte.gz")):
            log("no Fashion-MNIST files in %s (install dataset-fashion-mnist)" % args.data_dir)
            return 2
    return run_parent(args, listen)


if __name__ == "__main__":
    sys.exit(main())
