#!/usr/bin/env bash
# cnn_replica with its default flags, 1 ps + 2 workers (asynchronous): every worker's test
# accuracy >= 0.89 with a finite loss, and the global step at the default 4000. Then a short run
# of 1 ps + 1 worker (nothing changes the variables between the chief's evaluation and its last
# checkpoint) writes its graph and checkpoints: examples/inference.c, in a fresh process, loads
# the graph, restores the newest checkpoint, feeds the dropout switch false and gets the
# accuracy the training run printed, to the last digit.
source "$(dirname "$0")/common.bash"
cd "$TMP"
"$BIN/dg-launch" --ps 1 --workers 2 --timeout 500 -- "$BIN/cnn_replica" --quiet --log_every 1000 \
    > train.log 2>&1 || { cat train.log; fail "dg-launch exited non-zero"; }
grep -E "accuracy|cross entropy|elapsed" train.log
# Each worker on its own lines: global step 4000..4099, a finite loss, accuracy >= 0.89.
for w in 0 1; do check_replica_worker train.log $w 4000 0.89; done

"$BIN/dg-launch" --ps 1 --workers 1 --no_auth -- "$BIN/cnn_replica" --train_steps 300 --checkpoint_path ckpt.db \
    --save_graph cnn.dgraph --quiet --log_every 100000 > short.log 2>&1 || { cat short.log; fail "short training"; }
want=$(sed -n 's/.*validation accuracy = \([^ ]*\) .*/\1/p' short.log | tail -1)
is_number "$want" || { cat short.log; fail "the short run printed no accuracy (\"$want\")"; }
out=$("$BIN/inference" --graph cnn.dgraph --checkpoint ckpt.db) || { echo "$out"; fail "inference"; }
echo "$out"
got=$(echo "$out" | sed -n 's/.*test accuracy = \([^ ,]*\).*/\1/p')
[ "$got" = "$want" ] || fail "inference says accuracy $got, the training run $want"
echo "PASS cnn_training (accuracy >= 0.89; inference $got, as trained)"
