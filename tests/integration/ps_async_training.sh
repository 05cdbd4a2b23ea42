#!/usr/bin/env bash
# 1 ps + 2 workers, asynchronous training of the MNIST-replica model through dg-launch:
# every worker must end with test accuracy >= 0.82 and the global step at --train_steps.
# Learning rate 0.005: with the default 0.01, stale asynchronous Adam updates leave the final
# accuracy anywhere in 0.81-0.85 (11 runs of 2000-3000 steps), so a single end point flakes;
# at 0.005 eight runs gave 0.83-0.86.
source "$(dirname "$0")/common.bash"
"$BIN/dg-launch" --ps 1 --workers 2 --timeout 300 -- "$BIN/mnist_replica" --train_steps 2000 --learning_rate 0.005 --quiet \
    > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "dg-launch exited non-zero"; }
cat "$TMP/out" | grep -E "accuracy|cross entropy|elapsed"
for w in 0 1; do
    acc=$(sed -n "s/.*Worker $w: validation accuracy = \([0-9.]*\).*/\1/p" "$TMP/out")
    [ -n "$acc" ] || fail "worker $w printed no accuracy"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.82) }' || fail "worker $w accuracy $acc < 0.82"
done
grep -q "After 20[0-9][0-9] training step(s)" "$TMP/out" || fail "global step did not reach 2000"
echo "PASS ps_async_training"
