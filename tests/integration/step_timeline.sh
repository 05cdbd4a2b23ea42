#!/usr/bin/env bash
# Step timelines (distgraph/trace.h) of MNIST-replica, 1 ps + 2 workers: each worker records its
# 30th step with --trace_step and writes a Chrome trace-event file. Each file must pass the
# trace-event format's rules (tests/tools/validate_trace.py, written from the format's
# documentation, not from our writer); name both tasks; hold the worker's MatMuls, the ps's
# ApplyAdam and the first layer's weights (784 x 100 float32 = 313600 bytes) travelling to the
# worker and back as a gradient; the union of its events (waits left out), computed here, must
# cover at least 90% of the step but for its largest gap (three tasks, two of them asynchronous
# workers, share the host's cores: the OS may preempt a task for hundreds of microseconds
# anywhere in the step, which no event can show, while work the trace misses would leave gaps
# all through it; a failure prints the largest gaps); and since every task here shares one
# clock, the estimated offset of the ps's clock must bracket 0. Then the same through standing
# dg-server tasks and remote sessions (--existing_servers), and a trace file that cannot be
# written: a warning, and training goes on.
source "$(dirname "$0")/common.bash"
SRC="${DG_SOURCE_DIR:?}"
cd "$TMP"
check() {   # check FILE WORKER_TASK REMOTE(0|1)
    python3 "$SRC/tests/tools/validate_trace.py" "$1" --strict || fail "$1 breaks the trace-event format"
    python3 - "$@" <<'PY' || fail "$1: the timeline is wrong (above)"
import json, re, sys
path, wtask, remote = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
d = json.load(open(path))
ev = d["traceEvents"]
procs = {e["pid"]: e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
ps, wk = "/job:ps/replica:0/task:0", "/job:worker/replica:0/task:%d" % wtask
assert ps in procs.values() and wk in procs.values(), procs
pid = {v: k for k, v in procs.items()}
X = [e for e in ev if e["ph"] == "X"]
ops = lambda task, op: [e for e in X if e["cat"] == "op" and e["pid"] == pid[task] and e["args"].get("op") == op]
assert len(ops(wk, "MatMul")) >= 4, "worker MatMuls: %d" % len(ops(wk, "MatMul"))
assert len(ops(ps, "ApplyAdam")) == 4, "ps ApplyAdams: %d" % len(ops(ps, "ApplyAdam"))
xfer = [e for e in X if e["cat"] == "transfer" and e["args"].get("from")]
w_in = [e for e in xfer if e["name"] == "hid_w:0" and e["pid"] == pid[wk] and e["args"]["from"] == ps]
g_out = [e for e in xfer if e["pid"] == pid[ps] and e["args"]["from"] == wk and e["args"]["bytes"] == 313600]
assert len(w_in) == 1 and w_in[0]["args"]["bytes"] == 313600, w_in
assert len(g_out) == 1, g_out
assert w_in[0]["ts"] + w_in[0]["dur"] <= g_out[0]["ts"] + 1, (w_in, g_out)   # the gradient needs the weights
if remote:
    assert any(e["cat"] == "message" and e["name"] == "RUN_STEP" for e in X), "no RUN_STEP message"
step = d["otherData"]["step_us"]
spans = sorted((max(0.0, e["ts"]), min(step, e["ts"] + e["dur"])) for e in X if e["cat"] != "wait")
busy, cs, ce, gaps = 0.0, 0.0, -1.0, []
for s, e in spans:
    if s > ce:
        busy += max(0.0, ce - cs)
        gaps.append((s - max(ce, 0.0), max(ce, 0.0)))
        cs, ce = s, e
    else:
        ce = max(ce, e)
busy += max(0.0, ce - cs)
gaps.append((step - ce, ce))
gaps.sort(reverse=True)
assert busy + gaps[0][0] >= 0.9 * step, "the events cover %.1f of %.1f us; the largest gaps (us, at us): %s" % (
    busy, step, gaps[:4])
for task, off, unc in re.findall(r"(/job:\w+/replica:0/task:\d+) offset ([-+0-9.]+) us \+- ([0-9.]+) us", d["otherData"]["clocks"]):
    assert abs(float(off)) <= float(unc) + 0.5, "%s: offset %s +- %s misses the true 0" % (task, off, unc)
print("%s: step %.0f us, events cover %.0f us (%.0f%%; largest gap %.0f us), %d events; clocks: %s" % (
      path, step, busy, 100 * busy / step, gaps[0][0], len(X), d["otherData"]["clocks"]))
PY
}
# In-process masters (each worker program's own). The workers are asynchronous: on a loaded
# host one may run most of the 600 global steps (the chief ran 90 of its own once), so each
# traces its 30th run.
"$BIN/dg-launch" --ps 1 --workers 2 --timeout 300 -- "$BIN/mnist_replica" --train_steps 600 --trace_step 30 \
    --quiet --log_every 100000 > train.log 2>&1 || { cat train.log; fail "training with --trace_step"; }
for i in 0 1; do
    grep -q "wrote the timeline of run 30 .* to timeline_worker${i}_step30.json" train.log || { cat train.log; fail "worker $i wrote no timeline"; }
    check "timeline_worker${i}_step30.json" "$i" 0
done
# Standing servers: each worker program's session is remote, its master in the dg-server.
# As dg-launch does, the host's cores are shared among the three tasks: tasks that each split
# their ops over every core preempt one another's executors for hundreds of microseconds, gaps
# the coverage check would count against the trace.
export DG_INTRA_OP_THREADS=1
read -r P0 P1 P2 <<< "$(free_ports 3)"
SPEC="ps|127.0.0.1:$P0;worker|127.0.0.1:$P1,127.0.0.1:$P2"
start_servers "$SPEC" ps:0 worker:0 worker:1
mkdir standing
for i in 0 1; do
    (cd standing && exec "$BIN/mnist_replica" --job_name worker --task_index $i --ps_hosts "127.0.0.1:$P0" \
        --worker_hosts "127.0.0.1:$P1,127.0.0.1:$P2" --existing_servers --train_steps 600 --trace_step 30 \
        --log_every 100000) > "w$i" 2>&1 &
    W[$i]=$!
    PIDS+=(${W[$i]})
done
for i in 0 1; do wait "${W[$i]}" || { cat "w$i"; fail "worker program $i failed"; }; done
for i in 0 1; do check "standing/timeline_worker${i}_step30.json" "$i" 1; done
# A trace file that cannot be written: a warning, and training reaches its last step.
"$BIN/dg-launch" --ps 1 --workers 1 --timeout 120 -- "$BIN/mnist_replica" --train_steps 200 --trace_step 10 \
    --trace_file no/such/dir/t.json --quiet --log_every 100000 > bad.log 2>&1 || { cat bad.log; fail "a bad trace file stopped training"; }
grep -q "trace hook: step trace: cannot write no/such/dir/t.json: No such file or directory; training goes on" bad.log ||
    { cat bad.log; fail "no warning naming the trace file"; }
grep -q "After 20[0-9] training step(s)" bad.log || { cat bad.log; fail "training did not reach its last step"; }
echo "PASS step_timeline"
