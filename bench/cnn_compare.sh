#!/usr/bin/env bash
# The CNN training step of cnn_replica (batch 100, one thread, a fixed batch, dropout on, the
# decaying Adam) in distgraph (step_bench --model cnn), PyTorch (bench/peers/torch_cnn.py) and
# TensorFlow 1 graph mode (bench/peers/tf_cnn.py), back to back, REPS rounds (default 3); prints
# each one's median step as JSON lines and distgraph's ratio to each (> 1: distgraph faster):
# the ratio of the medians, and the median of each round's ratio (distgraph_speedup_paired).
# Needs Debian's python3-torch and a TensorFlow virtualenv in TF_PYTHON (../shared/peers/README.md);
# a peer that is missing is reported skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.bash
REPS=${REPS:-3}
TF_PYTHON=${TF_PYTHON:-python3}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
ours=() torch=() tf=()
field() { sed -n "s/.*\"$1\": \([0-9.]*\).*/\1/p" | head -1; }
for i in $(seq "$REPS"); do
    ours+=("$(build/bin/step_bench --model cnn --steps 200 --warmup 20 | grep median_step | field value)")
    torch+=("$(/usr/bin/python3 bench/peers/torch_cnn.py --step-bench --bench-steps 200 2>/dev/null | field median_ms)")
    tf+=("$("$TF_PYTHON" bench/peers/tf_cnn.py --step-bench --bench-steps 200 2>/dev/null | field median_ms)")
done
med() { printf '%s\n' "$@" | grep . | median; }
o=$(med "${ours[@]}")
echo "{\"bench\": \"cnn_step\", \"system\": \"distgraph\", \"median_ms\": $o, \"runs\": \"${ours[*]}\", \"batch\": 100, \"threads\": 1}"
for peer in torch tf; do
    eval "runs=(\"\${${peer}[@]}\")"
    if [ -z "$(printf '%s' "${runs[@]}")" ]; then
        echo "{\"bench\": \"cnn_step\", \"system\": \"$peer\", \"skipped\": \"the peer printed nothing (not installed?)\"}"
        continue
    fi
    p=$(med "${runs[@]}")
    # Each round's own ratio too: a virtual machine's core can run at half speed for seconds,
    # and the systems of one round ran within seconds of each other.
    paired=$(for i in "${!runs[@]}"; do
        [ -n "${runs[$i]}" ] && [ -n "${ours[$i]:-}" ] && awk -v a="${runs[$i]}" -v b="${ours[$i]}" 'BEGIN { print a / b }'
    done | median)
    awk -v o="$o" -v p="$p" -v s="$peer" -v r="${runs[*]}" -v pr="$paired" 'BEGIN {
        printf "{\"bench\": \"cnn_step\", \"system\": \"%s\", \"median_ms\": %s, \"runs\": \"%s\", \"distgraph_speedup\": %.2f, \"distgraph_speedup_paired\": %.2f}\n", s, p, r, p / o, pr }'
done
