#!/usr/bin/env bash
# exp_regression in real processes: 2 workers started by dg-launch train y = e^x data parallel
# (gradients averaged by all-reduce over ZeroMQ) in step with the single-process model on the
# whole batches: the loss curves and the parameters agree to 1e-9, and the loss falls tenfold.
# The chief exits 3 when they do not (dg-launch then fails); checked here again on the numbers
# it prints, not on its verdict line: the two curves row by row, the largest differences it
# reports, and the first and last loss, each first checked to be a finite number.
source "$(dirname "$0")/common.bash"
for opt in adam sgd; do
    lr=0.02
    [ "$opt" = sgd ] && lr=0.1
    "$BIN/dg-launch" --workers 2 --timeout 120 -- "$BIN/exp_regression" --optimizer "$opt" --learning_rate "$lr" \
        --train_steps 200 --log_every 50 --timeout_ms 20000 --quiet > "$TMP/$opt" 2>&1 ||
        { cat "$TMP/$opt"; fail "exp_regression --optimizer $opt failed"; }
    grep -E "step|loss|difference|match" "$TMP/$opt" | tail -6
    check_loss_table "$TMP/$opt" "$opt" 3 4 1e-9   # "[worker0] step distributed single"
    rel=$(sed -n 's/^\[worker0\] largest relative loss difference: //p' "$TMP/$opt")
    check_le "$opt: largest relative loss difference" "$rel" 1e-9
    par=$(sed -n 's/^\[worker0\] max parameter difference: //p' "$TMP/$opt")
    check_le "$opt: max parameter difference" "$par" 1e-9
    grep -q "\[worker1\] worker 1: 200 steps" "$TMP/$opt" || fail "$opt: worker 1 did not finish"
    first=$(sed -n 's/.*\] loss: first \([^,]*\), last.*/\1/p' "$TMP/$opt")
    last=$(sed -n 's/.*\] loss: first [^,]*, last \(.*\)$/\1/p' "$TMP/$opt")
    check_number "$opt: first loss" "$first"
    check_number "$opt: last loss" "$last"
    awk -v f="$first" -v l="$last" 'BEGIN { exit !(f + 0 > 0 && l + 0 < f / 10) }' ||
        fail "$opt: the loss did not fall tenfold ($first -> $last)"
done
echo "PASS exp_regression"
