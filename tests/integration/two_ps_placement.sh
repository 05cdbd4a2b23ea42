#!/usr/bin/env bash
# 2 ps tasks + 1 worker: the replica device setter spreads the variables over both ps tasks,
# and the worker fetches each variable's value from the ps that holds it.
source "$(dirname "$0")/common.bash"
"$BIN/dg-launch" --ps 2 --workers 1 --timeout 120 -- "$BIN/mnist_replica" --train_steps 100 --print_placement \
    --quiet > "$TMP/out" 2>&1 || { cat "$TMP/out"; fail "dg-launch exited non-zero"; }
grep "variable" "$TMP/out"
grep -q "variable hid_w on /job:ps/replica:0/task:0/device:CPU:0, 78400 values" "$TMP/out" || fail "hid_w not on ps 0"
grep -q "variable hid_b on /job:ps/replica:0/task:1/device:CPU:0, 100 values" "$TMP/out" || fail "hid_b not on ps 1"
grep -q "variable sm_w on /job:ps/replica:0/task:0/device:CPU:0" "$TMP/out" || fail "sm_w not on ps 0"
grep -q "variable sm_b on /job:ps/replica:0/task:1/device:CPU:0" "$TMP/out" || fail "sm_b not on ps 1"
# hid_w was initialized from a truncated normal: its fetched sum is a finite number, not zero.
sum=$(sed -n 's/.*variable hid_w .* summing to \([^ ]*\)$/\1/p' "$TMP/out")
check_number "the fetched sum of hid_w" "$sum"
awk -v s="$sum" 'BEGIN { exit !(s + 0 != 0) }' || fail "hid_w fetched as zeros"
echo "PASS two_ps_placement"
