#!/usr/bin/env bash
# mlp_local with --device /gpu:0 trains the MNIST-replica model for a short run. With a GPU its
# test accuracy must be within 0.01 of the same run on /cpu:0 (same flags and seed). Without
# one, soft placement puts the model on CPU: it must still train (accuracy >= 0.75) and match
# the /cpu:0 run exactly; then the script exits 77 (skipped). Whether a GPU is usable comes
# from gpu_bench --probe (0 when built without CUDA or without a driver or device).
set -euo pipefail
bin="${DG_BIN_DIR:?}"
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$bin/mlp_local" ] || fail "no mlp_local in $bin"
[ -x "$bin/gpu_bench" ] || fail "no gpu_bench in $bin (it probes for a GPU)"
probe=$("$bin/gpu_bench" --probe) || fail "gpu_bench --probe exited $?"
echo "$probe"
gpus=$(echo "$probe" | sed -n 's/.*"gpus": \([0-9][0-9]*\).*/\1/p')
[ -n "$gpus" ] || fail "gpu_bench --probe printed no GPU count"

flags=(--train_steps 300 --batch_size 100 --log_every 100 --seed 1)
accuracy() { echo "$1" | sed -n 's/^test accuracy \([0-9.]*\),.*/\1/p'; }
run() {   # run <device>: prints the output, fails on a non-zero exit
    local out rc=0
    out=$("$bin/mlp_local" "${flags[@]}" --device "$1" 2>&1) || rc=$?
    echo "$out" >&2
    [ "$rc" = 0 ] || fail "mlp_local --device $1 exited $rc"
    echo "$out"
}

gpu_out=$(run /gpu:0)
gpu_acc=$(accuracy "$gpu_out")
[ -n "$gpu_acc" ] || fail "no accuracy line from the /gpu:0 run"
cpu_out=$(run /cpu:0)
cpu_acc=$(accuracy "$cpu_out")
[ -n "$cpu_acc" ] || fail "no accuracy line from the /cpu:0 run"
awk -v a="$gpu_acc" 'BEGIN { exit !(a >= 0.75) }' || fail "/gpu:0 run: accuracy $gpu_acc < 0.75 after 300 steps"

if [ "$gpus" = 0 ]; then
    # Soft placement ran the /gpu:0 request on CPU:0: the same computation as the CPU run.
    [ "$gpu_acc" = "$cpu_acc" ] || fail "without a GPU, /gpu:0 (soft placement) gave accuracy $gpu_acc, /cpu:0 gave $cpu_acc"
    echo "mlp_gpu smoke: no GPU; /gpu:0 trained on CPU under soft placement, accuracy $gpu_acc"
    exit 77
fi
awk -v a="$gpu_acc" -v b="$cpu_acc" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.01) }' \
    || fail "accuracy on /gpu:0 is $gpu_acc, on /cpu:0 $cpu_acc: more than 0.01 apart"
echo "mlp_gpu smoke: accuracy $gpu_acc on /gpu:0, $cpu_acc on /cpu:0 ($gpus GPU(s))"
