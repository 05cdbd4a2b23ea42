#!/usr/bin/env bash
# mirrored trains the MNIST-replica model with data parallelism inside one process: 2000 steps
# under the mirrored strategy on 2 virtual CPUs and under central storage on 4, each must reach
# test accuracy >= 0.84 (mlp_local's model and budget); the mirrored copies must be identical
# (compared here from the hashes of each copy's parameters that the program prints). Also
# checks the output format and that bad flags are rejected clearly.
set -euo pipefail
bin="${DG_BIN_DIR:?}/mirrored"

run() {   # run <expected strategy line> <flags...>
    local want="$1"
    shift
    local out acc
    out=$("$bin" --train_steps 2000 --log_every 1000 "$@")
    echo "$out"
    grep -q "^data: 60000 training and 10000 test images" <<<"$out" || { echo "no data line"; exit 1; }
    grep -q "^$want" <<<"$out" || { echo "no line \"$want\""; exit 1; }
    grep -Eq "^step 1000/2000: loss [0-9.]+ \([0-9]+ steps/s\)$" <<<"$out" || { echo "no progress line"; exit 1; }
    grep -Eq "^step 2000/2000: loss [0-9.]+ " <<<"$out" || { echo "no final step line"; exit 1; }
    grep -Eq "^trained 2000 steps in [0-9.]+ s" <<<"$out" || { echo "no timing line"; exit 1; }
    acc=$(sed -n 's/^test accuracy \([0-9.]*\), test cross entropy [0-9.]* (10000 images)$/\1/p' <<<"$out")
    [ -n "$acc" ] || { echo "no accuracy line"; exit 1; }
    [[ "$acc" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "accuracy \"$acc\" is not a number"; exit 1; }
    awk -v a="$acc" 'BEGIN { exit !(a >= 0.84) }' || { echo "accuracy $acc < 0.84"; exit 1; }
    last_out="$out"
    echo "mirrored smoke ($*): accuracy $acc"
}

run "strategy: mirrored over 2 devices: /device:CPU:0 /device:CPU:1 (variables on every device, reduction on /device:CPU:0)"
# The copies compared here, from the hash of each copy's parameters the program prints (its own
# "copies identical" line is not taken as the result).
hashes=$(sed -n 's/^mirrored copy [0-9]*: parameters fnv1a \([0-9a-f]\{16\}\)$/\1/p' <<<"$last_out")
[ "$(wc -l <<<"$hashes")" -eq 2 ] && [ -n "$hashes" ] || { echo "expected the parameter hashes of 2 copies, got: $hashes"; exit 1; }
[ "$(sort -u <<<"$hashes" | wc -l)" -eq 1 ] || { echo "the mirrored copies differ: $hashes"; exit 1; }
run "strategy: central_storage over 4 devices: /device:CPU:0 /device:CPU:1 /device:CPU:2 /device:CPU:3 (variables /device:CPU:0" \
    --strategy central_storage --num_devices 4 --threads 2
grep -q "copies identical\|^mirrored copy" <<<"$last_out" && { echo "central storage has no copies to compare"; exit 1; }

expect_usage_error() {   # expect_usage_error <message part> <flags...>
    local want="$1" err rc
    shift
    set +e
    err=$("$bin" "$@" 2>&1)
    rc=$?
    set -e
    echo "$err"
    [ "$rc" -eq 2 ] || { echo "expected exit 2 for $*, got $rc"; exit 1; }
    grep -q -- "$want" <<<"$err" || { echo "error for $* does not say \"$want\""; exit 1; }
}
expect_usage_error "does not split evenly across 3 devices" --num_devices 3 --batch_size 100
expect_usage_error "mirrored or central_storage, got \"sync\"" --strategy sync
expect_usage_error "--num_devices in 1..64" --num_devices 0
echo "mirrored smoke: ok"
