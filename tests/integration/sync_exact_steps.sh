#!/usr/bin/env bash
# 1 ps + 4 workers training synchronously (--sync_replicas) for 1000 steps through dg-launch:
# the chief stops applying at the last step, so every worker ends at global step exactly 1000.
source "$(dirname "$0")/common.bash"
"$BIN/dg-launch" --ps 1 --workers 4 --timeout 240 -- "$BIN/mnist_replica" --sync_replicas --train_steps 1000 \
    --quiet --log_every 250 > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "dg-launch exited non-zero"; }
grep -E "After|accuracy|elapsed" "$TMP/out"
for w in 0 1 2 3; do
    step=$(sed -n "s/^\[worker$w\] After \([0-9]*\) training step(s).*/\1/p" "$TMP/out")
    echo "worker $w ends at global step ${step:-?}"
    [ "$step" = 1000 ] || fail "worker $w ended at global step '${step}', not exactly 1000"
done
echo "PASS sync_exact_steps"
