#!/usr/bin/env bash
# 1 ps + 2 workers, asynchronous training of the MNIST-replica model through dg-launch:
# every worker must end with test accuracy >= 0.82 and the global step at --train_steps.
source "$(dirname "$0")/common.bash"
"$BIN/dg-launch" --ps 1 --workers 2 --timeout 300 -- "$BIN/mnist_replica" --train_steps 2000 --quiet \
    > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "dg-launch exited non-zero"; }
cat "$TMP/out" | grep -E "accuracy|cross entropy|elapsed"
for w in 0 1; do
    acc=$(sed -n "s/.*Worker $w: validation accuracy = \([0-9.]*\).*/\1/p" "$TMP/out")
    [ -n "$acc" ] || fail "worker $w printed no accuracy"
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.82) }' || fail "worker $w accuracy $acc < 0.82"
done
grep -q "After 20[0-9][0-9] training step(s)" "$TMP/out" || fail "global step did not reach 2000"
echo "PASS ps_async_training"
