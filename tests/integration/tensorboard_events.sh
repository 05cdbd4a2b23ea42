#!/usr/bin/env bash
# TensorBoard event files from a training run, read back with TensorBoard's own loader:
# mnist_replica (1 ps + 2 workers) with --logdir; the chief's event file holds the file version,
# the placed graph (nodes on /job:ps and /job:worker devices), the loss and a histogram of the
# first layer's weights every 100 steps, as
# the tensorboard package (PyPI, in a virtual environment of its own, made once and kept in
# DG_TB_VENV or ~/.cache/distgraph/tb-venv) reads them. Then bad input: a log directory that is
# a file fails the start naming it; a file size limit standing in for a full disk costs the run
# one warning and no steps; a damaged file read back is DATA_LOSS naming the record. Without the
# tensorboard package and no way to install it the test reports itself skipped.
source "$(dirname "$0")/common.bash"
VENV=${DG_TB_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/distgraph/tb-venv}
if ! "$VENV/bin/python" -c "import tensorboard" 2>/dev/null; then
    echo "making $VENV with the tensorboard package"
    { python3 -m venv "$VENV" && timeout 300 "$VENV/bin/pip" install -q tensorboard; } > "$TMP/pip.log" 2>&1 || {
        tail -5 "$TMP/pip.log"
        echo "SKIP: no tensorboard package (pip could not install it into $VENV)"
        exit 77
    }
fi
cd "$TMP"
"$BIN/dg-launch" --ps 1 --workers 2 --timeout 300 -- "$BIN/mnist_replica" --train_steps 500 --logdir logs --quiet \
    --log_every 100000 > train.log 2>&1 || { cat train.log; fail "training with --logdir"; }
files=(logs/events.out.tfevents.*)
[ "${#files[@]}" -eq 1 ] && [ -s "${files[0]}" ] || fail "want one event file in logs/, got: ${files[*]}"
"$VENV/bin/python" - "${files[0]}" <<'PY' || fail "TensorBoard's loader disagrees (above)"
import math, sys
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import graph_pb2
version, graphs, loss, hist = None, [], [], []
for ev in event_file_loader.LegacyEventFileLoader(sys.argv[1]).Load():
    what = ev.WhichOneof("what")
    if what == "file_version":
        version = ev.file_version
    elif what == "graph_def":
        g = graph_pb2.GraphDef()
        g.ParseFromString(ev.graph_def)
        graphs.append(g)
    elif what == "summary":
        loss += [(ev.step, v.simple_value) for v in ev.summary.value if v.tag == "loss"]
        hist += [(ev.step, v.histo) for v in ev.summary.value if v.HasField("histo")]
assert version == "brain.Event:2", version
assert len(graphs) == 1, "graphs: %d" % len(graphs)
names = {n.name: n for n in graphs[0].node}
devices = {n.device.split("/device:")[0] for n in graphs[0].node if "/device:" in n.device}
assert {"/job:ps/replica:0/task:0", "/job:worker/replica:0/task:0"} <= devices, devices
for n in graphs[0].node:   # every input names a node of the graph
    for i in n.input:
        assert i.lstrip("^").split(":")[0] in names, (n.name, i)
steps = [s for s, _ in loss]
assert len(loss) >= 4 and steps == sorted(steps) and steps[0] <= 1, steps
assert all(math.isfinite(v) for _, v in loss), loss
assert loss[-1][1] < loss[0][1] / 2, loss   # it learned
# The first layer's weights, 784 x 100, as histograms: every value counted in a bucket.
assert len(hist) == len(loss), (len(hist), len(loss))
for step, h in hist:
    assert h.num == 78400 and sum(h.bucket) == 78400 and h.min < 0 < h.max, (step, h.num, sum(h.bucket))
    assert list(h.bucket_limit) == sorted(h.bucket_limit) and len(h.bucket) == len(h.bucket_limit)
print("tensorboard reads: %s, a graph of %d nodes on %s, %d histograms, loss %s" % (version, len(names), sorted(devices), len(hist),
      ", ".join("%d: %.3f" % sv for sv in loss)))
PY
# A damaged record is named by the reader.
cp "${files[0]}" bad
printf '\377' | dd of=bad bs=1 seek=60 conv=notrunc 2>/dev/null
"$BIN/dg-inspect" events bad > events.txt 2> err.txt && fail "a damaged file read clean"
grep -q "DATA_LOSS" err.txt && grep -q "at byte 40 is damaged" err.txt || { cat err.txt; fail "the damage is not named"; }
# A log directory that is a file: the chief fails at the start, naming it.
touch not_a_dir
"$BIN/dg-launch" --ps 1 --workers 1 --timeout 120 -- "$BIN/mnist_replica" --train_steps 50 --logdir not_a_dir/run \
    --quiet > bad.log 2>&1 && fail "training with an impossible --logdir ran"
grep -q 'log directory "not_a_dir/run"' bad.log || { cat bad.log; fail "the bad log directory is not named"; }
# A full disk (an 8 KiB file size limit; SIGXFSZ ignored, so writes fail with EFBIG): one
# warning, and training goes on to its last step.
( trap '' XFSZ; ulimit -f 8; exec "$BIN/dg-launch" --ps 1 --workers 1 --timeout 120 -- "$BIN/mnist_replica" \
    --train_steps 300 --logdir full --quiet --log_every 100000 ) > full.log 2>&1 || { cat full.log; fail "a full disk stopped training"; }
grep -q "TensorBoard hook: .*no more events are written, training goes on" full.log || { cat full.log; fail "no warning"; }
grep -q "After 30[0-9] training step(s)" full.log || { cat full.log; fail "training did not reach its last step"; }
echo "PASS tensorboard_events"
