#!/usr/bin/env bash
# coordinator_compare: TensorFlow 2's parameter-server training with a cluster coordinator, 1 ps
# and 2 workers on this host, in distgraph (the ps_coordinator kind of distgraph/distribute.h:
# examples/strategies.c --strategy ps_coordinator under dg-launch --mode coordinator) and in
# TensorFlow (bench/peers/tf_ps_coordinator.py: ParameterServerStrategy and ClusterCoordinator,
# the same 784-100-10 MLP, Adam, batch 100), ROUNDS rounds (default 3) of STEPS steps (default
# 3000) each, alternately. JSON lines: each system's median steps/s (distgraph: the training
# loop's time; TensorFlow: from its first 100 steps done to the last, which leaves its start-up
# out), the test accuracy of the last round, and the ratio distgraph / TensorFlow.
# TensorFlow feeds each worker from a dataset on the worker; distgraph's coordinator sends each
# step's batch with the step.
#   TF_PYTHON=/path/to/venv/bin/python ROUNDS=3 bench/coordinator_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-3000}
LR=${LR:-0.01}
TF_PYTHON=${TF_PYTHON:-python3}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
"$TF_PYTHON" -c "import tensorflow" 2> /dev/null ||
    { echo "coordinator_compare: $TF_PYTHON has no tensorflow (TF_PYTHON names a venv's python with tensorflow-cpu)" >&2; exit 2; }
: > "$TMP/dg"
: > "$TMP/tf"
for round in $(seq "$ROUNDS"); do
    "$BIN/dg-launch" --ps 1 --workers 2 --mode coordinator --timeout 600 -- "$BIN/strategies" \
        --strategy ps_coordinator --train_steps "$STEPS" --learning_rate "$LR" --log_every 1000000 --quiet \
        > "$TMP/dg.out" 2>&1 || { cat "$TMP/dg.out" >&2; exit 1; }
    line=$(grep "^\[client0\] coordinator: $STEPS local steps in" "$TMP/dg.out")
    secs=$(sed -n 's/.* local steps in \([0-9.]*\) s.*/\1/p' <<< "$line")
    dg_acc=$(sed -n 's/.* test accuracy \([0-9.]*\),.*/\1/p' <<< "$line")
    awk -v n="$STEPS" -v s="$secs" 'BEGIN { printf "%.1f\n", n / s }' >> "$TMP/dg"
    read -r P0 P1 P2 P3 <<< "$(ports 4)"
    cluster="{\"ps\": [\"127.0.0.1:$P0\"], \"worker\": [\"127.0.0.1:$P1\", \"127.0.0.1:$P2\"], \"chief\": [\"127.0.0.1:$P3\"]}"
    peer=bench/peers/tf_ps_coordinator.py
    "$TF_PYTHON" "$peer" --role ps --index 0 --cluster "$cluster" > "$TMP/tf_ps" 2>&1 & PIDS+=($!)
    for w in 0 1; do "$TF_PYTHON" "$peer" --role worker --index $w --cluster "$cluster" > "$TMP/tf_w$w" 2>&1 & PIDS+=($!); done
    timeout 900 "$TF_PYTHON" "$peer" --role chief --cluster "$cluster" --steps "$STEPS" --lr "$LR" > "$TMP/tf.out" 2>&1 ||
        { cat "$TMP/tf.out" >&2; exit 1; }
    for p in "${PIDS[@]}"; do kill -9 "$p" 2> /dev/null || true; done
    PIDS=()
    awk -v n="$STEPS" '/: step [0-9]+$/ { t[++k] = $1; s[k] = $3 }
        END { printf "%.1f\n", (s[k] - s[1]) / (t[k] - t[1]) }' "$TMP/tf.out" >> "$TMP/tf"
    tf_acc=$(sed -n 's/^DONE accuracy=//p' "$TMP/tf.out")
    echo "round $round: distgraph $(tail -1 "$TMP/dg") steps/s (accuracy $dg_acc), TensorFlow $(tail -1 "$TMP/tf") steps/s (accuracy $tf_acc)" >&2
done
dg=$(median < "$TMP/dg")
tf=$(median < "$TMP/tf")
common="\"rounds\": $ROUNDS, \"steps\": $STEPS, \"workers\": 2, \"ps\": 1, \"cpu\": \"$cpu\""
echo "{\"bench\": \"coordinator_compare\", \"system\": \"distgraph\", \"metric\": \"steps_per_s\", \"value\": $dg, \"accuracy\": $dg_acc, $common}"
echo "{\"bench\": \"coordinator_compare\", \"system\": \"tensorflow\", \"metric\": \"steps_per_s\", \"value\": $tf, \"accuracy\": $tf_acc, $common}"
echo "{\"bench\": \"coordinator_compare\", \"metric\": \"distgraph_over_tensorflow\", \"value\": $(awk -v a="$dg" -v b="$tf" 'BEGIN { printf "%.2f", a / b }'), \"unit\": \"ratio\"}"
