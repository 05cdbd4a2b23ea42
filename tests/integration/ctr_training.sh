#!/usr/bin/env bash
# ctr_replica with its default flags (a 10^6 x 16 embedding table sharded over the ps tasks,
# Adagrad's sparse updates), 2 ps + 2 workers, asynchronous. The chief writes each test
# example's label with the model's and the generating model's probabilities; this test computes
# the log loss and AUC of both itself (Python) and asserts the model's loss within 2% of the
# generating model's or its AUC within 0.01, and a finite loss. Each worker's traced step must
# send at most 2x the bytes of the rows its batch touched in each direction (the table is 64 MB:
# a dense step would send it all).
source "$(dirname "$0")/common.bash"
cd "$TMP"
"$BIN/dg-launch" --ps 2 --workers 2 --timeout 500 -- "$BIN/ctr_replica" --quiet --log_every 5000 \
    --predictions preds.txt --report_bytes_step 100 > train.log 2>&1 || { cat train.log; fail "dg-launch exited non-zero"; }
grep -E "table|Test loss|steps/s|ctr_bytes" train.log
[ "$(grep -c '"bench": "ctr_bytes"' train.log)" -eq 2 ] || fail "not both workers reported their bytes"
grep '"bench": "ctr_bytes"' train.log | sed 's/^\[worker[0-9]*\] //' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    rows = r["rows_touched"] * r["row_bytes"]
    for k in ("worker_to_ps_bytes", "ps_to_worker_bytes"):
        if not (0 < r[k] <= 2 * rows):
            sys.exit("worker %d: %s = %d, rows touched x row size = %d" % (r["worker"], k, r[k], rows))
' || fail "bytes per step"
[ -s preds.txt ] || fail "no predictions written"
python3 - preds.txt <<'PY' || fail "test loss / AUC"
import math, sys
rows = [tuple(map(float, l.split())) for l in open(sys.argv[1])]
def logloss(i):
    s = 0.0
    for r in rows:
        p = min(max(r[i], 1e-12), 1 - 1e-12)
        s -= math.log(p) if r[0] > 0.5 else math.log(1 - p)
    return s / len(rows)
def auc(i):   # Mann-Whitney: pairs a positive wins, ties half
    order = sorted(rows, key=lambda r: r[i])
    rank, pos, k = 0.0, 0, 0
    while k < len(order):
        j = k
        while j < len(order) and order[j][i] == order[k][i]:
            j += 1
        for r in order[k:j]:
            if r[0] > 0.5:
                pos += 1
                rank += (k + j + 1) / 2
        k = j
    neg = len(order) - pos
    return (rank - pos * (pos + 1) / 2) / (pos * neg)
lm, lt, am, at = logloss(1), logloss(2), auc(1), auc(2)
print("examples %d: model loss %.5f, generating model %.5f (ratio %.4f); AUC %.5f vs %.5f (gap %.5f)"
      % (len(rows), lm, lt, lm / lt, am, at, at - am))
if not (math.isfinite(lm) and lm > 0):
    sys.exit("the model's loss is not finite")
if not (lm <= 1.02 * lt or at - am <= 0.01):
    sys.exit("neither the loss within 2% nor the AUC within 0.01 of the generating model")
PY
echo "PASS ctr_training"
