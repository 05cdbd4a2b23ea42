#!/usr/bin/env bash
# Inference from a saved graph and a checkpoint: MNIST-replica (1 ps + 1 worker, so nothing
# changes the variables between the chief's evaluation and its last checkpoint) trains and
# writes its graph (--save_graph) and checkpoints; examples/inference.c loads the graph in a
# fresh process, forgets its devices, restores the newest checkpoint and evaluates the test
# images: the same accuracy as the training run printed, to the last digit it prints.
source "$(dirname "$0")/common.bash"
cd "$TMP"
"$BIN/dg-launch" --ps 1 --workers 1 --no_auth -- "$BIN/mnist_replica" --train_steps 600 --checkpoint_path ckpt.db \
    --save_graph mnist.dgraph --quiet --log_every 100000 > train.log 2>&1 || { cat train.log; fail "training"; }
want=$(sed -n 's/.*validation accuracy = \([^ ]*\) .*/\1/p' train.log | tail -1)
is_number "$want" || { cat train.log; fail "the training run printed no accuracy (\"$want\")"; }
out=$("$BIN/inference" --graph mnist.dgraph --checkpoint ckpt.db) || { echo "$out"; fail "inference"; }
echo "$out"
got=$(echo "$out" | sed -n 's/.*test accuracy = \([^ ,]*\).*/\1/p')
[ "$got" = "$want" ] || fail "inference says accuracy $got, the training run $want"
grep -q "restored global step 60[0-9]" <<<"$out" || fail "not the newest checkpoint"
# Bad input names what is wrong.
rc=0
"$BIN/inference" --graph missing.dgraph --checkpoint ckpt.db > err.log 2>&1 || rc=$?
[ "$rc" -eq 1 ] && grep -q "NOT_FOUND" err.log || { cat err.log; fail "a missing graph file"; }
"$BIN/inference" --graph mnist.dgraph --checkpoint ckpt.db --accuracy nothing:0 > err.log 2>&1 && fail "a missing tensor ran"
grep -q 'no node named "nothing"' err.log || { cat err.log; fail "a missing tensor is not named"; }
echo "PASS inference (accuracy $got, as trained)"
