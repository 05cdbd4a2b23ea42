#!/usr/bin/env bash
# 1 ps + 2 workers, asynchronous training of the MNIST-replica model through dg-launch: each
# worker, on its own lines, must end at a global step in 3000..3099 with a finite validation
# cross entropy and test accuracy >= 0.82.
# Learning rate 0.005: with the default 0.01, stale asynchronous Adam updates leave the final
# accuracy anywhere in 0.81-0.85 (11 runs of 2000-3000 steps), so a single end point flakes.
# 3000 steps, not 2000: at 0.005, 15 runs of 2000 steps on a loaded 2-core machine ended at
# 0.8269-0.8677 (two of them under 0.84; a CI run once at 0.8227), too close to the bar of 0.82;
# 15 runs of 3000 steps ended at 0.8511-0.8711 (mean 0.862), 0.03 over the bar. Chance is 0.10;
# 30 steps reach about 0.70.
source "$(dirname "$0")/common.bash"
STEPS=3000
"$BIN/dg-launch" --ps 1 --workers 2 --timeout 300 -- "$BIN/mnist_replica" --train_steps $STEPS --learning_rate 0.005 --quiet \
    > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "dg-launch exited non-zero"; }
grep -E "accuracy|cross entropy|elapsed" "$TMP/out"
for w in 0 1; do check_replica_worker "$TMP/out" $w $STEPS 0.82; done
echo "PASS ps_async_training"
