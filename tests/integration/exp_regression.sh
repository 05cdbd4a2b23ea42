#!/usr/bin/env bash
# exp_regression in real processes: 2 workers started by dg-launch train y = e^x data parallel
# (gradients averaged by all-reduce over ZeroMQ) in step with the single-process model on the
# whole batches: the loss curves and the parameters agree to 1e-9, and the loss falls.
source "$(dirname "$0")/common.bash"
for opt in adam sgd; do
    lr=0.02
    [ "$opt" = sgd ] && lr=0.1
    "$BIN/dg-launch" --workers 2 --timeout 120 -- "$BIN/exp_regression" --optimizer "$opt" --learning_rate "$lr" \
        --train_steps 200 --log_every 50 --timeout_ms 20000 --quiet > "$TMP/$opt" 2>&1 ||
        { cat "$TMP/$opt"; fail "exp_regression --optimizer $opt failed"; }
    grep -E "step|loss|difference|match" "$TMP/$opt" | tail -6
    grep -q "\[worker0\] curves match: yes" "$TMP/$opt" || { cat "$TMP/$opt"; fail "$opt: curves differ"; }
    grep -q "\[worker1\] worker 1: 200 steps" "$TMP/$opt" || fail "$opt: worker 1 did not finish"
    first=$(sed -n 's/.*loss: first \([0-9.e+-]*\), last.*/\1/p' "$TMP/$opt")
    last=$(sed -n 's/.*loss: first [0-9.e+-]*, last \([0-9.e+-]*\).*/\1/p' "$TMP/$opt")
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(f > 0 && l < f / 10) }' ||
        fail "$opt: the loss did not fall tenfold ($first -> $last)"
done
echo "PASS exp_regression"
