#!/usr/bin/env bash
# model_parallel_bench: the step time of a model split over two tasks (examples/model_parallel,
# --mode layers and units) with each gradient computed beside its op
# (colocate_gradients_with_ops, the example's default) against every gradient computed on the
# worker (TensorFlow's default), taken alternately for ROUNDS rounds (default 3) of STEPS steps
# (default 300) on one machine in one run. JSON lines: per mode and setting, the median over
# rounds of the example's median step (ms), and the speed ratio worker/beside (above 1: the
# backward pass beside its ops is faster). The two tasks are processes on 127.0.0.1.
#   ROUNDS=3 bench/model_parallel_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-300}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
for mode in layers units; do
    : > "$TMP/$mode.true"
    : > "$TMP/$mode.false"
    for _ in $(seq "$ROUNDS"); do
        for colocate in true false; do
            "$BIN/dg-launch" --ps 1 --workers 1 --timeout 300 -- "$BIN/model_parallel" --mode "$mode" \
                --train_steps "$STEPS" --log_every 1000000 --quiet --colocate_gradients="$colocate" \
                > "$TMP/out" 2>&1 || { cat "$TMP/out" >&2; exit 1; }
            sed -n 's/.*split step: median \([0-9.]*\) ms.*/\1/p' "$TMP/out" >> "$TMP/$mode.$colocate"
        done
    done
    beside=$(median < "$TMP/$mode.true")
    worker=$(median < "$TMP/$mode.false")
    for pair in "beside:$beside" "worker:$worker"; do
        echo "{\"bench\": \"model_parallel_bench\", \"metric\": \"split_step_${mode}_gradients_${pair%%:*}\", \"value\": ${pair#*:}, \"unit\": \"ms\", \"rounds\": $ROUNDS, \"steps\": $STEPS, \"cpu\": \"$cpu\"}"
    done
    ratio=$(awk -v a="$worker" -v b="$beside" 'BEGIN { printf "%.3f", a / b }')
    echo "{\"bench\": \"model_parallel_bench\", \"metric\": \"split_step_${mode}_speed_beside_over_worker\", \"value\": $ratio, \"unit\": \"ratio\"}"
done
