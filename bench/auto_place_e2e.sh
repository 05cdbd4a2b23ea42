#!/usr/bin/env bash
# auto_place_e2e: the automatic placer end to end and against reality. Each model of
# examples/auto_place_train (a transformer, an Inception-like CNN, a GNMT-like LSTM; small
# sizes) trains on two tasks (processes on 127.0.0.1, one per core), then on two CPUs of one
# process (--local; WHERE="tasks local" by default), with no device scope and automatic
# placement, and with an expert's manual split (its layers in two halves, gradients beside
# their ops), ROUNDS times each (default 3) of STEPS steps (default 30), alternately.
# First dg-inspect calibrate measures this machine, and each run profiles its model on one CPU
# (auto_place_train --profile): the placer and the predictions use both.
# JSON lines: per model and placement, the median of the runs' median step (ms), the placer's
# prediction for that placement (ms) and its error; per model the speed of auto over manual.
#   ROUNDS=3 STEPS=30 MODELS="transformer inception gnmt" WHERE="tasks local" bench/auto_place_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-30}
MODELS=${MODELS:-transformer inception gnmt}
BIN=${DG_BIN_DIR:-build/bin}
source bench/lib.bash
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
# One thread an op, as dg-launch gives each of the two tasks on two cores.
DG_INTRA_OP_THREADS=1 "$BIN/dg-inspect" calibrate -o "$TMP/cost.json" > "$TMP/calibrate.out" 2>&1 \
    || { cat "$TMP/calibrate.out" >&2; exit 1; }
echo "{\"bench\": \"auto_place_e2e\", \"cpu\": \"$cpu\", \"calibration\": $(cat "$TMP/cost.json")}"
# where: tasks (two processes under dg-launch) or local (two CPUs of one process, --local).
run() {   # run WHERE MODEL PLACEMENT > output
    if [ "$1" = tasks ]; then
        "$BIN/dg-launch" --ps 1 --workers 1 --timeout 600 -- "$BIN/auto_place_train" --model "$2" --placement "$3" \
            --train_steps "$STEPS" --quiet --cost "$TMP/cost.json"
    else
        DG_INTRA_OP_THREADS=1 "$BIN/auto_place_train" --local --model "$2" --placement "$3" --train_steps "$STEPS" \
            --cost "$TMP/cost.json"
    fi
}
for where in ${WHERE:-tasks local}; do
    for model in $MODELS; do
        key="$where.$model"
        for placement in manual auto; do : > "$TMP/$key.$placement"; : > "$TMP/$key.$placement.pred"; done
        for _ in $(seq "$ROUNDS"); do
            for placement in manual auto; do
                run "$where" "$model" "$placement" > "$TMP/out" 2>&1 || { cat "$TMP/out" >&2; exit 1; }
                sed -n 's/.*step: median \([0-9.]*\) ms.*/\1/p' "$TMP/out" >> "$TMP/$key.$placement"
                sed -n 's/.*step: median .*predicted \([0-9.]*\) ms.*/\1/p' "$TMP/out" >> "$TMP/$key.$placement.pred"
                sed -n 's/.*ops: \([0-9]*\) on the [A-Za-z ]*, \([0-9]*\) on the .*/\1 \2/p' "$TMP/out" > "$TMP/$key.$placement.ops"
            done
        done
        for placement in manual auto; do
            m=$(median < "$TMP/$key.$placement")
            p=$(median < "$TMP/$key.$placement.pred")
            read -r a b < "$TMP/$key.$placement.ops"
            err=$(awk -v m="$m" -v p="$p" 'BEGIN { printf "%.3f", (p - m) / m }')
            echo "{\"bench\": \"auto_place_e2e\", \"where\": \"$where\", \"model\": \"$model\", \"placement\": \"$placement\", \"step_ms\": $m, \"predicted_ms\": $p, \"prediction_error\": $err, \"ops_on_first\": $a, \"ops_on_second\": $b, \"rounds\": $ROUNDS, \"steps\": $STEPS}"
        done
        ratio=$(awk -v a="$(median < "$TMP/$key.manual")" -v b="$(median < "$TMP/$key.auto")" 'BEGIN { printf "%.3f", a / b }')
        echo "{\"bench\": \"auto_place_e2e\", \"where\": \"$where\", \"model\": \"$model\", \"metric\": \"speed_auto_over_manual\", \"value\": $ratio}"
    done
done
