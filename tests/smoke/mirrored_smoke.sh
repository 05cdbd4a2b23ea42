#!/usr/bin/env bash
# mirrored trains the MNIST-replica model with data parallelism inside one process: 2000 steps
# under the mirrored strategy on 2 virtual CPUs and under central storage on 4, each must reach
# test accuracy >= 0.84 (mlp_local's model and budget); the mirrored run must report its
# copies identical. Also checks the output format and that bad flags are rejected clearly.
set -euo pipefail
bin="${DG_BIN_DIR:?}/mirrored"

run() {   # run <expected strategy line> <flags...>
    local want="$1"
    shift
    local out acc
    out=$("$bin" --train_steps 2000 --log_every 1000 "$@")
    echo "$out"
    echo "$out" | grep -q "^data: 60000 training and 10000 test images" || { echo "no data line"; exit 1; }
    echo "$out" | grep -q "^$want" || { echo "no line \"$want\""; exit 1; }
    echo "$out" | grep -Eq "^step 1000/2000: loss [0-9.]+ \([0-9]+ steps/s\)$" || { echo "no progress line"; exit 1; }
    echo "$out" | grep -Eq "^step 2000/2000: loss [0-9.]+ " || { echo "no final step line"; exit 1; }
    echo "$out" | grep -Eq "^trained 2000 steps in [0-9.]+ s" || { echo "no timing line"; exit 1; }
    acc=$(echo "$out" | sed -n 's/^test accuracy \([0-9.]*\), test cross entropy [0-9.]* (10000 images)$/\1/p')
    [ -n "$acc" ] || { echo "no accuracy line"; exit 1; }
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.84) }' || { echo "accuracy $acc < 0.84"; exit 1; }
    last_out="$out"
    echo "mirrored smoke ($*): accuracy $acc"
}

run "strategy: mirrored over 2 devices: /device:CPU:0 /device:CPU:1 (variables on every device, reduction on /device:CPU:0)"
echo "$last_out" | grep -q "^mirrored copies identical: yes$" || { echo "copies not reported identical"; exit 1; }
run "strategy: central_storage over 4 devices: /device:CPU:0 /device:CPU:1 /device:CPU:2 /device:CPU:3 (variables /device:CPU:0" \
    --strategy central_storage --num_devices 4 --threads 2
echo "$last_out" | grep -q "copies identical" && { echo "central storage has no copies to compare"; exit 1; }

expect_usage_error() {   # expect_usage_error <message part> <flags...>
    local want="$1" err rc
    shift
    set +e
    err=$("$bin" "$@" 2>&1)
    rc=$?
    set -e
    echo "$err"
    [ "$rc" -eq 2 ] || { echo "expected exit 2 for $*, got $rc"; exit 1; }
    echo "$err" | grep -q -- "$want" || { echo "error for $* does not say \"$want\""; exit 1; }
}
expect_usage_error "does not split evenly across 3 devices" --num_devices 3 --batch_size 100
expect_usage_error "mirrored or central_storage, got \"sync\"" --strategy sync
expect_usage_error "--num_devices in 1..64" --num_devices 0
echo "mirrored smoke: ok"
